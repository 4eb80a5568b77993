/* iter.c -- the elementwise iterator: output layout (spec section 6, PyTorch's TensorIterator),
 * dimension ordering and coalescing, the (parallel) loop driver, overlap checks and the dtype
 * conversion loops. */
#include "iter.h"
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- operands */

int lm_elsize(int dtype) { return dtype == LM_DT_INDEX ? 1 : lm_dtype_size(dtype); }

void lm_operand_set(lm_operand *op, void *data, int dtype, int ndim, const int64_t *sizes,
                    const int64_t *strides) {
   memset(op, 0, sizeof *op);
   op->data = data;
   op->dtype = dtype;
   op->ndim = ndim;
   for (int d = 0; d < ndim; d++) {
      op->sizes[d] = sizes[d];
      op->strides[d] = strides[d];
   }
   op->flags = lm_layout_flags(ndim, op->sizes, op->strides);
}

void lm_operand_tensor(lm_operand *op, const lm_tensor *t) {
   memset(op, 0, sizeof *op);
   op->data = lm_tensor_data(t);
   op->dtype = t->dtype;
   op->ndim = t->ndim;
   op->flags = t->flags;
   for (int d = 0; d < t->ndim; d++) {
      op->sizes[d] = t->sizes[d];
      op->strides[d] = t->strides[d];
   }
}

void lm_operand_scalar(lm_operand *op, void *data, int dtype, int wrapped) {
   memset(op, 0, sizeof *op);
   op->data = data;
   op->dtype = dtype;
   op->ndim = 0;
   op->wrapped = wrapped;
   op->flags = LM_FLAG_CONTIGUOUS | LM_FLAG_NOD;
}

int64_t lm_operand_numel(const lm_operand *op) { return lm_numel_of(op->ndim, op->sizes); }

/* ---------------------------------------------------------------- output layout (spec 6) */

lm_status lm_iter_shape(int nin, const lm_operand *ins, int *ndim, int64_t *shape, int *all_same) {
   int nd = 0, same = 1, has_scalar = 0, has_tensor = 0, first = 1;
   for (int k = 0; k < nin; k++) {
      const lm_operand *op = &ins[k];
      if (op->ndim == 0) has_scalar = 1;
      else has_tensor = 1;
      if (has_scalar && has_tensor) same = 0;
      if (first) {
         nd = op->ndim;
         for (int d = 0; d < nd; d++) shape[d] = op->sizes[d];
         first = 0;
         continue;
      }
      int eq = op->ndim == nd;
      for (int d = 0; eq && d < nd; d++) eq = op->sizes[d] == shape[d];
      if (!eq) {
         same = 0;
         LM_TRY(lm_broadcast_shapes(nd, shape, op->ndim, op->sizes, &nd, shape));
      }
   }
   *ndim = nd;
   if (all_same) *all_same = same;
   return LM_OK;
}

/* byte-free broadcast strides of op against (nd, shape): missing leading dims and size-1 dims
   that broadcast get 0 (spec 6.3; element units are fine since comparisons stay within one
   operand) */
static void broadcast_strides(const lm_operand *op, int nd, const int64_t *shape, int64_t *st,
                              int64_t scale) {
   int off = nd - op->ndim;
   for (int d = 0; d < nd; d++) {
      if (d < off) {
         st[d] = 0;
      } else {
         int i = d - off;
         st[d] = (op->sizes[i] == 1 && shape[d] != 1) ? 0 : op->strides[i] * scale;
      }
   }
}

/* PyTorch's reorder_dimensions: perm[0] is the fastest dim. st[k] are the (broadcast) strides of
   the voting operands, in voting order. */
static void reorder_dims(int nd, const int64_t *shape, int nvote, int64_t (*st)[LM_MAX_DIMS],
                         int *perm) {
   for (int i = 0; i < nd; i++) perm[i] = nd - 1 - i;
   for (int i = 1; i < nd; i++) {
      int dim1 = i;
      for (int dim0 = i - 1; dim0 >= 0; dim0--) {
         int a = perm[dim0], b = perm[dim1], cmp = 0;
         for (int k = 0; k < nvote; k++) {
            int64_t s0 = st[k][a], s1 = st[k][b];
            if (s0 == 0 || s1 == 0) continue;
            if (s0 < s1) {
               cmp = -1;
               break;
            }
            if (s0 > s1) {
               cmp = 1;
               break;
            }
            if (shape[a] > shape[b]) {
               cmp = 1;
               break;
            }
         }
         if (cmp > 0) {
            perm[dim0] = b;
            perm[dim1] = a;
            dim1 = dim0;
         } else if (cmp < 0) {
            break;
         }
      }
   }
}

static int same_strides(const lm_operand *a, const lm_operand *b) {
   if (a->ndim != b->ndim) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->strides[d] != b->strides[d]) return 0;
   return 1;
}

void lm_iter_output_strides(int nin, const lm_operand *ins, int nd, const int64_t *shape,
                            int all_same, int64_t *strides) {
   /* 6.2 fast setup */
   if (all_same && nin > 0) {
      /* PyTorch 1.13 has no channels_last_3d fast setup: such inputs take the NOD branch */
      int contig = 1, cl = 1, nod = 1;
      for (int k = 0; k < nin; k++) {
         int f = ins[k].flags;
         contig &= (f & LM_FLAG_CONTIGUOUS) != 0;
         cl &= (f & LM_FLAG_CL_CONTIGUOUS) != 0;
         nod &= (f & LM_FLAG_NOD) != 0;
      }
      if (contig) {
         lm_compute_strides(nd, shape, LM_CONTIGUOUS, strides);
         return;
      }
      if (cl) {
         lm_compute_strides(nd, shape, LM_CHANNELS_LAST, strides);
         return;
      }
      if (nod) {
         int ok = 1;
         for (int k = 1; k < nin && ok; k++) ok = same_strides(&ins[k], &ins[0]);
         if (ok) {
            for (int d = 0; d < nd; d++) strides[d] = ins[nin - 1].strides[d];
            return;
         }
      }
   }
   /* 6.3 - 6.5 general path */
   int64_t st[LM_ITER_MAX_OPS][LM_MAX_DIMS];
   int nv = nin < LM_ITER_MAX_OPS ? nin : LM_ITER_MAX_OPS;
   for (int k = 0; k < nv; k++) broadcast_strides(&ins[k], nd, shape, st[k], 1);
   int perm[LM_MAX_DIMS];
   reorder_dims(nd, shape, nv, st, perm);
   int inverted = 1;
   for (int j = 0; j < nd; j++)
      if (perm[j] != nd - 1 - j) inverted = 0;
   if (inverted) {
      lm_compute_strides(nd, shape, LM_CONTIGUOUS, strides);
      return;
   }
   int64_t next = 1;
   for (int j = 0; j < nd; j++) {
      strides[perm[j]] = next;
      next *= shape[perm[j]];
   }
}

/* ---------------------------------------------------------------- iterator */

void lm_iter_init(lm_iter *it, int nops, const lm_operand *ops, int nd, const int64_t *shape) {
   int64_t st[LM_ITER_MAX_OPS][LM_MAX_DIMS];
   memset(it, 0, sizeof *it);
   it->nops = nops;
   for (int k = 0; k < nops; k++) {
      broadcast_strides(&ops[k], nd, shape, st[k], lm_elsize(ops[k].dtype));
      it->base[k] = (uintptr_t)ops[k].data;
      it->dtype[k] = ops[k].dtype;
   }
   int perm[LM_MAX_DIMS];
   reorder_dims(nd, shape, nops, st, perm);
   int64_t sh[LM_MAX_DIMS];
   for (int i = 0; i < nd; i++) {
      sh[i] = shape[perm[i]];
      for (int k = 0; k < nops; k++) it->strides[k][i] = st[k][perm[i]];
   }
   /* coalesce (PyTorch's coalesce_dimensions) */
   int prev = 0;
   for (int d = 1; d < nd; d++) {
      int can = sh[prev] == 1 || sh[d] == 1;
      if (!can) {
         can = 1;
         for (int k = 0; k < nops && can; k++)
            if (sh[prev] * it->strides[k][prev] != it->strides[k][d]) can = 0;
      }
      if (can) {
         if (sh[prev] == 1)
            for (int k = 0; k < nops; k++) it->strides[k][prev] = it->strides[k][d];
         sh[prev] *= sh[d];
      } else {
         prev++;
         if (prev != d) {
            for (int k = 0; k < nops; k++) it->strides[k][prev] = it->strides[k][d];
            sh[prev] = sh[d];
         }
      }
   }
   if (nd == 0) {
      it->ndim = 1;
      it->shape[0] = 1;
      for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
   } else {
      it->ndim = prev + 1;
      for (int i = 0; i < it->ndim; i++) it->shape[i] = sh[i];
   }
   it->numel = 1;
   for (int i = 0; i < it->ndim; i++) it->numel *= it->shape[i];
}

void lm_iter_serial(const lm_iter *it, int64_t begin, int64_t end, lm_loop_fn fn, void *ctx) {
   if (begin >= end) return;
   const int nops = it->nops, nd = it->ndim;
   int64_t idx[LM_MAX_DIMS];
   uintptr_t ptr[LM_ITER_MAX_OPS];
   char *dp[LM_ITER_MAX_OPS];
   int64_t inner[LM_ITER_MAX_OPS];
   int64_t rem = begin;
   for (int d = 0; d < nd; d++) {
      idx[d] = rem % it->shape[d];
      rem /= it->shape[d];
   }
   for (int k = 0; k < nops; k++) {
      uintptr_t p = it->base[k];
      for (int d = 0; d < nd; d++) p += (uintptr_t)(idx[d] * it->strides[k][d]);
      ptr[k] = p;
      inner[k] = it->strides[k][0];
   }
   const int64_t n0 = it->shape[0];
   int64_t pos = begin;
   while (pos < end) {
      int64_t n = n0 - idx[0];
      if (n > end - pos) n = end - pos;
      for (int k = 0; k < nops; k++) dp[k] = (char *)ptr[k];
      fn(ctx, dp, inner, n);
      pos += n;
      if (pos >= end) break;
      idx[0] += n;
      for (int k = 0; k < nops; k++) ptr[k] += (uintptr_t)(n * inner[k]);
      if (idx[0] < n0) continue;
      /* carry */
      idx[0] = 0;
      for (int k = 0; k < nops; k++) ptr[k] -= (uintptr_t)(n0 * inner[k]);
      for (int d = 1; d < nd; d++) {
         idx[d]++;
         for (int k = 0; k < nops; k++) ptr[k] += (uintptr_t)it->strides[k][d];
         if (idx[d] < it->shape[d]) break;
         idx[d] = 0;
         for (int k = 0; k < nops; k++) ptr[k] -= (uintptr_t)(it->shape[d] * it->strides[k][d]);
      }
   }
}

int lm_iter_threads_grain(int64_t work, int64_t grain) {
#ifdef _OPENMP
   if (grain < 1) grain = 1;
   if (work <= grain || omp_in_parallel()) return 1;
   int nt = omp_get_max_threads();
   int64_t tasks = (work + grain - 1) / grain;
   if (tasks < nt) nt = (int)tasks;
   return nt < 1 ? 1 : nt;
#else
   (void)work;
   (void)grain;
   return 1;
#endif
}

int lm_iter_threads(int64_t work) { return lm_iter_threads_grain(work, LM_PARALLEL_GRAIN); }

void lm_iter_run_grain(const lm_iter *it, lm_loop_fn fn, void *ctx, int64_t grain) {
   const int64_t numel = it->numel;
   if (numel <= 0) return;
   int nt = lm_iter_threads_grain(numel, grain);
   if (nt <= 1) {
      lm_iter_serial(it, 0, numel, fn, ctx);
      return;
   }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
   {
      int t = omp_get_thread_num(), n = omp_get_num_threads();
      int64_t chunk = (numel + n - 1) / n;
      int64_t b = chunk * t, e = b + chunk;
      if (e > numel) e = numel;
      if (b < e) lm_iter_serial(it, b, e, fn, ctx);
   }
#endif
}

void lm_iter_run(const lm_iter *it, lm_loop_fn fn, void *ctx) {
   lm_iter_run_grain(it, fn, ctx, LM_PARALLEL_GRAIN);
}

/* ---------------------------------------------------------------- overlap */

int lm_operand_internal_overlap(const lm_operand *op) {
   if (op->flags & LM_FLAG_NOD) return 0;
   for (int d = 0; d < op->ndim; d++)
      if (op->sizes[d] > 1 && op->strides[d] == 0) return 1;
   return 0;
}

static void byte_range(const lm_operand *op, uintptr_t *lo, uintptr_t *hi) {
   int64_t es = lm_elsize(op->dtype), ext = 0;
   for (int d = 0; d < op->ndim; d++) ext += (op->sizes[d] - 1) * op->strides[d];
   *lo = (uintptr_t)op->data;
   *hi = *lo + (uintptr_t)((ext + 1) * es);
}

int lm_operands_overlap(const lm_operand *a, const lm_operand *b) {
   if (a->dtype == LM_DT_INDEX || b->dtype == LM_DT_INDEX) return 0;
   if (lm_operand_numel(a) == 0 || lm_operand_numel(b) == 0) return 0;
   uintptr_t alo, ahi, blo, bhi;
   byte_range(a, &alo, &ahi);
   byte_range(b, &blo, &bhi);
   if (ahi <= blo || bhi <= alo) return 0;
   if (a->data == b->data && lm_elsize(a->dtype) == lm_elsize(b->dtype) && a->ndim == b->ndim) {
      int same = 1;
      for (int d = 0; d < a->ndim && same; d++)
         same = a->sizes[d] == b->sizes[d] && a->strides[d] == b->strides[d];
      if (same) return 1;
   }
   return 2;
}

int lm_can_cast(int from, int to) {
   if (lm_is_float_dtype(from) && !lm_is_float_dtype(to)) return 0;
   if (from != LM_BOOL && to == LM_BOOL) return 0;
   return 1;
}

/* ---------------------------------------------------------------- conversion loops */

/* The conversions below never raise FP exceptions that matter (we do not use the FP environment);
   without this GCC keeps the subnormal float paths as branches and does not vectorize them. */
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")

/* Branch-free float16 / bfloat16 conversions (bit-exact with lm_h2f / lm_f2h / lm_bf2f /
   lm_f2bf of internal.h, checked over every input), written with selects so that they vectorize. */
static inline uint32_t fbits(float f) {
   uint32_t u;
   memcpy(&u, &f, 4);
   return u;
}
static inline float bitsf(uint32_t u) {
   float f;
   memcpy(&f, &u, 4);
   return f;
}

static inline float h2f_fast(uint16_t h) {
   uint32_t em = (uint32_t)h & 0x7fff;
   uint32_t sign = ((uint32_t)h & 0x8000) << 16;
   uint32_t norm = (em << 13) + 0x38000000u;  /* exponent rebias (127 - 15) << 23 */
   uint32_t infnan = norm + 0x38000000u;      /* exponent 31 -> 255 */
   uint32_t sub = fbits((float)(int32_t)em * 5.9604644775390625e-8f); /* em * 2^-24 */
   uint32_t r = em >= 0x7c00 ? infnan : em < 0x0400 ? sub : norm;
   return bitsf(r | sign);
}

static inline uint16_t f2h_fast(float fv) {
   uint32_t x = fbits(fv);
   uint32_t sign = (x >> 16) & 0x8000;
   uint32_t ax = x & 0x7fffffff;
   uint32_t odd = (ax >> 13) & 1;
   uint32_t rn = (ax + 0xC8000FFFu + odd) >> 13;          /* rebias, round to nearest even */
   uint32_t rs = fbits(bitsf(ax) + 0.5f) - 0x3f000000u;   /* subnormal: the FPU rounds at 2^-24 */
   uint32_t r = ax > 0x7f800000u   ? 0x7e00u
                : ax >= 0x47800000u ? 0x7c00u
                : ax < 0x38800000u  ? rs
                                    : rn;
   return (uint16_t)(r | sign);
}

static inline float bf2f_fast(uint16_t h) { return bitsf((uint32_t)h << 16); }

static inline uint16_t f2bf_fast(float f) {
   uint32_t x = fbits(f);
   uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
   return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40) : r);
}

/* bulk float16 <-> float32 conversions with the branch-free forms above (they vectorize, where
   lm_h2f's subnormal loop does not): for kernels that widen float16 operands into float32
   scratch (kernels/cpu/conv.c's float16 route: 3x3 64->64 on 56x56, batch 8, one core, 15.3 ms
   with lm_h2f / lm_f2h, 8.4 ms with these; float32 6.5 ms) */
void lm_f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
   for (int64_t i = 0; i < n; i++) dst[i] = h2f_fast(src[i]);
}
void lm_f32_to_f16(const float *src, uint16_t *dst, int64_t n) {
   for (int64_t i = 0; i < n; i++) dst[i] = f2h_fast(src[i]);
}

#define LD_F32(p) (*(const float *)(p))
#define LD_F64(p) (*(const double *)(p))
#define LD_F16(p) h2f_fast(*(const uint16_t *)(p))
#define LD_BF16(p) bf2f_fast(*(const uint16_t *)(p))
#define LD_I64(p) (*(const int64_t *)(p))
#define LD_I32(p) (*(const int32_t *)(p))
#define LD_U8(p) (*(const uint8_t *)(p))
#define LD_BOOL(p) ((uint8_t)(*(const uint8_t *)(p) != 0))

#define ST_F32(p, v) (*(float *)(p) = (float)(v))
#define ST_F64(p, v) (*(double *)(p) = (double)(v))
#define ST_F16(p, v) (*(uint16_t *)(p) = f2h_fast((float)(v)))
#define ST_BF16(p, v) (*(uint16_t *)(p) = f2bf_fast((float)(v)))
#define ST_I64(p, v) (*(int64_t *)(p) = (int64_t)(v))
#define ST_I32(p, v) (*(int32_t *)(p) = (int32_t)(v))
#define ST_U8(p, v) (*(uint8_t *)(p) = (uint8_t)(int64_t)(v))
#define ST_BOOL(p, v) (*(uint8_t *)(p) = (uint8_t)((v) != 0))

/* integer targets from floating sources go through int64 (as PyTorch does for uint8) */
#define CONV_FN(SN, ST, DN, DT)                                                                 \
   static LM_CLONES void conv_##SN##_##DN(char *d, int64_t ds, const char *s, int64_t ss,      \
                                          int64_t n) {                                         \
      if (ds == (int64_t)sizeof(DT) && ss == (int64_t)sizeof(ST)) {                            \
         DT *restrict dd = (DT *)d;                                                             \
         const ST *restrict sp = (const ST *)s;                                                 \
         for (int64_t i = 0; i < n; i++) ST_##DN(dd + i, LD_##SN(sp + i));                     \
      } else {                                                                                  \
         for (int64_t i = 0; i < n; i++) ST_##DN(d + i * ds, LD_##SN(s + i * ss));             \
      }                                                                                         \
   }

#define CONV_ROW(SN, ST)                                                                        \
   CONV_FN(SN, ST, F32, float)                                                                  \
   CONV_FN(SN, ST, F64, double)                                                                 \
   CONV_FN(SN, ST, F16, uint16_t)                                                               \
   CONV_FN(SN, ST, BF16, uint16_t)                                                              \
   CONV_FN(SN, ST, I64, int64_t)                                                                \
   CONV_FN(SN, ST, I32, int32_t)                                                                \
   CONV_FN(SN, ST, U8, uint8_t)                                                                 \
   CONV_FN(SN, ST, BOOL, uint8_t)

CONV_ROW(F32, float)
CONV_ROW(F64, double)
CONV_ROW(F16, uint16_t)
CONV_ROW(BF16, uint16_t)
CONV_ROW(I64, int64_t)
CONV_ROW(I32, int32_t)
CONV_ROW(U8, uint8_t)
CONV_ROW(BOOL, uint8_t)

typedef void (*conv_fn)(char *d, int64_t ds, const char *s, int64_t ss, int64_t n);
#define CONV_TROW(SN)                                                                           \
   {conv_##SN##_F32, conv_##SN##_F64, conv_##SN##_F16, conv_##SN##_BF16,                       \
    conv_##SN##_I64, conv_##SN##_I32, conv_##SN##_U8,  conv_##SN##_BOOL}
/* indexed [src][dst] in lm_dtype order */
static const conv_fn conv_table[LM_NUM_DTYPES][LM_NUM_DTYPES] = {
   CONV_TROW(F32), CONV_TROW(F64), CONV_TROW(F16), CONV_TROW(BF16),
   CONV_TROW(I64), CONV_TROW(I32), CONV_TROW(U8),  CONV_TROW(BOOL)};

/* same-size moves */
#define MOVE_FN(NAME, T)                                                                        \
   static void NAME(char *d, int64_t ds, const char *s, int64_t ss, int64_t n) {               \
      if (ss == 0) {                                                                            \
         T v = *(const T *)s;                                                                   \
         if (ds == (int64_t)sizeof(T)) {                                                        \
            T *dd = (T *)d;                                                                     \
            for (int64_t i = 0; i < n; i++) dd[i] = v;                                          \
         } else {                                                                               \
            for (int64_t i = 0; i < n; i++) *(T *)(d + i * ds) = v;                             \
         }                                                                                      \
      } else if (ds == (int64_t)sizeof(T) && ss == (int64_t)sizeof(T)) {                       \
         memmove(d, s, (size_t)n * sizeof(T));                                                  \
      } else if (ds == (int64_t)sizeof(T)) {                                                    \
         T *dd = (T *)d;                                                                        \
         for (int64_t i = 0; i < n; i++) dd[i] = *(const T *)(s + i * ss);                      \
      } else if (ss == (int64_t)sizeof(T)) {                                                    \
         const T *sp = (const T *)s;                                                            \
         for (int64_t i = 0; i < n; i++) *(T *)(d + i * ds) = sp[i];                            \
      } else {                                                                                  \
         for (int64_t i = 0; i < n; i++) *(T *)(d + i * ds) = *(const T *)(s + i * ss);         \
      }                                                                                         \
   }
MOVE_FN(move1, uint8_t)
MOVE_FN(move2, uint16_t)
MOVE_FN(move4, uint32_t)
MOVE_FN(move8, uint64_t)

#pragma GCC pop_options

void lm_convert(int ddt, char *dst, int64_t ds, int sdt, const char *src, int64_t ss, int64_t n) {
   if (n <= 0) return;
   if (ddt == sdt) {
      switch (lm_dtype_size(ddt)) {
      case 1: move1(dst, ds, src, ss, n); return;
      case 2: move2(dst, ds, src, ss, n); return;
      case 4: move4(dst, ds, src, ss, n); return;
      default: move8(dst, ds, src, ss, n); return;
      }
   }
   if (sdt == LM_DT_INDEX) { /* the index itself */
      int64_t base = (int64_t)(uintptr_t)src;
      for (int64_t i = 0; i < n; i++) {
         int64_t v = base + i * ss;
         if (ddt == LM_INT64) *(int64_t *)(dst + i * ds) = v;
         else lm_store_from_double(dst + i * ds, ddt, (double)v);
      }
      return;
   }
   conv_table[sdt][ddt](dst, ds, src, ss, n);
}

/* ---------------------------------------------------------------- host mirrors */

lm_status lm_mirror_begin(const lm_tensor *t, int load, lm_host_mirror *m) {
   memset(m, 0, sizeof *m);
   lm_operand_tensor(&m->op, t);
   m->device = t->device;
   if (t->device == LM_CPU) return LM_OK;
   const lm_backend *ops = lm_backend_get(t->device);
   if (!ops) return LM_ERR_DEVICE;
   int64_t ext = 0;
   for (int d = 0; d < t->ndim; d++) {
      if (t->sizes[d] == 0) {
         ext = -1;
         break;
      }
      ext += (t->sizes[d] - 1) * t->strides[d];
   }
   size_t nbytes = ext < 0 ? 0 : (size_t)(ext + 1) * (size_t)lm_dtype_size(t->dtype);
   m->nbytes = nbytes;
   m->dev_data = lm_tensor_data(t);
   m->buf = malloc(nbytes ? nbytes : 1);
   if (!m->buf) return lm_error(LM_ERR_OOM, "out of memory (%zu bytes host staging)", nbytes);
   if (load && nbytes) {
      lm_status st = ops->memcpy(ops, m->buf, m->dev_data, nbytes, 1);
      if (st != LM_OK) {
         free(m->buf);
         m->buf = NULL;
         return st;
      }
   }
   m->op.data = m->buf;
   return LM_OK;
}

lm_status lm_mirror_end(lm_host_mirror *m, int store) {
   lm_status st = LM_OK;
   if (m->buf) {
      if (store && m->nbytes) {
         const lm_backend *ops = lm_backend_get(m->device);
         st = ops ? ops->memcpy(ops, m->dev_data, m->buf, m->nbytes, 0)
                  : lm_error(LM_ERR_DEVICE, "device %d is not available", m->device);
      }
      free(m->buf);
      m->buf = NULL;
   }
   return st;
}

/* ---------------------------------------------------------------- host-side copies */

lm_status lm_overlap_error(void) {
   return lm_error(LM_ERR_ARG,
                   "unsupported operation: more than one element of the written-to tensor refers "
                   "to a single memory location. Please clone() the tensor before performing the "
                   "operation.");
}

lm_status lm_copy_check_shape(int dnd, const int64_t *dsz, int snd, const int64_t *ssz) {
   int nd;
   int64_t shape[LM_MAX_DIMS];
   LM_TRY(lm_broadcast_shapes(dnd, dsz, snd, ssz, &nd, shape));
   int ok = nd == dnd;
   for (int d = 0; ok && d < nd; d++) ok = shape[d] == dsz[d];
   if (!ok) {
      char a[160], b[160];
      lm_format_shape(a, sizeof a, snd, ssz);
      lm_format_shape(b, sizeof b, dnd, dsz);
      return lm_error(LM_ERR_SHAPE, "the source of shape %s cannot be broadcast to shape %s", a,
                      b);
   }
   return LM_OK;
}

static void copy_loop(void *ctx, char **data, const int64_t *st, int64_t n) {
   const int *dt = ctx;
   lm_convert(dt[0], data[0], st[0], dt[1], data[1], st[1], n);
}

lm_status lm_copy_operands(const lm_operand *dst, const lm_operand *src) {
   LM_TRY(lm_copy_check_shape(dst->ndim, dst->sizes, src->ndim, src->sizes));
   if (lm_operand_numel(dst) == 0) return LM_OK;
   if (lm_operand_internal_overlap(dst)) return lm_overlap_error();
   lm_operand ops[2] = {*dst, *src};
   lm_iter it;
   lm_iter_init(&it, 2, ops, dst->ndim, dst->sizes);
   int dts[2] = {dst->dtype, src->dtype};
   lm_iter_run_grain(&it, copy_loop, dts, LM_CHEAP_GRAIN);
   return LM_OK;
}
