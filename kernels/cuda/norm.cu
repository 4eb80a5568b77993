/* norm.cu -- LM_OP_BATCH_NORM and LM_OP_BATCH_NORM_BACKWARD on cuda:k (parameters and t[]
 * order: src/ops/norm.h; the CPU kernel, the semantic reference: kernels/cpu/norm.c).
 *
 * Our own kernels, not cuDNN's batch norm: lumen's op has semantics cuDNN's does not cover
 * (cudnnBatchNormalization* needs eps >= CUDNN_BN_MIN_EPSILON, a weight and a bias, all four
 * per-channel tensors dense and of one float type, no float64 running statistics with float32
 * data, and has no fused residual + relu for NCHW or float32 and no relu-masked backward), and
 * the CPU kernel is the reference the results must match. Each op is three launches of
 * lm_cu_for bodies, so the emulated build runs exactly this code on the host:
 *   1. partial sums: one thread per (chunk of rows, channel) sums its rows in double. Rows are
 *      the M = N * spatial positions; element (m, c) is at m C + c in the row layout (channels
 *      innermost: channels-last, channels-last-3d, or spatial size 1; neighbouring threads read
 *      neighbouring channels of a row: coalesced) and at (m / S) C S + c S + m % S in the plane
 *      layout (contiguous). Forward: sum (x - K) and sum (x - K)^2 with K the channel's first
 *      element (the CPU's shift, so the one-pass variance does not cancel); backward:
 *      sum g and sum g (x - mean) with g = grad_out masked by the relu output (g = 0 where
 *      relu_out <= 0; NaN passes), stored into grad_masked when asked for.
 *   1b. the chunks' sums added 64 at a time (bn_fold) until at most 64 per channel are left;
 *   2. one thread per channel adds those in order (deterministic throughout), then: mean, invstd
 *      (1 / sqrt(var + eps), the biased variance), the running statistics (momentum, the
 *      unbiased variance M / (M - 1), as PyTorch), save_mean / save_invstd (eval: the running
 *      mean and 1 / sqrt(running_var + eps)), grad_weight = sum g (x - mean) invstd, grad_bias =
 *      sum g, and the per-channel coefficients of pass 3, in double.
 *   3. one thread per element: y = relu((x - mean) invstd w + b [+ residual]) (NaN kept), or
 *      grad_x = A g + B (x - mean) + D with A = invstd w, B = -A invstd^2 sum(g (x - mean)) / M,
 *      D = -A sum(g) / M in training (B = D = 0 in eval).
 * Every per-channel tensor (weight, bias, running stats, saved stats, gradients) is read and
 * written through its own dtype and stride; the arithmetic is double throughout (the CPU's is
 * float32 for float32 / half data with double sums: differences are rounding only).
 *
 * THE FAST PATH (bn_fast_*, below the generic kernels). The generic kernels above are correct for
 * every layout and dtype but slow: each element goes through lm_load_as_double (a dtype switch),
 * double math, 64-bit index math (a 64-bit modulo per element for the channel), per-element
 * loads of the per-channel coefficients as doubles, and 2-byte loads per thread. Measured on an
 * H200 (LUMEN_CUDA_PROFILE beside torch.profiler, one ResNet50 training step, batch 256,
 * channels_last, bf16 autocast): batch_norm_backward 39.7 ms and batch_norm 21.2 ms per step,
 * against 24 ms for PyTorch's four channels-last kernels together (collect_statistics,
 * transform_input, backward_reduce, backward_elemt): the largest gap to PyTorch on the GPU.
 * So, as PyTorch's channels-last kernels do, for the common case -- x, y, residual, grad_out,
 * relu_out, grad_x, grad_masked all of one dtype (float32, bfloat16 or float16) and dense in the
 * rows layout (element (m, c) at m C + c: channels-last, channels-last-3d, or spatial size 1),
 * fewer than 2^30 rows -- the first and last passes are replaced (bn_fast_width decides; anything
 * else takes the generic path, which also serves as the tests' reference through the CPU):
 *   - templates on the storage type (float, or the 16-bit types through the CPU's exact
 *     conversions lm_bf2f / lm_h2f / lm_f2bf / lm_f2h) and on the vector width V: each thread
 *     owns V consecutive channels (16-byte loads: 8 halves or 4 floats, when C % V == 0 and every
 *     operand is 16-byte aligned; else 8 or 4 bytes; else 1 element) and walks rows with a
 *     32-bit row counter and a 64-bit offset it increments (no division per element);
 *   - sums (bn_reduce_kernel): a block of 256 threads is bx vectors of channels (a power of two,
 *     up to 32) by by = 256 / bx rows, so a warp reads 32 consecutive vectors of one row or whole
 *     consecutive rows (coalesced); the grid is gx column groups by gy row chunks, about 2048
 *     blocks (at most 64 registers and 32 KiB of shared memory each, so 4 or more resident per
 *     SM: several waves, little tail) with at least 16 rows per thread. A thread accumulates in
 *     float with the CPU's shift (x - K, K the channel's first element; backward: g and
 *     g (x - K), K = mean rounded to float, corrected in double afterwards as the CPU does),
 *     flushed every 64 rows (the CPU's SROWS) into double sums kept in the thread's own words
 *     of shared memory (not registers); the block's by threads of a
 *     channel are added in shared memory (double, a fixed tree: deterministic; consecutive
 *     threads on consecutive words: no bank conflicts beyond the two wavefronts a warp's 256
 *     bytes take) and written as per-(row chunk, channel) pairs in double, the layout of the
 *     generic pass 1, so bn_fold and pass 2 finish them unchanged (no atomics: every run adds in
 *     the same order). The backward's pass also masks g by the relu output and writes
 *     grad_masked;
 *   - pass 2 also writes float coefficients (the CPU's bn_coef: y = A (x - Ma) + D, grad_x =
 *     A g + B (x - Mb) + D with Ma, Mb the mean rounded to float and that rounding folded into D
 *     in double) into a small float array;
 *   - apply (lm_cu_for, one thread per (vector of channels, row chunk) with one 32-bit division
 *     per thread, not per element): the thread loads its channels' coefficients once, then
 *     walks about 16 rows RT apart with vector loads and stores; the relu (NaN kept), the
 *     residual, the relu mask of g (or grad_masked read back when pass 1 wrote it) as the CPU's
 *     half kernel orders them.
 * The emulated build runs the same per-thread bodies on the host (bn_reduce: a host loop over
 * blocks and threads, then the same shared-memory tree; it flushes the float sums every 4 rows,
 * so that small shapes run that loop's later rounds), so the suite checks the fast path's math
 * against the CPU (spec/cuda_dnn_spec.lua: every vector width, misaligned views, 2-D / 5-D,
 * folded sums); launch configurations and speed are the GPU's to check. */
#include "cuda.cuh"
#include "impl.h"
#include <stdlib.h>
#include "ops/norm.h"
#include <math.h>
#include <string.h>

/* a per-channel tensor (or none): pointer, stride in elements, element size, dtype */
typedef struct {
   char *p;
   int64_t st;
   int es, dt;
} bn_vec;

static bn_vec bn_vec_of(const lm_tensor *t) {
   bn_vec v = {NULL, 0, 0, 0};
   if (t && t->numel > 0) {
      v.p = lm_cu_ptr(t);
      v.st = t->strides[0];
      v.es = (int)lm_dtype_size(t->dtype);
      v.dt = t->dtype;
   }
   return v;
}
static inline LM_HD double bn_get(const bn_vec &v, int64_t c, double dflt) {
   return v.p ? lm_load_as_double(v.p + c * v.st * v.es, v.dt) : dflt;
}
static inline LM_HD void bn_put(const bn_vec &v, int64_t c, double x) {
   if (v.p) lm_store_from_double(v.p + c * v.st * v.es, v.dt, x);
}

/* the data layout: element (m, c) of the (M, C) view */
typedef struct {
   int64_t M, C, S;
   int rows;
   int small; /* M * C < 2^31: 32-bit index math in bn_chan */
} bn_lay;
static inline LM_HD int64_t bn_at(const bn_lay &l, int64_t m, int64_t c) {
   return l.rows ? m * l.C + c : (m / l.S) * l.C * l.S + c * l.S + m % l.S;
}
/* the channel of element i (dense in the layout); 32-bit division when every index fits (a
   64-bit division is a long instruction sequence on the GPU, once per element here) */
static inline LM_HD int64_t bn_chan(const bn_lay &l, int64_t i) {
   if (l.small) {
      const uint32_t u = (uint32_t)i, C = (uint32_t)l.C;
      return l.rows ? u % C : u / (uint32_t)l.S % C;
   }
   return l.rows ? i % l.C : (i / l.S) % l.C;
}
static inline LM_HD double bn_ld(const char *p, int64_t i, int es, int dt) {
   return lm_load_as_double(p + i * es, dt);
}
static inline LM_HD void bn_st(char *p, int64_t i, int es, int dt, double v) {
   lm_store_from_double(p + i * es, dt, v);
}

enum { BN_FOLD = 64 };

static bn_lay bn_layout(const lm_tensor *x, int mf) {
   bn_lay l;
   l.C = x->sizes[1];
   l.S = 1;
   for (int d = 2; d < x->ndim; d++) l.S *= x->sizes[d];
   l.M = x->sizes[0] * l.S;
   l.rows = mf == LM_CHANNELS_LAST || mf == LM_CHANNELS_LAST_3D || l.S == 1;
   l.small = l.M * l.C < ((int64_t)1 << 31);
   return l;
}

/* chunks of rows per channel for pass 1: about a million threads in all (enough loads in flight
   to keep the GPU's memory busy), each summing at least 16 rows */
static int64_t bn_chunks(const bn_lay &l) {
   int64_t ch = ((int64_t)1 << 20) / l.C;
   const int64_t most = l.M / 16 > 0 ? l.M / 16 : 1;
   if (ch > most) ch = most;
   if (ch < 1) ch = 1;
   return ch;
}
/* the partial-sum buffer pass 1 fills, plus the second buffer of bn_fold */
static int64_t bn_part_doubles(int64_t chunks, int64_t C) {
   return 2 * chunks * C + (chunks > BN_FOLD ? 2 * ((chunks + BN_FOLD - 1) / BN_FOLD) * C : 0);
}

/* add the partial sums (pairs, [chunk][channel]) BN_FOLD chunks at a time until at most
   BN_FOLD are left, between the two buffers a (pass 1's) and b; *out: where they are then.
   The order of the sums is fixed, so the results are the same every run. */
static lm_status bn_fold(int k, double *a, double *b, int64_t C, int64_t *chunks, double **out) {
   double *src = a, *dst = b;
   int64_t n = *chunks;
   while (n > BN_FOLD) {
      const int64_t m = (n + BN_FOLD - 1) / BN_FOLD, nn = n;
      const double *sp = src;
      double *dp = dst;
      lm_status st = lm_cu_for(k, m * C, [=] LM_HD(int64_t t) {
         const int64_t c = t % C, j = t / C;
         const int64_t j0 = j * BN_FOLD, j1 = j0 + BN_FOLD < nn ? j0 + BN_FOLD : nn;
         double s1 = 0, s2 = 0;
         for (int64_t q = j0; q < j1; q++) {
            s1 += sp[2 * (q * C + c)];
            s2 += sp[2 * (q * C + c) + 1];
         }
         dp[2 * t] = s1;
         dp[2 * t + 1] = s2;
      });
      if (st != LM_OK) return st;
      n = m;
      double *t = src;
      src = dst;
      dst = t;
   }
   *chunks = n;
   *out = src;
   return LM_OK;
}

/* device scratch of pass 1's partial sums (2 per thread) and pass 3's coefficients (3 per
   channel), freed (stream-ordered) when the op returns */
struct bn_scratch {
   int k;
   double *p = NULL;
   size_t bytes = 0;
   explicit bn_scratch(int dev) : k(dev) {}
   ~bn_scratch() {
      if (p) lm_cu_free(k, p, bytes);
   }
};

/* ============================== the fast path (see the top) ================================ */

/* unroll the loops over a vector's elements (device code only: the host compilers do not know
   the pragma, and nvcc's host pass would warn) */
#ifdef __CUDA_ARCH__
#define BN_UNROLL _Pragma("unroll")
#else
#define BN_UNROLL
#endif

/* the storage types: float, bfloat16, float16 (the 16-bit ones as their bits), to float and back
   with the CPU's conversions */
struct bn_t_f32 {
   typedef float st;
   static LM_HD float ld(float v) { return v; }
   static LM_HD float put(float v) { return v; }
};
struct bn_t_bf16 {
   typedef uint16_t st;
   static LM_HD float ld(uint16_t v) { return lm_bf2f(v); }
   static LM_HD uint16_t put(float v) { return lm_f2bf(v); }
};
struct bn_t_f16 {
   typedef uint16_t st;
   static LM_HD float ld(uint16_t v) { return lm_h2f(v); }
   static LM_HD uint16_t put(float v) { return lm_f2h(v); }
};

/* V elements loaded / stored as one (8, 4 or 2 bytes; 16 is one 128-bit instruction); the
   pointer must be aligned to the pack's size (bn_fast_width checks every operand) */
template <class S, int V> struct alignas(sizeof(S) * V) bn_pack {
   S v[V];
};
template <class S, int V> static inline LM_HD bn_pack<S, V> bn_vld(const S *p) {
#ifdef LM_CUDA_EMU
   bn_pack<S, V> r;
   memcpy(&r, p, sizeof r);
   return r;
#else
   return *reinterpret_cast<const bn_pack<S, V> *>(p);
#endif
}
template <class S, int V> static inline LM_HD void bn_vst(S *p, const bn_pack<S, V> &v) {
#ifdef LM_CUDA_EMU
   memcpy(p, &v, sizeof v);
#else
   *reinterpret_cast<bn_pack<S, V> *>(p) = v;
#endif
}

enum {
   BN_RT = 256,       /* threads of a reduction block */
   BN_RROWS = 16,     /* rows per thread in the sums, at least (fewer partial sums to fold) */
   BN_RBLOCKS = 2048, /* reduction blocks to aim for: ~15 per SM of an H200 */
   BN_AROWS = 16      /* rows per thread in the apply passes */
};
/* rows a thread sums in float before adding the sums to its double ones (the CPU's SROWS); the
   emulated build flushes every 4 rows, so that the suite's small shapes run the later rounds of
   that loop too */
#ifdef LM_CUDA_EMU
#define BN_FLUSH 4
#else
#define BN_FLUSH 64
#endif

/* the reduction's geometry: blocks of bx (vectors of channels) x by (rows) threads, a grid of gx
   column groups x gy row chunks of rb rows */
typedef struct {
   int64_t C, rb;
   int M, CV, bx, by, gx, gy;
} bn_red;

static bn_red bn_red_geom(int64_t M, int64_t C, int V) {
   bn_red r;
   r.C = C;
   r.M = (int)M;
   r.CV = (int)(C / V);
   r.bx = 1;
   while (r.bx < r.CV && r.bx < 32) r.bx <<= 1;
   r.by = BN_RT / r.bx;
   r.gx = (r.CV + r.bx - 1) / r.bx;
   int64_t gy = (M + (int64_t)r.by * BN_RROWS - 1) / ((int64_t)r.by * BN_RROWS);
   const int64_t want = (BN_RBLOCKS + r.gx - 1) / r.gx;
   if (gy > want) gy = want;
   if (gy > 65535) gy = 65535; /* gridDim.y's limit */
   if (gy < 1) gy = 1;
   r.rb = (M + gy - 1) / gy;
   r.gy = (int)((M + r.rb - 1) / r.rb); /* no empty chunk */
   return r;
}

/* the reduction bodies: thread (tx, ty) of block (bgx, bgy) leaves its 2 V sums in acc[j as],
   j < 2 V (its own words of the block's shared memory: the double sums stay out of registers,
   which the 16-bit V = 8 copies need for occupancy).
   The statistics of x: acc[v] = sum (x - K), acc[V + v] = sum (x - K)^2 over the thread's rows
   of its channels (zeros for a thread past the last vector) */
template <class D, int V> struct bn_stats_fn {
   typedef typename D::st S;
   const S *x;
   int64_t C, rb;
   int M, CV, bx, by;
   LM_HD void operator()(int bgx, int bgy, int tx, int ty, double *acc, int as) const {
      BN_UNROLL
      for (int j = 0; j < 2 * V; j++) acc[j * as] = 0;
      const int cv = bgx * bx + tx;
      if (cv >= CV) return;
      const int64_t c0 = (int64_t)cv * V;
      float K[V];
      const bn_pack<S, V> k0 = bn_vld<S, V>(x + c0);
      BN_UNROLL
      for (int v = 0; v < V; v++) {
         const float kk = D::ld(k0.v[v]);
         K[v] = kk - kk == 0.f ? kk : 0.f; /* not finite: no shift (the CPU's bn_shift) */
      }
      const int64_t r0 = (int64_t)bgy * rb, r1 = r0 + rb < M ? r0 + rb : M;
      int m = (int)r0 + ty;
      const int m1 = (int)r1;
      int64_t o = (int64_t)m * C + c0;
      const int64_t step = (int64_t)by * C;
      while (m < m1) {
         float a1[V], a2[V];
         BN_UNROLL
         for (int v = 0; v < V; v++) a1[v] = a2[v] = 0.f;
         /* two rows at a time where there are two (two loads in flight per thread; the sums
            in the same order as one at a time) */
         for (int q = 0; q < BN_FLUSH && m < m1;) {
            const int two = q + 1 < BN_FLUSH && m + by < m1;
            const bn_pack<S, V> xv = bn_vld<S, V>(x + o);
            bn_pack<S, V> xw = xv;
            if (two) xw = bn_vld<S, V>(x + o + step);
            BN_UNROLL
            for (int v = 0; v < V; v++) {
               const float d = D::ld(xv.v[v]) - K[v];
               a1[v] += d;
               a2[v] += d * d;
               if (two) {
                  const float e = D::ld(xw.v[v]) - K[v];
                  a1[v] += e;
                  a2[v] += e * e;
               }
            }
            q += 1 + two;
            m += by * (1 + two);
            o += step * (1 + two);
         }
         BN_UNROLL
         for (int v = 0; v < V; v++) {
            acc[v * as] += a1[v];
            acc[(V + v) * as] += a2[v];
         }
      }
   }
};

/* the backward's sums: g = grad_out masked by the relu output (g = 0 where relu_out <= 0; NaN
   passes), stored into grad_masked when asked for; acc[v] = sum g, acc[V + v] = sum g (x - K)
   with K = mean rounded to float (pass 2 moves the shift to the mean in double) */
template <class D, int V> struct bn_bsums_fn {
   typedef typename D::st S;
   const S *x, *gy, *mk;
   S *gm;
   bn_vec smv;
   int64_t C, rb;
   int M, CV, bx, by;
   LM_HD void operator()(int bgx, int bgy, int tx, int ty, double *acc, int as) const {
      BN_UNROLL
      for (int j = 0; j < 2 * V; j++) acc[j * as] = 0;
      const int cv = bgx * bx + tx;
      if (cv >= CV) return;
      const int64_t c0 = (int64_t)cv * V;
      float K[V];
      BN_UNROLL
      for (int v = 0; v < V; v++) K[v] = (float)bn_get(smv, c0 + v, 0);
      const int64_t r0 = (int64_t)bgy * rb, r1 = r0 + rb < M ? r0 + rb : M;
      int m = (int)r0 + ty;
      const int m1 = (int)r1;
      int64_t o = (int64_t)m * C + c0;
      const int64_t step = (int64_t)by * C;
      while (m < m1) {
         float a1[V], a2[V];
         BN_UNROLL
         for (int v = 0; v < V; v++) a1[v] = a2[v] = 0.f;
         for (int q = 0; q < BN_FLUSH && m < m1; q++, m += by, o += step) {
            const bn_pack<S, V> gv = bn_vld<S, V>(gy + o), xv = bn_vld<S, V>(x + o);
            float g[V];
            BN_UNROLL
            for (int v = 0; v < V; v++) g[v] = D::ld(gv.v[v]);
            if (mk) {
               const bn_pack<S, V> mv = bn_vld<S, V>(mk + o);
               BN_UNROLL
               for (int v = 0; v < V; v++)
                  if (D::ld(mv.v[v]) <= 0.f) g[v] = 0.f;
            }
            if (gm) {
               bn_pack<S, V> ov;
               BN_UNROLL
               for (int v = 0; v < V; v++) ov.v[v] = D::put(g[v]);
               bn_vst<S, V>(gm + o, ov);
            }
            BN_UNROLL
            for (int v = 0; v < V; v++) {
               a1[v] += g[v];
               a2[v] += g[v] * (D::ld(xv.v[v]) - K[v]);
            }
         }
         BN_UNROLL
         for (int v = 0; v < V; v++) {
            acc[v * as] += a1[v];
            acc[(V + v) * as] += a2[v];
         }
      }
   }
};

/* the shared-memory layout of a block's sums: component j (0 .. 2V) of thread (tx, ty) at
   (j by + ty) bx + tx, so a warp touches consecutive doubles */
static inline LM_HD int bn_sh(int j, int tx, int ty, int bx, int by) { return (j * by + ty) * bx + tx; }

/* thread tx of row 0 (after the tree) writes its channels' pairs of row chunk bgy */
template <int V>
static inline LM_HD void bn_red_out(const double *sh, double *part, const bn_red &g, int bgx,
                                    int bgy, int tx) {
   const int cv = bgx * g.bx + tx;
   if (cv >= g.CV) return;
   double *o = part + 2 * ((int64_t)bgy * g.C + (int64_t)cv * V);
   BN_UNROLL
   for (int v = 0; v < V; v++) {
      o[2 * v] = sh[bn_sh(v, tx, 0, g.bx, g.by)];
      o[2 * v + 1] = sh[bn_sh(V + v, tx, 0, g.bx, g.by)];
   }
}

#ifndef LM_CUDA_EMU
template <int V, class F>
__global__ void __launch_bounds__(BN_RT, 4) bn_reduce_kernel(F f, bn_red g, double *part) {
   __shared__ double sh[2 * V * BN_RT];
   const int tx = threadIdx.x, ty = threadIdx.y, bx = g.bx, by = g.by;
   f((int)blockIdx.x, (int)blockIdx.y, tx, ty, sh + bn_sh(0, tx, ty, bx, by), bx * by);
   __syncthreads();
   for (int s = by >> 1; s > 0; s >>= 1) { /* the same tree as the emulated build's */
      if (ty < s) {
         BN_UNROLL
         for (int j = 0; j < 2 * V; j++)
            sh[bn_sh(j, tx, ty, bx, by)] += sh[bn_sh(j, tx, ty + s, bx, by)];
      }
      __syncthreads();
   }
   if (ty == 0) bn_red_out<V>(sh, part, g, (int)blockIdx.x, (int)blockIdx.y, tx);
}
#endif

/* the per-(row chunk, channel) sums of f into part ([g.gy][C] pairs) */
template <int V, class F>
static lm_status bn_reduce(int k, const bn_red &g, const F &f, double *part) {
#ifdef LM_CUDA_EMU
   return lm_cu_host(k, [g, f, part]() {
      double sh[2 * V * BN_RT];
      for (int bgy = 0; bgy < g.gy; bgy++)
         for (int bgx = 0; bgx < g.gx; bgx++) {
            for (int ty = 0; ty < g.by; ty++)
               for (int tx = 0; tx < g.bx; tx++)
                  f(bgx, bgy, tx, ty, sh + bn_sh(0, tx, ty, g.bx, g.by), g.bx * g.by);
            for (int s = g.by >> 1; s > 0; s >>= 1)
               for (int ty = 0; ty < s; ty++)
                  for (int tx = 0; tx < g.bx; tx++)
                     for (int j = 0; j < 2 * V; j++)
                        sh[bn_sh(j, tx, ty, g.bx, g.by)] += sh[bn_sh(j, tx, ty + s, g.bx, g.by)];
            for (int tx = 0; tx < g.bx; tx++) bn_red_out<V>(sh, part, g, bgx, bgy, tx);
         }
      return LM_OK;
   });
#else
   bn_reduce_kernel<V, F><<<dim3((unsigned)g.gx, (unsigned)g.gy), dim3((unsigned)g.bx,
                                                                       (unsigned)g.by),
                            0, lm_cu_stream(k)>>>(f, g, part);
   return lm_cu_err(cudaPeekAtLastError(), "kernel launch");
#endif
}

/* the apply passes' threads: thread t owns vector t % CV of every RT-th row from t / CV */
typedef struct {
   int64_t C, RT, T;
   int M, CV, small; /* small: T < 2^31, the division in 32 bits */
} bn_app;

static bn_app bn_app_geom(int64_t M, int64_t C, int V) {
   bn_app a;
   a.C = C;
   a.M = (int)M;
   a.CV = (int)(C / V);
   a.RT = (M + BN_AROWS - 1) / BN_AROWS;
   a.T = a.RT * a.CV;
   a.small = a.T < ((int64_t)1 << 31);
   return a;
}
static inline LM_HD void bn_app_start(const bn_app &a, int64_t t, int *cv, int *m) {
   if (a.small) {
      const uint32_t u = (uint32_t)t, cvn = (uint32_t)a.CV;
      *m = (int)(u / cvn);
      *cv = (int)(u - (uint32_t)*m * cvn);
   } else {
      *m = (int)(t / a.CV);
      *cv = (int)(t - (int64_t)*m * a.CV);
   }
}

/* forward: y = relu(A (x - Ma) + D [+ residual]) (NaN kept), A, Ma, D: float per channel */
template <class D, int V> struct bn_fwd_apply_fn {
   typedef typename D::st S;
   const S *x, *r;
   S *y;
   const float *cf; /* A, Ma, D: C each */
   bn_app a;
   int relu;
   LM_HD void operator()(int64_t t) const {
      int cv, m;
      bn_app_start(a, t, &cv, &m);
      const int64_t C = a.C, c0 = (int64_t)cv * V;
      const bn_pack<float, V> A = bn_vld<float, V>(cf + c0), Ma = bn_vld<float, V>(cf + C + c0),
                              Dd = bn_vld<float, V>(cf + 2 * C + c0);
      int64_t o = (int64_t)m * C + c0;
      const int64_t step = a.RT * C;
      for (; m < a.M; m += (int)a.RT, o += step) {
         const bn_pack<S, V> xv = bn_vld<S, V>(x + o);
         float v[V];
         BN_UNROLL
         for (int j = 0; j < V; j++) v[j] = A.v[j] * (D::ld(xv.v[j]) - Ma.v[j]) + Dd.v[j];
         if (r) {
            const bn_pack<S, V> rv = bn_vld<S, V>(r + o);
            BN_UNROLL
            for (int j = 0; j < V; j++) v[j] += D::ld(rv.v[j]);
         }
         bn_pack<S, V> out;
         BN_UNROLL
         for (int j = 0; j < V; j++) {
            if (relu && v[j] < 0.f) v[j] = 0.f; /* NaN stays NaN */
            out.v[j] = D::put(v[j]);
         }
         bn_vst<S, V>(y + o, out);
      }
   }
};

/* backward: grad_x = A g + D [+ B (x - Mb) in training], g = grad_out masked by mk (or the
   masked gradient pass 1 wrote, mk NULL); A, B, Mb, D: float per channel */
template <class D, int V> struct bn_bwd_apply_fn {
   typedef typename D::st S;
   const S *g, *mk, *x;
   S *gx;
   const float *cf; /* A, B, Mb, D: C each */
   bn_app a;
   int training;
   LM_HD void operator()(int64_t t) const {
      int cv, m;
      bn_app_start(a, t, &cv, &m);
      const int64_t C = a.C, c0 = (int64_t)cv * V;
      const bn_pack<float, V> A = bn_vld<float, V>(cf + c0), B = bn_vld<float, V>(cf + C + c0),
                              Mb = bn_vld<float, V>(cf + 2 * C + c0),
                              Dd = bn_vld<float, V>(cf + 3 * C + c0);
      int64_t o = (int64_t)m * C + c0;
      const int64_t step = a.RT * C;
      for (; m < a.M; m += (int)a.RT, o += step) {
         const bn_pack<S, V> gv = bn_vld<S, V>(g + o);
         float gg[V];
         BN_UNROLL
         for (int j = 0; j < V; j++) gg[j] = D::ld(gv.v[j]);
         if (mk) {
            const bn_pack<S, V> mv = bn_vld<S, V>(mk + o);
            BN_UNROLL
            for (int j = 0; j < V; j++)
               if (D::ld(mv.v[j]) <= 0.f) gg[j] = 0.f;
         }
         float v[V];
         BN_UNROLL
         for (int j = 0; j < V; j++) v[j] = A.v[j] * gg[j] + Dd.v[j];
         if (training) {
            const bn_pack<S, V> xv = bn_vld<S, V>(x + o);
            BN_UNROLL
            for (int j = 0; j < V; j++) v[j] += B.v[j] * (D::ld(xv.v[j]) - Mb.v[j]);
         }
         bn_pack<S, V> out;
         BN_UNROLL
         for (int j = 0; j < V; j++) out.v[j] = D::put(v[j]);
         bn_vst<S, V>(gx + o, out);
      }
   }
};

/* the operands of one fast op (NULL: absent) */
typedef struct {
   int k, relu, training;
   int64_t M, C;
   const char *x, *r, *gy, *mk;
   char *y, *gx, *gm;
   bn_vec smv;
   double *part;
   const float *cf;
} bn_fargs;

/* the fast kernels of one storage type D and width V */
template <class D, int V> struct bn_fast {
   typedef typename D::st S;
   /* forward pass 1 into f.part, [gy][C] pairs; *chunks: gy */
   static lm_status stats(const bn_fargs &f, int64_t *chunks) {
      const bn_red g = bn_red_geom(f.M, f.C, V);
      bn_stats_fn<D, V> fn;
      fn.x = (const S *)f.x;
      fn.C = g.C;
      fn.rb = g.rb;
      fn.M = g.M;
      fn.CV = g.CV;
      fn.bx = g.bx;
      fn.by = g.by;
      *chunks = g.gy;
      return bn_reduce<V>(f.k, g, fn, f.part);
   }
   static lm_status bsums(const bn_fargs &f, int64_t *chunks) {
      const bn_red g = bn_red_geom(f.M, f.C, V);
      bn_bsums_fn<D, V> fn;
      fn.x = (const S *)f.x;
      fn.gy = (const S *)f.gy;
      fn.mk = (const S *)f.mk;
      fn.gm = (S *)f.gm;
      fn.smv = f.smv;
      fn.C = g.C;
      fn.rb = g.rb;
      fn.M = g.M;
      fn.CV = g.CV;
      fn.bx = g.bx;
      fn.by = g.by;
      *chunks = g.gy;
      return bn_reduce<V>(f.k, g, fn, f.part);
   }
   static lm_status fwd(const bn_fargs &f) {
      bn_fwd_apply_fn<D, V> fn;
      fn.x = (const S *)f.x;
      fn.r = (const S *)f.r;
      fn.y = (S *)f.y;
      fn.cf = f.cf;
      fn.a = bn_app_geom(f.M, f.C, V);
      fn.relu = f.relu;
      return lm_cu_for(f.k, fn.a.T, fn);
   }
   /* f.gy: the gradient to read (grad_masked when pass 1 wrote it), f.mk: its mask or NULL */
   static lm_status bwd(const bn_fargs &f) {
      bn_bwd_apply_fn<D, V> fn;
      fn.g = (const S *)f.gy;
      fn.mk = (const S *)f.mk;
      fn.x = (const S *)f.x;
      fn.gx = (S *)f.gx;
      fn.cf = f.cf;
      fn.a = bn_app_geom(f.M, f.C, V);
      fn.training = f.training;
      return lm_cu_for(f.k, fn.a.T, fn);
   }
};

typedef struct {
   lm_status (*stats)(const bn_fargs &, int64_t *);
   lm_status (*bsums)(const bn_fargs &, int64_t *);
   lm_status (*fwd)(const bn_fargs &);
   lm_status (*bwd)(const bn_fargs &);
} bn_fast_ops;

template <class D, int V> static bn_fast_ops bn_ops_of() {
   bn_fast_ops o = {bn_fast<D, V>::stats, bn_fast<D, V>::bsums, bn_fast<D, V>::fwd,
                    bn_fast<D, V>::bwd};
   return o;
}

template <class D> static bn_fast_ops bn_ops_w(int V) {
   switch (V) {
   case 8: return bn_ops_of<D, 8>();
   case 4: return bn_ops_of<D, 4>();
   case 2: return bn_ops_of<D, 2>();
   default: return bn_ops_of<D, 1>();
   }
}
/* the float32 copies stop at 4 (16 bytes) */
template <> bn_fast_ops bn_ops_w<bn_t_f32>(int V) {
   switch (V) {
   case 4: return bn_ops_of<bn_t_f32, 4>();
   case 2: return bn_ops_of<bn_t_f32, 2>();
   default: return bn_ops_of<bn_t_f32, 1>();
   }
}

static bn_fast_ops bn_fast_pick(int dt, int V) {
   if (dt == LM_BFLOAT16) return bn_ops_w<bn_t_bf16>(V);
   if (dt == LM_FLOAT16) return bn_ops_w<bn_t_f16>(V);
   return bn_ops_w<bn_t_f32>(V);
}

/* is t of x's shape and dtype and dense in the rows layout (element (m, c) at m C + c)? */
static int bn_rows_dense(const lm_tensor *t, const lm_tensor *x) {
   if (t->ndim != x->ndim || t->dtype != x->dtype) return 0;
   for (int d = 0; d < x->ndim; d++)
      if (t->sizes[d] != x->sizes[d]) return 0;
   int64_t want = t->sizes[1];
   for (int d = t->ndim - 1; d >= 2; d--) {
      if (t->sizes[d] > 1 && t->strides[d] != want) return 0;
      want *= t->sizes[d];
   }
   if (t->sizes[0] > 1 && t->strides[0] != want) return 0;
   if (t->sizes[1] > 1 && t->strides[1] != 1) return 0;
   return 1;
}

/* the fast path's vector width for these operands (x first; NULL entries skipped), 0 for the
   generic path: float32 / bfloat16 / float16, all of x's shape and dtype, dense in the rows
   layout, some rows and channels (fewer than 2^30 rows: 32-bit row counters); the widest V of
   16, 8, 4 bytes (or 1 element) with C % V == 0 and every operand aligned to V elements */
/* LUMEN_CUDA_BN_FAST=0 keeps every batch norm on the generic path (the fast path landed without a
   GPU run: the switch lets one GPU run measure both, and step around it if it misbehaves) */
static int bn_fast_on(void) {
   static int v = -1;
   if (v < 0) {
      const char *e = getenv("LUMEN_CUDA_BN_FAST");
      v = !(e && *e == '0');
   }
   return v;
}

static int bn_fast_width(const bn_lay &l, const lm_tensor *const *ops, int nops) {
   if (!bn_fast_on()) return 0;
   const lm_tensor *x = ops[0];
   const int dt = x->dtype;
   if (!l.rows || (dt != LM_FLOAT32 && dt != LM_BFLOAT16 && dt != LM_FLOAT16)) return 0;
   if (x->ndim < 2 || l.M <= 0 || l.C <= 0 || l.M >= ((int64_t)1 << 30) ||
       l.C >= ((int64_t)1 << 30))
      return 0;
   for (int i = 0; i < nops; i++)
      if (ops[i] && !bn_rows_dense(ops[i], x)) return 0;
   const int es = (int)lm_dtype_size(dt);
   for (int V = 16 / es; V > 1; V >>= 1) {
      if (l.C % V) continue;
      int ok = 1;
      for (int i = 0; i < nops; i++)
         if (ops[i] && (uintptr_t)lm_cu_ptr(ops[i]) % (uintptr_t)(V * es)) ok = 0;
      if (ok) return V;
   }
   return 1;
}

/* the float coefficients of the fast path go first in the scratch (aligned as the allocation,
   so that their vector loads are): 4 C floats, rounded up to 32 bytes, in doubles */
static int64_t bn_cf_doubles(int64_t C) { return (3 * C + 3) / 4 * 4; }

/* LM_OP_BATCH_NORM: t = {x, weight, bias, running_mean, running_var, residual, y, save_mean,
   save_invstd} */
static lm_status k_batch_norm(const lm_op *op) {
   const lm_batch_norm_params *prm = (const lm_batch_norm_params *)op->params;
   const lm_tensor *x = op->t[0], *res = op->t[5];
   lm_tensor *y = op->t[6];
   const int k = lm_cu_index(x);
   const bn_lay l = bn_layout(x, prm->mf);
   if (l.C == 0) return LM_OK;
   const bn_vec wv = bn_vec_of(op->t[1]), bv = bn_vec_of(op->t[2]);
   const bn_vec rmv = bn_vec_of(op->t[3]), rvv = bn_vec_of(op->t[4]);
   const bn_vec smv = bn_vec_of(op->t[7]), siv = bn_vec_of(op->t[8]);
   const int dt = x->dtype, es = (int)lm_dtype_size(dt);
   const int training = prm->training, relu = prm->relu;
   const double momentum = prm->momentum, eps = prm->eps;
   if (res && res->dtype != dt)
      return lm_error(LM_ERR_DTYPE, "batch_norm: residual %s, input %s", lm_dtype_name(res->dtype),
                      lm_dtype_name(dt));
   if (y && y->numel > 0 && y->dtype != dt)
      return lm_error(LM_ERR_DTYPE, "batch_norm: output %s, input %s", lm_dtype_name(y->dtype),
                      lm_dtype_name(dt));
   if (!training && (!rmv.p || !rvv.p))
      return lm_error(LM_ERR_ARG, "running_mean and running_var must be defined in evaluation mode");
   const int64_t C = l.C, M = l.M;
   const lm_tensor *fops[3] = {x, res, y && y->numel > 0 ? y : NULL};
   const int fw = bn_fast_width(l, fops, 3);
   const bn_fast_ops fo = bn_fast_pick(dt, fw);
   int64_t chunks = training && M > 0 ? bn_chunks(l) : 0;
   if (fw && training) chunks = bn_red_geom(M, C, fw).gy;
   const int64_t per = chunks ? (M + chunks - 1) / chunks : 0;
   bn_scratch s(k);
   const int64_t pn = bn_part_doubles(chunks, C), cn = bn_cf_doubles(C);
   s.bytes = (size_t)(pn + cn) * sizeof(double);
   s.p = (double *)lm_cu_alloc(k, s.bytes);
   if (!s.p) return LM_ERR_OOM;
   /* cf: A, mean, b per channel (double); fast path: fcf, A, Ma, D (float) */
   double *cf = s.p, *part = s.p + cn;
   float *fcf = fw ? (float *)s.p : NULL;
   const char *xp = lm_cu_ptr(x);
   lm_status st = LM_OK;
   bn_fargs fa;
   memset(&fa, 0, sizeof fa);
   /* LUMEN_VERBOSE (src/impl.h): the channels-last fast kernels or the general ones */
   lm_impl_ran_name(fw ? "lumen_nhwc_fast" : "lumen_general");
   if (fw) {
      fa.k = k;
      fa.relu = relu;
      fa.training = training;
      fa.M = M;
      fa.C = C;
      fa.x = xp;
      fa.r = res ? lm_cu_ptr(res) : NULL;
      fa.y = y && y->numel > 0 ? lm_cu_ptr(y) : NULL;
      fa.part = part;
      fa.cf = fcf;
   }

   if (chunks && fw) { /* 1. (fast) the same sums per (row chunk, channel) */
      int64_t n = 0;
      st = fo.stats(fa, &n);
      if (st != LM_OK) return st;
   } else if (chunks) { /* 1. partial sums of (x - K), (x - K)^2 */
      st = lm_cu_for(k, chunks * C, [=] LM_HD(int64_t t) {
         const int64_t c = t % C, j = t / C;
         const int64_t m0 = j * per, m1 = m0 + per < M ? m0 + per : M;
         double kk = bn_ld(xp, bn_at(l, 0, c), es, dt);
         if (!(kk - kk == 0.0)) kk = 0; /* not finite: no shift */
         double s1 = 0, s2 = 0;
         for (int64_t m = m0; m < m1; m++) {
            const double d = bn_ld(xp, bn_at(l, m, c), es, dt) - kk;
            s1 += d;
            s2 += d * d;
         }
         part[2 * t] = s1;
         part[2 * t + 1] = s2;
      });
      if (st != LM_OK) return st;
   }
   int64_t nfin = chunks;
   double *fin = part;
   if (chunks) {
      st = bn_fold(k, part, part + 2 * chunks * C, C, &nfin, &fin);
      if (st != LM_OK) return st;
   }
   /* 2. per channel: the statistics, the running stats, the saved ones, the coefficients */
   st = lm_cu_for(k, C, [=] LM_HD(int64_t c) {
      double mean, invstd;
      if (training) {
         if (M == 0) {
            mean = 0;
            invstd = 0;
         } else {
            double s1 = 0, s2 = 0;
            for (int64_t j = 0; j < nfin; j++) {
               s1 += fin[2 * (j * C + c)];
               s2 += fin[2 * (j * C + c) + 1];
            }
            double kk = bn_ld(xp, bn_at(l, 0, c), es, dt);
            if (!(kk - kk == 0.0)) kk = 0;
            const double m1 = s1 / (double)M;
            double var = s2 / (double)M - m1 * m1;
            if (var < 0) var = 0;
            mean = kk + m1;
            invstd = 1.0 / sqrt(var + eps);
            if (rmv.p) bn_put(rmv, c, (1.0 - momentum) * bn_get(rmv, c, 0) + momentum * mean);
            if (rvv.p)
               bn_put(rvv, c, (1.0 - momentum) * bn_get(rvv, c, 0) +
                                 momentum * var * ((double)M / (double)(M - 1)));
         }
      } else {
         mean = bn_get(rmv, c, 0);
         invstd = 1.0 / sqrt(bn_get(rvv, c, 1) + eps);
      }
      bn_put(smv, c, mean);
      bn_put(siv, c, invstd);
      const double a = invstd * bn_get(wv, c, 1.0), b = bn_get(bv, c, 0.0);
      if (fcf) { /* the CPU's bn_coef: mean rounded to float, the rounding folded into D */
         const float ma = (float)mean;
         fcf[c] = (float)a;
         fcf[C + c] = ma;
         fcf[2 * C + c] = (float)(b + a * ((double)ma - mean));
      } else {
         cf[c] = a;
         cf[C + c] = mean;
         cf[2 * C + c] = b;
      }
   });
   if (st != LM_OK) return st;
   /* 3. y = relu((x - mean) A + b [+ residual]) */
   if (fw && fa.y) return fo.fwd(fa);
   if (y && y->numel > 0) {
      char *yp = lm_cu_ptr(y);
      const char *rp = res ? lm_cu_ptr(res) : NULL;
      st = lm_cu_for(k, y->numel, [=] LM_HD(int64_t i) {
         const int64_t c = bn_chan(l, i);
         double v = (bn_ld(xp, i, es, dt) - cf[C + c]) * cf[c] + cf[2 * C + c];
         if (rp) v += bn_ld(rp, i, es, dt);
         if (relu && v < 0) v = 0; /* NaN stays NaN */
         bn_st(yp, i, es, dt, v);
      });
      if (st != LM_OK) return st;
   }
   return LM_OK;
}

/* LM_OP_BATCH_NORM_BACKWARD: t = {grad_out, relu_out, x, weight, save_mean, save_invstd, grad_x,
   grad_weight, grad_bias, grad_masked} */
static lm_status k_batch_norm_backward(const lm_op *op) {
   const lm_batch_norm_params *prm = (const lm_batch_norm_params *)op->params;
   const lm_tensor *gy = op->t[0], *mk = op->t[1], *x = op->t[2];
   lm_tensor *gx = op->t[6], *gm = op->t[9];
   const int k = lm_cu_index(x);
   const bn_lay l = bn_layout(x, prm->mf);
   if (l.C == 0) return LM_OK;
   const bn_vec wv = bn_vec_of(op->t[3]), smv = bn_vec_of(op->t[4]), siv = bn_vec_of(op->t[5]);
   const bn_vec gwv = bn_vec_of(op->t[7]), gbv = bn_vec_of(op->t[8]);
   const int dt = x->dtype, es = (int)lm_dtype_size(dt);
   const int training = prm->training;
   if (gy->dtype != dt || (mk && mk->dtype != dt) || (gx && gx->numel > 0 && gx->dtype != dt) ||
       (gm && gm->numel > 0 && gm->dtype != dt))
      return lm_error(LM_ERR_DTYPE, "batch_norm_backward: operands of x's shape must have its "
                      "dtype %s", lm_dtype_name(dt));
   const int64_t C = l.C, M = l.M;
   char *gxp = gx && gx->numel > 0 ? lm_cu_ptr(gx) : NULL;
   char *gmp = gm && gm->numel > 0 ? lm_cu_ptr(gm) : NULL;
   const int need_sums = gwv.p || gbv.p || (gxp && training) || gmp;
   const lm_tensor *fops[5] = {x, gy, mk, gxp ? gx : NULL, gmp ? gm : NULL};
   const int fw = bn_fast_width(l, fops, 5);
   const bn_fast_ops fo = bn_fast_pick(dt, fw);
   int64_t chunks = need_sums && M > 0 ? bn_chunks(l) : 0;
   if (fw && chunks) chunks = bn_red_geom(M, C, fw).gy;
   const int64_t per = chunks ? (M + chunks - 1) / chunks : 0;
   bn_scratch s(k);
   const int64_t pn = bn_part_doubles(chunks, C), cn = bn_cf_doubles(C);
   s.bytes = (size_t)(pn + cn) * sizeof(double);
   s.p = (double *)lm_cu_alloc(k, s.bytes);
   if (!s.p) return LM_ERR_OOM;
   /* cf: A, B, D per channel (double); fast path: fcf, A, B, Mb, D (float) */
   double *cf = s.p, *part = s.p + cn;
   float *fcf = fw ? (float *)s.p : NULL;
   const char *xp = lm_cu_ptr(x), *gyp = lm_cu_ptr(gy), *mkp = mk ? lm_cu_ptr(mk) : NULL;
   lm_status st = LM_OK;
   bn_fargs fa;
   memset(&fa, 0, sizeof fa);
   /* LUMEN_VERBOSE (src/impl.h): the channels-last fast kernels or the general ones */
   lm_impl_ran_name(fw ? "lumen_nhwc_fast" : "lumen_general");
   if (fw) {
      fa.k = k;
      fa.training = training;
      fa.M = M;
      fa.C = C;
      fa.x = xp;
      fa.gy = gyp;
      fa.mk = mkp;
      fa.gx = gxp;
      fa.gm = gmp;
      fa.smv = smv;
      fa.part = part;
      fa.cf = fcf;
   }

   if (chunks && fw) { /* 1. (fast) the same sums, shifted by the mean rounded to float */
      int64_t n = 0;
      st = fo.bsums(fa, &n);
      if (st != LM_OK) return st;
   } else if (chunks) { /* 1. sums of g and g (x - mean), g masked by the relu output */
      st = lm_cu_for(k, chunks * C, [=] LM_HD(int64_t t) {
         const int64_t c = t % C, j = t / C;
         const int64_t m0 = j * per, m1 = m0 + per < M ? m0 + per : M;
         const double mean = bn_get(smv, c, 0);
         double s1 = 0, s2 = 0;
         for (int64_t m = m0; m < m1; m++) {
            const int64_t i = bn_at(l, m, c);
            double g = bn_ld(gyp, i, es, dt);
            if (mkp && bn_ld(mkp, i, es, dt) <= 0) g = 0; /* relu_backward: NaN passes */
            if (gmp) bn_st(gmp, i, es, dt, g);
            s1 += g;
            s2 += g * (bn_ld(xp, i, es, dt) - mean);
         }
         part[2 * t] = s1;
         part[2 * t + 1] = s2;
      });
      if (st != LM_OK) return st;
   }
   int64_t nfin = chunks;
   double *fin = part;
   if (chunks) {
      st = bn_fold(k, part, part + 2 * chunks * C, C, &nfin, &fin);
      if (st != LM_OK) return st;
   }
   /* 2. per channel: grad_weight, grad_bias, the coefficients of grad_x */
   st = lm_cu_for(k, C, [=] LM_HD(int64_t c) {
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < nfin; j++) {
         s1 += fin[2 * (j * C + c)];
         s2 += fin[2 * (j * C + c) + 1];
      }
      const double invstd = bn_get(siv, c, 0);
      const double mean = fcf ? bn_get(smv, c, 0) : 0.0;
      const float mb = (float)mean; /* the fast sums' shift K */
      if (fcf) s2 += ((double)mb - mean) * s1;
      bn_put(gwv, c, s2 * invstd);
      bn_put(gbv, c, s1);
      const double a = invstd * bn_get(wv, c, 1.0);
      const double b = training && M > 0 ? -a * (s2 / (double)M) * invstd * invstd : 0.0;
      const double d = training && M > 0 ? -a * s1 / (double)M : 0.0;
      if (fcf) { /* the CPU's bn_coef: grad_x = A g + B (x - Mb) + D, Mb's rounding in D */
         fcf[c] = (float)a;
         fcf[C + c] = (float)b;
         fcf[2 * C + c] = mb;
         fcf[3 * C + c] = (float)(d + b * ((double)mb - mean));
      } else {
         cf[c] = a;
         cf[C + c] = b;
         cf[2 * C + c] = d;
      }
   });
   if (st != LM_OK) return st;
   /* 3. grad_x = A g + B (x - mean) + D */
   if (fw && gxp) {
      /* the masked gradient, when pass 1 wrote it, is read back instead of masking again */
      if (gmp && chunks) {
         fa.gy = gmp;
         fa.mk = NULL;
      }
      return fo.bwd(fa);
   }
   if (gxp) {
      st = lm_cu_for(k, gx->numel, [=] LM_HD(int64_t i) {
         const int64_t c = bn_chan(l, i);
         double g = bn_ld(gyp, i, es, dt);
         if (mkp && bn_ld(mkp, i, es, dt) <= 0) g = 0;
         double v = cf[c] * g + cf[2 * C + c];
         if (training) v += cf[C + c] * (bn_ld(xp, i, es, dt) - bn_get(smv, c, 0));
         bn_st(gxp, i, es, dt, v);
      });
      if (st != LM_OK) return st;
   }
   return LM_OK;
}

void lm_cuda_register_norm(lm_kernel_fn *table) {
   table[LM_OP_BATCH_NORM] = k_batch_norm;
   table[LM_OP_BATCH_NORM_BACKWARD] = k_batch_norm_backward;
}
