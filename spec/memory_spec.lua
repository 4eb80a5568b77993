-- spec/memory_spec.lua -- tensor memory is C memory the Lua collector cannot see: the Lua layer
-- must trigger collections under pressure (lua/lumen/memory.lua), so a loop of large temporaries
-- stays bounded and every byte comes back once the tensors are unreachable.
-- lm.memory.live_bytes / peak_bytes / reset_peak are lumen's allocator counters.
local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm

local function full_collect()
   collectgarbage()
   collectgarbage()
end

local BIG = { 8, 64, 56, 56 }                     -- float32: 6,422,528 bytes
local BIG_BYTES = 8 * 64 * 56 * 56 * 4

describe("memory", function()
   before_each(full_collect)

   it("exposes live and peak byte counters", function()
      assert.is_function(lm.memory.live_bytes)
      assert.is_function(lm.memory.peak_bytes)
      local before = lm.memory.live_bytes()
      local t = lm.empty({ 1000 })
      assert.equal(1000, t:numel())
      assert.is_true(lm.memory.live_bytes() >= before + 4000)
      assert.is_true(lm.memory.peak_bytes() >= lm.memory.live_bytes())
      t = nil -- luacheck: ignore
      full_collect()
      assert.equal(before, lm.memory.live_bytes())
   end)

   it("2,000 tensors of 8x64x56x56 float32 in a loop: bounded peak, all bytes return", function()
      local start = lm.memory.live_bytes()
      if lm.memory.reset_peak then lm.memory.reset_peak() end
      local peak0 = lm.memory.peak_bytes()
      for i = 1, 2000 do
         local t = lm.empty(BIG)
         if i % 100 == 0 then t:fill_(i) end      -- touch some of them
      end
      local peak = lm.memory.peak_bytes()
      full_collect()
      assert.equal(start, lm.memory.live_bytes(), "live bytes after collectgarbage")
      local bound = math.max(peak0, start) + 20 * BIG_BYTES
      assert.is_true(peak <= bound, string.format("peak %.1f MB exceeds %.1f MB (20 tensors)",
         peak / 2 ^ 20, bound / 2 ^ 20))
   end)

   it("channels-last temporaries from arithmetic are collected too", function()
      local start = lm.memory.live_bytes()
      if lm.memory.reset_peak then lm.memory.reset_peak() end
      local x = lm.zeros(BIG, { memory_format = lm.channels_last })
      for _ = 1, 60 do                           -- 180 temporaries, 1.1 GB in all
         local y = (x + 1):relu() * 2
         assert.equal(1, y:stride(2))
      end
      local peak = lm.memory.peak_bytes()
      x = nil -- luacheck: ignore
      full_collect()
      assert.equal(start, lm.memory.live_bytes())
      assert.is_true(peak <= start + 24 * BIG_BYTES,
         string.format("peak %.1f MB", peak / 2 ^ 20))
   end)

   it("views keep the storage alive and release it with the last reference", function()
      local start = lm.memory.live_bytes()
      local x = lm.ones({ 256, 256 })
      local v = x:narrow(1, 1, 10):transpose(1, 2)
      x = nil -- luacheck: ignore
      full_collect()
      assert.is_true(lm.memory.live_bytes() >= start + 256 * 256 * 4, "storage freed too early")
      H.assert_close(v:sum(), { 2560 }, 0)
      v = nil -- luacheck: ignore
      full_collect()
      assert.equal(start, lm.memory.live_bytes())
   end)

   it("t:free() releases memory at once (lumen extension)", function()
      local start = lm.memory.live_bytes()
      local t = lm.empty(BIG)
      if not t.free then return end
      t:free()
      assert.equal(start, lm.memory.live_bytes())
   end)

   it("owns C tensors through slots: freed once unreachable, never twice", function()
      local start_owned = lm.memory.owned_count()
      local start = lm.memory.live_bytes()
      local keep = {}
      for i = 1, 3000 do
         local t = lm.full({ 64 }, i)
         if i % 3 == 0 then keep[#keep + 1] = t end
         if i % 5 == 0 then t:free() end       -- explicit free, then the sweep must not free again
      end
      full_collect()
      -- every third tensor is still alive, except those freed explicitly (their slot goes too)
      assert.equal(start_owned + 800, lm.memory.owned_count())
      for j = 1, #keep, 97 do
         local i = 3 * j
         if i % 5 ~= 0 then assert.equal(64 * i, keep[j]:sum():item()) end
      end
      keep = nil -- luacheck: ignore
      full_collect()
      assert.equal(start_owned, lm.memory.owned_count())
      assert.equal(start, lm.memory.live_bytes())
   end)

   it("a tensor's C pointer moved to another table keeps the tensor alive", function()
      local start = lm.memory.live_bytes()
      local t = lm.full({ 1000 }, 7)
      local holder = setmetatable({ _c = rawget(t, "_c") }, getmetatable(t))
      t = nil -- luacheck: ignore
      full_collect()
      assert.equal(7000, holder:sum():item())
      holder = nil -- luacheck: ignore
      full_collect()
      assert.equal(start, lm.memory.live_bytes())
   end)

   it("a large request may take a cached block of a larger class (up to 2x), counted as asked",
      function()
      local C = require("lumen.C")
      full_collect()
      lm.memory.empty_cache()
      local live0, cached0 = lm.memory.live_bytes(), lm.memory.cached_bytes()
      local big = 4 * 2 ^ 20
      local p = C.lm_alloc(big)
      C.lm_free(p, big)
      assert.equal(cached0 + big, lm.memory.cached_bytes())
      local want = 3.5 * 2 ^ 20                         -- one class below: borrows the 4 MiB block
      local q = C.lm_alloc(want)
      assert.is_true(q == p)
      assert.equal(live0 + want, lm.memory.live_bytes())
      assert.equal(cached0, lm.memory.cached_bytes())
      ffi.fill(q, want, 7)
      C.lm_free(q, want)                                -- back to its own class
      assert.equal(live0, lm.memory.live_bytes())
      assert.equal(cached0 + big, lm.memory.cached_bytes())
      local r = C.lm_alloc(big)
      assert.is_true(r == p)
      local s = C.lm_alloc(1.5 * 2 ^ 20)                -- far smaller: a block of its own
      assert.is_true(s ~= p)
      C.lm_free(s, 1.5 * 2 ^ 20)
      C.lm_free(r, big)
      lm.memory.empty_cache()
      assert.equal(live0, lm.memory.live_bytes())
   end)

   it("the slot tables shrink back after a peak of live tensors, keeping the survivors", function()
      full_collect()
      local live0, owned0 = lm.memory.live_bytes(), lm.memory.owned_count()
      local many, kept = {}, {}
      for i = 1, 30000 do
         many[i] = lm.full({ 3 }, i)
         if i % 1000 == 0 then kept[#kept + 1] = many[i] end
      end
      assert.is_true(lm.memory.slot_capacity() >= 30000)
      many = nil -- luacheck: ignore
      full_collect()
      lm.memory.collect()
      assert.is_true(lm.memory.slot_capacity() <= 8192, tostring(lm.memory.slot_capacity()))
      assert.equal(owned0 + #kept, lm.memory.owned_count())
      -- more collections and sweeps: a survivor the rebuild lost track of would be freed now
      local live1 = lm.memory.live_bytes()
      for _ = 1, 3 do
         full_collect()
         lm.memory.collect()
      end
      assert.equal(owned0 + #kept, lm.memory.owned_count())
      assert.equal(live1, lm.memory.live_bytes())
      for j, t in ipairs(kept) do                   -- the survivors are intact and still owned
         assert.equal(3 * j * 1000, t:sum():item())
      end
      for _ = 1, 100 do local _ = lm.ones({ 2 }) end -- slots are handed out again
      kept = nil -- luacheck: ignore
      full_collect()
      assert.equal(owned0, lm.memory.owned_count())
      assert.equal(live0, lm.memory.live_bytes())
   end)

   it("the count trigger follows the Lua heap that survives a collection", function()
      if os.getenv("LUMEN_COUNT_BASE") then return end
      lm.memory.collect()
      local heap = collectgarbage("count") * 1024
      local base = lm.memory.count_base()
      assert.is_true(base >= 2048 and base <= 65536, tostring(base))
      local want = math.min(65536, math.max(2048, math.floor(heap / 160)))
      assert.is_true(math.abs(base - want) <= want / 10, base .. " vs " .. want)
      -- a bigger heap that survives: a longer interval
      local keep = {} -- luacheck: ignore
      for i = 1, 20000 do keep[i] = { i } end
      lm.memory.collect()
      if base < 65536 then                  -- all specs in one process: the heap is at the cap
         assert.is_true(lm.memory.count_base() > base)
      end
      keep = nil -- luacheck: ignore
      lm.memory.collect()
      assert.is_true(math.abs(lm.memory.count_base() - base) <= base / 10)
      -- and a loop of small operations still sweeps within the interval
      local a = lm.ones({ 4 })
      local cycles = lm.memory.cycles
      for _ = 1, 3 * lm.memory.count_base() do local _ = a + a end
      assert.is_true(lm.memory.cycles >= cycles + 2)
   end)

   it("reports the cache share: the last-level cache capped at 32 MiB", function()
      local share, size = lm.memory.cache_share(), lm.memory.cache_size()
      assert.is_true(share > 0 and size > 0)
      if not os.getenv("LUMEN_CACHE_SHARE") then
         assert.equal(math.min(size, 32 * 2 ^ 20), share)
      end
      assert.equal(share, lm.memory.cache_share())        -- read once
   end)

   it("results above the coldness threshold get room for two more before a collection",
      function()
      -- a block that large is written cold however soon it is reused (alloc.c), so the soft
      -- limit makes room for two more of them past the live bytes of the last collection; the
      -- room ends at a collection, at a large request below the threshold that needs fresh
      -- memory, and is at most twice the soft limit
      local C = require("lumen.C")
      full_collect()
      local live0 = lm.memory.live_bytes()
      local prev = lm.memory.soft_limit()
      local r = lm.memory.cold_bytes()
      assert.equal(tonumber(C.lm_mem_cold_bytes()), r)
      assert.is_true(r >= 256 * 1024)
      -- a collection now, then a soft limit 1.5 results past the live bytes
      local function reset()
         C.lm_mem_collected()                  -- live base = live bytes now, room gone
         lm.memory.set_soft_limit(lm.memory.live_bytes() + math.floor(1.5 * r))
         assert.equal(0, C.lm_mem_pressure())
      end
      -- the miss trigger would collect on the fresh blocks below: this checks the room alone
      local miss_block = lm.memory.miss_block()
      lm.memory.set_miss_block(0)
      local ok, err = pcall(function()
         reset()                                -- L = live0, S = L + 1.5 r
         local a = C.lm_alloc(r)
         assert.equal(0, C.lm_mem_pressure())
         local b = C.lm_alloc(r)                -- L + 2 r: past S, inside the room (L + 2.5 r)
         assert.equal(0, C.lm_mem_pressure(), "second result inside the room")
         local c = C.lm_alloc(r)                -- L + 3 r: past the room
         assert.are_not.equal(0, C.lm_mem_pressure())
         C.lm_free(c, r)
         C.lm_free(b, r)
         -- a collection ends the room: one left from a higher live level must not carry over
         local e = C.lm_alloc(r)
         reset()                                -- L = live0 + 2 r
         b = C.lm_alloc(r)                      -- room up to live0 + 4.5 r
         C.lm_free(b, r)
         C.lm_free(e, r)
         reset()                                -- L = live0 + r, room up to live0 + 3.5 r
         b = C.lm_alloc(r)
         c = C.lm_alloc(r)                      -- live0 + 3 r
         assert.equal(0, C.lm_mem_pressure())
         local d = C.lm_alloc(r)                -- live0 + 4 r
         assert.are_not.equal(0, C.lm_mem_pressure(), "a collection ends the room")
         C.lm_free(d, r)
         C.lm_free(c, r)
         -- a large request below the threshold that the cache serves (a kernel's workspace)
         -- keeps the room; one that needs fresh memory ends it: the plain limit again
         local m = 256 * 1024
         local w = C.lm_alloc(m)
         C.lm_free(w, m)                        -- now cached
         reset()                                -- L = live0 + 2 r (a, b), S = L + 1.5 r
         c = C.lm_alloc(r)
         d = C.lm_alloc(r)                      -- L + 2 r: past S, inside the room
         assert.equal(0, C.lm_mem_pressure())
         w = C.lm_alloc(m)
         assert.equal(0, C.lm_mem_pressure(), "a cached workspace keeps the room")
         C.lm_free(w, m)
         lm.memory.empty_cache()
         w = C.lm_alloc(m)
         assert.are_not.equal(0, C.lm_mem_pressure(), "a fresh smaller large block ends it")
         C.lm_free(w, m)
         C.lm_free(d, r)
         C.lm_free(c, r)
         C.lm_free(b, r)
         C.lm_free(a, r)
         -- a soft limit set small on purpose: the room is at most twice that limit
         if live0 < r / 4 then
            C.lm_mem_collected()
            lm.memory.set_soft_limit(math.floor(r / 4))
            assert.equal(0, C.lm_mem_pressure())
            a = C.lm_alloc(r)
            assert.are_not.equal(0, C.lm_mem_pressure(), "room capped at twice the soft limit")
            C.lm_free(a, r)
         end
         -- and the largest limit the API takes: the cap must not overflow (UBSan checks)
         C.lm_mem_collected()
         lm.memory.set_soft_limit(2 ^ 62)
         a = C.lm_alloc(r)
         assert.equal(0, C.lm_mem_pressure())
         C.lm_free(a, r)
      end)
      lm.memory.set_soft_limit(prev)
      lm.memory.set_miss_block(miss_block)
      C.lm_mem_collected()
      assert.is_true(ok, err)
      assert.equal(live0, lm.memory.live_bytes())
   end)

   it("a backward pass that took fresh large blocks collects at its end, and only then",
      function()
      local C = require("lumen.C")
      assert.is_true(lm.memory.SETTLE_POOL)
      local function step()
         local w = lm.randn({ 64, 64 }, { requires_grad = true })
         local x = lm.randn({ 16384, 64 })       -- 4 MiB: at least the 2 MiB the count watches
         local loss = (x:matmul(w)):relu():sum()
         loss:backward()
         return w.grad
      end
      local miss_block, prev = lm.memory.miss_block(), lm.memory.soft_limit()
      local traffic, adaptive = lm.memory.traffic_limit(), lm.memory.traffic_adaptive()
      local dead = setmetatable({}, { __mode = "v" })
      -- garbage that only a collection removes, made in a frame of its own so that no stack
      -- slot of the caller still holds it
      local function garbage() dead[1] = lm.randn({ 8 }) end
      local ok, err = pcall(function()
         -- no other trigger may collect during these steps
         lm.memory.set_traffic_limit(0)
         lm.memory.set_miss_block(0)
         lm.memory.set_soft_limit(2 ^ 40)
         step()
         lm.memory.collect()                    -- the last step's blocks back in the cache,
         lm.memory.empty_cache()                -- and out: every large block of the next is fresh
         local fresh0 = tonumber(C.lm_mem_fresh_large_count())
         garbage()
         local g = step()
         assert.is_true(tonumber(C.lm_mem_fresh_large_count()) > fresh0)
         assert.is_nil(dead[1], "collected at the end of the backward that missed")
         assert.equal(64, g:size(1))
         -- a step whose blocks all come from the cache is not charged a collection. The loop
         -- settles within a step or two: a step's leaf tensors can outlive it until the next
         -- one (seen under load in CI: the 4 MiB x of the step before still alive after a
         -- full collection, held by no table, so its block was not in the cache)
         local settled = false
         for _ = 1, 4 do
            lm.memory.collect()                 -- the last step's blocks back in the cache
            local fresh1 = tonumber(C.lm_mem_fresh_large_count())
            garbage()
            step()
            if fresh1 == tonumber(C.lm_mem_fresh_large_count()) then
               assert.is_not_nil(dead[1], "a settled loop is not charged a collection")
               settled = true
               break
            end
            -- it missed: collected at its end, as above
            assert.is_nil(dead[1], "collected at the end of a backward that missed")
         end
         assert.is_true(settled, "the loop settled within four steps")
         -- switched off: no collection even after a miss
         lm.memory.SETTLE_POOL = false
         lm.memory.collect()
         lm.memory.empty_cache()
         local f0 = tonumber(C.lm_mem_fresh_large_count())
         garbage()
         step()
         assert.is_true(tonumber(C.lm_mem_fresh_large_count()) > f0)
         assert.is_not_nil(dead[1])
      end)
      lm.memory.SETTLE_POOL = true
      lm.memory.set_miss_block(miss_block)
      lm.memory.set_soft_limit(prev)
      lm.memory.set_traffic_limit(adaptive and "auto" or traffic)
      dead[1] = nil
      lm.memory.collect()
      assert.is_true(ok, err)
   end)

   it("the miss trigger: a large block that comes fresh collects before more fresh pages",
      function()
      local C = require("lumen.C")
      if os.getenv("LUMEN_MISS_BLOCK") == nil then
         assert.equal(2 * 2 ^ 20, lm.memory.miss_block())
      end
      local miss_block, prev = lm.memory.miss_block(), lm.memory.soft_limit()
      local traffic, adaptive = lm.memory.traffic_limit(), lm.memory.traffic_adaptive()
      local B = 4 * 2 ^ 20                      -- above the miss block, 4 MiB: growth 2B = floor
      local ok, err = pcall(function()
         lm.memory.set_traffic_limit(0)         -- whatever LUMEN_TRAFFIC_LIMIT says
         lm.memory.set_miss_block(2 * 2 ^ 20)   -- also resets the floor
         assert.equal(8 * 2 ^ 20, lm.memory.miss_floor())
         lm.memory.set_soft_limit(2 ^ 40)       -- only the miss trigger may raise the flag
         lm.memory.empty_cache()
         C.lm_mem_collected()
         assert.equal(0, C.lm_mem_pressure())
         local a = C.lm_alloc(B)                -- fresh, growth B: not yet
         assert.equal(0, C.lm_mem_pressure(), "one block of growth")
         local b = C.lm_alloc(B)                -- fresh, growth 2B: collect
         assert.are_not.equal(0, C.lm_mem_pressure(), "two blocks of growth, fresh")
         C.lm_free(a, B)
         C.lm_free(b, B)                        -- all of it was garbage: the floor stays
         C.lm_mem_collected()
         assert.equal(8 * 2 ^ 20, lm.memory.miss_floor())
         -- blocks that come from the cache never trigger it
         a, b = C.lm_alloc(B), C.lm_alloc(B)
         assert.equal(0, C.lm_mem_pressure(), "cache hits")
         local c = C.lm_alloc(B)                -- fresh again, but growth 3B: the next one
         assert.are_not.equal(0, C.lm_mem_pressure())
         C.lm_mem_collected()                   -- nothing was freed: the program keeps them
         assert.equal(16 * 2 ^ 20, lm.memory.miss_floor(), "the floor doubles")
         local d = C.lm_alloc(B)                -- growth B since the collection
         local e = C.lm_alloc(B)                -- 2B = 8 MiB < 16 MiB: not yet
         assert.equal(0, C.lm_mem_pressure(), "a growing program pays fewer collections")
         local f = C.lm_alloc(B)
         local g = C.lm_alloc(B)                -- 4B = 16 MiB
         assert.are_not.equal(0, C.lm_mem_pressure())
         for _, p in ipairs({ a, b, c, d, e, f, g }) do C.lm_free(p, B) end
         C.lm_mem_collected()                   -- freed more than half: back to the base
         assert.equal(8 * 2 ^ 20, lm.memory.miss_floor())
         -- the floor stays within half the soft limit (else it could never be reached again),
         -- and a collection with no growth since the last one resets it
         lm.memory.set_soft_limit(lm.memory.live_bytes() + 24 * 2 ^ 20)
         lm.memory.empty_cache()
         C.lm_mem_collected()
         local kept = {}
         for _ = 1, 4 do                        -- a program that keeps every block
            for _ = 1, 64 do
               kept[#kept + 1] = C.lm_alloc(B)
               if bit.band(C.lm_mem_pressure(), 4) ~= 0 then break end
            end
            assert.are_not.equal(0, bit.band(C.lm_mem_pressure(), 4), "the miss bit")
            C.lm_mem_collected()
            assert.is_true(lm.memory.miss_floor() <= math.max(8 * 2 ^ 20,
                              lm.memory.soft_limit() / 2),
               string.format("floor %d, soft limit %d", lm.memory.miss_floor(),
                             lm.memory.soft_limit()))
         end
         assert.is_true(lm.memory.miss_floor() > 8 * 2 ^ 20)
         for i = 1, #kept do C.lm_free(kept[i], B) end
         C.lm_mem_collected()                   -- live bytes fell: back to the base
         assert.equal(8 * 2 ^ 20, lm.memory.miss_floor(), "reset when the growth stops")
         lm.memory.set_soft_limit(2 ^ 40)
         C.lm_mem_collected()
         -- blocks below the miss block never trigger it
         lm.memory.empty_cache()
         local small, S = {}, 2 ^ 20
         for i = 1, 24 do small[i] = C.lm_alloc(S) end
         assert.equal(0, C.lm_mem_pressure(), "1 MiB blocks are not worth a collection")
         for i = 1, 24 do C.lm_free(small[i], S) end
         C.lm_mem_collected()
         -- off
         lm.memory.set_miss_block(0)
         lm.memory.empty_cache()
         a, b, c = C.lm_alloc(B), C.lm_alloc(B), C.lm_alloc(B)
         assert.equal(0, C.lm_mem_pressure(), "turned off")
         C.lm_free(a, B)
         C.lm_free(b, B)
         C.lm_free(c, B)
         C.lm_mem_collected()
      end)
      lm.memory.set_soft_limit(prev)
      lm.memory.set_traffic_limit(adaptive and "auto" or traffic)
      lm.memory.set_miss_block(miss_block)
      C.lm_mem_collected()
      assert.is_true(ok, err)
      assert.has_error(function() lm.memory.set_miss_block(-1) end,
         "lumen.memory.set_miss_block: bytes must be a non-negative integer, got -1")
      assert.has_error(function() lm.memory.set_miss_block("big") end)
      assert.has_error(function() lm.memory.set_miss_block(nil) end)
   end)

   it("the miss trigger: a new loop of large temporaries runs on far fewer fresh pages",
      function()
      -- the cache is emptied first, so the loop's blocks start fresh; it drops each result.
      -- The default soft limit and no traffic trigger, whatever the environment says.
      local miss_block, prev = lm.memory.miss_block(), lm.memory.soft_limit()
      local traffic, adaptive = lm.memory.traffic_limit(), lm.memory.traffic_adaptive()
      local function fresh_blocks(mb)
         lm.memory.set_miss_block(mb)
         full_collect()
         lm.memory.empty_cache()
         local start = lm.memory.live_bytes()
         local x = lm.ones({ 8, 64, 56, 57 }, { memory_format = lm.channels_last })
         local n0 = lm.memory.alloc_count()
         for _ = 1, 21 do
            local y = (x + x):relu()
            assert.equal(1, y:stride(2))          -- channels-last kept
         end
         local n = lm.memory.alloc_count() - n0
         x = nil -- luacheck: ignore
         full_collect()
         assert.equal(start, lm.memory.live_bytes())
         return n
      end
      local ok, with, without = pcall(function()
         lm.memory.set_soft_limit(lm.memory.DEFAULT_SOFT_LIMIT)
         lm.memory.set_traffic_limit(0)
         return fresh_blocks(2 * 2 ^ 20), fresh_blocks(0)
      end)
      lm.memory.set_soft_limit(prev)
      lm.memory.set_traffic_limit(adaptive and "auto" or traffic)
      lm.memory.set_miss_block(miss_block)
      assert.is_true(ok, with)
      assert.is_true(with <= 10 and with < without,
         string.format("%d fresh blocks with the trigger, %d without", with, without))
   end)

   it("the traffic trigger: off by default, can be fixed, made adaptive, turned off", function()
      if os.getenv("LUMEN_TRAFFIC_LIMIT") == nil then
         assert.equal(0, lm.memory.traffic_limit())
         assert.is_false(lm.memory.traffic_adaptive())
      end
      lm.memory.set_traffic_limit(4 * 2 ^ 20)
      assert.equal(4 * 2 ^ 20, lm.memory.traffic_limit())
      -- with a 4 MiB growth limit, a loop of 6 MB temporaries collects as it goes: its peak is
      -- well under the one the 96 MiB soft limit alone allows
      local function loop_peak(limit)
         lm.memory.set_traffic_limit(limit)
         full_collect()
         local start = lm.memory.live_bytes()
         lm.memory.reset_peak()
         for _ = 1, 50 do local _ = lm.empty(BIG) end
         return lm.memory.peak_bytes() - start
      end
      local without, with = loop_peak(0), loop_peak(4 * 2 ^ 20)
      assert.is_true(with < 0.75 * without,
         string.format("peak %.1f MB with the trigger, %.1f MB without", with / 2 ^ 20,
                       without / 2 ^ 20))
      assert.is_false(lm.memory.traffic_adaptive())
      lm.memory.set_traffic_limit(0)
      assert.equal(0, lm.memory.traffic_limit())
      assert.has_error(function() lm.memory.set_traffic_limit(-1) end,
         "lumen.memory.set_traffic_limit: bytes must be a non-negative integer, got -1")
      assert.has_error(function() lm.memory.set_traffic_limit("fast") end)
      lm.memory.set_traffic_limit("auto")
      assert.is_true(lm.memory.traffic_adaptive())
      assert.is_true(lm.memory.traffic_limit() >= 4 * 2 ^ 20)
      lm.memory.set_traffic_limit(0)
      assert.is_false(lm.memory.traffic_adaptive())
   end)
end)
