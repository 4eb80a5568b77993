/* elementwise.c -- the elementwise operators' front end: type promotion (PyTorch's
 * ResultTypeState), argument and device checks, output allocation by the TensorIterator rules
 * (iter.c) on the inputs' device, then one lm_dispatch. The gather / compute / scatter loop and
 * the compute loops are the kernels' (kernels/cpu/elementwise.c, ew_kernels.c; parameters:
 * ops/elementwise.h). Also copy_ (across devices through the backends' memcpy), fill_, where,
 * clamp, addcmul/addcdiv, and the fused optimizer steps' front ends (kernels/cpu/optim.c). */
#include "iter.h"
#include "nn.h"
#include "ops/elementwise.h"
#include "ops/optim.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- type promotion */

typedef struct rt_state {
   int dim, zero, wrapped; /* -1: undefined */
} rt_state;

static int promote_skip(int a, int b) {
   if (a < 0) return b;
   if (b < 0) return a;
   return lm_promote_types(a, b);
}

static void rt_update(rt_state *s, const lm_operand *op) {
   int dt = op->dtype;
   if (op->wrapped) {
      if (lm_is_float_dtype(dt)) dt = LM_FLOAT32; /* the default dtype */
      s->wrapped = promote_skip(s->wrapped, dt);
   } else if (op->ndim == 0) {
      s->zero = promote_skip(s->zero, dt);
   } else {
      s->dim = promote_skip(s->dim, dt);
   }
}

static int combine_categories(int higher, int lower) {
   if (higher >= 0 && lm_is_float_dtype(higher)) return higher;
   if (higher == LM_BOOL || (lower >= 0 && lm_is_float_dtype(lower)))
      return promote_skip(higher, lower);
   if (higher >= 0) return higher;
   return lower;
}

static int result_type_ops(int n, const lm_operand *ops) {
   rt_state s = {-1, -1, -1};
   for (int k = 0; k < n; k++) rt_update(&s, &ops[k]);
   int r = combine_categories(s.dim, combine_categories(s.zero, s.wrapped));
   return r < 0 ? LM_FLOAT32 : r;
}

static void operand_meta(lm_operand *op, int dtype, int ndim) {
   memset(op, 0, sizeof *op);
   op->dtype = dtype;
   op->ndim = ndim;
}

int lm_result_type(const lm_tensor *a, const lm_tensor *b) {
   if (!a || !b) return -1;
   lm_operand ops[2];
   operand_meta(&ops[0], a->dtype, a->ndim);
   operand_meta(&ops[1], b->dtype, b->ndim);
   return result_type_ops(2, ops);
}

int lm_result_type_scalar(const lm_tensor *a, int scalar_is_int, int scalar_is_bool) {
   if (!a) return -1;
   lm_operand ops[2];
   operand_meta(&ops[0], a->dtype, a->ndim);
   operand_meta(&ops[1], scalar_is_bool ? LM_BOOL : scalar_is_int ? LM_INT64 : LM_FLOAT64, 0);
   ops[1].wrapped = 1;
   return result_type_ops(2, ops);
}

/* ---------------------------------------------------------------- the engine's front end */

static lm_status check_out_shape(const lm_tensor *o, int nd, const int64_t *shape) {
   int ok = o->ndim == nd;
   for (int d = 0; ok && d < nd; d++) ok = o->sizes[d] == shape[d];
   if (!ok) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, o->ndim, o->sizes);
      lm_format_shape(b, sizeof b, nd, shape);
      return lm_error(LM_ERR_SHAPE, "output with shape %s doesn't match the broadcast shape %s", a,
                      b);
   }
   return LM_OK;
}

/* the device of the tensor inputs (every one on the same device), and of out= if given */
static lm_status inputs_device(int nin, lm_tensor *const *tin, const lm_tensor *o, int *device) {
   const lm_tensor *first = NULL;
   for (int k = 0; k < nin; k++) {
      if (!tin[k]) continue;
      if (!first) first = tin[k];
      else if (tin[k]->device != first->device)
         return lm_check_same_device(first, tin[k], "input");
   }
   if (first && o && o->device != first->device) return lm_check_same_device(first, o, "out");
   *device = first ? first->device : o ? o->device : LM_CPU;
   return LM_OK;
}

/* Does the CPU have a compute loop for this (table, op, kind)? Every float kind does; int64 lacks
   the ops that only make sense in floating point (the front ends compute those in float). */
static int has_kernel(int table, int kop, int kind) {
   if (kind != LM_K_I64) return 1;
   if (table == LM_EW_UNARY)
      return kop == LM_NEG || kop == LM_ABS || kop == LM_RELU || kop == LM_SQUARE ||
             kop == LM_SIGN || kop == LM_LOGICAL_NOT || kop == LM_FLOOR || kop == LM_CEIL ||
             kop == LM_ROUND || kop == LM_TRUNC;
   if (table == LM_EW_BINARY) return kop != LM_DIV && kop != LM_ATAN2 && kop < LM_SILU_BACKWARD;
   return kop != LM_T_ADDCDIV && kop != LM_T_POWHALF && kop != LM_T_POWM1 &&
          kop != LM_T_POWMHALF && kop != LM_T_POWM2;
}

/* Run plan over the inputs into *out (allocated with result dtype res_dt and the TensorIterator
   layout on the inputs' device when *out is NULL). ins: the operands (for the layout; a number
   is a 0-dim operand), tin: their tensors (NULL for a number). swap_vote: the layout votes with
   inputs 1, 0 (threshold_backward). The iterator itself is set up once, by the kernel. */
static lm_status ew_exec_v(lm_ew_params *pl, int kind, int res_dt, const lm_operand *ins,
                           lm_tensor *const *tin, lm_tensor **out, int swap_vote) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   const int nin = pl->nin;
   int device = LM_CPU;
   LM_TRY(inputs_device(nin, tin, *out, &device));
   int nd, same;
   int64_t shape[LM_MAX_DIMS];
   LM_TRY(lm_iter_shape(nin, ins, &nd, shape, &same));
   lm_tensor *o = *out, *created = NULL;
   if (o) {
      LM_TRY(check_out_shape(o, nd, shape));
      if (!lm_can_cast(res_dt, o->dtype))
         return lm_error(LM_ERR_DTYPE, "result type %s can't be cast to the desired output type %s",
                         lm_dtype_name(res_dt), lm_dtype_name(o->dtype));
      lm_operand oo;
      lm_operand_tensor(&oo, o);
      if (lm_operand_internal_overlap(&oo)) return lm_overlap_error();
   } else {
      int64_t st[LM_MAX_DIMS];
      if (swap_vote && nin == 2) {
         lm_operand sw[2] = {ins[1], ins[0]};
         lm_iter_output_strides(nin, sw, nd, shape, same, st);
      } else {
         lm_iter_output_strides(nin, ins, nd, shape, same, st);
      }
      if (pl->epi >= 0) {
         /* fused binary + unary: the layout the unary op gives the binary op's result (they
            differ in the strides of size-1 dims) */
         lm_operand mid;
         lm_operand_set(&mid, NULL, res_dt, nd, shape, st);
         int nd1, same1;
         int64_t shape1[LM_MAX_DIMS];
         LM_TRY(lm_iter_shape(1, &mid, &nd1, shape1, &same1));
         lm_iter_output_strides(1, &mid, nd1, shape1, same1, st);
      }
      LM_TRY(lm_empty_strided(nd, shape, st, res_dt, device, &created));
      o = created;
   }
   pl->created = created != NULL;
   lm_status status = LM_OK;
   if (o->numel > 0) {
      lm_tensor *ts[4] = {o, NULL, NULL, NULL};
      for (int k = 0; k < nin; k++) ts[k + 1] = tin[k];
      const lm_op op = lm_op_make(kind, nin + 1, ts, pl);
      status = lm_dispatch(&op);
   }
   if (status != LM_OK) {
      lm_tensor_free(created);
      return status;
   }
   *out = o;
   return LM_OK;
}

static lm_status ew_exec(lm_ew_params *pl, int kind, int res_dt, const lm_operand *ins,
                         lm_tensor *const *tin, lm_tensor **out) {
   return ew_exec_v(pl, kind, res_dt, ins, tin, out, 0);
}

static void plan_init(lm_ew_params *pl, int nin, int kind, int common) {
   memset(pl, 0, sizeof *pl);
   pl->nin = nin;
   int kdt = lm_kind_dtype(kind);
   for (int k = 0; k < 3; k++) {
      pl->in_dt[k] = kdt;
      pl->via[k] = common != kdt ? common : -1;
   }
   pl->out_dt = kdt;
   pl->out_via = -1;
   pl->kind = kind;
   pl->epi = -1;
   pl->epi_via = -1;
   pl->scalar_idx = -1;
}

/* a double cast through dtype dt (how PyTorch casts a scalar to the common dtype) */
static double through(double v, int dt) {
   _Alignas(8) char b[8];
   lm_store_from_double(b, dt, v);
   return lm_load_as_double(b, dt);
}

static void set_params(lm_kparams *p, int common, double alpha, double val, double lo, double hi) {
   double a = alpha, v = val, l = through(lo, common), h = through(hi, common);
   p->alpha_f = (float)a;
   p->alpha_d = a;
   p->alpha_i = lm_double_to_i64(a);
   p->val_f = (float)v;
   p->val_d = v;
   p->val_i = lm_double_to_i64(v);
   p->lo_f = (float)l;
   p->lo_d = l;
   p->lo_i = lm_double_to_i64(l);
   p->hi_f = (float)h;
   p->hi_d = h;
   p->hi_i = lm_double_to_i64(h);
}

static lm_status check_input(const lm_tensor *t, const char *name) {
   LM_CHECK_TENSOR(t, name);
   return LM_OK;
}

/* Small float operands with the same sizes and strides, non-overlapping and dense (two
 * contiguous tensors, two channels-last ones, ...; or one tensor, with a scalar or alone): the
 * result's strides come from the spec's fast setup (section 6.2, as lm_iter_output_strides
 * applies it: contiguous, else channels-last, else the inputs' own), and one kernel call over
 * the memory of each runs the whole op: elements at the same memory position are the same
 * element in all of them, since size-1 dims, the only ones whose strides may differ, never move
 * an offset. No iterator is set up: for a 4-element add that is a third of the call. */
enum { LM_SMALL_DENSE_MAX = LM_PARALLEL_GRAIN };

/* a float tensor the small path takes (its kernel kind computes in its own dtype) */
static int small_dense_ok(const lm_tensor *a) {
   const int dt = a->dtype;
   if ((dt != LM_FLOAT32 && dt != LM_FLOAT64) || a->numel <= 0 || a->numel > LM_SMALL_DENSE_MAX ||
       !(a->flags & LM_FLAG_NOD) || lm_kind_dtype(lm_kind_of(dt)) != dt)
      return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->strides[d] < 0) return 0;
   return 1;
}

/* the result of the small path: a's sizes, the fast setup's strides */
static lm_status small_dense_out(const lm_tensor *a, lm_tensor **o) {
   int64_t ost[LM_MAX_DIMS];
   if (a->flags & LM_FLAG_CONTIGUOUS) {
      lm_compute_strides(a->ndim, a->sizes, LM_CONTIGUOUS, ost);
   } else if (a->flags & LM_FLAG_CL_CONTIGUOUS) {
      lm_compute_strides(a->ndim, a->sizes, LM_CHANNELS_LAST, ost);
   } else {
      for (int d = 0; d < a->ndim; d++) ost[d] = a->strides[d];
   }
   return lm_empty_strided(a->ndim, a->sizes, ost, a->dtype, a->device, o);
}

/* the small path over a (and b, or a number): a new small result *out shaped like a; variant 0:
   fn(a, b), 1: fn(a, number), 2: fn(number, a) (ops/elementwise.h) */
static lm_status small_dense_run(lm_ew_params *pl, int kind, const lm_tensor *a,
                                 const lm_tensor *b, lm_tensor **out) {
   lm_tensor *o = NULL;
   LM_TRY(small_dense_out(a, &o));
   pl->small = 1;
   pl->created = 1;
   lm_tensor *ts[3] = {o, (lm_tensor *)a, (lm_tensor *)b};
   if (pl->variant == 2) ts[1] = NULL, ts[2] = (lm_tensor *)a;
   const lm_op op = lm_op_make(kind, pl->nin + 1, ts, pl);
   lm_status st = lm_dispatch(&op);
   if (st != LM_OK) {
      lm_tensor_free(o);
      return st;
   }
   *out = o;
   return LM_OK;
}

/* ---------------------------------------------------------------- unary */

static const char *unary_name(int op) {
   static const char *names[LM_NUM_UNARY] = {
      "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "square",
      "reciprocal", "sign", "logical_not", "floor", "ceil", "round", "sin", "cos", "log1p",
      "expm1", "silu", "gelu", "gelu_tanh", "hardswish", "hardsigmoid", "mish", "trunc", "log2",
      "log10", "exp2", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
      "erf", "erfc"};
   return (op >= 0 && op < LM_NUM_UNARY) ? names[op] : "?";
}

lm_status lm_unary(int op, const lm_tensor *a, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   if (op < 0 || op >= LM_NUM_UNARY) return lm_error(LM_ERR_ARG, "unknown unary op %d", op);
   int dt = a->dtype, res = dt;
   switch (op) {
   case LM_NEG:
      if (dt == LM_BOOL)
         return lm_error(LM_ERR_DTYPE,
                         "negation, the `-` operator, on a bool tensor is not supported; use "
                         "logical_not() instead");
      break;
   case LM_ABS:
   case LM_RELU:
   case LM_FLOOR:
   case LM_CEIL:
   case LM_ROUND:
   case LM_TRUNC:
      if (dt == LM_BOOL)
         return lm_error(LM_ERR_DTYPE, "%s is not supported for bool tensors", unary_name(op));
      break;
   case LM_SQUARE:
      if (dt == LM_BOOL) res = LM_INT64;
      break;
   case LM_SIGN: break;
   case LM_LOGICAL_NOT: res = LM_BOOL; break;
   default: /* exp, log, sqrt, ...: integers compute in the default float dtype */
      if (!lm_is_float_dtype(dt)) res = LM_FLOAT32;
      break;
   }
   int common = op == LM_LOGICAL_NOT ? dt : res;
   int kind = lm_kind_of(common);
   lm_ew_params pl;
   plan_init(&pl, 1, kind, common);
   pl.table = LM_EW_UNARY;
   pl.kop = op;
   pl.cheap = op == LM_NEG || op == LM_ABS || op == LM_RELU || op == LM_SQUARE ||
              op == LM_SIGN || op == LM_LOGICAL_NOT || op == LM_FLOOR || op == LM_CEIL ||
              op == LM_ROUND || op == LM_TRUNC;
   if (op == LM_LOGICAL_NOT) pl.out_dt = LM_BOOL;
   else pl.out_via = res;
   if (!has_kernel(LM_EW_UNARY, op, kind))
      return lm_error(LM_ERR_DTYPE, "%s is not supported for %s tensors", unary_name(op),
                      lm_dtype_name(dt));
   if (out && !*out && op != LM_LOGICAL_NOT && res == dt && small_dense_ok(a))
      return small_dense_run(&pl, LM_OP_UNARY, a, NULL, out);
   lm_operand in;
   lm_operand_tensor(&in, a);
   lm_tensor *tin[1] = {(lm_tensor *)a};
   return ew_exec(&pl, LM_OP_UNARY, res, &in, tin, out);
}

lm_status lm_clamp(const lm_tensor *a, double lo, double hi, int has_lo, int has_hi,
                   lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   if (!has_lo && !has_hi)
      return lm_error(LM_ERR_ARG, "at least one of 'min' or 'max' must not be nil");
   int res = a->dtype;
   if (!lm_is_float_dtype(res)) {
      lm_operand ops[3];
      int n = 0;
      operand_meta(&ops[n++], a->dtype, a->ndim);
      if (has_lo) {
         operand_meta(&ops[n], floor(lo) == lo ? LM_INT64 : LM_FLOAT64, 0);
         ops[n++].wrapped = 1;
      }
      if (has_hi) {
         operand_meta(&ops[n], floor(hi) == hi ? LM_INT64 : LM_FLOAT64, 0);
         ops[n++].wrapped = 1;
      }
      res = result_type_ops(n, ops);
   }
   int kind = lm_kind_of(res);
   lm_ew_params pl;
   plan_init(&pl, 1, kind, res);
   pl.out_via = res;
   pl.cheap = 1;
   int t = (has_lo && has_hi) ? LM_T_CLAMP : has_lo ? LM_T_CLAMP_MIN : LM_T_CLAMP_MAX;
   pl.table = LM_EW_OTHER;
   pl.kop = t;
   set_params(&pl.p, res, 1.0, 0.0, has_lo ? lo : 0.0, has_hi ? hi : 0.0);
   lm_operand in;
   lm_operand_tensor(&in, a);
   lm_tensor *tin[1] = {(lm_tensor *)a};
   return ew_exec(&pl, LM_OP_CLAMP, res, &in, tin, out);
}

/* ---------------------------------------------------------------- binary */

static const char *binary_name(int op) {
   static const char *names[LM_NUM_BINARY] = {
      "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
      "ge", "logical_and", "logical_or", "relu_backward", "sigmoid_backward", "tanh_backward",
      "fmod", "atan2", "silu_backward", "gelu_backward", "gelu_tanh_backward",
      "hardswish_backward", "hardsigmoid_backward", "mish_backward", "relu6_backward",
      "leaky_relu", "leaky_relu_backward", "elu", "elu_backward"};
   return (op >= 0 && op < LM_NUM_BINARY) ? names[op] : "?";
}

static int is_bool_result(int op) {
   return (op >= LM_EQ && op <= LM_GE) || op == LM_LOGICAL_AND || op == LM_LOGICAL_OR;
}

/* the unary ops a fused binary op may apply to its result: float in, the same float out */
static int fusable_unary(int uop) {
   return uop == LM_NEG || uop == LM_ABS || uop == LM_EXP || uop == LM_LOG || uop == LM_SQRT ||
          uop == LM_RSQRT || uop == LM_RELU || uop == LM_SIGMOID || uop == LM_TANH ||
          uop == LM_SQUARE || uop == LM_RECIPROCAL || uop == LM_SIN || uop == LM_COS ||
          uop == LM_LOG1P || uop == LM_EXPM1;
}

/* ins[0] op ins[1]; scalar_idx: which input is a wrapped scalar (-1: none), sval its value;
   uop >= 0: apply that unary op to the result in the same pass (lm_binary_unary) */
static lm_status binary_impl(int kind_op, int op, lm_operand *ins, lm_tensor *const *tin,
                             int scalar_idx, double sval, double alpha, int uop,
                             lm_tensor **out) {
   if (op < 0 || op >= LM_NUM_BINARY) return lm_error(LM_ERR_ARG, "unknown binary op %d", op);
   int common = result_type_ops(2, ins);
   int res;
   if (is_bool_result(op)) {
      res = LM_BOOL;
   } else {
      if ((op == LM_DIV || op == LM_ATAN2 || op >= LM_SILU_BACKWARD) &&
          !lm_is_float_dtype(common))
         common = LM_FLOAT32;
      res = common;
   }
   if (op == LM_SUB && (ins[0].dtype == LM_BOOL || ins[1].dtype == LM_BOOL))
      return lm_error(LM_ERR_DTYPE,
                      "subtraction, the `-` operator, with a bool tensor is not supported; use "
                      "logical_xor() or logical_not() instead");
   if ((op == LM_ADD || op == LM_SUB) && !lm_is_float_dtype(common) && floor(alpha) != alpha)
      return lm_error(LM_ERR_DTYPE,
                      "for integral input tensors, argument alpha must not be a floating point "
                      "number");
   int kind = lm_kind_of(common);
   lm_ew_params pl;
   plan_init(&pl, 2, kind, common);
   pl.table = LM_EW_BINARY;
   pl.kop = op;
   pl.cheap = op != LM_POW && op != LM_FMOD && op != LM_ATAN2 && op != LM_DIV &&
              op != LM_SILU_BACKWARD && op != LM_GELU_BACKWARD && op != LM_GELU_TANH_BACKWARD &&
              op != LM_MISH_BACKWARD && op != LM_ELU && op != LM_ELU_BACKWARD;
   if (is_bool_result(op)) pl.out_dt = LM_BOOL;
   else pl.out_via = res;
   set_params(&pl.p, common, alpha, 0.0, 0.0, 0.0);
   if (uop >= 0) {
      /* fused: only where the eager pair computes the same bits (a float result held in its own
         dtype between the two ops), and never into a given output */
      if (!fusable_unary(uop) || (op != LM_ADD && op != LM_SUB && op != LM_MUL && op != LM_DIV &&
                                  op != LM_MAXIMUM && op != LM_MINIMUM))
         return lm_error(LM_ERR_ARG, "%s followed by %s cannot be fused", binary_name(op),
                         unary_name(uop));
      /* a float16 / bfloat16 result (CPU): the kernel computes in float32 and rounds each chunk
         through the result dtype before the unary op, as the eager pair stores it between the
         two, then once more at the end: the same bits, in one pass over memory */
      const int half = res == LM_FLOAT16 || res == LM_BFLOAT16;
      int dev = LM_CPU;
      if (half) LM_TRY(inputs_device(2, tin, NULL, &dev));
      if (!((res == LM_FLOAT32 || res == LM_FLOAT64) && lm_kind_dtype(kind) == res) &&
          !(half && kind == LM_K_F32 && dev == LM_CPU))
         return lm_error(LM_ERR_DTYPE,
                         "fused %s: result dtype %s is not float32 or float64 (or a 16-bit float "
                         "on the CPU)",
                         binary_name(op), lm_dtype_name(res));
      if (*out) return lm_error(LM_ERR_ARG, "fused %s: out must be NULL", binary_name(op));
      pl.epi = uop;
      if (half) pl.epi_via = res;
      if (!has_kernel(LM_EW_UNARY, uop, kind))
         return lm_error(LM_ERR_DTYPE, "%s is not supported for %s", unary_name(uop),
                         lm_dtype_name(res));
      pl.cheap = pl.cheap && (uop == LM_NEG || uop == LM_ABS || uop == LM_RELU ||
                              uop == LM_SQUARE);
   }
   lm_operand local[2] = {ins[0], ins[1]};
   if (scalar_idx >= 0) {
      lm_store_from_double(pl.scalar, common, sval);
      lm_operand_scalar(&local[scalar_idx], pl.scalar, common, 1);
      pl.scalar_idx = scalar_idx;
      pl.scalar_dtype = common;
      pl.scalar_wrapped = 1;
   }
   if (op == LM_POW && scalar_idx == 1) {
      double e = through(sval, common);
      if (!lm_is_float_dtype(common) && e < 0)
         return lm_error(LM_ERR_DTYPE, "integers to negative integer powers are not allowed");
      int t = -1;
      if (e == 2.0) t = LM_T_POW2;
      else if (e == 3.0) t = LM_T_POW3;
      else if (e == 0.5) t = LM_T_POWHALF;
      else if (e == -1.0) t = LM_T_POWM1;
      else if (e == -0.5) t = LM_T_POWMHALF;
      else if (e == -2.0) t = LM_T_POWM2;
      if (t >= 0 && has_kernel(LM_EW_OTHER, t, kind)) {
         /* a unary kernel; the exponent stays in the layout computation as a 0-dim operand */
         lm_ew_params up;
         plan_init(&up, 1, kind, common);
         up.table = LM_EW_OTHER;
         up.kop = t;
         up.out_via = res;
         int device = LM_CPU;
         LM_TRY(inputs_device(1, tin, *out, &device));
         int nd, same;
         int64_t shape[LM_MAX_DIMS], st[LM_MAX_DIMS];
         LM_TRY(lm_iter_shape(2, local, &nd, shape, &same));
         lm_tensor *created = NULL;
         if (!*out) {
            lm_iter_output_strides(2, local, nd, shape, same, st);
            LM_TRY(lm_empty_strided(nd, shape, st, res, device, &created));
         }
         lm_tensor *o = created ? created : *out;
         lm_status s = ew_exec(&up, kind_op, res, &local[0], tin, &o);
         if (s != LM_OK) {
            lm_tensor_free(created);
            return s;
         }
         *out = o;
         return LM_OK;
      }
   }
   if (!has_kernel(LM_EW_BINARY, op, kind))
      return lm_error(LM_ERR_DTYPE, "%s is not supported for %s", binary_name(op),
                      lm_dtype_name(common));
   return ew_exec_v(&pl, kind_op, res, local, tin, out, op == LM_RELU_BACKWARD);
}

/* Can binary op with a small float tensor a take the small path (variant: 0 vv, 1 vs, 2 sv)?
   Then *pl is its plan. */
static int small_binary_plan(int op, const lm_tensor *a, lm_tensor **out, int variant,
                             double alpha, lm_ew_params *pl) {
   if (*out || op < 0 || op >= LM_NUM_BINARY || is_bool_result(op) || !small_dense_ok(a))
      return 0;
   const int kind = lm_kind_of(a->dtype);
   plan_init(pl, 2, kind, a->dtype);
   pl->table = LM_EW_BINARY;
   pl->kop = op;
   pl->variant = variant;
   set_params(&pl->p, a->dtype, alpha, 0.0, 0.0, 0.0);
   return 1;
}

lm_status lm_binary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "other"));
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   lm_ew_params pl;
   int same = small_binary_plan(op, a, out, 0, alpha, &pl) && b->dtype == a->dtype &&
              b->ndim == a->ndim && b->device == a->device;
   for (int d = 0; same && d < a->ndim; d++)
      same = a->sizes[d] == b->sizes[d] && a->strides[d] == b->strides[d];
   if (same) return small_dense_run(&pl, LM_OP_BINARY, a, b, out);
   lm_operand ins[2];
   lm_operand_tensor(&ins[0], a);
   lm_operand_tensor(&ins[1], b);
   lm_tensor *tin[2] = {(lm_tensor *)a, (lm_tensor *)b};
   return binary_impl(LM_OP_BINARY, op, ins, tin, -1, 0.0, alpha, -1, out);
}

lm_status lm_binary_scalar(int op, const lm_tensor *a, double s, int is_int, int reverse,
                           double alpha, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   /* a small float tensor with a number: the number in the tensor's dtype, as binary_impl
      stores it (pow keeps its special cases on the general path). The number is a 0-dim
      operand, so PyTorch's fast setup does not apply: the result's strides come from sorting
      the tensor's (section 6.3), which gives its own strides back, except where size-1 dims
      have strides that could sort either way; those take the general path. */
   int take = op != LM_POW;                       /* and no size-1 dims */
   for (int d = 0; take && d < a->ndim; d++) take = a->sizes[d] != 1;
   lm_ew_params pl;
   if (take && small_binary_plan(op, a, out, reverse ? 2 : 1, alpha, &pl)) {
      lm_store_from_double(pl.scalar, a->dtype, s);
      pl.scalar_idx = reverse ? 0 : 1;
      pl.scalar_dtype = a->dtype;
      pl.scalar_wrapped = 1;
      return small_dense_run(&pl, LM_OP_BINARY_SCALAR, a, NULL, out); /* sv: (scalar, tensor) */
   }
   lm_operand ins[2];
   int ti = reverse ? 1 : 0, si = reverse ? 0 : 1;
   lm_operand_tensor(&ins[ti], a);
   operand_meta(&ins[si], is_int ? LM_INT64 : LM_FLOAT64, 0);
   ins[si].wrapped = 1;
   lm_tensor *tin[2] = {NULL, NULL};
   tin[ti] = (lm_tensor *)a;
   return binary_impl(LM_OP_BINARY_SCALAR, op, ins, tin, si, s, alpha, -1, out);
}

lm_status lm_binary_unary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, int uop,
                          lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "other"));
   if (uop < 0 || uop >= LM_NUM_UNARY) return lm_error(LM_ERR_ARG, "unknown unary op %d", uop);
   lm_operand ins[2];
   lm_operand_tensor(&ins[0], a);
   lm_operand_tensor(&ins[1], b);
   lm_tensor *tin[2] = {(lm_tensor *)a, (lm_tensor *)b};
   return binary_impl(LM_OP_BINARY_UNARY, op, ins, tin, -1, 0.0, alpha, uop, out);
}

lm_status lm_binary_scalar_unary(int op, const lm_tensor *a, double s, int is_int, int reverse,
                                 double alpha, int uop, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   if (uop < 0 || uop >= LM_NUM_UNARY) return lm_error(LM_ERR_ARG, "unknown unary op %d", uop);
   lm_operand ins[2];
   int ti = reverse ? 1 : 0, si = reverse ? 0 : 1;
   lm_operand_tensor(&ins[ti], a);
   operand_meta(&ins[si], is_int ? LM_INT64 : LM_FLOAT64, 0);
   ins[si].wrapped = 1;
   lm_tensor *tin[2] = {NULL, NULL};
   tin[ti] = (lm_tensor *)a;
   return binary_impl(LM_OP_BINARY_SCALAR_UNARY, op, ins, tin, si, s, alpha, uop, out);
}

/* ---------------------------------------------------------------- ternary */

static lm_status addc_impl(int t, const lm_tensor *a, const lm_tensor *b, const lm_tensor *c,
                           double value, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "tensor1"));
   LM_TRY(check_input(c, "tensor2"));
   lm_operand ins[3];
   lm_operand_tensor(&ins[0], a);
   lm_operand_tensor(&ins[1], b);
   lm_operand_tensor(&ins[2], c);
   int common = result_type_ops(3, ins);
   if (t == LM_T_ADDCDIV && !lm_is_float_dtype(common))
      return lm_error(LM_ERR_DTYPE,
                      "integer division with addcdiv is not supported; use a floating point "
                      "tensor");
   int kind = lm_kind_of(common);
   lm_ew_params pl;
   plan_init(&pl, 3, kind, common);
   pl.table = LM_EW_OTHER;
   pl.kop = t;
   pl.out_via = common;
   set_params(&pl.p, common, 1.0, value, 0.0, 0.0);
   lm_tensor *tin[3] = {(lm_tensor *)a, (lm_tensor *)b, (lm_tensor *)c};
   return ew_exec(&pl, t == LM_T_ADDCMUL ? LM_OP_ADDCMUL : LM_OP_ADDCDIV, common, ins, tin, out);
}

lm_status lm_addcmul(const lm_tensor *a, const lm_tensor *b, const lm_tensor *c, double value,
                     lm_tensor **out) {
   return addc_impl(LM_T_ADDCMUL, a, b, c, value, out);
}

lm_status lm_addcdiv(const lm_tensor *a, const lm_tensor *b, const lm_tensor *c, double value,
                     lm_tensor **out) {
   return addc_impl(LM_T_ADDCDIV, a, b, c, value, out);
}

lm_status lm_where(const lm_tensor *cond, const lm_tensor *a, const lm_tensor *b,
                   lm_tensor **out) {
   LM_TRY(check_input(cond, "condition"));
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "other"));
   if (cond->dtype != LM_BOOL && cond->dtype != LM_UINT8)
      return lm_error(LM_ERR_DTYPE, "where expected condition to be a boolean tensor, but got %s",
                      lm_dtype_name(cond->dtype));
   lm_operand ins[3];
   lm_operand_tensor(&ins[0], cond);
   lm_operand_tensor(&ins[1], a);
   lm_operand_tensor(&ins[2], b);
   int common = result_type_ops(2, &ins[1]);
   int kind = lm_kind_of(common);
   lm_ew_params pl;
   plan_init(&pl, 3, kind, common);
   pl.in_dt[0] = LM_BOOL;
   pl.via[0] = -1;
   pl.table = LM_EW_OTHER;
   pl.kop = LM_T_WHERE;
   pl.cheap = 1;
   pl.out_via = common;
   lm_tensor *tin[3] = {(lm_tensor *)cond, (lm_tensor *)a, (lm_tensor *)b};
   return ew_exec(&pl, LM_OP_WHERE, common, ins, tin, out);
}

/* ---------------------------------------------------------------- copy and fill */

static int plain_dense_match(const lm_tensor *a, const lm_tensor *b) {
   if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
   if (!(a->flags & LM_FLAG_NOD) || !(b->flags & LM_FLAG_NOD)) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d]))
         return 0;
   return 1;
}

static int is_cuda_device(int d) { return d >= LM_CUDA0 && d < LM_CUDA0 + LM_NUM_CUDA; }
static int is_sim_device(int d) { return d >= LM_SIM0 && d < LM_SIM0 + LM_NUM_SIM; }
static int same_device_kind(int a, int b) {
   return (is_cuda_device(a) && is_cuda_device(b)) || (is_sim_device(a) && is_sim_device(b));
}

/* As PyTorch: within one device a COPY op (the device's kernel); between devices one transfer
   when the layouts match, else through host copies of both (lm_mirror_begin). Copying into a meta
   tensor checks the shapes and does nothing; copying out of one into real memory is an error. */
lm_status lm_copy_(lm_tensor *dst, const lm_tensor *src) {
   LM_CHECK_TENSOR(dst, "self");
   LM_CHECK_TENSOR(src, "src");
   LM_TRY(lm_copy_check_shape(dst->ndim, dst->sizes, src->ndim, src->sizes));
   if (dst->numel == 0) return LM_OK;
   lm_operand d;
   lm_operand_tensor(&d, dst);
   if (lm_operand_internal_overlap(&d)) return lm_overlap_error();
   if (dst->device == LM_META) return LM_OK;
   if (src->device == LM_META)
      return lm_error(LM_ERR_DEVICE, "cannot copy out of a meta tensor: it has no data");
   if (dst->device == src->device) {
      lm_tensor *ts[2] = {dst, (lm_tensor *)src};
      const lm_op op = lm_op_make(LM_OP_COPY, 2, ts, NULL);
      return lm_dispatch(&op);
   }
   /* another device on one side: one transfer when the layouts match and one backend can do it
      (host <-> device, or between two devices of one kind: cuda:0 -> cuda:1 by the runtime's
      peer copy); else through host copies (sim:0 -> cuda:0: neither backend can read the
      other's memory) */
   if (plain_dense_match(dst, src) &&
       (src->device == LM_CPU || dst->device == LM_CPU || same_device_kind(src->device, dst->device))) {
      size_t nbytes = (size_t)dst->numel * (size_t)lm_dtype_size(dst->dtype);
      int dir = src->device == LM_CPU ? 0 : dst->device == LM_CPU ? 1 : 2;
      const lm_backend *ops = lm_backend_get(dir == 1 ? src->device : dst->device);
      if (!ops) return LM_ERR_DEVICE;
      /* a NOD tensor occupies exactly numel elements from its lowest address, which is element
         0 since strides are non-negative */
      return ops->memcpy(ops, lm_tensor_data(dst), lm_tensor_data(src), nbytes, dir);
   }
   lm_host_mirror md, ms;
   LM_TRY(lm_mirror_begin(src, 1, &ms));
   lm_status st = lm_mirror_begin(dst, 1, &md);
   if (st != LM_OK) {
      lm_mirror_end(&ms, 0);
      return st;
   }
   st = lm_copy_operands(&md.op, &ms.op);
   lm_status st2 = lm_mirror_end(&md, st == LM_OK);
   lm_mirror_end(&ms, 0);
   return st != LM_OK ? st : st2;
}

lm_status lm_fill_(lm_tensor *t, double value) {
   LM_CHECK_TENSOR(t, "self");
   if (t->numel == 0) return LM_OK;
   lm_fill_params p;
   memset(&p, 0, sizeof p);
   lm_store_from_double(p.value, t->dtype, value);
   lm_tensor *ts[1] = {t};
   const lm_op op = lm_op_make(LM_OP_FILL, 1, ts, &p);
   return lm_dispatch(&op);
}

/* ---------------------------------------------------------------- fused optimizer steps */

/* The optimizers' per-parameter updates in one pass (src/nn.h): the checks here, the loops in
   kernels/cpu/optim.c (parameters: ops/optim.h). Every operand has the parameter's dtype
   (float32 / float64), sizes and strides and is non-overlapping and dense, and lives on the
   parameter's device. */

static lm_status optim_operand(const lm_tensor *p, const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   LM_TRY(lm_check_same_device(p, t, what));
   if (t->dtype != p->dtype)
      return lm_error(LM_ERR_DTYPE, "%s has dtype %s, the parameter %s", what,
                      lm_dtype_name(t->dtype), lm_dtype_name(p->dtype));
   if (t->ndim != p->ndim || memcmp(t->sizes, p->sizes, sizeof(int64_t) * (size_t)p->ndim) != 0 ||
       memcmp(t->strides, p->strides, sizeof(int64_t) * (size_t)p->ndim) != 0 ||
       !lm_is_non_overlapping_and_dense(t))
      return lm_error(LM_ERR_ARG, "%s must have the parameter's sizes and strides, dense", what);
   return LM_OK;
}

static lm_status optim_param(const lm_tensor *p) {
   if (!p) return lm_error(LM_ERR_ARG, "param is nil");
   if (p->dtype != LM_FLOAT32 && p->dtype != LM_FLOAT64)
      return lm_error(LM_ERR_DTYPE, "fused optimizer steps take float32 or float64, got %s",
                      lm_dtype_name(p->dtype));
   if (!lm_is_non_overlapping_and_dense(p))
      return lm_error(LM_ERR_ARG, "param must be non-overlapping and dense");
   return LM_OK;
}

static lm_status sgd_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                          double lr, const lm_tensor *lr_t, double momentum, double dampening,
                          double weight_decay, int nesterov, int maximize, int first) {
   LM_TRY(optim_param(param));
   LM_TRY(optim_operand(param, grad, "grad"));
   if (momentum != 0) LM_TRY(optim_operand(param, momentum_buffer, "momentum_buffer"));
   if (lr_t) {
      if (lr_t->dtype != LM_FLOAT64 || lr_t->numel != 1)
         return lm_error(LM_ERR_ARG, "sgd_step: lr must be a float64 tensor of one element, got "
                         "%s with %lld elements", lm_dtype_name(lr_t->dtype),
                         (long long)lr_t->numel);
      LM_TRY(lm_check_same_device(param, lr_t, "sgd_step"));
   }
   if (param->numel == 0) return LM_OK;
   const lm_sgd_params p = {lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0,
                            first != 0};
   lm_tensor *ts[4] = {param, (lm_tensor *)grad, momentum != 0 ? momentum_buffer : NULL,
                       (lm_tensor *)lr_t};
   const lm_op op = lm_op_make(LM_OP_SGD_STEP, 4, ts, &p);
   return lm_dispatch(&op);
}

lm_status lm_sgd_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int maximize, int first) {
   return sgd_step(param, grad, momentum_buffer, lr, NULL, momentum, dampening, weight_decay,
                   nesterov, maximize, first);
}

lm_status lm_sgd_step_lr(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                         const lm_tensor *lr, double momentum, double dampening,
                         double weight_decay, int nesterov, int maximize, int first) {
   if (!lr) return lm_error(LM_ERR_ARG, "sgd_step: lr is nil");
   return sgd_step(param, grad, momentum_buffer, 0.0, lr, momentum, dampening, weight_decay,
                   nesterov, maximize, first);
}

/* a one-element float64 tensor on param's device (the capturable steps' lr and step) */
static lm_status optim_scalar(const lm_tensor *param, const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   if (t->dtype != LM_FLOAT64 || t->numel != 1)
      return lm_error(LM_ERR_ARG, "%s must be a float64 tensor of one element, got %s with %lld "
                      "elements", what, lm_dtype_name(t->dtype), (long long)t->numel);
   return lm_check_same_device(param, t, what);
}

static lm_status adam_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                           lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, double lr,
                           const lm_tensor *lr_t, const lm_tensor *step_t, double beta1,
                           double beta2, double eps, double weight_decay, int decoupled,
                           int maximize, int64_t step) {
   LM_TRY(optim_param(param));
   LM_TRY(optim_operand(param, grad, "grad"));
   LM_TRY(optim_operand(param, exp_avg, "exp_avg"));
   LM_TRY(optim_operand(param, exp_avg_sq, "exp_avg_sq"));
   if (max_exp_avg_sq) LM_TRY(optim_operand(param, max_exp_avg_sq, "max_exp_avg_sq"));
   if (lr_t) {
      LM_TRY(optim_scalar(param, lr_t, "adam step: lr"));
      LM_TRY(optim_scalar(param, step_t, "adam step: step"));
   } else if (step < 1) {
      return lm_error(LM_ERR_ARG, "adam step: step must be >= 1, got %lld", (long long)step);
   }
   if (param->numel == 0) return LM_OK;
   const lm_adam_params p = {lr, beta1, beta2, eps, weight_decay, decoupled != 0, maximize != 0,
                             lr_t ? 1 : step};
   lm_tensor *ts[7] = {param, (lm_tensor *)grad, exp_avg, exp_avg_sq, max_exp_avg_sq,
                       (lm_tensor *)lr_t, (lm_tensor *)step_t};
   const lm_op op = lm_op_make(LM_OP_ADAM_STEP, 7, ts, &p);
   return lm_dispatch(&op);
}

lm_status lm_adam_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                       lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, double lr, double beta1,
                       double beta2, double eps, double weight_decay, int decoupled,
                       int maximize, int64_t step) {
   return adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lr, NULL, NULL, beta1,
                    beta2, eps, weight_decay, decoupled, maximize, step);
}

lm_status lm_adam_step_dev(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                           lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, const lm_tensor *lr,
                           const lm_tensor *step, double beta1, double beta2, double eps,
                           double weight_decay, int decoupled, int maximize) {
   if (!lr) return lm_error(LM_ERR_ARG, "adam step: lr is nil");
   return adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, 0.0, lr, step, beta1,
                    beta2, eps, weight_decay, decoupled, maximize, 1);
}
