/* elementwise_impl.cuh -- what the CUDA elementwise family's files share (private to
 * kernels/cuda/elementwise*.cu): dtype conversions with the CPU's semantics (src/iter.c's
 * lm_convert, kernels/cpu/elementwise.c's via / out_via rounding), the compute ops of
 * kernels/cpu/ew_kernels.c as __host__ __device__ functions, and the two kernel bodies:
 *
 *   GenBody<TB, T>   the general one: N-d strided operands (broadcast = stride 0), any dtypes
 *                    (converted through a tagged value, rounding through via / out_via as the
 *                    CPU does), the op chosen at run time (a uniform switch);
 *   HomoBody<TB, OP, T, S>  the fast path: every operand dense with the same strides (contiguous
 *                    or channels-last: element i sits at index i of each), one storage dtype S
 *                    for the tensor inputs and the output (bool for comparisons), the op a
 *                    template parameter. Stride-0 inputs (a 0-dim tensor) and numbers are
 *                    allowed.
 *
 * Float kinds compute in float (float32/16/bf16) or double (float64), integers in int64 with
 * wrapping arithmetic, as the CPU's kernels. Multiply-adds are written with explicit
 * round-to-nearest intrinsics on the device so nvcc does not contract them into FMAs: the results
 * are then the CPU's bit for bit (the transcendental functions differ by an ulp or two). */
#ifndef LUMEN_CUDA_ELEMENTWISE_IMPL_CUH
#define LUMEN_CUDA_ELEMENTWISE_IMPL_CUH
#include "cuda.cuh"
extern "C" {
#include "iter.h"
#include "ops/elementwise.h"
}
#include <math.h>
#include <type_traits>

namespace lmew {

typedef int64_t i64;
typedef uint64_t u64;

/* ---------------------------------------------------------------- storage types */

struct H16 { uint16_t v; };  /* float16 bits */
struct BF16 { uint16_t v; }; /* bfloat16 bits */
struct B8 { uint8_t v; };    /* bool */

/* float -> int32 as x86's cvttss2si / cvttsd2si (lm_convert's (int32_t) cast): truncation in
   range, INT32_MIN ("integer indefinite") outside it and for NaN */
template <class F> LM_HD inline int32_t f_to_i32(F v) {
   return (v >= (F)-2147483648.0 && v < (F)2147483648.0) ? (int32_t)v : INT32_MIN;
}

/* St<S>: load an element of storage S as its C value type V (float for float16 / bfloat16, int64
   for the integers and bool), store a value of any of the three value types with lm_convert's
   casts */
template <class S> struct St;
template <> struct St<float> {
   typedef float V;
   static LM_HD V ld(const float *p) { return *p; }
   static LM_HD void st(float *p, float v) { *p = v; }
   static LM_HD void st(float *p, double v) { *p = (float)v; }
   static LM_HD void st(float *p, i64 v) { *p = (float)v; }
};
template <> struct St<double> {
   typedef double V;
   static LM_HD V ld(const double *p) { return *p; }
   static LM_HD void st(double *p, float v) { *p = (double)v; }
   static LM_HD void st(double *p, double v) { *p = v; }
   static LM_HD void st(double *p, i64 v) { *p = (double)v; }
};
/* float16 -> float32 without lm_h2f's loop over subnormals (src/iter.c's h2f_fast, bit-exact with
   lm_h2f over every input) */
LM_HD inline float h2f(uint16_t h) {
   const uint32_t em = (uint32_t)h & 0x7fff, sign = ((uint32_t)h & 0x8000) << 16;
   const uint32_t norm = (em << 13) + 0x38000000u; /* exponent rebias (127 - 15) << 23 */
   const uint32_t infnan = norm + 0x38000000u;     /* exponent 31 -> 255 */
   const float subf = (float)(int32_t)em * 5.9604644775390625e-8f; /* em * 2^-24, exact */
   uint32_t sub;
   memcpy(&sub, &subf, 4);
   const uint32_t r = (em >= 0x7c00 ? infnan : em < 0x0400 ? sub : norm) | sign;
   float f;
   memcpy(&f, &r, 4);
   return f;
}

template <> struct St<H16> {
   typedef float V;
   static LM_HD V ld(const H16 *p) { return h2f(p->v); }
   static LM_HD void st(H16 *p, float v) { p->v = lm_f2h(v); }
   static LM_HD void st(H16 *p, double v) { p->v = lm_f2h((float)v); }
   static LM_HD void st(H16 *p, i64 v) { p->v = lm_f2h((float)v); }
};
template <> struct St<BF16> {
   typedef float V;
   static LM_HD V ld(const BF16 *p) { return lm_bf2f(p->v); }
   static LM_HD void st(BF16 *p, float v) { p->v = lm_f2bf(v); }
   static LM_HD void st(BF16 *p, double v) { p->v = lm_f2bf((float)v); }
   static LM_HD void st(BF16 *p, i64 v) { p->v = lm_f2bf((float)v); }
};
template <> struct St<i64> {
   typedef i64 V;
   static LM_HD V ld(const i64 *p) { return *p; }
   static LM_HD void st(i64 *p, float v) { *p = lm_double_to_i64((double)v); }
   static LM_HD void st(i64 *p, double v) { *p = lm_double_to_i64(v); }
   static LM_HD void st(i64 *p, i64 v) { *p = v; }
};
template <> struct St<int32_t> {
   typedef i64 V;
   static LM_HD V ld(const int32_t *p) { return *p; }
   static LM_HD void st(int32_t *p, float v) { *p = f_to_i32(v); }
   static LM_HD void st(int32_t *p, double v) { *p = f_to_i32(v); }
   static LM_HD void st(int32_t *p, i64 v) { *p = (int32_t)(uint32_t)(u64)v; }
};
template <> struct St<uint8_t> {
   typedef i64 V;
   static LM_HD V ld(const uint8_t *p) { return *p; }
   static LM_HD void st(uint8_t *p, float v) { *p = (uint8_t)(u64)lm_double_to_i64((double)v); }
   static LM_HD void st(uint8_t *p, double v) { *p = (uint8_t)(u64)lm_double_to_i64(v); }
   static LM_HD void st(uint8_t *p, i64 v) { *p = (uint8_t)(u64)v; }
};
template <> struct St<B8> {
   typedef i64 V;
   static LM_HD V ld(const B8 *p) { return p->v != 0; }
   static LM_HD void st(B8 *p, float v) { p->v = v != 0; }
   static LM_HD void st(B8 *p, double v) { p->v = v != 0; }
   static LM_HD void st(B8 *p, i64 v) { p->v = v != 0; }
};

/* a value of one of the three value types, tagged (the general path's conversions) */
struct Val {
   int k; /* 0 float, 1 double, 2 int64 */
   float f;
   double d;
   i64 i;
};
LM_HD inline Val val_of(float v) { Val r; r.k = 0; r.f = v; r.d = 0; r.i = 0; return r; }
LM_HD inline Val val_of(double v) { Val r; r.k = 1; r.f = 0; r.d = v; r.i = 0; return r; }
LM_HD inline Val val_of(i64 v) { Val r; r.k = 2; r.f = 0; r.d = 0; r.i = v; return r; }

template <class S> LM_HD inline Val ld_val(const char *p) { return val_of(St<S>::ld((const S *)p)); }
template <class S> LM_HD inline void st_val(char *p, const Val &v) {
   if (v.k == 0) St<S>::st((S *)p, v.f);
   else if (v.k == 1) St<S>::st((S *)p, v.d);
   else St<S>::st((S *)p, v.i);
}
/* an element of dtype dt at p */
LM_HD inline Val ld_rt(int dt, const char *p) {
   switch (dt) {
   case LM_FLOAT32: return ld_val<float>(p);
   case LM_FLOAT64: return ld_val<double>(p);
   case LM_FLOAT16: return ld_val<H16>(p);
   case LM_BFLOAT16: return ld_val<BF16>(p);
   case LM_INT64: return ld_val<i64>(p);
   case LM_INT32: return ld_val<int32_t>(p);
   case LM_UINT8: return ld_val<uint8_t>(p);
   default: return ld_val<B8>(p);
   }
}
LM_HD inline void st_rt(int dt, char *p, const Val &v) {
   switch (dt) {
   case LM_FLOAT32: st_val<float>(p, v); break;
   case LM_FLOAT64: st_val<double>(p, v); break;
   case LM_FLOAT16: st_val<H16>(p, v); break;
   case LM_BFLOAT16: st_val<BF16>(p, v); break;
   case LM_INT64: st_val<i64>(p, v); break;
   case LM_INT32: st_val<int32_t>(p, v); break;
   case LM_UINT8: st_val<uint8_t>(p, v); break;
   default: st_val<B8>(p, v); break;
   }
}
/* v converted to dtype dt and read back (a rounding through dt) */
LM_HD inline Val through_rt(int dt, const Val &v) {
   alignas(8) char tmp[8];
   st_rt(dt, tmp, v);
   return ld_rt(dt, tmp);
}
/* a value as the compute type T (float / double / int64): the last step of lm_convert into the
   kernel's input dtype */
template <class T> LM_HD inline T val_as(const Val &v) {
   T r;
   if constexpr (std::is_same<T, float>::value) st_val<float>((char *)&r, v);
   else if constexpr (std::is_same<T, double>::value) st_val<double>((char *)&r, v);
   else st_val<i64>((char *)&r, v);
   return r;
}

/* input k of the CPU's loop: an element of dtype dt, cast to the common dtype via first when
   that is a third dtype, then to the kernel's input dtype in_dt (convert_via) */
template <class T> LM_HD inline T load_in(const char *p, int dt, int via, int in_dt) {
   Val v = ld_rt(dt, p);
   if (via >= 0 && dt != via && via != in_dt) v = through_rt(via, v);
   if (in_dt == LM_BOOL) return (T)(v.k == 0 ? v.f != 0 : v.k == 1 ? v.d != 0 : v.i != 0);
   return val_as<T>(v);
}
/* the kernel's result r (of dtype out_dt) into an output element of dtype dt, rounding through the
   op's result dtype out_via when that is a third dtype */
template <class T> LM_HD inline void store_out(char *p, int dt, T r, int out_dt, int out_via) {
   Val v = out_dt == LM_BOOL ? val_of((i64)(r != 0)) : val_of(r);
   if (out_via >= 0 && out_via != out_dt && out_via != dt) v = through_rt(out_via, v);
   st_rt(dt, p, v);
}

/* ---------------------------------------------------------------- arithmetic helpers */

LM_HD inline i64 wadd(i64 x, i64 y) { return (i64)((u64)x + (u64)y); }
LM_HD inline i64 wsub(i64 x, i64 y) { return (i64)((u64)x - (u64)y); }
LM_HD inline i64 wmul(i64 x, i64 y) { return (i64)((u64)x * (u64)y); }

LM_HD inline i64 powi64(i64 b, i64 e) {
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

/* round-to-nearest products and sums that nvcc may not fuse into an FMA (the CPU computes each
   step rounded) */
#ifdef __CUDA_ARCH__
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double sub_rn(double a, double b) { return __dsub_rn(a, b); }
#else
inline float mul_rn(float a, float b) { return a * b; }
inline double mul_rn(double a, double b) { return a * b; }
inline float add_rn(float a, float b) { return a + b; }
inline double add_rn(double a, double b) { return a + b; }
inline float sub_rn(float a, float b) { return a - b; }
inline double sub_rn(double a, double b) { return a - b; }
#endif

#define LMEW_MATH1(NAME, FF, FD)                                                               \
   LM_HD inline float NAME(float x) { return FF(x); }                                           \
   LM_HD inline double NAME(double x) { return FD(x); }
LMEW_MATH1(m_exp, expf, exp)
LMEW_MATH1(m_log, logf, log)
LMEW_MATH1(m_sqrt, sqrtf, sqrt)
LMEW_MATH1(m_tanh, tanhf, tanh)
LMEW_MATH1(m_floor, floorf, floor)
LMEW_MATH1(m_ceil, ceilf, ceil)
LMEW_MATH1(m_rint, nearbyintf, nearbyint)
LMEW_MATH1(m_sin, sinf, sin)
LMEW_MATH1(m_cos, cosf, cos)
LMEW_MATH1(m_log1p, log1pf, log1p)
LMEW_MATH1(m_expm1, expm1f, expm1)
LMEW_MATH1(m_fabs, fabsf, fabs)
LMEW_MATH1(m_erf, erff, erf)
LMEW_MATH1(m_trunc, truncf, trunc)
LMEW_MATH1(m_log2, log2f, log2)
LMEW_MATH1(m_log10, log10f, log10)
LMEW_MATH1(m_exp2, exp2f, exp2)
LMEW_MATH1(m_tan, tanf, tan)
LMEW_MATH1(m_asin, asinf, asin)
LMEW_MATH1(m_acos, acosf, acos)
LMEW_MATH1(m_atan, atanf, atan)
LMEW_MATH1(m_sinh, sinhf, sinh)
LMEW_MATH1(m_cosh, coshf, cosh)
LMEW_MATH1(m_asinh, asinhf, asinh)
LMEW_MATH1(m_acosh, acoshf, acosh)
LMEW_MATH1(m_atanh, atanhf, atanh)
LMEW_MATH1(m_erfc, erfcf, erfc)
#undef LMEW_MATH1
LM_HD inline float m_pow(float x, float y) { return powf(x, y); }
LM_HD inline double m_pow(double x, double y) { return pow(x, y); }
LM_HD inline float m_fmod(float x, float y) { return fmodf(x, y); }
LM_HD inline double m_fmod(double x, double y) { return fmod(x, y); }
LM_HD inline float m_atan2(float x, float y) { return atan2f(x, y); }
LM_HD inline double m_atan2(double x, double y) { return atan2(x, y); }

/* ---------------------------------------------------------------- the ops */

/* the kernel's scalar parameters in its compute type, and the device's division-by-zero flag */
template <class T> struct KP {
   T alpha, val, lo, hi;
   int *err;
};

template <class T> LM_HD constexpr bool is_int() { return std::is_same<T, i64>::value; }

/* which (table, op, kind) the CPU has a compute loop for (src/elementwise.c: has_kernel) */
LM_HD constexpr bool has_op(int tb, int op, bool integer) {
   return !integer ? true
          : tb == LM_EW_UNARY
             ? (op == LM_NEG || op == LM_ABS || op == LM_RELU || op == LM_SQUARE || op == LM_SIGN ||
                op == LM_LOGICAL_NOT || op == LM_FLOOR || op == LM_CEIL || op == LM_ROUND ||
                op == LM_TRUNC)
          : tb == LM_EW_BINARY
             ? (op != LM_DIV && op != LM_ATAN2 && op < LM_SILU_BACKWARD)
             : (op != LM_T_ADDCDIV && op != LM_T_POWHALF && op != LM_T_POWM1 &&
                op != LM_T_POWMHALF && op != LM_T_POWM2);
}
/* inputs of an op */
LM_HD constexpr int nin_of(int tb, int op) {
   return tb == LM_EW_UNARY ? 1
          : tb == LM_EW_BINARY ? 2
          : (op == LM_T_ADDCMUL || op == LM_T_ADDCDIV || op == LM_T_WHERE) ? 3
                                                                          : 1;
}
/* ops that write bool */
LM_HD constexpr bool bool_out(int tb, int op) {
   return tb == LM_EW_UNARY ? op == LM_LOGICAL_NOT
          : tb == LM_EW_BINARY ? ((op >= LM_EQ && op <= LM_GE) || op == LM_LOGICAL_AND ||
                                  op == LM_LOGICAL_OR)
                               : false;
}
LM_HD constexpr int num_ops(int tb) {
   return tb == LM_EW_UNARY ? (int)LM_NUM_UNARY : tb == LM_EW_BINARY ? (int)LM_NUM_BINARY : (int)LM_NUM_T;
}

template <int OP, class T> LM_HD inline T unary_op(T x) {
   constexpr bool I = is_int<T>();
   if constexpr (OP == LM_NEG) { if constexpr (I) return wsub(0, x); else return -x; }
   else if constexpr (OP == LM_ABS) { if constexpr (I) return x < 0 ? wsub(0, x) : x; else return m_fabs(x); }
   else if constexpr (OP == LM_RELU) return x < 0 ? (T)0 : x;
   else if constexpr (OP == LM_SQUARE) { if constexpr (I) return wmul(x, x); else return x * x; }
   else if constexpr (OP == LM_SIGN) return (T)((0 < x) - (x < 0));
   else if constexpr (OP == LM_LOGICAL_NOT) return (T)(x == 0);
   else if constexpr (OP == LM_FLOOR) { if constexpr (I) return x; else return m_floor(x); }
   else if constexpr (OP == LM_CEIL) { if constexpr (I) return x; else return m_ceil(x); }
   else if constexpr (OP == LM_ROUND) { if constexpr (I) return x; else return m_rint(x); }
   else if constexpr (OP == LM_TRUNC) { if constexpr (I) return x; else return m_trunc(x); }
   else if constexpr (I) return x; /* never dispatched (has_op) */
   else if constexpr (OP == LM_EXP) return m_exp(x);
   else if constexpr (OP == LM_LOG) return m_log(x);
   else if constexpr (OP == LM_SQRT) return m_sqrt(x);
   else if constexpr (OP == LM_RSQRT) return (T)1 / m_sqrt(x);
   else if constexpr (OP == LM_SIGMOID) return (T)1 / ((T)1 + m_exp(-x));
   else if constexpr (OP == LM_TANH) return m_tanh(x);
   else if constexpr (OP == LM_RECIPROCAL) return (T)1 / x;
   else if constexpr (OP == LM_SIN) return m_sin(x);
   else if constexpr (OP == LM_COS) return m_cos(x);
   else if constexpr (OP == LM_LOG1P) return m_log1p(x);
   else if constexpr (OP == LM_EXPM1) return m_expm1(x);
   /* the activations: PyTorch's formulas, as kernels/cpu/ew_kernels.c */
   else if constexpr (OP == LM_SILU) return x / ((T)1 + m_exp(-x));
   else if constexpr (OP == LM_GELU) return x * (T)0.5 * ((T)1 + m_erf(x * (T)0.70710678118654752440));
   else if constexpr (OP == LM_GELU_TANH)
      return (T)0.5 * x * ((T)1 + m_tanh((T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x)));
   else if constexpr (OP == LM_HARDSWISH) {
      const T r = (x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3);
      return x * r / (T)6;
   } else if constexpr (OP == LM_HARDSIGMOID) {
      const T r = (x + (T)3) < (T)0 ? (T)0 : (x + (T)3) > (T)6 ? (T)6 : (x + (T)3);
      return r / (T)6;
   } else if constexpr (OP == LM_MISH) return x * m_tanh(m_log1p(m_exp(x)));
   /* more math: the C library's functions, as kernels/cpu/ew_kernels.c's MATH_FLOAT */
   else if constexpr (OP == LM_LOG2) return m_log2(x);
   else if constexpr (OP == LM_LOG10) return m_log10(x);
   else if constexpr (OP == LM_EXP2) return m_exp2(x);
   else if constexpr (OP == LM_TAN) return m_tan(x);
   else if constexpr (OP == LM_ASIN) return m_asin(x);
   else if constexpr (OP == LM_ACOS) return m_acos(x);
   else if constexpr (OP == LM_ATAN) return m_atan(x);
   else if constexpr (OP == LM_SINH) return m_sinh(x);
   else if constexpr (OP == LM_COSH) return m_cosh(x);
   else if constexpr (OP == LM_ASINH) return m_asinh(x);
   else if constexpr (OP == LM_ACOSH) return m_acosh(x);
   else if constexpr (OP == LM_ATANH) return m_atanh(x);
   else if constexpr (OP == LM_ERF) return m_erf(x);
   else if constexpr (OP == LM_ERFC) return m_erfc(x);
   else return x;
}

template <int OP, class T> LM_HD inline T binary_op(T x, T y, const KP<T> &p) {
   constexpr bool I = is_int<T>();
   if constexpr (OP == LM_ADD) { if constexpr (I) return wadd(x, wmul(p.alpha, y)); else return add_rn(x, mul_rn(p.alpha, y)); }
   else if constexpr (OP == LM_SUB) { if constexpr (I) return wsub(x, wmul(p.alpha, y)); else return sub_rn(x, mul_rn(p.alpha, y)); }
   else if constexpr (OP == LM_MUL) { if constexpr (I) return wmul(x, y); else return x * y; }
   else if constexpr (OP == LM_DIV) { if constexpr (I) return x; else return x / y; }
   else if constexpr (OP == LM_POW) { if constexpr (I) return powi64(x, y); else return m_pow(x, y); }
   else if constexpr (OP == LM_MAXIMUM) { if constexpr (I) return x > y ? x : y; else return (x > y || x != x) ? x : y; }
   else if constexpr (OP == LM_MINIMUM) { if constexpr (I) return x < y ? x : y; else return (x < y || x != x) ? x : y; }
   else if constexpr (OP == LM_EQ) return (T)(x == y);
   else if constexpr (OP == LM_NE) return (T)(x != y);
   else if constexpr (OP == LM_LT) return (T)(x < y);
   else if constexpr (OP == LM_LE) return (T)(x <= y);
   else if constexpr (OP == LM_GT) return (T)(x > y);
   else if constexpr (OP == LM_GE) return (T)(x >= y);
   else if constexpr (OP == LM_LOGICAL_AND) return (T)((x != 0) & (y != 0));
   else if constexpr (OP == LM_LOGICAL_OR) return (T)((x != 0) | (y != 0));
   else if constexpr (OP == LM_RELU_BACKWARD) return y <= 0 ? (T)0 : x;
   else if constexpr (OP == LM_SIGMOID_BACKWARD) {
      if constexpr (I) return wmul(wmul(x, wsub(1, y)), y); else return mul_rn(mul_rn(x, (T)1 - y), y);
   } else if constexpr (OP == LM_TANH_BACKWARD) {
      if constexpr (I) return wmul(x, wsub(1, wmul(y, y))); else return mul_rn(x, sub_rn((T)1, mul_rn(y, y)));
   } else if constexpr (OP == LM_FMOD) {
      if constexpr (I) {
         if (y == 0) {
            *p.err = 1; /* ZeroDivisionError, read back by the launcher */
            return 0;
         }
         if (y == -1) return 0;
         return x % y;
      } else {
         return m_fmod(x, y);
      }
   } else if constexpr (OP == LM_ATAN2) { if constexpr (I) return x; else return m_atan2(x, y); }
   else if constexpr (I) return x; /* never dispatched (has_op) */
   /* the activations' gradients (x: the gradient, y: the activation's input) and the
      parameterized activations, as kernels/cpu/ew_kernels.c */
   else if constexpr (OP == LM_SILU_BACKWARD) {
      const T s = (T)1 / ((T)1 + m_exp(-y));
      return x * s * ((T)1 + y * ((T)1 - s));
   } else if constexpr (OP == LM_GELU_BACKWARD) {
      const T cdf = (T)0.5 * ((T)1 + m_erf(y * (T)0.70710678118654752440));
      const T pdf = (T)0.39894228040143267794 * m_exp((T)-0.5 * y * y);
      return x * (cdf + y * pdf);
   } else if constexpr (OP == LM_GELU_TANH_BACKWARD) {
      const T kb = (T)0.79788456080286535588, kk = (T)0.044715;
      const T t = m_tanh(kb * (y + kk * y * y * y));
      return x * ((T)0.5 * ((T)1 + t) + (T)0.5 * y * ((T)1 - t * t) * (kb * ((T)1 + (T)3 * kk * y * y)));
   } else if constexpr (OP == LM_HARDSWISH_BACKWARD)
      return y < (T)-3 ? (T)0 : y <= (T)3 ? x * (y / (T)3 + (T)0.5) : x;
   else if constexpr (OP == LM_HARDSIGMOID_BACKWARD) return (y > (T)-3 && y < (T)3) ? x * (T)(1.0f / 6.0f) : (T)0; /* PyTorch's float 1/6 */
   else if constexpr (OP == LM_MISH_BACKWARD) {
      const T t = m_tanh(m_log1p(m_exp(y)));
      const T s = (T)1 / ((T)1 + m_exp(-y));
      return x * (t + y * s * ((T)1 - t * t));
   } else if constexpr (OP == LM_RELU6_BACKWARD) return (y <= (T)0 || y >= (T)6) ? (T)0 : x;
   else if constexpr (OP == LM_LEAKY_RELU) return x > (T)0 ? x : x * y;
   else if constexpr (OP == LM_LEAKY_RELU_BACKWARD) return y > (T)0 ? x : x * p.alpha;
   else if constexpr (OP == LM_ELU) return x > (T)0 ? x : y * m_expm1(x);
   else if constexpr (OP == LM_ELU_BACKWARD) return y <= (T)0 ? x * p.alpha * m_exp(y) : x;
   else return x;
}

template <int OP, class T> LM_HD inline T other_op(T x, T y, T z, const KP<T> &p) {
   constexpr bool I = is_int<T>();
   if constexpr (OP == LM_T_CLAMP) {
      const T a = x < p.lo ? p.lo : x;
      return (p.hi < a) ? p.hi : a;
   } else if constexpr (OP == LM_T_CLAMP_MIN) return x < p.lo ? p.lo : x;
   else if constexpr (OP == LM_T_CLAMP_MAX) return p.hi < x ? p.hi : x;
   else if constexpr (OP == LM_T_ADDCMUL) {
      if constexpr (I) return wadd(x, wmul(wmul(p.val, y), z)); else return add_rn(x, mul_rn(mul_rn(p.val, y), z));
   } else if constexpr (OP == LM_T_ADDCDIV) { if constexpr (I) return x; else return add_rn(x, mul_rn(p.val, y) / z); }
   else if constexpr (OP == LM_T_WHERE) return x != 0 ? y : z;
   else if constexpr (OP == LM_T_POW2) { if constexpr (I) return wmul(x, x); else return x * x; }
   else if constexpr (OP == LM_T_POW3) { if constexpr (I) return wmul(wmul(x, x), x); else return mul_rn(x, x) * x; }
   else if constexpr (I) return x; /* never dispatched (has_op) */
   else if constexpr (OP == LM_T_POWHALF) return m_sqrt(x);
   else if constexpr (OP == LM_T_POWM1) return (T)1 / x;
   else if constexpr (OP == LM_T_POWMHALF) return (T)1 / m_sqrt(x);
   else if constexpr (OP == LM_T_POWM2) return (T)1 / mul_rn(x, x);
   else return x;
}

/* op OP of table TB over up to three values */
template <int TB, int OP, class T> LM_HD inline T apply(const T *v, const KP<T> &p) {
   if constexpr (TB == LM_EW_UNARY) return unary_op<OP, T>(v[0]);
   else if constexpr (TB == LM_EW_BINARY) return binary_op<OP, T>(v[0], v[1], p);
   else return other_op<OP, T>(v[0], v[1], v[2], p);
}

/* the fused epilogue (a float unary op, src/elementwise.c: fusable_unary), chosen at run time */
template <class T> LM_HD inline T epilogue(int op, T x) {
   if constexpr (is_int<T>()) {
      return x;
   } else {
      switch (op) {
      case LM_NEG: return unary_op<LM_NEG, T>(x);
      case LM_ABS: return unary_op<LM_ABS, T>(x);
      case LM_EXP: return unary_op<LM_EXP, T>(x);
      case LM_LOG: return unary_op<LM_LOG, T>(x);
      case LM_SQRT: return unary_op<LM_SQRT, T>(x);
      case LM_RSQRT: return unary_op<LM_RSQRT, T>(x);
      case LM_RELU: return unary_op<LM_RELU, T>(x);
      case LM_SIGMOID: return unary_op<LM_SIGMOID, T>(x);
      case LM_TANH: return unary_op<LM_TANH, T>(x);
      case LM_SQUARE: return unary_op<LM_SQUARE, T>(x);
      case LM_RECIPROCAL: return unary_op<LM_RECIPROCAL, T>(x);
      case LM_SIN: return unary_op<LM_SIN, T>(x);
      case LM_COS: return unary_op<LM_COS, T>(x);
      case LM_LOG1P: return unary_op<LM_LOG1P, T>(x);
      case LM_EXPM1: return unary_op<LM_EXPM1, T>(x);
      default: return x;
      }
   }
}

/* ---------------------------------------------------------------- index math */

/* n / d for n, d < 2^31 by a multiply and a shift (PyTorch's IntDivider) */
struct Div32 {
   uint32_t d, m, s;
   void init(uint32_t dv) {
      d = dv;
      for (s = 0; s < 32; s++)
         if ((1u << s) >= dv) break;
      const u64 one = 1;
      m = (uint32_t)(((one << 32) * ((one << s) - dv)) / dv + 1);
   }
   LM_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
      const uint32_t t = __umulhi(n, m);
#else
      const uint32_t t = (uint32_t)(((u64)n * m) >> 32);
#endif
      return (t + n) >> s;
   }
};

enum { MAXOPS = 4 };

/* a coalesced iteration space (lm_iter: dim 0 innermost) and each operand's byte strides */
struct Geo {
   int nd, nops, small; /* small: numel < 2^31, 32-bit index math */
   int64_t shape[LM_MAX_DIMS];
   Div32 dv[LM_MAX_DIMS];
   int64_t st[MAXOPS][LM_MAX_DIMS];
   char *ptr[MAXOPS];
   /* byte offsets of element i in each operand (the loops over operands run to MAXOPS, whose
      unused strides are 0, so they unroll and off[] stays in registers) */
   LM_HD void offsets(int64_t i, int64_t *off) const {
      for (int k = 0; k < MAXOPS; k++) off[k] = 0;
      if (nd == 1) {
         for (int k = 0; k < MAXOPS; k++) off[k] = i * st[k][0];
         return;
      }
      if (small) {
         uint32_t r = (uint32_t)i;
         for (int d = 0; d < nd; d++) {
            const uint32_t q = d + 1 < nd ? dv[d].div(r) : 0;
            const int64_t c = (int64_t)(r - q * dv[d].d);
            for (int k = 0; k < MAXOPS; k++) off[k] += c * st[k][d];
            r = q;
         }
      } else {
         int64_t r = i;
         for (int d = 0; d < nd; d++) {
            const int64_t q = d + 1 < nd ? r / shape[d] : 0;
            const int64_t c = r - q * shape[d];
            for (int k = 0; k < MAXOPS; k++) off[k] += c * st[k][d];
            r = q;
         }
      }
   }
};

/* Geo of an initialized lm_iter */
inline void geo_of(Geo &g, const lm_iter &it) {
   g.nd = it.ndim;
   g.nops = it.nops;
   g.small = it.numel < ((int64_t)1 << 31);
   for (int d = 0; d < LM_MAX_DIMS; d++) {
      g.shape[d] = d < it.ndim ? it.shape[d] : 1;
      if (g.small) g.dv[d].init((uint32_t)g.shape[d]);
      else g.dv[d].d = 1, g.dv[d].m = 0, g.dv[d].s = 0;
      for (int k = 0; k < MAXOPS; k++) g.st[k][d] = (k < it.nops && d < it.ndim) ? it.strides[k][d] : 0;
   }
   for (int k = 0; k < MAXOPS; k++) g.ptr[k] = k < it.nops ? (char *)it.base[k] : NULL;
}

/* ---------------------------------------------------------------- the kernel bodies */

/* what every op's launch needs (host-built, passed by value) */
template <class T> struct Args {
   int nin, kop, epi;
   int dt[MAXOPS];   /* operand dtypes: out, inputs */
   int in_dt[3], via[3], out_dt, out_via;
   int scalar_k;     /* the input given as a number (sval), -1: none */
   T sval;
   KP<T> p;
};

/* the general body: any strides, any dtypes, the op at run time */
template <int TB, class T> struct GenBody {
   Geo g;
   Args<T> a;
   template <int OP> LM_HD T run(const T *v) const {
      if constexpr (has_op(TB, OP, is_int<T>())) return apply<TB, OP, T>(v, a.p);
      else return v[0];
   }
   template <int OP> LM_HD T dispatch(int op, const T *v) const {
      if (op == OP) return run<OP>(v);
      if constexpr (OP + 1 < num_ops(TB)) return dispatch<OP + 1>(op, v);
      else return v[0];
   }
   LM_HD void operator()(int64_t i) const {
      int64_t off[MAXOPS];
      g.offsets(i, off);
      T v[3] = {0, 0, 0};
      for (int k = 0; k < 3; k++)
         if (k < a.nin)
            v[k] = k == a.scalar_k ? a.sval
                                   : load_in<T>(g.ptr[k + 1] + off[k + 1], a.dt[k + 1], a.via[k], a.in_dt[k]);
      T r = dispatch<0>(a.kop, v);
      if (a.epi >= 0) r = epilogue<T>(a.epi, r);
      store_out<T>(g.ptr[0] + off[0], a.dt[0], r, a.out_dt, a.out_via);
   }
};

/* VW elements of storage S moved as one aligned vector (a 16-byte load for float32, 8 bytes for
   float16 / bfloat16) */
constexpr int VW = 4;
template <class S> struct alignas(sizeof(S) * VW) Vec { S v[VW]; };

/* the dense body: element i at index i of every operand (bstride[k] 0 for a broadcast one-element
   input), tensor inputs of storage S (the where condition: bool / uint8 bytes), the output S or
   bool. Work item j covers elements [VW j, VW j + VW): with vector loads and stores when every
   pointer is aligned for them (vec), else one by one. */
template <int TB, int OP, class T, class S> struct HomoBody {
   char *out;
   const char *in[3];
   int64_t bstride[3]; /* 1, or 0 for a one-element input */
   int64_t n;
   int vec;
   Args<T> a;
   static constexpr bool WHERE = TB == LM_EW_OTHER && OP == LM_T_WHERE;
   LM_HD T finish(const T *v) const {
      T r = apply<TB, OP, T>(v, a.p);
      if constexpr (TB == LM_EW_BINARY && !bool_out(TB, OP))
         if (a.epi >= 0) r = epilogue<T>(a.epi, r);
      return r;
   }
   LM_HD void one(int64_t i) const {
      constexpr int N = nin_of(TB, OP);
      T v[3] = {0, 0, 0};
      for (int k = 0; k < N; k++) {
         if (k == a.scalar_k) v[k] = a.sval;
         else if (WHERE && k == 0) v[k] = (T)(((const uint8_t *)in[0])[i * bstride[0]] != 0);
         else v[k] = (T)St<S>::ld((const S *)in[k] + i * bstride[k]);
      }
      const T r = finish(v);
      if constexpr (bool_out(TB, OP)) ((uint8_t *)out)[i] = r != 0;
      else St<S>::st((S *)out + i, r);
   }
   LM_HD void operator()(int64_t j) const {
      const int64_t i0 = j * VW;
      if (!vec || i0 + VW > n) {
         const int64_t end = i0 + VW < n ? i0 + VW : n;
         for (int64_t i = i0; i < end; i++) one(i);
         return;
      }
      constexpr int N = nin_of(TB, OP);
      T v[VW][3];
      for (int k = 0; k < N; k++) {
         if (k == a.scalar_k) {
            for (int e = 0; e < VW; e++) v[e][k] = a.sval;
         } else if (WHERE && k == 0) {
            if (bstride[0] == 0) {
               const T c = (T)(*(const uint8_t *)in[0] != 0);
               for (int e = 0; e < VW; e++) v[e][k] = c;
            } else {
               const Vec<uint8_t> c = *(const Vec<uint8_t> *)(in[0] + i0);
               for (int e = 0; e < VW; e++) v[e][k] = (T)(c.v[e] != 0);
            }
         } else if (bstride[k] == 0) {
            const T x = (T)St<S>::ld((const S *)in[k]);
            for (int e = 0; e < VW; e++) v[e][k] = x;
         } else {
            const Vec<S> x = *(const Vec<S> *)((const S *)in[k] + i0);
            for (int e = 0; e < VW; e++) v[e][k] = (T)St<S>::ld(&x.v[e]);
         }
      }
      if constexpr (bool_out(TB, OP)) {
         Vec<uint8_t> o;
         for (int e = 0; e < VW; e++) o.v[e] = finish(v[e]) != 0;
         *(Vec<uint8_t> *)(out + i0) = o;
      } else {
         Vec<S> o;
         for (int e = 0; e < VW; e++) St<S>::st(&o.v[e], finish(v[e]));
         *(Vec<S> *)((S *)out + i0) = o;
      }
   }
};

/* ---- launchers (elementwise_homo_*.cu: one file per table, so they compile in parallel) ---- */
struct HomoLaunch {
   int k;          /* the device */
   int64_t n;
   char *out;
   const char *in[3];
   int64_t bstride[3];
   int sdt;        /* the storage dtype S */
   int kind;
   const void *args; /* Args<T> of the kind */
};
lm_status homo_unary(const HomoLaunch &l, int op);
lm_status homo_binary(const HomoLaunch &l, int op);
lm_status homo_other(const HomoLaunch &l, int op);

/* run HomoBody<TB, OP, T, S> for the storage dtype l.sdt */
template <int TB, int OP, class T, class S> lm_status homo_run(const HomoLaunch &l) {
   HomoBody<TB, OP, T, S> b;
   b.out = l.out;
   for (int k = 0; k < 3; k++) b.in[k] = l.in[k], b.bstride[k] = l.bstride[k];
   b.n = l.n;
   b.a = *(const Args<T> *)l.args;
   /* vector access needs every streamed pointer aligned to a whole vector */
   const uintptr_t vs = sizeof(S) * VW, os = bool_out(TB, OP) ? (uintptr_t)VW : vs;
   b.vec = (uintptr_t)l.out % os == 0;
   for (int k = 0; k < nin_of(TB, OP); k++)
      if (k != b.a.scalar_k && l.bstride[k] != 0)
         b.vec &= (uintptr_t)l.in[k] % ((TB == LM_EW_OTHER && OP == LM_T_WHERE && k == 0) ? (uintptr_t)VW : vs) == 0;
   return lm_cu_for(l.k, (l.n + VW - 1) / VW, b);
}
template <int TB, int OP> lm_status homo_op(const HomoLaunch &l) {
   if (l.kind == LM_K_F32) {
      if (l.sdt == LM_FLOAT32) return homo_run<TB, OP, float, float>(l);
      if (l.sdt == LM_FLOAT16) return homo_run<TB, OP, float, H16>(l);
      if (l.sdt == LM_BFLOAT16) return homo_run<TB, OP, float, BF16>(l);
   } else if (l.kind == LM_K_F64) {
      if (l.sdt == LM_FLOAT64) return homo_run<TB, OP, double, double>(l);
   } else if constexpr (has_op(TB, OP, true)) {
      if (l.sdt == LM_INT64) return homo_run<TB, OP, i64, i64>(l);
   }
   return lm_error(LM_ERR_INTERNAL, "elementwise: no dense CUDA kernel for this dtype");
}
template <int TB, int OP> lm_status homo_dispatch(const HomoLaunch &l, int op) {
   if (op == OP) return homo_op<TB, OP>(l);
   if constexpr (OP + 1 < num_ops(TB)) return homo_dispatch<TB, OP + 1>(l, op);
   else return lm_error(LM_ERR_INTERNAL, "elementwise: unknown op %d", op);
}

} /* namespace lmew */
#endif
