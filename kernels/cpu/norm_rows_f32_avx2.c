/* norm_rows_f32_avx2.c -- float32 group normalisation of one-row samples on 8 lanes (AVX2 + FMA,
 * "norm_rows_avx2"): norm_rows_f32_avx512.c's two kernels for CPUs below AVX-512, the same
 * arithmetic in the same order per lane group (see that file and norm_rows.h): two-pass in
 * float32 from each group's first value, rstd in double, the per-channel weight and bias sums in
 * float32 over LM_ROWS_FLUSH rows, then into doubles. The last Cg % 8 values of a group go
 * through masked loads and stores.
 *
 * Why: below AVX-512 F.layer_norm ran the portable double loops (norm_group.c, GN_ROW1), one
 * value at a time: ConvNeXt-tiny's LayerNorm2d took 31-33 ms of a batch-8 inference on a Zen 3
 * (2 threads) where PyTorch's native_layer_norm took 14-16 ms (torch.profiler, the same minutes).
 */
#include "cpu.h"
#include "norm_rows.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* lanes [0, min(n, 8)) on */
static inline __m256i tail8(int64_t n) {
   const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
   return _mm256_cmpgt_epi32(_mm256_set1_epi32(n >= 8 ? 8 : (int)n), idx);
}
static inline __m256 ld8(const float *p, __m256i k) { return _mm256_maskload_ps(p, k); }
static inline void st8(float *p, __m256i k, __m256 v) { _mm256_maskstore_ps(p, k, v); }
static inline __m256 on8(__m256i k, __m256 v) { return _mm256_and_ps(_mm256_castsi256_ps(k), v); }

static inline float hsum8(__m256 v) {
   __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
   s = _mm_add_ps(s, _mm_movehl_ps(s, s));
   s = _mm_add_ss(s, _mm_movehdup_ps(s));
   return _mm_cvtss_f32(s);
}

/* sum of x[0, n) - k */
static inline float v_sum(const float *x, int64_t n, float k) {
   const __m256 vk = _mm256_set1_ps(k);
   __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
   int64_t c = 0;
   for (; c + 16 <= n; c += 16) {
      a0 = _mm256_add_ps(a0, _mm256_sub_ps(_mm256_loadu_ps(x + c), vk));
      a1 = _mm256_add_ps(a1, _mm256_sub_ps(_mm256_loadu_ps(x + c + 8), vk));
   }
   for (; c < n; c += 8) {
      const __m256i m = tail8(n - c);
      a0 = _mm256_add_ps(a0, on8(m, _mm256_sub_ps(ld8(x + c, m), vk)));
   }
   return hsum8(_mm256_add_ps(a0, a1));
}

/* sum of (x - mu)^2 over x[0, n) */
static inline float v_dev2(const float *x, int64_t n, float mu) {
   const __m256 m = _mm256_set1_ps(mu);
   __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
   int64_t c = 0;
   for (; c + 16 <= n; c += 16) {
      const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + c), m);
      const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + c + 8), m);
      a0 = _mm256_fmadd_ps(d0, d0, a0);
      a1 = _mm256_fmadd_ps(d1, d1, a1);
   }
   for (; c < n; c += 8) {
      const __m256i k = tail8(n - c);
      const __m256 d = on8(k, _mm256_sub_ps(ld8(x + c, k), m));
      a0 = _mm256_fmadd_ps(d, d, a0);
   }
   return hsum8(_mm256_add_ps(a0, a1));
}

void lm_norm_rows_fwd_f32_avx2(const float *x, float *y, int64_t N, int64_t C, int64_t G,
                               const float *w, const float *b, double eps, double *gm, double *gr,
                               int nt) {
   const int64_t Cg = C / G;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
   for (int64_t n = 0; n < N; n++) {
      const float *xr = x + n * C;
      float *yr = y + n * C;
      for (int64_t gi = 0; gi < G; gi++) {
         const int64_t c0 = gi * Cg;
         const float k0 = xr[c0];
         const float mu = (float)((double)k0 + (double)v_sum(xr + c0, Cg, k0) / (double)Cg);
         const double var = (double)v_dev2(xr + c0, Cg, mu) / (double)Cg;
         const double rs = 1.0 / sqrt(var + eps);
         gm[n * G + gi] = mu;
         gr[n * G + gi] = rs;
         const __m256 m = _mm256_set1_ps(mu), r = _mm256_set1_ps((float)rs);
         int64_t c = c0;
         for (; c + 8 <= c0 + Cg; c += 8) {
            const __m256 a = _mm256_mul_ps(r, _mm256_loadu_ps(w + c));
            const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(xr + c), m);
            _mm256_storeu_ps(yr + c, _mm256_fmadd_ps(v, a, _mm256_loadu_ps(b + c)));
         }
         if (c < c0 + Cg) {
            const __m256i k = tail8(c0 + Cg - c);
            const __m256 a = _mm256_mul_ps(r, ld8(w + c, k));
            const __m256 v = _mm256_sub_ps(ld8(xr + c, k), m);
            st8(yr + c, k, _mm256_fmadd_ps(v, a, ld8(b + c, k)));
         }
      }
   }
}

void lm_norm_rows_bwd_f32_avx2(const float *x, const float *dy, float *gx, int64_t N, int64_t C,
                               int64_t G, const float *w, const double *gm, const double *gr,
                               double *pw, float *fs, int nt) {
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
            const __m256 m = _mm256_set1_ps(mu), r = _mm256_set1_ps(rs);
            __m256 sdb = _mm256_setzero_ps(), sds = _mm256_setzero_ps();
            for (int64_t c = c0; c < c0 + Cg; c += 8) {
               const __m256i k = tail8(c0 + Cg - c);
               const __m256 d = ld8(dr + c, k);
               const __m256 xc = on8(k, _mm256_sub_ps(ld8(xr + c, k), m));
               const __m256 wd = _mm256_mul_ps(ld8(w + c, k), d);
               sdb = _mm256_add_ps(sdb, wd);
               sds = _mm256_fmadd_ps(wd, xc, sds);
               st8(fb + c, k, _mm256_add_ps(ld8(fb + c, k), d));
               st8(fw + c, k, _mm256_fmadd_ps(_mm256_mul_ps(d, xc), r, ld8(fw + c, k)));
            }
            if (gx) {
               const double rsd = rs;
               const float bc = (float)(-rsd * rsd * rsd / (double)Cg * (double)hsum8(sds));
               const float dc = (float)(-rsd / (double)Cg * (double)hsum8(sdb));
               const __m256 vb = _mm256_set1_ps(bc), vd = _mm256_set1_ps(dc);
               float *gxr = gx + n * C;
               for (int64_t c = c0; c < c0 + Cg; c += 8) {
                  const __m256i k = tail8(c0 + Cg - c);
                  const __m256 d = ld8(dr + c, k);
                  const __m256 xc = _mm256_sub_ps(ld8(xr + c, k), m);
                  const __m256 a = _mm256_mul_ps(r, ld8(w + c, k));
                  st8(gxr + c, k, _mm256_fmadd_ps(a, d, _mm256_fmadd_ps(vb, xc, vd)));
               }
            }
         }
         if ((n - n0) % LM_ROWS_FLUSH == LM_ROWS_FLUSH - 1)
            lm_norm_rows_flush(fw, fb, pgw, pgb, C);
      }
      lm_norm_rows_flush(fw, fb, pgw, pgb, C);
   }
}
