/* indexing.h -- the parameters of LM_OP_SORT, LM_OP_GATHER, LM_OP_SCATTER_ADD and LM_OP_CUMSUM
 * (front end: src/ops/indexing.c; CPU kernels: kernels/cpu/indexing.c; CUDA kernels:
 * kernels/cuda/indexing.cu), and the per-row bodies both devices run, so that the CPU and the
 * GPU give the same values, indices and tie order (rule 6 of docs/writing_operators.md).
 *
 *   SORT:        t = {x, values, indices}; values has x's dtype, indices int64, both x's sizes.
 *   GATHER:      t = {x, index, out}; out has index's sizes and x's dtype; index int64.
 *   SCATTER_ADD: t = {self, index, src}; self is written in place (src's dtype is self's).
 *   CUMSUM:      t = {x, out}; out has x's sizes (any dtype: the accumulator follows out's).
 *
 * Every tensor may have any strides (the kernels walk them): channels-last and strided inputs
 * run natively, without a copy. The op runs as "rows": every position of the dims other than
 * dim, each row the elements along dim, in the sizes of the iteration tensor (x for SORT and
 * CUMSUM, index for GATHER and SCATTER_ADD). A row is computed by one thread, in order along
 * dim, so scatter_add's sums are deterministic and equal on every device.
 *
 * Index values are `base`-based: 0 from C, 1 from the Lua API (whose indices are 1-based), so
 * neither side copies an index tensor to convert it; a value outside [base, base + size) is an
 * error naming it as the caller wrote it. */
#ifndef LUMEN_OPS_INDEXING_H
#define LUMEN_OPS_INDEXING_H
#include "internal.h"

typedef struct lm_index_params {
   int dim;      /* wrapped: 0 <= dim < ndim (0 for a 0-dim tensor) */
   int flag;     /* SORT: descending; CUMSUM: reverse (a suffix sum); otherwise 0 */
   int64_t base; /* the first index value (0 or 1), SORT's output and the others' input */
} lm_index_params;

enum { LM_ROWS_MAXT = 3 };

/* the rows of an op over up to three tensors indexed by the same coordinates */
typedef struct lm_rows {
   int nd;                                /* the dims other than dim */
   int64_t size[LM_MAX_DIMS];             /* their sizes (the iteration tensor's) */
   int64_t st[LM_ROWS_MAXT][LM_MAX_DIMS]; /* each tensor's strides along them (elements) */
   int64_t ds[LM_ROWS_MAXT];              /* each tensor's stride along dim */
   int64_t len;                           /* the elements of a row */
   int64_t count;                         /* the rows */
} lm_rows;

/* the rows of `it` along dim, for the n tensors ts (n <= LM_ROWS_MAXT; NULL entries get zero
   strides) */
static inline void lm_rows_make(lm_rows *r, const lm_tensor *it, int dim, int n,
                                const lm_tensor *const *ts) {
   r->nd = 0;
   r->len = it->ndim == 0 ? 1 : it->sizes[dim];
   r->count = 1;
   for (int k = 0; k < LM_ROWS_MAXT; k++) r->ds[k] = 0;
   for (int d = 0; d < it->ndim; d++) {
      if (d == dim) {
         for (int k = 0; k < n; k++) r->ds[k] = ts[k] ? ts[k]->strides[d] : 0;
         continue;
      }
      r->size[r->nd] = it->sizes[d];
      for (int k = 0; k < LM_ROWS_MAXT; k++)
         r->st[k][r->nd] = k < n && ts[k] ? ts[k]->strides[d] : 0;
      r->count *= it->sizes[d];
      r->nd++;
   }
}

/* the element offset of row `row` (row-major over the other dims) in each tensor */
static inline LM_HD void lm_rows_at(const lm_rows *r, int64_t row, int64_t *off) {
   for (int k = 0; k < LM_ROWS_MAXT; k++) off[k] = 0;
   for (int d = r->nd - 1; d >= 0; d--) {
      const int64_t q = row / r->size[d], c = row - q * r->size[d];
      for (int k = 0; k < LM_ROWS_MAXT; k++) off[k] += c * r->st[k][d];
      row = q;
   }
}

/* the bytes of one element (lm_dtype_size, callable on the GPU) */
static inline LM_HD int lm_ix_esz(int dt) {
   switch (dt) {
   case LM_FLOAT64:
   case LM_INT64: return 8;
   case LM_FLOAT32:
   case LM_INT32: return 4;
   case LM_FLOAT16:
   case LM_BFLOAT16: return 2;
   default: return 1;
   }
}

/* the row-major position, in the iteration tensor, of element j of row `row` (dim: the op's) */
static inline LM_HD int64_t lm_rows_flat(const lm_rows *r, int dim, int64_t row, int64_t j) {
   int64_t c[LM_MAX_DIMS];
   for (int d = r->nd - 1; d >= 0; d--) {
      const int64_t q = row / r->size[d];
      c[d] = row - q * r->size[d];
      row = q;
   }
   int64_t flat = 0;
   for (int d = 0; d <= r->nd; d++) {
      if (d == dim) flat = flat * r->len + j;
      if (d < r->nd) flat = flat * r->size[d] + c[d];
   }
   return flat;
}

/* copy one element of esz bytes */
static inline LM_HD void lm_ix_copy(char *dst, const char *src, int esz) {
   switch (esz) {
   case 8: *(int64_t *)dst = *(const int64_t *)src; break;
   case 4: *(int32_t *)dst = *(const int32_t *)src; break;
   case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
   default: *dst = *src; break;
   }
}

/* ---- sort ---- */

/* does element a of a row come before element b in the sorted order (strictly: ties keep their
   order, which the stable merge below preserves)? NaN is larger than every number, PyTorch's
   order: last ascending, first descending. int64 compares exactly; every other dtype is exact
   as a double. */
static inline LM_HD int lm_sort_before(const char *x, int dt, int64_t xs, int64_t a, int64_t b,
                                       int desc) {
   const int esz = lm_ix_esz(dt);
   const char *pa = x + a * xs * esz, *pb = x + b * xs * esz;
   if (dt == LM_INT64) {
      const int64_t va = *(const int64_t *)pa, vb = *(const int64_t *)pb;
      return desc ? va > vb : va < vb;
   }
   const double va = lm_load_as_double(pa, dt), vb = lm_load_as_double(pb, dt);
   if (desc) return vb == vb && (va != va || va > vb);
   return va == va && (vb != vb || va < vb);
}

/* sort the n elements of a row (stride xs) into the positions perm[0..n) (0-based): a stable
   bottom-up merge sort (insertion-sorted runs of 16, then merges that take from the right run
   only when it is strictly before), any length, with scratch tmp[n]. Returns perm or tmp,
   whichever holds the result. */
static inline LM_HD int64_t *lm_sort_row(const char *x, int dt, int64_t xs, int64_t n, int desc,
                                         int64_t *perm, int64_t *tmp) {
   enum { RUN = 16 };
   for (int64_t i = 0; i < n; i++) perm[i] = i;
   for (int64_t lo = 0; lo < n; lo += RUN) {
      const int64_t hi = lo + RUN < n ? lo + RUN : n;
      for (int64_t i = lo + 1; i < hi; i++) {
         const int64_t v = perm[i];
         int64_t j = i;
         while (j > lo && lm_sort_before(x, dt, xs, v, perm[j - 1], desc)) {
            perm[j] = perm[j - 1];
            j--;
         }
         perm[j] = v;
      }
   }
   int64_t *a = perm, *b = tmp;
   for (int64_t w = RUN; w < n; w *= 2) {
      for (int64_t lo = 0; lo < n; lo += 2 * w) {
         const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
         int64_t i = lo, j = mid, k = lo;
         while (i < mid && j < hi)
            b[k++] = lm_sort_before(x, dt, xs, a[j], a[i], desc) ? a[j++] : a[i++];
         while (i < mid) b[k++] = a[i++];
         while (j < hi) b[k++] = a[j++];
      }
      int64_t *s = a;
      a = b;
      b = s;
   }
   return a;
}

/* ---- gather / scatter_add ---- */

/* t's size and stride along dim; a 0-dim t is one element (the front end allows dim 0 there) */
static inline int64_t lm_ix_dim_size(const lm_tensor *t, int dim) {
   return t->ndim == 0 ? 1 : t->sizes[dim];
}
static inline int64_t lm_ix_dim_stride(const lm_tensor *t, int dim) {
   return t->ndim == 0 ? 0 : t->strides[dim];
}

/* out[j] = x[idx[j] - base] along one row (indices checked already); esz bytes an element */
static inline LM_HD void lm_gather_row(char *out, int64_t os, const char *x, int64_t xs,
                                       const int64_t *idx, int64_t is, int64_t n, int esz,
                                       int64_t base) {
   for (int64_t j = 0; j < n; j++)
      lm_ix_copy(out + j * os * esz, x + (idx[j * is] - base) * xs * esz, esz);
}

/* lm_gather_row where the indices were not checked (a CUDA graph capture cannot read the check
   back): an index outside [0, limit) gives 0 instead of a read elsewhere */
static inline LM_HD void lm_gather_row_guarded(char *out, int64_t os, const char *x, int64_t xs,
                                               const int64_t *idx, int64_t is, int64_t n,
                                               int esz, int64_t base, int64_t limit) {
   const int64_t zero = 0;
   for (int64_t j = 0; j < n; j++) {
      const int64_t v = idx[j * is] - base;
      lm_ix_copy(out + j * os * esz, v >= 0 && v < limit ? x + v * xs * esz : (const char *)&zero,
                 esz);
   }
}

/* the first j in [0, n) whose index value idx[j * is] - base is outside [0, limit); -1 if none */
static inline LM_HD int64_t lm_index_bad(const int64_t *idx, int64_t is, int64_t n, int64_t limit,
                                         int64_t base) {
   for (int64_t j = 0; j < n; j++) {
      const int64_t v = idx[j * is] - base;
      if (v < 0 || v >= limit) return j;
   }
   return -1;
}

/* self[idx[j] - base] += src[j] along one row, in order of j (indices checked already, or limit
   >= 0 below). Floating
   dtypes add in double and round once (exact for two floats, so equal to the dtype's own sum);
   int64 wraps as two's complement; the narrower integers wrap through int64, as PyTorch's */
static inline LM_HD void lm_scatter_add_row(char *self, int64_t ss, const int64_t *idx, int64_t is,
                                            const char *src, int64_t rs, int64_t n, int dt,
                                            int64_t base, int64_t limit) {
   const int esz = lm_ix_esz(dt);
   for (int64_t j = 0; j < n; j++) {
      /* limit >= 0: the indices were not checked (a CUDA graph capture); one outside
         [0, limit) adds nothing */
      if (limit >= 0 && (idx[j * is] - base < 0 || idx[j * is] - base >= limit)) continue;
      char *o = self + (idx[j * is] - base) * ss * esz;
      const char *s = src + j * rs * esz;
      if (dt == LM_INT64) {
         *(int64_t *)o = (int64_t)((uint64_t) * (const int64_t *)o + (uint64_t) * (const int64_t *)s);
      } else if (dt == LM_BOOL) {
         *(uint8_t *)o = (uint8_t)(*(const uint8_t *)o || *(const uint8_t *)s);
      } else {
         lm_store_from_double(o, dt, lm_load_as_double(o, dt) + lm_load_as_double(s, dt));
      }
   }
}

/* ---- cumsum ---- */

/* out[j] = x[0] + ... + x[j] along one row (reverse: x[j] + ... + x[n-1]). The accumulator is
   PyTorch's CPU one for out's dtype: double for float32 / float64, float for the halves (each
   partial sum rounded to float), int64 for the integers */
static inline LM_HD void lm_cumsum_row(const char *x, int xdt, int64_t xs, char *out, int odt,
                                       int64_t os, int64_t n, int reverse) {
   const int xe = lm_ix_esz(xdt), oe = lm_ix_esz(odt);
   const int64_t j0 = reverse ? n - 1 : 0, step = reverse ? -1 : 1;
   if (odt != LM_FLOAT32 && odt != LM_FLOAT64 && odt != LM_FLOAT16 && odt != LM_BFLOAT16) {
      uint64_t acc = 0;
      for (int64_t k = 0, j = j0; k < n; k++, j += step) {
         const char *p = x + j * xs * xe;
         acc += xdt == LM_INT64 ? (uint64_t) * (const int64_t *)p
                                : (uint64_t)lm_double_to_i64(lm_load_as_double(p, xdt));
         if (odt == LM_INT64)
            *(int64_t *)(out + j * os * oe) = (int64_t)acc;
         else
            lm_store_from_double(out + j * os * oe, odt, (double)(int64_t)acc);
      }
      return;
   }
   if (odt == LM_FLOAT16 || odt == LM_BFLOAT16) {
      float acc = 0;
      for (int64_t k = 0, j = j0; k < n; k++, j += step) {
         acc += (float)lm_load_as_double(x + j * xs * xe, xdt);
         lm_store_from_double(out + j * os * oe, odt, acc);
      }
      return;
   }
   double acc = 0;
   for (int64_t k = 0, j = j0; k < n; k++, j += step) {
      acc += lm_load_as_double(x + j * xs * xe, xdt);
      lm_store_from_double(out + j * os * oe, odt, acc);
   }
}
#endif
