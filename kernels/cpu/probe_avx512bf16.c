/* probe_avx512bf16.c -- the flops of bfloat16 dot products (vdpbf16ps: two multiply-adds a
 * lane) against float32 FMA (vfmadd231ps: one), both as 16 independent chains of zmm registers in
 * one thread, best of three alternations of ~0.2 ms. For the benchmarks and docs only: it does
 * not predict the kernels (on the Intel Xeon of session 19 it read 1.6 while the vdpbf16ps GEMM
 * ran at half the float32 route's speed), so lm_cpu_bf16_dot_pays (isa.c) times the two GEMM
 * paths instead (gemm.c, lm_bf16_path_ratio). Compiled with -mavx512bf16 (the Makefile's rule);
 * called only where lm_cpu_isa() >= LM_ISA_AVX512_BF16. */
#include "cpu.h"

#include <immintrin.h>
#include <time.h>

static double now(void) {
   struct timespec t;
   clock_gettime(CLOCK_MONOTONIC, &t);
   return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CHAINS 16
enum { ITERS = 4096 };

static double dp_rate(void) {
   __m512 acc[CHAINS];
   for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
   const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
   const double t0 = now();
   for (int it = 0; it < ITERS; it++)
      for (int i = 0; i < CHAINS; i++) {
         acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
         __asm__ volatile("" : "+v"(acc[i]));
      }
   const double t = now() - t0;
   float s = 0;
   for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(acc[i]);
   __asm__ volatile("" ::"x"(s));
   return (double)ITERS * CHAINS * 64 / (t > 0 ? t : 1e-9);
}

static double fma_rate(void) {
   __m512 acc[CHAINS];
   for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
   const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0.999f);
   const double t0 = now();
   for (int it = 0; it < ITERS; it++)
      for (int i = 0; i < CHAINS; i++) {
         acc[i] = _mm512_fmadd_ps(a, acc[i], b);
         __asm__ volatile("" : "+v"(acc[i]));
      }
   const double t = now() - t0;
   float s = 0;
   for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(acc[i]);
   __asm__ volatile("" ::"x"(s));
   return (double)ITERS * CHAINS * 32 / (t > 0 ? t : 1e-9);
}

double lm_bf16_dot_ratio(void) {
   double dp = 0, fm = 0;
   for (int r = 0; r < 3; r++) {
      const double d = dp_rate(), f = fma_rate();
      if (d > dp) dp = d;
      if (f > fm) fm = f;
   }
   return fm > 0 ? dp / fm : 1.0;
}
