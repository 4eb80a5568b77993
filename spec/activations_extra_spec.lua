-- F.hardtanh, F.softplus, F.selu, F.celu (and hardtanh_, celu_), their modules, F.dropout1d /
-- nn.Dropout1d, F.upsample_nearest / F.upsample_bilinear: values and gradients against PyTorch
-- 2.x float64 (spec/fixtures/nn/activations_extra.lua, gen_activations_extra.py) in float64,
-- float32 and the halves, contiguous and channels-last (the result and the gradient keep the
-- format); in-place forms; gradchecks; bad input.
local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local nn = lm.nn
local FX = dofile("spec/fixtures/nn/activations_extra.lua")

local CASES = {
   { "hardtanh", function(x) return F.hardtanh(x) end },
   { "hardtanh_m2_3", function(x) return F.hardtanh(x, -2, 3) end },
   { "softplus", function(x) return F.softplus(x) end },
   { "softplus_b2_t5", function(x) return F.softplus(x, { beta = 2, threshold = 5 }) end },
   { "selu", function(x) return F.selu(x) end },
   { "celu", function(x) return F.celu(x) end },
   { "celu_05", function(x) return F.celu(x, 0.5) end },
}
local NX = #FX.x

-- a (2, NX, 2, 3) tensor whose channel c holds x[c] everywhere, and the expected values laid out
-- the same way
local function tiled(v, dtype)
   local t = lm.tensor(v, { dtype = lm.float64 }):view(1, NX, 1, 1):expand(2, NX, 2, 3)
   return t:contiguous():to(dtype)
end

describe("hardtanh, softplus, selu, celu against PyTorch", function()
   for _, c in ipairs(CASES) do
      for _, dt in ipairs({ { lm.float64, 1e-12 }, { lm.float32, 2e-6 }, { lm.bfloat16, 2e-2 },
                            { lm.float16, 2e-3 } }) do
         for _, fmt in ipairs({ false, lm.channels_last }) do
            it(("%s %s %s"):format(c[1], tostring(dt[1]), fmt and "channels_last" or "contiguous"),
               function()
               local x = tiled(FX.x, dt[1])
               if fmt then x = x:contiguous(fmt) end
               x:requires_grad_(true)
               local y = c[2](x)
               assert.are.equal(dt[1], y:dtype())
               if fmt then
                  assert.is_true(y:is_contiguous(fmt), c[1] .. ": " .. H.describe(y))
               end
               y:sum():backward()
               if fmt then assert.is_true(x.grad:is_contiguous(fmt), c[1] .. " grad") end
               local want_y = tiled(FX[c[1]].y, lm.float64)
               local want_g = tiled(FX[c[1]].g, lm.float64)
               local ey = ((y:double() - want_y):abs() / (want_y:abs() + 1)):max():item()
               local eg = ((x.grad:double() - want_g):abs() / (want_g:abs() + 1)):max():item()
               assert.is_true(ey <= dt[2], c[1] .. " value error " .. ey)
               assert.is_true(eg <= dt[2], c[1] .. " gradient error " .. eg)
            end)
         end
      end
   end

   it("gradchecks (float64, channels_last)", function()
      for i, c in ipairs(CASES) do
         local x = G.input({ 2, 3, 2, 3 }, lm.channels_last, 20 + i, 2.5)
         G.check(c[2], { x })
      end
   end)

   it("NaN: as PyTorch, hardtanh and celu pass the gradient, softplus gives NaN", function()
      local function at_nan(f)
         local x = lm.tensor({ 0 / 0 }, { dtype = lm.float64 }):requires_grad_()
         local y = f(x)
         y:sum():backward()
         return y[1], x.grad[1]
      end
      local y, g = at_nan(F.hardtanh)
      assert.is_true(y ~= y); assert.are.equal(1, g)
      y, g = at_nan(function(x) return F.celu(x, 0.5) end)
      assert.is_true(y ~= y); assert.are.equal(1, g)
      y, g = at_nan(F.selu)
      assert.is_true(y ~= y); assert.is_true(math.abs(g - 1.0507009873554805) < 1e-15)
      y, g = at_nan(F.softplus)
      assert.is_true(y ~= y); assert.is_true(g ~= g)
   end)

   it("in place: the same values and gradients as out of place", function()
      for _, f in ipairs({ { "hardtanh", function(t, ip) return F.hardtanh(t, -0.5, 1.5, ip) end },
                           { "celu", function(t, ip) return F.celu(t, 0.7, ip) end },
                           { "selu", function(t, ip) return F.selu(t, ip) end } }) do
         local x0 = lm.randn({ 2, 3, 4, 5 }, { dtype = lm.float64 }):mul(2)
            :contiguous(lm.channels_last)
         local g = lm.randn({ 2, 3, 4, 5 }, { dtype = lm.float64 })
         local a = x0:clone():requires_grad_()
         f[2](a * 1, false):backward(g)
         local b = x0:clone():requires_grad_()
         local yb = f[2](b * 1, true)
         yb:backward(g)
         assert.is_true(yb:is_contiguous(lm.channels_last), f[1])
         H.assert_close(H.values(b.grad:contiguous()), H.values(a.grad:contiguous()), 1e-15)
      end
      local x = lm.tensor({ -3, 0.5, 3 })
      assert.are.equal(x, F.hardtanh_(x))
      H.assert_close(H.values(x), { -1, 0.5, 1 }, 0)
      assert.are.equal(x, F.celu_(x, 2))
   end)

   it("modules", function()
      local x = lm.randn({ 2, 4, 3, 3 }):contiguous(lm.channels_last)
      local cases = {
         { nn.Hardtanh(), "Hardtanh(min_val=-1.0, max_val=1.0)", F.hardtanh(x) },
         { nn.Hardtanh(-2, 2.5, true), "Hardtanh(min_val=-2.0, max_val=2.5, inplace=True)",
           F.hardtanh(x, -2, 2.5) },
         { nn.Hardtanh({ min_val = 0, max_val = 0.5 }), "Hardtanh(min_val=0.0, max_val=0.5)",
           F.hardtanh(x, 0, 0.5) },
         { nn.Softplus(), "Softplus(beta=1.0, threshold=20.0)", F.softplus(x) },
         { nn.Softplus(2, 10), "Softplus(beta=2.0, threshold=10.0)", F.softplus(x, 2, 10) },
         { nn.SELU(), "SELU()", F.selu(x) },
         { nn.SELU(true), "SELU(inplace=True)", F.selu(x) },
         { nn.CELU(), "CELU(alpha=1.0)", F.celu(x) },
         { nn.CELU({ alpha = 0.5 }), "CELU(alpha=0.5)", F.celu(x, 0.5) },
      }
      for _, m in ipairs(cases) do
         assert.are.equal(m[2], tostring(m[1]))
         local y = m[1](x:clone())
         assert.is_true(y:is_contiguous(lm.channels_last), m[2])
         assert.are.equal(0, (y - m[3]):abs():max():item(), m[2])
      end
   end)

   it("bad input", function()
      local x = lm.randn({ 2, 3 })
      for _, name in ipairs({ "hardtanh", "softplus", "selu", "celu" }) do
         H.assert_error_like(name, "tensor expected", F[name], nil)
         H.assert_error_like(name, "floating", F[name], lm.tensor({ 1, 2 }, { dtype = lm.int64 }))
      end
      H.assert_error_like("hardtanh", "min_val cannot be greater", F.hardtanh, x, 2, 1)
      H.assert_error_like("hardtanh", "unknown option", F.hardtanh, x, { low = 1 })
      H.assert_error_like("hardtanh", "min_val", F.hardtanh, x, "a")
      H.assert_error_like("softplus", "beta", F.softplus, x, "a")
      H.assert_error_like("softplus", "unknown option", F.softplus, x, { beta = 1, thr = 2 })
      H.assert_error_like("celu", "alpha must not be 0", F.celu, x, 0)
      H.assert_error_like("selu", "inplace", F.selu, x, "yes")
      H.assert_error_like("Hardtanh", "min_val cannot be greater", nn.Hardtanh, 1, 0)
      H.assert_error_like("Softplus", "numbers", nn.Softplus, "b")
      H.assert_error_like("CELU", "alpha", nn.CELU, "a")
      local leaf = lm.randn({ 3 }):requires_grad_()
      H.assert_error_like("hardtanh", "leaf", F.hardtanh, leaf, -1, 1, true)
      H.assert_error_like("celu", "leaf", F.celu, leaf, 0.5, true)
   end)
end)

describe("F.dropout1d / nn.Dropout1d", function()
   it("zeroes whole channels of (N, C, L) and unbatched (C, L) input, scales the rest", function()
      lm.manual_seed(3)
      local x = lm.ones({ 4, 16, 9 })
      local y = F.dropout1d(x, 0.5)
      local per = y:amax(3)                -- one value per (sample, channel)
      local mn = y:amin(3)
      assert.are.equal(0, (per - mn):abs():max():item())
      for _, v in ipairs(H.values(per:view(-1))) do assert.is_true(v == 0 or v == 2) end
      assert.are.same({ 16, 9 }, F.dropout1d(lm.ones({ 16, 9 }), 0.5):size())
      assert.are.equal(x, F.dropout1d(x, 0.5, false))
      local m = nn.Dropout1d(0.25)
      assert.are.equal("Dropout1d(p=0.25)", tostring(m))
      m:eval()
      assert.are.equal(x, m(x))
      local g = lm.ones({ 4, 16, 9 }):requires_grad_()
      lm.manual_seed(4)
      local yg = F.dropout1d(g * 1, 0.5)
      yg:sum():backward()
      assert.are.equal(0, (g.grad - yg:detach()):abs():max():item())
      H.assert_error_like("dropout1d", "2-D or 3-D", F.dropout1d, lm.ones({ 2, 3, 4, 5 }))
      H.assert_error_like("dropout1d", "between 0 and 1", F.dropout1d, x, 2)
      H.assert_error_like("Dropout1d", "between 0 and 1", nn.Dropout1d, -1)
   end)
end)

describe("F.upsample_nearest / F.upsample_bilinear", function()
   it("are interpolate's nearest, and bilinear with align_corners", function()
      local x = lm.randn({ 2, 3, 4, 5 }):contiguous(lm.channels_last)
      local a = F.upsample_nearest(x, nil, 2)
      assert.are.equal(0, (a - F.interpolate(x, { scale_factor = 2 })):abs():max():item())
      assert.is_true(a:is_contiguous(lm.channels_last))
      local b = F.upsample_bilinear(x, { size = { 7, 9 } })
      local want = F.interpolate(x, { size = { 7, 9 }, mode = "bilinear", align_corners = true })
      assert.are.equal(0, (b - want):abs():max():item())
      assert.are.same({ 2, 3, 6, 6 }, F.upsample_nearest(x, 6):size())
      H.assert_error_like("upsample_nearest", "unknown option", F.upsample_nearest, x,
                          { mode = "bilinear" })
   end)
end)
