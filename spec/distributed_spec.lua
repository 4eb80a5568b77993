-- spec/distributed_spec.lua -- what of the scale-out part runs in one process (make test):
-- lm.distributed before init (errors; nothing loads libmpi), the autograd hooks that
-- DistributedDataParallel is built on, DistributedSampler, SyncBatchNorm outside a job, and --
-- where Open MPI is installed -- a job of one process (init without mpirun). The collectives
-- across two processes, DDP's equivalence with one process and the failure cases run under mpirun
-- in the "mpi" stage of .ci/run (tools/mpi_tests.sh, spec/mpi/).
local H = require("spec.helpers")
local lm = H.lm
local nn = lm.nn
local A = require("lumen.autograd")

describe("lm.distributed before init", function()
   local dist = lm.distributed
   it("is not initialized and says how to start", function()
      if dist.is_initialized() then return end -- a previous file in the same process (TEST_SPLIT=0)
      assert.is_false(dist.is_initialized())
      for _, f in ipairs({ "rank", "world_size", "barrier", "finalize" }) do
         local ok, err = pcall(dist[f])
         assert.is_false(ok)
         assert.matches("^lumen%.distributed%." .. f .. ": the process group is not initialized",
                        tostring(err):gsub("^[^:]*:%d+: ", ""))
      end
      local t = lm.ones({ 3 })
      for _, f in ipairs({ "all_reduce", "broadcast", "all_gather", "reduce_scatter" }) do
         local ok, err = pcall(dist[f], t)
         assert.is_false(ok)
         assert.matches("lumen%.distributed%." .. f .. ": the process group is not initialized",
                        tostring(err))
         assert.matches("mpirun", tostring(err))
      end
      assert.are.same({ 1, 1, 1 }, t:totable())
   end)
   it("DistributedDataParallel needs init", function()
      if dist.is_initialized() then return end
      local ok, err = pcall(nn.parallel.DistributedDataParallel, nn.Linear(2, 2))
      assert.is_false(ok)
      assert.matches("lumen%.nn%.DistributedDataParallel: the process group is not initialized",
                     tostring(err))
   end)
   it("rejects bad init options", function()
      if dist.is_initialized() then return end
      local ok, err = pcall(dist.init, { backend = "gloo" })
      assert.is_false(ok)
      assert.matches("lumen%.distributed%.init: unknown backend gloo", tostring(err))
      ok, err = pcall(dist.init, { bakend = "mpi" })
      assert.is_false(ok)
      assert.matches("unknown option 'bakend'", tostring(err))
      ok, err = pcall(dist.init, { backend = "nccl" })
      assert.is_false(ok)
      assert.matches("'nccl' is not available yet", tostring(err))
      assert.is_false(dist.is_initialized())
   end)
   it("a missing library is a clear init error", function()
      if dist.is_initialized() then return end
      -- a fresh copy of the module that looks for a library that does not exist
      local saved = package.loaded["lumen.distributed"]
      package.loaded["lumen.distributed"] = nil
      local env = os.getenv
      os.getenv = function(k) -- luacheck: ignore
         if k == "LUMEN_MPI_LIB" then return "/nonexistent/libmpi.so.40" end
         return env(k)
      end
      local ok, d = pcall(require, "lumen.distributed")
      local avail = ok and d.is_available()
      local ok2, err = pcall(d.init)
      os.getenv = env -- luacheck: ignore
      package.loaded["lumen.distributed"] = saved
      assert.is_true(ok)
      assert.is_false(avail)
      assert.is_false(ok2)
      assert.matches("lumen%.distributed%.init: cannot load the MPI library", tostring(err))
      assert.matches("openmpi", tostring(err))
   end)
end)

describe("autograd hooks for DistributedDataParallel", function()
   it("register_post_accumulate_grad_hook runs once, after the last accumulation", function()
      local w = lm.tensor({ 1, 2, 3 }, { dtype = lm.float32 }):requires_grad_()
      local b = lm.tensor({ 1, 1, 1 }, { dtype = lm.float32 }):requires_grad_()
      local seen = {}
      w:register_post_accumulate_grad_hook(function(p)
         assert.are.equal(w, p)
         seen[#seen + 1] = { "w", p.grad:totable() }
      end)
      local h = b:register_post_accumulate_grad_hook(function() seen[#seen + 1] = { "b" } end)
      -- w is used three times: one hook call, with the full gradient 2w + b + 1
      local y = (w * w + w * b + w):sum()
      y:backward()
      assert.are.equal(2, #seen)
      local wi = seen[1][1] == "w" and 1 or 2
      assert.are.same({ 4, 6, 8 }, seen[wi][2])
      -- removed: no more calls; a second backward calls w's hook again
      h:remove()
      seen = {}
      w.grad = nil
      local y2 = (w * b):sum()
      y2:backward()
      assert.are.equal(1, #seen)
      assert.are.same({ 1, 1, 1 }, seen[1][2])
   end)
   it("runs for a leaf that is the root of backward", function()
      local w = lm.tensor({ 2 }, { dtype = lm.float32 }):requires_grad_()
      local n = 0
      w:register_post_accumulate_grad_hook(function() n = n + 1 end)
      w:backward(lm.ones({ 1 }))
      assert.are.equal(1, n)
   end)
   it("refuses non-leaves, tensors without grad and non-functions", function()
      local w = lm.ones({ 2 }):requires_grad_()
      local ok, err = pcall(function() return (w * 2):register_post_accumulate_grad_hook(print) end)
      assert.is_false(ok)
      assert.matches("non%-leaf", tostring(err))
      ok, err = pcall(function()
         return lm.ones({ 2 }):register_post_accumulate_grad_hook(print)
      end)
      assert.is_false(ok)
      assert.matches("doesn't require gradient", tostring(err))
      ok, err = pcall(function() return w:register_post_accumulate_grad_hook(3) end)
      assert.is_false(ok)
      assert.matches("hook must be a function", tostring(err))
   end)
   it("queue_callback runs at the end of backward, in order, only during backward", function()
      local w = lm.ones({ 2 }):requires_grad_()
      local log = {}
      w:register_post_accumulate_grad_hook(function()
         A.queue_callback(function()
            log[#log + 1] = "cb1"
            assert.is_false(lm.is_grad_enabled())
            A.queue_callback(function() log[#log + 1] = "cb3" end)
         end)
         A.queue_callback(function() log[#log + 1] = "cb2" end)
         log[#log + 1] = "hook"
      end)
      ;(w * 3):sum():backward()
      assert.are.same({ "hook", "cb1", "cb2", "cb3" }, log)
      assert.is_true(lm.is_grad_enabled())
      local ok, err = pcall(A.queue_callback, function() end)
      assert.is_false(ok)
      assert.matches("no backward pass is running", tostring(err))
   end)
   it("an error in a callback is the backward's error", function()
      local w = lm.ones({ 2 }):requires_grad_()
      w:register_post_accumulate_grad_hook(function()
         A.queue_callback(function() error("boom") end)
      end)
      local ok, err = pcall(function() (w * 3):sum():backward() end)
      assert.is_false(ok)
      assert.matches("boom", tostring(err))
      assert.is_true(lm.is_grad_enabled())
      local ok2 = pcall(A.queue_callback, function() end)
      assert.is_false(ok2)
   end)
end)

describe("data.DistributedSampler", function()
   local S = lm.data.DistributedSampler
   local function shares(n, R, opts)
      local all = {}
      for r = 0, R - 1 do
         local o = { num_replicas = R, rank = r }
         for k, v in pairs(opts or {}) do o[k] = v end
         all[r + 1] = S(n, o)
      end
      return all
   end
   it("splits every epoch into disjoint shares that cover the data set", function()
      for _, R in ipairs({ 1, 2, 3, 4 }) do
         local ss = shares(12, R, { seed = 3 })
         for epoch = 0, 2 do
            local seen = {}
            for _, s in ipairs(ss) do
               s:set_epoch(epoch)
               local idx = s:indices()
               assert.are.equal(12 / R, #idx)
               for _, i in ipairs(idx) do
                  assert.is_nil(seen[i])
                  seen[i] = true
               end
            end
            for i = 1, 12 do assert.is_true(seen[i]) end
         end
      end
   end)
   it("same seed, same split; set_epoch reshuffles; shuffle = false keeps the order", function()
      local a = S(20, { num_replicas = 2, rank = 1, seed = 9 })
      local b = S(20, { num_replicas = 2, rank = 1, seed = 9 })
      assert.are.same(a:indices(), b:indices())
      local e0 = a:indices()
      a:set_epoch(1)
      assert.are_not.same(e0, a:indices())
      local c = S(20, { num_replicas = 2, rank = 1, seed = 10 })
      assert.are_not.same(e0, c:indices())
      local d = S(7, { num_replicas = 2, rank = 1, shuffle = false })
      assert.are.same({ 2, 4, 6, 1 }, d:indices())  -- padded with the start of the order
   end)
   it("pads without drop_last, cuts with it", function()
      local ss = shares(10, 3, { shuffle = false })
      assert.are.same({ 1, 4, 7, 10 }, ss[1]:indices())
      assert.are.same({ 3, 6, 9, 2 }, ss[3]:indices())
      assert.are.equal(12, ss[1].total_size)
      local cut = shares(10, 3, { shuffle = false, drop_last = true })
      assert.are.same({ 1, 4, 7 }, cut[1]:indices())
      assert.are.same({ 3, 6, 9 }, cut[3]:indices())
   end)
   it("one replica gives a DataLoader exactly its own shuffled order", function()
      local ds = { images = lm.zeros({ 10, 4, 4 }, { dtype = lm.uint8, device = "cpu" }),
                   labels = lm.arange(1, 11, { dtype = lm.int64, device = "cpu" }) }
      local function labels(loader, epoch)
         local r = {}
         for _, y in loader:iter(epoch) do
            for i = 1, y:size(1) do r[#r + 1] = y:select(1, i):item() end
         end
         return r
      end
      local plain = lm.data.DataLoader(ds, { batch_size = 3, seed = 4, workers = 1 })
      local one = lm.data.DataLoader(ds, { batch_size = 3, seed = 4, workers = 1,
         sampler = S(ds, { num_replicas = 1, rank = 0, seed = 4 }) })
      assert.are.same(labels(plain, 2), labels(one, 2))
      local half = lm.data.DataLoader(ds, { batch_size = 3, seed = 4, workers = 1,
         sampler = S(ds, { num_replicas = 2, rank = 1, seed = 4 }) })
      assert.are.equal(2, half:num_batches())
      assert.are.equal(5, #labels(half, 2))
   end)
   it("rejects bad arguments", function()
      local function err_of(...)
         local ok, e = pcall(...)
         assert.is_false(ok)
         return tostring(e)
      end
      assert.matches("rank must be an integer in 0..1",
                     err_of(S, 5, { num_replicas = 2, rank = 2 }))
      assert.matches("num_replicas must be an integer",
                     err_of(S, 5, { num_replicas = 0, rank = 0 }))
      assert.matches("unknown option 'seeds'", err_of(S, 5, { num_replicas = 1, rank = 0,
                                                             seeds = 1 }))
      if not lm.distributed.is_initialized() then
         assert.matches("num_replicas and rank are needed", err_of(S, 5))
      end
      local ds = { images = lm.zeros({ 4, 2, 2 }, { dtype = lm.uint8 }) }
      assert.matches("the sampler is over 5 samples, the data set has 4",
                     err_of(lm.data.DataLoader, ds, { sampler = S(5, { num_replicas = 1,
                                                                       rank = 0 }) }))
      assert.matches("sampler must be a DistributedSampler",
                     err_of(lm.data.DataLoader, ds, { sampler = {} }))
   end)
end)

describe("nn.SyncBatchNorm outside a job", function()
   it("is BatchNorm2d: same output, gradients and running statistics", function()
      lm.manual_seed(5)
      local x = lm.randn({ 4, 3, 5, 5 }):to(lm.channels_last)
      local bn = nn.BatchNorm2d(3)
      local sbn = nn.SyncBatchNorm(3)
      local x1, x2 = x:clone():requires_grad_(), x:clone():requires_grad_()
      local y1, y2 = bn(x1), sbn(x2)
      assert.is_true(y1:allclose(y2, 1e-6, 1e-6))
      ;(y1 * y1):sum():backward()
      ;(y2 * y2):sum():backward()
      assert.is_true(x1.grad:allclose(x2.grad, 1e-5, 1e-5))
      assert.is_true(bn.running_var:allclose(sbn.running_var))
      assert.is_true(bn.weight.grad:allclose(sbn.weight.grad, 1e-5, 1e-5))
      -- any rank >= 2
      assert.are.same({ 6, 3 }, sbn(lm.randn({ 6, 3 })):size())
      local ok, err = pcall(sbn, lm.randn({ 3 }))
      assert.is_false(ok)
      assert.matches("SyncBatchNorm: expected at least 2D input", tostring(err))
   end)
   it("convert_sync_batchnorm swaps every batch norm, keeping its tensors", function()
      local bn = nn.BatchNorm2d(4, { momentum = 0.2, eps = 1e-3 })
      local m = nn.Sequential(nn.Conv2d(3, 4, 3), bn, nn.ReLU(),
                              nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4)))
      m:eval()
      local w, rm = bn.weight, bn.running_mean
      local out = nn.SyncBatchNorm.convert_sync_batchnorm(m)
      assert.are.equal(m, out)
      local s = m:children()[2]
      assert.are.equal("SyncBatchNorm", s:type_name())
      assert.are.equal(w, s.weight)
      assert.are.equal(rm, s.running_mean)
      assert.are.equal(0.2, s.momentum)
      assert.are.equal(1e-3, s.eps)
      assert.is_false(s.training)
      assert.are.equal("SyncBatchNorm", m:children()[4]:children()[2]:type_name())
      assert.are.equal(w, m:parameters()[3])
      local lone = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm3d(2))
      assert.are.equal("SyncBatchNorm", lone:type_name())
      local ok, err = pcall(nn.SyncBatchNorm.convert_sync_batchnorm, 3)
      assert.is_false(ok)
      assert.matches("a Module expected", tostring(err))
   end)
end)

-- a job of one process: MPI_Init without mpirun (Open MPI's singleton mode). Skipped where Open
-- MPI is not installed, and under LD_PRELOAD'ed sanitizers (make asan), which Open MPI's memory
-- hooks do not go with.
local dist = lm.distributed
local preload = os.getenv("LD_PRELOAD") or ""
local mpi_ok = not preload:find("asan", 1, true) and dist.is_available()
local describe_mpi = mpi_ok and describe or pending

describe_mpi("lm.distributed in a job of one process", function()
   setup(function()
      if not dist.is_initialized() and not dist._state.finalized then dist.init() end
   end)
   it("is rank 0 of 1; every collective gives the tensor back", function()
      if dist._state.finalized then return end
      assert.is_true(dist.is_initialized())
      assert.are.equal(0, dist.rank())
      assert.are.equal(1, dist.world_size())
      assert.are.equal("mpi", dist.get_backend())
      assert.matches("Open MPI", dist.library_version())
      dist.barrier()
      dist.barrier({ async = true }):wait()
      local t = lm.arange(0, 24):float():view(2, 3, 2, 2):to(lm.channels_last)
      assert.are.equal(t, dist.all_reduce(t, { op = "mean" }))
      assert.are.same(lm.arange(0, 24):float():view(2, 3, 2, 2):totable(), t:totable())
      assert.is_true(t:is_contiguous(lm.channels_last))
      local h = dist.all_reduce(t, { async = true })
      assert.is_true(h:is_completed())
      assert.are.equal(t, h:wait())
      assert.are.equal(t, dist.broadcast(t))
      local g = dist.all_gather(t)
      assert.are.equal(1, #g)
      assert.are.same(t:totable(), g[1]:totable())
      assert.are.same(t:stride(), g[1]:stride())
      local rs = dist.reduce_scatter(t)
      assert.are.same(t:totable(), rs:totable())
      local hf = lm.ones({ 3 }, { dtype = lm.bfloat16 })
      dist.all_reduce(hf, { op = "mean" })
      assert.are.same({ 1, 1, 1 }, hf:float():totable())
   end)
   it("checks options and dtypes", function()
      if dist._state.finalized then return end
      local function err_of(...)
         local ok, e = pcall(...)
         assert.is_false(ok)
         return tostring(e)
      end
      assert.matches("lumen%.distributed%.all_reduce: op must be",
                     err_of(dist.all_reduce, lm.ones({ 2 }), { op = "avg" }))
      assert.matches("op \"mean\" needs a floating%-point tensor, got int64",
                     err_of(dist.all_reduce, lm.ones({ 2 }):to(lm.int64), { op = "mean" }))
      assert.matches("unknown option 'roots'", err_of(dist.broadcast, lm.ones({ 2 }),
                                                      { roots = 0 }))
      assert.matches("root must be a rank in 0..0, got 1",
                     err_of(dist.broadcast, lm.ones({ 2 }), { root = 1 }))
      assert.matches("all_gather: tensor expected, got number", err_of(dist.all_gather, 3))
      assert.matches("already initialized", err_of(dist.init))
      assert.matches("a meta tensor", err_of(dist.all_reduce, lm.ones({ 2 }, { device = "meta" })))
   end)
   it("DistributedDataParallel of one process trains as the module itself", function()
      if dist._state.finalized then return end
      local function net()
         lm.manual_seed(11)
         return nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 3))
      end
      local ref, m = net(), net()
      local ddp = nn.parallel.DistributedDataParallel(m, { bucket_cap_mb = 0.0001 })
      assert.matches("^module%.", ddp:state_keys()[1])
      assert.are.equal(#m:parameters(), #ddp:parameters())
      assert.are.equal(m:parameters()[1], ddp:parameters()[1])
      local x = lm.randn({ 5, 2, 4, 4 })
      ;(ref(x) * 1):sum():backward()
      ;(ddp(x) * 1):sum():backward()
      assert.is_true(ddp.stats.started_in_backward > 0)
      local pr, pm = ref:parameters(), m:parameters()
      for i = 1, #pr do assert.is_true(pr[i].grad:allclose(pm[i].grad, 1e-6, 1e-6)) end
      -- no_sync: nothing is started
      ddp:no_sync(function() (ddp(x) * 1):sum():backward() end)
      assert.are.equal(0, ddp.stats.started_in_backward + ddp.stats.started_after_backward)
      local ok, err = pcall(nn.parallel.DistributedDataParallel, m, { bucket_cap_mb = -1 })
      assert.is_false(ok)
      assert.matches("bucket_cap_mb must be a positive number", tostring(err))
   end)
   it("finalize ends the job for this process", function()
      if dist._state.finalized then return end
      dist.finalize()
      assert.is_false(dist.is_initialized())
      local ok, err = pcall(dist.rank)
      assert.is_false(ok)
      assert.matches("was finalized", tostring(err))
      ok, err = pcall(dist.init)
      assert.is_false(ok)
      assert.matches("cannot be initialized again", tostring(err))
   end)
end)
