/* backend.cu -- cuda:0 .. cuda:7: the lm_backend of each GPU, its stream, and lm_cuda_init, which
 * src/device.c calls once when it loads this library (cuda.cuh says how the backend is built).
 *
 * compute runs a kernel from one table, one entry per lm_op_kind, filled once at init by the
 * families' lm_cuda_register_<family>; supports_op is "the table has a kernel". Kernels are queued
 * on the device's stream and not waited for: errors a kernel meets while running (not at launch)
 * show at the next copy to the host, as in PyTorch. */
#include "cuda.cuh"
#include "impl.h"
#include "alloc_api.cuh"

#ifndef LM_CUDA_EMU
#include <cublasLt.h>
#include <cudnn.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <memory>
#include <vector>

static lm_kernel_fn table[LM_OP_COUNT];
static int ndev = 0;
static cudaStream_t streams[LM_NUM_CUDA];
static char names[LM_NUM_CUDA][16];
static lm_backend backends[LM_NUM_CUDA];
/* the device current on this thread (-1: not set yet); cudaSetDevice is cheap, but not free */
static thread_local int current = -1;

int lm_cu_device_count(void) { return ndev; }

/* the switches (cuda.cuh's LM_CU_OPT_*, lumen.h's LM_CUDA_OPT_* for the Lua side): PyTorch's
   defaults (cudnn.benchmark off, cudnn.allow_tf32 on, cuda.matmul.allow_tf32 off,
   cudnn.deterministic off); LUMEN_CUDNN_BENCHMARK and LUMEN_ALLOW_TF32 override them at init */
static_assert((int)LM_CU_OPT_BENCHMARK == (int)LM_CUDA_OPT_BENCHMARK &&
              (int)LM_CU_OPT_TF32_CONV == (int)LM_CUDA_OPT_TF32_CONV &&
              (int)LM_CU_OPT_TF32_MATMUL == (int)LM_CUDA_OPT_TF32_MATMUL &&
              (int)LM_CU_OPT_DETERMINISTIC == (int)LM_CUDA_OPT_DETERMINISTIC &&
              (int)LM_CU_NUM_OPTS == (int)LM_CUDA_NUM_OPTS,
              "cuda.cuh's and lumen.h's option numbers must agree");
static int options[LM_CU_NUM_OPTS] = {0, 1, 0, 0};
int lm_cu_option(int which) {
   return which >= 0 && which < LM_CU_NUM_OPTS ? __atomic_load_n(&options[which], __ATOMIC_RELAXED)
                                               : 0;
}
cudaStream_t lm_cu_stream(int k) { return streams[k]; }

lm_status lm_cu_err(cudaError_t e, const char *what) {
   if (e == cudaSuccess) return LM_OK;
#ifndef LM_CUDA_EMU
   (void)cudaGetLastError(); /* clear a sticky launch error so the next call starts clean */
#endif
   return lm_error(LM_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

void lm_cu_forget_device(void) { current = -1; }

lm_status lm_cu_set_device(int k) {
   if (k == current) return LM_OK;
   LM_CU_TRY(cudaSetDevice(k), "cudaSetDevice");
   current = k;
   return LM_OK;
}

lm_status lm_cu_run_on_cpu(const lm_op *op) {
#ifdef LM_CUDA_EMU
   if (lm_emu_capture)
      return lm_error(LM_ERR_DEVICE, "%s: the emulated build's CPU fallback for this kernel cannot "
                      "be captured in a CUDA graph", lm_op_name(op->kind));
#endif
   /* the emulated build's device memory is host memory from the device allocator's segments */
   return lm_compute_on_host(op, NULL, 1);
}

#ifdef LM_CUDA_EMU
/* an op recorded into a graph: copies of its tensor and storage structs (tensors that shared a
   storage share the copy) and of its parameters; the data stays where it is, in device memory
   the graph's pool keeps */
struct RecordedOp {
   int kind, nt;
   std::vector<lm_tensor> t;
   std::vector<lm_storage> s;
   std::vector<int> present;
   std::vector<char> params;
};
#endif

lm_status lm_cu_run_on_cpu_p(const lm_op *op, size_t params_size) {
#ifdef LM_CUDA_EMU
   if (lm_emu_capture) {
      std::shared_ptr<RecordedOp> r = std::make_shared<RecordedOp>();
      r->kind = op->kind;
      r->nt = op->nt;
      r->t.resize((size_t)op->nt);
      r->present.assign((size_t)op->nt, 0);
      std::vector<int> sidx((size_t)op->nt, -1);
      for (int i = 0; i < op->nt; i++) {
         const lm_tensor *t = op->t[i];
         if (!t) continue;
         r->present[(size_t)i] = 1;
         r->t[(size_t)i] = *t;
         if (!t->storage) continue;
         for (int j = 0; j < i && sidx[(size_t)i] < 0; j++)
            if (op->t[j] && op->t[j]->storage == t->storage) sidx[(size_t)i] = sidx[(size_t)j];
         if (sidx[(size_t)i] < 0) {
            sidx[(size_t)i] = (int)r->s.size();
            r->s.push_back(*t->storage);
         }
      }
      for (int i = 0; i < op->nt; i++)
         r->t[(size_t)i].storage = sidx[(size_t)i] >= 0 ? &r->s[(size_t)sidx[(size_t)i]] : NULL;
      if (op->params && params_size)
         r->params.assign((const char *)op->params, (const char *)op->params + params_size);
      lm_emu_capture->push_back([r]() {
         std::vector<lm_tensor *> tp((size_t)r->nt, (lm_tensor *)NULL);
         for (int i = 0; i < r->nt; i++)
            if (r->present[(size_t)i]) tp[(size_t)i] = &r->t[(size_t)i];
         const lm_op o = lm_op_make(r->kind, r->nt, tp.data(),
                                    r->params.empty() ? NULL : r->params.data());
         return (int)lm_compute_on_host(&o, NULL, 1);
      });
      return LM_OK;
   }
#endif
   (void)params_size;
   return lm_compute_on_host(op, NULL, 1);
}

static void *cu_alloc(const lm_backend *b, size_t nbytes) {
   return lm_cu_alloc(b->device - LM_CUDA0, nbytes);
}
static void cu_free(const lm_backend *b, void *p, size_t nbytes) {
   lm_cu_free(b->device - LM_CUDA0, p, nbytes);
}
static lm_status cu_memcpy(const lm_backend *b, void *dst, const void *src, size_t nbytes, int dir) {
   return lm_cu_memcpy(b->device - LM_CUDA0, dst, src, nbytes, dir);
}
#ifdef LM_CUDA_EMU
/* LUMEN_CUDA_EMU_FALLBACK=1 (the emulated build only, for developing one family at a time): ops
   without a CUDA kernel run on the CPU's kernels instead of failing */
static int emu_fallback(void) {
   static int v = -1;
   if (v < 0) {
      const char *e = getenv("LUMEN_CUDA_EMU_FALLBACK");
      v = e && *e == '1';
   }
   return v;
}
#endif

static lm_kernel_fn kernel_of(int kind) {
   lm_kernel_fn k = kind >= 0 && kind < LM_OP_COUNT ? table[kind] : NULL;
#ifdef LM_CUDA_EMU
   if (!k && kind >= 0 && kind < LM_OP_COUNT && emu_fallback()) k = lm_cu_run_on_cpu;
#endif
   return k;
}
static int cu_supports(const lm_backend *b, const lm_op *op) {
   (void)b;
#ifdef LM_CUDA_EMU
   /* a kind run on the CPU's kernels (LUMEN_CUDA_EMU_FALLBACK=1) is taken where the CPU takes
      it: LM_OP_CONV3D only in the cases its supports_op accepts */
   if (op->kind >= 0 && op->kind < LM_OP_COUNT && !table[op->kind] && emu_fallback()) {
      const lm_backend *cpu = lm_cpu_backend();
      return cpu->supports_op(cpu, op);
   }
#endif
   return kernel_of(op->kind) != NULL;
}
/* ---- LUMEN_CUDA_PROFILE=N: the device time of every op kind ----
 * Counting starts at the N-th lm.cuda.synchronize() (0: at once), so that a benchmark's warm-up
 * steps (cuDNN's algorithm search) stay out of it. Each counted op waits for the stream before and after (so its kernels run alone and the host clock
 * measures them, launch latency included: a few microseconds per op), and the totals per op kind
 * and dtype of the first tensor are printed to stderr at exit, largest first. The synchronisation
 * makes the whole run slower; the shares are what it is for (tools/gpu_check.sh's profile step). */
static int profiling = -1;     /* -1: not read yet; 0 off; 1 on */
static int prof_wait = 0;      /* synchronize calls still to come before counting starts */
static double prof_ms[LM_OP_COUNT][LM_NUM_DTYPES];
static int64_t prof_calls[LM_OP_COUNT][LM_NUM_DTYPES];

static double now_ms(void) {
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void prof_report(void) {
   double total = 0;
   for (int k = 0; k < LM_OP_COUNT; k++)
      for (int d = 0; d < LM_NUM_DTYPES; d++) total += prof_ms[k][d];
   fprintf(stderr, "lumen cuda profile (LUMEN_CUDA_PROFILE): %.1f ms of op time\n", total);
   for (;;) {
      int bk = -1, bd = -1;
      for (int k = 0; k < LM_OP_COUNT; k++)
         for (int d = 0; d < LM_NUM_DTYPES; d++)
            if (prof_calls[k][d] && (bk < 0 || prof_ms[k][d] > prof_ms[bk][bd])) bk = k, bd = d;
      if (bk < 0) break;
      fprintf(stderr, "  %-30s %-9s %8lld calls %10.2f ms %5.1f%%\n", lm_op_name(bk),
              lm_dtype_name(bd), (long long)prof_calls[bk][bd], prof_ms[bk][bd],
              total > 0 ? 100 * prof_ms[bk][bd] / total : 0.0);
      prof_calls[bk][bd] = 0;
   }
}

static lm_status cu_compute(const lm_backend *b, const lm_op *op) {
   lm_kernel_fn k = kernel_of(op->kind);
   if (!k) return lm_error(LM_ERR_DEVICE, "%s is not supported on %s", lm_op_name(op->kind), b->name);
   const int dev = b->device - LM_CUDA0;
   LM_TRY(lm_cu_set_device(dev));
   if (profiling < 0) {
      const char *e = getenv("LUMEN_CUDA_PROFILE");
      profiling = e && *e >= '0' && *e <= '9';
      if (profiling) {
         prof_wait = atoi(e);
         atexit(prof_report);
      }
   }
   /* inside a graph capture nothing may wait for the stream: no timing */
   if (lm_cu_capturing(dev)) return k(op);
   if ((!profiling || prof_wait > 0) && lm_verbose()) {
      /* LUMEN_VERBOSE: the line's time is the device's (lm_dispatch times this call), so wait
         for the stream before and after, as the profile does */
      cudaStreamSynchronize(lm_cu_stream(dev));
      const lm_status st = k(op);
      cudaStreamSynchronize(lm_cu_stream(dev));
      lm_impl_ran_default("lumen_cuda"); /* lumen's own CUDA kernel (cuDNN / cuBLAS name theirs) */
      return st;
   }
   if (!profiling || prof_wait > 0) return k(op);
   int dt = 0;
   for (int i = 0; i < op->nt; i++)
      if (op->t[i]) {
         dt = op->t[i]->dtype;
         break;
      }
   cudaStreamSynchronize(lm_cu_stream(dev));
   const double t0 = now_ms();
   const lm_status st = k(op);
   cudaStreamSynchronize(lm_cu_stream(dev));
   if (dt >= 0 && dt < LM_NUM_DTYPES) {
      prof_ms[op->kind][dt] += now_ms() - t0;
      prof_calls[op->kind][dt]++;
   }
   return st;
}

/* ---- liblumen's lm_cuda_* API (src/device.c checked dev: valid, or -1 where allowed) ---- */

static lm_status api_synchronize(int dev) {
   if (prof_wait > 0) prof_wait--;
   for (int k = dev < 0 ? 0 : dev; k < (dev < 0 ? ndev : dev + 1); k++) {
      if (lm_cu_capturing(k))
         return lm_error(LM_ERR_DEVICE, "cuda:%d is capturing a CUDA graph: synchronize after "
                         "the capture", k);
      LM_TRY(lm_cu_set_device(k));
      /* the device, not only lumen's stream: library calls may have queued work elsewhere; and
         an error a kernel met while running shows here */
      LM_CU_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
   }
   return LM_OK;
}

static lm_status api_set_option(int which, int value) {
   __atomic_store_n(&options[which], value, __ATOMIC_RELAXED);
   return LM_OK;
}

static lm_status api_device_properties(int dev, char *buf, size_t cap, int64_t *out) {
#ifdef LM_CUDA_EMU
   size_t free_b = 0, total = 0;
   LM_CU_TRY(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
   snprintf(buf, cap, "emulated CUDA device %d (host memory, make cuda-emu)", dev);
   out[LM_CUDA_PROP_TOTAL_MEMORY] = (int64_t)total;
   out[LM_CUDA_PROP_SM_COUNT] = 1;
   out[LM_CUDA_PROP_MAJOR] = 0;
   out[LM_CUDA_PROP_MINOR] = 0;
#else
   cudaDeviceProp p;
   LM_CU_TRY(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
   snprintf(buf, cap, "%s", p.name);
   out[LM_CUDA_PROP_TOTAL_MEMORY] = (int64_t)p.totalGlobalMem;
   out[LM_CUDA_PROP_SM_COUNT] = p.multiProcessorCount;
   out[LM_CUDA_PROP_MAJOR] = p.major;
   out[LM_CUDA_PROP_MINOR] = p.minor;
#endif
   return LM_OK;
}

static void api_versions(int64_t *out) {
   for (int i = 0; i < LM_CUDA_NVERSIONS; i++) out[i] = 0;
#ifdef LM_CUDA_EMU
   out[LM_CUDA_VER_EMULATED] = 1;
#else
   int v = 0;
   if (cudaRuntimeGetVersion(&v) == cudaSuccess) out[LM_CUDA_VER_RUNTIME] = v;
   v = 0;
   if (cudaDriverGetVersion(&v) == cudaSuccess) out[LM_CUDA_VER_DRIVER] = v;
   (void)cudaGetLastError();
   out[LM_CUDA_VER_CUDNN] = (int64_t)cudnnGetVersion();
   out[LM_CUDA_VER_CUBLAS] = (int64_t)cublasLtGetVersion();
#endif
}

static const lm_cuda_api api = {
   api_synchronize,
   api_set_option,
   lm_cu_option,
   lm_cu_memory_stats,
   lm_cu_empty_cache,
   lm_cu_reset_peak,
   lm_cu_set_memory_fraction,
   api_device_properties,
   api_versions,
   lm_cu_collected,
   lm_cu_nccl_broadcast,
   lm_cu_nccl_reduce_add,
   lm_cu_graph_pool_handle,
   lm_cu_graph_begin,
   lm_cu_graph_end,
   lm_cu_graph_replay,
   lm_cu_graph_pool,
   lm_cu_graph_free,
   lm_cu_capturing,
};

/* LUMEN_CUDNN_BENCHMARK=0/1, LUMEN_ALLOW_TF32=0/1 (both TF32 switches) */
static void options_from_env(void) {
   const char *e = getenv("LUMEN_CUDNN_BENCHMARK");
   if (e && (!strcmp(e, "0") || !strcmp(e, "1"))) options[LM_CU_OPT_BENCHMARK] = *e - '0';
   e = getenv("LUMEN_ALLOW_TF32");
   if (e && (!strcmp(e, "0") || !strcmp(e, "1")))
      options[LM_CU_OPT_TF32_CONV] = options[LM_CU_OPT_TF32_MATMUL] = *e - '0';
}

/* the oldest cuDNN lumen accepts: 9.0 (the NHWC convolution and batch-norm paths used here; the
   version is checked here, at load, so an older library gives one clear message) */
enum { LM_CUDNN_MIN = 90000 };

extern "C" int lm_cuda_init(char *why, size_t cap) {
   /* the kernel table is indexed by lm_op_kind: built against another LM_OP_LIST, every index past
      the first difference would run the wrong kernel */
   if (lm_op_count() != LM_OP_COUNT) {
      snprintf(why, cap,
               "the CUDA library was built with %d operator kinds and liblumen.so has %d: rebuild "
               "both from one tree (make)",
               (int)LM_OP_COUNT, lm_op_count());
      return 0;
   }
   int n = 0;
   cudaError_t e = cudaGetDeviceCount(&n);
   if (e != cudaSuccess || n <= 0) {
      snprintf(why, cap, "no CUDA GPU: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
#ifndef LM_CUDA_EMU
      (void)cudaGetLastError();
#endif
      return 0;
   }
#ifndef LM_CUDA_EMU
   size_t v = cudnnGetVersion();
   if (v < LM_CUDNN_MIN) {
      snprintf(why, cap, "cuDNN %zu.%zu found, lumen needs cuDNN 9.0 or newer", v / 10000,
               v / 100 % 100);
      return 0;
   }
#endif
   if (n > LM_NUM_CUDA) n = LM_NUM_CUDA;
   lm_cuda_register_elementwise(table);
   lm_cuda_register_reduce(table);
   lm_cuda_register_random(table);
   lm_cuda_register_linalg(table);
   lm_cuda_register_conv(table);
   lm_cuda_register_pool(table);
   lm_cuda_register_pool3d(table);
   lm_cuda_register_norm(table);
   lm_cuda_register_group_norm(table);
   lm_cuda_register_softmax(table);
   lm_cuda_register_resample(table);
   lm_cuda_register_optim(table);
   lm_cuda_register_indexing(table);
   for (int k = 0; k < n; k++) {
      if (cudaSetDevice(k) != cudaSuccess ||
          cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking) != cudaSuccess) {
         snprintf(why, cap, "cuda:%d: cannot create a stream", k);
         n = k;
         break;
      }
      snprintf(names[k], sizeof names[k], "cuda:%d", k);
      lm_backend *b = &backends[k];
      b->name = names[k];
      b->device = LM_CUDA0 + k;
      b->host_visible = 0;
      b->has_memory = 1;
      b->alloc = cu_alloc;
      b->free = cu_free;
      b->memcpy = cu_memcpy;
      b->supports_op = cu_supports;
      b->compute = cu_compute;
   }
   if (n > 0) cudaSetDevice(0);
   current = n > 0 ? 0 : -1;
   ndev = n;
   options_from_env();
   for (int k = 0; k < n; k++) lm_cuda_register(k, &backends[k]);
   if (n > 0) lm_cuda_register_api(&api);
   return n;
}
