/* conv.c -- the CPU kernels of LM_OP_CONV2D and LM_OP_CONV2D_BACKWARD (front end, with the
 * argument checks, the memory-format decision and layout preparation: src/ops/conv.c; t[] order
 * and parameters: src/ops/conv.h). The choice of algorithm: float32 channels-last on AVX-512 to
 * Winograd (conv_winograd_f32_avx512.c), the pointwise kernels for 1x1 / stride 1 / unpadded
 * convolutions (conv_pointwise_f32_avx512.c; forward and backward data), the register-blocked
 * kernels for small channel counts (conv_direct_rb_f32_avx512.c) or the direct kernels
 * (conv_direct_f32_avx512.c), in that order of preference, each where its `usable` test takes
 * the geometry (LUMEN_CONV_WINOGRAD / _PW / _RB = 0 switch them off); everything else to the
 * portable kernels in conv_tmpl.c (instantiated below for float32 and float64). The AVX-512
 * choice is registered only when lm_cpu_isa() is AVX-512.
 *
 * PyTorch semantics throughout; see src/conv.h for the contract and the choice of algorithm.
 */
#include "conv_internal.h"
#include "conv_bf16.h"
#include "act.h"
#include "cpu.h"
#include "gemm_internal.h"
#include "amx.h"
#include "impl.h"
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
#if defined(__x86_64__)
#define CONV_EPI_NHWC_AVX2 lm_conv_epi_nhwc_f32_avx2
#endif
#include "conv_tmpl.c"
#undef CONV_EPI_NHWC_AVX2
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
   avx512: the kernel registered for lm_cpu_isa() >= AVX-512 */
static inline int use_avx512(const conv_geom *g, int avx512) {
   return g->K > 0 && g->Og > 0 && g->kw <= 30 && avx512;
}

/* the bias as a dense array of the compute type (bias may have any stride); float16 / bfloat16
   biases are widened to float32 */
static void *bias_dense(const lm_tensor *b, int dtype, size_t *bytes) {
   const int64_t n = b->sizes[0];
   const int half = dtype == LM_FLOAT16 || dtype == LM_BFLOAT16;
   const int es = half ? 4 : lm_dtype_size(dtype);
   *bytes = (size_t)(n > 0 ? n : 1) * (size_t)es;
   char *buf = lm_alloc(*bytes);
   if (!buf) return NULL;
   const char *src = lm_tensor_data(b);
   if (half) {
      const uint16_t *h = (const uint16_t *)src;
      float *f = (float *)buf;
      for (int64_t i = 0; i < n; i++) {
         const uint16_t v = h[i * b->strides[0]];
         f[i] = dtype == LM_BFLOAT16 ? lm_bf2f(v) : lm_h2f(v);
      }
      return buf;
   }
   for (int64_t i = 0; i < n; i++)
      memcpy(buf + i * es, src + i * b->strides[0] * es, (size_t)es);
   return buf;
}

/* ---------------------------------------------------------------------------------------------
 * the float32 / float64 implementation lists on raw pointers (shared by the float32 route of
 * float16 / bfloat16), in order of preference (src/impl.h: names, LUMEN_VERBOSE, disable).
 * stream: NULL, or in: the output is a cold allocator block; out: it was written with streaming
 * stores (the pointwise and narrow kernels set it; the others leave it or clear it as before).
 */
typedef struct {
   const conv_geom *g;
   int nhwc, avx512, dt;
   const void *x, *w, *bias, *res;
   int act;
   void *out;
   int *stream;
   uint16_t *out16; /* the float32 route of a bfloat16 call: its output, for a kernel that
                       writes bfloat16 itself (the pointwise one); NULL otherwise */
   int *narrowed;   /* set when that kernel wrote out16 (then out was not written) */
   /* the float32 route of a bfloat16 call: its input and residual, x / res NULL until a kernel
      that reads float32 widens them (fwd_f32_input) into *xw / *rw (the caller frees them); the
      pointwise kernel reads the bfloat16 values itself, a block at a time. NULL otherwise. */
   const uint16_t *x16, *res16;
   float **xw, **rw;
} fwd_ctx;

static float *half_widened_ptr(int dt, const uint16_t *src, int64_t n);

/* the float32 input and residual of a kernel that reads float32: on the float32 route of a
   bfloat16 call, widened on first use */
static lm_status fwd_f32_input(fwd_ctx *c) {
   const conv_geom *g = c->g;
   if (c->x16 && !c->x) {
      if (!(*c->xw = half_widened_ptr(LM_BFLOAT16, c->x16, g->N * g->C * g->H * g->W)))
         return LM_ERR_OOM;
      c->x = *c->xw;
   }
   if (c->res16 && !c->res) {
      if (!(*c->rw = half_widened_ptr(LM_BFLOAT16, c->res16, g->N * g->O * g->Ho * g->Wo)))
         return LM_ERR_OOM;
      c->res = *c->rw;
   }
   return LM_OK;
}
#define FWD_F32_INPUT(c)                                                                         \
   do {                                                                                          \
      const lm_status st_ = fwd_f32_input(c);                                                    \
      if (st_ != LM_OK) return st_;                                                              \
   } while (0)

/* the AVX-512 kernels' common condition (float32 NHWC at AVX-512, a geometry they take) */
static const char *f32_nhwc_avx512(const fwd_ctx *c) {
   if (c->dt != LM_FLOAT32) return "not float32";
   if (!c->nhwc) return "not channels-last";
   if (!use_avx512(c->g, c->avx512)) return c->avx512 ? "kernel wider than 30" : "ISA below AVX-512";
   return NULL;
}

static const char *fu_depthwise(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : conv_is_depthwise(c->g) ? NULL : "not depthwise";
}
static lm_status fr_depthwise(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   return lm_conv_dw_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static const char *fu_winograd(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : lm_conv_wino_usable(c->g, 0) ? NULL : "not a 3x3 stride-1 geometry it takes";
}
static lm_status fr_winograd(void *p) {
   fwd_ctx *c = p;
   if (c->x16 && !c->x && c->out16 && !(c->res && !c->res16)) {
      /* the float32 route of a bfloat16 call: the kernel gathers bfloat16 patches and rounds
         its output itself */
      if (c->narrowed) *c->narrowed = 1;
      return lm_conv_wino_fwd_nhwc_avx512_io16(c->g, c->x16, c->w, c->bias,
                                               c->res ? NULL : c->res16, c->act, c->out16);
   }
   FWD_F32_INPUT(c);
   return lm_conv_wino_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static const char *fu_pointwise(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : lm_conv_pw_usable(c->g, 0) ? NULL : "not a 1x1 stride-1 unpadded geometry";
}
static lm_status fr_pointwise(void *p) {
   fwd_ctx *c = p;
   int s0 = 0;
   /* a strided layer gathers float32 pixels: widened first */
   if (c->g->sh != 1 || c->g->sw != 1) FWD_F32_INPUT(c);
   if (c->narrowed) *c->narrowed = c->out16 != NULL;
   return lm_conv_pw_fwd_nhwc_avx512(c->g, c->x, c->x ? NULL : c->x16, c->w, c->bias, c->res,
                                     c->res ? NULL : c->res16, c->act, c->out, c->out16,
                                     c->stream ? c->stream : &s0);
}
static const char *fu_narrow(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : lm_conv_nc_usable(c->g) ? NULL : "not 2 to 4 input channels";
}
static lm_status fr_narrow(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   int s0 = 0;
   return lm_conv_nc_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out,
                                     c->stream ? c->stream : &s0);
}
static const char *fu_grouped(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : lm_conv_grp_usable(c->g, 0) ? NULL : "not 4, 8 or 16 channels a group";
}
static lm_status fr_grouped(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   return lm_conv_grp_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
/* the AVX2 kernels' common condition (float32 NHWC, the ISA in use exactly AVX2: at AVX-512 the
   16-lane kernels above run; a forced AVX2 runs these on any CPU that has it) */
static const char *f32_nhwc_avx2(int dt, int nhwc) {
   if (dt != LM_FLOAT32) return "not float32";
   if (!nhwc) return "not channels-last";
   return lm_cpu_isa() != LM_ISA_AVX2 ? "ISA not AVX2" : NULL;
}
static const char *grouped_avx2_why(int dt, int nhwc, const conv_geom *g, int pass) {
   const char *why = f32_nhwc_avx2(dt, nhwc);
   return why ? why : lm_conv_grp_avx2_usable(g, pass) ? NULL : "groups it does not block";
}
static const char *depthwise_avx2_why(int dt, int nhwc, const conv_geom *g, int pass) {
   const char *why = f32_nhwc_avx2(dt, nhwc);
   if (why) return why;
   if (!conv_is_depthwise(g)) return "not depthwise";
   return lm_conv_dw_avx2_usable(g, pass) ? NULL : "a depthwise geometry it does not take";
}
static const char *fu_depthwise_avx2(const void *p) {
   const fwd_ctx *c = p;
   return depthwise_avx2_why(c->dt, c->nhwc, c->g, 0);
}
static lm_status fr_depthwise_avx2(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   return lm_conv_dw_fwd_nhwc_avx2(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static const char *fu_grouped_avx2(const void *p) {
   const fwd_ctx *c = p;
   return grouped_avx2_why(c->dt, c->nhwc, c->g, 0);
}
static lm_status fr_grouped_avx2(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   return lm_conv_grp_fwd_nhwc_avx2(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static const char *fu_direct_rb(const void *p) {
   const fwd_ctx *c = p;
   const char *why = f32_nhwc_avx512(c);
   return why ? why : lm_conv_rb_usable(c->g, 0) ? NULL : "channel counts it does not block";
}
static lm_status fr_direct_rb(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   return lm_conv_rb_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static const char *fu_direct(const void *p) { return f32_nhwc_avx512(p); }
static lm_status fr_direct(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   return lm_conv_fwd_nhwc_avx512(c->g, c->x, c->w, c->bias, c->res, c->act, c->out);
}
static lm_status fr_im2col(void *p) {
   fwd_ctx *c = p;
   FWD_F32_INPUT(c);
   if (c->stream) *c->stream = 0;
   if (c->dt == LM_FLOAT32)
      return conv_forward_f32(c->g, c->nhwc, c->x, c->w, c->bias, c->res, c->act, c->out);
   return conv_forward_f64(c->g, c->nhwc, c->x, c->w, c->bias, c->res, c->act, c->out);
}

static const lm_impl fwd_f32_list[] = {
   {LM_IMPL_CONV_DEPTHWISE, fu_depthwise, fr_depthwise},
   {LM_IMPL_CONV_DEPTHWISE_AVX2, fu_depthwise_avx2, fr_depthwise_avx2},
   {LM_IMPL_CONV_WINOGRAD, fu_winograd, fr_winograd},
   {LM_IMPL_CONV_POINTWISE, fu_pointwise, fr_pointwise},
   {LM_IMPL_CONV_NARROW, fu_narrow, fr_narrow},
   {LM_IMPL_CONV_GROUPED, fu_grouped, fr_grouped},
   {LM_IMPL_CONV_GROUPED_AVX2, fu_grouped_avx2, fr_grouped_avx2},
   {LM_IMPL_CONV_DIRECT_RB, fu_direct_rb, fr_direct_rb},
   {LM_IMPL_CONV_DIRECT, fu_direct, fr_direct},
   {LM_IMPL_CONV_IM2COL, NULL, fr_im2col},
};

static lm_status fwd_ptrs(const conv_geom *g, int nhwc, int avx512, int dt, const void *xp,
                          const void *wp, const void *bbuf, const void *rp, int act, void *op_,
                          int *stream, uint16_t *out16, int *narrowed) {
   fwd_ctx c = {g,      nhwc,     avx512, dt,   xp,   wp,   bbuf, rp,
                act,    op_,      stream, out16, narrowed, NULL, NULL, NULL, NULL};
   return lm_impl_run(fwd_f32_list, (int)(sizeof fwd_f32_list / sizeof *fwd_f32_list), &c,
                      "conv2d");
}

/* backward: grad_x from one list, grad_w and grad_b from another (the choice depends on the
   geometry only, so grad_b alone gets the same sums as grad_b with grad_w) */
typedef struct {
   const conv_geom *g;
   int nhwc, avx512, dt;
   const void *x, *w, *gout;
   void *gx, *gw, *gb;
   int *stream;
} bwd_ctx;

static const char *bwd_f32_nhwc_avx512(const bwd_ctx *c) {
   if (c->dt != LM_FLOAT32) return "not float32";
   if (!c->nhwc) return "not channels-last";
   if (!use_avx512(c->g, c->avx512)) return c->avx512 ? "kernel wider than 30" : "ISA below AVX-512";
   return NULL;
}
static const char *bu_depthwise(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : conv_is_depthwise(c->g) ? NULL : "not depthwise";
}
static const char *bu_avx512(const void *p) { return bwd_f32_nhwc_avx512(p); }
static void bwd_no_stream(const bwd_ctx *c) {
   if (c->stream) *c->stream = 0;
}
static lm_status br_im2col(void *p) { /* the portable kernels: the gradients asked for here */
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   if (c->dt == LM_FLOAT32)
      return conv_backward_f32(c->g, c->nhwc, c->x, c->w, c->gout, c->gx, c->gw, c->gb);
   return conv_backward_f64(c->g, c->nhwc, c->x, c->w, c->gout, c->gx, c->gw, c->gb);
}

/* grad_x */
static lm_status bdr_depthwise(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_dw_bwdd_nhwc_avx512(c->g, c->gout, c->w, c->gx);
}
static const char *bdu_winograd(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_wino_usable(c->g, 1) ? NULL : "not a 3x3 stride-1 geometry it takes";
}
static lm_status bdr_winograd(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_wino_bwdd_nhwc_avx512(c->g, c->gout, c->w, c->gx);
}
static const char *bdu_pointwise(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_pw_usable(c->g, 1) ? NULL : "not a 1x1 stride-1 unpadded geometry";
}
static lm_status bdr_pointwise(void *p) {
   const bwd_ctx *c = p;
   int s0 = 0;
   return lm_conv_pw_bwdd_nhwc_avx512(c->g, c->gout, NULL, c->w, c->gx, NULL,
                                      c->stream ? c->stream : &s0);
}
static const char *bdu_grouped(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why
              : lm_conv_grp_usable(c->g, 1) ? NULL
                                            : "not 4, 8 or 16 channels a group at stride 1";
}
static lm_status bdr_grouped(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_grp_bwdd_nhwc_avx512(c->g, c->gout, c->w, c->gx);
}
static const char *bdu_depthwise_avx2(const void *p) {
   const bwd_ctx *c = p;
   return depthwise_avx2_why(c->dt, c->nhwc, c->g, 1);
}
static lm_status bdr_depthwise_avx2(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_dw_bwdd_nhwc_avx2(c->g, c->gout, c->w, c->gx);
}
static const char *bwu_depthwise_avx2(const void *p) {
   const bwd_ctx *c = p;
   return depthwise_avx2_why(c->dt, c->nhwc, c->g, 2);
}
static lm_status bwr_depthwise_avx2(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_dw_bwdw_nhwc_avx2(c->g, c->x, c->gout, c->gw, c->gb);
}
static const char *bwu_grouped_avx2(const void *p) {
   const bwd_ctx *c = p;
   const char *why = grouped_avx2_why(c->dt, c->nhwc, c->g, 0);
   return why ? why : lm_conv_grp_avx2_bwdw_usable(c->g) ? NULL : "groups it does not block";
}
static lm_status bwr_grouped_avx2(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_grp_bwdw_nhwc_avx2(c->g, c->x, c->gout, c->gw, c->gb);
}
static const char *bdu_grouped_avx2(const void *p) {
   const bwd_ctx *c = p;
   return grouped_avx2_why(c->dt, c->nhwc, c->g, 1);
}
static lm_status bdr_grouped_avx2(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_grp_bwdd_nhwc_avx2(c->g, c->gout, c->w, c->gx);
}
static const char *bdu_direct_rb(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_rb_usable(c->g, 1) ? NULL : "channel counts it does not block";
}
static lm_status bdr_direct_rb(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_rb_bwdd_nhwc_avx512(c->g, c->gout, c->w, c->gx);
}
static lm_status bdr_direct(void *p) {
   const bwd_ctx *c = p;
   bwd_no_stream(c);
   return lm_conv_bwdd_nhwc_avx512(c->g, c->gout, c->w, c->gx);
}
static const lm_impl bwdd_f32_list[] = {
   {LM_IMPL_CONV_DEPTHWISE, bu_depthwise, bdr_depthwise},
   {LM_IMPL_CONV_DEPTHWISE_AVX2, bdu_depthwise_avx2, bdr_depthwise_avx2},
   {LM_IMPL_CONV_WINOGRAD, bdu_winograd, bdr_winograd},
   {LM_IMPL_CONV_POINTWISE, bdu_pointwise, bdr_pointwise},
   {LM_IMPL_CONV_GROUPED, bdu_grouped, bdr_grouped},
   {LM_IMPL_CONV_GROUPED_AVX2, bdu_grouped_avx2, bdr_grouped_avx2},
   {LM_IMPL_CONV_DIRECT_RB, bdu_direct_rb, bdr_direct_rb},
   {LM_IMPL_CONV_DIRECT, bu_avx512, bdr_direct},
   {LM_IMPL_CONV_IM2COL, NULL, br_im2col},
};

/* grad_w and grad_b */
static lm_status bwr_depthwise(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_dw_bwdw_nhwc_avx512(c->g, c->x, c->gout, c->gw, c->gb);
}
static const char *bwu_winograd(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_wino_bwdw_usable(c->g) ? NULL : "not a 3x3 stride-1 geometry it takes";
}
static lm_status bwr_winograd(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_wino_bwdw_nhwc_avx512(c->g, c->x, c->gout, c->gw, c->gb);
}
static const char *bwu_grouped(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_grp_usable(c->g, 2) ? NULL : "not 4, 8 or 16 channels a group";
}
static lm_status bwr_grouped(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_grp_bwdw_nhwc_avx512(c->g, c->x, c->gout, c->gw, c->gb);
}
static const char *bwu_direct_rb(const void *p) {
   const bwd_ctx *c = p;
   const char *why = bwd_f32_nhwc_avx512(c);
   return why ? why : lm_conv_rb_bwdw_usable(c->g) ? NULL : "channel counts it does not block";
}
static lm_status bwr_direct_rb(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_rb_bwdw_nhwc_avx512(c->g, c->x, c->gout, c->gw, c->gb);
}
static lm_status bwr_direct(void *p) {
   const bwd_ctx *c = p;
   return lm_conv_bwdw_nhwc_avx512(c->g, c->x, c->gout, c->gw, c->gb);
}
static const lm_impl bwdw_f32_list[] = {
   {LM_IMPL_CONV_DEPTHWISE, bu_depthwise, bwr_depthwise},
   {LM_IMPL_CONV_DEPTHWISE_AVX2, bwu_depthwise_avx2, bwr_depthwise_avx2},
   {LM_IMPL_CONV_WINOGRAD, bwu_winograd, bwr_winograd},
   {LM_IMPL_CONV_GROUPED, bwu_grouped, bwr_grouped},
   {LM_IMPL_CONV_GROUPED_AVX2, bwu_grouped_avx2, bwr_grouped_avx2},
   {LM_IMPL_CONV_DIRECT_RB, bwu_direct_rb, bwr_direct_rb},
   {LM_IMPL_CONV_DIRECT, bu_avx512, bwr_direct},
   {LM_IMPL_CONV_IM2COL, NULL, br_im2col},
};
#define N_OF(list) ((int)(sizeof list / sizeof *list))

/* backward data (gxp non-NULL) and/or weight and bias (gwp, gbp) */
static lm_status bwd_ptrs(const conv_geom *g, int nhwc, int avx512, int dt, const void *xp,
                          const void *wp, const void *gop, void *gxp, void *gwp, void *gbp,
                          int *stream) {
   lm_status st = LM_OK;
   if (stream && !gxp) *stream = 0;
   if (gxp) {
      bwd_ctx c = {g, nhwc, avx512, dt, xp, wp, gop, gxp, NULL, NULL, stream};
      st = lm_impl_run(bwdd_f32_list, N_OF(bwdd_f32_list), &c, "conv2d_backward");
   }
   if (st == LM_OK && (gwp || gbp)) {
      bwd_ctx c = {g, nhwc, avx512, dt, xp, wp, gop, NULL, gwp, gbp, NULL};
      st = lm_impl_run(bwdw_f32_list, N_OF(bwdw_f32_list), &c, "conv2d_backward");
   }
   return st;
}

/* ---------------------------------------------------------------------------------------------
 * float16 / bfloat16: widen to float32 scratch (same dense layout), the float32 kernels, round
 * once. Bit-for-bit the float32 convolution of the widened inputs, rounded to nearest even. The
 * scratch is host memory the kernel allocates (the tensors may live on sim:0, whose kernels run
 * on the host).
 */
/* float16 through src/iter.c's vectorizing conversions (lm_f16_to_f32 / lm_f32_to_f16);
   bfloat16 with lm_bf2f / lm_f2bf, kept out of iter.c's no-trapping-math region (under that
   pragma these loops ran 30 % slower) */

static void half_widen(int dt, const uint16_t *src, float *dst, int64_t n) {
   const int nt = conv_threads((double)n * 4);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t b = 0; b < (n + 4095) / 4096; b++) {
      const int64_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
      if (dt == LM_BFLOAT16)
         for (int64_t i = lo; i < hi; i++) dst[i] = lm_bf2f(src[i]);
      else
         lm_f16_to_f32(src + lo, dst + lo, hi - lo);
   }
}

static void half_narrow(int dt, const float *src, uint16_t *dst, int64_t n) {
   const int nt = conv_threads((double)n * 4);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t b = 0; b < (n + 4095) / 4096; b++) {
      const int64_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
      if (dt == LM_BFLOAT16)
         for (int64_t i = lo; i < hi; i++) dst[i] = lm_f2bf(src[i]);
      else
         lm_f32_to_f16(src + lo, dst + lo, hi - lo);
   }
}


/* a float32 copy of a dense half tensor (NULL t: NULL); *ok cleared when out of memory */
/* a float32 copy of n 16-bit values of dtype dt; NULL when out of memory */
static float *half_widened_ptr(int dt, const uint16_t *src, int64_t n) {
   float *f = lm_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
   if (f) half_widen(dt, src, f, n);
   return f;
}

static float *half_widened(const lm_tensor *t, int64_t n, int *ok) {
   if (!t || !*ok) return NULL;
   float *f = half_widened_ptr(t->dtype, lm_tensor_data(t), n);
   if (!f) *ok = 0;
   return f;
}

static float *scratch_f32(int64_t n, int want, int *ok) {
   if (!want || !*ok) return NULL;
   float *f = lm_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
   if (!f) *ok = 0;
   return f;
}

static void scratch_free(void *p, int64_t n) {
   if (p) lm_free(p, (size_t)(n > 0 ? n : 1) * sizeof(float));
}

static inline int64_t geom_xn(const conv_geom *g) { return g->N * g->C * g->H * g->W; }
static inline int64_t geom_wn(const conv_geom *g) { return g->O * g->Cg * g->kh * g->kw; }
static inline int64_t geom_on(const conv_geom *g) { return g->N * g->O * g->Ho * g->Wo; }

static lm_status fwd_half_via_f32(const conv_geom *g, int nhwc, int avx512, const lm_tensor *xd,
                                  const lm_tensor *wd, const float *bbuf, const lm_tensor *rd,
                                  int act, lm_tensor *res) {
   const int64_t xn = geom_xn(g), wn = geom_wn(g), on = geom_on(g);
   int ok = 1;
   /* a bfloat16 input and residual are widened by the kernel that runs (fwd_f32_input), or not
      at all by the pointwise kernel, which widens a block at a time into L2 (resnet50's 1x1
      layers: a float32 copy of the input written to memory and read back cost +30 % over the
      float32 call) */
   const int lazy = xd->dtype == LM_BFLOAT16 && (!rd || rd->dtype == LM_BFLOAT16);
   float *xf = lazy ? NULL : half_widened(xd, xn, &ok), *wf = half_widened(wd, wn, &ok);
   float *rf = lazy ? NULL : half_widened(rd, on, &ok);
   float *of = scratch_f32(on, 1, &ok);
   float *xw = NULL, *rw = NULL;
   lm_status st = LM_ERR_OOM;
   /* a bfloat16 result is written by the pointwise kernel's epilogue itself where that kernel
      runs (rounded as half_narrow rounds: the same bits), saving a float32 pass over the output */
   uint16_t *out16 = res->dtype == LM_BFLOAT16 ? lm_tensor_data(res) : NULL;
   int narrowed = 0;
   if (ok) {
      fwd_ctx c = {g,    nhwc,  avx512,   LM_FLOAT32,
                   xf,   wf,    bbuf,     rf,
                   act,  of,    NULL,     out16,
                   &narrowed,
                   lazy ? lm_tensor_data(xd) : NULL,
                   lazy && rd ? lm_tensor_data(rd) : NULL,
                   &xw,  &rw};
      st = lm_impl_run(fwd_f32_list, (int)(sizeof fwd_f32_list / sizeof *fwd_f32_list), &c,
                       "conv2d");
   }
   if (st == LM_OK && !narrowed) half_narrow(res->dtype, of, lm_tensor_data(res), on);
   scratch_free(xf, xn), scratch_free(wf, wn), scratch_free(rf, on), scratch_free(of, on);
   scratch_free(xw, xn), scratch_free(rw, on);
   return st;
}

/* level: 0 portable, 1 AVX-512, 2 AVX-512 + AVX512_BF16 (the native bfloat16 kernels) */
enum { LV_C = 0, LV_AVX512 = 1, LV_BF16 = 2 };

/* bfloat16 3x3 stride-1 layers with more than 64 reduction channels (resnet50's 256 and 512)
   run Winograd F(4x4, 3x3) with bfloat16 products (conv_winograd_bf16_avx512bf16.c) in forward
   and backward data: a quarter of the direct kernel's multiplications at the same bfloat16 rate,
   for the price of float32 transforms and of widening the inputs. */
static int bf16_winograd_on(void) { return lm_cpu_option(LM_CPU_OPT_BF16_WINOGRAD); }

/* bfloat16 weight gradients of the 3x3 stride-1 layers with 64 or more input channels take
   Winograd instead of the native bf16 kernel: F(4x4, 3x3) does a quarter of the
   multiplications. With lm.backends.cpu.bf16_winograd (the default) its products are bfloat16
   (lm_conv_wino_bf16_bwdw); switched off, float32 on widened copies, rounded once at the end,
   which still beat the native kernel (numbers: docs/performance.md, "Measurements behind kernel
   choices"). LUMEN_CONV_WINOGRAD=0 turns both off with the rest of Winograd. */
static int bf16_bwdw_via_winograd(const conv_geom *g) { return lm_conv_wino_bf16_bwdw_usable(g); }

/* the level for bfloat16 / float16 work: without AMX in use, the native bfloat16 kernels only
   where vdpbf16ps pays (lm_cpu_bf16_dot_pays: AMD, not Intel Xeons), else the float32 route */
static int half_level(int level) {
   if (level >= LV_BF16 && !lm_amx_on() && !lm_cpu_bf16_dot_pays()) return LV_AVX512;
   return level;
}

/* ---------------------------------------------------------------------------------------------
 * float32 on AMX tiles, opt-in (lm.backends.cpu.fp32_precision = "bf16", PyTorch's
 * torch.backends.cpu.fp32_precision): x, w and grad_out rounded to bfloat16, products summed in
 * float32 by the tile kernels, float32 results (the bias gradient stays an exact float32 sum)
 */
static int fp32_amx(const conv_geom *g, int nhwc, int backward_data) {
   return nhwc && lm_cpu_option(LM_CPU_OPT_FP32_BF16) && lm_amx_on() &&
          lm_conv_amx_usable(g, backward_data);
}

/* a bfloat16 copy (round to nearest even) of n floats; NULL when out of memory */
static uint16_t *bf16_rounded(const float *src, int64_t n) {
   uint16_t *d = lm_alloc((size_t)(n > 0 ? n : 1) * 2);
   if (!d) return NULL;
   const int nt = conv_threads((double)n * 2);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t b = 0; b < (n + 4095) / 4096; b++) {
      const int64_t lo = b * 4096, hi = lo + 4096 < n ? lo + 4096 : n;
      for (int64_t i = lo; i < hi; i++) d[i] = lm_f2bf(src[i]);
   }
   return d;
}

static void bf16_free(uint16_t *p, int64_t n) {
   if (p) lm_free(p, (size_t)(n > 0 ? n : 1) * 2);
}

static lm_status fwd_fp32_amx(const conv_geom *g, const lm_tensor *xd, const lm_tensor *wd,
                              const float *bbuf, const lm_tensor *rd, int act, lm_tensor *res) {
   const int64_t xn = g->N * g->C * g->H * g->W, wn = g->O * g->Cg * g->kh * g->kw;
   uint16_t *xb = bf16_rounded(lm_tensor_data(xd), xn);
   uint16_t *wb = xb ? bf16_rounded(lm_tensor_data(wd), wn) : NULL;
   lm_status st = LM_ERR_OOM;
   int stream = 0;
   if (wb)
      st = lm_conv_fwd_nhwc_amx(g, xb, wb, bbuf, rd ? lm_tensor_data(rd) : NULL, act,
                                lm_tensor_data(res), 1, &stream);
   bf16_free(xb, xn), bf16_free(wb, wn);
   return st;
}

static lm_status bwd_fp32_amx(const conv_geom *g, const lm_tensor *xd, const lm_tensor *wd,
                              const lm_tensor *gd, lm_tensor *rx, lm_tensor *rw, lm_tensor *rb) {
   const int64_t xn = g->N * g->C * g->H * g->W, wn = g->O * g->Cg * g->kh * g->kw;
   const int64_t on = g->N * g->O * g->Ho * g->Wo;
   uint16_t *gb = bf16_rounded(lm_tensor_data(gd), on);
   uint16_t *wb = gb && rx ? bf16_rounded(lm_tensor_data(wd), wn) : NULL;
   uint16_t *xb = gb && rw ? bf16_rounded(lm_tensor_data(xd), xn) : NULL;
   lm_status st = LM_OK;
   if (!gb || (rx && !wb) || (rw && !xb)) st = LM_ERR_OOM;
   if (st == LM_OK && rx) st = lm_conv_bwdd_nhwc_amx(g, gb, wb, lm_tensor_data(rx), 1);
   if (st == LM_OK && rw) st = lm_conv_bwdw_nhwc_bf16(g, xb, gb, lm_tensor_data(rw), NULL);
   if (st == LM_OK && rb)
      st = bwd_ptrs(g, 1, 1, LM_FLOAT32, NULL, NULL, lm_tensor_data(gd), NULL, NULL,
                    lm_tensor_data(rb), NULL);
   bf16_free(gb, on), bf16_free(wb, wn), bf16_free(xb, xn);
   return st;
}

/* ---------------------------------------------------------------------------------------------
 * the kernels (src/ops/conv.h gives the t[] order)
 */

/* float16 / bfloat16 forward: the native kernels where they take the call, else the float32
   route (via_f32, the fallback) */
typedef struct {
   const conv_geom *g;
   int nhwc, level, dt;
   const lm_tensor *x, *w, *res;
   const float *bias;
   int act;
   lm_tensor *out;
} half_ctx;

static const char *native_bf16(const half_ctx *c) {
   if (c->dt != LM_BFLOAT16) return "not bfloat16";
   if (!c->nhwc) return "not channels-last";
   if (c->level < LV_BF16) return "ISA below AVX512_BF16, or vdpbf16ps does not pay here";
   return NULL;
}
static const char *hu_amx(const void *p) {
   const half_ctx *c = p;
   const char *why = native_bf16(c);
   if (why) return why;
   if (!lm_amx_on()) return "AMX not in use (ISA or lm.backends.cpu.amx)";
   if (!lm_conv_amx_usable(c->g, 0)) return "groups, or fewer than 16 channels";
   return lm_conv_amx_pays(c->g) ? NULL : "fewer than 32 channels with a spatial kernel";
}
static lm_status hr_amx(void *p) {
   const half_ctx *c = p;
   int stream = lm_tensor_block_cold(c->out);
   lm_status st = lm_conv_fwd_nhwc_amx(c->g, lm_tensor_data(c->x), lm_tensor_data(c->w), c->bias,
                                       c->res ? lm_tensor_data(c->res) : NULL, c->act,
                                       lm_tensor_data(c->out), 0, &stream);
   if (st == LM_OK && stream) lm_tensor_note_streamed(c->out);
   return st;
}
static const char *winograd_bf16(const conv_geom *g, int backward_data) {
   if (!bf16_winograd_on()) return "lm.backends.cpu.bf16_winograd is off";
   return lm_conv_wino_bf16_usable(g, backward_data) ? NULL
                                                     : "not a 3x3 stride-1 geometry with 64+ channels";
}
static const char *hu_winograd(const void *p) {
   const half_ctx *c = p;
   const char *why = native_bf16(c);
   return why ? why : winograd_bf16(c->g, 0);
}
static lm_status hr_winograd(void *p) {
   const half_ctx *c = p;
   return lm_conv_wino_bf16_fwd(c->g, lm_tensor_data(c->x), lm_tensor_data(c->w), c->bias,
                                c->res ? lm_tensor_data(c->res) : NULL, c->act,
                                lm_tensor_data(c->out));
}
/* with AMX in use the level says nothing of vdpbf16ps (conv_forward's half_level keeps
   LV_BF16): a layer of one group that the tiles declined (few channels) takes the float32 route
   where vdpbf16ps does not pay; depthwise layers keep the native kernel */
static const char *vdp_declined(const conv_geom *g) {
   return g->G == 1 && lm_amx_on() && !lm_cpu_bf16_dot_pays()
             ? "vdpbf16ps does not pay on this CPU (the tiles declined: few channels)"
             : NULL;
}
static const char *hu_direct(const void *p) {
   const half_ctx *c = p;
   const char *why = native_bf16(c);
   if (!why) why = vdp_declined(c->g);
   return why ? why : lm_conv_bf16_usable(c->g, 0) ? NULL : "groups other than depthwise";
}
static lm_status hr_direct(void *p) {
   const half_ctx *c = p;
   return lm_conv_fwd_nhwc_avx512bf16(c->g, lm_tensor_data(c->x), lm_tensor_data(c->w), c->bias,
                                      c->res ? lm_tensor_data(c->res) : NULL, c->act,
                                      lm_tensor_data(c->out));
}
static lm_status hr_via_f32(void *p) {
   const half_ctx *c = p;
   return fwd_half_via_f32(c->g, c->nhwc, c->level >= LV_AVX512, c->x, c->w, c->bias, c->res,
                           c->act, c->out);
}
static const lm_impl fwd_half_list[] = {
   {LM_IMPL_CONV_AMX_BF16, hu_amx, hr_amx},
   {LM_IMPL_CONV_WINOGRAD_BF16, hu_winograd, hr_winograd},
   {LM_IMPL_CONV_DIRECT_BF16, hu_direct, hr_direct},
   {LM_IMPL_CONV_VIA_F32, NULL, hr_via_f32},
};

/* LM_OP_CONV2D: t = {x, w, bias, residual, out} */
static inline lm_status conv_forward(const lm_op *op, int level) {
   const lm_conv2d_params *p = op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *xd = op->t[0], *wd = op->t[1], *bias = op->t[2], *rd = op->t[3];
   lm_tensor *res = op->t[4];
   const int nhwc = p->channels_last, act = p->act, dt = xd->dtype;
   const int avx512 = level >= LV_AVX512;
   void *bbuf = NULL;
   size_t bbytes = 0;
   lm_status st = LM_OK;
   if (bias) {
      bbuf = bias_dense(bias, dt, &bbytes);
      if (!bbuf) return LM_ERR_OOM;
   }
   if (dt == LM_FLOAT16 || dt == LM_BFLOAT16) {
      /* half_level: the native kernels where AMX is in use or vdpbf16ps pays */
      half_ctx c = {g, nhwc, half_level(level), dt, xd, wd, rd, bbuf, act, res};
      st = lm_impl_run(fwd_half_list, N_OF(fwd_half_list), &c, "conv2d");
   } else if (dt == LM_FLOAT32 && level >= LV_BF16 && fp32_amx(g, nhwc, 0) &&
              lm_impl_on(LM_IMPL_CONV_FP32_AMX)) {
      lm_impl_ran(LM_IMPL_CONV_FP32_AMX);
      st = fwd_fp32_amx(g, xd, wd, bbuf, rd, act, res);
   } else {
      int stream = lm_tensor_block_cold(res);
      st = fwd_ptrs(g, nhwc, avx512, dt, lm_tensor_data(xd), lm_tensor_data(wd), bbuf,
                    rd ? lm_tensor_data(rd) : NULL, act, lm_tensor_data(res), &stream, NULL,
                    NULL);
      if (st == LM_OK && stream) lm_tensor_note_streamed(res);
   }
   if (bbuf) lm_free(bbuf, bbytes);
   return st;
}

/* float16 / bfloat16 backward: grad_x natively when a bfloat16 kernel takes it, the weight and
   bias gradients natively where theirs does, the rest through float32 (via_f32) */
typedef struct {
   const conv_geom *g;
   int nhwc, level, dt;
   const lm_tensor *x, *w, *gout;
   lm_tensor *gx;
} half_bwd_ctx;

static const char *native_bf16_bwd(const half_bwd_ctx *c) {
   if (c->dt != LM_BFLOAT16) return "not bfloat16";
   if (!c->nhwc) return "not channels-last";
   if (c->level < LV_BF16) return "ISA below AVX512_BF16, or vdpbf16ps does not pay here";
   return NULL;
}
static const char *hbu_amx(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   if (why) return why;
   if (!lm_amx_on()) return "AMX not in use (ISA or lm.backends.cpu.amx)";
   if (!lm_conv_amx_usable(c->g, 1)) return "groups, or fewer than 16 channels";
   return lm_conv_amx_pays(c->g) ? NULL : "fewer than 32 channels with a spatial kernel";
}
static lm_status hbr_amx(void *p) {
   const half_bwd_ctx *c = p;
   return lm_conv_bwdd_nhwc_amx(c->g, lm_tensor_data(c->gout), lm_tensor_data(c->w),
                                lm_tensor_data(c->gx), 0);
}
static const char *hbu_winograd(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   return why ? why : winograd_bf16(c->g, 1);
}
static lm_status hbr_winograd(void *p) {
   const half_bwd_ctx *c = p;
   return lm_conv_wino_bf16_bwdd(c->g, lm_tensor_data(c->gout), lm_tensor_data(c->w),
                                 lm_tensor_data(c->gx));
}
static const char *hbu_direct(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   if (!why) why = vdp_declined(c->g);
   return why ? why : lm_conv_bf16_usable(c->g, 1) ? NULL : "groups other than depthwise";
}
static lm_status hbr_direct(void *p) {
   const half_bwd_ctx *c = p;
   return lm_conv_bwdd_nhwc_avx512bf16(c->g, lm_tensor_data(c->gout), lm_tensor_data(c->w),
                                       lm_tensor_data(c->gx));
}
static lm_status hbr_later(void *p) { /* via_f32: done with the other gradients below */
   (void)p;
   return LM_OK;
}
static const lm_impl bwdd_half_list[] = {
   {LM_IMPL_CONV_AMX_BF16, hbu_amx, hbr_amx},
   {LM_IMPL_CONV_WINOGRAD_BF16, hbu_winograd, hbr_winograd},
   {LM_IMPL_CONV_DIRECT_BF16, hbu_direct, hbr_direct},
   {LM_IMPL_CONV_VIA_F32, NULL, hbr_later},
};

/* the weight and bias gradients in bfloat16 arithmetic, into float32 scratch rounded once
   (im2col_gemm_bf16 comes twice: first where AMX is in use, else after Winograd):
   on AMX the im2col tiles and the GEMM on tiles (they beat Winograd's vdpbf16ps products:
   docs/performance.md, session 19); else for the 3x3 layers bf16_bwdw_via_winograd takes,
   Winograd with bfloat16 products (lm.backends.cpu.bf16_winograd; switched off, the float32
   route, which beats the native kernel there); else the native kernel (the GEMM over pixel
   pairs). Chosen by the geometry and the switches only, never by which gradients are wanted:
   grad_b alone equals grad_b computed with grad_w, bit for bit (spec/c/test_devices_conv.c,
   spec/conv_bf16_spec.lua check). */
/* Fewer than 64 output channels: the weight gradient's GEMM (O x C*kh*kw, summed over the
   pixels) fills at most half of the tiles' 32 rows, and fewer than 32 columns for a stem; the
   float32 route beats it. The README's small ResNet (16-64 channels, batch 128 of 28x28), bf16
   training step, alternated in one process: 57.9 -> 42.5 ms (float32 42.2); the 1-channel
   stem's weight gradient 18.9 -> 0.7 ms, a 16 -> 16 3x3 layer's backward 9.0 -> 3.6 ms
   (LUMEN_VERBOSE). ResNet50's layers (64+ channels everywhere) keep the tiles. */
enum { BWDW_AMX_MIN_O = 64 };
static const char *hwu_amx(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   if (why) return why;
   if (!lm_amx_on()) return "AMX not in use (ISA or lm.backends.cpu.amx)";
   return c->g->O >= BWDW_AMX_MIN_O ? NULL : "fewer than 64 output channels (the tiles idle)";
}
static const char *hwu_winograd(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   if (why) return why;
   if (!bf16_bwdw_via_winograd(c->g)) return "not a 3x3 stride-1 geometry with 64+ channels";
   return bf16_winograd_on() ? NULL : "lm.backends.cpu.bf16_winograd is off";
}
static const char *hwu_pairs(const void *p) {
   const half_bwd_ctx *c = p;
   const char *why = native_bf16_bwd(c);
   if (why) return why;
   /* with AMX in use the level says nothing of vdpbf16ps (conv_backward): ask */
   if (lm_amx_on() && !lm_cpu_bf16_dot_pays()) return "vdpbf16ps does not pay on this CPU";
   return bf16_bwdw_via_winograd(c->g) ? "a Winograd geometry: the float32 route beats it" : NULL;
}
static const lm_impl bwdw_half_list[] = {
   {LM_IMPL_CONV_BWDW_BF16, hwu_amx, hbr_later},
   {LM_IMPL_CONV_WINOGRAD_BF16, hwu_winograd, hbr_later},
   {LM_IMPL_CONV_BWDW_BF16, hwu_pairs, hbr_later},
   {LM_IMPL_CONV_VIA_F32, NULL, hbr_later},
};

/* grad_w / grad_b (rw / rb, either may be NULL) of a 16-bit call by a kernel that reads the
   16-bit x and grad_out and sums into float32 scratch: rounded once into rw / rb */
typedef lm_status (*bwdw_half_fn)(const conv_geom *, const uint16_t *, const uint16_t *, float *,
                                  float *);
static lm_status bwdw_half_run(bwdw_half_fn bwdw, const conv_geom *g, const lm_tensor *xd,
                               const lm_tensor *gd, lm_tensor *rw, lm_tensor *rb) {
   const int64_t wn = geom_wn(g), bn = g->O;
   const int dt = gd->dtype;
   int ok = 1;
   float *gwf = scratch_f32(wn, rw != NULL, &ok), *gbf = scratch_f32(bn, rb != NULL, &ok);
   lm_status st = ok ? bwdw(g, rw ? lm_tensor_data(xd) : NULL, lm_tensor_data(gd), gwf, gbf)
                     : LM_ERR_OOM;
   if (st == LM_OK && rw) half_narrow(dt, gwf, lm_tensor_data(rw), wn);
   if (st == LM_OK && rb) half_narrow(dt, gbf, lm_tensor_data(rb), bn);
   scratch_free(gwf, wn), scratch_free(gbf, bn);
   return st;
}

static lm_status bwd_half(const conv_geom *g, int nhwc, int level, const lm_tensor *xd,
                          const lm_tensor *wd, const lm_tensor *gd, lm_tensor *rx, lm_tensor *rw,
                          lm_tensor *rb) {
   const int dt = gd->dtype, avx512 = level >= LV_AVX512;
   const int64_t xn = geom_xn(g), wn = geom_wn(g), on = geom_on(g), bn = g->O;
   lm_status st = LM_OK;
   int ok = 1;
   if (rx) {
      half_bwd_ctx c = {g, nhwc, level, dt, xd, wd, gd, rx};
      const int i = lm_impl_pick(bwdd_half_list, N_OF(bwdd_half_list), &c);
      lm_impl_ran(bwdd_half_list[i].id);
      if (bwdd_half_list[i].id != LM_IMPL_CONV_VIA_F32) {
         st = bwdd_half_list[i].run(&c);
         if (st != LM_OK) return st;
         rx = NULL;
      }
   }
   if (rw || rb) {
      half_bwd_ctx c = {g, nhwc, level, dt, xd, wd, gd, NULL};
      const int i = lm_impl_pick(bwdw_half_list, N_OF(bwdw_half_list), &c);
      const int id = bwdw_half_list[i].id;
      lm_impl_ran(id);
      const bwdw_half_fn bwdw =
         id == LM_IMPL_CONV_WINOGRAD_BF16 ? lm_conv_wino_bf16_bwdw
         : id == LM_IMPL_CONV_VIA_F32     ? NULL
                                          : lm_conv_bwdw_nhwc_bf16;
      if (bwdw) {
         st = bwdw_half_run(bwdw, g, xd, gd, rw, rb);
         if (st != LM_OK) return st;
         rw = rb = NULL;
      }
   }
   if (!rx && !rw && !rb) return LM_OK;
   /* bfloat16 layers where the float32 lists pick Winograd (3x3 stride 1; grad_x and grad_w) or
      the 1x1 kernel (grad_x): they read the bfloat16 grad_out and x themselves and round grad_x
      as they write it (mode 2 of wg_conv / wg_bwdw; x16 / out16 of the 1x1 kernel), no float32
      copies of those tensors */
   if (dt == LM_BFLOAT16 && nhwc && avx512) {
      bwd_ctx pc = {g, nhwc, avx512, LM_FLOAT32, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
      const int dpick =
         rx ? bwdd_f32_list[lm_impl_pick(bwdd_f32_list, N_OF(bwdd_f32_list), &pc)].id : -1;
      if (dpick == LM_IMPL_CONV_WINOGRAD || dpick == LM_IMPL_CONV_POINTWISE) {
         /* (the 1x1 kernel widens grad_out a block of pixels at a time and rounds grad_x in
            its epilogue, as its forward) */
         float *wf = half_widened(wd, wn, &ok);
         int s0 = 0;
         lm_impl_ran(dpick);
         st = !ok ? LM_ERR_OOM
              : dpick == LM_IMPL_CONV_WINOGRAD
                 ? lm_conv_wino_bwdd_nhwc_avx512_io16(g, lm_tensor_data(gd), wf,
                                                      lm_tensor_data(rx))
                 : lm_conv_pw_bwdd_nhwc_avx512(g, NULL, lm_tensor_data(gd), wf, NULL,
                                               lm_tensor_data(rx), &s0);
         scratch_free(wf, wn);
         if (st != LM_OK) return st;
         rx = NULL;
      }
      if ((rw || rb) &&
          bwdw_f32_list[lm_impl_pick(bwdw_f32_list, N_OF(bwdw_f32_list), &pc)].id ==
             LM_IMPL_CONV_WINOGRAD) {
         lm_impl_ran(LM_IMPL_CONV_WINOGRAD);
         st = bwdw_half_run(lm_conv_wino_bwdw_nhwc_avx512_io16, g, xd, gd, rw, rb);
         if (st != LM_OK) return st;
         rw = rb = NULL;
      }
      if (!rx && !rw && !rb) return LM_OK;
   }
   float *gf = half_widened(gd, on, &ok);
   float *xf = rw ? half_widened(xd, xn, &ok) : NULL, *wf = rx ? half_widened(wd, wn, &ok) : NULL;
   float *gxf = scratch_f32(xn, rx != NULL, &ok), *gwf = scratch_f32(wn, rw != NULL, &ok);
   float *gbf = scratch_f32(bn, rb != NULL, &ok);
   st = ok ? bwd_ptrs(g, nhwc, avx512, LM_FLOAT32, xf, wf, gf, gxf, gwf, gbf, NULL) : LM_ERR_OOM;
   if (st == LM_OK && rx) half_narrow(dt, gxf, lm_tensor_data(rx), xn);
   if (st == LM_OK && rw) half_narrow(dt, gwf, lm_tensor_data(rw), wn);
   if (st == LM_OK && rb) half_narrow(dt, gbf, lm_tensor_data(rb), bn);
   scratch_free(gf, on), scratch_free(xf, xn), scratch_free(wf, wn);
   scratch_free(gxf, xn), scratch_free(gwf, wn), scratch_free(gbf, bn);
   return st;
}

/* LM_OP_CONV2D_BACKWARD: t = {x, w, grad_out, grad_x, grad_w, grad_b} */
static inline lm_status conv_backward(const lm_op *op, int level) {
   const lm_conv2d_params *p = op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *xd = op->t[0], *wd = op->t[1], *gd = op->t[2];
   lm_tensor *rx = op->t[3], *rw = op->t[4], *rb = op->t[5];
   const int nhwc = p->channels_last, dt = gd->dtype;
   if (!rx && !rw && !rb) return LM_OK;
   if (dt == LM_FLOAT16 || dt == LM_BFLOAT16)
      return bwd_half(g, nhwc, level >= LV_BF16 && lm_amx_on() ? level : half_level(level), xd, wd,
                      gd, rx, rw, rb);
   if (dt == LM_FLOAT32 && level >= LV_BF16 && fp32_amx(g, nhwc, rx != NULL) &&
       lm_impl_on(LM_IMPL_CONV_FP32_AMX)) {
      lm_impl_ran(LM_IMPL_CONV_FP32_AMX);
      return bwd_fp32_amx(g, xd, wd, gd, rx, rw, rb);
   }
   int stream = rx ? lm_tensor_block_cold(rx) : 0;
   lm_status st = bwd_ptrs(g, nhwc, level >= LV_AVX512, dt, xd ? lm_tensor_data(xd) : NULL,
                           wd ? lm_tensor_data(wd) : NULL, lm_tensor_data(gd),
                           rx ? lm_tensor_data(rx) : NULL, rw ? lm_tensor_data(rw) : NULL,
                           rb ? lm_tensor_data(rb) : NULL, &stream);
   if (st == LM_OK && stream && rx) lm_tensor_note_streamed(rx);
   return st;
}

static lm_status k_conv2d(const lm_op *op) { return conv_forward(op, LV_C); }
static lm_status k_conv2d_backward(const lm_op *op) { return conv_backward(op, LV_C); }
static lm_status k_conv2d_avx512(const lm_op *op) { return conv_forward(op, LV_AVX512); }
static lm_status k_conv2d_backward_avx512(const lm_op *op) { return conv_backward(op, LV_AVX512); }
static lm_status k_conv2d_bf16(const lm_op *op) { return conv_forward(op, LV_BF16); }
static lm_status k_conv2d_backward_bf16(const lm_op *op) { return conv_backward(op, LV_BF16); }

/* ---- registration (cpu.h) ---- */
/* LM_OP_CONV3D: t = {x, w, bias, residual, out} (src/ops/conv.h). The CPU runs natively what
   lm_cpu_conv3d_supports takes (bfloat16 channels_last_3d on AMX tiles, "conv3d_amx_bf16");
   src/ops/conv3d.c asks first and runs everything else as conv2d over the depth taps. Measured
   (r3d_18's layers, 2 clips of 8x112x112, bfloat16, 2 threads): see docs/performance.md
   ("r3d_18 in bfloat16"). */
int lm_cpu_conv3d_supports(const lm_op *op) {
   if (!op->params) return 1; /* "is there a kernel" (lm_device_has_kernel): there is */
   const lm_conv3d_params *p = op->params;
   const lm_tensor *x = op->nt > 0 ? op->t[0] : NULL;
   return x && x->dtype == LM_BFLOAT16 && lm_amx_on() && lm_conv3d_amx_usable(&p->g3);
}

static lm_status k_conv3d(const lm_op *op) {
   if (!lm_cpu_conv3d_supports(op))
      return lm_error(LM_ERR_DEVICE, "conv3d: no native CPU kernel takes this convolution "
                                     "(bfloat16, channels_last_3d, AMX tiles only)");
   const lm_conv3d_params *p = op->params;
   const lm_tensor *xd = op->t[0], *wd = op->t[1], *bias = op->t[2], *rd = op->t[3];
   lm_tensor *res = op->t[4];
   void *bbuf = NULL;
   size_t bbytes = 0;
   if (bias) {
      bbuf = bias_dense(bias, xd->dtype, &bbytes);
      if (!bbuf) return LM_ERR_OOM;
   }
   lm_impl_ran(LM_IMPL_CONV3D_AMX_BF16);
   int stream = lm_tensor_block_cold(res);
   lm_status st = lm_conv3d_fwd_ndhwc_amx(&p->g3, lm_tensor_data(xd), lm_tensor_data(wd), bbuf,
                                          rd ? lm_tensor_data(rd) : NULL, p->act,
                                          lm_tensor_data(res), &stream);
   if (st == LM_OK && stream) lm_tensor_note_streamed(res);
   if (bbuf) lm_free(bbuf, bbytes);
   return st;
}

void lm_cpu_register_conv(lm_kernel_fn *table, int isa) {
   table[LM_OP_CONV3D] = k_conv3d; /* every level: lm_cpu_conv3d_supports decides */
   /* AVX-512 only when it is the ISA in use, so lm_cpu_set_isa(LM_ISA_C or LM_ISA_AVX2) also
      exercises the portable path; the native bfloat16 kernels only from LM_ISA_AVX512_BF16, so
      lm_cpu_set_isa(LM_ISA_AVX512) exercises the bfloat16 fallback */
   if (isa >= LM_ISA_AVX512_BF16) {
      table[LM_OP_CONV2D] = k_conv2d_bf16;
      table[LM_OP_CONV2D_BACKWARD] = k_conv2d_backward_bf16;
   } else if (isa >= LM_ISA_AVX512) {
      table[LM_OP_CONV2D] = k_conv2d_avx512;
      table[LM_OP_CONV2D_BACKWARD] = k_conv2d_backward_avx512;
   } else {
      table[LM_OP_CONV2D] = k_conv2d;
      table[LM_OP_CONV2D_BACKWARD] = k_conv2d_backward;
   }
}
