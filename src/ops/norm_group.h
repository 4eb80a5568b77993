/* norm_group.h -- the parameters of LM_OP_GROUP_NORM and LM_OP_GROUP_NORM_BACKWARD (front end:
 * src/ops/norm_group.c; CPU kernel: kernels/cpu/norm_group.c).
 *
 *   GROUP_NORM: t = {x, weight, bias, y, mean, rstd}
 *     x, y: dense in mf, one dtype (float32, float64, float16, bfloat16) and shape (N, C, ...);
 *     weight, bias (each may be NULL): 1-D of C elements, any floating dtype, any stride;
 *     mean, rstd (may be NULL): fresh contiguous (N, G), float32 for the halves, else x's dtype.
 *   GROUP_NORM_BACKWARD: t = {grad_out, x, mean, rstd, weight, grad_x, grad_weight, grad_bias}
 *     grad_out, x, grad_x (may be NULL): dense in mf, x's dtype and shape; mean, rstd: contiguous
 *     (N, G) of any floating dtype; weight (may be NULL): 1-D of C, any floating dtype, any
 *     stride; grad_weight, grad_bias (may be NULL): contiguous (C) of weight's dtype (x's without
 *     a weight).
 * mf: x's suggested memory format (LM_CONTIGUOUS, LM_CHANNELS_LAST or LM_CHANNELS_LAST_3D). */
#ifndef LUMEN_OPS_NORM_GROUP_H
#define LUMEN_OPS_NORM_GROUP_H
typedef struct lm_group_norm_params {
   int mf;
   int G;
   double eps;
} lm_group_norm_params;
#endif
