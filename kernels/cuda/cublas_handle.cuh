/* cublas_handle.cuh -- cuda:k's one cuBLAS handle, shared by the families that call cuBLAS
 * (linalg.cu's matmul, conv.cu's 1x1 convolutions as GEMMs). linalg.cu creates it on first use,
 * on lm_cu_stream(k), with its workspace from the caching allocator and host pointer mode; a
 * caller sets the math mode it needs before each call (the handle is shared). In the emulated
 * build (LM_CUDA_EMU) the handle and the calls are linalg_cublas_emu.cuh's host emulation. */
#ifndef LUMEN_CUBLAS_HANDLE_CUH
#define LUMEN_CUBLAS_HANDLE_CUH
#include "cuda.cuh"

#ifdef LM_CUDA_EMU
#include "linalg_cublas_emu.cuh"
#else
#include <cublas_v2.h>
#endif

/* cuda:k's handle (created on the first call; the device must be current); LM_OK or an error set */
lm_status lm_cu_cublas_handle(int k, cublasHandle_t *out);

#endif
