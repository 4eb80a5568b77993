/* linalg.c -- the front end of lm_matmul: torch.matmul semantics on lumen's own GEMM.
 *
 *   1-D . 1-D   dot product, 0-dim result
 *   2-D . 2-D   matrix product
 *   1-D . n-D   the vector is a 1 x k matrix, the row dim is dropped from the result
 *   n-D . 1-D   the vector is a k x 1 matrix, the column dim is dropped
 *   batched     leading dims broadcast (PyTorch's rules), one GEMM per batch entry
 *
 * Operands of any strides go straight to the kernel (LM_OP_MATMUL, ops/linalg.h; on the CPU
 * lm_*gemm_strided, whose packing handles transposed and strided operands, broadcast batch dims
 * are stride 0), so no operand is copied. bfloat16 goes to the kernel as it is (on the CPU
 * lm_bgemm_strided_bf16c: vdpbf16ps where the CPU has AVX512_BF16, float32 sums, the result
 * rounded once); float16 is computed in float32 (the operands converted, F16C) and rounded once
 * at the end (no AVX512_FP16 kernel). A new output is contiguous; an out= tensor keeps its strides and must
 * have the result's shape and dtype.
 */
#include "common.h"
#include "../conv.h"
#include "linalg.h"

/* float16 inputs: compute in float32, round into the result once */
static lm_status matmul_via_float(const lm_tensor *a, const lm_tensor *b, lm_tensor **out) {
   lm_tensor *a32 = NULL, *b32 = NULL, *r32 = NULL;
   lm_status st = lm_clone(a, LM_PRESERVE, LM_FLOAT32, &a32);
   if (st == LM_OK) st = lm_clone(b, LM_PRESERVE, LM_FLOAT32, &b32);
   if (st == LM_OK) st = lm_matmul(a32, b32, &r32);
   if (st == LM_OK) {
      if (*out)
         st = lm_copy_(*out, r32);
      else
         st = lm_clone(r32, LM_CONTIGUOUS, a->dtype, out);
   }
   lm_tensor_free(a32);
   lm_tensor_free(b32);
   lm_tensor_free(r32);
   return st;
}

lm_status lm_matmul(const lm_tensor *a, const lm_tensor *b, lm_tensor **out) {
   LM_CHECK_TENSOR(a, "input");
   LM_CHECK_TENSOR(b, "other");
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   LM_TRY(lm_check_same_device(a, b, "matmul other"));
   const int na = a->ndim, nb = b->ndim;
   if (na == 0 || nb == 0)
      return lm_error(LM_ERR_SHAPE,
                      "both arguments to matmul need to be at least 1D, but they are %dD and %dD",
                      na, nb);
   if (a->dtype != b->dtype)
      return lm_error(LM_ERR_DTYPE,
                      "expected both arguments to have the same dtype, but got %s and %s",
                      lm_dtype_name(a->dtype), lm_dtype_name(b->dtype));
   const int dt = a->dtype;
   if (!lm_is_float_dtype(dt))
      return lm_error(LM_ERR_DTYPE, "matmul is not implemented for %s tensors",
                      lm_dtype_name(dt));

   /* the matrix parts; a vector is a 1 x k row (a) or a k x 1 column (b) */
   lm_matmul_params p;
   memset(&p, 0, sizeof p);
   p.m = na == 1 ? 1 : a->sizes[na - 2];
   p.k = a->sizes[na - 1];
   p.rsa = na == 1 ? 0 : a->strides[na - 2];
   p.csa = a->strides[na - 1];
   const int64_t kb = nb == 1 ? b->sizes[0] : b->sizes[nb - 2];
   p.n = nb == 1 ? 1 : b->sizes[nb - 1];
   p.rsb = nb == 1 ? b->strides[0] : b->strides[nb - 2];
   p.csb = nb == 1 ? 0 : b->strides[nb - 1];
   if (p.k != kb) {
      if (na == 1 && nb == 1)
         return lm_error(LM_ERR_SHAPE,
                         "inconsistent tensor size, expected tensor [%lld] and src [%lld] to have "
                         "the same number of elements, but got %lld and %lld elements "
                         "respectively",
                         (long long)p.k, (long long)kb, (long long)p.k, (long long)kb);
      return lm_error(LM_ERR_SHAPE, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and "
                      "%lldx%lld)", (long long)p.m, (long long)p.k, (long long)kb,
                      (long long)p.n);
   }

   /* batch dims, broadcast */
   const int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0;
   int bo = 0;
   LM_TRY(lm_broadcast_shapes(ba, a->sizes, bb, b->sizes, &bo, p.bsz));
   p.nb = bo;
   for (int d = 0; d < bo; d++) {
      int da = d - (bo - ba), db = d - (bo - bb);
      p.bsa[d] = (da >= 0 && a->sizes[da] != 1) ? a->strides[da] : 0;
      p.bsb[d] = (db >= 0 && b->sizes[db] != 1) ? b->strides[db] : 0;
   }
   int64_t osz[LM_MAX_DIMS];
   int on = 0;
   for (int d = 0; d < bo; d++) osz[on++] = p.bsz[d];
   if (na > 1) osz[on++] = p.m;
   if (nb > 1) osz[on++] = p.n;

   lm_tensor *o = *out;
   if (o) {
      LM_TRY(lm_check_same_device(a, o, "matmul out"));
      int ok = o->ndim == on;
      for (int d = 0; ok && d < on; d++) ok = o->sizes[d] == osz[d];
      if (!ok) {
         char s1[160], s2[160];
         lm_format_shape(s1, sizeof s1, o->ndim, o->sizes);
         lm_format_shape(s2, sizeof s2, on, osz);
         return lm_error(LM_ERR_SHAPE, "output with shape %s doesn't match the result shape %s",
                         s1, s2);
      }
      if (o->dtype != dt)
         return lm_error(LM_ERR_DTYPE, "expected out tensor to have dtype %s, but got %s instead",
                         lm_dtype_name(dt), lm_dtype_name(o->dtype));
      for (int d = 0; d < on; d++)
         if (o->sizes[d] > 1 && o->strides[d] == 0)
            return lm_error(LM_ERR_ARG, "unsupported operation: more than one element of the "
                            "written-to tensor refers to a single memory location. Please "
                            "clone() the tensor before performing the operation.");
      /* an out= sharing memory with an input: compute aside, then copy */
      if (o->numel > 0 && (lm_tensor_same_storage(o, a) || lm_tensor_same_storage(o, b))) {
         lm_tensor *tmp = NULL;
         LM_TRY(lm_matmul(a, b, &tmp));
         lm_status st = lm_copy_(o, tmp);
         lm_tensor_free(tmp);
         return st;
      }
   }
   if (dt == LM_FLOAT16) return matmul_via_float(a, b, out);

   lm_tensor *created = NULL;
   if (!o) {
      LM_TRY(lm_empty(on, osz, dt, LM_CONTIGUOUS, a->device, &created));
      o = created;
   }
   /* the output's strides: batch dims, then rows (absent for a 1-D a), then columns */
   for (int d = 0; d < bo; d++) p.bsc[d] = p.bsz[d] == 1 ? 0 : o->strides[d];
   p.rsc = na > 1 ? o->strides[bo] : 0;
   p.csc = nb > 1 ? o->strides[on - 1] : 1;
   if (o->numel > 0) {
      lm_tensor *ts[3] = {(lm_tensor *)a, (lm_tensor *)b, o};
      const lm_op op = lm_op_make(LM_OP_MATMUL, 3, ts, &p);
      lm_status st = lm_dispatch(&op);
      if (st != LM_OK) {
         lm_tensor_free(created);
         return st;
      }
   }
   if (created) *out = created;
   return LM_OK;
}

/* out += a b for 2-D a (m x k), b (k x n) and out (m x n) of one floating dtype on one device,
 * each element's sum rounded once (torch.addmm's beta = 1, alpha = 1; F.linear's bias in 16
 * bits: the bias is added to the float32 sums, not to an already rounded product). float16 is
 * computed in float32 and rounded once at the end. out must not share memory with a or b. */
lm_status lm_addmm_(lm_tensor *out, const lm_tensor *a, const lm_tensor *b) {
   LM_CHECK_TENSOR(out, "out");
   LM_CHECK_TENSOR(a, "mat1");
   LM_CHECK_TENSOR(b, "mat2");
   LM_TRY(lm_check_same_device(out, a, "addmm mat1"));
   LM_TRY(lm_check_same_device(out, b, "addmm mat2"));
   if (a->ndim != 2 || b->ndim != 2 || out->ndim != 2)
      return lm_error(LM_ERR_SHAPE, "addmm expects 2-D tensors, got %dD, %dD and %dD (out)",
                      a->ndim, b->ndim, out->ndim);
   if (a->dtype != b->dtype || a->dtype != out->dtype)
      return lm_error(LM_ERR_DTYPE, "addmm expects one dtype, got %s, %s and %s (out)",
                      lm_dtype_name(a->dtype), lm_dtype_name(b->dtype),
                      lm_dtype_name(out->dtype));
   const int dt = a->dtype;
   if (!lm_is_float_dtype(dt))
      return lm_error(LM_ERR_DTYPE, "addmm is not implemented for %s tensors", lm_dtype_name(dt));
   if (a->sizes[1] != b->sizes[0] || out->sizes[0] != a->sizes[0] ||
       out->sizes[1] != b->sizes[1])
      return lm_error(LM_ERR_SHAPE, "addmm shapes do not match: out %lldx%lld, mat1 %lldx%lld, "
                      "mat2 %lldx%lld", (long long)out->sizes[0], (long long)out->sizes[1],
                      (long long)a->sizes[0], (long long)a->sizes[1], (long long)b->sizes[0],
                      (long long)b->sizes[1]);
   for (int d = 0; d < 2; d++)
      if (out->sizes[d] > 1 && out->strides[d] == 0)
         return lm_error(LM_ERR_ARG, "addmm: more than one element of out refers to a single "
                         "memory location");
   if (out->numel > 0 && (lm_tensor_same_storage(out, a) || lm_tensor_same_storage(out, b)))
      return lm_error(LM_ERR_ARG, "addmm: out must not share memory with mat1 or mat2");
   if (out->numel == 0) return LM_OK;
   if (dt == LM_FLOAT16) { /* in float32, rounded once */
      lm_tensor *a32 = NULL, *b32 = NULL, *o32 = NULL;
      lm_status st = lm_clone(a, LM_PRESERVE, LM_FLOAT32, &a32);
      if (st == LM_OK) st = lm_clone(b, LM_PRESERVE, LM_FLOAT32, &b32);
      if (st == LM_OK) st = lm_clone(out, LM_PRESERVE, LM_FLOAT32, &o32);
      if (st == LM_OK) st = lm_addmm_(o32, a32, b32);
      if (st == LM_OK) st = lm_copy_(out, o32);
      lm_tensor_free(a32);
      lm_tensor_free(b32);
      lm_tensor_free(o32);
      return st;
   }
   lm_matmul_params p;
   memset(&p, 0, sizeof p);
   p.m = a->sizes[0];
   p.k = a->sizes[1];
   p.n = b->sizes[1];
   p.rsa = a->strides[0];
   p.csa = a->strides[1];
   p.rsb = b->strides[0];
   p.csb = b->strides[1];
   p.rsc = out->strides[0];
   p.csc = out->strides[1];
   p.accumulate = 1;
   lm_tensor *ts[3] = {(lm_tensor *)a, (lm_tensor *)b, out};
   const lm_op op = lm_op_make(LM_OP_MATMUL, 3, ts, &p);
   return lm_dispatch(&op);
}

/* ---- lm_linear: F.linear with its activation (LM_OP_LINEAR where the device fuses it) ---- */

/* the activation op of an lm_conv_act, on t in place */
static lm_status act_in_place(lm_tensor *t, int act) {
   static const int UOP[LM_NUM_ACT] = {
      [LM_ACT_RELU] = LM_RELU, [LM_ACT_SILU] = LM_SILU, [LM_ACT_HARDSWISH] = LM_HARDSWISH,
      [LM_ACT_HARDSIGMOID] = LM_HARDSIGMOID, [LM_ACT_SIGMOID] = LM_SIGMOID,
      [LM_ACT_GELU] = LM_GELU, [LM_ACT_GELU_TANH] = LM_GELU_TANH,
   };
   lm_tensor *o = t;
   if (act == LM_ACT_NONE) return LM_OK;
   if (act == LM_ACT_RELU6) return lm_clamp(t, 0.0, 6.0, 1, 1, &o);
   return lm_unary(UOP[act], t, &o);
}

static int dense_rows(const lm_tensor *t) {
   return t->ndim == 2 && (t->sizes[1] <= 1 || t->strides[1] == 1) &&
          (t->sizes[0] <= 1 || t->strides[0] == t->sizes[1]);
}

lm_status lm_linear(const lm_tensor *x, const lm_tensor *w, const lm_tensor *bias, int act,
                    lm_tensor **out) {
   LM_CHECK_TENSOR(x, "input");
   LM_CHECK_TENSOR(w, "weight");
   if (!out) return lm_error(LM_ERR_ARG, "linear: output pointer is NULL");
   if (*out) return lm_error(LM_ERR_ARG, "linear: *out must be NULL (a new tensor is returned)");
   LM_TRY(lm_check_same_device(x, w, "linear weight"));
   if (bias) LM_TRY(lm_check_same_device(x, bias, "linear bias"));
   if (x->ndim != 2 || w->ndim != 2)
      return lm_error(LM_ERR_SHAPE, "linear expects a 2-D input and weight, got %dD and %dD",
                      x->ndim, w->ndim);
   const int dt = x->dtype;
   if (!lm_is_float_dtype(dt))
      return lm_error(LM_ERR_DTYPE, "linear is not implemented for %s tensors", lm_dtype_name(dt));
   if (w->dtype != dt || (bias && bias->dtype != dt))
      return lm_error(LM_ERR_DTYPE, "linear expects one dtype, got %s (input), %s (weight)%s%s",
                      lm_dtype_name(dt), lm_dtype_name(w->dtype), bias ? " and " : "",
                      bias ? lm_dtype_name(bias->dtype) : "");
   if (x->sizes[1] != w->sizes[1])
      return lm_error(LM_ERR_SHAPE, "linear: input has %lld features, weight (%lldx%lld) expects "
                      "%lld", (long long)x->sizes[1], (long long)w->sizes[0],
                      (long long)w->sizes[1], (long long)w->sizes[1]);
   if (bias && (bias->ndim != 1 || bias->sizes[0] != w->sizes[0]))
      return lm_error(LM_ERR_SHAPE, "linear: bias must be 1-D of size %lld",
                      (long long)w->sizes[0]);
   if (act < LM_ACT_NONE || act >= LM_NUM_ACT)
      return lm_error(LM_ERR_ARG, "linear: unknown activation %d", act);
   const int64_t m = x->sizes[0], n = w->sizes[0], k = x->sizes[1];
   const int64_t osz[2] = {m, n};
   lm_tensor *o = NULL;
   LM_TRY(lm_empty(2, osz, dt, LM_CONTIGUOUS, x->device, &o));
   lm_status st = LM_OK;
   if (o->numel > 0) {
      const lm_linear_params p = {m, n, k, act};
      lm_tensor *ts[4] = {(lm_tensor *)x, (lm_tensor *)w, (lm_tensor *)bias, o};
      const lm_op op = lm_op_make(LM_OP_LINEAR, 4, ts, &p);
      const int dense = dense_rows(x) && dense_rows(w) &&
                        (!bias || bias->sizes[0] <= 1 || bias->strides[0] == 1);
      if (dense && lm_op_supported(&op)) {
         st = lm_dispatch(&op);
      } else {
         /* the composed ops: x w^T, + bias, the activation (in place) */
         lm_tensor *wt = NULL;
         st = lm_transpose(w, 0, 1, &wt);
         if (st == LM_OK) st = lm_matmul(x, wt, &o);
         lm_tensor_free(wt);
         if (st == LM_OK && bias) {
            lm_tensor *oo = o;
            st = lm_binary(LM_ADD, o, bias, 1.0, &oo);
         }
         if (st == LM_OK) st = act_in_place(o, act);
      }
   }
   if (st != LM_OK) {
      lm_tensor_free(o);
      return st;
   }
   *out = o;
   return LM_OK;
}
