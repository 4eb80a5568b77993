-- F.linear's activation option (F.linear(x, w, b, {act = name}), a lumen extension as
-- F.conv2d's) and lm_linear (LM_OP_LINEAR: on the CPU in float32 the bias and the activation run
-- on each GEMM tile as it is finished): values against the linear layer followed by the
-- activation op, in float32, float64 and bfloat16, 2-D, 3-D and non-dense inputs; gradients with
-- the option (the activation then runs as an op autograd differentiates); nn.Sequential(Linear,
-- activation) in evaluation with gradients off runs one kernel (LUMEN_VERBOSE) and gives the
-- training-mode values; bad options.
local lm = require("lumen")
local sh = require("spec.shell")
local F = lm.F

local H = require("spec.helpers")
local ACTS, OP = H.ACT_NAMES, H.ACT_OP

local rel_diff = H.rel_diff

local TOL = { float32 = 1e-5, float64 = 1e-12, bfloat16 = 2e-2 }

describe("F.linear with act", function()
   for _, dt in ipairs({ lm.float32, lm.float64, lm.bfloat16 }) do
      it(tostring(dt) .. ": every activation equals linear then the activation op", function()
         lm.manual_seed(21)
         for _, shape in ipairs({ { 70, 130, 90 }, { 5, 7, 6 }, { 1, 9, 20 }, { 40, 50, 1 } }) do
            local m, k, n = unpack(shape)
            local x = (lm.randn({ m, k }) * 2):to(dt)
            local w, b = lm.randn({ n, k }):to(dt), lm.randn({ n }):to(dt)
            for _, a in ipairs(ACTS) do
               local y = lm.no_grad(function() return F.linear(x, w, b, { act = a }) end)
               local r = OP[a](F.linear(x, w, b))
               assert.are.equal(dt, y:dtype())
               assert.is_true(rel_diff(y, r) < TOL[tostring(dt)],
                              ("%s %dx%dx%d: %g"):format(a, m, k, n, rel_diff(y, r)))
            end
         end
      end)
   end

   it("3-D input, no bias, a transposed (not dense) input", function()
      lm.manual_seed(22)
      local x = lm.randn({ 4, 6, 10 })
      local w = lm.randn({ 12, 10 })
      local y = lm.no_grad(function() return F.linear(x, w, nil, { act = "gelu" }) end)
      assert.are.same({ 4, 6, 12 }, y:size())
      assert.is_true(rel_diff(y, F.gelu(F.linear(x, w))) < 1e-5)
      local xt = lm.randn({ 10, 8 }):t()
      local b = lm.randn({ 12 })
      local yt = lm.no_grad(function() return F.linear(xt, w, b, { act = "silu" }) end)
      assert.is_true(rel_diff(yt, F.silu(xt:contiguous():matmul(w:t()) + b)) < 1e-5)
   end)

   it("float32 without act: x w^T + b against float64", function()
      lm.manual_seed(23)
      local x, w, b = lm.randn({ 300, 96 }), lm.randn({ 384, 96 }), lm.randn({ 384 })
      local r = x:double():matmul(w:double():t()) + b:double()
      assert.is_true(rel_diff(F.linear(x, w, b), r) < 1e-5)
   end)

   it("with gradients: the activation as an op (input, weight and bias gradients)", function()
      lm.manual_seed(24)
      local x = lm.randn({ 9, 11 }):requires_grad_(true)
      local w = lm.randn({ 7, 11 }):requires_grad_(true)
      local b = lm.randn({ 7 }):requires_grad_(true)
      local g = lm.randn({ 9, 7 })
      local y = F.linear(x, w, b, { act = "gelu" })
      assert.is_true(y.requires_grad)
      y:backward(g)
      local gx, gw, gb = x.grad:clone(), w.grad:clone(), b.grad:clone()
      x.grad, w.grad, b.grad = nil, nil, nil
      F.gelu(F.linear(x, w, b)):backward(g)
      assert.is_true(rel_diff(gx, x.grad) < 1e-6 and rel_diff(gw, w.grad) < 1e-6 and
                     rel_diff(gb, b.grad) < 1e-6)
   end)

   it("bad options: an unknown activation, an unknown key, not a table", function()
      local x, w = lm.randn({ 2, 3 }), lm.randn({ 4, 3 })
      local ok, e = pcall(F.linear, x, w, nil, { act = "swish" })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("linear", 1, true), e)
      assert.truthy(tostring(e):find("gelu_tanh", 1, true), e)
      ok, e = pcall(F.linear, x, w, nil, { activation = "relu" })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("activation", 1, true), e)
      ok = pcall(F.linear, x, w, nil, "relu")
      assert.is_false(ok)
   end)
end)

describe("nn.Sequential(Linear, activation) in evaluation with gradients off", function()
   it("gives the values of the unfused modules", function()
      lm.manual_seed(25)
      local net = lm.nn.Sequential(lm.nn.Linear(16, 64), lm.nn.GELU(), lm.nn.Linear(64, 8),
                                   lm.nn.Hardswish())
      local x = lm.randn({ 5, 16 })
      local r = net(x)
      net:eval()
      local y = lm.no_grad(function() return net(x) end)
      assert.is_true(rel_diff(y, r) < 1e-5)
   end)

   it("runs one linear kernel per (Linear, activation) and no activation op (LUMEN_VERBOSE)",
      function()
      if lm.get_default_device() ~= "cpu" then
         pending("the CPU's kernels")
         return
      end
      local out = sh.luajit([[
local lm = require("lumen")
local net = lm.nn.Sequential(lm.nn.Linear(16, 64), lm.nn.GELU(), lm.nn.Linear(64, 8))
net:eval()
lm.no_grad(function() return net(lm.randn({ 5, 16 })) end)
]], "LUMEN_VERBOSE=1")
      local n = 0
      for _ in out:gmatch("lumen_verbose,exec,cpu,linear,") do n = n + 1 end
      assert.are.equal(2, n, out)
      assert.is_nil(out:find("lumen_verbose,exec,cpu,unary,", 1, true), out)
      assert.is_nil(out:find("lumen_verbose,exec,cpu,binary,", 1, true), out)
   end)
end)
