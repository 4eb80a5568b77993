/* alloc_api.cuh -- what alloc.cu (the caching allocator) and nccl.cu offer backend.cu for
 * liblumen's lm_cuda_* API (src/lumen.h: memory statistics, empty_cache, the memory fraction,
 * collections; NCCL). Kernels use cuda.cuh's lm_cu_alloc / lm_cu_free / lm_cu_memcpy only. */
#ifndef LUMEN_CUDA_ALLOC_API_CUH
#define LUMEN_CUDA_ALLOC_API_CUH
#include "cuda.cuh"

/* out[LM_CUDA_NSTATS] (lumen.h's LM_CUDA_STAT_*) of cuda:k */
lm_status lm_cu_memory_stats(int k, int64_t *out);
/* release cuda:k's cached whole segments (after a device synchronisation) */
lm_status lm_cu_empty_cache(int k);
void lm_cu_reset_peak(int k);
/* cap cuda:k's reserved bytes at fraction * its memory (torch.cuda.set_per_process_memory_fraction) */
lm_status lm_cu_set_memory_fraction(int k, double fraction);
/* Lua finished a collection: every device's growth is measured from its live bytes now */
void lm_cu_collected(void);

/* graph pools (graph.cu): from lm_cu_pool_begin until lm_cu_pool_end, cuda:k's allocations come
   from the private pool `id` (made on first use), which counts one more graph; lm_cu_pool_release
   is that graph gone. The pool's memory goes back to the GPU once no graph and no live block
   uses it. */
lm_status lm_cu_pool_begin(int k, uint64_t id);
void lm_cu_pool_end(int k);
void lm_cu_pool_release(int k, uint64_t id);

/* graph.cu: lumen.h's lm_cuda_graph_* (device.c checked the device) */
uint64_t lm_cu_graph_pool_handle(void);
lm_status lm_cu_graph_begin(int dev, uint64_t pool, lm_cuda_graph **out);
lm_status lm_cu_graph_end(lm_cuda_graph *g, int discard);
lm_status lm_cu_graph_replay(lm_cuda_graph *g);
uint64_t lm_cu_graph_pool(const lm_cuda_graph *g);
void lm_cu_graph_free(lm_cuda_graph *g);

/* backend.cu: after a library call that may have switched the current device itself (NCCL),
   the next lm_cu_set_device must call cudaSetDevice again */
void lm_cu_forget_device(void);

/* nccl.cu (src/device.c checked the tensors): ts[root] into every other ts[i]; out (on
   ins[root]'s GPU) = the sum of ins */
lm_status lm_cu_nccl_broadcast(lm_tensor **ts, int n, int root);
lm_status lm_cu_nccl_reduce_add(lm_tensor **ins, int n, lm_tensor *out, int root);
#endif
