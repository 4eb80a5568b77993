/* bench/amx_ratio.c -- the AMX GEMM as a share of the TDPBF16PS peak, measured in alternation:
 * each round times the peak loop, the product (best of 10 calls: the first call or two pay for
 * the workspace's pages) and the peak again, and takes the product over the larger of the two
 * peaks; prints the median share over the rounds. The host's AMX rate moves by 2x from minute to
 * minute, and a long peak loop is cut by whatever else runs on the core: so each peak is the best
 * of 10 short loops (0.1-0.3 ms each), as the product is the best of its calls.
 * Two products: bfloat16 C (what lm.mm / F.linear return for bfloat16 operands) and float32 C.
 *   cc -O2 -fopenmp -Isrc -mamx-tile -mamx-bf16 bench/amx_ratio.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -o /tmp/amx_ratio
 *   /tmp/amx_ratio M N K ROUNDS THREADS     e.g. /tmp/amx_ratio 1024 1024 1024 9 2 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <omp.h>
#include <immintrin.h>
#include "lumen.h"

void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, float *c, int64_t rsc, int64_t csc);
void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                            int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                            int64_t csb, float beta, uint16_t *c, int64_t rsc, int64_t csc);
static double now(void) {
   struct timespec t;
   clock_gettime(CLOCK_MONOTONIC, &t);
   return t.tv_sec + t.tv_nsec * 1e-9;
}
typedef struct {
   uint8_t palette, start;
   uint8_t res[14];
   uint16_t colsb[16];
   uint8_t rows[16];
} cfg_t;
static const cfg_t cfg __attribute__((aligned(64))) = {
   1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
/* 4 independent accumulators (enough to cover TDPBF16PS's latency), sources in tiles */
static double peak(int nt) {
   const long steps = 5000;
   double best = 1e9;
   for (int r = 0; r < 10; r++) {
      double t0 = now();
#pragma omp parallel num_threads(nt)
      {
         _tile_loadconfig(&cfg);
         uint16_t buf[512] __attribute__((aligned(64)));
         for (int i = 0; i < 512; i++) buf[i] = 0x3f80 ^ (i & 0x807f);
         _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
         _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64);
         _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
         for (long i = 0; i < steps; i++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
         }
         _tile_stored(0, buf, 64);
         _tile_release();
      }
      const double t = now() - t0;
      if (t < best) best = t;
   }
   return (double)steps * 4 * 16384 * nt / best * 1e-9;
}
static int cmpd(const void *a, const void *b) {
   double x = *(const double *)a, y = *(const double *)b;
   return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
   if (argc < 5) {
      fprintf(stderr, "usage: %s M N K ROUNDS [THREADS]\n", argv[0]);
      return 2;
   }
   int64_t m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
   int rounds = atoi(argv[4]);
   int nt = argc > 5 ? atoi(argv[5]) : 1;
   if (rounds < 1 || rounds > 64) rounds = 9;
   omp_set_num_threads(nt);
   lm_set_num_threads(nt);
   if (!lm_cpu_amx_available()) {
      fprintf(stderr, "no AMX here\n");
      return 1;
   }
   uint16_t *a = malloc(m * k * 2), *b = malloc(k * n * 2);
   float *c = malloc(m * n * 4);
   for (int64_t i = 0; i < m * k; i++) a[i] = 0x3f80 ^ (rand() & 0x807f);
   for (int64_t i = 0; i < k * n; i++) b[i] = 0x3f80 ^ (rand() & 0x807f);
   lm_cpu_set_isa(LM_ISA_AMX);
   for (int out = 0; out < 2; out++) {
      double r[64], g[64], p[64];
      for (int q = 0; q < rounds; q++) {
         const double pk = peak(nt);
         double best = 1e9;
         for (int j = 0; j < 10; j++) {
            const double t0 = now();
            if (out == 0)
               lm_bgemm_strided_bf16c(m, n, k, 1, a, k, 1, b, n, 1, 0, (uint16_t *)c, n, 1);
            else
               lm_bgemm_strided(m, n, k, 1, a, k, 1, b, n, 1, 0, c, n, 1);
            const double t = now() - t0;
            if (t < best) best = t;
         }
         const double pk2 = peak(nt);
         g[q] = 2.0 * m * n * k / best * 1e-9;
         p[q] = pk > pk2 ? pk : pk2;
         r[q] = g[q] / p[q];
      }
      qsort(r, rounds, 8, cmpd);
      qsort(g, rounds, 8, cmpd);
      qsort(p, rounds, 8, cmpd);
      printf("%ldx%ldx%ld %s C, %d thread%s: %.1f%% of the peak (median of %d; min %.1f max "
             "%.1f); GFLOP/s %.0f, peak %.0f\n",
             (long)m, (long)n, (long)k, out == 0 ? "bfloat16" : "float32", nt, nt > 1 ? "s" : "",
             100 * r[rounds / 2], rounds, 100 * r[0], 100 * r[rounds - 1], g[rounds / 2],
             p[rounds / 2]);
   }
   return 0;
}
