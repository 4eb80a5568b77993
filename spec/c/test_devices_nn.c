/* test_devices_nn.c -- batch norm (plain and fused, forward and backward), nll_loss (forward
 * and backward) and softmax / log_softmax (forward and backward, any rank, every dim) off the CPU: on sim:0 every result (the running statistics updated in place
 * too) must be bit-identical to the CPU's, with the CPU's sizes, strides and dtype; on meta the
 * calls must succeed and give the CPU's sizes, strides and dtype; a CPU tensor mixed with a
 * sim:0 one must give LM_ERR_DEVICE ("same device"). Every case runs on each kernel copy (the
 * machine's ISA and the portable one, lm_gemm_set_isa).
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *
 *   make && cc -std=c11 -fopenmp -Isrc spec/c/test_devices_nn.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_devices_nn && /tmp/test_devices_nn
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lumen.h"
#include "nn.h"

#include "device_check.h"
}

/* ---- batch norm ---------------------------------------------------------------------------- */

typedef struct {
   int nd;
   int64_t sz[5];
   int layout;
} bn_shape;

/* one forward + backward case on cpu, sim:0 and meta */
static void bn_case(const bn_shape *sh, int dt, int training, int affine, int stats,
                    int residual, int relu, int pdt, int strided_param) {
   const int64_t C = sh->sz[1];
   const int64_t csz[1] = {C};
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 3);
   lm_tensor *w = affine ? cpu_rand(1, csz, pdt, strided_param ? L_STRIDED : L_CONTIG, 0.5, 1.5)
                         : NULL;
   lm_tensor *b = affine ? cpu_rand(1, csz, pdt, L_CONTIG, -1, 1) : NULL;
   lm_tensor *rm = stats ? cpu_rand(1, csz, pdt, strided_param ? L_STRIDED : L_CONTIG, -1, 1)
                         : NULL;
   lm_tensor *rv = stats ? cpu_rand(1, csz, pdt, L_CONTIG, 0.5, 2) : NULL;
   lm_tensor *res = residual ? cpu_rand(sh->nd, sh->sz, dt, L_STRIDED, -1, 1) : NULL;
   lm_tensor *g = cpu_rand(sh->nd, sh->sz, dt, sh->layout == L_CL ? L_CL : L_STRIDED, -1, 1);
   const double mom = 0.1, eps = 1e-5;

   /* the device copies, before the cpu run updates the running statistics */
   lm_tensor *dx[2], *dw[2], *db[2], *drm[2], *drv[2], *dres[2], *dg[2];
   const int devs[2] = {LM_SIM0, LM_META};
   for (int k = 0; k < 2; k++) {
      dx[k] = to_dev(x, devs[k]), dw[k] = to_dev(w, devs[k]), db[k] = to_dev(b, devs[k]);
      drm[k] = to_dev(rm, devs[k]), drv[k] = to_dev(rv, devs[k]);
      dres[k] = to_dev(res, devs[k]), dg[k] = to_dev(g, devs[k]);
   }

   lm_tensor *y = NULL, *sm = NULL, *si = NULL;
   OK(lm_batch_norm_fused(x, w, b, rm, rv, training, mom, eps, res, relu, &y, &sm, &si));
   keep(y), keep(sm), keep(si);
   const int fused_bwd = relu; /* the relu's backward inside: mask = y */
   lm_tensor *gx = NULL, *gw = NULL, *gb = NULL, *gm = NULL;
   OK(lm_batch_norm_backward_fused(g, fused_bwd ? y : NULL, x, w, sm, si, training, &gx, &gw, &gb,
                                   fused_bwd && residual ? &gm : NULL));
   keep(gx), keep(gw), keep(gb), keep(gm);

   for (int k = 0; k < 2; k++) {
      const int dev = devs[k];
      lm_tensor *y2 = NULL, *sm2 = NULL, *si2 = NULL;
      if (!DEV(lm_batch_norm_fused(dx[k], dw[k], db[k], drm[k], drv[k], training, mom, eps,
                                   dres[k], relu, &y2, &sm2, &si2),
               dev))
         continue;
      keep(y2), keep(sm2), keep(si2);
      same("output", y, y2, dev);
      same("save_mean", sm, sm2, dev);
      same("save_invstd", si, si2, dev);
      if (stats && dev != LM_META) {
         same("running_mean", rm, drm[k], dev);
         same("running_var", rv, drv[k], dev);
      }
      lm_tensor *gx2 = NULL, *gw2 = NULL, *gb2 = NULL, *gm2 = NULL;
      if (!DEV(lm_batch_norm_backward_fused(dg[k], fused_bwd ? y2 : NULL, dx[k], dw[k], sm2, si2,
                                            training, &gx2, &gw2, &gb2,
                                            fused_bwd && residual ? &gm2 : NULL),
               dev))
         continue;
      keep(gx2), keep(gw2), keep(gb2), keep(gm2);
      same("grad_input", gx, gx2, dev);
      same("grad_weight", gw, gw2, dev);
      same("grad_bias", gb, gb2, dev);
      same("grad_masked", gm, gm2, dev);
      /* only grad_input (the sums skipped in eval) */
      lm_tensor *gx3 = NULL, *gx4 = NULL;
      OK(lm_batch_norm_backward(g, x, w, sm, si, training, &gx3, NULL, NULL));
      keep(gx3);
      if (!DEV(lm_batch_norm_backward(dg[k], dx[k], dw[k], sm2, si2, training, &gx4, NULL, NULL),
               dev))
         continue;
      keep(gx4);
      same("grad_input alone", gx3, gx4, dev);
   }
}

static void bn_mixed(void) {
   snprintf(g_case, sizeof g_case, "batch_norm mixed devices");
   const int64_t sz[4] = {2, 3, 4, 4}, csz[1] = {3};
   lm_tensor *x = cpu_rand(4, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *rm = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *rv = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, 1, 2);
   lm_tensor *w = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *srm = to_dev(rm, LM_SIM0), *sw = to_dev(w, LM_SIM0);
   lm_tensor *y = NULL, *sm = NULL, *si = NULL;
   expect_device_error(lm_batch_norm(x, sw, NULL, rm, rv, 1, 0.1, 1e-5, &y, NULL, NULL),
                       "weight on sim:0");
   expect_device_error(lm_batch_norm(x, NULL, NULL, srm, rv, 1, 0.1, 1e-5, &y, NULL, NULL),
                       "running_mean on sim:0");
   expect_device_error(lm_batch_norm(sx, NULL, NULL, rm, rv, 0, 0.1, 1e-5, &y, NULL, NULL),
                       "input on sim:0");
   expect_device_error(lm_batch_norm_fused(x, NULL, NULL, rm, rv, 0, 0.1, 1e-5, sx, 1, &y, NULL,
                                           NULL),
                       "residual on sim:0");
   check(y == NULL, "no output after a device error");
   OK(lm_batch_norm(x, w, NULL, rm, rv, 1, 0.1, 1e-5, &y, &sm, &si));
   keep(y), keep(sm), keep(si);
   lm_tensor *gx = NULL;
   expect_device_error(lm_batch_norm_backward(sx, x, w, sm, si, 1, &gx, NULL, NULL),
                       "grad_output on sim:0");
   expect_device_error(lm_batch_norm_backward(x, x, sw, sm, si, 1, &gx, NULL, NULL),
                       "weight on sim:0 (backward)");
   lm_tensor *ssm = to_dev(sm, LM_SIM0);
   expect_device_error(lm_batch_norm_backward(x, x, w, ssm, si, 1, &gx, NULL, NULL),
                       "save_mean on sim:0");
   expect_device_error(lm_batch_norm_backward_fused(x, sx, x, w, sm, si, 1, &gx, NULL, NULL, NULL),
                       "relu_out on sim:0");
   /* an out= tensor on another device */
   lm_tensor *yo = NULL;
   OK(lm_empty(4, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &yo));
   keep(yo);
   lm_status st = lm_batch_norm(x, NULL, NULL, rm, rv, 0, 0.1, 1e-5, &yo, NULL, NULL);
   check(st == LM_ERR_DEVICE, "out= on sim:0: status %d", (int)st);
   free_kept();
}

static void bn_tests(void) {
   static const bn_shape shapes[] = {
      {4, {4, 3, 5, 6}, L_CONTIG}, {4, {4, 3, 5, 6}, L_CL},     {4, {4, 3, 5, 6}, L_STRIDED},
      {2, {6, 5}, L_CONTIG},       {2, {6, 5}, L_STRIDED},      {3, {3, 4, 7}, L_CONTIG},
      {5, {2, 3, 2, 3, 4}, L_CL},  {5, {2, 3, 2, 3, 4}, L_CONTIG}, {4, {2, 70, 3, 3}, L_CL},
      {4, {2, 19, 3, 3}, L_CL},    {4, {2, 70, 3, 3}, L_CONTIG}, {4, {8, 64, 24, 24}, L_CL},
      {4, {8, 16, 48, 48}, L_CONTIG}, {4, {0, 3, 2, 2}, L_CONTIG},
   };
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const bn_shape *sh = &shapes[s];
      const int64_t big = sh->sz[0] * sh->sz[1] * (sh->nd > 2 ? sh->sz[2] : 1);
      /* the halves: float32 parameters (the mixed case) or all in the half dtype */
      static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
      for (int dti = 0; dti < 4; dti++) {
         const int dt = dts[dti];
         for (int variant = 0; variant < 12; variant++) {
            const int training = variant & 1, affine = (variant >> 1) & 1;
            const int fused = variant >> 2; /* 0 plain, 1 relu, 2 residual + relu */
            /* big shapes: a few variants only */
            if (big > 10000 && variant != 1 && variant != 3 && variant != 11) continue;
            const int residual = fused == 2, relu = fused >= 1;
            for (int stats = 0; stats < 2; stats++) {
               if (!training && !stats) continue; /* eval needs the running statistics */
               const int pdt = (s + variant) % 3 == 0 ? (dt == LM_FLOAT32 ? LM_FLOAT64
                                                                         : LM_FLOAT32)
                                                      : dt;
               /* the halves: a third of the variants (each one still seen across the shapes),
                  the big shapes once */
               if (dti >= 2 && (big > 10000 ? variant != 3 : (variant + s + dti) % 3 != 0))
                  continue;
               const int sp = (s + variant + stats) % 2;
               snprintf(g_case, sizeof g_case,
                        "batch_norm %dD [%lld,%lld,...] layout %d %s train %d affine %d stats %d "
                        "residual %d relu %d param %s%s isa %d",
                        sh->nd, (long long)sh->sz[0], (long long)sh->sz[1], sh->layout,
                        lm_dtype_name(dt), training, affine, stats, residual, relu,
                        lm_dtype_name(pdt), sp ? " strided" : "", lm_gemm_isa());
               bn_case(sh, dt, training, affine, stats, residual, relu, pdt, sp);
               free_kept();
            }
         }
      }
   }
}

/* ---- nll_loss ---------------------------------------------------------------------------- */

static lm_tensor *cpu_target(int nd, const int64_t *sz, int64_t C, int64_t ignore, int strided) {
   int64_t n = 1;
   for (int i = 0; i < nd; i++) n *= sz[i];
   double *v = malloc(sizeof(double) * (size_t)(n + 1));
   for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7 + 3) % C);
   if (n > 2) v[1] = (double)ignore; /* at least one ignored sample */
   lm_tensor *t = NULL;
   if (strided && nd > 0) {
      int64_t big[LM_MAX_DIMS], st[LM_MAX_DIMS];
      memcpy(big, sz, sizeof(int64_t) * (size_t)nd);
      big[0] = 2 * sz[0];
      lm_tensor *b = NULL;
      OK(lm_empty(nd, big, LM_INT64, LM_CONTIGUOUS, LM_CPU, &b));
      keep(b);
      OK(lm_fill_(b, 0));
      memcpy(st, b->strides, sizeof(int64_t) * (size_t)nd);
      st[0] *= 2;
      OK(lm_as_strided(b, nd, sz, st, 0, &t));
      keep(t);
      lm_tensor *c = NULL;
      OK(lm_empty(nd, sz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &c));
      keep(c);
      OK(lm_from_doubles(c, v));
      OK(lm_copy_(t, c));
   } else {
      OK(lm_empty(nd, sz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &t));
      keep(t);
      OK(lm_from_doubles(t, v));
   }
   free(v);
   return t;
}

typedef struct {
   int nd;
   int64_t sz[4];
   int layout;
} nll_shape;

static void nll_case(const nll_shape *sh, int dt, int reduction, int weighted, int wdt,
                     int64_t ignore, int strided_target) {
   const int cdim = sh->nd == 1 ? 0 : 1;
   const int64_t C = sh->sz[cdim], csz[1] = {C};
   int64_t tsz[4];
   int tnd = 0;
   for (int i = 0; i < sh->nd; i++)
      if (i != cdim) tsz[tnd++] = sh->sz[i];
   lm_tensor *in = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -3, 0);
   lm_tensor *tg = cpu_target(tnd, tsz, C, ignore, strided_target);
   lm_tensor *w = weighted ? cpu_rand(1, csz, wdt, L_CONTIG, 0.5, 2) : NULL;
   lm_tensor *g = reduction == LM_REDUCTION_NONE ? cpu_rand(tnd, tsz, dt, L_STRIDED, -1, 1)
                                                 : cpu_rand(0, NULL, dt, L_CONTIG, 0.5, 1.5);
   lm_tensor *out = NULL, *tw = NULL, *gi = NULL;
   OK(lm_nll_loss(in, tg, w, reduction, ignore, &out, &tw));
   keep(out), keep(tw);
   OK(lm_nll_loss_backward(g, in, tg, w, reduction, ignore, tw, &gi));
   keep(gi);
   const int devs[2] = {LM_SIM0, LM_META};
   for (int k = 0; k < 2; k++) {
      const int dev = devs[k];
      lm_tensor *din = to_dev(in, dev), *dtg = to_dev(tg, dev), *dw = to_dev(w, dev);
      lm_tensor *dg = to_dev(g, dev);
      lm_tensor *out2 = NULL, *tw2 = NULL, *gi2 = NULL;
      OK(lm_nll_loss(din, dtg, dw, reduction, ignore, &out2, &tw2));
      keep(out2), keep(tw2);
      same("output", out, out2, dev);
      same("total_weight", tw, tw2, dev);
      OK(lm_nll_loss_backward(dg, din, dtg, dw, reduction, ignore, tw2, &gi2));
      keep(gi2);
      same("grad_input", gi, gi2, dev);
      /* without total_weight */
      lm_tensor *out3 = NULL;
      OK(lm_nll_loss(din, dtg, dw, reduction, ignore, &out3, NULL));
      keep(out3);
      same("output (no total_weight)", out, out3, dev);
   }
}

static void nll_errors(void) {
   snprintf(g_case, sizeof g_case, "nll_loss errors");
   const int64_t sz[2] = {4, 3}, tsz[1] = {4}, csz[1] = {3};
   lm_tensor *in = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -2, 0);
   lm_tensor *tg = cpu_target(1, tsz, 3, -100, 0);
   lm_tensor *w = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, 1, 2);
   lm_tensor *sin = to_dev(in, LM_SIM0), *stg = to_dev(tg, LM_SIM0), *sw = to_dev(w, LM_SIM0);
   lm_tensor *out = NULL, *tw = NULL, *gi = NULL;
   expect_device_error(lm_nll_loss(in, stg, NULL, 1, -100, &out, NULL), "target on sim:0");
   expect_device_error(lm_nll_loss(sin, tg, NULL, 1, -100, &out, NULL), "input on sim:0");
   expect_device_error(lm_nll_loss(in, tg, sw, 1, -100, &out, NULL), "weight on sim:0");
   check(out == NULL, "no output after a device error");
   OK(lm_nll_loss(in, tg, w, 1, -100, &out, &tw));
   keep(out), keep(tw);
   lm_tensor *sout = to_dev(out, LM_SIM0), *stw = to_dev(tw, LM_SIM0);
   expect_device_error(lm_nll_loss_backward(sout, in, tg, w, 1, -100, tw, &gi),
                       "grad_output on sim:0");
   expect_device_error(lm_nll_loss_backward(out, in, tg, w, 1, -100, stw, &gi),
                       "total_weight on sim:0");
   expect_device_error(lm_nll_loss_backward(out, in, stg, w, 1, -100, tw, &gi),
                       "target on sim:0 (backward)");
   check(gi == NULL, "no grad_input after a device error");
   /* a target out of range is the kernel's error, on every device that computes */
   double bad[4] = {0, 1, 5, 2};
   lm_tensor *tb = NULL;
   OK(lm_empty(1, tsz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &tb));
   keep(tb);
   OK(lm_from_doubles(tb, bad));
   lm_tensor *stb = to_dev(tb, LM_SIM0), *mtb = to_dev(tb, LM_META);
   lm_tensor *o1 = NULL;
   lm_status st = lm_nll_loss(in, tb, NULL, 1, -100, &o1, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !o1,
         "cpu bad target: %d %s", (int)st, lm_last_error());
   /* into an out= tensor (0-dim) on the CPU, then on sim:0 */
   st = lm_nll_loss(in, tg, NULL, 2, -100, &out, NULL);
   check(st == LM_OK, "cpu out=: %d %s", (int)st, lm_last_error());
   st = lm_nll_loss(sin, stg, NULL, 2, -100, &sout, NULL);
   check(st == LM_OK, "sim out=: %d %s", (int)st, lm_last_error());
   same("out= result", out, sout, LM_SIM0);
   lm_tensor *o2 = NULL;
   st = lm_nll_loss(sin, stb, NULL, 1, -100, &o2, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !o2,
         "sim bad target: %d %s", (int)st, lm_last_error());
   st = lm_nll_loss_backward(sout, sin, stb, NULL, 2, -100, NULL, &gi);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !gi,
         "sim bad target (backward): %d %s", (int)st, lm_last_error());
   lm_tensor *min = to_dev(in, LM_META);
   st = lm_nll_loss(min, mtb, NULL, 1, -100, &o2, NULL);
   check(st == LM_OK, "meta: values are not looked at: %d", (int)st);
   keep(o2);
   free_kept();
}

static void nll_tests(void) {
   static const nll_shape shapes[] = {
      {1, {5}, L_CONTIG},          {2, {7, 5}, L_CONTIG},       {2, {7, 5}, L_STRIDED},
      {4, {2, 5, 3, 4}, L_CONTIG}, {4, {2, 5, 3, 4}, L_CL},     {3, {3, 4, 6}, L_STRIDED},
      {2, {0, 5}, L_CONTIG},
   };
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++)
      for (int dti = 0; dti < 4; dti++)
         for (int red = 0; red < 3; red++)
            for (int wv = 0; wv < 3; wv++)
               for (int ig = 0; ig < 2; ig++) {
                  static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
                  const int dt = dts[dti];
                  const int wdt = wv == 2 ? (dt == LM_FLOAT32 ? LM_FLOAT64 : LM_FLOAT32) : dt;
                  const int64_t ignore = ig ? 2 : -100;
                  const int st = (s + red + wv) % 2;
                  snprintf(g_case, sizeof g_case,
                           "nll_loss %dD layout %d %s reduction %d weight %d ignore %lld "
                           "target %s",
                           shapes[s].nd, shapes[s].layout, lm_dtype_name(dt), red,
                           wv, (long long)ignore, st ? "strided" : "contiguous");
                  nll_case(&shapes[s], dt, red, wv > 0, wdt, ignore, st);
                  free_kept();
               }
}


/* ---- softmax / log_softmax ------------------------------------------------------------------ */

typedef struct {
   int nd;
   int64_t sz[5];
   int layout;
} sm_shape;

typedef lm_status (*sm_fwd_fn)(const lm_tensor *, int, lm_tensor **);
typedef lm_status (*sm_bwd_fn)(const lm_tensor *, const lm_tensor *, int, lm_tensor **);

/* an empty CPU tensor with c's sizes and strides (an out= tensor in that layout) */
static lm_tensor *cpu_like(const lm_tensor *c) {
   lm_tensor *t = NULL;
   OK(lm_empty_strided(c->ndim, c->sizes, c->strides, c->dtype, LM_CPU, &t));
   return keep(t);
}

/* a strided out= tensor of sizes sz (every other element of the last dim); 0-dim: contiguous */
static lm_tensor *cpu_strided_out(int nd, const int64_t *sz, int dt) {
   lm_tensor *t = cpu_rand(nd, sz, dt, L_STRIDED, 0, 1);
   return t;
}

/* forward and backward over dim on cpu, sim:0 and meta; with out= tensors (contiguous and
   strided) for both; the backward also from a non-contiguous copy of the forward's result */
static void sm_case(const sm_shape *sh, int dt, int dim, int lg) {
   const sm_fwd_fn fwd = lg ? lm_log_softmax : lm_softmax;
   const sm_bwd_fn bwd = lg ? lm_log_softmax_backward : lm_softmax_backward;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -4, 4);
   lm_tensor *g = cpu_rand(sh->nd, sh->sz, dt, sh->layout == L_CL ? L_CL : L_STRIDED, -1, 1);
   lm_tensor *y = NULL, *gx = NULL;
   OK(fwd(x, dim, &y));
   keep(y);
   OK(bwd(g, y, dim, &gx));
   keep(gx);
   /* the forward's result in another layout (strided), for a backward that makes it dense */
   lm_tensor *ys = cpu_strided_out(sh->nd, sh->sz, dt);
   OK(lm_copy_(ys, y));
   lm_tensor *gxs = NULL;
   OK(bwd(g, ys, dim, &gxs));
   keep(gxs);
   /* out= on the cpu: contiguous (used in place) and strided (filled through a copy) */
   lm_tensor *yo1 = cpu_like(y), *yo2 = cpu_strided_out(sh->nd, sh->sz, dt);
   OK(fwd(x, dim, &yo1));
   OK(fwd(x, dim, &yo2));
   lm_tensor *go1 = cpu_like(gx), *go2 = cpu_strided_out(sh->nd, sh->sz, dt);
   OK(bwd(g, y, dim, &go1));
   OK(bwd(g, y, dim, &go2));

   const int devs[2] = {LM_SIM0, LM_META};
   for (int k = 0; k < 2; k++) {
      const int dev = devs[k];
      lm_tensor *dx = to_dev(x, dev), *dg = to_dev(g, dev);
      lm_tensor *y2 = NULL, *gx2 = NULL, *gxs2 = NULL;
      if (!DEV(fwd(dx, dim, &y2), dev)) continue;
      keep(y2);
      same("output", y, y2, dev);
      if (!DEV(bwd(dg, y2, dim, &gx2), dev)) continue;
      keep(gx2);
      same("grad_input", gx, gx2, dev);
      lm_tensor *dys = to_dev(ys, dev);
      if (!DEV(bwd(dg, dys, dim, &gxs2), dev)) continue;
      keep(gxs2);
      same("grad_input (strided output)", gxs, gxs2, dev);
      /* out= on dev, in the cpu's out= layouts (the values in them are overwritten) */
      lm_tensor *dyo1 = to_dev(yo1, dev), *dyo2 = to_dev(yo2, dev);
      lm_tensor *const dyo1_in = dyo1, *const dyo2_in = dyo2;
      if (!DEV(fwd(dx, dim, &dyo1), dev) || !DEV(fwd(dx, dim, &dyo2), dev)) continue;
      check(dyo1 == dyo1_in && dyo2 == dyo2_in, "out=: the result is the out tensor");
      same("output out= contiguous", yo1, dyo1, dev);
      same("output out= strided", yo2, dyo2, dev);
      lm_tensor *dgo1 = to_dev(go1, dev), *dgo2 = to_dev(go2, dev);
      if (!DEV(bwd(dg, y2, dim, &dgo1), dev) || !DEV(bwd(dg, y2, dim, &dgo2), dev)) continue;
      same("grad_input out= contiguous", go1, dgo1, dev);
      same("grad_input out= strided", go2, dgo2, dev);
   }
}

static void sm_tests(void) {
   static const sm_shape shapes[] = {
      {0, {0}, L_CONTIG},             {1, {7}, L_CONTIG},             {1, {7}, L_STRIDED},
      {1, {1}, L_CONTIG},             {2, {5, 9}, L_CONTIG},          {2, {5, 9}, L_STRIDED},
      {2, {1, 33}, L_CONTIG},         {3, {3, 4, 6}, L_CONTIG},       {3, {3, 4, 6}, L_STRIDED},
      {4, {2, 3, 4, 5}, L_CONTIG},    {4, {2, 3, 4, 5}, L_CL},        {4, {2, 3, 4, 5}, L_STRIDED},
      {4, {2, 1, 3, 1}, L_CL},        {5, {2, 3, 2, 3, 4}, L_CL},     {5, {2, 3, 2, 3, 4}, L_STRIDED},
      {2, {0, 5}, L_CONTIG},          {3, {2, 0, 3}, L_STRIDED},      {2, {64, 300}, L_CONTIG},
      {3, {4, 130, 17}, L_CONTIG},    {4, {4, 40, 6, 7}, L_CL},
   };
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const sm_shape *sh = &shapes[s];
      const int n = sh->nd > 0 ? sh->nd : 1;
      static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
      for (int dti = 0; dti < 4; dti++) {
         const int dt = dts[dti];
         for (int dim = -n; dim < n; dim++)
            for (int lg = 0; lg < 2; lg++) {
               if (dti >= 2 && (dim + s + lg) % 2 != 0) continue; /* halves: half the cases */
               snprintf(g_case, sizeof g_case, "%s %dD [%lld,...] layout %d %s dim %d isa %d",
                        lg ? "log_softmax" : "softmax", sh->nd, (long long)sh->sz[0], sh->layout,
                        lm_dtype_name(dt), dim, lm_gemm_isa());
               sm_case(sh, dt, dim, lg);
               free_kept();
            }
      }
   }
}

static void expect_status(lm_status st, lm_status want, const char *msg_part, const char *what) {
   check(st == want, "%s: status %d, wanted %d (%s)", what, (int)st, (int)want, lm_last_error());
   if (msg_part)
      check(strstr(lm_last_error(), msg_part) != NULL, "%s: message '%s' lacks '%s'", what,
            lm_last_error(), msg_part);
}

static void sm_errors(void) {
   snprintf(g_case, sizeof g_case, "softmax errors");
   const int64_t sz[2] = {3, 4}, sz2[2] = {3, 5};
   lm_tensor *x = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *y = NULL, *ly = NULL;
   OK(lm_softmax(x, 1, &y));
   keep(y);
   OK(lm_log_softmax(x, 1, &ly));
   keep(ly);
   lm_tensor *sx = to_dev(x, LM_SIM0), *sy = to_dev(y, LM_SIM0), *sly = to_dev(ly, LM_SIM0);
   lm_tensor *my = to_dev(y, LM_META), *s1y = to_dev(y, LM_SIM0 + 1);
   lm_tensor *gx = NULL;
   /* the backward's two tensors on different devices */
   expect_device_error(lm_softmax_backward(x, sy, 1, &gx), "softmax_backward cpu grad, sim y");
   check(strstr(lm_last_error(), "cpu") && strstr(lm_last_error(), "sim:0") &&
            strstr(lm_last_error(), "softmax_backward"),
         "the message names both devices and the op: '%s'", lm_last_error());
   expect_device_error(lm_softmax_backward(sx, y, 1, &gx), "softmax_backward sim grad, cpu y");
   expect_device_error(lm_log_softmax_backward(x, sly, 1, &gx),
                       "log_softmax_backward cpu grad, sim y");
   check(strstr(lm_last_error(), "log_softmax_backward") != NULL, "names the op: '%s'",
         lm_last_error());
   expect_device_error(lm_log_softmax_backward(sx, ly, 1, &gx),
                       "log_softmax_backward sim grad, cpu y");
   expect_device_error(lm_softmax_backward(x, my, 1, &gx), "softmax_backward cpu grad, meta y");
   expect_device_error(lm_softmax_backward(sx, s1y, 1, &gx), "softmax_backward sim:0 and sim:1");
   check(gx == NULL, "no grad_input after a device error");
   /* an out= tensor on another device than the input */
   lm_tensor *so = to_dev(y, LM_SIM0), *co = cpu_like(y), *mo = to_dev(y, LM_META);
   lm_tensor *o = so;
   expect_status(lm_softmax(x, 1, &o), LM_ERR_DEVICE, "out tensor is on sim:0",
                 "softmax cpu input, sim out=");
   o = co;
   expect_status(lm_log_softmax(sx, 1, &o), LM_ERR_DEVICE, "out tensor is on cpu",
                 "log_softmax sim input, cpu out=");
   o = mo;
   expect_status(lm_softmax(sx, 1, &o), LM_ERR_DEVICE, "out tensor is on meta",
                 "softmax sim input, meta out=");
   o = so;
   expect_status(lm_softmax_backward(x, y, 1, &o), LM_ERR_DEVICE, "out tensor is on sim:0",
                 "softmax_backward cpu inputs, sim out=");
   o = co;
   expect_status(lm_log_softmax_backward(sx, sly, 1, &o), LM_ERR_DEVICE, "out tensor is on cpu",
                 "log_softmax_backward sim inputs, cpu out=");
   /* the front end's argument errors are the same on every device */
   const int devs[3] = {LM_CPU, LM_SIM0, LM_META};
   for (int k = 0; k < 3; k++) {
      const int dev = devs[k];
      lm_tensor *dx = dev == LM_CPU ? x : to_dev(x, dev);
      lm_tensor *dy = dev == LM_CPU ? y : to_dev(y, dev);
      lm_tensor *r = NULL;
      expect_status(lm_softmax(dx, 2, &r), LM_ERR_ARG, "dimension out of range", "dim 2");
      expect_status(lm_log_softmax(dx, -3, &r), LM_ERR_ARG, "dimension out of range", "dim -3");
      expect_status(lm_softmax_backward(dx, dy, 5, &r), LM_ERR_ARG, "dimension out of range",
                    "backward dim 5");
      check(r == NULL, "no result after an error");
      lm_tensor *xi = NULL, *xd = NULL, *wrong = NULL;
      OK(lm_empty(2, sz, LM_INT64, LM_CONTIGUOUS, dev, &xi));
      keep(xi);
      expect_status(lm_softmax(xi, 1, &r), LM_ERR_DTYPE, "floating tensor", "int64 input");
      OK(lm_empty(2, sz, LM_FLOAT64, LM_CONTIGUOUS, dev, &xd));
      keep(xd);
      expect_status(lm_softmax_backward(xd, dy, 1, &r), LM_ERR_DTYPE, "dtype", "dtype mismatch");
      OK(lm_empty(2, sz2, LM_FLOAT32, LM_CONTIGUOUS, dev, &wrong));
      keep(wrong);
      expect_status(lm_log_softmax_backward(wrong, dy, 1, &r), LM_ERR_SHAPE, "does not match",
                    "shape mismatch");
      lm_tensor *wo = wrong;
      expect_status(lm_softmax(dx, 1, &wo), LM_ERR_SHAPE, "out tensor of shape", "out= shape");
      expect_status(lm_softmax(dx, 1, NULL), LM_ERR_ARG, "out is NULL", "out NULL");
      check(r == NULL, "no result after an error");
   }
   free_kept();
}

int main(void) {
   lm_manual_seed(1234);
   const int best = lm_gemm_isa();
   const int isas[2] = {best, 1};
   for (int i = 0; i < (best > 1 ? 2 : 1); i++) {
      lm_gemm_set_isa(isas[i]);
      bn_tests();
      sm_tests();
   }
   lm_gemm_set_isa(best);
   nll_tests();
   bn_mixed();
   nll_errors();
   sm_errors();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
