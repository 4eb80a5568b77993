-- spec/hardening_api_spec.lua -- API-level hardening: NaNs with a payload reaching Lua, Lua
-- numbers that do not fit an integer dtype, in-place writes into overlapping tensors, shapes
-- that print, and the dtype lm.tensor infers from a table. (Unknown option keys: options_spec.)
local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local C = require("lumen.C")

-- f() must raise exactly `expected`, at the caller's line (not inside lumen's files)
local function raises(f, expected)
   local ok, msg = pcall(f)
   assert(not ok, "expected an error: " .. expected)
   assert(type(msg) == "string", "error is a " .. type(msg))
   local pos, body = msg:match("^([^%s]*:%d+: )(.*)$")
   if not pos then body = msg end
   assert(not (pos and pos:find("lua/lumen/", 1, true)), "error raised inside lumen: " .. msg)
   assert(body == expected, ("expected %q, got %q"):format(expected, msg))
end

-- a tensor of `dtype` whose first element has the raw little-endian bytes `bytes` (the rest 0)
local function with_bytes(dtype, n, bytes)
   local x = lm.zeros({ n }, { dtype = dtype })
   local p = ffi.cast("uint8_t*", C.lm_tensor_data(x._c))
   for i = 1, #bytes do p[i - 1] = bytes[i] end
   return x
end

-- NaN bit patterns that LuaJIT would take for tagged values once widened to a double
local payload_nans = {
   { "float64 0xfffa000000000000", lm.float64, { 0, 0, 0, 0, 0, 0, 0xFA, 0xFF } },
   { "float64 0xffffffffffffffff", lm.float64, { 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF } },
   { "float32 0xffffffff", lm.float32, { 0xFF, 0xFF, 0xFF, 0xFF } },
   { "float32 0xffedcba9", lm.float32, { 0xA9, 0xCB, 0xED, 0xFF } },
   { "float16 0xff6d", lm.float16, { 0x6D, 0xFF } },
   { "bfloat16 0xffff", lm.bfloat16, { 0xFF, 0xFF } },
}

describe("a NaN with a payload", function()
   for _, case in ipairs(payload_nans) do
      local name, dtype, bytes = case[1], case[2], case[3]
      it("item() gives a plain NaN: " .. name, function()
         local x = with_bytes(dtype, 3, bytes)
         local v = x:narrow(1, 1, 1):view({}):item()
         assert.are.equal("number", type(v))
         assert.is_true(v ~= v)
         local s = x:sum():item()          -- arithmetic in C keeps the payload
         assert.are.equal("number", type(s))
         assert.is_true(s ~= s)
         local m = x:max():item()
         assert.are.equal("number", type(m))
      end)
      it("totable() gives plain NaNs: " .. name, function()
         -- enough elements and repetitions for the loop to be compiled by the JIT
         local x = with_bytes(dtype, 300, bytes)
         local p = ffi.cast("uint8_t*", C.lm_tensor_data(x._c))
         local w = dtype.size
         for i = 2, 299, 2 do
            for b = 1, #bytes do p[i * w + b - 1] = bytes[b] end
         end
         for _ = 1, 20 do
            local t = x:totable()
            for i = 1, 300 do
               local v = t[i]
               assert(type(v) == "number", "element " .. i .. " is a " .. type(v))
               if i % 2 == 1 then assert(v ~= v) else assert(v == 0) end
            end
         end
         local t0 = x:narrow(1, 1, 1):view({}):totable()
         assert.are.equal("number", type(t0))
      end)
      it("tostring() prints nan: " .. name, function()
         local x = with_bytes(dtype, 3, bytes)
         local s = tostring(x)
         assert.is_truthy(s:find("nan", 1, true), s)
         assert.is_truthy(tostring(x:view({ 3, 1 })):find("nan", 1, true))
      end)
   end
end)

describe("a number that does not fit the dtype", function()
   local function overflow(fname, dtype)
      return "lumen." .. fname .. ": value cannot be converted to type " .. dtype ..
             " without overflow"
   end
   local bad = {
      { "full", "int64", function() return lm.full({ 2 }, 0 / 0, { dtype = lm.int64 }) end },
      { "full", "int64", function() return lm.full({ 2 }, 2 ^ 63, { dtype = lm.int64 }) end },
      { "full", "int64", function() return lm.full({ 2 }, math.huge, { dtype = lm.int64 }) end },
      { "full", "int32", function() return lm.full({ 2 }, 1e300, { dtype = lm.int32 }) end },
      { "full", "int32", function() return lm.full({ 2 }, 2 ^ 31, { dtype = lm.int32 }) end },
      { "full", "int32", function() return lm.full({ 2 }, -2 ^ 31 - 1, { dtype = lm.int32 }) end },
      { "full", "uint8", function() return lm.full({ 2 }, 256, { dtype = lm.uint8 }) end },
      { "full", "uint8", function() return lm.full({ 2 }, -256, { dtype = lm.uint8 }) end },
      { "full", "uint8", function() return lm.full({ 2 }, -0.5, { dtype = lm.uint8 }) end },
      { "full", "float16", function() return lm.full({ 2 }, 1e300, { dtype = lm.float16 }) end },
      { "full", "float16", function() return lm.full({ 2 }, 70000, { dtype = lm.float16 }) end },
      { "full", "bfloat16", function() return lm.full({ 2 }, -1e300, { dtype = lm.bfloat16 }) end },
      { "full", "float32", function() return lm.full({ 2 }, 1e300) end },
      { "full_like", "int32", function()
         return lm.full_like(lm.zeros({ 2 }, { dtype = lm.int32 }), 0 / 0)
      end },
      { "fill_", "int64", function() return lm.zeros({ 2 }, { dtype = lm.int64 }):fill_(0 / 0) end },
      { "fill_", "int32", function() return lm.zeros({ 2 }, { dtype = lm.int32 }):fill_(1e10) end },
      { "fill_", "float16", function() return lm.zeros({ 2 }, { dtype = lm.float16 }):fill_(1e5) end },
      { "tensor", "int64", function() return lm.tensor({ 1, 0 / 0 }, { dtype = lm.int64 }) end },
      { "tensor", "int32", function() return lm.tensor({ { 1 }, { 1e300 } }, { dtype = lm.int32 }) end },
      { "tensor", "int32", function() return lm.tensor(1e300, { dtype = lm.int32 }) end },
      { "tensor", "uint8", function() return lm.tensor({ 300 }, { dtype = lm.uint8 }) end },
      { "arange", "int32", function() return lm.arange(0, 4e9, 1e9, { dtype = lm.int32 }) end },
      { "linspace", "int32", function() return lm.linspace(0, 1e300, 3, { dtype = lm.int32 }) end },
   }
   for i, case in ipairs(bad) do
      it(("%s to %s raises (case %d)"):format(case[1], case[2], i), function()
         raises(case[3], overflow(case[1], case[2]))
      end)
   end
   it("nn.init.constant_ checks the value too", function()
      local w = lm.zeros({ 2 }, { dtype = lm.float16 })
      raises(function() lm.nn.init.constant_(w, 1e6) end,
                     "lumen.nn.init.constant_: value cannot be converted to type float16 without overflow")
   end)
   it("accepts what PyTorch accepts", function()
      assert.are.same({ 255, 255 }, lm.full({ 2 }, -1, { dtype = lm.uint8 }):totable())
      assert.are.same({ 1, 1 }, lm.full({ 2 }, 1.7, { dtype = lm.int32 }):totable())
      assert.are.same({ 2147483647 }, lm.full({ 1 }, 2 ^ 31 - 1, { dtype = lm.int32 }):totable())
      assert.are.same({ true, true }, lm.full({ 2 }, 0 / 0, { dtype = lm.bool }):totable())
      assert.are.same({ math.huge }, lm.full({ 1 }, math.huge, { dtype = lm.float16 }):totable())
      local v = lm.full({ 1 }, 0 / 0, { dtype = lm.float16 }):item()
      assert.is_true(v ~= v)
      assert.are.same({ 1e300 }, lm.full({ 1 }, 1e300, { dtype = lm.float64 }):totable())
      -- torch.tensor does not check float dtypes: too large for float16 is inf
      assert.are.same({ math.huge }, lm.tensor({ 1e300 }, { dtype = lm.float16 }):totable())
   end)
end)
