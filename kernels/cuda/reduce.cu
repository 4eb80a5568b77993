/* reduce.cu -- sum, mean, prod, max, min (with or without indices), argmax, argmin over any set of
 * dims (LM_OP_REDUCE), and concatenation (LM_OP_CAT) on CUDA. Front ends: src/reduce.c, src/cat.c;
 * parameters: src/ops/reduce.h; the CPU's kernels, whose results these give: kernels/cpu/reduce.c.
 *
 * REDUCE. The input is seen as M outputs (the kept dims, row-major) times L reduced elements (the
 * reduced dims, row-major: that order is also the index argmax / max-with-indices report).
 * Adjacent reduced dims that are contiguous in memory are merged first (a full sum of a dense
 * tensor, or N,H,W of NHWC, become one dim), so the per-element address is one multiply.
 * Accumulation is the CPU's: double for floating results (and for max/min of floats), int64 with
 * wrap-around for integer ones; (value, index) pairs compare as the CPU's better_d: NaN wins, ties
 * and NaN against NaN go to the smaller logical index. Those rules do not depend on the order the
 * elements are visited in, so indices and max/min are exact, integer sums are exact, and float
 * sums differ from the CPU's only by the rounding of the double sums (far below the output's).
 *
 * Work split (M outputs, L elements each):
 *  - many outputs or short reductions (M >= 32768 or L <= 64): one thread per output reduces its
 *    whole row (one pass);
 *  - otherwise two levels: pass 1 gives G threads to each output, thread g folding the elements
 *    g, g + G, g + 2G, ... of its row into a partial (value, index); pass 2 is one block per
 *    output, whose threads fold the G partials and combine them in a shared-memory tree. When
 *    G >= 256 and g is the fast index, G is a multiple of 256 and each block of pass 1 already
 *    folds its 256 threads' partials (a shared-memory tree), so pass 2 reads G / 256. The
 *    thread numbering of pass 1 follows the memory: when the innermost reduced dim is the one at
 *    the smaller stride (a full sum, a row sum) g is the fast index, so neighbouring threads read
 *    neighbouring elements; when a kept dim is (per-channel sums of NHWC: C at stride 1) the
 *    output index is, so a warp reads 32 neighbouring channels of one (n, h, w). Both are
 *    coalesced. G is chosen so that pass 1 has about 132 * 1024 threads (an H200's SMs full) and
 *    every thread at least 64 elements.
 * The emulated build runs the same per-thread bodies as host loops.
 *
 * The result is converted into out (contiguous, any dtype the front end allowed) as the CPU's
 * lm_convert does (integer accumulators are not routed through double); mean divides the double
 * sum by the count (0 / 0: NaN for an empty reduction, as the CPU).
 *
 * CAT: each input is copied (converted to out's dtype) into its slice of out, one thread per
 * element in logical order, reading and writing through the strides (any layouts). Inputs that
 * share memory with out are refused with the CPU's message. */
#include "cuda.cuh"
extern "C" {
#include "iter.h"
#include "ops/reduce.h"
}
#include <math.h>

namespace {

typedef int64_t i64;
typedef uint64_t u64;

/* ---------------------------------------------------------------- conversions */

static LM_HD inline bool is_int_dtype(int dt) {
   return dt == LM_INT64 || dt == LM_INT32 || dt == LM_UINT8 || dt == LM_BOOL;
}

/* an element as int64, as the CPU's lm_convert(LM_INT64, ...) reads it */
static LM_HD inline i64 load_i64(const char *p, int dt) {
   switch (dt) {
   case LM_INT64: return *(const i64 *)p;
   case LM_INT32: return *(const int32_t *)p;
   case LM_UINT8: return *(const uint8_t *)p;
   case LM_BOOL: return *(const uint8_t *)p != 0;
   default: return lm_double_to_i64(lm_load_as_double(p, dt));
   }
}

/* an int64 into any dtype, as lm_convert from LM_INT64 (no detour through double) */
static LM_HD inline void store_i64(char *p, int dt, i64 v) {
   switch (dt) {
   case LM_FLOAT32: *(float *)p = (float)v; break;
   case LM_FLOAT64: *(double *)p = (double)v; break;
   case LM_FLOAT16: *(uint16_t *)p = lm_f2h((float)v); break;
   case LM_BFLOAT16: *(uint16_t *)p = lm_f2bf((float)v); break;
   case LM_INT64: *(i64 *)p = v; break;
   case LM_INT32: *(int32_t *)p = (int32_t)(uint32_t)(u64)v; break;
   case LM_UINT8: *(uint8_t *)p = (uint8_t)(u64)v; break;
   case LM_BOOL: *(uint8_t *)p = v != 0; break;
   default: break;
   }
}

/* one element of dtype sdt at s into dtype ddt at d */
static LM_HD inline void convert1(char *d, int ddt, const char *s, int sdt) {
   if (is_int_dtype(sdt)) store_i64(d, ddt, load_i64(s, sdt));
   else lm_store_from_double(d, ddt, lm_load_as_double(s, sdt));
}

/* ---------------------------------------------------------------- the accumulator rules */

/* op: LM_SUM (mean too), LM_PROD, LM_MAX, LM_MIN; vi: (value, index) pairs */
template <class A> struct Part {
   A v;
   i64 i;
};

static LM_HD inline bool better(bool is_max, double v, i64 i, double bv, i64 bi) {
   if (v != v) return bv == bv || i < bi;
   if (bv != bv) return false;
   if (is_max ? v > bv : v < bv) return true;
   return v == bv && i < bi;
}
static LM_HD inline bool better(bool is_max, i64 v, i64 i, i64 bv, i64 bi) {
   if (is_max ? v > bv : v < bv) return true;
   return v == bv && i < bi;
}

static LM_HD inline void init(int op, Part<double> &p) {
   p.v = op == LM_PROD ? 1.0 : op == LM_MAX ? -INFINITY : op == LM_MIN ? INFINITY : 0.0;
   p.i = INT64_MAX;
}
static LM_HD inline void init(int op, Part<i64> &p) {
   p.v = op == LM_PROD ? 1 : op == LM_MAX ? INT64_MIN : op == LM_MIN ? INT64_MAX : 0;
   p.i = INT64_MAX;
}

/* fold (v, i) into p: an element or another partial (the rules are the same) */
static LM_HD inline void fold(int op, bool vi, Part<double> &p, double v, i64 i) {
   const bool is_max = op == LM_MAX;
   if (vi) {
      if (better(is_max, v, i, p.v, p.i)) {
         p.v = v;
         p.i = i;
      }
   } else if (op == LM_SUM) {
      p.v += v;
   } else if (op == LM_PROD) {
      p.v *= v;
   } else if (v != v || (is_max ? v > p.v : v < p.v)) {
      p.v = p.v != p.v ? p.v : v;
   }
}
static LM_HD inline void fold(int op, bool vi, Part<i64> &p, i64 v, i64 i) {
   const bool is_max = op == LM_MAX;
   if (vi) {
      if (better(is_max, v, i, p.v, p.i)) {
         p.v = v;
         p.i = i;
      }
   } else if (op == LM_SUM) {
      p.v = (i64)((u64)p.v + (u64)v);
   } else if (op == LM_PROD) {
      p.v = (i64)((u64)p.v * (u64)v);
   } else if (is_max ? v > p.v : v < p.v) {
      p.v = v;
   }
}

static LM_HD inline void load_acc(const char *p, int dt, double *v) { *v = lm_load_as_double(p, dt); }
static LM_HD inline void load_acc(const char *p, int dt, i64 *v) { *v = load_i64(p, dt); }
static LM_HD inline void store_acc(char *p, int dt, double v) { lm_store_from_double(p, dt, v); }
static LM_HD inline void store_acc(char *p, int dt, i64 v) { store_i64(p, dt, v); }

/* ---------------------------------------------------------------- the plan */

struct Plan {
   const char *in;
   int in_dt, in_es;
   char *out;
   int out_dt, out_es;
   char *oidx;    /* max/min indices (int64), or NULL */
   int op;        /* LM_SUM, LM_PROD, LM_MAX, LM_MIN */
   int vi, arg, mean;
   int nk, nr;    /* kept dims (size > 1), merged reduced dims (size > 1) */
   i64 ksz[LM_MAX_DIMS], kin[LM_MAX_DIMS], kout[LM_MAX_DIMS], kidx[LM_MAX_DIMS];
   i64 rsz[LM_MAX_DIMS], rin[LM_MAX_DIMS];
   i64 M, L, count; /* outputs, elements per output (count: the same, as double for mean) */
   i64 G;           /* pass-1 threads per output (1: one pass) */
   int gfast;       /* pass 1 numbers threads g-fastest */

   /* output m's element 0 in the input, and its offsets in out / indices */
   LM_HD void kept(i64 m, i64 *ioff, i64 *ooff, i64 *xoff) const {
      i64 a = 0, b = 0, c = 0;
      for (int d = nk - 1; d >= 0; d--) {
         const i64 q = m / ksz[d], r = m - q * ksz[d];
         a += r * kin[d];
         b += r * kout[d];
         c += r * kidx[d];
         m = q;
      }
      *ioff = a;
      *ooff = b;
      *xoff = c;
   }
   /* reduced element j's offset from the output's element 0 */
   LM_HD i64 red_off(i64 j) const {
      if (nr == 1) return j * rin[0];
      i64 off = 0;
      for (int d = nr - 1; d >= 0; d--) {
         const i64 q = j / rsz[d], r = j - q * rsz[d];
         off += r * rin[d];
         j = q;
      }
      return off;
   }
   /* fold elements j0, j0 + step, ... of the row at base into p */
   template <class A> LM_HD void row(Part<A> &p, const char *base, i64 j0, i64 step) const {
      const bool v = vi != 0;
      for (i64 j = j0; j < L; j += step) {
         A x;
         load_acc(base + red_off(j) * in_es, in_dt, &x);
         fold(op, v, p, x, j);
      }
   }
   /* the result of output m */
   template <class A> LM_HD void finish(i64 m, const Part<A> &p) const {
      i64 ioff, ooff, xoff;
      kept(m, &ioff, &ooff, &xoff);
      if (arg) {
         store_i64(out + ooff * out_es, out_dt, p.i);
         return;
      }
      if (mean) lm_store_from_double(out + ooff * out_es, out_dt, (double)p.v / (double)count);
      else store_acc(out + ooff * out_es, out_dt, p.v);
      if (oidx) ((i64 *)oidx)[xoff] = p.i;
   }
};

/* one pass: thread m reduces output m's whole row */
template <class A> struct OnePass {
   Plan q;
   LM_HD void operator()(i64 m) const {
      i64 ioff, ooff, xoff;
      q.kept(m, &ioff, &ooff, &xoff);
      Part<A> p;
      init(q.op, p);
      q.row(p, q.in + ioff * q.in_es, 0, 1);
      q.finish(m, p);
   }
};

/* pass 1: thread t = (m, g) folds elements g, g + G, ... of row m into part[m * G + g] */
template <class A> struct Pass1 {
   Plan q;
   Part<A> *part;
   LM_HD void operator()(i64 t) const {
      i64 m, g;
      if (q.gfast) {
         m = t / q.G;
         g = t - m * q.G;
      } else {
         g = t / q.M;
         m = t - g * q.M;
      }
      i64 ioff, ooff, xoff;
      q.kept(m, &ioff, &ooff, &xoff);
      Part<A> p;
      init(q.op, p);
      q.row(p, q.in + ioff * q.in_es, g, q.G);
      part[m * q.G + g] = p;
   }
};

enum { P2_THREADS = 256 };

#ifndef LM_CUDA_EMU
/* pass 2: block m folds the G partials of output m, then a shared-memory tree */
template <class A> __global__ void pass2_kernel(Plan q, const Part<A> *part) {
   __shared__ Part<A> sh[P2_THREADS];
   const bool v = q.vi != 0;
   for (i64 m = blockIdx.x; m < q.M; m += gridDim.x) {
      const Part<A> *pm = part + m * q.G;
      Part<A> p;
      init(q.op, p);
      for (i64 g = threadIdx.x; g < q.G; g += P2_THREADS) fold(q.op, v, p, pm[g].v, pm[g].i);
      sh[threadIdx.x] = p;
      __syncthreads();
      for (int h = P2_THREADS / 2; h > 0; h >>= 1) {
         if ((int)threadIdx.x < h) {
            Part<A> o = sh[threadIdx.x + h];
            fold(q.op, v, sh[threadIdx.x], o.v, o.i);
         }
         __syncthreads();
      }
      if (threadIdx.x == 0) q.finish(m, sh[0]);
      __syncthreads(); /* sh is reused by the next m */
   }
}

/* pass 1 for g-fast plans with G a multiple of the block size: the block's threads are 256
   consecutive g of one output, and the block folds their partials itself (shared-memory tree),
   so pass 2 reads G / 256 partials per output instead of G (a full sum of 25M elements: 528
   partials, not 135168) */
template <class A> __global__ void pass1_block_kernel(Plan q, Part<A> *part) {
   __shared__ Part<A> sh[P2_THREADS];
   const bool v = q.vi != 0;
   const i64 nbg = q.G / P2_THREADS;
   for (i64 b = blockIdx.x; b < q.M * nbg; b += gridDim.x) {
      const i64 m = b / nbg, bg = b - m * nbg;
      i64 ioff, ooff, xoff;
      q.kept(m, &ioff, &ooff, &xoff);
      Part<A> p;
      init(q.op, p);
      q.row(p, q.in + ioff * q.in_es, bg * P2_THREADS + threadIdx.x, q.G);
      sh[threadIdx.x] = p;
      __syncthreads();
      for (int h = P2_THREADS / 2; h > 0; h >>= 1) {
         if ((int)threadIdx.x < h) {
            Part<A> o = sh[threadIdx.x + h];
            fold(q.op, v, sh[threadIdx.x], o.v, o.i);
         }
         __syncthreads();
      }
      if (threadIdx.x == 0) part[b] = sh[0];
      __syncthreads();
   }
}
#endif

template <class A> lm_status run_plan(int dev, const Plan &q) {
   if (q.M <= 0) return LM_OK;
   if (q.G <= 1) {
      OnePass<A> b = {q};
      return lm_cu_for(dev, q.M, b);
   }
   const size_t nb = (size_t)(q.M * q.G) * sizeof(Part<A>);
   Part<A> *part = (Part<A> *)lm_cu_alloc(dev, nb);
   if (!part) return LM_ERR_OOM;
   lm_status st;
#ifndef LM_CUDA_EMU
   if (q.gfast && q.G % P2_THREADS == 0) {
      const i64 nblk = q.M * (q.G / P2_THREADS);
      pass1_block_kernel<A><<<(unsigned)(nblk < 132 * 64 ? nblk : 132 * 64), P2_THREADS, 0,
                              lm_cu_stream(dev)>>>(q, part);
      st = lm_cu_err(cudaPeekAtLastError(), "reduce kernel launch");
      Plan q2 = q; /* pass 2 over the blocks' partials */
      q2.G = q.G / P2_THREADS;
      if (st == LM_OK) {
         pass2_kernel<A><<<(unsigned)(q.M < 65535 ? q.M : 65535), P2_THREADS, 0,
                           lm_cu_stream(dev)>>>(q2, part);
         st = lm_cu_err(cudaPeekAtLastError(), "reduce kernel launch");
      }
      lm_cu_free(dev, part, nb);
      return st;
   }
#endif
   Pass1<A> b1 = {q, part};
   st = lm_cu_for(dev, q.M * q.G, b1);
   if (st == LM_OK) {
#ifdef LM_CUDA_EMU
      st = lm_cu_host(dev, [q, part]() {
         const bool v = q.vi != 0;
         for (i64 m = 0; m < q.M; m++) {
            Part<A> p;
            init(q.op, p);
            for (i64 g = 0; g < q.G; g++)
               fold(q.op, v, p, part[m * q.G + g].v, part[m * q.G + g].i);
            q.finish(m, p);
         }
         return LM_OK;
      });
#else
      const i64 blocks = q.M < 65535 ? q.M : 65535;
      pass2_kernel<A><<<(unsigned)blocks, P2_THREADS, 0, lm_cu_stream(dev)>>>(q, part);
      st = lm_cu_err(cudaPeekAtLastError(), "reduce kernel launch");
#endif
   }
   /* queued work on dev's stream only: the caching allocator reuses the block after it */
   lm_cu_free(dev, part, nb);
   return st;
}

static i64 iabs(i64 v) { return v < 0 ? -v : v; }

/* REDUCE: t = {input, out, indices (NULL: none)} (ops/reduce.h) */
static lm_status k_reduce(const lm_op *op) {
   const lm_reduce_params *p = (const lm_reduce_params *)op->params;
   const lm_tensor *a = op->t[0];
   lm_tensor *o = op->t[1], *oi = op->t[2];
   const int dev = lm_cu_index(a);
   const int nd = a->ndim;
   Plan q;
   memset(&q, 0, sizeof q);
   q.in = lm_cu_ptr(a);
   q.in_dt = a->dtype;
   q.in_es = lm_dtype_size(a->dtype);
   q.out = lm_cu_ptr(o);
   q.out_dt = o->dtype;
   q.out_es = lm_dtype_size(o->dtype);
   q.arg = p->arg;
   q.vi = p->want_idx;
   q.mean = p->op == LM_MEAN;
   q.op = p->op == LM_MEAN ? LM_SUM
          : p->arg         ? (p->op == LM_ARGMAX ? LM_MAX : LM_MIN)
                           : p->op;
   q.oidx = (oi && !p->arg) ? lm_cu_ptr(oi) : (char *)0;
   int acc_double;
   if (p->op == LM_MAX || p->op == LM_MIN || p->arg) acc_double = lm_is_float_dtype(a->dtype);
   else acc_double = lm_is_float_dtype(p->rdt);

   /* kept dims (out's strides: out has the keepdim shape or the reduced dims dropped) and the
      reduced dims, merged where memory allows */
   q.M = 1;
   q.L = 1;
   for (int d = 0, j = 0; d < nd; d++) {
      const int in_out = !p->red[d] || p->keepdim;
      const i64 os = in_out ? o->strides[j] : 0, xs = (in_out && oi && !p->arg) ? oi->strides[j] : 0;
      if (in_out) j++;
      const i64 sz = a->sizes[d];
      if (p->red[d]) {
         q.L *= sz;
         if (sz == 1) continue;
         if (q.nr > 0 && q.rin[q.nr - 1] == a->strides[d] * sz) {
            q.rsz[q.nr - 1] *= sz;
            q.rin[q.nr - 1] = a->strides[d];
         } else {
            q.rsz[q.nr] = sz;
            q.rin[q.nr] = a->strides[d];
            q.nr++;
         }
      } else {
         q.M *= sz;
         if (sz == 1) continue;
         q.ksz[q.nk] = sz;
         q.kin[q.nk] = a->strides[d];
         q.kout[q.nk] = os;
         q.kidx[q.nk] = xs;
         q.nk++;
      }
   }
   q.count = q.L;
   if (q.M <= 0) return LM_OK;
   /* the work split (top comment) */
   enum { TARGET_THREADS = 132 * 1024, MIN_PER_THREAD = 64, MANY_OUTPUTS = 32768 };
   q.G = 1;
   if (q.L > MIN_PER_THREAD && q.M < MANY_OUTPUTS) {
      i64 g = TARGET_THREADS / q.M;
      const i64 gmax = (q.L + MIN_PER_THREAD - 1) / MIN_PER_THREAD;
      if (g > gmax) g = gmax;
      q.G = g > 1 ? g : 1;
   }
   if (q.L == 0) q.G = 1;
   /* g fastest when the innermost reduced dim has a smaller stride than every kept dim */
   i64 rmin = q.nr ? iabs(q.rin[q.nr - 1]) : 0, kmin = -1;
   for (int d = 0; d < q.nk; d++)
      if (kmin < 0 || iabs(q.kin[d]) < kmin) kmin = iabs(q.kin[d]);
   q.gfast = q.nk == 0 || (q.nr > 0 && rmin < kmin);
   /* a g-fast split of 256 threads or more: whole blocks per output (pass1_block_kernel) */
   if (q.gfast && q.G >= P2_THREADS) q.G -= q.G % P2_THREADS;
   return acc_double ? run_plan<double>(dev, q) : run_plan<i64>(dev, q);
}

/* ---------------------------------------------------------------- cat */

struct CatCopy {
   char *dst;
   const char *src;
   lm_cu_view dv, sv;
   int ddt, sdt, des, ses;
   LM_HD void operator()(i64 i) const {
      char *d = dst + lm_cu_offset(dv, i) * des;
      const char *s = src + lm_cu_offset(sv, i) * ses;
      if (ddt == sdt) {
         switch (des) {
         case 1: *(uint8_t *)d = *(const uint8_t *)s; break;
         case 2: *(uint16_t *)d = *(const uint16_t *)s; break;
         case 4: *(uint32_t *)d = *(const uint32_t *)s; break;
         default: *(u64 *)d = *(const u64 *)s; break;
         }
      } else {
         convert1(d, ddt, s, sdt);
      }
   }
};

/* CAT: t = {out, in_0, .., in_{n-1}} (ops/reduce.h): each input copied into its slice of out */
static lm_status k_cat(const lm_op *op) {
   const lm_cat_params *q = (const lm_cat_params *)op->params;
   const int n = op->nt - 1, dim = q->dim;
   lm_tensor *o = op->t[0];
   const int dev = lm_cu_index(o);
   lm_operand oo;
   lm_operand_tensor(&oo, o);
   for (int i = 0; i < n; i++) {
      lm_operand ti;
      lm_operand_tensor(&ti, op->t[i + 1]);
      if (lm_operands_overlap(&oo, &ti))
         return lm_error(LM_ERR_ARG,
                         "unsupported operation: the input tensors cannot refer to any of the "
                         "output memory locations");
   }
   i64 off = 0;
   const lm_cu_view ov = lm_cu_view_of(o);
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = op->t[i + 1];
      if (t->ndim == 1 && t->sizes[0] == 0) continue;
      const i64 len = t->sizes[dim];
      if (len > 0 && t->numel > 0) {
         CatCopy c;
         c.dv = ov;
         c.dv.size[dim] = len;
         c.dst = lm_cu_ptr(o) + off * o->strides[dim] * lm_dtype_size(o->dtype);
         c.src = lm_cu_ptr(t);
         c.sv = lm_cu_view_of(t);
         c.ddt = o->dtype;
         c.sdt = t->dtype;
         c.des = lm_dtype_size(o->dtype);
         c.ses = lm_dtype_size(t->dtype);
         LM_TRY(lm_cu_for(dev, t->numel, c));
      }
      off += len;
   }
   return LM_OK;
}

} // namespace

void lm_cuda_register_reduce(lm_kernel_fn *table) {
   table[LM_OP_REDUCE] = k_reduce;
   table[LM_OP_CAT] = k_cat;
}
