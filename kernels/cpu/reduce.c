/* reduce.c -- the CPU kernel of sum, mean, prod, max, min, argmax, argmin over given dims (or all)
 * (LM_OP_REDUCE; front end: src/reduce.c, parameters: src/ops/reduce.h).
 *
 * The input is walked in its memory order (the iterator sorts dims by the input's strides), so
 * reducing H,W of an NHWC tensor runs at unit stride over C. Values accumulate in double (int64
 * for integer results) into a scratch buffer laid out densely in the input's order; the result is
 * then converted into the output, which is contiguous (as PyTorch 1.13 allocates reductions).
 *
 * Determinism: work is split either along a kept dim (each accumulator is owned by one thread and
 * sees its terms in the serial order) or, for a full reduction, into chunks whose number depends
 * only on the sizes; so results never depend on the thread count. argmax/argmin (and max/min with
 * indices) compare (value, logical index) pairs, so ties go to the first element in logical
 * (row-major) order whatever the memory order, and NaN wins as in PyTorch. */
#include "ew.h"
#include "ops/reduce.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <immintrin.h>

typedef int64_t i64;
typedef uint64_t u64;

typedef struct red_ctx {
   int op;     /* LM_SUM (also mean), LM_PROD, LM_MAX, LM_MIN */
   int vi;     /* track (value, index) pairs */
   int in_dt;  /* input dtype */
   int acc_dt; /* LM_FLOAT64 or LM_INT64 */
} red_ctx;

/* ---------------------------------------------------------------- row kernels */

static LM_CLONES void lanes_sum_f32(double *lane, const float *x, int64_t n) {
   int64_t i = 0;
   for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; l++) lane[l] += (double)x[i + l];
   for (; i < n; i++) lane[i & 7] += (double)x[i];
}

static LM_CLONES void lanes_sum_f64(double *lane, const double *x, int64_t n) {
   int64_t i = 0;
   for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; l++) lane[l] += x[i + l];
   for (; i < n; i++) lane[i & 7] += x[i];
}

static LM_CLONES void lanes_prod_f64(double *lane, const double *x, int64_t n) {
   int64_t i = 0;
   for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; l++) lane[l] *= x[i + l];
   for (; i < n; i++) lane[i & 7] *= x[i];
}

static LM_CLONES void acc_add_f32(double *acc, const float *x, int64_t n) {
   for (int64_t i = 0; i < n; i++) acc[i] += (double)x[i];
}
static LM_CLONES void acc_add_f64(double *acc, const double *x, int64_t n) {
   for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

static LM_CLONES void acc_block_f32(double *acc, const char *x, int64_t xs1, int64_t n0,
                                    int64_t n1) {
   for (int64_t r = 0; r < n1; r++) {
      const float *xr = (const float *)(x + r * xs1);
      for (int64_t j = 0; j < n0; j++) acc[j] += (double)xr[j];
   }
}
static LM_CLONES void acc_block_f64(double *acc, const char *x, int64_t xs1, int64_t n0,
                                    int64_t n1) {
   for (int64_t r = 0; r < n1; r++) {
      const double *xr = (const double *)(x + r * xs1);
      for (int64_t j = 0; j < n0; j++) acc[j] += xr[j];
   }
}

/* max / min of n values ignoring NaNs (SSE2: maxpd returns its second operand when either is
   NaN, so a NaN element never replaces the running value); *nan tells whether one was seen */
static double minmax_f64(const double *x, int64_t n, int is_max, int *nan) {
   __m128d a0 = _mm_set1_pd(is_max ? -INFINITY : INFINITY), a1 = a0, z = _mm_setzero_pd();
   int64_t i = 0;
   if (is_max) {
      for (; i + 4 <= n; i += 4) {
         __m128d v0 = _mm_loadu_pd(x + i), v1 = _mm_loadu_pd(x + i + 2);
         z = _mm_or_pd(z, _mm_or_pd(_mm_cmpunord_pd(v0, v0), _mm_cmpunord_pd(v1, v1)));
         a0 = _mm_max_pd(v0, a0);
         a1 = _mm_max_pd(v1, a1);
      }
      a0 = _mm_max_pd(a0, a1);
   } else {
      for (; i + 4 <= n; i += 4) {
         __m128d v0 = _mm_loadu_pd(x + i), v1 = _mm_loadu_pd(x + i + 2);
         z = _mm_or_pd(z, _mm_or_pd(_mm_cmpunord_pd(v0, v0), _mm_cmpunord_pd(v1, v1)));
         a0 = _mm_min_pd(v0, a0);
         a1 = _mm_min_pd(v1, a1);
      }
      a0 = _mm_min_pd(a0, a1);
   }
   double l[2];
   _mm_storeu_pd(l, a0);
   int seen = _mm_movemask_pd(z) != 0;
   double b = is_max ? (l[0] > l[1] ? l[0] : l[1]) : (l[0] < l[1] ? l[0] : l[1]);
   for (; i < n; i++) {
      if (x[i] != x[i]) seen = 1;
      else if (is_max ? x[i] > b : x[i] < b) b = x[i];
   }
   *nan = seen;
   return b;
}

static double minmax_f32(const float *x, int64_t n, int is_max, int *nan) {
   __m128 a0 = _mm_set1_ps(is_max ? -INFINITY : INFINITY), a1 = a0, z = _mm_setzero_ps();
   int64_t i = 0;
   if (is_max) {
      for (; i + 8 <= n; i += 8) {
         __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
         z = _mm_or_ps(z, _mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)));
         a0 = _mm_max_ps(v0, a0);
         a1 = _mm_max_ps(v1, a1);
      }
      a0 = _mm_max_ps(a0, a1);
   } else {
      for (; i + 8 <= n; i += 8) {
         __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
         z = _mm_or_ps(z, _mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)));
         a0 = _mm_min_ps(v0, a0);
         a1 = _mm_min_ps(v1, a1);
      }
      a0 = _mm_min_ps(a0, a1);
   }
   float l[4];
   _mm_storeu_ps(l, a0);
   int seen = _mm_movemask_ps(z) != 0;
   float b = l[0];
   for (int k = 1; k < 4; k++)
      if (is_max ? l[k] > b : l[k] < b) b = l[k];
   for (; i < n; i++) {
      if (x[i] != x[i]) seen = 1;
      else if (is_max ? x[i] > b : x[i] < b) b = x[i];
   }
   *nan = seen;
   return b;
}

static double tree8(const double *l) {
   return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
static double tree8_mul(const double *l) {
   return ((l[0] * l[1]) * (l[2] * l[3])) * ((l[4] * l[5]) * (l[6] * l[7]));
}

/* (v, i) better than (bv, bi)? ties and equal NaNs go to the smaller logical index */
static inline int better_d(int is_max, double v, i64 i, double bv, i64 bi) {
   if (v != v) return bv == bv || i < bi;
   if (bv != bv) return 0;
   if (is_max ? v > bv : v < bv) return 1;
   return v == bv && i < bi;
}
static inline int better_i(int is_max, i64 v, i64 i, i64 bv, i64 bi) {
   if (is_max ? v > bv : v < bv) return 1;
   return v == bv && i < bi;
}

/* fetch elements [j, j+m) of the row as the accumulator type */
static const char *fetch(const red_ctx *c, char *buf, const char *p, int64_t s, int64_t j,
                         int64_t m) {
   if (c->in_dt == c->acc_dt && s == 8) return p + j * s;
   lm_convert(c->acc_dt, buf, 8, c->in_dt, p + j * s, s, m);
   return buf;
}

/* one row of n elements: p[0] input, p[1] accumulator, p[2] index accumulator, p[3] logical
   index (an integer); s[] their strides */
static void red_row(const red_ctx *c, char *const *p, const int64_t *s, int64_t n) {
   _Alignas(64) char buf[LM_CHUNK * 8];
   const int is_max = c->op == LM_MAX;
   const int dbl = c->acc_dt == LM_FLOAT64;
   if (s[1] == 0) { /* the whole row reduces into one accumulator */
      if (c->vi) {
         i64 li = (i64)(uintptr_t)p[3], ls = s[3];
         i64 *bi = (i64 *)p[2];
         for (int64_t j = 0; j < n; j += LM_CHUNK) {
            int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
            const char *x = fetch(c, buf, p[0], s[0], j, m);
            if (dbl) {
               double *bv = (double *)p[1];
               const double *xv = (const double *)x;
               for (int64_t i = 0; i < m; i++) {
                  i64 idx = li + (j + i) * ls;
                  if (better_d(is_max, xv[i], idx, *bv, *bi)) {
                     *bv = xv[i];
                     *bi = idx;
                  }
               }
            } else {
               i64 *bv = (i64 *)p[1];
               const i64 *xv = (const i64 *)x;
               for (int64_t i = 0; i < m; i++) {
                  i64 idx = li + (j + i) * ls;
                  if (better_i(is_max, xv[i], idx, *bv, *bi)) {
                     *bv = xv[i];
                     *bi = idx;
                  }
               }
            }
         }
         return;
      }
      if (dbl) {
         double *acc = (double *)p[1];
         if (c->op == LM_SUM) {
            double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (c->in_dt == LM_FLOAT32 && s[0] == 4) {
               lanes_sum_f32(lane, (const float *)p[0], n);
            } else if (c->in_dt == LM_FLOAT64 && s[0] == 8) {
               lanes_sum_f64(lane, (const double *)p[0], n);
            } else {
               for (int64_t j = 0; j < n; j += LM_CHUNK) {
                  int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
                  lanes_sum_f64(lane, (const double *)fetch(c, buf, p[0], s[0], j, m), m);
               }
            }
            *acc += tree8(lane);
         } else if (c->op == LM_PROD) {
            double lane[8] = {1, 1, 1, 1, 1, 1, 1, 1};
            for (int64_t j = 0; j < n; j += LM_CHUNK) {
               int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
               lanes_prod_f64(lane, (const double *)fetch(c, buf, p[0], s[0], j, m), m);
            }
            *acc *= tree8_mul(lane);
         } else {
            double b = *acc;
            int nan = b != b;
            int64_t j = 0;
            while (j < n && !nan) {
               int64_t m;
               double r;
               if (c->in_dt == LM_FLOAT32 && s[0] == 4) { /* the whole row at once */
                  m = n - j;
                  r = minmax_f32((const float *)(p[0] + j * s[0]), m, is_max, &nan);
               } else {
                  m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
                  r = minmax_f64((const double *)fetch(c, buf, p[0], s[0], j, m), m, is_max, &nan);
               }
               if (nan) b = NAN;
               else if (is_max ? r > b : r < b) b = r;
               j += m;
            }
            *acc = b;
         }
      } else {
         i64 *acc = (i64 *)p[1];
         u64 r = (u64)*acc;
         i64 b = *acc;
         for (int64_t j = 0; j < n; j += LM_CHUNK) {
            int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
            const i64 *x = (const i64 *)fetch(c, buf, p[0], s[0], j, m);
            if (c->op == LM_SUM) {
               for (int64_t i = 0; i < m; i++) r += (u64)x[i];
            } else if (c->op == LM_PROD) {
               for (int64_t i = 0; i < m; i++) r *= (u64)x[i];
            } else if (is_max) {
               for (int64_t i = 0; i < m; i++) b = x[i] > b ? x[i] : b;
            } else {
               for (int64_t i = 0; i < m; i++) b = x[i] < b ? x[i] : b;
            }
         }
         *acc = (c->op == LM_SUM || c->op == LM_PROD) ? (i64)r : b;
      }
      return;
   }
   /* a kept dim: accumulator j takes element j */
   const int64_t as = s[1];
   for (int64_t j = 0; j < n; j += LM_CHUNK) {
      int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
      char *accp = p[1] + j * as;
      if (dbl && c->op == LM_SUM && !c->vi && as == 8 && c->in_dt == LM_FLOAT32 && s[0] == 4) {
         acc_add_f32((double *)accp, (const float *)(p[0] + j * s[0]), m);
         continue;
      }
      const char *x = fetch(c, buf, p[0], s[0], j, m);
      if (c->vi) {
         i64 li = (i64)(uintptr_t)p[3];
         char *bip = p[2] + j * s[2];
         for (int64_t i = 0; i < m; i++) {
            i64 *bi = (i64 *)(bip + i * s[2]);
            if (dbl) {
               double *bv = (double *)(accp + i * as), v = ((const double *)x)[i];
               if (better_d(is_max, v, li, *bv, *bi)) {
                  *bv = v;
                  *bi = li;
               }
            } else {
               i64 *bv = (i64 *)(accp + i * as), v = ((const i64 *)x)[i];
               if (better_i(is_max, v, li, *bv, *bi)) {
                  *bv = v;
                  *bi = li;
               }
            }
         }
         continue;
      }
      if (dbl) {
         const double *xv = (const double *)x;
         if (c->op == LM_SUM && as == 8) {
            acc_add_f64((double *)accp, xv, m);
         } else {
            for (int64_t i = 0; i < m; i++) {
               double *a = (double *)(accp + i * as), v = xv[i];
               if (c->op == LM_SUM) *a += v;
               else if (c->op == LM_PROD) *a *= v;
               else if (v != v || (is_max ? v > *a : v < *a)) *a = *a != *a ? *a : v;
            }
         }
      } else {
         const i64 *xv = (const i64 *)x;
         for (int64_t i = 0; i < m; i++) {
            i64 *a = (i64 *)(accp + i * as), v = xv[i];
            if (c->op == LM_SUM) *a = (i64)((u64)*a + (u64)v);
            else if (c->op == LM_PROD) *a = (i64)((u64)*a * (u64)v);
            else if (is_max ? v > *a : v < *a) *a = v;
         }
      }
   }
}

/* every row of the (sub-)iterator, in order */
static void red_rows(const red_ctx *c, const lm_iter *it) {
   if (it->numel <= 0) return;
   const int nd = it->ndim, nops = it->nops;
   const int64_t n0 = it->shape[0], outer = it->numel / n0;
   int64_t idx[LM_MAX_DIMS] = {0};
   uintptr_t ptr[LM_ITER_MAX_OPS];
   char *dp[LM_ITER_MAX_OPS];
   int64_t inner[LM_ITER_MAX_OPS] = {0};
   for (int k = 0; k < nops; k++) {
      ptr[k] = it->base[k];
      inner[k] = it->strides[k][0];
   }
   /* a kept inner dim under a reduced dim (sum over H, W of NHWC): whole blocks at once */
   const int es = lm_dtype_size(c->in_dt);
   if (nd >= 2 && !c->vi && c->op == LM_SUM && c->acc_dt == LM_FLOAT64 && inner[1] == 8 &&
       it->strides[1][1] == 0 && inner[0] == es &&
       (c->in_dt == LM_FLOAT32 || c->in_dt == LM_FLOAT64)) {
      const int64_t n1 = it->shape[1], xs1 = it->strides[0][1];
      for (int64_t o = 0; o < outer / n1; o++) {
         if (c->in_dt == LM_FLOAT32) acc_block_f32((double *)ptr[1], (const char *)ptr[0], xs1, n0, n1);
         else acc_block_f64((double *)ptr[1], (const char *)ptr[0], xs1, n0, n1);
         for (int d = 2; d < nd; d++) {
            idx[d]++;
            for (int k = 0; k < nops; k++) ptr[k] += (uintptr_t)it->strides[k][d];
            if (idx[d] < it->shape[d]) break;
            idx[d] = 0;
            for (int k = 0; k < nops; k++) ptr[k] -= (uintptr_t)(it->shape[d] * it->strides[k][d]);
         }
      }
      return;
   }
   for (int64_t o = 0; o < outer; o++) {
      for (int k = 0; k < nops; k++) dp[k] = (char *)ptr[k];
      red_row(c, dp, inner, n0);
      for (int d = 1; d < nd; d++) {
         idx[d]++;
         for (int k = 0; k < nops; k++) ptr[k] += (uintptr_t)it->strides[k][d];
         if (idx[d] < it->shape[d]) break;
         idx[d] = 0;
         for (int k = 0; k < nops; k++) ptr[k] -= (uintptr_t)(it->shape[d] * it->strides[k][d]);
      }
   }
}

/* restrict iteration dim d to [b, e) */
static void sub_iter(lm_iter *sub, const lm_iter *it, int d, int64_t b, int64_t e) {
   *sub = *it;
   sub->shape[d] = e - b;
   for (int k = 0; k < it->nops; k++) sub->base[k] += (uintptr_t)(b * it->strides[k][d]);
   sub->numel = it->numel / it->shape[d] * (e - b);
}

static void init_acc(const red_ctx *c, char *acc, i64 *idx, int64_t n) {
   for (int64_t i = 0; i < n; i++) {
      if (c->acc_dt == LM_FLOAT64) {
         double v = c->op == LM_PROD ? 1.0 : c->op == LM_MAX ? -INFINITY : c->op == LM_MIN ? INFINITY : 0.0;
         ((double *)acc)[i] = v;
      } else {
         i64 v = c->op == LM_PROD ? 1 : c->op == LM_MAX ? INT64_MIN : c->op == LM_MIN ? INT64_MAX : 0;
         ((i64 *)acc)[i] = v;
      }
      if (idx) idx[i] = INT64_MAX;
   }
}

/* fold partial (v, i) into (acc, idx) */
static void combine(const red_ctx *c, char *acc, i64 *idx, const char *pv, const i64 *pi) {
   const int is_max = c->op == LM_MAX;
   if (c->acc_dt == LM_FLOAT64) {
      double *a = (double *)acc, v = *(const double *)pv;
      if (c->vi) {
         if (better_d(is_max, v, *pi, *a, *idx)) {
            *a = v;
            *idx = *pi;
         }
      } else if (c->op == LM_SUM) {
         *a += v;
      } else if (c->op == LM_PROD) {
         *a *= v;
      } else if (v != v || (is_max ? v > *a : v < *a)) {
         *a = *a != *a ? *a : v;
      }
   } else {
      i64 *a = (i64 *)acc, v = *(const i64 *)pv;
      if (c->vi) {
         if (better_i(is_max, v, *pi, *a, *idx)) {
            *a = v;
            *idx = *pi;
         }
      } else if (c->op == LM_SUM) {
         *a = (i64)((u64)*a + (u64)v);
      } else if (c->op == LM_PROD) {
         *a = (i64)((u64)*a * (u64)v);
      } else if (is_max ? v > *a : v < *a) {
         *a = v;
      }
   }
}

enum { MAX_CHUNKS = 64, CHUNK_WORK = 65536 };

/* acc / idx: the accumulators the iterator's operands 1 and 2 point at */
/* float32 column sums: the kept dim innermost and contiguous, the one other (coalesced) dim
   reduced: sum over the rows of an (M, C) matrix, or over N, H, W of a channels-last tensor
   (bias and layer-scale gradients). Split over the kept columns (the general path) each thread
   read part of every row: 10-17 GB/s on the Intel Xeon of session 25 where PyTorch read 25-38.
   Here fixed chunks of rows (their number from the sizes alone, so the bits do not depend on the
   thread count) each sum all columns into their own doubles, added in chunk order. Returns 0
   when the call is not of that shape (or no scratch): the general path runs. */
static int colsum_f32(const red_ctx *c, const lm_iter *it, double *acc) {
   if (it->ndim != 2 || c->vi || c->op != LM_SUM || c->acc_dt != LM_FLOAT64 ||
       c->in_dt != LM_FLOAT32 || it->strides[0][0] != 4 || it->strides[1][0] != 8 ||
       it->strides[1][1] != 0)
      return 0;
   const int64_t n0 = it->shape[0], n1 = it->shape[1], xs1 = it->strides[0][1];
   int64_t nch = it->numel / (4 * CHUNK_WORK);
   if (nch > MAX_CHUNKS) nch = MAX_CHUNKS;
   if (nch > n1) nch = n1;
   if (nch < 2) return 0;
   double *part = calloc((size_t)(nch * n0), sizeof(double));
   if (!part) return 0;
   int nt = lm_iter_threads(it->numel);
   if (nt > nch) nt = (int)nch;
   const char *x = (const char *)it->base[0];
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t ch = 0; ch < nch; ch++) {
      const int64_t r0 = n1 * ch / nch, r1 = n1 * (ch + 1) / nch;
      acc_block_f32(part + ch * n0, x + r0 * xs1, xs1, n0, r1 - r0);
   }
   for (int64_t ch = 0; ch < nch; ch++) acc_add_f64(acc, part + ch * n0, n0);
   free(part);
   return 1;
}

static void red_run(const red_ctx *c, const lm_iter *it, char *acc, i64 *idx) {
   const int nd = it->ndim;
   if (colsum_f32(c, it, (double *)acc)) return;
   int P = -1;
   for (int d = nd - 1; d >= 0; d--)
      if (it->strides[1][d] != 0) {
         P = d;
         break;
      }
   int nt = lm_iter_threads(it->numel);
   if (P >= 0) {
      int64_t len = it->shape[P];
      if (nt > len) nt = (int)len;
      if (nt <= 1) {
         red_rows(c, it);
         return;
      }
#pragma omp parallel num_threads(nt)
      {
         int t = omp_get_thread_num(), T = omp_get_num_threads();
         int64_t b = len * t / T, e = len * (t + 1) / T;
         if (b < e) {
            lm_iter sub;
            sub_iter(&sub, it, P, b, e);
            red_rows(c, &sub);
         }
      }
      return;
   }
   /* a full reduction: fixed chunks of the outermost dim, folded in order */
   const int R = nd - 1;
   int64_t len = it->shape[R];
   int64_t nch = (it->numel + CHUNK_WORK - 1) / CHUNK_WORK;
   if (nch > MAX_CHUNKS) nch = MAX_CHUNKS;
   if (nch > len) nch = len;
   if (nch <= 1) {
      red_rows(c, it);
      return;
   }
   double pv[MAX_CHUNKS]; /* 8 bytes each: double or int64 */
   i64 pi[MAX_CHUNKS];
   init_acc(c, (char *)pv, pi, nch);
   if (nt > nch) nt = (int)nch;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t ch = 0; ch < nch; ch++) {
      lm_iter sub;
      sub_iter(&sub, it, R, len * ch / nch, len * (ch + 1) / nch);
      sub.base[1] = (uintptr_t)&pv[ch];
      if (c->vi) sub.base[2] = (uintptr_t)&pi[ch];
      red_rows(c, &sub);
   }
   for (int64_t ch = 0; ch < nch; ch++) combine(c, acc, idx, (const char *)&pv[ch], &pi[ch]);
}

/* ---------------------------------------------------------------- the kernel */

/* REDUCE: t = {input, out, indices (NULL: none)} (ops/reduce.h) */
static lm_status k_reduce(const lm_op *op_) {
   const lm_reduce_params *q = op_->params;
   const lm_tensor *a = op_->t[0];
   lm_tensor *o = op_->t[1], *oi = op_->t[2];
   const int op = q->op, arg = q->arg, keepdim = q->keepdim, want_idx = q->want_idx;
   const int nd = a->ndim;
   const int *red = q->red;
   int64_t keep_sz[LM_MAX_DIMS], count = 1;
   for (int d = 0; d < nd; d++) {
      keep_sz[d] = red[d] ? 1 : a->sizes[d];
      if (red[d]) count *= a->sizes[d];
   }
   const int rdt = q->rdt;
   /* accumulators: dense over the kept dims, in the input's memory order */
   red_ctx c;
   c.op = (op == LM_MEAN) ? LM_SUM : arg ? (op == LM_ARGMAX ? LM_MAX : LM_MIN) : op;
   c.vi = want_idx;
   c.in_dt = a->dtype;
   if (op == LM_MAX || op == LM_MIN || arg) c.acc_dt = lm_is_float_dtype(a->dtype) ? LM_FLOAT64 : LM_INT64;
   else c.acc_dt = lm_is_float_dtype(rdt) ? LM_FLOAT64 : LM_INT64;
   const int64_t onumel = lm_numel_of(nd, keep_sz);
   int64_t acc_st[LM_MAX_DIMS];
   lm_infer_dense_strides(nd, keep_sz, a->strides, acc_st);
   char *acc = malloc((size_t)(onumel > 0 ? onumel : 1) * 8);
   i64 *idx = c.vi ? malloc((size_t)(onumel > 0 ? onumel : 1) * 8) : NULL;
   if (!acc || (c.vi && !idx)) {
      free(acc);
      free(idx);
      return lm_error(LM_ERR_OOM, "out of memory");
   }
   init_acc(&c, acc, idx, onumel);

   if (a->numel > 0 && onumel > 0) {
      lm_operand ops[4];
      int nops = 2;
      lm_operand_tensor(&ops[0], a);
      lm_operand_set(&ops[1], acc, c.acc_dt, nd, keep_sz, acc_st);
      if (c.vi) {
         int64_t li_st[LM_MAX_DIMS], rs = 1;
         for (int d = nd - 1; d >= 0; d--) {
            li_st[d] = red[d] ? rs : 0;
            if (red[d]) rs *= a->sizes[d];
         }
         lm_operand_set(&ops[2], idx, LM_INT64, nd, keep_sz, acc_st);
         lm_operand_set(&ops[3], NULL, LM_DT_INDEX, nd, a->sizes, li_st);
         nops = 4;
      }
      lm_iter it;
      lm_iter_init(&it, nops, ops, nd, a->sizes);
      red_run(&c, &it, acc, idx);
   }
   if (op == LM_MEAN) {
      double *ad = (double *)acc;
      for (int64_t i = 0; i < onumel; i++) ad[i] /= (double)count;
   }

   /* results: the out tensors seen with the keepdim shape */
   lm_operand src, dst;
   int64_t ost[LM_MAX_DIMS];
   lm_status st = LM_OK;
   lm_operand_set(&src, arg ? (char *)idx : acc, arg ? LM_INT64 : c.acc_dt, nd, keep_sz, acc_st);
   for (int d = 0, j = 0; d < nd; d++) ost[d] = (!red[d] || keepdim) ? o->strides[j++] : 0;
   lm_operand_set(&dst, lm_tensor_data(o), o->dtype, nd, keep_sz, ost);
   st = lm_cpu_copy_operands(&dst, &src);
   if (st == LM_OK && oi && !arg) {
      for (int d = 0, j = 0; d < nd; d++) ost[d] = (!red[d] || keepdim) ? oi->strides[j++] : 0;
      lm_operand_set(&src, (char *)idx, LM_INT64, nd, keep_sz, acc_st);
      lm_operand_set(&dst, lm_tensor_data(oi), LM_INT64, nd, keep_sz, ost);
      st = lm_cpu_copy_operands(&dst, &src);
   }
   free(acc);
   free(idx);
   return st;
}

/* CAT: t = {out, in_0, .., in_{n-1}} (ops/reduce.h): each input copied into its slice of out */
static lm_status k_cat(const lm_op *op) {
   const lm_cat_params *q = op->params;
   const int n = op->nt - 1, dim = q->dim;
   lm_tensor *o = op->t[0];
   const lm_tensor *const *ts = (const lm_tensor *const *)op->t + 1;
   const int nd = o->ndim;
   lm_operand oo;
   lm_operand_tensor(&oo, o);
   for (int i = 0; i < n; i++) {
      lm_operand ti;
      lm_operand_tensor(&ti, ts[i]);
      if (lm_operands_overlap(&oo, &ti))
         return lm_error(LM_ERR_ARG,
                         "unsupported operation: the input tensors cannot refer to any of the "
                         "output memory locations");
   }
   int64_t off = 0;
   const int64_t es = lm_dtype_size(o->dtype);
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = ts[i];
      if (t->ndim == 1 && t->sizes[0] == 0) continue;
      int64_t len = t->sizes[dim];
      if (len > 0 && t->numel > 0) {
         lm_operand dst = oo, src;
         dst.sizes[dim] = len;
         dst.data = oo.data + off * oo.strides[dim] * es;
         dst.flags = lm_layout_flags(nd, dst.sizes, dst.strides);
         lm_operand_tensor(&src, t);
         LM_TRY(lm_cpu_copy_operands(&dst, &src));
      }
      off += len;
   }
   return LM_OK;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_reduce(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_REDUCE] = k_reduce;
   table[LM_OP_CAT] = k_cat;
}
