-- spec/mpi/ddp_mpirun.lua -- nn.parallel.DistributedDataParallel and nn.SyncBatchNorm on 2 ranks
-- (tools/mpi_tests.sh runs it under `mpirun -np 2`). The acceptance check: 20 SGD steps of a small
-- channels-last conv net with a global batch of 16 give the same parameters on 1 process (computed
-- on every rank, the whole batch) and on 2 processes x 8 under DDP, within 1e-5 relative; the
-- buckets' all-reduces start during backward; no_sync, unused parameters, buffers, gradient
-- layouts and mismatched modules.
local lm = require("lumen")
local nn = lm.nn
local dist = lm.distributed
local DDP = nn.parallel.DistributedDataParallel

local function err_of(...)
   local ok, e = pcall(...)
   assert.is_false(ok, "expected an error")
   return tostring(e)
end

local function net(opts)
   opts = opts or {}
   lm.manual_seed(7)
   local layers = { nn.Conv2d(3, 8, 3, { padding = 1 }) }
   if opts.bn then layers[#layers + 1] = nn.BatchNorm2d(8) end
   for _, l in ipairs({ nn.ReLU(), nn.Conv2d(8, 8, 3, { stride = 2, padding = 1 }), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10) }) do
      layers[#layers + 1] = l
   end
   local m = nn.Sequential(unpack(layers))
   m:to(lm.channels_last)
   if opts.bn then m = nn.SyncBatchNorm.convert_sync_batchnorm(m) end
   return m
end

local function batch(step, B)
   lm.manual_seed(1000 + step)
   local x = lm.randn({ B, 3, 8, 8 }):to(lm.channels_last)
   local y = lm.randint(1, 11, { B }):to(lm.int64)
   return x, y
end

local function max_rel(ps, qs)
   local worst = 0
   for i = 1, #ps do
      local d = (ps[i] - qs[i]):abs():max():item()
      local s = ps[i]:abs():max():item()
      worst = math.max(worst, d / math.max(s, 1e-12))
   end
   return worst
end

describe("DistributedDataParallel on 2 ranks", function()
   setup(function() dist.init() end)
   teardown(function() dist.finalize() end)
   local r
   before_each(function() r = dist.rank() end)

   -- one process with the global batch (here, on every rank) against 2 x half under DDP
   local function equivalence(opts, ddp_opts)
      local ref, m = net(opts), net(opts)
      if r == 1 then   -- rank 1 starts elsewhere: the wrap must broadcast rank 0's weights
         lm.no_grad(function() for _, p in ipairs(m:parameters()) do p:add_(1) end end)
      end
      local ddp = DDP(m, ddp_opts)
      local o1 = lm.optim.SGD(ref:parameters(), { lr = 0.1, momentum = 0.9 })
      local o2 = lm.optim.SGD(ddp:parameters(), { lr = 0.1, momentum = 0.9 })
      local B, W = 16, dist.world_size()
      local per = B / W
      local started = 0
      for step = 1, 20 do
         local x, y = batch(step, B)
         o1:zero_grad()
         lm.F.cross_entropy(ref(x), y):backward()
         o1:step()
         o2:zero_grad()
         local xs, ys = x:narrow(1, r * per + 1, per), y:narrow(1, r * per + 1, per)
         lm.F.cross_entropy(ddp(xs), ys):backward()
         started = started + ddp.stats.started_in_backward
         o2:step()
      end
      return max_rel(ref:parameters(), m:parameters()), ddp, started
   end

   it("20 SGD steps: 2 x 8 under DDP = 1 x 16, within 1e-5 relative", function()
      local rel, ddp, started = equivalence({}, { bucket_cap_mb = 0.001 })
      assert.is_true(rel < 1e-5, "max relative difference " .. rel)
      assert.is_true(#ddp:bucket_sizes() >= 3)
      -- every bucket but the last one completed was started while backward still ran
      assert.is_true(started >= 20 * (#ddp:bucket_sizes() - 1), "started " .. started)
   end)

   it("the same with SyncBatchNorm (statistics of the global batch)", function()
      local rel = equivalence({ bn = true })
      assert.is_true(rel < 1e-5, "max relative difference " .. rel)
   end)

   it("the same with communication after backward (overlap = false)", function()
      local rel, ddp, started = equivalence({}, { overlap = false, bucket_cap_mb = 0.001 })
      assert.is_true(rel < 1e-5, "max relative difference " .. rel)
      assert.are.equal(0, started)
      assert.are.equal(#ddp:bucket_sizes(), ddp.stats.started_after_backward)
   end)

   it("gradients are the mean of the ranks' and keep the parameters' layout", function()
      local m = net()
      local ddp = DDP(m)
      local x, y = batch(r, 4)             -- different data on each rank
      local ref = net()
      lm.F.cross_entropy(ref(x), y):backward()
      lm.F.cross_entropy(ddp(x), y):backward()
      for i, p in ipairs(m:parameters()) do
         local g = dist.all_gather(ref:parameters()[i].grad)
         local want = (g[1] + g[2]) / 2
         assert.is_true(p.grad:allclose(want, 1e-5, 1e-6), "parameter " .. i)
         assert.are.same(p:stride(), p.grad:stride())
      end
      assert.is_true(m:parameters()[1].grad:is_contiguous(lm.channels_last))
   end)

   it("no_sync accumulates locally; the next synchronised backward reduces the sums", function()
      local ref, m = net(), net()
      local ddp = DDP(m)
      local x1, y1 = batch(50 + r, 4)
      local x2, y2 = batch(60 + r, 4)
      ddp:no_sync(function() lm.F.cross_entropy(ddp(x1), y1):backward() end)
      assert.are.equal(0, ddp.stats.started_in_backward + ddp.stats.started_after_backward)
      local local_grad = m:parameters()[1].grad:clone()
      lm.F.cross_entropy(ref(x1), y1):backward()
      assert.is_true(local_grad:allclose(ref:parameters()[1].grad, 1e-6, 1e-7))
      lm.F.cross_entropy(ddp(x2), y2):backward()
      lm.F.cross_entropy(ref(x2), y2):backward()
      for i, p in ipairs(m:parameters()) do
         local g = dist.all_gather(ref:parameters()[i].grad)
         assert.is_true(p.grad:allclose((g[1] + g[2]) / 2, 1e-5, 1e-6), "parameter " .. i)
      end
   end)

   it("a parameter unused on one rank gets the other's half", function()
      lm.manual_seed(3)
      local Two = nn.Module:extend("Two")
      function Two:__init()
         self.a = nn.Linear(3, 2)
         self.b = nn.Linear(3, 2)
      end
      function Two:forward(x, which) return which == 1 and self.a(x) or self.b(x) end
      local m = Two()
      local ddp = DDP(m)
      local x = lm.ones({ 1, 3 })
      ddp(x, r + 1):sum():backward()           -- rank 0 uses a, rank 1 uses b
      assert.are.same({ 0.5, 0.5, 0.5 }, m.a.weight.grad:select(1, 1):totable())
      assert.are.same({ 0.5, 0.5, 0.5 }, m.b.weight.grad:select(1, 1):totable())
   end)

   it("broadcasts rank 0's buffers before each training forward", function()
      local m = net({ bn = false })
      local bn = nn.BatchNorm2d(3)
      local seq = nn.Sequential(bn, m)
      local ddp = DDP(seq)
      local x = batch(70 + r, 4)
      ddp(x)          -- each rank updates its own running statistics from its own batch
      local g = dist.all_gather(bn.running_mean)
      assert.is_false(g[1]:equal(g[2]))
      ddp(x)          -- the next forward starts from rank 0's
      lm.no_grad(function() ddp(x) end)
      local nb = dist.all_gather(bn.num_batches_tracked)
      assert.are.equal(nb[1]:item(), nb[2]:item())
   end)

   it("different modules on the ranks fail at wrap time on every rank", function()
      local m = r == 0 and nn.Linear(3, 2) or nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
      local e = err_of(DDP, m)
      assert.matches("lumen%.nn%.DistributedDataParallel: the modules differ across ranks", e)
      local m2 = r == 0 and nn.Linear(3, 2) or nn.Linear(4, 2)
      e = err_of(DDP, m2)
      assert.matches("with other sizes or dtypes", e)
      -- the same parameters, other buffers
      local m3 = r == 0 and nn.Sequential(nn.Linear(3, 2))
                 or nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2, { affine = false }))
      e = err_of(DDP, m3)
      assert.matches("rank %d has %d buffers, rank %d has", e)
      dist.barrier()
   end)
end)
