/* resample.h -- the parameters of LM_OP_RESAMPLE (front end: src/ops/resample.c; CPU kernel:
 * kernels/cpu/resample.c; CUDA: kernels/cuda/resample.cu).
 *   RESAMPLE: t = {x, ptr, idx, w, y}. x contiguous (B, In, R) float32 or float64 (the front end
 *             runs halves on float32 copies); ptr int64 (Out + 1), idx int64 (nnz) and w (nnz,
 *             float64 for a float64 x, float32 otherwise), each contiguous: the taps of output
 *             row o are idx[k], w[k] for k in [ptr[o], ptr[o + 1]), in that order; y a contiguous
 *             (B, Out, R) of x's dtype.
 *             y[b, o, r] = w[k0] x[b, idx[k0], r] + w[k1] x[b, idx[k1], r] + ... (the first
 *             product, then each next one added, in the compute type); 0 for a row without taps.
 * The taps are data the front end does not read: the CPU kernel checks them (ptr[0] = 0, ptr
 * non-decreasing up to nnz, 0 <= idx < In) and fails with LM_ERR_ARG; the CUDA kernel writes NaN
 * into an output row whose taps are out of range. */
#ifndef LUMEN_OPS_RESAMPLE_H
#define LUMEN_OPS_RESAMPLE_H
#include <stdint.h>
typedef struct lm_resample_params {
   int64_t B, In, Out, R, nnz;
} lm_resample_params;
#endif
