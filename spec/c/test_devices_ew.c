/* test_devices_ew.c -- the elementwise family (and reductions, cat, random fills, optimizer
 * steps, copy_/fill_ and element access) off the CPU: every case runs on the CPU, on sim:0 (the
 * inputs copied there with lm_copy_, the results copied back) and on meta (inputs made with
 * lm_empty_strided, no values). sim must give the CPU's values bit for bit and the CPU's sizes,
 * strides and dtypes; meta must return LM_OK with the CPU's sizes, strides and dtypes. Also the
 * device rules: mixing devices, copy_ into / out of meta, access to meta tensors.
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lumen.h"
#include "nn.h"

static int g_pass, g_fail;

static void check(int ok, const char *fmt, ...) {
   if (ok) {
      g_pass++;
      return;
   }
   g_fail++;
   va_list ap;
   va_start(ap, fmt);
   printf("FAIL: ");
   vprintf(fmt, ap);
   printf("\n");
   va_end(ap);
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double rnd(void) { /* [-1, 1) */
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

#define OK(call)                                                                                 \
   do {                                                                                          \
      lm_status st_ = (call);                                                                    \
      if (st_ != LM_OK) {                                                                        \
         printf("FAIL: %s: %s\n", #call, lm_last_error());                                       \
         exit(1);                                                                                \
      }                                                                                          \
   } while (0)

/* a CPU tensor of random values (scaled; ints in [-5, 5]) in format fmt */
static lm_tensor *mk(int nd, const int64_t *sz, int dtype, int fmt, double scale) {
   lm_tensor *t = NULL;
   OK(lm_empty(nd, sz, dtype, fmt, LM_CPU, &t));
   double *b = malloc(sizeof(double) * (size_t)(t->numel + 1));
   for (int64_t i = 0; i < t->numel; i++) {
      double v = rnd() * scale;
      b[i] = dtype == LM_FLOAT32 || dtype == LM_FLOAT64 ? v : dtype == LM_BOOL ? (v > 0) : (double)(int)(v * 5);
   }
   OK(lm_from_doubles(t, b));
   free(b);
   return t;
}

static lm_tensor *transposed(lm_tensor *t, int d0, int d1) {
   lm_tensor *v = NULL;
   OK(lm_transpose(t, d0, d1, &v));
   lm_tensor_free(t);
   return v;
}

/* t's layout on device dev, with t's values (a meta copy: lm_copy_ into meta is a no-op) */
static lm_tensor *to_dev(const lm_tensor *t, int dev) {
   lm_tensor *d = NULL;
   OK(lm_empty_strided(t->ndim, t->sizes, t->strides, t->dtype, dev, &d));
   OK(lm_copy_(d, t));
   return d;
}

/* the values of t (any device but meta) as doubles, logical order; through a CPU copy */
static double *values(const lm_tensor *t) {
   lm_tensor *c = NULL;
   OK(lm_empty_strided(t->ndim, t->sizes, t->strides, t->dtype, LM_CPU, &c));
   OK(lm_copy_(c, t));
   double *b = malloc(sizeof(double) * (size_t)(c->numel + 1));
   OK(lm_to_doubles(c, b));
   lm_tensor_free(c);
   return b;
}

static void compare(const char *name, const char *dev, const lm_tensor *c, const lm_tensor *d) {
   int same = c->ndim == d->ndim && c->dtype == d->dtype;
   for (int i = 0; same && i < c->ndim; i++)
      same = c->sizes[i] == d->sizes[i] && (c->sizes[i] <= 1 || c->strides[i] == d->strides[i]);
   check(same, "%s on %s: sizes/strides/dtype differ from the CPU's", name, dev);
   if (!same || d->device == LM_META) return;
   double *a = values(c), *b = values(d);
   check(memcmp(a, b, sizeof(double) * (size_t)c->numel) == 0, "%s on %s: values differ", name,
         dev);
   free(a);
   free(b);
}

/* an op: reads in[0..nin), writes out[0..nout) (new tensors, or in[k] itself when in place) */
typedef lm_status (*opfn)(lm_tensor **in, lm_tensor **out);

enum { MAXT = 6 };

static void run_case(const char *name, int nin, lm_tensor **cin, int nout, opfn f) {
   lm_tensor *cout[MAXT] = {0};
   /* the CPU reference on copies, so that in-place ops see the same inputs everywhere */
   lm_tensor *ccopy[MAXT] = {0};
   for (int i = 0; i < nin; i++) ccopy[i] = to_dev(cin[i], LM_CPU);
   lm_status st = f(ccopy, cout);
   check(st == LM_OK, "%s on cpu: %s", name, st == LM_OK ? "" : lm_last_error());
   if (st != LM_OK) return;
   const int devs[2] = {LM_SIM0, LM_META};
   for (int k = 0; k < 2; k++) {
      const char *dn = devs[k] == LM_META ? "meta" : "sim:0";
      lm_tensor *din[MAXT] = {0}, *dout[MAXT] = {0};
      for (int i = 0; i < nin; i++) din[i] = to_dev(cin[i], devs[k]);
      st = f(din, dout);
      check(st == LM_OK, "%s on %s: %s", name, dn, st == LM_OK ? "" : lm_last_error());
      for (int j = 0; st == LM_OK && j < nout; j++) {
         check(dout[j] && dout[j]->device == devs[k], "%s on %s: output %d on the wrong device",
               name, dn, j);
         if (dout[j]) compare(name, dn, cout[j], dout[j]);
      }
      for (int j = 0; j < nout; j++) {
         int owned = 1;
         for (int i = 0; i < nin; i++) owned &= dout[j] != din[i];
         if (owned) lm_tensor_free(dout[j]);
      }
      for (int i = 0; i < nin; i++) lm_tensor_free(din[i]);
   }
   for (int j = 0; j < nout; j++) {
      int owned = 1;
      for (int i = 0; i < nin; i++) owned &= cout[j] != ccopy[i];
      if (owned) lm_tensor_free(cout[j]);
   }
   for (int i = 0; i < nin; i++) lm_tensor_free(ccopy[i]);
}

/* ---- the ops ---------------------------------------------------------------------------- */

static int g_uop, g_bop;
static lm_status f_unary(lm_tensor **in, lm_tensor **out) { return lm_unary(g_uop, in[0], &out[0]); }
static lm_status f_binary(lm_tensor **in, lm_tensor **out) {
   return lm_binary(g_bop, in[0], in[1], 1.0, &out[0]);
}
static lm_status f_binary_alpha(lm_tensor **in, lm_tensor **out) {
   return lm_binary(LM_SUB, in[0], in[1], 0.5, &out[0]);
}
/* into an out= tensor of in[2]'s layout */
static lm_status f_binary_out(lm_tensor **in, lm_tensor **out) {
   lm_tensor *o = NULL;
   lm_status st = lm_empty_strided(in[2]->ndim, in[2]->sizes, in[2]->strides, in[2]->dtype,
                                   in[2]->device, &o);
   if (st != LM_OK) return st;
   st = lm_copy_(o, in[2]);
   if (st == LM_OK) st = lm_binary(LM_MUL, in[0], in[1], 1.0, &o);
   out[0] = o;
   return st;
}
static double g_s;
static int g_rev;
static lm_status f_scalar(lm_tensor **in, lm_tensor **out) {
   return lm_binary_scalar(g_bop, in[0], g_s, 0, g_rev, 1.0, &out[0]);
}
static lm_status f_binary_unary(lm_tensor **in, lm_tensor **out) {
   return lm_binary_unary(LM_ADD, in[0], in[1], 1.0, LM_RELU, &out[0]);
}
static lm_status f_scalar_unary(lm_tensor **in, lm_tensor **out) {
   return lm_binary_scalar_unary(LM_MUL, in[0], 3.0, 1, 0, 1.0, LM_TANH, &out[0]);
}
static lm_status f_clamp(lm_tensor **in, lm_tensor **out) {
   return lm_clamp(in[0], -0.3, 0.4, 1, 1, &out[0]);
}
static lm_status f_clamp_min(lm_tensor **in, lm_tensor **out) {
   return lm_clamp(in[0], -0.3, 0, 1, 0, &out[0]);
}
static lm_status f_where(lm_tensor **in, lm_tensor **out) {
   lm_tensor *c = NULL;
   lm_status st = lm_binary_scalar(LM_GT, in[0], 0.0, 0, 0, 1.0, &c);
   if (st == LM_OK) st = lm_where(c, in[0], in[1], &out[0]);
   lm_tensor_free(c);
   return st;
}
static lm_status f_addcmul(lm_tensor **in, lm_tensor **out) {
   return lm_addcmul(in[0], in[1], in[2], 0.7, &out[0]);
}
static lm_status f_addcdiv(lm_tensor **in, lm_tensor **out) {
   return lm_addcdiv(in[0], in[1], in[2], -1.5, &out[0]);
}
/* copy_ into a tensor of in[1]'s layout and dtype */
static lm_status f_copy(lm_tensor **in, lm_tensor **out) {
   lm_status st = lm_copy_(in[1], in[0]);
   out[0] = in[1];
   return st;
}
static lm_status f_fill(lm_tensor **in, lm_tensor **out) {
   lm_status st = lm_fill_(in[0], -2.25);
   out[0] = in[0];
   return st;
}
static int g_rop, g_keep, g_dims[4], g_nd;
static lm_status f_reduce(lm_tensor **in, lm_tensor **out) {
   return lm_reduce(g_rop, in[0], g_dims, g_nd, g_keep, -1, &out[0], NULL);
}
static lm_status f_reduce_idx(lm_tensor **in, lm_tensor **out) {
   return lm_reduce(g_rop, in[0], g_dims, g_nd, g_keep, -1, &out[0], &out[1]);
}
static int g_cat_dim;
static lm_status f_cat(lm_tensor **in, lm_tensor **out) {
   return lm_cat(3, (const lm_tensor *const *)in, g_cat_dim, &out[0]);
}
static lm_status f_random(lm_tensor **in, lm_tensor **out) {
   lm_manual_seed(1234);
   lm_status st = lm_uniform_(in[0], -1, 2);
   if (st == LM_OK) st = lm_normal_(in[1], 0.5, 2);
   if (st == LM_OK) st = lm_randint_(in[2], -3, 9);
   if (st == LM_OK) st = lm_bernoulli_(in[3], 0.3);
   for (int i = 0; i < 4; i++) out[i] = in[i];
   /* randperm into an out= tensor on in[0]'s device */
   lm_tensor *p = NULL;
   int64_t n = 37;
   if (st == LM_OK) st = lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, in[0]->device, &p);
   if (st == LM_OK) st = lm_randperm(n, &p);
   out[4] = p;
   return st;
}
static int g_flag;
static lm_status f_sgd(lm_tensor **in, lm_tensor **out) {
   lm_status st = lm_sgd_step(in[0], in[1], in[2], 0.1, 0.9, 0.1, 0.01, g_flag, 0, 0);
   out[0] = in[0];
   out[1] = in[2];
   return st;
}
static lm_status f_adam(lm_tensor **in, lm_tensor **out) {
   lm_status st = lm_adam_step(in[0], in[1], in[2], in[3], g_flag ? in[4] : NULL, 1e-2, 0.9,
                               0.999, 1e-8, 0.01, g_flag, 0, 3);
   for (int i = 0; i < 5; i++) out[i] = in[i];
   return st;
}

static void free_all(lm_tensor **t, int n) {
   for (int i = 0; i < n; i++) lm_tensor_free(t[i]);
}

/* ---- the device rules -------------------------------------------------------------------- */

static void device_rules(void) {
   const int64_t sz[2] = {3, 4};
   lm_tensor *c = mk(2, sz, LM_FLOAT32, LM_CONTIGUOUS, 1), *s = to_dev(c, LM_SIM0), *m = NULL,
             *s1 = NULL, *o = NULL;
   OK(lm_empty(2, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_META, &m));
   /* mixing devices */
   lm_status st = lm_binary(LM_ADD, c, s, 1.0, &o);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"),
         "cpu + sim:0: LM_ERR_DEVICE 'same device', got %d '%s'", st, lm_last_error());
   check(o == NULL, "cpu + sim:0: no output");
   st = lm_where(s, c, c, &o);
   check(st == LM_ERR_DEVICE || st == LM_ERR_DTYPE, "where with mixed devices refused");
   lm_tensor *three[3] = {c, s, c};
   st = lm_cat(3, (const lm_tensor *const *)three, 0, &o);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "cat mixed devices: %s",
         lm_last_error());
   int dim0 = 0;
   lm_tensor *so = NULL;
   OK(lm_empty(1, &sz[1], LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &so));
   st = lm_reduce(LM_SUM, c, &dim0, 1, 0, -1, &so, NULL);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "sum out= on sim: %s",
         lm_last_error());
   lm_tensor_free(so);
   st = lm_sgd_step(s, c, NULL, 0.1, 0, 0, 0, 0, 0, 0);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "sgd mixed: %s",
         lm_last_error());
   /* copy_ across devices: cpu -> sim:1 (transposed layout, other dtype) -> sim:0 -> cpu */
   lm_tensor *ct = NULL, *s1d = NULL;
   OK(lm_transpose(c, 0, 1, &ct));
   const int64_t szt[2] = {4, 3};
   OK(lm_empty(2, szt, LM_FLOAT64, LM_CONTIGUOUS, LM_SIM0 + 1, &s1d));
   OK(lm_copy_(s1d, ct));
   OK(lm_empty(2, szt, LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &s1));
   OK(lm_copy_(s1, s1d)); /* sim:1 -> sim:0, float64 -> float32 */
   lm_tensor *s1t = NULL;
   OK(lm_transpose(s1d, 0, 1, &s1t)); /* sim:1 view [3, 4] */
   lm_tensor *back = NULL;
   OK(lm_empty(2, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &back));
   OK(lm_copy_(back, s1t));
   double *a = values(c), *b = values(back);
   check(memcmp(a, b, sizeof(double) * 12) == 0, "cpu -> sim:1 (float64, transposed) -> cpu");
   free(a);
   free(b);
   lm_tensor_free(s1);
   lm_tensor_free(s1t);
   lm_tensor_free(s1d);
   lm_tensor_free(ct);
   lm_tensor_free(back);
   /* meta: copying in is a no-op success (after the shape check); copying out is an error */
   check(lm_copy_(m, c) == LM_OK, "copy_ cpu -> meta is a no-op");
   check(lm_copy_(m, s) == LM_OK, "copy_ sim -> meta is a no-op");
   const int64_t bad[2] = {5, 4};
   lm_tensor *mb = NULL;
   OK(lm_empty(2, bad, LM_FLOAT32, LM_CONTIGUOUS, LM_META, &mb));
   st = lm_copy_(mb, c);
   check(st == LM_ERR_SHAPE, "copy_ into meta checks shapes (got %d)", st);
   lm_tensor_free(mb);
   st = lm_copy_(c, m);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "cannot copy out of a meta tensor"),
         "copy_ meta -> cpu: %s", lm_last_error());
   st = lm_copy_(s, m);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "cannot copy out of a meta tensor"),
         "copy_ meta -> sim: %s", lm_last_error());
   /* element access */
   int64_t idx[2] = {1, 2};
   double v = 0, w = 0;
   st = lm_get(m, idx, &v);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "meta tensors have no data"), "get meta");
   check(lm_set(m, idx, 1.0) == LM_ERR_DEVICE, "set meta");
   double buf[12] = {0};
   check(lm_to_doubles(m, buf) == LM_ERR_DEVICE, "to_doubles meta");
   check(lm_from_doubles(m, buf) == LM_ERR_DEVICE, "from_doubles meta");
   OK(lm_get(c, idx, &v));
   OK(lm_get(s, idx, &w));
   check(v == w, "get on sim");
   OK(lm_set(s, idx, 7.5));
   OK(lm_get(s, idx, &w));
   check(w == 7.5, "set on sim");
   /* randperm on meta: allocates, computes nothing */
   int64_t n = 5;
   lm_tensor *mp = NULL;
   OK(lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, LM_META, &mp));
   check(lm_randperm(n, &mp) == LM_OK, "randperm into meta");
   lm_tensor_free(mp);
   /* meta consumes no random numbers */
   uint64_t s0, o0, s1_, o1;
   lm_rng_get_state(&s0, &o0);
   OK(lm_uniform_(m, 0, 1));
   lm_rng_get_state(&s1_, &o1);
   check(o0 == o1, "uniform_ on meta leaves the generator alone");
   lm_tensor_free(c);
   lm_tensor_free(s);
   lm_tensor_free(m);
}

int main(void) {
   const int dts[2] = {LM_FLOAT32, LM_FLOAT64};
   const int64_t s4[4] = {2, 3, 4, 5}, big[4] = {2, 8, 16, 16}, bc[4] = {3, 1, 1},
                 s4t[4] = {2, 3, 5, 4};
   char name[128];
   for (int di = 0; di < 2; di++) {
      const int dt = dts[di];
      const char *dn = dt == LM_FLOAT32 ? "f32" : "f64";
      /* unary: contiguous, channels-last, transposed (strided) */
      const int uops[4] = {LM_EXP, LM_NEG, LM_RELU, LM_SIGMOID};
      for (int u = 0; u < 4; u++)
         for (int f = 0; f < 3; f++) {
            lm_tensor *in[1] = {f == 2 ? transposed(mk(4, s4t, dt, LM_CONTIGUOUS, 2), 2, 3)
                                       : mk(4, s4, dt, f ? LM_CHANNELS_LAST : LM_CONTIGUOUS, 2)};
            g_uop = uops[u];
            snprintf(name, sizeof name, "unary %d %s fmt %d", uops[u], dn, f);
            run_case(name, 1, in, 1, f_unary);
            free_all(in, 1);
         }
      /* binary with broadcasting: channels-last + contiguous (small and large), + [3,1,1] */
      const int bops[5] = {LM_ADD, LM_MUL, LM_DIV, LM_MAXIMUM, LM_LT};
      for (int o = 0; o < 5; o++)
         for (int c = 0; c < 4; c++) {
            const int64_t *sa = c >= 2 ? big : s4;
            lm_tensor *in[2] = {mk(4, sa, dt, LM_CHANNELS_LAST, 2),
                                c == 1 ? mk(3, bc, dt, LM_CONTIGUOUS, 2)
                                       : mk(4, sa, c == 3 ? LM_FLOAT64 : dt, LM_CONTIGUOUS, 2)};
            g_bop = bops[o];
            snprintf(name, sizeof name, "binary %d %s case %d", bops[o], dn, c);
            run_case(name, 2, in, 1, f_binary);
            free_all(in, 2);
         }
      {
         lm_tensor *in[2] = {mk(4, s4, dt, LM_CHANNELS_LAST, 1), mk(4, s4, dt, LM_CHANNELS_LAST, 1)};
         snprintf(name, sizeof name, "sub alpha %s (small path)", dn);
         run_case(name, 2, in, 1, f_binary_alpha);
         free_all(in, 2);
      }
      {
         lm_tensor *in[3] = {mk(4, s4, dt, LM_CHANNELS_LAST, 1), mk(3, bc, dt, LM_CONTIGUOUS, 1),
                             mk(4, s4, LM_FLOAT64, LM_CHANNELS_LAST, 1)};
         snprintf(name, sizeof name, "mul out= %s", dn);
         run_case(name, 3, in, 1, f_binary_out);
         free_all(in, 3);
      }
      /* scalar variants, pow special cases, fused */
      const int sops[4] = {LM_ADD, LM_SUB, LM_POW, LM_POW};
      const double svals[4] = {1.5, 2.0, 2.0, 1.7};
      for (int o = 0; o < 4; o++)
         for (int rev = 0; rev < 2; rev++)
            for (int f = 0; f < 2; f++) {
               lm_tensor *in[1] = {mk(4, f ? big : s4, dt, LM_CHANNELS_LAST, 1)};
               g_bop = sops[o];
               g_s = svals[o];
               g_rev = rev;
               snprintf(name, sizeof name, "scalar %d %g rev %d %s big %d", sops[o], svals[o],
                        rev, dn, f);
               run_case(name, 1, in, 1, f_scalar);
               free_all(in, 1);
            }
      {
         lm_tensor *in[2] = {mk(4, s4, dt, LM_CHANNELS_LAST, 1), mk(3, bc, dt, LM_CONTIGUOUS, 1)};
         snprintf(name, sizeof name, "add+relu %s", dn);
         run_case(name, 2, in, 1, f_binary_unary);
         snprintf(name, sizeof name, "mul 3 + tanh %s", dn);
         run_case(name, 1, in, 1, f_scalar_unary);
         snprintf(name, sizeof name, "clamp %s", dn);
         run_case(name, 1, in, 1, f_clamp);
         snprintf(name, sizeof name, "clamp_min %s", dn);
         run_case(name, 1, in, 1, f_clamp_min);
         snprintf(name, sizeof name, "where %s", dn);
         run_case(name, 2, in, 1, f_where);
         free_all(in, 2);
      }
      {
         lm_tensor *in[3] = {mk(4, s4, dt, LM_CHANNELS_LAST, 1), mk(3, bc, dt, LM_CONTIGUOUS, 1),
                             transposed(mk(4, s4t, dt, LM_CONTIGUOUS, 1), 2, 3)};
         snprintf(name, sizeof name, "addcmul %s", dn);
         run_case(name, 3, in, 1, f_addcmul);
         snprintf(name, sizeof name, "addcdiv %s", dn);
         run_case(name, 3, in, 1, f_addcdiv);
         free_all(in, 3);
      }
      /* copy_ between formats and dtypes; fill_ */
      for (int f = 0; f < 4; f++) {
         lm_tensor *in[2] = {mk(4, f >= 2 ? big : s4, dt, LM_CHANNELS_LAST, 1),
                             mk(4, f >= 2 ? big : s4, f & 1 ? LM_FLOAT16 : dt, LM_CONTIGUOUS, 1)};
         snprintf(name, sizeof name, "copy_ %s case %d", dn, f);
         run_case(name, 2, in, 1, f_copy);
         snprintf(name, sizeof name, "fill_ %s case %d", dn, f);
         run_case(name, 1, in, 1, f_fill);
         free_all(in, 2);
      }
      {
         lm_tensor *in[2] = {mk(3, bc, dt, LM_CONTIGUOUS, 1), mk(4, s4, LM_INT64, LM_CHANNELS_LAST, 1)};
         snprintf(name, sizeof name, "copy_ broadcast into int64 %s", dn);
         run_case(name, 2, in, 1, f_copy);
         free_all(in, 2);
      }
      /* reductions */
      const int rops[4] = {LM_SUM, LM_MEAN, LM_MAX, LM_ARGMIN};
      for (int r = 0; r < 4; r++)
         for (int c = 0; c < 4; c++) {
            lm_tensor *in[1] = {mk(4, s4, dt, c & 1 ? LM_CHANNELS_LAST : LM_CONTIGUOUS, 1)};
            g_rop = rops[r];
            g_keep = c >= 2;
            if (rops[r] == LM_ARGMIN) {
               g_nd = 1;
               g_dims[0] = 1;
            } else if (c & 2) {
               g_nd = 2;
               g_dims[0] = 2;
               g_dims[1] = 3;
            } else {
               g_nd = c == 0 ? 0 : 1;
               g_dims[0] = -3;
            }
            snprintf(name, sizeof name, "reduce %d %s case %d", rops[r], dn, c);
            run_case(name, 1, in, 1, f_reduce);
            free_all(in, 1);
         }
      {
         lm_tensor *in[1] = {mk(4, s4, dt, LM_CHANNELS_LAST, 1)};
         g_rop = LM_MAX;
         g_nd = 1;
         g_dims[0] = 1;
         g_keep = 1;
         snprintf(name, sizeof name, "max with indices %s", dn);
         run_case(name, 1, in, 2, f_reduce_idx);
         free_all(in, 1);
      }
      /* cat of channels-last inputs (the result stays channels-last), and a mixed one */
      for (int c = 0; c < 3; c++) {
         const int64_t a[4] = {2, 3, 4, 5}, b[4] = {2, 2, 4, 5}, d[4] = {2, 1, 4, 5};
         lm_tensor *in[3] = {mk(4, a, dt, LM_CHANNELS_LAST, 1), mk(4, b, dt, LM_CHANNELS_LAST, 1),
                             mk(4, d, c == 2 ? LM_FLOAT64 : dt,
                                c == 1 ? LM_CONTIGUOUS : LM_CHANNELS_LAST, 1)};
         g_cat_dim = 1;
         snprintf(name, sizeof name, "cat %s case %d", dn, c);
         run_case(name, 3, in, 1, f_cat);
         free_all(in, 3);
      }
      /* random fills with a fixed seed: sim gives the CPU's values */
      {
         lm_tensor *in[4] = {mk(4, big, dt, LM_CHANNELS_LAST, 1), mk(4, s4, dt, LM_CONTIGUOUS, 1),
                             mk(4, s4, LM_INT64, LM_CHANNELS_LAST, 1),
                             transposed(mk(4, s4t, dt, LM_CONTIGUOUS, 1), 2, 3)};
         snprintf(name, sizeof name, "random fills %s", dn);
         run_case(name, 4, in, 5, f_random);
         free_all(in, 4);
      }
      /* optimizer steps */
      for (int fl = 0; fl < 2; fl++) {
         lm_tensor *in[5];
         for (int i = 0; i < 5; i++) in[i] = mk(4, s4, dt, LM_CHANNELS_LAST, 1);
         lm_tensor *sq = NULL;
         OK(lm_unary(LM_SQUARE, in[3], &sq));
         lm_tensor_free(in[3]);
         in[3] = sq;
         lm_tensor *sq4 = NULL;
         OK(lm_unary(LM_SQUARE, in[4], &sq4));
         lm_tensor_free(in[4]);
         in[4] = sq4;
         g_flag = fl;
         snprintf(name, sizeof name, "sgd nesterov %d %s", fl, dn);
         run_case(name, 3, in, 2, f_sgd);
         snprintf(name, sizeof name, "adam decoupled/amsgrad %d %s", fl, dn);
         run_case(name, 5, in, 5, f_adam);
         free_all(in, 5);
      }
   }
   device_rules();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
