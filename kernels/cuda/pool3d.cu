/* pool3d.cu -- the CUDA kernels of the 3-D pools: max / average / adaptive pooling over volumes,
 * forward and backward (params and t[] order: src/ops/pool3d.h; front ends: src/ops/pool3d.c;
 * the semantic reference: kernels/cpu/pool3d.c). The structure follows the 2-D pools
 * (kernels/cuda/pool.cu); the window arithmetic is the same per dimension, three times: the
 * window rules, the covers, the thread index decomposition, the channel groups, the index
 * check's counters and the launches are pool_common.cuh's, shared with it.
 *
 * The front end hands every tensor dense in mf (LM_CHANNELS_LAST_3D when the input suggests it,
 * else LM_CONTIGUOUS) and float32 or float64 (float16 / bfloat16 run on float32 copies there,
 * rounded once). The kernels still address each tensor through its (n, c, d, h, w) strides; mf
 * only decides the order of the threads: NCDHW puts w on the fastest thread index, NDHWC puts c
 * there, so neighbouring threads read and write neighbouring channels (coalesced); there the max
 * forward and the gathers give each thread up to VMAX (4) consecutive channels, so that the
 * window / cover arithmetic is paid once for them.
 *
 * Forward: one thread per output element, looping over its window in (d, h, w) order as the CPU
 * (max_fwd3, avg_fwd3): the same taps, the same NaN / tie rules, the same summation order, so
 * values and int64 indices are the CPU's bit for bit. The global average of a video model's head
 * (r3d_18: adaptive_avg_pool3d to 1x1x1) is then, in NDHWC, one thread per (n, c) walking the
 * D*H*W voxels with a stride of C: each step of a warp reads one coalesced row of channels.
 *
 * Backward: no atomics on values where they could change a sum.
 *   - avg_pool3d / adaptive_avg_pool3d: a gather, one thread per grad_input element adding each
 *     covering window's gradient over its divisor in (od, oh, ow) order from 0 -- the CPU's
 *     scatter's additions into a zeroed grad_input, in the same order (bit-identical).
 *   - max_pool3d given the geometry (lm_max_pool3d_backward_geom: autograd) and
 *     adaptive_max_pool3d (whose windows follow from the sizes): the saved indices are checked
 *     first (one pass, two counters read back: outside the volume = the CPU's error; inside the
 *     volume but off their window = only hand-made indices, which the CPU's scatter takes); when
 *     all lie in their windows, a gather as above over the windows holding the voxel whose index
 *     names it, else scatter_plane (below).
 *   - max_pool3d without the geometry (the C-only lm_max_pool3d_backward) cannot gather. One
 *     pass over the outputs checks the indices and counts, per input voxel, the outputs naming
 *     it (uint32 atomics on a workspace). When no voxel is named more than twice -- every pool
 *     whose windows do not overlap, and many that do -- the gradients are scattered with
 *     atomicAdd into a zeroed grad_input: 0 + a + b is 0 + b + a exactly (one or two additions
 *     commute), so the result is the CPU's bit for bit in any order. Otherwise scatter_plane runs
 *     the CPU's scatter itself, one thread per (n, c) volume in output order (slow: few threads;
 *     exact and deterministic).
 *
 * Index math is int64 throughout; the decomposition of the thread's flat index runs in 32 bits
 * when the element count allows (IT = uint32_t), as in pool.cu. */
#include "cuda.cuh"
#include "ops/pool3d.h"
#include "pool_common.cuh"

#include <math.h>

namespace {

/* float accumulates in float, double in double (as the CPU and PyTorch) */
template <class D> struct acc_of { typedef D T; };

/* ---- geometry ---------------------------------------------------------------------------- */
struct geo {
   int64_t N, C, I[3], O[3]; /* input / output sizes {D, H, W} */
   int64_t k[3], s[3], p[3], d[3];
   int64_t divisor;
   int64_t vc; /* channels a thread takes (NDHWC: see VMAX; 1 otherwise) */
   int64_t CG; /* channel groups: ceil(C / vc), the thread domain's channel extent */
   int kind;   /* G_MAX, G_AVG, G_ADAPTIVE: how windows follow from the sizes */
   int cl;     /* channels_last_3d: c on the fastest thread index */
   int cip;    /* avg_pool3d: count_include_pad */
   int has_div;
};

/* the element strides of a tensor's (n, c, d, h, w) dims (n: 0 for an unbatched 4-D tensor) */
struct st5 {
   int64_t n, c, d, h, w;
};

st5 strides_of(const lm_tensor *t) {
   st5 s;
   const int b = t->ndim - 5;
   s.n = b >= 0 ? t->strides[0] : 0;
   s.c = t->strides[t->ndim - 4];
   s.d = t->strides[t->ndim - 3];
   s.h = t->strides[t->ndim - 2];
   s.w = t->strides[t->ndim - 1];
   return s;
}

geo geo_of(const lm_pool3d_params *p, int kind) {
   geo g;
   g.N = p->N, g.C = p->C;
   g.I[0] = p->D, g.I[1] = p->H, g.I[2] = p->W;
   g.O[0] = p->OD, g.O[1] = p->OH, g.O[2] = p->OW;
   for (int i = 0; i < 3; i++) {
      g.k[i] = p->k[i], g.s[i] = p->s[i];
      g.p[i] = p->p[i], g.d[i] = p->d[i];
   }
   g.divisor = p->divisor;
   g.kind = kind;
   g.cl = p->mf == LM_CHANNELS_LAST_3D;
   g.cip = p->count_include_pad;
   g.has_div = p->has_div;
   g.vc = 1;
   g.CG = g.C;
   return g;
}

/* window o along dimension j (pool_common.cuh's window: as kernels/cpu/pool3d.c's geo_make) */
LM_HD inline void window(const geo &g, int j, int64_t o, int64_t &a, int64_t &b, int64_t &z) {
   window(g.kind, o, g.O[j], g.I[j], g.k[j], g.s[j], g.p[j], g.d[j], a, b, z);
}

/* the windows [lo, hi) along dimension j that hold input i (pool_common.cuh's cover) */
LM_HD inline void cover(const geo &g, int j, int64_t i, int64_t &lo, int64_t &hi) {
   cover(g.kind, i, g.O[j], g.I[j], g.k[j], g.s[j], g.p[j], g.d[j], lo, hi);
}

/* avg_pool3d's divisor of window (od, oh, ow), 0 for an empty one (kernels/cpu/pool3d.c:
   avg_div) */
LM_HD inline int64_t avg_div(const geo &g, int64_t od, int64_t oh, int64_t ow) {
   int64_t d0, d1, dz, h0, h1, hz, w0, w1, wz;
   window(g, 0, od, d0, d1, dz);
   window(g, 1, oh, h0, h1, hz);
   window(g, 2, ow, w0, w1, wz);
   if (d1 <= d0 || h1 <= h0 || w1 <= w0) return 0;
   if (g.kind == G_AVG && g.has_div) return g.divisor;
   if (g.kind == G_AVG && g.cip) return dz * hz * wz;
   return (d1 - d0) * (h1 - h0) * (w1 - w0);
}

LM_HD inline int64_t at(const st5 &s, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) {
   return n * s.n + c * s.c + d * s.d + h * s.h + w * s.w;
}

/* x += 1, returning the old value (only the max_pool3d backward's count pass) */
LM_HD inline unsigned inc(unsigned *p) {
#ifdef __CUDA_ARCH__
   return atomicAdd(p, 1u);
#else
   return (*p)++;
#endif
}
/* gradient into a zeroed voxel named at most twice: exact in any order (see the top) */
template <class D> LM_HD inline void add_to(D *p, D v) {
#ifdef __CUDA_ARCH__
   atomicAdd(p, v);
#else
   *p += v;
#endif
}

/* ---- kernels (per-thread bodies) ------------------------------------------------------------ */

/* max_pool3d / adaptive_max_pool3d forward, one output element (VMAX channels in NDHWC): taps
   scanned d, h, w ascending; a value wins when greater or NaN (the last NaN wins), ties keep the
   first; an empty window gives -inf and index -1. ind: flat input index (id * H + ih) * W + iw */
template <class D, class IT> struct max_fwd3 {
   const D *x;
   D *out;
   int64_t *ind;
   geo g;
   st5 sx, so, si;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, od, oh, ow;
      split<IT>(i, g.cl, g.CG, g.O[0], g.O[1], g.O[2], n, cg, od, oh, ow);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c); /* channels c .. c + nv */
      int64_t d0, d1, dz, h0, h1, hz, w0, w1, wz;
      window(g, 0, od, d0, d1, dz);
      window(g, 1, oh, h0, h1, hz);
      window(g, 2, ow, w0, w1, wz);
      const int mx = g.kind == G_MAX;
      const int64_t sd = mx ? g.d[0] : 1, sh = mx ? g.d[1] : 1, sw = mx ? g.d[2] : 1;
      const int64_t H = g.I[1], W = g.I[2];
      const D *xb = x + n * sx.n + c * sx.c;
      const int64_t first = (d0 < d1 && h0 < h1 && w0 < w1) ? (d0 * H + h0) * W + w0 : -1;
      T m[VMAX];
      int64_t sel[VMAX];
      for (int v = 0; v < VMAX; v++) {
         m[v] = (T)-INFINITY;
         sel[v] = first;
      }
      for (int64_t id = d0; id < d1; id += sd)
         for (int64_t ih = h0; ih < h1; ih += sh) {
            const D *row = xb + id * sx.d + ih * sx.h;
            const int64_t rb = (id * H + ih) * W;
            for (int64_t iw = w0; iw < w1; iw += sw) {
               const D *px = row + iw * sx.w;
               for (int v = 0; v < VMAX; v++) {
                  if (v >= nv) break;
                  const T val = px[v * sx.c];
                  if (val > m[v] || val != val) {
                     m[v] = val;
                     sel[v] = rb + iw;
                  }
               }
            }
         }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         out[at(so, n, c + v, od, oh, ow)] = m[v];
         if (ind) ind[at(si, n, c + v, od, oh, ow)] = sel[v];
      }
   }
};

/* avg_pool3d / adaptive_avg_pool3d forward, one output element: the window's sum (d, h, w
   ascending) over its divisor; an empty window gives 0 */
template <class D, class IT> struct avg_fwd3 {
   const D *x;
   D *out;
   geo g;
   st5 sx, so;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, c, od, oh, ow;
      split<IT>(i, g.cl, g.C, g.O[0], g.O[1], g.O[2], n, c, od, oh, ow);
      int64_t d0, d1, dz, h0, h1, hz, w0, w1, wz;
      window(g, 0, od, d0, d1, dz);
      window(g, 1, oh, h0, h1, hz);
      window(g, 2, ow, w0, w1, wz);
      T acc = 0;
      const int64_t dv = avg_div(g, od, oh, ow);
      if (dv) {
         const D *xb = x + n * sx.n + c * sx.c;
         for (int64_t id = d0; id < d1; id++)
            for (int64_t ih = h0; ih < h1; ih++) {
               const D *row = xb + id * sx.d + ih * sx.h;
               for (int64_t iw = w0; iw < w1; iw++) acc += row[iw * sx.w];
            }
         acc = acc / (T)dv;
      }
      out[at(so, n, c, od, oh, ow)] = acc;
   }
};

/* avg_pool3d / adaptive_avg_pool3d backward as a gather, one grad_input element (VMAX channels
   in NDHWC): 0 plus each covering window's gradient over its divisor, (od, oh, ow) ascending */
template <class D, class IT> struct avg_gather3 {
   const D *go;
   D *gi;
   geo g;
   st5 sg, sx;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, id, ih, iw;
      split<IT>(i, g.cl, g.CG, g.I[0], g.I[1], g.I[2], n, cg, id, ih, iw);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c);
      const D *gb = go + n * sg.n + c * sg.c;
      T acc[VMAX];
      for (int v = 0; v < VMAX; v++) acc[v] = 0;
      if (g.kind == G_ADAPTIVE && g.O[0] == 1 && g.O[1] == 1 && g.O[2] == 1) {
         /* the global average's backward (a video model's head): one window, the whole volume */
         const T dv = (T)(g.I[0] * g.I[1] * g.I[2]);
         for (int v = 0; v < VMAX; v++) {
            if (v >= nv) break;
            acc[v] += gb[v * sg.c] / dv;
         }
      } else {
         int64_t a0, a1, b0, b1, e0, e1;
         cover(g, 0, id, a0, a1);
         cover(g, 1, ih, b0, b1);
         cover(g, 2, iw, e0, e1);
         for (int64_t od = a0; od < a1; od++)
            for (int64_t oh = b0; oh < b1; oh++)
               for (int64_t ow = e0; ow < e1; ow++) {
                  const int64_t dv = avg_div(g, od, oh, ow);
                  if (!dv) continue; /* (an empty window holds nothing; kept as the CPU) */
                  const T dd = (T)dv;
                  const D *o = gb + od * sg.d + oh * sg.h + ow * sg.w;
                  for (int v = 0; v < VMAX; v++) {
                     if (v >= nv) break;
                     acc[v] += o[v * sg.c] / dd;
                  }
               }
      }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         gi[at(sx, n, c + v, id, ih, iw)] = acc[v];
      }
   }
};

/* the max backwards' check of one saved index: cnt[0] counts indices outside the volume (-1
   excepted); with win (the windows are known: adaptive, or max_pool3d given the geometry), cnt[1]
   those inside the volume but off their window; with named (max_pool3d without the geometry),
   named[voxel] counts the outputs naming each voxel and cnt[1] becomes nonzero when one is named
   a third time */
template <class D, class IT> struct max_check3 {
   const int64_t *ind;
   unsigned *named;
   geo g;
   st5 si;
   int win;
   unsigned long long *cnt;
   LM_HD void operator()(int64_t i) const {
      int64_t n, c, od, oh, ow;
      split<IT>(i, g.cl, g.C, g.O[0], g.O[1], g.O[2], n, c, od, oh, ow);
      const int64_t x = ind[at(si, n, c, od, oh, ow)];
      const int64_t H = g.I[1], W = g.I[2], V = g.I[0] * H * W;
      if (x == -1) return;
      if (x < 0 || x >= V) {
         count_one(cnt);
         return;
      }
      if (named) {
         /* one counter per (n, c, voxel), in the threads' order of grad_input's elements */
         const int64_t slot = g.cl ? (n * V + x) * g.C + c : (n * g.C + c) * V + x;
         /* a plain store: every writer writes the same value (no contention on one counter
            when many voxels are named often) */
         if (inc(named + slot) == 2) cnt[1] = 1;
         return;
      }
      if (!win) return;
      const int64_t id = x / (H * W), r = x - id * H * W, ih = r / W, iw = r - ih * W;
      if (!(in_window(0, od, id) && in_window(1, oh, ih) && in_window(2, ow, iw)))
         count_one(cnt + 1);
   }
   /* input i is a tap of window o along dimension j (inside the input: i is) */
   LM_HD int in_window(int j, int64_t o, int64_t i) const {
      return ::in_window(g.kind, o, i, g.O[j], g.I[j], g.k[j], g.s[j], g.p[j], g.d[j]);
   }
};

/* adaptive_max_pool3d / max_pool3d (given the geometry) backward as a gather, one grad_input
   element (VMAX channels in NDHWC): 0 plus grad_out of each window holding the voxel ((od, oh,
   ow) ascending) whose index names it -- the CPU's scatter's additions in its order (the indices
   were checked to lie in their windows). With dilation d, only windows whose offset to the voxel
   is a multiple of d hold it. */
template <class D, class IT> struct max_gather3 {
   const D *go;
   const int64_t *ind;
   D *gi;
   geo g;
   st5 sg, si, sx;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, id, ih, iw;
      split<IT>(i, g.cl, g.CG, g.I[0], g.I[1], g.I[2], n, cg, id, ih, iw);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c);
      int64_t a0, a1, b0, b1, e0, e1;
      cover(g, 0, id, a0, a1);
      cover(g, 1, ih, b0, b1);
      cover(g, 2, iw, e0, e1);
      const int64_t vox = (id * g.I[1] + ih) * g.I[2] + iw;
      const D *gb = go + n * sg.n + c * sg.c;
      const int64_t ib = n * si.n + c * si.c;
      T acc[VMAX];
      for (int v = 0; v < VMAX; v++) acc[v] = 0;
      for (int64_t od = a0; od < a1; od++) {
         if (!holds(0, od, id)) continue;
         for (int64_t oh = b0; oh < b1; oh++) {
            if (!holds(1, oh, ih)) continue;
            for (int64_t ow = e0; ow < e1; ow++) {
               if (!holds(2, ow, iw)) continue;
               const int64_t e = ib + od * si.d + oh * si.h + ow * si.w;
               const int64_t o = od * sg.d + oh * sg.h + ow * sg.w;
               for (int v = 0; v < VMAX; v++) {
                  if (v >= nv) break;
                  if (ind[e + v * si.c] == vox) acc[v] += gb[o + v * sg.c];
               }
            }
         }
      }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         gi[at(sx, n, c + v, id, ih, iw)] = acc[v];
      }
   }
   /* window o along dimension j (in the cover) holds input i: always, but for dilated max */
   LM_HD int holds(int j, int64_t o, int64_t i) const {
      return g.kind != G_MAX || g.d[j] == 1 || (i + g.p[j] - o * g.s[j]) % g.d[j] == 0;
   }
};

/* max_pool3d backward, one output element: its gradient added at its voxel of the zeroed
   grad_input (every voxel named at most twice: exact, see the top) */
template <class D, class IT> struct max_scatter_atomic {
   const D *go;
   const int64_t *ind;
   D *gi;
   geo g;
   st5 sg, si, sx;
   LM_HD void operator()(int64_t i) const {
      int64_t n, c, od, oh, ow;
      split<IT>(i, g.cl, g.C, g.O[0], g.O[1], g.O[2], n, c, od, oh, ow);
      const int64_t x = ind[at(si, n, c, od, oh, ow)];
      if (x < 0) return; /* -1 (the bad ones were reported before) */
      const int64_t HW = g.I[1] * g.I[2], xd = x / HW, r = x - xd * HW, xh = r / g.I[2];
      add_to(gi + at(sx, n, c, xd, xh, r - xh * g.I[2]), go[at(sg, n, c, od, oh, ow)]);
   }
};

/* max backward as the CPU's scatter, one thread per (n, c) volume of the zeroed grad_input: each
   output's gradient added at its voxel in output order (-1 skipped; the indices were checked) */
template <class D, class IT> struct max_scatter_plane3 {
   const D *go;
   const int64_t *ind;
   D *gi;
   geo g;
   st5 sg, si, sx;
   LM_HD void operator()(int64_t i) const {
      /* volumes in the order (n, c) with c fastest: neighbouring threads, neighbouring channels */
      const int64_t n = i / g.C, c = i - n * g.C;
      const int64_t HW = g.I[1] * g.I[2];
      D *gp = gi + n * sx.n + c * sx.c;
      const D *gb = go + n * sg.n + c * sg.c;
      const int64_t *xb = ind + n * si.n + c * si.c;
      for (int64_t od = 0; od < g.O[0]; od++)
         for (int64_t oh = 0; oh < g.O[1]; oh++)
            for (int64_t ow = 0; ow < g.O[2]; ow++) {
               const int64_t x = xb[od * si.d + oh * si.h + ow * si.w];
               if (x < 0) continue;
               const int64_t xd = x / HW, r = x - xd * HW, xh = r / g.I[2];
               D *dst = gp + xd * sx.d + xh * sx.h + (r - xh * g.I[2]) * sx.w;
               *dst += gb[od * sg.d + oh * sg.h + ow * sg.w];
            }
   }
};

/* ---- launching ------------------------------------------------------------------------------ */

/* dtype dt as the storage type D of the statement (float32 / float64: the front end widens the
   halves) */
#define POOL3D_DTYPES(dt, what, ...)                                                              \
   switch (dt) {                                                                                  \
      POOL_FLOAT_CASES(__VA_ARGS__)                                                               \
      POOL_NO_DTYPE(dt, what);                                                                    \
   }

/* zero a tensor dense in its format (numel elements from its first; 0 bits = +0.0) */
lm_status zero(int k, const lm_tensor *t) {
   return lm_cu_err(cudaMemsetAsync(lm_cu_ptr(t), 0,
                                    (size_t)t->numel * (size_t)lm_dtype_size(t->dtype),
                                    lm_cu_stream(k)),
                    "cudaMemsetAsync");
}

/* ---- the ops ------------------------------------------------------------------------------ */

/* MAX_POOL3D, ADAPTIVE_MAX_POOL3D: t = {x, out, indices or NULL} */
lm_status k_max_forward(const lm_op *op) {
   const lm_pool3d_params *p = (const lm_pool3d_params *)op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1], *it = op->t[2];
   const int k = lm_cu_index(x);
   const geo g =
      with_channel_groups(geo_of(p, op->kind == LM_OP_ADAPTIVE_MAX_POOL3D ? G_ADAPTIVE : G_MAX));
   int64_t *ind = it ? (int64_t *)lm_cu_ptr(it) : NULL;
   const st5 sx = strides_of(x), so = strides_of(out), si = it ? strides_of(it) : so;
   const int64_t n = g.N * g.CG * g.O[0] * g.O[1] * g.O[2];
   POOL3D_DTYPES(x->dtype, lm_op_name(op->kind),
                 return launch<max_fwd3, D>(k, n, (const D *)lm_cu_ptr(x), (D *)lm_cu_ptr(out),
                                            ind, g, sx, so, si))
}

/* AVG_POOL3D, ADAPTIVE_AVG_POOL3D: t = {x, out} */
lm_status k_avg_forward(const lm_op *op) {
   const lm_pool3d_params *p = (const lm_pool3d_params *)op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1];
   const int k = lm_cu_index(x);
   const geo g = geo_of(p, op->kind == LM_OP_AVG_POOL3D ? G_AVG : G_ADAPTIVE);
   const st5 sx = strides_of(x), so = strides_of(out);
   const int64_t n = g.N * g.C * g.O[0] * g.O[1] * g.O[2];
   POOL3D_DTYPES(x->dtype, lm_op_name(op->kind),
                 return launch<avg_fwd3, D>(k, n, (const D *)lm_cu_ptr(x), (D *)lm_cu_ptr(out), g,
                                            sx, so))
}

/* MAX_POOL3D_BACKWARD, ADAPTIVE_MAX_POOL3D_BACKWARD: t = {grad_out, indices, grad_x} */
lm_status k_max_backward(const lm_op *op) {
   const lm_pool3d_params *p = (const lm_pool3d_params *)op->params;
   const lm_tensor *gout = op->t[0], *it = op->t[1], *gx = op->t[2];
   const int k = lm_cu_index(gx);
   const int adaptive = op->kind == LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD;
   const char *what = adaptive ? "adaptive_max_pool3d_backward" : "max_pool3d_backward";
   const int win = adaptive || p->geom; /* the windows are known */
   const geo g = geo_of(p, adaptive ? G_ADAPTIVE : G_MAX);
   const int64_t *ind = (const int64_t *)lm_cu_ptr(it);
   const st5 sg = strides_of(gout), si = strides_of(it), sx = strides_of(gx);
   const int64_t V = g.I[0] * g.I[1] * g.I[2];
   const int64_t nout = g.N * g.C * g.O[0] * g.O[1] * g.O[2];
   const int64_t nin = g.N * g.C * V;

   /* the check (and, without the windows, the count of outputs per voxel): one small
      synchronising copy per max-pool backward, the price of the CPU's error for bad indices */
   unsigned long long cnt[2] = {0, 0};
   if (nout > 0)
      LM_TRY(read_counts(k, win ? 0 : (size_t)nin * sizeof(unsigned), cnt,
                         [&](unsigned long long *dc, unsigned *named) {
                            return launch<max_check3, float>(k, nout, ind, named, g, si, win, dc);
                         }));
   if (cnt[0])
      return lm_error(LM_ERR_ARG, "%s: %lld indices are out of range for an input volume of %lld",
                      what, (long long)cnt[0], (long long)V);
   POOL3D_DTYPES(gx->dtype, what, {
      const D *gp = (const D *)lm_cu_ptr(gout);
      D *xp = (D *)lm_cu_ptr(gx);
      if (win && !cnt[1]) {
         const geo gv = with_channel_groups(g);
         return launch<max_gather3, D>(k, g.N * gv.CG * V, gp, ind, xp, gv, sg, si, sx);
      }
      LM_TRY(zero(k, gx));
      if (!win && !cnt[1])
         return launch<max_scatter_atomic, D>(k, nout, gp, ind, xp, g, sg, si, sx);
      /* three or more outputs on one voxel, or indices off their windows (hand-made) */
      return launch<max_scatter_plane3, D>(k, g.N * g.C, gp, ind, xp, g, sg, si, sx);
   })
}

/* AVG_POOL3D_BACKWARD, ADAPTIVE_AVG_POOL3D_BACKWARD: t = {grad_out, grad_x} */
lm_status k_avg_backward(const lm_op *op) {
   const lm_pool3d_params *p = (const lm_pool3d_params *)op->params;
   const lm_tensor *gout = op->t[0], *gx = op->t[1];
   const int k = lm_cu_index(gx);
   const geo g = with_channel_groups(
      geo_of(p, op->kind == LM_OP_AVG_POOL3D_BACKWARD ? G_AVG : G_ADAPTIVE));
   const st5 sg = strides_of(gout), sx = strides_of(gx);
   const int64_t nin = g.N * g.CG * g.I[0] * g.I[1] * g.I[2];
   POOL3D_DTYPES(gx->dtype, lm_op_name(op->kind),
                 return launch<avg_gather3, D>(k, nin, (const D *)lm_cu_ptr(gout),
                                               (D *)lm_cu_ptr(gx), g, sg, sx))
}

} /* namespace */

void lm_cuda_register_pool3d(lm_kernel_fn *table) {
   table[LM_OP_MAX_POOL3D] = k_max_forward;
   table[LM_OP_ADAPTIVE_MAX_POOL3D] = k_max_forward;
   table[LM_OP_MAX_POOL3D_BACKWARD] = k_max_backward;
   table[LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD] = k_max_backward;
   table[LM_OP_AVG_POOL3D] = k_avg_forward;
   table[LM_OP_ADAPTIVE_AVG_POOL3D] = k_avg_forward;
   table[LM_OP_AVG_POOL3D_BACKWARD] = k_avg_backward;
   table[LM_OP_ADAPTIVE_AVG_POOL3D_BACKWARD] = k_avg_backward;
}
