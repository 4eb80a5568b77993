/* internal.h -- helpers shared by the C core and the kernels; not part of the FFI header. */
#ifndef LUMEN_INTERNAL_H
#define LUMEN_INTERNAL_H
#include "lumen.h"
#include <stdbool.h>
#include <string.h>
#include <stdio.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* LM_HD: the conversions below are also the CUDA backend's (kernels/cuda/cuda.cuh defines it as
   __host__ __device__ before including this header), so device and host round identically */
#ifndef LM_HD
#define LM_HD
#endif

/* _Alignas in a struct that the CUDA backend's C++ (kernels/cuda/) reads too */
#ifdef __cplusplus
#define LM_ALIGNAS(n) alignas(n)
#else
#define LM_ALIGNAS(n) _Alignas(n)
#endif

/* Set the per-thread error message (printf format) and return `status`. */
lm_status lm_error(lm_status status, const char *fmt, ...)
#if defined(__GNUC__)
   __attribute__((format(printf, 2, 3)))
#endif
   ;

/* return on failure: LM_TRY(lm_empty(...)); */
#define LM_TRY(expr)                                                                            \
   do {                                                                                         \
      lm_status lm_try_st_ = (expr);                                                            \
      if (lm_try_st_ != LM_OK) return lm_try_st_;                                               \
   } while (0)

#define LM_CHECK_TENSOR(t, name)                                                                \
   do {                                                                                         \
      if (!(t)) return lm_error(LM_ERR_ARG, "%s is nil", (name));                               \
   } while (0)

/* elements above which loops are split across OpenMP threads */
enum { LM_PARALLEL_GRAIN = 32768 };

/* Is t the whole of an allocator block (its own storage from lm_alloc, offset 0) that was cold
 * when handed out (alloc.c: its lines have left the caches)? A kernel that writes all of a fresh
 * result in such a block may use streaming stores, and then says so with
 * lm_tensor_note_streamed so the block counts as cold when next handed out. */
static inline int lm_tensor_block_cold(const lm_tensor *t) {
   const lm_storage *s = t ? t->storage : NULL;
   return s && s->deleter == NULL && s->device == LM_CPU && t->offset == 0 &&
          lm_mem_is_cold(s->data, (size_t)s->nbytes);
}

static inline void lm_tensor_note_streamed(const lm_tensor *t) {
   if (t && t->storage) lm_mem_note_streamed(t->storage->data, (size_t)t->storage->nbytes);
}

static inline bool lm_is_float_dtype(int dt) {
   return dt == LM_FLOAT32 || dt == LM_FLOAT64 || dt == LM_FLOAT16 || dt == LM_BFLOAT16;
}
static inline bool lm_valid_dtype(int dt) { return dt >= 0 && dt < LM_NUM_DTYPES; }

/* the taps [*t0, *t1) of window o (0 <= t < k) that land inside the input: 0 <= o * s - pad +
   t * d < I (pools and convolutions, d >= 1; an empty range when none does) */
static inline void lm_window_taps(int64_t I, int64_t k, int64_t s, int64_t pad, int64_t d,
                                  int64_t o, int64_t *t0, int64_t *t1) {
   const int64_t st = o * s - pad;
   const int64_t a = st >= 0 ? 0 : (-st + d - 1) / d;
   int64_t b = st > I - 1 ? 0 : (I - 1 - st) / d + 1;
   if (b > k) b = k;
   *t0 = a;
   *t1 = b > a ? b : a;
}

/* n float16 values to float32 and back, vectorizing (src/iter.c; bit-exact with lm_h2f / lm_f2h) */
void lm_f16_to_f32(const uint16_t *src, float *dst, int64_t n);
void lm_f32_to_f16(const float *src, uint16_t *dst, int64_t n);

/* float16 / bfloat16 conversions, inline for the kernels (round to nearest even) */
static inline LM_HD float lm_h2f(uint16_t h) {
   uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
   if (exp == 0) {
      if (man == 0) {
         bits = sign;
      } else { /* subnormal */
         exp = 127 - 15 + 1;
         while (!(man & 0x400)) { man <<= 1; exp--; }
         man &= 0x3ff;
         bits = sign | (exp << 23) | (man << 13);
      }
   } else if (exp == 31) {
      bits = sign | 0x7f800000u | (man << 13);
   } else {
      bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
   }
   float f;
   memcpy(&f, &bits, 4);
   return f;
}
static inline LM_HD uint16_t lm_f2h(float f) {
   uint32_t x;
   memcpy(&x, &f, 4);
   uint32_t sign = (x >> 16) & 0x8000;
   int32_t exp = (int32_t)((x >> 23) & 0xff);
   uint32_t man = x & 0x7fffff;
   if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
   int32_t e = exp - 127 + 15;
   if (e >= 31) return (uint16_t)(sign | 0x7c00);
   if (e <= 0) {
      if (e < -10) return (uint16_t)sign;
      man |= 0x800000;
      uint32_t shift = (uint32_t)(14 - e);
      uint32_t half = man >> shift;
      uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1))) half++;
      return (uint16_t)(sign | half);
   }
   uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
   uint32_t rem = man & 0x1fff;
   if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
   return (uint16_t)half;
}
static inline LM_HD float lm_bf2f(uint16_t h) {
   uint32_t bits = (uint32_t)h << 16;
   float f;
   memcpy(&f, &bits, 4);
   return f;
}
static inline LM_HD uint16_t lm_f2bf(float f) {
   uint32_t x;
   memcpy(&x, &f, 4);
   if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
   uint32_t lsb = (x >> 16) & 1;
   x += 0x7fff + lsb;
   return (uint16_t)(x >> 16);
}

/* double -> int64 without undefined behaviour: in range it truncates as a cast does; NaN and
 * values outside int64 give INT64_MIN, which is what x86's cvttsd2si (so PyTorch's cast) gives.
 * Narrower integer dtypes then wrap from the int64, as PyTorch casts a Scalar: int32 + 2^40
 * adds 0, not INT_MIN. */
static inline LM_HD int64_t lm_double_to_i64(double v) {
   return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}

/* read / write one element of any dtype as double */
static inline LM_HD double lm_load_as_double(const void *p, int dt) {
   switch (dt) {
   case LM_FLOAT32: return *(const float *)p;
   case LM_FLOAT64: return *(const double *)p;
   case LM_FLOAT16: return lm_h2f(*(const uint16_t *)p);
   case LM_BFLOAT16: return lm_bf2f(*(const uint16_t *)p);
   case LM_INT64: return (double)*(const int64_t *)p;
   case LM_INT32: return *(const int32_t *)p;
   case LM_UINT8: return *(const uint8_t *)p;
   case LM_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
   default: return 0.0;
   }
}
static inline LM_HD void lm_store_from_double(void *p, int dt, double v) {
   switch (dt) {
   case LM_FLOAT32: *(float *)p = (float)v; break;
   case LM_FLOAT64: *(double *)p = v; break;
   case LM_FLOAT16: *(uint16_t *)p = lm_f2h((float)v); break;
   case LM_BFLOAT16: *(uint16_t *)p = lm_f2bf((float)v); break;
   case LM_INT64: *(int64_t *)p = lm_double_to_i64(v); break;
   case LM_INT32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)lm_double_to_i64(v); break;
   case LM_UINT8: *(uint8_t *)p = (uint8_t)(uint64_t)lm_double_to_i64(v); break;
   case LM_BOOL: *(uint8_t *)p = v != 0.0; break;
   default: break;
   }
}

/* devices: src/backend.h (lm_backend, lm_dispatch, lm_check_same_device, lm_check_host) */

/* shape helpers (src/tensor.c) */
/* sizes and strides of every tensor stay <= LM_MAX_SPAN elements (tensor.c: lm_check_sizes) */
#define LM_MAX_SPAN ((int64_t)1 << 60)
lm_status lm_check_sizes(int ndim, const int64_t *sizes);
/* "{2, 3, 4}" into buf (cap bytes), for messages; returns buf */
const char *lm_format_sizes(char *buf, size_t cap, int nd, const int64_t *sz);
/* "[2, 3, 4]" into buf (cap bytes): PyTorch's way of naming a shape in a message */
static inline void lm_format_shape(char *buf, size_t cap, int nd, const int64_t *sz) {
   size_t n = (size_t)snprintf(buf, cap, "[");
   for (int d = 0; d < nd && n < cap; d++)
      n += (size_t)snprintf(buf + n, cap - n, d ? ", %lld" : "%lld", (long long)sz[d]);
   if (n < cap) snprintf(buf + n, cap - n, "]");
}
int64_t lm_numel_of(int ndim, const int64_t *sizes);
/* broadcast two shapes; returns LM_ERR_SHAPE with a message on mismatch */
lm_status lm_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                              int64_t *out);
/* normalise a 0-based dim (negative counts from the end) against ndim; error if out of range */
lm_status lm_wrap_dim(int *dim, int ndim);

/* open a user-given file read-only if it is a regular file, without blocking on a FIFO (io.c);
   *fd and the file's size on success */
lm_status lm_open_regular(const char *path, int *fd, int64_t *size);

/* tensor / storage structs: cached LIFO lists in alloc.c, not counted as tensor memory */
void *lm_meta_alloc(size_t nbytes);
void lm_meta_free(void *p, size_t nbytes);

#endif
