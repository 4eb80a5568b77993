// conv_algo_test.cpp -- host test of the cuDNN algorithm cache's key, hash and table
// (kernels/cuda/conv_algo.cuh, used by kernels/cuda/conv.cu); no GPU, no cuDNN needed.
//
//   g++ -std=c++17 -O1 -Wall -Wextra -Werror -Isrc -Ikernels/cuda -o /tmp/conv_algo_test
//       spec/cuda/conv_algo_test.cpp && /tmp/conv_algo_test      (one line)
//
// (run from the repository root; prints "conv_algo_test: N checks passed" and exits 0)
#include "conv_algo.cuh"
#include <stdio.h>
#include <stdlib.h>

static int checks = 0, failed = 0;
#define CHECK(c)                                                                                  \
   do {                                                                                          \
      checks++;                                                                                  \
      if (!(c)) {                                                                                \
         failed++;                                                                               \
         fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                   \
      }                                                                                          \
   } while (0)

static conv_geom geom(int64_t seed) {
   conv_geom g;
   memset(&g, 0, sizeof g);
   g.N = 1 + seed % 7;
   g.C = 3 + seed % 13;
   g.H = 5 + seed % 11;
   g.W = 4 + seed % 9;
   g.O = 8 + seed % 5;
   g.kh = 1 + seed % 3;
   g.kw = 1 + seed / 3 % 3;
   g.sh = 1 + seed % 2;
   g.sw = 1 + seed / 2 % 2;
   g.ph = seed % 2;
   g.pw = seed / 5 % 2;
   g.dh = 1 + seed / 7 % 2;
   g.dw = 1;
   g.G = 1 + seed / 11 % 2;
   g.Cg = g.C / g.G;
   g.Og = g.O / g.G;
   g.K = g.Cg * g.kh * g.kw;
   return g;
}

int main(void) {
   // the key has no padding: its bytes are exactly its fields
   CHECK(sizeof(conv_algo_key) == 20 * sizeof(int64_t));

   conv_algo_key a, b;
   const conv_geom g = geom(5);
   conv_algo_key_make(&a, CONV_ALGO_FWD, 0, 1, &g, 4, 3, 0, 0);
   conv_algo_key_make(&b, CONV_ALGO_FWD, 0, 1, &g, 4, 3, 0, 0);
   CHECK(memcmp(&a, &b, sizeof a) == 0);
   CHECK(conv_algo_hash(&a) == conv_algo_hash(&b));

   // every field changes the key and (practically always) the hash
   for (size_t f = 0; f < sizeof a / sizeof(int64_t); f++) {
      b = a;
      ((int64_t *)&b)[f] += 1;
      CHECK(memcmp(&a, &b, sizeof a) != 0);
      CHECK(conv_algo_hash(&a) != conv_algo_hash(&b));
   }
   // the chunk size, the op and the format are part of the key
   conv_algo_key_make(&b, CONV_ALGO_FWD, 0, 1, &g, 5, 3, 0, 0);
   CHECK(memcmp(&a, &b, sizeof a) != 0);
   conv_algo_key_make(&b, CONV_ALGO_BWD_DATA, 0, 1, &g, 4, 3, 0, 0);
   CHECK(memcmp(&a, &b, sizeof a) != 0);
   conv_algo_key_make(&b, CONV_ALGO_FWD, 0, 0, &g, 4, 3, 0, 0);
   CHECK(memcmp(&a, &b, sizeof a) != 0);

   // the table: insert, look up, replace, and the reset when three-quarters full
   static conv_algo_cache c; // zeroed
   conv_algo_entry e, got;
   const int n = CONV_ALGO_SLOTS * 3 / 4 - 1; // stays below the reset
   for (int i = 0; i < n; i++) {
      const conv_geom gi = geom(i);
      conv_algo_key k;
      conv_algo_key_make(&k, i % 3, i % 4, i % 2, &gi, 1 + i, i % 5, i % 2, 0);
      e.algo = i;
      e.math = i % 5;
      e.ws_bytes = (size_t)i * 1000;
      conv_algo_insert(&c, &k, &e);
   }
   CHECK(c.count == n);
   int found = 0;
   for (int i = 0; i < n; i++) {
      const conv_geom gi = geom(i);
      conv_algo_key k;
      conv_algo_key_make(&k, i % 3, i % 4, i % 2, &gi, 1 + i, i % 5, i % 2, 0);
      if (conv_algo_lookup(&c, &k, &got) && got.algo == i && got.math == i % 5 &&
          got.ws_bytes == (size_t)i * 1000)
         found++;
   }
   CHECK(found == n);
   // an absent key
   conv_algo_key_make(&b, CONV_ALGO_FWD, 0, 1, &g, 100000, 3, 0, 1);
   CHECK(!conv_algo_lookup(&c, &b, &got));
   // replacing keeps the count
   {
      const conv_geom g0 = geom(0);
      conv_algo_key k;
      conv_algo_key_make(&k, 0, 0, 0, &g0, 1, 0, 0, 0);
      e.algo = 77;
      conv_algo_insert(&c, &k, &e);
      CHECK(c.count == n);
      CHECK(conv_algo_lookup(&c, &k, &got) && got.algo == 77);
   }
   // two more: the second insert finds the table full, empties it, and holds only itself
   conv_algo_key_make(&b, CONV_ALGO_FWD, 1, 1, &g, 999999, 0, 0, 0);
   e.algo = 5;
   conv_algo_insert(&c, &b, &e);
   CHECK(c.count == n + 1);
   conv_algo_key_make(&a, CONV_ALGO_FWD, 1, 1, &g, 999998, 0, 0, 0);
   e.algo = 6;
   conv_algo_insert(&c, &a, &e);
   CHECK(c.count == 1);
   CHECK(conv_algo_lookup(&c, &a, &got) && got.algo == 6);
   CHECK(!conv_algo_lookup(&c, &b, &got));

   if (failed) {
      fprintf(stderr, "conv_algo_test: %d of %d checks failed\n", failed, checks);
      return 1;
   }
   printf("conv_algo_test: %d checks passed\n", checks);
   return 0;
}
