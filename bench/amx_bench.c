/* amx_bench.c -- the AMX bfloat16 GEMM against the AMX peak measured on this machine.
 *
 * Build against the library (after `make`):
 *   cc -O2 -fopenmp -Isrc -mamx-tile -mamx-bf16 bench/amx_bench.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -o /tmp/amx_bench
 * Run: /tmp/amx_bench [size [reps]]  (default 1024, 15 repetitions)
 *
 * For 1 and 2 threads: the TDPBF16PS peak (a loop of four independent 16 x 16 accumulator tiles
 * fed by two A and two B tiles of random bfloat16 values held in registers, no loads: 16,384
 * flops an instruction; best of 5 runs), measured again before every row because the host's
 * AMX rate drifts (a sibling thread on the same core shares the unit: 1,000 to 2,500 GFLOP/s a
 * core were seen within minutes on one machine), then lm_bgemm (bfloat16 A and B, float32 C and bfloat16 C) on size^3 NN and NT and a
 * few convolution-like shapes on the AMX path (isa 5) and on the vdpbf16ps path (isa 4): median
 * GFLOP/s, the best in brackets, and the AMX rows as % of the measured AMX peak. Machines are
 * shared: quote medians from a quiet moment (the load average is printed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
static int cmp_d(const void *x, const void *y) {
   double a = *(const double *)x, b = *(const double *)y;
   return a < b ? -1 : a > b;
}

typedef struct {
   uint8_t palette, start;
   uint8_t res[14];
   uint16_t colsb[16];
   uint8_t rows[16];
} cfg_t;

static double amx_peak(int nt) {
   const long steps = 2000000;
   double best = 0;
   for (int rep = 0; rep < 5; rep++) {
      double t0 = now();
#pragma omp parallel num_threads(nt)
      {
         /* a constant: GCC 12 drops stores into a local configuration before LDTILECFG */
         static const cfg_t c __attribute__((aligned(64))) = {
            1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
         _tile_loadconfig(&c);
         /* random bfloat16 values of magnitude about 1: zeros run the tiles faster (measured
            1,150 against 1,000 GFLOP/s on one core), and no GEMM multiplies zeros */
         uint16_t buf[512] __attribute__((aligned(64)));
         unsigned seed = 12345u + 77u * (unsigned)omp_get_thread_num();
         for (int i = 0; i < 512; i++) {
            seed = seed * 1103515245u + 12345u;
            buf[i] = (uint16_t)(0x3f80u ^ ((seed >> 16) & 0x807fu));
         }
         _tile_zero(0);
         _tile_zero(1);
         _tile_zero(2);
         _tile_zero(3);
         _tile_loadd(4, buf, 64);
         _tile_loadd(5, buf, 64);
         _tile_loadd(6, buf, 64);
         _tile_loadd(7, buf, 64);
         for (long i = 0; i < steps; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
         }
         _tile_stored(0, buf, 64);
         _tile_release();
      }
      const double t = now() - t0, f = (double)steps * 4 * 16384 * nt;
      if (f / t > best) best = f / t;
   }
   return best * 1e-9;
}

typedef struct { double med, best; } timing;

static timing time_bgemm(int64_t m, int64_t n, int64_t k, int tb, int cbf, int reps,
                         const uint16_t *a, const uint16_t *b, void *c) {
   double t[64];
   if (reps > 64) reps = 64;
   for (int r = -1; r < reps; r++) {
      double t0 = now();
      if (cbf)
         lm_bgemm_strided_bf16c(m, n, k, 1.0f, a, k, 1, b, tb ? 1 : n, tb ? k : 1, 0.0f, c, n, 1);
      else
         lm_bgemm_strided(m, n, k, 1.0f, a, k, 1, b, tb ? 1 : n, tb ? k : 1, 0.0f, c, n, 1);
      if (r >= 0) t[r] = now() - t0;
   }
   qsort(t, reps, sizeof t[0], cmp_d);
   const double f = 2.0 * m * n * k * 1e-9;
   return (timing){f / t[reps / 2], f / t[0]};
}

int main(int argc, char **argv) {
   const int64_t size = argc > 1 ? atoll(argv[1]) : 1024;
   const int reps = argc > 2 ? atoi(argv[2]) : 15;
   if (!lm_cpu_amx_available()) {
      printf("no AMX in this process (CPU, OS or permission): nothing to measure\n");
      return 0;
   }
   static const int64_t shapes[][3] = {{0, 0, 0},       {3136, 256, 64},  {784, 512, 1152},
                                       {256, 576, 3136}, {392, 2048, 512}, {8, 1000, 2048}};
   enum { NS = 6 };
   int64_t most = size * size;
   for (int s = 1; s < NS; s++) {
      const int64_t *d = shapes[s];
      if (d[0] * d[2] > most) most = d[0] * d[2];
      if (d[2] * d[1] > most) most = d[2] * d[1];
      if (d[0] * d[1] > most) most = d[0] * d[1];
   }
   uint16_t *a = aligned_alloc(64, most * 2), *b = aligned_alloc(64, most * 2);
   float *c = aligned_alloc(64, most * 4);
   srand(1);
   for (int64_t i = 0; i < most; i++) {
      float x = (float)rand() / RAND_MAX - 0.5f, y = (float)rand() / RAND_MAX - 0.5f;
      uint32_t ux, uy;
      memcpy(&ux, &x, 4), memcpy(&uy, &y, 4);
      a[i] = (uint16_t)(ux >> 16), b[i] = (uint16_t)(uy >> 16);
   }
   double load = -1;
   FILE *lf = fopen("/proc/loadavg", "r");
   if (lf) {
      if (fscanf(lf, "%lf", &load) != 1) load = -1;
      fclose(lf);
   }
   printf("lumen AMX GEMM benchmark: %d reps, medians (best in brackets); load average %.2f\n",
          reps, load);
   const int max_threads = omp_get_max_threads();
   for (int nt = 1; nt <= 2 && nt <= max_threads; nt++) {
      omp_set_num_threads(nt);
      printf("\n== %d thread%s\n", nt, nt > 1 ? "s" : "");
      for (int s = 0; s < NS; s++) {
         const int64_t m = s ? shapes[s][0] : size, n = s ? shapes[s][1] : size,
                       k = s ? shapes[s][2] : size;
         for (int v = 0; v < (s == 0 ? 3 : 1); v++) {
            const int tb = v == 1, cbf = v == 2;
            const double peak = amx_peak(nt);
            lm_cpu_set_isa(LM_ISA_AMX);
            const timing t = time_bgemm(m, n, k, tb, cbf, reps, a, b, c);
            lm_cpu_set_isa(LM_ISA_AVX512_BF16);
            const timing u = time_bgemm(m, n, k, tb, cbf, reps, a, b, c);
            printf("  %5lldx%5lldx%5lld %s C %-4s amx %6.0f GFLOP/s [%5.0f] %5.1f %% of the peak "
                   "%5.0f   vdpbf16ps %5.0f [%5.0f]\n", (long long)m, (long long)n, (long long)k,
                   tb ? "NT" : "NN", cbf ? "bf16" : "f32", t.med, t.best, 100.0 * t.med / peak,
                   peak, u.med, u.best);
         }
      }
      lm_cpu_set_isa(LM_ISA_AUTO);
   }
   free(a), free(b), free(c);
   return 0;
}
