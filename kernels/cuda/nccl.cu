/* nccl.cu -- broadcast and sum across the GPUs of this process with NCCL (lm.comm on cuda tensors).
 *
 * lumen.h's lm_cuda_nccl_broadcast / lm_cuda_nccl_reduce_add reach these through the lm_cuda_api
 * table (src/device.c checked the tensors: dense, one dtype, sizes and strides, each on another
 * GPU). libnccl.so.2 is dlopen'ed on first use, so the CUDA library loads where NCCL is missing
 * (lm.comm then copies through the runtime, as before). One group of communicators is kept, made
 * with ncclCommInitAll for the devices of the last call in their order (rank i is ts[i]'s GPU);
 * a call over other devices makes a new one.
 *
 * Stream order: every rank's operation is queued on its GPU's stream (lm_cu_stream), after the
 * work that wrote its tensor and before anything queued later, so nothing waits on the host; a
 * tensor freed after the call goes back to its own stream's pool and is reused only after the
 * collective has read it.
 *
 * The emulated build has no NCCL: the same calls copy and add on the host (sums in double, each
 * output rounded once), so lm.comm's path through here is checked without GPUs. */
#include "cuda.cuh"
#include "alloc_api.cuh"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifndef LM_CUDA_EMU
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace {

#ifdef LM_CUDA_EMU

int64_t nbytes_of(const lm_tensor *t) { return t->numel * (int64_t)lm_dtype_size(t->dtype); }

lm_status emu_broadcast(lm_tensor **ts, int n, int root) {
   const char *src = lm_cu_ptr(ts[root]);
   for (int i = 0; i < n; i++)
      if (i != root) memmove(lm_cu_ptr(ts[i]), src, (size_t)nbytes_of(ts[i]));
   return LM_OK;
}

lm_status emu_reduce_add(lm_tensor **ins, int n, lm_tensor *out) {
   const int dt = out->dtype, es = lm_dtype_size(dt);
   /* dense tensors of one layout: element j of every one is at byte j * es from element 0 */
   char *o = lm_cu_ptr(out);
   for (int64_t j = 0; j < out->numel; j++) {
      double s = 0;
      for (int i = 0; i < n; i++) s += lm_load_as_double(lm_cu_ptr(ins[i]) + j * es, dt);
      lm_store_from_double(o + j * es, dt, s);
   }
   return LM_OK;
}

#else

struct Nccl {
   void *lib;
   const char *(*get_error_string)(ncclResult_t);
   ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
   ncclResult_t (*comm_destroy)(ncclComm_t);
   ncclResult_t (*group_start)(void);
   ncclResult_t (*group_end)(void);
   ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                             cudaStream_t);
   ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                          ncclComm_t, cudaStream_t);
   char why[256];
   /* the communicators of the last device list */
   int ndev;
   int devs[LM_NUM_CUDA];
   ncclComm_t comms[LM_NUM_CUDA];
};

Nccl nccl;
pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
pthread_mutex_t nccl_mu = PTHREAD_MUTEX_INITIALIZER;

template <class F> bool sym(F &f, const char *name) {
   f = (F)dlsym(nccl.lib, name);
   if (!f) snprintf(nccl.why, sizeof nccl.why, "libnccl has no %s", name);
   return f != NULL;
}

void nccl_load() {
   nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
   if (!nccl.lib) nccl.lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
   if (!nccl.lib) {
      const char *e = dlerror();
      snprintf(nccl.why, sizeof nccl.why, "cannot load libnccl.so.2: %.200s", e ? e : "?");
      return;
   }
   if (!sym(nccl.get_error_string, "ncclGetErrorString") ||
       !sym(nccl.comm_init_all, "ncclCommInitAll") || !sym(nccl.comm_destroy, "ncclCommDestroy") ||
       !sym(nccl.group_start, "ncclGroupStart") || !sym(nccl.group_end, "ncclGroupEnd") ||
       !sym(nccl.broadcast, "ncclBroadcast") || !sym(nccl.reduce, "ncclReduce")) {
      dlclose(nccl.lib);
      nccl.lib = NULL;
   }
}

lm_status nccl_err(ncclResult_t r, const char *what) {
   if (r == ncclSuccess) return LM_OK;
   return lm_error(LM_ERR_DEVICE, "%s: %s", what, nccl.get_error_string(r));
}
#define LM_NCCL_TRY(call, what)                                                                   \
   do {                                                                                          \
      ncclResult_t lm_nccl_r_ = (call);                                                          \
      if (lm_nccl_r_ != ncclSuccess) return nccl_err(lm_nccl_r_, (what));                         \
   } while (0)

bool nccl_dtype(int dt, ncclDataType_t *out) {
   switch (dt) {
   case LM_FLOAT32: *out = ncclFloat32; return true;
   case LM_FLOAT64: *out = ncclFloat64; return true;
   case LM_FLOAT16: *out = ncclFloat16; return true;
   case LM_BFLOAT16: *out = ncclBfloat16; return true;
   case LM_INT64: *out = ncclInt64; return true;
   case LM_INT32: *out = ncclInt32; return true;
   case LM_UINT8: *out = ncclUint8; return true;
   default: return false;
   }
}

/* the communicators of ts' devices, in order (nccl_mu held) */
lm_status comms_for(lm_tensor **ts, int n) {
   bool same = nccl.ndev == n;
   for (int i = 0; i < n && same; i++) same = nccl.devs[i] == lm_cu_index(ts[i]);
   if (same) return LM_OK;
   for (int i = 0; i < nccl.ndev; i++) nccl.comm_destroy(nccl.comms[i]);
   nccl.ndev = 0;
   int devs[LM_NUM_CUDA];
   for (int i = 0; i < n; i++) devs[i] = lm_cu_index(ts[i]);
   LM_NCCL_TRY(nccl.comm_init_all(nccl.comms, n, devs), "ncclCommInitAll");
   memcpy(nccl.devs, devs, sizeof(int) * (size_t)n);
   nccl.ndev = n;
   return LM_OK;
}

lm_status nccl_ready(void) {
   pthread_once(&nccl_once, nccl_load);
   if (!nccl.lib) return lm_error(LM_ERR_DEVICE, "NCCL is not available (%s)", nccl.why);
   return LM_OK;
}

lm_status run_broadcast(lm_tensor **ts, int n, int root) {
   ncclDataType_t dt;
   /* bool is bytes to a copy */
   if (ts[0]->dtype == LM_BOOL) dt = ncclUint8;
   else if (!nccl_dtype(ts[0]->dtype, &dt))
      return lm_error(LM_ERR_DTYPE, "NCCL broadcast: no NCCL type for %s",
                      lm_dtype_name(ts[0]->dtype));
   LM_TRY(comms_for(ts, n));
   const size_t count = (size_t)ts[0]->numel;
   LM_NCCL_TRY(nccl.group_start(), "ncclGroupStart");
   for (int i = 0; i < n; i++) {
      const ncclResult_t r = nccl.broadcast(lm_cu_ptr(ts[root]), lm_cu_ptr(ts[i]), count, dt, root,
                                            nccl.comms[i], lm_cu_stream(lm_cu_index(ts[i])));
      if (r != ncclSuccess) {
         nccl.group_end();
         return nccl_err(r, "ncclBroadcast");
      }
   }
   LM_NCCL_TRY(nccl.group_end(), "ncclGroupEnd");
   return LM_OK;
}

lm_status run_reduce_add(lm_tensor **ins, int n, lm_tensor *out, int root) {
   ncclDataType_t dt;
   if (!nccl_dtype(out->dtype, &dt))
      return lm_error(LM_ERR_DTYPE, "NCCL reduce: no NCCL sum for %s", lm_dtype_name(out->dtype));
   LM_TRY(comms_for(ins, n));
   const size_t count = (size_t)out->numel;
   LM_NCCL_TRY(nccl.group_start(), "ncclGroupStart");
   for (int i = 0; i < n; i++) {
      void *recv = i == root ? (void *)lm_cu_ptr(out) : NULL;
      const ncclResult_t r = nccl.reduce(lm_cu_ptr(ins[i]), recv, count, dt, ncclSum, root,
                                         nccl.comms[i], lm_cu_stream(lm_cu_index(ins[i])));
      if (r != ncclSuccess) {
         nccl.group_end();
         return nccl_err(r, "ncclReduce");
      }
   }
   LM_NCCL_TRY(nccl.group_end(), "ncclGroupEnd");
   return LM_OK;
}

#endif

} // namespace

/* ts[root] into every other ts[i] */
lm_status lm_cu_nccl_broadcast(lm_tensor **ts, int n, int root) {
   if (n <= 1 || ts[0]->numel == 0) return LM_OK;
#ifdef LM_CUDA_EMU
   return emu_broadcast(ts, n, root);
#else
   LM_TRY(nccl_ready());
   pthread_mutex_lock(&nccl_mu);
   const lm_status st = run_broadcast(ts, n, root);
   pthread_mutex_unlock(&nccl_mu);
   lm_cu_forget_device(); /* NCCL sets devices itself */
   return st;
#endif
}

/* out (on ins[root]'s device) = the sum of ins */
lm_status lm_cu_nccl_reduce_add(lm_tensor **ins, int n, lm_tensor *out, int root) {
   if (out->numel == 0) return LM_OK;
   if (out->dtype == LM_BOOL)
      return lm_error(LM_ERR_DTYPE, "NCCL reduce: bool tensors have no sum (use an integer dtype)");
#ifdef LM_CUDA_EMU
   (void)root;
   return emu_reduce_add(ins, n, out);
#else
   LM_TRY(nccl_ready());
   pthread_mutex_lock(&nccl_mu);
   const lm_status st = run_reduce_add(ins, n, out, root);
   pthread_mutex_unlock(&nccl_mu);
   lm_cu_forget_device(); /* NCCL sets devices itself */
   return st;
#endif
}
