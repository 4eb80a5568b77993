/* conv.c -- the CPU kernels of LM_OP_CONV2D and LM_OP_CONV2D_BACKWARD (front end, with the
 * argument checks, the memory-format decision and layout preparation: src/ops/conv.c; t[] order
 * and parameters: src/ops/conv.h). The choice of algorithm: float32 channels-last on AVX-512 to
 * Winograd (winograd_avx512.c), the pointwise kernels for 1x1 / stride 1 / unpadded convolutions
 * (conv_avx512.c; forward and backward data), the register-blocked kernels for small channel
 * counts (conv_rb_avx512.c) or the direct kernels (conv_avx512.c), in that order of preference,
 * each where its `usable` test takes the geometry (LUMEN_CONV_WINOGRAD / _PW / _RB = 0 switch them
 * off); everything else to the portable kernels in conv_tmpl.c (instantiated below for float32
 * and float64). The AVX-512 choice is registered only when lm_cpu_isa() is AVX-512.
 *
 * PyTorch semantics throughout; see src/conv.h for the contract and the choice of algorithm.
 */
#include "conv_internal.h"
#include "cpu.h"
#include "gemm_internal.h"
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

/* the AVX-512 kernels take float32 NHWC convolutions (direct kernels, or the depthwise ones);
   avx512: the kernel registered for lm_cpu_isa() == AVX-512 */
static inline int use_avx512(const conv_geom *g, int avx512) {
   return g->K > 0 && g->Og > 0 && g->kw <= 30 && avx512;
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

/* ---------------------------------------------------------------------------------------------
 * the kernels (src/ops/conv.h gives the t[] order)
 */

/* LM_OP_CONV2D: t = {x, w, bias, residual, out} */
static inline lm_status conv_forward(const lm_op *op, int avx512) {
   const lm_conv2d_params *p = op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *xd = op->t[0], *wd = op->t[1], *bias = op->t[2], *rd = op->t[3];
   lm_tensor *res = op->t[4];
   const int nhwc = p->channels_last, relu = p->relu, dt = xd->dtype;
   void *bbuf = NULL;
   size_t bbytes = 0;
   lm_status st = LM_OK;
   if (bias) {
      bbuf = bias_dense(bias, dt, &bbytes);
      if (!bbuf) return LM_ERR_OOM;
   }
   const void *rp = rd ? lm_tensor_data(rd) : NULL;
   void *op_ = lm_tensor_data(res);
   const void *xp = lm_tensor_data(xd), *wp = lm_tensor_data(wd);
   if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512) && conv_is_depthwise(g))
      st = lm_conv_dw_fwd_nhwc_avx512(g, xp, wp, bbuf, rp, relu, op_);
   else if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512) && lm_conv_wino_usable(g, 0))
      st = lm_conv_wino_fwd_nhwc_avx512(g, xp, wp, bbuf, rp, relu, op_);
   else if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512) && lm_conv_pw_usable(g, 0) &&
            conv_env_on("LUMEN_CONV_PW")) {
      int stream = lm_tensor_block_cold(res);
      st = lm_conv_pw_fwd_nhwc_avx512(g, xp, wp, bbuf, rp, relu, op_, &stream);
      if (st == LM_OK && stream) lm_tensor_note_streamed(res);
   } else if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512) && lm_conv_rb_usable(g, 0) &&
              conv_env_on("LUMEN_CONV_RB"))
      st = lm_conv_rb_fwd_nhwc_avx512(g, xp, wp, bbuf, rp, relu, op_);
   else if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512))
      st = lm_conv_fwd_nhwc_avx512(g, xp, wp, bbuf, rp, relu, op_);
   else if (dt == LM_FLOAT32)
      st = conv_forward_f32(g, nhwc, xp, wp, bbuf, rp, relu, op_);
   else
      st = conv_forward_f64(g, nhwc, xp, wp, bbuf, rp, relu, op_);
   if (bbuf) lm_free(bbuf, bbytes);
   return st;
}

/* LM_OP_CONV2D_BACKWARD: t = {x, w, grad_out, grad_x, grad_w, grad_b} */
static inline lm_status conv_backward(const lm_op *op, int avx512) {
   const lm_conv2d_params *p = op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *xd = op->t[0], *wd = op->t[1], *gd = op->t[2];
   lm_tensor *rx = op->t[3], *rw = op->t[4], *rb = op->t[5];
   const int nhwc = p->channels_last, dt = gd->dtype;
   lm_status st = LM_OK;
   void *gxp = rx ? lm_tensor_data(rx) : NULL;
   void *gwp = rw ? lm_tensor_data(rw) : NULL;
   void *gbp = rb ? lm_tensor_data(rb) : NULL;
   const void *xp = xd ? lm_tensor_data(xd) : NULL, *wp = wd ? lm_tensor_data(wd) : NULL;
   const void *gop = lm_tensor_data(gd);
   if (!gxp && !gwp && !gbp) return LM_OK;
   if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512) && conv_is_depthwise(g)) {
      if (gxp) st = lm_conv_dw_bwdd_nhwc_avx512(g, gop, wp, gxp);
      if (st == LM_OK && (gwp || gbp)) st = lm_conv_dw_bwdw_nhwc_avx512(g, xp, gop, gwp, gbp);
   } else if (dt == LM_FLOAT32 && nhwc && use_avx512(g, avx512)) {
      if (gxp && lm_conv_wino_usable(g, 1))
         st = lm_conv_wino_bwdd_nhwc_avx512(g, gop, wp, gxp);
      else if (gxp && lm_conv_pw_usable(g, 1) && conv_env_on("LUMEN_CONV_PW")) {
         int stream = lm_tensor_block_cold(rx);
         st = lm_conv_pw_bwdd_nhwc_avx512(g, gop, wp, gxp, &stream);
         if (st == LM_OK && stream) lm_tensor_note_streamed(rx);
      } else if (gxp && lm_conv_rb_usable(g, 1) && conv_env_on("LUMEN_CONV_RB"))
         st = lm_conv_rb_bwdd_nhwc_avx512(g, gop, wp, gxp);
      else if (gxp)
         st = lm_conv_bwdd_nhwc_avx512(g, gop, wp, gxp);
      /* the algorithm depends on the geometry only, so grad_b alone gets the same sums as grad_b
         with grad_w */
      if (st == LM_OK && (gwp || gbp) && lm_conv_wino_bwdw_usable(g))
         st = lm_conv_wino_bwdw_nhwc_avx512(g, xp, gop, gwp, gbp);
      else if (st == LM_OK && (gwp || gbp) && lm_conv_rb_bwdw_usable(g) &&
               conv_env_on("LUMEN_CONV_RB"))
         st = lm_conv_rb_bwdw_nhwc_avx512(g, xp, gop, gwp, gbp);
      else if (st == LM_OK && (gwp || gbp))
         st = lm_conv_bwdw_nhwc_avx512(g, xp, gop, gwp, gbp);
   } else if (dt == LM_FLOAT32)
      st = conv_backward_f32(g, nhwc, xp, wp, gop, gxp, gwp, gbp);
   else
      st = conv_backward_f64(g, nhwc, xp, wp, gop, gxp, gwp, gbp);
   return st;
}

static lm_status k_conv2d(const lm_op *op) { return conv_forward(op, 0); }
static lm_status k_conv2d_backward(const lm_op *op) { return conv_backward(op, 0); }
static lm_status k_conv2d_avx512(const lm_op *op) { return conv_forward(op, 1); }
static lm_status k_conv2d_backward_avx512(const lm_op *op) { return conv_backward(op, 1); }

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_conv(lm_kernel_fn *table, int isa) {
   /* AVX-512 only when it is the ISA in use, so lm_gemm_set_isa(1 or 2) also exercises the
      portable path */
   const int avx512 = isa >= LM_ISA_AVX512;
   table[LM_OP_CONV2D] = avx512 ? k_conv2d_avx512 : k_conv2d;
   table[LM_OP_CONV2D_BACKWARD] = avx512 ? k_conv2d_backward_avx512 : k_conv2d_backward;
}
