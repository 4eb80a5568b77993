/* conv_pack_f32_avx512.c -- the packed weight layout of the float32 NHWC AVX-512 direct,
 * pointwise and narrow-input kernels (conv_f32_avx512.h): weights packed once per call (16 x 16
 * register transposes) into blocks of OB (<= 64) output channels,
 *   wp[g][ob][tap][ci][OB]   (tap = i*kw + j, ci = input channel within the group)
 * so that for one tap the weights of consecutive input channels are consecutive rows of OB floats;
 * backward data packs the flipped kernel with input and output channels swapped.
 */
#include "conv_f32_avx512.h"

/* forward packing: w (O, taps, Cg) row-major -> wp[g][ob][tap][ci][OB], zero padded. The 16
   rows of a transpose are K floats apart: each is asked for PACK_PF lines ahead, since in a model
   every layer's weights come cold from memory and the hardware prefetchers did not follow 16
   streams; 8 lines ahead was never slower than 4 or none
   (numbers: docs/performance.md, "Measurements behind kernel choices") */
enum { PACK_PF = 8 };
void lm_conv_f32_pack_fwd(const conv_geom *g, const float *w, int64_t OB, int64_t nob,
                          float *wp, int nthr) {
   const int64_t Og = g->Og, K = g->K;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t gi = 0; gi < g->G; gi++) {
      for (int64_t ob = 0; ob < nob; ob++) {
         float *dst = wp + (gi * nob + ob) * K * OB;
         const float *src = w + (gi * Og + ob * OB) * K;
         const int64_t nvalid = Og - ob * OB < OB ? Og - ob * OB : OB;
         for (int64_t v0 = 0; v0 < OB; v0 += 16) {
            int64_t k0 = 0;
            if (v0 + 16 <= nvalid)
               for (; k0 + 16 <= K; k0 += 16) {
                  if (k0 + 16 * PACK_PF < K)
                     for (int r = 0; r < 16; r++)
                        _mm_prefetch((const char *)(src + (v0 + r) * K + k0 + 16 * PACK_PF),
                                     _MM_HINT_T0);
                  transpose16_mem(src + v0 * K + k0, K, dst + k0 * OB + v0, OB);
               }
            for (int64_t k = k0; k < K; k++)
               for (int64_t v = v0; v < v0 + 16; v++)
                  dst[k * OB + v] = v < nvalid ? src[v * K + k] : 0.0f;
         }
      }
   }
}

/* backward-data packing: the flipped kernel with in/out swapped,
   wp[g][cb][tap'][o][OB] = w[g*Og + o][flip(tap')][cb*OB + v] */
void lm_conv_f32_pack_bwd(const conv_geom *g, const float *w, int64_t OB, int64_t ncb,
                          float *wp, int nthr) {
   const int64_t taps = g->kh * g->kw, Cg = g->Cg, Og = g->Og, K = g->K;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
   for (int64_t gi = 0; gi < g->G; gi++) {
      for (int64_t cb = 0; cb < ncb; cb++) {
         const int64_t nvalid = Cg - cb * OB < OB ? Cg - cb * OB : OB;
         for (int64_t t = 0; t < taps; t++) {
            const int64_t i = t / g->kw, j = t % g->kw;
            const int64_t tf = (g->kh - 1 - i) * g->kw + (g->kw - 1 - j);
            for (int64_t o = 0; o < Og; o++) {
               float *dst = wp + (((gi * ncb + cb) * taps + t) * Og + o) * OB;
               const float *src = w + (gi * Og + o) * K + tf * Cg + cb * OB;
               int64_t v = 0;
               for (; v < nvalid; v++) dst[v] = src[v];
               for (; v < OB; v++) dst[v] = 0.0f;
            }
         }
      }
   }
}
