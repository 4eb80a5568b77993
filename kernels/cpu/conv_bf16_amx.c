/* conv_bf16_amx.c -- bfloat16 NHWC convolutions on AMX tiles (amx.h): forward, and backward data
 * of stride-1 layers; and conv3d's forward in NDHWC (LM_OP_CONV3D, at the end: the same engine
 * with the depth taps as more taps). conv.c calls them when lm_amx_on() and lm_conv_amx_usable() take the
 * geometry (groups 1, at least 16 input channels); everything else keeps the AVX-512 kernels
 * (conv_direct_bf16_avx512bf16.c: depthwise, groups, the 3-channel stem).
 *
 * A convolution is a batch-reduce GEMM (oneDNN's brgconv): a block of 32 output pixels x 32
 * output channels is one set of four accumulator tiles, summed over every tap (i, j) of the
 * kernel and every 32 input channels of it (amx_brgemm_32x32, gemm_bf16_amx.h), with no
 * im2col: the A tile of tap (i, j) is 16 input pixels read in place from a zero-padded copy of
 * the input, rows C_s * 2 bytes apart (C_s: the channels rounded up to 32, zeros past C).
 *   Stride 1: the output of an image is walked over the padded width, Ho rows of Wp "virtual"
 *     pixels; virtual pixel q reads padded pixel q + i*dh*Wp + j*dw for tap (i, j), so 32
 *     consecutive q are one tile pair at every tap, across output rows (7 x 7 outputs fill 78 %
 *     of the rows, not 7 of 16); q with (q mod Wp) >= Wo are computed and dropped.
 *   Stride > 1: blocks of 32 output pixels along one output row, rows sw * C_s * 2 bytes apart.
 * The copy has a zero margin past the last image, so the dropped rows of the last blocks read
 * zeros, never beyond the buffer.
 * Weights: packed once per call (lm_amx_pack_b) into 32-channel panels per tap,
 *   wk[q][tap][C_s / 2][32 words]; panels are taken in chunks of at most 512 KiB (they stream
 *   from L2 while a thread's input rows stay in L1), each chunk over all pixel blocks, the
 *   pixel blocks split statically between the threads.
 * Epilogue (per block, on the tiles stored to a 4 KiB buffer): bias (float32), residual
 *   (bfloat16), the activation (lm_conv_act), one rounding to bfloat16 (lm_f2bf's, bit for bit).
 * 1 x 1 stride-1 unpadded layers are one GEMM on the input in place: lm_bgemm_amx with the same
 *   epilogue (the A operand is packed there, so a 2 KiB channel pitch does not thrash L1).
 * Backward data of a stride-1 layer is the forward engine on grad_out padded by
 *   (k - 1) * d - p with the weights flipped and transposed (packed from w directly).
 */
#include "impl.h"
#include "conv_internal.h"
#include "gemm_bf16_amx.h"
#include "cpu.h"

#include <immintrin.h>

/* AMX_MAXROWS: rows mode's gathered A tiles a block (kernel rows x steps; conv3d's stem: 3 x 7
   rows of 63 values, 42), 2 KiB each on the stack of every thread */
enum { AMX_MAXTAPS = 1024, AMX_MAXROWS = 64, CHUNK_BYTES = 512 * 1024 };

static int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int lm_conv_amx_usable(const conv_geom *g, int backward_data) {
   /* switched off by name (amx_bf16, or LUMEN_CONV_AMX=0): no tile convolution, the float32
      one of fp32_precision = "bf16" included */
   if (!lm_impl_on(LM_IMPL_CONV_AMX_BF16)) return 0;
   if (g->G != 1 || g->O < 16 || g->kh * g->kw > AMX_MAXTAPS) return 0;
   /* few channels: only the stem's form (kernel rows of at most 32 values, dense along W) */
   if (g->C < 16 && !(g->C * g->kw <= 64 && g->dw == 1 &&
                      g->kh * ((g->C * g->kw + 31) / 32) <= AMX_MAXROWS && !backward_data))
      return 0;
   /* backward data: the phases of a strided layer read 32 output channels a step */
   return !backward_data || g->O >= 16;
}

/* Where the tiles pay (the impl lists' choice; lm_conv_amx_usable says where they can run): a
   kernel with spatial extent needs 32+ input and output channels (16..31 pad a tile's 32 to
   half empty, and float32 Winograd does a quarter of the multiplications: the README's small
   ResNet, 128 images of 28x28, bf16: 16 -> 16 3x3 forward 3.4 ms on the tiles, 1.1-1.3 on the
   float32 route; 16 -> 32 3x3 stride 2 1.8 against 1.1), the stem's rows 32+ output channels
   (1 -> 16 3x3: 2.1 against 0.3); a 1x1 layer takes the tiles as a GEMM from 16 (16 -> 32:
   0.43 against 0.62). LUMEN_CONV_AMX=2 takes every geometry the tiles can run (specs of the
   tile kernels on odd channel counts). */
static int amx_pays_2d(int64_t C, int64_t O, int64_t kh, int64_t kw) {
   const char *e = getenv("LUMEN_CONV_AMX");
   if (e && e[0] == '2' && e[1] == 0) return 1;
   if (kh * kw == 1) return 1;
   if (C < 16) return O >= 32; /* rows mode */
   return C >= 32 && O >= 32;
}

int lm_conv_amx_pays(const conv_geom *g) { return amx_pays_2d(g->C, g->O, g->kh, g->kw); }

/* the engine's geometry: input (N, H, W, C) read from a padded copy, output (N, Ho, Wo, O);
   with depth (conv3d, D > 0): input (N, D, H, W, C), output (N, Do, Ho, Wo, O), kernel depth kd,
   stride sd, padding pd, dilation dd (D = 0: a 2-D convolution, the depth fields unused) */
typedef struct {
   int64_t N, C, H, W, O, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw;
   int64_t D, Do, kd, sd, pd, dd;
} eng_geom;

/* where tap t's B operand lives: element (c, o) at b[c * rsb + o * csb] */
typedef struct {
   const uint16_t *w;
   int64_t K, C, kh, kw;
   int transposed; /* backward data: B_t(o', c') = w[c'][kh-1-i][kw-1-j][o'] */
} wsrc;

static const uint16_t *tap_b(const wsrc *s, int64_t t, int64_t *rsb, int64_t *csb) {
   const int64_t i = t / s->kw, j = t % s->kw;
   if (!s->transposed) { /* B_t(c, o) = w[o][i][j][c] */
      *rsb = 1;
      *csb = s->K;
      return s->w + (i * s->kw + j) * s->C;
   }
   /* B_t(o, c) with w of shape (O = rows of B, kh, kw, C = columns): w[o][kh-1-i][kw-1-j][c] */
   *rsb = s->K;
   *csb = 1;
   return s->w + ((s->kh - 1 - i) * s->kw + (s->kw - 1 - j)) * s->C;
}

/* one output row of a block: up to 32 channels from t, + bias, + residual, activation, rounded to
   bfloat16 (or float32 with ep->f32), into output pixel pix at channel o0 */
static inline void epi_row(const float *t, int nr, const lm_amx_epi *ep, void *out, int64_t pix,
                           int64_t o0, int64_t O) {
   const int64_t at = pix * O + o0;
   const float *bias = ep->bias ? ep->bias + o0 : NULL;
   for (int h = 0; h < nr; h += 16) {
      const int n = nr - h < 16 ? nr - h : 16;
      const __mmask16 mk = (__mmask16)((1u << n) - 1u);
      __m512 v = _mm512_loadu_ps(t + h);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + h));
      if (ep->res && ep->f32)
         v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, (const float *)(const void *)ep->res +
                                                           at + h));
      else if (ep->res)
         v = _mm512_add_ps(v, bf16_widen16(_mm256_maskz_loadu_epi16(mk, ep->res + at + h)));
      if (ep->act) v = lm_act_ps(v, ep->act);
      if (ep->f32)
         _mm512_mask_storeu_ps((float *)out + at + h, mk, v);
      else
         _mm256_mask_storeu_epi16((uint16_t *)out + at + h, mk, (__m256i)_mm512_cvtneps_pbh(v));
   }
}

/* the epilogue of a 32 x 32 block: output pixel px[r] (-1: none) gets row r, channels o0.. */
static void epi_block(const float *t, const int64_t *px, int nr, int64_t o0, int64_t O,
                      const lm_amx_epi *ep, void *out) {
   if (nr == 32 && !ep->f32) {
      for (int r = 0; r < 32; r++)
         if (px[r] >= 0)
            lm_amx_epi_block32(t + r * 32, 1, ep->bias ? ep->bias + o0 : NULL,
                               ep->res ? ep->res + px[r] * O + o0 : NULL, 0, ep->act,
                               (uint16_t *)out + px[r] * O + o0, 0, ep->stream);
      return;
   }
   for (int r = 0; r < 32; r++)
      if (px[r] >= 0) epi_row(t + r * 32, nr, ep, out, px[r], o0, O);
}

/* x (N, H, W, C) -> dst (N, Hp, Wp, Cs) with zeros around and past C, and `margin` zero pixels
   after the last image; with depth planes (pad_copy3: x (N, D, H, W, C) -> (N, Dp, Hp, Wp, Cs),
   zero planes for the depth padding pd; pad_copy is D = Dp = 1) */
static void pad_copy3(const uint16_t *x, int64_t N, int64_t D, int64_t H, int64_t W, int64_t C,
                      int64_t pd, int64_t ph, int64_t pw, int64_t Dp, int64_t Hp, int64_t Wp,
                      int64_t Cs, int64_t margin, uint16_t *dst) {
   const int nt = conv_threads((double)N * Dp * Hp * Wp * Cs);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t r = 0; r < N * Dp * Hp; r++) {
      const int64_t n = r / (Dp * Hp), d3 = r / Hp % Dp - pd, hp = r % Hp, h = hp - ph;
      uint16_t *d = dst + r * Wp * Cs;
      if (h < 0 || h >= H || d3 < 0 || d3 >= D) {
         memset(d, 0, (size_t)(Wp * Cs) * 2);
         continue;
      }
      memset(d, 0, (size_t)(pw * Cs) * 2);
      const uint16_t *s = x + (((n * D + d3) * H + h) * W) * C;
      if (Cs == C) {
         memcpy(d + pw * Cs, s, (size_t)(W * C) * 2);
      } else {
         for (int64_t w = 0; w < W; w++) {
            memcpy(d + (pw + w) * Cs, s + w * C, (size_t)C * 2);
            memset(d + (pw + w) * Cs + C, 0, (size_t)(Cs - C) * 2);
         }
      }
      memset(d + (pw + W) * Cs, 0, (size_t)((Wp - pw - W) * Cs) * 2);
   }
   memset(dst + N * Dp * Hp * Wp * Cs, 0, (size_t)(margin * Cs) * 2);
}

static void pad_copy(const uint16_t *x, int64_t N, int64_t H, int64_t W, int64_t C, int64_t ph,
                     int64_t pw, int64_t Hp, int64_t Wp, int64_t Cs, int64_t margin,
                     uint16_t *dst) {
   pad_copy3(x, N, 1, H, W, C, 0, ph, pw, 1, Hp, Wp, Cs, margin, dst);
}

/* the engine's core: output pixels (n, u, v) of an Hg x Wg grid per image read input pixel
   n*Hp*Wp + u*ush*Wp + v*usw (+ toff[t] for tap t) of the padded copy xp (Cs channels, rows of
   Cs * 2 bytes), and are written to output pixel (n*Ho_t + oa + osh*u) * Wo_t + ob + osw*v */
typedef struct {
   const uint16_t *xp;
   int64_t N, Hp, Wp, Cs, nsteps;
   int rowsmode;      /* kernel-row runs of kc values gathered per block, nsteps tiles a row */
   int64_t kc, dsw;   /* rows mode: values per run, input pixel step of the run's rows */
   int64_t ntap;
   const int64_t *toff;
   const uint32_t *wk; /* panels of 32 output channels: wk[q][t][nsteps * 16][32] */
   int64_t prow, O;
   int64_t Hg, Wg, ush, usw;
   int64_t Ho_t, Wo_t, oa, ob, osh, osw;
   lm_amx_epi ep; /* bias, residual, activation, streaming, float32 output */
   void *out;
   /* image n of the N (output planes: clips x output depths Dimg) starts at input pixel
      (n / Dimg) * clip + (n % Dimg) * dstep of xp; 2-D: Dimg 1, clip Hp * Wp, dstep 0 */
   int64_t Dimg, clip, dstep;
} eng_plan;

static inline int64_t img_base(const eng_plan *pl, int64_t n) {
   return pl->Dimg == 1 ? n * pl->clip : n / pl->Dimg * pl->clip + n % pl->Dimg * pl->dstep;
}

static void core(const eng_plan *pl) {
   const int64_t Wp = pl->Wp, Cs = pl->Cs, ntap = pl->ntap, nsteps = pl->nsteps;
   const int64_t nq = (pl->O + 31) / 32;
   /* pixel blocks: 32 "virtual" pixels of an image walked over the padded width (Wv virtual
      pixels an output row, one input pixel step of usw between them), or 32 pixels of one
      output row; whichever keeps more of the tile rows */
   const int64_t Wv = pl->ush * Wp % pl->usw == 0 ? pl->ush * Wp / pl->usw : 0;
   const int virt = Wv >= pl->Wg && Wv > 0 &&
                    (double)pl->Wg / (double)Wv >= (double)pl->Wg / (double)rup(pl->Wg, 32);
   const int64_t per_img = virt ? (pl->Hg * Wv + 31) / 32 : 0;
   const int64_t per_row = virt ? 0 : (pl->Wg + 31) / 32;
   const int64_t nblk = virt ? pl->N * per_img : pl->N * pl->Hg * per_row;
   const int64_t panel_bytes = 32 * pl->prow * 4;
   int64_t qchunk = CHUNK_BYTES / panel_bytes;
   if (qchunk < 1) qchunk = 1;
   const int nt = conv_threads((double)nblk * nq * 32 * 32 * ntap * nsteps * 32);
   const int64_t sa = pl->usw * Cs * 2;
   for (int64_t q0 = 0; q0 < nq; q0 += qchunk) {
      const int64_t q1 = q0 + qchunk < nq ? q0 + qchunk : nq;
#pragma omp parallel num_threads(nt) if (nt > 1)
      {
         /* two slots: the block whose products run, and the one whose epilogue runs meanwhile */
         float tb[2][32 * 32] __attribute__((aligned(64)));
         int64_t pix[2][32], po0[2] = {0, 0}, cur[32];
         int pnr[2] = {0, 0}, slot = 0, pend = -1;
         uint16_t ab[pl->rowsmode ? AMX_MAXROWS * 1024 : 1] __attribute__((aligned(64)));
         amx_seg seg[AMX_MAXTAPS];
         lm_amx_begin();
#pragma omp for schedule(static)
         for (int64_t blk = 0; blk < nblk; blk++) {
            int64_t base, vq0 = 0, n, u0 = 0, v0 = 0;
            if (virt) {
               n = blk / per_img;
               vq0 = (blk % per_img) * 32;
               base = img_base(pl, n) + vq0 * pl->usw;
            } else {
               const int64_t r = blk / per_row;
               n = r / pl->Hg;
               u0 = r % pl->Hg;
               v0 = (blk % per_row) * 32;
               base = img_base(pl, n) + u0 * pl->ush * Wp + v0 * pl->usw;
            }
            /* the block's output pixels (-1: a dropped row) */
            for (int r = 0; r < 32; r++) {
               int64_t u, v;
               if (virt) {
                  const int64_t qq = vq0 + r;
                  u = qq / Wv;
                  v = qq % Wv;
               } else {
                  u = u0;
                  v = v0 + r;
               }
               cur[r] = u < pl->Hg && v < pl->Wg
                           ? (n * pl->Ho_t + pl->oa + pl->osh * u) * pl->Wo_t + pl->ob + pl->osw * v
                           : -1;
            }
            if (pl->rowsmode) { /* gather each kernel row's kc values for the 32 pixels, 32
                                   values (one tile of A) a step */
               for (int64_t s = 0; s < nsteps; s++) {
                  const int64_t left = pl->kc - s * 32;
                  const __mmask32 mk = (__mmask32)(left >= 32 ? 0xffffffffu : ((1u << left) - 1u));
                  for (int64_t t = 0; t < ntap; t++)
                     for (int r = 0; r < 32; r++)
                        _mm512_store_si512(
                           ab + (t * nsteps + s) * 1024 + r * 32,
                           _mm512_maskz_loadu_epi16(
                              mk, pl->xp + (base + r * pl->usw + pl->toff[t]) * Cs + s * 32));
               }
            }
            for (int64_t q = q0; q < q1; q++) {
               if (pl->rowsmode) { /* one segment a (row, step): its A tile pair gathered */
                  for (int64_t t = 0; t < ntap * nsteps; t++) {
                     seg[t].a = ab + t * 1024;
                     seg[t].b = pl->wk + q * 32 * pl->prow + t * 16 * 32;
                  }
               } else {
                  for (int64_t t = 0; t < ntap; t++) {
                     seg[t].a = pl->xp + (base + pl->toff[t]) * Cs;
                     seg[t].b = pl->wk + q * 32 * pl->prow + t * nsteps * 16 * 32;
                  }
               }
               if (pl->rowsmode)
                  amx_issue_32x32(seg, (int)(ntap * nsteps), 1, 64, 1024, 2048, NULL, 0, 0);
               else
                  amx_issue_32x32(seg, (int)ntap, (int)nsteps, sa, 16 * sa, 64, NULL, 0, 0);
               if (pend >= 0) /* the previous block's epilogue while these products run */
                  epi_block(tb[pend], pix[pend], pnr[pend], po0[pend], pl->O, &pl->ep, pl->out);
               amx_store_32x32(tb[slot], 32);
               memcpy(pix[slot], cur, sizeof cur);
               po0[slot] = q * 32;
               pnr[slot] = (int)(pl->O - q * 32 < 32 ? pl->O - q * 32 : 32);
               pend = slot;
               slot ^= 1;
            }
         }
         if (pend >= 0)
            epi_block(tb[pend], pix[pend], pnr[pend], po0[pend], pl->O, &pl->ep, pl->out);
         if (pl->ep.stream) _mm_sfence();
         lm_amx_end();
      }
   }
}

/* pack the weights: panel q, tap t = B_t (kc x O, element (p, o) at b_t[p*rsb + o*csb]) */
typedef const uint16_t *(*tap_src_fn)(const void *ctx, int64_t t, int64_t *rsb, int64_t *csb);

static void pack_taps(int64_t ntap, int64_t kc, int64_t O, int64_t nsteps, int64_t prow,
                      tap_src_fn src, const void *ctx, uint32_t *wk) {
   const int64_t nq = (O + 31) / 32;
   const int nt = conv_threads((double)ntap * nq * prow * 32);
#pragma omp parallel for num_threads(nt) schedule(static) collapse(2) if (nt > 1)
   for (int64_t t = 0; t < ntap; t++)
      for (int64_t q = 0; q < nq; q++) {
         int64_t rsb, csb;
         const uint16_t *b = src(ctx, t, &rsb, &csb);
         lm_amx_pack_b(kc, O, b, rsb, csb, q, q + 1, wk + t * nsteps * 16 * 32, prow);
      }
}

static const uint16_t *tap_plain(const void *ctx, int64_t t, int64_t *rsb, int64_t *csb) {
   return tap_b((const wsrc *)ctx, t, rsb, csb);
}

/* rows mode: B_i(j * C + c, o) = w[o][i][j][c] */
static const uint16_t *tap_rows(const void *ctx, int64_t t, int64_t *rsb, int64_t *csb) {
   const wsrc *s = ctx;
   *rsb = 1;
   *csb = s->K;
   return s->w + t * s->kw * s->C;
}

/* a convolution with the engine (forward, or stride-1 backward data as e and ws describe) */
static lm_status engine(const eng_geom *e, const uint16_t *x, const wsrc *ws,
                        const lm_amx_epi *ep, void *out) {
   /* rows mode (the stem: few channels, dense taps along W): each kernel row's kw * C values
      are one or two steps of k, gathered per block (a small im2col) instead of 32 channels a
      tap. Two steps take conv3d's stem (3 channels x 3 depth taps folded into 9, 7 wide: 63
      values a row, src/ops/conv3d.c) onto the tiles, where direct_avx512bf16 ran it before:
      r3d_18's stem conv3d (2 clips of 3x8x112x112, 2 threads, the host's slow AMX phase) 32 ->
      13 ms a call, old and new library alternated (with the faster gather of elementwise.c's
      short_rows_copy); its conv2d alone 20.5 -> 6.7-8.8 ms (LUMEN_VERBOSE) */
   const int rowsmode = e->C * e->kw <= 64 && e->C < 16 && e->dw == 1;
   const int64_t Cs = rowsmode ? e->C : rup(e->C, 32);
   const int64_t nsteps = rowsmode ? (e->C * e->kw + 31) / 32 : Cs / 32;
   const int64_t Hp = e->H + 2 * e->ph, Wp = e->W + 2 * e->pw;
   /* depth (conv3d): the kd depth taps are more taps, each (kd, kh, kw) tap offset by its depth
      plane in one padded copy of the clip; images are the clips' output depths */
   const int three = e->D > 0;
   const int64_t D = three ? e->D : 1, Dp = three ? e->D + 2 * e->pd : 1;
   const int64_t kd = three ? e->kd : 1, Do = three ? e->Do : 1;
   const int64_t ntap = kd * (rowsmode ? e->kh : e->kh * e->kw);
   const int64_t nq = (e->O + 31) / 32;
   /* the last blocks' dropped rows read past the last image: up to sh - 1 rows (blocks over the
      padded width of a strided layer), 31 pixel steps and the taps' reach; zeros there */
   const int64_t margin = (e->sh + 1) * Wp + 64 * e->sw + e->kw * e->dw + 64;
   const int64_t prow = ntap * nsteps * 16;
   const size_t xbytes = (size_t)((e->N * Dp * Hp * Wp + margin) * Cs) * 2;
   const size_t wbytes = (size_t)(nq * 32 * prow) * 4;
   uint16_t *xp = lm_alloc(xbytes);
   uint32_t *wk = xp ? lm_alloc(wbytes) : NULL;
   if (!wk) {
      if (xp) lm_free(xp, xbytes);
      return LM_ERR_OOM;
   }
   pad_copy3(x, e->N, D, e->H, e->W, e->C, three ? e->pd : 0, e->ph, e->pw, Dp, Hp, Wp, Cs,
             margin, xp);
   pack_taps(ntap, rowsmode ? e->kw * e->C : e->C, e->O, nsteps, prow,
             rowsmode ? tap_rows : tap_plain, ws, wk);
   int64_t toff[AMX_MAXTAPS];
   const int64_t per_d = ntap / kd; /* the taps of one depth plane */
   for (int64_t t = 0; t < ntap; t++) {
      const int64_t td = t / per_d, tt = t % per_d;
      toff[t] = (three ? td * e->dd * Hp * Wp : 0) +
                (rowsmode ? tt * e->dh * Wp : (tt / e->kw) * e->dh * Wp + (tt % e->kw) * e->dw);
   }
   const eng_plan pl = {xp, e->N * Do, Hp, Wp, Cs, nsteps, rowsmode, e->kw * e->C, e->sw,
                        ntap, toff, wk, prow, e->O,
                        e->Ho, e->Wo, e->sh, e->sw, e->Ho, e->Wo, 0, 0, 1, 1, *ep, out,
                        Do, Dp * Hp * Wp, three ? e->sd * Hp * Wp : 0};
   core(&pl);
   lm_free(wk, wbytes);
   lm_free(xp, xbytes);
   return LM_OK;
}

/* backward data of a strided layer, by phases (as conv_direct_bf16_avx512bf16.c): grad_x pixels
   (a + sh u, b + sw v) use the taps (i, j) with (a + ph - i dh) and (b + pw - j dw) divisible by
   the strides, at grad_out pixel (u + di, v + dj), di = (a + ph - i dh) / sh: a stride-1
   product over a padded copy of grad_out with those taps, written with a pixel step of (sh, sw);
   a phase without taps writes zeros */
typedef struct {
   const uint16_t *w;
   int64_t K, C;
   const int64_t *tap; /* (i * kw + j) of each tap of the phase */
} phase_src;

static const uint16_t *tap_phase(const void *ctx, int64_t t, int64_t *rsb, int64_t *csb) {
   const phase_src *s = ctx;
   *rsb = s->K; /* B_t(o, c) = w[o][i][j][c] */
   *csb = 1;
   return s->w + s->tap[t] * s->C;
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static lm_status bwdd_phases(const conv_geom *g, const uint16_t *gout, const uint16_t *w,
                             void *gx, int f32) {
   const lm_amx_epi ep = {NULL, NULL, 0, 0, 0, f32};
   const size_t es = f32 ? 4 : 2;
   const int64_t O = g->O, C = g->C, Os = rup(O, 32), nsteps = Os / 32;
   /* the padding of grad_out that every tap offset of every phase stays inside */
   int64_t dmin = 0, dmax = 0, emin = 0, emax = 0;
   for (int64_t i = 0; i < g->kh; i++)
      for (int64_t a = 0; a < g->sh; a++) {
         const int64_t d = floor_div(a + g->ph - i * g->dh, g->sh);
         if (d < dmin) dmin = d;
         if (d > dmax) dmax = d;
      }
   for (int64_t j = 0; j < g->kw; j++)
      for (int64_t b = 0; b < g->sw; b++) {
         const int64_t d = floor_div(b + g->pw - j * g->dw, g->sw);
         if (d < emin) emin = d;
         if (d > emax) emax = d;
      }
   const int64_t pt = -dmin, pl_ = -emin;
   const int64_t Hp = g->Ho + pt + dmax + 1, Wp = g->Wo + pl_ + emax + 1;
   /* pad_copy pads symmetrically: take the larger side and offset the taps */
   const int64_t ph2 = pt > dmax + 1 ? pt : dmax + 1, pw2 = pl_ > emax + 1 ? pl_ : emax + 1;
   const int64_t Hq = g->Ho + 2 * ph2, Wq = g->Wo + 2 * pw2;
   (void)Hp, (void)Wp;
   /* a phase's rows (Hg <= ceil(H / sh)) may outrun grad_out's (rows of x no output reads): the
      rows its last blocks read past the last image, plus a tile's worth, are zeros */
   const int64_t hg_max = (g->H + g->sh - 1) / g->sh;
   const int64_t extra = hg_max + dmax + ph2 + 2 - Hq > 0 ? hg_max + dmax + ph2 + 2 - Hq : 0;
   const int64_t margin = (extra + 2) * Wq + 128;
   const size_t xbytes = (size_t)((g->N * Hq * Wq + margin) * Os) * 2;
   const int64_t maxtap = g->kh * g->kw;
   const int64_t prow_max = maxtap * nsteps * 16;
   const int64_t nq = (C + 31) / 32;
   const size_t wbytes = (size_t)(nq * 32 * prow_max) * 4;
   uint16_t *xp = lm_alloc(xbytes);
   uint32_t *wk = xp ? lm_alloc(wbytes) : NULL;
   if (!wk) {
      if (xp) lm_free(xp, xbytes);
      return LM_ERR_OOM;
   }
   pad_copy(gout, g->N, g->Ho, g->Wo, O, ph2, pw2, Hq, Wq, Os, margin, xp);
   lm_status st = LM_OK;
   int64_t tap[AMX_MAXTAPS], toff[AMX_MAXTAPS];
   for (int64_t a = 0; a < g->sh && st == LM_OK; a++)
      for (int64_t b = 0; b < g->sw && st == LM_OK; b++) {
         const int64_t Hg = a < g->H ? (g->H - a + g->sh - 1) / g->sh : 0;
         const int64_t Wg = b < g->W ? (g->W - b + g->sw - 1) / g->sw : 0;
         if (Hg == 0 || Wg == 0) continue;
         int64_t ntap = 0;
         for (int64_t i = 0; i < g->kh; i++) {
            const int64_t ri = a + g->ph - i * g->dh;
            if (((ri % g->sh) + g->sh) % g->sh) continue;
            for (int64_t j = 0; j < g->kw; j++) {
               const int64_t rj = b + g->pw - j * g->dw;
               if (((rj % g->sw) + g->sw) % g->sw) continue;
               tap[ntap] = i * g->kw + j;
               toff[ntap] = (floor_div(ri, g->sh) + ph2) * Wq + floor_div(rj, g->sw) + pw2;
               ntap++;
            }
         }
         if (ntap == 0) { /* no tap reaches these pixels: zeros */
            for (int64_t n = 0; n < g->N; n++)
               for (int64_t u = 0; u < Hg; u++)
                  for (int64_t v = 0; v < Wg; v++)
                     memset((char *)gx +
                               ((n * g->H + a + g->sh * u) * g->W + b + g->sw * v) * C * es,
                            0, (size_t)C * es);
            continue;
         }
         const int64_t prow = ntap * nsteps * 16;
         const phase_src ps = {w, g->K, C, tap};
         pack_taps(ntap, O, C, nsteps, prow, tap_phase, &ps, wk);
         const eng_plan pl = {xp, g->N, Hq, Wq, Os, nsteps, 0, 0, 1,
                              ntap, toff, wk, prow, C,
                              Hg, Wg, 1, 1, g->H, g->W, a, b, g->sh, g->sw, ep, gx,
                              1, Hq * Wq, 0};
         core(&pl);
      }
   lm_free(wk, wbytes);
   lm_free(xp, xbytes);
   return st;
}

/* output pixel i of a strided 1x1 convolution -> its input pixel */
static int64_t strided_row(const lm_amx_rows *r, int64_t i) {
   const int64_t wo = i % r->Wo, t = i / r->Wo, ho = t % r->Ho, n = t / r->Ho;
   return (n * r->H + ho * r->sh) * r->W + wo * r->sw;
}

lm_status lm_conv_fwd_nhwc_amx(const conv_geom *g, const uint16_t *x, const uint16_t *w,
                               const float *bias, const void *res, int act, void *out, int f32,
                               int *stream) {
   const int64_t P = g->N * g->Ho * g->Wo;
   const int64_t es = f32 ? 4 : 2;
   *stream = (g->O * es) % 64 == 0 && ((uintptr_t)out & 63) == 0 && !f32 &&
             lm_amx_stream((double)P * g->O * es, *stream);
   const lm_amx_epi ep = {bias, res, g->O, act, *stream, f32};
   const int nt = conv_threads((double)P * g->O * g->C);
   if (conv_is_pointwise(g)) /* out (P x O) = x (P x C) . w^T, w (O x C) */
      return lm_bgemm_amx_epi(P, g->O, g->C, x, g->C, 1, NULL, w, 1, g->C, out, g->O, &ep, nt)
                ? LM_OK
                : LM_ERR_OOM;
   if (g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0) {
      /* strided 1x1 (the downsampling shortcuts): the same GEMM over the pixels it reads */
      const lm_amx_rows rows = {strided_row, g->C, g->H, g->W, g->Ho, g->Wo, g->sh, g->sw};
      return lm_bgemm_amx_epi(P, g->O, g->C, x, 0, 1, &rows, w, 1, g->C, out, g->O, &ep, nt)
                ? LM_OK
                : LM_ERR_OOM;
   }
   const eng_geom e = {g->N, g->C, g->H, g->W, g->O, g->Ho, g->Wo, g->kh, g->kw,
                       g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, 0, 0, 0, 0, 0, 0};
   const wsrc ws = {w, g->K, g->C, g->kh, g->kw, 0};
   return engine(&e, x, &ws, &ep, out);
}

lm_status lm_conv_bwdd_nhwc_amx(const conv_geom *g, const uint16_t *gout, const uint16_t *w,
                                void *gx, int f32) {
   const lm_amx_epi ep = {NULL, NULL, 0, 0, 0, f32};
   if (conv_is_pointwise(g)) {
      /* gx (P x C) = gout (P x O) . w, w (O x C) */
      const int64_t P = g->N * g->H * g->W;
      if (lm_bgemm_amx_epi(P, g->C, g->O, gout, g->O, 1, NULL, w, g->C, 1, gx, g->C,
                           f32 ? &ep : NULL, conv_threads((double)P * g->O * g->C)))
         return LM_OK;
      return LM_ERR_OOM;
   }
   if (g->sh != 1 || g->sw != 1 || g->ph > (g->kh - 1) * g->dh || g->pw > (g->kw - 1) * g->dw)
      return bwdd_phases(g, gout, w, gx, f32);
   /* grad_x = grad_out (padded by (k-1)d - p) convolved with the flipped, transposed kernel */
   const eng_geom e = {g->N, g->O, g->Ho, g->Wo, g->C, g->H, g->W, g->kh, g->kw,
                       1, 1, (g->kh - 1) * g->dh - g->ph, (g->kw - 1) * g->dw - g->pw,
                       g->dh, g->dw, 0, 0, 0, 0, 0, 0};
   const wsrc ws = {w, g->K, g->C, g->kh, g->kw, 1};
   return engine(&e, gout, &ws, &ep, gx);
}

/* ---------------------------------------------------------------------------------------------
 * conv3d on the tiles (LM_OP_CONV3D, kernels/cpu/conv.c): x (N, D, H, W, C) and w (O, kd, kh,
 * kw, C) channels_last_3d, out (N, Do, Ho, Wo, O). The engine above with the depth taps as more
 * taps of one padded copy of the clips (no gathered copy of kd times the input, one float32 sum
 * over every tap and one rounding, as PyTorch). lm_conv3d_amx_usable: groups 1, the 2-D rules
 * for the channels (rows mode: kd * kh rows of at most 64 values, two steps a row at most).
 */
int lm_conv3d_amx_usable(const conv3d_geom *g3) {
   const conv_geom *g = &g3->g;
   if (!lm_impl_on(LM_IMPL_CONV3D_AMX_BF16)) return 0;
   if (g->G != 1 || g->O < 16 || g3->kd * g->kh * g->kw > AMX_MAXTAPS) return 0;
   if (!amx_pays_2d(g->C, g->O, g3->kd * g->kh, g->kw)) return 0;
   if (g->C < 16)
      return g->C * g->kw <= 64 && g->dw == 1 &&
             g3->kd * g->kh * ((g->C * g->kw + 31) / 32) <= AMX_MAXROWS;
   return 1;
}

lm_status lm_conv3d_fwd_ndhwc_amx(const conv3d_geom *g3, const uint16_t *x, const uint16_t *w,
                                  const float *bias, const uint16_t *res, int act, uint16_t *out,
                                  int *stream) {
   const conv_geom *g = &g3->g;
   const int64_t P = g->N * g3->Do * g->Ho * g->Wo;
   *stream = (g->O * 2) % 64 == 0 && ((uintptr_t)out & 63) == 0 &&
             lm_amx_stream((double)P * g->O * 2, *stream);
   const lm_amx_epi ep = {bias, res, g->O, act, *stream, 0};
   const eng_geom e = {g->N, g->C, g->H, g->W, g->O, g->Ho, g->Wo, g->kh, g->kw,
                       g->sh, g->sw, g->ph, g->pw, g->dh, g->dw,
                       g3->D, g3->Do, g3->kd, g3->sd, g3->pd, g3->dd};
   /* tap t of (kd, kh, kw) is w[o][t][c]: the 2-D tap rule with kd * kh kernel rows */
   const wsrc ws = {w, g3->kd * g->kh * g->kw * g->C, g->C, g3->kd * g->kh, g->kw, 0};
   return engine(&e, x, &ws, &ep, out);
}
