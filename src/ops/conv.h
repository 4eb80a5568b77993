/* ops/conv.h -- the parameters of LM_OP_CONV2D, LM_OP_CONV2D_BACKWARD and LM_OP_CONV3D (front end:
 * src/ops/conv.c; CPU kernels: kernels/cpu/conv*.c). The public functions are
 * declared in src/conv.h.
 *
 * The front end has checked every argument and worked out the geometry (conv_geom, below) and
 * the memory format; every tensor handed over is dense in that format (bias: any stride).
 *   CONV2D:          t = {x, w, bias, residual, out}; bias and residual may be NULL; out is a
 *                    fresh tensor (or the caller's out= tensor) dense in the format, with at
 *                    least one element.
 *   CONV2D_BACKWARD: t = {x, w, grad_out, grad_x, grad_w, grad_b}; grad_out always; grad_x,
 *                    grad_w, grad_b (shape (O), contiguous) NULL when not wanted or empty, at
 *                    least one of them present; x present when grad_w is, w when grad_x is
 *                    (else NULL).
 * channels_last: 1 for LM_CHANNELS_LAST (NHWC kernels), 0 for LM_CONTIGUOUS (NCHW kernels).
 * act (forward): the lm_conv_act (src/conv.h) applied after bias and residual, in [0, LM_NUM_ACT)
 * (the front end checks it); 0 for the backward. */
#ifndef LUMEN_OPS_CONV_H
#define LUMEN_OPS_CONV_H
#include <stdint.h>

typedef struct conv_geom {
   int64_t N, C, H, W;             /* input */
   int64_t O, Ho, Wo;              /* output channels and size */
   int64_t kh, kw, sh, sw, ph, pw, dh, dw;
   int64_t G, Cg, Og, K;           /* groups, channels per group in / out, K = Cg*kh*kw */
} conv_geom;

typedef struct lm_conv2d_params {
   conv_geom g;
   int channels_last;
   int act;
} lm_conv2d_params;

/* LM_OP_CONV3D: a 3-D convolution that a device runs natively (src/ops/conv3d.c asks the
 * device's supports_op with these parameters first; where it says no, the front end runs the
 * convolution as conv2d over the depth taps instead, on every device). On the CPU: bfloat16
 * channels_last_3d forward on AMX tiles (kernels/cpu/conv_bf16_amx.c, "conv3d_amx_bf16").
 *   t = {x, w, bias, residual, out}: x (N, C, D, H, W), w (O, C/groups, kd, kh, kw), bias NULL
 *   or (O), residual NULL or out's shape, out (N, O, Do, Ho, Wo) with at least one element; x,
 *   w, residual and out dense in channels_last_3d, one dtype.
 * g holds the plane: N (clips), C, H, W, O, Ho, Wo, kh, kw, the strides, padding and dilation
 * of H and W, groups (K = Cg * kd * kh * kw); the depth fields beside it. */
typedef struct conv3d_geom {
   conv_geom g;
   int64_t D, Do, kd, sd, pd, dd;
} conv3d_geom;

typedef struct lm_conv3d_params {
   conv3d_geom g3;
   int act;
} lm_conv3d_params;

/* the argument checks of lm_conv2d (nd 2) and lm_conv3d (nd 3): tensors, devices, dtypes, ranks,
   groups, a non-empty kernel, the bias (src/ops/conv.c) */
struct lm_tensor;
lm_status lm_conv_check_args(const struct lm_tensor *x, const struct lm_tensor *w,
                             const struct lm_tensor *bias, int64_t groups, int nd);

#endif
