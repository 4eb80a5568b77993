/* conv.c -- 2-D convolution: argument checks, the memory-format decision, layout preparation and
 * dispatch: float32 channels-last on AVX-512 to Winograd (winograd_avx512.c), the pointwise
 * kernels for 1x1 / stride 1 / unpadded convolutions (conv_avx512.c; forward and backward data),
 * the register-blocked kernels for small channel counts (conv_rb_avx512.c) or the direct kernels
 * (conv_avx512.c), in that order of preference, each where its `usable` test takes the geometry
 * (LUMEN_CONV_WINOGRAD / _PW / _RB = 0 switch them off); everything else to the portable kernels
 * in conv_tmpl.c (instantiated below for float32 and float64).
 *
 * The public functions are declared in src/conv.h. PyTorch semantics throughout; see that
 * header for the contract and the choice of algorithm.
 */
#include "conv_internal.h"
#include "cpu.h"
#include "conv.h"
#include <stdio.h>

/* ---------------------------------------------------------------------------------------------
 * tiling helpers shared by both instantiations (conv_geom and the small helpers are in
 * conv_internal.h)
 */
enum { CONV_PANEL_BYTES = 384 * 1024 };

/* NHWC: rows (output pixels) per tile so that a panel of rows of `row_bytes` stays in L2, with
   enough tiles for every thread */
static int64_t conv_tile_rows(int64_t total, int64_t row_bytes, int nthr) {
   int64_t t = row_bytes > 0 ? CONV_PANEL_BYTES / row_bytes : 1024;
   if (t > 1024) t = 1024;
   if (t < 16) t = 16;
   t = t / 16 * 16;
   const int64_t want = 4 * (int64_t)nthr; /* tiles wanted for load balance */
   if (nthr > 1 && (total + t - 1) / t < want) {
      int64_t t2 = (total + want - 1) / want;
      t2 = (t2 + 15) / 16 * 16;
      if (t2 < 32) t2 = 32;
      if (t2 < t) t = t2;
   }
   if (t > total) t = total > 0 ? total : 1;
   return t;
}

/* NCHW: pixels per tile (within one image of HoWo pixels) so that a K x T column buffer of
   `col_bytes` per pixel stays in L2 */
static int64_t conv_tile_cols(int64_t N, int64_t HoWo, int64_t col_bytes, int nthr) {
   int64_t t = col_bytes > 0 ? (2 * CONV_PANEL_BYTES) / col_bytes : HoWo;
   if (t < 64) t = 64;
   t = t / 16 * 16;
   if (t >= HoWo) t = HoWo;
   const int64_t want = 2 * (int64_t)nthr;
   if (nthr > 1 && N * ((HoWo + t - 1) / t) < want) {
      const int64_t per_img = (want + N - 1) / N;
      int64_t t2 = (HoWo + per_img - 1) / per_img;
      t2 = (t2 + 15) / 16 * 16;
      if (t2 < 32) t2 = 32;
      if (t2 < t) t = t2;
   }
   if (t < 1) t = 1;
   return t;
}

/* col2im work units: bands of B output rows; bands b and b+2 never write the same input row */
static void conv_bands(int64_t N, int64_t Ho, int64_t kh, int64_t sh, int64_t dh, int nthr,
                       int64_t *band, int64_t *nbands) {
   const int64_t min_b = (dh * (kh - 1)) / sh + 1;
   int64_t nb = (2 * (int64_t)nthr + N - 1) / (N > 0 ? N : 1);
   if (nb < 1) nb = 1;
   int64_t b = (Ho + nb - 1) / nb;
   if (b < min_b) b = min_b;
   if (b < 1) b = 1;
   *band = b;
   *nbands = (Ho + b - 1) / b;
   if (*nbands < 1) *nbands = 1;
}

/* ---------------------------------------------------------------------------------------------
 * the kernels, once per element type
 */
#define LM_CONV_TMPL 1
#define CT float
#define CS(name) name##_f32
#define CGEMM lm_sgemm
#include "conv_tmpl.c"
#undef CT
#undef CS
#undef CGEMM
#define CT double
#define CS(name) name##_f64
#define CGEMM lm_dgemm
#include "conv_tmpl.c"
#undef CT
#undef CS
#undef CGEMM
#undef LM_CONV_TMPL

/* the AVX-512 kernels take float32 NHWC convolutions (direct kernels, or the depthwise ones) */
static int use_avx512(const conv_geom *g) {
   return g->K > 0 && g->Og > 0 && g->kw <= 30 && lm_conv_avx512_usable();
}

/* ---------------------------------------------------------------------------------------------
 * argument checking
 */
static void fmt_sizes(char *buf, size_t n, const lm_tensor *t) {
   size_t k = 0;
   k += (size_t)snprintf(buf + k, n - k, "[");
   for (int d = 0; d < t->ndim && k < n; d++)
      k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->sizes[d]);
   if (k < n) snprintf(buf + k, n - k, "]");
}

static lm_status conv_check(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                            const int64_t *stride, const int64_t *padding,
                            const int64_t *dilation, int64_t groups, conv_geom *g) {
   char s1[160], s2[160];
   LM_CHECK_TENSOR(x, "input");
   LM_CHECK_TENSOR(w, "weight");
   LM_TRY(lm_check_cpu(x, "input"));
   LM_TRY(lm_check_cpu(w, "weight"));
   if (bias) LM_TRY(lm_check_cpu(bias, "bias"));
   if (x->dtype != LM_FLOAT32 && x->dtype != LM_FLOAT64)
      return lm_error(LM_ERR_DTYPE, "conv2d supports float32 and float64 tensors, got %s input",
                      lm_dtype_name(x->dtype));
   if (w->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and weight type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(w->dtype));
   if (bias && bias->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and bias type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(bias->dtype));
   if (w->ndim != 4) {
      fmt_sizes(s1, sizeof s1, w);
      return lm_error(LM_ERR_SHAPE,
                      "expected a 4-D weight (out_channels, in_channels/groups, kH, kW), got "
                      "%d-D weight of size %s", w->ndim, s1);
   }
   if (x->ndim != 4) {
      fmt_sizes(s1, sizeof s1, w);
      fmt_sizes(s2, sizeof s2, x);
      return lm_error(LM_ERR_SHAPE,
                      "expected 4-D input (N, C, H, W) for 4-D weight %s, but got %d-D input of "
                      "size %s", s1, x->ndim, s2);
   }
   if (groups <= 0) return lm_error(LM_ERR_ARG, "non-positive groups is not supported");
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
   if (O % groups != 0) {
      fmt_sizes(s1, sizeof s1, w);
      return lm_error(LM_ERR_SHAPE,
                      "Given groups=%lld, expected weight to be divisible by %lld at dimension 0, "
                      "but got weight of size %s instead",
                      (long long)groups, (long long)groups, s1);
   }
   if (C != w->sizes[1] * groups) {
      fmt_sizes(s1, sizeof s1, w);
      fmt_sizes(s2, sizeof s2, x);
      return lm_error(LM_ERR_SHAPE,
                      "Given groups=%lld, weight of size %s, expected input%s to have %lld "
                      "channels, but got %lld channels instead",
                      (long long)groups, s1, s2, (long long)(w->sizes[1] * groups), (long long)C);
   }
   if (w->sizes[2] <= 0 || w->sizes[3] <= 0) {
      fmt_sizes(s1, sizeof s1, w);
      return lm_error(LM_ERR_SHAPE, "weight of size %s has an empty kernel", s1);
   }
   if (bias && (bias->ndim != 1 || bias->sizes[0] != O)) {
      fmt_sizes(s1, sizeof s1, w);
      fmt_sizes(s2, sizeof s2, bias);
      return lm_error(LM_ERR_SHAPE,
                      "Given weight of size %s, expected bias to be 1-dimensional with %lld "
                      "elements, but got bias of size %s instead",
                      s1, (long long)O, s2);
   }
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

/* *view = t when t is dense in fmt, else a copy in fmt (*owned, freed by the caller) */
static lm_status dense_in(const lm_tensor *t, int fmt, const lm_tensor **view, lm_tensor **owned) {
   *owned = NULL;
   if (lm_is_contiguous(t, fmt)) {
      *view = t;
      return LM_OK;
   }
   LM_TRY(lm_clone(t, fmt, -1, owned));
   *view = *owned;
   return LM_OK;
}

/* the bias as a dense array of the compute type (bias may have any stride) */
static void *bias_dense(const lm_tensor *b, int dtype, size_t *bytes) {
   const int64_t n = b->sizes[0];
   const int es = lm_dtype_size(dtype);
   *bytes = (size_t)(n > 0 ? n : 1) * (size_t)es;
   char *buf = lm_alloc(*bytes);
   if (!buf) return NULL;
   const char *src = lm_tensor_data(b);
   for (int64_t i = 0; i < n; i++)
      memcpy(buf + i * es, src + i * b->strides[0] * es, (size_t)es);
   return buf;
}

typedef struct {
   lm_tensor *t;        /* where the kernel writes (dense in fmt, compute dtype) */
   lm_tensor *user;     /* the out= tensor, or NULL */
   int copy_back;       /* t is a temporary to be copied into user */
} conv_result;

/* prepare a result of the given shape: a new tensor, or the caller's out= tensor when the kernel
   can write it directly, or a temporary copied into it afterwards */
static lm_status result_prepare(lm_tensor **slot, int ndim, const int64_t *sizes, int dtype,
                                int fmt, const lm_tensor *const *ins, int nins, const char *what,
                                conv_result *r) {
   r->t = NULL;
   r->user = NULL;
   r->copy_back = 0;
   if (*slot) {
      lm_tensor *o = *slot;
      LM_TRY(lm_check_cpu(o, what));
      int same = o->ndim == ndim;
      for (int d = 0; same && d < ndim; d++) same = o->sizes[d] == sizes[d];
      if (!same) {
         char s1[160];
         fmt_sizes(s1, sizeof s1, o);
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
   return lm_empty(ndim, sizes, dtype, fmt, LM_CPU, &r->t);
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
                    int64_t groups, int fmt, int relu, const lm_tensor *residual,
                    lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   conv_geom g;
   LM_TRY(conv_check(x, w, bias, stride, padding, dilation, groups, &g));
   LM_TRY(resolve_fmt(x, w, fmt, &fmt));
   const int64_t osz[4] = {g.N, g.O, g.Ho, g.Wo};
   if (residual) {
      LM_TRY(lm_check_cpu(residual, "residual"));
      if (residual->dtype != x->dtype)
         return lm_error(LM_ERR_DTYPE, "input type (%s) and residual type (%s) should be the same",
                         lm_dtype_name(x->dtype), lm_dtype_name(residual->dtype));
      int same = residual->ndim == 4;
      for (int d = 0; same && d < 4; d++) same = residual->sizes[d] == osz[d];
      if (!same) {
         char s1[160];
         fmt_sizes(s1, sizeof s1, residual);
         return lm_error(LM_ERR_SHAPE,
                         "residual of size %s does not match the output size [%lld, %lld, %lld, "
                         "%lld]", s1, (long long)osz[0], (long long)osz[1], (long long)osz[2],
                         (long long)osz[3]);
      }
   }
   const int nhwc = fmt == LM_CHANNELS_LAST;
   const lm_tensor *xd = NULL, *wd = NULL, *rd = NULL;
   lm_tensor *xo = NULL, *wo = NULL, *ro = NULL;
   void *bbuf = NULL;
   size_t bbytes = 0;
   conv_result res = {NULL, NULL, 0};
   const lm_tensor *ins[4] = {x, w, bias, residual};
   lm_status st = result_prepare(out, 4, osz, x->dtype, fmt, ins, 4, "out", &res);
   if (st != LM_OK) return st;
   if (res.t->numel == 0) return result_finish(out, &res, LM_OK);
   st = dense_in(x, fmt, &xd, &xo);
   if (st == LM_OK) st = dense_in(w, fmt, &wd, &wo);
   if (st == LM_OK && residual) st = dense_in(residual, fmt, &rd, &ro);
   if (st == LM_OK && bias) {
      bbuf = bias_dense(bias, x->dtype, &bbytes);
      if (!bbuf) st = LM_ERR_OOM;
   }
   if (st == LM_OK) {
      const void *rp = rd ? lm_tensor_data(rd) : NULL;
      void *op = lm_tensor_data(res.t);
      if (x->dtype == LM_FLOAT32 && nhwc && use_avx512(&g) && conv_is_depthwise(&g))
         st = lm_conv_dw_fwd_nhwc_avx512(&g, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp,
                                         relu, op);
      else if (x->dtype == LM_FLOAT32 && nhwc && use_avx512(&g) && lm_conv_wino_usable(&g, 0))
         st = lm_conv_wino_fwd_nhwc_avx512(&g, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp,
                                           relu, op);
      else if (x->dtype == LM_FLOAT32 && nhwc && use_avx512(&g) && lm_conv_pw_usable(&g, 0) &&
               conv_env_on("LUMEN_CONV_PW")) {
         int stream = lm_tensor_block_cold(res.t);
         st = lm_conv_pw_fwd_nhwc_avx512(&g, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp,
                                         relu, op, &stream);
         if (st == LM_OK && stream) lm_tensor_note_streamed(res.t);
      } else if (x->dtype == LM_FLOAT32 && nhwc && use_avx512(&g) && lm_conv_rb_usable(&g, 0) &&
               conv_env_on("LUMEN_CONV_RB"))
         st = lm_conv_rb_fwd_nhwc_avx512(&g, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp,
                                         relu, op);
      else if (x->dtype == LM_FLOAT32 && nhwc && use_avx512(&g))
         st = lm_conv_fwd_nhwc_avx512(&g, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp, relu,
                                      op);
      else if (x->dtype == LM_FLOAT32)
         st = conv_forward_f32(&g, nhwc, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp, relu,
                               op);
      else
         st = conv_forward_f64(&g, nhwc, lm_tensor_data(xd), lm_tensor_data(wd), bbuf, rp, relu,
                               op);
   }
   if (bbuf) lm_free(bbuf, bbytes);
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
   conv_geom g;
   LM_TRY(conv_check(x, w, NULL, stride, padding, dilation, groups, &g));
   LM_CHECK_TENSOR(grad_out, "grad_output");
   LM_TRY(lm_check_cpu(grad_out, "grad_output"));
   LM_TRY(resolve_fmt(x, w, fmt, &fmt));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and grad_output type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(grad_out->dtype));
   const int64_t osz[4] = {g.N, g.O, g.Ho, g.Wo};
   int same = grad_out->ndim == 4;
   for (int d = 0; same && d < 4; d++) same = grad_out->sizes[d] == osz[d];
   if (!same) {
      char s1[160];
      fmt_sizes(s1, sizeof s1, grad_out);
      return lm_error(LM_ERR_SHAPE,
                      "grad_output of size %s does not match the output size [%lld, %lld, %lld, "
                      "%lld]", s1, (long long)osz[0], (long long)osz[1], (long long)osz[2],
                      (long long)osz[3]);
   }
   const int nhwc = fmt == LM_CHANNELS_LAST;
   const int dt = x->dtype;
   const lm_tensor *ins[3] = {x, w, grad_out};
   conv_result rx = {NULL, NULL, 0}, rw = {NULL, NULL, 0}, rb = {NULL, NULL, 0};
   const lm_tensor *xd = NULL, *wd = NULL, *gd = NULL;
   lm_tensor *xo = NULL, *wo = NULL, *go = NULL;
   lm_status st = LM_OK;
   if (grad_x) st = result_prepare(grad_x, 4, x->sizes, dt, fmt, ins, 3, "grad_input", &rx);
   if (st == LM_OK && grad_w)
      st = result_prepare(grad_w, 4, w->sizes, dt, fmt, ins, 3, "grad_weight", &rw);
   if (st == LM_OK && grad_b) {
      const int64_t bsz[1] = {g.O};
      st = result_prepare(grad_b, 1, bsz, dt, LM_CONTIGUOUS, ins, 3, "grad_bias", &rb);
   }
   const int need_x = rw.t && rw.t->numel > 0;
   const int need_w = rx.t && rx.t->numel > 0;
   if (st == LM_OK && (rx.t || rw.t || rb.t)) {
      st = dense_in(grad_out, fmt, &gd, &go);
      if (st == LM_OK && need_x) st = dense_in(x, fmt, &xd, &xo);
      if (st == LM_OK && need_w) st = dense_in(w, fmt, &wd, &wo);
   }
   if (st == LM_OK && (rx.t || rw.t || rb.t)) {
      void *gxp = rx.t && rx.t->numel > 0 ? lm_tensor_data(rx.t) : NULL;
      void *gwp = need_x ? lm_tensor_data(rw.t) : NULL;
      void *gbp = rb.t && rb.t->numel > 0 ? lm_tensor_data(rb.t) : NULL;
      const void *xp = xd ? lm_tensor_data(xd) : NULL, *wp = wd ? lm_tensor_data(wd) : NULL;
      if (gxp || gwp || gbp) {
         if (dt == LM_FLOAT32 && nhwc && use_avx512(&g) && conv_is_depthwise(&g)) {
            if (gxp) st = lm_conv_dw_bwdd_nhwc_avx512(&g, lm_tensor_data(gd), wp, gxp);
            if (st == LM_OK && (gwp || gbp))
               st = lm_conv_dw_bwdw_nhwc_avx512(&g, xp, lm_tensor_data(gd), gwp, gbp);
         } else if (dt == LM_FLOAT32 && nhwc && use_avx512(&g)) {
            if (gxp && lm_conv_wino_usable(&g, 1))
               st = lm_conv_wino_bwdd_nhwc_avx512(&g, lm_tensor_data(gd), wp, gxp);
            else if (gxp && lm_conv_pw_usable(&g, 1) && conv_env_on("LUMEN_CONV_PW")) {
               int stream = lm_tensor_block_cold(rx.t);
               st = lm_conv_pw_bwdd_nhwc_avx512(&g, lm_tensor_data(gd), wp, gxp, &stream);
               if (st == LM_OK && stream) lm_tensor_note_streamed(rx.t);
            } else if (gxp && lm_conv_rb_usable(&g, 1) && conv_env_on("LUMEN_CONV_RB"))
               st = lm_conv_rb_bwdd_nhwc_avx512(&g, lm_tensor_data(gd), wp, gxp);
            else if (gxp)
               st = lm_conv_bwdd_nhwc_avx512(&g, lm_tensor_data(gd), wp, gxp);
            /* the algorithm depends on the geometry only, so grad_b alone gets the same sums
               as grad_b with grad_w */
            if (st == LM_OK && (gwp || gbp) && lm_conv_wino_bwdw_usable(&g))
               st = lm_conv_wino_bwdw_nhwc_avx512(&g, xp, lm_tensor_data(gd), gwp, gbp);
            else if (st == LM_OK && (gwp || gbp) && lm_conv_rb_bwdw_usable(&g) &&
                     conv_env_on("LUMEN_CONV_RB"))
               st = lm_conv_rb_bwdw_nhwc_avx512(&g, xp, lm_tensor_data(gd), gwp, gbp);
            else if (st == LM_OK && (gwp || gbp))
               st = lm_conv_bwdw_nhwc_avx512(&g, xp, lm_tensor_data(gd), gwp, gbp);
         } else if (dt == LM_FLOAT32)
            st = conv_backward_f32(&g, nhwc, xp, wp, lm_tensor_data(gd), gxp, gwp, gbp);
         else
            st = conv_backward_f64(&g, nhwc, xp, wp, lm_tensor_data(gd), gxp, gwp, gbp);
      }
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

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_conv(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
