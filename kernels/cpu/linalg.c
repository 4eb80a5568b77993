/* linalg.c -- lm_matmul: torch.matmul semantics on lumen's own GEMM.
 *
 *   1-D . 1-D   dot product, 0-dim result
 *   2-D . 2-D   matrix product
 *   1-D . n-D   the vector is a 1 x k matrix, the row dim is dropped from the result
 *   n-D . 1-D   the vector is a k x 1 matrix, the column dim is dropped
 *   batched     leading dims broadcast (PyTorch's rules), one GEMM per batch entry
 *
 * Operands of any strides go straight to lm_*gemm_strided (the packing handles transposed and
 * strided operands, broadcast batch dims are stride 0), so no operand is copied. float16 and
 * bfloat16 are computed in float32 and rounded once at the end. A new output is contiguous; an
 * out= tensor keeps its strides and must have the result's shape and dtype.
 */
#include "cpu.h"
#include <stdio.h>
#include "gemm_internal.h"

/* a batch of matrix products: C[b] = A[b] B[b], with b over the broadcast batch shape */
typedef struct {
   int nb;                       /* batch dims */
   int64_t bsz[LM_MAX_DIMS];     /* batch sizes */
   int64_t bsa[LM_MAX_DIMS], bsb[LM_MAX_DIMS], bsc[LM_MAX_DIMS]; /* batch strides (elements) */
   int64_t m, n, k;
   int64_t rsa, csa, rsb, csb, rsc, csc;
   int dtype;                    /* LM_FLOAT32 or LM_FLOAT64 */
   void *a, *b, *c;              /* element (0, ...) of each operand */
} mm_plan;

static void mm_one(const mm_plan *p, int64_t oa, int64_t ob, int64_t oc, int64_t m, int64_t rsa,
                   int64_t rsc) {
   if (p->dtype == LM_FLOAT32)
      lm_sgemm_strided(m, p->n, p->k, 1.0f, (const float *)p->a + oa, rsa, p->csa,
                       (const float *)p->b + ob, p->rsb, p->csb, 0.0f, (float *)p->c + oc, rsc,
                       p->csc);
   else
      lm_dgemm_strided(m, p->n, p->k, 1.0, (const double *)p->a + oa, rsa, p->csa,
                       (const double *)p->b + ob, p->rsb, p->csb, 0.0, (double *)p->c + oc, rsc,
                       p->csc);
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

static void mm_run(const mm_plan *p) {
   int64_t nbatch = 1;
   for (int d = 0; d < p->nb; d++) nbatch *= p->bsz[d];
   if (nbatch == 0 || p->m == 0 || p->n == 0) return;
   if (nbatch == 1) {
      mm_one(p, 0, 0, 0, p->m, p->rsa, p->rsc);
      return;
   }
   /* B shared by every batch entry and A / C rows evenly strided across the batch: one GEMM
      with nbatch * m rows (the usual (batch, T, k) x (k, n) linear layer) */
   int b_shared = 1;
   for (int d = 0; d < p->nb; d++)
      if (p->bsz[d] != 1 && p->bsb[d] != 0) b_shared = 0;
   if (b_shared && p->m > 1 && rows_collapse(p)) {
      mm_one(p, 0, 0, 0, p->m * nbatch, p->rsa, p->rsc);
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
            mm_one(p, 0, 0, 0, nbatch, rs_a, rs_c);
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
         mm_one(p, oa, ob, oc, p->m, p->rsa, p->rsc);
      }
   } else {
      for (int64_t i = 0; i < nbatch; i++) {
         int64_t oa, ob, oc;
         mm_offsets(p, i, &oa, &ob, &oc);
         mm_one(p, oa, ob, oc, p->m, p->rsa, p->rsc);
      }
   }
}

static void shape_str(char *buf, size_t cap, int nd, const int64_t *sz) {
   size_t n = 0;
   n += (size_t)snprintf(buf + n, cap - n, "[");
   for (int d = 0; d < nd && n < cap; d++)
      n += (size_t)snprintf(buf + n, cap - n, d ? ", %lld" : "%lld", (long long)sz[d]);
   if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* half-precision inputs: compute in float32, round into the result once */
static lm_status matmul_via_float(const lm_tensor *a, const lm_tensor *b, lm_tensor **out) {
   lm_tensor *a32 = NULL, *b32 = NULL, *r32 = NULL;
   lm_status st = lm_clone(a, LM_PRESERVE, LM_FLOAT32, &a32);
   if (st == LM_OK) st = lm_clone(b, LM_PRESERVE, LM_FLOAT32, &b32);
   if (st == LM_OK) st = lm_matmul(a32, b32, &r32);
   if (st == LM_OK) {
      if (*out)
         st = lm_copy_(*out, r32);
      else
         st = lm_clone(r32, LM_CONTIGUOUS, a->dtype, out);
   }
   lm_tensor_free(a32);
   lm_tensor_free(b32);
   lm_tensor_free(r32);
   return st;
}

lm_status lm_matmul(const lm_tensor *a, const lm_tensor *b, lm_tensor **out) {
   LM_CHECK_TENSOR(a, "input");
   LM_CHECK_TENSOR(b, "other");
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   LM_TRY(lm_check_cpu(a, "input"));
   LM_TRY(lm_check_cpu(b, "other"));
   const int na = a->ndim, nb = b->ndim;
   if (na == 0 || nb == 0)
      return lm_error(LM_ERR_SHAPE,
                      "both arguments to matmul need to be at least 1D, but they are %dD and %dD",
                      na, nb);
   if (a->dtype != b->dtype)
      return lm_error(LM_ERR_DTYPE,
                      "expected both arguments to have the same dtype, but got %s and %s",
                      lm_dtype_name(a->dtype), lm_dtype_name(b->dtype));
   const int dt = a->dtype;
   if (!lm_is_float_dtype(dt))
      return lm_error(LM_ERR_DTYPE, "matmul is not implemented for %s tensors",
                      lm_dtype_name(dt));

   /* the matrix parts; a vector is a 1 x k row (a) or a k x 1 column (b) */
   mm_plan p;
   memset(&p, 0, sizeof p);
   p.m = na == 1 ? 1 : a->sizes[na - 2];
   p.k = a->sizes[na - 1];
   p.rsa = na == 1 ? 0 : a->strides[na - 2];
   p.csa = a->strides[na - 1];
   const int64_t kb = nb == 1 ? b->sizes[0] : b->sizes[nb - 2];
   p.n = nb == 1 ? 1 : b->sizes[nb - 1];
   p.rsb = nb == 1 ? b->strides[0] : b->strides[nb - 2];
   p.csb = nb == 1 ? 0 : b->strides[nb - 1];
   if (p.k != kb) {
      if (na == 1 && nb == 1)
         return lm_error(LM_ERR_SHAPE,
                         "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have "
                         "the same number of elements, but got %lld and %lld elements "
                         "respectively",
                         (long long)p.k, (long long)kb, (long long)p.k, (long long)kb);
      return lm_error(LM_ERR_SHAPE, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and "
                      "%lldx%lld)", (long long)p.m, (long long)p.k, (long long)kb,
                      (long long)p.n);
   }

   /* batch dims, broadcast */
   const int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0;
   int bo = 0;
   LM_TRY(lm_broadcast_shapes(ba, a->sizes, bb, b->sizes, &bo, p.bsz));
   p.nb = bo;
   for (int d = 0; d < bo; d++) {
      int da = d - (bo - ba), db = d - (bo - bb);
      p.bsa[d] = (da >= 0 && a->sizes[da] != 1) ? a->strides[da] : 0;
      p.bsb[d] = (db >= 0 && b->sizes[db] != 1) ? b->strides[db] : 0;
   }
   int64_t osz[LM_MAX_DIMS];
   int on = 0;
   for (int d = 0; d < bo; d++) osz[on++] = p.bsz[d];
   if (na > 1) osz[on++] = p.m;
   if (nb > 1) osz[on++] = p.n;

   lm_tensor *o = *out;
   if (o) {
      LM_TRY(lm_check_cpu(o, "out"));
      int ok = o->ndim == on;
      for (int d = 0; ok && d < on; d++) ok = o->sizes[d] == osz[d];
      if (!ok) {
         char s1[160], s2[160];
         shape_str(s1, sizeof s1, o->ndim, o->sizes);
         shape_str(s2, sizeof s2, on, osz);
         return lm_error(LM_ERR_SHAPE, "output with shape %s doesn't match the result shape %s",
                         s1, s2);
      }
      if (o->dtype != dt)
         return lm_error(LM_ERR_DTYPE, "expected out tensor to have dtype %s, but got %s instead",
                         lm_dtype_name(dt), lm_dtype_name(o->dtype));
      for (int d = 0; d < on; d++)
         if (o->sizes[d] > 1 && o->strides[d] == 0)
            return lm_error(LM_ERR_ARG, "unsupported operation: more than one element of the "
                            "written-to tensor refers to a single memory location. Please "
                            "clone() the tensor before performing the operation.");
      /* an out= sharing memory with an input: compute aside, then copy */
      if (o->numel > 0 && (lm_tensor_same_storage(o, a) || lm_tensor_same_storage(o, b))) {
         lm_tensor *tmp = NULL;
         LM_TRY(lm_matmul(a, b, &tmp));
         lm_status st = lm_copy_(o, tmp);
         lm_tensor_free(tmp);
         return st;
      }
   }
   if (dt == LM_FLOAT16 || dt == LM_BFLOAT16) return matmul_via_float(a, b, out);

   lm_tensor *created = NULL;
   if (!o) {
      LM_TRY(lm_empty(on, osz, dt, LM_CONTIGUOUS, LM_CPU, &created));
      o = created;
   }
   /* the output's strides: batch dims, then rows (absent for a 1-D a), then columns */
   for (int d = 0; d < bo; d++) p.bsc[d] = p.bsz[d] == 1 ? 0 : o->strides[d];
   p.rsc = na > 1 ? o->strides[bo] : 0;
   p.csc = nb > 1 ? o->strides[on - 1] : 1;
   p.dtype = dt;
   p.a = lm_tensor_data(a);
   p.b = lm_tensor_data(b);
   p.c = lm_tensor_data(o);
   if (o->numel > 0) mm_run(&p);
   if (created) *out = created;
   return LM_OK;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_linalg(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
