/* conv_direct_bf16_avx512bf16.c -- bfloat16 NHWC convolution kernels for AVX-512 with AVX512_BF16
 * (vdpbf16ps): forward and backward data, groups 1 and depthwise (at the end of the file).
 * Registered (through conv.c) only when lm_cpu_isa() >= LM_ISA_AVX512_BF16; everything else
 * (float16, NCHW, other grouped convolutions, the weight gradient) takes conv.c's float32
 * fallback.
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
 * Micro-kernel: 28 zmm float32 accumulators holding 7 output pixels x 64 channels (layers with
 * taps) or 14 pixels x 32 channels (pointwise layers, and 32 channels or fewer), the whole
 * reduction (taps x pairs) in registers; per channel pair 4 (2) weight loads and 7 (14)
 * broadcasts feed 28 vdpbf16ps. Epilogue: bias (float32), residual (bf16), activation, one rounding
 * to bf16 (vcvtneps2bf16: round to nearest even), masked stores for the last channel block.
 * Work units: (image row, run of tiles, channel block), split statically over the threads (the
 * same reduction order for every thread count, so results do not vary). Pointwise layers run
 * their N*H*W pixels as one row and prefetch the next tile's input.
 *
 * On the 2-core Zen 4 it runs resnet50's 3x3 layers at 82-93 % of the bfloat16 peak, near
 * PyTorch's bfloat16 kernels (numbers: docs/performance.md, "Measurements behind kernel choices").
 * The weight packing is ~9 % of the 7x7 512-channel layers (4.7 MB read and written per call).
 *
 * Backward data: grad_x = the transposed convolution of grad_out. Split grad_x into
 * sh x sw phases (rows h = a + u*sh); inside a phase every pixel uses the same taps (those with
 * (a + ph - i*dh) divisible by sh), at grad_out row u + (a + ph - i*dh)/sh: a dense direct
 * convolution of grad_out with a subset of the (transposed: O <-> C) weights, through the same
 * micro-kernel, written into grad_x with a pixel step of (sh, sw). No zero-inserted work, no
 * scatter; a phase without taps writes zeros. Stride 1 is the single phase.
 */
#include "impl.h"
#include "conv_internal.h"
#include "avx512_util.h"
#include "act_avx512.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { PBMAX = 14, MAXTAPS = 1024, VCHUNK_TILES = 4 };

/* the engine: output pixels (n, u, v), u < Ho, v < Wo; pixel (n, u, v) reads tap t's run of R
   words at x + n*ximg + u*xrow + v*xcol + xoff[t], with weights wk + ob*wob + widx[t]*R*OB
   (OB = 16*nv output channels per block: nv 2 with tiles of 14 pixels, or 4 with tiles of 7) */
typedef struct {
   int64_t N, Ho, Wo;
   const uint32_t *x;
   int64_t ximg, xrow, xcol;
   int ntap;
   const int64_t *xoff, *widx;
   int64_t R;
   const uint32_t *wk;
   int64_t wob;
   int nv;                          /* zmm per channel block: 2 or 4 */
   int64_t O;                       /* real output channels (the channel stride of out / res) */
   uint16_t *out;
   const uint16_t *res;             /* same addressing as out, or NULL */
   int64_t obase, oimg, orow, ocol; /* in elements */
   const float *bias;
   int act;
   int pf; /* prefetch the next tile's input (pointwise: no reuse across taps) */
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

/* acc[k][v] += the R pairs of pixel k (at xp + k*xc) . weights wt (R rows of 16*NV words). PF:
   also prefetch the R*step words at nx, one cache line per 16/step iterations */
AI void bf_reduce(__m512 (*acc)[4], const uint32_t *xp, const uint32_t *wt, int64_t R,
                  int64_t xc, const uint32_t *nx, int64_t step, const int PB, const int NV,
                  const int PF) {
   const int64_t OBW = 16 * NV;
   for (int64_t q = 0; q < R; q++) {
      __m512bh w[4];
      if (PF) _mm_prefetch((const char *)(nx + q * step), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) w[v] = (__m512bh)_mm512_loadu_si512(wt + 16 * v);
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++) {
         const __m512bh b = (__m512bh)_mm512_set1_epi32(ld32(xp + k * xc));
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) acc[k][v] = _mm512_dpbf16_ps(acc[k][v], b, w[v]);
      }
      xp++;
      wt += OBW;
   }
}

/* PB pixels (pixel k at xb + k*xcol) x NV*16 output channels; m[v]: the valid channels of
   vector v */
AI void bf_tile(const bf_eng *e, const uint32_t *xb, const uint32_t *wob, uint16_t *o,
                const uint16_t *r, const float *bias, const __mmask16 *m, const int PB,
                const int NV) {
   __m512 acc[PBMAX][4];
   acc_zero(acc, PB, NV);
   const int64_t xc = e->xcol, R = e->R, OBW = 16 * NV;
   if (e->pf) { /* one tap, the tile's pixels one contiguous run read once: fetch the next
                   tile's meanwhile (about 1.5x on 1x1 layers; docs/performance.md) */
      const uint32_t *nx = xb + PB * xc;
      const int64_t step = (PB * xc + R - 1) / R;
      if (r) /* the residual rows of the tile, O channels apart: no hardware prefetcher sees
                them coming; fetch them during the reduction */
         for (int k = 0; k < PB; k++) _mm_prefetch((const char *)(r + k * e->ocol), _MM_HINT_T0);
      bf_reduce(acc, xb + e->xoff[0], wob + e->widx[0] * R * OBW, R, xc, nx, step, PB, NV, 1);
   } else { /* the taps of neighbouring tiles overlap: their rows are in cache already (a
               prefetch of the next tile per tap measured no gain on the 3x3 layers) */
      for (int t = 0; t < e->ntap; t++)
         bf_reduce(acc, xb + e->xoff[t], wob + e->widx[t] * R * OBW, R, xc, NULL, 0, PB, NV, 0);
   }
   __m512 bv[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++)
      bv[v] = bias ? _mm512_maskz_loadu_ps(m[v], bias + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) {
      uint16_t *ok = o + k * e->ocol;
      const uint16_t *rk = r ? r + k * e->ocol : NULL;
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
         __m512 a = _mm512_add_ps(acc[k][v], bv[v]);
         if (rk) a = _mm512_add_ps(a, widen_bf16(_mm256_maskz_loadu_epi16(m[v], rk + 16 * v)));
         if (e->act) a = lm_act_ps(a, e->act);
         _mm256_mask_storeu_epi16(ok + 16 * v, m[v], (__m256i)_mm512_cvtneps_pbh(a));
      }
   }
}

#define TILE_CASE(n, nv)                                                                         \
   case n: bf_tile(e, xb, wob, o, r, bias, m, n, nv); break;

/* tiles [v0, v1) of output row (n, u), channel block ob */
static void bf_tiles(const bf_eng *e, int64_t ob, int64_t n, int64_t u, int64_t v0, int64_t v1) {
   const int64_t OBW = 16 * e->nv, c0 = ob * OBW;
   const int pbmax = e->nv == 4 ? 7 : PBMAX;
   __mmask16 m[4];
   for (int v = 0; v < 4; v++) {
      const int64_t nvld = e->O - c0 - 16 * v;
      m[v] = nvld >= 16 ? 0xffff : nvld <= 0 ? 0 : (__mmask16)((1u << nvld) - 1);
   }
   const uint32_t *wob = e->wk + ob * e->wob;
   const float *bias = e->bias ? e->bias + c0 : NULL;
   for (int64_t v = v0; v < v1; v += pbmax) {
      const int pb = v1 - v < pbmax ? (int)(v1 - v) : pbmax;
      const uint32_t *xb = e->x + n * e->ximg + u * e->xrow + v * e->xcol;
      const int64_t oo = e->obase + n * e->oimg + u * e->orow + v * e->ocol + c0;
      uint16_t *o = e->out + oo;
      const uint16_t *r = e->res ? e->res + oo : NULL;
      if (e->nv == 4) {
         switch (pb) {
            TILE_CASE(1, 4) TILE_CASE(2, 4) TILE_CASE(3, 4) TILE_CASE(4, 4) TILE_CASE(5, 4)
            TILE_CASE(6, 4) TILE_CASE(7, 4)
            default: break;
         }
      } else {
         switch (pb) {
            TILE_CASE(1, 2) TILE_CASE(2, 2) TILE_CASE(3, 2) TILE_CASE(4, 2) TILE_CASE(5, 2)
            TILE_CASE(6, 2) TILE_CASE(7, 2) TILE_CASE(8, 2) TILE_CASE(9, 2) TILE_CASE(10, 2)
            TILE_CASE(11, 2) TILE_CASE(12, 2) TILE_CASE(13, 2) TILE_CASE(14, 2)
            default: break;
         }
      }
   }
}

/* work units: (output row, chunk of VCHUNK_TILES tiles, channel block). When all the packed
   weights fit in half of L2 (Zen 4: 1 MB) the channel block runs fastest, so a chunk of input
   pixels stays in L1/L2 while every block reads it; otherwise slowest, so one block's weights
   stay in L2 while the pixels pass (3x3 512->512: 4.7 MB of weights). */
static void bf_run(const bf_eng *e) {
   const int64_t OBW = 16 * e->nv, nob = (e->O + OBW - 1) / OBW, rows = e->N * e->Ho;
   const int64_t chunk = (e->nv == 4 ? 7 : PBMAX) * VCHUNK_TILES;
   const int64_t nvc = (e->Wo + chunk - 1) / chunk, units = rows * nvc * nob;
   const int ob_inner = (double)nob * (double)e->wob * 4 <= 512.0 * 1024;
   const double work = (double)rows * (double)e->Wo * (double)e->O * (double)e->R * e->ntap;
   const int nthr = conv_threads(work);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t i = 0; i < units; i++) {
      int64_t ob, rc;
      if (ob_inner) {
         ob = i % nob;
         rc = i / nob;
      } else {
         ob = i / (rows * nvc);
         rc = i % (rows * nvc);
      }
      const int64_t row = rc / nvc, vc = rc % nvc;
      const int64_t v0 = vc * chunk, v1 = v0 + chunk < e->Wo ? v0 + chunk : e->Wo;
      bf_tiles(e, ob, row / e->Ho, row % e->Ho, v0, v1);
   }
}

/* the channel block for Oo output channels: 64 (4 zmm x tiles of 7 pixels: 4 weight loads and 7
   broadcasts per 28 vdpbf16ps) for convolutions with taps, 32 (2 zmm x tiles of 14) for the
   pointwise ones (one row of N*H*W pixels) and where there are no more than 32 channels to fill:
   64 was faster on every 3x3 layer measured, 32 on the 1x1 ones (numbers:
   docs/performance.md, "Measurements behind kernel choices"). */
static int pick_nv(int64_t Oo, int flat) { return Oo <= 32 || flat ? 2 : 4; }

/* ---------------------------------------------------------------------------------------------
 * packing and staging
 */

/* weights: wk[ob][tap][p][o] words for Oo output channels and Cr reduction channels (P2 =
   ceil(Cr/2) pairs), from w of shape (O, kh, kw, C) (channels-last weights, groups 1). transposed
   (backward data): output channel o' = input channel c of w, reduction channel c' = output
   channel o of w, tap (i, j) unchanged */
static uint32_t *pack_weights(const conv_geom *g, const uint16_t *w, int transposed, int64_t OB,
                              int64_t *wob, size_t *bytes) {
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
         if (!transposed) {
            /* a channel pair of w[og][t][:] is one 32-bit word: pairs outer, the OB output
               channels inner (OB rows of w in L1, the packed rows written in order). The other
               order (pairs inner, writes OB words apart) took 15 % of 3x3 512->512 on 7x7, this
               one 9 %, about what reading 4.7 MB and writing 4.7 MB costs; a 16-lane gather did
               no better. */
            const int64_t oend = Oo - ob * OB < OB ? Oo - ob * OB : OB;
            const uint16_t *src = w + (ob * OB * T + t) * C;
            const int64_t rs = T * C; /* elements between the rows of consecutive og */
            for (int64_t p = 0; p < P2; p++) {
               uint32_t *d = dst + p * OB;
               if (2 * p + 1 < C) {
                  for (int64_t o = 0; o < oend; o++)
                     d[o] = (uint32_t)ld32((const uint32_t *)(src + o * rs + 2 * p));
               } else {
                  for (int64_t o = 0; o < oend; o++) d[o] = src[o * rs + 2 * p];
               }
               for (int64_t o = oend; o < OB; o++) d[o] = 0;
            }
         } else { /* w[c'][t][:] is contiguous over the output channels og: og inner (the
                     other order reads w at a stride of 2*kh*kw*C elements, and packing 1x1
                     2048->512 took longer than the convolution) */
            for (int64_t p = 0; p < P2; p++) {
               const int64_t c0 = 2 * p, c1 = 2 * p + 1;
               const uint16_t *s0 = w + (c0 * T + t) * C;
               const uint16_t *s1 = c1 < O ? w + (c1 * T + t) * C : NULL;
               for (int64_t o = 0; o < OB; o++) {
                  const int64_t og = ob * OB + o;
                  const uint32_t lo = og < Oo ? s0[og] : 0;
                  const uint32_t hi = og < Oo && s1 ? s1[og] : 0;
                  dst[p * OB + o] = lo | hi << 16;
               }
            }
         }
      }
   return wk;
}

/* the pixel pitch (words) of a staged input of P2 words per pixel: a tile's 14 pixels are read
   together, and at a pitch of a multiple of 1 KB they fall into 4 or fewer of L1's 64 sets (8
   ways) and thrash (1x1 2048->512 on 7x7: 162 GFLOP/s on one core, 69 % of peak; 199 with the
   pitch one cache line longer, which spreads them over 14 sets). At 512 bytes (C = 256) they
   share 8 sets, two lines each, harmless: not worth a copy of an input read in place. */
/* the pixel pitch of a staged input, in words: padded by a cache line when the pixels would
   be a multiple of 4 KB apart (2048 channels), where every pixel of a tile falls in the same L1
   set. At 1 or 2 KB apart (512, 1024 channels) the tile's 14 pixels spread over 4 or 2 sets and
   read in place they run faster than staged, the copy saved. Padding at 1 KB (256 words), as
   before, measured no better on the staged 3x3 layers. (Numbers: docs/performance.md, "Measurements
   behind kernel choices".) */
static int64_t stage_pitch(int64_t P2) { return P2 % 1024 == 0 ? P2 + 16 : P2; }

/* staged input: dst[n][r][c][p] (Hp x Wp pixels of `pitch` words, the first P2 used) = the
   channel pair (2p, 2p+1) of src[n][r - pt][c - pl] (N x Hs x Ws x C, NHWC), zero outside src
   and for the odd channel */
static void stage(const uint16_t *src, int64_t N, int64_t Hs, int64_t Ws, int64_t C, int64_t pt,
                  int64_t pl, int64_t Hp, int64_t Wp, int64_t pitch, uint32_t *dst) {
   const int64_t P2 = (C + 1) / 2;
   const int nthr = conv_threads((double)N * Hp * Wp * pitch);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t nr = 0; nr < N * Hp; nr++) {
      const int64_t n = nr / Hp, r = nr % Hp, hs = r - pt;
      uint32_t *d = dst + nr * Wp * pitch;
      if (hs < 0 || hs >= Hs) {
         memset(d, 0, (size_t)(Wp * pitch) * 4);
         continue;
      }
      const uint16_t *s = src + (n * Hs + hs) * Ws * C;
      for (int64_t c = 0; c < Wp; c++) {
         const int64_t ws = c - pl;
         uint32_t *dc = d + c * pitch;
         if (ws < 0 || ws >= Ws) {
            memset(dc, 0, (size_t)pitch * 4);
            continue;
         }
         if (!(C & 1)) {
            memcpy(dc, s + ws * C, (size_t)C * 2);
         } else {
            const uint16_t *sc = s + ws * C;
            for (int64_t p = 0; p < P2; p++)
               dc[p] = (uint32_t)sc[2 * p] | (2 * p + 1 < C ? (uint32_t)sc[2 * p + 1] << 16 : 0);
         }
         if (pitch > P2) memset(dc + P2, 0, (size_t)(pitch - P2) * 4);
      }
   }
}

/* the input as the engine reads it: in place (no padding needed, even C, a pitch that does not
   thrash L1) or staged with padding pt/pl (negative: rows / columns skipped) into Hp x Wp
   pixels */
typedef struct {
   const uint32_t *x;
   uint32_t *buf;
   size_t bytes;
   int64_t img, wp, pitch; /* words per image, pixels per row, words per pixel */
} staged;

static int stage_input(const uint16_t *src, int64_t N, int64_t Hs, int64_t Ws, int64_t C,
                       int64_t pt, int64_t pl, int64_t Hp, int64_t Wp, int allow_pitch,
                       staged *s) {
   const int64_t P2 = (C + 1) / 2, pitch = allow_pitch ? stage_pitch(P2) : P2;
   s->buf = NULL;
   s->bytes = 0;
   if (!(C & 1) && pt == 0 && pl == 0 && Hp <= Hs && Wp <= Ws && pitch == P2) {
      s->x = (const uint32_t *)src;
      s->img = Hs * Ws * P2;
      s->wp = Ws;
      s->pitch = P2;
      return 1;
   }
   s->bytes = (size_t)(N * Hp * Wp * pitch + 16) * 4;
   s->buf = lm_alloc(s->bytes);
   if (!s->buf) return 0;
   stage(src, N, Hs, Ws, C, pt, pl, Hp, Wp, pitch, s->buf);
   s->x = s->buf;
   s->img = Hp * Wp * pitch;
   s->wp = Wp;
   s->pitch = pitch;
   return 1;
}

/* small channel counts (the RGB stem): "row im2col", dst[n][r][ow][q] = the pair (2q, 2q+1) of
   the kw*C values (j*C + c) that output column ow reads from padded input row r: x[n][r -
   ph][ow*sw + j*dw - pw][c] (zero outside). One pad to even per kernel row instead of one per
   pixel: the 7x7 stem with C = 3 reduces 7 x 11 pairs instead of 7 x 7 x 2 (21 % less work). */
static void stage_rows(const conv_geom *g, const uint16_t *x, int64_t Hp, int64_t P2r,
                       uint32_t *dst) {
   const int64_t C = g->C, KC = g->kw * g->C;
   const int nthr = conv_threads((double)g->N * Hp * g->Wo * P2r);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t nr = 0; nr < g->N * Hp; nr++) {
      const int64_t n = nr / Hp, r = nr % Hp, hs = r - g->ph;
      uint16_t *d = (uint16_t *)(dst + nr * g->Wo * P2r);
      if (hs < 0 || hs >= g->H) {
         memset(d, 0, (size_t)(g->Wo * P2r) * 4);
         continue;
      }
      const uint16_t *s = x + (n * g->H + hs) * g->W * C;
      for (int64_t ow = 0; ow < g->Wo; ow++) {
         uint16_t *dc = d + ow * 2 * P2r;
         const int64_t w0 = ow * g->sw - g->pw, w1 = w0 + (g->kw - 1) * g->dw;
         if (g->dw == 1 && w0 >= 0 && w1 < g->W) { /* the window inside the row: one copy */
            memcpy(dc, s + w0 * C, (size_t)KC * 2);
            for (int64_t q = KC; q < 2 * P2r; q++) dc[q] = 0;
            continue;
         }
         for (int64_t j = 0; j < g->kw; j++) {
            const int64_t ws = ow * g->sw + j * g->dw - g->pw;
            for (int64_t c = 0; c < C; c++) dc[j * C + c] = ws >= 0 && ws < g->W ? s[ws * C + c] : 0;
         }
         for (int64_t q = KC; q < 2 * P2r; q++) dc[q] = 0;
      }
   }
}

/* ---------------------------------------------------------------------------------------------
 * entry points (conv_internal.h)
 */
static lm_status dw_fwd(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                        const float *bias, const uint16_t *res, int act, uint16_t *out);
static lm_status dw_bwdd(const conv_geom *g, const uint16_t *gout, const uint16_t *w,
                         uint16_t *gx);

/* groups 1 (the implicit GEMM), or depthwise (groups == C == O: dw_fwd / dw_bwdd below); other
   grouped convolutions take the float32 fallback */
int lm_conv_bf16_usable(const conv_geom *g, int backward_data) {
   (void)backward_data;
   if (!lm_impl_on(LM_IMPL_CONV_DIRECT_BF16)) return 0; /* also LUMEN_CONV_BF16=0 */
   return (g->G == 1 || conv_is_depthwise(g)) && g->K > 0 && g->O > 0 && g->C > 0 &&
          g->kh * g->kw <= MAXTAPS;
}

lm_status lm_conv_fwd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                                      const float *bias, const uint16_t *res, int act,
                                      uint16_t *out) {
   if (conv_is_depthwise(g)) return dw_fwd(g, x, w, bias, res, act, out);
   const int64_t P2 = (g->C + 1) / 2;
   /* 1x1 / stride 1 / no padding: the input is a pixels x C matrix (read in place when C is
      even and the pitch is harmless), all N*H*W pixels one row of full tiles */
   const int flat = conv_is_pointwise(g);
   /* few channels and a wide kernel (the stem): row im2col */
   const int rows = g->C <= 4 && g->kw > 1;
   const int nv = pick_nv(g->O, flat);
   const int64_t Hp = (g->Ho - 1) * g->sh + g->dh * (g->kh - 1) + 1;
   const int64_t Wp = (g->Wo - 1) * g->sw + g->dw * (g->kw - 1) + 1;
   int64_t wob;
   size_t wbytes;
   uint32_t *wk;
   if (rows) { /* the weights of a kernel row are one reduction of kw*C values */
      conv_geom gr = *g;
      gr.C = g->kw * g->C;
      gr.kw = 1;
      wk = pack_weights(&gr, w, 0, 16 * nv, &wob, &wbytes);
   } else {
      wk = pack_weights(g, w, 0, 16 * nv, &wob, &wbytes);
   }
   if (!wk) return LM_ERR_OOM;
   staged s;
   int64_t xoff[MAXTAPS], widx[MAXTAPS];
   bf_eng e;
   e.ntap = 0;
   if (rows) {
      const int64_t P2r = (g->kw * g->C + 1) / 2;
      s.bytes = (size_t)(g->N * Hp * g->Wo * P2r + 16) * 4;
      s.buf = lm_alloc(s.bytes);
      if (!s.buf) {
         lm_free(wk, wbytes);
         return LM_ERR_OOM;
      }
      stage_rows(g, x, Hp, P2r, s.buf);
      s.x = s.buf;
      e.R = P2r;
      for (int64_t i = 0; i < g->kh; i++) {
         xoff[e.ntap] = i * g->dh * g->Wo * P2r;
         widx[e.ntap++] = i;
      }
      e.ximg = Hp * g->Wo * P2r, e.xrow = g->sh * g->Wo * P2r, e.xcol = P2r;
   } else {
      if (!stage_input(x, g->N, g->H, g->W, g->C, g->ph, g->pw, Hp, Wp, 1, &s)) {
         lm_free(wk, wbytes);
         return LM_ERR_OOM;
      }
      const int64_t pitch = s.pitch;
      e.R = P2;
      if (g->dw == 1 && pitch == P2) { /* a kernel row's taps read one run of kw*P2 words */
         e.R = g->kw * P2;
         for (int64_t i = 0; i < g->kh; i++) {
            xoff[e.ntap] = i * g->dh * s.wp * pitch;
            widx[e.ntap++] = i;
         }
      } else {
         for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
               xoff[e.ntap] = (i * g->dh * s.wp + j * g->dw) * pitch;
               widx[e.ntap++] = i * g->kw + j;
            }
      }
      e.ximg = s.img, e.xrow = g->sh * s.wp * pitch, e.xcol = g->sw * pitch;
   }
   e.N = g->N, e.Ho = g->Ho, e.Wo = g->Wo;
   e.x = s.x;
   if (flat) e.N = 1, e.Ho = 1, e.Wo = g->N * g->Ho * g->Wo;
   e.pf = flat;
   e.xoff = xoff, e.widx = widx;
   e.wk = wk, e.wob = wob, e.nv = nv;
   e.O = g->O;
   e.out = out, e.res = res;
   e.obase = 0, e.oimg = g->Ho * g->Wo * g->O, e.orow = g->Wo * g->O, e.ocol = g->O;
   e.bias = bias, e.act = act;
   bf_run(&e);
   if (s.buf) lm_free(s.buf, s.bytes);
   lm_free(wk, wbytes);
   return LM_OK;
}

/* floor division for a possibly negative numerator */
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

lm_status lm_conv_bwdd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *gout,
                                       const uint16_t *w, uint16_t *gx) {
   if (conv_is_depthwise(g)) return dw_bwdd(g, gout, w, gx);
   const int64_t P2 = (g->O + 1) / 2;
   const int64_t sh = g->sh, sw = g->sw;
   /* grad_out rows read by phase a, tap i: u + (a + ph - i*dh)/sh for u < ceil((H - a)/sh);
      the extremes over all phases and taps give the staging's padding */
   int64_t rlo = 0, rhi = g->Ho - 1, clo = 0, chi = g->Wo - 1;
   for (int64_t a = 0; a < sh && a < g->H; a++)
      for (int64_t i = 0; i < g->kh; i++) {
         const int64_t q = a + g->ph - i * g->dh;
         if (q - floor_div(q, sh) * sh) continue;
         const int64_t d = q / sh, nu = (g->H - a + sh - 1) / sh;
         if (d < rlo) rlo = d;
         if (nu - 1 + d > rhi) rhi = nu - 1 + d;
      }
   for (int64_t b = 0; b < sw && b < g->W; b++)
      for (int64_t j = 0; j < g->kw; j++) {
         const int64_t q = b + g->pw - j * g->dw;
         if (q - floor_div(q, sw) * sw) continue;
         const int64_t d = q / sw, nv = (g->W - b + sw - 1) / sw;
         if (d < clo) clo = d;
         if (nv - 1 + d > chi) chi = nv - 1 + d;
      }
   const int flat = conv_is_pointwise(g);
   const int nv = pick_nv(g->C, flat);
   int64_t wob;
   size_t wbytes;
   uint32_t *wk = pack_weights(g, w, 1, 16 * nv, &wob, &wbytes);
   if (!wk) return LM_ERR_OOM;
   staged s;
   if (!stage_input(gout, g->N, g->Ho, g->Wo, g->O, -rlo, -clo, rhi - rlo + 1, chi - clo + 1, 1,
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
            if (qi - floor_div(qi, sh) * sh) continue;
            for (int64_t j = 0; j < g->kw; j++) {
               const int64_t qj = b + g->pw - j * g->dw;
               if (qj - floor_div(qj, sw) * sw) continue;
               xoff[e.ntap] = ((qi / sh - rlo) * s.wp + (qj / sw - clo)) * s.pitch;
               widx[e.ntap++] = i * g->kw + j;
            }
         }
         e.N = g->N, e.Ho = (g->H - a + sh - 1) / sh, e.Wo = (g->W - b + sw - 1) / sw;
         e.R = P2;
         e.x = s.x, e.ximg = s.img, e.xrow = s.wp * s.pitch, e.xcol = s.pitch;
         if (flat) e.N = 1, e.Ho = 1, e.Wo = g->N * g->H * g->W; /* one phase, staged width W */
         e.pf = flat;
         e.xoff = xoff, e.widx = widx;
         e.wk = wk, e.wob = wob, e.nv = nv;
         e.O = g->C;
         e.out = gx, e.res = NULL;
         e.obase = (a * g->W + b) * g->C, e.oimg = g->H * g->W * g->C;
         e.orow = sh * g->W * g->C, e.ocol = sw * g->C;
         e.bias = NULL, e.act = 0;
         bf_run(&e);
      }
   if (s.buf) lm_free(s.buf, s.bytes);
   lm_free(wk, wbytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * depthwise (groups == C == O): vectorized over 16 channels, float32 accumulation of the widened
 * bf16 products, taps outside the input skipped; weights widened once into wf[tap][C]. No
 * reduction over channels, so nothing for vdpbf16ps to pair up: these layers are memory-bound,
 * and reading bf16 in place (no float32 copies) is what counts.
 */
static float *dw_weights(const conv_geom *g, const uint16_t *w, size_t *bytes) {
   const int64_t T = g->kh * g->kw, C = g->C;
   *bytes = (size_t)(T * C + 16) * sizeof(float);
   float *wf = lm_alloc(*bytes);
   if (!wf) return NULL;
   for (int64_t c = 0; c < C; c++) /* w: (C, 1, kh, kw), i.e. w[c*T + t] */
      for (int64_t t = 0; t < T; t++) wf[t * C + c] = lm_bf2f(w[c * T + t]);
   return wf;
}

AI __mmask16 cmask(int64_t left) { return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1); }

static lm_status dw_fwd(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                        const float *bias, const uint16_t *res, int act, uint16_t *out) {
   size_t wbytes;
   float *wf = dw_weights(g, w, &wbytes);
   if (!wf) return LM_ERR_OOM;
   const int64_t C = g->C, rows = g->N * g->Ho;
   const int nthr = conv_threads((double)rows * g->Wo * C * g->kh * g->kw);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / g->Ho, oh = row % g->Ho;
      for (int64_t ow = 0; ow < g->Wo; ow++) {
         const int64_t oo = ((n * g->Ho + oh) * g->Wo + ow) * C;
         for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 m = cmask(C - c);
            __m512 acc = bias ? _mm512_maskz_loadu_ps(m, bias + c) : _mm512_setzero_ps();
            for (int64_t i = 0; i < g->kh; i++) {
               const int64_t ih = oh * g->sh - g->ph + i * g->dh;
               if (ih < 0 || ih >= g->H) continue;
               for (int64_t j = 0; j < g->kw; j++) {
                  const int64_t iw = ow * g->sw - g->pw + j * g->dw;
                  if (iw < 0 || iw >= g->W) continue;
                  const uint16_t *xp = x + ((n * g->H + ih) * g->W + iw) * C + c;
                  const __m512 xv = widen_bf16(_mm256_maskz_loadu_epi16(m, xp));
                  const __m512 wv = _mm512_maskz_loadu_ps(m, wf + (i * g->kw + j) * C + c);
                  acc = _mm512_fmadd_ps(xv, wv, acc);
               }
            }
            if (res) acc = _mm512_add_ps(acc, widen_bf16(_mm256_maskz_loadu_epi16(m, res + oo + c)));
            if (act) acc = lm_act_ps(acc, act);
            _mm256_mask_storeu_epi16(out + oo + c, m, (__m256i)_mm512_cvtneps_pbh(acc));
         }
      }
   }
   lm_free(wf, wbytes);
   return LM_OK;
}

/* grad_x[h][w] = sum over the taps (i, j) with (h + ph - i*dh) = oh*sh, (w + pw - j*dw) = ow*sw
   inside grad_out of grad_out[oh][ow] * w[i][j] (per channel): a gather, any stride */
static lm_status dw_bwdd(const conv_geom *g, const uint16_t *gout, const uint16_t *w,
                         uint16_t *gx) {
   size_t wbytes;
   float *wf = dw_weights(g, w, &wbytes);
   if (!wf) return LM_ERR_OOM;
   const int64_t C = g->C, rows = g->N * g->H;
   const int nthr = conv_threads((double)rows * g->W * C * g->kh * g->kw);
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / g->H, h = row % g->H;
      for (int64_t wc = 0; wc < g->W; wc++) {
         const int64_t oo = ((n * g->H + h) * g->W + wc) * C;
         for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 m = cmask(C - c);
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < g->kh; i++) {
               const int64_t q = h + g->ph - i * g->dh;
               if (q < 0 || q % g->sh) continue;
               const int64_t oh = q / g->sh;
               if (oh >= g->Ho) continue;
               for (int64_t j = 0; j < g->kw; j++) {
                  const int64_t r = wc + g->pw - j * g->dw;
                  if (r < 0 || r % g->sw) continue;
                  const int64_t ow = r / g->sw;
                  if (ow >= g->Wo) continue;
                  const uint16_t *gp = gout + ((n * g->Ho + oh) * g->Wo + ow) * C + c;
                  const __m512 gv = widen_bf16(_mm256_maskz_loadu_epi16(m, gp));
                  const __m512 wv = _mm512_maskz_loadu_ps(m, wf + (i * g->kw + j) * C + c);
                  acc = _mm512_fmadd_ps(gv, wv, acc);
               }
            }
            _mm256_mask_storeu_epi16(gx + oo + c, m, (__m256i)_mm512_cvtneps_pbh(acc));
         }
      }
   }
   lm_free(wf, wbytes);
   return LM_OK;
}
