-- spec/dataparallel_spec.lua -- lm.nn.DataParallel (torch.nn.DataParallel in one process): a small
-- channels-last conv net over {"cpu", "cpu"} and {"sim:0", "sim:1"} gives the output and the
-- parameter gradients of a single-device run (within float tolerance), keeps the output's memory
-- format, and leaves the gradients on the module's own (first) device.
local H = require("spec.helpers")
local lm = H.lm
local nn = lm.nn

local function net_on(dev)
   lm.manual_seed(7)
   local m = nn.Sequential(nn.Conv2d(3, 6, 3, { padding = 1, device = "cpu" }), nn.ReLU(),
                           nn.Conv2d(6, 4, 1, { device = "cpu" }), nn.AdaptiveAvgPool2d(2))
   m:to(lm.channels_last)
   return m:to(dev)
end

local function run(m, x)
   local y = m(x)
   local loss = (y * y):sum()
   loss:backward()
   local grads = {}
   for i, p in ipairs(m:parameters()) do grads[i] = p.grad end
   return y, grads
end

local function check(devices)
   lm.manual_seed(3)
   local x = lm.rand({ 5, 3, 6, 6 }, { device = "cpu" }):to(lm.channels_last)
   local ref_y, ref_g = run(net_on("cpu"), x)
   local m = net_on(devices[1])
   local dp = nn.DataParallel(m, devices)
   local y, g = run(dp, x:to(devices[1]))
   assert.are.equal(devices[1], y:device())
   assert.is_true(y:is_contiguous(lm.channels_last), H.describe(y))
   assert.are.same(ref_y:size(), y:size())
   assert.is_true(y:cpu():allclose(ref_y, 1e-5, 1e-5))
   assert.are.equal(#ref_g, #g)
   for i = 1, #g do
      assert.are.equal(devices[1], g[i]:device())
      assert.is_true(g[i]:cpu():allclose(ref_g[i], 1e-4, 1e-5), "gradient " .. i)
   end
   -- the replicas' parameters are not the module's: those are the originals, leaves
   for _, p in ipairs(m:parameters()) do assert.is_true(p:is_leaf()) end
end

describe("lm.nn.DataParallel", function()
   it("over {cpu, cpu} equals a single-device run", function() check({ "cpu", "cpu" }) end)
   it("over {sim:0, sim:1} equals a single-device run", function()
      check({ "sim:0", "sim:1" })
   end)
   it("over three replicas on one device, batch shorter than the device list", function()
      check({ "cpu", "cpu", "cpu" })
      local m = net_on("cpu")
      local y = nn.DataParallel(m, { "cpu", "sim:0", "sim:1", "cpu", "cpu", "cpu" })(
         lm.rand({ 2, 3, 4, 4 }, { device = "cpu" }))
      assert.are.same({ 2, 4, 2, 2 }, y:size())
   end)

   it("is a module: parameters and state_dict are the wrapped module's, under module.", function()
      local m = net_on("cpu")
      local dp = nn.DataParallel(m, { "cpu", "cpu" })
      assert.are.equal(#m:parameters(), #dp:parameters())
      assert.are.equal(m:parameters()[1], dp:parameters()[1])
      assert.is_not_nil(dp:state_dict()["module.0.weight"])
   end)

   it("names the problem with bad input", function()
      local m = net_on("cpu")
      H.assert_error_like("nn.DataParallel", "unknown device 'gpu'", nn.DataParallel, m,
                          { "cpu", "gpu" })
      H.assert_error_like("nn.DataParallel", "a Module expected", nn.DataParallel, 3, { "cpu" })
      H.assert_error_like("nn.DataParallel", "non-empty", nn.DataParallel, m, {})
      local dp = nn.DataParallel(m, { "sim:0", "cpu" })
      H.assert_error_like("nn.DataParallel", "devices[1] (sim:0)", function()
         return dp(lm.rand({ 2, 3, 4, 4 }, { device = "sim:0" }))
      end)
   end)
end)
