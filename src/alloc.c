/* alloc.c -- the CPU allocator: 64-byte aligned blocks, a size-bucketed cache, byte counters and
 * a memory-pressure signal for the Lua side.
 *
 * LuaJIT's garbage collector cannot see these bytes, so the core counts them (Torch7's heap
 * tracking is the model): when live bytes cross a soft limit, lm_mem_pressure() turns 1 and the
 * Lua layer runs a full collection, then calls lm_mem_collected(). If live bytes are still above
 * 80 % of the limit after a collection, the limit grows by 1.4x (so a program that really needs
 * the memory does not collect on every allocation); it shrinks back toward the base when usage
 * falls.
 *
 * A second trigger answers the growth of live bytes since the last collection ("traffic"). A
 * temporary is freed only when the collector runs, so without it every large result of a loop
 * lands in a block that was written long ago and has left the caches: each store then reads the
 * line from DRAM first and evicts another dirty one (measured: an out-of-place 6.4 MB relu takes
 * 0.30 ms against 0.08 ms in a block freed just before). So when a large block (>= 256 KiB) is
 * handed out and live bytes have grown by more than the traffic limit since the last collection,
 * the pressure flag goes up too. Memory freed explicitly (t:free(), autograd's released
 * gradients) does not count. The Lua side sets the limit from the last-level cache size and the
 * measured cost of a collection (memory.lua), so a collection is only asked for where it costs
 * less than the DRAM traffic it saves. A collection caused by traffic alone leaves the soft limit
 * as it is.
 *
 * A third trigger answers a cache miss ("miss"). A block that must come fresh from the system
 * costs page faults, and on this project's virtual machines they are dear: 2.3-2.9 ms for the
 * 6.4 MB of one 8x64x56x56 float32 result, ten times the work written into it, where a
 * collection costs 0.1-0.6 ms. Without this trigger a new program (or a new tensor size) ran on
 * fresh pages until its garbage reached the soft limit: fifteen 6.4 MB results, each ten times
 * slower than the next. So when a large block (>= the miss block, LUMEN_MISS_BLOCK, 2 MiB by
 * default) comes fresh while live bytes have grown since the last collection by at least two
 * such blocks and by the miss floor, the pressure flag goes up: the next tensor made collects,
 * and the blocks the dead results held serve the requests after it. A collection that finds
 * less than half of that growth dead (a program that keeps what it makes) doubles the floor (up
 * to half the soft limit), so a growing program pays a few collections, not one per block; one
 * that finds more resets it, and so does any collection after which live bytes have not grown.
 * In a loop the pool of blocks then grows by one block per collection instead of all at once,
 * until the soft limit governs as before; a loop whose blocks come back from the cache never
 * misses, so the steady state is unchanged.
 *
 * Cache: freed blocks are kept in per-size-class free lists (classes are powers of two split in
 * four, from 64 bytes up to 1 GiB; bigger blocks go straight back to the system) and reused by the
 * next allocation of the same class, so a training loop does not churn malloc. The cache is
 * bounded (LM_CACHE_MAX bytes); when full, blocks are returned to the system.
 *
 * This file, with the RNG, holds the core's only global mutable state, guarded by one mutex. */
#include "backend.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { NCLASS = 4 * 25 }; /* 2^6 .. 2^30, four classes per octave */
#define LM_ALIGN 64
#define LM_CACHE_MAX ((int64_t)2 << 30)
#define LM_BIG_BLOCK ((size_t)1 << 30)
#define LM_DEFAULT_SOFT_LIMIT ((int64_t)1 << 30)
#define LM_MISS_BLOCK ((int64_t)2 << 20) /* the miss trigger's smallest block (see above) */
#define LM_MISS_FLOOR ((int64_t)8 << 20) /* and the growth it needs at least, before doubling */

/* tensor and storage structs (lm_meta_alloc): their own LIFO lists in 64-byte classes up to
 * 256 bytes, not counted as tensor memory. Lua frees dead tensors in batches after a collection
 * (memory.lua), thousands at once; malloc's per-thread cache holds 7 blocks per size, so the
 * rest would go through its slower bins and the next allocations pay for it. */
enum { LM_META_CLASSES = 4, LM_META_MAX = 16384 };

typedef struct block {
   struct block *next;
} block;

/* Large blocks (>= LM_STAMP_MIN) carry a 64-byte header in front of the caller's data: the
 * allocation counter when the block was last handed out, and whether it was "cold" then: more
 * than the last-level cache's worth of bytes had been handed out since its previous use (or it
 * came fresh from the system). A kernel that writes a whole cold output may use streaming stores
 * (lm_mem_is_cold): the lines are no longer cached, so ordinary stores would first read each one
 * from DRAM and evict hot data (the inputs) to make room. Temporaries are freed only when Lua's
 * collector runs, so in a loop most large results land in such blocks. */
typedef struct stamped {
   struct block *next;             /* the free list link while cached */
   int64_t stamp;
   int32_t cold;
   int32_t streamed;               /* last written with streaming stores: not in any cache */
   int32_t cls;                    /* the block's own size class (it may serve a smaller one) */
   int64_t freed_at;               /* the byte counter when it was last freed */
} stamped;
#define LM_STAMP_MIN ((size_t)256 << 10)
#define LM_HEADER 64

static struct {
   pthread_mutex_t mu;
   block *free_list[NCLASS];
   int64_t live, peak, cached, nmalloc;
   int64_t nfresh_large;           /* fresh blocks of LM_MISS_BLOCK bytes or more */
   int64_t handed, cold_bytes;     /* bytes handed out in all; the coldness threshold */
   int64_t cache_share;            /* the last-level cache one process can count on (-1: unread) */
   int64_t soft_limit, base_limit;
   int64_t live_base, traffic_limit; /* live bytes after the last collection; growth limit */
   const void *last_freed;         /* the header of the large block freed last */
   int64_t big_allow;              /* the live bytes that large results allow until the next
                                      collection (0: none since the last one) */
   int pressure;                   /* LM_PRESSURE_LIVE | LM_PRESSURE_TRAFFIC | _MISS */
   int64_t miss_block, miss_floor; /* the miss trigger: smallest block (0: off), growth needed */
   int64_t miss_growth, miss_live; /* growth and live bytes when it fired */
   block *meta_list[LM_META_CLASSES];
   int meta_count[LM_META_CLASSES];
} A = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0, 0, 0, 0, 0, -1, -1,
       LM_DEFAULT_SOFT_LIMIT, LM_DEFAULT_SOFT_LIMIT, 0, 0, NULL, 0, 0,
       LM_MISS_BLOCK, LM_MISS_FLOOR, 0, 0, {0}, {0}};

enum { LM_PRESSURE_LIVE = 1, LM_PRESSURE_TRAFFIC = 2, LM_PRESSURE_MISS = 4, LM_PRESSURE_DEVICE = 8 };

/* A device allocator's request for a collection (kernels/cuda/alloc.cu: a GPU's live bytes grew
 * past its limit since the last collection). Device tensors dropped in Lua free their memory only
 * when the collector runs, as host tensors do; the bit rides on the same flag every constructor
 * reads (lm_mem_pressure), and lm_mem_collected clears it and tells the device allocators
 * (lm_device_collected) to measure from the live bytes left. Its own variable, not A.pressure:
 * the host triggers' adaptation in lm_mem_collected looks at their bits only. */
static int device_pressure;

void lm_mem_note_device_pressure(void) {
   __atomic_store_n(&device_pressure, LM_PRESSURE_DEVICE, __ATOMIC_RELAXED);
}
#define LM_TRAFFIC_MIN_BLOCK ((size_t)256 << 10)

/* size class of a request and the block size it rounds up to */
static int size_class(size_t n, size_t *rounded) {
   if (n <= 64) {
      *rounded = 64;
      return 0;
   }
   int e = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^e < n <= 2^(e+1) */
   size_t base = (size_t)1 << e, quarter = base / 4;
   size_t q = (n - base + quarter - 1) / quarter; /* 1..4 */
   *rounded = base + q * quarter;
   return (e - 6) * 4 + (int)q; /* 1..96: class 0 is the 64-byte class */
}

/* the block size of size class c (inverse of size_class) */
static size_t class_size(int c) {
   if (c == 0) return 64;
   int e = (c - 1) / 4 + 6, q = (c - 1) % 4 + 1;
   size_t base = (size_t)1 << e;
   return base + (size_t)q * (base / 4);
}

/* A large request whose class has no cached block may take one from the next LM_BORROW classes
 * (up to twice the size): a fresh block costs page faults (about 5 ms for 6.4 MB on this
 * machine's virtual machines), a borrowed one only the unused tail, and the bytes are cached
 * anyway. The block keeps its class in its header and goes back to its own list. */
enum { LM_BORROW = 4 };

static int64_t cold_bytes(void);

/* Results larger than the coldness threshold (half the last-level cache) are written cold
 * whenever they are freed: another such result has always been handed out between two uses of
 * a block. Collecting sooner buys them nothing, and a collection right after a large operation
 * costs 0.3-0.6 ms here (the Lua heap has left the caches). So the soft limit makes room for
 * LM_BIG_INFLIGHT of them beyond what was live after the last collection: a loop that drops a
 * 25.7 MB convolution output each time collects every third time instead of every other.
 * The room is at most twice the soft limit (a limit set small on purpose still collects often),
 * and it ends at the next collection or at the first large request below the threshold that the
 * cache cannot serve: a loop of 6.4 MB results after the convolutions must not run on fresh
 * pages up to the room the convolutions left, while a kernel's workspace, which comes back from
 * the cache on every call (the GEMM's packed panels in an NCHW 1x1 convolution), leaves it be.
 * Measured (bench/ops.lua conv1x1, NHWC): see docs/memory.md. */
enum { LM_BIG_INFLIGHT = 2 };

/* counters for a block handed out (fresh: from the system); called with the mutex held */
static void account_alloc(size_t rounded, int fresh) {
   A.live += (int64_t)rounded;
   if (A.live > A.peak) A.peak = A.live;
   if (rounded >= LM_STAMP_MIN && (int64_t)rounded < cold_bytes()) {
      if (fresh) A.big_allow = 0; /* smaller results outgrow the cache: the plain limit again */
   } else if (rounded >= LM_STAMP_MIN) {
      /* half a result more: the kernels' scratch (packed weights) must not tip the count */
      int64_t allow = A.live_base + LM_BIG_INFLIGHT * (int64_t)rounded + (int64_t)rounded / 2;
      const int64_t cap = A.soft_limit > INT64_MAX / 2 ? INT64_MAX : 2 * A.soft_limit;
      if (allow > cap) allow = cap; /* a small limit set on purpose collects often */
      if (allow > A.big_allow) A.big_allow = allow;
   }
   if (A.live > (A.soft_limit > A.big_allow ? A.soft_limit : A.big_allow))
      A.pressure |= LM_PRESSURE_LIVE;
   if (rounded >= LM_TRAFFIC_MIN_BLOCK && A.traffic_limit > 0 &&
       A.live - A.live_base > A.traffic_limit)
      A.pressure |= LM_PRESSURE_TRAFFIC;
}

/* The last-level cache one process can count on: what the kernel reports for cpu0, at most
 * LM_CACHE_SHARE_MAX. A virtual machine reports its host's whole cache, shared with every other
 * guest: 480 MiB on one of this project's machines, where 6.4 MB results written with ordinary
 * stores into blocks last used 51 MB of results earlier took as long as streaming stores
 * (0.24-0.26 ms), but into blocks last used 96 MB earlier twice as long (0.49 against 0.25 ms).
 * Kernels size their decisions by it (the pointwise convolution streams an output larger than
 * half of it). LUMEN_CACHE_SHARE (bytes) overrides it. Read once; called with the mutex held. */
#define LM_CACHE_SHARE_MAX ((int64_t)32 << 20)

/* a byte count set in the environment variable name, or 0 when unset or not positive */
static int64_t env_bytes(const char *name) {
   const char *e = getenv(name);
   const long long v = e ? atoll(e) : 0;
   return v > 0 ? (int64_t)v : 0;
}

static int64_t cache_share(void) {
   if (A.cache_share < 0) {
      int64_t v = env_bytes("LUMEN_CACHE_SHARE");
      if (v == 0) {
         v = lm_mem_cache_size();
         if (v <= 0 || v > LM_CACHE_SHARE_MAX) v = LM_CACHE_SHARE_MAX;
      }
      A.cache_share = v;
   }
   return A.cache_share;
}

/* the coldness threshold: half the last-level cache (read once; called with the mutex held).
 * Half, not all: the cache is shared (with the inputs being read, with other processes and, on a
 * virtual machine, other guests). Measured here (32 MiB L3): a 6.4 MB result written into a block
 * last used 12.8 MB of allocations earlier took about the time of streaming stores, one last used
 * 19-38 MB earlier took 1.3-2x longer with ordinary stores. LUMEN_COLD_BYTES overrides it.
 * Not the (capped) cache share: on the machine whose L3 reads 480 MiB, a threshold of 16 MiB
 * streamed the activations of a training step, which the next layer then read from DRAM, and
 * bench/train_step.lua took 4-8 % longer (4 alternations). */
static int64_t cold_bytes(void) {
   if (A.cold_bytes < 0) {
      const int64_t v = env_bytes("LUMEN_COLD_BYTES");
      if (v > 0) {
         A.cold_bytes = v;
      } else {
         int64_t c = lm_mem_cache_size();
         A.cold_bytes = c > 0 ? c / 2 : (int64_t)16 << 20;
      }
   }
   return A.cold_bytes;
}

void *lm_alloc(size_t nbytes) {
   if (nbytes == 0) nbytes = 1;
   size_t rounded;
   int cls = -1;
   if (nbytes <= LM_BIG_BLOCK) {
      cls = size_class(nbytes, &rounded);
   } else {
      rounded = (nbytes + LM_ALIGN - 1) & ~(size_t)(LM_ALIGN - 1);
   }
   const size_t head = rounded >= LM_STAMP_MIN ? LM_HEADER : 0;
   void *p = NULL;
   pthread_mutex_lock(&A.mu);
   int from = cls;
   if (cls >= 0 && !A.free_list[cls] && head)
      for (int c = cls + 1; c <= cls + LM_BORROW && c < NCLASS; c++)
         if (A.free_list[c]) {
            from = c;
            break;
         }
   if (from >= 0 && A.free_list[from]) {
      block *b = A.free_list[from];
      A.free_list[from] = b->next;
      /* live bytes count the requested class; the cache counts whole blocks */
      A.cached -= (int64_t)(from == cls ? rounded : class_size(from));
      p = b;
      account_alloc(rounded, 0);
      if (head) {
         stamped *h = p;
         /* a streamed block is in no cache, but one handed out again right after it was the
            last large block freed (a loop that frees its result, t:free(), and makes the next)
            is written with ordinary stores: one read of each line from DRAM now, and from the
            next turn on the loop runs in the cache, as with a reference-counted runtime.
            Streaming would keep it out of the caches for good. */
         const int again = p == A.last_freed && A.handed == h->freed_at;
         h->cold = (h->streamed && !again) || A.handed - h->stamp > cold_bytes();
         h->streamed = 0;
         h->stamp = A.handed += (int64_t)rounded;
      } else {
         A.handed += (int64_t)rounded;
      }
   }
   pthread_mutex_unlock(&A.mu);
   if (!p) {
      if (posix_memalign(&p, LM_ALIGN, rounded + head) != 0) {
         /* give the cache back to the system and try once more */
         lm_mem_empty_cache();
         if (posix_memalign(&p, LM_ALIGN, rounded + head) != 0) {
            lm_error(LM_ERR_OOM, "out of memory allocating %zu bytes", nbytes);
            return NULL;
         }
      }
      pthread_mutex_lock(&A.mu);
      A.nmalloc++;
      if ((int64_t)rounded >= LM_MISS_BLOCK) A.nfresh_large++;
      account_alloc(rounded, 1);
      A.handed += (int64_t)rounded;
      if (A.miss_block > 0 && (int64_t)rounded >= A.miss_block &&
          !(A.pressure & LM_PRESSURE_MISS)) {
         /* fresh pages: collect before the next request rather than fault in more of them */
         const int64_t growth = A.live - A.live_base;
         if (growth >= 2 * (int64_t)rounded && growth >= A.miss_floor) {
            A.pressure |= LM_PRESSURE_MISS;
            A.miss_growth = growth;
            A.miss_live = A.live;
         }
      }
      if (head) {
         stamped *h = p;
         h->cold = 1;
         h->streamed = 0;
         h->cls = cls;
         h->stamp = A.handed;
      }
      pthread_mutex_unlock(&A.mu);
   }
   return (char *)p + head;
}

/* the header of the large block at p (from lm_alloc(nbytes)), or NULL for a small one */
static stamped *header_of(const void *p, size_t nbytes) {
   if (!p) return NULL;
   size_t rounded = nbytes;
   if (nbytes <= LM_BIG_BLOCK) size_class(nbytes ? nbytes : 1, &rounded);
   if (rounded < LM_STAMP_MIN) return NULL;
   return (stamped *)(void *)((char *)(uintptr_t)p - LM_HEADER);
}

int lm_mem_is_cold(const void *p, size_t nbytes) {
   const stamped *h = header_of(p, nbytes);
   return h ? h->cold : 0;
}

int lm_mem_was_streamed(const void *p, size_t nbytes) {
   const stamped *h = header_of(p, nbytes);
   return h ? h->streamed : 0;
}

void lm_mem_note_streamed(void *p, size_t nbytes) {
   stamped *h = header_of(p, nbytes);
   if (h) h->streamed = 1;
}

void lm_free(void *p, size_t nbytes) {
   if (!p) return;
   if (nbytes == 0) nbytes = 1;
   size_t rounded;
   int cls = -1;
   if (nbytes <= LM_BIG_BLOCK) {
      cls = size_class(nbytes, &rounded);
   } else {
      rounded = (nbytes + LM_ALIGN - 1) & ~(size_t)(LM_ALIGN - 1);
   }
   const int64_t counted = (int64_t)rounded; /* what lm_alloc counted as live */
   if (rounded >= LM_STAMP_MIN) {
      p = (char *)p - LM_HEADER;
      if (cls >= 0) { /* a borrowed block goes back to its own class */
         cls = ((stamped *)p)->cls;
         rounded = class_size(cls);
      }
   }
   int keep = 0;
   pthread_mutex_lock(&A.mu);
   A.live -= counted;
   if (rounded >= LM_STAMP_MIN) {
      ((stamped *)p)->freed_at = A.handed;
      A.last_freed = p;
   }
   if (cls >= 0 && A.cached + (int64_t)rounded <= LM_CACHE_MAX) {
      block *b = p;
      block **at = &A.free_list[cls];
      if (rounded >= LM_STAMP_MIN) {
         /* most recently used first: a collection frees many blocks at once (in no useful
            order), and the next allocation should get the one most likely still cached */
         const int64_t stamp = ((stamped *)p)->stamp;
         for (int walk = 0; *at && walk < 64 && ((stamped *)(void *)*at)->stamp > stamp; walk++)
            at = &(*at)->next;
      }
      b->next = *at;
      *at = b;
      A.cached += (int64_t)rounded;
      keep = 1;
   }
   pthread_mutex_unlock(&A.mu);
   if (!keep) free(p);
}

void *lm_meta_alloc(size_t nbytes) {
   int cls = nbytes == 0 ? 0 : (int)((nbytes - 1) / 64);
   if (cls < LM_META_CLASSES) {
      void *p = NULL;
      pthread_mutex_lock(&A.mu);
      block *b = A.meta_list[cls];
      if (b) {
         A.meta_list[cls] = b->next;
         A.meta_count[cls]--;
         p = b;
      }
      pthread_mutex_unlock(&A.mu);
      if (p) return p;
      nbytes = (size_t)(cls + 1) * 64;
   }
   return malloc(nbytes);
}

void lm_meta_free(void *p, size_t nbytes) {
   if (!p) return;
   int cls = nbytes == 0 ? 0 : (int)((nbytes - 1) / 64);
   if (cls < LM_META_CLASSES) {
      int kept = 0;
      pthread_mutex_lock(&A.mu);
      if (A.meta_count[cls] < LM_META_MAX) {
         block *b = p;
         b->next = A.meta_list[cls];
         A.meta_list[cls] = b;
         A.meta_count[cls]++;
         kept = 1;
      }
      pthread_mutex_unlock(&A.mu);
      if (kept) return;
   }
   free(p);
}

#define LOCKED_GET(expr)                                                                        \
   do {                                                                                         \
      pthread_mutex_lock(&A.mu);                                                                \
      int64_t v_ = (expr);                                                                      \
      pthread_mutex_unlock(&A.mu);                                                              \
      return v_;                                                                                \
   } while (0)

int64_t lm_mem_live_bytes(void) { LOCKED_GET(A.live); }
int64_t lm_mem_peak_bytes(void) { LOCKED_GET(A.peak); }
int64_t lm_mem_cached_bytes(void) { LOCKED_GET(A.cached); }
int64_t lm_mem_cold_bytes(void) { LOCKED_GET(cold_bytes()); }
int64_t lm_mem_cache_share(void) { LOCKED_GET(cache_share()); }
int64_t lm_mem_soft_limit(void) { LOCKED_GET(A.soft_limit); }
int64_t lm_mem_alloc_count(void) { LOCKED_GET(A.nmalloc); }
int64_t lm_mem_fresh_large_count(void) { LOCKED_GET(A.nfresh_large); }
int lm_mem_pressure(void) {
   return __atomic_load_n(&A.pressure, __ATOMIC_RELAXED) |
          __atomic_load_n(&device_pressure, __ATOMIC_RELAXED);
}

void lm_mem_reset_peak(void) {
   pthread_mutex_lock(&A.mu);
   A.peak = A.live;
   pthread_mutex_unlock(&A.mu);
}

void lm_mem_set_soft_limit(int64_t bytes) {
   pthread_mutex_lock(&A.mu);
   if (bytes < ((int64_t)1 << 20)) bytes = (int64_t)1 << 20;
   A.soft_limit = A.base_limit = bytes;
   A.pressure = (A.pressure & ~LM_PRESSURE_LIVE) | (A.live > A.soft_limit ? LM_PRESSURE_LIVE : 0);
   pthread_mutex_unlock(&A.mu);
}

int64_t lm_mem_traffic_limit(void) { LOCKED_GET(A.traffic_limit); }

void lm_mem_set_traffic_limit(int64_t bytes) {
   pthread_mutex_lock(&A.mu);
   A.traffic_limit = bytes > 0 ? bytes : 0;
   if (A.traffic_limit == 0 || A.live - A.live_base <= A.traffic_limit)
      A.pressure &= ~LM_PRESSURE_TRAFFIC;
   pthread_mutex_unlock(&A.mu);
}

/* the last-level cache as the kernel describes it for cpu0 (what lscpu prints); sysconf's figure
 * is the host's sum on some virtual machines, so it is only the fallback */
int64_t lm_mem_cache_size(void) {
   for (int idx = 3; idx >= 2; idx--) {
      char path[64], buf[32];
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      fclose(f);
      buf[n] = 0;
      char *end;
      long long v = strtoll(buf, &end, 10);
      if (v <= 0) continue;
      if (*end == 'K') v <<= 10;
      else if (*end == 'M') v <<= 20;
      return (int64_t)v;
   }
   long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
   return l3 > 0 ? (int64_t)l3 : 0;
}

void lm_mem_collected(void) {
   pthread_mutex_lock(&A.mu);
   int by_live = A.pressure & LM_PRESSURE_LIVE;
   if (!by_live && A.live <= A.soft_limit) {
      /* a collection asked for by traffic or a miss: the soft limit was not the reason */
   } else if (A.live > A.soft_limit / 10 * 8) {
      A.soft_limit = A.soft_limit / 10 * 14; /* still needed: grow, as Torch7 did */
   } else if (A.live * 2 < A.base_limit && A.soft_limit > A.base_limit) {
      A.soft_limit = A.base_limit;
   }
   if (A.pressure & LM_PRESSURE_MISS) {
      /* less than half the growth was dead: the program keeps what it makes, so ask for more
         growth before the next miss collects; otherwise back to the base. The floor stays
         within half the soft limit: one above the growth the soft limit allows between two
         collections would never be reached, and the trigger would be off for good. */
      const int64_t freed = A.miss_live - A.live;
      const int64_t cap = A.soft_limit / 2 > LM_MISS_FLOOR ? A.soft_limit / 2 : LM_MISS_FLOOR;
      if (freed < A.miss_growth / 2)
         A.miss_floor = A.miss_floor > cap / 2 ? cap : 2 * A.miss_floor;
      else
         A.miss_floor = LM_MISS_FLOOR;
   } else if (A.live <= A.live_base) {
      A.miss_floor = LM_MISS_FLOOR; /* any collection: no growth since the last one */
   }
   A.pressure = 0;
   A.live_base = A.live;
   A.big_allow = 0;
   pthread_mutex_unlock(&A.mu);
   __atomic_store_n(&device_pressure, 0, __ATOMIC_RELAXED);
   lm_device_collected();
}

int64_t lm_mem_miss_block(void) { LOCKED_GET(A.miss_block); }
int64_t lm_mem_miss_floor(void) { LOCKED_GET(A.miss_floor); }

void lm_mem_set_miss_block(int64_t bytes) {
   pthread_mutex_lock(&A.mu);
   A.miss_block = bytes > 0 ? bytes : 0;
   A.miss_floor = LM_MISS_FLOOR;
   A.pressure &= ~LM_PRESSURE_MISS;
   pthread_mutex_unlock(&A.mu);
}

/* give a free list's blocks back to the system */
static void free_chain(block *b) {
   while (b) {
      block *n = b->next;
      free(b);
      b = n;
   }
}

void lm_mem_empty_cache(void) {
   block *lists[NCLASS], *meta[LM_META_CLASSES];
   pthread_mutex_lock(&A.mu);
   memcpy(lists, A.free_list, sizeof lists);
   memset(A.free_list, 0, sizeof A.free_list);
   memcpy(meta, A.meta_list, sizeof meta);
   memset(A.meta_list, 0, sizeof A.meta_list);
   memset(A.meta_count, 0, sizeof A.meta_count);
   A.cached = 0;
   pthread_mutex_unlock(&A.mu);
   for (int i = 0; i < LM_META_CLASSES; i++) free_chain(meta[i]);
   for (int i = 0; i < NCLASS; i++) free_chain(lists[i]);
}
