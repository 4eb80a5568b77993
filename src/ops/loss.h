/* loss.h -- the parameters of LM_OP_NLL_LOSS and LM_OP_NLL_LOSS_BACKWARD (front end:
 * src/ops/loss.c; CPU kernel: kernels/cpu/loss.c).
 *   NLL_LOSS:          t = {input, target, weight, out, total_weight}
 *   NLL_LOSS_BACKWARD: t = {grad_out, input, target, weight, total_weight, grad_input}
 * input: float32, float64, float16 or bfloat16 (read as is, summed in double), (N, C), (C) or (N, C, d1, ...), any strides (only its shape and
 * strides are used by the backward); target: int64 of input's shape without the class dim, any
 * strides; weight (may be NULL): 1-D of C, any floating dtype, any stride. out: fresh contiguous
 * of input's dtype, target-shaped for LM_REDUCTION_NONE, else 0-dim; total_weight (forward: may
 * be NULL, else a fresh 0-dim of input's dtype, float32 for a half input; backward: 1 element of any floating dtype, read
 * only for LM_REDUCTION_MEAN, may be NULL otherwise). grad_out: any floating dtype,
 * target-shaped (any strides) for NONE, else 1 element. grad_input: fresh contiguous, input's
 * shape and dtype. The kernels check the target values (in [0, C) or ignore_index). */
#ifndef LUMEN_OPS_LOSS_H
#define LUMEN_OPS_LOSS_H
#include <stdint.h>
typedef struct lm_nll_loss_params {
   int reduction;
   int64_t ignore_index;
} lm_nll_loss_params;
#endif
