-- spec/bf16_gemm_spec.lua -- matmul and linear on bfloat16: the native bf16 GEMM
-- (kernels/cpu/gemm_avx512bf16.c, vdpbf16ps, where the CPU has AVX512_BF16), the float32 route
-- (isa 3) and the portable emulation of the packed kernel (isa 1), against float32 computed
-- from the same bfloat16-rounded inputs: random shapes (odd k, k deeper than one packed block),
-- transposed / strided / broadcast operands, batched products and vectors; F.linear's output
-- and gradients in bfloat16; the test device and meta; bad input.
local H = require("spec.helpers")
local lm = H.lm
local C = require("lumen.C")
local F = lm.F

-- the ISA paths this CPU has: the best, AVX-512 BF16 below AMX (vdpbf16ps), 3 (float32 route)
-- and 1 (portable), each once
local function isas()
   local best = C.lm_cpu_set_isa(C.LM_ISA_AUTO)
   local r = { best }
   for _, i in ipairs({ C.LM_ISA_AVX512_BF16, 3, 1 }) do
      if i < best then r[#r + 1] = i end
   end
   return r
end

local rnd
do
   local s = 12345
   rnd = function(n) -- 1..n
      s = (s * 1103515245 + 12345) % 2147483648
      return 1 + math.floor(s / 65536) % n
   end
end

-- bf16 result against float32 on the rounded inputs: one bf16 rounding (2^-8 relative) plus the
-- float32 sums' own differences, relative to the sum of |terms| (|a| @ |b|)
local function assert_bf16_close(got, a, b, what)
   assert(got:dtype() == lm.bfloat16, what .. ": dtype " .. tostring(got:dtype()))
   local want = H.values(a:float():matmul(b:float()))
   local mag = H.values(a:float():abs():matmul(b:float():abs()))
   local g = H.values(got)
   assert(#g == #want, what .. ": sizes")
   for i = 1, #want do
      local tol = 0.0040 * math.abs(want[i]) + 1e-5 * mag[i] + 1e-30
      assert(math.abs(g[i] - want[i]) <= tol, ("%s: value %d got %.9g want %.9g (tol %.3g)")
         :format(what, i, g[i], want[i], tol))
   end
end

local function bf(sizes) return lm.randn(sizes):bfloat16() end

describe("bfloat16 matmul", function()
   after_each(function() C.lm_gemm_set_isa(0) end)

   it("matches float32 on random 2-D shapes, odd k and deep k, every layout and ISA", function()
      local dims = { 1, 2, 3, 7, 17, 33, 64, 65, 130 }
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for t = 1, 36 do
            local m, n, k = dims[rnd(#dims)], dims[rnd(#dims)], dims[rnd(#dims)]
            if t % 9 == 0 then k = 1100 + rnd(3) end -- deeper than one packed k block
            local a, b
            local la, lb = rnd(3), rnd(3)
            if la == 1 then a = bf({ m, k })
            elseif la == 2 then a = bf({ k, m }):t()
            else a = bf({ m, 2 * k }):narrow(2, 1, k) end
            if lb == 1 then b = bf({ k, n })
            elseif lb == 2 then b = bf({ n, k }):t()
            else b = bf({ 2 * k + 1, n }):narrow(1, 2, k) end
            local c = a:matmul(b)
            H.assert_sizes(c, { m, n })
            H.assert_strides(c, H.contig_strides({ m, n }))
            assert_bf16_close(c, a, b, ("isa %d %dx%dx%d A%d B%d"):format(isa, m, n, k, la, lb))
         end
      end
   end)

   it("is the same result on every ISA within one bf16 rounding", function()
      local a, b = bf({ 50, 77 }), bf({ 77, 40 })
      local ref
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         local c = a:matmul(b):float()
         if ref then H.assert_close(c, H.values(ref), 1.6e-2, "isa " .. isa) else ref = c end
      end
   end)

   it("batches with broadcast, and takes vectors, as float32 does", function()
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         local cases = {
            { { 3, 5, 7 }, { 7, 4 } },          -- (batch, T, k) x (k, n): one GEMM
            { { 2, 1, 5, 9 }, { 3, 9, 6 } },    -- broadcast batch dims
            { { 4, 5, 8 }, { 4, 8, 3 } },       -- one product per batch entry
            { { 7 }, { 7 } },                   -- dot
            { { 9 }, { 2, 9, 5 } },             -- vector . batched matrix
            { { 3, 6, 9 }, { 9 } },             -- batched matrix . vector
            { { 40, 33 }, { 33 } },             -- matrix . vector
         }
         for _, cs in ipairs(cases) do
            local a, b = bf(cs[1]), bf(cs[2])
            local c = a:matmul(b)
            local c32 = a:float():matmul(b:float())
            H.assert_sizes(c, c32:size())
            assert(c:dtype() == lm.bfloat16)
            H.assert_close(c:float(), H.values(c32), 2e-2,
               ("isa %d %s x %s"):format(isa, H.fmt_list(cs[1]), H.fmt_list(cs[2])))
         end
         -- a broadcast (expanded) operand and a transposed batched one
         local a = bf({ 1, 6, 10 }):expand({ 3, 6, 10 })
         local b = bf({ 3, 4, 10 }):transpose(2, 3)
         H.assert_close(a:matmul(b):float(), H.values(a:float():matmul(b:float())), 2e-2,
            "expanded x transposed")
      end
   end)

   it("runs on the test device (bit-identical) and on meta (sizes only)", function()
      local a, b = bf({ 20, 45 }), bf({ 45, 33 })
      local c = a:matmul(b)
      local cs = a:to("sim:0"):matmul(b:to("sim:0"))
      assert(cs:device() == "sim:0" and cs:dtype() == lm.bfloat16)
      H.assert_values(cs:to("cpu"):float(), H.values(c:float()))
      local cm = a:to("meta"):matmul(b:to("meta"))
      assert(cm:device() == "meta" and cm:dtype() == lm.bfloat16)
      H.assert_sizes(cm, { 20, 33 })
   end)

   it("float16 keeps the float32 route", function()
      local a, b = lm.randn({ 9, 13 }):half(), lm.randn({ 13, 5 }):half()
      local c = a:matmul(b)
      assert(c:dtype() == lm.float16)
      H.assert_close(c:float(), H.values(a:float():matmul(b:float())), 2e-3)
   end)

   it("rejects mixed dtypes, naming matmul", function()
      H.assert_error_like("matmul", "dtype",
         function() return bf({ 2, 3 }):matmul(lm.randn({ 3, 2 })) end)
      H.assert_error_like("matmul", "shapes",
         function() return bf({ 2, 3 }):matmul(bf({ 4, 2 })) end)
   end)
end)

describe("F.linear on bfloat16", function()
   after_each(function() C.lm_gemm_set_isa(0) end)

   it("gives bfloat16 output and gradients close to float32 on every ISA", function()
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, shp in ipairs({ { { 6, 33 }, 17 }, { { 2, 5, 64 }, 7 }, { { 3, 1 }, 3 } }) do
            local xs, fout = shp[1], shp[2]
            local fin = xs[#xs]
            local x = bf(xs):requires_grad_()
            local w = bf({ fout, fin }):requires_grad_()
            local b = bf({ fout }):requires_grad_()
            local y = F.linear(x, w, b)
            assert(y:dtype() == lm.bfloat16, "output dtype")
            local gy = bf(y:size())
            y:backward(gy)
            -- the float32 reference on the same (rounded) values
            local x32 = x:detach():float():requires_grad_()
            local w32 = w:detach():float():requires_grad_()
            local b32 = b:detach():float():requires_grad_()
            local y32 = F.linear(x32, w32, b32)
            y32:backward(gy:float())
            local what = ("isa %d %s -> %d"):format(isa, H.fmt_list(xs), fout)
            H.assert_close(y:float(), H.values(y32), 3e-2, what .. " y")
            for _, pair in ipairs({ { x, x32, "x" }, { w, w32, "w" }, { b, b32, "b" } }) do
               local g, g32 = pair[1].grad, pair[2].grad
               assert(g:dtype() == lm.bfloat16, what .. " grad " .. pair[3] .. " dtype")
               H.assert_sizes(g, g32:size())
               H.assert_close(g:float(), H.values(g32), 3e-2, what .. " grad " .. pair[3])
            end
         end
      end
   end)
end)

describe("lm_addmm_ and F.linear's bias in 16 bits", function()
   after_each(function() C.lm_gemm_set_isa(0) end)
   local T = require("lumen.tensor")
   local ffi = require("ffi")

   it("adds the bias to the float32 sums and rounds once (torch.addmm), on every ISA", function()
      -- 1 + 2^-9 rounds to 1 in bfloat16; with the bias 2^-8 the one rounding of the sum gives
      -- 1 + 2^-7, while rounding the product first and then the sum gives 1 (a tie, to even)
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, dt in ipairs({ lm.bfloat16, lm.float16 }) do
            local x = lm.tensor({ { 1, 2 ^ -9 } }):to(dt)
            local w = lm.tensor({ { 1, 1 } }):to(dt)
            local b = lm.tensor({ 2 ^ -8 }):to(dt)
            local y = F.linear(x, w, b)
            assert(y:dtype() == dt)
            local want = dt == lm.bfloat16 and 1 + 2 ^ -7 or 1 + 3 * 2 ^ -9
            assert.are.equal(want, y:float():item(), "isa " .. isa .. " " .. tostring(dt))
         end
      end
   end)

   it("matches float32 on random shapes (batched input, bias), every ISA", function()
      lm.manual_seed(5)
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, s in ipairs({ { 1, 7, 3 }, { 5, 17, 64 }, { 9, 130, 33 }, { 40, 1100, 24 } }) do
            local x, w, b = bf({ 2, s[1], s[2] }), bf({ s[3], s[2] }), bf({ s[3] })
            local y = F.linear(x, w, b)
            local ref = x:float():matmul(w:float():t()) + b:float()
            H.assert_sizes(y, { 2, s[1], s[3] })
            H.assert_close(y:float(), H.values(ref), 2e-2, "isa " .. isa)
         end
      end
   end)

   it("rejects bad input, naming addmm", function()
      local o = lm.zeros({ 2, 3 }):bfloat16()
      local a, b = bf({ 2, 4 }), bf({ 4, 3 })
      local function st(out, x, y) return C.lm_addmm_(out._c, x._c, y._c) end
      assert.are_not.equal(0, st(o, a, bf({ 5, 3 })))
      assert.truthy(ffi.string(C.lm_last_error()):find("addmm", 1, true))
      assert.are_not.equal(0, st(o, a:float(), b))
      assert.truthy(ffi.string(C.lm_last_error()):find("one dtype", 1, true))
      assert.are_not.equal(0, st(T.raw.expand(bf({ 3 }), { 2, 3 }), a, b))
      assert.are_not.equal(0, st(a, a, bf({ 4, 4 })))
      assert.truthy(ffi.string(C.lm_last_error()):find("share memory", 1, true))
      assert.are.equal(0, st(o, a, b))
      -- F.linear: the bias in the input's dtype, as torch.nn.functional.linear
      assert.has_error(function() F.linear(a, bf({ 3, 4 }), lm.zeros({ 3 }):half()) end,
                       "lumen.linear: bias (float16) must have the input's dtype (bfloat16)")
   end)
end)
