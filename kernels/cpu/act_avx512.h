/* act_avx512.h -- the convolutions' fused activations (lm_conv_act, src/conv.h) on 16 float32
 * lanes, for the epilogues of the AVX-512 kernels (float32, and the bfloat16 kernels before
 * their rounding). Include only from files built with the AVX-512 flags.
 *
 * Each is act.h's scalar formula with the same operations in the same order (no contraction
 * into FMA: the elementwise kernels are compiled without it), so the lanes get the bits
 * lm_act_f32 (and the elementwise op) would: relu max(v, 0) as the kernels always did, relu6 and
 * the hard forms by max / min in the operand order that keeps a NaN, silu and sigmoid through
 * lm_act_exp512 (lm_expf's arithmetic, its power of two applied by vscalefps). GELU (erf) and its
 * tanh form call the scalar libm functions lane by lane: exact, not fast (no model here has a
 * GELU right after a convolution). */
#ifndef LUMEN_ACT_AVX512_H
#define LUMEN_ACT_AVX512_H
#include "act.h"
#include <immintrin.h>

/* lm_expf on 16 lanes (the same bits for results in the normal range) */
static inline __attribute__((always_inline)) __m512 lm_act_exp512(__m512 x) {
   __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(89.0f)); /* x < 89 ? x : 89 (NaN -> 89) */
   xc = _mm512_max_ps(xc, _mm512_set1_ps(-104.0f));     /* xc > -104 ? xc : -104 */
   const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
   __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
   r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
   __m512 q = _mm512_set1_ps(1.9875691500e-4f);
   q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.3981999507e-3f));
   q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(8.3334519073e-3f));
   q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(4.1665795894e-2f));
   q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(1.6666665459e-1f));
   q = _mm512_add_ps(_mm512_mul_ps(q, r), _mm512_set1_ps(5.0000001201e-1f));
   const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(q, r), r), r),
                                  _mm512_set1_ps(1.0f));
   /* y * 2^n in one rounding (vscalefps): lm_expf's y * 2^(n/2) * 2^(n - n/2) is exact but
      where the result is subnormal (x < -87.3), so the two agree but there (where silu and
      sigmoid add the result to 1) */
   const __m512 res = _mm512_scalef_ps(y, n);
   return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), res, x);
}

/* the lanes one at a time through the scalar formula (GELU and its tanh form) */
static inline __m512 lm_act_lanes512(__m512 v, int act) {
   float b[16] __attribute__((aligned(64)));
   _mm512_store_ps(b, v);
   for (int i = 0; i < 16; i++) b[i] = lm_act_f32(b[i], act);
   return _mm512_load_ps(b);
}

/* act(v) lane by lane; LM_ACT_NONE (or anything unknown) leaves v as it is */
static inline __attribute__((always_inline)) __m512 lm_act_ps(__m512 v, int act) {
   const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
   switch (act) {
   case LM_ACT_RELU: return _mm512_max_ps(v, zero);
   case LM_ACT_RELU6: return _mm512_min_ps(six, _mm512_max_ps(zero, v));
   case LM_ACT_SILU: {
      const __m512 e = lm_act_exp512(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)));
      return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
   }
   case LM_ACT_SIGMOID: {
      const __m512 one = _mm512_set1_ps(1.0f);
      const __m512 e = lm_act_exp512(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)));
      return _mm512_div_ps(one, _mm512_add_ps(one, e));
   }
   case LM_ACT_HARDSWISH: {
      const __m512 r =
         _mm512_max_ps(zero, _mm512_min_ps(six, _mm512_add_ps(v, _mm512_set1_ps(3.0f))));
      return _mm512_div_ps(_mm512_mul_ps(v, r), six);
   }
   case LM_ACT_HARDSIGMOID: {
      const __m512 r =
         _mm512_max_ps(zero, _mm512_min_ps(six, _mm512_add_ps(v, _mm512_set1_ps(3.0f))));
      return _mm512_div_ps(r, six);
   }
   case LM_ACT_GELU:
   case LM_ACT_GELU_TANH: return lm_act_lanes512(v, act);
   default: return v;
   }
}

#endif
