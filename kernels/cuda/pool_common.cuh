/* pool_common.cuh -- what the CUDA kernels of the 2-D pools (pool.cu) and the 3-D pools
 * (pool3d.cu) share: the window rules along one dimension (the CPU's, kernels/cpu/pool_geom.h,
 * with a division where the CPU loops), the windows that hold an input (the gathers), the
 * decomposition of a thread's flat index, the channel groups of the channels-last kernels, the
 * index check's counters and the launch of a per-thread body. Each file applies them to its own
 * geometry (geo: named {H, W} fields in pool.cu, {D, H, W} arrays in pool3d.cu). */
#ifndef LUMEN_CUDA_POOL_COMMON_CUH
#define LUMEN_CUDA_POOL_COMMON_CUH
#include "cuda.cuh"

namespace {

/* how a window follows from the sizes */
enum { G_MAX = 0, G_AVG = 1, G_ADAPTIVE = 2 };

/* up to VMAX consecutive channels a thread in the channels-last gathers and max forward: the
   window and cover arithmetic (a few divisions) is then paid once per VMAX elements; each load
   instruction of a warp spans 32 VMAX channels, the next v hits the same lines in L1 */
enum { VMAX = 4 };

/* g with its channel groups set (a geo with fields C, vc, CG, cl): VMAX channels per thread in
   channels-last, 1 otherwise */
template <class G> G with_channel_groups(G g) {
   if (g.cl) {
      g.vc = g.C < (int64_t)VMAX ? g.C : (int64_t)VMAX;
      g.CG = (g.C + g.vc - 1) / g.vc;
   }
   return g;
}

LM_HD inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
LM_HD inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
/* floor / ceiling of a / b for b > 0 and any a; in 32 bits when both fit (a 64-bit division is
   several times the instructions of a 32-bit one on the GPU, and the gathers do a few per thread) */
LM_HD inline int64_t floordiv(int64_t a, int64_t b) {
   if (a == (int32_t)a && b == (int32_t)b) {
      const int32_t a32 = (int32_t)a, b32 = (int32_t)b, q = a32 / b32;
      return (q * b32 != a32 && a32 < 0) ? q - 1 : q;
   }
   const int64_t q = a / b;
   return (q * b != a && a < 0) ? q - 1 : q;
}
LM_HD inline int64_t ceildiv(int64_t a, int64_t b) { return -floordiv(-a, b); }

/* adaptive window a of b over c inputs: [floor(a c / b), ceil((a + 1) c / b)) */
LM_HD inline int64_t ad_start(int64_t a, int64_t b, int64_t c) {
   return (a / b) * c + ((a % b) * c) / b;
}
LM_HD inline int64_t ad_end(int64_t a, int64_t b, int64_t c) { return 1 + ((a + 1) * c - 1) / b; }

/* window o of O along a dimension of I inputs (kernel k, stride s, padding pad, dilation d):
   its first input a and end b (exclusive; taps a, a + d, ... for max) inside the input, and z:
   the window's size counted with padding (avg) or the tap number of its first tap inside (max),
   exactly as the CPU's pool_window (kernels/cpu/pool_geom.h) */
LM_HD inline void window(int kind, int64_t o, int64_t O, int64_t I, int64_t k, int64_t s,
                         int64_t pad, int64_t d, int64_t &a, int64_t &b, int64_t &z) {
   if (kind == G_MAX) {
      a = o * s - pad;
      b = min64(a + (k - 1) * d + 1, I);
      z = 0;
      if (a < 0) { /* the CPU's while (a < 0) a += d, z++ */
         z = (-a + d - 1) / d;
         a += z * d;
      }
   } else if (kind == G_AVG) {
      a = o * s - pad;
      b = min64(a + k, I + pad);
      z = b - a;
      a = max64(a, 0);
      b = min64(b, I);
   } else {
      a = ad_start(o, O, I);
      b = ad_end(o, O, I);
      z = b - a;
   }
}

/* the windows [lo, hi) along a dimension that hold input i: regular windows (G_MAX, G_AVG; for
   max with dilation, a window in the range holds i only if (i + pad - o s) % d == 0: the gathers
   check) or adaptive ones (whose starts and ends both grow with o, so the holders are a run) */
LM_HD inline void cover(int kind, int64_t i, int64_t O, int64_t I, int64_t k, int64_t s,
                        int64_t pad, int64_t d, int64_t &lo, int64_t &hi) {
   if (O <= 0) {
      lo = hi = 0;
      return;
   }
   if (kind != G_ADAPTIVE) {
      const int64_t dd = kind == G_MAX ? d : 1;
      lo = max64(ceildiv(i + pad - (k - 1) * dd, s), 0);
      hi = min64(floordiv(i + pad, s) + 1, O);
      if (hi < lo) hi = lo;
      return;
   }
   /* end(o) = ceil((o + 1) I / O) > i  <=>  o >= floor(i O / I);
      start(o) = floor(o I / O) <= i  <=>  o < ceil((i + 1) O / I) */
   lo = min64(i * O / I, O);
   hi = min64(((i + 1) * O + I - 1) / I, O);
   if (hi < lo) hi = lo;
}

/* input i (inside the input) is a tap of window o of O along a dimension of I inputs: the max
   backwards' check of a saved index */
LM_HD inline int in_window(int kind, int64_t o, int64_t i, int64_t O, int64_t I, int64_t k,
                           int64_t s, int64_t pad, int64_t d) {
   if (kind == G_ADAPTIVE) return i >= ad_start(o, O, I) && i < ad_end(o, O, I);
   const int64_t a = i - (o * s - pad);
   return a >= 0 && a % d == 0 && a / d < k;
}

/* one step of the decomposition of a thread's flat index, in IT (uint32_t when the element count
   allows: 64-bit divisions are several times slower on the GPU): j = q E + r, r returned, j
   becomes q */
template <class IT> LM_HD inline int64_t peel(IT &j, int64_t E) {
   const IT q = j / (IT)E;
   const int64_t r = (int64_t)(j - q * (IT)E);
   j = q;
   return r;
}

/* the flat index i of a thread over (N, C, A, B) in the order of the threads: (n, a, b, c) with c
   fastest for channels-last, (n, c, a, b) with b fastest otherwise */
template <class IT>
LM_HD inline void split(int64_t i, int cl, int64_t C, int64_t A, int64_t B, int64_t &n,
                        int64_t &c, int64_t &a, int64_t &b) {
   IT j = (IT)i;
   if (cl) {
      c = peel(j, C);
      b = peel(j, B);
      a = peel(j, A);
   } else {
      b = peel(j, B);
      a = peel(j, A);
      c = peel(j, C);
   }
   n = (int64_t)j;
}

/* the same over (N, C, A, B, E): (n, a, b, e, c) or (n, c, a, b, e) */
template <class IT>
LM_HD inline void split(int64_t i, int cl, int64_t C, int64_t A, int64_t B, int64_t E,
                        int64_t &n, int64_t &c, int64_t &a, int64_t &b, int64_t &e) {
   IT j = (IT)i;
   if (cl) {
      c = peel(j, C);
      e = peel(j, E);
      b = peel(j, B);
      a = peel(j, A);
   } else {
      e = peel(j, E);
      b = peel(j, B);
      a = peel(j, A);
      c = peel(j, C);
   }
   n = (int64_t)j;
}

/* one more bad entry (rare: only bad input gets here, so the atomic never contends) */
LM_HD inline void count_one(unsigned long long *p) {
#ifdef __CUDA_ARCH__
   atomicAdd(p, 1ULL);
#else
   ++*p;
#endif
}

/* body F<D, IT> over [0, n): 32-bit decomposition when n allows */
template <template <class, class> class F, class D, class... A>
lm_status launch(int k, int64_t n, A... args) {
   if (n <= (int64_t)UINT32_MAX) return lm_cu_for(k, n, F<D, uint32_t>{args...});
   return lm_cu_for(k, n, F<D, int64_t>{args...});
}

/* a max-pool backward's check of the saved indices: check(cnt, named) runs on two zeroed device
   counters (and, nb > 0, a zeroed workspace of nb bytes of unsigned counters; else NULL), whose
   values are then read back into cnt -- one small synchronising copy per max-pool backward, the
   price of the CPU's errors for bad indices */
template <class F> lm_status read_counts(int k, size_t nb, unsigned long long cnt[2], F check) {
   if (lm_cu_capturing(k)) {
      /* a graph capture cannot read anything back: no check, counts of 0, which takes the
         gather path where the windows are known (it reads only the indices of the windows over
         each input pixel, so a bad index loses its gradient rather than writing elsewhere); a
         backward that needs the per-pixel counts cannot be captured */
      cnt[0] = cnt[1] = 0;
      if (nb)
         return lm_error(LM_ERR_DEVICE, "a max-pool backward whose windows are not known cannot "
                         "be captured in a CUDA graph");
      return LM_OK;
   }
   const size_t cb = 2 * sizeof(unsigned long long);
   unsigned long long *dc = (unsigned long long *)lm_cu_alloc(k, cb);
   if (!dc) return LM_ERR_OOM; /* lm_cu_alloc set the message */
   unsigned *named = nb ? (unsigned *)lm_cu_alloc(k, nb) : NULL;
   lm_status st = nb && !named ? LM_ERR_OOM : LM_OK;
   if (st == LM_OK)
      st = lm_cu_err(cudaMemsetAsync(dc, 0, cb, lm_cu_stream(k)), "cudaMemsetAsync");
   if (st == LM_OK && named)
      st = lm_cu_err(cudaMemsetAsync(named, 0, nb, lm_cu_stream(k)), "cudaMemsetAsync");
   if (st == LM_OK) st = check(dc, named);
   if (st == LM_OK) st = lm_cu_memcpy(k, cnt, dc, cb, 1);
   if (named) lm_cu_free(k, named, nb);
   lm_cu_free(k, dc, cb);
   return st;
}

} /* namespace */

/* a case of a switch on the dtype: D, the storage type, for the statement(s) */
#define POOL_CASE(DT, T, ...)                                                                     \
   case DT: {                                                                                     \
      typedef T D;                                                                                \
      __VA_ARGS__;                                                                                \
   }
/* float32 and float64, the dtypes every pool kernel takes */
#define POOL_FLOAT_CASES(...)                                                                     \
   POOL_CASE(LM_FLOAT32, float, __VA_ARGS__) POOL_CASE(LM_FLOAT64, double, __VA_ARGS__)
/* the switch's end: a dtype the file's kernels do not take */
#define POOL_NO_DTYPE(dt, what)                                                                   \
   default:                                                                                       \
      return lm_error(LM_ERR_DTYPE, "%s: unsupported dtype %s on cuda", what, lm_dtype_name(dt))

#endif
