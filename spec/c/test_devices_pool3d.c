/* test_devices_pool3d.c -- the 3-D pooling operators (src/nn.h: max_pool3d with indices,
 * avg_pool3d, adaptive avg / max pooling, forward and backward) off the CPU: on sim:0 every result
 * (outputs, indices, input gradients) must be bit-identical to the CPU's, with the CPU's sizes,
 * strides and dtype; on meta the calls must succeed and give the CPU's sizes, strides and dtype;
 * a CPU tensor mixed with a sim:0 one must give LM_ERR_DEVICE; an index out of range is the
 * kernels' error (on sim:0 as on the CPU; meta does not look at values). Inputs: contiguous,
 * channels_last_3d and strided, 4-D (unbatched) and 5-D, float32, float64 and the halves, with
 * padding, dilation, ceil_mode, count_include_pad and divisor_override. Every case runs on each
 * kernel copy (the machine's ISA and the portable one, lm_gemm_set_isa).
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *
 *   make && cc -std=c11 -fopenmp -Isrc spec/c/test_devices_pool3d.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_devices_pool3d && /tmp/test_devices_pool3d
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

static const int DEVS[2] = {LM_SIM0, LM_META};

typedef struct {
   int nd;
   int64_t sz[5];
   int layout;
} shape;

/* a grad_output for out: channels_last_3d when the input is, else strided or contiguous */
static lm_tensor *cpu_grad(const shape *sh, const lm_tensor *out, int alt) {
   const int lay = sh->layout == L_CL ? L_CL : alt ? L_STRIDED : L_CONTIG;
   return cpu_rand(out->ndim, out->sizes, out->dtype, lay, -1, 1);
}

typedef struct {
   int64_t k[3], s[3], p[3], d[3];
   int ceil, cip;
   int64_t div; /* avg: 0 = no divisor_override */
} geo3;

static void max_case(const shape *sh, int dt, const geo3 *q) {
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *out = NULL, *ind = NULL, *out_n = NULL, *gx = NULL;
   OK(lm_max_pool3d(x, q->k, q->s, q->p, q->d, q->ceil, &out, &ind));
   keep(out), keep(ind);
   OK(lm_max_pool3d(x, q->k, q->s, q->p, q->d, q->ceil, &out_n, NULL));
   keep(out_n);
   same("max_pool3d output (no indices)", out, out_n, LM_CPU);
   lm_tensor *g = cpu_grad(sh, out, 1);
   OK(lm_max_pool3d_backward(g, x, ind, &gx));
   keep(gx);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dg = to_dev(g, dev);
      lm_tensor *o2 = NULL, *i2 = NULL, *g2 = NULL;
      if (!DEV(lm_max_pool3d(dx, q->k, q->s, q->p, q->d, q->ceil, &o2, &i2), dev)) continue;
      keep(o2), keep(i2);
      same("max_pool3d output", out, o2, dev);
      same("max_pool3d indices", ind, i2, dev);
      if (!DEV(lm_max_pool3d_backward(dg, dx, i2, &g2), dev)) continue;
      keep(g2);
      same("max_pool3d_backward", gx, g2, dev);
   }
}

static void avg_case(const shape *sh, int dt, const geo3 *q) {
   const int64_t *dv = q->div ? &q->div : NULL;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *out = NULL, *gx = NULL;
   OK(lm_avg_pool3d(x, q->k, q->s, q->p, q->ceil, q->cip, dv, &out));
   keep(out);
   lm_tensor *g = cpu_grad(sh, out, 0);
   OK(lm_avg_pool3d_backward(g, x, q->k, q->s, q->p, q->ceil, q->cip, dv, &gx));
   keep(gx);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dg = to_dev(g, dev);
      lm_tensor *o2 = NULL, *g2 = NULL;
      if (!DEV(lm_avg_pool3d(dx, q->k, q->s, q->p, q->ceil, q->cip, dv, &o2), dev)) continue;
      keep(o2);
      same("avg_pool3d output", out, o2, dev);
      if (!DEV(lm_avg_pool3d_backward(dg, dx, q->k, q->s, q->p, q->ceil, q->cip, dv, &g2), dev))
         continue;
      keep(g2);
      same("avg_pool3d_backward", gx, g2, dev);
   }
}

static void adaptive_case(const shape *sh, int dt, const int64_t *osz) {
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *ao = NULL, *mo = NULL, *mi = NULL, *agx = NULL, *mgx = NULL;
   OK(lm_adaptive_avg_pool3d(x, osz, &ao));
   keep(ao);
   OK(lm_adaptive_max_pool3d(x, osz, &mo, &mi));
   keep(mo), keep(mi);
   lm_tensor *ag = cpu_grad(sh, ao, 1), *mg = cpu_grad(sh, mo, 0);
   OK(lm_adaptive_avg_pool3d_backward(ag, x, &agx));
   keep(agx);
   OK(lm_adaptive_max_pool3d_backward(mg, x, mi, &mgx));
   keep(mgx);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dag = to_dev(ag, dev), *dmg = to_dev(mg, dev);
      lm_tensor *ao2 = NULL, *mo2 = NULL, *mi2 = NULL, *agx2 = NULL, *mgx2 = NULL;
      if (!DEV(lm_adaptive_avg_pool3d(dx, osz, &ao2), dev)) continue;
      keep(ao2);
      same("adaptive_avg_pool3d output", ao, ao2, dev);
      OK(lm_adaptive_max_pool3d(dx, osz, &mo2, &mi2));
      keep(mo2), keep(mi2);
      same("adaptive_max_pool3d output", mo, mo2, dev);
      same("adaptive_max_pool3d indices", mi, mi2, dev);
      if (DEV(lm_adaptive_avg_pool3d_backward(dag, dx, &agx2), dev)) {
         keep(agx2);
         same("adaptive_avg_pool3d_backward", agx, agx2, dev);
      }
      if (DEV(lm_adaptive_max_pool3d_backward(dmg, dx, mi2, &mgx2), dev)) {
         keep(mgx2);
         same("adaptive_max_pool3d_backward", mgx, mgx2, dev);
      }
   }
}

static const char *LAYNAMES[] = {"contiguous", "channels_last_3d", "strided"};

static void pool_tests(int isa) {
   static const shape shapes[] = {
      {5, {2, 5, 5, 7, 6}, L_CONTIG}, {5, {2, 5, 5, 7, 6}, L_CL}, {5, {2, 5, 5, 7, 6}, L_STRIDED},
      {5, {1, 33, 4, 5, 5}, L_CL},    {5, {1, 1, 1, 4, 3}, L_CL}, {4, {5, 4, 6, 7}, L_CONTIG},
      {4, {5, 4, 6, 7}, L_STRIDED},   {5, {0, 4, 3, 5, 5}, L_CONTIG},
   };
   static const geo3 mg[] = {
      {{3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, 0, 0, 0},
      {{2, 2, 3}, {1, 1, 2}, {1, 1, 0}, {2, 2, 1}, 1, 0, 0},
      {{1, 3, 3}, {1, 3, 3}, {0, 0, 0}, {1, 1, 1}, 1, 0, 0},
   };
   static const geo3 ag[] = {
      {{3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, 0, 1, 0},
      {{2, 2, 3}, {1, 1, 2}, {1, 1, 1}, {1, 1, 1}, 1, 0, 0},
      {{1, 3, 2}, {1, 2, 3}, {0, 1, 0}, {1, 1, 1}, 1, 1, 5},
   };
   static const int64_t ads[][3] = {{2, 4, 5}, {1, 1, 1}, {6, 9, 8}, {3, 1, 2}};
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++)
      for (int dti = 0; dti < 4; dti++) {
         static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
         const int dt = dts[dti];
         const char *dn = lm_dtype_name(dt);
         const shape *sh = &shapes[s];
         for (int i = 0; i < (int)(sizeof mg / sizeof mg[0]); i++) {
            /* the 1x1x4x3 input is too small for the 3x3x3 windows without padding */
            if (sh->sz[2] == 1 && mg[i].k[0] > 1 && mg[i].p[0] == 0) continue;
            snprintf(g_case, sizeof g_case, "isa %d max_pool3d %dD %s %s geometry %d", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, i);
            max_case(sh, dt, &mg[i]);
            free_kept();
         }
         for (int i = 0; i < (int)(sizeof ag / sizeof ag[0]); i++) {
            if (sh->sz[2] == 1 && ag[i].k[0] > 1 && ag[i].p[0] == 0) continue;
            snprintf(g_case, sizeof g_case, "isa %d avg_pool3d %dD %s %s geometry %d", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, i);
            avg_case(sh, dt, &ag[i]);
            free_kept();
         }
         for (int i = 0; i < (int)(sizeof ads / sizeof ads[0]); i++) {
            snprintf(g_case, sizeof g_case, "isa %d adaptive %dD %s %s out %lldx%lldx%lld", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, (long long)ads[i][0],
                     (long long)ads[i][1], (long long)ads[i][2]);
            adaptive_case(sh, dt, ads[i]);
            free_kept();
         }
      }
}

static void error_tests(void) {
   snprintf(g_case, sizeof g_case, "errors");
   const int64_t sz[5] = {2, 3, 4, 6, 6}, k[3] = {2, 2, 2}, os[3] = {2, 3, 3};
   lm_tensor *x = cpu_rand(5, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *mx = to_dev(x, LM_META);
   lm_tensor *out = NULL, *ind = NULL;
   OK(lm_max_pool3d(x, k, NULL, NULL, NULL, 0, &out, &ind));
   keep(out), keep(ind);
   lm_tensor *g = cpu_rand(5, out->sizes, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sg = to_dev(g, LM_SIM0), *sind = to_dev(ind, LM_SIM0);
   lm_tensor *gx = NULL;
   expect_device_error(lm_max_pool3d_backward(sg, x, ind, &gx), "grad_output on sim:0");
   expect_device_error(lm_max_pool3d_backward(g, x, sind, &gx), "indices on sim:0");
   expect_device_error(lm_adaptive_max_pool3d_backward(g, sx, ind, &gx), "input on sim:0");
   expect_device_error(lm_avg_pool3d_backward(sg, x, k, NULL, NULL, 0, 1, NULL, &gx),
                       "avg: grad_output on sim:0");
   lm_tensor *ao = NULL;
   OK(lm_adaptive_avg_pool3d(x, os, &ao));
   keep(ao);
   lm_tensor *sao = to_dev(ao, LM_SIM0);
   expect_device_error(lm_adaptive_avg_pool3d_backward(sao, x, &gx), "adaptive avg: grad on sim");
   expect_device_error(lm_adaptive_avg_pool3d_backward(ao, mx, &gx), "adaptive avg: x on meta");
   check(gx == NULL, "no grad_input after a device error");
   lm_tensor *o1 = out, *i1 = NULL;
   lm_status st = lm_max_pool3d(sx, k, NULL, NULL, NULL, 0, &o1, &i1);
   check(st == LM_ERR_DEVICE && i1 == NULL, "cpu out= for a sim:0 input: %d %s", (int)st,
         lm_last_error());
   /* values out of range: the kernels' errors, on sim:0 as on the CPU; meta does not look */
   lm_tensor *bad = NULL;
   OK(lm_empty(5, ind->sizes, LM_INT64, LM_CONTIGUOUS, LM_CPU, &bad));
   keep(bad);
   OK(lm_fill_(bad, 1000));
   lm_tensor *sbad = to_dev(bad, LM_SIM0), *mbad = to_dev(bad, LM_META);
   lm_tensor *mg = to_dev(g, LM_META);
   st = lm_max_pool3d_backward(g, x, bad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "cpu bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool3d_backward(sg, sx, sbad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "sim bad index: %d %s",
         (int)st, lm_last_error());
   lm_tensor *xcl = cpu_rand(5, sz, LM_FLOAT64, L_CL, -1, 1), *ocl = NULL, *icl = NULL;
   OK(lm_max_pool3d(xcl, k, NULL, NULL, NULL, 0, &ocl, &icl));
   keep(ocl), keep(icl);
   lm_tensor *gcl = cpu_rand(5, ocl->sizes, LM_FLOAT64, L_CL, -1, 1);
   OK(lm_fill_(icl, -5));
   st = lm_max_pool3d_backward(gcl, xcl, icl, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "cpu bad index (channels_last_3d): %d %s", (int)st, lm_last_error());
   st = lm_max_pool3d_backward(mg, mx, mbad, &gx);
   check(st == LM_OK && gx && gx->device == LM_META, "meta: values are not looked at: %d", (int)st);
   keep(gx);
   gx = NULL;
   /* argument errors are the front end's, the same on every device */
   const int64_t k0[3] = {2, 0, 2};
   lm_tensor *o3 = NULL;
   st = lm_max_pool3d(mx, k0, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "kernel size should be greater than zero"),
         "meta: bad kernel: %d %s", (int)st, lm_last_error());
   const int64_t dz = 0;
   st = lm_avg_pool3d(sx, k, NULL, NULL, 0, 1, &dz, &o3);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "divisor must be not zero"),
         "sim: divisor 0: %d %s", (int)st, lm_last_error());
   const int64_t k5[3] = {5, 2, 2};
   st = lm_max_pool3d(mx, k5, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_SHAPE && strstr(lm_last_error(), "Output size is too small"),
         "meta: too small: %d %s", (int)st, lm_last_error());
   free_kept();
}

int main(void) {
   lm_manual_seed(1919);
   const int best = lm_gemm_isa();
   const int isas[2] = {best, 1};
   for (int i = 0; i < (best > 1 ? 2 : 1); i++) {
      lm_gemm_set_isa(isas[i]);
      pool_tests(isas[i]);
   }
   lm_gemm_set_isa(best);
   error_tests();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
