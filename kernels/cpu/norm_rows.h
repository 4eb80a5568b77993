/* norm_rows.h -- the float32 AVX-512 and AVX2 kernels of group normalisation over one-row
 * samples (layer_norm's rows: kernels/cpu/norm_rows_f32_avx512.c, norm_rows_f32_avx2.c), called
 * by kernels/cpu/norm_group.c.
 * Not part of the FFI header.
 *
 * x, y, dy, gx: N rows of C contiguous float32 values; G groups of C / G contiguous channels a
 * row; w, b: C float32 coefficients (1 / 0 when the op has none: the caller fills them).
 * Forward: y = (x - mean) * rstd * w + b per group, mean / rstd of each (row, group) stored in
 * gm / gr (N * G doubles). Backward: gx (may be NULL) as in norm_group.c's header; the per-channel
 * sums of dy (grad_bias) and dy (x - mean) rstd (grad_weight) of each thread t of nt land in
 * pw + t * 2C (grad_weight, then grad_bias: doubles, zeroed by the caller) through float32 scratch
 * fs (nt * 2C floats). nt: the threads to use (1: the calling thread). */
#ifndef LUMEN_NORM_ROWS_H
#define LUMEN_NORM_ROWS_H
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define LM_NORM_ROWS_HIDDEN __attribute__((visibility("hidden")))
#else
#define LM_NORM_ROWS_HIDDEN
LM_NORM_ROWS_HIDDEN void lm_norm_rows_fwd_f32_avx2(const float *x, float *y, int64_t N, int64_t C,
                                                   int64_t G, const float *w, const float *b,
                                                   double eps, double *gm, double *gr, int nt);
LM_NORM_ROWS_HIDDEN void lm_norm_rows_bwd_f32_avx2(const float *x, const float *dy, float *gx,
                                                   int64_t N, int64_t C, int64_t G,
                                                   const float *w, const double *gm,
                                                   const double *gr, double *pw, float *fs,
                                                   int nt);
#endif

LM_NORM_ROWS_HIDDEN void lm_norm_rows_fwd_f32_avx512(const float *x, float *y, int64_t N,
                                                     int64_t C, int64_t G, const float *w,
                                                     const float *b, double eps, double *gm,
                                                     double *gr, int nt);
LM_NORM_ROWS_HIDDEN void lm_norm_rows_bwd_f32_avx512(const float *x, const float *dy, float *gx,
                                                     int64_t N, int64_t C, int64_t G,
                                                     const float *w, const double *gm,
                                                     const double *gr, double *pw, float *fs,
                                                     int nt);
LM_NORM_ROWS_HIDDEN void lm_norm_rows_fwd_f32_avx2(const float *x, float *y, int64_t N, int64_t C,
                                                   int64_t G, const float *w, const float *b,
                                                   double eps, double *gm, double *gr, int nt);
LM_NORM_ROWS_HIDDEN void lm_norm_rows_bwd_f32_avx2(const float *x, const float *dy, float *gx,
                                                   int64_t N, int64_t C, int64_t G,
                                                   const float *w, const double *gm,
                                                   const double *gr, double *pw, float *fs,
                                                   int nt);
/* rows summed in float32 before the per-channel sums go into doubles */
#define LM_ROWS_FLUSH 128

/* the per-channel float32 sums of one thread (fw: grad_weight's, fb: grad_bias's) into its
   doubles, and cleared (both kernels' backward, every LM_ROWS_FLUSH rows and at the end) */
static inline void lm_norm_rows_flush(float *fw, float *fb, double *pgw, double *pgb, int64_t C) {
   for (int64_t c = 0; c < C; c++) {
      pgw[c] += fw[c];
      pgb[c] += fb[c];
   }
   memset(fw, 0, (size_t)C * sizeof(float));
   memset(fb, 0, (size_t)C * sizeof(float));
}
#endif
