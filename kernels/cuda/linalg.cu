/* linalg.cu -- LM_OP_MATMUL on cuda:k (the plan: src/ops/linalg.h; the CPU kernel, the semantic
 * reference: kernels/cpu/linalg.c).
 *
 * cuBLAS, cublasGemmStridedBatchedEx_64 (64-bit sizes and leading dimensions), one handle per
 * device, created on first use, on lm_cu_stream(k), with a workspace from the caching allocator.
 * Row-major C = A B is computed as one column-major product: when C's columns are unit-stride
 * (the usual case) as C^T = B^T A^T with ldc = C's row stride, when its rows are unit-stride as
 * C = A B directly. Each operand is then taken as it is stored (a transposed view is a "T"
 * operand with the other stride as its leading dimension), so no operand is copied unless one of
 * its two strides is not 1 (a doubly strided or expanded matrix): then a dense copy on the device
 * first. A C that neither orientation fits gets a dense temporary, copied back (read first when
 * accumulating). The broadcast batch dims: the innermost ones whose strides collapse to one
 * stride per operand go in one strided-batched call (a broadcast operand has batch stride 0), the
 * remaining outer ones loop on the host.
 *
 * Types: float32 (CUBLAS_COMPUTE_32F; CUBLAS_COMPUTE_32F_FAST_TF32 only with
 * lm_cu_option(LM_CU_OPT_TF32_MATMUL), PyTorch's allow_tf32 default off), float64
 * (CUBLAS_COMPUTE_64F), float16 and bfloat16 (float32 compute, reduced-precision split-K
 * reductions disallowed, each result rounded once: also lm_addmm_'s C + A B with beta 1). The
 * front end sends float16 through float32 today, so the float16 path is for when it stops doing
 * that on CUDA.
 *
 * The emulated build (LM_CUDA_EMU) has no cuBLAS: the op runs on the CPU's kernel
 * (lm_cu_run_on_cpu), or, with LUMEN_CUDA_EMU_GEMM=1, this file's code over a host emulation of
 * the cuBLAS calls it makes (linalg_cublas_emu.cuh, which checks the leading dimensions as cuBLAS
 * does), so the suite checks the orientation, transposes, strides and copies here. */
#include "cuda.cuh"
#include "impl.h"
#include "cublas_handle.cuh" /* cublas_v2.h, or linalg_cublas_emu.cuh in the emulated build */
#include "ops/linalg.h"
#include <string.h>
#include <pthread.h>

/* ---- handles ---- */
/* 32 MiB: what cuBLAS asks for on Hopper (its documentation, "cuBLAS workspace") */
enum { MM_WORKSPACE = 32 << 20 };
static cublasHandle_t mm_handle[LM_NUM_CUDA];
static pthread_mutex_t mm_lock = PTHREAD_MUTEX_INITIALIZER;

static lm_status mm_err(cublasStatus_t s, const char *what) {
   if (s == CUBLAS_STATUS_SUCCESS) return LM_OK;
   return lm_error(LM_ERR_DEVICE, "matmul: %s: %s (cuBLAS status %d)", what,
                   cublasGetStatusString(s), (int)s);
}
#define MM_TRY(call, what)                                                                        \
   do {                                                                                          \
      cublasStatus_t mm_s_ = (call);                                                             \
      if (mm_s_ != CUBLAS_STATUS_SUCCESS) return mm_err(mm_s_, (what));                          \
   } while (0)

/* cuda:k's handle (the device is current: cu_compute set it), on its stream */
static lm_status mm_get_handle(int k, cublasHandle_t *out) {
   pthread_mutex_lock(&mm_lock);
   lm_status st = LM_OK;
   if (!mm_handle[k]) {
      cublasHandle_t h = NULL;
      cublasStatus_t s = cublasCreate(&h);
      if (s != CUBLAS_STATUS_SUCCESS) {
         st = mm_err(s, "cublasCreate");
      } else {
         /* a workspace of our own: cuBLAS would otherwise cudaMalloc one per stream behind the
            caching allocator's back. Kept for the life of the process, as the handle. */
         void *ws = lm_cu_alloc(k, MM_WORKSPACE);
         if (!ws) st = LM_ERR_OOM; /* lm_cu_alloc set the message */
         /* the stream first: cublasSetStream resets the workspace to cuBLAS's default pool */
         if (st == LM_OK) st = mm_err(cublasSetStream(h, lm_cu_stream(k)), "cublasSetStream");
         if (st == LM_OK) st = mm_err(cublasSetWorkspace(h, ws, MM_WORKSPACE), "cublasSetWorkspace");
         if (st == LM_OK)
            st = mm_err(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
         if (st == LM_OK) {
            mm_handle[k] = h;
         } else {
            if (ws) lm_cu_free(k, ws, MM_WORKSPACE);
            cublasDestroy(h);
         }
      }
   }
   *out = mm_handle[k];
   pthread_mutex_unlock(&mm_lock);
   return st;
}

/* the same handle for the other families (cublas_handle.cuh): conv.cu's 1x1 convolutions */
lm_status lm_cu_cublas_handle(int k, cublasHandle_t *out) { return mm_get_handle(k, out); }

/* ---- copies between a strided view and a dense buffer (elements of 2, 4 or 8 bytes) ---- */
template <class T> static lm_status mm_gather_t(int k, const lm_cu_view &v, const char *src, char *dst,
                                               int64_t n) {
   const T *s = (const T *)src;
   T *d = (T *)dst;
   return lm_cu_for(k, n, [=] LM_HD(int64_t i) { d[i] = s[lm_cu_offset(v, i)]; });
}
template <class T> static lm_status mm_scatter_t(int k, const lm_cu_view &v, const char *src, char *dst,
                                                int64_t n) {
   const T *s = (const T *)src;
   T *d = (T *)dst;
   return lm_cu_for(k, n, [=] LM_HD(int64_t i) { d[lm_cu_offset(v, i)] = s[i]; });
}
/* dense[i] = strided[offset(v, i)] (dir 0) or strided[offset(v, i)] = dense[i] (dir 1) */
static lm_status mm_copy(int k, int es, const lm_cu_view &v, char *strided, char *dense, int dir) {
   int64_t n = 1;
   for (int d = 0; d < v.nd; d++) n *= v.size[d];
   if (es == 2)
      return dir == 0 ? mm_gather_t<uint16_t>(k, v, strided, dense, n)
                      : mm_scatter_t<uint16_t>(k, v, dense, strided, n);
   if (es == 4)
      return dir == 0 ? mm_gather_t<uint32_t>(k, v, strided, dense, n)
                      : mm_scatter_t<uint32_t>(k, v, dense, strided, n);
   return dir == 0 ? mm_gather_t<uint64_t>(k, v, strided, dense, n)
                   : mm_scatter_t<uint64_t>(k, v, dense, strided, n);
}

/* the view of one operand over (batch dims..., rows, cols); broadcast batch dims (stride 0) are
   kept with stride 0 in v and left out of the dense copy's shape when `skip_bcast` */
static lm_cu_view mm_view(const lm_matmul_params *p, const int64_t *bs, int64_t rows, int64_t cols,
                          int64_t rs, int64_t cs, int skip_bcast) {
   lm_cu_view v;
   memset(&v, 0, sizeof v);
   int nd = 0;
   for (int d = 0; d < p->nb; d++) {
      if (skip_bcast && (bs[d] == 0 || p->bsz[d] == 1)) continue;
      v.size[nd] = p->bsz[d];
      v.stride[nd] = bs[d];
      nd++;
   }
   v.size[nd] = rows;
   v.stride[nd] = rs;
   v.size[nd + 1] = cols;
   v.stride[nd + 1] = cs;
   v.nd = nd + 2;
   for (int d = v.nd; d < LM_MAX_DIMS; d++) v.size[d] = 1;
   return v;
}

/* an operand after making it GEMM-able: base pointer, batch strides, row and column strides */
typedef struct {
   char *ptr;
   int64_t bs[LM_MAX_DIMS];
   int64_t rs, cs;
   char *tmp; /* a dense copy to free, or NULL */
   size_t tmp_bytes;
} mm_operand;

/* can a rows x cols matrix with strides (rs, cs) be one cuBLAS operand (one unit stride, the
   other a valid leading dimension)? A dim of size 1 may have any stride. */
static int mm_gemmable(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
   const int unit_r = rows == 1 || rs == 1, unit_c = cols == 1 || cs == 1;
   if (unit_r && (cols == 1 || cs >= (rows > 1 ? rows : 1))) return 1;
   if (unit_c && (rows == 1 || rs >= (cols > 1 ? cols : 1))) return 1;
   return 0;
}

/* A (m x k) or B (k x n): as it is, or a dense row-major copy of its non-broadcast part */
static lm_status mm_prepare(int k, const lm_matmul_params *p, int es, char *ptr, const int64_t *bs,
                            int64_t rows, int64_t cols, int64_t rs, int64_t cs, mm_operand *o) {
   memset(o, 0, sizeof *o);
   o->ptr = ptr;
   for (int d = 0; d < p->nb; d++) o->bs[d] = bs[d];
   o->rs = rs;
   o->cs = cs;
   if (mm_gemmable(rows, cols, rs, cs)) return LM_OK;
   const lm_cu_view v = mm_view(p, bs, rows, cols, rs, cs, 1);
   int64_t n = 1;
   for (int d = 0; d < v.nd; d++) n *= v.size[d];
   o->tmp_bytes = (size_t)n * (size_t)es;
   o->tmp = (char *)lm_cu_alloc(k, o->tmp_bytes);
   if (!o->tmp) return LM_ERR_OOM;
   LM_TRY(mm_copy(k, es, v, ptr, o->tmp, 0));
   /* the dense strides: row-major over the kept dims, 0 over the broadcast ones */
   int64_t run = rows * cols;
   for (int d = p->nb - 1; d >= 0; d--) {
      if (bs[d] == 0 || p->bsz[d] == 1) {
         o->bs[d] = 0;
      } else {
         o->bs[d] = run;
         run *= p->bsz[d];
      }
   }
   o->ptr = o->tmp;
   o->rs = cols;
   o->cs = 1;
   return LM_OK;
}

/* one column-major operand of op(X) (p x q logically, strides rs, cs over (p, q)) */
static void mm_colmajor(int64_t p, int64_t q, int64_t rs, int64_t cs, cublasOperation_t *op,
                        int64_t *ld) {
   if ((p == 1 || rs == 1) && (q == 1 || cs >= (p > 1 ? p : 1))) {
      *op = CUBLAS_OP_N; /* stored column-major p x q */
      *ld = q == 1 ? (p > 1 ? p : 1) : cs;
   } else {
      *op = CUBLAS_OP_T; /* stored column-major q x p, transposed */
      *ld = p == 1 ? (q > 1 ? q : 1) : rs;
   }
}

static lm_status k_matmul(const lm_op *op) {
   lm_impl_ran_name("cublas_gemm"); /* LUMEN_VERBOSE (src/impl.h) */
   const lm_matmul_params *p = (const lm_matmul_params *)op->params;
   lm_tensor *ta = op->t[0], *tb = op->t[1], *tc = op->t[2];
   const int k = lm_cu_index(tc);
   const int dt = tc->dtype;
   const int es = (int)lm_dtype_size(dt);
   cudaDataType ctype;
   cublasComputeType_t comp;
   if (dt == LM_FLOAT32) {
      ctype = CUDA_R_32F;
      comp = lm_cu_option(LM_CU_OPT_TF32_MATMUL) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
   } else if (dt == LM_FLOAT64) {
      ctype = CUDA_R_64F;
      comp = CUBLAS_COMPUTE_64F;
   } else if (dt == LM_FLOAT16) {
      ctype = CUDA_R_16F;
      comp = CUBLAS_COMPUTE_32F;
   } else if (dt == LM_BFLOAT16) {
      ctype = CUDA_R_16BF;
      comp = CUBLAS_COMPUTE_32F;
   } else {
      return lm_error(LM_ERR_DTYPE, "matmul is not implemented for %s tensors on cuda:%d",
                      lm_dtype_name(dt), k);
   }
   if (ta->dtype != dt || tb->dtype != dt)
      return lm_error(LM_ERR_DTYPE, "matmul: operands of %s, %s and %s", lm_dtype_name(ta->dtype),
                      lm_dtype_name(tb->dtype), lm_dtype_name(dt));
   int64_t nbatch = 1;
   for (int d = 0; d < p->nb; d++) nbatch *= p->bsz[d];
   if (nbatch == 0 || p->m == 0 || p->n == 0) return LM_OK;

   char *pc = lm_cu_ptr(tc);
   const lm_cu_view cview = mm_view(p, p->bsc, p->m, p->n, p->rsc, p->csc, 0);
   if (p->k == 0) { /* an empty sum: C = 0, or C unchanged when accumulating */
      if (p->accumulate) return LM_OK;
      int64_t n = nbatch * p->m * p->n;
      if (es == 2) {
         uint16_t *c = (uint16_t *)pc;
         return lm_cu_for(k, n, [=] LM_HD(int64_t i) { c[lm_cu_offset(cview, i)] = 0; });
      }
      if (es == 4) {
         uint32_t *c = (uint32_t *)pc;
         return lm_cu_for(k, n, [=] LM_HD(int64_t i) { c[lm_cu_offset(cview, i)] = 0; });
      }
      uint64_t *c = (uint64_t *)pc;
      return lm_cu_for(k, n, [=] LM_HD(int64_t i) { c[lm_cu_offset(cview, i)] = 0; });
   }

   cublasHandle_t h;
   LM_TRY(mm_get_handle(k, &h));
   /* (the stream was set once with the handle: cublasSetStream would also drop the workspace
      back to cuBLAS's own pool; cuda:k's stream never changes) */
   /* float32 sums for the halves (cuBLAS may otherwise reduce split-K partials in 16 bits) */
   MM_TRY(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
          "cublasSetMathMode");

   mm_operand A, B;
   lm_status st = mm_prepare(k, p, es, lm_cu_ptr(ta), p->bsa, p->m, p->k, p->rsa, p->csa, &A);
   if (st == LM_OK) st = mm_prepare(k, p, es, lm_cu_ptr(tb), p->bsb, p->k, p->n, p->rsb, p->csb, &B);
   else memset(&B, 0, sizeof B);

   /* C: as it is when one of its strides is 1, else a dense temporary */
   int64_t cbs[LM_MAX_DIMS], rsc = p->rsc, csc = p->csc;
   char *cptr = pc, *ctmp = NULL;
   size_t ctmp_bytes = 0;
   for (int d = 0; d < p->nb; d++) cbs[d] = p->bsz[d] == 1 ? 0 : p->bsc[d];
   if (st == LM_OK && !mm_gemmable(p->m, p->n, rsc, csc)) {
      ctmp_bytes = (size_t)(nbatch * p->m * p->n) * (size_t)es;
      ctmp = (char *)lm_cu_alloc(k, ctmp_bytes);
      if (!ctmp) st = LM_ERR_OOM;
      if (st == LM_OK && p->accumulate) st = mm_copy(k, es, cview, pc, ctmp, 0);
      int64_t run = p->m * p->n;
      for (int d = p->nb - 1; d >= 0; d--) {
         cbs[d] = p->bsz[d] == 1 ? 0 : run;
         run *= p->bsz[d];
      }
      cptr = ctmp;
      rsc = p->n;
      csc = 1;
   }

   if (st == LM_OK) {
      /* orientation: C^T = B^T A^T (C's columns unit-stride) or C = A B (its rows) */
      const int rowmajor = (p->n == 1 || csc == 1) && (p->m == 1 || rsc >= (p->n > 1 ? p->n : 1));
      int64_t M, N, ldc;
      const mm_operand *P, *Q;
      int64_t prs, pcs, qrs, qcs; /* strides of P (M x K) and Q (K x N) over their logical dims */
      if (rowmajor) {
         M = p->n, N = p->m;
         ldc = p->m == 1 ? (p->n > 1 ? p->n : 1) : rsc;
         P = &B, prs = B.cs, pcs = B.rs; /* B^T: (n x k) */
         Q = &A, qrs = A.cs, qcs = A.rs; /* A^T: (k x m) */
      } else {
         M = p->m, N = p->n;
         ldc = p->n == 1 ? (p->m > 1 ? p->m : 1) : csc;
         P = &A, prs = A.rs, pcs = A.cs;
         Q = &B, qrs = B.rs, qcs = B.cs;
      }
      cublasOperation_t opP, opQ;
      int64_t ldp, ldq;
      mm_colmajor(M, p->k, prs, pcs, &opP, &ldp);
      mm_colmajor(p->k, N, qrs, qcs, &opQ, &ldq);

      /* the innermost batch dims whose strides collapse to one per operand: one batched call */
      int inner = p->nb; /* batch dims [inner, nb) go in the call */
      int64_t cnt = 1, sP = 0, sQ = 0, sC = 0;
      for (int d = p->nb - 1; d >= 0; d--) {
         const int64_t z = p->bsz[d];
         if (z == 1) {
            inner = d;
            continue;
         }
         const int64_t bp = P->bs[d], bq = Q->bs[d], bc = cbs[d];
         if (cnt == 1) {
            sP = bp, sQ = bq, sC = bc;
         } else if (bp != sP * cnt || bq != sQ * cnt || bc != sC * cnt) {
            break;
         }
         /* strides of the collapsed dim, in units of one step of the innermost dim: P's and Q's
            may be 0 (broadcast); C's never is (the front end allocated C or checked it) */
         cnt *= z;
         inner = d;
      }
      if (cnt > 1 && sC == 0) { /* cannot happen for a checked C; loop instead of racing */
         cnt = 1;
         inner = p->nb;
      }
      int64_t outer = 1;
      for (int d = 0; d < inner; d++) outer *= p->bsz[d];
      const float one_f = 1.0f, zero_f = 0.0f;
      const double one_d = 1.0, zero_d = 0.0;
      const void *alpha = dt == LM_FLOAT64 ? (const void *)&one_d : (const void *)&one_f;
      const void *beta = p->accumulate ? alpha : dt == LM_FLOAT64 ? (const void *)&zero_d
                                                                  : (const void *)&zero_f;
      for (int64_t ob = 0; ob < outer && st == LM_OK; ob++) {
         int64_t offP = 0, offQ = 0, offC = 0, idx = ob;
         for (int d = inner - 1; d >= 0; d--) {
            const int64_t i = idx % p->bsz[d];
            idx /= p->bsz[d];
            offP += i * P->bs[d];
            offQ += i * Q->bs[d];
            offC += i * cbs[d];
         }
         cublasStatus_t s = cublasGemmStridedBatchedEx_64(
            h, opP, opQ, M, N, p->k, alpha, P->ptr + offP * es, ctype, ldp, (long long)sP,
            Q->ptr + offQ * es, ctype, ldq, (long long)sQ, beta, cptr + offC * es, ctype, ldc,
            (long long)sC, cnt, comp, CUBLAS_GEMM_DEFAULT);
         st = mm_err(s, "cublasGemmStridedBatchedEx");
      }
   }
   if (st == LM_OK && ctmp) st = mm_copy(k, es, cview, pc, ctmp, 1);
   /* the temporaries go back to the stream-ordered allocator with the work queued */
   if (A.tmp) lm_cu_free(k, A.tmp, A.tmp_bytes);
   if (B.tmp) lm_cu_free(k, B.tmp, B.tmp_bytes);
   if (ctmp) lm_cu_free(k, ctmp, ctmp_bytes);
   return st;
}

#ifdef LM_CUDA_EMU
/* the emulated build: the CPU's kernel, or with LUMEN_CUDA_EMU_GEMM=1 the code above over
   linalg_cublas_emu.cuh's host cuBLAS */
static lm_status k_matmul_emu(const lm_op *op) {
   const char *e = getenv("LUMEN_CUDA_EMU_GEMM");
   return e && *e == '1' ? k_matmul(op) : lm_cu_run_on_cpu_p(op, sizeof(lm_matmul_params));
}
void lm_cuda_register_linalg(lm_kernel_fn *table) { table[LM_OP_MATMUL] = k_matmul_emu; }
#else
void lm_cuda_register_linalg(lm_kernel_fn *table) { table[LM_OP_MATMUL] = k_matmul; }
#endif
