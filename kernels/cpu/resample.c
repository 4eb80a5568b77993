/*
 * resample.c -- LM_OP_RESAMPLE: the middle dim of a contiguous (B, In, R) tensor resampled to Out
 * positions by a table of taps (front end: src/ops/resample.c; parameters and the t[] order:
 * src/ops/resample.h). F.interpolate runs each resized dim as one such pass over the tensor in
 * its physical order (channels-last: R is the inner spatial dims times C, contiguous), and its
 * backward as the pass of the transposed table.
 *
 * One output row (b, o) is R contiguous values: the first tap's product, then each next tap's
 * added (float32 in float32 and float64 in float64, as PyTorch's CPU kernels compute them; the
 * file is ISO C, so no product is contracted into an FMA). A row with one tap of weight 1 (the
 * nearest modes) is a copy of its input row: the values move unchanged (NaN payloads, -0 and
 * subnormals included), as PyTorch's nearest kernels copy them. The rows are split over the
 * threads; within a row the loops run at unit stride and vectorize.
 *
 * The taps are checked before any row is written (ptr from 0, non-decreasing, up to nnz; every
 * index in [0, In)): bad taps are an LM_ERR_ARG error, never a read outside x.
 */
#include "cpu.h"
#include "ops/resample.h"

#include <string.h>

static lm_status check_taps(const lm_resample_params *p, const int64_t *ptr, const int64_t *idx) {
   if (ptr[0] != 0) return lm_error(LM_ERR_ARG, "resample: ptr[0] is %lld, expected 0", (long long)ptr[0]);
   for (int64_t o = 0; o < p->Out; o++)
      if (ptr[o + 1] < ptr[o])
         return lm_error(LM_ERR_ARG, "resample: ptr decreases at %lld", (long long)(o + 1));
   if (ptr[p->Out] != p->nnz)
      return lm_error(LM_ERR_ARG, "resample: ptr ends at %lld, idx has %lld taps",
                      (long long)ptr[p->Out], (long long)p->nnz);
   for (int64_t k = 0; k < p->nnz; k++)
      if (idx[k] < 0 || idx[k] >= p->In)
         return lm_error(LM_ERR_ARG, "resample: tap %lld reads index %lld of a dim of size %lld",
                         (long long)k, (long long)idx[k], (long long)p->In);
   return LM_OK;
}

/* Rows shorter than this (the last dim of a contiguous NCHW tensor: R = 1) run per b, all Out
   positions in turn (rows of one value with the taps' products added in registers): one row per
   (b, o) there cost a division, a memcpy call or a loop of one for each value (8 x 64 x 128 x 128
   NCHW, the W pass of a 2x upsampling: 129 ms). */
enum { RS_SHORT = 16 };

#define DEFINE_RESAMPLE(T, S)                                                                    \
   /* output row yr (R values) from the taps [k0, k1) over xb's rows: the first tap's product,   \
      then each next one added; a single tap of weight 1 a copy; no taps, zeros */              \
   static inline void resample_row_##S(const T *xb, T *yr, int64_t R, int64_t k0, int64_t k1,    \
                                       const int64_t *idx, const T *w) {                         \
      if (k0 == k1) {                                                                            \
         for (int64_t r = 0; r < R; r++) yr[r] = 0;                                              \
         return;                                                                                 \
      }                                                                                          \
      const T *x0 = xb + idx[k0] * R;                                                            \
      const T w0 = w[k0];                                                                        \
      if (k1 - k0 == 1 && w0 == (T)1) {                                                          \
         memcpy(yr, x0, (size_t)R * sizeof(T));                                                  \
         return;                                                                                 \
      }                                                                                          \
      if (k1 - k0 == 2) { /* the linear modes: both taps in one pass */                         \
         const T *x1 = xb + idx[k0 + 1] * R;                                                     \
         const T w1 = w[k0 + 1];                                                                 \
         for (int64_t r = 0; r < R; r++) yr[r] = w0 * x0[r] + w1 * x1[r];                        \
         return;                                                                                 \
      }                                                                                          \
      for (int64_t r = 0; r < R; r++) yr[r] = w0 * x0[r];                                        \
      for (int64_t k = k0 + 1; k < k1; k++) {                                                    \
         const T *xk = xb + idx[k] * R;                                                          \
         const T wk = w[k];                                                                      \
         for (int64_t r = 0; r < R; r++) yr[r] = yr[r] + wk * xk[r];                             \
      }                                                                                          \
   }                                                                                             \
   static void resample_##S(const lm_resample_params *p, const T *x, const int64_t *ptr,         \
                            const int64_t *idx, const T *w, T *y) {                              \
      const int64_t R = p->R, In = p->In, Out = p->Out;                                          \
      if (R < RS_SHORT) {                                                                        \
         _Pragma("omp parallel for schedule(static) if (p->B * Out * R > LM_PARALLEL_GRAIN)")    \
         for (int64_t b = 0; b < p->B; b++) {                                                    \
            const T *xb = x + b * In * R;                                                        \
            T *yb = y + b * Out * R;                                                             \
            if (R > 1) {                                                                         \
               for (int64_t o = 0; o < Out; o++)                                                 \
                  resample_row_##S(xb, yb + o * R, R, ptr[o], ptr[o + 1], idx, w);               \
               continue;                                                                         \
            }                                                                                    \
            for (int64_t o = 0; o < Out; o++) { /* the same sums, one value a position */       \
               const int64_t k0 = ptr[o], k1 = ptr[o + 1];                                       \
               if (k1 - k0 == 2) {                                                               \
                  yb[o] = w[k0] * xb[idx[k0]] + w[k0 + 1] * xb[idx[k0 + 1]];                     \
               } else if (k0 == k1) {                                                            \
                  yb[o] = 0;                                                                     \
               } else if (k1 - k0 == 1 && w[k0] == (T)1) {                                       \
                  yb[o] = xb[idx[k0]];                                                           \
               } else {                                                                          \
                  T acc = w[k0] * xb[idx[k0]];                                                   \
                  for (int64_t k = k0 + 1; k < k1; k++) acc = acc + w[k] * xb[idx[k]];           \
                  yb[o] = acc;                                                                   \
               }                                                                                 \
            }                                                                                    \
         }                                                                                       \
         return;                                                                                 \
      }                                                                                          \
      const int64_t rows = p->B * Out;                                                           \
      _Pragma("omp parallel for schedule(static) if (rows * R > LM_PARALLEL_GRAIN)")             \
      for (int64_t row = 0; row < rows; row++) {                                                 \
         const int64_t b = row / Out, o = row % Out;                                             \
         resample_row_##S(x + b * In * R, y + row * R, R, ptr[o], ptr[o + 1], idx, w);           \
      }                                                                                          \
   }
DEFINE_RESAMPLE(float, f32)
DEFINE_RESAMPLE(double, f64)

/* RESAMPLE: t = {x, ptr, idx, w, y} */
static lm_status k_resample(const lm_op *op) {
   const lm_resample_params *p = op->params;
   const int64_t *ptr = lm_tensor_data(op->t[1]), *idx = lm_tensor_data(op->t[2]);
   LM_TRY(check_taps(p, ptr, idx));
   const lm_tensor *x = op->t[0];
   if (x->dtype == LM_FLOAT32)
      resample_f32(p, lm_tensor_data(x), ptr, idx, lm_tensor_data(op->t[3]),
                   lm_tensor_data(op->t[4]));
   else if (x->dtype == LM_FLOAT64)
      resample_f64(p, lm_tensor_data(x), ptr, idx, lm_tensor_data(op->t[3]),
                   lm_tensor_data(op->t[4]));
   else
      return lm_error(LM_ERR_DTYPE, "resample: unsupported dtype %s", lm_dtype_name(x->dtype));
   return LM_OK;
}

void lm_cpu_register_resample(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_RESAMPLE] = k_resample;
}
