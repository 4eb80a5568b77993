-- spec/print_spec.lua -- tostring(t) shows the values, the sizes, the dtype and the memory format.
local H = require("spec.helpers")
local lm = H.lm

local function has(s, needle)
   return s:find(needle, 1, true) ~= nil
end

local function sizes_shown(s, sizes)
   -- "2x3x4x5" (lumen's footer) or "(2, 3, 4, 5)" / "{2,3,4,5}" styles
   local parts = {}
   for i = 1, #sizes do parts[i] = tostring(sizes[i]) end
   local pat = table.concat(parts, "%s*[x×,]%s*")
   return s:find(pat) ~= nil
end

describe("tostring", function()
   it("shows values, sizes, dtype and format of a small tensor", function()
      local t = lm.tensor({ { 1.5, -2.25, 3 }, { 4, 5, 6 } }, { dtype = lm.float32 })
      local s = tostring(t)
      assert.is_true(has(s, "1.5"), s)
      assert.is_true(has(s, "-2.25"), s)
      assert.is_true(has(s, "6"), s)
      assert.is_true(sizes_shown(s, { 2, 3 }), s)
      assert.is_true(has(s, "float32"), s)
      assert.is_true(has(s, "contiguous"), s)
   end)

   it("names channels_last and channels_last_3d tensors", function()
      local s = tostring(H.seq({ 1, 2, 2, 2 }, lm.channels_last))
      assert.is_true(has(s, "channels_last"), s)
      assert.is_true(sizes_shown(s, { 1, 2, 2, 2 }), s)
      -- values in logical order: channel 1 holds 0..3, channel 2 holds 4..7
      local p0, p3, p4 = s:find("0", 1, true), s:find("3", 1, true), s:find("4", 1, true)
      assert.is_true(p0 ~= nil and p3 ~= nil and p4 ~= nil and p3 < p4, s)
      local s3 = tostring(lm.zeros({ 1, 2, 1, 2, 2 }, { memory_format = lm.channels_last_3d }))
      assert.is_true(has(s3, "channels_last_3d"), s3)
   end)

   it("shows every dtype's name", function()
      local names = { "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool" }
      for _, name in ipairs(names) do
         local s = tostring(lm.ones({ 2 }, { dtype = lm[name] }))
         assert.is_true(has(s, name), s)
      end
      local b = tostring(lm.tensor({ true, false }))
      assert.is_true(has(b, "true") and has(b, "false"), b)
      local i = tostring(lm.tensor({ 7, -12 }, { dtype = lm.int64 }))
      assert.is_true(has(i, "7") and has(i, "-12"), i)
   end)

   it("0-dim, empty and non-contiguous tensors", function()
      local z = tostring(lm.full({}, 2.5))
      assert.is_true(has(z, "2.5"), z)
      local e = tostring(lm.zeros({ 0, 3 }))
      assert.is_true(sizes_shown(e, { 0, 3 }), e)
      local n = tostring(H.seq({ 3, 4 }):transpose(1, 2))
      assert.is_true(sizes_shown(n, { 4, 3 }), n)
      assert.is_true(has(n, "11"), n)
   end)

   it("abbreviates large tensors", function()
      local s = tostring(lm.zeros({ 1000, 1000 }))
      assert.is_true(#s < 20000, "printed " .. #s .. " characters")
      assert.is_true(sizes_shown(s, { 1000, 1000 }), s:sub(-200))
   end)

   it("NaN and infinities print", function()
      local s = tostring(lm.tensor({ 0 / 0, 1 / 0, -1 / 0 }, { dtype = lm.float32 }))
      assert.is_true(s:lower():find("nan") ~= nil and s:lower():find("inf") ~= nil, s)
   end)

   it("formats and dtypes print their names", function()
      assert.equal("channels_last", tostring(lm.channels_last))
      assert.equal("float32", tostring(lm.float32))
   end)
end)
