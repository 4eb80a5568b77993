/*
 * conv.h -- 2-D convolution (front end src/ops/conv.c; CPU kernels kernels/cpu/conv*.c). Plain C
 * declarations only: this text is appended to src/lumen.h for ffi.cdef (every line starting with
 * '#' is dropped).
 *
 * Semantics are PyTorch's conv2d:
 *   x (N, Cin, H, W), w (Cout, Cin/groups, kh, kw), bias NULL or (Cout), output (N, Cout, Ho, Wo)
 *   with Ho = (H + 2*ph - dh*(kh-1) - 1) / sh + 1 (likewise Wo). groups divides Cin and Cout
 *   (groups == Cin is the depthwise case). stride, padding and dilation are int64 arrays {h, w};
 *   NULL means stride 1 / padding 0 / dilation 1.
 *   float32, float64, float16 and bfloat16 (LM_ERR_DTYPE otherwise); x, w, bias (and residual,
 *   grad_out) share one dtype; outputs and gradients have that dtype; all tensors on one device
 *   (LM_ERR_DEVICE otherwise). Inputs may have any strides.
 * float16 / bfloat16 (PyTorch's semantics outside autocast): products accumulated in float32,
 *   each result rounded once (round to nearest even). bfloat16 channels-last convolutions on CPUs
 *   with AVX512_BF16 (lm_cpu_isa() LM_ISA_AVX512_BF16 or LM_ISA_AMX) run native kernels, chosen
 *   from the lists of kernels/cpu/conv.c: forward and backward data on AMX tiles
 *   (conv_bf16_amx.c; groups 1), Winograd with bfloat16 products for 3x3 stride-1 layers
 *   (conv_winograd_bf16_avx512bf16.c) or the vdpbf16ps implicit GEMM over channel pairs
 *   (conv_direct_bf16_avx512bf16.c; groups 1 or depthwise); the weight gradient as im2col + the
 *   bfloat16 GEMM, on AMX tiles or with vdpbf16ps (conv_bwdw_bf16_avx512bf16.c), or Winograd with
 *   bfloat16 products for the 3x3 stride-1 layers with 64+ input channels. LUMEN_CONV_BF16=0
 *   turns the vdpbf16ps kernels off. Everything else (float16 always, NCHW, other groups,
 *   lm_cpu_set_isa(LM_ISA_AVX512) or below, and without AMX the CPUs where vdpbf16ps does not pay:
 *   lm_cpu_bf16_dot_pays) computes the float32 convolution of the widened inputs with the float32
 *   kernels below and rounds it: bit-for-bit that float32 result, rounded.
 *
 * Memory format (`fmt`): LM_CONTIGUOUS (NCHW kernels: im2col + GEMM per image tile and group) or
 *   LM_CHANNELS_LAST (NHWC kernels). LM_PRESERVE (or any negative value) means "decide":
 *   lm_conv_memory_format(x, w). Outputs and gradients are allocated in fmt; an input that is not
 *   dense in fmt is copied to fmt once (lm_clone).
 * Algorithms for float32 NHWC on AVX-512 CPUs (kernels/cpu/conv_*_f32_avx512.c),
 *   chosen from the geometry alone (so a gradient computed alone equals the same gradient
 *   computed with the others):
 *   - 3x3, stride 1, dilation 1, groups 1, padding <= 2, maps of 4+ pixels, 11..16, 22..32 or
 *     44..64 reduction channels (C; O for backward data), or more than 64 with at most a quarter
 *     of padding to a multiple of 64 (forward and backward data): Winograd F(4x4,3x3) (4x fewer
 *     multiply-adds than direct; float32 error about 2x the direct sum's, ~1e-6 of the sum of
 *     the terms' magnitudes).
 *   - 1x1, stride 1, no padding, groups 1, up to 2048 reduction channels, forward and backward
 *     data: pointwise kernels (conv_pointwise_f32_avx512.c) over runs of pixels with the weights
 *     packed once per call; non-temporal stores when output and input together exceed the
 *     last-level cache.
 *   - up to 64 reduction channels (1, 5..8, 11..16, 22..32, 44..64) on rows of 14+ pixels:
 *     register-blocked direct kernels (conv_direct_rb_f32_avx512.c) over a zero-padded copy of the
 *     input rows; the single-channel weight gradient (a network's grey-image stem) likewise.
 *   - otherwise direct implicit-GEMM kernels that read the activations in place
 *     (conv_direct_f32_avx512.c); depthwise convolutions have kernels vectorized over C
 *     (conv_depthwise_f32_avx512.c).
 *   Without AVX-512 (or float64, or lm_cpu_set_isa(LM_ISA_C or LM_ISA_AVX2)): im2col panels of
 *   output-pixel tiles + GEMM, a plain GEMM for 1x1/stride-1 convolutions, direct depthwise
 *   kernels.
 *   Environment switches (read at each call; for tests and benchmarks): LUMEN_CONV_WINOGRAD=0
 *   turns Winograd off, =2 selects F(2x2,3x3) for forward and backward data (more accurate than
 *   the direct sum, ~1.5x slower than F(4x4)), =4 takes F(4x4) wherever it can run (also on
 *   fewer tiles than pay); LUMEN_CONV_RB=0 turns the register-blocked
 *   kernels off; LUMEN_CONV_PW=0 the pointwise ones; LUMEN_CONV_STREAM=0/1 forces their
 *   non-temporal stores off/on; LUMEN_CONV_BWDW_GEMM=0 keeps the weight gradient of wide 1x1
 *   layers (O*C >= 512K), and the input gradient of the strided ones, on the direct kernels
 *   instead of one GEMM.
 *   Results do not vary from run to run (fixed reduction order for a given thread count).
 *
 * Result arguments follow lumen.h: *out == NULL allocates (caller owns it); a non-NULL *out is an
 * out= tensor (shape must match, it keeps its strides, its dtype must equal the input's).
 */
#ifndef LUMEN_CONV_H
#define LUMEN_CONV_H
#include "lumen.h"

/* The output format PyTorch picks for a convolution: LM_CHANNELS_LAST when x or w suggests
   channels-last (lm_suggest_memory_format(t, 0)), else LM_CONTIGUOUS. Applied to float64 too
   (PyTorch's CPU slow path does the same; only its mkldnn path excludes double). */
int lm_conv_memory_format(const lm_tensor *x, const lm_tensor *w);

/* Output spatial size {Ho, Wo} for the given geometry (no tensor needed); LM_ERR_SHAPE with
   PyTorch's message when the kernel does not fit the padded input. */
lm_status lm_conv2d_output_size(const int64_t *in_hw, const int64_t *kernel_hw,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t *out_hw);

/* The activation of a convolution's fused epilogue (lm_conv2d's act), applied after the bias and
   the residual, in the kernel, before the result is stored (and rounded, for the 16-bit types):
   PyTorch's formulas, as the elementwise ops compute them (lm_unary's LM_RELU, LM_SILU, ...;
   relu6 is lm_clamp(x, 0, 6)). LM_ACT_RELU is 1, so the older relu flag (0 / 1) keeps its
   meaning. */
typedef enum lm_conv_act {
   LM_ACT_NONE = 0,
   LM_ACT_RELU = 1,      /* max(x, 0) */
   LM_ACT_RELU6,         /* min(max(x, 0), 6) */
   LM_ACT_SILU,          /* x * sigmoid(x) */
   LM_ACT_HARDSWISH,     /* x * relu6(x + 3) / 6 */
   LM_ACT_HARDSIGMOID,   /* relu6(x + 3) / 6 */
   LM_ACT_SIGMOID,       /* 1 / (1 + exp(-x)) */
   LM_ACT_GELU,          /* x * Phi(x) (erf) */
   LM_ACT_GELU_TANH,     /* gelu's tanh approximation */
   LM_NUM_ACT
} lm_conv_act;

/* out = act(conv2d(x, w) + bias + residual). bias and residual may be NULL; residual has the
   output's shape (any strides) and is added before the activation; act is an lm_conv_act
   (LM_ACT_NONE: none; LM_ERR_ARG outside [0, LM_NUM_ACT)). */
lm_status lm_conv2d(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, int fmt, int act, const lm_tensor *residual,
                    lm_tensor **out);

/* Gradients of conv2d (without the fused epilogue: pass the gradient through the activation's
   derivative first).
   grad_out has the output's shape, any strides. Each of grad_x (x's shape), grad_w (w's shape)
   and grad_b (shape (Cout)) may be NULL (the pointer) to skip it; the tensors are allocated in
   fmt as above. */
lm_status lm_conv2d_backward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *grad_out,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups, int fmt,
                             lm_tensor **grad_x, lm_tensor **grad_w, lm_tensor **grad_b);

/* ---- 3-D convolution (src/ops/conv3d.c) ----
 * PyTorch's conv3d: x (N, Cin, D, H, W), w (Cout, Cin/groups, kd, kh, kw), bias NULL or (Cout),
 * output (N, Cout, Do, Ho, Wo) (each size as conv2d's); stride, padding, dilation are int64
 * arrays {d, h, w} (NULL: 1 / 0 / 1). Dtypes, devices, out= and the fused epilogue (bias,
 * residual of the output's shape, the activation act) as lm_conv2d.
 * Memory format (`fmt`): LM_CONTIGUOUS (NCDHW) or LM_CHANNELS_LAST_3D (NDHWC); LM_PRESERVE (or
 * any negative value) means lm_conv3d_memory_format(x, w). Outputs and gradients are allocated
 * in fmt.
 * It runs as one lm_conv2d (one lm_conv2d_backward) over the batch N*Do, with the kd depth taps
 * of the input side by side in the channels (a copy of kd times the input; none for a depth-1
 * kernel of stride 1 without depth padding on a channels_last_3d input), so the 2-D kernels and
 * their algorithm choice apply (see above); NCDHW adds one permuting copy of the output. */
int lm_conv3d_memory_format(const lm_tensor *x, const lm_tensor *w);
lm_status lm_conv3d_output_size(const int64_t *in_dhw, const int64_t *kernel_dhw,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t *out_dhw);
lm_status lm_conv3d(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, int fmt, int act, const lm_tensor *residual,
                    lm_tensor **out);
lm_status lm_conv3d_backward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *grad_out,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups, int fmt,
                             lm_tensor **grad_x, lm_tensor **grad_w, lm_tensor **grad_b);

#endif
