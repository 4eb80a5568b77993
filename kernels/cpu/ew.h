/* ew.h -- what the CPU kernels of the elementwise family share (internal): the compute loops of
 * ew_kernels.c by [op][kind], and the kernels' strided copy (elementwise.c), which reduce.c and
 * cat's kernel use too. */
#ifndef LUMEN_KERNELS_CPU_EW_H
#define LUMEN_KERNELS_CPU_EW_H
#include "cpu.h"
#include "iter.h"
#include "ops/elementwise.h"

typedef void (*lm_kfn)(char *o, const char *a, const char *b, const char *c, int64_t n,
                       const lm_kparams *p);
typedef struct lm_kset {
   lm_kfn vv; /* every input a dense array */
   lm_kfn vs; /* binary: b is one element */
   lm_kfn sv; /* binary: a is one element */
} lm_kset;

extern const lm_kset lm_unary_kernels[LM_NUM_UNARY][LM_NUM_K];
extern const lm_kset lm_binary_kernels[LM_NUM_BINARY][LM_NUM_K];
extern const lm_kset lm_other_kernels[LM_NUM_T][LM_NUM_K];

/* the AVX-512 float32 loops of op kop of table (LM_EW_UNARY / LM_EW_BINARY) where
   ew_act_f32_avx512.c has them (GELU both forms, SiLU, sigmoid, hardswish, hardsigmoid, the GELU
   and SiLU gradients), else NULL; only for lm_cpu_isa() >= LM_ISA_AVX512 (elementwise.c asks,
   under the implementation name "ew_act_avx512") */
const lm_kset *lm_ew_act_avx512(int table, int kop);
/* the same set on 8 lanes (ew_act_f32_avx2.c), for lm_cpu_isa() == LM_ISA_AVX2 ("ew_act_avx2") */
const lm_kset *lm_ew_act_avx2(int table, int kop);

/* dst[...] = src broadcast to dst's shape, converted; a src that partially overlaps dst is
   copied first, a same-dtype copy between transposed layouts runs in tiles */
lm_status lm_cpu_copy_operands(const lm_operand *dst, const lm_operand *src);

#endif
