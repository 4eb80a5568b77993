/* pool3d.c -- the front ends of max / average / adaptive pooling over 3-D volumes, forward and
 * backward (src/nn.h), on (N,C,D,H,W) and unbatched (C,D,H,W) input.
 *
 * Layout (issue 19's rule for 5-D): mf = LM_CHANNELS_LAST_3D when x suggests it, else
 * LM_CONTIGUOUS (a 4-D unbatched input is always contiguous); output, indices and grad_input are
 * allocated in mf on x's device, for every op (PyTorch 2.15 returns contiguous for avg_pool3d and
 * the adaptive pools of a channels_last_3d input: values identical, lumen keeps the format). An
 * input that is not dense in mf is cloned into mf once, so the kernels see every tensor dense in
 * mf (NDHWC or NCDHW kernels). float16 / bfloat16 run on float32 copies, rounded once. Output
 * sizes and ceil_mode are the 2-D pools' rules (pool_common.c). Everything here works from sizes
 * and strides only (the meta device gives the CPU's shapes and errors).
 * Kernels: the 3-D entries of the pooling group of LM_OP_LIST (pool3d.h gives the params and t[]
 * order; the CPU's are in kernels/cpu/pool3d.c). The checks, sizes and runs it shares with the
 * 2-D pools are pool_common.c's. */
#include "nn.h"
#include "pool3d.h"
#include "pool_common.h"

/* the 3-D kernels' params (pool3d.h) of a call's shape; the geometry the call has not set stays
   0 (the backwards without it) */
static lm_pool3d_params params_of(const lm_pool_shape *g) {
   lm_pool3d_params p = {0};
   p.ndim = g->ndim;
   p.mf = g->mf;
   p.N = g->N;
   p.C = g->C;
   p.D = g->in[0];
   p.H = g->in[1];
   p.W = g->in[2];
   p.OD = g->out[0];
   p.OH = g->out[1];
   p.OW = g->out[2];
   for (int i = 0; i < 3; i++) {
      p.k[i] = g->k[i];
      p.s[i] = g->s[i];
      p.p[i] = g->p[i];
      p.d[i] = g->d[i];
   }
   p.ceil_mode = g->ceil_mode;
   p.count_include_pad = g->count_include_pad;
   p.has_div = g->has_div;
   p.divisor = g->divisor;
   return p;
}

static lm_status check_grad(const lm_tensor *grad_out, const lm_tensor *x, const lm_pool_shape *g,
                            const char *what) {
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, grad_out, what));
   return lm_pool_check_grad(grad_out, x, g, what);
}

/* forward: t = {x, out[, indices]} */
static lm_status forward(const lm_tensor *x, const lm_pool_shape *g, const lm_pool3d_params *p,
                         int kind, lm_tensor **out, lm_tensor **indices) {
   const int is_max = kind == LM_OP_MAX_POOL3D || kind == LM_OP_ADAPTIVE_MAX_POOL3D;
   return lm_pool_forward(x, g, kind, p, is_max ? 3 : 2, 0, out, indices, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* max pooling                                                                                */

lm_status lm_max_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        lm_tensor **out, lm_tensor **indices) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_max_setup(&g, 3, x, "max_pool3d", kernel, stride, padding, dilation,
                            ceil_mode));
   const lm_pool3d_params p = params_of(&g);
   return forward(x, &g, &p, LM_OP_MAX_POOL3D, out, indices);
}

lm_status lm_adaptive_max_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out,
                                 lm_tensor **indices) {
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(&g, 3, x, "adaptive_max_pool3d()", 1));
   LM_TRY(lm_pool_adaptive(&g, out_size, "adaptive_max_pool3d()"));
   const lm_pool3d_params p = params_of(&g);
   return forward(x, &g, &p, LM_OP_ADAPTIVE_MAX_POOL3D, out, indices);
}

/* the checks the max backwards begin with: x, the indices (present, on x's device, int64),
   grad_output, and x's sizes into g */
static lm_status max_backward_args(const lm_tensor *grad_out, const lm_tensor *x,
                                   const lm_tensor *indices, lm_pool_shape *g, const char *what) {
   LM_TRY(check_float(x, "input"));
   if (!indices) return lm_error(LM_ERR_ARG, "indices is nil");
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_check_same_device(x, indices, what));
   LM_TRY(lm_pool_index_dtype(indices, 0, what));
   return lm_pool_input(g, 3, x, what, 0);
}

/* grad_out (checked against g's output) and the indices of one shape, then the op */
static lm_status max_backward_run(const lm_tensor *grad_out, const lm_tensor *x,
                                  const lm_tensor *indices, const lm_pool_shape *g, int geom,
                                  int kind, lm_tensor **grad_x, const char *what) {
   LM_TRY(check_grad(grad_out, x, g, what));
   if (indices->ndim != grad_out->ndim ||
       memcmp(indices->sizes, grad_out->sizes, (size_t)x->ndim * 8) != 0) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
      lm_format_shape(b, sizeof b, indices->ndim, indices->sizes);
      return lm_error(LM_ERR_SHAPE, "%s: grad_output %s and indices %s differ in shape", what, a,
                      b);
   }
   lm_pool3d_params p = params_of(g);
   p.geom = geom;
   return lm_pool_backward(grad_out, x, indices, g, kind, &p, 0, NULL, grad_x);
}

static lm_status max_backward3(const lm_tensor *grad_out, const lm_tensor *x,
                               const lm_tensor *indices, lm_tensor **grad_x, int kind,
                               const char *what) {
   lm_pool_shape g = {0};
   LM_TRY(max_backward_args(grad_out, x, indices, &g, what));
   LM_TRY(lm_pool_same_rank(grad_out, x, what));
   for (int i = 0; i < 3; i++) g.out[i] = grad_out->sizes[x->ndim - 3 + i];
   return max_backward_run(grad_out, x, indices, &g, 0, kind, grad_x, what);
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
   lm_pool_shape g = {0};
   LM_TRY(max_backward_args(grad_out, x, indices, &g, what));
   LM_TRY(lm_pool_window(&g, kernel, stride, padding, dilation, ceil_mode));
   return max_backward_run(grad_out, x, indices, &g, 1, LM_OP_MAX_POOL3D_BACKWARD, grad_x, what);
}

lm_status lm_adaptive_max_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          const lm_tensor *indices, lm_tensor **grad_x) {
   return max_backward3(grad_out, x, indices, grad_x, LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD,
                        "adaptive_max_pool3d_backward");
}

/* ------------------------------------------------------------------------------------------ */
/* average pooling                                                                            */

lm_status lm_avg_pool3d(const lm_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        const int64_t *divisor_override, lm_tensor **out) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_avg_setup(&g, 3, x, "avg_pool3d", kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override));
   const lm_pool3d_params p = params_of(&g);
   return forward(x, &g, &p, LM_OP_AVG_POOL3D, out, NULL);
}

lm_status lm_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const int64_t *kernel, const int64_t *stride,
                                 const int64_t *padding, int ceil_mode, int count_include_pad,
                                 const int64_t *divisor_override, lm_tensor **grad_x) {
   lm_pool_shape g = {0};
   LM_TRY(lm_pool_avg_setup(&g, 3, x, "avg_pool3d", kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override));
   lm_pool3d_params p = params_of(&g);
   LM_TRY(check_grad(grad_out, x, &g, "avg_pool3d_backward"));
   return lm_pool_backward(grad_out, x, NULL, &g, LM_OP_AVG_POOL3D_BACKWARD, &p, 0, NULL, grad_x);
}

lm_status lm_adaptive_avg_pool3d(const lm_tensor *x, const int64_t *out_size, lm_tensor **out) {
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(&g, 3, x, "adaptive_avg_pool3d()", 1));
   LM_TRY(lm_pool_adaptive(&g, out_size, "adaptive_avg_pool3d"));
   const lm_pool3d_params p = params_of(&g);
   return forward(x, &g, &p, LM_OP_ADAPTIVE_AVG_POOL3D, out, NULL);
}

lm_status lm_adaptive_avg_pool3d_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                          lm_tensor **grad_x) {
   const char *what = "adaptive_avg_pool3d_backward";
   lm_pool_shape g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(lm_pool_input(&g, 3, x, what, 1));
   LM_TRY(lm_pool_same_rank(grad_out, x, what));
   const int64_t os[3] = {grad_out->sizes[x->ndim - 3], grad_out->sizes[x->ndim - 2],
                          grad_out->sizes[x->ndim - 1]};
   LM_TRY(lm_pool_adaptive(&g, os, what));
   LM_TRY(check_grad(grad_out, x, &g, what));
   lm_pool3d_params p = params_of(&g);
   return lm_pool_backward(grad_out, x, NULL, &g, LM_OP_ADAPTIVE_AVG_POOL3D_BACKWARD, &p, 0, NULL,
                           grad_x);
}
