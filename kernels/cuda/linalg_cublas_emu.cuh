/* linalg_cublas_emu.cuh -- the part of cuBLAS that linalg.cu uses, emulated on the host for the
 * emulated build (LM_CUDA_EMU), so that linalg.cu's own logic (which orientation, which operand
 * is transposed, the leading dimensions, the batch strides, the dense copies) runs against the
 * CPU in the busted suite: LUMEN_CUDA_EMU_GEMM=1 makes cuda:0's matmul take this path instead of
 * the CPU's kernel. cublasGemmStridedBatchedEx_64 checks its arguments as cuBLAS documents
 * (CUBLAS_STATUS_INVALID_VALUE for a leading dimension below the rows of the stored matrix) and
 * computes the column-major product naively: float32 sums (float64 for CUBLAS_COMPUTE_64F), one
 * rounding into C. conv.cu's 1x1 convolutions (cublasGemmEx_64) run over it too, with the same
 * switch. */
#ifndef LUMEN_LINALG_CUBLAS_EMU_CUH
#define LUMEN_LINALG_CUBLAS_EMU_CUH
#include <stdint.h>

typedef enum {
   CUBLAS_STATUS_SUCCESS = 0,
   CUBLAS_STATUS_INVALID_VALUE = 7,
   CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef struct lm_cublas_emu *cublasHandle_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
   CUBLAS_COMPUTE_32F = 68,
   CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
   CUBLAS_COMPUTE_64F = 70
} cublasComputeType_t;
typedef enum {
   CUBLAS_DEFAULT_MATH = 0,
   CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0 } cublasPointerMode_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

static inline const char *cublasGetStatusString(cublasStatus_t s) {
   return s == CUBLAS_STATUS_SUCCESS         ? "CUBLAS_STATUS_SUCCESS"
          : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                             : "CUBLAS_STATUS_NOT_SUPPORTED";
}
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
   static int one;
   *h = (cublasHandle_t)(void *)&one;
   return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
   (void)h, (void)s;
   return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *p, size_t n) {
   (void)h;
   return p && n ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m) {
   (void)h, (void)m;
   return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
   (void)h, (void)m;
   return CUBLAS_STATUS_SUCCESS;
}

static inline double lm_cublas_emu_ld(const void *p, int64_t i, cudaDataType t) {
   switch (t) {
   case CUDA_R_32F: return ((const float *)p)[i];
   case CUDA_R_64F: return ((const double *)p)[i];
   case CUDA_R_16F: return lm_h2f(((const uint16_t *)p)[i]);
   default: return lm_bf2f(((const uint16_t *)p)[i]);
   }
}
static inline void lm_cublas_emu_st(void *p, int64_t i, cudaDataType t, double v) {
   switch (t) {
   case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
   case CUDA_R_64F: ((double *)p)[i] = v; break;
   case CUDA_R_16F: ((uint16_t *)p)[i] = lm_f2h((float)v); break;
   default: ((uint16_t *)p)[i] = lm_f2bf((float)v); break;
   }
}

static inline cublasStatus_t cublasGemmStridedBatchedEx_64(
   cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
   const void *alpha, const void *A, cudaDataType at, int64_t lda, long long sa, const void *B,
   cudaDataType bt, int64_t ldb, long long sb, const void *beta, void *C, cudaDataType ct,
   int64_t ldc, long long sc, int64_t batch, cublasComputeType_t comp, cublasGemmAlgo_t algo) {
   (void)h, (void)algo;
   const int64_t ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
   if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ra > 1 ? ra : 1) ||
       ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1) || at != bt || at != ct)
      return CUBLAS_STATUS_INVALID_VALUE;
   const int dbl = comp == CUBLAS_COMPUTE_64F;
   if (dbl != (ct == CUDA_R_64F)) return CUBLAS_STATUS_NOT_SUPPORTED;
   const double al = dbl ? *(const double *)alpha : *(const float *)alpha;
   const double be = dbl ? *(const double *)beta : *(const float *)beta;
   /* queued work: recorded while a graph is captured (emu.h), else done now */
   auto run = [=]() {
   for (int64_t b = 0; b < batch; b++) {
      const char *Ab = (const char *)A, *Bb = (const char *)B;
      const int64_t oa = b * sa, ob = b * sb, oc = b * sc;
      for (int64_t j = 0; j < n; j++)
         for (int64_t i = 0; i < m; i++) {
            double sd = 0;
            float sf = 0;
            for (int64_t l = 0; l < k; l++) {
               const double x = lm_cublas_emu_ld(Ab, oa + (ta == CUBLAS_OP_N ? i + l * lda : l + i * lda), at);
               const double y = lm_cublas_emu_ld(Bb, ob + (tb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb), bt);
               if (dbl)
                  sd += x * y;
               else
                  sf += (float)x * (float)y;
            }
            double v = al * (dbl ? sd : (double)sf);
            if (be != 0) v += be * lm_cublas_emu_ld(C, oc + i + j * ldc, ct);
            if (!dbl) v = (float)v;
            lm_cublas_emu_st(C, oc + i + j * ldc, ct, v);
         }
   }
   return 0;
   };
   if (lm_emu_capture) lm_emu_capture->push_back(run);
   else run();
   return CUBLAS_STATUS_SUCCESS;
}

/* one product (conv.cu's 1x1 convolutions): the strided-batched call with a batch of one */
static inline cublasStatus_t cublasGemmEx_64(cublasHandle_t h, cublasOperation_t ta,
                                             cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                                             const void *alpha, const void *A, cudaDataType at,
                                             int64_t lda, const void *B, cudaDataType bt,
                                             int64_t ldb, const void *beta, void *C,
                                             cudaDataType ct, int64_t ldc,
                                             cublasComputeType_t comp, cublasGemmAlgo_t algo) {
   return cublasGemmStridedBatchedEx_64(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0,
                                        beta, C, ct, ldc, 0, 1, comp, algo);
}

#endif
