/* pool.c -- the front ends of max / average / adaptive pooling over 2-D planes, forward and
 * backward (src/nn.h).
 *
 * Layout (spec section 7): mf = x.suggest_memory_format(); output, indices (taps) and grad_input
 * are allocated in mf on x's device. An input that is not dense in mf is cloned into mf once, so
 * the kernels see every tensor dense in mf (channels-last: NHWC kernels, contiguous: NCHW).
 * Everything here works from sizes and strides only (so the meta device gives the CPU's shapes
 * and errors); the window tables and the values' checks are the kernels' (kernels/cpu/pool2d.h,
 * pool_max.c, pool_avg.c).
 * Kernels: the pooling group of LM_OP_LIST (pool.h gives the params and t[] order). */
#include "common.h"
#include "nn.h"
#include "pool.h"

/* floor division (PyTorch's div_rtn) */
static inline int64_t div_floor(int64_t a, int64_t b) {
   int64_t q = a / b, r = a % b;
   if (r != 0 && ((r < 0) != (b < 0))) q--;
   return q;
}

static lm_status pool_input_dims(const lm_tensor *x, lm_pool_params *p, const char *what,
                                 int adaptive) {
   if (x->ndim != 3 && x->ndim != 4) {
      char s[160];
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      if (adaptive)
         return lm_error(LM_ERR_SHAPE, "%s: Expected 3D or 4D tensor, but got %s", what, s);
      return lm_error(LM_ERR_SHAPE,
                      "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for "
                      "input, but got: %s",
                      s);
   }
   for (int d = x->ndim - 3; d < x->ndim; d++) {
      if (x->sizes[d] == 0) {
         char s[160];
         lm_format_shape(s, sizeof s, x->ndim, x->sizes);
         if (adaptive)
            return lm_error(LM_ERR_SHAPE,
                            "%s: Expected input to have non-zero size for non-batch dimensions, "
                            "but input has sizes %s with dimension %d being empty",
                            what, s, d);
         return lm_error(LM_ERR_SHAPE,
                         "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size "
                         "for input, but got: %s",
                         s);
      }
   }
   p->ndim = x->ndim;
   p->N = x->ndim == 4 ? x->sizes[0] : 1;
   p->C = x->sizes[x->ndim - 3];
   p->H = x->sizes[x->ndim - 2];
   p->W = x->sizes[x->ndim - 1];
   p->mf = lm_suggest_memory_format(x, 0);
   if (p->mf != LM_CHANNELS_LAST) p->mf = LM_CONTIGUOUS;
   return LM_OK;
}

static int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, int ceil) {
   int64_t o = div_floor(in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
   if (ceil && (o - 1) * s >= in + pad) --o;
   return o;
}

/* kernel / stride / padding / dilation checks and output size of max_pool2d and avg_pool2d */
static lm_status pool_params(lm_pool_params *p, const int64_t *k, const int64_t *s,
                             const int64_t *pad, const int64_t *dil, int ceil_mode) {
   if (!k) return lm_error(LM_ERR_ARG, "kernel_size is nil");
   p->kh = k[0];
   p->kw = k[1];
   p->sh = s ? s[0] : k[0];
   p->sw = s ? s[1] : k[1];
   p->ph = pad ? pad[0] : 0;
   p->pw = pad ? pad[1] : 0;
   p->dh = dil ? dil[0] : 1;
   p->dw = dil ? dil[1] : 1;
   p->ceil_mode = ceil_mode != 0;
   if (p->kh <= 0 || p->kw <= 0)
      return lm_error(LM_ERR_ARG, "kernel size should be greater than zero, but got kH: %lld kW: %lld",
                      (long long)p->kh, (long long)p->kw);
   if (p->sh <= 0 || p->sw <= 0)
      return lm_error(LM_ERR_ARG, "stride should be greater than zero, but got dH: %lld dW: %lld",
                      (long long)p->sh, (long long)p->sw);
   if (p->dh <= 0 || p->dw <= 0)
      return lm_error(LM_ERR_ARG,
                      "dilation should be greater than zero, but got dilationH: %lld dilationW: %lld",
                      (long long)p->dh, (long long)p->dw);
   if (p->ph < 0 || p->pw < 0)
      return lm_error(LM_ERR_ARG, "pad must be non-negative, but got pad: %lld",
                      (long long)(p->ph < 0 ? p->ph : p->pw));
   for (int i = 0; i < 2; i++) {
      int64_t kk = i ? p->kw : p->kh, pp = i ? p->pw : p->ph, dd = i ? p->dw : p->dh;
      if (pp > ((kk - 1) * dd + 1) / 2)
         return lm_error(LM_ERR_ARG,
                         "pad should be at most half of effective kernel size, but got pad=%lld, "
                         "kernel_size=%lld and dilation=%lld",
                         (long long)pp, (long long)kk, (long long)dd);
   }
   p->OH = pool_out_size(p->H, p->kh, p->ph, p->sh, p->dh, p->ceil_mode);
   p->OW = pool_out_size(p->W, p->kw, p->pw, p->sw, p->dw, p->ceil_mode);
   if (p->OH < 1 || p->OW < 1)
      return lm_error(LM_ERR_SHAPE,
                      "Given input size: (%lldx%lldx%lld). Calculated output size: "
                      "(%lldx%lldx%lld). Output size is too small",
                      (long long)p->C, (long long)p->H, (long long)p->W, (long long)p->C,
                      (long long)p->OH, (long long)p->OW);
   return LM_OK;
}

static lm_status adaptive_params(lm_pool_params *p, const int64_t *out_size, const char *what) {
   if (!out_size) return lm_error(LM_ERR_ARG, "%s: output_size is nil", what);
   if (out_size[0] < 0 || out_size[1] < 0)
      return lm_error(LM_ERR_ARG,
                      "%s: elements of output_size must be greater than or equal to 0 but "
                      "received {%lld, %lld}",
                      what, (long long)out_size[0], (long long)out_size[1]);
   p->OH = out_size[0];
   p->OW = out_size[1];
   p->kh = p->kw = p->sh = p->sw = 1;
   p->ph = p->pw = 0;
   p->dh = p->dw = 1;
   return LM_OK;
}

static void out_sizes(const lm_pool_params *p, int64_t *sz) {
   if (p->ndim == 4) {
      sz[0] = p->N;
      sz[1] = p->C;
      sz[2] = p->OH;
      sz[3] = p->OW;
   } else {
      sz[0] = p->C;
      sz[1] = p->OH;
      sz[2] = p->OW;
   }
}

/* ------------------------------------------------------------------------------------------ */
/* max pooling                                                                                */

/* do the max-pool kernels take dtype dt as it is? float32 / float64, and bfloat16 channels-last
   (the ResNet stem's pool in a bf16 training step: kernels/cpu/pool_max.c reads and writes the
   16-bit values); the other half cases run on float32 copies */
static int max_native(int dt, const lm_pool_params *p) {
   if (!is_half(dt)) return 1;
   return dt == LM_BFLOAT16 && p->mf == LM_CHANNELS_LAST && p->H * p->W < INT32_MAX;
}

/* kind: MAX_POOL2D, ADAPTIVE_MAX_POOL2D or MAX_POOL2D_TAPS; codes (MAX_POOL2D_TAPS only; then
   indices is NULL): the tap numbers instead of the indices, into a new uint8 tensor */
static lm_status max_forward(const lm_tensor *x, lm_pool_params *p, int kind, lm_tensor **out,
                             lm_tensor **indices, lm_tensor **codes) {
   int64_t osz[4];
   out_sizes(p, osz);
   out_slot so = {0}, si = {0};
   const lm_tensor *xd;
   lm_tensor *tmp = NULL, *ct = NULL, *o32 = NULL, *otmp = NULL;
   lm_status st = LM_OK;
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   st = out_open(&so, out, p->ndim, osz, x->dtype, p->mf, x->device, "output");
   if (st == LM_OK && indices)
      st = out_open(&si, indices, p->ndim, osz, LM_INT64, p->mf, x->device, "indices");
   if (st == LM_OK && codes) st = lm_empty(p->ndim, osz, LM_UINT8, p->mf, x->device, &ct);
   /* halves: the float32 kernel on a widened copy (the maximum is one of the inputs, so the
      rounding back is exact), but for bfloat16 channels-last, which the kernels read natively */
   if (st == LM_OK) {
      if (max_native(x->dtype, p)) {
         st = dense_in_format(x, p->mf, &xd, &tmp);
         o32 = so.t;
      } else {
         st = dense_float_in_format(x, p->mf, &xd, &tmp);
         if (st == LM_OK && so.t->numel > 0) st = half_open(so.t, p->mf, &o32, &otmp);
      }
   }
   if (st == LM_OK && so.t->numel > 0) {
      lm_tensor *ts[3] = {(lm_tensor *)xd, o32, codes ? ct : si.t};
      const lm_op op = lm_op_make(kind, 3, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, otmp, st);
   lm_tensor_free(tmp);
   if (indices) st = out_close(&si, indices, st);
   /* a failed index hand-over must not leave a half-returned output */
   st = out_close(&so, out, st);
   if (codes) {
      if (st == LM_OK)
         *codes = ct;
      else
         lm_tensor_free(ct);
   }
   return st;
}

/* the checks and geometry shared by lm_max_pool2d and lm_max_pool2d_taps */
static lm_status max_setup(lm_pool_params *p, const lm_tensor *x, const int64_t *kernel,
                           const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                           int ceil_mode) {
   LM_TRY(check_float(x, "input"));
   LM_TRY(pool_input_dims(x, p, "max_pool2d", 0));
   return pool_params(p, kernel, stride, padding, dilation, ceil_mode);
}

lm_status lm_max_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices) {
   lm_pool_params p = {0};
   LM_TRY(max_setup(&p, x, kernel, stride, padding, dilation, ceil_mode));
   return max_forward(x, &p, LM_OP_MAX_POOL2D, out, indices, NULL);
}

lm_status lm_adaptive_max_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices) {
   lm_pool_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(pool_input_dims(x, &p, "adaptive_max_pool2d()", 1));
   LM_TRY(adaptive_params(&p, out_size, "adaptive_max_pool2d()"));
   return max_forward(x, &p, LM_OP_ADAPTIVE_MAX_POOL2D, out, indices, NULL);
}

lm_status lm_max_pool2d_taps(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                             const int64_t *padding, const int64_t *dilation, int ceil_mode,
                             lm_tensor **out, lm_tensor **taps) {
   lm_pool_params p = {0};
   LM_TRY(max_setup(&p, x, kernel, stride, padding, dilation, ceil_mode));
   if (!taps) return lm_error(LM_ERR_ARG, "taps is NULL");
   if (*taps) return lm_error(LM_ERR_ARG, "max_pool2d_taps: taps must be NULL (a new tensor)");
   if (p.kh * p.kw > 255)
      return lm_error(LM_ERR_ARG, "max_pool2d_taps: a window of %lld taps has no tap numbers "
                      "(at most 255)", (long long)(p.kh * p.kw));
   return max_forward(x, &p, LM_OP_MAX_POOL2D_TAPS, out, NULL, taps);
}

/* grad_out and ind (indices, int64, or tap numbers, uint8) made dense in p->mf, grad_x allocated
   in p->mf on x's device, and the op of `kind` dispatched */
static lm_status max_backward_run(const lm_tensor *grad_out, const lm_tensor *x,
                                  const lm_tensor *ind, lm_pool_params *p, int kind,
                                  lm_tensor **grad_x) {
   out_slot sg = {0};
   const lm_tensor *god, *indd;
   lm_tensor *t1 = NULL, *t2 = NULL, *g32 = NULL, *gtmp = NULL;
   lm_status st = out_open(&sg, grad_x, x->ndim, x->sizes, x->dtype, p->mf, x->device,
                           "grad_input");
   /* the channels-last gathers (the geometry given) read and write bfloat16 natively */
   const int native = max_native(x->dtype, p) && (p->geom || kind == LM_OP_MAX_POOL2D_TAPS_BACKWARD);
   if (native) {
      if (st == LM_OK) st = dense_in_format(grad_out, p->mf, &god, &t1);
      g32 = sg.t;
   } else {
      if (st == LM_OK) st = dense_float_in_format(grad_out, p->mf, &god, &t1);
      if (st == LM_OK && sg.t->numel > 0) st = half_open(sg.t, p->mf, &g32, &gtmp);
   }
   if (st == LM_OK) st = dense_in_format(ind, p->mf, &indd, &t2);
   if (st == LM_OK && sg.t->numel > 0) {
      p->fresh = sg.t != sg.user && !gtmp; /* a temporary is read back at once */
      lm_tensor *ts[3] = {(lm_tensor *)god, (lm_tensor *)indd, g32};
      const lm_op op = lm_op_make(kind, 3, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(sg.t, gtmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   return out_close(&sg, grad_x, st);
}

/* grad_out and indices: same rank as x, same N and C, same (OH, OW) */
static lm_status max_backward(const lm_tensor *grad_out, const lm_tensor *x,
                              const lm_tensor *indices, lm_tensor **grad_x, int kind,
                              const char *what) {
   lm_pool_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   if (!indices) return lm_error(LM_ERR_ARG, "indices is nil");
   LM_TRY(lm_check_same_device(x, indices, what));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (indices->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "%s: expected indices of dtype int64, got %s", what,
                      lm_dtype_name(indices->dtype));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   LM_TRY(pool_input_dims(x, &p, what, 0));
   int ok = grad_out->ndim == x->ndim && indices->ndim == x->ndim;
   for (int d = 0; ok && d < x->ndim; d++) {
      if (indices->sizes[d] != grad_out->sizes[d]) ok = 0;
      if (d < x->ndim - 2 && grad_out->sizes[d] != x->sizes[d]) ok = 0;
   }
   if (!ok) {
      char a[160], b[160], c[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, indices->ndim, indices->sizes);
      lm_format_shape(c, sizeof c, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE,
                      "%s: grad_output %s and indices %s do not match the input %s", what, a, b,
                      c);
   }
   p.OH = grad_out->sizes[x->ndim - 2];
   p.OW = grad_out->sizes[x->ndim - 1];
   return max_backward_run(grad_out, x, indices, &p, kind, grad_x);
}

/* the backward given the window geometry, from int64 indices (ind) or tap numbers (codes):
   channels-last gathers, contiguous scatters by planes (the kernels) */
static lm_status max_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                   const lm_tensor *ind, int codes, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   const int64_t *dilation, int ceil_mode, lm_tensor **grad_x,
                                   const char *what) {
   const char *iname = codes ? "taps" : "indices";
   lm_pool_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   if (!ind) return lm_error(LM_ERR_ARG, "%s is nil", iname);
   LM_TRY(lm_check_same_device(x, ind, what));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (ind->dtype != (codes ? LM_UINT8 : LM_INT64))
      return lm_error(LM_ERR_DTYPE, "%s: expected %s of dtype %s, got %s", what, iname,
                      codes ? "uint8" : "int64", lm_dtype_name(ind->dtype));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   LM_TRY(pool_input_dims(x, &p, what, 0));
   LM_TRY(pool_params(&p, kernel, stride, padding, dilation, ceil_mode));
   if (codes && p.kh * p.kw > 255)
      return lm_error(LM_ERR_ARG, "%s: a window of %lld taps has no tap numbers (at most 255)",
                      what, (long long)(p.kh * p.kw));
   int64_t osz[4];
   out_sizes(&p, osz);
   for (int i = 0; i < 2; i++) {
      const lm_tensor *t = i ? ind : grad_out;
      if (t->ndim != p.ndim || memcmp(t->sizes, osz, (size_t)p.ndim * 8) != 0) {
         char a[160], b[160];
         lm_format_shape(a, sizeof a, p.ndim, osz);
         lm_format_shape(b, sizeof b, t->ndim, t->sizes);
         return lm_error(LM_ERR_SHAPE, "%s: expected %s of shape %s, got %s", what,
                         i ? iname : "grad_output", a, b);
      }
   }
   p.geom = 1;
   return max_backward_run(grad_out, x, ind, &p,
                           codes ? LM_OP_MAX_POOL2D_TAPS_BACKWARD : LM_OP_MAX_POOL2D_BACKWARD,
                           grad_x);
}

lm_status lm_max_pool2d_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *indices, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x) {
   return max_backward_geom(grad_out, x, indices, 0, kernel, stride, padding, dilation, ceil_mode,
                            grad_x, "max_pool2d_backward");
}

lm_status lm_max_pool2d_taps_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *taps, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x) {
   return max_backward_geom(grad_out, x, taps, 1, kernel, stride, padding, dilation, ceil_mode,
                            grad_x, "max_pool2d_backward");
}

lm_status lm_max_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *indices, lm_tensor **grad_x) {
   return max_backward(grad_out, x, indices, grad_x, LM_OP_MAX_POOL2D_BACKWARD,
                       "max_pool2d_backward");
}

lm_status lm_adaptive_max_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          const lm_tensor *indices, lm_tensor **grad_x) {
   return max_backward(grad_out, x, indices, grad_x, LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD,
                       "adaptive_max_pool2d_backward");
}

/* ------------------------------------------------------------------------------------------ */
/* average pooling                                                                            */

/* kind: AVG_POOL2D or ADAPTIVE_AVG_POOL2D */
static lm_status avg_forward(const lm_tensor *x, lm_pool_params *p, int kind, lm_tensor **out) {
   int64_t osz[4];
   out_sizes(p, osz);
   out_slot so = {0};
   const lm_tensor *xd;
   lm_tensor *tmp = NULL, *o32 = NULL, *otmp = NULL;
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   lm_status st = out_open(&so, out, p->ndim, osz, x->dtype, p->mf, x->device, "output");
   /* halves: float32 kernel on a widened copy, the averages rounded once */
   if (st == LM_OK) st = dense_float_in_format(x, p->mf, &xd, &tmp);
   if (st == LM_OK && so.t->numel > 0) st = half_open(so.t, p->mf, &o32, &otmp);
   if (st == LM_OK && so.t->numel > 0) {
      lm_tensor *ts[2] = {(lm_tensor *)xd, o32};
      const lm_op op = lm_op_make(kind, 2, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, otmp, st);
   lm_tensor_free(tmp);
   return out_close(&so, out, st);
}

/* kind: AVG_POOL2D_BACKWARD or ADAPTIVE_AVG_POOL2D_BACKWARD */
static lm_status avg_backward(const lm_tensor *grad_out, const lm_tensor *x, lm_pool_params *p,
                              int kind, lm_tensor **grad_x, const char *what) {
   int64_t osz[4];
   out_sizes(p, osz);
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   if (grad_out->ndim != p->ndim || memcmp(grad_out->sizes, osz, (size_t)p->ndim * 8) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, p->ndim, osz);
      lm_format_shape(b, sizeof b, grad_out->ndim, grad_out->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: expected grad_output of shape %s, got %s", what, a, b);
   }
   out_slot sg = {0};
   const lm_tensor *god;
   lm_tensor *tmp = NULL, *g32 = NULL, *gtmp = NULL;
   lm_status st = out_open(&sg, grad_x, x->ndim, x->sizes, x->dtype, p->mf, x->device,
                           "grad_input");
   if (st == LM_OK) st = dense_float_in_format(grad_out, p->mf, &god, &tmp);
   if (st == LM_OK && sg.t->numel > 0) st = half_open(sg.t, p->mf, &g32, &gtmp);
   if (st == LM_OK && sg.t->numel > 0) {
      p->fresh = sg.t != sg.user && !gtmp; /* a temporary is read back at once */
      lm_tensor *ts[2] = {(lm_tensor *)god, g32};
      const lm_op op = lm_op_make(kind, 2, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(sg.t, gtmp, st);
   lm_tensor_free(tmp);
   return out_close(&sg, grad_x, st);
}

static lm_status avg_setup(lm_pool_params *p, const lm_tensor *x, const int64_t *kernel,
                           const int64_t *stride, const int64_t *padding, int ceil_mode,
                           int count_include_pad, const int64_t *divisor_override) {
   LM_TRY(check_float(x, "input"));
   LM_TRY(pool_input_dims(x, p, "avg_pool2d", 0));
   LM_TRY(pool_params(p, kernel, stride, padding, NULL, ceil_mode));
   p->count_include_pad = count_include_pad != 0;
   p->has_div = divisor_override != NULL;
   if (divisor_override) {
      if (*divisor_override == 0) return lm_error(LM_ERR_ARG, "divisor must be not zero");
      p->divisor = *divisor_override;
   }
   return LM_OK;
}

lm_status lm_avg_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out) {
   lm_pool_params p = {0};
   LM_TRY(avg_setup(&p, x, kernel, stride, padding, ceil_mode, count_include_pad,
                    divisor_override));
   return avg_forward(x, &p, LM_OP_AVG_POOL2D, out);
}

lm_status lm_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x) {
   lm_pool_params p = {0};
   LM_TRY(avg_setup(&p, x, kernel, stride, padding, ceil_mode, count_include_pad,
                    divisor_override));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, "avg_pool2d_backward"));
   return avg_backward(grad_out, x, &p, LM_OP_AVG_POOL2D_BACKWARD, grad_x, "avg_pool2d_backward");
}

lm_status lm_adaptive_avg_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out) {
   lm_pool_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(pool_input_dims(x, &p, "adaptive_avg_pool2d()", 1));
   LM_TRY(adaptive_params(&p, out_size, "adaptive_avg_pool2d"));
   /* output (1,1) is PyTorch's mean(-1,-2) restrided to (C,1,C,C) for a channels-last input:
      allocating in mf gives exactly those strides */
   return avg_forward(x, &p, LM_OP_ADAPTIVE_AVG_POOL2D, out);
}

lm_status lm_adaptive_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x) {
   lm_pool_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, "adaptive_avg_pool2d_backward"));
   LM_TRY(pool_input_dims(x, &p, "adaptive_avg_pool2d_backward", 1));
   if (grad_out->ndim != x->ndim) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE,
                      "adaptive_avg_pool2d_backward: grad_output %s does not match the input %s",
                      a, b);
   }
   int64_t os[2] = {grad_out->sizes[x->ndim - 2], grad_out->sizes[x->ndim - 1]};
   LM_TRY(adaptive_params(&p, os, "adaptive_avg_pool2d_backward"));
   return avg_backward(grad_out, x, &p, LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, grad_x,
                       "adaptive_avg_pool2d_backward");
}
