/* impl.h -- implementation lists and LUMEN_VERBOSE (internal; src/impl.c).
 *
 * An operator family with several CPU kernels (convolutions, matmul, pools, batch norm) chooses
 * among them with an ordered implementation list, as oneDNN's primitive lists do: entries
 * {id, usable, run} tried in order, the first one that is switched on and whose usable() takes
 * the call runs. Every implementation has a stable name in LM_CPU_IMPL_LIST below (the one
 * place names are defined; docs/performance.md lists them), so that
 *   - LUMEN_VERBOSE=1 (or lm_set_verbose(1)) prints which one ran, one line per kernel call:
 *       lumen_verbose,exec,DEVICE,OP,IMPLEMENTATION,DTYPE,FORMAT,SHAPES,MS
 *     (printed by lm_dispatch, src/device.c; the kernel names itself with lm_impl_ran);
 *   - LUMEN_VERBOSE=2 also prints why each earlier entry was skipped:
 *       lumen_verbose,skip,DEVICE,OP,IMPLEMENTATION,REASON
 *   - lm_cpu_disable("name", 1) / LUMEN_CPU_DISABLE=a,b switch implementations off by name (the
 *     next entry of the list runs: the values stay those of PyTorch's semantics, the speed
 *     changes). The fallback of each list (fallback = 1 below) cannot be switched off.
 * The older per-family variables (LUMEN_CONV_WINOGRAD=0, LUMEN_CONV_PW=0, ...) stay as aliases
 * for one release: `alias` below, read at each call as they were.
 */
#ifndef LUMEN_IMPL_H
#define LUMEN_IMPL_H
#include "backend.h"
#ifdef __cplusplus
extern "C" {
#endif

/* X(ID, "name", fallback, "alias variable" or NULL, "what it is") */
#define LM_CPU_IMPL_LIST(X)                                                                      \
   /* convolutions: bfloat16 / float16 (kernels/cpu/conv.c) */                                  \
   X(CONV_AMX_BF16, "amx_bf16", 0, "LUMEN_CONV_AMX",                                             \
     "bfloat16 channels-last convolution on AMX tiles (forward, backward data)")               \
   X(CONV_WINOGRAD_BF16, "winograd_f4x4_avx512bf16", 0, "LUMEN_CONV_BF16_WINOGRAD",              \
     "bfloat16 3x3 stride-1 Winograd F(4x4,3x3) with vdpbf16ps products")                      \
   X(CONV_DIRECT_BF16, "direct_avx512bf16", 0, "LUMEN_CONV_BF16",                               \
     "bfloat16 channels-last direct convolution with vdpbf16ps (forward, backward data)")      \
   X(CONV_BWDW_BF16, "im2col_gemm_bf16", 0, NULL,                                                \
     "bfloat16 weight gradient: im2col and the bfloat16 GEMM (AMX tiles or vdpbf16ps)")        \
   X(CONV_FP32_AMX, "fp32_bf16_amx", 0, NULL,                                                    \
     "float32 convolution as bfloat16 products on AMX tiles (fp32_precision = \"bf16\")")      \
   X(CONV_VIA_F32, "via_f32", 1, NULL,                                                           \
     "float16 / bfloat16 widened to float32, the float32 kernels, rounded once")               \
   /* convolutions: float32 / float64 */                                                         \
   X(CONV_DEPTHWISE, "depthwise_avx512", 0, NULL,                                                \
     "float32 channels-last depthwise convolution (column-streaming tiles, 4-pixel blocks)")  \
   X(CONV_DEPTHWISE_AVX2, "depthwise_avx2", 0, NULL,                                             \
     "float32 channels-last depthwise convolution below AVX-512 (8-lane blocks, C % 8 == 0)")  \
   X(CONV_WINOGRAD, "winograd_f4x4_avx512", 0, "LUMEN_CONV_WINOGRAD",                            \
     "float32 channels-last 3x3 stride-1 Winograd F(4x4,3x3) (F(2x2) with LUMEN_CONV_WINOGRAD=2)") \
   X(CONV_POINTWISE, "pointwise_avx512", 0, "LUMEN_CONV_PW",                                     \
     "float32 channels-last 1x1 convolution as a GEMM on the data in place")                   \
   X(CONV_NARROW, "narrow_c_avx512", 0, "LUMEN_CONV_NC",                                         \
     "float32 channels-last forward with 2 to 4 input channels (an RGB stem)")                 \
   X(CONV_PW_STRIDED, "pointwise_strided_avx512", 0, "LUMEN_CONV_PW_STRIDED",                   \
     "float32 channels-last strided 1x1 forward: pointwise_avx512 on the gathered pixels")     \
   X(CONV_1X1_GEMM, "gemm_1x1_grads_avx512", 0, "LUMEN_CONV_BWDW_GEMM",                          \
     "float32 channels-last gradients of wide 1x1 layers as one GEMM (inside direct_avx512)")  \
   X(CONV_GROUPED, "grouped_avx512", 0, NULL,                                                    \
     "float32 channels-last convolution with 4, 8 or 16 channels a group (block-diagonal "     \
     "blocks of 16 lanes, or 8 where a group has at most 8 outputs; the reduction in "         \
     "registers)")                                                                             \
   X(CONV_GROUPED_AVX2, "grouped_avx2", 0, NULL,                                                 \
     "float32 channels-last grouped convolution below AVX-512: 2, 4 or 8k channels a group, "  \
     "8-lane blocks (forward, backward data by stride phases, weight gradient); also the "      \
     "narrow-input stems (groups 1, at most 4 channels)")                                      \
   X(CONV_DIRECT_RB, "direct_rb_avx512", 0, "LUMEN_CONV_RB",                                     \
     "float32 channels-last register-blocked direct convolution (small channel counts)")      \
   X(CONV_DIRECT, "direct_avx512", 0, NULL, "float32 channels-last direct convolution")         \
   X(CONV_IM2COL, "im2col_gemm", 1, NULL,                                                        \
     "portable: im2col (or the input in place) and the GEMM, float32 and float64, any format") \
   /* conv3d (src/ops/conv3d.c: the front end's plan, on every device; a "plan" line) */        \
   X(CONV3D_AMX_BF16, "conv3d_amx_bf16", 0, NULL,                                                \
     "bfloat16 channels_last_3d conv3d forward on AMX tiles, the depth taps inside the engine") \
   X(CONV3D_GEMM, "conv3d_temporal_gemm", 0, "LUMEN_CONV3D_GEMM",                                \
     "channels_last_3d kd x 1 x 1 conv3d as GEMMs on the data in place")                       \
   X(CONV3D_PER_TAP, "conv3d_per_tap", 0, NULL,                                                  \
     "conv3d as one conv2d per depth tap, summed through the residual")                        \
   X(CONV3D_PACKED, "conv3d_packed_taps", 1, NULL,                                               \
     "conv3d as one conv2d over the depth taps packed side by side")                           \
   /* GEMM (kernels/cpu/gemm.c, linalg.c: matmul, linear and the convolutions' GEMMs) */        \
   X(MM_FP32_AMX, "gemm_fp32_bf16_amx", 0, NULL,                                                 \
     "float32 matmul as bfloat16 products on AMX tiles (fp32_precision = \"bf16\")")           \
   X(MM_AMX_BF16, "gemm_amx_bf16", 0, NULL, "bfloat16 GEMM on AMX tiles")                        \
   X(MM_BF16, "gemm_avx512bf16", 0, NULL,                                                        \
     "bfloat16 GEMM with vdpbf16ps (else bfloat16 widened to the float32 GEMM)")               \
   X(MM_AVX512, "gemm_avx512", 0, NULL, "float32 / float64 packed GEMM, AVX-512")                \
   X(MM_AVX2, "gemm_avx2", 0, NULL, "float32 / float64 packed GEMM, AVX2 + FMA")                 \
   X(MM_PORTABLE, "gemm_portable", 1, NULL, "float32 / float64 packed GEMM, portable C")         \
   /* pools (kernels/cpu/pool.c, pool3d.c) */                                                    \
   X(POOL_AVX512, "pool_avx512", 0, NULL, "pooling with AVX-512 kernels")                        \
   X(POOL_PORTABLE, "pool_portable", 1, NULL, "pooling, portable C")                             \
   /* elementwise activations (kernels/cpu/elementwise.c; no fallback entry: without it the  \
      portable loops of ew_kernels.c run, named "default") */                                  \
   X(EW_ACT_AVX512, "ew_act_avx512", 0, NULL,                                                    \
     "float32 GELU (erf, tanh), SiLU, sigmoid, hardswish, hardsigmoid and the GELU / SiLU "    \
     "gradients on 16 lanes with FMA")                                                         \
   X(EW_ACT_AVX2, "ew_act_avx2", 0, NULL,                                                        \
     "the same float32 activations and gradients on 8 lanes (AVX2 + FMA, below AVX-512)")      \
   /* group norm over one-row samples: layer_norm (kernels/cpu/norm_group.c) */                \
   X(NORM_ROWS_AVX512, "norm_rows_avx512", 0, NULL,                                              \
     "float32 layer norm (group norm of one-row samples) on 16 lanes, two-pass in float32")     \
   X(NORM_ROWS_AVX2, "norm_rows_avx2", 0, NULL,                                                  \
     "float32 layer norm (group norm of one-row samples) on 8 lanes, below AVX-512")           \
   /* batch norm (kernels/cpu/norm.c) */                                                         \
   X(BN_AVX512, "batch_norm_avx512", 0, NULL, "batch norm with AVX-512 kernels")                 \
   X(BN_AVX2, "batch_norm_avx2", 0, NULL,                                                        \
     "batch norm below AVX-512: the float32 channels-last rows on 8 lanes")                     \
   X(BN_PORTABLE, "batch_norm_portable", 1, NULL, "batch norm, portable C")

#define LM_IMPL_ENUM_(id, name, fb, alias, doc) LM_IMPL_##id,
enum { LM_CPU_IMPL_LIST(LM_IMPL_ENUM_) LM_NUM_IMPLS };
#undef LM_IMPL_ENUM_

/* the verbose level (LUMEN_VERBOSE at start, lm_set_verbose): 0, 1 or 2 */
int lm_verbose(void);

/* is implementation id switched on (not disabled by name, nor by its alias variable = "0")? */
int lm_impl_on(int id);
/* its name */
const char *lm_impl_name(int id);

/* the kernel of the current lm_dispatch says which implementation ran (several calls in one
   kernel: joined with '+', e.g. "via_f32+winograd_f4x4_avx512"); a no-op unless verbose */
void lm_impl_ran(int id);
void lm_impl_ran_name(const char *name);
/* a one-time probe that runs kernels inside some op's dispatch (lm_cpu_bf16_dot_pays times two
   GEMMs on the first bfloat16 call) mutes the notes meanwhile, so the op's line names the op's
   kernels only: lm_impl_mute(1) ... lm_impl_mute(0), per thread, nestable */
void lm_impl_mute(int on);
/* the name of a backend's kernel that named nothing itself (e.g. "lumen_cuda"); a no-op when the
   kernel already named what ran */
void lm_impl_ran_default(const char *name);
/* verbose 2: why implementation id was not taken */
void lm_impl_skip(int id, const char *why);

/* a front end's plan (conv3d): at verbose >= 1 one line
   "lumen_verbose,plan,DEVICE,OP,IMPLEMENTATION,DTYPE,FORMAT,SHAPES" before the kernel lines */
void lm_impl_plan(int id, const char *op, const lm_tensor *x, const lm_tensor *w);

/* An implementation list: entries tried in order. usable: NULL when the entry takes ctx, else
 * the reason it does not (a short phrase for LUMEN_VERBOSE=2); NULL usable: always usable. */
typedef struct lm_impl {
   int id;
   const char *(*usable)(const void *ctx);
   lm_status (*run)(void *ctx);
} lm_impl;

/* Run the first entry that is on and usable (lm_impl_ran names it); skipped entries are
 * reported at verbose 2. An error when none is (a list ends with an always-usable fallback). */
lm_status lm_impl_run(const lm_impl *list, int n, void *ctx, const char *what);
/* The same choice without running: the index of the entry taken, or -1 */
int lm_impl_pick(const lm_impl *list, int n, const void *ctx);

/* lm_dispatch's side (src/device.c): begin before compute, end after it (prints the line) */
typedef struct lm_verbose_frame {
   double t0;
   const void *prev_op;
   int prev_device;
   char prev_note[160];
} lm_verbose_frame;
void lm_verbose_begin(lm_verbose_frame *f, const lm_op *op, int device);
void lm_verbose_end(lm_verbose_frame *f, const lm_op *op, int device, lm_status st);

#ifdef __cplusplus
}
#endif
#endif
