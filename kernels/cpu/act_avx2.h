/* act_avx2.h -- the float32 activations on 8 lanes (AVX2 + FMA): act_avx512.h's formulas for
 * the CPUs below AVX-512, used by the elementwise ops' AVX2 loops (ew_act_f32_avx2.c) and the
 * GEMM's fused epilogue at AVX2 (gemm_avx2.c), so a fused linear + activation is the unfused
 * chain's on this path too. Include only from files built with -mavx2 -mfma.
 *
 * The same operations in the same order as act_avx512.h (fused multiply-adds, one division for
 * silu, sigmoid and the GELU tanh form), with two differences AVX2 forces: the rounding of
 * x log2 e by vroundps, and exp's power of two applied as two multiplications by 2^(n >> 1) and
 * 2^(n - (n >> 1)) built in the exponent bits (vscalefps is AVX-512; the portable lm_expf splits
 * it the same way). The first product is exact (|n >> 1| <= 75 keeps it normal), so the result is
 * rounded once, as vscalefps rounds it: the lanes are the AVX-512 forms' bits. */
#ifndef LUMEN_ACT_AVX2_H
#define LUMEN_ACT_AVX2_H
#include "act.h"
#include <immintrin.h>

#define LM_AI8 static inline __attribute__((always_inline))

/* y * 2^n, n integral in [-151, 129] (as floats) */
LM_AI8 __m256 lm_act_scale8(__m256 y, __m256 n) {
   const __m256i ni = _mm256_cvtps_epi32(n);
   const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
   const __m256i bias = _mm256_set1_epi32(127);
   const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
   const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
   return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}

/* lm_expf on 8 lanes (act_avx512.h's lm_act_exp512) */
LM_AI8 __m256 lm_act_exp8(__m256 x) {
   __m256 xc = _mm256_min_ps(_mm256_set1_ps(89.0f), x);
   xc = _mm256_max_ps(_mm256_set1_ps(-104.0f), xc);
   const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
   __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
   r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
   __m256 q = _mm256_set1_ps(1.9875691500e-4f);
   q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507e-3f));
   q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073e-3f));
   q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894e-2f));
   q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459e-1f));
   q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201e-1f));
   const __m256 y =
      _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
   /* NaN: n is NaN, its integer conversion garbage; y is NaN and stays NaN */
   return lm_act_scale8(y, n);
}

LM_AI8 __m256 lm_act_neg8(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }

LM_AI8 __m256 lm_act_sigmoid8(__m256 x) {
   const __m256 one = _mm256_set1_ps(1.0f);
   return _mm256_div_ps(one, _mm256_add_ps(one, lm_act_exp8(lm_act_neg8(x))));
}

LM_AI8 __m256 lm_act_silu8(__m256 x) {
   return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), lm_act_exp8(lm_act_neg8(x))));
}

/* GELU's erf form (lm_act_gelu512_cdf) */
LM_AI8 __m256 lm_act_gelu8_cdf(__m256 x, __m256 *cdf, __m256 *s_out) {
   const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752440f));
   const __m256 t = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z), s = _mm256_mul_ps(z, z);
   __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(-1.72853470e-5f), t, _mm256_set1_ps(3.83197126e-4f));
   const __m256 u =
      _mm256_fmadd_ps(_mm256_set1_ps(-3.88396438e-3f), t, _mm256_set1_ps(2.42546219e-2f));
   r = _mm256_fmadd_ps(r, s, u);
   r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-1.06777877e-1f));
   r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-6.34846687e-1f));
   r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-1.28717512e-1f));
   r = _mm256_fmsub_ps(r, t, t);
   const __m256 e = lm_act_exp8(r);
   /* big = z < 0 ? e : 2 - e (NaN: 2 - e) */
   const __m256 big = _mm256_blendv_ps(e, _mm256_sub_ps(_mm256_set1_ps(2.0f), e),
                                       _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_NLT_UQ));
   __m256 p = _mm256_set1_ps(-5.96761703e-4f);
   p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(4.99119423e-3f));
   p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-2.67681349e-2f));
   p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(1.12819925e-1f));
   p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-3.76125336e-1f));
   p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(1.28379166e-1f));
   const __m256 small = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(p, z, z));
   const __m256 onep = _mm256_blendv_ps(
      small, big, _mm256_cmp_ps(t, _mm256_set1_ps(0.927734375f), _CMP_GT_OQ));
   if (cdf) *cdf = _mm256_mul_ps(onep, _mm256_set1_ps(0.5f));
   if (s_out) *s_out = s;
   return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), onep);
}
LM_AI8 __m256 lm_act_gelu8(__m256 x) { return lm_act_gelu8_cdf(x, NULL, NULL); }

#define LM_ACT_KB8 0.79788456080286535588f /* sqrt(2 / pi) */
LM_AI8 __m256 lm_act_gelu_tanh8(__m256 x) {
   const __m256 x2 = _mm256_mul_ps(x, x);
   const __m256 w = _mm256_fmadd_ps(_mm256_mul_ps(x2, _mm256_set1_ps(0.044715f)), x, x);
   const __m256 e = lm_act_exp8(_mm256_mul_ps(w, _mm256_set1_ps(-2.0f * LM_ACT_KB8)));
   return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

LM_AI8 __m256 lm_act_hclamp8(__m256 x) {
   return _mm256_max_ps(_mm256_setzero_ps(),
                        _mm256_min_ps(_mm256_set1_ps(6.0f), _mm256_add_ps(x, _mm256_set1_ps(3.0f))));
}

/* act(v) lane by lane (lm_act_ps) */
LM_AI8 __m256 lm_act_ps8(__m256 v, int act) {
   const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
   switch (act) {
   case LM_ACT_RELU: return _mm256_max_ps(v, zero);
   case LM_ACT_RELU6: return _mm256_min_ps(six, _mm256_max_ps(zero, v));
   case LM_ACT_SILU: return lm_act_silu8(v);
   case LM_ACT_SIGMOID: return lm_act_sigmoid8(v);
   case LM_ACT_HARDSWISH: return _mm256_div_ps(_mm256_mul_ps(v, lm_act_hclamp8(v)), six);
   case LM_ACT_HARDSIGMOID: return _mm256_div_ps(lm_act_hclamp8(v), six);
   case LM_ACT_GELU: return lm_act_gelu8(v);
   case LM_ACT_GELU_TANH: return lm_act_gelu_tanh8(v);
   default: return v;
   }
}

/* a convolution epilogue's 8 outputs: o = act(a + r) (r NULL: no residual; act 0: none) */
LM_AI8 void lm_act_store8(__m256 a, float *o, const float *r, int act) {
   if (r) a = _mm256_add_ps(a, _mm256_loadu_ps(r));
   _mm256_storeu_ps(o, act ? lm_act_ps8(a, act) : a);
}

#endif
