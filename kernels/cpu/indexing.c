/*
 * indexing.c -- sort, gather, scatter_add and cumsum on the CPU (LM_OP_SORT, LM_OP_GATHER,
 * LM_OP_SCATTER_ADD, LM_OP_CUMSUM; front end src/ops/indexing.c).
 *
 * Each kernel runs the rows of src/ops/indexing.h (every position of the dims but dim; a row is
 * the elements along dim) with the per-row bodies the CUDA kernels run too, so both devices give
 * the same bits, indices and tie order. Rows are split over OpenMP threads, a row is done by one
 * thread in order: scatter_add's sums are deterministic. Any strides are walked directly, so a
 * channels-last or sliced input is read in place. Index values are checked before anything is
 * written; the error names the bad value at the smallest position (row-major) of the index.
 */
#include "cpu.h"
#include "ops/indexing.h"

#include <stdlib.h>

static const char *tdata(const lm_tensor *t) { return (const char *)lm_tensor_data(t); }

/* the smallest row-major position of index (rows r, tensor k = 1) whose value is outside
   [base, base + limit), or -1; *value: that value */
static int64_t first_bad(const lm_rows *r, int dim, const int64_t *idx, int64_t limit,
                         int64_t base, int64_t *value) {
   int64_t best = -1, bv = 0;
#pragma omp parallel for schedule(static) if (r->count * r->len > LM_PARALLEL_GRAIN)
   for (int64_t row = 0; row < r->count; row++) {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(r, row, off);
      const int64_t j = lm_index_bad(idx + off[1], r->ds[1], r->len, limit, base);
      if (j < 0) continue;
      const int64_t flat = lm_rows_flat(r, dim, row, j);
#pragma omp critical(lm_index_first_bad)
      if (best < 0 || flat < best) {
         best = flat;
         bv = idx[off[1] + j * r->ds[1]];
      }
   }
   *value = bv;
   return best;
}

static lm_status bad_index(int64_t value, int dim, int64_t size, int64_t base) {
   return lm_error(LM_ERR_ARG, "index %lld is out of bounds for dimension %d with size %lld",
                   (long long)value, dim + (int)base, (long long)size);
}

/* LM_OP_SORT: t = {x, values, indices} */
static lm_status k_sort(const lm_op *op) {
   const lm_index_params *p = op->params;
   const lm_tensor *x = op->t[0], *v = op->t[1], *ix = op->t[2];
   lm_rows r;
   lm_rows_make(&r, x, p->dim, 3, (const lm_tensor *const *)op->t);
   const int esz = lm_dtype_size(x->dtype);
   const char *xd = tdata(x);
   char *vd = (char *)lm_tensor_data(v);
   int64_t *id = lm_tensor_data(ix);
   int oom = 0;
#pragma omp parallel if (r.count > 1 && x->numel > LM_PARALLEL_GRAIN / 4)
   {
      /* each thread's scratch: the permutation and the merge buffer of one row */
      int64_t *perm = malloc(sizeof(int64_t) * (size_t)(2 * r.len + 1));
      if (!perm) {
#pragma omp atomic write
         oom = 1;
      }
#pragma omp for schedule(dynamic, 16)
      for (int64_t row = 0; row < r.count; row++) {
         if (!perm) continue;
         int64_t off[LM_ROWS_MAXT];
         lm_rows_at(&r, row, off);
         const char *xr = xd + off[0] * esz;
         const int64_t *s = lm_sort_row(xr, x->dtype, r.ds[0], r.len, p->flag, perm, perm + r.len);
         for (int64_t j = 0; j < r.len; j++) {
            lm_ix_copy(vd + (off[1] + j * r.ds[1]) * esz, xr + s[j] * r.ds[0] * esz, esz);
            id[off[2] + j * r.ds[2]] = s[j] + p->base;
         }
      }
      free(perm);
   }
   if (oom) return lm_error(LM_ERR_OOM, "sort: out of memory for the scratch of a row");
   return LM_OK;
}

/* LM_OP_GATHER: t = {x, index, out}; rows over index's sizes */
static lm_status k_gather(const lm_op *op) {
   const lm_index_params *p = op->params;
   const lm_tensor *x = op->t[0], *index = op->t[1], *out = op->t[2];
   const lm_tensor *ts[3] = {x, index, out};
   lm_rows r;
   lm_rows_make(&r, index, p->dim, 3, ts);
   const int64_t limit = lm_ix_dim_size(x, p->dim), xds = lm_ix_dim_stride(x, p->dim);
   const int64_t *id = lm_tensor_data(index);
   int64_t value;
   if (first_bad(&r, p->dim, id, limit, p->base, &value) >= 0)
      return bad_index(value, p->dim, limit, p->base);
   const int esz = lm_dtype_size(x->dtype);
   const char *xd = tdata(x);
   char *od = (char *)lm_tensor_data(out);
#pragma omp parallel for schedule(static) if (r.count * r.len > LM_PARALLEL_GRAIN)
   for (int64_t row = 0; row < r.count; row++) {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      lm_gather_row(od + off[2] * esz, r.ds[2], xd + off[0] * esz, xds, id + off[1], r.ds[1],
                    r.len, esz, p->base);
   }
   return LM_OK;
}

/* LM_OP_SCATTER_ADD: t = {self, index, src}; rows over index's sizes */
static lm_status k_scatter_add(const lm_op *op) {
   const lm_index_params *p = op->params;
   const lm_tensor *self = op->t[0], *index = op->t[1], *src = op->t[2];
   const lm_tensor *ts[3] = {self, index, src};
   lm_rows r;
   lm_rows_make(&r, index, p->dim, 3, ts);
   const int64_t limit = lm_ix_dim_size(self, p->dim), sds = lm_ix_dim_stride(self, p->dim);
   const int64_t *id = lm_tensor_data(index);
   int64_t value;
   if (first_bad(&r, p->dim, id, limit, p->base, &value) >= 0)
      return bad_index(value, p->dim, limit, p->base);
   const int esz = lm_dtype_size(self->dtype);
   char *sd = (char *)lm_tensor_data(self);
   const char *rd = tdata(src);
   /* rows write disjoint elements of self (they differ outside dim), so they run in parallel */
#pragma omp parallel for schedule(static) if (r.count * r.len > LM_PARALLEL_GRAIN)
   for (int64_t row = 0; row < r.count; row++) {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      lm_scatter_add_row(sd + off[0] * esz, sds, id + off[1], r.ds[1], rd + off[2] * esz, r.ds[2],
                         r.len, self->dtype, p->base, -1);
   }
   return LM_OK;
}

/* LM_OP_CUMSUM: t = {x, out} */
static lm_status k_cumsum(const lm_op *op) {
   const lm_index_params *p = op->params;
   const lm_tensor *x = op->t[0], *out = op->t[1];
   lm_rows r;
   lm_rows_make(&r, x, p->dim, 2, (const lm_tensor *const *)op->t);
   const int xe = lm_dtype_size(x->dtype), oe = lm_dtype_size(out->dtype);
   const char *xd = tdata(x);
   char *od = (char *)lm_tensor_data(out);
#pragma omp parallel for schedule(static) if (r.count * r.len > LM_PARALLEL_GRAIN)
   for (int64_t row = 0; row < r.count; row++) {
      int64_t off[LM_ROWS_MAXT];
      lm_rows_at(&r, row, off);
      lm_cumsum_row(xd + off[0] * xe, x->dtype, r.ds[0], od + off[1] * oe, out->dtype, r.ds[1],
                    r.len, p->flag);
   }
   return LM_OK;
}

/* ---- registration (cpu.h): one portable copy at every ISA level ---- */
void lm_cpu_register_indexing(lm_kernel_fn *table, int isa) {
   (void)isa;
   table[LM_OP_SORT] = k_sort;
   table[LM_OP_GATHER] = k_gather;
   table[LM_OP_SCATTER_ADD] = k_scatter_add;
   table[LM_OP_CUMSUM] = k_cumsum;
}
