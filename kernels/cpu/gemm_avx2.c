/* gemm_avx2.c -- AVX2 + FMA micro-kernels for lumen's GEMM (see gemm_internal.h for the contract).
 * Compiled with -mavx2 -mfma; only called after CPUID says so.
 *
 * sgemm: 6 x 16 register tile = 12 ymm accumulators + 2 B vectors + 2 broadcasts (16 regs).
 * dgemm: 6 x 8 register tile of doubles, same shape.
 * Both prefetch their C tile before the k loop: its rows are a row stride apart (4 KiB in a
 * 1024-wide C) and missed in L1 when the store came; on a Zen 3 (2 threads) sgemm 1024^3 went
 * 73-102 -> 95-137 GFLOP/s and 1568x384x1536 115 -> 144 with the asm loop below (MKL, through
 * PyTorch: 77-124 on that shape).
 */
#include <immintrin.h>
#include "gemm_internal.h"
#include "act_avx2.h"

#define SMR LM_SGEMM_AVX2_MR
#define SNR LM_SGEMM_AVX2_NR
#define DMR LM_DGEMM_AVX2_MR
#define DNR LM_DGEMM_AVX2_NR

/* The k loop is written in assembly: compiled from intrinsics, gcc 12 reloaded the two B vectors
 * as memory operands of each FMA in half of the unrolled steps (18 loads for 12 FMAs a step
 * instead of 8), and the kernel ran at 40 GFLOP/s a core on a Zen 3 (1024^3, one thread; 53 % of
 * the FMA peak). Here the 12 accumulators live in ymm0-11 (row i: ymm 2i, 2i+1), B in ymm12-13
 * and the broadcasts alternate between ymm14 and ymm15; the asm stores the accumulators to a
 * 6 x 16 stack tile, which the C code below scales and writes to C. */
#define S_ASM_ROW(s, i, a0, a1, r)                                                              \
   "vbroadcastss " #s "*24+" #i "*4(%[pa]), %%ymm" #r "\n\t"                                    \
   "vfmadd231ps %%ymm12, %%ymm" #r ", %%ymm" #a0 "\n\t"                                         \
   "vfmadd231ps %%ymm13, %%ymm" #r ", %%ymm" #a1 "\n\t"
#define S_ASM_STEP(s)                                                                           \
   "vmovaps " #s "*64(%[pb]), %%ymm12\n\t"                                                     \
   "vmovaps " #s "*64+32(%[pb]), %%ymm13\n\t"                                                  \
   S_ASM_ROW(s, 0, 0, 1, 14) S_ASM_ROW(s, 1, 2, 3, 15) S_ASM_ROW(s, 2, 4, 5, 14)               \
   S_ASM_ROW(s, 3, 6, 7, 15) S_ASM_ROW(s, 4, 8, 9, 14) S_ASM_ROW(s, 5, 10, 11, 15)
#define S_ASM_OUT(r) "vmovaps %%ymm" #r ", " #r "*32(%[acc])\n\t"
/* the 12 accumulators zeroed / stored to acc; what both asm loops clobber */
#define S_ASM_ZERO_(r) "vxorps %%ymm" #r ", %%ymm" #r ", %%ymm" #r "\n\t"
#define S_ASM_ZERO                                                                              \
   S_ASM_ZERO_(0) S_ASM_ZERO_(1) S_ASM_ZERO_(2) S_ASM_ZERO_(3) S_ASM_ZERO_(4) S_ASM_ZERO_(5)     \
   S_ASM_ZERO_(6) S_ASM_ZERO_(7) S_ASM_ZERO_(8) S_ASM_ZERO_(9) S_ASM_ZERO_(10) S_ASM_ZERO_(11)
#define S_ASM_OUT_ALL                                                                           \
   S_ASM_OUT(0) S_ASM_OUT(1) S_ASM_OUT(2) S_ASM_OUT(3) S_ASM_OUT(4) S_ASM_OUT(5) S_ASM_OUT(6)    \
   S_ASM_OUT(7) S_ASM_OUT(8) S_ASM_OUT(9) S_ASM_OUT(10) S_ASM_OUT(11)
#define S_ASM_CLOBBERS                                                                          \
   "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",      \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory"

/* prefetch the m rows of a C tile (csc 1: its 16 floats may span two lines) */
static inline void s_prefetch_c(const float *c, int64_t rsc, int64_t csc, int m) {
   if (csc != 1) return;
   for (int i = 0; i < m; i++) {
      _mm_prefetch((const char *)(c + i * rsc), _MM_HINT_T0);
      _mm_prefetch((const char *)(c + i * rsc + SNR - 1), _MM_HINT_T0);
   }
}

/* C = alpha * acc + beta * C for the m x n corner of the 6 x 16 tile acc (beta 0: C not read) */
static inline void s_store(const float *acc, float *c, int64_t rsc, int64_t csc, float alpha,
                           float beta, int m, int n) {
   if (m == SMR && n == SNR && csc == 1) {
      const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
      for (int i = 0; i < SMR; i++) {
         float *cr = c + i * rsc;
         __m256 r0 = _mm256_mul_ps(va, _mm256_load_ps(acc + i * SNR));
         __m256 r1 = _mm256_mul_ps(va, _mm256_load_ps(acc + i * SNR + 8));
         if (beta != 0.0f) {
            r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), r0);
            r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), r1);
         }
         _mm256_storeu_ps(cr, r0);
         _mm256_storeu_ps(cr + 8, r1);
      }
   } else {
      lm_gemm_merge_s(m, n, acc, SNR, c, rsc, csc, alpha, beta);
   }
}

void lm_sgemm_ukr_avx2(int64_t kc, const float *pa, const float *pb, float *c, int64_t rsc,
                       int64_t csc, float alpha, float beta, int m, int n) {
   float acc[SMR * SNR] __attribute__((aligned(32)));
   int64_t k4 = kc / 4, kr = kc % 4;
   s_prefetch_c(c, rsc, csc, m); /* the C tile, while the k loop runs (above) */
   __asm__ volatile(
      S_ASM_ZERO
      "test %[k4], %[k4]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n"
      "1:\n\t"
      "prefetcht0 384(%[pa])\n\t"
      S_ASM_STEP(0) S_ASM_STEP(1) S_ASM_STEP(2) S_ASM_STEP(3)
      "add $96, %[pa]\n\t"
      "add $256, %[pb]\n\t"
      "dec %[k4]\n\t"
      "jnz 1b\n"
      "2:\n\t"
      "test %[kr], %[kr]\n\t"
      "jz 4f\n"
      "3:\n\t"
      S_ASM_STEP(0)
      "add $24, %[pa]\n\t"
      "add $64, %[pb]\n\t"
      "dec %[kr]\n\t"
      "jnz 3b\n"
      "4:\n\t"
      S_ASM_OUT_ALL
      : [pa] "+r"(pa), [pb] "+r"(pb), [k4] "+r"(k4), [kr] "+r"(kr)
      : [acc] "r"(acc)
      : S_ASM_CLOBBERS);

   s_store(acc, c, rsc, csc, alpha, beta, m, n);
}

/* ---- packing for the float tile (layouts in gemm_internal.h), as gemm_avx512.c's ----
 * Why: the portable packing (gemm_tmpl.c, compiled for x86-64-v2) moved one float at a time;
 * a linear layer's operands are both stored by rows along k (x and W of x W^T), so A's and B's
 * packing both took that loop's transposed path: 8.4 % of 1568x384x1536 (perf, Zen 3, 2
 * threads), as much as the GEMM loses to MKL there. Here: 8 x 8 transposes in registers. */

/* r[0..7] transposed in place: r[j][i] <- r[i][j] */
static inline void s_transpose8(__m256 r[8]) {
   const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
   const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
   const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
   const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
   const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
   const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
   const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
   const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
   r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
   r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
   r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
   r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
   r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
   r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
   r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
   r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* A block, mc x kc, into 6-row micro-panels dst[panel][p][i], rows past mc zeroed */
void lm_sgemm_pack_a_avx2(int64_t mc, int64_t kc, const float *a, int64_t rsa, int64_t csa,
                          float *dst) {
   for (int64_t i0 = 0; i0 < mc; i0 += SMR) {
      const int mr = mc - i0 < SMR ? (int)(mc - i0) : SMR;
      const float *ap = a + i0 * rsa;
      float *d = dst + i0 * kc;
      int64_t p = 0;
      if (csa == 1 && mr == SMR) { /* rows contiguous along k: 8 x 8 transposes, 2 rows zero */
         for (; p + 8 <= kc; p += 8) {
            __m256 r[8];
            for (int i = 0; i < SMR; i++) r[i] = _mm256_loadu_ps(ap + i * rsa + p);
            r[6] = r[7] = _mm256_setzero_ps();
            s_transpose8(r);
            for (int t = 0; t < 8; t++) { /* 6 of the 8 lanes */
               float *dt = d + (p + t) * SMR;
               _mm_storeu_ps(dt, _mm256_castps256_ps128(r[t]));
               _mm_storel_pi((__m64 *)(void *)(dt + 4), _mm256_extractf128_ps(r[t], 1));
            }
         }
      } else if (rsa == 1 && mr == SMR) { /* columns contiguous: 6 floats a step */
         for (; p < kc; p++) {
            const float *col = ap + p * csa;
            float *dt = d + p * SMR;
            _mm_storeu_ps(dt, _mm_loadu_ps(col));
            dt[4] = col[4], dt[5] = col[5];
         }
      }
      for (; p < kc; p++)
         for (int i = 0; i < SMR; i++) d[p * SMR + i] = i < mr ? ap[i * rsa + p * csa] : 0.0f;
   }
}

/* micro-panels [q0, q1) of the kc x nc B block, 16 columns each (columns past nc zeroed) */
void lm_sgemm_pack_b_avx2(int64_t kc, int64_t nc, const float *b, int64_t rsb, int64_t csb,
                          int64_t q0, int64_t q1, float *dst) {
   for (int64_t q = q0; q < q1; q++) {
      const int64_t j0 = q * SNR;
      const int nr = nc - j0 < SNR ? (int)(nc - j0) : SNR;
      const float *bp = b + j0 * csb;
      float *d = dst + q * SNR * kc;
      int64_t p = 0;
      if (csb == 1 && nr == SNR) { /* rows contiguous */
         for (; p < kc; p++) {
            _mm256_store_ps(d + p * SNR, _mm256_loadu_ps(bp + p * rsb));
            _mm256_store_ps(d + p * SNR + 8, _mm256_loadu_ps(bp + p * rsb + 8));
         }
      } else if (rsb == 1) { /* columns contiguous (B stored transposed): two 8 x 8 transposes */
         for (; p + 8 <= kc; p += 8) {
            for (int h = 0; h < 2; h++) {
               __m256 r[8];
               for (int j = 0; j < 8; j++)
                  r[j] = 8 * h + j < nr ? _mm256_loadu_ps(bp + (8 * h + j) * csb + p)
                                        : _mm256_setzero_ps();
               s_transpose8(r);
               for (int t = 0; t < 8; t++) _mm256_store_ps(d + (p + t) * SNR + 8 * h, r[t]);
            }
         }
      }
      for (; p < kc; p++)
         for (int j = 0; j < SNR; j++) d[p * SNR + j] = j < nr ? bp[p * rsb + j * csb] : 0.0f;
   }
}

/* The same tile with its operands read where they are: A's column of 6 at pa + p * sa, B's row
 * of 16 at pb + p * sb (unaligned loads; the driver passes packed A, sa = 6, and B in place,
 * gemm_tmpl.c's b_inplace). Both are prefetched S_PF steps ahead. */
enum { S_PF = 16 };
#define S_ASMS_STEP                                                                             \
   "vmovups (%[pb]), %%ymm12\n\t"                                                              \
   "vmovups 32(%[pb]), %%ymm13\n\t"                                                            \
   "prefetcht0 (%[fb])\n\t"                                                                    \
   "prefetcht0 63(%[fb])\n\t"                                                                  \
   "prefetcht0 (%[fa])\n\t"                                                                    \
   S_ASM_ROW(0, 0, 0, 1, 14) S_ASM_ROW(0, 1, 2, 3, 15) S_ASM_ROW(0, 2, 4, 5, 14)               \
   S_ASM_ROW(0, 3, 6, 7, 15) S_ASM_ROW(0, 4, 8, 9, 14) S_ASM_ROW(0, 5, 10, 11, 15)             \
   "add %[sab], %[pa]\n\t"                                                                     \
   "add %[sbb], %[pb]\n\t"                                                                     \
   "add %[sab], %[fa]\n\t"                                                                     \
   "add %[sbb], %[fb]\n\t"

void lm_sgemm_ukr_avx2_strided(int64_t kc, const float *pa, int64_t sa, const float *pb,
                               int64_t sb, float *c, int64_t rsc, int64_t csc, float alpha,
                               float beta, int m, int n) {
   float acc[SMR * SNR] __attribute__((aligned(32)));
   int64_t k2 = kc / 2, kr = kc % 2;
   const int64_t sab = sa * (int64_t)sizeof(float), sbb = sb * (int64_t)sizeof(float);
   const float *fa = pa + S_PF * sa, *fb = pb + S_PF * sb;
   s_prefetch_c(c, rsc, csc, m);
   __asm__ volatile(
      S_ASM_ZERO
      "test %[k2], %[k2]\n\t"
      "jz 2f\n\t"
      ".p2align 4\n"
      "1:\n\t"
      S_ASMS_STEP S_ASMS_STEP
      "dec %[k2]\n\t"
      "jnz 1b\n"
      "2:\n\t"
      "test %[kr], %[kr]\n\t"
      "jz 3f\n\t"
      S_ASMS_STEP
      "3:\n\t"
      S_ASM_OUT_ALL
      : [pa] "+r"(pa), [pb] "+r"(pb), [fa] "+r"(fa), [fb] "+r"(fb), [k2] "+r"(k2), [kr] "+r"(kr)
      : [acc] "r"(acc), [sab] "r"(sab), [sbb] "r"(sbb)
      : S_ASM_CLOBBERS);
   s_store(acc, c, rsc, csc, alpha, beta, m, n);
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
   if (csc == 1)
      for (int i = 0; i < m; i++) {
         _mm_prefetch((const char *)(c + i * rsc), _MM_HINT_T0);
         _mm_prefetch((const char *)(c + i * rsc + DNR - 1), _MM_HINT_T0);
      }
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

/* the float32 GEMM's epilogue at AVX2 (gemm_internal.h): C = act(C + bias) on 8 lanes, with
   act_avx2.h's activations (the elementwise ops' at AVX2, ew_act_f32_avx2.c); the last n % 8
   columns through a stack copy. One loop per activation (act a constant in epi2_tile) and the
   bias loaded whole where 8 columns are there: the bias-only epilogue was 4.7 % of a
   1568x384x1536 linear (perf, Zen 3, 2 threads), with a per-tile scalar bias copy and the
   activation's switch inside the loop. */
static inline __attribute__((always_inline)) void
epi2_tile(const lm_gemm_epi *e, float *c, int m, int n, int64_t rsc, int64_t col0, const int act) {
   for (int j = 0; j < n; j += 8) {
      const int w = n - j < 8 ? n - j : 8;
      if (w == 8) {
         const __m256 bv =
            e->bias ? _mm256_loadu_ps(e->bias + col0 + j) : _mm256_setzero_ps();
         for (int i = 0; i < m; i++) {
            float *r = c + i * rsc + j;
            _mm256_storeu_ps(r, lm_act_ps8(_mm256_add_ps(_mm256_loadu_ps(r), bv), act));
         }
         continue;
      }
      float bt[8] = {0};
      if (e->bias)
         for (int l = 0; l < w; l++) bt[l] = e->bias[col0 + j + l];
      const __m256 bv = _mm256_loadu_ps(bt);
      for (int i = 0; i < m; i++) {
         float *r = c + i * rsc + j, t[8] = {0};
         for (int l = 0; l < w; l++) t[l] = r[l];
         _mm256_storeu_ps(t, lm_act_ps8(_mm256_add_ps(_mm256_loadu_ps(t), bv), act));
         for (int l = 0; l < w; l++) r[l] = t[l];
      }
   }
}

void lm_gemm_epi_tile_avx2(const lm_gemm_epi *e, float *c, int m, int n, int64_t rsc,
                           int64_t col0) {
   switch (e->act) {
#define EPI2_CASE(A)                                                                            \
   case A: epi2_tile(e, c, m, n, rsc, col0, A); break;
      EPI2_CASE(LM_ACT_RELU)
      EPI2_CASE(LM_ACT_RELU6)
      EPI2_CASE(LM_ACT_SILU)
      EPI2_CASE(LM_ACT_SIGMOID)
      EPI2_CASE(LM_ACT_HARDSWISH)
      EPI2_CASE(LM_ACT_HARDSIGMOID)
      EPI2_CASE(LM_ACT_GELU)
      EPI2_CASE(LM_ACT_GELU_TANH)
#undef EPI2_CASE
   default: epi2_tile(e, c, m, n, rsc, col0, 0); break;
   }
}
