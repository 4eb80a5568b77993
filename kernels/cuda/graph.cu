/* graph.cu -- CUDA graphs: capture the work lumen queues on cuda:k's stream once, replay it many
 * times (lm.cuda.CUDAGraph, lm.cuda.graph; PyTorch's torch.cuda.CUDAGraph).
 *
 * A training step at a small batch is bound by its launches: hundreds of kernels, each a few
 * microseconds of host work (Lua, the front ends, cudaLaunchKernel). Captured, the step is one
 * cudaGraphLaunch. The rules are PyTorch's:
 *   - begin: the stream is synchronised, the device allocator switches to a private pool (alloc.cu:
 *     the graph's addresses are never handed to work outside it) and the stream starts capturing
 *     (cudaStreamCaptureModeGlobal). Nothing captured runs during the capture.
 *   - inside, nothing may wait for the GPU or copy between host and device: lm_cu_memcpy refuses
 *     with a message, the kernels that read a check back skip it (lm_cu_capturing), the cuDNN
 *     benchmark does not run (a shape the warm-up did not see takes the heuristic's algorithm).
 *   - end: the capture is instantiated (cudaGraphInstantiate); an aborted capture (an error inside
 *     lm.cuda.graph) is ended and dropped, and the device is usable again.
 *   - replay: cudaGraphLaunch on the device's stream, ordered with everything else queued there.
 *   - free (reset): the executable graph is destroyed and the pool released once no tensor holds
 *     one of its blocks.
 * One capture at a time in the process (PyTorch allows one per stream; lumen has one stream per
 * device and the emulated build one recording list).
 *
 * The emulated build (emu.h) records instead of capturing: every launch, library op and
 * device-side copy or fill becomes a closure in the graph's list while lm_emu_capture points at
 * it, and a replay runs the list -- so the semantics (nothing runs at capture, replays see the
 * current contents of the static inputs, the private pool's addresses) are checked on the host by
 * spec/cuda_graph_spec.lua. */
#include "cuda.cuh"
#include "alloc_api.cuh"
#include "cublas_handle.cuh"

#include <new>

#ifdef LM_CUDA_EMU
lm_emu_ops *lm_emu_capture = NULL;
bool lm_emu_capture_invalid = false;
#endif

struct lm_cuda_graph {
   int dev;
   uint64_t pool;
   int state; /* G_CAPTURING, G_READY or G_EMPTY */
#ifdef LM_CUDA_EMU
   lm_emu_ops ops;
#else
   cudaGraph_t graph;
   cudaGraphExec_t exec;
#endif
};

enum { G_CAPTURING = 0, G_READY = 1, G_EMPTY = 2 };

static int capturing[LM_NUM_CUDA];
static lm_cuda_graph *active; /* the capture in progress, or NULL */
static uint64_t last_pool;

int lm_cu_capturing(int k) {
   return k >= 0 && k < LM_NUM_CUDA && __atomic_load_n(&capturing[k], __ATOMIC_ACQUIRE);
}

int lm_cu_any_capturing(void) { return __atomic_load_n(&active, __ATOMIC_ACQUIRE) != NULL; }

uint64_t lm_cu_graph_pool_handle(void) { return __atomic_add_fetch(&last_pool, 1, __ATOMIC_RELAXED); }

lm_status lm_cu_graph_begin(int dev, uint64_t pool, lm_cuda_graph **out) {
   *out = NULL;
   if (active)
      return lm_error(LM_ERR_DEVICE, "a CUDA graph is already being captured on cuda:%d",
                      active->dev);
   LM_TRY(lm_cu_set_device(dev));
   const cudaStream_t s = lm_cu_stream(dev);
   /* what was queued before the capture is not part of it: let it finish */
   LM_CU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize");
   /* the libraries' handles exist before the capture (creating one allocates: its workspace
      would come from the graph's pool and keep it alive for good) */
   cublasHandle_t bh;
   LM_TRY(lm_cu_cublas_handle(dev, &bh));
   LM_TRY(lm_cu_dnn_ready(dev));
   lm_cuda_graph *g = new (std::nothrow) lm_cuda_graph();
   if (!g) return lm_error(LM_ERR_OOM, "out of memory");
   g->dev = dev;
   g->pool = pool ? pool : lm_cu_graph_pool_handle();
   g->state = G_CAPTURING;
   lm_status st = lm_cu_pool_begin(dev, g->pool);
   if (st != LM_OK) {
      delete g;
      return st;
   }
#ifdef LM_CUDA_EMU
   lm_emu_capture_invalid = false;
   lm_emu_capture = &g->ops;
#else
   st = lm_cu_err(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
   if (st != LM_OK) {
      lm_cu_pool_end(dev);
      lm_cu_pool_release(dev, g->pool);
      delete g;
      return st;
   }
#endif
   __atomic_store_n(&active, g, __ATOMIC_RELEASE);
   __atomic_store_n(&capturing[dev], 1, __ATOMIC_RELEASE);
   *out = g;
   return LM_OK;
}

lm_status lm_cu_graph_end(lm_cuda_graph *g, int discard) {
   if (g->state != G_CAPTURING || active != g)
      return lm_error(LM_ERR_ARG, "this CUDA graph is not being captured");
   const int dev = g->dev;
   __atomic_store_n(&capturing[dev], 0, __ATOMIC_RELEASE);
   __atomic_store_n(&active, (lm_cuda_graph *)NULL, __ATOMIC_RELEASE);
   lm_status st = LM_OK;
#ifdef LM_CUDA_EMU
   lm_emu_capture = NULL;
   if (lm_emu_capture_invalid && !discard)
      st = lm_error(LM_ERR_DEVICE, "cudaStreamEndCapture: the capture was invalidated (a "
                    "synchronising call or a host copy inside it)");
   if (discard || st != LM_OK) g->ops.clear();
#else
   cudaGraph_t graph = NULL;
   st = lm_cu_err(cudaStreamEndCapture(lm_cu_stream(dev), &graph), "cudaStreamEndCapture");
   if (st == LM_OK && !discard)
      st = lm_cu_err(cudaGraphInstantiate(&g->exec, graph, 0), "cudaGraphInstantiate");
   if (st == LM_OK && !discard) {
      g->graph = graph;
   } else if (graph) {
      cudaGraphDestroy(graph);
   }
#endif
   lm_cu_pool_end(dev);
   if (st != LM_OK || discard) {
      g->state = G_EMPTY;
      lm_cu_pool_release(dev, g->pool);
      return st;
   }
   g->state = G_READY;
   return LM_OK;
}

lm_status lm_cu_graph_replay(lm_cuda_graph *g) {
   if (g->state != G_READY)
      return lm_error(LM_ERR_ARG, g->state == G_CAPTURING
                                      ? "replay of a CUDA graph whose capture has not ended"
                                      : "replay of a CUDA graph that holds no capture (reset, or "
                                        "its capture failed)");
   if (active)
      return lm_error(LM_ERR_DEVICE, "replay of a CUDA graph while cuda:%d is capturing one",
                      active->dev);
   LM_TRY(lm_cu_set_device(g->dev));
#ifdef LM_CUDA_EMU
   for (auto &op : g->ops) {
      const int st = op();
      if (st != LM_OK) return (lm_status)st; /* the kernel set the message */
   }
   return LM_OK;
#else
   return lm_cu_err(cudaGraphLaunch(g->exec, lm_cu_stream(g->dev)), "cudaGraphLaunch");
#endif
}

uint64_t lm_cu_graph_pool(const lm_cuda_graph *g) { return g->pool; }

void lm_cu_graph_free(lm_cuda_graph *g) {
   if (!g) return;
   if (g->state == G_CAPTURING) lm_cu_graph_end(g, 1);
   if (g->state == G_READY) {
#ifndef LM_CUDA_EMU
      lm_cu_set_device(g->dev);
      /* destroyed at once, or when a replay still running ends (cudaGraphExecDestroy) */
      cudaGraphExecDestroy(g->exec);
      cudaGraphDestroy(g->graph);
#endif
      lm_cu_pool_release(g->dev, g->pool);
   }
   delete g;
}
