/* gemm_bf16_amx.h -- what the AMX kernels share (include only from *_amx.c files): the
 * batch-reduce micro-kernel on a 32 x 32 float32 block of C, the packing, the epilogue row.
 *
 * Packed B (lm_amx_pack_b): panels of 32 columns; panel q holds kc2p = ceil(kc / 32) * 16 k
 * pairs (p2), zeros past kc and past nc; panel q starts at dst + q * 32 * prow. A step of 32 k
 * (16 pairs) is 512 words: the B tile of columns 0-15 (16 rows p2 of 16 words {B(2 p2, j),
 * B(2 p2 + 1, j)}, even k in the low half) in its first 256 words, columns 16-31 in the next
 * 256: each tile 1 KiB contiguous, loaded at a 64-byte stride (with B streamed from L2 the
 * micro-kernel ran at 60 % of the peak, 58 % with the two tiles' rows interleaved 128 bytes
 * apart; loaded with TILELOADDT1, 75 %: bench/amx_kernel.c).
 */
#ifndef LUMEN_GEMM_BF16_AMX_H
#define LUMEN_GEMM_BF16_AMX_H
#include "amx.h"
#include "gemm_internal.h"
#include "avx512_util.h"
#include "act_avx512.h"
#include <immintrin.h>

/* one segment of a batch-reduce: A rows (k contiguous) at a, B panel rows at b; step t reads A
   columns [32 t, 32 t + 32) and B rows [16 t, 16 t + 16) */
typedef struct {
   const uint16_t *a;
   const uint32_t *b;
} amx_seg;

/* C(32 x 32) = [cin +] sum over the segments and nsteps steps of A(32 x 32) B(32 x 32) into the
   accumulator tiles 0-3: A rows sa_bytes apart, rows 16-31 at a1 bytes past rows 0-15, step t
   at t * astep bytes (in place: sa = the row stride, a1 = 16 sa, astep = 64; packed
   tile-contiguous (lm_amx_pack_a): 64, 1024, 2048). cin NULL: start from zero; else the float32
   block at cin (row stride ldcin floats). amx_store_32x32 then writes the block out. The two are
   apart so that a caller can issue the next block's products and run the previous block's
   epilogue (AVX-512) while the tiles work: with few steps (k = 64: 8 products) the epilogue
   otherwise waited for the products and the products for the epilogue (1x1 64->256 at 56x56,
   batch 8: 6.0 ms; overlapped: docs/performance.md, AMX). */
static inline __attribute__((always_inline)) void amx_issue_32x32(
   const amx_seg *seg, int nseg, int nsteps, int64_t sa_bytes, int64_t a1, int64_t astep,
   const float *cin, int64_t ldcin, const int bt1) {
   if (cin) {
      LM_TILE_LOAD(0, cin, ldcin * 4);
      LM_TILE_LOAD(1, cin + 16, ldcin * 4);
      LM_TILE_LOAD(2, cin + 16 * ldcin, ldcin * 4);
      LM_TILE_LOAD(3, cin + 16 * ldcin + 16, ldcin * 4);
   } else {
      LM_TILE_ZERO(0);
      LM_TILE_ZERO(1);
      LM_TILE_ZERO(2);
      LM_TILE_ZERO(3);
   }
   /* software-pipelined: the next step's A0 is loaded as soon as the two products that read
      A0 are issued, B0 after the third, B1 and A1 after the fourth, so the loads overlap the
      products instead of waiting for all four (tiles are not renamed: a load into a tile waits
      for the products still reading it). Measured 1024^3 on one core: 2x2 loads-then-products
      27 % of the TDPBF16PS peak, pipelined: docs/performance.md (AMX). */
   if (nseg <= 0 || nsteps <= 0) return;
   {
      int s = 0, t = 0;
      const char *ap = (const char *)seg[0].a;
      const uint32_t *bp = seg[0].b;
      LM_TILE_LOAD(4, ap, sa_bytes);
      if (bt1) {
         LM_TILE_LOAD_T1(6, bp, 64);
         LM_TILE_LOAD_T1(7, bp + 256, 64);
      } else {
         LM_TILE_LOAD(6, bp, 64);
         LM_TILE_LOAD(7, bp + 256, 64);
      }
      LM_TILE_LOAD(5, ap + a1, sa_bytes);
      for (;;) {
         const char *an;
         const uint32_t *bn;
         if (t + 1 < nsteps) {
            t++;
            an = ap + astep;
            bn = bp + 512;
         } else if (s + 1 < nseg) {
            s++;
            t = 0;
            an = (const char *)seg[s].a;
            bn = seg[s].b;
         } else {
            break;
         }
         LM_TILE_DPBF16(0, 4, 6);
         LM_TILE_DPBF16(1, 4, 7);
         LM_TILE_LOAD(4, an, sa_bytes);
         LM_TILE_DPBF16(2, 5, 6);
         if (bt1)
            LM_TILE_LOAD_T1(6, bn, 64);
         else
            LM_TILE_LOAD(6, bn, 64);
         LM_TILE_DPBF16(3, 5, 7);
         if (bt1)
            LM_TILE_LOAD_T1(7, bn + 256, 64);
         else
            LM_TILE_LOAD(7, bn + 256, 64);
         LM_TILE_LOAD(5, an + a1, sa_bytes);
         ap = an;
         bp = bn;
      }
      LM_TILE_DPBF16(0, 4, 6);
      LM_TILE_DPBF16(1, 4, 7);
      LM_TILE_DPBF16(2, 5, 6);
      LM_TILE_DPBF16(3, 5, 7);
   }
}

/* the four accumulators of amx_issue_32x32 to cout (row stride ldcout floats) */
static inline __attribute__((always_inline)) void amx_store_32x32(float *cout, int64_t ldcout) {
   LM_TILE_STORE(0, cout, ldcout * 4);
   LM_TILE_STORE(1, cout + 16, ldcout * 4);
   LM_TILE_STORE(2, cout + 16 * ldcout, ldcout * 4);
   LM_TILE_STORE(3, cout + 16 * ldcout + 16, ldcout * 4);
}


/* the fused epilogue of a bfloat16 C (a convolution's): + bias[j] (float32), + res[i * rsr + j]
   (bfloat16), the activation act (lm_conv_act), before the rounding; any of them NULL / 0.
   With an epilogue the rounding is vcvtneps2bf16's (round to nearest even, denormals flushed),
   as the AVX-512 BF16 convolution kernels round; without one, lm_f2bf's, bit for bit (the
   matrix products). */
typedef struct {
   const float *bias;
   const uint16_t *res;
   int64_t rsr;
   int act;
   int stream; /* write C with streaming stores (lm_amx_stream) */
   int f32;    /* res and C are float32 (lm.backends.cpu.fp32_precision = "bf16") */
} lm_amx_epi;

/* streaming stores for an output of out_bytes in a block that was cold (or not): as the float32
   pointwise kernels decide (conv_pointwise_f32_avx512.c, lm_conv_pw_stream): LUMEN_CONV_STREAM=0 /
   1 forces them; else when the block is cold or the output exceeds half the cache share. 1x1 64 ->
   256 at 56x56, batch 8, bf16 out: 3.2-3.8 ms through the cache, 1.42 ms streamed (one process
   each, alternated twice). */
LM_GEMM_HIDDEN int lm_amx_stream(double out_bytes, int cold);

/* the epilogue of mr rows of a 32-column block t (row stride 32 floats) into bfloat16 out (row
   stride ldo): + bias[0..31], + res (row stride ldr), the activation act (lm_conv_act),
   vcvtne2ps2bf16, one 64-byte store a
   row (bias, res NULL when absent); stream: non-temporal stores where the row is 64-byte
   aligned (the caller fences) */
static inline __attribute__((always_inline)) void lm_amx_epi_block32(
   const float *t, int mr, const float *bias, const uint16_t *res, int64_t ldr, int act,
   uint16_t *out, int64_t ldo, int stream) {
   const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
   const __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
   for (int r = 0; r < mr; r++) {
      __m512 v0 = _mm512_add_ps(_mm512_load_ps(t + r * 32), b0);
      __m512 v1 = _mm512_add_ps(_mm512_load_ps(t + r * 32 + 16), b1);
      if (res) {
         const __m512i h = _mm512_loadu_si512(res + r * ldr);
         v0 = _mm512_add_ps(v0, _mm512_castsi512_ps(_mm512_slli_epi32(
                                   _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16)));
         v1 = _mm512_add_ps(v1, _mm512_castsi512_ps(_mm512_slli_epi32(
                                   _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16)));
      }
      if (act) {
         v0 = lm_act_ps(v0, act);
         v1 = lm_act_ps(v1, act);
      }
      if (stream && ((uintptr_t)(out + r * ldo) & 63) == 0)
         _mm512_stream_si512((__m512i *)(out + r * ldo), (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
      else
         _mm512_storeu_si512(out + r * ldo, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
   }
}

/* panels [q0, q1) of the kc x nc block of op(B) (element (p, j) at b[p*rsb + j*csb]); panel q
   at dst + q * 32 * prow (prow >= ceil(kc / 32) * 16 rows of 32 words) */
LM_GEMM_HIDDEN void lm_amx_pack_b(int64_t kc, int64_t nc, const uint16_t *b, int64_t rsb,
                                  int64_t csb, int64_t q0, int64_t q1, uint32_t *dst,
                                  int64_t prow);
/* 32 rows x ceil(kc / 32) * 32 columns of op(A) (mc <= 32 valid rows, element (i, p) at
   a[i*rsa + p*csa]) into dst, tile-contiguous: step t (columns 32 t .. 32 t + 31) at
   dst + 1024 t, 32 rows of 32 values; zeros past mc and kc. Tile-contiguous because rows of a
   power-of-two stride (k = 1024: 2 KiB) fall into two sets of the L1 cache: read in place, the
   1024^3 GEMM ran at a fifth of the micro-kernel's speed. */
LM_GEMM_HIDDEN void lm_amx_pack_a(int64_t mc, int64_t kc, const uint16_t *a, int64_t rsa,
                                  int64_t csa, uint16_t *dst);
/* one row of n results t (float32) into C: C = alpha * t + beta * C (beta 0: C not read), C
   float32 or (c_bf16) bfloat16 rounded as lm_f2bf, elements csc apart; ep (bfloat16 C with
   csc 1 only) adds the epilogue of row `row`, columns from `col` */
LM_GEMM_HIDDEN void lm_amx_row_out(const float *t, int n, float alpha, float beta, void *c,
                                   int64_t csc, int c_bf16, const lm_amx_epi *ep, int64_t row,
                                   int64_t col);
/* a row map for op(A): row i starts at a + base(rows, i) * pitch, k contiguous (a strided 1x1
   convolution's input pixels) */
typedef struct lm_amx_rows {
   int64_t (*base)(const struct lm_amx_rows *, int64_t i);
   int64_t pitch;
   int64_t H, W, Ho, Wo, sh, sw; /* for the convolutions' maps */
} lm_amx_rows;
/* the GEMM into a dense bfloat16 C (float32 when ep->f32; row stride rsc) with the epilogue ep
   (or NULL), alpha 1,
   beta 0, on nt threads; rows (or NULL): op(A)'s rows from a row map (rsa, csa unused); 0 when
   its workspace could not be had */
LM_GEMM_HIDDEN int lm_bgemm_amx_epi(int64_t m, int64_t n, int64_t k, const uint16_t *a,
                                    int64_t rsa, int64_t csa, const lm_amx_rows *rows,
                                    const uint16_t *b, int64_t rsb, int64_t csb, void *c,
                                    int64_t rsc, const lm_amx_epi *ep, int nt);
#endif
