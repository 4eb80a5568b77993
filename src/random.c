/* random.c -- the random fills' front ends and the generator's state (the kernels, counter-based
 * Philox 4x32-10, are kernels/cpu/random.c; parameters: ops/random.h).
 *
 * The global state is (seed, offset). Every call reserves as many counters as it fills elements
 * (atomically), and element i of the tensor in LOGICAL (row-major) order gets counter offset + i,
 * so results depend neither on the thread count nor on the memory format: a channels-last and a
 * contiguous tensor filled after the same seed hold the same logical values. lm_manual_seed
 * resets the offset. */
#include "iter.h"
#include "ops/random.h"

static uint64_t g_seed = 67280421310721ULL; /* PyTorch's default seed */
static uint64_t g_offset = 0;

void lm_manual_seed(uint64_t seed) {
   __atomic_store_n(&g_seed, seed, __ATOMIC_RELAXED);
   __atomic_store_n(&g_offset, 0, __ATOMIC_RELAXED);
}

uint64_t lm_initial_seed(void) { return __atomic_load_n(&g_seed, __ATOMIC_RELAXED); }

void lm_rng_get_state(uint64_t *seed, uint64_t *offset) {
   if (seed) *seed = __atomic_load_n(&g_seed, __ATOMIC_RELAXED);
   if (offset) *offset = __atomic_load_n(&g_offset, __ATOMIC_RELAXED);
}

void lm_rng_set_state(uint64_t seed, uint64_t offset) {
   __atomic_store_n(&g_seed, seed, __ATOMIC_RELAXED);
   __atomic_store_n(&g_offset, offset, __ATOMIC_RELAXED);
}

uint64_t lm_rng_reserve(uint64_t n, uint64_t *seed) {
   *seed = __atomic_load_n(&g_seed, __ATOMIC_RELAXED);
   return __atomic_fetch_add(&g_offset, n, __ATOMIC_RELAXED);
}

static lm_status fill_random(lm_tensor *t, int kind, const lm_random_params *p) {
   lm_tensor *ts[1] = {t};
   const lm_op op = lm_op_make(kind, 1, ts, p);
   return lm_dispatch(&op);
}

lm_status lm_uniform_(lm_tensor *t, double lo, double hi) {
   LM_CHECK_TENSOR(t, "self");
   if (!lm_is_float_dtype(t->dtype))
      return lm_error(LM_ERR_DTYPE, "uniform_ expects a floating point tensor, got %s",
                      lm_dtype_name(t->dtype));
   if (!(lo <= hi))
      return lm_error(LM_ERR_ARG, "uniform_ expects from <= to, but got from=%g > to=%g", lo, hi);
   const lm_random_params p = {LM_R_UNIFORM, lo, hi, 0, 0};
   return fill_random(t, LM_OP_UNIFORM, &p);
}

lm_status lm_normal_(lm_tensor *t, double mean, double std) {
   LM_CHECK_TENSOR(t, "self");
   if (!lm_is_float_dtype(t->dtype))
      return lm_error(LM_ERR_DTYPE, "normal_ expects a floating point tensor, got %s",
                      lm_dtype_name(t->dtype));
   if (!(std >= 0.0)) return lm_error(LM_ERR_ARG, "normal_ expects std >= 0.0, but found std %g", std);
   const lm_random_params p = {LM_R_NORMAL, mean, std, 0, 0};
   return fill_random(t, LM_OP_NORMAL, &p);
}

lm_status lm_randint_(lm_tensor *t, int64_t low, int64_t high) {
   LM_CHECK_TENSOR(t, "self");
   if (!(low < high))
      return lm_error(LM_ERR_ARG, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                      (long long)low, (long long)high);
   const lm_random_params p = {LM_R_RANDINT, 0, 0, low, (int64_t)((uint64_t)high - (uint64_t)low)};
   return fill_random(t, LM_OP_RANDINT, &p);
}

lm_status lm_bernoulli_(lm_tensor *t, double p) {
   LM_CHECK_TENSOR(t, "self");
   if (!(p >= 0.0 && p <= 1.0))
      return lm_error(LM_ERR_ARG, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
   const lm_random_params q = {LM_R_BERNOULLI, p, 0, 0, 0};
   return fill_random(t, LM_OP_BERNOULLI, &q);
}

/* a new int64 tensor on the CPU, or the caller's out= (any device: the kernel shuffles on the
   host, and a device that runs the CPU's kernels gives the CPU's permutation) */
lm_status lm_randperm(int64_t n, lm_tensor **out) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   if (n < 0) return lm_error(LM_ERR_ARG, "n must be non-negative, got %lld", (long long)n);
   lm_tensor *o = *out, *created = NULL;
   if (o) {
      if (o->ndim != 1 || o->sizes[0] != n)
         return lm_error(LM_ERR_SHAPE, "randperm: out must be 1-D of size %lld", (long long)n);
   } else {
      LM_TRY(lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, LM_CPU, &created));
      o = created;
   }
   lm_tensor *ts[1] = {o};
   const lm_op op = lm_op_make(LM_OP_RANDPERM, 1, ts, NULL);
   lm_status st = lm_dispatch(&op);
   if (st != LM_OK) {
      lm_tensor_free(created);
      return st;
   }
   *out = o;
   return LM_OK;
}
