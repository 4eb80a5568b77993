/* elementwise.cu -- the CUDA kernels of the elementwise family (parameters: src/ops/elementwise.h;
 * front end: src/elementwise.c; the CPU's kernels, the semantic reference:
 * kernels/cpu/elementwise.c and ew_kernels.c).
 *
 * UNARY ... WHERE: the operands are set up as the CPU does (lm_iter_init over out and the inputs,
 * a wrapped number as a 0-dim operand, an input that partially overlaps an out= tensor first
 * copied to a temporary), then one of two bodies (elementwise_impl.cuh) runs: the dense one when
 * every operand is dense with the output's strides (contiguous or channels-last, one storage
 * dtype: float32, float16, bfloat16, float64 or int64), else the general strided one. An integer
 * fmod sets a flag in device memory on a division by zero; only that op reads it back (a sync)
 * and returns the CPU's "ZeroDivisionError".
 *
 * COPY: overlap as the CPU (the identical view of the same dtype: nothing; a partial overlap:
 * through a temporary), then a stream-ordered cudaMemcpyAsync for dense same-layout same-dtype
 * copies, a dense conversion kernel per (dst, src) dtype pair, a shared-memory tiled transpose for
 * a copy between two layouts (NCHW <-> NHWC: :to(lm.channels_last); one dtype, or two float dtypes
 * converted on the way), else the general strided copy (bits moved for one dtype, lm_convert's
 * casts across dtypes).
 * FILL: cudaMemsetAsync for a dense zero fill, else a store kernel. */
#include "elementwise_impl.cuh"
#include <string.h>

using namespace lmew;

namespace {

template <class S> struct Tag { typedef S type; };

/* f(Tag<S>()) with S the storage type of dtype dt */
template <class F> lm_status with_storage(int dt, F &&f) {
   switch (dt) {
   case LM_FLOAT32: return f(Tag<float>());
   case LM_FLOAT64: return f(Tag<double>());
   case LM_FLOAT16: return f(Tag<H16>());
   case LM_BFLOAT16: return f(Tag<BF16>());
   case LM_INT64: return f(Tag<i64>());
   case LM_INT32: return f(Tag<int32_t>());
   case LM_UINT8: return f(Tag<uint8_t>());
   case LM_BOOL: return f(Tag<B8>());
   default: return lm_error(LM_ERR_DTYPE, "cuda: unknown dtype %d", dt);
   }
}
/* f(Tag<E>()) with E an unsigned integer of es bytes (moving bits) */
template <class F> lm_status with_bits(int es, F &&f) {
   switch (es) {
   case 1: return f(Tag<uint8_t>());
   case 2: return f(Tag<uint16_t>());
   case 4: return f(Tag<uint32_t>());
   default: return f(Tag<u64>());
   }
}

/* ---------------------------------------------------------------- copy bodies */

/* dense: dst[i] = src[i] converted; work item j covers VW elements, moved as vectors when both
   pointers are aligned for them (vec) */
template <class SD, class SS> struct ConvDense {
   char *d;
   const char *s;
   int64_t n;
   int vec;
   LM_HD void operator()(int64_t j) const {
      const int64_t i0 = j * VW;
      if (vec && i0 + VW <= n) {
         const Vec<SS> x = *(const Vec<SS> *)((const SS *)s + i0);
         Vec<SD> y;
         for (int e = 0; e < VW; e++) St<SD>::st(&y.v[e], St<SS>::ld(&x.v[e]));
         *(Vec<SD> *)((SD *)d + i0) = y;
         return;
      }
      const int64_t end = i0 + VW < n ? i0 + VW : n;
      for (int64_t i = i0; i < end; i++) St<SD>::st((SD *)d + i, St<SS>::ld((const SS *)s + i));
   }
};
/* strided, one dtype: bits moved */
template <class E> struct MoveGen {
   Geo g;
   LM_HD void operator()(int64_t i) const {
      int64_t off[MAXOPS];
      g.offsets(i, off);
      *(E *)(g.ptr[0] + off[0]) = *(const E *)(g.ptr[1] + off[1]);
   }
};
/* strided, two dtypes */
struct ConvGen {
   Geo g;
   int ddt, sdt;
   LM_HD void operator()(int64_t i) const {
      int64_t off[MAXOPS];
      g.offsets(i, off);
      st_rt(ddt, g.ptr[0] + off[0], ld_rt(sdt, g.ptr[1] + off[1]));
   }
};
/* fills */
template <class E> struct FillDense {
   char *d;
   E v;
   LM_HD void operator()(int64_t i) const { ((E *)d)[i] = v; }
};
template <class E> struct FillGen {
   Geo g;
   E v;
   LM_HD void operator()(int64_t i) const {
      int64_t off[MAXOPS];
      g.offsets(i, off);
      *(E *)(g.ptr[0] + off[0]) = v;
   }
};

/* ---------------------------------------------------------------- the tiled transpose */

/* a same-dtype copy where dst is unit-stride in iteration dim 0 and src in dim kd: 32 x 32 tiles
   through shared memory, read along kd (coalesced in src), written along dim 0 (coalesced in
   dst); the other dims are a batch. One block of 32 x 8 threads per tile (grid-stride over the
   tiles). */
constexpr int64_t TILE = 32;
constexpr int TROWS = 8;

struct TileGeo {
   char *d;
   const char *s;
   int64_t n0, nk, d0, dk, s0, sk; /* bytes */
   int no;                         /* the batch dims */
   int64_t oshape[LM_MAX_DIMS], ods[LM_MAX_DIMS], oss[LM_MAX_DIMS];
   int64_t nti, ntk, tasks;
   /* the tile of a task: dst / src addresses of its element (0, 0), its extent */
   LM_HD void tile(int64_t task, char **dp, const char **sp, int64_t *ni, int64_t *nk_) const {
      const int64_t per = nti * ntk;
      int64_t o = task / per, r = task - o * per;
      const int64_t tk = r / nti, ti = r - tk * nti;
      char *dd = d;
      const char *ss = s;
      for (int j = 0; j < no; j++) {
         const int64_t q = o / oshape[j], c = o - q * oshape[j];
         dd += c * ods[j];
         ss += c * oss[j];
         o = q;
      }
      const int64_t i0 = ti * TILE, k0 = tk * TILE;
      *dp = dd + i0 * d0 + k0 * dk;
      *sp = ss + i0 * s0 + k0 * sk;
      *ni = n0 - i0 < TILE ? n0 - i0 : TILE;
      *nk_ = nk - k0 < TILE ? nk - k0 : TILE;
   }
};

/* one element of a tile: bits moved for one dtype, converted (lm_convert's casts) across two */
template <class D, class S> LM_HD inline void tile_move(D *d, const S *s) {
   if constexpr (std::is_same<D, S>::value) *d = *s;
   else St<D>::st(d, St<S>::ld(s));
}

#ifndef LM_CUDA_EMU
template <class D, class S> __global__ void tile_kernel(TileGeo g) {
   __shared__ D t[32][33];
   const int tx = threadIdx.x, ty = threadIdx.y;
   for (int64_t task = blockIdx.x; task < g.tasks; task += gridDim.x) {
      char *dp;
      const char *sp;
      int64_t ni, nk;
      g.tile(task, &dp, &sp, &ni, &nk);
      for (int j = ty; j < TILE; j += TROWS)
         if (j < ni && tx < nk) tile_move(&t[j][tx], (const S *)(sp + j * g.s0 + tx * g.sk));
      __syncthreads();
      for (int j = ty; j < TILE; j += TROWS)
         if (tx < ni && j < nk) *(D *)(dp + tx * g.d0 + j * g.dk) = t[tx][j];
      __syncthreads();
   }
}
#endif

template <class D, class S> lm_status tile_run(int k, const TileGeo &g) {
#ifdef LM_CUDA_EMU
   return lm_cu_host(k, [g]() {
      for (int64_t task = 0; task < g.tasks; task++) {
         char *dp;
         const char *sp;
         int64_t ni, nk;
         g.tile(task, &dp, &sp, &ni, &nk);
         for (int64_t j = 0; j < nk; j++)
            for (int64_t i = 0; i < ni; i++)
               tile_move((D *)(dp + i * g.d0 + j * g.dk), (const S *)(sp + i * g.s0 + j * g.sk));
      }
      return LM_OK;
   });
#else
   int64_t blocks = g.tasks < 132 * 16 ? g.tasks : 132 * 16;
   tile_kernel<D, S><<<(unsigned)blocks, dim3(32, TROWS), 0, lm_cu_stream(k)>>>(g);
   return lm_cu_err(cudaPeekAtLastError(), "kernel launch");
#endif
}

/* f(Tag<S>()) for the floating dtypes (the converting transposes: float32 <-> float16 ...) */
template <class F> lm_status with_float_storage(int dt, F &&f) {
   switch (dt) {
   case LM_FLOAT32: return f(Tag<float>());
   case LM_FLOAT64: return f(Tag<double>());
   case LM_FLOAT16: return f(Tag<H16>());
   default: return f(Tag<BF16>());
   }
}

static void tile_geo(TileGeo &g, const lm_iter &it, int kd) {
   memset(&g, 0, sizeof g);
   g.d = (char *)it.base[0];
   g.s = (const char *)it.base[1];
   g.n0 = it.shape[0];
   g.nk = it.shape[kd];
   g.d0 = it.strides[0][0];
   g.dk = it.strides[0][kd];
   g.s0 = it.strides[1][0];
   g.sk = it.strides[1][kd];
   int64_t outer = 1;
   for (int d = 1; d < it.ndim; d++)
      if (d != kd) {
         g.oshape[g.no] = it.shape[d];
         g.ods[g.no] = it.strides[0][d];
         g.oss[g.no] = it.strides[1][d];
         g.no++;
         outer *= it.shape[d];
      }
   g.nti = (g.n0 + TILE - 1) / TILE;
   g.ntk = (g.nk + TILE - 1) / TILE;
   g.tasks = outer * g.nti * g.ntk;
}

/* ---------------------------------------------------------------- copy */

lm_status cu_copy(int k, int device, const lm_operand *dst, const lm_operand *src);

/* a dense copy on the device of an operand that partially overlaps an output */
lm_status materialize(int k, int device, lm_operand *op, lm_tensor **tmp) {
   LM_TRY(lm_empty(op->ndim, op->sizes, op->dtype, LM_CONTIGUOUS, device, tmp));
   lm_operand t;
   lm_operand_tensor(&t, *tmp);
   lm_status st = cu_copy(k, device, &t, op);
   if (st != LM_OK) {
      lm_tensor_free(*tmp);
      *tmp = NULL;
      return st;
   }
   t.wrapped = op->wrapped;
   *op = t;
   return LM_OK;
}

/* dst[...] = src broadcast to dst's shape, converted; dst has no internal overlap (checked by the
   front end), numel > 0 */
lm_status cu_copy(int k, int device, const lm_operand *dst, const lm_operand *src) {
   if (lm_operand_numel(dst) == 0) return LM_OK;
   lm_operand s = *src;
   lm_tensor *tmp = NULL;
   const int ov = lm_operands_overlap(dst, src);
   if (ov == 1 && dst->dtype == src->dtype) return LM_OK;
   if (ov == 2) LM_TRY(materialize(k, device, &s, &tmp));
   lm_operand ops[2] = {*dst, s};
   lm_iter it;
   lm_iter_init(&it, 2, ops, dst->ndim, dst->sizes);
   const int ddt = dst->dtype, sdt = s.dtype;
   const int des = lm_dtype_size(ddt), ses = lm_dtype_size(sdt);
   lm_status st = LM_OK;
   if (it.ndim == 1 && it.strides[0][0] == des && it.strides[1][0] == ses) {
      char *d = (char *)it.base[0];
      const char *sp = (const char *)it.base[1];
      if (ddt == sdt) {
         /* ov == 0 here: the identical view returned above, a partial overlap went to tmp */
         st = lm_cu_err(cudaMemcpyAsync(d, sp, (size_t)it.numel * (size_t)des,
                                        cudaMemcpyDeviceToDevice, lm_cu_stream(k)),
                        "cudaMemcpyAsync");
      } else {
         const int64_t n = it.numel;
         st = with_storage(ddt, [&](auto td) {
            return with_storage(sdt, [&](auto ts) {
               typedef typename decltype(td)::type SD;
               typedef typename decltype(ts)::type SS;
               ConvDense<SD, SS> b;
               b.d = d;
               b.s = sp;
               b.n = n;
               b.vec = (uintptr_t)d % (sizeof(SD) * VW) == 0 && (uintptr_t)sp % (sizeof(SS) * VW) == 0;
               return lm_cu_for(k, (n + VW - 1) / VW, b);
            });
         });
      }
   } else {
      /* dst unit-stride in dim 0, src in another dim: tiles (one dtype, or two float dtypes) */
      int kd = -1;
      const bool tconv = ddt != sdt && lm_is_float_dtype(ddt) && lm_is_float_dtype(sdt);
      if ((ddt == sdt || tconv) && it.ndim >= 2 && it.strides[0][0] == des &&
          it.strides[1][0] != ses && it.shape[0] >= 4) {
         for (int d = 1; d < it.ndim; d++)
            if (it.strides[1][d] == ses && it.shape[d] >= 4) {
               kd = d;
               break;
            }
      }
      if (kd > 0) {
         TileGeo g;
         tile_geo(g, it, kd);
         if (ddt == sdt) {
            st = with_bits(des, [&](auto te) {
               typedef typename decltype(te)::type E;
               return tile_run<E, E>(k, g);
            });
         } else {
            st = with_float_storage(ddt, [&](auto td) {
               return with_float_storage(sdt, [&](auto ts) {
                  return tile_run<typename decltype(td)::type, typename decltype(ts)::type>(k, g);
               });
            });
         }
      } else {
         Geo g;
         geo_of(g, it);
         if (ddt == sdt) {
            st = with_bits(des, [&](auto te) {
               MoveGen<typename decltype(te)::type> b;
               b.g = g;
               return lm_cu_for(k, it.numel, b);
            });
         } else {
            ConvGen b;
            b.g = g;
            b.ddt = ddt;
            b.sdt = sdt;
            st = lm_cu_for(k, it.numel, b);
         }
      }
   }
   /* tmp's memory is reused only by work queued after this copy on the same stream */
   lm_tensor_free(tmp);
   return st;
}

/* COPY: t = {dst, src} */
lm_status k_copy(const lm_op *op) {
   lm_operand d, s;
   lm_operand_tensor(&d, op->t[0]);
   lm_operand_tensor(&s, op->t[1]);
   return cu_copy(lm_cu_index(op->t[0]), op->t[0]->device, &d, &s);
}

/* FILL: t = {self} */
lm_status k_fill(const lm_op *op) {
   const lm_fill_params *p = (const lm_fill_params *)op->params;
   lm_tensor *t = op->t[0];
   const int k = lm_cu_index(t);
   const int es = lm_dtype_size(t->dtype);
   lm_operand m;
   lm_operand_tensor(&m, t);
   lm_iter it;
   lm_iter_init(&it, 1, &m, m.ndim, m.sizes);
   int zero = 1;
   for (int b = 0; b < es; b++) zero &= p->value[b] == 0;
   if (it.ndim == 1 && it.strides[0][0] == es && zero)
      return lm_cu_err(cudaMemsetAsync((void *)it.base[0], 0, (size_t)it.numel * (size_t)es,
                                       lm_cu_stream(k)),
                       "cudaMemsetAsync");
   return with_bits(es, [&](auto te) {
      typedef typename decltype(te)::type E;
      E v;
      memcpy(&v, p->value, sizeof v);
      if (it.ndim == 1 && it.strides[0][0] == es) {
         FillDense<E> b;
         b.d = (char *)it.base[0];
         b.v = v;
         return lm_cu_for(k, it.numel, b);
      }
      /* internal overlap (stride 0) is fine: every write stores the same bytes */
      FillGen<E> b;
      geo_of(b.g, it);
      b.v = v;
      return lm_cu_for(k, it.numel, b);
   });
}

/* ---------------------------------------------------------------- UNARY ... WHERE */

template <class T> T kp_pick(float f, double d, i64 i) {
   if constexpr (std::is_same<T, float>::value) return f;
   else if constexpr (std::is_same<T, double>::value) return d;
   else { (void)f; (void)d; return i; }
}

/* may the dense body run: storage dtype sdt for kernel kind */
bool homo_dtype_ok(int kind, int sdt) {
   return kind == LM_K_F32 ? (sdt == LM_FLOAT32 || sdt == LM_FLOAT16 || sdt == LM_BFLOAT16)
          : kind == LM_K_F64 ? sdt == LM_FLOAT64
                             : sdt == LM_INT64;
}

template <class T>
lm_status ew_run(int k, const lm_ew_params *pp, const lm_iter &it, const char *sbuf, int *err) {
   Args<T> a;
   memset(&a, 0, sizeof a);
   a.nin = pp->nin;
   a.kop = pp->kop;
   a.epi = pp->epi;
   for (int q = 0; q < MAXOPS; q++) a.dt[q] = q < it.nops ? it.dtype[q] : 0;
   for (int q = 0; q < 3; q++) a.in_dt[q] = pp->in_dt[q], a.via[q] = pp->via[q];
   a.out_dt = pp->out_dt;
   a.out_via = pp->out_via;
   a.scalar_k = pp->scalar_idx;
   a.sval = 0;
   if (a.scalar_k >= 0)
      a.sval = load_in<T>(sbuf, pp->scalar_dtype, pp->via[a.scalar_k], pp->in_dt[a.scalar_k]);
   a.p.alpha = kp_pick<T>(pp->p.alpha_f, pp->p.alpha_d, pp->p.alpha_i);
   a.p.val = kp_pick<T>(pp->p.val_f, pp->p.val_d, pp->p.val_i);
   a.p.lo = kp_pick<T>(pp->p.lo_f, pp->p.lo_d, pp->p.lo_i);
   a.p.hi = kp_pick<T>(pp->p.hi_f, pp->p.hi_d, pp->p.hi_i);
   a.p.err = err;
   const int nin = pp->nin, tb = pp->table;

   /* the dense path: element i at index i of every operand */
   const int oes = lm_dtype_size(it.dtype[0]);
   bool homo = it.ndim == 1 && it.strides[0][0] == oes;
   int sdt = -1;
   HomoLaunch l;
   memset(&l, 0, sizeof l);
   for (int q = 0; q < nin && homo; q++) {
      if (q == pp->scalar_idx) continue;
      const int dt = it.dtype[q + 1];
      const int64_t s = it.strides[q + 1][0];
      if (s != 0 && s != lm_dtype_size(dt)) homo = false;
      l.in[q] = (const char *)it.base[q + 1];
      l.bstride[q] = s != 0;
      if (tb == LM_EW_OTHER && pp->kop == LM_T_WHERE && q == 0) {
         if (dt != LM_BOOL && dt != LM_UINT8) homo = false;
         continue;
      }
      if (sdt < 0) sdt = dt;
      else if (sdt != dt) homo = false;
      if (pp->via[q] >= 0 && dt != pp->via[q] && pp->via[q] != pp->in_dt[q]) homo = false;
   }
   if (homo && (sdt < 0 || !homo_dtype_ok(pp->kind, sdt))) homo = false;
   if (homo) {
      const int dt0 = it.dtype[0];
      if (pp->out_dt == LM_BOOL) homo = dt0 == LM_BOOL;
      else homo = dt0 == sdt && !(pp->out_via >= 0 && pp->out_via != pp->out_dt && pp->out_via != dt0);
   }
   if (homo) {
      l.k = k;
      l.n = it.numel;
      l.out = (char *)it.base[0];
      l.sdt = sdt;
      l.kind = pp->kind;
      l.args = &a;
      return tb == LM_EW_UNARY ? homo_unary(l, pp->kop)
             : tb == LM_EW_BINARY ? homo_binary(l, pp->kop)
                                  : homo_other(l, pp->kop);
   }

   /* the general path */
   Geo g;
   geo_of(g, it);
   if (tb == LM_EW_UNARY) {
      GenBody<LM_EW_UNARY, T> b;
      b.g = g;
      b.a = a;
      return lm_cu_for(k, it.numel, b);
   } else if (tb == LM_EW_BINARY) {
      GenBody<LM_EW_BINARY, T> b;
      b.g = g;
      b.a = a;
      return lm_cu_for(k, it.numel, b);
   } else {
      GenBody<LM_EW_OTHER, T> b;
      b.g = g;
      b.a = a;
      return lm_cu_for(k, it.numel, b);
   }
}

static int same_shape(const lm_operand *a, const lm_operand *b) {
   if (a->ndim != b->ndim) return 0;
   for (int d = 0; d < a->ndim; d++)
      if (a->sizes[d] != b->sizes[d]) return 0;
   return 1;
}

/* UNARY ... WHERE: t = {out, in0, in1, in2} (ops/elementwise.h) */
lm_status k_ew(const lm_op *op) {
   const lm_ew_params *pp = (const lm_ew_params *)op->params;
   lm_tensor *o = op->t[0];
   const int k = lm_cu_index(o), nin = pp->nin;
   alignas(16) char sbuf[16];
   memcpy(sbuf, pp->scalar, sizeof sbuf);
   lm_operand ops[4], *ins = &ops[1];
   lm_operand_tensor(&ops[0], o);
   for (int q = 0; q < nin; q++) {
      if (q == pp->scalar_idx) lm_operand_scalar(&ins[q], sbuf, pp->scalar_dtype, pp->scalar_wrapped);
      else lm_operand_tensor(&ins[q], op->t[q + 1]);
   }
   lm_tensor *tmps[3] = {NULL, NULL, NULL};
   lm_status status = LM_OK;
   /* an input that partially overlaps out=: read from a copy (the CPU's materialize) */
   if (!pp->created)
      for (int q = 0; q < nin && status == LM_OK; q++)
         if (q != pp->scalar_idx && lm_operands_overlap(&ops[0], &ins[q]) == 2)
            status = materialize(k, o->device, &ins[q], &tmps[q]);
   lm_iter it;
   if (status == LM_OK) lm_iter_init(&it, nin + 1, ops, o->ndim, o->sizes);
   /* an input of the output's shape laid out in another order (NCHW + NHWC) would be read with a
      large stride: transpose it into the output's layout first (the tiled copy), as the CPU */
   int redo = 0;
   for (int q = 0; q < nin && status == LM_OK && o->numel >= 4096; q++) {
      const int64_t es = lm_dtype_size(ops[q + 1].dtype), s0 = it.strides[q + 1][0];
      if (q == pp->scalar_idx || s0 == 0 || s0 == es || it.shape[0] < 4 ||
          !same_shape(&ops[q + 1], &ops[0]) || tmps[q])
         continue;
      int unit = 0;
      for (int d = 1; d < it.ndim; d++) unit |= it.strides[q + 1][d] == es && it.shape[d] >= 4;
      if (!unit) continue;
      status = lm_empty_strided(o->ndim, o->sizes, o->strides, ops[q + 1].dtype, o->device, &tmps[q]);
      if (status != LM_OK) break;
      lm_operand t;
      lm_operand_tensor(&t, tmps[q]);
      status = cu_copy(k, o->device, &t, &ops[q + 1]);
      t.wrapped = ops[q + 1].wrapped;
      ops[q + 1] = t;
      redo = 1;
   }
   if (redo && status == LM_OK) lm_iter_init(&it, nin + 1, ops, o->ndim, o->sizes);
   /* integer fmod: a division-by-zero flag in device memory */
   const bool zdiv = pp->kind == LM_K_I64 && pp->table == LM_EW_BINARY && pp->kop == LM_FMOD;
   if (status == LM_OK && zdiv && lm_cu_capturing(k)) /* the flag would have to be read back */
      status = lm_error(LM_ERR_DEVICE, "integer fmod cannot be captured in a CUDA graph (its "
                        "division-by-zero check reads the device back)");
   int *err = NULL;
   if (status == LM_OK && zdiv) {
      err = (int *)lm_cu_alloc(k, sizeof(int));
      if (!err) status = LM_ERR_OOM;
      else status = lm_cu_err(cudaMemsetAsync(err, 0, sizeof(int), lm_cu_stream(k)), "cudaMemsetAsync");
   }
   if (status == LM_OK) {
      if (pp->kind == LM_K_F32) status = ew_run<float>(k, pp, it, sbuf, err);
      else if (pp->kind == LM_K_F64) status = ew_run<double>(k, pp, it, sbuf, err);
      else status = ew_run<i64>(k, pp, it, sbuf, err);
   }
   if (err) {
      int h = 0;
      if (status == LM_OK) status = lm_cu_memcpy(k, &h, err, sizeof(int), 1);
      lm_cu_free(k, err, sizeof(int));
      if (status == LM_OK && h) status = lm_error(LM_ERR_ARG, "ZeroDivisionError");
   }
   for (int q = 0; q < 3; q++) lm_tensor_free(tmps[q]);
   return status;
}

} /* namespace */

void lm_cuda_register_elementwise(lm_kernel_fn *table) {
   table[LM_OP_UNARY] = k_ew;
   table[LM_OP_CLAMP] = k_ew;
   table[LM_OP_BINARY] = k_ew;
   table[LM_OP_BINARY_SCALAR] = k_ew;
   table[LM_OP_BINARY_UNARY] = k_ew;
   table[LM_OP_BINARY_SCALAR_UNARY] = k_ew;
   table[LM_OP_ADDCMUL] = k_ew;
   table[LM_OP_ADDCDIV] = k_ew;
   table[LM_OP_WHERE] = k_ew;
   table[LM_OP_COPY] = k_copy;
   table[LM_OP_FILL] = k_fill;
}
