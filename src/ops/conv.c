/* conv.c -- the front end of 2-D convolution (public functions: src/conv.h): argument checks,
 * the output size, the memory-format decision, the results (allocated on the input's device in
 * that format), inputs made dense in the format, then LM_OP_CONV2D / LM_OP_CONV2D_BACKWARD
 * (t[] order and parameters: ops/conv.h). The algorithm (Winograd, pointwise, register-blocked,
 * direct, im2col + GEMM) is the kernels' choice (kernels/cpu/conv.c).
 *
 * float16 / bfloat16: the same checks and results of the input's dtype; the kernels accumulate
 * in float32 and round once (kernels/cpu/conv.c), so nothing here differs by dtype.
 *
 * PyTorch semantics throughout; see src/conv.h for the contract.
 */
#include "common.h"
#include "../conv.h"
#include "conv.h"

/* ---------------------------------------------------------------------------------------------
 * argument checking
 */
static void fmt_tsizes(char *buf, size_t n, const lm_tensor *t) {
   size_t k = 0;
   k += (size_t)snprintf(buf + k, n - k, "[");
   for (int d = 0; d < t->ndim && k < n; d++)
      k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->sizes[d]);
   if (k < n) snprintf(buf + k, n - k, "]");
}

/* the argument checks conv2d (nd 2) and conv3d (nd 3) share: tensors, devices, dtypes, ranks,
   groups against the channels, a non-empty kernel, the bias's size (PyTorch's messages) */
lm_status lm_conv_check_args(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                             int64_t groups, int nd) {
   char s1[160], s2[160], what[32];
   const char *name = nd == 3 ? "conv3d" : "conv2d";
   LM_CHECK_TENSOR(x, "input");
   LM_CHECK_TENSOR(w, "weight");
   snprintf(what, sizeof what, "%s weight", name);
   LM_TRY(lm_check_same_device(x, w, what));
   if (bias) {
      snprintf(what, sizeof what, "%s bias", name);
      LM_TRY(lm_check_same_device(x, bias, what));
   }
   if (x->dtype != LM_FLOAT32 && x->dtype != LM_FLOAT64 && x->dtype != LM_FLOAT16 &&
       x->dtype != LM_BFLOAT16)
      return lm_error(LM_ERR_DTYPE,
                      "%s supports float16, bfloat16, float32 and float64 tensors, got %s "
                      "input", name, lm_dtype_name(x->dtype));
   if (w->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and weight type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(w->dtype));
   if (bias && bias->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and bias type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(bias->dtype));
   const char *kdims = nd == 3 ? "kD, kH, kW" : "kH, kW";
   const char *xdims = nd == 3 ? "(N, C, D, H, W)" : "(N, C, H, W)";
   if (w->ndim != nd + 2) {
      fmt_tsizes(s1, sizeof s1, w);
      return lm_error(LM_ERR_SHAPE,
                      "expected a %d-D weight (out_channels, in_channels/groups, %s), got "
                      "%d-D weight of size %s", nd + 2, kdims, w->ndim, s1);
   }
   if (x->ndim != nd + 2) {
      fmt_tsizes(s1, sizeof s1, w);
      fmt_tsizes(s2, sizeof s2, x);
      return lm_error(LM_ERR_SHAPE,
                      "expected %d-D input %s for %d-D weight %s, but got %d-D input of "
                      "size %s", nd + 2, xdims, nd + 2, s1, x->ndim, s2);
   }
   if (groups <= 0) return lm_error(LM_ERR_ARG, "non-positive groups is not supported");
   const int64_t O = w->sizes[0], C = x->sizes[1];
   if (O % groups != 0) {
      fmt_tsizes(s1, sizeof s1, w);
      return lm_error(LM_ERR_SHAPE,
                      "Given groups=%lld, expected weight to be divisible by %lld at dimension 0, "
                      "but got weight of size %s instead",
                      (long long)groups, (long long)groups, s1);
   }
   if (C != w->sizes[1] * groups) {
      fmt_tsizes(s1, sizeof s1, w);
      fmt_tsizes(s2, sizeof s2, x);
      return lm_error(LM_ERR_SHAPE,
                      "Given groups=%lld, weight of size %s, expected input%s to have %lld "
                      "channels, but got %lld channels instead",
                      (long long)groups, s1, s2, (long long)(w->sizes[1] * groups), (long long)C);
   }
   for (int d = 2; d < nd + 2; d++)
      if (w->sizes[d] <= 0) {
         fmt_tsizes(s1, sizeof s1, w);
         return lm_error(LM_ERR_SHAPE, "weight of size %s has an empty kernel", s1);
      }
   if (bias && (bias->ndim != 1 || bias->sizes[0] != O)) {
      fmt_tsizes(s1, sizeof s1, w);
      fmt_tsizes(s2, sizeof s2, bias);
      return lm_error(LM_ERR_SHAPE,
                      "Given weight of size %s, expected bias to be 1-dimensional with %lld "
                      "elements, but got bias of size %s instead",
                      s1, (long long)O, s2);
   }
   return LM_OK;
}

static lm_status conv_check(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                            const int64_t *stride, const int64_t *padding,
                            const int64_t *dilation, int64_t groups, conv_geom *g) {
   LM_TRY(lm_conv_check_args(x, w, bias, groups, 2));
   int64_t st[2] = {1, 1}, pd[2] = {0, 0}, dl[2] = {1, 1};
   for (int i = 0; i < 2; i++) {
      if (stride) st[i] = stride[i];
      if (padding) pd[i] = padding[i];
      if (dilation) dl[i] = dilation[i];
   }
   if (st[0] <= 0 || st[1] <= 0) return lm_error(LM_ERR_ARG, "non-positive stride is not supported");
   if (dl[0] <= 0 || dl[1] <= 0)
      return lm_error(LM_ERR_ARG, "non-positive dilation is not supported");
   if (pd[0] < 0 || pd[1] < 0) return lm_error(LM_ERR_ARG, "negative padding is not supported");
   const int64_t O = w->sizes[0], C = x->sizes[1];
   int64_t ohw[2];
   LM_TRY(lm_conv2d_output_size(&x->sizes[2], &w->sizes[2], st, pd, dl, ohw));
   g->N = x->sizes[0];
   g->C = C;
   g->H = x->sizes[2];
   g->W = x->sizes[3];
   g->O = O;
   g->Ho = ohw[0];
   g->Wo = ohw[1];
   g->kh = w->sizes[2];
   g->kw = w->sizes[3];
   g->sh = st[0];
   g->sw = st[1];
   g->ph = pd[0];
   g->pw = pd[1];
   g->dh = dl[0];
   g->dw = dl[1];
   g->G = groups;
   g->Cg = C / groups;
   g->Og = O / groups;
   g->K = g->Cg * g->kh * g->kw;
   return LM_OK;
}

lm_status lm_conv2d_output_size(const int64_t *in_hw, const int64_t *kernel_hw,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t *out_hw) {
   if (!in_hw || !kernel_hw || !out_hw) return lm_error(LM_ERR_ARG, "conv2d: size array is NULL");
   int64_t padded[2], ks[2];
   for (int i = 0; i < 2; i++) {
      const int64_t s = stride ? stride[i] : 1, p = padding ? padding[i] : 0;
      const int64_t d = dilation ? dilation[i] : 1;
      if (s <= 0) return lm_error(LM_ERR_ARG, "non-positive stride is not supported");
      if (d <= 0) return lm_error(LM_ERR_ARG, "non-positive dilation is not supported");
      if (p < 0) return lm_error(LM_ERR_ARG, "negative padding is not supported");
      padded[i] = in_hw[i] + 2 * p;
      ks[i] = d * (kernel_hw[i] - 1) + 1;
   }
   if (padded[0] < ks[0] || padded[1] < ks[1] || padded[0] <= 0 || padded[1] <= 0)
      return lm_error(LM_ERR_SHAPE,
                      "Calculated padded input size per channel: (%lld x %lld). Kernel size: "
                      "(%lld x %lld). Kernel size can't be greater than actual input size",
                      (long long)padded[0], (long long)padded[1], (long long)ks[0],
                      (long long)ks[1]);
   for (int i = 0; i < 2; i++) out_hw[i] = (padded[i] - ks[i]) / (stride ? stride[i] : 1) + 1;
   return LM_OK;
}

int lm_conv_memory_format(const lm_tensor *x, const lm_tensor *w) {
   /* PyTorch (ConvUtils.h): channels-last when the input or the weight suggests it. Its mkldnn
      path excludes float64, but its CPU slow path (which is what runs for float64) applies the
      same rule, and lumen's spec says "output is channels-last when the input or the weight
      suggests channels-last" for every dtype, so float64 follows the rule too. */
   if (!x || !w || x->ndim != 4 || w->ndim != 4) return LM_CONTIGUOUS;
   if (lm_suggest_memory_format(x, 0) == LM_CHANNELS_LAST ||
       lm_suggest_memory_format(w, 0) == LM_CHANNELS_LAST)
      return LM_CHANNELS_LAST;
   return LM_CONTIGUOUS;
}

/* ---------------------------------------------------------------------------------------------
 * layout preparation
 */
static lm_status resolve_fmt(const lm_tensor *x, const lm_tensor *w, int fmt, int *out) {
   if (fmt < 0 || fmt == LM_PRESERVE) fmt = lm_conv_memory_format(x, w);
   if (fmt != LM_CONTIGUOUS && fmt != LM_CHANNELS_LAST)
      return lm_error(LM_ERR_FORMAT,
                      "conv2d runs in contiguous_format or channels_last, not memory format %d",
                      fmt);
   *out = fmt;
   return LM_OK;
}

typedef struct {
   lm_tensor *t;        /* where the kernel writes (dense in fmt, compute dtype) */
   lm_tensor *user;     /* the out= tensor, or NULL */
   int copy_back;       /* t is a temporary to be copied into user */
} conv_result;

/* prepare a result of the given shape on dev's device: a new tensor, or the caller's out= tensor
   when the kernel can write it directly, or a temporary copied into it afterwards */
static lm_status result_prepare(lm_tensor **slot, int ndim, const int64_t *sizes, int dtype,
                                int fmt, const lm_tensor *dev, const lm_tensor *const *ins,
                                int nins, const char *what, conv_result *r) {
   r->t = NULL;
   r->user = NULL;
   r->copy_back = 0;
   if (*slot) {
      lm_tensor *o = *slot;
      LM_TRY(lm_check_same_device(dev, o, what));
      int same = o->ndim == ndim;
      for (int d = 0; same && d < ndim; d++) same = o->sizes[d] == sizes[d];
      if (!same) {
         char s1[160];
         fmt_tsizes(s1, sizeof s1, o);
         return lm_error(LM_ERR_SHAPE, "%s has size %s, which does not match the result", what,
                         s1);
      }
      if (!lm_dtype_is_floating(o->dtype))
         return lm_error(LM_ERR_DTYPE, "%s has dtype %s, which cannot hold a %s result", what,
                         lm_dtype_name(o->dtype), lm_dtype_name(dtype));
      r->user = o;
      int direct = o->dtype == dtype && lm_is_contiguous(o, fmt);
      for (int i = 0; direct && i < nins; i++)
         if (ins[i] && lm_tensor_same_storage(o, ins[i])) direct = 0;
      if (direct) {
         r->t = o;
         return LM_OK;
      }
      r->copy_back = 1;
   }
   return lm_empty(ndim, sizes, dtype, fmt, dev->device, &r->t);
}

/* after the kernel: copy into the out= tensor if needed and hand the result over */
static lm_status result_finish(lm_tensor **slot, conv_result *r, lm_status st) {
   if (st != LM_OK) {
      if (r->t && r->t != r->user) lm_tensor_free(r->t);
      return st;
   }
   if (r->copy_back) {
      st = lm_copy_(r->user, r->t);
      lm_tensor_free(r->t);
      return st;
   }
   *slot = r->t;
   return LM_OK;
}

static void result_abort(conv_result *r) {
   if (r->t && r->t != r->user) lm_tensor_free(r->t);
   r->t = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * public entry points
 */
lm_status lm_conv2d(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, int fmt, int act, const lm_tensor *residual,
                    lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (act < 0 || act >= LM_NUM_ACT)
      return lm_error(LM_ERR_ARG, "conv2d: unknown epilogue activation %d", act);
   lm_conv2d_params p;
   conv_geom *g = &p.g;
   LM_TRY(conv_check(x, w, bias, stride, padding, dilation, groups, g));
   LM_TRY(resolve_fmt(x, w, fmt, &fmt));
   const int64_t osz[4] = {g->N, g->O, g->Ho, g->Wo};
   if (residual) {
      LM_TRY(lm_check_same_device(x, residual, "conv2d residual"));
      if (residual->dtype != x->dtype)
         return lm_error(LM_ERR_DTYPE, "input type (%s) and residual type (%s) should be the same",
                         lm_dtype_name(x->dtype), lm_dtype_name(residual->dtype));
      int same = residual->ndim == 4;
      for (int d = 0; same && d < 4; d++) same = residual->sizes[d] == osz[d];
      if (!same) {
         char s1[160];
         fmt_tsizes(s1, sizeof s1, residual);
         return lm_error(LM_ERR_SHAPE,
                         "residual of size %s does not match the output size [%lld, %lld, %lld, "
                         "%lld]", s1, (long long)osz[0], (long long)osz[1], (long long)osz[2],
                         (long long)osz[3]);
      }
   }
   p.channels_last = fmt == LM_CHANNELS_LAST;
   p.act = act;
   const lm_tensor *xd = NULL, *wd = NULL, *rd = NULL;
   lm_tensor *xo = NULL, *wo = NULL, *ro = NULL;
   conv_result res = {NULL, NULL, 0};
   const lm_tensor *ins[4] = {x, w, bias, residual};
   lm_status st = result_prepare(out, 4, osz, x->dtype, fmt, x, ins, 4, "out", &res);
   if (st != LM_OK) return st;
   if (res.t->numel == 0) return result_finish(out, &res, LM_OK);
   st = dense_in_format(x, fmt, &xd, &xo);
   if (st == LM_OK) st = dense_in_format(w, fmt, &wd, &wo);
   if (st == LM_OK && residual) st = dense_in_format(residual, fmt, &rd, &ro);
   if (st == LM_OK) {
      lm_tensor *ts[5] = {(lm_tensor *)xd, (lm_tensor *)wd, (lm_tensor *)bias, (lm_tensor *)rd,
                          res.t};
      const lm_op op = lm_op_make(LM_OP_CONV2D, 5, ts, &p);
      st = lm_dispatch(&op);
   }
   if (xo) lm_tensor_free(xo);
   if (wo) lm_tensor_free(wo);
   if (ro) lm_tensor_free(ro);
   if (st != LM_OK) {
      result_abort(&res);
      return st;
   }
   return result_finish(out, &res, st);
}

lm_status lm_conv2d_backward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *grad_out,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups, int fmt,
                             lm_tensor **grad_x, lm_tensor **grad_w, lm_tensor **grad_b) {
   lm_conv2d_params p;
   conv_geom *g = &p.g;
   LM_TRY(conv_check(x, w, NULL, stride, padding, dilation, groups, g));
   LM_CHECK_TENSOR(grad_out, "grad_output");
   LM_TRY(lm_check_same_device(x, grad_out, "conv2d grad_output"));
   LM_TRY(resolve_fmt(x, w, fmt, &fmt));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and grad_output type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(grad_out->dtype));
   const int64_t osz[4] = {g->N, g->O, g->Ho, g->Wo};
   int same = grad_out->ndim == 4;
   for (int d = 0; same && d < 4; d++) same = grad_out->sizes[d] == osz[d];
   if (!same) {
      char s1[160];
      fmt_tsizes(s1, sizeof s1, grad_out);
      return lm_error(LM_ERR_SHAPE,
                      "grad_output of size %s does not match the output size [%lld, %lld, %lld, "
                      "%lld]", s1, (long long)osz[0], (long long)osz[1], (long long)osz[2],
                      (long long)osz[3]);
   }
   p.channels_last = fmt == LM_CHANNELS_LAST;
   p.act = 0;
   const int dt = x->dtype;
   const lm_tensor *ins[3] = {x, w, grad_out};
   conv_result rx = {NULL, NULL, 0}, rw = {NULL, NULL, 0}, rb = {NULL, NULL, 0};
   const lm_tensor *xd = NULL, *wd = NULL, *gd = NULL;
   lm_tensor *xo = NULL, *wo = NULL, *go = NULL;
   lm_status st = LM_OK;
   if (grad_x) st = result_prepare(grad_x, 4, x->sizes, dt, fmt, x, ins, 3, "grad_input", &rx);
   if (st == LM_OK && grad_w)
      st = result_prepare(grad_w, 4, w->sizes, dt, fmt, x, ins, 3, "grad_weight", &rw);
   if (st == LM_OK && grad_b) {
      const int64_t bsz[1] = {g->O};
      st = result_prepare(grad_b, 1, bsz, dt, LM_CONTIGUOUS, x, ins, 3, "grad_bias", &rb);
   }
   /* the kernel gets only the gradients with elements, x when it computes grad_w, w when it
      computes grad_x */
   lm_tensor *gx = rx.t && rx.t->numel > 0 ? rx.t : NULL;
   lm_tensor *gw = rw.t && rw.t->numel > 0 ? rw.t : NULL;
   lm_tensor *gb = rb.t && rb.t->numel > 0 ? rb.t : NULL;
   if (st == LM_OK && (rx.t || rw.t || rb.t)) {
      st = dense_in_format(grad_out, fmt, &gd, &go);
      if (st == LM_OK && gw) st = dense_in_format(x, fmt, &xd, &xo);
      if (st == LM_OK && gx) st = dense_in_format(w, fmt, &wd, &wo);
   }
   if (st == LM_OK && (gx || gw || gb)) {
      lm_tensor *ts[6] = {(lm_tensor *)xd, (lm_tensor *)wd, (lm_tensor *)gd, gx, gw, gb};
      const lm_op op = lm_op_make(LM_OP_CONV2D_BACKWARD, 6, ts, &p);
      st = lm_dispatch(&op);
   }
   if (xo) lm_tensor_free(xo);
   if (wo) lm_tensor_free(wo);
   if (go) lm_tensor_free(go);
   if (st != LM_OK) {
      result_abort(&rx);
      result_abort(&rw);
      result_abort(&rb);
      return st;
   }
   if (grad_x) st = result_finish(grad_x, &rx, st);
   if (grad_w) {
      lm_status s2 = result_finish(grad_w, &rw, st);
      if (st == LM_OK) st = s2;
   }
   if (grad_b) {
      lm_status s3 = result_finish(grad_b, &rb, st);
      if (st == LM_OK) st = s3;
   }
   return st;
}
