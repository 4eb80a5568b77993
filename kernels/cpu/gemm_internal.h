/* gemm_internal.h -- lumen's own GEMM: the contract between the portable driver (gemm.c) and the
 * ISA-specific micro-kernels (gemm_avx512.c, gemm_avx2.c). Not part of the FFI header.
 *
 * Structure (BLIS / GotoBLAS):
 *   for jc in n step NC:                      B panel  KC x NC   (L3), packed by the team together
 *     for pc in k step KC:                    into NR-wide micro-panels
 *       for ic in m step MC:                  A block  MC x KC   (L2), one per thread; the row
 *                                             blocks are split between threads (gemm.c)
 *         for jr in nc step NR:               B micro-panel KC x NR stays in L1
 *           for ir in mc step MR:             A micro-panel MR x KC streams from L2
 *             micro-kernel: C[MR x NR] (+)= alpha * Ap * Bp
 *
 * Packed layouts (both zero padded to a full MR / NR):
 *   A micro-panel: pa[p * MR + i] = op(A)(i, p)     (column of MR values per k step; alpha is
 *                                                    applied by the kernel when it stores C)
 *   B micro-panel: pb[p * NR + j] = op(B)(p, j)                (row of NR values per k step)
 *
 * Micro-kernel contract (lm_*gemm_ukr_fn), with C(i,j) = c[i*rsc + j*csc]:
 *   C(i,j) = alpha * sum_p pa[p*MR+i] * pb[p*NR+j] + beta * C(i,j)
 *   for i < m, j < n (m <= MR, n <= NR; the rest of the register tile is computed and dropped).
 *   beta == 0 never reads C (C may hold NaN). pa / pb are 64-byte aligned, kc >= 1.
 *   A kernel that is handed csc != 1 (column stride of C) must honour it; the kernels here take the
 *   edge path (register tile -> stack tile -> lm_gemm_merge_*) for partial or strided tiles.
 */
#ifndef LUMEN_GEMM_INTERNAL_H
#define LUMEN_GEMM_INTERNAL_H
#include <stdint.h>
#include "internal.h" /* lm_bf2f / lm_f2bf (the one rounding of bfloat16 results) */

#if defined(__GNUC__)
#define LM_GEMM_HIDDEN __attribute__((visibility("hidden")))
#else
#define LM_GEMM_HIDDEN
#endif

/* ISA ids: LM_ISA_* of lumen.h. LM_ISA_AVX512_BF16: AVX-512 plus AVX512_BF16 (vdpbf16ps); every
   float32/float64 kernel treats it (and LM_ISA_AMX) as LM_ISA_AVX512, and only the bfloat16
   kernels tell them apart, so forcing LM_ISA_AVX512 on a BF16 machine runs the bfloat16 fallback
   (float32 compute) */

typedef void (*lm_sgemm_ukr_fn)(int64_t kc, const float *pa, const float *pb, float *c,
                                int64_t rsc, int64_t csc, float alpha, float beta, int m, int n);
typedef void (*lm_dgemm_ukr_fn)(int64_t kc, const double *pa, const double *pb, double *c,
                                int64_t rsc, int64_t csc, double alpha, double beta, int m, int n);

/* ISA-specific packing (optional; NULL in a config means the portable routines in gemm.c):
 * pack_a packs an mc x kc block of op(A) into ceil(mc/MR) micro-panels at dst + i0 * kc;
 * pack_b packs micro-panels [q0, q1) of a kc x nc block of op(B), panel q at dst + q * NR * kc. */
typedef void (*lm_sgemm_pack_a_fn)(int64_t mc, int64_t kc, const float *a, int64_t rsa,
                                   int64_t csa, float *dst);
typedef void (*lm_sgemm_pack_b_fn)(int64_t kc, int64_t nc, const float *b, int64_t rsb,
                                   int64_t csb, int64_t q0, int64_t q1, float *dst);

/* register-tile sizes of each kernel (the driver sizes its packing from these) */
enum {
   LM_SGEMM_AVX512_MR = 14, LM_SGEMM_AVX512_NR = 32,
   LM_DGEMM_AVX512_MR = 14, LM_DGEMM_AVX512_NR = 16,
   LM_SGEMM_AVX2_MR = 6, LM_SGEMM_AVX2_NR = 16,
   LM_DGEMM_AVX2_MR = 6, LM_DGEMM_AVX2_NR = 8,
   LM_SGEMM_C_MR = 4, LM_SGEMM_C_NR = 8,
   LM_DGEMM_C_MR = 4, LM_DGEMM_C_NR = 4
};

/* bfloat16 GEMM tiles (in rows of A / columns of B; the packed k unit is a PAIR of k values) */
enum {
   LM_BGEMM_AVX512_MR = 14, LM_BGEMM_AVX512_NR = 32,
   LM_BGEMM_C_MR = 4, LM_BGEMM_C_NR = 16
};

/* the largest MR * NR of any kernel (stack tile for edges) */
enum { LM_GEMM_MAX_TILE = 14 * 32 };

LM_GEMM_HIDDEN void lm_sgemm_ukr_avx512(int64_t kc, const float *pa, const float *pb, float *c,
                                        int64_t rsc, int64_t csc, float alpha, float beta, int m,
                                        int n);
/* the same tile with an operand read in place: A's column of 14 at pa + p * sa, B's row of 32
 * at pb + p * sb; an operand whose stride is not the packed one (14, 32) is read in place
 * (unaligned loads, prefetched ahead); the driver reads only B in place (gemm_tmpl.c) */
typedef void (*lm_sgemm_ukr_s_fn)(int64_t kc, const float *pa, int64_t sa, const float *pb,
                                  int64_t sb, float *c, int64_t rsc, int64_t csc, float alpha,
                                  float beta, int m, int n);
LM_GEMM_HIDDEN void lm_sgemm_ukr_avx512_strided(int64_t kc, const float *pa, int64_t sa,
                                                const float *pb, int64_t sb, float *c,
                                                int64_t rsc, int64_t csc, float alpha, float beta,
                                                int m, int n);
LM_GEMM_HIDDEN void lm_sgemm_pack_a_avx512(int64_t mc, int64_t kc, const float *a, int64_t rsa,
                                           int64_t csa, float *dst);
LM_GEMM_HIDDEN void lm_sgemm_pack_b_avx512(int64_t kc, int64_t nc, const float *b, int64_t rsb,
                                           int64_t csb, int64_t q0, int64_t q1, float *dst);
/* unpacked path for small / thin problems (same arguments as lm_sgemm_strided); returns 0 when
 * it does not handle that combination of strides (the caller falls back to portable loops) */
LM_GEMM_HIDDEN int lm_sgemm_direct_avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                          const float *a, int64_t rsa, int64_t csa,
                                          const float *b, int64_t rsb, int64_t csb, float beta,
                                          float *c, int64_t rsc, int64_t csc);
LM_GEMM_HIDDEN void lm_dgemm_ukr_avx512(int64_t kc, const double *pa, const double *pb,
                                        double *c, int64_t rsc, int64_t csc, double alpha,
                                        double beta, int m, int n);
LM_GEMM_HIDDEN void lm_sgemm_ukr_avx2(int64_t kc, const float *pa, const float *pb, float *c,
                                      int64_t rsc, int64_t csc, float alpha, float beta, int m,
                                      int n);
LM_GEMM_HIDDEN void lm_sgemm_pack_a_avx2(int64_t mc, int64_t kc, const float *a, int64_t rsa,
                                         int64_t csa, float *dst);
LM_GEMM_HIDDEN void lm_sgemm_pack_b_avx2(int64_t kc, int64_t nc, const float *b, int64_t rsb,
                                         int64_t csb, int64_t q0, int64_t q1, float *dst);
/* the AVX2 tile with operands read in place (see lm_sgemm_ukr_avx512_strided) */
LM_GEMM_HIDDEN void lm_sgemm_ukr_avx2_strided(int64_t kc, const float *pa, int64_t sa,
                                              const float *pb, int64_t sb, float *c,
                                              int64_t rsc, int64_t csc, float alpha, float beta,
                                              int m, int n);
LM_GEMM_HIDDEN void lm_dgemm_ukr_avx2(int64_t kc, const double *pa, const double *pb, double *c,
                                      int64_t rsc, int64_t csc, double alpha, double beta, int m,
                                      int n);

/* Extended entry points with general element strides for A, B and C (any sign, 0 allowed for A/B;
 * C must not overlap itself). op(A) is m x k with op(A)(i,p) = a[i*rsa + p*csa], op(B) is k x n
 * with op(B)(p,j) = b[p*rsb + j*csb], C(i,j) = c[i*rsc + j*csc]. lm_sgemm/lm_dgemm are thin
 * wrappers. Use these from other kernels (convolution, linalg) to avoid transposing copies. */
LM_GEMM_HIDDEN void lm_sgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                     int64_t rsa, int64_t csa, const float *b, int64_t rsb,
                                     int64_t csb, float beta, float *c, int64_t rsc, int64_t csc);
LM_GEMM_HIDDEN void lm_dgemm_strided(int64_t m, int64_t n, int64_t k, double alpha,
                                     const double *a, int64_t rsa, int64_t csa, const double *b,
                                     int64_t rsb, int64_t csb, double beta, double *c, int64_t rsc,
                                     int64_t csc);

/* A float32 GEMM's epilogue, applied to each tile of C right after its last k block (in L1):
 * C(i, j) = act(C(i, j) + bias[j]) (bias NULL: none; act an lm_conv_act, LM_ACT_NONE: none).
 * lm_sgemm_strided_epi: C = op(A) op(B) (alpha 1, beta 0) with the epilogue, C dense by rows
 * (csc 1); linear layers (LM_OP_LINEAR, linalg.c). Where the packed nest does not run (small or
 * thin products), the same epilogue runs over C after the product: the same values. */
typedef struct lm_gemm_epi {
   const float *bias;
   int act;
} lm_gemm_epi;
LM_GEMM_HIDDEN void lm_sgemm_strided_epi(int64_t m, int64_t n, int64_t k, const float *a,
                                         int64_t rsa, int64_t csa, const float *b, int64_t rsb,
                                         int64_t csb, float *c, int64_t rsc,
                                         const lm_gemm_epi *epi);
/* the epilogue on an m x n tile of C whose first column is col0 (AVX-512, AVX2 and portable) */
LM_GEMM_HIDDEN void lm_gemm_epi_tile_avx512(const lm_gemm_epi *e, float *c, int m, int n,
                                            int64_t rsc, int64_t col0);
LM_GEMM_HIDDEN void lm_gemm_epi_tile_avx2(const lm_gemm_epi *e, float *c, int m, int n,
                                          int64_t rsc, int64_t col0);
LM_GEMM_HIDDEN void lm_gemm_epi_tile_c(const lm_gemm_epi *e, float *c, int64_t m, int64_t n,
                                       int64_t rsc, int64_t col0);

/* ---- bfloat16 GEMM: bfloat16 operands (uint16_t bit patterns), float32 accumulation ----
 *
 * lm_bgemm_strided: C(i,j) = alpha * sum_p op(A)(i,p) op(B)(p,j) + beta * C(i,j), with op(A),
 *   op(B) bfloat16 with general element strides (as lm_sgemm_strided: any sign, 0 allowed) and
 *   a float32 C (the accumulator type: what a convolution's weight gradient or a float32
 *   consumer wants).
 * lm_bgemm_strided_bf16c: the same with a bfloat16 C: C = bf16(alpha * acc + beta * float(C)),
 *   rounded ONCE (round to nearest even, lm_f2bf) from the float32 sum over the whole of k
 *   (when k is deeper than one packed block, the sum goes through a float32 scratch of at most
 *   16 MiB of C rows at a time, then is rounded). PyTorch's bfloat16 matmul rounds the same way.
 * beta == 0 never reads C. C must not overlap A, B or itself.
 *
 * Paths (lm_cpu_isa()):
 *   every ISA: problems below LM_GEMM_SMALL_WORK_AVX512 multiply-adds and matrix-vector
 *     products take unpacked loops (bfloat16 widened on the fly, float32 sums; no packing or
 *     copy to amortise, and a matrix-vector product reads the bfloat16 matrix once).
 *   LM_ISA_AVX512_BF16: packed BLIS nest (gemm.c) with the vdpbf16ps micro-kernel below.
 *   LM_ISA_AVX512, LM_ISA_AVX2: the float32 route: both operands converted to dense float32
 *     (exact), lm_sgemm_strided on them, the bf16 result rounded once.
 *   LM_ISA_C: the packed nest with a portable C emulation of the vdpbf16ps micro-kernel and the
 *     portable packing, so that the pair-interleaved packing is exercised on every machine.
 * Every path sums float32 products of bfloat16 values (exact) in float32; they differ only in
 * the order of the additions.
 *
 * Packed layouts (k taken in pairs, kc2 = ceil(kc / 2) pairs; a pair is one 32-bit word with
 * the even k in the low 16 bits, as vdpbf16ps reads it; an odd kc leaves the high half of the
 * last word zero in BOTH operands, so no padding can make 0 * Inf = NaN):
 *   A micro-panel: pa[p2 * MR + i] = { op(A)(i, 2 p2), op(A)(i, 2 p2 + 1) }  (broadcast)
 *   B micro-panel: pb[p2 * NR + j] = { op(B)(2 p2, j), op(B)(2 p2 + 1, j) }
 * rows past mc / columns past nc zeroed. Packed blocks of A start at dst + i0 * kc2 (panel of
 * rows i0), micro-panel q of B at dst + q * NR * kc2. Every k block but the last has even kc.
 *
 * Micro-kernel contract (lm_bgemm_ukr_fn): as lm_sgemm_ukr_fn over kc2 pairs; c is float * or
 * (c_bf16) uint16_t *, with C(i,j) at element i*rsc + j*csc; c_bf16 rounds the final value. */
typedef void (*lm_bgemm_ukr_fn)(int64_t kc2, const uint32_t *pa, const uint32_t *pb, void *c,
                                int64_t rsc, int64_t csc, float alpha, float beta, int m, int n,
                                int c_bf16);
typedef void (*lm_bgemm_pack_a_fn)(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa,
                                   int64_t csa, uint32_t *dst);
typedef void (*lm_bgemm_pack_b_fn)(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb,
                                   int64_t csb, int64_t q0, int64_t q1, uint32_t *dst);

/* these two are exported (default visibility) so that spec/c/test_bgemm.c can call them; they are
   not in the FFI header */
void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha,
                                     const uint16_t *a, int64_t rsa, int64_t csa,
                                     const uint16_t *b, int64_t rsb, int64_t csb, float beta,
                                     float *c, int64_t rsc, int64_t csc);
void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha,
                                           const uint16_t *a, int64_t rsa, int64_t csa,
                                           const uint16_t *b, int64_t rsb, int64_t csb,
                                           float beta, uint16_t *c, int64_t rsc, int64_t csc);
/* the AVX-512 BF16 micro-kernel and packing (gemm_avx512bf16.c) */
LM_GEMM_HIDDEN void lm_bgemm_ukr_avx512bf16(int64_t kc2, const uint32_t *pa, const uint32_t *pb,
                                            void *c, int64_t rsc, int64_t csc, float alpha,
                                            float beta, int m, int n, int c_bf16);
LM_GEMM_HIDDEN void lm_bgemm_pack_a_avx512bf16(int64_t mc, int64_t kc, const uint16_t *a,
                                               int64_t rsa, int64_t csa, uint32_t *dst);
LM_GEMM_HIDDEN void lm_bgemm_pack_b_avx512bf16(int64_t kc, int64_t nc, const uint16_t *b,
                                               int64_t rsb, int64_t csb, int64_t q0, int64_t q1,
                                               uint32_t *dst);
/* unpacked dot-product loops (same arguments as lm_bgemm_strided, c float or (c_bf16) bf16):
 * only when op(A)'s rows and op(B)'s columns run along k (csa == 1, rsb == 1); returns 0
 * otherwise, having done nothing */
LM_GEMM_HIDDEN int lm_bgemm_direct_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha,
                                              const uint16_t *a, int64_t rsa, int64_t csa,
                                              const uint16_t *b, int64_t rsb, int64_t csb,
                                              float beta, void *c, int64_t rsc, int64_t csc,
                                              int c_bf16);
/* the same dot products for at most 8 rows on plain AVX-512 (bfloat16 widened by shifts,
 * float32 FMAs): the float32 route's thin x . W^T; returns 0 otherwise, having done nothing */
LM_GEMM_HIDDEN int lm_bgemm_dot_avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                       const uint16_t *a, int64_t rsa, int64_t csa,
                                       const uint16_t *b, int64_t rsb, int64_t csb, float beta,
                                       void *c, int64_t rsc, int64_t csc, int c_bf16);
/* unpacked row loops for at most 8 rows of op(A) times a row-major op(B) (csb == 1), B read in
 * place once; returns 0 otherwise, having done nothing */
LM_GEMM_HIDDEN int lm_bgemm_rows_avx512bf16(int64_t m, int64_t n, int64_t k, float alpha,
                                            const uint16_t *a, int64_t rsa, int64_t csa,
                                            const uint16_t *b, int64_t rsb, int64_t csb,
                                            float beta, void *c, int64_t rsc, int64_t csc,
                                            int c_bf16);
/* the AMX GEMM (gemm_bf16_amx.c): the lm_bgemm_strided contract with a float32 or (c_bf16)
 * bfloat16 C, on nt threads; only when lm_amx_on(). Returns 0 when its workspace could not be
 * had, having written nothing. */
LM_GEMM_HIDDEN int lm_bgemm_amx(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                                int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                                int64_t csb, float beta, void *c, int64_t rsc, int64_t csc,
                                int c_bf16, int nt);
/* the portable packing for any tile width (gemm.c); the AVX-512 routines use it for operands
 * strided both ways */
LM_GEMM_HIDDEN void lm_bgemm_pack_a_c(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa,
                                      int64_t csa, int MR, uint32_t *dst);
LM_GEMM_HIDDEN void lm_bgemm_pack_b_c(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb,
                                      int64_t csb, int NR, int64_t q0, int64_t q1,
                                      uint32_t *dst);

/* Merge a dense m x n float tile t into a bfloat16 C: C = bf16(alpha * t + beta * float(C)) */
static inline void lm_gemm_merge_bf(int m, int n, const float *t, int ldt, uint16_t *c,
                                    int64_t rsc, int64_t csc, float alpha, float beta) {
   for (int i = 0; i < m; i++) {
      uint16_t *ci = c + i * rsc;
      const float *ti = t + i * ldt;
      if (beta == 0.0f) {
         for (int j = 0; j < n; j++) ci[j * csc] = lm_f2bf(alpha * ti[j]);
      } else {
         for (int j = 0; j < n; j++)
            ci[j * csc] = lm_f2bf(alpha * ti[j] + beta * lm_bf2f(ci[j * csc]));
      }
   }
}

/* Merge a dense m x n tile t (row stride ldt) into C: C = alpha * t + beta * C; beta == 0 does not
 * read C. Used by the kernels' edge paths. */
static inline void lm_gemm_merge_s(int m, int n, const float *t, int ldt, float *c, int64_t rsc,
                                   int64_t csc, float alpha, float beta) {
   for (int i = 0; i < m; i++) {
      float *ci = c + i * rsc;
      const float *ti = t + i * ldt;
      if (beta == 0.0f) {
         for (int j = 0; j < n; j++) ci[j * csc] = alpha * ti[j];
      } else {
         for (int j = 0; j < n; j++) ci[j * csc] = alpha * ti[j] + beta * ci[j * csc];
      }
   }
}
static inline void lm_gemm_merge_d(int m, int n, const double *t, int ldt, double *c, int64_t rsc,
                                   int64_t csc, double alpha, double beta) {
   for (int i = 0; i < m; i++) {
      double *ci = c + i * rsc;
      const double *ti = t + i * ldt;
      if (beta == 0.0) {
         for (int j = 0; j < n; j++) ci[j * csc] = alpha * ti[j];
      } else {
         for (int j = 0; j < n; j++) ci[j * csc] = alpha * ti[j] + beta * ci[j * csc];
      }
   }
}

#endif
