/*
 * loss.c -- negative log-likelihood loss, forward and backward (cross_entropy is log_softmax +
 * nll_loss, composed in Lua).
 *
 * The kernels of LM_OP_NLL_LOSS / LM_OP_NLL_LOSS_BACKWARD (front end: src/ops/loss.c, which
 * checks shapes and dtypes and allocates the results; t[] order in src/ops/loss.h). input (N, C),
 * (C) or (N, C, d1, ...) of log-probabilities, any strides; target int64 of the input's shape
 * without the class dim. The samples are walked with an odometer over the target shape, so no
 * copy is made. Sums are double. A target value out of range is an error of the kernel.
 */
#include "cpu.h"
#include "nn.h"
#include "ops/loss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double load_scalar(const lm_tensor *t) {
   return lm_load_as_double(lm_tensor_data(t), t->dtype);
}

static void store_scalar(lm_tensor *t, double v) {
   lm_store_from_double(lm_tensor_data(t), t->dtype, v);
}

/* the sample space: target's shape; input offsets skip the class dim */
typedef struct {
   int nd;                 /* sample dims */
   int64_t sizes[LM_MAX_DIMS], ist[LM_MAX_DIMS], tst[LM_MAX_DIMS];
   int64_t count;          /* number of samples */
   int64_t C, cst;         /* classes and the input's class stride */
   const char *in;         /* input data (element 0) */
   const int64_t *tg;      /* target data */
   int dt;                 /* input dtype */
   int64_t esz;
   double *w;              /* class weights (C) or NULL */
} nll_t;

/* the sample walk of input (or of grad_input, which has its shape) and target; the front end
   checked every shape and dtype. On success s->w (class weights, NULL without) is the caller's
   to free. */
static lm_status nll_setup(nll_t *s, const lm_tensor *input, const lm_tensor *target,
                           const lm_tensor *weight) {
   s->dt = input->dtype;
   s->esz = lm_dtype_size(input->dtype);
   s->nd = target->ndim;
   s->count = 1;
   for (int j = 0; j < s->nd; j++) {
      int d = j == 0 ? 0 : j + 1; /* input dim of sample dim j */
      s->sizes[j] = target->sizes[j];
      s->tst[j] = target->strides[j];
      s->ist[j] = input->ndim == 1 ? 0 : input->strides[d];
      s->count *= target->sizes[j];
   }
   const int cdim = input->ndim == 1 ? 0 : 1;
   s->C = input->sizes[cdim];
   s->cst = input->strides[cdim];
   s->in = lm_tensor_data(input);
   s->tg = lm_tensor_data(target);
   s->w = NULL;
   if (weight) {
      s->w = malloc(sizeof(double) * (size_t)(s->C + 1));
      if (!s->w) return lm_error(LM_ERR_OOM, "out of memory (nll_loss weights)");
      const char *wp = lm_tensor_data(weight);
      const int64_t ws = weight->strides[0] * lm_dtype_size(weight->dtype);
      for (int64_t c = 0; c < s->C; c++) s->w[c] = lm_load_as_double(wp + c * ws, weight->dtype);
   }
   return LM_OK;
}

/* walk the samples: body sees k (linear index), ioff (input elements), t (the target value) */
#define NLL_WALK(s, body)                                                                       \
   do {                                                                                         \
      int64_t idx_[LM_MAX_DIMS] = {0}, ioff = 0, toff_ = 0;                                     \
      for (int64_t k = 0; k < (s)->count; k++) {                                                \
         const int64_t t = (s)->tg[toff_];                                                      \
         body;                                                                                  \
         for (int j_ = (s)->nd - 1; j_ >= 0; j_--) {                                            \
            idx_[j_]++;                                                                         \
            ioff += (s)->ist[j_];                                                               \
            toff_ += (s)->tst[j_];                                                              \
            if (idx_[j_] < (s)->sizes[j_]) break;                                               \
            ioff -= (s)->ist[j_] * (s)->sizes[j_];                                              \
            toff_ -= (s)->tst[j_] * (s)->sizes[j_];                                             \
            idx_[j_] = 0;                                                                       \
         }                                                                                      \
      }                                                                                         \
   } while (0)

/* every counted target in [0, C) */
static lm_status nll_check_targets(const nll_t *s, int64_t ignore_index) {
   lm_status st = LM_OK;
   NLL_WALK(s, {
      if (t != ignore_index && (t < 0 || t >= s->C) && st == LM_OK)
         st = lm_error(LM_ERR_ARG, "Target %lld is out of bounds.", (long long)t);
   });
   return st;
}

/* LM_OP_NLL_LOSS: t = {input, target, weight, out, total_weight} (src/ops/loss.h) */
static lm_status k_nll_loss(const lm_op *op) {
   const lm_nll_loss_params *p = op->params;
   const lm_tensor *input = op->t[0], *target = op->t[1], *weight = op->t[2];
   lm_tensor *out = op->t[3], *total_weight = op->t[4];
   const int reduction = p->reduction;
   const int64_t ignore_index = p->ignore_index;
   nll_t s;
   LM_TRY(nll_setup(&s, input, target, weight));
   lm_status st = nll_check_targets(&s, ignore_index);
   double *vals = NULL;
   if (st == LM_OK && reduction == LM_REDUCTION_NONE) {
      vals = malloc(sizeof(double) * (size_t)(s.count + 1));
      if (!vals) st = lm_error(LM_ERR_OOM, "out of memory (nll_loss)");
   }
   if (st == LM_OK) {
      double sum = 0, tw = 0;
      NLL_WALK(&s, {
         double v = 0;
         if (t != ignore_index) {
            const double wc = s.w ? s.w[t] : 1.0;
            v = -wc * lm_load_as_double(s.in + (ioff + t * s.cst) * s.esz, s.dt);
            tw += wc;
            sum += v;
         }
         if (vals) vals[k] = v;
      });
      if (reduction == LM_REDUCTION_NONE) {
         /* out is contiguous in target order */
         char *op = lm_tensor_data(out);
         for (int64_t k = 0; k < s.count; k++) lm_store_from_double(op + k * s.esz, s.dt, vals[k]);
      } else {
         store_scalar(out, reduction == LM_REDUCTION_MEAN ? sum / tw : sum);
      }
      if (total_weight) store_scalar(total_weight, tw);
   }
   free(vals);
   free(s.w);
   return st;
}

/* LM_OP_NLL_LOSS_BACKWARD: t = {grad_out, input, target, weight, total_weight, grad_input} */
static lm_status k_nll_loss_backward(const lm_op *op) {
   const lm_nll_loss_params *p = op->params;
   const lm_tensor *grad_out = op->t[0], *input = op->t[1], *target = op->t[2];
   const lm_tensor *weight = op->t[3], *total_weight = op->t[4];
   lm_tensor *grad_input = op->t[5];
   const int reduction = p->reduction;
   const int64_t ignore_index = p->ignore_index;
   nll_t s;
   LM_TRY(nll_setup(&s, input, target, weight));
   lm_status st = LM_OK;
   double tw = 1.0, g0 = 0.0;
   double *gvals = NULL;
   if (reduction == LM_REDUCTION_NONE) {
      gvals = malloc(sizeof(double) * (size_t)(s.count + 1));
      if (!gvals) {
         st = lm_error(LM_ERR_OOM, "out of memory (nll_loss_backward)");
      } else {
         /* read grad_out (target-shaped, any strides) in target order */
         nll_t r = s;
         const char *gp = lm_tensor_data(grad_out);
         const int64_t ge = lm_dtype_size(grad_out->dtype);
         for (int j = 0; j < r.nd; j++) r.ist[j] = grad_out->strides[j];
         NLL_WALK(&r, {
            (void)t;
            gvals[k] = lm_load_as_double(gp + ioff * ge, grad_out->dtype);
         });
      }
   } else {
      g0 = load_scalar(grad_out);
      if (reduction == LM_REDUCTION_MEAN) tw = load_scalar(total_weight);
   }
   if (st == LM_OK) st = nll_check_targets(&s, ignore_index);
   if (st == LM_OK && grad_input->numel > 0) {
      /* grad_input is contiguous: its strides are the canonical ones */
      char *gp = lm_tensor_data(grad_input);
      memset(gp, 0, (size_t)(grad_input->numel * s.esz));
      nll_t d = s;
      for (int j = 0; j < d.nd; j++)
         d.ist[j] = input->ndim == 1 ? 0 : grad_input->strides[j == 0 ? 0 : j + 1];
      d.cst = grad_input->strides[input->ndim == 1 ? 0 : 1];
      const double scale = reduction == LM_REDUCTION_MEAN ? g0 / tw : g0;
      NLL_WALK(&d, {
         if (t != ignore_index) {
            const double wc = d.w ? d.w[t] : 1.0;
            const double g = gvals ? gvals[k] : scale;
            lm_store_from_double(gp + (ioff + t * d.cst) * d.esz, d.dt, -wc * g);
         }
      });
   }
   free(gvals);
   free(s.w);
   return st;
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_loss(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_NLL_LOSS] = k_nll_loss;
   table[LM_OP_NLL_LOSS_BACKWARD] = k_nll_loss_backward;
}
