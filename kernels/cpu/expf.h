/* expf.h -- lm_expf: exp for float32 without a libm call (the elementwise kernels' exp, sigmoid
 * and silu, ew_kernels.c; the convolutions' fused activations, act.h). Internal. */
#ifndef LUMEN_EXPF_H
#define LUMEN_EXPF_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp for float32 without a libm call, so exp and sigmoid loops vectorize (Cephes' polynomial
   with Cody-Waite reduction; max error about 1 ulp, like PyTorch's SLEEF u10 kernels). Inputs
   are clamped to [-104, 89] (beyond them the result is 0 or inf anyway), the power of two is
   applied in two halves so that subnormal results come out right, and NaN passes through.
   act_avx512.h's lm_act_exp512 is the same arithmetic on 16 lanes (the same bits). */
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
#pragma GCC pop_options

#endif
