/* gemm_bf16_amx.c -- the bfloat16 GEMM on AMX tiles (amx.h): C = alpha * op(A) op(B) + beta * C
 * with bfloat16 operands of any strides, float32 sums, a float32 or bfloat16 C (rounded once).
 * Called by gemm.c's bgemm_any when lm_amx_on(); the contract is lm_bgemm_strided's
 * (gemm_internal.h). The micro-kernel (amx_brgemm_32x32) is shared with the AMX convolutions
 * (conv_bf16_amx.c) through gemm_bf16_amx.h.
 *
 * Blocking (BLIS order, tiles for registers):
 *   for jc in n step NC:          B block KC x NC packed by the team (lm_amx_pack_b): panels of
 *     for pc in k step KC:        32 columns, each 32-k step two tile-contiguous 1 KiB B tiles
 *                                 (word (p2, j) = {B(2 p2, j), B(2 p2 + 1, j)}), k padded with
 *                                 zeros to 32
 *       for (ib, jb) units:       32 rows x 32 columns of C, split statically between the threads
 *                                 in row-major order (a thread keeps its A block across jb)
 *         2 x 2 tiles over kc:    A0, A1 (rows 0-15, 16-31), B0, B1 (columns 0-15, 16-31), four
 *                                 float32 accumulators; per 32 k: 4 tile loads, 4 TDPBF16PS
 * A is packed per 32-row block, tile-contiguous (each 16 x 32 tile 1 KiB, zeros past m and k;
 * a transpose of 16 x 16 words when op(A) is stored by columns), once per thread and k block
 * and reused over the column blocks. With more
 * than one k block the sums go through a float32 buffer of the m x NC block (loaded into the
 * accumulators at the next k block); the last k block runs the epilogue: C = alpha * acc +
 * beta * C, or its rounding to bfloat16 (lm_f2bf's rounding, bit for bit). A whole block of a
 * float32 C = A B is the accumulators stored into C.
 *
 * KC = 512, NC <= 512. When every k block of a column block fits in L2 (k x NC x 2 bytes <=
 * 1.5 MiB: k <= 1536 at NC = 512), the order is rowacc instead: all of B(:, jc) packed at once,
 * each thread takes whole 32-row blocks, and per row block runs for pc: for jb, its sums
 * between k blocks in its own 32 x NC float32 buffer (64 KiB, L2) rather than an m x NC one in
 * memory. B tiles are loaded with TILELOADDT1 (streamed: they do not push the A block, read
 * again for every jb, out of L1; the micro-kernel alone 60 -> 75 % of the peak,
 * bench/amx_kernel.c). Measured on one core of this Xeon, 1024^3 bfloat16 C: 0.71 TFLOP/s
 * before (KC 512, the m x NC buffer), 1.0 with KC 1024, 1.15 as now. What limits is L2 -> L1
 * traffic, not the tiles: one 64-byte load a k step that misses L1, added to the micro-kernel
 * alone, cost 40 % of its rate (bench/amx_kernel.c, t1+miss); so packing and epilogue work
 * interleaved between the products (tried) did not overlap with them. docs/performance.md
 * (AMX).
 */
#include "gemm_bf16_amx.h"
#include "avx512_util.h"
#include "cpu.h"

#include <immintrin.h>

enum { KC = 512, NCMAX = 512 };
#define ROWACC_B ((size_t)1536 * 1024) /* B packed whole for rowacc: at most this (L2: 2 MiB) */
#include <stdlib.h>

int lm_amx_stream(double out_bytes, int cold) {
   const char *e = getenv("LUMEN_CONV_STREAM");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) return e[0] == '1';
   return cold || out_bytes > 0.5 * (double)lm_mem_cache_share();
}

static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ---- packing ---- */

static inline __mmask16 mask16(int n) {
   return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

void lm_amx_pack_b(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb, int64_t csb,
                   int64_t q0, int64_t q1, uint32_t *dst, int64_t prow) {
   const int64_t kc2 = (kc + 1) / 2, kc2p = rup(kc, 32) / 2;
   if (csb == 1) {
      /* rows of op(B) contiguous: merge rows 2 p2 and 2 p2 + 1, k outermost so that the rows
         are read along their length, every panel of [q0, q1) from one pass (a panel at a time
         read one 64-byte piece of each row, rows 4.6 KiB apart in a weight gradient's im2col
         tile: the packing took 15 % of that layer's backward) */
      for (int64_t p2 = 0; p2 < kc2; p2++) {
         const uint16_t *r0 = b + 2 * p2 * rsb;
         const uint16_t *r1 = 2 * p2 + 1 < kc ? r0 + rsb : NULL;
         for (int64_t q = q0; q < q1; q++) {
            const int64_t j0 = q * 32;
            const int nr = nc - j0 < 32 ? (int)(nc - j0) : 32;
            uint32_t *w = dst + q * 32 * prow + (p2 >> 4) * 512 + (p2 & 15) * 16;
            _mm512_store_si512(w, bf16_pair_words(r0 + j0, r1 ? r1 + j0 : NULL,
                                                  nr < 16 ? nr : 16));
            _mm512_store_si512(w + 256, nr > 16 ? bf16_pair_words(r0 + j0 + 16,
                                                                  r1 ? r1 + j0 + 16 : NULL,
                                                                  nr - 16)
                                                : _mm512_setzero_si512());
         }
      }
   }
   for (int64_t q = q0; q < q1; q++) {
      uint32_t *d = dst + q * 32 * prow;
      const int64_t j0 = q * 32;
      const int nr = nc - j0 < 32 ? (int)(nc - j0) : 32;
      if (csb == 1) {
         /* packed above */
      } else if (rsb == 1) { /* columns of op(B) contiguous (x W^T): 16 x 16 word transposes,
                                each one whole B tile of a step */
         for (int h = 0; h < 2; h++) {
            const uint16_t *bp = b + (j0 + 16 * h) * csb;
            const int nj = nr - 16 * h;
            for (int64_t p20 = 0; p20 < kc2; p20 += 16) {
               const int64_t left = kc - 2 * p20;
               const __mmask32 mk =
                  left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
               __m512 r[16];
               for (int j = 0; j < 16; j++)
                  r[j] = j < nj ? _mm512_castsi512_ps(
                                     _mm512_maskz_loadu_epi16(mk, bp + j * csb + 2 * p20))
                                : _mm512_setzero_ps();
               transpose16(r);
               uint32_t *w = d + (p20 >> 4) * 512 + 256 * h;
               for (int t = 0; t < 16; t++)
                  _mm512_store_si512(w + t * 16, _mm512_castps_si512(r[t]));
            }
         }
      } else {
         for (int64_t p2 = 0; p2 < kc2; p2++)
            for (int j = 0; j < 32; j++) {
               const int64_t p = 2 * p2;
               const uint32_t lo = j < nr ? b[p * rsb + (j0 + j) * csb] : 0;
               const uint32_t hi = j < nr && p + 1 < kc ? b[(p + 1) * rsb + (j0 + j) * csb] : 0;
               d[(p2 >> 4) * 512 + (j >> 4) * 256 + (p2 & 15) * 16 + (j & 15)] = lo | hi << 16;
            }
      }
      /* k pairs past kc up to the step: zeros (the transposes wrote whole steps already) */
      for (int64_t p2 = kc2; p2 < kc2p; p2++) {
         uint32_t *w = d + (p2 >> 4) * 512 + (p2 & 15) * 16;
         _mm512_store_si512(w, _mm512_setzero_si512());
         _mm512_store_si512(w + 256, _mm512_setzero_si512());
      }
   }
}

void lm_amx_pack_a(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa, int64_t csa,
                   uint16_t *dst) {
   const int64_t nst = rup(kc, 32) / 32;
   if (csa == 1) {
      for (int64_t t = 0; t < nst; t++) {
         const int64_t left = kc - 32 * t;
         const __mmask32 mk = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
         uint16_t *d = dst + t * 1024;
         int64_t i = 0;
         for (; i < mc; i++)
            _mm512_store_si512(d + i * 32, _mm512_maskz_loadu_epi16(mk, a + i * rsa + 32 * t));
         for (; i < 32; i++) _mm512_store_si512(d + i * 32, _mm512_setzero_si512());
      }
   } else if (rsa == 1) {
      /* op(A) stored by columns (i contiguous): words {A(i, 2p2), A(i, 2p2+1)} for 16 rows,
         then a 16 x 16 transpose of words into rows */
      for (int64_t t = 0; t < nst; t++)
         for (int64_t i0 = 0; i0 < 32; i0 += 16) {
            const int ni = (int)(mc - i0 < 16 ? mc - i0 : 16);
            __m512 r[16];
            for (int w = 0; w < 16; w++) {
               const int64_t p = 32 * t + 2 * w;
               r[w] = p < kc && ni > 0
                         ? _mm512_castsi512_ps(bf16_pair_words(a + i0 + p * csa,
                                                          p + 1 < kc ? a + i0 + (p + 1) * csa
                                                                     : NULL,
                                                          ni))
                         : _mm512_setzero_ps();
            }
            transpose16(r);
            for (int i = 0; i < 16; i++)
               _mm512_store_si512(dst + t * 1024 + (i0 + i) * 32, _mm512_castps_si512(r[i]));
         }
   } else {
      for (int64_t t = 0; t < nst; t++)
         for (int64_t i = 0; i < 32; i++)
            for (int64_t w = 0; w < 32; w++) {
               const int64_t p = 32 * t + w;
               dst[t * 1024 + i * 32 + w] = i < mc && p < kc ? a[i * rsa + p * csa] : 0;
            }
   }
}

/* ---- epilogue ---- */

void lm_amx_row_out(const float *t, int n, float alpha, float beta, void *c, int64_t csc,
                    int c_bf16, const lm_amx_epi *ep, int64_t row, int64_t col) {
   if (csc != 1) {
      if (c_bf16)
         lm_gemm_merge_bf(1, n, t, n, (uint16_t *)c, 0, csc, alpha, beta);
      else
         lm_gemm_merge_s(1, n, t, n, (float *)c, 0, csc, alpha, beta);
      return;
   }
   const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
   const float *bias = ep && ep->bias ? ep->bias + col : NULL;
   const uint16_t *res = ep && ep->res && !ep->f32 ? ep->res + row * ep->rsr + col : NULL;
   const float *res32 =
      ep && ep->res && ep->f32 ? (const float *)(const void *)ep->res + row * ep->rsr + col : NULL;
   const int act = ep ? ep->act : LM_ACT_NONE;
   for (int j = 0; j < n; j += 16) {
      const __mmask16 mk = mask16(n - j);
      __m512 v = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(mk, t + j));
      if (c_bf16) {
         uint16_t *cp = (uint16_t *)c + j;
         if (beta != 0.0f) v = _mm512_fmadd_ps(vb, bf16_widen16(_mm256_maskz_loadu_epi16(mk, cp)), v);
         if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + j));
         if (res) v = _mm512_add_ps(v, bf16_widen16(_mm256_maskz_loadu_epi16(mk, res + j)));
         if (act) v = lm_act_ps(v, act);
         _mm256_mask_storeu_epi16(cp, mk,
                                  ep ? (__m256i)_mm512_cvtneps_pbh(v) : bf16_round16(v));
      } else {
         float *cp = (float *)c + j;
         if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, cp), v);
         if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, bias + j));
         if (res32) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, res32 + j));
         if (act) v = lm_act_ps(v, act);
         _mm512_mask_storeu_ps(cp, mk, v);
      }
   }
}

/* ---- the driver ---- */

/* a finished 32 x 32 block waiting for its epilogue (run while the next block's products work) */
typedef struct {
   const float *t;
   int mr, nr;
   void *c;
   int64_t row, col;
} pending;

/* mr rows of a 32-column block t (row stride 32) rounded to bfloat16 as lm_f2bf into out (row
   stride ldo): C = A B with nothing else to add, 64 bytes a row */
static void round_block32(const float *t, int mr, uint16_t *out, int64_t ldo) {
   for (int r = 0; r < mr; r++) {
      const __m256i lo = bf16_round16(_mm512_load_ps(t + r * 32));
      const __m256i hi = bf16_round16(_mm512_load_ps(t + r * 32 + 16));
      _mm512_storeu_si512(out + r * ldo, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
   }
}

static void finish(const pending *pd, float alpha, float beta, int64_t rsc, int64_t csc,
                   int c_bf16, const lm_amx_epi *ep) {
   if (!ep && c_bf16 && alpha == 1.0f && beta == 0.0f && pd->nr == 32 && csc == 1) {
      round_block32(pd->t, pd->mr, (uint16_t *)pd->c, rsc);
      return;
   }
   if (ep && !ep->f32 && pd->nr == 32 && csc == 1) { /* a whole block, 64 bytes a row */
      lm_amx_epi_block32(pd->t, pd->mr, ep->bias ? ep->bias + pd->col : NULL,
                         ep->res ? ep->res + pd->row * ep->rsr + pd->col : NULL, ep->rsr,
                         ep->act, (uint16_t *)pd->c, rsc, ep->stream);
      return;
   }
   for (int i = 0; i < pd->mr; i++)
      lm_amx_row_out(pd->t + i * 32, pd->nr, alpha, beta,
                     c_bf16 ? (void *)((uint16_t *)pd->c + i * rsc)
                            : (void *)((float *)pd->c + i * rsc),
                     csc, c_bf16, ep, pd->row + i, pd->col);
}

/* rows of op(A) packed 32 at a time: through lm_amx_pack_a, or (rows) from a row map */
static void pack_rows(const lm_amx_rows *rows, int64_t i0, int mr, int64_t kc, int64_t pc,
                      const uint16_t *a, int64_t rsa, int64_t csa, uint16_t *ap) {
   if (!rows) {
      lm_amx_pack_a(mr, kc, a + i0 * rsa + pc * csa, rsa, csa, ap);
      return;
   }
   const int64_t nst = rup(kc, 32) / 32;
   for (int64_t t = 0; t < nst; t++) {
      const int64_t left = kc - 32 * t;
      const __mmask32 mk = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1u);
      uint16_t *d = ap + t * 1024;
      int i = 0;
      for (; i < mr; i++) {
         const int64_t r = i0 + i, pix = rows->base(rows, r);
         _mm512_store_si512(d + i * 32,
                            _mm512_maskz_loadu_epi16(mk, a + pix * rows->pitch + pc + 32 * t));
      }
      for (; i < 32; i++) _mm512_store_si512(d + i * 32, _mm512_setzero_si512());
   }
}

/* the per-thread state of the unit loop: the A block packed last, the block waiting for its
   epilogue, the two result buffers */
typedef struct {
   float alpha, beta;
   void *c;
   int64_t rsc, csc;
   int c_bf16, direct;
   const lm_amx_epi *ep;
   float *tb;
   int flip;
   pending pd;
} unit_st;

/* after a unit's products were issued: the previous unit's epilogue (while these products
   work), then the accumulators to acc (ldacc floats a row: more k blocks follow), into C
   itself (direct) or to a result buffer whose epilogue the next unit runs */
static inline __attribute__((always_inline)) void unit_out(unit_st *s, int last, float *acc,
                                                          int64_t ldacc, int64_t i0, int64_t j,
                                                          int mr, int nr) {
   if (s->pd.t) finish(&s->pd, s->alpha, s->beta, s->rsc, s->csc, s->c_bf16, s->ep);
   s->pd.t = NULL;
   if (!last) {
      amx_store_32x32(acc, ldacc);
      return;
   }
   if (s->direct && mr == 32 && nr == 32) { /* float32 C = A B (+ C): the accumulators are it */
      amx_store_32x32((float *)s->c + i0 * s->rsc + j, s->rsc);
      return;
   }
   float *t = s->tb + s->flip * 1024;
   s->flip ^= 1;
   amx_store_32x32(t, 32);
   s->pd = (pending){t, mr, nr,
                     s->c_bf16 ? (void *)((uint16_t *)s->c + i0 * s->rsc + j * s->csc)
                               : (void *)((float *)s->c + i0 * s->rsc + j * s->csc),
                     i0, j};
}

static int amx_gemm(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                    int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                    float beta, void *c, int64_t rsc, int64_t csc, int c_bf16,
                    const lm_amx_epi *ep, const lm_amx_rows *rows, int nt) {
   const int64_t nkb = (k + KC - 1) / KC;
   const int64_t kc_blk = rup((k + nkb - 1) / nkb, 32); /* even k blocks, multiples of 32 */
   const int64_t kc2p = kc_blk / 2;
   const int64_t nc_blk = imin(rup(n, 32), NCMAX);
   const int64_t mp = rup(m, 32);
   const int64_t npan = nc_blk / 32;
   const int64_t nib = mp / 32;
   if (nt < 1) nt = 1;
   const size_t b_blk = (size_t)(npan * 32 * kc2p) * 4; /* one k block of B */
   const int64_t ncb = (n + nc_blk - 1) / nc_blk; /* column blocks */
   /* every k block of a column block of B packed at once stays in L2 (ROWACC_B) */
   const int fits = (size_t)nkb * b_blk <= ROWACC_B;
   /* colsplit: the column blocks dealt out to the threads, each packing its own B (all k) into
      its own L2 and running every row block against it: no barrier, and no thread streams
      panels that the other one packed (the 2-thread 1024^3 product with both threads packing
      one shared B block: 39 % of the peak against 43 % on one thread). rowacc: every k block
      of B (:, jc) packed at once by the team, then each thread takes whole row blocks. In both
      a row block runs for pc: for jb, its sums between k blocks in a 32 x NC float32 buffer of
      the thread's own (64 KiB, L2). Else the BLIS order below, the sums of all m rows between
      k blocks in one m x NC buffer (memory). */
   const int colsplit = nt > 1 && fits && ncb % nt == 0;
   const int rowacc = !colsplit && nkb > 1 && fits && nib >= nt;
   const size_t b_bytes = colsplit ? (size_t)nt * nkb * b_blk : rowacc ? (size_t)nkb * b_blk : b_blk;
   const size_t a_bytes = (size_t)(32 * kc_blk) * 2;
   const size_t acc_bytes = colsplit || rowacc ? (size_t)nt * 32 * nc_blk * 4
                            : nkb > 1          ? (size_t)(mp * nc_blk) * 4
                                               : 0;
   const size_t tb_bytes = 2 * 32 * 32 * 4; /* two: one being written, one being finished */
   const size_t bytes = b_bytes + (size_t)nt * (a_bytes + tb_bytes) + acc_bytes;
   char *buf = lm_alloc(bytes);
   if (!buf) {
      lm_clear_error();
      return 0;
   }
   uint32_t *bpk = (uint32_t *)buf;
   float *accb = (float *)(buf + b_bytes + (size_t)nt * (a_bytes + tb_bytes));
   /* A read in place when its rows run along k, k is whole steps of 32 (no tail to zero) and
      the row pitch is not a multiple of 1 KiB from 1 KiB on: such pitches put a tile's 16 rows
      into 4 or fewer of L1's 64 sets (k = 1024, 2 KiB: the 1024^3 product ran at a fifth of the
      micro-kernel's rate); then, and for the last partial row block, A is packed. Packing costs
      a pass over A, which at AMX's rate is as long as the products of a thin layer (1x1 256 ->
      256 at 56x56, batch 8: 0.5 of 0.73 ms went to packing and the epilogue). */
   const int inplace = !rows && csa == 1 && k % 32 == 0 && ((rsa * 2) % 1024 != 0 || rsa * 2 < 1024);
#pragma omp parallel num_threads(nt) if (nt > 1)
   {
      int tid = 0, ntt = 1;
#ifdef _OPENMP
      tid = omp_get_thread_num();
      ntt = omp_get_num_threads();
#endif
      uint16_t *ap = (uint16_t *)(buf + b_bytes + (size_t)tid * (a_bytes + tb_bytes));
      unit_st st = {alpha, beta, c, rsc, csc, c_bf16, 0, ep, (float *)((char *)ap + a_bytes), 0,
                    {NULL, 0, 0, NULL, 0, 0}};
      /* float32 C = A B or C += A B (the weight gradients' sums over pixel tiles): whole blocks
         go into C from the accumulators, which start from C's block when beta is 1 */
      st.direct = !ep && !c_bf16 && csc == 1 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
      const int cacc = st.direct && beta == 1.0f;
      lm_amx_begin();
      for (int64_t jcb = colsplit ? tid : 0; jcb < ncb; jcb += colsplit ? ntt : 1) {
         const int64_t jc = jcb * nc_blk;
         const int64_t nc = imin(nc_blk, n - jc);
         const int64_t njb = (nc + 31) / 32;
         if (colsplit || rowacc) {
            float *racc = accb + (size_t)tid * 32 * nc_blk;
            uint32_t *bb = colsplit ? bpk + (size_t)tid * nkb * (b_blk / 4) : bpk;
            if (colsplit) {
               for (int64_t kb = 0; kb < nkb; kb++) {
                  const int64_t pc = kb * kc_blk;
                  lm_amx_pack_b(imin(kc_blk, k - pc), nc, b + pc * rsb + jc * csb, rsb, csb, 0,
                                njb, bb + kb * (b_blk / 4), kc2p);
               }
            } else {
               /* each thread a run of panels of every k block: rows read along their length
                  (lm_amx_pack_b) */
#pragma omp for schedule(static) collapse(2)
               for (int64_t kb = 0; kb < nkb; kb++)
                  for (int64_t t = 0; t < ntt; t++) {
                     const int64_t pc = kb * kc_blk;
                     lm_amx_pack_b(imin(kc_blk, k - pc), nc, b + pc * rsb + jc * csb, rsb, csb,
                                   njb * t / ntt, njb * (t + 1) / ntt, bb + kb * (b_blk / 4),
                                   kc2p);
                  }
            }
            const int64_t ib0 = colsplit ? 0 : nib * tid / ntt;
            const int64_t ib1 = colsplit ? nib : nib * (tid + 1) / ntt;
            for (int64_t ib = ib0; ib < ib1; ib++) {
               const int64_t i0 = ib * 32;
               const int mr = (int)imin(32, m - i0);
               for (int64_t pc = 0, kb = 0; pc < k; pc += kc_blk, kb++) {
                  const int64_t kc = imin(kc_blk, k - pc);
                  const int nsteps = (int)(rup(kc, 32) / 32);
                  const uint32_t *bk = bb + kb * (b_blk / 4);
                  const int inpl = inplace && mr == 32;
                  if (!inpl) pack_rows(rows, i0, mr, kc, pc, a, rsa, csa, ap);
                  for (int64_t jb = 0; jb < njb; jb++) {
                     const amx_seg seg = {inpl ? a + i0 * rsa + pc : ap, bk + jb * 32 * kc2p};
                     const int whole = mr == 32 && nc - jb * 32 >= 32;
                     const float *cin = pc                ? racc + jb * 32
                                        : cacc && whole ? (float *)c + i0 * rsc + jc + jb * 32
                                                        : NULL;
                     const int64_t ldin = pc ? nc_blk : rsc;
                     if (inpl)
                        amx_issue_32x32(&seg, 1, nsteps, rsa * 2, 32 * rsa, 64, cin, ldin, 1);
                     else
                        amx_issue_32x32(&seg, 1, nsteps, 64, 1024, 2048, cin, ldin, 1);
                     unit_out(&st, pc + kc >= k, racc + jb * 32, nc_blk, i0, jc + jb * 32, mr,
                              (int)imin(32, nc - jb * 32));
                  }
               }
            }
            if (st.pd.t) finish(&st.pd, alpha, beta, rsc, csc, c_bf16, ep);
            st.pd.t = NULL;
            if (ep && ep->stream) _mm_sfence();
            if (rowacc) {
#pragma omp barrier
            }
            continue;
         }
         for (int64_t pc = 0; pc < k; pc += kc_blk) {
            const int64_t kc = imin(kc_blk, k - pc);
            const int first = pc == 0, last = pc + kc >= k;
            const int nsteps = (int)(rup(kc, 32) / 32);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntt; t++)
               lm_amx_pack_b(kc, nc, b + pc * rsb + jc * csb, rsb, csb, njb * t / ntt,
                             njb * (t + 1) / ntt, bpk, kc2p);
            /* units (ib, jb) in row-major order, a contiguous run per thread */
            const int64_t nu = nib * njb;
            const int64_t u0 = nu * tid / ntt, u1 = nu * (tid + 1) / ntt;
            int64_t packed_ib = -1;
            for (int64_t u = u0; u < u1; u++) {
               const int64_t ib = u / njb, jb = u % njb;
               const int64_t i0 = ib * 32, j0 = jb * 32;
               const int mr = (int)imin(32, m - i0), nr = (int)imin(32, nc - j0);
               float *acc = accb ? accb + i0 * nc_blk + j0 : NULL;
               const float *cin = !first                           ? acc
                                  : cacc && mr == 32 && nr == 32 ? (float *)c + i0 * rsc + jc + j0
                                                                   : NULL;
               const int64_t ldin = first ? rsc : nc_blk;
               if (inplace && mr == 32) {
                  const amx_seg seg = {a + i0 * rsa + pc, bpk + jb * 32 * kc2p};
                  amx_issue_32x32(&seg, 1, nsteps, rsa * 2, 32 * rsa, 64, cin, ldin, 1);
               } else {
                  if (packed_ib != ib) {
                     pack_rows(rows, i0, mr, kc, pc, a, rsa, csa, ap);
                     packed_ib = ib;
                  }
                  const amx_seg seg = {ap, bpk + jb * 32 * kc2p};
                  amx_issue_32x32(&seg, 1, nsteps, 64, 1024, 2048, cin, ldin, 1);
               }
               unit_out(&st, last, acc, nc_blk, i0, jc + j0, mr, nr);
            }
            if (st.pd.t) finish(&st.pd, alpha, beta, rsc, csc, c_bf16, ep);
            st.pd.t = NULL;
            if (ep && ep->stream) _mm_sfence();
#pragma omp barrier
         }
      }
      lm_amx_end();
   }
   lm_free(buf, bytes);
   return 1;
}

int lm_bgemm_amx(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t rsa,
                 int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb, float beta, void *c,
                 int64_t rsc, int64_t csc, int c_bf16, int nt) {
   return amx_gemm(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, c_bf16, NULL,
                   NULL, nt);
}

int lm_bgemm_amx_epi(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t rsa,
                     int64_t csa, const lm_amx_rows *rows, const uint16_t *b, int64_t rsb,
                     int64_t csb, void *c, int64_t rsc, const lm_amx_epi *ep, int nt) {
   return amx_gemm(m, n, k, 1.0f, a, rsa, csa, b, rsb, csb, 0.0f, c, rsc, 1, !(ep && ep->f32), ep,
                   rows, nt);
}
