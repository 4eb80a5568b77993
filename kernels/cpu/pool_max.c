/* pool_max.c -- max_pool2d and adaptive_max_pool2d on the CPU, forward and backward (with the
 * indices, or the uint8 tap numbers of lm_max_pool2d_taps): the portable kernels, instantiated for
 * float and double (bfloat16 channels-last too) and compiled a second time for AVX-512, and the
 * drivers that choose among them and the AVX-512 float kernels of pool_nhwc_v512.c.
 *
 * Max pooling follows PyTorch exactly: the taps of a window are scanned row by row, a value wins
 * when it is greater than the current maximum or NaN (so the last NaN wins), ties keep the first
 * position, and an all -inf window keeps the index of its first tap. A window that holds no input
 * element at all (possible only with dilation and a large padding) gives -inf and index -1, and
 * the backward skips -1; any other index outside the plane is an error, never a stray write.
 */
#include "pool2d.h"

#include <math.h>
#include <stdio.h>

/* the loads and stores of the NHWC max kernels: as they are for float / double; bfloat16 values
   widened to float (exact), a maximum stored back by truncation (exact: it is one of the inputs,
   or -inf), a sum of gradients rounded once to nearest even (lm_f2bf) */
#define POOL_ID(v) (v)
static inline float pool_bf2f(uint16_t h) {
   union { uint32_t u; float f; } c = {(uint32_t)h << 16};
   return c.f;
}
static inline uint16_t pool_f2bf_exact(float f) {
   union { float f; uint32_t u; } c = {f};
   return (uint16_t)(c.u >> 16);
}

/* ------------------------------------------------------------------------------------------ */
/* kernels, instantiated for float and double                                                 */

/* max over each window; NaN wins (the last NaN), ties keep the first position (PyTorch).
   IT is the type of the scratch index in the NHWC kernel (int32 keeps float lanes aligned). */
#define DEFINE_MAX_FWD_NCHW(T, S)                                                                  \
   static void max_fwd_nchw_##S(const T *in, T *out, int64_t *ind, const pool_t *p) {              \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, dh = p->dh, dw = p->dw;            \
      const int64_t rows = p->N * p->C * OH;                                                       \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         T *op = out + r * OW;                                                                     \
         int64_t *xp = ind ? ind + r * OW : NULL;                                                  \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         for (int64_t ow = 0; ow < OW; ow++) {                                                     \
            const int64_t w0 = p->ws[ow], w1 = p->we[ow];                                          \
            T mx = (T)-INFINITY;                                                                   \
            int64_t mi = (h0 < h1 && w0 < w1) ? h0 * W + w0 : -1;                                  \
            for (int64_t ih = h0; ih < h1; ih += dh) {                                             \
               const T *row = ip + ih * W;                                                         \
               for (int64_t iw = w0; iw < w1; iw += dw) {                                          \
                  const T v = row[iw];                                                             \
                  const int take = (v > mx) | (v != v);                                            \
                  mx = take ? v : mx;                                                              \
                  mi = take ? ih * W + iw : mi;                                                    \
               }                                                                                   \
            }                                                                                      \
            op[ow] = mx;                                                                           \
            if (xp) xp[ow] = mi;                                                                   \
         }                                                                                         \
      }                                                                                            \
   }
/* D: the stored type, read with LD into T and written with STO (POOL_ID for float / double) */
#define DEFINE_MAX_FWD_NHWC_X(T, D, LD, STO, IT, S, ATTR)                                          \
   ATTR static void max_fwd_nhwc_##S(const D *in, D *out, int64_t *ind, uint8_t *cd,               \
                                     const pool_t *p) {                                            \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, dh = p->dh,              \
                    dw = p->dw;                                                                    \
      /* the id of a tap: its flat input index, or its tap number when codes are wanted */         \
      const int64_t sw_ = cd ? 1 : dw, sh_ = cd ? p->kw : dh * W;                                  \
      const int64_t pix = p->N * OH * OW;                                                          \
      _Pragma("omp parallel for schedule(static) if (pix * C * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t q = 0; q < pix; q++) {                                                          \
         const int64_t ow = q % OW, oh = (q / OW) % OH, n = q / (OW * OH);                         \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh], w0 = p->ws[ow], w1 = p->we[ow];             \
         const D *ib = in + n * H * W * C;                                                         \
         D *op = out + q * C;                                                                      \
         int64_t *xp = ind ? ind + q * C : NULL;                                                   \
         const IT id0 = cd ? (IT)(p->hz[oh] * p->kw + p->wz[ow]) : (IT)(h0 * W + w0);              \
         const IT first = (h0 < h1 && w0 < w1) ? id0 : cd ? (IT)255 : (IT)-1;                      \
         for (int64_t c0 = 0; c0 < C; c0 += CBLK) {                                                \
            const int64_t cn = min64(CBLK, C - c0);                                                \
            T mx[CBLK];                                                                            \
            IT li[CBLK];                                                                           \
            for (int64_t c = 0; c < cn; c++) {                                                     \
               mx[c] = (T)-INFINITY;                                                               \
               li[c] = first;                                                                      \
            }                                                                                      \
            IT rid = id0;                                                                          \
            for (int64_t ih = h0; ih < h1; ih += dh, rid += (IT)sh_) {                             \
               IT id = rid;                                                                        \
               for (int64_t iw = w0; iw < w1; iw += dw, id += (IT)sw_) {                           \
                  const D *src = ib + (ih * W + iw) * C + c0;                                      \
                  for (int64_t c = 0; c < cn; c++) {                                               \
                     T v = LD(src[c]);                                                             \
                     int take = (v > mx[c]) | (v != v);                                            \
                     mx[c] = take ? v : mx[c];                                                     \
                     li[c] = take ? id : li[c];                                                    \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            for (int64_t c = 0; c < cn; c++) op[c0 + c] = STO(mx[c]);                              \
            if (xp)                                                                                \
               for (int64_t c = 0; c < cn; c++) xp[c0 + c] = li[c];                                \
            if (cd)                                                                                \
               for (int64_t c = 0; c < cn; c++) cd[q * C + c0 + c] = (uint8_t)li[c];               \
         }                                                                                         \
      }                                                                                            \
   }

#define DEFINE_MAX_FWD_NHWC(T, IT, S, ATTR) DEFINE_MAX_FWD_NHWC_X(T, T, POOL_ID, POOL_ID, IT, S, ATTR)

DEFINE_MAX_FWD_NCHW(float, f32)
DEFINE_MAX_FWD_NCHW(double, f64)
/* bfloat16 channels-last (the ResNet stem's pool in a bf16 training step): the 16-bit values
   read and written directly, compared as floats */
DEFINE_MAX_FWD_NHWC_X(float, uint16_t, pool_bf2f, pool_f2bf_exact, int32_t, bf16, )
DEFINE_MAX_FWD_NHWC_X(float, uint16_t, pool_bf2f, pool_f2bf_exact, int32_t, bf16_512,
                      LM_AVX512_FN)
DEFINE_MAX_FWD_NHWC(float, int32_t, f32, )
DEFINE_MAX_FWD_NHWC(float, int64_t, f32l, )
DEFINE_MAX_FWD_NHWC(double, int64_t, f64, )
DEFINE_MAX_FWD_NHWC(float, int32_t, f32_512, LM_AVX512_FN)
DEFINE_MAX_FWD_NHWC(double, int64_t, f64_512, LM_AVX512_FN)

/* regular (non-adaptive) windows on NCHW planes, vectorized along the output row: for each
   window row ih and tap j, one pass over the output columns whose tap lies inside the input.
   Per output the taps are visited in the same order as the plain loop (ih, then iw ascending),
   so ties and NaNs resolve exactly as PyTorch. */
#define DEFINE_MAX_REG_NCHW(T, S, ATTR)                                                            \
   ATTR static void max_reg_nchw_##S(const T *in, T *out, int64_t *ind, uint8_t *cd,               \
                                     const pool_t *p) {                                            \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, sw = p->sw;                        \
      const int64_t rows = p->N * p->C * OH;                                                       \
      _Pragma("omp parallel for schedule(static) if (rows * OW * p->kh * p->kw > LM_PARALLEL_GRAIN)") \
      for (int64_t r = 0; r < rows; r++) {                                                         \
         const int64_t oh = r % OH;                                                                \
         const T *ip = in + (r / OH) * H * W;                                                      \
         const int64_t h0 = p->hs[oh], h1 = p->he[oh];                                             \
         for (int64_t b0 = 0; b0 < OW; b0 += OWBLK) {                                              \
            const int64_t bn = min64(OWBLK, OW - b0);                                              \
            T mx[OWBLK];                                                                           \
            int64_t mi[OWBLK];                                                                     \
            for (int64_t o = 0; o < bn; o++) {                                                     \
               const int64_t w0 = p->ws[b0 + o], w1 = p->we[b0 + o];                               \
               mx[o] = (T)-INFINITY;                                                               \
               if (cd)                                                                             \
                  mi[o] = (h0 < h1 && w0 < w1) ? p->hz[oh] * p->kw + p->wz[b0 + o] : 255;          \
               else                                                                                \
                  mi[o] = (h0 < h1 && w0 < w1) ? h0 * W + w0 : -1;                                 \
            }                                                                                      \
            int64_t rid = p->hz[oh] * p->kw; /* tap number of (row ih, column 0) */                \
            for (int64_t ih = h0; ih < h1; ih += p->dh, rid += p->kw) {                            \
               const T *row = ip + ih * W;                                                         \
               for (int64_t j = 0; j < p->kw; j++) {                                               \
                  int64_t a, b;                                                                    \
                  tap_range(p, j, &a, &b);                                                         \
                  a = a > b0 ? a - b0 : 0;                                                         \
                  b = b - b0 < bn ? b - b0 : bn;                                                   \
                  const int64_t off = (b0 * sw) + j * p->dw - p->pw;                               \
                  if (cd) {                                                                        \
                     const int64_t id = rid + j;                                                   \
                     for (int64_t o = a; o < b; o++) {                                             \
                        const T v = row[o * sw + off];                                             \
                        const int take = (v > mx[o]) | (v != v);                                   \
                        mx[o] = take ? v : mx[o];                                                  \
                        mi[o] = take ? id : mi[o];                                                 \
                     }                                                                             \
                     continue;                                                                     \
                  }                                                                                \
                  for (int64_t o = a; o < b; o++) {                                               \
                     const int64_t iw = o * sw + off;                                              \
                     const T v = row[iw];                                                          \
                     const int take = (v > mx[o]) | (v != v);                                      \
                     mx[o] = take ? v : mx[o];                                                     \
                     mi[o] = take ? ih * W + iw : mi[o];                                           \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            T *op = out + r * OW + b0;                                                             \
            for (int64_t o = 0; o < bn; o++) op[o] = mx[o];                                        \
            if (ind) {                                                                             \
               int64_t *xp = ind + r * OW + b0;                                                    \
               for (int64_t o = 0; o < bn; o++) xp[o] = mi[o];                                     \
            }                                                                                      \
            if (cd) {                                                                              \
               uint8_t *cp = cd + r * OW + b0;                                                     \
               for (int64_t o = 0; o < bn; o++) cp[o] = (uint8_t)mi[o];                            \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }

DEFINE_MAX_REG_NCHW(float, f32, )
DEFINE_MAX_REG_NCHW(double, f64, )
DEFINE_MAX_REG_NCHW(float, f32_512, LM_AVX512_FN)
DEFINE_MAX_REG_NCHW(double, f64_512, LM_AVX512_FN)

/* grad_in[plane][ind] += grad_out; indices -1 (empty windows) are skipped, others must lie in
   the plane. Returns the number of bad indices. */
#define DEFINE_MAX_BWD(T, S)                                                                       \
   static int64_t max_bwd_nchw_##S(const T *go, const int64_t *ind, T *gi, const pool_t *p) {      \
      const int64_t HW = p->H * p->W, OHW = p->OH * p->OW, planes = p->N * p->C;                   \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (planes * (HW + OHW) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *g = gi + pl * HW;                                                                      \
         const T *o = go + pl * OHW;                                                               \
         const int64_t *x = ind + pl * OHW;                                                        \
         memset(g, 0, (size_t)HW * sizeof(T));                                                     \
         for (int64_t i = 0; i < OHW; i++) {                                                       \
            int64_t k = x[i];                                                                      \
            if ((uint64_t)k < (uint64_t)HW)                                                        \
               g[k] += o[i];                                                                       \
            else if (k != -1)                                                                      \
               bad++;                                                                              \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }                                                                                               \
   static int64_t max_bwd_nhwc_##S(const T *go, const int64_t *ind, T *gi, const pool_t *p) {      \
      const int64_t HW = p->H * p->W, OHW = p->OH * p->OW, C = p->C;                               \
      const int64_t cb = pool_cblock(p->N, C), nb = (C + cb - 1) / cb;                          \
      const int64_t tasks = p->N * nb;                                                             \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (tasks > 1 && p->N * C * (HW + OHW) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t n = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         T *g = gi + n * HW * C + c0;                                                              \
         const T *o = go + n * OHW * C + c0;                                                       \
         const int64_t *x = ind + n * OHW * C + c0;                                                \
         if (cn == C)                                                                              \
            memset(g, 0, (size_t)(HW * C) * sizeof(T));                                            \
         else                                                                                      \
            for (int64_t i = 0; i < HW; i++) memset(g + i * C, 0, (size_t)cn * sizeof(T));         \
         for (int64_t i = 0; i < OHW; i++) {                                                       \
            const T *oi = o + i * C;                                                               \
            const int64_t *xi = x + i * C;                                                         \
            for (int64_t c = 0; c < cn; c++) {                                                     \
               int64_t k = xi[c];                                                                  \
               if ((uint64_t)k < (uint64_t)HW)                                                     \
                  g[k * C + c] += oi[c];                                                           \
               else if (k != -1)                                                                   \
                  bad++;                                                                           \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }

DEFINE_MAX_BWD(float, f32)
DEFINE_MAX_BWD(double, f64)

/* grad_in of max_pool2d from tap numbers (lm_max_pool2d_taps), contiguous: the scatter of
   max_bwd_nchw_* with the input index of each window's tap. off[code]: the tap's offset from the
   window's first tap (di / dj: its row / column offset); in a window with all its taps inside the
   plane any number below kh * kw is good, in the others the tap is checked. 255 (an empty window)
   is skipped; another number that names no tap inside the plane is counted. full[oh] / full[OH +
   ow]: whether the window row / column has all its taps inside. */
#define DEFINE_MAX_BWD_TAPS(T, S)                                                                  \
   static int64_t max_bwd_taps_nchw_##S(const T *go, const uint8_t *cd, T *gi, const pool_t *p,    \
                                        const int64_t *di, const int64_t *dj, const int64_t *off,  \
                                        const uint8_t *full) {                                     \
      const int64_t H = p->H, W = p->W, OH = p->OH, OW = p->OW, planes = p->N * p->C;             \
      const int64_t ntaps = p->kh * p->kw;                                                         \
      int64_t bad = 0;                                                                             \
      _Pragma("omp parallel for schedule(static) reduction(+ : bad) if (planes * (H * W + OH * OW) > LM_PARALLEL_GRAIN)") \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         T *g = gi + pl * H * W;                                                                   \
         const T *o = go + pl * OH * OW;                                                           \
         const uint8_t *t = cd + pl * OH * OW;                                                     \
         memset(g, 0, (size_t)(H * W) * sizeof(T));                                                \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            const int64_t hst = oh * p->sh - p->ph;                                                \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t i = oh * OW + ow, code = t[i], wst = ow * p->sw - p->pw;              \
               if (code == 255) continue;                                                          \
               if (full[oh] & full[OH + ow]) {                                                     \
                  if (code < ntaps)                                                                \
                     g[hst * W + wst + off[code]] += o[i];                                         \
                  else                                                                             \
                     bad++;                                                                        \
                  continue;                                                                        \
               }                                                                                   \
               const int64_t ih = hst + di[code], iw = wst + dj[code];                             \
               if (code < ntaps && (uint64_t)ih < (uint64_t)H && (uint64_t)iw < (uint64_t)W)       \
                  g[ih * W + iw] += o[i];                                                          \
               else                                                                                \
                  bad++;                                                                           \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      return bad;                                                                                  \
   }

DEFINE_MAX_BWD_TAPS(float, f32)
DEFINE_MAX_BWD_TAPS(double, f64)
DEFINE_TAPS_BAD_ROW(base, )
/* noinline: called from one kernel in each of pool_max.c and pool_nhwc_v512.c, as it was compiled
   when one file held both callers */
DEFINE_TAPS_BAD_ROW(512, LM_AVX512_FN __attribute__((noinline)))

/* max_pool2d backward as a gather (channels-last), given the window geometry: every input pixel
   is written once, as 0 plus grad_out of the windows that have it as a tap and whose index (ind,
   int64) or tap number (cd, bytes) names it, in (oh, ow) order -- the additions, in the same
   order, of max_bwd_nhwc_*'s scatter into a zeroed grad_input, without the zero fill and the
   read-modify-writes. Adding 0 where the index does not match leaves the sum as it is (it starts
   at +0, so it is never -0). Threads take input rows (n, ih), and blocks of channels when there
   are few rows; each output row is checked by one of them (owner_row).
   Returns the number of entries that are neither -1 / 255 nor a tap of their window inside the
   plane. Tap numbers are checked directly (taps_bad_row); for indices, the ones that are set are
   counted, and each valid one matches exactly one pixel: the difference is the rest. */
#define DEFINE_MAX_GATHER_X(T, D, LD, STO, S, ATTR)                                                \
   ATTR static int64_t max_gather_nhwc_##S(const D *go, const int64_t *ind, const uint8_t *cd,     \
                                           D *gi, const pool_t *p, const taps_t *tl) {             \
      const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * H;         \
      const int64_t kw = p->kw;                                                                    \
      const int64_t cb = pool_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;       \
      int64_t nbad = 0;                                                                            \
      _Pragma("omp parallel for schedule(static) reduction(+ : nbad) if (tasks > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)") \
      for (int64_t t = 0; t < tasks; t++) {                                                        \
         const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);                     \
         const int64_t ih = r % H, n = r / H;                                                      \
         const int64_t a0 = tl->rptr[ih], a1 = tl->rptr[ih + 1];                                   \
         const int64_t nofs = n * OH * OW * C + c0;                                                \
         const D *gn = go + nofs;                                                                  \
         D *g = gi + r * W * C + c0;                                                               \
         int64_t lbad = 0;                                                                         \
         for (int64_t oh = 0; oh < OH; oh++) {                                                     \
            if (owner_row(p, oh) != ih) continue;                                                  \
            if (cd) {                                                                              \
               lbad += TAPS_BAD_ROW(p, tl, cd + nofs, oh, cn);                                     \
               continue;                                                                           \
            }                                                                                      \
            for (int64_t ow = 0; ow < OW; ow++) {                                                  \
               const int64_t *x = ind + nofs + (oh * OW + ow) * C;                                 \
               for (int64_t c = 0; c < cn; c++) lbad += x[c] != -1;                                \
            }                                                                                      \
         }                                                                                         \
         for (int64_t iw = 0; iw < W; iw++) {                                                      \
            const int64_t pix = ih * W + iw, b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];             \
            for (int64_t cc = 0; cc < cn; cc += CBLK) {                                            \
               const int64_t cm = min64(CBLK, cn - cc);                                            \
               T acc[CBLK];                                                                        \
               int64_t m = 0;                                                                      \
               for (int64_t c = 0; c < cm; c++) acc[c] = 0;                                        \
               for (int64_t a = a0; a < a1; a++)                                                   \
                  for (int64_t b = b0; b < b1; b++) {                                              \
                     const int64_t off = (tl->rwin[a] * OW + tl->cwin[b]) * C + cc;                \
                     const D *o = gn + off;                                                        \
                     if (cd) {                                                                     \
                        const uint8_t *x = cd + nofs + off;                                        \
                        const uint8_t code = (uint8_t)(tl->rtap[a] * kw + tl->ctap[b]);            \
                        for (int64_t c = 0; c < cm; c++)                                           \
                           acc[c] += x[c] == code ? LD(o[c]) : (T)0;                               \
                     } else {                                                                      \
                        const int64_t *x = ind + nofs + off;                                       \
                        for (int64_t c = 0; c < cm; c++) {                                         \
                           const int64_t e = x[c] == pix;                                          \
                           acc[c] += e ? LD(o[c]) : (T)0;                                          \
                           m += e;                                                                 \
                        }                                                                          \
                     }                                                                             \
                  }                                                                                \
               D *dst = g + iw * C + cc;                                                           \
               for (int64_t c = 0; c < cm; c++) dst[c] = STO(acc[c]);                              \
               lbad -= m;                                                                          \
            }                                                                                      \
         }                                                                                         \
         nbad += lbad;                                                                             \
      }                                                                                            \
      return nbad;                                                                                 \
   }

#define DEFINE_MAX_GATHER(T, S, ATTR) DEFINE_MAX_GATHER_X(T, T, POOL_ID, POOL_ID, S, ATTR)
/* bfloat16: the gradients summed in float, each sum rounded once (lm_f2bf) */
#define TAPS_BAD_ROW taps_bad_row_base
DEFINE_MAX_GATHER(float, f32, )
DEFINE_MAX_GATHER(double, f64, )
DEFINE_MAX_GATHER_X(float, uint16_t, pool_bf2f, lm_f2bf, bf16, )
#undef TAPS_BAD_ROW
#define TAPS_BAD_ROW taps_bad_row_512
DEFINE_MAX_GATHER(float, f32_512, LM_AVX512_FN)
DEFINE_MAX_GATHER(double, f64_512, LM_AVX512_FN)
#undef TAPS_BAD_ROW
/* ------------------------------------------------------------------------------------------ */
/* drivers                                                                                    */

/* LM_OP_MAX_POOL2D, LM_OP_ADAPTIVE_MAX_POOL2D: t = {x, out, indices or NULL};
   LM_OP_MAX_POOL2D_TAPS: t = {x, out, taps} (the tap numbers instead of the indices) */
lm_status lm_pool2d_max_forward(const lm_op *op, int v512) {
   const lm_tensor *xd = op->t[0], *ot = op->t[1], *it = op->t[2];
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS;
   pool_t pp, *p = &pp;
   pool_from_params(p, op->params, op->kind == LM_OP_ADAPTIVE_MAX_POOL2D ? KIND_AMAX : KIND_MAX);
   LM_TRY(pool_windows(p));
   const void *in = lm_tensor_data(xd);
   void *o = lm_tensor_data(ot);
   int64_t *ix = it && !codes ? (int64_t *)lm_tensor_data(it) : NULL;
   uint8_t *cd = it && codes ? (uint8_t *)lm_tensor_data(it) : NULL;
   if (p->mf == LM_CHANNELS_LAST) {
      if (xd->dtype == LM_BFLOAT16) /* the front end sends H * W < INT32_MAX only */
         (v512 ? max_fwd_nhwc_bf16_512 : max_fwd_nhwc_bf16)(in, o, ix, cd, p);
      else if (xd->dtype == LM_FLOAT64)
         (v512 ? max_fwd_nhwc_f64_512 : max_fwd_nhwc_f64)(in, o, ix, cd, p);
#ifdef POOL_X86
      else if (v512 && p->H * p->W < INT32_MAX)
         lm_pool2d_max_fwd_nhwc_v512(in, o, ix, cd, p);
#endif
      else if (p->H * p->W < INT32_MAX)
         (v512 ? max_fwd_nhwc_f32_512 : max_fwd_nhwc_f32)(in, o, ix, cd, p);
      else
         max_fwd_nhwc_f32l(in, o, ix, cd, p);
   } else if (p->kind == KIND_MAX) {
      if (xd->dtype == LM_FLOAT64)
         (v512 ? max_reg_nchw_f64_512 : max_reg_nchw_f64)(in, o, ix, cd, p);
      else
         (v512 ? max_reg_nchw_f32_512 : max_reg_nchw_f32)(in, o, ix, cd, p);
   } else {
      if (xd->dtype == LM_FLOAT64)
         max_fwd_nchw_f64(in, o, ix, p);
      else
         max_fwd_nchw_f32(in, o, ix, p);
   }
   pool_free(p);
   return LM_OK;
}

/* LM_OP_MAX_POOL2D_BACKWARD, LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD: t = {grad_out, indices, grad_x};
   LM_OP_MAX_POOL2D_TAPS_BACKWARD: t = {grad_out, taps, grad_x}. With the window geometry (geom,
   taps): channels-last gathers (max_gather_nhwc_*), contiguous scatters by planes; without it
   (geom == 0) both scatter (max_bwd_*). */
lm_status lm_pool2d_max_backward(const lm_op *op, int v512) {
   const lm_pool_params *g = op->params;
   const lm_tensor *god = op->t[0], *indd = op->t[1], *gt = op->t[2];
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS_BACKWARD;
   const char *what = op->kind == LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD
                         ? "adaptive_max_pool2d_backward"
                         : "max_pool2d_backward";
   const char *iname = codes ? "taps" : "indices";
   pool_t pp, *p = &pp;
   pool_from_params(p, g, KIND_MAX);
   const void *gp = lm_tensor_data(god);
   const int64_t *ix = codes ? NULL : lm_tensor_data(indd);
   const uint8_t *cd = codes ? lm_tensor_data(indd) : NULL;
   void *gi = lm_tensor_data(gt);
   const int f64 = gt->dtype == LM_FLOAT64;
   lm_status st = LM_OK;
   int64_t bad = 0;
   if (!codes && !g->geom) {
      if (p->mf == LM_CHANNELS_LAST)
         bad = f64 ? max_bwd_nhwc_f64(gp, ix, gi, p) : max_bwd_nhwc_f32(gp, ix, gi, p);
      else
         bad = f64 ? max_bwd_nchw_f64(gp, ix, gi, p) : max_bwd_nchw_f32(gp, ix, gi, p);
      if (bad)
         return lm_error(LM_ERR_ARG,
                         "%s: %lld indices are out of range for an input plane of %lld", what,
                         (long long)bad, (long long)(p->H * p->W));
      return LM_OK;
   }
   int64_t *buf = NULL;
   if (p->mf == LM_CHANNELS_LAST) {
      buf = malloc((size_t)tap_lists_size(p) * sizeof(int64_t));
      if (!buf) {
         st = lm_error(LM_ERR_OOM, "out of memory (%s scratch)", what);
      } else {
         taps_t tl;
         tap_lists_make(p, buf, &tl);
         if (gt->dtype == LM_BFLOAT16) {
#ifdef POOL_X86
            if (v512)
               bad = lm_pool2d_max_gather_nhwc_v512(gp, ix, cd, gi, p, &tl, 0, 1);
            else
#endif
               bad = max_gather_nhwc_bf16(gp, ix, cd, gi, p, &tl);
         }
         else if (f64)
            bad = (v512 ? max_gather_nhwc_f64_512 : max_gather_nhwc_f64)(gp, ix, cd, gi, p, &tl);
#ifdef POOL_X86
         else if (v512) {
            /* streaming stores for a cold fresh grad_input: whole aligned vectors only */
            const int64_t cb = row_cblock(p->N * p->H, p->C);
            const int stream = out_cold(g, gt) && p->C % 16 == 0 && cb % 16 == 0 &&
                               ((uintptr_t)gi & 63) == 0;
            bad = lm_pool2d_max_gather_nhwc_v512(gp, ix, cd, gi, p, &tl, stream, 0);
            if (stream) lm_tensor_note_streamed(gt);
         }
#endif
         else
            bad = (v512 ? max_gather_nhwc_f32_512 : max_gather_nhwc_f32)(gp, ix, cd, gi, p, &tl);
      }
   } else if (codes) {
      int64_t di[256], dj[256], off[256];
      uint8_t *full = malloc((size_t)(p->OH + p->OW));
      int64_t *ins = malloc((size_t)(2 * (p->OH + p->OW)) * sizeof(int64_t));
      if (!full || !ins) {
         st = lm_error(LM_ERR_OOM, "out of memory (%s scratch)", what);
      } else {
         for (int64_t c = 0; c < 256; c++) {
            di[c] = c < p->kh * p->kw ? (c / p->kw) * p->dh : 0;
            dj[c] = c < p->kh * p->kw ? (c % p->kw) * p->dw : 0;
            off[c] = di[c] * p->W + dj[c];
         }
         taps_inside(p->H, p->OH, p->kh, p->sh, p->ph, p->dh, ins, ins + p->OH);
         taps_inside(p->W, p->OW, p->kw, p->sw, p->pw, p->dw, ins + 2 * p->OH,
                     ins + 2 * p->OH + p->OW);
         for (int64_t o = 0; o < p->OH; o++) full[o] = ins[p->OH + o] == p->kh;
         for (int64_t o = 0; o < p->OW; o++) full[p->OH + o] = ins[2 * p->OH + p->OW + o] == p->kw;
         bad = f64 ? max_bwd_taps_nchw_f64(gp, cd, gi, p, di, dj, off, full)
                   : max_bwd_taps_nchw_f32(gp, cd, gi, p, di, dj, off, full);
      }
      free(full);
      free(ins);
   } else {
      bad = f64 ? max_bwd_nchw_f64(gp, ix, gi, p) : max_bwd_nchw_f32(gp, ix, gi, p);
      if (bad)
         st = lm_error(LM_ERR_ARG,
                       "%s: %lld indices are out of range for an input plane of %lld", what,
                       (long long)bad, (long long)(p->H * p->W));
   }
   if (st == LM_OK && bad)
      st = lm_error(LM_ERR_ARG, "%s: %lld %s are out of range for their pooling windows", what,
                    (long long)bad, iname);
   free(buf);
   return st;
}
