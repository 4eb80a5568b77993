/* bench/amx_kernel.c -- the AMX micro-kernel of kernels/cpu/gemm_bf16_amx.h alone (2 x 2
 * accumulator tiles, 32 x 32 of C, the next step's loads issued between the products), on packed
 * data, beside the TDPBF16PS peak: what the layout of B and where the operands sit cost, without
 * packing or an epilogue. The loop runs one row block (A: 32 x K, 64 KiB at K = 1024) against
 * NJB column panels of B (32 columns each; NJB * K * 64 bytes: 1 MiB at 16 x 1024, in L2) in k
 * blocks of KC, the sums between k blocks in a 32 x (32 NJB) float32 buffer (L2), as the rowacc
 * order of gemm_bf16_amx.c does, repeated NIB times.
 *   variant rows128: a step's two B tiles row-interleaved (128-byte rows, the old packing)
 *   variant tiles:   each B tile 1 KiB contiguous (the packing now)
 *   variant t1:      tiles, and B loaded with TILELOADDT1 (streaming), as now
 *   variant t1+miss: t1 plus one 64-byte load a k step that misses L1 (a stand-in for packing
 *                    or epilogue work put between the products)
 *   cc -O2 -mamx-tile -mamx-bf16 -mavx512f bench/amx_kernel.c -o /tmp/amx_kernel
 *   /tmp/amx_kernel [K KC NJB NIB]      (default 1024 512 16 32; one thread)
 * Prints each variant's median GFLOP/s over 5 rounds and its share of the peak measured in the
 * same round (best of 10 short loops). Linux only (asks for the tile state with arch_prctl). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
   struct timespec t;
   clock_gettime(CLOCK_MONOTONIC, &t);
   return t.tv_sec + t.tv_nsec * 1e-9;
}
typedef struct {
   uint8_t palette, start;
   uint8_t res[14];
   uint16_t colsb[16];
   uint8_t rows[16];
} cfg_t;
static const cfg_t cfg __attribute__((aligned(64))) = {
   1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

static char *miss_buf;
static long miss_off;

/* one 32 x 32 block over nst k steps: A tile-contiguous (step t at a + 2048 t), B step t at
   b + 512 t words; V 0 rows128, 1 tiles, 2 t1, 3 t1 + miss */
#define LB(V, t, p, s)                                                                            \
   do {                                                                                           \
      if ((V) >= 2) _tile_stream_loadd(t, p, s);                                                  \
      else _tile_loadd(t, p, s);                                                                  \
   } while (0)
static inline __attribute__((always_inline)) void block(const int V, const char *a,
                                                        const uint32_t *b, int nst,
                                                        const float *cin, long ld) {
   const long bs = V == 0 ? 128 : 64, b1 = V == 0 ? 16 : 256;
   if (cin) {
      _tile_loadd(0, cin, ld * 4);
      _tile_loadd(1, cin + 16, ld * 4);
      _tile_loadd(2, cin + 16 * ld, ld * 4);
      _tile_loadd(3, cin + 16 * ld + 16, ld * 4);
   } else {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
   }
   _tile_loadd(4, a, 64);
   LB(V, 6, b, bs);
   LB(V, 7, b + b1, bs);
   _tile_loadd(5, a + 1024, 64);
   for (int t = 1; t < nst; t++) {
      const char *an = a + 2048;
      const uint32_t *bn = b + 512;
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(4, an, 64);
      _tile_dpbf16ps(2, 5, 6);
      LB(V, 6, bn, bs);
      _tile_dpbf16ps(3, 5, 7);
      LB(V, 7, bn + b1, bs);
      _tile_loadd(5, an + 1024, 64);
      if (V == 3) {
         __m512i v = _mm512_loadu_si512(miss_buf + miss_off);
         _mm512_storeu_si512(miss_buf + (miss_off & 4095), v);
         miss_off = (miss_off + 2048) & ((1L << 26) - 1);
      }
      a = an;
      b = bn;
   }
   _tile_dpbf16ps(0, 4, 6);
   _tile_dpbf16ps(1, 4, 7);
   _tile_dpbf16ps(2, 5, 6);
   _tile_dpbf16ps(3, 5, 7);
}

static double peak(void) {
   double best = 1e9;
   uint16_t buf[512] __attribute__((aligned(64)));
   for (int i = 0; i < 512; i++) buf[i] = 0x3f80 ^ (i & 0x807f);
   for (int r = 0; r < 10; r++) {
      const double t0 = now();
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      _tile_loadd(4, buf, 64);
      _tile_loadd(5, buf, 64);
      _tile_loadd(6, buf, 64);
      _tile_loadd(7, buf, 64);
      for (long i = 0; i < 5000; i++) {
         _tile_dpbf16ps(0, 4, 6);
         _tile_dpbf16ps(1, 4, 7);
         _tile_dpbf16ps(2, 5, 6);
         _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, buf, 64);
      const double t = now() - t0;
      if (t < best) best = t;
   }
   return 5000.0 * 4 * 16384 / best * 1e-9;
}

static int cmpd(const void *x, const void *y) {
   const double a = *(const double *)x, b = *(const double *)y;
   return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
   const int K = argc > 1 ? atoi(argv[1]) : 1024, KC = argc > 2 ? atoi(argv[2]) : 512;
   const int NJB = argc > 3 ? atoi(argv[3]) : 16, NIB = argc > 4 ? atoi(argv[4]) : 32;
   if (K <= 0 || KC <= 0 || K % KC || KC % 32 || NJB <= 0 || NIB <= 0) {
      fprintf(stderr, "usage: %s [K KC NJB NIB] (K a multiple of KC, KC of 32)\n", argv[0]);
      return 2;
   }
   if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
      fprintf(stderr, "no AMX permission\n");
      return 1;
   }
   _tile_loadconfig(&cfg);
   const int nst = KC / 32, nkb = K / KC;
   uint16_t *A = aligned_alloc(64, (size_t)32 * K * 2);
   uint32_t *B = aligned_alloc(64, (size_t)NJB * 16 * K * 4);
   float *R = aligned_alloc(64, (size_t)32 * NJB * 32 * 4);
   miss_buf = aligned_alloc(64, (size_t)1 << 26);
   for (long i = 0; i < (long)32 * K; i++) A[i] = 0x3f80 ^ (rand() & 0x807f);
   for (long i = 0; i < (long)NJB * 16 * K; i++)
      B[i] = (0x3f80u ^ (rand() & 0x807f)) | (0x3f80u ^ (rand() & 0x807f)) << 16;
   for (long i = 0; i < (1L << 26); i++) miss_buf[i] = (char)i;
   static const char *names[4] = {"rows128", "tiles", "t1", "t1+miss"};
   double g[4][5], r[4][5];
   for (int round = 0; round < 5; round++) {
      const double pk = peak();
      for (int v = 0; v < 4; v++) {
         double best = 1e9;
         for (int rep = 0; rep < 5; rep++) {
            const double t0 = now();
            for (int ib = 0; ib < NIB; ib++)
               for (int kb = 0; kb < nkb; kb++)
                  for (int jb = 0; jb < NJB; jb++) {
                     float *acc = R + jb * 32;
                     const long ld = (long)NJB * 32;
                     const char *a = (const char *)A + (long)kb * nst * 2048;
                     const uint32_t *b = B + (long)jb * 16 * K + (long)kb * nst * 512;
                     const float *cin = kb ? acc : NULL;
                     if (v == 0) block(0, a, b, nst, cin, ld);
                     else if (v == 1) block(1, a, b, nst, cin, ld);
                     else if (v == 2) block(2, a, b, nst, cin, ld);
                     else block(3, a, b, nst, cin, ld);
                     _tile_stored(0, acc, ld * 4);
                     _tile_stored(1, acc + 16, ld * 4);
                     _tile_stored(2, acc + 16 * ld, ld * 4);
                     _tile_stored(3, acc + 16 * ld + 16, ld * 4);
                  }
            const double t = now() - t0;
            if (t < best) best = t;
         }
         g[v][round] = 2.0 * 32 * 32 * (double)K * NJB * NIB / best * 1e-9;
         r[v][round] = g[v][round] / pk;
      }
   }
   printf("K %d KC %d NJB %d NIB %d, one thread (median of 5 rounds):\n", K, KC, NJB, NIB);
   for (int v = 0; v < 4; v++) {
      qsort(g[v], 5, sizeof(double), cmpd);
      qsort(r[v], 5, sizeof(double), cmpd);
      printf("  %-8s %6.0f GFLOP/s  %5.1f %% of the peak\n", names[v], g[v][2], 100 * r[v][2]);
   }
   _tile_release();
   return 0;
}
