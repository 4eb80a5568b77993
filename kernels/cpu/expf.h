/* expf.h -- lm_expf: exp for float32 without a libm call (the elementwise kernels' exp, sigmoid
 * and silu, ew_kernels.c; the convolutions' fused activations, act.h), and lm_gelu_f32 (GELU's
 * erf form on it). Internal. */
#ifndef LUMEN_EXPF_H
#define LUMEN_EXPF_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp for float32 without a libm call, so exp and sigmoid loops vectorize (Cephes' polynomial
   with Cody-Waite reduction; max error about 1 ulp, like PyTorch's SLEEF u10 kernels). Inputs
   are clamped to [-104, 89] (beyond them the result is 0 or inf anyway), the power of two is
   applied in two halves so that subnormal results come out right, and NaN passes through.
   act_avx512.h's lm_act_exp512 is the same polynomial on 16 lanes with fused multiply-adds and
   vscalefps (within an ulp of this; ew_act_f32_avx512.c's loops and the AVX-512 epilogues). */
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
static inline float lm_expf(float x) {
   float xc = x < 89.0f ? x : 89.0f; /* NaN -> 89, fixed up below */
   xc = xc > -104.0f ? xc : -104.0f;
   float n = nearbyintf(xc * 1.44269504088896341f);
   float r = xc - n * 0.693359375f;
   r = r - n * -2.12194440e-4f;
   float q = 1.9875691500e-4f;
   q = q * r + 1.3981999507e-3f;
   q = q * r + 8.3334519073e-3f;
   q = q * r + 4.1665795894e-2f;
   q = q * r + 1.6666665459e-1f;
   q = q * r + 5.0000001201e-1f;
   float y = q * r * r + r + 1.0f;
   int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
   uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
   float s1, s2;
   memcpy(&s1, &b1, 4);
   memcpy(&s2, &b2, 4);
   float res = y * s1 * s2;
   return x != x ? x : res;
}
/* GELU's exact form for float32, x * 0.5 * (1 + erf(x / sqrt 2)), without a libm call, so its
   loops vectorize (the erf of libm ran one value at a time: 160 of convnext_tiny's 515 ms per
   batch-8 inference, docs/performance.md). erf by Norbert Juffa's float approximations (max
   error 1 ulp against the correctly rounded erf over -10..10, checked in steps of 2^-12): for
   |z| <= 0.927734375, z + z * P(z^2); beyond, erf = sign(z) * (1 - exp(Q(|z|))), and then
   1 + erf(z) is taken as exp(Q) itself for negative z (no cancellation: more accurate than
   1 + erff(z) there) and 2 - exp(Q) for positive z. Both branches are computed and one is
   selected, so the loop has no branch. NaN passes through; +inf gives +inf; -inf gives NaN
   (-inf * 0), as 1 + erff(-inf) did. */
static inline float lm_gelu_f32(float x) {
   const float z = x * 0.70710678118654752440f;
   const float t = fabsf(z), s = z * z;
   float r = -1.72853470e-5f * t + 3.83197126e-4f;
   const float u = -3.88396438e-3f * t + 2.42546219e-2f;
   r = r * s + u;
   r = r * t + -1.06777877e-1f;
   r = r * t + -6.34846687e-1f;
   r = r * t + -1.28717512e-1f;
   r = r * t - t;
   const float e = lm_expf(r);
   const float big = z < 0.0f ? e : 2.0f - e;
   float p = -5.96761703e-4f;
   p = p * s + 4.99119423e-3f;
   p = p * s + -2.67681349e-2f;
   p = p * s + 1.12819925e-1f;
   p = p * s + -3.76125336e-1f;
   p = p * s + 1.28379166e-1f;
   const float small = 1.0f + (p * z + z);
   return x * 0.5f * (t > 0.927734375f ? big : small);
}
#pragma GCC pop_options

#endif
