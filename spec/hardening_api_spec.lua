-- spec/hardening_api_spec.lua -- API-level hardening: NaNs with a payload reaching Lua, Lua
-- numbers that do not fit an integer dtype, in-place writes into overlapping tensors, shapes
-- that print, and the dtype lm.tensor infers from a table. (Unknown option keys: options_spec.)
local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local C = require("lumen.C")

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
