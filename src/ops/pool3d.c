/* pool3d.c -- the front ends of max / average / adaptive pooling over 3-D volumes, forward and
 * backward (src/nn.h), on (N,C,D,H,W) and unbatched (C,D,H,W) input.
 *
 * Layout (issue 19's rule for 5-D): mf = LM_CHANNELS_LAST_3D when x suggests it, else
 * LM_CONTIGUOUS (a 4-D unbatched input is always contiguous); output, indices and grad_input are
 * allocated in mf on x's device, for every op (PyTorch 2.15 returns contiguous for avg_pool3d and
 * the adaptive pools of a channels_last_3d input: values identical, lumen keeps the format). An
 * input that is not dense in mf is cloned into mf once, so the kernels see every tensor dense in
 * mf (NDHWC or NCDHW kernels). float16 / bfloat16 run on float32 copies, rounded once. Output
 * sizes and ceil_mode follow the 2-D code (src/ops/pool.c). Everything here works from sizes and
 * strides only (the meta device gives the CPU's shapes and errors).
 * Kernels: the 3-D entries of the pooling group of LM_OP_LIST (pool3d.h gives the params and t[]
 * order; the CPU's are in kernels/cpu/pool3d.c). */
#include "common.h"
#include "nn.h"
#include "pool3d.h"

static inline int64_t div_floor3(int64_t a, int64_t b) {
   int64_t q = a / b, r = a % b;
   if (r != 0 && ((r < 0) != (b < 0))) q--;
   return q;
}

static lm_status input_dims(const lm_tensor *x, lm_pool3d_params *p, const char *what,
                            int adaptive) {
   char s[160];
   if (x->ndim != 4 && x->ndim != 5) {
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      if (adaptive)
         return lm_error(LM_ERR_SHAPE, "%s: Expected 4D or 5D tensor, but got %s", what, s);
      return lm_error(LM_ERR_SHAPE,
                      "non-empty 4D or 5D (batch mode) tensor expected for input, but got %s", s);
   }
   for (int d = x->ndim - 4; d < x->ndim; d++) {
      if (x->sizes[d] == 0) {
         lm_format_shape(s, sizeof s, x->ndim, x->sizes);
         return lm_error(LM_ERR_SHAPE,
                         "%s: Expected input to have non-zero size for non-batch dimensions, but "
                         "input has sizes %s with dimension %d being empty",
                         what, s, d);
      }
   }
   p->ndim = x->ndim;
   p->N = x->ndim == 5 ? x->sizes[0] : 1;
   p->C = x->sizes[x->ndim - 4];
   p->D = x->sizes[x->ndim - 3];
   p->H = x->sizes[x->ndim - 2];
   p->W = x->sizes[x->ndim - 1];
   p->mf = x->ndim == 5 && lm_suggest_memory_format(x, 0) == LM_CHANNELS_LAST_3D
              ? LM_CHANNELS_LAST_3D
              : LM_CONTIGUOUS;
   return LM_OK;
}

static int64_t out_size1(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, int ceil) {
   int64_t o = div_floor3(in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
   if (ceil && (o - 1) * s >= in + pad) --o;
   return o;
}

/* kernel / stride / padding / dilation checks and output size of max_pool3d and avg_pool3d */
static lm_status geometry(lm_pool3d_params *p, const int64_t *k, const int64_t *s,
                          const int64_t *pad, const int64_t *dil, int ceil_mode) {
   if (!k) return lm_error(LM_ERR_ARG, "kernel_size is nil");
   for (int i = 0; i < 3; i++) {
      p->k[i] = k[i];
      p->s[i] = s ? s[i] : k[i];
      p->p[i] = pad ? pad[i] : 0;
      p->d[i] = dil ? dil[i] : 1;
   }
   p->ceil_mode = ceil_mode != 0;
   if (p->k[0] <= 0 || p->k[1] <= 0 || p->k[2] <= 0)
      return lm_error(LM_ERR_ARG,
                      "kernel size should be greater than zero, but got kT: %lld kH: %lld kW: %lld",
                      (long long)p->k[0], (long long)p->k[1], (long long)p->k[2]);
   if (p->s[0] <= 0 || p->s[1] <= 0 || p->s[2] <= 0)
      return lm_error(LM_ERR_ARG,
                      "stride should be greater than zero, but got dT: %lld dH: %lld dW: %lld",
                      (long long)p->s[0], (long long)p->s[1], (long long)p->s[2]);
   if (p->d[0] <= 0 || p->d[1] <= 0 || p->d[2] <= 0)
      return lm_error(LM_ERR_ARG,
                      "dilation should be greater than zero, but got dilationT: %lld dilationH: "
                      "%lld dilationW: %lld",
                      (long long)p->d[0], (long long)p->d[1], (long long)p->d[2]);
   for (int i = 0; i < 3; i++) {
      if (p->p[i] < 0)
         return lm_error(LM_ERR_ARG, "pad must be non-negative, but got pad: %lld",
                         (long long)p->p[i]);
      if (p->p[i] > ((p->k[i] - 1) * p->d[i] + 1) / 2)
         return lm_error(LM_ERR_ARG,
                         "pad should be at most half of effective kernel size, but got pad=%lld, "
                         "kernel_size=%lld and dilation=%lld",
                         (long long)p->p[i], (long long)p->k[i], (long long)p->d[i]);
   }
   p->OD = out_size1(p->D, p->k[0], p->p[0], p->s[0], p->d[0], p->ceil_mode);
   p->OH = out_size1(p->H, p->k[1], p->p[1], p->s[1], p->d[1], p->ceil_mode);
   p->OW = out_size1(p->W, p->k[2], p->p[2], p->s[2], p->d[2], p->ceil_mode);
   if (p->OD < 1 || p->OH < 1 || p->OW < 1)
      return lm_error(LM_ERR_SHAPE,
                      "Given input size: (%lldx%lldx%lldx%lld). Calculated output size: "
                      "(%lldx%lldx%lldx%lld). Output size is too small",
                      (long long)p->C, (long long)p->D, (long long)p->H, (long long)p->W,
                      (long long)p->C, (long long)p->OD, (long long)p->OH, (long long)p->OW);
   return LM_OK;
}

static lm_status adaptive_geometry(lm_pool3d_params *p, const int64_t *o, const char *what) {
   if (!o) return lm_error(LM_ERR_ARG, "%s: output_size is nil", what);
   if (o[0] < 0 || o[1] < 0 || o[2] < 0)
      return lm_error(LM_ERR_ARG,
                      "%s: elements of output_size must be greater than or equal to 0 but "
                      "received {%lld, %lld, %lld}",
                      what, (long long)o[0], (long long)o[1], (long long)o[2]);
   p->OD = o[0];
   p->OH = o[1];
   p->OW = o[2];
   for (int i = 0; i < 3; i++) p->k[i] = p->s[i] = p->d[i] = 1, p->p[i] = 0;
   return LM_OK;
}

static void out_sizes3(const lm_pool3d_params *p, int64_t *sz) {
   int i = 0;
   if (p->ndim == 5) sz[i++] = p->N;
   sz[i++] = p->C;
   sz[i++] = p->OD;
   sz[i++] = p->OH;
   sz[i] = p->OW;
}

static lm_status check_grad(const lm_tensor *grad_out, const lm_tensor *x,
                            const lm_pool3d_params *p, const char *what) {
   int64_t osz[5];
   out_sizes3(p, osz);
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   if (grad_out->ndim != p->ndim || memcmp(grad_out->sizes, osz, (size_t)p->ndim * 8) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, p->ndim, osz);
      lm_format_shape(b, sizeof b, grad_out->ndim, grad_out->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: expected grad_output of shape %s, got %s", what, a, b);
   }
   return LM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* forward: t = {x, out[, indices]}                                                           */

static lm_status forward(const lm_tensor *x, lm_pool3d_params *p, int kind, lm_tensor **out,
                         lm_tensor **indices) {
   int64_t osz[5];
   out_sizes3(p, osz);
   out_slot so = {0}, si = {0};
   const lm_tensor *xd = NULL;
   lm_tensor *tmp = NULL, *o32 = NULL, *otmp = NULL;
   const int is_max = kind == LM_OP_MAX_POOL3D || kind == LM_OP_ADAPTIVE_MAX_POOL3D;
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   lm_status st = out_open(&so, out, p->ndim, osz, x->dtype, p->mf, x->device, "output");
   if (st == LM_OK && indices)
      st = out_open(&si, indices, p->ndim, osz, LM_INT64, p->mf, x->device, "indices");
   /* halves: the float32 kernel on a widened copy, the results rounded once (the max exactly) */
   if (st == LM_OK) st = dense_float_in_format(x, p->mf, &xd, &tmp);
   if (st == LM_OK && so.t->numel > 0) st = half_open(so.t, p->mf, &o32, &otmp);
   if (st == LM_OK && so.t->numel > 0) {
      lm_tensor *ts[3] = {(lm_tensor *)xd, o32, si.t};
      const lm_op op = lm_op_make(kind, is_max ? 3 : 2, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(so.t, otmp, st);
   lm_tensor_free(tmp);
   if (indices) st = out_close(&si, indices, st);
   return out_close(&so, out, st);
}

/* backward: t = {grad_out[, indices], grad_x} */
static lm_status backward(const lm_tensor *grad_out, const lm_tensor *x, const lm_tensor *ind,
                          lm_pool3d_params *p, int kind, lm_tensor **grad_x) {
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   out_slot sg = {0};
   const lm_tensor *god = NULL, *indd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *g32 = NULL, *gtmp = NULL;
   lm_status st = out_open(&sg, grad_x, x->ndim, x->sizes, x->dtype, p->mf, x->device,
                           "grad_input");
   if (st == LM_OK) st = dense_float_in_format(grad_out, p->mf, &god, &t1);
   if (st == LM_OK && ind) st = dense_in_format(ind, p->mf, &indd, &t2);
   if (st == LM_OK && sg.t->numel > 0) st = half_open(sg.t, p->mf, &g32, &gtmp);
   if (st == LM_OK && sg.t->numel > 0) {
      lm_tensor *ts[3] = {(lm_tensor *)god, (lm_tensor *)indd, g32};
      if (!ind) ts[1] = g32;
      const lm_op op = lm_op_make(kind, ind ? 3 : 2, ts, p);
      st = lm_dispatch(&op);
   }
   st = half_close(sg.t, gtmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   return out_close(&sg, grad_x, st);
}

/* ------------------------------------------------------------------------------------------ */
/* max pooling                                                                                */

lm_status lm_max_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices) {
   lm_pool3d_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(input_dims(x, &p, "max_pool3d", 0));
   LM_TRY(geometry(&p, kernel, stride, padding, dilation, ceil_mode));
   return forward(x, &p, LM_OP_MAX_POOL3D, out, indices);
}

lm_status lm_adaptive_max_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices) {
   lm_pool3d_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(input_dims(x, &p, "adaptive_max_pool3d()", 1));
   LM_TRY(adaptive_geometry(&p, out_size, "adaptive_max_pool3d()"));
   return forward(x, &p, LM_OP_ADAPTIVE_MAX_POOL3D, out, indices);
}

static lm_status max_backward3(const lm_tensor *grad_out, const lm_tensor *x,
                               const lm_tensor *indices, lm_tensor **grad_x, int kind,
                               const char *what) {
   lm_pool3d_params p = {0};
   LM_TRY(check_float(x, "input"));
   if (!indices) return lm_error(LM_ERR_ARG, "indices is nil");
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, indices, what));
   if (indices->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "%s: expected indices of dtype int64, got %s", what,
                      lm_dtype_name(indices->dtype));
   LM_TRY(input_dims(x, &p, what, 0));
   if (grad_out->ndim != x->ndim) {
      char a[160], c[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(c, sizeof c, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match the input %s", what, a, c);
   }
   p.OD = grad_out->sizes[x->ndim - 3];
   p.OH = grad_out->sizes[x->ndim - 2];
   p.OW = grad_out->sizes[x->ndim - 1];
   LM_TRY(check_grad(grad_out, x, &p, what));
   if (indices->ndim != grad_out->ndim ||
       memcmp(indices->sizes, grad_out->sizes, (size_t)x->ndim * 8) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, indices->ndim, indices->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s and indices %s differ in shape", what, a,
                      b);
   }
   return backward(grad_out, x, indices, &p, kind, grad_x);
}

lm_status lm_max_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *indices, lm_tensor **grad_x) {
   return max_backward3(grad_out, x, indices, grad_x, LM_OP_MAX_POOL3D_BACKWARD,
                        "max_pool3d_backward");
}

/* the same gradient given the forward's geometry (for autograd): the CUDA kernels gather over
   the windows holding each input element instead of scattering (the CPU's ignore it) */
lm_status lm_max_pool3d_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                      const lm_tensor *indices, const int64_t *kernel,
                                      const int64_t *stride, const int64_t *padding,
                                      const int64_t *dilation, int ceil_mode,
                                      lm_tensor **grad_x) {
   const char *what = "max_pool3d_backward";
   lm_pool3d_params p = {0};
   LM_TRY(check_float(x, "input"));
   if (!indices) return lm_error(LM_ERR_ARG, "indices is nil");
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, indices, what));
   if (indices->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "%s: expected indices of dtype int64, got %s", what,
                      lm_dtype_name(indices->dtype));
   LM_TRY(input_dims(x, &p, what, 0));
   LM_TRY(geometry(&p, kernel, stride, padding, dilation, ceil_mode));
   LM_TRY(check_grad(grad_out, x, &p, what));
   if (indices->ndim != grad_out->ndim ||
       memcmp(indices->sizes, grad_out->sizes, (size_t)x->ndim * 8) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, indices->ndim, indices->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s and indices %s differ in shape", what, a,
                      b);
   }
   p.geom = 1;
   return backward(grad_out, x, indices, &p, LM_OP_MAX_POOL3D_BACKWARD, grad_x);
}

lm_status lm_adaptive_max_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          const lm_tensor *indices, lm_tensor **grad_x) {
   return max_backward3(grad_out, x, indices, grad_x, LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD,
                        "adaptive_max_pool3d_backward");
}

/* ------------------------------------------------------------------------------------------ */
/* average pooling                                                                            */

static lm_status avg_setup3(lm_pool3d_params *p, const lm_tensor *x, const int64_t *kernel,
                            const int64_t *stride, const int64_t *padding, int ceil_mode,
                            int count_include_pad, const int64_t *divisor_override) {
   LM_TRY(check_float(x, "input"));
   LM_TRY(input_dims(x, p, "avg_pool3d", 0));
   LM_TRY(geometry(p, kernel, stride, padding, NULL, ceil_mode));
   p->count_include_pad = count_include_pad != 0;
   p->has_div = divisor_override != NULL;
   if (divisor_override) {
      if (*divisor_override == 0) return lm_error(LM_ERR_ARG, "divisor must be not zero");
      p->divisor = *divisor_override;
   }
   return LM_OK;
}

lm_status lm_avg_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out) {
   lm_pool3d_params p = {0};
   LM_TRY(avg_setup3(&p, x, kernel, stride, padding, ceil_mode, count_include_pad,
                     divisor_override));
   return forward(x, &p, LM_OP_AVG_POOL3D, out, NULL);
}

lm_status lm_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x) {
   lm_pool3d_params p = {0};
   LM_TRY(avg_setup3(&p, x, kernel, stride, padding, ceil_mode, count_include_pad,
                     divisor_override));
   LM_TRY(check_grad(grad_out, x, &p, "avg_pool3d_backward"));
   return backward(grad_out, x, NULL, &p, LM_OP_AVG_POOL3D_BACKWARD, grad_x);
}

lm_status lm_adaptive_avg_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out) {
   lm_pool3d_params p = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(input_dims(x, &p, "adaptive_avg_pool3d()", 1));
   LM_TRY(adaptive_geometry(&p, out_size, "adaptive_avg_pool3d"));
   return forward(x, &p, LM_OP_ADAPTIVE_AVG_POOL3D, out, NULL);
}

lm_status lm_adaptive_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x) {
   lm_pool3d_params p = {0};
   const char *what = "adaptive_avg_pool3d_backward";
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(input_dims(x, &p, what, 1));
   if (grad_out->ndim != x->ndim) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match the input %s", what, a, b);
   }
   const int64_t os[3] = {grad_out->sizes[x->ndim - 3], grad_out->sizes[x->ndim - 2],
                          grad_out->sizes[x->ndim - 1]};
   LM_TRY(adaptive_geometry(&p, os, what));
   LM_TRY(check_grad(grad_out, x, &p, what));
   return backward(grad_out, x, NULL, &p, LM_OP_ADAPTIVE_AVG_POOL3D_BACKWARD, grad_x);
}
