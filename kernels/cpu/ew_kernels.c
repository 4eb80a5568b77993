/* ew_kernels.c -- the compute kernels of the elementwise engine.
 *
 * Every kernel runs over dense arrays of its compute type (float for float32/float16/bfloat16,
 * double for float64, int64 for the integer types and bool); the engine (kernels/cpu/elementwise.c) gathers
 * and converts anything else into aligned chunks first. The loops are plain C that the compiler
 * vectorizes; LM_CLONES builds AVX-512 / AVX2 / baseline versions picked at load time. The
 * float32 activations (GELU, SiLU, sigmoid, the hard forms, the GELU / SiLU gradients) have
 * AVX-512 loops with FMA in ew_act_f32_avx512.c, which elementwise.c takes instead of these at
 * lm_cpu_isa() >= LM_ISA_AVX512 ("ew_act_avx512").
 * Integer arithmetic wraps (computed in uint64) as PyTorch's does. */
#include "ew.h"
#include "expf.h"
#include <math.h>

typedef int64_t i64;
typedef uint64_t u64;
typedef uint8_t u8;

#define KARGS char *o_, const char *a_, const char *b_, const char *c_, int64_t n, const lm_kparams *p
#define UNUSED_ARGS                                                                             \
   (void)a_;                                                                                    \
   (void)b_;                                                                                    \
   (void)c_;                                                                                    \
   (void)p

/* one input */
#define K1(NAME, T, OT, PRE, EXPR)                                                              \
   static LM_CLONES __attribute__((unused)) void NAME(KARGS) {                                                          \
      OT *o = (OT *)o_;                                                                         \
      const T *a = (const T *)a_;                                                               \
      UNUSED_ARGS;                                                                              \
      PRE;                                                                                      \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                   \
         const T x = a[i];                                                                      \
         o[i] = (OT)(EXPR);                                                                     \
      }                                                                                         \
   }

/* two inputs, with the one-scalar variants */
#define K2(NAME, T, OT, PRE, EXPR)                                                              \
   static LM_CLONES void NAME##_vv(KARGS) {                                                     \
      OT *o = (OT *)o_;                                                                         \
      const T *a = (const T *)a_, *b = (const T *)b_;                                           \
      UNUSED_ARGS;                                                                              \
      PRE;                                                                                      \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                   \
         const T x = a[i], y = b[i];                                                            \
         o[i] = (OT)(EXPR);                                                                     \
      }                                                                                         \
   }                                                                                            \
   static LM_CLONES void NAME##_vs(KARGS) {                                                     \
      OT *o = (OT *)o_;                                                                         \
      const T *a = (const T *)a_;                                                               \
      const T y = *(const T *)b_;                                                               \
      UNUSED_ARGS;                                                                              \
      PRE;                                                                                      \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                   \
         const T x = a[i];                                                                      \
         o[i] = (OT)(EXPR);                                                                     \
      }                                                                                         \
   }                                                                                            \
   static LM_CLONES void NAME##_sv(KARGS) {                                                     \
      OT *o = (OT *)o_;                                                                         \
      const T *b = (const T *)b_;                                                               \
      const T x = *(const T *)a_;                                                               \
      UNUSED_ARGS;                                                                              \
      PRE;                                                                                      \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                   \
         const T y = b[i];                                                                      \
         o[i] = (OT)(EXPR);                                                                     \
      }                                                                                         \
   }

/* three inputs of the compute type */
#define K3(NAME, T, PRE, EXPR)                                                                  \
   static LM_CLONES __attribute__((unused)) void NAME(KARGS) {                                                          \
      T *o = (T *)o_;                                                                           \
      const T *a = (const T *)a_, *b = (const T *)b_, *c = (const T *)c_;                       \
      UNUSED_ARGS;                                                                              \
      PRE;                                                                                      \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) {                                   \
         const T x = a[i], y = b[i], z = c[i];                                                  \
         o[i] = (T)(EXPR);                                                                      \
      }                                                                                         \
   }

/* where: a bool condition, two values */
#define KWHERE(NAME, T)                                                                         \
   static LM_CLONES __attribute__((unused)) void NAME(KARGS) {                                                          \
      T *o = (T *)o_;                                                                           \
      const u8 *a = (const u8 *)a_;                                                             \
      const T *b = (const T *)b_, *c = (const T *)c_;                                           \
      UNUSED_ARGS;                                                                              \
      _Pragma("GCC ivdep") for (int64_t i = 0; i < n; i++) o[i] = a[i] ? b[i] : c[i];         \
   }

#define NOPRE (void)0
#define KS2(NAME) {NAME##_vv, NAME##_vs, NAME##_sv}
#define KS1(NAME) {NAME, NULL, NULL}
#define KNONE {NULL, NULL, NULL}

static inline i64 wadd(i64 x, i64 y) { return (i64)((u64)x + (u64)y); }
static inline i64 wsub(i64 x, i64 y) { return (i64)((u64)x - (u64)y); }
static inline i64 wmul(i64 x, i64 y) { return (i64)((u64)x * (u64)y); }

static inline i64 powi64(i64 b, i64 e) {
   if (e < 0) {
      if (b == 1) return 1;
      if (b == -1) return (e & 1) ? -1 : 1;
      return 0;
   }
   u64 r = 1, bb = (u64)b;
   while (e) {
      if (e & 1) r *= bb;
      bb *= bb;
      e >>= 1;
   }
   return (i64)r;
}

static inline i64 fmodi64(i64 x, i64 y, int *err) {
   if (y == 0) {
      if (err) __atomic_store_n(err, 1, __ATOMIC_RELAXED);
      return 0;
   }
   if (y == -1) return 0;
   return x % y;
}

/* ---------------------------------------------------------------- vectorizable expf (expf.h) */

#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
K1(exp_vf32, float, float, NOPRE, lm_expf(x))
K1(sigmoid_vf32, float, float, NOPRE, 1.0f / (1.0f + lm_expf(-x)))
K1(silu_vf32, float, float, NOPRE, x / (1.0f + lm_expf(-x)))
K1(gelu_vf32, float, float, NOPRE, lm_gelu_f32(x))
K2(silub_vf32, float, float, NOPRE,
   x * (1.0f / (1.0f + lm_expf(-y))) * (1.0f + y * (1.0f - 1.0f / (1.0f + lm_expf(-y)))))
#pragma GCC pop_options

/* ---------------------------------------------------------------- activations
   PyTorch's formulas (aten/src/ATen/native/cpu/Activation.cpp); x the input, g the gradient */
#define LM_SQRT1_2 0.70710678118654752440
#define LM_2_SQRTPI 1.12837916709551257390
#define ACT_FLOAT(SUF, T, EXPF, ERFF, TANHF, LOG1PF, EXPM1F)                                     \
   K1(gelu_##SUF, T, T, NOPRE, x * (T)0.5 * ((T)1 + ERFF(x * (T)LM_SQRT1_2)))                   \
   K1(gelut_##SUF, T, T, const T kb = (T)(M_SQRT2 * LM_2_SQRTPI * 0.5),                         \
      (T)0.5 * x * ((T)1 + TANHF(kb * (x + (T)0.044715 * x * x * x))))                          \
   K1(hswish_##SUF, T, T, NOPRE,                                                                \
      x * ((x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3)) / (T)6)           \
   K1(hsig_##SUF, T, T, NOPRE,                                                                  \
      ((x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3)) / (T)6)               \
   K1(mish_##SUF, T, T, NOPRE, x * TANHF(LOG1PF(EXPF(x))))                                      \
   K2(gelub_##SUF, T, T, const T kalpha = (T)LM_SQRT1_2;                                        \
      const T kbeta = (T)(LM_2_SQRTPI * LM_SQRT1_2 * 0.5),                                      \
      x * ((T)0.5 * ((T)1 + ERFF(y * kalpha)) + y * (kbeta * EXPF((T)-0.5 * y * y))))           \
   K2(geluth_##SUF, T, T, const T kb = (T)(M_SQRT2 * LM_2_SQRTPI * 0.5),                        \
      x * ((T)0.5 * ((T)1 + TANHF(kb * (y + (T)0.044715 * y * y * y))) +                       \
           (T)0.5 * y *                                                                         \
              ((T)1 - TANHF(kb * (y + (T)0.044715 * y * y * y)) *                               \
                         TANHF(kb * (y + (T)0.044715 * y * y * y))) *                           \
              (kb * ((T)1 + (T)3 * (T)0.044715 * y * y))))                                      \
   K2(hswishb_##SUF, T, T, NOPRE,                                                               \
      y < (T)-3 ? (T)0 : y <= (T)3 ? x * (y / (T)3 + (T)0.5) : x)                              \
   /* PyTorch multiplies by the float 1/6 also in float64 */                                   \
   K2(hsigb_##SUF, T, T, NOPRE, (y > (T)-3 && y < (T)3) ? x * (T)(1.0f / 6.0f) : (T)0)                      \
   K2(mishb_##SUF, T, T, NOPRE,                                                                 \
      x * (TANHF(LOG1PF(EXPF(y))) +                                                             \
           y * ((T)1 / ((T)1 + EXPF(-y))) *                                                     \
              ((T)1 - TANHF(LOG1PF(EXPF(y))) * TANHF(LOG1PF(EXPF(y))))))                         \
   K2(relu6b_##SUF, T, T, NOPRE, (y <= (T)0 || y >= (T)6) ? (T)0 : x)                           \
   K2(lrelu_##SUF, T, T, NOPRE, x > (T)0 ? x : x * y)                                           \
   K2(lrelub_##SUF, T, T, const T al = p->AL_##SUF, y > (T)0 ? x : x * al)                      \
   K2(elu_##SUF, T, T, NOPRE, x > (T)0 ? x : y * EXPM1F(x))                                     \
   K2(elub_##SUF, T, T, const T al = p->AL_##SUF, y <= (T)0 ? x * al * EXPF(y) : x)

#define AL_f32 alpha_f
#define AL_f64 alpha_d
ACT_FLOAT(f32, float, expf, erff, tanhf, log1pf, expm1f)
ACT_FLOAT(f64, double, exp, erf, tanh, log1p, expm1)
/* silu in float32: the vectorizable exp above */
K1(silu_f64, double, double, NOPRE, x / (1.0 + exp(-x)))
K2(silub_f64, double, double, NOPRE,
   x * (1.0 / (1.0 + exp(-y))) * (1.0 + y * (1.0 - 1.0 / (1.0 + exp(-y)))))

/* ---------------------------------------------------------------- unary */

#define UNARY_FLOAT(SUF, T, EXPF, LOGF, SQRTF, TANHF, FLOORF, CEILF, RINTF, SINF, COSF, LOG1PF,  \
                    EXPM1F, FABSF)                                                              \
   K1(neg_##SUF, T, T, NOPRE, -x)                                                               \
   K1(abs_##SUF, T, T, NOPRE, FABSF(x))                                                         \
   K1(exp_##SUF, T, T, NOPRE, EXPF(x))                                                          \
   K1(log_##SUF, T, T, NOPRE, LOGF(x))                                                          \
   K1(sqrt_##SUF, T, T, NOPRE, SQRTF(x))                                                        \
   K1(rsqrt_##SUF, T, T, NOPRE, (T)1 / SQRTF(x))                                                \
   K1(relu_##SUF, T, T, NOPRE, x < 0 ? (T)0 : x)                                                \
   K1(sigmoid_##SUF, T, T, NOPRE, (T)1 / ((T)1 + EXPF(-x)))                                     \
   K1(tanh_##SUF, T, T, NOPRE, TANHF(x))                                                        \
   K1(square_##SUF, T, T, NOPRE, x * x)                                                         \
   K1(recip_##SUF, T, T, NOPRE, (T)1 / x)                                                       \
   K1(sign_##SUF, T, T, NOPRE, (T)((0 < x) - (x < 0)))                                          \
   K1(lnot_##SUF, T, u8, NOPRE, x == 0)                                                         \
   K1(floor_##SUF, T, T, NOPRE, FLOORF(x))                                                      \
   K1(ceil_##SUF, T, T, NOPRE, CEILF(x))                                                        \
   K1(round_##SUF, T, T, NOPRE, RINTF(x))                                                       \
   K1(sin_##SUF, T, T, NOPRE, SINF(x))                                                          \
   K1(cos_##SUF, T, T, NOPRE, COSF(x))                                                          \
   K1(log1p_##SUF, T, T, NOPRE, LOG1PF(x))                                                      \
   K1(expm1_##SUF, T, T, NOPRE, EXPM1F(x))

UNARY_FLOAT(f32, float, expf, logf, sqrtf, tanhf, floorf, ceilf, nearbyintf, sinf, cosf, log1pf,
            expm1f, fabsf)
UNARY_FLOAT(f64, double, exp, log, sqrt, tanh, floor, ceil, nearbyint, sin, cos, log1p, expm1,
            fabs)

/* more of PyTorch's math, libm's functions (ATen's CPU kernels call the same) */
#define MATH_FLOAT(SUF, T, S)                                                                  \
   K1(trunc_##SUF, T, T, NOPRE, trunc##S(x))                                                    \
   K1(log2_##SUF, T, T, NOPRE, log2##S(x))                                                      \
   K1(log10_##SUF, T, T, NOPRE, log10##S(x))                                                    \
   K1(exp2_##SUF, T, T, NOPRE, exp2##S(x))                                                      \
   K1(tan_##SUF, T, T, NOPRE, tan##S(x))                                                        \
   K1(asin_##SUF, T, T, NOPRE, asin##S(x))                                                      \
   K1(acos_##SUF, T, T, NOPRE, acos##S(x))                                                      \
   K1(atan_##SUF, T, T, NOPRE, atan##S(x))                                                      \
   K1(sinh_##SUF, T, T, NOPRE, sinh##S(x))                                                      \
   K1(cosh_##SUF, T, T, NOPRE, cosh##S(x))                                                      \
   K1(asinh_##SUF, T, T, NOPRE, asinh##S(x))                                                    \
   K1(acosh_##SUF, T, T, NOPRE, acosh##S(x))                                                    \
   K1(atanh_##SUF, T, T, NOPRE, atanh##S(x))                                                    \
   K1(erf_##SUF, T, T, NOPRE, erf##S(x))                                                        \
   K1(erfc_##SUF, T, T, NOPRE, erfc##S(x))
MATH_FLOAT(f32, float, f)
MATH_FLOAT(f64, double, )

K1(neg_i64, i64, i64, NOPRE, wsub(0, x))
K1(abs_i64, i64, i64, NOPRE, x < 0 ? wsub(0, x) : x)
K1(relu_i64, i64, i64, NOPRE, x < 0 ? 0 : x)
K1(square_i64, i64, i64, NOPRE, wmul(x, x))
K1(sign_i64, i64, i64, NOPRE, (0 < x) - (x < 0))
K1(lnot_i64, i64, u8, NOPRE, x == 0)
K1(ident_i64, i64, i64, NOPRE, x)

/* ---------------------------------------------------------------- binary */

#define BINARY_FLOAT(SUF, T, AL, POWF, FMODF, ATAN2F)                                           \
   K2(add_##SUF, T, T, const T al = p->AL, x + al * y)                                          \
   K2(sub_##SUF, T, T, const T al = p->AL, x - al * y)                                          \
   K2(mul_##SUF, T, T, NOPRE, x * y)                                                            \
   K2(div_##SUF, T, T, NOPRE, x / y)                                                            \
   K2(pow_##SUF, T, T, NOPRE, POWF(x, y))                                                       \
   K2(max_##SUF, T, T, NOPRE, (x > y || x != x) ? x : y)                                        \
   K2(min_##SUF, T, T, NOPRE, (x < y || x != x) ? x : y)                                        \
   K2(eq_##SUF, T, u8, NOPRE, x == y)                                                           \
   K2(ne_##SUF, T, u8, NOPRE, x != y)                                                           \
   K2(lt_##SUF, T, u8, NOPRE, x < y)                                                            \
   K2(le_##SUF, T, u8, NOPRE, x <= y)                                                           \
   K2(gt_##SUF, T, u8, NOPRE, x > y)                                                            \
   K2(ge_##SUF, T, u8, NOPRE, x >= y)                                                           \
   K2(land_##SUF, T, u8, NOPRE, (x != 0) & (y != 0))                                            \
   K2(lor_##SUF, T, u8, NOPRE, (x != 0) | (y != 0))                                             \
   K2(relub_##SUF, T, T, NOPRE, y <= 0 ? (T)0 : x)                                              \
   K2(sigb_##SUF, T, T, NOPRE, x * ((T)1 - y) * y)                                              \
   K2(tanhb_##SUF, T, T, NOPRE, x * ((T)1 - y * y))                                             \
   K2(fmod_##SUF, T, T, NOPRE, FMODF(x, y))                                                     \
   K2(atan2_##SUF, T, T, NOPRE, ATAN2F(x, y))

BINARY_FLOAT(f32, float, alpha_f, powf, fmodf, atan2f)
BINARY_FLOAT(f64, double, alpha_d, pow, fmod, atan2)

K2(add_i64, i64, i64, const i64 al = p->alpha_i, wadd(x, wmul(al, y)))
K2(sub_i64, i64, i64, const i64 al = p->alpha_i, wsub(x, wmul(al, y)))
K2(mul_i64, i64, i64, NOPRE, wmul(x, y))
K2(pow_i64, i64, i64, NOPRE, powi64(x, y))
K2(max_i64, i64, i64, NOPRE, x > y ? x : y)
K2(min_i64, i64, i64, NOPRE, x < y ? x : y)
K2(eq_i64, i64, u8, NOPRE, x == y)
K2(ne_i64, i64, u8, NOPRE, x != y)
K2(lt_i64, i64, u8, NOPRE, x < y)
K2(le_i64, i64, u8, NOPRE, x <= y)
K2(gt_i64, i64, u8, NOPRE, x > y)
K2(ge_i64, i64, u8, NOPRE, x >= y)
K2(land_i64, i64, u8, NOPRE, (x != 0) & (y != 0))
K2(lor_i64, i64, u8, NOPRE, (x != 0) | (y != 0))
K2(relub_i64, i64, i64, NOPRE, y <= 0 ? 0 : x)
K2(sigb_i64, i64, i64, NOPRE, wmul(wmul(x, wsub(1, y)), y))
K2(tanhb_i64, i64, i64, NOPRE, wmul(x, wsub(1, wmul(y, y))))
K2(fmod_i64, i64, i64, int *err = p->err, fmodi64(x, y, err))

/* ---------------------------------------------------------------- clamp, addc*, where, pow */

#define OTHER_FLOAT(SUF, T, F, SQRTF)                                                           \
   K1(clamp_##SUF, T, T, const T lo = p->lo_##F; const T hi = p->hi_##F,                        \
      (hi < (x < lo ? lo : x)) ? hi : (x < lo ? lo : x))                                        \
   K1(clampmin_##SUF, T, T, const T lo = p->lo_##F, x < lo ? lo : x)                            \
   K1(clampmax_##SUF, T, T, const T hi = p->hi_##F, hi < x ? hi : x)                            \
   K3(addcmul_##SUF, T, const T v = p->val_##F, x + v * y * z)                                  \
   K3(addcdiv_##SUF, T, const T v = p->val_##F, x + v * y / z)                                  \
   KWHERE(where_##SUF, T)                                                                       \
   K1(pow2_##SUF, T, T, NOPRE, x * x)                                                           \
   K1(pow3_##SUF, T, T, NOPRE, x * x * x)                                                       \
   K1(powh_##SUF, T, T, NOPRE, SQRTF(x))                                                        \
   K1(powm1_##SUF, T, T, NOPRE, (T)1 / x)                                                       \
   K1(powmh_##SUF, T, T, NOPRE, (T)1 / SQRTF(x))                                                \
   K1(powm2_##SUF, T, T, NOPRE, (T)1 / (x * x))

OTHER_FLOAT(f32, float, f, sqrtf)
OTHER_FLOAT(f64, double, d, sqrt)
K1(clamp_i64, i64, i64, const i64 lo = p->lo_i; const i64 hi = p->hi_i,
   (hi < (x < lo ? lo : x)) ? hi : (x < lo ? lo : x))
K1(clampmin_i64, i64, i64, const i64 lo = p->lo_i, x < lo ? lo : x)
K1(clampmax_i64, i64, i64, const i64 hi = p->hi_i, hi < x ? hi : x)
K3(addcmul_i64, i64, const i64 v = p->val_i, wadd(x, wmul(wmul(v, y), z)))
KWHERE(where_i64, i64)
K1(pow2_i64, i64, i64, NOPRE, wmul(x, x))
K1(pow3_i64, i64, i64, NOPRE, wmul(wmul(x, x), x))

/* ---------------------------------------------------------------- tables by [op][kind] */

#define KF1(OP, NAME) [OP] = {KS1(NAME##_f32), KS1(NAME##_f64), KNONE}
#define KFI1(OP, NAME, INAME) [OP] = {KS1(NAME##_f32), KS1(NAME##_f64), KS1(INAME)}
#define KF2(OP, NAME) [OP] = {KS2(NAME##_f32), KS2(NAME##_f64), KNONE}
#define KFI2(OP, NAME) [OP] = {KS2(NAME##_f32), KS2(NAME##_f64), KS2(NAME##_i64)}

const lm_kset lm_unary_kernels[LM_NUM_UNARY][LM_NUM_K] = {
   KFI1(LM_NEG, neg, neg_i64),       KFI1(LM_ABS, abs, abs_i64),
   [LM_EXP] = {KS1(exp_vf32), KS1(exp_f64), KNONE}, KF1(LM_LOG, log),
   KF1(LM_SQRT, sqrt),               KF1(LM_RSQRT, rsqrt),
   KFI1(LM_RELU, relu, relu_i64),
   [LM_SIGMOID] = {KS1(sigmoid_vf32), KS1(sigmoid_f64), KNONE},
   KF1(LM_TANH, tanh),               KFI1(LM_SQUARE, square, square_i64),
   KF1(LM_RECIPROCAL, recip),        KFI1(LM_SIGN, sign, sign_i64),
   KFI1(LM_LOGICAL_NOT, lnot, lnot_i64), KFI1(LM_FLOOR, floor, ident_i64),
   KFI1(LM_CEIL, ceil, ident_i64),   KFI1(LM_ROUND, round, ident_i64),
   KF1(LM_SIN, sin),                 KF1(LM_COS, cos),
   KF1(LM_LOG1P, log1p),             KF1(LM_EXPM1, expm1),
   [LM_SILU] = {KS1(silu_vf32), KS1(silu_f64), KNONE},
   [LM_GELU] = {KS1(gelu_vf32), KS1(gelu_f64), KNONE}, KF1(LM_GELU_TANH, gelut),
   KF1(LM_HARDSWISH, hswish),        KF1(LM_HARDSIGMOID, hsig),
   KF1(LM_MISH, mish),
   KFI1(LM_TRUNC, trunc, ident_i64), KF1(LM_LOG2, log2),
   KF1(LM_LOG10, log10),             KF1(LM_EXP2, exp2),
   KF1(LM_TAN, tan),                 KF1(LM_ASIN, asin),
   KF1(LM_ACOS, acos),               KF1(LM_ATAN, atan),
   KF1(LM_SINH, sinh),               KF1(LM_COSH, cosh),
   KF1(LM_ASINH, asinh),             KF1(LM_ACOSH, acosh),
   KF1(LM_ATANH, atanh),             KF1(LM_ERF, erf),
   KF1(LM_ERFC, erfc)};

const lm_kset lm_binary_kernels[LM_NUM_BINARY][LM_NUM_K] = {
   KFI2(LM_ADD, add),  KFI2(LM_SUB, sub), KFI2(LM_MUL, mul), KF2(LM_DIV, div),
   KFI2(LM_POW, pow),  KFI2(LM_MAXIMUM, max), KFI2(LM_MINIMUM, min),
   KFI2(LM_EQ, eq),    KFI2(LM_NE, ne), KFI2(LM_LT, lt), KFI2(LM_LE, le), KFI2(LM_GT, gt),
   KFI2(LM_GE, ge),    KFI2(LM_LOGICAL_AND, land), KFI2(LM_LOGICAL_OR, lor),
   KFI2(LM_RELU_BACKWARD, relub), KFI2(LM_SIGMOID_BACKWARD, sigb),
   KFI2(LM_TANH_BACKWARD, tanhb), KFI2(LM_FMOD, fmod), KF2(LM_ATAN2, atan2),
   [LM_SILU_BACKWARD] = {KS2(silub_vf32), KS2(silub_f64), KNONE},
   KF2(LM_GELU_BACKWARD, gelub),     KF2(LM_GELU_TANH_BACKWARD, geluth),
   KF2(LM_HARDSWISH_BACKWARD, hswishb), KF2(LM_HARDSIGMOID_BACKWARD, hsigb),
   KF2(LM_MISH_BACKWARD, mishb),     KF2(LM_RELU6_BACKWARD, relu6b),
   KF2(LM_LEAKY_RELU, lrelu),        KF2(LM_LEAKY_RELU_BACKWARD, lrelub),
   KF2(LM_ELU, elu),                 KF2(LM_ELU_BACKWARD, elub)};

const lm_kset lm_other_kernels[LM_NUM_T][LM_NUM_K] = {
   KFI1(LM_T_CLAMP, clamp, clamp_i64),        KFI1(LM_T_CLAMP_MIN, clampmin, clampmin_i64),
   KFI1(LM_T_CLAMP_MAX, clampmax, clampmax_i64), KFI1(LM_T_ADDCMUL, addcmul, addcmul_i64),
   KF1(LM_T_ADDCDIV, addcdiv),                KFI1(LM_T_WHERE, where, where_i64),
   KFI1(LM_T_POW2, pow2, pow2_i64),           KFI1(LM_T_POW3, pow3, pow3_i64),
   KF1(LM_T_POWHALF, powh),                   KF1(LM_T_POWM1, powm1),
   KF1(LM_T_POWMHALF, powmh),                 KF1(LM_T_POWM2, powm2)};
