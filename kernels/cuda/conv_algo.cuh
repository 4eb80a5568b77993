/* conv_algo.cuh -- the cache of cuDNN convolution algorithms (conv.cu), one per device: the key
 * of one choice (op, dtype, format, the geometry of a batch chunk, the math type and the options
 * it was chosen under), its hash, and a small open-addressing table of those keys. Host code
 * only, without cuDNN, so that spec/cuda/conv_algo_test.cpp runs it on a machine without a GPU.
 * The caller holds the lock. */
#ifndef LUMEN_CONV_ALGO_CUH
#define LUMEN_CONV_ALGO_CUH
#include "ops/conv.h"
#include <stdint.h>
#include <string.h>

enum { CONV_ALGO_FWD = 0, CONV_ALGO_BWD_DATA = 1, CONV_ALGO_BWD_FILTER = 2 };

/* every field int64 so the struct has no padding: keys compare and hash as bytes */
typedef struct conv_algo_key {
   int64_t op, dtype, nhwc, math, deterministic, benchmark;
   int64_t N, C, H, W, O, kh, kw, sh, sw, ph, pw, dh, dw, G;
} conv_algo_key;

typedef struct conv_algo_entry {
   int algo;        /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t; -1: cuDNN has none */
   int math;        /* cudnnMathType_t to set on the descriptor */
   size_t ws_bytes; /* the workspace it needs */
} conv_algo_entry;

/* 1024 choices per device (a ResNet-50 has about 50 distinct convolution shapes per batch size);
   when full, the table is emptied and starts over */
enum { CONV_ALGO_SLOTS = 1024 };

typedef struct conv_algo_cache {
   int count;
   unsigned char used[CONV_ALGO_SLOTS];
   conv_algo_key key[CONV_ALGO_SLOTS];
   conv_algo_entry val[CONV_ALGO_SLOTS];
} conv_algo_cache;

static inline void conv_algo_key_make(conv_algo_key *k, int op, int dtype, int nhwc,
                                      const conv_geom *g, int64_t n, int math, int det, int bench) {
   memset(k, 0, sizeof *k);
   k->op = op;
   k->dtype = dtype;
   k->nhwc = nhwc;
   k->math = math;
   k->deterministic = det;
   k->benchmark = bench;
   k->N = n;
   k->C = g->C;
   k->H = g->H;
   k->W = g->W;
   k->O = g->O;
   k->kh = g->kh;
   k->kw = g->kw;
   k->sh = g->sh;
   k->sw = g->sw;
   k->ph = g->ph;
   k->pw = g->pw;
   k->dh = g->dh;
   k->dw = g->dw;
   k->G = g->G;
}

/* FNV-1a over the key's bytes, then a final mix (splitmix64's) so nearby shapes spread */
static inline uint64_t conv_algo_hash(const conv_algo_key *k) {
   const unsigned char *b = (const unsigned char *)k;
   uint64_t h = 1469598103934665603ull;
   for (size_t i = 0; i < sizeof *k; i++) {
      h ^= b[i];
      h *= 1099511628211ull;
   }
   h ^= h >> 30;
   h *= 0xbf58476d1ce4e5b9ull;
   h ^= h >> 27;
   h *= 0x94d049bb133111ebull;
   h ^= h >> 31;
   return h;
}

/* 1 and *out when key is cached, else 0 */
static inline int conv_algo_lookup(const conv_algo_cache *c, const conv_algo_key *key,
                                   conv_algo_entry *out) {
   size_t i = (size_t)(conv_algo_hash(key) % CONV_ALGO_SLOTS);
   for (int probe = 0; probe < CONV_ALGO_SLOTS && c->used[i]; probe++) {
      if (memcmp(&c->key[i], key, sizeof *key) == 0) {
         *out = c->val[i];
         return 1;
      }
      i = (i + 1) % CONV_ALGO_SLOTS;
   }
   return 0;
}

/* add (or replace) key's choice; a table three-quarters full is emptied first (linear probing
   degrades past that, and a fresh choice costs one more heuristic query) */
static inline void conv_algo_insert(conv_algo_cache *c, const conv_algo_key *key,
                                    const conv_algo_entry *val) {
   if (c->count >= CONV_ALGO_SLOTS * 3 / 4) {
      memset(c->used, 0, sizeof c->used);
      c->count = 0;
   }
   size_t i = (size_t)(conv_algo_hash(key) % CONV_ALGO_SLOTS);
   while (c->used[i] && memcmp(&c->key[i], key, sizeof *key) != 0) i = (i + 1) % CONV_ALGO_SLOTS;
   if (!c->used[i]) c->count++;
   c->used[i] = 1;
   c->key[i] = *key;
   c->val[i] = *val;
}

#endif
