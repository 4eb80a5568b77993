/*
 * pool3d.c -- max / average / adaptive pooling over 3-D volumes, forward and backward: the CPU
 * kernels of the 3-D pooling ops (src/ops/pool3d.h; front end: src/ops/pool3d.c, which checks
 * the arguments, allocates every result and makes every operand dense in mf).
 *
 * Layout: channels_last_3d runs NDHWC kernels whose inner loop walks the channels with unit
 * stride (vectorized; OpenMP over N x OD x OH output rows), contiguous runs NCDHW kernels over
 * volumes (OpenMP over N x C x OD). Windows are precomputed per output index of each dim (start,
 * end, count with padding), so max_pool3d and adaptive_max_pool3d share their kernels, and
 * avg_pool3d and adaptive_avg_pool3d likewise. float and double; the vectorizable kernels are
 * compiled twice, for the baseline ISA and for AVX-512 (selected when the table is filled for
 * LM_ISA_AVX512 or above, so lm_cpu_set_isa(LM_ISA_C) runs the portable copies), as the 2-D pools'
 * are. The window rules, the AVX-512 attribute, the channel blocking and the implementation choice
 * are the 2-D pools' (pool_geom.h).
 *
 * Max pooling follows PyTorch (and the 2-D kernels): taps scanned d, then h, then w ascending; a
 * value wins when greater than the maximum or NaN (the last NaN wins), ties keep the first
 * position, an all -inf window keeps its first tap's index; a window without an input element
 * (only with dilation and padding) gives -inf and index -1, which the backward skips.
 *
 * The backwards scatter, each task owning whole output slices (a volume of one (n, c) in NCDHW,
 * a block of channels of one sample in NDHWC) and walking the outputs in order: the sums are
 * deterministic, independent of the thread count. An index outside the volume is counted and
 * reported (LM_ERR_ARG), never written.
 */
#include "pool_geom.h"
#include "ops/pool3d.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CB = 128 }; /* channels per block in the NDHWC kernels (stack scratch) */
/* the window rules of pool_geom.h */
enum { K_MAX = POOL_WIN_MAX, K_AVG = POOL_WIN_AVG, K_ADAPT = POOL_WIN_ADAPTIVE };

typedef struct {
   const lm_pool3d_params *g;
   int64_t I[3], O[3], step[3];
   int64_t *st[3], *en[3], *sz[3]; /* per output index of dim i: first, end, count with pad */
   int64_t *buf;
   int tiles; /* the windows tile the input: each input element lies in exactly one */
} geo_t;

static lm_status geo_make(geo_t *q, const lm_pool3d_params *g, int kind) {
   q->g = g;
   q->I[0] = g->D, q->I[1] = g->H, q->I[2] = g->W;
   q->O[0] = g->OD, q->O[1] = g->OH, q->O[2] = g->OW;
   q->buf = malloc((size_t)(3 * (g->OD + g->OH + g->OW) + 1) * sizeof(int64_t));
   if (!q->buf) return lm_error(LM_ERR_OOM, "out of memory (pool3d windows)");
   int64_t *b = q->buf;
   for (int i = 0; i < 3; i++) {
      const int64_t O = q->O[i], I = q->I[i], k = g->k[i], s = g->s[i], pad = g->p[i];
      const int64_t d = g->d[i];
      q->st[i] = b, q->en[i] = b + O, q->sz[i] = b + 2 * O;
      b += 3 * O;
      q->step[i] = kind == K_MAX ? d : 1;
      for (int64_t o = 0; o < O; o++) {
         int64_t a, e, z;
         pool_window(kind, o, O, I, k, s, pad, d, &a, &e, &z);
         q->st[i][o] = a;
         q->en[i][o] = e;
         q->sz[i][o] = z;
      }
   }
   q->tiles = kind != K_MAX;
   for (int i = 0; i < 3 && q->tiles; i++) {
      const int64_t O = q->O[i];
      if (O == 0 || q->st[i][0] != 0 || q->en[i][O - 1] != q->I[i]) q->tiles = 0;
      for (int64_t o = 0; o + 1 < O && q->tiles; o++)
         if (q->en[i][o] != q->st[i][o + 1]) q->tiles = 0;
   }
   return LM_OK;
}

/* the divisor of window (od, oh, ow): 0 for an empty window (its output is 0) */
static inline int64_t avg_div(const geo_t *q, int64_t od, int64_t oh, int64_t ow) {
   const int64_t n = (q->en[0][od] - q->st[0][od]) * (q->en[1][oh] - q->st[1][oh]) *
                     (q->en[2][ow] - q->st[2][ow]);
   if (q->en[0][od] <= q->st[0][od] || q->en[1][oh] <= q->st[1][oh] ||
       q->en[2][ow] <= q->st[2][ow])
      return 0;
   if (q->g->has_div) return q->g->divisor;
   if (q->g->count_include_pad) return q->sz[0][od] * q->sz[1][oh] * q->sz[2][ow];
   return n;
}

/* ------------------------------------------------------------------------------------------ */
/* kernels, for float and double, portable and AVX-512                                        */

#define DEFINE_P3(T, S, ATTR)                                                                      \
   /* max, NCDHW: one task per (n, c, od) */                                                       \
   ATTR static void max_ncdhw_##S(const T *in, T *out, int64_t *ind, const geo_t *q) {             \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t D = g->D, H = g->H, W = g->W, OD = g->OD, OH = g->OH, OW = g->OW;              \
      const int64_t sd = q->step[0], sh = q->step[1], sw = q->step[2];                             \
      const int64_t tasks = g->N * g->C * OD;                                                      \
      _Pragma("omp parallel for schedule(static) if (tasks * OH * OW * g->k[0] * g->k[1] * g->k[2] > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t od = t % OD;                                                                \
         const T *ip = in + (t / OD) * D * H * W;                                                  \
         T *op = out + t * OH * OW;                                                                \
         int64_t *xp = ind ? ind + t * OH * OW : NULL;                                             \
         const int64_t d0 = q->st[0][od], d1 = q->en[0][od];                                       \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t h0 = q->st[1][oh], h1 = q->en[1][oh];                                    \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t w0 = q->st[2][ow], w1 = q->en[2][ow];                                 \
               T m = (T)-INFINITY;                                                                 \
               int64_t mi = (d0 < d1 && h0 < h1 && w0 < w1) ? (d0 * H + h0) * W + w0 : -1;         \
               for (int64_t id = d0; id < d1; id += sd)                                            \
                  for (int64_t ih = h0; ih < h1; ih += sh) {                                       \
                     const int64_t rb = (id * H + ih) * W;                                         \
                     for (int64_t iw = w0; iw < w1; iw += sw) {                                    \
                        const T v = ip[rb + iw];                                                   \
                        const int take = (v > m) | (v != v);                                       \
                        m = take ? v : m;                                                          \
                        mi = take ? rb + iw : mi;                                                  \
                     }                                                                             \
                  }                                                                                \
               op[oh * OW + ow] = m;                                                               \
               if (xp) xp[oh * OW + ow] = mi;                                                      \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* max, NDHWC: one task per output row (n, od, oh), channels innermost */                       \
   ATTR static void max_ndhwc_##S(const T *in, T *out, int64_t *ind, const geo_t *q) {             \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t D = g->D, H = g->H, W = g->W, C = g->C, OD = g->OD, OH = g->OH, OW = g->OW;    \
      const int64_t sd = q->step[0], sh = q->step[1], sw = q->step[2];                             \
      const int64_t rows = g->N * OD * OH;                                                         \
      _Pragma("omp parallel for schedule(static) if (rows * OW * C * g->k[0] * g->k[1] * g->k[2] > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH, od = (r / OH) % OD, n = r / (OH * OD);                         \
         const T *ib = in + n * D * H * W * C;                                                     \
         const int64_t d0 = q->st[0][od], d1 = q->en[0][od], h0 = q->st[1][oh], h1 = q->en[1][oh]; \
         for (int64_t ow = 0; ow < OW; ow++) {                                                     \
            const int64_t w0 = q->st[2][ow], w1 = q->en[2][ow];                                    \
            const int64_t o = (r * OW + ow) * C;                                                   \
            const int64_t first =                                                                  \
               (d0 < d1 && h0 < h1 && w0 < w1) ? (d0 * H + h0) * W + w0 : -1;                      \
            for (int64_t c0 = 0; c0 < C; c0 += CB) {                                               \
               const int64_t cn = min64(CB, C - c0);                                               \
               T m[CB];                                                                            \
               int64_t li[CB];                                                                     \
               for (int64_t c = 0; c < cn; c++) m[c] = (T)-INFINITY, li[c] = first;                \
               for (int64_t id = d0; id < d1; id += sd)                                            \
                  for (int64_t ih = h0; ih < h1; ih += sh)                                         \
                     for (int64_t iw = w0; iw < w1; iw += sw) {                                    \
                        const int64_t pos = (id * H + ih) * W + iw;                                \
                        const T *src = ib + pos * C + c0;                                          \
                        for (int64_t c = 0; c < cn; c++) {                                         \
                           const T v = src[c];                                                     \
                           const int take = (v > m[c]) | (v != v);                                 \
                           m[c] = take ? v : m[c];                                                 \
                           li[c] = take ? pos : li[c];                                             \
                        }                                                                          \
                     }                                                                             \
               for (int64_t c = 0; c < cn; c++) out[o + c0 + c] = m[c];                            \
               if (ind)                                                                            \
                  for (int64_t c = 0; c < cn; c++) ind[o + c0 + c] = li[c];                        \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* avg, NCDHW */                                                                                \
   ATTR static void avg_ncdhw_##S(const T *in, T *out, const geo_t *q) {                           \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t D = g->D, H = g->H, W = g->W, OD = g->OD, OH = g->OH, OW = g->OW;              \
      const int64_t tasks = g->N * g->C * OD;                                                      \
      _Pragma("omp parallel for schedule(static) if (tasks * OH * OW * g->k[0] * g->k[1] * g->k[2] > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t od = t % OD;                                                                \
         const T *ip = in + (t / OD) * D * H * W;                                                  \
         T *op = out + t * OH * OW;                                                                \
         const int64_t d0 = q->st[0][od], d1 = q->en[0][od];                                       \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t h0 = q->st[1][oh], h1 = q->en[1][oh];                                    \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t w0 = q->st[2][ow], w1 = q->en[2][ow];                                 \
               const int64_t dv = avg_div(q, od, oh, ow);                                          \
               T s = 0;                                                                            \
               for (int64_t id = d0; id < d1; id++)                                                \
                  for (int64_t ih = h0; ih < h1; ih++) {                                           \
                     const T *row = ip + (id * H + ih) * W;                                        \
                     for (int64_t iw = w0; iw < w1; iw++) s += row[iw];                            \
                  }                                                                                \
               op[oh * OW + ow] = dv ? s / (T)dv : (T)0;                                           \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* avg, NDHWC */                                                                                \
   ATTR static void avg_ndhwc_##S(const T *in, T *out, const geo_t *q) {                           \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t D = g->D, H = g->H, W = g->W, C = g->C, OD = g->OD, OH = g->OH, OW = g->OW;    \
      const int64_t rows = g->N * OD * OH;                                                         \
      _Pragma("omp parallel for schedule(static) if (rows * OW * C * g->k[0] * g->k[1] * g->k[2] > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH, od = (r / OH) % OD, n = r / (OH * OD);                         \
         const T *ib = in + n * D * H * W * C;                                                     \
         const int64_t d0 = q->st[0][od], d1 = q->en[0][od], h0 = q->st[1][oh], h1 = q->en[1][oh]; \
         for (int64_t ow = 0; ow < OW; ow++) {                                                     \
            const int64_t w0 = q->st[2][ow], w1 = q->en[2][ow];                                    \
            const int64_t dv = avg_div(q, od, oh, ow);                                             \
            T *op = out + (r * OW + ow) * C;                                                       \
            for (int64_t c0 = 0; c0 < C; c0 += CB) {                                               \
               const int64_t cn = min64(CB, C - c0);                                               \
               T s[CB];                                                                            \
               for (int64_t c = 0; c < cn; c++) s[c] = 0;                                          \
               for (int64_t id = d0; id < d1; id++)                                                \
                  for (int64_t ih = h0; ih < h1; ih++)                                             \
                     for (int64_t iw = w0; iw < w1; iw++) {                                        \
                        const T *src = ib + ((id * H + ih) * W + iw) * C + c0;                     \
                        for (int64_t c = 0; c < cn; c++) s[c] += src[c];                           \
                     }                                                                             \
               if (dv) {                                                                           \
                  const T dd = (T)dv;                                                              \
                  for (int64_t c = 0; c < cn; c++) op[c0 + c] = s[c] / dd;                         \
               } else {                                                                            \
                  for (int64_t c = 0; c < cn; c++) op[c0 + c] = 0;                                 \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* max backward, NCDHW: one task per volume; returns the count of bad indices */                \
   ATTR static int64_t maxb_ncdhw_##S(const T *go, const int64_t *ind, T *gi,                      \
                                      const lm_pool3d_params *g) {                                 \
      const int64_t V = g->D * g->H * g->W, OV = g->OD * g->OH * g->OW, planes = g->N * g->C;      \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (planes * (V + OV) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *gp = gi + pl * V;                                                                      \
         const T *gop = go + pl * OV;                                                              \
         const int64_t *ip = ind + pl * OV;                                                        \
         memset(gp, 0, (size_t)V * sizeof(T));                                                     \
         for (int64_t o = 0; o < OV; o++) {                                                        \
            const int64_t i = ip[o];                                                               \
            if (i == -1) continue;                                                                 \
            if (i < 0 || i >= V) {                                                                 \
               bad++;                                                                              \
               continue;                                                                           \
            }                                                                                      \
            gp[i] += gop[o];                                                                       \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }                                                                                               \
   /* max backward, NDHWC: one task per (n, channel block) */                                      \
   ATTR static int64_t maxb_ndhwc_##S(const T *go, const int64_t *ind, T *gi,                      \
                                      const lm_pool3d_params *g) {                                 \
      const int64_t V = g->D * g->H * g->W, OV = g->OD * g->OH * g->OW, C = g->C;                  \
      const int64_t cb = pool_cblock(g->N, C), nb = (C + cb - 1) / cb, tasks = g->N * nb;          \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (tasks > 1 && g->N * C * (V + OV) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t n = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         T *gb = gi + n * V * C + c0;                                                              \
         for (int64_t v = 0; v < V; v++)                                                           \
            for (int64_t c = 0; c < cn; c++) gb[v * C + c] = 0;                                    \
         for (int64_t o = 0; o < OV; o++) {                                                        \
            const T *gop = go + (n * OV + o) * C + c0;                                             \
            const int64_t *ip = ind + (n * OV + o) * C + c0;                                       \
            for (int64_t c = 0; c < cn; c++) {                                                     \
               const int64_t i = ip[c];                                                            \
               if (i == -1) continue;                                                              \
               if (i < 0 || i >= V) {                                                              \
                  bad++;                                                                           \
                  continue;                                                                        \
               }                                                                                   \
               gb[i * C + c] += gop[c];                                                            \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }                                                                                               \
   /* avg backward, NCDHW: one task per volume */                                                  \
   ATTR static void avgb_ncdhw_##S(const T *go, T *gi, const geo_t *q) {                           \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t H = g->H, W = g->W, OD = g->OD, OH = g->OH, OW = g->OW;                        \
      const int64_t V = g->D * H * W, OV = OD * OH * OW, planes = g->N * g->C;                     \
      _Pragma("omp parallel for schedule(static) if (planes * (V + OV * g->k[0] * g->k[1] * g->k[2]) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *gp = gi + pl * V;                                                                      \
         const T *gop = go + pl * OV;                                                              \
         memset(gp, 0, (size_t)V * sizeof(T));                                                     \
         for (int64_t od = 0; od < OD; od++)                                                       \
            for (int64_t oh = 0; oh < OH; oh++)                                                    \
               for (int64_t ow = 0; ow < OW; ow++) {                                               \
                  const int64_t dv = avg_div(q, od, oh, ow);                                       \
                  if (!dv) continue;                                                               \
                  const T v = gop[(od * OH + oh) * OW + ow] / (T)dv;                               \
                  for (int64_t id = q->st[0][od]; id < q->en[0][od]; id++)                         \
                     for (int64_t ih = q->st[1][oh]; ih < q->en[1][oh]; ih++) {                    \
                        T *row = gp + (id * H + ih) * W;                                           \
                        for (int64_t iw = q->st[2][ow]; iw < q->en[2][ow]; iw++) row[iw] += v;     \
                     }                                                                             \
               }                                                                                   \
      }                                                                                            \
   }                                                                                               \
   /* avg backward, NDHWC: one task per (n, channel block), channels innermost */                  \
   ATTR static void avgb_ndhwc_##S(const T *go, T *gi, const geo_t *q) {                           \
      const lm_pool3d_params *g = q->g;                                                            \
      const int64_t H = g->H, W = g->W, C = g->C, OD = g->OD, OH = g->OH, OW = g->OW;              \
      const int64_t V = g->D * H * W, OV = OD * OH * OW;                                           \
      const int64_t cb = pool_cblock(g->N, C), nb = (C + cb - 1) / cb, tasks = g->N * nb;          \
      _Pragma("omp parallel for schedule(static) if (tasks > 1 && g->N * C * (V + OV * g->k[0] * g->k[1] * g->k[2]) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t n = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         T *gb = gi + n * V * C + c0;                                                              \
         if (q->tiles) {                                                                           \
            /* one window per input element: its gradient written once (0 + v as v), no       \
               zeroing pass (adaptive_avg_pool3d(x, 1)'s backward: one pass, not two) */      \
            for (int64_t od = 0; od < OD; od++)                                                    \
               for (int64_t oh = 0; oh < OH; oh++)                                                 \
                  for (int64_t ow = 0; ow < OW; ow++) {                                            \
                     const T dd = (T)avg_div(q, od, oh, ow);                                       \
                     const T *gop = go + (n * OV + (od * OH + oh) * OW + ow) * C + c0;             \
                     for (int64_t id = q->st[0][od]; id < q->en[0][od]; id++)                      \
                        for (int64_t ih = q->st[1][oh]; ih < q->en[1][oh]; ih++)                   \
                           for (int64_t iw = q->st[2][ow]; iw < q->en[2][ow]; iw++) {              \
                              T *dst = gb + ((id * H + ih) * W + iw) * C;                          \
                              for (int64_t c = 0; c < cn; c++) dst[c] = gop[c] / dd;               \
                           }                                                                       \
                  }                                                                                \
            continue;                                                                              \
         }                                                                                         \
         for (int64_t v = 0; v < V; v++)                                                           \
            for (int64_t c = 0; c < cn; c++) gb[v * C + c] = 0;                                    \
         for (int64_t od = 0; od < OD; od++)                                                       \
            for (int64_t oh = 0; oh < OH; oh++)                                                    \
               for (int64_t ow = 0; ow < OW; ow++) {                                               \
                  const int64_t dv = avg_div(q, od, oh, ow);                                       \
                  if (!dv) continue;                                                               \
                  const T dd = (T)dv;                                                              \
                  const T *gop = go + (n * OV + (od * OH + oh) * OW + ow) * C + c0;                \
                  for (int64_t id = q->st[0][od]; id < q->en[0][od]; id++)                         \
                     for (int64_t ih = q->st[1][oh]; ih < q->en[1][oh]; ih++)                      \
                        for (int64_t iw = q->st[2][ow]; iw < q->en[2][ow]; iw++) {                 \
                           T *dst = gb + ((id * H + ih) * W + iw) * C;                             \
                           for (int64_t c = 0; c < cn; c++) dst[c] += gop[c] / dd;                 \
                        }                                                                          \
               }                                                                                   \
      }                                                                                            \
   }

DEFINE_P3(float, f32, )
DEFINE_P3(double, f64, )
#ifdef POOL_X86
DEFINE_P3(float, f32_512, LM_AVX512_FN)
DEFINE_P3(double, f64_512, LM_AVX512_FN)
#endif

/* ------------------------------------------------------------------------------------------ */
/* drivers                                                                                    */

#ifdef POOL_X86
#define PICK(v512, name, S) ((v512) ? name##_##S##_512 : name##_##S)
#else
#define PICK(v512, name, S) name##_##S
#endif

static int kind_of(int op) {
   switch (op) {
   case LM_OP_MAX_POOL3D: return K_MAX;
   case LM_OP_AVG_POOL3D:
   case LM_OP_AVG_POOL3D_BACKWARD: return K_AVG;
   default: return K_ADAPT;
   }
}

/* MAX_POOL3D, ADAPTIVE_MAX_POOL3D: t = {x, out, indices or NULL};
   AVG_POOL3D, ADAPTIVE_AVG_POOL3D: t = {x, out} */
static lm_status forward(const lm_op *op, int v512) {
   const lm_pool3d_params *g = op->params;
   const int is_max = op->kind == LM_OP_MAX_POOL3D || op->kind == LM_OP_ADAPTIVE_MAX_POOL3D;
   geo_t q;
   LM_TRY(geo_make(&q, g, kind_of(op->kind)));
   const void *in = lm_tensor_data(op->t[0]);
   void *o = lm_tensor_data(op->t[1]);
   int64_t *ix = is_max && op->t[2] ? (int64_t *)lm_tensor_data(op->t[2]) : NULL;
   const int f64 = op->t[0]->dtype == LM_FLOAT64, cl = g->mf == LM_CHANNELS_LAST_3D;
   (void)v512;
   if (is_max) {
      if (cl)
         f64 ? PICK(v512, max_ndhwc, f64)(in, o, ix, &q) : PICK(v512, max_ndhwc, f32)(in, o, ix, &q);
      else
         f64 ? PICK(v512, max_ncdhw, f64)(in, o, ix, &q) : PICK(v512, max_ncdhw, f32)(in, o, ix, &q);
   } else {
      if (cl)
         f64 ? PICK(v512, avg_ndhwc, f64)(in, o, &q) : PICK(v512, avg_ndhwc, f32)(in, o, &q);
      else
         f64 ? PICK(v512, avg_ncdhw, f64)(in, o, &q) : PICK(v512, avg_ncdhw, f32)(in, o, &q);
   }
   free(q.buf);
   return LM_OK;
}

/* MAX_POOL3D_BACKWARD, ADAPTIVE_MAX_POOL3D_BACKWARD: t = {grad_out, indices, grad_x} */
static lm_status max_backward(const lm_op *op, int v512) {
   const lm_pool3d_params *g = op->params;
   const void *go = lm_tensor_data(op->t[0]);
   const int64_t *ix = lm_tensor_data(op->t[1]);
   void *gi = lm_tensor_data(op->t[2]);
   const int f64 = op->t[2]->dtype == LM_FLOAT64, cl = g->mf == LM_CHANNELS_LAST_3D;
   int64_t bad;
   (void)v512;
   if (cl)
      bad = f64 ? PICK(v512, maxb_ndhwc, f64)(go, ix, gi, g) : PICK(v512, maxb_ndhwc, f32)(go, ix, gi, g);
   else
      bad = f64 ? PICK(v512, maxb_ncdhw, f64)(go, ix, gi, g) : PICK(v512, maxb_ncdhw, f32)(go, ix, gi, g);
   if (bad)
      return lm_error(LM_ERR_ARG, "%s: %lld indices are out of range for an input volume of %lld",
                      op->kind == LM_OP_MAX_POOL3D_BACKWARD ? "max_pool3d_backward"
                                                            : "adaptive_max_pool3d_backward",
                      (long long)bad, (long long)(g->D * g->H * g->W));
   return LM_OK;
}

/* AVG_POOL3D_BACKWARD, ADAPTIVE_AVG_POOL3D_BACKWARD: t = {grad_out, grad_x} */
static lm_status avg_backward(const lm_op *op, int v512) {
   const lm_pool3d_params *g = op->params;
   geo_t q;
   LM_TRY(geo_make(&q, g, kind_of(op->kind)));
   const void *go = lm_tensor_data(op->t[0]);
   void *gi = lm_tensor_data(op->t[1]);
   const int f64 = op->t[1]->dtype == LM_FLOAT64, cl = g->mf == LM_CHANNELS_LAST_3D;
   (void)v512;
   if (cl)
      f64 ? PICK(v512, avgb_ndhwc, f64)(go, gi, &q) : PICK(v512, avgb_ndhwc, f32)(go, gi, &q);
   else
      f64 ? PICK(v512, avgb_ncdhw, f64)(go, gi, &q) : PICK(v512, avgb_ncdhw, f32)(go, gi, &q);
   free(q.buf);
   return LM_OK;
}

/* the implementation list of two (src/impl.h): pool_impl_v512 (pool_geom.h) */
static lm_status k_fwd(const lm_op *op) { return forward(op, pool_impl_v512(0)); }
static lm_status k_maxb(const lm_op *op) { return max_backward(op, pool_impl_v512(0)); }
static lm_status k_avgb(const lm_op *op) { return avg_backward(op, pool_impl_v512(0)); }
#ifdef POOL_X86
static lm_status k_fwd_512(const lm_op *op) { return forward(op, pool_impl_v512(1)); }
static lm_status k_maxb_512(const lm_op *op) { return max_backward(op, pool_impl_v512(1)); }
static lm_status k_avgb_512(const lm_op *op) { return avg_backward(op, pool_impl_v512(1)); }
#endif

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_pool3d(lm_kernel_fn *table, int isa) {
#ifdef POOL_X86
   const int v512 = isa >= LM_ISA_AVX512;
   const lm_kernel_fn f = v512 ? k_fwd_512 : k_fwd;
   const lm_kernel_fn mb = v512 ? k_maxb_512 : k_maxb;
   const lm_kernel_fn ab = v512 ? k_avgb_512 : k_avgb;
#else
   (void)isa;
   const lm_kernel_fn f = k_fwd, mb = k_maxb, ab = k_avgb;
#endif
   table[LM_OP_MAX_POOL3D] = f;
   table[LM_OP_ADAPTIVE_MAX_POOL3D] = f;
   table[LM_OP_AVG_POOL3D] = f;
   table[LM_OP_ADAPTIVE_AVG_POOL3D] = f;
   table[LM_OP_MAX_POOL3D_BACKWARD] = mb;
   table[LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD] = mb;
   table[LM_OP_AVG_POOL3D_BACKWARD] = ab;
   table[LM_OP_ADAPTIVE_AVG_POOL3D_BACKWARD] = ab;
}
