/*
 * nn.h -- pooling, batch norm, softmax and loss operators, and the fused optimizer steps. Plain C
 * declarations only: this text is appended to src/lumen.h for ffi.cdef (every line starting with
 * '#' is dropped).
 *
 * Each operator is a front end in src/ops/ (pool.c, norm.c, softmax.c, loss.c: the argument
 * checks, the output's sizes and memory format, the allocation of every result, then
 * lm_dispatch) and one kernel per device (the CPU's in kernels/cpu/pool*.c, norm.c, softmax.c,
 * loss.c). The front ends never touch tensor memory, so every operator here runs on any device:
 * cpu, sim:N (the test device: the CPU's kernels) and meta (sizes, strides, dtype; nothing is
 * computed); others through lm_dispatch (src/backend.h, docs/devices.md).
 *
 * Common rules (PyTorch semantics):
 *   - Inputs are float32, float64, float16 or bfloat16 (LM_ERR_DTYPE otherwise), with any
 *     strides, all on one
 *     device (LM_ERR_DEVICE "expected all tensors to be on the same device" otherwise). Results
 *     are allocated on the input's device; an out= tensor on another device is LM_ERR_DEVICE.
 *   - float16 / bfloat16 (PyTorch): results and input gradients have the input's dtype and the
 *     memory format a float32 input would give; the computation is float32 (or wider) and the
 *     result is rounded once (max pooling exactly; batch-norm statistics in float32).
 *   - Pools and batch norm pick mf = lm_suggest_memory_format(x); the output, the indices and the
 *     input gradient are allocated in mf. Channels-last runs NHWC kernels (vectorized over C),
 *     contiguous runs NCHW kernels (over planes); an input that is not dense in mf is cloned to
 *     mf once first. 3-D (C,H,W) inputs are accepted by the pools (contiguous path).
 *   - Result arguments follow lumen.h: *out == NULL allocates (caller owns it); a non-NULL *out
 *     is an out= tensor (shape must match; it keeps its strides).
 *   - int64 arrays of two elements are {H, W}. For the pools, `stride` may be NULL (= kernel),
 *     `padding` NULL (= 0) and `dilation` NULL (= 1).
 *   - Indices (max pools) are int64, the flat position h*W + w inside the input plane. Errors
 *     that depend on values (an index or a target out of range) come from the kernels, on every
 *     device that computes (not on meta, which reads no values).
 */
#ifndef LUMEN_NN_H
#define LUMEN_NN_H
#include "lumen.h"

/* ---- pooling (src/ops/pool.c; kernels/cpu/pool.c, pool_max.c, pool_avg.c, pool_nhwc_v512.c) */
/* indices may be NULL (the pointer) when they are not wanted */
lm_status lm_max_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices);
lm_status lm_max_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *indices, lm_tensor **grad_x);
/* The same gradient, given the forward's geometry (kernel .. ceil_mode as lm_max_pool2d; grad_out
   and indices must have its output shape). Channels-last gathers: each input pixel is written
   once, as the sum over the windows that have it as a tap and whose index names it, in window
   order, so the result is bit-identical to lm_max_pool2d_backward's; an index that is neither -1
   nor a tap of its window inside the plane is an error (LM_ERR_ARG, "out of range"). Contiguous
   inputs take lm_max_pool2d_backward's scatter (an index outside the plane is the error). */
lm_status lm_max_pool2d_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *indices, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x);
/* max_pool2d for autograd: *taps (must be NULL; a new uint8 tensor in mf, of out's shape) gets,
   instead of the int64 index, the tap number of each window's max, i * kw + j for the tap in
   window row i and column j (counted from the window's first tap, in the padding or not), or 255
   for a window without an input element: an eighth of the memory. kernel[0] * kernel[1] must be
   at most 255 (LM_ERR_ARG otherwise). The max and the tap it comes from are those of
   lm_max_pool2d (same ties and NaNs). */
lm_status lm_max_pool2d_taps(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                             const int64_t *padding, const int64_t *dilation, int ceil_mode,
                             lm_tensor **out, lm_tensor **taps);
/* lm_max_pool2d_backward_geom from those tap numbers: the same gradient, bit-identical. A number
   that is neither 255 nor a tap of its window inside the plane is an error (LM_ERR_ARG, "out of
   range"). */
lm_status lm_max_pool2d_taps_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *taps, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x);

/* divisor_override: NULL for none (a pointer to 0 is an error, as in PyTorch) */
lm_status lm_avg_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out);
lm_status lm_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x);

/* out_size {OH, OW}: any sizes >= 0 (larger than the input too). Output (1,1) of a channels-last
   input is (N,C,1,1) with strides (C,1,C,C), i.e. it keeps the channels-last tag. */
lm_status lm_adaptive_avg_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out);
lm_status lm_adaptive_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x);
lm_status lm_adaptive_max_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices);
lm_status lm_adaptive_max_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          const lm_tensor *indices, lm_tensor **grad_x);

/* ---- 3-D pooling (src/ops/pool3d.c; kernels/cpu/pool3d.c) ----
 * x: (N, C, D, H, W) or unbatched (C, D, H, W). int64 arrays of three elements are {D, H, W};
 * stride may be NULL (= kernel), padding NULL (= 0), dilation NULL (= 1). Indices are int64, the
 * flat position (d * H + h) * W + w inside the input volume. Every result of a channels_last_3d
 * input is channels_last_3d (issue 19's rule: PyTorch 2.15 returns contiguous for avg_pool3d and
 * the adaptive pools; values identical), of any other input contiguous. The backwards scatter per
 * (sample, channel block) in window order: deterministic. */
lm_status lm_max_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices);
lm_status lm_max_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *indices, lm_tensor **grad_x);
/* The same gradient, given the forward's geometry (kernel .. ceil_mode as lm_max_pool3d; grad_out
   and indices must have its output shape): the result is lm_max_pool3d_backward's bit for bit
   (any index inside the volume is taken, one outside is LM_ERR_ARG "out of range"); a device may
   use the geometry to gather instead of scattering (the CUDA kernels do). */
lm_status lm_max_pool3d_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *indices, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x);
lm_status lm_avg_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out);
lm_status lm_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x);
/* out_size {OD, OH, OW}: any sizes >= 0 */
lm_status lm_adaptive_avg_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out);
lm_status lm_adaptive_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x);
lm_status lm_adaptive_max_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices);
lm_status lm_adaptive_max_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          const lm_tensor *indices, lm_tensor **grad_x);

/* ---- batch norm (src/ops/norm.c; kernels/cpu/norm.c) ----
 * x: (N, C, ...) of rank >= 2. weight, bias, running_mean, running_var: NULL or 1-D of C
 * elements (any floating dtype). training != 0: normalise with the batch mean and biased variance;
 * running stats (when given) are updated in place:
 *    running = (1 - momentum) * running + momentum * batch_stat  (the variance unbiased).
 * training == 0: normalise with the running stats (both required).
 * save_mean / save_invstd (pointers may be NULL): (C) tensors of x's dtype (float32 for a
 * float16 / bfloat16 x: the statistics are float32) holding the mean and
 * 1/sqrt(var + eps) that were used, batch stats when training and running stats in eval mode,
 * exactly what lm_batch_norm_backward needs. */
lm_status lm_batch_norm(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                        lm_tensor *running_mean, lm_tensor *running_var, int training,
                        double momentum, double eps, lm_tensor **out, lm_tensor **save_mean,
                        lm_tensor **save_invstd);
/* training selects the formula (batch statistics or constants). Any of grad_x, grad_weight,
   grad_bias may be NULL (the pointer) to skip it; grad_weight / grad_bias have weight's dtype
   (x's when weight is NULL). */
lm_status lm_batch_norm_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *weight, const lm_tensor *save_mean,
                                 const lm_tensor *save_invstd, int training,
                                 lm_tensor **grad_x, lm_tensor **grad_weight,
                                 lm_tensor **grad_bias);

/* Fused forms (the ResNet block):
 *   lm_batch_norm_fused: out = batch_norm(x) + residual (when residual != NULL), then relu when
 *      relu != 0 (NaN stays NaN); residual has x's dtype and sizes, any strides. Otherwise as
 *      lm_batch_norm (which is lm_batch_norm_fused(..., NULL, 0, ...)).
 *   lm_batch_norm_backward_fused: the backward of relu(batch_norm(x) [+ residual]) given the
 *      relu's output relu_out (x's dtype and sizes): grad_out is first masked as relu_backward
 *      does (0 where relu_out <= 0); grad_masked (may be NULL; needs relu_out) receives that
 *      masked gradient (the residual's gradient), in mf. relu_out NULL: lm_batch_norm_backward. */
lm_status lm_batch_norm_fused(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                              lm_tensor *running_mean, lm_tensor *running_var, int training,
                              double momentum, double eps, const lm_tensor *residual, int relu,
                              lm_tensor **out, lm_tensor **save_mean, lm_tensor **save_invstd);
lm_status lm_batch_norm_backward_fused(const lm_tensor *grad_out, const lm_tensor *relu_out,
                                       const lm_tensor *x, const lm_tensor *weight,
                                       const lm_tensor *save_mean, const lm_tensor *save_invstd,
                                       int training, lm_tensor **grad_x, lm_tensor **grad_weight,
                                       lm_tensor **grad_bias, lm_tensor **grad_masked);

/* ---- group norm (src/ops/norm_group.c; kernels/cpu/norm_group.c) ----
 * x: (N, C, ...) of rank >= 2 with C divisible by num_groups; weight, bias: NULL or 1-D of C
 * elements (any floating dtype). out = (x - mean) * rstd * weight + bias over each sample's group
 * of C / num_groups channels (biased variance), in x's suggested memory format (contiguous,
 * channels-last or channels-last-3d). mean / rstd (pointers may be NULL): (N, num_groups) tensors,
 * float32 for float16 / bfloat16 x, else x's dtype; rstd = 1 / sqrt(var + eps). */
lm_status lm_group_norm(const lm_tensor *x, int num_groups, const lm_tensor *weight,
                        const lm_tensor *bias, double eps, lm_tensor **out, lm_tensor **mean,
                        lm_tensor **rstd);
/* any of grad_x, grad_weight, grad_bias may be NULL (the pointer) to skip it; grad_weight /
   grad_bias have weight's dtype (x's when weight is NULL); grad_x is in x's memory format */
lm_status lm_group_norm_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *mean, const lm_tensor *rstd,
                                 const lm_tensor *weight, int num_groups, lm_tensor **grad_x,
                                 lm_tensor **grad_weight, lm_tensor **grad_bias);

/* ---- resample (src/ops/resample.c; kernels/cpu/resample.c): the middle dim of x (B, In, R)
   resampled to Out = ptr's size - 1 positions by a table of taps: output row o is
   sum over k in [ptr[o], ptr[o + 1]) of w[k] * x[:, idx[k], :], the products added in that
   order (a row without taps is 0). ptr and idx int64 (0-based), w float64 for a float64 x and
   float32 otherwise (halves compute in float32 and round once), all 1-D on x's device. The result
   is a contiguous (B, Out, R) of x's dtype. F.interpolate runs one pass per resized dim, its
   backward the transposed table. Bad taps (ptr not from 0 up to idx's size, an index outside
   [0, In)) are an error on the CPU and give NaN rows on CUDA ---- */
lm_status lm_resample(const lm_tensor *x, const lm_tensor *ptr, const lm_tensor *idx,
                      const lm_tensor *w, lm_tensor **out);

/* ---- softmax (src/ops/softmax.c; kernels/cpu/softmax.c): any rank (0-dim too), any dim
   (negative counts from the end); the result is contiguous, as in PyTorch ---- */
lm_status lm_softmax(const lm_tensor *x, int dim, lm_tensor **out);
lm_status lm_log_softmax(const lm_tensor *x, int dim, lm_tensor **out);
/* out is the forward result */
lm_status lm_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                              lm_tensor **grad_x);
lm_status lm_log_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                                  lm_tensor **grad_x);

/* ---- losses (src/ops/loss.c; kernels/cpu/loss.c) ---- */
typedef enum lm_reduction {
   LM_REDUCTION_NONE = 0, LM_REDUCTION_MEAN = 1, LM_REDUCTION_SUM = 2
} lm_reduction;

/* input: log-probabilities (N, C), (C) or (N, C, d1, ...); target: int64 (N), () or
   (N, d1, ...); weight: NULL or (C). Targets equal to ignore_index are skipped; others must lie
   in [0, C). out: 0-dim for MEAN / SUM, target-shaped for NONE. total_weight (may be NULL): 0-dim,
   the sum of the weights of the counted targets (needed by the backward). MEAN divides by it (so
   all-ignored gives NaN, as PyTorch). */
lm_status lm_nll_loss(const lm_tensor *input, const lm_tensor *target, const lm_tensor *weight,
                      int reduction, int64_t ignore_index, lm_tensor **out,
                      lm_tensor **total_weight);
/* grad_out: 0-dim for MEAN / SUM, target-shaped for NONE; total_weight from the forward (only
   read for MEAN). grad_input has input's shape, contiguous. */
lm_status lm_nll_loss_backward(const lm_tensor *grad_out, const lm_tensor *input,
                               const lm_tensor *target, const lm_tensor *weight, int reduction,
                               int64_t ignore_index, const lm_tensor *total_weight,
                               lm_tensor **grad_input);

/* ---- fused optimizer steps (src/elementwise.c; kernels/cpu/optim.c): one pass per parameter,
 * in place ----
 * grad and the state tensors must have the parameter's dtype (float32 or float64), sizes and
 * strides, all non-overlapping and dense (LM_ERR_ARG / LM_ERR_DTYPE otherwise: the caller falls
 * back to separate ops). The arithmetic is PyTorch 1.13's single-tensor update, rounded to the
 * dtype after each step as the separate ops do.
 *   SGD: d = grad (negated when maximize) [+ weight_decay * p]; with momentum != 0:
 *        buf = d when first, else buf * momentum + (1 - dampening) * d; d = nesterov ?
 *        d + momentum * buf : buf (momentum_buffer may be NULL when momentum == 0);
 *        p += -lr * d.
 *   Adam / AdamW (decoupled): as optim/init.lua's adam_update; step is the (already
 *        incremented) step count; max_exp_avg_sq is NULL unless amsgrad. */
lm_status lm_sgd_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int maximize, int first);
/* lm_sgd_step with the learning rate read from lr (one float64 element on param's device) when
   the kernel runs, not when it is queued: a CUDA graph that captured the step replays it with
   lr's value at each replay (lm.optim.SGD's capturable option) */
lm_status lm_sgd_step_lr(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                         const lm_tensor *lr, double momentum, double dampening,
                         double weight_decay, int nesterov, int maximize, int first);
lm_status lm_adam_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                       lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, double lr, double beta1,
                       double beta2, double eps, double weight_decay, int decoupled,
                       int maximize, int64_t step);
/* lm_adam_step with the learning rate and the step count (already incremented, >= 1) read from
   one-element float64 tensors on param's device when the kernel runs (lm.optim.Adam / AdamW's
   capturable option, for CUDA graphs) */
lm_status lm_adam_step_dev(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                           lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, const lm_tensor *lr,
                           const lm_tensor *step, double beta1, double beta2, double eps,
                           double weight_decay, int decoupled, int maximize);

/* ---- indexing: sort, gather, scatter_add_, cumsum (src/ops/indexing.c; kernels/cpu/indexing.c,
 * kernels/cuda/indexing.cu). Any rank (0-dim too), any dim (negative from the end), every dtype,
 * inputs of any strides (read in place, no copy). Index values are `base`-based: 0 from C, 1
 * from the Lua API (its indices are 1-based); base is 0 or 1. An index value outside
 * [base, base + size) is an LM_ERR_ARG error naming it ("index 7 is out of bounds for
 * dimension 2 with size 5", dimension counted from base), raised before anything is written.
 *   sort: stable (ties keep their order), NaN larger than every number; values and int64
 *     indices of x's sizes, with x's strides when x is non-overlapping and dense (channels-last
 *     stays channels-last), else dense strides in x's dim order (torch.sort's layout); both are
 *     fresh tensors (no out=: whatever *values and *indices held is overwritten).
 *   gather: out[i][j][k] = x[index[i][j][k]][j][k] (dim 0); index int64 of x's rank, no larger
 *     than x in the dims but dim; out contiguous with index's sizes and x's dtype (a non-NULL
 *     *out is an out= tensor, as the other operators' are; cumsum's too).
 *   scatter_add_: self[index[i][j][k]][j][k] += src[i][j][k] (dim 0), in place, in order along
 *     dim (deterministic on every device); index no larger than src, nor than self but along
 *     dim; src of self's dtype.
 *   cumsum: inclusive prefix sums along dim (reverse: suffix sums); dtype < 0 gives x's dtype
 *     for floating x and int64 for integers and bool (PyTorch's); the result is contiguous, or
 *     the out= tensor, written in place when it is non-overlapping and dense in any layout. ---- */
lm_status lm_sort(const lm_tensor *x, int dim, int descending, int64_t base, lm_tensor **values,
                  lm_tensor **indices);
lm_status lm_gather(const lm_tensor *x, int dim, const lm_tensor *index, int64_t base,
                    lm_tensor **out);
lm_status lm_scatter_add_(lm_tensor *self, int dim, const lm_tensor *index, const lm_tensor *src,
                          int64_t base);
lm_status lm_cumsum(const lm_tensor *x, int dim, int reverse, int dtype, lm_tensor **out);

#endif
