/* avx512_util.h -- small AVX-512 helpers shared by the kernels compiled with AVX-512 flags
 * (gemm_avx512*.c, conv_*_avx512*.c, *_amx.c). Include only from files built
 * with AVX-512 flags. */
#ifndef LUMEN_AVX512_UTIL_H
#define LUMEN_AVX512_UTIL_H
#include <immintrin.h>

/* in-register transpose of a 16 x 16 block of 32-bit words: r[i] lane j  ->  r[j] lane i (the
   packing routines of both GEMMs) */
static inline void transpose16(__m512 r[16]) {
   __m512 t[16];
   for (int i = 0; i < 8; i++) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
   }
   for (int i = 0; i < 4; i++) {
      __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]),
              t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
   }
   /* r[4g + c]: rows 4g..4g+3, columns c, c+4, c+8, c+12 (one per 128-bit lane) */
   for (int c = 0; c < 4; c++) {
      t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
      t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
      t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
      t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
   }
   for (int c = 0; c < 4; c++) {
      r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
      r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
   }
}

/* zero the PB x NV accumulators of a register-blocked micro-kernel (the convolutions'
   pointwise, narrow-input, register-blocked and bfloat16 tiles) */
static inline __attribute__((always_inline)) void acc_zero(__m512 (*a)[4], const int PB,
                                                           const int NV) {
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_setzero_ps();
}

/* float32 -> bfloat16, round to nearest even, NaN kept quiet: bit-identical with lm_f2bf (the
   rounding every GEMM path uses; vcvtneps2bf16 would flush denormals). Needs <stdint.h>. */
static inline __m256i bf16_round16(__m512 v) {
   const __m512i x = _mm512_castps_si512(v);
   const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
   __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
   const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
   r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
   return _mm512_cvtepi32_epi16(r);
}

/* 16 bfloat16 values -> float32 (exact) */
static inline __m512 bf16_widen16(__m256i h) {
   return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 words from two k rows of bfloat16 r0 (even k, low half) and r1 (odd k, NULL past kc), the
   first nv (0..16) valid, zeros after: the k-pair layout of vdpbf16ps and TDPBF16PS operands */
static inline __m512i bf16_pair_words(const unsigned short *r0, const unsigned short *r1, int nv) {
   const __mmask16 mk = nv >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nv > 0 ? nv : 0)) - 1u);
   __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r0));
   if (r1)
      w = _mm512_or_si512(
         w, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, r1)), 16));
   return w;
}

#endif
