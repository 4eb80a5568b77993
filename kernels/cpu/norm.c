/*
 * norm.c -- batch normalisation, forward (training and eval) and backward, and the fused forms
 * used by the ResNet blocks: relu(batch_norm(x) [+ residual]) forward, and the backward of
 * batch_norm followed by a relu (the relu's gradient mask taken from its output).
 *
 * mf = x.suggest_memory_format(). Two kernels:
 *   rows   -- channels innermost: channels-last (4-D), channels-last-3d (5-D) and any contiguous
 *             input whose spatial size is 1 (e.g. (N, C)). The data is an (M, C) matrix; the
 *             loops hold one vector of channels in registers and run over blocks of rows.
 *             Statistics: one pass, OpenMP over row ranges, per-thread partial sums (float
 *             accumulators over a few rows flushed into double), shifted by the first row so
 *             that E[x^2] - E[x]^2 does not cancel; a second pass normalises.
 *   planes -- contiguous (N, C, S): per (n, c) plane partial sums in double, then per channel.
 * An input that is not dense in mf is cloned once.
 */
#include "internal.h"
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "nn_common.h"

enum { ROWBLK = 64, PLANEBLK = 1024, NACC = 16 };

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

#define VLD(VU, p) (*(const VU *)(const void *)(p))
#define VST(VU, p, v) (*(VU *)(void *)(p) = (v))
/* v where m > 0 or m is NaN (relu_backward's "m <= 0 ? 0 : v"), else 0 */
#define VMASK(VI, V, v, m, zero) ((V)((VI)(v) & ~(VI)((m) <= (zero))))
/* relu keeping NaN: v < 0 ? 0 : v */
#define VRELU(VI, V, v, zero) ((V)((VI)(v) & ~(VI)((v) < (zero))))

/*
 * Row kernels (channels innermost, an (M, C) matrix). Channels are processed in blocks of one
 * vector (VL = 64 / sizeof(T) channels) held in registers, over blocks of ROWBLK rows with RACC
 * independent accumulators (each float accumulator sums at most ROWBLK / RACC values before it
 * is flushed into double); the channels past the last full block (C % VL) take a scalar loop.
 *
 * sums: s1[c] = sum(x - K[c]), s2[c] = sum((x - K[c])^2) with K[c] = the first row / element of
 * channel c (the shift that keeps the one-pass variance from cancelling); with dy:
 * s1[c] = sum(g), s2[c] = sum(g * (x - K[c])) where g = dy, or dy masked by mk (g = 0 where
 * mk <= 0: the gradient of a relu whose output is mk), also stored into gm when gm != NULL.
 * part: nthreads * 2 * C doubles of scratch; facc: nthreads * 2 * C of T.
 *
 * affine: y = A (a' - Ma) + B (b - Mb) + D [+ res] [relu], a' = a masked by mk (may be NULL);
 * b, res may be NULL; cf = A, Ma, B, Mb, D (C each).
 */
#define DEFINE_BN(T, S, ATTR, V, VU, VI)                                                           \
   ATTR static void rows_sums_##S(const T *x, const T *dy, const T *mk, T *gm, const T *K,         \
                                  int64_t M, int64_t C, double *part, T *facc, double *s1,         \
                                  double *s2) {                                                    \
      enum { VL = 64 / (int)sizeof(T) };                                                           \
      const int64_t Cv = C - C % VL;                                                               \
      int nused = 1;                                                                               \
      _Pragma("omp parallel if (M * C > BN_GRAIN)")                                                \
      {                                                                                            \
         int tid = 0, nth = 1;                                                                     \
         LM_OMP_TID(tid, nth);                                                                     \
         if (tid == 0) nused = nth;                                                                \
         double *p1 = part + (size_t)tid * 2 * C, *p2 = p1 + C;                                    \
         T *a1 = facc + (size_t)tid * 2 * C, *a2 = a1 + C;                                         \
         for (int64_t c = 0; c < C; c++) p1[c] = p2[c] = 0, a1[c] = a2[c] = 0;                     \
         const int64_t r0 = M * tid / nth, r1 = M * (tid + 1) / nth;                               \
         const V zero = {0};                                                                       \
         for (int64_t rb = r0; rb < r1; rb += ROWBLK) {                                            \
            const int64_t re = min64(rb + ROWBLK, r1);                                             \
            for (int64_t cb = 0; cb < Cv; cb += VL) {                                              \
               const V k = VLD(VU, K + cb);                                                        \
               V u0 = zero, u1 = zero, u2 = zero, u3 = zero;                                       \
               V q0 = zero, q1 = zero, q2 = zero, q3 = zero;                                       \
               int64_t r = rb;                                                                     \
               if (!dy) {                                                                          \
                  _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                            \
                     const T *xr = x + r * C + cb;                                                 \
                     V d0 = VLD(VU, xr) - k, d1 = VLD(VU, xr + C) - k;                             \
                     V d2 = VLD(VU, xr + 2 * C) - k, d3 = VLD(VU, xr + 3 * C) - k;                 \
                     u0 += d0, u1 += d1, u2 += d2, u3 += d3;                                       \
                     q0 += d0 * d0, q1 += d1 * d1, q2 += d2 * d2, q3 += d3 * d3;                   \
                  }                                                                                \
                  for (; r < re; r++) {                                                            \
                     V d0 = VLD(VU, x + r * C + cb) - k;                                           \
                     u0 += d0, q0 += d0 * d0;                                                      \
                  }                                                                                \
               } else if (!mk) {                                                                   \
                  _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                            \
                     const T *xr = x + r * C + cb, *gr = dy + r * C + cb;                          \
                     V g0 = VLD(VU, gr), g1 = VLD(VU, gr + C);                                     \
                     V g2 = VLD(VU, gr + 2 * C), g3 = VLD(VU, gr + 3 * C);                         \
                     u0 += g0, u1 += g1, u2 += g2, u3 += g3;                                       \
                     q0 += g0 * (VLD(VU, xr) - k), q1 += g1 * (VLD(VU, xr + C) - k);               \
                     q2 += g2 * (VLD(VU, xr + 2 * C) - k), q3 += g3 * (VLD(VU, xr + 3 * C) - k);   \
                  }                                                                                \
                  for (; r < re; r++) {                                                            \
                     V g0 = VLD(VU, dy + r * C + cb);                                              \
                     u0 += g0, q0 += g0 * (VLD(VU, x + r * C + cb) - k);                           \
                  }                                                                                \
               } else {                                                                            \
                  /* the same rows in the same accumulators as above: a masked gradient sums    \
                     exactly as the same gradient masked beforehand would */                     \
                  _Pragma("GCC unroll 1") for (; r + 4 <= re; r += 4) {                            \
                     const int64_t o = r * C + cb;                                                 \
                     V g0 = VMASK(VI, V, VLD(VU, dy + o), VLD(VU, mk + o), zero);                  \
                     V g1 = VMASK(VI, V, VLD(VU, dy + o + C), VLD(VU, mk + o + C), zero);          \
                     V g2 = VMASK(VI, V, VLD(VU, dy + o + 2 * C), VLD(VU, mk + o + 2 * C), zero);  \
                     V g3 = VMASK(VI, V, VLD(VU, dy + o + 3 * C), VLD(VU, mk + o + 3 * C), zero);  \
                     if (gm) {                                                                     \
                        VST(VU, gm + o, g0), VST(VU, gm + o + C, g1);                              \
                        VST(VU, gm + o + 2 * C, g2), VST(VU, gm + o + 3 * C, g3);                  \
                     }                                                                             \
                     u0 += g0, u1 += g1, u2 += g2, u3 += g3;                                       \
                     q0 += g0 * (VLD(VU, x + o) - k), q1 += g1 * (VLD(VU, x + o + C) - k);         \
                     q2 += g2 * (VLD(VU, x + o + 2 * C) - k);                                      \
                     q3 += g3 * (VLD(VU, x + o + 3 * C) - k);                                      \
                  }                                                                                \
                  for (; r < re; r++) {                                                            \
                     const int64_t o = r * C + cb;                                                 \
                     V g0 = VMASK(VI, V, VLD(VU, dy + o), VLD(VU, mk + o), zero);                  \
                     if (gm) VST(VU, gm + o, g0);                                                  \
                     u0 += g0, q0 += g0 * (VLD(VU, x + o) - k);                                    \
                  }                                                                                \
               }                                                                                   \
               u0 = (u0 + u1) + (u2 + u3);                                                         \
               q0 = (q0 + q1) + (q2 + q3);                                                         \
               for (int j = 0; j < VL; j++) {                                                      \
                  p1[cb + j] += (double)u0[j];                                                     \
                  p2[cb + j] += (double)q0[j];                                                     \
               }                                                                                   \
            }                                                                                      \
            if (Cv < C) {                                                                          \
               for (int64_t r = rb; r < re; r++) {                                                 \
                  const T *xr = x + r * C;                                                         \
                  if (!dy) {                                                                       \
                     for (int64_t c = Cv; c < C; c++) {                                            \
                        T d = xr[c] - K[c];                                                        \
                        a1[c] += d;                                                                \
                        a2[c] += d * d;                                                            \
                     }                                                                             \
                  } else {                                                                         \
                     const T *gr = dy + r * C, *mr = mk ? mk + r * C : NULL;                       \
                     for (int64_t c = Cv; c < C; c++) {                                            \
                        T g = gr[c];                                                               \
                        if (mr) {                                                                  \
                           if (mr[c] <= 0) g = 0;                                                  \
                           if (gm) gm[r * C + c] = g;                                              \
                        }                                                                          \
                        a1[c] += g;                                                                \
                        a2[c] += g * (xr[c] - K[c]);                                               \
                     }                                                                             \
                  }                                                                                \
               }                                                                                   \
               for (int64_t c = Cv; c < C; c++) {                                                  \
                  p1[c] += a1[c];                                                                  \
                  p2[c] += a2[c];                                                                  \
                  a1[c] = a2[c] = 0;                                                               \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
      for (int64_t c = 0; c < C; c++) s1[c] = s2[c] = 0;                                           \
      for (int t = 0; t < nused; t++) {                                                            \
         const double *p1 = part + (size_t)t * 2 * C, *p2 = p1 + C;                                \
         for (int64_t c = 0; c < C; c++) {                                                         \
            s1[c] += p1[c];                                                                        \
            s2[c] += p2[c];                                                                        \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
   ATTR static void rows_affine_##S(const T *a, const T *mk, const T *b, const T *res, T *y,       \
                                    int64_t M, int64_t C, const T *cf, int relu) {                 \
      enum { VL = 64 / (int)sizeof(T) };                                                           \
      const int64_t Cv = C - C % VL;                                                               \
      const T *A = cf, *Ma = cf + C, *B = cf + 2 * C, *Mb = cf + 3 * C, *D = cf + 4 * C;           \
      const int64_t nblk = (M + ROWBLK - 1) / ROWBLK;                                              \
      _Pragma("omp parallel for schedule(static) if (M * C > BN_GRAIN)")                           \
      for (int64_t bi = 0; bi < nblk; bi++) {                                                      \
         const int64_t rb = bi * ROWBLK, re = min64(rb + ROWBLK, M);                               \
         const V zero = {0};                                                                       \
         for (int64_t cb = 0; cb < Cv; cb += VL) {                                                 \
            const V vA = VLD(VU, A + cb), vMa = VLD(VU, Ma + cb), vD = VLD(VU, D + cb);            \
            if (b) {                                                                               \
               const V vB = VLD(VU, B + cb), vMb = VLD(VU, Mb + cb);                               \
               for (int64_t r = rb; r < re; r++) {                                                 \
                  const int64_t o = r * C + cb;                                                    \
                  V av = VLD(VU, a + o);                                                           \
                  if (mk) av = VMASK(VI, V, av, VLD(VU, mk + o), zero);                            \
                  VST(VU, y + o, vA * (av - vMa) + vB * (VLD(VU, b + o) - vMb) + vD);              \
               }                                                                                   \
            } else if (!mk && !res && !relu) {                                                     \
               for (int64_t r = rb; r < re; r++) {                                                 \
                  const int64_t o = r * C + cb;                                                    \
                  VST(VU, y + o, vA * (VLD(VU, a + o) - vMa) + vD);                                \
               }                                                                                   \
            } else {                                                                               \
               for (int64_t r = rb; r < re; r++) {                                                 \
                  const int64_t o = r * C + cb;                                                    \
                  V av = VLD(VU, a + o);                                                           \
                  if (mk) av = VMASK(VI, V, av, VLD(VU, mk + o), zero);                            \
                  V t = vA * (av - vMa) + vD;                                                      \
                  if (res) t += VLD(VU, res + o);                                                  \
                  if (relu) t = VRELU(VI, V, t, zero);                                             \
                  VST(VU, y + o, t);                                                               \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
         if (Cv < C) {                                                                             \
            for (int64_t r = rb; r < re; r++) {                                                    \
               const T *ar = a + r * C, *mr = mk ? mk + r * C : NULL;                              \
               T *yr = y + r * C;                                                                  \
               for (int64_t c = Cv; c < C; c++) {                                                  \
                  T av = ar[c];                                                                    \
                  if (mr && mr[c] <= 0) av = 0;                                                    \
                  T t;                                                                             \
                  if (b)                                                                           \
                     t = A[c] * (av - Ma[c]) + B[c] * (b[r * C + c] - Mb[c]) + D[c];               \
                  else                                                                             \
                     t = A[c] * (av - Ma[c]) + D[c];                                               \
                  if (res) t += res[r * C + c];                                                    \
                  if (relu && t < 0) t = 0;                                                        \
                  yr[c] = t;                                                                       \
               }                                                                                   \
            }                                                                                      \
         }                                                                                         \
      }                                                                                            \
   }                                                                                               \
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

/* a baseline copy and an AVX-512 copy (used when lm_gemm_isa() says AVX-512 is in use) */
DEFINE_BN(float, f32, , bn_vf, bn_vf_u, bn_vfi)
DEFINE_BN(double, f64, , bn_vd, bn_vd_u, bn_vdi)
DEFINE_BN(float, f32_512, LM_AVX512_FN, bn_vf, bn_vf_u, bn_vfi)
DEFINE_BN(double, f64_512, LM_AVX512_FN, bn_vd, bn_vd_u, bn_vdi)

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

/* s1, s2 (see the kernels); dy == NULL: statistics of x. mk / gm: the relu mask and the masked
   gradient (NULL for none). */
static void bn_sums(const void *x, const void *dy, const void *mk, void *gm, const void *K,
                    const bn_geom *g, int dt, bn_work *w, double *s1, double *s2) {
   const int v = use_avx512();
   if (dt == LM_FLOAT64) {
      if (g->rows)
         (v ? rows_sums_f64_512 : rows_sums_f64)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc,
                                                 s1, s2);
      else
         (v ? planes_sums_f64_512 : planes_sums_f64)(x, dy, mk, gm, K, g->N, g->C, g->S, w->part,
                                                     s1, s2);
   } else {
      if (g->rows)
         (v ? rows_sums_f32_512 : rows_sums_f32)(x, dy, mk, gm, K, g->M, g->C, w->part, w->facc,
                                                 s1, s2);
      else
         (v ? planes_sums_f32_512 : planes_sums_f32)(x, dy, mk, gm, K, g->N, g->C, g->S, w->part,
                                                     s1, s2);
   }
}

/* y = A (a' - Ma) + B (b - Mb) + D [+ res] [relu] per channel (a' = a masked by mk), coefficients
   given as doubles (Ma, B, Mb may be NULL for 0). Ma and Mb are rounded to T; the rounding is
   folded into D exactly, so that the large terms cancel before the multiplication (x - mean
   first, as PyTorch's backward). */
static void bn_affine(const void *a, const void *mk, const void *b, const void *res, void *y,
                      int relu, const bn_geom *g, int dt, bn_work *w, const double *A,
                      const double *Ma, const double *B, const double *Mb, const double *D) {
   const int64_t C = g->C;
   const int v = use_avx512();
   if (dt == LM_FLOAT64) {
      double *cf = w->coef;
      for (int64_t c = 0; c < C; c++) {
         cf[c] = A[c];
         cf[C + c] = Ma ? Ma[c] : 0;
         cf[2 * C + c] = B ? B[c] : 0;
         cf[3 * C + c] = Mb ? Mb[c] : 0;
         cf[4 * C + c] = D[c];
      }
      if (g->rows)
         (v ? rows_affine_f64_512 : rows_affine_f64)(a, mk, b, res, y, g->M, C, cf, relu);
      else
         (v ? planes_affine_f64_512 : planes_affine_f64)(a, mk, b, res, y, g->N, C, g->S, cf,
                                                         relu);
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
      if (g->rows)
         (v ? rows_affine_f32_512 : rows_affine_f32)(a, mk, b, res, y, g->M, C, cf, relu);
      else
         (v ? planes_affine_f32_512 : planes_affine_f32)(a, mk, b, res, y, g->N, C, g->S, cf,
                                                         relu);
   }
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
      const void *xp = lm_tensor_data(xd);
      if (training) {
         void *K = bn_K(&w, &g, dt);
         bn_shift(xp, &g, dt, K, NULL);
         if (g.M > 0) bn_sums(xp, NULL, NULL, NULL, K, &g, dt, &w, s1, s2);
         for (int64_t c = 0; c < C; c++) {
            if (g.M == 0) {
               mean[c] = 0;
               invstd[c] = 0;
               continue;
            }
            double k = dt == LM_FLOAT64 ? ((double *)K)[c] : ((float *)K)[c];
            double m1 = s1[c] / (double)g.M;
            double var = s2[c] / (double)g.M - m1 * m1;
            if (var < 0) var = 0;
            mean[c] = k + m1;
            invstd[c] = 1.0 / sqrt(var + eps);
            s2[c] = var; /* biased variance */
         }
         if (g.M > 0 && running_mean) {
            param_load(running_mean, C, 0.0, rm);
            for (int64_t c = 0; c < C; c++)
               rm[c] = (1.0 - momentum) * rm[c] + momentum * mean[c];
            param_store(running_mean, C, rm);
         }
         if (g.M > 0 && running_var) {
            param_load(running_var, C, 0.0, rv);
            const double unb = (double)g.M / (double)(g.M - 1);
            for (int64_t c = 0; c < C; c++)
               rv[c] = (1.0 - momentum) * rv[c] + momentum * s2[c] * unb;
            param_store(running_var, C, rv);
         }
      } else {
         param_load(running_mean, C, 0.0, mean);
         param_load(running_var, C, 1.0, rv);
         for (int64_t c = 0; c < C; c++) invstd[c] = 1.0 / sqrt(rv[c] + eps);
      }
      if (so.t->numel > 0) {
         for (int64_t c = 0; c < C; c++) A[c] = invstd[c] * wt[c];
         bn_affine(xp, NULL, NULL, rd ? lm_tensor_data(rd) : NULL, lm_tensor_data(so.t),
                   relu != 0, &g, dt, &w, A, mean, NULL, NULL, bs);
      }
   }
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
      for (int64_t c = 0; c < C; c++) s1[c] = s2[c] = 0;
      if (need_sums && g.M > 0) {
         void *K = bn_K(&w, &g, dt);
         bn_shift(xp, &g, dt, K, mean);
         /* s1 = sum dy, s2 = sum dy (x - K) (dy masked by the relu output) */
         bn_sums(xp, gp, mp, gmp, K, &g, dt, &w, s1, s2);
         for (int64_t c = 0; c < C; c++) { /* K is mean rounded to T */
            double k = dt == LM_FLOAT64 ? ((double *)K)[c] : ((float *)K)[c];
            s2[c] += (k - mean[c]) * s1[c];
         }
      }
      if (grad_x && sg.t->numel > 0) {
         for (int64_t c = 0; c < C; c++) {
            double a = invstd[c] * wt[c];
            A[c] = a;
            if (training) {
               double k = s2[c] / (double)g.M * invstd[c] * invstd[c];
               B[c] = -a * k;
               D[c] = -a * s1[c] / (double)g.M;
            } else {
               B[c] = 0;
               D[c] = 0;
            }
         }
         /* the masked gradient, when it was just written, is read back instead of masking
            grad_out again */
         const void *ga = gmp && need_sums && g.M > 0 ? gmp : gp;
         const void *ma = ga == gp ? mp : NULL;
         bn_affine(ga, ma, training ? xp : NULL, NULL, lm_tensor_data(sg.t), 0, &g, dt, &w, A,
                   NULL, B, mean, D);
      }
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
