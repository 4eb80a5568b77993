/*
 * norm.c -- batch normalisation, forward (training and eval) and backward, and the fused forms
 * used by the ResNet blocks: relu(batch_norm(x) [+ residual]) forward, and the backward of
 * batch_norm followed by a relu (the relu's gradient mask taken from its output).
 *
 * The kernels of LM_OP_BATCH_NORM / LM_OP_BATCH_NORM_BACKWARD (front end: src/ops/norm.c, which
 * checks the arguments, allocates the results and makes every operand of x's shape dense in
 * mf = x.suggest_memory_format(); the t[] order is in src/ops/norm.h). Two kernels:
 *   rows   -- channels innermost: channels-last (4-D), channels-last-3d (5-D) and any contiguous
 *             input whose spatial size is 1 (e.g. (N, C)). The data is an (M, C) matrix; the
 *             loops hold a tile of channels (up to 64 floats / 32 doubles) in registers and run
 *             over blocks of rows, so that for C <= 64 floats memory is read strictly in order.
 *             Statistics: one pass, per-thread partial sums over a range of rows (float
 *             accumulators over a few rows flushed into double), shifted by the first row so
 *             that E[x^2] - E[x]^2 does not cancel; a second pass normalises. Both passes run in
 *             one OpenMP region, each thread on the same rows, the second one backwards from
 *             where the first ended (its last rows are still in that core's cache).
 *   planes -- contiguous (N, C, S): per (n, c) plane partial sums in double, then per channel.
 * Each kernel has a baseline copy and an AVX-512 copy; lm_cpu_register_norm picks one per ISA.
 *
 * float16 / bfloat16 (the front end sends them here only in the row layout; planes get float32
 * copies there): the row kernel of norm_half.h, which reads and writes the 16-bit values and
 * computes in float32 (its AVX-512 copy in norm_half_avx512.c, the portable one below: bn_rows_half_c);
 * the scratch, the shift K and the coefficients are float32, the statistics double as for float32.
 */
#include "cpu.h"
#include "impl.h"
#include "norm_half.h"
#include "ops/norm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

enum { SROWS = 64, RROWS = 32, PLANEBLK = 1024 };

/* elements below which a pass runs on one thread: these passes are memory-bound and cheap (a
   pass over 256 K floats takes ~50 us), less than waking and joining a team costs on a busy
   machine */
#define BN_GRAIN ((int64_t)1 << 18)

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int is_half(int dt) { return dt == LM_FLOAT16 || dt == LM_BFLOAT16; }
/* the type of the scratch, the shift K and the coefficients: float32 for float32 and the halves */
static inline int comp_dt(int dt) { return dt == LM_FLOAT64 ? LM_FLOAT64 : LM_FLOAT32; }
static inline float half_ld(int dt, uint16_t h) { return dt == LM_BFLOAT16 ? lm_bf2f(h) : lm_h2f(h); }
static inline uint16_t half_st(int dt, float v) { return dt == LM_BFLOAT16 ? lm_f2bf(v) : lm_f2h(v); }

static int num_threads(void) {
#ifdef _OPENMP
   return omp_get_max_threads();
#else
   return 1;
#endif
}

/* a 1-D parameter of C elements (any floating dtype, any stride; NULL: dflt) as doubles */
static void param_load(const lm_tensor *t, int64_t C, double dflt, double *dst) {
   if (!t) {
      for (int64_t c = 0; c < C; c++) dst[c] = dflt;
      return;
   }
   const char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype), st = t->strides[0];
   for (int64_t c = 0; c < C; c++) dst[c] = lm_load_as_double(p + c * st * es, t->dtype);
}

static void param_store(lm_tensor *t, int64_t C, const double *src) {
   char *p = lm_tensor_data(t);
   const int64_t es = lm_dtype_size(t->dtype), st = t->strides[0];
   for (int64_t c = 0; c < C; c++) lm_store_from_double(p + c * st * es, t->dtype, src[c]);
}

/* geometry: (N, C, S) with layout rows (M = N*S rows of C) or planes */
typedef struct {
   int64_t N, C, S, M;
   int mf;
   int rows;
} bn_geom;

/* x has 2 or more dims (the front end checked); mf is the format x is dense in */
static void bn_geometry(const lm_tensor *x, int mf, bn_geom *g) {
   g->N = x->sizes[0];
   g->C = x->sizes[1];
   g->S = 1;
   for (int d = 2; d < x->ndim; d++) g->S *= x->sizes[d];
   g->M = g->N * g->S;
   g->mf = mf;
   g->rows = mf == LM_CHANNELS_LAST || mf == LM_CHANNELS_LAST_3D || g->S == 1;
}

/* is the result y a block allocated by the front end (fresh) of 1 MiB or more that was cold when
   handed out (lm_tensor_block_cold)? A kernel that writes all of it may then use streaming
   stores, and tells the allocator so with lm_tensor_note_streamed */
static int bn_out_cold(const lm_tensor *y, int fresh) {
   return fresh && y && y->storage && y->storage->nbytes >= ((int64_t)1 << 20) &&
          lm_tensor_block_cold(y);
}

/* ------------------------------------------------------------------------------------------ */
/* kernels                                                                                    */

/* 64-byte vectors (GCC / Clang vector extensions): one AVX-512 register in the AVX-512 copies,
   split by the compiler into narrower registers in the baseline copies. The _u types are the
   unaligned, aliasing views used for loads and stores. */
typedef float bn_vf __attribute__((vector_size(64)));
typedef float bn_vf_u __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t bn_vfi __attribute__((vector_size(64)));
typedef double bn_vd __attribute__((vector_size(64)));
typedef double bn_vd_u __attribute__((vector_size(64), aligned(8), may_alias));
typedef int64_t bn_vdi __attribute__((vector_size(64)));
/* 16 doubles: a float vector widened for the flush of its sums into double */
typedef double bn_vw16 __attribute__((vector_size(128)));
typedef double bn_vw16_u __attribute__((vector_size(128), aligned(8), may_alias));
/* 16-byte vectors (SSE registers) for the baseline copies of the row kernels */
typedef float bn_vf4 __attribute__((vector_size(16)));
typedef float bn_vf4_u __attribute__((vector_size(16), aligned(4), may_alias));
typedef int32_t bn_vfi4 __attribute__((vector_size(16)));
typedef double bn_vw4 __attribute__((vector_size(32)));
/* the AVX2 row copy: 8 floats, the sums widened to 8 doubles */
typedef float bn_vf8 __attribute__((vector_size(32)));
typedef float bn_vf8_u __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t bn_vfi8 __attribute__((vector_size(32)));
typedef double bn_vw8 __attribute__((vector_size(64)));
typedef double bn_vw8_u __attribute__((vector_size(64), aligned(8), may_alias));
typedef double bn_vw4_u __attribute__((vector_size(32), aligned(8), may_alias));
typedef double bn_vd2 __attribute__((vector_size(16)));
typedef double bn_vd2_u __attribute__((vector_size(16), aligned(8), may_alias));
typedef int64_t bn_vdi2 __attribute__((vector_size(16)));

#define VLD(VU, p) (*(const VU *)(const void *)(p))
#define VST(VU, p, v) (*(VU *)(void *)(p) = (v))
/* v where m > 0 or m is NaN (relu_backward's "m <= 0 ? 0 : v"), else 0 */
#define VMASK(VI, V, v, m, zero) ((V)((VI)(v) & ~(VI)((m) <= (zero))))
/* relu keeping NaN: v < 0 ? 0 : v */
#define VRELU(VI, V, v, zero) ((V)((VI)(v) & ~(VI)((v) < (zero))))

/*
 * sums: s1[c] = sum(x - K[c]), s2[c] = sum((x - K[c])^2) with K[c] = the first row / element of
 * channel c (the shift that keeps the one-pass variance from cancelling); with dy:
 * s1[c] = sum(g), s2[c] = sum(g * (x - K[c])) where g = dy, or dy masked by mk (g = 0 where
 * mk <= 0: the gradient of a relu whose output is mk), also stored into gm when gm != NULL.
 *
 * affine: y = A (a' - Ma) + B (b - Mb) + D [+ res] [relu], a' = a masked by mk (may be NULL);
 * b, res may be NULL; cf = A, Ma, B, Mb, D (C each).
 *
 * Plane kernels (contiguous (N, C, S)): DEFINE_BN, below. Row kernels (channels innermost, an
 * (M, C) matrix): DEFINE_BN_ROWS. Those walk blocks of rows (SROWS for the sums, RROWS for the
 * affine map); in a block, channels go in tiles of NS / NV vectors (VL = sizeof(V) / sizeof(T)
 * channels each) held in registers while the rows of the block stream through, so that with
 * C <= NV VL each pass reads and writes memory strictly in order. The channels past the last
 * multiple of 64 bytes (C % (64 / sizeof(T))) take one more vector with masked loads and stores
 * in the AVX-512 copies, a scalar loop in the baseline ones. Both passes of an op (the sums, then
 * the affine map that needs them) run in one parallel region: each thread takes the same rows in
 * both and runs the second backwards, from the rows the first left in its cache.
 * part: nthreads * 2 * C doubles of scratch; facc: nthreads * 2 * C of T.
 */
#define DEFINE_BN(T, S, ATTR, V, VU, VI)                                                           \
   /* per (n, c) plane sums into part[2 * (n*C + c) + {0,1}], then per channel; each float     \
      lane sums at most PLANEBLK / (4 VL) values before the flush into double */                 \
   ATTR static void planes_sums_##S(const T *x, const T *dy, const T *mk, T *gm, const T *K,       \
                                    int64_t N, int64_t C, int64_t Sz, double *part, double *s1,    \
                                    double *s2) {                                                  \
      enum { VL = 64 / (int)sizeof(T) };                                                           \
      const int64_t planes = N * C;                                                                \
      _Pragma("omp parallel for schedule(static) if (planes * Sz > BN_GRAIN)")                     \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         const int64_t c = pl % C;                                                                 \
         const T *xp = x + pl * Sz, *gp = dy ? dy + pl * Sz : NULL;                                \
         const T *mp = mk ? mk + pl * Sz : NULL;                                                   \
         T *op = gm ? gm + pl * Sz : NULL;                                                         \
         const T k = K[c];                                                                         \
         const V zero = {0};                                                                       \
         const V vk = zero + k;                                                                    \
         double d1 = 0, d2 = 0;                                                                    \
         for (int64_t b0 = 0; b0 < Sz; b0 += PLANEBLK) {                                           \
            const int64_t be = min64(b0 + PLANEBLK, Sz);                                           \
            V u0 = zero, u1 = zero, u2 = zero, u3 = zero;                                          \
            V q0 = zero, q1 = zero, q2 = zero, q3 = zero;                                          \
            T su = 0, sq = 0;                                                                      \
            int64_t i = b0;                                                                        \
            if (mp) {                                                                              \
               for (; i + VL <= be; i += VL) {                                                     \
                  V g0 = VMASK(VI, V, VLD(VU, gp + i), VLD(VU, mp + i), zero);                     \
                  if (op) VST(VU, op + i, g0);                                                     \
                  u0 += g0, q0 += g0 * (VLD(VU, xp + i) - vk);                                     \
               }                                                                                   \
               for (; i < be; i++) {                                                               \
                  T g = mp[i] <= 0 ? (T)0 : gp[i];                                                 \
                  if (op) op[i] = g;                                                               \
                  su += g, sq += g * (xp[i] - k);                                                  \
               }                                                                                   \
            } else if (gp) {                                                                       \
               _Pragma("GCC unroll 1") for (; i + 4 * VL <= be; i += 4 * VL) {                     \
                  V g0 = VLD(VU, gp + i), g1 = VLD(VU, gp + i + VL);                               \
                  V g2 = VLD(VU, gp + i + 2 * VL), g3 = VLD(VU, gp + i + 3 * VL);                  \
                  u0 += g0, u1 += g1, u2 += g2, u3 += g3;                                          \
                  q0 += g0 * (VLD(VU, xp + i) - vk), q1 += g1 * (VLD(VU, xp + i + VL) - vk);       \
                  q2 += g2 * (VLD(VU, xp + i + 2 * VL) - vk);                                      \
                  q3 += g3 * (VLD(VU, xp + i + 3 * VL) - vk);                                      \
               }                                                                                   \
               for (; i + VL <= be; i += VL) {                                                     \
                  V g0 = VLD(VU, gp + i);                                                          \
                  u0 += g0, q0 += g0 * (VLD(VU, xp + i) - vk);                                     \
               }                                                                                   \
               for (; i < be; i++) su += gp[i], sq += gp[i] * (xp[i] - k);                         \
            } else {                                                                               \
               _Pragma("GCC unroll 1") for (; i + 4 * VL <= be; i += 4 * VL) {                     \
                  V e0 = VLD(VU, xp + i) - vk, e1 = VLD(VU, xp + i + VL) - vk;                     \
                  V e2 = VLD(VU, xp + i + 2 * VL) - vk, e3 = VLD(VU, xp + i + 3 * VL) - vk;        \
                  u0 += e0, u1 += e1, u2 += e2, u3 += e3;                                          \
                  q0 += e0 * e0, q1 += e1 * e1, q2 += e2 * e2, q3 += e3 * e3;                      \
               }                                                                                   \
               for (; i + VL <= be; i += VL) {                                                     \
                  V e0 = VLD(VU, xp + i) - vk;                                                     \
                  u0 += e0, q0 += e0 * e0;                                                         \
               }                                                                                   \
               for (; i < be; i++) {                                                               \
                  T d = xp[i] - k;                                                                 \
                  su += d, sq += d * d;                                                            \
               }                                                                                   \
            }                                                                                      \
            u0 = (u0 + u1) + (u2 + u3);                                                            \
            q0 = (q0 + q1) + (q2 + q3);                                                            \
            for (int j = 0; j < VL; j++) {                                                         \
               d1 += (double)u0[j];                                                                \
               d2 += (double)q0[j];                                                                \
            }                                                                                      \
            d1 += (double)su;                                                                      \
            d2 += (double)sq;                                                                      \
         }                                                                                         \
         part[2 * pl] = d1;                                                                        \
         part[2 * pl + 1] = d2;                                                                    \
      }                                                                                            \
      for (int64_t c = 0; c < C; c++) s1[c] = s2[c] = 0;                                           \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         s1[pl % C] += part[2 * pl];                                                               \
         s2[pl % C] += part[2 * pl + 1];                                                           \
      }                                                                                            \
   }                                                                                               \
   ATTR static void planes_affine_##S(const T *a, const T *mk, const T *b, const T *res, T *y,     \
                                      int64_t N, int64_t C, int64_t Sz, const T *cf, int relu) {   \
      enum { VL = 64 / (int)sizeof(T) };                                                           \
      const int64_t planes = N * C;                                                                \
      _Pragma("omp parallel for schedule(static) if (planes * Sz > BN_GRAIN)")                     \
      for (int64_t pl = 0; pl < planes; pl++) {                                                    \
         const int64_t c = pl % C;                                                                 \
         const T *ap = a + pl * Sz;                                                                \
         const T *mp = mk ? mk + pl * Sz : NULL;                                                   \
         const T *bp = b ? b + pl * Sz : NULL, *rp = res ? res + pl * Sz : NULL;                   \
         T *yp = y + pl * Sz;                                                                      \
         const T ac = cf[c], ma = cf[C + c], dc = cf[4 * C + c];                                   \
         const T bc = cf[2 * C + c], mb = cf[3 * C + c];                                           \
         const V zero = {0};                                                                       \
         const V vA = zero + ac, vMa = zero + ma, vD = zero + dc;                                  \
         const V vB = zero + bc, vMb = zero + mb;                                                  \
         int64_t i = 0;                                                                            \
         if (bp) {                                                                                 \
            for (; i + VL <= Sz; i += VL) {                                                        \
               V av = VLD(VU, ap + i);                                                             \
               if (mp) av = VMASK(VI, V, av, VLD(VU, mp + i), zero);                               \
               VST(VU, yp + i, vA * (av - vMa) + vB * (VLD(VU, bp + i) - vMb) + vD);               \
            }                                                                                      \
         } else if (!mp && !rp && !relu) {                                                         \
            for (; i + VL <= Sz; i += VL) VST(VU, yp + i, vA * (VLD(VU, ap + i) - vMa) + vD);      \
         } else {                                                                                  \
            for (; i + VL <= Sz; i += VL) {                                                        \
               V av = VLD(VU, ap + i);                                                             \
               if (mp) av = VMASK(VI, V, av, VLD(VU, mp + i), zero);                               \
               V t = vA * (av - vMa) + vD;                                                         \
               if (rp) t += VLD(VU, rp + i);                                                       \
               if (relu) t = VRELU(VI, V, t, zero);                                                \
               VST(VU, yp + i, t);                                                                 \
            }                                                                                      \
         }                                                                                         \
         for (; i < Sz; i++) {                                                                     \
            T av = ap[i];                                                                          \
            if (mp && mp[i] <= 0) av = 0;                                                          \
            T t;                                                                                   \
            if (bp)                                                                                \
               t = ac * (av - ma) + bc * (bp[i] - mb) + dc;                                        \
            else                                                                                   \
               t = ac * (av - ma) + dc;                                                            \
            if (rp) t += rp[i];                                                                    \
            if (relu && t < 0) t = 0;                                                              \
            yp[i] = t;                                                                             \
         }                                                                                         \
      }                                                                                            \
   }

/* a store of the affine map's result: streaming (non-temporal) when the output block is cold and
   the copy has a streaming store (NTST), else ordinary */
#define BN_YST(NTST, VU, p, v)                                                                     \
   do {                                                                                            \
      if (stream)                                                                                  \
         NTST(VU, p, v);                                                                           \
      else                                                                                         \
         VST(VU, p, v);                                                                            \
   } while (0)
#if defined(__GNUC__) && defined(__x86_64__)
#define BN_NTST_F32_512(VU, p, v) _mm512_stream_ps((float *)(void *)(p), (__m512)(v))
#define BN_NTST_F64_512(VU, p, v) _mm512_stream_pd((double *)(void *)(p), (__m512d)(v))
#define BN_SFENCE() _mm_sfence()
#else
#define BN_NTST_F32_512 VST
#define BN_NTST_F64_512 VST
#define BN_SFENCE() ((void)0)
#endif

#define DEFINE_BN_ROWS(T, S, ATTR, V, VU, VI, VW, VWU, NV, NS, MLD, MST, MASKED, NTST)             \
   /* s1, s2 partial sums of rows [rb, re) (re - rb <= SROWS), channels [cb, cb + nv VL), into     \
      this thread's p1, p2 (nv <= NS: a constant once inlined). Rows r = rb + 4i + j go to         \
      accumulator j (the rows past the last group of four to accumulator 0), which each sum at     \
      most SROWS / 4 values before (u0 + u1) + (u2 + u3) is flushed into double. Per channel,      \
      that order does not depend on the vector width or the tile, so all copies give the same      \
      sums (the same as the kernels before the tiles, to the bit). The masked gradient goes        \
      through the same accumulators as an unmasked one, so that it sums exactly as the same        \
      gradient masked beforehand would. */                                                         \
   ATTR static inline __attribute__((always_inline)) void rows_sums_blk_##S(                       \
      const T *x, const T *dy, const T *mk, T *gm, const T *K, int64_t rb, int64_t re, int64_t C,  \
      int64_t cb, const int nv, double *p1, double *p2) {                                          \
      enum { VL = (int)(sizeof(V) / sizeof(T)) };                                                  \
      const V zero = {0};                                                                          \
      V k[NS], u[4][NS], q[4][NS];                                                                 \
      _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                       \
         k[j] = VLD(VU, K + cb + j * VL);                                                          \
         _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) u[i][j] = q[i][j] = zero;             \
      }                                                                                            \
      int64_t r = rb;                                                                              \
      if (!dy) {                                                                                   \
         _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                               \
                  const V d = VLD(VU, x + (r + i) * C + cb + j * VL) - k[j];                       \
                  u[i][j] += d, q[i][j] += d * d;                                                  \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
         for (; r < re; r++) {                                                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               const V d = VLD(VU, x + r * C + cb + j * VL) - k[j];                                \
               u[0][j] += d, q[0][j] += d * d;                                                     \
            }                                                                                      \
         }                                                                                         \
      } else if (!mk) {                                                                            \
         _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                               \
                  const int64_t o = (r + i) * C + cb + j * VL;                                     \
                  const V g = VLD(VU, dy + o);                                                     \
                  u[i][j] += g, q[i][j] += g * (VLD(VU, x + o) - k[j]);                            \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
         for (; r < re; r++) {                                                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               const int64_t o = r * C + cb + j * VL;                                              \
               const V g = VLD(VU, dy + o);                                                        \
               u[0][j] += g, q[0][j] += g * (VLD(VU, x + o) - k[j]);                               \
            }                                                                                      \
         }                                                                                         \
      } else {                                                                                     \
         _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                               \
                  const int64_t o = (r + i) * C + cb + j * VL;                                     \
                  const V g = VMASK(VI, V, VLD(VU, dy + o), VLD(VU, mk + o), zero);                \
                  if (gm) VST(VU, gm + o, g);                                                      \
                  u[i][j] += g, q[i][j] += g * (VLD(VU, x + o) - k[j]);                            \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
         for (; r < re; r++) {                                                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                 \
               const int64_t o = r * C + cb + j * VL;                                              \
               const V g = VMASK(VI, V, VLD(VU, dy + o), VLD(VU, mk + o), zero);                   \
               if (gm) VST(VU, gm + o, g);                                                         \
               u[0][j] += g, q[0][j] += g * (VLD(VU, x + o) - k[j]);                               \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      _Pragma("GCC unroll 4") for (int j = 0; j < nv; j++) {                                       \
         double *d1 = p1 + cb + j * VL, *d2 = p2 + cb + j * VL;                                    \
         const V su = (u[0][j] + u[1][j]) + (u[2][j] + u[3][j]);                                   \
         const V sq = (q[0][j] + q[1][j]) + (q[2][j] + q[3][j]);                                   \
         VST(VWU, d1, VLD(VWU, d1) + __builtin_convertvector(su, VW));                             \
         VST(VWU, d2, VLD(VWU, d2) + __builtin_convertvector(sq, VW));                             \
      }                                                                                            \
   }                                                                                               \
   /* y = A (a' - Ma) + B (b - Mb) + D [+ res] [relu] for rows [rb, re), channels                  \
      [cb, cb + nv VL): the coefficients stay in registers over the rows */                        \
   ATTR static inline __attribute__((always_inline)) void rows_affine_blk_##S(                     \
      const T *a, const T *mk, const T *b, const T *res, T *y, int64_t rb, int64_t re, int64_t C,  \
      int64_t cb, const int nv, const T *cf, int relu, int stream) {                               \
      enum { VL = (int)(sizeof(V) / sizeof(T)) };                                                  \
      const V zero = {0};                                                                          \
      V vA[NV], vMa[NV], vD[NV];                                                                   \
      _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                                       \
         vA[j] = VLD(VU, cf + cb + j * VL);                                                        \
         vMa[j] = VLD(VU, cf + C + cb + j * VL);                                                   \
         vD[j] = VLD(VU, cf + 4 * C + cb + j * VL);                                                \
      }                                                                                            \
      if (b) {                                                                                     \
         V vB[NV], vMb[NV];                                                                        \
         _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                                    \
            vB[j] = VLD(VU, cf + 2 * C + cb + j * VL);                                             \
            vMb[j] = VLD(VU, cf + 3 * C + cb + j * VL);                                            \
         }                                                                                         \
         if (mk) {                                                                                 \
            for (int64_t r = re - 1; r >= rb; r--) {                                               \
               const int64_t o = r * C + cb;                                                       \
               _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                              \
                  const int64_t oj = o + j * VL;                                                   \
                  const V av = VMASK(VI, V, VLD(VU, a + oj), VLD(VU, mk + oj), zero);              \
                  const V t = vA[j] * (av - vMa[j]) + vB[j] * (VLD(VU, b + oj) - vMb[j]) + vD[j];  \
                  BN_YST(NTST, VU, y + oj, t);                                                     \
               }                                                                                   \
            }                                                                                      \
         } else {                                                                                  \
            for (int64_t r = re - 1; r >= rb; r--) {                                               \
               const int64_t o = r * C + cb;                                                       \
               _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                              \
                  const int64_t oj = o + j * VL;                                                   \
                  const V t = vA[j] * (VLD(VU, a + oj) - vMa[j]) +                                 \
                              vB[j] * (VLD(VU, b + oj) - vMb[j]) + vD[j];                          \
                  BN_YST(NTST, VU, y + oj, t);                                                     \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      } else if (!mk && !res && !relu) {                                                           \
         for (int64_t r = re - 1; r >= rb; r--) {                                                  \
            const int64_t o = r * C + cb;                                                          \
            _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                                 \
               const int64_t oj = o + j * VL;                                                      \
               const V t = vA[j] * (VLD(VU, a + oj) - vMa[j]) + vD[j];                             \
               BN_YST(NTST, VU, y + oj, t);                                                        \
            }                                                                                      \
         }                                                                                         \
      } else {                                                                                     \
         for (int64_t r = re - 1; r >= rb; r--) {                                                  \
            const int64_t o = r * C + cb;                                                          \
            _Pragma("GCC unroll 8") for (int j = 0; j < nv; j++) {                                 \
               const int64_t oj = o + j * VL;                                                      \
               V av = VLD(VU, a + oj);                                                             \
               if (mk) av = VMASK(VI, V, av, VLD(VU, mk + oj), zero);                              \
               V t = vA[j] * (av - vMa[j]) + vD[j];                                                \
               if (res) t += VLD(VU, res + oj);                                                    \
               if (relu) t = VRELU(VI, V, t, zero);                                                \
               BN_YST(NTST, VU, y + oj, t);                                                        \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* the last C % VL channels (n of them) of rows [rb, re) as one vector with masked loads and    \
      stores (the AVX-512 copies; the baseline ones take the scalar loops of rows_run) */          \
   ATTR static inline __attribute__((always_inline)) void rows_sums_tail_##S(                      \
      const T *x, const T *dy, const T *mk, T *gm, const T *K, int64_t rb, int64_t re, int64_t C,  \
      int64_t cb, int n, double *p1, double *p2) {                                                 \
      const V zero = {0};                                                                          \
      const V k = MLD(V, K + cb, n);                                                               \
      V u = zero, q = zero;                                                                        \
      for (int64_t r = rb; r < re; r++) {                                                          \
         const int64_t o = r * C + cb;                                                             \
         if (!dy) {                                                                                \
            const V d = MLD(V, x + o, n) - k;                                                      \
            u += d, q += d * d;                                                                    \
         } else {                                                                                  \
            V g = MLD(V, dy + o, n);                                                               \
            if (mk) {                                                                              \
               g = VMASK(VI, V, g, MLD(V, mk + o, n), zero);                                       \
               if (gm) MST(gm + o, g, n);                                                          \
            }                                                                                      \
            u += g, q += g * (MLD(V, x + o, n) - k);                                               \
         }                                                                                         \
      }                                                                                            \
      for (int j = 0; j < n; j++) {                                                                \
         p1[cb + j] += (double)u[j];                                                               \
         p2[cb + j] += (double)q[j];                                                               \
      }                                                                                            \
   }                                                                                               \
   ATTR static inline __attribute__((always_inline)) void rows_affine_tail_##S(                    \
      const T *a, const T *mk, const T *b, const T *res, T *y, int64_t rb, int64_t re, int64_t C,  \
      int64_t cb, int n, const T *cf, int relu) {                                                  \
      const V zero = {0};                                                                          \
      const V vA = MLD(V, cf + cb, n), vMa = MLD(V, cf + C + cb, n);                               \
      const V vD = MLD(V, cf + 4 * C + cb, n);                                                     \
      const V vB = MLD(V, cf + 2 * C + cb, n), vMb = MLD(V, cf + 3 * C + cb, n);                   \
      for (int64_t r = re - 1; r >= rb; r--) {                                                     \
         const int64_t o = r * C + cb;                                                             \
         V av = MLD(V, a + o, n);                                                                  \
         if (mk) av = VMASK(VI, V, av, MLD(V, mk + o, n), zero);                                   \
         V t;                                                                                      \
         if (b)                                                                                    \
            t = vA * (av - vMa) + vB * (MLD(V, b + o, n) - vMb) + vD;                              \
         else                                                                                      \
            t = vA * (av - vMa) + vD;                                                              \
         if (res) t += MLD(V, res + o, n);                                                         \
         if (relu) t = VRELU(VI, V, t, zero);                                                      \
         MST(y + o, t, n);                                                                         \
      }                                                                                            \
   }                                                                                               \
   /* [sums of the rows (K != NULL)], then prep(ctx) on one thread (NULL: none), then              \
      [y = affine (y != NULL)], all in one parallel region. Each thread takes the same range of    \
      rows in both passes and runs the second one backwards, from the rows the first pass left     \
      in its cache. */                                                                             \
   ATTR static void rows_run_##S(const T *x, const T *dy, const T *mk, T *gm, const T *K,          \
                                 int64_t M, int64_t C, double *part, T *facc, double *s1,          \
                                 double *s2, void (*prep)(void *), void *ctx, const T *a,          \
                                 const T *amk, const T *b, const T *res, T *y, const T *cf,        \
                                 int relu, int stream) {                                           \
      enum { VL = (int)(sizeof(V) / sizeof(T)), TW = NV * VL, TS = NS * VL };                      \
      /* the vector loops take the channels below a multiple of 64 bytes (VL, or a few VL in the   \
         baseline copies), the others the tail: the same split in every copy, so that a            \
         channel's sums go through the same additions whatever the copy */                         \
      const int64_t Cv = C - C % (64 / (int64_t)sizeof(T)), Ct = Cv - Cv % TW, Cs = Cv - Cv % TS;  \
      if (!K && prep) {                                                                            \
         prep(ctx);                                                                                \
         prep = NULL;                                                                              \
      }                                                                                            \
      _Pragma("omp parallel if (M * C > BN_GRAIN)")                                                \
      {                                                                                            \
         int tid = 0, nth = 1;                                                                     \
         LM_OMP_TID(tid, nth);                                                                     \
         const int64_t r0 = M * tid / nth, r1 = M * (tid + 1) / nth;                               \
         if (K) {                                                                                  \
            double *p1 = part + (size_t)tid * 2 * C, *p2 = p1 + C;                                 \
            T *a1 = facc + (size_t)tid * 2 * C, *a2 = a1 + C;                                      \
            for (int64_t c = 0; c < C; c++) p1[c] = p2[c] = 0, a1[c] = a2[c] = 0;                  \
            for (int64_t rb = r0; rb < r1; rb += SROWS) {                                          \
               const int64_t re = min64(rb + SROWS, r1);                                           \
               int64_t cb = 0;                                                                     \
               for (; cb < Cs; cb += TS)                                                           \
                  rows_sums_blk_##S(x, dy, mk, gm, K, rb, re, C, cb, NS, p1, p2);                  \
               for (; cb < Cv; cb += VL)                                                           \
                  rows_sums_blk_##S(x, dy, mk, gm, K, rb, re, C, cb, 1, p1, p2);                   \
               if (MASKED && Cv < C) {                                                             \
                  rows_sums_tail_##S(x, dy, mk, gm, K, rb, re, C, Cv, (int)(C - Cv), p1, p2);      \
               } else if (Cv < C) {                                                                \
                  for (int64_t r = rb; r < re; r++) {                                              \
                     const T *xr = x + r * C;                                                      \
                     if (!dy) {                                                                    \
                        for (int64_t c = Cv; c < C; c++) {                                         \
                           T d = xr[c] - K[c];                                                     \
                           a1[c] += d;                                                             \
                           a2[c] += d * d;                                                         \
                        }                                                                          \
                     } else {                                                                      \
                        const T *gr = dy + r * C, *mr = mk ? mk + r * C : NULL;                    \
                        for (int64_t c = Cv; c < C; c++) {                                         \
                           T g = gr[c];                                                            \
                           if (mr) {                                                               \
                              if (mr[c] <= 0) g = 0;                                               \
                              if (gm) gm[r * C + c] = g;                                           \
                           }                                                                       \
                           a1[c] += g;                                                             \
                           a2[c] += g * (xr[c] - K[c]);                                            \
                        }                                                                          \
                     }                                                                             \
                  }                                                                                \
                  for (int64_t c = Cv; c < C; c++) {                                               \
                     p1[c] += a1[c];                                                               \
                     p2[c] += a2[c];                                                               \
                     a1[c] = a2[c] = 0;                                                            \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
         if (K) {                                                                                  \
            _Pragma("omp barrier")                                                                 \
            if (tid == 0) {                                                                        \
               for (int64_t c = 0; c < C; c++) s1[c] = s2[c] = 0;                                  \
               for (int t = 0; t < nth; t++) {                                                     \
                  const double *p1 = part + (size_t)t * 2 * C, *p2 = p1 + C;                       \
                  for (int64_t c = 0; c < C; c++) {                                                \
                     s1[c] += p1[c];                                                               \
                     s2[c] += p2[c];                                                               \
                  }                                                                                \
               }                                                                                   \
               if (prep) prep(ctx);                                                                \
            }                                                                                      \
            if (y) {                                                                               \
               _Pragma("omp barrier")                                                              \
            }                                                                                      \
         }                                                                                         \
         if (y) {                                                                                  \
            for (int64_t re = r1; re > r0; re -= RROWS) {                                          \
               const int64_t rb = re - RROWS > r0 ? re - RROWS : r0;                               \
               int64_t cb = 0;                                                                     \
               for (; cb < Ct; cb += TW)                                                           \
                  rows_affine_blk_##S(a, amk, b, res, y, rb, re, C, cb, NV, cf, relu,             \
                                      stream);                                                     \
               for (; cb < Cv; cb += VL)                                                           \
                  rows_affine_blk_##S(a, amk, b, res, y, rb, re, C, cb, 1, cf, relu, stream);      \
               if (MASKED && Cv < C) {                                                             \
                  rows_affine_tail_##S(a, amk, b, res, y, rb, re, C, Cv, (int)(C - Cv), cf, relu); \
               } else if (Cv < C) {                                                                \
                  const T *A = cf, *Ma = cf + C, *B = cf + 2 * C, *Mb = cf + 3 * C;                \
                  const T *D = cf + 4 * C;                                                         \
                  for (int64_t r = re - 1; r >= rb; r--) {                                         \
                     const T *ar = a + r * C, *mr = amk ? amk + r * C : NULL;                      \
                     T *yr = y + r * C;                                                            \
                     for (int64_t c = Cv; c < C; c++) {                                            \
                        T av = ar[c];                                                              \
                        if (mr && mr[c] <= 0) av = 0;                                              \
                        T t;                                                                       \
                        if (b)                                                                     \
                           t = A[c] * (av - Ma[c]) + B[c] * (b[r * C + c] - Mb[c]) + D[c];         \
                        else                                                                       \
                           t = A[c] * (av - Ma[c]) + D[c];                                         \
                        if (res) t += res[r * C + c];                                              \
                        if (relu && t < 0) t = 0;                                                  \
                        yr[c] = t;                                                                 \
                     }                                                                             \
                  }                                                                                \
               }                                                                                   \
            }                                                                                      \
            if (stream) BN_SFENCE();                                                               \
         }                                                                                         \
      }                                                                                            \
   }

#ifdef _OPENMP
#define LM_OMP_TID(tid, nth)                                                                       \
   do {                                                                                            \
      tid = omp_get_thread_num();                                                                  \
      nth = omp_get_num_threads();                                                                 \
   } while (0)
#else
#define LM_OMP_TID(tid, nth) ((void)0)
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#define LM_AVX512_FN __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#define BN_HAVE_AVX512 1
/* (ISO C: no contraction into FMA, so this copy's sums and maps are the baseline's, bit for bit) */
#define LM_AVX2_FN __attribute__((target("avx2,fma")))
#define BN_HAVE_AVX2 1
#else
#define LM_AVX512_FN
#define BN_HAVE_AVX512 0
#define LM_AVX2_FN
#define BN_HAVE_AVX2 0
#endif

/* the first n (< VL) elements of a vector of type V: loads (zero in the other lanes) and stores;
   portable loops (compiled in the baseline copies, never run there), and AVX-512 masked moves */
#define BN_MLD_LOOP(V, p, n)                                                                       \
   __extension__({                                                                                 \
      V v_ = {0};                                                                                  \
      __typeof__(p) p_ = (p);                                                                      \
      for (int i_ = 0; i_ < (n); i_++) v_[i_] = p_[i_];                                            \
      v_;                                                                                          \
   })
#define BN_MST_LOOP(p, v, n)                                                                       \
   do {                                                                                            \
      __typeof__(p) p_ = (p);                                                                      \
      for (int i_ = 0; i_ < (n); i_++) p_[i_] = (v)[i_];                                           \
   } while (0)
#if defined(__GNUC__) && defined(__x86_64__)
#define BN_MASKED 1
#define bn_mld_f32_512(V, p, n) ((V)_mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p)))
#define bn_mst_f32_512(p, v, n)                                                                    \
   _mm512_mask_storeu_ps((p), (__mmask16)((1u << (n)) - 1u), (__m512)(v))
#define bn_mld_f64_512(V, p, n) ((V)_mm512_maskz_loadu_pd((__mmask8)((1u << (n)) - 1u), (p)))
#define bn_mst_f64_512(p, v, n)                                                                    \
   _mm512_mask_storeu_pd((p), (__mmask8)((1u << (n)) - 1u), (__m512d)(v))
#else
#define BN_MASKED 0
#define bn_mld_f32_512 BN_MLD_LOOP
#define bn_mst_f32_512 BN_MST_LOOP
#define bn_mld_f64_512 BN_MLD_LOOP
#define bn_mst_f64_512 BN_MST_LOOP
#endif

/* a baseline copy and an AVX-512 copy (registered when lm_cpu_isa() says AVX-512 is in use) */
DEFINE_BN(float, f32, , bn_vf, bn_vf_u, bn_vfi)
DEFINE_BN(double, f64, , bn_vd, bn_vd_u, bn_vdi)
DEFINE_BN(float, f32_512, LM_AVX512_FN, bn_vf, bn_vf_u, bn_vfi)
DEFINE_BN(double, f64_512, LM_AVX512_FN, bn_vd, bn_vd_u, bn_vdi)
/* the row kernels. Baseline copies: 16-byte (SSE) vectors, tiles of 2 vectors for the affine
   map and 1 for the sums (4 accumulators each, in 16 registers). AVX-512 copies: tiles of 4
   vectors (64 floats / 32 doubles) for both; the sums' 4 x 8 accumulators do not all fit in the
   32 registers, the compiler keeps a few in the cache, which still beats walking the rows
   twice. */
DEFINE_BN_ROWS(float, f32, , bn_vf4, bn_vf4_u, bn_vfi4, bn_vw4, bn_vw4_u, 2, 1, BN_MLD_LOOP,
               BN_MST_LOOP, 0, VST)
DEFINE_BN_ROWS(double, f64, , bn_vd2, bn_vd2_u, bn_vdi2, bn_vd2, bn_vd2_u, 2, 1, BN_MLD_LOOP,
               BN_MST_LOOP, 0, VST)
/* AVX2 copy of the float32 rows (batch_norm_avx2): 8-float vectors, tiles of 2 for the affine map
   and 1 for the sums, as the baseline's in 16 ymm registers. The portable copy is compiled for
   x86-64-v2 (4-float vectors): RegNet's training step spent 15 % of its time in it on a Zen 3 */
DEFINE_BN_ROWS(float, f32_256, LM_AVX2_FN, bn_vf8, bn_vf8_u, bn_vfi8, bn_vw8, bn_vw8_u, 2, 1,
               BN_MLD_LOOP, BN_MST_LOOP, 0, VST)
DEFINE_BN_ROWS(float, f32_512, LM_AVX512_FN, bn_vf, bn_vf_u, bn_vfi, bn_vw16, bn_vw16_u, 4, 4,
               bn_mld_f32_512, bn_mst_f32_512, BN_MASKED, BN_NTST_F32_512)
DEFINE_BN_ROWS(double, f64_512, LM_AVX512_FN, bn_vd, bn_vd_u, bn_vdi, bn_vd, bn_vd_u, 4, 4,
               bn_mld_f64_512, bn_mst_f64_512, BN_MASKED, BN_NTST_F64_512)

/* the portable copy of the half row kernel (norm_half.h): float32 per-channel accumulators
   (facc: nthreads * 2 * C floats) over blocks of SROWS rows, flushed into double */
static void bn_rows_half_c(const lm_bn_half_args *p, float *facc) {
   const int64_t M = p->M, C = p->C;
   const int dt = p->dt;
   void (*prep)(void *) = p->prep;
   if (!p->K && prep) {
      prep(p->ctx);
      prep = NULL;
   }
#pragma omp parallel if (M * C > BN_GRAIN)
   {
      int tid = 0, nth = 1;
      LM_OMP_TID(tid, nth);
      const int64_t r0 = M * tid / nth, r1 = M * (tid + 1) / nth;
      if (p->K) {
         double *p1 = p->part + (size_t)tid * 2 * (size_t)C, *p2 = p1 + C;
         float *a1 = facc + (size_t)tid * 2 * (size_t)C, *a2 = a1 + C;
         for (int64_t c = 0; c < C; c++) p1[c] = p2[c] = 0, a1[c] = a2[c] = 0;
         for (int64_t rb = r0; rb < r1; rb += SROWS) {
            const int64_t re = min64(rb + SROWS, r1);
            for (int64_t r = rb; r < re; r++) {
               const int64_t o = r * C;
               for (int64_t c = 0; c < C; c++) {
                  const float d = half_ld(dt, p->x[o + c]) - p->K[c];
                  if (!p->dy) {
                     a1[c] += d;
                     a2[c] += d * d;
                  } else {
                     float g = half_ld(dt, p->dy[o + c]);
                     if (p->mk) {
                        if (half_ld(dt, p->mk[o + c]) <= 0) g = 0;
                        if (p->gm) p->gm[o + c] = half_st(dt, g);
                     }
                     a1[c] += g;
                     a2[c] += g * d;
                  }
               }
            }
            for (int64_t c = 0; c < C; c++) {
               p1[c] += a1[c];
               p2[c] += a2[c];
               a1[c] = a2[c] = 0;
            }
         }
#pragma omp barrier
         if (tid == 0) {
            for (int64_t c = 0; c < C; c++) p->s1[c] = p->s2[c] = 0;
            for (int t = 0; t < nth; t++) {
               const double *q1 = p->part + (size_t)t * 2 * (size_t)C, *q2 = q1 + C;
               for (int64_t c = 0; c < C; c++) {
                  p->s1[c] += q1[c];
                  p->s2[c] += q2[c];
               }
            }
            if (prep) prep(p->ctx);
         }
         if (p->y) {
#pragma omp barrier
         }
      }
      if (p->y) {
         const float *A = p->cf, *Ma = A + C, *B = A + 2 * C, *Mb = A + 3 * C, *D = A + 4 * C;
         for (int64_t r = r1 - 1; r >= r0; r--) {
            const int64_t o = r * C;
            for (int64_t c = 0; c < C; c++) {
               float av = half_ld(dt, p->a[o + c]);
               if (p->amk && half_ld(dt, p->amk[o + c]) <= 0) av = 0;
               float t = A[c] * (av - Ma[c]) + D[c];
               if (p->b) t += B[c] * (half_ld(dt, p->b[o + c]) - Mb[c]);
               if (p->res) t += half_ld(dt, p->res[o + c]);
               if (p->relu && t < 0) t = 0;
               p->y[o + c] = half_st(dt, t);
            }
         }
      }
   }
}

/* work buffers shared by forward and backward */
typedef struct {
   double *d;     /* 10 * C doubles: s1, s2, mean, invstd, w, b, rm, rv, tmp... */
   double *part;  /* partial sums */
   void *facc;    /* per-thread T accumulators (rows) */
   void *coef;    /* 5 * C of T: the affine coefficients; plus C of T: K */
} bn_work;

static void bn_work_free(bn_work *w) {
   free(w->d);
   free(w->part);
   free(w->facc);
   free(w->coef);
}

static lm_status bn_work_alloc(bn_work *w, const bn_geom *g, int esz) {
   int nt = num_threads();
   int64_t C = g->C > 0 ? g->C : 1;
   size_t npart = g->rows ? (size_t)nt * 2 * (size_t)C : 2 * (size_t)(g->N * g->C + 1);
   w->d = malloc(sizeof(double) * 10 * (size_t)C);
   w->part = malloc(sizeof(double) * npart);
   w->facc = g->rows ? malloc((size_t)esz * 2 * (size_t)nt * (size_t)C) : malloc(16);
   /* + 64 bytes: the vector loads of the coefficient blocks stay inside the buffer */
   w->coef = malloc((size_t)esz * 6 * (size_t)C + 64);
   if (!w->d || !w->part || !w->facc || !w->coef) {
      bn_work_free(w);
      return lm_error(LM_ERR_OOM, "out of memory (batch_norm scratch)");
   }
   return LM_OK;
}

/* K[c]: the first element of channel c (the shift of the one-pass sums) */
static void bn_shift(const void *x, const bn_geom *g, int dt, void *K, const double *mean) {
   for (int64_t c = 0; c < g->C; c++) {
      double v;
      if (mean)
         v = mean[c];
      else if (g->M == 0)
         v = 0;
      else if (dt == LM_FLOAT64)
         v = ((const double *)x)[g->rows ? c : c * g->S];
      else if (is_half(dt))
         v = half_ld(dt, ((const uint16_t *)x)[g->rows ? c : c * g->S]);
      else
         v = ((const float *)x)[g->rows ? c : c * g->S];
      if (!mean && !isfinite(v)) v = 0;
      if (dt == LM_FLOAT64)
         ((double *)K)[c] = v;
      else
         ((float *)K)[c] = (float)v;
   }
}

/* the affine coefficients y = A (a' - Ma) + B (b - Mb) + D per channel into w->coef as T, from
   doubles (Ma, B, Mb may be NULL for 0). Ma and Mb are rounded to T; the rounding is folded into
   D exactly, so that the large terms cancel before the multiplication (x - mean first, as
   PyTorch's backward). */
static void bn_coef(bn_work *w, const bn_geom *g, int dt, const double *A, const double *Ma,
                    const double *B, const double *Mb, const double *D) {
   const int64_t C = g->C;
   if (dt == LM_FLOAT64) {
      double *cf = w->coef;
      for (int64_t c = 0; c < C; c++) {
         cf[c] = A[c];
         cf[C + c] = Ma ? Ma[c] : 0;
         cf[2 * C + c] = B ? B[c] : 0;
         cf[3 * C + c] = Mb ? Mb[c] : 0;
         cf[4 * C + c] = D[c];
      }
   } else {
      float *cf = w->coef;
      for (int64_t c = 0; c < C; c++) {
         const float ma = Ma ? (float)Ma[c] : 0.f, mb = Mb ? (float)Mb[c] : 0.f;
         const double bb = B ? B[c] : 0.0;
         cf[c] = (float)A[c];
         cf[C + c] = ma;
         cf[2 * C + c] = (float)bb;
         cf[3 * C + c] = mb;
         cf[4 * C + c] = (float)(D[c] + A[c] * ((double)ma - (Ma ? Ma[c] : 0.0)) +
                                 bb * ((double)mb - (Mb ? Mb[c] : 0.0)));
      }
   }
}

/*
 * One batch-norm op: [the sums s1, s2 (K != NULL; see the kernels): dy == NULL for the statistics
 * of x; mk / gm: the relu mask and the masked gradient, NULL for none], then prep(ctx) (may be
 * NULL), which sees s1, s2 and leaves the coefficients in w->coef (bn_coef), then [y = the affine
 * map of a (masked by amk), b, res (y != NULL)]. Rows: both passes in one parallel region, prep on
 * one thread between them; planes: one after the other. v: 1 the AVX-512 copies, 2 the AVX2
 * copy of the float32 rows (the rest baseline), 0 the baseline copies.
 */
static int bn_run(int v, const void *x, const void *dy, const void *mk, void *gm, const void *K,
                   const bn_geom *g, int dt, bn_work *w, double *s1, double *s2,
                   void (*prep)(void *), void *ctx, const void *a, const void *amk, const void *b,
                   const void *res, void *y, int relu, int stream) {
   const int v2 = v == 2;
   v = v == 1;
   /* the AVX2 copy covers the float32 rows only: LUMEN_VERBOSE names the copy that ran */
   if (v2)
      lm_impl_ran(dt == LM_FLOAT32 && g->rows ? LM_IMPL_BN_AVX2 : LM_IMPL_BN_PORTABLE);
   if (is_half(dt)) { /* rows only (the front end widens planes) */
      /* streaming stores as below, the AVX-512 copy only: whole lines (C % 32 == 0) */
      const int st = stream && v && y && ((uintptr_t)y & 63) == 0 && g->C % 32 == 0;
      const lm_bn_half_args hp = {dt, x, dy, mk, gm, K, g->M, g->C, w->part, s1, s2, prep, ctx,
                                  a, amk, b, res, y, w->coef, relu, st};
#if BN_HAVE_AVX512
      if (v) {
         lm_bn_rows_half_avx512(&hp);
         return st;
      }
#endif
      bn_rows_half_c(&hp, w->facc);
      return 0;
   }
   if (g->rows) {
      /* streaming stores: whole aligned vectors only (the AVX-512 copies, rows of a multiple of
         64 bytes, y aligned), so every channel goes through the vector loops */
      const int esz = dt == LM_FLOAT64 ? 8 : 4;
      const int st = stream && v && y && ((uintptr_t)y & 63) == 0 && (g->C * esz) % 64 == 0;
      if (dt == LM_FLOAT64)
         (v ? rows_run_f64_512 : rows_run_f64)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc, s1,
                                               s2, prep, ctx, a, amk, b, res, y, w->coef, relu, st);
      else
         (v2  ? rows_run_f32_256
          : v ? rows_run_f32_512
              : rows_run_f32)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc, s1, s2, prep, ctx,
                              a, amk, b, res, y, w->coef, relu, st);
      return st;
   }
   if (K) {
      if (dt == LM_FLOAT64)
         (v ? planes_sums_f64_512 : planes_sums_f64)(x, dy, mk, gm, K, g->N, g->C, g->S, w->part,
                                                     s1, s2);
      else
         (v ? planes_sums_f32_512 : planes_sums_f32)(x, dy, mk, gm, K, g->N, g->C, g->S, w->part,
                                                     s1, s2);
   }
   if (prep) prep(ctx);
   if (y) {
      if (dt == LM_FLOAT64)
         (v ? planes_affine_f64_512 : planes_affine_f64)(a, amk, b, res, y, g->N, g->C, g->S,
                                                         w->coef, relu);
      else
         (v ? planes_affine_f32_512 : planes_affine_f32)(a, amk, b, res, y, g->N, g->C, g->S,
                                                         w->coef, relu);
   }
   return 0;
}

static void *bn_K(bn_work *w, const bn_geom *g, int dt) {
   return (char *)w->coef + (size_t)5 * (size_t)g->C * (size_t)lm_dtype_size(comp_dt(dt));
}

/* the forward's state, for the prep step that runs between its two passes */
typedef struct {
   const bn_geom *g;
   int dt, affine;
   bn_work *w;
   void *K;
   double *s1, *s2, *mean, *invstd, *wt, *bs, *rm, *rv, *A;
   lm_tensor *running_mean, *running_var;
   double momentum, eps;
} bn_fwd_ctx;

/* y = (x - mean) invstd w + b */
static void bn_fwd_coef(const bn_fwd_ctx *f) {
   for (int64_t c = 0; c < f->g->C; c++) f->A[c] = f->invstd[c] * f->wt[c];
   bn_coef(f->w, f->g, f->dt, f->A, f->mean, NULL, NULL, f->bs);
}

/* training: mean, invstd and the running statistics from the sums, then the coefficients */
static void bn_fwd_prep(void *p) {
   const bn_fwd_ctx *f = p;
   const bn_geom *g = f->g;
   const int64_t C = g->C;
   double *s1 = f->s1, *s2 = f->s2, *mean = f->mean, *invstd = f->invstd;
   double *rm = f->rm, *rv = f->rv;
   const double momentum = f->momentum;
   for (int64_t c = 0; c < C; c++) {
      if (g->M == 0) {
         mean[c] = 0;
         invstd[c] = 0;
         continue;
      }
      double k = f->dt == LM_FLOAT64 ? ((double *)f->K)[c] : ((float *)f->K)[c];
      double m1 = s1[c] / (double)g->M;
      double var = s2[c] / (double)g->M - m1 * m1;
      if (var < 0) var = 0;
      mean[c] = k + m1;
      invstd[c] = 1.0 / sqrt(var + f->eps);
      s2[c] = var; /* biased variance */
   }
   if (g->M > 0 && f->running_mean) {
      param_load(f->running_mean, C, 0.0, rm);
      for (int64_t c = 0; c < C; c++) rm[c] = (1.0 - momentum) * rm[c] + momentum * mean[c];
      param_store(f->running_mean, C, rm);
   }
   if (g->M > 0 && f->running_var) {
      param_load(f->running_var, C, 0.0, rv);
      const double unb = (double)g->M / (double)(g->M - 1);
      for (int64_t c = 0; c < C; c++)
         rv[c] = (1.0 - momentum) * rv[c] + momentum * s2[c] * unb;
      param_store(f->running_var, C, rv);
   }
   if (f->affine) bn_fwd_coef(f);
}

/* ------------------------------------------------------------------------------------------ */

/* LM_OP_BATCH_NORM: t = {x, weight, bias, running_mean, running_var, residual, y, save_mean,
   save_invstd} (src/ops/norm.h); v: which copies (bn_run) */
static lm_status bn_forward(const lm_op *op, int v) {
   const lm_batch_norm_params *p = op->params;
   const lm_tensor *x = op->t[0], *weight = op->t[1], *bias = op->t[2], *residual = op->t[5];
   lm_tensor *running_mean = op->t[3], *running_var = op->t[4], *y = op->t[6];
   lm_tensor *save_mean = op->t[7], *save_invstd = op->t[8];
   bn_geom g;
   bn_geometry(x, p->mf, &g);
   const int64_t C = g.C;
   const int dt = x->dtype;
   bn_work w = {0};
   int streamed = 0; /* y was written with streaming stores */
   LM_TRY(bn_work_alloc(&w, &g, lm_dtype_size(comp_dt(dt))));
   double *s1 = w.d, *s2 = s1 + C, *mean = s2 + C, *invstd = mean + C, *wt = invstd + C;
   double *bs = wt + C, *rm = bs + C, *rv = rm + C, *A = rv + C;

   param_load(weight, C, 1.0, wt);
   param_load(bias, C, 0.0, bs);
   const void *xp = lm_tensor_data(x), *rp = residual ? lm_tensor_data(residual) : NULL;
   void *yp = y->numel > 0 ? lm_tensor_data(y) : NULL;
   bn_fwd_ctx f = {&g, dt, yp != NULL, &w, bn_K(&w, &g, dt), s1, s2, mean, invstd, wt, bs,
                   rm, rv, A, running_mean, running_var, p->momentum, p->eps};
   if (p->training) {
      bn_shift(xp, &g, dt, f.K, NULL);
      if (g.M > 0)
         streamed = bn_run(v, xp, NULL, NULL, NULL, f.K, &g, dt, &w, s1, s2, bn_fwd_prep, &f, xp,
                           NULL, NULL, rp, yp, p->relu, bn_out_cold(y, p->fresh));
      else
         bn_fwd_prep(&f); /* no rows: nothing to normalise either */
   } else {
      param_load(running_mean, C, 0.0, mean);
      param_load(running_var, C, 1.0, rv);
      for (int64_t c = 0; c < C; c++) invstd[c] = 1.0 / sqrt(rv[c] + p->eps);
      if (yp) {
         bn_fwd_coef(&f);
         streamed = bn_run(v, NULL, NULL, NULL, NULL, NULL, &g, dt, &w, s1, s2, NULL, NULL, xp,
                           NULL, NULL, rp, yp, p->relu, bn_out_cold(y, p->fresh));
      }
   }
   if (streamed) lm_tensor_note_streamed(y);
   if (save_mean) param_store(save_mean, C, mean);
   if (save_invstd) param_store(save_invstd, C, invstd);
   bn_work_free(&w);
   return LM_OK;
}

/* the backward's state, for the prep step between its two passes */
typedef struct {
   const bn_geom *g;
   int dt, training, sums, affine;
   bn_work *w;
   void *K;
   double *s1, *s2, *mean, *invstd, *wt, *A, *B, *D;
} bn_bwd_ctx;

/* s2 shifted from K to the mean, then the coefficients of grad_input:
   dx = invstd w (dy - s1 / M - (x - mean) invstd^2 s2 / M) */
static void bn_bwd_prep(void *p) {
   const bn_bwd_ctx *b = p;
   const int64_t C = b->g->C, M = b->g->M;
   double *s1 = b->s1, *s2 = b->s2, *invstd = b->invstd;
   if (b->sums) {
      for (int64_t c = 0; c < C; c++) { /* K is mean rounded to T */
         double k = b->dt == LM_FLOAT64 ? ((double *)b->K)[c] : ((float *)b->K)[c];
         s2[c] += (k - b->mean[c]) * s1[c];
      }
   }
   if (!b->affine) return;
   for (int64_t c = 0; c < C; c++) {
      double a = invstd[c] * b->wt[c];
      b->A[c] = a;
      if (b->training) {
         double k = s2[c] / (double)M * invstd[c] * invstd[c];
         b->B[c] = -a * k;
         b->D[c] = -a * s1[c] / (double)M;
      } else {
         b->B[c] = 0;
         b->D[c] = 0;
      }
   }
   bn_coef(b->w, b->g, b->dt, b->A, NULL, b->B, b->mean, b->D);
}

/* LM_OP_BATCH_NORM_BACKWARD: t = {grad_out, relu_out, x, weight, save_mean, save_invstd, grad_x,
   grad_weight, grad_bias, grad_masked} (src/ops/norm.h); v: which copies (bn_run) */
static lm_status bn_backward(const lm_op *op, int v) {
   const lm_batch_norm_params *p = op->params;
   const lm_tensor *go = op->t[0], *relu_out = op->t[1], *x = op->t[2], *weight = op->t[3];
   const lm_tensor *save_mean = op->t[4], *save_invstd = op->t[5];
   lm_tensor *grad_x = op->t[6], *grad_weight = op->t[7], *grad_bias = op->t[8];
   lm_tensor *grad_masked = op->t[9];
   const int training = p->training;
   bn_geom g;
   bn_geometry(x, p->mf, &g);
   const int64_t C = g.C;
   const int dt = x->dtype;
   bn_work w = {0};
   int streamed = 0; /* grad_input was written with streaming stores */
   LM_TRY(bn_work_alloc(&w, &g, lm_dtype_size(comp_dt(dt))));
   double *s1 = w.d, *s2 = s1 + C, *mean = s2 + C, *invstd = mean + C, *wt = invstd + C;
   double *A = wt + C, *B = A + C, *D = B + C;

   param_load(weight, C, 1.0, wt);
   param_load(save_mean, C, 0.0, mean);
   param_load(save_invstd, C, 0.0, invstd);
   const void *xp = lm_tensor_data(x), *gp = lm_tensor_data(go);
   const void *mp = relu_out ? lm_tensor_data(relu_out) : NULL;
   void *gmp = grad_masked ? lm_tensor_data(grad_masked) : NULL;
   const int need_sums = grad_weight || grad_bias || (grad_x && training) || gmp;
   const int sums = need_sums && g.M > 0;
   void *gxp = grad_x && grad_x->numel > 0 ? lm_tensor_data(grad_x) : NULL;
   bn_bwd_ctx b = {&g, dt, training, sums, gxp != NULL, &w, bn_K(&w, &g, dt), s1, s2, mean,
                   invstd, wt, A, B, D};
   for (int64_t c = 0; c < C; c++) s1[c] = s2[c] = 0;
   /* s1 = sum dy, s2 = sum dy (x - K) (dy masked by the relu output), K = mean rounded to T */
   if (sums) bn_shift(xp, &g, dt, b.K, mean);
   /* the masked gradient, when the sums pass writes it, is read back instead of masking
      grad_out again */
   const void *ga = gmp && sums ? gmp : gp;
   const void *ma = ga == gp ? mp : NULL;
   if (sums || gxp)
      streamed = bn_run(v, xp, gp, mp, gmp, sums ? b.K : NULL, &g, dt, &w, s1, s2, bn_bwd_prep,
                        &b, ga, ma, training ? xp : NULL, NULL, gxp, 0,
                        gxp && bn_out_cold(grad_x, p->fresh));
   if (streamed) lm_tensor_note_streamed(grad_x);
   if (grad_weight) {
      for (int64_t c = 0; c < C; c++) A[c] = s2[c] * invstd[c];
      param_store(grad_weight, C, A);
   }
   if (grad_bias) param_store(grad_bias, C, s1);
   bn_work_free(&w);
   return LM_OK;
}

static lm_status k_batch_norm(const lm_op *op) {
   lm_impl_ran(LM_IMPL_BN_PORTABLE);
   return bn_forward(op, 0);
}
static lm_status k_batch_norm_backward(const lm_op *op) {
   lm_impl_ran(LM_IMPL_BN_PORTABLE);
   return bn_backward(op, 0);
}
#if BN_HAVE_AVX512
/* the implementation list of two (src/impl.h): batch_norm_avx512, else batch_norm_portable */
static int bn_v512(void) {
   const int on = lm_impl_on(LM_IMPL_BN_AVX512);
   if (!on) lm_impl_skip(LM_IMPL_BN_AVX512, "switched off (lm.backends.cpu.disable)");
   lm_impl_ran(on ? LM_IMPL_BN_AVX512 : LM_IMPL_BN_PORTABLE);
   return on;
}
static lm_status k_batch_norm_avx512(const lm_op *op) { return bn_forward(op, bn_v512()); }
static lm_status k_batch_norm_backward_avx512(const lm_op *op) { return bn_backward(op, bn_v512()); }
#endif
#if BN_HAVE_AVX2
/* below AVX-512 with AVX2: batch_norm_avx2 (the float32 rows; bn_run names the copy that ran),
   else batch_norm_portable */
static int bn_v256(void) {
   const int on = lm_impl_on(LM_IMPL_BN_AVX2);
   if (!on) {
      lm_impl_skip(LM_IMPL_BN_AVX2, "switched off (lm.backends.cpu.disable)");
      lm_impl_ran(LM_IMPL_BN_PORTABLE);
   }
   return on ? 2 : 0;
}
static lm_status k_batch_norm_avx2(const lm_op *op) {
   const lm_status st = bn_forward(op, bn_v256());
   lm_impl_ran_default(lm_impl_name(LM_IMPL_BN_PORTABLE)); /* nothing ran (empty input) */
   return st;
}
static lm_status k_batch_norm_backward_avx2(const lm_op *op) {
   const lm_status st = bn_backward(op, bn_v256());
   lm_impl_ran_default(lm_impl_name(LM_IMPL_BN_PORTABLE));
   return st;
}
#endif

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_norm(lm_kernel_fn *table, int isa) {
#if BN_HAVE_AVX512
   if (isa >= LM_ISA_AVX512) {
      table[LM_OP_BATCH_NORM] = k_batch_norm_avx512;
      table[LM_OP_BATCH_NORM_BACKWARD] = k_batch_norm_backward_avx512;
      return;
   }
#endif
#if BN_HAVE_AVX2
   if (isa == LM_ISA_AVX2) {
      table[LM_OP_BATCH_NORM] = k_batch_norm_avx2;
      table[LM_OP_BATCH_NORM_BACKWARD] = k_batch_norm_backward_avx2;
      return;
   }
#endif
   (void)isa;
   table[LM_OP_BATCH_NORM] = k_batch_norm;
   table[LM_OP_BATCH_NORM_BACKWARD] = k_batch_norm_backward;
}
