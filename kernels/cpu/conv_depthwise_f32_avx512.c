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

/* ---------------------------------------------------------------------------------------------
 * The tiled rows (square kernels, column dilation 1): one channel vector (16 lanes, masked at the
 * tail) of DWT_P output pixels of a row in registers, a kernel row's kw weights in registers, and
 * every input column the tile reads loaded once per kernel row and multiplied into each pixel
 * whose tap reads it: (DWT_P - 1) * S + KW loads for DWT_P * KW FMAs a kernel row, where the
 * 4-pixel x 64-channel blocks above load an input vector for every FMA and work out its column
 * per tap and pixel. Tiles whose taps all land inside the row run unmasked; the others (the
 * borders, a row's last partial tile) mask each column's FMAs off where it falls outside the
 * input (mask3: the sum is left as it was, as the blocks skip the tap). Each pixel adds bias,
 * then its taps in the blocks' order (kernel rows, then kernel columns, ascending): the same bits
 * as the blocks. Backward data reads grad_out column q + pw - j for tap j (the gather form at
 * stride 1), so its columns are walked from the last to the first to keep that order.
 *
 * Where (dwt_pick), from alternations in one process (Zen 4, 2 threads, batch 8, ms, blocks ->
 * tiles): the compute-bound 5x5 and 7x7 forwards at stride 1 and 2 (7x7 8 x 96 x 56 x 56 3.5-3.7
 * -> 1.7-1.8, 8 x 384 x 14 x 14 0.64-0.74 -> 0.49-0.60; 5x5 8 x 672 x 14 x 14 0.71-0.96 ->
 * 0.49-0.64, 8 x 144 x 56 x 56 stride 2 1.07-1.34 -> 0.75-1.04) and the stride-1 backward data of
 * 3x3, 5x5 and 7x7 (forward + both gradients, 7x7 8 x 96 x 56 x 56 12.2-13.7 -> 7.0-8.9, 3x3 8 x
 * 32 x 112 x 112 8.1 -> 6.0), one channel vector of 8 pixels a tile. 3x3 forwards, whose input
 * comes from the layer before and is read about once (memory-bound), take 4 pixels x 4 channel
 * vectors: each pixel's 64 channels (four lines) read together, as the blocks read them. With one
 * vector of 8 pixels they won alone (8 x 144 x 56 x 56 2.9 -> 2.2) but lost inside MobileNet V2
 * (2.6 -> 3.1, stride 2 1.4 -> 1.8); with 4 x 4 every 3x3 layer of EfficientNet-B0 and
 * MobileNet V3 and most of MobileNet V2's are faster in the model (verbose kernel times, 4
 * alternations in one process: the 3x3 layers' sum 14.7 -> 11.6 ms, 9.4 -> 8.1, 17.0 -> 15.0).
 * 5x5 with 2 vectors of 8 pixels and the stride-1 backward data with 4 x 4 measured slower or
 * even. The strided backward data (stride 2: each output column takes the taps of its parity,
 * the row's tiles start where 2 divides q + pw) the same way, 3x3 on 4 x 4 tiles: forward + both
 * gradients 8 x 64 x 112 x 112 7.2 -> 6.8 -> 6.0 (the blocks, 8 x 1 tiles, 4 x 4 tiles), 8 x 144
 * x 56 x 56 4.8 -> 4.4 -> 3.3; 5x5 8 x 72 x 56 x 56 3.8 -> 3.1, 8 x 672 x 14 x 14 1.3 -> 1.0. */
enum { DWT_P = 8, DWT_MAXKH = 16 };

typedef struct {
   const float *rows[DWT_MAXKH]; /* the input rows the valid kernel rows read */
   int ki[DWT_MAXKH];            /* and those kernel rows */
   int nr;
   int64_t inW, outW, C, pw;
   const float *wt, *bias, *res; /* res: the output row's residual (or NULL) */
   int act;
   float *out;                   /* the output row */
} dwt_row;

static inline __attribute__((always_inline)) void dwt_tile(const dwt_row *a, const int KW,
                                                          const int S, const int FLIP,
                                                          const int P, const int V,
                                                          const int EDGE, int64_t q0, int kmin,
                                                          int np, int64_t c0,
                                                          const __mmask16 *m) {
   const int64_t C = a->C, inW = a->inW;
   /* the tile reads columns col0 .. col0 + NT - 1. Forward: pixel k's tap j reads column
      q0 * S - pw + k * S + j. Backward data (FLIP): pixel k's tap j reads grad_out column
      (q0 + k + pw - j) / S where that divides; with (q0 + pw) = S * base (the row's tiles start
      so), column base + t for j = k - S t, t from TMIN = -((KW - 1) / S) to TMAX = (P - 1) / S */
   const int TMIN = -((KW - 1) / S), TMAX = (P - 1) / S;
   const int64_t col0 = FLIP ? (q0 + a->pw) / S + TMIN : q0 * S - a->pw;
   enum { NT_MAX = (DWT_P - 1) * 2 + 7 };
   const int NT = FLIP ? TMAX - TMIN + 1 : (P - 1) * S + KW;
   __m512 acc[DWT_P][4];
#pragma GCC unroll 4
   for (int v = 0; v < V; v++) {
      const __m512 b =
         a->bias ? _mm512_maskz_loadu_ps(m[v], a->bias + c0 + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int k = 0; k < P; k++) acc[k][v] = b;
   }
   for (int ii = 0; ii < a->nr; ii++) {
      const float *ip = a->rows[ii] + c0;
      const float *wp = a->wt + (int64_t)a->ki[ii] * KW * C + c0;
      __m512 w[7][4];
#pragma GCC unroll 7
      for (int j = 0; j < KW; j++)
#pragma GCC unroll 4
         for (int v = 0; v < V; v++) w[j][v] = _mm512_maskz_loadu_ps(m[v], wp + j * C + 16 * v);
#pragma GCC unroll 21
      for (int uu = 0; uu < NT_MAX; uu++) {
         if (uu >= NT) break;
         const int u = FLIP ? NT - 1 - uu : uu; /* column col0 + u */
         const int64_t col = col0 + u;
         int in = 1;
         const float *xp;
         if (EDGE) {
            in = col >= 0 && col < inW;
            xp = ip + (in ? col : 0) * C;
         } else {
            xp = ip + col * C;
         }
#pragma GCC unroll 4
         for (int v = 0; v < V; v++) {
            const __mmask16 cm = in ? m[v] : 0;
            const __m512 x = _mm512_maskz_loadu_ps(cm, xp + 16 * v);
#pragma GCC unroll 8
            for (int k = 0; k < P; k++) {
               /* the tap of pixel k that reads column u */
               const int j = FLIP ? k - S * (u + TMIN) : u - k * S;
               if (j < 0 || j >= KW) continue;
               acc[k][v] = EDGE ? _mm512_mask3_fmadd_ps(x, w[j][v], acc[k][v], cm)
                                : _mm512_fmadd_ps(x, w[j][v], acc[k][v]);
            }
         }
      }
   }
#pragma GCC unroll 8
   for (int k = 0; k < P; k++) {
      if (k >= np) break;
      if (k < kmin) continue;
      const int64_t off = (q0 + k) * C + c0;
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) {
         __m512 t = acc[k][v];
         if (a->res) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], a->res + off + 16 * v));
         if (a->act) t = lm_act_ps(t, a->act);
         _mm512_mask_storeu_ps(a->out + off + 16 * v, m[v], t);
      }
   }
}

/* every tile of a row: full tiles inside the input unmasked, the others masked per column; P
   pixels x V channel vectors a tile */
static inline __attribute__((always_inline)) void dwt_row_body(const dwt_row *a, const int KW,
                                                              const int S, const int FLIP,
                                                              const int P, const int V) {
   const int64_t C = a->C, outW = a->outW, inW = a->inW;
   /* backward data at stride S: tiles start where S divides q0 + pw (from -(pw % S): the
      pixels before 0 are not stored), so P is a multiple of S */
   for (int64_t q0 = FLIP ? -(a->pw % S) : 0; q0 < outW; q0 += P) {
      const int np = outW - q0 < P ? (int)(outW - q0) : P, kmin = q0 < 0 ? (int)-q0 : 0;
      const int64_t first = FLIP ? (q0 + a->pw) / S - (KW - 1) / S : q0 * S - a->pw;
      const int64_t last = FLIP ? (q0 + a->pw) / S + (P - 1) / S : (q0 + P - 1) * S - a->pw + KW - 1;
      const int inside = kmin == 0 && np == P && first >= 0 && last < inW;
      for (int64_t c0 = 0; c0 < C; c0 += 16 * V) {
         __mmask16 m[4];
         dw_masks(C - c0, m);
         if (inside)
            dwt_tile(a, KW, S, FLIP, P, V, 0, q0, 0, np, c0, m);
         else
            dwt_tile(a, KW, S, FLIP, P, V, 1, q0, kmin, np, c0, m);
      }
   }
}

#define DWT_ROW(KW, S, FLIP)                                                                     \
   static void dwt_row_##KW##_##S##_##FLIP(const dwt_row *a) { dwt_row_body(a, KW, S, FLIP, 8, 1); }
/* 3x3 forwards: 4 pixels x 4 channel vectors (29 registers), each pixel's 64 channels (four
   lines) read together, as the blocks read them */
static void dwt_row_3_1_0(const dwt_row *a) { dwt_row_body(a, 3, 1, 0, 4, 4); }
static void dwt_row_3_2_0(const dwt_row *a) { dwt_row_body(a, 3, 2, 0, 4, 4); }
static void dwt_row_3_1_0_n1(const dwt_row *a) { dwt_row_body(a, 3, 1, 0, 8, 1); }
static void dwt_row_3_1_0_n2(const dwt_row *a) { dwt_row_body(a, 3, 1, 0, 8, 2); }
DWT_ROW(5, 1, 0)
DWT_ROW(5, 2, 0)
DWT_ROW(7, 1, 0)
DWT_ROW(7, 2, 0)
DWT_ROW(3, 1, 1)
DWT_ROW(5, 1, 1)
DWT_ROW(7, 1, 1)
static void dwt_row_3_2_1(const dwt_row *a) { dwt_row_body(a, 3, 2, 1, 4, 4); }
DWT_ROW(5, 2, 1)
DWT_ROW(7, 2, 1)
#undef DWT_ROW

typedef void (*dwt_row_fn)(const dwt_row *);

/* the tiled row function for this geometry, or NULL (dw_rows' blocks then) */
static dwt_row_fn dwt_pick(const conv_geom *g, int transposed) {
   if (g->dw != 1 || g->kh > DWT_MAXKH || g->kh != g->kw) return NULL;
   if (transposed) {
      switch (g->kw * 10 + (int)g->sw) {
      case 31: return dwt_row_3_1_1;
      case 51: return dwt_row_5_1_1;
      case 71: return dwt_row_7_1_1;
      case 32: return dwt_row_3_2_1;
      case 52: return dwt_row_5_2_1;
      case 72: return dwt_row_7_2_1;
      default: return NULL;
      }
   }
   switch (g->kw * 10 + (int)g->sw) {
   case 31:
      /* up to 32 channels: 4 vectors would be partly empty (8 x 16 x 112 x 112 1.5 -> 0.7 ms
         with one vector of 8 pixels; 8 x 24 x 56 x 56 0.52 -> 0.38 and 8 x 32 x 112 x 112
         3.3 -> 3.05 with two) */
      return g->C <= 16 ? dwt_row_3_1_0_n1 : g->C <= 32 ? dwt_row_3_1_0_n2 : dwt_row_3_1_0;
   case 32: return dwt_row_3_2_0;
   case 51: return dwt_row_5_1_0;
   case 52: return dwt_row_5_2_0;
   case 71: return dwt_row_7_1_0;
   case 72: return dwt_row_7_2_0;
   default: return NULL;
   }
}

/* the input row that kernel row i of output row r reads (forward), or that it takes its
   gradient from (transposed: where sh divides), or -1 */
static inline int64_t dw_in_row(const conv_geom *g, int transposed, int64_t r, int64_t i,
                                int64_t inH) {
   int64_t hi;
   if (!transposed) {
      hi = r * g->sh - g->ph + i * g->dh;
   } else {
      const int64_t th = r + g->ph - i * g->dh;
      if (th < 0 || th % g->sh) return -1;
      hi = th / g->sh;
   }
   return hi >= 0 && hi < inH ? hi : -1;
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
   const dwt_row_fn tiled = dwt_pick(g, transposed);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / outH, r = row % outH;
      const float *img = in + n * inH * inW * C;
      if (tiled) {
         dwt_row a = {.nr = 0, .inW = inW, .outW = outW, .C = C, .pw = g->pw, .wt = wt,
                      .bias = bias, .res = res ? res + row * outW * C : NULL, .act = act,
                      .out = out + row * outW * C};
         for (int64_t i = 0; i < kh; i++) {
            const int64_t hi = dw_in_row(g, transposed, r, i, inH);
            if (hi < 0) continue;
            a.rows[a.nr] = img + hi * inW * C;
            a.ki[a.nr++] = (int)i;
         }
         tiled(&a);
         continue;
      }
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
               const int64_t hi = dw_in_row(g, transposed, r, i, inH);
               if (hi < 0) continue;
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

/* The weight gradient's tiled kernel row (3x3, 5x5, 7x7; column stride 1 or 2, dilation 1): the
 * KW sums of one kernel row and one channel vector stay in registers over the output row, DWT_P
 * grad_out pixels are loaded once a tile, and every input column the tile reads once, multiplied
 * into the sum of each tap that pairs it with one of those pixels (the blocks below load both
 * operands of every FMA). Each tap's sum takes its pixels in ascending order, as below: the same
 * bits. Columns outside the input (and a partial tile's missing pixels) are masked off. Taken
 * (dwt_bwdw_pick) for 3x3, 5x5 and 7x7 at stride 1 and 2; 3x3 at stride 2 on 4 pixels x 4
 * channel vectors (with 8 x 1 it lost inside MobileNet V2's step, 8 x 144 x 56 x 56 backward
 * 2.8 -> 3.1 ms; with 4 x 4, forward + both gradients alternated with the blocks: 8 x 64 x 112 x
 * 112 5.4 -> 4.8, 8 x 144 x 56 x 56 3.5 -> 3.0, 8 x 96 x 112 x 112 10.8 -> 8.6, 14x14 and 28x28
 * even) */
static inline __attribute__((always_inline)) void dwt_bwdw_row(const int KW, const int S,
                                                              const int P, const int V,
                                                              const float *xrow,
                                                              const float *grow, int64_t W,
                                                              int64_t Wo, int64_t C, int64_t pw,
                                                              float *ap, int64_t Cp,
                                                              const __mmask16 *m) {
   enum { NT_MAX = (DWT_P - 1) * 2 + 7 };
   const int NT = (P - 1) * S + KW;
   __m512 acc[7][4];
#pragma GCC unroll 7
   for (int j = 0; j < KW; j++)
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) acc[j][v] = _mm512_maskz_loadu_ps(m[v], ap + j * Cp + 16 * v);
   for (int64_t q0 = 0; q0 < Wo; q0 += P) {
      const int np = Wo - q0 < P ? (int)(Wo - q0) : P;
      const int64_t col0 = q0 * S - pw;
      const int inside = np == P && col0 >= 0 && col0 + NT - 1 < W;
      __m512 gv[DWT_P][4];
#pragma GCC unroll 8
      for (int k = 0; k < P; k++)
#pragma GCC unroll 4
         for (int v = 0; v < V; v++)
            gv[k][v] = _mm512_maskz_loadu_ps(k < np ? m[v] : 0,
                                             grow + (k < np ? q0 + k : 0) * C + 16 * v);
#pragma GCC unroll 21
      for (int u = 0; u < NT_MAX; u++) {
         if (u >= NT) break;
         const int64_t col = col0 + u;
         const int in = inside || (col >= 0 && col < W);
#pragma GCC unroll 4
         for (int v = 0; v < V; v++) {
            const __mmask16 cm = in ? m[v] : 0;
            const __m512 x = _mm512_maskz_loadu_ps(cm, xrow + (in ? col : 0) * C + 16 * v);
#pragma GCC unroll 8
            for (int k = 0; k < P; k++) {
               const int j = u - k * S;
               if (j < 0 || j >= KW) continue;
               if (inside)
                  acc[j][v] = _mm512_fmadd_ps(x, gv[k][v], acc[j][v]);
               else if (k < np)
                  acc[j][v] = _mm512_mask3_fmadd_ps(x, gv[k][v], acc[j][v], cm);
            }
         }
      }
   }
#pragma GCC unroll 7
   for (int j = 0; j < KW; j++)
#pragma GCC unroll 4
      for (int v = 0; v < V; v++) _mm512_mask_storeu_ps(ap + j * Cp + 16 * v, m[v], acc[j][v]);
}

/* one kernel row's sums over an output row, V channel vectors from xrow / grow / ap */
typedef void (*dwt_bwdw_fn)(const float *, const float *, int64_t, int64_t, int64_t, int64_t,
                            float *, int64_t, const __mmask16 *);

#define DWT_BWDW(KW, S, P, V)                                                                    \
   static void dwt_bwdw_##KW##_##S(const float *xrow, const float *grow, int64_t W, int64_t Wo, \
                                   int64_t C, int64_t pw, float *ap, int64_t Cp,               \
                                   const __mmask16 *m) {                                       \
      dwt_bwdw_row(KW, S, P, V, xrow, grow, W, Wo, C, pw, ap, Cp, m);                            \
   }
DWT_BWDW(3, 1, 8, 1)
DWT_BWDW(3, 2, 4, 4)
DWT_BWDW(5, 1, 8, 1)
DWT_BWDW(5, 2, 8, 1)
DWT_BWDW(7, 1, 8, 1)
DWT_BWDW(7, 2, 8, 1)
#undef DWT_BWDW


/* the tiled kernel row for this geometry (NULL: the blocks), and its channel vectors a call */
static dwt_bwdw_fn dwt_bwdw_pick(const conv_geom *g, int *vecs) {
   *vecs = 1;
   if (g->dw != 1 || g->kh != g->kw) return NULL;
   switch (g->kw * 10 + (int)g->sw) {
   case 31: return dwt_bwdw_3_1;
   case 32: *vecs = 4; return dwt_bwdw_3_2; /* DWT_BWDW(3, 2, 4, 4) */
   case 51: return dwt_bwdw_5_1;
   case 52: return dwt_bwdw_5_2;
   case 71: return dwt_bwdw_7_1;
   case 72: return dwt_bwdw_7_2;
   default: return NULL;
   }
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
   int vecs;
   const dwt_bwdw_fn tiled = dwt_bwdw_pick(g, &vecs);
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
            if (tiled) {
               for (int v = 0; v < 4; v += vecs) {
                  if (!m[v]) break;
                  for (int64_t i = 0; i < kh; i++) {
                     const int64_t hi = dw_in_row(g, 0, ho, i, H);
                     if (hi < 0) continue;
                     tiled(x + (n * H + hi) * W * C + c0 + 16 * v, grow + c0 + 16 * v, W, Wo, C,
                           g->pw, pw + i * kw * Cp + c0 + 16 * v, Cp, m + v);
                  }
               }
               continue;
            }
            for (int64_t i = 0; i < kh; i++) {
               const int64_t hi = dw_in_row(g, 0, ho, i, H);
               if (hi < 0) continue;
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
