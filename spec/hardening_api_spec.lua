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

-- a tensor of `dtype` whose first element has the raw little-endian bytes `bytes` (the rest 0);
-- every element at an even 0-based index below `every` gets them too. The bytes are written on
-- the CPU (the host may only dereference CPU memory), then the tensor goes to the default device.
local function with_bytes(dtype, n, bytes, every)
   local x = lm.zeros({ n }, { dtype = dtype, device = "cpu" })
   local p = ffi.cast("uint8_t*", C.lm_tensor_data(x._c))
   for i = 1, #bytes do p[i - 1] = bytes[i] end
   local w = dtype.size
   for i = 2, (every or 0) - 1, 2 do
      for b = 1, #bytes do p[i * w + b - 1] = bytes[b] end
   end
   return x:to(lm.get_default_device())
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
         local x = with_bytes(dtype, 300, bytes, 300)
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
      { "fill_", "int64", function() return lm.zeros({ 2 }, { dtype = lm.int64 }):fill_(0 / 0)
      end },
      { "fill_", "int32", function() return lm.zeros({ 2 }, { dtype = lm.int32 }):fill_(1e10) end },
      { "fill_", "float16", function() return lm.zeros({ 2 }, { dtype = lm.float16 }):fill_(1e5)
      end },
      { "tensor", "int64", function() return lm.tensor({ 1, 0 / 0 }, { dtype = lm.int64 }) end },
      { "tensor", "int32", function()
         return lm.tensor({ { 1 }, { 1e300 } }, { dtype = lm.int32 })
      end },
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
                     "lumen.nn.init.constant_: value cannot be converted to type float16 " ..
                     "without overflow")
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

describe("an in-place write into a tensor whose elements share memory", function()
   local OVERLAP = "unsupported operation: more than one element of the written-to tensor " ..
      "refers to a single memory location. Please clone() the tensor before performing the " ..
      "operation."
   local function expanded() return lm.zeros({ 1 }):expand({ 3 }) end
   local cases = {
      { "add_", function() expanded():add_(lm.ones({ 3 })) end },
      { "sub_", function() expanded():sub_(1) end },
      { "mul_", function() expanded():mul_(lm.ones({ 3 })) end },
      { "div_", function() expanded():div_(2) end },
      { "pow_", function() expanded():pow_(2) end },
      { "relu_", function() expanded():relu_() end },
      { "neg_", function() lm.zeros({ 2, 1 }):expand({ 2, 4 }):neg_() end },
      { "clamp_", function() expanded():clamp_(0, 1) end },
      { "addcmul_", function() expanded():addcmul_(lm.ones({ 3 }), lm.ones({ 3 })) end },
      { "addcdiv_", function() expanded():addcdiv_(lm.ones({ 3 }), lm.ones({ 3 })) end },
      { "copy_", function() expanded():copy_(lm.tensor({ 1.0, 2.0, 3.0 })) end },
      { "nn.init.uniform_", function() lm.nn.init.uniform_(expanded()) end },
      { "nn.init.normal_", function() lm.nn.init.normal_(expanded()) end },
   }
   for _, case in ipairs(cases) do
      it(case[1] .. " raises", function()
         raises(case[2], "lumen." .. case[1] .. ": " .. OVERLAP)
      end)
   end
   it("batch_norm in training rejects an expanded running_mean or running_var", function()
      local x = lm.randn({ 4, 3, 2, 2 })
      raises(function()
         lm.F.batch_norm(x, lm.zeros({ 1 }):expand({ 3 }), lm.ones({ 3 }), nil, nil,
                         { training = true })
      end, "lumen.batch_norm: running_mean: " .. OVERLAP)
      raises(function()
         lm.F.batch_norm(x, lm.zeros({ 3 }), lm.ones({ 1 }):expand({ 3 }), nil, nil,
                         { training = true })
      end, "lumen.batch_norm: running_var: " .. OVERLAP)
      -- evaluation only reads them: allowed, as in PyTorch
      local y = lm.F.batch_norm(x, lm.zeros({ 1 }):expand({ 3 }), lm.ones({ 1 }):expand({ 3 }))
      assert.are.same({ 4, 3, 2, 2 }, y:size())
   end)
   it("an optimizer step on an expanded parameter raises, not sum into one slot", function()
      local p = lm.zeros({ 1 }):expand({ 3 })
      p.requires_grad = true
      p.grad = lm.ones({ 3 })
      local opt = lm.optim.SGD({ p }, { lr = 0.1, momentum = 0.9 })
      local ok, msg = pcall(function() opt:step() end)
      assert.is_false(ok)
      assert.is_truthy(tostring(msg):find(OVERLAP, 1, true), msg)
   end)
   it("fill_, zero_ and writes into an expanded size-1 dim are fine", function()
      local e = expanded()
      e:fill_(2)
      assert.are.same({ 2, 2, 2 }, e:totable())
      e:zero_()
      assert.are.same({ 0, 0, 0 }, e:totable())
      local k = lm.zeros({ 3, 1 }):expand({ 3, 1 })   -- stride 0 on a size-1 dim: no sharing
      k:add_(1)
      assert.are.same({ { 1 }, { 1 }, { 1 } }, k:totable())
      local s = lm.zeros({ 4 }):as_strided({ 2 }, { 2 })
      s:add_(1)
   end)
end)

describe("sizes as people expect to see them", function()
   it("t:size() prints as {2, 3, 4, 4} and stays a plain array", function()
      local x = lm.zeros({ 2, 3, 4, 4 })
      local s = x:size()
      assert.are.equal("{2, 3, 4, 4}", tostring(s))
      assert.are.equal(4, #s)
      assert.are.equal(3, s[2])
      assert.are.equal("2x3x4x4", table.concat(s, "x"))
      local n = 0
      for i, v in ipairs(s) do n = n + i * v end
      assert.are.equal(2 + 6 + 12 + 16, n)
      assert.are.same({ 2, 3, 4, 4 }, s)
      assert.are.equal("sizes {2, 3, 4, 4}", "sizes " .. s)
      assert.are.equal("{}", tostring(lm.tensor(1.5):size()))
      assert.are.equal("{0}", tostring(lm.zeros({ 0 }):size()))
      assert.are.equal("{3000000000}", tostring(lm.zeros({ 1 }):expand({ 3e9 }):size()))
   end)
   it("t.shape is the same Size", function()
      local x = lm.zeros({ 2, 3, 4, 4 })
      assert.are.equal("{2, 3, 4, 4}", tostring(x.shape))
      assert.are.equal(2, x.shape[1])
      assert.are.equal(4, #x.shape)
      assert.is_nil(x.shape[5])
      assert.is_true(x.shape == x:size())
      assert.is_true(x.shape == lm.ones({ 2, 3, 4, 4 }).shape)
      assert.is_false(x.shape == lm.ones({ 2, 3, 4 }).shape)
      assert.is_false(x.shape == lm.ones({ 2, 3, 4, 5 }).shape)
      assert.is_true(lm.tensor(2.5).shape == lm.tensor(1.5):size())
      -- a result computed later (deferred elementwise results) has a shape too
      local big = lm.ones({ 600, 600 })
      assert.are.equal("{600, 600}", tostring((big + big).shape))
      -- fields and methods still resolve as before
      assert.are.equal("function", type(x.add))
      assert.is_false(x.requires_grad)
      assert.is_nil(x.no_such_field)
   end)
   it("every function that takes sizes takes a Size", function()
      local x = lm.zeros({ 2, 3, 4, 4 })
      assert.are.same({ 2, 3, 4, 4 }, lm.zeros(x.shape):size())
      assert.are.same({ 2, 3, 4, 4 }, lm.full(x:size(), 2):size())
      assert.are.same({ 2, 3, 4, 4 }, lm.randint(0, 3, x.shape):size())
      assert.are.same({ 2, 3, 4, 4 }, lm.empty_strided(x.shape, x:stride()):size())
      assert.are.same({ 2, 48 }, x:view(lm.zeros({ 2, 48 }).shape):size())
      assert.are.same({ 2, 3, 4, 4 }, lm.zeros({ 1, 3, 1, 1 }):expand(x.shape):size())
      local s = lm.tensor(x.shape)
      assert.are.same({ 2, 3, 4, 4 }, s:totable())
      assert.are.equal(lm.int64, s:dtype())
      local y = lm.F.max_pool2d(x, lm.zeros({ 2, 2 }).shape)
      assert.are.same({ 2, 3, 2, 2 }, y:size())
      assert.are.same({ 2, 3, 1, 1 }, lm.F.adaptive_avg_pool2d(x, lm.zeros({ 1, 1 }).shape):size())
   end)
end)

describe("lm.tensor infers the dtype as torch.tensor does", function()
   local cases = {
      { "integers", { 1, 2, 3 }, lm.int64 },
      { "nested integers", { { 1, -2 }, { 3, 4 } }, lm.int64 },
      { "one float among integers", { 1, 2.5, 3 }, lm.float32 },
      { "a NaN", { 1, 0 / 0 }, lm.float32 },
      { "an infinity", { 1, math.huge }, lm.float32 },
      { "an integer beyond int64", { 1, 2 ^ 63 }, lm.float32 },
      { "booleans", { true, false }, lm.bool },
      { "booleans and integers", { true, 2 }, lm.int64 },
      { "booleans and floats", { true, 2.5 }, lm.float32 },
      { "an empty table", {}, lm.float32 },
      { "an integer scalar", 3, lm.int64 },
      { "a float scalar", 2.5, lm.float32 },
      { "a boolean scalar", true, lm.bool },
   }
   for _, case in ipairs(cases) do
      it(case[1] .. " -> " .. tostring(case[3]), function()
         local t = lm.tensor(case[2])
         assert.are.equal(case[3], t:dtype())
      end)
   end
   it("keeps large integers exact in int64", function()
      assert.are.same({ 2 ^ 53, -2 ^ 53 }, lm.tensor({ 2 ^ 53, -2 ^ 53 }):totable())
   end)
   it("takes opts.dtype over the inferred one", function()
      assert.are.equal(lm.float32, lm.tensor({ 1, 2 }, { dtype = lm.float32 }):dtype())
      assert.are.equal(lm.float64, lm.tensor(3, { dtype = lm.float64 }):dtype())
   end)
end)

describe("a number scalar reaches an integer tensor through int64 (PyTorch's Scalar)", function()
   it("int32 + 2^40 adds 0, int32 + (2^32 + 5) adds 5 (the int64 wraps), not INT_MIN", function()
      local a = lm.ones({ 2 }, { dtype = lm.int32 })
      assert.same({ 1, 1 }, a:add(2 ^ 40):totable())
      assert.same({ 6, 6 }, a:add(2 ^ 32 + 5):totable())
      assert.same({ 2 ^ 40 + 1, 2 ^ 40 + 1 },
                  lm.ones({ 2 }, { dtype = lm.int64 }):add(2 ^ 40):totable())
   end)
   it("uint8 + 300 wraps to 45 (torch.ones(2, dtype=torch.uint8) + 300)", function()
      assert.same({ 45, 45 }, lm.ones({ 2 }, { dtype = lm.uint8 }):add(300):totable())
   end)
end)
