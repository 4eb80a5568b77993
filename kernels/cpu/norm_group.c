/*
 * norm_group.c -- group normalisation, forward and backward: the kernels of LM_OP_GROUP_NORM and
 * LM_OP_GROUP_NORM_BACKWARD (front end: src/ops/norm_group.c, which checks the arguments,
 * allocates the results and makes x / grad_out dense in mf; the t[] order is in
 * src/ops/norm_group.h). Instance normalisation is the case G = C (lua/lumen/functional/norm.lua).
 *
 * x is viewed as (N, C, S) (S: the spatial size) in one of two layouts:
 *   rows   -- channels innermost (channels-last, channels-last-3d, or S = 1): sample n is an
 *             (S, C) matrix, so the Cg = C / G channels of a group are a contiguous run of each
 *             row. Statistics: per-channel partial sums over a range of rows, the inner loop
 *             running along the C contiguous channels (vectorized), then combined per group;
 *   planes -- contiguous (N, C, S): each (n, c) plane is a contiguous run of S elements.
 * Both passes are per (n, c) reductions over S followed by an elementwise affine map with
 * per-(n, c) coefficients, so the two layouts share everything but the loops' order.
 *
 * Statistics: each channel's values are shifted by its first value K[n, c] (so that
 * E[x^2] - E[x]^2 does not cancel), summed in double; a group's mean and biased variance come
 * from its channels' by Chan's combination (M2 = sum M2_c + S * sum (mean_c - mean)^2).
 * The backward sums dy and dy * (x - mean) per (n, c) in double, so no E[x dy] - mean E[dy]
 * cancellation either:
 *   db[n,c] = sum_s dy,  dsc[n,c] = sum_s dy (x - mean[n,g])
 *   grad_bias[c] = sum_n db,  grad_weight[c] = sum_n dsc * rstd[n,g]
 *   grad_x = rstd w_c dy + B[n,g] (x - mean) + D[n,g],  with D = Cg * S,
 *            B = -rstd^3 / D * sum_{c in g} w_c dsc[n,c],  D[n,g] = -rstd / D * sum_{c in g} w_c db.
 * S = 1 (layer_norm's rows, (N, C) input) has its own loops: one contiguous row per sample,
 * two-pass per group in double, rows split between threads.
 * float16 / bfloat16 are read and written directly and computed in float32 (the coefficients);
 * float64 is computed in double throughout.
 */
#include "cpu.h"
#include "impl.h"
#include "ops/norm_group.h"
#include "norm_rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GN_GRAIN ((int64_t)1 << 16)

static int gn_threads(void) {
#ifdef _OPENMP
   return omp_get_max_threads();
#else
   return 1;
#endif
}

static void gn_param_load(const lm_tensor *t, int64_t C, double dflt, double *dst) {
   if (!t) {
      for (int64_t c = 0; c < C; c++) dst[c] = dflt;
      return;
   }
   const char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype), st = t->strides[0];
   for (int64_t c = 0; c < C; c++) dst[c] = lm_load_as_double(p + c * st * es, t->dtype);
}

static void gn_param_store(lm_tensor *t, int64_t C, const double *src) {
   char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype), st = t->strides[0];
   for (int64_t c = 0; c < C; c++) lm_store_from_double(p + c * st * es, t->dtype, src[c]);
}

/* a contiguous tensor of n elements (any floating dtype) as doubles, and back */
static void gn_flat_load(const lm_tensor *t, int64_t n, double *dst) {
   const char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype);
   for (int64_t i = 0; i < n; i++) dst[i] = lm_load_as_double(p + i * es, t->dtype);
}

static void gn_flat_store(lm_tensor *t, int64_t n, const double *src) {
   char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype);
   for (int64_t i = 0; i < n; i++) lm_store_from_double(p + i * es, t->dtype, src[i]);
}

typedef struct {
   int64_t N, C, S, G, Cg;
   int rows; /* 1: channels innermost */
} gn_geom;

static void gn_geometry(const lm_tensor *x, int mf, int G, gn_geom *g) {
   g->N = x->sizes[0];
   g->C = x->sizes[1];
   g->S = 1;
   for (int d = 2; d < x->ndim; d++) g->S *= x->sizes[d];
   g->G = G;
   g->Cg = g->C / G;
   g->rows = mf == LM_CHANNELS_LAST || mf == LM_CHANNELS_LAST_3D || g->S == 1;
}

/* ---- the per-dtype loops: T the element, LD / ST its conversion to / from the compute type R */
#define LD_F32(p, i) ((p)[i])
#define ST_F32(p, i, v) ((p)[i] = (v))
#define LD_F64(p, i) ((p)[i])
#define ST_F64(p, i, v) ((p)[i] = (v))
#define LD_F16(p, i) lm_h2f((p)[i])
#define ST_F16(p, i, v) ((p)[i] = lm_f2h(v))
#define LD_BF16(p, i) lm_bf2f((p)[i])
#define ST_BF16(p, i, v) ((p)[i] = lm_f2bf(v))

/* Pass 1 over sample n's elements [s0, s1) of S, per channel: with f1 / f2 the two summands.
   Forward: a = x - K[c], f1 = a, f2 = a * a. Backward: f1 = dy, f2 = dy * (x - M[c]).
   acc1 / acc2: C doubles each (added to). */
#define GN_SUMS(SUF, T, R, LD)                                                                     \
   static void gn_sums_fwd_##SUF(const T *x, const gn_geom *g, int64_t n, int64_t s0, int64_t s1,  \
                                 const R *K, double *acc1, double *acc2) {                         \
      const int64_t C = g->C, S = g->S;                                                            \
      if (g->rows) {                                                                               \
         for (int64_t s = s0; s < s1; s++) {                                                       \
            const T *xr = x + (n * S + s) * C;                                                     \
            for (int64_t c = 0; c < C; c++) {                                                      \
               const double a = (double)((R)LD(xr, c) - K[c]);                                     \
               acc1[c] += a;                                                                       \
               acc2[c] += a * a;                                                                   \
            }                                                                                      \
         }                                                                                         \
      } else {                                                                                     \
         for (int64_t c = 0; c < C; c++) {                                                         \
            const T *xp = x + (n * C + c) * S;                                                     \
            double a1 = 0, a2 = 0;                                                                 \
            const R k = K[c];                                                                      \
            for (int64_t s = s0; s < s1; s++) {                                                    \
               const double a = (double)((R)LD(xp, s) - k);                                        \
               a1 += a;                                                                            \
               a2 += a * a;                                                                        \
            }                                                                                      \
            acc1[c] += a1;                                                                         \
            acc2[c] += a2;                                                                         \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   static void gn_sums_bwd_##SUF(const T *x, const T *dy, const gn_geom *g, int64_t n,             \
                                 int64_t s0, int64_t s1, const R *M, double *acc1, double *acc2) { \
      const int64_t C = g->C, S = g->S;                                                            \
      if (g->rows) {                                                                               \
         for (int64_t s = s0; s < s1; s++) {                                                       \
            const T *xr = x + (n * S + s) * C, *gr = dy + (n * S + s) * C;                         \
            for (int64_t c = 0; c < C; c++) {                                                      \
               const R d = LD(gr, c);                                                              \
               acc1[c] += (double)d;                                                               \
               acc2[c] += (double)(d * ((R)LD(xr, c) - M[c]));                                     \
            }                                                                                      \
         }                                                                                         \
      } else {                                                                                     \
         for (int64_t c = 0; c < C; c++) {                                                         \
            const T *xp = x + (n * C + c) * S, *gp = dy + (n * C + c) * S;                         \
            double a1 = 0, a2 = 0;                                                                 \
            const R m = M[c];                                                                      \
            for (int64_t s = s0; s < s1; s++) {                                                    \
               const R d = LD(gp, s);                                                              \
               a1 += (double)d;                                                                    \
               a2 += (double)(d * ((R)LD(xp, s) - m));                                             \
            }                                                                                      \
            acc1[c] += a1;                                                                         \
            acc2[c] += a2;                                                                         \
         }                                                                                         \
      }                                                                                            \
   }

GN_SUMS(f32, float, float, LD_F32)
GN_SUMS(f64, double, double, LD_F64)
GN_SUMS(f16, uint16_t, float, LD_F16)
GN_SUMS(bf16, uint16_t, float, LD_BF16)

/* pass 2 over sample n's [s0, s1): y = x * A + B (forward, dy NULL) or
   y = A * dy + B * (x - M) + D (backward); A, B, M, D: C values of sample n */
#define GN_APPLY(SUF, T, R, LD, ST)                                                                \
   static void gn_apply_##SUF(const T *x, const T *dy, T *y, const gn_geom *g, int64_t n,          \
                              int64_t s0, int64_t s1, const R *A, const R *B, const R *M,          \
                              const R *D) {                                                        \
      const int64_t C = g->C, S = g->S;                                                            \
      if (g->rows) {                                                                               \
         for (int64_t s = s0; s < s1; s++) {                                                       \
            const int64_t o = (n * S + s) * C;                                                     \
            const T *xr = x + o;                                                                   \
            T *yr = y + o;                                                                         \
            if (!dy) {                                                                             \
               for (int64_t c = 0; c < C; c++) ST(yr, c, (R)LD(xr, c) * A[c] + B[c]);              \
            } else {                                                                               \
               const T *gr = dy + o;                                                               \
               for (int64_t c = 0; c < C; c++)                                                     \
                  ST(yr, c, A[c] * (R)LD(gr, c) + B[c] * ((R)LD(xr, c) - M[c]) + D[c]);            \
            }                                                                                      \
         }                                                                                         \
      } else {                                                                                     \
         for (int64_t c = 0; c < C; c++) {                                                         \
            const int64_t o = (n * C + c) * S;                                                     \
            const T *xp = x + o;                                                                   \
            T *yp = y + o;                                                                         \
            const R a = A[c], b = B[c], m = M[c], d = D[c];                                        \
            if (!dy) {                                                                             \
               for (int64_t s = s0; s < s1; s++) ST(yp, s, (R)LD(xp, s) * a + b);                  \
            } else {                                                                               \
               const T *gp = dy + o;                                                               \
               for (int64_t s = s0; s < s1; s++)                                                   \
                  ST(yp, s, a * (R)LD(gp, s) + b * ((R)LD(xp, s) - m) + d);                        \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }

GN_APPLY(f32, float, float, LD_F32, ST_F32)
GN_APPLY(f64, double, double, LD_F64, ST_F64)
GN_APPLY(f16, uint16_t, float, LD_F16, ST_F16)
GN_APPLY(bf16, uint16_t, float, LD_BF16, ST_BF16)

/* ---- S = 1 (layer_norm's (M, D) rows, or (N, C) input): each sample is one contiguous row of C
   values; its groups are contiguous runs, normalised two-pass (mean, then the squared deviations)
   in double, one thread per block of rows. wv / bv: C values (compute type R). Backward:
   per-thread partial grad_weight / grad_bias sums (pw: nthreads x 2C doubles). */
#define GN_ROW1(SUF, T, R, LD, ST)                                                                 \
   static void gn_row1_fwd_##SUF(const T *x, T *y, const gn_geom *g, const R *wv, const R *bv,     \
                                 double eps, double *gm, double *gr) {                             \
      const int64_t N = g->N, C = g->C, G = g->G, Cg = g->Cg;                                      \
      _Pragma("omp parallel for schedule(static) if (N * C > GN_GRAIN)")                           \
      for (int64_t n = 0; n < N; n++) {                                                            \
         const T *xr = x + n * C;                                                                  \
         T *yr = y + n * C;                                                                        \
         for (int64_t gi = 0; gi < G; gi++) {                                                      \
            const int64_t c0 = gi * Cg;                                                            \
            double s1 = 0, s2 = 0;                                                                 \
            for (int64_t c = c0; c < c0 + Cg; c++) s1 += (double)(R)LD(xr, c);                     \
            const double mu = s1 / (double)Cg;                                                     \
            for (int64_t c = c0; c < c0 + Cg; c++) {                                               \
               const double d = (double)(R)LD(xr, c) - mu;                                         \
               s2 += d * d;                                                                        \
            }                                                                                      \
            const double rs = 1.0 / sqrt(s2 / (double)Cg + eps);                                   \
            gm[n * G + gi] = mu;                                                                   \
            gr[n * G + gi] = rs;                                                                   \
            const R m = (R)mu, r = (R)rs;                                                          \
            for (int64_t c = c0; c < c0 + Cg; c++)                                                 \
               ST(yr, c, ((R)LD(xr, c) - m) * r * wv[c] + bv[c]);                                  \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   static void gn_row1_bwd_##SUF(const T *x, const T *dy, T *gx, const gn_geom *g, const R *wv,    \
                                 const double *gm, const double *gr, double *pw, int nt) {         \
      const int64_t N = g->N, C = g->C, G = g->G, Cg = g->Cg;                                      \
      _Pragma("omp parallel num_threads(nt) if (N * C > GN_GRAIN)")                                \
      {                                                                                            \
         int tid = 0, tn = 1;                                                                      \
         GN_TEAM(tid, tn);                                                                         \
         double *pgw = pw + (int64_t)tid * 2 * C, *pgb = pgw + C;                                  \
         const int64_t n0 = N * tid / tn, n1 = N * (tid + 1) / tn;                                 \
         for (int64_t n = n0; n < n1; n++) {                                                       \
            const T *xr = x + n * C, *gr_ = dy + n * C;                                            \
            for (int64_t gi = 0; gi < G; gi++) {                                                   \
               const int64_t c0 = gi * Cg;                                                         \
               const double mu = gm[n * G + gi], rs = gr[n * G + gi];                              \
               double sw_db = 0, sw_ds = 0;                                                        \
               for (int64_t c = c0; c < c0 + Cg; c++) {                                            \
                  const double d = (double)(R)LD(gr_, c);                                          \
                  const double xc = ((double)(R)LD(xr, c) - mu);                                   \
                  pgb[c] += d;                                                                     \
                  pgw[c] += d * xc * rs;                                                           \
                  sw_db += (double)wv[c] * d;                                                      \
                  sw_ds += (double)wv[c] * d * xc;                                                 \
               }                                                                                   \
               if (gx) {                                                                           \
                  const R b = (R)(-rs * rs * rs / (double)Cg * sw_ds);                             \
                  const R dd = (R)(-rs / (double)Cg * sw_db), m = (R)mu, r = (R)rs;                \
                  T *gxr = gx + n * C;                                                             \
                  for (int64_t c = c0; c < c0 + Cg; c++)                                           \
                     ST(gxr, c, r * wv[c] * (R)LD(gr_, c) + b * ((R)LD(xr, c) - m) + dd);          \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }

#ifdef _OPENMP
#define GN_TEAM(tid, tn) (tid = omp_get_thread_num(), tn = omp_get_num_threads())
#else
#define GN_TEAM(tid, tn) ((void)0)
#endif

GN_ROW1(f32, float, float, LD_F32, ST_F32)
GN_ROW1(f64, double, double, LD_F64, ST_F64)
GN_ROW1(f16, uint16_t, float, LD_F16, ST_F16)
GN_ROW1(bf16, uint16_t, float, LD_BF16, ST_BF16)

/* w / b of C (NULL: 1 / 0) into the compute type */
static void gn_coef_load(const lm_tensor *t, int64_t C, double dflt, int dbl, void *dst,
                         double *tmp) {
   gn_param_load(t, C, dflt, tmp);
   for (int64_t c = 0; c < C; c++) {
      if (dbl) ((double *)dst)[c] = tmp[c];
      else ((float *)dst)[c] = (float)tmp[c];
   }
}

static lm_status gn_row1_forward(const lm_op *op, const gn_geom *g) {
   const lm_group_norm_params *p = op->params;
   const lm_tensor *x = op->t[0];
   lm_tensor *y = op->t[3], *mean = op->t[4], *rstd = op->t[5];
   const int64_t N = g->N, C = g->C, G = g->G;
   int dt = x->dtype;
   const int dbl = dt == LM_FLOAT64;
   double *buf = malloc((size_t)(3 * C + 2 * N * G + 1) * sizeof(double));
   if (!buf) return lm_error(LM_ERR_OOM, "group_norm: out of memory for the scratch");
   double *tmp = buf, *wv = buf + C, *bv = wv + C, *gm = bv + C, *gr = gm + N * G;
   gn_coef_load(op->t[1], C, 1.0, dbl, wv, tmp);
   gn_coef_load(op->t[2], C, 0.0, dbl, bv, tmp);
   const void *xd = lm_tensor_data(x);
   void *yd = lm_tensor_data(y);
   if (dt == LM_FLOAT32 && lm_cpu_isa() >= LM_ISA_AVX512 && lm_impl_on(LM_IMPL_NORM_ROWS_AVX512)) {
      lm_impl_ran(LM_IMPL_NORM_ROWS_AVX512);
      lm_norm_rows_fwd_f32_avx512(xd, yd, N, C, G, (float *)wv, (float *)bv, p->eps, gm, gr,
                                  N * C > GN_GRAIN ? gn_threads() : 1);
      dt = -1; /* done */
   } else if (dt == LM_FLOAT32 && lm_cpu_isa() == LM_ISA_AVX2 &&
              lm_impl_on(LM_IMPL_NORM_ROWS_AVX2)) {
      lm_impl_ran(LM_IMPL_NORM_ROWS_AVX2);
      lm_norm_rows_fwd_f32_avx2(xd, yd, N, C, G, (float *)wv, (float *)bv, p->eps, gm, gr,
                                N * C > GN_GRAIN ? gn_threads() : 1);
      dt = -1;
   }
   switch (dt) {
   case LM_FLOAT32: gn_row1_fwd_f32(xd, yd, g, (float *)wv, (float *)bv, p->eps, gm, gr); break;
   case LM_FLOAT64: gn_row1_fwd_f64(xd, yd, g, wv, bv, p->eps, gm, gr); break;
   case LM_FLOAT16: gn_row1_fwd_f16(xd, yd, g, (float *)wv, (float *)bv, p->eps, gm, gr); break;
   case LM_BFLOAT16: gn_row1_fwd_bf16(xd, yd, g, (float *)wv, (float *)bv, p->eps, gm, gr); break;
   default: break;
   }
   if (mean) gn_flat_store(mean, N * G, gm);
   if (rstd) gn_flat_store(rstd, N * G, gr);
   free(buf);
   return LM_OK;
}

static lm_status gn_row1_backward(const lm_op *op, const gn_geom *g) {
   const lm_tensor *dy = op->t[0], *x = op->t[1];
   lm_tensor *gx = op->t[5], *gw = op->t[6], *gb = op->t[7];
   const int64_t N = g->N, C = g->C, G = g->G;
   int dt = x->dtype;
   const int dbl = dt == LM_FLOAT64;
   const int nt = N * C > GN_GRAIN ? gn_threads() : 1;
   /* the rows kernels: 2 AVX-512, 1 AVX2, 0 the portable loops */
   const int rows_v = dt != LM_FLOAT32 ? 0
                      : lm_cpu_isa() >= LM_ISA_AVX512 && lm_impl_on(LM_IMPL_NORM_ROWS_AVX512) ? 2
                      : lm_cpu_isa() == LM_ISA_AVX2 && lm_impl_on(LM_IMPL_NORM_ROWS_AVX2)     ? 1
                                                                                               : 0;
   /* doubles: tmp, wv (C each), gm, gr (N * G each), pw (nt * 2C); the rows kernels'
      float32 scratch (nt * 2C floats) after them */
   double *buf = malloc((size_t)(2 * C + 2 * N * G + 2 * C * nt + (rows_v ? C * nt : 0) + 1) *
                        sizeof(double));
   if (!buf) return lm_error(LM_ERR_OOM, "group_norm_backward: out of memory for the scratch");
   double *tmp = buf, *wv = buf + C, *gm = wv + C, *gr = gm + N * G, *pw = gr + N * G;
   memset(pw, 0, (size_t)(2 * C * nt) * sizeof(double));
   gn_coef_load(op->t[4], C, 1.0, dbl, wv, tmp);
   gn_flat_load(op->t[2], N * G, gm);
   gn_flat_load(op->t[3], N * G, gr);
   const void *xd = lm_tensor_data(x), *gd = lm_tensor_data(dy);
   void *gxd = gx ? lm_tensor_data(gx) : NULL;
   if (rows_v == 2) {
      lm_impl_ran(LM_IMPL_NORM_ROWS_AVX512);
      lm_norm_rows_bwd_f32_avx512(xd, gd, gxd, N, C, G, (float *)wv, gm, gr, pw,
                                  (float *)(pw + 2 * C * nt), nt);
      dt = -1; /* done */
   } else if (rows_v == 1) {
      lm_impl_ran(LM_IMPL_NORM_ROWS_AVX2);
      lm_norm_rows_bwd_f32_avx2(xd, gd, gxd, N, C, G, (float *)wv, gm, gr, pw,
                                (float *)(pw + 2 * C * nt), nt);
      dt = -1;
   }
   switch (dt) {
   case LM_FLOAT32: gn_row1_bwd_f32(xd, gd, gxd, g, (float *)wv, gm, gr, pw, nt); break;
   case LM_FLOAT64: gn_row1_bwd_f64(xd, gd, gxd, g, wv, gm, gr, pw, nt); break;
   case LM_FLOAT16: gn_row1_bwd_f16(xd, gd, gxd, g, (float *)wv, gm, gr, pw, nt); break;
   case LM_BFLOAT16: gn_row1_bwd_bf16(xd, gd, gxd, g, (float *)wv, gm, gr, pw, nt); break;
   default: break;
   }
   for (int t = 1; t < nt; t++)
      for (int64_t c = 0; c < 2 * C; c++) pw[c] += pw[(int64_t)t * 2 * C + c];
   if (gw) gn_param_store(gw, C, pw);
   if (gb) gn_param_store(gb, C, pw + C);
   free(buf);
   return LM_OK;
}

/* the work split: sample n's S elements in P chunks (P > 1 when N is below the thread count) */
static int64_t gn_chunks(const gn_geom *g) {
   const int64_t nt = gn_threads();
   if (g->N * g->C * g->S <= GN_GRAIN || g->N >= nt) return 1;
   int64_t P = (nt + g->N - 1) / g->N;
   if (P > g->S) P = g->S;
   return P < 1 ? 1 : P;
}

/* dispatch over the dtype: one generic body per pass, selecting the typed loops */
#define GN_DT_CASE(dt, SUF, T, R, body)                                                            \
   case dt: {                                                                                      \
      typedef T elem_t;                                                                            \
      typedef R comp_t;                                                                            \
      body(SUF);                                                                                   \
   } break;

/* the compute type of dt: double for float64, else float */
static inline int gn_comp_is_double(int dt) { return dt == LM_FLOAT64; }

/* load x[n, s=0, c] (rows) / x[n, c, 0] (planes) as the shift K, in the compute type */
static double gn_first(const void *x, int dt, const gn_geom *g, int64_t n, int64_t c) {
   const int64_t i = g->rows ? n * g->S * g->C + c : (n * g->C + c) * g->S;
   const int64_t es = lm_dtype_size(dt);
   return lm_load_as_double((const char *)x + i * es, dt);
}

static lm_status gn_forward(const lm_op *op) {
   const lm_group_norm_params *p = op->params;
   const lm_tensor *x = op->t[0], *w = op->t[1], *b = op->t[2];
   lm_tensor *y = op->t[3], *mean = op->t[4], *rstd = op->t[5];
   gn_geom g;
   gn_geometry(x, p->mf, p->G, &g);
   const int64_t N = g.N, C = g.C, S = g.S, G = g.G, Cg = g.Cg;
   if (N == 0 || C == 0) return LM_OK;
   if (S == 1) return gn_row1_forward(op, &g);
   const int dt = x->dtype, dbl = gn_comp_is_double(dt);
   const int64_t P = gn_chunks(&g);
   const int64_t rsz = dbl ? 8 : 4;
   /* scratch: acc (N*P*2C doubles), K, A, B (N*C of R each), wv / bv (C doubles),
      gmean / grstd (N*G doubles) */
   double *acc = calloc((size_t)(N * P * 2 * C), sizeof(double));
   char *KA = malloc((size_t)(3 * N * C * rsz));
   double *wv = malloc((size_t)(2 * C + 2 * N * G) * sizeof(double));
   if (!acc || !KA || !wv) {
      free(acc), free(KA), free(wv);
      return lm_error(LM_ERR_OOM, "group_norm: out of memory for the scratch");
   }
   double *bv = wv + C, *gm = bv + C, *gr = gm + N * G;
   void *K = KA, *A = KA + N * C * rsz, *B = KA + 2 * N * C * rsz;
   const void *xd = lm_tensor_data(x);
   void *yd = lm_tensor_data(y);
   for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
         const double k = gn_first(xd, dt, &g, n, c);
         if (dbl) ((double *)K)[n * C + c] = k;
         else ((float *)K)[n * C + c] = (float)k;
      }
   const int64_t tasks = N * P;
#define GN_FWD_SUMS(SUF)                                                                           \
   _Pragma("omp parallel for schedule(static) if (tasks > 1)")                                     \
   for (int64_t t = 0; t < tasks; t++) {                                                           \
      const int64_t n = t / P, q = t % P;                                                          \
      const int64_t s0 = S * q / P, s1 = S * (q + 1) / P;                                          \
      double *a1 = acc + t * 2 * C;                                                                \
      gn_sums_fwd_##SUF((const elem_t *)xd, &g, n, s0, s1, (const comp_t *)K + n * C, a1, a1 + C); \
   }
   switch (dt) {
      GN_DT_CASE(LM_FLOAT32, f32, float, float, GN_FWD_SUMS)
      GN_DT_CASE(LM_FLOAT64, f64, double, double, GN_FWD_SUMS)
      GN_DT_CASE(LM_FLOAT16, f16, uint16_t, float, GN_FWD_SUMS)
      GN_DT_CASE(LM_BFLOAT16, bf16, uint16_t, float, GN_FWD_SUMS)
   default: break;
   }
   /* the per-group statistics (Chan's combination of the channels') and the coefficients */
   gn_param_load(w, C, 1.0, wv);
   gn_param_load(b, C, 0.0, bv);
   const double Sd = (double)S, Dd = (double)(Cg * S);
   for (int64_t n = 0; n < N; n++) {
      double *s1 = acc + n * P * 2 * C, *s2 = s1 + C;
      for (int64_t q = 1; q < P; q++)
         for (int64_t c = 0; c < C; c++) {
            s1[c] += acc[(n * P + q) * 2 * C + c];
            s2[c] += acc[(n * P + q) * 2 * C + C + c];
         }
      for (int64_t gi = 0; gi < G; gi++) {
         double msum = 0, m2 = 0;
         for (int64_t c = gi * Cg; c < (gi + 1) * Cg; c++) {
            const double k = dbl ? ((double *)K)[n * C + c] : ((float *)K)[n * C + c];
            msum += k + s1[c] / Sd;
         }
         const double mu = msum / (double)Cg;
         for (int64_t c = gi * Cg; c < (gi + 1) * Cg; c++) {
            const double k = dbl ? ((double *)K)[n * C + c] : ((float *)K)[n * C + c];
            const double mc = k + s1[c] / Sd;
            double v = s2[c] - s1[c] * s1[c] / Sd;
            if (v < 0) v = 0;
            m2 += v + Sd * (mc - mu) * (mc - mu);
         }
         double var = Dd > 0 ? m2 / Dd : NAN;
         const double rs = 1.0 / sqrt(var + p->eps);
         gm[n * G + gi] = mu;
         gr[n * G + gi] = rs;
         for (int64_t c = gi * Cg; c < (gi + 1) * Cg; c++) {
            const double a = rs * wv[c], bb = bv[c] - mu * a;
            if (dbl) {
               ((double *)A)[n * C + c] = a;
               ((double *)B)[n * C + c] = bb;
            } else {
               ((float *)A)[n * C + c] = (float)a;
               ((float *)B)[n * C + c] = (float)bb;
            }
         }
      }
   }
#define GN_FWD_APPLY(SUF)                                                                          \
   _Pragma("omp parallel for schedule(static) if (tasks > 1)")                                     \
   for (int64_t t = 0; t < tasks; t++) {                                                           \
      const int64_t n = t / P, q = t % P;                                                          \
      const int64_t s0 = S * q / P, s1 = S * (q + 1) / P;                                          \
      const comp_t *An = (const comp_t *)A + n * C, *Bn = (const comp_t *)B + n * C;               \
      gn_apply_##SUF((const elem_t *)xd, NULL, (elem_t *)yd, &g, n, s0, s1, An, Bn, An, An);      \
   }
   switch (dt) {
      GN_DT_CASE(LM_FLOAT32, f32, float, float, GN_FWD_APPLY)
      GN_DT_CASE(LM_FLOAT64, f64, double, double, GN_FWD_APPLY)
      GN_DT_CASE(LM_FLOAT16, f16, uint16_t, float, GN_FWD_APPLY)
      GN_DT_CASE(LM_BFLOAT16, bf16, uint16_t, float, GN_FWD_APPLY)
   default: break;
   }
   if (mean) gn_flat_store(mean, N * G, gm);
   if (rstd) gn_flat_store(rstd, N * G, gr);
   free(acc), free(KA), free(wv);
   return LM_OK;
}

static lm_status gn_backward(const lm_op *op) {
   const lm_group_norm_params *p = op->params;
   const lm_tensor *dy = op->t[0], *x = op->t[1], *mean = op->t[2], *rstd = op->t[3],
                   *w = op->t[4];
   lm_tensor *gx = op->t[5], *gw = op->t[6], *gb = op->t[7];
   gn_geom g;
   gn_geometry(x, p->mf, p->G, &g);
   const int64_t N = g.N, C = g.C, S = g.S, G = g.G, Cg = g.Cg;
   if (S == 1) return gn_row1_backward(op, &g);
   const int dt = x->dtype, dbl = gn_comp_is_double(dt);
   const int64_t P = gn_chunks(&g);
   const int64_t rsz = dbl ? 8 : 4;
   double *acc = calloc((size_t)(N * P * 2 * C + 1), sizeof(double));
   char *buf = malloc((size_t)(4 * N * C * rsz + 1));
   double *wv = malloc((size_t)(3 * C + 2 * N * G + 1) * sizeof(double));
   if (!acc || !buf || !wv) {
      free(acc), free(buf), free(wv);
      return lm_error(LM_ERR_OOM, "group_norm_backward: out of memory for the scratch");
   }
   double *gwv = wv + C, *gbv = gwv + C, *gm = gbv + C, *gr = gm + N * G;
   void *Mx = buf, *A = buf + N * C * rsz, *B = buf + 2 * N * C * rsz,
        *D = buf + 3 * N * C * rsz;
   gn_param_load(w, C, 1.0, wv);
   gn_flat_load(mean, N * G, gm);
   gn_flat_load(rstd, N * G, gr);
   for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
         const double m = gm[n * G + c / (Cg ? Cg : 1)];
         if (dbl) ((double *)Mx)[n * C + c] = m;
         else ((float *)Mx)[n * C + c] = (float)m;
      }
   const void *xd = lm_tensor_data(x), *gd = lm_tensor_data(dy);
   const int64_t tasks = N * P;
   if (N > 0 && C > 0) {
#define GN_BWD_SUMS(SUF)                                                                           \
   _Pragma("omp parallel for schedule(static) if (tasks > 1)")                                     \
   for (int64_t t = 0; t < tasks; t++) {                                                           \
      const int64_t n = t / P, q = t % P;                                                          \
      const int64_t s0 = S * q / P, s1 = S * (q + 1) / P;                                          \
      double *a1 = acc + t * 2 * C;                                                                \
      gn_sums_bwd_##SUF((const elem_t *)xd, (const elem_t *)gd, &g, n, s0, s1,                    \
                        (const comp_t *)Mx + n * C, a1, a1 + C);                                   \
   }
      switch (dt) {
         GN_DT_CASE(LM_FLOAT32, f32, float, float, GN_BWD_SUMS)
         GN_DT_CASE(LM_FLOAT64, f64, double, double, GN_BWD_SUMS)
         GN_DT_CASE(LM_FLOAT16, f16, uint16_t, float, GN_BWD_SUMS)
         GN_DT_CASE(LM_BFLOAT16, bf16, uint16_t, float, GN_BWD_SUMS)
      default: break;
      }
   }
   for (int64_t c = 0; c < C; c++) gwv[c] = gbv[c] = 0;
   const double Dd = (double)(Cg * S);
   for (int64_t n = 0; n < N; n++) {
      double *db = acc + n * P * 2 * C, *ds = db + C;
      for (int64_t q = 1; q < P; q++)
         for (int64_t c = 0; c < C; c++) {
            db[c] += acc[(n * P + q) * 2 * C + c];
            ds[c] += acc[(n * P + q) * 2 * C + C + c];
         }
      for (int64_t gi = 0; gi < G; gi++) {
         const double rs = gr[n * G + gi];
         double sw_ds = 0, sw_db = 0;
         for (int64_t c = gi * Cg; c < (gi + 1) * Cg; c++) {
            gbv[c] += db[c];
            gwv[c] += ds[c] * rs;
            sw_ds += wv[c] * ds[c];
            sw_db += wv[c] * db[c];
         }
         const double bc = Dd > 0 ? -rs * rs * rs / Dd * sw_ds : 0;
         const double dc = Dd > 0 ? -rs / Dd * sw_db : 0;
         for (int64_t c = gi * Cg; c < (gi + 1) * Cg; c++) {
            if (dbl) {
               ((double *)A)[n * C + c] = rs * wv[c];
               ((double *)B)[n * C + c] = bc;
               ((double *)D)[n * C + c] = dc;
            } else {
               ((float *)A)[n * C + c] = (float)(rs * wv[c]);
               ((float *)B)[n * C + c] = (float)bc;
               ((float *)D)[n * C + c] = (float)dc;
            }
         }
      }
   }
   if (gx && N > 0 && C > 0) {
      void *gxd = lm_tensor_data(gx);
#define GN_BWD_APPLY(SUF)                                                                          \
   _Pragma("omp parallel for schedule(static) if (tasks > 1)")                                     \
   for (int64_t t = 0; t < tasks; t++) {                                                           \
      const int64_t n = t / P, q = t % P;                                                          \
      const int64_t s0 = S * q / P, s1 = S * (q + 1) / P;                                          \
      const int64_t o = n * C;                                                                     \
      gn_apply_##SUF((const elem_t *)xd, (const elem_t *)gd, (elem_t *)gxd, &g, n, s0, s1,        \
                     (const comp_t *)A + o, (const comp_t *)B + o, (const comp_t *)Mx + o,         \
                     (const comp_t *)D + o);                                                       \
   }
      switch (dt) {
         GN_DT_CASE(LM_FLOAT32, f32, float, float, GN_BWD_APPLY)
         GN_DT_CASE(LM_FLOAT64, f64, double, double, GN_BWD_APPLY)
         GN_DT_CASE(LM_FLOAT16, f16, uint16_t, float, GN_BWD_APPLY)
         GN_DT_CASE(LM_BFLOAT16, bf16, uint16_t, float, GN_BWD_APPLY)
      default: break;
      }
   }
   if (gw) gn_param_store(gw, C, gwv);
   if (gb) gn_param_store(gb, C, gbv);
   free(acc), free(buf), free(wv);
   return LM_OK;
}

void lm_cpu_register_group_norm(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_GROUP_NORM] = gn_forward;
   table[LM_OP_GROUP_NORM_BACKWARD] = gn_backward;
}
