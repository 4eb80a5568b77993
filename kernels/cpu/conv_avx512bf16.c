/* conv_avx512bf16.c -- bfloat16 NHWC convolution kernels for AVX-512 with AVX512_BF16
 * (vdpbf16ps): forward and backward data, groups 1. Registered (through conv.c) only when
 * lm_cpu_isa() >= LM_ISA_AVX512_BF16; everything else (float16, NCHW, groups > 1, the weight
 * gradient) takes conv.c's float32 fallback.
 *
 * Implicit GEMM over channel PAIRS. vdpbf16ps adds a0*b0 + a1*b1 to each float32 lane, over a
 * pair of consecutive reduction elements held in one 32-bit word. In NHWC the input channels
 * (2p, 2p+1) of a pixel are one such word, broadcast straight from the activations (no im2col),
 * and the weights are packed once per call, pair-interleaved:
 *   wk[ob][tap][p][o] = { w[ob*32+o][tap][2p], w[ob*32+o][tap][2p+1] }   (32-bit words)
 * channels padded to even with zeros, blocks of OB = 32 output channels (2 zmm).
 *
 * The input is "staged" once per call into a zero-padded copy (NHWC, channels padded to even)
 * unless it needs no padding at all (then it is read in place), so every tap of every output
 * pixel reads valid memory. When the kernel's taps along W are adjacent (dilation 1 along W) the
 * kw taps of a kernel row read one contiguous run of kw*C/2 words, reduced in one go.
 *
 * Micro-kernel: PB <= 14 output pixels of one output row x 32 output channels = 28 zmm
 * float32 accumulators, the whole reduction (taps x pairs) in registers; per channel pair 2
 * weight loads and PB broadcasts feed 2*PB vdpbf16ps. Epilogue: bias (float32), residual (bf16),
 * ReLU, one rounding to bf16 (vcvtneps2bf16: round to nearest even), masked stores for the last
 * channel block. Work units: (channel block, image row) pairs, split statically over the threads
 * (the same reduction order for every thread count, so results do not vary).
 *
 * Backward data: grad_x = the transposed convolution of grad_out. Split grad_x into
 * sh x sw phases (rows h = a + u*sh); inside a phase every pixel uses the same taps (those with
 * (a + ph - i*dh) divisible by sh), at grad_out row u + (a + ph - i*dh)/sh: a dense direct
 * convolution of grad_out with a subset of the (transposed: O <-> C) weights, through the same
 * micro-kernel, written into grad_x with a pixel step of (sh, sw). No zero-inserted work, no
 * scatter; a phase without taps writes zeros. Stride 1 is the single phase.
 */
#include "conv_internal.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { OB = 32, PBMAX = 14, MAXTAPS = 1024 };

/* the engine: output pixels (n, u, v), u < Ho, v < Wo; pixel (n, u, v) reads tap t's run of R
   words at x + n*ximg + u*xrow + v*xcol + xoff[t], with weights wk + ob*wob + widx[t]*R*OB */
typedef struct {
   int64_t N, Ho, Wo;
   const uint32_t *x;
   int64_t ximg, xrow, xcol;
   int ntap;
   const int64_t *xoff, *widx;
   int64_t R;
   const uint32_t *wk;
   int64_t wob;
   int64_t O;                       /* real output channels (the channel stride of out / res) */
   uint16_t *out;
   const uint16_t *res;             /* same addressing as out, or NULL */
   int64_t obase, oimg, orow, ocol; /* in elements */
   const float *bias;
   int relu;
} bf_eng;

/* a 32-bit word that may be only 2-byte aligned (an input read in place at an odd offset) */
AI int ld32(const uint32_t *p) {
   int v;
   memcpy(&v, p, 4);
   return v;
}

AI __m512 widen_bf16(__m256i h) {
   return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* PB pixels (pixel k at xb + k*xcol) x 32 output channels */
AI void bf_tile(const bf_eng *e, const uint32_t *xb, const uint32_t *wob, uint16_t *o,
                const uint16_t *r, const float *bias, __mmask16 m0, __mmask16 m1, const int PB) {
   __m512 acc[PBMAX][2];
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
   const int64_t xc = e->xcol, R = e->R;
   for (int t = 0; t < e->ntap; t++) {
      const uint32_t *xp = xb + e->xoff[t];
      const uint32_t *wt = wob + e->widx[t] * R * OB;
      for (int64_t q = 0; q < R; q++) {
         const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wt);
         const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wt + 16);
#pragma GCC unroll 14
         for (int k = 0; k < PB; k++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32(ld32(xp + k * xc));
            acc[k][0] = _mm512_dpbf16_ps(acc[k][0], b, w0);
            acc[k][1] = _mm512_dpbf16_ps(acc[k][1], b, w1);
         }
         xp++;
         wt += OB;
      }
   }
   __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
   if (bias) {
      b0 = _mm512_maskz_loadu_ps(m0, bias);
      b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
   }
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) {
      __m512 a0 = _mm512_add_ps(acc[k][0], b0), a1 = _mm512_add_ps(acc[k][1], b1);
      uint16_t *ok = o + k * e->ocol;
      if (r) {
         const uint16_t *rk = r + k * e->ocol;
         a0 = _mm512_add_ps(a0, widen_bf16(_mm256_maskz_loadu_epi16(m0, rk)));
         a1 = _mm512_add_ps(a1, widen_bf16(_mm256_maskz_loadu_epi16(m1, rk + 16)));
      }
      if (e->relu) {
         a0 = _mm512_max_ps(a0, _mm512_setzero_ps());
         a1 = _mm512_max_ps(a1, _mm512_setzero_ps());
      }
      _mm256_mask_storeu_epi16(ok, m0, (__m256i)_mm512_cvtneps_pbh(a0));
      _mm256_mask_storeu_epi16(ok + 16, m1, (__m256i)_mm512_cvtneps_pbh(a1));
   }
}

#define TILE_CASE(n)                                                                             \
   case n: bf_tile(e, xb, wob, o, r, bias, m0, m1, n); break;

static void bf_row(const bf_eng *e, int64_t ob, int64_t n, int64_t u) {
   const int64_t c0 = ob * OB, nv = e->O - c0 < OB ? e->O - c0 : OB;
   const __mmask16 m0 = nv >= 16 ? 0xffff : (__mmask16)((1u << nv) - 1);
   const __mmask16 m1 = nv >= 32 ? 0xffff : nv <= 16 ? 0 : (__mmask16)((1u << (nv - 16)) - 1);
   const uint32_t *wob = e->wk + ob * e->wob;
   const float *bias = e->bias ? e->bias + c0 : NULL;
   for (int64_t v = 0; v < e->Wo; v += PBMAX) {
      const int pb = e->Wo - v < PBMAX ? (int)(e->Wo - v) : PBMAX;
      const uint32_t *xb = e->x + n * e->ximg + u * e->xrow + v * e->xcol;
      const int64_t oo = e->obase + n * e->oimg + u * e->orow + v * e->ocol + c0;
      uint16_t *o = e->out + oo;
      const uint16_t *r = e->res ? e->res + oo : NULL;
      switch (pb) {
         TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
         TILE_CASE(7) TILE_CASE(8) TILE_CASE(9) TILE_CASE(10) TILE_CASE(11) TILE_CASE(12)
         TILE_CASE(13) TILE_CASE(14)
         default: break;
      }
   }
}

static void bf_run(const bf_eng *e) {
   const int64_t nob = (e->O + OB - 1) / OB, rows = e->N * e->Ho;
   const double work = (double)rows * (double)e->Wo * (double)e->O * (double)e->R * e->ntap;
   const int nthr = conv_threads(work);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t ob = 0; ob < nob; ob++)
      for (int64_t row = 0; row < rows; row++) bf_row(e, ob, row / e->Ho, row % e->Ho);
}

/* ---------------------------------------------------------------------------------------------
 * packing and staging
 */

/* weights: wk[ob][tap][p][o] words for Oo output channels and Cr reduction channels (P2 =
   ceil(Cr/2) pairs), from w of shape (O, kh, kw, C) (channels-last weights, groups 1). transposed
   (backward data): output channel o' = input channel c of w, reduction channel c' = output
   channel o of w, tap (i, j) unchanged */
static uint32_t *pack_weights(const conv_geom *g, const uint16_t *w, int transposed, int64_t *wob,
                              size_t *bytes) {
   const int64_t Oo = transposed ? g->C : g->O, Cr = transposed ? g->O : g->C;
   const int64_t P2 = (Cr + 1) / 2, T = g->kh * g->kw, nob = (Oo + OB - 1) / OB;
   *wob = T * P2 * OB;
   *bytes = (size_t)(nob * *wob) * 4;
   uint32_t *wk = lm_alloc(*bytes);
   if (!wk) return NULL;
   const int64_t C = g->C, O = g->O;
   const int nthr = conv_threads((double)nob * (double)*wob * 4);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t ob = 0; ob < nob; ob++)
      for (int64_t t = 0; t < T; t++) {
         uint32_t *dst = wk + ob * *wob + t * P2 * OB;
         for (int64_t o = 0; o < OB; o++) {
            const int64_t og = ob * OB + o;
            for (int64_t p = 0; p < P2; p++) {
               uint32_t lo = 0, hi = 0;
               if (og < Oo) {
                  const int64_t c0 = 2 * p, c1 = 2 * p + 1;
                  if (!transposed) {
                     const uint16_t *src = w + (og * T + t) * C;
                     lo = src[c0];
                     hi = c1 < C ? src[c1] : 0;
                  } else { /* w[c'][t][og] */
                     lo = w[(c0 * T + t) * C + og];
                     hi = c1 < O ? w[(c1 * T + t) * C + og] : 0;
                  }
               }
               dst[p * OB + o] = lo | hi << 16;
            }
         }
      }
   return wk;
}

/* staged input: dst[n][r][c][p] (Hp x Wp pixels of P2 words) = the channel pair (2p, 2p+1) of
   src[n][r - pt][c - pl] (N x Hs x Ws x C, NHWC), zero outside src and for the odd channel */
static void stage(const uint16_t *src, int64_t N, int64_t Hs, int64_t Ws, int64_t C, int64_t pt,
                  int64_t pl, int64_t Hp, int64_t Wp, uint32_t *dst) {
   const int64_t P2 = (C + 1) / 2;
   const int nthr = conv_threads((double)N * Hp * Wp * P2);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t nr = 0; nr < N * Hp; nr++) {
      const int64_t n = nr / Hp, r = nr % Hp, hs = r - pt;
      uint32_t *d = dst + nr * Wp * P2;
      if (hs < 0 || hs >= Hs) {
         memset(d, 0, (size_t)(Wp * P2) * 4);
         continue;
      }
      const uint16_t *s = src + (n * Hs + hs) * Ws * C;
      for (int64_t c = 0; c < Wp; c++) {
         const int64_t ws = c - pl;
         uint32_t *dc = d + c * P2;
         if (ws < 0 || ws >= Ws) {
            memset(dc, 0, (size_t)P2 * 4);
         } else if (!(C & 1)) {
            memcpy(dc, s + ws * C, (size_t)C * 2);
         } else {
            const uint16_t *sc = s + ws * C;
            for (int64_t p = 0; p < P2; p++)
               dc[p] = (uint32_t)sc[2 * p] | (2 * p + 1 < C ? (uint32_t)sc[2 * p + 1] << 16 : 0);
         }
      }
   }
}

/* the input as the engine reads it: in place (need no padding, even C) or staged with padding
   pt/pl (may be negative: rows / columns skipped) so rows [lo_r, hi_r] (relative to row 0 of the
   staged map, after padding) exist; returns NULL on OOM */
typedef struct {
   const uint32_t *x;
   uint32_t *buf;
   size_t bytes;
   int64_t img, wp; /* words per image, pixels per row */
} staged;

static int stage_input(const uint16_t *src, int64_t N, int64_t Hs, int64_t Ws, int64_t C,
                       int64_t pt, int64_t pl, int64_t Hp, int64_t Wp, staged *s) {
   const int64_t P2 = (C + 1) / 2;
   s->buf = NULL;
   s->bytes = 0;
   if (!(C & 1) && pt == 0 && pl == 0 && Hp <= Hs && Wp <= Ws) {
      s->x = (const uint32_t *)src;
      s->img = Hs * Ws * P2;
      s->wp = Ws;
      return 1;
   }
   s->bytes = (size_t)(N * Hp * Wp * P2 + 16) * 4;
   s->buf = lm_alloc(s->bytes);
   if (!s->buf) return 0;
   stage(src, N, Hs, Ws, C, pt, pl, Hp, Wp, s->buf);
   s->x = s->buf;
   s->img = Hp * Wp * P2;
   s->wp = Wp;
   return 1;
}

/* ---------------------------------------------------------------------------------------------
 * entry points (conv_internal.h)
 */
int lm_conv_bf16_usable(const conv_geom *g, int backward_data) {
   (void)backward_data;
   if (!conv_env_on("LUMEN_CONV_BF16")) return 0;
   return g->G == 1 && g->K > 0 && g->O > 0 && g->C > 0 && g->kh * g->kw <= MAXTAPS;
}

lm_status lm_conv_fwd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                                      const float *bias, const uint16_t *res, int relu,
                                      uint16_t *out) {
   const int64_t P2 = (g->C + 1) / 2;
   int64_t wob;
   size_t wbytes;
   uint32_t *wk = pack_weights(g, w, 0, &wob, &wbytes);
   if (!wk) return LM_ERR_OOM;
   const int64_t Hp = (g->Ho - 1) * g->sh + g->dh * (g->kh - 1) + 1;
   const int64_t Wp = (g->Wo - 1) * g->sw + g->dw * (g->kw - 1) + 1;
   staged s;
   if (!stage_input(x, g->N, g->H, g->W, g->C, g->ph, g->pw, Hp, Wp, &s)) {
      lm_free(wk, wbytes);
      return LM_ERR_OOM;
   }
   int64_t xoff[MAXTAPS], widx[MAXTAPS];
   bf_eng e;
   e.R = P2;
   e.ntap = 0;
   if (g->dw == 1) { /* a kernel row's taps read one run of kw*P2 words */
      e.R = g->kw * P2;
      for (int64_t i = 0; i < g->kh; i++) {
         xoff[e.ntap] = i * g->dh * s.wp * P2;
         widx[e.ntap++] = i;
      }
   } else {
      for (int64_t i = 0; i < g->kh; i++)
         for (int64_t j = 0; j < g->kw; j++) {
            xoff[e.ntap] = (i * g->dh * s.wp + j * g->dw) * P2;
            widx[e.ntap++] = i * g->kw + j;
         }
   }
   e.N = g->N, e.Ho = g->Ho, e.Wo = g->Wo;
   e.x = s.x, e.ximg = s.img, e.xrow = g->sh * s.wp * P2, e.xcol = g->sw * P2;
   e.xoff = xoff, e.widx = widx;
   e.wk = wk, e.wob = wob;
   e.O = g->O;
   e.out = out, e.res = res;
   e.obase = 0, e.oimg = g->Ho * g->Wo * g->O, e.orow = g->Wo * g->O, e.ocol = g->O;
   e.bias = bias, e.relu = relu;
   bf_run(&e);
   if (s.buf) lm_free(s.buf, s.bytes);
   lm_free(wk, wbytes);
   return LM_OK;
}

/* floor division for a possibly negative numerator */
static inline int64_t fdiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

lm_status lm_conv_bwdd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *gout,
                                       const uint16_t *w, uint16_t *gx) {
   const int64_t P2 = (g->O + 1) / 2;
   const int64_t sh = g->sh, sw = g->sw;
   /* grad_out rows read by phase a, tap i: u + (a + ph - i*dh)/sh for u < ceil((H - a)/sh);
      the extremes over all phases and taps give the staging's padding */
   int64_t rlo = 0, rhi = g->Ho - 1, clo = 0, chi = g->Wo - 1;
   for (int64_t a = 0; a < sh && a < g->H; a++)
      for (int64_t i = 0; i < g->kh; i++) {
         const int64_t q = a + g->ph - i * g->dh;
         if (q - fdiv(q, sh) * sh) continue;
         const int64_t d = q / sh, nu = (g->H - a + sh - 1) / sh;
         if (d < rlo) rlo = d;
         if (nu - 1 + d > rhi) rhi = nu - 1 + d;
      }
   for (int64_t b = 0; b < sw && b < g->W; b++)
      for (int64_t j = 0; j < g->kw; j++) {
         const int64_t q = b + g->pw - j * g->dw;
         if (q - fdiv(q, sw) * sw) continue;
         const int64_t d = q / sw, nv = (g->W - b + sw - 1) / sw;
         if (d < clo) clo = d;
         if (nv - 1 + d > chi) chi = nv - 1 + d;
      }
   int64_t wob;
   size_t wbytes;
   uint32_t *wk = pack_weights(g, w, 1, &wob, &wbytes);
   if (!wk) return LM_ERR_OOM;
   staged s;
   if (!stage_input(gout, g->N, g->Ho, g->Wo, g->O, -rlo, -clo, rhi - rlo + 1, chi - clo + 1,
                    &s)) {
      lm_free(wk, wbytes);
      return LM_ERR_OOM;
   }
   int64_t xoff[MAXTAPS], widx[MAXTAPS];
   for (int64_t a = 0; a < sh && a < g->H; a++)
      for (int64_t b = 0; b < sw && b < g->W; b++) {
         bf_eng e;
         e.ntap = 0;
         for (int64_t i = 0; i < g->kh; i++) {
            const int64_t qi = a + g->ph - i * g->dh;
            if (qi - fdiv(qi, sh) * sh) continue;
            for (int64_t j = 0; j < g->kw; j++) {
               const int64_t qj = b + g->pw - j * g->dw;
               if (qj - fdiv(qj, sw) * sw) continue;
               xoff[e.ntap] = ((qi / sh - rlo) * s.wp + (qj / sw - clo)) * P2;
               widx[e.ntap++] = i * g->kw + j;
            }
         }
         e.N = g->N, e.Ho = (g->H - a + sh - 1) / sh, e.Wo = (g->W - b + sw - 1) / sw;
         e.R = P2;
         e.x = s.x, e.ximg = s.img, e.xrow = s.wp * P2, e.xcol = P2;
         e.xoff = xoff, e.widx = widx;
         e.wk = wk, e.wob = wob;
         e.O = g->C;
         e.out = gx, e.res = NULL;
         e.obase = (a * g->W + b) * g->C, e.oimg = g->H * g->W * g->C;
         e.orow = sh * g->W * g->C, e.ocol = sw * g->C;
         e.bias = NULL, e.relu = 0;
         bf_run(&e);
      }
   if (s.buf) lm_free(s.buf, s.bytes);
   lm_free(wk, wbytes);
   return LM_OK;
}
