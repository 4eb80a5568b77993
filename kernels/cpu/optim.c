/* optim.c -- the fused optimizer steps' kernels (front ends: src/elementwise.c, lm_sgd_step and
 * lm_adam_step; parameters: src/ops/optim.h).
 *
 * Every operand has the parameter's dtype (float32 / float64), sizes and strides and is
 * non-overlapping and dense, so the loops run over the storage span linearly. The arithmetic
 * follows the separate ops of optim/init.lua step by step, rounding to the dtype after each. */
#include "cpu.h"
#include "iter.h"
#include "ops/optim.h"
#include <math.h>

#define SGD_LOOP(T, SUF)                                                                        \
   static LM_CLONES void sgd_##SUF(T *restrict p, const T *restrict g, T *restrict b, int64_t n, \
                                   T wd, T mom, T damp1, T nlr, int use_wd, int use_mom,        \
                                   int nesterov, int maximize, int first) {                     \
      for (int64_t i = 0; i < n; i++) {                                                         \
         T d = g[i];                                                                            \
         if (maximize) d = -d;                                                                  \
         if (use_wd) d = d + wd * p[i];                                                         \
         if (use_mom) {                                                                         \
            T v;                                                                                \
            if (first) {                                                                        \
               v = d;                                                                           \
            } else {                                                                            \
               v = b[i] * mom;                                                                  \
               v = v + damp1 * d;                                                               \
            }                                                                                   \
            b[i] = v;                                                                           \
            d = nesterov ? d + mom * v : v;                                                     \
         }                                                                                      \
         p[i] = p[i] + nlr * d;                                                                 \
      }                                                                                         \
   }
SGD_LOOP(float, f32)
SGD_LOOP(double, f64)

/* SGD_STEP: t = {param, grad, momentum_buffer (NULL without momentum), lr tensor or NULL} */
static lm_status k_sgd_step(const lm_op *op) {
   const lm_sgd_params *q = op->params;
   lm_tensor *param = op->t[0];
   const lm_tensor *grad = op->t[1];
   lm_tensor *momentum_buffer = op->t[2];
   const lm_tensor *lr_t = op->nt > 3 ? op->t[3] : NULL;
   const double lr = lr_t ? *(const double *)lm_tensor_data(lr_t) : q->lr,
                momentum = q->momentum, dampening = q->dampening,
                weight_decay = q->weight_decay;
   const int nesterov = q->nesterov, maximize = q->maximize, first = q->first;
   const int64_t n = param->numel;
   void *pp = lm_tensor_data(param), *bp = momentum != 0 ? lm_tensor_data(momentum_buffer) : NULL;
   const void *gp = lm_tensor_data(grad);
   if (param->dtype == LM_FLOAT32)
      sgd_f32(pp, gp, bp, n, (float)weight_decay, (float)momentum, (float)(1 - dampening),
              (float)-lr, weight_decay != 0, momentum != 0, nesterov != 0, maximize != 0,
              first != 0);
   else
      sgd_f64(pp, gp, bp, n, weight_decay, momentum, 1 - dampening, -lr, weight_decay != 0,
              momentum != 0, nesterov != 0, maximize != 0, first != 0);
   return LM_OK;
}

#define ADAM_LOOP(T, SUF, SQRT)                                                                 \
   static LM_CLONES void adam_##SUF(T *restrict p, const T *restrict g, T *restrict m,          \
                                    T *restrict v, T *restrict mx, int64_t n, T b1, T b1c,      \
                                    T b2, T b2c, T wd, T decay, T bc2s, T eps, T nstep,         \
                                    int use_wd, int decoupled, int maximize) {                  \
      for (int64_t i = 0; i < n; i++) {                                                         \
         T d = g[i];                                                                            \
         if (maximize) d = -d;                                                                  \
         T pv = p[i];                                                                           \
         if (use_wd) {                                                                          \
            if (decoupled) pv = pv * decay;                                                     \
            else d = d + wd * pv;                                                               \
         }                                                                                      \
         T mv = m[i] * b1;                                                                      \
         mv = mv + b1c * d;                                                                     \
         T vv = v[i] * b2;                                                                      \
         vv = vv + b2c * d * d;                                                                 \
         m[i] = mv;                                                                             \
         v[i] = vv;                                                                             \
         T den;                                                                                 \
         if (mx) {                                                                              \
            T a = mx[i];                                                                        \
            T w = (a != a) ? a : (vv != vv) ? vv : (a > vv ? a : vv);                           \
            mx[i] = w;                                                                          \
            den = SQRT(w);                                                                      \
         } else {                                                                               \
            den = SQRT(vv);                                                                     \
         }                                                                                      \
         den = den / bc2s;                                                                      \
         den = den + eps;                                                                       \
         p[i] = pv + nstep * mv / den;                                                          \
      }                                                                                         \
   }
ADAM_LOOP(float, f32, sqrtf)
ADAM_LOOP(double, f64, sqrt)

/* ADAM_STEP: t = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (NULL: not amsgrad), lr and
   step tensors or NULL} */
static lm_status k_adam_step(const lm_op *op) {
   const lm_adam_params *q = op->params;
   lm_tensor *param = op->t[0];
   const lm_tensor *grad = op->t[1];
   lm_tensor *exp_avg = op->t[2], *exp_avg_sq = op->t[3], *max_exp_avg_sq = op->t[4];
   const lm_tensor *lr_t = op->nt > 5 ? op->t[5] : NULL, *step_t = op->nt > 6 ? op->t[6] : NULL;
   const double lr = lr_t ? *(const double *)lm_tensor_data(lr_t) : q->lr, beta1 = q->beta1,
                beta2 = q->beta2, eps = q->eps, weight_decay = q->weight_decay;
   const int decoupled = q->decoupled, maximize = q->maximize;
   /* a step count from a tensor (>= 1; the front end cannot see its value), used as it is, as
      the CUDA kernel's AdamConsts does */
   const double step = step_t ? *(const double *)lm_tensor_data(step_t) : (double)q->step;
   if (!(step >= 1)) return lm_error(LM_ERR_ARG, "adam step: step must be >= 1, got %g", step);
   const int64_t n = param->numel;
   const double bc1 = 1 - pow(beta1, step);
   const double bc2s = sqrt(1 - pow(beta2, step));
   const double step_size = lr / bc1;
   void *pp = lm_tensor_data(param), *mp = lm_tensor_data(exp_avg);
   void *vp = lm_tensor_data(exp_avg_sq);
   void *xp = max_exp_avg_sq ? lm_tensor_data(max_exp_avg_sq) : NULL;
   const void *gp = lm_tensor_data(grad);
   if (param->dtype == LM_FLOAT32)
      adam_f32(pp, gp, mp, vp, xp, n, (float)beta1, (float)(1 - beta1), (float)beta2,
               (float)(1 - beta2), (float)weight_decay, (float)(1 - lr * weight_decay),
               (float)bc2s, (float)eps, (float)-step_size, weight_decay != 0, decoupled != 0,
               maximize != 0);
   else
      adam_f64(pp, gp, mp, vp, xp, n, beta1, 1 - beta1, beta2, 1 - beta2, weight_decay,
               1 - lr * weight_decay, bc2s, eps, -step_size, weight_decay != 0, decoupled != 0,
               maximize != 0);
   return LM_OK;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_optim(lm_kernel_fn *table, int isa) {
   (void)isa; /* the loops are LM_CLONES: picked at load time */
   table[LM_OP_SGD_STEP] = k_sgd_step;
   table[LM_OP_ADAM_STEP] = k_adam_step;
}
