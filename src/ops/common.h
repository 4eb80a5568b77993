/* common.h -- what the operator front ends (src/ops/) share: argument checks, and the result
 * slot that is either a fresh tensor on the input's device or the caller's out= tensor. Front
 * ends never read or write tensor memory; they allocate, describe the call in an lm_op and hand
 * it to lm_dispatch (src/backend.h). */
#ifndef LUMEN_OPS_COMMON_H
#define LUMEN_OPS_COMMON_H
#include "backend.h"
#include <stdio.h>

/* a floating tensor: float32, float64, or one of the halves (float16, bfloat16), which the
   operators of src/ops/ compute in float32 and round once into the input's dtype */
static inline lm_status check_float(const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   if (t->dtype != LM_FLOAT32 && t->dtype != LM_FLOAT64 && t->dtype != LM_FLOAT16 &&
       t->dtype != LM_BFLOAT16)
      return lm_error(LM_ERR_DTYPE,
                      "expected %s to be a floating tensor (float32, float64, float16 or "
                      "bfloat16), got %s",
                      what, lm_dtype_name(t->dtype));
   return LM_OK;
}

static inline int is_half(int dt) { return dt == LM_FLOAT16 || dt == LM_BFLOAT16; }

/* an optional tensor argument that must be on `dev`'s device */
static inline lm_status check_device(const lm_tensor *dev, const lm_tensor *t, const char *what) {
   return lm_check_same_device(dev, t, what);
}

/* a result tensor: a fresh one (on `device`), the caller's out= tensor, or a temporary in the
   layout the kernel needs, copied into the out= tensor at the end */
typedef struct {
   lm_tensor *t;
   lm_tensor *user;
   int tmp;
} out_slot;

static inline lm_status out_open(out_slot *o, lm_tensor **user, int ndim, const int64_t *sizes,
                                 int dtype, int fmt, int device, const char *what) {
   o->t = NULL;
   o->user = *user;
   o->tmp = 0;
   if (o->user) {
      lm_tensor *u = o->user;
      if (u->device != device) {
         char a[24], b[24];
         return lm_error(LM_ERR_DEVICE, "%s: the out tensor is on %s, the input on %s", what,
                         lm_device_name(u->device, a, sizeof a), lm_device_name(device, b, sizeof b));
      }
      if (u->ndim != ndim || memcmp(u->sizes, sizes, (size_t)ndim * sizeof(int64_t)) != 0) {
         char a[160], b[160];
         lm_format_shape(a, sizeof a, ndim, sizes);
         lm_format_shape(b, sizeof b, u->ndim, u->sizes);
         return lm_error(LM_ERR_SHAPE, "%s: expected an out tensor of shape %s, got %s", what, a,
                         b);
      }
      if (dtype == LM_INT64 ? u->dtype != LM_INT64 : !lm_is_float_dtype(u->dtype))
         return lm_error(LM_ERR_DTYPE, "%s: out tensor of dtype %s cannot hold %s", what,
                         lm_dtype_name(u->dtype), lm_dtype_name(dtype));
      if (u->dtype == dtype && lm_is_contiguous(u, fmt)) {
         o->t = u;
         return LM_OK;
      }
      o->tmp = 1;
   }
   return lm_empty(ndim, sizes, dtype, fmt, device, &o->t);
}

/* on success hand the result over; on failure free what was allocated here */
static inline lm_status out_close(out_slot *o, lm_tensor **user, lm_status st) {
   if (!user || !o->t) return st;
   if (st == LM_OK) {
      if (!o->user) {
         *user = o->t;
      } else if (o->tmp) {
         st = lm_copy_(o->user, o->t);
         lm_tensor_free(o->t);
      }
   } else if (o->t != o->user) {
      lm_tensor_free(o->t);
   }
   o->t = NULL;
   return st;
}

/* x itself if it is dense in fmt, else a copy in fmt (*tmp, freed by the caller) on x's device */
static inline lm_status dense_in_format(const lm_tensor *x, int fmt, const lm_tensor **xd,
                                        lm_tensor **tmp) {
   *tmp = NULL;
   *xd = x;
   if (!lm_is_contiguous(x, fmt)) {
      LM_TRY(lm_clone(x, fmt, -1, tmp));
      *xd = *tmp;
   }
   return LM_OK;
}

/* the half-precision route of a kernel without a half kernel: the operand x (dense or not)
   widened once to a float32 copy dense in fmt (*tmp, freed by the caller) on x's device; any
   other dtype as dense_in_format. NULL x: *xd = NULL. */
static inline lm_status dense_float_in_format(const lm_tensor *x, int fmt, const lm_tensor **xd,
                                              lm_tensor **tmp) {
   *tmp = NULL;
   *xd = x;
   if (!x) return LM_OK;
   if (!is_half(x->dtype)) return dense_in_format(x, fmt, xd, tmp);
   LM_TRY(lm_clone(x, fmt, LM_FLOAT32, tmp));
   *xd = *tmp;
   return LM_OK;
}

/* a result r (dense in fmt) of a half dtype computed by a float32 kernel: *r32 is r itself for
   other dtypes, else a fresh float32 tensor of r's shape in fmt on r's device (*tmp), whose
   values half_close rounds once into r */
static inline lm_status half_open(lm_tensor *r, int fmt, lm_tensor **r32, lm_tensor **tmp) {
   *tmp = NULL;
   *r32 = r;
   if (!r || !is_half(r->dtype)) return LM_OK;
   LM_TRY(lm_empty(r->ndim, r->sizes, LM_FLOAT32, fmt, r->device, tmp));
   *r32 = *tmp;
   return LM_OK;
}

static inline lm_status half_close(lm_tensor *r, lm_tensor *tmp, lm_status st) {
   if (tmp && st == LM_OK) st = lm_copy_(r, tmp);
   lm_tensor_free(tmp);
   return st;
}

#endif
