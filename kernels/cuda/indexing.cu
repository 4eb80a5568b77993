/* indexing.cu -- sort, gather, scatter_add and cumsum on CUDA (LM_OP_SORT, LM_OP_GATHER,
 * LM_OP_SCATTER_ADD, LM_OP_CUMSUM: front end src/ops/indexing.c, parameters and the per-row
 * bodies src/ops/indexing.h, CPU kernels/cpu/indexing.c).
 *
 * One thread per row (every position of the dims but dim), running the CPU's row body, so the
 * values, indices, tie order and scatter_add's order of additions are the CPU's bit for bit.
 * Rows of different threads touch different elements, so scatter_add needs no atomics and is
 * deterministic. Correctness first: a row is serial in its thread, which suits the many short
 * rows of topk / argsort over a class dim and cumsum over a sequence; a long single row runs on
 * one thread. sort's scratch (a permutation and a merge buffer per row, 16 bytes an element) comes
 * from the caching allocator.
 *
 * Index values are checked first on the device: each row's first bad position goes into an
 * atomicMin of row-major positions, and the bad value at the smallest one is reported with the
 * CPU's message, at the cost of an 8-byte copy back (a sync) per gather / scatter_add. */
#include "cuda.cuh"
extern "C" {
#include "nn.h"
#include "ops/indexing.h"
}

namespace {

static lm_rows rows_of(const lm_tensor *it, int dim, const lm_tensor *a, const lm_tensor *b,
                       const lm_tensor *c) {
   const lm_tensor *ts[3] = {a, b, c};
   lm_rows r;
   lm_rows_make(&r, it, dim, 3, ts);
   return r;
}

struct SortRows {
   lm_rows r;
   const char *x;
   char *v;
   int64_t *ix;
   int64_t *scratch; /* 2 * len per row */
   int dt, esz, desc;
   int64_t base;
   LM_HD void operator()(int64_t row) const {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      int64_t *perm = scratch + row * 2 * r.len;
      const char *xr = x + off[0] * esz;
      const int64_t *s = lm_sort_row(xr, dt, r.ds[0], r.len, desc, perm, perm + r.len);
      for (int64_t j = 0; j < r.len; j++) {
         lm_ix_copy(v + (off[1] + j * r.ds[1]) * esz, xr + s[j] * r.ds[0] * esz, esz);
         ix[off[2] + j * r.ds[2]] = s[j] + base;
      }
   }
};

static lm_status k_sort(const lm_op *op) {
   const lm_index_params *p = (const lm_index_params *)op->params;
   const lm_tensor *x = op->t[0];
   const int k = lm_cu_index(x);
   SortRows b;
   b.r = rows_of(x, p->dim, x, op->t[1], op->t[2]);
   const size_t nbytes = sizeof(int64_t) * (size_t)(2 * b.r.len * b.r.count);
   b.scratch = (int64_t *)lm_cu_alloc(k, nbytes);
   if (!b.scratch) return LM_ERR_OOM;
   b.x = lm_cu_ptr(x);
   b.v = lm_cu_ptr(op->t[1]);
   b.ix = (int64_t *)lm_cu_ptr(op->t[2]);
   b.dt = x->dtype;
   b.esz = lm_dtype_size(x->dtype);
   b.desc = p->flag;
   b.base = p->base;
   lm_status st = lm_cu_for(k, b.r.count, b);
   lm_cu_free(k, b.scratch, nbytes);
   return st;
}

struct CheckRows {
   lm_rows r;
   int dim;
   const int64_t *idx;
   int64_t limit, base;
   unsigned long long *first; /* the smallest bad row-major position (all ones: none) */
   LM_HD void operator()(int64_t row) const {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      const int64_t j = lm_index_bad(idx + off[1], r.ds[1], r.len, limit, base);
      if (j < 0) return;
      const unsigned long long flat = (unsigned long long)lm_rows_flat(&r, dim, row, j);
#ifdef __CUDA_ARCH__
      atomicMin(first, flat);
#else /* the emulated build's host loop (and nvcc's host pass of this body, never run) */
      if (flat < *first) *first = flat;
#endif
   }
};

/* the CPU's error for the bad index value at the smallest position of index (tensor 1 of r) */
static lm_status check_indices(int dev, const lm_rows &r, int dim, const lm_tensor *index,
                               int64_t limit, int64_t base) {
   /* a graph capture cannot read the check back: the kernels guard the indices instead
      (GatherRows / ScatterAddRows' limit) */
   if (lm_cu_capturing(dev)) return LM_OK;
   unsigned long long *first = (unsigned long long *)lm_cu_alloc(dev, sizeof *first);
   if (!first) return LM_ERR_OOM;
   unsigned long long h = 0;
   lm_status st = lm_cu_err(cudaMemsetAsync(first, 0xff, sizeof *first, lm_cu_stream(dev)),
                            "cudaMemsetAsync");
   CheckRows c;
   c.r = r;
   c.dim = dim;
   c.idx = (const int64_t *)lm_cu_ptr(index);
   c.limit = limit;
   c.base = base;
   c.first = first;
   if (st == LM_OK) st = lm_cu_for(dev, r.count, c);
   if (st == LM_OK) st = lm_cu_memcpy(dev, &h, first, sizeof h, 1);
   lm_cu_free(dev, first, sizeof *first);
   if (st != LM_OK || h == ~0ull) return st;
   /* the index element at row-major position h */
   int64_t pos = (int64_t)h, off = 0;
   for (int d = index->ndim - 1; d >= 0; d--) {
      const int64_t q = pos / index->sizes[d];
      off += (pos - q * index->sizes[d]) * index->strides[d];
      pos = q;
   }
   int64_t v = 0;
   LM_TRY(lm_cu_memcpy(dev, &v, (const int64_t *)lm_cu_ptr(index) + off, sizeof v, 1));
   return lm_error(LM_ERR_ARG, "index %lld is out of bounds for dimension %d with size %lld",
                   (long long)v, dim + (int)base, (long long)limit);
}

struct GatherRows {
   lm_rows r;
   const char *x;
   const int64_t *idx;
   char *out;
   int64_t xds, base;
   int64_t limit; /* >= 0: the indices were not checked (a graph capture): guard them */
   int esz;
   LM_HD void operator()(int64_t row) const {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      if (limit >= 0)
         lm_gather_row_guarded(out + off[2] * esz, r.ds[2], x + off[0] * esz, xds, idx + off[1],
                               r.ds[1], r.len, esz, base, limit);
      else
         lm_gather_row(out + off[2] * esz, r.ds[2], x + off[0] * esz, xds, idx + off[1], r.ds[1],
                       r.len, esz, base);
   }
};

static lm_status k_gather(const lm_op *op) {
   const lm_index_params *p = (const lm_index_params *)op->params;
   const lm_tensor *x = op->t[0], *index = op->t[1], *out = op->t[2];
   const int k = lm_cu_index(x);
   GatherRows b;
   b.r = rows_of(index, p->dim, x, index, out);
   LM_TRY(check_indices(k, b.r, p->dim, index, lm_ix_dim_size(x, p->dim), p->base));
   b.x = lm_cu_ptr(x);
   b.idx = (const int64_t *)lm_cu_ptr(index);
   b.out = lm_cu_ptr(out);
   b.xds = lm_ix_dim_stride(x, p->dim);
   b.base = p->base;
   b.limit = lm_cu_capturing(k) ? lm_ix_dim_size(x, p->dim) : -1;
   b.esz = lm_dtype_size(x->dtype);
   return lm_cu_for(k, b.r.count, b);
}

struct ScatterAddRows {
   lm_rows r;
   char *self;
   const int64_t *idx;
   const char *src;
   int64_t sds, base;
   int64_t limit; /* >= 0: the indices were not checked (a graph capture): guard them */
   int dt, esz;
   LM_HD void operator()(int64_t row) const {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      lm_scatter_add_row(self + off[0] * esz, sds, idx + off[1], r.ds[1], src + off[2] * esz,
                         r.ds[2], r.len, dt, base, limit);
   }
};

static lm_status k_scatter_add(const lm_op *op) {
   const lm_index_params *p = (const lm_index_params *)op->params;
   const lm_tensor *self = op->t[0], *index = op->t[1], *src = op->t[2];
   const int k = lm_cu_index(self);
   ScatterAddRows b;
   b.r = rows_of(index, p->dim, self, index, src);
   LM_TRY(check_indices(k, b.r, p->dim, index, lm_ix_dim_size(self, p->dim), p->base));
   b.self = lm_cu_ptr(self);
   b.idx = (const int64_t *)lm_cu_ptr(index);
   b.src = lm_cu_ptr(src);
   b.sds = lm_ix_dim_stride(self, p->dim);
   b.base = p->base;
   b.limit = lm_cu_capturing(k) ? lm_ix_dim_size(self, p->dim) : -1;
   b.dt = self->dtype;
   b.esz = lm_dtype_size(self->dtype);
   return lm_cu_for(k, b.r.count, b);
}

struct CumsumRows {
   lm_rows r;
   const char *x;
   char *out;
   int xdt, odt, xe, oe, reverse;
   LM_HD void operator()(int64_t row) const {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      lm_cumsum_row(x + off[0] * xe, xdt, r.ds[0], out + off[1] * oe, odt, r.ds[1], r.len,
                    reverse);
   }
};

static lm_status k_cumsum(const lm_op *op) {
   const lm_index_params *p = (const lm_index_params *)op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1];
   const int k = lm_cu_index(x);
   CumsumRows b;
   b.r = rows_of(x, p->dim, x, out, NULL);
   b.x = lm_cu_ptr(x);
   b.out = lm_cu_ptr(out);
   b.xdt = x->dtype;
   b.odt = out->dtype;
   b.xe = lm_dtype_size(x->dtype);
   b.oe = lm_dtype_size(out->dtype);
   b.reverse = p->flag;
   return lm_cu_for(k, b.r.count, b);
}

} // namespace

void lm_cuda_register_indexing(lm_kernel_fn *table) {
   table[LM_OP_SORT] = k_sort;
   table[LM_OP_GATHER] = k_gather;
   table[LM_OP_SCATTER_ADD] = k_scatter_add;
   table[LM_OP_CUMSUM] = k_cumsum;
}
