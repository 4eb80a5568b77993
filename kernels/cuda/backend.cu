/* backend.cu -- cuda:0 .. cuda:7: the lm_backend of each GPU, its stream, and lm_cuda_init, which
 * src/device.c calls once when it loads this library (cuda.cuh says how the backend is built).
 *
 * compute runs a kernel from one table, one entry per lm_op_kind, filled once at init by the
 * families' lm_cuda_register_<family>; supports_op is "the table has a kernel". Kernels are queued
 * on the device's stream and not waited for: errors a kernel meets while running (not at launch)
 * show at the next copy to the host, as in PyTorch. */
#include "cuda.cuh"

#ifndef LM_CUDA_EMU
#include <cudnn.h>
#endif
#include <stdio.h>
#include <stdlib.h>

static lm_kernel_fn table[LM_OP_COUNT];
static int ndev = 0;
static cudaStream_t streams[LM_NUM_CUDA];
static char names[LM_NUM_CUDA][16];
static lm_backend backends[LM_NUM_CUDA];
/* the device current on this thread (-1: not set yet); cudaSetDevice is cheap, but not free */
static thread_local int current = -1;

int lm_cu_device_count(void) { return ndev; }

static int options[LM_CU_NUM_OPTS] = {0, 1, 0, 0};
int lm_cu_option(int which) { return which >= 0 && which < LM_CU_NUM_OPTS ? options[which] : 0; }
cudaStream_t lm_cu_stream(int k) { return streams[k]; }

lm_status lm_cu_err(cudaError_t e, const char *what) {
   if (e == cudaSuccess) return LM_OK;
#ifndef LM_CUDA_EMU
   (void)cudaGetLastError(); /* clear a sticky launch error so the next call starts clean */
#endif
   return lm_error(LM_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

lm_status lm_cu_set_device(int k) {
   if (k == current) return LM_OK;
   LM_CU_TRY(cudaSetDevice(k), "cudaSetDevice");
   current = k;
   return LM_OK;
}

lm_status lm_cu_run_on_cpu(const lm_op *op) {
   enum { N = 16 };
   if (op->nt > N) return lm_error(LM_ERR_INTERNAL, "%s: too many tensors", lm_op_name(op->kind));
   lm_tensor tc[N];
   lm_storage sc[N];
   lm_tensor *tp[N];
   for (int i = 0; i < op->nt; i++) {
      const lm_tensor *t = op->t[i];
      tp[i] = NULL;
      if (!t) continue;
      tc[i] = *t;
      tc[i].device = LM_CPU;
      tc[i].storage = NULL;
      if (t->storage) {
         for (int j = 0; j < i && !tc[i].storage; j++)
            if (op->t[j] && op->t[j]->storage == t->storage) tc[i].storage = tc[j].storage;
         if (!tc[i].storage) {
            sc[i] = *t->storage;
            sc[i].device = LM_CPU;
            tc[i].storage = &sc[i];
         }
      }
      tp[i] = &tc[i];
   }
   lm_op host = *op;
   host.t = tp;
   const lm_backend *cpu = lm_cpu_backend();
   return cpu->compute(cpu, &host);
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
   return kernel_of(op->kind) != NULL;
}
static lm_status cu_compute(const lm_backend *b, const lm_op *op) {
   lm_kernel_fn k = kernel_of(op->kind);
   if (!k) return lm_error(LM_ERR_DEVICE, "%s is not supported on %s", lm_op_name(op->kind), b->name);
   LM_TRY(lm_cu_set_device(b->device - LM_CUDA0));
   return k(op);
}

/* the oldest cuDNN lumen accepts: 9.0 (the NHWC convolution and batch-norm paths used here; the
   version is checked here, at load, so an older library gives one clear message) */
enum { LM_CUDNN_MIN = 90000 };

extern "C" int lm_cuda_init(char *why, size_t cap) {
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
   /* environment overrides of the defaults: LUMEN_ALLOW_TF32=0|1 (both TF32 switches; the spec
      suite on a GPU runs with 0, as its float32 tolerances are the CPU's), LUMEN_CUDNN_BENCHMARK */
   const char *tf = getenv("LUMEN_ALLOW_TF32");
   if (tf && *tf) options[LM_CU_OPT_TF32_CONV] = options[LM_CU_OPT_TF32_MATMUL] = *tf == '1';
   const char *bm = getenv("LUMEN_CUDNN_BENCHMARK");
   if (bm && *bm) options[LM_CU_OPT_BENCHMARK] = *bm == '1';
   lm_cuda_register_elementwise(table);
   lm_cuda_register_reduce(table);
   lm_cuda_register_random(table);
   lm_cuda_register_linalg(table);
   lm_cuda_register_conv(table);
   lm_cuda_register_pool(table);
   lm_cuda_register_norm(table);
   lm_cuda_register_softmax(table);
   lm_cuda_register_optim(table);
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
   ndev = n;
   for (int k = 0; k < n; k++) lm_cuda_register(k, &backends[k]);
   return n;
}
