/* gemm_avx512.c -- AVX-512 micro-kernels for lumen's GEMM (see gemm_internal.h for the contract).
 * Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma; only called after CPUID says so.
 *
 * sgemm: 14 x 32 register tile = 28 zmm accumulators; per k step two zmm loads of B and 14
 *        broadcasts of A folded into the FMAs ({1to16} memory operands), 28 FMAs.
 * dgemm: 14 x 16 register tile of doubles, same shape.
 * Also here: the float packing routines (16 x 16 in-register transposes for the operands stored
 * "the other way"), and the unpacked float loops for small and thin problems.
 */
#include <immintrin.h>
#include "gemm_internal.h"
#include "avx512_util.h"
#include "act_avx512.h"

#define SMR LM_SGEMM_AVX512_MR
#define SNR LM_SGEMM_AVX512_NR
#define DMR LM_DGEMM_AVX512_MR
#define DNR LM_DGEMM_AVX512_NR

/* one k step of the 14 x 32 float tile; A values are broadcast from memory. Written with the
   {1to16} memory operand by hand: from _mm512_set1_ps GCC made one vbroadcastss register per A
   value, and with 28 accumulators and 2 B vectors live it ran short of registers and moved
   accumulators around (vmovaps and vfmadd132ps between the FMAs). Two broadcast loads per A value
   instead (30 loads per 28 FMAs, within the load ports). Measured on the Intel Xeon of session
   24 (2 threads, the old and new library alternated 7 times, bench/mm_shape.lua M K N):
   1568x384x1536 183 -> 188 GFLOP/s mean, ahead in 6 of 7 rounds; one thread 88 -> 104; 1024^3
   179 -> 184, one thread 89 -> 104; the weight gradient 384x25088x96 116 -> 134. */
/* prefetch distance, in k steps, of an operand read in place (lm_sgemm_ukr_avx512_strided) */
#ifndef PF_A
#define PF_A 24
#endif
#ifndef PF_B
#define PF_B 24
#endif
/* how many k steps before the end a C tile that is only written (beta 0) is fetched for writing
   (prefetchw): a result larger than the caches would otherwise take each line's read for
   ownership at the store, the tile's 28 lines at once. Measured on a Zen 4 (2 threads, with and
   without alternated in one process, min of 18 calls): ConvNeXt's 25088 x 96 -> 384 linear
   11.7 -> 10.5 ms (bias and GELU: 14.8 -> 13.5), 6272 x 192 -> 768 9.6 -> 9.0; long reductions
   (1024^3, 392 x 3072 -> 768) unchanged. Earlier than this many steps before the end, the tile's
   lines would sit in L1 while the packed operands stream through it. */
#define PF_C 64
#define S_FMA_BC(acc, bv, ptr)                                                                  \
   __asm__("vfmadd231ps %[m]%{1to16%}, %[b], %[c]" : [c] "+v"(acc) : [b] "v"(bv), [m] "m"(*(ptr)))
#define S_ROW(i)                                                                                \
   do {                                                                                         \
      S_FMA_BC(c##i##0, b0, pa + (i));                                                          \
      S_FMA_BC(c##i##1, b1, pa + (i));                                                          \
   } while (0)

/* one k step; sa / sb: how far A's column of 14 and B's row of 32 move a step (SMR / SNR when
   packed, the source's strides when read in place); LOADB: aligned or unaligned loads of B */
#define S_STEP(LOADB)                                                                           \
   do {                                                                                         \
      __m512 b0 = LOADB(pb), b1 = LOADB(pb + 16);                                              \
      S_ROW(0); S_ROW(1); S_ROW(2); S_ROW(3); S_ROW(4); S_ROW(5); S_ROW(6);                     \
      S_ROW(7); S_ROW(8); S_ROW(9); S_ROW(10); S_ROW(11); S_ROW(12); S_ROW(13);                 \
      pa += sa;                                                                                 \
      pb += sb;                                                                                 \
   } while (0)

#define S_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps()

/* store row i of the tile: C = alpha * acc + beta * C */
#define S_STORE(i)                                                                              \
   do {                                                                                         \
      float *cr_ = c + (i) * rsc;                                                               \
      __m512 r0_ = _mm512_mul_ps(va, c##i##0), r1_ = _mm512_mul_ps(va, c##i##1);                \
      if (beta != 0.0f) {                                                                       \
         r0_ = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr_), r0_);                                  \
         r1_ = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr_ + 16), r1_);                             \
      }                                                                                         \
      _mm512_storeu_ps(cr_, r0_);                                                               \
      _mm512_storeu_ps(cr_ + 16, r1_);                                                          \
   } while (0)

#define S_SPILL(i)                                                                              \
   do {                                                                                         \
      _mm512_storeu_ps(tile + (i) * SNR, c##i##0);                                              \
      _mm512_storeu_ps(tile + (i) * SNR + 16, c##i##1);                                         \
   } while (0)

/* The 14 x 32 tile over kc steps. Packed operands step by SMR / SNR; an operand read in place
   (lm_sgemm_ukr_avx512_strided) steps by its source stride, and is prefetched PF_A / PF_B steps
   ahead, since its lines come from L2 or memory rather than a packed block. */
static inline __attribute__((always_inline)) void
s_ukr(int64_t kc, const float *pa, int64_t sa, int a_inplace, const float *pb, int64_t sb,
      int b_inplace, float *c, int64_t rsc, int64_t csc, float alpha, float beta, int m, int n) {
   S_DECL(0); S_DECL(1); S_DECL(2); S_DECL(3); S_DECL(4); S_DECL(5); S_DECL(6);
   S_DECL(7); S_DECL(8); S_DECL(9); S_DECL(10); S_DECL(11); S_DECL(12); S_DECL(13);
   if (beta != 0.0f && csc == 1) /* C is read at the end: fetch its tile meanwhile */
      for (int i = 0; i < m; i++) {
         _mm_prefetch((const char *)(c + i * rsc), _MM_HINT_T0);
         _mm_prefetch((const char *)(c + i * rsc + 16), _MM_HINT_T0);
      }
   /* C only written: fetched for writing PF_C steps before the end (see PF_C) */
   int c_wanted = beta == 0.0f && csc == 1;
#define S_FETCH_C()                                                                             \
   do {                                                                                         \
      if (c_wanted && p <= PF_C) {                                                              \
         for (int i = 0; i < m; i++) {                                                          \
            _mm_prefetch((const char *)(c + i * rsc), _MM_HINT_ET0);                            \
            _mm_prefetch((const char *)(c + i * rsc + 16), _MM_HINT_ET0);                       \
         }                                                                                      \
         c_wanted = 0;                                                                          \
      }                                                                                         \
   } while (0)

   int64_t p = kc;
   if (!a_inplace && !b_inplace) {
      for (; p >= 4; p -= 4) {
         S_FETCH_C();
         _mm_prefetch((const char *)(pa + 16 * SMR), _MM_HINT_T0);
         S_STEP(_mm512_load_ps);
         _mm_prefetch((const char *)(pa + 16 * SMR), _MM_HINT_T0);
         S_STEP(_mm512_load_ps);
         _mm_prefetch((const char *)(pa + 16 * SMR), _MM_HINT_T0);
         S_STEP(_mm512_load_ps);
         S_STEP(_mm512_load_ps);
      }
      for (; p > 0; p--) {
         S_FETCH_C();
         S_STEP(_mm512_load_ps);
      }
   } else if (!b_inplace) { /* A in place */
      for (; p > 0; p--) {
         S_FETCH_C();
         _mm_prefetch((const char *)(pa + PF_A * sa), _MM_HINT_T0);
         _mm_prefetch((const char *)(pa + PF_A * sa + 13), _MM_HINT_T0);
         S_STEP(_mm512_load_ps);
      }
   } else if (!a_inplace) { /* B in place */
      for (; p > 0; p--) {
         S_FETCH_C();
         _mm_prefetch((const char *)(pb + PF_B * sb), _MM_HINT_T0);
         _mm_prefetch((const char *)(pb + PF_B * sb + 31), _MM_HINT_T0);
         S_STEP(_mm512_loadu_ps);
      }
   } else { /* both in place */
      for (; p > 0; p--) {
         S_FETCH_C();
         _mm_prefetch((const char *)(pa + PF_A * sa), _MM_HINT_T0);
         _mm_prefetch((const char *)(pa + PF_A * sa + 13), _MM_HINT_T0);
         _mm_prefetch((const char *)(pb + PF_B * sb), _MM_HINT_T0);
         _mm_prefetch((const char *)(pb + PF_B * sb + 31), _MM_HINT_T0);
         S_STEP(_mm512_loadu_ps);
      }
   }

   if (m == SMR && n == SNR && csc == 1) {
      __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
      S_STORE(0); S_STORE(1); S_STORE(2); S_STORE(3); S_STORE(4); S_STORE(5); S_STORE(6);
      S_STORE(7); S_STORE(8); S_STORE(9); S_STORE(10); S_STORE(11); S_STORE(12); S_STORE(13);
   } else {
      float tile[SMR * SNR] __attribute__((aligned(64)));
      S_SPILL(0); S_SPILL(1); S_SPILL(2); S_SPILL(3); S_SPILL(4); S_SPILL(5); S_SPILL(6);
      S_SPILL(7); S_SPILL(8); S_SPILL(9); S_SPILL(10); S_SPILL(11); S_SPILL(12); S_SPILL(13);
      lm_gemm_merge_s(m, n, tile, SNR, c, rsc, csc, alpha, beta);
   }
}
#undef S_FETCH_C

void lm_sgemm_ukr_avx512(int64_t kc, const float *pa, const float *pb, float *c, int64_t rsc,
                         int64_t csc, float alpha, float beta, int m, int n) {
   s_ukr(kc, pa, SMR, 0, pb, SNR, 0, c, rsc, csc, alpha, beta, m, n);
}

void lm_sgemm_ukr_avx512_strided(int64_t kc, const float *pa, int64_t sa, const float *pb,
                                 int64_t sb, float *c, int64_t rsc, int64_t csc, float alpha,
                                 float beta, int m, int n) {
   /* an operand whose stride is not the packed one is read in place; a packed B keeps its
      aligned loads */
   s_ukr(kc, pa, sa, sa != SMR, pb, sb, sb != SNR, c, rsc, csc, alpha, beta, m, n);
}

/* ---- double: 14 x 16 ---- */
#define D_ROW(i)                                                                                \
   do {                                                                                         \
      __m512d av_ = _mm512_set1_pd(pa[(i)]);                                                    \
      c##i##0 = _mm512_fmadd_pd(av_, b0, c##i##0);                                              \
      c##i##1 = _mm512_fmadd_pd(av_, b1, c##i##1);                                              \
   } while (0)

#define D_STEP()                                                                                \
   do {                                                                                         \
      __m512d b0 = _mm512_load_pd(pb), b1 = _mm512_load_pd(pb + 8);                            \
      D_ROW(0); D_ROW(1); D_ROW(2); D_ROW(3); D_ROW(4); D_ROW(5); D_ROW(6);                     \
      D_ROW(7); D_ROW(8); D_ROW(9); D_ROW(10); D_ROW(11); D_ROW(12); D_ROW(13);                 \
      pa += DMR;                                                                                \
      pb += DNR;                                                                                \
   } while (0)

#define D_DECL(i) __m512d c##i##0 = _mm512_setzero_pd(), c##i##1 = _mm512_setzero_pd()

#define D_STORE(i)                                                                              \
   do {                                                                                         \
      double *cr_ = c + (i) * rsc;                                                              \
      __m512d r0_ = _mm512_mul_pd(va, c##i##0), r1_ = _mm512_mul_pd(va, c##i##1);               \
      if (beta != 0.0) {                                                                        \
         r0_ = _mm512_fmadd_pd(vb, _mm512_loadu_pd(cr_), r0_);                                  \
         r1_ = _mm512_fmadd_pd(vb, _mm512_loadu_pd(cr_ + 8), r1_);                              \
      }                                                                                         \
      _mm512_storeu_pd(cr_, r0_);                                                               \
      _mm512_storeu_pd(cr_ + 8, r1_);                                                           \
   } while (0)

#define D_SPILL(i)                                                                              \
   do {                                                                                         \
      _mm512_storeu_pd(tile + (i) * DNR, c##i##0);                                              \
      _mm512_storeu_pd(tile + (i) * DNR + 8, c##i##1);                                          \
   } while (0)

void lm_dgemm_ukr_avx512(int64_t kc, const double *pa, const double *pb, double *c, int64_t rsc,
                         int64_t csc, double alpha, double beta, int m, int n) {
   D_DECL(0); D_DECL(1); D_DECL(2); D_DECL(3); D_DECL(4); D_DECL(5); D_DECL(6);
   D_DECL(7); D_DECL(8); D_DECL(9); D_DECL(10); D_DECL(11); D_DECL(12); D_DECL(13);

   int64_t p = kc;
   for (; p >= 2; p -= 2) {
      _mm_prefetch((const char *)(pa + 8 * DMR), _MM_HINT_T0);
      D_STEP();
      _mm_prefetch((const char *)(pa + 8 * DMR), _MM_HINT_T0);
      D_STEP();
   }
   for (; p > 0; p--) D_STEP();

   if (m == DMR && n == DNR && csc == 1) {
      __m512d va = _mm512_set1_pd(alpha), vb = _mm512_set1_pd(beta);
      D_STORE(0); D_STORE(1); D_STORE(2); D_STORE(3); D_STORE(4); D_STORE(5); D_STORE(6);
      D_STORE(7); D_STORE(8); D_STORE(9); D_STORE(10); D_STORE(11); D_STORE(12); D_STORE(13);
   } else {
      double tile[DMR * DNR] __attribute__((aligned(64)));
      D_SPILL(0); D_SPILL(1); D_SPILL(2); D_SPILL(3); D_SPILL(4); D_SPILL(5); D_SPILL(6);
      D_SPILL(7); D_SPILL(8); D_SPILL(9); D_SPILL(10); D_SPILL(11); D_SPILL(12); D_SPILL(13);
      lm_gemm_merge_d(m, n, tile, DNR, c, rsc, csc, alpha, beta);
   }
}

/* ---- packing for the float kernel (layouts in gemm_internal.h) ---- */

static inline __mmask16 mask_lo(int n) { return (__mmask16)((1u << n) - 1u); }

/* A block, mc x kc, into 14-row micro-panels (see lm_sgemm_pack_a in gemm_internal.h) */
void lm_sgemm_pack_a_avx512(int64_t mc, int64_t kc, const float *a, int64_t rsa, int64_t csa,
                            float *dst) {
   const __mmask16 m14 = mask_lo(SMR);
   if (csa == 1) { /* rows of op(A) contiguous: 16 x 16 transposes */
      for (int64_t i0 = 0; i0 < mc; i0 += SMR) {
         const int mr = mc - i0 < SMR ? (int)(mc - i0) : SMR;
         const float *ap = a + i0 * rsa;
         float *d = dst + i0 * kc;
         for (int64_t p0 = 0; p0 < kc; p0 += 16) {
            const int np = kc - p0 < 16 ? (int)(kc - p0) : 16;
            const __mmask16 lm = mask_lo(np);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
               r[i] = i < mr ? _mm512_maskz_loadu_ps(lm, ap + i * rsa + p0) : _mm512_setzero_ps();
            /* the same columns of the next micro-panel's rows, one panel ahead */
            if (i0 + 2 * SMR <= mc)
               for (int i = 0; i < SMR; i++)
                  _mm_prefetch((const char *)(ap + (SMR + i) * rsa + p0), _MM_HINT_T0);
            transpose16(r);
            for (int j = 0; j < np; j++) _mm512_mask_storeu_ps(d + (p0 + j) * SMR, m14, r[j]);
         }
      }
   } else if (rsa == 1) { /* columns of op(A) contiguous: copy 14 at a time, k outermost */
      for (int64_t p = 0; p < kc; p++) {
         const float *col = a + p * csa;
         for (int64_t i0 = 0; i0 < mc; i0 += SMR) {
            const int mr = mc - i0 < SMR ? (int)(mc - i0) : SMR;
            __m512 v = _mm512_maskz_loadu_ps(mask_lo(mr), col + i0);
            _mm512_mask_storeu_ps(dst + i0 * kc + p * SMR, m14, v);
         }
      }
   } else {
      for (int64_t i0 = 0; i0 < mc; i0 += SMR) {
         const int mr = mc - i0 < SMR ? (int)(mc - i0) : SMR;
         float *d = dst + i0 * kc;
         for (int64_t p = 0; p < kc; p++)
            for (int i = 0; i < SMR; i++)
               d[p * SMR + i] = i < mr ? a[(i0 + i) * rsa + p * csa] : 0.0f;
      }
   }
}

/* micro-panels [q0, q1) of the kc x nc B block, 32 columns each */
void lm_sgemm_pack_b_avx512(int64_t kc, int64_t nc, const float *b, int64_t rsb, int64_t csb,
                            int64_t q0, int64_t q1, float *dst) {
   if (csb == 1) { /* rows of op(B) contiguous: k outermost so each row is read in order */
      for (int64_t p = 0; p < kc; p++) {
         const float *row = b + p * rsb;
         for (int64_t q = q0; q < q1; q++) {
            const int64_t j0 = q * SNR;
            float *d = dst + q * SNR * kc + p * SNR;
            if (nc - j0 >= SNR) {
               _mm512_store_ps(d, _mm512_loadu_ps(row + j0));
               _mm512_store_ps(d + 16, _mm512_loadu_ps(row + j0 + 16));
            } else {
               const int nr = (int)(nc - j0);
               _mm512_store_ps(d, _mm512_maskz_loadu_ps(mask_lo(nr < 16 ? nr : 16), row + j0));
               _mm512_store_ps(d + 16, nr > 16 ? _mm512_maskz_loadu_ps(mask_lo(nr - 16),
                                                                       row + j0 + 16)
                                               : _mm512_setzero_ps());
            }
         }
      }
   } else if (rsb == 1) { /* columns of op(B) contiguous (B stored transposed): transposes */
      for (int64_t q = q0; q < q1; q++) {
         const int64_t j0 = q * SNR;
         const int nr = nc - j0 < SNR ? (int)(nc - j0) : SNR;
         float *d = dst + q * SNR * kc;
         for (int h = 0; h < 2; h++) {
            const float *bp = b + (j0 + 16 * h) * csb;
            const int nj = nr - 16 * h; /* valid columns in this half (may be <= 0) */
            for (int64_t p0 = 0; p0 < kc; p0 += 16) {
               const int np = kc - p0 < 16 ? (int)(kc - p0) : 16;
               const __mmask16 lm = mask_lo(np);
               __m512 r[16];
               for (int j = 0; j < 16; j++)
                  r[j] = j < nj ? _mm512_maskz_loadu_ps(lm, bp + j * csb + p0)
                                : _mm512_setzero_ps();
               if (p0 + 64 < kc) /* four lines ahead in each of the 16 rows */
                  for (int j = 0; j < 16 && j < nj; j++)
                     _mm_prefetch((const char *)(bp + j * csb + p0 + 64), _MM_HINT_T0);
               transpose16(r);
               for (int t = 0; t < np; t++) _mm512_store_ps(d + (p0 + t) * SNR + 16 * h, r[t]);
            }
         }
      }
   } else {
      for (int64_t q = q0; q < q1; q++) {
         const int64_t j0 = q * SNR;
         const int nr = nc - j0 < SNR ? (int)(nc - j0) : SNR;
         float *d = dst + q * SNR * kc;
         for (int64_t p = 0; p < kc; p++)
            for (int j = 0; j < SNR; j++)
               d[p * SNR + j] = j < nr ? b[p * rsb + (j0 + j) * csb] : 0.0f;
      }
   }
}

/* ---- direct (unpacked) path for small and thin problems ----
 * Tile form (op(B) rows contiguous): R rows x NV zmm of columns per tile, A broadcast from its
 * strided rows, B rows read in place with masked loads, masked stores to C.
 * Dot form (op(A) rows and op(B) columns contiguous, e.g. x . W^T): 4 x 4 tiles of dot products
 * along k, reduced at the end. */

static inline __mmask16 cols_mask(int64_t rem) {
   return rem >= 16 ? (__mmask16)0xffff : rem <= 0 ? (__mmask16)0 : mask_lo((int)rem);
}

/* C[0:R, 0:nv] = alpha * A[0:R, :] B[:, 0:nv] + beta * C, nv <= 16 * NV, columns contiguous */
static inline __attribute__((always_inline)) void direct_tile(
   const int R, const int NV, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
   int64_t rsb, int64_t nv, float *c, int64_t rsc, int64_t csc, float alpha, float beta) {
   __m512 acc[4][4];
   __mmask16 mk[4];
   for (int q = 0; q < NV; q++) mk[q] = cols_mask(nv - 16 * q);
   for (int r = 0; r < R; r++)
      for (int q = 0; q < NV; q++) acc[r][q] = _mm512_setzero_ps();
   for (int64_t p = 0; p < k; p++) {
      const float *bp = b + p * rsb;
      __m512 bv[4];
      for (int q = 0; q < NV; q++) bv[q] = _mm512_maskz_loadu_ps(mk[q], bp + 16 * q);
      for (int r = 0; r < R; r++) {
         __m512 av = _mm512_set1_ps(a[r * rsa + p * csa]);
         for (int q = 0; q < NV; q++) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
      }
   }
   const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
   for (int r = 0; r < R; r++) {
      float *cr = c + r * rsc;
      if (csc == 1) {
         for (int q = 0; q < NV; q++) {
            __m512 v = _mm512_mul_ps(va, acc[r][q]);
            if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk[q], cr + 16 * q), v);
            _mm512_mask_storeu_ps(cr + 16 * q, mk[q], v);
         }
      } else {
         float t[64];
         for (int q = 0; q < NV; q++) _mm512_storeu_ps(t + 16 * q, acc[r][q]);
         lm_gemm_merge_s(1, (int)nv, t, 64, cr, rsc, csc, alpha, beta);
      }
   }
}

#define DT_CASE(R, NV)                                                                          \
   direct_tile(R, NV, k, a, rsa, csa, b, rsb, nv, c, rsc, csc, alpha, beta)

static void direct_tile_any(int R, int64_t k, const float *a, int64_t rsa, int64_t csa,
                            const float *b, int64_t rsb, int64_t nv, float *c, int64_t rsc,
                            int64_t csc, float alpha, float beta) {
   const int NV = nv > 32 ? 4 : nv > 16 ? 2 : 1;
   switch (R * 8 + NV) {
   case 1 * 8 + 1: DT_CASE(1, 1); break;
   case 1 * 8 + 2: DT_CASE(1, 2); break;
   case 1 * 8 + 4: DT_CASE(1, 4); break;
   case 2 * 8 + 1: DT_CASE(2, 1); break;
   case 2 * 8 + 2: DT_CASE(2, 2); break;
   case 2 * 8 + 4: DT_CASE(2, 4); break;
   case 3 * 8 + 1: DT_CASE(3, 1); break;
   case 3 * 8 + 2: DT_CASE(3, 2); break;
   case 3 * 8 + 4: DT_CASE(3, 4); break;
   case 4 * 8 + 1: DT_CASE(4, 1); break;
   case 4 * 8 + 2: DT_CASE(4, 2); break;
   default: DT_CASE(4, 4); break;
   }
}

static void direct_tiles(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t rsa,
                         int64_t csa, const float *b, int64_t rsb, float beta, float *c,
                         int64_t rsc, int64_t csc) {
   for (int64_t j0 = 0; j0 < n; j0 += 64) {
      const int64_t nv = n - j0 < 64 ? n - j0 : 64;
      for (int64_t i0 = 0; i0 < m; i0 += 4) {
         const int R = m - i0 < 4 ? (int)(m - i0) : 4;
         direct_tile_any(R, k, a + i0 * rsa, rsa, csa, b + j0, rsb, nv, c + i0 * rsc + j0 * csc,
                         rsc, csc, alpha, beta);
      }
   }
}

/* dot form: C(i,j) = alpha * <A row i, op(B) column j> + beta * C, both contiguous along k */
static inline __attribute__((always_inline)) void direct_dot_tile(
   const int R, int64_t k, const float *const *ar, const float *const *bc, float *acc_out) {
   __m512 acc[4][4];
   for (int r = 0; r < R; r++)
      for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
   for (int64_t p = 0; p < k; p += 16) {
      const __mmask16 mk = cols_mask(k - p);
      __m512 bv[4];
      for (int q = 0; q < 4; q++) bv[q] = _mm512_maskz_loadu_ps(mk, bc[q] + p);
      for (int r = 0; r < R; r++) {
         __m512 av = _mm512_maskz_loadu_ps(mk, ar[r] + p);
         for (int q = 0; q < 4; q++) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
      }
   }
   for (int r = 0; r < R; r++)
      for (int q = 0; q < 4; q++) acc_out[r * 4 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

static void direct_dots(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t rsa,
                        const float *b, int64_t csb, float beta, float *c, int64_t rsc,
                        int64_t csc) {
   for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int R = m - i0 < 4 ? (int)(m - i0) : 4;
      const float *ar[4];
      for (int r = 0; r < 4; r++) ar[r] = a + (i0 + (r < R ? r : R - 1)) * rsa;
      for (int64_t j0 = 0; j0 < n; j0 += 4) {
         const int Q = n - j0 < 4 ? (int)(n - j0) : 4;
         const float *bc[4];
         for (int q = 0; q < 4; q++) bc[q] = b + (j0 + (q < Q ? q : Q - 1)) * csb;
         float t[16];
         if (R == 1)
            direct_dot_tile(1, k, ar, bc, t);
         else
            direct_dot_tile(4, k, ar, bc, t);
         lm_gemm_merge_s(R, Q, t, 4, c + i0 * rsc + j0 * csc, rsc, csc, alpha, beta);
      }
   }
}

int lm_sgemm_direct_avx512(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t rsa, int64_t csa, const float *b, int64_t rsb, int64_t csb,
                           float beta, float *c, int64_t rsc, int64_t csc) {
   const int dot_ok = csa == 1 && (rsb == 1 || k == 1);
   if (n == 1 && dot_ok) {
      direct_dots(m, n, k, alpha, a, rsa, b, csb, beta, c, rsc, csc);
      return 1;
   }
   if (csb == 1 || n == 1) {
      direct_tiles(m, n, k, alpha, a, rsa, csa, b, rsb, beta, c, rsc, csc);
      return 1;
   }
   if (dot_ok && (k >= 32 || k * n > 4096)) {
      direct_dots(m, n, k, alpha, a, rsa, b, csb, beta, c, rsc, csc);
      return 1;
   }
   if (k * n <= 4096) { /* small op(B) of any strides: a row-major copy, then tiles */
      float bt[4096];
      for (int64_t p = 0; p < k; p++)
         for (int64_t j = 0; j < n; j++) bt[p * n + j] = b[p * rsb + j * csb];
      direct_tiles(m, n, k, alpha, a, rsa, csa, bt, n, beta, c, rsc, csc);
      return 1;
   }
   if (dot_ok) {
      direct_dots(m, n, k, alpha, a, rsa, b, csb, beta, c, rsc, csc);
      return 1;
   }
   return 0;
}

/* the float32 GEMM's epilogue on one tile (gemm_internal.h): C = act(C + bias), 16 columns a
   vector, the tail masked */
void lm_gemm_epi_tile_avx512(const lm_gemm_epi *e, float *c, int m, int n, int64_t rsc,
                             int64_t col0) {
   for (int j = 0; j < n; j += 16) {
      const int left = n - j;
      const __mmask16 mk = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
      const __m512 bv = e->bias ? _mm512_maskz_loadu_ps(mk, e->bias + col0 + j) : _mm512_setzero_ps();
      for (int i = 0; i < m; i++) {
         float *r = c + i * rsc + j;
         __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, r), bv);
         if (e->act) v = lm_act_ps(v, e->act);
         _mm512_mask_storeu_ps(r, mk, v);
      }
   }
}

/* ---- bfloat16 thin products on plain AVX-512 (the float32 route where vdpbf16ps does not pay,
 * i.e. AMX off on Intel Xeons) ---- */

/* x . W^T with at most 8 rows of op(A), A's rows and W's rows along k (csa == 1, rsb == 1): the
   A rows widened once into float32 (L1/L2), then every row of W read once, widened 16 values at a
   time and multiplied into all the A rows. The general float32 route widened all of W into a
   float32 copy first (a transposed, strided read) and the portable loops read W once per row of
   A: a bfloat16 resnet50 classifier (8 x 2048 x 1000) took 5.8 ms against 0.64 in float32. */
int lm_bgemm_dot_avx512(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                        float beta, void *c, int64_t rsc, int64_t csc, int c_bf16) {
   enum { ROWS = 8 };
   if (m < 1 || m > ROWS || csa != 1 || rsb != 1 || k < 1) return 0;
   const int64_t kp = (k + 15) / 16 * 16;
   float *aw = (float *)lm_alloc((size_t)(m * kp) * sizeof(float));
   if (!aw) {
      lm_clear_error();
      return 0;
   }
   for (int64_t i = 0; i < m; i++) {
      const uint16_t *ai = a + i * rsa;
      float *d = aw + i * kp;
      for (int64_t p = 0; p < kp; p += 16) {
         const __mmask16 mk = k - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - p)) - 1u);
         _mm512_storeu_ps(d + p, bf16_widen16(_mm256_maskz_loadu_epi16(mk, ai + p)));
      }
   }
   for (int64_t j = 0; j < n; j++) {
      const uint16_t *bj = b + j * csb;
      __m512 acc[ROWS];
      for (int i = 0; i < ROWS; i++) acc[i] = _mm512_setzero_ps();
      for (int64_t p = 0; p < kp; p += 16) {
         const __mmask16 mk = k - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - p)) - 1u);
         const __m512 w = bf16_widen16(_mm256_maskz_loadu_epi16(mk, bj + p));
#pragma GCC unroll 8
         for (int i = 0; i < ROWS; i++)
            if (i < m) acc[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(aw + i * kp + p), acc[i]);
      }
      for (int64_t i = 0; i < m; i++) {
         const float s = _mm512_reduce_add_ps(acc[i]);
         if (c_bf16)
            lm_gemm_merge_bf(1, 1, &s, 1, (uint16_t *)c + i * rsc + j * csc, rsc, csc, alpha,
                             beta);
         else
            lm_gemm_merge_s(1, 1, &s, 1, (float *)c + i * rsc + j * csc, rsc, csc, alpha, beta);
      }
   }
   lm_free(aw, (size_t)(m * kp) * sizeof(float));
   return 1;
}
