-- spec/indexing_spec.lua -- Torch7 indexing on tensors (lua/lumen/tensor.lua, index_get /
-- index_set): t[i], t[i] = v, t[{i, {a, b}, {}, ":"}] read and write, negative indices, 1-D
-- results as Lua numbers, views keeping the memory format's strides, gradients, clear errors.

local H = require("spec.helpers")
local lm = H.lm

local function m34()
   return lm.arange(12):view(3, 4):to(lm.float32)      -- {{0,1,2,3},{4,5,6,7},{8,9,10,11}}
end

describe("Torch7 indexing", function()
   describe("reading", function()
      it("t[i] is t:select(1, i): a view, 1-based, negative from the end", function()
         local t = m34()
         H.assert_values(t[1], { 0, 1, 2, 3 })
         H.assert_values(t[3], { 8, 9, 10, 11 })
         H.assert_values(t[-1], { 8, 9, 10, 11 })
         H.assert_values(t[-3], { 0, 1, 2, 3 })
         local row = t[2]
         assert.is_true(row:is_same_storage(t))
         t[2][1] = 40
         assert.are.equal(40, t[{ 2, 1 }])
      end)

      it("on a 1-D tensor gives a Lua number", function()
         local v = lm.tensor({ 5, 6, 7 })
         assert.are.equal("number", type(v[1]))
         assert.are.equal(7, v[3])
         assert.are.equal(7, v[-1])
         assert.are.equal(6, m34()[2][3])
         assert.are.equal(true, lm.tensor({ true, false }, { dtype = lm.bool })[1])
         assert.are.equal(9, lm.tensor({ 9 }, { dtype = lm.int64 })[1])
      end)

      it("keeps the memory format's strides", function()
         local x = lm.randn({ 2, 3, 4, 5 }):to(lm.channels_last)
         H.assert_strides(x[2], { 1, 15, 3 })
         H.assert_strides(x[{ {}, {2, 3} }], { 60, 1, 15, 3 })
         assert.is_true(x[{ {}, {2, 3} }]:is_same_storage(x))
         H.assert_close(x[2], x:select(1, 2):totable(), 0)
      end)

      it("t[{...}]: numbers select, {a, b} inclusive ranges, {a}, {} and \":\"", function()
         local t = m34()
         assert.are.equal(6, t[{ 2, 3 }])
         assert.are.equal("number", type(t[{ -1, -1 }]))
         assert.are.equal(11, t[{ -1, -1 }])
         H.assert_values(t[{ 2 }], { 4, 5, 6, 7 })
         H.assert_values(t[{ { 2, 3 }, { -2, -1 } }], { { 6, 7 }, { 10, 11 } })
         H.assert_values(t[{ ":", 2 }], { 1, 5, 9 })
         H.assert_values(t[{ {}, { 2 } }], { { 1 }, { 5 }, { 9 } })
         H.assert_values(t[{ { 3 } }], { { 8, 9, 10, 11 } })
         H.assert_values(t[{}], t:totable())
         H.assert_sizes(t[{ { 1, 3 }, ":" }], { 3, 4 })
      end)

      it("records autograd like select and narrow", function()
         local x = lm.tensor({ 1, 2, 3 }, { dtype = lm.float32, requires_grad = true })
         local y = x * 2
         local z = y[{ { 2, 3 } }]:sum() + y[{ { 1 } }]:sum() * 10
         z:backward()
         H.assert_values(x.grad, { 20, 2, 2 })
         local w = lm.ones({ 2, 3 }, { requires_grad = true })
         ;(w * 3)[2]:sum():backward()
         H.assert_values(w.grad, { { 0, 0, 0 }, { 3, 3, 3 } })
      end)

      it("leaves method lookup and fields alone", function()
         local t = m34()
         assert.are.equal("function", type(t.add))
         assert.is_nil(t.no_such_method)
         H.assert_sizes(lm.zeros({ 2, 2 }), t.shape and { 2, 2 } or nil)
         t.my_field = 3
         assert.are.equal(3, rawget(t, "my_field"))
         t.requires_grad = true
         assert.is_true(t.requires_grad)
      end)
   end)

   describe("writing", function()
      it("t[i] = number fills the slice; t[{...}] = number", function()
         local t = m34()
         t[1] = 5
         t[{ 2, { 1, 2 } }] = -1
         t[{ -1, -1 }] = 100
         H.assert_values(t, { { 5, 5, 5, 5 }, { -1, -1, 6, 7 }, { 8, 9, 10, 100 } })
         local v = lm.zeros({ 3 })
         v[2] = 7
         v[-1] = 8
         H.assert_values(v, { 0, 7, 8 })
      end)

      it("t[i] = tensor copies, broadcasting to the slice", function()
         local t = m34()
         t[3] = lm.tensor({ 1, 2, 3, 4 })
         t[{ {}, 4 }] = lm.tensor({ 9 })
         t[{ { 1, 2 }, { 1, 2 } }] = lm.tensor({ { 0, 1 } })
         H.assert_values(t, { { 0, 1, 2, 9 }, { 0, 1, 6, 9 }, { 1, 2, 3, 9 } })
      end)

      it("writes through to a channels-last tensor's storage", function()
         local x = lm.zeros({ 1, 2, 2, 2 }):to(lm.channels_last)
         x[{ 1, 2 }] = 1
         H.assert_strides(x, { 8, 1, 4, 2 })
         H.assert_values(x:sum(), 4)
         assert.are.equal(1, x[{ 1, 2, 2, 2 }])
         assert.are.equal(0, x[{ 1, 1, 2, 2 }])
      end)
   end)

   describe("errors", function()
      it("names the index, the dimension and its size", function()
         local t = m34()
         H.assert_error_like("index", "index 4 is out of range for dimension 1 of size 3",
                             function() return t[4] end)
         H.assert_error_like("index", "index -4 is out of range",
                             function() return t[-4] end)
         H.assert_error_like("index", "index 0 is out of range for dimension 1 of size 3 " ..
                             "(indices are 1-based",
                             function() return t[0] end)
         H.assert_error_like("index", "index must be an integer, got 1.5",
                             function() return t[1.5] end)
         H.assert_error_like("index", "index 5 (entry 2) is out of range for dimension 2 " ..
                             "of size 4", function() return t[{ 1, 5 }] end)
         H.assert_error_like("index", "range {2, 5} (entry 2) is out of range for " ..
                             "dimension 2 of size 4", function() return t[{ {}, { 2, 5 } }] end)
         H.assert_error_like("index", "range {3, 2}", function() return t[{ { 3, 2 } }] end)
         H.assert_error_like("index", "3 indices for a tensor of 2 dimension",
                             function() return t[{ 1, 1, 1 }] end)
         H.assert_error_like("index", "entry 1 must be a number, a range", function()
            return t[{ "x" }]
         end)
         H.assert_error_like("index", "cannot index a 0-dim tensor",
                             function() return lm.tensor(3)[1] end)
         H.assert_error_like("index",
                             "a tensor index (a mask or a list of indices) is not supported",
                             function() return t[lm.tensor({ 1 })] end)
      end)

      it("rejects values that are not numbers or tensors, or do not broadcast", function()
         local t = m34()
         H.assert_error_like("index", "must be a number or a tensor, got string",
                             function() t[1] = "a" end)
         H.assert_error_like("index", "cannot assign a tensor of size (3) to a slice of " ..
                             "size (4)", function() t[1] = lm.ones({ 3 }) end)
         H.assert_error_like("index", "index 9 is out of range", function() t[9] = 1 end)
         -- nothing was written
         H.assert_values(t, m34():totable())
      end)

      it("points at the caller's line", function()
         local t = m34()
         local ok, msg = pcall(function() return t[7] end)
         assert.is_false(ok)
         assert.truthy(msg:find("indexing_spec.lua:%d+: lumen.index:"), msg)
      end)
   end)
end)
