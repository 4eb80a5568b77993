/* norm.c -- the front end of batch normalisation, forward (training and eval) and backward, and
 * the fused forms used by the ResNet blocks: relu(batch_norm(x) [+ residual]) forward, and the
 * backward of batch_norm followed by a relu (the relu's gradient mask taken from its output).
 *
 * mf = x.suggest_memory_format() (contiguous unless channels-last / channels-last-3d); the
 * results that have x's shape are made in mf on x's device, and every operand of x's shape that
 * is not dense in mf is cloned once. Kernels: LM_OP_BATCH_NORM, LM_OP_BATCH_NORM_BACKWARD
 * (norm.h), which also update the running statistics in place.
 *
 * float16 / bfloat16 input (PyTorch's mixed case: parameters and running statistics in float32,
 * as under autocast; or all in the input's dtype, as after model:to(bfloat16)): y, grad_input
 * and grad_masked in the input's dtype; the statistics (sums, mean, invstd, the running-stat
 * update) in float32 or wider, so save_mean / save_invstd are float32 for half inputs; the running
 * statistics keep their dtype, grad_weight / grad_bias have the weight's. The kernels read and
 * write half rows (channels innermost: channels-last, or spatial size 1) directly (bn_native);
 * other layouts go through float32 copies of the operands (one rounding of the result). */
#include "common.h"
#include "nn.h"
#include "norm.h"

/* a 1-D parameter of C elements (any floating dtype, any stride) on x's device: check it */
static lm_status check_param(const lm_tensor *x, const lm_tensor *t, int64_t C,
                             const char *what) {
   if (!t) return LM_OK;
   LM_TRY(check_device(x, t, what));
   if (!lm_is_float_dtype(t->dtype))
      return lm_error(LM_ERR_DTYPE, "expected %s to be a floating tensor, got %s", what,
                      lm_dtype_name(t->dtype));
   if (t->numel != C)
      return lm_error(LM_ERR_SHAPE, "%s should contain %lld elements not %lld", what,
                      (long long)C, (long long)t->numel);
   if (t->ndim != 1) {
      char s[160];
      lm_format_shape(s, sizeof s, t->ndim, t->sizes);
      return lm_error(LM_ERR_SHAPE, "%s should be a 1-D tensor of %lld elements, got sizes %s",
                      what, (long long)C, s);
   }
   return LM_OK;
}

/* a running statistic written in place: no two elements in one place (an expanded tensor) */
static lm_status check_writable(const lm_tensor *t, const char *what) {
   if (t && t->ndim == 1 && t->sizes[0] > 1 && t->strides[0] == 0)
      return lm_error(LM_ERR_ARG,
                      "%s: unsupported operation: more than one element of the written-to tensor "
                      "refers to a single memory location. Please clone() the tensor before "
                      "performing the operation.",
                      what);
   return LM_OK;
}

/* an extra operand of the fused ops (residual, relu output): x's device, dtype and sizes */
static lm_status check_like(const lm_tensor *t, const lm_tensor *x, const char *what) {
   LM_TRY(check_device(x, t, what));
   if (t->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "batch_norm: %s has dtype %s but input has %s", what,
                      lm_dtype_name(t->dtype), lm_dtype_name(x->dtype));
   if (t->ndim != x->ndim || memcmp(t->sizes, x->sizes, (size_t)x->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, t->ndim, t->sizes);
      lm_format_shape(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm: %s %s does not match input %s", what, a, b);
   }
   return LM_OK;
}

/* x's channels C, rows M = N * spatial, and the memory format of the results (mf) */
static lm_status bn_geometry(const lm_tensor *x, int64_t *C, int64_t *M, int *mf) {
   if (x->ndim < 2) {
      char s[160];
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm: expected an input of 2 or more dimensions, got %s",
                      s);
   }
   int64_t S = 1;
   for (int d = 2; d < x->ndim; d++) S *= x->sizes[d];
   *C = x->sizes[1];
   *M = x->sizes[0] * S;
   *mf = lm_suggest_memory_format(x, 0);
   if (*mf != LM_CHANNELS_LAST && *mf != LM_CHANNELS_LAST_3D) *mf = LM_CONTIGUOUS;
   return LM_OK;
}

/* can the kernels take x's dtype as it is? float32 / float64 always; the halves in the row
   layout (channels innermost), which the kernels read and write natively; in the plane layout
   (contiguous, spatial > 1) the front end widens them to float32 copies */
static int bn_native(const lm_tensor *x, int mf) {
   if (!is_half(x->dtype)) return 1;
   if (mf == LM_CHANNELS_LAST || mf == LM_CHANNELS_LAST_3D) return 1;
   for (int d = 2; d < x->ndim; d++)
      if (x->sizes[d] != 1) return 0;
   return 1;
}

/* close slots[0 .. n) (the NULL user pointers skipped), keeping the first error */
static lm_status close_all(out_slot *slots, lm_tensor ***users, int n, lm_status st) {
   for (int i = 0; i < n; i++) {
      if (!users[i]) continue;
      lm_status st2 = out_close(&slots[i], users[i], st);
      if (st == LM_OK && st2 != LM_OK) {
         /* a later copy into an out= tensor failed: the results handed over so far are freed */
         for (int j = 0; j < i; j++)
            if (users[j] && !slots[j].user && *users[j]) {
               lm_tensor_free(*users[j]);
               *users[j] = NULL;
            }
         st = st2;
      }
   }
   return st;
}

lm_status lm_batch_norm_fused(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                              lm_tensor *running_mean, lm_tensor *running_var, int training,
                              double momentum, double eps, const lm_tensor *residual, int relu,
                              lm_tensor **out, lm_tensor **save_mean, lm_tensor **save_invstd) {
   int64_t C = 0, M = 0;
   int mf = LM_CONTIGUOUS;
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(bn_geometry(x, &C, &M, &mf));
   LM_TRY(check_param(x, running_mean, C, "running_mean"));
   LM_TRY(check_param(x, running_var, C, "running_var"));
   LM_TRY(check_param(x, weight, C, "weight"));
   LM_TRY(check_param(x, bias, C, "bias"));
   if (residual) LM_TRY(check_like(residual, x, "residual"));
   if (!training && (!running_mean || !running_var))
      return lm_error(LM_ERR_ARG, "running_mean and running_var must be defined in evaluation mode");
   if (training && M == 1) {
      char s[160];
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      return lm_error(LM_ERR_ARG,
                      "Expected more than 1 value per channel when training, got input size %s", s);
   }
   if (training) {
      LM_TRY(check_writable(running_mean, "running_mean"));
      LM_TRY(check_writable(running_var, "running_var"));
   }
   if (!(eps >= 0)) return lm_error(LM_ERR_ARG, "batch_norm: eps must be >= 0, got %g", eps);

   const int dt = x->dtype;
   const int sdt = is_half(dt) ? LM_FLOAT32 : dt; /* the saved statistics */
   const int native = bn_native(x, mf);
   const int64_t csz[1] = {C};
   out_slot so[3] = {{0}};
   lm_tensor **users[3] = {out, save_mean, save_invstd};
   const lm_tensor *xd = NULL, *rd = NULL;
   lm_tensor *tmp = NULL, *rtmp = NULL, *y32 = NULL, *ytmp = NULL;
   lm_status st = out_open(&so[0], out, x->ndim, x->sizes, dt, mf, x->device, "output");
   if (st == LM_OK && save_mean)
      st = out_open(&so[1], save_mean, 1, csz, sdt, LM_CONTIGUOUS, x->device, "save_mean");
   if (st == LM_OK && save_invstd)
      st = out_open(&so[2], save_invstd, 1, csz, sdt, LM_CONTIGUOUS, x->device, "save_invstd");
   if (native) {
      if (st == LM_OK) st = dense_in_format(x, mf, &xd, &tmp);
      if (st == LM_OK && residual) st = dense_in_format(residual, mf, &rd, &rtmp);
      y32 = so[0].t;
   } else {
      if (st == LM_OK) st = dense_float_in_format(x, mf, &xd, &tmp);
      if (st == LM_OK && residual) st = dense_float_in_format(residual, mf, &rd, &rtmp);
      if (st == LM_OK) st = half_open(so[0].t, mf, &y32, &ytmp);
   }
   if (st == LM_OK) {
      const lm_batch_norm_params p = {mf, training != 0, relu != 0,
                                      so[0].t != so[0].user && !ytmp, momentum, eps};
      lm_tensor *ts[9] = {(lm_tensor *)xd, (lm_tensor *)weight, (lm_tensor *)bias, running_mean,
                          running_var, (lm_tensor *)rd, y32, so[1].t, so[2].t};
      const lm_op op = lm_op_make(LM_OP_BATCH_NORM, 9, ts, &p);
      st = lm_dispatch(&op);
   }
   if (ytmp) st = half_close(so[0].t, ytmp, st);
   lm_tensor_free(tmp);
   lm_tensor_free(rtmp);
   return close_all(so, users, 3, st);
}

lm_status lm_batch_norm(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                        lm_tensor *running_mean, lm_tensor *running_var, int training,
                        double momentum, double eps, lm_tensor **out, lm_tensor **save_mean,
                        lm_tensor **save_invstd) {
   return lm_batch_norm_fused(x, weight, bias, running_mean, running_var, training, momentum, eps,
                              NULL, 0, out, save_mean, save_invstd);
}

lm_status lm_batch_norm_backward_fused(const lm_tensor *grad_out, const lm_tensor *relu_out,
                                       const lm_tensor *x, const lm_tensor *weight,
                                       const lm_tensor *save_mean, const lm_tensor *save_invstd,
                                       int training, lm_tensor **grad_x, lm_tensor **grad_weight,
                                       lm_tensor **grad_bias, lm_tensor **grad_masked) {
   int64_t C = 0, M = 0;
   int mf = LM_CONTIGUOUS;
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(check_device(x, grad_out, "grad_output"));
   LM_TRY(bn_geometry(x, &C, &M, &mf));
   (void)M;
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "batch_norm_backward: grad_output has dtype %s but input has %s",
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   if (grad_out->ndim != x->ndim ||
       memcmp(grad_out->sizes, x->sizes, (size_t)x->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm_backward: grad_output %s does not match input %s",
                      a, b);
   }
   if (!save_mean || !save_invstd)
      return lm_error(LM_ERR_ARG, "batch_norm_backward: save_mean and save_invstd are required");
   if (grad_masked && !relu_out)
      return lm_error(LM_ERR_ARG, "batch_norm_backward: grad_masked needs the relu output");
   if (relu_out) LM_TRY(check_like(relu_out, x, "relu output"));
   LM_TRY(check_param(x, weight, C, "weight"));
   LM_TRY(check_param(x, save_mean, C, "save_mean"));
   LM_TRY(check_param(x, save_invstd, C, "save_invstd"));

   const int dt = x->dtype;
   const int wdt = weight ? weight->dtype : dt;
   const int native = bn_native(x, mf);
   const int64_t csz[1] = {C};
   out_slot so[4] = {{0}};
   lm_tensor **users[4] = {grad_x, grad_masked, grad_weight, grad_bias};
   const lm_tensor *xd = NULL, *gd = NULL, *md = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
   lm_tensor *gx32 = NULL, *gxtmp = NULL, *gm32 = NULL, *gmtmp = NULL;
   lm_status st = LM_OK;
   if (grad_x) st = out_open(&so[0], grad_x, x->ndim, x->sizes, dt, mf, x->device, "grad_input");
   if (st == LM_OK && grad_masked)
      st = out_open(&so[1], grad_masked, x->ndim, x->sizes, dt, mf, x->device, "grad_masked");
   if (st == LM_OK && grad_weight)
      st = out_open(&so[2], grad_weight, 1, csz, wdt, LM_CONTIGUOUS, x->device, "grad_weight");
   if (st == LM_OK && grad_bias)
      st = out_open(&so[3], grad_bias, 1, csz, wdt, LM_CONTIGUOUS, x->device, "grad_bias");
   if (native) {
      if (st == LM_OK) st = dense_in_format(x, mf, &xd, &t1);
      if (st == LM_OK) st = dense_in_format(grad_out, mf, &gd, &t2);
      if (st == LM_OK && relu_out) st = dense_in_format(relu_out, mf, &md, &t3);
      gx32 = so[0].t;
      gm32 = so[1].t;
   } else {
      if (st == LM_OK) st = dense_float_in_format(x, mf, &xd, &t1);
      if (st == LM_OK) st = dense_float_in_format(grad_out, mf, &gd, &t2);
      if (st == LM_OK && relu_out) st = dense_float_in_format(relu_out, mf, &md, &t3);
      if (st == LM_OK) st = half_open(so[0].t, mf, &gx32, &gxtmp);
      if (st == LM_OK) st = half_open(so[1].t, mf, &gm32, &gmtmp);
   }
   if (st == LM_OK) {
      const lm_batch_norm_params p = {mf, training != 0, 0,
                                      so[0].t && so[0].t != so[0].user && !gxtmp, 0.0, 0.0};
      lm_tensor *ts[10] = {(lm_tensor *)gd, (lm_tensor *)md, (lm_tensor *)xd,
                           (lm_tensor *)weight, (lm_tensor *)save_mean, (lm_tensor *)save_invstd,
                           gx32, so[2].t, so[3].t, gm32};
      const lm_op op = lm_op_make(LM_OP_BATCH_NORM_BACKWARD, 10, ts, &p);
      st = lm_dispatch(&op);
   }
   if (gxtmp) st = half_close(so[0].t, gxtmp, st);
   if (gmtmp) st = half_close(so[1].t, gmtmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   lm_tensor_free(t3);
   return close_all(so, users, 4, st);
}

lm_status lm_batch_norm_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *weight, const lm_tensor *save_mean,
                                 const lm_tensor *save_invstd, int training,
                                 lm_tensor **grad_x, lm_tensor **grad_weight,
                                 lm_tensor **grad_bias) {
   return lm_batch_norm_backward_fused(grad_out, NULL, x, weight, save_mean, save_invstd,
                                       training, grad_x, grad_weight, grad_bias, NULL);
}
