/* ew_act_f32_avx512.c -- the float32 activations of the elementwise ops on 16 lanes: GELU (erf
 * and tanh forms), SiLU, sigmoid, hardswish, hardsigmoid, and the gradients of GELU (both forms)
 * and SiLU. act_avx512.h has the arithmetic (shared with the convolutions' fused epilogue, so
 * fused and unfused agree on this path); the loops here run it over dense arrays, the last
 * n % 16 values under a mask (no scalar tail: every value takes the same formula).
 *
 * Chosen at run time (elementwise.c, lm_ew_act_avx512) for float32 compute (float32, and
 * float16 / bfloat16 widened to it) when lm_cpu_isa() >= LM_ISA_AVX512 and the implementation
 * "ew_act_avx512" (src/impl.h) is on; otherwise ew_kernels.c's portable loops run (their GELU
 * tanh form and gradients through libm, one value at a time). Why: ew_kernels.c's loops are
 * compiled without FMA (-std=c11: no contraction, so they give act.h's bits), and their exp
 * applies its power of two by integer ops in two halves; here the multiply-adds are fused and
 * vscalefps scales, about 40 vector operations per 16 GELUs instead of 95. */
#include "ew.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
#include "act_avx512.h"
#include <immintrin.h>

#define KARGS char *o_, const char *a_, const char *b_, const char *c_, int64_t n, const lm_kparams *p

static inline __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1u); }

/* o = f(a) */
#define U1(NAME, F)                                                                             \
   static void NAME(KARGS) {                                                                    \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_;                                                       \
      (void)b_;                                                                                 \
      (void)c_;                                                                                 \
      (void)p;                                                                                  \
      int64_t i = 0;                                                                            \
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, F(_mm512_loadu_ps(a + i)));          \
      if (i < n) {                                                                              \
         const __mmask16 m = tail_mask(n - i);                                                  \
         _mm512_mask_storeu_ps(o + i, m, F(_mm512_maskz_loadu_ps(m, a + i)));                   \
      }                                                                                         \
   }

/* o = f(x, y), x the gradient, y the forward input: both arrays (vv), y one value (vs), x one
   value (sv) */
#define B2(NAME, F)                                                                             \
   static void NAME##_vv(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_, *b = (const float *)b_;                               \
      (void)c_;                                                                                 \
      (void)p;                                                                                  \
      int64_t i = 0;                                                                            \
      for (; i + 16 <= n; i += 16)                                                              \
         _mm512_storeu_ps(o + i, F(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));            \
      if (i < n) {                                                                              \
         const __mmask16 m = tail_mask(n - i);                                                  \
         _mm512_mask_storeu_ps(o + i, m,                                                        \
                               F(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i))); \
      }                                                                                         \
   }                                                                                            \
   static void NAME##_vs(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_;                                                       \
      const __m512 y = _mm512_set1_ps(*(const float *)b_);                                      \
      (void)c_;                                                                                 \
      (void)p;                                                                                  \
      int64_t i = 0;                                                                            \
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, F(_mm512_loadu_ps(a + i), y));       \
      if (i < n) {                                                                              \
         const __mmask16 m = tail_mask(n - i);                                                  \
         _mm512_mask_storeu_ps(o + i, m, F(_mm512_maskz_loadu_ps(m, a + i), y));                \
      }                                                                                         \
   }                                                                                            \
   static void NAME##_sv(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *b = (const float *)b_;                                                       \
      const __m512 x = _mm512_set1_ps(*(const float *)a_);                                      \
      (void)c_;                                                                                 \
      (void)p;                                                                                  \
      int64_t i = 0;                                                                            \
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, F(x, _mm512_loadu_ps(b + i)));       \
      if (i < n) {                                                                              \
         const __mmask16 m = tail_mask(n - i);                                                  \
         _mm512_mask_storeu_ps(o + i, m, F(x, _mm512_maskz_loadu_ps(m, b + i)));                \
      }                                                                                         \
   }

static inline __attribute__((always_inline)) __m512 hswish(__m512 x) {
   return _mm512_div_ps(_mm512_mul_ps(x, lm_act_hclamp512(x)), _mm512_set1_ps(6.0f));
}
static inline __attribute__((always_inline)) __m512 hsig(__m512 x) {
   return _mm512_div_ps(lm_act_hclamp512(x), _mm512_set1_ps(6.0f));
}

/* GELU (erf) gradient, PyTorch's g * (cdf(y) + y * exp(-y^2 / 2) / sqrt(2 pi)); +-inf: NaN
   (inf * 0), as there */
static inline __attribute__((always_inline)) __m512 gelub(__m512 g, __m512 y) {
   __m512 cdf, s;
   (void)lm_act_gelu512_cdf(y, &cdf, &s);
   const __m512 pdf = lm_act_exp512(_mm512_xor_ps(s, _mm512_set1_ps(-0.0f)));
   const __m512 yk = _mm512_mul_ps(y, _mm512_set1_ps(0.39894228040143267794f));
   return _mm512_mul_ps(g, _mm512_fmadd_ps(yk, pdf, cdf));
}

/* GELU (tanh) gradient: PyTorch's g * (0.5 (1 + t) + 0.5 y (1 - t^2) kb (1 + 3 k y^2)) with
   t = tanh(u), taken through sg = 1 / (1 + e), e = exp(-2u): 0.5 (1 + t) = sg and
   1 - t^2 = 4 sg (e sg), so g * (sg + y (sg (e sg)) 2 kb (1 + 3 k y^2)). e sg = e / (1 + e) is
   capped at 1 (where e overflows: e sg is inf * 0, the cap gives the limit 1 and the term 0, as
   PyTorch's 1 - t^2 = 0); +-inf and |y| > 1.8e19 (y^2 overflows) give NaN, as there */
static inline __attribute__((always_inline)) __m512 geluth(__m512 g, __m512 y) {
   const __m512 one = _mm512_set1_ps(1.0f);
   const __m512 y2 = _mm512_mul_ps(y, y);
   const __m512 w = _mm512_fmadd_ps(_mm512_mul_ps(y2, _mm512_set1_ps(0.044715f)), y, y);
   const __m512 e = lm_act_exp512(_mm512_mul_ps(w, _mm512_set1_ps(-2.0f * LM_ACT_KB)));
   const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, e));
   const __m512 es = _mm512_min_ps(_mm512_mul_ps(e, sg), one); /* NaN -> 1 */
   const __m512 k2 = _mm512_fmadd_ps(_mm512_set1_ps(6.0f * 0.044715f * LM_ACT_KB), y2,
                                     _mm512_set1_ps(2.0f * LM_ACT_KB));
   const __m512 yq = _mm512_mul_ps(y, _mm512_mul_ps(sg, es));
   return _mm512_mul_ps(g, _mm512_fmadd_ps(yq, k2, sg));
}

/* SiLU gradient, PyTorch's g * sg * (1 + y (1 - sg)), sg = sigmoid(y) */
static inline __attribute__((always_inline)) __m512 silub(__m512 g, __m512 y) {
   const __m512 one = _mm512_set1_ps(1.0f);
   const __m512 sg = lm_act_sigmoid512(y);
   return _mm512_mul_ps(_mm512_mul_ps(g, sg), _mm512_fmadd_ps(y, _mm512_sub_ps(one, sg), one));
}

U1(gelu_v, lm_act_gelu512)
U1(gelut_v, lm_act_gelu_tanh512)
U1(silu_v, lm_act_silu512)
U1(sigmoid_v, lm_act_sigmoid512)
U1(hswish_v, hswish)
U1(hsig_v, hsig)
B2(gelub_v, gelub)
B2(geluth_v, geluth)
B2(silub_v, silub)

#define S1(NAME) {NAME, NULL, NULL}
#define S2(NAME) {NAME##_vv, NAME##_vs, NAME##_sv}

static const lm_kset unary[LM_NUM_UNARY] = {
   [LM_GELU] = S1(gelu_v),       [LM_GELU_TANH] = S1(gelut_v), [LM_SILU] = S1(silu_v),
   [LM_SIGMOID] = S1(sigmoid_v), [LM_HARDSWISH] = S1(hswish_v), [LM_HARDSIGMOID] = S1(hsig_v)};
static const lm_kset binary[LM_NUM_BINARY] = {[LM_GELU_BACKWARD] = S2(gelub_v),
                                              [LM_GELU_TANH_BACKWARD] = S2(geluth_v),
                                              [LM_SILU_BACKWARD] = S2(silub_v)};

const lm_kset *lm_ew_act_avx512(int table, int kop) {
   const lm_kset *k = table == LM_EW_UNARY && kop >= 0 && kop < LM_NUM_UNARY    ? &unary[kop]
                      : table == LM_EW_BINARY && kop >= 0 && kop < LM_NUM_BINARY ? &binary[kop]
                                                                                  : NULL;
   return k && k->vv ? k : NULL;
}

#else
/* not x86-64 with AVX-512 and FMA at compile time: the portable loops always */
const lm_kset *lm_ew_act_avx512(int table, int kop) {
   (void)table;
   (void)kop;
   return NULL;
}
#endif
