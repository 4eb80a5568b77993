/* nn_common.h -- small helpers shared by the nn kernels (pool.c, norm.c, softmax.c, loss.c):
 * argument checks and the handling of a result tensor that may be the caller's out= tensor. */
#ifndef LUMEN_NN_COMMON_H
#define LUMEN_NN_COMMON_H
#include "internal.h"
#include <stdio.h>

static inline void fmt_sizes(char *buf, size_t n, int ndim, const int64_t *sizes) {
   size_t k = (size_t)snprintf(buf, n, "[");
   for (int i = 0; i < ndim && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)sizes[i]);
   if (k < n) snprintf(buf + k, n - k, "]");
}

static inline lm_status check_float(const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   LM_TRY(lm_check_cpu(t, what));
   if (t->dtype != LM_FLOAT32 && t->dtype != LM_FLOAT64)
      return lm_error(LM_ERR_DTYPE, "expected %s to be float32 or float64, got %s", what,
                      lm_dtype_name(t->dtype));
   return LM_OK;
}

/* a result tensor: a fresh one, the caller's out= tensor, or a temporary copied into it */
typedef struct {
   lm_tensor *t;
   lm_tensor *user;
   int tmp;
} out_slot;

static inline lm_status out_open(out_slot *o, lm_tensor **user, int ndim, const int64_t *sizes,
                          int dtype, int fmt, const char *what) {
   o->t = NULL;
   o->user = *user;
   o->tmp = 0;
   if (o->user) {
      lm_tensor *u = o->user;
      LM_TRY(lm_check_cpu(u, what));
      if (u->ndim != ndim || memcmp(u->sizes, sizes, (size_t)ndim * sizeof(int64_t)) != 0) {
         char a[160], b[160];
         fmt_sizes(a, sizeof a, ndim, sizes);
         fmt_sizes(b, sizeof b, u->ndim, u->sizes);
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
   return lm_empty(ndim, sizes, dtype, fmt, LM_CPU, &o->t);
}

/* is the result a block allocated here (not the caller's out= tensor) of 1 MiB or more that was
   cold when handed out (lm_tensor_block_cold)? A kernel that writes all of it may then use
   streaming stores, and tells the allocator so with out_note_streamed */
static inline int out_cold(const out_slot *o) {
   const lm_tensor *t = o->t;
   return t && t != o->user && t->storage && t->storage->nbytes >= ((int64_t)1 << 20) &&
          lm_tensor_block_cold(t);
}

static inline void out_note_streamed(const out_slot *o) { lm_tensor_note_streamed(o->t); }

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

#endif
