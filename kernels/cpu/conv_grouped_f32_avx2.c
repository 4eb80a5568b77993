/* conv_grouped_f32_avx2.c -- float32 NHWC convolutions with small groups on AVX2 + FMA
 * ("grouped_avx2"): forward and backward data (any stride, padding, dilation), for
 * groups of 2, 4 or a multiple of 8 output channels (RegNet's group width 8, ResNeXt's 4), and
 * for narrow inputs (groups 1, at most 4 channels: the RGB stems, forward and weight gradient).
 *
 * Why: below AVX-512 a grouped layer went to im2col and one GEMM per group, each a few channels
 * wide (RegNet's 8): on a Zen 3 (2 threads) 208 channels in 26 groups of 8 at 14x14 took 6.4 ms
 * forward against PyTorch's 0.95 (oneDNN's AVX2 kernel), and RegNet's training step read 0.7x
 * PyTorch's.
 *
 * An 8-lane vector holds 8 output channels: one group's (Og a multiple of 8) or 8 / Og whole
 * groups (Og 2 or 4, the weights block-diagonal: zeros where a lane's group does not read the
 * input channel). Its reduction runs over the Cb input channels of those groups, every tap: per
 * input value one broadcast from memory and one FMA, PB = 12 output pixels of a row at a time
 * (12 accumulators, one weight vector load per 12 FMAs). Pixels whose taps leave the image
 * horizontally take a one-pixel loop with the same order of operations (bias, then taps in
 * order, input channels in order), so a pixel's value does not depend on which loop ran it.
 * Residual and activation: conv + bias, + residual, then act_avx2.h's activation (the elementwise
 * ops' at AVX2, ew_act_f32_avx2.c, so fused and unfused agree on this path).
 *
 * A stem (groups 1, C <= 4) is the same loop with one block per 8 output channels over all C
 * input channels; a kernel row's taps and channels are then one contiguous run. Through
 * im2col and the GEMM, MobileNet V3's 8 x 3 x 224 x 224 -> 16 stem (3x3, stride 2) took 3.3-5.0
 * ms forward on a Zen 3 (2 threads), 1.4-1.5 here; with 32 outputs 4.0-5.4 -> 2.4-4.3 (in-process
 * alternations; PyTorch 1.8 for the 16-output one in its profile).
 * Backward data is this forward over grad_out with the flipped kernel (roles of input and output
 * channels swapped, padding d * (k - 1) - p), as grouped_avx512 does; at stride s, one such
 * forward per phase of grad_x (lm_conv_grp_bwdd_nhwc_avx2). The weight gradient: below.
 */
#include "conv_internal.h"
#include "act_avx2.h"
#include "impl.h"
#include <immintrin.h>

enum { G2_PB = 12 };

typedef struct {
   int64_t N, inH, inW, C, outH, outW, O, Cg, Og, kh, kw, sh, sw, ph, pw, dh, dw;
   int64_t Cb, nblk; /* input channels a block, blocks (O / 8) */
   /* where output pixel (n, r, q) goes: pixel (oy0 + r * oys, ox0 + q * oxs) of an oH x oW map
      (the identity for a forward; one phase of a strided grad_x, lm_conv_grp_bwdd_nhwc_avx2) */
   int64_t oH, oW, oy0, oys, ox0, oxs;
} g2;

static int g2_og_ok(int64_t Og) { return Og == 2 || Og == 4 || (Og > 0 && Og % 8 == 0); }
static int64_t g2_cb(int64_t Cg, int64_t Og) { return Og >= 8 ? Cg : (8 / Og) * Cg; }

int lm_conv_grp_avx2_usable(const conv_geom *g, int pass) {
   /* groups 1 only for narrow inputs (an RGB stem): a block's reduction is then the whole
      input, and wider dense layers are the GEMM's */
   if ((g->G <= 1 && g->C > 4) || g->O % 8 || !g2_og_ok(g->Og) || g2_cb(g->Cg, g->Og) > 64)
      return 0;
   if (g->ph < 0 || g->pw < 0 || g->kh * g->kw > 64) return 0;
   if (g->N * g->Ho * g->Wo <= 0 || g->H * g->W <= 0) return 0;
   if (pass == 1) { /* the forward over grad_out: input and output channels swap roles */
      if (g->sh < 1 || g->sw < 1 || g->sh > 8 || g->sw > 8) return 0;
      if (g->C % 8 || !g2_og_ok(g->Cg) || g2_cb(g->Og, g->Cg) > 64) return 0;
   }
   return 1;
}

/* packed weights wp[b][t][c][8]: lane l of block b is output channel o = 8b + l, input channel
   c of the block is channel (8b / Og) * Cg + c. tmap NULL: a forward, w is (O, taps, Cg). Else
   backward data: the problem's output channels are the forward's input channels, tap t is the
   forward's tap tmap[t], w is the forward's (O_f, ftaps, Cg_f) with Cg_f = p->Og, Og_f = p->Cg
   (grouped_avx512's pack_w, 8 lanes). */
static void g2_pack(const g2 *p, const float *w, const int64_t *tmap, int64_t ftaps, float *wp) {
   const int64_t taps = p->kh * p->kw, Cb = p->Cb, Cg = p->Cg, Og = p->Og;
   memset(wp, 0, (size_t)(p->nblk * taps * Cb * 8) * sizeof(float));
   for (int64_t o = 0; o < p->O; o++) {
      const int64_t b = o / 8, l = o % 8, grp = o / Og;
      const int64_t c0 = grp * Cg - (8 * b / Og) * Cg; /* the group's first channel in the block */
      for (int64_t t = 0; t < taps; t++) {
         float *d = wp + ((b * taps + t) * Cb + c0) * 8 + l;
         for (int64_t cl = 0; cl < Cg; cl++)
            d[cl * 8] = tmap ? w[((grp * Cg + cl) * ftaps + tmap[t]) * Og + o % Og]
                             : w[(o * taps + t) * Cg + cl];
      }
   }
}

/* PB pixels of output row (n, ho) from column q0, block b, every tap inside the row's width */
static inline __attribute__((always_inline)) void
g2_tile(const g2 *p, const float *in, const float *wb, __m256 bv, int64_t n, int64_t ho,
        int64_t q0, __m256 *acc, const int PB) {
   const int64_t taps = p->kh * p->kw, Cb = p->Cb, xs = p->sw * p->C;
   /* the sums in a local array, copied to acc at the end: summed in acc itself, gcc stored
      every accumulator back to the caller's stack array after each FMA (12 stores a step: the
      forward ran at half the speed of PyTorch's, 8 x 104 x 28 x 28 in groups of 8, Zen 3) */
   __m256 a[G2_PB];
#pragma GCC unroll 12
   for (int q = 0; q < PB; q++) a[q] = bv;
   for (int64_t i = 0; i < p->kh; i++) {
      const int64_t hi = ho * p->sh - p->ph + i * p->dh;
      if (hi < 0 || hi >= p->inH) continue;
      const float *xr = in + ((n * p->inH + hi) * p->inW + q0 * p->sw - p->pw) * p->C;
      if (p->dw == 1 && Cb == p->C) {
         /* groups 1 (a narrow input: an RGB stem): a kernel row's taps and channels are one
            run of kw * C values in the input row and in the packed weights */
         const float *wt = wb + i * p->kw * Cb * 8;
         for (int64_t c = 0; c < p->kw * Cb; c++) {
            const __m256 wv = _mm256_loadu_ps(wt + c * 8);
#pragma GCC unroll 12
            for (int q = 0; q < PB; q++)
               a[q] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr + q * xs + c), wv, a[q]);
         }
         continue;
      }
      for (int64_t j = 0; j < p->kw; j++) {
         const float *xt = xr + j * p->dw * p->C;
         const float *wt = wb + (i * p->kw + j) * Cb * 8;
         for (int64_t c = 0; c < Cb; c++) {
            const __m256 wv = _mm256_loadu_ps(wt + c * 8);
#pragma GCC unroll 12
            for (int q = 0; q < PB; q++)
               a[q] = _mm256_fmadd_ps(_mm256_broadcast_ss(xt + q * xs + c), wv, a[q]);
         }
      }
   }
#pragma GCC unroll 12
   for (int q = 0; q < PB; q++) acc[q] = a[q];
   (void)taps;
}

/* one output pixel (n, ho, q), block b, taps checked */
static __m256 g2_pixel(const g2 *p, const float *in, const float *wb, __m256 bv, int64_t n,
                       int64_t ho, int64_t q) {
   const int64_t Cb = p->Cb;
   __m256 a = bv;
   for (int64_t i = 0; i < p->kh; i++) {
      const int64_t hi = ho * p->sh - p->ph + i * p->dh;
      if (hi < 0 || hi >= p->inH) continue;
      for (int64_t j = 0; j < p->kw; j++) {
         const int64_t wi = q * p->sw - p->pw + j * p->dw;
         if (wi < 0 || wi >= p->inW) continue;
         const float *xt = in + ((n * p->inH + hi) * p->inW + wi) * p->C;
         const float *wt = wb + (i * p->kw + j) * Cb * 8;
         for (int64_t c = 0; c < Cb; c++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(xt + c), _mm256_loadu_ps(wt + c * 8), a);
      }
   }
   return a;
}

static lm_status g2_forward(const g2 *p, const float *in, const float *w, const int64_t *tmap,
                            int64_t ftaps, const float *bias, const float *res, int act,
                            float *out) {
   const int64_t taps = p->kh * p->kw;
   const size_t wbytes = (size_t)(p->nblk * taps * p->Cb * 8) * sizeof(float);
   float *wp = lm_alloc(wbytes);
   if (!wp) return LM_ERR_OOM;
   g2_pack(p, w, tmap, ftaps, wp);
   /* columns [qa, qb) have every tap inside the row: qa * sw >= pw and
      (q - 1) * sw - pw + (kw - 1) * dw < inW for q < qb */
   int64_t qa = p->pw <= 0 ? 0 : (p->pw + p->sw - 1) / p->sw, qb = p->outW;
   while (qb > qa && (qb - 1) * p->sw - p->pw + (p->kw - 1) * p->dw >= p->inW) qb--;
   if (qa > p->outW) qa = p->outW;
   const int64_t ox = p->oxs * p->O; /* output pixel step */
   const int64_t rows = p->N * p->outH;
   const int nthr = conv_threads((double)rows * (double)p->outW * (double)p->O *
                                 (double)(taps * p->Cb));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / p->outH, ho = row % p->outH;
      const int64_t obase = ((n * p->oH + p->oy0 + ho * p->oys) * p->oW + p->ox0) * p->O;
      float *orow = out + obase;
      const float *rrow = res ? res + obase : NULL;
      /* pixels outer, blocks inner: a tile's input pixels stay in L1 while the blocks take
         their turns (blocks outer re-read the kernel's input rows from L2 once a block) */
#define G2_BLOCK_ARGS(b)                                                                          \
   const float *wb = wp + (b) * taps * p->Cb * 8;                                                 \
   const float *inb = in + (8 * (b) / p->Og) * p->Cg; /* the block's first input channel */      \
   const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * (b)) : _mm256_setzero_ps()
      int64_t q = 0;
      for (; q < qa && q < p->outW; q++)
         for (int64_t b = 0; b < p->nblk; b++) {
            G2_BLOCK_ARGS(b);
            lm_act_store8(g2_pixel(p, inb, wb, bv, n, ho, q), orow + q * ox + 8 * b,
                     rrow ? rrow + q * ox + 8 * b : NULL, act);
         }
      /* interior pixels in tiles of 12, then 4, then 1 (no tap checks) */
      for (int pb = G2_PB; pb >= 1; pb = pb == G2_PB ? 4 : pb == 4 ? 1 : 0) {
         for (; q + pb <= qb; q += pb) {
            for (int64_t b = 0; b < p->nblk; b++) {
               G2_BLOCK_ARGS(b);
               __m256 acc[G2_PB];
               if (pb == G2_PB) g2_tile(p, inb, wb, bv, n, ho, q, acc, G2_PB);
               else if (pb == 4) g2_tile(p, inb, wb, bv, n, ho, q, acc, 4);
               else g2_tile(p, inb, wb, bv, n, ho, q, acc, 1);
               for (int k = 0; k < pb; k++)
                  lm_act_store8(acc[k], orow + (q + k) * ox + 8 * b,
                           rrow ? rrow + (q + k) * ox + 8 * b : NULL, act);
            }
         }
      }
      for (; q < p->outW; q++)
         for (int64_t b = 0; b < p->nblk; b++) {
            G2_BLOCK_ARGS(b);
            lm_act_store8(g2_pixel(p, inb, wb, bv, n, ho, q), orow + q * ox + 8 * b,
                     rrow ? rrow + q * ox + 8 * b : NULL, act);
         }
#undef G2_BLOCK_ARGS
   }
   lm_free(wp, wbytes);
   return LM_OK;
}

static void g2_init(g2 *p, int64_t N, int64_t inH, int64_t inW, int64_t C, int64_t outH,
                    int64_t outW, int64_t O, int64_t Cg, int64_t Og, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
   const g2 q = {N,  inH, inW, C,  outH, outW, O,  Cg, Og,   kh,   kw, sh, sw,
                 ph, pw,  dh,  dw, g2_cb(Cg, Og), O / 8, outH, outW, 0, 1, 0, 1};
   *p = q;
}

lm_status lm_conv_grp_fwd_nhwc_avx2(const conv_geom *g, const float *x, const float *w,
                                    const float *bias, const float *res, int act, float *out) {
   g2 p;
   g2_init(&p, g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->O, g->Cg, g->Og, g->kh, g->kw, g->sh,
           g->sw, g->ph, g->pw, g->dh, g->dw);
   return g2_forward(&p, x, w, NULL, g->kh * g->kw, bias, res, act, out);
}

static int64_t g2_gcd(int64_t a, int64_t b) {
   while (b) {
      const int64_t t = a % b;
      a = b, b = t;
   }
   return a;
}

/* The taps of one phase of a strided grad_x along one axis: input positions x = a + r * s take
   grad_out positions (x + p - i * d) / s of the forward taps i with (a + p - i * d) % s == 0.
   With the valid taps i_0 < i_1 < ... (a step of s / gcd(s, d) apart) that is grad_out position
   r + e_k, e_k = (a + p - i_k * d) / s falling by d / gcd(s, d) a tap: a stride-1 correlation over
   grad_out with padding -e_last, dilation d / gcd and taps in reverse order (tap t is i_{n-1-t}).
   Returns the tap count n (0: the phase takes no tap), fills fi[t] = i_{n-1-t}, *pad, *dil. */
static int64_t g2_phase_taps(int64_t a, int64_t s, int64_t p, int64_t d, int64_t k, int64_t *fi,
                             int64_t *pad, int64_t *dil) {
   int64_t n = 0, last = 0;
   for (int64_t i = k - 1; i >= 0; i--) /* descending i: ascending offset */
      if (((a + p - i * d) % s + s) % s == 0) {
         if (n == 0) last = (a + p - i * d) / s; /* exact: the division has no remainder */
         fi[n++] = i;
      }
   *pad = -last;
   *dil = d / g2_gcd(s, d);
   return n;
}

/* grad_x: at stride 1 this forward over grad_out with the flipped kernel (roles of input and
   output channels swapped, padding d * (k - 1) - p), as grouped_avx512 does; at stride s the
   same per phase (the s_h x s_w classes of grad_x pixels by position modulo the stride, each a
   stride-1 problem over grad_out with the taps that reach it, g2_phase_taps), written into
   every s-th pixel. A phase no tap reaches is zero. Below AVX-512 a strided grouped grad_x went
   to col2im with one GEMM a group of 8 columns: RegNet's 48 channels in groups of 8 at 112x112,
   stride 2, took 19 ms of its training step on a Zen 3 (2 threads). By phases, grad_x alone
   (forward and grad_x less forward, PyTorch in the same minutes): 8 x 48 x 112 x 112 5.2-5.8 ms
   (PyTorch 4.9-5.7), 8 x 104 x 56 x 56 2.7-2.9 (3.9-4.4). */
lm_status lm_conv_grp_bwdd_nhwc_avx2(const conv_geom *g, const float *gout, const float *w,
                                     float *gx) {
   const int64_t ftaps = g->kh * g->kw, sh = g->sh, sw = g->sw;
   int64_t tmap[64], ih[64], iw[64];
   if (ftaps > 64 || sh < 1 || sw < 1) return LM_ERR_INTERNAL;
   for (int64_t a = 0; a < sh && a < g->H; a++)
      for (int64_t b = 0; b < sw && b < g->W; b++) {
         int64_t ph, pw, dh, dw;
         const int64_t nh = g2_phase_taps(a, sh, g->ph, g->dh, g->kh, ih, &ph, &dh);
         const int64_t nw = g2_phase_taps(b, sw, g->pw, g->dw, g->kw, iw, &pw, &dw);
         const int64_t Hr = (g->H - a + sh - 1) / sh, Wr = (g->W - b + sw - 1) / sw;
         if (nh == 0 || nw == 0) { /* no tap reaches these pixels */
            for (int64_t n = 0; n < g->N; n++)
               for (int64_t r = 0; r < Hr; r++)
                  for (int64_t q = 0; q < Wr; q++)
                     memset(gx + ((n * g->H + a + r * sh) * g->W + b + q * sw) * g->C, 0,
                            (size_t)g->C * sizeof(float));
            continue;
         }
         g2 p;
         g2_init(&p, g->N, g->Ho, g->Wo, g->O, Hr, Wr, g->C, g->Og, g->Cg, nh, nw, 1, 1, ph, pw,
                 dh, dw);
         p.oH = g->H, p.oW = g->W, p.oy0 = a, p.oys = sh, p.ox0 = b, p.oxs = sw;
         for (int64_t ti = 0; ti < nh; ti++)
            for (int64_t tj = 0; tj < nw; tj++) tmap[ti * nw + tj] = ih[ti] * g->kw + iw[tj];
         const lm_status st = g2_forward(&p, gout, w, tmap, ftaps, NULL, NULL, 0, gx);
         if (st != LM_OK) return st;
      }
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * weight and bias gradients. Block b (8 output channels, the vector's lanes) holds, per tap t
 * and block input channel c, the sum over every output pixel of grad_out[p][o] * x[p + t][c]:
 * lanes whose group does not read c stay out of gw. Per block (a thread's work item: the sums
 * and their order do not depend on the thread count), per output row, kernel tap and chunk of
 * up to 12 input channels, the chunk's sums in registers over the pixels whose tap lies inside
 * the input row (gw2_run), one grad_out load per chunk and pixel, then added to the block's
 * sums in order. (In chunks that mixed taps, with a runtime length, gcc kept the sums and their
 * offsets in memory: 8 x 104 x 28 x 28 in groups of 8 took 2.5 ms against PyTorch's 1.3.)
 */

/* NC sums over nq pixels: d[k][8] += sum_q x[q * xs + k] (broadcast) * g[q * gs] (8 lanes), in
   pixel order; NC a constant once inlined, so the sums stay in registers (with a runtime count
   and an offset table, gcc kept both in memory: 4 memory operations an FMA) */
static inline __attribute__((always_inline)) void gw2_run(const float *x, const float *g,
                                                          int64_t nq, int64_t xs, int64_t gs,
                                                          float *d, const int NC) {
   __m256 a[12];
#pragma GCC unroll 12
   for (int k = 0; k < NC; k++) a[k] = _mm256_setzero_ps();
   for (int64_t q = 0; q < nq; q++) {
      const __m256 gv = _mm256_loadu_ps(g + q * gs);
      const float *xq = x + q * xs;
#pragma GCC unroll 12
      for (int k = 0; k < NC; k++) a[k] = _mm256_fmadd_ps(_mm256_broadcast_ss(xq + k), gv, a[k]);
   }
#pragma GCC unroll 12
   for (int k = 0; k < NC; k++)
      _mm256_storeu_ps(d + k * 8, _mm256_add_ps(_mm256_loadu_ps(d + k * 8), a[k]));
}

int lm_conv_grp_avx2_bwdw_usable(const conv_geom *g) {
   return lm_conv_grp_avx2_usable(g, 0) && g->kw * g2_cb(g->Cg, g->Og) <= 4096;
}

lm_status lm_conv_grp_bwdw_nhwc_avx2(const conv_geom *g, const float *x, const float *gout,
                                     float *gw, float *gb) {
   g2 P;
   g2_init(&P, g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->O, g->Cg, g->Og, g->kh, g->kw, g->sh,
           g->sw, g->ph, g->pw, g->dh, g->dw);
   const g2 *p = &P;
   const int64_t taps = p->kh * p->kw, Cb = p->Cb, kw = p->kw;
   const int64_t per = (taps * Cb + 1) * 8; /* a block's sums: [t][c][8], then the bias's */
   const size_t bytes = (size_t)(p->nblk * per) * sizeof(float);
   float *sums = lm_alloc(bytes);
   if (!sums) return LM_ERR_OOM;
   memset(sums, 0, bytes);
   const int64_t rows = p->N * p->outH;
   const int nthr = conv_threads((double)rows * (double)p->outW * (double)p->O * (double)(taps * Cb));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t b = 0; b < p->nblk; b++) {
      float *sb = sums + b * per;
      const float *xb = x + (8 * b / p->Og) * p->Cg, *gyb = gout + 8 * b;
      __m256 bs = _mm256_setzero_ps();
      for (int64_t row = 0; row < rows; row++) {
         const int64_t n = row / p->outH, ho = row % p->outH;
         const float *gr = gyb + row * p->outW * p->O;
         if (gb) {
            __m256 s = _mm256_setzero_ps();
            for (int64_t q = 0; q < p->outW; q++)
               s = _mm256_add_ps(s, _mm256_loadu_ps(gr + q * p->O));
            bs = _mm256_add_ps(bs, s);
         }
         if (!gw) continue;
         for (int64_t i = 0; i < p->kh; i++) {
            const int64_t hi = ho * p->sh - p->ph + i * p->dh;
            if (hi < 0 || hi >= p->inH) continue;
            const float *xr = xb + (n * p->inH + hi) * p->inW * p->C;
            /* per tap j of the row, its Cb sums NC at a time over the pixels whose tap is
               inside the row (a q range: no test per pixel), then added to the block's sums */
            for (int64_t jt = 0; jt < kw; jt++) {
               /* q with 0 <= q * sw - pw + jt * dw < inW */
               const int64_t lo = p->pw - jt * p->dw, hi_ = p->inW + p->pw - jt * p->dw;
               int64_t qlo = lo <= 0 ? 0 : (lo + p->sw - 1) / p->sw;
               int64_t qhi = hi_ <= 0 ? 0 : (hi_ + p->sw - 1) / p->sw;
               if (qhi > p->outW) qhi = p->outW;
               if (qlo > qhi) qlo = qhi;
               const float *xj = xr + (qlo * p->sw - p->pw + jt * p->dw) * p->C;
               const float *gq = gr + qlo * p->O;
               float *dj = sb + ((i * kw + jt) * Cb) * 8;
               for (int64_t c0 = 0; c0 < Cb;) {
                  const int64_t left = Cb - c0;
                  const int nc = left >= 12  ? 12
                                 : left >= 8 ? 8
                                 : left >= 4 ? 4
                                 : left >= 2 ? 2
                                             : 1;
                  const float *xc = xj + c0;
                  float *dc = dj + c0 * 8;
                  const int64_t nq = qhi - qlo, xs = p->sw * p->C;
                  switch (nc) {
                  case 12: gw2_run(xc, gq, nq, xs, p->O, dc, 12); break;
                  case 8: gw2_run(xc, gq, nq, xs, p->O, dc, 8); break;
                  case 4: gw2_run(xc, gq, nq, xs, p->O, dc, 4); break;
                  case 2: gw2_run(xc, gq, nq, xs, p->O, dc, 2); break;
                  default: gw2_run(xc, gq, nq, xs, p->O, dc, 1); break;
                  }
                  c0 += nc;
               }
            }
         }
      }
      _mm256_storeu_ps(sb + taps * Cb * 8, bs);
   }
   /* gw[o][t][cl] from lane o % 8 of block o / 8, input channel (group - first group) Cg + cl */
   for (int64_t o = 0; o < p->O; o++) {
      const int64_t b = o / 8, l = o % 8, grp = o / p->Og;
      const int64_t c0 = grp * p->Cg - (8 * b / p->Og) * p->Cg;
      const float *sb = sums + b * per;
      if (gw)
         for (int64_t t = 0; t < taps; t++)
            for (int64_t cl = 0; cl < p->Cg; cl++)
               gw[(o * taps + t) * p->Cg + cl] = sb[(t * Cb + c0 + cl) * 8 + l];
      if (gb) gb[o] = sb[taps * Cb * 8 + l];
   }
   lm_free(sums, bytes);
   return LM_OK;
}
