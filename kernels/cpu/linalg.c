/* linalg.c -- the CPU kernel of LM_OP_MATMUL (front end, with torch.matmul's shape rules, the
 * broadcast of batch dims and the output: src/ops/linalg.c; the plan: src/ops/linalg.h).
 *
 * Operands of any strides go straight to lm_*gemm_strided (the packing handles transposed and
 * strided operands, broadcast batch dims are stride 0), so no operand is copied. bfloat16:
 * lm_bgemm_strided_bf16c (float32 sums, the bfloat16 result rounded once; gemm_internal.h).
 */
#include "cpu.h"
#include "ops/linalg.h"
#include "gemm_internal.h"
#include "amx.h"
#include "impl.h"

/* a batch of matrix products: C[b] = A[b] B[b], with b over the broadcast batch shape: the
   plan (ops/linalg.h) and the operands: element (0, ...) of each, float32, float64 or bfloat16 */
typedef lm_matmul_params mm_plan;
typedef struct {
   int dtype; /* LM_FLOAT32, LM_FLOAT64 or LM_BFLOAT16 */
   void *a, *b, *c;
} mm_data;

/* float32 on AMX tiles (lm.backends.cpu.fp32_precision = "bf16"): A and B rounded to bfloat16
   (dense copies), the products summed in float32 into C; 0 when it did not run (then the float32
   GEMM does) */
static int mm_fp32_amx(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa,
                       int64_t csa, const float *b, int64_t rsb, int64_t csb, float beta,
                       float *c, int64_t rsc, int64_t csc) {
   if (!lm_cpu_option(LM_CPU_OPT_FP32_BF16) || !lm_amx_on() || m < 16 || n < 16 || k < 32 ||
       !lm_impl_on(LM_IMPL_MM_FP32_AMX))
      return 0;
   const size_t bytes = (size_t)(m * k + k * n) * 2;
   uint16_t *buf = lm_alloc(bytes);
   if (!buf) {
      lm_clear_error();
      return 0;
   }
   uint16_t *ab = buf, *bb = buf + m * k;
   for (int64_t i = 0; i < m; i++)
      for (int64_t p = 0; p < k; p++) ab[i * k + p] = lm_f2bf(a[i * rsa + p * csa]);
   for (int64_t p = 0; p < k; p++)
      for (int64_t j = 0; j < n; j++) bb[p * n + j] = lm_f2bf(b[p * rsb + j * csb]);
   int nt = 1;
#ifdef _OPENMP
   if (!omp_in_parallel()) nt = omp_get_max_threads();
#endif
   const int ok = lm_bgemm_amx(m, n, k, 1.0f, ab, k, 1, bb, n, 1, beta, c, rsc, csc, 0, nt);
   if (ok) lm_impl_ran(LM_IMPL_MM_FP32_AMX);
   lm_free(buf, bytes);
   return ok;
}

static void mm_one(const mm_plan *p, const mm_data *q, int64_t oa, int64_t ob, int64_t oc,
                   int64_t m, int64_t rsa, int64_t rsc) {
   const float beta = p->accumulate ? 1.0f : 0.0f; /* lm_addmm_: C + A B */
   if (q->dtype == LM_FLOAT32 &&
       mm_fp32_amx(m, p->n, p->k, (const float *)q->a + oa, rsa, p->csa, (const float *)q->b + ob,
                   p->rsb, p->csb, beta, (float *)q->c + oc, rsc, p->csc))
      return;
   if (q->dtype == LM_FLOAT32)
      lm_sgemm_strided(m, p->n, p->k, 1.0f, (const float *)q->a + oa, rsa, p->csa,
                       (const float *)q->b + ob, p->rsb, p->csb, beta, (float *)q->c + oc, rsc,
                       p->csc);
   else if (q->dtype == LM_BFLOAT16)
      lm_bgemm_strided_bf16c(m, p->n, p->k, 1.0f, (const uint16_t *)q->a + oa, rsa, p->csa,
                             (const uint16_t *)q->b + ob, p->rsb, p->csb, beta,
                             (uint16_t *)q->c + oc, rsc, p->csc);
   else
      lm_dgemm_strided(m, p->n, p->k, 1.0, (const double *)q->a + oa, rsa, p->csa,
                       (const double *)q->b + ob, p->rsb, p->csb, (double)beta,
                       (double *)q->c + oc, rsc, p->csc);
}

/* offsets of batch entry `idx` (row-major over bsz) */
static void mm_offsets(const mm_plan *p, int64_t idx, int64_t *oa, int64_t *ob, int64_t *oc) {
   int64_t a = 0, b = 0, c = 0;
   for (int d = p->nb - 1; d >= 0; d--) {
      int64_t i = idx % p->bsz[d];
      idx /= p->bsz[d];
      a += i * p->bsa[d];
      b += i * p->bsb[d];
      c += i * p->bsc[d];
   }
   *oa = a;
   *ob = b;
   *oc = c;
}

/* do the batch dims followed by the row dim form one evenly strided dim (for both A and C)? */
static int rows_collapse(const mm_plan *p) {
   int64_t sa = p->rsa, sc = p->rsc, extent = p->m;
   for (int d = p->nb - 1; d >= 0; d--) {
      if (p->bsz[d] == 1) continue;
      if (p->bsa[d] != sa * extent || p->bsc[d] != sc * extent) return 0;
      extent *= p->bsz[d];
   }
   return 1;
}

static void mm_run(const mm_plan *p, const mm_data *q) {
   int64_t nbatch = 1;
   for (int d = 0; d < p->nb; d++) nbatch *= p->bsz[d];
   if (nbatch == 0 || p->m == 0 || p->n == 0) return;
   if (nbatch == 1) {
      mm_one(p, q, 0, 0, 0, p->m, p->rsa, p->rsc);
      return;
   }
   /* B shared by every batch entry and A / C rows evenly strided across the batch: one GEMM
      with nbatch * m rows (the usual (batch, T, k) x (k, n) linear layer) */
   int b_shared = 1;
   for (int d = 0; d < p->nb; d++)
      if (p->bsz[d] != 1 && p->bsb[d] != 0) b_shared = 0;
   if (b_shared && p->m > 1 && rows_collapse(p)) {
      mm_one(p, q, 0, 0, 0, p->m * nbatch, p->rsa, p->rsc);
      return;
   }
   if (p->m == 1 && b_shared) {
      /* vector-matrix products sharing B: rows of A at batch strides, collapse if even */
      if (p->nb >= 1) {
         /* treat the innermost non-trivial batch dim as the row dim when all collapse */
         int64_t rs_a = 0, rs_c = 0, ext = 1;
         int ok = 1;
         for (int d = p->nb - 1; d >= 0 && ok; d--) {
            if (p->bsz[d] == 1) continue;
            if (ext == 1) {
               rs_a = p->bsa[d];
               rs_c = p->bsc[d];
            } else if (p->bsa[d] != rs_a * ext || p->bsc[d] != rs_c * ext) {
               ok = 0;
            }
            ext *= p->bsz[d];
         }
         if (ok) {
            mm_one(p, q, 0, 0, 0, nbatch, rs_a, rs_c);
            return;
         }
      }
   }
   const double work = (double)p->m * (double)p->n * (double)p->k;
   int nt = 1;
#ifdef _OPENMP
   if (!omp_in_parallel()) nt = omp_get_max_threads();
#endif
   if (nt > 1 && work <= 128.0 * 128.0 * 128.0) {
      /* many small products: one whole GEMM per thread at a time */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
      for (int64_t i = 0; i < nbatch; i++) {
         int64_t oa, ob, oc;
         mm_offsets(p, i, &oa, &ob, &oc);
         mm_one(p, q, oa, ob, oc, p->m, p->rsa, p->rsc);
      }
   } else {
      for (int64_t i = 0; i < nbatch; i++) {
         int64_t oa, ob, oc;
         mm_offsets(p, i, &oa, &ob, &oc);
         mm_one(p, q, oa, ob, oc, p->m, p->rsa, p->rsc);
      }
   }
}

/* LM_OP_MATMUL: t = {a, b, c} */
static lm_status k_matmul(const lm_op *op) {
   const mm_data q = {op->t[2]->dtype, lm_tensor_data(op->t[0]), lm_tensor_data(op->t[1]),
                      lm_tensor_data(op->t[2])};
   mm_run(op->params, &q);
   return LM_OK;
}

/* LM_OP_LINEAR: t = {x, w, bias or NULL, out} (ops/linalg.h), float32 (lm_cpu_linear_supports):
   x w^T with the bias and activation on each tile of the GEMM as it is finished */
static lm_status k_linear(const lm_op *op) {
   const lm_linear_params *p = op->params;
   const lm_gemm_epi epi = {op->t[2] ? (const float *)lm_tensor_data(op->t[2]) : NULL, p->act};
   lm_sgemm_strided_epi(p->m, p->n, p->k, lm_tensor_data(op->t[0]), p->k, 1,
                        lm_tensor_data(op->t[1]), 1, p->k, lm_tensor_data(op->t[3]), p->n, &epi);
   return LM_OK;
}

/* supports_op of LM_OP_LINEAR: float32 (the other dtypes: the front end's composed ops) */
int lm_cpu_linear_supports(const lm_op *op) {
   if (!op->params) return 1; /* "is there a kernel" (lm_device_has_kernel): there is */
   const lm_tensor *x = op->nt > 0 ? op->t[0] : NULL;
   return x && x->dtype == LM_FLOAT32;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_linalg(lm_kernel_fn *table, int isa) {
   (void)isa; /* lm_*gemm_strided choose their ISA themselves */
   table[LM_OP_MATMUL] = k_matmul;
   table[LM_OP_LINEAR] = k_linear;
}
