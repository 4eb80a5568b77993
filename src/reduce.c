/* reduce.c -- the front end of sum, mean, prod, max, min, argmax, argmin over given dims (or all):
 * checks, result dtype and shape, outputs (contiguous, on the input's device), then LM_OP_REDUCE
 * (kernel: kernels/cpu/reduce.c; parameters: ops/reduce.h). What the kernel does:
 *
 * The input is walked in its memory order (the iterator sorts dims by the input's strides), so
 * reducing H,W of an NHWC tensor runs at unit stride over C. Values accumulate in double (int64
 * for integer results) into a scratch buffer laid out densely in the input's order; the result is
 * then converted into the output, which is contiguous (as PyTorch 1.13 allocates reductions).
 *
 * Determinism: work is split either along a kept dim (each accumulator is owned by one thread and
 * sees its terms in the serial order) or, for a full reduction, into chunks whose number depends
 * only on the sizes; so results never depend on the thread count. argmax/argmin (and max/min with
 * indices) compare (value, logical index) pairs, so ties go to the first element in logical
 * (row-major) order whatever the memory order, and NaN wins as in PyTorch. */
#include "iter.h"
#include "ops/reduce.h"
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- lm_reduce */

static const char *red_name(int op) {
   static const char *n[LM_NUM_REDUCE] = {"sum", "mean", "max", "min", "argmax", "argmin", "prod"};
   return (op >= 0 && op < LM_NUM_REDUCE) ? n[op] : "?";
}

lm_status lm_reduce(int op, const lm_tensor *a, const int *dims, int ndims, int keepdim,
                    int dtype, lm_tensor **out, lm_tensor **indices) {
   LM_CHECK_TENSOR(a, "input");
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (op < 0 || op >= LM_NUM_REDUCE) return lm_error(LM_ERR_ARG, "unknown reduction %d", op);
   if (ndims < 0 || ndims > LM_MAX_DIMS || (ndims > 0 && !dims))
      return lm_error(LM_ERR_ARG, "bad list of dims");
   const int nd = a->ndim;
   const char *name = red_name(op);
   int red[LM_MAX_DIMS] = {0};
   if (ndims == 0) {
      for (int d = 0; d < nd; d++) red[d] = 1;
   } else {
      for (int i = 0; i < ndims; i++) {
         int d = dims[i];
         LM_TRY(lm_wrap_dim(&d, nd));
         if (nd == 0) continue;
         if (red[d])
            return lm_error(LM_ERR_ARG, "%s(): dim %d appears multiple times in the list of dims",
                            name, dims[i]);
         red[d] = 1;
      }
   }
   const int arg = op == LM_ARGMAX || op == LM_ARGMIN;
   const int want_idx = arg || ((op == LM_MAX || op == LM_MIN) && indices);
   if (arg && ndims > 1)
      return lm_error(LM_ERR_ARG, "%s(): only one dim (or none) can be reduced", name);
   if (!arg && want_idx && ndims != 1)
      return lm_error(LM_ERR_ARG, "%s(): indices need exactly one reduction dim", name);
   if (dtype >= 0 && !lm_valid_dtype(dtype)) return lm_error(LM_ERR_DTYPE, "unknown dtype %d", dtype);

   /* result dtype */
   int rdt;
   switch (op) {
   case LM_SUM:
   case LM_PROD:
      rdt = dtype >= 0 ? dtype : lm_is_float_dtype(a->dtype) ? a->dtype : LM_INT64;
      break;
   case LM_MEAN:
      rdt = dtype >= 0 ? dtype : a->dtype;
      if (!lm_is_float_dtype(rdt))
         return lm_error(LM_ERR_DTYPE,
                         "mean(): could not infer output dtype. Input dtype must be either a "
                         "floating point or complex dtype. Got: %s",
                         lm_dtype_name(rdt));
      break;
   case LM_MAX:
   case LM_MIN: rdt = a->dtype; break;
   default:
      if (a->dtype == LM_BOOL)
         return lm_error(LM_ERR_DTYPE, "%s is not implemented for bool tensors", name);
      rdt = LM_INT64;
      break;
   }

   /* shapes */
   int64_t keep_sz[LM_MAX_DIMS], out_sz[LM_MAX_DIMS], count = 1;
   int ond = 0;
   for (int d = 0; d < nd; d++) {
      keep_sz[d] = red[d] ? 1 : a->sizes[d];
      if (red[d]) count *= a->sizes[d];
      if (!red[d] || keepdim) out_sz[ond++] = keep_sz[d];
   }
   if ((op == LM_MAX || op == LM_MIN || arg) && count == 0) {
      if (ndims == 0)
         return lm_error(LM_ERR_SHAPE,
                         "%s(): expected reduction dim to be specified for input.numel() == 0",
                         name);
      return lm_error(LM_ERR_SHAPE, "%s(): expected reduction dim to have non-zero size", name);
   }

   /* outputs */
   lm_tensor *o = *out, *created = NULL, *oi = indices ? *indices : NULL, *created_i = NULL;
   if (o) {
      LM_TRY(lm_check_same_device(a, o, "out"));
      int ok = o->ndim == ond;
      for (int d = 0; ok && d < ond; d++) ok = o->sizes[d] == out_sz[d];
      if (!ok) return lm_error(LM_ERR_SHAPE, "%s(): out has the wrong shape", name);
      if (!lm_can_cast(rdt, o->dtype))
         return lm_error(LM_ERR_DTYPE, "result type %s can't be cast to the desired output type %s",
                         lm_dtype_name(rdt), lm_dtype_name(o->dtype));
   }
   if (oi) {
      LM_TRY(lm_check_same_device(a, oi, "indices"));
      int ok = oi->ndim == ond && oi->dtype == LM_INT64;
      for (int d = 0; ok && d < ond; d++) ok = oi->sizes[d] == out_sz[d];
      if (!ok) return lm_error(LM_ERR_SHAPE, "%s(): indices must be int64 of the result's shape", name);
   }
   if (!o) {
      LM_TRY(lm_empty(ond, out_sz, rdt, LM_CONTIGUOUS, a->device, &created));
      o = created;
   }
   if (indices && op != LM_ARGMAX && op != LM_ARGMIN && !oi) {
      lm_status st = lm_empty(ond, out_sz, LM_INT64, LM_CONTIGUOUS, a->device, &created_i);
      if (st != LM_OK) {
         lm_tensor_free(created);
         return st;
      }
      oi = created_i;
   }

   lm_reduce_params p;
   memset(&p, 0, sizeof p);
   p.op = op;
   p.arg = arg;
   p.want_idx = want_idx;
   p.keepdim = keepdim;
   p.rdt = rdt;
   for (int d = 0; d < nd; d++) p.red[d] = red[d];
   lm_tensor *ts[3] = {(lm_tensor *)a, o, (oi && !arg) ? oi : NULL};
   const lm_op kop = lm_op_make(LM_OP_REDUCE, 3, ts, &p);
   lm_status st = lm_dispatch(&kop);
   if (st != LM_OK) {
      lm_tensor_free(created);
      lm_tensor_free(created_i);
      return st;
   }
   *out = o;
   if (indices) *indices = oi;
   return LM_OK;
}
