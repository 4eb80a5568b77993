/* tensor.c -- storage and tensor lifetime, creation, *_like and clone (spec section 5). */
#include "backend.h"
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- shape helpers */

int64_t lm_numel_of(int nd, const int64_t *sz) {
   int64_t n = 1;
   for (int d = 0; d < nd; d++) n *= sz[d];
   return n;
}

/* "{2, 3, 4}" into buf (at most cap bytes, "..." when cut), for error messages */
const char *lm_format_sizes(char *buf, size_t cap, int nd, const int64_t *sz) {
   size_t len = 0;
   buf[0] = 0;
   len += (size_t)snprintf(buf, cap, "{");
   for (int d = 0; d < nd && len < cap; d++) {
      if (len + 28 > cap) {
         snprintf(buf + len, cap - len, "...");
         len = cap;
         break;
      }
      len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)sz[d]);
   }
   if (len < cap) snprintf(buf + len, cap - len, "}");
   return buf;
}

/* Every size, stride and element count of a tensor stays at most LM_MAX_SPAN (2^60), and so does
   the product of its sizes counted as max(size, 1) (the largest contiguous stride times the
   first size): byte offsets (times an element size <= 8) and sums of a few of them then stay
   inside int64, so no later computation can overflow. As in PyTorch, this holds even when a zero
   size makes the tensor empty: {0, 2^40, 2^40, 2^40} would need strides of 2^80. */
lm_status lm_check_sizes(int nd, const int64_t *sz) {
   if (nd < 0 || nd > LM_MAX_DIMS)
      return lm_error(LM_ERR_SHAPE, "tensors have at most %d dimensions, got %d", LM_MAX_DIMS, nd);
   if (nd > 0 && !sz) return lm_error(LM_ERR_ARG, "sizes are missing");
   int64_t n = 1, span = 1;
   int ovf = 0;
   for (int d = 0; d < nd; d++) {
      if (sz[d] < 0)
         return lm_error(LM_ERR_SHAPE, "negative dimension %lld at position %d",
                         (long long)sz[d], d + 1);
      ovf |= __builtin_mul_overflow(span, sz[d] > 1 ? sz[d] : 1, &span);
      ovf |= span > LM_MAX_SPAN;
      if (!ovf) n *= sz[d]; /* n <= span: cannot overflow */
   }
   if (ovf) {
      char buf[256];
      return lm_error(LM_ERR_SHAPE,
                      "sizes %s overflow (their product or strides do not fit in 64 bits)",
                      lm_format_sizes(buf, sizeof buf, nd, sz));
   }
   if (n > ((int64_t)1 << 50)) return lm_error(LM_ERR_SHAPE, "tensor too large");
   return LM_OK;
}

lm_status lm_wrap_dim(int *dim, int nd) {
   int n = nd > 0 ? nd : 1; /* a 0-dim tensor accepts dim 0 / -1, as in PyTorch */
   if (*dim < -n || *dim >= n)
      return lm_error(LM_ERR_ARG, "dimension out of range for a %d-dimensional tensor", nd);
   if (*dim < 0) *dim += n;
   return LM_OK;
}

lm_status lm_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                              int64_t *out) {
   int n = na > nb ? na : nb;
   int64_t tmp[LM_MAX_DIMS];
   for (int i = 0; i < n; i++) {
      int ia = na - n + i, ib = nb - n + i;
      int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
      if (sa == sb || sb == 1) tmp[i] = sa;
      else if (sa == 1) tmp[i] = sb;
      else
         return lm_error(LM_ERR_SHAPE,
                         "the size of tensor a (%lld) must match the size of tensor b (%lld) at "
                         "non-singleton dimension %d",
                         (long long)sa, (long long)sb, i + 1);
   }
   memcpy(out, tmp, sizeof(int64_t) * (size_t)n);
   *nout = n;
   return LM_OK;
}

/* ---------------------------------------------------------------- storage */

lm_storage *lm_storage_new(int64_t nbytes, int device) {
   const lm_backend *b = lm_backend_get(device);
   if (!b) return NULL;
   if (nbytes < 0) {
      lm_error(LM_ERR_ARG, "negative storage size");
      return NULL;
   }
   lm_storage *s = lm_meta_alloc(sizeof *s);
   if (!s) {
      lm_error(LM_ERR_OOM, "out of memory");
      return NULL;
   }
   s->data = b->alloc(b, (size_t)nbytes);
   if (!s->data) {
      lm_meta_free(s, sizeof *s);
      return NULL;
   }
   s->nbytes = nbytes;
   s->refcount = 1;
   s->device = device;
   s->deleter = NULL;
   s->deleter_ctx = NULL;
   return s;
}

lm_storage *lm_storage_wrap(void *data, int64_t nbytes, int device, void (*deleter)(void *),
                            void *ctx) {
   lm_storage *s = lm_meta_alloc(sizeof *s);
   if (!s) {
      lm_error(LM_ERR_OOM, "out of memory");
      return NULL;
   }
   s->data = data;
   s->nbytes = nbytes;
   s->refcount = 1;
   s->device = device;
   s->deleter = deleter;
   s->deleter_ctx = ctx;
   return s;
}

void lm_storage_retain(lm_storage *s) {
   if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void lm_storage_release(lm_storage *s) {
   if (!s) return;
   if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
   if (s->deleter) {
      s->deleter(s->deleter_ctx);
   } else {
      const lm_backend *b = lm_backend_get(s->device);
      if (b) b->free(b, s->data, (size_t)s->nbytes);
   }
   lm_meta_free(s, sizeof *s);
}

/* ---------------------------------------------------------------- tensors */

void lm_tensor_refresh(lm_tensor *t) {
   t->numel = lm_numel_of(t->ndim, t->sizes);
   t->flags = lm_layout_flags(t->ndim, t->sizes, t->strides);
}

void lm_tensor_free(lm_tensor *t) {
   if (!t) return;
   lm_storage_release(t->storage);
   lm_meta_free(t, sizeof *t);
}

void lm_tensor_free_many(lm_tensor **ts, int64_t n) {
   if (!ts) return;
   for (int64_t i = 0; i < n; i++) lm_tensor_free(ts[i]);
}

void lm_tensor_release_storage(lm_tensor *t) {
   if (!t) return;
   lm_storage_release(t->storage);
   t->storage = NULL;
   t->numel = 0;
   for (int d = 0; d < t->ndim; d++) t->sizes[d] = 0;
}

void *lm_tensor_data(const lm_tensor *t) {
   if (!t || !t->storage) return NULL;
   return (char *)t->storage->data + t->offset * lm_dtype_size(t->dtype);
}

int lm_tensor_same_storage(const lm_tensor *a, const lm_tensor *b) {
   return a && b && a->storage == b->storage;
}

/* elements of storage a (sizes, strides) view reaches past its offset: 0 when empty, -1 for a
   negative stride, -2 when a stride or the extent is past LM_MAX_SPAN (checked arithmetic:
   hostile strides must not wrap around into a small extent) */
static int64_t extent_elems(int nd, const int64_t *sz, const int64_t *st) {
   for (int d = 0; d < nd; d++) {
      if (st[d] < 0) return -1;
      if (st[d] > LM_MAX_SPAN) return -2;
   }
   for (int d = 0; d < nd; d++)
      if (sz[d] == 0) return 0;
   int64_t hi = 0;
   for (int d = 0; d < nd; d++) {
      int64_t step;
      if (__builtin_mul_overflow(sz[d] - 1, st[d], &step) || __builtin_add_overflow(hi, step, &hi) ||
          hi >= LM_MAX_SPAN)
         return -2;
   }
   return hi + 1;
}

static lm_status extent_error(int64_t ext, int nd, const int64_t *st) {
   if (ext == -1) return lm_error(LM_ERR_ARG, "negative strides are not supported");
   char buf[256];
   return lm_error(LM_ERR_SHAPE, "strides %s overflow (the memory they reach does not fit in 64 "
                   "bits)", lm_format_sizes(buf, sizeof buf, nd, st));
}

lm_status lm_tensor_from_storage(lm_storage *s, int64_t offset, int nd, const int64_t *sz,
                                 const int64_t *st, int dtype, lm_tensor **out) {
   if (!s) return lm_error(LM_ERR_ARG, "storage is nil");
   if (!lm_valid_dtype(dtype)) return lm_error(LM_ERR_DTYPE, "unknown dtype %d", dtype);
   LM_TRY(lm_check_sizes(nd, sz));
   if (nd > 0 && !st) return lm_error(LM_ERR_ARG, "strides are missing");
   if (offset < 0) return lm_error(LM_ERR_ARG, "negative storage offset %lld", (long long)offset);
   if (offset > LM_MAX_SPAN)
      return lm_error(LM_ERR_ARG, "storage offset %lld is out of range", (long long)offset);
   int64_t ext = extent_elems(nd, sz, st);
   if (ext < 0) return extent_error(ext, nd, st);
   int64_t esz = lm_dtype_size(dtype);
   /* offset, ext <= 2^60 and esz <= 8: no overflow */
   if (ext > 0 && (offset + ext) * esz > s->nbytes)
      return lm_error(LM_ERR_ARG,
                      "view of %lld elements at offset %lld is out of bounds for a storage of "
                      "%lld bytes",
                      (long long)ext, (long long)offset, (long long)s->nbytes);
   lm_tensor *t = lm_meta_alloc(sizeof *t);
   if (!t) return lm_error(LM_ERR_OOM, "out of memory");
   memset(t, 0, sizeof *t);
   t->storage = s;
   lm_storage_retain(s);
   t->offset = offset;
   t->ndim = nd;
   t->dtype = dtype;
   t->device = s->device;
   for (int d = 0; d < nd; d++) {
      t->sizes[d] = sz[d];
      t->strides[d] = st[d];
   }
   lm_tensor_refresh(t);
   *out = t;
   return LM_OK;
}

lm_status lm_empty_strided(int nd, const int64_t *sz, const int64_t *st, int dtype, int device,
                           lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (!lm_valid_dtype(dtype)) return lm_error(LM_ERR_DTYPE, "unknown dtype %d", dtype);
   if (!lm_backend_get(device)) return LM_ERR_DEVICE; /* its message names the device */
   LM_TRY(lm_check_sizes(nd, sz));
   if (nd > 0 && !st) return lm_error(LM_ERR_ARG, "strides are missing");
   int64_t ext = extent_elems(nd, sz, st);
   if (ext < 0) return extent_error(ext, nd, st);
   if (ext > ((int64_t)1 << 50)) return lm_error(LM_ERR_SHAPE, "tensor too large");
   lm_storage *s = lm_storage_new(ext * lm_dtype_size(dtype), device);
   if (!s) return LM_ERR_OOM;
   lm_status st2 = lm_tensor_from_storage(s, 0, nd, sz, st, dtype, out);
   lm_storage_release(s); /* the tensor holds the only reference now */
   return st2;
}

lm_status lm_empty(int nd, const int64_t *sz, int dtype, int fmt, int device, lm_tensor **out) {
   LM_TRY(lm_check_sizes(nd, sz));
   if (fmt == LM_PRESERVE)
      return lm_error(LM_ERR_FORMAT, "preserve_format is only valid for *_like and clone");
   int64_t st[LM_MAX_DIMS];
   LM_TRY(lm_compute_strides(nd, sz, fmt, st));
   return lm_empty_strided(nd, sz, st, dtype, device, out);
}

lm_status lm_empty_like(const lm_tensor *t, int dtype, int fmt, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (dtype < 0) dtype = t->dtype;
   if (fmt != LM_PRESERVE) return lm_empty(t->ndim, t->sizes, dtype, fmt, t->device, out);
   if (lm_is_non_overlapping_and_dense(t))
      return lm_empty_strided(t->ndim, t->sizes, t->strides, dtype, t->device, out);
   int64_t st[LM_MAX_DIMS];
   lm_infer_dense_strides(t->ndim, t->sizes, t->strides, st);
   return lm_empty_strided(t->ndim, t->sizes, st, dtype, t->device, out);
}

lm_status lm_clone(const lm_tensor *t, int fmt, int dtype, lm_tensor **out) {
   LM_CHECK_TENSOR(t, "input");
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (dtype >= 0 && !lm_valid_dtype(dtype)) return lm_error(LM_ERR_DTYPE, "unknown dtype %d", dtype);
   lm_tensor *r = NULL;
   LM_TRY(lm_empty_like(t, dtype, fmt, &r));
   lm_status st = lm_copy_(r, t);
   if (st != LM_OK) {
      lm_tensor_free(r);
      return st;
   }
   *out = r;
   return LM_OK;
}
