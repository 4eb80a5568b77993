/* pool_geom.h -- what the 2-D (pool.c and its files, pool2d.h) and 3-D (pool3d.c) pooling kernels
 * share (internal): the rule of a window along one dimension for max, average and adaptive pools,
 * the AVX-512 function attribute of their second compilation, the channel blocking of their
 * scatter kernels and the choice between the two implementations (src/impl.h). */
#ifndef LUMEN_POOL_GEOM_H
#define LUMEN_POOL_GEOM_H
#include "cpu.h"
#include "impl.h"
#include <stdint.h>

/* The vectorizable kernels are compiled twice: for the baseline ISA of the build and for AVX-512
   (function attribute; the OpenMP bodies inherit it). The AVX-512 copies run when the kernel
   table is filled for AVX-512 (lm_cpu_register_pool with isa >= LM_ISA_AVX512), so
   lm_cpu_set_isa(LM_ISA_C) also selects the portable kernels. The files stay portable C (no
   *_avx512.c name: the Makefile would give all of their code the AVX-512 flags). */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define LM_AVX512_FN __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#define POOL_X86 1
#else
#define LM_AVX512_FN
#endif

/* a helper that some of the files including this header do not call (static, not inline: the
   compiler inlines it or not as it did when each file had its own copy) */
#define POOL_HELPER static __attribute__((unused))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* the window rules along one dimension (the 2-D kinds of pool2d.h map onto them) */
enum { POOL_WIN_MAX = 0, POOL_WIN_AVG = 1, POOL_WIN_ADAPTIVE = 2 };

static inline int64_t ad_start(int64_t a, int64_t b, int64_t c) {
   return (a / b) * c + ((a % b) * c) / b;
}
static inline int64_t ad_end(int64_t a, int64_t b, int64_t c) { return 1 + ((a + 1) * c - 1) / b; }

/* window o of O along a dimension of I inputs (kernel k, stride s, padding pad, dilation d):
   its first input index *a and end *b (exclusive), and *z: for max the number of taps before the
   first one inside the input (the tap number of *a, step d), for the others the window's size
   counted with padding (avg_pool's pool_size) */
static inline void pool_window(int rule, int64_t o, int64_t O, int64_t I, int64_t k, int64_t s,
                               int64_t pad, int64_t d, int64_t *a_, int64_t *b_, int64_t *z_) {
   int64_t a, b, z;
   switch (rule) {
   case POOL_WIN_MAX:
      a = o * s - pad;
      b = min64(a + (k - 1) * d + 1, I);
      z = 0;
      while (a < 0) {
         a += d;
         z++;
      }
      break;
   case POOL_WIN_AVG:
      a = o * s - pad;
      b = min64(a + k, I + pad);
      z = b - a;
      a = max64(a, 0);
      b = min64(b, I);
      break;
   default: /* adaptive */
      a = ad_start(o, O, I);
      b = ad_end(o, O, I);
      z = b - a;
      break;
   }
   *a_ = a;
   *b_ = b;
   *z_ = z;
}

/* channel blocking of the channels-last scatter kernels: enough (n, block) tasks for the threads */
POOL_HELPER int64_t pool_cblock(int64_t N, int64_t C) {
#ifdef _OPENMP
   int64_t nt = omp_get_max_threads();
#else
   int64_t nt = 1;
#endif
   if (N >= 4 * nt || C <= 16) return C;
   int64_t want = (4 * nt + N - 1) / N;
   int64_t cb = (C + want - 1) / want;
   cb = (cb + 15) / 16 * 16;
   return cb < C ? cb : C;
}

/* the implementation list of two (src/impl.h): pool_avx512 where registered and on, else
   pool_portable */
POOL_HELPER int pool_impl_v512(int v512) {
   if (v512 && !lm_impl_on(LM_IMPL_POOL_AVX512)) {
      lm_impl_skip(LM_IMPL_POOL_AVX512, "switched off (lm.backends.cpu.disable)");
      v512 = 0;
   }
   lm_impl_ran(v512 ? LM_IMPL_POOL_AVX512 : LM_IMPL_POOL_PORTABLE);
   return v512;
}

#endif
