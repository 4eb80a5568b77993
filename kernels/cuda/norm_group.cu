/* norm_group.cu -- LM_OP_GROUP_NORM and LM_OP_GROUP_NORM_BACKWARD on cuda:k (parameters and t[]:
 * src/ops/norm_group.h; the CPU's kernels, whose formulas these repeat: kernels/cpu/norm_group.c).
 *
 * A first, simple version built from lm_cu_for bodies (so the emulated build runs the same code):
 *   1. one thread per (n, c): the channel's sums over S in double (shifted by its first value in
 *      the forward; dy and dy * (x - mean) in the backward), reading the layout's stride;
 *   2. one thread per (n, g): Chan's combination into the group's mean / rstd (forward), or the
 *      coefficients B, D of grad_x (backward); one thread per c: grad_weight / grad_bias;
 *   3. one thread per element: y = x * A + B, or grad_x = A dy + B (x - mean) + D.
 * The per-(n, c) loops are serial over S: right for GroupNorm's many channels, slower than a
 * block reduction would be for few channels and large images (a later version's job). */
#include "cuda.cuh"
#include "impl.h"
extern "C" {
#include "ops/norm_group.h"
}
#include <math.h>

namespace {

struct GnGeom {
   int64_t N, C, S, G, Cg;
   int rows;
   /* the element offset of (n, c, s) */
   LM_HD int64_t at(int64_t n, int64_t c, int64_t s) const {
      return rows ? (n * S + s) * C + c : (n * C + c) * S + s;
   }
};

GnGeom gn_geom(const lm_tensor *x, int mf, int G) {
   GnGeom g;
   g.N = x->sizes[0];
   g.C = x->sizes[1];
   g.S = 1;
   for (int d = 2; d < x->ndim; d++) g.S *= x->sizes[d];
   g.G = G;
   g.Cg = g.C / G;
   g.rows = mf == LM_CHANNELS_LAST || mf == LM_CHANNELS_LAST_3D || g.S == 1;
   return g;
}

struct Param {
   const char *p;
   int dt;
   int64_t st, es;
   LM_HD double ld(int64_t c, double dflt) const {
      return p ? lm_load_as_double(p + c * st * es, dt) : dflt;
   }
};

Param param_of(const lm_tensor *t) {
   Param q;
   q.p = t ? lm_cu_ptr(t) : NULL;
   q.dt = t ? t->dtype : LM_FLOAT32;
   q.st = t ? t->strides[0] : 0;
   q.es = t ? lm_dtype_size(t->dtype) : 0;
   return q;
}

/* forward pass 1: per (n, c) shifted sums -> acc[(n*C + c)*3 + {0,1,2}] = {K, s1, s2} */
struct FwdSums {
   GnGeom g;
   const char *x;
   int dt;
   int64_t es;
   double *acc;
   LM_HD void operator()(int64_t i) const {
      const int64_t n = i / g.C, c = i % g.C;
      const double k = lm_load_as_double(x + g.at(n, c, 0) * es, dt);
      double s1 = 0, s2 = 0;
      for (int64_t s = 0; s < g.S; s++) {
         const double a = lm_load_as_double(x + g.at(n, c, s) * es, dt) - k;
         s1 += a;
         s2 += a * a;
      }
      acc[i * 3] = k;
      acc[i * 3 + 1] = s1;
      acc[i * 3 + 2] = s2;
   }
};

/* forward pass 2: per (n, g) mean / rstd, stored in stats[2 * (n*G + g)] and the outputs */
struct FwdStats {
   GnGeom g;
   const double *acc;
   double *stats;
   double eps;
   char *mean, *rstd;
   int sdt;
   int64_t ses;
   LM_HD void operator()(int64_t i) const {
      const int64_t n = i / g.G, gi = i % g.G;
      const double Sd = (double)g.S;
      double msum = 0;
      for (int64_t c = gi * g.Cg; c < (gi + 1) * g.Cg; c++) {
         const double *a = acc + (n * g.C + c) * 3;
         msum += a[0] + a[1] / Sd;
      }
      const double mu = msum / (double)g.Cg;
      double m2 = 0;
      for (int64_t c = gi * g.Cg; c < (gi + 1) * g.Cg; c++) {
         const double *a = acc + (n * g.C + c) * 3;
         const double mc = a[0] + a[1] / Sd;
         double v = a[2] - a[1] * a[1] / Sd;
         if (v < 0) v = 0;
         m2 += v + Sd * (mc - mu) * (mc - mu);
      }
      const double rs = 1.0 / sqrt(m2 / (Sd * (double)g.Cg) + eps);
      stats[2 * i] = mu;
      stats[2 * i + 1] = rs;
      if (mean) lm_store_from_double(mean + i * ses, sdt, mu);
      if (rstd) lm_store_from_double(rstd + i * ses, sdt, rs);
   }
};

/* forward pass 3: per element (in storage order) */
struct FwdApply {
   GnGeom g;
   const char *x;
   char *y;
   int dt;
   int64_t es;
   const double *stats;
   Param w, b;
   LM_HD void operator()(int64_t i) const {
      int64_t n, c;
      if (g.rows) {
         c = i % g.C;
         n = i / (g.C * g.S);
      } else {
         c = (i / g.S) % g.C;
         n = i / (g.C * g.S);
      }
      const int64_t ng = n * g.G + c / g.Cg;
      const double mu = stats[2 * ng], rs = stats[2 * ng + 1];
      const double v = lm_load_as_double(x + i * es, dt);
      lm_store_from_double(y + i * es, dt, (v - mu) * rs * w.ld(c, 1.0) + b.ld(c, 0.0));
   }
};

/* backward pass 1: per (n, c): acc[(n*C + c)*2 + {0,1}] = {sum dy, sum dy (x - mean)} */
struct BwdSums {
   GnGeom g;
   const char *x, *dy;
   int dt;
   int64_t es;
   Param mean;
   double *acc;
   LM_HD void operator()(int64_t i) const {
      const int64_t n = i / g.C, c = i % g.C;
      const double mu = mean.ld(n * g.G + c / g.Cg, 0.0);
      double db = 0, ds = 0;
      for (int64_t s = 0; s < g.S; s++) {
         const int64_t o = g.at(n, c, s) * es;
         const double d = lm_load_as_double(dy + o, dt);
         db += d;
         ds += d * (lm_load_as_double(x + o, dt) - mu);
      }
      acc[i * 2] = db;
      acc[i * 2 + 1] = ds;
   }
};

/* backward pass 2a: per (n, g): coef[2 * (n*G + g)] = {B, D} */
struct BwdCoef {
   GnGeom g;
   const double *acc;
   Param rstd, w;
   double *coef;
   LM_HD void operator()(int64_t i) const {
      const int64_t n = i / g.G, gi = i % g.G;
      const double rs = rstd.ld(i, 0.0), Dd = (double)(g.Cg * g.S);
      double sw_ds = 0, sw_db = 0;
      for (int64_t c = gi * g.Cg; c < (gi + 1) * g.Cg; c++) {
         const double wc = w.ld(c, 1.0);
         sw_db += wc * acc[(n * g.C + c) * 2];
         sw_ds += wc * acc[(n * g.C + c) * 2 + 1];
      }
      coef[2 * i] = Dd > 0 ? -rs * rs * rs / Dd * sw_ds : 0;
      coef[2 * i + 1] = Dd > 0 ? -rs / Dd * sw_db : 0;
   }
};

/* backward pass 2b: per c: grad_weight, grad_bias */
struct BwdParams {
   GnGeom g;
   const double *acc;
   Param rstd;
   char *gw, *gb;
   int wdt;
   int64_t wes;
   LM_HD void operator()(int64_t c) const {
      double sw = 0, sb = 0;
      for (int64_t n = 0; n < g.N; n++) {
         sb += acc[(n * g.C + c) * 2];
         sw += acc[(n * g.C + c) * 2 + 1] * rstd.ld(n * g.G + c / g.Cg, 0.0);
      }
      if (gw) lm_store_from_double(gw + c * wes, wdt, sw);
      if (gb) lm_store_from_double(gb + c * wes, wdt, sb);
   }
};

/* backward pass 3: per element: grad_x */
struct BwdApply {
   GnGeom g;
   const char *x, *dy;
   char *gx;
   int dt;
   int64_t es;
   const double *coef;
   Param mean, rstd, w;
   LM_HD void operator()(int64_t i) const {
      int64_t n, c;
      if (g.rows) {
         c = i % g.C;
         n = i / (g.C * g.S);
      } else {
         c = (i / g.S) % g.C;
         n = i / (g.C * g.S);
      }
      const int64_t ng = n * g.G + c / g.Cg;
      const double mu = mean.ld(ng, 0.0), rs = rstd.ld(ng, 0.0);
      const double d = lm_load_as_double(dy + i * es, dt), v = lm_load_as_double(x + i * es, dt);
      lm_store_from_double(gx + i * es, dt,
                           rs * w.ld(c, 1.0) * d + coef[2 * ng] * (v - mu) + coef[2 * ng + 1]);
   }
};

lm_status k_group_norm(const lm_op *op) {
   const lm_group_norm_params *p = (const lm_group_norm_params *)op->params;
   const lm_tensor *x = op->t[0];
   lm_tensor *y = op->t[3], *mean = op->t[4], *rstd = op->t[5];
   const int k = lm_cu_index(x);
   LM_TRY(lm_cu_set_device(k));
   const GnGeom g = gn_geom(x, p->mf, p->G);
   if (g.N == 0 || g.C == 0) return LM_OK;
   const size_t nb = (size_t)(g.N * g.C * 3 + g.N * g.G * 2) * sizeof(double);
   double *acc = (double *)lm_cu_alloc(k, nb);
   if (!acc) return LM_ERR_OOM;
   double *stats = acc + g.N * g.C * 3;
   const int64_t es = lm_dtype_size(x->dtype);
   lm_status st = lm_cu_for(k, g.N * g.C, FwdSums{g, lm_cu_ptr(x), x->dtype, es, acc});
   if (st == LM_OK) {
      const lm_tensor *ms = mean ? mean : rstd;
      FwdStats b{g, acc, stats, p->eps, mean ? lm_cu_ptr(mean) : NULL,
                 rstd ? lm_cu_ptr(rstd) : NULL, ms ? ms->dtype : LM_FLOAT32,
                 ms ? (int64_t)lm_dtype_size(ms->dtype) : 0};
      st = lm_cu_for(k, g.N * g.G, b);
   }
   if (st == LM_OK)
      st = lm_cu_for(k, x->numel, FwdApply{g, lm_cu_ptr(x), lm_cu_ptr(y), x->dtype, es, stats,
                                            param_of(op->t[1]), param_of(op->t[2])});
   lm_cu_free(k, acc, nb);
   return st;
}

lm_status k_group_norm_backward(const lm_op *op) {
   const lm_group_norm_params *p = (const lm_group_norm_params *)op->params;
   const lm_tensor *dy = op->t[0], *x = op->t[1], *mean = op->t[2], *rstd = op->t[3],
                   *w = op->t[4];
   lm_tensor *gx = op->t[5], *gw = op->t[6], *gb = op->t[7];
   const int k = lm_cu_index(x);
   LM_TRY(lm_cu_set_device(k));
   const GnGeom g = gn_geom(x, p->mf, p->G);
   if (g.C == 0) return LM_OK;
   const size_t nb = (size_t)(g.N * g.C * 2 + g.N * g.G * 2 + 1) * sizeof(double);
   double *acc = (double *)lm_cu_alloc(k, nb);
   if (!acc) return LM_ERR_OOM;
   double *coef = acc + g.N * g.C * 2;
   const int64_t es = lm_dtype_size(x->dtype);
   const Param pm = param_of(mean), pr = param_of(rstd), pw = param_of(w);
   /* mean / rstd are contiguous (N, G): their flat index is n * G + g (stride 1) */
   Param pm1 = pm, pr1 = pr;
   pm1.st = pr1.st = 1;
   lm_status st = lm_cu_for(k, g.N * g.C,
                            BwdSums{g, lm_cu_ptr(x), lm_cu_ptr(dy), x->dtype, es, pm1, acc});
   if (st == LM_OK && gx) st = lm_cu_for(k, g.N * g.G, BwdCoef{g, acc, pr1, pw, coef});
   if (st == LM_OK && (gw || gb)) {
      const lm_tensor *pt = gw ? gw : gb;
      st = lm_cu_for(k, g.C, BwdParams{g, acc, pr1, gw ? lm_cu_ptr(gw) : NULL,
                                        gb ? lm_cu_ptr(gb) : NULL, pt->dtype,
                                        (int64_t)lm_dtype_size(pt->dtype)});
   }
   if (st == LM_OK && gx)
      st = lm_cu_for(k, x->numel, BwdApply{g, lm_cu_ptr(x), lm_cu_ptr(dy), lm_cu_ptr(gx),
                                            x->dtype, es, coef, pm1, pr1, pw});
   lm_cu_free(k, acc, nb);
   return st;
}

} // namespace

void lm_cuda_register_group_norm(lm_kernel_fn *table) {
   table[LM_OP_GROUP_NORM] = k_group_norm;
   table[LM_OP_GROUP_NORM_BACKWARD] = k_group_norm_backward;
}
