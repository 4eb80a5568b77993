/* conv_avx512.c -- float32 NHWC convolution kernels for AVX-512 (direct "implicit GEMM").
 *
 * No im2col buffer and no generic GEMM: register-blocked micro-kernels read the activations in
 * place. Weights are packed once per call (16 x 16 register transposes) into blocks of OB (<= 64)
 * output channels:
 *   wp[g][ob][tap][ci][OB]   (tap = i*kw + j, ci = input channel within the group)
 * so that for one tap the weights of consecutive input channels are consecutive rows of OB floats.
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
 * residual, ReLU) is applied when the accumulators are written out; outputs much larger than the
 * caches are written with streaming stores.
 *
 * Backward data: stride 1 is the same forward machinery on grad_out with the flipped kernel
 * (in/out channels swapped, padding d*(k-1)-p). Stride s > 1 splits grad_x into s_h x s_w phases;
 * inside one phase every output pixel uses the same taps, so it is again a dense direct
 * convolution (no zero-inserted work, no scatter, no atomics).
 *
 * Backward weight: per-thread partial sums in the packed layout; the micro-kernel holds R input
 * channels x NV vectors of output channels in registers and runs over the pixels of a group of
 * rows: acc[r][v] += x[pixel][ci+r] (broadcast) * grad_out[pixel][v]. Partials are summed in a
 * fixed order (deterministic) and transposed into (O, kh, kw, Cg) at the end; the bias gradient
 * is summed in the same pass.
 *
 * Small groups (ResNeXt's 4 or 8 channels per group) run GB groups at a time as one group with a
 * block-diagonal kernel so the vectors are full. Depthwise convolutions have their own kernels
 * (vectorized over C) at the end of the file.
 *
 * Pointwise convolutions (1x1, stride 1, no padding, groups 1; forward and backward data) have
 * their own driver: the whole reduction of a tile in registers, no accumulator buffer, the input
 * read in place as a pixels x channels matrix (see "pointwise" below). Inputs of 2..4 channels
 * (an RGB stem) run forward through the same micro-kernel loop, each kernel row's kw*C floats
 * one reduction (see "narrow inputs").
 */
#include "conv_internal.h"
#include "avx512_util.h"
#include <immintrin.h>
#include <stdatomic.h>

#define AI static inline __attribute__((always_inline))

enum { ACC_PITCH = 64, UNIT_PX = 128, ICB = 128 };

/* one step of a register-blocked reduction: a[k][v] += xp[k*xs] * wt[16v .. 16v+15] for PB
   pixels k (their values xs floats apart, broadcast) and NV vectors v of output channels (the
   direct, pointwise and narrow-input micro-kernels) */
AI void bcast_step(__m512 (*a)[4], const float *xp, int64_t xs, const float *wt, const int PB,
                   const int NV) {
   __m512 w[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++) w[v] = _mm512_load_ps(wt + 16 * v);
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++) {
      const __m512 b = _mm512_set1_ps(xp[k * xs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, w[v], a[k][v]);
   }
}

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
   int relu;
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
         if (d->relu) t = _mm512_max_ps(t, _mm512_setzero_ps());
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

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

static int64_t block_width(int64_t co) {
   if (co >= 64) return 64;
   return (co + 15) / 16 * 16;
}

/* 16 x 16 transpose through memory: dst[j*ld + i] = src[i*ls + j] (avx512_util.h's transpose16
   works in registers) */
static void transpose16_mem(const float *src, int64_t ls, float *dst, int64_t ld) {
   __m512 r[16], t[16];
   for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ls);
   for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
   }
   /* r[4q + c], 128-bit lane L = column 4L + c of rows 4q .. 4q+3 */
   for (int q = 0; q < 16; q += 4) {
      r[q] = _mm512_shuffle_ps(t[q], t[q + 2], 0x44);
      r[q + 1] = _mm512_shuffle_ps(t[q], t[q + 2], 0xEE);
      r[q + 2] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0x44);
      r[q + 3] = _mm512_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
   }
   for (int c = 0; c < 4; c++) {
      const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
      const __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
      const __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
      const __m512 v3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
      _mm512_storeu_ps(dst + (0 + c) * ld, _mm512_shuffle_f32x4(v0, v2, 0x88));
      _mm512_storeu_ps(dst + (8 + c) * ld, _mm512_shuffle_f32x4(v0, v2, 0xDD));
      _mm512_storeu_ps(dst + (4 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0x88));
      _mm512_storeu_ps(dst + (12 + c) * ld, _mm512_shuffle_f32x4(v1, v3, 0xDD));
   }
}

/* forward packing: w (O, taps, Cg) row-major -> wp[g][ob][tap][ci][OB], zero padded. The 16
   rows of a transpose are K floats apart: each is asked for PACK_PF lines ahead, since in a model
   every layer's weights come cold from memory and the hardware prefetchers did not follow 16
   streams. resnet50 folded, batch 8, 2 threads, one process alternating with and without (paired
   medians of 14-16 rounds): on the loaded host 8 lines ahead -4.9 ms a run (of 134), 4 lines
   -2.4, 4 against 8 a tie; on the quieter host (122 ms a run) a tie */
enum { PACK_PF = 8 };
static void pack_fwd(const conv_geom *g, const float *w, int64_t OB, int64_t nob, float *wp,
                     int nthr) {
   const int64_t Og = g->Og, K = g->K;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t gi = 0; gi < g->G; gi++) {
      for (int64_t ob = 0; ob < nob; ob++) {
         float *dst = wp + (gi * nob + ob) * K * OB;
         const float *src = w + (gi * Og + ob * OB) * K;
         const int64_t nvalid = Og - ob * OB < OB ? Og - ob * OB : OB;
         for (int64_t v0 = 0; v0 < OB; v0 += 16) {
            int64_t k0 = 0;
            if (v0 + 16 <= nvalid)
               for (; k0 + 16 <= K; k0 += 16) {
                  if (k0 + 16 * PACK_PF < K)
                     for (int r = 0; r < 16; r++)
                        _mm_prefetch((const char *)(src + (v0 + r) * K + k0 + 16 * PACK_PF),
                                     _MM_HINT_T0);
                  transpose16_mem(src + v0 * K + k0, K, dst + k0 * OB + v0, OB);
               }
            for (int64_t k = k0; k < K; k++)
               for (int64_t v = v0; v < v0 + 16; v++)
                  dst[k * OB + v] = v < nvalid ? src[v * K + k] : 0.0f;
         }
      }
   }
}

/* backward-data packing: the flipped kernel with in/out swapped,
   wp[g][cb][tap'][o][OB] = w[g*Og + o][flip(tap')][cb*OB + v] */
static void pack_bwd(const conv_geom *g, const float *w, int64_t OB, int64_t ncb, float *wp,
                     int nthr) {
   const int64_t taps = g->kh * g->kw, Cg = g->Cg, Og = g->Og, K = g->K;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t gi = 0; gi < g->G; gi++) {
      for (int64_t cb = 0; cb < ncb; cb++) {
         const int64_t nvalid = Cg - cb * OB < OB ? Cg - cb * OB : OB;
         for (int64_t t = 0; t < taps; t++) {
            const int64_t i = t / g->kw, j = t % g->kw;
            const int64_t tf = (g->kh - 1 - i) * g->kw + (g->kw - 1 - j);
            for (int64_t o = 0; o < Og; o++) {
               float *dst = wp + (((gi * ncb + cb) * taps + t) * Og + o) * OB;
               const float *src = w + (gi * Og + o) * K + tf * Cg + cb * OB;
               int64_t v = 0;
               for (; v < nvalid; v++) dst[v] = src[v];
               for (; v < OB; v++) dst[v] = 0.0f;
            }
         }
      }
   }
}

static lm_status fwd_direct(const conv_geom *g, const float *x, const float *w,
                            const float *bias, const float *res, int relu, float *out) {
   const int64_t OB = block_width(g->Og), nob = ceil_div(g->Og, OB);
   const size_t bytes = (size_t)(g->G * nob * g->K * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * g->K));
   dconv d = {x, g->H, g->W, g->C, out, g->Ho, g->Wo, g->O, g->N, g->G, g->Cg, g->Og,
              g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, 0, wp, OB, nob,
              bias, res, relu, 0};
   lm_status st = dconv_run(&d);
   lm_free(wp, bytes);
   return st;
}

static lm_status bwdd_direct(const conv_geom *g, const float *gout, const float *w, float *gx) {
   const int64_t OB = block_width(g->Cg), ncb = ceil_div(g->Cg, OB);
   const size_t bytes = (size_t)(g->G * ncb * g->kh * g->kw * g->Og * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   pack_bwd(g, w, OB, ncb, wp, conv_threads((double)g->O * g->K));
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
 * pointwise convolutions (1x1, stride 1, no padding, groups 1): the input is a P x C matrix of
 * P = N*H*W pixels, read in place, the output a P x O matrix. The weights are packed once per
 * call (pack_fwd: wp[ob][c][OB]); a work unit is a run of consecutive pixels (any number of rows
 * and images) whose input stays in L2 while every block of OB output channels passes over it,
 * the block's weights (C x OB) staying in L1. The micro-kernel keeps PB pixels x NV vectors in
 * registers for the whole reduction over C and writes them once, with the epilogue; the plain
 * case (no bias, residual or ReLU, full vectors) has its own instances with a bare store loop.
 * Outputs that do not fit in the last-level cache together with the input are written with
 * streaming stores (no read for ownership of lines that would be evicted before their consumer
 * reads them anyway).
 * Backward data of a pointwise convolution is the same product with the roles of C and O swapped
 * (grad_x = grad_out x W), packed by pack_bwd.
 */
/* PW_MAX_CIN: the most reduction channels taken (measured faster than the direct kernels up to
   2048: a block of weights, C x 64 floats, in L1 up to 128 channels, else in L2) */
enum { PW_UNIT_BYTES = 96 * 1024, PW_MAXPB = 14, PW_MAX_CIN = 2048 };

typedef struct {
   float *out;        /* the tile's first pixel, at the block's first channel */
   const float *res;  /* the same place in the residual, or NULL */
   const float *bias; /* at the block's first channel, or NULL */
   int64_t ostride;   /* floats from one output pixel to the next */
   int relu, stream;  /* stream: full vectors, 64-byte aligned */
   __mmask16 m[4];    /* the valid lanes of each vector */
} pw_epi;

/* the general epilogue of a PB x NV tile: bias, residual, ReLU, masked lanes, streaming stores
   when ep->stream */
AI void pw_epilogue(__m512 (*a)[4], const pw_epi *ep, const int PB, const int NV) {
   float *const o = ep->out;
   const int64_t os = ep->ostride;
   const float *const r = ep->res;
   const int relu = ep->relu, stream = ep->stream;
   __m512 bv[4];
   __mmask16 m[4];
#pragma GCC unroll 4
   for (int v = 0; v < NV; v++) {
      m[v] = ep->m[v];
      bv[v] = ep->bias ? _mm512_maskz_loadu_ps(m[v], ep->bias + 16 * v) : _mm512_setzero_ps();
   }
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) {
         __m512 t = _mm512_add_ps(a[k][v], bv[v]);
         if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], r + k * os + 16 * v));
         if (relu) t = _mm512_max_ps(t, _mm512_setzero_ps());
         if (stream)
            _mm512_stream_ps(o + k * os + 16 * v, t);
         else
            _mm512_mask_storeu_ps(o + k * os + 16 * v, m[v], t);
      }
}

/* PB pixels (pixel k at xp + k*C) x NV vectors over C channels. MODE 0: plain stores of full
   vectors; 1: streaming stores of full vectors; 2: the general epilogue (bias, residual, ReLU,
   masked lanes, streaming when ep->stream). */
AI void pw_body(const float *xp, int64_t C, const float *wt, int64_t OB, const pw_epi *ep,
                const int PB, const int NV, const int MODE) {
   __m512 a[PW_MAXPB][4];
   acc_zero(a, PB, NV);
   for (int64_t c = 0; c < C; c++) {
      /* the residual the epilogue adds, a line per channel step while the reduction runs:
         without it every tile waited on them at the end (resnet50's folded bottlenecks, whose
         last 1x1 convolution adds the shortcut: 64->256 at 56x56 15.6-17.9 -> 10.2-11.5 ms a
         run, the whole model 182-198 -> 170-183 ms; one burst at the start was slower) */
      if (MODE == 2 && ep->res && c < PB * NV)
         _mm_prefetch((const char *)(ep->res + (c / NV) * ep->ostride + 16 * (c % NV)),
                      _MM_HINT_T0);
      if ((c & 15) == 0) {
         /* the next tile's pixels, a line of each per 16 channels: without this the kernel
            waited on them (bench/ops.lua conv1x1 64->256 NHWC, 2.5-3.0 -> 2.0-2.4 ms). The
            address is computed as an integer: past the last tile it points beyond x, which a
            prefetch may do but C pointer arithmetic may not. */
#pragma GCC unroll 14
         for (int k = 0; k < PB; k++)
            _mm_prefetch((const char *)((uintptr_t)xp + (uintptr_t)((PB + k) * C + c) * 4),
                         _MM_HINT_T0);
      }
      bcast_step(a, xp + c, C, wt, PB, NV);
      wt += OB;
   }
   float *const o = ep->out;
   const int64_t os = ep->ostride;
   if (MODE == 0) {
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) _mm512_storeu_ps(o + k * os + 16 * v, a[k][v]);
      return;
   }
   if (MODE == 1) {
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) _mm512_stream_ps(o + k * os + 16 * v, a[k][v]);
      return;
   }
   pw_epilogue(a, ep, PB, NV);
}

typedef void (*pw_fn)(const float *, int64_t, const float *, int64_t, const pw_epi *);

#define PW_INST(MODE, PB, NV)                                                                   \
   static void pw_##MODE##_##PB##_##NV(const float *xp, int64_t C, const float *wt, int64_t OB, \
                                       const pw_epi *ep) {                                      \
      pw_body(xp, C, wt, OB, ep, PB, NV, MODE);                                                 \
   }
PW_INST(0, 14, 1) PW_INST(0, 12, 2) PW_INST(0, 8, 3) PW_INST(0, 6, 4)
PW_INST(1, 14, 1) PW_INST(1, 12, 2) PW_INST(1, 8, 3) PW_INST(1, 6, 4)
PW_INST(2, 1, 1) PW_INST(2, 2, 1) PW_INST(2, 3, 1) PW_INST(2, 4, 1) PW_INST(2, 5, 1)
PW_INST(2, 6, 1) PW_INST(2, 7, 1) PW_INST(2, 8, 1) PW_INST(2, 9, 1) PW_INST(2, 10, 1)
PW_INST(2, 11, 1) PW_INST(2, 12, 1) PW_INST(2, 13, 1) PW_INST(2, 14, 1)
PW_INST(2, 1, 2) PW_INST(2, 2, 2) PW_INST(2, 3, 2) PW_INST(2, 4, 2) PW_INST(2, 5, 2)
PW_INST(2, 6, 2) PW_INST(2, 7, 2) PW_INST(2, 8, 2) PW_INST(2, 9, 2) PW_INST(2, 10, 2)
PW_INST(2, 11, 2) PW_INST(2, 12, 2)
PW_INST(2, 1, 3) PW_INST(2, 2, 3) PW_INST(2, 3, 3) PW_INST(2, 4, 3) PW_INST(2, 5, 3)
PW_INST(2, 6, 3) PW_INST(2, 7, 3) PW_INST(2, 8, 3)
PW_INST(2, 1, 4) PW_INST(2, 2, 4) PW_INST(2, 3, 4) PW_INST(2, 4, 4) PW_INST(2, 5, 4)
PW_INST(2, 6, 4)

/* pixels per tile for NV vectors (PB*NV accumulators + NV weights + a broadcast <= 32 zmm) */
static const int pw_pb[5] = {0, 14, 12, 8, 6};
static const pw_fn pw_plain[2][5] = {{0, pw_0_14_1, pw_0_12_2, pw_0_8_3, pw_0_6_4},
                                     {0, pw_1_14_1, pw_1_12_2, pw_1_8_3, pw_1_6_4}};
static const pw_fn pw_gen[5][PW_MAXPB + 1] = {
   {0},
   {0, pw_2_1_1, pw_2_2_1, pw_2_3_1, pw_2_4_1, pw_2_5_1, pw_2_6_1, pw_2_7_1, pw_2_8_1, pw_2_9_1,
    pw_2_10_1, pw_2_11_1, pw_2_12_1, pw_2_13_1, pw_2_14_1},
   {0, pw_2_1_2, pw_2_2_2, pw_2_3_2, pw_2_4_2, pw_2_5_2, pw_2_6_2, pw_2_7_2, pw_2_8_2, pw_2_9_2,
    pw_2_10_2, pw_2_11_2, pw_2_12_2, 0, 0},
   {0, pw_2_1_3, pw_2_2_3, pw_2_3_3, pw_2_4_3, pw_2_5_3, pw_2_6_3, pw_2_7_3, pw_2_8_3, 0, 0, 0,
    0, 0, 0},
   {0, pw_2_1_4, pw_2_2_4, pw_2_3_4, pw_2_4_4, pw_2_5_4, pw_2_6_4, 0, 0, 0, 0, 0, 0, 0, 0},
};

typedef struct {
   const float *x;          /* P x C */
   float *out;              /* P x O */
   const float *res, *bias; /* res: P x O, or NULL; bias: O, or NULL */
   const float *wp;         /* wp[ob][c][OB] */
   int64_t P, C, O, OB, nob;
   int relu, stream;
} pw_prob;

/* pixels [p0, p0 + np): every block of output channels over the whole run */
static void pw_unit(const pw_prob *P, int64_t p0, int64_t np) {
   const int64_t C = P->C, O = P->O, OB = P->OB;
   const float *x = P->x + p0 * C;
   for (int64_t ob = 0; ob < P->nob; ob++) {
      const int64_t oc0 = ob * OB, nvalid = O - oc0 < OB ? O - oc0 : OB;
      const int nv = (int)((nvalid + 15) / 16), pb = pw_pb[nv];
      const float *wt = P->wp + ob * C * OB;
      pw_epi ep;
      ep.ostride = O;
      ep.bias = P->bias ? P->bias + oc0 : NULL;
      ep.relu = P->relu;
      for (int v = 0; v < 4; v++) {
         const int64_t left = nvalid - 16 * v;
         ep.m[v] = left >= 16 ? (__mmask16)0xFFFF
                              : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      }
      const int full = nvalid % 16 == 0;
      ep.stream = P->stream && full;
      const pw_fn fast = (full && !P->bias && !P->res && !P->relu) ? pw_plain[ep.stream][nv]
                                                                   : pw_gen[nv][pb];
      float *o = P->out + p0 * O + oc0;
      const float *r = P->res ? P->res + p0 * O + oc0 : NULL;
      int64_t q = 0;
      for (; q + pb <= np; q += pb) {
         ep.out = o + q * O;
         ep.res = r ? r + q * O : NULL;
         fast(x + q * C, C, wt, OB, &ep);
      }
      if (q < np) {
         ep.out = o + q * O;
         ep.res = r ? r + q * O : NULL;
         pw_gen[nv][np - q](x + q * C, C, wt, OB, &ep);
      }
   }
}

/* streaming stores: LUMEN_CONV_STREAM=0 / 1 forces them off / on (specs, benchmarks); by default
   when the output block is cold (its old lines have left the caches: no read for ownership, and
   the input stays cached), or when the output alone exceeds half the cache share
   (lm_mem_cache_share): a result that large does not stay cached for its reader, and writing it
   through the cache evicts the input and the packed weights. Measured on the machine whose
   virtual L3 reads 480 MiB (cache share 32 MiB): 64->256 at 56x56, batch 8 (25.7 MB out), in a
   loop that drops its result, 2.68-2.80 ms against 3.03-3.28 ms before (out + in against the
   whole reported L3), three alternations; resnet50 inference and bench/train_step.lua unchanged. */
static int pw_stream(double out_bytes, int cold) {
   const char *e = getenv("LUMEN_CONV_STREAM");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) return e[0] == '1';
   return cold || out_bytes > 0.5 * (double)lm_mem_cache_share();
}

static lm_status pw_run(const pw_prob *P0, int *stream) {
   pw_prob PP = *P0;
   const pw_prob *P = &PP;
   const int64_t Pn = P->P;
   const int cold = stream && *stream;
   if (stream) *stream = 0;
   if (Pn <= 0 || P->O <= 0) return LM_OK;
   PP.stream = ((uintptr_t)P->out & 63) == 0 && P->O % 16 == 0 &&
               pw_stream((double)Pn * P->O * sizeof(float), cold);
   if (stream) *stream = PP.stream;
   const int nthr = conv_threads((double)Pn * P->O * (P->C > 0 ? P->C : 1));
   /* pixels per unit: the unit's input in L2 (a multiple of every tile height but 14), and
      enough units for the threads to share */
   int64_t U = PW_UNIT_BYTES / (P->C * (int64_t)sizeof(float));
   U = U / 24 * 24;
   if (U < 24) U = 24;
   if (U > 1008) U = 1008;
   while (U > 24 && ceil_div(Pn, U) < 4 * nthr) U = (U / 2 + 23) / 24 * 24;
   const int64_t units = ceil_div(Pn, U);
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t p0 = u * U, np = Pn - p0 < U ? Pn - p0 : U;
         pw_unit(P, p0, np);
      }
      if (P->stream) _mm_sfence(); /* order the streaming stores before the region ends */
   }
   return LM_OK;
}

static void pw_gather(const conv_geom *g, float *x, float *buf, int unstride);

/* a strided, unpadded 1x1 layer (a ResNet stage's downsample) reads every sh-th row and sw-th
   column: forward gathers those pixels (N*Ho*Wo x C) and runs the pointwise kernel on them */
static int pw_strided(const conv_geom *g) {
   return g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0 && (g->sh != 1 || g->sw != 1) &&
          conv_env_on("LUMEN_CONV_PW_STRIDED");
}

int lm_conv_pw_usable(const conv_geom *g, int backward_data) {
   /* strided forward only: their grad_x through this kernel and a scatter was slower than the
      direct kernel or the product (256->512: 4.3 against 4.2 ms; 1024->2048: 4.1 against 3.9) */
   if (!backward_data && pw_strided(g) && g->G == 1 && g->C > 0 && g->O > 0)
      return g->C <= PW_MAX_CIN;
   if (!conv_is_pointwise(g) || g->G != 1 || g->C <= 0 || g->O <= 0) return 0;
   if (backward_data) return g->O <= PW_MAX_CIN;
   return g->C <= PW_MAX_CIN;
}

lm_status lm_conv_pw_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int relu, float *out,
                                     int *stream) {
   const int64_t OB = block_width(g->O), nob = ceil_div(g->O, OB);
   const size_t bytes = (size_t)(nob * g->C * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * g->C));
   const int64_t P = g->N * g->Ho * g->Wo;
   float *gath = NULL;
   size_t gbytes = 0;
   if (g->sh != 1 || g->sw != 1) {
      /* the gather costs a pass over P x C floats; the direct kernel's strided rows cost more.
         2 threads, resnet50 batch 8, ms a call (bench/conv.lua r50_1x1_*_s2, two
         alternations): 256->512 3.96-4.09 -> 3.39-3.51, 512->1024 3.65-3.70 -> 3.36-3.41,
         1024->2048 3.63-3.73 -> 3.53-3.60 */
      gbytes = (size_t)(P * g->C) * sizeof(float);
      gath = lm_alloc(gbytes);
      if (!gath) {
         lm_free(wp, bytes);
         return LM_ERR_OOM;
      }
      pw_gather(g, (float *)x, gath, 0);
      x = gath;
   }
   const pw_prob Pr = {x, out, res, bias, wp, P, g->C, g->O, OB, nob, relu, 0};
   lm_status st = pw_run(&Pr, stream);
   if (gath) lm_free(gath, gbytes);
   lm_free(wp, bytes);
   return st;
}

lm_status lm_conv_pw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                      float *gx, int *stream) {
   const int64_t OB = block_width(g->C), ncb = ceil_div(g->C, OB);
   const size_t bytes = (size_t)(ncb * g->O * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   pack_bwd(g, w, OB, ncb, wp, conv_threads((double)g->O * g->C));
   const pw_prob P = {gout, gx, NULL, NULL, wp, g->N * g->H * g->W, g->O, g->C, OB, ncb, 0, 0};
   lm_status st = pw_run(&P, stream);
   lm_free(wp, bytes);
   return st;
}

/* ---------------------------------------------------------------------------------------------
 * narrow inputs (2..4 channels, which the register-blocked kernels do not take: an RGB stem),
 * groups 1, dilation 1, forward. For one kernel row, the kw*C input floats that an output pixel
 * reads are consecutive in an NHWC row, and the next pixel's start sw*C floats further on. So an
 * output row is a pointwise product over F = kw*C "channels" with a pixel stride of sw*C, summed
 * over the kernel's rows: the pointwise micro-kernel's loop (PB pixels x NV vectors in registers,
 * the weights of a row (F x OB) loaded a vector at a time), with every FMA doing useful work. The
 * direct kernel reduced C = 3 channels a tap. A work unit is a band of output rows of one image,
 * whose input rows are first copied ("staged") with their column padding as zeros; rows above
 * and below the image are left out of the sum.
 * resnet50's 7x7 stem (3 -> 64, stride 2, batch 8 at 224x224, 2 threads, bench/conv.lua
 * r50_stem, two alternations): 5.41-5.44 ms on the direct kernel, 3.72-3.73 here (507 GFLOP/s,
 * 92 % of the FMA peak); 3.87-3.93 without the streaming stores. In the folded model 5.6-5.9 ->
 * 3.9 ms.
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
          conv_env_on("LUMEN_CONV_NC");
}

lm_status lm_conv_nc_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int relu, float *out,
                                     int *stream) {
   const int64_t OB = block_width(g->O), nob = ceil_div(g->O, OB), K = g->K;
   const int64_t C = g->C, F = g->kw * C, ps = g->sw * C, O = g->O;
   const size_t bytes = (size_t)(nob * K * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * K));
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
   /* streaming stores as the pointwise kernels choose them (pw_stream): the stem's output
      (25.7 MB in resnet50 at batch 8) is larger than the cache share */
   const int strm = ((uintptr_t)out & 63) == 0 && O % 16 == 0 &&
                    pw_stream((double)g->N * g->Ho * g->Wo * O * sizeof(float), *stream);
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
               ep.ostride = O;
               ep.bias = bias ? bias + oc0 : NULL;
               ep.relu = relu;
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

/* ---------------------------------------------------------------------------------------------
 * backward weight
 */
typedef struct {
   const float *x, *g;
   int64_t n;
} bw_seg;

/* pixels ahead that bww_body prefetches (x and grad_out rows): without it the kernel waited on
   them; with it the 1x1 64->256 backward weight (bench/conv.lua) took 2.5-3.1 ms instead of
   4.2-5.1 (2, 4, 8, 12 and 16 tried; 8 was best) */
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

static lm_status bwdw_direct(const conv_geom *g, const float *x, const float *gout, float *gw,
                             float *gb) {
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
      chunks (2 threads, resnet50 batch 8, ms a call: 3x3 256->256 stride 2 4.7-5.2 -> 4.3-4.4,
      3x3 512->512 stride 2 6.3-6.7 -> 5.7-5.9, 1x1 256->1024 at 14x14 2.06-2.10 -> 1.80-1.87,
      1x1 512->256 at 28x28 4.15-4.28 -> 3.66-3.85; bench/conv.lua r50_) */
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
   kernel above keeps a partial O x C sum per thread and passes over it once per group of ~128
   pixels: fine when that partial stays in L2, but 1x1 layers with wide channels and few pixels
   (resnet50's 7x7 layers: 2048x512 floats = 4 MB) stream it from memory.
   Measured on resnet50's 1x1 layers, batch 8, one thread, process CPU time per call, two
   alternations: the product wins from a 2 MB partial on (1024->512 at 14x14: 17.5-18.0 -> 16.1-
   16.4 ms; 512->2048 at 7x7: 10.6 -> 7.8-7.9; 2048->512 at 7x7: 10.7-10.9 -> 8.1-8.3), ties at
   1 MB (1024->256 at 14x14: 8.6-8.7 both) and loses below (64->256 at 56x56: 9.0 -> 11.4;
   512->256 at 28x28: 16.6-16.8 -> 17.3-17.6), hence BWDW_GEMM_MIN.
   Strided 1x1 layers gather their pixels first, and take the same route for grad_x too
   (lm_conv_bwdd_nhwc_avx512). LUMEN_CONV_BWDW_GEMM=0 turns both off. */
enum { BWDW_GEMM_MIN = 512 * 1024 }; /* O * C floats: a 2 MB partial sum */
static int pw_gemm_usable(const conv_geom *g) {
   return g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0 && g->G == 1 &&
          g->N * g->Ho * g->Wo > 0 && g->O * g->C >= BWDW_GEMM_MIN &&
          conv_env_on("LUMEN_CONV_BWDW_GEMM");
}

/* x (N, H, W, C) -> the pixels a strided 1x1 layer reads, (N*Ho*Wo, C) (unstride = 0), or back:
   those rows of buf into gx, whose other pixels are zeroed (unstride = 1) */
static void pw_gather(const conv_geom *g, float *x, float *buf, int unstride) {
   const int64_t Ho = g->Ho, Wo = g->Wo, C = g->C, rows = g->N * Ho;
   if (unstride) memset(x, 0, (size_t)(g->N * g->H * g->W * C) * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(conv_threads((double)rows * Wo * C * 64)) \
   if (rows * Wo * C >= 65536)
   for (int64_t r = 0; r < rows; r++) {
      const int64_t n = r / Ho, i = r % Ho;
      float *img = x + (n * g->H + i * g->sh) * g->W * C;
      for (int64_t j = 0; j < Wo; j++) {
         float *px = img + j * g->sw * C, *pb = buf + (r * Wo + j) * C;
         if (unstride)
            memcpy(px, pb, (size_t)C * sizeof(float));
         else
            memcpy(pb, px, (size_t)C * sizeof(float));
      }
   }
}

lm_status lm_conv_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                  const float *bias, const float *res, int relu, float *out) {
   const int64_t gb = super_groups(g);
   if (gb == 1) return fwd_direct(g, x, w, bias, res, relu, out);
   size_t bytes;
   float *w2 = merged_weights(g, gb, w, &bytes);
   if (!w2) return LM_ERR_OOM;
   const conv_geom m = merged_geom(g, gb);
   lm_status st = fwd_direct(&m, x, w2, bias, res, relu, out);
   lm_free(w2, bytes);
   return st;
}

lm_status lm_conv_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                   float *gx) {
   if (pw_gemm_usable(g) && (g->sh != 1 || g->sw != 1)) {
      /* a wide strided 1x1 layer: grad_x at the pixels it reads is one product, gout (P x O) *
         w (O x C), scattered into a zeroed grad_x (the stride-1 ones take the pointwise
         kernels). One thread, CPU ms a call, batch 8: 1024->2048 stride 2 at 14x14
         19.6-19.7 -> 16.0-16.1, 512->1024 stride 2 at 28x28 17.1-17.2 -> 16.0 (docs/performance.md) */
      const int64_t P = g->N * g->Ho * g->Wo, O = g->O, C = g->C;
      const size_t bytes = (size_t)(P * C) * sizeof(float);
      float *buf = lm_alloc(bytes);
      if (!buf) return LM_ERR_OOM;
      lm_sgemm(0, 0, P, C, O, 1.0f, gout, O, w, C, 0.0f, buf, C);
      pw_gather(g, gx, buf, 1);
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
      const int64_t P = g->N * g->Ho * g->Wo, O = g->O, C = g->C;
      const float *xs = x;
      float *gath = NULL;
      size_t gbytes = 0;
      if (g->sh != 1 || g->sw != 1) {
         /* a strided 1x1 layer (the downsample of a ResNet stage) reads every sh-th row and
            sw-th column: gather those pixels (P x C, 1.6 MB for resnet50's last one) and take
            the same product. One thread, CPU ms a call, batch 8: 1024->2048 stride 2 at 14x14
            18.4 -> 15.2, 512->1024 stride 2 at 28x28 16.9 -> 15.4 (docs/performance.md) */
         gbytes = (size_t)(P * C) * sizeof(float);
         gath = lm_alloc(gbytes);
         if (!gath) return LM_ERR_OOM;
         pw_gather(g, (float *)x, gath, 0);
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
   if (gb == 1 || !gw) return bwdw_direct(g, x, gout, gw, gb_);
   const conv_geom m = merged_geom(g, gb);
   const size_t bytes = (size_t)(g->O * m.K) * sizeof(float);
   float *gw2 = lm_alloc(bytes);
   if (!gw2) return LM_ERR_OOM;
   lm_status st = bwdw_direct(&m, x, gout, gw2, gb_);
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

/* ---------------------------------------------------------------------------------------------
 * depthwise (groups == C == O), vectorized over C: blocks of 64 channels (4 zmm, masked at the
 * tail) x 4 consecutive output pixels, so each weight vector is loaded once per 4 pixels.
 * wt is the kernel transposed to [tap][C].
 */
enum { DW_PB = 4 };

static void dw_masks(int64_t left, __mmask16 *m) {
   for (int v = 0; v < 4; v++) {
      const int64_t l = left - 16 * v;
      m[v] = l >= 16 ? (__mmask16)0xFFFF : (l <= 0 ? (__mmask16)0 : (__mmask16)((1u << l) - 1));
   }
}

static float *dw_transpose_w(const conv_geom *g, const float *w, size_t *bytes) {
   const int64_t C = g->C, taps = g->kh * g->kw;
   *bytes = (size_t)(taps * C) * sizeof(float);
   float *wt = lm_alloc(*bytes);
   if (!wt) return NULL;
   for (int64_t c = 0; c < C; c++)
      for (int64_t t = 0; t < taps; t++) wt[t * C + c] = w[c * taps + t];
   return wt;
}

/* forward (transposed = 0) or backward data (transposed = 1, gather form): output pixel (r, q)
   of image n reads input pixel (r*sh - ph + i*dh, q*sw - pw + j*dw) (forward) or
   ((r + ph - i*dh)/sh, (q + pw - j*dw)/sw) where divisible (backward data) */
static void dw_rows(const conv_geom *g, int transposed, const float *in, const float *wt,
                    const float *bias, const float *res, int relu, float *out, int nthr) {
   const int64_t C = g->C, kh = g->kh, kw = g->kw;
   const int64_t inH = transposed ? g->Ho : g->H, inW = transposed ? g->Wo : g->W;
   const int64_t outH = transposed ? g->H : g->Ho, outW = transposed ? g->W : g->Wo;
   const int64_t rows = g->N * outH;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t row = 0; row < rows; row++) {
      const int64_t n = row / outH, r = row % outH;
      const float *img = in + n * inH * inW * C;
      /* pixel blocks outside, channel blocks inside: the input is read in memory order */
      for (int64_t q0 = 0; q0 < outW; q0 += DW_PB) {
         const int64_t pb = outW - q0 < DW_PB ? outW - q0 : DW_PB;
         for (int64_t c0 = 0; c0 < C; c0 += 64) {
            __mmask16 m[4];
            dw_masks(C - c0, m);
            __m512 b[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
               b[v] = bias ? _mm512_maskz_loadu_ps(m[v], bias + c0 + 16 * v) : _mm512_setzero_ps();
            __m512 a[DW_PB][4];
#pragma GCC unroll 4
            for (int k = 0; k < DW_PB; k++)
#pragma GCC unroll 4
               for (int v = 0; v < 4; v++) a[k][v] = b[v];
            for (int64_t i = 0; i < kh; i++) {
               int64_t hi;
               if (!transposed) {
                  hi = r * g->sh - g->ph + i * g->dh;
                  if (hi < 0 || hi >= inH) continue;
               } else {
                  const int64_t th = r + g->ph - i * g->dh;
                  if (th < 0 || th % g->sh) continue;
                  hi = th / g->sh;
                  if (hi >= inH) continue;
               }
               const float *irow = img + hi * inW * C + c0;
               for (int64_t j = 0; j < kw; j++) {
                  const float *wp = wt + (i * kw + j) * C + c0;
                  __m512 w[4];
#pragma GCC unroll 4
                  for (int v = 0; v < 4; v++) w[v] = _mm512_maskz_loadu_ps(m[v], wp + 16 * v);
                  /* input column of each pixel, or -1 */
                  int64_t wi[DW_PB];
#pragma GCC unroll 4
                  for (int k = 0; k < DW_PB; k++) {
                     wi[k] = -1;
                     if (k >= pb) continue;
                     if (!transposed) {
                        const int64_t c = (q0 + k) * g->sw - g->pw + j * g->dw;
                        if (c >= 0 && c < inW) wi[k] = c;
                     } else {
                        const int64_t tw = q0 + k + g->pw - j * g->dw;
                        if (tw >= 0 && tw % g->sw == 0 && tw / g->sw < inW) wi[k] = tw / g->sw;
                     }
                  }
#pragma GCC unroll 4
                  for (int k = 0; k < DW_PB; k++) {
                     if (wi[k] < 0) continue;
                     const float *xp = irow + wi[k] * C;
#pragma GCC unroll 4
                     for (int v = 0; v < 4; v++)
                        a[k][v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], xp + 16 * v), w[v],
                                                  a[k][v]);
                  }
               }
            }
#pragma GCC unroll 4
            for (int k = 0; k < DW_PB; k++) {
               if (k >= pb) continue;
               const int64_t off = ((n * outH + r) * outW + q0 + k) * C + c0;
#pragma GCC unroll 4
               for (int v = 0; v < 4; v++) {
                  __m512 t = a[k][v];
                  if (res) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(m[v], res + off + 16 * v));
                  if (relu) t = _mm512_max_ps(t, _mm512_setzero_ps());
                  _mm512_mask_storeu_ps(out + off + 16 * v, m[v], t);
               }
            }
         }
      }
   }
}

lm_status lm_conv_dw_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                     const float *bias, const float *res, int relu, float *out) {
   size_t bytes;
   float *wt = dw_transpose_w(g, w, &bytes);
   if (!wt) return LM_ERR_OOM;
   dw_rows(g, 0, x, wt, bias, res, relu, out,
           conv_threads((double)g->N * g->Ho * g->Wo * g->C * g->kh * g->kw));
   lm_free(wt, bytes);
   return LM_OK;
}

lm_status lm_conv_dw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                      float *gx) {
   size_t bytes;
   float *wt = dw_transpose_w(g, w, &bytes);
   if (!wt) return LM_ERR_OOM;
   dw_rows(g, 1, gout, wt, NULL, NULL, 0, gx,
           conv_threads((double)g->N * g->Ho * g->Wo * g->C * g->kh * g->kw));
   lm_free(wt, bytes);
   return LM_OK;
}

/* gw: (C, 1, kh, kw); per-thread partials [tap][C] (+ bias), one output row per work unit */
lm_status lm_conv_dw_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                      float *gw, float *gb) {
   const int64_t N = g->N, C = g->C, H = g->H, W = g->W, Ho = g->Ho, Wo = g->Wo;
   const int64_t kh = g->kh, kw = g->kw, taps = kh * kw;
   if (gw) memset(gw, 0, (size_t)(C * taps) * sizeof(float));
   if (gb) memset(gb, 0, (size_t)C * sizeof(float));
   if (N * Ho * Wo == 0 || C == 0) return LM_OK;
   const int nthr = conv_threads((double)N * Ho * Wo * C * taps);
   const int64_t Cp = (C + 15) / 16 * 16, per = (taps + 1) * Cp;
   const size_t bytes = (size_t)(nthr * per) * sizeof(float);
   float *buf = lm_alloc(bytes);
   if (!buf) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *pw = buf + conv_thread_id() * per, *pb = pw + taps * Cp;
      memset(pw, 0, (size_t)per * sizeof(float));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < N * Ho; row++) {
         const int64_t n = row / Ho, ho = row % Ho;
         const float *grow = gout + row * Wo * C;
         for (int64_t c0 = 0; c0 < C; c0 += 64) {
            __mmask16 m[4];
            dw_masks(C - c0, m);
            if (gb) {
               __m512 s[4];
               for (int v = 0; v < 4; v++) s[v] = _mm512_maskz_loadu_ps(m[v], pb + c0 + 16 * v);
               for (int64_t wo = 0; wo < Wo; wo++)
                  for (int v = 0; v < 4; v++)
                     s[v] = _mm512_add_ps(s[v],
                                          _mm512_maskz_loadu_ps(m[v], grow + wo * C + c0 + 16 * v));
               for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(pb + c0 + 16 * v, m[v], s[v]);
            }
            if (!gw) continue;
            for (int64_t i = 0; i < kh; i++) {
               const int64_t hi = ho * g->sh - g->ph + i * g->dh;
               if (hi < 0 || hi >= H) continue;
               const float *xrow = x + (n * H + hi) * W * C + c0;
               for (int64_t j = 0; j < kw; j++) {
                  int64_t lo, hi_;
                  conv_valid_range(W, Wo, g->sw, g->pw, j * g->dw, &lo, &hi_);
                  float *ap = pw + (i * kw + j) * Cp + c0;
                  __m512 a[4];
                  for (int v = 0; v < 4; v++) a[v] = _mm512_maskz_loadu_ps(m[v], ap + 16 * v);
                  for (int64_t wo = lo; wo < hi_; wo++) {
                     const float *xp = xrow + (wo * g->sw - g->pw + j * g->dw) * C;
                     const float *gp = grow + wo * C + c0;
                     for (int v = 0; v < 4; v++)
                        a[v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], xp + 16 * v),
                                               _mm512_maskz_loadu_ps(m[v], gp + 16 * v), a[v]);
                  }
                  for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(ap + 16 * v, m[v], a[v]);
               }
            }
         }
      }
      const int nt = conv_num_threads_in_team();
#pragma omp single
      {
         for (int t = 0; t < nt; t++) {
            const float *src = buf + t * per;
            if (gw)
               for (int64_t c = 0; c < C; c++)
                  for (int64_t k = 0; k < taps; k++) gw[c * taps + k] += src[k * Cp + c];
            if (gb)
               for (int64_t c = 0; c < C; c++) gb[c] += src[taps * Cp + c];
         }
      }
   }
   lm_free(buf, bytes);
   return LM_OK;
}
