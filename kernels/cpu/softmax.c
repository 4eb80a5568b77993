/*
 * softmax.c -- softmax / log_softmax over one dim, forward and backward.
 *
 * The kernels of LM_OP_SOFTMAX / LM_OP_SOFTMAX_BACKWARD (front end: src/ops/softmax.c, which
 * makes every operand contiguous and allocates the result). With the data viewed
 * as (outer, D, inner): inner == 1 runs a row kernel, otherwise the loops run over inner
 * positions with unit stride. Numerically stable (the max is subtracted); the sums are double.
 */
#include "cpu.h"
#include "ops/softmax.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { IBLK = 64 };

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void split_dims(const lm_tensor *x, int dim, int64_t *outer, int64_t *D, int64_t *inner) {
   *outer = 1;
   *inner = 1;
   *D = x->ndim == 0 ? 1 : x->sizes[dim];
   for (int d = 0; d < dim && d < x->ndim; d++) *outer *= x->sizes[d];
   for (int d = dim + 1; d < x->ndim; d++) *inner *= x->sizes[d];
}

/* ------------------------------------------------------------------------------------------ */

#define DEFINE_SOFTMAX(T, S)                                                                       \
   static void fwd_##S(const T *x, T *y, int64_t outer, int64_t D, int64_t inner, int lg) {        \
      if (inner == 1) {                                                                            \
         _Pragma("omp parallel for schedule(static) if (outer * D > LM_PARALLEL_GRAIN / 8)")       \
         for (int64_t o = 0; o < outer; o++) {                                                     \
            const T *xr = x + o * D;                                                               \
            T *yr = y + o * D;                                                                     \
            T mx = (T)-INFINITY;                                                                   \
            for (int64_t d = 0; d < D; d++) mx = xr[d] > mx ? xr[d] : mx;                          \
            double sum = 0;                                                                        \
            if (lg) {                                                                              \
               for (int64_t d = 0; d < D; d++) sum += exp((double)xr[d] - (double)mx);             \
               const double sh = (double)mx + log(sum);                                            \
               for (int64_t d = 0; d < D; d++) yr[d] = (T)((double)xr[d] - sh);                    \
            } else {                                                                               \
               for (int64_t d = 0; d < D; d++) {                                                   \
                  double e = exp((double)xr[d] - (double)mx);                                      \
                  sum += e;                                                                        \
                  yr[d] = (T)e;                                                                    \
               }                                                                                   \
               const double inv = 1.0 / sum;                                                       \
               for (int64_t d = 0; d < D; d++) yr[d] = (T)((double)yr[d] * inv);                   \
            }                                                                                      \
         }                                                                                         \
         return;                                                                                   \
      }                                                                                            \
      const int64_t nb = (inner + IBLK - 1) / IBLK, tasks = outer * nb;                            \
      _Pragma("omp parallel for schedule(static) if (outer * D * inner > LM_PARALLEL_GRAIN / 8)")  \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t o = t / nb, j0 = (t % nb) * IBLK, jn = min64(IBLK, inner - j0);             \
         const T *xb = x + o * D * inner + j0;                                                     \
         T *yb = y + o * D * inner + j0;                                                           \
         T mx[IBLK];                                                                               \
         double sum[IBLK];                                                                         \
         for (int64_t j = 0; j < jn; j++) mx[j] = (T)-INFINITY, sum[j] = 0;                        \
         for (int64_t d = 0; d < D; d++) {                                                         \
            const T *xr = xb + d * inner;                                                          \
            for (int64_t j = 0; j < jn; j++) mx[j] = xr[j] > mx[j] ? xr[j] : mx[j];                \
         }                                                                                         \
         for (int64_t d = 0; d < D; d++) {                                                         \
            const T *xr = xb + d * inner;                                                          \
            T *yr = yb + d * inner;                                                                \
            for (int64_t j = 0; j < jn; j++) {                                                     \
               double e = exp((double)xr[j] - (double)mx[j]);                                      \
               sum[j] += e;                                                                        \
               if (!lg) yr[j] = (T)e;                                                              \
            }                                                                                      \
         }                                                                                         \
         for (int64_t j = 0; j < jn; j++)                                                          \
            sum[j] = lg ? (double)mx[j] + log(sum[j]) : 1.0 / sum[j];                              \
         for (int64_t d = 0; d < D; d++) {                                                         \
            const T *xr = xb + d * inner;                                                          \
            T *yr = yb + d * inner;                                                                \
            if (lg)                                                                                \
               for (int64_t j = 0; j < jn; j++) yr[j] = (T)((double)xr[j] - sum[j]);               \
            else                                                                                   \
               for (int64_t j = 0; j < jn; j++) yr[j] = (T)((double)yr[j] * sum[j]);               \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* softmax: gx = y (g - sum g y); log_softmax: gx = g - exp(y) sum g */                         \
   static void bwd_##S(const T *g, const T *y, T *gx, int64_t outer, int64_t D, int64_t inner,     \
                       int lg) {                                                                   \
      const int64_t nb = (inner + IBLK - 1) / IBLK, tasks = outer * nb;                            \
      _Pragma("omp parallel for schedule(static) if (outer * D * inner > LM_PARALLEL_GRAIN / 4)")  \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t o = t / nb, j0 = (t % nb) * IBLK, jn = min64(IBLK, inner - j0);             \
         const int64_t base = o * D * inner + j0;                                                  \
         double sum[IBLK];                                                                         \
         for (int64_t j = 0; j < jn; j++) sum[j] = 0;                                              \
         for (int64_t d = 0; d < D; d++) {                                                         \
            const T *gr = g + base + d * inner, *yr = y + base + d * inner;                        \
            if (lg)                                                                                \
               for (int64_t j = 0; j < jn; j++) sum[j] += (double)gr[j];                           \
            else                                                                                   \
               for (int64_t j = 0; j < jn; j++) sum[j] += (double)gr[j] * (double)yr[j];           \
         }                                                                                         \
         for (int64_t d = 0; d < D; d++) {                                                         \
            const T *gr = g + base + d * inner, *yr = y + base + d * inner;                        \
            T *xr = gx + base + d * inner;                                                         \
            if (lg)                                                                                \
               for (int64_t j = 0; j < jn; j++)                                                    \
                  xr[j] = (T)((double)gr[j] - exp((double)yr[j]) * sum[j]);                        \
            else                                                                                   \
               for (int64_t j = 0; j < jn; j++)                                                    \
                  xr[j] = (T)((double)yr[j] * ((double)gr[j] - sum[j]));                           \
         }                                                                                         \
      }                                                                                            \
   }

DEFINE_SOFTMAX(float, f32)
DEFINE_SOFTMAX(double, f64)

/* LM_OP_SOFTMAX: t = {x, y}, both contiguous (src/ops/softmax.h) */
static lm_status k_softmax(const lm_op *op) {
   const lm_softmax_params *p = op->params;
   const lm_tensor *x = op->t[0], *y = op->t[1];
   int64_t outer, D, inner;
   split_dims(x, p->dim, &outer, &D, &inner);
   if (x->dtype == LM_FLOAT64)
      fwd_f64(lm_tensor_data(x), lm_tensor_data(y), outer, D, inner, p->log);
   else
      fwd_f32(lm_tensor_data(x), lm_tensor_data(y), outer, D, inner, p->log);
   return LM_OK;
}

/* LM_OP_SOFTMAX_BACKWARD: t = {grad_out, y, grad_x}, all contiguous */
static lm_status k_softmax_backward(const lm_op *op) {
   const lm_softmax_params *p = op->params;
   const lm_tensor *g = op->t[0], *y = op->t[1], *gx = op->t[2];
   int64_t outer, D, inner;
   split_dims(y, p->dim, &outer, &D, &inner);
   if (y->dtype == LM_FLOAT64)
      bwd_f64(lm_tensor_data(g), lm_tensor_data(y), lm_tensor_data(gx), outer, D, inner, p->log);
   else
      bwd_f32(lm_tensor_data(g), lm_tensor_data(y), lm_tensor_data(gx), outer, D, inner, p->log);
   return LM_OK;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_softmax(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_SOFTMAX] = k_softmax;
   table[LM_OP_SOFTMAX_BACKWARD] = k_softmax_backward;
}
