/* backend.c -- the CPU backend: host memory from lumen's allocator, and compute from a table of
 * kernels, one per lm_op_kind, filled from the hardware probe (cpu.h) the first time it is asked
 * for and again whenever lm_cpu_set_isa changes the ISA. */
#include "cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static lm_kernel_fn table[LM_OP_COUNT];
static atomic_int filled_isa = 0; /* the ISA the table was filled for; 0: not yet */
static pthread_mutex_t fill_lock = PTHREAD_MUTEX_INITIALIZER;

static void fill(int isa) {
   pthread_mutex_lock(&fill_lock);
   if (atomic_load_explicit(&filled_isa, memory_order_acquire) != isa) {
      lm_cpu_register_elementwise(table, isa);
      lm_cpu_register_reduce(table, isa);
      lm_cpu_register_random(table, isa);
      lm_cpu_register_linalg(table, isa);
      lm_cpu_register_conv(table, isa);
      lm_cpu_register_pool(table, isa);
      lm_cpu_register_pool3d(table, isa);
      lm_cpu_register_norm(table, isa);
      lm_cpu_register_group_norm(table, isa);
      lm_cpu_register_softmax(table, isa);
      lm_cpu_register_resample(table, isa);
      lm_cpu_register_loss(table, isa);
      lm_cpu_register_optim(table, isa);
      lm_cpu_register_indexing(table, isa);
      atomic_store_explicit(&filled_isa, isa, memory_order_release);
   }
   pthread_mutex_unlock(&fill_lock);
}

void lm_cpu_backend_refresh(void) { fill(lm_cpu_isa()); }

static void *cpu_alloc(const lm_backend *b, size_t nbytes) {
   (void)b;
   return lm_alloc(nbytes);
}
static void cpu_free(const lm_backend *b, void *p, size_t nbytes) {
   (void)b;
   lm_free(p, nbytes);
}
static lm_status cpu_memcpy(const lm_backend *b, void *dst, const void *src, size_t nbytes,
                            int dir) {
   (void)b, (void)dir;
   if (nbytes) memcpy(dst, src, nbytes);
   return LM_OK;
}

static lm_kernel_fn kernel_of(int kind) {
   if (kind < 0 || kind >= LM_OP_COUNT) return NULL;
   if (atomic_load_explicit(&filled_isa, memory_order_acquire) == 0) lm_cpu_backend_refresh();
   return table[kind];
}

/* supports_op looks at the call where a kind runs natively only for some (LM_OP_CONV3D: the
   front end falls back to conv2d where the answer is no; LM_OP_LINEAR: float32, the front end
   composes matmul, add and the activation otherwise) */
static int cpu_supports(const lm_backend *b, const lm_op *op) {
   (void)b;
   if (op->kind == LM_OP_CONV3D && !lm_cpu_conv3d_supports(op)) return 0;
   if (op->kind == LM_OP_LINEAR && !lm_cpu_linear_supports(op)) return 0;
   return kernel_of(op->kind) != NULL;
}

static lm_status cpu_compute(const lm_backend *b, const lm_op *op) {
   lm_kernel_fn k = kernel_of(op->kind);
   if (!k) return lm_error(LM_ERR_DEVICE, "%s is not supported on %s", lm_op_name(op->kind), b->name);
   return k(op);
}

static const lm_backend cpu_backend = {"cpu", LM_CPU, 1, 1, cpu_alloc, cpu_free,
                                       cpu_memcpy, cpu_supports, cpu_compute};

const lm_backend *lm_cpu_backend(void) { return &cpu_backend; }

/* ---- the switches (lumen.h: LM_CPU_OPT_*) ---- */
static int cpu_opts[LM_CPU_NUM_OPTS] = {1, 1, 0};
static pthread_once_t opts_once = PTHREAD_ONCE_INIT;

/* the defaults the environment sets: LUMEN_AMX=0 starts with lm.backends.cpu.amx off */
static void opts_init(void) {
   const char *amx = getenv("LUMEN_AMX");
   if (amx && amx[0] == '0' && amx[1] == 0) cpu_opts[LM_CPU_OPT_AMX] = 0;
}

int lm_cpu_option(int which) {
   pthread_once(&opts_once, opts_init);
   return which >= 0 && which < LM_CPU_NUM_OPTS ? __atomic_load_n(&cpu_opts[which], __ATOMIC_RELAXED)
                                                : 0;
}

lm_status lm_cpu_set_option(int which, int value) {
   if (which < 0 || which >= LM_CPU_NUM_OPTS)
      return lm_error(LM_ERR_ARG, "unknown CPU option %d", which);
   if (value != 0 && value != 1)
      return lm_error(LM_ERR_ARG, "a CPU option is 0 or 1, got %d", value);
   pthread_once(&opts_once, opts_init);
   __atomic_store_n(&cpu_opts[which], value, __ATOMIC_RELAXED);
   return LM_OK;
}

lm_status lm_cpu_get_option(int which, int *value) {
   if (which < 0 || which >= LM_CPU_NUM_OPTS)
      return lm_error(LM_ERR_ARG, "unknown CPU option %d", which);
   if (!value) return lm_error(LM_ERR_ARG, "lm_cpu_get_option: value is NULL");
   *value = lm_cpu_option(which);
   return LM_OK;
}
