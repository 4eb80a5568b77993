-- Batch norm's float32 channels-last rows below AVX-512 (batch_norm_avx2: kernels/cpu/norm.c's
-- row kernels compiled for AVX2 on 8-float vectors; any CPU with AVX2 runs them through
-- lm_cpu_set_isa). Without contraction into FMA and with the same summation order as the
-- portable copy, they give its values to the bit: checked on channel counts that end in partial
-- vectors, training and evaluation, the fused residual and relu, every gradient; against float64
-- too; LUMEN_VERBOSE names the copy that ran.

local lm = require("lumen")
local sh = require("spec.shell")
local F = lm.F
local C = require("lumen.C")

local rel_diff = require("spec.helpers").rel_diff
local has_avx2 = lm.get_default_device() == "cpu" and C.lm_cpu_get_isa() >= C.LM_ISA_AVX2

local function at_avx2(fn)
   C.lm_cpu_set_isa(C.LM_ISA_AVX2)
   local r = { pcall(fn) }
   C.lm_cpu_set_isa(C.LM_ISA_AUTO)
   if not r[1] then error(r[2], 0) end
   return unpack(r, 2)
end

-- {name, sizes, training, residual, relu}
local CASES = {
   { "48 channels (whole vectors), training", { 4, 48, 9, 11 }, true, false, false },
   { "37 channels (a partial vector), training, relu", { 3, 37, 5, 7 }, true, false, true },
   { "100 channels, training, residual and relu", { 2, 100, 6, 5 }, true, true, true },
   { "8 channels, evaluation, residual", { 5, 8, 3, 3 }, false, true, false },
   { "200 channels at 1 x 1 (rows of the (N, C) view)", { 16, 200, 1, 1 }, true, false, false },
}

-- y, and the gradients of x, weight, bias, residual (dtype dt); the running stats after
local function run(c, dt, x, w, b, r, gy)
   local function leaf(t) return t:to(dt):clone():requires_grad_(true) end
   local xx, ww, bb = leaf(x), leaf(w), leaf(b)
   local rr = c[4] and leaf(r) or nil
   local rm, rv = lm.zeros({ c[2][2] }, { dtype = dt }), lm.ones({ c[2][2] }, { dtype = dt })
   local y = F.batch_norm(xx, rm, rv, ww, bb, { training = c[3], residual = rr, relu = c[5] })
   y:backward(gy:to(dt))
   return { y:detach(), xx.grad, ww.grad, bb.grad, rr and rr.grad or lm.zeros({ 1 }), rm, rv }
end

describe("batch norm's float32 rows on 8 lanes (batch_norm_avx2)", function()
   for _, c in ipairs(CASES) do
      it(c[1] .. ": the portable copy's values to the bit, and float64's", function()
         if not has_avx2 then
            pending("a CPU with AVX2")
            return
         end
         lm.manual_seed(5)
         local x = lm.randn(c[2]):contiguous(lm.channels_last) * 3 + 1
         local w, b = lm.randn({ c[2][2] }), lm.randn({ c[2][2] })
         local r = lm.randn(c[2]):contiguous(lm.channels_last)
         local gy = lm.randn(c[2]):contiguous(lm.channels_last)
         local new = at_avx2(function() return run(c, lm.float32, x, w, b, r, gy) end)
         lm.backends.cpu.disable("batch_norm_avx2")
         local ok, old = pcall(at_avx2, function() return run(c, lm.float32, x, w, b, r, gy) end)
         lm.backends.cpu.enable("batch_norm_avx2")
         assert(ok, old)
         local ref = run(c, lm.float64, x, w, b, r, gy)
         local what = { "output", "grad_input", "grad_weight", "grad_bias", "grad_residual",
                        "running_mean", "running_var" }
         for i = 1, #new do
            assert.are.equal(0, (new[i] - old[i]):abs():max():item(), what[i] .. " (bits)")
            assert.is_true(rel_diff(new[i], ref[i]) < 2e-5,
                           ("%s: relative error %g"):format(what[i], rel_diff(new[i], ref[i])))
         end
         assert.is_true(new[1]:is_contiguous(lm.channels_last), "output channels-last")
         assert.is_true(new[2]:is_contiguous(lm.channels_last), "grad_input channels-last")
      end)
   end

   it("LUMEN_VERBOSE names batch_norm_avx2 for the float32 rows, else batch_norm_portable",
      function()
      if not has_avx2 then
         pending("a CPU with AVX2")
         return
      end
      local out = sh.luajit([[
local lm = require("lumen")
local C = require("lumen.C")
C.lm_cpu_set_isa(C.LM_ISA_AVX2)
local x = lm.randn({ 2, 16, 4, 4 }):contiguous(lm.channels_last):requires_grad_(true)
local bn = lm.nn.BatchNorm2d(16)
bn:forward(x):sum():backward()
bn:forward(x:detach():contiguous())
lm.backends.cpu.disable("batch_norm_avx2")
bn:forward(x:detach())
]], "LUMEN_VERBOSE=1")
      local names = {}
      for op, impl in out:gmatch("lumen_verbose,exec,cpu,(batch_norm[a-z_]*),([^,]+),") do
         names[#names + 1] = op .. "=" .. impl
      end
      -- (the contiguous input: its planes are the portable copy's)
      assert.are.same({ "batch_norm=batch_norm_avx2", "batch_norm_backward=batch_norm_avx2",
                        "batch_norm=batch_norm_portable", "batch_norm=batch_norm_portable" },
                      names, out)
   end)
end)
