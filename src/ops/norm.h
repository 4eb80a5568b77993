/* norm.h -- the parameters of LM_OP_BATCH_NORM and LM_OP_BATCH_NORM_BACKWARD (front end:
 * src/ops/norm.c; CPU kernel: kernels/cpu/norm.c). The fused forms (residual, relu, relu_out,
 * grad_masked) are the same kinds with those operands present (NULL: absent).
 *
 *   BATCH_NORM: t = {x, weight, bias, running_mean, running_var, residual, y, save_mean,
 *                    save_invstd}
 *     x, residual (may be NULL), y: dense in mf, one dtype (float32 / float64) and shape;
 *     weight, bias, running_mean, running_var (each may be NULL): 1-D of C elements, any
 *     floating dtype, any stride; the kernel updates running_mean / running_var in place when
 *     training (with more than 0 rows);
 *     save_mean, save_invstd (may be NULL): fresh contiguous (C) of x's dtype.
 *   BATCH_NORM_BACKWARD: t = {grad_out, relu_out, x, weight, save_mean, save_invstd, grad_x,
 *                             grad_weight, grad_bias, grad_masked}
 *     grad_out, relu_out (may be NULL), x, grad_x (may be NULL), grad_masked (may be NULL; only
 *     with relu_out): dense in mf, x's dtype and shape; weight (may be NULL), save_mean,
 *     save_invstd: 1-D of C, any floating dtype, any stride; grad_weight, grad_bias (may be
 *     NULL): contiguous (C) of weight's dtype (x's without a weight).
 * mf: x's suggested memory format (LM_CONTIGUOUS, LM_CHANNELS_LAST or LM_CHANNELS_LAST_3D).
 * fresh: y / grad_x was allocated by the front end (not the caller's out= tensor), so the kernel
 * may write it with streaming stores when its block is cold. */
#ifndef LUMEN_OPS_NORM_H
#define LUMEN_OPS_NORM_H
typedef struct lm_batch_norm_params {
   int mf;
   int training;
   int relu; /* forward: relu after the (residual) sum */
   int fresh;
   double momentum, eps;
} lm_batch_norm_params;
#endif
