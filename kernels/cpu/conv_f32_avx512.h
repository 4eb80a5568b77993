/* conv_f32_avx512.h -- what the float32 NHWC AVX-512 convolution kernels share (internal):
 * the broadcast-FMA step of the direct, pointwise and narrow-input micro-kernels, the epilogue of
 * the pointwise and narrow-input tiles, the packed weight layout (conv_pack_f32_avx512.c), and
 * the pieces one of these files takes from another. Include only from files built with the
 * AVX-512 flags (*_avx512.c). The kernels themselves are declared in conv_internal.h. */
#ifndef LUMEN_CONV_F32_AVX512_H
#define LUMEN_CONV_F32_AVX512_H
#include "conv_internal.h"
#include "avx512_util.h"
#include "act_avx512.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* one step of a register-blocked reduction: a[k][v] += xp[k*xs] * wt[16v .. 16v+15] for PB
   pixels k (their values xs floats apart, broadcast) and NV vectors v of output channels (the
   direct, pointwise and narrow-input micro-kernels) */
AI void bcast_step(__m512 (*a)[4], const float *xp, int64_t xs, const float *wt, const int PB,
                   const int NV) {
   __m512 w[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++) w[v] = _mm512_load_ps(wt + 16 * v);
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) {
      const __m512 b = _mm512_set1_ps(xp[k * xs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, w[v], a[k][v]);
   }
}

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* the output channels packed per block: 64, or all of them rounded up to whole vectors */
static inline int64_t block_width(int64_t co) {
   if (co >= 64) return 64;
   return (co + 15) / 16 * 16;
}

/* ---- weight packing (conv_pack_f32_avx512.c), shared by the direct, pointwise and narrow-input
 * kernels ----
 * forward: w (O, taps, Cg) row-major -> wp[g][ob][tap][ci][OB], zero padded (nob blocks of OB
 * output channels per group); backward data: the flipped kernel with in/out swapped,
 * wp[g][cb][tap'][o][OB] = w[g*Og + o][flip(tap')][cb*OB + v]. nthr: the threads to pack with. */
LM_CONV_HIDDEN void lm_conv_f32_pack_fwd(const conv_geom *g, const float *w, int64_t OB,
                                         int64_t nob, float *wp, int nthr);
LM_CONV_HIDDEN void lm_conv_f32_pack_bwd(const conv_geom *g, const float *w, int64_t OB,
                                         int64_t ncb, float *wp, int nthr);
/* 16 x 16 transpose through memory: dst[j*ld + i] = src[i*ls + j] (avx512_util.h's transpose16
   works in registers) */
static inline void transpose16_mem(const float *src, int64_t ls, float *dst, int64_t ld) {
   __m512 r[16], t[16];
   for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ls);
   for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
   }
   /* r[4q + c], 128-bit lane L = column 4L + c of rows 4q .. 4q+3 */
   for (int q = 0; q < 16; q += 4) {
      r[q] = _mm512_shuffle_ps(t[q], t[q + 2], 0x44);
      r[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], 0xEE);
      r[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0x44);
      r[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
   }
   for (int c = 0; c < 4; c++) {
      const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
      const __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
      const __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
      const __m512 v3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
      _mm512_storeu_ps(dst + (0 + c) * ld, _mm512_shuffle_f32x4(v0, v2, 0x88));
      _mm512_storeu_ps(dst + (8 + c) * ld, _mm512_shuffle_f32x4(v0, v2, 0xDD));
      _mm512_storeu_ps(dst + (4 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0x88));
      _mm512_storeu_ps(dst + (12 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0xDD));
   }
}


/* ---- pointwise tiles (conv_pointwise_f32_avx512.c; the narrow-input kernel runs its tiles the
 * same way) ---- */
enum { PW_MAXPB = 14 }; /* the most pixels in a tile */

typedef struct {
   float *out;        /* the tile's first pixel, at the block's first channel */
   uint16_t *out16;   /* or, where non-NULL, bfloat16 results there (same offsets), rounded once
                         (the float32 route of a bfloat16 convolution: no float32 output pass) */
   const float *res;  /* the same place in the residual, or NULL */
   const uint16_t *res16; /* or, where non-NULL, a bfloat16 residual there (same offsets) */
   const float *bias; /* at the block's first channel, or NULL */
   int64_t ostride;   /* floats from one output pixel to the next */
   int act, stream;  /* stream: full vectors, 64-byte aligned */
   __mmask16 m[4];    /* the valid lanes of each vector */
} pw_epi;

/* the general epilogue of a PB x NV tile: bias, residual, activation (lm_conv_act), masked
   lanes, streaming stores when ep->stream */
AI void pw_epilogue(__m512 (*a)[4], const pw_epi *ep, const int PB, const int NV) {
   float *const o = ep->out;
   const int64_t os = ep->ostride;
   const float *const r = ep->res;
   const uint16_t *const r16 = ep->res16;
   const int act = ep->act, stream = ep->stream;
   __m512 bv[4];
   __mmask16 m[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++) {
      m[v] = ep->m[v];
      bv[v] = ep->bias ? _mm512_maskz_loadu_ps(m[v], ep->bias + 16 * v) : _mm512_setzero_ps();
   }
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
         __m512 t = _mm512_add_ps(a[k][v], bv[v]);
         if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], r + k * os + 16 * v));
         if (r16)
            t = _mm512_add_ps(t, bf16_widen16(_mm256_maskz_loadu_epi16(m[v], r16 + k * os +
                                                                         16 * v)));
         if (act) t = lm_act_ps(t, act);
         if (ep->out16)
            _mm256_mask_storeu_epi16(ep->out16 + k * os + 16 * v, m[v], bf16_round16(t));
         else if (stream)
            _mm512_stream_ps(o + k * os + 16 * v, t);
         else
            _mm512_mask_storeu_ps(o + k * os + 16 * v, m[v], t);
      }
}

/* pixels per tile for NV vectors (PB*NV accumulators + NV weights + a broadcast <= 32 zmm) */
static const int pw_pb[5] = {0, 14, 12, 8, 6};

/* streaming stores for an output of out_bytes (cold: the output block was cold when handed out);
   LUMEN_CONV_STREAM=0 / 1 forces them off / on */
LM_CONV_HIDDEN int lm_conv_pw_stream(double out_bytes, int cold);
/* x (N, H, W, C) -> the pixels a strided 1x1 layer reads, (N*Ho*Wo, C) (unstride = 0), or back:
   those rows of buf into gx, whose other pixels are zeroed (unstride = 1) */
LM_CONV_HIDDEN void lm_conv_pw_gather(const conv_geom *g, float *x, float *buf, int unstride);

/* ---- the direct weight gradient (conv_bwdw_f32_avx512.c): per-thread partial sums in the
 * packed layout, reduced in a fixed order; gw or gb may be NULL ---- */
LM_CONV_HIDDEN lm_status lm_conv_bwdw_direct_f32(const conv_geom *g, const float *x,
                                                 const float *gout, float *gw, float *gb);

#endif
