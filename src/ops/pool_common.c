/* pool_common.c -- the checks, output sizes and runs that the 2-D and 3-D pooling front ends
 * share (pool_common.h says what each function does). The messages are PyTorch's where it has
 * one for the case (the specs compare them), with the dimension names of the rank: {H, W} for the
 * 2-D pools, {T, H, W} for the 3-D ones. Everything here works from sizes and strides only (the
 * meta device gives the CPU's shapes and errors). */
#include "pool_common.h"

/* floor division (PyTorch's div_rtn) */
static inline int64_t div_floor(int64_t a, int64_t b) {
   int64_t q = a / b, r = a % b;
   if (r != 0 && ((r < 0) != (b < 0))) q--;
   return q;
}

/* the output size along one dimension (PyTorch's pooling_output_shape): with ceil_mode the last
   window must start inside the input or its left padding */
static int64_t out_size(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, int ceil) {
   int64_t o = div_floor(in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
   if (ceil && (o - 1) * s >= in + pad) --o;
   return o;
}

/* "kT: 2 kH: 3 kW: 3" (prefix "k", n = 3): the values of the n spatial dimensions, named as
   PyTorch's messages name them */
static const char *list_named(char *buf, size_t size, const char *prefix, const int64_t *v, int n) {
   static const char *const names[3] = {"T", "H", "W"};
   size_t at = 0;
   buf[0] = 0;
   for (int i = 0; i < n && at < size; i++)
      at += (size_t)snprintf(buf + at, size - at, "%s%s%s: %lld", i ? " " : "", prefix,
                             names[3 - n + i], (long long)v[i]);
   return buf;
}

/* "2, 3, 4" (sep ", ") or "Cx2x3" (the sizes behind a lead value, sep "x") */
static const char *list_plain(char *buf, size_t size, const char *sep, const int64_t *v, int n) {
   size_t at = 0;
   buf[0] = 0;
   for (int i = 0; i < n && at < size; i++)
      at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? sep : "", (long long)v[i]);
   return buf;
}

static int any_below(const int64_t *v, int n, int64_t lo) {
   for (int i = 0; i < n; i++)
      if (v[i] < lo) return 1;
   return 0;
}

/* the rank error of max_pool / avg_pool (PyTorch's two texts: the 2-D pools' also names an empty
   spatial or channel dimension) */
static lm_status rank_error(int n, const char *shape) {
   if (n == 2)
      return lm_error(LM_ERR_SHAPE,
                      "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for "
                      "input, but got: %s",
                      shape);
   return lm_error(LM_ERR_SHAPE,
                   "non-empty 4D or 5D (batch mode) tensor expected for input, but got %s", shape);
}

lm_status lm_pool_input(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                        int adaptive) {
   char s[160];
   if (x->ndim != n + 1 && x->ndim != n + 2) {
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      if (adaptive)
         return lm_error(LM_ERR_SHAPE, "%s: Expected %dD or %dD tensor, but got %s", what, n + 1,
                         n + 2, s);
      return rank_error(n, s);
   }
   for (int d = x->ndim - (n + 1); d < x->ndim; d++) {
      if (x->sizes[d] != 0) continue;
      lm_format_shape(s, sizeof s, x->ndim, x->sizes);
      if (n == 2 && !adaptive) return rank_error(n, s);
      return lm_error(LM_ERR_SHAPE,
                      "%s: Expected input to have non-zero size for non-batch dimensions, but "
                      "input has sizes %s with dimension %d being empty",
                      what, s, d);
   }
   g->n = n;
   g->ndim = x->ndim;
   g->N = x->ndim == n + 2 ? x->sizes[0] : 1;
   g->C = x->sizes[x->ndim - n - 1];
   for (int i = 0; i < n; i++) g->in[i] = x->sizes[x->ndim - n + i];
   /* the channels-last format of the rank when x suggests it; an unbatched (C,D,H,W) input of a
      3-D pool is contiguous whatever its strides (channels_last_3d is a 5-D format) */
   const int cl = n == 2 ? LM_CHANNELS_LAST : LM_CHANNELS_LAST_3D;
   g->mf = (n == 2 || x->ndim == 5) && lm_suggest_memory_format(x, 0) == cl ? cl : LM_CONTIGUOUS;
   return LM_OK;
}

static lm_status pad_negative(int64_t pad) {
   return lm_error(LM_ERR_ARG, "pad must be non-negative, but got pad: %lld", (long long)pad);
}

lm_status lm_pool_window(lm_pool_shape *g, const int64_t *k, const int64_t *s, const int64_t *pad,
                         const int64_t *dil, int ceil_mode) {
   const int n = g->n;
   char a[160], b[160];
   if (!k) return lm_error(LM_ERR_ARG, "kernel_size is nil");
   for (int i = 0; i < n; i++) {
      g->k[i] = k[i];
      g->s[i] = s ? s[i] : k[i];
      g->p[i] = pad ? pad[i] : 0;
      g->d[i] = dil ? dil[i] : 1;
   }
   g->ceil_mode = ceil_mode != 0;
   if (any_below(g->k, n, 1))
      return lm_error(LM_ERR_ARG, "kernel size should be greater than zero, but got %s",
                      list_named(a, sizeof a, "k", g->k, n));
   if (any_below(g->s, n, 1))
      return lm_error(LM_ERR_ARG, "stride should be greater than zero, but got %s",
                      list_named(a, sizeof a, "d", g->s, n));
   if (any_below(g->d, n, 1))
      return lm_error(LM_ERR_ARG, "dilation should be greater than zero, but got %s",
                      list_named(a, sizeof a, "dilation", g->d, n));
   /* the 2-D pools report a negative padding before checking any padding against its kernel,
      the 3-D pools check dimension by dimension: the orders differ only when both errors occur
      at once, and each rank keeps the one its callers know */
   for (int i = 0; n == 2 && i < n; i++)
      if (g->p[i] < 0) return pad_negative(g->p[i]);
   for (int i = 0; i < n; i++) {
      if (g->p[i] < 0) return pad_negative(g->p[i]);
      if (g->p[i] > ((g->k[i] - 1) * g->d[i] + 1) / 2)
         return lm_error(LM_ERR_ARG,
                         "pad should be at most half of effective kernel size, but got pad=%lld, "
                         "kernel_size=%lld and dilation=%lld",
                         (long long)g->p[i], (long long)g->k[i], (long long)g->d[i]);
   }
   for (int i = 0; i < n; i++)
      g->out[i] = out_size(g->in[i], g->k[i], g->p[i], g->s[i], g->d[i], g->ceil_mode);
   if (any_below(g->out, n, 1)) {
      int64_t in[4] = {g->C}, out[4] = {g->C};
      for (int i = 0; i < n; i++) in[i + 1] = g->in[i], out[i + 1] = g->out[i];
      return lm_error(LM_ERR_SHAPE,
                      "Given input size: (%s). Calculated output size: (%s). Output size is too "
                      "small",
                      list_plain(a, sizeof a, "x", in, n + 1), list_plain(b, sizeof b, "x", out, n + 1));
   }
   return LM_OK;
}

lm_status lm_pool_adaptive(lm_pool_shape *g, const int64_t *out_size, const char *what) {
   const int n = g->n;
   char a[160];
   if (!out_size) return lm_error(LM_ERR_ARG, "%s: output_size is nil", what);
   if (any_below(out_size, n, 0))
      return lm_error(LM_ERR_ARG,
                      "%s: elements of output_size must be greater than or equal to 0 but "
                      "received {%s}",
                      what, list_plain(a, sizeof a, ", ", out_size, n));
   for (int i = 0; i < n; i++) {
      g->out[i] = out_size[i];
      g->k[i] = g->s[i] = g->d[i] = 1;
      g->p[i] = 0;
   }
   return LM_OK;
}

void lm_pool_out_sizes(const lm_pool_shape *g, int64_t *sz) {
   int i = 0;
   if (g->ndim == g->n + 2) sz[i++] = g->N;
   sz[i++] = g->C;
   for (int j = 0; j < g->n; j++) sz[i++] = g->out[j];
}

lm_status lm_pool_max_setup(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                            const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                            const int64_t *dilation, int ceil_mode) {
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(g, n, x, what, 0));
   return lm_pool_window(g, kernel, stride, padding, dilation, ceil_mode);
}

lm_status lm_pool_avg_setup(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                            const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                            int ceil_mode, int count_include_pad,
                            const int64_t *divisor_override) {
   LM_TRY(check_float(x, "input"));
   LM_TRY(lm_pool_input(g, n, x, what, 0));
   LM_TRY(lm_pool_window(g, kernel, stride, padding, NULL, ceil_mode));
   g->count_include_pad = count_include_pad != 0;
   g->has_div = divisor_override != NULL;
   if (divisor_override) {
      if (*divisor_override == 0) return lm_error(LM_ERR_ARG, "divisor must be not zero");
      g->divisor = *divisor_override;
   }
   return LM_OK;
}

lm_status lm_pool_same_dtype(const lm_tensor *grad_out, const lm_tensor *x, const char *what) {
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "%s: grad_output has dtype %s but input has %s", what,
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   return LM_OK;
}

lm_status lm_pool_expect_shape(const lm_tensor *t, int ndim, const int64_t *sizes,
                               const char *name, const char *what) {
   if (t->ndim == ndim && memcmp(t->sizes, sizes, (size_t)ndim * sizeof(int64_t)) == 0)
      return LM_OK;
   char a[160], b[160];
   lm_format_shape(a, sizeof a, ndim, sizes);
   lm_format_shape(b, sizeof b, t->ndim, t->sizes);
   return lm_error(LM_ERR_SHAPE, "%s: expected %s of shape %s, got %s", what, name, a, b);
}

lm_status lm_pool_check_grad(const lm_tensor *grad_out, const lm_tensor *x,
                             const lm_pool_shape *g, const char *what) {
   int64_t osz[5];
   lm_pool_out_sizes(g, osz);
   LM_TRY(lm_pool_same_dtype(grad_out, x, what));
   return lm_pool_expect_shape(grad_out, g->ndim, osz, "grad_output", what);
}

lm_status lm_pool_same_rank(const lm_tensor *grad_out, const lm_tensor *x, const char *what) {
   if (grad_out->ndim == x->ndim) return LM_OK;
   char a[160], b[160];
   lm_format_shape(a, sizeof a, grad_out->ndim, grad_out->sizes);
   lm_format_shape(b, sizeof b, x->ndim, x->sizes);
   return lm_error(LM_ERR_SHAPE, "%s: grad_output %s does not match the input %s", what, a, b);
}

lm_status lm_pool_index_dtype(const lm_tensor *ind, int codes, const char *what) {
   if (ind->dtype != (codes ? LM_UINT8 : LM_INT64))
      return lm_error(LM_ERR_DTYPE, "%s: expected %s of dtype %s, got %s", what,
                      codes ? "taps" : "indices", codes ? "uint8" : "int64",
                      lm_dtype_name(ind->dtype));
   return LM_OK;
}

lm_status lm_pool_forward(const lm_tensor *x, const lm_pool_shape *g, int kind, const void *params,
                          int nt, int native, lm_tensor **out, lm_tensor **indices,
                          lm_tensor **codes) {
   int64_t osz[5];
   lm_pool_out_sizes(g, osz);
   out_slot so = {0}, si = {0};
   const lm_tensor *xd = NULL;
   lm_tensor *tmp = NULL, *ct = NULL, *o32 = NULL, *otmp = NULL;
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   lm_status st = out_open(&so, out, g->ndim, osz, x->dtype, g->mf, x->device, "output");
   if (st == LM_OK && indices)
      st = out_open(&si, indices, g->ndim, osz, LM_INT64, g->mf, x->device, "indices");
   if (st == LM_OK && codes) st = lm_empty(g->ndim, osz, LM_UINT8, g->mf, x->device, &ct);
   /* halves: the float32 kernel on a widened copy, the results rounded once (a maximum, one of
      the inputs, exactly); native: the kernel reads and writes x's dtype */
   if (st == LM_OK) {
      if (native) {
         st = dense_in_format(x, g->mf, &xd, &tmp);
         o32 = so.t;
      } else {
         st = dense_float_in_format(x, g->mf, &xd, &tmp);
         if (st == LM_OK && so.t->numel > 0) st = half_open(so.t, g->mf, &o32, &otmp);
      }
   }
   if (st == LM_OK && so.t->numel > 0) {
      lm_tensor *ts[3] = {(lm_tensor *)xd, o32, codes ? ct : si.t};
      const lm_op op = lm_op_make(kind, nt, ts, params);
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

lm_status lm_pool_backward(const lm_tensor *grad_out, const lm_tensor *x, const lm_tensor *ind,
                           const lm_pool_shape *g, int kind, void *params, int native, int *fresh,
                           lm_tensor **grad_x) {
   if (!grad_x) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   out_slot sg = {0};
   const lm_tensor *god = NULL, *indd = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *g32 = NULL, *gtmp = NULL;
   lm_status st = out_open(&sg, grad_x, x->ndim, x->sizes, x->dtype, g->mf, x->device,
                           "grad_input");
   if (native) {
      if (st == LM_OK) st = dense_in_format(grad_out, g->mf, &god, &t1);
      g32 = sg.t;
   } else {
      if (st == LM_OK) st = dense_float_in_format(grad_out, g->mf, &god, &t1);
      if (st == LM_OK && sg.t->numel > 0) st = half_open(sg.t, g->mf, &g32, &gtmp);
   }
   if (st == LM_OK && ind) st = dense_in_format(ind, g->mf, &indd, &t2);
   if (st == LM_OK && sg.t->numel > 0) {
      if (fresh) *fresh = sg.t != sg.user && !gtmp; /* a temporary is read back at once */
      lm_tensor *ts[3] = {(lm_tensor *)god, ind ? (lm_tensor *)indd : g32, g32};
      const lm_op op = lm_op_make(kind, ind ? 3 : 2, ts, params);
      st = lm_dispatch(&op);
   }
   st = half_close(sg.t, gtmp, st);
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   return out_close(&sg, grad_x, st);
}
