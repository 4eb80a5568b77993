/*
 * norm.c -- batch normalisation, forward (training and eval) and backward, and the fused forms
 * used by the ResNet blocks: relu(batch_norm(x) [+ residual]) forward, and the backward of
 * batch_norm followed by a relu (the relu's gradient mask taken from its output).
 *
 * mf = x.suggest_memory_format(). Two kernels:
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
 * An input that is not dense in mf is cloned once.
 */
#include "cpu.h"
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "nn_common.h"
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

enum { SROWS = 64, RROWS = 32, PLANEBLK = 1024 };

/* elements below which a pass runs on one thread: these passes are memory-bound and cheap (a
   pass over 256 K floats takes ~50 us), less than waking and joining a team costs on a busy
   machine */
#define BN_GRAIN ((int64_t)1 << 18)

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int num_threads(void) {
#ifdef _OPENMP
   return omp_get_max_threads();
#else
   return 1;
#endif
}

/* a 1-D parameter of C elements (any floating dtype, any stride): check it */
static lm_status check_param(const lm_tensor *t, int64_t C, const char *what) {
   if (!t) return LM_OK;
   LM_TRY(lm_check_cpu(t, what));
   if (!lm_is_float_dtype(t->dtype))
      return lm_error(LM_ERR_DTYPE, "expected %s to be a floating tensor, got %s", what,
                      lm_dtype_name(t->dtype));
   if (t->numel != C)
      return lm_error(LM_ERR_SHAPE, "%s should contain %lld elements not %lld", what,
                      (long long)C, (long long)t->numel);
   if (t->ndim != 1) {
      char s[160];
      fmt_sizes(s, sizeof s, t->ndim, t->sizes);
      return lm_error(LM_ERR_SHAPE, "%s should be a 1-D tensor of %lld elements, got sizes %s",
                      what, (long long)C, s);
   }
   return LM_OK;
}

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

/* a fresh (C) tensor from doubles, or the caller's out= tensor */
static lm_status vec_result(lm_tensor **res, int64_t C, int dtype, const double *v,
                            const char *what) {
   out_slot o;
   int64_t sz[1] = {C};
   LM_TRY(out_open(&o, res, 1, sz, dtype, LM_CONTIGUOUS, what));
   param_store(o.t, C, v);
   return out_close(&o, res, LM_OK);
}

/* geometry: (N, C, S) with layout rows (M = N*S rows of C) or planes */
typedef struct {
   int64_t N, C, S, M;
   int mf;
   int rows;
} bn_geom;

static lm_status bn_geometry(const lm_tensor *x, bn_geom *g) {
   if (x->ndim < 2) {
      char s[160];
      fmt_sizes(s, sizeof s, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm: expected an input of 2 or more dimensions, got %s",
                      s);
   }
   g->N = x->sizes[0];
   g->C = x->sizes[1];
   g->S = 1;
   for (int d = 2; d < x->ndim; d++) g->S *= x->sizes[d];
   g->M = g->N * g->S;
   g->mf = lm_suggest_memory_format(x, 0);
   g->rows = g->mf == LM_CHANNELS_LAST || g->mf == LM_CHANNELS_LAST_3D || g->S == 1;
   if (g->mf != LM_CHANNELS_LAST && g->mf != LM_CHANNELS_LAST_3D) g->mf = LM_CONTIGUOUS;
   return LM_OK;
}

static lm_status dense_in(const lm_tensor *x, int mf, const lm_tensor **xd, lm_tensor **tmp) {
   *tmp = NULL;
   *xd = x;
   if (!lm_is_contiguous(x, mf)) {
      LM_TRY(lm_clone(x, mf, -1, tmp));
      *xd = *tmp;
   }
   return LM_OK;
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
static int use_avx512(void) { return lm_gemm_isa() >= 3; }
#else
#define LM_AVX512_FN
static int use_avx512(void) { return 0; }
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

/* a baseline copy and an AVX-512 copy (used when lm_gemm_isa() says AVX-512 is in use) */
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
DEFINE_BN_ROWS(float, f32_512, LM_AVX512_FN, bn_vf, bn_vf_u, bn_vfi, bn_vw16, bn_vw16_u, 4, 4,
               bn_mld_f32_512, bn_mst_f32_512, BN_MASKED, BN_NTST_F32_512)
DEFINE_BN_ROWS(double, f64_512, LM_AVX512_FN, bn_vd, bn_vd_u, bn_vdi, bn_vd, bn_vd_u, 4, 4,
               bn_mld_f64_512, bn_mst_f64_512, BN_MASKED, BN_NTST_F64_512)

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
 * one thread between them; planes: one after the other.
 */
static int bn_run(const void *x, const void *dy, const void *mk, void *gm, const void *K,
                   const bn_geom *g, int dt, bn_work *w, double *s1, double *s2,
                   void (*prep)(void *), void *ctx, const void *a, const void *amk, const void *b,
                   const void *res, void *y, int relu, int stream) {
   const int v = use_avx512();
   if (g->rows) {
      /* streaming stores: whole aligned vectors only (the AVX-512 copies, rows of a multiple of
         64 bytes, y aligned), so every channel goes through the vector loops */
      const int esz = dt == LM_FLOAT64 ? 8 : 4;
      const int st = stream && v && y && ((uintptr_t)y & 63) == 0 && (g->C * esz) % 64 == 0;
      if (dt == LM_FLOAT64)
         (v ? rows_run_f64_512 : rows_run_f64)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc, s1,
                                               s2, prep, ctx, a, amk, b, res, y, w->coef, relu, st);
      else
         (v ? rows_run_f32_512 : rows_run_f32)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc, s1,
                                               s2, prep, ctx, a, amk, b, res, y, w->coef, relu, st);
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
   return (char *)w->coef + (size_t)5 * (size_t)g->C * (size_t)lm_dtype_size(dt);
}

/* an extra operand of the fused ops (residual, relu output): x's dtype and sizes, on the CPU */
static lm_status check_like(const lm_tensor *t, const lm_tensor *x, const char *what) {
   LM_TRY(lm_check_cpu(t, what));
   if (t->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "batch_norm: %s has dtype %s but input has %s", what,
                      lm_dtype_name(t->dtype), lm_dtype_name(x->dtype));
   if (t->ndim != x->ndim || memcmp(t->sizes, x->sizes, (size_t)x->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      fmt_sizes(a, sizeof a, t->ndim, t->sizes);
      fmt_sizes(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm: %s %s does not match input %s", what, a, b);
   }
   return LM_OK;
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

lm_status lm_batch_norm_fused(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                              lm_tensor *running_mean, lm_tensor *running_var, int training,
                              double momentum, double eps, const lm_tensor *residual, int relu,
                              lm_tensor **out, lm_tensor **save_mean, lm_tensor **save_invstd) {
   bn_geom g = {0};
   LM_TRY(check_float(x, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(bn_geometry(x, &g));
   const int64_t C = g.C;
   LM_TRY(check_param(running_mean, C, "running_mean"));
   LM_TRY(check_param(running_var, C, "running_var"));
   LM_TRY(check_param(weight, C, "weight"));
   LM_TRY(check_param(bias, C, "bias"));
   if (residual) LM_TRY(check_like(residual, x, "residual"));
   if (!training && (!running_mean || !running_var))
      return lm_error(LM_ERR_ARG, "running_mean and running_var must be defined in evaluation mode");
   if (training && g.M == 1) {
      char s[160];
      fmt_sizes(s, sizeof s, x->ndim, x->sizes);
      return lm_error(LM_ERR_ARG,
                      "Expected more than 1 value per channel when training, got input size %s", s);
   }
   if (!(eps >= 0)) return lm_error(LM_ERR_ARG, "batch_norm: eps must be >= 0, got %g", eps);

   const int dt = x->dtype;
   bn_work w = {0};
   out_slot so = {0};
   int streamed = 0; /* y was written with streaming stores */
   const lm_tensor *xd = NULL, *rd = NULL;
   lm_tensor *tmp = NULL, *rtmp = NULL;
   LM_TRY(bn_work_alloc(&w, &g, lm_dtype_size(dt)));
   double *s1 = w.d, *s2 = s1 + C, *mean = s2 + C, *invstd = mean + C, *wt = invstd + C;
   double *bs = wt + C, *rm = bs + C, *rv = rm + C, *A = rv + C;
   lm_status st = out_open(&so, out, x->ndim, x->sizes, dt, g.mf, "output");
   if (st == LM_OK) st = dense_in(x, g.mf, &xd, &tmp);
   if (st == LM_OK && residual) st = dense_in(residual, g.mf, &rd, &rtmp);
   if (st != LM_OK) goto done;

   param_load(weight, C, 1.0, wt);
   param_load(bias, C, 0.0, bs);
   {
      const void *xp = lm_tensor_data(xd), *rp = rd ? lm_tensor_data(rd) : NULL;
      void *yp = so.t->numel > 0 ? lm_tensor_data(so.t) : NULL;
      bn_fwd_ctx f = {&g, dt, yp != NULL, &w, bn_K(&w, &g, dt), s1, s2, mean, invstd, wt, bs,
                      rm, rv, A, running_mean, running_var, momentum, eps};
      if (training) {
         bn_shift(xp, &g, dt, f.K, NULL);
         if (g.M > 0)
            streamed = bn_run(xp, NULL, NULL, NULL, f.K, &g, dt, &w, s1, s2, bn_fwd_prep, &f, xp,
                              NULL, NULL, rp, yp, relu != 0, out_cold(&so));
         else
            bn_fwd_prep(&f); /* no rows: nothing to normalise either */
      } else {
         param_load(running_mean, C, 0.0, mean);
         param_load(running_var, C, 1.0, rv);
         for (int64_t c = 0; c < C; c++) invstd[c] = 1.0 / sqrt(rv[c] + eps);
         if (yp) {
            bn_fwd_coef(&f);
            streamed = bn_run(NULL, NULL, NULL, NULL, NULL, &g, dt, &w, s1, s2, NULL, NULL, xp,
                              NULL, NULL, rp, yp, relu != 0, out_cold(&so));
         }
      }
   }
   if (streamed) out_note_streamed(&so);
   if (save_mean) st = vec_result(save_mean, C, dt, mean, "save_mean");
   if (st == LM_OK && save_invstd) {
      st = vec_result(save_invstd, C, dt, invstd, "save_invstd");
      if (st != LM_OK && save_mean && *save_mean) {
         lm_tensor_free(*save_mean);
         *save_mean = NULL;
      }
   }
done:
   lm_tensor_free(tmp);
   lm_tensor_free(rtmp);
   bn_work_free(&w);
   return out_close(&so, out, st);
}

lm_status lm_batch_norm(const lm_tensor *x, const lm_tensor *weight, const lm_tensor *bias,
                        lm_tensor *running_mean, lm_tensor *running_var, int training,
                        double momentum, double eps, lm_tensor **out, lm_tensor **save_mean,
                        lm_tensor **save_invstd) {
   return lm_batch_norm_fused(x, weight, bias, running_mean, running_var, training, momentum, eps,
                              NULL, 0, out, save_mean, save_invstd);
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

lm_status lm_batch_norm_backward_fused(const lm_tensor *grad_out, const lm_tensor *relu_out,
                                       const lm_tensor *x, const lm_tensor *weight,
                                       const lm_tensor *save_mean, const lm_tensor *save_invstd,
                                       int training, lm_tensor **grad_x, lm_tensor **grad_weight,
                                       lm_tensor **grad_bias, lm_tensor **grad_masked) {
   bn_geom g = {0};
   LM_TRY(check_float(x, "input"));
   LM_TRY(check_float(grad_out, "grad_output"));
   LM_TRY(bn_geometry(x, &g));
   const int64_t C = g.C;
   if (grad_out->dtype != x->dtype)
      return lm_error(LM_ERR_DTYPE, "batch_norm_backward: grad_output has dtype %s but input has %s",
                      lm_dtype_name(grad_out->dtype), lm_dtype_name(x->dtype));
   if (grad_out->ndim != x->ndim ||
       memcmp(grad_out->sizes, x->sizes, (size_t)x->ndim * sizeof(int64_t)) != 0) {
      char a[160], b[160];
      fmt_sizes(a, sizeof a, grad_out->ndim, grad_out->sizes);
      fmt_sizes(b, sizeof b, x->ndim, x->sizes);
      return lm_error(LM_ERR_SHAPE, "batch_norm_backward: grad_output %s does not match input %s",
                      a, b);
   }
   if (!save_mean || !save_invstd)
      return lm_error(LM_ERR_ARG, "batch_norm_backward: save_mean and save_invstd are required");
   if (grad_masked && !relu_out)
      return lm_error(LM_ERR_ARG, "batch_norm_backward: grad_masked needs the relu output");
   if (relu_out) LM_TRY(check_like(relu_out, x, "relu output"));
   LM_TRY(check_param(weight, C, "weight"));
   LM_TRY(check_param(save_mean, C, "save_mean"));
   LM_TRY(check_param(save_invstd, C, "save_invstd"));

   const int dt = x->dtype;
   const int wdt = weight ? weight->dtype : dt;
   bn_work w = {0};
   out_slot sg = {0}, sm = {0};
   int streamed = 0; /* grad_input was written with streaming stores */
   const lm_tensor *xd = NULL, *gd = NULL, *md = NULL;
   lm_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
   LM_TRY(bn_work_alloc(&w, &g, lm_dtype_size(dt)));
   double *s1 = w.d, *s2 = s1 + C, *mean = s2 + C, *invstd = mean + C, *wt = invstd + C;
   double *A = wt + C, *B = A + C, *D = B + C;
   lm_status st = LM_OK;
   if (grad_x) st = out_open(&sg, grad_x, x->ndim, x->sizes, dt, g.mf, "grad_input");
   if (st == LM_OK && grad_masked)
      st = out_open(&sm, grad_masked, x->ndim, x->sizes, dt, g.mf, "grad_masked");
   if (st == LM_OK) st = dense_in(x, g.mf, &xd, &t1);
   if (st == LM_OK) st = dense_in(grad_out, g.mf, &gd, &t2);
   if (st == LM_OK && relu_out) st = dense_in(relu_out, g.mf, &md, &t3);
   if (st != LM_OK) goto done;

   param_load(weight, C, 1.0, wt);
   param_load(save_mean, C, 0.0, mean);
   param_load(save_invstd, C, 0.0, invstd);
   {
      const void *xp = lm_tensor_data(xd), *gp = lm_tensor_data(gd);
      const void *mp = md ? lm_tensor_data(md) : NULL;
      void *gmp = grad_masked ? lm_tensor_data(sm.t) : NULL;
      const int need_sums = grad_weight || grad_bias || (grad_x && training) || gmp;
      const int sums = need_sums && g.M > 0;
      void *gxp = grad_x && sg.t->numel > 0 ? lm_tensor_data(sg.t) : NULL;
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
         streamed = bn_run(xp, gp, mp, gmp, sums ? b.K : NULL, &g, dt, &w, s1, s2, bn_bwd_prep, &b,
                           ga, ma, training ? xp : NULL, NULL, gxp, 0, gxp && out_cold(&sg));
      if (streamed) out_note_streamed(&sg);
      if (grad_weight) {
         for (int64_t c = 0; c < C; c++) A[c] = s2[c] * invstd[c];
         st = vec_result(grad_weight, C, wdt, A, "grad_weight");
      }
      if (st == LM_OK && grad_bias) {
         st = vec_result(grad_bias, C, wdt, s1, "grad_bias");
         if (st != LM_OK && grad_weight && *grad_weight) {
            lm_tensor_free(*grad_weight);
            *grad_weight = NULL;
         }
      }
   }
done:
   lm_tensor_free(t1);
   lm_tensor_free(t2);
   lm_tensor_free(t3);
   bn_work_free(&w);
   if (grad_masked) {
      lm_status st2 = out_close(&sm, grad_masked, st);
      if (st == LM_OK) st = st2;
   }
   if (grad_x) {
      lm_status st2 = out_close(&sg, grad_x, st);
      if (st == LM_OK) st = st2;
   }
   return st;
}

lm_status lm_batch_norm_backward(const lm_tensor *grad_out, const lm_tensor *x,
                                 const lm_tensor *weight, const lm_tensor *save_mean,
                                 const lm_tensor *save_invstd, int training,
                                 lm_tensor **grad_x, lm_tensor **grad_weight,
                                 lm_tensor **grad_bias) {
   return lm_batch_norm_backward_fused(grad_out, NULL, x, weight, save_mean, save_invstd,
                                       training, grad_x, grad_weight, grad_bias, NULL);
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_norm(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
