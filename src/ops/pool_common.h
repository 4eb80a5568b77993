/* pool_common.h -- what the front ends of the 2-D pools (pool.c) and the 3-D pools (pool3d.c)
 * share (internal; implemented in pool_common.c): the input's rank and size checks, the window
 * geometry's checks and output sizes (kernel, stride, padding, dilation, ceil_mode, adaptive
 * output sizes), the gradient's checks, and the forward and backward runs (out slots, dense
 * operands, float32 copies of the halves, lm_dispatch). One set of rules and messages for n = 2
 * and n = 3 spatial dimensions, so the two op files hold only what differs: their params structs
 * (pool.h, pool3d.h, which the kernels read) and their ops' order of checks. */
#ifndef LUMEN_OPS_POOL_COMMON_H
#define LUMEN_OPS_POOL_COMMON_H
#include "common.h"

/* the front end's view of one pool call; spatial arrays hold the last n dimensions in order
   ({H, W} or {D, H, W}) */
typedef struct lm_pool_shape {
   int n;    /* spatial dimensions: 2 or 3 */
   int ndim; /* the input's rank: n + 1 (unbatched) or n + 2 */
   int mf;   /* LM_CONTIGUOUS, or the channels-last format of the rank */
   int64_t N, C;
   int64_t in[3], out[3];
   int64_t k[3], s[3], p[3], d[3]; /* kernel, stride, padding, dilation */
   int ceil_mode;
   int count_include_pad, has_div; /* avg_pool: has_div: divisor_override given (divisor) */
   int64_t divisor;
} lm_pool_shape;

/* x's rank (n + 1 or n + 2) and non-empty spatial and channel sizes, with PyTorch's messages
   (adaptive: the adaptive pools' ones, which name `what`); fills n, ndim, N, C, in and mf */
lm_status lm_pool_input(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                        int adaptive);

/* the window geometry of max_pool / avg_pool (stride NULL: the kernel; padding NULL: 0; dilation
   NULL: 1) checked, and the output sizes; g's input sizes set first (lm_pool_input) */
lm_status lm_pool_window(lm_pool_shape *g, const int64_t *kernel, const int64_t *stride,
                         const int64_t *padding, const int64_t *dilation, int ceil_mode);

/* the adaptive pools' output sizes (n of them, each >= 0) and their unit windows */
lm_status lm_pool_adaptive(lm_pool_shape *g, const int64_t *out_size, const char *what);

/* the output's sizes (ndim of them: N only for a batched input, C, out) */
void lm_pool_out_sizes(const lm_pool_shape *g, int64_t *sizes);

/* the checks and geometry of max_pool (what: its name): x floating, its sizes, the window */
lm_status lm_pool_max_setup(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                            const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                            const int64_t *dilation, int ceil_mode);
/* the same for avg_pool (no dilation), with its count_include_pad and divisor_override (NULL:
   none; 0 is an error) */
lm_status lm_pool_avg_setup(lm_pool_shape *g, int n, const lm_tensor *x, const char *what,
                            const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                            int ceil_mode, int count_include_pad,
                            const int64_t *divisor_override);

/* grad_out of x's dtype */
lm_status lm_pool_same_dtype(const lm_tensor *grad_out, const lm_tensor *x, const char *what);
/* grad_out of x's dtype, and of the output's shape */
lm_status lm_pool_check_grad(const lm_tensor *grad_out, const lm_tensor *x,
                             const lm_pool_shape *g, const char *what);
/* grad_out of x's rank (the adaptive backwards, and those without the geometry, then take the
   output sizes from it) */
lm_status lm_pool_same_rank(const lm_tensor *grad_out, const lm_tensor *x, const char *what);
/* t (named `name` in the message) of the given shape */
lm_status lm_pool_expect_shape(const lm_tensor *t, int ndim, const int64_t *sizes,
                               const char *name, const char *what);
/* the max pools' saved indices (int64) or tap numbers (uint8, codes) */
lm_status lm_pool_index_dtype(const lm_tensor *ind, int codes, const char *what);

/* a forward op: out (and indices, int64, when asked; or codes: the tap numbers into a new uint8
   tensor) allocated in g->mf on x's device, x made dense in mf (a float32 copy of a half x unless
   native: the kernel takes its dtype), and the op t = {x, out[, indices or codes]} of nt tensors
   dispatched; params is the op's params struct */
lm_status lm_pool_forward(const lm_tensor *x, const lm_pool_shape *g, int kind, const void *params,
                          int nt, int native, lm_tensor **out, lm_tensor **indices,
                          lm_tensor **codes);

/* a backward op: grad_x allocated like x in g->mf, grad_out (a float32 copy of a half one unless
   native) and ind (indices or tap numbers; NULL for the average pools) made dense in mf, and the
   op t = {grad_out[, ind], grad_x} dispatched. fresh (NULL where the params have none): set when
   grad_x is a tensor of this call that the kernel writes directly (streaming stores may pay) */
lm_status lm_pool_backward(const lm_tensor *grad_out, const lm_tensor *x, const lm_tensor *ind,
                           const lm_pool_shape *g, int kind, void *params, int native, int *fresh,
                           lm_tensor **grad_x);

#endif
