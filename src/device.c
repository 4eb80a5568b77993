/* device.c -- the device registry, the meta device, and lm_dispatch (backend.h).
 *
 * Device ids (lumen.h): LM_CPU; LM_CUDA0 + k (a CUDA build, kernels/cuda/); LM_META; LM_SIM0 + k
 * (the test device, kernels/sim/). The registry is constant: every backend is a static table
 * that its own file hands out, so nothing here changes at run time. */
#include "backend.h"
#include "impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const op_names[LM_OP_COUNT] = {
#define LM_OP_NAME_(k, name) name,
   LM_OP_LIST(LM_OP_NAME_)
#undef LM_OP_NAME_
};

const char *lm_op_name(int kind) {
   return kind >= 0 && kind < LM_OP_COUNT ? op_names[kind] : "unknown operator";
}

int lm_op_count(void) { return LM_OP_COUNT; }

const char *lm_op_kind_name(int kind) {
   return kind >= 0 && kind < LM_OP_COUNT ? op_names[kind] : NULL;
}

/* ---- meta: sizes, strides, dtype and memory format only ----
 * A meta storage has no bytes. Its data pointer is a fixed non-canonical address (bit 62 set), so
 * a path that dereferences it faults at once instead of reading something; pointer arithmetic on
 * it stays defined (it is not NULL). Values are never read: lm_get, lm_copy_ out of meta, the
 * file writers refuse meta tensors with a message first. */
#define META_DATA ((void *)((uintptr_t)1 << 62))

static void *meta_alloc(const lm_backend *b, size_t nbytes) {
   (void)b, (void)nbytes;
   return META_DATA;
}
static void meta_free(const lm_backend *b, void *p, size_t nbytes) { (void)b, (void)p, (void)nbytes; }
/* into meta (from the host, or within meta): nothing to do; out of meta: there is no data */
static lm_status meta_memcpy(const lm_backend *b, void *dst, const void *src, size_t nbytes,
                             int dir) {
   (void)b, (void)dst, (void)src, (void)nbytes;
   if (dir == 1) return lm_error(LM_ERR_DEVICE, "cannot copy out of a meta tensor: it has no data");
   return LM_OK;
}
static int meta_supports(const lm_backend *b, const lm_op *op) { (void)b, (void)op; return 1; }
static lm_status meta_compute(const lm_backend *b, const lm_op *op) { (void)b, (void)op; return LM_OK; }

static const lm_backend meta_backend = {"meta", LM_META, 0, 0, meta_alloc, meta_free,
                                        meta_memcpy, meta_supports, meta_compute};

/* ---- the CPU's kernels over host views (backend.h) ---- */

/* the foreign views' deleter, never called (the views are stack copies): a CPU kernel takes a
   storage without a deleter for one of the CPU allocator's blocks (lm_tensor_block_cold) and
   would read, after streaming stores write (lm_tensor_note_streamed), the allocator's header in
   front of it: in front of a device block, that is a neighbouring block */
static void not_an_lm_alloc_block(void *ctx) { (void)ctx; }

enum { HOST_VIEWS_INLINE = 8 };

lm_status lm_compute_on_host(const lm_op *op, void *(*to_host)(void *), int foreign) {
   lm_tensor tin[HOST_VIEWS_INLINE], *tp_in[HOST_VIEWS_INLINE];
   lm_storage sin[HOST_VIEWS_INLINE];
   lm_tensor *tc = tin, **tp = tp_in;
   lm_storage *sc = sin;
   const int n = op->nt;
   if (n > HOST_VIEWS_INLINE) {
      tc = malloc(sizeof *tc * (size_t)n);
      tp = malloc(sizeof *tp * (size_t)n);
      sc = malloc(sizeof *sc * (size_t)n);
      if (!tc || !tp || !sc) {
         free(tc), free(tp), free(sc);
         return lm_error(LM_ERR_OOM, "out of memory");
      }
   }
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = op->t[i];
      if (!t) {
         tp[i] = NULL;
         continue;
      }
      tc[i] = *t;
      tc[i].device = LM_CPU;
      tc[i].storage = NULL;
      if (t->storage) {
         for (int j = 0; j < i && !tc[i].storage; j++)
            if (op->t[j] && op->t[j]->storage == t->storage) tc[i].storage = tc[j].storage;
         if (!tc[i].storage) {
            sc[i] = *t->storage;
            if (to_host) sc[i].data = to_host(t->storage->data);
            sc[i].device = LM_CPU;
            if (foreign) sc[i].deleter = not_an_lm_alloc_block;
            tc[i].storage = &sc[i];
         }
      }
      tp[i] = &tc[i];
   }
   lm_op host = *op;
   host.t = tp;
   const lm_backend *cpu = lm_cpu_backend();
   lm_status st = cpu->compute(cpu, &host);
   if (n > HOST_VIEWS_INLINE) free(tc), free(tp), free(sc);
   return st;
}

/* ---- CUDA: a second library, loaded on demand ----
 * The CUDA backend is build/liblumen_cuda.so (kernels/cuda/, built by `make` when nvcc is found).
 * liblumen.so never links the CUDA runtime, so it loads on machines without CUDA; the first time a
 * cuda:N device is asked for, the library beside liblumen.so (or $LUMEN_CUDA_LIB) is dlopen'ed and
 * its lm_cuda_init() registers one backend per usable GPU through lm_cuda_register. No library, no
 * driver, no GPU: cuda:N stays "not available", with the reason in the message. */
static const lm_backend *cuda_backends[LM_NUM_CUDA];
static char cuda_why[256] = "lumen was built without CUDA";
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

void lm_cuda_register(int index, const lm_backend *b) {
   if (index >= 0 && index < LM_NUM_CUDA) cuda_backends[index] = b;
}

static void cuda_load(void) {
   const char *env = getenv("LUMEN_CUDA_LIB");
   char path[4096];
   if (env && *env) snprintf(path, sizeof path, "%s", env);
   else {
      Dl_info info;
      if (!dladdr((void *)&lm_cuda_register, &info) || !info.dli_fname) return;
      const char *slash = strrchr(info.dli_fname, '/');
      int dir = slash ? (int)(slash - info.dli_fname) : 0;
      snprintf(path, sizeof path, "%.*s%sliblumen_cuda.so", dir, info.dli_fname, slash ? "/" : "");
   }
   void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
   if (!h) {
      const char *e = dlerror();
      /* no library at all: a build without CUDA (the message above stands); one that does not
         load (no CUDA runtime on this machine): say why */
      if ((env && *env) || access(path, F_OK) == 0)
         snprintf(cuda_why, sizeof cuda_why, "cannot load %.100s: %.140s", path, e ? e : "?");
      return;
   }
   int (*init)(char *, size_t) = (int (*)(char *, size_t))dlsym(h, "lm_cuda_init");
   if (!init) {
      snprintf(cuda_why, sizeof cuda_why, "%.200s has no lm_cuda_init", path);
      return;
   }
   if (init(cuda_why, sizeof cuda_why) <= 0 && !cuda_why[0])
      snprintf(cuda_why, sizeof cuda_why, "no CUDA GPU was found");
}

/* ---- lumen.h's lm_cuda_* API: checks here, the work in the CUDA library (lm_cuda_api) ---- */
static const lm_cuda_api *cuda_api;

void lm_cuda_register_api(const lm_cuda_api *api) {
   __atomic_store_n(&cuda_api, api, __ATOMIC_RELEASE);
}

/* the GPUs registered (cuda:0 .. cuda:n-1) */
static int cuda_count(void) {
   int n = 0;
   while (n < LM_NUM_CUDA && cuda_backends[n]) n++;
   return n;
}

/* the library loaded, found GPUs, and (dev >= 0) cuda:dev is one of them; allow_all: dev -1
   means every device */
static lm_status cuda_check(int dev, int allow_all) {
   pthread_once(&cuda_once, cuda_load);
   if (!cuda_api || !cuda_backends[0])
      return lm_error(LM_ERR_DEVICE, "CUDA is not available (%s)", cuda_why);
   if (dev == -1 && allow_all) return LM_OK;
   if (dev < 0 || dev >= LM_NUM_CUDA)
      return lm_error(LM_ERR_ARG, "bad CUDA device index %d", dev);
   if (!cuda_backends[dev])
      return lm_error(LM_ERR_DEVICE, "device cuda:%d is not available (this machine has %d GPU%s)",
                      dev, cuda_count(), cuda_count() == 1 ? "" : "s");
   return LM_OK;
}

lm_status lm_cuda_synchronize(int dev) {
   LM_TRY(cuda_check(dev, 1));
   return cuda_api->synchronize(dev);
}

lm_status lm_cuda_set_option(int which, int value) {
   LM_TRY(cuda_check(-1, 1));
   if (which < 0 || which >= LM_CUDA_NUM_OPTS)
      return lm_error(LM_ERR_ARG, "unknown CUDA option %d", which);
   if (value != 0 && value != 1)
      return lm_error(LM_ERR_ARG, "a CUDA option is 0 or 1, got %d", value);
   return cuda_api->set_option(which, value);
}

lm_status lm_cuda_get_option(int which, int *value) {
   LM_TRY(cuda_check(-1, 1));
   if (which < 0 || which >= LM_CUDA_NUM_OPTS)
      return lm_error(LM_ERR_ARG, "unknown CUDA option %d", which);
   *value = cuda_api->get_option(which);
   return LM_OK;
}

lm_status lm_cuda_memory_stats(int dev, int64_t *out) {
   LM_TRY(cuda_check(dev, 0));
   return cuda_api->memory_stats(dev, out);
}

lm_status lm_cuda_empty_cache(int dev) {
   LM_TRY(cuda_check(dev, 1));
   if (dev >= 0) return cuda_api->empty_cache(dev);
   for (int k = 0; k < cuda_count(); k++) LM_TRY(cuda_api->empty_cache(k));
   return LM_OK;
}

lm_status lm_cuda_reset_peak(int dev) {
   LM_TRY(cuda_check(dev, 1));
   if (dev >= 0) cuda_api->reset_peak(dev);
   else
      for (int k = 0; k < cuda_count(); k++) cuda_api->reset_peak(k);
   return LM_OK;
}

lm_status lm_cuda_set_memory_fraction(int dev, double fraction) {
   LM_TRY(cuda_check(dev, 0));
   return cuda_api->set_memory_fraction(dev, fraction);
}

lm_status lm_cuda_device_properties(int dev, char *buf, size_t cap, int64_t *out) {
   LM_TRY(cuda_check(dev, 0));
   int64_t tmp[LM_CUDA_NPROPS];
   char name[256];
   LM_TRY(cuda_api->device_properties(dev, name, sizeof name, tmp));
   if (buf && cap) snprintf(buf, cap, "%s", name);
   if (out) memcpy(out, tmp, sizeof tmp);
   return LM_OK;
}

lm_status lm_cuda_versions(int64_t *out) {
   LM_TRY(cuda_check(-1, 1));
   cuda_api->versions(out);
   return LM_OK;
}

/* ---- CUDA graphs ---- */
lm_status lm_cuda_graph_pool_handle(uint64_t *out) {
   LM_TRY(cuda_check(-1, 1));
   *out = cuda_api->graph_pool_handle();
   return LM_OK;
}

lm_status lm_cuda_graph_begin(int dev, uint64_t pool, lm_cuda_graph **out) {
   if (!out) return lm_error(LM_ERR_ARG, "lm_cuda_graph_begin: out is NULL");
   *out = NULL;
   LM_TRY(cuda_check(dev, 0));
   return cuda_api->graph_begin(dev, pool, out);
}

lm_status lm_cuda_graph_end(lm_cuda_graph *g, int discard) {
   if (!g) return lm_error(LM_ERR_ARG, "lm_cuda_graph_end: no graph");
   LM_TRY(cuda_check(-1, 1));
   return cuda_api->graph_end(g, discard != 0);
}

lm_status lm_cuda_graph_replay(lm_cuda_graph *g) {
   if (!g) return lm_error(LM_ERR_ARG, "lm_cuda_graph_replay: no graph");
   LM_TRY(cuda_check(-1, 1));
   return cuda_api->graph_replay(g);
}

uint64_t lm_cuda_graph_pool(const lm_cuda_graph *g) {
   /* a graph exists only where the library is loaded */
   return g && cuda_api ? cuda_api->graph_pool(g) : 0;
}

void lm_cuda_graph_free(lm_cuda_graph *g) {
   if (g && cuda_api) cuda_api->graph_free(g);
}

int lm_cuda_is_capturing(int dev) {
   const lm_cuda_api *api = __atomic_load_n(&cuda_api, __ATOMIC_ACQUIRE);
   return api && dev >= 0 && dev < LM_NUM_CUDA ? api->is_capturing(dev) : 0;
}

/* the NCCL calls' tensors: each on another GPU, one dtype, sizes and strides, dense */
static lm_status nccl_check(lm_tensor **ts, int n, const lm_tensor *like) {
   if (!ts || n < 1 || n > LM_NUM_CUDA)
      return lm_error(LM_ERR_ARG, "expected 1 to %d tensors, got %d", LM_NUM_CUDA, n);
   int seen = 0;
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = ts[i];
      if (!t) return lm_error(LM_ERR_ARG, "tensors[%d] is nil", i + 1);
      const int k = t->device - LM_CUDA0;
      if (k < 0 || k >= LM_NUM_CUDA) {
         char d[24];
         return lm_error(LM_ERR_DEVICE, "tensors[%d] is on %s, not a GPU", i + 1,
                         lm_device_name(t->device, d, sizeof d));
      }
      LM_TRY(cuda_check(k, 0));
      if (seen & (1 << k)) return lm_error(LM_ERR_ARG, "two tensors on cuda:%d", k);
      seen |= 1 << k;
      if (!t->storage || !lm_is_non_overlapping_and_dense(t))
         return lm_error(LM_ERR_ARG, "tensors[%d] is not dense", i + 1);
      if (t->dtype != like->dtype || t->ndim != like->ndim ||
          memcmp(t->sizes, like->sizes, sizeof(int64_t) * (size_t)t->ndim) != 0 ||
          memcmp(t->strides, like->strides, sizeof(int64_t) * (size_t)t->ndim) != 0)
         return lm_error(LM_ERR_ARG, "tensors[%d] differs from the others in dtype, sizes or "
                         "strides", i + 1);
   }
   return LM_OK;
}

lm_status lm_cuda_nccl_broadcast(lm_tensor **ts, int n, int root) {
   LM_TRY(cuda_check(-1, 1));
   if (ts && n >= 1 && ts[0]) LM_TRY(nccl_check(ts, n, ts[0]));
   else return lm_error(LM_ERR_ARG, "expected at least one tensor");
   if (root < 0 || root >= n) return lm_error(LM_ERR_ARG, "root %d is not one of the %d", root, n);
   return cuda_api->nccl_broadcast(ts, n, root);
}

lm_status lm_cuda_nccl_reduce_add(lm_tensor **ins, int n, lm_tensor *out) {
   LM_TRY(cuda_check(-1, 1));
   if (!out) return lm_error(LM_ERR_ARG, "out is nil");
   LM_TRY(nccl_check(ins, n, out));
   lm_tensor *one[1] = {out};
   LM_TRY(nccl_check(one, 1, out));
   int root = -1;
   for (int i = 0; i < n; i++)
      if (ins[i]->device == out->device) root = i;
   if (root < 0) return lm_error(LM_ERR_ARG, "out must be on the GPU of one of the inputs");
   if (out->dtype == LM_BOOL)
      return lm_error(LM_ERR_DTYPE, "bool tensors have no sum (use an integer dtype)");
   return cuda_api->nccl_reduce_add(ins, n, out, root);
}

/* called by lm_mem_collected for every collection: only a loaded library has anything to do (a
   collection never loads it) */
void lm_device_collected(void) {
   const lm_cuda_api *api = __atomic_load_n(&cuda_api, __ATOMIC_ACQUIRE);
   if (api) api->collected();
}

/* ---- the registry ---- */

const lm_backend *lm_backend_get(int device) {
   if (device == LM_CPU) return lm_cpu_backend();
   if (device == LM_META) return &meta_backend;
   if (device >= LM_SIM0 && device < LM_SIM0 + LM_NUM_SIM) return lm_sim_backend(device - LM_SIM0);
   char buf[24];
   if (device >= LM_CUDA0 && device < LM_CUDA0 + LM_NUM_CUDA) {
      pthread_once(&cuda_once, cuda_load);
      const lm_backend *b = cuda_backends[device - LM_CUDA0];
      if (b) return b;
      lm_error(LM_ERR_DEVICE, "device %s is not available (%s)",
               lm_device_name(device, buf, sizeof buf), cuda_why);
      return NULL;
   }
   lm_error(LM_ERR_DEVICE, "%s is not available in this build", lm_device_name(device, buf, sizeof buf));
   return NULL;
}

int lm_device_has_kernel(int device, int kind) {
   const lm_backend *b = lm_backend_get(device);
   if (!b) return -1;
   if (kind < 0 || kind >= LM_OP_COUNT) return 0;
   const lm_op op = lm_op_make(kind, 0, NULL, NULL);
   return b->supports_op(b, &op) ? 1 : 0;
}

const char *lm_device_name(int device, char *buf, size_t cap) {
   if (device == LM_CPU) snprintf(buf, cap, "cpu");
   else if (device == LM_META) snprintf(buf, cap, "meta");
   else if (device >= LM_CUDA0 && device < LM_CUDA0 + LM_NUM_CUDA)
      snprintf(buf, cap, "cuda:%d", device - LM_CUDA0);
   else if (device >= LM_SIM0 && device < LM_SIM0 + LM_NUM_SIM)
      snprintf(buf, cap, "sim:%d", device - LM_SIM0);
   else snprintf(buf, cap, "device %d", device);
   return buf;
}

lm_status lm_check_same_device(const lm_tensor *a, const lm_tensor *b, const char *what) {
   if (!a || !b || a->device == b->device) return LM_OK;
   char da[24], db[24];
   return lm_error(LM_ERR_DEVICE,
                   "expected all tensors to be on the same device, got %s and %s (%s)",
                   lm_device_name(a->device, da, sizeof da),
                   lm_device_name(b->device, db, sizeof db), what);
}

lm_status lm_check_host(const lm_tensor *t, const char *what) {
   if (!t || t->device == LM_CPU) return LM_OK;
   char d[24];
   lm_device_name(t->device, d, sizeof d);
   if (t->device == LM_META)
      return lm_error(LM_ERR_DEVICE, "%s is a meta tensor: it has no data", what);
   return lm_error(LM_ERR_DEVICE, "%s is on %s; copy it to the CPU first", what, d);
}

static lm_status dispatch(const lm_op *op, const lm_tensor *first) {
   if (!first || first->device == LM_CPU) {
      /* the common case without a registry walk; the CPU supports every op */
      const lm_backend *cpu = lm_cpu_backend();
      return cpu->compute(cpu, op);
   }
   const lm_backend *b = lm_backend_get(first->device);
   if (!b) return LM_ERR_DEVICE;
   if (!b->supports_op(b, op))
      return lm_error(LM_ERR_DEVICE, "%s is not supported on %s", lm_op_name(op->kind), b->name);
   return b->compute(b, op);
}

int lm_op_supported(const lm_op *op) {
   const lm_tensor *first = NULL;
   for (int i = 0; i < op->nt && !first; i++) first = op->t[i];
   const lm_backend *b = lm_backend_get(first ? first->device : LM_CPU);
   if (!b) {
      lm_clear_error();
      return 0;
   }
   return b->supports_op(b, op) ? 1 : 0;
}

lm_status lm_dispatch(const lm_op *op) {
   const lm_tensor *first = NULL;
   for (int i = 0; i < op->nt; i++) {
      const lm_tensor *t = op->t[i];
      if (!t) continue;
      if (!first) first = t;
      else if (t->device != first->device)
         return lm_check_same_device(first, t, lm_op_name(op->kind));
   }
   if (first && first->device == LM_META) return LM_OK;
   if (!lm_verbose()) return dispatch(op, first);
   /* LUMEN_VERBOSE: one line per kernel call, naming the implementation that ran (src/impl.h) */
   const int device = first ? first->device : LM_CPU;
   lm_verbose_frame f;
   lm_verbose_begin(&f, op, device);
   const lm_status st = dispatch(op, first);
   lm_verbose_end(&f, op, device, st);
   return st;
}

