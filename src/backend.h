/* backend.h -- the seam between operators and devices (internal; not part of the FFI header).
 *
 * An operator (lm_conv2d, lm_binary, ...) is a front end in src/ops/ or src/: it checks its
 * arguments, works out the output's sizes and memory format, allocates every output through the
 * tensors' device (lm_empty, ...), then hands one lm_op to lm_dispatch. lm_dispatch finds the
 * device all the tensors are on and asks its backend: supports_op (else "not supported on
 * <device>") and compute. The front end never touches tensor memory, so it runs unchanged on
 * every device, the meta device included (whose compute does nothing).
 *
 * A backend is one lm_backend: memory (alloc, free, memcpy to and from the host) beside compute
 * and supports_op, the shape of ggml's backend interface (ggml-backend-impl.h). The CPU backend
 * (kernels/cpu/backend.c) computes from a table of kernels, one per lm_op_kind, filled once from
 * one hardware probe (lm_cpu_isa, kernels/cpu/isa.c), as XNNPACK fills its configs from
 * xnn_init_hardware_config. Adding an operator means: a kind below, a front end, and one kernel
 * per backend (docs/writing_operators.md).
 *
 * Devices (ids in lumen.h): cpu; meta (sizes, strides, dtype, format; no memory, no compute;
 * src/device.c); sim:0..3, the test device of kernels/sim/ (its own memory that the host cannot
 * read, explicit copies, the CPU's kernels); cuda:0..7 from liblumen_cuda.so (kernels/cuda/),
 * loaded on demand.
 */
#ifndef LUMEN_BACKEND_H
#define LUMEN_BACKEND_H
#include "internal.h"

/* Every operator kind, with the name its messages use. New kinds go at the end of their group. */
#define LM_OP_LIST(X)                                                                            \
   /* elementwise (src/elementwise.c; kernels/cpu/elementwise.c) */                              \
   X(UNARY, "unary") X(CLAMP, "clamp") X(BINARY, "binary") X(BINARY_SCALAR, "binary_scalar")     \
   X(BINARY_UNARY, "binary_unary") X(BINARY_SCALAR_UNARY, "binary_scalar_unary")                \
   X(ADDCMUL, "addcmul") X(ADDCDIV, "addcdiv") X(WHERE, "where") X(COPY, "copy_")               \
   X(FILL, "fill_")                                                                              \
   /* reductions, concatenation, random fills */                                                \
   X(REDUCE, "reduce") X(CAT, "cat") X(UNIFORM, "uniform_") X(NORMAL, "normal_")                 \
   X(RANDINT, "randint_") X(BERNOULLI, "bernoulli_") X(RANDPERM, "randperm")                      \
   /* linear algebra, convolution */                                                             \
   X(MATMUL, "matmul") X(CONV2D, "conv2d") X(CONV2D_BACKWARD, "conv2d_backward")                 \
   X(CONV3D, "conv3d") X(LINEAR, "linear")                                                       \
   /* pooling */                                                                                 \
   X(MAX_POOL2D, "max_pool2d") X(MAX_POOL2D_BACKWARD, "max_pool2d_backward")                     \
   X(MAX_POOL2D_TAPS, "max_pool2d_taps") X(MAX_POOL2D_TAPS_BACKWARD, "max_pool2d_taps_backward") \
   X(AVG_POOL2D, "avg_pool2d") X(AVG_POOL2D_BACKWARD, "avg_pool2d_backward")                     \
   X(ADAPTIVE_AVG_POOL2D, "adaptive_avg_pool2d")                                                 \
   X(ADAPTIVE_AVG_POOL2D_BACKWARD, "adaptive_avg_pool2d_backward")                               \
   X(ADAPTIVE_MAX_POOL2D, "adaptive_max_pool2d")                                                 \
   X(ADAPTIVE_MAX_POOL2D_BACKWARD, "adaptive_max_pool2d_backward")                               \
   X(MAX_POOL3D, "max_pool3d") X(MAX_POOL3D_BACKWARD, "max_pool3d_backward")                     \
   X(AVG_POOL3D, "avg_pool3d") X(AVG_POOL3D_BACKWARD, "avg_pool3d_backward")                     \
   X(ADAPTIVE_AVG_POOL3D, "adaptive_avg_pool3d")                                                 \
   X(ADAPTIVE_AVG_POOL3D_BACKWARD, "adaptive_avg_pool3d_backward")                               \
   X(ADAPTIVE_MAX_POOL3D, "adaptive_max_pool3d")                                                 \
   X(ADAPTIVE_MAX_POOL3D_BACKWARD, "adaptive_max_pool3d_backward")                               \
   /* resampling (F.interpolate's passes) */                                                     \
   X(RESAMPLE, "resample")                                                                       \
   /* normalisation, softmax, losses */                                                          \
   X(BATCH_NORM, "batch_norm") X(BATCH_NORM_BACKWARD, "batch_norm_backward")                     \
   X(GROUP_NORM, "group_norm") X(GROUP_NORM_BACKWARD, "group_norm_backward")                     \
   X(SOFTMAX, "softmax") X(SOFTMAX_BACKWARD, "softmax_backward")                                 \
   X(NLL_LOSS, "nll_loss") X(NLL_LOSS_BACKWARD, "nll_loss_backward")                             \
   /* optimizer steps */                                                                         \
   X(SGD_STEP, "sgd_step") X(ADAM_STEP, "adam_step")                                             \
   /* indexing: sort, gather, scatter_add, cumsum (src/ops/indexing.c) */                        \
   X(SORT, "sort") X(GATHER, "gather") X(SCATTER_ADD, "scatter_add") X(CUMSUM, "cumsum")

#define LM_OP_ENUM_(k, name) LM_OP_##k,
typedef enum lm_op_kind { LM_OP_LIST(LM_OP_ENUM_) LM_OP_COUNT } lm_op_kind;
#undef LM_OP_ENUM_

const char *lm_op_name(int kind);

/* One call of an operator, as the front end hands it to a backend. t[0 .. nt) are every tensor
 * the kernel reads or writes, outputs included, all on one device, in the order the op's
 * parameter header documents (an absent optional tensor is NULL). params points at the op's
 * parameter struct (its header under src/ops/), or NULL. */
typedef struct lm_op {
   int kind;              /* lm_op_kind */
   int nt;
   lm_tensor *const *t;
   const void *params;
} lm_op;

/* a kernel: computes op (its outputs are allocated, its arguments checked) */
typedef lm_status (*lm_kernel_fn)(const lm_op *op);

typedef struct lm_backend lm_backend;
struct lm_backend {
   const char *name; /* "cpu", "meta", "sim:0", "cuda:0" */
   int device;       /* its id (LM_CPU, LM_META, LM_SIM0 + k, LM_CUDA0 + k) */
   int host_visible; /* 1: the host may read and write its memory directly (the CPU only) */
   int has_memory;   /* 0: tensors have no storage bytes (meta) */
   /* memory */
   void *(*alloc)(const lm_backend *b, size_t nbytes);        /* NULL and an error on failure */
   void (*free)(const lm_backend *b, void *p, size_t nbytes);
   /* copy nbytes between this device and the host (dir 0: host->device, 1: device->host,
      2: within this device) */
   lm_status (*memcpy)(const lm_backend *b, void *dst, const void *src, size_t nbytes, int dir);
   /* compute */
   int (*supports_op)(const lm_backend *b, const lm_op *op);
   lm_status (*compute)(const lm_backend *b, const lm_op *op);
};

/* the backend of a device id; NULL (with an error set) if it is not available in this build */
const lm_backend *lm_backend_get(int device);
/* "cpu", "meta", "sim:1", "cuda:0", or "device 42" for an unknown id (buf: >= 16 bytes) */
const char *lm_device_name(int device, char *buf, size_t cap);

/* Run op on its tensors' device: every non-NULL t[i] must be on the same device ("expected all
 * tensors to be on the same device, got cpu and sim:0"); then supports_op ("<op> is not
 * supported on <device>") and compute. Meta tensors return LM_OK at once. */
lm_status lm_dispatch(const lm_op *op);

/* Does the device of op's tensors run this very call (its backend's supports_op with the
 * parameters)? For the kinds a device runs natively only in some cases (LM_OP_CONV3D), where
 * the front end has another route; 0 when the tensors' device is not available. */
int lm_op_supported(const lm_op *op);

/* Do a and b live on the same device? Else an LM_ERR_DEVICE error naming both and `what`. */
lm_status lm_check_same_device(const lm_tensor *a, const lm_tensor *b, const char *what);

/* Is t on a device whose memory the host may read? Else an LM_ERR_DEVICE error ("<what> is on
 * sim:0; copy it to the CPU first") -- for the few host-only entry points (file writers). */
lm_status lm_check_host(const lm_tensor *t, const char *what);

/* Run op on the CPU's kernels over host views of its tensors: each tensor struct copied with
 * device cpu, each storage struct copied with its data pointer mapped by to_host (NULL: kept);
 * tensors that share a storage share the copy, so the kernels' aliasing checks see what they
 * would see. foreign = 1: the memory is not the CPU allocator's (the views' storages get a no-op
 * deleter, so no CPU kernel reads or writes an allocator header in front of it). The test device
 * (sim: tagged addresses of lumen's allocator) and the emulated CUDA build's cuDNN / cuBLAS
 * families (host memory of the device allocator) compute this way. */
lm_status lm_compute_on_host(const lm_op *op, void *(*to_host)(void *), int foreign);

/* the backends (defined next to their kernels; src/device.c holds the registry and meta) */
const lm_backend *lm_cpu_backend(void);
const lm_backend *lm_sim_backend(int index);
/* the CUDA library (kernels/cuda/, liblumen_cuda.so) registers cuda:index from its lm_cuda_init
   (src/device.c loads it the first time a cuda:N device is asked for) */
void lm_cuda_register(int index, const lm_backend *b);

/* the CUDA library's side of lumen.h's lm_cuda_* API: lm_cuda_init registers it once, and
   src/device.c forwards to it after checking that the library loaded and dev exists (so these
   only ever see a valid dev, or -1 where lumen.h allows it) */
typedef struct lm_cuda_api {
   lm_status (*synchronize)(int dev);
   lm_status (*set_option)(int which, int value);
   int (*get_option)(int which);
   lm_status (*memory_stats)(int dev, int64_t *out);
   lm_status (*empty_cache)(int dev);
   void (*reset_peak)(int dev);
   lm_status (*set_memory_fraction)(int dev, double fraction);
   lm_status (*device_properties)(int dev, char *buf, size_t cap, int64_t *out);
   void (*versions)(int64_t *out);
   void (*collected)(void); /* Lua finished a collection (lm_mem_collected) */
   lm_status (*nccl_broadcast)(lm_tensor **ts, int n, int root);
   lm_status (*nccl_reduce_add)(lm_tensor **ins, int n, lm_tensor *out, int root);
   /* CUDA graphs (kernels/cuda/graph.cu) */
   uint64_t (*graph_pool_handle)(void);
   lm_status (*graph_begin)(int dev, uint64_t pool, lm_cuda_graph **out);
   lm_status (*graph_end)(lm_cuda_graph *g, int discard);
   lm_status (*graph_replay)(lm_cuda_graph *g);
   uint64_t (*graph_pool)(const lm_cuda_graph *g);
   void (*graph_free)(lm_cuda_graph *g);
   int (*is_capturing)(int dev);
} lm_cuda_api;
void lm_cuda_register_api(const lm_cuda_api *api);

/* lm_mem_collected (src/alloc.c) tells the device allocators (the CUDA library's, once loaded) */
void lm_device_collected(void);
/* a device allocator asks Lua for a collection: lm_mem_pressure() reports bit 8
   (LM_PRESSURE_DEVICE, src/alloc.c) until the next lm_mem_collected() */
void lm_mem_note_device_pressure(void);

/* a helper for front ends: the lm_op of kind over n tensors and params */
static inline lm_op lm_op_make(int kind, int nt, lm_tensor *const *t, const void *params) {
   lm_op op = {kind, nt, t, params};
   return op;
}

#endif
