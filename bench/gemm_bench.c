/* gemm_bench.c -- GFLOP/s of lumen's own GEMM against the measured FMA peak of this machine.
 *
 * Build against the library (after `make`):
 *   cc -O2 -fopenmp -Isrc bench/gemm_bench.c -Lbuild -llumen -Wl,-rpath,$PWD/build \
 *      -o /tmp/gemm_bench
 * or standalone, with only the GEMM sources compiled in:
 *   cc -O3 -fopenmp -Isrc -Ikernels -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma \
 *      -c kernels/cpu/gemm_avx512.c -o /tmp/gemm_avx512.o
 *   cc -O3 -fopenmp -Isrc -Ikernels -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 \
 *      -mfma -c kernels/cpu/gemm_avx512bf16.c -o /tmp/gemm_avx512bf16.o
 *   cc -O3 -fopenmp -Isrc -Ikernels -mavx2 -mfma -c kernels/cpu/gemm_avx2.c -o /tmp/gemm_avx2.o
 *   cc -O3 -fopenmp -Isrc -Ikernels -DLM_GEMM_STANDALONE bench/gemm_bench.c kernels/cpu/gemm.c \
 *      /tmp/gemm_avx512.o /tmp/gemm_avx512bf16.o /tmp/gemm_avx2.o -o /tmp/gemm_bench
 * Run: /tmp/gemm_bench [size [reps [bf16]]]  (default 1024, 9 repetitions; "bf16": only the
 * bfloat16 rows)
 *
 * Prints, for 1 and 2 threads: the FMA peak (a loop of 16 independent vfmadd231ps chains on zmm
 * registers per thread, best of 31 runs of ~10 ms), then sgemm NN / NT / TN / TT on size^3 on the
 * AVX-512 path, NN on the AVX2 and portable paths, and dgemm NN on the auto path: median GFLOP/s,
 * the best run in brackets, and both as % of the measured peak. The machines are shared: quote
 * medians from a quiet moment (the load average is printed).
 * bfloat16 (when the CPU has AVX512_BF16): the measured vdpbf16ps peak (16 independent chains on
 * zmm registers, 64 flops each), then lm_bgemm (bf16 A, B; float32 C, and bf16 C rounded once)
 * on size^3 NN, NT (B transposed, as x W^T in a linear layer) and a few convolution-like shapes,
 * as % of that peak; and the float32 route (isa 3) on size^3 for comparison.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#include <immintrin.h>
#include "lumen.h"

#ifdef LM_GEMM_STANDALONE
/* the few library functions the GEMM core needs, when it is compiled in without the rest */
#include <stdarg.h>
/* a tiny cache like the library's allocator, so that workspace pages are not faulted in anew on
   every call (which would bias the timings) */
static void *g_cache_p[8];
static size_t g_cache_n[8];
void *lm_alloc(size_t nbytes) {
   void *p = NULL;
#pragma omp critical(lm_stub_alloc)
   for (int i = 0; i < 8; i++)
      if (g_cache_p[i] && g_cache_n[i] == nbytes) {
         p = g_cache_p[i];
         g_cache_p[i] = NULL;
         break;
      }
   return p ? p : aligned_alloc(64, (nbytes + 63) / 64 * 64);
}
void lm_free(void *p, size_t nbytes) {
#pragma omp critical(lm_stub_alloc)
   for (int i = 0; i < 8 && p; i++)
      if (!g_cache_p[i]) {
         g_cache_p[i] = p;
         g_cache_n[i] = nbytes;
         p = NULL;
      }
   free(p);
}
void lm_clear_error(void) {}
lm_status lm_error(lm_status st, const char *fmt, ...) { (void)fmt; return st; }
#endif

static double now(void) {
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
   double x = *(const double *)a, y = *(const double *)b;
   return x < y ? -1 : x > y;
}

/* 16 independent FMA chains per iteration: iters * 16 * 16 lanes * 2 flops */
__attribute__((target("avx512f,fma"), noinline)) static float fma_loop(long iters, float seed) {
   __m512 x0 = _mm512_set1_ps(seed), x1 = _mm512_set1_ps(seed + 1), x2 = _mm512_set1_ps(seed + 2),
          x3 = _mm512_set1_ps(seed + 3), x4 = _mm512_set1_ps(seed + 4),
          x5 = _mm512_set1_ps(seed + 5), x6 = _mm512_set1_ps(seed + 6),
          x7 = _mm512_set1_ps(seed + 7), x8 = _mm512_set1_ps(seed + 8),
          x9 = _mm512_set1_ps(seed + 9), x10 = _mm512_set1_ps(seed + 10),
          x11 = _mm512_set1_ps(seed + 11), x12 = _mm512_set1_ps(seed + 12),
          x13 = _mm512_set1_ps(seed + 13), x14 = _mm512_set1_ps(seed + 14),
          x15 = _mm512_set1_ps(seed + 15);
   const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
   for (long i = 0; i < iters; i++) {
      __asm__ volatile("vfmadd231ps %[m], %[a], %[x0]\n\t"
                       "vfmadd231ps %[m], %[a], %[x1]\n\t"
                       "vfmadd231ps %[m], %[a], %[x2]\n\t"
                       "vfmadd231ps %[m], %[a], %[x3]\n\t"
                       "vfmadd231ps %[m], %[a], %[x4]\n\t"
                       "vfmadd231ps %[m], %[a], %[x5]\n\t"
                       "vfmadd231ps %[m], %[a], %[x6]\n\t"
                       "vfmadd231ps %[m], %[a], %[x7]\n\t"
                       : [x0] "+v"(x0), [x1] "+v"(x1), [x2] "+v"(x2), [x3] "+v"(x3), [x4] "+v"(x4), [x5] "+v"(x5), [x6] "+v"(x6), [x7] "+v"(x7)
                       : [m] "v"(m), [a] "v"(a));
      __asm__ volatile("vfmadd231ps %[m], %[a], %[x0]\n\t"
                       "vfmadd231ps %[m], %[a], %[x1]\n\t"
                       "vfmadd231ps %[m], %[a], %[x2]\n\t"
                       "vfmadd231ps %[m], %[a], %[x3]\n\t"
                       "vfmadd231ps %[m], %[a], %[x4]\n\t"
                       "vfmadd231ps %[m], %[a], %[x5]\n\t"
                       "vfmadd231ps %[m], %[a], %[x6]\n\t"
                       "vfmadd231ps %[m], %[a], %[x7]\n\t"
                       : [x0] "+v"(x8), [x1] "+v"(x9), [x2] "+v"(x10), [x3] "+v"(x11), [x4] "+v"(x12), [x5] "+v"(x13), [x6] "+v"(x14), [x7] "+v"(x15)
                       : [m] "v"(m), [a] "v"(a));
   }
   __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                            _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
   s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)),
                                      _mm512_add_ps(_mm512_add_ps(x12, x13),
                                                    _mm512_add_ps(x14, x15))));
   return _mm512_reduce_add_ps(s);
}

/* 16 independent vdpbf16ps chains per iteration: iters * 16 * 16 lanes * 2 pairs * 2 flops */
__attribute__((target("avx512f,avx512bf16"), noinline)) static float dpbf16_loop(long iters,
                                                                                float seed) {
   __m512 x0 = _mm512_set1_ps(seed), x1 = _mm512_set1_ps(seed + 1), x2 = _mm512_set1_ps(seed + 2),
          x3 = _mm512_set1_ps(seed + 3), x4 = _mm512_set1_ps(seed + 4),
          x5 = _mm512_set1_ps(seed + 5), x6 = _mm512_set1_ps(seed + 6),
          x7 = _mm512_set1_ps(seed + 7), x8 = _mm512_set1_ps(seed + 8),
          x9 = _mm512_set1_ps(seed + 9), x10 = _mm512_set1_ps(seed + 10),
          x11 = _mm512_set1_ps(seed + 11), x12 = _mm512_set1_ps(seed + 12),
          x13 = _mm512_set1_ps(seed + 13), x14 = _mm512_set1_ps(seed + 14),
          x15 = _mm512_set1_ps(seed + 15);
   /* bf16 1e-4 pairs: the chains grow by ~2e-8 per step, far from overflow */
   const __m512i m = _mm512_set1_epi16(0x38d2), a = _mm512_set1_epi16(0x38d2);
   for (long i = 0; i < iters; i++) {
      __asm__ volatile("vdpbf16ps %[m], %[a], %[x0]\n\t"
                       "vdpbf16ps %[m], %[a], %[x1]\n\t"
                       "vdpbf16ps %[m], %[a], %[x2]\n\t"
                       "vdpbf16ps %[m], %[a], %[x3]\n\t"
                       "vdpbf16ps %[m], %[a], %[x4]\n\t"
                       "vdpbf16ps %[m], %[a], %[x5]\n\t"
                       "vdpbf16ps %[m], %[a], %[x6]\n\t"
                       "vdpbf16ps %[m], %[a], %[x7]\n\t"
                       : [x0] "+v"(x0), [x1] "+v"(x1), [x2] "+v"(x2), [x3] "+v"(x3), [x4] "+v"(x4), [x5] "+v"(x5), [x6] "+v"(x6), [x7] "+v"(x7)
                       : [m] "v"(m), [a] "v"(a));
      __asm__ volatile("vdpbf16ps %[m], %[a], %[x0]\n\t"
                       "vdpbf16ps %[m], %[a], %[x1]\n\t"
                       "vdpbf16ps %[m], %[a], %[x2]\n\t"
                       "vdpbf16ps %[m], %[a], %[x3]\n\t"
                       "vdpbf16ps %[m], %[a], %[x4]\n\t"
                       "vdpbf16ps %[m], %[a], %[x5]\n\t"
                       "vdpbf16ps %[m], %[a], %[x6]\n\t"
                       "vdpbf16ps %[m], %[a], %[x7]\n\t"
                       : [x0] "+v"(x8), [x1] "+v"(x9), [x2] "+v"(x10), [x3] "+v"(x11), [x4] "+v"(x12), [x5] "+v"(x13), [x6] "+v"(x14), [x7] "+v"(x15)
                       : [m] "v"(m), [a] "v"(a));
   }
   __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                            _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
   s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)),
                                      _mm512_add_ps(_mm512_add_ps(x12, x13),
                                                    _mm512_add_ps(x14, x15))));
   return _mm512_reduce_add_ps(s);
}

/* GFLOP/s of the vdpbf16ps loop on nt threads, best of 31 short runs */
static double dpbf16_peak(int nt) {
   const long iters = 4000000;
   enum { RUNS = 31 };
   double t[RUNS];
   volatile float sink = 0;
   for (int r = 0; r < RUNS; r++) {
      double t0 = now();
#pragma omp parallel num_threads(nt)
      {
         float v = dpbf16_loop(iters, (float)omp_get_thread_num());
         if (v == 12345.f) sink += v;
      }
      t[r] = now() - t0;
   }
   qsort(t, RUNS, sizeof t[0], cmp_d);
   return (double)iters * 16 * 16 * 4 * nt / t[0] * 1e-9;
}

/* GFLOP/s of the FMA loop on nt threads (all threads run it at once), best of 31 short runs */
static double fma_peak(int nt) {
   const long iters = 4000000; /* about 10 ms per run */
   enum { RUNS = 31 };
   double t[RUNS];
   volatile float sink = 0;
   for (int r = 0; r < RUNS; r++) {
      double t0 = now();
#pragma omp parallel num_threads(nt)
      {
         float v = fma_loop(iters, (float)omp_get_thread_num());
         if (v == 12345.f) sink += v;
      }
      t[r] = now() - t0;
   }
   qsort(t, RUNS, sizeof t[0], cmp_d);
   return (double)iters * 16 * 16 * 2 * nt / t[0] * 1e-9; /* the best run: the machine's capability */
}

typedef struct {
   double med, best;
} timing;

static timing time_sgemm(int ta, int tb, int64_t n, int reps, float *a, float *b, float *c) {
   double t[64];
   if (reps > 64) reps = 64;
   lm_sgemm(ta, tb, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm up */
   for (int r = 0; r < reps; r++) {
      double t0 = now();
      lm_sgemm(ta, tb, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      t[r] = now() - t0;
   }
   qsort(t, reps, sizeof t[0], cmp_d);
   double f = 2.0 * n * n * n * 1e-9;
   return (timing){f / t[reps / 2], f / t[0]};
}

static timing time_dgemm(int64_t n, int reps, double *a, double *b, double *c) {
   double t[64];
   if (reps > 64) reps = 64;
   lm_dgemm(0, 0, n, n, n, 1.0, a, n, b, n, 0.0, c, n);
   for (int r = 0; r < reps; r++) {
      double t0 = now();
      lm_dgemm(0, 0, n, n, n, 1.0, a, n, b, n, 0.0, c, n);
      t[r] = now() - t0;
   }
   qsort(t, reps, sizeof t[0], cmp_d);
   double f = 2.0 * n * n * n * 1e-9;
   return (timing){f / t[reps / 2], f / t[0]};
}

/* exported by liblumen.so (kernels/cpu/gemm_internal.h) */
void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, float *c, int64_t rsc, int64_t csc);
void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                            int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                            int64_t csb, float beta, uint16_t *c, int64_t rsc, int64_t csc);

/* one bf16 GEMM m x n x k: A row-major (m x k), B row-major k x n (tb 0) or stored n x k (tb 1,
   x W^T), C float32 or (cbf) bf16, row-major */
static timing time_bgemm(int64_t m, int64_t n, int64_t k, int tb, int cbf, int reps,
                         const uint16_t *a, const uint16_t *b, void *c) {
   double t[64];
   if (reps > 64) reps = 64;
   for (int r = -1; r < reps; r++) { /* r == -1: warm up */
      double t0 = now();
      if (cbf)
         lm_bgemm_strided_bf16c(m, n, k, 1.0f, a, k, 1, b, tb ? 1 : n, tb ? k : 1, 0.0f, c, n, 1);
      else
         lm_bgemm_strided(m, n, k, 1.0f, a, k, 1, b, tb ? 1 : n, tb ? k : 1, 0.0f, c, n, 1);
      if (r >= 0) t[r] = now() - t0;
   }
   qsort(t, reps, sizeof t[0], cmp_d);
   double f = 2.0 * m * n * k * 1e-9;
   return (timing){f / t[reps / 2], f / t[0]};
}

static void bench_bf16(int64_t size, int reps, int nt) {
   static const int64_t shapes[][3] = {{0, 0, 0}, {256, 3136, 576}, {64, 3136, 576},
                                       {8, 1000, 2048}, {3136, 64, 576}};
   int64_t most = size * size;
   for (int s = 1; s < 5; s++) {
      int64_t e = shapes[s][0] * shapes[s][2];
      if (shapes[s][2] * shapes[s][1] > e) e = shapes[s][2] * shapes[s][1];
      if (shapes[s][0] * shapes[s][1] > e) e = shapes[s][0] * shapes[s][1];
      if (e > most) most = e;
   }
   uint16_t *a = aligned_alloc(64, most * 2), *b = aligned_alloc(64, most * 2);
   float *c = aligned_alloc(64, most * 4);
   for (int64_t i = 0; i < most; i++) {
      float x = (float)rand() / RAND_MAX - 0.5f, y = (float)rand() / RAND_MAX - 0.5f;
      uint32_t ux, uy;
      memcpy(&ux, &x, 4);
      memcpy(&uy, &y, 4);
      a[i] = (uint16_t)(ux >> 16);
      b[i] = (uint16_t)(uy >> 16);
   }
   const double peak = dpbf16_peak(nt);
   printf("  -- bfloat16: measured vdpbf16ps peak %.1f GFLOP/s (16 zmm chains per thread)\n",
          peak);
   lm_gemm_set_isa(4);
   for (int s = 0; s < 5; s++) {
      const int64_t m = s ? shapes[s][0] : size, n = s ? shapes[s][1] : size,
                    k = s ? shapes[s][2] : size;
      for (int v = 0; v < (s == 0 ? 3 : s == 3 ? 2 : 1); v++) { /* 8x1000x2048 also as x W^T */
         const int tb = v == 1, cbf = v == 2;
         timing t = time_bgemm(m, n, k, tb, cbf, reps, a, b, c);
         printf("  bgemm %5lldx%5lldx%5lld %s C %-4s %7.1f GFLOP/s [%6.1f]  %5.1f %% of bf16 "
                "peak [%5.1f %%]\n", (long long)m, (long long)n, (long long)k, tb ? "NT" : "NN",
                cbf ? "bf16" : "f32", t.med, t.best, 100.0 * t.med / peak, 100.0 * t.best / peak);
      }
   }
   lm_gemm_set_isa(3);
   timing t = time_bgemm(size, size, size, 0, 0, reps, a, b, c);
   printf("  bgemm %5lldx%5lldx%5lld NN C f32  %7.1f GFLOP/s [%6.1f]  (isa 3: the float32 "
          "route)\n", (long long)size, (long long)size, (long long)size, t.med, t.best);
   lm_gemm_set_isa(0);
   free(a); free(b); free(c);
}

int main(int argc, char **argv) {
   int64_t n = argc > 1 ? atoll(argv[1]) : 1024;
   int reps = argc > 2 ? atoi(argv[2]) : 9;
   const int only_bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0;
   float *a = aligned_alloc(64, n * n * 4), *b = aligned_alloc(64, n * n * 4),
         *c = aligned_alloc(64, n * n * 4);
   double *da = aligned_alloc(64, n * n * 8), *db = aligned_alloc(64, n * n * 8),
          *dc = aligned_alloc(64, n * n * 8);
   srand(1);
   for (int64_t i = 0; i < n * n; i++) {
      a[i] = (float)rand() / RAND_MAX - 0.5f;
      b[i] = (float)rand() / RAND_MAX - 0.5f;
      c[i] = 0;
      da[i] = a[i];
      db[i] = b[i];
      dc[i] = 0;
   }
   const char *isa_name[] = {"auto", "C", "AVX2", "AVX-512", "AVX512BF16"};
   int max_threads = omp_get_max_threads();
   double load = -1;
   FILE *lf = fopen("/proc/loadavg", "r");
   if (lf) {
      if (fscanf(lf, "%lf", &load) != 1) load = -1;
      fclose(lf);
   }
   printf("lumen GEMM benchmark: %lldx%lldx%lld, %d reps, medians (best in brackets); load "
          "average %.2f\n", (long long)n, (long long)n, (long long)n, reps, load);
   for (int nt = 1; nt <= 2 && nt <= max_threads; nt++) {
      omp_set_num_threads(nt);
      if (only_bf16) {
         printf("\n== %d thread%s\n", nt, nt > 1 ? "s" : "");
         if (lm_gemm_set_isa(4) == 4)
            bench_bf16(n, reps, nt);
         else
            printf("  -- bfloat16: no AVX512_BF16 on this CPU\n");
         lm_gemm_set_isa(0);
         continue;
      }
      double peak = fma_peak(nt);
      printf("\n== %d thread%s: measured FMA peak %.1f GFLOP/s (16 zmm vfmadd231ps chains per "
             "thread)\n", nt, nt > 1 ? "s" : "", peak);
      for (int isa = 3; isa >= 1; isa--) {
         int got = lm_gemm_set_isa(isa);
         if (got != isa) {
            printf("  %-8s not supported here\n", isa_name[isa]);
            continue;
         }
         static const char *tn[] = {"NN", "NT", "TN", "TT"};
         for (int tr = 0; tr < 4; tr++) {
            if (isa != 3 && tr > 0) continue; /* transposes only on the main path */
            int r = isa == 1 ? (reps < 3 ? reps : 3) : reps;
            timing s = time_sgemm(tr >> 1, tr & 1, n, r, a, b, c);
            printf("  sgemm %s %-8s %7.1f GFLOP/s [%6.1f]  %5.1f %% of peak [%5.1f %%]\n", tn[tr],
                   isa_name[isa], s.med, s.best, 100.0 * s.med / peak, 100.0 * s.best / peak);
         }
      }
      lm_gemm_set_isa(0);
      if (lm_gemm_set_isa(4) == 4)
         bench_bf16(n, reps, nt);
      else
         printf("  -- bfloat16: no AVX512_BF16 on this CPU\n");
      lm_gemm_set_isa(0);
      timing d = time_dgemm(n, reps, da, db, dc);
      printf("  dgemm NN %-8s %7.1f GFLOP/s [%6.1f]  %5.1f %% of fp32 peak (%.1f %% of fp64)\n",
             isa_name[lm_gemm_isa()], d.med, d.best, 100.0 * d.med / peak,
             200.0 * d.med / peak);
   }
   free(a); free(b); free(c); free(da); free(db); free(dc);
   return 0;
}
