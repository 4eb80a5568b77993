/* norm_group.c -- the front end of group normalisation, forward and backward (kernels:
 * LM_OP_GROUP_NORM, LM_OP_GROUP_NORM_BACKWARD, src/ops/norm_group.h). Instance normalisation is
 * group normalisation with G = C (lua/lumen/functional/norm.lua).
 *
 * mf = x.suggest_memory_format() (contiguous unless channels-last / channels-last-3d): the results
 * of x's shape are made in mf on x's device, and an operand of x's shape that is not dense in mf
 * is cloned once. The kernels read and write all four floating dtypes directly; the saved
 * statistics (N, G) are float32 for float16 / bfloat16 input, else x's dtype. */
#include "common.h"
#include "nn.h"
#include "norm_group.h"

static lm_status gn_check_param(const lm_tensor *x, const lm_tensor *t, int64_t C,
                                const char *what) {
   if (!t) return LM_OK;
   LM_TRY(check_device(x, t, what));
   if (!lm_is_float_dtype(t->dtype))
      return lm_error(LM_ERR_DTYPE, "group_norm: expected %s to be a floating tensor, got %s",
                      what, lm_dtype_name(t->dtype));
   if (t->ndim != 1 || t->numel != C) {
      char s[160];
      lm_format_shape(s, sizeof s, t->ndim, t->sizes);
      return lm_error(LM_ERR_SHAPE,
                      "group_norm: expected %s to be a 1-D tensor of %lld elements, got sizes %s",
                      what, (long long)C, s);
   }
   return LM_OK;
}

static lm_status gn_geometry(const lm_tensor *x, int num_groups, const char *fn, int *mf) {
   if (x->ndim < 2) {
      char s[160];
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: expected an input of 2 or more dimensions, got %s", fn, s);
   }
   const int64_t C = x->sizes[1];
   if (num_groups <= 0)
      return lm_error(LM_ERR_ARG, "%s: num_groups must be positive, got %d", fn, num_groups);
   if (C % num_groups != 0)
      return lm_error(LM_ERR_ARG,
                      "%s: expected the number of channels (%lld) to be divisible by num_groups "
                      "(%d)",
                      fn, (long long)C, num_groups);
   *mf = lm_suggest_memory_format(x, 0);
   if (*mf != LM_CHANNELS_LAST && *mf != LM_CHANNELS_LAST_3D) *mf = LM_CONTIGUOUS;
   return LM_OK;
}

lm_status lm_group_norm(const lm_tensor *x, int num_groups, const lm_tensor *weight,
                        const lm_tensor *bias, double eps, lm_tensor **out, lm_tensor **mean,
                        lm_tensor **rstd) {
   int mf = LM_CONTIGUOUS;
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "group_norm: out is NULL");
   LM_TRY(gn_geometry(x, num_groups, "group_norm", &mf));
   const int64_t C = x->sizes[1];
   LM_TRY(gn_check_param(x, weight, C, "weight"));
   LM_TRY(gn_check_param(x, bias, C, "bias"));
   if (!(eps >= 0)) return lm_error(LM_ERR_ARG, "group_norm: eps must be >= 0, got %g", eps);
   const int dt = x->dtype;
   const int sdt = is_half(dt) ? LM_FLOAT32 : dt;
   const int64_t ssz[2] = {x->sizes[0], num_groups};
   out_slot so[3] = {{0}};
   lm_tensor **users[3] = {out, mean, rstd};
   const lm_tensor *xd = NULL;
   lm_tensor *tmp = NULL;
   lm_status st = out_open(&so[0], out, x->ndim, x->sizes, dt, mf, x->device, "group_norm");
   if (st == LM_OK && mean)
      st = out_open(&so[1], mean, 2, ssz, sdt, LM_CONTIGUOUS, x->device, "group_norm mean");
   if (st == LM_OK && rstd)
      st = out_open(&so[2], rstd, 2, ssz, sdt, LM_CONTIGUOUS, x->device, "group_norm rstd");
   if (st == LM_OK) st = dense_in_format(x, mf, &xd, &tmp);
   if (st == LM_OK) {
      const lm_group_norm_params p = {mf, num_groups, eps};
      lm_tensor *ts[6] = {(lm_tensor *)xd, (lm_tensor *)weight, (lm_tensor *)bias, so[0].t,
                          so[1].t, so[2].t};
      const lm_op op = lm_op_make(LM_OP_GROUP_NORM, 6, ts, &p);
      st = lm_dispatch(&op);
   }
   lm_tensor_free(tmp);
   for (int i = 0; i < 3; i++) {
      if (!users[i]) continue;
      lm_status st2 = out_close(&so[i], users[i], st);
      if (st == LM_OK && st2 != LM_OK) {
         for (int j = 0; j < i; j++)
            if (users[j] && !so[j].user && *users[j]) {
               lm_tensor_free(*users[j]);
               *users[j] = NULL;
            }
         st = st2;
      }
   }
   return st;
}

lm_status lm_group_norm_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *mean, const lm_tensor *rstd,
                                 const lm_tensor *weight, int num_groups, lm_tensor **grad_x,
                                 lm_tensor **grad_weight, lm_tensor **grad_bias) {
   int mf = LM_CONTIGUOUS;
   const char *fn = "group_norm_backward";
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(check_device(x, grad_out, "grad_output"));
   LM_TRY(gn_geometry(x, num_groups, fn, &mf));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", fn,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   if (grad_out->ndim != x->ndim ||
       memcmp(grad_out->sizes, x->sizes, (size_t)x->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match input %s", fn, a, b);
   }
   const int64_t C = x->sizes[1], NG = x->sizes[0] * num_groups;
   LM_TRY(gn_check_param(x, weight, C, "weight"));
   if (!mean || !rstd) return lm_error(LM_ERR_ARG, "%s: mean and rstd are required", fn);
   const lm_tensor *stats[2] = {mean, rstd};
   for (int i = 0; i < 2; i++) {
      LM_TRY(check_device(x, stats[i], i ? "rstd" : "mean"));
      if (!lm_is_float_dtype(stats[i]->dtype) || stats[i]->numel != NG ||
          !lm_is_contiguous(stats[i], LM_CONTIGUOUS))
         return lm_error(LM_ERR_SHAPE, "%s: %s must be a contiguous floating tensor of %lld "
                                       "elements (N * num_groups)",
                         fn, i ? "rstd" : "mean", (long long)NG);
   }
   const int dt = x->dtype, wdt = weight ? weight->dtype : dt;
   const int64_t csz[1] = {C};
   out_slot so[3] = {{0}};
   lm_tensor **users[3] = {grad_x, grad_weight, grad_bias};
   const lm_tensor *xd = NULL, *gd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL;
   lm_status st = LM_OK;
   if (grad_x) st = out_open(&so[0], grad_x, x->ndim, x->sizes, dt, mf, x->device, fn);
   if (st == LM_OK && grad_weight)
      st = out_open(&so[1], grad_weight, 1, csz, wdt, LM_CONTIGUOUS, x->device, fn);
   if (st == LM_OK && grad_bias)
      st = out_open(&so[2], grad_bias, 1, csz, wdt, LM_CONTIGUOUS, x->device, fn);
   if (st == LM_OK) st = dense_in_format(x, mf, &xd, &t1);
   if (st == LM_OK) st = dense_in_format(grad_out, mf, &gd, &t2);
   if (st == LM_OK) {
      const lm_group_norm_params p = {mf, num_groups, 0.0};
      lm_tensor *ts[8] = {(lm_tensor *)gd, (lm_tensor *)xd, (lm_tensor *)mean,
                          (lm_tensor *)rstd, (lm_tensor *)weight, so[0].t, so[1].t, so[2].t};
      const lm_op op = lm_op_make(LM_OP_GROUP_NORM_BACKWARD, 8, ts, &p);
      st = lm_dispatch(&op);
   }
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   for (int i = 0; i < 3; i++) {
      if (!users[i]) continue;
      lm_status st2 = out_close(&so[i], users[i], st);
      if (st == LM_OK && st2 != LM_OK) {
         for (int j = 0; j < i; j++)
            if (users[j] && !so[j].user && *users[j]) {
               lm_tensor_free(*users[j]);
               *users[j] = NULL;
            }
         st = st2;
      }
   }
   return st;
}
