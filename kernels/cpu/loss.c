/*
 * loss.c -- negative log-likelihood loss, forward and backward (cross_entropy is log_softmax +
 * nll_loss, composed in Lua).
 *
 * input (N, C), (C) or (N, C, d1, ...) of log-probabilities, any strides; target int64 of the
 * input's shape without the class dim. The samples are walked with an odometer over the target
 * shape, so no copy is made. Sums are double.
 */
#include "cpu.h"
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "nn_common.h"

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

static lm_status nll_setup(nll_t *s, const lm_tensor *input, const lm_tensor *target,
                           const lm_tensor *weight, int reduction) {
   if (!input) return lm_error(LM_ERR_ARG, "input is nil");
   if (!target) return lm_error(LM_ERR_ARG, "target is nil");
   LM_TRY(lm_check_cpu(input, "input"));
   LM_TRY(lm_check_cpu(target, "target"));
   if (input->dtype != LM_FLOAT32 && input->dtype != LM_FLOAT64)
      return lm_error(LM_ERR_DTYPE, "expected input to be float32 or float64, got %s",
                      lm_dtype_name(input->dtype));
   if (target->dtype != LM_INT64)
      return lm_error(LM_ERR_DTYPE, "expected target of dtype int64, got %s",
                      lm_dtype_name(target->dtype));
   if (reduction < LM_REDUCTION_NONE || reduction > LM_REDUCTION_SUM)
      return lm_error(LM_ERR_ARG, "invalid reduction %d (0 none, 1 mean, 2 sum)", reduction);
   if (input->ndim < 1) return lm_error(LM_ERR_SHAPE, "input tensor should be 1D or more");
   char a[160], b[160];
   fmt_sizes(a, sizeof a, input->ndim, input->sizes);
   fmt_sizes(b, sizeof b, target->ndim, target->sizes);
   if (input->ndim <= 2 && target->ndim > 1)
      return lm_error(LM_ERR_SHAPE, "0D or 1D target tensor expected, multi-target not supported");
   if (input->ndim == 1 && target->ndim != 0)
      return lm_error(LM_ERR_SHAPE, "1D input %s expects a 0D target, got %s", a, b);
   if (input->ndim == 2 && target->ndim == 1 && input->sizes[0] != target->sizes[0])
      return lm_error(LM_ERR_SHAPE,
                      "Expected input batch_size (%lld) to match target batch_size (%lld).",
                      (long long)input->sizes[0], (long long)target->sizes[0]);
   if (input->ndim == 2 && target->ndim == 0)
      return lm_error(LM_ERR_SHAPE, "2D input %s expects a 1D target, got %s", a, b);
   if (input->ndim >= 3) {
      int ok = target->ndim == input->ndim - 1 && target->sizes[0] == input->sizes[0];
      for (int d = 2; ok && d < input->ndim; d++)
         if (target->sizes[d - 1] != input->sizes[d]) ok = 0;
      if (!ok)
         return lm_error(LM_ERR_SHAPE, "input %s expects a target of its shape without dim 1, got %s",
                         a, b);
   }
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
      LM_TRY(lm_check_cpu(weight, "weight"));
      if (!lm_is_float_dtype(weight->dtype))
         return lm_error(LM_ERR_DTYPE, "expected weight to be a floating tensor, got %s",
                         lm_dtype_name(weight->dtype));
      if (weight->ndim != 1 || weight->numel != s->C) {
         fmt_sizes(b, sizeof b, weight->ndim, weight->sizes);
         return lm_error(LM_ERR_SHAPE,
                         "weight tensor should be defined either for all %lld classes or no "
                         "classes but got weight tensor of shape: %s",
                         (long long)s->C, b);
      }
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

lm_status lm_nll_loss(const lm_tensor *input, const lm_tensor *target, const lm_tensor *weight,
                      int reduction, int64_t ignore_index, lm_tensor **out,
                      lm_tensor **total_weight) {
   nll_t s;
   if (!out) return lm_error(LM_ERR_ARG, "out is NULL");
   LM_TRY(nll_setup(&s, input, target, weight, reduction));
   lm_status st = nll_check_targets(&s, ignore_index);
   out_slot so = {0}, sw = {0};
   double *vals = NULL;
   if (st == LM_OK) {
      if (reduction == LM_REDUCTION_NONE)
         st = out_open(&so, out, target->ndim, target->sizes, s.dt, LM_CONTIGUOUS, "output");
      else
         st = out_open(&so, out, 0, NULL, s.dt, LM_CONTIGUOUS, "output");
   }
   if (st == LM_OK && total_weight) st = out_open(&sw, total_weight, 0, NULL, s.dt, LM_CONTIGUOUS,
                                                 "total_weight");
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
         /* so.t is contiguous in target order */
         char *op = lm_tensor_data(so.t);
         for (int64_t k = 0; k < s.count; k++) lm_store_from_double(op + k * s.esz, s.dt, vals[k]);
      } else {
         store_scalar(so.t, reduction == LM_REDUCTION_MEAN ? sum / tw : sum);
      }
      if (sw.t) store_scalar(sw.t, tw);
   }
   free(vals);
   free(s.w);
   if (total_weight) {
      st = out_close(&sw, total_weight, st);
   }
   st = out_close(&so, out, st);
   return st;
}

lm_status lm_nll_loss_backward(const lm_tensor *grad_out, const lm_tensor *input,
                               const lm_tensor *target, const lm_tensor *weight, int reduction,
                               int64_t ignore_index, const lm_tensor *total_weight,
                               lm_tensor **grad_input) {
   nll_t s;
   if (!grad_input) return lm_error(LM_ERR_ARG, "grad_input is NULL");
   if (!grad_out) return lm_error(LM_ERR_ARG, "grad_output is nil");
   LM_TRY(lm_check_cpu(grad_out, "grad_output"));
   if (!lm_is_float_dtype(grad_out->dtype))
      return lm_error(LM_ERR_DTYPE, "expected grad_output to be floating, got %s",
                      lm_dtype_name(grad_out->dtype));
   LM_TRY(nll_setup(&s, input, target, weight, reduction));
   lm_status st = LM_OK;
   double tw = 1.0, g0 = 0.0;
   double *gvals = NULL;
   if (reduction == LM_REDUCTION_NONE) {
      if (grad_out->ndim != target->ndim ||
          memcmp(grad_out->sizes, target->sizes, (size_t)target->ndim * sizeof(int64_t)) != 0) {
         char a[160], b[160];
         fmt_sizes(a, sizeof a, grad_out->ndim, grad_out->sizes);
         fmt_sizes(b, sizeof b, target->ndim, target->sizes);
         st = lm_error(LM_ERR_SHAPE, "nll_loss_backward: grad_output %s should have the target's shape %s",
                       a, b);
      } else {
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
      }
   } else {
      if (grad_out->numel != 1)
         st = lm_error(LM_ERR_SHAPE, "nll_loss_backward: expected a 1-element grad_output, got %lld elements",
                       (long long)grad_out->numel);
      else
         g0 = load_scalar(grad_out);
      if (st == LM_OK && reduction == LM_REDUCTION_MEAN) {
         if (!total_weight)
            st = lm_error(LM_ERR_ARG, "nll_loss_backward: total_weight is required for mean");
         else if (total_weight->numel != 1)
            st = lm_error(LM_ERR_SHAPE, "nll_loss_backward: expected a 1-element total_weight, got %lld elements",
                          (long long)total_weight->numel);
         else
            tw = load_scalar(total_weight);
      }
   }
   if (st == LM_OK) st = nll_check_targets(&s, ignore_index);
   out_slot so = {0};
   if (st == LM_OK) st = out_open(&so, grad_input, input->ndim, input->sizes, s.dt,
                                          LM_CONTIGUOUS, "grad_input");
   if (st == LM_OK && so.t->numel > 0) {
      /* so.t is contiguous: its strides are the canonical ones */
      char *gp = lm_tensor_data(so.t);
      memset(gp, 0, (size_t)(so.t->numel * s.esz));
      nll_t d = s;
      for (int j = 0; j < d.nd; j++) d.ist[j] = input->ndim == 1 ? 0 : so.t->strides[j == 0 ? 0 : j + 1];
      d.cst = so.t->strides[input->ndim == 1 ? 0 : 1];
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
   return out_close(&so, grad_input, st);
}

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_loss(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
