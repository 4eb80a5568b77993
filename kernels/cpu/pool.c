/*
 * pool.c -- max / average / adaptive pooling over 2-D planes, forward and backward: the CPU
 * kernels of the pooling ops (src/ops/pool.h; front ends: src/ops/pool.c, which check the
 * arguments, allocate every result and make every operand dense in mf).
 *
 * Layout (spec section 7): mf = x.suggest_memory_format(); output, indices and grad_input are
 * allocated in mf. Channels-last runs NHWC kernels whose inner loop walks the channels with unit
 * stride (vectorized; float32 under AVX-512 has its own kernels, see "AVX-512 float kernels"),
 * contiguous runs NCHW kernels over planes (max_pool2d / avg_pool2d forward vectorized along the
 * output row, one pass per window tap). An input that is not dense in mf is cloned into mf once
 * (by the front end).
 * Windows are precomputed per output row / column, so max_pool2d and adaptive_max_pool2d share
 * the NHWC kernel and the backward, avg_pool2d and adaptive_avg_pool2d likewise.
 *
 * max_pool2d's backward also comes with the window geometry (lm_max_pool2d_backward_geom, and
 * lm_max_pool2d_taps_backward for the uint8 tap numbers lm_max_pool2d_taps saves instead of int64
 * indices): channels-last then gathers, each input pixel summing the windows that have it as a tap
 * (lists per input row / column, tap_lists) in window order, bit-identical to the scatter.
 *
 * Max pooling follows PyTorch exactly: the taps of a window are scanned row by row, a value wins
 * when it is greater than the current maximum or NaN (so the last NaN wins), ties keep the first
 * position, and an all -inf window keeps the index of its first tap. A window that holds no input
 * element at all (possible only with dilation and a large padding) gives -inf and index -1, and
 * the backward skips -1; any other index outside the plane is an error, never a stray write.
 */
#include "cpu.h"
#include "impl.h"
#include "ops/pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { CBLK = 256 }; /* channels per block in the NHWC kernels (stack scratch) */

/* The vectorizable kernels are compiled twice: for the baseline ISA of the build and for AVX-512
   (function attribute; the OpenMP bodies inherit it). The AVX-512 copies run when the kernel
   table is filled for AVX-512 (lm_cpu_register_pool with isa >= 3), so lm_gemm_set_isa(1) also
   selects the portable kernels here. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define LM_AVX512_FN __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#define POOL_X86 1
#else
#define LM_AVX512_FN
#endif

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                    */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* the loads and stores of the NHWC max kernels: as they are for float / double; bfloat16 values
   widened to float (exact), a maximum stored back by truncation (exact: it is one of the inputs,
   or -inf), a sum of gradients rounded once to nearest even (lm_f2bf) */
#define POOL_ID(v) (v)
static inline float pool_bf2f(uint16_t h) {
   union { uint32_t u; float f; } c = {(uint32_t)h << 16};
   return c.f;
}
static inline uint16_t pool_f2bf_exact(float f) {
   union { float f; uint32_t u; } c = {f};
   return (uint16_t)(c.u >> 16);
}

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
static void pool_from_params(pool_t *p, const lm_pool_params *g, int kind) {
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

static inline int64_t ad_start(int64_t a, int64_t b, int64_t c) {
   return (a / b) * c + ((a % b) * c) / b;
}
static inline int64_t ad_end(int64_t a, int64_t b, int64_t c) { return 1 + ((a + 1) * c - 1) / b; }

/* fill hs/he/hz (rows) and ws/we/wz (columns) */
static lm_status pool_windows(pool_t *p) {
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
      for (int64_t o = 0; o < O; o++) {
         int64_t a, b, z;
         switch (p->kind) {
         case KIND_MAX:
            a = o * s - pad;
            b = min64(a + (k - 1) * d + 1, I);
            z = 0;
            while (a < 0) {
               a += d;
               z++;
            }
            break;
         case KIND_AVG:
            a = o * s - pad;
            b = min64(a + k, I + pad);
            z = b - a;
            a = max64(a, 0);
            b = min64(b, I);
            break;
         default: /* adaptive */
            a = ad_start(o, O, I);
            b = ad_end(o, O, I);
            z = b - a;
            break;
         }
         st[o] = a;
         en[o] = b;
         sz[o] = z;
      }
   }
   return LM_OK;
}

static void pool_free(pool_t *p) {
   free(p->hs);
   p->hs = NULL;
}

/* the average divisor of window (oh, ow) */
static inline double avg_div(const pool_t *p, int64_t oh, int64_t ow) {
   if (p->has_div) return (double)p->divisor;
   if (p->count_include_pad) return (double)(p->hz[oh] * p->wz[ow]);
   return (double)((p->he[oh] - p->hs[oh]) * (p->we[ow] - p->ws[ow]));
}

/* channel blocking of the NHWC scatter kernels: enough (n, block) tasks for the threads */
static int64_t scatter_cblock(int64_t N, int64_t C) {
#ifdef _OPENMP
   int64_t nt = omp_get_max_threads();
#else
   int64_t nt = 1;
#endif
   if (N >= 4 * nt || C <= 16) return C;
   int64_t want = (4 * nt + N - 1) / N;
   int64_t cb = (C + want - 1) / want;
   cb = (cb + 15) / 16 * 16;
   return cb < C ? cb : C;
}

/* ------------------------------------------------------------------------------------------ */
/* kernels, instantiated for float and double                                                 */

/* max over each window; NaN wins (the last NaN), ties keep the first position (PyTorch).
   IT is the type of the scratch index in the NHWC kernel (int32 keeps float lanes aligned). */
#define DEFINE_MAX_FWD_NCHW(T, S)                                                                  \
   static void max_fwd_nchw_##S(const T *in, T *out, int64_t *ind, const pool_t *p) {              \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, dh = p->dh, dw = p->dw;            \
      const int64_t rows = p->N * p->C * OH;                                                       \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         T *op = out + r * OW;                                                                     \
         int64_t *xp = ind ? ind + r * OW : NULL;                                                  \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         for (int64_t ow = 0; ow < OW; ow++) {                                                     \
            const int64_t w0 = p->ws[ow], w1 = p->we[ow];                                          \
            T mx = (T)-INFINITY;                                                                   \
            int64_t mi = (h0 < h1 && w0 < w1) ? h0 * W + w0 : -1;                                  \
            for (int64_t ih = h0; ih < h1; ih += dh) {                                             \
               const T *row = ip + ih * W;                                                         \
               for (int64_t iw = w0; iw < w1; iw += dw) {                                          \
                  const T v = row[iw];                                                             \
                  const int take = (v > mx) | (v != v);                                            \
                  mx = take ? v : mx;                                                              \
                  mi = take ? ih * W + iw : mi;                                                    \
               }                                                                                   \
            }                                                                                      \
            op[ow] = mx;                                                                           \
            if (xp) xp[ow] = mi;                                                                   \
         }                                                                                         \
      }                                                                                            \
   }
/* D: the stored type, read with LD into T and written with STO (POOL_ID for float / double) */
#define DEFINE_MAX_FWD_NHWC_X(T, D, LD, STO, IT, S, ATTR)                                          \
   ATTR static void max_fwd_nhwc_##S(const D *in, D *out, int64_t *ind, uint8_t *cd,               \
                                     const pool_t *p) {                                            \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, dh = p->dh,              \
                    dw = p->dw;                                                                    \
      /* the id of a tap: its flat input index, or its tap number when codes are wanted */         \
      const int64_t sw_ = cd ? 1 : dw, sh_ = cd ? p->kw : dh * W;                                  \
      const int64_t pix = p->N * OH * OW;                                                          \
      _Pragma("omp parallel for schedule(static) if (pix * C * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t q = 0; q < pix; q++) {                                                          \
         const int64_t ow = q % OW, oh = (q / OW) % OH, n = q / (OW * OH);                         \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh], w0 = p->ws[ow], w1 = p->we[ow];             \
         const D *ib = in + n * H * W * C;                                                         \
         D *op = out + q * C;                                                                      \
         int64_t *xp = ind ? ind + q * C : NULL;                                                   \
         const IT id0 = cd ? (IT)(p->hz[oh] * p->kw + p->wz[ow]) : (IT)(h0 * W + w0);              \
         const IT first = (h0 < h1 && w0 < w1) ? id0 : cd ? (IT)255 : (IT)-1;                      \
         for (int64_t c0 = 0; c0 < C; c0 += CBLK) {                                                \
            const int64_t cn = min64(CBLK, C - c0);                                                \
            T mx[CBLK];                                                                            \
            IT li[CBLK];                                                                           \
            for (int64_t c = 0; c < cn; c++) {                                                     \
               mx[c] = (T)-INFINITY;                                                               \
               li[c] = first;                                                                      \
            }                                                                                      \
            IT rid = id0;                                                                          \
            for (int64_t ih = h0; ih < h1; ih += dh, rid += (IT)sh_) {                             \
               IT id = rid;                                                                        \
               for (int64_t iw = w0; iw < w1; iw += dw, id += (IT)sw_) {                           \
                  const D *src = ib + (ih * W + iw) * C + c0;                                      \
                  for (int64_t c = 0; c < cn; c++) {                                               \
                     T v = LD(src[c]);                                                             \
                     int take = (v > mx[c]) | (v != v);                                            \
                     mx[c] = take ? v : mx[c];                                                     \
                     li[c] = take ? id : li[c];                                                    \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            for (int64_t c = 0; c < cn; c++) op[c0 + c] = STO(mx[c]);                              \
            if (xp)                                                                                \
               for (int64_t c = 0; c < cn; c++) xp[c0 + c] = li[c];                                \
            if (cd)                                                                                \
               for (int64_t c = 0; c < cn; c++) cd[q * C + c0 + c] = (uint8_t)li[c];               \
         }                                                                                         \
      }                                                                                            \
   }

#define DEFINE_MAX_FWD_NHWC(T, IT, S, ATTR) DEFINE_MAX_FWD_NHWC_X(T, T, POOL_ID, POOL_ID, IT, S, ATTR)

DEFINE_MAX_FWD_NCHW(float, f32)
DEFINE_MAX_FWD_NCHW(double, f64)
/* bfloat16 channels-last (the ResNet stem's pool in a bf16 training step): the 16-bit values
   read and written directly, compared as floats */
DEFINE_MAX_FWD_NHWC_X(float, uint16_t, pool_bf2f, pool_f2bf_exact, int32_t, bf16, )
DEFINE_MAX_FWD_NHWC_X(float, uint16_t, pool_bf2f, pool_f2bf_exact, int32_t, bf16_512,
                      LM_AVX512_FN)
DEFINE_MAX_FWD_NHWC(float, int32_t, f32, )
DEFINE_MAX_FWD_NHWC(float, int64_t, f32l, )
DEFINE_MAX_FWD_NHWC(double, int64_t, f64, )
DEFINE_MAX_FWD_NHWC(float, int32_t, f32_512, LM_AVX512_FN)
DEFINE_MAX_FWD_NHWC(double, int64_t, f64_512, LM_AVX512_FN)

/* regular (non-adaptive) windows on NCHW planes, vectorized along the output row: for each
   window row ih and tap j, one pass over the output columns whose tap lies inside the input.
   Per output the taps are visited in the same order as the plain loop (ih, then iw ascending),
   so ties and NaNs resolve exactly as PyTorch. */
static inline void tap_range(const pool_t *p, int64_t j, int64_t *a, int64_t *b) {
   const int64_t off = j * p->dw - p->pw; /* iw = ow * sw + off */
   int64_t lo = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
   int64_t num = p->W - 1 - off;
   int64_t hi = num < 0 ? 0 : num / p->sw + 1;
   *a = lo;
   *b = hi < p->OW ? hi : p->OW;
}

enum { OWBLK = 512 };

#define DEFINE_REG_NCHW(T, S, ATTR)                                                                \
   ATTR static void max_reg_nchw_##S(const T *in, T *out, int64_t *ind, uint8_t *cd,               \
                                     const pool_t *p) {                                            \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, sw = p->sw;                        \
      const int64_t rows = p->N * p->C * OH;                                                       \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         for (int64_t b0 = 0; b0 < OW; b0 += OWBLK) {                                              \
            const int64_t bn = min64(OWBLK, OW - b0);                                              \
            T mx[OWBLK];                                                                           \
            int64_t mi[OWBLK];                                                                     \
            for (int64_t o = 0; o < bn; o++) {                                                     \
               const int64_t w0 = p->ws[b0 + o], w1 = p->we[b0 + o];                               \
               mx[o] = (T)-INFINITY;                                                               \
               if (cd)                                                                             \
                  mi[o] = (h0 < h1 && w0 < w1) ? p->hz[oh] * p->kw + p->wz[b0 + o] : 255;          \
               else                                                                                \
                  mi[o] = (h0 < h1 && w0 < w1) ? h0 * W + w0 : -1;                                 \
            }                                                                                      \
            int64_t rid = p->hz[oh] * p->kw; /* tap number of (row ih, column 0) */                \
            for (int64_t ih = h0; ih < h1; ih += p->dh, rid += p->kw) {                            \
               const T *row = ip + ih * W;                                                         \
               for (int64_t j = 0; j < p->kw; j++) {                                               \
                  int64_t a, b;                                                                    \
                  tap_range(p, j, &a, &b);                                                         \
                  a = a > b0 ? a - b0 : 0;                                                         \
                  b = b - b0 < bn ? b - b0 : bn;                                                   \
                  const int64_t off = (b0 * sw) + j * p->dw - p->pw;                               \
                  if (cd) {                                                                        \
                     const int64_t id = rid + j;                                                   \
                     for (int64_t o = a; o < b; o++) {                                             \
                        const T v = row[o * sw + off];                                             \
                        const int take = (v > mx[o]) | (v != v);                                   \
                        mx[o] = take ? v : mx[o];                                                  \
                        mi[o] = take ? id : mi[o];                                                 \
                     }                                                                             \
                     continue;                                                                     \
                  }                                                                                \
                  for (int64_t o = a; o < b; o++) {                                               \
                     const int64_t iw = o * sw + off;                                              \
                     const T v = row[iw];                                                          \
                     const int take = (v > mx[o]) | (v != v);                                      \
                     mx[o] = take ? v : mx[o];                                                     \
                     mi[o] = take ? ih * W + iw : mi[o];                                           \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            T *op = out + r * OW + b0;                                                             \
            for (int64_t o = 0; o < bn; o++) op[o] = mx[o];                                        \
            if (ind) {                                                                             \
               int64_t *xp = ind + r * OW + b0;                                                    \
               for (int64_t o = 0; o < bn; o++) xp[o] = mi[o];                                     \
            }                                                                                      \
            if (cd) {                                                                              \
               uint8_t *cp = cd + r * OW + b0;                                                     \
               for (int64_t o = 0; o < bn; o++) cp[o] = (uint8_t)mi[o];                            \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   ATTR static void avg_reg_nchw_##S(const T *in, T *out, const pool_t *p) {                       \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, sw = p->sw;                        \
      const int64_t rows = p->N * p->C * OH;                                                       \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw + p->N * p->C * H * W > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         for (int64_t b0 = 0; b0 < OW; b0 += OWBLK) {                                              \
            const int64_t bn = min64(OWBLK, OW - b0);                                              \
            T acc[OWBLK];                                                                          \
            for (int64_t o = 0; o < bn; o++) acc[o] = 0;                                           \
            for (int64_t ih = h0; ih < h1; ih++) {                                                 \
               const T *row = ip + ih * W;                                                         \
               for (int64_t j = 0; j < p->kw; j++) {                                               \
                  int64_t a, b;                                                                    \
                  tap_range(p, j, &a, &b);                                                         \
                  a = a > b0 ? a - b0 : 0;                                                         \
                  b = b - b0 < bn ? b - b0 : bn;                                                   \
                  const int64_t off = (b0 * sw) + j - p->pw;                                       \
                  for (int64_t o = a; o < b; o++) acc[o] += row[o * sw + off];                     \
               }                                                                                   \
            }                                                                                      \
            T *op = out + r * OW + b0;                                                             \
            for (int64_t o = 0; o < bn; o++) {                                                     \
               const int64_t ow = b0 + o;                                                          \
               if (h0 >= h1 || p->ws[ow] >= p->we[ow])                                             \
                  op[o] = 0;                                                                       \
               else                                                                                \
                  op[o] = (T)(acc[o] / (T)avg_div(p, oh, ow));                                     \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }

DEFINE_REG_NCHW(float, f32, )
DEFINE_REG_NCHW(double, f64, )
DEFINE_REG_NCHW(float, f32_512, LM_AVX512_FN)
DEFINE_REG_NCHW(double, f64_512, LM_AVX512_FN)

/* grad_in[plane][ind] += grad_out; indices -1 (empty windows) are skipped, others must lie in
   the plane. Returns the number of bad indices. */
#define DEFINE_MAX_BWD(T, S)                                                                       \
   static int64_t max_bwd_nchw_##S(const T *go, const int64_t *ind, T *gi, const pool_t *p) {      \
      const int64_t HW = p->H * p->W, OHW = p->OH * p->OW, planes = p->N * p->C;                   \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (planes * (HW + OHW) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *g = gi + pl * HW;                                                                      \
         const T *o = go + pl * OHW;                                                               \
         const int64_t *x = ind + pl * OHW;                                                        \
         memset(g, 0, (size_t)HW * sizeof(T));                                                     \
         for (int64_t i = 0; i < OHW; i++) {                                                       \
            int64_t k = x[i];                                                                      \
            if ((uint64_t)k < (uint64_t)HW)                                                        \
               g[k] += o[i];                                                                       \
            else if (k != -1)                                                                      \
               bad++;                                                                              \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }                                                                                               \
   static int64_t max_bwd_nhwc_##S(const T *go, const int64_t *ind, T *gi, const pool_t *p) {      \
      const int64_t HW = p->H * p->W, OHW = p->OH * p->OW, C = p->C;                               \
      const int64_t cb = scatter_cblock(p->N, C), nb = (C + cb - 1) / cb;                          \
      const int64_t tasks = p->N * nb;                                                             \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (tasks > 1 && p->N * C * (HW + OHW) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t n = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         T *g = gi + n * HW * C + c0;                                                              \
         const T *o = go + n * OHW * C + c0;                                                       \
         const int64_t *x = ind + n * OHW * C + c0;                                                \
         if (cn == C)                                                                              \
            memset(g, 0, (size_t)(HW * C) * sizeof(T));                                            \
         else                                                                                      \
            for (int64_t i = 0; i < HW; i++) memset(g + i * C, 0, (size_t)cn * sizeof(T));         \
         for (int64_t i = 0; i < OHW; i++) {                                                       \
            const T *oi = o + i * C;                                                               \
            const int64_t *xi = x + i * C;                                                         \
            for (int64_t c = 0; c < cn; c++) {                                                     \
               int64_t k = xi[c];                                                                  \
               if ((uint64_t)k < (uint64_t)HW)                                                     \
                  g[k * C + c] += oi[c];                                                           \
               else if (k != -1)                                                                   \
                  bad++;                                                                           \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }

DEFINE_MAX_BWD(float, f32)
DEFINE_MAX_BWD(double, f64)

/* grad_in of max_pool2d from tap numbers (lm_max_pool2d_taps), contiguous: the scatter of
   max_bwd_nchw_* with the input index of each window's tap. off[code]: the tap's offset from the
   window's first tap (di / dj: its row / column offset); in a window with all its taps inside the
   plane any number below kh * kw is good, in the others the tap is checked. 255 (an empty window)
   is skipped; another number that names no tap inside the plane is counted. full[oh] / full[OH +
   ow]: whether the window row / column has all its taps inside. */
#define DEFINE_MAX_BWD_TAPS(T, S)                                                                  \
   static int64_t max_bwd_taps_nchw_##S(const T *go, const uint8_t *cd, T *gi, const pool_t *p,    \
                                        const int64_t *di, const int64_t *dj, const int64_t *off,  \
                                        const uint8_t *full) {                                     \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, planes = p->N * p->C;             \
      const int64_t ntaps = p->kh * p->kw;                                                         \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (planes * (H * W + OH * OW) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *g = gi + pl * H * W;                                                                   \
         const T *o = go + pl * OH * OW;                                                           \
         const uint8_t *t = cd + pl * OH * OW;                                                     \
         memset(g, 0, (size_t)(H * W) * sizeof(T));                                                \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t hst = oh * p->sh - p->ph;                                                \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t i = oh * OW + ow, code = t[i], wst = ow * p->sw - p->pw;              \
               if (code == 255) continue;                                                          \
               if (full[oh] & full[OH + ow]) {                                                     \
                  if (code < ntaps)                                                                \
                     g[hst * W + wst + off[code]] += o[i];                                         \
                  else                                                                             \
                     bad++;                                                                        \
                  continue;                                                                        \
               }                                                                                   \
               const int64_t ih = hst + di[code], iw = wst + dj[code];                             \
               if (code < ntaps && (uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W)       \
                  g[ih * W + iw] += o[i];                                                          \
               else                                                                                \
                  bad++;                                                                           \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }

DEFINE_MAX_BWD_TAPS(float, f32)
DEFINE_MAX_BWD_TAPS(double, f64)

/* The taps of max_pool2d along one dimension (I inputs, O windows of k taps, stride s, padding
   pad, dilation d), listed per input index i: the pairs (window o, tap t) with
   o * s - pad + t * d == i, in ascending o, are entries ptr[i] .. ptr[i + 1] of win[] and tap[].
   buf: ptr (I + 1), win (O * k), tap (O * k); cur: I of scratch. */
static void tap_lists(int64_t I, int64_t O, int64_t k, int64_t s, int64_t pad, int64_t d,
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

static int64_t tap_lists_size(const pool_t *p) {
   return (p->H + 1) + 2 * p->OH * p->kh + (p->W + 1) + 2 * p->OW * p->kw + max64(p->H, p->W) +
          2 * (p->OH + p->OW);
}

/* the taps t (0 <= t < k) of window o with 0 <= o * s - pad + t * d < I: t0 .. t0 + n */
static void taps_inside(int64_t I, int64_t O, int64_t k, int64_t s, int64_t pad, int64_t d,
                        int64_t *t0, int64_t *n) {
   for (int64_t o = 0; o < O; o++) {
      const int64_t st = o * s - pad;
      const int64_t a = st >= 0 ? 0 : (-st + d - 1) / d;
      const int64_t b = st > I - 1 ? -1 : min64(k - 1, (I - 1 - st) / d);
      t0[o] = a;
      n[o] = b >= a ? b - a + 1 : 0;
   }
}

static void tap_lists_make(const pool_t *p, int64_t *buf, taps_t *tl) {
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
static int64_t taps_count_bad(const taps_t *tl, const uint8_t *t, int64_t oh, int64_t ow,
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

DEFINE_TAPS_BAD_ROW(base, )
DEFINE_TAPS_BAD_ROW(512, LM_AVX512_FN)

/* max_pool2d backward as a gather (channels-last), given the window geometry: every input pixel
   is written once, as 0 plus grad_out of the windows that have it as a tap and whose index (ind,
   int64) or tap number (cd, bytes) names it, in (oh, ow) order -- the additions, in the same
   order, of max_bwd_nhwc_*'s scatter into a zeroed grad_input, without the zero fill and the
   read-modify-writes. Adding 0 where the index does not match leaves the sum as it is (it starts
   at +0, so it is never -0). Threads take input rows (n, ih), and blocks of channels when there
   are few rows; each output row is checked by one of them (owner_row).
   Returns the number of entries that are neither -1 / 255 nor a tap of their window inside the
   plane. Tap numbers are checked directly (taps_bad_row); for indices, the ones that are set are
   counted, and each valid one matches exactly one pixel: the difference is the rest. */
#define DEFINE_MAX_GATHER_X(T, D, LD, STO, S, ATTR)                                                \
   ATTR static int64_t max_gather_nhwc_##S(const D *go, const int64_t *ind, const uint8_t *cd,     \
                                           D *gi, const pool_t *p, const taps_t *tl) {             \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * H;         \
      const int64_t kw = p->kw;                                                                    \
      const int64_t cb = scatter_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;       \
      int64_t nbad = 0;                                                                            \
      _Pragma("omp parallel for schedule(static) reduction(+ : nbad) if (tasks > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         const int64_t ih = r % H, n = r / H;                                                      \
         const int64_t a0 = tl->rptr[ih], a1 = tl->rptr[ih + 1];                                   \
         const int64_t nofs = n * OH * OW * C + c0;                                                \
         const D *gn = go + nofs;                                                                  \
         D *g = gi + r * W * C + c0;                                                               \
         int64_t lbad = 0;                                                                         \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            if (owner_row(p, oh) != ih) continue;                                                  \
            if (cd) {                                                                              \
               lbad += TAPS_BAD_ROW(p, tl, cd + nofs, oh, cn);                                     \
               continue;                                                                           \
            }                                                                                      \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t *x = ind + nofs + (oh * OW + ow) * C;                                 \
               for (int64_t c = 0; c < cn; c++) lbad += x[c] != -1;                                \
            }                                                                                      \
         }                                                                                         \
         for (int64_t iw = 0; iw < W; iw++) {                                                      \
            const int64_t pix = ih * W + iw, b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];             \
            for (int64_t cc = 0; cc < cn; cc += CBLK) {                                            \
               const int64_t cm = min64(CBLK, cn - cc);                                            \
               T acc[CBLK];                                                                        \
               int64_t m = 0;                                                                      \
               for (int64_t c = 0; c < cm; c++) acc[c] = 0;                                        \
               for (int64_t a = a0; a < a1; a++)                                                   \
                  for (int64_t b = b0; b < b1; b++) {                                              \
                     const int64_t off = (tl->rwin[a] * OW + tl->cwin[b]) * C + cc;                \
                     const D *o = gn + off;                                                        \
                     if (cd) {                                                                     \
                        const uint8_t *x = cd + nofs + off;                                        \
                        const uint8_t code = (uint8_t)(tl->rtap[a] * kw + tl->ctap[b]);            \
                        for (int64_t c = 0; c < cm; c++)                                           \
                           acc[c] += x[c] == code ? LD(o[c]) : (T)0;                               \
                     } else {                                                                      \
                        const int64_t *x = ind + nofs + off;                                       \
                        for (int64_t c = 0; c < cm; c++) {                                         \
                           const int64_t e = x[c] == pix;                                          \
                           acc[c] += e ? LD(o[c]) : (T)0;                                          \
                           m += e;                                                                 \
                        }                                                                          \
                     }                                                                             \
                  }                                                                                \
               D *dst = g + iw * C + cc;                                                           \
               for (int64_t c = 0; c < cm; c++) dst[c] = STO(acc[c]);                              \
               lbad -= m;                                                                          \
            }                                                                                      \
         }                                                                                         \
         nbad += lbad;                                                                             \
      }                                                                                            \
      return nbad;                                                                                 \
   }

#define DEFINE_MAX_GATHER(T, S, ATTR) DEFINE_MAX_GATHER_X(T, T, POOL_ID, POOL_ID, S, ATTR)
/* bfloat16: the gradients summed in float, each sum rounded once (lm_f2bf) */
#define TAPS_BAD_ROW taps_bad_row_base
DEFINE_MAX_GATHER(float, f32, )
DEFINE_MAX_GATHER(double, f64, )
DEFINE_MAX_GATHER_X(float, uint16_t, pool_bf2f, lm_f2bf, bf16, )
#undef TAPS_BAD_ROW
#define TAPS_BAD_ROW taps_bad_row_512
DEFINE_MAX_GATHER(float, f32_512, LM_AVX512_FN)
DEFINE_MAX_GATHER(double, f64_512, LM_AVX512_FN)
#undef TAPS_BAD_ROW

/* window averages; empty windows give 0. acc is float for float (as PyTorch's CPU kernels). */
enum { AVG_COLS = 512 }; /* the widest row whose column sums are kept on the stack */
#define DEFINE_AVG(T, S, ATTR)                                                                     \
   ATTR static void avg_fwd_nchw_##S(const T *in, T *out, const pool_t *p) {                       \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW;                                    \
      const int64_t rows = p->N * p->C * OH;                                                       \
      (void)H;                                                                                     \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw + p->N * p->C * H * W > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         T *op = out + r * OW;                                                                     \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         /* narrow windows over several rows: the column sums of the band of rows first, with     \
            whole-row (vectorized) adds, then each window sums its columns */                      \
         T colsum[AVG_COLS];                                                                       \
         const int cols = h1 - h0 > 2 && W <= AVG_COLS && OW > 1;                                  \
         if (cols) {                                                                               \
            const T *row = ip + h0 * W;                                                            \
            for (int64_t iw = 0; iw < W; iw++) colsum[iw] = row[iw];                               \
            for (int64_t ih = h0 + 1; ih < h1; ih++) {                                             \
               row = ip + ih * W;                                                                  \
               for (int64_t iw = 0; iw < W; iw++) colsum[iw] += row[iw];                           \
            }                                                                                      \
         }                                                                                         \
         for (int64_t ow = 0; ow < OW; ow++) {                                                     \
            const int64_t w0 = p->ws[ow], w1 = p->we[ow];                                          \
            if (h0 >= h1 || w0 >= w1) {                                                            \
               op[ow] = 0;                                                                         \
               continue;                                                                           \
            }                                                                                      \
            T acc = 0;                                                                             \
            if (cols && w1 - w0 < 32) {                                                            \
               for (int64_t iw = w0; iw < w1; iw++) acc += colsum[iw];                             \
            } else if (w1 - w0 < 32) {                                                             \
               for (int64_t ih = h0; ih < h1; ih++) {                                              \
                  const T *row = ip + ih * W;                                                      \
                  for (int64_t iw = w0; iw < w1; iw++) acc += row[iw];                             \
               }                                                                                   \
            } else if (w0 == 0 && w1 == W) { /* whole rows: one contiguous run, 16 sums */     \
               const T *run = ip + h0 * W;                                                         \
               const int64_t n = (h1 - h0) * W;                                                    \
               T part[16] = {0};                                                                   \
               int64_t i = 0;                                                                      \
               for (; i + 16 <= n; i += 16)                                                        \
                  for (int k = 0; k < 16; k++) part[k] += run[i + k];                              \
               for (; i < n; i++) part[0] += run[i];                                               \
               for (int k = 8; k > 0; k /= 2)                                                      \
                  for (int j = 0; j < k; j++) part[j] += part[j + k];                              \
               acc = part[0];                                                                      \
            } else { /* wide windows: 8 independent partial sums (vectorized) */                   \
               T part[8] = {0};                                                                    \
               for (int64_t ih = h0; ih < h1; ih++) {                                              \
                  const T *row = ip + ih * W;                                                      \
                  int64_t iw = w0;                                                                 \
                  for (; iw + 8 <= w1; iw += 8)                                                    \
                     for (int k = 0; k < 8; k++) part[k] += row[iw + k];                           \
                  for (; iw < w1; iw++) part[0] += row[iw];                                        \
               }                                                                                   \
               acc = ((part[0] + part[1]) + (part[2] + part[3])) +                                 \
                     ((part[4] + part[5]) + (part[6] + part[7]));                                  \
            }                                                                                      \
            op[ow] = (T)(acc / (T)avg_div(p, oh, ow));                                             \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   ATTR static void avg_fwd_nhwc_##S(const T *in, T *out, const pool_t *p) {                       \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW;                          \
      const int64_t pix = p->N * OH * OW;                                                          \
      (void)H;                                                                                     \
      _Pragma("omp parallel for schedule(static) if (pix * C * p->kh * p->kw + p->N * C * H * W > LM_PARALLEL_GRAIN)") \
      for (int64_t q = 0; q < pix; q++) {                                                          \
         const int64_t ow = q % OW, oh = (q / OW) % OH, n = q / (OW * OH);                         \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh], w0 = p->ws[ow], w1 = p->we[ow];             \
         const T *ib = in + n * H * W * C;                                                         \
         T *op = out + q * C;                                                                      \
         if (h0 >= h1 || w0 >= w1) {                                                               \
            for (int64_t c = 0; c < C; c++) op[c] = 0;                                             \
            continue;                                                                              \
         }                                                                                         \
         const T dv = (T)avg_div(p, oh, ow);                                                       \
         for (int64_t c0 = 0; c0 < C; c0 += CBLK) {                                                \
            const int64_t cn = min64(CBLK, C - c0);                                                \
            T acc[CBLK];                                                                           \
            for (int64_t c = 0; c < cn; c++) acc[c] = 0;                                           \
            for (int64_t ih = h0; ih < h1; ih++) {                                                 \
               for (int64_t iw = w0; iw < w1; iw++) {                                              \
                  const T *src = ib + (ih * W + iw) * C + c0;                                      \
                  for (int64_t c = 0; c < cn; c++) acc[c] += src[c];                               \
               }                                                                                   \
            }                                                                                      \
            for (int64_t c = 0; c < cn; c++) op[c0 + c] = acc[c] / dv;                             \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   ATTR static void avg_bwd_nchw_##S(const T *go, T *gi, const pool_t *p) {                        \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, planes = p->N * p->C;              \
      _Pragma("omp parallel for schedule(static) if (planes * (H * W + OH * OW * p->kh * p->kw) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *g = gi + pl * H * W;                                                                   \
         const T *o = go + pl * OH * OW;                                                           \
         memset(g, 0, (size_t)(H * W) * sizeof(T));                                                \
         if (p->kind == KIND_AVG) { /* by window tap, along the output row */                      \
            for (int64_t oh = 0; oh < OH; oh++) {                                                  \
               const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                       \
               for (int64_t b0 = 0; b0 < OW; b0 += OWBLK) {                                        \
                  const int64_t bn = min64(OWBLK, OW - b0);                                        \
                  T v[OWBLK];                                                                      \
                  for (int64_t q = 0; q < bn; q++) {                                               \
                     const int64_t ow = b0 + q;                                                    \
                     v[q] = (h0 >= h1 || p->ws[ow] >= p->we[ow])                                   \
                               ? (T)0                                                              \
                               : (T)(o[oh * OW + ow] / (T)avg_div(p, oh, ow));                     \
                  }                                                                                \
                  for (int64_t ih = h0; ih < h1; ih++) {                                           \
                     T *row = g + ih * W;                                                          \
                     for (int64_t j = 0; j < p->kw; j++) {                                         \
                        int64_t a, b;                                                              \
                        tap_range(p, j, &a, &b);                                                   \
                        a = a > b0 ? a - b0 : 0;                                                   \
                        b = b - b0 < bn ? b - b0 : bn;                                             \
                        const int64_t off = b0 * p->sw + j - p->pw;                                \
                        for (int64_t q = a; q < b; q++) row[q * p->sw + off] += v[q];              \
                     }                                                                             \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            continue;                                                                              \
         }                                                                                         \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                          \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t w0 = p->ws[ow], w1 = p->we[ow];                                       \
               if (h0 >= h1 || w0 >= w1) continue;                                                 \
               const T v = (T)(o[oh * OW + ow] / (T)avg_div(p, oh, ow));                           \
               for (int64_t ih = h0; ih < h1; ih++)                                                \
                  for (int64_t iw = w0; iw < w1; iw++) g[ih * W + iw] += v;                        \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   ATTR static void avg_bwd_nhwc_##S(const T *go, T *gi, const pool_t *p) {                        \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW;                          \
      const int64_t cb = scatter_cblock(p->N, C), nb = (C + cb - 1) / cb;                          \
      const int64_t tasks = p->N * nb;                                                             \
      _Pragma("omp parallel for schedule(static) if (tasks > 1 && p->N * C * (H * W + OH * OW * p->kh * p->kw) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t n = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         T *g = gi + n * H * W * C + c0;                                                           \
         const T *o = go + n * OH * OW * C + c0;                                                   \
         if (cn == C)                                                                              \
            memset(g, 0, (size_t)(H * W * C) * sizeof(T));                                         \
         else                                                                                      \
            for (int64_t i = 0; i < H * W; i++) memset(g + i * C, 0, (size_t)cn * sizeof(T));      \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                          \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t w0 = p->ws[ow], w1 = p->we[ow];                                       \
               if (h0 >= h1 || w0 >= w1) continue;                                                 \
               const T dv = (T)avg_div(p, oh, ow);                                                 \
               const T *oi = o + (oh * OW + ow) * C;                                               \
               for (int64_t cc = 0; cc < cn; cc += CBLK) {                                         \
                  const int64_t cm = min64(CBLK, cn - cc);                                         \
                  T v[CBLK];                                                                       \
                  for (int64_t c = 0; c < cm; c++) v[c] = oi[cc + c] / dv;                         \
                  for (int64_t ih = h0; ih < h1; ih++)                                             \
                     for (int64_t iw = w0; iw < w1; iw++) {                                        \
                        T *dst = g + (ih * W + iw) * C + cc;                                       \
                        for (int64_t c = 0; c < cm; c++) dst[c] += v[c];                           \
                     }                                                                             \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }

DEFINE_AVG(float, f32, )
DEFINE_AVG(double, f64, )
DEFINE_AVG(float, f32_512, LM_AVX512_FN)
DEFINE_AVG(double, f64_512, LM_AVX512_FN)

/* ------------------------------------------------------------------------------------------ */
/* AVX-512 float kernels for channels-last                                                    */
/*
 * The channels of a pixel are contiguous, so a window is walked with its channels in registers:
 * chunks of 16 vectors (sums) or 8 (max, with the indices), then 4, then 1, then a masked tail.
 * Threads take output rows (n, oh), and blocks of channels when there are few rows. Each kernel
 * performs the same operations in the same order as the portable kernel it replaces, so the
 * results are bit-identical (sums start from 0 and add the taps row by row; the average divides).
 */
#ifdef POOL_X86

#define LM_AI __attribute__((always_inline)) inline

static inline __mmask16 tail_mask(int64_t n) {
   return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* a 16-float store of a result: streaming (non-temporal: no read of the line, no cache
   pollution) when the kernel writes a cold fresh grad_input (then p is 64-byte aligned), else
   ordinary */
LM_AVX512_FN static LM_AI void st16(float *p, __m512 v, int stream) {
   if (stream)
      _mm512_stream_ps(p, v);
   else
      _mm512_storeu_ps(p, v);
}

/* channel block of the row-parallel kernels: the whole C unless there are too few rows */
static int64_t row_cblock(int64_t rows, int64_t C) {
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

/* a[0..NV) = 0 + the nh x nw taps from s0 (rows rs apart, taps ps apart), 16 NV channels */
LM_AVX512_FN static LM_AI void wsum(__m512 *a, const float *s0, int64_t rs, int64_t ps,
                                     int64_t nh, int64_t nw, const int NV) {
   for (int v = 0; v < NV; v++) a[v] = _mm512_setzero_ps();
   for (int64_t i = 0; i < nh; i++) {
      const float *s = s0 + i * rs;
      for (int64_t j = 0; j < nw; j++, s += ps)
         for (int v = 0; v < NV; v++) a[v] = _mm512_add_ps(a[v], _mm512_loadu_ps(s + 16 * v));
   }
}

/* the same for the channels of mask m (the others are 0) */
LM_AVX512_FN static LM_AI __m512 wsum_mask(const float *s0, int64_t rs, int64_t ps, int64_t nh,
                                            int64_t nw, __mmask16 m) {
   __m512 a = _mm512_setzero_ps();
   for (int64_t i = 0; i < nh; i++) {
      const float *s = s0 + i * rs;
      for (int64_t j = 0; j < nw; j++, s += ps) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m, s));
   }
   return a;
}

/* the average of one window for cn channels: base at its first tap, rs / ps row / tap strides */
LM_AVX512_FN static LM_AI void avg_win_v512(float *op, const float *base, int64_t rs, int64_t ps,
                                             int64_t nh, int64_t nw, int64_t cn, __m512 dv) {
   __m512 a[16];
   int64_t c = 0;
   for (; c + 256 <= cn; c += 256) {
      wsum(a, base + c, rs, ps, nh, nw, 16);
      for (int v = 0; v < 16; v++) _mm512_storeu_ps(op + c + 16 * v, _mm512_div_ps(a[v], dv));
   }
   for (; c + 64 <= cn; c += 64) {
      wsum(a, base + c, rs, ps, nh, nw, 4);
      for (int v = 0; v < 4; v++) _mm512_storeu_ps(op + c + 16 * v, _mm512_div_ps(a[v], dv));
   }
   for (; c + 16 <= cn; c += 16) {
      wsum(a, base + c, rs, ps, nh, nw, 1);
      _mm512_storeu_ps(op + c, _mm512_div_ps(a[0], dv));
   }
   if (c < cn) {
      const __mmask16 m = tail_mask(cn - c);
      const __m512 s = wsum_mask(base + c, rs, ps, nh, nw, m);
      _mm512_mask_storeu_ps(op + c, m, _mm512_maskz_div_ps(m, s, dv));
   }
}

LM_AVX512_FN static void avg_fwd_nhwc_v512(const float *in, float *out, const pool_t *p) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * OH;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
#pragma omp parallel for schedule(static) if (tasks > 1 && rows * OW * C * p->kh * p->kw + p->N * C * H * W > LM_PARALLEL_GRAIN)
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t oh = r % OH, n = r / OH, h0 = p->hs[oh], nh = p->he[oh] - h0;
      const float *ib = in + n * H * W * C + c0;
      float *orow = out + r * OW * C + c0;
      for (int64_t ow = 0; ow < OW; ow++) {
         const int64_t w0 = p->ws[ow], nw = p->we[ow] - w0;
         if (nh <= 0 || nw <= 0) {
            memset(orow + ow * C, 0, (size_t)cn * sizeof(float));
            continue;
         }
         avg_win_v512(orow + ow * C, ib + (h0 * W + w0) * C, W * C, C, nh, nw, cn,
                      _mm512_set1_ps((float)avg_div(p, oh, ow)));
      }
   }
}

/* the windows [lo[i], hi[i]) that hold input index i (empty when lo >= hi): the windows' starts
   and ends are both non-decreasing, so they are a run, found by two sweeps */
static void cover_ranges(const int64_t *st, const int64_t *en, int64_t O, int64_t I, int64_t *lo,
                         int64_t *hi) {
   int64_t b = 0, a = 0;
   for (int64_t i = 0; i < I; i++) {
      while (b < O && en[b] <= i) b++;
      while (a < O && st[a] <= i) a++;
      lo[i] = b;
      hi[i] = a > b ? a : b;
   }
}

/* end[i]: the end of the run of columns from i on that the same windows hold (lo, hi as above);
   those input columns get the same gradient */
static void column_runs(const int64_t *lo, const int64_t *hi, int64_t I, int64_t *end) {
   for (int64_t i = I - 1; i >= 0; i--)
      end[i] = (i + 1 < I && lo[i + 1] == lo[i] && hi[i + 1] == hi[i]) ? end[i + 1] : i + 1;
}

/* avg_pool2d / adaptive_avg_pool2d backward as a gather. Phase 1 scales grad_out by the window
   divisors into v (N, OH, OW, C); phase 2 writes each input pixel once, as 0 plus v of the windows
   that hold it (cov: rows rlo..rhi, columns clo..chi) in (oh, ow) order -- the additions, in the
   same order, of avg_bwd_nhwc_*'s scatter into a zeroed grad_input, without the zero fill and the
   read-modify-writes. Neighbouring columns held by the same windows (a run, cend) get the same
   sum: computed once. */
LM_AVX512_FN static void avg_bwd_nhwc_v512(const float *go, float *gi, const pool_t *p, float *v,
                                           const int64_t *cov, int stream) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW;
   const int64_t orows = p->N * OH, irows = p->N * H;
   const int64_t *rlo = cov, *rhi = cov + H, *clo = cov + 2 * H, *chi = cov + 2 * H + W;
   const int64_t *cend = cov + 2 * H + 2 * W;
#pragma omp parallel if (irows > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)
   {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < orows; r++) {
         const int64_t oh = r % OH;
         for (int64_t ow = 0; ow < OW; ow++) {
            const float *oi = go + (r * OW + ow) * C;
            float *vi = v + (r * OW + ow) * C;
            if (p->hs[oh] >= p->he[oh] || p->ws[ow] >= p->we[ow]) { /* never gathered */
               memset(vi, 0, (size_t)C * sizeof(float));
               continue;
            }
            const __m512 dv = _mm512_set1_ps((float)avg_div(p, oh, ow));
            int64_t c = 0;
            for (; c + 16 <= C; c += 16)
               _mm512_storeu_ps(vi + c, _mm512_div_ps(_mm512_loadu_ps(oi + c), dv));
            if (c < C) {
               const __mmask16 m = tail_mask(C - c);
               _mm512_mask_storeu_ps(vi + c, m,
                                     _mm512_maskz_div_ps(m, _mm512_maskz_loadu_ps(m, oi + c), dv));
            }
         }
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < irows; r++) {
         const int64_t ih = r % H, n = r / H, a0 = rlo[ih], na = rhi[ih] - a0;
         const float *vn = v + n * OH * OW * C;
         float *g = gi + r * W * C;
         if (C <= 16) { /* one vector per pixel */
            const __mmask16 m = tail_mask(C);
            const float *vr = vn + a0 * OW * C;
            for (int64_t iw = 0, iw1; iw < W; iw = iw1) {
               const int64_t b0 = clo[iw];
               const __m512 s = wsum_mask(vr + b0 * C, OW * C, C, na, chi[iw] - b0, m);
               iw1 = cend[iw];
               for (int64_t q = iw; q < iw1; q++) _mm512_mask_storeu_ps(g + q * C, m, s);
            }
            continue;
         }
         for (int64_t iw = 0, iw1; iw < W; iw = iw1) {
            const int64_t b0 = clo[iw], b1 = chi[iw], nbw = b1 - b0;
            iw1 = cend[iw];
            const float *base = vn + (a0 * OW + b0) * C;
            __m512 a[16];
            int64_t c = 0;
            for (; c + 256 <= C; c += 256) {
               wsum(a, base + c, OW * C, C, na, nbw, 16);
               for (int64_t q = iw; q < iw1; q++)
                  for (int k = 0; k < 16; k++) st16(g + q * C + c + 16 * k, a[k], stream);
            }
            for (; c + 64 <= C; c += 64) {
               wsum(a, base + c, OW * C, C, na, nbw, 4);
               for (int64_t q = iw; q < iw1; q++)
                  for (int k = 0; k < 4; k++) st16(g + q * C + c + 16 * k, a[k], stream);
            }
            for (; c + 16 <= C; c += 16) {
               wsum(a, base + c, OW * C, C, na, nbw, 1);
               for (int64_t q = iw; q < iw1; q++) st16(g + q * C + c, a[0], stream);
            }
            if (c < C) {
               const __mmask16 m = tail_mask(C - c);
               const __m512 s = wsum_mask(base + c, OW * C, C, na, nbw, m);
               for (int64_t q = iw; q < iw1; q++) _mm512_mask_storeu_ps(g + q * C + c, m, s);
            }
         }
      }
      if (stream) _mm_sfence();
   }
}

/* int32 lanes of i, widened, to xp[0..16) (lanes of m) */
LM_AVX512_FN static LM_AI void store_idx16(int64_t *xp, __m512i i, __mmask16 m) {
   const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(i));
   const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(i, 1));
   if (m == 0xFFFF) {
      _mm512_storeu_si512(xp, lo);
      _mm512_storeu_si512(xp + 8, hi);
   } else {
      _mm512_mask_storeu_epi64(xp, (__mmask8)m, lo);
      _mm512_mask_storeu_epi64(xp + 8, (__mmask8)(m >> 8), hi);
   }
}

/* max and its first index over the taps (rows h0..h1 step dh, columns w0..w1 step dw) for 16 NV
   channels from ib (m: the lanes loaded, all for a full chunk); a value wins when it is greater
   or NaN, as in the portable kernels */
LM_AVX512_FN static LM_AI void max_taps(__m512 *mx, __m512i *mi, const float *ib, int64_t W,
                                         int64_t C, int64_t h0, int64_t h1, int64_t dh,
                                         int64_t w0, int64_t w1, int64_t dw, __mmask16 m,
                                         const int NV, const int want) {
   const __m512i first = _mm512_set1_epi32((h0 < h1 && w0 < w1) ? (int32_t)(h0 * W + w0) : -1);
   for (int v = 0; v < NV; v++) {
      mx[v] = _mm512_set1_ps(-INFINITY);
      mi[v] = first;
   }
   for (int64_t ih = h0; ih < h1; ih += dh)
      for (int64_t iw = w0; iw < w1; iw += dw) {
         const float *s = ib + (ih * W + iw) * C;
         const __m512i id = _mm512_set1_epi32((int32_t)(ih * W + iw));
         for (int v = 0; v < NV; v++) {
            const __m512 x =
               m == 0xFFFF ? _mm512_loadu_ps(s + 16 * v) : _mm512_maskz_loadu_ps(m, s);
            const __mmask16 k = _mm512_cmp_ps_mask(x, mx[v], _CMP_GT_OQ) |
                                _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            mx[v] = _mm512_mask_mov_ps(mx[v], k, x);
            if (want) mi[v] = _mm512_mask_mov_epi32(mi[v], k, id);
         }
      }
}

/* the max of one window for cn channels (ib: the image at the first channel) */
LM_AVX512_FN static LM_AI void max_win_v512(const float *ib, float *op, int64_t *xp, int64_t W,
                                             int64_t C, int64_t cn, int64_t h0, int64_t h1,
                                             int64_t dh, int64_t w0, int64_t w1, int64_t dw,
                                             const int want) {
   __m512 mx[8];
   __m512i mi[8];
   int64_t c = 0;
   for (; c + 128 <= cn; c += 128) {
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, 0xFFFF, 8, want);
      for (int v = 0; v < 8; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         if (want) store_idx16(xp + c + 16 * v, mi[v], 0xFFFF);
      }
   }
   for (; c + 64 <= cn; c += 64) {
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, 0xFFFF, 4, want);
      for (int v = 0; v < 4; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         if (want) store_idx16(xp + c + 16 * v, mi[v], 0xFFFF);
      }
   }
   for (; c < cn; c += 16) {
      const __mmask16 m = tail_mask(cn - c);
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, m, 1, want);
      _mm512_mask_storeu_ps(op + c, m, mx[0]);
      if (want) store_idx16(xp + c, mi[0], m);
   }
}

/* max_taps for the tap numbers (bytes, 16 channels a vector): code0 is the number of tap
   (h0, w0), kw the number of taps in a window row */
LM_AVX512_FN static LM_AI void max_taps_cd(__m512 *mx, __m128i *mc, const float *ib, int64_t W,
                                            int64_t C, int64_t h0, int64_t h1, int64_t dh,
                                            int64_t w0, int64_t w1, int64_t dw, int64_t code0,
                                            int64_t kw, __mmask16 m, const int NV) {
   const __m128i first = _mm_set1_epi8((char)((h0 < h1 && w0 < w1) ? code0 : 255));
   for (int v = 0; v < NV; v++) {
      mx[v] = _mm512_set1_ps(-INFINITY);
      mc[v] = first;
   }
   int64_t rid = code0;
   for (int64_t ih = h0; ih < h1; ih += dh, rid += kw) {
      int64_t id = rid;
      for (int64_t iw = w0; iw < w1; iw += dw, id++) {
         const float *s = ib + (ih * W + iw) * C;
         const __m128i idv = _mm_set1_epi8((char)id);
         for (int v = 0; v < NV; v++) {
            const __m512 x =
               m == 0xFFFF ? _mm512_loadu_ps(s + 16 * v) : _mm512_maskz_loadu_ps(m, s);
            const __mmask16 k = _mm512_cmp_ps_mask(x, mx[v], _CMP_GT_OQ) |
                                _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            mx[v] = _mm512_mask_mov_ps(mx[v], k, x);
            mc[v] = _mm_mask_mov_epi8(mc[v], k, idv);
         }
      }
   }
}

/* max_win_v512 with the tap numbers to cp */
LM_AVX512_FN static LM_AI void max_win_cd_v512(const float *ib, float *op, uint8_t *cp, int64_t W,
                                                int64_t C, int64_t cn, int64_t h0, int64_t h1,
                                                int64_t dh, int64_t w0, int64_t w1, int64_t dw,
                                                int64_t code0, int64_t kw) {
   __m512 mx[8];
   __m128i mc[8];
   int64_t c = 0;
   for (; c + 128 <= cn; c += 128) {
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, 0xFFFF, 8);
      for (int v = 0; v < 8; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         _mm_storeu_si128((__m128i *)(cp + c + 16 * v), mc[v]);
      }
   }
   for (; c + 64 <= cn; c += 64) {
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, 0xFFFF, 4);
      for (int v = 0; v < 4; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         _mm_storeu_si128((__m128i *)(cp + c + 16 * v), mc[v]);
      }
   }
   for (; c < cn; c += 16) {
      const __mmask16 m = tail_mask(cn - c);
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, m, 1);
      _mm512_mask_storeu_ps(op + c, m, mx[0]);
      _mm_mask_storeu_epi8(cp + c, m, mc[0]);
   }
}

/* max_pool2d / adaptive_max_pool2d forward; H * W < INT32_MAX (the indices run in int32 lanes).
   cd (max_pool2d only): the tap numbers instead of the indices. */
LM_AVX512_FN static void max_fwd_nhwc_v512(const float *in, float *out, int64_t *ind, uint8_t *cd,
                                           const pool_t *p) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * OH;
   const int64_t dh = p->dh, dw = p->dw;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
#pragma omp parallel for schedule(static) if (tasks > 1 && rows * OW * C * p->kh * p->kw > LM_PARALLEL_GRAIN)
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t oh = r % OH, n = r / OH, h0 = p->hs[oh], h1 = p->he[oh];
      const float *ib = in + n * H * W * C + c0;
      float *orow = out + r * OW * C + c0;
      if (cd) {
         uint8_t *crow = cd + r * OW * C + c0;
         const int64_t code_h = p->hz[oh] * p->kw;
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_cd_v512(ib, orow + ow * C, crow + ow * C, W, C, cn, h0, h1, dh, p->ws[ow],
                            p->we[ow], dw, code_h + p->wz[ow], p->kw);
      } else if (ind) {
         int64_t *xrow = ind + r * OW * C + c0;
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_v512(ib, orow + ow * C, xrow + ow * C, W, C, cn, h0, h1, dh, p->ws[ow],
                         p->we[ow], dw, 1);
      } else {
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_v512(ib, orow + ow * C, NULL, W, C, cn, h0, h1, dh, p->ws[ow], p->we[ow], dw,
                         0);
      }
   }
}

/* ---- max_pool2d backward gather for float (DEFINE_MAX_GATHER's results and return value) ---- */
/* the AVX-512 set plus popcnt (every AVX-512 CPU has it) for the index counts */
#define LM_AVX512P_FN                                                                              \
   __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,popcnt,prefer-vector-width=512")))

/* the gathers read grad_out as float32 (bf = 0) or bfloat16 (bf = 1: widened exactly), at
   element i of p, lanes m (all of them: 0xFFFF) */
LM_AVX512P_FN static LM_AI __m512 gload(const void *p, int64_t i, __mmask16 m, const int bf) {
   if (bf) {
      const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
   }
   return m == 0xFFFF ? _mm512_loadu_ps((const float *)p + i)
                      : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* a gathered sum stored at element i of p: float32 as it is (streaming when stream), bfloat16
   rounded to nearest even (NaN kept quiet, as lm_f2bf) */
LM_AVX512P_FN static LM_AI void gstore(void *p, int64_t i, __m512 v, __mmask16 m, int stream,
                                        const int bf) {
   if (bf) {
      const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
      const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(
         _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
      _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtepi32_epi16(r));
   } else if (m == 0xFFFF) {
      st16((float *)p + i, v, stream);
   } else {
      _mm512_mask_storeu_ps((float *)p + i, m, v);
   }
}

/* acc[0..NV) = 0 + grad_out of the windows (rows a0..a1, columns b0..b1 of the tap lists) whose
   tap number (bytes at tn) is the pixel's in that window, for 16 NV channels from gn / tn (m:
   the lanes, all of them for a full chunk) */
LM_AVX512P_FN static LM_AI void taps_gather(__m512 *acc, const void *gn, const uint8_t *tn,
                                             const taps_t *tl, int64_t a0, int64_t a1, int64_t b0,
                                             int64_t b1, int64_t OW, int64_t C, int64_t kw,
                                             __mmask16 m, const int NV, const int bf) {
   for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
   for (int64_t a = a0; a < a1; a++) {
      const int64_t rb = tl->rwin[a] * OW, rc = tl->rtap[a] * kw;
      for (int64_t b = b0; b < b1; b++) {
         const int64_t off = (rb + tl->cwin[b]) * C;
         const uint8_t *t = tn + off;
         const __m128i cv = _mm_set1_epi8((char)(rc + tl->ctap[b]));
         for (int v = 0; v < NV; v++) {
            if (m == 0xFFFF) {
               const __mmask16 k =
                  _mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i *)(t + 16 * v)), cv);
               acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], gload(gn, off + 16 * v, m, bf));
            } else {
               const __mmask16 k = _mm_mask_cmpeq_epi8_mask(m, _mm_maskz_loadu_epi8(m, t), cv);
               acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], gload(gn, off, m, bf));
            }
         }
      }
   }
}

/* the same with int64 indices compared with the pixel's flat index pix; *cnt counts the matches
   per lane */
LM_AVX512P_FN static LM_AI void index_gather(__m512 *acc, __m512i *cnt, const void *gn,
                                              const int64_t *xn, const taps_t *tl, int64_t a0,
                                              int64_t a1, int64_t b0, int64_t b1, int64_t OW,
                                              int64_t C, __m512i pix, __mmask16 m, const int NV,
                                              const int bf) {
   const __m512i one = _mm512_set1_epi32(1);
   for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
   for (int64_t a = a0; a < a1; a++) {
      const int64_t rb = tl->rwin[a] * OW;
      for (int64_t b = b0; b < b1; b++) {
         const int64_t off = (rb + tl->cwin[b]) * C;
         const int64_t *x = xn + off;
         for (int v = 0; v < NV; v++) {
            __mmask16 k;
            __m512 g;
            if (m == 0xFFFF) {
               const __mmask8 lo = _mm512_cmpeq_epi64_mask(_mm512_loadu_si512(x + 16 * v), pix);
               const __mmask8 hi =
                  _mm512_cmpeq_epi64_mask(_mm512_loadu_si512(x + 16 * v + 8), pix);
               k = _mm512_kunpackb(hi, lo);
               g = gload(gn, off + 16 * v, m, bf);
            } else {
               const __mmask8 ml = (__mmask8)m, mh = (__mmask8)(m >> 8);
               const __mmask8 lo =
                  _mm512_mask_cmpeq_epi64_mask(ml, _mm512_maskz_loadu_epi64(ml, x), pix);
               const __mmask8 hi =
                  _mm512_mask_cmpeq_epi64_mask(mh, _mm512_maskz_loadu_epi64(mh, x + 8), pix);
               k = _mm512_kunpackb(hi, lo);
               g = gload(gn, off, m, bf);
            }
            acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], g);
            *cnt = _mm512_mask_add_epi32(*cnt, k, *cnt, one);
         }
      }
   }
}

/* the entries of x[0..n) that are not -1 */
LM_AVX512P_FN static LM_AI int64_t count_set64(const int64_t *x, int64_t n) {
   const __m512i none = _mm512_set1_epi64(-1);
   int64_t cnt = 0, i = 0;
   for (; i + 8 <= n; i += 8)
      cnt += _mm_popcnt_u32(_mm512_cmpneq_epi64_mask(_mm512_loadu_si512(x + i), none));
   if (i < n) {
      const __mmask8 m = (__mmask8)((1u << (n - i)) - 1u);
      cnt += _mm_popcnt_u32(
         _mm512_mask_cmpneq_epi64_mask(m, _mm512_maskz_loadu_epi64(m, x + i), none));
   }
   return cnt;
}

/* go, gi: float32, or bfloat16 (bf: the sums in float32, each rounded once; no streaming) */
LM_AVX512P_FN static int64_t max_gather_nhwc_v512(const void *go, const int64_t *ind,
                                                  const uint8_t *cd, void *gi, const pool_t *p,
                                                  const taps_t *tl, int stream, const int bf) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * H;
   const int64_t kw = p->kw;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
   int64_t nbad = 0;
#pragma omp parallel reduction(+ : nbad) if (tasks > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)
   {
#pragma omp for schedule(static) nowait
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t ih = r % H, n = r / H;
      const int64_t a0 = tl->rptr[ih], a1 = tl->rptr[ih + 1];
      const int64_t nofs = n * OH * OW * C + c0;
      const int esz = bf ? 2 : 4;
      const void *gn = (const char *)go + nofs * esz;
      char *g = (char *)gi + r * W * C * esz + c0 * esz;
      int64_t lbad = 0;
      if (cd) {
         const uint8_t *tn = cd + nofs;
         for (int64_t oh = 0; oh < OH; oh++)
            if (owner_row(p, oh) == ih) lbad += taps_bad_row_512(p, tl, tn, oh, cn);
         for (int64_t iw = 0; iw < W; iw++) {
            const int64_t b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];
            char *dst = g + iw * C * esz;
            __m512 acc[8];
            int64_t c = 0;
            for (; c + 128 <= cn; c += 128) {
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           0xFFFF, 8, bf);
               for (int v = 0; v < 8; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c + 64 <= cn; c += 64) {
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           0xFFFF, 4, bf);
               for (int v = 0; v < 4; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c < cn; c += 16) {
               const __mmask16 m = tail_mask(cn - c);
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           m, 1, bf);
               gstore(dst, c, acc[0], m, 0, bf);
            }
         }
      } else {
         const int64_t *xn = ind + nofs;
         for (int64_t oh = 0; oh < OH; oh++) {
            if (owner_row(p, oh) != ih) continue;
            if (cn == C) {
               lbad += count_set64(xn + oh * OW * C, OW * C);
            } else {
               for (int64_t ow = 0; ow < OW; ow++)
                  lbad += count_set64(xn + (oh * OW + ow) * C, cn);
            }
         }
         for (int64_t iw = 0; iw < W; iw++) {
            const int64_t b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];
            const __m512i pix = _mm512_set1_epi64(ih * W + iw);
            char *dst = g + iw * C * esz;
            __m512 acc[8];
            __m512i mc = _mm512_setzero_si512();
            int64_t c = 0;
            for (; c + 128 <= cn; c += 128) {
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, 0xFFFF, 8, bf);
               for (int v = 0; v < 8; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c + 64 <= cn; c += 64) {
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, 0xFFFF, 4, bf);
               for (int v = 0; v < 4; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c < cn; c += 16) {
               const __mmask16 m = tail_mask(cn - c);
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, m, 1, bf);
               gstore(dst, c, acc[0], m, 0, bf);
            }
            lbad -= _mm512_reduce_add_epi32(mc);
         }
      }
      nbad += lbad;
   }
   if (stream) _mm_sfence(); /* each thread orders its own streaming stores */
   }
   return nbad;
}

#endif /* POOL_X86 */

/* ------------------------------------------------------------------------------------------ */
/* drivers                                                                                    */

/* is grad_x a block allocated for this call (not the caller's out= tensor: params->fresh) of
   1 MiB or more that was cold when handed out (lm_tensor_block_cold)? A kernel that writes all of
   it may then use streaming stores, and tells the allocator so (lm_tensor_note_streamed) */
static int out_cold(const lm_pool_params *g, const lm_tensor *t) {
   return g->fresh && t->storage && t->storage->nbytes >= ((int64_t)1 << 20) &&
          lm_tensor_block_cold(t);
}

/* LM_OP_MAX_POOL2D, LM_OP_ADAPTIVE_MAX_POOL2D: t = {x, out, indices or NULL};
   LM_OP_MAX_POOL2D_TAPS: t = {x, out, taps} (the tap numbers instead of the indices) */
static lm_status max_forward(const lm_op *op, int v512) {
   const lm_tensor *xd = op->t[0], *ot = op->t[1], *it = op->t[2];
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS;
   pool_t pp, *p = &pp;
   pool_from_params(p, op->params, op->kind == LM_OP_ADAPTIVE_MAX_POOL2D ? KIND_AMAX : KIND_MAX);
   LM_TRY(pool_windows(p));
   const void *in = lm_tensor_data(xd);
   void *o = lm_tensor_data(ot);
   int64_t *ix = it && !codes ? (int64_t *)lm_tensor_data(it) : NULL;
   uint8_t *cd = it && codes ? (uint8_t *)lm_tensor_data(it) : NULL;
   if (p->mf == LM_CHANNELS_LAST) {
      if (xd->dtype == LM_BFLOAT16) /* the front end sends H * W < INT32_MAX only */
         (v512 ? max_fwd_nhwc_bf16_512 : max_fwd_nhwc_bf16)(in, o, ix, cd, p);
      else if (xd->dtype == LM_FLOAT64)
         (v512 ? max_fwd_nhwc_f64_512 : max_fwd_nhwc_f64)(in, o, ix, cd, p);
#ifdef POOL_X86
      else if (v512 && p->H * p->W < INT32_MAX)
         max_fwd_nhwc_v512(in, o, ix, cd, p);
#endif
      else if (p->H * p->W < INT32_MAX)
         (v512 ? max_fwd_nhwc_f32_512 : max_fwd_nhwc_f32)(in, o, ix, cd, p);
      else
         max_fwd_nhwc_f32l(in, o, ix, cd, p);
   } else if (p->kind == KIND_MAX) {
      if (xd->dtype == LM_FLOAT64)
         (v512 ? max_reg_nchw_f64_512 : max_reg_nchw_f64)(in, o, ix, cd, p);
      else
         (v512 ? max_reg_nchw_f32_512 : max_reg_nchw_f32)(in, o, ix, cd, p);
   } else {
      if (xd->dtype == LM_FLOAT64)
         max_fwd_nchw_f64(in, o, ix, p);
      else
         max_fwd_nchw_f32(in, o, ix, p);
   }
   pool_free(p);
   return LM_OK;
}

/* LM_OP_MAX_POOL2D_BACKWARD, LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: t = {grad_out, indices, grad_x};
   LM_OP_MAX_POOL2D_TAPS_BACKWARD: t = {grad_out, taps, grad_x}. With the window geometry (geom,
   taps): channels-last gathers (max_gather_nhwc_*), contiguous scatters by planes; without it
   (geom == 0) both scatter (max_bwd_*). */
static lm_status max_backward(const lm_op *op, int v512) {
   const lm_pool_params *g = op->params;
   const lm_tensor *god = op->t[0], *indd = op->t[1], *gt = op->t[2];
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS_BACKWARD;
   const char *what = op->kind == LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD
                         ? "adaptive_max_pool2d_backward"
                         : "max_pool2d_backward";
   const char *iname = codes ? "taps" : "indices";
   pool_t pp, *p = &pp;
   pool_from_params(p, g, KIND_MAX);
   const void *gp = lm_tensor_data(god);
   const int64_t *ix = codes ? NULL : lm_tensor_data(indd);
   const uint8_t *cd = codes ? lm_tensor_data(indd) : NULL;
   void *gi = lm_tensor_data(gt);
   const int f64 = gt->dtype == LM_FLOAT64;
   lm_status st = LM_OK;
   int64_t bad = 0;
   if (!codes && !g->geom) {
      if (p->mf == LM_CHANNELS_LAST)
         bad = f64 ? max_bwd_nhwc_f64(gp, ix, gi, p) : max_bwd_nhwc_f32(gp, ix, gi, p);
      else
         bad = f64 ? max_bwd_nchw_f64(gp, ix, gi, p) : max_bwd_nchw_f32(gp, ix, gi, p);
      if (bad)
         return lm_error(LM_ERR_ARG,
                         "%s: %lld indices are out of range for an input plane of %lld", what,
                         (long long)bad, (long long)(p->H * p->W));
      return LM_OK;
   }
   int64_t *buf = NULL;
   if (p->mf == LM_CHANNELS_LAST) {
      buf = malloc((size_t)tap_lists_size(p) * sizeof(int64_t));
      if (!buf) {
         st = lm_error(LM_ERR_OOM, "out of memory (%s scratch)", what);
      } else {
         taps_t tl;
         tap_lists_make(p, buf, &tl);
         if (gt->dtype == LM_BFLOAT16) {
#ifdef POOL_X86
            if (v512)
               bad = max_gather_nhwc_v512(gp, ix, cd, gi, p, &tl, 0, 1);
            else
#endif
               bad = max_gather_nhwc_bf16(gp, ix, cd, gi, p, &tl);
         }
         else if (f64)
            bad = (v512 ? max_gather_nhwc_f64_512 : max_gather_nhwc_f64)(gp, ix, cd, gi, p, &tl);
#ifdef POOL_X86
         else if (v512) {
            /* streaming stores for a cold fresh grad_input: whole aligned vectors only */
            const int64_t cb = row_cblock(p->N * p->H, p->C);
            const int stream = out_cold(g, gt) && p->C % 16 == 0 && cb % 16 == 0 &&
                               ((uintptr_t)gi & 63) == 0;
            bad = max_gather_nhwc_v512(gp, ix, cd, gi, p, &tl, stream, 0);
            if (stream) lm_tensor_note_streamed(gt);
         }
#endif
         else
            bad = (v512 ? max_gather_nhwc_f32_512 : max_gather_nhwc_f32)(gp, ix, cd, gi, p, &tl);
      }
   } else if (codes) {
      int64_t di[256], dj[256], off[256];
      uint8_t *full = malloc((size_t)(p->OH + p->OW));
      int64_t *ins = malloc((size_t)(2 * (p->OH + p->OW)) * sizeof(int64_t));
      if (!full || !ins) {
         st = lm_error(LM_ERR_OOM, "out of memory (%s scratch)", what);
      } else {
         for (int64_t c = 0; c < 256; c++) {
            di[c] = c < p->kh * p->kw ? (c / p->kw) * p->dh : 0;
            dj[c] = c < p->kh * p->kw ? (c % p->kw) * p->dw : 0;
            off[c] = di[c] * p->W + dj[c];
         }
         taps_inside(p->H, p->OH, p->kh, p->sh, p->ph, p->dh, ins, ins + p->OH);
         taps_inside(p->W, p->OW, p->kw, p->sw, p->pw, p->dw, ins + 2 * p->OH,
                     ins + 2 * p->OH + p->OW);
         for (int64_t o = 0; o < p->OH; o++) full[o] = ins[p->OH + o] == p->kh;
         for (int64_t o = 0; o < p->OW; o++) full[p->OH + o] = ins[2 * p->OH + p->OW + o] == p->kw;
         bad = f64 ? max_bwd_taps_nchw_f64(gp, cd, gi, p, di, dj, off, full)
                   : max_bwd_taps_nchw_f32(gp, cd, gi, p, di, dj, off, full);
      }
      free(full);
      free(ins);
   } else {
      bad = f64 ? max_bwd_nchw_f64(gp, ix, gi, p) : max_bwd_nchw_f32(gp, ix, gi, p);
      if (bad)
         st = lm_error(LM_ERR_ARG,
                       "%s: %lld indices are out of range for an input plane of %lld", what,
                       (long long)bad, (long long)(p->H * p->W));
   }
   if (st == LM_OK && bad)
      st = lm_error(LM_ERR_ARG, "%s: %lld %s are out of range for their pooling windows", what,
                    (long long)bad, iname);
   free(buf);
   return st;
}

/* LM_OP_AVG_POOL2D, LM_OP_ADAPTIVE_AVG_POOL2D: t = {x, out} */
static lm_status avg_forward(const lm_op *op, int v512) {
   const lm_tensor *xd = op->t[0], *ot = op->t[1];
   pool_t pp, *p = &pp;
   pool_from_params(p, op->params, op->kind == LM_OP_AVG_POOL2D ? KIND_AVG : KIND_AAVG);
   LM_TRY(pool_windows(p));
   const void *in = lm_tensor_data(xd);
   void *o = lm_tensor_data(ot);
   if (p->mf == LM_CHANNELS_LAST) {
      if (xd->dtype == LM_FLOAT64)
         (v512 ? avg_fwd_nhwc_f64_512 : avg_fwd_nhwc_f64)(in, o, p);
#ifdef POOL_X86
      else if (v512)
         avg_fwd_nhwc_v512(in, o, p);
#endif
      else
         (v512 ? avg_fwd_nhwc_f32_512 : avg_fwd_nhwc_f32)(in, o, p);
   } else if (p->kind == KIND_AVG) {
      if (xd->dtype == LM_FLOAT64)
         (v512 ? avg_reg_nchw_f64_512 : avg_reg_nchw_f64)(in, o, p);
      else
         (v512 ? avg_reg_nchw_f32_512 : avg_reg_nchw_f32)(in, o, p);
   } else {
      if (xd->dtype == LM_FLOAT64)
         (v512 ? avg_fwd_nchw_f64_512 : avg_fwd_nchw_f64)(in, o, p);
      else
         (v512 ? avg_fwd_nchw_f32_512 : avg_fwd_nchw_f32)(in, o, p);
   }
   pool_free(p);
   return LM_OK;
}

/* LM_OP_AVG_POOL2D_BACKWARD, LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD: t = {grad_out, grad_x} */
static lm_status avg_backward(const lm_op *op, int v512) {
   const lm_pool_params *gp = op->params;
   const lm_tensor *god = op->t[0], *gt = op->t[1];
   const char *what = op->kind == LM_OP_AVG_POOL2D_BACKWARD ? "avg_pool2d_backward"
                                                            : "adaptive_avg_pool2d_backward";
   pool_t pp, *p = &pp;
   pool_from_params(p, gp, op->kind == LM_OP_AVG_POOL2D_BACKWARD ? KIND_AVG : KIND_AAVG);
   LM_TRY(pool_windows(p));
   lm_status st = LM_OK;
   const void *g = lm_tensor_data(god);
   void *gi = lm_tensor_data(gt);
   (void)what, (void)gp;
   if (p->mf == LM_CHANNELS_LAST && gt->dtype == LM_FLOAT32 && v512) {
#ifdef POOL_X86
      /* gather: scratch for the scaled grad_out and, per input row / column, the windows that
         hold it (and the runs of columns held by the same windows) */
      float *v = malloc((size_t)(p->N * p->OH * p->OW * p->C) * sizeof(float));
      int64_t *cov = malloc((size_t)(2 * p->H + 3 * p->W) * sizeof(int64_t));
      if (!v || !cov) {
         st = lm_error(LM_ERR_OOM, "out of memory (%s scratch)", what);
      } else {
         cover_ranges(p->hs, p->he, p->OH, p->H, cov, cov + p->H);
         cover_ranges(p->ws, p->we, p->OW, p->W, cov + 2 * p->H, cov + 2 * p->H + p->W);
         column_runs(cov + 2 * p->H, cov + 2 * p->H + p->W, p->W, cov + 2 * p->H + 2 * p->W);
         /* streaming stores for a cold fresh grad_input: whole aligned vectors only */
         const int stream = out_cold(gp, gt) && p->C % 16 == 0 && ((uintptr_t)gi & 63) == 0;
         avg_bwd_nhwc_v512(g, gi, p, v, cov, stream);
         if (stream) lm_tensor_note_streamed(gt);
      }
      free(v);
      free(cov);
#endif
   } else if (p->mf == LM_CHANNELS_LAST) {
      if (gt->dtype == LM_FLOAT64)
         (v512 ? avg_bwd_nhwc_f64_512 : avg_bwd_nhwc_f64)(g, gi, p);
      else
         (v512 ? avg_bwd_nhwc_f32_512 : avg_bwd_nhwc_f32)(g, gi, p);
   } else {
      if (gt->dtype == LM_FLOAT64)
         (v512 ? avg_bwd_nchw_f64_512 : avg_bwd_nchw_f64)(g, gi, p);
      else
         (v512 ? avg_bwd_nchw_f32_512 : avg_bwd_nchw_f32)(g, gi, p);
   }
   pool_free(p);
   return st;
}

/* the kernels of the table: the portable copies, and the AVX-512 ones */
/* the implementation list of two (src/impl.h): pool_avx512 where registered and on, else
   pool_portable */
static int pool_v512(int v512) {
   if (v512 && !lm_impl_on(LM_IMPL_POOL_AVX512)) {
      lm_impl_skip(LM_IMPL_POOL_AVX512, "switched off (lm.backends.cpu.disable)");
      v512 = 0;
   }
   lm_impl_ran(v512 ? LM_IMPL_POOL_AVX512 : LM_IMPL_POOL_PORTABLE);
   return v512;
}
#define POOL_KERNELS(name)                                                                         \
   static lm_status k_##name(const lm_op *op) { return name(op, pool_v512(0)); }                   \
   static lm_status k_##name##_512(const lm_op *op) { return name(op, pool_v512(1)); }
POOL_KERNELS(max_forward)
POOL_KERNELS(max_backward)
POOL_KERNELS(avg_forward)
POOL_KERNELS(avg_backward)
#undef POOL_KERNELS

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_pool(lm_kernel_fn *table, int isa) {
#ifdef POOL_X86
   const int v512 = isa >= 3;
#else
   const int v512 = 0;
   (void)isa;
#endif
   const lm_kernel_fn maxf = v512 ? k_max_forward_512 : k_max_forward;
   const lm_kernel_fn maxb = v512 ? k_max_backward_512 : k_max_backward;
   const lm_kernel_fn avgf = v512 ? k_avg_forward_512 : k_avg_forward;
   const lm_kernel_fn avgb = v512 ? k_avg_backward_512 : k_avg_backward;
   table[LM_OP_MAX_POOL2D] = maxf;
   table[LM_OP_ADAPTIVE_MAX_POOL2D] = maxf;
   table[LM_OP_MAX_POOL2D_TAPS] = maxf;
   table[LM_OP_MAX_POOL2D_BACKWARD] = maxb;
   table[LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD] = maxb;
   table[LM_OP_MAX_POOL2D_TAPS_BACKWARD] = maxb;
   table[LM_OP_AVG_POOL2D] = avgf;
   table[LM_OP_ADAPTIVE_AVG_POOL2D] = avgf;
   table[LM_OP_AVG_POOL2D_BACKWARD] = avgb;
   table[LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] = avgb;
}
