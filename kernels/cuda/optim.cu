/* optim.cu -- the fused optimizer steps on CUDA (LM_OP_SGD_STEP, LM_OP_ADAM_STEP; front ends:
 * lm_sgd_step / lm_adam_step in src/elementwise.c; parameters: src/ops/optim.h; the CPU's kernels,
 * whose formulas these repeat operation by operation: kernels/cpu/optim.c).
 *
 * The front end guarantees that every operand has the parameter's dtype (float32 or float64),
 * sizes and strides, and is non-overlapping and dense; so, as on the CPU, element i of the storage
 * span (from element 0, the lowest address since strides are non-negative) is the same logical
 * element in every operand, and one thread per element walks the span linearly (coalesced). The
 * arithmetic rounds to the dtype after each operation, as the separate ops of optim/init.lua do.
 * (nvcc may contract a * b + c into an FMA, as GCC may in the CPU's AVX2/AVX-512 clones: the last
 * bit can differ between devices, which the specs' tolerances allow.) */
#include "cuda.cuh"
extern "C" {
#include "ops/optim.h"
}
#include <math.h>

namespace {

template <class T> struct SgdBody {
   T *p;
   const T *g;
   T *b;
   T wd, mom, damp1, nlr;
   const double *lr; /* NULL: nlr; else -lr, read when the kernel runs (a graph's replays) */
   int use_wd, use_mom, nesterov, maximize, first;
   LM_HD void operator()(int64_t i) const {
      const T nl = lr ? (T)-*lr : nlr;
      T d = g[i];
      if (maximize) d = -d;
      if (use_wd) d = d + wd * p[i];
      if (use_mom) {
         T v;
         if (first) {
            v = d;
         } else {
            v = b[i] * mom;
            v = v + damp1 * d;
         }
         b[i] = v;
         d = nesterov ? d + mom * v : v;
      }
      p[i] = p[i] + nl * d;
   }
};

static LM_HD inline float sqrt_of(float x) { return sqrtf(x); }
static LM_HD inline double sqrt_of(double x) { return sqrt(x); }

template <class T> struct AdamBody {
   T *p;
   const T *g;
   T *m, *v, *mx;
   T b1, b1c, b2, b2c, wd, decay, bc2s, eps, nstep;
   /* NULL: the constants above; else {-step_size, bc2s, decay} computed on the device from the
      lr and step tensors when the step runs (AdamConsts, a CUDA graph's replays) */
   const double *cst;
   int use_wd, decoupled, maximize;
   LM_HD void operator()(int64_t i) const {
      const T nst = cst ? (T)cst[0] : nstep, b2s = cst ? (T)cst[1] : bc2s,
              dec = cst ? (T)cst[2] : decay;
      T d = g[i];
      if (maximize) d = -d;
      T pv = p[i];
      if (use_wd) {
         if (decoupled) pv = pv * dec;
         else d = d + wd * pv;
      }
      T mv = m[i] * b1;
      mv = mv + b1c * d;
      T vv = v[i] * b2;
      vv = vv + b2c * d * d;
      m[i] = mv;
      v[i] = vv;
      T den;
      if (mx) {
         T a = mx[i];
         T w = (a != a) ? a : (vv != vv) ? vv : (a > vv ? a : vv);
         mx[i] = w;
         den = sqrt_of(w);
      } else {
         den = sqrt_of(vv);
      }
      den = den / b2s;
      den = den + eps;
      p[i] = pv + nst * mv / den;
   }
};

/* the step's constants from the lr and step tensors, in double as the CPU's k_adam_step */
struct AdamConsts {
   const double *lr, *step;
   double beta1, beta2, wd;
   double *out;
   LM_HD void operator()(int64_t) const {
      const double s = *step, l = *lr;
      const double bc1 = 1 - pow(beta1, s);
      out[0] = -(l / bc1);
      out[1] = sqrt(1 - pow(beta2, s));
      out[2] = 1 - l * wd;
   }
};

template <class T> lm_status sgd_run(const lm_op *op) {
   const lm_sgd_params *q = (const lm_sgd_params *)op->params;
   lm_tensor *param = op->t[0];
   SgdBody<T> b;
   b.p = (T *)lm_cu_ptr(param);
   b.g = (const T *)lm_cu_ptr(op->t[1]);
   b.b = q->momentum != 0 ? (T *)lm_cu_ptr(op->t[2]) : (T *)0;
   b.wd = (T)q->weight_decay;
   b.mom = (T)q->momentum;
   b.damp1 = (T)(1 - q->dampening);
   b.nlr = (T)-q->lr;
   b.lr = op->nt > 3 && op->t[3] ? (const double *)lm_cu_ptr(op->t[3]) : (const double *)0;
   b.use_wd = q->weight_decay != 0;
   b.use_mom = q->momentum != 0;
   b.nesterov = q->nesterov != 0;
   b.maximize = q->maximize != 0;
   b.first = q->first != 0;
   return lm_cu_for(lm_cu_index(param), param->numel, b);
}

template <class T> lm_status adam_run(const lm_op *op) {
   const lm_adam_params *q = (const lm_adam_params *)op->params;
   lm_tensor *param = op->t[0];
   /* the host-side constants exactly as the CPU computes them (in double, then rounded to T) */
   const double lr = q->lr, beta1 = q->beta1, beta2 = q->beta2, eps = q->eps,
                weight_decay = q->weight_decay;
   const double bc1 = 1 - pow(beta1, (double)q->step);
   const double bc2s = sqrt(1 - pow(beta2, (double)q->step));
   const double step_size = lr / bc1;
   AdamBody<T> b;
   b.p = (T *)lm_cu_ptr(param);
   b.g = (const T *)lm_cu_ptr(op->t[1]);
   b.m = (T *)lm_cu_ptr(op->t[2]);
   b.v = (T *)lm_cu_ptr(op->t[3]);
   b.mx = op->t[4] ? (T *)lm_cu_ptr(op->t[4]) : (T *)0;
   b.b1 = (T)beta1;
   b.b1c = (T)(1 - beta1);
   b.b2 = (T)beta2;
   b.b2c = (T)(1 - beta2);
   b.wd = (T)weight_decay;
   b.decay = (T)(1 - lr * weight_decay);
   b.bc2s = (T)bc2s;
   b.eps = (T)eps;
   b.nstep = (T)-step_size;
   b.use_wd = weight_decay != 0;
   b.decoupled = q->decoupled != 0;
   b.maximize = q->maximize != 0;
   b.cst = (const double *)0;
   const int k = lm_cu_index(param);
   if (op->nt > 6 && op->t[5] && op->t[6]) {
      /* three doubles of scratch, freed once the kernels are queued (stream order) */
      double *c = (double *)lm_cu_alloc(k, 3 * sizeof(double));
      if (!c) return LM_ERR_OOM;
      AdamConsts ac;
      ac.lr = (const double *)lm_cu_ptr(op->t[5]);
      ac.step = (const double *)lm_cu_ptr(op->t[6]);
      ac.beta1 = beta1;
      ac.beta2 = beta2;
      ac.wd = weight_decay;
      ac.out = c;
      lm_status st = lm_cu_for(k, 1, ac);
      b.cst = c;
      if (st == LM_OK) st = lm_cu_for(k, param->numel, b);
      lm_cu_free(k, c, 3 * sizeof(double));
      return st;
   }
   return lm_cu_for(k, param->numel, b);
}

/* SGD_STEP: t = {param, grad, momentum_buffer (NULL without momentum), lr tensor or NULL} */
static lm_status k_sgd_step(const lm_op *op) {
   const lm_tensor *p = op->t[0];
   if (p->dtype == LM_FLOAT32) return sgd_run<float>(op);
   if (p->dtype == LM_FLOAT64) return sgd_run<double>(op);
   return lm_error(LM_ERR_DTYPE, "sgd_step: unsupported dtype %s", lm_dtype_name(p->dtype));
}

/* ADAM_STEP: t = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (NULL: not amsgrad), lr and
   step tensors or NULL (read on the device: AdamConsts)} */
static lm_status k_adam_step(const lm_op *op) {
   const lm_tensor *p = op->t[0];
   if (p->dtype == LM_FLOAT32) return adam_run<float>(op);
   if (p->dtype == LM_FLOAT64) return adam_run<double>(op);
   return lm_error(LM_ERR_DTYPE, "adam_step: unsupported dtype %s", lm_dtype_name(p->dtype));
}

} // namespace

void lm_cuda_register_optim(lm_kernel_fn *table) {
   table[LM_OP_SGD_STEP] = k_sgd_step;
   table[LM_OP_ADAM_STEP] = k_adam_step;
}
