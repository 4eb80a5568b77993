/* pool_nhwc_v512.c -- the AVX-512 float kernels of the 2-D pools for channels-last (max_pool2d and
 * adaptive_max_pool2d forward and backward gather, avg_pool2d and adaptive_avg_pool2d forward and
 * backward gather), written with intrinsics; called by the drivers of pool_max.c and pool_avg.c
 * when the kernel table was filled for AVX-512. "v512": AVX-512 through function attributes
 * (LM_AVX512_FN, pool_geom.h) in a file built with the portable flags, like the AVX-512 copies of
 * the portable kernels; a *_avx512.c name would give the whole file the Makefile's AVX-512 flags.
 *
 * The channels of a pixel are contiguous, so a window is walked with its channels in registers:
 * chunks of 16 vectors (sums) or 8 (max, with the indices), then 4, then 1, then a masked tail.
 * Threads take output rows (n, oh), and blocks of channels when there are few rows. Each kernel
 * performs the same operations in the same order as the portable kernel it replaces, so the
 * results are bit-identical (sums start from 0 and add the taps row by row; the average divides).
 */
#include "pool2d.h"

#include <math.h>

#ifdef POOL_X86

#define LM_AI __attribute__((always_inline)) inline

/* the tap-number check of max_pool2d's backward (pool2d.h), for the gather below (noinline: as
   in pool_max.c) */
DEFINE_TAPS_BAD_ROW(512, LM_AVX512_FN __attribute__((noinline)))

static inline __mmask16 tail_mask(int64_t n) {
   return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* a 16-float store of a result: streaming (non-temporal: no read of the line, no cache
   pollution) when the kernel writes a cold fresh grad_input (then p is 64-byte aligned), else
   ordinary */
LM_AVX512_FN static LM_AI void st16(float *p, __m512 v, int stream) {
   if (stream)
      _mm512_stream_ps(p, v);
   else
      _mm512_storeu_ps(p, v);
}

/* a[0..NV) = 0 + the nh x nw taps from s0 (rows rs apart, taps ps apart), 16 NV channels */
LM_AVX512_FN static LM_AI void wsum(__m512 *a, const float *s0, int64_t rs, int64_t ps,
                                     int64_t nh, int64_t nw, const int NV) {
   for (int v = 0; v < NV; v++) a[v] = _mm512_setzero_ps();
   for (int64_t i = 0; i < nh; i++) {
      const float *s = s0 + i * rs;
      for (int64_t j = 0; j < nw; j++, s += ps)
         for (int v = 0; v < NV; v++) a[v] = _mm512_add_ps(a[v], _mm512_loadu_ps(s + 16 * v));
   }
}

/* the same for the channels of mask m (the others are 0) */
LM_AVX512_FN static LM_AI __m512 wsum_mask(const float *s0, int64_t rs, int64_t ps, int64_t nh,
                                            int64_t nw, __mmask16 m) {
   __m512 a = _mm512_setzero_ps();
   for (int64_t i = 0; i < nh; i++) {
      const float *s = s0 + i * rs;
      for (int64_t j = 0; j < nw; j++, s += ps) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m, s));
   }
   return a;
}

/* the average of one window for cn channels: base at its first tap, rs / ps row / tap strides */
LM_AVX512_FN static LM_AI void avg_win_v512(float *op, const float *base, int64_t rs, int64_t ps,
                                             int64_t nh, int64_t nw, int64_t cn, __m512 dv) {
   __m512 a[16];
   int64_t c = 0;
   for (; c + 256 <= cn; c += 256) {
      wsum(a, base + c, rs, ps, nh, nw, 16);
      for (int v = 0; v < 16; v++) _mm512_storeu_ps(op + c + 16 * v, _mm512_div_ps(a[v], dv));
   }
   for (; c + 64 <= cn; c += 64) {
      wsum(a, base + c, rs, ps, nh, nw, 4);
      for (int v = 0; v < 4; v++) _mm512_storeu_ps(op + c + 16 * v, _mm512_div_ps(a[v], dv));
   }
   for (; c + 16 <= cn; c += 16) {
      wsum(a, base + c, rs, ps, nh, nw, 1);
      _mm512_storeu_ps(op + c, _mm512_div_ps(a[0], dv));
   }
   if (c < cn) {
      const __mmask16 m = tail_mask(cn - c);
      const __m512 s = wsum_mask(base + c, rs, ps, nh, nw, m);
      _mm512_mask_storeu_ps(op + c, m, _mm512_maskz_div_ps(m, s, dv));
   }
}

LM_AVX512_FN void lm_pool2d_avg_fwd_nhwc_v512(const float *in, float *out, const pool_t *p) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * OH;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
#pragma omp parallel for schedule(static) if (tasks > 1 && rows * OW * C * p->kh * p->kw + p->N * C * H * W > LM_PARALLEL_GRAIN)
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t oh = r % OH, n = r / OH, h0 = p->hs[oh], nh = p->he[oh] - h0;
      const float *ib = in + n * H * W * C + c0;
      float *orow = out + r * OW * C + c0;
      for (int64_t ow = 0; ow < OW; ow++) {
         const int64_t w0 = p->ws[ow], nw = p->we[ow] - w0;
         if (nh <= 0 || nw <= 0) {
            memset(orow + ow * C, 0, (size_t)cn * sizeof(float));
            continue;
         }
         avg_win_v512(orow + ow * C, ib + (h0 * W + w0) * C, W * C, C, nh, nw, cn,
                      _mm512_set1_ps((float)avg_div(p, oh, ow)));
      }
   }
}
/* avg_pool2d / adaptive_avg_pool2d backward as a gather. Phase 1 scales grad_out by the window
   divisors into v (N, OH, OW, C); phase 2 writes each input pixel once, as 0 plus v of the windows
   that hold it (cov: rows rlo..rhi, columns clo..chi) in (oh, ow) order -- the additions, in the
   same order, of avg_bwd_nhwc_*'s scatter into a zeroed grad_input, without the zero fill and the
   read-modify-writes. Neighbouring columns held by the same windows (a run, cend) get the same
   sum: computed once. */
LM_AVX512_FN void lm_pool2d_avg_bwd_nhwc_v512(const float *go, float *gi, const pool_t *p, float *v,
                                           const int64_t *cov, int stream) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW;
   const int64_t orows = p->N * OH, irows = p->N * H;
   const int64_t *rlo = cov, *rhi = cov + H, *clo = cov + 2 * H, *chi = cov + 2 * H + W;
   const int64_t *cend = cov + 2 * H + 2 * W;
#pragma omp parallel if (irows > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)
   {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < orows; r++) {
         const int64_t oh = r % OH;
         for (int64_t ow = 0; ow < OW; ow++) {
            const float *oi = go + (r * OW + ow) * C;
            float *vi = v + (r * OW + ow) * C;
            if (p->hs[oh] >= p->he[oh] || p->ws[ow] >= p->we[ow]) { /* never gathered */
               memset(vi, 0, (size_t)C * sizeof(float));
               continue;
            }
            const __m512 dv = _mm512_set1_ps((float)avg_div(p, oh, ow));
            int64_t c = 0;
            for (; c + 16 <= C; c += 16)
               _mm512_storeu_ps(vi + c, _mm512_div_ps(_mm512_loadu_ps(oi + c), dv));
            if (c < C) {
               const __mmask16 m = tail_mask(C - c);
               _mm512_mask_storeu_ps(vi + c, m,
                                     _mm512_maskz_div_ps(m, _mm512_maskz_loadu_ps(m, oi + c), dv));
            }
         }
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < irows; r++) {
         const int64_t ih = r % H, n = r / H, a0 = rlo[ih], na = rhi[ih] - a0;
         const float *vn = v + n * OH * OW * C;
         float *g = gi + r * W * C;
         if (C <= 16) { /* one vector per pixel */
            const __mmask16 m = tail_mask(C);
            const float *vr = vn + a0 * OW * C;
            for (int64_t iw = 0, iw1; iw < W; iw = iw1) {
               const int64_t b0 = clo[iw];
               const __m512 s = wsum_mask(vr + b0 * C, OW * C, C, na, chi[iw] - b0, m);
               iw1 = cend[iw];
               for (int64_t q = iw; q < iw1; q++) _mm512_mask_storeu_ps(g + q * C, m, s);
            }
            continue;
         }
         for (int64_t iw = 0, iw1; iw < W; iw = iw1) {
            const int64_t b0 = clo[iw], b1 = chi[iw], nbw = b1 - b0;
            iw1 = cend[iw];
            const float *base = vn + (a0 * OW + b0) * C;
            __m512 a[16];
            int64_t c = 0;
            for (; c + 256 <= C; c += 256) {
               wsum(a, base + c, OW * C, C, na, nbw, 16);
               for (int64_t q = iw; q < iw1; q++)
                  for (int k = 0; k < 16; k++) st16(g + q * C + c + 16 * k, a[k], stream);
            }
            for (; c + 64 <= C; c += 64) {
               wsum(a, base + c, OW * C, C, na, nbw, 4);
               for (int64_t q = iw; q < iw1; q++)
                  for (int k = 0; k < 4; k++) st16(g + q * C + c + 16 * k, a[k], stream);
            }
            for (; c + 16 <= C; c += 16) {
               wsum(a, base + c, OW * C, C, na, nbw, 1);
               for (int64_t q = iw; q < iw1; q++) st16(g + q * C + c, a[0], stream);
            }
            if (c < C) {
               const __mmask16 m = tail_mask(C - c);
               const __m512 s = wsum_mask(base + c, OW * C, C, na, nbw, m);
               for (int64_t q = iw; q < iw1; q++) _mm512_mask_storeu_ps(g + q * C + c, m, s);
            }
         }
      }
      if (stream) _mm_sfence();
   }
}

/* int32 lanes of i, widened, to xp[0..16) (lanes of m) */
LM_AVX512_FN static LM_AI void store_idx16(int64_t *xp, __m512i i, __mmask16 m) {
   const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(i));
   const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(i, 1));
   if (m == 0xFFFF) {
      _mm512_storeu_si512(xp, lo);
      _mm512_storeu_si512(xp + 8, hi);
   } else {
      _mm512_mask_storeu_epi64(xp, (__mmask8)m, lo);
      _mm512_mask_storeu_epi64(xp + 8, (__mmask8)(m >> 8), hi);
   }
}

/* max and its first index over the taps (rows h0..h1 step dh, columns w0..w1 step dw) for 16 NV
   channels from ib (m: the lanes loaded, all for a full chunk); a value wins when it is greater
   or NaN, as in the portable kernels */
LM_AVX512_FN static LM_AI void max_taps(__m512 *mx, __m512i *mi, const float *ib, int64_t W,
                                         int64_t C, int64_t h0, int64_t h1, int64_t dh,
                                         int64_t w0, int64_t w1, int64_t dw, __mmask16 m,
                                         const int NV, const int want) {
   const __m512i first = _mm512_set1_epi32((h0 < h1 && w0 < w1) ? (int32_t)(h0 * W + w0) : -1);
   for (int v = 0; v < NV; v++) {
      mx[v] = _mm512_set1_ps(-INFINITY);
      mi[v] = first;
   }
   for (int64_t ih = h0; ih < h1; ih += dh)
      for (int64_t iw = w0; iw < w1; iw += dw) {
         const float *s = ib + (ih * W + iw) * C;
         const __m512i id = _mm512_set1_epi32((int32_t)(ih * W + iw));
         for (int v = 0; v < NV; v++) {
            const __m512 x =
               m == 0xFFFF ? _mm512_loadu_ps(s + 16 * v) : _mm512_maskz_loadu_ps(m, s);
            const __mmask16 k = _mm512_cmp_ps_mask(x, mx[v], _CMP_GT_OQ) |
                                _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            mx[v] = _mm512_mask_mov_ps(mx[v], k, x);
            if (want) mi[v] = _mm512_mask_mov_epi32(mi[v], k, id);
         }
      }
}

/* the max of one window for cn channels (ib: the image at the first channel) */
LM_AVX512_FN static LM_AI void max_win_v512(const float *ib, float *op, int64_t *xp, int64_t W,
                                             int64_t C, int64_t cn, int64_t h0, int64_t h1,
                                             int64_t dh, int64_t w0, int64_t w1, int64_t dw,
                                             const int want) {
   __m512 mx[8];
   __m512i mi[8];
   int64_t c = 0;
   for (; c + 128 <= cn; c += 128) {
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, 0xFFFF, 8, want);
      for (int v = 0; v < 8; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         if (want) store_idx16(xp + c + 16 * v, mi[v], 0xFFFF);
      }
   }
   for (; c + 64 <= cn; c += 64) {
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, 0xFFFF, 4, want);
      for (int v = 0; v < 4; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         if (want) store_idx16(xp + c + 16 * v, mi[v], 0xFFFF);
      }
   }
   for (; c < cn; c += 16) {
      const __mmask16 m = tail_mask(cn - c);
      max_taps(mx, mi, ib + c, W, C, h0, h1, dh, w0, w1, dw, m, 1, want);
      _mm512_mask_storeu_ps(op + c, m, mx[0]);
      if (want) store_idx16(xp + c, mi[0], m);
   }
}

/* max_taps for the tap numbers (bytes, 16 channels a vector): code0 is the number of tap
   (h0, w0), kw the number of taps in a window row */
LM_AVX512_FN static LM_AI void max_taps_cd(__m512 *mx, __m128i *mc, const float *ib, int64_t W,
                                            int64_t C, int64_t h0, int64_t h1, int64_t dh,
                                            int64_t w0, int64_t w1, int64_t dw, int64_t code0,
                                            int64_t kw, __mmask16 m, const int NV) {
   const __m128i first = _mm_set1_epi8((char)((h0 < h1 && w0 < w1) ? code0 : 255));
   for (int v = 0; v < NV; v++) {
      mx[v] = _mm512_set1_ps(-INFINITY);
      mc[v] = first;
   }
   int64_t rid = code0;
   for (int64_t ih = h0; ih < h1; ih += dh, rid += kw) {
      int64_t id = rid;
      for (int64_t iw = w0; iw < w1; iw += dw, id++) {
         const float *s = ib + (ih * W + iw) * C;
         const __m128i idv = _mm_set1_epi8((char)id);
         for (int v = 0; v < NV; v++) {
            const __m512 x =
               m == 0xFFFF ? _mm512_loadu_ps(s + 16 * v) : _mm512_maskz_loadu_ps(m, s);
            const __mmask16 k = _mm512_cmp_ps_mask(x, mx[v], _CMP_GT_OQ) |
                                _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            mx[v] = _mm512_mask_mov_ps(mx[v], k, x);
            mc[v] = _mm_mask_mov_epi8(mc[v], k, idv);
         }
      }
   }
}

/* max_win_v512 with the tap numbers to cp */
LM_AVX512_FN static LM_AI void max_win_cd_v512(const float *ib, float *op, uint8_t *cp, int64_t W,
                                                int64_t C, int64_t cn, int64_t h0, int64_t h1,
                                                int64_t dh, int64_t w0, int64_t w1, int64_t dw,
                                                int64_t code0, int64_t kw) {
   __m512 mx[8];
   __m128i mc[8];
   int64_t c = 0;
   for (; c + 128 <= cn; c += 128) {
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, 0xFFFF, 8);
      for (int v = 0; v < 8; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         _mm_storeu_si128((__m128i *)(cp + c + 16 * v), mc[v]);
      }
   }
   for (; c + 64 <= cn; c += 64) {
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, 0xFFFF, 4);
      for (int v = 0; v < 4; v++) {
         _mm512_storeu_ps(op + c + 16 * v, mx[v]);
         _mm_storeu_si128((__m128i *)(cp + c + 16 * v), mc[v]);
      }
   }
   for (; c < cn; c += 16) {
      const __mmask16 m = tail_mask(cn - c);
      max_taps_cd(mx, mc, ib + c, W, C, h0, h1, dh, w0, w1, dw, code0, kw, m, 1);
      _mm512_mask_storeu_ps(op + c, m, mx[0]);
      _mm_mask_storeu_epi8(cp + c, m, mc[0]);
   }
}

/* max_pool2d / adaptive_max_pool2d forward; H * W < INT32_MAX (the indices run in int32 lanes).
   cd (max_pool2d only): the tap numbers instead of the indices. */
LM_AVX512_FN void lm_pool2d_max_fwd_nhwc_v512(const float *in, float *out, int64_t *ind, uint8_t *cd,
                                           const pool_t *p) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * OH;
   const int64_t dh = p->dh, dw = p->dw;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
#pragma omp parallel for schedule(static) if (tasks > 1 && rows * OW * C * p->kh * p->kw > LM_PARALLEL_GRAIN)
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t oh = r % OH, n = r / OH, h0 = p->hs[oh], h1 = p->he[oh];
      const float *ib = in + n * H * W * C + c0;
      float *orow = out + r * OW * C + c0;
      if (cd) {
         uint8_t *crow = cd + r * OW * C + c0;
         const int64_t code_h = p->hz[oh] * p->kw;
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_cd_v512(ib, orow + ow * C, crow + ow * C, W, C, cn, h0, h1, dh, p->ws[ow],
                            p->we[ow], dw, code_h + p->wz[ow], p->kw);
      } else if (ind) {
         int64_t *xrow = ind + r * OW * C + c0;
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_v512(ib, orow + ow * C, xrow + ow * C, W, C, cn, h0, h1, dh, p->ws[ow],
                         p->we[ow], dw, 1);
      } else {
         for (int64_t ow = 0; ow < OW; ow++)
            max_win_v512(ib, orow + ow * C, NULL, W, C, cn, h0, h1, dh, p->ws[ow], p->we[ow], dw,
                         0);
      }
   }
}

/* ---- max_pool2d backward gather for float (DEFINE_MAX_GATHER's results and return value) ---- */
/* the AVX-512 set plus popcnt (every AVX-512 CPU has it) for the index counts */
#define LM_AVX512P_FN                                                                              \
   __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,popcnt,prefer-vector-width=512")))

/* the gathers read grad_out as float32 (bf = 0) or bfloat16 (bf = 1: widened exactly), at
   element i of p, lanes m (all of them: 0xFFFF) */
LM_AVX512P_FN static LM_AI __m512 gload(const void *p, int64_t i, __mmask16 m, const int bf) {
   if (bf) {
      const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
   }
   return m == 0xFFFF ? _mm512_loadu_ps((const float *)p + i)
                      : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* a gathered sum stored at element i of p: float32 as it is (streaming when stream), bfloat16
   rounded to nearest even (NaN kept quiet, as lm_f2bf) */
LM_AVX512P_FN static LM_AI void gstore(void *p, int64_t i, __m512 v, __mmask16 m, int stream,
                                        const int bf) {
   if (bf) {
      const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
      const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(
         _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
      _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtepi32_epi16(r));
   } else if (m == 0xFFFF) {
      st16((float *)p + i, v, stream);
   } else {
      _mm512_mask_storeu_ps((float *)p + i, m, v);
   }
}

/* acc[0..NV) = 0 + grad_out of the windows (rows a0..a1, columns b0..b1 of the tap lists) whose
   tap number (bytes at tn) is the pixel's in that window, for 16 NV channels from gn / tn (m:
   the lanes, all of them for a full chunk) */
LM_AVX512P_FN static LM_AI void taps_gather(__m512 *acc, const void *gn, const uint8_t *tn,
                                             const taps_t *tl, int64_t a0, int64_t a1, int64_t b0,
                                             int64_t b1, int64_t OW, int64_t C, int64_t kw,
                                             __mmask16 m, const int NV, const int bf) {
   for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
   for (int64_t a = a0; a < a1; a++) {
      const int64_t rb = tl->rwin[a] * OW, rc = tl->rtap[a] * kw;
      for (int64_t b = b0; b < b1; b++) {
         const int64_t off = (rb + tl->cwin[b]) * C;
         const uint8_t *t = tn + off;
         const __m128i cv = _mm_set1_epi8((char)(rc + tl->ctap[b]));
         for (int v = 0; v < NV; v++) {
            if (m == 0xFFFF) {
               const __mmask16 k =
                  _mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i *)(t + 16 * v)), cv);
               acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], gload(gn, off + 16 * v, m, bf));
            } else {
               const __mmask16 k = _mm_mask_cmpeq_epi8_mask(m, _mm_maskz_loadu_epi8(m, t), cv);
               acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], gload(gn, off, m, bf));
            }
         }
      }
   }
}

/* the same with int64 indices compared with the pixel's flat index pix; *cnt counts the matches
   per lane */
LM_AVX512P_FN static LM_AI void index_gather(__m512 *acc, __m512i *cnt, const void *gn,
                                              const int64_t *xn, const taps_t *tl, int64_t a0,
                                              int64_t a1, int64_t b0, int64_t b1, int64_t OW,
                                              int64_t C, __m512i pix, __mmask16 m, const int NV,
                                              const int bf) {
   const __m512i one = _mm512_set1_epi32(1);
   for (int v = 0; v < NV; v++) acc[v] = _mm512_setzero_ps();
   for (int64_t a = a0; a < a1; a++) {
      const int64_t rb = tl->rwin[a] * OW;
      for (int64_t b = b0; b < b1; b++) {
         const int64_t off = (rb + tl->cwin[b]) * C;
         const int64_t *x = xn + off;
         for (int v = 0; v < NV; v++) {
            __mmask16 k;
            __m512 g;
            if (m == 0xFFFF) {
               const __mmask8 lo = _mm512_cmpeq_epi64_mask(_mm512_loadu_si512(x + 16 * v), pix);
               const __mmask8 hi =
                  _mm512_cmpeq_epi64_mask(_mm512_loadu_si512(x + 16 * v + 8), pix);
               k = _mm512_kunpackb(hi, lo);
               g = gload(gn, off + 16 * v, m, bf);
            } else {
               const __mmask8 ml = (__mmask8)m, mh = (__mmask8)(m >> 8);
               const __mmask8 lo =
                  _mm512_mask_cmpeq_epi64_mask(ml, _mm512_maskz_loadu_epi64(ml, x), pix);
               const __mmask8 hi =
                  _mm512_mask_cmpeq_epi64_mask(mh, _mm512_maskz_loadu_epi64(mh, x + 8), pix);
               k = _mm512_kunpackb(hi, lo);
               g = gload(gn, off, m, bf);
            }
            acc[v] = _mm512_mask_add_ps(acc[v], k, acc[v], g);
            *cnt = _mm512_mask_add_epi32(*cnt, k, *cnt, one);
         }
      }
   }
}

/* the entries of x[0..n) that are not -1 */
LM_AVX512P_FN static LM_AI int64_t count_set64(const int64_t *x, int64_t n) {
   const __m512i none = _mm512_set1_epi64(-1);
   int64_t cnt = 0, i = 0;
   for (; i + 8 <= n; i += 8)
      cnt += _mm_popcnt_u32(_mm512_cmpneq_epi64_mask(_mm512_loadu_si512(x + i), none));
   if (i < n) {
      const __mmask8 m = (__mmask8)((1u << (n - i)) - 1u);
      cnt += _mm_popcnt_u32(
         _mm512_mask_cmpneq_epi64_mask(m, _mm512_maskz_loadu_epi64(m, x + i), none));
   }
   return cnt;
}

/* go, gi: float32, or bfloat16 (bf: the sums in float32, each rounded once; no streaming) */
LM_AVX512P_FN int64_t lm_pool2d_max_gather_nhwc_v512(const void *go, const int64_t *ind,
                                                  const uint8_t *cd, void *gi, const pool_t *p,
                                                  const taps_t *tl, int stream, const int bf) {
   const int64_t H = p->H, W = p->W, C = p->C, OH = p->OH, OW = p->OW, rows = p->N * H;
   const int64_t kw = p->kw;
   const int64_t cb = row_cblock(rows, C), nb = (C + cb - 1) / cb, tasks = rows * nb;
   int64_t nbad = 0;
#pragma omp parallel reduction(+ : nbad) if (tasks > 1 && p->N * C * (H * W + OH * OW) > LM_PARALLEL_GRAIN)
   {
#pragma omp for schedule(static) nowait
   for (int64_t t = 0; t < tasks; t++) {
      const int64_t r = t / nb, c0 = (t % nb) * cb, cn = min64(cb, C - c0);
      const int64_t ih = r % H, n = r / H;
      const int64_t a0 = tl->rptr[ih], a1 = tl->rptr[ih + 1];
      const int64_t nofs = n * OH * OW * C + c0;
      const int esz = bf ? 2 : 4;
      const void *gn = (const char *)go + nofs * esz;
      char *g = (char *)gi + r * W * C * esz + c0 * esz;
      int64_t lbad = 0;
      if (cd) {
         const uint8_t *tn = cd + nofs;
         for (int64_t oh = 0; oh < OH; oh++)
            if (owner_row(p, oh) == ih) lbad += taps_bad_row_512(p, tl, tn, oh, cn);
         for (int64_t iw = 0; iw < W; iw++) {
            const int64_t b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];
            char *dst = g + iw * C * esz;
            __m512 acc[8];
            int64_t c = 0;
            for (; c + 128 <= cn; c += 128) {
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           0xFFFF, 8, bf);
               for (int v = 0; v < 8; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c + 64 <= cn; c += 64) {
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           0xFFFF, 4, bf);
               for (int v = 0; v < 4; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c < cn; c += 16) {
               const __mmask16 m = tail_mask(cn - c);
               taps_gather(acc, (const char *)gn + c * esz, tn + c, tl, a0, a1, b0, b1, OW, C, kw,
                           m, 1, bf);
               gstore(dst, c, acc[0], m, 0, bf);
            }
         }
      } else {
         const int64_t *xn = ind + nofs;
         for (int64_t oh = 0; oh < OH; oh++) {
            if (owner_row(p, oh) != ih) continue;
            if (cn == C) {
               lbad += count_set64(xn + oh * OW * C, OW * C);
            } else {
               for (int64_t ow = 0; ow < OW; ow++)
                  lbad += count_set64(xn + (oh * OW + ow) * C, cn);
            }
         }
         for (int64_t iw = 0; iw < W; iw++) {
            const int64_t b0 = tl->cptr[iw], b1 = tl->cptr[iw + 1];
            const __m512i pix = _mm512_set1_epi64(ih * W + iw);
            char *dst = g + iw * C * esz;
            __m512 acc[8];
            __m512i mc = _mm512_setzero_si512();
            int64_t c = 0;
            for (; c + 128 <= cn; c += 128) {
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, 0xFFFF, 8, bf);
               for (int v = 0; v < 8; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c + 64 <= cn; c += 64) {
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, 0xFFFF, 4, bf);
               for (int v = 0; v < 4; v++) gstore(dst, c + 16 * v, acc[v], 0xFFFF, stream, bf);
            }
            for (; c < cn; c += 16) {
               const __mmask16 m = tail_mask(cn - c);
               index_gather(acc, &mc, (const char *)gn + c * esz, xn + c, tl, a0, a1, b0, b1, OW,
                            C, pix, m, 1, bf);
               gstore(dst, c, acc[0], m, 0, bf);
            }
            lbad -= _mm512_reduce_add_epi32(mc);
         }
      }
      nbad += lbad;
   }
   if (stream) _mm_sfence(); /* each thread orders its own streaming stores */
   }
   return nbad;
}

#else
/* not x86-64: nothing (the drivers run the portable kernels) */
typedef int lm_pool_nhwc_v512_empty_unit;
#endif /* POOL_X86 */
