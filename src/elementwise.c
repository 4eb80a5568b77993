/* elementwise.c -- the elementwise engine: type promotion (PyTorch's ResultTypeState), output
 * allocation by the TensorIterator rules (iter.c), and the gather / compute / scatter loop that
 * feeds the kernels of ew_kernels.c. Also copy_, fill_, where, clamp, addcmul/addcdiv. */
#include "iter.h"
#include "nn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

/* ---------------------------------------------------------------- the engine */

typedef struct ew_plan {
   int nin;
   int in_dt[3];  /* dtype the kernel reads for each input (float32 / float64 / int64 / bool) */
   int via[3];    /* dtype each input is cast to first (PyTorch's common dtype), -1: none */
   int out_dt;    /* dtype the kernel writes */
   int out_via;   /* the op's result dtype, when the kernel's output must round through it */
   lm_kset k;
   lm_kparams p;
   int cheap;     /* a memory-bound kernel: parallel only from LM_CHEAP_GRAIN elements */
   lm_kfn epi;    /* a unary kernel applied in place to each computed chunk (fused ops), or NULL */
   lm_kparams ep; /* its parameters */
} ew_plan;

typedef struct ew_ctx {
   const ew_plan *pl;
   int dt[4];  /* operand dtypes: out, inputs */
   int stream; /* write the (fresh, dense, cold) output with streaming stores */
   int wide;   /* ... of whole 64-byte lines: the AVX-512 path is in use (lm_gemm_isa) */
} ew_ctx;

/* n bytes from an L1-resident buffer to dst with non-temporal stores: whole 64-byte lines with
 * AVX-512 (wide: the ISA lumen uses, as for the kernels, so a forced lower ISA is honoured) where
 * dst is line-aligned (every chunk of a fresh block is), else
 * 16-byte stores where dst is 16-byte aligned; ordinary stores for an unaligned head and the
 * tail. Measured, -x on 8x64x56x56 into cold blocks, one thread: 0.185-0.206 -> 0.165-0.188 ms
 * (the raw memory floor here: 0.175-0.21 ms). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void stream_bytes512(char *dst, const char *src,
                                                                 int64_t n) {
   int64_t i = 0;
   for (; i + 64 <= n; i += 64)
      _mm512_stream_si512((void *)(dst + i), _mm512_loadu_si512((const void *)(src + i)));
   memcpy(dst + i, src + i, (size_t)(n - i));
}
#endif

static void stream_bytes(char *dst, const char *src, int64_t n, int wide) {
#if defined(__x86_64__)
   if (wide && ((uintptr_t)dst & 63) == 0) {
      stream_bytes512(dst, src, n);
      return;
   }
   int64_t head = (int64_t)((16 - ((uintptr_t)dst & 15)) & 15);
   if (head > n) head = n;
   memcpy(dst, src, (size_t)head);
   int64_t i = head;
   for (; i + 16 <= n; i += 16)
      _mm_stream_si128((__m128i *)(void *)(dst + i),
                       _mm_loadu_si128((const __m128i *)(const void *)(src + i)));
   memcpy(dst + i, src + i, (size_t)(n - i));
#else
   (void)wide;
   memcpy(dst, src, (size_t)n);
#endif
}

#define LM_STREAM_MIN_BYTES ((int64_t)1 << 20)

/* LUMEN_EW_STREAM=0 / 1: never / always stream large fresh outputs (specs, benchmarks); by
   default only cold ones */
static int want_stream(const lm_tensor *o) {
   if (o->numel * lm_elsize(o->dtype) < LM_STREAM_MIN_BYTES) return 0;
   const char *e = getenv("LUMEN_EW_STREAM");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) return e[0] == '1';
   return lm_tensor_block_cold(o);
}

/* src (dtype sdt, byte stride ss) -> dst of dtype ddt (dense), optionally rounding through via */
static void convert_via(int ddt, char *dst, int via, int sdt, const char *src, int64_t ss,
                        int64_t m, char *tmp) {
   if (via >= 0 && sdt != via && via != ddt) {
      int vs = lm_dtype_size(via);
      lm_convert(via, tmp, vs, sdt, src, ss, m);
      lm_convert(ddt, dst, lm_dtype_size(ddt), via, tmp, vs, m);
   } else {
      lm_convert(ddt, dst, lm_dtype_size(ddt), sdt, src, ss, m);
   }
}

static void ew_loop(void *ctx_, char **data, const int64_t *st, int64_t n) {
   const ew_ctx *cx = ctx_;
   const ew_plan *pl = cx->pl;
   const int nin = pl->nin;
   _Alignas(64) char buf[3][LM_CHUNK * 8];
   _Alignas(64) char obuf[LM_CHUNK * 8];
   _Alignas(64) char tmp[LM_CHUNK * 8];
   _Alignas(64) char sbuf[3][16];
   int mode[3] = {0, 0, 0}; /* 0: dense, usable in place; 1: one element (stride 0); 2: gather */
   int plain[3] = {1, 1, 1};
   for (int k = 0; k < nin; k++) {
      int dt = cx->dt[k + 1];
      plain[k] = dt == pl->in_dt[k] && !(pl->via[k] >= 0 && dt != pl->via[k]);
      if (st[k + 1] == 0) mode[k] = 1;
      else if (plain[k] && st[k + 1] == lm_dtype_size(pl->in_dt[k])) mode[k] = 0;
      else mode[k] = 2;
   }
   lm_kfn fn = pl->k.vv;
   int as_scalar[3] = {0, 0, 0};
   if (nin == 2) {
      if (mode[1] == 1 && pl->k.vs) {
         fn = pl->k.vs;
         as_scalar[1] = 1;
      } else if (mode[0] == 1 && pl->k.sv) {
         fn = pl->k.sv;
         as_scalar[0] = 1;
      }
   }
   const int oes = lm_dtype_size(pl->out_dt);
   const int odirect = cx->dt[0] == pl->out_dt && st[0] == oes &&
                       !(pl->out_via >= 0 && pl->out_via != pl->out_dt);
   const char *ptr[3] = {NULL, NULL, NULL};
   int gather = 0;
   for (int k = 0; k < nin; k++) {
      if (mode[k] == 1) {
         if (plain[k]) {
            ptr[k] = data[k + 1];
         } else {
            convert_via(pl->in_dt[k], sbuf[k], pl->via[k], cx->dt[k + 1], data[k + 1], 0, 1, tmp);
            ptr[k] = sbuf[k];
         }
         if (!as_scalar[k]) { /* materialize a chunk of copies */
            lm_convert(pl->in_dt[k], buf[k], lm_dtype_size(pl->in_dt[k]), pl->in_dt[k], ptr[k], 0,
                       LM_CHUNK);
            ptr[k] = buf[k];
            gather = 1;
         }
      } else if (mode[k] == 2) {
         gather = 1;
      }
   }
   if (!gather && odirect) {
      /* everything dense in the kernel's types: one call over the whole run */
      const char *p3[3];
      for (int k = 0; k < 3; k++) p3[k] = (k < nin && mode[k] == 0) ? data[k + 1] : ptr[k];
      if (!cx->stream && !pl->epi) {
         fn(data[0], p3[0], p3[1], p3[2], n, &pl->p);
         return;
      }
      /* a cold output or a fused epilogue: compute a chunk (in L1), apply the epilogue to it,
         then store it (streaming stores for a cold output) */
      for (int64_t j = 0; j < n; j += LM_CHUNK) {
         int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
         const char *q[3];
         for (int k = 0; k < 3; k++)
            q[k] = (k < nin && mode[k] == 0) ? p3[k] + j * st[k + 1] : p3[k];
         char *dst = data[0] + j * st[0];
         char *o = cx->stream ? obuf : dst;
         fn(o, q[0], q[1], q[2], m, &pl->p);
         if (pl->epi) pl->epi(o, o, NULL, NULL, m, &pl->ep);
         if (cx->stream) stream_bytes(dst, obuf, m * oes, cx->wide);
      }
      if (!cx->stream) return;
#if defined(__x86_64__)
      _mm_sfence();
#endif
      return;
   }
   for (int64_t j = 0; j < n; j += LM_CHUNK) {
      int64_t m = n - j < LM_CHUNK ? n - j : LM_CHUNK;
      for (int k = 0; k < nin; k++) {
         if (mode[k] == 0) {
            ptr[k] = data[k + 1] + j * st[k + 1];
         } else if (mode[k] == 2) {
            convert_via(pl->in_dt[k], buf[k], pl->via[k], cx->dt[k + 1], data[k + 1] + j * st[k + 1],
                        st[k + 1], m, tmp);
            ptr[k] = buf[k];
         }
      }
      char *op = odirect ? data[0] + j * st[0] : obuf;
      fn(op, ptr[0], ptr[1], ptr[2], m, &pl->p);
      if (pl->epi) pl->epi(op, op, NULL, NULL, m, &pl->ep);
      if (!odirect) {
         char *dst = data[0] + j * st[0];
         int via = pl->out_via;
         if (via >= 0 && via != pl->out_dt && via != cx->dt[0]) {
            lm_convert(via, tmp, lm_dtype_size(via), pl->out_dt, obuf, oes, m);
            lm_convert(cx->dt[0], dst, st[0], via, tmp, lm_dtype_size(via), m);
         } else {
            lm_convert(cx->dt[0], dst, st[0], pl->out_dt, obuf, oes, m);
         }
      }
   }
}

static void shape_str(char *buf, size_t cap, int nd, const int64_t *sz) {
   size_t n = 0;
   n += (size_t)snprintf(buf + n, cap - n, "[");
   for (int d = 0; d < nd && n < cap; d++)
      n += (size_t)snprintf(buf + n, cap - n, d ? ", %lld" : "%lld", (long long)sz[d]);
   if (n < cap) snprintf(buf + n, cap - n, "]");
}

static lm_status check_out_shape(const lm_tensor *o, int nd, const int64_t *shape) {
   int ok = o->ndim == nd;
   for (int d = 0; ok && d < nd; d++) ok = o->sizes[d] == shape[d];
   if (!ok) {
      char a[160], b[160];
      shape_str(a, sizeof a, o->ndim, o->sizes);
      shape_str(b, sizeof b, nd, shape);
      return lm_error(LM_ERR_SHAPE, "output with shape %s doesn't match the broadcast shape %s", a,
                      b);
   }
   return LM_OK;
}

static lm_status overlap_error(void) {
   return lm_error(LM_ERR_ARG,
                   "unsupported operation: more than one element of the written-to tensor refers "
                   "to a single memory location. Please clone() the tensor before performing the "
                   "operation.");
}

static int same_shape(const lm_operand *a, const lm_operand *b) {
   if (a->ndim != b->ndim) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->sizes[d] != b->sizes[d]) return 0;
   return 1;
}

/* a dense copy of an operand that partially overlaps the output */
static lm_status materialize(lm_operand *op, lm_tensor **tmp) {
   LM_TRY(lm_empty(op->ndim, op->sizes, op->dtype, LM_CONTIGUOUS, LM_CPU, tmp));
   lm_operand t;
   lm_operand_tensor(&t, *tmp);
   lm_status st = lm_copy_operands(&t, op);
   if (st != LM_OK) {
      lm_tensor_free(*tmp);
      *tmp = NULL;
      return st;
   }
   t.wrapped = op->wrapped;
   *op = t;
   return LM_OK;
}

/* Run plan over the inputs into *out (allocated with result dtype res_dt and the TensorIterator
   layout when *out is NULL). swap_vote: the layout votes with inputs 1, 0 (threshold_backward). */
static lm_status ew_exec_v(ew_plan *pl, int res_dt, lm_operand *ins, lm_tensor **out,
                           int swap_vote) {
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   const int nin = pl->nin;
   int nd, same;
   int64_t shape[LM_MAX_DIMS];
   LM_TRY(lm_iter_shape(nin, ins, &nd, shape, &same));
   lm_tensor *o = *out, *created = NULL;
   if (o) {
      LM_TRY(lm_check_cpu(o, "out"));
      LM_TRY(check_out_shape(o, nd, shape));
      if (!lm_can_cast(res_dt, o->dtype))
         return lm_error(LM_ERR_DTYPE, "result type %s can't be cast to the desired output type %s",
                         lm_dtype_name(res_dt), lm_dtype_name(o->dtype));
   } else {
      int64_t st[LM_MAX_DIMS];
      if (swap_vote && nin == 2) {
         lm_operand sw[2] = {ins[1], ins[0]};
         lm_iter_output_strides(nin, sw, nd, shape, same, st);
      } else {
         lm_iter_output_strides(nin, ins, nd, shape, same, st);
      }
      if (pl->epi) {
         /* fused binary + unary: the layout the unary op gives the binary op's result (they
            differ in the strides of size-1 dims) */
         lm_operand mid;
         lm_operand_set(&mid, NULL, res_dt, nd, shape, st);
         int nd1, same1;
         int64_t shape1[LM_MAX_DIMS];
         LM_TRY(lm_iter_shape(1, &mid, &nd1, shape1, &same1));
         lm_iter_output_strides(1, &mid, nd1, shape1, same1, st);
      }
      LM_TRY(lm_empty_strided(nd, shape, st, res_dt, LM_CPU, &created));
      o = created;
   }
   lm_operand ops[4];
   lm_operand_tensor(&ops[0], o);
   lm_tensor *tmps[3] = {NULL, NULL, NULL};
   lm_status status = LM_OK;
   if (!created) {
      if (lm_operand_internal_overlap(&ops[0])) return overlap_error();
      for (int k = 0; k < nin && status == LM_OK; k++)
         if (lm_operands_overlap(&ops[0], &ins[k]) == 2) status = materialize(&ins[k], &tmps[k]);
   }
   int err = 0;
   if (status == LM_OK && o->numel > 0) {
      for (int k = 0; k < nin; k++) ops[k + 1] = ins[k];
      lm_iter it;
      lm_iter_init(&it, nin + 1, ops, nd, shape);
      /* an input of the output's shape laid out in another order (NCHW + NHWC) would be read
         with a large stride in the inner loop: transpose it into the output's layout first
         (a blocked copy), then run a plain dense loop */
      int redo = 0;
      for (int k = 0; k < nin && status == LM_OK && o->numel >= 4096; k++) {
         int64_t es = lm_elsize(ops[k + 1].dtype), s0 = it.strides[k + 1][0];
         if (s0 == 0 || s0 == es || it.shape[0] < 4 || !same_shape(&ops[k + 1], &ops[0]) ||
             tmps[k])
            continue;
         int unit = 0;
         for (int d = 1; d < it.ndim; d++) unit |= it.strides[k + 1][d] == es && it.shape[d] >= 4;
         if (!unit) continue;
         status = lm_empty_strided(nd, shape, o->strides, ops[k + 1].dtype, LM_CPU, &tmps[k]);
         if (status != LM_OK) break;
         lm_operand t;
         lm_operand_tensor(&t, tmps[k]);
         status = lm_copy_operands(&t, &ops[k + 1]);
         t.wrapped = ops[k + 1].wrapped;
         ops[k + 1] = t;
         redo = 1;
      }
      if (redo && status == LM_OK) lm_iter_init(&it, nin + 1, ops, nd, shape);
      ew_ctx cx;
      cx.pl = pl;
      cx.stream = created != NULL && want_stream(o);
      cx.wide = cx.stream && lm_gemm_isa() >= 3;
      for (int k = 0; k <= nin; k++) cx.dt[k] = ops[k].dtype;
      pl->p.err = &err;
      if (status == LM_OK)
         lm_iter_run_grain(&it, ew_loop, &cx, pl->cheap ? LM_CHEAP_GRAIN : LM_PARALLEL_GRAIN);
      if (status == LM_OK && cx.stream)
         lm_tensor_note_streamed(o);
      pl->p.err = NULL;
   }
   for (int k = 0; k < 3; k++) lm_tensor_free(tmps[k]);
   if (status == LM_OK && err) status = lm_error(LM_ERR_ARG, "ZeroDivisionError");
   if (status != LM_OK) {
      lm_tensor_free(created);
      return status;
   }
   *out = o;
   return LM_OK;
}

static lm_status ew_exec(ew_plan *pl, int res_dt, lm_operand *ins, lm_tensor **out) {
   return ew_exec_v(pl, res_dt, ins, out, 0);
}

static void plan_init(ew_plan *pl, int nin, int kind, int common) {
   memset(pl, 0, sizeof *pl);
   pl->nin = nin;
   int kdt = lm_kind_dtype(kind);
   for (int k = 0; k < 3; k++) {
      pl->in_dt[k] = kdt;
      pl->via[k] = common != kdt ? common : -1;
   }
   pl->out_dt = kdt;
   pl->out_via = -1;
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
   return lm_check_cpu(t, name);
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
   return lm_empty_strided(a->ndim, a->sizes, ost, a->dtype, LM_CPU, o);
}

/* fn(result, x, y) into a new small result *out shaped like a, x and y being a's data and the
   other operand's (b's data, a scalar, or NULL), in the kernel's order (other_first: the other
   operand is x) */
static lm_status small_dense_run(lm_kfn fn, const lm_tensor *a, const void *other,
                                 int other_first, const lm_kparams *p, lm_tensor **out) {
   lm_tensor *o = NULL;
   LM_TRY(small_dense_out(a, &o));
   const void *ad = lm_tensor_data(a);
   fn(lm_tensor_data(o), other_first ? other : ad, other_first ? ad : other, NULL, a->numel, p);
   *out = o;
   return LM_OK;
}

/* ---------------------------------------------------------------- unary */

static const char *unary_name(int op) {
   static const char *names[LM_NUM_UNARY] = {
      "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "square",
      "reciprocal", "sign", "logical_not", "floor", "ceil", "round", "sin", "cos", "log1p",
      "expm1"};
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
   ew_plan pl;
   plan_init(&pl, 1, kind, common);
   pl.k = lm_unary_kernels[op][kind];
   pl.cheap = op == LM_NEG || op == LM_ABS || op == LM_RELU || op == LM_SQUARE ||
              op == LM_SIGN || op == LM_LOGICAL_NOT || op == LM_FLOOR || op == LM_CEIL ||
              op == LM_ROUND;
   if (op == LM_LOGICAL_NOT) pl.out_dt = LM_BOOL;
   else pl.out_via = res;
   if (!pl.k.vv)
      return lm_error(LM_ERR_DTYPE, "%s is not supported for %s tensors", unary_name(op),
                      lm_dtype_name(dt));
   if (out && !*out && op != LM_LOGICAL_NOT && res == dt && small_dense_ok(a))
      return small_dense_run(pl.k.vv, a, NULL, 0, &pl.p, out);
   lm_operand in;
   lm_operand_tensor(&in, a);
   return ew_exec(&pl, res, &in, out);
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
   ew_plan pl;
   plan_init(&pl, 1, kind, res);
   pl.out_via = res;
   pl.cheap = 1;
   int t = (has_lo && has_hi) ? LM_T_CLAMP : has_lo ? LM_T_CLAMP_MIN : LM_T_CLAMP_MAX;
   pl.k = lm_other_kernels[t][kind];
   set_params(&pl.p, res, 1.0, 0.0, has_lo ? lo : 0.0, has_hi ? hi : 0.0);
   lm_operand in;
   lm_operand_tensor(&in, a);
   return ew_exec(&pl, res, &in, out);
}

/* ---------------------------------------------------------------- binary */

static const char *binary_name(int op) {
   static const char *names[LM_NUM_BINARY] = {
      "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
      "ge", "logical_and", "logical_or", "relu_backward", "sigmoid_backward", "tanh_backward",
      "fmod", "atan2"};
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
static lm_status binary_impl(int op, lm_operand *ins, int scalar_idx, double sval, double alpha,
                             int uop, lm_tensor **out) {
   if (op < 0 || op >= LM_NUM_BINARY) return lm_error(LM_ERR_ARG, "unknown binary op %d", op);
   int common = result_type_ops(2, ins);
   int res;
   if (is_bool_result(op)) {
      res = LM_BOOL;
   } else {
      if ((op == LM_DIV || op == LM_ATAN2) && !lm_is_float_dtype(common)) common = LM_FLOAT32;
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
   ew_plan pl;
   plan_init(&pl, 2, kind, common);
   pl.k = lm_binary_kernels[op][kind];
   pl.cheap = op != LM_POW && op != LM_FMOD && op != LM_ATAN2 && op != LM_DIV;
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
      if ((res != LM_FLOAT32 && res != LM_FLOAT64) || lm_kind_dtype(kind) != res)
         return lm_error(LM_ERR_DTYPE, "fused %s: result dtype %s is not float32 or float64",
                         binary_name(op), lm_dtype_name(res));
      if (*out) return lm_error(LM_ERR_ARG, "fused %s: out must be NULL", binary_name(op));
      pl.epi = lm_unary_kernels[uop][kind].vv;
      if (!pl.epi)
         return lm_error(LM_ERR_DTYPE, "%s is not supported for %s", unary_name(uop),
                         lm_dtype_name(res));
      pl.cheap = pl.cheap && (uop == LM_NEG || uop == LM_ABS || uop == LM_RELU ||
                              uop == LM_SQUARE);
   }
   _Alignas(16) char sbuf[16];
   lm_operand local[2] = {ins[0], ins[1]};
   if (scalar_idx >= 0) {
      lm_store_from_double(sbuf, common, sval);
      lm_operand_scalar(&local[scalar_idx], sbuf, common, 1);
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
      if (t >= 0 && lm_other_kernels[t][kind].vv) {
         /* a unary kernel; the exponent stays in the layout computation as a 0-dim operand */
         ew_plan up;
         plan_init(&up, 1, kind, common);
         up.k = lm_other_kernels[t][kind];
         up.out_via = res;
         int nd, same;
         int64_t shape[LM_MAX_DIMS], st[LM_MAX_DIMS];
         LM_TRY(lm_iter_shape(2, local, &nd, shape, &same));
         lm_tensor *created = NULL;
         if (!*out) {
            lm_iter_output_strides(2, local, nd, shape, same, st);
            LM_TRY(lm_empty_strided(nd, shape, st, res, LM_CPU, &created));
         }
         lm_tensor *o = created ? created : *out;
         lm_status s = ew_exec(&up, res, &local[0], &o);
         if (s != LM_OK) {
            lm_tensor_free(created);
            return s;
         }
         *out = o;
         return LM_OK;
      }
   }
   if (!pl.k.vv)
      return lm_error(LM_ERR_DTYPE, "%s is not supported for %s", binary_name(op),
                      lm_dtype_name(common));
   return ew_exec_v(&pl, res, local, out, op == LM_RELU_BACKWARD);
}

/* the small path's kernel for binary op with a small float tensor a (vv, or the one-element
   variant: vs / sv), or NULL to take the general path; *p gets the op's parameters */
static lm_kfn small_binary_kernel(int op, const lm_tensor *a, lm_tensor **out, int variant,
                                  double alpha, lm_kparams *p) {
   if (*out || op < 0 || op >= LM_NUM_BINARY || is_bool_result(op) || !small_dense_ok(a))
      return NULL;
   const lm_kset *k = &lm_binary_kernels[op][lm_kind_of(a->dtype)];
   memset(p, 0, sizeof *p);
   set_params(p, a->dtype, alpha, 0.0, 0.0, 0.0);
   return variant == 0 ? k->vv : variant == 1 ? k->vs : k->sv;
}

lm_status lm_binary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "other"));
   if (!out) return lm_error(LM_ERR_ARG, "output pointer is NULL");
   lm_kparams p;
   const lm_kfn fn = small_binary_kernel(op, a, out, 0, alpha, &p);
   int same = fn && b->dtype == a->dtype && b->ndim == a->ndim;
   for (int d = 0; same && d < a->ndim; d++)
      same = a->sizes[d] == b->sizes[d] && a->strides[d] == b->strides[d];
   if (same) return small_dense_run(fn, a, lm_tensor_data(b), 0, &p, out);
   lm_operand ins[2];
   lm_operand_tensor(&ins[0], a);
   lm_operand_tensor(&ins[1], b);
   return binary_impl(op, ins, -1, 0.0, alpha, -1, out);
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
   lm_kparams p;
   const lm_kfn fn = take ? small_binary_kernel(op, a, out, reverse ? 2 : 1, alpha, &p) : NULL;
   if (fn) {
      _Alignas(16) char sb[16];
      lm_store_from_double(sb, a->dtype, s);
      return small_dense_run(fn, a, sb, reverse, &p, out);   /* sv: (scalar, tensor) */
   }
   lm_operand ins[2];
   int ti = reverse ? 1 : 0, si = reverse ? 0 : 1;
   lm_operand_tensor(&ins[ti], a);
   operand_meta(&ins[si], is_int ? LM_INT64 : LM_FLOAT64, 0);
   ins[si].wrapped = 1;
   return binary_impl(op, ins, si, s, alpha, -1, out);
}

lm_status lm_binary_unary(int op, const lm_tensor *a, const lm_tensor *b, double alpha, int uop,
                          lm_tensor **out) {
   LM_TRY(check_input(a, "input"));
   LM_TRY(check_input(b, "other"));
   if (uop < 0 || uop >= LM_NUM_UNARY) return lm_error(LM_ERR_ARG, "unknown unary op %d", uop);
   lm_operand ins[2];
   lm_operand_tensor(&ins[0], a);
   lm_operand_tensor(&ins[1], b);
   return binary_impl(op, ins, -1, 0.0, alpha, uop, out);
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
   return binary_impl(op, ins, si, s, alpha, uop, out);
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
   ew_plan pl;
   plan_init(&pl, 3, kind, common);
   pl.k = lm_other_kernels[t][kind];
   pl.out_via = common;
   set_params(&pl.p, common, 1.0, value, 0.0, 0.0);
   return ew_exec(&pl, common, ins, out);
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
   ew_plan pl;
   plan_init(&pl, 3, kind, common);
   pl.in_dt[0] = LM_BOOL;
   pl.via[0] = -1;
   pl.k = lm_other_kernels[LM_T_WHERE][kind];
   pl.cheap = 1;
   pl.out_via = common;
   return ew_exec(&pl, common, ins, out);
}

/* ---------------------------------------------------------------- copy and fill */

static void copy_loop(void *ctx, char **data, const int64_t *st, int64_t n) {
   const int *dt = ctx;
   lm_convert(dt[0], data[0], st[0], dt[1], data[1], st[1], n);
}

enum { TB = 32 }; /* transpose tile */

#define TILE_FN(NAME, T)                                                                        \
   static void NAME(char *d, int64_t dk, const char *s, int64_t s0, int64_t n0, int64_t nk) {   \
      for (int64_t k = 0; k < nk; k++) {                                                        \
         T *dd = (T *)(d + k * dk);                                                             \
         const char *ss = s + k * (int64_t)sizeof(T);                                           \
         for (int64_t i = 0; i < n0; i++) dd[i] = *(const T *)(ss + i * s0);                    \
      }                                                                                         \
   }
TILE_FN(tile1, uint8_t)
TILE_FN(tile2, uint16_t)
TILE_FN(tile8, uint64_t)

/* 4-byte elements: 4x4 blocks transposed in SSE registers (bits only move, nothing is computed) */
static void tile4(char *d, int64_t dk, const char *s, int64_t s0, int64_t n0, int64_t nk) {
   int64_t k = 0;
   for (; k + 4 <= nk; k += 4) {
      int64_t i = 0;
      for (; i + 4 <= n0; i += 4) {
         const char *sp = s + i * s0 + k * 4;
         __m128 r0 = _mm_loadu_ps((const float *)sp);
         __m128 r1 = _mm_loadu_ps((const float *)(sp + s0));
         __m128 r2 = _mm_loadu_ps((const float *)(sp + 2 * s0));
         __m128 r3 = _mm_loadu_ps((const float *)(sp + 3 * s0));
         _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
         char *dp = d + k * dk + i * 4;
         _mm_storeu_ps((float *)dp, r0);
         _mm_storeu_ps((float *)(dp + dk), r1);
         _mm_storeu_ps((float *)(dp + 2 * dk), r2);
         _mm_storeu_ps((float *)(dp + 3 * dk), r3);
      }
      for (; i < n0; i++)
         for (int64_t kk = k; kk < k + 4; kk++)
            *(uint32_t *)(d + kk * dk + i * 4) = *(const uint32_t *)(s + i * s0 + kk * 4);
   }
   for (; k < nk; k++)
      for (int64_t i = 0; i < n0; i++)
         *(uint32_t *)(d + k * dk + i * 4) = *(const uint32_t *)(s + i * s0 + k * 4);
}

/* same-dtype copy where dst is unit-stride in iteration dim 0 and src in dim kd: tiles */
static void transpose_copy(const lm_iter *it, int kd, int es) {
   const int64_t n0 = it->shape[0], nk = it->shape[kd];
   const int64_t d0 = it->strides[0][0], dk = it->strides[0][kd];
   const int64_t s0 = it->strides[1][0], sk = it->strides[1][kd];
   int odims[LM_MAX_DIMS], no = 0;
   int64_t outer = 1;
   for (int d = 1; d < it->ndim; d++)
      if (d != kd) {
         odims[no++] = d;
         outer *= it->shape[d];
      }
   const int64_t ntk = (nk + TB - 1) / TB;
   const int64_t tasks = outer * ntk;
   void (*tile)(char *, int64_t, const char *, int64_t, int64_t, int64_t) =
      es == 1 ? tile1 : es == 2 ? tile2 : es == 4 ? tile4 : tile8;
   int nt = lm_iter_threads(it->numel);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
   for (int64_t task = 0; task < tasks; task++) {
      int64_t o = task / ntk, tk = task % ntk;
      uintptr_t dp = it->base[0], sp = it->base[1];
      int64_t r = o;
      for (int j = 0; j < no; j++) {
         int d = odims[j];
         int64_t i = r % it->shape[d];
         r /= it->shape[d];
         dp += (uintptr_t)(i * it->strides[0][d]);
         sp += (uintptr_t)(i * it->strides[1][d]);
      }
      int64_t k0 = tk * TB, k1 = k0 + TB < nk ? k0 + TB : nk;
      for (int64_t i0 = 0; i0 < n0; i0 += TB) {
         int64_t i1 = i0 + TB < n0 ? i0 + TB : n0;
         tile((char *)(dp + (uintptr_t)(i0 * d0 + k0 * dk)), dk,
              (const char *)(sp + (uintptr_t)(i0 * s0 + k0 * sk)), s0, i1 - i0, k1 - k0);
      }
   }
}

lm_status lm_copy_operands(const lm_operand *dst, const lm_operand *src) {
   int nd;
   int64_t shape[LM_MAX_DIMS];
   LM_TRY(lm_broadcast_shapes(dst->ndim, dst->sizes, src->ndim, src->sizes, &nd, shape));
   int ok = nd == dst->ndim;
   for (int d = 0; ok && d < nd; d++) ok = shape[d] == dst->sizes[d];
   if (!ok) {
      char a[160], b[160];
      shape_str(a, sizeof a, src->ndim, src->sizes);
      shape_str(b, sizeof b, dst->ndim, dst->sizes);
      return lm_error(LM_ERR_SHAPE, "the source of shape %s cannot be broadcast to shape %s", a,
                      b);
   }
   if (lm_operand_numel(dst) == 0) return LM_OK;
   if (lm_operand_internal_overlap(dst)) return overlap_error();
   lm_operand s = *src;
   lm_tensor *tmp = NULL;
   int ov = lm_operands_overlap(dst, src);
   if (ov == 1 && dst->dtype == src->dtype) return LM_OK;
   if (ov == 2) LM_TRY(materialize(&s, &tmp));
   lm_operand ops[2] = {*dst, s};
   lm_iter it;
   lm_iter_init(&it, 2, ops, dst->ndim, dst->sizes);
   int es = lm_dtype_size(dst->dtype);
   int kd = -1;
   if (dst->dtype == s.dtype && it.ndim >= 2 && it.strides[0][0] == es && it.strides[1][0] != es &&
       it.shape[0] >= 4) {
      for (int d = 1; d < it.ndim; d++)
         if (it.strides[1][d] == es && it.shape[d] >= 4) {
            kd = d;
            break;
         }
   }
   if (kd > 0) {
      transpose_copy(&it, kd, es);
   } else {
      int dts[2] = {dst->dtype, s.dtype};
      lm_iter_run_grain(&it, copy_loop, dts, LM_CHEAP_GRAIN);
   }
   lm_tensor_free(tmp);
   return LM_OK;
}

static int plain_dense_match(const lm_tensor *a, const lm_tensor *b) {
   if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
   if (!(a->flags & LM_FLAG_NOD) || !(b->flags & LM_FLAG_NOD)) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d]))
         return 0;
   return 1;
}

lm_status lm_copy_(lm_tensor *dst, const lm_tensor *src) {
   LM_CHECK_TENSOR(dst, "self");
   LM_CHECK_TENSOR(src, "src");
   if (dst->device == LM_CPU && src->device == LM_CPU) {
      lm_operand d, s;
      lm_operand_tensor(&d, dst);
      lm_operand_tensor(&s, src);
      return lm_copy_operands(&d, &s);
   }
   /* another device on one side: one transfer when the layouts match, else through the host */
   if (plain_dense_match(dst, src) && dst->numel > 0) {
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

static void fill_loop(void *ctx, char **data, const int64_t *st, int64_t n) {
   const lm_operand *v = ctx;
   lm_convert(v->dtype, data[0], st[0], v->dtype, v->data, 0, n);
}

lm_status lm_fill_(lm_tensor *t, double value) {
   LM_CHECK_TENSOR(t, "self");
   if (t->numel == 0) return LM_OK;
   lm_host_mirror m;
   LM_TRY(lm_mirror_begin(t, 1, &m));
   _Alignas(16) char vb[16];
   lm_store_from_double(vb, t->dtype, value);
   lm_operand v;
   lm_operand_scalar(&v, vb, t->dtype, 0);
   lm_iter it;
   lm_iter_init(&it, 1, &m.op, m.op.ndim, m.op.sizes);
   if (lm_operand_internal_overlap(&m.op)) lm_iter_serial(&it, 0, it.numel, fill_loop, &v);
   else lm_iter_run_grain(&it, fill_loop, &v, LM_CHEAP_GRAIN);
   return lm_mirror_end(&m, 1);
}

/* ---------------------------------------------------------------- fused optimizer steps */

/* The optimizers' per-parameter updates in one pass (src/nn.h). Every operand has the
   parameter's dtype (float32 / float64), sizes and strides and is non-overlapping and dense, so
   the loops run over the storage span linearly. The arithmetic follows the separate ops of
   optim/init.lua step by step, rounding to the dtype after each. */

static lm_status optim_operand(const lm_tensor *p, const lm_tensor *t, const char *what) {
   if (!t) return lm_error(LM_ERR_ARG, "%s is nil", what);
   LM_TRY(lm_check_cpu(t, what));
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
   LM_TRY(lm_check_cpu(p, "param"));
   if (p->dtype != LM_FLOAT32 && p->dtype != LM_FLOAT64)
      return lm_error(LM_ERR_DTYPE, "fused optimizer steps take float32 or float64, got %s",
                      lm_dtype_name(p->dtype));
   if (!lm_is_non_overlapping_and_dense(p))
      return lm_error(LM_ERR_ARG, "param must be non-overlapping and dense");
   return LM_OK;
}

#define SGD_LOOP(T, SUF)                                                                        \
   static LM_CLONES void sgd_##SUF(T *restrict p, const T *restrict g, T *restrict b, int64_t n, \
                                   T wd, T mom, T damp1, T nlr, int use_wd, int use_mom,        \
                                   int nesterov, int maximize, int first) {                     \
      for (int64_t i = 0; i < n; i++) {                                                         \
         T d = g[i];                                                                            \
         if (maximize) d = -d;                                                                  \
         if (use_wd) d = d + wd * p[i];                                                         \
         if (use_mom) {                                                                         \
            T v;                                                                                \
            if (first) {                                                                        \
               v = d;                                                                           \
            } else {                                                                            \
               v = b[i] * mom;                                                                  \
               v = v + damp1 * d;                                                               \
            }                                                                                   \
            b[i] = v;                                                                           \
            d = nesterov ? d + mom * v : v;                                                     \
         }                                                                                      \
         p[i] = p[i] + nlr * d;                                                                 \
      }                                                                                         \
   }
SGD_LOOP(float, f32)
SGD_LOOP(double, f64)

lm_status lm_sgd_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *momentum_buffer,
                      double lr, double momentum, double dampening, double weight_decay,
                      int nesterov, int maximize, int first) {
   LM_TRY(optim_param(param));
   LM_TRY(optim_operand(param, grad, "grad"));
   if (momentum != 0) LM_TRY(optim_operand(param, momentum_buffer, "momentum_buffer"));
   const int64_t n = param->numel;
   if (n == 0) return LM_OK;
   void *pp = lm_tensor_data(param), *bp = momentum != 0 ? lm_tensor_data(momentum_buffer) : NULL;
   const void *gp = lm_tensor_data(grad);
   if (param->dtype == LM_FLOAT32)
      sgd_f32(pp, gp, bp, n, (float)weight_decay, (float)momentum, (float)(1 - dampening),
              (float)-lr, weight_decay != 0, momentum != 0, nesterov != 0, maximize != 0,
              first != 0);
   else
      sgd_f64(pp, gp, bp, n, weight_decay, momentum, 1 - dampening, -lr, weight_decay != 0,
              momentum != 0, nesterov != 0, maximize != 0, first != 0);
   return LM_OK;
}

#define ADAM_LOOP(T, SUF, SQRT)                                                                 \
   static LM_CLONES void adam_##SUF(T *restrict p, const T *restrict g, T *restrict m,          \
                                    T *restrict v, T *restrict mx, int64_t n, T b1, T b1c,      \
                                    T b2, T b2c, T wd, T decay, T bc2s, T eps, T nstep,         \
                                    int use_wd, int decoupled, int maximize) {                  \
      for (int64_t i = 0; i < n; i++) {                                                         \
         T d = g[i];                                                                            \
         if (maximize) d = -d;                                                                  \
         T pv = p[i];                                                                           \
         if (use_wd) {                                                                          \
            if (decoupled) pv = pv * decay;                                                     \
            else d = d + wd * pv;                                                               \
         }                                                                                      \
         T mv = m[i] * b1;                                                                      \
         mv = mv + b1c * d;                                                                     \
         T vv = v[i] * b2;                                                                      \
         vv = vv + b2c * d * d;                                                                 \
         m[i] = mv;                                                                             \
         v[i] = vv;                                                                             \
         T den;                                                                                 \
         if (mx) {                                                                              \
            T a = mx[i];                                                                        \
            T w = (a != a) ? a : (vv != vv) ? vv : (a > vv ? a : vv);                           \
            mx[i] = w;                                                                          \
            den = SQRT(w);                                                                      \
         } else {                                                                               \
            den = SQRT(vv);                                                                     \
         }                                                                                      \
         den = den / bc2s;                                                                      \
         den = den + eps;                                                                       \
         p[i] = pv + nstep * mv / den;                                                          \
      }                                                                                         \
   }
ADAM_LOOP(float, f32, sqrtf)
ADAM_LOOP(double, f64, sqrt)

lm_status lm_adam_step(lm_tensor *param, const lm_tensor *grad, lm_tensor *exp_avg,
                       lm_tensor *exp_avg_sq, lm_tensor *max_exp_avg_sq, double lr, double beta1,
                       double beta2, double eps, double weight_decay, int decoupled,
                       int maximize, int64_t step) {
   LM_TRY(optim_param(param));
   LM_TRY(optim_operand(param, grad, "grad"));
   LM_TRY(optim_operand(param, exp_avg, "exp_avg"));
   LM_TRY(optim_operand(param, exp_avg_sq, "exp_avg_sq"));
   if (max_exp_avg_sq) LM_TRY(optim_operand(param, max_exp_avg_sq, "max_exp_avg_sq"));
   if (step < 1) return lm_error(LM_ERR_ARG, "adam step: step must be >= 1, got %lld",
                                 (long long)step);
   const int64_t n = param->numel;
   if (n == 0) return LM_OK;
   const double bc1 = 1 - pow(beta1, (double)step);
   const double bc2s = sqrt(1 - pow(beta2, (double)step));
   const double step_size = lr / bc1;
   void *pp = lm_tensor_data(param), *mp = lm_tensor_data(exp_avg);
   void *vp = lm_tensor_data(exp_avg_sq);
   void *xp = max_exp_avg_sq ? lm_tensor_data(max_exp_avg_sq) : NULL;
   const void *gp = lm_tensor_data(grad);
   if (param->dtype == LM_FLOAT32)
      adam_f32(pp, gp, mp, vp, xp, n, (float)beta1, (float)(1 - beta1), (float)beta2,
               (float)(1 - beta2), (float)weight_decay, (float)(1 - lr * weight_decay),
               (float)bc2s, (float)eps, (float)-step_size, weight_decay != 0, decoupled != 0,
               maximize != 0);
   else
      adam_f64(pp, gp, mp, vp, xp, n, beta1, 1 - beta1, beta2, 1 - beta2, weight_decay,
               1 - lr * weight_decay, bc2s, eps, -step_size, weight_decay != 0, decoupled != 0,
               maximize != 0);
   return LM_OK;
}
