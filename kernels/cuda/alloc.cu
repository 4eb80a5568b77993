/* alloc.cu -- cuda:k's device memory and the copies between host and device.
 * (first version: cudaMalloc per block; the caching allocator replaces it) */
#include "cuda.cuh"

void *lm_cu_alloc(int k, size_t nbytes) {
   if (lm_cu_set_device(k) != LM_OK) return NULL;
   void *p = NULL;
   cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 1);
   if (e != cudaSuccess) {
      lm_error(LM_ERR_OOM, "cuda:%d: out of memory allocating %zu bytes (%s)", k, nbytes,
               cudaGetErrorString(e));
      return NULL;
   }
   return p;
}

void lm_cu_free(int k, void *p, size_t nbytes) {
   (void)nbytes;
   if (!p) return;
   lm_cu_set_device(k);
   cudaStreamSynchronize(lm_cu_stream(k));
   cudaFree(p);
}

lm_status lm_cu_memcpy(int k, void *dst, const void *src, size_t nbytes, int dir) {
   if (dir < 0 || dir > 2) return lm_error(LM_ERR_ARG, "cuda: bad copy direction %d", dir);
   if (!nbytes) return LM_OK;
   LM_TRY(lm_cu_set_device(k));
   const cudaMemcpyKind kind = dir == 0 ? cudaMemcpyHostToDevice
                               : dir == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
   LM_CU_TRY(cudaMemcpyAsync(dst, src, nbytes, kind, lm_cu_stream(k)), "cudaMemcpyAsync");
   if (dir != 2) LM_CU_TRY(cudaStreamSynchronize(lm_cu_stream(k)), "cudaStreamSynchronize");
   return LM_OK;
}
