/* gemm_avx2.c -- AVX2 + FMA micro-kernels for lumen's GEMM (see gemm_internal.h for the contract).
 * Compiled with -mavx2 -mfma; only called after CPUID says so.
 *
 * sgemm: 6 x 16 register tile = 12 ymm accumulators + 2 B vectors + 1 broadcast (15 of 16 regs).
 * dgemm: 6 x 8 register tile of doubles, same shape.
 */
#include <immintrin.h>
#include "gemm_internal.h"

#define SMR LM_SGEMM_AVX2_MR
#define SNR LM_SGEMM_AVX2_NR
#define DMR LM_DGEMM_AVX2_MR
#define DNR LM_DGEMM_AVX2_NR

#define S_ROW(i)                                                                                \
   do {                                                                                         \
      __m256 av_ = _mm256_broadcast_ss(pa + (i));                                               \
      c##i##0 = _mm256_fmadd_ps(av_, b0, c##i##0);                                              \
      c##i##1 = _mm256_fmadd_ps(av_, b1, c##i##1);                                              \
   } while (0)

#define S_STEP()                                                                                \
   do {                                                                                         \
      __m256 b0 = _mm256_load_ps(pb), b1 = _mm256_load_ps(pb + 8);                             \
      S_ROW(0); S_ROW(1); S_ROW(2); S_ROW(3); S_ROW(4); S_ROW(5);                               \
      pa += SMR;                                                                                \
      pb += SNR;                                                                                \
   } while (0)

#define S_DECL(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps()

#define S_STORE(i)                                                                              \
   do {                                                                                         \
      float *cr_ = c + (i) * rsc;                                                               \
      __m256 r0_ = _mm256_mul_ps(va, c##i##0), r1_ = _mm256_mul_ps(va, c##i##1);                \
      if (beta != 0.0f) {                                                                       \
         r0_ = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr_), r0_);                                  \
         r1_ = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr_ + 8), r1_);                              \
      }                                                                                         \
      _mm256_storeu_ps(cr_, r0_);                                                               \
      _mm256_storeu_ps(cr_ + 8, r1_);                                                           \
   } while (0)

#define S_SPILL(i)                                                                              \
   do {                                                                                         \
      _mm256_storeu_ps(tile + (i) * SNR, c##i##0);                                              \
      _mm256_storeu_ps(tile + (i) * SNR + 8, c##i##1);                                          \
   } while (0)

void lm_sgemm_ukr_avx2(int64_t kc, const float *pa, const float *pb, float *c, int64_t rsc,
                       int64_t csc, float alpha, float beta, int m, int n) {
   S_DECL(0); S_DECL(1); S_DECL(2); S_DECL(3); S_DECL(4); S_DECL(5);
   int64_t p = kc;
   for (; p >= 4; p -= 4) {
      _mm_prefetch((const char *)(pa + 16 * SMR), _MM_HINT_T0);
      S_STEP();
      S_STEP();
      _mm_prefetch((const char *)(pa + 16 * SMR), _MM_HINT_T0);
      S_STEP();
      S_STEP();
   }
   for (; p > 0; p--) S_STEP();

   if (m == SMR && n == SNR && csc == 1) {
      __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
      S_STORE(0); S_STORE(1); S_STORE(2); S_STORE(3); S_STORE(4); S_STORE(5);
   } else {
      float tile[SMR * SNR] __attribute__((aligned(32)));
      S_SPILL(0); S_SPILL(1); S_SPILL(2); S_SPILL(3); S_SPILL(4); S_SPILL(5);
      lm_gemm_merge_s(m, n, tile, SNR, c, rsc, csc, alpha, beta);
   }
}

#define D_ROW(i)                                                                                \
   do {                                                                                         \
      __m256d av_ = _mm256_broadcast_sd(pa + (i));                                              \
      c##i##0 = _mm256_fmadd_pd(av_, b0, c##i##0);                                              \
      c##i##1 = _mm256_fmadd_pd(av_, b1, c##i##1);                                              \
   } while (0)

#define D_STEP()                                                                                \
   do {                                                                                         \
      __m256d b0 = _mm256_load_pd(pb), b1 = _mm256_load_pd(pb + 4);                            \
      D_ROW(0); D_ROW(1); D_ROW(2); D_ROW(3); D_ROW(4); D_ROW(5);                               \
      pa += DMR;                                                                                \
      pb += DNR;                                                                                \
   } while (0)

#define D_DECL(i) __m256d c##i##0 = _mm256_setzero_pd(), c##i##1 = _mm256_setzero_pd()

#define D_STORE(i)                                                                              \
   do {                                                                                         \
      double *cr_ = c + (i) * rsc;                                                              \
      __m256d r0_ = _mm256_mul_pd(va, c##i##0), r1_ = _mm256_mul_pd(va, c##i##1);               \
      if (beta != 0.0) {                                                                        \
         r0_ = _mm256_fmadd_pd(vb, _mm256_loadu_pd(cr_), r0_);                                  \
         r1_ = _mm256_fmadd_pd(vb, _mm256_loadu_pd(cr_ + 4), r1_);                              \
      }                                                                                         \
      _mm256_storeu_pd(cr_, r0_);                                                               \
      _mm256_storeu_pd(cr_ + 4, r1_);                                                           \
   } while (0)

#define D_SPILL(i)                                                                              \
   do {                                                                                         \
      _mm256_storeu_pd(tile + (i) * DNR, c##i##0);                                              \
      _mm256_storeu_pd(tile + (i) * DNR + 4, c##i##1);                                          \
   } while (0)

void lm_dgemm_ukr_avx2(int64_t kc, const double *pa, const double *pb, double *c, int64_t rsc,
                       int64_t csc, double alpha, double beta, int m, int n) {
   D_DECL(0); D_DECL(1); D_DECL(2); D_DECL(3); D_DECL(4); D_DECL(5);
   int64_t p = kc;
   for (; p >= 2; p -= 2) {
      _mm_prefetch((const char *)(pa + 8 * DMR), _MM_HINT_T0);
      D_STEP();
      D_STEP();
   }
   for (; p > 0; p--) D_STEP();

   if (m == DMR && n == DNR && csc == 1) {
      __m256d va = _mm256_set1_pd(alpha), vb = _mm256_set1_pd(beta);
      D_STORE(0); D_STORE(1); D_STORE(2); D_STORE(3); D_STORE(4); D_STORE(5);
   } else {
      double tile[DMR * DNR] __attribute__((aligned(32)));
      D_SPILL(0); D_SPILL(1); D_SPILL(2); D_SPILL(3); D_SPILL(4); D_SPILL(5);
      lm_gemm_merge_d(m, n, tile, DNR, c, rsc, csc, alpha, beta);
   }
}
