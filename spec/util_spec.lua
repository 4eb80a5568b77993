-- spec/util_spec.lua -- lumen.util's helpers for benchmarks and training scripts
local util = require("lumen.util")

describe("util.median", function()
   it("takes the middle of an odd count, the mean of the middle two of an even one", function()
      assert.are.equal(3, (util.median({ 5, 1, 3 })))
      assert.are.equal(2.5, (util.median({ 4, 1, 3, 2 })))
      assert.are.equal(7, (util.median({ 7 })))
   end)
   it("returns a sorted copy and leaves the list as it was", function()
      local t = { 3, 1, 2 }
      local m, s = util.median(t)
      assert.are.equal(2, m)
      assert.are.same({ 1, 2, 3 }, s)
      assert.are.same({ 3, 1, 2 }, t)
   end)
   it("rejects what is not a list of numbers, naming itself", function()
      assert.has_error(function() util.median(nil) end,
                       "lumen.util.median: expected a list of numbers, got nil")
      assert.has_error(function() util.median({ 1, "2", 3 }) end,
                       "lumen.util.median: element 2 is a string, expected a number")
   end)
   it("gives nil for an empty list", function()
      local m, s = util.median({})
      assert.is_nil(m)
      assert.are.same({}, s)
   end)
end)
