/* gemm.c -- lumen's own GEMM (no BLAS): packing, the BLIS loop nest, OpenMP, ISA selection.
 *
 * lm_sgemm / lm_dgemm compute row-major C = alpha * op(A) * op(B) + beta * C. Internally every
 * operand is described by a row stride and a column stride (lm_*gemm_strided), so transposed or
 * otherwise strided operands are handled by the packing routines and never transposed up front.
 * See gemm_internal.h for the loop nest and the packed layouts; the register-blocked micro-kernels
 * live in gemm_avx512.c (AVX-512), gemm_avx2.c (AVX2 + FMA) and below (portable C).
 *
 * Paths: problems below a few tens of thousands of multiply-adds, and matrix-vector products, take
 * the unpacked "direct" loops (AVX-512 ones in gemm_avx512.c for float, plain C otherwise); the rest
 * take the packed path.
 *
 * Threads: the packed path runs one OpenMP team. When op(A) has enough rows each thread owns a
 * balanced share of them: the team packs each B panel together, then each thread packs its own A
 * blocks, stealing blocks from the others when it runs out; otherwise it splits the columns (N)
 * and each thread packs its own B. Work below
 * LM_GEMM_WORK_PER_THREAD per thread uses fewer threads; inside an enclosing parallel region the
 * GEMM runs on the calling thread only.
 *
 * bfloat16 (lm_bgemm_strided, lm_bgemm_strided_bf16c; after the template instantiations): the
 * same packed nest over 32-bit words holding k pairs, for the vdpbf16ps micro-kernel in
 * gemm_avx512bf16.c; paths and layouts in gemm_internal.h.
 *
 * Mutable global state: none (the ISA comes from lm_cpu_isa, isa.c).
 */
#include "internal.h"
#include "gemm_internal.h"
#include "amx.h"
#include "cpu.h"
#include "impl.h"
#include "act.h"
#include <stdatomic.h>
#include <stdlib.h> /* getenv, atoi (gemm_tmpl.c: LUMEN_GEMM_INPLACE) */

/* ---------------------------------------------------------------------------------------------
 * Portable micro-kernels: plain loops over a small accumulator tile; gcc -O3 vectorizes the j loop.
 */
#define SMR_C LM_SGEMM_C_MR
#define SNR_C LM_SGEMM_C_NR
#define DMR_C LM_DGEMM_C_MR
#define DNR_C LM_DGEMM_C_NR

static void sgemm_ukr_c(int64_t kc, const float *pa, const float *pb, float *c, int64_t rsc,
                        int64_t csc, float alpha, float beta, int m, int n) {
   float acc[SMR_C][SNR_C];
   for (int i = 0; i < SMR_C; i++)
      for (int j = 0; j < SNR_C; j++) acc[i][j] = 0.0f;
   for (int64_t p = 0; p < kc; p++) {
      for (int i = 0; i < SMR_C; i++) {
         float av = pa[i];
         for (int j = 0; j < SNR_C; j++) acc[i][j] += av * pb[j];
      }
      pa += SMR_C;
      pb += SNR_C;
   }
   lm_gemm_merge_s(m, n, &acc[0][0], SNR_C, c, rsc, csc, alpha, beta);
}

static void dgemm_ukr_c(int64_t kc, const double *pa, const double *pb, double *c, int64_t rsc,
                        int64_t csc, double alpha, double beta, int m, int n) {
   double acc[DMR_C][DNR_C];
   for (int i = 0; i < DMR_C; i++)
      for (int j = 0; j < DNR_C; j++) acc[i][j] = 0.0;
   for (int64_t p = 0; p < kc; p++) {
      for (int i = 0; i < DMR_C; i++) {
         double av = pa[i];
         for (int j = 0; j < DNR_C; j++) acc[i][j] += av * pb[j];
      }
      pa += DMR_C;
      pb += DNR_C;
   }
   lm_gemm_merge_d(m, n, &acc[0][0], DNR_C, c, rsc, csc, alpha, beta);
}

/* the float32 GEMM's epilogue in portable C (gemm_internal.h): C = act(C + bias) */
void lm_gemm_epi_tile_c(const lm_gemm_epi *e, float *c, int64_t m, int64_t n, int64_t rsc,
                        int64_t col0) {
   for (int64_t i = 0; i < m; i++) {
      float *r = c + i * rsc;
      if (e->bias)
         for (int64_t j = 0; j < n; j++) r[j] += e->bias[col0 + j];
      if (e->act) lm_act_row_f32(r, n, e->act);
   }
}

/* ---------------------------------------------------------------------------------------------
 * Blocking parameters per ISA. MC is a multiple of MR, NC of NR. Sizes for Zen 5 (48 KB L1d,
 * 1 MB L2 per core): the MC x KC A block stays in L2; the KC x NR B micro-panel in L1 where it
 * fits. The AVX-512 float path takes KC = 512: its B micro-panel (64 KB) then streams from L2,
 * which keeps up (two vectors of B per 28 FMAs), and C's tiles are loaded and stored half as
 * often as with KC = 256: a few percent faster on large products, a tie on thin ones (numbers:
 * docs/performance.md, "Measurements behind kernel choices").
 */
typedef struct {
   int mr, nr;
   int64_t mc, kc, nc;
   lm_sgemm_ukr_fn ukr;
   lm_sgemm_pack_a_fn pack_a; /* NULL: the portable packing (gemm_tmpl.c) */
   lm_sgemm_pack_b_fn pack_b;
   lm_sgemm_ukr_s_fn ukr_s; /* the tile with an operand read in place; NULL: always packed */
   int64_t a_ip_n; /* A read in place up to this many columns (gemm_tmpl.c a_inplace); 0: never */
} sgemm_cfg;

typedef struct {
   int mr, nr;
   int64_t mc, kc, nc;
   lm_dgemm_ukr_fn ukr;
   void (*pack_a)(int64_t, int64_t, const double *, int64_t, int64_t, double *);
   void (*pack_b)(int64_t, int64_t, const double *, int64_t, int64_t, int64_t, int64_t,
                  double *);
} dgemm_cfg;

static sgemm_cfg sgemm_config(int isa) {
   switch (isa >= LM_ISA_AVX512 ? LM_ISA_AVX512 : isa) {
   case LM_ISA_AVX512:
      return (sgemm_cfg){LM_SGEMM_AVX512_MR, LM_SGEMM_AVX512_NR, 14 * 12, 512, 32 * 128,
                         lm_sgemm_ukr_avx512, lm_sgemm_pack_a_avx512, lm_sgemm_pack_b_avx512,
                         lm_sgemm_ukr_avx512_strided, 0};
   case LM_ISA_AVX2:
      return (sgemm_cfg){LM_SGEMM_AVX2_MR, LM_SGEMM_AVX2_NR, 6 * 24, 256, 16 * 256,
                         lm_sgemm_ukr_avx2, lm_sgemm_pack_a_avx2, lm_sgemm_pack_b_avx2,
                         lm_sgemm_ukr_avx2_strided, 768};
   default:
      return (sgemm_cfg){SMR_C, SNR_C, SMR_C * 32, 256, SNR_C * 128, sgemm_ukr_c, NULL, NULL, NULL,
                         0};
   }
}

static dgemm_cfg dgemm_config(int isa) {
   switch (isa >= LM_ISA_AVX512 ? LM_ISA_AVX512 : isa) {
   case LM_ISA_AVX512:
      return (dgemm_cfg){LM_DGEMM_AVX512_MR, LM_DGEMM_AVX512_NR, 14 * 12, 256, 16 * 128,
                         lm_dgemm_ukr_avx512, NULL, NULL};
   case LM_ISA_AVX2:
      return (dgemm_cfg){LM_DGEMM_AVX2_MR, LM_DGEMM_AVX2_NR, 6 * 16, 256, 8 * 256,
                         lm_dgemm_ukr_avx2, NULL, NULL};
   default:
      return (dgemm_cfg){DMR_C, DNR_C, DMR_C * 32, 256, DNR_C * 256, dgemm_ukr_c, NULL, NULL};
   }
}

static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* split [0, total) into blocks of at most `cap` (a multiple of `unit`) of near-equal size, each a
 * multiple of unit: returns the block size to step by */
static int64_t even_block(int64_t total, int64_t cap, int64_t unit) {
   int64_t nb = (total + cap - 1) / cap;
   if (nb < 1) nb = 1;
   int64_t b = round_up((total + nb - 1) / nb, unit);
   return imin(b, cap);
}

static int gemm_threads(void) {
#ifdef _OPENMP
   if (omp_in_parallel()) return 1;
   return omp_get_max_threads();
#else
   return 1;
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Row blocks shared out with stealing: thread t owns blocks [head, tail) of its own rows, packed
 * into one 64-bit word. The owner takes from the front; a thread that ran out of work takes from
 * the back of another's range. Balanced when the machine is quiet, and a thread slowed down by
 * another process gives its last blocks away instead of holding the team up at the barrier.
 */
enum { LM_GEMM_MAX_THREADS = 64 };

typedef struct {
   _Atomic uint64_t range;
   char pad[64 - sizeof(uint64_t)];
} gemm_queue;

static void queue_reset(gemm_queue *q, int64_t nblk) {
   atomic_store(&q->range, (uint64_t)nblk);
}

static int queue_take(gemm_queue *q, int from_back, int64_t *blk) {
   uint64_t s = atomic_load(&q->range);
   for (;;) {
      const uint64_t h = s >> 32, t = s & 0xffffffffu;
      if (h >= t) return 0;
      const uint64_t ns = from_back ? (h << 32) | (t - 1) : ((h + 1) << 32) | t;
      if (atomic_compare_exchange_weak(&q->range, &s, ns)) {
         *blk = (int64_t)(from_back ? t - 1 : h);
         return 1;
      }
   }
}

/* ---------------------------------------------------------------------------------------------
 * The loop nest and the small-problem path are written once (gemm_tmpl.c) and instantiated
 * here for float and double.
 */
#define GCAT_(a, b) a##b
#define GCAT(a, b) GCAT_(a, b)
#define GNAME(x) GCAT(GEMM_P, x)

/* problems with fewer multiply-adds than this skip packing (the AVX-512 float path has fast
   unpacked loops, the portable ones are plain C) */
#define LM_GEMM_SMALL_WORK (24.0 * 24.0 * 24.0)
#define LM_GEMM_SMALL_WORK_AVX512 (36.0 * 36.0 * 36.0)
/* multiply-adds per thread below which fewer threads are used */
#define LM_GEMM_WORK_PER_THREAD (64.0 * 64.0 * 64.0)
/* products of at most this many rows read a B stored by rows in place, not packed (gemm_tmpl.c,
   GNAME(b_inplace)) */
#define LM_GEMM_INPLACE_MAX_ROWS 384

#define LM_GEMM_TEMPLATE
#define T float
#define GEMM_IS_FLOAT 1
#define GEMM_P sgemm_
#define GEMM_CFG sgemm_cfg
#define GEMM_CONFIG sgemm_config
#include "gemm_tmpl.c"
#undef T
#undef GEMM_IS_FLOAT
#undef GEMM_P
#undef GEMM_CFG
#undef GEMM_CONFIG

#define T double
#define GEMM_IS_FLOAT 0
#define GEMM_P dgemm_
#define GEMM_CFG dgemm_cfg
#define GEMM_CONFIG dgemm_config
#include "gemm_tmpl.c"
#undef T
#undef GEMM_IS_FLOAT
#undef GEMM_P
#undef GEMM_CFG
#undef GEMM_CONFIG
#undef LM_GEMM_TEMPLATE

/* ---------------------------------------------------------------------------------------------
 * bfloat16 GEMM (contract, paths and packed layouts in gemm_internal.h): the packed loop nest of
 * the template above, written once more for 32-bit words of k pairs (packed A and B are
 * uint32_t, C float or bfloat16, and k blocks split at even k).
 */
#define BMR_C LM_BGEMM_C_MR
#define BNR_C LM_BGEMM_C_NR

/* portable emulation of the vdpbf16ps micro-kernel: per lane, the odd k's product is added
   first, then the even one's, each rounded to float32 (products of two bfloat16 are exact) */
static void bgemm_ukr_c(int64_t kc2, const uint32_t *pa, const uint32_t *pb, void *c,
                        int64_t rsc, int64_t csc, float alpha, float beta, int m, int n,
                        int c_bf16) {
   float acc[BMR_C][BNR_C];
   for (int i = 0; i < BMR_C; i++)
      for (int j = 0; j < BNR_C; j++) acc[i][j] = 0.0f;
   for (int64_t p = 0; p < kc2; p++) {
      float b0[BNR_C], b1[BNR_C];
      for (int j = 0; j < BNR_C; j++) {
         b0[j] = lm_bf2f((uint16_t)(pb[j] & 0xffffu));
         b1[j] = lm_bf2f((uint16_t)(pb[j] >> 16));
      }
      for (int i = 0; i < BMR_C; i++) {
         const float a0 = lm_bf2f((uint16_t)(pa[i] & 0xffffu)), a1 = lm_bf2f((uint16_t)(pa[i] >> 16));
         for (int j = 0; j < BNR_C; j++) {
            float s = acc[i][j] + a1 * b1[j];
            acc[i][j] = s + a0 * b0[j];
         }
      }
      pa += BMR_C;
      pb += BNR_C;
   }
   if (c_bf16)
      lm_gemm_merge_bf(m, n, &acc[0][0], BNR_C, (uint16_t *)c, rsc, csc, alpha, beta);
   else
      lm_gemm_merge_s(m, n, &acc[0][0], BNR_C, (float *)c, rsc, csc, alpha, beta);
}

/* micro-panels [q0, q1) of the kc x nc block of op(B), NR columns each, as k-pair words */
void lm_bgemm_pack_b_c(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb, int64_t csb,
                       int NR, int64_t q0, int64_t q1, uint32_t *dst) {
   const int64_t kc2 = (kc + 1) / 2;
   for (int64_t q = q0; q < q1; q++) {
      const int64_t j0 = q * NR;
      const int nr = (int)imin(NR, nc - j0);
      uint32_t *d = dst + q * NR * kc2;
      for (int64_t p2 = 0; p2 < kc2; p2++) {
         const uint16_t *r0 = b + 2 * p2 * rsb + j0 * csb;
         const int odd = 2 * p2 + 1 < kc;
         uint32_t *dp = d + p2 * NR;
         int j = 0;
         for (; j < nr; j++) {
            uint32_t w = r0[j * csb];
            if (odd) w |= (uint32_t)r0[j * csb + rsb] << 16;
            dp[j] = w;
         }
         for (; j < NR; j++) dp[j] = 0;
      }
   }
}

/* row micro-panels of the mc x kc block of op(A): pack_b of the transposed block */
void lm_bgemm_pack_a_c(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa, int64_t csa,
                       int MR, uint32_t *dst) {
   lm_bgemm_pack_b_c(kc, mc, a, csa, rsa, MR, 0, (mc + MR - 1) / MR, dst);
}

typedef struct {
   int mr, nr;
   int64_t mc, kc, nc; /* kc in k values (even) */
   lm_bgemm_ukr_fn ukr;
   lm_bgemm_pack_a_fn pack_a; /* NULL: the portable packing */
   lm_bgemm_pack_b_fn pack_b;
} bgemm_cfg;

/* AVX-512 BF16: KC = 1024 k values = 512 pairs, so the packed blocks have the bytes of the
   float32 kernel's (KC 512): A block 168 x 1024 x 2 B = 336 KiB in L2, B micro-panel 64 KiB.
   Zen 4 runs a zmm vdpbf16ps as two 256-bit halves, one per cycle (measured peak 235 GFLOP/s a
   core = 64 flops a cycle, twice the float32 FMA peak of 118). bench/gemm_bench.c 1024 9 bf16,
   in a quiet minute: 1024^3 1 thread 214 GFLOP/s (91 % of the measured vdpbf16ps peak),
   2 threads 434 (92 % of 470); 256x3136x576 209 / 385; the float32 route (isa 3) 102 / 208. */
static bgemm_cfg bgemm_config(int isa) {
   if (isa >= LM_ISA_AVX512_BF16)
      return (bgemm_cfg){LM_BGEMM_AVX512_MR, LM_BGEMM_AVX512_NR, 14 * 12, 1024, 32 * 128,
                         lm_bgemm_ukr_avx512bf16, lm_bgemm_pack_a_avx512bf16,
                         lm_bgemm_pack_b_avx512bf16};
   return (bgemm_cfg){BMR_C, BNR_C, BMR_C * 32, 512, BNR_C * 64, bgemm_ukr_c, NULL, NULL};
}

static void bgemm_pack_a_any(const bgemm_cfg *cf, int64_t mc, int64_t kc, const uint16_t *a,
                             int64_t rsa, int64_t csa, uint32_t *dst) {
   if (cf->pack_a)
      cf->pack_a(mc, kc, a, rsa, csa, dst);
   else
      lm_bgemm_pack_a_c(mc, kc, a, rsa, csa, cf->mr, dst);
}

static void bgemm_pack_b_any(const bgemm_cfg *cf, int64_t kc, int64_t nc, const uint16_t *b,
                             int64_t rsb, int64_t csb, int64_t q0, int64_t q1, uint32_t *dst) {
   if (cf->pack_b)
      cf->pack_b(kc, nc, b, rsb, csb, q0, q1, dst);
   else
      lm_bgemm_pack_b_c(kc, nc, b, rsb, csb, cf->nr, q0, q1, dst);
}

/* element (i, j) of C, float or bfloat16 */
static void *bgemm_c_at(void *c, int c_bf16, int64_t off) {
   return c_bf16 ? (void *)((uint16_t *)c + off) : (void *)((float *)c + off);
}

static void bgemm_macro(const bgemm_cfg *cf, int64_t mc, int64_t nc, int64_t kc, float alpha,
                        const uint32_t *ap, const uint32_t *bp, float beta, void *c,
                        int64_t rsc, int64_t csc, int c_bf16) {
   const int MR = cf->mr, NR = cf->nr;
   const int64_t kc2 = (kc + 1) / 2;
   for (int64_t jr = 0; jr < nc; jr += NR) {
      const int nr = (int)imin(NR, nc - jr);
      const uint32_t *pb = bp + jr * kc2;
      for (int64_t ir = 0; ir < mc; ir += MR) {
         const int mr = (int)imin(MR, mc - ir);
         cf->ukr(kc2, ap + ir * kc2, pb, bgemm_c_at(c, c_bf16, ir * rsc + jr * csc), rsc, csc,
                 alpha, beta, mr, nr, c_bf16);
      }
   }
}

/* The packed nest on nt threads, as sgemm_packed (row split with stealing, or column split).
   c_bf16 requires k to fit one k block (the caller sees to it). Returns 0 when the workspace
   could not be allocated (nothing written). */
static int bgemm_packed(const bgemm_cfg *cf, int64_t m, int64_t n, int64_t k, float alpha,
                        const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                        int64_t rsb, int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                        int c_bf16, int nt) {
   const int MR = cf->mr, NR = cf->nr;
   const int64_t panels_m = (m + MR - 1) / MR, panels_n = (n + NR - 1) / NR;
   if (nt > LM_GEMM_MAX_THREADS) nt = LM_GEMM_MAX_THREADS;
   int split_m = 1;
   if (nt > 1 && panels_m < 4 * nt && panels_n > panels_m) split_m = 0;
   if (split_m && panels_m < nt) nt = (int)imax(1, panels_m);
   if (!split_m && panels_n < nt) nt = (int)imax(1, panels_n);
   if (nt == 1) split_m = 1;
   /* k blocks of near-equal depth, even (a pair never straddles two blocks) */
   const int64_t nkb = (k + cf->kc - 1) / cf->kc;
   const int64_t kc_max = round_up((k + nkb - 1) / nkb, 2);
   const int64_t kc2_max = kc_max / 2;
   const int64_t m_t = split_m ? imin(m, (panels_m + nt - 1) / nt * MR) : m;
   const int64_t n_t = split_m ? n : imin(n, (panels_n + nt - 1) / nt * NR);
   const int64_t mc_blk = even_block(m_t, cf->mc, MR);
   const int64_t nc_blk = even_block(n_t, cf->nc, NR);
   const int64_t a_elems = round_up(round_up(mc_blk, MR) * kc2_max, 16);
   const int64_t b_elems = round_up(round_up(nc_blk, NR) * kc2_max, 16);
   const int nbuf_b = split_m ? 1 : nt;
   const size_t bytes = (size_t)(a_elems * nt + b_elems * nbuf_b) * sizeof(uint32_t);
   uint32_t *buf = (uint32_t *)lm_alloc(bytes);
   if (!buf) {
      lm_clear_error();
      return 0;
   }
   const bgemm_cfg cfg = *cf;
   if (split_m) {
      gemm_queue queues[LM_GEMM_MAX_THREADS];
#pragma omp parallel num_threads(nt)
      {
         int tid = 0, ntt = 1;
#ifdef _OPENMP
         tid = omp_get_thread_num();
         ntt = omp_get_num_threads();
#endif
         uint32_t *ap = buf + tid * a_elems, *bp = buf + nt * a_elems;
         for (int64_t jc = 0; jc < n; jc += nc_blk) {
            const int64_t nc = imin(nc_blk, n - jc);
            const int64_t npan = (nc + NR - 1) / NR;
            for (int64_t pc = 0; pc < k; pc += kc_max) {
               const int64_t kc = imin(kc_max, k - pc);
               const float beta_eff = pc == 0 ? beta : 1.0f;
               const uint16_t *bsrc = b + pc * rsb + jc * csb;
               {
                  const int64_t m0 = imin(m, panels_m * tid / ntt * MR);
                  const int64_t m1 = imin(m, panels_m * (tid + 1) / ntt * MR);
                  queue_reset(&queues[tid], (m1 - m0 + mc_blk - 1) / mc_blk);
               }
#pragma omp for schedule(dynamic, 1)
               for (int64_t q = 0; q < npan; q += 4)
                  bgemm_pack_b_any(&cfg, kc, nc, bsrc, rsb, csb, q, imin(q + 4, npan), bp);
               for (int o = 0; o < ntt; o++) {
                  const int v = (tid + o) % ntt;
                  const int64_t m0 = imin(m, panels_m * v / ntt * MR);
                  const int64_t m1 = imin(m, panels_m * (v + 1) / ntt * MR);
                  int64_t blk;
                  while (queue_take(&queues[v], o != 0, &blk)) {
                     const int64_t ic = m0 + blk * mc_blk, mc = imin(mc_blk, m1 - ic);
                     bgemm_pack_a_any(&cfg, mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
                     bgemm_macro(&cfg, mc, nc, kc, alpha, ap, bp, beta_eff,
                                 bgemm_c_at(c, c_bf16, ic * rsc + jc * csc), rsc, csc, c_bf16);
                  }
               }
#pragma omp barrier
            }
         }
      }
   } else {
#pragma omp parallel num_threads(nt)
      {
         int tid = 0, ntt = 1;
#ifdef _OPENMP
         tid = omp_get_thread_num();
         ntt = omp_get_num_threads();
#endif
         const int64_t n0 = imin(n, panels_n * tid / ntt * NR);
         const int64_t n1 = imin(n, panels_n * (tid + 1) / ntt * NR);
         uint32_t *ap = buf + tid * a_elems, *bp = buf + nt * a_elems + tid * b_elems;
         for (int64_t jc = n0; jc < n1; jc += nc_blk) {
            const int64_t nc = imin(nc_blk, n1 - jc);
            for (int64_t pc = 0; pc < k; pc += kc_max) {
               const int64_t kc = imin(kc_max, k - pc);
               const float beta_eff = pc == 0 ? beta : 1.0f;
               bgemm_pack_b_any(&cfg, kc, nc, b + pc * rsb + jc * csb, rsb, csb, 0,
                                (nc + NR - 1) / NR, bp);
               for (int64_t ic = 0; ic < m; ic += mc_blk) {
                  const int64_t mc = imin(mc_blk, m - ic);
                  bgemm_pack_a_any(&cfg, mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
                  bgemm_macro(&cfg, mc, nc, kc, alpha, ap, bp, beta_eff,
                              bgemm_c_at(c, c_bf16, ic * rsc + jc * csc), rsc, csc, c_bf16);
               }
            }
         }
      }
   }
   lm_free(buf, bytes);
   return 1;
}

/* C = bf16(t + beta * C) for a dense float m x n t (alpha already in t), rows on nt threads */
static void bgemm_round_into(int64_t m, int64_t n, const float *t, float beta, uint16_t *c,
                             int64_t rsc, int64_t csc, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && m * n >= 65536)
   for (int64_t i = 0; i < m; i++)
      lm_gemm_merge_bf(1, (int)n, t + i * n, (int)n, c + i * rsc, rsc, csc, 1.0f, beta);
}

/* last resort when no workspace can be had: plain loops, float32 sums */
static void bgemm_naive(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                        float beta, void *c, int64_t rsc, int64_t csc, int c_bf16) {
   for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
         float s = 0.0f;
         for (int64_t p = 0; p < k; p++)
            s += lm_bf2f(a[i * rsa + p * csa]) * lm_bf2f(b[p * rsb + j * csb]);
         if (c_bf16)
            lm_gemm_merge_bf(1, 1, &s, 1, (uint16_t *)c + i * rsc + j * csc, rsc, csc, alpha,
                             beta);
         else
            lm_gemm_merge_s(1, 1, &s, 1, (float *)c + i * rsc + j * csc, rsc, csc, alpha, beta);
      }
}

/* Unpacked loops for rows [i0, i1) (small problems and matrix-vector products, where packing
   would not pay): as the float template's direct_rows, the bfloat16 values widened on the fly
   (a shift), float32 sums. Dot products when A's rows and B's columns run along k (x . W^T with
   one row), else axpys over the rows of B. */
static void bgemm_direct_rows(int64_t i0, int64_t i1, int64_t n, int64_t k, float alpha,
                              const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                              int64_t rsb, int64_t csb, float beta, void *c, int64_t rsc,
                              int64_t csc, int c_bf16) {
   enum { JB = 256 };
   float acc[JB];
   for (int64_t i = i0; i < i1; i++) {
      const uint16_t *ai = a + i * rsa;
      for (int64_t j0 = 0; j0 < n; j0 += JB) {
         const int nb = (int)imin(JB, n - j0);
         if (csa == 1 && rsb == 1 && csb != 1) {
            for (int j = 0; j < nb; j++) {
               const uint16_t *bj = b + (j0 + j) * csb;
               float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
               int64_t p = 0;
               for (; p + 8 <= k; p += 8)
                  for (int u = 0; u < 8; u++) s[u] += lm_bf2f(ai[p + u]) * lm_bf2f(bj[p + u]);
               for (; p < k; p++) s[0] += lm_bf2f(ai[p]) * lm_bf2f(bj[p]);
               acc[j] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
            }
         } else {
            for (int j = 0; j < nb; j++) acc[j] = 0.0f;
            for (int64_t p = 0; p < k; p++) {
               const float av = lm_bf2f(ai[p * csa]);
               const uint16_t *bp = b + p * rsb + j0 * csb;
               if (csb == 1) {
                  for (int j = 0; j < nb; j++) acc[j] += av * lm_bf2f(bp[j]);
               } else {
                  for (int j = 0; j < nb; j++) acc[j] += av * lm_bf2f(bp[j * csb]);
               }
            }
         }
         const int64_t off = i * rsc + j0 * csc;
         if (c_bf16)
            lm_gemm_merge_bf(1, nb, acc, nb, (uint16_t *)c + off, rsc, csc, alpha, beta);
         else
            lm_gemm_merge_s(1, nb, acc, nb, (float *)c + off, rsc, csc, alpha, beta);
      }
   }
}

/* at most this many rows (or columns) of a thin product take the unpacked loops: packing all of
   B for 8 rows cost more than the product (numbers: docs/performance.md, "Measurements behind
   kernel choices") */
#define LM_BGEMM_DOT_ROWS 8

/* one block of the unpacked path: the vdpbf16ps dot loops when the ISA and layout allow */
static void bgemm_direct_block(int isa, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                               int64_t rsb, int64_t csb, float beta, void *c, int64_t rsc,
                               int64_t csc, int c_bf16) {
   if (isa >= LM_ISA_AVX512_BF16 &&
       (lm_bgemm_direct_avx512bf16(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                                   c_bf16) ||
        lm_bgemm_rows_avx512bf16(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                                 c_bf16)))
      return;
   if (isa == LM_ISA_AVX512 && lm_bgemm_dot_avx512(m, n, k, alpha, a, rsa, csa, b, rsb, csb,
                                                   beta, c, rsc, csc, c_bf16))
      return;
   bgemm_direct_rows(0, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16);
}

/* the unpacked loops on nt threads: rows split, or columns when there are fewer rows */
static void bgemm_direct(int isa, int64_t m, int64_t n, int64_t k, float alpha,
                         const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                         int64_t rsb, int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                         int c_bf16, int nt) {
   /* a thin product (<= 8 rows) splits its columns, so that each thread reads its own part of
      B instead of all of it */
   if (nt > 1 && m >= 4 * nt && m > LM_BGEMM_DOT_ROWS) {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; t++) {
         const int64_t i0 = m * t / nt, i1 = m * (t + 1) / nt;
         bgemm_direct_block(isa, i1 - i0, n, k, alpha, a + i0 * rsa, rsa, csa, b, rsb, csb, beta,
                            bgemm_c_at(c, c_bf16, i0 * rsc), rsc, csc, c_bf16);
      }
   } else if (nt > 1 && n >= nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; t++) {
         const int64_t j0 = n * t / nt, j1 = n * (t + 1) / nt;
         bgemm_direct_block(isa, m, j1 - j0, k, alpha, a, rsa, csa, b + j0 * csb, rsb, csb, beta,
                            bgemm_c_at(c, c_bf16, j0 * csc), rsc, csc, c_bf16);
      }
   } else {
      bgemm_direct_block(isa, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                         c_bf16);
   }
}

/* dense float32 copy of an r x s bfloat16 matrix (element (i, j) at x[i*rs + j*cs]) */
static void bf16_to_dense(int64_t r, int64_t s, const uint16_t *x, int64_t rs, int64_t cs,
                          float *dst, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && r * s >= 65536)
   for (int64_t i = 0; i < r; i++) {
      const uint16_t *xi = x + i * rs;
      float *di = dst + i * s;
      if (cs == 1)
         for (int64_t j = 0; j < s; j++) di[j] = lm_bf2f(xi[j]);
      else
         for (int64_t j = 0; j < s; j++) di[j] = lm_bf2f(xi[j * cs]);
   }
}

/* the float32 route: operands converted (exactly) to dense float32, lm_sgemm_strided, the bf16
   result rounded once. Returns 0 when the memory for the copies could not be had. */
static int bgemm_via_float(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                           int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                           int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                           int c_bf16, int nt) {
   const size_t bytes = (size_t)(m * k + k * n + (c_bf16 ? m * n : 0)) * sizeof(float);
   float *buf = (float *)lm_alloc(bytes);
   if (!buf) {
      lm_clear_error();
      return 0;
   }
   float *a32 = buf, *b32 = buf + m * k, *c32 = buf + m * k + k * n;
   bf16_to_dense(m, k, a, rsa, csa, a32, nt);
   bf16_to_dense(k, n, b, rsb, csb, b32, nt);
   if (c_bf16) {
      lm_sgemm_strided(m, n, k, alpha, a32, k, 1, b32, n, 1, 0.0f, c32, n, 1);
      bgemm_round_into(m, n, c32, beta, (uint16_t *)c, rsc, csc, nt);
   } else {
      lm_sgemm_strided(m, n, k, alpha, a32, k, 1, b32, n, 1, beta, (float *)c, rsc, csc);
   }
   lm_free(buf, bytes);
   return 1;
}

/* Does the vdpbf16ps path pay on this CPU (cpu.h, lm_cpu_bf16_dot_pays)? The packed bfloat16
   GEMM against the float32 route (widen, sgemm, round) on one thread, 256 x 256 x 384 with a
   bfloat16 C, best of three alternations: the time of the float32 route over the native one.
   A flops probe of the two instructions misled: on the Intel Xeon of session 19 vdpbf16ps gave
   1.6 times FMA's flops in a loop of independent chains, yet its GEMM ran at 74 GFLOP/s against
   the float32 route's ~150 (and resnet50 bf16 inference at 475 ms against float32's ~250). */
double lm_bf16_path_ratio(void) {
   /* volatile: constant sizes propagated into the inlined loops tripped GCC's
      aggressive-loop-optimizations warning in direct_rows */
   volatile int64_t vm = 256, vn = 256, vk = 384;
   const int64_t M = vm, N = vn, K = vk;
   const size_t bytes = (size_t)(M * K + K * N + M * N) * 2;
   uint16_t *buf = lm_alloc(bytes);
   if (!buf) {
      lm_clear_error();
      return 1.0;
   }
   uint16_t *a = buf, *b = buf + M * K, *c = buf + M * K + K * N;
   uint32_t s = 12345u;
   for (int64_t i = 0; i < M * K + K * N; i++) {
      s = s * 1103515245u + 12345u;
      buf[i] = (uint16_t)(0x3f80u ^ ((s >> 16) & 0x807fu));
   }
   const bgemm_cfg cf = bgemm_config(LM_ISA_AVX512_BF16);
   double tn = 1e30, tf = 1e30;
   /* one thread for both (the calling thread's team size set to 1 meanwhile, so sgemm does
      not fork: a forked sgemm beside a loaded core measured its barriers, not the kernel; a
      region of one thread would not do, as omp_in_parallel() is false there), best of five */
#ifdef _OPENMP
   const int old_nt = omp_get_max_threads();
   omp_set_num_threads(1);
#endif
   lm_impl_mute(1); /* it runs inside the first bfloat16 op's dispatch: not that op's kernels */
   for (int r = 0; r < 5; r++) {
      double t0 = omp_get_wtime();
      if (!bgemm_packed(&cf, M, N, K, 1.0f, a, K, 1, b, N, 1, 0.0f, c, N, 1, 1, 1)) break;
      double t1 = omp_get_wtime();
      if (!bgemm_via_float(M, N, K, 1.0f, a, K, 1, b, N, 1, 0.0f, c, N, 1, 1, 1)) break;
      double t2 = omp_get_wtime();
      if (t1 - t0 < tn) tn = t1 - t0;
      if (t2 - t1 < tf) tf = t2 - t1;
   }
   lm_impl_mute(0);
#ifdef _OPENMP
   omp_set_num_threads(old_nt);
#endif
   lm_free(buf, bytes);
   return tn < 1e29 && tf < 1e29 && tn > 0 ? tf / tn : 1.0;
}

static void bgemm_any(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, void *c, int64_t rsc, int64_t csc, int c_bf16) {
   if (m <= 0 || n <= 0) return;
   if (k <= 0 || alpha == 0) { /* C = beta * C; beta == 0 writes zeros without reading C */
      const float zero = 0.0f;
      for (int64_t i = 0; i < m; i++)
         for (int64_t j = 0; j < n; j++) {
            if (c_bf16)
               lm_gemm_merge_bf(1, 1, &zero, 1, (uint16_t *)c + i * rsc + j * csc, 0, 0, 0.0f,
                                beta);
            else
               lm_gemm_merge_s(1, 1, &zero, 1, (float *)c + i * rsc + j * csc, 0, 0, 0.0f,
                               beta);
         }
      return;
   }
   /* column-major C, or a matrix-vector product with op(A) stored by columns: C^T = B^T A^T */
   if ((csc != 1 && rsc == 1) || (n == 1 && m > 1 && rsa == 1 && csa != 1)) {
      int64_t t;
      const uint16_t *tp = a;
      a = b;
      b = tp;
      t = m; m = n; n = t;
      t = rsa; rsa = csb; csb = t;
      t = csa; csa = rsb; rsb = t;
      t = rsc; rsc = csc; csc = t;
   }
   const double work = (double)m * (double)n * (double)k;
   int nt = gemm_threads();
   if (nt > 1 && work < LM_GEMM_WORK_PER_THREAD * nt) {
      nt = (int)(work / LM_GEMM_WORK_PER_THREAD);
      if (nt < 1) nt = 1;
   }
   int isa = lm_cpu_isa();
   /* without AMX in use, vdpbf16ps only where it pays (lm_cpu_bf16_dot_pays), else the float32
      route */
   if (isa >= LM_ISA_AVX512_BF16 && !lm_amx_on() && !lm_cpu_bf16_dot_pays()) isa = LM_ISA_AVX512;
   /* the implementations switched off by name (src/impl.h): the next one down */
   if (isa >= LM_ISA_AVX512_BF16 && !lm_impl_on(LM_IMPL_MM_BF16)) isa = LM_ISA_AVX512;
   const int amx = isa >= LM_ISA_AMX && lm_amx_on() && lm_impl_on(LM_IMPL_MM_AMX_BF16);
   /* thin products: x . W^T (few rows, A rows and W rows along k: the dot loops) or few rows
      times a row-major B (the row loops) read B in place once instead of packing all of it for
      a handful of rows */
   const int dot_thin =
      (isa >= LM_ISA_AVX512_BF16 &&
       ((csa == 1 && rsb == 1 && (m <= LM_BGEMM_DOT_ROWS || n <= LM_BGEMM_DOT_ROWS)) ||
        (csb == 1 && m <= LM_BGEMM_DOT_ROWS))) ||
      /* the float32 route's dot loops (lm_bgemm_dot_avx512) */
      (isa == LM_ISA_AVX512 && csa == 1 && rsb == 1 && m <= LM_BGEMM_DOT_ROWS);
   if (work <= LM_GEMM_SMALL_WORK_AVX512 || m == 1 || n == 1 || dot_thin) {
      lm_impl_ran(isa >= LM_ISA_AVX512_BF16 ? LM_IMPL_MM_BF16
                  : isa >= LM_ISA_AVX512    ? LM_IMPL_MM_AVX512
                  : isa >= LM_ISA_AVX2      ? LM_IMPL_MM_AVX2
                                            : LM_IMPL_MM_PORTABLE);
      bgemm_direct(isa, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16, nt);
      return;
   }
   /* AMX tiles (gemm_bf16_amx.c): blocks of 32 x 32; k deeper than one block sums in float32
      and rounds once, as below */
   if (amx && m >= 16 && n >= 16 && k >= 32 &&
       lm_bgemm_amx(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16, nt)) {
      lm_impl_ran(LM_IMPL_MM_AMX_BF16);
      return;
   }
   if (isa == LM_ISA_C || isa >= LM_ISA_AVX512_BF16)
      lm_impl_ran(isa == LM_ISA_C ? LM_IMPL_MM_PORTABLE : LM_IMPL_MM_BF16);
   if (isa == LM_ISA_C || isa >= LM_ISA_AVX512_BF16) {
      const bgemm_cfg cf = bgemm_config(isa);
      if (!c_bf16 || k <= cf.kc) {
         if (bgemm_packed(&cf, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc,
                          c_bf16, nt))
            return;
      } else {
         /* bf16 C deeper than one k block: float32 sums into a scratch of at most 16 MiB of
            rows at a time, then one rounding */
         int64_t rows = imax(1, ((int64_t)1 << 22) / n);
         if (rows > m) rows = m;
         const size_t bytes = (size_t)(rows * n) * sizeof(float);
         float *t = (float *)lm_alloc(bytes);
         if (t) {
            int64_t i0 = 0;
            for (; i0 < m; i0 += rows) {
               const int64_t mr = imin(rows, m - i0);
               if (!bgemm_packed(&cf, mr, n, k, alpha, a + i0 * rsa, rsa, csa, b, rsb, csb,
                                 0.0f, t, n, 1, 0, nt))
                  break;
               bgemm_round_into(mr, n, t, beta, (uint16_t *)c + i0 * rsc, rsc, csc, nt);
            }
            lm_free(t, bytes);
            if (i0 >= m) return;
            /* rows [0, i0) are done (and their C already holds the result): the rest below */
            m -= i0;
            a += i0 * rsa;
            c = (uint16_t *)c + i0 * rsc;
         }
         lm_clear_error();
      }
   }
   if (bgemm_via_float(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16, nt))
      return;
   bgemm_naive(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16);
}

void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, float *c, int64_t rsc, int64_t csc) {
   bgemm_any(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, 0);
}

void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                            int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                            int64_t csb, float beta, uint16_t *c, int64_t rsc, int64_t csc) {
   bgemm_any(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, 1);
}

/* ---- public entry points: lda etc. are the row strides of A, B, C as stored ---- */
void lm_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc) {
   lm_sgemm_strided(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, b,
                    trans_b ? 1 : ldb, trans_b ? ldb : 1, beta, c, ldc, 1);
}

void lm_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc) {
   lm_dgemm_strided(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, b,
                    trans_b ? 1 : ldb, trans_b ? ldb : 1, beta, c, ldc, 1);
}
