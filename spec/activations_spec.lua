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

   it("relu6 in place: the gradient from its result, as from its input (no copy saved)", function()
      for _, dt in ipairs({ lm.float32, lm.float64 }) do
         local v = { -1, -0.0, 0, 1e-30, 3, 5.999, 6, 6.5, 0 / 0, -(0 / 0) }
         local x = lm.tensor(v, { dtype = dt }):requires_grad_()
         local g = lm.arange(1, #v + 1):to(dt)
         F.relu6(x * 1):backward(g)
         local want = H.values(x.grad)
         x.grad = nil
         local y = F.relu6(x * 1, true)
         assert(y.grad_fn ~= nil)
         y:backward(g)
         H.assert_close(H.values(x.grad), want, 0)
         -- and the 4-D channels-last case, through the module
         local x4 = lm.randn({ 2, 3, 4, 5 }, { dtype = dt }):mul(4):add(2)
            :contiguous(lm.channels_last):requires_grad_()
         local g4 = lm.randn({ 2, 3, 4, 5 }, { dtype = dt }):contiguous(lm.channels_last)
         nn.ReLU6(true)(x4 * 1):backward(g4)
         local got = x4.grad:clone()
         x4.grad = nil
         F.relu6(x4):backward(g4)
         assert(got:is_contiguous(lm.channels_last))
         H.assert_close(H.values(got:contiguous()), H.values(x4.grad:contiguous()), 0)
      end
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

-- The float32 vector loops: kernels/cpu/ew_act_f32_avx512.c (implementation "ew_act_avx512",
-- taken for float32 at lm_cpu_isa() >= AVX-512) and kernels/cpu/ew_act_f32_avx2.c
-- ("ew_act_avx2", at AVX2: any CPU with AVX2 runs it through lm_cpu_set_isa): against float64
-- references (the same ops in float64: libm's erf, tanh, exp) and against the portable loops (the
-- name switched off), on lengths that are not multiples of the vector (the tail), strided views,
-- large |x|, NaN and +-inf (NaN where PyTorch's float32 formulas give NaN, the same infinities).
for _, V in ipairs({ { impl = "ew_act_avx512", isa = "LM_ISA_AVX512", what = "the AVX-512 loops" },
                    { impl = "ew_act_avx2", isa = "LM_ISA_AVX2", what = "the AVX2 loops" } }) do
describe("float32 activations: " .. V.what .. " (" .. V.impl .. ")", function()
   local C = require("lumen.C")
   local has_isa = lm.get_default_device() ~= "cuda:0" and C.lm_cpu_get_isa() >= C[V.isa]
   local inf, nan = math.huge, 0 / 0
   -- the values every case sees: zeros, tiny, the erf branch point, exp's clamps and overflow,
   -- the GELU tanh form's x^3 and x^2 overflow, NaN, +-inf; then random ones
   local SPECIAL = { 0, -0.0, 1e-30, -1e-30, 1e-40, 0.5, -0.5, 1.3119, -1.3119, 1.31201,
                     -1.31201, 3, -3, 5, -5, 9.5, -9.5, 10.5, -10.5, 13, -13, 20, -20, 87.5,
                     -87.5, 88.8, -88.8, 89, -89, 104, -104, 120, -120, 1e3, -1e3, 3e12, -3e12,
                     2e19, -2e19, 1e30, -1e30, 3.4e38, -3.4e38, inf, -inf, nan }
   local function values(n)
      lm.manual_seed(n)
      local r = (lm.randn({ n }) * 4):totable()
      for i = 1, math.min(n, #SPECIAL) do r[i] = SPECIAL[i] end
      return r
   end
   local UN = {
      { "gelu", function(x) return F.gelu(x) end },
      { "gelu tanh", function(x) return F.gelu(x, "tanh") end },
      { "silu", function(x) return F.silu(x) end },
      { "sigmoid", function(x) return x:sigmoid() end },
      { "hardswish", function(x) return F.hardswish(x) end },
      { "hardsigmoid", function(x) return F.hardsigmoid(x) end },
   }
   local BW = {
      { "gelu backward", function(x) return F.gelu(x) end },
      { "gelu tanh backward", function(x) return F.gelu(x, "tanh") end },
      { "silu backward", function(x) return F.silu(x) end },
   }
   -- a within float32 rounding of the float64 reference r (x the input): NaN where r is NaN,
   -- the same infinities, else |a - r| <= 4e-6 |r| + 1e-6 min(|x|, 10) + 1e-12: a few ulps of
   -- the result, and a few ulps of the terms where they cancel (the gradients' zeros) or of
   -- 1 + erf(z) in the tails (lm_gelu_f32's erf is good to an ulp of erf, not of 1 + erf; the
   -- portable loops' 1 + tanhf(u) and 1 + erff(z) cancel there too)
   local function close(a, r, x, what)
      a, r = a:contiguous():view({ -1 }):totable(), r:contiguous():view({ -1 }):totable()
      x = x:contiguous():view({ -1 }):double():totable()
      assert.are.equal(#r, #a, what)
      for i = 1, #r do
         local ai, ri = a[i], r[i]
         local ok
         if ri ~= ri then ok = ai ~= ai
         elseif ri == inf or ri == -inf then ok = ai == ri
         else
            local tol = 4e-6 * math.abs(ri) + 1e-6 * math.min(math.abs(x[i]), 10) + 1e-12
            ok = ai == ai and math.abs(ai - ri) <= tol
         end
         if not ok then
            error(("%s: element %d (x = %.9g): got %.9g, reference %.9g"):format(what, i, x[i],
                                                                                ai, ri), 2)
         end
      end
   end
   -- the float32 result with the AVX-512 loops on (on = true) or switched off
   local function with(on, fn)
      if not on then lm.backends.cpu.disable(V.impl) end
      if V.isa == "LM_ISA_AVX2" then C.lm_cpu_set_isa(C.LM_ISA_AVX2) end
      local ok, r = pcall(fn)
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      if not on then lm.backends.cpu.enable(V.impl) end
      if not ok then error(r, 0) end
      return r
   end
   -- x: float32 inputs of several lengths, contiguous and strided (every other element of a
   -- 2-column view)
   local function inputs(n)
      local v = values(n)
      local x = lm.tensor(v, { dtype = lm.float32 })
      local wide = lm.zeros({ n, 2 }, { dtype = lm.float32 })
      wide:select(2, 1):copy_(x)
      return { { "contiguous", x }, { "strided", wide:select(2, 1) } }
   end
   local LENS = { 1, 15, 16, 17, 47, 1000 + 7 }

   for _, c in ipairs(UN) do
      it(c[1] .. ": float64 reference and the portable loop, odd lengths, strided, specials",
         function()
         if not has_isa then
            pending("needs " .. V.isa .. " on the CPU")
            return
         end
         for _, n in ipairs(LENS) do
            for _, xi in ipairs(inputs(n)) do
               local what = ("%s n=%d %s"):format(c[1], n, xi[1])
               local x = xi[2]
               local ref = c[2](x:double())
               local new = with(true, function() return c[2](x) end)
               local old = with(false, function() return c[2](x) end)
               assert.are.equal(lm.float32, new:dtype())
               if c[1] == "hardswish" then
                  -- float32's x * 6 overflows from |x| = FLT_MAX / 6: inf there, as in PyTorch
                  ref = lm.where(x:double():gt(3.4028234663852886e38 / 6), inf, ref)
               end
               close(new, ref, x, what .. " (" .. V.impl .. ")")
               close(new, old:double(), x, what .. " (against the portable loop)")
            end
         end
      end)
   end
   for _, c in ipairs(BW) do
      it(c[1] .. ": float64 reference and the portable loop, odd lengths, strided, specials",
         function()
         if not has_isa then
            pending("needs " .. V.isa .. " on the CPU")
            return
         end
         local function grad(x, g)
            local xx = x:detach():requires_grad_(true)
            c[2](xx):backward(g)
            return xx.grad
         end
         for _, n in ipairs(LENS) do
            for _, xi in ipairs(inputs(n)) do
               local what = ("%s n=%d %s"):format(c[1], n, xi[1])
               local x = xi[2]
               lm.manual_seed(n + 1)
               local g = lm.randn({ n })
               local ref = grad(x:double(), g:double())
               local new = with(true, function() return grad(x, g) end)
               local old_d = with(false, function() return grad(x, g) end):double()
               if c[1] == "gelu tanh backward" then
                  -- float32's y^2 overflows from |y| = 1.8e19: NaN there (0 * inf), as in
                  -- PyTorch's float32 kernel (the portable loop multiplies in another order
                  -- and stays finite)
                  local big = x:double():abs():gt(1.8e19)
                  ref, old_d = lm.where(big, nan, ref), lm.where(big, nan, old_d)
               end
               close(new, ref, x, what .. " (" .. V.impl .. ")")
               close(new, old_d, x, what .. " (against the portable loop)")
            end
         end
      end)
   end
   it("bfloat16 and float16 inputs take the float32 loops: the same values as switched off",
      function()
      if not has_isa then
         pending("needs " .. V.isa .. " on the CPU")
         return
      end
      for _, dt in ipairs({ lm.bfloat16, lm.float16 }) do
         local x = lm.tensor(values(67), { dtype = lm.float32 }):clamp(-60000, 60000):to(dt)
         for _, c in ipairs(UN) do
            local new = with(true, function() return c[2](x) end)
            local old = with(false, function() return c[2](x) end)
            assert.are.equal(dt, new:dtype())
            -- one rounding step of the 16-bit type apart at most
            local a, b = new:double():totable(), old:double():totable()
            local rel = dt == lm.bfloat16 and 8e-3 or 1e-3
            for i = 1, #a do
               local ok = (a[i] ~= a[i] and b[i] ~= b[i]) or a[i] == b[i] or
                          math.abs(a[i] - b[i]) <= rel * math.abs(b[i]) + 1e-7
               assert(ok, ("%s %s element %d: %.6g against %.6g"):format(c[1], tostring(dt), i,
                                                                          a[i], b[i]))
            end
         end
      end
   end)
   it("the forced portable ISA runs the portable loops (the same values as switched off)",
      function()
      if not has_isa or lm.get_default_device() ~= "cpu" then
         pending("needs " .. V.isa .. " on the CPU, CPU tensors")
         return
      end
      local x = lm.tensor(values(1007), { dtype = lm.float32 })
      for _, c in ipairs(UN) do
         local old = with(false, function() return c[2](x) end)
         C.lm_cpu_set_isa(C.LM_ISA_C)
         local ok, r = pcall(c[2], x)
         C.lm_cpu_set_isa(C.LM_ISA_AUTO)
         assert(ok, r)
         local a, b = r:totable(), old:totable()
         for i = 1, #a do
            assert(a[i] == b[i] or (a[i] ~= a[i] and b[i] ~= b[i]),
                   ("%s element %d: %.9g against %.9g"):format(c[1], i, a[i], b[i]))
         end
      end
   end)
end)
end
