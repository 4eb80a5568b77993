/* norm_half.h -- the batch-norm row kernels for float16 / bfloat16 (channels innermost: an
 * (M, C) matrix of 16-bit values), shared by kernels/cpu/norm.c (which calls them from its
 * kernels of LM_OP_BATCH_NORM / LM_OP_BATCH_NORM_BACKWARD, and holds the portable copy) and
 * kernels/cpu/norm_half_avx512.c (the AVX-512 copy). Not part of the FFI header.
 *
 * One call: [the sums (K != NULL)] s1[c] = sum(x - K[c]), s2[c] = sum((x - K[c])^2), or with dy:
 * s1[c] = sum(g), s2[c] = sum(g (x - K[c])), g = dy masked by mk (0 where mk <= 0; mk may be
 * NULL), also stored into gm (may be NULL); then prep(ctx) on one thread (may be NULL); then
 * [y = A (a' - Ma) + B (b - Mb) + D (+ res) (relu), a' = a masked by amk (y != NULL; b, res, amk
 * may be NULL)], cf = A, Ma, B, Mb, D (C floats each). x, dy, mk, gm, a, amk, b, res, y: 16-bit
 * values of dtype dt (LM_BFLOAT16 or LM_FLOAT16), read into float32 registers; the sums are
 * float32 over at most 64 rows, then double (part: nthreads * 2 * C doubles of scratch); y is
 * rounded once (to nearest even). Both passes run in one OpenMP region, each thread on the same
 * rows, the second backwards (its rows are still in that core's cache). */
#ifndef LUMEN_NORM_HALF_H
#define LUMEN_NORM_HALF_H
#include <stdint.h>

#if defined(__GNUC__)
#define LM_NORM_HIDDEN __attribute__((visibility("hidden")))
#else
#define LM_NORM_HIDDEN
#endif

typedef struct lm_bn_half_args {
   int dt;
   const uint16_t *x, *dy, *mk;
   uint16_t *gm;
   const float *K;
   int64_t M, C;
   double *part, *s1, *s2;
   void (*prep)(void *);
   void *ctx;
   const uint16_t *a, *amk, *b, *res;
   uint16_t *y;
   const float *cf;
   int relu;
   int stream; /* y with streaming stores (C a multiple of 32, y 64-byte aligned: whole lines) */
} lm_bn_half_args;

LM_NORM_HIDDEN void lm_bn_rows_half_avx512(const lm_bn_half_args *p);

#endif
