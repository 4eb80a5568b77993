/* conv_bwdw_f32_avx512.c -- the direct weight gradient of float32 NHWC convolutions for
 * AVX-512 (lm_conv_bwdw_direct_f32, called by lm_conv_bwdw_nhwc_avx512 in
 * conv_direct_f32_avx512.c):
 *
 * Backward weight: per-thread partial sums in the packed layout; the micro-kernel holds R input
 * channels x NV vectors of output channels in registers and runs over the pixels of a group of
 * rows: acc[r][v] += x[pixel][ci+r] (broadcast) * grad_out[pixel][v]. Partials are summed in a
 * fixed order (deterministic) and transposed into (O, kh, kw, Cg) at the end; the bias gradient
 * is summed in the same pass.
 */
#include "conv_f32_avx512.h"

/* ---------------------------------------------------------------------------------------------
 * backward weight
 */
typedef struct {
   const float *x, *g;
   int64_t n;
} bw_seg;

/* pixels ahead that bww_body prefetches (x and grad_out rows): without it the kernel waited on
   them; of 2, 4, 8, 12 and 16, 8 was best (numbers: docs/performance.md, "Measurements behind
   kernel choices") */
enum { BWW_PF = 8 };

AI void bww_body(const bw_seg *segs, int nseg, int64_t xs, int64_t gs, float *accp, int64_t OB,
                 const __mmask16 *m, const int R, const int NV) {
   __m512 a[8][4];
#pragma GCC unroll 8
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[r][v] = _mm512_load_ps(accp + r * OB + 16 * v);
   for (int s = 0; s < nseg; s++) {
      const float *xp = segs[s].x, *gp = segs[s].g;
      for (int64_t p = 0; p < segs[s].n; p++) {
         __m512 gv[4];
         _mm_prefetch((const char *)((uintptr_t)xp + (uintptr_t)(BWW_PF * xs) * 4), _MM_HINT_T0);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) {
            _mm_prefetch((const char *)((uintptr_t)gp + (uintptr_t)(BWW_PF * gs + 16 * v) * 4),
                         _MM_HINT_T0);
            gv[v] = _mm512_maskz_loadu_ps(m[v], gp + 16 * v);
         }
#pragma GCC unroll 8
         for (int r = 0; r < R; r++) {
            const __m512 b = _mm512_set1_ps(xp[r]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) a[r][v] = _mm512_fmadd_ps(b, gv[v], a[r][v]);
         }
         xp += xs;
         gp += gs;
      }
   }
#pragma GCC unroll 8
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(accp + r * OB + 16 * v, a[r][v]);
}

typedef void (*bww_fn)(const bw_seg *, int, int64_t, int64_t, float *, int64_t, const __mmask16 *);

#define BWW_INST(R, NV)                                                                         \
   static void bww_##R##_##NV(const bw_seg *segs, int nseg, int64_t xs, int64_t gs, float *accp, \
                              int64_t OB, const __mmask16 *m) {                                 \
      bww_body(segs, nseg, xs, gs, accp, OB, m, R, NV);                                         \
   }
#define BWW_INST_NV(NV)                                                                         \
   BWW_INST(1, NV) BWW_INST(2, NV) BWW_INST(3, NV) BWW_INST(4, NV) BWW_INST(5, NV)              \
   BWW_INST(6, NV) BWW_INST(7, NV) BWW_INST(8, NV)
BWW_INST_NV(1)
BWW_INST_NV(2)
BWW_INST_NV(3)
BWW_INST(1, 4)
BWW_INST(2, 4)
BWW_INST(3, 4)
BWW_INST(4, 4)
BWW_INST(5, 4)
BWW_INST(6, 4)

static const int bww_r[5] = {0, 8, 8, 8, 6};
static const bww_fn bww_tab[5][9] = {
   {0},
   {0, bww_1_1, bww_2_1, bww_3_1, bww_4_1, bww_5_1, bww_6_1, bww_7_1, bww_8_1},
   {0, bww_1_2, bww_2_2, bww_3_2, bww_4_2, bww_5_2, bww_6_2, bww_7_2, bww_8_2},
   {0, bww_1_3, bww_2_3, bww_3_3, bww_4_3, bww_5_3, bww_6_3, bww_7_3, bww_8_3},
   {0, bww_1_4, bww_2_4, bww_3_4, bww_4_4, bww_5_4, bww_6_4, 0, 0},
};

enum { BW_MAX_ROWS = 64 };

lm_status lm_conv_bwdw_direct_f32(const conv_geom *g, const float *x, const float *gout,
                                  float *gw, float *gb) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, O = g->O, Ho = g->Ho, Wo = g->Wo;
   const int64_t G = g->G, Cg = g->Cg, Og = g->Og, K = g->K, taps = g->kh * g->kw;
   const int64_t OB = block_width(Og), nob = ceil_div(Og, OB);
   const int64_t psize = G * nob * K * OB; /* packed partial */
   if (gw) memset(gw, 0, (size_t)(O * K) * sizeof(float));
   if (gb) memset(gb, 0, (size_t)O * sizeof(float));
   if (N * Ho * Wo == 0 || O == 0) return LM_OK;
   const int nthr = conv_threads((double)N * Ho * Wo * O * (K > 0 ? K : 1));
   /* units: runs of output rows (image after image, so small maps share a unit), sized so
      that their x and grad_out rows stay in L2 while every (tap, channel block) passes over
      them; more pixels per unit means fewer passes over the partial sums */
   const int64_t rows_total = N * Ho;
   int64_t rpu = (1024 * 1024 / (4 * (C + O))) / (Wo > 0 ? Wo : 1);
   if (rpu < 1) rpu = 1;
   if (rpu > BW_MAX_ROWS) rpu = BW_MAX_ROWS;
   if (rpu > rows_total) rpu = rows_total;
   while (rpu > 1 && ceil_div(rows_total, rpu) < 4 * nthr) rpu = (rpu + 1) / 2;
   const int64_t units = ceil_div(rows_total, rpu);
   /* row groups of about 128 pixels: their grad_out rows stay in L1 while the input channel
      blocks pass over them. Unless the output block is all of grad_out's row (O == OB), each
      group's block of grad_out is first copied into gpk, OB floats a pixel: read in place, rows
      O floats apart, its lines fell into a quarter of L1's sets and left it between the input
      chunks (numbers: docs/performance.md, "Measurements behind kernel choices") */
   const int64_t grp = Wo >= 128 ? 1 : 128 / Wo;
   const int64_t gpk_n = gw && O != OB ? (grp * Wo * OB + 15) / 16 * 16 : 0;
   /* + 16-float multiples: keeps every partial 64-byte aligned */
   const int64_t per = (gw ? psize : 0) + (O + 15) / 16 * 16 + gpk_n;
   const size_t bytes = (size_t)(nthr * per) * sizeof(float);
   float *buf = lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *pw = buf + conv_thread_id() * per, *pb = pw + (gw ? psize : 0);
      float *gpk = pb + (O + 15) / 16 * 16;
      memset(pw, 0, (size_t)(per - gpk_n) * sizeof(float));
      bw_seg segs[BW_MAX_ROWS];
#pragma omp for schedule(static) /* static: the same split (and sums) on every run */
      for (int64_t u = 0; u < units; u++) {
         /* global rows [r0, r1): image R / Ho, row R % Ho */
         const int64_t r0 = u * rpu, r1 = r0 + rpu < rows_total ? r0 + rpu : rows_total;
         if (gb) {
            const float *gp = gout + r0 * Wo * O;
            for (int64_t p = 0; p < (r1 - r0) * Wo; p++)
               for (int64_t o = 0; o < O; o++) pb[o] += gp[p * O + o];
         }
         if (!gw || K == 0) continue;
         for (int64_t rg0 = r0; rg0 < r1; rg0 += grp) {
         const int64_t rg1 = rg0 + grp < r1 ? rg0 + grp : r1;
         for (int64_t gi = 0; gi < G; gi++) {
            for (int64_t ob = 0; ob < nob; ob++) {
               const int64_t nvalid = Og - ob * OB < OB ? Og - ob * OB : OB;
               const int nv = (int)((nvalid + 15) / 16);
               __mmask16 m[4];
               for (int v = 0; v < 4; v++) {
                  int64_t left = nvalid - 16 * v;
                  m[v] = left >= 16 ? (__mmask16)0xFFFF
                                    : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
               }
               const int R = bww_r[nv];
               const float *gsrc = gout + gi * Og + ob * OB;
               int64_t gstr = O;
               if (gpk_n) {
                  const int64_t np = (rg1 - rg0) * Wo;
                  const float *gq = gout + rg0 * Wo * O + gi * Og + ob * OB;
                  for (int64_t p = 0; p < np; p++)
                     for (int v = 0; v < nv; v++)
                        _mm512_store_ps(gpk + p * OB + 16 * v,
                                        _mm512_maskz_loadu_ps(m[v], gq + p * O + 16 * v));
                  gsrc = gpk - rg0 * Wo * OB;
                  gstr = OB;
               }
               for (int64_t i = 0; i < g->kh; i++) {
                  for (int64_t j = 0; j < g->kw; j++) {
                     int64_t lo, hi;
                     conv_valid_range(W, Wo, g->sw, g->pw, j * g->dw, &lo, &hi);
                     if (lo >= hi) continue;
                     const int64_t tap = i * g->kw + j;
                     for (int64_t ic0 = 0; ic0 < Cg; ic0 += R) {
                        const int rn = (int)(Cg - ic0 < R ? Cg - ic0 : R);
                        int ns = 0;
                        for (int64_t R = rg0; R < rg1; R++) {
                           const int64_t n = R / Ho, r = R % Ho;
                           const int64_t hr = r * g->sh - g->ph + i * g->dh;
                           if (hr < 0 || hr >= H) continue;
                           segs[ns].x = x + ((n * H + hr) * W + lo * g->sw - g->pw + j * g->dw) * C +
                                        gi * Cg + ic0;
                           segs[ns].g = gsrc + (R * Wo + lo) * gstr;
                           segs[ns].n = hi - lo;
                           ns++;
                        }
                        if (!ns) continue;
                        float *accp = pw + (((gi * nob + ob) * taps + tap) * Cg + ic0) * OB;
                        bww_tab[nv][rn](segs, ns, g->sw * C, gstr, accp, OB, m);
                     }
                  }
               }
            }
         }
         }
      }
      /* reduce: gw[(gi*Og + o)*K + k] = sum over threads of pw[((gi*nob + ob)*K + k)*OB + v] */
      const int nt = conv_num_threads_in_team();
      if (gw) {
         /* blocks of 16 output channels; 16 x 16 tiles are summed over the threads, then
            transposed into gw */
         const int64_t vblocks = OB / 16, nblk = G * nob * vblocks;
#pragma omp for schedule(static)
         for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t gob = blk / vblocks, v0 = (blk % vblocks) * 16;
            const int64_t gi = gob / nob, ob = gob % nob;
            const int64_t o0 = ob * OB + v0, nvalid = Og - o0 < 16 ? Og - o0 : 16;
            if (nvalid <= 0) continue;
            float *dst = gw + (gi * Og + o0) * K;
            const float *part = buf + gob * K * OB + v0; /* + t * per */
            float sum[16 * 16] __attribute__((aligned(64))), tr[16 * 16] __attribute__((aligned(64)));
            int64_t k0 = 0;
            for (; k0 + 16 <= K; k0 += 16) {
               for (int kk = 0; kk < 16; kk++) {
                  __m512 a = _mm512_loadu_ps(part + (k0 + kk) * OB);
                  for (int t = 1; t < nt; t++)
                     a = _mm512_add_ps(a, _mm512_loadu_ps(part + t * per + (k0 + kk) * OB));
                  _mm512_store_ps(sum + kk * 16, a);
               }
               transpose16_mem(sum, 16, tr, 16);
               for (int64_t v = 0; v < nvalid; v++)
                  _mm512_storeu_ps(dst + v * K + k0, _mm512_load_ps(tr + v * 16));
            }
            for (int64_t k = k0; k < K; k++)
               for (int64_t v = 0; v < nvalid; v++) {
                  float a = 0.0f;
                  for (int t = 0; t < nt; t++) a += part[t * per + k * OB + v];
                  dst[v * K + k] = a;
               }
         }
      }
#pragma omp single
      if (gb) {
         for (int t = 0; t < nt; t++) {
            const float *src = buf + t * per + (gw ? psize : 0);
            for (int64_t o = 0; o < O; o++) gb[o] += src[o];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}
