/* reduce.h -- the parameters of LM_OP_REDUCE and LM_OP_CAT (front ends: src/reduce.c,
 * src/cat.c; CPU kernels: kernels/cpu/reduce.c).
 *   REDUCE: t = {input, out, indices (NULL: none)}. out has the result's shape (keepdim or not)
 *     and a dtype rdt casts to; indices (max/min with indices) is int64 of out's shape; argmax /
 *     argmin write their indices into out. red[d]: dim d of the input is reduced.
 *   CAT: t = {out, in_0, .., in_{n-1}} (nt = n + 1), every input on out's device, shapes checked
 *     (legacy 1-D empty inputs are skipped); dim wrapped. The kernel refuses inputs that share
 *     memory with out. */
#ifndef LUMEN_OPS_REDUCE_H
#define LUMEN_OPS_REDUCE_H
#include "internal.h"
typedef struct lm_reduce_params {
   int op;       /* LM_SUM .. LM_PROD (lumen.h) */
   int arg;      /* argmax / argmin */
   int want_idx; /* track (value, index) pairs */
   int keepdim;
   int rdt;      /* the result dtype (out may have another it casts to) */
   int red[LM_MAX_DIMS];
} lm_reduce_params;

typedef struct lm_cat_params {
   int dim;
} lm_cat_params;
#endif
