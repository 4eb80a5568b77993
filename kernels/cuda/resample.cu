/* resample.cu -- LM_OP_RESAMPLE on CUDA (front end src/ops/resample.c, parameters and the t[]
 * order src/ops/resample.h, the CPU's kernel kernels/cpu/resample.c, whose arithmetic this repeats
 * product by product: the first tap's product, then each next one added, in T).
 *
 * One thread per output value (b, o, r): neighbouring threads take neighbouring r, the contiguous
 * inner positions, so the reads of a tap's input row and the write are coalesced. The taps are
 * device memory the host does not read: a row whose taps are out of range (ptr not within
 * [0, nnz] or decreasing, an index outside [0, In)) is written as NaN instead of reading outside
 * x (the CPU kernel checks them first and fails). A single tap of weight 1 copies its value
 * (w * x would quiet a signaling NaN), as the CPU's memcpy does. */
#include "cuda.cuh"
extern "C" {
#include "ops/resample.h"
}
#include <math.h>

namespace {

template <class T> struct ResampleBody {
   const T *x;
   const int64_t *ptr, *idx;
   const T *w;
   T *y;
   int64_t In, Out, R, nnz;
   LM_HD void operator()(int64_t i) const {
      const int64_t r = i % R, row = i / R;
      const int64_t o = row % Out, b = row / Out;
      const int64_t k0 = ptr[o], k1 = ptr[o + 1];
      if (k0 < 0 || k1 < k0 || k1 > nnz) {
         y[i] = (T)NAN;
         return;
      }
      const T *xb = x + b * In * R + r;
      T acc = 0;
      for (int64_t k = k0; k < k1; k++) {
         const int64_t j = idx[k];
         if (j < 0 || j >= In) {
            acc = (T)NAN;
            break;
         }
         const T v = xb[j * R];
         if (k == k0) acc = (k1 - k0 == 1 && w[k] == (T)1) ? v : w[k] * v;
         else acc = acc + w[k] * v;
      }
      y[i] = acc;
   }
};

template <class T> lm_status resample_run(const lm_op *op) {
   const lm_resample_params *p = (const lm_resample_params *)op->params;
   ResampleBody<T> b;
   b.x = (const T *)lm_cu_ptr(op->t[0]);
   b.ptr = (const int64_t *)lm_cu_ptr(op->t[1]);
   b.idx = (const int64_t *)lm_cu_ptr(op->t[2]);
   b.w = (const T *)lm_cu_ptr(op->t[3]);
   b.y = (T *)lm_cu_ptr(op->t[4]);
   b.In = p->In;
   b.Out = p->Out;
   b.R = p->R;
   b.nnz = p->nnz;
   return lm_cu_for(lm_cu_index(op->t[0]), p->B * p->Out * p->R, b);
}

/* RESAMPLE: t = {x, ptr, idx, w, y} */
static lm_status k_resample(const lm_op *op) {
   const lm_tensor *x = op->t[0];
   if (x->dtype == LM_FLOAT32) return resample_run<float>(op);
   if (x->dtype == LM_FLOAT64) return resample_run<double>(op);
   return lm_error(LM_ERR_DTYPE, "resample: unsupported dtype %s", lm_dtype_name(x->dtype));
}

} // namespace

void lm_cuda_register_resample(lm_kernel_fn *table) { table[LM_OP_RESAMPLE] = k_resample; }
