-- CUDA graphs (lm.cuda.CUDAGraph, lm.cuda.graph; lua/lumen/cuda_graph.lua, kernels/cuda/graph.cu):
-- nothing runs at capture, replays run on the static tensors' current contents, a whole training
-- step (convolutions, batch norm, max-pool, linear, cross-entropy, SGD with momentum) replayed
-- gives the eager run's parameters and buffers, the graph's private memory pool, shared pools,
-- and the errors: what cannot be captured (reads back to the host, random numbers, a capture
-- inside a capture) ends the capture cleanly and leaves the device usable. Runs on cuda:0 (a
-- GPU, or the emulated build, which records and replays on the host); without CUDA only the
-- argument checks and "not available" run.

local H = require("spec.helpers")
local lm = H.lm
local ffi = require("ffi")

local function has_cuda() return lm.cuda.is_available() end

-- f raises an error whose message contains needle (plain text)
local function fails(f, needle)
   local ok, msg = pcall(f)
   assert(not ok, "expected an error mentioning " .. needle)
   msg = tostring(msg)
   assert(msg:find(needle, 1, true), ("expected %q in %q"):format(needle, msg))
end

describe("lm.cuda graphs without a device", function()
   it("makes empty graphs and checks its arguments anywhere", function()
      local g = lm.cuda.CUDAGraph()
      assert.matches("empty", tostring(g))
      assert.is_false(lm.cuda.is_current_stream_capturing())
      local nop = function() end
      fails(function() lm.cuda.graph(nil, nop) end,
            "lumen.cuda.graph: expected a lm.cuda.CUDAGraph, got nil")
      fails(function() lm.cuda.graph(g, 5) end,
            "lumen.cuda.graph: expected a function to capture, got number")
      fails(function() lm.cuda.graph(g, nop, {stream = 1}) end,
            "lumen.cuda.graph: unknown option 'stream' (pool, device)")
      fails(function() lm.cuda.graph(g, function() end, {pool = -1}) end,
                             "pool must be a lm.cuda.graph_pool_handle")
      fails(function() lm.cuda.graph(g, function() end, {device = "cpu"}) end,
                             "expected a CUDA device")
      fails(function() g:replay() end, "holds no capture")
      fails(function() g:capture_end() end, "not capturing")
      fails(function() g.replay({}) end, "expected a lm.cuda.CUDAGraph")
      fails(function() lm.cuda.is_current_stream_capturing("gpu") end,
                             "expected a CUDA device")
   end)

   it("says CUDA is not available where it is not", function()
      if has_cuda() then pending("CUDA is available here") return end
      fails(function() lm.cuda.CUDAGraph():capture_begin() end,
                             "lumen.cuda.CUDAGraph.capture_begin: CUDA is not available")
      fails(function() lm.cuda.graph_pool_handle() end, "CUDA is not available")
   end)
end)

describe("lm.cuda graphs on cuda:0", function()
   local dev = "cuda:0"
   local function cpu(t) return t:to("cpu") end
   local function addr(t) return tonumber(ffi.cast("uintptr_t", t._c.storage.data)) end

   it("runs nothing at capture and the captured work at each replay, on the inputs' contents",
      function()
      if not has_cuda() then pending("no CUDA device") return end
      local x = lm.ones({5}, {device = dev})
      local y = lm.zeros({5}, {device = dev})
      local g = lm.cuda.CUDAGraph()
      local out = lm.cuda.graph(g, function()
         assert.is_true(lm.cuda.is_current_stream_capturing())
         y:copy_(x * 2 + 1)
         return (x + y):relu()
      end)
      assert.is_false(lm.cuda.is_current_stream_capturing())
      assert.matches("captured on cuda:0", tostring(g))
      assert.are.same({0, 0, 0, 0, 0}, cpu(y):totable())       -- not run by the capture
      g:replay()
      assert.are.same({3, 3, 3, 3, 3}, cpu(y):totable())
      assert.are.same({4, 4, 4, 4, 4}, cpu(out):totable())
      x:copy_(lm.tensor({1, 2, 3, 4, -20}))
      g:replay()
      assert.are.same({3, 5, 7, 9, -39}, cpu(y):totable())
      assert.are.same({4, 7, 10, 13, 0}, cpu(out):totable())
      assert.is_number(g:pool())
      g:reset()
      assert.matches("empty", tostring(g))
      fails(function() g:replay() end, "holds no capture")
   end)

   it("replays a channels-last training step to the eager run's parameters and buffers",
      function()
      if not has_cuda() then pending("no CUDA device") return end
      local nn = lm.nn
      local function net()
         lm.manual_seed(7)
         local m = nn.Sequential(nn.Conv2d(3, 8, 3, {padding = 1, bias = false}),
            nn.BatchNorm2d(8), nn.ReLU(true), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, {padding = 1}), nn.BatchNorm2d(16), nn.ReLU(true),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
         m = lm.to_channels_last(m):to(dev)
         m:train()
         return m
      end
      -- on a GPU: deterministic cuDNN algorithms, so that the eager and the replayed steps
      -- compute the same sums (the emulated build is deterministic anyway)
      local det = lm.backends.cudnn.deterministic
      lm.backends.cudnn.deterministic = true
      lm.manual_seed(1)
      local N, WARM = 20, 3
      local xs, ys = {}, {}
      for i = 1, N do
         xs[i] = lm.randn({4, 3, 8, 8}, {device = "cpu"}):contiguous(lm.channels_last)
         ys[i] = lm.randint(1, 6, {4}, {dtype = lm.int64, device = "cpu"})
      end
      local a = net()
      local oa = lm.optim.SGD(a:parameters(), {lr = 0.1, momentum = 0.9, weight_decay = 1e-4})
      local last
      for i = 1, N do
         oa:zero_grad(true)
         local loss = lm.F.cross_entropy(a(xs[i]:to(dev)), ys[i]:to(dev))
         loss:backward()
         oa:step()
         last = loss:item()
      end

      local b = net()
      local ob = lm.optim.SGD(b:parameters(), {lr = 0.1, momentum = 0.9, weight_decay = 1e-4})
      local sx = lm.empty({4, 3, 8, 8}, {device = dev}):contiguous(lm.channels_last)
      local sy = lm.empty({4}, {dtype = lm.int64, device = dev})
      for i = 1, WARM do -- eager warm-up: the momentum buffers exist before the capture
         sx:copy_(xs[i])
         sy:copy_(ys[i])
         ob:zero_grad(true)
         lm.F.cross_entropy(b(sx), sy):backward()
         ob:step()
      end
      ob:zero_grad(true)
      local g = lm.cuda.CUDAGraph()
      local sloss = lm.cuda.graph(g, function()
         local loss = lm.F.cross_entropy(b(sx), sy)
         loss:backward()
         ob:step()
         return loss
      end)
      for i = WARM + 1, N do
         sx:copy_(xs[i])
         sy:copy_(ys[i])
         g:replay()
      end
      assert.is_true(math.abs(sloss:item() - last) <= 1e-5 * math.max(1, math.abs(last)))
      local function close(ta, tb, what)
         for i = 1, #ta do
            local u, v = cpu(ta[i]):double(), cpu(tb[i]):double()
            local d = (u - v):abs():max():item()
            local s = u:abs():max():item()
            assert(d <= 1e-5 * math.max(1, s), ("%s %d: %g apart"):format(what, i, d))
         end
      end
      lm.backends.cudnn.deterministic = det
      close(a:parameters(), b:parameters(), "parameter")
      close(a:buffers(), b:buffers(), "buffer")
      for _, p in ipairs(b:parameters()) do
         if p:dim() == 4 then
            assert.is_true(p:is_contiguous(lm.channels_last))
            assert.is_true(p.grad:is_contiguous(lm.channels_last))
         end
      end
   end)

   it("follows a learning-rate schedule between replays with capturable SGD and AdamW", function()
      if not has_cuda() then pending("no CUDA device") return end
      local function net()
         lm.manual_seed(5)
         local m = lm.nn.Sequential(lm.nn.Conv2d(3, 6, 3, {padding = 1}), lm.nn.ReLU(),
                                    lm.nn.Flatten(), lm.nn.Linear(6 * 16, 4))
         return lm.to_channels_last(m):to(dev)
      end
      lm.manual_seed(2)
      local N, WARM = 12, 2
      local xs, ys = {}, {}
      for i = 1, N do
         xs[i] = lm.randn({3, 3, 4, 4}, {device = "cpu"}):contiguous(lm.channels_last)
         ys[i] = lm.randint(1, 5, {3}, {dtype = lm.int64, device = "cpu"})
      end
      local function setup()
         local m = net()
         local o = lm.optim.SGD(m:parameters(), {lr = 0.2, momentum = 0.9, capturable = true})
         return m, o, lm.optim.lr_scheduler.StepLR(o, {step_size = 3, gamma = 0.5})
      end
      local a, oa, sa = setup()
      for i = 1, N do
         oa:zero_grad(true)
         lm.F.cross_entropy(a(xs[i]:to(dev)), ys[i]:to(dev)):backward()
         oa:step()
         sa:step()
      end
      local b, ob, sb = setup()
      local sx = lm.empty({3, 3, 4, 4}, {device = dev}):contiguous(lm.channels_last)
      local sy = lm.empty({3}, {dtype = lm.int64, device = dev})
      local function step()
         lm.F.cross_entropy(b(sx), sy):backward()
         ob:step()
      end
      for i = 1, WARM do
         sx:copy_(xs[i])
         sy:copy_(ys[i])
         ob:zero_grad(true)
         step()
         sb:step()
      end
      ob:zero_grad(true)
      local g = lm.cuda.CUDAGraph()
      lm.cuda.graph(g, step)
      for i = WARM + 1, N do
         sx:copy_(xs[i])
         sy:copy_(ys[i])
         g:replay()
         sb:step() -- the new lr reaches the captured step through the device tensor
      end
      assert.are.equal(oa.param_groups[1].lr, ob.param_groups[1].lr)
      local pa, pb = a:parameters(), b:parameters()
      for i = 1, #pa do
         local d = (cpu(pa[i]) - cpu(pb[i])):abs():max():item()
         assert(d <= 1e-6, ("parameter %d: %g apart"):format(i, d))
      end
      -- AdamW: the step count and the lr on the device; state_dict counts every replay
      local function adamw()
         local m = net()
         local o = lm.optim.AdamW(m:parameters(), {lr = 0.01, capturable = true})
         return m, o, lm.optim.lr_scheduler.StepLR(o, {step_size = 3, gamma = 0.5})
      end
      local a2, oa2, sa2 = adamw()
      for i = 1, N do
         oa2:zero_grad(true)
         lm.F.cross_entropy(a2(xs[i]:to(dev)), ys[i]:to(dev)):backward()
         oa2:step()
         sa2:step()
      end
      local b2, ob2, sb2 = adamw()
      local function step2()
         lm.F.cross_entropy(b2(sx), sy):backward()
         ob2:step()
      end
      sx:copy_(xs[1])
      sy:copy_(ys[1])
      ob2:zero_grad(true)
      step2()
      sb2:step()
      ob2:zero_grad(true)
      local g2 = lm.cuda.CUDAGraph()
      lm.cuda.graph(g2, step2)
      for i = 2, N do
         sx:copy_(xs[i])
         sy:copy_(ys[i])
         g2:replay()
         sb2:step()
      end
      assert.are.equal(N, ob2:state_dict().state[1].step)
      local qa, qb = a2:parameters(), b2:parameters()
      for i = 1, #qa do
         local d = (cpu(qa[i]) - cpu(qb[i])):abs():max():item()
         assert(d <= 1e-6, ("AdamW parameter %d: %g apart"):format(i, d))
      end
      g2:reset()

      -- a capturable SGD that never stepped cannot be captured
      local c = net()
      local oc = lm.optim.SGD(c:parameters(), {lr = 0.1, momentum = 0.9, capturable = true})
      local xc = lm.randn({3, 3, 4, 4}, {device = dev})
      fails(function()
         lm.cuda.graph(lm.cuda.CUDAGraph(), function()
            lm.F.cross_entropy(c(xc), sy):backward()
            oc:step()
         end)
      end, "takes one eager step before a CUDA graph captures it")
   end)

   it("captures gather and embedding lookups: the indices read at each replay", function()
      if not has_cuda() then pending("no CUDA device") return end
      local w = lm.randn({6, 3}, {device = dev, requires_grad = true})
      local idx = lm.tensor({1, 4, 6}, {dtype = lm.int64}):to(dev)
      local g = lm.cuda.CUDAGraph()
      local out = lm.cuda.graph(g, function()
         local e = lm.F.embedding(idx, w)          -- index_select: a gather
         e:sum():backward()                         -- its backward: a scatter_add
         return e
      end)
      for _, ids in ipairs({{2, 2, 5}, {6, 1, 3}}) do
         idx:copy_(lm.tensor(ids, {dtype = lm.int64}))
         g:replay()
         local wc = cpu(w):totable()
         local got = cpu(out):totable()
         local count = {0, 0, 0, 0, 0, 0}
         for r = 1, 3 do
            assert.are.same(wc[ids[r]], got[r])
            count[ids[r]] = count[ids[r]] + 1
         end
         -- the gradient made in the capture is rewritten (not accumulated) by each replay
         local gw = cpu(w.grad):totable()
         for r = 1, 6 do assert.are.same({count[r], count[r], count[r]}, gw[r]) end
      end
      -- an index out of range inside a replay: no check can be read back there, so the kernel
      -- guards it (a zero row, no gradient) instead of reading elsewhere
      idx:copy_(lm.tensor({1, 7, 0}, {dtype = lm.int64}))
      g:replay()
      local got = cpu(out):totable()
      assert.are.same({0, 0, 0}, got[2])
      assert.are.same({0, 0, 0}, got[3])
      assert.are.same(cpu(w):totable()[1], got[1])
      g:reset()
   end)

   it("ends a capture that cannot go on, and the device stays usable", function()
      if not has_cuda() then pending("no CUDA device") return end
      local x = lm.ones({3}, {device = dev})
      local g = lm.cuda.CUDAGraph()
      local cases = {
         {function() return (x * 2):sum():item() end,
          "lumen.item: cuda:0: a copy to the host while a CUDA graph is being captured"},
         {function() return lm.tensor({1, 2}, {device = dev}) end, "CUDA graph is being captured"},
         {function() return lm.rand({4}, {device = dev}) end, "CUDA graph is being captured"},
         {function() lm.cuda.synchronize() end, "lumen.cuda.synchronize: cuda:0 is capturing"},
         {function() lm.cuda.empty_cache() end, "lumen.cuda.empty_cache: cuda:0 is capturing"},
         {function() lm.cuda.graph(lm.cuda.CUDAGraph(), function() end) end,
          "already being captured"},
         {function() error("mine") end, "mine"},
      }
      for i, c in ipairs(cases) do
         fails(function() lm.cuda.graph(g, c[1]) end, c[2])
         assert.is_false(lm.cuda.is_current_stream_capturing(), "case " .. i)
         assert.matches("empty", tostring(g))
         assert.are.same({3, 3, 3}, cpu(x * 3):totable())
      end
      -- a graph reused after a failed capture
      local y = lm.cuda.graph(g, function() return x + 1 end)
      g:replay()
      assert.are.same({2, 2, 2}, cpu(y):totable())
      fails(function() g:capture_begin() end, "already holds a capture")
      g:reset()
   end)

   it("keeps the graph's memory to itself until it is reset, and then gives it back", function()
      if not has_cuda() then pending("no CUDA device") return end
      -- one capture first: the libraries' handles (and cuBLAS's workspace) are made at the
      -- first capture and kept
      lm.cuda.graph(lm.cuda.CUDAGraph(), function() end)
      collectgarbage()
      lm.cuda.empty_cache()
      local reserved0 = lm.cuda.memory_reserved()
      local x = lm.ones({1000}, {device = dev})
      local g = lm.cuda.CUDAGraph()
      local inner
      local y = lm.cuda.graph(g, function()
         local t = x * 5   -- freed inside the capture: its block stays the graph's
         inner = addr(t)
         return t + 1
      end)
      collectgarbage()
      collectgarbage()
      -- a tensor made outside the graph never lands on the graph's addresses
      for _ = 1, 4 do
         local z = lm.empty({1000}, {device = dev})
         assert.are_not.equal(inner, addr(z))
         assert.are_not.equal(addr(y), addr(z))
      end
      g:replay()
      assert.are.equal(6, cpu(y):totable()[1])
      assert.is_true(lm.cuda.memory_reserved() > reserved0)
      g:reset()
      assert.are.equal(6, cpu(y):totable()[1]) -- y is still alive, and so is its block
      y = nil -- luacheck: ignore 311 (dropped for the collector)
      collectgarbage()
      collectgarbage()
      lm.cuda.empty_cache()
      local after = lm.cuda.memory_reserved()
      assert.is_true(after <= reserved0 + 4 * 1024 * 1024,
                     "reserved " .. after .. " after, " .. reserved0 .. " before")
   end)

   it("holds another graph's block freed during a capture until the new graph goes", function()
      if not has_cuda() then pending("no CUDA device") return end
      local x = lm.full({1000}, 3, {device = dev})
      local g1, g2 = lm.cuda.CUDAGraph(), lm.cuda.CUDAGraph()
      local y1 = lm.cuda.graph(g1, function() return x * 2 end)
      g1:replay()
      g1:reset() -- its pool stays while y1 holds a block of it
      local frees = lm.cuda.memory_stats().num_device_free
      local y2 = lm.cuda.graph(g2, function()
         local r = y1 + 1
         y1 = nil -- dropped inside the capture: the block must outlive it (g2 reads it)
         collectgarbage()
         collectgarbage()
         return r
      end)
      assert.is_nil(y1)
      collectgarbage()
      -- g1's pool was not given back: g2 holds the block it reads
      assert.are.equal(frees, lm.cuda.memory_stats().num_device_free)
      -- new segments of the small pool's size: a released segment would be reused and
      -- overwritten here
      local fill = {}
      for i = 1, 6 do fill[i] = lm.full({262144}, -1, {device = dev}) end
      assert.are.equal(6, #fill)
      g2:replay()
      assert.are.same(7, cpu(y2):totable()[1000])
      g2:reset()
      y2, fill = nil, nil -- luacheck: ignore 311 (dropped for the collector)
      collectgarbage()
   end)

   it("shares a pool between graphs replayed in their capture order", function()
      if not has_cuda() then pending("no CUDA device") return end
      local pool = lm.cuda.graph_pool_handle()
      assert.is_number(pool)
      local x = lm.full({4}, 2, {device = dev})
      local g1, g2 = lm.cuda.CUDAGraph(), lm.cuda.CUDAGraph()
      local a = lm.cuda.graph(g1, function() return x * x end, {pool = pool})
      local b = lm.cuda.graph(g2, function() return a + x end, {pool = g1:pool()})
      assert.are.equal(pool, g2:pool())
      for v = 1, 3 do
         x:fill_(v)
         g1:replay()
         g2:replay()
         assert.are.same({v * v + v, v * v + v, v * v + v, v * v + v}, cpu(b):totable())
      end
      g1:reset()
      g2:reset()
   end)
end)
