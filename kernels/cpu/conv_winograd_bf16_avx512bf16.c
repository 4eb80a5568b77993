/* conv_winograd_bf16_avx512bf16.c -- Winograd F(4x4, 3x3) for bfloat16 convolutions on
 * AVX512_BF16 (vdpbf16ps): the entry points (at the end) and the products, for both schedules of
 * conv_winograd_f32_avx512.c (the unit schedule's
 * wg_gemm_bf16 and the wide one's chunks of 64 reduction channels) and for the weight gradient
 * (the products summed over pairs of tiles).
 *
 * A bfloat16 convolution's inputs and weights are bfloat16 already; its transforms run in float32
 * (conv_winograd_f32_avx512.c, reading the bfloat16 tensors widened) and only the 36 products per
 * tile -- tiles x 64 channels by 64 channels x output block -- take bfloat16 operands: the
 * transformed input V and weights U (or grad_output D) rounded once to bfloat16 (round to nearest
 * even), products summed in float32. That is the part of Winograd that scales with Cin x Cout, and
 * vdpbf16ps does it at twice the float32 FMA rate.
 *
 * Accuracy: rounding V and U adds an error that the output transform amplifies (its coefficients
 * reach 8); the float32 transforms and sums keep the rest exact. On ResNet50 under bf16 autocast
 * (bench/amp_accuracy.sh: logits against float64, PyTorch's bf16 error the unit) every 3x3
 * stride-1 layer emulated this way measured 1.29x PyTorch's error at the max and 1.24x in norm,
 * against 1.13x / 0.96x with the direct bf16 kernels (the acceptance bound is 2x); the kernels
 * here measured 1.17x / 1.26x. A single layer: relative error 1.6e-2 in norm against the direct
 * kernels' 1.7e-3 (bench/bf16_winograd_accuracy.lua). lm.backends.cpu.bf16_winograd = false
 * (kernels/cpu/conv.c) keeps the direct kernels.
 *
 * Layouts (32-bit words, each a pair of bfloat16: channel 2p in the low half, 2p+1 in the high,
 * as a bfloat16 array of channels reads):
 *   V: tile k's 64 channels at x + k*32 (32 words);
 *   U: pair p's OB output channels at w + p*OB (OB words; word o = {U[2p][o], U[2p+1][o]}).
 * Compiled with -mavx512bf16; called only when lm_cpu_isa() >= LM_ISA_AVX512_BF16.
 */
#include "conv_internal.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* 16 floats -> 16 bfloat16, round to nearest even (vcvtneps2bf16; NaN stays NaN) */
AI __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

void lm_wg_bf16_pack_v(const float *v, uint32_t *vb, int64_t n) {
   int64_t i = 0;
   for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)((uint16_t *)vb + i),
                                                    to_bf16(_mm512_loadu_ps(v + i)));
   if (i < n) {
      const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
      _mm256_mask_storeu_epi16((uint16_t *)vb + i, m, to_bf16(_mm512_maskz_loadu_ps(m, v + i)));
   }
}

void lm_wg_bf16_pack_u(const float *u, int64_t ues, int64_t OB, uint32_t *ub, int64_t ubes) {
   /* interleave rows 2p and 2p+1: word o = {row 2p [o], row 2p+1 [o]} */
   const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                       8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
   for (int e = 0; e < 36; e++)
      for (int64_t p = 0; p < 32; p++) {
         const float *r0 = u + e * ues + 2 * p * OB, *r1 = r0 + OB;
         uint32_t *d = ub + e * ubes + p * OB;
         for (int64_t v = 0; v < OB; v += 16) {
            const __m512i a = _mm512_castsi256_si512(to_bf16(_mm512_loadu_ps(r0 + v)));
            const __m512i b = _mm512_castsi256_si512(to_bf16(_mm512_loadu_ps(r1 + v)));
            /* the 16 halves of a in the even places, those of b in the odd ones */
            _mm512_storeu_si512(d + v, _mm512_permutex2var_epi16(a, lo, b));
         }
      }
}

void lm_wg_bf16_pack_rows(const float *src, int64_t rows, int64_t len, int64_t ld, uint32_t *dst,
                          int64_t ldd) {
   const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                       8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
   for (int64_t p = 0; p < (rows + 1) / 2; p++) {
      const float *r0 = src + 2 * p * ld, *r1 = r0 + ld;
      const int odd = 2 * p + 1 >= rows; /* the last row of an odd count pairs with zeros */
      uint32_t *d = dst + p * ldd;
      for (int64_t i = 0; i < len; i += 16) {
         const __mmask16 m = len - i >= 16 ? (__mmask16)0xFFFF
                                            : (__mmask16)((1u << (len - i)) - 1);
         const __m512i a = _mm512_castsi256_si512(to_bf16(_mm512_maskz_loadu_ps(m, r0 + i)));
         const __m512i b = _mm512_castsi256_si512(
            to_bf16(odd ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, r1 + i)));
         _mm512_mask_storeu_epi32(d + i, m, _mm512_permutex2var_epi16(a, lo, b));
      }
   }
}

/* out[k*pitch + 16v ..] (+)= sum over the 32 pairs p of x[k*32 + p] . w[p*OB + 16v ..] for PB
   tiles k and NV vectors v (one 64-channel chunk; added to out unless `first`) */
AI void wgb_body(const uint32_t *x, const uint32_t *w, int64_t OB, float *out, int64_t pitch,
                 int first, const int PB, const int NV) {
   __m512 a[14][4];
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++)
         a[k][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(out + k * pitch + 16 * v);
   for (int p = 0; p < 32; p++) {
      __m512bh wv[4];
      /* the next row block's V rows (32 words) and partial sums (wg_prefetch_next), as the
         float32 kernel does: faster on a loaded host, no slower on a quiet one (numbers:
         docs/performance.md, "Measurements behind kernel choices") */
      wg_prefetch_next(x, 32 * 4, out, pitch, PB, NV, p, 8, first);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) wv[v] = (__m512bh)_mm512_loadu_si512(w + p * OB + 16 * v);
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++) {
         const __m512bh b = (__m512bh)_mm512_set1_epi32((int)x[k * 32 + p]);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) a[k][v] = _mm512_dpbf16_ps(a[k][v], b, wv[v]);
      }
   }
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(out + k * pitch + 16 * v, a[k][v]);
}

typedef void (*wgb_fn)(const uint32_t *, const uint32_t *, int64_t, float *, int64_t, int);
#define WGB(PB, NV)                                                                             \
   static void wgb_##PB##_##NV(const uint32_t *x, const uint32_t *w, int64_t OB, float *out,    \
                               int64_t pitch, int first) {                                      \
      wgb_body(x, w, OB, out, pitch, first, PB, NV);                                            \
   }
WGB(1, 1) WGB(2, 1) WGB(3, 1) WGB(4, 1) WGB(5, 1) WGB(6, 1) WGB(7, 1) WGB(8, 1) WGB(9, 1)
WGB(10, 1) WGB(11, 1) WGB(12, 1) WGB(13, 1) WGB(14, 1)
WGB(1, 2) WGB(2, 2) WGB(3, 2) WGB(4, 2) WGB(5, 2) WGB(6, 2) WGB(7, 2) WGB(8, 2)
WGB(1, 3) WGB(2, 3) WGB(3, 3) WGB(4, 3) WGB(5, 3) WGB(6, 3) WGB(7, 3) WGB(8, 3)
WGB(1, 4) WGB(2, 4) WGB(3, 4) WGB(4, 4) WGB(5, 4) WGB(6, 4)
static const wgb_fn wgb_tab[5][15] = {
   {0},
   {0, wgb_1_1, wgb_2_1, wgb_3_1, wgb_4_1, wgb_5_1, wgb_6_1, wgb_7_1, wgb_8_1, wgb_9_1, wgb_10_1,
    wgb_11_1, wgb_12_1, wgb_13_1, wgb_14_1},
   {0, wgb_1_2, wgb_2_2, wgb_3_2, wgb_4_2, wgb_5_2, wgb_6_2, wgb_7_2, wgb_8_2},
   {0, wgb_1_3, wgb_2_3, wgb_3_3, wgb_4_3, wgb_5_3, wgb_6_3, wgb_7_3, wgb_8_3},
   {0, wgb_1_4, wgb_2_4, wgb_3_4, wgb_4_4, wgb_5_4, wgb_6_4},
};

void lm_wg_bf16_gemm(int nv, int pb, const uint32_t *x, const uint32_t *w, int64_t OB,
                     float *out, int64_t pitch, int first) {
   wgb_tab[nv][pb](x, w, OB, out, pitch, first);
}

/* acc[r][16v ..] += sum over the np pairs p of x[p*xs + r] . d[p*ds + 16v ..] for R rows r
   (input channels) and NV vectors v (output channels): the weight gradient's products, the
   reduction over pairs of tiles */
AI void wgwb_body(const uint32_t *x, int64_t xs, const uint32_t *d, int64_t ds, int64_t np,
                  float *accp, int64_t ap, const int R, const int NV) {
   __m512 acc[16][4];
#pragma GCC unroll 16
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_load_ps(accp + r * ap + 16 * v);
   for (int64_t p = 0; p < np; p++) {
      __m512bh gv[4];
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) gv[v] = (__m512bh)_mm512_loadu_si512(d + 16 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; r++) {
         const __m512bh b = (__m512bh)_mm512_set1_epi32((int)x[r]);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], b, gv[v]);
      }
      x += xs;
      d += ds;
   }
#pragma GCC unroll 16
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(accp + r * ap + 16 * v, acc[r][v]);
}

typedef void (*wgwb_fn)(const uint32_t *, int64_t, const uint32_t *, int64_t, int64_t, float *,
                        int64_t);
#define WGWB(R, NV)                                                                             \
   static void wgwb_##R##_##NV(const uint32_t *x, int64_t xs, const uint32_t *d, int64_t ds,    \
                               int64_t np, float *accp, int64_t ap) {                           \
      wgwb_body(x, xs, d, ds, np, accp, ap, R, NV);                                             \
   }
WGWB(1, 1) WGWB(2, 1) WGWB(3, 1) WGWB(4, 1) WGWB(5, 1) WGWB(6, 1) WGWB(7, 1) WGWB(8, 1)
WGWB(9, 1) WGWB(10, 1) WGWB(11, 1) WGWB(12, 1) WGWB(13, 1) WGWB(14, 1) WGWB(15, 1) WGWB(16, 1)
WGWB(1, 2) WGWB(2, 2) WGWB(3, 2) WGWB(4, 2) WGWB(5, 2) WGWB(6, 2) WGWB(7, 2) WGWB(8, 2)
WGWB(1, 3) WGWB(2, 3) WGWB(3, 3) WGWB(4, 3) WGWB(5, 3) WGWB(6, 3) WGWB(7, 3) WGWB(8, 3)
WGWB(1, 4) WGWB(2, 4) WGWB(3, 4) WGWB(4, 4) WGWB(5, 4) WGWB(6, 4)
static const wgwb_fn wgwb_tab[5][17] = {
   {0},
   {0, wgwb_1_1, wgwb_2_1, wgwb_3_1, wgwb_4_1, wgwb_5_1, wgwb_6_1, wgwb_7_1, wgwb_8_1, wgwb_9_1,
    wgwb_10_1, wgwb_11_1, wgwb_12_1, wgwb_13_1, wgwb_14_1, wgwb_15_1, wgwb_16_1},
   {0, wgwb_1_2, wgwb_2_2, wgwb_3_2, wgwb_4_2, wgwb_5_2, wgwb_6_2, wgwb_7_2, wgwb_8_2},
   {0, wgwb_1_3, wgwb_2_3, wgwb_3_3, wgwb_4_3, wgwb_5_3, wgwb_6_3, wgwb_7_3, wgwb_8_3},
   {0, wgwb_1_4, wgwb_2_4, wgwb_3_4, wgwb_4_4, wgwb_5_4, wgwb_6_4},
};

void lm_wg_bf16_wgrad(int nv, int r, const uint32_t *x, int64_t xs, const uint32_t *d,
                      int64_t ds, int64_t np, float *acc, int64_t ap) {
   wgwb_tab[nv][r](x, xs, d, ds, np, acc, ap);
}

/* ---------------------------------------------------------------------------------------------
 * entry points (conv_internal.h): the schedules of conv_winograd_f32_avx512.c (lm_wg_conv,
 * lm_wg_bwdw, lm_wg_bwdw_wide) with bf16 = 1, whose products are the functions above
 */
/* F(4x4) with at least 64 reduction channels (CP a multiple of 64), either schedule */
int lm_conv_wino_bf16_usable(const conv_geom *g, int backward_data) {
   if (!lm_conv_wino_usable(g, backward_data) || lm_wg_tile_size(backward_data) != 4) return 0;
   const int64_t cin = backward_data ? g->O : g->C;
   return cin >= 64 && lm_wg_cp(cin) % 64 == 0;
}

lm_status lm_conv_wino_bf16_fwd(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                                const float *bias, const uint16_t *res, int act, uint16_t *out) {
   if (!lm_conv_wino_bf16_usable(g, 0)) return LM_ERR_INTERNAL;
   return lm_wg_conv(g, 0, 4, x, w, bias, res, act, out, 1);
}

lm_status lm_conv_wino_bf16_bwdd(const conv_geom *g, const uint16_t *gout, const uint16_t *w,
                                 uint16_t *gx) {
   if (!lm_conv_wino_bf16_usable(g, 1)) return LM_ERR_INTERNAL;
   return lm_wg_conv(g, 1, 4, gout, w, NULL, NULL, 0, gx, 1);
}

int lm_conv_wino_bf16_bwdw_usable(const conv_geom *g) {
   return lm_conv_wino_bwdw_usable(g) && g->C >= 64;
}

lm_status lm_conv_wino_bf16_bwdw(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                                 float *gw, float *gb) {
   if (!lm_conv_wino_bf16_bwdw_usable(g)) return LM_ERR_INTERNAL;
   if (lm_conv_rb_cp(g->C) < 16) return lm_wg_bwdw_wide(g, x, gout, gw, gb, 1);
   return lm_wg_bwdw(g, x, gout, gw, gb, 1);
}
