/*
 * norm_half_avx512.c -- the AVX-512 copy of the float16 / bfloat16 batch-norm row kernel
 * (norm_half.h has the contract; kernels/cpu/norm.c calls it, and holds the portable copy).
 *
 * The ResNet50 bf16 training step keeps its activations channels-last, so every batch norm
 * there is this kernel: read 16-bit values, widen them in registers (bfloat16: the 16 bits
 * shifted into the top of a float32; float16: vcvtph2ps), compute in float32, round once on the
 * store (bfloat16: round to nearest even by integer ops, NaN kept quiet, as lm_f2bf; float16:
 * vcvtps2ph). Half the bytes of the float32 kernel, and no float32 copies of the operands: the
 * front end's widening route read 2 + wrote 4 bytes per element per operand before the float32
 * kernel ran, and rounded the result in one more pass.
 *
 * Channels go in tiles of up to 4 vectors of 16 (the last one masked when C % 16 != 0), held in
 * registers while the rows of a block stream through; the sums use two float32 accumulators per
 * vector (even and odd rows) over at most SROWS rows, flushed into double.
 */
#include "cpu.h"
#include "norm_half.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

enum { SROWS = 64, RROWS = 32, NVT = 4 };
#define BN_GRAIN ((int64_t)1 << 18)

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* 16 values (lanes of mask m; the others 0) widened to float32 */
static inline __m512 ld16(int bf, const uint16_t *p, __mmask16 m) {
   const __m256i h = _mm256_maskz_loadu_epi16(m, p);
   if (bf) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
   return _mm512_cvtph_ps(h);
}

/* 16 floats rounded to the 16-bit type (to nearest even), the lanes of mask m stored */
static inline __m256i cvt16(int bf, __m512 v) {
   __m256i h;
   if (bf) {
      const __m512i u = _mm512_castps_si512(v);
      const __m512i hi = _mm512_srli_epi32(u, 16);
      const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
      __m512i r = _mm512_srli_epi32(
         _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
      h = _mm512_cvtepi32_epi16(r);
   } else {
      h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
   }
   return h;
}

static inline void st16(int bf, uint16_t *p, __m512 v, __mmask16 m) {
   _mm256_mask_storeu_epi16(p, m, cvt16(bf, v));
}

/* g where m > 0 or m is NaN, else 0 (relu_backward's mask) */
static inline __m512 relu_mask(__m512 g, __m512 m) {
   return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_NLE_UQ), g);
}

static inline __mmask16 vmask(int j, int nv, __mmask16 tm) { return j == nv - 1 ? tm : 0xffff; }

/* the sums of rows [rb, re), channels [cb, cb + 16 nv) (the last vector masked by tm), added
   into p1, p2; mode 0: statistics of x; 1: of dy; 2: of dy masked by mk (stored into gm) */
static inline __attribute__((always_inline)) void sums_tile(const lm_bn_half_args *p, const int bf,
                                                            const int mode, int64_t rb,
                                                            int64_t re, int64_t cb, const int nv,
                                                            __mmask16 tm, double *p1,
                                                            double *p2) {
   const int64_t C = p->C;
   __m512 k[NVT], u[2][NVT], q[2][NVT];
   for (int j = 0; j < nv; j++) {
      k[j] = _mm512_maskz_loadu_ps(vmask(j, nv, tm), p->K + cb + 16 * j);
      u[0][j] = u[1][j] = q[0][j] = q[1][j] = _mm512_setzero_ps();
   }
   for (int64_t r = rb; r < re; r++) {
      const int e = (int)((r - rb) & 1);
      const int64_t o = r * C + cb;
      for (int j = 0; j < nv; j++) {
         const __mmask16 m = vmask(j, nv, tm);
         const __m512 d = _mm512_sub_ps(ld16(bf, p->x + o + 16 * j, m), k[j]);
         if (mode == 0) {
            u[e][j] = _mm512_add_ps(u[e][j], d);
            q[e][j] = _mm512_fmadd_ps(d, d, q[e][j]);
         } else {
            __m512 g = ld16(bf, p->dy + o + 16 * j, m);
            if (mode == 2) {
               g = relu_mask(g, ld16(bf, p->mk + o + 16 * j, m));
               if (p->gm) st16(bf, p->gm + o + 16 * j, g, m);
            }
            u[e][j] = _mm512_add_ps(u[e][j], g);
            q[e][j] = _mm512_fmadd_ps(g, d, q[e][j]);
         }
      }
   }
   for (int j = 0; j < nv; j++) {
      const __mmask16 m = vmask(j, nv, tm);
      const __m512 su = _mm512_add_ps(u[0][j], u[1][j]), sq = _mm512_add_ps(q[0][j], q[1][j]);
      double *d1 = p1 + cb + 16 * j, *d2 = p2 + cb + 16 * j;
      const __mmask8 lo = (__mmask8)(m & 0xff), hi = (__mmask8)(m >> 8);
      _mm512_mask_storeu_pd(d1, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, d1),
                                                  _mm512_cvtps_pd(_mm512_castps512_ps256(su))));
      _mm512_mask_storeu_pd(d1 + 8, hi,
                            _mm512_add_pd(_mm512_maskz_loadu_pd(hi, d1 + 8),
                                          _mm512_cvtps_pd(_mm512_extractf32x8_ps(su, 1))));
      _mm512_mask_storeu_pd(d2, lo, _mm512_add_pd(_mm512_maskz_loadu_pd(lo, d2),
                                                  _mm512_cvtps_pd(_mm512_castps512_ps256(sq))));
      _mm512_mask_storeu_pd(d2 + 8, hi,
                            _mm512_add_pd(_mm512_maskz_loadu_pd(hi, d2 + 8),
                                          _mm512_cvtps_pd(_mm512_extractf32x8_ps(sq, 1))));
   }
}

/* y = A (a' - Ma) [+ B (b - Mb)] + D [+ res] [relu] for rows [rb, re) (backwards), channels
   [cb, cb + 16 nv) */
static inline __attribute__((always_inline)) void affine_tile(const lm_bn_half_args *p,
                                                              const int bf, int64_t rb,
                                                              int64_t re, int64_t cb,
                                                              const int nv, __mmask16 tm) {
   const int64_t C = p->C;
   const float *cf = p->cf;
   __m512 A[NVT], Ma[NVT], B[NVT], Mb[NVT], D[NVT];
   for (int j = 0; j < nv; j++) {
      const __mmask16 m = vmask(j, nv, tm);
      const int64_t c = cb + 16 * j;
      A[j] = _mm512_maskz_loadu_ps(m, cf + c);
      Ma[j] = _mm512_maskz_loadu_ps(m, cf + C + c);
      B[j] = _mm512_maskz_loadu_ps(m, cf + 2 * C + c);
      Mb[j] = _mm512_maskz_loadu_ps(m, cf + 3 * C + c);
      D[j] = _mm512_maskz_loadu_ps(m, cf + 4 * C + c);
   }
   const __m512 zero = _mm512_setzero_ps();
   /* the operands in locals: read through p, every field was loaded again for each vector (the
      stores through y may alias p as far as the compiler knows) */
   const uint16_t *pa = p->a, *pamk = p->amk, *pb = p->b, *pres = p->res;
   uint16_t *py = p->y;
   const int relu = p->relu, stream = p->stream;
   for (int64_t r = re - 1; r >= rb; r--) {
      const int64_t o = r * C + cb;
      for (int j = 0; j < nv; j++) {
         const __mmask16 m = vmask(j, nv, tm);
         __m512 av = ld16(bf, pa + o + 16 * j, m);
         if (pamk) av = relu_mask(av, ld16(bf, pamk + o + 16 * j, m));
         __m512 t = _mm512_fmadd_ps(A[j], _mm512_sub_ps(av, Ma[j]), D[j]);
         if (pb) t = _mm512_fmadd_ps(B[j], _mm512_sub_ps(ld16(bf, pb + o + 16 * j, m), Mb[j]), t);
         if (pres) t = _mm512_add_ps(t, ld16(bf, pres + o + 16 * j, m));
         if (relu) t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, zero, _CMP_NLT_UQ), t);
         if (stream) /* whole 32-byte halves of lines (C % 32 == 0): write-combined */
            _mm256_stream_si256((__m256i *)(void *)(py + o + 16 * j), cvt16(bf, t));
         else
            st16(bf, py + o + 16 * j, t, m);
      }
   }
}

/* every tile of a block of rows: full tiles of NVT vectors, then the rest (1..NVT vectors, the
   last one masked) */
static inline __attribute__((always_inline)) void sums_block(const lm_bn_half_args *p,
                                                             const int bf, const int mode,
                                                             int64_t rb, int64_t re, double *p1,
                                                             double *p2) {
   const int64_t C = p->C, Cf = C - C % (16 * NVT);
   int64_t cb = 0;
   for (; cb < Cf; cb += 16 * NVT) sums_tile(p, bf, mode, rb, re, cb, NVT, 0xffff, p1, p2);
   if (cb < C) {
      const int64_t rest = C - cb;
      const int nv = (int)((rest + 15) / 16);
      const __mmask16 tm = rest % 16 ? (__mmask16)((1u << (rest % 16)) - 1u) : 0xffff;
      switch (nv) {
      case 1: sums_tile(p, bf, mode, rb, re, cb, 1, tm, p1, p2); break;
      case 2: sums_tile(p, bf, mode, rb, re, cb, 2, tm, p1, p2); break;
      case 3: sums_tile(p, bf, mode, rb, re, cb, 3, tm, p1, p2); break;
      default: sums_tile(p, bf, mode, rb, re, cb, 4, tm, p1, p2); break;
      }
   }
}

static inline __attribute__((always_inline)) void affine_block(const lm_bn_half_args *p,
                                                               const int bf, int64_t rb,
                                                               int64_t re) {
   const int64_t C = p->C, Cf = C - C % (16 * NVT);
   int64_t cb = 0;
   for (; cb < Cf; cb += 16 * NVT) affine_tile(p, bf, rb, re, cb, NVT, 0xffff);
   if (cb < C) {
      const int64_t rest = C - cb;
      const int nv = (int)((rest + 15) / 16);
      const __mmask16 tm = rest % 16 ? (__mmask16)((1u << (rest % 16)) - 1u) : 0xffff;
      switch (nv) {
      case 1: affine_tile(p, bf, rb, re, cb, 1, tm); break;
      case 2: affine_tile(p, bf, rb, re, cb, 2, tm); break;
      case 3: affine_tile(p, bf, rb, re, cb, 3, tm); break;
      default: affine_tile(p, bf, rb, re, cb, 4, tm); break;
      }
   }
}

/* one thread's rows [r0, r1) of the sums pass, the mode and the type as constants */
static void sums_rows(const lm_bn_half_args *p, int64_t r0, int64_t r1, double *p1, double *p2) {
   const int bf = p->dt == LM_BFLOAT16;
   const int mode = !p->dy ? 0 : !p->mk ? 1 : 2;
   for (int64_t rb = r0; rb < r1; rb += SROWS) {
      const int64_t re = min64(rb + SROWS, r1);
      if (bf) {
         if (mode == 0) sums_block(p, 1, 0, rb, re, p1, p2);
         else if (mode == 1) sums_block(p, 1, 1, rb, re, p1, p2);
         else sums_block(p, 1, 2, rb, re, p1, p2);
      } else {
         if (mode == 0) sums_block(p, 0, 0, rb, re, p1, p2);
         else if (mode == 1) sums_block(p, 0, 1, rb, re, p1, p2);
         else sums_block(p, 0, 2, rb, re, p1, p2);
      }
   }
}

static void affine_rows(const lm_bn_half_args *p, int64_t r0, int64_t r1) {
   const int bf = p->dt == LM_BFLOAT16;
   for (int64_t re = r1; re > r0; re -= RROWS) {
      const int64_t rb = re - RROWS > r0 ? re - RROWS : r0;
      if (bf)
         affine_block(p, 1, rb, re);
      else
         affine_block(p, 0, rb, re);
   }
}

void lm_bn_rows_half_avx512(const lm_bn_half_args *p) {
   const int64_t M = p->M, C = p->C;
   void (*prep)(void *) = p->prep;
   if (!p->K && prep) {
      prep(p->ctx);
      prep = NULL;
   }
#pragma omp parallel if (M * C > BN_GRAIN)
   {
      int tid = 0, nth = 1;
#ifdef _OPENMP
      tid = omp_get_thread_num();
      nth = omp_get_num_threads();
#endif
      const int64_t r0 = M * tid / nth, r1 = M * (tid + 1) / nth;
      if (p->K) {
         double *p1 = p->part + (size_t)tid * 2 * (size_t)C, *p2 = p1 + C;
         for (int64_t c = 0; c < C; c++) p1[c] = p2[c] = 0;
         sums_rows(p, r0, r1, p1, p2);
#pragma omp barrier
         if (tid == 0) {
            for (int64_t c = 0; c < C; c++) p->s1[c] = p->s2[c] = 0;
            for (int t = 0; t < nth; t++) {
               const double *q1 = p->part + (size_t)t * 2 * (size_t)C, *q2 = q1 + C;
               for (int64_t c = 0; c < C; c++) {
                  p->s1[c] += q1[c];
                  p->s2[c] += q2[c];
               }
            }
            if (prep) prep(p->ctx);
         }
         if (p->y) {
#pragma omp barrier
         }
      }
      if (p->y) {
         affine_rows(p, r0, r1);
         if (p->stream) _mm_sfence();
      }
   }
}

#else
/* not x86-64 with AVX-512 at compile time: never registered (norm.c checks BN_HAVE_AVX512) */
void lm_bn_rows_half_avx512(const lm_bn_half_args *p) { (void)p; }
#endif
