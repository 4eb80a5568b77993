/* resample.c -- the front end of lm_resample: one dim of a (B, In, R) tensor resampled to Out
 * positions by a sparse table of taps (each output position a weighted sum of a few input
 * positions). F.interpolate (lua/lumen/functional/resample.lua) runs every mode as one such pass
 * per resized dim over the tensor in its physical order, and its backward as the same pass with
 * the transposed table: a nearest or linear pass reads each value once or twice, where the dense
 * interpolation matrices it replaced cost In multiply-adds per output value (8 x 64 x 128 x 128
 * channels-last, nearest 2x: 80 ms forward). Kernels: LM_OP_RESAMPLE (resample.h). */
#include "common.h"
#include "nn.h"
#include "resample.h"

static lm_status taps_arg(const lm_tensor *t, const lm_tensor *x, int dtype, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "resample: %s is nil", what);
   LM_TRY(lm_check_same_device(x, t, "resample"));
   if (t->ndim != 1)
      return lm_error(LM_ERR_SHAPE, "resample: %s must be 1-D, got %d-D", what, t->ndim);
   if (t->dtype != dtype)
      return lm_error(LM_ERR_DTYPE, "resample: %s must be %s, got %s", what,
                      lm_dtype_name(dtype), lm_dtype_name(t->dtype));
   return LM_OK;
}

lm_status lm_resample(const lm_tensor *x, const lm_tensor *ptr, const lm_tensor *idx,
                      const lm_tensor *w, lm_tensor **out) {
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "resample: out is NULL");
   if (x->ndim != 3) {
      char a[160];
      lm_format_shape(a, sizeof a, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "resample: expected a 3-D input (B, In, R), got %s", a);
   }
   const int wdt = x->dtype == LM_FLOAT64 ? LM_FLOAT64 : LM_FLOAT32;
   LM_TRY(taps_arg(ptr, x, LM_INT64, "ptr"));
   LM_TRY(taps_arg(idx, x, LM_INT64, "idx"));
   LM_TRY(taps_arg(w, x, wdt, "w"));
   if (ptr->numel < 1) return lm_error(LM_ERR_SHAPE, "resample: ptr must have Out + 1 >= 1 elements");
   if (w->numel != idx->numel)
      return lm_error(LM_ERR_SHAPE, "resample: w has %lld elements, idx %lld",
                      (long long)w->numel, (long long)idx->numel);
   const int64_t sizes[3] = {x->sizes[0], ptr->numel - 1, x->sizes[2]};
   out_slot so;
   const lm_tensor *xd = NULL, *pd = NULL, *id = NULL, *wd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL, *y32 = NULL, *ytmp = NULL;
   LM_TRY(out_open(&so, out, 3, sizes, x->dtype, LM_CONTIGUOUS, x->device, "resample"));
   lm_status st = dense_float_in_format(x, LM_CONTIGUOUS, &xd, &t1);
   if (st == LM_OK) st = dense_in_format(ptr, LM_CONTIGUOUS, &pd, &t2);
   if (st == LM_OK) st = dense_in_format(idx, LM_CONTIGUOUS, &id, &t3);
   if (st == LM_OK) st = dense_in_format(w, LM_CONTIGUOUS, &wd, &t4);
   const int64_t n = sizes[0] * sizes[1] * sizes[2];
   if (st == LM_OK && n > 0) st = half_open(so.t, LM_CONTIGUOUS, &y32, &ytmp);
   if (st == LM_OK && n > 0) {
      const lm_resample_params p = {x->sizes[0], x->sizes[1], sizes[1], x->sizes[2], idx->numel};
      lm_tensor *ts[5] = {(lm_tensor *)xd, (lm_tensor *)pd, (lm_tensor *)id, (lm_tensor *)wd, y32};
      const lm_op op = lm_op_make(LM_OP_RESAMPLE, 5, ts, &p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, ytmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   lm_tensor_free(t3);
   lm_tensor_free(t4);
   return out_close(&so, out, st);
}
