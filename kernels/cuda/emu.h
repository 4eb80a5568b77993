/* emu.h -- the CUDA runtime, emulated on the host, for the emulated build of the CUDA backend.
 *
 * `make cuda-emu` compiles every .cu file of kernels/cuda/ as plain C++ (g++ -x c++ -DLM_CUDA_EMU)
 * into build/liblumen_cuda_emu.so: kernels written with lm_cu_for (cuda.cuh) run as host loops
 * over the same __host__ __device__ bodies, "device" memory is host memory from the caching
 * allocator's own segments, streams and events do nothing, and the cuDNN / cuBLAS families hand
 * their ops to the CPU kernels. With LUMEN_CUDA_LIB pointing at it, the whole busted suite runs on
 * "cuda:0" on a machine without a GPU (tools/run_tests.sh, LUMEN_TEST_DEVICE=cuda:0): the index
 * math, dtype handling and parameters of every own kernel, the allocator's split and merge, the
 * copies and the Lua side are checked in CI. What it cannot check (launch configurations, cuDNN,
 * cuBLAS, real concurrency) is tools/gpu_check.sh's job on a GPU.
 *
 * Only the subset of the runtime lumen uses is here; add to it as kernels need more. */
#ifndef LUMEN_CUDA_EMU_H
#define LUMEN_CUDA_EMU_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

/* Graph capture (graph.cu, lm.cuda.graph): while lm_emu_capture is set, the work a GPU would
   queue on a stream -- lm_cu_for's loops, cuda.cuh's lm_cu_host bodies, the cuDNN / cuBLAS ops
   run on the CPU's kernels, cudaMemsetAsync and device-to-device cudaMemcpyAsync -- is appended
   to it instead of being done, and a replay runs the list in order (a closure returns 0 or an
   lm_status). As on a GPU, nothing captured runs during the capture, and what waits for the
   stream fails with cudaErrorStreamCaptureUnsupported. */
typedef std::vector<std::function<int()>> lm_emu_ops;
extern lm_emu_ops *lm_emu_capture;
/* set by a call that would have invalidated a GPU's capture (a synchronisation, a synchronous
   copy): as on a GPU, ending that capture then fails (graph.cu) */
extern bool lm_emu_capture_invalid;

#define __host__
#define __device__
#define __global__
#define __shared__
#define __forceinline__ inline
#define __restrict__ __restrict

typedef enum cudaError {
   cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1,
   cudaErrorStreamCaptureUnsupported = 900
} cudaError_t;
static inline cudaError_t lm_emu_unsupported_in_capture(void) {
   lm_emu_capture_invalid = true;
   return cudaErrorStreamCaptureUnsupported;
}
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum { cudaStreamNonBlocking = 1, cudaHostAllocDefault = 0, cudaEventDisableTiming = 2 };

/* LUMEN_CUDA_EMU_DEVICES (default 1): how many emulated GPUs */
static inline cudaError_t cudaGetDeviceCount(int *n) {
   const char *e = getenv("LUMEN_CUDA_EMU_DEVICES");
   *n = e && *e ? atoi(e) : 1;
   return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) { (void)d; return cudaSuccess; }
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t e) {
   return e == cudaSuccess                         ? "no error"
          : e == cudaErrorMemoryAllocation           ? "out of memory"
          : e == cudaErrorStreamCaptureUnsupported ? "operation not permitted when stream is capturing"
                                                     : "invalid argument";
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaMalloc(void **p, size_t n) {
   *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
   return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
   (void)flags;
   *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
   return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int kind) {
   (void)kind;
   if (lm_emu_capture) return lm_emu_unsupported_in_capture(); /* it waits for the stream */
   if (n) memmove(d, s, n);
   return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, cudaStream_t st) {
   (void)st;
   if (lm_emu_capture) {
      /* a GPU captures a copy from pageable host memory as a node that reads the host address at
         each replay; lumen never queues one inside a capture (lm_cu_memcpy refuses first) */
      if (kind != cudaMemcpyDeviceToDevice) return lm_emu_unsupported_in_capture();
      lm_emu_capture->push_back([d, s, n]() {
         if (n) memmove(d, s, n);
         return 0;
      });
      return cudaSuccess;
   }
   return cudaMemcpy(d, s, n, kind);
}
static inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
   (void)st;
   if (lm_emu_capture) {
      lm_emu_capture->push_back([d, v, n]() {
         if (n) memset(d, v, n);
         return 0;
      });
      return cudaSuccess;
   }
   if (n) memset(d, v, n);
   return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
   (void)f;
   *s = (cudaStream_t)1;
   return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
   (void)s;
   return lm_emu_capture ? lm_emu_unsupported_in_capture() : cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
   return lm_emu_capture ? lm_emu_unsupported_in_capture() : cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
   (void)f;
   *e = (cudaEvent_t)1;
   return cudaSuccess;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e, (void)s; return cudaSuccess; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
   (void)e;
   return lm_emu_capture ? lm_emu_unsupported_in_capture() : cudaSuccess;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
   (void)s, (void)e, (void)f;
   return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
   *free_b = (size_t)1 << 34;
   *total = (size_t)1 << 34;
   return cudaSuccess;
}
#endif
