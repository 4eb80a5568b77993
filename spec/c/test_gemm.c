/* test_gemm.c -- lumen's GEMM (lm_sgemm, lm_dgemm, ISA selection) and lm_matmul against naive
 * double-accumulated references, for every ISA path the CPU has (forced with lm_gemm_set_isa).
 * A standalone program: prints "N passed, N failed" and exits non-zero on any failure.
 *
 * Against the library (after `make`; also runs the lm_matmul tests):
 *   cc -O2 -fopenmp -Isrc spec/c/test_gemm.c -Lbuild -llumen -Wl,-rpath,$PWD/build -lm \
 *      -o /tmp/test_gemm && /tmp/test_gemm
 * Standalone, GEMM core only (no tensor API needed):
 *   cc -O2 -fopenmp -Isrc -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma \
 *      -c kernels/cpu/gemm_avx512.c -o /tmp/gemm_avx512.o
 *   cc -O2 -fopenmp -Isrc -mavx2 -mfma -c kernels/cpu/gemm_avx2.c -o /tmp/gemm_avx2.o
 *   cc -O2 -fopenmp -Isrc -DLM_GEMM_STANDALONE spec/c/test_gemm.c kernels/cpu/gemm.c \
 *      /tmp/gemm_avx512.o /tmp/gemm_avx2.o -lm -o /tmp/test_gemm && /tmp/test_gemm
 * Options: -q (quiet: failures and the summary only).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "lumen.h"

#ifdef LM_GEMM_STANDALONE
void *lm_alloc(size_t nbytes) { return aligned_alloc(64, (nbytes + 63) / 64 * 64); }
void lm_free(void *p, size_t nbytes) { (void)nbytes; free(p); }
void lm_clear_error(void) {}
lm_status lm_error(lm_status st, const char *fmt, ...) { (void)fmt; return st; }
#endif

static int g_pass, g_fail, g_quiet;

static void check(int ok, const char *fmt, ...) {
   if (ok) {
      g_pass++;
      return;
   }
   g_fail++;
   va_list ap;
   va_start(ap, fmt);
   fprintf(stderr, "FAIL: ");
   vfprintf(stderr, fmt, ap);
   fprintf(stderr, "\n");
   va_end(ap);
}

/* xorshift, deterministic */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double rnd(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static const int64_t SIZES[] = {1, 3, 7, 17, 64, 100, 257};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0] };

static const double ALPHAS[] = {1.0, 0.5, 1.0, -1.5, 2.0, 0.0, 1.0};
static const double BETAS[] = {0.0, 0.0, 1.0, 0.25, -1.0, 0.5, 0.0};
enum { NAB = sizeof ALPHAS / sizeof ALPHAS[0] };

/* Compare C against alpha * op(A) op(B) + beta * C0 computed in double; the bound is the usual
 * gamma_k error of a k-term dot product scaled by the magnitudes involved. Generic over float and
 * double through `is_double`. */
static int verify(int is_double, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                  const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                  const double *c0, const void *c, int64_t ldc, double *max_err) {
   const double eps = is_double ? 1.1102230246251565e-16 : 5.960464477539063e-08;
   *max_err = 0;
   for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
         double s = 0, sa = 0;
         for (int64_t p = 0; p < k; p++) {
            int64_t ia = ta ? p * lda + i : i * lda + p, ib = tb ? j * ldb + p : p * ldb + j;
            double x = is_double ? ((const double *)a)[ia] : ((const float *)a)[ia];
            double y = is_double ? ((const double *)b)[ib] : ((const float *)b)[ib];
            s += x * y;
            sa += fabs(x * y);
         }
         double ref = (alpha == 0 ? 0 : alpha * s) + (beta == 0 ? 0 : beta * c0[i * ldc + j]);
         double mag = fabs(alpha) * sa + fabs(beta) * (beta == 0 ? 0 : fabs(c0[i * ldc + j]));
         double got = is_double ? ((const double *)c)[i * ldc + j] : ((const float *)c)[i * ldc + j];
         double err = fabs(got - ref);
         double tol = 2.0 * (double)(k + 4) * eps * mag + 1e-30;
         if (!(err <= tol)) { /* also catches NaN */
            *max_err = isnan(got) ? INFINITY : err / (mag > 0 ? mag : 1);
            return 0;
         }
         if (mag > 0 && err / mag > *max_err) *max_err = err / mag;
      }
   return 1;
}

/* one GEMM case: random operands with (sometimes) padded leading dims; beta == 0 cases start from
 * a C full of NaN, which must not leak into the result */
static void gemm_case(int is_double, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                      double beta, int pad, const char *tag) {
   int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
   int64_t lda = ac + pad, ldb = bc + 2 * pad, ldc = n + 3 * pad;
   size_t es = is_double ? 8 : 4;
   size_t na = (size_t)(ar * lda + 1), nb = (size_t)(br * ldb + 1), nc = (size_t)(m * ldc + 1);
   void *a = malloc(na * es), *b = malloc(nb * es), *c = malloc(nc * es);
   double *c0 = malloc(nc * sizeof(double));
   for (size_t i = 0; i < na; i++) {
      double v = rnd();
      if (is_double) ((double *)a)[i] = v; else ((float *)a)[i] = (float)v;
   }
   for (size_t i = 0; i < nb; i++) {
      double v = rnd();
      if (is_double) ((double *)b)[i] = v; else ((float *)b)[i] = (float)v;
   }
   for (size_t i = 0; i < nc; i++) {
      double v = beta == 0 ? NAN : rnd();
      if (is_double) ((double *)c)[i] = v; else ((float *)c)[i] = (float)v;
      c0[i] = is_double ? ((double *)c)[i] : ((float *)c)[i];
   }
   if (is_double)
      lm_dgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
   else
      lm_sgemm(ta, tb, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c, ldc);
   double err;
   int ok = verify(is_double, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, c, ldc, &err);
   /* the padding between rows of C must be untouched */
   for (int64_t i = 0; ok && i < m; i++)
      for (int64_t j = n; j < ldc && (i + 1 < m || j < n); j++) {
         double got = is_double ? ((double *)c)[i * ldc + j] : ((float *)c)[i * ldc + j];
         if (!(got == c0[i * ldc + j] || (isnan(got) && isnan(c0[i * ldc + j])))) ok = 0;
      }
   check(ok, "%s %cgemm %c%c m=%lld n=%lld k=%lld alpha=%g beta=%g pad=%d rel.err=%g", tag,
         is_double ? 'd' : 's', ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
         (long long)k, alpha, beta, pad, err);
   free(a);
   free(b);
   free(c);
   free(c0);
}

static void test_isa_selection(void) {
   int best = lm_gemm_set_isa(0);
   check(best >= LM_ISA_C && best <= LM_ISA_MAX, "auto ISA in 1..%d (got %d)", LM_ISA_MAX, best);
   check(lm_gemm_isa() == best, "lm_gemm_isa after auto");
   check(lm_gemm_set_isa(1) == 1, "portable C can always be forced");
   check(lm_gemm_isa() == 1, "lm_gemm_isa after forcing 1");
   int two = lm_gemm_set_isa(2);
   check(two == (best >= 2 ? 2 : 1), "forcing AVX2 gives %d", two);
   int three = lm_gemm_set_isa(3);
   check(three == (best < 3 ? best : 3), "forcing AVX-512 gives the best supported up to 3 "
         "(%d, best %d)", three, best);
   check(lm_gemm_set_isa(17) == three, "out-of-range ISA changes nothing");
   check(lm_gemm_set_isa(-1) == three, "negative ISA changes nothing");
   check(lm_gemm_set_isa(0) == best, "back to auto");
}

static void test_gemm_isa(int isa) {
   static const char *names[] = {"auto", "C", "AVX2", "AVX-512"};
   int got = lm_gemm_set_isa(isa);
   if (got != isa) {
      if (!g_quiet) printf("ISA %s not supported here, skipped\n", names[isa]);
      lm_gemm_set_isa(0);
      return;
   }
   int before = g_fail, count = 0;
   int v = 0;
   for (int im = 0; im < NSIZES; im++)
      for (int in = 0; in < NSIZES; in++)
         for (int ik = 0; ik < NSIZES; ik++)
            for (int tr = 0; tr < 4; tr++) {
               /* at most one dimension of 257 (the reference is slow), except 257^3 itself */
               int big = (im == NSIZES - 1) + (in == NSIZES - 1) + (ik == NSIZES - 1);
               if (big == 2 || (big == 3 && (tr == 1 || tr == 2))) continue;
               int ab = v % NAB, pad = (v / NAB) % 3 == 2 ? 5 : 0;
               gemm_case(0, tr >> 1, tr & 1, SIZES[im], SIZES[in], SIZES[ik], ALPHAS[ab],
                         BETAS[ab], pad, names[isa]);
               v++;
               count++;
            }
   /* double: every trans combo and alpha/beta variant on a smaller grid */
   static const int64_t DS[] = {1, 3, 17, 64, 100};
   for (int im = 0; im < 5; im++)
      for (int in = 0; in < 5; in++)
         for (int ik = 0; ik < 5; ik++)
            for (int tr = 0; tr < 4; tr++) {
               int ab = v % NAB, pad = (v / NAB) % 3 == 1 ? 3 : 0;
               gemm_case(1, tr >> 1, tr & 1, DS[im], DS[in], DS[ik], ALPHAS[ab], BETAS[ab], pad,
                         names[isa]);
               v++;
               count++;
            }
   /* shapes that cross the blocking sizes (KC, MC, NC) and the thread split; the last two read
      B in place (few rows, B by rows: gemm_tmpl.c b_inplace) with a partial last micro-panel,
      split by columns and by rows over many k blocks */
   static const int64_t BIG[][3] = {{300, 417, 270}, {1, 1000, 300}, {1000, 1, 300},
                                    {33, 4200, 20}, {700, 70, 530}, {16, 16, 2000},
                                    {40, 1003, 300}, {384, 97, 3000}};
   for (int s = 0; s < 8; s++)
      for (int tr = 0; tr < 4; tr++)
         for (int dbl = 0; dbl < 2; dbl++) {
            if (dbl && ((tr + s) & 1)) continue; /* double: two of the four trans combos */
            int ab = v % NAB;
            gemm_case(dbl, tr >> 1, tr & 1, BIG[s][0], BIG[s][1], BIG[s][2], ALPHAS[ab],
                      BETAS[ab], tr == 3 ? 1 : 0, names[isa]);
            v++;
            count++;
         }
   if (!g_quiet)
      printf("ISA %-8s %d cases, %d failed\n", names[isa], count, g_fail - before);
   lm_gemm_set_isa(0);
}

/* degenerate sizes: nothing happens for m == 0 / n == 0; k == 0 gives C = beta * C */
static void test_degenerate(void) {
   float c[6] = {1, 2, 3, 4, 5, 6}, a[1] = {7}, b[1] = {8};
   lm_sgemm(0, 0, 0, 3, 2, 1.0f, a, 2, b, 3, 0.0f, c, 3);
   lm_sgemm(0, 0, 2, 0, 2, 1.0f, a, 2, b, 3, 0.0f, c, 3);
   check(c[0] == 1 && c[5] == 6, "m == 0 / n == 0 leave C alone");
   lm_sgemm(0, 0, 2, 3, 0, 1.0f, a, 1, b, 3, 2.0f, c, 3);
   check(c[0] == 2 && c[5] == 12, "k == 0 scales C by beta");
   for (int i = 0; i < 6; i++) c[i] = NAN;
   lm_sgemm(0, 0, 2, 3, 0, 1.0f, a, 1, b, 3, 0.0f, c, 3);
   check(c[0] == 0 && c[5] == 0, "k == 0, beta == 0 zeroes C without reading it");
   double dc[4] = {NAN, NAN, NAN, NAN}, da[4] = {1, 2, 3, 4}, db[4] = {5, 6, 7, 8};
   lm_dgemm(0, 0, 2, 2, 2, 1.0, da, 2, db, 2, 0.0, dc, 2);
   check(dc[0] == 19 && dc[1] == 22 && dc[2] == 43 && dc[3] == 50, "2x2 dgemm exact");
}

/* 1 and 2 threads on a problem big enough to be split must agree bit for bit... not required;
 * both must be correct */
static void test_threads(void) {
   int maxt = omp_get_max_threads();
   for (int nt = 1; nt <= 2; nt++) {
      omp_set_num_threads(nt);
      gemm_case(0, 0, 0, 513, 385, 300, 1.0, 0.0, 0, nt == 1 ? "1 thread" : "2 threads");
      gemm_case(0, 0, 1, 20, 2000, 300, 1.0, 1.0, 0, nt == 1 ? "1 thread" : "2 threads");
      gemm_case(1, 1, 0, 300, 300, 300, 0.5, 0.5, 0, nt == 1 ? "1 thread" : "2 threads");
   }
   omp_set_num_threads(maxt);
   /* inside an enclosing parallel region every thread runs its own GEMM */
   int bad = 0;
#pragma omp parallel num_threads(2) reduction(+ : bad)
   {
      int64_t n = 150;
      float *a = malloc(n * n * 4), *b = malloc(n * n * 4), *c = malloc(n * n * 4);
      for (int64_t i = 0; i < n * n; i++) {
         a[i] = (float)((i * 7 % 11) - 5);
         b[i] = (float)((i * 3 % 13) - 6);
      }
      lm_sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      for (int64_t i = 0; i < n; i += 7)
         for (int64_t j = 0; j < n; j += 5) {
            double s = 0;
            for (int64_t p = 0; p < n; p++) s += (double)a[i * n + p] * b[p * n + j];
            if (c[i * n + j] != (float)s) bad++;
         }
      free(a);
      free(b);
      free(c);
   }
   check(bad == 0, "GEMMs inside a parallel region (%d wrong)", bad);
}

#ifndef LM_GEMM_STANDALONE
/* ---- lm_matmul ---- */

static lm_tensor *make(int ndim, const int64_t *sizes, int dtype) {
   lm_tensor *t = NULL;
   if (lm_empty(ndim, sizes, dtype, LM_CONTIGUOUS, LM_CPU, &t) != LM_OK) return NULL;
   int64_t n = t->numel;
   double *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
   for (int64_t i = 0; i < n; i++) buf[i] = rnd();
   lm_from_doubles(t, buf);
   free(buf);
   return t;
}

/* element of t at a linear (row-major) index of its logical shape */
static double at(const lm_tensor *t, const int64_t *idx) {
   double v = 0;
   lm_get(t, idx, &v);
   return v;
}

/* reference torch.matmul on tensors a, b (any strides) */
static int ref_matmul_check(const lm_tensor *a, const lm_tensor *b, const lm_tensor *out,
                            double tol) {
   int na = a->ndim, nb = b->ndim;
   /* promote 1-D operands */
   int64_t m = na == 1 ? 1 : a->sizes[na - 2], k = a->sizes[na - 1];
   int64_t n = nb == 1 ? 1 : b->sizes[nb - 1];
   int64_t kb = nb == 1 ? b->sizes[0] : b->sizes[nb - 2];
   if (k != kb) return 0;
   int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0;
   int bo = ba > bb ? ba : bb;
   int64_t bsz[LM_MAX_DIMS];
   for (int d = 0; d < bo; d++) {
      int64_t sa = d - (bo - ba) >= 0 ? a->sizes[d - (bo - ba)] : 1;
      int64_t sb = d - (bo - bb) >= 0 ? b->sizes[d - (bo - bb)] : 1;
      bsz[d] = sa == 1 ? sb : sa;
   }
   /* expected output shape */
   int64_t osz[LM_MAX_DIMS];
   int on = 0;
   for (int d = 0; d < bo; d++) osz[on++] = bsz[d];
   if (na > 1) osz[on++] = m;
   if (nb > 1) osz[on++] = n;
   if (out->ndim != on) return 0;
   for (int d = 0; d < on; d++)
      if (out->sizes[d] != osz[d]) return 0;
   int64_t nbatch = 1;
   for (int d = 0; d < bo; d++) nbatch *= bsz[d];
   for (int64_t bi = 0; bi < nbatch; bi++) {
      int64_t bidx[LM_MAX_DIMS], r = bi;
      for (int d = bo - 1; d >= 0; d--) {
         bidx[d] = r % bsz[d];
         r /= bsz[d];
      }
      for (int64_t i = 0; i < m; i++)
         for (int64_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
               int64_t ia[LM_MAX_DIMS], ib[LM_MAX_DIMS];
               for (int d = 0; d < ba; d++) {
                  int64_t sz = a->sizes[d];
                  ia[d] = sz == 1 ? 0 : bidx[d + (bo - ba)];
               }
               for (int d = 0; d < bb; d++) {
                  int64_t sz = b->sizes[d];
                  ib[d] = sz == 1 ? 0 : bidx[d + (bo - bb)];
               }
               if (na == 1) {
                  ia[0] = p;
               } else {
                  ia[na - 2] = i;
                  ia[na - 1] = p;
               }
               if (nb == 1) {
                  ib[0] = p;
               } else {
                  ib[nb - 2] = p;
                  ib[nb - 1] = j;
               }
               double x = at(a, ia), y = at(b, ib);
               s += x * y;
               mag += fabs(x * y);
            }
            int64_t io[LM_MAX_DIMS];
            int q = 0;
            for (int d = 0; d < bo; d++) io[q++] = bidx[d];
            if (na > 1) io[q++] = i;
            if (nb > 1) io[q++] = j;
            double got = at(out, io);
            if (!(fabs(got - s) <= tol * (mag + 1e-30) * (double)(k + 4))) return 0;
         }
   }
   return 1;
}

static void matmul_case(const lm_tensor *a, const lm_tensor *b, const char *what) {
   lm_tensor *out = NULL;
   lm_status st = lm_matmul(a, b, &out);
   if (st != LM_OK) {
      check(0, "matmul %s: error %d %s", what, st, lm_last_error());
      return;
   }
   double tol = a->dtype == LM_FLOAT64 ? 2.3e-16 : 1.2e-7;
   check(out->dtype == a->dtype && lm_is_contiguous(out, LM_CONTIGUOUS) &&
             ref_matmul_check(a, b, out, tol),
         "matmul %s", what);
   lm_tensor_free(out);
}

static void matmul_error(const lm_tensor *a, const lm_tensor *b, lm_status want,
                         const char *substr, const char *what) {
   lm_tensor *out = NULL;
   lm_status st = lm_matmul(a, b, &out);
   const char *msg = lm_last_error();
   check(st == want && out == NULL && (!substr || (msg && strstr(msg, substr))),
         "matmul error %s: status %d message '%s'", what, st, msg ? msg : "(null)");
   if (out) lm_tensor_free(out);
}

static void test_matmul(void) {
   for (int dt = 0; dt < 2; dt++) {
      int dtype = dt ? LM_FLOAT64 : LM_FLOAT32;
      const char *dn = dt ? "f64" : "f32";
      char what[128];
      lm_tensor *x = NULL, *y = NULL, *t = NULL, *u = NULL;
      /* 1-D . 1-D */
      x = make(1, (int64_t[]){17}, dtype);
      y = make(1, (int64_t[]){17}, dtype);
      snprintf(what, sizeof what, "%s dot 17", dn);
      matmul_case(x, y, what);
      lm_tensor_free(y);
      /* 1-D . 2-D and 2-D . 1-D */
      y = make(2, (int64_t[]){17, 5}, dtype);
      snprintf(what, sizeof what, "%s vec(17) @ mat(17x5)", dn);
      matmul_case(x, y, what);
      lm_tensor_free(y);
      y = make(2, (int64_t[]){6, 17}, dtype);
      snprintf(what, sizeof what, "%s mat(6x17) @ vec(17)", dn);
      matmul_case(y, x, what);
      /* transposed views (stride-1 columns) and non-unit strides in both dims */
      lm_transpose(y, 0, 1, &t); /* 17 x 6 */
      lm_tensor *z = make(2, (int64_t[]){6, 9}, dtype);
      snprintf(what, sizeof what, "%s transposed(17x6) @ (6x9)", dn);
      matmul_case(t, z, what);
      lm_tensor *big = make(2, (int64_t[]){34, 19}, dtype), *v1 = NULL, *v2 = NULL;
      lm_as_strided(big, 2, (int64_t[]){9, 7}, (int64_t[]){38, 2}, 1, &v1); /* no unit stride */
      lm_as_strided(big, 2, (int64_t[]){7, 5}, (int64_t[]){3, 19}, 0, &v2);
      snprintf(what, sizeof what, "%s strided(9x7) @ strided(7x5)", dn);
      matmul_case(v1, v2, what);
      lm_tensor_free(t);
      lm_tensor_free(z);
      lm_tensor_free(v1);
      lm_tensor_free(v2);
      lm_tensor_free(big);
      lm_tensor_free(x);
      lm_tensor_free(y);
      /* 2-D . 2-D, larger */
      x = make(2, (int64_t[]){65, 100}, dtype);
      y = make(2, (int64_t[]){100, 33}, dtype);
      snprintf(what, sizeof what, "%s 65x100 @ 100x33", dn);
      matmul_case(x, y, what);
      lm_tensor_free(x);
      lm_tensor_free(y);
      /* batched with broadcasting: (2,1,4,5) @ (3,5,6) -> (2,3,4,6) */
      x = make(4, (int64_t[]){2, 1, 4, 5}, dtype);
      y = make(3, (int64_t[]){3, 5, 6}, dtype);
      snprintf(what, sizeof what, "%s (2,1,4,5) @ (3,5,6)", dn);
      matmul_case(x, y, what);
      lm_tensor_free(y);
      /* batched @ 1-D and 1-D @ batched */
      y = make(1, (int64_t[]){5}, dtype);
      snprintf(what, sizeof what, "%s (2,1,4,5) @ (5)", dn);
      matmul_case(x, y, what);
      lm_tensor_free(x);
      x = make(3, (int64_t[]){3, 5, 2}, dtype);
      snprintf(what, sizeof what, "%s (5) @ (3,5,2)", dn);
      matmul_case(y, x, what);
      /* batched @ 2-D (the 2-D operand broadcast) and a permuted batch */
      lm_tensor_free(y);
      y = make(2, (int64_t[]){2, 7}, dtype);
      snprintf(what, sizeof what, "%s (3,5,2) @ (2,7)", dn);
      matmul_case(x, y, what);
      lm_permute(x, (int[]){2, 0, 1}, &t); /* (2,3,5): non-contiguous batch */
      u = make(3, (int64_t[]){2, 5, 4}, dtype);
      snprintf(what, sizeof what, "%s permuted(2,3,5) @ (2,5,4)", dn);
      matmul_case(t, u, what);
      lm_tensor_free(t);
      lm_tensor_free(u);
      /* expanded (stride 0) batch operand */
      u = make(2, (int64_t[]){5, 4}, dtype);
      lm_expand(u, 3, (int64_t[]){3, 5, 4}, &t);
      snprintf(what, sizeof what, "%s (3,5,2)^T-ish expanded(3,5,4)", dn);
      lm_tensor *xt = NULL;
      lm_transpose(x, 1, 2, &xt); /* (3,2,5) */
      matmul_case(xt, t, what);
      lm_tensor_free(xt);
      lm_tensor_free(t);
      lm_tensor_free(u);
      lm_tensor_free(x);
      lm_tensor_free(y);
      /* empty dims */
      x = make(2, (int64_t[]){0, 4}, dtype);
      y = make(2, (int64_t[]){4, 3}, dtype);
      snprintf(what, sizeof what, "%s (0,4) @ (4,3)", dn);
      matmul_case(x, y, what);
      lm_tensor_free(x);
      x = make(2, (int64_t[]){2, 0}, dtype);
      lm_tensor_free(y);
      y = make(2, (int64_t[]){0, 3}, dtype);
      snprintf(what, sizeof what, "%s (2,0) @ (0,3) gives zeros", dn);
      matmul_case(x, y, what);
      lm_tensor_free(x);
      lm_tensor_free(y);
   }
   /* float16 / bfloat16: computed in float32, rounded once */
   for (int h = 0; h < 2; h++) {
      int dtype = h ? LM_BFLOAT16 : LM_FLOAT16;
      lm_tensor *x = make(3, (int64_t[]){2, 3, 40}, dtype), *y = make(2, (int64_t[]){40, 5}, dtype);
      lm_tensor *r = NULL;
      lm_status st = lm_matmul(x, y, &r);
      check(st == LM_OK && r && r->dtype == dtype && ref_matmul_check(x, y, r, h ? 8e-3 : 1e-3),
            "matmul %s", h ? "bfloat16" : "float16");
      if (r) lm_tensor_free(r);
      lm_tensor_free(x);
      lm_tensor_free(y);
   }
   /* errors */
   lm_tensor *a = make(2, (int64_t[]){2, 3}, LM_FLOAT32), *b = make(2, (int64_t[]){4, 5},
                                                                      LM_FLOAT32);
   matmul_error(a, b, LM_ERR_SHAPE, "2x3 and 4x5", "size mismatch");
   lm_tensor *d = make(2, (int64_t[]){3, 5}, LM_FLOAT64);
   matmul_error(a, d, LM_ERR_DTYPE, NULL, "dtype mismatch");
   lm_tensor *i64 = NULL, *i64b = NULL;
   lm_empty(2, (int64_t[]){3, 3}, LM_INT64, LM_CONTIGUOUS, LM_CPU, &i64);
   lm_empty(2, (int64_t[]){3, 3}, LM_INT64, LM_CONTIGUOUS, LM_CPU, &i64b);
   matmul_error(i64, i64b, LM_ERR_DTYPE, NULL, "int64 unsupported");
   lm_tensor *s = NULL;
   lm_empty(0, NULL, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &s);
   matmul_error(s, a, LM_ERR_SHAPE, NULL, "0-dim input");
   lm_tensor *v3 = make(1, (int64_t[]){3}, LM_FLOAT32), *v4 = make(1, (int64_t[]){4}, LM_FLOAT32);
   matmul_error(v3, v4, LM_ERR_SHAPE, NULL, "dot of different lengths");
   lm_tensor *b1 = make(3, (int64_t[]){2, 2, 3}, LM_FLOAT32),
             *b2 = make(3, (int64_t[]){3, 3, 4}, LM_FLOAT32);
   matmul_error(b1, b2, LM_ERR_SHAPE, NULL, "batch dims that do not broadcast");
   matmul_error(NULL, a, LM_ERR_ARG, NULL, "nil input");
   /* out= tensor of the right shape is written in place, with its strides */
   lm_tensor *c = make(2, (int64_t[]){3, 2}, LM_FLOAT32), *ct = NULL;
   lm_transpose(c, 0, 1, &ct); /* 2 x 3, column-major */
   lm_tensor *e = make(2, (int64_t[]){3, 3}, LM_FLOAT32), *out = ct;
   lm_status st = lm_matmul(a, e, &out);
   check(st == LM_OK && out == ct && ref_matmul_check(a, e, ct, 1.2e-7), "matmul into out=");
   lm_tensor *wrong = make(2, (int64_t[]){3, 3}, LM_FLOAT32), *w = wrong;
   st = lm_matmul(a, e, &w); /* 2x3 result into a 3x3 out= */
   check(st == LM_ERR_SHAPE && w == wrong, "matmul out= of the wrong shape is an error (%d)", st);
   lm_tensor_free(wrong);
   lm_tensor_free(c);
   lm_tensor_free(ct);
   lm_tensor_free(e);
   lm_tensor_free(a);
   lm_tensor_free(b);
   lm_tensor_free(d);
   lm_tensor_free(i64);
   lm_tensor_free(i64b);
   lm_tensor_free(s);
   lm_tensor_free(v3);
   lm_tensor_free(v4);
   lm_tensor_free(b1);
   lm_tensor_free(b2);
}
#endif

int main(int argc, char **argv) {
   for (int i = 1; i < argc; i++)
      if (!strcmp(argv[i], "-q")) g_quiet = 1;
   test_isa_selection();
   test_degenerate();
   for (int isa = 1; isa <= 3; isa++) test_gemm_isa(isa);
   test_threads();
#ifndef LM_GEMM_STANDALONE
   test_matmul();
#endif
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
