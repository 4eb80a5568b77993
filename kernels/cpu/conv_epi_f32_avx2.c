/* conv_epi_f32_avx2.c -- the portable convolutions' float32 NHWC epilogue on 8 lanes (AVX2 +
 * FMA): out = act(out + bias + residual) over rows of O channels, in that order, with
 * act_avx2.h's activations (the elementwise ops' at AVX2, ew_act_f32_avx2.c, so a fused and an
 * unfused activation give the same values). The last O % 8 channels of a row go through an
 * 8-value stack copy. Called by kernels/cpu/conv_tmpl.c's float32 forward (im2col_gemm) when
 * lm_cpu_isa() is AVX2.
 *
 * Why: that forward runs every 1x1 layer below AVX-512, and its epilogue was the portable row
 * loop (x86-64-v2, no FMA): with SiLU fused, EfficientNet-B0's 8 x 16 x 112 x 112 -> 96 1x1
 * layer took 20-21 ms on a Zen 3 (2 threads), 7-8 without the activation.
 */
#include "conv_internal.h"
#include "act_avx2.h"
#include <string.h>

static inline __attribute__((always_inline)) void
epi_rows(float *out, int64_t rows, int64_t O, const float *bias, const float *res, const int act) {
   for (int64_t p = 0; p < rows; p++) {
      float *o = out + p * O;
      const float *r = res ? res + p * O : NULL;
      int64_t c = 0;
      for (; c + 8 <= O; c += 8) {
         __m256 v = _mm256_loadu_ps(o + c);
         if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + c));
         if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + c));
         _mm256_storeu_ps(o + c, act ? lm_act_ps8(v, act) : v);
      }
      if (c < O) {
         const size_t n = (size_t)(O - c) * sizeof(float);
         float t[8] = {0}, tb[8] = {0}, tr[8] = {0};
         memcpy(t, o + c, n);
         if (bias) memcpy(tb, bias + c, n);
         if (r) memcpy(tr, r + c, n);
         __m256 v = _mm256_loadu_ps(t);
         if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(tb));
         if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(tr));
         _mm256_storeu_ps(t, act ? lm_act_ps8(v, act) : v);
         memcpy(o + c, t, n);
      }
   }
}

void lm_conv_epi_nhwc_f32_avx2(float *out, int64_t rows, int64_t O, const float *bias,
                               const float *res, int act) {
   switch (act) { /* one loop per activation: its constants stay in registers */
#define EPI_CASE(A)                                                                             \
   case A: epi_rows(out, rows, O, bias, res, A); break;
      EPI_CASE(LM_ACT_RELU)
      EPI_CASE(LM_ACT_RELU6)
      EPI_CASE(LM_ACT_SILU)
      EPI_CASE(LM_ACT_SIGMOID)
      EPI_CASE(LM_ACT_HARDSWISH)
      EPI_CASE(LM_ACT_HARDSIGMOID)
      EPI_CASE(LM_ACT_GELU)
      EPI_CASE(LM_ACT_GELU_TANH)
#undef EPI_CASE
   default: epi_rows(out, rows, O, bias, res, 0); break;
   }
}
