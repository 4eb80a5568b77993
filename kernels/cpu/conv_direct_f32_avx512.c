/* conv_direct_f32_avx512.c -- float32 NHWC convolution kernels for AVX-512: the direct
 * "implicit GEMM" forward and backward data, the entry points of all three passes (forward,
 * backward data, backward weight; conv_internal.h), small groups, and the single-product route
 * of wide 1x1 layers' gradients.
 *
 * No im2col buffer and no generic GEMM: register-blocked micro-kernels read the activations in
 * place; the weights are packed once per call (conv_pack_f32_avx512.c: wp[g][ob][tap][ci][OB]).
 *
 * Forward micro-kernel: PB output pixels x NV vectors of 16 output channels (6 x 4 = 24 zmm
 * accumulators), accumulated over the input channels of one tap:
 *   acc[p][v] += x[pixel p][ci] (broadcast) * wp[tap][ci][v].
 * A work unit is a block of <= 128 output pixels (a few rows of one image) and a run of
 * (group, channel block) pairs; its accumulators live in a small buffer that the micro-kernel
 * loads and stores around each tap, so a tap's weights stay in L1 while the unit's pixels pass
 * over them. The unit's input rows are first copied with their padding columns as zeros
 * ("staging"), so every tap is valid for every pixel: blocks of 6 pixels then run across row
 * boundaries (one input pointer per pixel), which keeps 7x7 and 14x14 maps at full speed. For
 * groups == 1 and unit dilation along W, the kw taps of a kernel row read consecutive input
 * pixels, i.e. one contiguous run of kw*C floats, reduced in one go. The epilogue (bias,
 * residual, activation) is applied when the accumulators are written out; outputs much larger
 * than the caches are written with streaming stores.
 *
 * Backward data: stride 1 is the same forward machinery on grad_out with the flipped kernel
 * (in/out channels swapped, padding d*(k-1)-p). Stride s > 1 splits grad_x into s_h x s_w phases;
 * inside one phase every output pixel uses the same taps, so it is again a dense direct
 * convolution (no zero-inserted work, no scatter, no atomics).
 *
 * Backward weight: the direct kernel of conv_bwdw_f32_avx512.c, or for wide 1x1 layers one
 * product (lm_sgemm; below).
 *
 * Small groups (ResNeXt's 4 or 8 channels per group) run GB groups at a time as one group with a
 * block-diagonal kernel so the vectors are full.
 *
 * The other float32 AVX-512 kernels, each in its own file: pointwise 1x1 convolutions
 * (conv_pointwise_f32_avx512.c), narrow inputs of 2..4 channels (conv_narrow_f32_avx512.c),
 * depthwise (conv_depthwise_f32_avx512.c), small channel counts (conv_direct_rb_f32_avx512.c) and
 * Winograd (conv_winograd_f32_avx512.c); what they share is conv_f32_avx512.h.
 */
#include "impl.h"
#include "conv_f32_avx512.h"

enum { ACC_PITCH = 64, UNIT_PX = 128, ICB = 128 };

/* ---------------------------------------------------------------------------------------------
 * forward micro-kernel: PB pixels (pixel k at xp + k*qs) x NV vectors, over icn input channels
 */
AI void fwd_body(const float *xp, int64_t qs, const float *wt, int64_t OB, int64_t icn,
                 float *acc, const int PB, const int NV) {
   __m512 a[8][4];
#pragma GCC unroll 8
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_load_ps(acc + k * ACC_PITCH + 16 * v);
   for (int64_t ic = 0; ic < icn; ic++) {
      bcast_step(a, xp, qs, wt, PB, NV);
      xp++;
      wt += OB;
   }
#pragma GCC unroll 8
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(acc + k * ACC_PITCH + 16 * v, a[k][v]);
}

typedef void (*fwd_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *);

#define FWD_INST(PB, NV)                                                                        \
   static void fwd_##PB##_##NV(const float *xp, int64_t qs, const float *wt, int64_t OB,         \
                               int64_t icn, float *acc) {                                       \
      fwd_body(xp, qs, wt, OB, icn, acc, PB, NV);                                               \
   }
#define FWD_INST_NV(NV)                                                                         \
   FWD_INST(1, NV) FWD_INST(2, NV) FWD_INST(3, NV) FWD_INST(4, NV) FWD_INST(5, NV)              \
   FWD_INST(6, NV) FWD_INST(7, NV) FWD_INST(8, NV)
FWD_INST_NV(1)
FWD_INST_NV(2)
FWD_INST_NV(3)
FWD_INST(1, 4)
FWD_INST(2, 4)
FWD_INST(3, 4)
FWD_INST(4, 4)
FWD_INST(5, 4)
FWD_INST(6, 4)

/* pixels per micro-kernel call for NV vectors (accumulators + weights + broadcast <= 32 zmm) */
static const int fwd_pb[5] = {0, 8, 8, 8, 6};
static const fwd_fn fwd_tab[5][9] = {
   {0},
   {0, fwd_1_1, fwd_2_1, fwd_3_1, fwd_4_1, fwd_5_1, fwd_6_1, fwd_7_1, fwd_8_1},
   {0, fwd_1_2, fwd_2_2, fwd_3_2, fwd_4_2, fwd_5_2, fwd_6_2, fwd_7_2, fwd_8_2},
   {0, fwd_1_3, fwd_2_3, fwd_3_3, fwd_4_3, fwd_5_3, fwd_6_3, fwd_7_3, fwd_8_3},
   {0, fwd_1_4, fwd_2_4, fwd_3_4, fwd_4_4, fwd_5_4, fwd_6_4, 0, 0},
};

/* the same with one input pointer per pixel (blocks that span output rows) */
AI void fwdp_body(const float *const *xps, const float *wt, int64_t OB, int64_t icn, float *acc,
                  const int PB, const int NV) {
   __m512 a[8][4];
   const float *xp[8];
#pragma GCC unroll 8
   for (int k = 0; k < PB; k++) xp[k] = xps[k];
#pragma GCC unroll 8
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_load_ps(acc + k * ACC_PITCH + 16 * v);
   for (int64_t ic = 0; ic < icn; ic++) {
      __m512 w[4];
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) w[v] = _mm512_load_ps(wt + 16 * v);
#pragma GCC unroll 8
      for (int k = 0; k < PB; k++) {
         const __m512 b = _mm512_set1_ps(xp[k][ic]);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, w[v], a[k][v]);
      }
      wt += OB;
   }
#pragma GCC unroll 8
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(acc + k * ACC_PITCH + 16 * v, a[k][v]);
}

typedef void (*fwdp_fn)(const float *const *, const float *, int64_t, int64_t, float *);

#define FWDP_INST(PB, NV)                                                                       \
   static void fwdp_##PB##_##NV(const float *const *xps, const float *wt, int64_t OB,           \
                                int64_t icn, float *acc) {                                      \
      fwdp_body(xps, wt, OB, icn, acc, PB, NV);                                                 \
   }
#define FWDP_INST_NV(NV)                                                                        \
   FWDP_INST(1, NV) FWDP_INST(2, NV) FWDP_INST(3, NV) FWDP_INST(4, NV) FWDP_INST(5, NV)         \
   FWDP_INST(6, NV) FWDP_INST(7, NV) FWDP_INST(8, NV)
FWDP_INST_NV(1)
FWDP_INST_NV(2)
FWDP_INST_NV(3)
FWDP_INST(1, 4)
FWDP_INST(2, 4)
FWDP_INST(3, 4)
FWDP_INST(4, 4)
FWDP_INST(5, 4)
FWDP_INST(6, 4)

static const fwdp_fn fwdp_tab[5][9] = {
   {0},
   {0, fwdp_1_1, fwdp_2_1, fwdp_3_1, fwdp_4_1, fwdp_5_1, fwdp_6_1, fwdp_7_1, fwdp_8_1},
   {0, fwdp_1_2, fwdp_2_2, fwdp_3_2, fwdp_4_2, fwdp_5_2, fwdp_6_2, fwdp_7_2, fwdp_8_2},
   {0, fwdp_1_3, fwdp_2_3, fwdp_3_3, fwdp_4_3, fwdp_5_3, fwdp_6_3, fwdp_7_3, fwdp_8_3},
   {0, fwdp_1_4, fwdp_2_4, fwdp_3_4, fwdp_4_4, fwdp_5_4, fwdp_6_4, 0, 0},
};

/* ---------------------------------------------------------------------------------------------
 * a direct convolution problem as the kernels see it
 */
typedef struct {
   const float *in;
   int64_t inH, inW, inC;  /* input image size and pixel stride (floats) */
   float *out;
   int64_t outH, outW, outC; /* output image size and pixel stride */
   int64_t N, G, Ci, Co;   /* groups; reduction / output channels per group */
   int64_t kh, kw, sh, sw, ph, pw, dh, dw; /* padding may be negative */
   int transposed;         /* backward data with stride: out pixel (hi, wi) reads in pixel
                              ((hi - ph + i*dh)/sh, (wi - pw + j*dw)/sw) where divisible */
   const float *wp;        /* packed weights [G][nob][taps][Ci][OB] */
   int64_t OB, nob;
   const float *bias, *res;
   int act;
   int stream;             /* write the output with non-temporal stores */
} dconv;

/* acc rows -> output pixels, with the epilogue */
static void write_out(const dconv *d, const float *acc, float *op, const float *rp, int64_t ostride,
                      int64_t n, int64_t oc0, int64_t nvalid) {
   __m512 bv[4];
   __mmask16 m[4];
   const int nv = (int)((nvalid + 15) / 16);
   for (int v = 0; v < 4; v++) {
      const int64_t left = nvalid - 16 * v;
      m[v] = left >= 16 ? (__mmask16)0xFFFF : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      bv[v] = d->bias && left > 0 ? _mm512_maskz_loadu_ps(m[v], d->bias + oc0 + 16 * v)
                                  : _mm512_setzero_ps();
   }
   /* streaming stores for outputs far larger than the caches (no read-for-ownership) */
   const int stream = d->stream && nvalid % 16 == 0 && ((uintptr_t)op & 63) == 0 &&
                      (ostride & 15) == 0;
   for (int64_t q = 0; q < n; q++) {
      const float *a = acc + q * ACC_PITCH;
      float *o = op + q * ostride;
      const float *r = rp ? rp + q * ostride : NULL;
      for (int v = 0; v < nv; v++) {
         __m512 t = _mm512_add_ps(_mm512_load_ps(a + 16 * v), bv[v]);
         if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], r + 16 * v));
         if (d->act) t = lm_act_ps(t, d->act);
         if (stream)
            _mm512_stream_ps(o + 16 * v, t);
         else
            _mm512_mask_storeu_ps(o + 16 * v, m[v], t);
      }
   }
}

/* n pixels of one piece, in blocks of near-equal size (pixel k at xp + k*qs) */
static void fwd_piece(const float *xp, int64_t qs, const float *wt, int64_t OB, int64_t icn,
                      float *acc, int64_t n, int nv) {
   const int pb = fwd_pb[nv];
   const int64_t nb = (n + pb - 1) / pb;
   if (nb <= 0) return;
   const int64_t base = n / nb, extra = n % nb;
   int64_t q = 0;
   for (int64_t b = 0; b < nb; b++) {
      const int64_t m = base + (b < extra);
      fwd_tab[nv][m](xp + q * qs, qs, wt, OB, icn, acc + q * ACC_PITCH);
      q += m;
   }
}

/* per-thread scratch of the forward units */
typedef struct {
   float *acc;          /* UNIT_PX x ACC_PITCH accumulators */
   float *edge;         /* padded copies of the fused runs of border pixels */
   const float **ptr;   /* one input pointer per pixel of the unit */
} fwd_scratch;

/* columns q in [flo, fhi) have the whole fused run (kw consecutive input pixels) in the image */
static void fused_range(const dconv *d, int64_t *flo, int64_t *fhi) {
   conv_valid_range(d->inW - (d->kw - 1), d->outW, d->sw, d->pw, 0, flo, fhi);
   if (*flo >= *fhi) *flo = *fhi = d->outW;
}

/* forward-mode unit: image n, group gi, channel block ob, output rows [r0, r1), columns [qb, qe).
 * For each kernel row i the reachable output rows [ra, rb) are consecutive accumulators; every
 * pixel gets its own input pointer, so blocks of pb pixels run across row boundaries (7x7 maps
 * get full blocks). A tap outside the image points at zeros: the shared zero vector (one tap at
 * a time), or for the fused runs of border pixels a padded copy of the run in `edge`. */
static void fwd_unit(const dconv *d, int64_t n, int64_t gi, int64_t ob, int64_t r0, int64_t r1,
                     int64_t qb, int64_t qe, const float *zero, fwd_scratch *sc) {
   const int64_t nq = qe - qb, nr = r1 - r0, taps = d->kh * d->kw, Ci = d->Ci, OB = d->OB;
   const int64_t nvalid = (d->Co - ob * OB) < OB ? d->Co - ob * OB : OB;
   const int nv = (int)((nvalid + 15) / 16), pb = fwd_pb[nv];
   float *acc = sc->acc;
   const float **ptr = sc->ptr;
   memset(acc, 0, (size_t)(nr * nq * ACC_PITCH) * sizeof(float));
   const float *wblk = d->wp + (gi * d->nob + ob) * taps * Ci * OB;
   const float *img = d->in + n * d->inH * d->inW * d->inC + gi * Ci;
   const int fused = d->G == 1 && d->dw == 1 && d->kw > 1;
   int64_t flo = 0, fhi = 0;
   if (fused) fused_range(d, &flo, &fhi);
   const int64_t run = d->kw * Ci; /* floats in a fused run */
   for (int64_t i = 0; i < d->kh; i++) {
      int64_t ra = r1, rb = r0;
      for (int64_t r = r0; r < r1; r++) {
         const int64_t hi = r * d->sh - d->ph + i * d->dh;
         if (hi < 0 || hi >= d->inH) continue;
         if (r < ra) ra = r;
         rb = r + 1;
      }
      if (ra >= rb) continue;
      const int64_t total = (rb - ra) * nq;
      const int64_t nb = (total + pb - 1) / pb, bsz = total / nb, extra = total % nb;
      const int64_t npieces = fused ? 1 : d->kw;
      for (int64_t jp = 0; jp < npieces; jp++) {
         /* input pointers of the pixels for this tap (or fused run) */
         int64_t ne = 0;
         for (int64_t t = 0; t < total; t++) {
            const int64_t r = ra + t / nq, q = qb + t % nq;
            const int64_t hi = r * d->sh - d->ph + i * d->dh;
            const float *rowp = img + hi * d->inW * d->inC;
            const int64_t c = q * d->sw - d->pw + jp * d->dw;
            if (fused) {
               if (q >= flo && q < fhi) {
                  ptr[t] = rowp + c * d->inC;
               } else {
                  float *e = sc->edge + ne++ * run;
                  for (int64_t jj = 0; jj < d->kw; jj++) {
                     if (c + jj >= 0 && c + jj < d->inW)
                        memcpy(e + jj * Ci, rowp + (c + jj) * d->inC, (size_t)Ci * sizeof(float));
                     else
                        memset(e + jj * Ci, 0, (size_t)Ci * sizeof(float));
                  }
                  ptr[t] = e;
               }
            } else {
               ptr[t] = (c >= 0 && c < d->inW) ? rowp + c * d->inC : zero;
            }
         }
         const int64_t cin = fused ? run : Ci;
         for (int64_t ic0 = 0; ic0 < cin; ic0 += ICB) {
            const int64_t icn = cin - ic0 < ICB ? cin - ic0 : ICB;
            const float *wt = wblk + ((i * d->kw + jp) * Ci + ic0) * OB;
            int64_t t = 0;
            for (int64_t b = 0; b < nb; b++) {
               const int64_t m = bsz + (b < extra);
               const float *xps[8];
               for (int64_t k = 0; k < m; k++) xps[k] = ptr[t + k] + ic0;
               fwdp_tab[nv][m](xps, wt, OB, icn, acc + ((ra - r0) * nq + t) * ACC_PITCH);
               t += m;
            }
         }
      }
   }
   const int64_t oc0 = gi * d->Co + ob * OB;
   for (int64_t r = r0; r < r1; r++) {
      const int64_t off = ((n * d->outH + r) * d->outW + qb) * d->outC + oc0;
      write_out(d, acc + (r - r0) * nq * ACC_PITCH, d->out + off, d->res ? d->res + off : NULL,
                d->outC, nq, oc0, nvalid);
   }
}

/* transposed-mode unit: output rows [r0, r1), column phase rw, phase columns [qb, qe)
   (output column rw + q*sw) */
static void tr_unit(const dconv *d, int64_t n, int64_t gi, int64_t ob, int64_t r0, int64_t r1,
                    int64_t rw, int64_t qb, int64_t qe, float *acc) {
   const int64_t nq = qe - qb, nr = r1 - r0, taps = d->kh * d->kw, Ci = d->Ci, OB = d->OB;
   const int64_t nvalid = (d->Co - ob * OB) < OB ? d->Co - ob * OB : OB;
   const int nv = (int)((nvalid + 15) / 16);
   memset(acc, 0, (size_t)(nr * nq * ACC_PITCH) * sizeof(float));
   const float *wblk = d->wp + (gi * d->nob + ob) * taps * Ci * OB;
   const float *img = d->in + n * d->inH * d->inW * d->inC + gi * Ci;
   for (int64_t j = 0; j < d->kw; j++) {
      const int64_t tw = rw - d->pw + j * d->dw;
      if (((tw % d->sw) + d->sw) % d->sw) continue;
      const int64_t c0 = tw / d->sw;
      int64_t lo = -c0 > qb ? -c0 : qb, hi = d->inW - c0 < qe ? d->inW - c0 : qe;
      if (lo >= hi) continue;
      for (int64_t i = 0; i < d->kh; i++) {
         const float *wt0 = wblk + (i * d->kw + j) * Ci * OB;
         for (int64_t r = r0; r < r1; r++) {
            const int64_t th = r - d->ph + i * d->dh;
            if (th < 0 || th % d->sh) continue;
            const int64_t ho = th / d->sh;
            if (ho >= d->inH) continue;
            const float *xp = img + (ho * d->inW + c0 + lo) * d->inC;
            for (int64_t ic0 = 0; ic0 < Ci; ic0 += ICB) {
               const int64_t icn = Ci - ic0 < ICB ? Ci - ic0 : ICB;
               fwd_piece(xp + ic0, d->inC, wt0 + ic0 * OB, OB, icn,
                       acc + ((r - r0) * nq + lo - qb) * ACC_PITCH, hi - lo, nv);
            }
         }
      }
   }
   const int64_t oc0 = gi * d->Co + ob * OB;
   for (int64_t r = r0; r < r1; r++) {
      const int64_t off = ((n * d->outH + r) * d->outW + rw + qb * d->sw) * d->outC + oc0;
      write_out(d, acc + (r - r0) * nq * ACC_PITCH, d->out + off, d->res ? d->res + off : NULL,
                d->sw * d->outC, nq, oc0, nvalid);
   }
}

/* run every unit of a problem */
static lm_status dconv_run(const dconv *d0) {
   dconv dd = *d0;
   const dconv *d = &dd;
   dd.stream = (double)dd.N * dd.outH * dd.outW * dd.outC * sizeof(float) > 24e6;
   const int64_t phases = d->transposed ? d->sw : 1;
   const int64_t cols = d->transposed ? ceil_div(d->outW, d->sw) : d->outW; /* phase 0 widest */
   const int64_t seg = cols < UNIT_PX ? (cols > 0 ? cols : 1) : UNIT_PX;
   const int64_t nseg = ceil_div(cols > 0 ? cols : 1, seg);
   int64_t rpu = UNIT_PX / seg;
   if (rpu < 1) rpu = 1;
   if (rpu > d->outH) rpu = d->outH > 0 ? d->outH : 1;
   const double work = (double)d->N * d->outH * d->outW * d->G * d->Co * d->Ci * d->kh * d->kw;
   const int nthr = conv_threads(work);
   /* a unit is a block of output pixels and a chunk of the (group, channel block) pairs; the
      pairs of a chunk run back to back so the unit's input rows are reused from L1/L2. Chunks
      are split further only when there would not be enough units for the threads. */
   const int64_t gobs = d->G * d->nob;
   while (rpu > 1 && d->N * ceil_div(d->outH, rpu) * phases * nseg < 4 * nthr)
      rpu = (rpu + 1) / 2;
   const int64_t nrb = ceil_div(d->outH, rpu);
   const int64_t pix_units = d->N * nrb * phases * nseg;
   int64_t nchunks = 1;
   while (nchunks < gobs && pix_units * nchunks < 4 * nthr) nchunks *= 2;
   if (nchunks > gobs) nchunks = gobs;
   const int64_t chunk = ceil_div(gobs, nchunks);
   nchunks = ceil_div(gobs, chunk);
   const int64_t units = pix_units * nchunks;
   /* forward-mode scratch per thread: accumulators, pixel pointers, padded border runs (at most
      every pixel of a unit, one run each), and one zero vector shared by all threads */
   size_t edge_elems = 0, zero_elems = 0;
   int64_t nborder = 0;
   if (!d->transposed) {
      int64_t flo = 0, fhi = 0;
      if (d->G == 1 && d->dw == 1 && d->kw > 1) {
         fused_range(d, &flo, &fhi);
         nborder = d->outW - (fhi - flo);
         if (nborder > seg) nborder = seg;
         edge_elems = (size_t)((rpu * nborder * d->kw * d->Ci + 15) / 16 * 16);
      }
      zero_elems = (size_t)d->inC;
   }
   const size_t per_thread = (size_t)UNIT_PX * ACC_PITCH + edge_elems + UNIT_PX * 2 + 16;
   const size_t bytes = (size_t)nthr * per_thread * sizeof(float) + (zero_elems + 16) * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
   float *zero = scratch + (size_t)nthr * per_thread;
   memset(zero, 0, (zero_elems + 16) * sizeof(float));
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *mine = scratch + (size_t)conv_thread_id() * per_thread;
      fwd_scratch sc = {mine, mine + UNIT_PX * ACC_PITCH,
                        (const float **)(void *)(mine + UNIT_PX * ACC_PITCH + edge_elems)};
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t ck = u % nchunks, rest = u / nchunks;
         const int64_t n = rest / (nrb * phases * nseg);
         const int64_t rb = (rest / (phases * nseg)) % nrb;
         const int64_t ph = (rest / nseg) % phases, sg = rest % nseg;
         const int64_t r0 = rb * rpu, r1 = r0 + rpu < d->outH ? r0 + rpu : d->outH;
         const int64_t g0 = ck * chunk, g1 = g0 + chunk < gobs ? g0 + chunk : gobs;
         for (int64_t gob = g0; gob < g1; gob++) {
            const int64_t gi = gob / d->nob, ob = gob % d->nob;
            if (d->transposed) {
               const int64_t pcols = ceil_div(d->outW - ph, d->sw);
               const int64_t qb = sg * seg, qe = qb + seg < pcols ? qb + seg : pcols;
               if (qb < qe) tr_unit(d, n, gi, ob, r0, r1, ph, qb, qe, sc.acc);
            } else {
               const int64_t qb = sg * seg, qe = qb + seg < d->outW ? qb + seg : d->outW;
               fwd_unit(d, n, gi, ob, r0, r1, qb, qe, zero, &sc);
            }
         }
      }
      if (d->stream) _mm_sfence(); /* order the streaming stores before the region ends */
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

static lm_status fwd_direct(const conv_geom *g, const float *x, const float *w,
                            const float *bias, const float *res, int act, float *out) {
   const int64_t OB = block_width(g->Og), nob = ceil_div(g->Og, OB);
   const size_t bytes = (size_t)(g->G * nob * g->K * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   lm_conv_f32_pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * g->K));
   dconv d = {x, g->H, g->W, g->C, out, g->Ho, g->Wo, g->O, g->N, g->G, g->Cg, g->Og,
              g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, 0, wp, OB, nob,
              bias, res, act, 0};
   lm_status st = dconv_run(&d);
   lm_free(wp, bytes);
   return st;
}

static lm_status bwdd_direct(const conv_geom *g, const float *gout, const float *w, float *gx) {
   const int64_t OB = block_width(g->Cg), ncb = ceil_div(g->Cg, OB);
   const size_t bytes = (size_t)(g->G * ncb * g->kh * g->kw * g->Og * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   lm_conv_f32_pack_bwd(g, w, OB, ncb, wp, conv_threads((double)g->O * g->K));
   /* out pixel (hi, wi) reads grad_out pixel ((hi - ph' + i'*dh)/sh, ...) with ph' = dh*(kh-1)-ph */
   dconv d = {gout, g->Ho, g->Wo, g->O, gx, g->H, g->W, g->C, g->N, g->G, g->Og, g->Cg,
              g->kh, g->kw, g->sh, g->sw, g->dh * (g->kh - 1) - g->ph,
              g->dw * (g->kw - 1) - g->pw, g->dh, g->dw, g->sh > 1 || g->sw > 1, wp, OB, ncb,
              NULL, NULL, 0, 0};
   if (d.transposed) {
      /* the forward unit would read columns (q - pw')/1: use the phase form for every stride
         above 1 (rows with sh == 1 simply have every tap row valid) */
      d.sh = g->sh;
      d.sw = g->sw;
   }
   lm_status st = dconv_run(&d);
   lm_free(wp, bytes);
   return st;
}

/* ---------------------------------------------------------------------------------------------
 * small groups (ResNeXt: 4 or 8 channels per group): GB consecutive groups are run as one group
 * with a block-diagonal kernel, so that the output-channel vectors are full (16 lanes) and each
 * micro-kernel call reduces over GB*Cg channels instead of Cg. Activations keep their layout: the
 * channels of consecutive groups are consecutive anyway.
 */
static int64_t super_groups(const conv_geom *g) {
   if (g->G == 1 || g->Og >= 16 || g->Cg > 16) return 1;
   int64_t gb = 1;
   for (int64_t d = 2; d <= g->G; d++)
      if (g->G % d == 0 && d * g->Og <= 16 && d * g->Cg <= 64) gb = d;
   return gb;
}

static conv_geom merged_geom(const conv_geom *g, int64_t gb) {
   conv_geom m = *g;
   m.G = g->G / gb;
   m.Cg = g->Cg * gb;
   m.Og = g->Og * gb;
   m.K = m.Cg * g->kh * g->kw;
   return m;
}

/* w (O, taps, Cg) -> block-diagonal (O, taps, gb*Cg) */
static float *merged_weights(const conv_geom *g, int64_t gb, const float *w, size_t *bytes) {
   const int64_t taps = g->kh * g->kw, Cg = g->Cg, K2 = taps * Cg * gb;
   *bytes = (size_t)(g->O * K2) * sizeof(float);
   float *w2 = lm_alloc(*bytes);
   if (!w2) return NULL;
   memset(w2, 0, *bytes);
   for (int64_t co = 0; co < g->O; co++) {
      const int64_t gl = (co / g->Og) % gb; /* group within its super group */
      for (int64_t t = 0; t < taps; t++)
         memcpy(w2 + co * K2 + t * Cg * gb + gl * Cg, w + co * g->K + t * Cg,
                (size_t)Cg * sizeof(float));
   }
   return w2;
}

/* A 1x1, stride-1, unpadded, ungrouped weight gradient is one product: gw (O x C) = gout^T
   (O x P) * x (P x C) over the P = N*H*W pixels, which lm_sgemm blocks for the cache. The direct
   kernel (conv_bwdw_f32_avx512.c) keeps a partial O x C sum per thread and passes over it once
   per group of ~128 pixels: fine when that partial stays in L2, but 1x1 layers with wide
   channels and few pixels (resnet50's 7x7 layers: 2048x512 floats = 4 MB) stream it from memory.
   On resnet50's 1x1 layers the product wins from a 2 MB partial on, ties at 1 MB and loses
   below, hence BWDW_GEMM_MIN (numbers: docs/performance.md, "Measurements behind kernel choices").
   Strided 1x1 layers gather their pixels first, and take the same route for grad_x too
   (lm_conv_bwdd_nhwc_avx512). LUMEN_CONV_BWDW_GEMM=0 turns both off. */
enum { BWDW_GEMM_MIN = 512 * 1024 }; /* O * C floats: a 2 MB partial sum */
static int pw_gemm_usable(const conv_geom *g) {
   return g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0 && g->G == 1 &&
          g->N * g->Ho * g->Wo > 0 && g->O * g->C >= BWDW_GEMM_MIN &&
          lm_impl_on(LM_IMPL_CONV_1X1_GEMM);
}

lm_status lm_conv_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                  const float *bias, const float *res, int act, float *out) {
   const int64_t gb = super_groups(g);
   if (gb == 1) return fwd_direct(g, x, w, bias, res, act, out);
   size_t bytes;
   float *w2 = merged_weights(g, gb, w, &bytes);
   if (!w2) return LM_ERR_OOM;
   const conv_geom m = merged_geom(g, gb);
   lm_status st = fwd_direct(&m, x, w2, bias, res, act, out);
   lm_free(w2, bytes);
   return st;
}

lm_status lm_conv_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                   float *gx) {
   if (pw_gemm_usable(g) && (g->sh != 1 || g->sw != 1)) {
      lm_impl_ran(LM_IMPL_CONV_1X1_GEMM);
      /* a wide strided 1x1 layer: grad_x at the pixels it reads is one product, gout (P x O) *
         w (O x C), scattered into a zeroed grad_x (the stride-1 ones take the pointwise
         kernels), faster than the direct kernel on resnet50's strided 1x1 layers (numbers:
         docs/performance.md, "Measurements behind kernel choices") */
      const int64_t P = g->N * g->Ho * g->Wo, O = g->O, C = g->C;
      const size_t bytes = (size_t)(P * C) * sizeof(float);
      float *buf = lm_alloc(bytes);
      if (!buf) return LM_ERR_OOM;
      lm_sgemm(0, 0, P, C, O, 1.0f, gout, O, w, C, 0.0f, buf, C);
      lm_conv_pw_gather(g, gx, buf, 1);
      lm_free(buf, bytes);
      return LM_OK;
   }
   const int64_t gb = super_groups(g);
   if (gb == 1) return bwdd_direct(g, gout, w, gx);
   size_t bytes;
   float *w2 = merged_weights(g, gb, w, &bytes);
   if (!w2) return LM_ERR_OOM;
   const conv_geom m = merged_geom(g, gb);
   lm_status st = bwdd_direct(&m, gout, w2, gx);
   lm_free(w2, bytes);
   return st;
}

lm_status lm_conv_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                   float *gw, float *gb_) {
   if (gw && pw_gemm_usable(g)) {
      lm_impl_ran(LM_IMPL_CONV_1X1_GEMM);
      const int64_t P = g->N * g->Ho * g->Wo, O = g->O, C = g->C;
      const float *xs = x;
      float *gath = NULL;
      size_t gbytes = 0;
      if (g->sh != 1 || g->sw != 1) {
         /* a strided 1x1 layer (the downsample of a ResNet stage) reads every sh-th row and
            sw-th column: gather those pixels (P x C, 1.6 MB for resnet50's last one) and take
            the same product, which beats the direct kernel there too (numbers:
            docs/performance.md, "Measurements behind kernel choices") */
         gbytes = (size_t)(P * C) * sizeof(float);
         gath = lm_alloc(gbytes);
         if (!gath) return LM_ERR_OOM;
         lm_conv_pw_gather(g, (float *)x, gath, 0);
         xs = gath;
      }
      lm_sgemm(1, 0, O, C, P, 1.0f, gout, O, xs, C, 0.0f, gw, C);
      if (gath) lm_free(gath, gbytes);
      if (gb_) {
         /* the bias gradient: column sums of gout, 16 channels a vector, pixels in order */
         for (int64_t o0 = 0; o0 < O; o0 += 16) {
            const int64_t nv = O - o0 < 16 ? O - o0 : 16;
            const __mmask16 m = (__mmask16)(nv == 16 ? 0xFFFF : (1u << nv) - 1);
            __m512 a = _mm512_setzero_ps();
            for (int64_t p = 0; p < P; p++)
               a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m, gout + p * O + o0));
            _mm512_mask_storeu_ps(gb_ + o0, m, a);
         }
      }
      return LM_OK;
   }
   const int64_t gb = super_groups(g);
   if (gb == 1 || !gw) return lm_conv_bwdw_direct_f32(g, x, gout, gw, gb_);
   const conv_geom m = merged_geom(g, gb);
   const size_t bytes = (size_t)(g->O * m.K) * sizeof(float);
   float *gw2 = lm_alloc(bytes);
   if (!gw2) return LM_ERR_OOM;
   lm_status st = lm_conv_bwdw_direct_f32(&m, x, gout, gw2, gb_);
   if (st == LM_OK) {
      /* keep the diagonal blocks */
      const int64_t taps = g->kh * g->kw, Cg = g->Cg;
      for (int64_t co = 0; co < g->O; co++) {
         const int64_t gl = (co / g->Og) % gb;
         for (int64_t t = 0; t < taps; t++)
            memcpy(gw + co * g->K + t * Cg, gw2 + co * m.K + t * Cg * gb + gl * Cg,
                   (size_t)Cg * sizeof(float));
      }
   }
   lm_free(gw2, bytes);
   return st;
}
