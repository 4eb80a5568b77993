/* pool.h -- the parameters of the pooling ops (front end: src/ops/pool.c; CPU kernels:
 * kernels/cpu/pool.c and the files it names). Every tensor of one op is dense in mf (the input's
 * suggested memory format: LM_CHANNELS_LAST, else LM_CONTIGUOUS), of rank ndim (3: (C,H,W), 4:
 * (N,C,H,W)), and float32 or float64 (indices int64, taps uint8), or bfloat16 for the channels-last
 * max pools (forward, and the backward given the geometry or the taps; H * W < INT32_MAX): the
 * front end computes the other float16 / bfloat16 cases on float32 copies and rounds the results
 * once into the half outputs. Outputs and
 * gradients are allocated by the front end; the kernels write every element of them.
 *   MAX_POOL2D, ADAPTIVE_MAX_POOL2D:   t = {x, out, indices}; indices NULL when not wanted.
 *   MAX_POOL2D_TAPS:                   t = {x, out, taps}; taps uint8 (kh * kw <= 255).
 *   MAX_POOL2D_BACKWARD, ADAPTIVE_MAX_POOL2D_BACKWARD:
 *                                      t = {grad_out, indices, grad_x}; geom = 1 (max_pool2d
 *                                      only): the window geometry below is set and channels-last
 *                                      gathers (lm_max_pool2d_backward_geom); geom = 0: only
 *                                      N, C, H, W, OH, OW are, and the kernel scatters.
 *   MAX_POOL2D_TAPS_BACKWARD:          t = {grad_out, taps, grad_x}; the geometry is set.
 *   AVG_POOL2D, ADAPTIVE_AVG_POOL2D:   t = {x, out}.
 *   AVG_POOL2D_BACKWARD, ADAPTIVE_AVG_POOL2D_BACKWARD: t = {grad_out, grad_x}.
 * Adaptive ops carry OH, OW only (their windows follow from the sizes). Index / tap values that
 * name no tap of their window are the kernels' errors (LM_ERR_ARG, "out of range"). */
#ifndef LUMEN_OPS_POOL_H
#define LUMEN_OPS_POOL_H
#include <stdint.h>

typedef struct lm_pool_params {
   int ndim; /* 3 or 4 */
   int mf;   /* LM_CONTIGUOUS or LM_CHANNELS_LAST */
   int64_t N, C, H, W, OH, OW;
   int64_t kh, kw, sh, sw, ph, pw, dh, dw; /* kernel, stride, padding, dilation {H, W} */
   int ceil_mode;
   int count_include_pad; /* avg_pool2d */
   int has_div;           /* avg_pool2d: divisor_override given (divisor != 0) */
   int64_t divisor;
   int geom;  /* MAX_POOL2D_BACKWARD: the geometry is given (see above) */
   int fresh; /* backward: grad_x was allocated for this call (not the caller's out= tensor), so
                 a kernel that writes all of it may use streaming stores when it is cold */
} lm_pool_params;

#endif
