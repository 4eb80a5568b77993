/* test_devices_pool.c -- the pooling operators (src/nn.h: max_pool2d with indices, taps and
 * their three backwards, avg_pool2d, adaptive avg / max pooling, forward and backward) off the
 * CPU: on sim:0 every result (outputs, indices, tap numbers, input gradients) must be
 * bit-identical to the CPU's, with the CPU's sizes, strides and dtype; on meta the calls must
 * succeed and give the CPU's sizes, strides and dtype; a CPU tensor mixed with a sim:0 one must
 * give LM_ERR_DEVICE ("same device"); index / tap values out of range are the kernels' errors
 * (on sim:0 as on the CPU; meta does not look at values). Inputs: contiguous, channels-last and
 * strided, 3-D and 4-D, float32 and float64, with padding, dilation, ceil_mode, count_include_pad
 * and divisor_override. Every case runs on each kernel copy (the machine's ISA and the portable
 * one, lm_gemm_set_isa).
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *
 *   make && cc -std=c11 -fopenmp -Isrc spec/c/test_devices_pool.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_devices_pool && /tmp/test_devices_pool
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
   int64_t sz[4];
   int layout;
} shape;

/* a grad_output for out: channels-last when the input is, else strided (the front end clones
   it) or contiguous */
static lm_tensor *cpu_grad(const shape *sh, const lm_tensor *out, int alt) {
   const int lay = sh->layout == L_CL ? L_CL : alt ? L_STRIDED : L_CONTIG;
   return cpu_rand(out->ndim, out->sizes, out->dtype, lay, -1, 1);
}

/* ---- max_pool2d (indices, taps, the three backwards) ------------------------------------- */

typedef struct {
   int64_t k[2], s[2], p[2], d[2];
   int ceil;
} max_geo;

static void max_case(const shape *sh, int dt, const max_geo *q) {
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *out = NULL, *ind = NULL, *out_t = NULL, *taps = NULL, *out_n = NULL;
   OK(lm_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil, &out, &ind));
   keep(out), keep(ind);
   OK(lm_max_pool2d_taps(x, q->k, q->s, q->p, q->d, q->ceil, &out_t, &taps));
   keep(out_t), keep(taps);
   OK(lm_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil, &out_n, NULL));
   keep(out_n);
   lm_tensor *g = cpu_grad(sh, out, 1);
   lm_tensor *gx = NULL, *gx_geo = NULL, *gx_taps = NULL;
   OK(lm_max_pool2d_backward(g, x, ind, &gx));
   keep(gx);
   OK(lm_max_pool2d_backward_geom(g, x, ind, q->k, q->s, q->p, q->d, q->ceil, &gx_geo));
   keep(gx_geo);
   OK(lm_max_pool2d_taps_backward(g, x, taps, q->k, q->s, q->p, q->d, q->ceil, &gx_taps));
   keep(gx_taps);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dg = to_dev(g, dev);
      lm_tensor *o2 = NULL, *i2 = NULL, *ot2 = NULL, *t2 = NULL, *on2 = NULL;
      if (!DEV(lm_max_pool2d(dx, q->k, q->s, q->p, q->d, q->ceil, &o2, &i2), dev)) continue;
      keep(o2), keep(i2);
      same("max_pool2d output", out, o2, dev);
      same("max_pool2d indices", ind, i2, dev);
      OK(lm_max_pool2d_taps(dx, q->k, q->s, q->p, q->d, q->ceil, &ot2, &t2));
      keep(ot2), keep(t2);
      same("max_pool2d_taps output", out_t, ot2, dev);
      same("max_pool2d_taps taps", taps, t2, dev);
      OK(lm_max_pool2d(dx, q->k, q->s, q->p, q->d, q->ceil, &on2, NULL));
      keep(on2);
      same("max_pool2d output (no indices)", out_n, on2, dev);
      lm_tensor *g2 = NULL, *g3 = NULL, *g4 = NULL;
      if (!DEV(lm_max_pool2d_backward(dg, dx, i2, &g2), dev)) continue;
      keep(g2);
      same("max_pool2d_backward", gx, g2, dev);
      OK(lm_max_pool2d_backward_geom(dg, dx, i2, q->k, q->s, q->p, q->d, q->ceil, &g3));
      keep(g3);
      same("max_pool2d_backward_geom", gx_geo, g3, dev);
      OK(lm_max_pool2d_taps_backward(dg, dx, t2, q->k, q->s, q->p, q->d, q->ceil, &g4));
      keep(g4);
      same("max_pool2d_taps_backward", gx_taps, g4, dev);
   }
}

/* ---- avg_pool2d ---------------------------------------------------------------------------- */

typedef struct {
   int64_t k[2], s[2], p[2];
   int ceil, cip;
   int64_t div; /* 0: no divisor_override */
} avg_geo;

static void avg_case(const shape *sh, int dt, const avg_geo *q) {
   const int64_t *dv = q->div ? &q->div : NULL;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *out = NULL, *gx = NULL;
   OK(lm_avg_pool2d(x, q->k, q->s, q->p, q->ceil, q->cip, dv, &out));
   keep(out);
   lm_tensor *g = cpu_grad(sh, out, 0);
   OK(lm_avg_pool2d_backward(g, x, q->k, q->s, q->p, q->ceil, q->cip, dv, &gx));
   keep(gx);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dg = to_dev(g, dev);
      lm_tensor *o2 = NULL, *g2 = NULL;
      if (!DEV(lm_avg_pool2d(dx, q->k, q->s, q->p, q->ceil, q->cip, dv, &o2), dev)) continue;
      keep(o2);
      same("avg_pool2d output", out, o2, dev);
      if (!DEV(lm_avg_pool2d_backward(dg, dx, q->k, q->s, q->p, q->ceil, q->cip, dv, &g2), dev))
         continue;
      keep(g2);
      same("avg_pool2d_backward", gx, g2, dev);
   }
}

/* ---- adaptive pooling ---------------------------------------------------------------------- */

static void adaptive_case(const shape *sh, int dt, const int64_t *osz) {
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *ao = NULL, *mo = NULL, *mi = NULL, *agx = NULL, *mgx = NULL;
   OK(lm_adaptive_avg_pool2d(x, osz, &ao));
   keep(ao);
   OK(lm_adaptive_max_pool2d(x, osz, &mo, &mi));
   keep(mo), keep(mi);
   lm_tensor *ag = cpu_grad(sh, ao, 1), *mg = cpu_grad(sh, mo, 0);
   OK(lm_adaptive_avg_pool2d_backward(ag, x, &agx));
   keep(agx);
   OK(lm_adaptive_max_pool2d_backward(mg, x, mi, &mgx));
   keep(mgx);
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *dx = to_dev(x, dev), *dag = to_dev(ag, dev), *dmg = to_dev(mg, dev);
      lm_tensor *ao2 = NULL, *mo2 = NULL, *mi2 = NULL, *agx2 = NULL, *mgx2 = NULL;
      if (!DEV(lm_adaptive_avg_pool2d(dx, osz, &ao2), dev)) continue;
      keep(ao2);
      same("adaptive_avg_pool2d output", ao, ao2, dev);
      OK(lm_adaptive_max_pool2d(dx, osz, &mo2, &mi2));
      keep(mo2), keep(mi2);
      same("adaptive_max_pool2d output", mo, mo2, dev);
      same("adaptive_max_pool2d indices", mi, mi2, dev);
      if (DEV(lm_adaptive_avg_pool2d_backward(dag, dx, &agx2), dev)) {
         keep(agx2);
         same("adaptive_avg_pool2d_backward", agx, agx2, dev);
      }
      if (DEV(lm_adaptive_max_pool2d_backward(dmg, dx, mi2, &mgx2), dev)) {
         keep(mgx2);
         same("adaptive_max_pool2d_backward", mgx, mgx2, dev);
      }
   }
}

static const char *LAYNAMES[] = {"contiguous", "channels-last", "strided"};

static void pool_tests(int isa) {
   static const shape shapes[] = {
      {4, {2, 5, 9, 11}, L_CONTIG}, {4, {2, 5, 9, 11}, L_CL},  {4, {2, 5, 9, 11}, L_STRIDED},
      {4, {3, 32, 8, 7}, L_CL},     {4, {1, 17, 6, 6}, L_CL},  {3, {5, 9, 11}, L_CONTIG},
      {3, {5, 9, 11}, L_STRIDED},   {4, {0, 4, 5, 5}, L_CONTIG},
   };
   static const max_geo mg[] = {
      {{3, 3}, {2, 2}, {1, 1}, {1, 1}, 0},
      {{2, 3}, {1, 2}, {1, 0}, {2, 1}, 1},
      {{3, 3}, {3, 3}, {0, 0}, {1, 1}, 1},
      {{2, 2}, {2, 2}, {1, 1}, {3, 3}, 0},
   };
   static const avg_geo ag[] = {
      {{3, 3}, {2, 2}, {1, 1}, 0, 1, 0},
      {{2, 3}, {1, 2}, {1, 1}, 1, 0, 0},
      {{3, 2}, {2, 3}, {1, 0}, 1, 1, 5},
   };
   static const int64_t ads[][2] = {{4, 5}, {1, 1}, {12, 13}, {3, 1}};
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++)
      for (int dti = 0; dti < 4; dti++) {
         /* the halves: computed on float32 copies, rounded once; the same on every device */
         static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
         const int dt = dts[dti];
         const char *dn = lm_dtype_name(dt);
         const shape *sh = &shapes[s];
         for (int i = 0; i < (int)(sizeof mg / sizeof mg[0]); i++) {
            snprintf(g_case, sizeof g_case, "isa %d max_pool2d %dD %s %s geometry %d", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, i);
            max_case(sh, dt, &mg[i]);
            free_kept();
         }
         for (int i = 0; i < (int)(sizeof ag / sizeof ag[0]); i++) {
            snprintf(g_case, sizeof g_case, "isa %d avg_pool2d %dD %s %s geometry %d", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, i);
            avg_case(sh, dt, &ag[i]);
            free_kept();
         }
         for (int i = 0; i < (int)(sizeof ads / sizeof ads[0]); i++) {
            snprintf(g_case, sizeof g_case, "isa %d adaptive %dD %s %s out %lldx%lld", isa,
                     sh->nd, LAYNAMES[sh->layout], dn, (long long)ads[i][0],
                     (long long)ads[i][1]);
            adaptive_case(sh, dt, ads[i]);
            free_kept();
         }
      }
   /* a grad_input of 1 MiB (float32, channels-last, 16 | C): the AVX-512 gathers may stream */
   const shape big = {4, {2, 32, 64, 64}, L_CL};
   snprintf(g_case, sizeof g_case, "isa %d big channels-last", isa);
   max_case(&big, LM_FLOAT32, &mg[0]);
   avg_case(&big, LM_FLOAT32, &ag[0]);
   free_kept();
}

/* ---- errors: mixed devices, out= tensors, values out of range ----------------------------- */

static void error_tests(void) {
   snprintf(g_case, sizeof g_case, "errors");
   const int64_t sz[4] = {2, 3, 6, 6}, k[2] = {2, 2}, os[2] = {3, 3};
   lm_tensor *x = cpu_rand(4, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *mx = to_dev(x, LM_META);
   lm_tensor *out = NULL, *ind = NULL, *taps = NULL;
   OK(lm_max_pool2d(x, k, NULL, NULL, NULL, 0, &out, &ind));
   keep(out), keep(ind);
   OK(lm_max_pool2d_taps(x, k, NULL, NULL, NULL, 0, &out, &taps));
   keep(taps);
   lm_tensor *g = cpu_rand(4, out->sizes, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sg = to_dev(g, LM_SIM0), *sind = to_dev(ind, LM_SIM0), *staps = to_dev(taps, LM_SIM0);
   lm_tensor *gx = NULL;
   expect_device_error(lm_max_pool2d_backward(sg, x, ind, &gx), "grad_output on sim:0");
   expect_device_error(lm_max_pool2d_backward(g, x, sind, &gx), "indices on sim:0");
   expect_device_error(lm_max_pool2d_backward(sg, sx, ind, &gx), "indices on the cpu");
   expect_device_error(lm_adaptive_max_pool2d_backward(g, sx, ind, &gx), "input on sim:0");
   expect_device_error(lm_max_pool2d_backward_geom(g, x, sind, k, NULL, NULL, NULL, 0, &gx),
                       "geom: indices on sim:0");
   expect_device_error(lm_max_pool2d_taps_backward(sg, x, taps, k, NULL, NULL, NULL, 0, &gx),
                       "taps_backward: grad_output on sim:0");
   expect_device_error(lm_max_pool2d_taps_backward(g, x, staps, k, NULL, NULL, NULL, 0, &gx),
                       "taps_backward: taps on sim:0");
   expect_device_error(lm_avg_pool2d_backward(sg, x, k, NULL, NULL, 0, 1, NULL, &gx),
                       "avg: grad_output on sim:0");
   lm_tensor *ao = NULL;
   OK(lm_adaptive_avg_pool2d(x, os, &ao));
   keep(ao);
   lm_tensor *sao = to_dev(ao, LM_SIM0);
   expect_device_error(lm_adaptive_avg_pool2d_backward(sao, x, &gx), "adaptive avg: grad on sim");
   expect_device_error(lm_adaptive_avg_pool2d_backward(ao, mx, &gx), "adaptive avg: x on meta");
   check(gx == NULL, "no grad_input after a device error");
   /* an out= tensor on another device than the input */
   lm_tensor *o1 = out, *i1 = NULL;
   lm_status st = lm_max_pool2d(sx, k, NULL, NULL, NULL, 0, &o1, &i1);
   check(st == LM_ERR_DEVICE && i1 == NULL, "cpu out= for a sim:0 input: %d %s", (int)st,
         lm_last_error());
   lm_tensor *si1 = sind;
   o1 = NULL;
   st = lm_max_pool2d(x, k, NULL, NULL, NULL, 0, &o1, &si1);
   check(st == LM_ERR_DEVICE && o1 == NULL, "sim:0 indices out= for a cpu input: %d %s",
         (int)st, lm_last_error());
   /* out= on sim:0, in another layout (a temporary, then a copy within the device) */
   lm_tensor *xc = cpu_rand(4, sz, LM_FLOAT64, L_CL, -1, 1);
   lm_tensor *sxc = to_dev(xc, LM_SIM0);
   lm_tensor *oc = NULL, *soc = NULL;
   const int64_t osz[4] = {2, 3, 3, 3};
   OK(lm_empty(4, osz, LM_FLOAT64, LM_CONTIGUOUS, LM_CPU, &oc));
   keep(oc);
   OK(lm_avg_pool2d(xc, k, NULL, NULL, 0, 1, NULL, &oc));
   OK(lm_empty(4, osz, LM_FLOAT64, LM_CONTIGUOUS, LM_SIM0, &soc));
   keep(soc);
   lm_tensor *soc_in = soc;
   OK(lm_avg_pool2d(sxc, k, NULL, NULL, 0, 1, NULL, &soc));
   check(soc == soc_in, "out= on sim:0 kept");
   same("avg_pool2d into an out= tensor on sim:0", oc, soc, LM_SIM0);
   /* values out of range: the kernels' errors, on sim:0 as on the CPU; meta does not look */
   lm_tensor *bad = NULL;
   OK(lm_empty(4, ind->sizes, LM_INT64, LM_CONTIGUOUS, LM_CPU, &bad));
   keep(bad);
   OK(lm_fill_(bad, 1000));
   lm_tensor *sbad = to_dev(bad, LM_SIM0), *mbad = to_dev(bad, LM_META);
   lm_tensor *mg = to_dev(g, LM_META);
   st = lm_max_pool2d_backward(g, x, bad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "cpu bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool2d_backward(sg, sx, sbad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "sim bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool2d_backward_geom(sg, sx, sbad, k, NULL, NULL, NULL, 0, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "sim bad index (geom): %d %s", (int)st, lm_last_error());
   st = lm_max_pool2d_backward(mg, mx, mbad, &gx);
   check(st == LM_OK && gx && gx->device == LM_META, "meta: values are not looked at: %d", (int)st);
   keep(gx);
   gx = NULL;
   lm_tensor *btaps = NULL;
   OK(lm_empty(4, taps->sizes, LM_UINT8, LM_CONTIGUOUS, LM_CPU, &btaps));
   keep(btaps);
   OK(lm_fill_(btaps, 7));
   lm_tensor *sbtaps = to_dev(btaps, LM_SIM0);
   st = lm_max_pool2d_taps_backward(sg, sx, sbtaps, k, NULL, NULL, NULL, 0, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "sim bad taps: %d %s", (int)st, lm_last_error());
   /* argument errors are the front end's, the same on every device */
   const int64_t k0[2] = {0, 2};
   lm_tensor *o3 = NULL;
   st = lm_max_pool2d(mx, k0, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "kernel size should be greater than zero"),
         "meta: bad kernel: %d %s", (int)st, lm_last_error());
   const int64_t dz = 0;
   st = lm_avg_pool2d(sx, k, NULL, NULL, 0, 1, &dz, &o3);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "divisor must be not zero"),
         "sim: divisor 0: %d %s", (int)st, lm_last_error());
   free_kept();
}

int main(void) {
   lm_manual_seed(4321);
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
