/* pool_avg.c -- avg_pool2d and adaptive_avg_pool2d on the CPU, forward and backward: the portable
 * kernels, instantiated for float and double and compiled a second time for AVX-512, and the
 * drivers that choose among them and the AVX-512 float kernels of pool_nhwc_v512.c. Empty
 * windows give 0.
 */
#include "pool2d.h"

#include <math.h>
#include <stdio.h>

/* regular (non-adaptive) windows on NCHW planes, vectorized along the output row: for each
   window row ih and tap j, one pass over the output columns whose tap lies inside the input */
#define DEFINE_AVG_REG_NCHW(T, S, ATTR)                                                            \
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

DEFINE_AVG_REG_NCHW(float, f32, )
DEFINE_AVG_REG_NCHW(double, f64, )
DEFINE_AVG_REG_NCHW(float, f32_512, LM_AVX512_FN)
DEFINE_AVG_REG_NCHW(double, f64_512, LM_AVX512_FN)

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
      const int64_t cb = pool_cblock(p->N, C), nb = (C + cb - 1) / cb;                          \
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
#ifdef POOL_X86
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
#endif

/* ------------------------------------------------------------------------------------------ */
/* drivers                                                                                    */

/* LM_OP_AVG_POOL2D, LM_OP_ADAPTIVE_AVG_POOL2D: t = {x, out} */
lm_status lm_pool2d_avg_forward(const lm_op *op, int v512) {
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
         lm_pool2d_avg_fwd_nhwc_v512(in, o, p);
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
lm_status lm_pool2d_avg_backward(const lm_op *op, int v512) {
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
         lm_pool2d_avg_bwd_nhwc_v512(g, gi, p, v, cov, stream);
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
