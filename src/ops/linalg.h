/* ops/linalg.h -- the parameters of LM_OP_MATMUL (front end: src/ops/linalg.c; CPU kernel:
 * kernels/cpu/linalg.c).
 *   MATMUL: t = {a, b, c}; a, b float32, float64 or bfloat16 of one dtype, any strides; c the
 *   result (a fresh contiguous tensor or the caller's out= tensor with its own strides, no
 *   overlap with a or b), same dtype, at least one element. bfloat16: float32 sums, each result
 *   rounded once (float16 never reaches the kernel: the front end computes it in float32).
 * The plan: a batch of matrix products C[i] = A[i] B[i], i over the broadcast batch shape bsz,
 * with every stride in elements from element 0 of each tensor; a broadcast batch dim has stride
 * 0 in the operand it is broadcast over. A 1-D a is a 1 x k row (rsa 0); a 1-D b a k x 1 column
 * (csb 0); the result's missing row / column dim has stride 0 / 1. */
#ifndef LUMEN_OPS_LINALG_H
#define LUMEN_OPS_LINALG_H
#include "lumen.h"

typedef struct lm_matmul_params {
   int nb;                       /* batch dims */
   int64_t bsz[LM_MAX_DIMS];     /* batch sizes */
   int64_t bsa[LM_MAX_DIMS], bsb[LM_MAX_DIMS], bsc[LM_MAX_DIMS]; /* batch strides (elements) */
   int64_t m, n, k;
   int64_t rsa, csa, rsb, csb, rsc, csc;
   int accumulate;               /* 0: C = A B; 1: C = C + A B (lm_addmm_: C read, its sum with
                                    the float32 (float64) products rounded once) */
} lm_matmul_params;

/* LM_OP_LINEAR: out = act(x w^T + bias) (F.linear with the epilogue of a following activation),
 * t = {x (m, k), w (n, k), bias (n) or NULL, out (m, n)}: x, w and out dense by rows, bias dense,
 * one dtype. A device runs it where its supports_op takes the call (the CPU: float32, the bias
 * and activation applied to each tile of the GEMM as it is finished); elsewhere the front end
 * (lm_linear, src/ops/linalg.c) runs matmul, add and the activation op. act: an lm_conv_act. */
typedef struct lm_linear_params {
   int64_t m, n, k;
   int act;
} lm_linear_params;
#endif
