/* random.h -- the parameters of the random fills (front ends: src/random.c; CPU kernels:
 * kernels/cpu/random.c).
 *   UNIFORM, NORMAL, RANDINT, BERNOULLI (lm_random_params): t = {self}, filled in place (any
 *     layout; the kernel refuses internal overlap). The kernel reserves numel counters from the
 *     generator (lm_rng_reserve), so running it is what consumes random numbers.
 *   RANDPERM (no params): t = {out}, 1-D int64; a permutation of 0 .. n-1, n counters reserved.
 */
#ifndef LUMEN_OPS_RANDOM_H
#define LUMEN_OPS_RANDOM_H
#include <stdint.h>
enum { LM_R_UNIFORM, LM_R_NORMAL, LM_R_RANDINT, LM_R_BERNOULLI };
typedef struct lm_random_params {
   int kind;          /* LM_R_* */
   double a, b;       /* uniform lo, hi / normal mean, std / bernoulli p */
   int64_t lo, range; /* randint */
} lm_random_params;

/* n counters from the global generator: returns the first offset, *seed its seed (src/random.c) */
uint64_t lm_rng_reserve(uint64_t n, uint64_t *seed);
#endif
