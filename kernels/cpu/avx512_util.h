/* avx512_util.h -- small AVX-512 helpers shared by the kernels compiled with AVX-512 flags
 * (gemm_avx512*.c, conv_avx512*.c, conv_rb_avx512.c). Include only from *_avx512*.c files. */
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

#endif
