-- spec/devices_spec.lua -- device strings ("cpu", "cuda:N", "meta", "sim:N"), t:to / t:cpu /
-- t:cuda, the factories' default device (lm.set_default_device, LUMEN_DEFAULT_DEVICE), meta
-- tensors (no data: printing and value errors), copies between cpu, sim:0 and sim:1 (values,
-- memory format, requires_grad, gradients through to()) and m:to(device) on modules.
-- sim:k is the test device of kernels/sim/: memory the host must not dereference.
local H = require("spec.helpers")
local lm = H.lm

-- run f with the default device set to dev, then put the old one back
local function with_default(dev, f)
   local old = lm.get_default_device()
   lm.set_default_device(dev)
   local ok, err = pcall(f)
   lm.set_default_device(old)
   if not ok then error(err, 0) end
end

local function cl_batch()
   return lm.rand({ 2, 3, 4, 5 }, { device = "cpu" }):to(lm.channels_last)
end

describe("device strings", function()
   it("t:device() names the device a tensor is on", function()
      assert.are.equal("cpu", lm.zeros({ 2 }, { device = "cpu" }):device())
      assert.are.equal("meta", lm.empty({ 2 }, { device = "meta" }):device())
      assert.are.equal("sim:0", lm.empty({ 2 }, { device = "sim" }):device())
      for k = 0, 3 do
         assert.are.equal("sim:" .. k, lm.empty({ 2 }, { device = "sim:" .. k }):device())
      end
   end)

   it("rejects unknown devices, naming the function", function()
      local bads = { "gpu", "sim:4", "sim:-1", "cuda:8", "cpu:0", "meta:0", "", "SIM:0" }
      for _, bad in ipairs(bads) do
         local msg = H.assert_error("zeros", lm.zeros, { 2 }, { device = bad })
         assert.is_truthy(msg:find("unknown device '" .. bad .. "'", 1, true), msg)
         H.assert_error_like("to", "unknown device", function() return lm.zeros({ 2 }):to(bad) end)
      end
      H.assert_error_like("zeros", "unknown device", lm.zeros, { 2 }, { device = 3 })
      H.assert_error_like("set_default_device", "unknown device 'gpu'", lm.set_default_device,
                          "gpu")
   end)

   it("t:cuda() is a clear error in a build without CUDA", function()
      if lm.cuda.is_available() then return end
      assert.are.equal(0, lm.cuda.device_count())
      local t = lm.zeros({ 2 }, { device = "cpu" })
      H.assert_error_like("cuda", "not available", function() return t:cuda() end)
      H.assert_error_like("cuda", "not available", function() return t:cuda(1) end)
      H.assert_error_like("cuda", "non-negative integer", function() return t:cuda(-1) end)
      H.assert_error_like("to", "cuda:0", function() return t:to("cuda:0") end)
   end)
end)

describe("the default device", function()
   it("starts as cpu, or what LUMEN_DEFAULT_DEVICE says", function()
      local env = os.getenv("LUMEN_DEFAULT_DEVICE")
      local expect = (env and env ~= "") and env or "cpu"
      if expect == "sim" then expect = "sim:0" end
      assert.are.equal(expect, lm.get_default_device())
   end)

   it("is where the factories put their tensors when opts.device is nil", function()
      with_default("sim:1", function()
         assert.are.equal("sim:1", lm.get_default_device())
         assert.are.equal("sim:1", lm.empty({ 2, 3 }):device())
         assert.are.equal("sim:1", lm.empty_strided({ 2, 3 }, { 1, 2 }):device())
         assert.are.equal("sim:1", lm.zeros({ 2 }):device())
         assert.are.equal("sim:1", lm.ones({ 2 }):device())
         assert.are.equal("sim:1", lm.full({ 2 }, 7):device())
         assert.are.equal("sim:1", lm.rand({ 2 }):device())
         assert.are.equal("sim:1", lm.randn({ 2 }):device())
         assert.are.equal("sim:1", lm.randint(0, 5, { 2 }):device())
         assert.are.equal("sim:1", lm.arange(4):device())
         assert.are.equal("sim:1", lm.tensor({ 1, 2 }):device())
         assert.are.equal("sim:1", lm.randperm(4):device())
         assert.are.equal("cpu", lm.zeros({ 2 }, { device = "cpu" }):device())
         -- values are right there
         assert.are.same({ 7, 7 }, lm.full({ 2 }, 7):totable())
         assert.are.same({ 0, 1, 2, 3 }, lm.arange(4):totable())
         assert.are.same({ 1, 2 }, lm.tensor({ 1, 2 }):totable())
         -- *_like keep their source's device
         local c = lm.zeros({ 2 }, { device = "cpu" })
         assert.are.equal("cpu", lm.zeros_like(c):device())
         assert.are.equal("cpu", lm.empty_like(c):device())
         assert.are.equal("cpu", lm.tensor(c):device())
         assert.are.equal("sim:0", lm.zeros_like(c, { device = "sim:0" }):device())
         -- modules made now get their parameters there (as torch.set_default_device)
         assert.are.equal("sim:1", lm.nn.Linear(2, 3).weight:device())
      end)
      with_default("sim", function() assert.are.equal("sim:0", lm.get_default_device()) end)
      with_default(nil, function() assert.are.equal("cpu", lm.get_default_device()) end)
   end)

   it("is read from LUMEN_DEFAULT_DEVICE when lumen loads", function()
      local sh = require("spec.shell")
      -- a fresh LuaJIT with this run's package.path (in-tree or installed) and LUMEN_LIB
      local code = "package.path = " .. ("%q"):format(package.path) .. "; " ..
         "package.cpath = " .. ("%q"):format(package.cpath) .. "; " ..
         "local lm = require('lumen'); io.write(lm.get_default_device(), ' ', " ..
         "lm.zeros({1}):device())"
      local luajit = os.getenv("LUAJIT") or "luajit"
      local out, rc = sh.sh("LUMEN_DEFAULT_DEVICE=sim:2 " .. sh.q(luajit) .. " -e " .. sh.q(code))
      assert.are.equal(0, rc, out)
      assert.are.equal("sim:2 sim:2", out)
      local bad, rc2 = sh.sh("LUMEN_DEFAULT_DEVICE=gpu " .. sh.q(luajit) .. " -e " .. sh.q(code))
      assert.are_not.equal(0, rc2)
      assert.is_truthy(bad:find("LUMEN_DEFAULT_DEVICE: unknown device 'gpu'", 1, true), bad)
   end)
end)

describe("copies between devices", function()
   it("cpu -> sim:0 -> sim:1 -> cpu keeps values and the memory format", function()
      local x = cl_batch()
      local s0 = x:to("sim:0")
      assert.are.equal("sim:0", s0:device())
      assert.is_true(s0:is_contiguous(lm.channels_last))
      assert.are.same(x:stride(), s0:stride())
      local s1 = s0:to("sim:1")
      assert.are.equal("sim:1", s1:device())
      assert.are.same(x:stride(), s1:stride())
      local back = s1:cpu()
      assert.are.equal("cpu", back:device())
      assert.are.same(x:stride(), back:stride())
      assert.is_true(back:equal(x))
      assert.are.same(x:totable(), s1:totable())     -- totable copies to the host itself
      -- opts form, a dtype change on the way, and t:to(other)
      local d = x:to({ device = "sim:1", dtype = lm.float64 })
      assert.are.equal("sim:1", d:device())
      assert.are.equal(lm.float64, d:dtype())
      assert.are.same(x:stride(), d:stride())
      assert.are.equal("sim:1", x:to(s1):device())
      -- same device: no copy; copy = true forces one
      assert.are.equal(s0, s0:to("sim:0"))
      assert.are_not.equal(s0, s0:to("sim:0", { copy = true }))
      assert.are.equal(x, x:cpu())
      -- a non-dense source gets dense strides in its own format (preserve)
      local v = x:narrow(2, 1, 2):to("sim:0")
      assert.is_true(v:is_contiguous(lm.channels_last))
      assert.is_true(v:cpu():equal(x:narrow(2, 1, 2)))
      -- an explicit format converts on the way
      local c = x:to("sim:0", lm.contiguous_format)
      assert.is_true(c:is_contiguous())
      assert.is_true(c:cpu():equal(x))
   end)

   it("keeps requires_grad semantics, and gradients flow back through to()", function()
      local x = cl_batch():requires_grad_()
      local s = x:to("sim:0")
      assert.is_true(s.requires_grad)
      assert.is_false(s:is_leaf())
      local u = s:to("sim:1"):cpu()
      u:backward(lm.ones_like(u))
      assert.are.equal("cpu", x.grad:device())
      assert.is_true(x.grad:equal(lm.ones_like(x)))
      -- a leaf on a device gets its gradient there
      local leaf = lm.rand({ 3 }, { device = "sim:1", requires_grad = true })
      local y = leaf:cpu()
      y:backward(lm.full({ 3 }, 2, { device = "cpu" }))
      assert.are.equal("sim:1", leaf.grad:device())
      assert.are.same({ 2, 2, 2 }, leaf.grad:totable())
      -- no grad recorded for a tensor that does not require it
      assert.is_false(lm.rand({ 2 }, { device = "cpu" }):to("sim:0").requires_grad == true)
   end)

   it("prints a sim tensor's values, with its device", function()
      local t = lm.tensor({ 1.5, -2, 3 }, { device = "cpu" }):to("sim:0")
      local s = tostring(t)
      assert.is_truthy(s:find("1.5000", 1, true), s)
      assert.is_truthy(s:find("-2.0000", 1, true), s)
      assert.is_truthy(s:find("device='sim:0'", 1, true), s)
   end)
end)

describe("meta tensors", function()
   it("have sizes, strides, dtype and format, and no data", function()
      local m = lm.empty({ 2, 3, 4, 5 }, { device = "meta", memory_format = lm.channels_last })
      assert.are.equal("meta", m:device())
      assert.is_true(m:is_contiguous(lm.channels_last))
      assert.are.same({ 60, 1, 15, 3 }, m:stride())
      local c = cl_batch():to("meta")       -- from the CPU: nothing is copied
      assert.are.equal("meta", c:device())
      assert.are.same(cl_batch():stride(), c:stride())
      -- factories on meta give the layout and fill nothing
      assert.are.equal("meta", lm.zeros({ 2 }, { device = "meta" }):device())
      assert.are.equal("meta", lm.rand({ 2 }, { device = "meta" }):device())
      assert.are.equal("meta", lm.arange(5, { device = "meta" }):device())
      assert.are.same({ 3 }, lm.tensor({ 1, 2, 3 }, { device = "meta" }):size())
      assert.are.equal("meta", lm.zeros_like(m):device())
   end)

   it("raise on every value read", function()
      local m = lm.empty({ 2, 3 }, { device = "meta" })
      H.assert_error_like("item", "meta tensors have no data", function()
         return lm.empty({}, { device = "meta" }):item()
      end)
      H.assert_error_like("totable", "meta tensors have no data", function() return m:totable() end)
      H.assert_error_like("to", "meta tensor", function() return m:cpu() end)
      H.assert_error_like("to", "meta tensor", function() return m:to("sim:0") end)
      -- the factories' value checks still run
      H.assert_error_like("full", "overflow", lm.full, { 2 }, 300, { dtype = lm.uint8,
                                                                        device = "meta" })
   end)

   it("print in PyTorch's form", function()
      local s = tostring(lm.empty({ 2, 3 }, { device = "meta" }))
      assert.is_truthy(s:find("tensor(..., device='meta', size=(2, 3))", 1, true), s)
      local s1 = tostring(lm.empty({ 4 }, { device = "meta", dtype = lm.float64 }))
      assert.is_truthy(s1:find("tensor(..., device='meta', size=(4,), dtype=lumen.float64)", 1,
                               true), s1)
      local s4 = tostring(lm.empty({ 1, 2, 3, 4 }, { device = "meta",
                                                     memory_format = lm.channels_last }))
      assert.is_truthy(s4:find("channels_last", 1, true), s4)
   end)
end)

describe("Module:to(device)", function()
   it("moves parameters and buffers in place, keeping their objects and formats", function()
      local nn = lm.nn
      local m = nn.Sequential(nn.Conv2d(3, 4, 3, { device = "cpu" }),
                              nn.BatchNorm2d(4, { device = "cpu" }))
      m:to(lm.channels_last)
      local w = m[1].weight
      local wv = w:clone()
      local rm = m[2].running_mean
      w.grad = lm.ones_like(w)
      assert.are.equal(m, m:to("sim:1"))
      assert.are.equal(w, m[1].weight)                  -- same Parameter object
      assert.are.equal(rm, m[2].running_mean)
      assert.are.equal("sim:1", w:device())
      assert.are.equal("sim:1", w.grad:device())
      assert.are.equal("sim:1", rm:device())
      assert.are.equal("sim:1", m[2].num_batches_tracked:device())
      assert.is_true(w:is_contiguous(lm.channels_last))
      assert.is_true(w.requires_grad)
      assert.is_true(w:is_leaf())
      m:cpu()
      assert.are.equal("cpu", w:device())
      assert.is_true(w:equal(wv))
      assert.is_true(w:is_contiguous(lm.channels_last))
      H.assert_error_like("Module.to", "unknown device 'gpu'", function() return m:to("gpu") end)
   end)
end)
