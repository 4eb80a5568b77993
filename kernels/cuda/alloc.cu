/* alloc.cu -- cuda:k's device memory (a caching allocator) and the copies between host and device.
 *
 * The caching allocator follows PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp):
 *   - Requests are rounded up to 512 bytes. Requests of at most 1 MiB come from the small pool,
 *     whose segments (one cudaMalloc each) are 2 MiB; larger ones from the large pool, whose
 *     segments are 20 MiB for requests under 10 MiB (several mid-size blocks share one) and the
 *     request rounded up to 2 MiB from 10 MiB on.
 *   - Free blocks are kept per pool in a set sorted by (stream, size, address); a request takes
 *     the smallest free block of its stream that fits (best fit). A block larger than needed is
 *     split when the remainder is worth keeping (>= 512 bytes in the small pool, > 1 MiB in the
 *     large one); the remainder stays free. A freed block merges with its free neighbours in the
 *     segment, so a segment cut into pieces becomes whole again once they are all freed.
 *   - Blocks are stream-ordered: a block freed on stream s is handed out again only for work on s.
 *     Work on one stream runs in order, so freeing never waits for the GPU: the kernels queued
 *     before the free finish before anything queued after the reuse starts. (One stream per device
 *     today, lm_cu_stream(k); the free lists are keyed by stream all the same.)
 *   - When cudaMalloc fails, every cached segment that is whole (not split, nothing live in it) is
 *     released (cudaFree, after a device synchronisation) and the cudaMalloc is tried once more;
 *     then the request fails with LM_ERR_OOM "cuda:0: out of memory: tried to allocate X MiB; Y MiB
 *     live, Z MiB cached". lm.cuda.set_per_process_memory_fraction caps the reserved bytes the same
 *     way (the emulated build's specs use it to reach the out-of-memory path).
 *   - Counters per device: live bytes (blocks handed out, rounded sizes, as PyTorch's
 *     memory_allocated), their peak, reserved bytes (every segment: live + cached), cudaMalloc and
 *     cudaFree calls, retries after a failure, out-of-memory errors.
 *
 * Collections. A tensor dropped in Lua releases its device block only when Lua's collector finds it
 * dead, and the collector cannot see device bytes. So, as the CPU allocator does for host bytes
 * (src/alloc.c), the device allocator asks for a collection: when live device bytes have grown by
 * more than the growth limit since the last collection, it raises liblumen's device-pressure bit
 * (lm_mem_note_device_pressure); lm_mem_pressure() reports it, the next tensor made collects
 * (lua/lumen/memory.lua), and lm_mem_collected() tells every device (lm_cu_collected) to take the
 * live bytes as its new base. The growth limit is a quarter of the device's memory (the emulated
 * build: 256 MiB of host memory), at most half of what the live bytes leave free under the limit,
 * and at least 64 MiB; LUMEN_CUDA_SOFT_LIMIT (bytes) fixes it. A collection costs the Lua heap's
 * marking (1-2 ms in a training script), so it must be rare against the GPU's work: a generous
 * limit, bounded by the memory that is really there. In a training loop the live bytes then come
 * back to the working set at every collection, and the cache serves the next round: flat.
 *
 * Copies (lm_cu_memcpy): small ones go straight (cudaMemcpyAsync on the device's stream, then a
 * stream synchronisation). Large host<->device copies go through two pinned staging buffers of
 * 4 MiB per device (cudaHostAlloc'ed on first use), double-buffered with events: host to device,
 * the memcpy of chunk i+1 into one buffer overlaps the DMA of chunk i from the other, and the call
 * returns as soon as the last chunk is queued (the host memory has been read; kernels queued after
 * it on the stream see the data); device to host, the DMA of chunk i+1 overlaps the memcpy of chunk
 * i out of the other buffer. Pageable memory would go through the driver's own staging buffer
 * with a synchronous copy per call. */
#include "cuda.cuh"
#include "alloc_api.cuh"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <set>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kMinBlock = 512;                  /* every size is rounded to this */
constexpr size_t kSmallSize = (size_t)1 << 20;     /* the small pool: requests <= 1 MiB */
constexpr size_t kSmallBuffer = (size_t)2 << 20;   /* its segments */
constexpr size_t kMinLargeAlloc = (size_t)10 << 20;/* from here large segments fit the request */
constexpr size_t kLargeBuffer = (size_t)20 << 20;  /* below it: shared 20 MiB segments */
constexpr size_t kRoundLarge = (size_t)2 << 20;    /* large segments are multiples of this */
constexpr size_t kStageBytes = (size_t)4 << 20;    /* one pinned staging buffer */
constexpr size_t kDirectCopy = (size_t)1 << 20;    /* copies up to this go straight */
constexpr int64_t kMinGrowth = (int64_t)64 << 20;

struct Pool;
struct PrivatePool;

struct Block {
   char *ptr;
   size_t size;
   cudaStream_t stream;
   Pool *pool;
   Block *prev, *next; /* neighbours in the segment, in address order */
   bool allocated;
};

struct BlockLess {
   bool operator()(const Block *a, const Block *b) const {
      if (a->stream != b->stream) return (uintptr_t)a->stream < (uintptr_t)b->stream;
      if (a->size != b->size) return a->size < b->size;
      return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
   }
};

struct Pool {
   std::set<Block *, BlockLess> free_blocks;
   bool small;
   PrivatePool *owner; /* NULL: the device's own pools; else the graph pool it belongs to */
};

/* A CUDA graph's memory (graph.cu; PyTorch's graph pools): while cuda:k captures into it, every
   allocation comes from here, so the addresses the graph's kernels were captured with are never
   handed to work outside the graph; a block freed later returns here, for the next capture that
   shares the pool (lm.cuda.graph_pool_handle) and for nothing else. A block of the device's own
   pools freed during a capture may still be read by the captured kernels at each replay: it is
   held (kept out of the free lists) until the pool goes. The pool goes, its segments returned to
   the GPU, when no graph uses it and none of its blocks is live. */
struct PrivatePool {
   uint64_t id;
   Pool small, large;
   int graphs;                /* graphs captured or capturing into it */
   int64_t nlive;             /* its blocks handed out */
   int64_t bytes;             /* its segments' bytes */
   std::vector<Block *> held; /* the device pools' blocks freed during a capture into it */
};

struct Device {
   pthread_mutex_t mu;
   bool ready;
   Pool small, large;
   std::unordered_map<void *, Block *> live_blocks;
   std::map<uintptr_t, size_t> segments; /* start -> bytes of every segment (owner_of) */
   PrivatePool *capturing;                 /* a capture's pool, or NULL */
   std::map<uint64_t, PrivatePool *> privates;
   int64_t live, peak, reserved;
   int64_t nmalloc, nfree, nretry, noom;
   size_t total;         /* the device's memory (cudaMemGetInfo) */
   double fraction;      /* set_per_process_memory_fraction: reserved <= fraction * total */
   /* the collection trigger */
   int64_t live_base, growth_limit;
   bool asked;
   /* pinned staging for host<->device copies */
   pthread_mutex_t stage_mu;
   void *stage[2];
   cudaEvent_t stage_ev[2];
   bool staged;
};

/* on the heap and never destroyed (as PyTorch's allocator): a tensor freed while the process
   exits, after static destructors have run, must still find its device's tables */
Device *devs;
pthread_once_t devs_once = PTHREAD_ONCE_INIT;

void init_devs() {
   devs = new Device[LM_NUM_CUDA]();
   for (int k = 0; k < LM_NUM_CUDA; k++) {
      Device &d = devs[k];
      pthread_mutex_init(&d.mu, NULL);
      pthread_mutex_init(&d.stage_mu, NULL);
      d.small.small = true;
      d.large.small = false;
      d.fraction = 1.0;
      d.growth_limit = -1;
   }
}

Device &dev_of(int k) {
   pthread_once(&devs_once, init_devs);
   return devs[k];
}

double mib(int64_t b) { return (double)b / (1024.0 * 1024.0); }

int64_t fixed_growth_limit() {
   static int64_t v = -2;
   if (v == -2) {
      const char *e = getenv("LUMEN_CUDA_SOFT_LIMIT");
      long long x = e && *e ? atoll(e) : -1;
      v = x > 0 ? (int64_t)x : -1;
   }
   return v;
}

/* the growth of live bytes that asks for a collection (see the top) */
int64_t growth_limit_of(const Device &d) {
   const int64_t fixed = fixed_growth_limit();
   if (fixed > 0) return fixed;
   const int64_t cap = (int64_t)(d.fraction * (double)d.total);
#ifdef LM_CUDA_EMU
   int64_t g = (int64_t)256 << 20; /* "device" memory is the host's here */
#else
   int64_t g = cap / 4;
#endif
   const int64_t room = (cap - d.live_base) / 2;
   if (g > room) g = room;
   return g < kMinGrowth ? kMinGrowth : g;
}

/* first use of a device: its size (under the device's lock) */
lm_status ready(int k, Device &d) {
   if (d.ready) return LM_OK;
   size_t free_b = 0, total = 0;
   LM_CU_TRY(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
   d.total = total;
   d.ready = true;
   d.growth_limit = growth_limit_of(d);
   (void)k;
   return LM_OK;
}

size_t round_size(size_t n) {
   if (n < kMinBlock) return kMinBlock;
   return (n + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t segment_size(size_t size) {
   if (size <= kSmallSize) return kSmallBuffer;
   if (size < kMinLargeAlloc) return kLargeBuffer;
   return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool worth_splitting(const Pool &p, size_t remaining) {
   return p.small ? remaining >= kMinBlock : remaining > kSmallSize;
}

/* release every cached whole segment of d (cuda:k's lock held): after a synchronisation, since
   kernels queued before a block was freed may still be using it */
void release_cached(int k, Device &d) {
   (void)k;
   cudaDeviceSynchronize();
   Pool *pools[2] = {&d.small, &d.large};
   for (Pool *p : pools) {
      for (auto it = p->free_blocks.begin(); it != p->free_blocks.end();) {
         Block *b = *it;
         if (!b->prev && !b->next) {
            it = p->free_blocks.erase(it);
            d.segments.erase((uintptr_t)b->ptr);
            cudaFree(b->ptr);
            d.reserved -= (int64_t)b->size;
            d.nfree++;
            delete b;
         } else {
            ++it;
         }
      }
   }
}

/* a new segment of `bytes` (cuda:k's lock held; k is current); NULL when the device has none */
Block *new_segment(int k, Device &d, Pool &pool, size_t bytes, cudaStream_t s) {
   void *p = NULL;
   cudaError_t e = cudaErrorMemoryAllocation;
   for (int attempt = 0; attempt < 2; attempt++) {
      const bool capped = d.fraction < 1.0 &&
                          (double)(d.reserved + (int64_t)bytes) > d.fraction * (double)d.total;
      if (!capped) {
#ifndef LM_CUDA_EMU
         /* inside a capture cudaMalloc is an "unsafe" call for the global capture mode: allowed
            as PyTorch's allocator does it, in relaxed mode (the graph gets new addresses and
            its replays do not allocate) */
         const bool cap = lm_cu_any_capturing() != 0;
         cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
         if (cap) cudaThreadExchangeStreamCaptureMode(&mode);
         e = cudaMalloc(&p, bytes);
         if (cap) cudaThreadExchangeStreamCaptureMode(&mode);
#else
         e = cudaMalloc(&p, bytes);
#endif
         if (e == cudaSuccess) break;
#ifndef LM_CUDA_EMU
         (void)cudaGetLastError(); /* an allocation failure is not sticky, but clear it */
#endif
         p = NULL;
      }
      if (attempt == 0 && !lm_cu_any_capturing()) { /* release_cached waits for the GPU */
         d.nretry++;
         release_cached(k, d);
      }
   }
   if (!p) return NULL;
   d.nmalloc++;
   d.reserved += (int64_t)bytes;
   d.segments[(uintptr_t)p] = bytes;
   if (pool.owner) pool.owner->bytes += (int64_t)bytes;
   Block *b = new Block;
   b->ptr = (char *)p;
   b->size = bytes;
   b->stream = s;
   b->pool = &pool;
   b->prev = b->next = NULL;
   b->allocated = false;
   return b;
}

/* put a free block into its pool, merged with its free neighbours first */
void insert_free(Block *b) {
   Pool *p = b->pool;
   if (b->prev && !b->prev->allocated) {
      Block *a = b->prev;
      p->free_blocks.erase(a);
      a->size += b->size;
      a->next = b->next;
      if (b->next) b->next->prev = a;
      delete b;
      b = a;
   }
   if (b->next && !b->next->allocated) {
      Block *c = b->next;
      p->free_blocks.erase(c);
      b->size += c->size;
      b->next = c->next;
      if (c->next) c->next->prev = b;
      delete c;
   }
   p->free_blocks.insert(b);
}

/* give back the graph pools no graph and no live block uses (d's lock held): their segments to
   the GPU, the blocks they held to the device's pools. Not during a capture (cudaFree waits for
   the device); lm_cu_pool_end calls it again. */
void release_privates(Device &d) {
   if (d.capturing || lm_cu_any_capturing()) return;
   bool synced = false;
   /* again while a release returned held blocks that leave another pool empty */
   for (bool again = true; again;) {
   again = false;
   for (auto it = d.privates.begin(); it != d.privates.end();) {
      PrivatePool *pp = it->second;
      if (pp->graphs > 0 || pp->nlive > 0) {
         ++it;
         continue;
      }
      if (!synced) {
         cudaDeviceSynchronize(); /* a replay may still be using the memory */
         synced = true;
      }
      for (Block *b : pp->held) {
         /* a held block of another graph's pool still counted as live there until now */
         PrivatePool *owner = b->pool->owner;
         b->allocated = false;
         insert_free(b);
         if (owner && owner != pp && --owner->nlive == 0 && owner->graphs == 0) again = true;
      }
      Pool *pools[2] = {&pp->small, &pp->large};
      for (Pool *p : pools) {
         for (Block *b : p->free_blocks) {
            /* every block is free, so each segment is one merged block */
            d.segments.erase((uintptr_t)b->ptr);
            cudaFree(b->ptr);
            d.reserved -= (int64_t)b->size;
            d.nfree++;
            delete b;
         }
      }
      delete pp;
      it = d.privates.erase(it);
   }
   }
}

} // namespace

void *lm_cu_alloc(int k, size_t nbytes) {
   if (k < 0 || k >= LM_NUM_CUDA) {
      lm_error(LM_ERR_ARG, "cuda:%d: no such device", k);
      return NULL;
   }
   if (lm_cu_set_device(k) != LM_OK) return NULL;
   Device &d = dev_of(k);
   const size_t size = round_size(nbytes);
   const cudaStream_t s = lm_cu_stream(k);
   pthread_mutex_lock(&d.mu);
   if (ready(k, d) != LM_OK) {
      pthread_mutex_unlock(&d.mu);
      return NULL;
   }
   PrivatePool *pp = d.capturing;
   Pool &pool = pp ? (size <= kSmallSize ? pp->small : pp->large)
                   : (size <= kSmallSize ? d.small : d.large);
   Block key{};
   key.ptr = NULL;
   key.size = size;
   key.stream = s;
   Block *b = NULL;
   auto it = pool.free_blocks.lower_bound(&key);
   if (it != pool.free_blocks.end() && (*it)->stream == s) {
      b = *it;
      pool.free_blocks.erase(it);
   } else {
      b = new_segment(k, d, pool, segment_size(size), s);
      if (!b) {
         d.noom++;
         const int64_t live = d.live, cached = d.reserved - d.live;
         pthread_mutex_unlock(&d.mu);
         lm_error(LM_ERR_OOM, "cuda:%d: out of memory: tried to allocate %.2f MiB; %.2f MiB live, "
                  "%.2f MiB cached", k, mib((int64_t)size), mib(live), mib(cached));
         return NULL;
      }
   }
   if (worth_splitting(pool, b->size - size)) {
      Block *rest = new Block;
      rest->ptr = b->ptr + size;
      rest->size = b->size - size;
      rest->stream = s;
      rest->pool = &pool;
      rest->allocated = false;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool.free_blocks.insert(rest);
   }
   b->allocated = true;
   if (pool.owner) pool.owner->nlive++;
   d.live_blocks[b->ptr] = b;
   d.live += (int64_t)b->size;
   if (d.live > d.peak) d.peak = d.live;
   bool ask = false;
   if (!d.asked && d.live - d.live_base > d.growth_limit) ask = d.asked = true;
   void *p = b->ptr;
   pthread_mutex_unlock(&d.mu);
   if (ask) lm_mem_note_device_pressure();
   return p;
}

void lm_cu_free(int k, void *p, size_t nbytes) {
   (void)nbytes;
   if (!p || k < 0 || k >= LM_NUM_CUDA) return;
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   auto it = d.live_blocks.find(p);
   if (it != d.live_blocks.end()) {
      Block *b = it->second;
      d.live_blocks.erase(it);
      d.live -= (int64_t)b->size;
      PrivatePool *owner = b->pool->owner;
      if (d.capturing && owner != d.capturing) {
         /* captured kernels may use it at every replay: held (still marked allocated, so no
            neighbour merges with it; a block of another graph's pool still counted live
            there) until the capture's pool goes */
         d.capturing->held.push_back(b);
      } else {
         b->allocated = false;
         insert_free(b);
         if (owner && --owner->nlive == 0 && owner->graphs == 0) release_privates(d);
      }
   }
   pthread_mutex_unlock(&d.mu);
}

/* ---- graph pools (graph.cu) ---- */

lm_status lm_cu_pool_begin(int k, uint64_t id) {
   LM_TRY(lm_cu_set_device(k));
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   lm_status st = ready(k, d);
   if (st == LM_OK && d.capturing)
      st = lm_error(LM_ERR_DEVICE, "cuda:%d is already capturing a graph", k);
   if (st == LM_OK) {
      PrivatePool *pp;
      auto it = d.privates.find(id);
      if (it != d.privates.end()) {
         pp = it->second;
      } else {
         pp = new PrivatePool();
         pp->id = id;
         pp->small.small = true;
         pp->large.small = false;
         pp->small.owner = pp->large.owner = pp;
         d.privates[id] = pp;
      }
      pp->graphs++;
      d.capturing = pp;
   }
   pthread_mutex_unlock(&d.mu);
   return st;
}

void lm_cu_pool_end(int k) {
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   d.capturing = NULL;
   release_privates(d);
   pthread_mutex_unlock(&d.mu);
}

void lm_cu_pool_release(int k, uint64_t id) {
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   auto it = d.privates.find(id);
   if (it != d.privates.end() && it->second->graphs > 0) it->second->graphs--;
   release_privates(d);
   pthread_mutex_unlock(&d.mu);
}

/* ---- what liblumen's lm_cuda_* API reaches (backend.cu registers them) ---- */

lm_status lm_cu_memory_stats(int k, int64_t *out) {
   LM_TRY(lm_cu_set_device(k));
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   const lm_status st = ready(k, d);
   out[LM_CUDA_STAT_LIVE] = d.live;
   out[LM_CUDA_STAT_PEAK] = d.peak;
   out[LM_CUDA_STAT_RESERVED] = d.reserved;
   out[LM_CUDA_STAT_MALLOCS] = d.nmalloc;
   out[LM_CUDA_STAT_FREES] = d.nfree;
   out[LM_CUDA_STAT_RETRIES] = d.nretry;
   out[LM_CUDA_STAT_OOMS] = d.noom;
   out[LM_CUDA_STAT_GROWTH_LIMIT] = d.growth_limit;
   pthread_mutex_unlock(&d.mu);
   return st;
}

lm_status lm_cu_empty_cache(int k) {
   LM_TRY(lm_cu_set_device(k));
   if (lm_cu_capturing(k)) /* release_cached waits for the device */
      return lm_error(LM_ERR_DEVICE, "cuda:%d is capturing a CUDA graph: empty the cache after "
                      "the capture", k);
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   release_cached(k, d);
   pthread_mutex_unlock(&d.mu);
   return LM_OK;
}

void lm_cu_reset_peak(int k) {
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   d.peak = d.live;
   pthread_mutex_unlock(&d.mu);
}

lm_status lm_cu_set_memory_fraction(int k, double fraction) {
   if (!(fraction > 0.0 && fraction <= 1.0))
      return lm_error(LM_ERR_ARG, "the fraction must be in (0, 1], got %g", fraction);
   LM_TRY(lm_cu_set_device(k));
   Device &d = dev_of(k);
   pthread_mutex_lock(&d.mu);
   lm_status st = ready(k, d);
   if (st == LM_OK) {
      d.fraction = fraction;
      d.growth_limit = growth_limit_of(d);
   }
   pthread_mutex_unlock(&d.mu);
   return st;
}

/* Lua finished a collection: the live bytes now are the base the growth is measured from */
void lm_cu_collected(void) {
   for (int k = 0; k < lm_cu_device_count(); k++) {
      Device &d = dev_of(k);
      pthread_mutex_lock(&d.mu);
      d.live_base = d.live;
      d.asked = false;
      if (d.ready) d.growth_limit = growth_limit_of(d);
      pthread_mutex_unlock(&d.mu);
   }
}

/* ---- copies ---- */

namespace {

/* the device whose allocator handed out p, or -1 (host or another kind of device's memory) */
int owner_of(const void *p) {
   for (int j = 0; j < lm_cu_device_count(); j++) {
      Device &d = dev_of(j);
      pthread_mutex_lock(&d.mu);
      /* p may point inside a block (a view's element 0): the segment that starts below it */
      auto it = d.segments.upper_bound((uintptr_t)p);
      const bool mine = it != d.segments.begin() && (--it, (uintptr_t)p < it->first + it->second);
      pthread_mutex_unlock(&d.mu);
      if (mine) return j;
   }
   return -1;
}

lm_status stage_ready(Device &d) {
   if (d.staged) return LM_OK;
   for (int i = 0; i < 2; i++) {
      LM_CU_TRY(cudaHostAlloc(&d.stage[i], kStageBytes, cudaHostAllocDefault), "cudaHostAlloc");
      /* an event never recorded counts as complete for cudaEventSynchronize */
      LM_CU_TRY(cudaEventCreateWithFlags(&d.stage_ev[i], cudaEventDisableTiming),
                "cudaEventCreate");
   }
   d.staged = true;
   return LM_OK;
}

/* host -> device through the staging buffers (stage_mu held) */
lm_status staged_h2d(Device &d, cudaStream_t s, char *dst, const char *src, size_t n) {
   int i = 0;
   for (size_t off = 0; off < n; off += kStageBytes, i ^= 1) {
      const size_t len = n - off < kStageBytes ? n - off : kStageBytes;
      /* the DMA that last read this buffer is done */
      LM_CU_TRY(cudaEventSynchronize(d.stage_ev[i]), "cudaEventSynchronize");
      memcpy(d.stage[i], src + off, len);
      LM_CU_TRY(cudaMemcpyAsync(dst + off, d.stage[i], len, cudaMemcpyHostToDevice, s),
                "cudaMemcpyAsync");
      LM_CU_TRY(cudaEventRecord(d.stage_ev[i], s), "cudaEventRecord");
   }
   return LM_OK;
}

/* device -> host through the staging buffers (stage_mu held) */
lm_status staged_d2h(Device &d, cudaStream_t s, char *dst, const char *src, size_t n) {
   const size_t nchunks = (n + kStageBytes - 1) / kStageBytes;
   auto issue = [&](size_t c) -> lm_status {
      const size_t off = c * kStageBytes, len = n - off < kStageBytes ? n - off : kStageBytes;
      const int i = (int)(c & 1);
      LM_CU_TRY(cudaMemcpyAsync(d.stage[i], src + off, len, cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync");
      LM_CU_TRY(cudaEventRecord(d.stage_ev[i], s), "cudaEventRecord");
      return LM_OK;
   };
   LM_TRY(issue(0));
   for (size_t c = 0; c < nchunks; c++) {
      /* the next chunk's DMA runs while this one is copied out */
      if (c + 1 < nchunks) LM_TRY(issue(c + 1));
      const size_t off = c * kStageBytes, len = n - off < kStageBytes ? n - off : kStageBytes;
      const int i = (int)(c & 1);
      LM_CU_TRY(cudaEventSynchronize(d.stage_ev[i]), "cudaEventSynchronize");
      memcpy(dst + off, d.stage[i], len);
   }
   return LM_OK;
}

} // namespace

lm_status lm_cu_memcpy(int k, void *dst, const void *src, size_t nbytes, int dir) {
   if (dir < 0 || dir > 2) return lm_error(LM_ERR_ARG, "cuda: bad copy direction %d", dir);
   if (!nbytes) return LM_OK;
   LM_TRY(lm_cu_set_device(k));
   const cudaStream_t s = lm_cu_stream(k);
   const int j = dir == 2 ? owner_of(src) : -1;
   if (((dir != 2 || j != k) && lm_cu_capturing(k)) || (dir == 2 && j >= 0 && j != k &&
                                                         lm_cu_capturing(j)))
      return lm_error(LM_ERR_DEVICE,
                      "cuda:%d: a copy %s while a CUDA graph is being captured (item(), tolist(), "
                      "printing, a tensor made from Lua values or random numbers): a graph "
                      "cannot wait for the host; do it before or after the capture",
                      k, dir == 0 ? "from the host" : dir == 1 ? "to the host" : "from another device");
   if (dir == 2) {
      if (j == k) {
         LM_CU_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, s),
                   "cudaMemcpyAsync");
         return LM_OK;
      }
      /* from another GPU (or another device's memory): wait for the work that wrote src, copy
         (cudaMemcpyDefault: the runtime tells the sides apart by address), and wait for the copy,
         since src may be freed and reused on its own stream as soon as this returns */
      if (j >= 0) {
         LM_TRY(lm_cu_set_device(j));
         LM_CU_TRY(cudaStreamSynchronize(lm_cu_stream(j)), "cudaStreamSynchronize");
         LM_TRY(lm_cu_set_device(k));
      }
      LM_CU_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
      LM_CU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      return LM_OK;
   }
   if (nbytes > kDirectCopy) {
      Device &d = dev_of(k);
      pthread_mutex_lock(&d.stage_mu);
      lm_status st = stage_ready(d);
      if (st == LM_OK)
         st = dir == 0 ? staged_h2d(d, s, (char *)dst, (const char *)src, nbytes)
                       : staged_d2h(d, s, (char *)dst, (const char *)src, nbytes);
      pthread_mutex_unlock(&d.stage_mu);
      return st;
   }
   const cudaMemcpyKind kind = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
   LM_CU_TRY(cudaMemcpyAsync(dst, src, nbytes, kind, s), "cudaMemcpyAsync");
   LM_CU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize");
   return LM_OK;
}
