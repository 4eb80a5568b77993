-- Tensor methods composed from differentiable ops (lua/lumen/autograd/composed.lua): var / std,
-- masked_fill, chunk / split. Values against PyTorch 2.15 (read off torch for the input
-- sin(0.37 i + 0.1) of sizes 2 x 3 x 4, float64), gradients by finite differences, formats,
-- views, bad input. Under LUMEN_TEST_DEVICE the same run there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local function input(fmt)
   local x = (lm.arange(0, 24):double() * 0.37 + 0.1):sin():view({ 2, 3, 4 })
   if DEV then x = x:to(DEV) end
   return x
end
local function vals(t) return t:cpu():contiguous():view(-1):totable() end
local function close(t, exp, tol)
   local got = vals(t)
   assert.are.equal(#exp, #got)
   for i = 1, #exp do
      assert.is_true(math.abs(got[i] - exp[i]) <= (tol or 1e-11),
                     ("[%d] %.12g, PyTorch %.12g"):format(i, got[i], exp[i]))
   end
end

describe("var / std", function()
   it("values as torch.var / torch.std (dims, keepdim, unbiased, correction)", function()
      local x = input()
      close(x:var(), { 0.501681212925 })
      close(x:var(2), { 0.275686693376, 0.373763181405, 0.607804197116, 0.855391572198,
                        0.943308071595, 0.983638827645, 0.840930797863, 0.589829255668 })
      close(x:var({ 1, 3 }), { 0.638234855708, 0.183630621448, 0.571653227531 })
      close(x:var(3, false), { 0.09959869261, 0.047696941073, 0.12429704212, 0.025517614529,
                               0.143227970251, 0.010457635462 })
      local v = x:var(2, { correction = 2, keepdim = true })
      assert.is_true(H.list_equal({ 2, 1, 4 }, v:size()))
      close(v, { 0.551373386751, 0.747526362811, 1.215608394232, 1.710783144396, 1.886616143191,
                 1.967277655291, 1.681861595726, 1.179658511336 })
      close(x:std(), { 0.708294580613 })
      close(x:std(-1), { 0.364414951413, 0.252182317838, 0.407098746613, 0.184454563615,
                         0.437001861553, 0.118082657274 })
      close(x:std({ 1, 2 }, nil, true), { 0.749309727318, 0.757904750708, 0.763523497738,
                                          0.763308073494 })
      -- one value: N - correction is 0, NaN as PyTorch
      local one = lm.ones({ 1 }, { dtype = lm.float64 })
      if DEV then one = one:to(DEV) end
      assert.is_true(one:var():item() ~= one:var():item())
   end)

   it("gradients: finite differences, and zero where std is zero (PyTorch's)", function()
      local x = G.input({ 2, 3, 4 }, nil, 71)
      if DEV then x = x:detach():to(DEV):requires_grad_(true) end
      assert.is_true(G.check(function(a) return a:var({ 1, 3 }) end, { x }))
      assert.is_true(G.check(function(a) return a:std(2, { correction = 0 }, true) end, { x }))
      assert.is_true(G.check(function(a) return a:std() end, { x }))
      local c = lm.ones({ 3, 2 }, { dtype = lm.float64 })
      if DEV then c = c:to(DEV) end
      c:requires_grad_(true)
      local s = c:std(1)
      s:sum():backward()
      close(s, { 0, 0 })
      close(c.grad, { 0, 0, 0, 0, 0, 0 })
   end)

   it("float32 and channels-last input", function()
      local x = lm.randn({ 2, 3, 4, 5 }):contiguous(lm.channels_last)
      if DEV then x = x:to(DEV) end
      local v = x:var({ 3, 4 }, nil, true)
      assert.is_true(H.list_equal({ 2, 3, 1, 1 }, v:size()))
      assert.is_true(H.rel_diff(v, x:double():var({ 3, 4 }, nil, true)) < 1e-6)
   end)

   it("bad input names the function", function()
      local x = input()
      H.assert_error_like("var", "floating point", function() return lm.ones({ 3 }, {
         dtype = lm.int64 }):var() end)
      H.assert_error_like("var", "unknown option", function() return x:var(1, { ddof = 1 }) end)
      H.assert_error_like("std", "out of range", function() return x:std(4) end)
      H.assert_error_like("std", "unbiased", function() return x:std(1, "yes") end)
   end)
end)

describe("masked_fill", function()
   it("value where the mask is true, broadcast mask, self's format and dtype", function()
      local x = input()
      local m = x:masked_fill(x:gt(0.5), -1)
      local xv, mv = vals(x), vals(m)
      for i = 1, #xv do assert.are.equal(xv[i] > 0.5 and -1 or xv[i], mv[i]) end
      -- a mask of one row broadcast over the others
      local row = lm.tensor({ true, false, true, false }, { dtype = lm.bool })
      if DEV then row = row:to(DEV) end
      local b = x:masked_fill(row, 0)
      local bv = vals(b)
      for i = 1, #bv do
         assert.are.equal(((i - 1) % 4) % 2 == 0 and 0 or xv[i], bv[i])
      end
      local cl = lm.randn({ 2, 3, 4, 4 }):contiguous(lm.channels_last)
      if DEV then cl = cl:to(DEV) end
      local y = cl:masked_fill(cl:gt(0), lm.tensor(2.5))
      assert.is_true(y:is_contiguous(lm.channels_last), "channels-last kept")
      assert.are.equal(cl:dtype(), y:dtype())
   end)

   it("the gradient flows where the mask is false", function()
      local x = G.input({ 2, 3, 4 }, nil, 72)
      if DEV then x = x:detach():to(DEV):requires_grad_(true) end
      local mask = x:detach():gt(0)
      assert.is_true(G.check(function(a) return a:masked_fill(mask, 3) end, { x }))
   end)

   it("bad input", function()
      local x = input()
      H.assert_error_like("masked_fill", "bool", function() return x:masked_fill(x, 1) end)
      H.assert_error_like("masked_fill", "value", function() return x:masked_fill(x:gt(0), "a") end)
   end)
end)

describe("chunk / split", function()
   it("views as torch.chunk / torch.split", function()
      local x = lm.arange(0, 7):double()
      if DEV then x = x:to(DEV) end
      local c = x:chunk(3)
      assert.are.equal(3, #c)
      close(c[1], { 0, 1, 2 })
      close(c[3], { 6 })
      local c5 = lm.arange(0, 5):double():chunk(3)          -- torch: sizes 2, 2, 1
      assert.are.equal(3, #c5)
      assert.are.equal(1, c5[3]:numel())
      local s = x:split(3)
      assert.are.equal(3, #s)
      close(s[3], { 6 })
      local l = x:split({ 2, 0, 5 })
      assert.are.equal(3, #l)
      close(l[3], { 2, 3, 4, 5, 6 })
      assert.is_true(l[3]:is_same_storage(x), "a view")
      local y = input()
      local parts = y:chunk(2, -1)
      assert.is_true(H.list_equal({ 2, 3, 2 }, parts[2]:size()))
   end)

   it("gradients through the pieces", function()
      local x = G.input({ 2, 5 }, nil, 73)
      if DEV then x = x:detach():to(DEV):requires_grad_(true) end
      assert.is_true(G.check(function(a)
         local p = a:split({ 2, 3 }, 2)
         return p[1]:sum() * 2 + p[2]:sum() * 3
      end, { x }))
   end)

   it("bad input", function()
      local x = input()
      H.assert_error_like("chunk", "positive integer", function() return x:chunk(0) end)
      H.assert_error_like("split", "sum to", function() return x:split({ 1, 2 }) end)
      H.assert_error_like("split", "out of range", function() return x:split(1, 5) end)
   end)
end)

describe("in a traced model", function()
   it("lm.jit.trace replays them; ONNX export names the one it cannot write", function()
      local M = lm.nn.Module:extend("Composed")
      function M:forward(x)
         local p = x:chunk(2, 2)
         return p[1]:var(2, nil, true) + p[2]:std(2, nil, true)
            + x:masked_fill(x:gt(0), 0):sum(2, true) + x:split({ 1, 3 }, 2)[2]:mean(2, true)
      end
      local m = M()
      local x = lm.randn({ 2, 4, 3 })
      if DEV then x = x:to(DEV) end
      local tr = lm.jit.trace(m, x)
      local x2 = lm.randn({ 2, 4, 3 })
      if DEV then x2 = x2:to(DEV) end
      assert.is_true(H.rel_diff(tr(x2), m(x2)) < 1e-6)
      local path = os.tmpname()
      os.remove(path)
      local ok, e = pcall(lm.onnx.export, m, x:cpu(), path, { opset = 17 })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("has no ONNX export", 1, true), tostring(e))
      assert.is_nil(io.open(path, "rb"))
   end)
end)
