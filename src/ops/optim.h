/* optim.h -- the parameters of LM_OP_SGD_STEP and LM_OP_ADAM_STEP (front ends: lm_sgd_step,
 * lm_adam_step in src/elementwise.c; CPU kernels: kernels/cpu/optim.c).
 *   SGD_STEP:  t = {param, grad, momentum_buffer (NULL when momentum == 0), lr (NULL: params.lr;
 *              else one float64 element on the device, read when the kernel runs)}
 *   ADAM_STEP: t = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (NULL: not amsgrad),
 *              lr, step (both NULL: params.lr, params.step; else one float64 element each on
 *              the device, read when the kernel runs; step already incremented, >= 1)}
 * Every tensor has the parameter's dtype (float32 or float64), sizes and strides, dense; numel
 * > 0; step >= 1. The kernels update param and the state tensors in place. */
#ifndef LUMEN_OPS_OPTIM_H
#define LUMEN_OPS_OPTIM_H
#include <stdint.h>
typedef struct lm_sgd_params {
   double lr, momentum, dampening, weight_decay;
   int nesterov, maximize, first;
} lm_sgd_params;

typedef struct lm_adam_params {
   double lr, beta1, beta2, eps, weight_decay;
   int decoupled, maximize;
   int64_t step;
} lm_adam_params;
#endif
