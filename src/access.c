/* access.c -- single elements and bulk transfers to and from doubles, in logical order. Tensors on
 * another device go through a host copy of the storage range they span. */
#include "iter.h"
#include "backend.h"
#include <math.h>

static lm_status element_offset(const lm_tensor *t, const int64_t *idx, int64_t *off) {
   if (t->ndim > 0 && !idx) return lm_error(LM_ERR_ARG, "indices are missing");
   int64_t o = 0;
   for (int d = 0; d < t->ndim; d++) {
      if (idx[d] < 0 || idx[d] >= t->sizes[d])
         return lm_error(LM_ERR_ARG, "index %lld is out of bounds for dimension %d with size %lld",
                         (long long)idx[d], d, (long long)t->sizes[d]);
      o += idx[d] * t->strides[d];
   }
   *off = o;
   return LM_OK;
}

/* A NaN carrying a payload (float64 bits 0xFFFA000000000000, or a float16 0xff6d widened) is a
 * tagged value to LuaJIT 2.1 when it reads the double back from FFI memory, and crashes it.
 * Every double handed to Lua goes out as C's quiet NaN (0x7FF8...), which LuaJIT reads as a
 * number; tensor.lua checks the bits too, for reads that do not come through here. */
static inline double canonical(double v) { return v != v ? (double)NAN : v; }

/* a meta tensor has sizes and strides but no values to read or write */
static lm_status check_data(const lm_tensor *t) {
   if (t->device == LM_META) return lm_error(LM_ERR_DEVICE, "meta tensors have no data");
   return LM_OK;
}

lm_status lm_get(const lm_tensor *t, const int64_t *idx, double *value) {
   LM_CHECK_TENSOR(t, "tensor");
   LM_TRY(check_data(t));
   if (!value) return lm_error(LM_ERR_ARG, "value pointer is NULL");
   int64_t off = 0;
   LM_TRY(element_offset(t, idx, &off));
   const char *p = (const char *)lm_tensor_data(t) + off * lm_dtype_size(t->dtype);
   if (t->device == LM_CPU) {
      *value = canonical(lm_load_as_double(p, t->dtype));
      return LM_OK;
   }
   const lm_backend *ops = lm_backend_get(t->device);
   if (!ops) return LM_ERR_DEVICE;
   _Alignas(8) char b[8];
   LM_TRY(ops->memcpy(ops, b, p, (size_t)lm_dtype_size(t->dtype), 1));
   *value = canonical(lm_load_as_double(b, t->dtype));
   return LM_OK;
}

lm_status lm_set(lm_tensor *t, const int64_t *idx, double value) {
   LM_CHECK_TENSOR(t, "tensor");
   LM_TRY(check_data(t));
   int64_t off = 0;
   LM_TRY(element_offset(t, idx, &off));
   char *p = (char *)lm_tensor_data(t) + off * lm_dtype_size(t->dtype);
   if (t->device == LM_CPU) {
      lm_store_from_double(p, t->dtype, value);
      return LM_OK;
   }
   const lm_backend *ops = lm_backend_get(t->device);
   if (!ops) return LM_ERR_DEVICE;
   _Alignas(8) char b[8];
   lm_store_from_double(b, t->dtype, value);
   return ops->memcpy(ops, p, b, (size_t)lm_dtype_size(t->dtype), 0);
}

static void dense_operand(lm_operand *op, void *buf, const lm_tensor *t) {
   int64_t st[LM_MAX_DIMS];
   lm_compute_strides(t->ndim, t->sizes, LM_CONTIGUOUS, st);
   lm_operand_set(op, buf, LM_FLOAT64, t->ndim, t->sizes, st);
}

lm_status lm_to_doubles(const lm_tensor *t, double *buf) {
   LM_CHECK_TENSOR(t, "tensor");
   LM_TRY(check_data(t));
   if (t->numel == 0) return LM_OK;
   if (!buf) return lm_error(LM_ERR_ARG, "buffer is NULL");
   lm_host_mirror m;
   LM_TRY(lm_mirror_begin(t, 1, &m));
   lm_operand d;
   dense_operand(&d, buf, t);
   lm_status st = lm_copy_operands(&d, &m.op);
   lm_mirror_end(&m, 0);
   for (int64_t i = 0; st == LM_OK && i < t->numel; i++) buf[i] = canonical(buf[i]);
   return st;
}

lm_status lm_from_doubles(lm_tensor *t, const double *buf) {
   LM_CHECK_TENSOR(t, "tensor");
   LM_TRY(check_data(t));
   if (t->numel == 0) return LM_OK;
   if (!buf) return lm_error(LM_ERR_ARG, "buffer is NULL");
   lm_host_mirror m;
   LM_TRY(lm_mirror_begin(t, !(t->flags & LM_FLAG_NOD), &m));
   lm_operand s;
   dense_operand(&s, (void *)buf, t);
   lm_status st = lm_copy_operands(&m.op, &s);
   lm_status st2 = lm_mirror_end(&m, st == LM_OK);
   return st != LM_OK ? st : st2;
}
