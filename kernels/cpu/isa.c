/* isa.c -- the one CPU feature probe. lm_cpu_isa() is the instruction set every CPU kernel uses:
 * the best the CPU supports (probed once), or a lower one forced with lm_cpu_set_isa so that
 * the specs run every path on every machine. A change refills the CPU kernel table (backend.c).
 * The levels are lumen.h's LM_ISA_*; LM_ISA_AMX also needs the operating system's consent
 * (lm_amx_enable below).
 *
 * Mutable global state: the forced ISA (an atomic int), the cached probe, the AMX answer. */
#include "amx.h"
#include "cpu.h"
#include "gemm_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static atomic_int g_isa_request = 0; /* LM_ISA_AUTO, or a forced ISA the CPU supports */
static atomic_int g_isa_best = 0;    /* the probe's answer; 0: not probed yet */

static int isa_supported_bf16(void) {
#if defined(__x86_64__)
   __builtin_cpu_init();
   return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512bf16");
#else
   return 0;
#endif
}

/* ---- AMX: CPUID, XCR0 and Linux's permission ---- */
static int g_amx = 0;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) && !defined(LUMEN_AMX_EMU)
enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static int amx_cpu(void) {
   unsigned a, b, c, d;
   if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
   const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
   const int osxsave = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 27) & 1);
   if (!tile || !bf16 || !osxsave) return 0;
   unsigned lo, hi;
   __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
   return ((lo >> 17) & 3) == 3; /* XTILECFG and XTILEDATA enabled by the OS */
}

static void amx_probe(void) {
   const char *deny = getenv("LUMEN_AMX_TEST_DENY");
   if (!isa_supported_bf16() || !amx_cpu()) return;
   if (deny && deny[0] && deny[0] != '0') return; /* tests: the request refused */
   if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
   unsigned long bits = 0;
   if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) != 0) return;
   g_amx = (int)((bits >> XFEATURE_XTILEDATA) & 1);
}
#elif defined(__x86_64__)
/* the emulated tiles (amx.h): wherever the bfloat16 kernels around them run */
static void amx_probe(void) {
   const char *deny = getenv("LUMEN_AMX_TEST_DENY");
   if (deny && deny[0] && deny[0] != '0') return;
   g_amx = isa_supported_bf16();
}
#else
static void amx_probe(void) {}
#endif

int lm_amx_enable(void) {
   pthread_once(&g_amx_once, amx_probe);
   return g_amx;
}

int lm_cpu_amx_available(void) { return lm_amx_enable(); }

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
   case LM_ISA_AVX512_BF16: return isa_supported_bf16();
   case LM_ISA_AMX: return isa_supported(LM_ISA_AVX512_BF16) && lm_amx_enable();
   default: return 0;
   }
#else
   return isa == LM_ISA_C;
#endif
}

/* the best supported ISA at or below `req` (req == 0: the best there is) */
static int isa_resolve(int req) {
   if (req <= LM_ISA_AUTO || req > LM_ISA_MAX) req = LM_ISA_MAX;
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

int lm_cpu_get_isa(void) { return lm_cpu_isa(); }
int lm_gemm_isa(void) { return lm_cpu_isa(); }

int lm_cpu_set_isa(int isa) {
   if (isa >= LM_ISA_AUTO && isa <= LM_ISA_MAX) {
      int v = isa == LM_ISA_AUTO ? LM_ISA_AUTO : isa_resolve(isa);
      atomic_store_explicit(&g_isa_request, v, memory_order_relaxed);
      lm_cpu_backend_refresh();
   }
   return lm_cpu_isa();
}

int lm_gemm_set_isa(int isa) { return lm_cpu_set_isa(isa); }

const char *lm_cpu_isa_name(int isa) {
   static const char *const names[] = {"auto", "c", "avx2", "avx512", "avx512_bf16", "amx"};
   return isa >= 0 && isa <= LM_ISA_MAX ? names[isa] : "unknown";
}

int lm_amx_on(void) { return lm_cpu_isa() >= LM_ISA_AMX && lm_cpu_option(LM_CPU_OPT_AMX); }

/* ---- does vdpbf16ps pay (cpu.h) ---- */
static int g_dot_pays = 0;
static pthread_once_t g_dot_once = PTHREAD_ONCE_INIT;

static void dot_probe(void) {
   const char *e = getenv("LUMEN_BF16_DOT");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) {
      g_dot_pays = e[0] == '1';
      return;
   }
   /* the bfloat16 kernels where the packed vdpbf16ps GEMM beats the float32 route by 10 % */
   g_dot_pays = lm_bf16_path_ratio() >= 1.1;
}

int lm_cpu_bf16_dot_pays(void) {
   if (lm_cpu_isa() < LM_ISA_AVX512_BF16) return 0;
   pthread_once(&g_dot_once, dot_probe);
   return g_dot_pays;
}
