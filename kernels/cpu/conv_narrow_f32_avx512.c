/* conv_narrow_f32_avx512.c -- float32 NHWC convolutions of narrow inputs (2..4 channels: an RGB
 * stem) for AVX-512, forward: each kernel row's kw*C input floats are one pointwise reduction.
 */
#include "impl.h"
#include "conv_f32_avx512.h"

/* ---------------------------------------------------------------------------------------------
 * narrow inputs (2..4 channels, which the register-blocked kernels do not take: an RGB stem),
 * groups 1, dilation 1, forward. For one kernel row, the kw*C input floats that an output pixel
 * reads are consecutive in an NHWC row, and the next pixel's start sw*C floats further on. So an
 * output row is a pointwise product over F = kw*C "channels" with a pixel stride of sw*C, summed
 * over the kernel's rows: the pointwise micro-kernel's loop (PB pixels x NV vectors in registers,
 * the weights of a row (F x OB) loaded a vector at a time), with every FMA doing useful work. The
 * direct kernel reduced C = 3 channels a tap. A work unit is a band of output rows of one image,
 * whose input rows are first copied ("staged") with their column padding as zeros; rows above
 * and below the image are left out of the sum. On resnet50's 7x7 stem it runs near the FMA
 * peak, about 1.45x the direct kernel (numbers: docs/performance.md, "Measurements behind kernel
 * choices").
 */
enum { NC_MAXROWS = 16, NC_BAND = 8 };

AI void nc_body(const float *const *rows, int nrows, int64_t F, int64_t ps,
                const float *const *wrow, int64_t OB, const pw_epi *ep, const int PB,
                const int NV) {
   __m512 a[PW_MAXPB][4];
   acc_zero(a, PB, NV);
   for (int r = 0; r < nrows; r++) {
      const float *xp = rows[r], *wt = wrow[r];
      for (int64_t f = 0; f < F; f++) {
         bcast_step(a, xp + f, ps, wt, PB, NV);
         wt += OB;
      }
   }
   pw_epilogue(a, ep, PB, NV);
}

typedef void (*nc_fn)(const float *const *, int, int64_t, int64_t, const float *const *, int64_t,
                      const pw_epi *);
#define NC_INST(PB, NV)                                                                         \
   static void nc_##PB##_##NV(const float *const *rows, int nrows, int64_t F, int64_t ps,       \
                              const float *const *wrow, int64_t OB, const pw_epi *ep) {         \
      nc_body(rows, nrows, F, ps, wrow, OB, ep, PB, NV);                                        \
   }
NC_INST(1, 1) NC_INST(2, 1) NC_INST(3, 1) NC_INST(4, 1) NC_INST(5, 1) NC_INST(6, 1) NC_INST(7, 1)
NC_INST(8, 1) NC_INST(9, 1) NC_INST(10, 1) NC_INST(11, 1) NC_INST(12, 1) NC_INST(13, 1)
NC_INST(14, 1)
NC_INST(1, 2) NC_INST(2, 2) NC_INST(3, 2) NC_INST(4, 2) NC_INST(5, 2) NC_INST(6, 2) NC_INST(7, 2)
NC_INST(8, 2) NC_INST(9, 2) NC_INST(10, 2) NC_INST(11, 2) NC_INST(12, 2)
NC_INST(1, 3) NC_INST(2, 3) NC_INST(3, 3) NC_INST(4, 3) NC_INST(5, 3) NC_INST(6, 3) NC_INST(7, 3)
NC_INST(8, 3)
NC_INST(1, 4) NC_INST(2, 4) NC_INST(3, 4) NC_INST(4, 4) NC_INST(5, 4) NC_INST(6, 4)

static const nc_fn nc_tab[5][PW_MAXPB + 1] = {
   {0},
   {0, nc_1_1, nc_2_1, nc_3_1, nc_4_1, nc_5_1, nc_6_1, nc_7_1, nc_8_1, nc_9_1, nc_10_1, nc_11_1,
    nc_12_1, nc_13_1, nc_14_1},
   {0, nc_1_2, nc_2_2, nc_3_2, nc_4_2, nc_5_2, nc_6_2, nc_7_2, nc_8_2, nc_9_2, nc_10_2, nc_11_2,
    nc_12_2, 0, 0},
   {0, nc_1_3, nc_2_3, nc_3_3, nc_4_3, nc_5_3, nc_6_3, nc_7_3, nc_8_3, 0, 0, 0, 0, 0, 0},
   {0, nc_1_4, nc_2_4, nc_3_4, nc_4_4, nc_5_4, nc_6_4, 0, 0, 0, 0, 0, 0, 0, 0},
};

int lm_conv_nc_usable(const conv_geom *g) {
   return g->G == 1 && g->C >= 2 && g->C <= 4 && g->dh == 1 && g->dw == 1 &&
          g->kh <= NC_MAXROWS && g->O > 0 && g->Ho > 0 && g->Wo > 0 &&
          lm_impl_on(LM_IMPL_CONV_NARROW);
}

lm_status lm_conv_nc_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int act, float *out,
                                     int *stream) {
   const int64_t OB = block_width(g->O), nob = ceil_div(g->O, OB), K = g->K;
   const int64_t C = g->C, F = g->kw * C, ps = g->sw * C, O = g->O;
   const size_t bytes = (size_t)(nob * K * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   lm_conv_f32_pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * K));
   /* a band's staged rows: (band - 1) * sh + kh rows of W + 2 pw pixels (padded on the right to
      every column a tile reads) */
   const int64_t band = g->Ho < NC_BAND ? g->Ho : NC_BAND;
   const int64_t srows = (band - 1) * g->sh + g->kh;
   const int64_t wpad = (g->Wo - 1) * g->sw + g->kw > g->W + 2 * g->pw
                           ? (g->Wo - 1) * g->sw + g->kw
                           : g->W + 2 * g->pw;
   const int64_t rowf = (wpad * C + 15) / 16 * 16;
   const int nthr = conv_threads((double)g->N * g->Ho * g->Wo * O * K);
   const size_t sbytes = (size_t)(nthr * srows * rowf) * sizeof(float);
   float *stage = lm_alloc(sbytes);
   if (!stage) {
      lm_free(wp, bytes);
      return LM_ERR_OOM;
   }
   const int64_t nband = ceil_div(g->Ho, band), units = g->N * nband;
   /* streaming stores as the pointwise kernels choose them (lm_conv_pw_stream): the stem's output
      (25.7 MB in resnet50 at batch 8) is larger than the cache share */
   const int strm = ((uintptr_t)out & 63) == 0 && O % 16 == 0 &&
                    lm_conv_pw_stream((double)g->N * g->Ho * g->Wo * O * sizeof(float), *stream);
   *stream = strm;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *sb = stage + (size_t)conv_thread_id() * (size_t)(srows * rowf);
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t n = u / nband, oi0 = (u % nband) * band;
         const int64_t oi1 = oi0 + band < g->Ho ? oi0 + band : g->Ho;
         const int64_t h0 = oi0 * g->sh - g->ph; /* the input row of staged row 0 */
         const int64_t nst = (oi1 - 1 - oi0) * g->sh + g->kh;
         for (int64_t r = 0; r < nst; r++) {
            const int64_t h = h0 + r;
            if (h < 0 || h >= g->H) continue; /* never read */
            float *d = sb + r * rowf;
            memset(d, 0, (size_t)(g->pw * C) * sizeof(float));
            memcpy(d + g->pw * C, x + ((n * g->H + h) * g->W) * C,
                   (size_t)(g->W * C) * sizeof(float));
            memset(d + (g->pw + g->W) * C, 0, (size_t)((wpad - g->pw - g->W) * C) * sizeof(float));
         }
         for (int64_t oi = oi0; oi < oi1; oi++) {
            /* the kernel rows inside the image, and their staged rows */
            const float *rows[NC_MAXROWS];
            int64_t taps[NC_MAXROWS];
            int nr = 0;
            for (int64_t i = 0; i < g->kh; i++) {
               const int64_t h = oi * g->sh - g->ph + i;
               if (h < 0 || h >= g->H) continue;
               rows[nr] = sb + (h - h0) * rowf;
               taps[nr++] = i;
            }
            float *orow = out + ((n * g->Ho + oi) * g->Wo) * O;
            const float *rrow = res ? res + ((n * g->Ho + oi) * g->Wo) * O : NULL;
            for (int64_t ob = 0; ob < nob; ob++) {
               const int64_t oc0 = ob * OB, nvalid = O - oc0 < OB ? O - oc0 : OB;
               const int nv = (int)((nvalid + 15) / 16), pbmax = pw_pb[nv];
               const float *wrow[NC_MAXROWS];
               for (int r = 0; r < nr; r++) wrow[r] = wp + ob * K * OB + taps[r] * F * OB;
               pw_epi ep;
               ep.out16 = NULL;
               ep.res16 = NULL;
               ep.ostride = O;
               ep.bias = bias ? bias + oc0 : NULL;
               ep.act = act;
               ep.stream = strm;
               for (int v = 0; v < 4; v++) {
                  const int64_t left = nvalid - 16 * v;
                  ep.m[v] = left >= 16 ? (__mmask16)0xFFFF
                                       : (left <= 0 ? (__mmask16)0
                                                    : (__mmask16)((1u << left) - 1));
               }
               /* tiles of nearly equal widths, at most pbmax pixels */
               const int64_t nt = ceil_div(g->Wo, pbmax), base = g->Wo / nt, extra = g->Wo % nt;
               int64_t j = 0;
               for (int64_t t = 0; t < nt; t++) {
                  const int pb = (int)(base + (t < extra));
                  const float *tr[NC_MAXROWS];
                  for (int r = 0; r < nr; r++) tr[r] = rows[r] + j * ps;
                  ep.out = orow + j * O + oc0;
                  ep.res = rrow ? rrow + j * O + oc0 : NULL;
                  nc_tab[nv][pb](tr, nr, F, ps, wrow, OB, &ep);
                  j += pb;
               }
            }
         }
      }
      if (strm) _mm_sfence(); /* order the streaming stores before the region ends */
   }
   lm_free(stage, sbytes);
   lm_free(wp, bytes);
   return LM_OK;
}
