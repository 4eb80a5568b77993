-- spec/mpi/collectives_mpirun.lua -- lm.distributed across 2 processes. Run by
-- tools/mpi_tests.sh under `mpirun -np 2` (busted on every rank; both ranks' counts are added):
-- every collective with every dtype and memory format (dense tensors in place, others packed),
-- the ops, the non-blocking forms, and the cross-rank checks (mismatched shapes, dtypes, ops,
-- roots and collectives fail on every rank, after which the job goes on).
local lm = require("lumen")
local dist = lm.distributed

local function err_of(...)
   local ok, e = pcall(...)
   assert.is_false(ok, "expected an error")
   return tostring(e)
end

describe("lm.distributed on 2 ranks", function()
   setup(function() dist.init({ backend = "mpi" }) end)
   teardown(function() dist.finalize() end)

   local r, W
   before_each(function() r, W = dist.rank(), dist.world_size() end)

   it("is a job of 2", function()
      assert.are.equal(2, W)
      assert.is_true(r == 0 or r == 1)
      dist.barrier()
   end)

   local DTYPES = { "float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool" }
   -- (name, maker(base) -> tensor with base's values, expected in place?)
   local function base_values(sizes, dtype)
      local n = 1
      for _, s in ipairs(sizes) do n = n * s end
      local v = lm.arange(0, n):fmod(7):view(sizes)
      if dtype == "bool" then v = v:gt(3) end
      return v:to(lm[dtype])
   end
   local LAYOUTS = {
      { "contiguous", { 2, 3, 4, 5 }, function(v) return v:contiguous() end, true },
      { "channels_last", { 2, 3, 4, 5 }, function(v) return v:to(lm.channels_last) end, true },
      { "channels_last_3d", { 2, 3, 2, 3, 4 },
        function(v) return v:to(lm.channels_last_3d) end, true },
      { "transposed (dense)", { 4, 6 }, function(v) return v:t():contiguous():t() end, true },
      { "narrowed (not dense)", { 3, 5 }, function(v)
           local big = lm.zeros({ 3, 8 }, { dtype = v:dtype() })
           local s = big:narrow(2, 2, 5)
           s:copy_(v)
           return s
        end, false },
      { "0-dim", {}, function(v) return v end, true },
   }
   local function expect_sum(v, dtype)
      if dtype == "bool" then return v end                   -- or of equal values
      return v:to(lm.float64):mul(3):to(lm[dtype])           -- (1 + 2) * v
   end

   for _, dt in ipairs(DTYPES) do
      for _, L in ipairs(LAYOUTS) do
         it(("all_reduce sum: %s, %s"):format(dt, L[1]), function()
            local v = base_values(L[2], dt)
            local t = L[3](dt == "bool" and v:clone() or v:to(lm.float64):mul(r + 1):to(lm[dt]))
            local strides = t:stride()
            local staged = dist.stats.staged
            assert.are.equal(t, dist.all_reduce(t))
            local copies = dist.stats.staged - staged
            assert.are.same(expect_sum(v, dt):to(lm.float64):totable(), t:to(lm.float64):totable())
            assert.are.same(strides, t:stride())
            local half = dt == "float16" or dt == "bfloat16"
            if L[4] and not half then
               assert.are.equal(0, copies, "a dense tensor goes in place")
            else
               assert.are.equal(1, copies)
            end
         end)
         it(("broadcast and all_gather: %s, %s"):format(dt, L[1]), function()
            local v = base_values(L[2], dt)
            local mine = L[3](dt == "bool" and (r == 0 and v:clone() or v:logical_not())
                              or v:to(lm.float64):add(r):to(lm[dt]))
            local g = dist.all_gather(mine)
            assert.are.equal(2, #g)
            for k = 1, 2 do
               local want = dt == "bool" and (k == 1 and v or v:logical_not())
                            or v:to(lm.float64):add(k - 1):to(lm[dt])
               assert.are.same(want:to(lm.float64):totable(), g[k]:to(lm.float64):totable())
               assert.are.equal(lm[dt], g[k]:dtype())
               if L[4] then assert.are.same(mine:stride(), g[k]:stride()) end
            end
            local staged = dist.stats.staged
            local root = (#L[2] + #dt) % 2          -- both roots over the table
            dist.broadcast(mine, { root = root })
            assert.are.same(g[root + 1]:to(lm.float64):totable(), mine:to(lm.float64):totable())
            if L[4] then assert.are.equal(0, dist.stats.staged - staged) end
         end)
      end
   end

   it("empty tensors", function()
      local e = lm.zeros({ 0, 3 })
      dist.all_reduce(e)
      dist.broadcast(e)
      local g = dist.all_gather(e)
      assert.are.same({ 0, 3 }, g[2]:size())
      assert.are.same({ 0, 3 }, dist.reduce_scatter(lm.zeros({ 0, 3 })):size())
   end)

   it("ops: mean, max, min, prod", function()
      local base = lm.tensor({ 1, -2, 3, 4 }, { dtype = lm.float32 })
      local function on(op)
         local t = base:mul(r + 1)
         return dist.all_reduce(t, { op = op }):totable()
      end
      assert.are.same({ 1.5, -3, 4.5, 6 }, on("mean"))
      assert.are.same({ 2, -2, 6, 8 }, on("max"))
      assert.are.same({ 1, -4, 3, 4 }, on("min"))
      assert.are.same({ 2, 8, 18, 32 }, on("prod"))
      local i = lm.tensor({ 5, -7 }):mul(r == 0 and 1 or -1)
      assert.are.same({ 5, 7 }, dist.all_reduce(i, { op = "max" }):totable())
      local b = lm.tensor({ r == 0, false, true })
      assert.are.same({ false, false, true }, dist.all_reduce(b:clone(), { op = "min" }):totable())
      assert.are.same({ true, false, true }, dist.all_reduce(b:clone(), { op = "sum" }):totable())
      local h = lm.tensor({ 1, 2, 1000 }, { dtype = lm.bfloat16 }):mul(r + 1)
      assert.are.same({ 1.5, 3, 1504 }, dist.all_reduce(h, { op = "mean" }):float():totable())
   end)

   it("different layouts on the ranks: packed, same values", function()
      local v = lm.arange(0, 120):float():view(2, 3, 4, 5)
      local t = r == 0 and v:clone() or v:to(lm.channels_last)
      local s = t:stride()
      dist.all_reduce(t)
      assert.are.same(v:mul(2):totable(), t:totable())
      assert.are.same(s, t:stride())
      local g = dist.all_gather(t)
      assert.is_true(g[1]:is_contiguous())           -- no common layout: contiguous
      assert.are.same(t:totable(), g[2]:totable())
   end)

   it("reduce_scatter: rank r gets chunk r + 1 of the reduction along dim 1", function()
      local t = lm.arange(0, 24):float():view(4, 3, 1, 2):mul(r + 1)
      local out = dist.reduce_scatter(t)
      local want = lm.arange(0, 24):float():view(4, 3, 1, 2):mul(3):narrow(1, 2 * r + 1, 2)
      assert.are.same(want:totable(), out:totable())
      local cl = lm.arange(0, 24):float():view(4, 3, 1, 2):to(lm.channels_last):mul(r + 1)
      local staged = dist.stats.staged
      local out2 = dist.reduce_scatter(cl, { op = "mean" })
      assert.are.equal(0, dist.stats.staged - staged)
      assert.is_true(out2:is_contiguous(lm.channels_last))
      assert.are.same(want:div(2):totable(), out2:totable())
      assert.matches("lumen%.distributed%.reduce_scatter: the size of dim 1 %(3%) must be a " ..
                     "multiple of the world size %(2%)",
                     err_of(dist.reduce_scatter, lm.ones({ 3 })))
      local h = lm.tensor({ 1, 2, 3, 4 }, { dtype = lm.float16 }):mul(r + 1)
      assert.are.same(r == 0 and { 3, 6 } or { 9, 12 },
                      dist.reduce_scatter(h):float():totable())
   end)

   it("non-blocking forms: a handle to wait on", function()
      local a = lm.ones({ 1000 }):mul(r + 1)
      local b = lm.full({ 3, 4 }, r + 10):to(lm.int64)
      local c = lm.ones({ 4, 2 }):mul(r)
      local h1 = dist.all_reduce(a, { op = "mean", async = true })
      local h2 = dist.broadcast(b, { root = 1, async = true })
      local h3 = dist.all_gather(c, { async = true })
      local h4 = dist.reduce_scatter(c, { async = true })
      local h5 = dist.barrier({ async = true })
      local spins = 0
      while not h1:is_completed() do spins = spins + 1 end
      assert.are.equal(a, h1:wait())
      assert.are.same(lm.full({ 1000 }, 1.5):totable(), a:totable())
      assert.are.equal(b, h2:wait())
      assert.are.same(lm.full({ 3, 4 }, 11):totable(), b:totable())
      local g = h3:wait()
      assert.are.same({ 0, 8 }, { g[1]:sum():item(), g[2]:sum():item() })
      assert.are.same(lm.ones({ 2, 2 }):totable(), h4:wait():totable())
      h5:wait()
      assert.is_true(h5:is_completed())
      -- a non-dense tensor: packed, copied back at wait
      local big = lm.zeros({ 4, 4 })
      local s = big:narrow(2, 1, 2)
      s:fill_(r + 1)
      dist.all_reduce(s, { async = true }):wait()
      assert.are.same({ 3, 3, 0, 0 }, big:select(1, 1):totable())
   end)

   it("tensors on another device go through a CPU copy", function()
      local t = lm.ones({ 2, 3 }, { device = "sim:0" }):mul(r + 1)
      dist.all_reduce(t)
      assert.are.equal("sim:0", t:device())
      assert.are.same(lm.full({ 2, 3 }, 3):totable(), t:cpu():totable())
      local g = dist.all_gather(t)
      assert.are.equal("sim:0", g[2]:device())
   end)

   it("mismatched shapes fail on every rank, naming both; the job goes on", function()
      local t = r == 0 and lm.zeros({ 3, 4 }) or lm.zeros({ 4, 4 })
      local e = err_of(dist.all_reduce, t)
      assert.matches("lumen%.distributed%.all_reduce: ranks disagree on the tensor", e)
      assert.matches("rank 0 has float32 %(3, 4%)", e)
      assert.matches("rank 1 has float32 %(4, 4%)", e)
      local u = lm.ones({ 2 })
      dist.all_reduce(u)
      assert.are.same({ 2, 2 }, u:totable())
   end)

   it("mismatched dtypes, ops, roots and collectives fail on every rank", function()
      local e = err_of(dist.all_gather, r == 0 and lm.zeros({ 2 })
                                        or lm.zeros({ 2 }, { dtype = lm.float64 }))
      assert.matches("lumen%.distributed%.all_gather: ranks disagree on the tensor", e)
      assert.matches("float64 %(2%)", e)
      e = err_of(dist.all_reduce, lm.ones({ 2 }), { op = r == 0 and "sum" or "max" })
      assert.matches("ranks disagree: rank %d uses op \"%a+\", rank %d uses op", e)
      e = err_of(dist.broadcast, lm.ones({ 2 }), { root = r })
      assert.matches("lumen%.distributed%.broadcast: ranks disagree: rank %d uses root %d", e)
      if r == 0 then
         e = err_of(dist.all_reduce, lm.ones({ 2 }))
      else
         e = err_of(dist.broadcast, lm.ones({ 2 }))
      end
      assert.matches("ranks disagree: rank %d called %a+_?%a*, rank %d called", e)
      assert.matches("same order", e)
      dist.barrier()
   end)
end)
