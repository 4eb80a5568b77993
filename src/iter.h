/* iter.h -- the elementwise iterator (PyTorch's TensorIterator, spec section 6), dtype
 * conversion loops shared by the front ends (src/) and the CPU kernels (kernels/cpu/). Internal:
 * not part of the FFI header. */
#ifndef LUMEN_ITER_H
#define LUMEN_ITER_H
#include "backend.h"
#include <stdint.h>

enum {
   LM_ITER_MAX_OPS = 6, /* output + up to three inputs + pseudo operands */
   LM_CHUNK = 256,      /* elements per gather/compute/scatter chunk */
   LM_DT_INDEX = 100    /* pseudo dtype: the "address" the loop sees is a plain integer index
                           (elsize 1, so byte strides are index strides) */
};

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(LM_NO_CLONES)
#define LM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LM_CLONES
#endif

/* one operand: a strided view given by its address (not a tensor, so that scalars and internal
   scratch buffers can take part) */
typedef struct lm_operand {
   char *data;        /* address of element 0 */
   int dtype;         /* lm_dtype or LM_DT_INDEX */
   int ndim;
   int flags;         /* LM_FLAG_* of (sizes, strides) */
   int wrapped;       /* a wrapped number (Lua scalar): 0-dim, lowest promotion priority */
   int64_t sizes[LM_MAX_DIMS];
   int64_t strides[LM_MAX_DIMS]; /* in elements */
} lm_operand;

void lm_operand_tensor(lm_operand *op, const lm_tensor *t);
/* a 0-dim operand holding one element of `dtype` at data */
void lm_operand_scalar(lm_operand *op, void *data, int dtype, int wrapped);
void lm_operand_set(lm_operand *op, void *data, int dtype, int ndim, const int64_t *sizes,
                    const int64_t *strides);
int64_t lm_operand_numel(const lm_operand *op);
int lm_elsize(int dtype); /* lm_dtype_size, 1 for LM_DT_INDEX */

/* broadcast shape of the inputs; all_same: spec 6.1 (every input the same shape, no 0-dim/n-dim
   mix) */
lm_status lm_iter_shape(int nin, const lm_operand *ins, int *ndim, int64_t *shape, int *all_same);
/* the strides a new output gets (spec 6.2 - 6.5) for inputs broadcast to (ndim, shape) */
void lm_iter_output_strides(int nin, const lm_operand *ins, int ndim, const int64_t *shape,
                            int all_same, int64_t *strides);

typedef struct lm_iter {
   int nops, ndim;                                /* ndim >= 1 */
   int64_t numel;
   int64_t shape[LM_MAX_DIMS];                    /* iteration order: dim 0 is innermost */
   int64_t strides[LM_ITER_MAX_OPS][LM_MAX_DIMS]; /* bytes */
   uintptr_t base[LM_ITER_MAX_OPS];
   int dtype[LM_ITER_MAX_OPS];
} lm_iter;

/* Operands broadcast to (ndim, shape); the dims are ordered by PyTorch's reorder_dimensions with
   the operands voting in the order given (so put the operand whose memory order should drive the
   loop first), then adjacent dims that are contiguous for every operand are coalesced. */
void lm_iter_init(lm_iter *it, int nops, const lm_operand *ops, int ndim, const int64_t *shape);

/* fn processes n elements: data[k] is operand k's address, strides[k] its inner byte stride */
typedef void (*lm_loop_fn)(void *ctx, char **data, const int64_t *strides, int64_t n);
void lm_iter_serial(const lm_iter *it, int64_t begin, int64_t end, lm_loop_fn fn, void *ctx);
/* whole range, split over OpenMP threads when numel > LM_PARALLEL_GRAIN */
void lm_iter_run(const lm_iter *it, lm_loop_fn fn, void *ctx);
int lm_iter_threads(int64_t work); /* threads worth using for `work` elements */
/* the same with another grain: memory-bound loops (add, relu, copies: well under a nanosecond
   per element) pay for a parallel region only from LM_CHEAP_GRAIN elements */
enum { LM_CHEAP_GRAIN = 4 * LM_PARALLEL_GRAIN };
void lm_iter_run_grain(const lm_iter *it, lm_loop_fn fn, void *ctx, int64_t grain);
int lm_iter_threads_grain(int64_t work, int64_t grain);

/* 1 if more than one element of op refers to the same memory (stride 0 on a dim of size > 1) */
int lm_operand_internal_overlap(const lm_operand *op);
/* 0: disjoint memory, 1: the identical view, 2: partial overlap */
int lm_operands_overlap(const lm_operand *a, const lm_operand *b);

/* convert n elements between any two dtypes (byte strides; 0 repeats one source element) */
void lm_convert(int ddt, char *dst, int64_t ds, int sdt, const char *src, int64_t ss, int64_t n);

/* dst[...] = src broadcast to dst's shape, converted (shape and internal-overlap errors as
   copy_'s); dst and src must not share memory -- the host-side copies of src/ (host mirrors,
   lm_to_doubles). The kernels' copy, which resolves overlap and transposes in tiles, is
   lm_cpu_copy_operands (kernels/cpu/ew.h). */
lm_status lm_copy_operands(const lm_operand *dst, const lm_operand *src);
/* the shape error of a copy: "the source of shape [..] cannot be broadcast to shape [..]" (or
   LM_OK when src broadcasts to dst's shape) */
lm_status lm_copy_check_shape(int dnd, const int64_t *dsz, int snd, const int64_t *ssz);
/* "unsupported operation: more than one element of the written-to tensor refers to a single
   memory location. ..." */
lm_status lm_overlap_error(void);
/* a host-side view of a tensor's elements: for a CPU tensor the tensor's own memory; for a tensor
   on another device a host copy of the storage range it spans (loaded when `load`), written back
   by lm_mirror_end when `store` */
typedef struct lm_host_mirror {
   lm_operand op;
   char *buf;      /* host copy, NULL for a CPU tensor */
   char *dev_data; /* device address the copy came from */
   size_t nbytes;
   int device;
} lm_host_mirror;
lm_status lm_mirror_begin(const lm_tensor *t, int load, lm_host_mirror *m);
lm_status lm_mirror_end(lm_host_mirror *m, int store);

/* PyTorch's canCast: float -> integral and non-bool -> bool are not allowed */
int lm_can_cast(int from, int to);

#endif
