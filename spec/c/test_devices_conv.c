/* test_devices_conv.c -- convolution and matmul off the CPU: the front ends (src/ops/conv.c,
 * src/ops/linalg.c) on the sim:0 test device and on meta.
 *
 * Each case runs on the CPU, then on sim:0 with the same values (copied in with lm_copy_, the
 * same views taken there) and on meta (no values). sim:0 must give the CPU's sizes, strides,
 * dtype and bit-identical values; meta must return LM_OK with the CPU's sizes, strides and dtype.
 * Cases: lm_conv2d forward (bias, residual, ReLU) and lm_conv2d_backward (grad_input,
 * grad_weight, grad_bias) in both memory formats, from contiguous, channels-last and non-dense
 * inputs, groups / depthwise, stride, padding, dilation, 1x1 and 3x3 (the AVX-512 paths: direct,
 * Winograd, pointwise, register-blocked, depthwise; and the portable ones with
 * lm_gemm_set_isa(1)), float32 and float64, bfloat16 (the native AVX512_BF16 kernels at the best
 * ISA, the float32 fallback with lm_gemm_set_isa(3) and (1)) and float16; lm_matmul 1-D / 2-D / batched / broadcast, transposed
 * and non-dense operands, out= tensors. Mixing a CPU tensor with a sim:0 one gives LM_ERR_DEVICE
 * with "same device".
 *
 * Prints "N passed, N failed"; exits non-zero on failure.
 */
#include "lumen.h"
#include "conv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                                        \
   do {                                                                                         \
      if (cond) {                                                                               \
         g_pass++;                                                                              \
      } else {                                                                                  \
         g_fail++;                                                                              \
         printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
         printf(__VA_ARGS__);                                                                   \
         printf(" [%s]\n", lm_last_error());                                                    \
      }                                                                                         \
   } while (0)

#define OK(call, ...) CHECK((call) == LM_OK, __VA_ARGS__)

static const int DEVS[3] = {LM_CPU, LM_SIM0, LM_META};
static const char *dev_name(int d) { return d == LM_CPU ? "cpu" : d == LM_META ? "meta" : "sim:0"; }

/* does lm_clone work on meta (it needs the copy kernel's meta path)? Cases whose inputs need a
   layout copy run on meta only then. */
static int g_meta_clone;

/* ---- inputs: the same values and the same view on every device ---- */
enum { V_CONTIG, V_CL, V_NARROW, V_TRANS };
static const char *view_name[] = {"contig", "channels_last", "narrow", "transposed"};

static uint64_t g_rng;
static double rnd(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (double)(g_rng >> 11) / 9007199254740992.0 * 2 - 1;
}

/* a tensor of sizes sz on dev, seen through `view` of a base tensor, with values from `seed`
   (the same on every device; none on meta) */
static lm_tensor *mk(int dev, int nd, const int64_t *sz, int dt, int view, uint64_t seed) {
   int64_t bsz[8];
   memcpy(bsz, sz, sizeof(int64_t) * (size_t)nd);
   if (view == V_NARROW) bsz[nd - 1] += 3;
   if (view == V_TRANS) bsz[nd - 1] = sz[nd - 2], bsz[nd - 2] = sz[nd - 1];
   const int fmt = view == V_CL ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
   lm_tensor *cpu = NULL, *base = NULL, *t = NULL;
   if (lm_empty(nd, bsz, dt, fmt, LM_CPU, &cpu) != LM_OK) return NULL;
   g_rng = seed * 0x9E3779B97F4A7C15ull + 12345;
   const int64_t n = cpu->numel;
   double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
   for (int64_t i = 0; i < n; i++) v[i] = rnd();
   lm_from_doubles(cpu, v);
   free(v);
   if (dev == LM_CPU) {
      base = cpu;
   } else {
      lm_empty_strided(nd, cpu->sizes, cpu->strides, dt, dev, &base);
      if (dev != LM_META) lm_copy_(base, cpu);
      lm_tensor_free(cpu);
   }
   if (view == V_NARROW) lm_narrow(base, nd - 1, 1, sz[nd - 1], &t);
   else if (view == V_TRANS) lm_transpose(base, nd - 2, nd - 1, &t);
   else lm_alias(base, &t);
   lm_tensor_free(base);
   return t;
}

/* r (on dev) against c (on the CPU): sizes, strides, dtype; the values too unless dev is meta */
static void same(const lm_tensor *r, const lm_tensor *c, int dev, const char *what) {
   CHECK(r && c, "%s on %s: missing result", what, dev_name(dev));
   if (!r || !c) return;
   CHECK(r->device == dev, "%s on %s: the result is on device %d", what, dev_name(dev), r->device);
   int shape = r->ndim == c->ndim && r->dtype == c->dtype;
   for (int d = 0; shape && d < c->ndim; d++)
      shape = r->sizes[d] == c->sizes[d] && r->strides[d] == c->strides[d];
   CHECK(shape, "%s on %s: sizes/strides/dtype differ from the cpu's", what, dev_name(dev));
   if (!shape || dev == LM_META) return;
   lm_tensor *h = NULL;
   OK(lm_empty_strided(c->ndim, c->sizes, c->strides, c->dtype, LM_CPU, &h), "%s: host copy",
      what);
   OK(lm_copy_(h, r), "%s: copy back from %s", what, dev_name(dev));
   const int64_t n = c->numel;
   double *a = malloc(sizeof(double) * (size_t)(n ? n : 1));
   double *b = malloc(sizeof(double) * (size_t)(n ? n : 1));
   lm_to_doubles(h, a);
   lm_to_doubles(c, b);
   CHECK(memcmp(a, b, sizeof(double) * (size_t)n) == 0, "%s on %s: values differ from the cpu's",
         what, dev_name(dev));
   free(a);
   free(b);
   lm_tensor_free(h);
}

/* two CPU tensors of one shape with the same values (strides may differ) */
static void same_values(const lm_tensor *a, const lm_tensor *b, const char *what) {
   int shape = a && b && a->ndim == b->ndim && a->dtype == b->dtype;
   for (int d = 0; shape && d < a->ndim; d++) shape = a->sizes[d] == b->sizes[d];
   CHECK(shape, "%s: shapes differ", what);
   if (!shape) return;
   const int64_t n = a->numel;
   double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
   double *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
   lm_to_doubles(a, x);
   lm_to_doubles(b, y);
   CHECK(memcmp(x, y, sizeof(double) * (size_t)n) == 0, "%s: values differ", what);
   free(x);
   free(y);
}

/* ---- convolution ---- */
typedef struct {
   const char *name;
   int64_t N, C, H, W, O, kh, kw, s[2], p[2], d[2], groups;
   int bias, res, relu;
} ccase;

static const ccase CASES[] = {
   /* name               N  C   H   W   O  kh kw stride  pad     dil    groups b r relu */
   {"3x3 s1 p1",         2, 16, 8,  9,  16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 1, 1},
   {"3x3 s2 p1",         2, 8,  9,  7,  12, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, 1, 0, 0},
   {"1x1 pointwise",     2, 32, 5,  6,  24, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, 1, 1, 0},
   {"rgb stem 7x7 s2",   1, 3,  20, 22, 16, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, 0, 0, 1},
   {"rb 3x3 C=3",        1, 3,  16, 18, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 0, 0},
   {"grey stem C=1",     2, 1,  16, 16, 8,  3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 0, 0},
   {"groups 2",          2, 8,  7,  7,  6,  3, 3, {1, 1}, {1, 1}, {1, 1}, 2, 1, 1, 0},
   {"depthwise",         2, 16, 7,  8,  16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 16, 1, 1, 1},
   {"depthwise s2",      1, 8,  9,  9,  8,  3, 3, {2, 2}, {1, 1}, {1, 1}, 8, 0, 0, 0},
   {"dilation 2",        1, 4,  9,  10, 5,  3, 3, {1, 1}, {2, 2}, {2, 2}, 1, 1, 0, 0},
   {"asymmetric",        2, 5,  6,  11, 7,  2, 3, {1, 2}, {0, 1}, {2, 1}, 1, 1, 1, 1},
};

/* one geometry, dtype and pair of input views (fmt: LM_PRESERVE decides) on every device */
static void conv_case(const ccase *c, int dt, int vx, int vw, int fmt) {
   char what[200];
   snprintf(what, sizeof what, "%s %s x:%s w:%s fmt %d", c->name, lm_dtype_name(dt),
            view_name[vx], view_name[vw], fmt);
   const int64_t xs[4] = {c->N, c->C, c->H, c->W};
   const int64_t ws[4] = {c->O, c->C / c->groups, c->kh, c->kw};
   const int64_t bs[1] = {c->O};
   int64_t ohw[2];
   OK(lm_conv2d_output_size(&xs[2], &ws[2], c->s, c->p, c->d, ohw), "%s: output size", what);
   const int64_t os[4] = {c->N, c->O, ohw[0], ohw[1]};
   const int vo = vx == V_CL ? V_CL : vx; /* residual / grad_output: like x */
   lm_tensor *y[3] = {0}, *gx[3] = {0}, *gw[3] = {0}, *gb[3] = {0};
   int needs_clone = 0;
   for (int k = 0; k < 3; k++) {
      const int dev = DEVS[k];
      lm_tensor *x = mk(dev, 4, xs, dt, vx, 1), *w = mk(dev, 4, ws, dt, vw, 2);
      lm_tensor *b = c->bias ? mk(dev, 1, bs, dt, vx == V_NARROW ? V_NARROW : V_CONTIG, 3) : NULL;
      lm_tensor *r = c->res ? mk(dev, 4, os, dt, vo, 4) : NULL;
      lm_tensor *g = mk(dev, 4, os, dt, vo, 5);
      if (dev == LM_CPU) {
         const int f = fmt == LM_PRESERVE ? lm_conv_memory_format(x, w) : fmt;
         needs_clone = !lm_is_contiguous(x, f) || !lm_is_contiguous(w, f) ||
                       !lm_is_contiguous(g, f) || (r && !lm_is_contiguous(r, f));
      }
      if (dev != LM_META || !needs_clone || g_meta_clone) {
         OK(lm_conv2d(x, w, b, c->s, c->p, c->d, c->groups, fmt, c->relu, r, &y[k]),
            "%s: conv2d on %s", what, dev_name(dev));
         OK(lm_conv2d_backward(x, w, g, c->s, c->p, c->d, c->groups, fmt, &gx[k], &gw[k], &gb[k]),
            "%s: conv2d_backward on %s", what, dev_name(dev));
         if (k > 0) {
            char w2[240];
            snprintf(w2, sizeof w2, "%s out", what);
            same(y[k], y[0], dev, w2);
            snprintf(w2, sizeof w2, "%s grad_input", what);
            same(gx[k], gx[0], dev, w2);
            snprintf(w2, sizeof w2, "%s grad_weight", what);
            same(gw[k], gw[0], dev, w2);
            snprintf(w2, sizeof w2, "%s grad_bias", what);
            same(gb[k], gb[0], dev, w2);
         }
      }
      lm_tensor_free(x), lm_tensor_free(w), lm_tensor_free(b), lm_tensor_free(r), lm_tensor_free(g);
   }
   /* only some gradients (the kernel gets NULL for the others) */
   lm_tensor *gb_only[2] = {0}, *gx_only[2] = {0};
   for (int k = 0; k < 2; k++) {
      const int dev = DEVS[k];
      lm_tensor *x = mk(dev, 4, xs, dt, vx, 1), *w = mk(dev, 4, ws, dt, vw, 2);
      lm_tensor *g = mk(dev, 4, os, dt, vo, 5);
      OK(lm_conv2d_backward(x, w, g, c->s, c->p, c->d, c->groups, fmt, &gx_only[k], NULL,
                            &gb_only[k]),
         "%s: conv2d_backward (grad_input, grad_bias) on %s", what, dev_name(dev));
      lm_tensor_free(x), lm_tensor_free(w), lm_tensor_free(g);
   }
   char w3[240];
   snprintf(w3, sizeof w3, "%s grad_input alone", what);
   same(gx_only[1], gx_only[0], LM_SIM0, w3);
   same(gx_only[0], gx[0], LM_CPU, w3);
   snprintf(w3, sizeof w3, "%s grad_bias alone", what);
   same(gb_only[1], gb_only[0], LM_SIM0, w3);
   same(gb_only[0], gb[0], LM_CPU, w3);
   for (int k = 0; k < 3; k++) {
      lm_tensor_free(y[k]), lm_tensor_free(gx[k]), lm_tensor_free(gw[k]), lm_tensor_free(gb[k]);
      if (k < 2) lm_tensor_free(gb_only[k]), lm_tensor_free(gx_only[k]);
   }
}

static void conv_cases(void) {
   const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   const int vpairs[][2] = {{V_CONTIG, V_CONTIG}, {V_CL, V_CL}, {V_CL, V_CONTIG},
                            {V_NARROW, V_CONTIG}, {V_NARROW, V_CL}};
   const int np = (int)(sizeof vpairs / sizeof vpairs[0]);
   for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
      for (int t = 0; t < 4; t++)
         for (int v = 0; v < np; v++)
            conv_case(&CASES[i], dts[t], vpairs[v][0], vpairs[v][1], LM_PRESERVE);
   /* an explicit format against the inputs' own */
   conv_case(&CASES[0], LM_FLOAT32, V_CONTIG, V_CONTIG, LM_CHANNELS_LAST);
   conv_case(&CASES[7], LM_FLOAT32, V_CL, V_CL, LM_CONTIGUOUS);
   conv_case(&CASES[0], LM_BFLOAT16, V_CONTIG, V_CONTIG, LM_CHANNELS_LAST);
   /* bfloat16 through the float32 fallback with the AVX-512 kernels (ISA 3, where the CPU has
      more) */
   if (lm_gemm_set_isa(3) == 3) {
      for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
         conv_case(&CASES[i], LM_BFLOAT16, V_CL, V_CL, LM_PRESERVE);
   }
   /* the portable kernels (registered for ISA 1) */
   if (lm_gemm_set_isa(1) == 1) {
      for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
         conv_case(&CASES[i], LM_FLOAT32, V_CL, V_CL, LM_PRESERVE);
         conv_case(&CASES[i], LM_FLOAT32, V_CONTIG, V_CONTIG, LM_PRESERVE);
         conv_case(&CASES[i], LM_BFLOAT16, V_CL, V_CL, LM_PRESERVE);
      }
   }
   lm_gemm_set_isa(0);
}

/* out= tensors on sim:0: written in place (dense in the format) or through a temporary */
static void conv_out_cases(void) {
   const ccase *c = &CASES[0];
   const int64_t xs[4] = {c->N, c->C, c->H, c->W};
   const int64_t ws[4] = {c->O, c->C, c->kh, c->kw};
   int64_t ohw[2];
   lm_conv2d_output_size(&xs[2], &ws[2], c->s, c->p, c->d, ohw);
   const int64_t os[4] = {c->N, c->O, ohw[0], ohw[1]};
   for (int view = V_CONTIG; view <= V_NARROW; view++) {
      lm_tensor *o[2] = {0};
      for (int k = 0; k < 2; k++) {
         lm_tensor *x = mk(DEVS[k], 4, xs, LM_FLOAT32, V_CL, 1);
         lm_tensor *w = mk(DEVS[k], 4, ws, LM_FLOAT32, V_CL, 2);
         o[k] = mk(DEVS[k], 4, os, LM_FLOAT32, view, 9);
         OK(lm_conv2d(x, w, NULL, c->s, c->p, c->d, 1, LM_PRESERVE, 0, NULL, &o[k]),
            "conv2d out=%s on %s", view_name[view], dev_name(DEVS[k]));
         lm_tensor_free(x), lm_tensor_free(w);
      }
      char what[64];
      snprintf(what, sizeof what, "conv2d out=%s", view_name[view]);
      same(o[1], o[0], LM_SIM0, what);
      lm_tensor_free(o[0]), lm_tensor_free(o[1]);
   }
}

/* ---- matmul ---- */
typedef struct {
   const char *name;
   int na, nb;
   int64_t as[4], bs[4];
   int va, vb;
} mcase;

static const mcase MCASES[] = {
   {"dot", 1, 1, {7}, {7}, V_CONTIG, V_CONTIG},
   {"dot narrow", 1, 1, {9}, {9}, V_NARROW, V_CONTIG},
   {"2d", 2, 2, {5, 7}, {7, 6}, V_CONTIG, V_CONTIG},
   {"2d transposed", 2, 2, {5, 7}, {7, 6}, V_TRANS, V_TRANS},
   {"2d narrow", 2, 2, {33, 17}, {17, 40}, V_NARROW, V_NARROW},
   {"1d . 2d", 1, 2, {7}, {7, 6}, V_CONTIG, V_TRANS},
   {"2d . 1d", 2, 1, {5, 7}, {7}, V_TRANS, V_CONTIG},
   {"1d . 3d", 1, 3, {4}, {3, 4, 5}, V_CONTIG, V_CONTIG},
   {"3d . 1d", 3, 1, {3, 5, 4}, {4}, V_NARROW, V_CONTIG},
   {"batched", 3, 3, {4, 5, 6}, {4, 6, 3}, V_CONTIG, V_CONTIG},
   {"batched transposed", 3, 3, {4, 5, 6}, {4, 6, 3}, V_TRANS, V_NARROW},
   {"linear layer", 3, 2, {4, 5, 6}, {6, 3}, V_CONTIG, V_TRANS},
   {"broadcast", 4, 3, {2, 1, 3, 4}, {5, 4, 2}, V_CONTIG, V_CONTIG},
   {"broadcast 2", 3, 4, {3, 1, 4}, {2, 1, 4, 6}, V_TRANS, V_CONTIG},
   {"empty", 2, 2, {0, 3}, {3, 4}, V_CONTIG, V_CONTIG},
   {"k = 0", 2, 2, {3, 0}, {0, 4}, V_CONTIG, V_CONTIG},
   {"large", 2, 2, {70, 130}, {130, 90}, V_CONTIG, V_TRANS},
};

static void matmul_cases(void) {
   const int dts[2] = {LM_FLOAT32, LM_FLOAT64};
   for (size_t i = 0; i < sizeof MCASES / sizeof MCASES[0]; i++) {
      const mcase *c = &MCASES[i];
      for (int t = 0; t < 2; t++) {
         char what[96];
         snprintf(what, sizeof what, "matmul %s %s", c->name, lm_dtype_name(dts[t]));
         lm_tensor *r[3] = {0};
         for (int k = 0; k < 3; k++) {
            lm_tensor *a = mk(DEVS[k], c->na, c->as, dts[t], c->va, 11);
            lm_tensor *b = mk(DEVS[k], c->nb, c->bs, dts[t], c->vb, 12);
            OK(lm_matmul(a, b, &r[k]), "%s on %s", what, dev_name(DEVS[k]));
            if (k > 0) same(r[k], r[0], DEVS[k], what);
            lm_tensor_free(a), lm_tensor_free(b);
         }
         /* out= with its own strides (a transposed 2-D result), on sim:0 */
         if (c->na == 2 && c->nb == 2) {
            const int64_t os[2] = {c->as[0], c->bs[1]};
            lm_tensor *o[2] = {0};
            for (int k = 0; k < 2; k++) {
               lm_tensor *a = mk(DEVS[k], 2, c->as, dts[t], c->va, 11);
               lm_tensor *b = mk(DEVS[k], 2, c->bs, dts[t], c->vb, 12);
               o[k] = mk(DEVS[k], 2, os, dts[t], V_TRANS, 13);
               OK(lm_matmul(a, b, &o[k]), "%s out= on %s", what, dev_name(DEVS[k]));
               lm_tensor_free(a), lm_tensor_free(b);
            }
            char w2[128];
            snprintf(w2, sizeof w2, "%s out=", what);
            same(o[1], o[0], LM_SIM0, w2);
            same_values(o[0], r[0], w2);
            lm_tensor_free(o[0]), lm_tensor_free(o[1]);
         }
         for (int k = 0; k < 3; k++) lm_tensor_free(r[k]);
      }
   }
}

/* ---- a CPU tensor with a sim:0 one ---- */
static void expect_device_error(lm_status st, const char *what) {
   CHECK(st == LM_ERR_DEVICE, "%s: expected LM_ERR_DEVICE, got %d", what, (int)st);
   CHECK(strstr(lm_last_error(), "same device") != NULL, "%s: message", what);
}

static void mixed_devices(void) {
   const int64_t xs[4] = {1, 2, 5, 5}, ws[4] = {3, 2, 3, 3}, bs[1] = {3}, os[4] = {1, 3, 3, 3};
   lm_tensor *xc = mk(LM_CPU, 4, xs, LM_FLOAT32, V_CONTIG, 1);
   lm_tensor *wc = mk(LM_CPU, 4, ws, LM_FLOAT32, V_CONTIG, 2);
   lm_tensor *bc = mk(LM_CPU, 1, bs, LM_FLOAT32, V_CONTIG, 3);
   lm_tensor *rc = mk(LM_CPU, 4, os, LM_FLOAT32, V_CONTIG, 4);
   lm_tensor *xs0 = mk(LM_SIM0, 4, xs, LM_FLOAT32, V_CONTIG, 1);
   lm_tensor *ws0 = mk(LM_SIM0, 4, ws, LM_FLOAT32, V_CONTIG, 2);
   lm_tensor *bs0 = mk(LM_SIM0, 1, bs, LM_FLOAT32, V_CONTIG, 3);
   lm_tensor *rs0 = mk(LM_SIM0, 4, os, LM_FLOAT32, V_CONTIG, 4);
   lm_tensor *o = NULL;
   expect_device_error(lm_conv2d(xc, ws0, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d x cpu, w sim:0");
   expect_device_error(lm_conv2d(xs0, wc, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d x sim:0, w cpu");
   expect_device_error(lm_conv2d(xc, wc, bs0, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d bias sim:0");
   expect_device_error(lm_conv2d(xs0, ws0, bs0, NULL, NULL, NULL, 1, -1, 0, rc, &o),
                       "conv2d residual cpu");
   CHECK(o == NULL, "conv2d: no result after an error");
   lm_tensor *oc = mk(LM_CPU, 4, os, LM_FLOAT32, V_CONTIG, 5);
   expect_device_error(lm_conv2d(xs0, ws0, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &oc),
                       "conv2d out= cpu");
   lm_tensor *gx = NULL, *gw = NULL, *gb = NULL;
   expect_device_error(lm_conv2d_backward(xs0, ws0, rc, NULL, NULL, NULL, 1, -1, &gx, &gw, &gb),
                       "conv2d_backward grad_output cpu");
   expect_device_error(lm_conv2d_backward(xc, ws0, rc, NULL, NULL, NULL, 1, -1, &gx, &gw, &gb),
                       "conv2d_backward w sim:0");
   lm_tensor *gxc = mk(LM_CPU, 4, xs, LM_FLOAT32, V_CONTIG, 6);
   expect_device_error(lm_conv2d_backward(xs0, ws0, rs0, NULL, NULL, NULL, 1, -1, &gxc, NULL,
                                          NULL),
                       "conv2d_backward grad_input= cpu");
   CHECK(!gx && !gw && !gb, "conv2d_backward: no result after an error");
   const int64_t as[2] = {3, 4}, bsm[2] = {4, 2};
   lm_tensor *ac = mk(LM_CPU, 2, as, LM_FLOAT64, V_CONTIG, 7);
   lm_tensor *bm = mk(LM_SIM0, 2, bsm, LM_FLOAT64, V_CONTIG, 8);
   lm_tensor *as0 = mk(LM_SIM0, 2, as, LM_FLOAT64, V_CONTIG, 7);
   lm_tensor *m = NULL;
   expect_device_error(lm_matmul(ac, bm, &m), "matmul a cpu, b sim:0");
   expect_device_error(lm_matmul(bm, ac, &m), "matmul a sim:0, b cpu");
   const int64_t ms[2] = {3, 2};
   lm_tensor *mc = mk(LM_CPU, 2, ms, LM_FLOAT64, V_CONTIG, 9);
   expect_device_error(lm_matmul(as0, bm, &mc), "matmul out= cpu");
   CHECK(m == NULL, "matmul: no result after an error");
   lm_tensor *all[] = {xc, wc, bc, rc, xs0, ws0, bs0, rs0, oc, gxc, ac, bm, as0, mc};
   for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_free(all[i]);
}

int main(void) {
   /* a non-dense meta tensor cloned: does the copy run on meta? */
   {
      const int64_t sz[2] = {3, 4};
      lm_tensor *t = mk(LM_META, 2, sz, LM_FLOAT32, V_TRANS, 1), *c = NULL;
      g_meta_clone = lm_clone(t, LM_CONTIGUOUS, -1, &c) == LM_OK;
      if (!g_meta_clone) {
         printf("FAIL: lm_clone does not run on meta (%s)\n", lm_last_error());
         return 1;
      }
      lm_tensor_free(t), lm_tensor_free(c);
   }
   conv_cases();
   conv_out_cases();
   matmul_cases();
   mixed_devices();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
