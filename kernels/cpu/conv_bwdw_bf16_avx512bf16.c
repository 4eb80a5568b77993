/* conv_bwdw_bf16_avx512bf16.c -- the bfloat16 weight gradient of a channels-last convolution on the
 * bf16 GEMM (contract: conv_bf16.h).
 *
 * The reduction runs over output pixels P = N * Ho * Wo: per group gi,
 *   gw_g (Og x K) = gout_g^T (Og x P) * im2col(x)_g (P x K),  K = kh * kw * Cg,
 * one lm_bgemm_strided with the pixels as its k dimension (so its packing interleaves PAIRS of
 * pixels for vdpbf16ps), float32 C accumulated across pixel tiles (beta 1 after the first).
 *   1x1, stride 1, no padding: x is the im2col matrix already (row stride C), no copy;
 *   otherwise: the im2col matrix of one group is built in tiles of PT pixels (bfloat16, K
 *   contiguous per pixel, zeros for the padding; a kernel row's adjacent in-image taps copied
 *   as one run when groups == 1 and dilation along W is 1): about 512 KiB (L2) when gw is at
 *   most 1 MiB of float32, else at least the GEMM's KC (1024 pixels) so a large gw is read and
 *   written once per KC block.
 * gout_g^T is read in place (op(A)(o, p) = gout[p * O + gi * Og + o]: rows stride 1, pixels
 * stride O), which the packing of A merges pixel pairs from (prefetching the rows ahead).
 * Threads: when every thread gets at least 2048 pixels and gw is at most 8 MiB (the 56x56 and
 * 28x28 layers of ResNet50) the pixels are split between the threads, each running
 * single-threaded GEMMs (and im2col tiles) over its own range into its own float32 gw, the
 * copies then summed (thread 0's range into gw itself): each thread packs its gout and x
 * panels once for all of Og x K, no barrier per k block. Otherwise the GEMM's own M x N split.
 * The sums depend on the thread count (not on anything else); the bias gradient does not.
 * Depthwise (Cg == 1): a float32 loop per output channel (threads over o).
 * The pixel split, the L2 tiles and the run copies made every ResNet50 layer measured faster,
 * the stem most (numbers: docs/performance.md, "Measurements behind kernel choices").
 */
#include "cpu.h"
#include "gemm_internal.h"
#include "conv_bf16.h"

static int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t imax64(int64_t a, int64_t b) { return a > b ? a : b; }

static int n_threads(void) {
#ifdef _OPENMP
   if (omp_in_parallel()) return 1;
   return omp_get_max_threads();
#else
   return 1;
#endif
}

/* im2col rows for pixels [p0, p0 + np) of group gi: col[(p - p0) * K + (i * kw + j) * Cg + c] */
static void im2col_tile(const conv_geom *g, const uint16_t *x, int64_t gi, int64_t p0,
                        int64_t np, uint16_t *col, int nt) {
   const int64_t K = g->kh * g->kw * g->Cg, HWo = g->Ho * g->Wo;
   const int contig = g->G == 1 && g->dw == 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && np * K >= 32768)
   for (int64_t t = 0; t < np; t++) {
      const int64_t p = p0 + t, n = p / HWo, r = p % HWo, ho = r / g->Wo, wo = r % g->Wo;
      uint16_t *d = col + t * K;
      const int64_t wb = wo * g->sw - g->pw;
      for (int64_t i = 0; i < g->kh; i++) {
         const int64_t h = ho * g->sh - g->ph + i * g->dh;
         if (contig || h < 0 || h >= g->H) {
            /* a kernel row of adjacent taps over all the channels: one run of x (the taps
               inside the image) between zeros (the stem's 7 taps x 3 channels: one copy of 21
               values instead of 7 of 3) */
            const int64_t jlo = h < 0 || h >= g->H ? g->kw : wb < 0 ? imin64(-wb, g->kw) : 0;
            const int64_t jhi = h < 0 || h >= g->H ? g->kw : imax64(jlo, imin64(g->kw, g->W - wb));
            if (jlo > 0) memset(d, 0, (size_t)(jlo * g->Cg) * sizeof(uint16_t));
            if (jhi > jlo)
               memcpy(d + jlo * g->Cg, x + ((n * g->H + h) * g->W + wb + jlo) * g->C,
                      (size_t)((jhi - jlo) * g->Cg) * sizeof(uint16_t));
            if (jhi < g->kw)
               memset(d + jhi * g->Cg, 0, (size_t)((g->kw - jhi) * g->Cg) * sizeof(uint16_t));
            d += g->kw * g->Cg;
            continue;
         }
         for (int64_t j = 0; j < g->kw; j++, d += g->Cg) {
            const int64_t w = wo * g->sw - g->pw + j * g->dw;
            if (h < 0 || h >= g->H || w < 0 || w >= g->W) {
               memset(d, 0, (size_t)g->Cg * sizeof(uint16_t));
            } else {
               memcpy(d, x + ((n * g->H + h) * g->W + w) * g->C + gi * g->Cg,
                      (size_t)g->Cg * sizeof(uint16_t));
            }
         }
      }
   }
}

/* Cg == 1: gw[o][i][j] = sum_p gout[p][o] * x[pixel (p, i, j)][o / Og] */
static void bwdw_depthwise(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                           float *gw, int nt) {
   const int64_t O = g->O, khw = g->kh * g->kw;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
   for (int64_t o = 0; o < O; o++) {
      const int64_t ci = o / g->Og; /* the input channel of this output channel's group */
      for (int64_t i = 0; i < g->kh; i++)
         for (int64_t j = 0; j < g->kw; j++) {
            float s = 0.0f;
            for (int64_t n = 0; n < g->N; n++)
               for (int64_t ho = 0; ho < g->Ho; ho++) {
                  const int64_t h = ho * g->sh - g->ph + i * g->dh;
                  if (h < 0 || h >= g->H) continue;
                  const uint16_t *go = gout + ((n * g->Ho + ho) * g->Wo) * O + o;
                  const uint16_t *xr = x + ((n * g->H + h) * g->W) * g->C + ci;
                  for (int64_t wo = 0; wo < g->Wo; wo++) {
                     const int64_t w = wo * g->sw - g->pw + j * g->dw;
                     if (w < 0 || w >= g->W) continue;
                     s += lm_bf2f(go[wo * O]) * lm_bf2f(xr[w * g->C]);
                  }
               }
            gw[o * khw + i * g->kw + j] = s;
         }
   }
}

/* gb[o] = sum_p gout[p][o]: each thread sums a range of pixels, then the partial sums add up */
static lm_status bias_grad(const conv_geom *g, const uint16_t *gout, float *gb, int nt) {
   const int64_t O = g->O, P = g->N * g->Ho * g->Wo;
   if (P < 4096) nt = 1;
   const size_t bytes = (size_t)(nt * O) * sizeof(float);
   float *part = (float *)lm_alloc(bytes);
   if (!part) return LM_ERR_OOM;
#pragma omp parallel num_threads(nt) if (nt > 1)
   {
      int tid = 0, ntt = 1;
#ifdef _OPENMP
      tid = omp_get_thread_num();
      ntt = omp_get_num_threads();
#endif
      float *acc = part + tid * O;
      for (int64_t o = 0; o < O; o++) acc[o] = 0.0f;
      for (int64_t p = P * tid / ntt; p < P * (tid + 1) / ntt; p++) {
         const uint16_t *go = gout + p * O;
         for (int64_t o = 0; o < O; o++) acc[o] += lm_bf2f(go[o]);
      }
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t o = 0; o < O; o++) {
         float s = 0.0f;
         for (int t = 0; t < ntt; t++) s += part[t * O + o];
         gb[o] = s;
      }
   }
   lm_free(part, bytes);
   return LM_OK;
}

/* gw (or, k-split, per-thread copies) over pixels [pa, pb) of every group; nt threads for the
   im2col copies (1 inside a parallel region) */
static lm_status bwdw_range(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                            float *gw, int in_place, int64_t pa, int64_t pb, int nt) {
   const int64_t O = g->O, Og = g->Og, Cg = g->Cg, K = g->kh * g->kw * Cg;
   const int64_t P = pb - pa;
   if (P <= 0) {
      for (int64_t i = 0; i < O * K; i++) gw[i] = 0.0f;
      return LM_OK;
   }
   if (in_place) {
      for (int64_t gi = 0; gi < g->G; gi++)
         lm_bgemm_strided(Og, Cg, P, 1.0f, gout + pa * O + gi * Og, 1, O,
                          x + pa * g->C + gi * Cg, g->C, 1, 0.0f, gw + gi * Og * K, K, 1);
      return LM_OK;
   }
   /* tiles of PT pixels (an even number: whole pairs): at least the GEMM's KC (1024 pixels),
      so the float32 gw (Og x K, up to 9 MiB for 3x3 512 channels) is read and written once per
      KC block of the reduction rather than once per small tile; larger (about 4 MiB of im2col
      rows) where K is small */
   int64_t PT = ((int64_t)1 << 21) / K;
   if (PT < 1024) PT = 1024;
   /* a small gw (at most 1 MiB of float32: the layers whose pixels the threads split): tiles
      of about 512 KiB instead, which stay in L2 between the im2col and the GEMM's packing
      (about 10 % faster; docs/performance.md) */
   if (O * K <= ((int64_t)1 << 18)) PT = imax64(64, ((int64_t)1 << 18) / K);
   PT &= ~(int64_t)1;
   if (PT > P) PT = P;
   const size_t bytes = (size_t)(PT * K) * sizeof(uint16_t);
   uint16_t *col = (uint16_t *)lm_alloc(bytes);
   if (!col) return LM_ERR_OOM;
   for (int64_t gi = 0; gi < g->G; gi++) {
      for (int64_t p0 = 0; p0 < P; p0 += PT) {
         const int64_t np = imin64(PT, P - p0);
         im2col_tile(g, x, gi, pa + p0, np, col, nt);
         lm_bgemm_strided(Og, K, np, 1.0f, gout + (pa + p0) * O + gi * Og, 1, O, col, K, 1,
                          p0 == 0 ? 0.0f : 1.0f, gw + gi * Og * K, K, 1);
      }
   }
   lm_free(col, bytes);
   return LM_OK;
}

static lm_status bwdw_gemm(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                           float *gw, int in_place, int ks) {
   const int64_t O = g->O, K = g->kh * g->kw * g->Cg, P = g->N * g->Ho * g->Wo;
   lm_status st = LM_OK;
   if (ks <= 1) {
      st = bwdw_range(g, x, gout, gw, in_place, 0, P, n_threads());
   } else {
      const size_t pbytes = (size_t)((ks - 1) * O * K) * sizeof(float);
      float *priv = (float *)lm_alloc(pbytes);
      if (!priv) {
         lm_clear_error();
         return bwdw_gemm(g, x, gout, gw, in_place, 1);
      }
      lm_status sts[64];
#pragma omp parallel num_threads(ks)
      {
         int tid = 0;
#ifdef _OPENMP
         tid = omp_get_thread_num();
#endif
         /* pixel ranges start on even pixels (whole pairs) */
         const int64_t pa = (P * tid / ks) & ~(int64_t)1;
         const int64_t pb = tid == ks - 1 ? P : (P * (tid + 1) / ks) & ~(int64_t)1;
         sts[tid] = bwdw_range(g, x, gout, tid == 0 ? gw : priv + (tid - 1) * O * K, in_place,
                               pa, pb, 1);
#pragma omp barrier
         const int64_t n = O * K;
#pragma omp for schedule(static)
         for (int64_t i0 = 0; i0 < n; i0 += 4096) {
            const int64_t i1 = imin64(n, i0 + 4096);
            for (int t = 1; t < ks; t++) {
               const float *s = priv + (t - 1) * n;
               for (int64_t i = i0; i < i1; i++) gw[i] += s[i];
            }
         }
      }
      lm_free(priv, pbytes);
      for (int t = 0; t < ks; t++)
         if (sts[t] != LM_OK) st = sts[t];
   }
   if (st != LM_OK) return lm_error(st, "out of memory for the im2col tile");
   return LM_OK;
}

lm_status lm_conv_bwdw_nhwc_bf16(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                                 float *gw, float *gb) {
   if (lm_cpu_isa() < LM_ISA_AVX512_BF16)
      return lm_error(LM_ERR_INTERNAL, "lm_conv_bwdw_nhwc_bf16 needs AVX512_BF16");
   int nt = n_threads();
   const int64_t O = g->O, K = g->kh * g->kw * g->Cg;
   const int64_t P = g->N * g->Ho * g->Wo;
   if (gb) {
      lm_status st = bias_grad(g, gout, gb, nt);
      if (st != LM_OK) return lm_error(st, "out of memory for the bias gradient");
   }
   if (!gw || O == 0 || K == 0) return LM_OK; /* grad_b alone: done */
   if (P == 0) {
      for (int64_t i = 0; i < O * K; i++) gw[i] = 0.0f;
      return LM_OK;
   }
   if (g->Cg == 1) {
      bwdw_depthwise(g, x, gout, gw, nt);
      return LM_OK;
   }
   const int in_place = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
                        g->pw == 0 && g->Ho == g->H && g->Wo == g->W;
   /* split the pixels (the reduction) between the threads when each gets at least two GEMM k
      blocks and the private float32 gw copies stay small: every thread runs single-threaded
      GEMMs over its own pixel range (lm_bgemm_strided inside a parallel region keeps to the
      calling thread) into its own gw, the copies then add up. Each thread packs the whole
      gout^T and x panels of its pixels once for all M x N (the M x N split of the GEMM packs
      A and B per thread per k block and leaves the other thread waiting on B) */
   int ks = 1;
   if (nt > 64) nt = 64;
   if (nt > 1 && P >= (int64_t)2048 * nt && (int64_t)O * K <= ((int64_t)1 << 21)) ks = nt;
   return bwdw_gemm(g, x, gout, gw, in_place, ks);
}
