-- spec/errors_spec.lua -- bad input to every public function of the API sections Creation,
-- Inspection, Layout and type changes and Math: each call must raise a Lua error whose message
-- starts with "lumen.<function>:" and says what is wrong (helpers.assert_error), and never crash.
--
-- Functions are named in the message as in the API: methods by their name ("lumen.view:"),
-- operators by the method they stand for (`a + b` is "lumen.add:", unary minus "lumen.neg:").
local H = require("spec.helpers")
local lm = H.lm

local function x4() return H.seq({ 2, 3, 4, 5 }) end
local function v3() return H.seq({ 3 }) end
local function i64() return lm.tensor({ 1, 2, 3 }, { dtype = lm.int64 }) end

-- { function name in the message, description, callable }
local cases = {
   -- creation -------------------------------------------------------------------------------
   { "empty", "nil sizes", function() return lm.empty(nil) end },
   { "empty", "string sizes", function() return lm.empty("2x3") end },
   { "empty", "negative size", function() return lm.empty({ 2, -3 }) end },
   { "empty", "fractional size", function() return lm.empty({ 2.5 }) end },
   { "empty", "non-number size", function() return lm.empty({ 2, "3" }) end },
   { "empty", "more than 8 dims", function() return lm.empty({ 1, 1, 1, 1, 1, 1, 1, 1, 1 }) end },
   { "empty", "unknown dtype", function() return lm.empty({ 2 }, { dtype = "float128" }) end },
   { "empty", "dtype of the wrong type", function() return lm.empty({ 2 }, { dtype = 5 }) end },
   { "empty", "unknown memory format", function()
      return lm.empty({ 2 }, { memory_format = "nhwc" })
   end },
   { "empty", "channels_last on 3-D", function()
      return lm.empty({ 2, 3, 4 }, { memory_format = lm.channels_last })
   end },
   { "empty", "preserve_format", function()
      return lm.empty({ 2, 3, 4, 5 }, { memory_format = lm.preserve_format })
   end },
   { "empty", "unknown device", function() return lm.empty({ 2 }, { device = "tpu" }) end },
   { "empty", "options not a table", function() return lm.empty({ 2 }, "float32") end },
   { "empty", "too many elements (overflow)", function()
      return lm.empty({ 2 ^ 31, 2 ^ 31, 8 })
   end },
   { "empty", "too many bytes (allocation fails)", function() return lm.empty({ 2 ^ 52 }) end },
   { "zeros", "nil sizes", function() return lm.zeros(nil) end },
   { "zeros", "negative size", function() return lm.zeros({ -1 }) end },
   { "zeros", "bad dtype", function() return lm.zeros({ 2 }, { dtype = "int8" }) end },
   { "ones", "nil sizes", function() return lm.ones() end },
   { "ones", "negative size", function() return lm.ones({ 3, -1 }) end },
   { "full", "nil value", function() return lm.full({ 2 }, nil) end },
   { "full", "string value", function() return lm.full({ 2 }, "seven") end },
   { "full", "nil sizes", function() return lm.full(nil, 1) end },
   { "full", "negative size", function() return lm.full({ -2 }, 1) end },
   { "rand", "integer dtype", function() return lm.rand({ 2 }, { dtype = lm.int64 }) end },
   { "rand", "negative size", function() return lm.rand({ -2 }) end },
   { "randn", "bool dtype", function() return lm.randn({ 2 }, { dtype = lm.bool }) end },
   { "randn", "nil sizes", function() return lm.randn(nil) end },
   { "randint", "low >= high", function() return lm.randint(5, 5, { 2 }) end },
   { "randint", "fractional bound", function() return lm.randint(0, 2.5, { 2 }) end },
   { "randint", "nil sizes", function() return lm.randint(0, 3, nil) end },
   { "randint", "string bound", function() return lm.randint("0", 3, { 2 }) end },
   { "arange", "no arguments", function() return lm.arange() end },
   { "arange", "zero step", function() return lm.arange(0, 5, 0) end },
   { "arange", "step of the wrong sign", function() return lm.arange(0, 5, -1) end },
   { "arange", "string", function() return lm.arange("5") end },
   { "arange", "infinite", function() return lm.arange(0, math.huge) end },
   { "tensor", "nil", function() return lm.tensor(nil) end },
   { "tensor", "string", function() return lm.tensor("1, 2") end },
   { "tensor", "ragged rows", function() return lm.tensor({ { 1, 2 }, { 3 } }) end },
   { "tensor", "table where a number belongs", function() return lm.tensor({ 1, { 2 } }) end },
   { "tensor", "string element", function() return lm.tensor({ 1, "2" }) end },
   { "tensor", "bad dtype", function() return lm.tensor({ 1 }, { dtype = "complex64" }) end },
   { "empty_strided", "nil strides", function() return lm.empty_strided({ 2, 3 }, nil) end },
   { "empty_strided", "mismatched lengths", function()
      return lm.empty_strided({ 2, 3 }, { 1 })
   end },
   { "empty_strided", "negative stride", function()
      return lm.empty_strided({ 2, 3 }, { 3, -1 })
   end },
   { "empty_strided", "negative size", function()
      return lm.empty_strided({ -2, 3 }, { 3, 1 })
   end },
   { "empty_strided", "nil sizes", function() return lm.empty_strided(nil, { 1 }) end },
   { "empty_like", "nil", function() return lm.empty_like(nil) end },
   { "empty_like", "a table", function() return lm.empty_like({ 1, 2 }) end },
   { "empty_like", "bad memory format", function()
      return lm.empty_like(x4(), { memory_format = "bogus" })
   end },
   { "empty_like", "channels_last on 3-D", function()
      return lm.empty_like(H.seq({ 2, 3, 4 }), { memory_format = lm.channels_last })
   end },
   { "zeros_like", "nil", function() return lm.zeros_like(nil) end },
   { "ones_like", "number", function() return lm.ones_like(3) end },
   { "full_like", "nil value", function() return lm.full_like(x4(), nil) end },
   { "full_like", "nil tensor", function() return lm.full_like(nil, 1) end },
   { "rand_like", "integer input", function() return lm.rand_like(i64()) end },
   { "randn_like", "nil", function() return lm.randn_like(nil) end },
   { "manual_seed", "nil", function() return lm.manual_seed(nil) end },
   { "manual_seed", "string", function() return lm.manual_seed("42") end },
   { "manual_seed", "fractional", function() return lm.manual_seed(1.5) end },

   -- inspection ---------------------------------------------------------------------------
   { "size", "dim 0", function() return x4():size(0) end },
   { "size", "dim out of range", function() return x4():size(5) end },
   { "size", "dim -5", function() return x4():size(-5) end },
   { "size", "string dim", function() return x4():size("1") end },
   { "stride", "dim out of range", function() return x4():stride(9) end },
   { "stride", "fractional dim", function() return x4():stride(1.5) end },
   { "size", "nil self", function() return lm.Tensor.size(nil) end },
   { "dim", "nil self", function() return lm.Tensor.dim(nil) end },
   { "numel", "nil self", function() return lm.Tensor.numel(nil) end },
   { "dtype", "nil self", function() return lm.Tensor.dtype(nil) end },
   { "device", "table self", function() return lm.Tensor.device({}) end },
   { "storage_offset", "nil self", function() return lm.Tensor.storage_offset(nil) end },
   { "item", "many elements", function() return x4():item() end },
   { "item", "no elements", function() return lm.zeros({ 0 }):item() end },
   { "totable", "nil self", function() return lm.Tensor.totable(nil) end },
   { "is_contiguous", "unknown format", function() return x4():is_contiguous("nhwc") end },
   { "is_contiguous", "a dtype", function() return x4():is_contiguous(lm.float32) end },
   { "is_non_overlapping_and_dense", "nil self", function()
      return lm.Tensor.is_non_overlapping_and_dense(nil)
   end },
   { "suggest_memory_format", "nil self", function()
      return lm.Tensor.suggest_memory_format(nil)
   end },

   -- layout and type changes ---------------------------------------------------------------
   { "contiguous", "preserve_format", function() return x4():contiguous(lm.preserve_format) end },
   { "contiguous", "unknown format", function() return x4():contiguous("nhwc") end },
   { "contiguous", "channels_last on 5-D", function()
      return H.seq({ 1, 2, 3, 4, 5 }):contiguous(lm.channels_last)
   end },
   { "contiguous", "nil self", function() return lm.Tensor.contiguous(nil) end },
   { "clone", "bad memory format", function() return x4():clone({ memory_format = "bogus" }) end },
   { "clone", "channels_last on 2-D", function()
      return H.seq({ 2, 3 }):clone({ memory_format = lm.channels_last })
   end },
   { "clone", "nil self", function() return lm.Tensor.clone(nil) end },
   { "to", "no argument", function() return x4():to() end },
   { "to", "number", function() return x4():to(42) end },
   { "to", "unknown string", function() return x4():to("gpu") end },
   { "to", "bad dtype in opts", function() return x4():to({ dtype = "float8" }) end },
   { "to", "channels_last on 3-D", function() return H.seq({ 2, 3, 4 }):to(lm.channels_last) end },
   { "to", "channels_last_3d on 4-D", function() return x4():to(lm.channels_last_3d) end },
   { "to", "nil self", function() return lm.Tensor.to(nil, lm.float64) end },
   { "view", "nil sizes", function() return x4():view(nil) end },
   { "view", "wrong element count", function() return x4():view({ 7, 7 }) end },
   { "view", "two -1", function() return x4():view({ -1, -1 }) end },
   { "view", "size -2", function() return x4():view({ -2, -60 }) end },
   { "view", "fractional size", function() return x4():view({ 2.5, 48 }) end },
   { "view", "incompatible strides", function()
      return H.seq({ 2, 3, 4, 5 }, lm.channels_last):view({ 2, 60 })
   end },
   { "view", "nil self", function() return lm.view(nil, { 2 }) end },
   { "reshape", "wrong element count", function() return x4():reshape({ 7, -1 }) end },
   { "view", "-1 is ambiguous for 0 elements", function()
      return lm.zeros({ 0, 3 }):view({ -1, 0 })
   end },
   { "reshape", "string sizes", function() return x4():reshape("2,60") end },
   { "permute", "too few dims", function() return x4():permute(1, 2) end },
   { "permute", "repeated dim", function() return x4():permute(1, 2, 2, 3) end },
   { "permute", "dim out of range", function() return x4():permute(1, 2, 3, 5) end },
   { "permute", "nil dims", function() return x4():permute(nil) end },
   { "transpose", "missing dim", function() return x4():transpose(1) end },
   { "transpose", "dim out of range", function() return x4():transpose(1, 5) end },
   { "transpose", "string dim", function() return x4():transpose("1", 2) end },
   { "expand", "non-1 dim", function() return H.seq({ 3, 2 }):expand({ 3, 4 }) end },
   { "expand", "fewer dims", function() return H.seq({ 2, 3 }):expand({ 3 }) end },
   { "expand", "nil sizes", function() return v3():expand(nil) end },
   { "expand", "negative size", function() return H.seq({ 3, 1 }):expand({ 3, -2 }) end },
   { "narrow", "start 0", function() return x4():narrow(1, 0, 1) end },
   { "narrow", "past the end", function() return x4():narrow(4, 4, 3) end },
   { "narrow", "negative length", function() return x4():narrow(4, 1, -1) end },
   { "narrow", "dim out of range", function() return x4():narrow(5, 1, 1) end },
   { "narrow", "nil arguments", function() return x4():narrow() end },
   { "narrow", "0-dim", function() return lm.full({}, 1):narrow(1, 1, 1) end },
   { "select", "index 0", function() return x4():select(1, 0) end },
   { "select", "index past the end", function() return x4():select(1, 3) end },
   { "select", "dim out of range", function() return x4():select(0, 1) end },
   { "select", "nil index", function() return x4():select(1, nil) end },
   { "select", "0-dim", function() return lm.full({}, 1):select(1, 1) end },
   { "unsqueeze", "dim out of range", function() return x4():unsqueeze(6) end },
   { "unsqueeze", "nil dim", function() return x4():unsqueeze(nil) end },
   { "unsqueeze", "beyond 8 dims", function()
      return lm.zeros({ 1, 1, 1, 1, 1, 1, 1, 1 }):unsqueeze(1)
   end },
   { "squeeze", "dim out of range", function() return x4():squeeze(5) end },
   { "squeeze", "string dim", function() return x4():squeeze("all") end },
   { "flatten", "start after end", function() return x4():flatten(3, 2) end },
   { "flatten", "dim out of range", function() return x4():flatten(1, 7) end },

   -- math -----------------------------------------------------------------------------------
   { "add", "tensor + nil", function() return x4() + nil end },
   { "add", "nil + tensor", function() return nil + x4() end },
   { "add", "tensor + string", function() return x4() + "1" end },
   { "add", "tensor + table", function() return x4() + {} end },
   { "add", "mismatched sizes", function() return H.seq({ 3 }) + H.seq({ 4 }) end },
   { "add", "non-number alpha", function() return v3():add(v3(), "2") end },
   { "add", "nil self", function() return lm.add(nil, v3()) end },
   { "sub", "mismatched sizes", function() return H.seq({ 2, 3 }) - H.seq({ 2 }) end },
   { "sub", "string", function() return v3() - "x" end },
   { "mul", "mismatched sizes", function() return H.seq({ 2, 3 }) * H.seq({ 3, 2 }) end },
   { "mul", "nil", function() return v3():mul(nil) end },
   { "div", "mismatched sizes", function() return H.seq({ 2 }) / H.seq({ 3 }) end },
   { "div", "boolean table", function() return v3():div({ true }) end },
   { "pow", "string exponent", function() return v3():pow("2") end },
   { "pow", "mismatched sizes", function() return v3():pow(H.seq({ 2 })) end },
   { "neg", "bool tensor", function() return -lm.tensor({ true }, { dtype = lm.bool }) end },
   { "neg", "nil self", function() return lm.neg(nil) end },
   { "abs", "nil self", function() return lm.Tensor.abs(nil) end },
   { "exp", "string self", function() return lm.Tensor.exp("x") end },
   { "log", "nil self", function() return lm.Tensor.log(nil) end },
   { "sqrt", "nil self", function() return lm.Tensor.sqrt(nil) end },
   { "relu", "nil self", function() return lm.Tensor.relu(nil) end },
   { "sigmoid", "nil self", function() return lm.Tensor.sigmoid(nil) end },
   { "tanh", "nil self", function() return lm.Tensor.tanh(nil) end },
   { "clamp", "no bounds", function() return v3():clamp() end },
   { "clamp", "string bound", function() return v3():clamp("0", 1) end },
   { "addcmul", "nil tensor1", function() return v3():addcmul(nil, v3()) end },
   { "addcmul", "mismatched sizes", function() return v3():addcmul(H.seq({ 2 }), v3()) end },
   { "addcmul", "string value", function() return v3():addcmul(v3(), v3(), "2") end },
   { "where", "nil condition", function() return lm.where(nil, v3(), v3()) end },
   { "where", "non-bool condition", function() return lm.where(v3(), v3(), v3()) end },
   { "where", "mismatched sizes", function()
      return lm.where(lm.zeros({ 2 }, { dtype = lm.bool }), v3(), v3())
   end },
   { "where", "string branch", function()
      return lm.where(lm.zeros({ 3 }, { dtype = lm.bool }), "a", v3())
   end },
   { "add_", "float into int64", function() return i64():add_(lm.tensor({ 0.5 })) end },
   { "add_", "would change self's shape", function() return v3():add_(H.seq({ 2, 3 })) end },
   { "add_", "nil", function() return v3():add_(nil) end },
   { "mul_", "string", function() return v3():mul_("2") end },
   { "add_", "into an expanded (overlapping) tensor", function()
      return lm.zeros({ 3, 1 }):expand({ 3, 4 }):add_(1)
   end },
   { "copy_", "into an expanded (overlapping) tensor", function()
      return lm.zeros({ 3, 1 }):expand({ 3, 4 }):copy_(lm.ones({ 3, 4 }))
   end },
   { "div_", "true division into int64", function() return i64():div_(2) end },
   { "pow", "integer to a negative integer power", function() return i64():pow(-1) end },
   { "mul_", "float scalar into int64", function() return i64():mul_(0.5) end },
   { "relu_", "nil self", function() return lm.Tensor.relu_(nil) end },
   { "zero_", "nil self", function() return lm.Tensor.zero_(nil) end },
   { "fill_", "string", function() return v3():fill_("1") end },
   { "fill_", "nil", function() return v3():fill_(nil) end },
   { "copy_", "nil source", function() return v3():copy_(nil) end },
   { "copy_", "not broadcastable", function() return v3():copy_(H.seq({ 2 })) end },
   { "copy_", "number source", function() return v3():copy_(3) end },

   -- reductions ---------------------------------------------------------------------------
   { "sum", "dim out of range", function() return x4():sum(5) end },
   { "sum", "string dim", function() return x4():sum("1") end },
   { "sum", "repeated dims", function() return x4():sum({ 1, 1 }) end },
   { "sum", "non-boolean keepdim", function() return x4():sum(1, "yes") end },
   { "mean", "integer input", function() return i64():mean() end },
   { "mean", "dim out of range", function() return x4():mean(-5) end },
   { "max", "dim out of range", function() return x4():max(5) end },
   { "max", "empty tensor, no dim", function() return lm.zeros({ 0 }):max() end },
   { "max", "reducing an empty dim", function() return lm.zeros({ 2, 0 }):max(2) end },
   { "min", "string dim", function() return x4():min("a") end },
   { "min", "empty tensor, no dim", function() return lm.zeros({ 0, 3 }):min() end },
   { "argmax", "dim out of range", function() return x4():argmax(0) end },
   { "argmax", "empty tensor", function() return lm.zeros({ 0 }):argmax() end },
   { "argmax", "non-boolean keepdim", function() return x4():argmax(1, 1) end },
   { "matmul", "mismatched inner sizes", function()
      return H.seq({ 2, 3 }):matmul(H.seq({ 2, 3 }))
   end },
   { "matmul", "nil", function() return H.seq({ 2, 3 }):matmul(nil) end },
   { "matmul", "0-dim", function() return lm.full({}, 1):matmul(lm.full({}, 1)) end },
   { "cat", "not a table", function() return lm.cat(v3(), 1) end },
   { "cat", "empty list", function() return lm.cat({}, 1) end },
   { "cat", "nil element", function() return lm.cat({ v3(), "x" }, 1) end },
   { "cat", "different ranks", function() return lm.cat({ v3(), H.seq({ 1, 3 }) }, 1) end },
   { "cat", "mismatched sizes", function()
      return lm.cat({ H.seq({ 2, 2 }), H.seq({ 2, 3 }) }, 1)
   end },
   { "cat", "dim out of range", function() return lm.cat({ v3(), v3() }, 2) end },
   { "cat", "0-dim tensors", function() return lm.cat({ lm.full({}, 1), lm.full({}, 2) }, 1) end },

   -- runtime --------------------------------------------------------------------------------
   { "set_num_threads", "zero", function() return lm.set_num_threads(0) end },
   { "set_num_threads", "string", function() return lm.set_num_threads("2") end },
}

describe("bad input raises lumen.<function>: errors", function()
   for _, c in ipairs(cases) do
      it(c[1] .. ": " .. c[2], function()
         H.assert_error(c[1], c[3])
      end)
   end
end)

describe("bad input never crashes or corrupts state", function()
   it("the library still works after every error above", function()
      for _, c in ipairs(cases) do pcall(c[3]) end
      local t = H.seq({ 2, 3 }) + 1
      H.assert_values(t, { 1, 2, 3, 4, 5, 6 })
   end)

   it("a freed tensor raises an error instead of touching freed memory", function()
      local t = H.seq({ 4 })
      if not t.free then return end -- :free() is a lumen extension
      t:free()
      t:free() -- twice is safe
      H.assert_error("add", function() return t + 1 end)
      H.assert_error("size", function() return t:size() end)
      H.assert_error("view", function() return t:view({ 2, 2 }) end)
      H.assert_error("sum", function() return t:sum() end)
   end)

   it("views keep their storage alive after the base is freed or collected", function()
      local x = H.seq({ 4, 4 })
      local v = x:narrow(1, 2, 2)
      if x.free then x:free() end
      x = nil -- luacheck: ignore
      collectgarbage()
      collectgarbage()
      H.assert_values(v, { 4, 5, 6, 7, 8, 9, 10, 11 })
   end)

   it("error messages name the problem", function()
      H.assert_error_like("view", "compatible", function()
         return H.seq({ 2, 3, 4, 5 }, lm.channels_last):view({ 2, 60 })
      end)
      H.assert_error_like("empty", "rank 4", function()
         return lm.empty({ 2, 3 }, { memory_format = lm.channels_last })
      end)
      H.assert_error_like("contiguous", "preserve", function()
         return H.seq({ 2 }):contiguous(lm.preserve_format)
      end)
   end)
end)
