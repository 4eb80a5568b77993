/* conv_internal.h -- shared by the convolution kernels (conv.c, conv_tmpl.c, conv_*_avx512.c,
 * conv_*_avx512bf16.c, conv_bf16_amx.c). Not part of the FFI header. */
#ifndef LUMEN_CONV_INTERNAL_H
#define LUMEN_CONV_INTERNAL_H
#include "internal.h"
#include "ops/conv.h"
#include <stdlib.h>
#include <stdint.h>
#include <xmmintrin.h>

#if defined(__GNUC__)
#define LM_CONV_HIDDEN __attribute__((visibility("hidden")))
#else
#define LM_CONV_HIDDEN
#endif

/* conv_geom, the geometry the front end works out, is in ops/conv.h */

/* a 1x1 / stride 1 / no padding convolution reads its input as a matrix, in place */
static inline int conv_is_pointwise(const conv_geom *g) {
   return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

static inline int conv_is_depthwise(const conv_geom *g) {
   return g->G > 1 && g->Cg == 1 && g->Og == 1;
}

/* output positions o in [*lo, *hi) whose input position o*s - p + off lies in [0, n_in) */
static inline void conv_valid_range(int64_t n_in, int64_t n_out, int64_t s, int64_t p,
                                    int64_t off, int64_t *lo, int64_t *hi) {
   const int64_t a = p - off, b = n_in - 1 + p - off;
   int64_t l = a > 0 ? (a + s - 1) / s : 0;
   int64_t h = b < 0 ? 0 : b / s + 1;
   if (h > n_out) h = n_out;
   if (l > h) l = h;
   *lo = l;
   *hi = h;
}

/* threads for a problem of `work` multiply-adds: 1 inside a parallel region or for small work */
static inline int conv_threads(double work) {
#ifdef _OPENMP
   if (omp_in_parallel()) return 1;
   int n = omp_get_max_threads();
   if (work < 65536.0) return 1;
   return n < 1 ? 1 : n;
#else
   (void)work;
   return 1;
#endif
}

static inline int conv_thread_id(void) {
#ifdef _OPENMP
   return omp_get_thread_num();
#else
   return 0;
#endif
}

static inline int conv_num_threads_in_team(void) {
#ifdef _OPENMP
   return omp_get_num_threads();
#else
   return 1;
#endif
}

/* ---- AVX-512 float32 NHWC direct kernels (conv_direct_f32_avx512.c) ----
 * x, out, gout, gx: NHWC dense; w, gw: (O, kh, kw, Cg) dense (channels-last weights); bias, res,
 * gb may be NULL. Depthwise convolutions take the lm_conv_dw_* kernels below. conv.c registers
 * the kernels that call them only when lm_cpu_isa() is AVX-512 (so lm_cpu_set_isa(LM_ISA_C or
 * LM_ISA_AVX2) also exercises the portable path). */
LM_CONV_HIDDEN lm_status lm_conv_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                 const float *w, const float *bias,
                                                 const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                  const float *w, float *gx);
LM_CONV_HIDDEN lm_status lm_conv_bwdw_nhwc_avx512(const conv_geom *g, const float *x,
                                                  const float *gout, float *gw, float *gb);

/* depthwise (groups == C == O), NHWC; gw is (C, 1, kh, kw) */
LM_CONV_HIDDEN lm_status lm_conv_dw_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                    const float *w, const float *bias,
                                                    const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_dw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                     const float *w, float *gx);
LM_CONV_HIDDEN lm_status lm_conv_dw_bwdw_nhwc_avx512(const conv_geom *g, const float *x,
                                                     const float *gout, float *gw, float *gb);

/* ---- pointwise (1x1, stride 1, no padding, groups 1) float32 NHWC (conv_pointwise_f32_avx512.c)
 * the input read in place as a pixels x channels matrix; lm_conv_pw_usable says whether they
 * take a geometry (backward_data: the reduction runs over O). LUMEN_CONV_PW=0 turns them off.
 * stream (may be NULL): in, nonzero when the output is a whole allocator block that was cold
 * when handed out (lm_tensor_block_cold); out, nonzero when the kernel wrote it with streaming
 * stores (the caller then notes it, lm_tensor_note_streamed). out16: NULL, or the forward
 * writes its results there as bfloat16 (rounded once, as lm_f2bf) instead of to out. */
LM_CONV_HIDDEN int lm_conv_pw_usable(const conv_geom *g, int backward_data);
/* x16 / res16: where non-NULL, a bfloat16 input / residual read instead of x / res (the float32
   route of a bfloat16 convolution; stride 1 only), widened a block at a time */
LM_CONV_HIDDEN lm_status lm_conv_pw_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                    const uint16_t *x16, const float *w,
                                                    const float *bias, const float *res,
                                                    const uint16_t *res16, int act, float *out,
                                                    uint16_t *out16, int *stream);
/* gout16 / gx16: where non-NULL, bfloat16 grad_out / grad_x read and written instead (the
   float32 route of a bfloat16 call) */
LM_CONV_HIDDEN lm_status lm_conv_pw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                     const uint16_t *gout16, const float *w,
                                                     float *gx, uint16_t *gx16, int *stream);

/* ---- narrow inputs (2..4 channels, dilation 1, groups 1: an RGB stem) float32 NHWC forward
 * (conv_narrow_f32_avx512.c): each kernel row's kw*C input floats are one pointwise reduction.
 * LUMEN_CONV_NC=0 turns it off. stream: as for the pointwise kernels (never NULL). ---- */
LM_CONV_HIDDEN int lm_conv_nc_usable(const conv_geom *g);
LM_CONV_HIDDEN lm_status lm_conv_nc_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                    const float *w, const float *bias,
                                                    const float *res, int act, float *out,
                                                    int *stream);

/* ---- small groups: 4, 8 or 16 channels a group in and out, float32 NHWC
 * (conv_grouped_f32_avx512.c, "grouped_avx512"): whole groups in 16-lane blocks, block-diagonal
 * kernel, the reduction in registers. lm_conv_grp_usable: pass 0 forward, 1 backward data
 * (stride 1 only), 2 backward weight. Same arguments as the direct kernels above. ---- */
LM_CONV_HIDDEN int lm_conv_grp_usable(const conv_geom *g, int pass);
LM_CONV_HIDDEN lm_status lm_conv_grp_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                     const float *w, const float *bias,
                                                     const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_grp_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                      const float *w, float *gx);
LM_CONV_HIDDEN lm_status lm_conv_grp_bwdw_nhwc_avx512(const conv_geom *g, const float *x,
                                                      const float *gout, float *gw, float *gb);

/* ---- depthwise below AVX-512 (conv_depthwise_f32_avx2.c, "depthwise_avx2"): C a multiple of 8,
 * forward, backward data at stride 1, weight / bias gradients (kw <= 11). lm_conv_dw_avx2_usable:
 * pass 0 forward, 1 backward data, 2 backward weight. Only where the CPU has AVX2 and FMA. ---- */
/* the portable float32 NHWC forward's epilogue at AVX2 (conv_epi_f32_avx2.c): out = act(out +
   bias + res) over rows of O channels (bias, res may be NULL; act an LM_ACT_* or 0) */
LM_CONV_HIDDEN void lm_conv_epi_nhwc_f32_avx2(float *out, int64_t rows, int64_t O,
                                              const float *bias, const float *res, int act);
LM_CONV_HIDDEN int lm_conv_dw_avx2_usable(const conv_geom *g, int pass);
LM_CONV_HIDDEN lm_status lm_conv_dw_fwd_nhwc_avx2(const conv_geom *g, const float *x,
                                                  const float *w, const float *bias,
                                                  const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_dw_bwdd_nhwc_avx2(const conv_geom *g, const float *gout,
                                                   const float *w, float *gx);
LM_CONV_HIDDEN lm_status lm_conv_dw_bwdw_nhwc_avx2(const conv_geom *g, const float *x,
                                                   const float *gout, float *gw, float *gb);

/* ---- the same below AVX-512 (conv_grouped_f32_avx2.c, "grouped_avx2"): 8-lane blocks, groups
 * of 2, 4 or a multiple of 8 output channels, O a multiple of 8. lm_conv_grp_avx2_usable: pass 0
 * forward, 1 backward data (stride 1 only); lm_conv_grp_avx2_bwdw_usable: the weight gradient. Call only where the CPU has AVX2 and FMA. ---- */
LM_CONV_HIDDEN int lm_conv_grp_avx2_usable(const conv_geom *g, int pass);
LM_CONV_HIDDEN lm_status lm_conv_grp_fwd_nhwc_avx2(const conv_geom *g, const float *x,
                                                   const float *w, const float *bias,
                                                   const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_grp_bwdd_nhwc_avx2(const conv_geom *g, const float *gout,
                                                    const float *w, float *gx);
LM_CONV_HIDDEN int lm_conv_grp_avx2_bwdw_usable(const conv_geom *g);
LM_CONV_HIDDEN lm_status lm_conv_grp_bwdw_nhwc_avx2(const conv_geom *g, const float *x,
                                                    const float *gout, float *gw, float *gb);

/* ---- register-blocked float32 NHWC kernels for small channel counts
 * (conv_direct_rb_f32_avx512.c) ----
 * groups == 1; same arguments as the direct kernels above. lm_conv_rb_usable says whether they
 * take a geometry (backward_data: the reduction runs over O instead of C). */
LM_CONV_HIDDEN int lm_conv_rb_usable(const conv_geom *g, int backward_data);
LM_CONV_HIDDEN lm_status lm_conv_rb_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                    const float *w, const float *bias,
                                                    const float *res, int act, float *out);
LM_CONV_HIDDEN lm_status lm_conv_rb_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                     const float *w, float *gx);
/* backward weight (and bias) for a single input channel (C == 1, groups 1) */
LM_CONV_HIDDEN int lm_conv_rb_bwdw_usable(const conv_geom *g);
LM_CONV_HIDDEN lm_status lm_conv_rb_bwdw_nhwc_avx512(const conv_geom *g, const float *x,
                                                     const float *gout, float *gw, float *gb);

/* the register-blocked GEMM step: out[k*pitch + 16v ..] = sum_c x[k*CP + c] * w[c*OB + 16v ..]
   for pb rows k and nv vectors v (CP one of 1, 8, 16, 32, 64; pb <= lm_conv_rb_pbmax(nv); x, w,
   out 64-byte aligned, OB and pitch multiples of 16). lm_conv_rb_cp: the padded channel count
   for cin reduction channels (0: none fits). */
LM_CONV_HIDDEN int lm_conv_rb_cp(int64_t cin);
LM_CONV_HIDDEN int lm_conv_rb_pbmax(int nv);
LM_CONV_HIDDEN void lm_conv_rb_gemm(int CP, int nv, int pb, const float *x, const float *w,
                                    int64_t OB, float *out, int64_t pitch);
/* the same over nq chunks of 64 reduction channels (nq <= LM_RB_MAXCHUNKS): chunk j of row k at
   x + j*xchunk + k*64, its weights at w + j*64*OB; out = the sum over the chunks */
enum { LM_RB_MAXCHUNKS = 32 };
LM_CONV_HIDDEN void lm_conv_rb_gemm_chunks(int nq, int nv, int pb, const float *x, int64_t xchunk,
                                           const float *w, int64_t OB, float *out,
                                           int64_t pitch);

/* ---- Winograd F(4x4, 3x3) float32 NHWC (conv_winograd_f32_avx512.c): stride 1, dilation 1,
 * groups 1 ----
 * lm_conv_wino_usable says whether it takes a geometry, and whether it is expected to beat the
 * direct kernels there; LUMEN_CONV_WINOGRAD=0 in the environment turns it off. */
LM_CONV_HIDDEN int lm_conv_wino_usable(const conv_geom *g, int backward_data);
LM_CONV_HIDDEN lm_status lm_conv_wino_fwd_nhwc_avx512(const conv_geom *g, const float *x,
                                                      const float *w, const float *bias,
                                                      const float *res, int act, float *out);
/* the same with a bfloat16 input, residual (or NULL) and output and float32 weights and
   products: the float32 route of a bfloat16 call, no float32 copies of its tensors */
LM_CONV_HIDDEN lm_status lm_conv_wino_fwd_nhwc_avx512_io16(const conv_geom *g, const uint16_t *x,
                                                           const float *w, const float *bias,
                                                           const uint16_t *res, int act,
                                                           uint16_t *out);
/* and the two gradients with bfloat16 tensors (float32 w, gw, gb and products) */
LM_CONV_HIDDEN lm_status lm_conv_wino_bwdd_nhwc_avx512_io16(const conv_geom *g,
                                                            const uint16_t *gout, const float *w,
                                                            uint16_t *gx);
LM_CONV_HIDDEN lm_status lm_conv_wino_bwdw_nhwc_avx512_io16(const conv_geom *g, const uint16_t *x,
                                                            const uint16_t *gout, float *gw,
                                                            float *gb);
LM_CONV_HIDDEN lm_status lm_conv_wino_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                                       const float *w, float *gx);
/* backward weight (and the bias gradient); usable when lm_conv_wino_bwdw_usable(g): the
   forward's geometry with at most 64 input channels, or more when the transformed input and
   grad_output of all the tiles take at most 16 MB (resnet50's layers at batch 8) */
LM_CONV_HIDDEN int lm_conv_wino_bwdw_usable(const conv_geom *g);
LM_CONV_HIDDEN lm_status lm_conv_wino_bwdw_nhwc_avx512(const conv_geom *g, const float *x,
                                                       const float *gout, float *gw, float *gb);

/* bfloat16 convolutions through Winograd F(4x4, 3x3) with a bfloat16 GEMM phase
 * (conv_winograd_f32_avx512.c's schedules with the products of conv_winograd_bf16_avx512bf16.c,
 * where these entry points are): x, res, out
 * (gout, gx) and w (O, 3, 3, C) bfloat16 dense NHWC, read widened and written rounded once to
 * nearest even; bias float32 or NULL. The transforms run
 * in float32, the transformed input and weights are rounded to bfloat16 for the products, which
 * are summed in float32. lm_conv_wino_bf16_usable: F(4x4) Winograd takes the geometry and there
 * are at least 64 reduction channels (LUMEN_CONV_WINOGRAD not 0 or 2); callers also need
 * lm_cpu_isa() >= LM_ISA_AVX512_BF16. */
LM_CONV_HIDDEN int lm_conv_wino_bf16_usable(const conv_geom *g, int backward_data);
LM_CONV_HIDDEN lm_status lm_conv_wino_bf16_fwd(const conv_geom *g, const uint16_t *x,
                                               const uint16_t *w, const float *bias,
                                               const uint16_t *res, int act, uint16_t *out);
LM_CONV_HIDDEN lm_status lm_conv_wino_bf16_bwdd(const conv_geom *g, const uint16_t *gout,
                                                const uint16_t *w, uint16_t *gx);
/* the float32 file's schedules, which the bfloat16 entry points above (in
   conv_winograd_bf16_avx512bf16.c, beside their products) run with bf16 = 1: lm_wg_conv (forward,
   flip 0, or backward data, flip 1; tm: output tile 4 or 2; src, w, res, dst float32 or bfloat16
   as bf16 says), lm_wg_bwdw / lm_wg_bwdw_wide (the weight gradient's unit and wide schedules);
   lm_wg_cp: the padded reduction channels of Winograd's products (0: too many), lm_wg_tile_size:
   4, or 2 when LUMEN_CONV_WINOGRAD is "2" */
LM_CONV_HIDDEN int lm_wg_cp(int64_t cin);
LM_CONV_HIDDEN int lm_wg_tile_size(int backward_data);
LM_CONV_HIDDEN lm_status lm_wg_conv(const conv_geom *g, int flip, int tm, const void *src,
                                    const void *w, const float *bias, const void *res, int act,
                                    void *dst, int bf16);
LM_CONV_HIDDEN lm_status lm_wg_bwdw(const conv_geom *g, const void *x, const void *gout,
                                    float *gw, float *gb, int bf16);
LM_CONV_HIDDEN lm_status lm_wg_bwdw_wide(const conv_geom *g, const void *x, const void *gout,
                                         float *gw, float *gb, int bf16);
/* the pieces in winograd_gemm_avx512bf16.c: n floats of v -> n bfloat16 at vb (round to nearest
   even); U[e][64][OB] (positions ues floats apart) -> pair rows Ub[e][32][OB] (ubes words
   apart); out[k*pitch + ..] (+)= the 32 pairs of tile k (x + k*32) . the pair rows at w, for pb
   tiles and nv vectors of 16 output channels (pb <= lm_conv_rb_pbmax(nv)) */
LM_CONV_HIDDEN void lm_wg_bf16_pack_v(const float *v, uint32_t *vb, int64_t n);
LM_CONV_HIDDEN void lm_wg_bf16_pack_u(const float *u, int64_t ues, int64_t OB, uint32_t *ub,
                                      int64_t ubes);
LM_CONV_HIDDEN void lm_wg_bf16_gemm(int nv, int pb, const uint32_t *x, const uint32_t *w,
                                    int64_t OB, float *out, int64_t pitch, int first);
/* rows of len floats (ld apart) -> pair rows (ldd words apart): word i of pair row p =
   {row 2p [i], row 2p+1 [i]} (zero for the missing row of an odd count) */
LM_CONV_HIDDEN void lm_wg_bf16_pack_rows(const float *src, int64_t rows, int64_t len, int64_t ld,
                                         uint32_t *dst, int64_t ldd);
/* acc[r*ap + 16v ..] += sum over np pair rows p of x[p*xs + r] . d[p*ds + 16v ..], r < R (<= 16
   for nv 1, 8 for 2 and 3, 6 for 4), v < nv */
LM_CONV_HIDDEN void lm_wg_bf16_wgrad(int nv, int R, const uint32_t *x, int64_t xs,
                                     const uint32_t *d, int64_t ds, int64_t np, float *acc,
                                     int64_t ap);
/* the weight gradient of a bfloat16 convolution with bfloat16 products: x and gout bfloat16 dense
   NHWC (read widened), gw and gb float32 as lm_conv_wino_bwdw_nhwc_avx512's (gb from the same
   sums, x may be NULL when gw is); usable: Winograd's weight gradient takes the geometry and
   there are at least 64 input channels */
LM_CONV_HIDDEN int lm_conv_wino_bf16_bwdw_usable(const conv_geom *g);
LM_CONV_HIDDEN lm_status lm_conv_wino_bf16_bwdw(const conv_geom *g, const uint16_t *x,
                                                const uint16_t *gout, float *gw, float *gb);

/* ---- bfloat16 NHWC kernels for AVX-512 + AVX512_BF16 (conv_direct_bf16_avx512bf16.c) ----
 * x, w, res, out, gout, gx: bfloat16 (uint16_t) dense channels-last (w: (O, kh, kw, C)); bias:
 * float32 (widened by conv.c) or NULL. lm_conv_bf16_usable says whether they take a geometry
 * (groups 1; LUMEN_CONV_BF16=0 turns them off, for comparisons). conv.c calls them only when
 * lm_cpu_isa() >= LM_ISA_AVX512_BF16. Accumulation in float32, one rounding per result. */
LM_CONV_HIDDEN int lm_conv_bf16_usable(const conv_geom *g, int backward_data);
LM_CONV_HIDDEN lm_status lm_conv_fwd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *x,
                                                     const uint16_t *w, const float *bias,
                                                     const uint16_t *res, int act,
                                                     uint16_t *out);
LM_CONV_HIDDEN lm_status lm_conv_bwdd_nhwc_avx512bf16(const conv_geom *g, const uint16_t *gout,
                                                      const uint16_t *w, uint16_t *gx);

/* ---- bfloat16 NHWC kernels on AMX tiles (conv_bf16_amx.c) ----
 * Same tensors as the AVX-512 BF16 kernels above. conv.c calls them only when lm_amx_on()
 * (amx.h: lm_cpu_isa() is LM_ISA_AMX and lm.backends.cpu.amx is on) and lm_conv_amx_usable
 * takes the geometry: groups 1, at least 16 input and output channels; backward data only for
 * stride 1 (the others keep the AVX-512 kernel). LUMEN_CONV_AMX=0 turns them off. */
LM_CONV_HIDDEN int lm_conv_amx_usable(const conv_geom *g, int backward_data);
/* ... and where they pay over the float32 route (channel counts; conv_bf16_amx.c) */
LM_CONV_HIDDEN int lm_conv_amx_pays(const conv_geom *g);
/* stream: in, the output block is cold (lm_tensor_block_cold); out, it was written with
   streaming stores (lm_amx_stream decides). f32: res, out (gx) are float32 (the float32
   convolutions of lm.backends.cpu.fp32_precision = "bf16", whose x and w the caller rounded) */
LM_CONV_HIDDEN lm_status lm_conv_fwd_nhwc_amx(const conv_geom *g, const uint16_t *x,
                                              const uint16_t *w, const float *bias,
                                              const void *res, int act, void *out, int f32,
                                              int *stream);
LM_CONV_HIDDEN lm_status lm_conv_bwdd_nhwc_amx(const conv_geom *g, const uint16_t *gout,
                                               const uint16_t *w, void *gx, int f32);
/* conv3d forward, bfloat16 channels_last_3d (LM_OP_CONV3D): lm_conv3d_amx_usable takes the
   geometry (groups 1, 16+ output channels, 16+ input channels or the stem's rows); stream as
   lm_conv_fwd_nhwc_amx's */
LM_CONV_HIDDEN int lm_conv3d_amx_usable(const conv3d_geom *g3);
LM_CONV_HIDDEN lm_status lm_conv3d_fwd_ndhwc_amx(const conv3d_geom *g3, const uint16_t *x,
                                                 const uint16_t *w, const float *bias,
                                                 const uint16_t *res, int act, uint16_t *out,
                                                 int *stream);

/* The Winograd GEMM micro-kernels' prefetch of their next row block (wga_body, float32;
   wgb_body, bfloat16), one line per reduction step s: first that block's PB rows of V (row_bytes
   each, consecutive after this block's), then, unless `first` (its sums start at zero), its
   PB x NV vectors of partial sums in out (pitch floats apart), from step m0 on. A row is two or
   four lines, too short for the hardware prefetchers, and V comes from L3 (measurements at the
   callers). Addresses are computed as integers: past the last block they point beyond the
   arrays, which a prefetch may do and pointer arithmetic may not. */
static inline __attribute__((always_inline)) void
wg_prefetch_next(const void *x, int row_bytes, const float *out, int64_t pitch, int PB, int NV,
                 int s, int m0, int first) {
   if (s < PB * row_bytes / 64)
      _mm_prefetch((const char *)((uintptr_t)x + (uintptr_t)(PB * row_bytes + 64 * s)),
                   _MM_HINT_T0);
   else if (!first && s >= m0 && s < m0 + PB * NV)
      _mm_prefetch((const char *)((uintptr_t)out +
                                  (uintptr_t)((PB + (s - m0) / NV) * pitch +
                                              16 * ((s - m0) % NV)) * 4),
                   _MM_HINT_T0);
}

/* an algorithm switch from the environment: 0 when variable `name` is set to "0" (off), else 1.
   Lets the specs and benchmarks compare the paths (LUMEN_CONV_RB, LUMEN_CONV_WINOGRAD). */
static inline int conv_env_on(const char *name) {
   const char *v = getenv(name);
   return !(v && v[0] == '0' && v[1] == 0);
}

#endif
