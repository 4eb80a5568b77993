/* pool3d.h -- the parameters of the 3-D pooling ops (front end: src/ops/pool3d.c; CPU kernels:
 * kernels/cpu/pool3d.c). Every tensor of one op is dense in mf (LM_CHANNELS_LAST_3D when the
 * input suggests it, else LM_CONTIGUOUS), of rank ndim (4: (C,D,H,W), 5: (N,C,D,H,W)), and
 * float32 or float64 (indices int64): the front end computes float16 / bfloat16 on float32
 * copies and rounds the results once into the half outputs. Outputs and gradients are allocated
 * by the front end; the kernels write every element of them.
 *   MAX_POOL3D, ADAPTIVE_MAX_POOL3D:   t = {x, out, indices}; indices NULL when not wanted.
 *   MAX_POOL3D_BACKWARD, ADAPTIVE_MAX_POOL3D_BACKWARD: t = {grad_out, indices, grad_x}; the
 *                                      indices name the taps. MAX_POOL3D_BACKWARD with geom = 1
 *                                      (lm_max_pool3d_backward_geom): the window geometry below
 *                                      is set too (a kernel may gather; the CPU's scatters and
 *                                      ignores it); geom = 0: only the sizes are.
 *   AVG_POOL3D, ADAPTIVE_AVG_POOL3D:   t = {x, out}.
 *   AVG_POOL3D_BACKWARD, ADAPTIVE_AVG_POOL3D_BACKWARD: t = {grad_out, grad_x}.
 * Indices are the flat positions (d * H + h) * W + w inside the input volume, -1 for a window
 * that holds no input element. Adaptive ops carry OD, OH, OW only. An index outside the volume is
 * the kernels' error (LM_ERR_ARG, "out of range"). */
#ifndef LUMEN_OPS_POOL3D_H
#define LUMEN_OPS_POOL3D_H
#include <stdint.h>

typedef struct lm_pool3d_params {
   int ndim; /* 4 or 5 */
   int mf;   /* LM_CONTIGUOUS or LM_CHANNELS_LAST_3D */
   int64_t N, C, D, H, W, OD, OH, OW;
   int64_t k[3], s[3], p[3], d[3]; /* kernel, stride, padding, dilation {D, H, W} */
   int ceil_mode;
   int count_include_pad; /* avg_pool3d */
   int has_div;           /* avg_pool3d: divisor_override given (divisor != 0) */
   int64_t divisor;
   int geom; /* MAX_POOL3D_BACKWARD: k, s, p, d and ceil_mode are set (see above) */
} lm_pool3d_params;

#endif
