/* random.c -- the CPU kernels of the random fills (front ends: src/random.c; parameters:
 * src/ops/random.h): counter-based random numbers (Philox 4x32-10).
 *
 * Each kernel reserves its counters from the global state (lm_rng_reserve) itself, so a device
 * that runs these kernels (sim) consumes the generator exactly as the CPU does and fills the
 * same values; the meta device, which computes nothing, does not consume it. Element i of the
 * tensor in LOGICAL (row-major) order gets counter offset + i, so results depend neither on the
 * thread count nor on the memory format. */
#include "cpu.h"
#include "iter.h"
#include "ops/random.h"
#include <math.h>
#include <stdlib.h>

/* Philox 4x32 with 10 rounds on counter (c, 0) and key = seed */
static inline void philox(uint64_t seed, uint64_t c, uint32_t out[4]) {
   uint32_t x0 = (uint32_t)c, x1 = (uint32_t)(c >> 32), x2 = 0, x3 = 0;
   uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
   for (int r = 0; r < 10; r++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * x0, p1 = (uint64_t)0xCD9E8D57u * x2;
      uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0, y1 = (uint32_t)p1;
      uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1, y3 = (uint32_t)p0;
      x0 = y0;
      x1 = y1;
      x2 = y2;
      x3 = y3;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
   }
   out[0] = x0;
   out[1] = x1;
   out[2] = x2;
   out[3] = x3;
}

/* the same for m counters at once (structure of arrays, so the rounds vectorize) */
static LM_CLONES void philox_block(uint64_t seed, const uint64_t *ctr, int64_t m, uint32_t *w0,
                                   uint32_t *w1, uint32_t *w2, uint32_t *w3) {
   for (int64_t i = 0; i < m; i++) {
      w0[i] = (uint32_t)ctr[i];
      w1[i] = (uint32_t)(ctr[i] >> 32);
      w2[i] = 0;
      w3[i] = 0;
   }
   uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
   for (int r = 0; r < 10; r++) {
      for (int64_t i = 0; i < m; i++) {
         uint64_t p0 = (uint64_t)0xD2511F53u * w0[i], p1 = (uint64_t)0xCD9E8D57u * w2[i];
         uint32_t y0 = (uint32_t)(p1 >> 32) ^ w1[i] ^ k0, y1 = (uint32_t)p1;
         uint32_t y2 = (uint32_t)(p0 >> 32) ^ w3[i] ^ k1, y3 = (uint32_t)p0;
         w0[i] = y0;
         w1[i] = y1;
         w2[i] = y2;
         w3[i] = y3;
      }
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
   }
}

/* uniform in [0, 1) with 53 bits, from two words */
static inline double u53(uint32_t a, uint32_t b) {
   uint64_t v = ((uint64_t)a << 21) ^ (uint64_t)(b >> 11);
   return (double)(v & ((1ULL << 53) - 1)) * (1.0 / 9007199254740992.0);
}
/* uniform in [0, 1) with 24 bits */
static inline float u24(uint32_t a) { return (float)(a >> 8) * (1.0f / 16777216.0f); }

typedef struct rng_ctx {
   int kind, dtype;
   uint64_t seed, offset;
   double a, b;       /* uniform lo, hi / normal mean, std / bernoulli p */
   int64_t lo, range; /* randint */
} rng_ctx;

/* Element i (logical index) uses counter offset + i; normal_ draws pairs: elements 2j and 2j+1
   share counter offset + 2j (Box-Muller's cosine and sine halves). */
static void rng_loop(void *ctx_, char **data, const int64_t *st, int64_t n) {
   const rng_ctx *c = ctx_;
   _Alignas(64) char buf[LM_CHUNK * 8];
   _Alignas(64) uint64_t ctr[LM_CHUNK];
   _Alignas(64) uint32_t w0[LM_CHUNK], w1[LM_CHUNK], w2[LM_CHUNK], w3[LM_CHUNK];
   const int fast_float = c->dtype != LM_FLOAT64;
   for (int64_t j = 0; j < n; j += LM_CHUNK) {
      int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
      int64_t li = (int64_t)(uintptr_t)data[1] + j * st[1];
      const int64_t ls = st[1];
      int bdt;
      if (c->kind == LM_R_NORMAL) {
         for (int64_t i = 0; i < m; i++) ctr[i] = c->offset + (uint64_t)((li + i * ls) & ~(int64_t)1);
      } else {
         for (int64_t i = 0; i < m; i++) ctr[i] = c->offset + (uint64_t)(li + i * ls);
      }
      philox_block(c->seed, ctr, m, w0, w1, w2, w3);
      if (c->kind == LM_R_UNIFORM && fast_float) {
         float *f = (float *)buf, lo = (float)c->a, span = (float)c->b - (float)c->a;
         for (int64_t i = 0; i < m; i++) f[i] = u24(w0[i]) * span + lo;
         bdt = LM_FLOAT32;
      } else if (c->kind == LM_R_RANDINT) {
         int64_t *v = (int64_t *)buf;
         for (int64_t i = 0; i < m; i++) {
            uint64_t r = (((uint64_t)w0[i] << 32) | w1[i]) % (uint64_t)c->range;
            v[i] = (int64_t)((uint64_t)c->lo + r);
         }
         bdt = LM_INT64;
      } else if (c->kind == LM_R_NORMAL && fast_float) {
         float *f = (float *)buf, mean = (float)c->a, sd = (float)c->b;
         for (int64_t i = 0; i < m; i++) {
            int odd = (int)((li + i * ls) & 1);
            float u1 = 1.0f - u24(w0[i]), u2 = u24(w2[i]);
            float r = sqrtf(-2.0f * logf(u1)), sn, cs;
            sincosf(6.2831853071795865f * u2, &sn, &cs);
            f[i] = mean + sd * r * (odd ? sn : cs);
         }
         bdt = LM_FLOAT32;
      } else {
         double *v = (double *)buf;
         for (int64_t i = 0; i < m; i++) {
            if (c->kind == LM_R_UNIFORM) {
               v[i] = u53(w0[i], w1[i]) * (c->b - c->a) + c->a;
            } else if (c->kind == LM_R_NORMAL) {
               int odd = (int)((li + i * ls) & 1);
               double u1 = 1.0 - u53(w0[i], w1[i]), u2 = u53(w2[i], w3[i]);
               double r = sqrt(-2.0 * log(u1)), sn, cs;
               sincos(6.283185307179586 * u2, &sn, &cs);
               v[i] = c->a + c->b * r * (odd ? sn : cs);
            } else {
               v[i] = u53(w0[i], w1[i]) < c->a ? 1.0 : 0.0;
            }
         }
         bdt = LM_FLOAT64;
      }
      lm_convert(c->dtype, data[0] + j * st[0], st[0], bdt, buf, lm_dtype_size(bdt), m);
   }
}

/* UNIFORM, NORMAL, RANDINT, BERNOULLI: t = {self} (ops/random.h) */
static lm_status k_random(const lm_op *op) {
   const lm_random_params *q = op->params;
   lm_tensor *t = op->t[0];
   rng_ctx c_ = {q->kind, 0, 0, 0, q->a, q->b, q->lo, q->range}, *c = &c_;
   c->dtype = t->dtype;
   int64_t n = t->numel;
   c->offset = lm_rng_reserve((uint64_t)n, &c->seed);
   if (n == 0) return LM_OK;
   lm_operand self;
   lm_operand_tensor(&self, t);
   if (lm_operand_internal_overlap(&self))
      return lm_error(LM_ERR_ARG,
                      "unsupported operation: more than one element of the written-to tensor "
                      "refers to a single memory location. Please clone() the tensor before "
                      "performing the operation.");
   int64_t li[LM_MAX_DIMS];
   lm_compute_strides(t->ndim, t->sizes, LM_CONTIGUOUS, li);
   lm_operand ops[2];
   ops[0] = self;
   lm_operand_set(&ops[1], NULL, LM_DT_INDEX, t->ndim, t->sizes, li);
   lm_iter it;
   lm_iter_init(&it, 2, ops, t->ndim, t->sizes);
   lm_iter_run(&it, rng_loop, c);
   return LM_OK;
}

/* RANDPERM: t = {out}, 1-D int64 of n elements: a Fisher-Yates shuffle on the host */
static lm_status k_randperm(const lm_op *op) {
   lm_tensor *o = op->t[0];
   int64_t n = o->sizes[0];
   int64_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
   if (!v) return lm_error(LM_ERR_OOM, "out of memory");
   uint64_t seed, off = lm_rng_reserve((uint64_t)n, &seed);
   for (int64_t i = 0; i < n; i++) v[i] = i;
   for (int64_t i = n - 1; i > 0; i--) {
      uint32_t w[4];
      philox(seed, off + (uint64_t)i, w);
      int64_t j = (int64_t)((((uint64_t)w[0] << 32) | w[1]) % (uint64_t)(i + 1));
      int64_t tmp = v[i];
      v[i] = v[j];
      v[j] = tmp;
   }
   lm_operand dst, src;
   int64_t one = 1;
   lm_operand_tensor(&dst, o);
   lm_operand_set(&src, v, LM_INT64, 1, &n, &one);
   lm_status st = lm_copy_operands(&dst, &src);
   free(v);
   return st;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_random(lm_kernel_fn *table, int isa) {
   (void)isa; /* philox_block is LM_CLONES: picked at load time */
   table[LM_OP_UNIFORM] = k_random;
   table[LM_OP_NORMAL] = k_random;
   table[LM_OP_RANDINT] = k_random;
   table[LM_OP_BERNOULLI] = k_random;
   table[LM_OP_RANDPERM] = k_randperm;
}
