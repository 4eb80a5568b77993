/* cuda.cuh -- what every file of the CUDA backend (kernels/cuda/) shares.
 *
 * The backend is one more lm_backend (src/backend.h) per GPU, built into its own library,
 * build/liblumen_cuda.so, which src/device.c loads the first time a cuda:N device is asked for
 * (so liblumen.so itself never needs the CUDA runtime). backend.cu holds the lm_backend table
 * and lm_cuda_init; alloc.cu the caching device allocator and the copies; one file per operator
 * family registers its kernels with lm_cuda_register_<family>(table), as the CPU's do.
 *
 * Kernels: an op's per-element (or per-output) work is a __host__ __device__ body (LM_HD) run by
 * lm_cu_for(dev, n, body) over i in [0, n): a grid-stride loop on the GPU, a plain loop in the
 * emulated build (emu.h, `make cuda-emu`), so the same body is checked on the host by the whole
 * busted suite. Kernels that need cooperation between threads (block reductions) keep their
 * per-thread body LM_HD and give the emulated build a host loop over it (#ifdef LM_CUDA_EMU).
 *
 * Every kernel is launched on its device's one stream (lm_cu_stream); everything a kernel
 * allocates (workspace, temporaries) comes from the caching allocator (lm_cu_alloc) on that
 * stream, so it may be freed as soon as the kernels are queued. */
#ifndef LUMEN_CUDA_CUH
#define LUMEN_CUDA_CUH

#ifdef LM_CUDA_EMU
#include "emu.h"
#else
#include <cuda_runtime.h>
#endif

#define LM_HD __host__ __device__

extern "C" {
#include "backend.h"
}
#include <stdint.h>

/* ---- devices and streams (backend.cu) ---- */
int lm_cu_device_count(void);
/* the index k of cuda:k a tensor lives on */
static inline int lm_cu_index(const lm_tensor *t) { return t->device - LM_CUDA0; }
/* the device's stream: every kernel, copy and library call of lumen on cuda:k goes there */
cudaStream_t lm_cu_stream(int k);
/* make cuda:k current for this thread (cheap when it already is) */
lm_status lm_cu_set_device(int k);
/* LM_OK, or an LM_ERR_DEVICE error "<what>: <CUDA's message>" */
lm_status lm_cu_err(cudaError_t e, const char *what);
#define LM_CU_TRY(call, what)                                                                     \
   do {                                                                                          \
      cudaError_t lm_cu_e_ = (call);                                                             \
      if (lm_cu_e_ != cudaSuccess) return lm_cu_err(lm_cu_e_, (what));                           \
   } while (0)
/* run an op on the CPU's kernel over host views of the operands (the emulated build's way for
   the cuDNN / cuBLAS families; memory there is host memory). While a graph is captured the
   emulated build records the op instead (a copy of its tensors' views and of its params_size
   bytes of parameters) and runs it at each replay; lm_cu_run_on_cpu, without the size, refuses
   to be captured (the LUMEN_CUDA_EMU_FALLBACK kernels) */
lm_status lm_cu_run_on_cpu(const lm_op *op);
lm_status lm_cu_run_on_cpu_p(const lm_op *op, size_t params_size);

/* ---- CUDA graphs (graph.cu) ----
   Is cuda:k's stream being captured into a graph (lm.cuda.graph)? Then nothing may wait for the
   GPU or copy between host and device: a kernel that reads a check's result back (a bad class
   index, a max-pool index out of its window, an integer division by zero) skips that check
   inside a capture, as PyTorch's device-side asserts do not stop a graph either. */
int lm_cu_capturing(int k);
/* is any device capturing? (cudaStreamCaptureModeGlobal forbids unsafe calls from every thread
   and on every device while a capture runs) */
int lm_cu_any_capturing(void);
/* conv.cu: cuda:k's cuDNN handle, made before a capture begins (cudnnCreate allocates) */
lm_status lm_cu_dnn_ready(int k);

/* the backend's switches (lm.backends.cudnn.benchmark, ...; backend.cu holds them, the Lua side
   sets them through liblumen's lm_cuda_set_option): 0 or 1 */
enum {
   LM_CU_OPT_BENCHMARK = 0,    /* cuDNN: time every algorithm once per shape, keep the fastest */
   LM_CU_OPT_TF32_CONV = 1,    /* cuDNN convolutions may use TF32 tensor cores (PyTorch: on) */
   LM_CU_OPT_TF32_MATMUL = 2,  /* cuBLAS float32 products may use TF32 (PyTorch: off) */
   LM_CU_OPT_DETERMINISTIC = 3,/* only deterministic cuDNN algorithms */
   LM_CU_NUM_OPTS = 4
};
int lm_cu_option(int which);

/* ---- memory (alloc.cu) ---- */
/* device memory from cuda:k's caching allocator, usable by work queued on lm_cu_stream(k);
   NULL with an error set on failure (after emptying the cache and retrying once) */
void *lm_cu_alloc(int k, size_t nbytes);
void lm_cu_free(int k, void *p, size_t nbytes);
/* copy between the host and cuda:k (dir as lm_backend.memcpy: 0 host->device, 1 device->host,
   2 device->device); returns when the host side may be reused / read */
lm_status lm_cu_memcpy(int k, void *dst, const void *src, size_t nbytes, int dir);

/* ---- tensors ---- */
/* the address of t's first element (device memory) */
static inline char *lm_cu_ptr(const lm_tensor *t) {
   return (char *)t->storage->data + t->offset * (int64_t)lm_dtype_size(t->dtype);
}

/* sizes and strides (in elements) of a tensor, passed by value to a kernel */
typedef struct lm_cu_view {
   int nd;
   int64_t size[LM_MAX_DIMS];
   int64_t stride[LM_MAX_DIMS];
} lm_cu_view;

static inline lm_cu_view lm_cu_view_of(const lm_tensor *t) {
   lm_cu_view v;
   v.nd = t->ndim;
   for (int d = 0; d < LM_MAX_DIMS; d++) {
      v.size[d] = d < t->ndim ? t->sizes[d] : 1;
      v.stride[d] = d < t->ndim ? t->strides[d] : 0;
   }
   return v;
}
/* the element offset of the i-th element in row-major (logical) order */
static inline LM_HD int64_t lm_cu_offset(const lm_cu_view &v, int64_t i) {
   int64_t off = 0;
   for (int d = v.nd - 1; d >= 0; d--) {
      const int64_t s = v.size[d];
      const int64_t q = i / s;
      off += (i - q * s) * v.stride[d];
      i = q;
   }
   return off;
}

/* ---- launching ---- */
enum { LM_CU_THREADS = 256 };

#ifndef LM_CUDA_EMU
template <class F> __global__ void lm_cu_for_kernel(int64_t n, F body) {
   const int64_t step = (int64_t)blockDim.x * gridDim.x;
   for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) body(i);
}
#endif

#ifdef LM_CUDA_EMU
/* the emulated build's stand-in for a kernel launch of host code: fn() now, or, while a graph is
   being captured (emu.h's lm_emu_capture), a copy of fn kept for the graph's replays. fn captures
   by value (as a device lambda must): what it points at is device memory, which the graph's
   private pool keeps. */
template <class F> lm_status lm_cu_host(int k, const F &fn) {
   (void)k;
   if (lm_emu_capture) {
      lm_emu_capture->push_back(std::function<int()>([fn]() { return (int)fn(); }));
      return LM_OK;
   }
   return fn();
}
#endif

/* body(i) for every i in [0, n) on cuda:k's stream (a host loop in the emulated build) */
template <class F> lm_status lm_cu_for(int k, int64_t n, const F &body) {
   if (n <= 0) return LM_OK;
#ifdef LM_CUDA_EMU
   return lm_cu_host(k, [body, n]() {
      for (int64_t i = 0; i < n; i++) body(i);
      return LM_OK;
   });
#else
   int64_t blocks = (n + LM_CU_THREADS - 1) / LM_CU_THREADS;
   if (blocks > 132 * 64) blocks = 132 * 64; /* grid-stride beyond: 64 blocks per SM of an H200 */
   lm_cu_for_kernel<<<(unsigned)blocks, LM_CU_THREADS, 0, lm_cu_stream(k)>>>(n, body);
   return lm_cu_err(cudaPeekAtLastError(), "kernel launch");
#endif
}

/* ---- the families' registrations (one file each) ---- */
void lm_cuda_register_elementwise(lm_kernel_fn *table);
void lm_cuda_register_reduce(lm_kernel_fn *table);
void lm_cuda_register_random(lm_kernel_fn *table);
void lm_cuda_register_linalg(lm_kernel_fn *table);
void lm_cuda_register_conv(lm_kernel_fn *table);
void lm_cuda_register_pool(lm_kernel_fn *table);
void lm_cuda_register_pool3d(lm_kernel_fn *table);
void lm_cuda_register_norm(lm_kernel_fn *table);
void lm_cuda_register_group_norm(lm_kernel_fn *table);
void lm_cuda_register_softmax(lm_kernel_fn *table);
void lm_cuda_register_resample(lm_kernel_fn *table);
void lm_cuda_register_optim(lm_kernel_fn *table);
void lm_cuda_register_indexing(lm_kernel_fn *table);
#endif
