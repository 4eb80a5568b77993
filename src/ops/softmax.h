/* softmax.h -- the parameters of LM_OP_SOFTMAX and LM_OP_SOFTMAX_BACKWARD (front end:
 * src/ops/softmax.c; CPU kernel: kernels/cpu/softmax.c).
 *   SOFTMAX:          t = {x, y}; x contiguous, y a fresh contiguous tensor of x's shape/dtype
 *                     (float32 / float64: the front end runs halves on float32 copies).
 *   SOFTMAX_BACKWARD: t = {grad_out, y, grad_x}; all contiguous, one shape and dtype.
 * dim is wrapped (0 <= dim < ndim, or 0 for a 0-dim tensor); log selects log_softmax. */
#ifndef LUMEN_OPS_SOFTMAX_H
#define LUMEN_OPS_SOFTMAX_H
typedef struct lm_softmax_params {
   int dim;
   int log;
} lm_softmax_params;
#endif
