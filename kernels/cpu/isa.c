/* isa.c -- the one CPU feature probe. lm_cpu_isa() is the instruction set every CPU kernel uses:
 * the best the CPU supports (probed once), or a lower one forced with lm_gemm_set_isa so that
 * the specs run every path on every machine. A change refills the CPU kernel table (backend.c).
 *
 * Mutable global state: the forced ISA (an atomic int) and the cached probe. */
#include "cpu.h"
#include "gemm_internal.h"

#include <stdatomic.h>

static atomic_int g_isa_request = 0; /* LM_ISA_AUTO, or a forced ISA the CPU supports */
static atomic_int g_isa_best = 0;    /* the probe's answer; 0: not probed yet */

static int isa_supported(int isa) {
#if defined(__x86_64__) || defined(__i386__)
   __builtin_cpu_init();
   switch (isa) {
   case LM_ISA_C: return 1;
   case LM_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
   case LM_ISA_AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
   case LM_ISA_AVX512_BF16:
      return isa_supported(LM_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
   default: return 0;
   }
#else
   return isa == LM_ISA_C;
#endif
}

/* the best supported ISA at or below `req` (req == 0: the best there is) */
static int isa_resolve(int req) {
   if (req <= LM_ISA_AUTO || req > LM_ISA_AVX512_BF16) req = LM_ISA_AVX512_BF16;
   while (req > LM_ISA_C && !isa_supported(req)) req--;
   return req;
}

static int isa_best(void) {
   int b = atomic_load_explicit(&g_isa_best, memory_order_relaxed);
   if (b == 0) {
      b = isa_resolve(LM_ISA_AUTO);
      atomic_store_explicit(&g_isa_best, b, memory_order_relaxed);
   }
   return b;
}

int lm_cpu_isa(void) {
   int req = atomic_load_explicit(&g_isa_request, memory_order_relaxed);
   return req == LM_ISA_AUTO ? isa_best() : req;
}

int lm_gemm_isa(void) { return lm_cpu_isa(); }

/* isa: 0 = auto, 1 = portable C, 2 = AVX2+FMA, 3 = AVX-512, 4 = AVX-512 with AVX512_BF16. An ISA
 * the CPU lacks falls back to the best one below it; the return value is the ISA in use after the
 * call. Values outside 0..4 change nothing. */
int lm_gemm_set_isa(int isa) {
   if (isa >= LM_ISA_AUTO && isa <= LM_ISA_AVX512_BF16) {
      int v = isa == LM_ISA_AUTO ? LM_ISA_AUTO : isa_resolve(isa);
      atomic_store_explicit(&g_isa_request, v, memory_order_relaxed);
      lm_cpu_backend_refresh();
   }
   return lm_cpu_isa();
}
