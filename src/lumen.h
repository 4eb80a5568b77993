/*
 * lumen.h -- the public C API of lumen's core.
 *
 * This one header is what LuaJIT's ffi.cdef reads (the build strips every line that starts with
 * '#', see tools/gen_cdef.sh), so it holds only plain C declarations: no macros in declarations,
 * no inline functions, constants as enums.
 *
 * Conventions
 *   - Every fallible function returns an lm_status (LM_OK == 0). On failure the message is kept in
 *     a per-thread buffer and read with lm_last_error(); the Lua layer raises
 *     "lumen.<function>: <message>". C messages never name the Lua function.
 *   - Dimensions are 0-based in C (Lua converts from its 1-based dims). Sizes and strides are in
 *     logical order (N, C, H, W); strides are in elements.
 *   - Functions that produce a tensor take `lm_tensor **out`. If *out is NULL a new tensor is
 *     allocated (caller owns it, free with lm_tensor_free). If *out is not NULL it is used as the
 *     destination (an "out=" tensor): its shape must equal the result shape, its strides are kept,
 *     and its dtype must be able to hold the result.
 *   - A tensor owns a reference to its storage; views share the storage. Tensors themselves are
 *     single-owner (Lua owns each through lumen.memory.own: freed by a sweep once unreachable).
 */
#ifndef LUMEN_H
#define LUMEN_H
#include <stdint.h>
#include <stddef.h>

enum { LM_MAX_DIMS = 8 };

typedef enum lm_dtype {
   LM_FLOAT32 = 0, LM_FLOAT64 = 1, LM_FLOAT16 = 2, LM_BFLOAT16 = 3,
   LM_INT64 = 4, LM_INT32 = 5, LM_UINT8 = 6, LM_BOOL = 7, LM_NUM_DTYPES = 8
} lm_dtype;

typedef enum lm_memfmt {
   LM_CONTIGUOUS = 0, LM_CHANNELS_LAST = 1, LM_CHANNELS_LAST_3D = 2, LM_PRESERVE = 3
} lm_memfmt;

typedef enum lm_status {
   LM_OK = 0, LM_ERR_ARG = 1, LM_ERR_SHAPE = 2, LM_ERR_DTYPE = 3, LM_ERR_FORMAT = 4,
   LM_ERR_OOM = 5, LM_ERR_DEVICE = 6, LM_ERR_IO = 7, LM_ERR_INTERNAL = 8
} lm_status;

/* Devices: 0 is the CPU; 1 + k is cuda:k; LM_META is PyTorch's meta device (sizes, strides,
   dtype, format; no data); LM_SIM0 + k is sim:k, the test device (kernels/sim/: memory the host
   cannot read, the CPU's kernels). src/backend.h has the dispatch. */
enum { LM_CPU = 0, LM_CUDA0 = 1, LM_NUM_CUDA = 8, LM_META = 9, LM_SIM0 = 10, LM_NUM_SIM = 4,
       LM_MAX_DEVICES = 14 };

typedef struct lm_storage {
   void *data;
   int64_t nbytes;
   int32_t refcount;
   int32_t device;
   /* external memory (e.g. a memory-mapped file): released by deleter(ctx) instead of the
      allocator when the last reference goes. NULL for allocator-owned memory. */
   void (*deleter)(void *ctx);
   void *deleter_ctx;
} lm_storage;

typedef struct lm_tensor {
   lm_storage *storage;
   int64_t offset;                 /* in elements */
   int64_t numel;
   int32_t ndim;
   int32_t dtype;                  /* lm_dtype */
   int32_t device;                 /* LM_CPU, LM_CUDA0 + k, LM_META, LM_SIM0 + k */
   int32_t flags;                  /* cached LM_FLAG_* bits, refreshed on every size/stride change */
   int64_t sizes[8];
   int64_t strides[8];
} lm_tensor;

/* cached layout flags (lm_tensor.flags) */
enum {
   LM_FLAG_CONTIGUOUS = 1, LM_FLAG_CL_CONTIGUOUS = 2, LM_FLAG_CL3D_CONTIGUOUS = 4,
   LM_FLAG_CL_STRIDES = 8, LM_FLAG_CL3D_STRIDES = 16, LM_FLAG_NOD = 32
};

/* ---- errors (src/error.c) ---- */
const char *lm_last_error(void);
void lm_clear_error(void);

/* ---- dtypes (src/dtype.c) ---- */
int lm_dtype_size(int dtype);                 /* bytes per element; 0 for an invalid dtype */
const char *lm_dtype_name(int dtype);
int lm_dtype_is_floating(int dtype);
int lm_promote_types(int a, int b);           /* PyTorch's promote_types table */
float lm_half_to_float(uint16_t h);
uint16_t lm_float_to_half(float f);
float lm_bf16_to_float(uint16_t h);
uint16_t lm_float_to_bf16(float f);

/* ---- allocator (src/alloc.c): 64-byte aligned, size-bucketed cache, byte counters ---- */
void *lm_alloc(size_t nbytes);                /* NULL on failure (error set) */
void lm_free(void *p, size_t nbytes);
int64_t lm_mem_live_bytes(void);              /* bytes handed out and not yet freed */
int64_t lm_mem_peak_bytes(void);
void lm_mem_reset_peak(void);
int64_t lm_mem_cached_bytes(void);            /* bytes held by the cache, not live */
void lm_mem_empty_cache(void);
int64_t lm_mem_soft_limit(void);
void lm_mem_set_soft_limit(int64_t bytes);
int lm_mem_pressure(void);                    /* non-zero when live bytes crossed the soft limit,
                                                 large-block traffic the traffic limit, or a large
                                                 block came fresh past the miss floor (bits 1, 2,
                                                 4), or a GPU's live bytes grew past its limit (8,
                                                 kernels/cuda/alloc.cu), since the last
                                                 lm_mem_collected(); Lua then collects garbage */
int64_t lm_mem_traffic_limit(void);           /* 0: traffic does not trigger collections */
void lm_mem_set_traffic_limit(int64_t bytes);
int64_t lm_mem_miss_block(void);              /* the miss trigger's smallest block, 0: off */
void lm_mem_set_miss_block(int64_t bytes);    /* (resets the miss floor) */
int64_t lm_mem_miss_floor(void);              /* growth a miss needs before it collects */
int64_t lm_mem_cache_size(void);              /* last-level cache bytes (sysconf), 0 if unknown */
int64_t lm_mem_cache_share(void);             /* the last-level cache one process can count on:
                                                 lm_mem_cache_size() capped at 32 MiB (a virtual
                                                 machine reports its host's whole cache);
                                                 LUMEN_CACHE_SHARE overrides it */
int64_t lm_mem_cold_bytes(void);              /* the coldness threshold: half the last-level cache
                                                 (LUMEN_COLD_BYTES overrides); results this large
                                                 get room for two more before a collection */
void lm_mem_collected(void);                  /* Lua reports a finished collection (limit adapts) */
int64_t lm_mem_alloc_count(void);             /* calls that reached malloc (cache misses) */
int64_t lm_mem_fresh_large_count(void);       /* of those, blocks of 2 MiB or more */
/* was the block at p (from lm_alloc(nbytes)) cold when handed out: more than half the last-level
   cache in bytes handed out since its previous use, last written with streaming stores, or fresh
   from the system? (0 for small blocks) */
int lm_mem_is_cold(const void *p, size_t nbytes);
/* the block at p (from lm_alloc(nbytes)) was just written with streaming stores: its lines are in
   no cache, so it counts as cold when next handed out, however recently it was used */
void lm_mem_note_streamed(void *p, size_t nbytes);
/* was the block at p (from lm_alloc(nbytes)) last written with streaming stores (noted with
   lm_mem_note_streamed since it was handed out)? (0 for small blocks) */
int lm_mem_was_streamed(const void *p, size_t nbytes);

/* ---- CUDA (src/device.c forwards to build/liblumen_cuda.so, kernels/cuda/) ----
   liblumen never links CUDA: these load the CUDA library on first use (as a cuda:N tensor does)
   and fail with LM_ERR_DEVICE "CUDA is not available (<why>)" when it did not load or found no
   GPU, or "device cuda:N is not available (...)" for a GPU that is not there. dev is the N of
   cuda:N; -1 means every device where it says so. lua/lumen/cuda.lua is the Lua side (lm.cuda,
   lm.backends). */
/* the backend's switches (lm.backends.cudnn.benchmark, ...), each 0 or 1. Defaults: benchmark 0,
   tf32_conv 1, tf32_matmul 0, deterministic 0 (PyTorch's); LUMEN_CUDNN_BENCHMARK=0/1 and
   LUMEN_ALLOW_TF32=0/1 (both TF32 switches) override them when the library loads */
enum { LM_CUDA_OPT_BENCHMARK = 0, LM_CUDA_OPT_TF32_CONV = 1, LM_CUDA_OPT_TF32_MATMUL = 2,
       LM_CUDA_OPT_DETERMINISTIC = 3, LM_CUDA_NUM_OPTS = 4 };
/* the caching allocator's counters (lm_cuda_memory_stats): live bytes (blocks handed out, rounded
   to 512), their peak, reserved bytes (every segment: live + cached), cudaMalloc and cudaFree
   calls, allocations retried after releasing the cache, out-of-memory errors, and the growth of
   live bytes since the last collection that asks Lua for one (lm_mem_pressure bit 8) */
enum { LM_CUDA_STAT_LIVE = 0, LM_CUDA_STAT_PEAK = 1, LM_CUDA_STAT_RESERVED = 2,
       LM_CUDA_STAT_MALLOCS = 3, LM_CUDA_STAT_FREES = 4, LM_CUDA_STAT_RETRIES = 5,
       LM_CUDA_STAT_OOMS = 6, LM_CUDA_STAT_GROWTH_LIMIT = 7, LM_CUDA_NSTATS = 8 };
/* the versions as CUDA reports them (lm_cuda_versions): runtime and driver (1000 * major +
   10 * minor), cuDNN (cudnnGetVersion), cuBLAS(Lt) (cublasLtGetVersion); the last is 1 in the
   emulated build (make cuda-emu), whose versions are 0 */
enum { LM_CUDA_VER_RUNTIME = 0, LM_CUDA_VER_DRIVER = 1, LM_CUDA_VER_CUDNN = 2,
       LM_CUDA_VER_CUBLAS = 3, LM_CUDA_VER_EMULATED = 4, LM_CUDA_NVERSIONS = 5 };
/* lm_cuda_device_properties' out[]: total memory in bytes, multiprocessors, compute capability */
enum { LM_CUDA_PROP_TOTAL_MEMORY = 0, LM_CUDA_PROP_SM_COUNT = 1, LM_CUDA_PROP_MAJOR = 2,
       LM_CUDA_PROP_MINOR = 3, LM_CUDA_NPROPS = 4 };
lm_status lm_cuda_synchronize(int dev);       /* wait for everything queued on cuda:dev (-1: all) */
lm_status lm_cuda_set_option(int which, int value);    /* LM_CUDA_OPT_*; value 0 or 1 */
lm_status lm_cuda_get_option(int which, int *value);
lm_status lm_cuda_memory_stats(int dev, int64_t *out); /* out[LM_CUDA_NSTATS] */
lm_status lm_cuda_empty_cache(int dev);       /* release cached whole segments (-1: all devices) */
lm_status lm_cuda_reset_peak(int dev);        /* peak live bytes := live bytes now */
/* reserved bytes of cuda:dev at most fraction (0, 1] of its memory; beyond: out of memory */
lm_status lm_cuda_set_memory_fraction(int dev, double fraction);
/* the GPU's name (cudaGetDeviceProperties) into buf, and out[LM_CUDA_NPROPS] (may be NULL) */
lm_status lm_cuda_device_properties(int dev, char *buf, size_t cap, int64_t *out);
lm_status lm_cuda_versions(int64_t *out);     /* out[LM_CUDA_NVERSIONS] */
/* lm.comm on GPUs: NCCL across the GPUs of this process (kernels/cuda/nccl.cu; libnccl.so.2 is
   loaded on first use; the emulated build copies and adds on the host). The tensors are
   non-overlapping and dense, of one dtype, sizes and strides, each on another GPU. */
lm_status lm_cuda_nccl_broadcast(lm_tensor **ts, int n, int root);  /* ts[root] into the others */
/* out = the sum of ins[0..n) (not bool); out is on one of their GPUs */
lm_status lm_cuda_nccl_reduce_add(lm_tensor **ins, int n, lm_tensor *out);
/* CUDA graphs (kernels/cuda/graph.cu; lua/lumen/cuda_graph.lua is lm.cuda.CUDAGraph): begin
   captures the work queued on cuda:dev's stream into a new graph, whose memory comes from the
   caching allocator's private pool `pool` (0: a new one; else a lm_cuda_graph_pool_handle or
   another graph's lm_cuda_graph_pool, shared); nothing captured runs until a replay. end
   (discard 0) instantiates it; discard 1 drops an aborted capture. free destroys the graph (it
   ends a capture in progress) and releases its pool once no tensor holds a block of it. One
   capture at a time in the process. lm_cuda_is_capturing: 1 while cuda:dev captures, else 0
   (also when CUDA is not loaded). */
typedef struct lm_cuda_graph lm_cuda_graph;
lm_status lm_cuda_graph_pool_handle(uint64_t *out);
lm_status lm_cuda_graph_begin(int dev, uint64_t pool, lm_cuda_graph **out);
lm_status lm_cuda_graph_end(lm_cuda_graph *g, int discard);
lm_status lm_cuda_graph_replay(lm_cuda_graph *g);
uint64_t lm_cuda_graph_pool(const lm_cuda_graph *g);
void lm_cuda_graph_free(lm_cuda_graph *g);
int lm_cuda_is_capturing(int dev);

/* ---- storage and tensor lifetime (src/tensor.c) ---- */
lm_storage *lm_storage_new(int64_t nbytes, int device);
lm_storage *lm_storage_wrap(void *data, int64_t nbytes, int device,
                            void (*deleter)(void *ctx), void *ctx);
void lm_storage_retain(lm_storage *s);
void lm_storage_release(lm_storage *s);
void lm_tensor_free(lm_tensor *t);
void lm_tensor_free_many(lm_tensor **ts, int64_t n);
void lm_tensor_release_storage(lm_tensor *t); /* drop the data now; the struct stays valid (empty)
                                                 until lm_tensor_free */
void *lm_tensor_data(const lm_tensor *t);     /* address of element 0 (storage + offset) */
void lm_tensor_refresh(lm_tensor *t);         /* recompute numel and flags after editing sizes */
int lm_tensor_same_storage(const lm_tensor *a, const lm_tensor *b);

/* ---- creation ---- */
lm_status lm_compute_strides(int ndim, const int64_t *sizes, int fmt, int64_t *strides);
lm_status lm_empty(int ndim, const int64_t *sizes, int dtype, int fmt, int device, lm_tensor **out);
lm_status lm_empty_strided(int ndim, const int64_t *sizes, const int64_t *strides, int dtype,
                           int device, lm_tensor **out);
/* dtype < 0 keeps t's dtype; fmt may be LM_PRESERVE (spec section 5) */
lm_status lm_empty_like(const lm_tensor *t, int dtype, int fmt, lm_tensor **out);
lm_status lm_tensor_from_storage(lm_storage *s, int64_t offset, int ndim, const int64_t *sizes,
                                 const int64_t *strides, int dtype, lm_tensor **out);
void lm_infer_dense_strides(int ndim, const int64_t *sizes, const int64_t *strides,
                            int64_t *out_strides);

/* ---- memory-format predicates (src/memory_format.c) ---- */
int lm_is_contiguous(const lm_tensor *t, int fmt);
int lm_is_non_overlapping_and_dense(const lm_tensor *t);
int lm_is_channels_last_strides(const lm_tensor *t);     /* "strides like" (spec 2.3), 4-D */
int lm_is_channels_last_3d_strides(const lm_tensor *t);  /* 5-D */
int lm_suggest_memory_format(const lm_tensor *t, int exact);
/* flags for raw sizes/strides, without a tensor */
int lm_layout_flags(int ndim, const int64_t *sizes, const int64_t *strides);

/* ---- views (src/view.c): no data is copied; out is always a new tensor handle ---- */
lm_status lm_alias(const lm_tensor *t, lm_tensor **out);
lm_status lm_as_strided(const lm_tensor *t, int ndim, const int64_t *sizes,
                        const int64_t *strides, int64_t offset, lm_tensor **out);
/* sizes may hold one -1 (inferred); fails if the strides cannot express it */
lm_status lm_view(const lm_tensor *t, int ndim, const int64_t *sizes, lm_tensor **out);
/* a view when possible, else a contiguous copy */
lm_status lm_reshape(const lm_tensor *t, int ndim, const int64_t *sizes, lm_tensor **out);
lm_status lm_permute(const lm_tensor *t, const int *dims, lm_tensor **out);
lm_status lm_transpose(const lm_tensor *t, int d0, int d1, lm_tensor **out);
lm_status lm_expand(const lm_tensor *t, int ndim, const int64_t *sizes, lm_tensor **out);
lm_status lm_narrow(const lm_tensor *t, int dim, int64_t start, int64_t length, lm_tensor **out);
lm_status lm_select(const lm_tensor *t, int dim, int64_t index, lm_tensor **out);
lm_status lm_unsqueeze(const lm_tensor *t, int dim, lm_tensor **out);
lm_status lm_squeeze(const lm_tensor *t, int dim, lm_tensor **out);      /* dim < 0: all */
lm_status lm_flatten(const lm_tensor *t, int start_dim, int end_dim, lm_tensor **out);

/* ---- layout changes ---- */
/* clone with a memory format (LM_PRESERVE follows spec section 5) and optional dtype (< 0 keeps) */
lm_status lm_clone(const lm_tensor *t, int fmt, int dtype, lm_tensor **out);

/* ---- the elementwise engine (src/iter.c, src/elementwise.c) ---- */
typedef enum lm_unary_op {
   LM_NEG = 0, LM_ABS, LM_EXP, LM_LOG, LM_SQRT, LM_RSQRT, LM_RELU, LM_SIGMOID, LM_TANH,
   LM_SQUARE, LM_RECIPROCAL, LM_SIGN, LM_LOGICAL_NOT, LM_FLOOR, LM_CEIL, LM_ROUND, LM_SIN, LM_COS,
   LM_LOG1P, LM_EXPM1,
   /* activations (PyTorch's formulas): x * sigmoid(x); x * Phi(x) (erf); gelu's tanh form;
      x * clamp(x + 3, 0, 6) / 6; clamp(x + 3, 0, 6) / 6; x * tanh(log1p(exp(x))) */
   LM_SILU, LM_GELU, LM_GELU_TANH, LM_HARDSWISH, LM_HARDSIGMOID, LM_MISH,
   /* more of PyTorch's math (libm's functions; trunc of an integer is itself, the others give
      the default float dtype for integers) */
   LM_TRUNC, LM_LOG2, LM_LOG10, LM_EXP2, LM_TAN, LM_ASIN, LM_ACOS, LM_ATAN, LM_SINH, LM_COSH,
   LM_ASINH, LM_ACOSH, LM_ATANH, LM_ERF, LM_ERFC,
   LM_NUM_UNARY
} lm_unary_op;

typedef enum lm_binary_op {
   LM_ADD = 0,        /* a + alpha * b */
   LM_SUB,            /* a - alpha * b */
   LM_MUL, LM_DIV, LM_POW, LM_MAXIMUM, LM_MINIMUM,
   LM_EQ, LM_NE, LM_LT, LM_LE, LM_GT, LM_GE,            /* bool results */
   LM_LOGICAL_AND, LM_LOGICAL_OR,                         /* bool results */
   LM_RELU_BACKWARD,  /* a * (b > 0): a = grad, b = relu output or input */
   LM_SIGMOID_BACKWARD, /* a * b * (1 - b): a = grad, b = sigmoid output */
   LM_TANH_BACKWARD,  /* a * (1 - b*b): a = grad, b = tanh output */
   LM_FMOD, LM_ATAN2,
   /* the activations' gradients: a = grad, b = the activation's input */
   LM_SILU_BACKWARD, LM_GELU_BACKWARD, LM_GELU_TANH_BACKWARD, LM_HARDSWISH_BACKWARD,
   LM_HARDSIGMOID_BACKWARD, LM_MISH_BACKWARD,
   LM_RELU6_BACKWARD,       /* a * (0 < b < 6) (hardtanh's backward) */
   LM_LEAKY_RELU,           /* a > 0 ? a : a * b (b: the slope, a scalar) */
   LM_LEAKY_RELU_BACKWARD,  /* b > 0 ? a : a * alpha (alpha: the slope) */
   LM_ELU,                  /* a > 0 ? a : b * expm1(a) (b: alpha, a scalar) */
   LM_ELU_BACKWARD,         /* b > 0 ? a : a * alpha * exp(b) */
   LM_NUM_BINARY
} lm_binary_op;

lm_status lm_unary(int op, const lm_tensor *a, lm_tensor **out);
/* has_lo / has_hi select which bounds apply */
lm_status lm_clamp(const lm_tensor *a, double lo, double hi, int has_lo, int has_hi,
                   lm_tensor **out);
lm_status lm_binary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, lm_tensor **out);
/* tensor (op) scalar, or scalar (op) tensor when reverse != 0; the scalar is a "wrapped number"
   for type promotion; is_int tells whether the Lua number was integral */
lm_status lm_binary_scalar(int op, const lm_tensor *a, double s, int is_int, int reverse,
                           double alpha, lm_tensor **out);
/* uop(a op b) in one pass (deferred elementwise results, tensor.lua): op is add, sub, mul, div,
   maximum or minimum, uop a float unary op (neg, abs, exp, log, sqrt, rsqrt, relu, sigmoid, tanh,
   square, reciprocal, sin, cos, log1p, expm1), the result float32 or float64; *out must be NULL.
   Bit-identical to lm_unary(uop, lm_binary(op, a, b)). */
lm_status lm_binary_unary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, int uop,
                          lm_tensor **out);
lm_status lm_binary_scalar_unary(int op, const lm_tensor *a, double s, int is_int, int reverse,
                                 double alpha, int uop, lm_tensor **out);
lm_status lm_addcmul(const lm_tensor *a, const lm_tensor *b, const lm_tensor *c, double value,
                     lm_tensor **out);                     /* a + value * b * c */
lm_status lm_addcdiv(const lm_tensor *a, const lm_tensor *b, const lm_tensor *c, double value,
                     lm_tensor **out);                     /* a + value * b / c */
lm_status lm_where(const lm_tensor *cond, const lm_tensor *a, const lm_tensor *b,
                   lm_tensor **out);
/* dst[...] = src (broadcast to dst's shape, converted to dst's dtype); dst keeps its strides */
lm_status lm_copy_(lm_tensor *dst, const lm_tensor *src);
lm_status lm_fill_(lm_tensor *t, double value);
/* the result dtype of a binary op between two tensors (0-dim tensors weigh less, as in PyTorch) */
int lm_result_type(const lm_tensor *a, const lm_tensor *b);
int lm_result_type_scalar(const lm_tensor *a, int scalar_is_int, int scalar_is_bool);

/* ---- reductions (src/reduce.c) ---- */
typedef enum lm_reduce_op {
   LM_SUM = 0, LM_MEAN, LM_MAX, LM_MIN, LM_ARGMAX, LM_ARGMIN, LM_PROD, LM_NUM_REDUCE
} lm_reduce_op;
/* dims: 0-based, ndims == 0 reduces over all elements (output is 0-dim unless keepdim).
   indices (may be NULL) receives int64 positions for MAX/MIN along a single dim. */
lm_status lm_reduce(int op, const lm_tensor *a, const int *dims, int ndims, int keepdim,
                    int dtype, lm_tensor **out, lm_tensor **indices);

/* ---- joining ---- */
lm_status lm_cat(int n, const lm_tensor *const *ts, int dim, lm_tensor **out);

/* ---- random numbers (src/random.c): counter-based, independent of the thread count ---- */
void lm_manual_seed(uint64_t seed);
uint64_t lm_initial_seed(void);
/* the whole generator state (seed, counter offset), for checkpoints */
void lm_rng_get_state(uint64_t *seed, uint64_t *offset);
void lm_rng_set_state(uint64_t seed, uint64_t offset);
lm_status lm_uniform_(lm_tensor *t, double lo, double hi);
lm_status lm_normal_(lm_tensor *t, double mean, double std);
lm_status lm_randint_(lm_tensor *t, int64_t low, int64_t high);
lm_status lm_bernoulli_(lm_tensor *t, double p);          /* 1 with probability p, else 0 */
lm_status lm_randperm(int64_t n, lm_tensor **out);

/* ---- element access and bulk transfer (src/access.c) ---- */
/* idx holds t->ndim 0-based indices */
lm_status lm_get(const lm_tensor *t, const int64_t *idx, double *value);
lm_status lm_set(lm_tensor *t, const int64_t *idx, double value);
/* every element in logical (row-major) order, converted to/from double */
lm_status lm_to_doubles(const lm_tensor *t, double *buf);
lm_status lm_from_doubles(lm_tensor *t, const double *buf);

/* ---- threads ---- */
void lm_set_num_threads(int n);
int lm_get_num_threads(void);

/* ---- linear algebra (kernels/cpu/gemm.c; lm_matmul: src/ops/linalg.c, kernels/cpu/linalg.c) */
/* row-major C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; lda etc. are row strides */
void lm_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
              float *c, int64_t ldc);
void lm_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
              double *c, int64_t ldc);
/* The CPU kernels' instruction-set levels, in order (kernels/cpu/isa.c probes the best one):
   portable C, AVX2 + FMA, AVX-512, AVX-512 with AVX512_BF16 (vdpbf16ps: the bfloat16 kernels),
   AMX (the bfloat16 tile kernels, *_amx.c, on Intel Xeons from Sapphire Rapids on, once Linux
   grants the tiles). lm_cpu_set_isa forces a lower level (every kernel family follows; a level
   the CPU lacks falls to the best one below it; LM_ISA_AUTO: the best) and returns the level in
   use after the call; values outside the enum change nothing. lm_cpu_isa_name: the level's
   name ("c", "avx2", "avx512", "avx512_bf16", "amx"). lm_gemm_set_isa / lm_gemm_isa are the
   older names of lm_cpu_set_isa / lm_cpu_get_isa. */
enum { LM_ISA_AUTO = 0, LM_ISA_C = 1, LM_ISA_AVX2 = 2, LM_ISA_AVX512 = 3, LM_ISA_AVX512_BF16 = 4,
       LM_ISA_AMX = 5, LM_ISA_MAX = 5 };
int lm_cpu_set_isa(int isa);
int lm_cpu_get_isa(void);
const char *lm_cpu_isa_name(int isa);
int lm_gemm_set_isa(int isa);
int lm_gemm_isa(void);
/* 1 when this process can run AMX tiles (the CPU has them, the OS enables them and Linux granted
   the permission; the emulated build, `make amx-emu`, says 1 on any AVX512_BF16 machine); 0
   otherwise. Asks Linux once per process. */
int lm_cpu_amx_available(void);
/* the CPU kernels' switches (lm.backends.cpu), each 0 or 1. LM_CPU_OPT_BF16_WINOGRAD (default 1):
   bfloat16 3x3 stride-1 convolutions with 64 or more channels may run Winograd F(4x4, 3x3) with
   bfloat16 products (about ten times the direct kernels' rounding error, 1.6e-2 relative against
   1.7e-3: docs/mixed_precision.md); LUMEN_CONV_BF16_WINOGRAD=0 in the environment turns it off
   whatever the switch says */
/* LM_CPU_OPT_AMX (default 1, or 0 when the environment has LUMEN_AMX=0): bfloat16 GEMMs and
   convolutions on AMX tiles where lm_cpu_get_isa() is LM_ISA_AMX; 0 runs the AVX-512 kernels.
   LM_CPU_OPT_FP32_BF16 (default 0; lm.backends.cpu.fp32_precision = "bf16"): float32
   channels-last convolutions and float32 matrix products on AMX tiles, their operands rounded
   to bfloat16 and the products summed in float32 (PyTorch's fp32_precision = "bf16"); nothing
   changes where AMX is not in use. */
enum { LM_CPU_OPT_BF16_WINOGRAD = 0, LM_CPU_OPT_AMX = 1, LM_CPU_OPT_FP32_BF16 = 2,
       LM_CPU_NUM_OPTS = 3 };
lm_status lm_cpu_set_option(int which, int value);
lm_status lm_cpu_get_option(int which, int *value);
/* Which implementation ran (src/impl.h, docs/performance.md "Which kernel ran"). The CPU
   families with several kernels choose from ordered implementation lists; each implementation
   has a stable name. lm_cpu_impl_count / lm_cpu_impl_info: the names in order (NULL past the
   end), whether the name is its family's fallback (which cannot be switched off), the older
   environment variable that also switches it off ("0"), and a one-line description.
   lm_cpu_disable(name, 1) switches an implementation off (0: on again; the next entry of its
   list runs, with the same semantics), an error for an unknown name or a fallback;
   LUMEN_CPU_DISABLE=a,b does the same at start. lm_cpu_impl_disabled: 1 off, 0 on, -1 unknown.
   lm_set_verbose(level) (LUMEN_VERBOSE at start): 1 prints one line per kernel call on stderr,
   "lumen_verbose,exec,DEVICE,OP,IMPLEMENTATION,DTYPE,FORMAT,SHAPES,MS", 2 also each skipped
   entry, "lumen_verbose,skip,DEVICE,OP,IMPLEMENTATION,REASON"; returns the level before
   (levels outside 0..2 change nothing). */
int lm_cpu_impl_count(void);
const char *lm_cpu_impl_info(int i, int *fallback, const char **alias, const char **doc);
lm_status lm_cpu_disable(const char *name, int off);
int lm_cpu_impl_disabled(const char *name);
int lm_set_verbose(int level);
int lm_get_verbose(void);
/* the number of operator kinds this library was built with (LM_OP_COUNT of src/backend.h): the
   CUDA library built against another count refuses to load (kernels/cuda/backend.cu) */
int lm_op_count(void);
/* the name of operator kind 0 .. lm_op_count() - 1 as LM_OP_LIST spells it and messages and
   LUMEN_VERBOSE lines use ("conv2d", "max_pool2d_backward", "copy_"); NULL outside that range */
const char *lm_op_kind_name(int kind);
/* does device's backend have a kernel for operator kind? 1 yes, 0 no (or kind out of range), -1
   the device is not available (the reason in lm_last_error; cuda:N loads the CUDA library).
   meta says 1 for every kind (it computes nothing); sim:N has the CPU's kernels */
int lm_device_has_kernel(int device, int kind);
lm_status lm_matmul(const lm_tensor *a, const lm_tensor *b, lm_tensor **out);
/* out += a b (2-D, one dtype and device), each sum rounded once: torch.addmm with beta = alpha = 1 */
lm_status lm_addmm_(lm_tensor *out, const lm_tensor *a, const lm_tensor *b);
/* *out = act(x w^T + bias): F.linear (x (m, k), w (n, k), bias (n) or NULL; one floating dtype
   and device) with an activation after it (act: an lm_conv_act of src/conv.h, LM_ACT_NONE for
   none). *out must be NULL: a new contiguous (m, n) tensor. Where the device fuses it (the CPU,
   float32: bias and activation on each GEMM tile, no pass over the output) one kernel runs
   (LM_OP_LINEAR), elsewhere matmul, add and the activation op: the same values. */
lm_status lm_linear(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias, int act,
                    lm_tensor **out);

/* ---- files (src/io.c) ---- */
/* map a whole file (private, copy-on-write); the storage unmaps it when released */
lm_status lm_map_file(const char *path, lm_storage **out);
/* write head, then each tensor's elements in logical order, to tmp_path; fsync; rename to
   final_path. On failure tmp_path is removed and final_path is untouched. */
lm_status lm_write_file_atomic(const char *tmp_path, const char *final_path, const char *head,
                               int64_t head_len, int n, const lm_tensor *const *ts);
/* read len bytes at offset of a regular file into buf (an error past the end); *file_size (may
   be NULL) gets the file's size. Refuses FIFOs, devices and folders without blocking. */
lm_status lm_read_file_range(const char *path, int64_t offset, int64_t len, void *buf,
                             int64_t *file_size);
/* remove the temporary files "<path>.tmp.<pid>.<n>.<n>" an interrupted lm_write_file_atomic left
   (lm.save names them so): only those whose writer process is gone, that are regular files of
   this user, and that were not modified in the last min_age_s seconds. Best effort: a folder
   that cannot be read removes nothing. *removed (may be NULL) counts the files removed. */
lm_status lm_remove_stale_tmp(const char *path, int32_t min_age_s, int32_t *removed);
/* what path is, without opening it: 0 missing (or unreadable), 1 regular file, 2 folder,
   3 anything else (FIFO, socket, device) */
int32_t lm_path_kind(const char *path);
/* seconds on the monotonic clock */
double lm_clock(void);

/* ---- data loading (src/data.c) ---- */
/* read an IDX file (MNIST format; gzip-compressed or plain) into a contiguous tensor */
lm_status lm_idx_read(const char *path, lm_tensor **out);

typedef struct lm_loader lm_loader;
typedef struct lm_loader_opts {
   int64_t batch_size;
   int32_t drop_last;
   int32_t out_fmt;        /* LM_CHANNELS_LAST or LM_CONTIGUOUS for the image batch */
   int32_t pad;            /* zero padding before a random crop (0: none) */
   int32_t crop_h, crop_w; /* random crop size (0: the image size) */
   int32_t hflip;          /* random horizontal flip with probability 1/2 */
   int32_t workers;        /* worker threads (>= 1) */
   int32_t prefetch;       /* batches ready ahead (>= 1) */
   uint64_t seed;
   float mean[4], std[4];  /* per channel: out = (x / 255 - mean) / std */
   int64_t start_batch;    /* skip the batches before this one (resuming mid-epoch) */
   int32_t skip_corrupt;   /* image files: a sample that cannot be decoded is left out of its
                              batch (which is then smaller; a batch with no sample left has 0
                              rows) instead of failing the batch; see lm_loader_skipped */
} lm_loader_opts;
/* images: uint8 (N, H, W) or (N, H, W, C); labels: int64 (N) or NULL; order: the epoch's sample
   indices (0-based). Batches come out as float32 (B, C, H, W) in opts->out_fmt. */
lm_status lm_loader_new(const lm_tensor *images, const lm_tensor *labels, const int64_t *order,
                        int64_t n_order, const lm_loader_opts *opts, lm_loader **out);
int64_t lm_loader_num_batches(const lm_loader *l);
/* the next batch in order (caller owns x and y); *x == NULL after the last batch */
lm_status lm_loader_next(lm_loader *l, lm_tensor **x, lm_tensor **y);
/* the samples left out of the batch lm_loader_next returned last (skip_corrupt): one line per
   sample, "<index, 0-based>\t<message naming the file>\n"; "" when none. Valid until the next
   lm_loader_next or lm_loader_free. */
const char *lm_loader_skipped(const lm_loader *l);
void lm_loader_free(lm_loader *l);
/* idx = a permutation of 0..n-1 that depends only on seed */
lm_status lm_permutation(int64_t *idx, int64_t n, uint64_t seed);

/* ---- images (src/image.c): JPEG through libjpeg-turbo, PNG through libpng ---- */
/* bit 1: JPEG decoding is available, bit 2: PNG (liblumen linked with -ljpeg / -lpng) */
int lm_image_support(void);
/* decode a JPEG or PNG file (recognised by its content) into uint8 (H, W, 3) RGB; grayscale is
   replicated, alpha dropped, CMYK converted */
lm_status lm_image_read(const char *path, lm_tensor **out);
/* how each image becomes an out_h x out_w sample: the region (crop) of the image is resampled
   with PIL's bilinear filter (antialiased when shrinking) */
enum { LM_CROP_NONE = 0, LM_CROP_CENTER = 1, LM_CROP_RANDOM = 2 };
typedef struct lm_image_opts {
   int32_t out_h, out_w;   /* sample size */
   int32_t crop;           /* NONE: the whole image (aspect not kept); CENTER: scale the shorter
                              side to `resize`, take the central out_h x out_w; RANDOM: torchvision's
                              RandomResizedCrop (area fraction in scale, aspect w/h in ratio) */
   int32_t resize;         /* CENTER: the shorter side after scaling (0: just cover the output) */
   float scale[2];         /* RANDOM: area fraction range, 0 < lo <= hi <= 1 */
   float ratio[2];         /* RANDOM: aspect ratio range, 0 < lo <= hi */
   int32_t draft;          /* JPEG: decode at 1/2, 1/4 or 1/8 size when the region stays at least
                              as large as the sample (faster, slightly different pixels) */
} lm_image_opts;
/* decode one image and resample it as the loader does into out, a float32 (1, 3, out_h, out_w)
   tensor of any layout: (x / 255 - mean) / std per channel; seed drives the RANDOM crop */
lm_status lm_image_load(const char *path, const lm_image_opts *io, uint64_t seed, int32_t hflip,
                        const float *mean, const float *std, lm_tensor *out);
/* an immutable list of image files with int64 labels (may be NULL), shared by loaders */
typedef struct lm_image_list lm_image_list;
lm_status lm_image_list_new(const char *const *paths, const int64_t *labels, int64_t n,
                            lm_image_list **out);
void lm_image_list_free(lm_image_list *l); /* drops the caller's reference */
/* a loader over image files: decoding, crop, resize, flip and normalisation happen in the
   worker threads, straight into float32 (B, 3, out_h, out_w) batches in opts->out_fmt.
   opts->pad / crop_h / crop_w must be 0 (the region comes from io). */
lm_status lm_image_loader_new(lm_image_list *files, const int64_t *order, int64_t n_order,
                              const lm_image_opts *io, const lm_loader_opts *opts,
                              lm_loader **out);
/* names in a directory, sorted bytewise, without those starting with '.': kind 1 lists the
   sub-directories, 2 the regular files (symbolic links followed). *out holds *n names, each
   ended by '\0' (free with lm_dir_list_free). */
lm_status lm_dir_list(const char *path, int32_t kind, char **out, int64_t *n);
void lm_dir_list_free(char *names);

#endif
