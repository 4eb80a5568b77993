/* pool2d.h -- what the files of the 2-D pooling kernels share (internal): the geometry of one op
 * (pool_t: the windows of every output row and column), the tap lists of max_pool2d's backward,
 * and the kernels and drivers one file calls in another (pool.c: registration; pool_max.c,
 * pool_avg.c: the portable kernels, their AVX-512 copies and the drivers; pool_nhwc_v512.c: the
 * AVX-512 float kernels for channels-last). */
#ifndef LUMEN_POOL2D_H
#define LUMEN_POOL2D_H
#include "pool_geom.h"
#include "ops/pool.h"
#include <stdlib.h>

#define LM_POOL_HIDDEN __attribute__((visibility("hidden")))

enum { CBLK = 256 }; /* channels per block in the NHWC kernels (stack scratch) */
enum { OWBLK = 512 }; /* output columns per block in the NCHW row kernels (stack scratch) */

/* ------------------------------------------------------------------------------------------ */
/* geometry                                                                                   */

enum { KIND_MAX = 0, KIND_AVG = 1, KIND_AMAX = 2, KIND_AAVG = 3 };

typedef struct {
   int kind;
   int ndim;               /* 3 or 4 */
   int mf;                 /* LM_CONTIGUOUS or LM_CHANNELS_LAST */
   int64_t N, C, H, W, OH, OW;
   int64_t kh, kw, sh, sw, ph, pw, dh, dw;
   int ceil_mode, count_include_pad, has_div;
   int64_t divisor;
   /* per output row / column: first and end (exclusive) input index, and the window size
      counted with padding (avg_pool2d's pool_size) or, for max_pool2d, the tap number of the first
      tap inside the input (the window's row / column i of its taps); the step is dh / dw */
   int64_t *hs, *he, *hz, *ws, *we, *wz;
} pool_t;

/* the geometry of one op (pool.h) for the kernels of kind */
POOL_HELPER void pool_from_params(pool_t *p, const lm_pool_params *g, int kind) {
   p->kind = kind;
   p->ndim = g->ndim;
   p->mf = g->mf;
   p->N = g->N, p->C = g->C, p->H = g->H, p->W = g->W, p->OH = g->OH, p->OW = g->OW;
   p->kh = g->kh, p->kw = g->kw, p->sh = g->sh, p->sw = g->sw;
   p->ph = g->ph, p->pw = g->pw, p->dh = g->dh, p->dw = g->dw;
   p->ceil_mode = g->ceil_mode;
   p->count_include_pad = g->count_include_pad;
   p->has_div = g->has_div;
   p->divisor = g->divisor;
   p->hs = p->he = p->hz = p->ws = p->we = p->wz = NULL;
}

POOL_HELPER lm_status pool_windows(pool_t *p) {
   int64_t n = p->OH + p->OW;
   int64_t *buf = malloc((size_t)(3 * n + 1) * sizeof(int64_t));
   if (!buf) return lm_error(LM_ERR_OOM, "out of memory (pool windows)");
   p->hs = buf;
   p->he = buf + p->OH;
   p->hz = buf + 2 * p->OH;
   p->ws = buf + 3 * p->OH;
   p->we = p->ws + p->OW;
   p->wz = p->we + p->OW;
   for (int i = 0; i < 2; i++) {
      int64_t O = i ? p->OW : p->OH, I = i ? p->W : p->H, k = i ? p->kw : p->kh;
      int64_t s = i ? p->sw : p->sh, pad = i ? p->pw : p->ph, d = i ? p->dw : p->dh;
      int64_t *st = i ? p->ws : p->hs, *en = i ? p->we : p->he, *sz = i ? p->wz : p->hz;
      const int rule = p->kind == KIND_MAX ? POOL_WIN_MAX : p->kind == KIND_AVG ? POOL_WIN_AVG
                                                                              : POOL_WIN_ADAPTIVE;
      for (int64_t o = 0; o < O; o++) {
         int64_t a, b, z;
         pool_window(rule, o, O, I, k, s, pad, d, &a, &b, &z);
         st[o] = a;
         en[o] = b;
         sz[o] = z;
      }
   }
   return LM_OK;
}

POOL_HELPER void pool_free(pool_t *p) {
   free(p->hs);
   p->hs = NULL;
}

/* the average divisor of window (oh, ow) */
static inline double avg_div(const pool_t *p, int64_t oh, int64_t ow) {
   if (p->has_div) return (double)p->divisor;
   if (p->count_include_pad) return (double)(p->hz[oh] * p->wz[ow]);
   return (double)((p->he[oh] - p->hs[oh]) * (p->we[ow] - p->ws[ow]));
}

/* the output columns [*a, *b) whose tap j lies inside the input row (regular windows: max_pool2d,
   avg_pool2d) */
static inline void tap_range(const pool_t *p, int64_t j, int64_t *a, int64_t *b) {
   const int64_t off = j * p->dw - p->pw; /* iw = ow * sw + off */
   int64_t lo = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
   int64_t num = p->W - 1 - off;
   int64_t hi = num < 0 ? 0 : num / p->sw + 1;
   *a = lo;
   *b = hi < p->OW ? hi : p->OW;
}

/* channel block of the row-parallel kernels: the whole C unless there are too few rows */
POOL_HELPER int64_t row_cblock(int64_t rows, int64_t C) {
#ifdef _OPENMP
   int64_t nt = omp_get_max_threads();
#else
   int64_t nt = 1;
#endif
   if (nt <= 1 || rows >= 4 * nt || C <= 16) return C;
   int64_t want = (4 * nt + rows - 1) / rows;
   int64_t cb = (C + want - 1) / want;
   cb = (cb + 15) / 16 * 16;
   return cb < C ? cb : C;
}

/* is grad_x a block allocated for this call (not the caller's out= tensor: params->fresh) of
   1 MiB or more that was cold when handed out (lm_tensor_block_cold)? A kernel that writes all of
   it may then use streaming stores, and tells the allocator so (lm_tensor_note_streamed) */
POOL_HELPER int out_cold(const lm_pool_params *g, const lm_tensor *t) {
   return g->fresh && t->storage && t->storage->nbytes >= ((int64_t)1 << 20) &&
          lm_tensor_block_cold(t);
}

/* ------------------------------------------------------------------------------------------ */
/* max_pool2d's backward given the window geometry: the taps of every input row and column      */

/* The taps of max_pool2d along one dimension (I inputs, O windows of k taps, stride s, padding
   pad, dilation d), listed per input index i: the pairs (window o, tap t) with
   o * s - pad + t * d == i, in ascending o, are entries ptr[i] .. ptr[i + 1] of win[] and tap[].
   buf: ptr (I + 1), win (O * k), tap (O * k); cur: I of scratch. */
POOL_HELPER void tap_lists(int64_t I, int64_t O, int64_t k, int64_t s, int64_t pad, int64_t d,
                      int64_t *buf, int64_t *cur) {
   int64_t *ptr = buf, *win = buf + I + 1, *tap = win + O * k;
   memset(ptr, 0, (size_t)(I + 1) * sizeof(int64_t));
   for (int64_t o = 0; o < O; o++)
      for (int64_t t = 0; t < k; t++) {
         const int64_t i = o * s - pad + t * d;
         if (i >= 0 && i < I) ptr[i + 1]++;
      }
   for (int64_t i = 0; i < I; i++) ptr[i + 1] += ptr[i];
   memcpy(cur, ptr, (size_t)I * sizeof(int64_t));
   for (int64_t o = 0; o < O; o++)
      for (int64_t t = 0; t < k; t++) {
         const int64_t i = o * s - pad + t * d;
         if (i >= 0 && i < I) {
            const int64_t e = cur[i]++;
            win[e] = o;
            tap[e] = t;
         }
      }
}

/* The taps of both dimensions: the lists above (rows, then columns), and per output row / column
   the first tap inside the input and how many are (i0 / ni, j0 / nj); tap number -> its window
   row and column (255 past the last tap) */
typedef struct {
   const int64_t *rptr, *rwin, *rtap, *cptr, *cwin, *ctap;
   const int64_t *ri0, *rni, *cj0, *cnj;
   uint8_t code_i[256], code_j[256];
} taps_t;

POOL_HELPER int64_t tap_lists_size(const pool_t *p) {
   return (p->H + 1) + 2 * p->OH * p->kh + (p->W + 1) + 2 * p->OW * p->kw + max64(p->H, p->W) +
          2 * (p->OH + p->OW);
}

/* the taps t (0 <= t < k) of window o with 0 <= o * s - pad + t * d < I: t0 .. t0 + n */
POOL_HELPER void taps_inside(int64_t I, int64_t O, int64_t k, int64_t s, int64_t pad, int64_t d,
                        int64_t *t0, int64_t *n) {
   for (int64_t o = 0; o < O; o++) {
      int64_t a, b;
      lm_window_taps(I, k, s, pad, d, o, &a, &b);
      t0[o] = a;
      n[o] = b - a;
   }
}

POOL_HELPER void tap_lists_make(const pool_t *p, int64_t *buf, taps_t *tl) {
   int64_t *cols = buf + (p->H + 1) + 2 * p->OH * p->kh;
   int64_t *cur = cols + (p->W + 1) + 2 * p->OW * p->kw;
   int64_t *ins = cur + max64(p->H, p->W);
   tap_lists(p->H, p->OH, p->kh, p->sh, p->ph, p->dh, buf, cur);
   tap_lists(p->W, p->OW, p->kw, p->sw, p->pw, p->dw, cols, cur);
   taps_inside(p->H, p->OH, p->kh, p->sh, p->ph, p->dh, ins, ins + p->OH);
   taps_inside(p->W, p->OW, p->kw, p->sw, p->pw, p->dw, ins + 2 * p->OH, ins + 2 * p->OH + p->OW);
   tl->rptr = buf;
   tl->rwin = buf + p->H + 1;
   tl->rtap = tl->rwin + p->OH * p->kh;
   tl->cptr = cols;
   tl->cwin = cols + p->W + 1;
   tl->ctap = tl->cwin + p->OW * p->kw;
   tl->ri0 = ins;
   tl->rni = ins + p->OH;
   tl->cj0 = ins + 2 * p->OH;
   tl->cnj = ins + 2 * p->OH + p->OW;
   for (int64_t c = 0; c < 256; c++) {
      const int in = p->kh * p->kw <= 255 && c < p->kh * p->kw;
      tl->code_i[c] = in ? (uint8_t)(c / p->kw) : 255;
      tl->code_j[c] = in ? (uint8_t)(c % p->kw) : 255;
   }
}

/* the input row that checks the windows of output row oh: its first row, clamped to the input */
static inline int64_t owner_row(const pool_t *p, int64_t oh) {
   return min64(max64(oh * p->sh - p->ph, 0), p->H - 1);
}

/* how many tap numbers of output row oh (tn: the image, at the first channel of the block; cn
   channels a pixel) are neither 255 nor a tap of their window inside the input. The taps in the
   window rows inside are the numbers lo .. lo + span: a window with all its columns inside takes
   any of them (one vectorized pass, which only says whether there is a bad one); the others, and
   a window with a bad one, are looked up number by number (taps_count_bad). */
POOL_HELPER int64_t taps_count_bad(const taps_t *tl, const uint8_t *t, int64_t oh, int64_t ow,
                              int64_t cn) {
   const int64_t i0 = tl->ri0[oh], ni = tl->rni[oh], j0 = tl->cj0[ow], nj = tl->cnj[ow];
   int64_t bad = 0;
   for (int64_t c = 0; c < cn; c++) {
      const uint8_t v = t[c];
      if (v == 255) continue;
      bad += tl->code_i[v] == 255 || (uint64_t)(tl->code_i[v] - i0) >= (uint64_t)ni ||
             (uint64_t)(tl->code_j[v] - j0) >= (uint64_t)nj;
   }
   return bad;
}

/* how many tap numbers of output row oh are bad (taps_count_bad), for the cn channels of a block;
   instantiated by the files that call it (S: the name's suffix, ATTR: LM_AVX512_FN or nothing) */
#define DEFINE_TAPS_BAD_ROW(S, ATTR)                                                               \
   ATTR static int64_t taps_bad_row_##S(const pool_t *p, const taps_t *tl, const uint8_t *tn,      \
                                        int64_t oh, int64_t cn) {                                  \
      const int64_t OW = p->OW, C = p->C;                                                          \
      const uint8_t lo = (uint8_t)(tl->ri0[oh] * p->kw), span = (uint8_t)(tl->rni[oh] * p->kw);    \
      int64_t bad = 0;                                                                             \
      for (int64_t ow = 0; ow < OW; ow++) {                                                        \
         const uint8_t *t = tn + (oh * OW + ow) * C;                                               \
         if (tl->cnj[ow] == p->kw) {                                                               \
            uint8_t any = 0;                                                                       \
            for (int64_t c = 0; c < cn; c++)                                                       \
               any |= ((uint8_t)(t[c] - lo) >= span) & (t[c] != 255);                              \
            if (!any) continue;                                                                    \
         }                                                                                         \
         bad += taps_count_bad(tl, t, oh, ow, cn);                                                 \
      }                                                                                            \
      return bad;                                                                                  \
   }

/* ------------------------------------------------------------------------------------------ */
/* the drivers (pool_max.c, pool_avg.c): v512 selects the AVX-512 kernels                     */

/* LM_OP_MAX_POOL2D, LM_OP_ADAPTIVE_MAX_POOL2D, LM_OP_MAX_POOL2D_TAPS */
LM_POOL_HIDDEN lm_status lm_pool2d_max_forward(const lm_op *op, int v512);
/* LM_OP_MAX_POOL2D_BACKWARD, LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD, LM_OP_MAX_POOL2D_TAPS_BACKWARD */
LM_POOL_HIDDEN lm_status lm_pool2d_max_backward(const lm_op *op, int v512);
/* LM_OP_AVG_POOL2D, LM_OP_ADAPTIVE_AVG_POOL2D */
LM_POOL_HIDDEN lm_status lm_pool2d_avg_forward(const lm_op *op, int v512);
/* LM_OP_AVG_POOL2D_BACKWARD, LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD */
LM_POOL_HIDDEN lm_status lm_pool2d_avg_backward(const lm_op *op, int v512);

#ifdef POOL_X86
/* ---- the AVX-512 float kernels for channels-last (pool_nhwc_v512.c) ---- */
LM_POOL_HIDDEN void lm_pool2d_avg_fwd_nhwc_v512(const float *in, float *out, const pool_t *p);
/* avg_pool2d / adaptive_avg_pool2d backward as a gather: v, scratch for the scaled grad_out
   (N, OH, OW, C); cov: per input row / column the windows that hold it, and the runs of columns
   held by the same windows (pool_avg.c); stream: streaming stores into grad_input */
LM_POOL_HIDDEN void lm_pool2d_avg_bwd_nhwc_v512(const float *go, float *gi, const pool_t *p,
                                                float *v, const int64_t *cov, int stream);
/* max_pool2d / adaptive_max_pool2d forward; H * W < INT32_MAX. cd (max_pool2d only): the tap
   numbers instead of the indices */
LM_POOL_HIDDEN void lm_pool2d_max_fwd_nhwc_v512(const float *in, float *out, int64_t *ind,
                                                uint8_t *cd, const pool_t *p);
/* max_pool2d backward as a gather (max_gather_nhwc_* of pool_max.c) for float32 or bfloat16 (bf);
   returns the number of bad indices / tap numbers */
LM_POOL_HIDDEN int64_t lm_pool2d_max_gather_nhwc_v512(const void *go, const int64_t *ind,
                                                      const uint8_t *cd, void *gi,
                                                      const pool_t *p, const taps_t *tl,
                                                      int stream, const int bf);
#endif

#endif
