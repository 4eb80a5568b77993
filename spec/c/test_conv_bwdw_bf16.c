/* test_conv_bwdw_bf16.c -- lm_conv_bwdw_nhwc_bf16 (kernels/cpu/conv_bwdw_bf16_avx512bf16.c: the
 * bfloat16 weight and bias gradients of a channels-last convolution on the vdpbf16ps GEMM)
 * against a float64 reference computed from the same bfloat16 inputs, on random geometries:
 * channel counts 1, 3, 7, 17, 64, spatial sizes 1, 2, 7, strides 1-2, padding, dilation, groups
 * (depthwise included), 1x1 in place. Tolerance: 1e-5 of the sum of |terms| (float32 sums).
 * Skipped (with a message) when the CPU lacks AVX512_BF16 (the function's precondition).
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *   make && cc -std=c11 -O2 -fopenmp -Isrc spec/c/test_conv_bwdw_bf16.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_cbw && /tmp/test_cbw
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"
#include "../../kernels/cpu/conv_bf16.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (uint32_t)(g_rng >> 32);
}
static double urand(void) { return rnd() / 4294967296.0; }
static float bf2f(uint16_t h) {
   uint32_t u = (uint32_t)h << 16;
   float f;
   memcpy(&f, &u, 4);
   return f;
}
static uint16_t f2bf(float f) {
   uint32_t x;
   memcpy(&x, &f, 4);
   x += 0x7fff + ((x >> 16) & 1);
   return (uint16_t)(x >> 16);
}

static void run(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh, int64_t kw,
                int64_t s, int64_t pad, int64_t dil, int64_t G, int with_bias) {
   conv_geom g;
   memset(&g, 0, sizeof g);
   g.N = N; g.C = C; g.H = H; g.W = W; g.O = O; g.kh = kh; g.kw = kw;
   g.sh = s; g.sw = s; g.ph = pad; g.pw = pad; g.dh = dil; g.dw = dil; g.G = G;
   g.Cg = C / G; g.Og = O / G; g.K = g.Cg * kh * kw;
   g.Ho = (H + 2 * pad - dil * (kh - 1) - 1) / s + 1;
   g.Wo = (W + 2 * pad - dil * (kw - 1) - 1) / s + 1;
   if (g.Ho <= 0 || g.Wo <= 0) return;
   snprintf(g_case, sizeof g_case,
            "N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld p%lld d%lld G%lld", (long long)N,
            (long long)C, (long long)H, (long long)W, (long long)O, (long long)kh, (long long)kw,
            (long long)s, (long long)pad, (long long)dil, (long long)G);
   const int64_t nx = N * H * W * C, ng = N * g.Ho * g.Wo * O, nw = O * g.K;
   uint16_t *x = malloc((size_t)nx * 2 + 2), *go = malloc((size_t)ng * 2 + 2);
   for (int64_t i = 0; i < nx; i++) x[i] = f2bf((float)(urand() * 2 - 1));
   for (int64_t i = 0; i < ng; i++) go[i] = f2bf((float)(urand() * 2 - 1));
   float *gw = malloc((size_t)nw * 4 + 4), *gb = malloc((size_t)O * 4 + 4);
   for (int64_t i = 0; i < nw; i++) gw[i] = NAN; /* overwritten, never read */
   for (int64_t i = 0; i < O; i++) gb[i] = NAN;
   OK(lm_conv_bwdw_nhwc_bf16(&g, x, go, gw, with_bias ? gb : NULL));
   int bad = 0;
   for (int64_t o = 0; o < O && !bad; o++) {
      const int64_t gi = o / g.Og;
      for (int64_t i = 0; i < kh && !bad; i++)
         for (int64_t j = 0; j < kw && !bad; j++)
            for (int64_t c = 0; c < g.Cg && !bad; c++) {
               double sum = 0, mag = 0;
               for (int64_t n = 0; n < N; n++)
                  for (int64_t ho = 0; ho < g.Ho; ho++)
                     for (int64_t wo = 0; wo < g.Wo; wo++) {
                        const int64_t h = ho * s - pad + i * dil, w = wo * s - pad + j * dil;
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        const double t =
                           (double)bf2f(go[((n * g.Ho + ho) * g.Wo + wo) * O + o]) *
                           bf2f(x[((n * H + h) * W + w) * C + gi * g.Cg + c]);
                        sum += t;
                        mag += fabs(t);
                     }
               const double got = gw[((o * kh + i) * kw + j) * g.Cg + c];
               if (!(fabs(got - sum) <= 1e-5 * mag + 1e-30)) {
                  check(0, "gw[%lld][%lld][%lld][%lld] = %.9g, want %.9g (sum |terms| %.3g)",
                        (long long)o, (long long)i, (long long)j, (long long)c, got, sum, mag);
                  bad = 1;
               }
            }
   }
   if (!bad) check(1, "");
   if (with_bias) {
      int bbad = 0;
      for (int64_t o = 0; o < O && !bbad; o++) {
         double sum = 0, mag = 0;
         for (int64_t p = 0; p < N * g.Ho * g.Wo; p++) {
            sum += bf2f(go[p * O + o]);
            mag += fabs(bf2f(go[p * O + o]));
         }
         if (!(fabs(gb[o] - sum) <= 1e-5 * mag + 1e-30)) {
            check(0, "gb[%lld] = %.9g, want %.9g", (long long)o, (double)gb[o], sum);
            bbad = 1;
         }
      }
      if (!bbad) check(1, "");
   }
   free(x); free(go); free(gw); free(gb);
}

int main(void) {
   if (lm_gemm_isa() < 4) {
      printf("test_conv_bwdw_bf16: no AVX512_BF16 on this CPU (lm_gemm_isa() = %d): skipped\n",
             lm_gemm_isa());
      printf("0 passed, 0 failed\n");
      return 0;
   }
   static const int64_t chans[] = {1, 3, 7, 17, 64}, sp[] = {1, 2, 7};
   /* fixed cases: 1x1 in place (the GEMM on x directly), 3x3 padded, strided, dilated,
      grouped, depthwise, a long pixel reduction over several im2col tiles */
   run(2, 64, 7, 7, 64, 1, 1, 1, 0, 1, 1, 1);
   run(3, 17, 7, 7, 7, 1, 1, 1, 0, 1, 1, 1);
   run(2, 64, 7, 7, 17, 3, 3, 1, 1, 1, 1, 1);
   run(2, 7, 7, 7, 64, 3, 3, 2, 1, 1, 1, 1);
   run(1, 17, 7, 7, 3, 3, 3, 1, 2, 2, 1, 0);
   run(2, 64, 7, 7, 64, 3, 3, 1, 1, 1, 4, 1);
   run(2, 64, 7, 7, 64, 3, 3, 2, 1, 1, 64, 1);
   run(2, 17, 7, 7, 34, 3, 3, 1, 1, 1, 17, 1);
   run(2, 3, 2, 2, 7, 1, 1, 2, 0, 1, 1, 1);
   run(8, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1); /* P = 6272: im2col in several tiles */
   run(4, 64, 32, 32, 64, 1, 1, 1, 0, 1, 1, 1); /* P = 4096 pixels in place, bias threads */
   /* odd pixel counts past the threads' pixel split (each thread its own range of the
      reduction), grouped, in place and through im2col */
   run(1, 34, 65, 65, 18, 3, 3, 1, 1, 1, 2, 1);
   run(1, 34, 65, 65, 18, 1, 1, 1, 0, 1, 2, 0);
   run(3, 17, 47, 47, 7, 1, 1, 1, 0, 1, 1, 1);
   /* random geometries */
   for (int t = 0; t < 60; t++) {
      const int64_t C0 = chans[rnd() % 5], O0 = chans[rnd() % 5];
      int64_t G = 1;
      const uint32_t gsel = rnd() % 4;
      if (gsel == 1 && C0 == O0) G = C0;                /* depthwise */
      if (gsel == 2 && C0 % 2 == 0 && O0 % 2 == 0) G = 2;
      const int64_t C = C0, O = O0;
      const int64_t H = sp[rnd() % 3], W = sp[rnd() % 3];
      const int64_t k = (int64_t)(rnd() % 3) + 1, s = (int64_t)(rnd() % 2) + 1;
      const int64_t pad = (int64_t)(rnd() % 2) * (k / 2 + (rnd() % 2));
      const int64_t dil = (int64_t)(rnd() % 2) + 1;
      const int64_t N = (int64_t)(rnd() % 3) + 1;
      if (C % G || O % G) continue;
      run(N, C, H, W, O, k, k == 2 ? 1 : k, s, pad, dil, G, (int)(rnd() & 1));
   }
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail != 0;
}
