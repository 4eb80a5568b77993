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
 * float32 for float32 / half data with double sums: differences are rounding only). */
#include "cuda.cuh"
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
   const int64_t chunks = training && M > 0 ? bn_chunks(l) : 0;
   const int64_t per = chunks ? (M + chunks - 1) / chunks : 0;
   bn_scratch s(k);
   const int64_t pn = bn_part_doubles(chunks, C);
   s.bytes = (size_t)(pn + 3 * C) * sizeof(double);
   s.p = (double *)lm_cu_alloc(k, s.bytes);
   if (!s.p) return LM_ERR_OOM;
   double *part = s.p, *cf = s.p + pn; /* cf: A, mean, b per channel */
   const char *xp = lm_cu_ptr(x);
   lm_status st = LM_OK;

   if (chunks) { /* 1. partial sums of (x - K), (x - K)^2 */
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
      cf[c] = invstd * bn_get(wv, c, 1.0);
      cf[C + c] = mean;
      cf[2 * C + c] = bn_get(bv, c, 0.0);
   });
   if (st != LM_OK) return st;
   /* 3. y = relu((x - mean) A + b [+ residual]) */
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
   const int64_t chunks = need_sums && M > 0 ? bn_chunks(l) : 0;
   const int64_t per = chunks ? (M + chunks - 1) / chunks : 0;
   bn_scratch s(k);
   const int64_t pn = bn_part_doubles(chunks, C);
   s.bytes = (size_t)(pn + 3 * C) * sizeof(double);
   s.p = (double *)lm_cu_alloc(k, s.bytes);
   if (!s.p) return LM_ERR_OOM;
   double *part = s.p, *cf = s.p + pn; /* cf: A, B, D per channel */
   const char *xp = lm_cu_ptr(x), *gyp = lm_cu_ptr(gy), *mkp = mk ? lm_cu_ptr(mk) : NULL;
   lm_status st = LM_OK;

   if (chunks) { /* 1. sums of g and g (x - mean), g masked by the relu output */
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
      bn_put(gwv, c, s2 * invstd);
      bn_put(gbv, c, s1);
      const double a = invstd * bn_get(wv, c, 1.0);
      cf[c] = a;
      cf[C + c] = training && M > 0 ? -a * (s2 / (double)M) * invstd * invstd : 0.0;
      cf[2 * C + c] = training && M > 0 ? -a * s1 / (double)M : 0.0;
   });
   if (st != LM_OK) return st;
   /* 3. grad_x = A g + B (x - mean) + D */
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
