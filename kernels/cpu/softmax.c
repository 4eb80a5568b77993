/*
 * softmax.c -- softmax / log_softmax over one dim, forward and backward.
 *
 * As in PyTorch the input is made contiguous and the result is contiguous. With the data viewed
 * as (outer, D, inner): inner == 1 runs a row kernel, otherwise the loops run over inner
 * positions with unit stride. Numerically stable (the max is subtracted); the sums are double.
 */
#include "internal.h"
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "nn_common.h"

enum { IBLK = 64 };

static lm_status dense_in(const lm_tensor *x, const lm_tensor **xd, lm_tensor **tmp) {
   *tmp = NULL;
   *xd = x;
   if (!lm_is_contiguous(x, LM_CONTIGUOUS)) {
      LM_TRY(lm_clone(x, LM_CONTIGUOUS, -1, tmp));
      *xd = *tmp;
   }
   return LM_OK;
}

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

static lm_status softmax_forward(const lm_tensor *x, int dim, int lg, lm_tensor **out) {
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(lm_wrap_dim(&dim, x->ndim));
   out_slot so;
   const lm_tensor *xd;
   lm_tensor *tmp = NULL;
   LM_TRY(out_open(&so, out, x->ndim, x->sizes, x->dtype, LM_CONTIGUOUS, "output"));
   lm_status st = dense_in(x, &xd, &tmp);
   if (st == LM_OK && x->numel > 0) {
      int64_t outer, D, inner;
      split_dims(x, dim, &outer, &D, &inner);
      if (x->dtype == LM_FLOAT64)
         fwd_f64(lm_tensor_data(xd), lm_tensor_data(so.t), outer, D, inner, lg);
      else
         fwd_f32(lm_tensor_data(xd), lm_tensor_data(so.t), outer, D, inner, lg);
   }
   lm_tensor_free(tmp);
   return out_close(&so, out, st);
}

static lm_status softmax_backward(const lm_tensor *grad_out, const lm_tensor *y, int dim, int lg,
                                  lm_tensor **grad_x, const char *what) {
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(check_float(y, "output"));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (grad_out->dtype != y->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but output has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(y->dtype));
   if (grad_out->ndim != y->ndim ||
       memcmp(grad_out->sizes, y->sizes, (size_t)y->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      fmt_sizes(a, sizeof a, grad_out->ndim, grad_out->sizes);
      fmt_sizes(b, sizeof b, y->ndim, y->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match output %s", what, a, b);
   }
   LM_TRY(lm_wrap_dim(&dim, y->ndim));
   out_slot so;
   const lm_tensor *gd = NULL, *yd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL;
   LM_TRY(out_open(&so, grad_x, y->ndim, y->sizes, y->dtype, LM_CONTIGUOUS, "grad_input"));
   lm_status st = dense_in(grad_out, &gd, &t1);
   if (st == LM_OK) st = dense_in(y, &yd, &t2);
   if (st == LM_OK && y->numel > 0) {
      int64_t outer, D, inner;
      split_dims(y, dim, &outer, &D, &inner);
      if (y->dtype == LM_FLOAT64)
         bwd_f64(lm_tensor_data(gd), lm_tensor_data(yd), lm_tensor_data(so.t), outer, D, inner,
                 lg);
      else
         bwd_f32(lm_tensor_data(gd), lm_tensor_data(yd), lm_tensor_data(so.t), outer, D, inner,
                 lg);
   }
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   return out_close(&so, grad_x, st);
}

lm_status lm_softmax(const lm_tensor *x, int dim, lm_tensor **out) {
   return softmax_forward(x, dim, 0, out);
}

lm_status lm_log_softmax(const lm_tensor *x, int dim, lm_tensor **out) {
   return softmax_forward(x, dim, 1, out);
}

lm_status lm_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                              lm_tensor **grad_x) {
   return softmax_backward(grad_out, out, dim, 0, grad_x, "softmax_backward");
}

lm_status lm_log_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                                  lm_tensor **grad_x) {
   return softmax_backward(grad_out, out, dim, 1, grad_x, "log_softmax_backward");
}
