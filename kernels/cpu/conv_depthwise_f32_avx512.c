/* conv_depthwise_f32_avx512.c -- depthwise float32 NHWC convolutions for AVX-512 (groups == C ==
 * O): forward, backward data and backward weight, vectorized over the channels.
 */
#include "conv_internal.h"
#include "act_avx512.h"
#include <immintrin.h>

/* ---------------------------------------------------------------------------------------------
 * depthwise (groups == C == O), vectorized over C: blocks of 64 channels (4 zmm, masked at the
 * tail) x 4 consecutive output pixels, so each weight vector is loaded once per 4 pixels.
 * wt is the kernel transposed to [tap][C].
 */
enum { DW_PB = 4 };

static void dw_masks(int64_t left, __mmask16 *m) {
   for (int v = 0; v < 4; v++) {
      const int64_t l = left - 16 * v;
      m[v] = l >= 16 ? (__mmask16)0xFFFF : (l <= 0 ? (__mmask16)0 : (__mmask16)((1u << l) - 1));
   }
}

static float *dw_transpose_w(const conv_geom *g, const float *w, size_t *bytes) {
   const int64_t C = g->C, taps = g->kh * g->kw;
   *bytes = (size_t)(taps * C) * sizeof(float);
   float *wt = lm_alloc(*bytes);
   if (!wt) return NULL;
   for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < taps; t++) wt[t * C + c] = w[c * taps + t];
   return wt;
}

/* forward (transposed = 0) or backward data (transposed = 1, gather form): output pixel (r, q)
   of image n reads input pixel (r*sh - ph + i*dh, q*sw - pw + j*dw) (forward) or
   ((r + ph - i*dh)/sh, (q + pw - j*dw)/sw) where divisible (backward data) */
static void dw_rows(const conv_geom *g, int transposed, const float *in, const float *wt,
                    const float *bias, const float *res, int act, float *out, int nthr) {
   const int64_t C = g->C, kh = g->kh, kw = g->kw;
   const int64_t inH = transposed ? g->Ho : g->H, inW = transposed ? g->Wo : g->W;
   const int64_t outH = transposed ? g->H : g->Ho, outW = transposed ? g->W : g->Wo;
   const int64_t rows = g->N * outH;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / outH, r = row % outH;
      const float *img = in + n * inH * inW * C;
      /* pixel blocks outside, channel blocks inside: the input is read in memory order */
      for (int64_t q0 = 0; q0 < outW; q0 += DW_PB) {
         const int64_t pb = outW - q0 < DW_PB ? outW - q0 : DW_PB;
         for (int64_t c0 = 0; c0 < C; c0 += 64) {
            __mmask16 m[4];
            dw_masks(C - c0, m);
            __m512 b[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
               b[v] = bias ? _mm512_maskz_loadu_ps(m[v], bias + c0 + 16 * v) : _mm512_setzero_ps();
            __m512 a[DW_PB][4];
#pragma GCC unroll 4
            for (int k = 0; k < DW_PB; k++)
#pragma GCC unroll 4
               for (int v = 0; v < 4; v++) a[k][v] = b[v];
            for (int64_t i = 0; i < kh; i++) {
               int64_t hi;
               if (!transposed) {
                  hi = r * g->sh - g->ph + i * g->dh;
                  if (hi < 0 || hi >= inH) continue;
               } else {
                  const int64_t th = r + g->ph - i * g->dh;
                  if (th < 0 || th % g->sh) continue;
                  hi = th / g->sh;
                  if (hi >= inH) continue;
               }
               const float *irow = img + hi * inW * C + c0;
               for (int64_t j = 0; j < kw; j++) {
                  const float *wp = wt + (i * kw + j) * C + c0;
                  __m512 w[4];
#pragma GCC unroll 4
                  for (int v = 0; v < 4; v++) w[v] = _mm512_maskz_loadu_ps(m[v], wp + 16 * v);
                  /* input column of each pixel, or -1 */
                  int64_t wi[DW_PB];
#pragma GCC unroll 4
                  for (int k = 0; k < DW_PB; k++) {
                     wi[k] = -1;
                     if (k >= pb) continue;
                     if (!transposed) {
                        const int64_t c = (q0 + k) * g->sw - g->pw + j * g->dw;
                        if (c >= 0 && c < inW) wi[k] = c;
                     } else {
                        const int64_t tw = q0 + k + g->pw - j * g->dw;
                        if (tw >= 0 && tw % g->sw == 0 && tw / g->sw < inW) wi[k] = tw / g->sw;
                     }
                  }
#pragma GCC unroll 4
                  for (int k = 0; k < DW_PB; k++) {
                     if (wi[k] < 0) continue;
                     const float *xp = irow + wi[k] * C;
#pragma GCC unroll 4
                     for (int v = 0; v < 4; v++)
                        a[k][v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], xp + 16 * v), w[v],
                                                  a[k][v]);
                  }
               }
            }
#pragma GCC unroll 4
            for (int k = 0; k < DW_PB; k++) {
               if (k >= pb) continue;
               const int64_t off = ((n * outH + r) * outW + q0 + k) * C + c0;
#pragma GCC unroll 4
               for (int v = 0; v < 4; v++) {
                  __m512 t = a[k][v];
                  if (res) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], res + off + 16 * v));
                  if (act) t = lm_act_ps(t, act);
                  _mm512_mask_storeu_ps(out + off + 16 * v, m[v], t);
               }
            }
         }
      }
   }
}

lm_status lm_conv_dw_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int act, float *out) {
   size_t bytes;
   float *wt = dw_transpose_w(g, w, &bytes);
   if (!wt) return LM_ERR_OOM;
   dw_rows(g, 0, x, wt, bias, res, act, out,
           conv_threads((double)g->N * g->Ho * g->Wo * g->C * g->kh * g->kw));
   lm_free(wt, bytes);
   return LM_OK;
}

lm_status lm_conv_dw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                      float *gx) {
   size_t bytes;
   float *wt = dw_transpose_w(g, w, &bytes);
   if (!wt) return LM_ERR_OOM;
   dw_rows(g, 1, gout, wt, NULL, NULL, 0, gx,
           conv_threads((double)g->N * g->Ho * g->Wo * g->C * g->kh * g->kw));
   lm_free(wt, bytes);
   return LM_OK;
}

/* gw: (C, 1, kh, kw); per-thread partials [tap][C] (+ bias), one output row per work unit */
lm_status lm_conv_dw_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                      float *gw, float *gb) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, taps = kh * kw;
   if (gw) memset(gw, 0, (size_t)(C * taps) * sizeof(float));
   if (gb) memset(gb, 0, (size_t)C * sizeof(float));
   if (N * Ho * Wo == 0 || C == 0) return LM_OK;
   const int nthr = conv_threads((double)N * Ho * Wo * C * taps);
   const int64_t Cp = (C + 15) / 16 * 16, per = (taps + 1) * Cp;
   const size_t bytes = (size_t)(nthr * per) * sizeof(float);
   float *buf = lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *pw = buf + conv_thread_id() * per, *pb = pw + taps * Cp;
      memset(pw, 0, (size_t)per * sizeof(float));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < N * Ho; row++) {
         const int64_t n = row / Ho, ho = row % Ho;
         const float *grow = gout + row * Wo * C;
         for (int64_t c0 = 0; c0 < C; c0 += 64) {
            __mmask16 m[4];
            dw_masks(C - c0, m);
            if (gb) {
               __m512 s[4];
               for (int v = 0; v < 4; v++) s[v] = _mm512_maskz_loadu_ps(m[v], pb + c0 + 16 * v);
               for (int64_t wo = 0; wo < Wo; wo++)
                  for (int v = 0; v < 4; v++)
                     s[v] = _mm512_add_ps(s[v],
                                          _mm512_maskz_loadu_ps(m[v], grow + wo * C + c0 + 16 * v));
               for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(pb + c0 + 16 * v, m[v], s[v]);
            }
            if (!gw) continue;
            for (int64_t i = 0; i < kh; i++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               const float *xrow = x + (n * H + hi) * W * C + c0;
               for (int64_t j = 0; j < kw; j++) {
                  int64_t lo, hi_;
                  conv_valid_range(W, Wo, g->sw, g->pw, j * g->dw, &lo, &hi_);
                  float *ap = pw + (i * kw + j) * Cp + c0;
                  __m512 a[4];
                  for (int v = 0; v < 4; v++) a[v] = _mm512_maskz_loadu_ps(m[v], ap + 16 * v);
                  for (int64_t wo = lo; wo < hi_; wo++) {
                     const float *xp = xrow + (wo * g->sw - g->pw + j * g->dw) * C;
                     const float *gp = grow + wo * C + c0;
                     for (int v = 0; v < 4; v++)
                        a[v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], xp + 16 * v),
                                               _mm512_maskz_loadu_ps(m[v], gp + 16 * v), a[v]);
                  }
                  for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(ap + 16 * v, m[v], a[v]);
               }
            }
         }
      }
      const int nt = conv_num_threads_in_team();
#pragma omp single
      {
         for (int t = 0; t < nt; t++) {
            const float *src = buf + t * per;
            if (gw)
               for (int64_t c = 0; c < C; c++)
                  for (int64_t k = 0; k < taps; k++) gw[c * taps + k] += src[k * Cp + c];
            if (gb)
               for (int64_t c = 0; c < C; c++) gb[c] += src[taps * Cp + c];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}
