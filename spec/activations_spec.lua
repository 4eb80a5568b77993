-- The activations of issue 40 (F.silu, F.gelu, F.hardswish, F.hardsigmoid, F.relu6,
-- F.leaky_relu, F.elu, F.mish; the native elementwise codes of src/lumen.h) and their modules:
-- values and input gradients against PyTorch 2.x float64 references
-- (spec/fixtures/nn/act.lua, gen_act.py) in float64, float32, bfloat16 and float16; contiguous,
-- channels_last and channels_last_3d input (output and gradient keep the input's format);
-- in-place forms; float64 gradchecks; bad input.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local nn = lm.nn

local FX = G.fixture("act")
local CL, CL3 = lm.channels_last, lm.channels_last_3d

-- the fixture's 2x3x4x5 data as a tensor of dtype in layout "contiguous", "cl" (4-D channels
-- last) or "cl3d" (viewed as 2x3x2x2x5, channels_last_3d: elementwise, so values match)
local function fx(d, dtype, layout, rg)
   local t = lm.tensor(d.data, { dtype = dtype or lm.float64 })
   if layout == "cl3d" then
      t = t:view({ 2, 3, 2, 2, 5 }):to(CL3)
   else
      t = t:view(d.sizes)
      if layout == "cl" then t = t:to(CL) end
   end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function check_layout(t, layout, what)
   if layout == "cl" then
      assert(t:is_contiguous(CL) and not t:is_contiguous(), what .. ": expected channels_last, got "
             .. H.describe(t))
   elseif layout == "cl3d" then
      assert(t:is_contiguous(CL3) and not t:is_contiguous(),
             what .. ": expected channels_last_3d, got " .. H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

local function run(c, x)
   local f = F[c.fn]
   if c.opts then return f(x, c.opts) end
   return f(x)
end

local DT = {
   { lm.float64, 1e-9, 1e-9 }, { lm.float32, 1e-5, 1e-5 },
   { lm.bfloat16, 3e-2, 5e-2 }, { lm.float16, 4e-3, 8e-3 },
}

describe("activations against PyTorch", function()
   for _, c in ipairs(FX.activations) do
      for _, dt in ipairs(DT) do
         for _, layout in ipairs({ "contiguous", "cl", "cl3d" }) do
            it(("%s %s %s"):format(c.name, tostring(dt[1]), layout), function()
               local x = fx(c.x, dt[1], layout, true)
               local out = run(c, x)
               assert(out:dtype() == dt[1], "dtype")
               check_layout(out, layout, "output")
               local ref = G.tensor(c.out)
               local gout = fx(c.gout, dt[1], layout)
               out:backward(gout)
               check_layout(x.grad, layout, "gradient")
               local o64 = out:double():contiguous():view(c.out.sizes)
               local g64 = x.grad:double():contiguous():view(c.gx.sizes)
               G.close(o64, ref, dt[2], c.name .. " output")
               G.close(g64, G.tensor(c.gx), dt[3], c.name .. " gradient")
            end)
         end
      end
   end

   it("in-place forms: the same values, the same tensor, a gradient through a non-leaf", function()
      for _, c in ipairs(FX.activations) do
         if c.fn ~= "gelu" then
            local x = fx(c.x, lm.float64, "cl", true)
            local y = x * 1
            local r
            if c.fn == "leaky_relu" then r = F.leaky_relu(y, c.opts and c.opts.negative_slope, true)
            elseif c.fn == "elu" then r = F.elu(y, c.opts and c.opts.alpha, true)
            else r = F[c.fn](y, true) end
            assert(rawequal(r, y), c.name .. ": in place returns its input")
            check_layout(y, "cl", c.name)
            G.close(y:contiguous(), G.tensor(c.out), 1e-9, c.name .. " in place")
            y:backward(fx(c.gout, lm.float64, "cl"))
            G.close(x.grad:contiguous(), G.tensor(c.gx), 1e-9, c.name .. " in-place gradient")
         end
      end
   end)

   it("in place on a leaf that requires grad is an error", function()
      local x = lm.randn({ 2, 3 }, { dtype = lm.float64 }):requires_grad_()
      H.assert_error_like("silu", "leaf", F.silu, x, true)
      H.assert_error_like("elu", "leaf", F.elu, x, 1, true)
   end)

   it("gradchecks (float64, channels_last)", function()
      for _, name in ipairs({ "silu", "gelu", "hardswish", "hardsigmoid", "relu6", "leaky_relu",
                              "elu", "mish" }) do
         local x = G.input({ 2, 3, 2, 3 }, CL, 7, 2.5)
         G.check(function(t) return F[name](t) end, { x })
      end
      G.check(function(t) return F.gelu(t, { approximate = "tanh" }) end,
              { G.input({ 2, 3, 2, 3 }, CL, 8, 2.5) })
      G.check(function(t) return F.leaky_relu(t, 0.3) end, { G.input({ 2, 5 }, nil, 9) })
      G.check(function(t) return F.elu(t, { alpha = 0.7 }) end, { G.input({ 2, 5 }, nil, 10) })
   end)

   it("relu6 as PyTorch's hardtanh(0, 6): no gradient at 0 and 6", function()
      local x = lm.tensor({ -1, 0, 3, 6, 7 }, { dtype = lm.float64 }):requires_grad_()
      local y = F.relu6(x)
      H.assert_close(H.values(y), { 0, 0, 3, 6, 6 }, 0)
      y:sum():backward()
      H.assert_close(H.values(x.grad), { 0, 0, 1, 0, 0 }, 0)
   end)

   it("modules", function()
      local x = fx(FX.activations[1].x, lm.float64, "cl")
      local cases = {
         { nn.SiLU(), "silu", "SiLU()" }, { nn.SiLU(true), "silu", "SiLU(inplace=True)" },
         { nn.GELU(), "gelu", "GELU(approximate='none')" },
         { nn.GELU({ approximate = "tanh" }), "gelu_tanh", "GELU(approximate='tanh')" },
         { nn.Hardswish(), "hardswish", "Hardswish()" },
         { nn.Hardsigmoid({ inplace = true }), "hardsigmoid", "Hardsigmoid(inplace=True)" },
         { nn.ReLU6(), "relu6", "ReLU6()" }, { nn.Mish(), "mish", "Mish()" },
         { nn.LeakyReLU(), "leaky_relu", "LeakyReLU(negative_slope=0.01)" },
         { nn.LeakyReLU(0.2, true), "leaky_relu_0.2",
           "LeakyReLU(negative_slope=0.2, inplace=True)" },
         { nn.ELU(), "elu", "ELU(alpha=1.0)" },
         { nn.ELU({ alpha = 0.5 }), "elu_0.5", "ELU(alpha=0.5)" },
      }
      local by = {}
      for _, c in ipairs(FX.activations) do by[c.name] = c end
      for _, m in ipairs(cases) do
         local y = m[1](x:clone())
         check_layout(y, "cl", m[3])
         G.close(y:contiguous(), G.tensor(by[m[2]].out), 1e-9, m[3])
         assert(tostring(m[1]) == m[3], "repr " .. tostring(m[1]) .. " ~= " .. m[3])
      end
   end)

   it("bad input", function()
      local x = lm.randn({ 2, 3 })
      for _, name in ipairs({ "silu", "gelu", "hardswish", "hardsigmoid", "relu6", "leaky_relu",
                              "elu", "mish" }) do
         H.assert_error_like(name, "tensor expected", F[name], nil)
         H.assert_error_like(name, "tensor expected", F[name], 3)
         H.assert_error_like(name, "floating", F[name], lm.tensor({ 1, 2 }, { dtype = lm.int64 }))
         H.assert_error_like(name, "unknown option", F[name], x, { bogus = 1 })
      end
      H.assert_error_like("gelu", "approximate", F.gelu, x, { approximate = "fast" })
      H.assert_error_like("gelu", "approximate", F.gelu, x, 3)
      H.assert_error_like("silu", "inplace", F.silu, x, "yes")
      H.assert_error_like("leaky_relu", "negative_slope", F.leaky_relu, x, "a")
      H.assert_error_like("elu", "alpha", F.elu, x, { alpha = true })
      H.assert_error_like("GELU", "approximate", nn.GELU, "exact")
      H.assert_error_like("SiLU", "unknown option", nn.SiLU, { inplce = true })
      H.assert_error_like("LeakyReLU", "negative_slope", nn.LeakyReLU, "x")
   end)
end)
