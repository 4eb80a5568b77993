/* cat.c -- concatenation with PyTorch 1.13 semantics: every input has the same rank and sizes
 * except along dim (legacy: 1-D empty tensors are skipped), dtypes promote, and the output takes
 * the memory format every input suggests (any Contiguous or any disagreement gives Contiguous).
 * The front end: checks, the result's shape, dtype and format, the output on the inputs' device;
 * the copies are LM_OP_CAT's (kernels/cpu/reduce.c; parameters: ops/reduce.h). */
#include "iter.h"
#include "ops/reduce.h"
#include <stdlib.h>

lm_status lm_cat(int n, const lm_tensor *const *ts, int dim, lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (n <= 0 || !ts) return lm_error(LM_ERR_ARG, "expected a non-empty list of tensors");
   const lm_tensor *ref = NULL;
   int dtype = -1, fmt = -1, refpos = -1;
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = ts[i];
      if (!t) return lm_error(LM_ERR_ARG, "tensor %d of the list is nil", i + 1);
      LM_TRY(lm_check_same_device(ts[0], t, "cat"));
      if (t->ndim == 0)
         return lm_error(LM_ERR_SHAPE, "zero-dimensional tensor (at position %d) cannot be concatenated",
                         i + 1);
      dtype = dtype < 0 ? t->dtype : lm_promote_types(dtype, t->dtype);
      int f = lm_suggest_memory_format(t, 0);
      if (fmt < 0) fmt = f;
      else if (fmt != f) fmt = LM_CONTIGUOUS;
      if (!ref && !(t->ndim == 1 && t->sizes[0] == 0)) {
         ref = t;
         refpos = i;
      }
   }
   if (fmt < 0) fmt = LM_CONTIGUOUS;
   if (!ref) { /* only legacy empty tensors */
      int64_t zero = 0;
      if (*out) {
         if ((*out)->numel != 0) return lm_error(LM_ERR_SHAPE, "cat: out has the wrong shape");
         return LM_OK;
      }
      return lm_empty(1, &zero, dtype, LM_CONTIGUOUS, ts[0]->device, out);
   }
   const int nd = ref->ndim;
   LM_TRY(lm_wrap_dim(&dim, nd));
   int64_t shape[LM_MAX_DIMS];
   for (int d = 0; d < nd; d++) shape[d] = ref->sizes[d];
   shape[dim] = 0;
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = ts[i];
      if (t->ndim == 1 && t->sizes[0] == 0) continue;
      if (t->ndim != nd)
         return lm_error(LM_ERR_SHAPE,
                         "tensors must have same number of dimensions: got %d and %d", nd, t->ndim);
      for (int d = 0; d < nd; d++)
         if (d != dim && t->sizes[d] != ref->sizes[d])
            return lm_error(LM_ERR_SHAPE,
                            "sizes of tensors must match except in dimension %d. Expected size "
                            "%lld but got size %lld for tensor number %d in the list",
                            dim + 1, (long long)ref->sizes[d], (long long)t->sizes[d], i + 1);
      /* each size is <= 2^60 (lm_check_sizes), but enough of them can still overflow: checked
         here, and the result's sizes by lm_empty below */
      if (__builtin_add_overflow(shape[dim], t->sizes[dim], &shape[dim]) ||
          shape[dim] > LM_MAX_SPAN)
         return lm_error(LM_ERR_SHAPE, "cat: the result's size along dimension %d overflows",
                         dim + 1);
   }
   (void)refpos;
   if (fmt == LM_CHANNELS_LAST && nd != 4) fmt = LM_CONTIGUOUS;
   if (fmt == LM_CHANNELS_LAST_3D && nd != 5) fmt = LM_CONTIGUOUS;
   lm_tensor *o = *out, *created = NULL;
   if (o) {
      LM_TRY(lm_check_same_device(ts[0], o, "out"));
      int ok = o->ndim == nd;
      for (int d = 0; ok && d < nd; d++) ok = o->sizes[d] == shape[d];
      if (!ok) return lm_error(LM_ERR_SHAPE, "cat: out has the wrong shape");
      if (!lm_can_cast(dtype, o->dtype))
         return lm_error(LM_ERR_DTYPE, "result type %s can't be cast to the desired output type %s",
                         lm_dtype_name(dtype), lm_dtype_name(o->dtype));
   } else {
      LM_TRY(lm_empty(nd, shape, dtype, fmt, ts[0]->device, &created));
      o = created;
   }
   lm_tensor *inl[8], **tl = n + 1 <= 8 ? inl : malloc(sizeof *tl * (size_t)(n + 1));
   if (!tl) {
      lm_tensor_free(created);
      return lm_error(LM_ERR_OOM, "out of memory");
   }
   tl[0] = o;
   for (int i = 0; i < n; i++) tl[i + 1] = (lm_tensor *)ts[i];
   const lm_cat_params p = {dim};
   const lm_op op = lm_op_make(LM_OP_CAT, n + 1, tl, &p);
   lm_status st = lm_dispatch(&op);
   if (tl != inl) free(tl);
   if (st != LM_OK) {
      lm_tensor_free(created);
      return st;
   }
   *out = o;
   return LM_OK;
}
