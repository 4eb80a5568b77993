/* view.c -- views: new sizes/strides/offset over the same storage, never a copy (except
 * lm_reshape and lm_flatten, which copy when no view exists, as in PyTorch). */
#include "internal.h"
#include <stdlib.h>

static lm_status make_view(const lm_tensor *t, int nd, const int64_t *sz, const int64_t *st,
                           int64_t offset, lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   return lm_tensor_from_storage(t->storage, offset, nd, sz, st, t->dtype, out);
}

lm_status lm_alias(const lm_tensor *t, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   return make_view(t, t->ndim, t->sizes, t->strides, t->offset, out);
}

lm_status lm_as_strided(const lm_tensor *t, int nd, const int64_t *sz, const int64_t *st,
                        int64_t offset, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   LM_TRY(lm_check_sizes(nd, sz));
   for (int d = 0; d < nd; d++)
      if (st[d] < 0) return lm_error(LM_ERR_ARG, "negative strides are not supported");
   return make_view(t, nd, sz, st, offset, out);
}

/* resolve one -1 in sizes against numel */
static lm_status infer_size(int nd, const int64_t *in, int64_t numel, int64_t *out) {
   if (nd < 0 || nd > LM_MAX_DIMS)
      return lm_error(LM_ERR_SHAPE, "tensors have at most %d dimensions, got %d", LM_MAX_DIMS, nd);
   if (nd > 0 && !in) return lm_error(LM_ERR_ARG, "sizes are missing");
   int infer = -1;
   int64_t prod = 1;
   for (int d = 0; d < nd; d++) {
      if (in[d] == -1) {
         if (infer >= 0) return lm_error(LM_ERR_SHAPE, "only one dimension can be inferred");
         infer = d;
         out[d] = 1; /* for the size check below */
      } else if (in[d] < 0) {
         return lm_error(LM_ERR_SHAPE, "invalid shape dimension %lld", (long long)in[d]);
      } else {
         out[d] = in[d];
      }
   }
   /* the sizes (with the inferred one as 1) must not overflow before they are multiplied */
   if (lm_check_sizes(nd, out) != LM_OK) {
      char buf[256];
      return lm_error(LM_ERR_SHAPE,
                      "sizes %s overflow (their product or strides do not fit in 64 bits)",
                      lm_format_sizes(buf, sizeof buf, nd, in));
   }
   for (int d = 0; d < nd; d++)
      if (d != infer) prod *= out[d];
   if (infer >= 0) {
      if (prod == 0 || numel % prod != 0)
         return lm_error(LM_ERR_SHAPE, "shape is invalid for input of size %lld",
                         (long long)numel);
      out[infer] = numel / prod;
   } else if (prod != numel) {
      return lm_error(LM_ERR_SHAPE, "shape is invalid for input of size %lld", (long long)numel);
   }
   return lm_check_sizes(nd, out);
}

/* PyTorch's computeStride: strides for a view of (osz, ost) with new sizes nsz, or 0 if none */
static int compute_view_strides(int ond, const int64_t *osz, const int64_t *ost, int nnd,
                                const int64_t *nsz, int64_t *nst) {
   int64_t numel = lm_numel_of(ond, osz);
   if (numel == 0) {
      /* any shape of numel 0: contiguous strides */
      lm_compute_strides(nnd, nsz, LM_CONTIGUOUS, nst);
      return 1;
   }
   if (ond == 0) { /* a 0-dim tensor views as any shape of one element */
      for (int d = 0; d < nnd; d++) nst[d] = 1;
      return 1;
   }
   int view_d = nnd - 1;
   int64_t chunk_base_stride = ond > 0 ? ost[ond - 1] : 1;
   int64_t tensor_numel = 1, view_numel = 1;
   for (int td = ond - 1; td >= 0; td--) {
      tensor_numel *= osz[td];
      if (td == 0 || (osz[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride)) {
         while (view_d >= 0 && (view_numel < tensor_numel || nsz[view_d] == 1)) {
            nst[view_d] = view_numel * chunk_base_stride;
            view_numel *= nsz[view_d];
            view_d--;
         }
         if (view_numel != tensor_numel) return 0;
         if (td > 0) {
            chunk_base_stride = ost[td - 1];
            tensor_numel = 1;
            view_numel = 1;
         }
      }
   }
   if (view_d != -1) return 0;
   return 1;
}

lm_status lm_view(const lm_tensor *t, int nd, const int64_t *sizes, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   LM_TRY(infer_size(nd, sizes, t->numel, sz));
   if (!compute_view_strides(t->ndim, t->sizes, t->strides, nd, sz, st))
      return lm_error(LM_ERR_SHAPE,
                      "view size is not compatible with input tensor's size and stride (at least "
                      "one dimension spans across two contiguous subspaces); use reshape instead");
   return make_view(t, nd, sz, st, t->offset, out);
}

lm_status lm_reshape(const lm_tensor *t, int nd, const int64_t *sizes, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   LM_TRY(infer_size(nd, sizes, t->numel, sz));
   if (compute_view_strides(t->ndim, t->sizes, t->strides, nd, sz, st))
      return make_view(t, nd, sz, st, t->offset, out);
   lm_tensor *c = NULL;
   LM_TRY(lm_clone(t, LM_CONTIGUOUS, -1, &c));
   lm_compute_strides(nd, sz, LM_CONTIGUOUS, st);
   lm_status s = make_view(c, nd, sz, st, 0, out);
   lm_tensor_free(c);
   return s;
}

lm_status lm_permute(const lm_tensor *t, const int *dims, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (t->ndim > 0 && !dims) return lm_error(LM_ERR_ARG, "dims are missing");
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   int seen[LM_MAX_DIMS] = {0};
   for (int i = 0; i < t->ndim; i++) {
      int d = dims[i];
      LM_TRY(lm_wrap_dim(&d, t->ndim));
      if (seen[d]) return lm_error(LM_ERR_ARG, "repeated dim %d in permute", d + 1);
      seen[d] = 1;
      sz[i] = t->sizes[d];
      st[i] = t->strides[d];
   }
   return make_view(t, t->ndim, sz, st, t->offset, out);
}

lm_status lm_transpose(const lm_tensor *t, int d0, int d1, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   LM_TRY(lm_wrap_dim(&d0, t->ndim));
   LM_TRY(lm_wrap_dim(&d1, t->ndim));
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   memcpy(sz, t->sizes, sizeof sz);
   memcpy(st, t->strides, sizeof st);
   if (t->ndim > 0) {
      sz[d0] = t->sizes[d1];
      sz[d1] = t->sizes[d0];
      st[d0] = t->strides[d1];
      st[d1] = t->strides[d0];
   }
   return make_view(t, t->ndim, sz, st, t->offset, out);
}

lm_status lm_expand(const lm_tensor *t, int nd, const int64_t *sizes, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (nd < t->ndim)
      return lm_error(LM_ERR_SHAPE,
                      "the number of sizes provided (%d) must be greater or equal to the number "
                      "of dimensions in the tensor (%d)", nd, t->ndim);
   if (nd > LM_MAX_DIMS)
      return lm_error(LM_ERR_SHAPE, "tensors have at most %d dimensions, got %d", LM_MAX_DIMS, nd);
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   for (int i = nd - 1; i >= 0; i--) {
      int j = t->ndim - nd + i;
      if (j < 0) {
         if (sizes[i] < 0)
            return lm_error(LM_ERR_SHAPE, "the expanded size -1 is not allowed in a leading, "
                                          "non-existing dimension");
         sz[i] = sizes[i];
         st[i] = 0;
      } else {
         int64_t want = sizes[i] == -1 ? t->sizes[j] : sizes[i];
         if (want < 0) return lm_error(LM_ERR_SHAPE, "invalid expanded size %lld", (long long)want);
         if (t->sizes[j] == want) {
            sz[i] = want;
            st[i] = t->strides[j];
         } else if (t->sizes[j] == 1) {
            sz[i] = want;
            st[i] = 0;
         } else {
            return lm_error(LM_ERR_SHAPE,
                            "the expanded size of the tensor (%lld) must match the existing size "
                            "(%lld) at non-singleton dimension %d",
                            (long long)want, (long long)t->sizes[j], i + 1);
         }
      }
   }
   return make_view(t, nd, sz, st, t->offset, out);
}

/* t's offset plus i steps along dim. A view with elements stays inside the storage, so this is
   small; only an empty tensor (another size 0) can have huge sizes and strides, and an empty view
   may start anywhere: it then keeps t's offset rather than overflow. */
static int64_t view_offset(const lm_tensor *t, int64_t i, int dim) {
   int64_t step, off;
   if (__builtin_mul_overflow(i, t->strides[dim], &step) ||
       __builtin_add_overflow(t->offset, step, &off) || off > LM_MAX_SPAN)
      return t->offset;
   return off;
}

lm_status lm_narrow(const lm_tensor *t, int dim, int64_t start, int64_t length, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (t->ndim == 0) return lm_error(LM_ERR_ARG, "cannot narrow a 0-dimensional tensor");
   LM_TRY(lm_wrap_dim(&dim, t->ndim));
   if (start < 0 || length < 0 || start > t->sizes[dim] || length > t->sizes[dim] - start)
      return lm_error(LM_ERR_ARG, "start (%lld) + length (%lld) exceeds dimension size (%lld)",
                      (long long)(start < INT64_MAX ? start + 1 : start), /* 1-based for Lua */
                      (long long)length, (long long)t->sizes[dim]);
   int64_t sz[LM_MAX_DIMS];
   memcpy(sz, t->sizes, sizeof sz);
   sz[dim] = length;
   return make_view(t, t->ndim, sz, t->strides, view_offset(t, start, dim), out);
}

lm_status lm_select(const lm_tensor *t, int dim, int64_t index, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (t->ndim == 0) return lm_error(LM_ERR_ARG, "select cannot be applied to a 0-dim tensor");
   LM_TRY(lm_wrap_dim(&dim, t->ndim));
   if (index < 0) index += t->sizes[dim];
   if (index < 0 || index >= t->sizes[dim])
      return lm_error(LM_ERR_ARG, "index out of range for dimension %d of size %lld", dim + 1,
                      (long long)t->sizes[dim]);
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   int k = 0;
   for (int d = 0; d < t->ndim; d++) {
      if (d == dim) continue;
      sz[k] = t->sizes[d];
      st[k] = t->strides[d];
      k++;
   }
   return make_view(t, k, sz, st, view_offset(t, index, dim), out);
}

lm_status lm_unsqueeze(const lm_tensor *t, int dim, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (t->ndim >= LM_MAX_DIMS)
      return lm_error(LM_ERR_SHAPE, "tensors have at most %d dimensions", LM_MAX_DIMS);
   LM_TRY(lm_wrap_dim(&dim, t->ndim + 1));
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   int k = 0;
   for (int d = 0; d <= t->ndim; d++) {
      if (d == dim) {
         sz[d] = 1;
         st[d] = 1;
         /* size * stride of the next dim; only an empty tensor's can pass 2^60 (checked) */
         if (d < t->ndim &&
             (__builtin_mul_overflow(t->sizes[k], t->strides[k], &st[d]) || st[d] > LM_MAX_SPAN))
            st[d] = LM_MAX_SPAN;
      } else {
         sz[d] = t->sizes[k];
         st[d] = t->strides[k];
         k++;
      }
   }
   return make_view(t, t->ndim + 1, sz, st, t->offset, out);
}

lm_status lm_squeeze(const lm_tensor *t, int dim, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   int64_t sz[LM_MAX_DIMS], st[LM_MAX_DIMS];
   int k = 0;
   int all = dim < -LM_MAX_DIMS; /* callers pass a very negative dim (e.g. -1000) for "all" */
   if (!all) LM_TRY(lm_wrap_dim(&dim, t->ndim));
   for (int d = 0; d < t->ndim; d++) {
      if (t->sizes[d] == 1 && (all || d == dim)) continue;
      sz[k] = t->sizes[d];
      st[k] = t->strides[d];
      k++;
   }
   return make_view(t, k, sz, st, t->offset, out);
}

lm_status lm_flatten(const lm_tensor *t, int s, int e, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (t->ndim == 0) {
      int64_t one = 1;
      return lm_reshape(t, 1, &one, out);
   }
   LM_TRY(lm_wrap_dim(&s, t->ndim));
   LM_TRY(lm_wrap_dim(&e, t->ndim));
   if (s > e) return lm_error(LM_ERR_ARG, "flatten() has invalid args: start_dim cannot come after end_dim");
   if (s == e) return lm_alias(t, out);
   int64_t sz[LM_MAX_DIMS];
   int k = 0;
   for (int d = 0; d < s; d++) sz[k++] = t->sizes[d];
   int64_t prod = 1;
   for (int d = s; d <= e; d++) prod *= t->sizes[d];
   sz[k++] = prod;
   for (int d = e + 1; d < t->ndim; d++) sz[k++] = t->sizes[d];
   return lm_reshape(t, k, sz, out);
}
