/* pool.cu -- the CUDA kernels of the pool family: max / average / adaptive pooling over 2-D
 * planes, forward and backward (params and t[] order: src/ops/pool.h; front ends: src/ops/pool.c;
 * the semantic reference: kernels/cpu/pool*.c).
 *
 * The front end hands every tensor dense in mf (the input's suggested format). The kernels still
 * address each tensor through its own (n, c, h, w) strides, so any dense layout works; mf only
 * decides the order of the threads: contiguous (NCHW) puts w on the fastest thread index,
 * channels-last (NHWC) puts c there, so neighbouring threads read and write neighbouring
 * channels (coalesced); there the max forward and the gathers give each thread up to VMAX (4)
 * consecutive channels, so that the window / cover arithmetic is paid once for them.
 *
 * Forward: one thread per output element, looping over its window (max_fwd, avg_fwd). The global
 * average of a ResNet head (adaptive_avg_pool2d to 1x1, PyTorch #24396) is then, in NHWC, one
 * thread per (n, c) walking the H*W pixels with a stride of C elements: every pixel step of a warp
 * is one coalesced row of channels. When that leaves the GPU short of threads (few outputs, large
 * windows) avg_fwd_split spreads each window over several threads of a block (8 in NHWC, with a
 * warp on 32 channels; a warp of 32 in NCHW, on one plane's window) and sums their partials in
 * shared memory in a fixed order (deterministic).
 *
 * Backward: gathers, one thread per grad_input element, summing the outputs whose windows hold
 * it, in (oh, ow) order from 0 -- the additions of the CPU's scatter into a zeroed grad_input, in
 * the same order, so max-pool gradients are bit-identical to the CPU's and every result is
 * deterministic (no atomics on values). Average pooling divides each output's gradient by its
 * window's divisor and sums (as the CPU). Max pooling from saved indices / tap numbers adds the
 * outputs of the covering windows whose index names this pixel.
 *   A gather only sees windows that hold the pixel, so the saved indices are checked first
 * (max_check: one pass over them, two counters read back -- one small synchronising copy per
 * max-pool backward, the price of the CPU's errors for bad indices). The CPU has two rules:
 *   - "window" (channels-last with the geometry, and every tap-number backward): an entry that is
 *     neither -1 / 255 nor a tap of its window inside the plane is an error ("out of range for
 *     their pooling windows");
 *   - "plane" (contiguous with the geometry, adaptive_max_pool2d, and max_pool2d_backward without
 *     the geometry): the CPU scatters, so any index inside the plane is taken, even one outside its
 *     window; one outside the plane is an error. Here, indices that all lie in their windows (what
 *     a forward gives) gather; otherwise, and when no geometry is known, max_scatter_plane runs
 *     the CPU's scatter itself, one thread per (n, c) plane in output order (slow, but exact and
 *     deterministic; only hand-made indices or the C-only lm_max_pool2d_backward get there).
 *
 * dtypes: the front end sends float32 / float64, and bfloat16 for the channels-last max pools
 * (forward, and the backward with the geometry or the taps); float16 and the other bfloat16 cases
 * arrive as float32 copies. Every kernel is instantiated for all four anyway (half computed in
 * float32: loads widen exactly, a max is stored back exactly, a sum is rounded once). Sums of
 * float32 are accumulated in float32 (as the CPU and PyTorch), of float64 in float64.
 *
 * Index math is int64 throughout, but the decomposition of the thread's flat index into (n, c,
 * h, w) runs in 32 bits when the element count allows (IT = uint32_t): 64-bit divisions are
 * several times slower on the GPU. The window rules, the covers, that decomposition, the channel
 * groups and the launches are the 3-D pools' too (pool_common.cuh). */
#include "cuda.cuh"
#include "ops/pool.h"
#include "pool_common.cuh"

#include <math.h>

namespace {

/* ---- dtypes ---------------------------------------------------------------------------- */
struct bf16 { uint16_t v; };
struct f16 { uint16_t v; };

template <class D> struct acc_of { typedef float T; };
template <> struct acc_of<double> { typedef double T; };

LM_HD inline float ld(const float *p) { return *p; }
LM_HD inline double ld(const double *p) { return *p; }
LM_HD inline float ld(const bf16 *p) { return lm_bf2f(p->v); }
LM_HD inline float ld(const f16 *p) { return lm_h2f(p->v); }
/* a sum / average: rounded once to nearest even */
LM_HD inline void st(float *p, float v) { *p = v; }
LM_HD inline void st(double *p, double v) { *p = v; }
LM_HD inline void st(bf16 *p, float v) { p->v = lm_f2bf(v); }
LM_HD inline void st(f16 *p, float v) { p->v = lm_f2h(v); }
/* a maximum (one of the inputs, or -inf): exact; bfloat16 truncated as the CPU does, which keeps
   a NaN's payload bit for bit */
LM_HD inline void st_exact(float *p, float v) { *p = v; }
LM_HD inline void st_exact(double *p, double v) { *p = v; }
LM_HD inline void st_exact(bf16 *p, float v) {
   uint32_t u;
   memcpy(&u, &v, 4);
   p->v = (uint16_t)(u >> 16);
}
LM_HD inline void st_exact(f16 *p, float v) { p->v = lm_f2h(v); }

/* ---- geometry ---------------------------------------------------------------------------- */
struct geo {
   int64_t N, C, H, W, OH, OW;
   int64_t kh, kw, sh, sw, ph, pw, dh, dw;
   int64_t divisor;
   int64_t vc;  /* channels a thread takes (channels-last: see VMAX; 1 otherwise) */
   int64_t CG;  /* channel groups: ceil(C / vc), the thread domain's channel extent */
   int kind;    /* G_MAX, G_AVG, G_ADAPTIVE: how windows follow from the sizes */
   int cl;      /* channels-last: c on the fastest thread index */
   int cip;     /* avg_pool2d: count_include_pad */
   int has_div; /* avg_pool2d: divisor_override */
};

/* the element strides of a tensor's (n, c, h, w) dims (n: 0 for a 3-D tensor) */
struct st4 {
   int64_t n, c, h, w;
};

st4 strides_of(const lm_tensor *t) {
   st4 s;
   const int d = t->ndim - 4;
   s.n = d >= 0 ? t->strides[0] : 0;
   s.c = t->strides[t->ndim - 3];
   s.h = t->strides[t->ndim - 2];
   s.w = t->strides[t->ndim - 1];
   return s;
}

geo geo_of(const lm_pool_params *p, int kind) {
   geo g;
   g.N = p->N, g.C = p->C, g.H = p->H, g.W = p->W, g.OH = p->OH, g.OW = p->OW;
   g.kh = p->kh, g.kw = p->kw, g.sh = p->sh, g.sw = p->sw;
   g.ph = p->ph, g.pw = p->pw, g.dh = p->dh, g.dw = p->dw;
   g.divisor = p->divisor;
   g.kind = kind;
   g.cl = p->mf == LM_CHANNELS_LAST;
   g.cip = p->count_include_pad;
   g.has_div = p->has_div;
   g.vc = 1;
   g.CG = g.C;
   return g;
}

/* avg_pool2d's divisor of window (oh, ow) (kernels/cpu/pool2d.h: avg_div) */
LM_HD inline double avg_div(const geo &g, int64_t oh, int64_t ow) {
   if (g.kind == G_AVG && g.has_div) return (double)g.divisor;
   int64_t h0, h1, hz, w0, w1, wz;
   window(g.kind, oh, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, h0, h1, hz);
   window(g.kind, ow, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, w0, w1, wz);
   if (g.kind == G_AVG && g.cip) return (double)(hz * wz);
   return (double)((h1 - h0) * (w1 - w0));
}

LM_HD inline int64_t at(const st4 &s, int64_t n, int64_t c, int64_t h, int64_t w) {
   return n * s.n + c * s.c + h * s.h + w * s.w;
}

/* ---- kernels (per-thread bodies) ------------------------------------------------------------ */

/* max_pool2d / adaptive_max_pool2d forward, one output element: the taps scanned row by row, a
   value wins when greater or NaN (the last NaN wins), ties keep the first; an empty window gives
   -inf and index -1 (tap number 255). ind: flat input index ih * W + iw; taps: tap number
   (row in window) * kw + (column in window). */
template <class D, class IT> struct max_fwd {
   const D *x;
   D *out;
   int64_t *ind;
   uint8_t *taps;
   geo g;
   st4 sx, so, si;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, oh, ow;
      split<IT>(i, g.cl, g.CG, g.OH, g.OW, n, cg, oh, ow);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c); /* channels c .. c + nv */
      int64_t h0, h1, hz, w0, w1, wz;
      window(g.kind, oh, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, h0, h1, hz);
      window(g.kind, ow, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, w0, w1, wz);
      const int64_t sdh = g.kind == G_MAX ? g.dh : 1, sdw = g.kind == G_MAX ? g.dw : 1;
      const D *xb = x + n * sx.n + c * sx.c;
      /* sel: the winner's flat input index, or its tap number when taps are wanted */
      const int empty = !(h0 < h1 && w0 < w1);
      const int64_t first = empty ? (taps ? 255 : -1) : (taps ? hz * g.kw + wz : h0 * g.W + w0);
      T mx[VMAX];
      int64_t sel[VMAX];
      for (int v = 0; v < VMAX; v++) {
         mx[v] = (T)-INFINITY;
         sel[v] = first;
      }
      int64_t rcode = hz * g.kw + wz;
      for (int64_t ih = h0; ih < h1; ih += sdh, rcode += g.kw) {
         const D *row = xb + ih * sx.h;
         int64_t code = rcode;
         for (int64_t iw = w0; iw < w1; iw += sdw, code++) {
            const D *px = row + iw * sx.w;
            const int64_t id = taps ? code : ih * g.W + iw;
            for (int v = 0; v < VMAX; v++) {
               if (v >= nv) break;
               const T val = ld(px + v * sx.c);
               if (val > mx[v] || val != val) {
                  mx[v] = val;
                  sel[v] = id;
               }
            }
         }
      }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         st_exact(out + at(so, n, c + v, oh, ow), mx[v]);
         if (ind) ind[at(si, n, c + v, oh, ow)] = sel[v];
         if (taps) taps[at(si, n, c + v, oh, ow)] = (uint8_t)sel[v];
      }
   }
};

/* avg_pool2d / adaptive_avg_pool2d forward, one output element: the window's sum (rows, then
   columns) over its divisor; an empty window gives 0 */
template <class D, class IT> struct avg_fwd {
   const D *x;
   D *out;
   geo g;
   st4 sx, so;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, c, oh, ow;
      split<IT>(i, g.cl, g.C, g.OH, g.OW, n, c, oh, ow);
      int64_t h0, h1, hz, w0, w1, wz;
      window(g.kind, oh, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, h0, h1, hz);
      window(g.kind, ow, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, w0, w1, wz);
      T acc = 0;
      if (h0 < h1 && w0 < w1) {
         const D *xb = x + n * sx.n + c * sx.c;
         for (int64_t ih = h0; ih < h1; ih++)
            for (int64_t iw = w0; iw < w1; iw++) acc += ld(xb + ih * sx.h + iw * sx.w);
         acc = acc / (T)avg_div(g, oh, ow);
      }
      st(out + at(so, n, c, oh, ow), acc);
   }
};

/* the split average (few outputs, large windows): `parts` threads per output element, part p
   summing the window's pixels p, p + parts, ... (row-major over the window); the partials are then
   added in part order (avg_fwd_split). Channels-last: 8 parts, the 32 threads of a warp on 32
   consecutive elements (channels: coalesced); contiguous: 32 parts, a warp on one element's
   window (consecutive pixels of a row: coalesced). */
enum { SPLIT_CL = 8, SPLIT_NCHW = 32 };
template <class D, class IT> struct avg_part {
   const D *x;
   geo g;
   st4 sx;
   int parts;
   LM_HD typename acc_of<D>::T operator()(int64_t i, int p, int64_t &oh, int64_t &ow,
                                           int64_t &n, int64_t &c) const {
      typedef typename acc_of<D>::T T;
      split<IT>(i, g.cl, g.C, g.OH, g.OW, n, c, oh, ow);
      int64_t h0, h1, hz, w0, w1, wz;
      window(g.kind, oh, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, h0, h1, hz);
      window(g.kind, ow, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, w0, w1, wz);
      T acc = 0;
      const int64_t nw = w1 - w0;
      if (h1 <= h0 || nw <= 0) return acc;
      const int64_t np = (h1 - h0) * nw;
      const D *xb = x + n * sx.n + c * sx.c;
      /* walk pixel q = p, p + parts, ... as (row, column) without a division per step */
      int64_t r = p / nw, col = p % nw;
      for (int64_t q = p; q < np; q += parts) {
         acc += ld(xb + (h0 + r) * sx.h + (w0 + col) * sx.w);
         col += parts;
         while (col >= nw) {
            col -= nw;
            r++;
         }
      }
      return acc;
   }
   /* the partials' sum over the divisor, stored */
   LM_HD void finish(typename acc_of<D>::T acc, int64_t oh, int64_t ow, int64_t n, int64_t c,
                     D *out, const st4 &so) const {
      typedef typename acc_of<D>::T T;
      int64_t h0, h1, hz, w0, w1, wz;
      window(g.kind, oh, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, h0, h1, hz);
      window(g.kind, ow, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, w0, w1, wz);
      if (h0 < h1 && w0 < w1) acc = acc / (T)avg_div(g, oh, ow);
      st(out + at(so, n, c, oh, ow), acc);
   }
};

/* max_pool2d backward, the indices' check (one saved entry): cnt[0] counts int64 indices outside
   the plane, cnt[1] entries that are no tap of their window inside the plane (only when the
   windows are known: win) -- for tap numbers, every entry that names no such tap */
template <class D, class IT> struct max_check {
   const int64_t *ind;
   const uint8_t *taps;
   geo g;
   st4 si;
   int win;
   unsigned long long *cnt;
   LM_HD void operator()(int64_t i) const {
      int64_t n, c, oh, ow;
      split<IT>(i, g.cl, g.C, g.OH, g.OW, n, c, oh, ow);
      const int64_t e = at(si, n, c, oh, ow);
      int64_t ih, iw;
      if (taps) {
         const int64_t code = taps[e];
         if (code == 255) return;
         if (code >= g.kh * g.kw) {
            count_one(cnt + 1);
            return;
         }
         ih = oh * g.sh - g.ph + (code / g.kw) * g.dh;
         iw = ow * g.sw - g.pw + (code % g.kw) * g.dw;
         if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) count_one(cnt + 1);
         return;
      }
      const int64_t x = ind[e];
      if (x == -1) return;
      if (x < 0 || x >= g.H * g.W) {
         count_one(cnt);
         return;
      }
      if (!win) return;
      ih = x / g.W;
      iw = x - ih * g.W;
      if (!(in_window(g.kind, oh, ih, g.OH, g.H, g.kh, g.sh, g.ph, g.dh) &&
            in_window(g.kind, ow, iw, g.OW, g.W, g.kw, g.sw, g.pw, g.dw)))
         count_one(cnt + 1);
   }
};

/* max_pool2d / adaptive_max_pool2d backward as a gather, one grad_input element: 0 plus grad_out
   of each window holding the pixel (oh, then ow, ascending) whose index (or tap number) names it */
template <class D, class IT> struct max_gather {
   const D *go;
   const int64_t *ind;
   const uint8_t *taps;
   D *gi;
   geo g;
   st4 sg, si, sx;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, ih, iw;
      split<IT>(i, g.cl, g.CG, g.H, g.W, n, cg, ih, iw);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c); /* channels c .. c + nv */
      int64_t r0, r1, c0, c1;
      cover(g.kind, ih, g.OH, g.H, g.kh, g.sh, g.ph, g.dh, r0, r1);
      cover(g.kind, iw, g.OW, g.W, g.kw, g.sw, g.pw, g.dw, c0, c1);
      /* the tap (row tr, column tc) of window (oh, ow) that is this pixel: with dilation d, only
         windows whose offset to the pixel is a multiple of d hold it (no division when d = 1) */
      const int dh = g.kind == G_MAX && g.dh != 1, dw = g.kind == G_MAX && g.dw != 1;
      const int64_t pix = ih * g.W + iw;
      const D *gb = go + n * sg.n + c * sg.c;
      const int64_t ib = n * si.n + c * si.c;
      T acc[VMAX];
      for (int v = 0; v < VMAX; v++) acc[v] = 0;
      for (int64_t oh = r0; oh < r1; oh++) {
         const int64_t a = ih + g.ph - oh * g.sh;
         if (dh && a % g.dh != 0) continue;
         const int64_t tr = dh ? a / g.dh : a;
         for (int64_t ow = c0; ow < c1; ow++) {
            const int64_t b = iw + g.pw - ow * g.sw;
            if (dw && b % g.dw != 0) continue;
            const int64_t e = ib + oh * si.h + ow * si.w, o = oh * sg.h + ow * sg.w;
            const int64_t code = tr * g.kw + (dw ? b / g.dw : b);
            for (int v = 0; v < VMAX; v++) {
               if (v >= nv) break;
               const int hit = taps ? (int64_t)taps[e + v * si.c] == code
                                    : ind[e + v * si.c] == pix;
               if (hit) acc[v] += ld(gb + o + v * sg.c);
            }
         }
      }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         st(gi + at(sx, n, c + v, ih, iw), acc[v]);
      }
   }
};

/* max_pool2d backward as the CPU's scatter, one thread per (n, c) plane: zero the plane, then
   add each output's gradient at its index in output order (-1 skipped; the indices were checked
   to lie in the plane) */
template <class D, class IT> struct max_scatter_plane {
   const D *go;
   const int64_t *ind;
   D *gi;
   geo g;
   st4 sg, si, sx;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      /* planes in the order (n, c) with c fastest: neighbouring threads, neighbouring channels */
      const int64_t n = i / g.C, c = i - n * g.C;
      D *gp = gi + n * sx.n + c * sx.c;
      for (int64_t ih = 0; ih < g.H; ih++)
         for (int64_t iw = 0; iw < g.W; iw++) st(gp + ih * sx.h + iw * sx.w, (T)0);
      const D *gb = go + n * sg.n + c * sg.c;
      const int64_t *xb = ind + n * si.n + c * si.c;
      for (int64_t oh = 0; oh < g.OH; oh++)
         for (int64_t ow = 0; ow < g.OW; ow++) {
            const int64_t k = xb[oh * si.h + ow * si.w];
            if (k < 0 || k >= g.H * g.W) continue;
            D *dst = gp + (k / g.W) * sx.h + (k % g.W) * sx.w;
            /* in T, then rounded: as the CPU's float32 accumulation (halves never get here) */
            st(dst, (T)(ld(dst) + ld(gb + oh * sg.h + ow * sg.w)));
         }
   }
};

/* avg_pool2d / adaptive_avg_pool2d backward as a gather, one grad_input element: 0 plus each
   covering window's gradient over its divisor, (oh, ow) ascending */
template <class D, class IT> struct avg_gather {
   const D *go;
   D *gi;
   geo g;
   st4 sg, sx;
   LM_HD void operator()(int64_t i) const {
      typedef typename acc_of<D>::T T;
      int64_t n, cg, ih, iw;
      split<IT>(i, g.cl, g.CG, g.H, g.W, n, cg, ih, iw);
      const int64_t c = cg * g.vc;
      const int nv = (int)min64(g.vc, g.C - c); /* channels c .. c + nv */
      const D *gb = go + n * sg.n + c * sg.c;
      T acc[VMAX];
      for (int v = 0; v < VMAX; v++) acc[v] = 0;
      if (g.kind == G_ADAPTIVE && g.OH == 1 && g.OW == 1) {
         /* the global average's backward (the ResNet head): one window, the whole plane */
         const T dv = (T)(double)(g.H * g.W);
         for (int v = 0; v < VMAX; v++) {
            if (v >= nv) break;
            acc[v] = ld(gb + v * sg.c) / dv;
         }
      } else {
         int64_t r0, r1, c0, c1;
         cover(g.kind, ih, g.OH, g.H, g.kh, g.sh, g.ph, 1, r0, r1);
         cover(g.kind, iw, g.OW, g.W, g.kw, g.sw, g.pw, 1, c0, c1);
         for (int64_t oh = r0; oh < r1; oh++)
            for (int64_t ow = c0; ow < c1; ow++) {
               const T dv = (T)avg_div(g, oh, ow);
               const D *o = gb + oh * sg.h + ow * sg.w;
               for (int v = 0; v < VMAX; v++) {
                  if (v >= nv) break;
                  acc[v] += ld(o + v * sg.c) / dv;
               }
            }
      }
      for (int v = 0; v < VMAX; v++) {
         if (v >= nv) break;
         st(gi + at(sx, n, c + v, ih, iw), acc[v]);
      }
   }
};

/* ---- launching ------------------------------------------------------------------------------ */

#ifndef LM_CUDA_EMU
/* avg_fwd_split on the GPU: a block holds LM_CU_THREADS / parts output elements (consecutive in
   the threads' order) x parts; the partials meet in shared memory and thread (part 0, e) adds
   them in part order. Channels-last: threadIdx.x = element, threadIdx.y = part; contiguous: the
   other way round (see avg_part). */
template <class D, class IT>
__global__ void avg_fwd_split_kernel(int64_t n, avg_part<D, IT> part, D *out, st4 so) {
   typedef typename acc_of<D>::T T;
   __shared__ T partial[LM_CU_THREADS];
   const int cl = part.g.cl;
   const int e = cl ? threadIdx.x : threadIdx.y, p = cl ? threadIdx.y : threadIdx.x;
   const int per = LM_CU_THREADS / part.parts; /* elements per block */
   for (int64_t b = (int64_t)blockIdx.x * per; b < n; b += (int64_t)gridDim.x * per) {
      const int64_t i = b + e;
      int64_t oh = 0, ow = 0, nn = 0, c = 0;
      partial[p * per + e] = i < n ? part(i, p, oh, ow, nn, c) : (T)0;
      __syncthreads();
      if (p == 0 && i < n) {
         T acc = partial[e];
         for (int q = 1; q < part.parts; q++) acc += partial[q * per + e];
         part.finish(acc, oh, ow, nn, c, out, so);
      }
      __syncthreads();
   }
}
#endif

template <class D, class IT>
lm_status avg_fwd_split(int k, int64_t n, const avg_part<D, IT> &part, D *out, st4 so) {
#ifdef LM_CUDA_EMU
   /* the same per-thread bodies and the same order of the partials, as a host loop */
   typedef typename acc_of<D>::T T;
   return lm_cu_host(k, [n, part, out, so]() {
      for (int64_t i = 0; i < n; i++) {
         T partial[SPLIT_NCHW] = {};
         int64_t oh = 0, ow = 0, nn = 0, c = 0;
         for (int p = 0; p < part.parts; p++) partial[p] = part(i, p, oh, ow, nn, c);
         T acc = partial[0];
         for (int q = 1; q < part.parts; q++) acc += partial[q];
         part.finish(acc, oh, ow, nn, c, out, so);
      }
      return LM_OK;
   });
#else
   const int per = LM_CU_THREADS / part.parts;
   int64_t blocks = (n + per - 1) / per;
   if (blocks > 132 * 16) blocks = 132 * 16; /* grid-stride beyond: 16 blocks per SM */
   const dim3 threads(part.g.cl ? per : part.parts, part.g.cl ? part.parts : per);
   avg_fwd_split_kernel<D, IT><<<(unsigned)blocks, threads, 0, lm_cu_stream(k)>>>(n, part, out, so);
   return lm_cu_err(cudaPeekAtLastError(), "kernel launch");
#endif
}

/* ---- the ops ------------------------------------------------------------------------------ */

/* dtype dt as the storage type D of the statement (the four float dtypes) */
#define POOL_DTYPES(dt, what, ...)                                                                \
   switch (dt) {                                                                                  \
      POOL_FLOAT_CASES(__VA_ARGS__)                                                               \
      POOL_CASE(LM_BFLOAT16, bf16, __VA_ARGS__)                                                   \
      POOL_CASE(LM_FLOAT16, f16, __VA_ARGS__)                                                     \
      POOL_NO_DTYPE(dt, what);                                                                    \
   }

/* MAX_POOL2D, ADAPTIVE_MAX_POOL2D: t = {x, out, indices or NULL}; MAX_POOL2D_TAPS: {x, out, taps} */
lm_status k_max_forward(const lm_op *op) {
   const lm_pool_params *p = (const lm_pool_params *)op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1], *it = op->t[2];
   const int k = lm_cu_index(x);
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS;
   const geo g = with_channel_groups(
      geo_of(p, op->kind == LM_OP_ADAPTIVE_MAX_POOL2D ? G_ADAPTIVE : G_MAX));
   int64_t *ind = it && !codes ? (int64_t *)lm_cu_ptr(it) : NULL;
   uint8_t *taps = it && codes ? (uint8_t *)lm_cu_ptr(it) : NULL;
   const st4 sx = strides_of(x), so = strides_of(out), si = it ? strides_of(it) : so;
   const int64_t n = g.N * g.CG * g.OH * g.OW;
   POOL_DTYPES(x->dtype, lm_op_name(op->kind),
               return launch<max_fwd, D>(k, n, (const D *)lm_cu_ptr(x), (D *)lm_cu_ptr(out), ind,
                                          taps, g, sx, so, si))
}

/* AVG_POOL2D, ADAPTIVE_AVG_POOL2D: t = {x, out} */
lm_status k_avg_forward(const lm_op *op) {
   const lm_pool_params *p = (const lm_pool_params *)op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1];
   const int k = lm_cu_index(x);
   const geo g = geo_of(p, op->kind == LM_OP_AVG_POOL2D ? G_AVG : G_ADAPTIVE);
   const st4 sx = strides_of(x), so = strides_of(out);
   const int64_t n = g.N * g.C * g.OH * g.OW;
   /* the largest window's pixel count (adaptive windows: at most ceil(H / OH) + 1 rows) */
   const int64_t wh = g.kind == G_AVG ? g.kh : (g.OH > 0 ? (g.H + g.OH - 1) / g.OH + 1 : 0);
   const int64_t ww = g.kind == G_AVG ? g.kw : (g.OW > 0 ? (g.W + g.OW - 1) / g.OW + 1 : 0);
   /* split the windows when one thread per output would leave most of the GPU idle (fewer than
      ~64K threads: 132 SMs x 512) and each window is long enough to share (>= 64 pixels) */
   const int split_it = n < 65536 && wh * ww >= 64;
   const int parts = g.cl ? SPLIT_CL : SPLIT_NCHW;
   POOL_DTYPES(x->dtype, lm_op_name(op->kind), {
      const D *xp = (const D *)lm_cu_ptr(x);
      D *op_ = (D *)lm_cu_ptr(out);
      if (split_it) return avg_fwd_split(k, n, avg_part<D, uint32_t>{xp, g, sx, parts}, op_, so);
      return launch<avg_fwd, D>(k, n, xp, op_, g, sx, so);
   })
}

/* MAX_POOL2D_BACKWARD, ADAPTIVE_MAX_POOL2D_BACKWARD: t = {grad_out, indices, grad_x};
   MAX_POOL2D_TAPS_BACKWARD: t = {grad_out, taps, grad_x} */
lm_status k_max_backward(const lm_op *op) {
   const lm_pool_params *p = (const lm_pool_params *)op->params;
   const lm_tensor *gout = op->t[0], *it = op->t[1], *gx = op->t[2];
   const int k = lm_cu_index(gx);
   const int codes = op->kind == LM_OP_MAX_POOL2D_TAPS_BACKWARD;
   const int adaptive = op->kind == LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD;
   const char *what = adaptive ? "adaptive_max_pool2d_backward" : "max_pool2d_backward";
   const int geom = codes || (!adaptive && p->geom);
   const int win = geom || adaptive; /* the windows are known */
   /* the CPU's rule for bad entries (see the top of the file) */
   const int window_rule = codes || (geom && p->mf == LM_CHANNELS_LAST);
   const geo g = geo_of(p, adaptive ? G_ADAPTIVE : G_MAX);
   const int64_t *ind = codes ? NULL : (const int64_t *)lm_cu_ptr(it);
   const uint8_t *taps = codes ? (const uint8_t *)lm_cu_ptr(it) : NULL;
   const st4 sg = strides_of(gout), si = strides_of(it), sx = strides_of(gx);
   const int64_t nout = g.N * g.C * g.OH * g.OW;

   unsigned long long cnt[2] = {0, 0};
   if (nout > 0)
      LM_TRY(read_counts(k, 0, cnt, [&](unsigned long long *dc, unsigned *) {
         return launch<max_check, float>(k, nout, ind, taps, g, si, win, dc);
      }));
   if (window_rule) {
      if (cnt[0] + cnt[1])
         return lm_error(LM_ERR_ARG, "%s: %lld %s are out of range for their pooling windows",
                         what, (long long)(cnt[0] + cnt[1]), codes ? "taps" : "indices");
   } else if (cnt[0]) {
      return lm_error(LM_ERR_ARG, "%s: %lld indices are out of range for an input plane of %lld",
                      what, (long long)cnt[0], (long long)(g.H * g.W));
   }
   const int scatter = !window_rule && (!win || cnt[1]);
   if (scatter && lm_cu_capturing(k)) /* its indices unchecked could write anywhere */
      return lm_error(LM_ERR_DEVICE, "%s: indices whose windows are not known cannot be captured "
                      "in a CUDA graph", what);
   POOL_DTYPES(gx->dtype, what, {
      const D *gp = (const D *)lm_cu_ptr(gout);
      D *xp = (D *)lm_cu_ptr(gx);
      if (scatter) return launch<max_scatter_plane, D>(k, g.N * g.C, gp, ind, xp, g, sg, si, sx);
      const geo gv = with_channel_groups(g);
      return launch<max_gather, D>(k, g.N * gv.CG * g.H * g.W, gp, ind, taps, xp, gv, sg, si,
                                   sx);
   })
}

/* AVG_POOL2D_BACKWARD, ADAPTIVE_AVG_POOL2D_BACKWARD: t = {grad_out, grad_x} */
lm_status k_avg_backward(const lm_op *op) {
   const lm_pool_params *p = (const lm_pool_params *)op->params;
   const lm_tensor *gout = op->t[0], *gx = op->t[1];
   const int k = lm_cu_index(gx);
   const geo g = with_channel_groups(
      geo_of(p, op->kind == LM_OP_AVG_POOL2D_BACKWARD ? G_AVG : G_ADAPTIVE));
   const st4 sg = strides_of(gout), sx = strides_of(gx);
   const int64_t nin = g.N * g.CG * g.H * g.W;
   POOL_DTYPES(gx->dtype, lm_op_name(op->kind),
               return launch<avg_gather, D>(k, nin, (const D *)lm_cu_ptr(gout),
                                            (D *)lm_cu_ptr(gx), g, sg, sx))
}

} /* namespace */

void lm_cuda_register_pool(lm_kernel_fn *table) {
   table[LM_OP_MAX_POOL2D] = k_max_forward;
   table[LM_OP_ADAPTIVE_MAX_POOL2D] = k_max_forward;
   table[LM_OP_MAX_POOL2D_TAPS] = k_max_forward;
   table[LM_OP_MAX_POOL2D_BACKWARD] = k_max_backward;
   table[LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD] = k_max_backward;
   table[LM_OP_MAX_POOL2D_TAPS_BACKWARD] = k_max_backward;
   table[LM_OP_AVG_POOL2D] = k_avg_forward;
   table[LM_OP_ADAPTIVE_AVG_POOL2D] = k_avg_forward;
   table[LM_OP_AVG_POOL2D_BACKWARD] = k_avg_backward;
   table[LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] = k_avg_backward;
}
