/* gemm_avx512bf16.c -- the bfloat16 GEMM micro-kernel (vdpbf16ps) and its packing (contract and
 * packed layouts: gemm_internal.h; driver: gemm.c). Compiled with -mavx512bf16 (Makefile rule
 * for *_avx512bf16.c); only called when lm_cpu_isa() >= LM_ISA_AVX512_BF16.
 *
 * Micro-kernel: 14 x 32 float32 register tile = 28 zmm accumulators, as the float32 kernel. One
 * step covers a PAIR of k: two zmm loads of packed B (32 columns x 2 k as 32-bit words), 14
 * broadcasts of one 32-bit A word (row i's pair), 28 vdpbf16ps (each lane += a0*b0 + a1*b1). So
 * per k-pair it moves the same bytes as the float32 kernel per k, for twice the flops.
 * Packing: 32-bit words of the pair-interleaved layout are built either by 16 x 16 transposes
 * of 32-bit words (an operand whose k runs contiguously: each row's pair already is one word),
 * or by zero-extending two k rows to 32 bits and merging them (an operand whose k is the
 * strided dimension).
 */
#include <immintrin.h>
#include "gemm_internal.h"
#include "avx512_util.h"

#define BMR LM_BGEMM_AVX512_MR
#define BNR LM_BGEMM_AVX512_NR

#define B_ROW(i)                                                                                \
   do {                                                                                         \
      const __m512bh av_ = (__m512bh)_mm512_set1_epi32((int)pa[(i)]);                           \
      c##i##0 = _mm512_dpbf16_ps(c##i##0, av_, b0);                                             \
      c##i##1 = _mm512_dpbf16_ps(c##i##1, av_, b1);                                             \
   } while (0)

#define B_STEP()                                                                                \
   do {                                                                                         \
      const __m512bh b0 = (__m512bh)_mm512_load_si512(pb),                                      \
                     b1 = (__m512bh)_mm512_load_si512(pb + 16);                                 \
      B_ROW(0); B_ROW(1); B_ROW(2); B_ROW(3); B_ROW(4); B_ROW(5); B_ROW(6);                     \
      B_ROW(7); B_ROW(8); B_ROW(9); B_ROW(10); B_ROW(11); B_ROW(12); B_ROW(13);                 \
      pa += BMR;                                                                                \
      pb += BNR;                                                                                \
   } while (0)

#define B_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps()


/* row i of a full tile, csc == 1: C = alpha * acc + beta * C */
#define B_STORE(i)                                                                              \
   do {                                                                                         \
      __m512 r0_ = _mm512_mul_ps(va, c##i##0), r1_ = _mm512_mul_ps(va, c##i##1);                \
      if (c_bf16) {                                                                             \
         uint16_t *cr_ = (uint16_t *)c + (i) * rsc;                                             \
         if (beta != 0.0f) {                                                                    \
            r0_ = _mm512_fmadd_ps(vb, bf16_widen16(_mm256_loadu_si256((const __m256i *)cr_)), r0_);  \
            r1_ = _mm512_fmadd_ps(vb, bf16_widen16(_mm256_loadu_si256((const __m256i *)(cr_ + 16))), \
                                  r1_);                                                         \
         }                                                                                      \
         _mm256_storeu_si256((__m256i *)cr_, bf16_round16(r0_));                                      \
         _mm256_storeu_si256((__m256i *)(cr_ + 16), bf16_round16(r1_));                               \
      } else {                                                                                  \
         float *cr_ = (float *)c + (i) * rsc;                                                   \
         if (beta != 0.0f) {                                                                    \
            r0_ = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr_), r0_);                               \
            r1_ = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr_ + 16), r1_);                          \
         }                                                                                      \
         _mm512_storeu_ps(cr_, r0_);                                                            \
         _mm512_storeu_ps(cr_ + 16, r1_);                                                       \
      }                                                                                         \
   } while (0)

#define B_SPILL(i)                                                                              \
   do {                                                                                         \
      _mm512_storeu_ps(tile + (i) * BNR, c##i##0);                                              \
      _mm512_storeu_ps(tile + (i) * BNR + 16, c##i##1);                                         \
   } while (0)

void lm_bgemm_ukr_avx512bf16(int64_t kc2, const uint32_t *pa, const uint32_t *pb, void *c,
                             int64_t rsc, int64_t csc, float alpha, float beta, int m, int n,
                             int c_bf16) {
   B_DECL(0); B_DECL(1); B_DECL(2); B_DECL(3); B_DECL(4); B_DECL(5); B_DECL(6);
   B_DECL(7); B_DECL(8); B_DECL(9); B_DECL(10); B_DECL(11); B_DECL(12); B_DECL(13);
   if (beta != 0.0f && csc == 1) /* C is read at the end: fetch its tile meanwhile */
      for (int i = 0; i < m; i++) {
         const char *cr = (const char *)c + i * rsc * (c_bf16 ? 2 : 4);
         _mm_prefetch(cr, _MM_HINT_T0);
         if (!c_bf16) _mm_prefetch(cr + 64, _MM_HINT_T0);
      }

   int64_t p = kc2;
   for (; p >= 4; p -= 4) {
      _mm_prefetch((const char *)(pa + 16 * BMR), _MM_HINT_T0);
      B_STEP();
      _mm_prefetch((const char *)(pa + 16 * BMR), _MM_HINT_T0);
      B_STEP();
      _mm_prefetch((const char *)(pa + 16 * BMR), _MM_HINT_T0);
      B_STEP();
      B_STEP();
   }
   for (; p > 0; p--) B_STEP();

   if (m == BMR && n == BNR && csc == 1) {
      const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
      B_STORE(0); B_STORE(1); B_STORE(2); B_STORE(3); B_STORE(4); B_STORE(5); B_STORE(6);
      B_STORE(7); B_STORE(8); B_STORE(9); B_STORE(10); B_STORE(11); B_STORE(12); B_STORE(13);
   } else {
      float tile[BMR * BNR] __attribute__((aligned(64)));
      B_SPILL(0); B_SPILL(1); B_SPILL(2); B_SPILL(3); B_SPILL(4); B_SPILL(5); B_SPILL(6);
      B_SPILL(7); B_SPILL(8); B_SPILL(9); B_SPILL(10); B_SPILL(11); B_SPILL(12); B_SPILL(13);
      if (c_bf16)
         lm_gemm_merge_bf(m, n, tile, BNR, (uint16_t *)c, rsc, csc, alpha, beta);
      else
         lm_gemm_merge_s(m, n, tile, BNR, (float *)c, rsc, csc, alpha, beta);
   }
}

/* ---- packing (layouts in gemm_internal.h) ---- */

static inline __mmask16 mask16(int n) { return (__mmask16)((1u << n) - 1u); }
/* the first n (0..32) of 32 16-bit elements */
static inline __mmask32 mask32(int n) {
   return n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
}

/* 16 words (k pairs p20 .. p20+15) of a row whose k runs contiguously, zero past kc */
static inline __m512 row_words(const uint16_t *row, int64_t p20, int64_t kc) {
   const int64_t left = kc - 2 * p20;
   return _mm512_castsi512_ps(
      _mm512_maskz_loadu_epi16(mask32(left < 32 ? (int)left : 32), row + 2 * p20));
}


enum { PFA = 8 }; /* k pairs ahead that pack_a prefetches strided k columns */

void lm_bgemm_pack_a_avx512bf16(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa,
                                int64_t csa, uint32_t *dst) {
   const int64_t kc2 = (kc + 1) / 2;
   const __mmask16 m14 = mask16(BMR);
   if (csa == 1) { /* rows of op(A) contiguous: each row's pair is a word; 16 x 16 transposes */
      for (int64_t i0 = 0; i0 < mc; i0 += BMR) {
         const int mr = mc - i0 < BMR ? (int)(mc - i0) : BMR;
         const uint16_t *ap = a + i0 * rsa;
         uint32_t *d = dst + i0 * kc2;
         for (int64_t p20 = 0; p20 < kc2; p20 += 16) {
            const int np = kc2 - p20 < 16 ? (int)(kc2 - p20) : 16;
            __m512 r[16];
            for (int i = 0; i < 16; i++)
               r[i] = i < mr ? row_words(ap + i * rsa, p20, kc) : _mm512_setzero_ps();
            transpose16(r);
            for (int j = 0; j < np; j++)
               _mm512_mask_storeu_epi32(d + (p20 + j) * BMR, m14, _mm512_castps_si512(r[j]));
         }
      }
   } else if (rsa == 1) { /* columns of op(A) contiguous: merge two k columns into words */
      for (int64_t p2 = 0; p2 < kc2; p2++) {
         const uint16_t *c0 = a + 2 * p2 * csa;
         const uint16_t *c1 = 2 * p2 + 1 < kc ? c0 + csa : NULL;
         /* the k columns are far apart (gout^T of a convolution's weight gradient: one pixel
            row of O channels each) and only mc of each is read: the hardware prefetchers miss
            them, so fetch the two columns PF pairs ahead */
         if (p2 + PFA < kc2) {
            const char *f0 = (const char *)(c0 + 2 * PFA * csa), *f1 = f0 + 2 * csa;
            for (int64_t b = 0; b < 2 * mc; b += 64) {
               _mm_prefetch(f0 + b, _MM_HINT_T0);
               _mm_prefetch(f1 + b, _MM_HINT_T0);
            }
         }
         for (int64_t i0 = 0; i0 < mc; i0 += BMR) {
            const int mr = mc - i0 < BMR ? (int)(mc - i0) : BMR;
            const __m512i w = bf16_pair_words(c0 + i0, c1 ? c1 + i0 : NULL, mr);
            _mm512_mask_storeu_epi32(dst + i0 * kc2 + p2 * BMR, m14, w);
         }
      }
   } else {
      lm_bgemm_pack_a_c(mc, kc, a, rsa, csa, BMR, dst);
   }
}

void lm_bgemm_pack_b_avx512bf16(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb,
                                int64_t csb, int64_t q0, int64_t q1, uint32_t *dst) {
   const int64_t kc2 = (kc + 1) / 2;
   if (csb == 1) { /* rows of op(B) contiguous: merge rows 2p and 2p+1, k outermost */
      for (int64_t p2 = 0; p2 < kc2; p2++) {
         const uint16_t *r0 = b + 2 * p2 * rsb;
         const uint16_t *r1 = 2 * p2 + 1 < kc ? r0 + rsb : NULL;
         for (int64_t q = q0; q < q1; q++) {
            const int64_t j0 = q * BNR;
            const int nr = nc - j0 < BNR ? (int)(nc - j0) : BNR;
            uint32_t *d = dst + q * BNR * kc2 + p2 * BNR;
            _mm512_store_si512(d, bf16_pair_words(r0 + j0, r1 ? r1 + j0 : NULL, nr < 16 ? nr : 16));
            _mm512_store_si512(d + 16, nr > 16 ? bf16_pair_words(r0 + j0 + 16,
                                                            r1 ? r1 + j0 + 16 : NULL, nr - 16)
                                               : _mm512_setzero_si512());
         }
      }
   } else if (rsb == 1) { /* columns of op(B) contiguous (B stored transposed): transposes */
      for (int64_t q = q0; q < q1; q++) {
         const int64_t j0 = q * BNR;
         const int nr = nc - j0 < BNR ? (int)(nc - j0) : BNR;
         uint32_t *d = dst + q * BNR * kc2;
         for (int h = 0; h < 2; h++) {
            const uint16_t *bp = b + (j0 + 16 * h) * csb;
            const int nj = nr - 16 * h; /* valid columns in this half (may be <= 0) */
            for (int64_t p20 = 0; p20 < kc2; p20 += 16) {
               const int np = kc2 - p20 < 16 ? (int)(kc2 - p20) : 16;
               __m512 r[16];
               for (int j = 0; j < 16; j++)
                  r[j] = j < nj ? row_words(bp + j * csb, p20, kc) : _mm512_setzero_ps();
               if (p20 + 64 < kc2) /* a few lines ahead in each of the 16 columns */
                  for (int j = 0; j < 16 && j < nj; j++)
                     _mm_prefetch((const char *)(bp + j * csb + 2 * p20 + 128), _MM_HINT_T0);
               transpose16(r);
               for (int t = 0; t < np; t++)
                  _mm512_store_si512(d + (p20 + t) * BNR + 16 * h, _mm512_castps_si512(r[t]));
            }
         }
      }
   } else {
      lm_bgemm_pack_b_c(kc, nc, b, rsb, csb, BNR, q0, q1, dst);
   }
}

/* ---- unpacked dot form for thin problems: op(A) rows and op(B) columns both contiguous along k
 * (x . W^T of a linear layer with few rows). R x Q tiles of dot products, 32 k per vdpbf16ps
 * step (16 pairs per lane), reduced at the end; no packing, so W is read straight from memory,
 * once per R rows. Masked loads zero the k tail in both operands. */
static inline __attribute__((always_inline)) void dot_tile(const int R, int64_t k,
                                                           const uint16_t *const *ar,
                                                           const uint16_t *const *bc,
                                                           float *out) {
   __m512 acc[4][4];
   for (int r = 0; r < R; r++)
      for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
   for (int64_t p = 0; p < k; p += 32) {
      const __mmask32 mk = mask32(k - p < 32 ? (int)(k - p) : 32);
      __m512bh bv[4];
      for (int q = 0; q < 4; q++) bv[q] = (__m512bh)_mm512_maskz_loadu_epi16(mk, bc[q] + p);
      for (int r = 0; r < R; r++) {
         const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(mk, ar[r] + p);
         for (int q = 0; q < 4; q++) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av, bv[q]);
      }
   }
   for (int r = 0; r < R; r++)
      for (int q = 0; q < 4; q++) out[r * 4 + q] = _mm512_reduce_add_ps(acc[r][q]);
}

int lm_bgemm_direct_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                               int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                               int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                               int c_bf16) {
   if (csa != 1 || rsb != 1) return 0;
   for (int64_t i0 = 0; i0 < m; i0 += 4) {
      const int R = m - i0 < 4 ? (int)(m - i0) : 4;
      const uint16_t *ar[4];
      for (int r = 0; r < 4; r++) ar[r] = a + (i0 + (r < R ? r : R - 1)) * rsa;
      for (int64_t j0 = 0; j0 < n; j0 += 4) {
         const int Q = n - j0 < 4 ? (int)(n - j0) : 4;
         const uint16_t *bc[4];
         for (int q = 0; q < 4; q++) bc[q] = b + (j0 + (q < Q ? q : Q - 1)) * csb;
         float t[16];
         if (R == 1)
            dot_tile(1, k, ar, bc, t);
         else
            dot_tile(4, k, ar, bc, t);
         const int64_t off = i0 * rsc + j0 * csc;
         if (c_bf16)
            lm_gemm_merge_bf(R, Q, t, 4, (uint16_t *)c + off, rsc, csc, alpha, beta);
         else
            lm_gemm_merge_s(R, Q, t, 4, (float *)c + off, rsc, csc, alpha, beta);
      }
   }
   return 1;
}

/* ---- unpacked row form for few rows of op(A) times a row-major op(B) (csb == 1: g . W in a
 * linear layer's backward with a small batch): B is read once, in place. Each k pair's two rows
 * of B are interleaved on the fly (vpunpck{l,h}wd), which puts columns in the order
 * {0-3, 8-11, 16-19, 24-27} (lo) and {4-7, 12-15, 20-23, 28-31} (hi) within 32 columns; the
 * accumulators keep that order and one vpermt2ps per 16 columns undoes it at the end. Up to 8
 * rows x 32 columns = 16 accumulators; A's pair word is gathered per row (any strides). */
static inline __attribute__((always_inline)) void rows_tile(const int R, int64_t k,
                                                            const uint16_t *const *ar,
                                                            int64_t csa, const uint16_t *b,
                                                            int64_t rsb, int nv, float *out) {
   __m512 lo[8], hi[8];
   for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm512_setzero_ps();
   const __mmask32 mk = mask32(nv);
   int64_t p = 0;
   for (; p + 2 <= k; p += 2) {
      const __m512i r0 = _mm512_maskz_loadu_epi16(mk, b + p * rsb);
      const __m512i r1 = _mm512_maskz_loadu_epi16(mk, b + (p + 1) * rsb);
      const __m512bh wl = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
      const __m512bh wh = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
      for (int r = 0; r < R; r++) {
         const uint16_t *ap = ar[r] + p * csa;
         const __m512bh av =
            (__m512bh)_mm512_set1_epi32((int)((uint32_t)ap[0] | ((uint32_t)ap[csa] << 16)));
         lo[r] = _mm512_dpbf16_ps(lo[r], av, wl);
         hi[r] = _mm512_dpbf16_ps(hi[r], av, wh);
      }
   }
   if (p < k) { /* odd k: the last row alone, its partner zero in both operands */
      const __m512i r0 = _mm512_maskz_loadu_epi16(mk, b + p * rsb), z = _mm512_setzero_si512();
      const __m512bh wl = (__m512bh)_mm512_unpacklo_epi16(r0, z);
      const __m512bh wh = (__m512bh)_mm512_unpackhi_epi16(r0, z);
      for (int r = 0; r < R; r++) {
         const __m512bh av = (__m512bh)_mm512_set1_epi32((int)(uint32_t)ar[r][p * csa]);
         lo[r] = _mm512_dpbf16_ps(lo[r], av, wl);
         hi[r] = _mm512_dpbf16_ps(hi[r], av, wh);
      }
   }
   const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
   const __m512i i1 =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
   for (int r = 0; r < R; r++) {
      _mm512_storeu_ps(out + r * 32, _mm512_permutex2var_ps(lo[r], i0, hi[r]));
      _mm512_storeu_ps(out + r * 32 + 16, _mm512_permutex2var_ps(lo[r], i1, hi[r]));
   }
}

int lm_bgemm_rows_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                             int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                             int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                             int c_bf16) {
   if (csb != 1 || m > 8 || m < 1) return 0;
   const uint16_t *ar[8]; /* rows past m repeat the last one (computed, then dropped) */
   for (int r = 0; r < 8; r++) ar[r] = a + (r < m ? r : m - 1) * rsa;
   float t[8 * 32];
   for (int64_t j0 = 0; j0 < n; j0 += 32) {
      const int nv = n - j0 < 32 ? (int)(n - j0) : 32;
      switch (m) {
      case 1: rows_tile(1, k, ar, csa, b + j0, rsb, nv, t); break;
      case 2: rows_tile(2, k, ar, csa, b + j0, rsb, nv, t); break;
      case 3: case 4: rows_tile(4, k, ar, csa, b + j0, rsb, nv, t); break;
      default: rows_tile(8, k, ar, csa, b + j0, rsb, nv, t); break;
      }
      if (c_bf16)
         lm_gemm_merge_bf((int)m, nv, t, 32, (uint16_t *)c + j0 * csc, rsc, csc, alpha, beta);
      else
         lm_gemm_merge_s((int)m, nv, t, 32, (float *)c + j0 * csc, rsc, csc, alpha, beta);
   }
   return 1;
}
