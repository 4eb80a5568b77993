/* norm_rows_f32_avx512.c -- float32 group normalisation of one-row samples on 16 lanes: the
 * S = 1 case of LM_OP_GROUP_NORM / LM_OP_GROUP_NORM_BACKWARD (kernels/cpu/norm_group.c), which is
 * what F.layer_norm runs: an (M, D) tensor of rows, each row normalised over its D values (G = 1),
 * or over G contiguous groups of D / G. ConvNeXt's LayerNorm over the channels of a channels-last
 * tensor is this case (the N x H x W x C view is contiguous): 25,088 rows of 96 values at its
 * first stage, batch 8.
 *
 * Why: the portable row loops (norm_group.c, GN_ROW1) compute in double, one element at a time;
 * a convnext_tiny training step spent 65-93 ms in them, where PyTorch's layer norm took 31 ms
 * (torch.profiler, native_layer_norm + its backward, the same hour).
 *
 * Numerics: float32 with 32 partial sums a row (two vectors), two-pass (the mean of the values
 * less the group's first value, then the squared deviations from the mean), so neither a large
 * common offset nor E[x^2] - E[x]^2 cancels digits; rstd from the float32 variance in double. The backward's per-channel sums for grad_weight and grad_bias are float32
 * vectors over blocks of LM_ROWS_FLUSH rows, added into doubles after each block (per thread;
 * the caller sums the threads' doubles in order).
 */
#include "cpu.h"
#include "norm_rows.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline __mmask16 tail16(int64_t n) {
   return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* sum of x[0, n) - k */
static inline float v_sum(const float *x, int64_t n, float k) {
   const __m512 vk = _mm512_set1_ps(k);
   __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
   int64_t c = 0;
   for (; c + 32 <= n; c += 32) {
      a0 = _mm512_add_ps(a0, _mm512_sub_ps(_mm512_loadu_ps(x + c), vk));
      a1 = _mm512_add_ps(a1, _mm512_sub_ps(_mm512_loadu_ps(x + c + 16), vk));
   }
   for (; c < n; c += 16) {
      const __mmask16 m = tail16(n - c);
      a0 = _mm512_add_ps(a0, _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + c), vk));
   }
   return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* sum of (x - mu)^2 over x[0, n) */
static inline float v_dev2(const float *x, int64_t n, float mu) {
   const __m512 m = _mm512_set1_ps(mu);
   __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
   int64_t c = 0;
   for (; c + 32 <= n; c += 32) {
      const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + c), m);
      const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + c + 16), m);
      a0 = _mm512_fmadd_ps(d0, d0, a0);
      a1 = _mm512_fmadd_ps(d1, d1, a1);
   }
   for (; c < n; c += 16) {
      const __mmask16 k = tail16(n - c);
      const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + c), m);
      a0 = _mm512_fmadd_ps(d, d, a0);
   }
   return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

void lm_norm_rows_fwd_f32_avx512(const float *x, float *y, int64_t N, int64_t C, int64_t G,
                                 const float *w, const float *b, double eps, double *gm,
                                 double *gr, int nt) {
   const int64_t Cg = C / G;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
   for (int64_t n = 0; n < N; n++) {
      const float *xr = x + n * C;
      float *yr = y + n * C;
      for (int64_t gi = 0; gi < G; gi++) {
         const int64_t c0 = gi * Cg;
         /* the mean of the values shifted by the group's first one: near zero, so the float32
            sum keeps the digits a large common offset would take */
         const float k0 = xr[c0];
         const float mu = (float)((double)k0 + (double)v_sum(xr + c0, Cg, k0) / (double)Cg);
         const double var = (double)v_dev2(xr + c0, Cg, mu) / (double)Cg;
         const double rs = 1.0 / sqrt(var + eps);
         gm[n * G + gi] = mu;
         gr[n * G + gi] = rs;
         const __m512 m = _mm512_set1_ps(mu), r = _mm512_set1_ps((float)rs);
         for (int64_t c = c0; c < c0 + Cg; c += 16) {
            const __mmask16 k = tail16(c0 + Cg - c);
            const __m512 a = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, w + c));
            const __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + c), m);
            _mm512_mask_storeu_ps(yr + c, k,
                                  _mm512_fmadd_ps(v, a, _mm512_maskz_loadu_ps(k, b + c)));
         }
      }
   }
}

void lm_norm_rows_bwd_f32_avx512(const float *x, const float *dy, float *gx, int64_t N,
                                 int64_t C, int64_t G, const float *w, const double *gm,
                                 const double *gr, double *pw, float *fs, int nt) {
   const int64_t Cg = C / G;
#pragma omp parallel num_threads(nt) if (nt > 1)
   {
      int tid = 0, tn = 1;
#ifdef _OPENMP
      tid = omp_get_thread_num();
      tn = omp_get_num_threads();
#endif
      double *pgw = pw + (int64_t)tid * 2 * C, *pgb = pgw + C;
      float *fw = fs + (int64_t)tid * 2 * C, *fb = fw + C;
      memset(fw, 0, (size_t)(2 * C) * sizeof(float));
      const int64_t n0 = N * tid / tn, n1 = N * (tid + 1) / tn;
      for (int64_t n = n0; n < n1; n++) {
         const float *xr = x + n * C, *dr = dy + n * C;
         for (int64_t gi = 0; gi < G; gi++) {
            const int64_t c0 = gi * Cg;
            const float mu = (float)gm[n * G + gi], rs = (float)gr[n * G + gi];
            const __m512 m = _mm512_set1_ps(mu), r = _mm512_set1_ps(rs);
            __m512 sdb = _mm512_setzero_ps(), sds = _mm512_setzero_ps();
            for (int64_t c = c0; c < c0 + Cg; c += 16) {
               const __mmask16 k = tail16(c0 + Cg - c);
               const __m512 d = _mm512_maskz_loadu_ps(k, dr + c);
               const __m512 xc = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, xr + c), m);
               const __m512 wd = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + c), d);
               sdb = _mm512_add_ps(sdb, wd);
               sds = _mm512_fmadd_ps(wd, xc, sds);
               _mm512_mask_storeu_ps(fb + c, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, fb + c), d));
               _mm512_mask_storeu_ps(fw + c, k,
                                     _mm512_fmadd_ps(_mm512_mul_ps(d, xc), r,
                                                     _mm512_maskz_loadu_ps(k, fw + c)));
            }
            if (gx) {
               const double rsd = rs;
               const float bc = (float)(-rsd * rsd * rsd / (double)Cg *
                                        (double)_mm512_reduce_add_ps(sds));
               const float dc = (float)(-rsd / (double)Cg * (double)_mm512_reduce_add_ps(sdb));
               const __m512 vb = _mm512_set1_ps(bc), vd = _mm512_set1_ps(dc);
               float *gxr = gx + n * C;
               for (int64_t c = c0; c < c0 + Cg; c += 16) {
                  const __mmask16 k = tail16(c0 + Cg - c);
                  const __m512 d = _mm512_maskz_loadu_ps(k, dr + c);
                  const __m512 xc = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + c), m);
                  const __m512 a = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(k, w + c));
                  _mm512_mask_storeu_ps(gxr + c, k,
                                        _mm512_fmadd_ps(a, d, _mm512_fmadd_ps(vb, xc, vd)));
               }
            }
         }
         if ((n - n0) % LM_ROWS_FLUSH == LM_ROWS_FLUSH - 1)
            lm_norm_rows_flush(fw, fb, pgw, pgb, C);
      }
      lm_norm_rows_flush(fw, fb, pgw, pgb, C);
   }
}
