/* indexing.c -- the front ends of sort, gather, scatter_add_ and cumsum (kinds LM_OP_SORT,
 * LM_OP_GATHER, LM_OP_SCATTER_ADD, LM_OP_CUMSUM; parameters and the kernels' shared row bodies in
 * indexing.h).
 *
 * Layouts, as PyTorch 2.x returns them (checked against the peer):
 *   - sort: values and indices get x's strides when x is non-overlapping and dense (so a
 *     channels-last input gives channels-last results, a transposed one transposed results),
 *     else dense strides in x's dim order (infer_dense_strides), torch.sort's meta function;
 *   - gather, cumsum: a contiguous result, whatever the input's layout;
 *   - scatter_add_: in place, self keeps its strides.
 * The kernels take any strides, so no input is copied to a layout first.
 *
 * Every dtype is taken (sort, gather, scatter_add_ and cumsum accept the integers and bool, as
 * PyTorch's do); the halves are read and written by the kernels themselves (no float32 copy).
 * Index values are base-based (indexing.h); the kernels check them, since a front end reads no
 * values. */
#include "common.h"
#include "indexing.h"
#include "nn.h"

static lm_status check_tensor(const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   if (!lm_valid_dtype(t->dtype)) return lm_error(LM_ERR_DTYPE, "%s has an invalid dtype", what);
   return LM_OK;
}

static lm_status check_index(const lm_tensor *x, const lm_tensor *index, const char *fname) {
   LM_TRY(check_tensor(index, "index"));
   LM_TRY(lm_check_same_device(x, index, fname));
   if (index->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "expected an int64 index, got %s",
                      lm_dtype_name(index->dtype));
   return LM_OK;
}

static lm_status check_base(int64_t base) {
   if (base != 0 && base != 1) return lm_error(LM_ERR_ARG, "index base must be 0 or 1");
   return LM_OK;
}

/* torch.sort's output strides: x's when non-overlapping and dense, else dense in x's order */
static void sort_strides(const lm_tensor *x, int64_t *st) {
   if (lm_is_non_overlapping_and_dense(x))
      memcpy(st, x->strides, sizeof(int64_t) * (size_t)x->ndim);
   else
      lm_infer_dense_strides(x->ndim, x->sizes, x->strides, st);
}

lm_status lm_sort(const lm_tensor *x, int dim, int descending, int64_t base, lm_tensor **values,
                  lm_tensor **indices) {
   LM_TRY(check_tensor(x, "input"));
   LM_TRY(check_base(base));
   if (!values || !indices) return lm_error(LM_ERR_ARG, "values or indices is NULL");
   LM_TRY(lm_wrap_dim(&dim, x->ndim));
   int64_t st[LM_MAX_DIMS];
   sort_strides(x, st);
   lm_tensor *v = NULL, *ix = NULL;
   LM_TRY(lm_empty_strided(x->ndim, x->sizes, st, x->dtype, x->device, &v));
   lm_status st2 = lm_empty_strided(x->ndim, x->sizes, st, LM_INT64, x->device, &ix);
   if (st2 == LM_OK && x->numel > 0) {
      const lm_index_params p = {dim, descending != 0, base};
      lm_tensor *ts[3] = {(lm_tensor *)x, v, ix};
      const lm_op op = lm_op_make(LM_OP_SORT, 3, ts, &p);
      st2 = lm_dispatch(&op);
   }
   if (st2 != LM_OK) {
      lm_tensor_free(v);
      lm_tensor_free(ix);
      return st2;
   }
   *values = v;
   *indices = ix;
   return LM_OK;
}

/* an error when index is larger than t at some d (every d, or every d but dim when skip_dim);
   the dimension is counted from base, as the caller counts dims */
static lm_status check_not_larger(const lm_tensor *index, const lm_tensor *t, int dim,
                                  int skip_dim, int64_t base, const char *what) {
   for (int d = 0; d < index->ndim; d++) {
      if (skip_dim && d == dim) continue;
      if (index->sizes[d] > t->sizes[d]) {
         char a[160], b[160];
         lm_format_shape(a, sizeof a, index->ndim, index->sizes);
         lm_format_shape(b, sizeof b, t->ndim, t->sizes);
         return lm_error(LM_ERR_SHAPE,
                         "size does not match at dimension %d: expected index %s to be no "
                         "larger than %s %s%s",
                         d + (int)base, a, what, b, skip_dim ? " apart from the dim" : "");
      }
   }
   return LM_OK;
}

static lm_status check_same_rank(const lm_tensor *index, const lm_tensor *t, const char *what) {
   /* PyTorch lets a 0-dim tensor pair with a 1-element 1-D one; lumen asks for equal ranks */
   if (index->ndim != t->ndim)
      return lm_error(LM_ERR_SHAPE,
                      "index tensor must have the same number of dimensions as %s tensor (%d "
                      "and %d)",
                      what, index->ndim, t->ndim);
   return LM_OK;
}

lm_status lm_gather(const lm_tensor *x, int dim, const lm_tensor *index, int64_t base,
                    lm_tensor **out) {
   LM_TRY(check_tensor(x, "input"));
   LM_TRY(check_index(x, index, "gather"));
   LM_TRY(check_base(base));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(lm_wrap_dim(&dim, x->ndim));
   LM_TRY(check_same_rank(index, x, "input"));
   LM_TRY(check_not_larger(index, x, dim, 1, base, "input"));
   out_slot so;
   LM_TRY(out_open(&so, out, index->ndim, index->sizes, x->dtype, LM_CONTIGUOUS, x->device,
                   "gather"));
   lm_status st = LM_OK;
   if (index->numel > 0) {
      const lm_index_params p = {dim, 0, base};
      lm_tensor *ts[3] = {(lm_tensor *)x, (lm_tensor *)index, so.t};
      const lm_op op = lm_op_make(LM_OP_GATHER, 3, ts, &p);
      st = lm_dispatch(&op);
   }
   return out_close(&so, out, st);
}

/* do the bytes a and b span intersect (same storage; PyTorch's assert_no_overlap, which refuses
   partial and full overlap between the written-to tensor and an input)? */
static int spans_overlap(const lm_tensor *a, const lm_tensor *b) {
   if (a->storage != b->storage || a->numel == 0 || b->numel == 0) return 0;
   int64_t lo[2], hi[2];
   const lm_tensor *t[2] = {a, b};
   for (int k = 0; k < 2; k++) {
      const int64_t es = lm_dtype_size(t[k]->dtype);
      int64_t first = t[k]->offset, last = t[k]->offset;
      for (int d = 0; d < t[k]->ndim; d++) {
         const int64_t ext = (t[k]->sizes[d] - 1) * t[k]->strides[d];
         if (ext < 0) first += ext;
         else last += ext;
      }
      lo[k] = first * es;
      hi[k] = (last + 1) * es;
   }
   return lo[0] < hi[1] && lo[1] < hi[0];
}

lm_status lm_scatter_add_(lm_tensor *self, int dim, const lm_tensor *index, const lm_tensor *src,
                          int64_t base) {
   LM_TRY(check_tensor(self, "self"));
   LM_TRY(check_index(self, index, "scatter_add"));
   LM_TRY(check_tensor(src, "src"));
   LM_TRY(lm_check_same_device(self, src, "scatter_add"));
   LM_TRY(check_base(base));
   if (src->dtype != self->dtype)
      return lm_error(LM_ERR_DTYPE,
                      "expected self.dtype to be equal to src.dtype (%s and %s)",
                      lm_dtype_name(self->dtype), lm_dtype_name(src->dtype));
   LM_TRY(lm_wrap_dim(&dim, self->ndim));
   LM_TRY(check_same_rank(index, self, "self"));
   LM_TRY(check_same_rank(index, src, "src"));
   LM_TRY(check_not_larger(index, self, dim, 1, base, "self"));
   LM_TRY(check_not_larger(index, src, dim, 0, base, "src"));
   for (int d = 0; d < self->ndim; d++)
      if (self->strides[d] == 0 && self->sizes[d] > 1)
         return lm_error(LM_ERR_ARG, "unsupported operation: more than one element of the "
                                     "written-to tensor refers to a single memory location. "
                                     "Please clone() the tensor before performing the operation.");
   if (spans_overlap(self, src) || spans_overlap(self, index))
      return lm_error(LM_ERR_ARG, "unsupported operation: some elements of the input tensor and "
                                  "the written-to tensor refer to a single memory location. "
                                  "Please clone() the tensor before performing the operation.");
   if (index->numel == 0) return LM_OK;
   const lm_index_params p = {dim, 0, base};
   lm_tensor *ts[3] = {self, (lm_tensor *)index, (lm_tensor *)src};
   const lm_op op = lm_op_make(LM_OP_SCATTER_ADD, 3, ts, &p);
   return lm_dispatch(&op);
}

lm_status lm_cumsum(const lm_tensor *x, int dim, int reverse, int dtype, lm_tensor **out) {
   LM_TRY(check_tensor(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(lm_wrap_dim(&dim, x->ndim));
   /* PyTorch: integer and bool inputs sum into int64 unless a dtype is given */
   int odt = dtype >= 0 ? dtype : lm_is_float_dtype(x->dtype) ? x->dtype : LM_INT64;
   if (!lm_valid_dtype(odt)) return lm_error(LM_ERR_DTYPE, "cumsum: invalid dtype %d", dtype);
   if (odt == LM_BOOL) return lm_error(LM_ERR_DTYPE, "cumsum: a bool result is not supported");
   const lm_index_params p = {dim, reverse != 0, 0};
   lm_tensor *u = *out;
   if (u && u->device == x->device && u->dtype == odt && u->ndim == x->ndim &&
       memcmp(u->sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim) == 0 &&
       lm_is_non_overlapping_and_dense(u) && !(u->storage == x->storage && x->numel > 0)) {
      /* an out= tensor in any dense layout is written in place: the kernel walks its strides
         (autograd hands one in the input's format, so the gradient keeps it) */
      if (x->numel == 0) return LM_OK;
      lm_tensor *ts[2] = {(lm_tensor *)x, u};
      const lm_op op = lm_op_make(LM_OP_CUMSUM, 2, ts, &p);
      return lm_dispatch(&op);
   }
   out_slot so;
   LM_TRY(out_open(&so, out, x->ndim, x->sizes, odt, LM_CONTIGUOUS, x->device, "cumsum"));
   lm_status st = LM_OK;
   if (x->numel > 0) {
      lm_tensor *ts[2] = {(lm_tensor *)x, so.t};
      const lm_op op = lm_op_make(LM_OP_CUMSUM, 2, ts, &p);
      st = lm_dispatch(&op);
   }
   return out_close(&so, out, st);
}
