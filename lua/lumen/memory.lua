-- lumen.memory -- GC pressure and allocator statistics.
--
-- Tensor memory lives in C, so Lua's collector does not see it: a loop creating large
-- temporaries would run out of memory long before the collector runs. The allocator raises a
-- "pressure" flag when live bytes cross a soft limit (or large-block traffic crosses the traffic
-- limit, or a large block must come fresh: the miss trigger); every tensor constructor checks
-- it (one cheap FFI call) and then runs a full collection here, sweeps the slots of unreachable
-- tensors (below) and reports back so the allocator can adapt the limit. GPU memory takes the
-- same road: the CUDA allocator (kernels/cuda/alloc.cu) raises the flag (bit 8) when a GPU's
-- live bytes have grown past its limit since the last collection, and lm_mem_collected tells it
-- the collection happened.

local ffi = require("ffi")
local C = require("lumen.C")
local tnew_ok, tnew = pcall(require, "table.new")
if not tnew_ok then tnew = function() return {} end end
local clock = require("lumen.util").clock

local M = {}
M.cycles = 0          -- sweeps so far (deferred results use it to age their recipes)

---------------------------------------------------------------------------------------------
-- ownership of C tensors
---------------------------------------------------------------------------------------------
-- Every lm_tensor* that Lua owns sits in a slot: a weak-valued table holds its cdata and a C
-- array holds its address. When the collector finds the cdata unreachable it clears the weak
-- slot, and the sweep that ends the cycle frees the C tensor through the address. This replaces
-- one ffi.gc finalizer per tensor: a finalizer costs a hash insertion when the tensor is made and
-- an uncompiled FFI call from inside the collector when it dies (together about 0.5 us, most of
-- the cost of a small operation); a slot costs two array stores, and the dead are freed in
-- batches by one C call.
-- A sentinel finalizer marks the end of every collection cycle; the sweep then runs at the next
-- safe point: the next tensor made (own), the next memory query (live_bytes, ...), or at once
-- after a collection lumen asks for (collect). It does not run inside the finalizer, because
-- code that runs inside the collector is not compiled and the sweep is a hot loop.
local WEAK_V = { __mode = "v" }
local slots = setmetatable({}, WEAK_V)              -- slot -> cdata (weak)
local CAP0 = 4096
local cap = CAP0
local addrs = ffi.new("lm_tensor*[?]", cap + 1)      -- slot -> address (not seen by the GC)
local nslots = 0
local free_slots, nfree = {}, 0
local DEAD_BATCH = 256
local dead = ffi.new("lm_tensor*[?]", DEAD_BATCH)
local sweeping = false
local cycle_ended = false
local free_many = C.lm_tensor_free_many

local function grow()
   local ncap = cap * 2
   local na = ffi.new("lm_tensor*[?]", ncap + 1)
   ffi.copy(na, addrs, ffi.sizeof("lm_tensor*") * (cap + 1))
   addrs, cap = na, ncap
end

-- free the C tensors whose cdata the collector found dead; returns how many
-- The count trigger: tensors made since the last sweep. Small tensors barely move the byte
-- counters or the Lua heap (a compiled loop allocates little else), so without it a loop of small
-- operations would pile up a million dead tensors before the soft limit fired, and every block and
-- slot it then reused would be cache-cold (the per-op overhead doubled). After count_base tensors
-- (or as many as were alive after the last sweep, when that is more) own() runs a collection.
-- count_base follows the Lua heap that survives a collection, which is what a collection must
-- mark whatever the number of dead tensors: one tensor per COUNT_HEAP_BYTES of it (lumen alone,
-- about 650 KB: about 4,000), within [COUNT_MIN, COUNT_MAX]. Fewer tensors between sweeps keep
-- the dead ones' structs and blocks in the caches when they are freed and handed out again (each
-- is about 400 bytes with its Lua side); a bigger heap makes each collection dearer and the
-- interval longer, so the marking costs about the same per tensor. (Not the measured time of a
-- collection: that grows with the dead it frees, and the interval with it.) Measured with a loop
-- of 4-element adds: a fixed 16,384 took 0.39-0.52 us per add, 4,096 0.23-0.38 us.
-- LUMEN_COUNT_BASE fixes it.
local COUNT_MIN, COUNT_MAX, COUNT_HEAP_BYTES = 2048, 65536, 160
local count_fixed = tonumber(os.getenv("LUMEN_COUNT_BASE") or "")
if count_fixed and count_fixed < 1 then count_fixed = nil end
local count_base = count_fixed or 4096
local made, count_limit = 0, count_base
local collect_now                          -- M.collect, set below

local function sweep()
   if sweeping then return 0 end          -- a collection inside the sweep: this one goes on
   sweeping = true
   cycle_ended = false
   made = 0
   local n, total = 0, 0
   for s = 1, nslots do
      local a = addrs[s]
      if a ~= nil and slots[s] == nil then
         addrs[s] = nil
         dead[n] = a
         n = n + 1
         nfree = nfree + 1
         free_slots[nfree] = s
         if n == DEAD_BATCH then
            free_many(dead, n)
            total, n = total + n, 0
         end
      end
   end
   if n > 0 then free_many(dead, n) end
   -- compact when most slots are free: trim the free slots at the top and put the lowest free
   -- index on top of the stack, so a burst of short-lived tensors (a loop of small operations)
   -- does not leave every later sweep scanning its high-water mark
   if nfree > 64 and nfree * 2 > nslots then
      while nslots > 0 and addrs[nslots] == nil do nslots = nslots - 1 end
      nfree = 0
      for s = nslots, 1, -1 do
         if addrs[s] == nil then
            nfree = nfree + 1
            free_slots[nfree] = s
         end
      end
   end
   -- after a peak (a hundred thousand tensors alive once) the tables keep their size, and every
   -- collection walks them whole: a full collection of lumen alone went from 67 us to 266 us.
   -- When the tensors alive fill a quarter of them or less, rebuild them at twice that, the
   -- survivors packed at the bottom (nothing else knows a tensor's slot number).
   if cap > CAP0 and (nslots - nfree) * 4 <= cap then
      local ncap = CAP0
      while ncap < (nslots - nfree) * 2 do ncap = ncap * 2 end
      local ns = setmetatable(tnew(ncap, 0), WEAK_V)
      local na = ffi.new("lm_tensor*[?]", ncap + 1)
      -- those two allocations may have run finalizers that made tensors (own() then used the
      -- old tables): copy only if every slot in use still fits
      local fits = nslots - nfree <= ncap
      local j = 0
      for i = 1, fits and nslots or 0 do
         local a = addrs[i]
         if a ~= nil then
            j = j + 1
            na[j] = a
            ns[j] = slots[i]   -- nil if it died meanwhile: the next sweep frees its address
         end
      end
      if fits then
         slots, addrs, cap, nslots = ns, na, ncap, j
         free_slots, nfree = {}, 0
      end
   end
   sweeping = false
   M.cycles = M.cycles + 1
   local live = nslots - nfree
   count_limit = live > count_base and live or count_base
   return total + n
end
M.sweep = sweep

local function arm_sentinel()
   ffi.gc(ffi.new("uint8_t[1]"), function()
      cycle_ended = true
      arm_sentinel()
   end)
end
arm_sentinel()

-- take ownership of a fresh lm_tensor* (a cdata); returns it
function M.own(p)
   if cycle_ended then sweep() end
   made = made + 1
   if made > count_limit then collect_now() end   -- p is an argument here: it stays reachable
   local s
   if nfree > 0 then
      s = free_slots[nfree]
      nfree = nfree - 1
   else
      s = nslots + 1
      if s > cap then grow() end
      nslots = s
   end
   slots[s] = p
   addrs[s] = p
   return p
end

-- drop a tensor's data now (explicit free); the emptied struct is freed by a later sweep
M.release = C.lm_tensor_release_storage


-- The allocator's base soft limit. Small enough that a loop of large temporaries stays within
-- about fifteen 6.4 MB tensors of its real working set; the allocator grows the limit (x1.4 per
-- collection) when a program really holds more, and shrinks it back when usage falls.
-- LUMEN_SOFT_LIMIT (bytes) overrides it; lm.memory.set_soft_limit changes it at run time.
-- 96 MiB rather than 64: a collection right after a large operation costs 0.3-1 ms (the Lua heap
-- has left the caches), and the results it frees are cold by the time they are reused either
-- way. Measured with bench/ops.lua, 8 processes each way alternately: collections in the
-- forward + backward rows fell by 30-50 % (batch norm NHWC: 11 -> 7 in 21 calls), and the NHWC
-- rows took 0.65-1.11x the time (most 0.8-0.95x).
M.DEFAULT_SOFT_LIMIT = 96 * 2 ^ 20
do
   local env = tonumber(os.getenv("LUMEN_SOFT_LIMIT") or "")
   if env and env >= 0 then
      C.lm_mem_set_soft_limit(env)
   else
      C.lm_mem_set_soft_limit(M.DEFAULT_SOFT_LIMIT)
   end
end

-- The traffic trigger (alloc.c): collect whenever live bytes have grown by the traffic limit
-- since the last collection, so that temporaries go back to the cache while their memory is still
-- in the last-level cache. It is off by default: a collection costs time proportional to the Lua
-- heap (about 0.1 ms for lumen alone idle, 0.15-0.3 ms right after a large operation has pushed
-- the heap out of the caches, 1-2 ms in a training script), and a result block reused even two or
-- three iterations later is already out of this machine's cache. Measured with bench/ops.lua, six
-- processes each way alternately: "auto" against off, every row within +-10 % (a tie); a fixed
-- 8 MB limit 0.7-1.0x. LUMEN_TRAFFIC_LIMIT=auto (or lm.memory.set_traffic_limit("auto")) turns
-- on the adaptive limit: the growth whose DRAM round trip costs TRAFFIC_COST_RATIO times the
-- measured (smoothed) collection time, at least half the last-level cache; when that exceeds the
-- whole cache (a big heap) the trigger rests, since results written after that much growth land
-- in cold memory anyway. A number of bytes fixes the limit; 0 turns it off.
M.TRAFFIC_COST_RATIO = 2
M.DRAM_BYTES_PER_SECOND = 30e9         -- a cold block costs a read for ownership plus a write back
local cache_bytes = tonumber(C.lm_mem_cache_size())
if cache_bytes <= 0 then cache_bytes = 32 * 2 ^ 20 end
M.BASE_TRAFFIC_LIMIT = math.max(4 * 2 ^ 20, cache_bytes / 2)
M.MAX_TRAFFIC_LIMIT = math.max(M.BASE_TRAFFIC_LIMIT, cache_bytes)
local traffic_auto = false
do
   local env = os.getenv("LUMEN_TRAFFIC_LIMIT")
   if env == "auto" then
      traffic_auto = true
      C.lm_mem_set_traffic_limit(M.BASE_TRAFFIC_LIMIT)
   elseif tonumber(env) and tonumber(env) >= 0 then
      C.lm_mem_set_traffic_limit(tonumber(env))
   else
      C.lm_mem_set_traffic_limit(0)
   end
end

-- The miss trigger (alloc.c): when a large block (at least the miss block, 2 MiB by default)
-- must come fresh from the system while live bytes have grown by two such blocks and by the miss
-- floor since the last collection, collect before the next tensor is made, so that the blocks
-- of dead results serve the requests after it instead of more fresh pages. A fresh 6.4 MB block
-- costs 2.3-2.9 ms of page faults on this project's machines, ten times the work written into
-- it; a collection 0.1-0.6 ms. Measured: a new process's loop of (x + x):relu() on 8x64x56x56
-- float32 took 2.4 ms a call for its first 15 calls (every one on fresh pages) before; see
-- docs/memory.md for after. LUMEN_MISS_BLOCK (bytes; 0 turns the trigger off) overrides it,
-- lm.memory.set_miss_block changes it at run time.
do
   local env = tonumber(os.getenv("LUMEN_MISS_BLOCK") or "")
   if env and env >= 0 then C.lm_mem_set_miss_block(env) end
end

local gc_seconds = nil                 -- smoothed cost of one collection (memory.collect)
local collecting = false

-- run a full collection now and tell the allocator
function M.collect()
   if collecting then return end      -- a finalizer that allocates must not recurse
   collecting = true
   local t0 = clock()
   collectgarbage()
   if not count_fixed then
      local n = math.floor(collectgarbage("count") * 1024 / COUNT_HEAP_BYTES)
      count_base = n < COUNT_MIN and COUNT_MIN or (n > COUNT_MAX and COUNT_MAX or n)
   end
   sweep()
   local dt = clock() - t0
   collecting = false
   C.lm_mem_collected()
   if traffic_auto then
      gc_seconds = gc_seconds and (0.75 * gc_seconds + 0.25 * dt) or dt
      local limit = gc_seconds * M.DRAM_BYTES_PER_SECOND * M.TRAFFIC_COST_RATIO
      if limit > M.MAX_TRAFFIC_LIMIT then
         -- growth that outruns the cache comes back cold anyway: a collection would buy
         -- nothing, so leave it to the soft limit (measuring on: the heap may shrink again)
         C.lm_mem_set_traffic_limit(0)
      else
         C.lm_mem_set_traffic_limit(math.max(M.BASE_TRAFFIC_LIMIT, math.floor(limit)))
      end
   end
end

collect_now = M.collect

-- Settling the pool of blocks: at the end of a backward pass (autograd.lua), collect when the
-- allocator had to take fresh blocks of 2 MiB or more from the system since the last time.
-- A training loop's pool of blocks grows until it holds one step's peak of live tensors plus the
-- garbage not yet collected at that moment, and that garbage differs from step to step, so
-- without this the pool grew for about twenty resnet50 steps (batch 8), each taking 10-80 MB of
-- fresh pages. Fresh pages are dear on this project's virtual machines: a fresh 28 MiB
-- activation cost 30-40 ms of page faults inside a 1.8 ms convolution. Collected at the end of
-- each step that missed, the step after it finds (nearly) every block it needs. A collection
-- costs about 1.5 ms in a training loop; a loop whose pool is settled misses nothing and never
-- pays it. Not at the end of a model's call: in resnet50 inference the 2nd to 5th calls missed
-- as often with it (their garbage is the call's own), and took as long.
-- M.SETTLE_POOL = false turns this off.
M.SETTLE_POOL = true
local fresh_seen = tonumber(C.lm_mem_fresh_large_count())
function M.settle_pool()
   local n = tonumber(C.lm_mem_fresh_large_count())
   if n ~= fresh_seen and M.SETTLE_POOL then
      M.collect()
      n = tonumber(C.lm_mem_fresh_large_count())
   end
   fresh_seen = n
end

-- the same check every constructor does: collect when the allocator asks for it
function M.check_pressure()
   if C.lm_mem_pressure() ~= 0 then M.collect() end
end

local function bytes_arg(fname, b)
   if type(b) ~= "number" or b ~= b or b < 0 or b % 1 ~= 0 or b > 2 ^ 62 then
      error("lumen.memory." .. fname .. ": bytes must be a non-negative integer, got " ..
            tostring(b), 3)
   end
   return b
end

-- the queries first free what the last collection found dead, so that collectgarbage() followed
-- by a query sees the memory returned, as with per-tensor finalizers
local function settle()
   if cycle_ended then sweep() end
end
M.settle = settle

-- slots in use (for tests and diagnostics)
function M.owned_count() settle(); return nslots - nfree end
-- the slot tables' capacity (diagnostics and specs: it shrinks back after a peak)
function M.slot_capacity() settle(); return cap end

function M.live_bytes() settle(); return tonumber(C.lm_mem_live_bytes()) end
function M.peak_bytes() settle(); return tonumber(C.lm_mem_peak_bytes()) end
function M.reset_peak() settle(); C.lm_mem_reset_peak() end
function M.cached_bytes() settle(); return tonumber(C.lm_mem_cached_bytes()) end
function M.empty_cache() settle(); C.lm_mem_empty_cache() end
function M.soft_limit() return tonumber(C.lm_mem_soft_limit()) end
function M.set_soft_limit(bytes) C.lm_mem_set_soft_limit(bytes_arg("set_soft_limit", bytes)) end
function M.alloc_count() return tonumber(C.lm_mem_alloc_count()) end
-- the coldness threshold (half the last-level cache, LUMEN_COLD_BYTES overrides): a result this
-- large is written cold anyway, so it makes room for two more before a collection (alloc.c)
function M.cold_bytes() return tonumber(C.lm_mem_cold_bytes()) end

-- the count trigger's base now (tensors made between collections; diagnostics and specs)
function M.count_base() return count_base end
function M.traffic_limit() return tonumber(C.lm_mem_traffic_limit()) end
-- true while the traffic limit adapts to the cost of a collection ("auto")
function M.traffic_adaptive() return traffic_auto end
-- the traffic limit: bytes of growth (0 turns the trigger off, the default) or "auto"
function M.set_traffic_limit(bytes)
   if bytes == "auto" then
      traffic_auto = true
      C.lm_mem_set_traffic_limit(M.BASE_TRAFFIC_LIMIT)
      return
   end
   traffic_auto = false
   C.lm_mem_set_traffic_limit(bytes_arg("set_traffic_limit", bytes))
end
function M.cache_size() return cache_bytes end
-- the last-level cache one process can count on: cache_size() capped at 32 MiB (a virtual
-- machine reports its host's whole cache); LUMEN_CACHE_SHARE overrides it (alloc.c)
function M.cache_share() return tonumber(C.lm_mem_cache_share()) end
-- the miss trigger's smallest block (0: off) and the growth a miss needs now (it doubles after a
-- collection that found little dead)
function M.miss_block() return tonumber(C.lm_mem_miss_block()) end
function M.miss_floor() return tonumber(C.lm_mem_miss_floor()) end
function M.set_miss_block(bytes) C.lm_mem_set_miss_block(bytes_arg("set_miss_block", bytes)) end

return M
