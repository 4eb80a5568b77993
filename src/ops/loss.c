/* loss.c -- the front end of the negative log-likelihood loss, forward and backward
 * (cross_entropy is log_softmax + nll_loss, composed in Lua).
 *
 * input (N, C), (C) or (N, C, d1, ...) of log-probabilities, any strides; target int64 of the
 * input's shape without the class dim. No operand is copied: the kernels walk the samples over
 * the target shape (loss.h). The results are contiguous, on the input's device. The target
 * values are checked by the kernels (LM_OP_NLL_LOSS, LM_OP_NLL_LOSS_BACKWARD).
 *
 * float16 / bfloat16 input: the kernels read every dtype and sum in double, so a half input
 * needs no copy; the loss (and grad_input) come out in the input's dtype, rounded once, as in
 * PyTorch. total_weight, which only the backward reads, stays float32 for them: a count of
 * samples past 256 is not exact in bfloat16, and the mean's gradient divides by it. */
#include "common.h"
#include "loss.h"
#include "nn.h"

/* every check of input, target, weight and reduction that needs no values */
static lm_status nll_check(const lm_tensor *input, const lm_tensor *target,
                           const lm_tensor *weight, int reduction) {
   if (!input) return lm_error(LM_ERR_ARG, "input is nil");
   if (!target) return lm_error(LM_ERR_ARG, "target is nil");
   LM_TRY(check_device(input, target, "target"));
   LM_TRY(check_float(input, "input"));
   if (target->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "expected target of dtype int64, got %s",
                      lm_dtype_name(target->dtype));
   if (reduction < LM_REDUCTION_NONE || reduction > LM_REDUCTION_SUM)
      return lm_error(LM_ERR_ARG, "invalid reduction %d (0 none, 1 mean, 2 sum)", reduction);
   if (input->ndim < 1) return lm_error(LM_ERR_SHAPE, "input tensor should be 1D or more");
   char a[160], b[160];
   lm_format_shape(a, sizeof a, input->ndim, input->sizes);
   lm_format_shape(b, sizeof b, target->ndim, target->sizes);
   if (input->ndim <= 2 && target->ndim > 1)
      return lm_error(LM_ERR_SHAPE, "0D or 1D target tensor expected, multi-target not supported");
   if (input->ndim == 1 && target->ndim != 0)
      return lm_error(LM_ERR_SHAPE, "1D input %s expects a 0D target, got %s", a, b);
   if (input->ndim == 2 && target->ndim == 1 && input->sizes[0] != target->sizes[0])
      return lm_error(LM_ERR_SHAPE,
                      "Expected input batch_size (%lld) to match target batch_size (%lld).",
                      (long long)input->sizes[0], (long long)target->sizes[0]);
   if (input->ndim == 2 && target->ndim == 0)
      return lm_error(LM_ERR_SHAPE, "2D input %s expects a 1D target, got %s", a, b);
   if (input->ndim >= 3) {
      int ok = target->ndim == input->ndim - 1 && target->sizes[0] == input->sizes[0];
      for (int d = 2; ok && d < input->ndim; d++)
         if (target->sizes[d - 1] != input->sizes[d]) ok = 0;
      if (!ok)
         return lm_error(LM_ERR_SHAPE, "input %s expects a target of its shape without dim 1, got %s",
                         a, b);
   }
   if (weight) {
      const int64_t C = input->sizes[input->ndim == 1 ? 0 : 1];
      LM_TRY(check_device(input, weight, "weight"));
      if (!lm_is_float_dtype(weight->dtype))
         return lm_error(LM_ERR_DTYPE, "expected weight to be a floating tensor, got %s",
                         lm_dtype_name(weight->dtype));
      if (weight->ndim != 1 || weight->numel != C) {
         lm_format_shape(b, sizeof b, weight->ndim, weight->sizes);
         return lm_error(LM_ERR_SHAPE,
                         "weight tensor should be defined either for all %lld classes or no "
                         "classes but got weight tensor of shape: %s",
                         (long long)C, b);
      }
   }
   return LM_OK;
}

lm_status lm_nll_loss(const lm_tensor *input, const lm_tensor *target, const lm_tensor *weight,
                      int reduction, int64_t ignore_index, lm_tensor **out,
                      lm_tensor **total_weight) {
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(nll_check(input, target, weight, reduction));
   out_slot so = {0}, sw = {0};
   const int dt = input->dtype;
   const int64_t scalar[1] = {1}; /* the sizes of a 0-dim result (none read) */
   lm_status st;
   if (reduction == LM_REDUCTION_NONE)
      st = out_open(&so, out, target->ndim, target->sizes, dt, LM_CONTIGUOUS, input->device,
                    "output");
   else
      st = out_open(&so, out, 0, scalar, dt, LM_CONTIGUOUS, input->device, "output");
   if (st == LM_OK && total_weight)
      st = out_open(&sw, total_weight, 0, scalar, is_half(dt) ? LM_FLOAT32 : dt, LM_CONTIGUOUS,
                    input->device, "total_weight");
   if (st == LM_OK) {
      const lm_nll_loss_params p = {reduction, ignore_index};
      lm_tensor *ts[5] = {(lm_tensor *)input, (lm_tensor *)target, (lm_tensor *)weight, so.t,
                          sw.t};
      const lm_op op = lm_op_make(LM_OP_NLL_LOSS, 5, ts, &p);
      st = lm_dispatch(&op);
   }
   if (total_weight) {
      st = out_close(&sw, total_weight, st);
   }
   st = out_close(&so, out, st);
   return st;
}

lm_status lm_nll_loss_backward(const lm_tensor *grad_out, const lm_tensor *input,
                               const lm_tensor *target, const lm_tensor *weight, int reduction,
                               int64_t ignore_index, const lm_tensor *total_weight,
                               lm_tensor **grad_input) {
   if (!grad_input) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (!grad_out) return lm_error(LM_ERR_ARG, "grad_output is nil");
   if (!lm_is_float_dtype(grad_out->dtype))
      return lm_error(LM_ERR_DTYPE, "expected grad_output to be floating, got %s",
                      lm_dtype_name(grad_out->dtype));
   LM_TRY(nll_check(input, target, weight, reduction));
   LM_TRY(check_device(input, grad_out, "grad_output"));
   if (total_weight) LM_TRY(check_device(input, total_weight, "total_weight"));
   if (reduction == LM_REDUCTION_NONE) {
      if (grad_out->ndim != target->ndim ||
          memcmp(grad_out->sizes, target->sizes, (size_t)target->ndim * sizeof(int64_t)) != 0) {
         char a[160], b[160];
         lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
         lm_format_shape(b, sizeof b, target->ndim, target->sizes);
         return lm_error(LM_ERR_SHAPE,
                         "nll_loss_backward: grad_output %s should have the target's shape %s", a,
                         b);
      }
   } else {
      if (grad_out->numel != 1)
         return lm_error(LM_ERR_SHAPE,
                         "nll_loss_backward: expected a 1-element grad_output, got %lld elements",
                         (long long)grad_out->numel);
      if (reduction == LM_REDUCTION_MEAN) {
         if (!total_weight)
            return lm_error(LM_ERR_ARG, "nll_loss_backward: total_weight is required for mean");
         if (total_weight->numel != 1)
            return lm_error(LM_ERR_SHAPE,
                            "nll_loss_backward: expected a 1-element total_weight, got %lld "
                            "elements",
                            (long long)total_weight->numel);
      }
   }
   out_slot so = {0};
   lm_status st = out_open(&so, grad_input, input->ndim, input->sizes, input->dtype,
                           LM_CONTIGUOUS, input->device, "grad_input");
   if (st == LM_OK) {
      const lm_nll_loss_params p = {reduction, ignore_index};
      lm_tensor *ts[6] = {(lm_tensor *)grad_out, (lm_tensor *)input, (lm_tensor *)target,
                          (lm_tensor *)weight, (lm_tensor *)total_weight, so.t};
      const lm_op op = lm_op_make(LM_OP_NLL_LOSS_BACKWARD, 6, ts, &p);
      st = lm_dispatch(&op);
   }
   return out_close(&so, grad_input, st);
}
