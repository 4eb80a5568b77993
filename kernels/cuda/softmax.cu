/* softmax.cu -- softmax / log_softmax forward and backward, nll_loss forward and backward on CUDA
 * (LM_OP_SOFTMAX, SOFTMAX_BACKWARD: front end src/ops/softmax.c, parameters src/ops/softmax.h, CPU
 * kernels/cpu/softmax.c; LM_OP_NLL_LOSS, NLL_LOSS_BACKWARD: front end src/ops/loss.c, parameters
 * src/ops/loss.h, CPU kernels/cpu/loss.c).
 *
 * softmax: the front end hands float32 / float64 tensors (halves run on float32 copies there, as
 * on the CPU); the kernels nevertheless take any strides, so a channels_last tensor reduced over
 * dim 1 (C at stride 1) would work as well as the contiguous one the front end makes today. One
 * "row" is every element along dim for one position of the other dims; the arithmetic of a row is
 * the CPU's step for step (max in T, exp and the sums in double, the same roundings to T):
 *   - rows whose elements are at stride 1 in x and y (the last dim of a contiguous tensor: the
 *     logits of a classifier) run one warp per row on the GPU, so that a warp's loads are
 *     coalesced; the lanes' double sums are combined by shuffles (another order than the CPU's
 *     serial one: within rounding, as the specs' tolerance);
 *   - every other layout runs one thread per row: neighbouring threads then hold neighbouring
 *     positions of the inner dims (H*W of NCHW, or C of NHWC), which are the coalesced accesses.
 * The emulated build runs the per-row body on the host for both.
 *
 * nll_loss: one thread per sample (the target's shape), the samples' (loss, weight) pairs summed
 * in double by one block (a loss has one term per sample: batch size, or N*H*W for
 * segmentation). Target values are checked first on the device; a bad one is reported with the
 * CPU's message ("Target 7 is out of bounds."), the first in sample order, which costs one 8-byte
 * copy to the host (a sync) per call. */
#include "cuda.cuh"
extern "C" {
#include "nn.h"
#include "ops/loss.h"
#include "ops/softmax.h"
}
#include <math.h>

namespace {

/* ---------------------------------------------------------------- softmax */

/* a tensor seen as rows: the view of every dim but `dim`, and the stride along dim */
struct RowView {
   lm_cu_view v; /* the other dims (row-major order of the rows) */
   int64_t ds;   /* stride along dim */
};

static RowView row_view(const lm_tensor *t, int dim) {
   RowView r;
   r.v.nd = 0;
   for (int d = 0; d < LM_MAX_DIMS; d++) {
      r.v.size[d] = 1;
      r.v.stride[d] = 0;
   }
   r.ds = 0;
   for (int d = 0; d < t->ndim; d++) {
      if (d == dim) {
         r.ds = t->strides[d];
      } else {
         r.v.size[r.v.nd] = t->sizes[d];
         r.v.stride[r.v.nd] = t->strides[d];
         r.v.nd++;
      }
   }
   return r;
}

template <class T> struct SoftmaxFwd {
   const T *x;
   T *y;
   RowView xv, yv;
   int64_t D;
   int lg;
   /* row r, done by one thread */
   LM_HD void operator()(int64_t r) const {
      const T *xr = x + lm_cu_offset(xv.v, r);
      T *yr = y + lm_cu_offset(yv.v, r);
      const int64_t xs = xv.ds, ys = yv.ds;
      T mx = (T)-INFINITY;
      for (int64_t d = 0; d < D; d++) mx = xr[d * xs] > mx ? xr[d * xs] : mx;
      double sum = 0;
      if (lg) {
         for (int64_t d = 0; d < D; d++) sum += exp((double)xr[d * xs] - (double)mx);
         const double sh = (double)mx + log(sum);
         for (int64_t d = 0; d < D; d++) yr[d * ys] = (T)((double)xr[d * xs] - sh);
      } else {
         for (int64_t d = 0; d < D; d++) {
            double e = exp((double)xr[d * xs] - (double)mx);
            sum += e;
            yr[d * ys] = (T)e;
         }
         const double inv = 1.0 / sum;
         for (int64_t d = 0; d < D; d++) yr[d * ys] = (T)((double)yr[d * ys] * inv);
      }
   }
};

template <class T> struct SoftmaxBwd {
   const T *g, *y;
   T *gx;
   RowView gv, yv, xv;
   int64_t D;
   int lg;
   LM_HD void operator()(int64_t r) const {
      const T *gr = g + lm_cu_offset(gv.v, r), *yr = y + lm_cu_offset(yv.v, r);
      T *xr = gx + lm_cu_offset(xv.v, r);
      const int64_t gs = gv.ds, ys = yv.ds, xs = xv.ds;
      double sum = 0;
      if (lg)
         for (int64_t d = 0; d < D; d++) sum += (double)gr[d * gs];
      else
         for (int64_t d = 0; d < D; d++) sum += (double)gr[d * gs] * (double)yr[d * ys];
      if (lg)
         for (int64_t d = 0; d < D; d++)
            xr[d * xs] = (T)((double)gr[d * gs] - exp((double)yr[d * ys]) * sum);
      else
         for (int64_t d = 0; d < D; d++)
            xr[d * xs] = (T)((double)yr[d * ys] * ((double)gr[d * gs] - sum));
   }
};

#ifndef LM_CUDA_EMU
/* one warp per row, for rows at stride 1 (x, y) */
__device__ __forceinline__ double warp_sum(double v) {
   for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
   return v;
}
template <class T> __device__ __forceinline__ T warp_max(T v) {
   for (int o = 16; o > 0; o >>= 1) {
      T w = __shfl_xor_sync(0xffffffffu, v, o);
      v = w > v ? w : v; /* as the CPU's `x > mx ? x : mx`: NaN never wins */
   }
   return v;
}

template <class T>
__global__ void softmax_fwd_warp(const T *x, T *y, lm_cu_view xv, lm_cu_view yv, int64_t rows,
                                 int64_t D, int lg) {
   const int lane = threadIdx.x & 31;
   const int64_t wpb = blockDim.x / 32;
   const int64_t step = wpb * gridDim.x;
   for (int64_t r = (int64_t)blockIdx.x * wpb + threadIdx.x / 32; r < rows; r += step) {
      const T *xr = x + lm_cu_offset(xv, r);
      T *yr = y + lm_cu_offset(yv, r);
      T mx = (T)-INFINITY;
      for (int64_t d = lane; d < D; d += 32) mx = xr[d] > mx ? xr[d] : mx;
      mx = warp_max(mx);
      double sum = 0;
      if (lg) {
         for (int64_t d = lane; d < D; d += 32) sum += exp((double)xr[d] - (double)mx);
         sum = warp_sum(sum);
         const double sh = (double)mx + log(sum);
         for (int64_t d = lane; d < D; d += 32) yr[d] = (T)((double)xr[d] - sh);
      } else {
         for (int64_t d = lane; d < D; d += 32) {
            double e = exp((double)xr[d] - (double)mx);
            sum += e;
            yr[d] = (T)e;
         }
         sum = warp_sum(sum);
         const double inv = 1.0 / sum;
         /* each lane rescales the elements it wrote itself: no cross-lane hazard */
         for (int64_t d = lane; d < D; d += 32) yr[d] = (T)((double)yr[d] * inv);
      }
   }
}

template <class T>
__global__ void softmax_bwd_warp(const T *g, const T *y, T *gx, lm_cu_view gv, lm_cu_view yv,
                                 lm_cu_view xv, int64_t rows, int64_t D, int lg) {
   const int lane = threadIdx.x & 31;
   const int64_t wpb = blockDim.x / 32;
   const int64_t step = wpb * gridDim.x;
   for (int64_t r = (int64_t)blockIdx.x * wpb + threadIdx.x / 32; r < rows; r += step) {
      const T *gr = g + lm_cu_offset(gv, r), *yr = y + lm_cu_offset(yv, r);
      T *xr = gx + lm_cu_offset(xv, r);
      double sum = 0;
      if (lg)
         for (int64_t d = lane; d < D; d += 32) sum += (double)gr[d];
      else
         for (int64_t d = lane; d < D; d += 32) sum += (double)gr[d] * (double)yr[d];
      sum = warp_sum(sum);
      if (lg)
         for (int64_t d = lane; d < D; d += 32)
            xr[d] = (T)((double)gr[d] - exp((double)yr[d]) * sum);
      else
         for (int64_t d = lane; d < D; d += 32) xr[d] = (T)((double)yr[d] * ((double)gr[d] - sum));
   }
}

/* rows at stride 1 long enough for a warp to pay */
static inline int warp_rows(int64_t D, int64_t s0, int64_t s1, int64_t s2) {
   return D >= 64 && s0 == 1 && s1 == 1 && s2 == 1;
}

static unsigned warp_blocks(int64_t rows) {
   const int64_t wpb = LM_CU_THREADS / 32;
   int64_t b = (rows + wpb - 1) / wpb;
   if (b > 132 * 64) b = 132 * 64;
   return (unsigned)(b > 0 ? b : 1);
}
#endif


template <class T> lm_status softmax_fwd(const lm_op *op) {
   const lm_softmax_params *p = (const lm_softmax_params *)op->params;
   const lm_tensor *x = op->t[0];
   lm_tensor *y = op->t[1];
   const int k = lm_cu_index(x);
   SoftmaxFwd<T> b;
   b.x = (const T *)lm_cu_ptr(x);
   b.y = (T *)lm_cu_ptr(y);
   b.xv = row_view(x, x->ndim == 0 ? -1 : p->dim);
   b.yv = row_view(y, y->ndim == 0 ? -1 : p->dim);
   b.D = x->ndim == 0 ? 1 : x->sizes[p->dim];
   b.lg = p->log;
   const int64_t rows = b.D > 0 ? x->numel / b.D : 0;
   if (rows <= 0) return LM_OK;
#ifndef LM_CUDA_EMU
   if (warp_rows(b.D, b.xv.ds, b.yv.ds, 1)) {
      softmax_fwd_warp<T><<<warp_blocks(rows), LM_CU_THREADS, 0, lm_cu_stream(k)>>>(
         b.x, b.y, b.xv.v, b.yv.v, rows, b.D, b.lg);
      return lm_cu_err(cudaPeekAtLastError(), "softmax kernel launch");
   }
#endif
   return lm_cu_for(k, rows, b);
}

template <class T> lm_status softmax_bwd(const lm_op *op) {
   const lm_softmax_params *p = (const lm_softmax_params *)op->params;
   const lm_tensor *g = op->t[0], *y = op->t[1];
   lm_tensor *gx = op->t[2];
   const int k = lm_cu_index(y);
   const int dim = y->ndim == 0 ? -1 : p->dim;
   SoftmaxBwd<T> b;
   b.g = (const T *)lm_cu_ptr(g);
   b.y = (const T *)lm_cu_ptr(y);
   b.gx = (T *)lm_cu_ptr(gx);
   b.gv = row_view(g, dim);
   b.yv = row_view(y, dim);
   b.xv = row_view(gx, dim);
   b.D = y->ndim == 0 ? 1 : y->sizes[p->dim];
   b.lg = p->log;
   const int64_t rows = b.D > 0 ? y->numel / b.D : 0;
   if (rows <= 0) return LM_OK;
#ifndef LM_CUDA_EMU
   if (warp_rows(b.D, b.gv.ds, b.yv.ds, b.xv.ds)) {
      softmax_bwd_warp<T><<<warp_blocks(rows), LM_CU_THREADS, 0, lm_cu_stream(k)>>>(
         b.g, b.y, b.gx, b.gv.v, b.yv.v, b.xv.v, rows, b.D, b.lg);
      return lm_cu_err(cudaPeekAtLastError(), "softmax_backward kernel launch");
   }
#endif
   return lm_cu_for(k, rows, b);
}

static lm_status k_softmax(const lm_op *op) {
   const lm_tensor *x = op->t[0];
   if (x->dtype == LM_FLOAT64) return softmax_fwd<double>(op);
   if (x->dtype == LM_FLOAT32) return softmax_fwd<float>(op);
   return lm_error(LM_ERR_DTYPE, "softmax: unsupported dtype %s", lm_dtype_name(x->dtype));
}

static lm_status k_softmax_backward(const lm_op *op) {
   const lm_tensor *y = op->t[1];
   if (y->dtype == LM_FLOAT64) return softmax_bwd<double>(op);
   if (y->dtype == LM_FLOAT32) return softmax_bwd<float>(op);
   return lm_error(LM_ERR_DTYPE, "softmax_backward: unsupported dtype %s",
                   lm_dtype_name(y->dtype));
}

/* ---------------------------------------------------------------- nll_loss */

/* the sample space (the target's shape) and each operand's strides over it */
struct Samples {
   int nd;
   int64_t size[LM_MAX_DIMS];
   int64_t tst[LM_MAX_DIMS]; /* target */
   int64_t ist[LM_MAX_DIMS]; /* input (or grad_input) without the class dim */
   int64_t gst[LM_MAX_DIMS]; /* grad_out (reduction none) */
   int64_t count, C, cst;
};

static Samples samples_of(const lm_tensor *input, const lm_tensor *target) {
   Samples s;
   memset(&s, 0, sizeof s);
   s.nd = target->ndim;
   s.count = 1;
   for (int j = 0; j < s.nd; j++) {
      const int d = j == 0 ? 0 : j + 1; /* input dim of sample dim j */
      s.size[j] = target->sizes[j];
      s.tst[j] = target->strides[j];
      s.ist[j] = input->ndim == 1 ? 0 : input->strides[d];
      s.count *= target->sizes[j];
   }
   const int cdim = input->ndim == 1 ? 0 : 1;
   s.C = input->sizes[cdim];
   s.cst = input->strides[cdim];
   return s;
}

/* sample k's offsets into target (*to), input (*io) and grad_out (*go) */
static LM_HD inline void sample_offsets(const Samples &s, int64_t k, int64_t *to, int64_t *io,
                                        int64_t *go) {
   int64_t t = 0, i = 0, g = 0;
   for (int j = s.nd - 1; j >= 0; j--) {
      const int64_t q = k / s.size[j], r = k - q * s.size[j];
      t += r * s.tst[j];
      i += r * s.ist[j];
      g += r * s.gst[j];
      k = q;
   }
   *to = t;
   *io = i;
   *go = g;
}

struct CheckTargets {
   Samples s;
   const int64_t *tg;
   int64_t ignore;
   unsigned long long *first; /* the smallest bad sample index (>= count: none) */
   LM_HD void operator()(int64_t k) const {
      int64_t to, io, go;
      sample_offsets(s, k, &to, &io, &go);
      const int64_t t = tg[to];
      if (t != ignore && (t < 0 || t >= s.C)) {
#ifdef __CUDA_ARCH__
         atomicMin(first, (unsigned long long)k);
#else /* the emulated build's host loop (and nvcc's host pass of this body, never run) */
         if ((unsigned long long)k < *first) *first = (unsigned long long)k;
#endif
      }
   }
};

/* the CPU's error for the first bad target, if any */
static lm_status check_targets(int dev, const Samples &s, const lm_tensor *target,
                               int64_t ignore) {
   /* a graph capture cannot read the flag back: the kernels guard the index themselves */
   if (s.count <= 0 || lm_cu_capturing(dev)) return LM_OK;
   unsigned long long *first = (unsigned long long *)lm_cu_alloc(dev, sizeof *first);
   if (!first) return LM_ERR_OOM;
   unsigned long long h = 0;
   /* all ones: "none found" (>= count); a memset, so the only sync is the copy back */
   lm_status st = lm_cu_err(cudaMemsetAsync(first, 0xff, sizeof *first, lm_cu_stream(dev)),
                            "cudaMemsetAsync");
   CheckTargets c;
   c.s = s;
   c.tg = (const int64_t *)lm_cu_ptr(target);
   c.ignore = ignore;
   c.first = first;
   if (st == LM_OK) st = lm_cu_for(dev, s.count, c);
   if (st == LM_OK) st = lm_cu_memcpy(dev, &h, first, sizeof h, 1);
   lm_cu_free(dev, first, sizeof *first);
   if (st != LM_OK) return st;
   if (h >= (unsigned long long)s.count) return LM_OK;
   int64_t to, io, go, t = 0;
   sample_offsets(s, (int64_t)h, &to, &io, &go);
   LM_TRY(lm_cu_memcpy(dev, &t, (const int64_t *)lm_cu_ptr(target) + to, sizeof t, 1));
   return lm_error(LM_ERR_ARG, "Target %lld is out of bounds.", (long long)t);
}

struct NllFwd {
   Samples s;
   const char *in;
   int in_dt, in_es;
   const int64_t *tg;
   const char *w; /* NULL: no weights */
   int w_dt;
   int64_t w_bs; /* weight stride in bytes */
   int64_t ignore;
   char *out; /* reduction none: contiguous, input dtype */
   double *vw;  /* else: (value, weight) per sample */
   LM_HD void operator()(int64_t k) const {
      int64_t to, io, go;
      sample_offsets(s, k, &to, &io, &go);
      const int64_t t = tg[to];
      double v = 0, wc = 0;
      if (t != ignore && (t < 0 || t >= s.C)) {
         /* only inside a graph capture, where check_targets cannot read its flag back: the
            sample's loss is NaN rather than a read outside the input */
         v = NAN;
         wc = 1.0;
      } else if (t != ignore) {
         wc = w ? lm_load_as_double(w + t * w_bs, w_dt) : 1.0;
         v = -wc * lm_load_as_double(in + (io + t * s.cst) * in_es, in_dt);
      }
      if (out) {
         lm_store_from_double(out + k * in_es, in_dt, v);
      } else {
         vw[2 * k] = v;
         vw[2 * k + 1] = wc;
      }
   }
};

enum { SUM_THREADS = 256 };

/* the sum of n (value, weight) pairs; out = mean ? sum / tw : sum, total_weight = tw */
struct NllFinish {
   int mean;
   char *out; /* NULL: not wanted */
   int out_dt;
   char *tw;  /* NULL: not wanted */
   int tw_dt;
   LM_HD void operator()(double sum, double w) const {
      if (out) lm_store_from_double(out, out_dt, mean ? sum / w : sum);
      if (tw) lm_store_from_double(tw, tw_dt, w);
   }
};

#ifndef LM_CUDA_EMU
__global__ void nll_sum_kernel(const double *vw, int64_t n, NllFinish f) {
   __shared__ double sv[SUM_THREADS], sw[SUM_THREADS];
   double a = 0, b = 0;
   for (int64_t i = threadIdx.x; i < n; i += SUM_THREADS) {
      a += vw[2 * i];
      b += vw[2 * i + 1];
   }
   sv[threadIdx.x] = a;
   sw[threadIdx.x] = b;
   __syncthreads();
   for (int h = SUM_THREADS / 2; h > 0; h >>= 1) {
      if ((int)threadIdx.x < h) {
         sv[threadIdx.x] += sv[threadIdx.x + h];
         sw[threadIdx.x] += sw[threadIdx.x + h];
      }
      __syncthreads();
   }
   if (threadIdx.x == 0) f(sv[0], sw[0]);
}
#endif

static lm_status nll_sum(int dev, const double *vw, int64_t n, const NllFinish &f) {
#ifdef LM_CUDA_EMU
   return lm_cu_host(dev, [vw, n, f]() {
      double a = 0, b = 0;
      for (int64_t i = 0; i < n; i++) {
         a += vw[2 * i];
         b += vw[2 * i + 1];
      }
      f(a, b);
      return LM_OK;
   });
#else
   nll_sum_kernel<<<1, SUM_THREADS, 0, lm_cu_stream(dev)>>>(vw, n, f);
   return lm_cu_err(cudaPeekAtLastError(), "nll_loss kernel launch");
#endif
}

/* LM_OP_NLL_LOSS: t = {input, target, weight, out, total_weight} */
static lm_status k_nll_loss(const lm_op *op) {
   const lm_nll_loss_params *p = (const lm_nll_loss_params *)op->params;
   const lm_tensor *input = op->t[0], *target = op->t[1], *weight = op->t[2];
   lm_tensor *out = op->t[3], *total_weight = op->t[4];
   const int dev = lm_cu_index(input);
   const Samples s = samples_of(input, target);
   LM_TRY(check_targets(dev, s, target, p->ignore_index));
   NllFwd b;
   b.s = s;
   b.in = lm_cu_ptr(input);
   b.in_dt = input->dtype;
   b.in_es = lm_dtype_size(input->dtype);
   b.tg = (const int64_t *)lm_cu_ptr(target);
   b.w = weight ? lm_cu_ptr(weight) : (const char *)0;
   b.w_dt = weight ? weight->dtype : LM_FLOAT32;
   b.w_bs = weight ? weight->strides[0] * lm_dtype_size(weight->dtype) : 0;
   b.ignore = p->ignore_index;
   b.out = NULL;
   b.vw = NULL;
   if (p->reduction == LM_REDUCTION_NONE) {
      b.out = lm_cu_ptr(out);
      LM_TRY(lm_cu_for(dev, s.count, b));
      if (total_weight) {
         /* the CPU stores the weights' sum here for every reduction */
         const size_t nb = (size_t)(s.count > 0 ? s.count : 1) * 2 * sizeof(double);
         double *vw = (double *)lm_cu_alloc(dev, nb);
         if (!vw) return LM_ERR_OOM;
         NllFwd c = b;
         c.out = NULL;
         c.vw = vw;
         const NllFinish f = {0, NULL, LM_FLOAT64, lm_cu_ptr(total_weight), total_weight->dtype};
         lm_status st = lm_cu_for(dev, s.count, c);
         if (st == LM_OK) st = nll_sum(dev, vw, s.count, f);
         lm_cu_free(dev, vw, nb);
         return st;
      }
      return LM_OK;
   }
   const size_t nb = (size_t)(s.count > 0 ? s.count : 1) * 2 * sizeof(double);
   double *vw = (double *)lm_cu_alloc(dev, nb);
   if (!vw) return LM_ERR_OOM;
   b.vw = vw;
   lm_status st = lm_cu_for(dev, s.count, b);
   NllFinish f = {p->reduction == LM_REDUCTION_MEAN, lm_cu_ptr(out), out->dtype,
                  total_weight ? lm_cu_ptr(total_weight) : (char *)0,
                  total_weight ? total_weight->dtype : LM_FLOAT32};
   if (st == LM_OK) st = nll_sum(dev, vw, s.count, f);
   lm_cu_free(dev, vw, nb);
   return st;
}

struct NllBwd {
   Samples s; /* ist / cst: grad_input's; gst: grad_out's (reduction none) */
   char *gi;
   int gi_dt, gi_es;
   const int64_t *tg;
   const char *w;
   int w_dt;
   int64_t w_bs;
   int64_t ignore;
   const char *go; /* grad_out */
   int go_dt, go_es, none, mean;
   const char *tw; /* total_weight (mean) */
   int tw_dt;
   LM_HD void operator()(int64_t k) const {
      int64_t to, io, gof;
      sample_offsets(s, k, &to, &io, &gof);
      const int64_t t = tg[to];
      if (t == ignore || t < 0 || t >= s.C) return; /* out of range: only inside a capture */
      const double wc = w ? lm_load_as_double(w + t * w_bs, w_dt) : 1.0;
      double g;
      if (none) {
         g = lm_load_as_double(go + gof * go_es, go_dt);
      } else {
         const double g0 = lm_load_as_double(go, go_dt);
         g = mean ? g0 / lm_load_as_double(tw, tw_dt) : g0;
      }
      lm_store_from_double(gi + (io + t * s.cst) * gi_es, gi_dt, -wc * g);
   }
};

/* LM_OP_NLL_LOSS_BACKWARD: t = {grad_out, input, target, weight, total_weight, grad_input} */
static lm_status k_nll_loss_backward(const lm_op *op) {
   const lm_nll_loss_params *p = (const lm_nll_loss_params *)op->params;
   const lm_tensor *grad_out = op->t[0], *input = op->t[1], *target = op->t[2];
   const lm_tensor *weight = op->t[3], *total_weight = op->t[4];
   lm_tensor *grad_input = op->t[5];
   const int dev = lm_cu_index(input);
   Samples s = samples_of(input, target);
   LM_TRY(check_targets(dev, s, target, p->ignore_index));
   if (grad_input->numel <= 0) return LM_OK;
   const int none = p->reduction == LM_REDUCTION_NONE;
   /* grad_input is contiguous: its strides stand for the input's */
   for (int j = 0; j < s.nd; j++) {
      s.ist[j] = input->ndim == 1 ? 0 : grad_input->strides[j == 0 ? 0 : j + 1];
      s.gst[j] = none ? grad_out->strides[j] : 0;
   }
   s.cst = grad_input->strides[input->ndim == 1 ? 0 : 1];
   LM_CU_TRY(cudaMemsetAsync(lm_cu_ptr(grad_input), 0,
                             (size_t)grad_input->numel * lm_dtype_size(grad_input->dtype),
                             lm_cu_stream(dev)),
             "cudaMemsetAsync");
   NllBwd b;
   b.s = s;
   b.gi = lm_cu_ptr(grad_input);
   b.gi_dt = grad_input->dtype;
   b.gi_es = lm_dtype_size(grad_input->dtype);
   b.tg = (const int64_t *)lm_cu_ptr(target);
   b.w = weight ? lm_cu_ptr(weight) : (const char *)0;
   b.w_dt = weight ? weight->dtype : LM_FLOAT32;
   b.w_bs = weight ? weight->strides[0] * lm_dtype_size(weight->dtype) : 0;
   b.ignore = p->ignore_index;
   b.go = lm_cu_ptr(grad_out);
   b.go_dt = grad_out->dtype;
   b.go_es = lm_dtype_size(grad_out->dtype);
   b.none = none;
   b.mean = p->reduction == LM_REDUCTION_MEAN;
   b.tw = b.mean ? lm_cu_ptr(total_weight) : (const char *)0;
   b.tw_dt = b.mean ? total_weight->dtype : LM_FLOAT32;
   return lm_cu_for(dev, s.count, b);
}

} // namespace

void lm_cuda_register_softmax(lm_kernel_fn *table) {
   table[LM_OP_SOFTMAX] = k_softmax;
   table[LM_OP_SOFTMAX_BACKWARD] = k_softmax_backward;
   table[LM_OP_NLL_LOSS] = k_nll_loss;
   table[LM_OP_NLL_LOSS_BACKWARD] = k_nll_loss_backward;
}
