/* conv_graph.cu -- convolutions through cuDNN's graph (backend) API: one operation graph per
 * convolution (forward, backward data, backward filter), engine configurations from cuDNN's
 * heuristics (CUDNN_HEUR_MODE_A, then the fallback list), execution plans cached per shape key,
 * autotuned among the first candidates under lm.backends.cudnn.benchmark -- as PyTorch's
 * cuDNN v8 path (aten/src/ATen/native/cudnn/Conv_v8.cpp) does. conv.cu tries it first and falls
 * back to the legacy cudnnConvolution* calls when it declines (LUMEN_CUDNN_GRAPH=0: never tried).
 *
 * Why: the legacy API reaches only the engines behind its eight algorithm numbers; the faster
 * Hopper kernels (and the runtime-fused ones) are reachable only through the graph API. On the
 * one H200 run, lumen's bf16 ResNet-50 convolutions took 35 ms a step against PyTorch's 17.
 *
 * NOT YET RUN ON A GPU (issue 38): written against cuDNN 9's documented backend API and compiled
 * with nvcc; tools/gpu_check.sh runs the suite on it (spec/cuda_dnn_spec.lua compares every
 * convolution with the CPU) and times it beside LUMEN_CUDNN_GRAPH=0.
 *
 * Tensors: dims in N, C, H, W order with the layout's strides (NHWC: {HWC, 1, WC, C}); the filter
 * (O, C/G, kh, kw) likewise (cuDNN infers the groups from C and the filter's C/G). Compute type
 * float (double for float64). Engine configurations are filtered by their numerical notes as
 * PyTorch does: never DOWN_CONVERT_INPUTS or REDUCED_PRECISION_REDUCTION; float32 without TF32
 * (lm.backends.cudnn.allow_tf32 false) never TENSOR_CORE; deterministic mode never
 * NONDETERMINISTIC. A plan is cached with the byte alignment of the pointers it was made for.
 * Only a whole batch within cuDNN's 2^31-1 elements per tensor comes here, and only with beta 0
 * (the legacy path keeps the chunked case). Nothing here runs in the emulated build. */
#include "cuda.cuh"
#include "conv_graph.cuh"
#include "impl.h"

#ifndef LM_CUDA_EMU
#include <cudnn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace {

/* the descriptors one call makes, destroyed with it (a plan's are kept in the cache) */
struct Desc {
   cudnnBackendDescriptor_t d = NULL;
   Desc() {}
   Desc(const Desc &) = delete;
   Desc &operator=(const Desc &) = delete;
   ~Desc() {
      if (d) cudnnBackendDestroyDescriptor(d);
   }
   cudnnStatus_t make(cudnnBackendDescriptorType_t t) { return cudnnBackendCreateDescriptor(t, &d); }
   /* hand the descriptor over (to a cached plan's chain) */
   cudnnBackendDescriptor_t release() {
      cudnnBackendDescriptor_t r = d;
      d = NULL;
      return r;
   }
};

/* Every descriptor a plan was built from is kept for as long as the plan (cudnn-frontend keeps
   the whole chain -- tensors, convolution, operation, graph, heuristics, engine configuration --
   alive behind its plans; the backend API does not promise that a finalized descriptor has no
   reference to the ones it was built from). */
typedef std::vector<cudnnBackendDescriptor_t> Chain;
void destroy_all(Chain &c) {
   for (auto d : c)
      if (d) cudnnBackendDestroyDescriptor(d);
   c.clear();
}

#define G_TRY(call)                                                                               \
   do {                                                                                          \
      cudnnStatus_t g_s_ = (call);                                                               \
      if (g_s_ != CUDNN_STATUS_SUCCESS) return g_s_;                                             \
   } while (0)

cudnnStatus_t set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                  cudnnBackendAttributeType_t t, int64_t n, const void *v) {
   return cudnnBackendSetAttribute(d, a, t, n, v);
}

cudnnDataType_t data_type(int dt) {
   switch (dt) {
   case LM_FLOAT64: return CUDNN_DATA_DOUBLE;
   case LM_FLOAT16: return CUDNN_DATA_HALF;
   case LM_BFLOAT16: return CUDNN_DATA_BFLOAT16;
   default: return CUDNN_DATA_FLOAT;
   }
}

/* a tensor descriptor: dims (a, b, h, w) in the layout (nhwc: channels innermost) */
cudnnStatus_t tensor(Desc &t, int64_t uid, int dt, int nhwc, int64_t a, int64_t b, int64_t h,
                     int64_t w, int64_t align) {
   G_TRY(t.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
   const cudnnDataType_t ty = data_type(dt);
   const int64_t dims[4] = {a, b, h, w};
   int64_t str[4];
   if (nhwc) {
      str[0] = h * w * b, str[1] = 1, str[2] = w * b, str[3] = b;
   } else {
      str[0] = b * h * w, str[1] = h * w, str[2] = w, str[3] = 1;
   }
   G_TRY(set(t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ty));
   G_TRY(set(t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
   G_TRY(set(t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str));
   G_TRY(set(t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
   G_TRY(set(t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
   return cudnnBackendFinalize(t.d);
}

enum { UID_X = 'x', UID_W = 'w', UID_Y = 'y' };

/* the operation graph of one convolution over n images */
cudnnStatus_t op_graph(cudnnHandle_t h, int op, const conv_geom *g, int64_t n, int dt, int nhwc,
                       int64_t align, Desc &graph, Chain &keep) {
   Desc x, w, y, conv, oper;
   struct Keep { /* on every return: what was made goes to the chain */
      Chain &c;
      Desc *ds[5];
      ~Keep() {
         for (Desc *d : ds)
            if (d->d) c.push_back(d->release());
      }
   } kp{keep, {&x, &w, &y, &conv, &oper}};
   G_TRY(tensor(x, UID_X, dt, nhwc, n, g->C, g->H, g->W, align));
   G_TRY(tensor(w, UID_W, dt, nhwc, g->O, g->Cg, g->kh, g->kw, align));
   G_TRY(tensor(y, UID_Y, dt, nhwc, n, g->O, g->Ho, g->Wo, align));
   G_TRY(conv.make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
   const int64_t nd = 2;
   const cudnnDataType_t comp = dt == LM_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
   const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
   const int64_t pad[2] = {g->ph, g->pw}, stride[2] = {g->sh, g->sw}, dil[2] = {g->dh, g->dw};
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, nd, pad));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, nd, pad));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, nd, dil));
   G_TRY(set(conv.d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, nd, stride));
   G_TRY(cudnnBackendFinalize(conv.d));
   const cudnnBackendDescriptorType_t kind =
      op == CONV_GRAPH_FWD        ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
      : op == CONV_GRAPH_BWD_DATA ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                  : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
   G_TRY(oper.make(kind));
   const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
   if (op == CONV_GRAPH_FWD) {
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, D, 1, &x.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, D, 1, &w.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, D, 1, &y.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, D, 1, &conv.d));
   } else if (op == CONV_GRAPH_BWD_DATA) {
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, D, 1, &x.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, D, 1, &w.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, D, 1, &y.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, D, 1, &conv.d));
   } else {
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, D, 1, &x.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, D, 1, &w.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, D, 1, &y.d));
      G_TRY(set(oper.d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, D, 1, &conv.d));
   }
   /* alpha 1, beta 0, set explicitly as cudnn-frontend does: float for the float types, double
      for float64 (the convolution's compute type) */
   const double one_d = 1.0, zero_d = 0.0;
   const float one_f = 1.0f, zero_f = 0.0f;
   const bool dbl = dt == LM_FLOAT64;
   const cudnnBackendAttributeType_t ST = dbl ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
   const void *one = dbl ? (const void *)&one_d : (const void *)&one_f;
   const void *zero = dbl ? (const void *)&zero_d : (const void *)&zero_f;
   const cudnnBackendAttributeName_t alpha =
      op == CONV_GRAPH_FWD        ? CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA
      : op == CONV_GRAPH_BWD_DATA ? CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA
                                  : CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA;
   const cudnnBackendAttributeName_t beta =
      op == CONV_GRAPH_FWD        ? CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA
      : op == CONV_GRAPH_BWD_DATA ? CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA
                                  : CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
   G_TRY(set(oper.d, alpha, ST, 1, one));
   G_TRY(set(oper.d, beta, ST, 1, zero));
   G_TRY(cudnnBackendFinalize(oper.d));
   G_TRY(graph.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
   G_TRY(set(graph.d, CUDNN_ATTR_OPERATIONGRAPH_OPS, D, 1, &oper.d));
   G_TRY(set(graph.d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
   return cudnnBackendFinalize(graph.d);
}

/* may an engine configuration be used under the switches (its numerical notes)? */
bool cfg_allowed(cudnnBackendDescriptor_t cfg, int dt, bool tf32, bool det) {
   Desc engine;
   if (engine.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR) != CUDNN_STATUS_SUCCESS) return false;
   int64_t got = 0;
   if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                &got, &engine.d) != CUDNN_STATUS_SUCCESS || got != 1)
      return false;
   cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
   int64_t nn = 0;
   if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn,
                                notes) != CUDNN_STATUS_SUCCESS)
      return false;
   for (int64_t i = 0; i < nn; i++) {
      const cudnnBackendNumericalNote_t t = notes[i];
      if (t == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
          t == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
         return false;
      if (t == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dt == LM_FLOAT32 && !tf32) return false;
      if (t == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && det) return false;
   }
   return true;
}

/* the engine configurations of a heuristics mode, best first (the heuristics descriptor goes
   to keep) */
cudnnStatus_t heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                         std::vector<cudnnBackendDescriptor_t> &out, Chain &keep) {
   Desc heur;
   struct Keep {
      Chain &c;
      Desc &d;
      ~Keep() {
         if (d.d) c.push_back(d.release());
      }
   } kp{keep, heur};
   G_TRY(heur.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
   G_TRY(set(heur.d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &graph));
   G_TRY(set(heur.d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
   G_TRY(cudnnBackendFinalize(heur.d));
   int64_t count = 0;
   G_TRY(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL));
   if (count <= 0) return CUDNN_STATUS_SUCCESS;
   std::vector<cudnnBackendDescriptor_t> cfgs((size_t)count, (cudnnBackendDescriptor_t)NULL);
   for (auto &c : cfgs) {
      const cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c);
      if (s != CUDNN_STATUS_SUCCESS) {
         for (auto &d : cfgs)
            if (d) cudnnBackendDestroyDescriptor(d);
         return s;
      }
   }
   int64_t got = 0;
   const cudnnStatus_t s = cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                                    cfgs.data());
   for (int64_t i = 0; i < count; i++) {
      if (s == CUDNN_STATUS_SUCCESS && i < got) out.push_back(cfgs[(size_t)i]);
      else cudnnBackendDestroyDescriptor(cfgs[(size_t)i]);
   }
   return s;
}

/* one cached choice: the plan (NULL: the graph API declined this key), its workspace, and the
   descriptors it was built from (never freed while the plan is cached) */
struct Plan {
   cudnnBackendDescriptor_t plan = NULL;
   int64_t ws = 0;
   Chain *chain = NULL;
};

pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
std::unordered_map<std::string, Plan> cache[LM_NUM_CUDA];

std::string key_of(int op, const conv_geom *g, int64_t n, int dt, int nhwc, int64_t align,
                   bool tf32, bool det, bool bench) {
   const int64_t k[] = {op,    dt,    nhwc,  align, tf32,  det,   bench, n,     g->C,
                        g->H,  g->W,  g->O,  g->Ho, g->Wo, g->kh, g->kw, g->sh, g->sw,
                        g->ph, g->pw, g->dh, g->dw, g->G};
   return std::string((const char *)k, sizeof k);
}

/* the variant pack of one call */
cudnnStatus_t execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *x, void *w, void *y,
                      void *ws) {
   Desc pack;
   G_TRY(pack.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
   void *ptrs[3] = {x, w, y};
   const int64_t uids[3] = {UID_X, UID_W, UID_Y};
   G_TRY(set(pack.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs));
   G_TRY(set(pack.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids));
   G_TRY(set(pack.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws));
   G_TRY(cudnnBackendFinalize(pack.d));
   return cudnnBackendExecute(h, plan, pack.d);
}

/* a plan for an engine configuration, and its workspace; NULL when it does not finalize */
cudnnBackendDescriptor_t make_plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg, int64_t *ws) {
   cudnnBackendDescriptor_t plan = NULL;
   if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
       CUDNN_STATUS_SUCCESS)
      return NULL;
   int64_t got = 0;
   if (set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &cfg) != CUDNN_STATUS_SUCCESS ||
       set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) !=
          CUDNN_STATUS_SUCCESS ||
       cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS ||
       cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                1, &got, ws) != CUDNN_STATUS_SUCCESS) {
      cudnnBackendDestroyDescriptor(plan);
      return NULL;
   }
   return plan;
}

/* the byte alignment the pointers share (16 at most) */
int64_t alignment_of(const void *a, const void *b, const void *c) {
   const uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
   int64_t al = 16;
   while (al > 1 && (u & (uintptr_t)(al - 1))) al /= 2;
   return al;
}

int graph_off(void) {
   static int v = -1;
   if (v < 0) {
      const char *e = getenv("LUMEN_CUDNN_GRAPH");
      v = e && !strcmp(e, "0");
   }
   return v;
}

/* the benchmark: time one execution of each candidate plan (after one untimed run), keep the
   fastest; the others are destroyed */
enum { BENCH_MAX = 8 };

} // namespace

/* remember that the graph API declined this key (the legacy API takes it from now on) */
static void decline(int k, const std::string &key) {
   pthread_mutex_lock(&cache_lock);
   auto it = cache[k].find(key);
   if (it == cache[k].end()) {
      cache[k].emplace(key, Plan());
   } else if (it->second.plan) {
      /* a plan that failed to execute: dropped (nothing else holds it: callers copy the
         descriptor only under the lock and execute it after; a concurrent executor on another
         thread is not a case lumen has, one stream per device) */
      cudnnBackendDestroyDescriptor(it->second.plan);
      if (it->second.chain) {
         destroy_all(*it->second.chain);
         delete it->second.chain;
      }
      it->second = Plan();
   }
   pthread_mutex_unlock(&cache_lock);
}

int lm_conv_graph_run(int k, cudnnHandle_t h, int op, const conv_geom *g, int dt, int nhwc,
                      void *x, void *w, void *y, lm_status *st, const char **impl) {
   *impl = NULL;
   *st = LM_OK;
   if (graph_off()) return 0;
   const bool tf32 = dt != LM_FLOAT32 || lm_cu_option(LM_CU_OPT_TF32_CONV);
   const bool det = lm_cu_option(LM_CU_OPT_DETERMINISTIC) != 0;
   const bool bench_on = lm_cu_option(LM_CU_OPT_BENCHMARK) != 0;
   /* no timing inside a graph capture (it waits for the kernels); the benchmark overwrites the
      output, which is all the op writes (beta 0) */
   const bool bench = bench_on && !lm_cu_capturing(k);
   const int64_t align = alignment_of(x, w, y);
   const std::string key = key_of(op, g, g->N, dt, nhwc, align, tf32, det, bench_on);
   Plan p;
   bool hit = false;
   pthread_mutex_lock(&cache_lock);
   auto it = cache[k].find(key);
   if (it != cache[k].end()) {
      p = it->second;
      hit = true;
   }
   pthread_mutex_unlock(&cache_lock);
   if (hit && !p.plan) return 0; /* declined before */
   /* no plan is built inside a graph capture (heuristics and runtime-compiled engines do what a
      capture forbids): the legacy API's host-side heuristic takes a shape the warm-up missed */
   if (!hit && lm_cu_any_capturing()) return 0;
   if (!hit) {
      Chain *keep = new Chain();
      Desc graph;
      std::vector<cudnnBackendDescriptor_t> cfgs;
      cudnnStatus_t s = op_graph(h, op, g, g->N, dt, nhwc, align, graph, *keep);
      /* mode A, then the fallback list (also when mode A found nothing or failed) */
      if (s == CUDNN_STATUS_SUCCESS) {
         (void)heuristics(graph.d, CUDNN_HEUR_MODE_A, cfgs, *keep);
         (void)heuristics(graph.d, CUDNN_HEUR_MODE_FALLBACK, cfgs, *keep);
      }
      if (graph.d) keep->push_back(graph.release());
      /* candidates in order: the allowed ones whose plan finalizes (each with its engine
         configuration, kept with the chosen plan) */
      std::vector<Plan> cands;
      std::vector<cudnnBackendDescriptor_t> cand_cfg;
      for (auto c : cfgs) {
         bool used = false;
         if ((int)cands.size() < (bench ? BENCH_MAX : 1) && cfg_allowed(c, dt, tf32, det)) {
            Plan q;
            q.plan = make_plan(h, c, &q.ws);
            if (q.plan) {
               cands.push_back(q);
               cand_cfg.push_back(c);
               used = true;
            }
         }
         if (!used) cudnnBackendDestroyDescriptor(c);
      }
      int best = -1;
      if (cands.size() == 1 || (!cands.empty() && !bench)) {
         best = 0;
      } else if (!cands.empty()) {
         float best_ms = 0;
         cudaEvent_t e0 = NULL, e1 = NULL;
         const cudaStream_t cs = lm_cu_stream(k);
         if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
            for (int i = 0; i < (int)cands.size(); i++) {
               const Plan &q = cands[(size_t)i];
               void *ws = q.ws ? lm_cu_alloc(k, (size_t)q.ws) : NULL;
               if (q.ws && !ws) {
                  lm_clear_error();
                  continue;
               }
               float ms = -1;
               if (execute(h, q.plan, x, w, y, ws) == CUDNN_STATUS_SUCCESS &&
                   cudaEventRecord(e0, cs) == cudaSuccess &&
                   execute(h, q.plan, x, w, y, ws) == CUDNN_STATUS_SUCCESS &&
                   cudaEventRecord(e1, cs) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
                   cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
                  ms = -1;
               if (ws) lm_cu_free(k, ws, (size_t)q.ws);
               if (ms >= 0 && (best < 0 || ms < best_ms)) {
                  best = i;
                  best_ms = ms;
               }
            }
         }
         if (e0) cudaEventDestroy(e0);
         if (e1) cudaEventDestroy(e1);
         (void)cudaGetLastError();
      }
      for (int i = 0; i < (int)cands.size(); i++)
         if (i != best) {
            cudnnBackendDestroyDescriptor(cands[(size_t)i].plan);
            cudnnBackendDestroyDescriptor(cand_cfg[(size_t)i]);
         }
      if (best >= 0) {
         p = cands[(size_t)best];
         keep->push_back(cand_cfg[(size_t)best]);
         p.chain = keep;
      } else {
         destroy_all(*keep);
         delete keep;
      }
      pthread_mutex_lock(&cache_lock);
      auto ins = cache[k].emplace(key, p);
      if (!ins.second && p.plan) { /* made meanwhile by another call: keep that one */
         cudnnBackendDestroyDescriptor(p.plan);
         destroy_all(*p.chain);
         delete p.chain;
         p = ins.first->second;
      }
      pthread_mutex_unlock(&cache_lock);
      if (!p.plan) return 0;
   }
   void *ws = NULL;
   if (p.ws) {
      ws = lm_cu_alloc(k, (size_t)p.ws);
      if (!ws) { /* the legacy API may find an algorithm with a smaller workspace */
         lm_clear_error();
         return 0;
      }
   }
   const cudnnStatus_t s = execute(h, p.plan, x, w, y, ws);
   if (ws) lm_cu_free(k, ws, (size_t)p.ws);
   if (s != CUDNN_STATUS_SUCCESS) {
      decline(k, key);
      return 0;
   }
   *impl = op == CONV_GRAPH_FWD ? "cudnn_graph_fprop"
           : op == CONV_GRAPH_BWD_DATA ? "cudnn_graph_dgrad" : "cudnn_graph_wgrad";
   return 1;
}

#endif /* !LM_CUDA_EMU */
