/* conv_direct_rb_f32_avx512.c -- register-blocked direct convolution for small channel counts
 * (float32, NHWC, AVX-512, groups == 1): forward, backward data, and the single-channel weight
 * gradient. The register-blocked step also serves the Winograd GEMMs (lm_conv_rb_gemm).
 *
 * The convolutions of small networks (Cin or Cout of 1..64: the 16/32/64-channel ResNets on
 * 28x28 images) are too narrow for GEMM-shaped kernels: K = 9*Cin is short and N = Cout is one to
 * four vectors. Here a work unit (one image, a band of output rows) first copies ("stages") the
 * input rows it reads into a small buffer, with the padding as zeros, the channels padded to CP
 * (1, 8, 16, 32 or 64) and, for a column stride s > 1, the columns split into s phases
 * (column m*s + p of the padded row goes to phase p, position m). Then for every tap and every
 * output pixel of a row the input pixels are consecutive, CP floats apart, and the whole reduction
 * over taps x channels runs in registers:
 *    acc[k][v] += x[tap_offset + k*CP + c] (broadcast) * w[tap][c][16v .. 16v+15]
 * for PB pixels k and NV vectors v of output channels (PB*NV <= 24 accumulators), with CP a
 * compile-time constant so every load is base + immediate. The accumulators are written once,
 * with the epilogue (bias, residual, activation). Weights are packed once per call into
 * wp[ob][tap][CP][OB] (OB = 16..64 output channels per block, zero padded).
 *
 * Backward data: stride 1 is the same kernel run on grad_output with the flipped kernel (input
 * and output channels swapped, padding d*(k-1)-p). Stride s > 1 splits grad_input into sh x sw
 * phases; in one phase every pixel uses the same taps (those with (a + p - i*d) divisible by s),
 * which read grad_output at fixed offsets: again a dense register-blocked reduction, written
 * with a pixel stride of sw (no scatter, no atomics, no zero-inserted work).
 *
 * Backward weight for a single input channel (a grey-image stem): per output pixel one vector of
 * grad_output times one broadcast input value per tap, into one accumulator per tap.
 *
 * Forward and backward data do not depend on the thread count (every output element is reduced
 * by one thread in a fixed order); the weight gradient sums per-thread partials over a fixed
 * split, in thread order.
 */
#include "conv_internal.h"
#include "avx512_util.h"
#include "act_avx512.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { RB_MAXPB = 14, RB_MAXTAPS = 128, RB_BAND_BYTES = 96 * 1024 };

/* ---------------------------------------------------------------------------------------------
 * micro-kernel: PB pixels (pixel k at xb + k*CP) x NV vectors of output channels, reduced over
 * ntaps taps x CP channels. The result goes to acc[k*ap + 16v], or, with an epilogue `ep`,
 * straight from the registers to the output: pixel k at ep->out + k*ep->ostride, plus bias and
 * residual, activation, stored in the valid lanes ep->m (or streamed).
 */
typedef struct {
   float *out;
   int64_t ostride;
   const float *bias;  /* at the block's first channel, or NULL */
   const float *res;   /* like out, or NULL */
   int act, stream;
   __mmask16 m[4];     /* the valid lanes of each vector */
} rb_epi;

AI void rb_body(const float *xb, const int64_t *xoff, const float *wb, const int64_t *woff,
                int ntaps, int64_t OB, float *acc, int64_t ap, const rb_epi *ep, const int CP,
                const int PB, const int NV) {
   __m512 a[RB_MAXPB][4];
   acc_zero(a, PB, NV);
   for (int t = 0; t < ntaps; t++) {
      const float *xp = xb + xoff[t];
      const float *wp = wb + woff[t];
      for (int c = 0; c < CP; c++) {
         __m512 w[4];
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) w[v] = _mm512_load_ps(wp + 16 * v);
#pragma GCC unroll 14
         for (int k = 0; k < PB; k++) {
            const __m512 b = _mm512_set1_ps(xp[k * CP + c]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, w[v], a[k][v]);
         }
         wp += OB;
      }
   }
   if (!ep) {
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) _mm512_store_ps(acc + k * ap + 16 * v, a[k][v]);
      return;
   }
   __m512 bv[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++)
      bv[v] = ep->bias ? _mm512_maskz_loadu_ps(ep->m[v], ep->bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) {
      float *o = ep->out + k * ep->ostride;
      const float *r = ep->res ? ep->res + k * ep->ostride : NULL;
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
         __m512 t = _mm512_add_ps(a[k][v], bv[v]);
         if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(ep->m[v], r + 16 * v));
         if (ep->act) t = lm_act_ps(t, ep->act);
         if (ep->stream)
            _mm512_stream_ps(o + 16 * v, t);
         else
            _mm512_mask_storeu_ps(o + 16 * v, ep->m[v], t);
      }
   }
}

typedef void (*rb_fn)(const float *, const int64_t *, const float *, const int64_t *, int, int64_t,
                      float *, int64_t, const rb_epi *);

#define RB_INST(CP, PB, NV)                                                                     \
   static void rb_##CP##_##PB##_##NV(const float *xb, const int64_t *xoff, const float *wb,      \
                                     const int64_t *woff, int ntaps, int64_t OB, float *acc,    \
                                     int64_t ap, const rb_epi *ep) {                            \
      rb_body(xb, xoff, wb, woff, ntaps, OB, acc, ap, ep, CP, PB, NV);                          \
   }
#define RB_INST_CP(CP)                                                                          \
   RB_INST(CP, 1, 1) RB_INST(CP, 2, 1) RB_INST(CP, 3, 1) RB_INST(CP, 4, 1) RB_INST(CP, 5, 1)    \
   RB_INST(CP, 6, 1) RB_INST(CP, 7, 1) RB_INST(CP, 8, 1) RB_INST(CP, 9, 1) RB_INST(CP, 10, 1)   \
   RB_INST(CP, 11, 1) RB_INST(CP, 12, 1) RB_INST(CP, 13, 1) RB_INST(CP, 14, 1)                  \
   RB_INST(CP, 1, 2) RB_INST(CP, 2, 2) RB_INST(CP, 3, 2) RB_INST(CP, 4, 2) RB_INST(CP, 5, 2)    \
   RB_INST(CP, 6, 2) RB_INST(CP, 7, 2) RB_INST(CP, 8, 2)                                        \
   RB_INST(CP, 1, 3) RB_INST(CP, 2, 3) RB_INST(CP, 3, 3) RB_INST(CP, 4, 3) RB_INST(CP, 5, 3)    \
   RB_INST(CP, 6, 3) RB_INST(CP, 7, 3) RB_INST(CP, 8, 3)                                        \
   RB_INST(CP, 1, 4) RB_INST(CP, 2, 4) RB_INST(CP, 3, 4) RB_INST(CP, 4, 4) RB_INST(CP, 5, 4)    \
   RB_INST(CP, 6, 4)
#define RB_TAB_CP(CP)                                                                           \
   {{0},                                                                                        \
    {0, rb_##CP##_1_1, rb_##CP##_2_1, rb_##CP##_3_1, rb_##CP##_4_1, rb_##CP##_5_1,              \
     rb_##CP##_6_1, rb_##CP##_7_1, rb_##CP##_8_1, rb_##CP##_9_1, rb_##CP##_10_1,                \
     rb_##CP##_11_1, rb_##CP##_12_1, rb_##CP##_13_1, rb_##CP##_14_1},                           \
    {0, rb_##CP##_1_2, rb_##CP##_2_2, rb_##CP##_3_2, rb_##CP##_4_2, rb_##CP##_5_2,              \
     rb_##CP##_6_2, rb_##CP##_7_2, rb_##CP##_8_2, 0, 0, 0, 0, 0, 0},                                  \
    {0, rb_##CP##_1_3, rb_##CP##_2_3, rb_##CP##_3_3, rb_##CP##_4_3, rb_##CP##_5_3,              \
     rb_##CP##_6_3, rb_##CP##_7_3, rb_##CP##_8_3, 0, 0, 0, 0, 0, 0},                                  \
    {0, rb_##CP##_1_4, rb_##CP##_2_4, rb_##CP##_3_4, rb_##CP##_4_4, rb_##CP##_5_4,              \
     rb_##CP##_6_4, 0, 0, 0, 0, 0, 0, 0, 0}}

RB_INST_CP(1)
RB_INST_CP(8)
RB_INST_CP(16)
RB_INST_CP(32)
RB_INST_CP(64)

enum { RB_NCP = 5 };
static const int rb_cps[RB_NCP] = {1, 8, 16, 32, 64};
static const rb_fn rb_tab[RB_NCP][5][RB_MAXPB + 1] = {RB_TAB_CP(1), RB_TAB_CP(8), RB_TAB_CP(16),
                                                      RB_TAB_CP(32), RB_TAB_CP(64)};
/* most pixels per call for NV vectors (accumulators + weights + broadcast <= 32 zmm; measured
   on Zen 5: 12..14 x 1, 8 x 2 and 4..6 x 4 run at 75-90% of the FMA peak; 14 makes a 14- or
   28-pixel row whole blocks) */
static const int rb_pbmax[5] = {0, 14, 8, 8, 6};

/* the channel padding for cin reduction channels: index into rb_cps, or -1 when the padding
   would waste too much work (the caller then takes the general kernels) */
static int rb_cp_index(int64_t cin) {
   if (cin == 1) return 0;
   if (cin >= 2 && cin <= 8) return cin >= 5 ? 1 : -1;
   if (cin <= 16) return cin >= 11 ? 2 : -1;
   if (cin <= 32) return cin >= 22 ? 3 : -1;
   if (cin <= 64) return cin >= 44 ? 4 : -1;
   return -1;
}

int lm_conv_rb_cp(int64_t cin) {
   const int i = rb_cp_index(cin);
   return i < 0 ? 0 : rb_cps[i];
}

int lm_conv_rb_pbmax(int nv) { return nv >= 1 && nv <= 4 ? rb_pbmax[nv] : 0; }

void lm_conv_rb_gemm(int CP, int nv, int pb, const float *x, const float *w, int64_t OB,
                     float *out, int64_t pitch) {
   static const int64_t zero[1] = {0};
   const int cpi = CP == 1 ? 0 : CP == 8 ? 1 : CP == 16 ? 2 : CP == 32 ? 3 : 4;
   rb_tab[cpi][nv][pb](x, zero, w, zero, 1, OB, out, pitch, NULL);
}

void lm_conv_rb_gemm_chunks(int nq, int nv, int pb, const float *x, int64_t xchunk,
                            const float *w, int64_t OB, float *out, int64_t pitch) {
   /* the chunks are the kernel's taps: one reduction, in registers, over all of them */
   int64_t xoff[LM_RB_MAXCHUNKS], woff[LM_RB_MAXCHUNKS];
   for (int j = 0; j < nq; j++) {
      xoff[j] = j * xchunk;
      woff[j] = j * 64 * OB;
   }
   rb_tab[4][nv][pb](x, xoff, w, woff, nq, OB, out, pitch, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * the problem as the kernels see it: dst[n][y][x][0..Cout) from src[n][.][.][0..Cin)
 */
typedef struct {
   const float *src;
   int64_t sH, sW, Cin;    /* source image (pixel stride Cin) */
   float *dst;
   int64_t dH, dW, Cout;   /* destination image (pixel stride Cout) */
   int64_t N, kh, kw, sh, sw, ph, pw, dh, dw; /* padding may be negative */
   int transposed;         /* backward data with stride > 1 (phases) */
   const float *wp;        /* packed weights [ob][tap][CP][OB] */
   int64_t OB, nob;
   int CP, cpi;
   const float *bias, *res;
   int act;
   int stream;             /* write with non-temporal stores (outputs far larger than the caches) */
} rb_prob;

/* copy n channels of a pixel and zero the rest up to CP (n <= CP <= 64) */
static inline void rb_copy_px(float *dst, const float *src, int64_t n, int CP) {
   if (CP == 1) {
      dst[0] = n > 0 ? src[0] : 0.0f;
      return;
   }
   if (n == CP && CP % 16 == 0) {
      for (int c0 = 0; c0 < CP; c0 += 16) _mm512_store_ps(dst + c0, _mm512_loadu_ps(src + c0));
      return;
   }
   for (int c0 = 0; c0 < CP; c0 += 16) {
      const int64_t left = n - c0;
      const __mmask16 lm = left >= 16 ? (__mmask16)0xFFFF
                                      : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      const __mmask16 sm = CP - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (CP - c0)) - 1);
      _mm512_mask_storeu_ps(dst + c0, sm, _mm512_maskz_loadu_ps(lm, src + c0));
   }
}

/* stage nrows source rows starting at row R0 of image img: row k of the band holds nph column
   phases of Wph pixels; phase p, position m = source column m*nph + p - cpad (zeros outside).
   Phases whose bit is clear in `used` are never read and not written. */
static void rb_stage(const rb_prob *P, const float *img, int64_t R0, int64_t nrows, int64_t nph,
                     int64_t Wph, int64_t cpad, uint64_t used, float *band) {
   const int CP = P->CP;
   const int64_t rowpitch = nph * Wph * CP;
   for (int64_t k = 0; k < nrows; k++) {
      float *dst = band + k * rowpitch;
      const int64_t sr = R0 + k;
      if (sr < 0 || sr >= P->sH) {
         memset(dst, 0, (size_t)rowpitch * sizeof(float));
         continue;
      }
      const float *srow = img + sr * P->sW * P->Cin;
      /* the rows ahead are on their way while this one is copied */
      if (sr + 2 < P->sH && k + 2 < nrows) {
         const char *pf = (const char *)(srow + 2 * P->sW * P->Cin);
         const int64_t nbytes = P->sW * P->Cin * (int64_t)sizeof(float);
         for (int64_t b = 0; b < nbytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
      }
      for (int64_t p = 0; p < nph; p++) {
         if (p < 64 && !((used >> p) & 1)) continue;
         for (int64_t m = 0; m < Wph; m++) {
            const int64_t sc = m * nph + p - cpad;
            float *d = dst + (p * Wph + m) * CP;
            if (sc < 0 || sc >= P->sW)
               memset(d, 0, (size_t)CP * sizeof(float));
            else
               rb_copy_px(d, srow + sc * P->Cin, P->Cin, CP);
         }
      }
   }
}

/* one row of output pixels: ncols pixels, pixel k reads xrow + k*CP (+ tap offsets), writes
   out + k*ostride; every channel block */
static void rb_row(const rb_prob *P, const float *xrow, const int64_t *xoff, const int64_t *woff,
                   int ntaps, int64_t taps_all, int64_t ncols, float *out, int64_t ostride) {
   const int CP = P->CP;
   for (int64_t ob = 0; ob < P->nob; ob++) {
      const int64_t oc0 = ob * P->OB;
      const int64_t nvalid = P->Cout - oc0 < P->OB ? P->Cout - oc0 : P->OB;
      const int nv = (int)((nvalid + 15) / 16);
      const int pbmax = rb_pbmax[nv];
      const float *wb = P->wp + ob * taps_all * CP * P->OB;
      const int64_t nb = (ncols + pbmax - 1) / pbmax;
      const int64_t base = ncols / nb, extra = ncols % nb;
      rb_epi ep;
      ep.ostride = ostride;
      ep.bias = P->bias ? P->bias + oc0 : NULL;
      ep.act = P->act;
      for (int v = 0; v < 4; v++) {
         const int64_t left = nvalid - 16 * v;
         ep.m[v] = left >= 16 ? (__mmask16)0xFFFF
                              : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      }
      /* streaming stores for outputs far larger than the caches (no read-for-ownership) */
      ep.stream = P->stream && nvalid % 16 == 0 && ((uintptr_t)(out + oc0) & 63) == 0 &&
                  (ostride & 15) == 0;
      int64_t q = 0;
      for (int64_t b = 0; b < nb; b++) {
         const int64_t mpx = base + (b < extra);
         const int64_t off = (out - P->dst) + q * ostride + oc0;
         ep.out = P->dst + off;
         ep.res = P->res ? P->res + off : NULL;
         rb_tab[P->cpi][nv][mpx](xrow + q * CP, xoff, wb, woff, ntaps, P->OB, NULL, 0, &ep);
         q += mpx;
      }
   }
}

/* forward-form unit: image n, destination rows [r0, r1); destination pixel (r, q) reads source
   pixel (r*sh - ph + i*dh, q*sw - pw + j*dw) for tap (i, j). The source rows of one output row
   span (kh-1)*dh + 1 rows; when consecutive output rows share rows (sh < span) the band holds
   the unit's rows once, else each output row's span separately (a 1x1/2 convolution copies a
   quarter of its input). A pointwise convolution with nothing to pad reads its input in place. */
typedef struct {
   const float *rows;   /* the source of output row r0 */
   int64_t rstride;     /* floats from one output row's source to the next */
   int64_t xoff[RB_MAXTAPS];
} rb_staged;

/* stage the source of output rows [r0, r1) of image n (or point into the image when nothing
   needs padding) and compute the tap offsets */
static void rb_stage_fwd(const rb_prob *P, int64_t n, int64_t r0, int64_t r1, float *band,
                         rb_staged *S) {
   const int CP = P->CP;
   const float *img = P->src + n * P->sH * P->sW * P->Cin;
   if (P->kh * P->kw == 1 && P->sw == 1 && P->ph == 0 && P->pw == 0 && P->Cin == CP) {
      S->rows = img + r0 * P->sh * P->sW * P->Cin;
      S->rstride = P->sh * P->sW * P->Cin;
      S->xoff[0] = 0;
      return;
   }
   const int64_t span = (P->kh - 1) * P->dh + 1;
   const int64_t Wpad = (P->dW - 1) * P->sw + (P->kw - 1) * P->dw + 1;
   const int64_t nph = P->sw, Wph = (Wpad + nph - 1) / nph, rowpitch = nph * Wph * CP;
   uint64_t used = 0;
   for (int64_t j = 0; j < P->kw; j++) {
      const int64_t p = (j * P->dw) % nph;
      used |= p < 64 ? (uint64_t)1 << p : 0;
   }
   if (nph > 64) used = ~(uint64_t)0;
   if (P->sh < span) {
      S->rstride = P->sh * rowpitch;
      rb_stage(P, img, r0 * P->sh - P->ph, (r1 - 1 - r0) * P->sh + span, nph, Wph, P->pw, used,
               band);
   } else {
      S->rstride = span * rowpitch;
      for (int64_t r = r0; r < r1; r++)
         rb_stage(P, img, r * P->sh - P->ph, span, nph, Wph, P->pw, used,
                  band + (r - r0) * span * rowpitch);
   }
   S->rows = band;
   for (int64_t i = 0; i < P->kh; i++)
      for (int64_t j = 0; j < P->kw; j++) {
         const int64_t cj = j * P->dw;
         S->xoff[i * P->kw + j] = i * P->dh * rowpitch + ((cj % nph) * Wph + cj / nph) * CP;
      }
}

/* run one forward-form unit (image n, destination rows [r0, r1); the band layout is described
   above the band struct) */
static void rb_fwd_unit(const rb_prob *P, int64_t n, int64_t r0, int64_t r1, float *band) {
   const int64_t taps = P->kh * P->kw;
   rb_staged S;
   rb_stage_fwd(P, n, r0, r1, band, &S);
   int64_t woff[RB_MAXTAPS];
   for (int64_t t = 0; t < taps; t++) woff[t] = t * P->CP * P->OB;
   if (S.rows != band && S.rstride == P->dW * P->Cin) {
      /* read in place, rows back to back: the unit's pixels are one run (full blocks) */
      rb_row(P, S.rows, S.xoff, woff, 1, 1, (r1 - r0) * P->dW,
             P->dst + ((n * P->dH + r0) * P->dW) * P->Cout, P->Cout);
      return;
   }
   for (int64_t r = r0; r < r1; r++) {
      float *out = P->dst + ((n * P->dH + r) * P->dW) * P->Cout;
      rb_row(P, S.rows + (r - r0) * S.rstride, S.xoff, woff, (int)taps, taps, P->dW, out,
             P->Cout);
   }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t floor_div(int64_t a, int64_t b) {
   const int64_t q = a / b;
   return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* the taps of phase (a, b) of the transposed form: (a + ph - i*dh) and (b + pw - j*dw) divisible
   by the strides; they read source pixel (u + di, v + dj); tw: the tap's index in the backward
   packing (the flipped position of (i, j)) */
static int rb_tr_taps(const rb_prob *P, int64_t a, int64_t b, int64_t *di, int64_t *dj,
                      int64_t *tw) {
   int ntaps = 0;
   for (int64_t i = 0; i < P->kh; i++) {
      const int64_t ti = a + P->ph - i * P->dh;
      if (((ti % P->sh) + P->sh) % P->sh) continue;
      for (int64_t j = 0; j < P->kw; j++) {
         const int64_t tj = b + P->pw - j * P->dw;
         if (((tj % P->sw) + P->sw) % P->sw) continue;
         di[ntaps] = floor_div(ti, P->sh);
         dj[ntaps] = floor_div(tj, P->sw);
         tw[ntaps] = (P->kh - 1 - i) * P->kw + (P->kw - 1 - j);
         ntaps++;
      }
   }
   return ntaps;
}

/* transposed-form unit (backward data, stride > 1): image n, phase rows [u0, u1), every phase
   (a, b): destination pixel (u*sh + a, v*sw + b) = sum over the phase's taps of source pixel
   (u + di, v + dj) x w[tap]. The source rows are staged once for all phases. */
static void rb_tr_unit(const rb_prob *P, int64_t n, int64_t u0, int64_t u1, float *band) {
   const int CP = P->CP;
   const int64_t taps_all = P->kh * P->kw;
   int64_t di[RB_MAXTAPS], dj[RB_MAXTAPS], tw[RB_MAXTAPS];
   /* the reach of every phase's taps */
   int64_t dimin = 0, dimax = 0, djmin = 0, djmax = 0;
   int any = 0;
   for (int64_t a = 0; a < P->sh; a++)
      for (int64_t b = 0; b < P->sw; b++) {
         const int nt = rb_tr_taps(P, a, b, di, dj, tw);
         for (int t = 0; t < nt; t++) {
            if (!any || di[t] < dimin) dimin = di[t];
            if (!any || di[t] > dimax) dimax = di[t];
            if (!any || dj[t] < djmin) djmin = dj[t];
            if (!any || dj[t] > djmax) djmax = dj[t];
            any = 1;
         }
      }
   const int64_t nvc0 = ceil_div(P->dW, P->sw); /* columns of phase 0 (the widest) */
   const int64_t Wph = nvc0 + djmax - djmin, rowpitch = Wph * CP;
   if (any)
      rb_stage(P, P->src + n * P->sH * P->sW * P->Cin, u0 + dimin, (u1 - 1 - u0) + dimax - dimin + 1,
               1, Wph, -djmin, 1, band);
   int64_t xoff[RB_MAXTAPS], woff[RB_MAXTAPS];
   for (int64_t a = 0; a < P->sh; a++) {
      const int64_t nu = ceil_div(P->dH - a, P->sh), ue = u1 < nu ? u1 : nu;
      for (int64_t b = 0; b < P->sw; b++) {
         const int64_t nvc = ceil_div(P->dW - b, P->sw); /* columns of this phase */
         if (nvc <= 0 || u0 >= ue) continue;
         const int ntaps = rb_tr_taps(P, a, b, di, dj, tw);
         const int64_t ostride = P->sw * P->Cout;
         if (ntaps == 0) {
            /* no tap reaches this phase: zeros */
            for (int64_t u = u0; u < ue; u++) {
               float *o = P->dst + ((n * P->dH + u * P->sh + a) * P->dW + b) * P->Cout;
               for (int64_t v = 0; v < nvc; v++)
                  memset(o + v * ostride, 0, (size_t)P->Cout * sizeof(float));
            }
            continue;
         }
         for (int t = 0; t < ntaps; t++) {
            xoff[t] = (di[t] - dimin) * rowpitch + (dj[t] - djmin) * CP;
            woff[t] = tw[t] * CP * P->OB;
         }
         for (int64_t u = u0; u < ue; u++) {
            float *out = P->dst + ((n * P->dH + u * P->sh + a) * P->dW + b) * P->Cout;
            rb_row(P, band + (u - u0) * rowpitch, xoff, woff, ntaps, taps_all, nvc, out, ostride);
         }
      }
   }
}


static lm_status rb_run(const rb_prob *P0) {
   rb_prob PP = *P0;
   const rb_prob *P = &PP;
   const int CP = P->CP;
   PP.stream = (double)P->N * P->dH * P->dW * P->Cout * sizeof(float) > 24e6;
   const int64_t phases = 1; /* the transposed units do every phase */
   /* rows of one unit (in the phase for the transposed form) */
   const int64_t rows_total = P->transposed ? ceil_div(P->dH, P->sh) : P->dH;
   const int64_t sh_in = P->transposed ? 1 : P->sh;
   const int64_t Wpad = P->transposed ? ceil_div(P->dW, P->sw) + (P->kw - 1) * P->dw / P->sw + 1
                                      : (P->dW - 1) * P->sw + (P->kw - 1) * P->dw + 1;
   const int64_t rowbytes = (Wpad + P->sw) * CP * (int64_t)sizeof(float);
   int64_t rpu = RB_BAND_BYTES / (rowbytes * sh_in > 0 ? rowbytes * sh_in : 1);
   if (rpu < 1) rpu = 1;
   if (rpu > rows_total) rpu = rows_total > 0 ? rows_total : 1;
   const double work = (double)P->N * P->dH * P->dW * P->Cout * P->Cin * P->kh * P->kw;
   const int nthr = conv_threads(work);
   while (rpu > 1 && P->N * phases * ceil_div(rows_total, rpu) < 4 * nthr) rpu = (rpu + 1) / 2;
   /* balanced row blocks */
   const int64_t nrb = ceil_div(rows_total, rpu);
   rpu = ceil_div(rows_total, nrb);
   const int64_t units = P->N * phases * nrb;
   /* the band of a unit: rows (plus the kernel's reach), every phase of the padded width */
   const int64_t maxrows = P->transposed ? rpu + ((P->kh - 1) * P->dh + P->sh - 1) / P->sh + 2
                                         : (rpu - 1) * P->sh + (P->kh - 1) * P->dh + 1;
   const int64_t band_elems = (maxrows * (Wpad + 2 * P->sw + (P->kw - 1) * P->dw) * CP + 15) / 16 * 16;
   const size_t per_thread = (size_t)band_elems;
   const size_t bytes = (size_t)nthr * per_thread * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *band = scratch + (size_t)conv_thread_id() * per_thread;
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t n = u / nrb, rb = u % nrb;
         const int64_t r0 = rb * rpu, r1 = r0 + rpu < rows_total ? r0 + rpu : rows_total;
         if (r0 >= r1) continue;
         if (P->transposed)
            rb_tr_unit(P, n, r0, r1, band);
         else
            rb_fwd_unit(P, n, r0, r1, band);
      }
      if (P->stream) _mm_sfence(); /* order the streaming stores before the region ends */
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * backward weight for a single input channel (the stem of a network on grey images): per output
 * pixel one vector of grad_output (16 output channels) times NT broadcast input values, one per
 * tap, into NT accumulators: gw[o][t] = sum over pixels of gout[p][o] * x[p + tap t]. The input
 * is staged as in the forward (CP = 1), so every tap is valid for every pixel.
 */
enum { RB_W1_MAXT = 9 };

AI void rb_w1_body(const float *xr, const int64_t *xoff, const float *g, int64_t gs, int64_t npx,
                   __mmask16 m, float *acc, const int NT) {
   __m512 a[RB_W1_MAXT];
   int64_t o[RB_W1_MAXT];
#pragma GCC unroll 9
   for (int t = 0; t < NT; t++) {
      a[t] = _mm512_load_ps(acc + 16 * t);
      o[t] = xoff[t];
   }
   for (int64_t q = 0; q < npx; q++) {
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + q * gs);
#pragma GCC unroll 9
      for (int t = 0; t < NT; t++) a[t] = _mm512_fmadd_ps(_mm512_set1_ps(xr[q + o[t]]), gv, a[t]);
   }
#pragma GCC unroll 9
   for (int t = 0; t < NT; t++) _mm512_store_ps(acc + 16 * t, a[t]);
}

typedef void (*rb_w1_fn)(const float *, const int64_t *, const float *, int64_t, int64_t,
                         __mmask16, float *);
#define RB_W1_INST(NT)                                                                          \
   static void rb_w1_##NT(const float *xr, const int64_t *xoff, const float *g, int64_t gs,     \
                          int64_t npx, __mmask16 m, float *acc) {                               \
      rb_w1_body(xr, xoff, g, gs, npx, m, acc, NT);                                             \
   }
RB_W1_INST(1) RB_W1_INST(2) RB_W1_INST(3) RB_W1_INST(4) RB_W1_INST(5) RB_W1_INST(6)
RB_W1_INST(7) RB_W1_INST(8) RB_W1_INST(9)
static const rb_w1_fn rb_w1_tab[RB_W1_MAXT + 1] = {0,       rb_w1_1, rb_w1_2, rb_w1_3, rb_w1_4,
                                                   rb_w1_5, rb_w1_6, rb_w1_7, rb_w1_8, rb_w1_9};

int lm_conv_rb_bwdw_usable(const conv_geom *g) {
   return g->G == 1 && g->C == 1 && g->kh * g->kw <= RB_MAXTAPS && g->Wo >= 4;
}

lm_status lm_conv_rb_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                      float *gw, float *gb) {
   const int64_t O = g->O, taps = g->kh * g->kw, Ov = (O + 15) / 16;
   if (gw) memset(gw, 0, (size_t)(O * taps) * sizeof(float));
   if (gb) memset(gb, 0, (size_t)O * sizeof(float));
   if (g->N * g->Ho * g->Wo == 0 || O == 0) return LM_OK;
   rb_prob P = {x, g->H, g->W, 1, NULL, g->Ho, g->Wo, O, g->N, g->kh, g->kw, g->sh, g->sw,
                g->ph, g->pw, g->dh, g->dw, 0, NULL, 0, 0, 1, 0, NULL, NULL, 0, 0};
   const int nthr = conv_threads((double)g->N * g->Ho * g->Wo * O * taps);
   const int64_t rows_total = g->N * g->Ho;
   /* units: runs of output rows of one image */
   int64_t rpu = g->Ho < 8 ? g->Ho : 8;
   const int64_t nrb = ceil_div(g->Ho, rpu);
   rpu = ceil_div(g->Ho, nrb);
   const int64_t units = g->N * nrb;
   (void)rows_total;
   const int64_t Wpad = (g->Wo - 1) * g->sw + (g->kw - 1) * g->dw + 1;
   const int64_t span = (g->kh - 1) * g->dh + 1;
   const int64_t maxrows = (rpu - 1) * g->sh + span > rpu * span ? (rpu - 1) * g->sh + span
                                                                   : rpu * span;
   const int64_t band_elems = (maxrows * (Wpad + 2 * g->sw) + 15) / 16 * 16;
   const int64_t accn = Ov * taps * 16; /* [ov][tap][16] */
   const int64_t per = (accn + 16 + Ov * 16 + band_elems + 15) / 16 * 16;
   const size_t bytes = (size_t)(nthr * per) * sizeof(float);
   float *buf = lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *acc = buf + conv_thread_id() * per, *gbp = acc + accn, *band = gbp + Ov * 16;
      memset(acc, 0, (size_t)(accn + Ov * 16) * sizeof(float));
#pragma omp for schedule(static) /* a fixed split: the same sums on every run */
      for (int64_t u = 0; u < units; u++) {
         const int64_t n = u / nrb, r0 = (u % nrb) * rpu;
         const int64_t r1 = r0 + rpu < g->Ho ? r0 + rpu : g->Ho;
         if (r0 >= r1) continue;
         rb_staged S;
         if (gw) rb_stage_fwd(&P, n, r0, r1, band, &S);
         for (int64_t ov = 0; ov < Ov; ov++) {
            const int64_t left = O - ov * 16;
            const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            for (int64_t r = r0; r < r1; r++) {
               const float *grow = gout + ((n * g->Ho + r) * g->Wo) * O + ov * 16;
               if (gb) {
                  __m512 sacc = _mm512_load_ps(gbp + ov * 16);
                  for (int64_t q = 0; q < g->Wo; q++)
                     sacc = _mm512_add_ps(sacc, _mm512_maskz_loadu_ps(m, grow + q * O));
                  _mm512_store_ps(gbp + ov * 16, sacc);
               }
               if (!gw) continue;
               for (int64_t t0 = 0; t0 < taps; t0 += RB_W1_MAXT) {
                  const int nt = (int)(taps - t0 < RB_W1_MAXT ? taps - t0 : RB_W1_MAXT);
                  rb_w1_tab[nt](S.rows + (r - r0) * S.rstride, S.xoff + t0, grow, O, g->Wo, m,
                                acc + (ov * taps + t0) * 16);
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
               for (int64_t o = 0; o < O; o++)
                  for (int64_t k = 0; k < taps; k++)
                     gw[o * taps + k] += src[((o / 16) * taps + k) * 16 + o % 16];
            if (gb)
               for (int64_t o = 0; o < O; o++) gb[o] += src[accn + o];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * weight packing
 */
static int64_t rb_block_width(int64_t co) { return co >= 64 ? 64 : (co + 15) / 16 * 16; }

/* forward: w (O, taps, C) -> wp[ob][tap][c < CP][v < OB] = w[ob*OB + v][tap][c], zero padded */
static void rb_pack_fwd(const conv_geom *g, const float *w, int CP, int64_t OB, int64_t nob,
                        float *wp) {
   const int64_t taps = g->kh * g->kw, C = g->C, O = g->O, K = g->K;
   for (int64_t ob = 0; ob < nob; ob++)
      for (int64_t t = 0; t < taps; t++)
         for (int64_t c = 0; c < CP; c++) {
            float *d = wp + ((ob * taps + t) * CP + c) * OB;
            for (int64_t v = 0; v < OB; v++) {
               const int64_t o = ob * OB + v;
               d[v] = (c < C && o < O) ? w[o * K + t * C + c] : 0.0f;
            }
         }
}

/* backward data: wp[cb][t'][o < CP][v < OB] = w[o][flip(t')][cb*OB + v] */
static void rb_pack_bwd(const conv_geom *g, const float *w, int CP, int64_t OB, int64_t ncb,
                        float *wp) {
   const int64_t taps = g->kh * g->kw, C = g->C, O = g->O, K = g->K;
   for (int64_t cb = 0; cb < ncb; cb++)
      for (int64_t t = 0; t < taps; t++) {
         const int64_t i = t / g->kw, j = t % g->kw;
         const int64_t tf = (g->kh - 1 - i) * g->kw + (g->kw - 1 - j);
         for (int64_t o = 0; o < CP; o++) {
            float *d = wp + ((cb * taps + t) * CP + o) * OB;
            for (int64_t v = 0; v < OB; v++) {
               const int64_t c = cb * OB + v;
               d[v] = (o < O && c < C) ? w[o * K + tf * C + c] : 0.0f;
            }
         }
      }
}

/* ---------------------------------------------------------------------------------------------
 * entry points
 */
/* whether the register-blocked kernels take this convolution: groups == 1, a reduction channel
   count that pads well (cin: C forward, O backward data), rows of at least 14 pixels. Blocks of
   pixels stay within a row, so narrow maps (7x7) get short blocks; there the general kernels,
   whose blocks run across rows and which keep one tap's weights in L1 for a whole unit of
   pixels, are faster (measured: 7x7 with 32..64 channels). */
int lm_conv_rb_usable(const conv_geom *g, int backward_data) {
   if (g->G != 1 || g->kh * g->kw > RB_MAXTAPS) return 0;
   const int64_t cin = backward_data ? g->O : g->C;
   const int64_t cout = backward_data ? g->C : g->O;
   const int cpi = rb_cp_index(cin);
   if (cpi < 0 || cout <= 0) return 0;
   if (cin == 1) return 1;
   /* pixels per row of the destination (per phase for the strided backward) */
   const int64_t width = backward_data ? (g->W + g->sw - 1) / g->sw : g->Wo;
   if (width < 14) return 0;
   return 1;
}

lm_status lm_conv_rb_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int act, float *out) {
   const int cpi = rb_cp_index(g->C);
   if (cpi < 0) return lm_error(LM_ERR_ARG, "conv2d: no register-blocked kernel for %lld channels",
                                (long long)g->C);
   const int CP = rb_cps[cpi];
   const int64_t OB = rb_block_width(g->O), nob = ceil_div(g->O, OB), taps = g->kh * g->kw;
   const size_t bytes = (size_t)(nob * taps * CP * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   rb_pack_fwd(g, w, CP, OB, nob, wp);
   rb_prob P = {x, g->H, g->W, g->C, out, g->Ho, g->Wo, g->O, g->N, g->kh, g->kw, g->sh, g->sw,
                g->ph, g->pw, g->dh, g->dw, 0, wp, OB, nob, CP, cpi, bias, res, act, 0};
   lm_status st = rb_run(&P);
   lm_free(wp, bytes);
   return st;
}

lm_status lm_conv_rb_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                      float *gx) {
   const int cpi = rb_cp_index(g->O);
   if (cpi < 0) return lm_error(LM_ERR_ARG, "conv2d: no register-blocked kernel for %lld channels",
                                (long long)g->O);
   const int CP = rb_cps[cpi];
   const int64_t OB = rb_block_width(g->C), ncb = ceil_div(g->C, OB), taps = g->kh * g->kw;
   const size_t bytes = (size_t)(ncb * taps * CP * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   rb_pack_bwd(g, w, CP, OB, ncb, wp);
   const int tr = g->sh > 1 || g->sw > 1;
   /* stride 1: the forward form with the flipped kernel and padding d*(k-1) - p */
   rb_prob P = {gout, g->Ho, g->Wo, g->O, gx, g->H, g->W, g->C, g->N, g->kh, g->kw,
                tr ? g->sh : 1, tr ? g->sw : 1,
                tr ? g->ph : g->dh * (g->kh - 1) - g->ph, tr ? g->pw : g->dw * (g->kw - 1) - g->pw,
                g->dh, g->dw, tr, wp, OB, ncb, CP, cpi, NULL, NULL, 0, 0};
   lm_status st = rb_run(&P);
   lm_free(wp, bytes);
   return st;
}
