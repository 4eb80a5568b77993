/* device_check.h -- helpers of the spec/c programs that run an operator family on the CPU, on
 * sim:0 and on meta and compare (test_devices_nn.c, test_devices_pool.c): tensors kept until the
 * end of a case, random CPU inputs in every layout, copies to a device, and the comparison of a
 * device's result with the CPU's (sizes, strides, dtype; values bit for bit off meta). */
#ifndef LUMEN_SPEC_DEVICE_CHECK_H
#define LUMEN_SPEC_DEVICE_CHECK_H
#include <string.h>
#include "check.h"


/* a call on dev: LM_OK, else the program stops (meta included: its dense copies run too) */
static inline int dev_ok(lm_status st, int dev, const char *expr) {
   (void)dev;
   if (st == LM_OK) return 1;
   printf("FAIL [%s]: %s -> %d (%s)\n", g_case, expr, (int)st, lm_last_error());
   exit(2);
}
#define DEV(expr, dev) dev_ok((expr), (dev), #expr)

/* tensors to free at the end of a case */
enum { KEEP_MAX = 256 };
static lm_tensor *g_keep[KEEP_MAX];
static int g_nkeep;
static inline lm_tensor *keep(lm_tensor *t) {
   if (t) {
      if (g_nkeep == KEEP_MAX) {
         printf("keep: too many tensors\n");
         exit(2);
      }
      g_keep[g_nkeep++] = t;
   }
   return t;
}
static inline void free_kept(void) {
   while (g_nkeep > 0) lm_tensor_free(g_keep[--g_nkeep]);
}

enum { L_CONTIG, L_CL, L_STRIDED };

/* a CPU tensor of random values in [lo, hi): contiguous, channels-last (4-D / 5-D) or strided (a
   view of every other element of the last dim, at offset 1) */
static inline lm_tensor *cpu_rand(int nd, const int64_t *sz, int dt, int layout, double lo,
                                   double hi) {
   lm_tensor *t = NULL;
   if (layout == L_STRIDED && nd > 0) {
      int64_t big[LM_MAX_DIMS], st[LM_MAX_DIMS];
      memcpy(big, sz, sizeof(int64_t) * (size_t)nd);
      big[nd - 1] = 2 * sz[nd - 1] + 1;
      lm_tensor *b = NULL;
      OK(lm_empty(nd, big, dt, LM_CONTIGUOUS, LM_CPU, &b));
      keep(b);
      OK(lm_uniform_(b, lo, hi));
      memcpy(st, b->strides, sizeof(int64_t) * (size_t)nd);
      st[nd - 1] = 2;
      OK(lm_as_strided(b, nd, sz, st, 1, &t));
      return keep(t);
   }
   int fmt = LM_CONTIGUOUS;
   if (layout == L_CL) fmt = nd == 5 ? LM_CHANNELS_LAST_3D : LM_CHANNELS_LAST;
   OK(lm_empty(nd, sz, dt, fmt, LM_CPU, &t));
   keep(t);
   OK(lm_uniform_(t, lo, hi));
   return t;
}

/* the same tensor (sizes, strides, values) on dev; meta: no values */
static inline lm_tensor *to_dev(const lm_tensor *c, int dev) {
   if (!c) return NULL;
   lm_tensor *t = NULL;
   OK(lm_empty_strided(c->ndim, c->sizes, c->strides, c->dtype, dev, &t));
   keep(t);
   if (dev != LM_META) OK(lm_copy_(t, c));
   check(t->device == dev, "to_dev: device %d, wanted %d", t->device, dev);
   return t;
}

/* d (on dev) against the CPU's c: sizes, strides, dtype; on sim also the values, bit for bit */
static inline void same(const char *what, const lm_tensor *c, const lm_tensor *d, int dev) {
   if (!c || !d) {
      check(!c && !d, "%s: one result is missing (cpu %p, device %p)", what, (void *)c,
            (void *)d);
      return;
   }
   check(d->device == dev, "%s: on device %d, wanted %d", what, d->device, dev);
   check(d->dtype == c->dtype, "%s: dtype %d, cpu %d", what, d->dtype, c->dtype);
   int shape_ok = d->ndim == c->ndim;
   for (int i = 0; shape_ok && i < c->ndim; i++)
      shape_ok = d->sizes[i] == c->sizes[i] && (c->sizes[i] <= 1 || d->strides[i] == c->strides[i]);
   check(shape_ok, "%s: sizes or strides differ from the cpu's", what);
   if (!shape_ok || dev == LM_META) return;
   lm_tensor *h = NULL;
   OK(lm_empty_strided(d->ndim, d->sizes, d->strides, d->dtype, LM_CPU, &h));
   OK(lm_copy_(h, d));
   const size_t n = (size_t)c->numel + 1;
   double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
   OK(lm_to_doubles(c, a));
   OK(lm_to_doubles(h, b));
   check(memcmp(a, b, (size_t)c->numel * sizeof(double)) == 0, "%s: values differ from the cpu's",
         what);
   free(a);
   free(b);
   lm_tensor_free(h);
}

static inline void expect_device_error(lm_status st, const char *what) {
   check(st == LM_ERR_DEVICE, "%s: status %d, wanted LM_ERR_DEVICE", what, (int)st);
   check(strstr(lm_last_error(), "same device") != NULL, "%s: message '%s'", what,
         lm_last_error());

#endif
