/* conv.cu -- LM_OP_CONV2D and LM_OP_CONV2D_BACKWARD on cuda:k (parameters and t[] order:
 * src/ops/conv.h; the CPU kernels, the semantic reference: kernels/cpu/conv.c).
 *
 * cuDNN's legacy convolution API, one cudnnHandle_t per device (created on first use, on
 * lm_cu_stream(k)):
 *   forward          cudnnConvolutionForward (beta 0), then one elementwise pass of our own for
 *                    out = act(out + bias + residual) when any of them is asked for (the
 *                    epilogue of the CPU kernels: bias, then residual, then the activation
 *                    lm_conv_act: relu max(0, v) keeping NaN, silu, hardswish, ... as the
 *                    elementwise ops compute them)
 *   grad_x           cudnnConvolutionBackwardData (beta 0)
 *   grad_w           cudnnConvolutionBackwardFilter (beta 0; beta 1 on the later batch chunks)
 *   grad_b           a per-channel sum of grad_out of our own (two passes, deterministic:
 *                    partial sums per chunk of pixels, then the chunks in order, in double)
 * Every gradient is written, not accumulated, as the CPU kernels do (the front end hands fresh
 * tensors, or out= tensors to overwrite).
 * Channels-last 1x1 convolutions with no padding and one group (float32 / float16 / bfloat16;
 * any stride) skip cuDNN: they are GEMMs on cuBLAS ("1x1 convolutions as GEMMs on cuBLAS" below:
 * cuDNN's legacy API ran them 3x slower in bf16 than PyTorch's GEMMs on an H200), with the same
 * epilogue and grad_b.
 * Descriptors: x, y as 4-D tensors in CUDNN_TENSOR_NCHW or CUDNN_TENSOR_NHWC (channels_last),
 * the filter (O, C/G, kh, kw) in the same format, the convolution with padding, stride,
 * dilation, CUDNN_CROSS_CORRELATION, cudnnSetConvolutionGroupCount(G) (depthwise: G = C).
 * Compute type float for float32 / float16 / bfloat16, double for float64. Math type:
 * CUDNN_TENSOR_OP_MATH for the halves; for float32 CUDNN_FMA_MATH (no TF32) unless
 * lm_cu_option(LM_CU_OPT_TF32_CONV), then CUDNN_DEFAULT_MATH (TF32 tensor cores allowed, as
 * PyTorch's default allow_tf32); float64 CUDNN_DEFAULT_MATH. After the choice the descriptor
 * takes the candidate's own math type (float32 without TF32 stays CUDNN_FMA_MATH).
 * Algorithms: chosen once per (op, dtype, format, geometry, math, deterministic) and cached in a
 * small open-addressing table per device; lm_cu_option(LM_CU_OPT_BENCHMARK): cudnnFind*AlgorithmEx
 * (timed on the real tensors, with a workspace from lm_cu_alloc), else cudnnGet*Algorithm_v7's
 * heuristics, taking the first candidate that succeeded, is deterministic when
 * lm_cu_option(LM_CU_OPT_DETERMINISTIC) asks for it, and whose workspace can be allocated.
 * float16 / bfloat16: cuDNN rounds the convolution to 16 bits and the epilogue rounds again (the
 * CPU rounds once; PyTorch's cuDNN path also adds the bias to the rounded result).
 * Batches whose tensors exceed cuDNN's 2^31-1 elements per tensor are split along N. float64
 * channels-last goes through NCHW copies (cuDNN's double convolutions are NCHW ones).
 *
 * Where cuDNN declines a case (a NOT_SUPPORTED or BAD_PARAM status, or no algorithm; remembered
 * per key), the op runs on direct kernels of our own (one thread per result element, double sums;
 * slow but general), with a one-time note on stderr.
 *
 * The emulated build (LM_CUDA_EMU) has no cuDNN: the ops run on the CPU's kernels
 * (lm_cu_run_on_cpu), or with LUMEN_CUDA_EMU_CONV_DIRECT=1 on the direct kernels, the epilogue
 * and the bias gradient of this file (so those are checked by the suite here);
 * LUMEN_CUDA_EMU_GEMM=1 runs the 1x1 GEMM route over the emulated cuBLAS (linalg_cublas_emu.cuh);
 * spec/cuda/conv_algo_test.cpp checks the algorithm cache (conv_algo.cuh) on the host. */
#include "cuda.cuh"
#include "impl.h"
#include <stdlib.h>
#include "conv.h"
#include "ops/conv.h"
#include "elementwise_impl.cuh"
#include "conv_algo.cuh"
#include "conv_graph.cuh"
#include "cublas_handle.cuh"
#include <string.h>

/* ---- our own kernels: the epilogue, the bias gradient, zero fills ---- */
template <class T> struct dnn_io;
template <> struct dnn_io<float> {
   typedef float acc;
   static LM_HD float ld(const float *p, int64_t i, int) { return p[i]; }
   static LM_HD void st(float *p, int64_t i, float v, int) { p[i] = v; }
};
template <> struct dnn_io<double> {
   typedef double acc;
   static LM_HD double ld(const double *p, int64_t i, int) { return p[i]; }
   static LM_HD void st(double *p, int64_t i, double v, int) { p[i] = v; }
};
template <> struct dnn_io<uint16_t> { /* float16 / bfloat16 by dt, in float */
   typedef float acc;
   static LM_HD float ld(const uint16_t *p, int64_t i, int dt) {
      return dt == LM_BFLOAT16 ? lm_bf2f(p[i]) : lm_h2f(p[i]);
   }
   static LM_HD void st(uint16_t *p, int64_t i, float v, int dt) {
      p[i] = dt == LM_BFLOAT16 ? lm_f2bf(v) : lm_f2h(v);
   }
};

/* the epilogue's activation (lm_conv_act, src/conv.h): the elementwise ops' formulas
   (elementwise_impl.cuh's unary_op; relu6 as clamp's), as the CPU's kernels/cpu/act.h */
template <class A> LM_HD inline A conv_act(A v, int act) {
   switch (act) {
   case LM_ACT_RELU: return v < (A)0 ? (A)0 : v; /* NaN stays NaN, as torch.relu */
   case LM_ACT_RELU6: {
      const A t = v < (A)0 ? (A)0 : v;
      return (A)6 < t ? (A)6 : t;
   }
   case LM_ACT_SILU: return lmew::unary_op<LM_SILU, A>(v);
   case LM_ACT_HARDSWISH: return lmew::unary_op<LM_HARDSWISH, A>(v);
   case LM_ACT_HARDSIGMOID: return lmew::unary_op<LM_HARDSIGMOID, A>(v);
   case LM_ACT_SIGMOID: return lmew::unary_op<LM_SIGMOID, A>(v);
   case LM_ACT_GELU: return lmew::unary_op<LM_GELU, A>(v);
   case LM_ACT_GELU_TANH: return lmew::unary_op<LM_GELU_TANH, A>(v);
   default: return v;
   }
}

/* out = act(out + bias[c] + res); channel c of element i: i % O (NHWC) or i / HW % O (NCHW);
   bias of any stride (bstride elements) */
template <class T>
static lm_status dnn_epilogue_t(int k, int dt, T *out, const T *bias, int64_t bstride, const T *res,
                                int act, int64_t total, int64_t O, int64_t HW, int nhwc) {
   typedef typename dnn_io<T>::acc A;
   const int small = total < ((int64_t)1 << 31);
   return lm_cu_for(k, total, [=] LM_HD(int64_t i) {
      A v = dnn_io<T>::ld(out, i, dt);
      if (bias) {
         /* 32-bit division when the indices fit (64-bit division is slow on the GPU) */
         const int64_t c = small ? (int64_t)(nhwc ? (uint32_t)i % (uint32_t)O
                                                  : (uint32_t)i / (uint32_t)HW % (uint32_t)O)
                                 : nhwc ? i % O : i / HW % O;
         v += dnn_io<T>::ld(bias, c * bstride, dt);
      }
      if (res) v += dnn_io<T>::ld(res, i, dt);
      if (act) v = conv_act<A>(v, act);
      dnn_io<T>::st(out, i, v, dt);
   });
}

static lm_status dnn_epilogue(int k, const lm_tensor *bias, const lm_tensor *res, int act,
                              lm_tensor *out, const conv_geom *g, int nhwc) {
   if (!bias && !res && !act) return LM_OK;
   const int dt = out->dtype;
   const int64_t total = out->numel, HW = g->Ho * g->Wo;
   const int64_t bs = bias ? bias->strides[0] : 0;
   const char *bp = bias ? lm_cu_ptr(bias) : NULL, *rp = res ? lm_cu_ptr(res) : NULL;
   char *op = lm_cu_ptr(out);
   if (dt == LM_FLOAT32)
      return dnn_epilogue_t<float>(k, dt, (float *)op, (const float *)bp, bs, (const float *)rp,
                                   act, total, g->O, HW, nhwc);
   if (dt == LM_FLOAT64)
      return dnn_epilogue_t<double>(k, dt, (double *)op, (const double *)bp, bs,
                                    (const double *)rp, act, total, g->O, HW, nhwc);
   return dnn_epilogue_t<uint16_t>(k, dt, (uint16_t *)op, (const uint16_t *)bp, bs,
                                   (const uint16_t *)rp, act, total, g->O, HW, nhwc);
}

/* grad_b[o] = sum of grad_out over (n, ho, wo): partial sums in double per (chunk of pixels, o),
   then one thread per channel adds its chunks in order (the same result every run) */
template <class T>
static lm_status dnn_bias_grad_t(int k, int dt, const T *gy, T *gb, int64_t N, int64_t O, int64_t HW,
                                 int nhwc) {
   const int64_t P = N * HW; /* pixels */
   int64_t chunks = (65536 + O - 1) / O;
   if (chunks > 1024) chunks = 1024;
   if (chunks > P) chunks = P;
   if (chunks < 1) chunks = 1;
   const int64_t per = (P + chunks - 1) / chunks;
   const size_t bytes = (size_t)(chunks * O) * sizeof(double);
   double *part = (double *)lm_cu_alloc(k, bytes);
   if (!part) return LM_ERR_OOM;
   /* thread (chunk j, channel o); NHWC: neighbouring threads read neighbouring channels of one
      pixel (coalesced); NCHW: each thread walks its run of one plane */
   lm_status st = lm_cu_for(k, chunks * O, [=] LM_HD(int64_t t) {
      const int64_t o = t % O, j = t / O;
      const int64_t p0 = j * per, p1 = p0 + per < P ? p0 + per : P;
      double s = 0;
      for (int64_t q = p0; q < p1; q++) {
         const int64_t idx = nhwc ? q * O + o : (q / HW * O + o) * HW + q % HW;
         s += (double)dnn_io<T>::ld(gy, idx, dt);
      }
      part[t] = s;
   });
   if (st == LM_OK)
      st = lm_cu_for(k, O, [=] LM_HD(int64_t o) {
         double s = 0;
         for (int64_t j = 0; j < chunks; j++) s += part[j * O + o];
         dnn_io<T>::st(gb, o, (typename dnn_io<T>::acc)s, dt);
      });
   lm_cu_free(k, part, bytes);
   return st;
}

static lm_status dnn_bias_grad(int k, const lm_tensor *gy, lm_tensor *gb, const conv_geom *g,
                               int nhwc) {
   const int dt = gb->dtype;
   const int64_t HW = g->Ho * g->Wo;
   if (dt == LM_FLOAT32)
      return dnn_bias_grad_t<float>(k, dt, (const float *)lm_cu_ptr(gy), (float *)lm_cu_ptr(gb),
                                    g->N, g->O, HW, nhwc);
   if (dt == LM_FLOAT64)
      return dnn_bias_grad_t<double>(k, dt, (const double *)lm_cu_ptr(gy),
                                     (double *)lm_cu_ptr(gb), g->N, g->O, HW, nhwc);
   return dnn_bias_grad_t<uint16_t>(k, dt, (const uint16_t *)lm_cu_ptr(gy),
                                    (uint16_t *)lm_cu_ptr(gb), g->N, g->O, HW, nhwc);
}

static lm_status dnn_zero(int k, lm_tensor *t) {
   LM_CU_TRY(cudaMemsetAsync(lm_cu_ptr(t), 0, (size_t)t->numel * lm_dtype_size(t->dtype),
                             lm_cu_stream(k)),
             "conv2d: cudaMemsetAsync");
   return LM_OK;
}

/* ---- NHWC <-> NCHW copies (the float64 route below) ---- */
/* dst = src permuted: to_nchw: src is dense NHWC of (N, C, H, W), dst dense NCHW; else back */
template <class T>
static lm_status dnn_permute_t(int k, const T *src, T *dst, int64_t N, int64_t C, int64_t H,
                               int64_t W, int to_nchw) {
   return lm_cu_for(k, N * C * H * W, [=] LM_HD(int64_t i) {
      /* i runs over dst (coalesced writes) */
      if (to_nchw) {
         const int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, n = i / (W * H * C);
         dst[i] = src[((n * H + h) * W + w) * C + c];
      } else {
         const int64_t c = i % C, w = i / C % W, h = i / (C * W) % H, n = i / (C * W * H);
         dst[i] = src[((n * C + c) * H + h) * W + w];
      }
   });
}
[[maybe_unused]] static lm_status dnn_permute(int k, int es, const void *src, void *dst, int64_t N, int64_t C,
                             int64_t H, int64_t W, int to_nchw) {
   if (es == 8)
      return dnn_permute_t<uint64_t>(k, (const uint64_t *)src, (uint64_t *)dst, N, C, H, W,
                                     to_nchw);
   if (es == 4)
      return dnn_permute_t<uint32_t>(k, (const uint32_t *)src, (uint32_t *)dst, N, C, H, W,
                                     to_nchw);
   return dnn_permute_t<uint16_t>(k, (const uint16_t *)src, (uint16_t *)dst, N, C, H, W, to_nchw);
}

/* device scratch freed when the call ends (the allocator is stream-ordered, so the queued work
   that uses it is safe) */
struct dnn_scratch {
   int k;
   void *p[6];
   size_t n[6];
   int count = 0;
   explicit dnn_scratch(int dev) : k(dev) {}
   void *get(size_t bytes) {
      if (count == 6) return NULL;
      void *q = lm_cu_alloc(k, bytes ? bytes : 1);
      if (q) {
         p[count] = q;
         n[count++] = bytes ? bytes : 1;
      }
      return q;
   }
   ~dnn_scratch() {
      for (int i = 0; i < count; i++) lm_cu_free(k, p[i], n[i]);
   }
};

/* ---- direct convolutions of our own: the fallback where cuDNN has no algorithm for a case
   (CUDNN_STATUS_NOT_SUPPORTED, or no candidate), and what the emulated build runs with
   LUMEN_CUDA_EMU_CONV_DIRECT=1. One thread per result element, double sums, each result
   rounded once; slow, but every geometry, dtype and format. ---- */
typedef struct {
   int64_t N, C, H, W, O, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, Cg, Og;
   int nhwc;
} dnn_g;
static dnn_g dnn_g_of(const conv_geom *g, int nhwc) {
   dnn_g d = {g->N, g->C, g->H, g->W, g->O, g->Ho, g->Wo, g->kh, g->kw, g->sh, g->sw,
              g->ph, g->pw, g->dh, g->dw, g->Cg, g->Og, nhwc};
   return d;
}
static inline LM_HD int64_t dg_x(const dnn_g &g, int64_t n, int64_t c, int64_t h, int64_t w) {
   return g.nhwc ? ((n * g.H + h) * g.W + w) * g.C + c : ((n * g.C + c) * g.H + h) * g.W + w;
}
static inline LM_HD int64_t dg_y(const dnn_g &g, int64_t n, int64_t o, int64_t h, int64_t w) {
   return g.nhwc ? ((n * g.Ho + h) * g.Wo + w) * g.O + o : ((n * g.O + o) * g.Ho + h) * g.Wo + w;
}
static inline LM_HD int64_t dg_w(const dnn_g &g, int64_t o, int64_t c, int64_t i, int64_t j) {
   return g.nhwc ? ((o * g.kh + i) * g.kw + j) * g.Cg + c : ((o * g.Cg + c) * g.kh + i) * g.kw + j;
}
/* a dense physical index t of a (A, B, P, Q) tensor -> its logical (a, b, p, q) */
static inline LM_HD void dg_split(int64_t t, int nhwc, int64_t B, int64_t P, int64_t Q, int64_t *a,
                                  int64_t *b, int64_t *p, int64_t *q) {
   if (nhwc) {
      *b = t % B;
      *q = t / B % Q;
      *p = t / (B * Q) % P;
      *a = t / (B * Q * P);
   } else {
      *q = t % Q;
      *p = t / Q % P;
      *b = t / (Q * P) % B;
      *a = t / (Q * P * B);
   }
}

template <class T>
static lm_status dnn_direct_t(int k, int dt, const dnn_g g, const T *x, const T *w, const T *gy,
                              T *y, T *gx, T *gw) {
   typedef typename dnn_io<T>::acc A;
   lm_status st = LM_OK;
   if (y) /* forward: y[n, o, ho, wo] */
      st = lm_cu_for(k, g.N * g.O * g.Ho * g.Wo, [=] LM_HD(int64_t t) {
         int64_t n, o, ho, wo;
         dg_split(t, g.nhwc, g.O, g.Ho, g.Wo, &n, &o, &ho, &wo);
         const int64_t c0 = o / g.Og * g.Cg;
         double s = 0;
         for (int64_t i = 0; i < g.kh; i++) {
            const int64_t h = ho * g.sh - g.ph + i * g.dh;
            if (h < 0 || h >= g.H) continue;
            for (int64_t j = 0; j < g.kw; j++) {
               const int64_t ww = wo * g.sw - g.pw + j * g.dw;
               if (ww < 0 || ww >= g.W) continue;
               for (int64_t c = 0; c < g.Cg; c++)
                  s += (double)dnn_io<T>::ld(x, dg_x(g, n, c0 + c, h, ww), dt) *
                       (double)dnn_io<T>::ld(w, dg_w(g, o, c, i, j), dt);
            }
         }
         dnn_io<T>::st(y, t, (A)s, dt);
      });
   if (st == LM_OK && gx) /* grad_x[n, c, h, w] */
      st = lm_cu_for(k, g.N * g.C * g.H * g.W, [=] LM_HD(int64_t t) {
         int64_t n, c, h, ww;
         dg_split(t, g.nhwc, g.C, g.H, g.W, &n, &c, &h, &ww);
         const int64_t o0 = c / g.Cg * g.Og, ci = c % g.Cg;
         double s = 0;
         for (int64_t i = 0; i < g.kh; i++) {
            const int64_t hh = h + g.ph - i * g.dh;
            if (hh < 0 || hh % g.sh != 0 || hh / g.sh >= g.Ho) continue;
            for (int64_t j = 0; j < g.kw; j++) {
               const int64_t w2 = ww + g.pw - j * g.dw;
               if (w2 < 0 || w2 % g.sw != 0 || w2 / g.sw >= g.Wo) continue;
               for (int64_t o = o0; o < o0 + g.Og; o++)
                  s += (double)dnn_io<T>::ld(gy, dg_y(g, n, o, hh / g.sh, w2 / g.sw), dt) *
                       (double)dnn_io<T>::ld(w, dg_w(g, o, ci, i, j), dt);
            }
         }
         dnn_io<T>::st(gx, t, (A)s, dt);
      });
   if (st == LM_OK && gw) /* grad_w[o, c, i, j] */
      st = lm_cu_for(k, g.O * g.Cg * g.kh * g.kw, [=] LM_HD(int64_t t) {
         int64_t o, c, i, j;
         dg_split(t, g.nhwc, g.Cg, g.kh, g.kw, &o, &c, &i, &j);
         const int64_t cx = o / g.Og * g.Cg + c;
         double s = 0;
         for (int64_t n = 0; n < g.N; n++)
            for (int64_t ho = 0; ho < g.Ho; ho++) {
               const int64_t h = ho * g.sh - g.ph + i * g.dh;
               if (h < 0 || h >= g.H) continue;
               for (int64_t wo = 0; wo < g.Wo; wo++) {
                  const int64_t ww = wo * g.sw - g.pw + j * g.dw;
                  if (ww < 0 || ww >= g.W) continue;
                  s += (double)dnn_io<T>::ld(x, dg_x(g, n, cx, h, ww), dt) *
                       (double)dnn_io<T>::ld(gy, dg_y(g, n, o, ho, wo), dt);
               }
            }
         dnn_io<T>::st(gw, t, (A)s, dt);
      });
   return st;
}

/* the direct kernels on dense device tensors (NULL: not wanted) */
static lm_status dnn_direct(int k, const conv_geom *cg, int nhwc, int dt, const lm_tensor *x,
                            const lm_tensor *w, const lm_tensor *gy, lm_tensor *y, lm_tensor *gx,
                            lm_tensor *gw) {
   lm_impl_ran_name("lumen_direct"); /* LUMEN_VERBOSE (src/impl.h) */
   const dnn_g g = dnn_g_of(cg, nhwc);
#define DNN_P(t, T) ((t) ? (T *)lm_cu_ptr(t) : (T *)NULL)
   if (dt == LM_FLOAT32)
      return dnn_direct_t<float>(k, dt, g, DNN_P(x, const float), DNN_P(w, const float),
                                 DNN_P(gy, const float), DNN_P(y, float), DNN_P(gx, float),
                                 DNN_P(gw, float));
   if (dt == LM_FLOAT64)
      return dnn_direct_t<double>(k, dt, g, DNN_P(x, const double), DNN_P(w, const double),
                                  DNN_P(gy, const double), DNN_P(y, double), DNN_P(gx, double),
                                  DNN_P(gw, double));
   return dnn_direct_t<uint16_t>(k, dt, g, DNN_P(x, const uint16_t), DNN_P(w, const uint16_t),
                                 DNN_P(gy, const uint16_t), DNN_P(y, uint16_t),
                                 DNN_P(gx, uint16_t), DNN_P(gw, uint16_t));
#undef DNN_P
}

/* ---- 1x1 convolutions as GEMMs on cuBLAS ----
 * Why: through cuDNN's legacy API, lumen's bf16 1x1 convolutions ran 3x slower than PyTorch's on
 * an H200 (conv1x1_256_64_56 bf16, batch 64, NHWC: forward 0.117 ms against 0.039, forward +
 * backward 0.402 against 0.183; conv1x1_1024_2048_s2_14 bf16 forward 0.085 against 0.030), and a
 * ResNet50 training step spent 35 ms in conv2d + conv2d_backward against PyTorch's ~17 ms.
 * PyTorch's profile shows cuBLASLt GEMM kernels ("nvjet") for those layers: cuDNN's runtime-fusion
 * engines, which the legacy API does not reach. A channels-last 1x1 convolution with stride 1, no
 * padding, dilation 1 and one group is exactly a GEMM over the M = N*H*W pixels (x, gy, out, gx
 * row-major [M, C] / [M, O]; the weight (O, C, 1, 1), dense in either format, row-major [O, C]):
 *    forward   out[M,O] = x[M,C] w^T[C,O]
 *    grad_x    gx[M,C]  = gy[M,O] w[O,C]
 *    grad_w    gw[O,C]  = gy^T[O,M] x[M,C]
 * A row-major [R,S] array (row stride S) is the column-major S x R matrix with leading dimension
 * S, its transpose; so each product is one column-major call on the transposes:
 *    out^T (O x M, ldc O) = op_T(w stored C x O, lda C) * (x stored C x M, ldb C)     T N  m O n M k C
 *    gx^T  (C x M, ldc C) = (w stored C x O, lda C) * (gy stored O x M, ldb O)        N N  m C n M k O
 *    gw^T  (C x O, ldc C) = (x stored C x M, lda C) * op_T(gy stored O x M, ldb O)    N T  m C n O k M
 * Sums in float32 (CUBLAS_COMPUTE_32F; for float32 CUBLAS_COMPUTE_32F_FAST_TF32 under
 * lm_cu_option(LM_CU_OPT_TF32_CONV), the switch cuDNN's float32 convolutions follow), 16-bit
 * split-K reductions disallowed, beta 0 (each result written once, as the CPU does). Then the
 * epilogue (bias, residual, activation) and the grad_b sum above, as on the cuDNN route.
 * 64-bit sizes (cublasGemmEx_64): no batch chunks. cuda:k's one cuBLAS handle is linalg.cu's
 * (cublas_handle.cuh), with its workspace, on lm_cu_stream(k). float64 and NCHW stay on cuDNN.
 * Strided 1x1 convolutions (ResNet's downsample layers, stride 2) take the same GEMMs over a
 * gathered copy of the pixels they read (below). Where cuBLAS fails (a status other than
 * success; not out of memory), the op goes to cuDNN as before, with a one-time note.
 * The emulated build runs this code over linalg_cublas_emu.cuh (which checks the leading
 * dimensions as cuBLAS does) with LUMEN_CUDA_EMU_GEMM=1, the switch of linalg.cu's matmul. */

/* t (A, B, P, Q) dense channels-last: strides (B*P*Q, 1, Q*B, B) wherever a size exceeds 1 */
static int gemm_dense_nhwc(const lm_tensor *t) {
   if (!t) return 1;
   if (t->ndim != 4) return 0;
   const int64_t *z = t->sizes, *s = t->strides;
   const int64_t want[4] = {z[1] * z[2] * z[3], 1, z[3] * z[1], z[1]};
   for (int d = 0; d < 4; d++)
      if (z[d] > 1 && s[d] != want[d]) return 0;
   return 1;
}

/* is this convolution one GEMM (above)? The tensors passed (NULL: absent) must be dense NHWC
   (the front end's promise; checked, since the GEMM reads them as plain matrices) */
/* LUMEN_CUDA_CONV_GEMM=0 keeps every convolution on cuDNN (the 1x1 GEMM route landed without a GPU
   run: the switch lets one GPU run measure both, and step around the route if it misbehaves) */
static int gemm_route_on(void) {
   static int v = -1;
   if (v < 0) {
      const char *e = getenv("LUMEN_CUDA_CONV_GEMM");
      v = !(e && *e == '0');
   }
   return v;
}

static int gemm_1x1(const conv_geom *g, int dt, int nhwc, const lm_tensor *a, const lm_tensor *b,
                    const lm_tensor *c, const lm_tensor *d, const lm_tensor *e) {
   if (!gemm_route_on() || !nhwc || g->kh != 1 || g->kw != 1 || g->sh < 1 || g->sw < 1 || g->ph != 0 ||
       g->pw != 0 || g->dh != 1 || g->dw != 1 || g->G != 1 || g->H < 1 || g->W < 1 ||
       g->Ho != (g->H - 1) / g->sh + 1 || g->Wo != (g->W - 1) / g->sw + 1)
      return 0;
   if (dt != LM_FLOAT32 && dt != LM_FLOAT16 && dt != LM_BFLOAT16) return 0;
   return gemm_dense_nhwc(a) && gemm_dense_nhwc(b) && gemm_dense_nhwc(c) && gemm_dense_nhwc(d) &&
          gemm_dense_nhwc(e);
}

static lm_status gemm_err(cublasStatus_t s, const char *what) {
   if (s == CUBLAS_STATUS_SUCCESS) return LM_OK;
   return lm_error(LM_ERR_DEVICE, "conv2d: %s: %s (cuBLAS status %d)", what,
                   cublasGetStatusString(s), (int)s);
}

/* C (m x n, ldc) = op(A) op(B), column-major, on cuda:k's cuBLAS handle */
static lm_status gemm_call(int k, int dt, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                           int64_t n, int64_t kk, const void *A, int64_t lda, const void *B,
                           int64_t ldb, void *C, int64_t ldc) {
   cudaDataType ty;
   cublasComputeType_t comp = CUBLAS_COMPUTE_32F;
   if (dt == LM_FLOAT32) {
      ty = CUDA_R_32F;
      if (lm_cu_option(LM_CU_OPT_TF32_CONV)) comp = CUBLAS_COMPUTE_32F_FAST_TF32;
   } else if (dt == LM_FLOAT16) {
      ty = CUDA_R_16F;
   } else if (dt == LM_BFLOAT16) {
      ty = CUDA_R_16BF;
   } else {
      return lm_error(LM_ERR_INTERNAL, "conv2d: no 1x1 GEMM for %s", lm_dtype_name(dt));
   }
   cublasHandle_t h;
   LM_TRY(lm_cu_cublas_handle(k, &h));
   /* the handle is shared with matmul: set the math mode every call, as linalg.cu does (float32
      sums for the halves: no 16-bit split-K reductions) */
   lm_status st = gemm_err(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                           "cublasSetMathMode");
   if (st != LM_OK) return st;
   const float one = 1.0f, zero = 0.0f; /* host pointer mode (the handle's) */
   return gemm_err(cublasGemmEx_64(h, ta, tb, m, n, kk, &one, A, ty, lda, B, ty, ldb, &zero, C, ty,
                                   ldc, comp, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
}

/* ---- strided 1x1 (sh or sw > 1: ResNet's downsample layers, stride 2) ----
 * The pixels such a convolution reads, x[n, ho*sh, wo*sw, :], are not one GEMM operand; they are
 * gathered into a dense [N*Ho*Wo, C] copy first (a quarter of x at stride 2: a few microseconds
 * of copying against the GEMM), and grad_x is the GEMM into such a dense buffer, scattered back
 * with zeros at the pixels the convolution skips. The copies move a pixel's channels in units of
 * 16 bytes where the row (C elements) and both addresses allow it (ResNet's channel counts do),
 * else 8, 4 or 2, one unit per thread, channels fastest (coalesced), so the index arithmetic is
 * paid once per unit; 32-bit index math when the indices fit (64-bit division is slow on the
 * GPU). C below is the row length in units. */
struct alignas(16) gemm_v16 {
   uint32_t v[4];
};
template <class T, class I>
static lm_status gemm_gather_ti(int k, const T *x, T *d, I C, I H, I W, I Ho, I Wo, I sh, I sw,
                                int64_t total) {
   return lm_cu_for(k, total, [=] LM_HD(int64_t t) {
      const I i = (I)t, c = i % C, q = i / C, wo = q % Wo, r = q / Wo, ho = r % Ho, n = r / Ho;
      d[t] = x[((int64_t)n * H + (int64_t)ho * sh) * W * C + ((int64_t)wo * sw) * C + c];
   });
}
template <class T, class I>
static lm_status gemm_scatter_ti(int k, const T *s, T *gx, I C, I H, I W, I Ho, I Wo, I sh, I sw,
                                 int64_t total) {
   return lm_cu_for(k, total, [=] LM_HD(int64_t t) {
      const I i = (I)t, c = i % C, q = i / C, w = q % W, r = q / W, h = r % H, n = r / H;
      gx[t] = h % sh == 0 && w % sw == 0
                 ? s[((int64_t)n * Ho + h / sh) * Wo * C + (int64_t)(w / sw) * C + c]
                 : T{}; /* zero bits: +0 in every float format */
   });
}
/* dir 0: d = gather(x), N*Ho*Wo*Cu units; dir 1: x = scatter(d), N*H*W*Cu units (Cu units of T
   per pixel) */
template <class T>
static lm_status gemm_restride_t(int k, const conv_geom *g, int64_t Cu, T *x, T *d, int dir) {
   const int64_t total = dir == 0 ? g->N * g->Ho * g->Wo * Cu : g->N * g->H * g->W * Cu;
   const int64_t lim = (int64_t)1 << 31;
   if (total < lim && g->H < lim && g->W < lim && g->sh < lim && g->sw < lim) {
      typedef uint32_t I; /* every index below total, and every size and stride, fits */
      if (dir == 0)
         return gemm_gather_ti<T, I>(k, x, d, (I)Cu, (I)g->H, (I)g->W, (I)g->Ho, (I)g->Wo,
                                     (I)g->sh, (I)g->sw, total);
      return gemm_scatter_ti<T, I>(k, d, x, (I)Cu, (I)g->H, (I)g->W, (I)g->Ho, (I)g->Wo,
                                   (I)g->sh, (I)g->sw, total);
   }
   if (dir == 0)
      return gemm_gather_ti<T, int64_t>(k, x, d, Cu, g->H, g->W, g->Ho, g->Wo, g->sh, g->sw,
                                        total);
   return gemm_scatter_ti<T, int64_t>(k, d, x, Cu, g->H, g->W, g->Ho, g->Wo, g->sh, g->sw,
                                      total);
}
static lm_status gemm_restride(int k, const conv_geom *g, int dt, char *x, char *d, int dir) {
   const uint64_t row = (uint64_t)g->C * lm_dtype_size(dt); /* bytes per pixel */
   const uint64_t a = (uint64_t)(uintptr_t)x | (uint64_t)(uintptr_t)d | row;
   if (a % 16 == 0)
      return gemm_restride_t<gemm_v16>(k, g, (int64_t)(row / 16), (gemm_v16 *)x, (gemm_v16 *)d,
                                       dir);
   if (a % 8 == 0)
      return gemm_restride_t<uint64_t>(k, g, (int64_t)(row / 8), (uint64_t *)x, (uint64_t *)d, dir);
   if (a % 4 == 0)
      return gemm_restride_t<uint32_t>(k, g, (int64_t)(row / 4), (uint32_t *)x, (uint32_t *)d, dir);
   return gemm_restride_t<uint16_t>(k, g, (int64_t)(row / 2), (uint16_t *)x, (uint16_t *)d, dir);
}
static int gemm_strided(const conv_geom *g) { return g->sh != 1 || g->sw != 1; }

/* forward: out = x w^T (no epilogue); x gathered first when strided */
static lm_status gemm_forward(int k, const conv_geom *g, int dt, const lm_tensor *x,
                              const lm_tensor *w, lm_tensor *out) {
   lm_impl_ran_name("cublas_gemm_1x1"); /* LUMEN_VERBOSE (src/impl.h) */
   const int64_t M = g->N * g->Ho * g->Wo;
   const char *xp = lm_cu_ptr(x);
   dnn_scratch s(k); /* freed on return: stream-ordered, so after the queued GEMM */
   if (gemm_strided(g)) {
      char *xs = (char *)s.get((size_t)(M * g->C) * lm_dtype_size(dt));
      if (!xs) return LM_ERR_OOM;
      LM_TRY(gemm_restride(k, g, dt, (char *)xp, xs, 0));
      xp = xs;
   }
   return gemm_call(k, dt, CUBLAS_OP_T, CUBLAS_OP_N, g->O, M, g->C, lm_cu_ptr(w), g->C, xp, g->C,
                    lm_cu_ptr(out), g->O);
}

/* backward: gx = gy w, gw = gy^T x (either may be NULL; M, C, O >= 1); strided: gx through a
   dense buffer scattered back, x gathered */
static lm_status gemm_backward(int k, const conv_geom *g, int dt, const lm_tensor *x,
                               const lm_tensor *w, const lm_tensor *gy, lm_tensor *gx,
                               lm_tensor *gw) {
   lm_impl_ran_name("cublas_gemm_1x1"); /* LUMEN_VERBOSE (src/impl.h) */
   const int64_t M = g->N * g->Ho * g->Wo;
   const size_t mc_bytes = (size_t)(M * g->C) * lm_dtype_size(dt);
   const int strided = gemm_strided(g);
   dnn_scratch s(k);
   if (gx) {
      char *gxp = lm_cu_ptr(gx);
      if (strided && !(gxp = (char *)s.get(mc_bytes))) return LM_ERR_OOM;
      LM_TRY(gemm_call(k, dt, CUBLAS_OP_N, CUBLAS_OP_N, g->C, M, g->O, lm_cu_ptr(w), g->C,
                       lm_cu_ptr(gy), g->O, gxp, g->C));
      if (strided) LM_TRY(gemm_restride(k, g, dt, lm_cu_ptr(gx), gxp, 1));
   }
   if (gw) {
      const char *xp = lm_cu_ptr(x);
      if (strided) {
         char *xs = (char *)s.get(mc_bytes);
         if (!xs) return LM_ERR_OOM;
         LM_TRY(gemm_restride(k, g, dt, (char *)xp, xs, 0));
         xp = xs;
      }
      LM_TRY(gemm_call(k, dt, CUBLAS_OP_N, CUBLAS_OP_T, g->C, g->O, M, xp, g->C, lm_cu_ptr(gy),
                       g->O, lm_cu_ptr(gw), g->C));
   }
   return LM_OK;
}


#ifndef LM_CUDA_EMU

#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

/* ---- errors ---- */
/* set when cuDNN turned a case down (a NOT_SUPPORTED or BAD_PARAM status, or no algorithm):
   the op then runs on the direct kernels above instead of failing */
static thread_local int dnn_declined = 0;

static lm_status dnn_err(cudnnStatus_t s, const char *what) {
   if (s == CUDNN_STATUS_SUCCESS) return LM_OK;
   /* cuDNN 9's status codes come in families: 2000s bad parameter, 3000s not supported */
   if ((int)s / 1000 == 2 || (int)s / 1000 == 3) dnn_declined = 1;
   return lm_error(LM_ERR_DEVICE, "conv2d: %s: %s (cuDNN status %d)", what, cudnnGetErrorString(s),
                   (int)s);
}
#define DNN_TRY(call, what)                                                                       \
   do {                                                                                          \
      cudnnStatus_t dnn_s_ = (call);                                                             \
      if (dnn_s_ != CUDNN_STATUS_SUCCESS) return dnn_err(dnn_s_, (what));                        \
   } while (0)

/* after cuDNN declined: say so once (the direct kernels are slow), forget the error */
static void dnn_note_fallback(void) {
   static int said = 0;
   if (!said) {
      said = 1;
      fprintf(stderr, "lumen: cuDNN declined a convolution (%s); running lumen's direct CUDA "
              "kernel for it (slow; reported once)\n", lm_last_error());
   }
   lm_clear_error();
   dnn_declined = 0;
}

/* after cuBLAS failed a 1x1 convolution: say so once, forget the error, go to cuDNN */
static void gemm_note_fallback(void) {
   static int said = 0;
   if (!said) {
      said = 1;
      fprintf(stderr, "lumen: cuBLAS failed a 1x1 convolution (%s); running it on cuDNN "
              "(reported once)\n", lm_last_error());
   }
   lm_clear_error();
}

/* ---- one handle and one algorithm cache per device ---- */
static cudnnHandle_t dnn_handle[LM_NUM_CUDA];
static conv_algo_cache dnn_cache[LM_NUM_CUDA];
static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;

static lm_status dnn_get_handle(int k, cudnnHandle_t *out) {
   pthread_mutex_lock(&dnn_lock);
   lm_status st = LM_OK;
   if (!dnn_handle[k]) {
      cudnnHandle_t h = NULL;
      cudnnStatus_t s = cudnnCreate(&h);
      if (s == CUDNN_STATUS_SUCCESS)
         dnn_handle[k] = h;
      else
         st = dnn_err(s, "cudnnCreate");
   }
   *out = dnn_handle[k];
   pthread_mutex_unlock(&dnn_lock);
   if (st != LM_OK) return st;
   DNN_TRY(cudnnSetStream(*out, lm_cu_stream(k)), "cudnnSetStream");
   return LM_OK;
}

/* ---- descriptors, destroyed with the call ---- */
struct dnn_descs {
   cudnnTensorDescriptor_t x = NULL, y = NULL;
   cudnnFilterDescriptor_t w = NULL;
   cudnnConvolutionDescriptor_t conv = NULL;
   ~dnn_descs() {
      if (x) cudnnDestroyTensorDescriptor(x);
      if (y) cudnnDestroyTensorDescriptor(y);
      if (w) cudnnDestroyFilterDescriptor(w);
      if (conv) cudnnDestroyConvolutionDescriptor(conv);
   }
};

static cudnnDataType_t dnn_dtype(int dt) {
   switch (dt) {
   case LM_FLOAT64: return CUDNN_DATA_DOUBLE;
   case LM_FLOAT16: return CUDNN_DATA_HALF;
   case LM_BFLOAT16: return CUDNN_DATA_BFLOAT16;
   default: return CUDNN_DATA_FLOAT;
   }
}

/* the math type asked for (conv_algo.cuh's key carries it) */
static cudnnMathType_t dnn_math(int dt) {
   if (dt == LM_FLOAT16 || dt == LM_BFLOAT16) return CUDNN_TENSOR_OP_MATH;
   if (dt == LM_FLOAT32)
      /* CUDNN_DEFAULT_MATH lets float32 run on TF32 tensor cores from Ampere on (what PyTorch
         sets with allow_tf32); CUDNN_FMA_MATH keeps it in float32 FMAs */
      return lm_cu_option(LM_CU_OPT_TF32_CONV) ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
   return CUDNN_DEFAULT_MATH;
}

/* descriptors for a chunk of n images */
static lm_status dnn_make_descs(const conv_geom *g, int64_t n, int dt, int nhwc, dnn_descs *d) {
   const cudnnDataType_t t = dnn_dtype(dt);
   const cudnnTensorFormat_t f = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
   DNN_TRY(cudnnCreateTensorDescriptor(&d->x), "cudnnCreateTensorDescriptor");
   DNN_TRY(cudnnCreateTensorDescriptor(&d->y), "cudnnCreateTensorDescriptor");
   DNN_TRY(cudnnCreateFilterDescriptor(&d->w), "cudnnCreateFilterDescriptor");
   DNN_TRY(cudnnCreateConvolutionDescriptor(&d->conv), "cudnnCreateConvolutionDescriptor");
   DNN_TRY(cudnnSetTensor4dDescriptor(d->x, f, t, (int)n, (int)g->C, (int)g->H, (int)g->W),
           "cudnnSetTensor4dDescriptor (input)");
   DNN_TRY(cudnnSetTensor4dDescriptor(d->y, f, t, (int)n, (int)g->O, (int)g->Ho, (int)g->Wo),
           "cudnnSetTensor4dDescriptor (output)");
   DNN_TRY(cudnnSetFilter4dDescriptor(d->w, t, f, (int)g->O, (int)g->Cg, (int)g->kh, (int)g->kw),
           "cudnnSetFilter4dDescriptor");
   DNN_TRY(cudnnSetConvolution2dDescriptor(d->conv, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw,
                                           (int)g->dh, (int)g->dw, CUDNN_CROSS_CORRELATION,
                                           dt == LM_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT),
           "cudnnSetConvolution2dDescriptor");
   DNN_TRY(cudnnSetConvolutionGroupCount(d->conv, (int)g->G), "cudnnSetConvolutionGroupCount");
   DNN_TRY(cudnnSetConvolutionMathType(d->conv, dnn_math(dt)), "cudnnSetConvolutionMathType");
   /* cuDNN computes the output size itself: it must be the front end's */
   int on = 0, oc = 0, oh = 0, ow = 0;
   DNN_TRY(cudnnGetConvolution2dForwardOutputDim(d->conv, d->x, d->w, &on, &oc, &oh, &ow),
           "cudnnGetConvolution2dForwardOutputDim");
   if (on != (int)n || oc != (int)g->O || oh != (int)g->Ho || ow != (int)g->Wo)
      return lm_error(LM_ERR_INTERNAL, "conv2d: cuDNN's output size %dx%dx%dx%d is not lumen's "
                      "%lldx%lldx%lldx%lld", on, oc, oh, ow, (long long)n, (long long)g->O,
                      (long long)g->Ho, (long long)g->Wo);
   return LM_OK;
}

/* LUMEN_VERBOSE's name of a cuDNN algorithm (lm_impl_ran_name, src/impl.h) */
static void dnn_note_algo(int op, int algo) {
   static const char *const fwd[] = {"implicit_gemm", "implicit_precomp_gemm", "gemm", "direct",
                                     "fft", "fft_tiling", "winograd", "winograd_nonfused"};
   static const char *const bwdd[] = {"algo_0", "algo_1", "fft", "fft_tiling", "winograd",
                                      "winograd_nonfused"};
   static const char *const bwdf[] = {"algo_0", "algo_1", "fft", "algo_3", "winograd",
                                      "winograd_nonfused", "fft_tiling"};
   if (!lm_verbose()) return;
   const char *const *tab = op == CONV_ALGO_FWD ? fwd : op == CONV_ALGO_BWD_DATA ? bwdd : bwdf;
   const int n = op == CONV_ALGO_FWD ? 8 : op == CONV_ALGO_BWD_DATA ? 6 : 7;
   char name[64];
   snprintf(name, sizeof name, "cudnn_%s_%s",
            op == CONV_ALGO_FWD ? "fwd" : op == CONV_ALGO_BWD_DATA ? "bwd_data" : "bwd_filter",
            algo >= 0 && algo < n ? tab[algo] : "unknown");
   lm_impl_ran_name(name);
}

/* ---- the algorithm choice ---- */
/* a perf result of any of the three kinds, reduced to what the choice needs */
typedef struct {
   int algo;
   cudnnStatus_t status;
   size_t memory;
   cudnnDeterminism_t det;
   cudnnMathType_t math;
} dnn_perf;

enum { DNN_MAX_ALGOS = 16 };
/* the workspace the benchmark may use at most, and what a heuristic pick may ask for (beyond
   that the next candidate is taken) */
static const size_t DNN_BENCH_WS = (size_t)1 << 30;

static lm_status dnn_candidates(cudnnHandle_t h, int op, const dnn_descs *d, int bench,
                                const void *x, const void *w, void *y, void *ws, size_t ws_bytes,
                                dnn_perf *out, int *count) {
   int n = 0;
   *count = 0;
   if (op == CONV_ALGO_FWD) {
      cudnnConvolutionFwdAlgoPerf_t r[DNN_MAX_ALGOS];
      if (bench)
         DNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(h, d->x, x, d->w, w, d->conv, d->y, y,
                                                        DNN_MAX_ALGOS, &n, r, ws, ws_bytes),
                 "cudnnFindConvolutionForwardAlgorithmEx");
      else
         DNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, d->x, d->w, d->conv, d->y,
                                                        DNN_MAX_ALGOS, &n, r),
                 "cudnnGetConvolutionForwardAlgorithm_v7");
      for (int i = 0; i < n; i++)
         out[i] = {(int)r[i].algo, r[i].status, r[i].memory, r[i].determinism, r[i].mathType};
   } else if (op == CONV_ALGO_BWD_DATA) {
      /* x is grad_x here, y grad_out */
      cudnnConvolutionBwdDataAlgoPerf_t r[DNN_MAX_ALGOS];
      if (bench)
         DNN_TRY(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d->w, w, d->y, y, d->conv, d->x,
                                                             (void *)x, DNN_MAX_ALGOS, &n, r, ws,
                                                             ws_bytes),
                 "cudnnFindConvolutionBackwardDataAlgorithmEx");
      else
         DNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d->w, d->y, d->conv, d->x,
                                                             DNN_MAX_ALGOS, &n, r),
                 "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      for (int i = 0; i < n; i++)
         out[i] = {(int)r[i].algo, r[i].status, r[i].memory, r[i].determinism, r[i].mathType};
   } else {
      /* w is grad_w here, y grad_out */
      cudnnConvolutionBwdFilterAlgoPerf_t r[DNN_MAX_ALGOS];
      if (bench)
         DNN_TRY(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d->x, x, d->y, y, d->conv, d->w,
                                                               (void *)w, DNN_MAX_ALGOS, &n, r,
                                                               ws, ws_bytes),
                 "cudnnFindConvolutionBackwardFilterAlgorithmEx");
      else
         DNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d->x, d->y, d->conv, d->w,
                                                               DNN_MAX_ALGOS, &n, r),
                 "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      for (int i = 0; i < n; i++)
         out[i] = {(int)r[i].algo, r[i].status, r[i].memory, r[i].determinism, r[i].mathType};
   }
   *count = n;
   return LM_OK;
}

/* the workspace bytes of algo (cuDNN's own figure for these descriptors) */
static lm_status dnn_ws_size(cudnnHandle_t h, int op, const dnn_descs *d, int algo, size_t *bytes) {
   *bytes = 0;
   if (op == CONV_ALGO_FWD)
      DNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y,
                                                      (cudnnConvolutionFwdAlgo_t)algo, bytes),
              "cudnnGetConvolutionForwardWorkspaceSize");
   else if (op == CONV_ALGO_BWD_DATA)
      DNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d->w, d->y, d->conv, d->x,
                                                           (cudnnConvolutionBwdDataAlgo_t)algo,
                                                           bytes),
              "cudnnGetConvolutionBackwardDataWorkspaceSize");
   else
      DNN_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d->x, d->y, d->conv, d->w,
                                                             (cudnnConvolutionBwdFilterAlgo_t)algo,
                                                             bytes),
              "cudnnGetConvolutionBackwardFilterWorkspaceSize");
   return LM_OK;
}

static const char *dnn_op_name(int op) {
   return op == CONV_ALGO_FWD ? "forward" : op == CONV_ALGO_BWD_DATA ? "backward data"
                                                                   : "backward filter";
}

/* the algorithm for op on these descriptors (cached), its math type set on d->conv, and a
   workspace for it (*ws, *ws_bytes; the caller frees it with lm_cu_free) */
static lm_status dnn_choose(int k, cudnnHandle_t h, int op, const conv_geom *g, int64_t n, int dt,
                            int nhwc, const dnn_descs *d, const void *x, const void *w, void *y,
                            int may_bench, conv_algo_entry *choice, void **ws, size_t *ws_bytes) {
   const int det = lm_cu_option(LM_CU_OPT_DETERMINISTIC);
   const int bench = may_bench && lm_cu_option(LM_CU_OPT_BENCHMARK);
   const cudnnMathType_t want = dnn_math(dt);
   conv_algo_key key;
   conv_algo_key_make(&key, op, dt, nhwc, g, n, (int)want, det, bench);
   *ws = NULL;
   *ws_bytes = 0;
   pthread_mutex_lock(&dnn_lock);
   const int hit = conv_algo_lookup(&dnn_cache[k], &key, choice);
   pthread_mutex_unlock(&dnn_lock);
   if (hit && choice->algo < 0) { /* cuDNN had no algorithm for this key before */
      dnn_declined = 1;
      return lm_error(LM_ERR_DEVICE, "conv2d: cuDNN has no %s algorithm for this case (cached)",
                      dnn_op_name(op));
   }
   if (hit) {
      DNN_TRY(cudnnSetConvolutionMathType(d->conv, (cudnnMathType_t)choice->math),
              "cudnnSetConvolutionMathType");
      if (choice->ws_bytes) {
         *ws = lm_cu_alloc(k, choice->ws_bytes);
         if (!*ws) return LM_ERR_OOM;
         *ws_bytes = choice->ws_bytes;
      }
      return LM_OK;
   }

   dnn_perf perf[DNN_MAX_ALGOS];
   int count = 0;
   /* inside a graph capture the benchmark cannot run (it times kernels and waits for them): a
      shape the warm-up did not meet takes the heuristic's pick, not remembered as benchmarked */
   const int bench_now = bench && !lm_cu_capturing(k);
   if (bench_now) {
      /* the benchmark's workspace: as much as DNN_BENCH_WS, halving on failure */
      void *bws = NULL;
      size_t bbytes = DNN_BENCH_WS;
      while (bbytes >= ((size_t)1 << 20) && !(bws = lm_cu_alloc(k, bbytes))) bbytes /= 2;
      if (!bws) bbytes = 0;
      lm_status st = dnn_candidates(h, op, d, 1, x, w, y, bws, bbytes, perf, &count);
      if (bws) lm_cu_free(k, bws, bbytes);
      if (st != LM_OK) return st;
   } else {
      LM_TRY(dnn_candidates(h, op, d, 0, x, w, y, NULL, 0, perf, &count));
   }
   /* the first usable candidate (cuDNN lists them best first) */
   int eligible = 0; /* candidates turned down only for their workspace (out of memory now) */
   for (int i = 0; i < count; i++) {
      const dnn_perf &p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (det && p.det != CUDNN_DETERMINISTIC) continue;
      eligible++;
      /* the candidate's math type, except float32 without TF32, which stays in FMA math
         (as PyTorch does: CUDNN_DEFAULT_MATH would allow TF32 on this GPU) */
      const cudnnMathType_t math = dt == LM_FLOAT32 && want == CUDNN_FMA_MATH ? CUDNN_FMA_MATH
                                                                              : p.math;
      if (cudnnSetConvolutionMathType(d->conv, math) != CUDNN_STATUS_SUCCESS) continue;
      size_t bytes = 0;
      if (dnn_ws_size(h, op, d, p.algo, &bytes) != LM_OK) continue; /* not for these descs */
      void *p_ws = NULL;
      if (bytes) {
         p_ws = lm_cu_alloc(k, bytes);
         if (!p_ws) continue; /* too big now: the next one */
      }
      choice->algo = p.algo;
      choice->math = (int)math;
      choice->ws_bytes = bytes;
      if (bench_now == bench) {
         pthread_mutex_lock(&dnn_lock);
         conv_algo_insert(&dnn_cache[k], &key, choice);
         pthread_mutex_unlock(&dnn_lock);
      }
      *ws = p_ws;
      *ws_bytes = bytes;
      lm_clear_error();
      return LM_OK;
   }
   /* none at all: remembered, so the next call with this key goes to the direct kernels at
      once (not when memory was short: that may pass) */
   if (!eligible) {
      choice->algo = -1;
      choice->math = 0;
      choice->ws_bytes = 0;
      pthread_mutex_lock(&dnn_lock);
      conv_algo_insert(&dnn_cache[k], &key, choice);
      pthread_mutex_unlock(&dnn_lock);
   }
   dnn_declined = 1;
   return lm_error(LM_ERR_DEVICE,
                   "conv2d: cuDNN has no %s%s algorithm for %s input %lldx%lldx%lldx%lld (%s), "
                   "weight %lldx%lldx%lldx%lld, stride %lldx%lld, padding %lldx%lld, dilation "
                   "%lldx%lld, groups %lld (%d candidates)",
                   det ? "deterministic " : "", dnn_op_name(op), lm_dtype_name(dt), (long long)n,
                   (long long)g->C, (long long)g->H, (long long)g->W, nhwc ? "NHWC" : "NCHW",
                   (long long)g->O, (long long)g->Cg, (long long)g->kh, (long long)g->kw,
                   (long long)g->sh, (long long)g->sw, (long long)g->ph, (long long)g->pw,
                   (long long)g->dh, (long long)g->dw, (long long)g->G, count);
}

/* ---- batch chunks: cuDNN's tensors hold at most INT_MAX elements ---- */
static lm_status dnn_chunk(const conv_geom *g, int64_t *chunk) {
   const int64_t per_img = g->C * g->H * g->W > g->O * g->Ho * g->Wo ? g->C * g->H * g->W
                                                                      : g->O * g->Ho * g->Wo;
   const int64_t wn = g->O * g->Cg * g->kh * g->kw;
   if (per_img > INT_MAX || wn > INT_MAX || g->C > INT_MAX || g->O > INT_MAX || g->H > INT_MAX ||
       g->W > INT_MAX || g->kh > INT_MAX || g->kw > INT_MAX || g->sh > INT_MAX ||
       g->sw > INT_MAX || g->ph > INT_MAX || g->pw > INT_MAX || g->dh > INT_MAX ||
       g->dw > INT_MAX)
      return lm_error(LM_ERR_SHAPE, "conv2d: one image or the weight has more than %d elements "
                      "(or a size beyond it), more than cuDNN takes", INT_MAX);
   int64_t c = per_img > 0 ? INT_MAX / per_img : g->N;
   if (c > g->N) c = g->N;
   if (c < 1) c = 1;
   *chunk = c;
   return LM_OK;
}

static const float one_f = 1.0f, zero_f = 0.0f;
static const double one_d = 1.0, zero_d = 0.0;

/* ---- the convolutions on raw device pointers, dense in the format ---- */
static lm_status dnn_forward(int k, const conv_geom *g, int dt, int nhwc, const char *xp,
                             const char *wp, char *yp) {
   int64_t chunk;
   LM_TRY(dnn_chunk(g, &chunk));
   cudnnHandle_t h;
   LM_TRY(dnn_get_handle(k, &h));
   const int es = (int)lm_dtype_size(dt);
   const void *one = dt == LM_FLOAT64 ? (const void *)&one_d : (const void *)&one_f;
   const void *zero = dt == LM_FLOAT64 ? (const void *)&zero_d : (const void *)&zero_f;
   if (chunk >= g->N) { /* the graph API first (conv_graph.cu), the legacy calls below else */
      lm_status gst;
      const char *impl;
      if (lm_conv_graph_run(k, h, CONV_GRAPH_FWD, g, dt, nhwc, (void *)xp, (void *)wp, yp, &gst,
                            &impl)) {
         if (gst == LM_OK) lm_impl_ran_name(impl);
         return gst;
      }
   }
   for (int64_t n0 = 0; n0 < g->N; n0 += chunk) {
      const int64_t n = g->N - n0 < chunk ? g->N - n0 : chunk;
      dnn_descs d;
      LM_TRY(dnn_make_descs(g, n, dt, nhwc, &d));
      const char *xc = xp + n0 * g->C * g->H * g->W * es;
      char *yc = yp + n0 * g->O * g->Ho * g->Wo * es;
      conv_algo_entry a;
      void *ws = NULL;
      size_t wsb = 0;
      LM_TRY(dnn_choose(k, h, CONV_ALGO_FWD, g, n, dt, nhwc, &d, xc, wp, yc, 1, &a, &ws, &wsb));
      dnn_note_algo(CONV_ALGO_FWD, a.algo);
      cudnnStatus_t s = cudnnConvolutionForward(h, one, d.x, xc, d.w, wp, d.conv,
                                                (cudnnConvolutionFwdAlgo_t)a.algo, ws, wsb, zero,
                                                d.y, yc);
      if (ws) lm_cu_free(k, ws, wsb);
      DNN_TRY(s, "cudnnConvolutionForward");
   }
   return LM_OK;
}

/* grad_x (gxp) and / or grad_w (gwp); x is read for grad_w, w for grad_x */
static lm_status dnn_backward(int k, const conv_geom *g, int dt, int nhwc, const char *xp,
                              const char *wp, const char *gyp, char *gxp, char *gwp) {
   int64_t chunk;
   LM_TRY(dnn_chunk(g, &chunk));
   cudnnHandle_t h;
   LM_TRY(dnn_get_handle(k, &h));
   const int es = (int)lm_dtype_size(dt);
   const void *one = dt == LM_FLOAT64 ? (const void *)&one_d : (const void *)&one_f;
   const void *zero = dt == LM_FLOAT64 ? (const void *)&zero_d : (const void *)&zero_f;
   if (chunk >= g->N) { /* the graph API first (conv_graph.cu), each gradient on its own */
      lm_status gst;
      const char *impl;
      if (gxp && lm_conv_graph_run(k, h, CONV_GRAPH_BWD_DATA, g, dt, nhwc, gxp, (void *)wp,
                                   (void *)gyp, &gst, &impl)) {
         LM_TRY(gst);
         lm_impl_ran_name(impl);
         gxp = NULL;
      }
      if (gwp && lm_conv_graph_run(k, h, CONV_GRAPH_BWD_FILTER, g, dt, nhwc, (void *)xp, gwp,
                                   (void *)gyp, &gst, &impl)) {
         LM_TRY(gst);
         lm_impl_ran_name(impl);
         gwp = NULL;
      }
      if (!gxp && !gwp) return LM_OK;
   }
   for (int64_t n0 = 0; n0 < g->N; n0 += chunk) {
      const int64_t n = g->N - n0 < chunk ? g->N - n0 : chunk;
      dnn_descs d;
      LM_TRY(dnn_make_descs(g, n, dt, nhwc, &d));
      const char *gyc = gyp + n0 * g->O * g->Ho * g->Wo * es;
      if (gxp) {
         char *gxc = gxp + n0 * g->C * g->H * g->W * es;
         conv_algo_entry a;
         void *ws = NULL;
         size_t wsb = 0;
         LM_TRY(dnn_choose(k, h, CONV_ALGO_BWD_DATA, g, n, dt, nhwc, &d, gxc, wp, (void *)gyc, 1,
                           &a, &ws, &wsb));
         dnn_note_algo(CONV_ALGO_BWD_DATA, a.algo);
         cudnnStatus_t s = cudnnConvolutionBackwardData(h, one, d.w, wp, d.y, gyc, d.conv,
                                                        (cudnnConvolutionBwdDataAlgo_t)a.algo, ws,
                                                        wsb, zero, d.x, gxc);
         if (ws) lm_cu_free(k, ws, wsb);
         DNN_TRY(s, "cudnnConvolutionBackwardData");
      }
      if (gwp) {
         const char *xc = xp + n0 * g->C * g->H * g->W * es;
         conv_algo_entry a;
         void *ws = NULL;
         size_t wsb = 0;
         /* the benchmark writes grad_w while timing: on a later chunk that would lose the sums
            so far, so those chunks take the heuristics' choice (the key differs by n only for
            the last, shorter chunk, and by the benchmark flag) */
         LM_TRY(dnn_choose(k, h, CONV_ALGO_BWD_FILTER, g, n, dt, nhwc, &d, xc, gwp, (void *)gyc,
                           n0 == 0, &a, &ws, &wsb));
         dnn_note_algo(CONV_ALGO_BWD_FILTER, a.algo);
         cudnnStatus_t s = cudnnConvolutionBackwardFilter(
            h, one, d.x, xc, d.y, gyc, d.conv, (cudnnConvolutionBwdFilterAlgo_t)a.algo, ws, wsb,
            n0 > 0 ? one : zero, d.w, gwp);
         if (ws) lm_cu_free(k, ws, wsb);
         DNN_TRY(s, "cudnnConvolutionBackwardFilter");
      }
   }
   return LM_OK;
}

/* float64 NHWC goes through NCHW copies: cuDNN's double convolutions are NCHW ones (PyTorch
   never asks cuDNN for a channels-last double convolution either) */
static int dnn_via_nchw(int dt, int nhwc) { return nhwc && dt == LM_FLOAT64; }

/* ---- the kernels ---- */

static lm_status dnn_conv_forward(int k, const conv_geom *g, int dt, int nhwc, const lm_tensor *x,
                                  const lm_tensor *w, lm_tensor *out);
static lm_status dnn_conv_backward(int k, const conv_geom *g, int dt, int nhwc, const lm_tensor *x,
                                   const lm_tensor *w, const lm_tensor *gy, lm_tensor *gx,
                                   lm_tensor *gw);

/* LM_OP_CONV2D: t = {x, w, bias, residual, out} */
static lm_status k_conv2d(const lm_op *op) {
   const lm_conv2d_params *p = (const lm_conv2d_params *)op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *x = op->t[0], *w = op->t[1], *bias = op->t[2], *res = op->t[3];
   lm_tensor *out = op->t[4];
   const int k = lm_cu_index(out), dt = out->dtype, nhwc = p->channels_last;
   if (x->dtype != dt || w->dtype != dt)
      return lm_error(LM_ERR_DTYPE, "conv2d: input %s, weight %s, output %s",
                      lm_dtype_name(x->dtype), lm_dtype_name(w->dtype), lm_dtype_name(dt));
   if (g->Cg == 0 || g->N == 0) { /* an empty sum (no input channels) */
      LM_TRY(dnn_zero(k, out));
      return dnn_epilogue(k, bias, res, p->act, out, g, nhwc);
   }
   if (gemm_1x1(g, dt, nhwc, x, w, res, out, NULL)) { /* a GEMM on cuBLAS (above) */
      const lm_status gs = gemm_forward(k, g, dt, x, w, out);
      if (gs == LM_OK) return dnn_epilogue(k, bias, res, p->act, out, g, nhwc);
      if (gs == LM_ERR_OOM) return gs;
      gemm_note_fallback();
   }
   dnn_declined = 0;
   lm_status st = dnn_conv_forward(k, g, dt, nhwc, x, w, out);
   if (st != LM_OK && dnn_declined) {
      dnn_note_fallback();
      st = dnn_direct(k, g, nhwc, dt, x, w, NULL, out, NULL, NULL);
   }
   LM_TRY(st);
   return dnn_epilogue(k, bias, res, p->act, out, g, nhwc);
}

/* the forward on cuDNN (float64 NHWC through NCHW copies) */
static lm_status dnn_conv_forward(int k, const conv_geom *g, int dt, int nhwc, const lm_tensor *x,
                                  const lm_tensor *w, lm_tensor *out) {
   if (dnn_via_nchw(dt, nhwc)) {
      const int es = (int)lm_dtype_size(dt);
      const int64_t xn = g->N * g->C * g->H * g->W, wn = g->O * g->Cg * g->kh * g->kw;
      const int64_t yn = g->N * g->O * g->Ho * g->Wo;
      dnn_scratch s(k);
      char *xt = (char *)s.get((size_t)(xn * es)), *wt = (char *)s.get((size_t)(wn * es));
      char *yt = (char *)s.get((size_t)(yn * es));
      if (!xt || !wt || !yt) return LM_ERR_OOM;
      LM_TRY(dnn_permute(k, es, lm_cu_ptr(x), xt, g->N, g->C, g->H, g->W, 1));
      LM_TRY(dnn_permute(k, es, lm_cu_ptr(w), wt, g->O, g->Cg, g->kh, g->kw, 1));
      LM_TRY(dnn_forward(k, g, dt, 0, xt, wt, yt));
      LM_TRY(dnn_permute(k, es, yt, lm_cu_ptr(out), g->N, g->O, g->Ho, g->Wo, 0));
   } else {
      LM_TRY(dnn_forward(k, g, dt, nhwc, lm_cu_ptr(x), lm_cu_ptr(w), lm_cu_ptr(out)));
   }
   return LM_OK;
}

/* LM_OP_CONV2D_BACKWARD: t = {x, w, grad_out, grad_x, grad_w, grad_b} */
static lm_status k_conv2d_backward(const lm_op *op) {
   const lm_conv2d_params *p = (const lm_conv2d_params *)op->params;
   const conv_geom *g = &p->g;
   const lm_tensor *x = op->t[0], *w = op->t[1], *gy = op->t[2];
   lm_tensor *gx = op->t[3], *gw = op->t[4], *gb = op->t[5];
   const int k = lm_cu_index(gy), dt = gy->dtype, nhwc = p->channels_last;
   if ((gx && (!w || gx->dtype != dt)) || (gw && (!x || gw->dtype != dt)) ||
       (gb && gb->dtype != dt))
      return lm_error(LM_ERR_INTERNAL, "conv2d_backward: missing operands or mixed dtypes");
   if (gb) LM_TRY(dnn_bias_grad(k, gy, gb, g, nhwc));
   if (!gx && !gw) return LM_OK;
   if (g->Cg == 0 || g->N == 0) { /* nothing to convolve: grad_w is an empty sum */
      if (gw) LM_TRY(dnn_zero(k, gw));
      if (gx) LM_TRY(dnn_zero(k, gx));
      return LM_OK;
   }
   if (gemm_1x1(g, dt, nhwc, gx ? w : NULL, gw ? x : NULL, gy, gx, gw)) { /* cuBLAS (above) */
      const lm_status gs = gemm_backward(k, g, dt, x, w, gy, gx, gw);
      if (gs == LM_OK || gs == LM_ERR_OOM) return gs;
      gemm_note_fallback();
   }
   dnn_declined = 0;
   lm_status st = dnn_conv_backward(k, g, dt, nhwc, x, w, gy, gx, gw);
   if (st != LM_OK && dnn_declined) {
      dnn_note_fallback();
      st = dnn_direct(k, g, nhwc, dt, x, w, gy, NULL, gx, gw);
   }
   return st;
}

/* grad_x, grad_w on cuDNN (float64 NHWC through NCHW copies) */
static lm_status dnn_conv_backward(int k, const conv_geom *g, int dt, int nhwc, const lm_tensor *x,
                                   const lm_tensor *w, const lm_tensor *gy, lm_tensor *gx,
                                   lm_tensor *gw) {
   if (!dnn_via_nchw(dt, nhwc))
      return dnn_backward(k, g, dt, nhwc, gw ? lm_cu_ptr(x) : NULL, gx ? lm_cu_ptr(w) : NULL,
                          lm_cu_ptr(gy), gx ? lm_cu_ptr(gx) : NULL, gw ? lm_cu_ptr(gw) : NULL);
   const int es = (int)lm_dtype_size(dt);
   const int64_t xn = g->N * g->C * g->H * g->W, wn = g->O * g->Cg * g->kh * g->kw;
   const int64_t yn = g->N * g->O * g->Ho * g->Wo;
   dnn_scratch s(k);
   char *yt = (char *)s.get((size_t)(yn * es));
   char *xt = gw ? (char *)s.get((size_t)(xn * es)) : NULL, *gwt = gw ? (char *)s.get((size_t)(wn * es)) : NULL;
   char *wt = gx ? (char *)s.get((size_t)(wn * es)) : NULL, *gxt = gx ? (char *)s.get((size_t)(xn * es)) : NULL;
   if (!yt || (gw && (!xt || !gwt)) || (gx && (!wt || !gxt))) return LM_ERR_OOM;
   LM_TRY(dnn_permute(k, es, lm_cu_ptr(gy), yt, g->N, g->O, g->Ho, g->Wo, 1));
   if (gw) LM_TRY(dnn_permute(k, es, lm_cu_ptr(x), xt, g->N, g->C, g->H, g->W, 1));
   if (gx) LM_TRY(dnn_permute(k, es, lm_cu_ptr(w), wt, g->O, g->Cg, g->kh, g->kw, 1));
   LM_TRY(dnn_backward(k, g, dt, 0, xt, wt, yt, gxt, gwt));
   if (gx) LM_TRY(dnn_permute(k, es, gxt, lm_cu_ptr(gx), g->N, g->C, g->H, g->W, 0));
   if (gw) LM_TRY(dnn_permute(k, es, gwt, lm_cu_ptr(gw), g->O, g->Cg, g->kh, g->kw, 0));
   return LM_OK;
}

/* cuda:k's cuDNN handle made now (graph.cu, before a capture: cudnnCreate allocates) */
lm_status lm_cu_dnn_ready(int k) {
   cudnnHandle_t h;
   return dnn_get_handle(k, &h);
}

#else /* LM_CUDA_EMU: no cuDNN; the CPU's kernels, or our direct ones when asked */

lm_status lm_cu_dnn_ready(int k) {
   (void)k;
   return LM_OK;
}

static int emu_direct(void) {
   const char *e = getenv("LUMEN_CUDA_EMU_CONV_DIRECT");
   return e && *e == '1';
}
/* LUMEN_CUDA_EMU_GEMM=1 (linalg.cu's switch too): the 1x1 GEMMs over the emulated cuBLAS */
static int emu_gemm(void) {
   const char *e = getenv("LUMEN_CUDA_EMU_GEMM");
   return e && *e == '1';
}

static lm_status k_conv2d(const lm_op *op) {
   const lm_conv2d_params *p = (const lm_conv2d_params *)op->params;
   lm_tensor *out = op->t[4];
   const int k = lm_cu_index(out), dt = out->dtype;
   const conv_geom *g = &p->g;
   if (emu_gemm() && g->Cg > 0 && g->N > 0 &&
       gemm_1x1(g, dt, p->channels_last, op->t[0], op->t[1], op->t[3], out, NULL)) {
      if (op->t[0]->dtype != dt || op->t[1]->dtype != dt)
         return lm_error(LM_ERR_DTYPE, "conv2d: input %s, weight %s, output %s",
                         lm_dtype_name(op->t[0]->dtype), lm_dtype_name(op->t[1]->dtype),
                         lm_dtype_name(dt));
      LM_TRY(gemm_forward(k, g, dt, op->t[0], op->t[1], out));
      return dnn_epilogue(k, op->t[2], op->t[3], p->act, out, g, p->channels_last);
   }
   if (!emu_direct()) return lm_cu_run_on_cpu_p(op, sizeof(lm_conv2d_params));
   if (p->g.Cg == 0) LM_TRY(dnn_zero(k, out));
   else LM_TRY(dnn_direct(k, &p->g, p->channels_last, out->dtype, op->t[0], op->t[1], NULL, out,
                          NULL, NULL));
   return dnn_epilogue(k, op->t[2], op->t[3], p->act, out, &p->g, p->channels_last);
}

static lm_status k_conv2d_backward(const lm_op *op) {
   const lm_conv2d_params *p = (const lm_conv2d_params *)op->params;
   const lm_tensor *gy = op->t[2];
   const int k = lm_cu_index(gy);
   lm_tensor *gx = op->t[3], *gw = op->t[4], *gb = op->t[5];
   const conv_geom *g = &p->g;
   /* the real build's order: grad_b, the empty cases, then the GEMMs */
   if (emu_gemm() && gemm_1x1(g, gy->dtype, p->channels_last, gx ? op->t[1] : NULL,
                              gw ? op->t[0] : NULL, gy, gx, gw)) {
      const int dt = gy->dtype;
      if ((gx && (!op->t[1] || gx->dtype != dt || op->t[1]->dtype != dt)) ||
          (gw && (!op->t[0] || gw->dtype != dt || op->t[0]->dtype != dt)) ||
          (gb && gb->dtype != dt))
         return lm_error(LM_ERR_INTERNAL, "conv2d_backward: missing operands or mixed dtypes");
      if (gb) LM_TRY(dnn_bias_grad(k, gy, gb, g, p->channels_last));
      if (!gx && !gw) return LM_OK;
      if (g->Cg == 0 || g->N == 0) {
         if (gw) LM_TRY(dnn_zero(k, gw));
         if (gx) LM_TRY(dnn_zero(k, gx));
         return LM_OK;
      }
      return gemm_backward(k, g, dt, op->t[0], op->t[1], gy, gx, gw);
   }
   if (!emu_direct()) return lm_cu_run_on_cpu_p(op, sizeof(lm_conv2d_params));
   if (op->t[5]) LM_TRY(dnn_bias_grad(k, gy, op->t[5], &p->g, p->channels_last));
   return dnn_direct(k, &p->g, p->channels_last, gy->dtype, op->t[0], op->t[1], gy, NULL,
                     op->t[3], op->t[4]);
}

#endif /* LM_CUDA_EMU */

void lm_cuda_register_conv(lm_kernel_fn *table) {
   table[LM_OP_CONV2D] = k_conv2d;
   table[LM_OP_CONV2D_BACKWARD] = k_conv2d_backward;
}
