/* ew_act_f32_avx2.c -- the float32 activations of the elementwise ops on 8 lanes (AVX2 + FMA),
 * for CPUs below AVX-512: ew_act_f32_avx512.c's set (GELU erf and tanh forms, SiLU, sigmoid,
 * hardswish, hardsigmoid, the GELU and SiLU gradients) with act_avx2.h's arithmetic. The last
 * n % 8 values go through an 8-value stack copy (no scalar tail: every value takes the same
 * formula).
 *
 * Chosen at run time (elementwise.c) for float32 compute when lm_cpu_isa() is LM_ISA_AVX2 and the
 * implementation "ew_act_avx2" (src/impl.h) is on; otherwise ew_kernels.c's portable loops.
 * Why: those loops are compiled for x86-64-v2 without FMA; ConvNeXt's GELUs (69 million a
 * batch-8 forward) took about 2.5 ns each on a Zen 3 that way, 16 % of its inference. */
#include "ew.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include "act_avx2.h"
#include <string.h>

#define KARGS char *o_, const char *a_, const char *b_, const char *c_, int64_t n, const lm_kparams *p

/* 8 lanes from r < 8 values (zeros after), and back */
static inline __m256 load_part(const float *a, int64_t r) {
   float t[8] = {0};
   memcpy(t, a, (size_t)r * sizeof(float));
   return _mm256_loadu_ps(t);
}
static inline void store_part(float *o, __m256 v, int64_t r) {
   float t[8];
   _mm256_storeu_ps(t, v);
   memcpy(o, t, (size_t)r * sizeof(float));
}

#define U1(NAME, F)                                                                             \
   static void NAME(KARGS) {                                                                    \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_;                                                       \
      (void)b_, (void)c_, (void)p;                                                              \
      int64_t i = 0;                                                                            \
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, F(_mm256_loadu_ps(a + i)));             \
      if (i < n) store_part(o + i, F(load_part(a + i, n - i)), n - i);                          \
   }

#define B2(NAME, F)                                                                             \
   static void NAME##_vv(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_, *b = (const float *)b_;                               \
      (void)c_, (void)p;                                                                        \
      int64_t i = 0;                                                                            \
      for (; i + 8 <= n; i += 8)                                                                \
         _mm256_storeu_ps(o + i, F(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));            \
      if (i < n) store_part(o + i, F(load_part(a + i, n - i), load_part(b + i, n - i)), n - i); \
   }                                                                                            \
   static void NAME##_vs(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *a = (const float *)a_;                                                       \
      const __m256 y = _mm256_set1_ps(*(const float *)b_);                                      \
      (void)c_, (void)p;                                                                        \
      int64_t i = 0;                                                                            \
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, F(_mm256_loadu_ps(a + i), y));          \
      if (i < n) store_part(o + i, F(load_part(a + i, n - i), y), n - i);                       \
   }                                                                                            \
   static void NAME##_sv(KARGS) {                                                               \
      float *o = (float *)o_;                                                                   \
      const float *b = (const float *)b_;                                                       \
      const __m256 x = _mm256_set1_ps(*(const float *)a_);                                      \
      (void)c_, (void)p;                                                                        \
      int64_t i = 0;                                                                            \
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, F(x, _mm256_loadu_ps(b + i)));          \
      if (i < n) store_part(o + i, F(x, load_part(b + i, n - i)), n - i);                       \
   }

LM_AI8 __m256 hswish(__m256 x) {
   return _mm256_div_ps(_mm256_mul_ps(x, lm_act_hclamp8(x)), _mm256_set1_ps(6.0f));
}
LM_AI8 __m256 hsig(__m256 x) { return _mm256_div_ps(lm_act_hclamp8(x), _mm256_set1_ps(6.0f)); }

/* the gradients, as ew_act_f32_avx512.c's gelub / geluth / silub */
LM_AI8 __m256 gelub(__m256 g, __m256 y) {
   __m256 cdf, s;
   (void)lm_act_gelu8_cdf(y, &cdf, &s);
   const __m256 pdf = lm_act_exp8(lm_act_neg8(s));
   const __m256 yk = _mm256_mul_ps(y, _mm256_set1_ps(0.39894228040143267794f));
   return _mm256_mul_ps(g, _mm256_fmadd_ps(yk, pdf, cdf));
}
LM_AI8 __m256 geluth(__m256 g, __m256 y) {
   const __m256 one = _mm256_set1_ps(1.0f);
   const __m256 y2 = _mm256_mul_ps(y, y);
   const __m256 w = _mm256_fmadd_ps(_mm256_mul_ps(y2, _mm256_set1_ps(0.044715f)), y, y);
   const __m256 e = lm_act_exp8(_mm256_mul_ps(w, _mm256_set1_ps(-2.0f * LM_ACT_KB8)));
   const __m256 sg = _mm256_div_ps(one, _mm256_add_ps(one, e));
   const __m256 es = _mm256_min_ps(_mm256_mul_ps(e, sg), one); /* NaN -> 1 */
   const __m256 k2 = _mm256_fmadd_ps(_mm256_set1_ps(6.0f * 0.044715f * LM_ACT_KB8), y2,
                                     _mm256_set1_ps(2.0f * LM_ACT_KB8));
   const __m256 yq = _mm256_mul_ps(y, _mm256_mul_ps(sg, es));
   return _mm256_mul_ps(g, _mm256_fmadd_ps(yq, k2, sg));
}
LM_AI8 __m256 silub(__m256 g, __m256 y) {
   const __m256 one = _mm256_set1_ps(1.0f);
   const __m256 sg = lm_act_sigmoid8(y);
   return _mm256_mul_ps(_mm256_mul_ps(g, sg), _mm256_fmadd_ps(y, _mm256_sub_ps(one, sg), one));
}

U1(gelu_v, lm_act_gelu8)
U1(gelut_v, lm_act_gelu_tanh8)
U1(silu_v, lm_act_silu8)
U1(sigmoid_v, lm_act_sigmoid8)
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

const lm_kset *lm_ew_act_avx2(int table, int kop) {
   const lm_kset *k = table == LM_EW_UNARY && kop >= 0 && kop < LM_NUM_UNARY    ? &unary[kop]
                      : table == LM_EW_BINARY && kop >= 0 && kop < LM_NUM_BINARY ? &binary[kop]
                                                                                  : NULL;
   return k && k->vv ? k : NULL;
}

#else
const lm_kset *lm_ew_act_avx2(int table, int kop) {
   (void)table;
   (void)kop;
   return NULL;
}
#endif
