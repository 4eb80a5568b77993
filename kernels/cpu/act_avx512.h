/* act_avx512.h -- the float32 activations on 16 lanes: the convolutions' fused activations
 * (lm_conv_act, src/conv.h) in the epilogues of the AVX-512 kernels (float32, and the bfloat16
 * kernels before their rounding), and the elementwise ops' AVX-512 loops (ew_act_f32_avx512.c:
 * the same functions, so a fused result is the unfused chain's on this path too). Include only
 * from files built with the AVX-512 flags (-mfma among them).
 *
 * The formulas are act.h's (expf.h's lm_expf, Cephes' polynomial; lm_gelu_f32, Juffa's erf)
 * with the multiply-adds fused (vfmadd: one rounding where act.h has two) and the power of two
 * applied by vscalefps, so a lane can differ from the portable loops' by an ulp or two, within
 * those approximations' error (about 1 ulp) and the spec tolerances. relu max(v, 0) as the
 * kernels always did; relu6 and the hard forms by max / min in the operand order that keeps a
 * NaN. silu, sigmoid and the GELU tanh form divide once (vdivps, as PyTorch's vectorized
 * kernels). NaN and +-inf give what PyTorch's float32 formulas give (spec/activations_spec.lua
 * checks them). */
#ifndef LUMEN_ACT_AVX512_H
#define LUMEN_ACT_AVX512_H
#include "act.h"
#include <immintrin.h>

/* lm_expf on 16 lanes: clamped to [-104, 89] (min / max with the constant first, so NaN passes
   through), n = round(x log2 e), r = x - n ln 2 in two fused steps (Cody-Waite), Cephes'
   degree-5 polynomial by Horner's rule in vfmadd, y * 2^n by vscalefps (one rounding: results
   in the subnormal range are right too) */
static inline __attribute__((always_inline)) __m512 lm_act_exp512(__m512 x) {
   __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
   xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), xc);
   const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
   __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
   r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
   __m512 q = _mm512_set1_ps(1.9875691500e-4f);
   q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.3981999507e-3f));
   q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.3334519073e-3f));
   q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.1665795894e-2f));
   q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.6666665459e-1f));
   q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.0000001201e-1f));
   const __m512 y =
      _mm512_add_ps(_mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
   return _mm512_scalef_ps(y, n);
}

/* 1 / (1 + exp(-x)): sigmoid, and silu's and the GELU tanh form's factor */
static inline __attribute__((always_inline)) __m512 lm_act_sigmoid512(__m512 x) {
   const __m512 one = _mm512_set1_ps(1.0f);
   const __m512 e = lm_act_exp512(_mm512_xor_ps(x, _mm512_set1_ps(-0.0f)));
   return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

/* silu: x / (1 + exp(-x)) (act.h's order). exp overflows to inf from x = -88.8 down, so -inf
   gives NaN (-inf / inf) as PyTorch's */
static inline __attribute__((always_inline)) __m512 lm_act_silu512(__m512 x) {
   const __m512 e = lm_act_exp512(_mm512_xor_ps(x, _mm512_set1_ps(-0.0f)));
   return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* GELU's erf form, lm_gelu_f32 on 16 lanes. Sets *cdf (when not NULL) to 0.5 (1 + erf(x/sqrt 2))
   and *s to x^2 / 2 (the backward's). NaN passes; +inf gives +inf, -inf NaN (-inf * 0) */
static inline __attribute__((always_inline)) __m512 lm_act_gelu512_cdf(__m512 x, __m512 *cdf,
                                                                        __m512 *s_out) {
   const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752440f));
   const __m512 t = _mm512_abs_ps(z), s = _mm512_mul_ps(z, z);
   __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(-1.72853470e-5f), t, _mm512_set1_ps(3.83197126e-4f));
   const __m512 u =
      _mm512_fmadd_ps(_mm512_set1_ps(-3.88396438e-3f), t, _mm512_set1_ps(2.42546219e-2f));
   r = _mm512_fmadd_ps(r, s, u);
   r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(-1.06777877e-1f));
   r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(-6.34846687e-1f));
   r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(-1.28717512e-1f));
   r = _mm512_fmsub_ps(r, t, t);
   const __m512 e = lm_act_exp512(r);
   /* big = z < 0 ? e : 2 - e */
   const __m512 big = _mm512_mask_sub_ps(e, _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_NLT_UQ),
                                         _mm512_set1_ps(2.0f), e);
   __m512 p = _mm512_set1_ps(-5.96761703e-4f);
   p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(4.99119423e-3f));
   p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-2.67681349e-2f));
   p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(1.12819925e-1f));
   p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-3.76125336e-1f));
   p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(1.28379166e-1f));
   const __m512 small = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(p, z, z));
   /* 1 + erf(z): t > 0.927734375 ? big : small (NaN: small, NaN) */
   const __m512 onep = _mm512_mask_blend_ps(
      _mm512_cmp_ps_mask(t, _mm512_set1_ps(0.927734375f), _CMP_GT_OQ), small, big);
   if (cdf) *cdf = _mm512_mul_ps(onep, _mm512_set1_ps(0.5f));
   if (s_out) *s_out = s;
   return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), onep);
}
static inline __attribute__((always_inline)) __m512 lm_act_gelu512(__m512 x) {
   return lm_act_gelu512_cdf(x, NULL, NULL);
}

/* GELU's tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), taken as
   x / (1 + exp(-2u)) (the same value: 1 + tanh(u) = 2 / (1 + exp(-2u)); no tanh, no
   cancellation). -inf gives NaN (-inf / inf) as PyTorch's -inf * (1 + tanh(-inf)) */
#define LM_ACT_KB 0.79788456080286535588f /* sqrt(2 / pi) */
static inline __attribute__((always_inline)) __m512 lm_act_gelu_tanh512(__m512 x) {
   const __m512 x2 = _mm512_mul_ps(x, x);
   const __m512 w = _mm512_fmadd_ps(_mm512_mul_ps(x2, _mm512_set1_ps(0.044715f)), x, x);
   const __m512 e = lm_act_exp512(_mm512_mul_ps(w, _mm512_set1_ps(-2.0f * LM_ACT_KB)));
   return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* hardswish x * clamp(x + 3, 0, 6) / 6 and hardsigmoid clamp(x + 3, 0, 6) / 6 (act.h's order) */
static inline __attribute__((always_inline)) __m512 lm_act_hclamp512(__m512 x) {
   return _mm512_max_ps(_mm512_setzero_ps(),
                        _mm512_min_ps(_mm512_set1_ps(6.0f), _mm512_add_ps(x, _mm512_set1_ps(3.0f))));
}

/* act(v) lane by lane; LM_ACT_NONE (or anything unknown) leaves v as it is */
static inline __attribute__((always_inline)) __m512 lm_act_ps(__m512 v, int act) {
   const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
   switch (act) {
   case LM_ACT_RELU: return _mm512_max_ps(v, zero);
   case LM_ACT_RELU6: return _mm512_min_ps(six, _mm512_max_ps(zero, v));
   case LM_ACT_SILU: return lm_act_silu512(v);
   case LM_ACT_SIGMOID: return lm_act_sigmoid512(v);
   case LM_ACT_HARDSWISH: return _mm512_div_ps(_mm512_mul_ps(v, lm_act_hclamp512(v)), six);
   case LM_ACT_HARDSIGMOID: return _mm512_div_ps(lm_act_hclamp512(v), six);
   case LM_ACT_GELU: return lm_act_gelu512(v);
   case LM_ACT_GELU_TANH: return lm_act_gelu_tanh512(v);
   default: return v;
   }
}

#endif
