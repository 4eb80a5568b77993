/* act.h -- the activations of the convolutions' fused epilogue (lm_conv_act, src/conv.h), in
 * portable C: one value (lm_act_f32 / lm_act_f64) and a run of values in place (lm_act_row_f32 /
 * lm_act_row_f64, the portable kernels' epilogue; vectorizable loops, one per activation).
 * act_avx512.h has the AVX-512 forms for the vector kernels' epilogues.
 *
 * The formulas and their order of operations are the elementwise kernels' (ew_kernels.c: the
 * float32 exp of silu and sigmoid is lm_expf; relu6 is lm_clamp's), so a fused result is the
 * unfused conv -> activation chain's, bit for bit in float32 and float64 where the convolution's
 * sum is the same: only the 16-bit types differ (one rounding instead of two). With AVX-512 both
 * take act_avx512.h's forms instead (fused multiply-adds: within an ulp or two of these).
 * Internal. */
#ifndef LUMEN_ACT_H
#define LUMEN_ACT_H
#include "expf.h"
#include "conv.h"
#include <math.h>
#include <stdint.h>

#define LM_ACT_SQRT1_2 0.70710678118654752440
#define LM_ACT_2_SQRTPI 1.12837916709551257390

#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")

/* EXPF: the float32 exp of silu / sigmoid (lm_expf) or float64's exp; GELUF: GELU's erf form
   (expf.h's lm_gelu_f32, the elementwise op's own, or float64's through erf) */
#define LM_ACT_SCALAR(SUF, T, EXPF, GELUF, TANHF)                                                \
   static inline T lm_act_##SUF(T x, int act) {                                                 \
      switch (act) {                                                                            \
      case LM_ACT_RELU: return x < (T)0 ? (T)0 : x;                                             \
      case LM_ACT_RELU6: {                                                                      \
         const T t = x < (T)0 ? (T)0 : x;                                                       \
         return (T)6 < t ? (T)6 : t;                                                            \
      }                                                                                         \
      case LM_ACT_SILU: return x / ((T)1 + EXPF(-x));                                           \
      case LM_ACT_HARDSWISH:                                                                    \
         return x * ((x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3)) / (T)6; \
      case LM_ACT_HARDSIGMOID:                                                                  \
         return ((x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3)) / (T)6;     \
      case LM_ACT_SIGMOID: return (T)1 / ((T)1 + EXPF(-x));                                     \
      case LM_ACT_GELU: return GELUF(x);                                                        \
      case LM_ACT_GELU_TANH: {                                                                  \
         const T kb = (T)(M_SQRT2 * LM_ACT_2_SQRTPI * 0.5);                                     \
         return (T)0.5 * x * ((T)1 + TANHF(kb * (x + (T)0.044715 * x * x * x)));                \
      }                                                                                         \
      default: return x;                                                                        \
      }                                                                                         \
   }                                                                                            \
   /* o[i] = act(o[i]) for i < n: the switch outside, one loop per activation */               \
   static inline void lm_act_row_##SUF(T *o, int64_t n, int act) {                              \
      switch (act) {                                                                            \
      case LM_ACT_RELU:                                                                         \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_RELU);                \
         break;                                                                                 \
      case LM_ACT_RELU6:                                                                        \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_RELU6);               \
         break;                                                                                 \
      case LM_ACT_SILU:                                                                         \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_SILU);                \
         break;                                                                                 \
      case LM_ACT_HARDSWISH:                                                                    \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_HARDSWISH);           \
         break;                                                                                 \
      case LM_ACT_HARDSIGMOID:                                                                  \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_HARDSIGMOID);         \
         break;                                                                                 \
      case LM_ACT_SIGMOID:                                                                      \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_SIGMOID);             \
         break;                                                                                 \
      case LM_ACT_GELU:                                                                         \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_GELU);                \
         break;                                                                                 \
      case LM_ACT_GELU_TANH:                                                                    \
         for (int64_t i = 0; i < n; i++) o[i] = lm_act_##SUF(o[i], LM_ACT_GELU_TANH);           \
         break;                                                                                 \
      default: break;                                                                           \
      }                                                                                         \
   }

LM_ACT_SCALAR(f32, float, lm_expf, lm_gelu_f32, tanhf)
static inline double lm_gelu_f64(double x) { return x * 0.5 * (1.0 + erf(x * LM_ACT_SQRT1_2)); }
LM_ACT_SCALAR(f64, double, exp, lm_gelu_f64, tanh)

#pragma GCC pop_options

#endif
