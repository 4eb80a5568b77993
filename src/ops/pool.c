/* pool.c -- the front ends of max / average / adaptive pooling over 2-D planes, forward and
 * backward (src/nn.h).
 *
 * Layout (spec section 7): mf = x.suggest_memory_format(); output, indices (taps) and grad_input
 * are allocated in mf on x's device. An input that is not dense in mf is cloned into mf once, so
 * the kernels see every tensor dense in mf (channels-last: NHWC kernels, contiguous: NCHW).
 * Everything here works from sizes and strides only (so the meta device gives the CPU's shapes
 * and errors); the window tables and the values' checks are the kernels' (kernels/cpu/pool2d.h,
 * pool_max.c, pool_avg.c); the checks, sizes and runs it shares with the 3-D pools are
 * pool_common.c's.
 * Kernels: the pooling group of LM_OP_LIST (pool.h gives the params and t[] order). */
#include "nn.h"
#include "pool.h"
#include "pool_common.h"

/* the 2-D kernels' params (pool.h) of a call's shape; the geometry the call has not set stays 0
   (the backwards without it) */
static lm_pool_params params_of(const lm_pool_shape *g) {
   lm_pool_params p = {0};
   p.ndim = g->ndim;
   p.mf = g->mf;
   p.N = g->N;
   p.C = g->C;
   p.H = g->in[0];
   p.W = g->in[1];
   p.OH = g->out[0];
   p.OW = g->out[1];
   p.kh = g->k[0];
   p.kw = g->k[1];
   p.sh = g->s[0];
   p.sw = g->s[1];
   p.ph = g->p[0];
   p.pw = g->p[1];
   p.dh = g->d[0];
   p.dw = g->d[1];
   p.ceil_mode = g->ceil_mode;
   p.count_include_pad = g->count_include_pad;
   p.has_div = g->has_div;
   p.divisor = g->divisor;
   return p;
}

/* ------------------------------------------------------------------------------------------ */
/* max pooling                                                                                */

/* do the max-pool kernels take dtype dt as it is? float32 / float64, and bfloat16 channels-last
   (the ResNet stem's pool in a bf16 training step: kernels/cpu/pool_max.c reads and writes the
   16-bit values); the other half cases run on float32 copies */
static int max_native(int dt, const lm_pool_shape *g) {
   if (!is_half(dt)) return 1;
   return dt == LM_BFLOAT16 && g->mf == LM_CHANNELS_LAST && g->in[0] * g->in[1] < INT32_MAX;
}

/* kind: MAX_POOL2D, ADAPTIVE_MAX_POOL2D or MAX_POOL2D_TAPS; codes (MAX_POOL2D_TAPS only; then
   indices is NULL): the tap numbers instead of the indices, into a new uint8 tensor */
static lm_status max_forward(const lm_tensor *x, const lm_pool_shape *g, int kind,
                             lm_tensor **out, lm_tensor **indices, lm_tensor **codes) {
   const lm_pool_params p = params_of(g);
   return lm_pool_forward(x, g, kind, &p, 3, max_native(x->dtype, g), out, indices, codes);
}

lm_status lm_max_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_max_setup(&g, 2, x, "max_pool2d", kernel, stride, padding, dilation,
                             ceil_mode));
   return max_forward(x, &g, LM_OP_MAX_POOL2D, out, indices, NULL);
}

lm_status lm_adaptive_max_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices) {
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(&g, 2, x, "adaptive_max_pool2d()", 1));
   LM_TRY(lm_pool_adaptive(&g, out_size, "adaptive_max_pool2d()"));
   return max_forward(x, &g, LM_OP_ADAPTIVE_MAX_POOL2D, out, indices, NULL);
}

lm_status lm_max_pool2d_taps(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                             const int64_t *padding, const int64_t *dilation, int ceil_mode,
                             lm_tensor **out, lm_tensor **taps) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_max_setup(&g, 2, x, "max_pool2d", kernel, stride, padding, dilation,
                             ceil_mode));
   if (!taps) return lm_error(LM_ERR_ARG, "taps is NULL");
   if (*taps) return lm_error(LM_ERR_ARG, "max_pool2d_taps: taps must be NULL (a new tensor)");
   if (g.k[0] * g.k[1] > 255)
      return lm_error(LM_ERR_ARG, "max_pool2d_taps: a window of %lld taps has no tap numbers "
                      "(at most 255)", (long long)(g.k[0] * g.k[1]));
   return max_forward(x, &g, LM_OP_MAX_POOL2D_TAPS, out, NULL, taps);
}

/* the op of `kind` on grad_out and ind (indices, int64, or tap numbers, uint8); geom: the window
   geometry is g's (the channels-last gathers then read and write bfloat16 natively) */
static lm_status max_backward_run(const lm_tensor *grad_out, const lm_tensor *x,
                                  const lm_tensor *ind, const lm_pool_shape *g, int geom,
                                  int kind, lm_tensor **grad_x) {
   lm_pool_params p = params_of(g);
   p.geom = geom;
   const int native =
      max_native(x->dtype, g) && (geom || kind == LM_OP_MAX_POOL2D_TAPS_BACKWARD);
   return lm_pool_backward(grad_out, x, ind, g, kind, &p, native, &p.fresh, grad_x);
}

/* grad_out and indices: same rank as x, same N and C, same (OH, OW) */
static lm_status max_backward(const lm_tensor *grad_out, const lm_tensor *x,
                              const lm_tensor *indices, lm_tensor **grad_x, int kind,
                              const char *what) {
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   if (!indices) return lm_error(LM_ERR_ARG, "indices is nil");
   LM_TRY(lm_check_same_device(x, indices, what));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   LM_TRY(lm_pool_index_dtype(indices, 0, what));
   LM_TRY(lm_pool_same_dtype(grad_out, x, what));
   LM_TRY(lm_pool_input(&g, 2, x, what, 0));
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
   g.out[0] = grad_out->sizes[x->ndim - 2];
   g.out[1] = grad_out->sizes[x->ndim - 1];
   return max_backward_run(grad_out, x, indices, &g, 0, kind, grad_x);
}

/* the backward given the window geometry, from int64 indices (ind) or tap numbers (codes):
   channels-last gathers, contiguous scatters by planes (the kernels) */
static lm_status max_backward_geom(const lm_tensor *grad_out, const lm_tensor *x,
                                   const lm_tensor *ind, int codes, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   const int64_t *dilation, int ceil_mode, lm_tensor **grad_x,
                                   const char *what) {
   const char *iname = codes ? "taps" : "indices";
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   if (!ind) return lm_error(LM_ERR_ARG, "%s is nil", iname);
   LM_TRY(lm_check_same_device(x, ind, what));
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   LM_TRY(lm_pool_index_dtype(ind, codes, what));
   LM_TRY(lm_pool_same_dtype(grad_out, x, what));
   LM_TRY(lm_pool_input(&g, 2, x, what, 0));
   LM_TRY(lm_pool_window(&g, kernel, stride, padding, dilation, ceil_mode));
   if (codes && g.k[0] * g.k[1] > 255)
      return lm_error(LM_ERR_ARG, "%s: a window of %lld taps has no tap numbers (at most 255)",
                      what, (long long)(g.k[0] * g.k[1]));
   int64_t osz[4];
   lm_pool_out_sizes(&g, osz);
   LM_TRY(lm_pool_expect_shape(grad_out, g.ndim, osz, "grad_output", what));
   LM_TRY(lm_pool_expect_shape(ind, g.ndim, osz, iname, what));
   return max_backward_run(grad_out, x, ind, &g, 1,
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

/* kind: AVG_POOL2D_BACKWARD or ADAPTIVE_AVG_POOL2D_BACKWARD */
static lm_status avg_backward(const lm_tensor *grad_out, const lm_tensor *x,
                              const lm_pool_shape *g, lm_pool_params *p, int kind,
                              lm_tensor **grad_x, const char *what) {
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   LM_TRY(lm_pool_check_grad(grad_out, x, g, what));
   return lm_pool_backward(grad_out, x, NULL, g, kind, p, 0, &p->fresh, grad_x);
}

lm_status lm_avg_pool2d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_avg_setup(&g, 2, x, "avg_pool2d", kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override));
   const lm_pool_params p = params_of(&g);
   return lm_pool_forward(x, &g, LM_OP_AVG_POOL2D, &p, 2, 0, out, NULL, NULL);
}

lm_status lm_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_avg_setup(&g, 2, x, "avg_pool2d", kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override));
   lm_pool_params p = params_of(&g);
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, "avg_pool2d_backward"));
   return avg_backward(grad_out, x, &g, &p, LM_OP_AVG_POOL2D_BACKWARD, grad_x,
                       "avg_pool2d_backward");
}

lm_status lm_adaptive_avg_pool2d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out) {
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(&g, 2, x, "adaptive_avg_pool2d()", 1));
   LM_TRY(lm_pool_adaptive(&g, out_size, "adaptive_avg_pool2d"));
   /* output (1,1) is PyTorch's mean(-1,-2) restrided to (C,1,C,C) for a channels-last input:
      allocating in mf gives exactly those strides */
   const lm_pool_params p = params_of(&g);
   return lm_pool_forward(x, &g, LM_OP_ADAPTIVE_AVG_POOL2D, &p, 2, 0, out, NULL, NULL);
}

lm_status lm_adaptive_avg_pool2d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x) {
   const char *what = "adaptive_avg_pool2d_backward";
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   LM_TRY(lm_pool_input(&g, 2, x, what, 1));
   LM_TRY(lm_pool_same_rank(grad_out, x, what));
   const int64_t os[2] = {grad_out->sizes[x->ndim - 2], grad_out->sizes[x->ndim - 1]};
   LM_TRY(lm_pool_adaptive(&g, os, what));
   lm_pool_params p = params_of(&g);
   return avg_backward(grad_out, x, &g, &p, LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, grad_x, what);
}
