/* test_conv.c -- lm_conv2d / lm_conv2d_backward against a naive direct convolution in double.
 *
 * Random and hand-picked geometries (channels 1, 3, 7, 17, 64; spatial 1, 2, 7 and larger;
 * strides 1-2, padding 0-2, dilation 1-2, groups 1 / 2 / Cin, asymmetric settings), both memory
 * formats, inputs in several layouts (contiguous, channels-last, non-dense views, odd
 * permutations), forward with the fused bias / residual / ReLU epilogue, both backward passes,
 * float32 (rtol 1e-4) and float64 (rtol 1e-10). The tolerance of each element is relative to the
 * sum of the absolute values of its terms, so cancellation does not cause false failures.
 * Also: the memory-format decision, out= tensors, error messages.
 * The float32 channels-last algorithms (Winograd F(2x2)/F(4x4), the pointwise kernels, the
 * register-blocked kernels for small channel counts, the direct kernels) each run on geometries
 * they take, switched with LUMEN_CONV_WINOGRAD / LUMEN_CONV_PW / LUMEN_CONV_RB (algo_cases,
 * pointwise_cases; LUMEN_CONV_STREAM=1 forces streaming stores), plus Winograd over many tiles.
 *
 * Prints "N passed, N failed"; exits non-zero on failure.
 * `test_conv --bench` (or LUMEN_CONV_BENCH=1) also times 3x3 64->64 56x56 batch 8; per-layer
 * timings of the small ResNet are in bench/conv.lua.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv, clock_gettime */
#endif
#include "lumen.h"
#include "conv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_pass, g_fail;
static int g_f32_nhwc_only; /* run_case: only float32 channels-last (the paths under test) */

#define CHECK(cond, ...)                                                                        \
   do {                                                                                         \
      if (cond) {                                                                               \
         g_pass++;                                                                              \
      } else {                                                                                  \
         g_fail++;                                                                              \
         printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
         printf(__VA_ARGS__);                                                                   \
         printf("\n");                                                                          \
      }                                                                                         \
   } while (0)

/* ---- deterministic random numbers ---- */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd_u64(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return g_rng;
}
static double rnd_uniform(void) { return (double)(rnd_u64() >> 11) / 9007199254740992.0 * 2 - 1; }
static int64_t rnd_pick(const int64_t *v, int n) { return v[rnd_u64() % (uint64_t)n]; }

/* ---- tensors ---- */
enum { L_CONTIG = 0, L_CL, L_NONDENSE, L_NONDENSE_CL, L_PERMUTED, L_NUM };
static const char *layout_name[L_NUM] = {"contig", "channels_last", "nondense", "nondense_cl",
                                         "permuted"};

typedef struct {
   lm_tensor *t;    /* the tensor handed to the API */
   lm_tensor *base; /* its base when t is a view (freed too) */
} tens;

static void tens_free(tens *a) {
   if (a->t) lm_tensor_free(a->t);
   if (a->base) lm_tensor_free(a->base);
   a->t = a->base = NULL;
}

static int64_t elem_off(const lm_tensor *t, const int64_t *idx) {
   int64_t o = 0;
   for (int d = 0; d < t->ndim; d++) o += idx[d] * t->strides[d];
   return o;
}
static double getv(const lm_tensor *t, const int64_t *idx) {
   const char *p = lm_tensor_data(t);
   int64_t o = elem_off(t, idx);
   return t->dtype == LM_FLOAT32 ? ((const float *)p)[o] : ((const double *)p)[o];
}
static void setv(lm_tensor *t, const int64_t *idx, double v) {
   char *p = lm_tensor_data(t);
   int64_t o = elem_off(t, idx);
   if (t->dtype == LM_FLOAT32)
      ((float *)p)[o] = (float)v;
   else
      ((double *)p)[o] = v;
}

/* logical (row-major) walk */
static int next_idx(int nd, const int64_t *sz, int64_t *idx) {
   for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < sz[d]) return 1;
      idx[d] = 0;
   }
   return 0;
}

static int64_t numel_of(int nd, const int64_t *sz) {
   int64_t n = 1;
   for (int d = 0; d < nd; d++) n *= sz[d];
   return n;
}

/* copy into / out of a logical double array */
static void to_array(const lm_tensor *t, double *a) {
   int64_t idx[8] = {0};
   if (t->numel == 0) return;
   int64_t k = 0;
   do a[k++] = getv(t, idx);
   while (next_idx(t->ndim, t->sizes, idx));
}
static void from_array(lm_tensor *t, const double *a) {
   int64_t idx[8] = {0};
   if (t->numel == 0) return;
   int64_t k = 0;
   do setv(t, idx, a[k++]);
   while (next_idx(t->ndim, t->sizes, idx));
}

static void must(lm_status st, const char *what) {
   if (st != LM_OK) {
      printf("FATAL %s: %s\n", what, lm_last_error());
      exit(2);
    }
}

/* a 4-D tensor of the given logical sizes in one of the layouts, filled from vals (logical) */
static tens make4(const int64_t *sz, int dtype, int layout, const double *vals) {
   tens r = {NULL, NULL};
   if (layout == L_CONTIG || layout == L_CL) {
      must(lm_empty(4, sz, dtype, layout == L_CL ? LM_CHANNELS_LAST : LM_CONTIGUOUS, LM_CPU,
                    &r.t), "empty");
   } else if (layout == L_NONDENSE || layout == L_NONDENSE_CL) {
      /* a slice of a bigger tensor: one extra channel and two extra columns */
      int64_t big[4] = {sz[0], sz[1] + 1, sz[2], sz[3] + 2};
      must(lm_empty(4, big, dtype, layout == L_NONDENSE_CL ? LM_CHANNELS_LAST : LM_CONTIGUOUS,
                    LM_CPU, &r.base), "empty");
      lm_tensor *v1 = NULL;
      must(lm_narrow(r.base, 1, 1, sz[1], &v1), "narrow");
      must(lm_narrow(v1, 3, 1, sz[3], &r.t), "narrow");
      lm_tensor_free(v1);
   } else { /* permuted: memory order N, W, H, C -> logical strides (WHC, 1, C, HC) */
      int64_t phys[4] = {sz[0], sz[3], sz[2], sz[1]};
      must(lm_empty(4, phys, dtype, LM_CONTIGUOUS, LM_CPU, &r.base), "empty");
      const int perm[4] = {0, 3, 2, 1};
      must(lm_permute(r.base, perm, &r.t), "permute");
   }
   if (vals) from_array(r.t, vals);
   return r;
}

/* 1-D tensor of n elements with stride 1 or 2 */
static tens make1(int64_t n, int dtype, int strided, const double *vals) {
   tens r = {NULL, NULL};
   if (!strided) {
      must(lm_empty(1, &n, dtype, LM_CONTIGUOUS, LM_CPU, &r.t), "empty");
   } else {
      int64_t n2 = 2 * n + 1, st = 2;
      must(lm_empty(1, &n2, dtype, LM_CONTIGUOUS, LM_CPU, &r.base), "empty");
      must(lm_as_strided(r.base, 1, &n, &st, 1, &r.t), "as_strided");
   }
   if (vals) from_array(r.t, vals);
   return r;
}

static double *rand_array(int64_t n) {
   double *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
   for (int64_t i = 0; i < n; i++) a[i] = rnd_uniform();
   return a;
}

/* ---- the reference ---- */
typedef struct {
   int64_t N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, G, Ho, Wo;
} geom;

#define IX4(a, b, c, d, B, C_, D) ((((a) * (B) + (b)) * (C_) + (c)) * (D) + (d))

/* y and |y| sums (for tolerances) */
static void ref_forward(const geom *g, const double *x, const double *w, const double *b,
                        const double *res, int relu, double *y, double *yabs) {
   const int64_t Cg = g->C / g->G, Og = g->O / g->G;
   for (int64_t n = 0; n < g->N; n++)
      for (int64_t o = 0; o < g->O; o++)
         for (int64_t ho = 0; ho < g->Ho; ho++)
            for (int64_t wo = 0; wo < g->Wo; wo++) {
               double s = b ? b[o] : 0, sa = b ? fabs(b[o]) : 0;
               const int64_t gi = o / Og;
               for (int64_t c = 0; c < Cg; c++)
                  for (int64_t i = 0; i < g->kh; i++)
                     for (int64_t j = 0; j < g->kw; j++) {
                        int64_t hi = ho * g->sh - g->ph + i * g->dh;
                        int64_t wi = wo * g->sw - g->pw + j * g->dw;
                        if (hi < 0 || hi >= g->H || wi < 0 || wi >= g->W) continue;
                        double t = x[IX4(n, gi * Cg + c, hi, wi, g->C, g->H, g->W)] *
                                   w[IX4(o, c, i, j, Cg, g->kh, g->kw)];
                        s += t;
                        sa += fabs(t);
                     }
               const int64_t k = IX4(n, o, ho, wo, g->O, g->Ho, g->Wo);
               if (res) {
                  s += res[k];
                  sa += fabs(res[k]);
               }
               if (relu && s < 0) s = 0;
               y[k] = s;
               yabs[k] = sa;
            }
}

static void ref_backward(const geom *g, const double *x, const double *w, const double *gy,
                         double *gx, double *gxa, double *gw, double *gwa, double *gb,
                         double *gba) {
   const int64_t Cg = g->C / g->G, Og = g->O / g->G;
   memset(gx, 0, sizeof(double) * (size_t)(g->N * g->C * g->H * g->W));
   memset(gxa, 0, sizeof(double) * (size_t)(g->N * g->C * g->H * g->W));
   memset(gw, 0, sizeof(double) * (size_t)(g->O * Cg * g->kh * g->kw));
   memset(gwa, 0, sizeof(double) * (size_t)(g->O * Cg * g->kh * g->kw));
   memset(gb, 0, sizeof(double) * (size_t)g->O);
   memset(gba, 0, sizeof(double) * (size_t)g->O);
   for (int64_t n = 0; n < g->N; n++)
      for (int64_t o = 0; o < g->O; o++)
         for (int64_t ho = 0; ho < g->Ho; ho++)
            for (int64_t wo = 0; wo < g->Wo; wo++) {
               const double d = gy[IX4(n, o, ho, wo, g->O, g->Ho, g->Wo)];
               gb[o] += d;
               gba[o] += fabs(d);
               const int64_t gi = o / Og;
               for (int64_t c = 0; c < Cg; c++)
                  for (int64_t i = 0; i < g->kh; i++)
                     for (int64_t j = 0; j < g->kw; j++) {
                        int64_t hi = ho * g->sh - g->ph + i * g->dh;
                        int64_t wi = wo * g->sw - g->pw + j * g->dw;
                        if (hi < 0 || hi >= g->H || wi < 0 || wi >= g->W) continue;
                        const int64_t xk = IX4(n, gi * Cg + c, hi, wi, g->C, g->H, g->W);
                        const int64_t wk = IX4(o, c, i, j, Cg, g->kh, g->kw);
                        gx[xk] += d * w[wk];
                        gxa[xk] += fabs(d * w[wk]);
                        gw[wk] += d * x[xk];
                        gwa[wk] += fabs(d * x[xk]);
                     }
            }
}

/* compare a result tensor with the reference; returns 1 when every element is within tolerance */
static int compare(const lm_tensor *t, const double *ref, const double *mag, double rtol,
                   const char *what, const char *ctx) {
   const int64_t n = t->numel;
   double *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
   to_array(t, a);
   int ok = 1;
   for (int64_t i = 0; i < n; i++) {
      double tol = rtol * (mag[i] + fabs(ref[i])) + 1e-300;
      if (!(fabs(a[i] - ref[i]) <= tol)) {
         printf("  %s %s: element %lld got %.17g expected %.17g (tol %.3g)\n", ctx, what,
                (long long)i, a[i], ref[i], tol);
         ok = 0;
         break;
      }
   }
   free(a);
   return ok;
}

static int format_of(const lm_tensor *t, int fmt) { return lm_is_contiguous(t, fmt); }

/* one geometry: forward + backward, both formats, both dtypes, a few input layouts */
static void run_case(const geom *g0, int with_bias, int relu, int with_res, int layout_x,
                     int layout_w) {
   geom g = *g0;
   int64_t ohw[2];
   const int64_t st[2] = {g.sh, g.sw}, pd[2] = {g.ph, g.pw}, dl[2] = {g.dh, g.dw};
   const int64_t in_hw[2] = {g.H, g.W}, k_hw[2] = {g.kh, g.kw};
   must(lm_conv2d_output_size(in_hw, k_hw, st, pd, dl, ohw), "output size");
   g.Ho = ohw[0];
   g.Wo = ohw[1];
   const int64_t Cg = g.C / g.G;
   const int64_t xs[4] = {g.N, g.C, g.H, g.W}, ws[4] = {g.O, Cg, g.kh, g.kw};
   const int64_t ys[4] = {g.N, g.O, g.Ho, g.Wo};
   const int64_t nx = numel_of(4, xs), nw = numel_of(4, ws), ny = numel_of(4, ys);
   double *x = rand_array(nx), *w = rand_array(nw), *b = rand_array(g.O), *r = rand_array(ny);
   double *gy = rand_array(ny);
   double *y = malloc(sizeof(double) * (size_t)(ny + 1)), *ya = malloc(sizeof(double) * (size_t)(ny + 1));
   double *gx = malloc(sizeof(double) * (size_t)(nx + 1)), *gxa = malloc(sizeof(double) * (size_t)(nx + 1));
   double *gw = malloc(sizeof(double) * (size_t)(nw + 1)), *gwa = malloc(sizeof(double) * (size_t)(nw + 1));
   double *gb = malloc(sizeof(double) * (size_t)(g.O + 1)), *gba = malloc(sizeof(double) * (size_t)(g.O + 1));
   ref_forward(&g, x, w, with_bias ? b : NULL, with_res ? r : NULL, relu, y, ya);
   ref_backward(&g, x, w, gy, gx, gxa, gw, gwa, gb, gba);
   char ctx[400];
   for (int dt = 0; dt < (g_f32_nhwc_only ? 1 : 2); dt++) {
      const int dtype = dt ? LM_FLOAT64 : LM_FLOAT32;
      const double rtol = dt ? 1e-10 : 1e-4;
      tens tx = make4(xs, dtype, layout_x, x), tw = make4(ws, dtype, layout_w, w);
      tens tb = make1(g.O, dtype, layout_x & 1, b);
      tens tr = make4(ys, dtype, (layout_x + 1) % L_NUM, r);
      tens tg = make4(ys, dtype, (layout_w + 2) % L_NUM, gy);
      for (int f = g_f32_nhwc_only ? 1 : 0; f < 2; f++) {
         const int fmt = f ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
         snprintf(ctx, sizeof ctx,
                  "[%s %s x=%s w=%s N%lld C%lld H%lld W%lld O%lld k%lldx%lld s%lld,%lld "
                  "p%lld,%lld d%lld,%lld g%lld bias%d relu%d res%d%s%s%s%s]",
                  dt ? "f64" : "f32", f ? "NHWC" : "NCHW", layout_name[layout_x],
                  layout_name[layout_w], (long long)g.N, (long long)g.C, (long long)g.H,
                  (long long)g.W, (long long)g.O, (long long)g.kh, (long long)g.kw,
                  (long long)g.sh, (long long)g.sw, (long long)g.ph, (long long)g.pw,
                  (long long)g.dh, (long long)g.dw, (long long)g.G, with_bias, relu, with_res,
                  !getenv("LUMEN_CONV_WINOGRAD")          ? ""
                  : getenv("LUMEN_CONV_WINOGRAD")[0] == '0' ? " winograd off"
                  : getenv("LUMEN_CONV_WINOGRAD")[0] == '2' ? " winograd F2"
                                                            : " winograd F4",
                  getenv("LUMEN_CONV_RB") ? " rb off" : "",
                  getenv("LUMEN_CONV_PW") ? " pw off" : "",
                  getenv("LUMEN_CONV_STREAM") ? " stream" : "");
         lm_tensor *out = NULL;
         lm_status s = lm_conv2d(tx.t, tw.t, with_bias ? tb.t : NULL, st, pd, dl, g.G, fmt, relu,
                                 with_res ? tr.t : NULL, &out);
         CHECK(s == LM_OK, "%s forward failed: %s", ctx, lm_last_error());
         if (s == LM_OK) {
            CHECK(out->ndim == 4 && out->sizes[0] == g.N && out->sizes[1] == g.O &&
                     out->sizes[2] == g.Ho && out->sizes[3] == g.Wo,
                  "%s forward shape", ctx);
            CHECK(format_of(out, fmt), "%s forward output not dense in the format", ctx);
            CHECK(compare(out, y, ya, rtol, "forward", ctx), "%s forward values", ctx);
            lm_tensor_free(out);
         }
         lm_tensor *dx = NULL, *dw = NULL, *db = NULL;
         s = lm_conv2d_backward(tx.t, tw.t, tg.t, st, pd, dl, g.G, fmt, &dx, &dw, &db);
         CHECK(s == LM_OK, "%s backward failed: %s", ctx, lm_last_error());
         if (s == LM_OK) {
            CHECK(format_of(dx, fmt) && format_of(dw, fmt), "%s grad formats", ctx);
            CHECK(dx->sizes[0] == g.N && dx->sizes[1] == g.C && dx->sizes[2] == g.H &&
                     dx->sizes[3] == g.W, "%s grad_x shape", ctx);
            CHECK(db->ndim == 1 && db->sizes[0] == g.O, "%s grad_b shape", ctx);
            CHECK(compare(dx, gx, gxa, rtol, "grad_x", ctx), "%s grad_x values", ctx);
            CHECK(compare(dw, gw, gwa, rtol, "grad_w", ctx), "%s grad_w values", ctx);
            CHECK(compare(db, gb, gba, rtol, "grad_b", ctx), "%s grad_b values", ctx);
            lm_tensor_free(dx);
            lm_tensor_free(dw);
            lm_tensor_free(db);
         }
      }
      tens_free(&tx);
      tens_free(&tw);
      tens_free(&tb);
      tens_free(&tr);
      tens_free(&tg);
   }
   free(x); free(w); free(b); free(r); free(gy); free(y); free(ya);
   free(gx); free(gxa); free(gw); free(gwa); free(gb); free(gba);
}

static geom mk(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh, int64_t kw,
               int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
               int64_t G) {
   geom g = {N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, G, 0, 0};
   return g;
}

static void fixed_cases(void) {
   /* pointwise (GEMM in place), strided pointwise (ResNet downsample) */
   run_case((geom[]){mk(2, 17, 7, 7, 33, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CONTIG, L_CONTIG);
   run_case((geom[]){mk(2, 64, 7, 7, 64, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   /* 3x3 / pad 1, stride 1 and 2 */
   run_case((geom[]){mk(2, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 0, L_CL, L_CONTIG);
   run_case((geom[]){mk(3, 7, 9, 8, 17, 3, 3, 2, 2, 1, 1, 1, 1, 1)}, 1, 0, 1, L_NONDENSE,
            L_PERMUTED);
   /* the 7x7/2 stem on 3 channels */
   run_case((geom[]){mk(1, 3, 15, 16, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1)}, 0, 1, 0, L_CONTIG, L_CL);
   /* grouped (ResNeXt-like), depthwise, depthwise with a channel multiplier */
   run_case((geom[]){mk(2, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 32)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(2, 64, 7, 7, 64, 3, 3, 2, 2, 1, 1, 1, 1, 32)}, 1, 0, 0, L_CL, L_CONTIG);
   run_case((geom[]){mk(2, 17, 7, 9, 17, 3, 3, 1, 1, 1, 1, 1, 1, 17)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(2, 17, 7, 9, 17, 3, 3, 2, 2, 1, 1, 1, 1, 17)}, 1, 0, 0, L_CONTIG,
            L_CONTIG);
   run_case((geom[]){mk(2, 7, 9, 7, 14, 5, 3, 2, 1, 2, 1, 2, 1, 7)}, 1, 0, 1, L_NONDENSE_CL,
            L_CL);
   /* asymmetric everything */
   run_case((geom[]){mk(2, 6, 9, 11, 4, 3, 2, 1, 2, 0, 2, 2, 1, 2)}, 1, 1, 1, L_PERMUTED,
            L_NONDENSE);
   run_case((geom[]){mk(1, 4, 7, 7, 6, 2, 3, 2, 1, 2, 0, 1, 2, 2)}, 0, 0, 0, L_CL, L_NONDENSE_CL);
   /* padding larger than the dilated kernel (negative padding in the transposed form) */
   run_case((geom[]){mk(2, 3, 2, 2, 5, 1, 1, 1, 1, 2, 1, 1, 1, 1)}, 1, 0, 0, L_CONTIG, L_CONTIG);
   run_case((geom[]){mk(2, 3, 2, 3, 5, 2, 1, 1, 1, 2, 2, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   /* 1x1 spatial, single channel */
   run_case((geom[]){mk(3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CONTIG, L_CL);
   run_case((geom[]){mk(2, 1, 1, 2, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1)}, 1, 0, 1, L_CL, L_CONTIG);
   /* bigger: several tiles, several threads, col2im bands */
   run_case((geom[]){mk(2, 17, 23, 25, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(2, 17, 23, 25, 33, 3, 3, 2, 2, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CONTIG,
            L_CONTIG);
   run_case((geom[]){mk(1, 32, 30, 30, 32, 3, 3, 2, 2, 2, 2, 2, 2, 1)}, 1, 0, 0, L_CL, L_CL);
   run_case((geom[]){mk(1, 64, 28, 28, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(2, 32, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32)}, 1, 1, 0, L_CL, L_CL);
   run_case((geom[]){mk(2, 32, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32)}, 1, 0, 1, L_CONTIG,
            L_CONTIG);
   run_case((geom[]){mk(2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 8)}, 1, 1, 0, L_CL, L_CL);
   /* wide rows (row-by-row blocks in the NHWC kernels), with and without padding */
   run_case((geom[]){mk(1, 8, 5, 70, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(1, 20, 4, 66, 72, 3, 5, 1, 1, 1, 2, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   run_case((geom[]){mk(1, 16, 4, 80, 16, 3, 3, 1, 2, 0, 0, 1, 2, 2)}, 0, 0, 1, L_CL, L_CONTIG);
}

static void random_cases(int count) {
   static const int64_t chans[] = {1, 3, 7, 17, 64, 2, 4, 6};
   static const int64_t spat[] = {1, 2, 7, 5, 9};
   for (int it = 0; it < count; it++) {
      geom g;
      g.N = 1 + (int64_t)(rnd_u64() % 3);
      g.C = rnd_pick(chans, 8);
      g.H = rnd_pick(spat, 5);
      g.W = rnd_pick(spat, 5);
      const int gk = (int)(rnd_u64() % 3);
      if (gk == 1 && g.C % 2 == 0) {
         g.G = 2;
      } else if (gk == 2 && g.C > 1) {
         g.G = g.C;
      } else {
         g.G = 1;
      }
      g.O = rnd_pick(chans, 5);
      if (g.G == g.C && g.G > 1)
         g.O = g.C * (1 + (int64_t)(rnd_u64() % 2));
      else if (g.O % g.G)
         g.O = g.G * (1 + (int64_t)(rnd_u64() % 3));
      g.sh = 1 + (int64_t)(rnd_u64() % 2);
      g.sw = 1 + (int64_t)(rnd_u64() % 2);
      g.ph = (int64_t)(rnd_u64() % 3);
      g.pw = (int64_t)(rnd_u64() % 3);
      g.dh = 1 + (int64_t)(rnd_u64() % 2);
      g.dw = 1 + (int64_t)(rnd_u64() % 2);
      g.kh = 1 + (int64_t)(rnd_u64() % 3);
      g.kw = 1 + (int64_t)(rnd_u64() % 3);
      while (g.kh > 1 && g.dh * (g.kh - 1) + 1 > g.H + 2 * g.ph) g.kh--;
      while (g.kw > 1 && g.dw * (g.kw - 1) + 1 > g.W + 2 * g.pw) g.kw--;
      run_case(&g, (int)(rnd_u64() % 2), (int)(rnd_u64() % 2), (int)(rnd_u64() % 2),
               (int)(rnd_u64() % L_NUM), (int)(rnd_u64() % L_NUM));
   }
}

/* ---- the float32 channels-last algorithms: register-blocked kernels for small channel counts
 * (rows of 14+ pixels; channels 1, 5..8, 11..16, 22..32, 44..64), Winograd F(4x4,3x3) for 3x3
 * stride 1 (channels 11..64 padded to 16/32/64, 96..128 to 128 for forward and backward data,
 * maps of 4+ pixels), the single-channel weight
 * gradient. Each geometry runs with every algorithm that takes it (LUMEN_CONV_WINOGRAD=0 and
 * LUMEN_CONV_RB=0 switch them off) against the double reference. ---- */
static void run_case_algos(const geom *g, int with_bias, int relu, int with_res, int lx, int lw) {
   /* Winograd F(2x2,3x3) / F(4x4,3x3) (the default), the pointwise kernels with streaming stores
      forced on (every size), then the direct kernels (register-blocked, then the general ones) */
   static const char *const envs[5][5] = {{"2", NULL, NULL, NULL, NULL},
                                          {"4", NULL, NULL, NULL, NULL},
                                          {"0", NULL, NULL, "1", NULL},
                                          {"0", NULL, "0", NULL, NULL},
                                          {"0", "0", "0", NULL, "0"}};
   static const char *const names[5] = {"LUMEN_CONV_WINOGRAD", "LUMEN_CONV_RB", "LUMEN_CONV_PW",
                                        "LUMEN_CONV_STREAM", "LUMEN_CONV_NC"};
   g_f32_nhwc_only = 1;
   for (int e = 0; e < 5; e++) {
      for (int k = 0; k < 5; k++)
         if (envs[e][k]) setenv(names[k], envs[e][k], 1);
      run_case(g, with_bias, relu, with_res, lx, lw);
      for (int k = 0; k < 5; k++) unsetenv(names[k]);
   }
   g_f32_nhwc_only = 0;
}

/* cases() as it is, then with the switch `env` set to 0 (the kernels it leaves out) */
static void with_and_without(const char *env, void (*cases)(void)) {
   for (int off = 0; off < 2; off++) {
      if (off) setenv(env, "0", 1);
      cases();
      unsetenv(env);
   }
}

static void bwdw_gemm_cases(void) {
   run_case_algos((geom[]){mk(2, 1024, 3, 2, 512, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 0, 0, L_CL,
                  L_CL);
   run_case_algos((geom[]){mk(1, 520, 2, 3, 1009, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 0, 1, 1,
                  L_NONDENSE_CL, L_CL);
   /* strided (a ResNet downsample): the pixels gathered first; odd map sizes */
   run_case_algos((geom[]){mk(2, 1024, 5, 4, 512, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 1, 0, 0, L_CL,
                  L_CL);
   run_case_algos((geom[]){mk(1, 600, 7, 6, 900, 1, 1, 2, 3, 0, 0, 1, 1, 1)}, 0, 0, 0,
                  L_NONDENSE_CL, L_CL);
}

/* the narrow-input kernel (2..4 channels, dilation 1: an RGB stem): kernel rows cut at the top
   and bottom, column padding, strides 1..3, output channels of part vectors and several
   blocks, rows of 1..15 pixels (every tile width), every epilogue; against the double reference
   and the direct kernel (the last configuration of run_case_algos turns it off) */
static void narrow_cases(void) {
   run_case_algos((geom[]){mk(2, 3, 30, 29, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1)}, 1, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 3, 9, 15, 100, 7, 7, 2, 2, 3, 3, 1, 1, 1)}, 1, 0, 1, L_CL,
                  L_NONDENSE_CL);
   run_case_algos((geom[]){mk(2, 2, 6, 13, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 1, 1,
                  L_NONDENSE_CL, L_CL);
   run_case_algos((geom[]){mk(1, 4, 11, 40, 40, 5, 3, 3, 2, 2, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(3, 3, 4, 5, 17, 2, 4, 1, 3, 0, 2, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 4, 3, 3, 300, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   for (int64_t wd = 1; wd <= 15; wd++)
      run_case_algos((geom[]){mk(1, 3, 5, wd, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, (int)(wd % 2),
                     (int)(wd % 3 == 0), (int)(wd % 4 == 1), L_CL, L_CL);
}

static void pw_strided_cases(void) {
   run_case_algos((geom[]){mk(2, 17, 9, 11, 40, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(3, 64, 7, 5, 256, 1, 1, 2, 1, 0, 0, 1, 1, 1)}, 0, 1, 0,
                  L_NONDENSE_CL, L_CL);
   run_case_algos((geom[]){mk(1, 5, 4, 4, 3, 1, 1, 3, 3, 0, 0, 1, 1, 1)}, 1, 0, 1, L_CL, L_CL);
}

/* ---- the pointwise kernels (1x1, stride 1, no padding): channel counts 1..80 on both sides
 * (partial vectors, one or two output blocks), maps of 1, 2 and 7 pixels a side (tiles cut
 * short, runs across images), every epilogue; forward and backward data, each algorithm ---- */
static void pointwise_cases(void) {
   static const int64_t cin[] = {1, 3, 7, 17, 64, 128};
   static const int64_t cout[] = {1, 7, 17, 64, 80, 256};
   static const int64_t spat[] = {1, 2, 7};
   int k = 0;
   for (int a = 0; a < 6; a++)
      for (int b = 0; b < 6; b++)
         for (int c = 0; c < 3; c++, k++) {
            const int64_t n = spat[c] == 7 ? 1 + k % 2 : 3;
            run_case_algos((geom[]){mk(n, cin[a], spat[c], spat[c], cout[b], 1, 1, 1, 1, 0, 0, 1,
                                       1, 1)},
                           k % 2, (k / 2) % 2, (k / 4) % 2, k % 3 ? L_CL : L_NONDENSE_CL, L_CL);
         }
   /* the weight gradient as one product (O * C >= 512K: conv_direct_f32_avx512.c's
      pw_gemm_usable), with and without the bias gradient, odd channel counts, and the direct
      kernel on the same shapes (LUMEN_CONV_BWDW_GEMM=0) */
   with_and_without("LUMEN_CONV_BWDW_GEMM", bwdw_gemm_cases);
   /* strided forward through the pointwise kernel (its input pixels gathered first): every
      epilogue, odd channel counts and maps, unequal strides; LUMEN_CONV_PW_STRIDED=0 and the
      algorithm switches give the direct kernels the same shapes */
   with_and_without("LUMEN_CONV_PW_STRIDED", pw_strided_cases);
   /* the benchmark's shape on a small map: full 6 x 64 tiles, streaming stores by default */
   run_case_algos((geom[]){mk(2, 64, 7, 9, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 64, 7, 9, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
}

static void algo_cases(int random_count) {
   /* the small ResNet's layers at batch 2 (Fashion-MNIST: 28x28, width 16) */
   run_case_algos((geom[]){mk(2, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 16, 28, 28, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 16, 28, 28, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 32, 14, 14, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1)}, 0, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 32, 14, 14, 64, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   /* Winograd: partial tiles, padding 0 and 2, channel padding, several output blocks */
   run_case_algos((geom[]){mk(1, 12, 9, 10, 80, 3, 3, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(3, 48, 6, 5, 7, 3, 3, 1, 1, 2, 1, 1, 1, 1)}, 1, 0, 0, L_NONDENSE_CL,
                  L_CONTIG);
   run_case_algos((geom[]){mk(1, 64, 13, 4, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1)}, 0, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 17, 16, 16, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   /* Winograd over more than 64 channels (chunks of 64, padded to 128): forward with 96, 100,
      120 and 128 input channels, partial tiles and every epilogue; backward data with 128
      output channels; 95 and 130 input channels (too much padding) take the direct kernels, and
      so does 128 -> 200 with F(2x2) (transformed weights past the unit schedule's cap; F(4x4)
      takes the wide schedule) */
   run_case_algos((geom[]){mk(1, 96, 9, 10, 80, 3, 3, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 128, 7, 7, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 120, 6, 13, 33, 3, 3, 1, 1, 2, 1, 1, 1, 1)}, 0, 0, 1,
                  L_NONDENSE_CL, L_CONTIG);
   run_case_algos((geom[]){mk(2, 24, 8, 8, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 130, 5, 6, 100, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 100, 6, 7, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 95, 6, 7, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 128, 5, 5, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 0, 0, L_CL, L_CL);
   /* Winograd's wide schedule (threads split the output blocks, weights transformed block by
      block; LUMEN_CONV_WINOGRAD=4 forces it at every size): resnet50's 256 and 512 channels at
      7x7 and 14x14, 160 and 320 (channel padding, partial output blocks), odd maps, padding 0..2,
      every epilogue; backward data with 96..512 reduction channels; the weight gradient over
      more than 64 input channels (wg_bwdw_wide) */
   run_case_algos((geom[]){mk(2, 256, 7, 7, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 160, 14, 14, 160, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 320, 9, 11, 96, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 96, 13, 6, 320, 3, 3, 1, 1, 2, 0, 1, 1, 1)}, 1, 1, 0,
                  L_NONDENSE_CL, L_CONTIG);
   run_case_algos((geom[]){mk(3, 200, 5, 7, 170, 3, 3, 1, 1, 0, 1, 1, 1, 1)}, 0, 0, 1, L_CL, L_CL);
   /* register-blocked: every padded channel count, strides, dilation, odd widths, 5x5 */
   run_case_algos((geom[]){mk(1, 7, 15, 29, 9, 3, 3, 1, 2, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 3, 16, 30, 17, 5, 5, 2, 1, 2, 2, 1, 2, 1)}, 0, 0, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 64, 16, 31, 33, 3, 3, 2, 2, 1, 0, 2, 1, 1)}, 1, 0, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 1, 17, 33, 70, 5, 3, 1, 2, 2, 1, 1, 1, 1)}, 1, 1, 0, L_CL, L_CL);
   run_case_algos((geom[]){mk(2, 26, 15, 28, 8, 2, 3, 2, 2, 0, 1, 1, 2, 1)}, 0, 0, 0, L_CL, L_CL);
   /* pointwise read in place, pointwise stride 2 (grad_input's odd phases are zero) */
   run_case_algos((geom[]){mk(1, 32, 3, 20, 48, 1, 1, 1, 1, 0, 0, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case_algos((geom[]){mk(1, 16, 5, 29, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   /* random geometries with rows wide enough for these kernels */
   static const int64_t chans[] = {1, 3, 7, 12, 16, 17, 32, 48, 64, 112};
   static const int64_t spat[] = {4, 7, 14, 15, 28, 30};
   for (int it = 0; it < random_count; it++) {
      geom g;
      g.N = 1 + (int64_t)(rnd_u64() % 2);
      g.C = rnd_pick(chans, 10);
      g.O = rnd_pick(chans, 10);
      g.H = rnd_pick(spat, 6);
      g.W = rnd_pick(spat, 6);
      g.G = 1;
      const int wino = (int)(rnd_u64() % 2);
      g.kh = g.kw = wino ? 3 : 1 + (int64_t)(rnd_u64() % 3);
      g.sh = wino ? 1 : 1 + (int64_t)(rnd_u64() % 2);
      g.sw = wino ? 1 : 1 + (int64_t)(rnd_u64() % 2);
      g.ph = (int64_t)(rnd_u64() % 3);
      g.pw = (int64_t)(rnd_u64() % 3);
      g.dh = wino ? 1 : 1 + (int64_t)(rnd_u64() % 2);
      g.dw = wino ? 1 : 1 + (int64_t)(rnd_u64() % 2);
      while (g.kh > 1 && g.dh * (g.kh - 1) + 1 > g.H + 2 * g.ph) g.kh--;
      while (g.kw > 1 && g.dw * (g.kw - 1) + 1 > g.W + 2 * g.pw) g.kw--;
      run_case_algos(&g, (int)(rnd_u64() % 2), (int)(rnd_u64() % 2), (int)(rnd_u64() % 2),
                     (int)(rnd_u64() % 2) ? L_CL : L_NONDENSE_CL, L_CL);
   }
}

/* Winograd over many tiles: the 16-channel layer at batch 8 and the 64-channel 56x56 shape, the
   weight gradient summed over 1568 / 196 tiles, within the float32 tolerance, both tile sizes */
static void winograd_accuracy_cases(void) {
   g_f32_nhwc_only = 1;
   for (int e = 0; e < 2; e++) {
      setenv("LUMEN_CONV_WINOGRAD", e ? "4" : "2", 1);
      run_case((geom[]){mk(8, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
      run_case((geom[]){mk(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 0, 0, 1, L_CL, L_CL);
      run_case((geom[]){mk(2, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 0, L_CL, L_CL);
   }
   /* the wide schedule over many tiles: resnet50's 256-channel 14x14 layer at batch 4, 512 at
      7x7 at batch 4 (F(4x4) only: F(2x2) keeps the unit schedule, which refuses them) */
   setenv("LUMEN_CONV_WINOGRAD", "4", 1);
   run_case((geom[]){mk(4, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 1, 1, L_CL, L_CL);
   run_case((geom[]){mk(4, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1)}, 1, 0, 1, L_CL, L_CL);
   unsetenv("LUMEN_CONV_WINOGRAD");
   g_f32_nhwc_only = 0;
}

/* ---- memory-format decision, out=, partial gradients ---- */
static void format_cases(void) {
   const int64_t xs[4] = {2, 4, 5, 5}, ws[4] = {6, 4, 3, 3};
   const int64_t one[2] = {1, 1};
   for (int dt = 0; dt < 2; dt++) {
      const int dtype = dt ? LM_FLOAT64 : LM_FLOAT32;
      double *xv = rand_array(200), *wv = rand_array(216);
      for (int lx = 0; lx < 2; lx++)
         for (int lw = 0; lw < 2; lw++) {
            tens tx = make4(xs, dtype, lx ? L_CL : L_CONTIG, xv);
            tens tw = make4(ws, dtype, lw ? L_CL : L_CONTIG, wv);
            const int want = (lx || lw) ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
            CHECK(lm_conv_memory_format(tx.t, tw.t) == want, "format rule x=%d w=%d", lx, lw);
            lm_tensor *y = NULL;
            CHECK(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_PRESERVE, 0, NULL, &y) ==
                     LM_OK, "auto format conv: %s", lm_last_error());
            if (y) {
               CHECK(lm_suggest_memory_format(y, 0) == want, "auto output format x=%d w=%d", lx,
                     lw);
               lm_tensor *dx = NULL, *dw = NULL;
               CHECK(lm_conv2d_backward(tx.t, tw.t, y, NULL, one, NULL, 1, -1, &dx, &dw, NULL) ==
                        LM_OK, "auto format backward: %s", lm_last_error());
               if (dx) {
                  CHECK(lm_is_contiguous(dx, want) && lm_is_contiguous(dw, want),
                        "auto gradient format");
                  lm_tensor_free(dx);
                  lm_tensor_free(dw);
               }
               lm_tensor_free(y);
            }
            tens_free(&tx);
            tens_free(&tw);
         }
      /* depthwise weight (C,1,3,3) restrided to channels-last suggests channels-last */
      {
         const int64_t dws[4] = {4, 1, 3, 3}, dwcl[4] = {9, 1, 3, 1};
         lm_tensor *wt = NULL;
         must(lm_empty_strided(4, dws, dwcl, dtype, LM_CPU, &wt), "empty_strided");
         tens tx = make4(xs, dtype, L_CONTIG, xv);
         CHECK(lm_conv_memory_format(tx.t, wt) == LM_CHANNELS_LAST, "depthwise weight tag");
         tens_free(&tx);
         lm_tensor_free(wt);
      }
      /* out= tensors: a dense one is written in place, a non-dense one through a copy */
      {
         tens tx = make4(xs, dtype, L_CL, xv), tw = make4(ws, dtype, L_CL, wv);
         const int64_t ys[4] = {2, 6, 5, 5};
         lm_tensor *ref = NULL;
         must(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_CHANNELS_LAST, 1, NULL, &ref),
              "conv");
         double *rv = malloc(sizeof(double) * 300), *ov = malloc(sizeof(double) * 300);
         to_array(ref, rv);
         for (int layout = 0; layout < L_NUM; layout++) {
            tens to = make4(ys, dtype, layout, NULL);
            lm_tensor *o = to.t;
            lm_status s = lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_CHANNELS_LAST, 1,
                                    NULL, &o);
            CHECK(s == LM_OK && o == to.t, "out= (%s): %s", layout_name[layout], lm_last_error());
            to_array(to.t, ov);
            int same = 1;
            for (int i = 0; i < 300; i++) same &= ov[i] == rv[i];
            CHECK(same, "out= (%s) values", layout_name[layout]);
            tens_free(&to);
         }
         /* wrong out= shape */
         {
            const int64_t bad[4] = {2, 6, 5, 4};
            tens to = make4(bad, dtype, L_CONTIG, NULL);
            lm_tensor *o = to.t;
            CHECK(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, -1, 0, NULL, &o) ==
                     LM_ERR_SHAPE, "out= with a wrong shape is an error");
            tens_free(&to);
         }
         /* the residual may be the out= tensor itself (out = relu(conv + out)) */
         {
            tens to = make4(ys, dtype, L_CL, NULL);
            double *r0 = rand_array(300);
            from_array(to.t, r0);
            lm_tensor *plain = NULL;
            must(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_CHANNELS_LAST, 0, NULL,
                           &plain), "conv");
            to_array(plain, rv);
            lm_tensor *o = to.t;
            CHECK(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_CHANNELS_LAST, 1, to.t,
                            &o) == LM_OK, "residual aliasing out=: %s", lm_last_error());
            to_array(to.t, ov);
            int same = 1;
            for (int i = 0; i < 300; i++) {
               double e = rv[i] + r0[i];
               e = e < 0 ? 0 : e;
               same &= fabs(ov[i] - e) <= 1e-5 * (1 + fabs(e));
            }
            CHECK(same, "residual aliasing out= values");
            free(r0);
            lm_tensor_free(plain);
            tens_free(&to);
         }
         /* only some gradients */
         {
            lm_tensor *dw = NULL, *db = NULL;
            CHECK(lm_conv2d_backward(tx.t, tw.t, ref, NULL, one, NULL, 1, LM_CHANNELS_LAST, NULL,
                                     &dw, &db) == LM_OK && dw && db, "grad_w + grad_b only");
            lm_tensor *dx = NULL;
            CHECK(lm_conv2d_backward(tx.t, tw.t, ref, NULL, one, NULL, 1, LM_CONTIGUOUS, &dx,
                                     NULL, NULL) == LM_OK && dx &&
                     lm_is_contiguous(dx, LM_CONTIGUOUS), "grad_x only");
            if (dw) lm_tensor_free(dw);
            if (db) lm_tensor_free(db);
            if (dx) lm_tensor_free(dx);
         }
         free(rv);
         free(ov);
         lm_tensor_free(ref);
         tens_free(&tx);
         tens_free(&tw);
      }
      free(xv);
      free(wv);
   }
}

/* ---- the same inputs give bit-identical results (no run-to-run variation in the sums) ---- */
static void repeat_cases(void) {
   const int64_t xs[4] = {4, 32, 20, 20}, ws[4] = {32, 32, 3, 3}, one[2] = {1, 1};
   double *xv = rand_array(4 * 32 * 400), *wv = rand_array(32 * 32 * 9);
   for (int f = 0; f < 2; f++) {
      const int fmt = f ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
      tens tx = make4(xs, LM_FLOAT32, f ? L_CL : L_CONTIG, xv);
      tens tw = make4(ws, LM_FLOAT32, f ? L_CL : L_CONTIG, wv);
      lm_tensor *y[2] = {NULL, NULL}, *dw[2] = {NULL, NULL}, *dx[2] = {NULL, NULL};
      for (int r = 0; r < 2; r++) {
         must(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, fmt, 0, NULL, &y[r]), "conv");
         must(lm_conv2d_backward(tx.t, tw.t, y[0], NULL, one, NULL, 1, fmt, &dx[r], &dw[r], NULL),
              "conv backward");
      }
      CHECK(!memcmp(lm_tensor_data(y[0]), lm_tensor_data(y[1]), (size_t)y[0]->numel * 4) &&
               !memcmp(lm_tensor_data(dx[0]), lm_tensor_data(dx[1]), (size_t)dx[0]->numel * 4) &&
               !memcmp(lm_tensor_data(dw[0]), lm_tensor_data(dw[1]), (size_t)dw[0]->numel * 4),
            "repeated calls give identical results (%s)", f ? "NHWC" : "NCHW");
      for (int r = 0; r < 2; r++) {
         lm_tensor_free(y[r]);
         lm_tensor_free(dx[r]);
         lm_tensor_free(dw[r]);
      }
      tens_free(&tx);
      tens_free(&tw);
   }
   free(xv);
   free(wv);
}

/* ---- each gradient alone (the others not requested), every path ---- */
static void partial_grad_cases(void) {
   const int64_t one[2] = {1, 1};
   static const int64_t shapes[][3] = {{6, 6, 1}, {6, 6, 6}, {6, 12, 3}}; /* C, O, groups */
   for (int sh = 0; sh < 3; sh++)
      for (int dt = 0; dt < 2; dt++)
         for (int f = 0; f < 2; f++) {
            const int dtype = dt ? LM_FLOAT64 : LM_FLOAT32, fmt = f ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
            const int64_t C = shapes[sh][0], O = shapes[sh][1], G = shapes[sh][2];
            const int64_t xs[4] = {2, C, 5, 5}, ws[4] = {O, C / G, 3, 3}, ys[4] = {2, O, 5, 5};
            double *xv = rand_array(2 * C * 25), *wv = rand_array(O * (C / G) * 9);
            double *gv = rand_array(2 * O * 25);
            tens tx = make4(xs, dtype, f ? L_CL : L_CONTIG, xv);
            tens tw = make4(ws, dtype, f ? L_CL : L_CONTIG, wv);
            tens tg = make4(ys, dtype, f ? L_CL : L_CONTIG, gv);
            lm_tensor *ax = NULL, *aw = NULL, *ab = NULL;
            must(lm_conv2d_backward(tx.t, tw.t, tg.t, NULL, one, NULL, G, fmt, &ax, &aw, &ab),
                 "backward");
            lm_tensor *bx = NULL, *bw = NULL, *bb = NULL;
            int ok = lm_conv2d_backward(tx.t, tw.t, tg.t, NULL, one, NULL, G, fmt, &bx, NULL,
                                        NULL) == LM_OK;
            ok = ok && lm_conv2d_backward(tx.t, tw.t, tg.t, NULL, one, NULL, G, fmt, NULL, &bw,
                                          NULL) == LM_OK;
            ok = ok && lm_conv2d_backward(tx.t, tw.t, tg.t, NULL, one, NULL, G, fmt, NULL, NULL,
                                          &bb) == LM_OK;
            CHECK(ok, "single gradients (C%lld O%lld g%lld %s %s): %s", (long long)C,
                  (long long)O, (long long)G, dt ? "f64" : "f32", f ? "NHWC" : "NCHW",
                  lm_last_error());
            if (ok) {
               const int es = dt ? 8 : 4;
               CHECK(!memcmp(lm_tensor_data(ax), lm_tensor_data(bx), (size_t)(ax->numel * es)) &&
                        !memcmp(lm_tensor_data(aw), lm_tensor_data(bw), (size_t)(aw->numel * es)) &&
                        !memcmp(lm_tensor_data(ab), lm_tensor_data(bb), (size_t)(ab->numel * es)),
                     "single gradients equal the joint ones (C%lld O%lld g%lld %s %s)",
                     (long long)C, (long long)O, (long long)G, dt ? "f64" : "f32",
                     f ? "NHWC" : "NCHW");
            }
            lm_tensor *ts[6] = {ax, aw, ab, bx, bw, bb};
            for (int k = 0; k < 6; k++)
               if (ts[k]) lm_tensor_free(ts[k]);
            tens_free(&tx);
            tens_free(&tw);
            tens_free(&tg);
            free(xv);
            free(wv);
            free(gv);
         }
}

/* ---- empty tensors ---- */
static void empty_cases(void) {
   const int64_t one[2] = {1, 1};
   /* N = 0 */
   {
      const int64_t xs[4] = {0, 3, 5, 5}, ws[4] = {4, 3, 3, 3};
      tens tx = make4(xs, LM_FLOAT32, L_CONTIG, NULL), tw = make4(ws, LM_FLOAT32, L_CL, NULL);
      double wv[108];
      for (int i = 0; i < 108; i++) wv[i] = 1;
      from_array(tw.t, wv);
      lm_tensor *y = NULL;
      CHECK(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, -1, 0, NULL, &y) == LM_OK && y &&
               y->sizes[0] == 0 && y->sizes[1] == 4 && y->sizes[2] == 5,
            "N=0 forward: %s", lm_last_error());
      lm_tensor *dx = NULL, *dw = NULL, *db = NULL;
      CHECK(lm_conv2d_backward(tx.t, tw.t, y, NULL, one, NULL, 1, -1, &dx, &dw, &db) == LM_OK,
            "N=0 backward: %s", lm_last_error());
      if (dw) {
         double a[108];
         to_array(dw, a);
         int zero = 1;
         for (int i = 0; i < 108; i++) zero &= a[i] == 0;
         CHECK(zero, "N=0 grad_w is zero");
      }
      if (y) lm_tensor_free(y);
      if (dx) lm_tensor_free(dx);
      if (dw) lm_tensor_free(dw);
      if (db) lm_tensor_free(db);
      tens_free(&tx);
      tens_free(&tw);
   }
   /* Cin = 0: the output is the bias */
   {
      const int64_t xs[4] = {2, 0, 3, 3}, ws[4] = {2, 0, 1, 1};
      tens tx = make4(xs, LM_FLOAT64, L_CONTIG, NULL), tw = make4(ws, LM_FLOAT64, L_CONTIG, NULL);
      const double bv[2] = {1.5, -2};
      tens tb = make1(2, LM_FLOAT64, 0, bv);
      lm_tensor *y = NULL;
      CHECK(lm_conv2d(tx.t, tw.t, tb.t, NULL, NULL, NULL, 1, LM_CHANNELS_LAST, 0, NULL, &y) ==
               LM_OK, "Cin=0 forward: %s", lm_last_error());
      if (y) {
         double a[36];
         to_array(y, a);
         int ok = 1;
         for (int i = 0; i < 36; i++) ok &= a[i] == ((i % 18) < 9 ? 1.5 : -2);
         CHECK(ok, "Cin=0 output equals the bias");
         lm_tensor_free(y);
      }
      tens_free(&tx);
      tens_free(&tw);
      tens_free(&tb);
   }
}

/* ---- errors ---- */
static void expect_error(lm_status got, lm_status want, const char *needle, const char *what) {
   const char *msg = lm_last_error();
   CHECK(got == want && msg && strstr(msg, needle), "%s: status %d (want %d), message '%s'", what,
         (int)got, (int)want, msg ? msg : "(null)");
}

static void error_cases(void) {
   const int64_t one[2] = {1, 1};
   lm_tensor *y = NULL;
   {
      const int64_t xs[4] = {2, 5, 8, 8}, ws[4] = {6, 3, 3, 3};
      tens tx = make4(xs, LM_FLOAT32, L_CONTIG, NULL), tw = make4(ws, LM_FLOAT32, L_CONTIG, NULL);
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, NULL, NULL, 2, -1, 0, NULL, &y),
                   LM_ERR_SHAPE, "expected input[2, 5, 8, 8] to have 6 channels, but got 5",
                   "channel mismatch");
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, NULL, NULL, 4, -1, 0, NULL, &y),
                   LM_ERR_SHAPE, "expected weight to be divisible by 4", "groups vs Cout");
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, NULL, NULL, 0, -1, 0, NULL, &y), LM_ERR_ARG,
                   "non-positive groups", "groups 0");
      tens_free(&tx);
      tens_free(&tw);
   }
   {
      const int64_t xs[4] = {2, 3, 2, 2}, ws[4] = {6, 3, 3, 3};
      tens tx = make4(xs, LM_FLOAT32, L_CONTIG, NULL), tw = make4(ws, LM_FLOAT32, L_CONTIG, NULL);
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &y),
                   LM_ERR_SHAPE, "Kernel size can't be greater than actual input size",
                   "kernel too big");
      const int64_t zero[2] = {0, 1}, neg[2] = {1, -1};
      expect_error(lm_conv2d(tx.t, tw.t, NULL, zero, one, NULL, 1, -1, 0, NULL, &y), LM_ERR_ARG,
                   "non-positive stride", "stride 0");
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, one, zero, 1, -1, 0, NULL, &y), LM_ERR_ARG,
                   "non-positive dilation", "dilation 0");
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, neg, NULL, 1, -1, 0, NULL, &y), LM_ERR_ARG,
                   "negative padding", "negative padding");
      tens tb = make1(5, LM_FLOAT32, 0, NULL);
      expect_error(lm_conv2d(tx.t, tw.t, tb.t, NULL, one, NULL, 1, -1, 0, NULL, &y), LM_ERR_SHAPE,
                   "expected bias to be 1-dimensional with 6 elements", "bias size");
      tens_free(&tb);
      tens tb64 = make1(6, LM_FLOAT64, 0, NULL);
      expect_error(lm_conv2d(tx.t, tw.t, tb64.t, NULL, one, NULL, 1, -1, 0, NULL, &y),
                   LM_ERR_DTYPE, "bias type", "bias dtype");
      tens_free(&tb64);
      tens tw64 = make4(ws, LM_FLOAT64, L_CONTIG, NULL);
      expect_error(lm_conv2d(tx.t, tw64.t, NULL, NULL, one, NULL, 1, -1, 0, NULL, &y),
                   LM_ERR_DTYPE, "should be the same", "x/w dtype mismatch");
      tens_free(&tw64);
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, LM_CHANNELS_LAST_3D, 0, NULL,
                             &y), LM_ERR_FORMAT, "memory format", "bad format");
      /* wrong residual / grad_output shape */
      const int64_t rs[4] = {2, 6, 2, 3};
      tens tr = make4(rs, LM_FLOAT32, L_CONTIG, NULL);
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, -1, 0, tr.t, &y), LM_ERR_SHAPE,
                   "residual", "residual shape");
      lm_tensor *dx = NULL;
      expect_error(lm_conv2d_backward(tx.t, tw.t, tr.t, NULL, one, NULL, 1, -1, &dx, NULL, NULL),
                   LM_ERR_SHAPE, "grad_output", "grad_output shape");
      tens_free(&tr);
      /* wrong ranks */
      lm_tensor *x3 = NULL;
      const int64_t s3[3] = {3, 8, 8};
      must(lm_empty(3, s3, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &x3), "empty");
      expect_error(lm_conv2d(x3, tw.t, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &y), LM_ERR_SHAPE,
                   "expected 4-D input", "3-D input");
      expect_error(lm_conv2d(tx.t, x3, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &y), LM_ERR_SHAPE,
                   "4-D weight", "3-D weight");
      lm_tensor_free(x3);
      /* integer tensors */
      lm_tensor *xi = NULL, *wi = NULL;
      must(lm_empty(4, xs, LM_INT32, LM_CONTIGUOUS, LM_CPU, &xi), "empty");
      must(lm_empty(4, ws, LM_INT32, LM_CONTIGUOUS, LM_CPU, &wi), "empty");
      expect_error(lm_conv2d(xi, wi, NULL, NULL, one, NULL, 1, -1, 0, NULL, &y), LM_ERR_DTYPE,
                   "float32 and float64", "int32 conv");
      lm_tensor_free(xi);
      lm_tensor_free(wi);
      expect_error(lm_conv2d(NULL, tw.t, NULL, NULL, one, NULL, 1, -1, 0, NULL, &y), LM_ERR_ARG,
                   "input", "nil input");
      expect_error(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, -1, 0, NULL, NULL), LM_ERR_ARG,
                   "NULL", "NULL out pointer");
      tens_free(&tx);
      tens_free(&tw);
   }
   CHECK(y == NULL, "no output was produced by the failing calls");
}

/* ---- timing ---- */
static double now_ms(void) {
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
   double x = *(const double *)a, y = *(const double *)b;
   return x < y ? -1 : x > y;
}

static void bench(void) {
   const int64_t xs[4] = {8, 64, 56, 56}, ws[4] = {64, 64, 3, 3}, one[2] = {1, 1};
   const double flops = 2.0 * 8 * 56 * 56 * 64 * 64 * 9;
   for (int f = 1; f >= 0; f--) {
      const int layout = f ? L_CL : L_CONTIG, fmt = f ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
      double *xv = rand_array(8 * 64 * 56 * 56), *wv = rand_array(64 * 64 * 9);
      tens tx = make4(xs, LM_FLOAT32, layout, xv), tw = make4(ws, LM_FLOAT32, layout, wv);
      lm_tensor *y = NULL;
      must(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, fmt, 0, NULL, &y), "bench conv");
      enum { REPS = 15 };
      double tf[REPS], tbd[REPS], tbw[REPS];
      for (int r = 0; r < REPS; r++) {
         double t0 = now_ms();
         lm_tensor *o = y;
         must(lm_conv2d(tx.t, tw.t, NULL, NULL, one, NULL, 1, fmt, 0, NULL, &o), "bench conv");
         double t1 = now_ms();
         lm_tensor *dx = NULL, *dw = NULL;
         must(lm_conv2d_backward(tx.t, tw.t, y, NULL, one, NULL, 1, fmt, &dx, NULL, NULL),
              "bench bwd");
         double t2 = now_ms();
         must(lm_conv2d_backward(tx.t, tw.t, y, NULL, one, NULL, 1, fmt, NULL, &dw, NULL),
              "bench bwd");
         double t3 = now_ms();
         tf[r] = t1 - t0;
         tbd[r] = t2 - t1;
         tbw[r] = t3 - t2;
         lm_tensor_free(dx);
         lm_tensor_free(dw);
      }
      qsort(tf, REPS, sizeof(double), cmp_d);
      qsort(tbd, REPS, sizeof(double), cmp_d);
      qsort(tbw, REPS, sizeof(double), cmp_d);
      printf("bench conv3x3 64->64 56x56 N8 %s: forward %.2f ms (%.0f GFLOP/s), backward data "
             "%.2f ms, backward weight %.2f ms (medians of %d)\n",
             f ? "NHWC" : "NCHW", tf[REPS / 2], flops / tf[REPS / 2] / 1e6, tbd[REPS / 2],
             tbw[REPS / 2], REPS);
      lm_tensor_free(y);
      tens_free(&tx);
      tens_free(&tw);
      free(xv);
      free(wv);
   }
}

int main(int argc, char **argv) {
   int do_bench = getenv("LUMEN_CONV_BENCH") && strcmp(getenv("LUMEN_CONV_BENCH"), "0") != 0;
   int only_bench = 0;
   for (int i = 1; i < argc; i++) {
      if (!strcmp(argv[i], "--bench")) do_bench = 1;
      if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = 1;
   }
   if (!only_bench) {
      fixed_cases();
      random_cases(60);
      /* the portable kernels (float32 NHWC takes the AVX-512 direct kernels when the CPU has
         them; forcing the GEMM's ISA to portable C also selects conv's portable path) */
      const int isa = lm_gemm_isa();
      if (isa >= 3) {
         lm_gemm_set_isa(1);
         fixed_cases();
         random_cases(20);
         lm_gemm_set_isa(0);
      }
      algo_cases(30);
      pointwise_cases();
      narrow_cases();
      winograd_accuracy_cases();
      format_cases();
      repeat_cases();
      partial_grad_cases();
      empty_cases();
      error_cases();
   }
   if (do_bench) bench();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
