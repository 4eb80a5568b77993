-- The float32 kernels of layer norm (group normalisation of one-row samples): norm_rows_avx512
-- (kernels/cpu/norm_rows_f32_avx512.c, 16 lanes) and norm_rows_avx2 (norm_rows_f32_avx2.c, 8
-- lanes; any CPU with AVX2 runs it through lm_cpu_set_isa): values and the gradients of input,
-- weight and bias against the same ops in float64, on row lengths that end in partial vectors,
-- groups that start inside a vector, rows split between threads; the same values with the kernel
-- switched off; LUMEN_VERBOSE names it. (PyTorch's values for these ops: norm_group_spec.)

local lm = require("lumen")
local sh = require("spec.shell")
local F = lm.F

local on_cpu = lm.get_default_device() == "cpu"

local rel_diff = require("spec.helpers").rel_diff

-- {name, x sizes, "layer" (then normalized_shape) or "group" (then G), offset, tolerance}
local CASES = {
   { "ConvNeXt's rows: 3136 x 96", { 3136, 96 }, "layer", { 96 } },
   { "rows of 7 (one partial vector)", { 50, 7 }, "layer", { 7 } },
   { "one value a row", { 9, 1 }, "layer", { 1 } },
   { "rows of 1000 over two trailing dims, threads split them", { 3, 40, 10, 100 }, "layer",
     { 10, 100 } },
   { "group_norm of (N, C): 4 groups of 25", { 700, 100 }, "group", 4 },
   { "group_norm of (N, C): 3 groups of 6", { 33, 18 }, "group", 3 },
   -- the sums start from each group's first value: a common offset keeps its digits (summed
   -- plainly in float32 this case was 3.2e-5 off, the portable double loops 1.1e-5)
   { "a large offset: values near 1000", { 200, 96 }, "layer", { 96 }, 1000 },
}

local function operands(c)
   local x = lm.randn(c[2])
   if c[5] then x = x + c[5] end
   local wsz = c[3] == "layer" and c[4] or { c[2][2] }
   local w, b = lm.randn(wsz), lm.randn(wsz)
   return x, w, b, lm.randn(c[2])
end

local function run(c, x, w, b, gy)
   local xx, ww, bb = x:clone():requires_grad_(true), w:clone():requires_grad_(true),
                      b:clone():requires_grad_(true)
   local y
   if c[3] == "layer" then
      y = F.layer_norm(xx, c[4], ww, bb, { eps = 1e-5 })
   else
      y = F.group_norm(xx, c[4], ww, bb, { eps = 1e-5 })
   end
   (y * gy):sum():backward()
   return y:detach(), xx.grad, ww.grad, bb.grad
end

local function d64(t) return t:double() end

local C = require("lumen.C")
for _, V in ipairs({ { impl = "norm_rows_avx512", isa = "LM_ISA_AVX512", what = "16 lanes" },
                    { impl = "norm_rows_avx2", isa = "LM_ISA_AVX2", what = "8 lanes" } }) do
describe("layer norm's float32 rows on " .. V.what .. " (" .. V.impl .. ")", function()
   local has_isa = on_cpu and C.lm_cpu_get_isa() >= C[V.isa]
   -- fn at the variant's ISA (AVX2 forced where the CPU has more), the ISA restored after
   local function at_isa(fn, ...)
      if V.isa == "LM_ISA_AVX2" then C.lm_cpu_set_isa(C.LM_ISA_AVX2) end
      local r = { pcall(fn, ...) }
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      if not r[1] then error(r[2], 0) end
      return unpack(r, 2)
   end
   for _, c in ipairs(CASES) do
      it(c[1] .. ": values and gradients against float64, and with the kernel off", function()
         if not has_isa then
            pending("needs " .. V.isa .. " on the CPU")
            return
         end
         lm.manual_seed(21)
         local x, w, b, gy = operands(c)
         local y, gx, gw, gb = at_isa(run, c, x, w, b, gy)
         local y64, gx64, gw64, gb64 = run(c, d64(x), d64(w), d64(b), d64(gy))
         local tol = c[6] or 2e-5
         for _, p in ipairs({ { "output", y, y64 }, { "grad_input", gx, gx64 },
                              { "grad_weight", gw, gw64 }, { "grad_bias", gb, gb64 } }) do
            local e = rel_diff(p[2], p[3])
            assert.is_true(e < tol, ("%s: relative error %g"):format(p[1], e))
            assert.is_true(p[2]:dtype() == lm.float32, p[1] .. " float32")
         end
         if on_cpu then
            lm.backends.cpu.disable(V.impl)
            local ok, y2, gx2, gw2, gb2 = pcall(at_isa, run, c, x, w, b, gy)
            lm.backends.cpu.enable(V.impl)
            assert(ok, y2)
            assert.is_true(rel_diff(y, y2) < tol and rel_diff(gx, gx2) < tol and
                           rel_diff(gw, gw2) < tol and rel_diff(gb, gb2) < tol,
                           "the kernel switched off")
         end
      end)
   end

   it("without weight and bias, and grad_input alone", function()
      if not has_isa then
         pending("needs " .. V.isa .. " on the CPU")
         return
      end
      lm.manual_seed(22)
      local x = lm.randn({ 300, 96 }):requires_grad_(true)
      local x64 = x:detach():double():requires_grad_(true)
      local gy = lm.randn({ 300, 96 })
      local y = at_isa(function()
         local y = F.layer_norm(x, { 96 });
         (y * gy):sum():backward()
         return y
      end)
      local y64 = F.layer_norm(x64, { 96 });
      (y64 * gy:double()):sum():backward()
      assert.is_true(rel_diff(y:detach(), y64:detach()) < 2e-5, "output")
      assert.is_true(rel_diff(x.grad, x64.grad) < 2e-5, "grad_input")
   end)

   it("LUMEN_VERBOSE names " .. V.impl .. " forward and backward", function()
      if not has_isa then
         pending("needs " .. V.isa .. " on the CPU")
         return
      end
      local out = sh.luajit((V.isa == "LM_ISA_AVX2" and [[
local C = require("lumen.C")
C.lm_cpu_set_isa(C.LM_ISA_AVX2)
]] or "") .. [[
local lm = require("lumen")
local x = lm.randn({ 64, 96 }):requires_grad_(true)
local w, b = lm.ones({ 96 }):requires_grad_(true), lm.zeros({ 96 }):requires_grad_(true)
lm.F.layer_norm(x, { 96 }, w, b):sum():backward()
lm.F.layer_norm(x:detach():double(), { 96 })
]], "LUMEN_VERBOSE=1")
      assert.are.equal(V.impl,
                       out:match("lumen_verbose,exec,cpu,group_norm,([^,]+),float32"), out)
      assert.are.equal(V.impl,
                       out:match("lumen_verbose,exec,cpu,group_norm_backward,([^,]+),float32"),
                       out)
      assert.are.equal("default", out:match("lumen_verbose,exec,cpu,group_norm,([^,]+),float64"),
                       out)
   end)
end)
end
