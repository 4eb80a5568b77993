-- luacheck: max line length 120
-- spec/cuda_elementwise_spec.lua -- the CUDA elementwise kernels (kernels/cuda/elementwise*.cu)
-- against the CPU's: every unary and binary op, clamp, addcmul/addcdiv, where, copy (dtype
-- conversions, layouts, broadcasting, overlap) and fill, in float32/float64/float16/bfloat16 and
-- the integer dtypes, on contiguous, channels-last and strided (non-dense) operands; the output's
-- dtype, sizes and strides (memory format) as the CPU's; gradients through autograd; errors.
-- Values: float32 1e-5 relative, float64 1e-12, float16/bfloat16 1e-2, integers and bools exact,
-- NaN where the CPU has NaN. Skipped without a CUDA device (runs on the emulated cuda:0 of
-- `make test-cuda-emu` too).
local H = require("spec.helpers")
local lm = H.lm

local DEV = "cuda:0"

describe("CUDA elementwise kernels against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local F32, F64, F16, BF16 = lm.float32, lm.float64, lm.float16, lm.bfloat16
   local I64, I32, U8, BOOL = lm.int64, lm.int32, lm.uint8, lm.bool
   local FLOATS = { F32, F64, F16, BF16 }
   local TOL = { float32 = 1e-5, float64 = 1e-12, float16 = 1e-2, bfloat16 = 2e-2 }
   local function tol_of(dt) return TOL[tostring(dt)] or 0 end

   local function cpu_randn(sz, dt)
      return lm.randn(sz, { device = "cpu" }):to(dt or F32)
   end
   local function cpu_ints(sz, dt, lo, hi)
      local r = lm.rand(sz, { device = "cpu", dtype = F64 }) * (hi - lo + 1) + lo
      return r:floor():to(dt)
   end

   local function flat(t)
      return t:cpu():to(F64):contiguous():flatten():totable()
   end

   -- got (on cuda:0) against want (the CPU's): dtype, sizes, strides, values
   local function check(got, want, tol, what)
      what = what or ""
      assert.are.equal(DEV, got:device(), what .. ": device")
      assert.are.equal(tostring(want:dtype()), tostring(got:dtype()), what .. ": dtype")
      H.assert_sizes(got, want:size(), what)
      H.assert_strides(got, want:stride(), what)
      local a, b = flat(got), flat(want)
      for i = 1, #b do
         local x, y = a[i], b[i]
         if y ~= y then
            assert(x ~= x, string.format("%s: element %d: expected NaN, got %s", what, i, tostring(x)))
         elseif x ~= y then
            local d = math.abs(x - y)
            assert(d <= tol * (1 + math.abs(y)),
                   string.format("%s: element %d: expected %.9g, got %.9g", what, i, y, x))
         end
      end
   end

   -- layouts: each a function applied to the CPU base tensor and to its cuda:0 copy
   local VIEWS = {
      { "contiguous", function(t) return t end },
      { "channels_last", function(t) return t:contiguous(lm.channels_last) end },
      -- not dense: the first half of a tensor twice as wide (its copy_ runs on the device too)
      { "strided", function(t)
         local sz = t:size()
         local big = lm.zeros({ sz[1], sz[2], sz[3], 2 * sz[4] }, { device = t:device(), dtype = t:dtype() })
         local v = big:narrow(4, 1, sz[4])
         v:copy_(t)
         return v
      end },
   }
   local function pair(base, view)
      return view(base), view(base:to(DEV))
   end

   local SHAPE = { 2, 5, 4, 7 }

   local UNARY = { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh",
                   "square", "reciprocal", "sign", "logical_not", "floor", "ceil", "round", "sin",
                   "cos", "log1p", "expm1" }
   local POSITIVE = { log = true, sqrt = true, rsqrt = true, log1p = true }
   local INT_UNARY = { "neg", "abs", "relu", "square", "sign", "logical_not", "floor", "ceil",
                       "round" }

   it("unary ops: every float dtype and layout", function()
      lm.manual_seed(1)
      for _, dt in ipairs(FLOATS) do
         local base = cpu_randn(SHAPE, dt)
         local pos = base:abs() + 0.1
         for _, v in ipairs(VIEWS) do
            for _, op in ipairs(UNARY) do
               local x, xc = pair(POSITIVE[op] and pos or base, v[2])
               local what = string.format("%s %s %s", op, tostring(dt), v[1])
               check(xc[op](xc), x[op](x), tol_of(dt), what)
            end
         end
      end
   end)

   it("unary ops: integers (exact) and integer inputs of float ops", function()
      for _, dt in ipairs({ I64, I32, U8 }) do
         local base = dt == U8 and cpu_ints(SHAPE, dt, 0, 20) or cpu_ints(SHAPE, dt, -20, 20)
         for _, v in ipairs(VIEWS) do
            for _, op in ipairs(INT_UNARY) do
               if not (dt == U8 and op == "neg") then
                  local x, xc = pair(base, v[2])
                  check(xc[op](xc), x[op](x), 0, op .. " " .. tostring(dt) .. " " .. v[1])
               end
            end
            local x, xc = pair(base, v[2])
            check(xc:exp(), x:exp(), 1e-5, "exp of " .. tostring(dt))
            check(xc:sigmoid(), x:sigmoid(), 1e-5, "sigmoid of " .. tostring(dt))
         end
      end
      local b = lm.tensor({ true, false, true }, { device = "cpu" })
      check(b:to(DEV):logical_not(), b:logical_not(), 0, "logical_not bool")
      check(b:to(DEV):sign(), b:sign(), 0, "sign bool")
      check(b:to(DEV):square(), b:square(), 0, "square bool")
   end)

   local BINARY = { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
                    "gt", "ge", "logical_and", "logical_or", "relu_backward",
                    "sigmoid_backward", "tanh_backward", "fmod", "atan2" }

   -- (a, b) shapes: same, broadcast on channels, a 0-dim tensor, broadcast on both sides
   local BSHAPES = {
      { SHAPE, SHAPE }, { SHAPE, { 5, 1, 1 } }, { SHAPE, {} }, { { 2, 1, 4, 7 }, { 5, 1, 1 } },
   }

   it("binary ops: every float dtype, layout and broadcast", function()
      lm.manual_seed(2)
      for _, dt in ipairs(FLOATS) do
         for si, sh in ipairs(BSHAPES) do
            local a0, b0 = cpu_randn(sh[1], dt), cpu_randn(sh[2], dt)
            for _, v in ipairs(VIEWS) do
               local a, ac = pair(a0, #sh[1] == 4 and v[2] or function(t) return t end)
               local b, bc = pair(b0, #sh[2] == 4 and v[2] or function(t) return t end)
               for _, op in ipairs(BINARY) do
                  local bb, bbc = b, bc
                  if op == "pow" then bb, bbc = b:abs(), bc:abs() end
                  local what = string.format("%s %s %s shapes#%d", op, tostring(dt), v[1], si)
                  check(ac[op](ac, bbc), a[op](a, bb), tol_of(dt), what)
                  if op ~= "pow" then
                     check(bbc[op](bbc, ac), bb[op](bb, a), tol_of(dt), what .. " (swapped)")
                  end
               end
            end
         end
      end
   end)

   it("binary ops: mixed layouts (NCHW with NHWC), alpha, numbers on either side", function()
      lm.manual_seed(3)
      for _, dt in ipairs(FLOATS) do
         local tol = tol_of(dt)
         local a0, b0 = cpu_randn({ 4, 8, 16, 16 }, dt), cpu_randn({ 4, 8, 16, 16 }, dt)
         local a, ac = pair(a0, function(t) return t:contiguous(lm.channels_last) end)
         local b, bc = pair(b0, function(t) return t end)
         check(ac + bc, a + b, tol, "NHWC + NCHW " .. tostring(dt))
         check(bc * ac, b * a, tol, "NCHW * NHWC " .. tostring(dt))
         check(ac:add(bc, 2.5), a:add(b, 2.5), tol, "add alpha")
         check(ac:sub(bc, -0.5), a:sub(b, -0.5), tol, "sub alpha")
         check(ac + 1.5, a + 1.5, tol, "a + number")
         check(2 - ac, 2 - a, tol, "number - a")
         check(ac * 3, a * 3, tol, "a * 3")
         check(4 / ac, 4 / a, tol, "4 / a")
         check(ac:gt(0.25), a:gt(0.25), 0, "a > number")
         check(ac:maximum(bc), a:maximum(b), tol, "maximum")
         for _, e in ipairs({ 2, 3, 0.5, -1, -0.5, -2, 1.7 }) do
            local p, pc = a:abs() + 0.5, ac:abs() + 0.5
            check(pc:pow(e), p:pow(e), tol, "pow " .. e .. " " .. tostring(dt))
         end
         check(lm.tensor(2.0, { device = "cpu", dtype = dt }):to(DEV):pow(ac),
               lm.tensor(2.0, { device = "cpu", dtype = dt }):pow(a), tol, "2 ^ a")
      end
   end)

   it("binary ops: integers (exact, wrapping), division and fmod by zero", function()
      for _, dt in ipairs({ I64, I32 }) do
         local a0, b0 = cpu_ints(SHAPE, dt, -50, 50), cpu_ints(SHAPE, dt, 1, 9)
         for _, v in ipairs(VIEWS) do
            local a, ac = pair(a0, v[2])
            local b, bc = pair(b0, v[2])
            for _, op in ipairs(BINARY) do
               if op ~= "atan2" then
                  local what = op .. " " .. tostring(dt) .. " " .. v[1]
                  local tol = op == "div" and 1e-5 or 0
                  check(ac[op](ac, bc), a[op](a, b), tol, what)
               end
            end
            check(ac:add(bc, 3), a:add(b, 3), 0, "add alpha int")
            check(ac * 7, a * 7, 0, "a * 7 int")
            check(ac * 2.5, a * 2.5, 1e-5, "int * float number")
            check(ac:fmod(3), a:fmod(3), 0, "fmod number")
            check(ac:pow(2), a:pow(2), 0, "pow 2 int")
            check(ac:pow(3), a:pow(3), 0, "pow 3 int")
         end
      end
      local big = lm.tensor({ 4611686018427387904, -3, 4 }, { device = "cpu", dtype = I64 })
      check(big:to(DEV) * 4, big * 4, 0, "int64 wraps")
      check(big:to(DEV) * 2 + big:to(DEV) * 2, big * 2 + big * 2, 0, "int64 wraps (add)")
      local x = lm.tensor({ 5, -7, 9 }, { device = "cpu", dtype = I64 }):to(DEV)
      local z = lm.tensor({ 2, 0, -1 }, { device = "cpu", dtype = I64 }):to(DEV)
      H.assert_error_like("fmod", "ZeroDivisionError", function() return x:fmod(z) end)
      H.assert_error_like("fmod", "ZeroDivisionError", function() return x:fmod(0) end)
      check(x:fmod(z:clamp(-1, nil):add(z:eq(0):to(I64))), x:cpu():fmod(z:cpu():clamp(-1, nil)
            :add(z:cpu():eq(0):to(I64))), 0, "fmod by -1 and 1")
      local f = lm.tensor({ 1, -1, 0 }, { device = "cpu" })
      check(f:to(DEV) / 0, f / 0, 0, "float division by zero: inf and NaN")
   end)

   it("dense path: odd sizes (vector tails) and unaligned views", function()
      lm.manual_seed(12)
      for _, dt in ipairs({ F32, F16, BF16, F64, I64 }) do
         for _, n in ipairs({ 1, 2, 3, 5, 7, 9, 33, 1027 }) do
            local mk = dt == I64 and function() return cpu_ints({ n + 1 }, dt, -9, 9) end
                       or function() return cpu_randn({ n + 1 }, dt) end
            local a0, b0 = mk(), mk()
            for off = 1, 2 do
               -- off 2: every pointer one element past an aligned address
               local function v(t) return t:narrow(1, off, n) end
               local a, ac = pair(a0, v)
               local b, bc = pair(b0, v)
               local what = string.format("%s n=%d offset=%d", tostring(dt), n, off - 1)
               local tol = tol_of(dt)
               check(ac + bc, a + b, tol, "add " .. what)
               check(ac * 3, a * 3, tol, "mul number " .. what)
               check(ac:relu(), a:relu(), tol, "relu " .. what)
               check(ac:le(bc), a:le(b), 0, "le " .. what)
               check(lm.where(ac:gt(bc), ac, bc), lm.where(a:gt(b), a, b), 0, "where " .. what)
               check(ac:to(F32), a:to(F32), 0, "to float32 " .. what)
               check(ac:to(F16), a:to(F16), 0, "to float16 " .. what)
               if dt ~= I64 then
                  check(ac:addcmul(bc, ac, 0.5), a:addcmul(b, a, 0.5), tol, "addcmul " .. what)
               end
            end
         end
      end
   end)

   it("mixed dtypes: promotion and rounding through the common dtype", function()
      lm.manual_seed(4)
      local a16 = cpu_randn(SHAPE, F16)
      local a32 = cpu_randn(SHAPE, F32)
      local i32 = cpu_ints(SHAPE, I32, -9, 9)
      local s32 = lm.tensor(1.0001, { device = "cpu", dtype = F32 })
      local s64 = lm.tensor(3, { device = "cpu", dtype = I64 })
      local cases = {
         { "f16 + f32", function(x, y) return x + y end, a16, a32, 1e-5 },
         { "i32 * f32", function(x, y) return x * y end, i32, a32, 1e-5 },
         { "f16 + 0-dim f32", function(x, y) return x + y end, a16, s32, 1e-2 },
         { "i32 * 0-dim i64", function(x, y) return x * y end, i32, s64, 0 },
         { "f16 < f32", function(x, y) return x:lt(y) end, a16, a32, 0 },
         { "bf16 max f64", function(x, y) return x:maximum(y) end, a16:to(BF16), a32:to(F64), 1e-12 },
         { "i32 / i32", function(x, y) return x / y end, i32, i32 + 10, 1e-5 },
         { "u8 + bool", function(x, y) return x + y end, i32:abs():to(U8), a32:gt(0), 0 },
      }
      for _, c in ipairs(cases) do
         check(c[2](c[3]:to(DEV), c[4]:to(DEV)), c[2](c[3], c[4]), c[5], c[1])
      end
   end)

   it("NaN propagation of maximum, minimum and clamp; special values", function()
      local nan, inf = 0 / 0, math.huge
      local v = { nan, 1, -inf, inf, 0, -0.0, 2, nan, -3 }
      local w = { 1, nan, 2, -inf, -0.0, 0, nan, nan, 5 }
      for _, dt in ipairs(FLOATS) do
         local a = lm.tensor(v, { device = "cpu" }):to(dt)
         local b = lm.tensor(w, { device = "cpu" }):to(dt)
         local ac, bc = a:to(DEV), b:to(DEV)
         check(ac:maximum(bc), a:maximum(b), 0, "maximum " .. tostring(dt))
         check(ac:minimum(bc), a:minimum(b), 0, "minimum " .. tostring(dt))
         check(ac:clamp(-1, 1), a:clamp(-1, 1), 0, "clamp " .. tostring(dt))
         check(ac:clamp(0.5, nil), a:clamp(0.5, nil), 0, "clamp min " .. tostring(dt))
         check(ac:clamp(nil, 0.5), a:clamp(nil, 0.5), 0, "clamp max " .. tostring(dt))
         check(ac:relu(), a:relu(), 0, "relu " .. tostring(dt))
         check(ac:sign(), a:sign(), 0, "sign " .. tostring(dt))
         check(ac:eq(bc), a:eq(b), 0, "eq " .. tostring(dt))
         check(ac:ne(bc), a:ne(b), 0, "ne " .. tostring(dt))
      end
   end)

   it("clamp: every dtype and layout, integer tensors with float bounds", function()
      lm.manual_seed(5)
      for _, dt in ipairs({ F32, F64, F16, BF16, I64, I32 }) do
         local base = (dt == I64 or dt == I32) and cpu_ints(SHAPE, dt, -9, 9) or cpu_randn(SHAPE, dt)
         for _, v in ipairs(VIEWS) do
            local x, xc = pair(base, v[2])
            local tol = tol_of(dt)
            check(xc:clamp(-0.5, 0.75), x:clamp(-0.5, 0.75), tol, "clamp " .. tostring(dt) .. v[1])
            check(xc:clamp(-2, 3), x:clamp(-2, 3), tol, "clamp int bounds " .. tostring(dt))
            check(xc:clamp(nil, 1), x:clamp(nil, 1), tol, "clamp max " .. tostring(dt))
            check(xc:clamp(0, nil), x:clamp(0, nil), tol, "clamp min " .. tostring(dt))
         end
      end
   end)

   it("addcmul, addcdiv and where: dtypes, layouts, broadcasting", function()
      lm.manual_seed(6)
      for _, dt in ipairs(FLOATS) do
         local tol = tol_of(dt)
         local a0, b0, c0 = cpu_randn(SHAPE, dt), cpu_randn({ 5, 1, 1 }, dt), cpu_randn(SHAPE, dt)
         for _, v in ipairs(VIEWS) do
            local a, ac = pair(a0, v[2])
            local b, bc = pair(b0, function(t) return t end)
            local c, cc = pair(c0, v[2])
            local what = tostring(dt) .. " " .. v[1]
            check(ac:addcmul(bc, cc, 0.5), a:addcmul(b, c, 0.5), tol, "addcmul " .. what)
            check(ac:addcdiv(bc, cc:abs() + 1, -2), a:addcdiv(b, c:abs() + 1, -2), tol,
                  "addcdiv " .. what)
            check(lm.where(cc:gt(0), ac, bc), lm.where(c:gt(0), a, b), 0, "where " .. what)
            check(lm.where(cc:gt(0):to(U8), ac, bc), lm.where(c:gt(0):to(U8), a, b), 0,
                  "where uint8 condition " .. what)
         end
      end
      local i0 = cpu_ints(SHAPE, I64, -5, 5)
      local ic = i0:to(DEV)
      check(ic:addcmul(ic, ic, 2), i0:addcmul(i0, i0, 2), 0, "addcmul int64")
      check(lm.where(ic:gt(0), ic, ic * 2), lm.where(i0:gt(0), i0, i0 * 2), 0, "where int64")
      local f7 = cpu_randn({ 7 })
      check(lm.where(ic:gt(0), ic, f7:to(DEV)), lm.where(i0:gt(0), i0, f7), 0,
            "where int64 / float32")
   end)

   it("fused binary + unary (lm_binary_unary, lm_binary_scalar_unary)", function()
      local ffi = require("ffi")
      local C = require("lumen.C")
      local T = require("lumen.tensor")
      local outp = ffi.new("lm_tensor*[1]")
      lm.manual_seed(7)
      -- (op, uop): add/relu, mul/sigmoid, sub/tanh, div/exp, maximum/abs, minimum/neg
      local combos = { { 0, 6 }, { 2, 7 }, { 1, 8 }, { 3, 2 }, { 5, 1 }, { 6, 0 } }
      for _, dt in ipairs({ F32, F64 }) do
         local a0, b0 = cpu_randn(SHAPE, dt), cpu_randn(SHAPE, dt)
         for _, v in ipairs(VIEWS) do
            local a, ac = pair(a0, v[2])
            local b, bc = pair(b0, v[2])
            for _, cb in ipairs(combos) do
               local function run(x, y)
                  outp[0] = nil
                  assert.are.equal(0, C.lm_binary_unary(cb[1], T.cdata(x), T.cdata(y), 1.5, cb[2], outp))
                  return T.wrap(outp[0])
               end
               local function run_s(x)
                  outp[0] = nil
                  assert.are.equal(0, C.lm_binary_scalar_unary(cb[1], T.cdata(x), 0.75, 0, 0, 1.5,
                                                               cb[2], outp))
                  return T.wrap(outp[0])
               end
               local what = string.format("fused %d/%d %s %s", cb[1], cb[2], tostring(dt), v[1])
               check(run(ac, bc), run(a, b), tol_of(dt), what)
               check(run_s(ac), run_s(a), tol_of(dt), what .. " scalar")
            end
         end
      end
   end)

   it("in-place ops and out= overlapping an input (resolved as the CPU does)", function()
      lm.manual_seed(8)
      for _, dt in ipairs({ F32, F16, I64 }) do
         local base = dt == I64 and cpu_ints({ 64 }, dt, -9, 9) or cpu_randn({ 64 }, dt)
         local x, xc = base:clone(), base:to(DEV)
         -- the identical view: out = input
         x:mul_(2)
         xc:mul_(2)
         check(xc, x, 0, "mul_ " .. tostring(dt))
         -- partial overlap: out is the input shifted by one element
         local function shift(t) t:narrow(1, 2, 63):add_(t:narrow(1, 1, 63)) end
         shift(x)
         shift(xc)
         check(xc, x, tol_of(dt), "add_ shifted " .. tostring(dt))
         -- a reversed-stride overlap through a transpose
         local m, mc = cpu_randn({ 8, 8 }, F32) -- luacheck: ignore 311
         mc = m:to(DEV)
         m:add_(m:t())
         mc:add_(mc:t())
         check(mc, m, 1e-6, "add_ transposed self")
      end
   end)

   it("copy: every dtype pair, dense", function()
      lm.manual_seed(9)
      local DTS = { F32, F64, F16, BF16, I64, I32, U8, BOOL }
      local src = cpu_randn({ 3, 4, 5 }, F64) * 100
      src:narrow(1, 1, 1):fill_(0)
      for _, sd in ipairs(DTS) do
         local s = sd == U8 and src:abs():to(sd) or src:to(sd)
         local sc = s:to(DEV)
         for _, dd in ipairs(DTS) do
            local what = tostring(sd) .. " -> " .. tostring(dd)
            check(sc:to(dd), s:to(dd), 0, what)
         end
      end
      -- special values into every dtype
      local sp = lm.tensor({ 0 / 0, math.huge, -math.huge, 1e10, -1e10, 0.5, -0.5, 255.7, 65519 },
                           { device = "cpu", dtype = F64 })
      for _, dd in ipairs({ F32, F16, BF16 }) do
         check(sp:to(DEV):to(dd), sp:to(dd), 0, "special values f64 -> " .. tostring(dd))
         check(sp:to(F32):to(DEV):to(dd), sp:to(F32):to(dd), 0, "special values f32 -> " .. tostring(dd))
      end
      local finite = lm.tensor({ 1e10, -1e10, 0.5, -0.5, 255.7, -300.2, 3e9 }, { device = "cpu", dtype = F64 })
      for _, dd in ipairs({ I64, I32, U8, BOOL }) do
         check(finite:to(DEV):to(dd), finite:to(dd), 0, "f64 -> " .. tostring(dd))
         check(finite:to(F32):to(DEV):to(dd), finite:to(F32):to(dd), 0, "f32 -> " .. tostring(dd))
      end
   end)

   it("copy: contiguous <-> channels_last (tiled transpose), strided and broadcast sources", function()
      lm.manual_seed(10)
      for _, dt in ipairs({ F32, F64, F16, BF16, I64, U8, BOOL }) do
         for _, sh in ipairs({ { 2, 64, 7, 9 }, { 3, 3, 33, 31 }, { 1, 40, 1, 70 }, { 5, 37, 6, 5 } }) do
            local x = cpu_randn(sh):mul(10):to(dt)
            local xc = x:to(DEV)
            local what = tostring(dt) .. " " .. H.fmt_list(sh)
            check(xc:contiguous(lm.channels_last), x:contiguous(lm.channels_last), 0, "to NHWC " .. what)
            local xl = x:contiguous(lm.channels_last)
            check(xl:to(DEV):contiguous(), xl:contiguous(), 0, "to NCHW " .. what)
            -- with a dtype change at once
            check(xc:to(F16, lm.channels_last), x:to(F16, lm.channels_last), 0, "to f16 NHWC " .. what)
            check(xl:to(DEV):to(F32, lm.contiguous_format), xl:to(F32, lm.contiguous_format), 0,
                  "NHWC to f32 NCHW " .. what)
            check(xl:to(DEV):to(BF16, lm.contiguous_format), xl:to(BF16, lm.contiguous_format), 0,
                  "NHWC to bf16 NCHW " .. what)
            -- non-dense sources
            local v = function(t) return t:narrow(3, 1, sh[3] - 1):permute(1, 3, 4, 2) end
            check(v(xc):contiguous(), v(x):contiguous(), 0, "strided " .. what)
         end
      end
      -- broadcasting into a layout
      local src = cpu_randn({ 5, 1, 1 })
      local d = lm.zeros({ 2, 5, 3, 4 }, { device = "cpu" }):contiguous(lm.channels_last)
      local dc = d:to(DEV)
      d:copy_(src)
      dc:copy_(src:to(DEV))
      check(dc, d, 0, "broadcast copy_")
      local e, ec = lm.zeros({ 4, 6 }, { device = "cpu", dtype = F16 }) -- luacheck: ignore 311
      ec = e:to(DEV)
      e:t():copy_(cpu_randn({ 6, 1 }, F64))
      ec:t():copy_(cpu_randn({ 6, 1 }, F64):to(DEV))
      assert.are.equal(DEV, ec:device())
   end)

   it("copy: overlap of source and destination", function()
      for _, dt in ipairs({ F32, F16, I64 }) do
         local base = cpu_randn({ 40 }):mul(10):to(dt)
         local x, xc = base:clone(), base:to(DEV)
         x:narrow(1, 2, 39):copy_(x:narrow(1, 1, 39))
         xc:narrow(1, 2, 39):copy_(xc:narrow(1, 1, 39))
         check(xc, x, 0, "shifted copy_ " .. tostring(dt))
         x:narrow(1, 1, 39):copy_(x:narrow(1, 2, 39))
         xc:narrow(1, 1, 39):copy_(xc:narrow(1, 2, 39))
         check(xc, x, 0, "shifted copy_ back " .. tostring(dt))
         x:copy_(x)
         xc:copy_(xc)
         check(xc, x, 0, "self copy_ " .. tostring(dt))
         local m, mc = cpu_randn({ 6, 6 }):to(dt) -- luacheck: ignore 311
         mc = m:to(DEV)
         m:copy_(m:t())
         mc:copy_(mc:t())
         check(mc, m, 0, "transposed self copy_ " .. tostring(dt))
      end
   end)

   it("fill_ and zero_: every dtype, dense and strided", function()
      for _, dt in ipairs({ F32, F64, F16, BF16, I64, I32, U8, BOOL }) do
         for _, v in ipairs(VIEWS) do
            for _, val in ipairs({ 0, 1, 3 }) do
               local x, xc = pair(lm.zeros(SHAPE, { device = "cpu", dtype = dt }) + 0, v[2])
               x:fill_(val)
               xc:fill_(val)
               check(xc, x, 0, string.format("fill_ %s %s %s", tostring(val), tostring(dt), v[1]))
            end
            local x, xc = pair(lm.ones(SHAPE, { device = "cpu", dtype = dt }), v[2])
            x:zero_()
            xc:zero_()
            check(xc, x, 0, "zero_ " .. tostring(dt) .. " " .. v[1])
         end
      end
      local z = lm.zeros({ 6 }, { device = "cpu" })
      local zc = z:to(DEV)
      z:narrow(1, 2, 3):fill_(-1.5)
      zc:narrow(1, 2, 3):fill_(-1.5)
      check(zc, z, 0, "fill_ of a narrow view")
   end)

   it("gradients through elementwise ops on cuda:0 match the CPU's", function()
      lm.manual_seed(11)
      for _, dt in ipairs({ F32, F64 }) do
         for _, v in ipairs({ VIEWS[1], VIEWS[2] }) do
            local x0, w0, g0 = cpu_randn(SHAPE, dt), cpu_randn(SHAPE, dt), cpu_randn(SHAPE, dt)
            local function run(dev)
               -- fresh leaves (x0:to("cpu") would be x0 itself)
               local x = v[2](x0:clone():to(dev)):requires_grad_()
               local w = v[2](w0:clone():to(dev)):requires_grad_()
               local y = (x * w):relu() + x:sigmoid() * w:tanh() - x:pow(2) / 3 +
                         x:clamp(-0.5, 0.5) + lm.where(x:gt(0), x, w * 0.1) +
                         (x:abs() + 1):log() + x:exp():mul(0.1) + x:div(w:abs() + 1) +
                         x:maximum(w) - (x - w):neg()
               y:backward(v[2](g0:to(dev)))
               return y, x.grad, w.grad
            end
            local y, gx, gw = run("cpu")
            local yc, gxc, gwc = run(DEV)
            local tol = dt == F32 and 1e-5 or 1e-12
            check(yc, y, tol, "forward " .. tostring(dt) .. " " .. v[1])
            check(gxc, gx, tol, "x.grad " .. tostring(dt) .. " " .. v[1])
            check(gwc, gw, tol, "w.grad " .. tostring(dt) .. " " .. v[1])
         end
      end
   end)

   it("bad input: clear errors, nothing crashes", function()
      local x = cpu_randn({ 3 }):to(DEV)
      local b = x:gt(0)
      H.assert_error_like("neg", "bool", function() return -b end)
      H.assert_error_like("sub", "bool", function() return b - b end)
      H.assert_error_like("add", "device", function() return x + cpu_randn({ 3 }) end)
      H.assert_error_like("add", "must match", function() return x + cpu_randn({ 4 }):to(DEV) end)
      H.assert_error_like("copy_", "must match", function() x:copy_(cpu_randn({ 2 }):to(DEV)) end)
      local e = x:expand({ 2, 3 })
      H.assert_error_like("add_", "memory location", function() e:add_(1) end)
      local i = lm.tensor({ 1, 2 }, { device = "cpu", dtype = I64 }):to(DEV)
      H.assert_error_like("pow", "negative", function() return i:pow(-1) end)
      H.assert_error_like("addcdiv", "integer division", function() return i:addcdiv(i, i) end)
   end)
end)
