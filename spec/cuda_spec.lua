-- spec/cuda_spec.lua -- lm.cuda (torch.cuda's queries), lm.backends (the cuDNN / cuBLAS switches),
-- copies between the host and cuda:0 (every dtype, both memory formats, non-dense sources) and
-- the caching device allocator (kernels/cuda/alloc.cu: counters, the cache, split and merge, the
-- out-of-memory path, the collection trigger that keeps a loop flat).
--
-- Without CUDA (the normal build on a machine without a GPU) the device parts are pending and
-- the "without CUDA" part checks the errors. With the emulated build (make cuda-emu;
-- LUMEN_CUDA_LIB=build/liblumen_cuda_emu.so, as make test-cuda-emu sets it) cuda:0 exists on the
-- host, so all of it runs here; on a GPU it runs as it is (tools/gpu_check.sh).
local H = require("spec.helpers")
local lm = H.lm
local ffi = require("ffi")

local MiB = 2 ^ 20

local DTYPES = { "float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool" }

-- a CPU tensor of `sizes` and dtype name dn holding distinct values (bool: a pattern)
local function host_values(sizes, dn)
   local n = H.prod(sizes)
   local vals = {}
   for i = 1, n do
      if dn == "bool" then vals[i] = i % 3 == 0
      elseif dn == "uint8" then vals[i] = (i * 37) % 251
      else vals[i] = (i * 37) % 251 - 100 end
   end
   return lm.tensor(vals, { dtype = lm[dn], device = "cpu" }):view(sizes)
end

local function data_addr(t)
   return tonumber(ffi.cast("uintptr_t", rawget(t, "_c").storage.data))
end

describe("lm.cuda without CUDA", function()
   if lm.cuda.is_available() then
      pending("CUDA is available here")
      return
   end

   it("is_available is false and device_count 0", function()
      assert.is_false(lm.cuda.is_available())
      assert.are.equal(0, lm.cuda.device_count())
      assert.are.equal(0, lm.cuda.current_device())
   end)

   it("every query raises a clear error", function()
      local calls = {
         synchronize = {}, memory_allocated = {}, max_memory_allocated = {}, memory_reserved = {},
         memory_stats = {}, reset_peak_memory_stats = {}, empty_cache = {}, get_device_name = {},
         get_device_properties = {}, versions = {}, set_per_process_memory_fraction = { 0.5 },
      }
      for name, args in pairs(calls) do
         H.assert_error_like("cuda." .. name, "not available", lm.cuda[name], unpack(args))
      end
   end)
end)

describe("lm.backends", function()
   it("has PyTorch's switches as settable boolean fields", function()
      local cudnn, matmul = lm.backends.cudnn, lm.backends.cuda.matmul
      local saved = { cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic, matmul.allow_tf32 }
      for _, v in ipairs(saved) do assert.are.equal("boolean", type(v)) end
      if not os.getenv("LUMEN_ALLOW_TF32") then
         assert.is_true(cudnn.allow_tf32)          -- PyTorch's defaults
         assert.is_false(matmul.allow_tf32)
      end
      if not os.getenv("LUMEN_CUDNN_BENCHMARK") then assert.is_false(cudnn.benchmark) end
      cudnn.benchmark = not saved[1]
      cudnn.allow_tf32 = not saved[2]
      cudnn.deterministic = not saved[3]
      matmul.allow_tf32 = not saved[4]
      assert.are.same({ not saved[1], not saved[2], not saved[3], not saved[4] },
                      { cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic, matmul.allow_tf32 })
      cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic = saved[1], saved[2], saved[3]
      matmul.allow_tf32 = saved[4]
      assert.are.same(saved, { cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic,
                               matmul.allow_tf32 })
   end)

   it("rejects unknown settings and non-booleans", function()
      local ok, msg = pcall(function() lm.backends.cudnn.benchmark = 1 end)
      assert.is_false(ok)
      assert.is_truthy(msg:find("lumen.backends.cudnn.benchmark: expected a boolean", 1, true), msg)
      ok, msg = pcall(function() lm.backends.cudnn.bench = true end)
      assert.is_false(ok)
      assert.is_truthy(msg:find("no setting named 'bench'", 1, true), msg)
      assert.is_nil(lm.backends.cudnn.bench)
   end)
end)

describe("lm.cuda on a CUDA device", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local function stats() return lm.cuda.memory_stats(0) end

   it("answers torch.cuda's queries", function()
      assert.is_true(lm.cuda.device_count() >= 1)
      assert.are.equal(0, lm.cuda.current_device())
      local name = lm.cuda.get_device_name(0)
      assert.are.equal("string", type(name))
      assert.is_true(#name > 0)
      assert.are.equal(name, lm.cuda.get_device_name())
      assert.are.equal(name, lm.cuda.get_device_name("cuda:0"))
      local p = lm.cuda.get_device_properties(0)
      assert.are.equal(name, p.name)
      assert.is_true(p.total_memory > 0 and p.multi_processor_count >= 1)
      local v = lm.cuda.versions()
      for _, k in ipairs({ "runtime", "driver", "cudnn", "cublas" }) do
         assert.are.equal("number", type(v[k]))
      end
      if not v.emulated then
         assert.is_true(v.runtime >= 12000 and v.cudnn >= 90000 and v.cublas > 0)
      end
      lm.cuda.synchronize()
      lm.cuda.synchronize(0)
      lm.cuda.synchronize("cuda:0")
      H.assert_error_like("cuda.synchronize", "expected a CUDA device", lm.cuda.synchronize, "cpu")
      H.assert_error_like("cuda.memory_allocated", "expected a CUDA device",
                          lm.cuda.memory_allocated, -1)
      local n = lm.cuda.device_count()
      if n < 8 then
         H.assert_error_like("cuda.memory_allocated", "not available", lm.cuda.memory_allocated, n)
      end
   end)

   it("copies every dtype to cuda:0 and back, keeping the memory format", function()
      for _, dn in ipairs(DTYPES) do
         for _, case in ipairs({ { { 2, 3, 4, 5 }, lm.contiguous_format },
                                 { { 2, 3, 4, 5 }, lm.channels_last },
                                 { { 2, 3, 2, 4, 3 }, lm.channels_last_3d },
                                 { { 7 }, lm.contiguous_format } }) do
            local sizes, fmt = case[1], case[2]
            local x = host_values(sizes, dn):contiguous(fmt)
            local d = x:to("cuda:0")
            local what = dn .. " " .. tostring(fmt)
            assert.are.equal("cuda:0", d:device(), what)
            assert.are.equal(lm[dn], d:dtype(), what)
            assert.are.same(x:stride(), d:stride(), what)
            local back = d:cpu()
            assert.are.equal("cpu", back:device(), what)
            assert.are.same(x:stride(), back:stride(), what)
            assert.are.same(x:totable(), back:totable(), what)
            assert.are.same(x:totable(), d:totable(), what)   -- totable reads the device itself
            -- t:cuda() is t:to("cuda:0")
            assert.are.same(x:stride(), x:cuda():stride(), what)
         end
      end
   end)

   it("copies large tensors through the pinned staging buffers both ways", function()
      -- 9 MiB: three chunks of the 4 MiB double buffer, the last one short
      local n = 9 * MiB / 4 + 5
      local x = lm.rand({ n }, { device = "cpu" })
      local d = x:to("cuda:0")
      local back = d:cpu()
      assert.is_true(back:equal(x))
      -- channels-last, large
      local y = lm.rand({ 4, 64, 48, 40 }, { device = "cpu" }):contiguous(lm.channels_last)
      local yb = y:cuda():cpu()
      assert.is_true(yb:is_contiguous(lm.channels_last))
      assert.is_true(yb:equal(y))
   end)

   it("copies non-dense tensors to cuda:0 and back", function()
      local base = host_values({ 4, 6, 5 }, "float32")
      local views = {
         base:transpose(1, 3),                  -- permuted
         base:narrow(2, 2, 3),                  -- a gap between rows
         base:select(3, 2),                     -- strided
         base:narrow(1, 1, 1):expand(3, 6, 5),  -- stride 0
      }
      for i, v in ipairs(views) do
         local d = v:to("cuda:0")
         assert.are.equal("cuda:0", d:device())
         assert.are.same(v:totable(), d:cpu():totable(), "view " .. i)
      end
      -- and into a non-dense destination on the device, and out of a non-dense device view
      local dst = lm.zeros({ 4, 6, 5 }, { device = "cpu" }):to("cuda:0")
      dst:narrow(2, 2, 3):copy_(base:narrow(2, 2, 3))
      local expect = lm.zeros({ 4, 6, 5 }, { device = "cpu" })
      expect:narrow(2, 2, 3):copy_(base:narrow(2, 2, 3))
      assert.are.same(expect:totable(), dst:cpu():totable())
      assert.are.same(base:transpose(1, 2):totable(),
                      base:to("cuda:0"):transpose(1, 2):cpu():totable())
   end)

   it("copies between cuda:0 and the sim test device through the host", function()
      local x = host_values({ 2, 3, 4, 5 }, "float32"):contiguous(lm.channels_last)
      local s = x:to("sim:0"):to("cuda:0")
      assert.are.equal("cuda:0", s:device())
      assert.are.same(x:stride(), s:stride())
      local back = s:to("sim:1")
      assert.are.same(x:stride(), back:stride())
      assert.are.same(x:totable(), back:totable())
      assert.are.same(x:narrow(2, 2, 2):totable(),
                      x:to("sim:0"):narrow(2, 2, 2):to("cuda:0"):cpu():totable())
   end)

   -- run code in a fresh LuaJIT (this run's paths and libraries, the default device cpu) with
   -- the environment variables env ("NAME=value ..."); it must write "ok"
   local function run_fresh(env, code)
      local sh = require("spec.shell")
      local lib = os.getenv("LUMEN_CUDA_LIB")
      env = env .. " LUMEN_DEFAULT_DEVICE= "
         .. (lib and ("LUMEN_CUDA_LIB=" .. sh.q(lib) .. " ") or "")
      local full = "package.path = " .. ("%q"):format(package.path) .. "; " ..
         "package.cpath = " .. ("%q"):format(package.cpath) .. "; " ..
         "local lm = require('lumen'); " .. code
      local luajit = os.getenv("LUAJIT") or "luajit"
      local out, rc = sh.sh(env .. sh.q(luajit) .. " -e " .. sh.q(full))
      assert.are.equal(0, rc, out)
      assert.are.equal("ok", out)
   end

   -- run code with two GPUs (two emulated ones in the emulated build); false when there are not
   local function on_two_gpus(code)
      if not lm.cuda.versions().emulated and lm.cuda.device_count() < 2 then return false end
      run_fresh("LUMEN_CUDA_EMU_DEVICES=2", "assert(lm.cuda.device_count() == 2, "
                .. "'device_count ' .. lm.cuda.device_count()); " .. code)
      return true
   end

   it("copies between two GPUs (two emulated ones here)", function()
      on_two_gpus([[
         local x = lm.rand({ 2, 3, 4, 5 }, { device = "cpu" }):contiguous(lm.channels_last)
         local a = x:to("cuda:0")
         local b = a:to("cuda:1")
         assert(b:device() == "cuda:1")
         assert(b:is_contiguous(lm.channels_last))
         assert(b:cpu():equal(x))
         assert(a:narrow(2, 2, 2):to("cuda:1"):cpu():equal(x:narrow(2, 2, 2)))
         local big = lm.rand({ 3 * 2 ^ 20 }, { device = "cpu" })
         assert(big:to("cuda:1"):to("cuda:0"):cpu():equal(big))
         assert(lm.cuda.memory_allocated(1) > 0)
         io.write("ok")
      ]])
   end)

   it("lm.comm broadcasts and sums across GPUs with NCCL (emulated: on the host)", function()
      on_two_gpus([[
         local comm = lm.comm
         local x = lm.rand({ 2, 3, 4, 5 }, { device = "cpu" }):contiguous(lm.channels_last)
         local a = x:to("cuda:0")
         local calls = comm._nccl_calls
         local out = comm.broadcast(a, { "cuda:1", "cuda:0" })
         assert(comm._nccl_calls == calls + 1, "broadcast did not use NCCL")
         assert(out[2] == a and out[1]:device() == "cuda:1")
         assert(out[1]:is_contiguous(lm.channels_last))
         assert(out[1]:cpu():equal(x))
         for _, dn in ipairs({ "float32", "float64", "float16", "bfloat16", "int64", "int32",
                               "uint8", "bool" }) do
            local t = (x * 10):to(lm[dn]):to("cuda:0")
            local o = comm.broadcast(t, { "cuda:0", "cuda:1" })
            assert(o[2]:cpu():equal(t:cpu()), dn)
         end
         -- sums
         local y = lm.rand({ 2, 3, 4, 5 }, { device = "cpu" }):contiguous(lm.channels_last)
         calls = comm._nccl_calls
         local s = comm.reduce_add({ x:to("cuda:0"), y:to("cuda:1") }, "cuda:1")
         assert(comm._nccl_calls == calls + 1, "reduce_add did not use NCCL")
         assert(s:device() == "cuda:1" and s:is_contiguous(lm.channels_last))
         assert(s:cpu():allclose(x + y, 1e-6, 1e-6))
         local i = comm.reduce_add({ lm.arange(6):to("cuda:1"), lm.arange(6):to("cuda:0") },
                                   "cuda:0")
         assert(i:dtype() == lm.int64)
         assert(i:cpu():equal(lm.arange(6, { device = "cpu" }) * 2))
         -- the copying path where NCCL does not apply: autograd, layouts that differ, a CPU
         -- destination, bool
         calls = comm._nccl_calls
         local g = x:to("cuda:0")
         g.requires_grad = true
         local gb = comm.broadcast(g, { "cuda:0", "cuda:1" })
         gb[2]:sum():backward()
         assert(g.grad ~= nil)
         local mixed = comm.reduce_add({ x:to("cuda:0"), y:contiguous():to("cuda:1") }, "cuda:1")
         assert(mixed:cpu():allclose(x + y, 1e-6, 1e-6))
         local host = comm.reduce_add({ x:to("cuda:0"), y:to("cuda:1") }, "cpu")
         assert(host:allclose(x + y, 1e-6, 1e-6))
         local bools = comm.reduce_add({ (x:gt(0.5)):to("cuda:0"), (y:gt(0.5)):to("cuda:1") },
                                       "cuda:0")
         assert(bools:cpu():equal(x:gt(0.5):logical_or(y:gt(0.5))))
         assert(comm._nccl_calls == calls, "NCCL used where it must not be")
         io.write("ok")
      ]])
   end)

   it("counts live bytes, keeps freed blocks cached, and empty_cache releases them", function()
      lm.cuda.empty_cache()
      local s0 = stats()
      local x = lm.empty({ 48 * MiB / 4 }, { device = "cuda:0" })   -- its own 48 MiB segment
      assert.are.equal("cuda:0", x:device())
      local s1 = stats()
      assert.are.equal(s0["allocated_bytes.all.current"] + 48 * MiB,
                       s1["allocated_bytes.all.current"])
      assert.are.equal(lm.cuda.memory_allocated(), s1["allocated_bytes.all.current"])
      assert.are.equal(s0.num_device_alloc + 1, s1.num_device_alloc)
      assert.are.equal(s0["reserved_bytes.all.current"] + 48 * MiB, lm.cuda.memory_reserved())
      assert.is_true(lm.cuda.max_memory_allocated() >= lm.cuda.memory_allocated())
      x = nil   -- luacheck: ignore 311
      lm.memory.collect()
      assert.are.equal(s0["allocated_bytes.all.current"], lm.cuda.memory_allocated())
      assert.are.equal(s1["reserved_bytes.all.current"], lm.cuda.memory_reserved())  -- cached
      -- the peak stays until reset
      assert.is_true(lm.cuda.max_memory_allocated() >= s1["allocated_bytes.all.current"])
      lm.cuda.reset_peak_memory_stats()
      assert.are.equal(lm.cuda.memory_allocated(), lm.cuda.max_memory_allocated())
      -- a block of the same size comes from the cache
      local y = lm.empty({ 48 * MiB / 4 }, { device = "cuda:0" })
      assert.are.equal(s1.num_device_alloc, stats().num_device_alloc)
      assert.are.equal("cuda:0", y:device())
      y = nil   -- luacheck: ignore 311
      lm.cuda.empty_cache()
      local s2 = stats()
      assert.are.equal(s0["reserved_bytes.all.current"], s2["reserved_bytes.all.current"])
      assert.are.equal(s1.num_device_free + 1, s2.num_device_free)
   end)

   it("splits a cached block for smaller requests and merges the pieces back", function()
      lm.cuda.empty_cache()
      local big = lm.empty({ 24 * MiB / 4 }, { device = "cuda:0" })
      local s1 = stats()
      local at = data_addr(big)
      big = nil   -- luacheck: ignore 311
      lm.memory.collect()
      -- three 6 MiB requests: best fit is the free 24 MiB block, split each time
      local parts = {}
      for i = 1, 3 do parts[i] = lm.empty({ 6 * MiB / 4 }, { device = "cuda:0" }) end
      local s2 = stats()
      assert.are.equal(s1.num_device_alloc, s2.num_device_alloc)
      assert.are.equal(s1["reserved_bytes.all.current"], s2["reserved_bytes.all.current"])
      assert.are.equal(s1["allocated_bytes.all.current"] - 6 * MiB,
                       s2["allocated_bytes.all.current"])
      for i = 1, 3 do assert.are.equal(at + (i - 1) * 6 * MiB, data_addr(parts[i])) end
      -- freed, they merge with the free remainder: 24 MiB fits again without a cudaMalloc
      parts = nil   -- luacheck: ignore 311
      lm.memory.collect()
      local again = lm.empty({ 24 * MiB / 4 }, { device = "cuda:0" })
      assert.are.equal(at, data_addr(again))
      assert.are.equal(s1.num_device_alloc, stats().num_device_alloc)
      -- small requests share 2 MiB segments
      local smalls = {}
      for i = 1, 16 do smalls[i] = lm.empty({ 256 }, { device = "cuda:0" }) end
      assert.is_true(stats().num_device_alloc <= s1.num_device_alloc + 1)
      assert.are.equal(16, #smalls)
      assert.are.equal("cuda:0", again:device())
   end)

   it("releases the cache and retries when the device is full, then says out of memory", function()
      lm.cuda.empty_cache()
      local total = lm.cuda.get_device_properties(0).total_memory
      -- a 30 MiB segment cached
      local c = lm.empty({ 30 * MiB / 4 }, { device = "cuda:0" })
      assert.are.equal("cuda:0", c:device())
      c = nil   -- luacheck: ignore 311
      lm.memory.collect()
      local s0 = stats()
      local reserved = s0["reserved_bytes.all.current"]
      lm.cuda.set_per_process_memory_fraction((reserved + 20 * MiB) / total)
      local ok, err = pcall(function()
         -- 40 MiB: over the cap until the cached 30 MiB are released; then it fits
         local t = lm.empty({ 40 * MiB / 4 }, { device = "cuda:0" })
         local s1 = stats()
         assert.are.equal(s0.num_alloc_retries + 1, s1.num_alloc_retries)
         assert.is_true(s1.num_device_free >= s0.num_device_free + 1)
         assert.are.equal(s0.num_ooms, s1.num_ooms)
         -- 64 MiB more: out of memory, with the numbers
         local msg = H.assert_error_like("empty", "out of memory", lm.empty, { 64 * MiB / 4 },
                                         { device = "cuda:0" })
         assert.is_truthy(msg:find("cuda:0: out of memory: tried to allocate 64.00 MiB; ", 1, true),
                          msg)
         assert.is_truthy(msg:find("MiB live, ", 1, true) and msg:find("MiB cached", 1, true), msg)
         assert.are.equal(s0.num_ooms + 1, stats().num_ooms)
         assert.are.equal("cuda:0", t:device())
      end)
      lm.cuda.set_per_process_memory_fraction(1)
      assert(ok, err)
      local t = lm.empty({ 64 * MiB / 4 }, { device = "cuda:0" })
      assert.are.equal("cuda:0", t:device())
      H.assert_error_like("cuda.set_per_process_memory_fraction", "fraction",
                          lm.cuda.set_per_process_memory_fraction, 0)
      H.assert_error_like("cuda.set_per_process_memory_fraction", "fraction",
                          lm.cuda.set_per_process_memory_fraction, 1.5)
   end)

   it("asks Lua for a collection, so a loop of dropped tensors stays flat", function()
      assert.is_true(stats().collection_growth_limit >= 64 * MiB)
      -- a fresh process with a 128 MiB limit (LUMEN_CUDA_SOFT_LIMIT), the same on a GPU
      run_fresh("LUMEN_CUDA_SOFT_LIMIT=" .. 128 * MiB, [[
         local MiB = 2 ^ 20
         local limit = lm.cuda.memory_stats().collection_growth_limit
         assert(limit == 128 * MiB, "limit " .. limit)
         lm.memory.collect()
         local start, reserved = lm.cuda.memory_allocated(), lm.cuda.memory_reserved()
         lm.cuda.reset_peak_memory_stats()
         local block = 8 * MiB
         for _ = 1, 3 * limit / block do       -- three times the limit in all
            local t = lm.empty({ block / 4 }, { device = "cuda:0" })
            assert(t)
         end
         local peak = lm.cuda.max_memory_allocated()
         assert(peak <= start + limit + 2 * block,
                string.format("peak %d, start %d, limit %d", peak, start, limit))
         -- the cache serves the loop: about the limit's worth of segments, not the loop's
         assert(lm.cuda.memory_reserved() - reserved <= 2 * limit)
         io.write("ok")
      ]])
   end)

   it("keeps a small training loop flat", function()
      -- needs the elementwise, matmul, reduction and optimizer kernels on cuda:0
      local ok = pcall(function()
         local a = lm.ones({ 2, 2 }, { device = "cuda:0" })
         return (a:matmul(a) + 1):sum():item()
      end)
      if not ok then
         pending("the kernels a training loop needs are not all on cuda:0 yet")
         return
      end
      local model = lm.nn.Linear(64, 32):to("cuda:0")
      local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
      local x = lm.randn({ 256, 64 }, { device = "cpu" }):to("cuda:0")
      local y = lm.randn({ 256, 32 }, { device = "cpu" }):to("cuda:0")
      local function step()
         opt:zero_grad()
         local loss = lm.F.mse_loss(model(x), y)
         loss:backward()
         opt:step()
      end
      for _ = 1, 5 do step() end
      lm.memory.collect()
      local after5 = lm.cuda.memory_allocated()
      for _ = 1, 50 do step() end
      lm.memory.collect()
      assert.are.equal(after5, lm.cuda.memory_allocated())
   end)
end)
