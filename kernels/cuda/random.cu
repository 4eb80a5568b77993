/* random.cu -- the random fills on CUDA (LM_OP_UNIFORM, NORMAL, RANDINT, BERNOULLI, RANDPERM;
 * front ends: src/random.c; parameters: src/ops/random.h; the CPU's kernels: kernels/cpu/random.c).
 *
 * The values are generated on the host by the CPU's own kernel, then copied to the device. Why:
 * lumen's generator is one global (seed, offset) counter state, and the CPU kernel gives element i
 * (logical order) Philox counter offset + i; running that very kernel here means a seeded spec or
 * training run gets bit-identical numbers on cpu, sim and cuda:k (a model initialised after
 * lm.manual_seed(0) is the same model on every device), and the generator advances exactly as on
 * the CPU (the kernel itself reserves its counters with lm_rng_reserve), so cpu and cuda:0 stay in
 * step. A device Philox would have to repeat the CPU's float rounding (u24, sincosf, logf) bit for
 * bit, which CUDA's libm does not promise. Random fills are initialisation and dropout-free
 * ResNet training does not call them per step: not the hot path, so the host round trip is fine.
 *
 * The host temporary: when the device tensor is non-overlapping and dense (contiguous,
 * channels_last, any permutation) it gets the tensor's own strides, so one lm_cu_memcpy of numel
 * elements moves it; otherwise it is contiguous and a small kernel scatters it from a dense device
 * buffer into the tensor's strides. A tensor with internal overlap is handed to the CPU kernel
 * with its own strides, which reserves its counters and refuses it with the CPU's message. */
#include "cuda.cuh"
extern "C" {
#include "iter.h"
#include "ops/random.h"
}
#include <stdlib.h>

namespace {

/* element i (row-major) of a dense buffer into its place in a strided view */
template <class T> struct Scatter {
   T *dst;
   const T *src;
   lm_cu_view v;
   LM_HD void operator()(int64_t i) const { dst[lm_cu_offset(v, i)] = src[i]; }
};

template <class T> lm_status scatter(int k, lm_tensor *t, const void *dense) {
   Scatter<T> s;
   s.dst = (T *)lm_cu_ptr(t);
   s.src = (const T *)dense;
   s.v = lm_cu_view_of(t);
   return lm_cu_for(k, t->numel, s);
}

/* run op (of one tensor, t[0] on cuda:k) on the CPU's kernel into a host temporary, then copy */
static lm_status run_via_host(const lm_op *op) {
   lm_tensor *t = op->t[0];
   const int k = lm_cu_index(t);
   const int es = lm_dtype_size(t->dtype);
   lm_operand self;
   lm_operand_tensor(&self, t);
   const int overlap = lm_operand_internal_overlap(&self);
   const int dense = !overlap && (t->flags & LM_FLAG_NOD);

   lm_tensor h = *t;
   h.device = LM_CPU;
   h.offset = 0;
   int64_t span = t->numel; /* elements of the host buffer */
   if (overlap) {
      span = 1;
      for (int d = 0; d < t->ndim; d++) span += (t->sizes[d] - 1) * t->strides[d];
   } else if (!dense) {
      lm_compute_strides(t->ndim, t->sizes, LM_CONTIGUOUS, h.strides);
      h.flags = lm_layout_flags(t->ndim, t->sizes, h.strides);
   }
   const size_t nbytes = (size_t)(span > 0 ? span : 0) * (size_t)es;
   void *buf = malloc(nbytes ? nbytes : 1);
   if (!buf) return lm_error(LM_ERR_OOM, "out of memory (%zu bytes host staging)", nbytes);
   lm_storage hs;
   memset(&hs, 0, sizeof hs);
   hs.data = buf;
   hs.nbytes = (int64_t)nbytes;
   hs.refcount = 1;
   hs.device = LM_CPU;
   h.storage = &hs;
   lm_tensor *hp = &h;
   lm_op hop = *op;
   hop.t = &hp;
   const lm_backend *cpu = lm_cpu_backend();
   lm_status st = cpu->compute(cpu, &hop); /* reserves the counters, as on the CPU */
   if (st == LM_OK && t->numel > 0) {
      if (dense) {
         st = lm_cu_memcpy(k, lm_cu_ptr(t), buf, nbytes, 0);
      } else {
         void *dbuf = lm_cu_alloc(k, nbytes);
         if (!dbuf) {
            st = LM_ERR_OOM;
         } else {
            st = lm_cu_memcpy(k, dbuf, buf, nbytes, 0);
            if (st == LM_OK) {
               switch (es) {
               case 1: st = scatter<uint8_t>(k, t, dbuf); break;
               case 2: st = scatter<uint16_t>(k, t, dbuf); break;
               case 4: st = scatter<uint32_t>(k, t, dbuf); break;
               default: st = scatter<uint64_t>(k, t, dbuf); break;
               }
            }
            /* the scatter is queued on k's stream: the caching allocator hands the block out
               again only to work queued after it on that stream */
            lm_cu_free(k, dbuf, nbytes);
         }
      }
   }
   free(buf);
   return st;
}

static lm_status k_random(const lm_op *op) { return run_via_host(op); }

} // namespace

void lm_cuda_register_random(lm_kernel_fn *table) {
   table[LM_OP_UNIFORM] = k_random;
   table[LM_OP_NORMAL] = k_random;
   table[LM_OP_RANDINT] = k_random;
   table[LM_OP_BERNOULLI] = k_random;
   table[LM_OP_RANDPERM] = k_random;
}
