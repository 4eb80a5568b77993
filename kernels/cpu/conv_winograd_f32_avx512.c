/* conv_winograd_f32_avx512.c -- Winograd convolution, float32, NHWC, AVX-512 (stride 1, dilation 1,
 * groups 1, 3x3, padding 0..2): forward, backward data, backward weight. Reduction channels:
 * 11..16, 22..32 and 44..64, padded to 16, 32 or 64; forward and backward data also more than
 * 64, padded to a multiple of 64 (at most a quarter padding) and reduced in chunks of 64 (wg_cp):
 * with F(4x4) by the wide schedule (wg_run_wide), whose threads split the output channels
 * instead of the tiles; with F(2x2) (LUMEN_CONV_WINOGRAD=2) 96..128 with at most 128 output
 * channels by the unit schedule below (wg_run; WG_WIDE_MAX_CIN, WG_WIDE_U).
 * 128 channels took the unit schedule with F(4x4) too until session 16, when the wide one
 * measured faster on the AMD Zen 5 machine, in float32 and bfloat16, at batch 8 and 1 (numbers:
 * docs/performance.md, "Measurements behind kernel choices").
 *
 * Each m x m block of output pixels ("tile") is computed from the (m+2) x (m+2) input patch
 * around it:
 *    Y = A^T [ sum_ci (B^T d_ci B) .* (G g_ci,co G^T) ] A
 * i.e. (m+2)^2 independent products of (tiles x Cin) by (Cin x Cout) instead of 9 taps x m^2
 * pixels. F(4x4,3x3) (m = 4, 36 products) does 4x fewer multiply-adds than the direct sum,
 * F(2x2,3x3) (m = 2, 16 products) 2.25x fewer, each for the price of the transforms
 * (O(Cin + Cout) per tile).
 * Accuracy (float32, random data, 64 channels, outputs of magnitude ~50): the direct sum's error
 * is ~2.7e-5, F(2x2)'s ~1.4e-5 (short sums), F(4x4)'s ~6e-5 with the points used here (1.3e-4
 * with the usual ones): ~1e-6 of the sum of the terms' magnitudes, which the specs check at
 * 1e-4 (they pass at 1e-5). Every pass takes F(4x4); LUMEN_CONV_WINOGRAD=2 selects F(2x2) for
 * forward and backward data (more accurate than the direct sum, ~1.5x slower than F(4x4)).
 * After a train-mode forward through resnet50, channels-last running statistics differ from the
 * NCHW ones by 1.4e-4 with F(4x4), 9e-5 with F(2x2) or the direct kernels (models_spec: 1e-3).
 *
 * A work unit is a run of T consecutive tiles (image after image, so 7x7 maps still make full
 * units), T sized so that the transformed input V[E][T][CP] and the products M[E][T][CoutP]
 * stay in L2:
 *   1. input transform: each tile's patch (zeros outside the image) -> V, 16 channels a vector,
 *      separable (columns then rows); the patch of the tile WG_PF ahead is prefetched;
 *   2. E GEMMs M[e] = V[e] * U[e], by the register-blocked micro-kernels of
 *      conv_direct_rb_f32_avx512.c (tiles broadcast, output channels in vectors), U[e] in L1;
 *   3. output transform of each tile with the epilogue (bias, residual, activation), masked at the
 *      image's right and bottom edges.
 * Weights are transformed once per call (U = G g G^T, 16 output channels a vector).
 *
 * The wide schedule (wg_run_wide, F(4x4) only): with 256 or 512 channels the transformed weights
 * (9.4 / 37.7 MB) fall out of the cache when every unit reads them all (that took 37-43 ms a run
 * for resnet50's 3x3 256->256 at 14x14 against 26-30 direct, 72 ms against 11-14 at 512, 7x7).
 * So the input transform of a whole group of tiles goes to a shared V first (threads split the
 * tiles), then each thread takes output blocks of 64 channels: per chunk of 64 reduction
 * channels it transforms that block's weights into U[36][64][64] (590 KB, in L2; read from w
 * through in-register 16 x 16 transposes) and adds the chunk's 36 products to M[36][tiles][64]
 * (wga_*), then transforms the block's outputs with the epilogue. Every weight is read and
 * transformed once per group (one group at batch 8), V once per block: about twice the direct
 * kernel's speed on resnet50's 256- and 512-channel layers. Tried and slower: all of a block's
 * weights (4.7 MB at 512) at once, gathering the weights instead of transposing (the weight
 * transform then took as long as the GEMMs), and the wide schedule for 128->128 at 28x28 (its
 * two blocks a group are one per thread). Numbers: docs/performance.md, "Measurements behind
 * kernel choices".
 * Backward data is the forward algorithm on grad_output with the kernel flipped and its input and
 * output channels swapped, padding 2 - p. Backward weight: see wg_bwdw, and wg_bwdw_wide for more
 * than 64 input channels (threads split (output block, input chunk) pairs of dU instead of the
 * tiles; 1.6-2x the direct kernel on resnet50's layers, numbers: docs/performance.md, "Measurements
 * behind kernel choices").
 *
 * bfloat16 (conv.c's bf16_winograd, lm.backends.cpu.bf16_winograd; F(4x4) with 64 or more
 * reduction channels, either schedule, and the weight gradient): the same transforms in float32,
 * reading the bfloat16 tensors widened (every input patch gathered) and rounding the output once
 * in the epilogue; the products take V, U and D rounded to bfloat16
 * (conv_winograd_bf16_avx512bf16.c: pairs of channels for forward and backward data, pairs of
 * tiles for the weight gradient).
 * About ten times the direct bfloat16 kernels' error (1.6e-2 relative against 1.7e-3), 1.3-2x
 * their speed on resnet50's layers (docs/mixed_precision.md).
 *
 * Forward and backward data: every output element is reduced by one thread in a fixed order.
 * Backward weight: per-thread partials over a fixed split, summed in thread order.
 */
#include "conv_internal.h"
#include "act_avx512.h"
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { WG_E = 36, WG_L2_BYTES = 320 * 1024, WG_MAXT = 96, WG_PF = 2 };
/* More than 64 reduction channels (wg_cp: up to 64 x LM_RB_MAXCHUNKS, padded to a multiple of
   64) take the wide schedule (wg_run_wide) with F(4x4): V of a group of tiles within WG_WIDE_V,
   each thread's products M[e][k][OB] within WG_WIDE_M (resnet50's batch-8 layers make one group:
   128 tiles at 256 channels, 32 at 512), and at least WG_WIDE_MIN_TILES tiles (one tile does 36
   products per weight against the direct sum's 144 at most, for the price of transforming it).
   F(2x2) (LUMEN_CONV_WINOGRAD=2) keeps the unit schedule of wg_run, where every unit reads all the
   transformed weights: at most WG_WIDE_MAX_CIN channels and WG_WIDE_U bytes of weights, its V and
   M within WG_WIDE_BYTES per thread and WG_WIDE_ALL together. */
#define WG_WIDE_V ((int64_t)8 << 20)
#define WG_WIDE_M ((int64_t)1280 << 10)
#define WG_WIDE_MIN_TILES 4
#define WG_WIDE_W ((int64_t)16 << 20)
#define WG_WIDE_MAX_CIN 128
#define WG_WIDE_U ((int64_t)5 << 19)
#define WG_WIDE_BYTES ((int64_t)8 << 20)
#define WG_WIDE_ALL ((int64_t)64 << 20)
_Static_assert(WG_WIDE_MAX_CIN <= 64 * LM_RB_MAXCHUNKS, "lm_conv_rb_gemm_chunks takes the chunks");

/* ---------------------------------------------------------------------------------------------
 * 1-D transforms on vectors
 */
/* The interpolation points are 0, 1, -1, 1/2, -2 and infinity rather than the usual
 * 0, +-1, +-2: in float32 that halves the error of the result (measured on random data, 64
 * channels: 6e-5 against 1.3e-4 for outputs of magnitude 50; the direct sum's is 2.7e-5), for a few
 * more operations in the transforms. With row 3 of B^T scaled by 1/16 (exact):
 *    B^T = [ 2 -3 -4  3  2  0 ]    G = [ 1/2    0     0   ]    A^T = [ 1  1  1  1    1  0 ]
 *          [ 0 -2  1  5  2  0 ]        [ 1/6   1/6   1/6  ]          [ 0  1 -1  1/2 -2  0 ]
 *          [ 0 -2  5 -1 -2  0 ]        [ 1/6  -1/6   1/6  ]          [ 0  1  1  1/4  4  0 ]
 *          [ 0  2  1 -2 -1  0 ]        [ 16/15 8/15  4/15 ]          [ 0  1 -1  1/8 -8  1 ]
 *          [ 0  1 -2 -1  2  0 ]        [ 1/30 -1/15  2/15 ]
 *          [ 0  2 -3 -4  3  2 ]        [ 0     0     1/2  ]
 */
#define WG_C(x) _mm512_set1_ps((float)(x))

/* B^T d for a 6-vector d */
static inline void wg_bt(const __m512 *d, __m512 *t) {
   const __m512 u = _mm512_sub_ps(d[1], d[3]), v = _mm512_sub_ps(d[2], d[4]);
   t[0] = _mm512_fmadd_ps(WG_C(2), _mm512_add_ps(d[0], d[4]),
                          _mm512_fmadd_ps(WG_C(-3), u, _mm512_mul_ps(WG_C(-4), d[2])));
   t[1] = _mm512_fmadd_ps(WG_C(2), _mm512_sub_ps(d[4], d[1]), _mm512_fmadd_ps(WG_C(5), d[3], d[2]));
   t[2] = _mm512_fmadd_ps(WG_C(-2), _mm512_add_ps(d[1], d[4]), _mm512_fmsub_ps(WG_C(5), d[2], d[3]));
   t[3] = _mm512_fmadd_ps(WG_C(2), u, v);
   t[4] = _mm512_fmadd_ps(WG_C(-2), v, u);
   t[5] = _mm512_fmadd_ps(WG_C(2), _mm512_add_ps(d[1], d[5]),
                          _mm512_fmadd_ps(WG_C(-3), v, _mm512_mul_ps(WG_C(-4), d[3])));
}

/* A^T m for a 6-vector m (4 results) */
static inline void wg_at(const __m512 *m, __m512 *y) {
   const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
   y[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), _mm512_add_ps(m[3], m[4]));
   y[1] = _mm512_fmadd_ps(WG_C(0.5), m[3], _mm512_fmadd_ps(WG_C(-2), m[4], d12));
   y[2] = _mm512_fmadd_ps(WG_C(0.25), m[3], _mm512_fmadd_ps(WG_C(4), m[4], s12));
   y[3] = _mm512_add_ps(_mm512_fmadd_ps(WG_C(0.125), m[3], _mm512_fmadd_ps(WG_C(-8), m[4], d12)),
                        m[5]);
}

/* G g for a 3-vector g (6 results) */
static inline void wg_g(const __m512 *g, __m512 *u) {
   const __m512 s02 = _mm512_add_ps(g[0], g[2]);
   u[0] = _mm512_mul_ps(WG_C(0.5), g[0]);
   u[1] = _mm512_mul_ps(WG_C(1.0 / 6.0), _mm512_add_ps(s02, g[1]));
   u[2] = _mm512_mul_ps(WG_C(1.0 / 6.0), _mm512_sub_ps(s02, g[1]));
   u[3] = _mm512_fmadd_ps(WG_C(16.0 / 15.0), g[0],
                          _mm512_fmadd_ps(WG_C(8.0 / 15.0), g[1], _mm512_mul_ps(WG_C(4.0 / 15.0), g[2])));
   u[4] = _mm512_fmadd_ps(WG_C(1.0 / 30.0), g[0],
                          _mm512_fmadd_ps(WG_C(-1.0 / 15.0), g[1], _mm512_mul_ps(WG_C(2.0 / 15.0), g[2])));
   u[5] = _mm512_mul_ps(WG_C(0.5), g[2]);
}

/* F(2x2, 3x3): points 0, 1, -1 and infinity
 *    B^T = [ 1  0 -1  0 ]    G = [ 1    0    0   ]    A^T = [ 1  1  1  0 ]
 *          [ 0  1  1  0 ]        [ 1/2  1/2  1/2 ]          [ 0  1 -1 -1 ]
 *          [ 0 -1  1  0 ]        [ 1/2 -1/2  1/2 ]
 *          [ 0  1  0 -1 ]        [ 0    0    1   ]
 */
static inline void wg_bt2(const __m512 *d, __m512 *t) {
   t[0] = _mm512_sub_ps(d[0], d[2]);
   t[1] = _mm512_add_ps(d[1], d[2]);
   t[2] = _mm512_sub_ps(d[2], d[1]);
   t[3] = _mm512_sub_ps(d[1], d[3]);
}

static inline void wg_at2(const __m512 *m, __m512 *y) {
   y[0] = _mm512_add_ps(_mm512_add_ps(m[0], m[1]), m[2]);
   y[1] = _mm512_sub_ps(_mm512_sub_ps(m[1], m[2]), m[3]);
}

static inline void wg_g2(const __m512 *g, __m512 *u) {
   const __m512 s02 = _mm512_add_ps(g[0], g[2]);
   u[0] = g[0];
   u[1] = _mm512_mul_ps(WG_C(0.5), _mm512_add_ps(s02, g[1]));
   u[2] = _mm512_mul_ps(WG_C(0.5), _mm512_sub_ps(s02, g[1]));
   u[3] = g[2];
}

/* ---------------------------------------------------------------------------------------------
 * the problem
 */
typedef struct {
   const float *src;
   int64_t H, W, Cin;      /* source image, pixel stride Cin */
   float *dst;
   int64_t Ho, Wo, Cout;   /* destination image, pixel stride Cout */
   int64_t N, ph, pw;      /* padding (0..2 for the forward form of a 3x3) */
   int64_t th, tw;         /* tiles per column / row */
   int m, a, E;            /* F(m x m, 3x3): output tile m, input tile a = m + 2, E = a*a */
   int CP;                 /* Cin padded to 16, 32 or 64, or to a multiple of 64 (wg_cp) */
   int64_t OB, nob, CoutP; /* output channel blocks */
   const float *U;         /* [ob][E][CP][OB] */
   const uint32_t *Ub;     /* bf16: the same as bfloat16 pairs, [ob][E][CP / 2][OB] words */
   const float *bias, *res;
   int act;
   const float *w;         /* the untransformed weights (wide schedule: wg_run_wide) */
   const uint16_t *w16;    /* the same in bfloat16 (bf16 mode; w is then NULL) */
   int flip;               /* backward data: w is (Cin, 3, 3, Cout), taps flipped */
   int bf16;               /* products in bfloat16 (conv_winograd_bf16_avx512bf16.c) */
   /* bfloat16 tensors (instead of src, dst, res; F(4x4) only): read widened, the results rounded
      to nearest even */
   const uint16_t *src16, *res16;
   uint16_t *dst16;
} wg_prob;

/* 16 bfloat16 -> float32 (exact) */
static inline __m512 wg_bf_widen(__m256i h) {
   return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 float32 -> bfloat16, round to nearest even, NaN kept quiet (as lm_f2bf) */
static inline __m256i wg_bf_round(__m512 v) {
   const __m512i b = _mm512_castps_si512(v);
   const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
   const __m512i add = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
   __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, add), 16);
   const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
   r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
   return _mm512_cvtepi32_epi16(r);
}

/* one tile, 16 channels: the 6x6 patch at base (rows rs floats apart, pixels ps apart, lanes
   outside mask read as zero) -> v[e * es] for the 36 positions e */
static inline __attribute__((always_inline)) void wg_tile_in(const float *base, int64_t rs,
                                                             int64_t ps, __mmask16 m, float *v,
                                                             int64_t es) {
   __m512 t[WG_E];
#pragma GCC unroll 6
   for (int j = 0; j < 6; j++) {
      __m512 d[6], o[6];
#pragma GCC unroll 6
      for (int i = 0; i < 6; i++) d[i] = _mm512_maskz_loadu_ps(m, base + i * rs + j * ps);
      wg_bt(d, o);
#pragma GCC unroll 6
      for (int a = 0; a < 6; a++) t[a * 6 + j] = o[a];
   }
#pragma GCC unroll 6
   for (int a = 0; a < 6; a++) {
      __m512 o[6];
      wg_bt(t + a * 6, o);
#pragma GCC unroll 6
      for (int b = 0; b < 6; b++) _mm512_store_ps(v + (a * 6 + b) * es, o[b]);
   }
}

/* the same for F(2x2, 3x3): a 4x4 patch -> 16 positions */
static inline __attribute__((always_inline)) void wg_tile_in2(const float *base, int64_t rs,
                                                              int64_t ps, float *v, int64_t es) {
   __m512 t[16];
#pragma GCC unroll 4
   for (int j = 0; j < 4; j++) {
      __m512 d[4], o[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) d[i] = _mm512_loadu_ps(base + i * rs + j * ps);
      wg_bt2(d, o);
#pragma GCC unroll 4
      for (int a = 0; a < 4; a++) t[a * 4 + j] = o[a];
   }
#pragma GCC unroll 4
   for (int a = 0; a < 4; a++) {
      __m512 o[4];
      wg_bt2(t + a * 4, o);
#pragma GCC unroll 4
      for (int b = 0; b < 4; b++) _mm512_store_ps(v + (a * 4 + b) * es, o[b]);
   }
}

/* tile coordinates (image, tile row, tile column), advanced tile by tile */
typedef struct {
   int64_t n, r, c;
} wg_pos;

static inline wg_pos wg_pos_of(const wg_prob *P, int64_t t) {
   const int64_t per_img = P->th * P->tw;
   wg_pos q = {t / per_img, (t % per_img) / P->tw, t % P->tw};
   return q;
}

static inline void wg_pos_next(const wg_prob *P, wg_pos *q) {
   if (++q->c == P->tw) {
      q->c = 0;
      if (++q->r == P->th) {
         q->r = 0;
         q->n++;
      }
   }
}

/* ask for the cache lines of the rows [y0, y0 + ny) x columns [x0, x0 + nx) (clipped) of image
   n of an (N, H, W, C) tensor (write: for writing). Always inlined: a separate function made of
   prefetches alone counts as free of side effects, and GCC drops the calls. */
static inline __attribute__((always_inline)) void wg_prefetch_box(const float *base, int64_t N, int64_t n, int64_t H, int64_t W,
                            int64_t C, int64_t y0, int64_t ny, int64_t x0, int64_t nx, int write) {
   if (n >= N) return;
   const int64_t ya = y0 < 0 ? 0 : y0, yb = y0 + ny > H ? H : y0 + ny;
   const int64_t xa = x0 < 0 ? 0 : x0, xb = x0 + nx > W ? W : x0 + nx;
   if (xa >= xb) return;
   const int64_t nbytes = (xb - xa) * C * (int64_t)sizeof(float);
   for (int64_t y = ya; y < yb; y++) {
      const char *p = (const char *)(base + ((n * H + y) * W + xa) * C);
      if (write)
         for (int64_t b = 0; b < nbytes; b += 64) _mm_prefetch(p + b, _MM_HINT_ET0);
      else
         for (int64_t b = 0; b < nbytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
   }
}

/* the padded reduction channels of the forward and backward-data passes: the register-blocked
   kernels' 16, 32 or 64 up to 64 channels, beyond that a multiple of 64 reduced chunk by chunk
   (at most a quarter of it padding); 0 when Winograd does not take cin */
static int wg_cp(int64_t cin) {
   if (cin <= 64) return lm_conv_rb_cp(cin);
   if (cin > 64 * LM_RB_MAXCHUNKS) return 0;
   const int64_t cp = (cin + 63) / 64 * 64;
   return cin * 4 >= cp * 3 ? (int)cp : 0;
}

/* input transform of tiles [t0, t0 + T) into V[e][j][k][cw]: chunks j of cw = min(CP, 64)
   channels, so that the GEMMs see each chunk's rows cw floats apart (for CP <= 64 that is
   V[e][k][CP]). Tiles inside the image read it in place; border tiles (and channel counts below
   CP) first copy their patch, zero padded, into `patch` (36 x CP floats). */
static void wg_input_at(const wg_prob *P, int64_t t0, int64_t T, float *V, int64_t Ts, int64_t k0,
                        int64_t es, float *patch) {
   const int CP = P->CP, tm = P->m, ta = P->a;
   const int64_t Cin = P->Cin, H = P->H, W = P->W;
   wg_pos q = wg_pos_of(P, t0), qf = q;
   const uint16_t *src16 = P->src16; /* bfloat16: every patch gathered (and widened) */
   /* the patch of the tile WG_PF ahead is on its way while this one is transformed */
   for (int i = 0; i < WG_PF && !src16; i++) {
      wg_prefetch_box(P->src, P->N, qf.n, H, W, Cin, qf.r * tm - P->ph, ta, qf.c * tm - P->pw, ta,
                      0);
      wg_pos_next(P, &qf);
   }
   for (int64_t k = 0; k < T; k++, wg_pos_next(P, &q), wg_pos_next(P, &qf)) {
      const int64_t y0 = q.r * tm - P->ph, x0 = q.c * tm - P->pw;
      const float *img = src16 ? NULL : P->src + q.n * H * W * Cin;
      const uint16_t *img16 = src16 ? src16 + q.n * H * W * Cin : NULL;
      const float *base;
      int64_t rs, ps;
      if (k + WG_PF < T && !src16)
         wg_prefetch_box(P->src, P->N, qf.n, H, W, Cin, qf.r * tm - P->ph, ta, qf.c * tm - P->pw,
                         ta, 0);
      if (!src16 && y0 >= 0 && y0 + ta <= H && x0 >= 0 && x0 + ta <= W && Cin == CP) {
         base = img + (y0 * W + x0) * Cin;
         rs = W * Cin;
         ps = Cin;
      } else {
         for (int i = 0; i < ta; i++)
            for (int j = 0; j < ta; j++) {
               float *d = patch + (i * ta + j) * CP;
               const int64_t yy = y0 + i, xx = x0 + j;
               if (yy >= 0 && yy < H && xx >= 0 && xx < W) {
                  const int64_t po = (yy * W + xx) * Cin;
                  for (int c0 = 0; c0 < CP; c0 += 16) {
                     const int64_t left = Cin - c0;
                     const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF
                                                    : (left <= 0 ? (__mmask16)0
                                                                 : (__mmask16)((1u << left) - 1));
                     const __m512 v =
                        src16 ? wg_bf_widen(_mm256_maskz_loadu_epi16(m, img16 + po + c0))
                              : _mm512_maskz_loadu_ps(m, img + po + c0);
                     _mm512_store_ps(d + c0, v);
                  }
               } else {
                  memset(d, 0, (size_t)CP * sizeof(float));
               }
            }
         base = patch;
         rs = ta * CP;
         ps = CP;
      }
      const int cw = CP < 64 ? CP : 64;
      if (tm == 4)
         for (int c0 = 0; c0 < CP; c0 += 16)
            wg_tile_in(base + c0, rs, ps, (__mmask16)0xFFFF,
                       V + (c0 / cw) * Ts * cw + (k0 + k) * cw + c0 % cw, es);
      else
         for (int c0 = 0; c0 < CP; c0 += 16)
            wg_tile_in2(base + c0, rs, ps, V + (c0 / cw) * Ts * cw + (k0 + k) * cw + c0 % cw, es);
   }
}

static void wg_input(const wg_prob *P, int64_t t0, int64_t T, float *V, float *patch) {
   wg_input_at(P, t0, T, V, T, 0, T * P->CP, patch);
}

/* F(2x2, 3x3) output transform of tiles [t0, t0 + T) from M[e][k][CoutP], with the epilogue */
static void wg_output2(const wg_prob *P, int64_t t0, int64_t T, const float *M) {
   const int64_t Cout = P->Cout, CoutP = P->CoutP, es = T * CoutP;
   const int act = P->act;
   wg_pos q = wg_pos_of(P, t0);
   for (int64_t k = 0; k < T; k++, wg_pos_next(P, &q)) {
      const int64_t n = q.n, y0 = q.r * 2, x0 = q.c * 2;
      const int64_t ny = P->Ho - y0 < 2 ? P->Ho - y0 : 2, nx = P->Wo - x0 < 2 ? P->Wo - x0 : 2;
      float *obase = P->dst + ((n * P->Ho + y0) * P->Wo + x0) * Cout;
      const float *rbase = P->res ? P->res + ((n * P->Ho + y0) * P->Wo + x0) * Cout : NULL;
      const int64_t ors = P->Wo * Cout;
      if (k + 1 < T) {
         wg_pos q1 = q;
         wg_pos_next(P, &q1);
         wg_prefetch_box(P->dst, P->N, q1.n, P->Ho, P->Wo, Cout, q1.r * 2, 2, q1.c * 2, 2, 1);
      }
      for (int64_t c0 = 0; c0 < Cout; c0 += 16) {
         const int64_t left = Cout - c0;
         const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
         const float *mk = M + k * CoutP + c0;
         __m512 tmp[8];
         for (int b = 0; b < 4; b++) {
            __m512 d[4], o[2];
            for (int a = 0; a < 4; a++) d[a] = _mm512_load_ps(mk + (a * 4 + b) * es);
            wg_at2(d, o);
            tmp[b] = o[0];
            tmp[4 + b] = o[1];
         }
         const __m512 bv = P->bias ? _mm512_maskz_loadu_ps(m, P->bias + c0) : _mm512_setzero_ps();
         for (int p = 0; p < ny; p++) {
            __m512 o[2];
            wg_at2(tmp + p * 4, o);
            for (int q = 0; q < nx; q++) {
               const int64_t off = p * ors + q * Cout + c0;
               __m512 v = _mm512_add_ps(o[q], bv);
               if (rbase) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rbase + off));
               if (act) v = lm_act_ps(v, act);
               _mm512_mask_storeu_ps(obase + off, m, v);
            }
         }
      }
   }
}

/* output transform of tiles [t0, t0 + T) from M[e][k][CoutP], with the epilogue */
static void wg_output_at(const wg_prob *P, int64_t t0, int64_t T, const float *M, int64_t es,
                         int64_t mp, int64_t co0, int64_t co1) {
   const int64_t Cout = P->Cout;
   const int whole = co0 == 0 && co1 == Cout;
   const int act = P->act;
   wg_pos q = wg_pos_of(P, t0);
   for (int64_t k = 0; k < T; k++, wg_pos_next(P, &q)) {
      const int64_t n = q.n, y0 = q.r * 4, x0 = q.c * 4;
      const int64_t ny = P->Ho - y0 < 4 ? P->Ho - y0 : 4, nx = P->Wo - x0 < 4 ? P->Wo - x0 : 4;
      const int full = ny == 4 && nx == 4;
      const int64_t pix = ((n * P->Ho + y0) * P->Wo + x0) * Cout;
      float *obase = P->dst16 ? NULL : P->dst + pix;
      const float *rbase = P->res ? P->res + pix : NULL;
      uint16_t *obase16 = P->dst16 ? P->dst16 + pix : NULL;
      const uint16_t *rbase16 = P->res16 ? P->res16 + pix : NULL;
      const int64_t ors = P->Wo * Cout;
      if (k + 1 < T && whole && !obase16) {
         /* the next tile's output lines, for writing */
         wg_pos q1 = q;
         wg_pos_next(P, &q1);
         wg_prefetch_box(P->dst, P->N, q1.n, P->Ho, P->Wo, Cout, q1.r * 4, 4, q1.c * 4, 4, 1);
      }
      for (int64_t c0 = co0; c0 < co1; c0 += 16) {
         const int64_t left = co1 - c0;
         const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
         const float *mk = M + k * mp + (c0 - co0);
         __m512 tmp[24];
         /* columns: tmp[p*6 + b] = sum_a AT[p][a] M[a][b] */
#pragma GCC unroll 6
         for (int b = 0; b < 6; b++) {
            __m512 d[6], o[4];
#pragma GCC unroll 6
            for (int a = 0; a < 6; a++) d[a] = _mm512_load_ps(mk + (a * 6 + b) * es);
            wg_at(d, o);
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) tmp[p * 6 + b] = o[p];
         }
         const __m512 bv = P->bias ? _mm512_maskz_loadu_ps(m, P->bias + c0) : _mm512_setzero_ps();
#pragma GCC unroll 4
         for (int p = 0; p < 4; p++) {
            __m512 o[4];
            wg_at(tmp + p * 6, o);
            if (!full && p >= ny) break;
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
               if (!full && q >= nx) break;
               const int64_t off = p * ors + q * Cout + c0;
               __m512 v = _mm512_add_ps(o[q], bv);
               if (rbase) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rbase + off));
               if (rbase16)
                  v = _mm512_add_ps(v, wg_bf_widen(_mm256_maskz_loadu_epi16(m, rbase16 + off)));
               if (act) v = lm_act_ps(v, act);
               if (obase16)
                  _mm256_mask_storeu_epi16(obase16 + off, m, wg_bf_round(v));
               else
                  _mm512_mask_storeu_ps(obase + off, m, v);
            }
         }
      }
   }
}

static void wg_output(const wg_prob *P, int64_t t0, int64_t T, const float *M) {
   wg_output_at(P, t0, T, M, T * P->CoutP, P->CoutP, 0, P->Cout);
}

/* the 36 products for T tiles: M[e][k][ob*OB ..] = V[e][k][:] * U[ob][e] */
static void wg_gemm(const wg_prob *P, int64_t T, const float *V, float *M) {
   const int CP = P->CP;
   for (int e = 0; e < P->E; e++) {
      for (int64_t ob = 0; ob < P->nob; ob++) {
         const int64_t nvalid = P->Cout - ob * P->OB < P->OB ? P->Cout - ob * P->OB : P->OB;
         const int nv = (int)((nvalid + 15) / 16), pbmax = lm_conv_rb_pbmax(nv);
         const float *u = P->U + ((ob * P->E + e) * CP) * P->OB;
         const int64_t nb = (T + pbmax - 1) / pbmax, base = T / nb, extra = T % nb;
         int64_t k = 0;
         for (int64_t b = 0; b < nb; b++) {
            const int m = (int)(base + (b < extra));
            float *mo = M + ((int64_t)e * T + k) * P->CoutP + ob * P->OB;
            if (CP <= 64)
               lm_conv_rb_gemm(CP, nv, m, V + ((int64_t)e * T + k) * CP, u, P->OB, mo, P->CoutP);
            else /* V[e][j][k][64]: chunk j of row k at V + e*T*CP + j*T*64 + k*64 */
               lm_conv_rb_gemm_chunks(CP / 64, nv, m, V + (int64_t)e * T * CP + k * 64, T * 64,
                                      u, P->OB, mo, P->CoutP);
            k += m;
         }
      }
   }
}

/* wg_gemm with bfloat16 products (P->bf16; CP a multiple of 64): Vb is V as bfloat16 pairs (the
   same layout, words at half the float offsets), P->Ub the weights' pairs */
static void wg_gemm_bf16(const wg_prob *P, int64_t T, const uint32_t *Vb, float *M) {
   const int64_t CP = P->CP, OB = P->OB, nchunk = CP / 64;
   for (int e = 0; e < P->E; e++) {
      for (int64_t ob = 0; ob < P->nob; ob++) {
         const int64_t nvalid = P->Cout - ob * OB < OB ? P->Cout - ob * OB : OB;
         const int nv = (int)((nvalid + 15) / 16), pbmax = lm_conv_rb_pbmax(nv);
         const uint32_t *u = P->Ub + ((ob * P->E + e) * (CP / 2)) * OB;
         const uint32_t *ve = Vb + (int64_t)e * T * (CP / 2);
         const int64_t nb = (T + pbmax - 1) / pbmax, base = T / nb, extra = T % nb;
         int64_t k = 0;
         for (int64_t b = 0; b < nb; b++) {
            const int m = (int)(base + (b < extra));
            float *mo = M + ((int64_t)e * T + k) * P->CoutP + ob * OB;
            for (int64_t j = 0; j < nchunk; j++)
               lm_wg_bf16_gemm(nv, m, ve + j * T * 32 + k * 32, u + j * 32 * OB, OB, mo,
                               P->CoutP, j == 0);
            k += m;
         }
      }
   }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static lm_status wg_run(const wg_prob *P) {
   const int64_t tiles = P->N * P->th * P->tw;
   /* tiles per unit: V and M in L2, at least a few units per thread */
   int64_t T = WG_L2_BYTES / (P->E * (P->CP + P->CoutP) * (int64_t)sizeof(float));
   if (T > WG_MAXT) T = WG_MAXT;
   if (T < 1) T = 1;
   const double work = (double)tiles * P->E * P->CP * P->CoutP;
   const int nthr = conv_threads(work);
   while (T > 8 && ceil_div(tiles, T) < 4 * nthr) T = (T + 1) / 2;
   if (P->CP > 64) {
      /* every unit reads all the transformed weights (E x CP x CoutP, megabytes at these widths):
         one unit per thread, its V and M in the last-level cache rather than in L2, but at least
         8 tiles (a short GEMM per read of the weights does not pay) and within the budgets */
      T = ceil_div(tiles, nthr);
      if (T < 8) T = tiles < 8 ? tiles : 8;
      int64_t budget = WG_WIDE_ALL / nthr;
      if (budget > WG_WIDE_BYTES) budget = WG_WIDE_BYTES;
      const int64_t cap = budget / (P->E * (P->CP + P->CoutP) * (int64_t)sizeof(float));
      if (T > cap) T = cap > 1 ? cap : 1;
   }
   const int64_t units = ceil_div(tiles, T);
   T = ceil_div(tiles, units); /* balanced */
   const size_t vsz = (size_t)(P->E * T * P->CP), msz = (size_t)(P->E * T * P->CoutP);
   const size_t vbsz = P->bf16 ? vsz / 2 : 0; /* V as bfloat16 pairs (words) */
   const size_t per_thread = (vsz + msz + (size_t)P->E * P->CP + vbsz + 15) / 16 * 16;
   const size_t bytes = (size_t)nthr * per_thread * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *V = scratch + (size_t)conv_thread_id() * per_thread, *M = V + vsz, *patch = M + msz;
      uint32_t *Vb = (uint32_t *)(patch + (size_t)P->E * P->CP);
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t t0 = u * T, n = t0 + T < tiles ? T : tiles - t0;
         if (n <= 0) continue;
         wg_input(P, t0, n, V, patch);
         if (P->bf16) {
            lm_wg_bf16_pack_v(V, Vb, P->E * n * P->CP);
            wg_gemm_bf16(P, n, Vb, M);
         } else
            wg_gemm(P, n, V, M);
         if (P->m == 4)
            wg_output(P, t0, n, M);
         else
            wg_output2(P, t0, n, M);
      }
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * the wide schedule (more than 64 reduction channels, F(4x4)): the transformed weights of all
 * output channels (9.4 MB at 256 channels, 37.7 MB at 512) do not stay cached, so instead of
 * units of tiles that each read all of them, the threads split the output-channel blocks:
 *   1. the input transform of a group of tiles (all of a batch-8 call) into a shared
 *      V[e][j][k][64] (threads split the tiles);
 *   2. per output block of OB channels (threads take blocks): that block's weights transformed
 *      straight from w into a private U[e][CP][OB] (2.4 MB at 256, 4.7 MB at 512, cache-hot when
 *      read), the 36 GEMMs M[e][k][OB] = V[e][k][:] * U[e] over all the group's tiles (U[e],
 *      64-128 KB, in L2 while every row block passes), then the output transform of the block's
 *      channels with the epilogue.
 * Every weight is read and transformed once per group, V once per block.
 */
/* r[0..16) (16 x 16 floats) transposed in place: four rounds of swapping the off-diagonal
   blocks of s x s (s = 8, 4, 2, 1) */
static inline __attribute__((always_inline)) void wg_transpose16(__m512 *r) {
#pragma GCC unroll 4
   for (int s = 8; s >= 1; s /= 2) {
      int lo[16], hi[16];
      for (int j = 0; j < 16; j++) {
         lo[j] = (j & s) ? 16 + j - s : j;
         hi[j] = (j & s) ? 16 + j : j + s;
      }
      const __m512i il = _mm512_loadu_si512(lo), ih = _mm512_loadu_si512(hi);
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) {
         if (i & s) continue;
         const __m512 a = r[i], b = r[i + s];
         r[i] = _mm512_permutex2var_ps(a, il, b);
         r[i + s] = _mm512_permutex2var_ps(a, ih, b);
      }
   }
}

/* the 9 taps g of 16 weights -> their 36 transforms at dst + e * es */
static inline __attribute__((always_inline)) void wg_weights_vec(const __m512 *g, float *dst,
                                                                 int64_t es) {
   __m512 r[18], u[6], col[3];
   for (int j = 0; j < 3; j++) {
      for (int i = 0; i < 3; i++) col[i] = g[i * 3 + j];
      wg_g(col, u);
      for (int a = 0; a < 6; a++) r[a * 3 + j] = u[a];
   }
   for (int a = 0; a < 6; a++) {
      wg_g(r + a * 3, u);
      for (int b = 0; b < 6; b++) _mm512_store_ps(dst + (a * 6 + b) * es, u[b]);
   }
}

/* block ob's weights of reduction channels [cb, cb + CP) -> U[e][CP][OB] (zero outside
   Cin x Cout) */
static void wg_weights_block(const wg_prob *P, int64_t ob, int64_t cb, int64_t CP, int64_t ues,
                             float *U) {
   const int64_t OB = P->OB, Cin = P->Cin, Cout = P->Cout;
   const int64_t K = 9 * (P->flip ? Cout : Cin);
   if (P->flip) {
      /* w[ci][8 - tap][co]: output channels consecutive; the rows K floats apart, too far for
         the hardware prefetchers: ask for those of 8 channels ahead */
      const int64_t co1 = ob * OB + OB < Cout ? ob * OB + OB : Cout;
      for (int64_t cl = 0; cl < CP; cl++) {
         const int64_t ci = cb + cl;
         if (ci + 8 < Cin && P->w)
            for (int t = 0; t < 9; t++)
               for (int64_t c = ob * OB; c < co1; c += 16)
                  _mm_prefetch((const char *)(P->w + (ci + 8) * K + t * Cout + c), _MM_HINT_T0);
         for (int64_t v0 = 0; v0 < OB; v0 += 16) {
            const int64_t co0 = ob * OB + v0, left = Cout - co0;
            const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF
                                           : (left <= 0 ? (__mmask16)0
                                                        : (__mmask16)((1u << left) - 1));
            __m512 g[9];
            for (int t = 0; t < 9; t++) {
               const int64_t wo = ci * K + co0 + (8 - t) * Cout;
               g[t] = !(ci < Cin && m) ? _mm512_setzero_ps()
                      : P->w16         ? wg_bf_widen(_mm256_maskz_loadu_epi16(m, P->w16 + wo))
                                       : _mm512_maskz_loadu_ps(m, P->w + wo);
            }
            wg_weights_vec(g, U + cl * OB + v0, ues);
         }
      }
      return;
   }
   float buf[9][16][16] __attribute__((aligned(64)));
   for (int64_t v0 = 0; v0 < OB; v0 += 16) {
      const int64_t co0 = ob * OB + v0, left = Cout - co0;
      for (int64_t cl0 = 0; cl0 < CP; cl0 += 16) {
         const int64_t ci0 = cb + cl0, cleft = Cin - ci0;
         const __mmask16 cm = cleft >= 16 ? (__mmask16)0xFFFF
                                          : (cleft <= 0 ? (__mmask16)0
                                                        : (__mmask16)((1u << cleft) - 1));
         /* w[co][tap][ci]: 16 x 16 blocks (output channel rows, input channel columns),
            transposed to rows of output channels */
         for (int t = 0; t < 9; t++) {
            __m512 r[16];
            /* the rows are K floats apart: ask for the lines of the block after next */
            if (cleft > 32 && P->w)
               for (int l = 0; l < 16 && l < left; l++)
                  _mm_prefetch((const char *)(P->w + (co0 + l) * K + t * Cin + ci0 + 32),
                               _MM_HINT_T0);
            for (int l = 0; l < 16; l++) {
               const int64_t wo = (co0 + l) * K + t * Cin + ci0;
               r[l] = !(l < left) ? _mm512_setzero_ps()
                      : P->w16    ? wg_bf_widen(_mm256_maskz_loadu_epi16(cm, P->w16 + wo))
                                  : _mm512_maskz_loadu_ps(cm, P->w + wo);
            }
            wg_transpose16(r);
            for (int l = 0; l < 16; l++) _mm512_store_ps(buf[t][l], r[l]);
         }
         for (int64_t c = 0; c < 16; c++) {
            __m512 g[9];
            for (int t = 0; t < 9; t++) g[t] = _mm512_load_ps(buf[t][c]);
            wg_weights_vec(g, U + (cl0 + c) * OB + v0, ues);
         }
      }
   }
}

/* out[k*pitch + 16v ..] (+)= sum_{c < 64} x[k*64 + c] * w[c*OB + 16v ..] for PB rows k and NV
   vectors v: one 64-channel chunk of the reduction, added to out unless `first` */
AI void wga_body(const float *x, const float *w, int64_t OB, float *out, int64_t pitch, int first,
                 const int PB, const int NV) {
   __m512 a[14][4];
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++)
         a[k][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(out + k * pitch + 16 * v);
   for (int c = 0; c < 64; c++) {
      __m512 wv[4];
      /* the next row block's V rows (64 floats) and partial sums (wg_prefetch_next): the
         kernel waited on every broadcast's line when other tenants loaded the shared cache
         (numbers: docs/performance.md, "Measurements behind kernel choices") */
      wg_prefetch_next(x, 64 * 4, out, pitch, PB, NV, c, 32, first);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) wv[v] = _mm512_load_ps(w + c * OB + 16 * v);
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++) {
         const __m512 b = _mm512_set1_ps(x[k * 64 + c]);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) a[k][v] = _mm512_fmadd_ps(b, wv[v], a[k][v]);
      }
   }
#pragma GCC unroll 14
   for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(out + k * pitch + 16 * v, a[k][v]);
}

typedef void (*wga_fn)(const float *, const float *, int64_t, float *, int64_t, int);
#define WGA_INST(PB, NV)                                                                        \
   static void wga_##PB##_##NV(const float *x, const float *w, int64_t OB, float *out,          \
                               int64_t pitch, int first) {                                      \
      wga_body(x, w, OB, out, pitch, first, PB, NV);                                            \
   }
WGA_INST(1, 1) WGA_INST(2, 1) WGA_INST(3, 1) WGA_INST(4, 1) WGA_INST(5, 1) WGA_INST(6, 1) WGA_INST(7, 1) WGA_INST(8, 1) WGA_INST(9, 1) WGA_INST(10, 1) WGA_INST(11, 1) WGA_INST(12, 1) WGA_INST(13, 1) WGA_INST(14, 1)
WGA_INST(1, 2) WGA_INST(2, 2) WGA_INST(3, 2) WGA_INST(4, 2) WGA_INST(5, 2) WGA_INST(6, 2) WGA_INST(7, 2) WGA_INST(8, 2)
WGA_INST(1, 3) WGA_INST(2, 3) WGA_INST(3, 3) WGA_INST(4, 3) WGA_INST(5, 3) WGA_INST(6, 3) WGA_INST(7, 3) WGA_INST(8, 3)
WGA_INST(1, 4) WGA_INST(2, 4) WGA_INST(3, 4) WGA_INST(4, 4) WGA_INST(5, 4) WGA_INST(6, 4)
static const wga_fn wga_tab[5][15] = {
   {0},
   {0, wga_1_1, wga_2_1, wga_3_1, wga_4_1, wga_5_1, wga_6_1, wga_7_1, wga_8_1, wga_9_1, wga_10_1, wga_11_1, wga_12_1, wga_13_1, wga_14_1},
   {0, wga_1_2, wga_2_2, wga_3_2, wga_4_2, wga_5_2, wga_6_2, wga_7_2, wga_8_2},
   {0, wga_1_3, wga_2_3, wga_3_3, wga_4_3, wga_5_3, wga_6_3, wga_7_3, wga_8_3},
   {0, wga_1_4, wga_2_4, wga_3_4, wga_4_4, wga_5_4, wga_6_4},
};


static lm_status wg_run_wide(const wg_prob *P) {
   const int64_t tiles = P->N * P->th * P->tw, CP = P->CP, OB = P->OB;
   const int nthr = conv_threads((double)tiles * WG_E * CP * P->CoutP);
   /* tiles per group: V within WG_WIDE_V, each thread's M within WG_WIDE_M */
   int64_t Tg = WG_WIDE_V / (WG_E * CP * (int64_t)sizeof(float));
   const int64_t tmax = WG_WIDE_M / (WG_E * OB * (int64_t)sizeof(float));
   if (Tg > tmax) Tg = tmax;
   if (Tg < 1) Tg = 1;
   const int64_t groups = ceil_div(tiles, Tg);
   Tg = ceil_div(tiles, groups);
   /* the 36 positions of V, U and M one cache line more than their size apart: at sizes of a
      multiple of 4 KB (64 KB, 16 KB, 8 KB here) the 36 stores of a transform all fall in the
      same L1 set */
   const int64_t ves = Tg * CP + 16, ues = 64 * OB + 16, mes = Tg * OB + 16;
   /* bfloat16 products: V and each block's U again as bfloat16 pairs (words; V's positions
      ves / 2 words apart, U's ubes) */
   const int bf = P->bf16;
   const int64_t ubes = 32 * OB + 16;
   const size_t vsz = (size_t)(WG_E * ves) + (bf ? (size_t)(WG_E * ves / 2) : 0);
   const size_t per_thread = ((size_t)(WG_E * ues) + (size_t)(WG_E * mes) + (size_t)(WG_E * CP) +
                              (bf ? (size_t)(WG_E * ubes) : 0) + 15) / 16 * 16;
   const size_t bytes = (vsz + (size_t)nthr * per_thread) * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
   float *V = scratch;
   uint32_t *Vb = (uint32_t *)(V + WG_E * ves);
   const int64_t nchunk = CP / 64;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *U = scratch + vsz + (size_t)conv_thread_id() * per_thread;
      float *M = U + WG_E * ues, *patch = M + WG_E * mes;
      uint32_t *Ub = (uint32_t *)(patch + WG_E * CP);
      for (int64_t gi = 0; gi < groups; gi++) {
         const int64_t g0 = gi * Tg, gn = g0 + Tg < tiles ? Tg : tiles - g0;
         const int64_t nin = ceil_div(gn, 4);
#pragma omp for schedule(static)
         for (int64_t i = 0; i < nin; i++) {
            const int64_t k0 = i * 4, n = k0 + 4 < gn ? 4 : gn - k0;
            wg_input_at(P, g0 + k0, n, V, Tg, k0, ves, patch);
         }
         if (bf) {
#pragma omp for schedule(static)
            for (int64_t ej = 0; ej < WG_E * nchunk; ej++) {
               const int64_t e = ej / nchunk, j = ej % nchunk;
               lm_wg_bf16_pack_v(V + e * ves + j * Tg * 64, Vb + e * (ves / 2) + j * Tg * 32,
                                 gn * 64);
            }
         }
#pragma omp for schedule(dynamic, 1)
         for (int64_t ob = 0; ob < P->nob; ob++) {
            const int64_t co0 = ob * OB, co1 = co0 + OB < P->Cout ? co0 + OB : P->Cout;
            const int nv = (int)((co1 - co0 + 15) / 16), pbmax = lm_conv_rb_pbmax(nv);
            const int64_t nb = (gn + pbmax - 1) / pbmax, base = gn / nb, extra = gn % nb;
            for (int64_t j = 0; j < nchunk; j++) {
               wg_weights_block(P, ob, j * 64, 64, ues, U);
               if (bf) lm_wg_bf16_pack_u(U, ues, OB, Ub, ubes);
               for (int e = 0; e < WG_E; e++) {
                  const float *ue = U + e * ues;
                  const float *ve = V + e * ves + j * Tg * 64;
                  const uint32_t *ueb = Ub + e * ubes, *veb = Vb + e * (ves / 2) + j * Tg * 32;
                  int64_t k = 0;
                  for (int64_t b = 0; b < nb; b++) {
                     const int m = (int)(base + (b < extra));
                     if (bf)
                        lm_wg_bf16_gemm(nv, m, veb + k * 32, ueb, OB, M + e * mes + k * OB, OB,
                                        j == 0);
                     else
                        wga_tab[nv][m](ve + k * 64, ue, OB, M + e * mes + k * OB, OB, j == 0);
                     k += m;
                  }
               }
            }
            wg_output_at(P, g0, gn, M, mes, OB, co0, co1);
         }
      }
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * weights: gt[tap][ci][co] (3x3 taps, ci < CP, co < CoutP, zero padded) -> U[ob][e][ci][OB]
 */
static void wg_weights(const float *gt, int CP, int64_t CoutP, int64_t OB, int64_t nob, float *U) {
   for (int64_t ci = 0; ci < CP; ci++) {
      for (int64_t c0 = 0; c0 < CoutP; c0 += 16) {
         __m512 g[9], r[18], u[6], col[3];
         for (int t = 0; t < 9; t++) g[t] = _mm512_loadu_ps(gt + (t * CP + ci) * CoutP + c0);
         /* columns: r[a*3 + j] = sum_i G[a][i] g[i][j] */
         for (int j = 0; j < 3; j++) {
            for (int i = 0; i < 3; i++) col[i] = g[i * 3 + j];
            wg_g(col, u);
            for (int a = 0; a < 6; a++) r[a * 3 + j] = u[a];
         }
         const int64_t ob = c0 / OB, v0 = c0 % OB;
         for (int a = 0; a < 6; a++) {
            wg_g(r + a * 3, u);
            for (int b = 0; b < 6; b++)
               _mm512_store_ps(U + (((ob * WG_E + a * 6 + b) * CP) + ci) * OB + v0, u[b]);
         }
      }
   }
   (void)nob;
}

/* the same for F(2x2, 3x3): U[ob][16][ci][OB] */
static void wg_weights2(const float *gt, int CP, int64_t CoutP, int64_t OB, float *U) {
   for (int64_t ci = 0; ci < CP; ci++) {
      for (int64_t c0 = 0; c0 < CoutP; c0 += 16) {
         __m512 g[9], r[12], u[4], col[3];
         for (int t = 0; t < 9; t++) g[t] = _mm512_loadu_ps(gt + (t * CP + ci) * CoutP + c0);
         for (int j = 0; j < 3; j++) {
            for (int i = 0; i < 3; i++) col[i] = g[i * 3 + j];
            wg_g2(col, u);
            for (int a = 0; a < 4; a++) r[a * 3 + j] = u[a];
         }
         const int64_t ob = c0 / OB, v0 = c0 % OB;
         for (int a = 0; a < 4; a++) {
            wg_g2(r + a * 3, u);
            for (int b = 0; b < 4; b++)
               _mm512_store_ps(U + (((ob * 16 + a * 4 + b) * CP) + ci) * OB + v0, u[b]);
         }
      }
   }
}

static int64_t wg_block_width(int64_t co) { return co >= 64 ? 64 : (co + 15) / 16 * 16; }

/* whether the unit schedule (wg_run) takes more than 64 reduction channels: every unit reads
   all the transformed weights (with CoutP as wg_conv pads it), so they must stay cached */
static int wg_unit_fits(int64_t cin, int64_t cout) {
   if (cin > WG_WIDE_MAX_CIN) return 0;
   const int64_t CP = wg_cp(cin), ob = wg_block_width(cout), coutp = (cout + ob - 1) / ob * ob;
   return (int64_t)WG_E * CP * coutp * (int64_t)sizeof(float) <= WG_WIDE_U;
}


/* cin: reduction channels; cout: output channels; flip: backward data (g'[i][j][o -> c]) */
/* bf16: 1, bfloat16 products, and src, res, dst and w bfloat16 tensors (uint16_t); 2, src, res
   and dst bfloat16 but w and the products float32 (the float32 route of a bfloat16 call where
   vdpbf16ps does not pay: the patches widened as they are gathered, the output rounded once in
   the output transform, so no float32 copies of the input and output); 0, float32 */
static lm_status wg_conv(const conv_geom *g, int flip, int tm, const void *src, const void *w_,
                         const float *bias, const void *res, int act, void *dst, int bf16_) {
   const int bf16 = bf16_ == 1;
   const float *w = bf16 ? NULL : w_;
   const uint16_t *w16 = bf16 ? w_ : NULL;
   const int E = (tm + 2) * (tm + 2);
   const int64_t cin = flip ? g->O : g->C, cout = flip ? g->C : g->O;
   const int CP = wg_cp(cin);
   const int64_t OB = wg_block_width(cout), nob = ceil_div(cout, OB), CoutP = nob * OB;
   wg_prob P;
   memset(&P, 0, sizeof P);
   if (bf16_) {
      P.src16 = src;
      P.res16 = res;
      P.dst16 = dst;
   } else {
      P.src = src;
      P.res = res;
      P.dst = dst;
   }
   P.H = flip ? g->Ho : g->H;
   P.W = flip ? g->Wo : g->W;
   P.Cin = cin;
   P.Ho = flip ? g->H : g->Ho;
   P.Wo = flip ? g->W : g->Wo;
   P.Cout = cout;
   P.N = g->N;
   P.ph = flip ? 2 - g->ph : g->ph;
   P.pw = flip ? 2 - g->pw : g->pw;
   P.th = ceil_div(P.Ho, tm);
   P.tw = ceil_div(P.Wo, tm);
   P.m = tm;
   P.a = tm + 2;
   P.E = E;
   P.CP = CP;
   P.OB = OB;
   P.nob = nob;
   P.CoutP = CoutP;
   P.bias = bias;
   P.act = act;
   if (CP > 64 && tm == 4) {
      /* the wide schedule transforms the weights itself, block by block */
      P.w = w;
      P.w16 = w16;
      P.flip = flip;
      P.bf16 = bf16;
      return wg_run_wide(&P);
   }
   /* gt[tap][ci][co] */
   const size_t gbytes = (size_t)(9 * CP * CoutP) * sizeof(float);
   const size_t ubytes = (size_t)(nob * E * CP * OB) * sizeof(float);
   float *gt = lm_alloc(gbytes), *U = lm_alloc(ubytes);
   if (!gt || !U) {
      if (gt) lm_free(gt, gbytes);
      if (U) lm_free(U, ubytes);
      return LM_ERR_OOM;
   }
   memset(gt, 0, gbytes);
   const int64_t K = g->K, C = g->C;
   if (!flip) {
      /* w[o][tap][c] -> gt[tap][c][o] */
      for (int64_t o = 0; o < g->O; o++)
         for (int64_t t = 0; t < 9; t++)
            for (int64_t c = 0; c < C; c++)
               gt[(t * CP + c) * CoutP + o] = w16 ? lm_bf2f(w16[o * K + t * C + c])
                                                  : w[o * K + t * C + c];
   } else {
      /* gt[tap][o][c] = w[o][flip(tap)][c] */
      for (int64_t o = 0; o < g->O; o++)
         for (int64_t t = 0; t < 9; t++) {
            float *d = gt + (t * CP + o) * CoutP;
            const int64_t wo = o * K + (8 - t) * C;
            if (w16)
               for (int64_t c = 0; c < C; c++) d[c] = lm_bf2f(w16[wo + c]);
            else
               memcpy(d, w + wo, (size_t)C * sizeof(float));
         }
   }
   if (tm == 4)
      wg_weights(gt, CP, CoutP, OB, nob, U);
   else
      wg_weights2(gt, CP, CoutP, OB, U);
   lm_free(gt, gbytes);
   P.U = U;
   uint32_t *Ub = NULL;
   const size_t ubbytes = ubytes / 2;
   if (bf16) { /* the transformed weights once more, as bfloat16 pairs */
      Ub = lm_alloc(ubbytes);
      if (!Ub) {
         lm_free(U, ubytes);
         return LM_ERR_OOM;
      }
      for (int64_t ob = 0; ob < nob; ob++)
         for (int64_t j = 0; j < CP / 64; j++)
            lm_wg_bf16_pack_u(U + ((ob * E) * CP + j * 64) * OB, CP * OB, OB,
                              Ub + (ob * E) * (CP / 2) * OB + j * 32 * OB, (CP / 2) * OB);
      P.Ub = Ub;
      P.bf16 = 1;
   }
   lm_status st = wg_run(&P);
   if (Ub) lm_free(Ub, ubbytes);
   lm_free(U, ubytes);
   return st;
}

/* ---------------------------------------------------------------------------------------------
 * backward weight: with V = B^T d B (the forward's input transform) and D = A dY A^T (the
 * adjoint of the output transform applied to grad_output),
 *    dU[e][ci][co] = sum over tiles V[e][tile][ci] * D[e][tile][co],   grad_w = G^T dU G.
 * Per-thread partial sums of dU (static schedule: a fixed split and a fixed reduction order).
 */
/* A y for a 4-vector y (6 results): the adjoint of wg_at */
static inline void wg_a(const __m512 *y, __m512 *z) {
   const __m512 s02 = _mm512_add_ps(y[0], y[2]), s13 = _mm512_add_ps(y[1], y[3]);
   z[0] = y[0];
   z[1] = _mm512_add_ps(s02, s13);
   z[2] = _mm512_sub_ps(s02, s13);
   z[3] = _mm512_fmadd_ps(WG_C(0.5), y[1],
                          _mm512_fmadd_ps(WG_C(0.25), y[2], _mm512_fmadd_ps(WG_C(0.125), y[3], y[0])));
   z[4] = _mm512_fmadd_ps(WG_C(-2), y[1],
                          _mm512_fmadd_ps(WG_C(4), y[2], _mm512_fmadd_ps(WG_C(-8), y[3], y[0])));
   z[5] = y[3];
}

/* G^T x for a 6-vector x (3 results): the adjoint of wg_g */
static inline void wg_gt(const __m512 *x, __m512 *r) {
   const __m512 s12 = _mm512_add_ps(x[1], x[2]), d12 = _mm512_sub_ps(x[1], x[2]);
   r[0] = _mm512_fmadd_ps(WG_C(0.5), x[0],
                          _mm512_fmadd_ps(WG_C(1.0 / 6.0), s12,
                                          _mm512_fmadd_ps(WG_C(16.0 / 15.0), x[3],
                                                          _mm512_mul_ps(WG_C(1.0 / 30.0), x[4]))));
   r[1] = _mm512_fmadd_ps(WG_C(1.0 / 6.0), d12,
                          _mm512_fmadd_ps(WG_C(8.0 / 15.0), x[3], _mm512_mul_ps(WG_C(-1.0 / 15.0), x[4])));
   r[2] = _mm512_fmadd_ps(WG_C(1.0 / 6.0), s12,
                          _mm512_fmadd_ps(WG_C(4.0 / 15.0), x[3],
                                          _mm512_fmadd_ps(WG_C(2.0 / 15.0), x[4],
                                                          _mm512_mul_ps(WG_C(0.5), x[5]))));
}

/* grad_output transform of tiles [t0, t0 + T) into D[e][k][CoutP] (pixels outside the image are
   zero); the bias gradient of the tiles' pixels is added to gb */
/* gout16 (bfloat16, instead of gout when not NULL): read widened */
static void wg_gout_at(const wg_prob *P, const float *gout, const uint16_t *gout16, int64_t t0,
                       int64_t T, float *D, int64_t k0, int64_t es, float *gb) {
   const int64_t Cout = P->Cout, CoutP = P->CoutP;
   wg_pos q = wg_pos_of(P, t0);
   for (int64_t k = 0; k < T; k++, wg_pos_next(P, &q)) {
      const int64_t n = q.n, y0 = q.r * 4, x0 = q.c * 4;
      const int64_t ny = P->Ho - y0 < 4 ? P->Ho - y0 : 4, nx = P->Wo - x0 < 4 ? P->Wo - x0 : 4;
      const int64_t pix = ((n * P->Ho + y0) * P->Wo + x0) * Cout;
      const float *gbase = gout16 ? NULL : gout + pix;
      const uint16_t *gbase16 = gout16 ? gout16 + pix : NULL;
      if (k + WG_PF < T && !gout16) {
         wg_pos qf = q;
         for (int i = 0; i < WG_PF; i++) wg_pos_next(P, &qf);
         wg_prefetch_box(gout, P->N, qf.n, P->Ho, P->Wo, Cout, qf.r * 4, 4, qf.c * 4, 4, 0);
      }
      for (int64_t c0 = 0; c0 < CoutP; c0 += 16) {
         const int64_t left = Cout - c0;
         const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF
                                        : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
         __m512 y[16], tmp[24], sum = _mm512_setzero_ps();
         for (int p = 0; p < 4; p++)
            for (int q = 0; q < 4; q++) {
               const int64_t off = (p * P->Wo + q) * Cout + c0;
               y[p * 4 + q] = !(p < ny && q < nx) ? _mm512_setzero_ps()
                              : gbase16 ? wg_bf_widen(_mm256_maskz_loadu_epi16(m, gbase16 + off))
                                        : _mm512_maskz_loadu_ps(m, gbase + off);
               sum = _mm512_add_ps(sum, y[p * 4 + q]);
            }
         if (gb) _mm512_store_ps(gb + c0, _mm512_add_ps(_mm512_load_ps(gb + c0), sum));
         /* columns: tmp[a*4 + q] = sum_p A[a][p] y[p][q] */
         for (int q = 0; q < 4; q++) {
            __m512 d[4], o[6];
            for (int p = 0; p < 4; p++) d[p] = y[p * 4 + q];
            wg_a(d, o);
            for (int a = 0; a < 6; a++) tmp[a * 4 + q] = o[a];
         }
         float *dk = D + (k0 + k) * CoutP + c0;
         for (int a = 0; a < 6; a++) {
            __m512 o[6];
            wg_a(tmp + a * 4, o);
            for (int b = 0; b < 6; b++) _mm512_store_ps(dk + (a * 6 + b) * es, o[b]);
         }
      }
   }
}

static void wg_gout(const wg_prob *P, const float *gout, const uint16_t *gout16, int64_t t0,
                    int64_t T, float *D, float *gb) {
   wg_gout_at(P, gout, gout16, t0, T, D, 0, T * P->CoutP, gb);
}

/* acc[r][v] (at accp + r*ap + 16v) += sum_k xv[k*xs + r] * dv[k*ds + 16v], k < T */
AI void wgw_body(const float *xv, int64_t xs, const float *dv, int64_t ds, int64_t T, float *accp,
                 int64_t ap, const int R, const int NV) {
   __m512 acc[16][4];
#pragma GCC unroll 16
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_load_ps(accp + r * ap + 16 * v);
   for (int64_t k = 0; k < T; k++) {
      __m512 gv[4];
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) gv[v] = _mm512_load_ps(dv + 16 * v);
#pragma GCC unroll 16
      for (int r = 0; r < R; r++) {
         const __m512 b = _mm512_set1_ps(xv[r]);
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(b, gv[v], acc[r][v]);
      }
      xv += xs;
      dv += ds;
   }
#pragma GCC unroll 16
   for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) _mm512_store_ps(accp + r * ap + 16 * v, acc[r][v]);
}

typedef void (*wgw_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t);
#define WGW_INST(R, NV)                                                                         \
   static void wgw_##R##_##NV(const float *xv, int64_t xs, const float *dv, int64_t ds,         \
                              int64_t T, float *accp, int64_t ap) {                             \
      wgw_body(xv, xs, dv, ds, T, accp, ap, R, NV);                                             \
   }
WGW_INST(1, 1) WGW_INST(2, 1) WGW_INST(3, 1) WGW_INST(4, 1) WGW_INST(5, 1) WGW_INST(6, 1)
WGW_INST(7, 1) WGW_INST(8, 1) WGW_INST(9, 1) WGW_INST(10, 1) WGW_INST(11, 1) WGW_INST(12, 1)
WGW_INST(13, 1) WGW_INST(14, 1) WGW_INST(15, 1) WGW_INST(16, 1)
WGW_INST(1, 2) WGW_INST(2, 2) WGW_INST(3, 2) WGW_INST(4, 2) WGW_INST(5, 2) WGW_INST(6, 2)
WGW_INST(7, 2) WGW_INST(8, 2)
WGW_INST(1, 3) WGW_INST(2, 3) WGW_INST(3, 3) WGW_INST(4, 3) WGW_INST(5, 3) WGW_INST(6, 3)
WGW_INST(7, 3) WGW_INST(8, 3)
WGW_INST(1, 4) WGW_INST(2, 4) WGW_INST(3, 4) WGW_INST(4, 4) WGW_INST(5, 4) WGW_INST(6, 4)
static const wgw_fn wgw_tab[5][17] = {
   {0},
   {0, wgw_1_1, wgw_2_1, wgw_3_1, wgw_4_1, wgw_5_1, wgw_6_1, wgw_7_1, wgw_8_1, wgw_9_1, wgw_10_1,
    wgw_11_1, wgw_12_1, wgw_13_1, wgw_14_1, wgw_15_1, wgw_16_1},
   {0, wgw_1_2, wgw_2_2, wgw_3_2, wgw_4_2, wgw_5_2, wgw_6_2, wgw_7_2, wgw_8_2},
   {0, wgw_1_3, wgw_2_3, wgw_3_3, wgw_4_3, wgw_5_3, wgw_6_3, wgw_7_3, wgw_8_3},
   {0, wgw_1_4, wgw_2_4, wgw_3_4, wgw_4_4, wgw_5_4, wgw_6_4},
};
static const int wgw_rmax[5] = {0, 16, 8, 8, 6};

/* dU[e][ci][co] += V[e][k][ci] * D[e][k][co] over the unit's T tiles. With Vp and Dp (bf16
   mode) the products are bfloat16: V and D packed into pairs of tiles there first (T2 =
   ceil(T/2) pair rows per position), lm_wg_bf16_wgrad instead of the float32 kernels */
static void wg_wgrad(const wg_prob *P, int64_t T, const float *V, const float *D, uint32_t *Vp,
                     uint32_t *Dp, float *dU) {
   const int64_t CP = P->CP, CoutP = P->CoutP, T2 = (T + 1) / 2;
   for (int e = 0; e < WG_E; e++) {
      const float *ve = V + (int64_t)e * T * CP, *de = D + (int64_t)e * T * CoutP;
      uint32_t *vp = Vp ? Vp + (int64_t)e * T2 * CP : NULL;
      uint32_t *dp = Dp ? Dp + (int64_t)e * T2 * CoutP : NULL;
      if (vp) {
         lm_wg_bf16_pack_rows(ve, T, CP, CP, vp, CP);
         lm_wg_bf16_pack_rows(de, T, CoutP, CoutP, dp, CoutP);
      }
      float *ue = dU + (int64_t)e * CP * CoutP;
      for (int64_t ob = 0; ob < P->nob; ob++) {
         const int64_t co0 = ob * P->OB;
         const int64_t nvalid = P->Cout - co0 < P->OB ? P->Cout - co0 : P->OB;
         const int nv = (int)((nvalid + 15) / 16), rmax = wgw_rmax[nv];
         const int64_t nb = (CP + rmax - 1) / rmax, base = CP / nb, extra = CP % nb;
         int64_t ci = 0;
         for (int64_t b = 0; b < nb; b++) {
            const int rn = (int)(base + (b < extra));
            float *acc = ue + ci * CoutP + co0;
            if (vp)
               lm_wg_bf16_wgrad(nv, rn, vp + ci, CP, dp + co0, CoutP, T2, acc, CoutP);
            else
               wgw_tab[nv][rn](ve + ci, CP, de + co0, CoutP, T, acc, CoutP);
            ci += rn;
         }
      }
   }
}

/* the weight gradient's problem (F(4x4), input x): sizes, padding, tiles, channel padding */
static wg_prob wg_bwdw_prob(const conv_geom *g, const void *x, int bf16, int CP, int64_t OB,
                            int64_t nob) {
   wg_prob P;
   memset(&P, 0, sizeof P);
   if (bf16)
      P.src16 = x;
   else
      P.src = x;
   P.H = g->H;
   P.W = g->W;
   P.Cin = g->C;
   P.Ho = g->Ho;
   P.Wo = g->Wo;
   P.Cout = g->O;
   P.N = g->N;
   P.ph = g->ph;
   P.pw = g->pw;
   P.th = ceil_div(P.Ho, 4);
   P.tw = ceil_div(P.Wo, 4);
   P.m = 4;
   P.a = 6;
   P.E = WG_E;
   P.CP = CP;
   P.OB = OB;
   P.nob = nob;
   P.CoutP = nob * OB;
   return P;
}

/* bf16: x and gout bfloat16 (uint16_t), the products in bfloat16 (each unit's V and D packed into
   pairs of tiles, lm_wg_bf16_wgrad) */
static lm_status wg_bwdw(const conv_geom *g, const void *x, const void *gout_, float *gw,
                         float *gb, int bf16_) {
   /* bf16_ 2: x and gout bfloat16, the products float32 (the float32 route of a bfloat16
      call) */
   const int io16 = bf16_ != 0, bf16 = bf16_ == 1;
   const int64_t cin = g->C, cout = g->O, K = g->K, C = g->C;
   const int CP = lm_conv_rb_cp(cin);
   const int64_t OB = wg_block_width(cout), nob = ceil_div(cout, OB), CoutP = nob * OB;
   const wg_prob P = wg_bwdw_prob(g, x, io16, CP, OB, nob);
   const float *gout = io16 ? NULL : gout_;
   const uint16_t *gout16 = io16 ? gout_ : NULL;
   const int64_t tiles = P.N * P.th * P.tw;
   const int64_t usz = WG_E * CP * CoutP;
   int64_t T = WG_L2_BYTES / (WG_E * (CP + CoutP) * (int64_t)sizeof(float));
   if (T > WG_MAXT) T = WG_MAXT;
   if (T < 1) T = 1;
   const int nthr = conv_threads((double)tiles * WG_E * CP * CoutP);
   while (T > 8 && ceil_div(tiles, T) < 4 * nthr) T = (T + 1) / 2;
   const int64_t units = ceil_div(tiles, T);
   T = ceil_div(tiles, units);
   const size_t vsz = (size_t)(WG_E * T * CP), dsz = (size_t)(WG_E * T * CoutP);
   const int64_t T2 = (T + 1) / 2; /* bf16: pairs of tiles, V's and D's (words) */
   const size_t psz = bf16 ? (size_t)(WG_E * T2 * (CP + CoutP)) : 0;
   const size_t per_thread =
      ((size_t)usz + (size_t)CoutP + vsz + dsz + (size_t)WG_E * CP + psz + 15) / 16 * 16;
   const size_t bytes = (size_t)nthr * per_thread * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
   if (gw) memset(gw, 0, (size_t)(g->O * K) * sizeof(float));
   if (gb) memset(gb, 0, (size_t)g->O * sizeof(float));
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *dU = scratch + (size_t)conv_thread_id() * per_thread, *gbp = dU + usz;
      float *V = gbp + CoutP, *D = V + vsz, *patch = D + dsz;
      uint32_t *Vp = (uint32_t *)(patch + WG_E * CP), *Dp = Vp + WG_E * T2 * CP;
      memset(dU, 0, (size_t)(usz + CoutP) * sizeof(float));
#pragma omp for schedule(static)
      for (int64_t u = 0; u < units; u++) {
         const int64_t t0 = u * T, n = t0 + T < tiles ? T : tiles - t0;
         if (n <= 0) continue;
         wg_gout(&P, gout, gout16, t0, n, D, gbp);
         if (!gw) continue;
         wg_input(&P, t0, n, V, patch);
         wg_wgrad(&P, n, V, D, bf16 ? Vp : NULL, bf16 ? Dp : NULL, dU);
      }
      /* sum the partials in thread order, then grad_w = G^T dU G */
      const int nt = conv_num_threads_in_team();
      if (gw) {
#pragma omp for schedule(static)
         for (int64_t ci = 0; ci < cin; ci++) {
            for (int64_t c0 = 0; c0 < CoutP; c0 += 16) {
               __m512 x[WG_E], r[18], col[6], o[3];
               for (int e = 0; e < WG_E; e++) {
                  const float *src = scratch + ((size_t)e * CP + ci) * CoutP + c0;
                  __m512 a = _mm512_load_ps(src);
                  for (int t = 1; t < nt; t++) a = _mm512_add_ps(a, _mm512_load_ps(src + (size_t)t * per_thread));
                  x[e] = a;
               }
               /* columns: r[i*6 + b] = sum_a G[a][i] x[a][b] */
               for (int b = 0; b < 6; b++) {
                  for (int a = 0; a < 6; a++) col[a] = x[a * 6 + b];
                  wg_gt(col, o);
                  for (int i = 0; i < 3; i++) r[i * 6 + b] = o[i];
               }
               float out[9][16] __attribute__((aligned(64)));
               for (int i = 0; i < 3; i++) {
                  wg_gt(r + i * 6, o);
                  for (int j = 0; j < 3; j++) _mm512_store_ps(out[i * 3 + j], o[j]);
               }
               const int64_t nco = cout - c0 < 16 ? cout - c0 : 16;
               for (int64_t l = 0; l < nco; l++)
                  for (int t = 0; t < 9; t++) gw[(c0 + l) * K + t * C + ci] = out[t][l];
            }
         }
      }
#pragma omp single
      if (gb) {
         for (int t = 0; t < nt; t++) {
            const float *src = scratch + (size_t)t * per_thread + usz;
            for (int64_t o = 0; o < cout; o++) gb[o] += src[o];
         }
      }
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

/* backward weight with more than 64 input channels (the wide schedule's layout): V and D of all
   the tiles first (threads split the tiles), then the threads take (output block, chunk of 64
   input channels) pairs: dU[36][64][OB] summed over all the tiles in L2 (wgw_*), then
   grad_w = G^T dU G, written through 16 x 16 transposes. Every grad_w element is reduced by one
   thread in a fixed order; the bias gradient sums per-thread partials over a fixed split. */
static int wg_bwdw_wide_fits(const conv_geom *g) {
   const int CP = wg_cp(g->C);
   if (CP <= 64) return 0;
   const int64_t OB = wg_block_width(g->O), CoutP = ceil_div(g->O, OB) * OB;
   const int64_t tiles = g->N * ceil_div(g->Ho, 4) * ceil_div(g->Wo, 4);
   return (int64_t)WG_E * tiles * (CP + CoutP) * (int64_t)sizeof(float) <= WG_WIDE_W;
}

/* bf16: x and gout bfloat16 (uint16_t), the products in bfloat16 (V and D packed into pairs of
   tiles, lm_wg_bf16_wgrad) */
static lm_status wg_bwdw_wide(const conv_geom *g, const void *x, const void *gout_, float *gw,
                              float *gb, int bf16_) {
   /* bf16_ 2: x and gout bfloat16, the products float32 (the float32 route of a bfloat16
      call) */
   const int io16 = bf16_ != 0, bf16 = bf16_ == 1;
   const int64_t cin = g->C, cout = g->O, K = g->K, C = g->C;
   const int CP = wg_cp(cin);
   const int64_t OB = wg_block_width(cout), nob = ceil_div(cout, OB), CoutP = nob * OB;
   const wg_prob P = wg_bwdw_prob(g, x, io16, CP, OB, nob);
   const float *gout = io16 ? NULL : gout_;
   const uint16_t *gout16 = io16 ? gout_ : NULL;
   const int64_t T = P.N * P.th * P.tw, nchunk = CP / 64;
   const int nthr = conv_threads((double)T * WG_E * CP * CoutP);
   const int64_t ves = T * CP + 16, des = T * CoutP + 16, ues = 64 * OB + 16;
   /* bfloat16 pairs of tiles: V's chunk j of pair row p at Vp + e*vpes + j*T2*64 + p*64, D's at
      Dp + e*dpes + p*CoutP (words) */
   const int64_t T2 = (T + 1) / 2, vpes = T2 * CP + 16, dpes = T2 * CoutP + 16;
   const size_t shared = (size_t)(WG_E * (ves + des)) + (bf16 ? (size_t)(WG_E * (vpes + dpes)) : 0);
   const size_t per_thread = ((size_t)(WG_E * ues) + (size_t)CoutP + (size_t)(WG_E * CP) + 15) / 16 * 16;
   const size_t bytes = (shared + (size_t)nthr * per_thread) * sizeof(float);
   float *scratch = lm_alloc(bytes);
   if (!scratch) return LM_ERR_OOM;
   float *V = scratch, *D = V + WG_E * ves;
   uint32_t *Vp = (uint32_t *)(D + WG_E * des), *Dp = Vp + WG_E * vpes;
   if (gb) memset(gb, 0, (size_t)cout * sizeof(float));
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *dU = scratch + shared + (size_t)conv_thread_id() * per_thread;
      float *gbp = dU + WG_E * ues, *patch = gbp + CoutP;
      memset(gbp, 0, (size_t)CoutP * sizeof(float));
      const int64_t nin = ceil_div(T, 4);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < nin; i++) {
         const int64_t k0 = i * 4, n = k0 + 4 < T ? 4 : T - k0;
         wg_gout_at(&P, gout, gout16, k0, n, D, k0, des, gbp);
         if (gw) wg_input_at(&P, k0, n, V, T, k0, ves, patch);
      }
      if (gw && bf16) {
#pragma omp for schedule(static)
         for (int64_t ej = 0; ej < WG_E * (nchunk + 1); ej++) {
            const int64_t e = ej / (nchunk + 1), j = ej % (nchunk + 1);
            if (j < nchunk)
               lm_wg_bf16_pack_rows(V + e * ves + j * T * 64, T, 64, 64,
                                    Vp + e * vpes + j * T2 * 64, 64);
            else
               lm_wg_bf16_pack_rows(D + e * des, T, CoutP, CoutP, Dp + e * dpes, CoutP);
         }
      }
      if (gw) {
#pragma omp for schedule(dynamic, 1)
         for (int64_t it = 0; it < nob * nchunk; it++) {
            const int64_t ob = it / nchunk, j = it % nchunk, co0 = ob * OB;
            const int64_t nvalid = cout - co0 < OB ? cout - co0 : OB;
            const int nv = (int)((nvalid + 15) / 16), rmax = wgw_rmax[nv];
            const int64_t nb = (64 + rmax - 1) / rmax, base = 64 / nb, extra = 64 % nb;
            for (int e = 0; e < WG_E; e++) {
               float *ue = dU + e * ues;
               memset(ue, 0, (size_t)(64 * OB) * sizeof(float));
               const float *ve = V + e * ves + j * T * 64, *de = D + e * des + co0;
               int64_t ci = 0;
               const uint32_t *vpe = Vp + e * vpes + j * T2 * 64, *dpe = Dp + e * dpes + co0;
               for (int64_t b = 0; b < nb; b++) {
                  const int rn = (int)(base + (b < extra));
                  if (bf16)
                     lm_wg_bf16_wgrad(nv, rn, vpe + ci, 64, dpe, CoutP, T2, ue + ci * OB, OB);
                  else
                     wgw_tab[nv][rn](ve + ci, 64, de, CoutP, T, ue + ci * OB, OB);
                  ci += rn;
               }
            }
            /* grad_w = G^T dU G, 16 input x 16 output channels at a time */
            float buf[9][16][16] __attribute__((aligned(64)));
            for (int64_t v0 = 0; v0 < nv * 16; v0 += 16) {
               const int64_t left = cout - co0 - v0;
               for (int64_t c0 = 0; c0 < 64; c0 += 16) {
                  const int64_t ci0 = j * 64 + c0, cleft = cin - ci0;
                  if (cleft <= 0) break;
                  const __mmask16 cm = cleft >= 16 ? (__mmask16)0xFFFF
                                                   : (__mmask16)((1u << cleft) - 1);
                  for (int c = 0; c < 16; c++) {
                     __m512 xv[WG_E], r[18], col[6], o[3];
                     for (int e = 0; e < WG_E; e++)
                        xv[e] = _mm512_load_ps(dU + e * ues + (c0 + c) * OB + v0);
                     for (int b = 0; b < 6; b++) {
                        for (int a = 0; a < 6; a++) col[a] = xv[a * 6 + b];
                        wg_gt(col, o);
                        for (int i = 0; i < 3; i++) r[i * 6 + b] = o[i];
                     }
                     for (int i = 0; i < 3; i++) {
                        wg_gt(r + i * 6, o);
                        for (int jj = 0; jj < 3; jj++) _mm512_store_ps(buf[i * 3 + jj][c], o[jj]);
                     }
                  }
                  for (int t = 0; t < 9; t++) {
                     __m512 rr[16];
                     for (int l = 0; l < 16; l++) rr[l] = _mm512_load_ps(buf[t][l]);
                     wg_transpose16(rr); /* rows: output channels */
                     for (int l = 0; l < 16 && l < left; l++)
                        _mm512_mask_storeu_ps(gw + (co0 + v0 + l) * K + t * C + ci0, cm, rr[l]);
                  }
               }
            }
         }
      }
#pragma omp single
      if (gb) {
         const int nt = conv_num_threads_in_team();
         for (int t = 0; t < nt; t++) {
            const float *src = scratch + shared + (size_t)t * per_thread + WG_E * ues;
            for (int64_t o = 0; o < cout; o++) gb[o] += src[o];
         }
      }
   }
   lm_free(scratch, bytes);
   return LM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * entry points
 */
/* output tile size: F(4x4,3x3), or F(2x2,3x3) when LUMEN_CONV_WINOGRAD is "2" (forward and
   backward data; the weight gradient always takes F(4x4)) */
static int wg_tile_size(int backward_data) {
   const char *v = getenv("LUMEN_CONV_WINOGRAD");
   (void)backward_data;
   if (v && v[0] == '2' && v[1] == 0) return 2;
   return 4;
}

/* LUMEN_CONV_WINOGRAD=4 (or 2): take Winograd wherever it can run, also where it is not expected
   to pay (the specs force it so) */
static int wg_forced(void) {
   const char *v = getenv("LUMEN_CONV_WINOGRAD");
   return v && (v[0] == '4' || v[0] == '2') && v[1] == 0;
}

int lm_conv_wino_usable(const conv_geom *g, int backward_data) {
   if (g->G != 1 || g->kh != 3 || g->kw != 3 || g->sh != 1 || g->sw != 1 || g->dh != 1 ||
       g->dw != 1)
      return 0;
   if (g->ph > 2 || g->pw > 2) return 0; /* the flipped form needs 2 - p >= 0 */
   const int64_t cin = backward_data ? g->O : g->C, cout = backward_data ? g->C : g->O;
   const int CP = wg_cp(cin);
   if (CP < 16) return 0;
   const int64_t ho = backward_data ? g->H : g->Ho, wo = backward_data ? g->W : g->Wo;
   if (ho < 4 || wo < 4) return 0;
   if (!conv_env_on("LUMEN_CONV_WINOGRAD")) return 0;
   if (CP > 64 && wg_tile_size(backward_data) == 4) {
      /* the wide schedule (wg_run_wide): at least WG_WIDE_MIN_TILES tiles */
      const int64_t tiles = g->N * ((ho + 3) / 4) * ((wo + 3) / 4);
      return wg_forced() || tiles >= WG_WIDE_MIN_TILES;
   }
   return CP <= 64 || wg_unit_fits(cin, cout);
}

int lm_conv_wino_bwdw_usable(const conv_geom *g) {
   if (!lm_conv_wino_usable(g, 0)) return 0;
   return lm_conv_rb_cp(g->C) >= 16 || wg_bwdw_wide_fits(g);
}


lm_status lm_conv_wino_fwd_nhwc_avx512(const conv_geom *g, const float *x, const float *w,
                                       const float *bias, const float *res, int act,
                                       float *out) {
   return wg_conv(g, 0, wg_tile_size(0), x, w, bias, res, act, out, 0);
}

lm_status lm_conv_wino_fwd_nhwc_avx512_io16(const conv_geom *g, const uint16_t *x,
                                            const float *w, const float *bias,
                                            const uint16_t *res, int act, uint16_t *out) {
   return wg_conv(g, 0, wg_tile_size(0), x, w, bias, res, act, out, 2);
}

lm_status lm_conv_wino_bwdw_nhwc_avx512(const conv_geom *g, const float *x, const float *gout,
                                        float *gw, float *gb) {
   if (lm_conv_rb_cp(g->C) < 16) return wg_bwdw_wide(g, x, gout, gw, gb, 0);
   return wg_bwdw(g, x, gout, gw, gb, 0);
}

lm_status lm_conv_wino_bwdw_nhwc_avx512_io16(const conv_geom *g, const uint16_t *x,
                                             const uint16_t *gout, float *gw, float *gb) {
   if (lm_conv_rb_cp(g->C) < 16) return wg_bwdw_wide(g, x, gout, gw, gb, 2);
   return wg_bwdw(g, x, gout, gw, gb, 2);
}

lm_status lm_conv_wino_bwdd_nhwc_avx512_io16(const conv_geom *g, const uint16_t *gout,
                                             const float *w, uint16_t *gx) {
   return wg_conv(g, 1, wg_tile_size(1), gout, w, NULL, NULL, 0, gx, 2);
}

lm_status lm_conv_wino_bwdd_nhwc_avx512(const conv_geom *g, const float *gout, const float *w,
                                        float *gx) {
   return wg_conv(g, 1, wg_tile_size(1), gout, w, NULL, NULL, 0, gx, 0);
}

/* the schedules above for the bfloat16 entry points, which are beside their products
   (conv_winograd_bf16_avx512bf16.c; conv_internal.h) */
int lm_wg_cp(int64_t cin) { return wg_cp(cin); }
int lm_wg_tile_size(int backward_data) { return wg_tile_size(backward_data); }
lm_status lm_wg_conv(const conv_geom *g, int flip, int tm, const void *src, const void *w,
                     const float *bias, const void *res, int act, void *dst, int bf16) {
   return wg_conv(g, flip, tm, src, w, bias, res, act, dst, bf16);
}
lm_status lm_wg_bwdw(const conv_geom *g, const void *x, const void *gout, float *gw, float *gb,
                     int bf16) {
   return wg_bwdw(g, x, gout, gw, gb, bf16);
}
lm_status lm_wg_bwdw_wide(const conv_geom *g, const void *x, const void *gout, float *gw,
                          float *gb, int bf16) {
   return wg_bwdw_wide(g, x, gout, gw, gb, bf16);
}
