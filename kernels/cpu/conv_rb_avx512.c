/* conv_rb_avx512.c -- register-blocked direct convolution for small channel counts (float32,
 * NHWC, AVX-512, groups == 1): forward and backward data.
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
 * with the epilogue (bias, residual, ReLU). Weights are packed once per call into
 * wp[ob][tap][CP][OB] (OB = 16..64 output channels per block, zero padded).
 *
 * Backward data: stride 1 is the same kernel run on grad_output with the flipped kernel (input
 * and output channels swapped, padding d*(k-1)-p). Stride s > 1 splits grad_input into sh x sw
 * phases; in one phase every pixel uses the same taps (those with (a + p - i*d) divisible by s),
 * which read grad_output at fixed offsets: again a dense register-blocked reduction, written
 * with a pixel stride of sw (no scatter, no atomics, no zero-inserted work).
 *
 * Results do not depend on the thread count (every output element is reduced by one thread in a
 * fixed order).
 */
#include "conv_internal.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { RB_PITCH = 64, RB_MAXPB = 12, RB_MAXTAPS = 128, RB_BAND_BYTES = 96 * 1024 };

/* ---------------------------------------------------------------------------------------------
 * micro-kernel: PB pixels (pixel k at xb + k*CP) x NV vectors of output channels, reduced over
 * ntaps taps x CP channels; the result goes to acc[k*RB_PITCH + 16v]
 */
AI void rb_body(const float *xb, const int64_t *xoff, const float *wb, const int64_t *woff,
                int ntaps, int64_t OB, float *acc, const int CP, const int PB, const int NV) {
   __m512 a[RB_MAXPB][4];
#pragma GCC unroll 12
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_setzero_ps();
   for (int t = 0; t < ntaps; t++) {
      const float *xp = xb + xoff[t];
      const float *wp = wb + woff[t];
      for (int c = 0; c < CP; c++) {
         __m512 w[4];
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) w[v] = _mm512_load_ps(wp + 16 * v);
#pragma GCC unroll 12
         for (int k = 0; k < PB; k++) {
            const __m512 b = _mm512_set1_ps(xp[k * CP + c]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, w[v], a[k][v]);
         }
         wp += OB;
      }
   }
#pragma GCC unroll 12
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(acc + k * RB_PITCH + 16 * v, a[k][v]);
}

typedef void (*rb_fn)(const float *, const int64_t *, const float *, const int64_t *, int, int64_t,
                      float *);

#define RB_INST(CP, PB, NV)                                                                     \
   static void rb_##CP##_##PB##_##NV(const float *xb, const int64_t *xoff, const float *wb,      \
                                     const int64_t *woff, int ntaps, int64_t OB, float *acc) {  \
      rb_body(xb, xoff, wb, woff, ntaps, OB, acc, CP, PB, NV);                                  \
   }
#define RB_INST_CP(CP)                                                                          \
   RB_INST(CP, 1, 1) RB_INST(CP, 2, 1) RB_INST(CP, 3, 1) RB_INST(CP, 4, 1) RB_INST(CP, 5, 1)    \
   RB_INST(CP, 6, 1) RB_INST(CP, 7, 1) RB_INST(CP, 8, 1) RB_INST(CP, 9, 1) RB_INST(CP, 10, 1)   \
   RB_INST(CP, 11, 1) RB_INST(CP, 12, 1)                                                        \
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
     rb_##CP##_11_1, rb_##CP##_12_1},                                                           \
    {0, rb_##CP##_1_2, rb_##CP##_2_2, rb_##CP##_3_2, rb_##CP##_4_2, rb_##CP##_5_2,              \
     rb_##CP##_6_2, rb_##CP##_7_2, rb_##CP##_8_2, 0, 0, 0, 0},                                  \
    {0, rb_##CP##_1_3, rb_##CP##_2_3, rb_##CP##_3_3, rb_##CP##_4_3, rb_##CP##_5_3,              \
     rb_##CP##_6_3, rb_##CP##_7_3, rb_##CP##_8_3, 0, 0, 0, 0},                                  \
    {0, rb_##CP##_1_4, rb_##CP##_2_4, rb_##CP##_3_4, rb_##CP##_4_4, rb_##CP##_5_4,              \
     rb_##CP##_6_4, 0, 0, 0, 0, 0, 0}}

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
   on Zen 5: 12 x 1, 8 x 2 and 4..6 x 4 run at 75-90% of the FMA peak) */
static const int rb_pbmax[5] = {0, 12, 8, 8, 6};

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
   int relu;
} rb_prob;

/* copy n channels of a pixel and zero the rest up to CP (n <= CP <= 64) */
static inline void rb_copy_px(float *dst, const float *src, int64_t n, int CP) {
   if (CP == 1) {
      dst[0] = n > 0 ? src[0] : 0.0f;
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
   phases of Wph pixels; phase p, position m = source column m*nph + p - cpad (zeros outside) */
static void rb_stage(const rb_prob *P, const float *img, int64_t R0, int64_t nrows, int64_t nph,
                     int64_t Wph, int64_t cpad, float *band) {
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
      for (int64_t p = 0; p < nph; p++) {
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

/* accumulators of npx pixels -> dst (pixel stride ostride), nvalid channels, with the epilogue */
static void rb_write(const rb_prob *P, const float *acc, float *out, const float *res,
                     int64_t ostride, int64_t npx, int64_t oc0, int64_t nvalid) {
   __m512 bv[4];
   __mmask16 m[4];
   const int nv = (int)((nvalid + 15) / 16);
   for (int v = 0; v < 4; v++) {
      const int64_t left = nvalid - 16 * v;
      m[v] = left >= 16 ? (__mmask16)0xFFFF
                        : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      bv[v] = P->bias && left > 0 ? _mm512_maskz_loadu_ps(m[v], P->bias + oc0 + 16 * v)
                                  : _mm512_setzero_ps();
   }
   for (int64_t k = 0; k < npx; k++) {
      const float *a = acc + k * RB_PITCH;
      float *o = out + k * ostride;
      const float *r = res ? res + k * ostride : NULL;
      for (int v = 0; v < nv; v++) {
         __m512 t = _mm512_add_ps(_mm512_load_ps(a + 16 * v), bv[v]);
         if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], r + 16 * v));
         if (P->relu) t = _mm512_max_ps(t, _mm512_setzero_ps());
         _mm512_mask_storeu_ps(o + 16 * v, m[v], t);
      }
   }
}

/* one row of output pixels: ncols pixels, pixel k reads xrow + k*CP (+ tap offsets), writes
   out + k*ostride; every channel block */
static void rb_row(const rb_prob *P, const float *xrow, const int64_t *xoff, const int64_t *woff,
                   int ntaps, int64_t taps_all, int64_t ncols, float *out, int64_t ostride,
                   float *acc) {
   const int CP = P->CP;
   for (int64_t ob = 0; ob < P->nob; ob++) {
      const int64_t oc0 = ob * P->OB;
      const int64_t nvalid = P->Cout - oc0 < P->OB ? P->Cout - oc0 : P->OB;
      const int nv = (int)((nvalid + 15) / 16);
      const int pbmax = rb_pbmax[nv];
      const float *wb = P->wp + ob * taps_all * CP * P->OB;
      const int64_t nb = (ncols + pbmax - 1) / pbmax;
      const int64_t base = ncols / nb, extra = ncols % nb;
      int64_t q = 0;
      for (int64_t b = 0; b < nb; b++) {
         const int64_t mpx = base + (b < extra);
         rb_tab[P->cpi][nv][mpx](xrow + q * CP, xoff, wb, woff, ntaps, P->OB, acc);
         const int64_t off = (out - P->dst) + q * ostride + oc0;
         rb_write(P, acc, P->dst + off, P->res ? P->res + off : NULL, ostride, mpx, oc0, nvalid);
         q += mpx;
      }
   }
}

/* forward-form unit: image n, destination rows [r0, r1); destination pixel (r, q) reads source
   pixel (r*sh - ph + i*dh, q*sw - pw + j*dw) for tap (i, j) */
static void rb_fwd_unit(const rb_prob *P, int64_t n, int64_t r0, int64_t r1, float *band,
                        float *acc) {
   const int CP = P->CP;
   const int64_t taps = P->kh * P->kw;
   const int64_t nrows = (r1 - 1 - r0) * P->sh + (P->kh - 1) * P->dh + 1;
   const int64_t Wpad = (P->dW - 1) * P->sw + (P->kw - 1) * P->dw + 1;
   const int64_t nph = P->sw, Wph = (Wpad + nph - 1) / nph, rowpitch = nph * Wph * CP;
   rb_stage(P, P->src + n * P->sH * P->sW * P->Cin, r0 * P->sh - P->ph, nrows, nph, Wph, P->pw,
            band);
   int64_t xoff[RB_MAXTAPS], woff[RB_MAXTAPS];
   for (int64_t i = 0; i < P->kh; i++)
      for (int64_t j = 0; j < P->kw; j++) {
         const int64_t t = i * P->kw + j, cj = j * P->dw;
         xoff[t] = i * P->dh * rowpitch + ((cj % nph) * Wph + cj / nph) * CP;
         woff[t] = t * CP * P->OB;
      }
   for (int64_t r = r0; r < r1; r++) {
      float *out = P->dst + ((n * P->dH + r) * P->dW) * P->Cout;
      rb_row(P, band + (r - r0) * P->sh * rowpitch, xoff, woff, (int)taps, taps, P->dW, out,
             P->Cout, acc);
   }
}

static int64_t floor_div(int64_t a, int64_t b) {
   const int64_t q = a / b;
   return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* transposed-form unit (backward data, stride > 1): image n, phase (a, b), phase rows [u0, u1):
   destination pixel (u*sh + a, v*sw + b) = sum over the taps (i, j) with (a + ph - i*dh) and
   (b + pw - j*dw) divisible by the strides of source pixel (u + di, v + dj) x w[tap] */
static void rb_tr_unit(const rb_prob *P, int64_t n, int64_t a, int64_t b, int64_t u0, int64_t u1,
                       float *band, float *acc) {
   const int CP = P->CP;
   const int64_t taps_all = P->kh * P->kw;
   const int64_t nvc = (P->dW - b + P->sw - 1) / P->sw; /* columns of this phase */
   if (nvc <= 0 || u0 >= u1) return;
   int64_t di[RB_MAXTAPS], dj[RB_MAXTAPS], tw[RB_MAXTAPS];
   int ntaps = 0;
   int64_t dimin = 0, dimax = 0, djmin = 0, djmax = 0;
   for (int64_t i = 0; i < P->kh; i++) {
      const int64_t ti = a + P->ph - i * P->dh;
      if (((ti % P->sh) + P->sh) % P->sh) continue;
      for (int64_t j = 0; j < P->kw; j++) {
         const int64_t tj = b + P->pw - j * P->dw;
         if (((tj % P->sw) + P->sw) % P->sw) continue;
         di[ntaps] = floor_div(ti, P->sh);
         dj[ntaps] = floor_div(tj, P->sw);
         /* the backward packing holds tap t' at the flipped position of (i, j) */
         tw[ntaps] = (P->kh - 1 - i) * P->kw + (P->kw - 1 - j);
         if (!ntaps || di[ntaps] < dimin) dimin = di[ntaps];
         if (!ntaps || di[ntaps] > dimax) dimax = di[ntaps];
         if (!ntaps || dj[ntaps] < djmin) djmin = dj[ntaps];
         if (!ntaps || dj[ntaps] > djmax) djmax = dj[ntaps];
         ntaps++;
      }
   }
   const int64_t ostride = P->sw * P->Cout;
   if (ntaps == 0) {
      /* no tap reaches this phase: zeros */
      for (int64_t u = u0; u < u1; u++) {
         float *o = P->dst + ((n * P->dH + u * P->sh + a) * P->dW + b) * P->Cout;
         for (int64_t v = 0; v < nvc; v++) memset(o + v * ostride, 0, (size_t)P->Cout * sizeof(float));
      }
      return;
   }
   const int64_t nrows = (u1 - 1 - u0) + dimax - dimin + 1;
   const int64_t Wph = nvc + djmax - djmin, rowpitch = Wph * CP;
   rb_stage(P, P->src + n * P->sH * P->sW * P->Cin, u0 + dimin, nrows, 1, Wph, -djmin, band);
   int64_t xoff[RB_MAXTAPS], woff[RB_MAXTAPS];
   for (int t = 0; t < ntaps; t++) {
      xoff[t] = (di[t] - dimin) * rowpitch + (dj[t] - djmin) * CP;
      woff[t] = tw[t] * CP * P->OB;
   }
   for (int64_t u = u0; u < u1; u++) {
      float *out = P->dst + ((n * P->dH + u * P->sh + a) * P->dW + b) * P->Cout;
      rb_row(P, band + (u - u0) * rowpitch, xoff, woff, ntaps, taps_all, nvc, out, ostride, acc);
   }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static lm_status rb_run(const rb_prob *P) {
   const int CP = P->CP;
   const int64_t phases = P->transposed ? P->sh * P->sw : 1;
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
   const int64_t maxrows = P->transposed ? rpu + (P->kh - 1) * P->dh / P->sh + 1
                                         : (rpu - 1) * P->sh + (P->kh - 1) * P->dh + 1;
   const int64_t band_elems = (maxrows * (Wpad + 2 * P->sw + (P->kw - 1) * P->dw) * CP + 15) / 16 * 16;
   const size_t per_thread = (size_t)band_elems + RB_MAXPB * RB_PITCH;
   const size_t bytes = (size_t)nthr * per_thread * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *acc = scratch + (size_t)conv_thread_id() * per_thread;
      float *band = acc + RB_MAXPB * RB_PITCH;
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t n = u / (phases * nrb), ph = (u / nrb) % phases, rb = u % nrb;
         const int64_t r0 = rb * rpu, r1 = r0 + rpu < rows_total ? r0 + rpu : rows_total;
         if (r0 >= r1) continue;
         if (P->transposed)
            rb_tr_unit(P, n, ph / P->sw, ph % P->sw, r0, r1 < ceil_div(P->dH - ph / P->sw, P->sh)
                                                         ? r1 : ceil_div(P->dH - ph / P->sw, P->sh),
                       band, acc);
         else
            rb_fwd_unit(P, n, r0, r1, band, acc);
      }
   }
   lm_free(scratch, bytes);
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
   count that pads well (cin: C forward, O backward data), rows wide enough for full blocks */
int lm_conv_rb_usable(const conv_geom *g, int backward_data) {
   if (g->G != 1 || g->kh * g->kw > RB_MAXTAPS) return 0;
   const int64_t cin = backward_data ? g->O : g->C;
   const int64_t cout = backward_data ? g->C : g->O;
   if (rb_cp_index(cin) < 0 || cout <= 0) return 0;
   const int64_t width = backward_data ? g->W : g->Wo;
   if (width < 7 && cin > 1) return 0;
   return 1;
}

lm_status lm_conv_rb_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int relu, float *out) {
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
                g->ph, g->pw, g->dh, g->dw, 0, wp, OB, nob, CP, cpi, bias, res, relu};
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
                g->dh, g->dw, tr, wp, OB, ncb, CP, cpi, NULL, NULL, 0};
   lm_status st = rb_run(&P);
   lm_free(wp, bytes);
   return st;
}
