/* elementwise.h -- the parameters of the elementwise family (front end: src/elementwise.c; CPU
 * kernels: kernels/cpu/elementwise.c over the compute loops of kernels/cpu/ew_kernels.c).
 *
 *   UNARY, CLAMP, BINARY, BINARY_SCALAR, BINARY_UNARY, BINARY_SCALAR_UNARY, ADDCMUL, ADDCDIV,
 *   WHERE (lm_ew_params): t = {out, in0, in1, in2} (nt = 1 + nin). out is allocated (fresh, in
 *   the TensorIterator's layout, when `created`) or the caller's out= tensor (shape and cast
 *   checked, no internal overlap); an input that is a number (scalar_idx) has a NULL slot and
 *   its value in `scalar`. The kernel sets up the iterator (the front end only worked out the
 *   broadcast shape and the new output's strides), resolves partial overlap of out= with an
 *   input, and runs the loop; it returns "ZeroDivisionError" for an integer division by zero.
 *   small: the front end found every operand a small dense float tensor with out's sizes and
 *   strides (src/elementwise.c, small_dense_ok): one kernel call over numel elements.
 *   COPY: t = {dst, src}, one device; shapes checked (src broadcasts to dst), dst without
 *   internal overlap, numel > 0. The kernel resolves overlap and converts dtypes.
 *   FILL (lm_fill_params): t = {self}; numel > 0.
 */
#ifndef LUMEN_OPS_ELEMENTWISE_H
#define LUMEN_OPS_ELEMENTWISE_H
#include "internal.h"
#include <stdint.h>

/* the compute kernels' parameters (kernels/cpu/ew_kernels.c) */
typedef struct lm_kparams {
   float alpha_f, val_f, lo_f, hi_f;
   double alpha_d, val_d, lo_d, hi_d;
   int64_t alpha_i, val_i, lo_i, hi_i;
   int *err; /* set to 1 on an integer division by zero (the kernel's own flag; NULL in params) */
} lm_kparams;

/* compute kinds: a kernel works on dense arrays of float (float32/16/bf16), double or int64
   (integers and bool); comparison and logical kernels write bool bytes */
enum { LM_K_F32 = 0, LM_K_F64 = 1, LM_K_I64 = 2, LM_NUM_K = 3 };
/* the kernels that are neither unary nor binary ops of lumen.h */
enum { LM_T_CLAMP = 0, LM_T_CLAMP_MIN, LM_T_CLAMP_MAX, LM_T_ADDCMUL, LM_T_ADDCDIV, LM_T_WHERE,
       LM_T_POW2, LM_T_POW3, LM_T_POWHALF, LM_T_POWM1, LM_T_POWMHALF, LM_T_POWM2, LM_NUM_T };
/* which table a kernel comes from */
enum { LM_EW_UNARY = 0, LM_EW_BINARY = 1, LM_EW_OTHER = 2 };

typedef struct lm_ew_params {
   int nin;
   int in_dt[3];  /* dtype the kernel reads for each input (float32 / float64 / int64 / bool) */
   int via[3];    /* dtype each input is cast to first (PyTorch's common dtype), -1: none */
   int out_dt;    /* dtype the kernel writes */
   int out_via;   /* the op's result dtype, when the kernel's output must round through it */
   int table;     /* LM_EW_UNARY / BINARY / OTHER */
   int kop;       /* the op in that table (LM_NEG.., LM_ADD.., LM_T_..) */
   int kind;      /* LM_K_F32 / F64 / I64 */
   int epi;       /* a unary op (LM_NEG..) applied in place to each computed chunk, or -1 */
   int epi_via;   /* the dtype each chunk rounds through before the epilogue (a float16 /
                     bfloat16 result: the eager pair's intermediate), or -1 */
   int cheap;     /* a memory-bound kernel: parallel only from LM_CHEAP_GRAIN elements */
   int created;   /* out is fresh (the front end allocated it): may stream, cannot overlap */
   int small;     /* the small dense path (see above) */
   int variant;   /* small path, binary: 0 vv, 1 vs (in1 is the number), 2 sv (in0 is) */
   int scalar_idx;     /* the input given as a number, -1: none */
   int scalar_dtype;   /* its dtype (the bytes in scalar) */
   int scalar_wrapped; /* a wrapped number (lowest promotion priority, layout) */
   LM_ALIGNAS(16) char scalar[16];
   lm_kparams p;
} lm_ew_params;

typedef struct lm_fill_params {
   LM_ALIGNAS(16) char value[16]; /* one element of self's dtype */
} lm_fill_params;

static inline int lm_kind_of(int dtype) {
   if (dtype == LM_FLOAT64) return LM_K_F64;
   if (lm_is_float_dtype(dtype)) return LM_K_F32;
   return LM_K_I64;
}
static inline int lm_kind_dtype(int kind) {
   return kind == LM_K_F32 ? LM_FLOAT32 : kind == LM_K_F64 ? LM_FLOAT64 : LM_INT64;
}
#endif
