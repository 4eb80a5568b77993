/* memory_format.c -- the contiguity predicates of spec sections 2-4, computed from sizes and
 * strides alone (a tensor stores no format tag) and cached in lm_tensor.flags. */
#include "internal.h"

/* 2.1: numel == 0 is contiguous; otherwise, last to first, skipping size-1 dims, each stride must
   equal the running product. */
static int contiguous_rowmajor(int nd, const int64_t *sz, const int64_t *st) {
   int64_t numel = lm_numel_of(nd, sz);
   if (numel == 0) return 1;
   int64_t expected = 1;
   for (int d = nd - 1; d >= 0; d--) {
      if (sz[d] == 1) continue;
      if (st[d] != expected) return 0;
      expected *= sz[d];
   }
   return 1;
}

/* 2.2: a walk in the given dim order, skipping size-1 dims, no numel == 0 shortcut */
static int contiguous_in_order(const int64_t *sz, const int64_t *st, const int *order, int n) {
   int64_t expected = 1;
   for (int i = 0; i < n; i++) {
      int d = order[i];
      if (sz[d] == 1) continue;
      if (st[d] != expected) return 0;
      expected *= sz[d];
   }
   return 1;
}

static const int order2d[4] = {1, 3, 2, 0};    /* C, W, H, N */
static const int order3d[5] = {1, 4, 3, 2, 0}; /* C, W, H, D, N */

/* 2.3: "strides like channels-last" */
static int strides_like(const int64_t *sz, const int64_t *st, const int *order, int n) {
   if (st[1] == 0) return 0;
   int64_t min = 0;
   for (int i = 0; i < n; i++) {
      int d = order[i];
      if (sz[d] == 0) return 0;
      if (st[d] < min) return 0;
      if (d == 0 && min == st[1]) return 0;
      min = st[d] * (sz[d] > 1 ? sz[d] : 1);
   }
   return 1;
}

/* 4: some permutation of the dims is contiguous */
static int non_overlapping_dense(int nd, const int64_t *sz, const int64_t *st) {
   if (nd == 1) return sz[0] < 2 || st[0] == 1;
   int perm[LM_MAX_DIMS];
   for (int i = 0; i < nd; i++) perm[i] = i;
   /* sort by stride ascending, size 0/1 dims last (insertion sort, stable) */
   for (int i = 1; i < nd; i++) {
      int v = perm[i], j = i - 1;
      while (j >= 0) {
         int u = perm[j];
         int u_trivial = sz[u] < 2, v_trivial = sz[v] < 2;
         int after; /* should u go after v? */
         if (u_trivial != v_trivial) after = u_trivial;
         else if (u_trivial) after = 0;
         else after = st[u] > st[v];
         if (!after) break;
         perm[j + 1] = u;
         j--;
      }
      perm[j + 1] = v;
   }
   int64_t require = 1;
   for (int i = 0; i < nd; i++) {
      int d = perm[i];
      if (sz[d] < 2) return 1;
      if (st[d] != require) return 0;
      require *= sz[d];
   }
   return 1;
}

int lm_layout_flags(int nd, const int64_t *sz, const int64_t *st) {
   int f = 0;
   if (contiguous_rowmajor(nd, sz, st)) f |= LM_FLAG_CONTIGUOUS;
   if (nd == 4) {
      if (contiguous_in_order(sz, st, order2d, 4)) f |= LM_FLAG_CL_CONTIGUOUS;
      if (strides_like(sz, st, order2d, 4)) f |= LM_FLAG_CL_STRIDES;
   } else if (nd == 5) {
      if (contiguous_in_order(sz, st, order3d, 5)) f |= LM_FLAG_CL3D_CONTIGUOUS;
      if (strides_like(sz, st, order3d, 5)) f |= LM_FLAG_CL3D_STRIDES;
   }
   if ((f & (LM_FLAG_CONTIGUOUS | LM_FLAG_CL_CONTIGUOUS | LM_FLAG_CL3D_CONTIGUOUS)) ||
       non_overlapping_dense(nd, sz, st))
      f |= LM_FLAG_NOD;
   return f;
}

int lm_is_contiguous(const lm_tensor *t, int fmt) {
   if (!t) return 0;
   switch (fmt) {
   case LM_CHANNELS_LAST: return (t->flags & LM_FLAG_CL_CONTIGUOUS) != 0;
   case LM_CHANNELS_LAST_3D: return (t->flags & LM_FLAG_CL3D_CONTIGUOUS) != 0;
   default: return (t->flags & LM_FLAG_CONTIGUOUS) != 0;
   }
}

int lm_is_non_overlapping_and_dense(const lm_tensor *t) { return t && (t->flags & LM_FLAG_NOD); }
int lm_is_channels_last_strides(const lm_tensor *t) { return t && (t->flags & LM_FLAG_CL_STRIDES); }
int lm_is_channels_last_3d_strides(const lm_tensor *t) {
   return t && (t->flags & LM_FLAG_CL3D_STRIDES);
}

/* section 3 */
int lm_suggest_memory_format(const lm_tensor *t, int exact) {
   if (!t) return LM_CONTIGUOUS;
   int fmt = LM_CONTIGUOUS;
   if (t->flags & LM_FLAG_CL_STRIDES) fmt = LM_CHANNELS_LAST;
   else if (t->flags & LM_FLAG_CL3D_STRIDES) fmt = LM_CHANNELS_LAST_3D;
   if (fmt != LM_CONTIGUOUS && exact) {
      int64_t canon[LM_MAX_DIMS];
      lm_compute_strides(t->ndim, t->sizes, fmt, canon);
      for (int d = 0; d < t->ndim; d++)
         if (canon[d] != t->strides[d]) return LM_CONTIGUOUS;
   }
   return fmt;
}

/* section 1. The sizes are checked first (lm_check_sizes: rank, no negative size, and the product
   of the sizes counted as max(size, 1) at most 2^60), so none of the products below can
   overflow, whatever the caller passes (this is public: Lua computes strides for a file's shapes
   with it). */
lm_status lm_compute_strides(int nd, const int64_t *sz, int fmt, int64_t *st) {
   LM_TRY(lm_check_sizes(nd, sz));
   if (nd > 0 && !st) return lm_error(LM_ERR_ARG, "strides are missing");
   switch (fmt) {
   case LM_CONTIGUOUS:
   case LM_PRESERVE: {
      int64_t acc = 1;
      for (int d = nd - 1; d >= 0; d--) {
         st[d] = acc;
         acc *= sz[d] > 1 ? sz[d] : 1;
      }
      return LM_OK;
   }
   case LM_CHANNELS_LAST:
      if (nd != 4) return lm_error(LM_ERR_FORMAT, "required rank 4 tensor to use channels_last format");
      st[1] = 1;
      st[3] = sz[1];
      st[2] = sz[3] * sz[1];
      st[0] = sz[2] * sz[3] * sz[1];
      return LM_OK;
   case LM_CHANNELS_LAST_3D:
      if (nd != 5)
         return lm_error(LM_ERR_FORMAT, "required rank 5 tensor to use channels_last_3d format");
      st[1] = 1;
      st[4] = sz[1];
      st[3] = sz[4] * sz[1];
      st[2] = sz[3] * sz[4] * sz[1];
      st[0] = sz[2] * sz[3] * sz[4] * sz[1];
      return LM_OK;
   default: return lm_error(LM_ERR_FORMAT, "unknown memory format %d", fmt);
   }
}

/* section 5: TensorIterator's comparator on a single tensor -- a stable insertion sort from the
   last dim first by ascending stride; a 0 stride is ambiguous (no move); equal strides put the
   larger size later. Then dense strides in that order; dims of size <= 1 do not grow the product. */
void lm_infer_dense_strides(int nd, const int64_t *sz, const int64_t *st, int64_t *out) {
   int perm[LM_MAX_DIMS]; /* perm[0] is the fastest dim */
   for (int i = 0; i < nd; i++) perm[i] = nd - 1 - i;
   /* PyTorch's loop: an ambiguous comparison (0) does not stop the walk toward the front */
   for (int i = 1; i < nd; i++) {
      int dim1 = i;
      for (int dim0 = i - 1; dim0 >= 0; dim0--) {
         int a = perm[dim0], b = perm[dim1];
         int cmp;
         if (st[a] == 0 || st[b] == 0) cmp = 0;
         else if (st[a] < st[b]) cmp = -1;
         else if (st[a] > st[b]) cmp = 1;
         else cmp = sz[a] > sz[b] ? 1 : 0;
         if (cmp > 0) {
            perm[dim0] = b;
            perm[dim1] = a;
            dim1 = dim0;
         } else if (cmp < 0) {
            break;
         }
      }
   }
   int64_t acc = 1;
   for (int i = 0; i < nd; i++) {
      int d = perm[i];
      out[d] = acc;
      acc *= sz[d] > 1 ? sz[d] : 1;
   }
}
