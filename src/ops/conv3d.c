/* conv3d.c -- 3-D convolution (public functions: src/conv.h), as a front end over the 2-D
 * convolution, so every device and dtype lm_conv2d runs on runs it. One kernel of its own
 * where a device takes the call natively (LM_OP_CONV3D, asked through lm_op_supported: on the
 * CPU, bfloat16 channels_last_3d forward with every depth tap live on AMX tiles,
 * kernels/cpu/conv_bf16_amx.c; native_conv3d below); everything else as follows.
 *
 * The depth dimension is folded into the batch and the kernel's depth taps into the channels:
 *   y[n, :, od] = sum_kd conv2d(x[n, :, od*sd - pd + kd*dd], w[:, :, kd])
 * is ONE conv2d over the batch N*Do of an input X2 (N*Do, kD*C, H, W) whose channels are, group
 * by group, the kD depth slices side by side (X2[n*Do + od, g*kD*Cg + kd*Cg + c] =
 * x[n, g*Cg + c, od*sd - pd + kd*dd], zero outside the input), with the weight
 * W2[o, kd*Cg + c] = w[o, c, kd] (O, kD*Cg, kh, kw). In channels_last_3d the output
 * (N, O, Do, Ho, Wo) is, byte for byte, the channels_last output (N*Do, O, Ho, Wo) of that
 * conv2d, which therefore writes it in place; the 2-D kernels (Winograd, pointwise,
 * register-blocked, direct, bfloat16, cuDNN) and their fused epilogue (bias, residual,
 * activation) all apply. Gathering X2 costs one copy of kD times the input, small beside the
 * convolution's kD*kh*kw*O multiply-adds per input element. A kernel of depth 1 without depth
 * padding (the (2+1)-D spatial convolutions, 1x1x1 projections of stride 1) reads a
 * channels_last_3d input in place: X2 is a view.
 * Backward: the conv2d gradients of X2 and W2, scattered back (grad_x: each depth tap's slice
 * added into its input depths; grad_w: W2's layout undone).
 *
 * NCDHW (contiguous) takes the same route with NCHW tensors: X2 is always a copy, and the NCHW
 * result is permuted into the NCDHW output once.
 */
#include "common.h"
#include "../conv.h"
#include "conv.h"
#include "../impl.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
   int64_t N, C, D, H, W, O, Do, Ho, Wo, kd, kh, kw, sd, pd, dd, G, Cg;
   int64_t st2[2], pd2[2], dl2[2];  /* the conv2d's stride, padding, dilation */
   int fmt, fmt2;                   /* 5-D format and the conv2d's 4-D one */
   int64_t t0, nt;                  /* the live depth taps t0 .. t0+nt-1 (see c3_check) */
} c3_geom;


static void fmt_sizes(char *buf, size_t n, const lm_tensor *t) {
   lm_format_shape(buf, n, t->ndim, t->sizes);
}

lm_status lm_conv3d_output_size(const int64_t *in_dhw, const int64_t *kernel_dhw,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t *out_dhw) {
   if (!in_dhw || !kernel_dhw || !out_dhw)
      return lm_error(LM_ERR_ARG, "conv3d: size array is NULL");
   int64_t padded[3], ks[3];
   int fits = 1;
   for (int i = 0; i < 3; i++) {
      const int64_t s = stride ? stride[i] : 1, p = padding ? padding[i] : 0;
      const int64_t d = dilation ? dilation[i] : 1;
      if (s <= 0) return lm_error(LM_ERR_ARG, "non-positive stride is not supported");
      if (d <= 0) return lm_error(LM_ERR_ARG, "non-positive dilation is not supported");
      if (p < 0) return lm_error(LM_ERR_ARG, "negative padding is not supported");
      padded[i] = in_dhw[i] + 2 * p;
      ks[i] = d * (kernel_dhw[i] - 1) + 1;
      if (padded[i] < ks[i] || padded[i] <= 0) fits = 0;
   }
   if (!fits)
      return lm_error(LM_ERR_SHAPE,
                      "Calculated padded input size per channel: (%lld x %lld x %lld). Kernel "
                      "size: (%lld x %lld x %lld). Kernel size can't be greater than actual "
                      "input size",
                      (long long)padded[0], (long long)padded[1], (long long)padded[2],
                      (long long)ks[0], (long long)ks[1], (long long)ks[2]);
   for (int i = 0; i < 3; i++) out_dhw[i] = (padded[i] - ks[i]) / (stride ? stride[i] : 1) + 1;
   return LM_OK;
}

int lm_conv3d_memory_format(const lm_tensor *x, const lm_tensor *w) {
   /* PyTorch's rule (ConvUtils.h) for 5-D: channels_last_3d when the input or the weight
      suggests it */
   if (!x || !w || x->ndim != 5 || w->ndim != 5) return LM_CONTIGUOUS;
   if (lm_suggest_memory_format(x, 0) == LM_CHANNELS_LAST_3D ||
       lm_suggest_memory_format(w, 0) == LM_CHANNELS_LAST_3D)
      return LM_CHANNELS_LAST_3D;
   return LM_CONTIGUOUS;
}

static lm_status c3_check(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                          const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                          int64_t groups, int fmt, c3_geom *g) {
   LM_TRY(lm_conv_check_args(x, w, bias, groups, 3));
   const int64_t O = w->sizes[0], C = x->sizes[1];
   int64_t o3[3];
   LM_TRY(lm_conv3d_output_size(&x->sizes[2], &w->sizes[2], stride, padding, dilation, o3));
   if (fmt < 0 || fmt == LM_PRESERVE) fmt = lm_conv3d_memory_format(x, w);
   if (fmt != LM_CONTIGUOUS && fmt != LM_CHANNELS_LAST_3D)
      return lm_error(LM_ERR_FORMAT,
                      "conv3d runs in contiguous_format or channels_last_3d, not memory format %d",
                      fmt);
   memset(g, 0, sizeof *g);
   g->N = x->sizes[0];
   g->C = C;
   g->D = x->sizes[2];
   g->H = x->sizes[3];
   g->W = x->sizes[4];
   g->O = O;
   g->Do = o3[0];
   g->Ho = o3[1];
   g->Wo = o3[2];
   g->kd = w->sizes[2];
   g->kh = w->sizes[3];
   g->kw = w->sizes[4];
   g->sd = stride ? stride[0] : 1;
   g->pd = padding ? padding[0] : 0;
   g->dd = dilation ? dilation[0] : 1;
   for (int i = 0; i < 2; i++) {
      g->st2[i] = stride ? stride[i + 1] : 1;
      g->pd2[i] = padding ? padding[i + 1] : 0;
      g->dl2[i] = dilation ? dilation[i + 1] : 1;
   }
   g->G = groups;
   g->Cg = C / groups;
   g->fmt = fmt;
   g->fmt2 = fmt == LM_CHANNELS_LAST_3D ? LM_CHANNELS_LAST : LM_CONTIGUOUS;
   /* the live taps: those that read some input depth for some output depth. A clip shorter
      than the kernel (r3d_18's last layers: depth 1 or 2 under a padded 3-deep kernel) has
      taps that read only padding; they are skipped (l4's 3x3x3 at depth 1 is a 2-D 3x3). With
      none live (the output is the bias), tap 0 runs on zeros. */
   int64_t t0 = -1, t1 = 0;
   for (int64_t kd = 0; kd < g->kd; kd++) {
      const int64_t off = kd * g->dd - g->pd;
      const int64_t a = off >= 0 ? 0 : (-off + g->sd - 1) / g->sd;
      if (a < g->Do && a * g->sd + off < g->D) {
         if (t0 < 0) t0 = kd;
         t1 = kd + 1;
      }
   }
   g->t0 = t0 < 0 ? 0 : t0;
   g->nt = t0 < 0 ? 1 : t1 - t0;
   return LM_OK;
}

/* the output depths od whose input depth od*sd - pd + kd*dd (tap kd) lies inside the input:
   [*lo, *hi) */
static void tap_range(const c3_geom *g, int64_t kd, int64_t *lo, int64_t *hi) {
   const int64_t off = kd * g->dd - g->pd;       /* input depth of output depth 0 */
   int64_t a = off >= 0 ? 0 : (-off + g->sd - 1) / g->sd;
   int64_t b = g->D - 1 - off < 0 ? 0 : (g->D - 1 - off) / g->sd + 1;
   if (b > g->Do) b = g->Do;
   if (a > b) a = b;
   *lo = a;
   *hi = b;
}

/* 6-D views (N, depths, G, Cg, H, W) of a 5-D tensor t (N, C, D, H, W) at depths d0, d0 + step,
   ... and of a 4-D tap tensor p (N*Do, nk*C, H, W) holding nk taps per group, at output depths
   od0.. and tap slot k */
static lm_status view5_taps(const lm_tensor *t, const c3_geom *g, int64_t d0, int64_t step,
                            int64_t cnt, lm_tensor **out) {
   const int64_t *s = t->strides;
   const int64_t sz[6] = {g->N, cnt, g->G, g->Cg, t->sizes[3], t->sizes[4]};
   const int64_t st[6] = {s[0], step * s[2], g->Cg * s[1], s[1], s[3], s[4]};
   return lm_as_strided(t, 6, sz, st, t->offset + d0 * s[2], out);
}

static lm_status view4_taps(const lm_tensor *p, const c3_geom *g, int64_t nk, int64_t od0,
                            int64_t k, int64_t cnt, lm_tensor **out) {
   const int64_t *s = p->strides;
   const int64_t sz[6] = {g->N, cnt, g->G, g->Cg, p->sizes[2], p->sizes[3]};
   const int64_t st[6] = {g->Do * s[0], s[0], nk * g->Cg * s[1], s[1], s[2], s[3]};
   return lm_as_strided(p, 6, sz, st, p->offset + od0 * s[0] + k * g->Cg * s[1], out);
}

/* a 4-D view (N*Do, C, H, W) of a 5-D tensor (N, C, Do, H, W) whose batch and depth strides
   allow one; NULL (and LM_OK) when they do not */
static lm_status fold_view(const lm_tensor *t, lm_tensor **out) {
   *out = NULL;
   const int64_t *s = t->strides, N = t->sizes[0], D = t->sizes[2];
   int64_t bs;
   if (D == 1) bs = s[0];
   else if (N == 1 || s[0] == D * s[2]) bs = s[2];
   else return LM_OK;
   const int64_t sz[4] = {N * D, t->sizes[1], t->sizes[3], t->sizes[4]};
   const int64_t st[4] = {bs, s[1], s[3], s[4]};
   return lm_as_strided(t, 4, sz, st, t->offset, out);
}

/* the 5-D view (N, C, Do, H, W) of a 4-D tensor p (N*Do, C, H, W) */
static lm_status unfold_view(const lm_tensor *p, int64_t N, int64_t Do, lm_tensor **out) {
   const int64_t *s = p->strides;
   const int64_t sz[5] = {N, p->sizes[1], Do, p->sizes[2], p->sizes[3]};
   const int64_t st[5] = {Do * s[0], s[1], s[0], s[2], s[3]};
   return lm_as_strided(p, 5, sz, st, p->offset, out);
}

/* t (N, C, Do, H, W) as a 4-D tensor (N*Do, C, H, W) for the conv2d: a view when the strides
   allow it and it is dense in fmt2, else a copy dense in fmt2 */
static lm_status fold(const lm_tensor *t, int fmt2, lm_tensor **out) {
   LM_TRY(fold_view(t, out));
   if (*out && lm_is_contiguous(*out, fmt2)) return LM_OK;
   if (*out) lm_tensor_free(*out);
   *out = NULL;
   const int64_t sz[4] = {t->sizes[0] * t->sizes[2], t->sizes[1], t->sizes[3], t->sizes[4]};
   LM_TRY(lm_empty(4, sz, t->dtype, fmt2, t->device, out));
   lm_tensor *v = NULL;
   lm_status st = unfold_view(*out, t->sizes[0], t->sizes[2], &v);
   if (st == LM_OK) st = lm_copy_(v, t);
   if (v) lm_tensor_free(v);
   if (st != LM_OK) {
      lm_tensor_free(*out);
      *out = NULL;
   }
   return st;
}

/* The input of depth taps k0 .. k0+nk-1 side by side, (N*Do, nk*C, H, W) dense in fmt2:
   [n*Do + od, g*nk*Cg + k*Cg + c] = x[n, g*Cg + c, od*sd - pd + (k0 + k)*dd], zero outside the
   input. One tap (nk 1) whose depths all lie inside the input is a view of x when x's strides
   allow it and the view is dense in fmt2. */
static lm_status gather_taps(const lm_tensor *x, const c3_geom *g, int64_t k0, int64_t nk,
                             lm_tensor **out) {
   *out = NULL;
   if (nk == 1) {
      int64_t lo, hi;
      tap_range(g, k0, &lo, &hi);
      const int64_t *s = x->strides;
      int64_t bs = -1;
      if (g->Do == 1) bs = s[0];
      else if (g->N == 1 || s[0] == g->Do * g->sd * s[2]) bs = g->sd * s[2];
      if (lo == 0 && hi == g->Do && bs >= 0) {
         const int64_t sz[4] = {g->N * g->Do, g->C, g->H, g->W};
         const int64_t st[4] = {bs, s[1], s[3], s[4]};
         lm_tensor *v = NULL;
         LM_TRY(lm_as_strided(x, 4, sz, st, x->offset + (k0 * g->dd - g->pd) * s[2], &v));
         if (lm_is_contiguous(v, g->fmt2)) {
            *out = v;
            return LM_OK;
         }
         lm_tensor_free(v);
      }
   }
   const int64_t sz[4] = {g->N * g->Do, nk * g->C, g->H, g->W};
   lm_tensor *p = NULL;
   LM_TRY(lm_empty(4, sz, x->dtype, g->fmt2, x->device, &p));
   lm_status st = LM_OK;
   for (int64_t k = 0; k < nk && st == LM_OK; k++) {
      int64_t lo, hi;
      tap_range(g, k0 + k, &lo, &hi);
      lm_tensor *dv = NULL, *sv = NULL;
      if (hi > lo) {
         st = view4_taps(p, g, nk, lo, k, hi - lo, &dv);
         if (st == LM_OK)
            st = view5_taps(x, g, lo * g->sd - g->pd + (k0 + k) * g->dd, g->sd, hi - lo, &sv);
         if (st == LM_OK) st = lm_copy_(dv, sv);
         if (dv) lm_tensor_free(dv);
         if (sv) lm_tensor_free(sv);
         dv = NULL;
      }
      /* the output depths whose tap falls in the padding read zeros */
      if (st == LM_OK && lo > 0) {
         st = view4_taps(p, g, nk, 0, k, lo, &dv);
         if (st == LM_OK) st = lm_fill_(dv, 0.0);
         if (dv) lm_tensor_free(dv);
         dv = NULL;
      }
      if (st == LM_OK && hi < g->Do) {
         st = view4_taps(p, g, nk, hi, k, g->Do - hi, &dv);
         if (st == LM_OK) st = lm_fill_(dv, 0.0);
         if (dv) lm_tensor_free(dv);
      }
   }
   if (st != LM_OK) {
      lm_tensor_free(p);
      return st;
   }
   *out = p;
   return LM_OK;
}

/* the depth tap that reads every input depth exactly once (stride 1, as many output depths as
   input depths, kd*dd == pd: the centre tap of a "same" temporal kernel), or -1. Its gradient is
   copied into grad_x first and the other taps' added, which saves zeroing grad_x (the
   (2+1)-D temporal 3x1x1 backward: one pass of five over grad_x). */
static int64_t full_tap(const c3_geom *g) {
   if (g->sd != 1 || g->Do != g->D || g->pd % g->dd != 0 || g->pd / g->dd >= g->kd) return -1;
   return g->pd / g->dd;
}

/* grad_x += the gradient gp (N*Do, nk*C, H, W) of the taps k0 .. k0+nk-1 (gather_taps'
   layout), each tap's slice added into the input depths it read; tap `assign` (when among them)
   first and copied instead of added (see full_tap) */
static lm_status scatter_taps(lm_tensor *gx, const lm_tensor *gp, const c3_geom *g, int64_t k0,
                              int64_t nk, int64_t assign) {
   lm_status st = LM_OK;
   const int have = assign >= k0 && assign < k0 + nk;
   for (int64_t i = 0; i < nk && st == LM_OK; i++) {
      /* the assigned tap first, then the others in order */
      const int64_t k = !have ? i : i == 0 ? assign - k0 : i <= assign - k0 ? i - 1 : i;
      int64_t lo, hi;
      tap_range(g, k0 + k, &lo, &hi);
      if (hi <= lo) continue;
      lm_tensor *sv = NULL, *dv = NULL;
      st = view4_taps(gp, g, nk, lo, k, hi - lo, &sv);
      if (st == LM_OK)
         st = view5_taps(gx, g, lo * g->sd - g->pd + (k0 + k) * g->dd, g->sd, hi - lo, &dv);
      if (st == LM_OK)
         st = k0 + k == assign ? lm_copy_(dv, sv) : lm_binary(LM_ADD, dv, sv, 1.0, &dv);
      if (sv) lm_tensor_free(sv);
      if (dv) lm_tensor_free(dv);
   }
   return st;
}

/* the weight of taps k0 .. k0+nk-1 as a 4-D (O, nk*Cg, kh, kw) conv2d weight
   ([o, k*Cg + c] = w[o, c, k0 + k]): a view of w for one tap (the conv2d makes it dense when it
   is not), else a copy dense in fmt2; and the 5-D view (O, Cg, nk, kh, kw) of such a tensor */
static lm_status weight_view5(const lm_tensor *p, const c3_geom *g, int64_t nk, lm_tensor **out) {
   const int64_t *s = p->strides;
   const int64_t sz[5] = {g->O, g->Cg, nk, g->kh, g->kw};
   const int64_t st[5] = {s[0], s[1], g->Cg * s[1], s[2], s[3]};
   return lm_as_strided(p, 5, sz, st, p->offset, out);
}

static lm_status weight_taps(const lm_tensor *w, const c3_geom *g, int64_t k0, int64_t nk,
                             lm_tensor **out) {
   *out = NULL;
   const int64_t *s = w->strides;
   if (nk == 1) {
      const int64_t sz[4] = {g->O, g->Cg, g->kh, g->kw};
      const int64_t st[4] = {s[0], s[1], s[3], s[4]};
      return lm_as_strided(w, 4, sz, st, w->offset + k0 * s[2], out);
   }
   const int64_t sz[4] = {g->O, nk * g->Cg, g->kh, g->kw};
   lm_tensor *p = NULL, *v = NULL;
   LM_TRY(lm_empty(4, sz, w->dtype, g->fmt2, w->device, &p));
   lm_tensor *wn = NULL;                  /* w's taps k0 .. k0+nk-1 */
   lm_status st = weight_view5(p, g, nk, &v);
   if (st == LM_OK) st = lm_narrow(w, 2, k0, nk, &wn);
   if (st == LM_OK) st = lm_copy_(v, wn);
   if (v) lm_tensor_free(v);
   if (wn) lm_tensor_free(wn);
   if (st != LM_OK) {
      lm_tensor_free(p);
      return st;
   }
   *out = p;
   return LM_OK;
}

/* one conv2d per depth tap (accumulating through the conv2d's residual) or one over all taps
   packed side by side. Measured (r3d_18's 3x3x3 layers at 2 clips of 8x112x112, 2 threads,
   AVX-512, forward / forward+backward ms, packed -> per tap): channels_last_3d 64 channels at
   8x56x56 110 -> 52 / 283 -> 163, 128 at 4x28x28 54 -> 24 / 160 -> 156 (the NHWC Winograd of
   up to 128 channels), but 256 at 2x14x14 27 -> 59 and 512 at 1x7x7 29 -> 48 (the direct kernel
   prefers the longer reduction over few pixels); NCDHW (im2col + GEMM) is slower per tap at
   every size. A kernel without spatial extent (the (2+1)-D temporal 3x1x1) is one pointwise
   GEMM either way and packs (no partial sums). float16 / bfloat16 always pack: per tap, each
   partial sum (and each tap's share of grad_x) would be rounded to the dtype, not the result
   once as PyTorch does (spec/amx_spec.lua's conv3d block saw 3.4e-4 of a 4.8 output past one
   rounding's tolerance). LUMEN_CONV3D_SPLIT=0/1 forces one way (tests, benchmarks; float32 and
   float64). */
static int split_taps(const c3_geom *g, int dtype) {
   if (!lm_impl_on(LM_IMPL_CONV3D_PER_TAP)) return 0;
   if (dtype != LM_FLOAT32 && dtype != LM_FLOAT64) return 0;
   const char *e = getenv("LUMEN_CONV3D_SPLIT");
   if (e && (e[0] == '0' || e[0] == '1')) return g->nt > 1 && e[0] == '1';
   return g->nt > 1 && g->fmt == LM_CHANNELS_LAST_3D && g->kh * g->kw > 1 && g->Cg >= 16 &&
          g->Cg <= 128;
}

/* ---------------------------------------------------------------------------------------------
 * Depth-only kernels (kd x 1 x 1: the (2+1)-D temporal convolutions) on channels_last_3d: GEMMs
 * on the data in place. In NDHWC the depths od0..od1 of one clip are one row-major matrix
 * ((od1-od0)*H*W, C), so tap k adds x[n, od0+k*dd-pd ...] (M x C) @ w[:, :, k]^T (C x O) into
 * y[n, od0 ...] (M x O) with lm_addmm_: no gathered copy at all. Measured (2 clips of
 * 144x8x56x56 -> 64, 3x1x1, 2 threads): forward 55.8 ms packed (the gather is 3x the input)
 * against PyTorch's 13.9. LUMEN_CONV3D_GEMM=0 turns it off.
 */
static int temporal_gemm(const c3_geom *g, int dtype) {
   if (!lm_impl_on(LM_IMPL_CONV3D_GEMM)) return 0; /* also LUMEN_CONV3D_GEMM=0 */
   /* float16 / bfloat16 keep the conv2d route: one rounding of a float32 sum (the taps' GEMMs
      would round each partial sum into the output) */
   return (dtype == LM_FLOAT32 || dtype == LM_FLOAT64) && g->fmt == LM_CHANNELS_LAST_3D && g->kh == 1 && g->kw == 1 && g->G == 1 &&
          g->sd == 1 && g->nt >= 2 && g->st2[0] == 1 && g->st2[1] == 1 && g->pd2[0] == 0 &&
          g->pd2[1] == 0;
}

/* no result shares memory with an input (lm_addmm_ refuses that; the conv2d route copies) */
static int no_alias(lm_tensor *const *outs, int nouts, const lm_tensor *const *ins, int nins) {
   for (int i = 0; i < nouts; i++)
      for (int j = 0; outs[i] && j < nins; j++)
         if (ins[j] && outs[i]->numel > 0 && lm_tensor_same_storage(outs[i], ins[j])) return 0;
   return 1;
}

/* the rows (depths d0 .. d0+nd-1 of clip n) of a dense channels_last_3d tensor t (N, C, D, H, W)
   as the matrix (nd*H*W, C); transposed: (C, nd*H*W) */
static lm_status rows_view(const lm_tensor *t, int64_t n, int64_t d0, int64_t nd, int transpose,
                           lm_tensor **out) {
   const int64_t C = t->sizes[1], M = nd * t->sizes[3] * t->sizes[4];
   const int64_t off = t->offset + n * t->strides[0] + d0 * t->strides[2];
   const int64_t sz[2] = {transpose ? C : M, transpose ? M : C};
   const int64_t st[2] = {transpose ? 1 : C, transpose ? C : 1};
   return lm_as_strided(t, 2, sz, st, off, out);
}

/* tap k of a (O, C, kD, 1, 1) weight as the matrix (O, C), or transposed (C, O) */
static lm_status tap_matrix(const lm_tensor *w, int64_t k, int transpose, lm_tensor **out) {
   const int64_t *s = w->strides;
   const int64_t sz[2] = {transpose ? w->sizes[1] : w->sizes[0],
                          transpose ? w->sizes[0] : w->sizes[1]};
   const int64_t st[2] = {transpose ? s[1] : s[0], transpose ? s[0] : s[1]};
   return lm_as_strided(w, 2, sz, st, w->offset + k * s[2], out);
}

/* c += a @ b over the clips and live taps: the three products of a temporal convolution.
   which 0: y += x_k @ w_k^T; 1: grad_x_k += g @ w_k; 2: grad_w_k += g^T @ x_k (c is the
   (O, C) tap matrix of grad_w then, the per-clip rows otherwise) */
static lm_status temporal_products(const c3_geom *g, int which, const lm_tensor *x,
                                   const lm_tensor *w, const lm_tensor *gy, lm_tensor *c) {
   lm_status st = LM_OK;
   for (int64_t k = g->t0; k < g->t0 + g->nt && st == LM_OK; k++) {
      int64_t lo, hi;
      tap_range(g, k, &lo, &hi);
      if (hi <= lo) continue;
      const int64_t id0 = lo - g->pd + k * g->dd;
      for (int64_t n = 0; n < g->N && st == LM_OK; n++) {
         lm_tensor *a = NULL, *b = NULL, *o = NULL;
         if (which == 0) {
            st = rows_view(x, n, id0, hi - lo, 0, &a);
            if (st == LM_OK) st = tap_matrix(w, k, 1, &b);
            if (st == LM_OK) st = rows_view(c, n, lo, hi - lo, 0, &o);
         } else if (which == 1) {
            st = rows_view(gy, n, lo, hi - lo, 0, &a);
            if (st == LM_OK) st = tap_matrix(w, k, 0, &b);
            if (st == LM_OK) st = rows_view(c, n, id0, hi - lo, 0, &o);
         } else {
            st = rows_view(gy, n, lo, hi - lo, 1, &a);
            if (st == LM_OK) st = rows_view(x, n, id0, hi - lo, 0, &b);
            if (st == LM_OK) st = tap_matrix(c, k, 0, &o);
         }
         if (st == LM_OK) st = lm_addmm_(o, a, b);
         if (a) lm_tensor_free(a);
         if (b) lm_tensor_free(b);
         if (o) lm_tensor_free(o);
      }
   }
   return st;
}

/* x dense in channels_last_3d: itself, or a copy (*tmp) */
static lm_status dense_cl3d(const lm_tensor *x, const lm_tensor **xd, lm_tensor **tmp) {
   return dense_in_format(x, LM_CHANNELS_LAST_3D, xd, tmp);
}

/* y = act(y) in place, as the elementwise op of the same name computes it */
static lm_status act_in_place(int act, lm_tensor *y) {
   switch (act) {
   case LM_ACT_NONE: return LM_OK;
   case LM_ACT_RELU6: return lm_clamp(y, 0.0, 6.0, 1, 1, &y);
   case LM_ACT_RELU: return lm_unary(LM_RELU, y, &y);
   case LM_ACT_SILU: return lm_unary(LM_SILU, y, &y);
   case LM_ACT_HARDSWISH: return lm_unary(LM_HARDSWISH, y, &y);
   case LM_ACT_HARDSIGMOID: return lm_unary(LM_HARDSIGMOID, y, &y);
   case LM_ACT_SIGMOID: return lm_unary(LM_SIGMOID, y, &y);
   case LM_ACT_GELU: return lm_unary(LM_GELU, y, &y);
   case LM_ACT_GELU_TANH: return lm_unary(LM_GELU_TANH, y, &y);
   default: return lm_error(LM_ERR_ARG, "conv3d: unknown epilogue activation %d", act);
   }
}

/* y = act(residual + bias + sum_k taps) with y dense channels_last_3d */
static lm_status temporal_forward(const c3_geom *g, const lm_tensor *x, const lm_tensor *w,
                                  const lm_tensor *bias, int act, const lm_tensor *residual,
                                  lm_tensor *y) {
   const lm_tensor *xd = NULL;
   lm_tensor *xt = NULL, *be = NULL;
   lm_status st = dense_cl3d(x, &xd, &xt);
   if (st == LM_OK && bias) {
      const int64_t zs[5] = {0, bias->strides[0], 0, 0, 0};
      st = lm_as_strided(bias, 5, y->sizes, zs, bias->offset, &be);
   }
   if (st == LM_OK) {
      if (residual) {
         st = lm_copy_(y, residual);
         if (st == LM_OK && be) st = lm_binary(LM_ADD, y, be, 1.0, &y);
      } else {
         st = be ? lm_copy_(y, be) : lm_fill_(y, 0.0);
      }
   }
   if (st == LM_OK) st = temporal_products(g, 0, xd, w, NULL, y);
   if (st == LM_OK && act) st = act_in_place(act, y);
   if (xt) lm_tensor_free(xt);
   if (be) lm_tensor_free(be);
   return st;
}

/* the gradients (each may be NULL) of a temporal convolution; gx, gw dense channels_last_3d */
static lm_status temporal_backward(const c3_geom *g, const lm_tensor *x, const lm_tensor *w,
                                   const lm_tensor *gy, lm_tensor *gx, lm_tensor *gw,
                                   lm_tensor *gb) {
   const lm_tensor *xd = NULL, *gd = NULL;
   lm_tensor *xt = NULL, *gt = NULL, *sum = NULL;
   lm_status st = dense_cl3d(gy, &gd, &gt);
   if (st == LM_OK && gw) st = dense_cl3d(x, &xd, &xt);
   if (st == LM_OK && gb) {
      const int dims[4] = {0, 2, 3, 4};
      st = lm_reduce(LM_SUM, gd, dims, 4, 0, gy->dtype, &sum, NULL);
      if (st == LM_OK) st = lm_copy_(gb, sum);
   }
   if (st == LM_OK && gw) {
      st = lm_fill_(gw, 0.0);
      if (st == LM_OK) st = temporal_products(g, 2, xd, NULL, gd, gw);
   }
   if (st == LM_OK && gx) {
      st = lm_fill_(gx, 0.0);
      if (st == LM_OK) st = temporal_products(g, 1, NULL, w, gd, gx);
   }
   if (xt) lm_tensor_free(xt);
   if (gt) lm_tensor_free(gt);
   if (sum) lm_tensor_free(sum);
   return st;
}

static void free_all(lm_tensor **ts, int n) {
   for (int i = 0; i < n; i++)
      if (ts[i]) lm_tensor_free(ts[i]);
}

/* LM_OP_CONV3D where the device runs this convolution natively (its supports_op says so: on
   the CPU, bfloat16 on AMX tiles, kernels/cpu/conv.c) -- channels_last_3d, every depth tap live
   (a short clip's dead taps are skipped by the conv2d route instead), tensors dense in
   channels_last_3d, no result sharing memory with an input. 1: it ran (*st its status), 0: the
   conv2d route runs it. */
static int native_conv3d(const c3_geom *g, const lm_tensor *x, const lm_tensor *w,
                         const lm_tensor *bias, const lm_tensor *residual, int act, lm_tensor *out,
                         lm_status *st) {
   if (g->fmt != LM_CHANNELS_LAST_3D || g->kd < 2 || g->nt != g->kd || g->t0 != 0) return 0;
   if (!lm_is_contiguous(x, LM_CHANNELS_LAST_3D) || !lm_is_contiguous(w, LM_CHANNELS_LAST_3D) ||
       !lm_is_contiguous(out, LM_CHANNELS_LAST_3D) ||
       (residual && !lm_is_contiguous(residual, LM_CHANNELS_LAST_3D)))
      return 0;
   const lm_tensor *ins[4] = {x, w, bias, residual};
   if (!no_alias(&out, 1, ins, 4)) return 0;
   lm_conv3d_params p;
   memset(&p, 0, sizeof p);
   conv_geom *c = &p.g3.g;
   c->N = g->N, c->C = g->C, c->H = g->H, c->W = g->W;
   c->O = g->O, c->Ho = g->Ho, c->Wo = g->Wo, c->kh = g->kh, c->kw = g->kw;
   c->sh = g->st2[0], c->sw = g->st2[1], c->ph = g->pd2[0], c->pw = g->pd2[1];
   c->dh = g->dl2[0], c->dw = g->dl2[1];
   c->G = g->G, c->Cg = g->Cg, c->Og = g->O / g->G, c->K = g->Cg * g->kd * g->kh * g->kw;
   p.g3.D = g->D, p.g3.Do = g->Do, p.g3.kd = g->kd, p.g3.sd = g->sd, p.g3.pd = g->pd;
   p.g3.dd = g->dd;
   p.act = act;
   lm_tensor *ts[5] = {(lm_tensor *)x, (lm_tensor *)w, (lm_tensor *)bias, (lm_tensor *)residual,
                       out};
   const lm_op op = lm_op_make(LM_OP_CONV3D, 5, ts, &p);
   if (!lm_op_supported(&op)) return 0;
   *st = lm_dispatch(&op);
   return 1;
}

static lm_status conv3d_forward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t groups, int fmt, int act,
                                const lm_tensor *residual, lm_tensor **out);

/* A strided 1x1x1 kernel without padding (the downsampling shortcuts of r3d_18's layers 2-4)
   reads one input pixel in sd * sh * sw: it runs as the stride-1 convolution of the strided
   view of x, so that the conv2d route gathers only those pixels (a quarter of the depths'
   planes' copy at stride 2), then one GEMM. r3d_18's 64 -> 128 shortcut (2 clips, 8x56x56,
   bfloat16, 2 threads, 50 calls, old and new library alternated three times): 0.94-1.03 ->
   0.76 ms a call (a copy of every even depth's whole plane, then the strided GEMM, before) */
lm_status lm_conv3d(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, int fmt, int act, const lm_tensor *residual,
                    lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   c3_geom g;
   LM_TRY(c3_check(x, w, bias, stride, padding, dilation, groups, fmt, &g));
   if (g.kd == 1 && g.kh == 1 && g.kw == 1 && g.pd == 0 && g.pd2[0] == 0 && g.pd2[1] == 0 &&
       (g.sd > 1 || g.st2[0] > 1 || g.st2[1] > 1) && g.N * g.C * g.Do * g.Ho * g.Wo > 0) {
      const int64_t *s = x->strides;
      const int64_t sz[5] = {g.N, g.C, g.Do, g.Ho, g.Wo};
      const int64_t st[5] = {s[0], s[1], g.sd * s[2], g.st2[0] * s[3], g.st2[1] * s[4]};
      lm_tensor *xs = NULL;
      LM_TRY(lm_as_strided(x, 5, sz, st, x->offset, &xs));
      const lm_status r =
         conv3d_forward(xs, w, bias, NULL, NULL, NULL, groups, g.fmt, act, residual, out);
      lm_tensor_free(xs);
      return r;
   }
   return conv3d_forward(x, w, bias, stride, padding, dilation, groups, fmt, act, residual, out);
}

static lm_status conv3d_forward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *dilation, int64_t groups, int fmt, int act,
                                const lm_tensor *residual, lm_tensor **out) {
   if (act < 0 || act >= LM_NUM_ACT)
      return lm_error(LM_ERR_ARG, "conv3d: unknown epilogue activation %d", act);
   c3_geom g;
   LM_TRY(c3_check(x, w, bias, stride, padding, dilation, groups, fmt, &g));
   const int64_t osz[5] = {g.N, g.O, g.Do, g.Ho, g.Wo};
   if (residual) {
      LM_TRY(lm_check_same_device(x, residual, "conv3d residual"));
      if (residual->dtype != x->dtype)
         return lm_error(LM_ERR_DTYPE, "input type (%s) and residual type (%s) should be the same",
                         lm_dtype_name(x->dtype), lm_dtype_name(residual->dtype));
      if (residual->ndim != 5 || memcmp(residual->sizes, osz, sizeof osz) != 0) {
         char s1[160], s2[160];
         fmt_sizes(s1, sizeof s1, residual);
         lm_format_shape(s2, sizeof s2, 5, osz);
         return lm_error(LM_ERR_SHAPE, "residual of size %s does not match the output size %s",
                         s1, s2);
      }
   }
   out_slot o;
   LM_TRY(out_open(&o, out, 5, osz, x->dtype, g.fmt, x->device, "conv3d"));
   if (o.t->numel == 0) return out_close(&o, out, LM_OK);
   {
      lm_status nst = LM_OK;
      if (native_conv3d(&g, x, w, bias, residual, act, o.t, &nst)) return out_close(&o, out, nst);
      const lm_tensor *ins[4] = {x, w, bias, residual};
      if (temporal_gemm(&g, x->dtype) && no_alias(&o.t, 1, ins, 4)) {
         lm_impl_plan(LM_IMPL_CONV3D_GEMM, "conv3d", x, w);
         return out_close(&o, out, temporal_forward(&g, x, w, bias, act, residual, o.t));
      }
   }
   const int split = split_taps(&g, x->dtype);
   lm_impl_plan(split ? LM_IMPL_CONV3D_PER_TAP : LM_IMPL_CONV3D_PACKED, "conv3d", x, w);
   const int64_t calls = split ? g.nt : 1, nk = split ? 1 : g.nt;
   /* tmp: the taps' input and weight, the residual folded, the final conv2d output (a view of
      the result in channels_last_3d, else an NCHW tensor), the partial sums of the taps
      (two, alternating with the final output so that a conv2d's residual is never its
      output), a 5-D view */
   lm_tensor *tmp[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
   lm_status st = LM_OK;
   if (residual) st = fold(residual, g.fmt2, &tmp[2]);
   if (st == LM_OK && g.fmt == LM_CHANNELS_LAST_3D) st = fold_view(o.t, &tmp[3]);
   const int direct = tmp[3] != NULL;     /* the conv2d writes the result in place */
   const int64_t s4[4] = {g.N * g.Do, g.O, g.Ho, g.Wo};
   if (st == LM_OK && calls > 1) st = lm_empty(4, s4, x->dtype, g.fmt2, x->device, &tmp[4]);
   if (st == LM_OK && calls > 2) st = lm_empty(4, s4, x->dtype, g.fmt2, x->device, &tmp[5]);
   const lm_tensor *prev = tmp[2];        /* the residual of the next conv2d */
   for (int64_t c = 0; c < calls && st == LM_OK; c++) {
      st = gather_taps(x, &g, g.t0 + c * nk, nk, &tmp[0]);
      if (st == LM_OK) st = weight_taps(w, &g, g.t0 + c * nk, nk, &tmp[1]);
      /* the last call writes the result; the others a partial sum, alternately tmp[4], tmp[5] */
      lm_tensor **dst = c == calls - 1 ? &tmp[3] : &tmp[4 + (c & 1)];
      if (st == LM_OK)
         st = lm_conv2d(tmp[0], tmp[1], c == 0 ? bias : NULL, g.st2, g.pd2, g.dl2, groups, g.fmt2,
                        c == calls - 1 ? act : 0, prev, dst);
      prev = *dst;
      free_all(tmp, 2);
      tmp[0] = tmp[1] = NULL;
   }
   if (st == LM_OK && !direct) {
      st = unfold_view(tmp[3], g.N, g.Do, &tmp[6]);
      if (st == LM_OK) st = lm_copy_(o.t, tmp[6]);
   }
   free_all(tmp, 7);
   return out_close(&o, out, st);
}

lm_status lm_conv3d_backward(const lm_tensor *x, const lm_tensor *w, const lm_tensor *grad_out,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups, int fmt,
                             lm_tensor **grad_x, lm_tensor **grad_w, lm_tensor **grad_b) {
   c3_geom g;
   LM_TRY(c3_check(x, w, NULL, stride, padding, dilation, groups, fmt, &g));
   LM_CHECK_TENSOR(grad_out, "grad_output");
   LM_TRY(lm_check_same_device(x, grad_out, "conv3d grad_output"));
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "input type (%s) and grad_output type (%s) should be the same",
                      lm_dtype_name(x->dtype), lm_dtype_name(grad_out->dtype));
   const int64_t osz[5] = {g.N, g.O, g.Do, g.Ho, g.Wo};
   if (grad_out->ndim != 5 || memcmp(grad_out->sizes, osz, sizeof osz) != 0) {
      char s1[160], s2[160];
      fmt_sizes(s1, sizeof s1, grad_out);
      lm_format_shape(s2, sizeof s2, 5, osz);
      return lm_error(LM_ERR_SHAPE, "grad_output of size %s does not match the output size %s",
                      s1, s2);
   }
   const int64_t bsz[1] = {g.O};
   out_slot ox = {NULL, NULL, 0}, ow = {NULL, NULL, 0}, ob = {NULL, NULL, 0};
   lm_status st = LM_OK;
   if (grad_x) st = out_open(&ox, grad_x, 5, x->sizes, x->dtype, g.fmt, x->device,
                             "conv3d grad_input");
   if (st == LM_OK && grad_w)
      st = out_open(&ow, grad_w, 5, w->sizes, x->dtype, g.fmt, x->device, "conv3d grad_weight");
   if (st == LM_OK && grad_b)
      st = out_open(&ob, grad_b, 1, bsz, x->dtype, LM_CONTIGUOUS, x->device, "conv3d grad_bias");
   const int empty = x->numel == 0 || grad_out->numel == 0;
   const int want_x = ox.t && ox.t->numel > 0, want_w = ow.t && ow.t->numel > 0;
   const int want_b = ob.t && ob.t->numel > 0;
   /* tmp: the taps' input (or a stand-in with its sizes when only grad_x is wanted) and weight,
      grad_out folded, the conv2d's grad_x, grad_w, grad_b, a 5-D view, the stand-in's element */
   lm_tensor *tmp[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
   if (st == LM_OK && empty) {
      if (ox.t) st = lm_fill_(ox.t, 0.0);
      if (st == LM_OK && ow.t) st = lm_fill_(ow.t, 0.0);
      if (st == LM_OK && ob.t) st = lm_fill_(ob.t, 0.0);
   } else if (st == LM_OK && (want_x || want_w || want_b) && temporal_gemm(&g, x->dtype) &&
              no_alias((lm_tensor *const[]){ox.t, ow.t, ob.t}, 3,
                       (const lm_tensor *const[]){x, w, grad_out}, 3)) {
      lm_impl_plan(LM_IMPL_CONV3D_GEMM, "conv3d_backward", x, w);
      st = temporal_backward(&g, x, w, grad_out, want_x ? ox.t : NULL, want_w ? ow.t : NULL,
                             want_b ? ob.t : NULL);
   } else if (st == LM_OK && (want_x || want_w || want_b)) {
      const int split = split_taps(&g, x->dtype);
      lm_impl_plan(split ? LM_IMPL_CONV3D_PER_TAP : LM_IMPL_CONV3D_PACKED, "conv3d_backward", x, w);
      const int64_t calls = split ? g.nt : 1, nk = split ? 1 : g.nt;
      st = fold(grad_out, g.fmt2, &tmp[2]);
      if (!want_w) {
         const int64_t one = 1;
         if (st == LM_OK) st = lm_empty(1, &one, x->dtype, LM_CONTIGUOUS, x->device, &tmp[7]);
      }
      /* one tap of stride 1 without depth padding reads x's depths one for one: the conv2d
         writes grad_x through its folded view (in place when that view is dense) */
      int x_direct = want_x && g.kd == 1 && g.pd == 0 && g.sd == 1;
      /* the taps' gradients add up in grad_x: it starts from zero, or from the copy of the tap
         that reads every input depth once (full_tap) */
      /* the taps that read only padding get no gradient */
      if (st == LM_OK && want_w && g.nt < g.kd) st = lm_fill_(ow.t, 0.0);
      const int64_t kf = want_x && !x_direct ? full_tap(&g) : -1;
      /* 16-bit grad_x of several depth taps: they add up in a float32 accumulator, rounded
         once at the end as PyTorch's (bfloat16 sums of the taps were 2.3x its error:
         spec/peer_ops_spec.lua's half comparison) */
      lm_tensor *acc = NULL;
      if (st == LM_OK && want_x && !x_direct && g.kd > 1 &&
          (x->dtype == LM_BFLOAT16 || x->dtype == LM_FLOAT16))
         st = lm_empty_like(ox.t, LM_FLOAT32, LM_PRESERVE, &acc);
      lm_tensor *gx = acc ? acc : ox.t;
      if (st == LM_OK && want_x && !x_direct && kf < 0) st = lm_fill_(gx, 0.0);
      for (int64_t i = 0; i < calls && st == LM_OK; i++) {
         /* one call per tap: the tap kf's call first (its gradient is copied, see full_tap) */
         const int64_t cf = kf - g.t0;    /* kf's call */
         const int64_t c = calls == 1 || kf < 0 ? i : i == 0 ? cf : i <= cf ? i - 1 : i;
         const int64_t k0 = g.t0 + c * nk;
         if (want_w) {
            st = gather_taps(x, &g, k0, nk, &tmp[0]);
         } else {
            /* the conv2d needs the input's sizes only: a broadcast element stands in */
            const int64_t sz[4] = {g.N * g.Do, nk * g.C, g.H, g.W}, zs[4] = {0, 0, 0, 0};
            st = lm_as_strided(tmp[7], 4, sz, zs, 0, &tmp[0]);
         }
         if (st == LM_OK) st = weight_taps(w, &g, k0, nk, &tmp[1]);
         if (st == LM_OK && x_direct) {
            st = fold_view(ox.t, &tmp[3]);
            if (st == LM_OK && !tmp[3]) {
               x_direct = 0;
               st = lm_fill_(ox.t, 0.0);
            }
         }
         /* grad_w of these taps: written through a view of grad_w (the conv2d copies into it
            when the view is not dense) */
         if (st == LM_OK && want_w) {
            if (nk == 1) {
               const int64_t *s = ow.t->strides;
               const int64_t sz[4] = {g.O, g.Cg, g.kh, g.kw}, sv[4] = {s[0], s[1], s[3], s[4]};
               st = lm_as_strided(ow.t, 4, sz, sv, ow.t->offset + k0 * s[2], &tmp[4]);
            }
         }
         const int b_now = want_b && c == 0;
         if (st == LM_OK && b_now) st = lm_alias(ob.t, &tmp[5]);
         if (st == LM_OK)
            st = lm_conv2d_backward(tmp[0], tmp[1], tmp[2], g.st2, g.pd2, g.dl2, groups, g.fmt2,
                                    want_x ? &tmp[3] : NULL, want_w ? &tmp[4] : NULL,
                                    b_now ? &tmp[5] : NULL);
         if (st == LM_OK && want_w && nk > 1) {
            lm_tensor *gwn = NULL;           /* grad_w's taps k0 .. k0+nk-1 */
            st = weight_view5(tmp[4], &g, nk, &tmp[6]);
            if (st == LM_OK) st = lm_narrow(ow.t, 2, k0, nk, &gwn);
            if (st == LM_OK) st = lm_copy_(gwn, tmp[6]);
            if (gwn) lm_tensor_free(gwn);
         }
         if (st == LM_OK && want_x && !x_direct)
            st = scatter_taps(gx, tmp[3], &g, k0, nk, kf);
         free_all(tmp, 2);
         free_all(&tmp[3], 4);
         tmp[0] = tmp[1] = tmp[3] = tmp[4] = tmp[5] = tmp[6] = NULL;
      }
      if (acc) {
         if (st == LM_OK) st = lm_copy_(ox.t, acc);
         lm_tensor_free(acc);
      }
   }
   free_all(tmp, 8);
   st = out_close(&ox, grad_x, st);
   st = out_close(&ow, grad_w, st);
   return out_close(&ob, grad_b, st);
}
