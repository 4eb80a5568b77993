/* conv_tmpl.c -- the convolution kernels, written once for both element types.
 *
 * conv.c includes this file twice, with LM_CONV_TMPL defined and
 *   CT          the element type (float, double)
 *   CS(name)    the name with the type suffix (name##_f32, name##_f64)
 *   CGEMM       lm_sgemm / lm_dgemm (row-major, trans flags)
 * Compiled on its own (the Makefile compiles every C file under kernels/cpu) it is empty.
 *
 * Memory layouts the kernels see (everything dense in the chosen format; conv.c makes it so):
 *   NHWC: x[n][h][w][c], out[n][ho][wo][o], weights (O, kh, kw, Cg) = an O x K row-major matrix
 *         with K = kh*kw*Cg ordered (i, j, c); the rows of group g are g*Og .. g*Og+Og-1.
 *   NCHW: x[n][c][h][w], out[n][o][ho][wo], weights (O, Cg, kh, kw) = O x K with K ordered (c,i,j).
 *
 * Paths:
 *   forward NHWC   tiles of T output pixels (flattened over n, ho, wo); each thread gathers the
 *                  kh*kw contiguous channel vectors of each pixel into a panel of T rows laid out
 *                  [G][kh][kw][Cg] (the im2col "rows of K"), then one GEMM per group:
 *                  out[T x Og] = panel_g[T x K] * W_g^T. A 1x1 / stride 1 / no padding
 *                  convolution reads x in place (lda = C). Bias, residual and the activation
 *                  are applied to the tile while it is in cache.
 *   forward NCHW   tiles of T output pixels of one image; im2col of each group into col[K x T],
 *                  GEMM out_g[Og x T] = W_g[Og x K] * col (1x1/s1/p0 reads x in place).
 *   backward data  stride 1: the forward kernels on grad_out with the flipped, transposed weights
 *                  (a transposed convolution is a convolution; padding d*(k-1)-p, which may be
 *                  negative, is fine for the gather). Stride > 1: GEMM col = grad_out_g * W_g per
 *                  tile, then col2im scatter-add; work units are bands of output rows of one image,
 *                  run in two phases (even bands, then odd bands) so no two threads ever add to
 *                  the same input row.
 *   backward weight  per-thread partial sums of grad_out_g^T * panel_g (NHWC) or
 *                  grad_out_g * col^T (NCHW) over tiles of pixels, reduced at the end; the bias
 *                  gradient is summed in the same pass.
 *   depthwise      (groups == C == O) direct kernels: NHWC vectorized over C, NCHW per plane.
 */
#ifdef LM_CONV_TMPL

/* ---------------------------------------------------------------------------------------------
 * epilogues: v = acc + bias + residual, then the activation act (lm_conv_act; act.h: relu keeps
 * NaN, as torch.relu)
 */
static void CS(epi_nhwc)(CT *out, int64_t rows, int64_t O, const CT *bias, const CT *res,
                         int act) {
   if (!bias && !res && !act) return;
#ifdef CONV_EPI_NHWC_AVX2
   /* float32 at AVX2: the same sums and activation on 8 lanes (conv_epi_f32_avx2.c) */
   if (lm_cpu_isa() == LM_ISA_AVX2) {
      CONV_EPI_NHWC_AVX2(out, rows, O, bias, res, act);
      return;
   }
#endif
   for (int64_t p = 0; p < rows; p++) {
      CT *o = out + p * O;
      const CT *r = res ? res + p * O : NULL;
      if (bias)
         for (int64_t c = 0; c < O; c++) o[c] += bias[c];
      if (r)
         for (int64_t c = 0; c < O; c++) o[c] += r[c];
      if (act) CS(lm_act_row)(o, O, act);
   }
}

/* NCHW: `nch` channel rows of `len` pixels, row stride ld; bias indexed from c0 */
static void CS(epi_nchw)(CT *out, int64_t nch, int64_t len, int64_t ld, const CT *bias,
                         const CT *res, int act) {
   if (!bias && !res && !act) return;
   for (int64_t c = 0; c < nch; c++) {
      CT *o = out + c * ld;
      const CT *r = res ? res + c * ld : NULL;
      CT b = bias ? bias[c] : (CT)0;
      if (r) {
         for (int64_t q = 0; q < len; q++) o[q] += b + r[q];
      } else if (bias) {
         for (int64_t q = 0; q < len; q++) o[q] += b;
      }
      if (act) CS(lm_act_row)(o, len, act);
   }
}

/* ---------------------------------------------------------------------------------------------
 * NHWC im2col of output pixels [p0, p0+np) into panel rows of G*K, each laid out [G][kh][kw][Cg]
 */
static void CS(panel_nhwc)(const conv_geom *g, const CT *x, int64_t p0, int64_t np, CT *panel) {
   const int64_t C = g->C, H = g->H, W = g->W, Wo = g->Wo, HoWo = g->Ho * g->Wo;
   const int64_t kh = g->kh, kw = g->kw, G = g->G, Cg = g->Cg, K = g->K;
   const int64_t rowlen = G * K;
   int64_t n = p0 / HoWo, r = p0 % HoWo, ho = r / Wo, wo = r % Wo;
   for (int64_t p = 0; p < np; p++) {
      CT *dst = panel + p * rowlen;
      const CT *xn = x + n * H * W * C;
      for (int64_t i = 0; i < kh; i++) {
         const int64_t hi = ho * g->sh - g->ph + i * g->dh;
         const int hv = hi >= 0 && hi < H;
         for (int64_t j = 0; j < kw; j++) {
            const int64_t wi = wo * g->sw - g->pw + j * g->dw;
            const CT *src = (hv && wi >= 0 && wi < W) ? xn + (hi * W + wi) * C : NULL;
            const int64_t tap = i * kw + j;
            if (G == 1) {
               if (src)
                  memcpy(dst + tap * C, src, (size_t)C * sizeof(CT));
               else
                  memset(dst + tap * C, 0, (size_t)C * sizeof(CT));
            } else {
               for (int64_t gi = 0; gi < G; gi++) {
                  CT *d = dst + gi * K + tap * Cg;
                  if (src) {
                     const CT *s = src + gi * Cg;
                     for (int64_t c = 0; c < Cg; c++) d[c] = s[c];
                  } else {
                     for (int64_t c = 0; c < Cg; c++) d[c] = (CT)0;
                  }
               }
            }
         }
      }
      if (++wo == Wo) {
         wo = 0;
         if (++ho == g->Ho) {
            ho = 0;
            n++;
         }
      }
   }
}

/* ---------------------------------------------------------------------------------------------
 * NCHW im2col of the pixels [p0, p0+np) of one image and one group: xg points at the group's
 * first input plane; col is K x np (row k = (c, i, j)).
 */
static void CS(col_nchw)(const conv_geom *g, const CT *xg, int64_t p0, int64_t np, CT *col) {
   const int64_t H = g->H, W = g->W, Wo = g->Wo, kh = g->kh, kw = g->kw;
   for (int64_t c = 0; c < g->Cg; c++) {
      const CT *xc = xg + c * H * W;
      for (int64_t i = 0; i < kh; i++) {
         for (int64_t j = 0; j < kw; j++) {
            CT *row = col + ((c * kh + i) * kw + j) * np;
            int64_t lo, hi_;
            conv_valid_range(W, Wo, g->sw, g->pw, j * g->dw, &lo, &hi_);
            int64_t ho = p0 / Wo, wo0 = p0 % Wo, q = 0;
            while (q < np) {
               int64_t cnt = Wo - wo0;
               if (cnt > np - q) cnt = np - q;
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               CT *d = row + q - wo0; /* d[wo] for wo in [wo0, wo0+cnt) */
               if (hi < 0 || hi >= H) {
                  for (int64_t wo = wo0; wo < wo0 + cnt; wo++) d[wo] = (CT)0;
               } else {
                  const CT *xr = xc + hi * W - g->pw + j * g->dw; /* xr[wo*sw] */
                  int64_t a = lo > wo0 ? lo : wo0, b = hi_ < wo0 + cnt ? hi_ : wo0 + cnt;
                  if (a > b) a = b;
                  for (int64_t wo = wo0; wo < a; wo++) d[wo] = (CT)0;
                  if (g->sw == 1) {
                     if (b > a) memcpy(d + a, xr + a, (size_t)(b - a) * sizeof(CT));
                  } else {
                     const int64_t sw = g->sw;
                     for (int64_t wo = a; wo < b; wo++) d[wo] = xr[wo * sw];
                  }
                  for (int64_t wo = b; wo < wo0 + cnt; wo++) d[wo] = (CT)0;
               }
               q += cnt;
               ho++;
               wo0 = 0;
            }
         }
      }
   }
}

/* ---------------------------------------------------------------------------------------------
 * forward, NHWC
 */
static lm_status CS(fwd_nhwc)(const conv_geom *g, const CT *x, const CT *w, const CT *bias,
                              const CT *res, int act, CT *out) {
   const int64_t P = g->N * g->Ho * g->Wo, O = g->O, G = g->G, K = g->K, Og = g->Og;
   const int64_t rowlen = G * K;
   if (P == 0 || O == 0) return LM_OK;
   const int direct = conv_is_pointwise(g);
   const int nthr = conv_threads((double)P * (double)O * (double)(K > 0 ? K : 1));
   const int64_t T = conv_tile_rows(P, rowlen * (int64_t)sizeof(CT), nthr);
   const int64_t ntiles = (P + T - 1) / T;
   CT *buf = NULL;
   size_t bytes = 0;
   if (!direct && K > 0) {
      bytes = (size_t)nthr * (size_t)(T * rowlen) * sizeof(CT);
      buf = (CT *)lm_alloc(bytes);
      if (!buf) return LM_ERR_OOM;
   }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t t = 0; t < ntiles; t++) {
      const int64_t p0 = t * T, np = P - p0 < T ? P - p0 : T;
      CT *o = out + p0 * O;
      if (K == 0) {
         memset(o, 0, (size_t)(np * O) * sizeof(CT));
      } else {
         const CT *a;
         int64_t lda;
         if (direct) {
            a = x + p0 * g->C;
            lda = g->C;
         } else {
            CT *panel = buf + (int64_t)conv_thread_id() * T * rowlen;
            CS(panel_nhwc)(g, x, p0, np, panel);
            a = panel;
            lda = rowlen;
         }
         for (int64_t gi = 0; gi < G; gi++)
            CGEMM(0, 1, np, Og, K, (CT)1, a + gi * K, lda, w + gi * Og * K, K, (CT)0, o + gi * Og,
                  O);
      }
      CS(epi_nhwc)(o, np, O, bias, res ? res + p0 * O : NULL, act);
   }
   if (buf) lm_free(buf, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * forward, NCHW
 */
static lm_status CS(fwd_nchw)(const conv_geom *g, const CT *x, const CT *w, const CT *bias,
                              const CT *res, int act, CT *out) {
   const int64_t HoWo = g->Ho * g->Wo, HW = g->H * g->W, O = g->O, G = g->G, K = g->K;
   const int64_t Og = g->Og, Cg = g->Cg, C = g->C;
   if (g->N == 0 || HoWo == 0 || O == 0) return LM_OK;
   const int direct = conv_is_pointwise(g);
   const int nthr =
      conv_threads((double)g->N * (double)HoWo * (double)O * (double)(K > 0 ? K : 1));
   const int64_t T = conv_tile_cols(g->N, HoWo, K * (int64_t)sizeof(CT), nthr);
   const int64_t tpi = (HoWo + T - 1) / T, units = g->N * tpi;
   CT *buf = NULL;
   size_t bytes = 0;
   if (!direct && K > 0) {
      bytes = (size_t)nthr * (size_t)(K * T) * sizeof(CT);
      buf = (CT *)lm_alloc(bytes);
      if (!buf) return LM_ERR_OOM;
   }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t u = 0; u < units; u++) {
      const int64_t n = u / tpi, p0 = (u % tpi) * T, np = HoWo - p0 < T ? HoWo - p0 : T;
      CT *col = buf ? buf + (int64_t)conv_thread_id() * K * T : NULL;
      for (int64_t gi = 0; gi < G; gi++) {
         CT *o = out + (n * O + gi * Og) * HoWo + p0;
         if (K == 0) {
            for (int64_t c = 0; c < Og; c++) memset(o + c * HoWo, 0, (size_t)np * sizeof(CT));
         } else if (direct) {
            CGEMM(0, 0, Og, np, K, (CT)1, w + gi * Og * K, K, x + (n * C + gi * Cg) * HW + p0, HW,
                  (CT)0, o, HoWo);
         } else {
            CS(col_nchw)(g, x + (n * C + gi * Cg) * HW, p0, np, col);
            CGEMM(0, 0, Og, np, K, (CT)1, w + gi * Og * K, K, col, np, (CT)0, o, HoWo);
         }
         CS(epi_nchw)(o, Og, np, HoWo, bias ? bias + gi * Og : NULL,
                      res ? res + (n * O + gi * Og) * HoWo + p0 : NULL, act);
      }
   }
   if (buf) lm_free(buf, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * weights for backward data as a forward convolution (stride 1): the flipped kernel with in- and
 * out-channels swapped per group. Result: C x (kh*kw*Og) (NHWC, ordered (i,j,o)) or C x (Og*kh*kw)
 * (NCHW, ordered (o,i,j)).
 */
/* in 32 x 32 blocks of (input, output) channels, so that both the reads (along the input
   channels in NHWC, along the taps in NCHW) and the writes stay within a few dozen lines: with
   the output channel innermost each read came from another line (NHWC 440 x 440 x 1 x 1: about
   1 ms on a Zen 3, a third of the gradient it served) */
static void CS(flip_weights)(const conv_geom *g, int nhwc, const CT *w, CT *wt) {
   enum { FB = 32 };
   const int64_t kh = g->kh, kw = g->kw, Cg = g->Cg, Og = g->Og, G = g->G;
   for (int64_t gi = 0; gi < G; gi++)
      for (int64_t c0 = 0; c0 < Cg; c0 += FB)
         for (int64_t o0 = 0; o0 < Og; o0 += FB) {
            const int64_t c1 = c0 + FB < Cg ? c0 + FB : Cg, o1 = o0 + FB < Og ? o0 + FB : Og;
            for (int64_t o = o0; o < o1; o++)
               for (int64_t i = 0; i < kh; i++)
                  for (int64_t j = 0; j < kw; j++)
                     for (int64_t c = c0; c < c1; c++) {
                        const int64_t co = gi * Og + o, ci = gi * Cg + c;
                        const int64_t fi = kh - 1 - i, fj = kw - 1 - j;
                        CT v = nhwc ? w[((co * kh + fi) * kw + fj) * Cg + c]
                                    : w[((co * Cg + c) * kh + fi) * kw + fj];
                        if (nhwc)
                           wt[((ci * kh + i) * kw + j) * Og + o] = v;
                        else
                           wt[((ci * Og + o) * kh + i) * kw + j] = v;
                     }
         }
}

static void CS(zero)(CT *p, int64_t n, int nthr) {
   const int64_t chunk = 1 << 16, nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(nthr) if (nthr > 1 && nchunks > 1)
   for (int64_t c = 0; c < nchunks; c++) {
      int64_t a = c * chunk, b = a + chunk < n ? a + chunk : n;
      memset(p + a, 0, (size_t)(b - a) * sizeof(CT));
   }
}

/* ---------------------------------------------------------------------------------------------
 * backward data by col2im (any stride): grad_x must be zero on entry
 */
static lm_status CS(bwdd_col2im)(const conv_geom *g, int nhwc, const CT *gout, const CT *w,
                                 CT *gx) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, O = g->O, Ho = g->Ho, Wo = g->Wo;
   const int64_t HoWo = Ho * Wo, G = g->G, K = g->K, Og = g->Og, Cg = g->Cg;
   const int64_t kh = g->kh, kw = g->kw, rowlen = G * K;
   if (N == 0 || HoWo == 0 || K == 0 || Og == 0) return LM_OK;
   if (nhwc && conv_is_pointwise(g)) {
      /* NHWC 1x1 stride 1: grad_x is gout W, one GEMM a group over every pixel (threads inside
         the GEMM) instead of a GEMM per tile into a column buffer added into grad_x: 440 -> 440
         channels at 8 x 7 x 7 took 3.6 ms that way on a Zen 3 (2 threads, AVX2), PyTorch 0.9 */
      for (int64_t gi = 0; gi < G; gi++)
         CGEMM(0, 0, N * HoWo, K, Og, (CT)1, gout + gi * Og, O, w + gi * Og * K, K, (CT)0,
               gx + gi * K, C);
      return LM_OK;
   }
   const int nthr = conv_threads((double)N * (double)HoWo * (double)O * (double)K);
   int64_t B, nb;
   conv_bands(N, Ho, kh, g->sh, g->dh, nthr, &B, &nb);
   /* tile: NHWC T pixels x rowlen; NCHW K x T pixels (per group) */
   const int64_t T =
      nhwc ? conv_tile_rows(B * Wo, rowlen * (int64_t)sizeof(CT), 1)
           : conv_tile_cols(1, B * Wo, K * (int64_t)sizeof(CT), 1);
   const size_t per = (size_t)(T * (nhwc ? rowlen : K));
   const size_t bytes = (size_t)nthr * per * sizeof(CT);
   CT *buf = (CT *)lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
   const int64_t units = N * nb;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      CT *col = buf + (size_t)conv_thread_id() * per;
      for (int phase = 0; phase < 2; phase++) {
#pragma omp for schedule(dynamic, 1)
         for (int64_t u = 0; u < units; u++) {
            const int64_t n = u / nb, b = u % nb;
            if ((b & 1) != phase) continue;
            const int64_t r0 = b * B, r1 = r0 + B < Ho ? r0 + B : Ho;
            for (int64_t q0 = r0 * Wo; q0 < r1 * Wo; q0 += T) {
               const int64_t np = r1 * Wo - q0 < T ? r1 * Wo - q0 : T;
               if (nhwc) {
                  const CT *go = gout + (n * HoWo + q0) * O;
                  for (int64_t gi = 0; gi < G; gi++)
                     CGEMM(0, 0, np, K, Og, (CT)1, go + gi * Og, O, w + gi * Og * K, K, (CT)0,
                           col + gi * K, rowlen);
                  CT *gxn = gx + n * H * W * C;
                  for (int64_t q = 0; q < np; q++) {
                     const int64_t ho = (q0 + q) / Wo, wo = (q0 + q) % Wo;
                     const CT *src = col + q * rowlen;
                     for (int64_t i = 0; i < kh; i++) {
                        const int64_t hi = ho * g->sh - g->ph + i * g->dh;
                        if (hi < 0 || hi >= H) continue;
                        for (int64_t j = 0; j < kw; j++) {
                           const int64_t wi = wo * g->sw - g->pw + j * g->dw;
                           if (wi < 0 || wi >= W) continue;
                           CT *d = gxn + (hi * W + wi) * C;
                           const int64_t tap = i * kw + j;
                           if (G == 1) {
                              const CT *s = src + tap * C;
                              for (int64_t c = 0; c < C; c++) d[c] += s[c];
                           } else {
                              for (int64_t gi = 0; gi < G; gi++) {
                                 const CT *s = src + gi * K + tap * Cg;
                                 CT *dg = d + gi * Cg;
                                 for (int64_t c = 0; c < Cg; c++) dg[c] += s[c];
                              }
                           }
                        }
                     }
                  }
               } else {
                  for (int64_t gi = 0; gi < G; gi++) {
                     CGEMM(1, 0, K, np, Og, (CT)1, w + gi * Og * K, K,
                           gout + (n * O + gi * Og) * HoWo + q0, HoWo, (CT)0, col, np);
                     CT *gxg = gx + (n * C + gi * Cg) * H * W;
                     for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < kh; i++)
                           for (int64_t j = 0; j < kw; j++) {
                              const CT *s = col + ((c * kh + i) * kw + j) * np;
                              CT *gp = gxg + c * H * W;
                              int64_t lo, hi_;
                              conv_valid_range(W, Wo, g->sw, g->pw, j * g->dw, &lo, &hi_);
                              /* walk the tile one output row at a time */
                              int64_t ho = q0 / Wo, wo0 = q0 % Wo, q = 0;
                              while (q < np) {
                                 int64_t cnt = Wo - wo0;
                                 if (cnt > np - q) cnt = np - q;
                                 const int64_t hi = ho * g->sh - g->ph + i * g->dh;
                                 if (hi >= 0 && hi < H) {
                                    const CT *sr = s + q - wo0; /* sr[wo] */
                                    CT *xr = gp + hi * W - g->pw + j * g->dw; /* xr[wo*sw] */
                                    const int64_t a = lo > wo0 ? lo : wo0;
                                    const int64_t b = hi_ < wo0 + cnt ? hi_ : wo0 + cnt;
                                    const int64_t sw = g->sw;
                                    for (int64_t wo = a; wo < b; wo++) xr[wo * sw] += sr[wo];
                                 }
                                 q += cnt;
                                 ho++;
                                 wo0 = 0;
                              }
                           }
                  }
               }
            }
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * backward weight (and bias): gw is O x K dense (the weight layout of the format), gb O (or NULL)
 */
static lm_status CS(bwdw)(const conv_geom *g, int nhwc, const CT *x, const CT *gout, CT *gw,
                          CT *gb) {
   const int64_t N = g->N, C = g->C, HW = g->H * g->W, O = g->O, HoWo = g->Ho * g->Wo;
   const int64_t G = g->G, K = g->K, Og = g->Og, Cg = g->Cg, rowlen = G * K;
   const int64_t P = N * HoWo, OK = O * K;
   if (gw) CS(zero)(gw, OK, 1);
   if (gb) CS(zero)(gb, O, 1);
   if (P == 0 || O == 0) return LM_OK;
   if (!gw && !gb) return LM_OK;
   const int direct = conv_is_pointwise(g);
   /* NHWC 1x1 stride 1: grad_w of each group is one GEMM over every pixel, gout^T x (the GEMM
      splits it between the threads and reads both operands where they are, gemm_tmpl.c), rather
      than a GEMM per tile of pixels into per-thread partial sums, whose C (O x K) was read and
      written once a tile: 440 -> 440 channels at 8 x 7 x 7 (RegNet) took 3.6 ms that way on a
      Zen 3 (2 threads, AVX2). The loop below then sums grad_b alone. */
   if (nhwc && direct && gw && K > 0) {
      for (int64_t gi = 0; gi < G; gi++)
         CGEMM(1, 0, Og, K, P, (CT)1, gout + gi * Og, O, x + gi * K, C, (CT)0, gw + gi * Og * K,
               K);
      if (!gb) return LM_OK;
      gw = NULL;
   }
   const int nthr = conv_threads((double)P * (double)O * (double)(K > 0 ? K : 1));
   int64_t T, units, tpi = 1;
   if (nhwc) {
      T = conv_tile_rows(P, rowlen * (int64_t)sizeof(CT), nthr);
      units = (P + T - 1) / T;
   } else {
      T = conv_tile_cols(N, HoWo, K * (int64_t)sizeof(CT), nthr);
      tpi = (HoWo + T - 1) / T;
      units = N * tpi;
   }
   const size_t colsz = (gw && !direct && K > 0) ? (size_t)(T * (nhwc ? rowlen : K)) : 0;
   const size_t per = colsz + (size_t)(gw ? OK : 0) + (size_t)O;
   const size_t bytes = (size_t)nthr * per * sizeof(CT);
   CT *buf = (CT *)lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      CT *mine = buf + (size_t)conv_thread_id() * per;
      CT *col = mine, *pw = mine + colsz, *pb = pw + (gw ? OK : 0);
      if (gw) memset(pw, 0, (size_t)OK * sizeof(CT));
      memset(pb, 0, (size_t)O * sizeof(CT));
#pragma omp for schedule(static) /* static: the same split (and sums) on every run */
      for (int64_t u = 0; u < units; u++) {
         if (nhwc) {
            const int64_t p0 = u * T, np = P - p0 < T ? P - p0 : T;
            const CT *go = gout + p0 * O;
            if (gw && K > 0) {
               const CT *a;
               int64_t lda;
               if (direct) {
                  a = x + p0 * C;
                  lda = C;
               } else {
                  CS(panel_nhwc)(g, x, p0, np, col);
                  a = col;
                  lda = rowlen;
               }
               for (int64_t gi = 0; gi < G; gi++)
                  CGEMM(1, 0, Og, K, np, (CT)1, go + gi * Og, O, a + gi * K, lda, (CT)1,
                        pw + gi * Og * K, K);
            }
            for (int64_t p = 0; p < np; p++)
               for (int64_t o = 0; o < O; o++) pb[o] += go[p * O + o];
         } else {
            const int64_t n = u / tpi, p0 = (u % tpi) * T, np = HoWo - p0 < T ? HoWo - p0 : T;
            for (int64_t gi = 0; gi < G; gi++) {
               const CT *go = gout + (n * O + gi * Og) * HoWo + p0;
               if (gw && K > 0) {
                  const CT *xg = x + (n * C + gi * Cg) * HW;
                  if (direct) {
                     CGEMM(0, 1, Og, K, np, (CT)1, go, HoWo, xg + p0, HW, (CT)1, pw + gi * Og * K,
                           K);
                  } else {
                     CS(col_nchw)(g, xg, p0, np, col);
                     CGEMM(0, 1, Og, K, np, (CT)1, go, HoWo, col, np, (CT)1, pw + gi * Og * K, K);
                  }
               }
               for (int64_t o = 0; o < Og; o++) {
                  const CT *r = go + o * HoWo;
                  CT s = 0;
                  for (int64_t q = 0; q < np; q++) s += r[q];
                  pb[gi * Og + o] += s;
               }
            }
         }
      }
      /* reduce the per-thread partials (implicit barrier above) */
      const int nt = conv_num_threads_in_team();
      if (gw) {
#pragma omp for schedule(static)
         for (int64_t e0 = 0; e0 < OK; e0 += 1024) {
            const int64_t e1 = e0 + 1024 < OK ? e0 + 1024 : OK;
            for (int t = 0; t < nt; t++) {
               const CT *src = buf + (size_t)t * per + colsz;
               for (int64_t e = e0; e < e1; e++) gw[e] += src[e];
            }
         }
      }
#pragma omp single
      if (gb) {
         for (int t = 0; t < nt; t++) {
            const CT *src = buf + (size_t)t * per + colsz + (size_t)(gw ? OK : 0);
            for (int64_t o = 0; o < O; o++) gb[o] += src[o];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * depthwise (G == C == O): wt is the transposed kernel [kh*kw][C]
 */
static void CS(dw_transpose)(const conv_geom *g, const CT *w, CT *wt) {
   const int64_t C = g->C, taps = g->kh * g->kw;
   for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < taps; t++) wt[t * C + c] = w[c * taps + t];
}

enum { CS(DW_CB) = 64 };

static lm_status CS(dw_fwd_nhwc)(const conv_geom *g, const CT *x, const CT *w, const CT *bias,
                                 const CT *res, int act, CT *out) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, taps = kh * kw;
   if (N * Ho * Wo == 0 || C == 0) return LM_OK;
   const size_t bytes = (size_t)(taps * C) * sizeof(CT);
   CT *wt = (CT *)lm_alloc(bytes);
   if (!wt) return LM_ERR_OOM;
   CS(dw_transpose)(g, w, wt);
   const int nthr = conv_threads((double)N * (double)Ho * (double)Wo * (double)C * (double)taps);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < N * Ho; row++) {
      const int64_t n = row / Ho, ho = row % Ho;
      const CT *xn = x + n * H * W * C;
      for (int64_t wo = 0; wo < Wo; wo++) {
         CT *o = out + ((row * Wo) + wo) * C;
         for (int64_t c0 = 0; c0 < C; c0 += CS(DW_CB)) {
            const int64_t cb = C - c0 < CS(DW_CB) ? C - c0 : CS(DW_CB);
            CT acc[CS(DW_CB)];
            for (int64_t c = 0; c < cb; c++) acc[c] = bias ? bias[c0 + c] : (CT)0;
            for (int64_t i = 0; i < kh; i++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               for (int64_t j = 0; j < kw; j++) {
                  const int64_t wi = wo * g->sw - g->pw + j * g->dw;
                  if (wi < 0 || wi >= W) continue;
                  const CT *xs = xn + (hi * W + wi) * C + c0, *wv = wt + (i * kw + j) * C + c0;
                  if (cb == CS(DW_CB)) {
                     for (int c = 0; c < CS(DW_CB); c++) acc[c] += xs[c] * wv[c];
                  } else {
                     for (int64_t c = 0; c < cb; c++) acc[c] += xs[c] * wv[c];
                  }
               }
            }
            if (res) {
               const CT *r = res + ((row * Wo) + wo) * C + c0;
               for (int64_t c = 0; c < cb; c++) acc[c] += r[c];
            }
            if (act) CS(lm_act_row)(acc, cb, act);
            for (int64_t c = 0; c < cb; c++) o[c0 + c] = acc[c];
         }
      }
   }
   lm_free(wt, bytes);
   return LM_OK;
}

/* gather form: every input pixel sums the output pixels it fed (any stride); race free */
static lm_status CS(dw_bwdd_nhwc)(const conv_geom *g, const CT *gout, const CT *w, CT *gx) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, taps = kh * kw, sh = g->sh, sw = g->sw;
   if (N * H * W == 0 || C == 0) return LM_OK;
   const size_t bytes = (size_t)(taps * C) * sizeof(CT);
   CT *wt = (CT *)lm_alloc(bytes);
   if (!wt) return LM_ERR_OOM;
   CS(dw_transpose)(g, w, wt);
   const int nthr = conv_threads((double)N * (double)Ho * (double)Wo * (double)C * (double)taps);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < N * H; row++) {
      const int64_t n = row / H, hi = row % H;
      const CT *gn = gout + n * Ho * Wo * C;
      for (int64_t wi = 0; wi < W; wi++) {
         CT *d = gx + (row * W + wi) * C;
         for (int64_t c0 = 0; c0 < C; c0 += CS(DW_CB)) {
            const int64_t cb = C - c0 < CS(DW_CB) ? C - c0 : CS(DW_CB);
            CT acc[CS(DW_CB)];
            for (int64_t c = 0; c < cb; c++) acc[c] = (CT)0;
            for (int64_t i = 0; i < kh; i++) {
               const int64_t th = hi + g->ph - i * g->dh;
               if (th < 0 || th % sh) continue;
               const int64_t ho = th / sh;
               if (ho >= Ho) continue;
               for (int64_t j = 0; j < kw; j++) {
                  const int64_t tw = wi + g->pw - j * g->dw;
                  if (tw < 0 || tw % sw) continue;
                  const int64_t wo = tw / sw;
                  if (wo >= Wo) continue;
                  const CT *gs = gn + (ho * Wo + wo) * C + c0, *wv = wt + (i * kw + j) * C + c0;
                  if (cb == CS(DW_CB)) {
                     for (int c = 0; c < CS(DW_CB); c++) acc[c] += gs[c] * wv[c];
                  } else {
                     for (int64_t c = 0; c < cb; c++) acc[c] += gs[c] * wv[c];
                  }
               }
            }
            for (int64_t c = 0; c < cb; c++) d[c0 + c] = acc[c];
         }
      }
   }
   lm_free(wt, bytes);
   return LM_OK;
}

/* gw: [C][kh][kw] (depthwise weights are the same in both formats), gb: C or NULL */
static lm_status CS(dw_bwdw_nhwc)(const conv_geom *g, const CT *x, const CT *gout, CT *gw,
                                  CT *gb) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, taps = kh * kw;
   if (gw) CS(zero)(gw, C * taps, 1);
   if (gb) CS(zero)(gb, C, 1);
   if (N * Ho * Wo == 0 || C == 0) return LM_OK;
   const int nthr = conv_threads((double)N * (double)Ho * (double)Wo * (double)C * (double)taps);
   const int64_t per = (taps + 1) * C;
   const size_t bytes = (size_t)(nthr * per) * sizeof(CT);
   CT *buf = (CT *)lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      CT *pw = buf + conv_thread_id() * per, *pb = pw + taps * C;
      memset(pw, 0, (size_t)per * sizeof(CT));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < N * Ho; row++) {
         const int64_t n = row / Ho, ho = row % Ho;
         const CT *xn = x + n * H * W * C;
         for (int64_t wo = 0; wo < Wo; wo++) {
            const CT *gs = gout + (row * Wo + wo) * C;
            if (gb)
               for (int64_t c = 0; c < C; c++) pb[c] += gs[c];
            if (!gw) continue;
            for (int64_t i = 0; i < kh; i++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               for (int64_t j = 0; j < kw; j++) {
                  const int64_t wi = wo * g->sw - g->pw + j * g->dw;
                  if (wi < 0 || wi >= W) continue;
                  const CT *xs = xn + (hi * W + wi) * C;
                  CT *acc = pw + (i * kw + j) * C;
                  for (int64_t c = 0; c < C; c++) acc[c] += xs[c] * gs[c];
               }
            }
         }
      }
      const int nt = conv_num_threads_in_team();
#pragma omp single
      {
         for (int t = 0; t < nt; t++) {
            const CT *src = buf + t * per;
            if (gw)
               for (int64_t c = 0; c < C; c++)
                  for (int64_t k = 0; k < taps; k++) gw[c * taps + k] += src[k * C + c];
            if (gb)
               for (int64_t c = 0; c < C; c++) gb[c] += src[taps * C + c];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}

/* NCHW depthwise: one plane per (n, c) */
static lm_status CS(dw_fwd_nchw)(const conv_geom *g, const CT *x, const CT *w, const CT *bias,
                                 const CT *res, int act, CT *out) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, sw = g->sw;
   if (N * C == 0 || Ho * Wo == 0) return LM_OK;
   const int nthr = conv_threads((double)N * (double)C * (double)Ho * (double)Wo * (double)(kh * kw));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t pl = 0; pl < N * C; pl++) {
      const int64_t c = pl % C;
      const CT *xp = x + pl * H * W, *wc = w + c * kh * kw;
      CT *op = out + pl * Ho * Wo;
      const CT b = bias ? bias[c] : (CT)0;
      for (int64_t q = 0; q < Ho * Wo; q++) op[q] = b;
      for (int64_t i = 0; i < kh; i++) {
         for (int64_t j = 0; j < kw; j++) {
            const CT wv = wc[i * kw + j];
            int64_t lo, hi_;
            conv_valid_range(W, Wo, sw, g->pw, j * g->dw, &lo, &hi_);
            for (int64_t ho = 0; ho < Ho; ho++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               const CT *xr = xp + hi * W - g->pw + j * g->dw;
               CT *orow = op + ho * Wo;
               if (sw == 1) {
                  for (int64_t wo = lo; wo < hi_; wo++) orow[wo] += wv * xr[wo];
               } else {
                  for (int64_t wo = lo; wo < hi_; wo++) orow[wo] += wv * xr[wo * sw];
               }
            }
         }
      }
      if (res || act) CS(epi_nchw)(op, 1, Ho * Wo, Ho * Wo, NULL, res ? res + pl * Ho * Wo : NULL, act);
   }
   return LM_OK;
}

static lm_status CS(dw_bwdd_nchw)(const conv_geom *g, const CT *gout, const CT *w, CT *gx) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, sw = g->sw;
   if (N * C == 0 || H * W == 0) return LM_OK;
   const int nthr = conv_threads((double)N * (double)C * (double)Ho * (double)Wo * (double)(kh * kw));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t pl = 0; pl < N * C; pl++) {
      const int64_t c = pl % C;
      const CT *gp = gout + pl * Ho * Wo, *wc = w + c * kh * kw;
      CT *xp = gx + pl * H * W;
      memset(xp, 0, (size_t)(H * W) * sizeof(CT));
      for (int64_t i = 0; i < kh; i++) {
         for (int64_t j = 0; j < kw; j++) {
            const CT wv = wc[i * kw + j];
            int64_t lo, hi_;
            conv_valid_range(W, Wo, sw, g->pw, j * g->dw, &lo, &hi_);
            for (int64_t ho = 0; ho < Ho; ho++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               CT *xr = xp + hi * W - g->pw + j * g->dw;
               const CT *grow = gp + ho * Wo;
               if (sw == 1) {
                  for (int64_t wo = lo; wo < hi_; wo++) xr[wo] += wv * grow[wo];
               } else {
                  for (int64_t wo = lo; wo < hi_; wo++) xr[wo * sw] += wv * grow[wo];
               }
            }
         }
      }
   }
   return LM_OK;
}

static lm_status CS(dw_bwdw_nchw)(const conv_geom *g, const CT *x, const CT *gout, CT *gw,
                                  CT *gb) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, sw = g->sw;
   if (C == 0) return LM_OK;
   const int nthr = conv_threads((double)N * (double)C * (double)Ho * (double)Wo * (double)(kh * kw));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1 && C > 1)
   for (int64_t c = 0; c < C; c++) {
      CT sb = 0;
      for (int64_t i = 0; gw && i < kh; i++)
         for (int64_t j = 0; j < kw; j++) {
            int64_t lo, hi_;
            conv_valid_range(W, Wo, sw, g->pw, j * g->dw, &lo, &hi_);
            CT s = 0;
            for (int64_t n = 0; n < N; n++) {
               const CT *xp = x + (n * C + c) * H * W, *gp = gout + (n * C + c) * Ho * Wo;
               for (int64_t ho = 0; ho < Ho; ho++) {
                  const int64_t hi = ho * g->sh - g->ph + i * g->dh;
                  if (hi < 0 || hi >= H) continue;
                  const CT *xr = xp + hi * W - g->pw + j * g->dw, *grow = gp + ho * Wo;
                  if (sw == 1) {
                     for (int64_t wo = lo; wo < hi_; wo++) s += grow[wo] * xr[wo];
                  } else {
                     for (int64_t wo = lo; wo < hi_; wo++) s += grow[wo] * xr[wo * sw];
                  }
               }
            }
            if (gw) gw[(c * kh + i) * kw + j] = s;
         }
      if (gb) {
         for (int64_t n = 0; n < N; n++) {
            const CT *gp = gout + (n * C + c) * Ho * Wo;
            for (int64_t q = 0; q < Ho * Wo; q++) sb += gp[q];
         }
         gb[c] = sb;
      }
   }
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * drivers
 */
static lm_status CS(conv_forward)(const conv_geom *g, int nhwc, const void *x, const void *w,
                                  const void *bias, const void *res, int act, void *out) {
   if (conv_is_depthwise(g))
      return nhwc ? CS(dw_fwd_nhwc)(g, x, w, bias, res, act, out)
                  : CS(dw_fwd_nchw)(g, x, w, bias, res, act, out);
   return nhwc ? CS(fwd_nhwc)(g, x, w, bias, res, act, out)
               : CS(fwd_nchw)(g, x, w, bias, res, act, out);
}

static lm_status CS(conv_backward)(const conv_geom *g, int nhwc, const void *xv, const void *wv,
                                   const void *goutv, void *gxv, void *gwv, void *gbv) {
   const CT *x = xv, *w = wv, *gout = goutv;
   CT *gx = gxv, *gw = gwv, *gb = gbv;
   lm_status st = LM_OK;
   if (gx) {
      const int64_t nx = g->N * g->C * g->H * g->W;
      if (conv_is_depthwise(g)) {
         st = nhwc ? CS(dw_bwdd_nhwc)(g, gout, w, gx) : CS(dw_bwdd_nchw)(g, gout, w, gx);
      } else if (nhwc && conv_is_pointwise(g)) {
         /* one GEMM a group, gout W, writing all of grad_x (bwdd_col2im): no flipped copy of
            the weights. 440 -> 440 at 8 x 7 x 7, Zen 3, 2 threads: grad_x 4.7 -> 1.4 ms */
         st = CS(bwdd_col2im)(g, nhwc, gout, w, gx);
      } else if (g->sh == 1 && g->sw == 1 && g->K > 0 && g->Og > 0) {
         /* a stride-1 transposed convolution is the forward convolution of grad_out with the
            flipped kernel (in/out channels swapped) and padding d*(k-1)-p */
         conv_geom t = *g;
         t.C = g->O;
         t.H = g->Ho;
         t.W = g->Wo;
         t.O = g->C;
         t.Ho = g->H;
         t.Wo = g->W;
         t.ph = g->dh * (g->kh - 1) - g->ph;
         t.pw = g->dw * (g->kw - 1) - g->pw;
         t.Cg = g->Og;
         t.Og = g->Cg;
         t.K = g->Og * g->kh * g->kw;
         const size_t bytes = (size_t)(g->C * t.K) * sizeof(CT);
         CT *wt = (CT *)lm_alloc(bytes);
         if (!wt) return LM_ERR_OOM;
         CS(flip_weights)(g, nhwc, w, wt);
         st = nhwc ? CS(fwd_nhwc)(&t, gout, wt, NULL, NULL, 0, gx)
                   : CS(fwd_nchw)(&t, gout, wt, NULL, NULL, 0, gx);
         lm_free(wt, bytes);
      } else {
         CS(zero)(gx, nx, conv_threads((double)nx));
         st = CS(bwdd_col2im)(g, nhwc, gout, w, gx);
      }
      if (st != LM_OK) return st;
   }
   if (gw || gb) {
      if (conv_is_depthwise(g))
         st = nhwc ? CS(dw_bwdw_nhwc)(g, x, gout, gw, gb) : CS(dw_bwdw_nchw)(g, x, gout, gw, gb);
      else
         st = CS(bwdw)(g, nhwc, x, gout, gw, gb);
   }
   return st;
}

#else
/* compiled on its own: nothing (conv.c instantiates the kernels) */
typedef int lm_conv_tmpl_empty_unit;
#endif
