/* sim.c -- sim:0 .. sim:3, the test device: a discrete accelerator simulated on the host.
 *
 * It behaves as a GPU does towards the rest of lumen, so that the whole operator suite can run
 * off the CPU on a machine without one (tools/run_tests.sh with LUMEN_TEST_DEVICE=sim:0):
 *   - its memory is its own: a storage's data pointer is a host block (lumen's allocator) with
 *     bit 61 set, a non-canonical x86-64 address. Any host code that reads or writes it directly
 *     (instead of going through the backend's memcpy, as a CUDA build must) faults at once;
 *   - moving data in and out is explicit: memcpy with a direction, as cudaMemcpy;
 *   - compute runs the CPU's kernel table on untagged copies of the operands' tensor structs,
 *     so results are the CPU's bit for bit, and any op the CPU lacks is unsupported here too.
 * The four devices share one memory (as CUDA peers with peer access would), but each tensor
 * keeps its device id: mixing sim:0 and sim:1 tensors in one op is refused, as it is on GPUs. */
#include "backend.h"

#include <stdint.h>
#include <stdlib.h>

#define SIM_TAG ((uintptr_t)1 << 61)

static inline void *tag(void *p) { return (void *)((uintptr_t)p | SIM_TAG); }
static inline void *untag(const void *p) { return (void *)((uintptr_t)p & ~SIM_TAG); }

static void *sim_alloc(const lm_backend *b, size_t nbytes) {
   (void)b;
   void *p = lm_alloc(nbytes);
   return p ? tag(p) : NULL;
}

static void sim_free(const lm_backend *b, void *p, size_t nbytes) {
   (void)b;
   if (p) lm_free(untag(p), nbytes);
}

static lm_status sim_memcpy(const lm_backend *b, void *dst, const void *src, size_t nbytes,
                            int dir) {
   (void)b;
   if (dir < 0 || dir > 2) return lm_error(LM_ERR_ARG, "sim: bad copy direction %d", dir);
   if (!nbytes) return LM_OK;
   void *d = dir == 1 ? dst : untag(dst);
   const void *s = dir == 0 ? src : untag(src);
   memmove(d, s, nbytes);
   return LM_OK;
}

static int sim_supports(const lm_backend *b, const lm_op *op) {
   (void)b;
   const lm_backend *cpu = lm_cpu_backend();
   return cpu->supports_op(cpu, op);
}

/* the op again over host views of the same memory (lm_compute_on_host): the untagged addresses of
   blocks from lumen's allocator */
static void *untag_fn(void *p) { return untag(p); }

static lm_status sim_compute(const lm_backend *b, const lm_op *op) {
   (void)b;
   return lm_compute_on_host(op, untag_fn, 0);
}

#define SIM(k) {"sim:" #k, LM_SIM0 + k, 0, 1, sim_alloc, sim_free, sim_memcpy, sim_supports, sim_compute}
static const lm_backend sims[LM_NUM_SIM] = {SIM(0), SIM(1), SIM(2), SIM(3)};

const lm_backend *lm_sim_backend(int index) {
   return index >= 0 && index < LM_NUM_SIM ? &sims[index] : NULL;
}
