/* test_bgemm.c -- the bfloat16 GEMM (lm_bgemm_strided: float32 C, lm_bgemm_strided_bf16c:
 * bfloat16 C rounded once; kernels/cpu/gemm.c, gemm_avx512bf16.c) against a float64 reference
 * on the same bfloat16 inputs, on every ISA path the CPU has (4: vdpbf16ps, 3 and 2: the float32
 * route, 1: the portable emulation of the packed kernel): random shapes (odd k, k deeper than
 * one packed block, matrix-vector), operands plain / transposed / strided both ways / broadcast
 * (stride 0), C row-major / column-major / strided, alpha and beta.
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *   make && cc -std=c11 -O2 -fopenmp -Isrc spec/c/test_bgemm.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_bgemm && /tmp/test_bgemm
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

/* exported by liblumen.so for this test (kernels/cpu/gemm_internal.h) */
void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, float *c, int64_t rsc, int64_t csc);
void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                            int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                            int64_t csb, float beta, uint16_t *c, int64_t rsc, int64_t csc);

static uint64_t g_rng = 88172645463325252ull;
static double urand(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float bf2f(uint16_t h) {
   uint32_t u = (uint32_t)h << 16;
   float f;
   memcpy(&f, &u, 4);
   return f;
}
static uint16_t f2bf(float f) {
   uint32_t x;
   memcpy(&x, &f, 4);
   if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
   x += 0x7fff + ((x >> 16) & 1);
   return (uint16_t)(x >> 16);
}

/* an r x s operand in layout `lay`: 0 row-major, 1 column-major (transposed), 2 strided both
   ways (every element apart), 3 rows broadcast (row stride 0) */
typedef struct {
   uint16_t *p;
   int64_t rs, cs;
   size_t n;
} mat;

static mat make_mat(int64_t r, int64_t s, int lay) {
   mat x;
   switch (lay) {
   case 1: x.rs = 1; x.cs = r; x.n = (size_t)(r * s); break;
   case 2: x.rs = 3 * s + 1; x.cs = 2; x.n = (size_t)(r * (3 * s + 1) + 2 * s + 1); break;
   case 3: x.rs = 0; x.cs = 1; x.n = (size_t)s; break;
   default: x.rs = s; x.cs = 1; x.n = (size_t)(r * s); break;
   }
   if (x.n == 0) x.n = 1;
   x.p = malloc(x.n * 2);
   for (size_t i = 0; i < x.n; i++) x.p[i] = f2bf((float)(urand() * 2 - 1));
   return x;
}

static int g_failed_cases;

static void run_case(int isa, int64_t m, int64_t n, int64_t k, int la, int lb, int lc, int cbf,
                     float alpha, float beta) {
   mat A = make_mat(m, k, la), B = make_mat(k, n, lb);
   int64_t rsc = lc == 1 ? 1 : lc == 2 ? 2 * n + 3 : n, csc = lc == 1 ? m : lc == 2 ? 2 : 1;
   size_t cn = m > 0 && n > 0 ? (size_t)((m - 1) * rsc + (n - 1) * csc + 1) : 1;
   float *cf = malloc(cn * 4);
   uint16_t *cb = malloc(cn * 2);
   for (size_t i = 0; i < cn; i++) {
      cb[i] = f2bf((float)(urand() - 0.5));
      cf[i] = bf2f(cb[i]);
   }
   double *ref = malloc((size_t)(m * n + 1) * sizeof(double)),
          *mag = malloc((size_t)(m * n + 1) * sizeof(double));
   for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
         double s = 0, sa = 0;
         for (int64_t p = 0; p < k; p++) {
            double t = (double)bf2f(A.p[i * A.rs + p * A.cs]) * bf2f(B.p[p * B.rs + j * B.cs]);
            s += t;
            sa += fabs(t);
         }
         const double c0 = cf[i * rsc + j * csc];
         ref[i * n + j] = alpha * s + (beta != 0 ? beta * c0 : 0);
         mag[i * n + j] = fabs(alpha) * sa + fabs(beta * c0);
      }
   if (cbf)
      lm_bgemm_strided_bf16c(m, n, k, alpha, A.p, A.rs, A.cs, B.p, B.rs, B.cs, beta, cb, rsc, csc);
   else
      lm_bgemm_strided(m, n, k, alpha, A.p, A.rs, A.cs, B.p, B.rs, B.cs, beta, cf, rsc, csc);
   int bad = 0;
   double worst = 0;
   for (int64_t i = 0; i < m && !bad; i++)
      for (int64_t j = 0; j < n; j++) {
         const double r = ref[i * n + j], mg = mag[i * n + j];
         const double got = cbf ? bf2f(cb[i * rsc + j * csc]) : cf[i * rsc + j * csc];
         /* float32 sums: about k * 2^-24 of the sum of |terms| at worst; a bf16 result also
            one rounding (2^-8 relative, plus the float error carried through it) */
         double tol = (double)(k + 4) * 6e-8 * mg + 1e-30;
         if (cbf) tol = tol * 1.01 + fabs(r) * 0.00391;
         const double e = fabs(got - r);
         if (e > worst) worst = e;
         if (!(e <= tol)) {
            bad = 1;
            snprintf(g_case, sizeof g_case,
                     "isa %d %lldx%lldx%lld A%d B%d C%d %s alpha %g beta %g", isa, (long long)m,
                     (long long)n, (long long)k, la, lb, lc, cbf ? "bf16" : "f32", alpha, beta);
            check(0, "(%lld,%lld): got %.9g want %.9g tol %.3g", (long long)i, (long long)j,
                  got, r, tol);
            g_failed_cases++;
            break;
         }
      }
   if (!bad) check(1, "");
   /* beta == 0 never reads C: NaN there must not leak */
   if (beta == 0 && m * n > 0) {
      for (size_t i = 0; i < cn; i++) {
         cf[i] = NAN;
         cb[i] = 0x7fc0;
      }
      if (cbf)
         lm_bgemm_strided_bf16c(m, n, k, alpha, A.p, A.rs, A.cs, B.p, B.rs, B.cs, 0.0f, cb, rsc,
                                csc);
      else
         lm_bgemm_strided(m, n, k, alpha, A.p, A.rs, A.cs, B.p, B.rs, B.cs, 0.0f, cf, rsc, csc);
      int nan = 0;
      for (int64_t i = 0; i < m; i++)
         for (int64_t j = 0; j < n; j++) {
            const float v = cbf ? bf2f(cb[i * rsc + j * csc]) : cf[i * rsc + j * csc];
            if (v != v) nan = 1;
         }
      snprintf(g_case, sizeof g_case, "isa %d %lldx%lldx%lld beta 0 with NaN C", isa,
               (long long)m, (long long)n, (long long)k);
      check(!nan, "NaN leaked from C");
   }
   free(A.p); free(B.p); free(cf); free(cb); free(ref); free(mag);
}

/* lm_matmul on bfloat16 tensors into an out= tensor with its own (column-major) strides, and
   batched with a broadcast operand, against the float64 reference of the same values */
static void test_matmul_out(void) {
   for (int isa = LM_ISA_AMX; isa >= 1; isa -= (isa >= 4 ? 1 : 2)) {
      if (lm_gemm_set_isa(isa) != isa) continue;
      snprintf(g_case, sizeof g_case, "lm_matmul bf16 out= isa %d", isa);
      const int64_t M = 23, K = 45, N = 19, BATCH = 3;
      const int64_t sa[3] = {BATCH, M, K}, sb[2] = {K, N}, so[3] = {BATCH, M, N};
      const int64_t st_o[3] = {M * N, 1, M}; /* each matrix column-major */
      lm_tensor *a = NULL, *b = NULL, *o = NULL, *bad = NULL;
      OK(lm_empty(3, sa, LM_BFLOAT16, LM_CONTIGUOUS, LM_CPU, &a));
      OK(lm_empty(2, sb, LM_BFLOAT16, LM_CONTIGUOUS, LM_CPU, &b));
      OK(lm_empty_strided(3, so, st_o, LM_BFLOAT16, LM_CPU, &o));
      double *da = malloc(sizeof(double) * BATCH * M * K), *db = malloc(sizeof(double) * K * N),
             *dout = malloc(sizeof(double) * BATCH * M * N);
      for (int64_t i = 0; i < BATCH * M * K; i++) da[i] = bf2f(f2bf((float)(urand() - 0.5)));
      for (int64_t i = 0; i < K * N; i++) db[i] = bf2f(f2bf((float)(urand() - 0.5)));
      OK(lm_from_doubles(a, da));
      OK(lm_from_doubles(b, db));
      lm_tensor *out = o;
      OK(lm_matmul(a, b, &out));
      check(out == o, "out= used");
      OK(lm_to_doubles(o, dout));
      int okv = 1;
      for (int64_t t = 0; t < BATCH && okv; t++)
         for (int64_t i = 0; i < M && okv; i++)
            for (int64_t j = 0; j < N; j++) {
               double r = 0, mg = 0;
               for (int64_t p = 0; p < K; p++) {
                  r += da[(t * M + i) * K + p] * db[p * N + j];
                  mg += fabs(da[(t * M + i) * K + p] * db[p * N + j]);
               }
               if (!(fabs(dout[(t * M + i) * N + j] - r) <= 0.0040 * fabs(r) + 1e-5 * mg)) {
                  okv = 0;
                  check(0, "[%lld,%lld,%lld] got %g want %g", (long long)t, (long long)i,
                        (long long)j, dout[(t * M + i) * N + j], r);
                  break;
               }
            }
      if (okv) check(1, "");
      /* a float32 out= for bfloat16 inputs is an error */
      OK(lm_empty(3, so, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &bad));
      lm_tensor *bo = bad;
      check(lm_matmul(a, b, &bo) == LM_ERR_DTYPE, "float32 out= for bfloat16 inputs rejected");
      lm_tensor_free(a); lm_tensor_free(b); lm_tensor_free(o); lm_tensor_free(bad);
      free(da); free(db); free(dout);
   }
   lm_gemm_set_isa(0);
}

int main(void) {
   test_matmul_out();
   static const int64_t shapes[][3] = {
      {1, 1, 1},     {3, 5, 7},     {14, 32, 2},    {15, 33, 3},   {37, 41, 29},
      {64, 64, 64},  {70, 90, 33},  {29, 100, 65},  {130, 70, 1},  {100, 45, 1025},
      {1, 300, 200}, {300, 1, 201}, {200, 150, 47}, {8, 300, 517}, {45, 31, 2100},
      {3, 500, 96},  {0, 5, 5},     {5, 5, 0},
      /* the AMX path's blocks (32 x 32, k blocks of 512, column blocks of 512): whole and
         partial blocks, k not a multiple of 32, several k and column blocks */
      {64, 64, 1024}, {96, 80, 640}, {33, 530, 70}, {17, 16, 32}, {160, 1100, 96}};
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   const int isas[] = {LM_ISA_AMX, 4, 3, 2, 1};
   for (int ii = 0; ii < 5; ii++) {
      const int isa = isas[ii];
      if (lm_gemm_set_isa(isa) != isa) {
         printf("isa %d: not on this CPU, skipped\n", isa);
         continue;
      }
      for (int s = 0; s < ns; s++) {
         const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
         for (int v = 0; v < 6; v++) {
            /* layouts cycle so that each shape meets several; the big ones fewer */
            const int la = (s + v) % 4, lb = (s + 2 * v + 1) % 4, lc = v % 3, cbf = (v + s) & 1;
            if (la == 3 && m > 1 && v > 3) continue;
            /* beta 1 with a row-major C (v 3): the AMX path sums into C from its tiles */
            const float alpha = v == 2 ? -0.75f : 1.0f,
                        beta = v >= 4 ? 0.5f : v == 3 ? 1.0f : 0.0f;
            run_case(isa, m, n, k, la == 3 && v == 5 ? 0 : la, lb, lc, cbf, alpha, beta);
         }
      }
   }
   /* thin products with few rows or columns: x . W^T (A rows and B columns along k: the dot
      loops on ISA 4, k tails of every length mod 32) and g . W (B row-major: the row loops,
      odd k, column tails) */
   static const int64_t thin[][3] = {{8, 300, 517}, {3, 70, 33}, {5, 9, 64}, {8, 1000, 2048},
                                     {9, 40, 31},   {70, 8, 95}, {2, 2, 1}, {4, 33, 63}};
   for (int ii = 0; ii < 4; ii++) {
      const int isa = isas[ii];
      if (lm_gemm_set_isa(isa) != isa) continue;
      for (int s = 0; s < 8; s++)
         for (int v = 0; v < 4; v++) /* x . W^T, g . W (B row-major), A transposed or not */
            run_case(isa, thin[s][0], thin[s][1], thin[s][2], v >> 1, v & 1 ? 1 : 0,
                     v & 1 ? 2 : 0, v == 0 || v == 3, 1.0f, v & 1 ? 0.5f : 0.0f);
   }
   lm_gemm_set_isa(0);
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail != 0;
}
