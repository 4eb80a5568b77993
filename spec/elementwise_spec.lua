-- spec/elementwise_spec.lua -- elementwise math (docs/api.md "Math"): values against PyTorch 1.13
-- (spec/fixtures/core/values.lua), operators, broadcasting, type promotion, in-place forms,
-- matmul and cat. The output layout rules of the memory-format spec are in memory_format_spec.
local H = require("spec.helpers")
local lm = H.lm

local V = H.fixture("values")

local TOL = { f32 = 2e-6, f64 = 1e-12 }
local DT = { f32 = lm.float32, f64 = lm.float64 }

describe("elementwise values against PyTorch", function()
   for _, key in ipairs({ "f32", "f64" }) do
      local dt, tol, R = DT[key], TOL[key], V[key]
      local function T(vals) return lm.tensor(vals, { dtype = dt }) end
      local y8 = { unpack(V.y, 1, 8) }

      it(key .. ": unary ops", function()
         local x, p = T(V.x), T(V.pos)
         local cases = {
            { "neg", x:neg() }, { "neg", -x }, { "abs", x:abs() }, { "exp", x:exp() },
            { "relu", x:relu() }, { "sigmoid", x:sigmoid() }, { "tanh", x:tanh() },
            { "log", p:log() }, { "sqrt", p:sqrt() },
         }
         for _, c in ipairs(cases) do
            H.assert_dtype(c[2], dt, c[1])
            H.assert_close(c[2], R[c[1]], tol, c[1])
         end
      end)

      it(key .. ": pow", function()
         local x, p = T(V.x), T(V.pos)
         H.assert_close(x:pow(2), R.pow2, tol, "x^2")
         H.assert_close(x ^ 2, R.pow2, tol, "x ^ 2 operator")
         H.assert_close(x:pow(3), R.pow3, tol, "x^3")
         H.assert_close(p:pow(0.5), R.powhalf, tol, "p^0.5")
         H.assert_close(p:pow(T(y8)), R.pow_xy, tol, "p^y")
         H.assert_close(2 ^ x, R.two_pow, tol, "2^x")
         H.assert_dtype(2 ^ x, dt)
      end)

      it(key .. ": clamp", function()
         local x = T(V.x)
         H.assert_close(x:clamp(-1, 2), R.clamp, 0, "clamp(-1, 2)")
         H.assert_close(x:clamp(0.5, nil), R.clamp_lo, 0, "clamp(0.5, nil)")
         H.assert_close(x:clamp(nil, 0.5), R.clamp_hi, 0, "clamp(nil, 0.5)")
      end)

      it(key .. ": binary ops, methods and operators", function()
         local x, y = T(V.x), T(V.y)
         H.assert_close(x + y, R.add, tol, "+")
         H.assert_close(x:add(y), R.add, tol, "add")
         H.assert_close(x - y, R.sub, tol, "-")
         H.assert_close(x:sub(y), R.sub, tol, "sub")
         H.assert_close(x * y, R.mul, tol, "*")
         H.assert_close(x:mul(y), R.mul, tol, "mul")
         H.assert_close(x / y, R.div, tol, "/")
         H.assert_close(x:div(y), R.div, tol, "div")
         H.assert_close(1 / y, R.rdiv, tol, "1 / y")
         H.assert_close(x:add(y, 2.5), R.add_alpha, tol, "add alpha")
         H.assert_close(x:addcmul(y, y, 0.5), R.addcmul, tol, "addcmul")
         H.assert_dtype(x + y, dt)
      end)
   end

   it("scalars on either side", function()
      local x = lm.tensor({ 1, 2, 4 }, { dtype = lm.float32 })
      H.assert_values(x + 1, { 2, 3, 5 })
      H.assert_values(1 + x, { 2, 3, 5 })
      H.assert_values(x - 1, { 0, 1, 3 })
      H.assert_values(1 - x, { 0, -1, -3 })
      H.assert_values(x * 3, { 3, 6, 12 })
      H.assert_values(3 * x, { 3, 6, 12 })
      H.assert_values(x / 2, { 0.5, 1, 2 })
      H.assert_values(4 / x, { 4, 2, 1 })
      H.assert_values(x:sub(1, 2), { -1, 0, 2 })
      H.assert_values(x:addcmul(x, x), { 2, 6, 20 })
   end)

   it("special values follow IEEE", function()
      local z = lm.tensor({ 0, -1, 1 }, { dtype = lm.float32 })
      local r = H.values(z:log())
      assert.equal(-math.huge, r[1])
      assert.is_true(r[2] ~= r[2])
      assert.equal(0, r[3])
      local d = H.values(lm.tensor({ 1, -1, 0 }, { dtype = lm.float32 }) / 0)
      assert.equal(math.huge, d[1])
      assert.equal(-math.huge, d[2])
      assert.is_true(d[3] ~= d[3])
      local s = H.values(lm.tensor({ -1000, 1000 }, { dtype = lm.float32 }):sigmoid())
      assert.equal(0, s[1])
      assert.equal(1, s[2])
   end)

   it("clamp with lo > hi gives hi everywhere (PyTorch)", function()
      H.assert_values(lm.tensor({ 0, 5 }):clamp(3, 1), { 1, 1 })
   end)

   it("clamp with a NaN bound gives NaN everywhere, and no gradient (PyTorch)", function()
      for _, args in ipairs({ { -1, 0 / 0 }, { 0 / 0, 1 }, { nil, 0 / 0 }, { 0 / 0 } }) do
         local x = lm.tensor({ -2, 0, 0.5, 3 }, { dtype = lm.float32 }):requires_grad_(true)
         local y = x:clamp(args[1], args[2])
         for _, v in ipairs(H.values(y)) do assert.is_true(v ~= v) end
         y:sum():backward()
         H.assert_values(x.grad, { 0, 0, 0, 0 })
         local z = lm.tensor({ -2, 0, 0.5, 3 }, { dtype = lm.float64 })
         z:clamp_(args[1], args[2])
         for _, v in ipairs(H.values(z)) do assert.is_true(v ~= v) end
      end
      -- an integer tensor with a NaN bound: the promoted (floating) result is NaN
      local i = lm.tensor({ 1, 2 }, { dtype = lm.int64 }):clamp(0, 0 / 0)
      assert.is_true(i:is_floating_point())
      for _, v in ipairs(H.values(i)) do assert.is_true(v ~= v) end
   end)

   it("clamp with one bound and on integers", function()
      local i = lm.tensor({ -3, 3 }, { dtype = lm.int64 })
      local c = i:clamp(-1, 2)
      H.assert_dtype(c, lm.int64)
      H.assert_values(c, { -1, 2 })
   end)

   it("where picks elementwise, broadcasting cond, a and b; numbers allowed", function()
      local cond = lm.tensor({ true, false, true }, { dtype = lm.bool })
      local a = lm.tensor({ 1, 2, 3 }, { dtype = lm.float32 })
      local b = lm.tensor({ 10, 20, 30 }, { dtype = lm.float32 })
      H.assert_values(lm.where(cond, a, b), { 1, 20, 3 })
      H.assert_values(lm.where(cond, a, 0), { 1, 0, 3 })
      H.assert_values(lm.where(cond, -1, b), { -1, 20, -1 })
      local c2 = lm.tensor({ { true }, { false } }, { dtype = lm.bool })
      local w = lm.where(c2, a, b)
      H.assert_sizes(w, { 2, 3 })
      H.assert_values(w, { 1, 2, 3, 10, 20, 30 })
   end)
end)

describe("broadcasting", function()
   it("aligns trailing dims and expands size-1 dims", function()
      local a = H.seq({ 3, 1 })
      local b = H.seq({ 1, 4 })
      local r = a + b
      H.assert_layout(r, { 3, 4 }, { 4, 1 })
      H.assert_values(r, { 0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5 })
      H.assert_sizes(H.seq({ 5, 1, 3 }) * H.seq({ 4, 1 }), { 5, 4, 3 })
      H.assert_sizes(H.seq({ 2, 3, 4 }) - H.seq({ 4 }), { 2, 3, 4 })
      H.assert_sizes(lm.zeros({ 0, 3 }) + lm.zeros({ 1, 3 }), { 0, 3 })
   end)
   it("with 0-dim tensors", function()
      local s = lm.full({}, 2)
      local r = H.seq({ 2, 2 }) * s
      H.assert_sizes(r, { 2, 2 })
      H.assert_values(r, { 0, 2, 4, 6 })
      local z = s + s
      assert.equal(0, z:dim())
      assert.equal(4, z:item())
   end)
   it("fails on incompatible sizes", function()
      H.assert_error("add", function() return H.seq({ 3 }) + H.seq({ 4 }) end)
      H.assert_error("mul", function() return H.seq({ 2, 3 }):mul(H.seq({ 3, 2 })) end)
      H.assert_error("where", lm.where, lm.zeros({ 2 }, { dtype = lm.bool }), H.seq({ 3 }),
         H.seq({ 3 }))
      H.assert_error("addcmul", function()
         return H.seq({ 3 }):addcmul(H.seq({ 2 }), H.seq({ 3 }))
      end)
   end)
end)

describe("type promotion", function()
   local function T(v, dt) return lm.tensor(v, { dtype = dt }) end
   local i64 = function() return T({ 1, 2 }, lm.int64) end
   local i32 = function() return T({ 1, 2 }, lm.int32) end
   local u8 = function() return T({ 1, 2 }, lm.uint8) end
   local b = function() return T({ true, false }, lm.bool) end
   local f32 = function() return T({ 1, 2 }, lm.float32) end
   local f64 = function() return T({ 1, 2 }, lm.float64) end
   local f16 = function() return T({ 1, 2 }, lm.float16) end
   local bf16 = function() return T({ 1, 2 }, lm.bfloat16) end
   local z = function(v, dt) return lm.full({}, v, { dtype = dt }) end

   -- {result, expected dtype, expected values} (PyTorch 1.13)
   local cases = {
      { "int64 + float32", function() return i64() + f32() end, lm.float32, { 2, 4 } },
      { "bool + int64", function() return b() + i64() end, lm.int64, { 2, 2 } },
      { "bool + bool", function() return b() + b() end, lm.bool, { true, false } },
      { "int32 + int64", function() return i32() + i64() end, lm.int64, { 2, 4 } },
      { "uint8 + int32", function() return u8() + i32() end, lm.int32, { 2, 4 } },
      { "uint8 + bool", function() return u8() + b() end, lm.uint8, { 2, 2 } },
      { "float16 + bfloat16", function() return f16() + bf16() end, lm.float32, { 2, 4 } },
      { "float16 + float32", function() return f16() + f32() end, lm.float32, { 2, 4 } },
      { "float64 + float32", function() return f64() + f32() end, lm.float64, { 2, 4 } },
      { "float16 + 2.5", function() return f16() + 2.5 end, lm.float16, { 3.5, 4.5 } },
      { "float16 + 2", function() return f16() + 2 end, lm.float16, { 3, 4 } },
      { "int64 + 2.5", function() return i64() + 2.5 end, lm.float32, { 3.5, 4.5 } },
      { "int64 + 2", function() return i64() + 2 end, lm.int64, { 3, 4 } },
      { "bool + 2", function() return b() + 2 end, lm.int64, { 3, 2 } },
      { "bool + 2.5", function() return b() + 2.5 end, lm.float32, { 3.5, 2.5 } },
      { "int32 * true", function() return i32() * true end, lm.int32, { 1, 2 } },
      { "uint8 - 1", function() return u8() - 1 end, lm.uint8, { 0, 1 } },
      { "int64 + 0-dim float64", function() return i64() + z(1.5, lm.float64) end, lm.float64,
         { 2.5, 3.5 } },
      { "float32 + 0-dim float64", function() return f32() + z(1.5, lm.float64) end, lm.float32,
         { 2.5, 3.5 } },
      { "float16 + 0-dim float32", function() return f16() + z(1.5, lm.float32) end, lm.float16,
         { 2.5, 3.5 } },
      { "int32 + 0-dim int64", function() return i32() + z(3, lm.int64) end, lm.int32, { 4, 5 } },
      { "uint8 + 0-dim int64", function() return u8() + z(3, lm.int64) end, lm.uint8, { 4, 5 } },
      { "bool + 0-dim float64", function()
         return b() + z(1, lm.float64)
      end, lm.float64, { 2, 1 } },
      { "0-dim int64 + 0-dim float32", function() return z(3, lm.int64) + z(1.5, lm.float32) end,
         lm.float32, { 4.5 } },
      { "0-dim float64 + 0-dim float32", function() return z(1, lm.float64) + z(1, lm.float32) end,
         lm.float64, { 2 } },
      { "int64 / int64 is true division", function()
         return i64() / i64()
      end, lm.float32, { 1, 1 } },
      { "int64 / 2", function() return T({ 7, -7 }, lm.int64) / 2 end, lm.float32, { 3.5, -3.5 } },
      { "int64 ^ 2", function() return i64():pow(2) end, lm.int64, { 1, 4 } },
      { "int64 ^ 0.5", function() return T({ 1, 4 }, lm.int64):pow(0.5) end, lm.float32, { 1, 2 } },
      { "exp(int64) is float32", function()
         return T({ 0 }, lm.int64):exp()
      end, lm.float32, { 1 } },
      { "sqrt(bool) is float32", function()
         return T({ true }, lm.bool):sqrt()
      end, lm.float32, { 1 } },
      { "abs(int64) stays int64", function() return T({ 1, -2 }, lm.int64):abs() end, lm.int64,
         { 1, 2 } },
      { "neg(int64) stays int64", function()
         return -T({ 1, -2 }, lm.int64)
      end, lm.int64, { -1, 2 } },
      { "relu(int64) stays int64", function() return T({ 1, -2 }, lm.int64):relu() end, lm.int64,
         { 1, 0 } },
   }
   for _, c in ipairs(cases) do
      it(c[1], function()
         local r = c[2]()
         H.assert_dtype(r, c[3], c[1])
         H.assert_values(r, c[4], c[1])
      end)
   end

   it("float16 / bfloat16 results are rounded to the storage type", function()
      -- 2048 + 1 = 2049 is not a float16; round-to-nearest-even gives 2048 (PyTorch: the same)
      H.assert_values(lm.full({ 1 }, 2048, { dtype = lm.float16 }) + 1, { 2048 })
      H.assert_values(lm.full({ 1 }, 2048, { dtype = lm.float16 }) + 3, { 2052 })
      H.assert_values(lm.full({ 1 }, 256, { dtype = lm.bfloat16 }) + 1, { 256 })
      H.assert_dtype(lm.full({ 1 }, 256, { dtype = lm.bfloat16 }) + 1, lm.bfloat16)
   end)

   it("mixed dtypes and formats: dtype promotes, layout follows the first operand", function()
      local ha = H.seq({ 2, 3, 4, 5 }, lm.channels_last, lm.float16)
      local fb = H.seq({ 2, 3, 4, 5 })
      local r = ha + fb
      H.assert_dtype(r, lm.float32)
      H.assert_strides(r, { 60, 1, 15, 3 })
      local e = H.iota(120)
      for k = 1, #e do e[k] = 2 * e[k] end
      H.assert_close(r, e, 0)
      H.assert_strides(fb + ha, { 60, 20, 5, 1 })
   end)

   it("uint8 arithmetic wraps around", function()
      H.assert_values(T({ 1, 2 }, lm.uint8) - 3, { 254, 255 })
   end)
end)

describe("in-place forms", function()
   it("return self and modify it", function()
      local x = lm.tensor({ 1, -2, 3 }, { dtype = lm.float32 })
      assert.equal(x, x:add_(1))
      H.assert_values(x, { 2, -1, 4 })
      assert.equal(x, x:mul_(2))
      H.assert_values(x, { 4, -2, 8 })
      assert.equal(x, x:relu_())
      H.assert_values(x, { 4, 0, 8 })
      assert.equal(x, x:fill_(3))
      H.assert_values(x, { 3, 3, 3 })
      assert.equal(x, x:zero_())
      H.assert_values(x, { 0, 0, 0 })
      assert.equal(x, x:copy_(lm.tensor({ 7, 8, 9 }, { dtype = lm.int64 })))
      H.assert_values(x, { 7, 8, 9 })
      H.assert_dtype(x, lm.float32)
   end)
   it("broadcast the other operand into self", function()
      local x = lm.zeros({ 2, 3 })
      x:add_(lm.tensor({ 1, 2, 3 }, { dtype = lm.float32 }))
      H.assert_values(x, { 1, 2, 3, 1, 2, 3 })
      x:copy_(lm.tensor({ { 5 }, { 6 } }, { dtype = lm.float32 }))
      H.assert_values(x, { 5, 5, 5, 6, 6, 6 })
   end)
   it("write through views into the base tensor", function()
      local x = lm.zeros({ 3, 4 })
      x:narrow(2, 2, 2):fill_(1)
      x:select(1, 3):add_(5)
      H.assert_values(x, { 0, 1, 1, 0, 0, 1, 1, 0, 5, 6, 6, 5 })
   end)
   it("copy_ converts dtypes (float to int truncates toward zero)", function()
      local i = lm.zeros({ 3 }, { dtype = lm.int64 })
      i:copy_(lm.tensor({ 2.7, -2.7, 0.5 }, { dtype = lm.float32 }))
      H.assert_values(i, { 2, -2, 0 })
      local h = lm.zeros({ 2 }, { dtype = lm.float16 })
      h:copy_(lm.tensor({ 0.5, 1 / 3 }, { dtype = lm.float64 }))
      H.assert_close(h, { 0.5, 0.333251953125 }, 0)
      local bo = lm.zeros({ 3 }, { dtype = lm.bool })
      bo:copy_(lm.tensor({ 0, 2, -0.5 }, { dtype = lm.float32 }))
      H.assert_values(bo, { false, true, true })
   end)
   it("unary in-place ops on a channels-last tensor keep the values in logical order", function()
      local x = H.seq({ 2, 3, 4, 5 }, lm.channels_last)
      x:neg_()
      local e = H.iota(120)
      for k = 1, #e do e[k] = -e[k] end
      H.assert_close(x, e, 0)
   end)
end)

describe("matmul", function()
   it("multiplies 2-D matrices", function()
      local a = H.seq({ 2, 3 })
      local b = H.seq({ 3, 4 })
      local r = a:matmul(b)
      H.assert_layout(r, { 2, 4 }, { 4, 1 })
      H.assert_values(r, { 20, 23, 26, 29, 56, 68, 80, 92 })
   end)
   it("handles transposed operands", function()
      local a = H.seq({ 3, 2 }):transpose(1, 2)   -- [[0,2,4],[1,3,5]]
      local b = H.seq({ 4, 3 }):transpose(1, 2)   -- (3,4)
      local r = a:matmul(b)
      -- r[i][j] = sum_k a[i][k] * b[k][j], a[i][k] = 2k + i, b[k][j] = 3j + k
      local e = {}
      for i = 0, 1 do
         for j = 0, 3 do
            local s = 0
            for k = 0, 2 do s = s + (2 * k + i) * (3 * j + k) end
            e[#e + 1] = s
         end
      end
      H.assert_values(r, e)
   end)
   it("broadcasts batch dims", function()
      local r = H.seq({ 2, 3, 4 }):matmul(H.seq({ 4, 2 }))
      H.assert_sizes(r, { 2, 3, 2 })
   end)
   it("float64", function()
      local r = H.seq({ 2, 2 }, nil, lm.float64):matmul(H.seq({ 2, 2 }, nil, lm.float64))
      H.assert_dtype(r, lm.float64)
      H.assert_values(r, { 2, 3, 6, 11 })
   end)
   it("rejects mismatched inner sizes", function()
      H.assert_error("matmul", function() return H.seq({ 2, 3 }):matmul(H.seq({ 2, 3 })) end)
   end)
end)

describe("lm.cat", function()
   it("joins along a dim", function()
      local a, b = H.seq({ 2, 2 }), H.seq({ 2, 2 }) + 4
      H.assert_values(lm.cat({ a, b }, 1), { 0, 1, 2, 3, 4, 5, 6, 7 })
      H.assert_sizes(lm.cat({ a, b }, 1), { 4, 2 })
      H.assert_values(lm.cat({ a, b }, 2), { 0, 1, 4, 5, 2, 3, 6, 7 })
      H.assert_values(lm.cat({ a, b }, -1), { 0, 1, 4, 5, 2, 3, 6, 7 })
   end)
   it("keeps channels-last when every input suggests it, else contiguous", function()
      local c = H.seq({ 2, 3, 4, 5 }, lm.channels_last)
      local n = H.seq({ 2, 3, 4, 5 })
      H.assert_strides(lm.cat({ c, c }, 2), { 120, 1, 30, 6 })
      H.assert_strides(lm.cat({ c, c }, 1), { 60, 1, 15, 3 })
      H.assert_strides(lm.cat({ c, n }, 2), { 120, 20, 5, 1 })
      H.assert_strides(lm.cat({ n, c }, 4), { 120, 40, 10, 1 })
      local r = lm.cat({ c, n }, 2)
      local e = {}
      for i = 0, 1 do
         for part = 0, 1 do
            for k = 0, 59 do e[#e + 1] = i * 60 + k end
         end
      end
      H.assert_close(r, e, 0)
   end)
   it("rejects mismatched sizes", function()
      H.assert_error("cat", lm.cat, { H.seq({ 2, 2 }), H.seq({ 2, 3 }) }, 1)
   end)
end)

-- Large fresh outputs in cold allocator blocks are written with streaming stores (elementwise.c,
-- alloc.c): LUMEN_EW_STREAM=1 forces that path for every output of 1 MiB or more, =0 turns it
-- off. Both must give the same values and layouts, for odd sizes (unaligned thread runs and
-- tails), both formats, scalars, broadcasting and every element size.
describe("streaming stores for cold outputs", function()
   local ffi = require("ffi")
   local C = require("lumen.C")
   pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
   local function with_stream(mode, f)
      local old = os.getenv("LUMEN_EW_STREAM")
      ffi.C.setenv("LUMEN_EW_STREAM", mode, 1)
      local ok, r = pcall(f)
      if old then ffi.C.setenv("LUMEN_EW_STREAM", old, 1) else ffi.C.unsetenv("LUMEN_EW_STREAM") end
      assert(ok, r)
      return r
   end
   local function same(f, what)
      local a = with_stream("1", f)
      local b = with_stream("0", f)
      H.assert_layout(a, b:size(), b:stride(), what)
      assert.is_true(lm.equal(a, b), what .. ": streamed values differ")
   end

   it("gives the same values as ordinary stores", function()
      lm.manual_seed(3)
      for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
         local x = lm.randn({ 3, 17, 101, 53 }):contiguous(fmt)       -- 1.09 MB of float32
         local y = lm.randn({ 3, 17, 101, 53 }):contiguous(fmt)
         local bias = lm.randn({ 17, 1, 1 })
         local w = tostring(fmt)
         same(function() return x + y end, "add " .. w)
         same(function() return x:add(y, 0.5) end, "add alpha " .. w)
         same(function() return x * 3 end, "mul scalar " .. w)
         same(function() return x - bias end, "broadcast " .. w)
         same(function() return x:relu() end, "relu " .. w)
         same(function() return x:exp() end, "exp " .. w)
         same(function() return x:double() * y:double() end, "float64 " .. w)
         same(function() return x:long() + 1 end, "int64 " .. w)
         same(function() return x:gt(y) end, "bool result " .. w)
         same(function() return x:half() + 1 end, "float16 " .. w)
      end
   end)

   it("gives the same values with 16-byte streaming stores (ISA forced below AVX-512)", function()
      lm.manual_seed(4)
      C.lm_gemm_set_isa(2)
      local ok, err = pcall(function()
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            local x = lm.randn({ 3, 17, 101, 53 }):contiguous(fmt)
            local w = tostring(fmt)
            same(function() return x + 1 end, "add, avx2 " .. w)
            same(function() return x:half() * 2 end, "float16, avx2 " .. w)
         end
      end)
      C.lm_gemm_set_isa(0)                         -- back to auto
      assert(ok, err)
   end)

   it("a loop that frees its large result writes the reused block through the cache", function()
      local T = require("lumen.tensor")
      -- the host allocator's block marks: a CPU fact, so CPU tensors on every test device
      local x = lm.randn({ 4, 64, 40, 40 }, { device = "cpu" }):contiguous(lm.channels_last)
      local want = (x + 1):relu()
      local y = (x + 1):relu()
      local c = T.cdata(y)
      local p, n = c.storage.data, c.storage.nbytes
      C.lm_mem_note_streamed(p, n)                  -- as if the first turn streamed it
      y:free()
      for _ = 1, 3 do
         y = (x + 1):relu()
         c = T.cdata(y)
         assert.is_true(c.storage.data == p, "the freed block comes back")
         assert.equal(0, C.lm_mem_is_cold(p, n))
         assert.equal(0, C.lm_mem_was_streamed(p, n))
         assert.is_true(lm.equal(want, y))
         assert.is_true(y:is_contiguous(lm.channels_last))
         y:free()
      end
   end)

   it("marks large blocks cold when fresh or streamed into, small blocks never", function()
      local big = 4 * 2 ^ 20
      local p = C.lm_alloc(big)
      assert.is_true(p ~= nil)
      assert.equal(1, C.lm_mem_is_cold(p, big))          -- fresh from the system
      C.lm_free(p, big)
      local q = C.lm_alloc(big)                           -- the same block, just used
      assert.equal(0, C.lm_mem_is_cold(q, big))
      assert.equal(0, C.lm_mem_was_streamed(q, big))
      C.lm_mem_note_streamed(q, big)                      -- written past the caches
      assert.equal(1, C.lm_mem_was_streamed(q, big))
      C.lm_free(q, big)
      local other = 2 ^ 20                                -- another large block freed after it,
      local o = C.lm_alloc(other)                         -- as a collection frees many
      C.lm_free(o, other)
      q = C.lm_alloc(big)
      assert.equal(1, C.lm_mem_is_cold(q, big))
      assert.equal(0, C.lm_mem_was_streamed(q, big))      -- the mark is per hand-out
      C.lm_free(q, big)
      q = C.lm_alloc(big)                                 -- once: then used normally
      assert.equal(0, C.lm_mem_is_cold(q, big))
      -- streamed, freed and handed out again at once, nothing between (a loop that frees its
      -- result): ordinary stores this time, so that the loop then runs in the cache
      C.lm_mem_note_streamed(q, big)
      C.lm_free(q, big)
      q = C.lm_alloc(big)
      assert.equal(0, C.lm_mem_is_cold(q, big))
      C.lm_free(q, big)
      local s = C.lm_alloc(1000)
      assert.equal(0, C.lm_mem_is_cold(s, 1000))
      C.lm_free(s, 1000)
      assert.equal(0, C.lm_mem_is_cold(nil, big))
   end)
end)

describe("small dense operands (one kernel call, no iterator)", function()
   -- lm_binary's fast path: float operands of at most 32768 elements with the same sizes and
   -- strides, non-overlapping and dense. The result must be what the general path gives: the
   -- same bits, and the fast setup's strides (the spec's section 6.2). The general path is
   -- reached with the same values in another layout (different strides).
   -- fast (the small path's result) against slow (the general path's): the same values and
   -- NaNs, and a's strides
   local function same_as_general(fast, slow, a, what)
      assert.is_true(lm.equal(fast:isnan(), slow:isnan()), what .. ": NaNs differ")
      assert.is_true(lm.equal(fast:where(fast:eq(fast), 0), slow:where(slow:eq(slow), 0)),
                     what .. ": values differ")
      H.assert_layout(fast, a:size(), a:stride(), what)
   end
   local function layouts()
      return {
         { "contiguous", function(t) return t:contiguous() end },
         { "channels_last", function(t) return t:contiguous(lm.channels_last) end },
         -- dense but neither: a permutation of a contiguous tensor
         { "permuted", function(t)
            return t:permute(3, 1, 4, 2):contiguous():permute(2, 4, 1, 3)
         end },
      }
   end
   it("matches the general path for each op, layout and float dtype", function()
      lm.manual_seed(12)
      local ls = layouts()
      local ops = {
         { "add", function(a, b) return a + b end },
         { "add alpha", function(a, b) return a:add(b, -0.75) end },
         { "sub", function(a, b) return a - b end },
         { "mul", function(a, b) return a * b end },
         { "div", function(a, b) return a / b end },
         { "maximum", function(a, b) return a:maximum(b) end },
         { "minimum", function(a, b) return a:minimum(b) end },
         { "pow", function(a, b) return a:abs():pow(b) end },
         { "atan2", function(a, b) return a:atan2(b) end },
      }
      for _, dt in ipairs({ lm.float32, lm.float64 }) do
         local x = lm.randn({ 2, 3, 4, 5 }, { dtype = dt })
         local y = lm.randn({ 2, 3, 4, 5 }, { dtype = dt })
         y:view(-1):narrow(1, 1, 1):fill_(0)             -- a division by zero
         for _, l in ipairs(ls) do
            local a, b = l[2](x), l[2](y)
            for _, op in ipairs(ops) do
               local what = ("%s %s %s"):format(op[1], l[1], tostring(dt))
               local fast = op[2](a, b)
               -- b in another layout: the general path
               local other = l[1] == "contiguous" and lm.channels_last or lm.contiguous_format
               local slow = op[2](a, b:contiguous(other))
               same_as_general(fast, slow, a, what)
            end
         end
      end
   end)

   -- size-1 dims with strides of no consequence: the result takes the fast setup's strides
   -- (section 6.2: contiguous or channels-last recomputed, else the inputs' own), as the
   -- general path does. {name, sizes, strides, expected result strides, large analog sizes
   -- and strides (more than 32768 elements: the general path)}
   local odd = {
      { "contiguous, odd size-1 stride", { 3, 1, 4 }, { 4, 99, 1 }, { 4, 4, 1 },
        { 300, 1, 400 }, { 400, 99, 1 }, { 400, 400, 1 } },
      { "channels-last, odd size-1 stride", { 2, 3, 1, 5 }, { 15, 1, 77, 3 }, { 15, 1, 15, 3 },
        { 2, 30, 1, 700 }, { 21000, 1, 77, 30 }, { 21000, 1, 21000, 30 } },
      { "dense, odd size-1 stride", { 4, 1, 3 }, { 1, 50, 4 }, { 1, 50, 4 },
        { 400, 1, 300 }, { 1, 50, 400 }, { 1, 50, 400 } },
   }
   it("gives the general path's strides when size-1 dims have odd strides", function()
      lm.manual_seed(13)
      for _, l in ipairs(odd) do
         for _, v in ipairs({ { l[2], l[3], l[4] }, { l[5], l[6], l[7] } }) do
            local a = lm.empty_strided(v[1], v[2]):copy_(lm.randn(v[1]))
            local b = lm.empty_strided(v[1], v[2]):copy_(lm.randn(v[1]))
            local r = a * b
            H.assert_layout(r, v[1], v[3], l[1])
            assert.is_true(lm.equal(r, a:contiguous() * b:contiguous()), l[1] .. ": values")
         end
      end
   end)

   it("tensor-number and unary ops match the general path", function()
      lm.manual_seed(14)
      local ls = layouts()
      local ops = {
         { "mul number", function(t) return t * 3 end },
         { "number minus", function(t) return 3 - t end },
         { "div number", function(t) return t / 0.5 end },
         { "number div", function(t) return 2 / t end },
         { "sub alpha", function(t) return t:sub(2, 0.5) end },
         { "maximum number", function(t) return t:maximum(lm.tensor(0.25)) end },
         { "relu", function(t) return t:relu() end },
         { "neg", function(t) return -t end },
         { "exp", function(t) return t:exp() end },
         { "sqrt (NaN below 0)", function(t) return t:sqrt() end },
         { "tanh", function(t) return t:tanh() end },
      }
      for _, dt in ipairs({ lm.float32, lm.float64 }) do
         local x = lm.randn({ 2, 3, 4, 5 }, { dtype = dt })
         x:view(-1):narrow(1, 1, 1):fill_(0)
         -- the same values in a view that is not dense: the general path
         local holder = lm.zeros({ 2, 3, 4, 7 }, { dtype = dt })
         local nd = holder:narrow(4, 2, 5):copy_(x)
         for _, l in ipairs(ls) do
            local a = l[2](x)
            for _, op in ipairs(ops) do
               local what = ("%s %s %s"):format(op[1], l[1], tostring(dt))
               local fast, slow = op[2](a), op[2](nd)
               same_as_general(fast, slow, a, what)
            end
         end
      end
   end)

   it("handles 0-dim, one-element, 5-D channels-last and offset views", function()
      lm.manual_seed(15)
      local z = lm.tensor(2.5) + lm.tensor(1.5)
      assert.are.equal(0, z:dim())
      assert.are.equal(4, z:item())
      local one = lm.tensor({ 3 }) * lm.tensor({ -2 })
      assert.are.equal(-6, one:item())
      local v5 = lm.randn({ 2, 3, 2, 3, 4 }):contiguous(lm.channels_last_3d)
      local r5 = v5 * v5
      H.assert_layout(r5, v5:size(), v5:stride(), "5-D channels-last")
      assert.is_true(lm.equal(r5, v5:contiguous() * v5:contiguous()))
      local base = lm.randn({ 3, 4 })
      local row = base:narrow(1, 2, 1)                   -- offset 4, dense
      assert.are.equal(4, row:storage_offset())
      assert.is_true(lm.equal(row + row, (base + base):narrow(1, 2, 1)))
      assert.is_true(lm.equal(3 - row, (3 - base):narrow(1, 2, 1)))
      assert.is_true(lm.equal(row:relu(), base:relu():narrow(1, 2, 1)))
   end)

   it("is not taken for mixed dtypes, broadcasting, comparisons or large tensors", function()
      local a = lm.randn({ 4 })
      H.assert_dtype(a + lm.ones({ 4 }, { dtype = lm.float64 }), lm.float64)
      H.assert_sizes(a + lm.randn({ 1 }), { 4 })
      H.assert_dtype(a:gt(lm.randn({ 4 })), lm.bool)
      H.assert_dtype(lm.ones({ 4 }, { dtype = lm.int64 }) + lm.ones({ 4 }, { dtype = lm.int64 }),
                     lm.int64)
      local big = lm.randn({ 40000 })
      assert.is_true(lm.equal(big + big, big * 2))
   end)
end)

-- bfloat16 add / sub / mul (with alpha, and with a fused relu) and relu on dense operands take a
-- direct AVX-512 loop (kernels/cpu/elementwise.c, bf16_direct); every other case, and every
-- machine without AVX-512, the general gather / compute / scatter loop. The two must give the
-- same bits: checked on random bit patterns (NaNs signalling and quiet, infinities, subnormals,
-- signed zeros), odd sizes (vector tails), both formats and strided views, the general loop
-- forced by lowering the ISA.
describe("bfloat16 direct elementwise loop", function()
   -- CPU kernels, checked through host pointers to the tensors' data
   if lm.get_default_device() ~= "cpu" then
      pending("the CPU's loops (the default device is " .. lm.get_default_device() .. ")")
      return
   end
   local ffi = require("ffi")
   local C = require("lumen.C")
   local T = require("lumen.tensor")
   local outp = ffi.new("lm_tensor*[1]")

   local function bits(t)
      t = t:contiguous()
      return ffi.string(C.lm_tensor_data(t._c), t:numel() * 2)
   end
   -- the same bits, except that a NaN may be any NaN: the payload of NaN op NaN is whichever
   -- operand the hardware (or the compiler's operand order) picks, in either loop
   local function same_bits(x, y)
      local sx, sy = bits(x), bits(y)
      if sx == sy then return true end
      local px, py = ffi.cast("const uint16_t *", sx), ffi.cast("const uint16_t *", sy)
      for i = 0, #sx / 2 - 1 do
         local u, v = px[i], py[i]
         if u ~= v and not (bit.band(u, 0x7fff) > 0x7f80 and bit.band(v, 0x7fff) > 0x7f80) then
            return false, ("element %d: 0x%04x against 0x%04x"):format(i, u, v)
         end
      end
      return true
   end
   -- a bfloat16 tensor of random bit patterns (every class of value), in format fmt
   local function random_bits(sizes, fmt, seed)
      lm.manual_seed(seed)
      local u = lm.randint(0, 65536, sizes, { dtype = lm.int32 })
      local t = lm.empty(sizes, { dtype = lm.bfloat16 })
      local n = t:numel()
      local src = u:contiguous()
      local sp = ffi.cast("int32_t *", C.lm_tensor_data(src._c))
      local dp = ffi.cast("uint16_t *", C.lm_tensor_data(t._c))
      for i = 0, n - 1 do dp[i] = sp[i] end
      return t:contiguous(fmt)
   end
   local function run(f)
      outp[0] = nil
      assert(f() == 0, "call failed")
      return T.wrap(outp[0])
   end
   local function bin(op, alpha)
      return function(a, b)
         return run(function() return C.lm_binary(op, a._c, b._c, alpha, outp) end)
      end
   end
   local function bin_relu(op, alpha)
      return function(a, b)
         return run(function()
            return C.lm_binary_unary(op, a._c, b._c, alpha, C.LM_RELU, outp)
         end)
      end
   end
   local ops = {
      { "add", bin(C.LM_ADD, 1) }, { "add alpha", bin(C.LM_ADD, 0.3) },
      { "sub alpha", bin(C.LM_SUB, -2.5) }, { "mul", bin(C.LM_MUL, 1) },
      { "relu", function(a)
         return run(function() return C.lm_unary(C.LM_RELU, a._c, outp) end)
      end },
      { "add+relu", bin_relu(C.LM_ADD, 1) }, { "sub+relu", bin_relu(C.LM_SUB, 0.5) },
      { "mul+relu", bin_relu(C.LM_MUL, 1) },
   }

   local shapes = { { 3, 5, 7, 11 }, { 2, 16, 33, 17 }, { 4, 64, 32, 33 } }
   after_each(function() C.lm_gemm_set_isa(0) end)
   for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
      it(tostring(fmt) .. ": the same bits as the general loop, and as float32 math", function()
         for si, sz in ipairs(shapes) do
            local a, b = random_bits(sz, fmt, si), random_bits(sz, fmt, 100 + si)
            local views = { { a, b }, { a:transpose(2, 3), b:transpose(2, 3) },  -- dense, permuted
                            { a:narrow(4, 2, sz[4] - 2), b:narrow(4, 1, sz[4] - 2) } } -- strided
            for vi, v in ipairs(views) do
               for _, o in ipairs(ops) do
                  local what = ("%s shape %d view %d %s"):format(tostring(fmt), si, vi, o[1])
                  C.lm_gemm_set_isa(0)
                  local got = o[2](v[1], v[2])
                  C.lm_gemm_set_isa(2)                     -- AVX2: the general loop
                  local want = o[2](v[1], v[2])
                  C.lm_gemm_set_isa(0)
                  assert.are.equal(lm.bfloat16, got:dtype(), what)
                  assert.are.same(want:stride(), got:stride(), what)
                  local ok, why = same_bits(got, want)
                  assert.is_true(ok, what .. ": " .. tostring(why))
               end
            end
         end
      end)
   end

   it("fused add+relu equals the eager pair and float32 math rounded once", function()
      local a, b = random_bits({ 4, 8, 16, 17 }, nil, 7), random_bits({ 4, 8, 16, 17 }, nil, 8)
      local fused = bin_relu(C.LM_ADD, 1)(a, b)
      local s = bin(C.LM_ADD, 1)(a, b)
      local eager = run(function() return C.lm_unary(C.LM_RELU, s._c, outp) end)
      assert.is_true(same_bits(fused, eager))
      -- float32 math, one rounding (NaN positions compared apart: their payloads may differ)
      local f = (a:float() + b:float()):relu():to(lm.bfloat16)
      local nf, ng = f:isnan(), fused:isnan()
      assert.is_true(lm.equal(nf, ng))
      assert.is_true(lm.equal(lm.where(nf, 0, f), lm.where(ng, 0, fused)))
   end)
end)

-- kernels/cpu/elementwise.c's short_rows_copy / short_rows_fill: same-dtype copies and fills
-- whose innermost unit-stride run is shorter than 16 elements (a few channels of a
-- channels-last tensor; conv3d's gathered depth taps), in typed loops of 1, 2, 4 and 8 bytes
describe("copies and fills of short rows (few channels, channels-last)", function()
   local dtypes = { "float32", "float64", "bfloat16", "float16", "uint8", "int32", "int64", "bool" }
   it("copy into and out of channels-last, narrowed channels, every element size", function()
      for _, dn in ipairs(dtypes) do
         local dt = lm[dn]
         for _, c in ipairs({ 1, 3, 5, 15 }) do
            local x = (lm.randn({ 2, c, 6, 37 }) * 4):to(dt)
            local cl = x:contiguous(lm.channels_last)
            assert.is_true(lm.equal(cl, x), dn .. " C" .. c)
            assert.is_true(cl:is_contiguous(lm.channels_last), dn)
            assert.is_true(lm.equal(cl:contiguous(), x), dn .. " back")
            -- a channel slice of a wider channels-last tensor: rows of c elements, 2c apart
            local wide = lm.zeros({ 2, 2 * c, 6, 37 }, { dtype = dt }):contiguous(lm.channels_last)
            wide:narrow(2, c + 1, c):copy_(x)
            assert.is_true(lm.equal(wide:narrow(2, c + 1, c), x), dn .. " narrowed")
            assert.is_true(lm.equal(wide:narrow(2, 1, c), lm.zeros_like(x)), dn .. " untouched")
            -- fill of the same slice
            local one = lm.ones({}, { dtype = dt }):item()
            wide:narrow(2, 1, c):fill_(one)
            assert.is_true(lm.equal(wide:narrow(2, 1, c), lm.ones_like(x)), dn .. " fill")
            assert.is_true(lm.equal(wide:narrow(2, c + 1, c), x), dn .. " fill kept the rest")
         end
      end
   end)
end)
