/* conv_depthwise_f32_avx2.c -- float32 NHWC depthwise convolutions (groups == C == O) on AVX2 +
 * FMA ("depthwise_avx2"): forward (any stride, padding, dilation; bias, residual, activation),
 * grad_input (stride 1: the flipped kernel over grad_out; strided: gathered per input pixel) and the
 * weight and bias gradients,
 * for C a multiple of 8: 5x5 and larger kernels, and 3x3 ones at stride 1 (and their forward at
 * stride 2) (lm_conv_dw_avx2_usable says where each form measured faster than the portable loops).
 *
 * Why: below AVX-512 depthwise layers ran the portable loops, which keep their sums in a stack
 * array and load and store it at every tap; ConvNeXt's 7x7 layer at 8 x 96 x 56 x 56 took 16 ms
 * forward on a Zen 3 (2 threads) against PyTorch's 5.4.
 *
 * Forward: square kernels with column dilation 1 take dw2_trow's tiles (P pixels x 8 channels,
 * each input column loaded once a kernel row); the others these: a vector is 8 channels; 12
 * output pixels of a row are 12 accumulators, each tap one
 * weight vector load and 12 input vector loads and FMAs (channels are contiguous in NHWC: no
 * broadcasts). Pixels whose taps leave the row take a one-pixel loop with the same order of
 * operations (bias, then the taps in order), so a value does not depend on the loop that made it.
 * Small images (at 7x7 with a 7x7 kernel every pixel is a border one) read a copy of the input
 * with the horizontal padding written out instead (dw2_pad). 3x3 layers with more than 48
 * channels go pixel by pixel instead, all of a pixel's channels (64 at a time) before the next
 * pixel (dw2_forward_px: the portable loops' order, on 8 lanes).
 * Weight gradient: per run of output rows (the work a thread takes; the runs, and so the sums and
 * their order, do not depend on the thread count), per output row, channel block and kernel row,
 * the kw taps' sums in registers over the row's pixels (one grad_out load per kw FMAs), added to
 * the run's sums; the runs' sums are added in order at the end.
 */
#include "conv_internal.h"
#include "act_avx2.h"
#include "impl.h"

enum { DW2_PB = 12, DW2_KW = 11, DW2_MAXT = 16 };

typedef struct {
   int64_t N, inH, inW, C, outH, outW, kh, kw, sh, sw, ph, pw, dh, dw;
} dw2;

int lm_conv_dw_avx2_usable(const conv_geom *g, int pass) {
   if (!conv_is_depthwise(g) || g->C % 8 || g->O != g->C) return 0;
   if (g->ph < 0 || g->pw < 0 || g->kh * g->kw > 256) return 0;
   /* Kernels smaller than 5x5 (3x3) only at stride 1: at stride 2 the portable loops were as
      fast or faster (memory-bound; their 64-channel runs read whole lines). At stride 1, up to
      48 channels the tiles (dw2_forward), from 56 on pixel by pixel (dw2_forward_px), and the
      weight gradient below. Forward, alternated in one process (Zen 3, 2 threads, ms), tiles /
      pixel by pixel / portable: 8 x 16 x 112 x 112 1.1 / 1.6 / 3.5-3.6, 8 x 72 x 56 x 56 2.2-2.9
      / 1.2-1.3 / 2.6-3.2, 8 x 144 x 56 x 56 4.4-5.3 / 1.9-2.6 / 4.4-4.7, 8 x 672 x 14 x 14
      1.1-1.6 / 0.8-1.0 / 1.6-1.7; at stride 2 8 x 64 x 112 x 112 3.2-4.7 / 1.5-2.8 / 2.0-2.2, 8
      x 240 x 28 x 28 0.6-1.6 / 1.2 / 0.7-1.6. Weight gradient, this kernel / portable: 8 x 72 x
      56 x 56 2.3-3.8 / 3.8-4.5, 8 x 672 x 14 x 14 1.4-1.7 / 2.1-2.3; at stride 2 8 x 96 x 112 x
      112 7.8-8.7 / 4.4-6.1. From 5x5 on it wins: 5x5 at 8 x 240 x 28 x 28 forward and gradients
      11-12 against 11.5-17 ms; 7x7 at 8 x 96 x 56 x 56 18 against 36 ms, forward 4.5-6.1
      against 11. Session 29 (Zen 4 forced to AVX2, the same 256-bit FMA rate as a Zen 3, 2
      threads, alternated in one process): the strided 3x3 forward, pixel by pixel (more than
      48 channels) or on dw2_trow's tiles, against the portable loops: 8 x 64 x 112 x 112
      1.0-1.5 / 1.4-2.5, 8 x 96 x 112 x 112 1.6-2.5 / 2.3-3.0, 8 x 576 x 14 x 14 0.13-0.17 /
      0.29-0.57, 8 x 32 x 112 x 112 (tiles) 0.65-0.78 / 0.94-0.99: taken (forward only).
      Session 31 (the same machine and method, min of 6 to 8 calls): the strided backward data
      gathered (dw2_bwdd_strided) against the portable loops, 3x3: 8 x 96 x 112 x 112 4.05 /
      3.59, 8 x 144 x 56 x 56 1.85 / 0.82, 8 x 240 x 28 x 28 0.74 / 0.42, 8 x 576 x 14 x 14
      0.49 / 0.27; 5x5: 8 x 144 x 56 x 56 3.09 / 1.22, 8 x 672 x 14 x 14 0.89 / 0.49: taken at
      every kernel size. The weight gradient by rows (below) at stride 2, 3x3: 8 x 96 x 112 x
      112 2.02 against the portable 1.78, 8 x 144 x 56 x 56 0.51 / 0.58: left to the portable
      loops. */
   if (g->kh * g->kw < 25 && (g->sh != 1 || g->sw != 1) &&
       !(pass == 0 && g->kh == 3 && g->kw == 3 && g->dw == 1) && pass != 1)
      return 0;
   if (g->N * g->Ho * g->Wo <= 0 || g->H * g->W <= 0) return 0;
   if (pass == 1 && (g->sh != 1 || g->sw != 1))
      return g->kh <= DW2_MAXT && g->kw <= DW2_MAXT; /* gathered (dw2_bwdd_strided) */
   if (pass == 1) {
      if (g->dh * (g->kh - 1) - g->ph < 0 || g->dw * (g->kw - 1) - g->pw < 0) return 0;
   }
   if (pass == 2 && g->kw > DW2_KW) return 0;
   return 1;
}

/* the pixel-major forward (dw2_forward_px) for kernels smaller than 5x5 with more than 48
   channels (lm_conv_dw_avx2_usable) */
static int dw2_use_px(const dw2 *p) { return p->kh * p->kw < 25 && p->C > 48; }

/* columns [*qa, *qb) of an output row have every tap inside the input row */
static void dw2_cols(const dw2 *p, int64_t *qa, int64_t *qb) {
   int64_t a = (p->pw + p->sw - 1) / p->sw, b = p->outW;
   while (b > a && (b - 1) * p->sw - p->pw + (p->kw - 1) * p->dw >= p->inW) b--;
   if (a > p->outW) a = p->outW;
   if (b < a) b = a;
   *qa = a, *qb = b;
}

/* Stride 1, where the columns whose taps leave the row (*qa, *qb: dw2_cols) are a quarter of it
   or more (small images: at 7x7 with a 7x7 kernel, every one): a copy of the input rows with
   their horizontal padding written out (returned, *bytes its size; *p and *in then describe it,
   through *pp, and every column takes the tiles). Else NULL with *bytes 0; NULL with *bytes set:
   out of memory. The border pixels' one-pixel loop costs more than the copy there (Zen 3, 2
   threads, the two alternated in one process, forward / forward and both gradients, ms): 8 x 768
   x 7 x 7 with 7x7 taps 1.5-2.2 / 4.4-6.0 -> 1.2-1.3 / 3.7-4.0, 8 x 384 x 14 x 14 2.1-2.3 /
   6.7-6.9 -> 1.6-1.9 / 5.9-6.4, 8 x 960 x 7 x 7 with 5x5 1.0-1.8 / 3.0-4.6 -> 0.9-1.1 /
   2.8-3.0. At stride 2 it lost (8 x 672 x 14 x 14, 5x5, forward: 1.2 -> 1.5). */
static float *dw2_pad(const dw2 **p, const float **in, dw2 *pp, int64_t *qa, int64_t *qb,
                      int nthr, size_t *bytes) {
   const dw2 *o = *p;
   *bytes = 0;
   if (o->sw != 1 || (*qa + o->outW - *qb) * 4 < o->outW) return NULL;
   const int64_t last = (o->outW - 1) * o->sw - o->pw + (o->kw - 1) * o->dw;
   const int64_t pr = last >= o->inW ? last - o->inW + 1 : 0, Wp = o->pw + o->inW + pr;
   const int64_t inrows = o->N * o->inH, C = o->C;
   *bytes = (size_t)(inrows * Wp * C) * sizeof(float);
   float *xp = lm_alloc(*bytes);
   if (!xp) return NULL;
   const float *src = *in;
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t r = 0; r < inrows; r++) {
      float *d = xp + r * Wp * C;
      memset(d, 0, (size_t)(o->pw * C) * sizeof(float));
      memcpy(d + o->pw * C, src + r * o->inW * C, (size_t)(o->inW * C) * sizeof(float));
      memset(d + (o->pw + o->inW) * C, 0, (size_t)(pr * C) * sizeof(float));
   }
   *pp = *o;
   pp->inW = Wp;
   pp->pw = 0;
   *p = pp;
   *in = xp;
   *qa = 0, *qb = o->outW;
   return xp;
}

/* the output pixel (n, ho, q) of channels [c0, c0 + 8), taps checked */
static __m256 dw2_pixel(const dw2 *p, const float *in, const float *wb, __m256 bv, int64_t n,
                        int64_t ho, int64_t q) {
   __m256 a = bv;
   for (int64_t i = 0; i < p->kh; i++) {
      const int64_t hi = ho * p->sh - p->ph + i * p->dh;
      if (hi < 0 || hi >= p->inH) continue;
      for (int64_t j = 0; j < p->kw; j++) {
         const int64_t wi = q * p->sw - p->pw + j * p->dw;
         if (wi < 0 || wi >= p->inW) continue;
         a = _mm256_fmadd_ps(_mm256_loadu_ps(in + ((n * p->inH + hi) * p->inW + wi) * p->C),
                             _mm256_loadu_ps(wb + (i * p->kw + j) * 8), a);
      }
   }
   return a;
}

/* PB pixels of output row (n, ho) from column q (every tap inside the row), every block */
static inline __attribute__((always_inline)) void
dw2_tiles(const dw2 *p, const float *in, const float *wp, const float *bias, const float *res,
          int act, float *out, int64_t n, int64_t ho, int64_t q, const int PB) {
   const int64_t taps = p->kh * p->kw, nblk = p->C / 8, xs = p->sw * p->C;
   const int64_t row = n * p->outH + ho;
   for (int64_t b = 0; b < nblk; b++) {
      const float *wb = wp + b * taps * 8, *inb = in + 8 * b;
      const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * b) : _mm256_setzero_ps();
      __m256 acc[DW2_PB];
#pragma GCC unroll 12
      for (int k = 0; k < PB; k++) acc[k] = bv;
      for (int64_t i = 0; i < p->kh; i++) {
         const int64_t hi = ho * p->sh - p->ph + i * p->dh;
         if (hi < 0 || hi >= p->inH) continue;
         const float *xr = inb + ((n * p->inH + hi) * p->inW + q * p->sw - p->pw) * p->C;
         for (int64_t j = 0; j < p->kw; j++) {
            const __m256 wv = _mm256_loadu_ps(wb + (i * p->kw + j) * 8);
            const float *xt = xr + j * p->dw * p->C;
#pragma GCC unroll 12
            for (int k = 0; k < PB; k++)
               acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(xt + k * xs), wv, acc[k]);
         }
      }
      for (int k = 0; k < PB; k++) {
         const int64_t o = (row * p->outW + q + k) * p->C + 8 * b;
         lm_act_store8(acc[k], out + o, res ? res + o : NULL, act);
      }
   }
}

/* NV vectors (8 NV channels from c0) of output pixel (n, ho, q), taps [i0, i1) x [j0, j1) (all
   inside the input), from wt[t][C]: bias, then the taps in order */
static inline __attribute__((always_inline)) void
dw2_px(const dw2 *p, const float *in, const float *wt, const float *bias, const float *res,
       int act, float *o, int64_t c0, int64_t n, int64_t ho, int64_t q, int64_t i0, int64_t i1,
       int64_t j0, int64_t j1, const int NV) {
   __m256 a[8];
#pragma GCC unroll 8
   for (int v = 0; v < NV; v++)
      a[v] = bias ? _mm256_loadu_ps(bias + c0 + 8 * v) : _mm256_setzero_ps();
   for (int64_t i = i0; i < i1; i++) {
      const int64_t hi = ho * p->sh - p->ph + i * p->dh;
      const float *xr = in + ((n * p->inH + hi) * p->inW + q * p->sw - p->pw) * p->C + c0;
      const float *wr = wt + i * p->kw * p->C + c0;
      for (int64_t j = j0; j < j1; j++) {
         const float *xt = xr + j * p->dw * p->C, *wv = wr + j * p->C;
#pragma GCC unroll 8
         for (int v = 0; v < NV; v++)
            a[v] = _mm256_fmadd_ps(_mm256_loadu_ps(xt + 8 * v), _mm256_loadu_ps(wv + 8 * v), a[v]);
      }
   }
#pragma GCC unroll 8
   for (int v = 0; v < NV; v++)
      lm_act_store8(a[v], o + c0 + 8 * v, res ? res + c0 + 8 * v : NULL, act);
}

/* The forward pixel by pixel, every channel of a pixel before the next (64 at a time, 8
   vectors in registers), the taps' range computed once a pixel: for 3x3 kernels with many
   channels or a stride, where the tiles above re-read 32-byte pieces of the input from 12
   pixels at a time (the portable loops' order, on 8 lanes with FMA) */
static lm_status dw2_forward_px(const dw2 *p, const float *in, const float *w, int flip,
                                const float *bias, const float *res, int act, float *out) {
   const int64_t taps = p->kh * p->kw, C = p->C;
   const size_t wbytes = (size_t)(taps * C) * sizeof(float);
   float *wt = lm_alloc(wbytes);
   if (!wt) return LM_ERR_OOM;
   for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < taps; t++) wt[t * C + c] = w[c * taps + (flip ? taps - 1 - t : t)];
   const int64_t rows = p->N * p->outH;
   const int nthr = conv_threads((double)rows * (double)p->outW * (double)C * (double)taps);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / p->outH, ho = row % p->outH;
      int64_t i0, i1;
      lm_window_taps(p->inH, p->kh, p->sh, p->ph, p->dh, ho, &i0, &i1);
      for (int64_t q = 0; q < p->outW; q++) {
         int64_t j0, j1;
         lm_window_taps(p->inW, p->kw, p->sw, p->pw, p->dw, q, &j0, &j1);
         const int64_t o = (row * p->outW + q) * C;
         float *op = out + o;
         const float *rp = res ? res + o : NULL;
         int64_t c0 = 0;
         for (; c0 + 64 <= C; c0 += 64)
            dw2_px(p, in, wt, bias, rp, act, op, c0, n, ho, q, i0, i1, j0, j1, 8);
         if (C - c0 >= 32) {
            dw2_px(p, in, wt, bias, rp, act, op, c0, n, ho, q, i0, i1, j0, j1, 4);
            c0 += 32;
         }
         if (C - c0 >= 16) {
            dw2_px(p, in, wt, bias, rp, act, op, c0, n, ho, q, i0, i1, j0, j1, 2);
            c0 += 16;
         }
         if (C - c0 >= 8) dw2_px(p, in, wt, bias, rp, act, op, c0, n, ho, q, i0, i1, j0, j1, 1);
      }
   }
   lm_free(wt, wbytes);
   return LM_OK;
}

/* One output row on tiles of P pixels x one 8-channel block (KW x KW kernels, column dilation
 * 1): the tile's sums and a kernel row's KW weight vectors in registers, each input column the
 * tile reads loaded once per kernel row and multiplied into every pixel whose tap reads it:
 * (P - 1) * S + KW loads for P * KW FMAs a kernel row, where dw2_tiles loads an input vector for
 * each FMA (7x7: 49 loads a pixel against 7 * (6 + 6) / 6 = 14). Columns outside the input are
 * skipped (a tile at the border checks each column; the check is the same for every lane), so
 * each pixel adds bias, then its taps in dw2_tiles' order: the same bits. P = 8, P = 4 for 7x7
 * (4 sums, 7 weights and the input vector: gcc spilled 6 and 8 pixels' sums more). Against
 * dw2_tiles (and dw2_pad / dw2_pixel at the borders), Zen 4 forced to AVX2, 2 threads, in one
 * process, forward / forward + both gradients, ms: 7x7 8 x 96 x 56 x 56 3.6-3.9 / 11.9-12.5 ->
 * 2.6-3.2 / 9.7-10.7, 8 x 768 x 7 x 7 0.74-1.07 / 2.0-2.7 -> 0.51-1.12 / 1.6-2.4, 5x5 8 x 120 x
 * 28 x 28 0.82-0.85 / 2.4-2.7 -> 0.67-0.84 / 2.1-2.3, 3x3 8 x 32 x 112 x 112 3.4-4.8 / 10.2-13.8
 * -> 2.3-4.0 / 9.4-12.2. */
static inline __attribute__((always_inline)) void dw2_ttile(const dw2 *p, const float *xb,
                                                           const float *wb, __m256 bv,
                                                           const float *res, int act, float *ob,
                                                           int64_t n, int64_t ho, int64_t q0,
                                                           int np, const int KW, const int S,
                                                           const int P, const int EDGE) {
   const int64_t C = p->C, inW = p->inW, col0 = q0 * S - p->pw;
   enum { NT_MAX = (8 - 1) * 2 + 7 };
   const int NT = (P - 1) * S + KW;
   __m256 acc[8];
#pragma GCC unroll 8
   for (int k = 0; k < P; k++) acc[k] = bv;
   for (int64_t i = 0; i < p->kh; i++) {
      const int64_t hi = ho * p->sh - p->ph + i * p->dh;
      if (hi < 0 || hi >= p->inH) continue;
      const float *xr = xb + (n * p->inH + hi) * inW * C;
      __m256 w[7];
#pragma GCC unroll 7
      for (int j = 0; j < KW; j++) w[j] = _mm256_loadu_ps(wb + (i * KW + j) * 8);
#pragma GCC unroll 21
      for (int u = 0; u < NT_MAX; u++) {
         if (u >= NT) break;
         const int64_t col = col0 + u;
         if (EDGE && (col < 0 || col >= inW)) continue;
         const __m256 x = _mm256_loadu_ps(xr + col * C);
#pragma GCC unroll 8
         for (int k = 0; k < P; k++) {
            const int j = u - k * S;
            if (j < 0 || j >= KW) continue;
            if (EDGE && k >= np) continue;
            acc[k] = _mm256_fmadd_ps(x, w[j], acc[k]);
         }
      }
   }
#pragma GCC unroll 8
   for (int k = 0; k < P; k++) {
      if (k >= np) break;
      const int64_t o = (q0 + k) * C;
      lm_act_store8(acc[k], ob + o, res ? res + o : NULL, act);
   }
}

static inline __attribute__((always_inline)) void dw2_trow(const dw2 *p, const float *in,
                                                          const float *wp, const float *bias,
                                                          const float *res, int act, float *out,
                                                          int64_t n, int64_t ho, const int KW,
                                                          const int S, const int P) {
   const int64_t taps = p->kh * KW, nblk = p->C / 8, C = p->C;
   const int64_t row = n * p->outH + ho;
   const int NT = (P - 1) * S + KW;
   float *orow = out + row * p->outW * C;
   const float *rrow = res ? res + row * p->outW * C : NULL;
   for (int64_t q0 = 0; q0 < p->outW; q0 += P) {
      const int np = p->outW - q0 < P ? (int)(p->outW - q0) : P;
      const int64_t col0 = q0 * S - p->pw;
      const int inside = np == P && col0 >= 0 && col0 + NT - 1 < p->inW;
      for (int64_t b = 0; b < nblk; b++) {
         const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * b) : _mm256_setzero_ps();
         if (inside)
            dw2_ttile(p, in + 8 * b, wp + b * taps * 8, bv, rrow ? rrow + 8 * b : NULL, act,
                      orow + 8 * b, n, ho, q0, np, KW, S, P, 0);
         else
            dw2_ttile(p, in + 8 * b, wp + b * taps * 8, bv, rrow ? rrow + 8 * b : NULL, act,
                      orow + 8 * b, n, ho, q0, np, KW, S, P, 1);
      }
   }
}

#define DW2_TROW(KW, S, P)                                                                       \
   static void dw2_trow_##KW##_##S(const dw2 *p, const float *in, const float *wp,             \
                                   const float *bias, const float *res, int act, float *out,   \
                                   int64_t n, int64_t ho) {                                    \
      dw2_trow(p, in, wp, bias, res, act, out, n, ho, KW, S, P);                               \
   }
DW2_TROW(3, 1, 8)
DW2_TROW(3, 2, 8)
DW2_TROW(5, 1, 8)
DW2_TROW(5, 2, 8)
DW2_TROW(7, 1, 4)
DW2_TROW(7, 2, 4)
#undef DW2_TROW

typedef void (*dw2_trow_fn)(const dw2 *, const float *, const float *, const float *,
                            const float *, int, float *, int64_t, int64_t);

static dw2_trow_fn dw2_trow_pick(const dw2 *p) {
   if (p->dw != 1 || p->kh != p->kw) return NULL;
   switch (p->kw * 10 + (int)p->sw) {
   case 31: return dw2_trow_3_1;
   case 32: return dw2_trow_3_2;
   case 51: return dw2_trow_5_1;
   case 52: return dw2_trow_5_2;
   case 71: return dw2_trow_7_1;
   case 72: return dw2_trow_7_2;
   default: return NULL;
   }
}

/* wp[b][t][8] = w[8b + l][tmap ? tmap[t] : t] */
static lm_status dw2_forward(const dw2 *p, const float *in, const float *w, int flip,
                             const float *bias, const float *res, int act, float *out) {
   const int64_t taps = p->kh * p->kw, nblk = p->C / 8;
   const size_t wbytes = (size_t)(nblk * taps * 8) * sizeof(float);
   float *wp = lm_alloc(wbytes);
   if (!wp) return LM_ERR_OOM;
   for (int64_t c = 0; c < p->C; c++)
      for (int64_t t = 0; t < taps; t++)
         wp[((c / 8) * taps + t) * 8 + c % 8] = w[c * taps + (flip ? taps - 1 - t : t)];
   int64_t qa, qb;
   dw2_cols(p, &qa, &qb);
   const int64_t rows = p->N * p->outH;
   const int nthr = conv_threads((double)rows * (double)p->outW * (double)p->C * (double)taps);
   dw2 pp;
   size_t xbytes = 0;
   /* dw2_trow's border tiles skip the columns outside the input themselves: the padded copy
      only for the other forms (without it, Zen 4 at AVX2, forward ms: 8 x 768 x 7 x 7 7x7
      0.61 -> 0.41, 8 x 384 x 14 x 14 0.86 -> 0.69, 8 x 672 x 14 x 14 5x5 1.22 -> 0.81) */
   const dw2_trow_fn trow = dw2_trow_pick(p);
   float *xp = trow ? NULL : dw2_pad(&p, &in, &pp, &qa, &qb, nthr, &xbytes);
   if (xbytes && !xp) {
      lm_free(wp, wbytes);
      return LM_ERR_OOM;
   }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / p->outH, ho = row % p->outH;
      if (trow) {
         trow(p, in, wp, bias, res, act, out, n, ho);
         continue;
      }
      float *orow = out + row * p->outW * p->C;
      const float *rrow = res ? res + row * p->outW * p->C : NULL;
      /* pixels outer, channel blocks inner: a tile's input pixels (every block of them) stay
         in L1 while the blocks take their turns (blocks outer re-read each input row from L2 once
         a block, 32 bytes a line: slower than the portable loops on 3x3 layers) */
      int64_t q = 0;
      for (; q < qa; q++)
         for (int64_t b = 0; b < nblk; b++)
            lm_act_store8(dw2_pixel(p, in + 8 * b, wp + b * taps * 8,
                                bias ? _mm256_loadu_ps(bias + 8 * b) : _mm256_setzero_ps(), n,
                                ho, q),
                      orow + q * p->C + 8 * b, rrow ? rrow + q * p->C + 8 * b : NULL, act);
      for (; q + DW2_PB <= qb; q += DW2_PB)
         dw2_tiles(p, in, wp, bias, res, act, out, n, ho, q, DW2_PB);
      for (; q + 4 <= qb; q += 4) dw2_tiles(p, in, wp, bias, res, act, out, n, ho, q, 4);
      for (; q < qb; q++) dw2_tiles(p, in, wp, bias, res, act, out, n, ho, q, 1);
      for (; q < p->outW; q++)
         for (int64_t b = 0; b < nblk; b++)
            lm_act_store8(dw2_pixel(p, in + 8 * b, wp + b * taps * 8,
                                bias ? _mm256_loadu_ps(bias + 8 * b) : _mm256_setzero_ps(), n,
                                ho, q),
                      orow + q * p->C + 8 * b, rrow ? rrow + q * p->C + 8 * b : NULL, act);
   }
   if (xp) lm_free(xp, xbytes);
   lm_free(wp, wbytes);
   return LM_OK;
}

lm_status lm_conv_dw_fwd_nhwc_avx2(const conv_geom *g, const float *x, const float *w,
                                   const float *bias, const float *res, int act, float *out) {
   const dw2 p = {g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->kh, g->kw,
                  g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
   if (dw2_use_px(&p)) return dw2_forward_px(&p, x, w, 0, bias, res, act, out);
   return dw2_forward(&p, x, w, 0, bias, res, act, out);
}

/* Strided backward data, gathered: input pixel (n, hi, wi) takes, for every channel, the sum over
   the taps (i, j) that read it, kernel rows then columns ascending, of grad_out(n, ho, wo) *
   w(i, j), where hi = ho * sh - ph + i * dh (and so for the columns): the rows' (i, ho) pairs
   once a row, the columns' (j, wo) pairs from a table made once; each pixel's channels 64 at a
   time in registers, written once (no scatter, no zeroing pass). Before, stride 2 ran the
   portable loops. */
static inline __attribute__((always_inline)) void
dw2_gather_px(const float *gin, const float *wt, int64_t C, int64_t c0, int nr,
              const int64_t *roff, const int64_t *rtap, int nc, const int64_t *coff,
              const int64_t *ctap, float *o, const int NV) {
   __m256 a[8];
#pragma GCC unroll 8
   for (int v = 0; v < NV; v++) a[v] = _mm256_setzero_ps();
   for (int r = 0; r < nr; r++)
      for (int k = 0; k < nc; k++) {
         const float *gp = gin + (roff[r] + coff[k]) * C + c0;
         const float *wp = wt + (rtap[r] + ctap[k]) * C + c0;
#pragma GCC unroll 8
         for (int v = 0; v < NV; v++)
            a[v] = _mm256_fmadd_ps(_mm256_loadu_ps(gp + 8 * v), _mm256_loadu_ps(wp + 8 * v), a[v]);
      }
#pragma GCC unroll 8
   for (int v = 0; v < NV; v++) _mm256_storeu_ps(o + c0 + 8 * v, a[v]);
}

/* the (tap, output position) pairs that read input position in of a dim: in = o * s - pad +
   t * d with 0 <= o < outn, t ascending; returns their count */
static int dw2_taps_of(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d, int64_t outn,
                       int64_t *taps, int64_t *outs) {
   int n = 0;
   for (int64_t t = 0; t < k; t++) {
      const int64_t u = in + pad - t * d;
      if (u < 0 || u % s != 0 || u / s >= outn) continue;
      taps[n] = t;
      outs[n] = u / s;
      n++;
   }
   return n;
}

static lm_status dw2_bwdd_strided(const conv_geom *g, const float *gout, const float *w,
                                  float *gx) {
   const int64_t C = g->C, kh = g->kh, kw = g->kw, taps = kh * kw;
   if (kh > DW2_MAXT || kw > DW2_MAXT) return LM_ERR_INTERNAL;
   const size_t wbytes = (size_t)(taps * C) * sizeof(float);
   const size_t cbytes = (size_t)(g->W * (2 * kw + 1)) * sizeof(int64_t);
   float *wt = lm_alloc(wbytes);
   int64_t *ct = lm_alloc(cbytes);
   if (!wt || !ct) {
      if (wt) lm_free(wt, wbytes);
      if (ct) lm_free(ct, cbytes);
      return LM_ERR_OOM;
   }
   for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < taps; t++) wt[t * C + c] = w[c * taps + t];
   /* per input column: its pair count, then kw grad_out column offsets, then kw tap columns */
   for (int64_t wi = 0; wi < g->W; wi++) {
      int64_t *e = ct + wi * (2 * kw + 1);
      e[0] = dw2_taps_of(wi, kw, g->sw, g->pw, g->dw, g->Wo, e + 1 + kw, e + 1);
   }
   const int64_t rows = g->N * g->H;
   const int nthr = conv_threads((double)rows * (double)g->W * (double)C * (double)taps / 4.0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / g->H, hi = row % g->H;
      int64_t rtap[DW2_MAXT], rout[DW2_MAXT], roff[DW2_MAXT];
      const int nr = dw2_taps_of(hi, kh, g->sh, g->ph, g->dh, g->Ho, rtap, rout);
      for (int r = 0; r < nr; r++) {
         roff[r] = (n * g->Ho + rout[r]) * g->Wo;
         rtap[r] *= kw;
      }
      for (int64_t wi = 0; wi < g->W; wi++) {
         const int64_t *e = ct + wi * (2 * kw + 1);
         const int nc = nr ? (int)e[0] : 0;
         const int64_t *coff = e + 1, *ctap = e + 1 + kw;
         float *o = gx + (row * g->W + wi) * C;
         if (nc == 0) {
            memset(o, 0, (size_t)C * sizeof(float));
            continue;
         }
         int64_t c0 = 0;
         for (; c0 + 64 <= C; c0 += 64)
            dw2_gather_px(gout, wt, C, c0, nr, roff, rtap, nc, coff, ctap, o, 8);
         if (C - c0 >= 32) {
            dw2_gather_px(gout, wt, C, c0, nr, roff, rtap, nc, coff, ctap, o, 4);
            c0 += 32;
         }
         if (C - c0 >= 16) {
            dw2_gather_px(gout, wt, C, c0, nr, roff, rtap, nc, coff, ctap, o, 2);
            c0 += 16;
         }
         if (C - c0 >= 8) dw2_gather_px(gout, wt, C, c0, nr, roff, rtap, nc, coff, ctap, o, 1);
      }
   }
   lm_free(ct, cbytes);
   lm_free(wt, wbytes);
   return LM_OK;
}

/* stride 1: the flipped kernel over grad_out, padding d * (k - 1) - p; strided: gathered
   (dw2_bwdd_strided) */
lm_status lm_conv_dw_bwdd_nhwc_avx2(const conv_geom *g, const float *gout, const float *w,
                                    float *gx) {
   if (g->sh != 1 || g->sw != 1) return dw2_bwdd_strided(g, gout, w, gx);
   const dw2 p = {g->N, g->Ho, g->Wo, g->C, g->H, g->W, g->kh, g->kw, 1, 1,
                  g->dh * (g->kh - 1) - g->ph, g->dw * (g->kw - 1) - g->pw, g->dh, g->dw};
   if (dw2_use_px(&p)) return dw2_forward_px(&p, gout, w, 1, NULL, NULL, 0, gx);
   return dw2_forward(&p, gout, w, 1, NULL, NULL, 0, gx);
}

/* one output row's contribution to a kernel row's KW tap sums s[j][8] of one channel block: the
   row's pixels in order, the border ones (outside [qa, qb)) checking each tap. KW a constant
   (the callers' switch): with the tap count a variable gcc kept the sums in memory (an FMA, a
   load and a store each) */
static inline __attribute__((always_inline)) void dw2_wrow(const dw2 *p, const float *xr,
                                                           const float *gr, int64_t qa,
                                                           int64_t qb, float *s, const int KW) {
   __m256 a[DW2_KW];
#pragma GCC unroll 11
   for (int j = 0; j < DW2_KW; j++) a[j] = _mm256_setzero_ps();
   for (int64_t q = 0; q < p->outW; q++) {
      const __m256 gv = _mm256_loadu_ps(gr + q * p->C);
      const int64_t w0 = q * p->sw - p->pw;
      if (q >= qa && q < qb) {
         const float *xt = xr + w0 * p->C;
#pragma GCC unroll 11
         for (int j = 0; j < KW; j++)
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(xt + j * p->dw * p->C), gv, a[j]);
      } else {
#pragma GCC unroll 11
         for (int j = 0; j < KW; j++) {
            const int64_t wi = w0 + j * p->dw;
            if (wi < 0 || wi >= p->inW) continue;
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + wi * p->C), gv, a[j]);
         }
      }
   }
#pragma GCC unroll 11
   for (int j = 0; j < KW; j++)
      _mm256_storeu_ps(s + j * 8, _mm256_add_ps(_mm256_loadu_ps(s + j * 8), a[j]));
}

/* The weight and bias gradients by output rows: a work unit is a fixed run of DW2_WROWS output
   rows (the runs do not depend on the thread count), which sums every channel block's taps over
   its rows into its own partial sums; the runs' sums are added in order at the end. Within a row
   every block takes its kernel rows while the row's lines are in L1 (a 64-byte line holds two
   blocks), where the channel-block units above streamed the whole input and grad_out once per
   block of 8 channels, 32 bytes of each pixel's line each time. Zen 4 forced to AVX2, 2 threads,
   the two alternated in one process, min of 8 calls, ms (per block / by rows), 3x3: 8 x 32 x 112
   x 112 3.62 / 1.86, 8 x 144 x 56 x 56 3.93 / 2.67, 8 x 192 x 28 x 28 1.07 / 0.56, 8 x 384 x 14
   x 14 0.47 / 0.31, 8 x 960 x 7 x 7 0.53 / 0.35; 5x5: 8 x 144 x 56 x 56 stride 2 1.89 / 1.34,
   8 x 240 x 28 x 28 1.62 / 1.26, 8 x 672 x 14 x 14 1.67 / 1.37; 7x7 8 x 96 x 56 x 56 4.19 /
   3.24. */
enum { DW2_WROWS = 4 };
/* gw: [C][kh][kw], gb: C or NULL (either may be NULL) */
lm_status lm_conv_dw_bwdw_nhwc_avx2(const conv_geom *g, const float *x, const float *gout,
                                    float *gw, float *gb) {
   const dw2 P = {g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->kh, g->kw,
                  g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
   const dw2 *p = &P;
   const int64_t taps = p->kh * p->kw, nblk = p->C / 8, kw = p->kw;
   if (kw > DW2_KW) return LM_ERR_INTERNAL;
   int64_t qa, qb;
   dw2_cols(p, &qa, &qb);
   const int64_t rows = p->N * p->outH;
   const int nthr = conv_threads((double)rows * (double)p->outW * (double)p->C * (double)taps);
   dw2 pp;
   size_t xbytes = 0;
   float *xp = gw ? dw2_pad(&p, &x, &pp, &qa, &qb, nthr, &xbytes) : NULL;
   if (xbytes && !xp) return LM_ERR_OOM;
   const int64_t per = nblk * (taps + 1) * 8, nrun = (rows + DW2_WROWS - 1) / DW2_WROWS;
   const size_t abytes = (size_t)(nrun * per) * sizeof(float);
   float *sums = lm_alloc(abytes);
   if (!sums) {
      if (xp) lm_free(xp, xbytes);
      return LM_ERR_OOM;
   }
   memset(sums, 0, abytes);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t u = 0; u < nrun; u++) {
      float *su = sums + u * per;
      const int64_t r1 = (u + 1) * DW2_WROWS < rows ? (u + 1) * DW2_WROWS : rows;
      for (int64_t row = u * DW2_WROWS; row < r1; row++) {
         const int64_t n = row / p->outH, ho = row % p->outH;
         const float *grow = gout + row * p->outW * p->C;
         for (int64_t b = 0; b < nblk; b++) {
            float *sb = su + b * (taps + 1) * 8; /* taps x 8, then the bias sums */
            const float *gr = grow + 8 * b;
            if (gb) {
               __m256 bs = _mm256_setzero_ps();
               for (int64_t q = 0; q < p->outW; q++)
                  bs = _mm256_add_ps(bs, _mm256_loadu_ps(gr + q * p->C));
               _mm256_storeu_ps(sb + taps * 8, _mm256_add_ps(_mm256_loadu_ps(sb + taps * 8), bs));
            }
            if (!gw) continue;
            for (int64_t i = 0; i < p->kh; i++) {
               const int64_t hi = ho * p->sh - p->ph + i * p->dh;
               if (hi < 0 || hi >= p->inH) continue;
               const float *xr = x + 8 * b + (n * p->inH + hi) * p->inW * p->C;
               float *si = sb + i * kw * 8;
               switch (kw) { /* a constant tap count keeps the sums in registers */
               case 3: dw2_wrow(p, xr, gr, qa, qb, si, 3); break;
               case 5: dw2_wrow(p, xr, gr, qa, qb, si, 5); break;
               case 7: dw2_wrow(p, xr, gr, qa, qb, si, 7); break;
               default: dw2_wrow(p, xr, gr, qa, qb, si, (int)kw); break;
               }
            }
         }
      }
   }
   /* the runs' partial sums, in order */
   for (int64_t u = 1; u < nrun; u++) {
      const float *su = sums + u * per;
      for (int64_t k = 0; k < per; k += 8)
         _mm256_storeu_ps(sums + k, _mm256_add_ps(_mm256_loadu_ps(sums + k), _mm256_loadu_ps(su + k)));
   }
   for (int64_t c = 0; c < p->C; c++) {
      const float *sb = sums + (c / 8) * (taps + 1) * 8;
      if (gw)
         for (int64_t t = 0; t < taps; t++) gw[c * taps + t] = sb[t * 8 + c % 8];
      if (gb) gb[c] = sb[taps * 8 + c % 8];
   }
   lm_free(sums, abytes);
   if (xp) lm_free(xp, xbytes);
   return LM_OK;
}
