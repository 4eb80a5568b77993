/* conv_grouped_f32_avx512.c -- float32 NHWC convolutions with small groups for AVX-512
 * ("grouped_avx512"): 4, 8 or 16 channels a group in and out (RegNet's group width 8, ResNeXt's
 * 4 / 8 / 16), forward, backward data (stride 1) and backward weight.
 *
 * Why a kernel of its own: the direct kernel (conv_direct_f32_avx512.c) reduces over a group's
 * few channels per call and keeps its sums in memory between taps, so a 104-channel layer of
 * 13 groups of 8 ran at 20 GFLOP/s on two cores (PyTorch / oneDNN: 100), slower than the same
 * layer with groups = 1 and 13 times the work. Merging groups into block-diagonal super groups
 * needs groups % k == 0 (13 and 55 are prime to 2).
 *
 * Here a vector of L output channels covers L / Og whole groups (the last block may be
 * partial: masked lanes), and the reduction of a block runs over the gpb * Cg input channels of
 * its groups with a block-diagonal kernel (zeros off the diagonal: 1 / gpb of the multiply-adds
 * are useful, all of them in registers). L is 16, or 8 (ymm registers) where a group has at most
 * 8 outputs (fwd_lanes: RegNet's 8 then fill a vector with no zeros; forward 1.5-1.65x on a
 * Zen 4). Per work unit (an image, a block, a band of output
 * rows) the band's input rows of the block's channels are first copied with their padding as
 * zeros ("staging", Cb floats a pixel, rows of Wst pixels), so that every tap of every output
 * pixel is a valid address and output pixels form one flat run: virtual pixel P = rr * V + q
 * (V = sh * Wst / sw >= Wo) reads staged pixel sw * P + tap offset. The columns q >= Wo of a
 * virtual row are computed and dropped (7x7 maps: 9 virtual columns for 7). A micro-kernel call
 * holds up to 24 pixels' sums in registers over every tap and channel: one weight vector load
 * per 24 FMAs, each FMA broadcasting its input value from memory.
 *
 * Backward data at stride 1 is the same forward on grad_out with the flipped kernel (in / out
 * channels swapped, padding d * (k - 1) - p). Backward weight where Cg == Og < 16 (bwe_body):
 * the lanes are the block's 16 input channels, grad_out's output l of each group spread over its
 * group's lanes by one permute a pixel, 2 outputs x up to 12 taps of sums in registers, every
 * lane useful. Otherwise (bww_body) per tap Cg vectors of sums: lanes of group-in-vector m add
 * grad_out * x[m * Cg + k] (a masked FMA), so a vector holds channel k of every group of the
 * block; taps in chunks of 24 / Cg. A work item is a
 * block and a slice of the images (slices chosen from the problem alone), summed in slice order
 * at the end: the same bits for any thread count and with or without grad_weight; the bias
 * gradient beside.
 */
#include "impl.h"
#include "conv_f32_avx512.h"

enum { GR_PB = 24, GR_BAND_PX = 256 };

/* ---------------------------------------------------------------------------------------------
 * a problem as the kernels see it (forward form; backward data swaps the roles)
 */
typedef struct {
   int64_t N, inH, inW, C;   /* input images, C channels a pixel */
   int64_t outH, outW, O;    /* output */
   int64_t G, Cg, Og;        /* groups; reduction / output channels a group */
   int64_t kh, kw, sh, sw, ph, pw, dh, dw;
   int64_t L;                /* lanes a block: 16, or 8 (ymm) for the forward of Og <= 8 */
   int64_t gpb, Cb, nblk;    /* groups a block, input channels a block, blocks */
   int64_t Wst, V, Wneed;    /* staged row pitch (pixels), virtual row length, columns used */
   int64_t nr, nband;        /* output rows a band, bands an image */
   /* where output pixel (r, q) goes: pixel (orh + ostep * r, orw + ostep * q) of images of
      oHf x oWf pixels (a phase of a strided backward data; else 0, 0, 1 and outH x outW) */
   int64_t oHf, oWf, orh, orw, ostep;
} grp;

static int small_group(int64_t n) { return n == 4 || n == 8 || n == 16; }

int lm_conv_grp_usable(const conv_geom *g, int pass) {
   if (g->G <= 1 || !small_group(g->Cg) || !small_group(g->Og)) return 0;
   if (g->ph < 0 || g->pw < 0 || g->kh * g->kw > 64) return 0;
   if (g->N * g->Ho * g->Wo <= 0 || g->H * g->W <= 0) return 0; /* empty: the other kernels */
   if (pass == 1) {
      /* backward data as forwards over grad_out: at stride 1 the flipped kernel with padding
         d * (k - 1) - p >= 0; strided, per phase (one output step in both directions) */
      if (g->sh == 1 && g->sw == 1) {
         if (g->dh * (g->kh - 1) - g->ph < 0 || g->dw * (g->kw - 1) - g->pw < 0) return 0;
      } else if (g->sh != g->sw) {
         return 0;
      }
   }
   return 1;
}

static void grp_init(grp *p, int64_t N, int64_t inH, int64_t inW, int64_t C, int64_t outH,
                     int64_t outW, int64_t O, int64_t G, int64_t Cg, int64_t Og, int64_t kh,
                     int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                     int64_t dw, int64_t L) {
   grp q = {N, inH, inW, C, outH, outW, O, G, Cg, Og, kh, kw, sh, sw, ph, pw, dh, dw,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
   q.L = L;
   q.gpb = L / Og;
   q.Cb = q.gpb * Cg;
   q.nblk = ceil_div(O, L);
   q.Wneed = (outW - 1) * sw + (kw - 1) * dw + 1;
   int64_t wst = q.Wneed;
   while ((sh * wst) % sw || (sh * wst) / sw < outW) wst++;
   q.Wst = wst;
   q.V = sh * wst / sw;
   int64_t nr = GR_BAND_PX / q.V;
   if (nr < 1) nr = 1;
   if (nr > outH) nr = outH > 0 ? outH : 1;
   q.nr = nr;
   q.nband = ceil_div(outH, nr);
   q.oHf = outH, q.oWf = outW, q.orh = 0, q.orw = 0, q.ostep = 1;
   *p = q;
}

/* the forward's (and backward data's) lanes a block: 8 where a group has at most 8 outputs.
   16 lanes then hold 16 / Og groups with a block-diagonal kernel, 1 / gpb of every FMA useful;
   8 lanes (ymm, 32 registers with AVX-512VL) twice as many useful products an FMA. On a core
   with 256-bit FMA units (Zen 4) an 8-lane FMA issues twice a cycle where a 16-lane one issues
   once, so the same useful work takes half the issue slots; with two 512-bit units (Xeons) the
   two forms run the same useful FLOP rate. Measured on a Zen 4 (2 threads, see
   docs/performance.md). */
static int64_t fwd_lanes(int64_t Og) { return Og <= 8 ? 8 : 16; }

/* the staged rows of a band of nr output rows */
static int64_t stage_rows(const grp *p, int64_t nr) { return (nr - 1) * p->sh + (p->kh - 1) * p->dh + 1; }

/* copy the input rows of output rows [r0, r0 + nr) of image n, channels of block b, into st
   (rows of Wst pixels of Cb floats, padding and missing channels zero) */
static void stage(const grp *p, const float *in, int64_t n, int64_t b, int64_t r0, int64_t nr,
                  float *st) {
   const int64_t Cb = p->Cb, Wst = p->Wst, rows = stage_rows(p, nr);
   const int64_t c0 = b * p->gpb * p->Cg;
   const int64_t cv = p->C - c0 < Cb ? p->C - c0 : Cb; /* valid channels of the block */
   const __mmask16 m = (__mmask16)(cv >= 16 ? 0xFFFF : (1u << cv) - 1);
   /* input columns [cl, ch) land in staged columns [cl + pw, ch + pw) (pw < 0: a phase of a
      strided backward data may start inside the image) */
   const int64_t cl = p->pw < 0 ? -p->pw : 0;
   int64_t ch = p->inW;
   if (ch > Wst - p->pw) ch = Wst - p->pw;
   const int64_t ncol = ch - cl, lead = cl + p->pw; /* lead: zero columns before them */
   for (int64_t s = 0; s < rows; s++) {
      float *d = st + s * Wst * Cb;
      const int64_t hi = r0 * p->sh - p->ph + s;
      if (hi < 0 || hi >= p->inH || ncol <= 0) {
         memset(d, 0, (size_t)(Wst * Cb) * sizeof(float));
         continue;
      }
      memset(d, 0, (size_t)(lead * Cb) * sizeof(float));
      const float *src = in + ((n * p->inH + hi) * p->inW + cl) * p->C + c0;
      float *dd = d + lead * Cb;
      if (Cb == 16) {
         for (int64_t c = 0; c < ncol; c++)
            _mm512_storeu_ps(dd + c * 16, _mm512_maskz_loadu_ps(m, src + c * p->C));
      } else if (Cb == 8) {
         for (int64_t c = 0; c < ncol; c++)
            _mm256_storeu_ps(dd + c * 8, _mm256_maskz_loadu_ps((__mmask8)m, src + c * p->C));
      } else {
         for (int64_t c = 0; c < ncol; c++) {
            for (int64_t k = 0; k < Cb; k += 16) {
               const int64_t left = cv - k;
               const __mmask16 mk = (__mmask16)(left >= 16 ? 0xFFFF : left <= 0 ? 0 : (1u << left) - 1);
               const int64_t nk = Cb - k < 16 ? Cb - k : 16;
               _mm512_mask_storeu_ps(dd + c * Cb + k, (__mmask16)((1u << nk) - 1),
                                     _mm512_maskz_loadu_ps(mk, src + c * p->C + k));
            }
         }
      }
      const int64_t tail = Wst - lead - ncol;
      if (tail > 0) memset(dd + ncol * Cb, 0, (size_t)(tail * Cb) * sizeof(float));
   }
}

/* ---------------------------------------------------------------------------------------------
 * forward micro-kernel: PB virtual pixels (pixel k at xp + k * ps) x one vector of 16 output
 * channels, over every tap (offsets toff) and the block's Cb input channels
 */
AI void fwd_body(const float *xp, int64_t ps, const float *wp, const int64_t *toff, int64_t taps,
                 int64_t Cb, float *acc, const int PB) {
   __m512 a[GR_PB];
#pragma GCC unroll 24
   for (int k = 0; k < PB; k++) a[k] = _mm512_setzero_ps();
   for (int64_t t = 0; t < taps; t++) {
      const float *x = xp + toff[t];
      for (int64_t c = 0; c < Cb; c++) {
         const __m512 w = _mm512_load_ps(wp);
         wp += 16;
#pragma GCC unroll 24
         for (int k = 0; k < PB; k++) a[k] = _mm512_fmadd_ps(_mm512_set1_ps(x[k * ps + c]), w, a[k]);
      }
   }
#pragma GCC unroll 24
   for (int k = 0; k < PB; k++) _mm512_store_ps(acc + 16 * k, a[k]);
}

/* the same with 8 lanes (ymm): PB pixels x one group of 8 outputs (or two of 4) */
AI void fwd_body8(const float *xp, int64_t ps, const float *wp, const int64_t *toff, int64_t taps,
                  int64_t Cb, float *acc, const int PB) {
   __m256 a[GR_PB];
#pragma GCC unroll 24
   for (int k = 0; k < PB; k++) a[k] = _mm256_setzero_ps();
   for (int64_t t = 0; t < taps; t++) {
      const float *x = xp + toff[t];
      for (int64_t c = 0; c < Cb; c++) {
         const __m256 w = _mm256_load_ps(wp);
         wp += 8;
#pragma GCC unroll 24
         for (int k = 0; k < PB; k++) a[k] = _mm256_fmadd_ps(_mm256_set1_ps(x[k * ps + c]), w, a[k]);
      }
   }
#pragma GCC unroll 24
   for (int k = 0; k < PB; k++) _mm256_store_ps(acc + 8 * k, a[k]);
}

typedef void (*gfwd_fn)(const float *, int64_t, const float *, const int64_t *, int64_t, int64_t,
                        float *);

/* three instantiations: 16 channels a staged pixel with stride 1 and 2 (constant offsets: every
   broadcast is an FMA's memory operand), and any */
#define GFWD_INST(PB)                                                                           \
   static void gf16s1_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,    \
                           int64_t taps, int64_t Cb, float *acc) {                              \
      (void)ps, (void)Cb;                                                                       \
      fwd_body(xp, 16, wp, toff, taps, 16, acc, PB);                                            \
   }                                                                                            \
   static void gf16s2_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,    \
                           int64_t taps, int64_t Cb, float *acc) {                              \
      (void)ps, (void)Cb;                                                                       \
      fwd_body(xp, 32, wp, toff, taps, 16, acc, PB);                                            \
   }                                                                                            \
   static void gfany_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,     \
                          int64_t taps, int64_t Cb, float *acc) {                               \
      fwd_body(xp, ps, wp, toff, taps, Cb, acc, PB);                                            \
   }                                                                                            \
   static void g8s1_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,      \
                         int64_t taps, int64_t Cb, float *acc) {                                \
      (void)ps, (void)Cb;                                                                       \
      fwd_body8(xp, 8, wp, toff, taps, 8, acc, PB);                                             \
   }                                                                                            \
   static void g8s2_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,      \
                         int64_t taps, int64_t Cb, float *acc) {                                \
      (void)ps, (void)Cb;                                                                       \
      fwd_body8(xp, 16, wp, toff, taps, 8, acc, PB);                                            \
   }                                                                                            \
   static void g8any_##PB(const float *xp, int64_t ps, const float *wp, const int64_t *toff,     \
                          int64_t taps, int64_t Cb, float *acc) {                               \
      fwd_body8(xp, ps, wp, toff, taps, Cb, acc, PB);                                           \
   }
GFWD_INST(1) GFWD_INST(2) GFWD_INST(3) GFWD_INST(4) GFWD_INST(5) GFWD_INST(6) GFWD_INST(7)
GFWD_INST(8) GFWD_INST(9) GFWD_INST(10) GFWD_INST(11) GFWD_INST(12) GFWD_INST(13) GFWD_INST(14)
GFWD_INST(15) GFWD_INST(16) GFWD_INST(17) GFWD_INST(18) GFWD_INST(19) GFWD_INST(20)
GFWD_INST(21) GFWD_INST(22) GFWD_INST(23) GFWD_INST(24)

#define GFWD_ROW(v)                                                                             \
   {0, v##_1, v##_2, v##_3, v##_4, v##_5, v##_6, v##_7, v##_8, v##_9, v##_10, v##_11, v##_12,    \
    v##_13, v##_14, v##_15, v##_16, v##_17, v##_18, v##_19, v##_20, v##_21, v##_22, v##_23,      \
    v##_24}
static const gfwd_fn gfwd_tab[6][GR_PB + 1] = {GFWD_ROW(gf16s1), GFWD_ROW(gf16s2), GFWD_ROW(gfany),
                                               GFWD_ROW(g8s1),   GFWD_ROW(g8s2),   GFWD_ROW(g8any)};

/* packed block-diagonal weights wpk[b][tap][c][L]: lane l of block b is output channel
   o = L b + l; input channel c of the block is channel (L b / Og) * Cg + c. tmap: NULL for a
   forward (tap t of w), else the problem is backward data (p's output channels are the
   forward's input channels) and tap t is the forward's tap tmap[t] (the flipped kernel, or a
   phase's taps): the weight of (o, t, c) is w[forward out = group * Og_f + c_local][tmap[t]]
   [o % Cg_f] with Cg_f = p->Og, Og_f = p->Cg. w is (O_f, ftaps, Cg_f). */
static void pack_w(const grp *p, const float *w, const int64_t *tmap, int64_t ftaps, float *wpk) {
   const int64_t taps = p->kh * p->kw, Cb = p->Cb, Cg = p->Cg, Og = p->Og, L = p->L;
   memset(wpk, 0, (size_t)(p->nblk * taps * Cb * L) * sizeof(float));
   for (int64_t o = 0; o < p->O; o++) {
      const int64_t b = o / L, l = o % L, grp_ = o / Og;
      const int64_t c0 = (grp_ - b * p->gpb) * Cg; /* the group's first channel in the block */
      for (int64_t t = 0; t < taps; t++) {
         float *d = wpk + ((b * taps + t) * Cb + c0) * L + l;
         if (!tmap) {
            const float *src = w + (o * taps + t) * Cg;
            for (int64_t cl = 0; cl < Cg; cl++) d[cl * L] = src[cl];
         } else {
            for (int64_t cl = 0; cl < Cg; cl++)
               d[cl * L] = w[((grp_ * Cg + cl) * ftaps + tmap[t]) * Og + o % Og];
         }
      }
   }
}

/* one output pixel's vector: sums + bias (+ residual), the activation, stored */
AI void fwd_store(const float *acc, __m512 bv, __mmask16 m, const float *res, int act, float *out,
                  int64_t o) {
   __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc), bv);
   if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + o));
   if (act) v = lm_act_ps(v, act);
   _mm512_mask_storeu_ps(out + o, m, v);
}

/* one unit of the forward: image n, block b, band of output rows from r0 */
static void fwd_unit(const grp *p, const float *in, const float *wpk, const int64_t *toff,
                     const float *bias, const float *res, int act, float *out, int64_t n,
                     int64_t b, int64_t r0, float *st, float *acc) {
   const int64_t nr = r0 + p->nr <= p->outH ? p->nr : p->outH - r0;
   stage(p, in, n, b, r0, nr, st);
   const int64_t taps = p->kh * p->kw, Cb = p->Cb, ps = p->sw * Cb;
   const int64_t L = p->L;
   const int var = (L == 8 ? 3 : 0) + (Cb == L && p->sw == 1 ? 0 : Cb == L && p->sw == 2 ? 1 : 2);
   const float *wb = wpk + b * taps * Cb * L;
   const int64_t oc0 = b * L, nvalid = p->O - oc0 < L ? p->O - oc0 : L;
   const __mmask16 m = (__mmask16)(nvalid >= 16 ? 0xFFFF : (1u << nvalid) - 1);
   const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + oc0) : _mm512_setzero_ps();
   /* the output of column 0 of a row; ps_o: floats from one column to the next */
   const int64_t row_o = p->ostep * p->oWf * p->O, ps_o = p->ostep * p->O;
   int64_t off = ((n * p->oHf + p->orh + p->ostep * r0) * p->oWf + p->orw) * p->O + oc0;
   if ((p->V - p->outW) * 4 > p->V) {
      /* strided: a virtual row is about sw times as long as the output row, and the flat run
         below would compute the columns it drops (half of them at stride 2); tile each row */
      const int64_t nb = ceil_div(p->outW, GR_PB), base = p->outW / nb, extra = p->outW % nb;
      for (int64_t rr = 0; rr < nr; rr++, off += row_o)
         for (int64_t blk = 0, q0 = 0; blk < nb; blk++) {
            const int64_t cnt = base + (blk < extra);
            gfwd_tab[var][cnt](st + (rr * p->V + q0) * ps, ps, wb, toff, taps, Cb, acc);
            for (int64_t k = 0; k < cnt; k++)
               fwd_store(acc + L * k, bv, m, res, act, out, off + (q0 + k) * ps_o);
            q0 += cnt;
         }
      return;
   }
   const int64_t total = (nr - 1) * p->V + p->outW; /* virtual pixels up to the last valid one */
   const int64_t nb = ceil_div(total, GR_PB), base = total / nb, extra = total % nb;
   int64_t P = 0, q = 0; /* virtual pixel P is column q of its row */
   for (int64_t blk = 0; blk < nb; blk++) {
      const int64_t cnt = base + (blk < extra);
      gfwd_tab[var][cnt](st + P * ps, ps, wb, toff, taps, Cb, acc);
      for (int64_t k = 0; k < cnt; k++, q++) {
         if (q == p->V) {
            q = 0;
            off += row_o;
         }
         if (q < p->outW) fwd_store(acc + L * k, bv, m, res, act, out, off + q * ps_o);
      }
      P += cnt;
   }
}

/* staging floats of one band */
static int64_t stage_floats(const grp *p) { return stage_rows(p, p->nr) * p->Wst * p->Cb + 16; }

static lm_status grp_forward(const grp *p, const float *in, const float *w, const int64_t *tmap,
                             int64_t ftaps, const float *bias, const float *res, int act,
                             float *out) {
   const int64_t taps = p->kh * p->kw;
   const size_t wbytes = (size_t)(p->nblk * taps * p->Cb * p->L) * sizeof(float);
   int64_t toff[64];
   if (taps > 64) return LM_ERR_INTERNAL; /* lm_conv_grp_usable takes up to 64 taps */
   for (int64_t i = 0; i < p->kh; i++)
      for (int64_t j = 0; j < p->kw; j++) toff[i * p->kw + j] = (i * p->dh * p->Wst + j * p->dw) * p->Cb;
   const double work = (double)p->N * p->outH * p->outW * p->O * p->Cb * taps;
   const int nthr = conv_threads(work);
   const int64_t units = p->N * p->nblk * p->nband;
   const size_t per_thread = (size_t)stage_floats(p) + GR_PB * 16 + 16;
   float *wpk = lm_alloc(wbytes);
   float *scratch = wpk ? lm_alloc((size_t)nthr * per_thread * sizeof(float)) : NULL;
   if (!scratch) {
      if (wpk) lm_free(wpk, wbytes);
      return LM_ERR_OOM;
   }
   pack_w(p, w, tmap, ftaps, wpk);
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *mine = scratch + (size_t)conv_thread_id() * per_thread;
      float *acc = (float *)(((uintptr_t)mine + 63) & ~(uintptr_t)63);
      float *st = acc + GR_PB * 16;
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t band = u % p->nband, b = (u / p->nband) % p->nblk,
                       n = u / (p->nband * p->nblk);
         fwd_unit(p, in, wpk, toff, bias, res, act, out, n, b, band * p->nr, st, acc);
      }
   }
   lm_free(scratch, (size_t)nthr * per_thread * sizeof(float));
   lm_free(wpk, wbytes);
   return LM_OK;
}

lm_status lm_conv_grp_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                      const float *bias, const float *res, int act, float *out) {
   grp p;
   grp_init(&p, g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->O, g->G, g->Cg, g->Og, g->kh, g->kw,
            g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, fwd_lanes(g->Og));
   return grp_forward(&p, x, w, NULL, g->kh * g->kw, bias, res, act, out);
}

/* the taps of a phase of a strided backward data along one axis: grad_x position rh + s*a
   takes grad_out position a + off_0 + u * d for u < *k, off_0 = (rh + p - i_u * dd) / s with
   the kernel taps i_u (decreasing) for which that divides. Returns off_0; *k = 0: none. */
static int64_t phase_taps(int64_t rh, int64_t s, int64_t p, int64_t kk, int64_t dd, int64_t *k,
                          int64_t *d, int64_t *taps) {
   int64_t n = 0, off0 = 0, prev = 0;
   *d = 1;
   for (int64_t i = kk - 1; i >= 0; i--) {
      const int64_t num = rh + p - i * dd;
      if (((num % s) + s) % s) continue;
      const int64_t off = (num - (((num % s) + s) % s)) / s;
      if (n == 0) off0 = off;
      else if (n == 1) *d = off - prev;
      taps[n++] = i;
      prev = off;
   }
   *k = n;
   return off0;
}

lm_status lm_conv_grp_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                       float *gx) {
   const int64_t ftaps = g->kh * g->kw;
   int64_t tmap[64];
   if (ftaps > 64) return LM_ERR_INTERNAL;
   if (g->sh == 1 && g->sw == 1) {
      /* the flipped kernel over grad_out, padding d * (k - 1) - p */
      grp p;
      grp_init(&p, g->N, g->Ho, g->Wo, g->O, g->H, g->W, g->C, g->G, g->Og, g->Cg, g->kh, g->kw,
               1, 1, g->dh * (g->kh - 1) - g->ph, g->dw * (g->kw - 1) - g->pw, g->dh, g->dw,
               fwd_lanes(g->Cg));
      for (int64_t t = 0; t < ftaps; t++) tmap[t] = ftaps - 1 - t;
      return grp_forward(&p, gout, w, tmap, ftaps, NULL, NULL, 0, gx);
   }
   /* (16 lanes for the phases: each is a forward of 1 to 4 taps, where staging and the
      epilogue weigh more than the products, and 8 lanes make twice the blocks; measured on a Zen
      4, 8x208x28x28 stride 2 grad_x 1.0 ms at 16 lanes, 1.3-1.45 at 8) */
   /* stride s: grad_x splits into sh x sw phases (rh + sh * a, rw + sw * b); inside one, every
      pixel takes the same taps at unit stride over grad_out, a forward with a smaller kernel (no
      zero-inserted work). A phase no tap reaches is zero. */
   for (int64_t rh = 0; rh < g->sh && rh < g->H; rh++)
      for (int64_t rw = 0; rw < g->sw && rw < g->W; rw++) {
         int64_t ku, kv, du, dv, ti[64], tj[64];
         const int64_t oi = phase_taps(rh, g->sh, g->ph, g->kh, g->dh, &ku, &du, ti);
         const int64_t oj = phase_taps(rw, g->sw, g->pw, g->kw, g->dw, &kv, &dv, tj);
         const int64_t Ha = ceil_div(g->H - rh, g->sh), Wb = ceil_div(g->W - rw, g->sw);
         if (ku == 0 || kv == 0) {
            for (int64_t n = 0; n < g->N; n++)
               for (int64_t a = 0; a < Ha; a++)
                  for (int64_t bq = 0; bq < Wb; bq++)
                     memset(gx + ((n * g->H + rh + g->sh * a) * g->W + rw + g->sw * bq) * g->C, 0,
                            (size_t)g->C * sizeof(float));
            continue;
         }
         grp p;
         grp_init(&p, g->N, g->Ho, g->Wo, g->O, Ha, Wb, g->C, g->G, g->Og, g->Cg, ku, kv, 1, 1,
                  -oi, -oj, du, dv, 16);
         p.oHf = g->H, p.oWf = g->W, p.orh = rh, p.orw = rw, p.ostep = g->sh;
         for (int64_t u = 0; u < ku; u++)
            for (int64_t v = 0; v < kv; v++) tmap[u * kv + v] = ti[u] * g->kw + tj[v];
         const lm_status st = grp_forward(&p, gout, w, tmap, ftaps, NULL, NULL, 0, gx);
         if (st != LM_OK) return st;
      }
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * backward weight: TT taps x CG vectors of sums over the pixels of one band; vector k of tap t
 * holds, in the lanes of group-in-vector m, the gradient of (o, t, k) for the block's outputs o
 */
AI void bww_body(const grp *p, const float *st, const float *gy, int64_t nr, int64_t n,
                 int64_t r0, __mmask16 m, const int64_t *toff, float *part, const int CG,
                 const int TT) {
   const int gpb = 16 / (int)p->Og;
   __mmask16 mm[4];
   for (int j = 0; j < 4; j++)
      mm[j] = (__mmask16)(j < gpb ? ((1u << p->Og) - 1) << (j * p->Og) : 0);
   __m512 a[6][16]; /* fixed sizes (a VLA lives in memory); TT * CG <= 24 used */
#pragma GCC unroll 6
   for (int t = 0; t < TT; t++)
#pragma GCC unroll 16
      for (int k = 0; k < CG; k++) a[t][k] = _mm512_load_ps(part + (t * CG + k) * 16);
   for (int64_t rr = 0; rr < nr; rr++) {
      const float *gp = gy + ((n * p->outH + r0 + rr) * p->outW) * p->O;
      const float *xr = st + rr * p->sh * p->Wst * p->Cb;
      for (int64_t q = 0; q < p->outW; q++) {
         const __m512 gv = _mm512_maskz_loadu_ps(m, gp + q * p->O);
         const float *xq = xr + q * p->sw * p->Cb;
#pragma GCC unroll 6
         for (int t = 0; t < TT; t++) {
            const float *xt = xq + toff[t];
            for (int j = 0; j < gpb; j++)
#pragma GCC unroll 16
               for (int k = 0; k < CG; k++)
                  a[t][k] = _mm512_mask3_fmadd_ps(gv, _mm512_set1_ps(xt[j * CG + k]), a[t][k], mm[j]);
         }
      }
   }
#pragma GCC unroll 6
   for (int t = 0; t < TT; t++)
#pragma GCC unroll 16
      for (int k = 0; k < CG; k++) _mm512_store_ps(part + (t * CG + k) * 16, a[t][k]);
}

/* backward weight where Cg == Og (RegNet, ResNeXt): the lanes of a vector are the block's 16
   input channels (lane j: group j / Cg, channel j % Cg), so every lane of every FMA is useful.
   Sums vector (l, t) holds, in lane j, the gradient of output (j / Cg) * Og + l, tap t, channel
   j % Cg: the staged input pixel times grad_out with output l of each group spread over its
   group's lanes (one permute a pixel and output, shared by the taps). OP outputs and TT taps a
   pass (OP * TT <= 24 sums in registers); lanes of missing channels stage as zeros. The same
   products summed in the same order as bww_body: the same bits. */
AI void bwe_body(const grp *p, const float *st, const float *gy, int64_t nr, int64_t n,
                 int64_t r0, __mmask16 m, const int64_t *toff, const int32_t *spread,
                 float *part, const int OP, const int TT) {
   const int64_t taps = p->kh * p->kw;
   __m512i idx[4]; /* fixed sizes: an array sized by OP or TT is a VLA, kept in memory */
   for (int l = 0; l < OP; l++) idx[l] = _mm512_loadu_si512(spread + 16 * l);
   __m512 a[4][12];
#pragma GCC unroll 4
   for (int l = 0; l < OP; l++)
#pragma GCC unroll 12
      for (int t = 0; t < TT; t++) a[l][t] = _mm512_load_ps(part + (l * taps + t) * 16);
   for (int64_t rr = 0; rr < nr; rr++) {
      const float *gp = gy + ((n * p->outH + r0 + rr) * p->outW) * p->O;
      const float *xr = st + rr * p->sh * p->Wst * 16;
      for (int64_t q = 0; q < p->outW; q++) {
         const __m512 gv = _mm512_maskz_loadu_ps(m, gp + q * p->O);
         const float *xq = xr + q * p->sw * 16;
         __m512 gl[4];
#pragma GCC unroll 4
         for (int l = 0; l < OP; l++) gl[l] = _mm512_permutexvar_ps(idx[l], gv);
#pragma GCC unroll 12
         for (int t = 0; t < TT; t++) {
            const __m512 xv = _mm512_load_ps(xq + toff[t]);
#pragma GCC unroll 4
            for (int l = 0; l < OP; l++) a[l][t] = _mm512_fmadd_ps(gl[l], xv, a[l][t]);
         }
      }
   }
#pragma GCC unroll 4
   for (int l = 0; l < OP; l++)
#pragma GCC unroll 12
      for (int t = 0; t < TT; t++) _mm512_store_ps(part + (l * taps + t) * 16, a[l][t]);
}

typedef void (*gbwe_fn)(const grp *, const float *, const float *, int64_t, int64_t, int64_t,
                        __mmask16, const int64_t *, const int32_t *, float *);
#define GBWE_INST(TT)                                                                           \
   static void gbe_##TT(const grp *p, const float *st, const float *gy, int64_t nr, int64_t n,   \
                        int64_t r0, __mmask16 m, const int64_t *toff, const int32_t *spread,    \
                        float *part) {                                                          \
      bwe_body(p, st, gy, nr, n, r0, m, toff, spread, part, 2, TT);                             \
   }
GBWE_INST(1) GBWE_INST(2) GBWE_INST(3) GBWE_INST(4) GBWE_INST(5) GBWE_INST(6) GBWE_INST(7)
GBWE_INST(8) GBWE_INST(9) GBWE_INST(10) GBWE_INST(11) GBWE_INST(12)
enum { GBWE_TT = 12 };
static const gbwe_fn gbwe_tab[GBWE_TT + 1] = {0,       gbe_1,  gbe_2,  gbe_3, gbe_4,
                                              gbe_5,   gbe_6,  gbe_7,  gbe_8, gbe_9,
                                              gbe_10,  gbe_11, gbe_12};

typedef void (*gbww_fn)(const grp *, const float *, const float *, int64_t, int64_t, int64_t,
                        __mmask16, const int64_t *, float *);
#define GBWW_INST(CG, TT)                                                                       \
   static void gbw_##CG##_##TT(const grp *p, const float *st, const float *gy, int64_t nr,       \
                               int64_t n, int64_t r0, __mmask16 m, const int64_t *toff,          \
                               float *part) {                                                   \
      bww_body(p, st, gy, nr, n, r0, m, toff, part, CG, TT);                                    \
   }
GBWW_INST(4, 1) GBWW_INST(4, 2) GBWW_INST(4, 3) GBWW_INST(4, 4) GBWW_INST(4, 5) GBWW_INST(4, 6)
GBWW_INST(8, 1) GBWW_INST(8, 2) GBWW_INST(8, 3)
GBWW_INST(16, 1)
/* taps a pass for Cg 4, 8, 16 (TT * Cg <= 24 sums in registers) */
static const gbww_fn gbww_tab[3][7] = {
   {0, gbw_4_1, gbw_4_2, gbw_4_3, gbw_4_4, gbw_4_5, gbw_4_6},
   {0, gbw_8_1, gbw_8_2, gbw_8_3, 0, 0, 0},
   {0, gbw_16_1, 0, 0, 0, 0, 0},
};

lm_status lm_conv_grp_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                       float *gw, float *gb) {
   grp p;
   grp_init(&p, g->N, g->H, g->W, g->C, g->Ho, g->Wo, g->O, g->G, g->Cg, g->Og, g->kh, g->kw,
            g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, 16);
   const int64_t taps = p.kh * p.kw, Cg = p.Cg;
   if (taps > 64) return LM_ERR_INTERNAL;
   int64_t toff[64];
   for (int64_t i = 0; i < p.kh; i++)
      for (int64_t j = 0; j < p.kw; j++) toff[i * p.kw + j] = (i * p.dh * p.Wst + j * p.dw) * p.Cb;
   const int ci = Cg == 4 ? 0 : Cg == 8 ? 1 : 2;
   const int tmax = Cg == 4 ? 6 : Cg == 8 ? 3 : 1;
   /* bwe_body where it saves work (Cg 4, 8: bww_body's masked FMAs use 1 / gpb of their lanes);
      its sums are [Og][taps][16] */
   const int even = Cg == p.Og && Cg < 16;
   int32_t spread[16 * 16]; /* bwe_body's permutes: output l of each group over its lanes */
   for (int64_t l = 0; l < p.Og; l++)
      for (int64_t j = 0; j < 16; j++) spread[l * 16 + j] = (int32_t)((j / Cg) * p.Og + l);
   /* items: (block, slice of the images), at least 16 where the images allow; each has its sums
      [taps][Cg][16] and bias sums [16] */
   int64_t nsl = ceil_div(16, p.nblk);
   if (nsl > p.N) nsl = p.N;
   if (nsl < 1) nsl = 1;
   const int64_t items = p.nblk * nsl, item_f = taps * Cg * 16 + 16;
   const size_t stage_f = (size_t)((stage_floats(&p) + 31) / 16 * 16);
   const double work = (double)p.N * p.outH * p.outW * p.O * p.Cb * taps;
   const int nthr = conv_threads(work);
   const size_t bytes = ((size_t)(items * item_f) + (size_t)nthr * stage_f + 16) * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
   float *sums = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
   float *stages = sums + items * item_f;
   memset(sums, 0, (size_t)(items * item_f) * sizeof(float));
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *st = stages + (size_t)conv_thread_id() * stage_f;
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < items; it++) {
         const int64_t b = it / nsl, sl = it % nsl;
         float *part = sums + it * item_f, *bpart = part + taps * Cg * 16;
         const int64_t nvalid = p.O - b * 16 < 16 ? p.O - b * 16 : 16;
         const __mmask16 m = (__mmask16)(nvalid >= 16 ? 0xFFFF : (1u << nvalid) - 1);
         __m512 bs = _mm512_setzero_ps();
         for (int64_t n = sl * p.N / nsl; n < (sl + 1) * p.N / nsl; n++)
            for (int64_t band = 0; band < p.nband; band++) {
               const int64_t r0 = band * p.nr, nr = r0 + p.nr <= p.outH ? p.nr : p.outH - r0;
               if (gw) stage(&p, x, n, b, r0, nr, st);
               if (gw && even) {
                  /* taps in equal chunks of at most GBWE_TT, outputs two at a time */
                  const int64_t nch = ceil_div(taps, GBWE_TT);
                  for (int64_t c = 0; c < nch; c++) {
                     const int64_t t0 = c * taps / nch, t1 = (c + 1) * taps / nch;
                     for (int64_t l0 = 0; l0 < p.Og; l0 += 2)
                        gbwe_tab[t1 - t0](&p, st, gout + b * 16, nr, n, r0, m, toff + t0,
                                          spread + l0 * 16, part + (l0 * taps + t0) * 16);
                  }
               } else if (gw) {
                  for (int64_t t0 = 0; t0 < taps; t0 += tmax) {
                     const int tt = (int)(taps - t0 < tmax ? taps - t0 : tmax);
                     gbww_tab[ci][tt](&p, st, gout + b * 16, nr, n, r0, m, toff + t0,
                                      part + t0 * Cg * 16);
                  }
               }
               if (gb)
                  for (int64_t rr = 0; rr < nr; rr++) {
                     const float *gp = gout + ((n * p.outH + r0 + rr) * p.outW) * p.O + b * 16;
                     for (int64_t q = 0; q < p.outW; q++)
                        bs = _mm512_add_ps(bs, _mm512_maskz_loadu_ps(m, gp + q * p.O));
                  }
            }
         _mm512_store_ps(bpart, bs);
      }
   }
   /* each block's slices in slice order, into (O, taps, Cg) and (O) */
   for (int64_t b = 0; b < p.nblk; b++) {
      float *first = sums + b * nsl * item_f;
      for (int64_t sl = 1; sl < nsl; sl++)
         for (int64_t i = 0; i < item_f; i++) first[i] += first[sl * item_f + i];
      for (int64_t l = 0; l < 16 && b * 16 + l < p.O; l++) {
         const int64_t o = b * 16 + l;
         if (gw && even)
            for (int64_t t = 0; t < taps; t++)
               for (int64_t k = 0; k < Cg; k++)
                  gw[(o * taps + t) * Cg + k] =
                     first[((l % p.Og) * taps + t) * 16 + (l / p.Og) * Cg + k];
         else if (gw)
            for (int64_t t = 0; t < taps; t++)
               for (int64_t k = 0; k < Cg; k++)
                  gw[(o * taps + t) * Cg + k] = first[(t * Cg + k) * 16 + l];
         if (gb) gb[o] = first[taps * Cg * 16 + l];
      }
   }
   lm_free(scratch, bytes);
   return LM_OK;
}
