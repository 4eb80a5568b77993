/* conv_bf16.h -- bfloat16 convolution kernels on the bf16 GEMM (kernels/cpu/gemm.c,
 * gemm_avx512bf16.c). Called by the convolution dispatch (kernels/cpu/conv.c).
 *
 * lm_conv_bwdw_nhwc_bf16 (conv_bwdw_bf16_avx512bf16.c): the weight (and bias) gradient of a 2-D
 * convolution, channels-last:
 *   x    (N, H, W, C)   dense NHWC bfloat16 input;
 *   gout (N, Ho, Wo, O) dense NHWC bfloat16 gradient of the output;
 *   gw   (O, kh, kw, Cg) dense float32, OVERWRITTEN (not accumulated): for o in group gi,
 *        gw[o][i][j][c] = sum over n, ho, wo of gout[n][ho][wo][o] *
 *                         x[n][ho*sh - ph + i*dh][wo*sw - pw + j*dw][gi*Cg + c] (0 outside);
 *   gb   (O) float32 or NULL: sum of gout over n, ho, wo (overwritten); gw may be NULL (and
 *        then x too) when only gb is wanted: the same sums as with gw.
 * Every sum in float32 (products of bfloat16 values are exact). Groups, stride, dilation and
 * padding from g (ops/conv.h); depthwise (Cg == 1) takes a plain float32 loop.
 * Precondition: lm_cpu_isa() >= LM_ISA_AVX512_BF16 (the file is compiled with -mavx512bf16);
 * otherwise it returns LM_ERR_INTERNAL without writing, and the caller takes its float32 route.
 * Threads: OpenMP inside (the GEMMs, the im2col tiles, the bias sums; large pixel counts split
 * between the threads, each into its own float32 copy of gw, then summed: gw may differ in the
 * last bits with the thread count, gb does not). LM_ERR_OOM when the
 * im2col tile cannot be allocated. */
#ifndef LUMEN_CONV_BF16_H
#define LUMEN_CONV_BF16_H
#include <stdint.h>
#include "lumen.h"
#include "ops/conv.h"

/* exported (default visibility) so that spec/c/test_conv_bwdw_bf16.c can call it; not in the
   FFI header */
lm_status lm_conv_bwdw_nhwc_bf16(const conv_geom *g, const uint16_t *x, const uint16_t *gout,
                                 float *gw, float *gb);
#endif
