/* softmax.c -- the front end of softmax / log_softmax over one dim, forward and backward.
 *
 * As in PyTorch the input is made contiguous and the result is contiguous (whatever the input's
 * memory format). Kernels: LM_OP_SOFTMAX, LM_OP_SOFTMAX_BACKWARD (softmax.h).
 *
 * float16 / bfloat16 (PyTorch: the result in the input's dtype, computed in float32): the
 * operands are widened once to float32 copies, the float32 kernel runs, and its result is rounded
 * once into the half result. The softmax of a half row is a few exp per element, memory-bound
 * on the copies; not on the ResNet training step's hot path (one (N, classes) call per step). */
#include "common.h"
#include "nn.h"
#include "softmax.h"

static lm_status softmax_forward(const lm_tensor *x, int dim, int lg, lm_tensor **out) {
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(lm_wrap_dim(&dim, x->ndim));
   out_slot so;
   const lm_tensor *xd;
   lm_tensor *tmp = NULL, *o32 = NULL, *otmp = NULL;
   LM_TRY(out_open(&so, out, x->ndim, x->sizes, x->dtype, LM_CONTIGUOUS, x->device, "output"));
   lm_status st = dense_float_in_format(x, LM_CONTIGUOUS, &xd, &tmp);
   if (st == LM_OK && x->numel > 0) st = half_open(so.t, LM_CONTIGUOUS, &o32, &otmp);
   if (st == LM_OK && x->numel > 0) {
      const lm_softmax_params p = {dim, lg};
      lm_tensor *ts[2] = {(lm_tensor *)xd, o32};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX, 2, ts, &p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, otmp, st);
   lm_tensor_free(tmp);
   return out_close(&so, out, st);
}

static lm_status softmax_backward(const lm_tensor *grad_out, const lm_tensor *y, int dim, int lg,
                                  lm_tensor **grad_x, const char *what) {
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(check_float(y, "output"));
   LM_TRY(lm_check_same_device(grad_out, y, what));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (grad_out->dtype != y->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but output has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(y->dtype));
   if (grad_out->ndim != y->ndim ||
       memcmp(grad_out->sizes, y->sizes, (size_t)y->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, y->ndim, y->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match output %s", what, a, b);
   }
   LM_TRY(lm_wrap_dim(&dim, y->ndim));
   out_slot so;
   const lm_tensor *gd = NULL, *yd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *g32 = NULL, *gtmp = NULL;
   LM_TRY(out_open(&so, grad_x, y->ndim, y->sizes, y->dtype, LM_CONTIGUOUS, y->device,
                   "grad_input"));
   lm_status st = dense_float_in_format(grad_out, LM_CONTIGUOUS, &gd, &t1);
   if (st == LM_OK) st = dense_float_in_format(y, LM_CONTIGUOUS, &yd, &t2);
   if (st == LM_OK && y->numel > 0) st = half_open(so.t, LM_CONTIGUOUS, &g32, &gtmp);
   if (st == LM_OK && y->numel > 0) {
      const lm_softmax_params p = {dim, lg};
      lm_tensor *ts[3] = {(lm_tensor *)gd, (lm_tensor *)yd, g32};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX_BACKWARD, 3, ts, &p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, gtmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   return out_close(&so, grad_x, st);
}

lm_status lm_softmax(const lm_tensor *x, int dim, lm_tensor **out) {
   return softmax_forward(x, dim, 0, out);
}

lm_status lm_log_softmax(const lm_tensor *x, int dim, lm_tensor **out) {
   return softmax_forward(x, dim, 1, out);
}

lm_status lm_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                              lm_tensor **grad_x) {
   return softmax_backward(grad_out, out, dim, 0, grad_x, "softmax_backward");
}

lm_status lm_log_softmax_backward(const lm_tensor *grad_out, const lm_tensor *out, int dim,
                                  lm_tensor **grad_x) {
   return softmax_backward(grad_out, out, dim, 1, grad_x, "log_softmax_backward");
}
