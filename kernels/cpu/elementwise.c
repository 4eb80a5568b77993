/* elementwise.c -- the CPU kernels of the elementwise family (front end: src/elementwise.c;
 * parameters: src/ops/elementwise.h): the gather / compute / scatter loop that feeds the compute
 * loops of ew_kernels.c (with streaming stores for cold outputs), the small dense path, the
 * strided copy (tiles for transposed layouts) and fill. */
#include "ew.h"
#include "impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- the engine */

typedef struct ew_plan {
   int nin;
   int in_dt[3];  /* dtype the kernel reads for each input (float32 / float64 / int64 / bool) */
   int via[3];    /* dtype each input is cast to first (PyTorch's common dtype), -1: none */
   int out_dt;    /* dtype the kernel writes */
   int out_via;   /* the op's result dtype, when the kernel's output must round through it */
   lm_kset k;
   lm_kparams p;
   int cheap;     /* a memory-bound kernel: parallel only from LM_CHEAP_GRAIN elements */
   lm_kfn epi;    /* a unary kernel applied in place to each computed chunk (fused ops), or NULL */
   int epi_via;   /* the dtype a (float32) chunk rounds through before epi, or -1 */
   int bfop;      /* the bfloat16 direct loop's op (BF_*), 0: none (bf16_direct) */
   lm_kparams ep; /* its parameters */
} ew_plan;

typedef struct ew_ctx {
   const ew_plan *pl;
   int dt[4];  /* operand dtypes: out, inputs */
   int stream; /* write the (fresh, dense, cold) output with streaming stores */
   int wide;   /* ... of whole 64-byte lines: the AVX-512 path is in use (lm_cpu_isa) */
} ew_ctx;

/* n bytes from an L1-resident buffer to dst with non-temporal stores: whole 64-byte lines with
 * AVX-512 (wide: the ISA lumen uses, as for the kernels, so a forced lower ISA is honoured) where
 * dst is line-aligned (every chunk of a fresh block is), else
 * 16-byte stores where dst is 16-byte aligned; ordinary stores for an unaligned head and the
 * tail. Measured, -x on 8x64x56x56 into cold blocks, one thread: 0.185-0.206 -> 0.165-0.188 ms
 * (the raw memory floor here: 0.175-0.21 ms). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void stream_bytes512(char *dst, const char *src,
                                                                 int64_t n) {
   int64_t i = 0;
   for (; i + 64 <= n; i += 64)
      _mm512_stream_si512((void *)(dst + i), _mm512_loadu_si512((const void *)(src + i)));
   memcpy(dst + i, src + i, (size_t)(n - i));
}
#endif

static void stream_bytes(char *dst, const char *src, int64_t n, int wide) {
#if defined(__x86_64__)
   if (wide && ((uintptr_t)dst & 63) == 0) {
      stream_bytes512(dst, src, n);
      return;
   }
   int64_t head = (int64_t)((16 - ((uintptr_t)dst & 15)) & 15);
   if (head > n) head = n;
   memcpy(dst, src, (size_t)head);
   int64_t i = head;
   for (; i + 16 <= n; i += 16)
      _mm_stream_si128((__m128i *)(void *)(dst + i),
                       _mm_loadu_si128((const __m128i *)(const void *)(src + i)));
   memcpy(dst + i, src + i, (size_t)(n - i));
#else
   (void)wide;
   memcpy(dst, src, (size_t)n);
#endif
}

#define LM_STREAM_MIN_BYTES ((int64_t)1 << 20)

/* LUMEN_EW_STREAM=0 / 1: never / always stream large fresh outputs (specs, benchmarks); by
   default only cold ones whose rows (the iterator's inner run, row_bytes) are long: each row is
   one call of the loop, which ends its streaming stores with an sfence, so short rows (a
   channels-last activation times an N x C x 1 x 1 gate: squeeze-and-excitation) paid a fence
   every few hundred bytes. EfficientNet's SE scale, 8 x 32 x 112 x 112 float32 times
   8 x 32 x 1 x 1, 2 threads: 10.5 ms streamed by rows of 128 bytes, 2.4 ms with plain stores;
   480 channels at 14 x 14 0.52 -> 0.39 */
#define LM_STREAM_MIN_ROW ((int64_t)16 << 10)
static int want_stream(const lm_tensor *o, int64_t row_bytes) {
   if (o->numel * lm_elsize(o->dtype) < LM_STREAM_MIN_BYTES) return 0;
   const char *e = getenv("LUMEN_EW_STREAM");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) return e[0] == '1';
   return row_bytes >= LM_STREAM_MIN_ROW && lm_tensor_block_cold(o);
}

/* src (dtype sdt, byte stride ss) -> dst of dtype ddt (dense), optionally rounding through via */
static void convert_via(int ddt, char *dst, int via, int sdt, const char *src, int64_t ss,
                        int64_t m, char *tmp) {
   if (via >= 0 && sdt != via && via != ddt) {
      int vs = lm_dtype_size(via);
      lm_convert(via, tmp, vs, sdt, src, ss, m);
      lm_convert(ddt, dst, lm_dtype_size(ddt), via, tmp, vs, m);
   } else {
      lm_convert(ddt, dst, lm_dtype_size(ddt), sdt, src, ss, m);
   }
}

/* ---- bfloat16 without the gather / scatter: add, sub, mul (optionally + relu), relu ----
 * The general loop converts each 256-element chunk of every 16-bit operand into a float32
 * buffer, computes, then converts the result back: six to eight passes over L1 per chunk, which
 * made bfloat16 compute-bound (x + x then relu on 8x64x56x56, one thread: 0.95 ms, twice the
 * float32 time for half the bytes). Here the operands are dense bfloat16: 16 elements are
 * widened in registers (a shift), computed in float32 exactly as the float32 kernels do
 * (x + alpha * y without contraction, relu as x < 0 ? 0 : x), rounded to bfloat16 as lm_f2bf
 * does (nearest even, NaN quietened), stored. A fused relu rounds the sum first, as the eager
 * pair stores it between the two ops (the relu of a rounded value is exact): the same bits as
 * the general loop, which the specs check on every shape. */
enum { BF_ADD = 1, BF_SUB, BF_MUL, BF_RELU, BF_ADD_RELU, BF_SUB_RELU, BF_MUL_RELU };

#if defined(__x86_64__)
#define BF_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
BF_TARGET static inline __m512 bf_widen(__m256i h) {
   return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* lm_f2bf on 16 lanes: (x + 0x7fff + lsb) >> 16, a NaN as (x >> 16) | 0x40; the bfloat16
   bits in the low half of each 32-bit lane */
BF_TARGET static inline __m512i bf_round(__m512 v) {
   const __m512i x = _mm512_castps_si512(v);
   const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
   __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)),
                                                  lsb), 16);
   const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
   return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
}
/* relu of a rounded bfloat16 h, what lm_f2bf(relu(lm_bf2f(h))) gives, on the bits: 0 where h
   is negative and neither -0 nor NaN (0x8001 <= h <= 0xff80), else h (a NaN h from bf_round
   is quiet already) */
BF_TARGET static inline __m512i bf_relu_bits(__m512i h) {
   const __mmask16 neg = _mm512_cmple_epu32_mask(_mm512_sub_epi32(h, _mm512_set1_epi32(0x8001)),
                                                 _mm512_set1_epi32(0xff80 - 0x8001));
   return _mm512_maskz_mov_epi32((__mmask16)~neg, h);
}
BF_TARGET static inline __m256i bf_one(int op, __m512 al, const uint16_t *a, const uint16_t *b,
                                       __mmask16 m) {
   const __m512 x = bf_widen(_mm256_maskz_loadu_epi16(m, a));
   const __m512 y = bf_widen(_mm256_maskz_loadu_epi16(m, b));
   __m512 r;
   switch (op) {
   case BF_ADD: case BF_ADD_RELU: r = _mm512_add_ps(x, _mm512_mul_ps(al, y)); break;
   case BF_SUB: case BF_SUB_RELU: r = _mm512_sub_ps(x, _mm512_mul_ps(al, y)); break;
   default: r = _mm512_mul_ps(x, y); break;
   }
   __m512i h = bf_round(r);
   if (op >= BF_ADD_RELU) h = bf_relu_bits(h);
   return _mm512_cvtepi32_epi16(h);
}
/* relu of 32 bfloat16 values, lm_f2bf(relu(lm_bf2f(h))): a NaN quietened (| 0x40), a negative
   value other than -0 to +0, everything else as it is */
BF_TARGET static inline __m512i bf_relu32(__m512i h) {
   const __m512i mag = _mm512_and_si512(h, _mm512_set1_epi16(0x7fff));
   const __mmask32 nan = _mm512_cmpgt_epu16_mask(mag, _mm512_set1_epi16(0x7f80));
   const __mmask32 neg = _mm512_cmple_epu16_mask(_mm512_sub_epi16(h, _mm512_set1_epi16((short)0x8001)),
                                                 _mm512_set1_epi16(0xff80 - 0x8001));
   h = _mm512_mask_blend_epi16(nan, h, _mm512_or_si512(h, _mm512_set1_epi16(0x40)));
   return _mm512_maskz_mov_epi16(~neg | nan, h);
}
/* n elements o = op(a, b) (b unused for BF_RELU) */
BF_TARGET static void bf16_run(int op, float alpha, uint16_t *o, const uint16_t *a,
                               const uint16_t *b, int64_t n) {
   int64_t i = 0;
   if (op == BF_RELU) {
      for (; i + 32 <= n; i += 32)
         _mm512_storeu_si512((void *)(o + i), bf_relu32(_mm512_loadu_si512((const void *)(a + i))));
      if (i < n) {
         const __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
         _mm512_mask_storeu_epi16(o + i, m, bf_relu32(_mm512_maskz_loadu_epi16(m, a + i)));
      }
      return;
   }
   const __m512 al = _mm512_set1_ps(alpha);
   for (; i + 16 <= n; i += 16)
      _mm256_storeu_si256((__m256i *)(void *)(o + i),
                          bf_one(op, al, a + i, b ? b + i : NULL, (__mmask16)0xffff));
   if (i < n) {
      const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
      _mm256_mask_storeu_epi16(o + i, m, bf_one(op, al, a + i, b ? b + i : NULL, m));
   }
}
#endif

static void stream_bytes(char *dst, const char *src, int64_t n, int wide);

/* the direct loop over a run, when every operand is dense bfloat16; 0: not taken */
static int bf16_direct(const ew_ctx *cx, char **data, const int64_t *st, int64_t n) {
#if defined(__x86_64__)
   const ew_plan *pl = cx->pl;
   for (int k = 0; k <= pl->nin; k++)
      if (cx->dt[k] != LM_BFLOAT16 || st[k] != 2) return 0;
   const float al = pl->p.alpha_f;
   const uint16_t *a = (const uint16_t *)(const void *)data[1];
   const uint16_t *b = pl->nin > 1 ? (const uint16_t *)(const void *)data[2] : NULL;
   uint16_t *o = (uint16_t *)(void *)data[0];
   if (!cx->stream) {
      bf16_run(pl->bfop, al, o, a, b, n);
      return 1;
   }
   /* a cold fresh output: a chunk in L1, then streaming stores (as ew_loop does) */
   _Alignas(64) uint16_t buf[LM_CHUNK * 4];
   for (int64_t j = 0; j < n; j += LM_CHUNK * 4) {
      const int64_t m = n - j < LM_CHUNK * 4 ? n - j : LM_CHUNK * 4;
      bf16_run(pl->bfop, al, buf, a + j, b ? b + j : NULL, m);
      stream_bytes((char *)(o + j), (const char *)buf, m * 2, cx->wide);
   }
   _mm_sfence();
   return 1;
#else
   (void)cx, (void)data, (void)st, (void)n;
   return 0;
#endif
}

static void ew_loop(void *ctx_, char **data, const int64_t *st, int64_t n) {
   const ew_ctx *cx = ctx_;
   const ew_plan *pl = cx->pl;
   if (pl->bfop && bf16_direct(cx, data, st, n)) return;
   const int nin = pl->nin;
   _Alignas(64) char buf[3][LM_CHUNK * 8];
   _Alignas(64) char obuf[LM_CHUNK * 8];
   _Alignas(64) char tmp[LM_CHUNK * 8];
   _Alignas(64) char sbuf[3][16];
   _Alignas(64) char sbuf2[LM_CHUNK * 8];
   int streamed = 0;
   int mode[3] = {0, 0, 0}; /* 0: dense, usable in place; 1: one element (stride 0); 2: gather */
   int plain[3] = {1, 1, 1};
   for (int k = 0; k < nin; k++) {
      int dt = cx->dt[k + 1];
      plain[k] = dt == pl->in_dt[k] && !(pl->via[k] >= 0 && dt != pl->via[k]);
      if (st[k + 1] == 0) mode[k] = 1;
      else if (plain[k] && st[k + 1] == lm_dtype_size(pl->in_dt[k])) mode[k] = 0;
      else mode[k] = 2;
   }
   lm_kfn fn = pl->k.vv;
   int as_scalar[3] = {0, 0, 0};
   if (nin == 2) {
      if (mode[1] == 1 && pl->k.vs) {
         fn = pl->k.vs;
         as_scalar[1] = 1;
      } else if (mode[0] == 1 && pl->k.sv) {
         fn = pl->k.sv;
         as_scalar[0] = 1;
      }
   }
   const int oes = lm_dtype_size(pl->out_dt);
   const int odirect = cx->dt[0] == pl->out_dt && st[0] == oes &&
                       !(pl->out_via >= 0 && pl->out_via != pl->out_dt);
   const char *ptr[3] = {NULL, NULL, NULL};
   int gather = 0;
   for (int k = 0; k < nin; k++) {
      if (mode[k] == 1) {
         if (plain[k]) {
            ptr[k] = data[k + 1];
         } else {
            convert_via(pl->in_dt[k], sbuf[k], pl->via[k], cx->dt[k + 1], data[k + 1], 0, 1, tmp);
            ptr[k] = sbuf[k];
         }
         if (!as_scalar[k]) { /* materialize a chunk of copies */
            lm_convert(pl->in_dt[k], buf[k], lm_dtype_size(pl->in_dt[k]), pl->in_dt[k], ptr[k], 0,
                       LM_CHUNK);
            ptr[k] = buf[k];
            gather = 1;
         }
      } else if (mode[k] == 2) {
         gather = 1;
      }
   }
   if (!gather && odirect) {
      /* everything dense in the kernel's types: one call over the whole run */
      const char *p3[3];
      for (int k = 0; k < 3; k++) p3[k] = (k < nin && mode[k] == 0) ? data[k + 1] : ptr[k];
      if (!cx->stream && !pl->epi) {
         fn(data[0], p3[0], p3[1], p3[2], n, &pl->p);
         return;
      }
      /* a cold output or a fused epilogue: compute a chunk (in L1), apply the epilogue to it,
         then store it (streaming stores for a cold output) */
      for (int64_t j = 0; j < n; j += LM_CHUNK) {
         int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
         const char *q[3];
         for (int k = 0; k < 3; k++)
            q[k] = (k < nin && mode[k] == 0) ? p3[k] + j * st[k + 1] : p3[k];
         char *dst = data[0] + j * st[0];
         char *o = cx->stream ? obuf : dst;
         fn(o, q[0], q[1], q[2], m, &pl->p);
         if (pl->epi) pl->epi(o, o, NULL, NULL, m, &pl->ep);
         if (cx->stream) stream_bytes(dst, obuf, m * oes, cx->wide);
      }
      if (!cx->stream) return;
#if defined(__x86_64__)
      _mm_sfence();
#endif
      return;
   }
   for (int64_t j = 0; j < n; j += LM_CHUNK) {
      int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
      for (int k = 0; k < nin; k++) {
         if (mode[k] == 0) {
            ptr[k] = data[k + 1] + j * st[k + 1];
         } else if (mode[k] == 2) {
            convert_via(pl->in_dt[k], buf[k], pl->via[k], cx->dt[k + 1], data[k + 1] + j * st[k + 1],
                        st[k + 1], m, tmp);
            ptr[k] = buf[k];
         }
      }
      char *op = odirect ? data[0] + j * st[0] : obuf;
      fn(op, ptr[0], ptr[1], ptr[2], m, &pl->p);
      if (pl->epi) {
         if (pl->epi_via >= 0) { /* the eager pair's 16-bit intermediate, in L1 */
            const int vs = lm_dtype_size(pl->epi_via);
            lm_convert(pl->epi_via, tmp, vs, pl->out_dt, op, oes, m);
            lm_convert(pl->out_dt, op, oes, pl->epi_via, tmp, vs, m);
         }
         pl->epi(op, op, NULL, NULL, m, &pl->ep);
      }
      if (!odirect) {
         char *dst = data[0] + j * st[0];
         int via = pl->out_via;
         const int des = lm_dtype_size(cx->dt[0]);
         /* a cold fresh output (dense) is written with streaming stores, as above: the
            converted chunk goes through L1 first */
         char *d1 = cx->stream && st[0] == des ? sbuf2 : dst;
         const int64_t ds1 = d1 == dst ? st[0] : des;
         if (via >= 0 && via != pl->out_dt && via != cx->dt[0]) {
            lm_convert(via, tmp, lm_dtype_size(via), pl->out_dt, obuf, oes, m);
            lm_convert(cx->dt[0], d1, ds1, via, tmp, lm_dtype_size(via), m);
         } else {
            lm_convert(cx->dt[0], d1, ds1, pl->out_dt, obuf, oes, m);
         }
         if (d1 != dst) {
            stream_bytes(dst, d1, m * des, cx->wide);
            streamed = 1;
         }
      }
   }
#if defined(__x86_64__)
   if (streamed) _mm_sfence();
#else
   (void)streamed;
#endif
}

static int same_shape(const lm_operand *a, const lm_operand *b) {
   if (a->ndim != b->ndim) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->sizes[d] != b->sizes[d]) return 0;
   return 1;
}

/* a dense copy of an operand that partially overlaps the output */
static lm_status materialize(lm_operand *op, lm_tensor **tmp) {
   LM_TRY(lm_empty(op->ndim, op->sizes, op->dtype, LM_CONTIGUOUS, LM_CPU, tmp));
   lm_operand t;
   lm_operand_tensor(&t, *tmp);
   lm_status st = lm_cpu_copy_operands(&t, op);
   if (st != LM_OK) {
      lm_tensor_free(*tmp);
      *tmp = NULL;
      return st;
   }
   t.wrapped = op->wrapped;
   *op = t;
   return LM_OK;
}

/* ---------------------------------------------------------------- copy and fill */

static void copy_loop(void *ctx, char **data, const int64_t *st, int64_t n) {
   const int *dt = ctx;
   lm_convert(dt[0], data[0], st[0], dt[1], data[1], st[1], n);
}

enum { TB = 32 }; /* transpose tile */

#define TILE_FN(NAME, T)                                                                        \
   static void NAME(char *d, int64_t dk, const char *s, int64_t s0, int64_t n0, int64_t nk) {   \
      for (int64_t k = 0; k < nk; k++) {                                                        \
         T *dd = (T *)(d + k * dk);                                                             \
         const char *ss = s + k * (int64_t)sizeof(T);                                           \
         for (int64_t i = 0; i < n0; i++) dd[i] = *(const T *)(ss + i * s0);                    \
      }                                                                                         \
   }
TILE_FN(tile1, uint8_t)
TILE_FN(tile2, uint16_t)
TILE_FN(tile8, uint64_t)

/* 4-byte elements: 4x4 blocks transposed in SSE registers (bits only move, nothing is computed) */
static void tile4(char *d, int64_t dk, const char *s, int64_t s0, int64_t n0, int64_t nk) {
   int64_t k = 0;
   for (; k + 4 <= nk; k += 4) {
      int64_t i = 0;
      for (; i + 4 <= n0; i += 4) {
         const char *sp = s + i * s0 + k * 4;
         __m128 r0 = _mm_loadu_ps((const float *)sp);
         __m128 r1 = _mm_loadu_ps((const float *)(sp + s0));
         __m128 r2 = _mm_loadu_ps((const float *)(sp + 2 * s0));
         __m128 r3 = _mm_loadu_ps((const float *)(sp + 3 * s0));
         _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
         char *dp = d + k * dk + i * 4;
         _mm_storeu_ps((float *)dp, r0);
         _mm_storeu_ps((float *)(dp + dk), r1);
         _mm_storeu_ps((float *)(dp + 2 * dk), r2);
         _mm_storeu_ps((float *)(dp + 3 * dk), r3);
      }
      for (; i < n0; i++)
         for (int64_t kk = k; kk < k + 4; kk++)
            *(uint32_t *)(d + kk * dk + i * 4) = *(const uint32_t *)(s + i * s0 + kk * 4);
   }
   for (; k < nk; k++)
      for (int64_t i = 0; i < n0; i++)
         *(uint32_t *)(d + k * dk + i * 4) = *(const uint32_t *)(s + i * s0 + k * 4);
}

/* same-dtype copy where dst is unit-stride in iteration dim 0 and src in dim kd: tiles */
static void transpose_copy(const lm_iter *it, int kd, int es) {
   const int64_t n0 = it->shape[0], nk = it->shape[kd];
   const int64_t d0 = it->strides[0][0], dk = it->strides[0][kd];
   const int64_t s0 = it->strides[1][0], sk = it->strides[1][kd];
   int odims[LM_MAX_DIMS], no = 0;
   int64_t outer = 1;
   for (int d = 1; d < it->ndim; d++)
      if (d != kd) {
         odims[no++] = d;
         outer *= it->shape[d];
      }
   const int64_t ntk = (nk + TB - 1) / TB;
   const int64_t tasks = outer * ntk;
   void (*tile)(char *, int64_t, const char *, int64_t, int64_t, int64_t) =
      es == 1 ? tile1 : es == 2 ? tile2 : es == 4 ? tile4 : tile8;
   int nt = lm_iter_threads(it->numel);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t task = 0; task < tasks; task++) {
      int64_t o = task / ntk, tk = task % ntk;
      uintptr_t dp = it->base[0], sp = it->base[1];
      int64_t r = o;
      for (int j = 0; j < no; j++) {
         int d = odims[j];
         int64_t i = r % it->shape[d];
         r /= it->shape[d];
         dp += (uintptr_t)(i * it->strides[0][d]);
         sp += (uintptr_t)(i * it->strides[1][d]);
      }
      int64_t k0 = tk * TB, k1 = k0 + TB < nk ? k0 + TB : nk;
      for (int64_t i0 = 0; i0 < n0; i0 += TB) {
         int64_t i1 = i0 + TB < n0 ? i0 + TB : n0;
         tile((char *)(dp + (uintptr_t)(i0 * d0 + k0 * dk)), dk,
              (const char *)(sp + (uintptr_t)(i0 * s0 + k0 * sk)), s0, i1 - i0, k1 - k0);
      }
   }
}

/* same-dtype copy where both sides are unit-stride in iteration dim 0 but its rows are short
   (fewer than 16 elements: a few channels of a channels-last tensor, such as the 3 of an RGB
   clip gathered tap by tap by conv3d, src/ops/conv3d.c): typed loops over dims 0 and 1 instead
   of the iterator's call per row. conv3d's stem gather (2 clips of 3x8x112x112 bfloat16, three
   depth taps into 9 channels) took 7.6 ms that way, 4 ns an element; 1.0 ms with these loops
   (LUMEN_VERBOSE's copy_ and fill_ lines, 2 threads) */
#define SHORT_ROWS_FN(NAME, T)                                                                  \
   static void NAME(char *d, int64_t d1, const char *s, int64_t s1, int64_t n0, int64_t n1) {   \
      for (int64_t i = 0; i < n1; i++) {                                                        \
         T *dd = (T *)(d + i * d1);                                                             \
         const T *ss = (const T *)(s + i * s1);                                                 \
         for (int64_t e = 0; e < n0; e++) dd[e] = ss[e];                                        \
      }                                                                                         \
   }
SHORT_ROWS_FN(rows1, uint8_t)
SHORT_ROWS_FN(rows2, uint16_t)
SHORT_ROWS_FN(rows4, uint32_t)
SHORT_ROWS_FN(rows8, uint64_t)

enum { SHORT_ROW = 16, ROWS_TASK = 512 };

/* the bases p[0 .. nops) of outer row r: the iterator's dims 2 .. ndim (dims 0 and 1 are the
   short rows and their run), for short_rows_copy and short_rows_fill */
static void outer_bases(const lm_iter *it, int64_t r, int nops, uintptr_t *p) {
   for (int k = 0; k < nops; k++) p[k] = it->base[k];
   for (int d = 2; d < it->ndim; d++) {
      const int64_t i = r % it->shape[d];
      r /= it->shape[d];
      for (int k = 0; k < nops; k++) p[k] += (uintptr_t)(i * it->strides[k][d]);
   }
}

static void short_rows_copy(const lm_iter *it, int es) {
   const int64_t n0 = it->shape[0], n1 = it->shape[1];
   const int64_t d1 = it->strides[0][1], s1 = it->strides[1][1];
   int64_t outer = 1;
   for (int d = 2; d < it->ndim; d++) outer *= it->shape[d];
   const int64_t nrt = (n1 + ROWS_TASK - 1) / ROWS_TASK, tasks = outer * nrt;
   void (*rows)(char *, int64_t, const char *, int64_t, int64_t, int64_t) =
      es == 1 ? rows1 : es == 2 ? rows2 : es == 4 ? rows4 : rows8;
   const int nt = lm_iter_threads(it->numel);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t task = 0; task < tasks; task++) {
      const int64_t i0 = task % nrt * ROWS_TASK, i1 = i0 + ROWS_TASK < n1 ? i0 + ROWS_TASK : n1;
      uintptr_t p[2];
      outer_bases(it, task / nrt, 2, p);
      rows((char *)(p[0] + (uintptr_t)(i0 * d1)), d1, (const char *)(p[1] + (uintptr_t)(i0 * s1)),
           s1, n0, i1 - i0);
   }
}

lm_status lm_cpu_copy_operands(const lm_operand *dst, const lm_operand *src) {
   LM_TRY(lm_copy_check_shape(dst->ndim, dst->sizes, src->ndim, src->sizes));
   if (lm_operand_numel(dst) == 0) return LM_OK;
   if (lm_operand_internal_overlap(dst)) return lm_overlap_error();
   lm_operand s = *src;
   lm_tensor *tmp = NULL;
   int ov = lm_operands_overlap(dst, src);
   if (ov == 1 && dst->dtype == src->dtype) return LM_OK;
   if (ov == 2) LM_TRY(materialize(&s, &tmp));
   lm_operand ops[2] = {*dst, s};
   lm_iter it;
   lm_iter_init(&it, 2, ops, dst->ndim, dst->sizes);
   int es = lm_dtype_size(dst->dtype);
   int kd = -1;
   if (dst->dtype == s.dtype && it.ndim >= 2 && it.strides[0][0] == es && it.strides[1][0] != es &&
       it.shape[0] >= 4) {
      for (int d = 1; d < it.ndim; d++)
         if (it.strides[1][d] == es && it.shape[d] >= 4) {
            kd = d;
            break;
         }
   }
   if (kd > 0) {
      transpose_copy(&it, kd, es);
   } else if (dst->dtype == s.dtype && it.ndim >= 2 && it.strides[0][0] == es &&
              it.strides[1][0] == es && it.shape[0] < SHORT_ROW && it.shape[1] >= 4 &&
              (es == 1 || es == 2 || es == 4 || es == 8)) {
      short_rows_copy(&it, es);
   } else {
      int dts[2] = {dst->dtype, s.dtype};
      lm_iter_run_grain(&it, copy_loop, dts, LM_CHEAP_GRAIN);
   }
   lm_tensor_free(tmp);
   return LM_OK;
}

static void fill_loop(void *ctx, char **data, const int64_t *st, int64_t n) {
   const lm_operand *v = ctx;
   lm_convert(v->dtype, data[0], st[0], v->dtype, v->data, 0, n);
}

/* ---------------------------------------------------------------- the kernels */

/* the compute loops of op kop of table in kind: the AVX-512 activations of ew_act_f32_avx512.c
   (implementation "ew_act_avx512") for float32 compute when lm_cpu_isa() has AVX-512 (a forced
   lower ISA is honoured, as the convolutions' epilogue does), those of ew_act_f32_avx2.c
   ("ew_act_avx2") at AVX2, else ew_kernels.c's */
static const lm_kset *kset_of(int table, int kop, int kind) {
   if (kind == LM_K_F32 && table != LM_EW_OTHER && lm_cpu_isa() >= LM_ISA_AVX512) {
      const lm_kset *v = lm_ew_act_avx512(table, kop);
      if (v && lm_impl_on(LM_IMPL_EW_ACT_AVX512)) {
         lm_impl_ran(LM_IMPL_EW_ACT_AVX512);
         return v;
      }
   }
   if (kind == LM_K_F32 && table != LM_EW_OTHER && lm_cpu_isa() == LM_ISA_AVX2) {
      const lm_kset *v = lm_ew_act_avx2(table, kop);
      if (v && lm_impl_on(LM_IMPL_EW_ACT_AVX2)) {
         lm_impl_ran(LM_IMPL_EW_ACT_AVX2);
         return v;
      }
   }
   return table == LM_EW_UNARY    ? &lm_unary_kernels[kop][kind]
          : table == LM_EW_BINARY ? &lm_binary_kernels[kop][kind]
                                  : &lm_other_kernels[kop][kind];
}

/* the plan of the loop from the front end's parameters */
static void plan_of(const lm_ew_params *pp, ew_plan *pl) {
   memset(pl, 0, sizeof *pl);
   pl->nin = pp->nin;
   for (int k = 0; k < 3; k++) {
      pl->in_dt[k] = pp->in_dt[k];
      pl->via[k] = pp->via[k];
   }
   pl->out_dt = pp->out_dt;
   pl->out_via = pp->out_via;
   pl->k = *kset_of(pp->table, pp->kop, pp->kind);
   pl->p = pp->p;
   pl->p.err = NULL;
   pl->cheap = pp->cheap;
   pl->epi = pp->epi >= 0 ? kset_of(LM_EW_UNARY, pp->epi, pp->kind)->vv : NULL;
   pl->epi_via = pl->epi ? pp->epi_via : -1;
   /* the bfloat16 direct loop (bf16_direct): a bfloat16 result computed in float32, from
      tensors (no number operand), with AVX-512 */
   pl->bfop = 0;
   if (pp->kind == LM_K_F32 && pp->out_via == LM_BFLOAT16 && pp->scalar_idx < 0 &&
       lm_cpu_isa() >= LM_ISA_AVX512 &&
       (pp->epi < 0 || (pp->epi == LM_RELU && pp->epi_via == LM_BFLOAT16))) {
      const int r = pp->epi == LM_RELU ? BF_ADD_RELU - BF_ADD : 0;
      if (pp->table == LM_EW_BINARY && pp->nin == 2) {
         if (pp->kop == LM_ADD) pl->bfop = BF_ADD + r;
         else if (pp->kop == LM_SUB) pl->bfop = BF_SUB + r;
         else if (pp->kop == LM_MUL) pl->bfop = BF_MUL + r;
      } else if (pp->table == LM_EW_UNARY && pp->nin == 1 && pp->kop == LM_RELU && pp->epi < 0) {
         pl->bfop = BF_RELU;
      }
   }
}

/* UNARY ... WHERE: t = {out, in0, in1, in2} (ops/elementwise.h) */
static lm_status k_ew(const lm_op *op) {
   const lm_ew_params *pp = op->params;
   lm_tensor *o = op->t[0];
   if (pp->small) {
      /* one call over the memory of each operand: they share sizes and strides, dense (float
         only, so no integer division flag) */
      const lm_kset *k = kset_of(pp->table, pp->kop, pp->kind);
      const lm_tensor *a = op->t[pp->variant == 2 ? 2 : 1];
      const char *ad = lm_tensor_data(a);
      const char *other = pp->nin < 2           ? NULL
                          : pp->variant == 0 ? (const char *)lm_tensor_data(op->t[2])
                                             : pp->scalar;
      lm_kfn fn = pp->variant == 0 ? k->vv : pp->variant == 1 ? k->vs : k->sv;
      const int other_first = pp->variant == 2;
      fn(lm_tensor_data(o), other_first ? other : ad, other_first ? ad : other, NULL, o->numel,
         &pp->p);
      return LM_OK;
   }
   ew_plan pl_, *pl = &pl_;
   plan_of(pp, pl);
   const int nin = pl->nin;
   _Alignas(16) char sbuf[16];
   memcpy(sbuf, pp->scalar, sizeof sbuf);
   const int nd = o->ndim;
   int64_t shape[LM_MAX_DIMS];
   for (int d = 0; d < nd; d++) shape[d] = o->sizes[d];
   lm_operand ops[4], *ins = &ops[1];
   lm_operand_tensor(&ops[0], o);
   for (int k = 0; k < nin; k++) {
      if (k == pp->scalar_idx) lm_operand_scalar(&ins[k], sbuf, pp->scalar_dtype, pp->scalar_wrapped);
      else lm_operand_tensor(&ins[k], op->t[k + 1]);
   }
   lm_tensor *tmps[3] = {NULL, NULL, NULL};
   lm_status status = LM_OK;
   if (!pp->created) {
      for (int k = 0; k < nin && status == LM_OK; k++)
         if (lm_operands_overlap(&ops[0], &ins[k]) == 2) status = materialize(&ins[k], &tmps[k]);
   }
   int err = 0;
   if (status == LM_OK) {
      lm_iter it;
      lm_iter_init(&it, nin + 1, ops, nd, shape);
      /* an input of the output's shape laid out in another order (NCHW + NHWC) would be read
         with a large stride in the inner loop: transpose it into the output's layout first
         (a blocked copy), then run a plain dense loop */
      int redo = 0;
      for (int k = 0; k < nin && status == LM_OK && o->numel >= 4096; k++) {
         int64_t es = lm_elsize(ops[k + 1].dtype), s0 = it.strides[k + 1][0];
         if (s0 == 0 || s0 == es || it.shape[0] < 4 || !same_shape(&ops[k + 1], &ops[0]) ||
             tmps[k])
            continue;
         int unit = 0;
         for (int d = 1; d < it.ndim; d++) unit |= it.strides[k + 1][d] == es && it.shape[d] >= 4;
         if (!unit) continue;
         status = lm_empty_strided(nd, shape, o->strides, ops[k + 1].dtype, LM_CPU, &tmps[k]);
         if (status != LM_OK) break;
         lm_operand t;
         lm_operand_tensor(&t, tmps[k]);
         status = lm_cpu_copy_operands(&t, &ops[k + 1]);
         t.wrapped = ops[k + 1].wrapped;
         ops[k + 1] = t;
         redo = 1;
      }
      if (redo && status == LM_OK) lm_iter_init(&it, nin + 1, ops, nd, shape);
      ew_ctx cx;
      cx.pl = pl;
      cx.stream = pp->created && want_stream(o, it.shape[0] * lm_elsize(o->dtype));
      cx.wide = cx.stream && lm_cpu_isa() >= LM_ISA_AVX512;
      for (int k = 0; k <= nin; k++) cx.dt[k] = ops[k].dtype;
      pl->p.err = &err;
      if (status == LM_OK)
         lm_iter_run_grain(&it, ew_loop, &cx, pl->cheap ? LM_CHEAP_GRAIN : LM_PARALLEL_GRAIN);
      if (status == LM_OK && cx.stream)
         lm_tensor_note_streamed(o);
   }
   for (int k = 0; k < 3; k++) lm_tensor_free(tmps[k]);
   if (status == LM_OK && err) status = lm_error(LM_ERR_ARG, "ZeroDivisionError");
   return status;
}

/* COPY: t = {dst, src} */
static lm_status k_copy(const lm_op *op) {
   lm_operand d, s;
   lm_operand_tensor(&d, op->t[0]);
   lm_operand_tensor(&s, op->t[1]);
   return lm_cpu_copy_operands(&d, &s);
}

/* a fill of short unit-stride rows (as short_rows_copy: conv3d's zero depth taps of a few
   channels): typed loops over dims 0 and 1 */
#define FILL_ROWS_FN(NAME, T)                                                                   \
   static void NAME(char *d, int64_t d1, const char *vp, int64_t n0, int64_t n1) {             \
      T v;                                                                                      \
      memcpy(&v, vp, sizeof v);                                                                 \
      for (int64_t i = 0; i < n1; i++) {                                                        \
         T *dd = (T *)(d + i * d1);                                                             \
         for (int64_t e = 0; e < n0; e++) dd[e] = v;                                            \
      }                                                                                         \
   }
FILL_ROWS_FN(fill_rows1, uint8_t)
FILL_ROWS_FN(fill_rows2, uint16_t)
FILL_ROWS_FN(fill_rows4, uint32_t)
FILL_ROWS_FN(fill_rows8, uint64_t)

static void short_rows_fill(const lm_iter *it, int es, const char *vp) {
   const int64_t n0 = it->shape[0], n1 = it->shape[1], d1 = it->strides[0][1];
   int64_t outer = 1;
   for (int d = 2; d < it->ndim; d++) outer *= it->shape[d];
   const int64_t nrt = (n1 + ROWS_TASK - 1) / ROWS_TASK, tasks = outer * nrt;
   void (*rows)(char *, int64_t, const char *, int64_t, int64_t) =
      es == 1 ? fill_rows1 : es == 2 ? fill_rows2 : es == 4 ? fill_rows4 : fill_rows8;
   const int nt = lm_iter_threads(it->numel);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t task = 0; task < tasks; task++) {
      const int64_t i0 = task % nrt * ROWS_TASK, i1 = i0 + ROWS_TASK < n1 ? i0 + ROWS_TASK : n1;
      uintptr_t dp;
      outer_bases(it, task / nrt, 1, &dp);
      rows((char *)(dp + (uintptr_t)(i0 * d1)), d1, vp, n0, i1 - i0);
   }
}

/* FILL: t = {self} */
static lm_status k_fill(const lm_op *op) {
   const lm_fill_params *p = op->params;
   lm_tensor *t = op->t[0];
   _Alignas(16) char vb[16];
   memcpy(vb, p->value, sizeof vb);
   lm_operand v, m;
   lm_operand_scalar(&v, vb, t->dtype, 0);
   lm_operand_tensor(&m, t);
   lm_iter it;
   lm_iter_init(&it, 1, &m, m.ndim, m.sizes);
   const int es = lm_dtype_size(t->dtype);
   if (lm_operand_internal_overlap(&m)) lm_iter_serial(&it, 0, it.numel, fill_loop, &v);
   else if (it.ndim >= 2 && it.strides[0][0] == es && it.shape[0] < SHORT_ROW &&
            it.shape[1] >= 4 && (es == 1 || es == 2 || es == 4 || es == 8))
      short_rows_fill(&it, es, vb);
   else lm_iter_run_grain(&it, fill_loop, &v, LM_CHEAP_GRAIN);
   return LM_OK;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_elementwise(lm_kernel_fn *table, int isa) {
   (void)isa; /* the compute loops pick their ISA themselves (LM_CLONES; the AVX-512 activations
                 and streaming ask lm_cpu_isa at each call) */
   table[LM_OP_UNARY] = k_ew;
   table[LM_OP_CLAMP] = k_ew;
   table[LM_OP_BINARY] = k_ew;
   table[LM_OP_BINARY_SCALAR] = k_ew;
   table[LM_OP_BINARY_UNARY] = k_ew;
   table[LM_OP_BINARY_SCALAR_UNARY] = k_ew;
   table[LM_OP_ADDCMUL] = k_ew;
   table[LM_OP_ADDCDIV] = k_ew;
   table[LM_OP_WHERE] = k_ew;
   table[LM_OP_COPY] = k_copy;
   table[LM_OP_FILL] = k_fill;
}
