-- spec/random_spec.lua -- manual_seed, rand, randn, randint, *_like random fills; the generator is
-- counter-based, so results do not depend on the thread count.
local H = require("spec.helpers")
local lm = H.lm

local function stats(t)
   local v = H.values(t)
   local s, s2 = 0, 0
   for i = 1, #v do s = s + v[i]; s2 = s2 + v[i] * v[i] end
   local mean = s / #v
   return mean, math.sqrt(s2 / #v - mean * mean), v
end

local function same(a, b)
   local va, vb = H.values(a), H.values(b)
   if #va ~= #vb then return false end
   for i = 1, #va do
      if va[i] ~= vb[i] then return false end
   end
   return true
end

describe("random numbers", function()
   it("manual_seed makes rand, randn and randint reproducible", function()
      lm.manual_seed(42)
      local a, b, c = lm.rand({ 1000 }), lm.randn({ 1000 }), lm.randint(0, 10, { 1000 })
      lm.manual_seed(42)
      local a2, b2, c2 = lm.rand({ 1000 }), lm.randn({ 1000 }), lm.randint(0, 10, { 1000 })
      assert.is_true(same(a, a2), "rand")
      assert.is_true(same(b, b2), "randn")
      assert.is_true(same(c, c2), "randint")
      lm.manual_seed(43)
      assert.is_false(same(a, lm.rand({ 1000 })), "another seed gives other numbers")
   end)

   it("successive calls give different numbers", function()
      lm.manual_seed(1)
      assert.is_false(same(lm.rand({ 100 }), lm.rand({ 100 })))
   end)

   it("rand is uniform in [0, 1)", function()
      lm.manual_seed(7)
      local t = lm.rand({ 100000 })
      H.assert_dtype(t, lm.float32)
      local mean, std, v = stats(t)
      for i = 1, #v do
         assert(v[i] >= 0 and v[i] < 1, "value out of [0,1): " .. v[i])
      end
      assert.is_true(math.abs(mean - 0.5) < 0.01, "mean " .. mean)
      assert.is_true(math.abs(std - math.sqrt(1 / 12)) < 0.01, "std " .. std)
      local lo, hi = 0, 0
      for i = 1, #v do
         if v[i] < 0.1 then lo = lo + 1 elseif v[i] >= 0.9 then hi = hi + 1 end
      end
      assert.is_true(math.abs(lo - 10000) < 600 and math.abs(hi - 10000) < 600, "tails")
   end)

   it("randn has mean 0 and std 1", function()
      lm.manual_seed(7)
      local mean, std = stats(lm.randn({ 100000 }))
      assert.is_true(math.abs(mean) < 0.02, "mean " .. mean)
      assert.is_true(math.abs(std - 1) < 0.02, "std " .. std)
      local m64, s64 = stats(lm.randn({ 50000 }, { dtype = lm.float64 }))
      assert.is_true(math.abs(m64) < 0.03 and math.abs(s64 - 1) < 0.03)
   end)

   it("rand and randn fill float16, bfloat16 and float64", function()
      for _, dt in ipairs({ lm.float16, lm.bfloat16, lm.float64 }) do
         local t = lm.rand({ 1000 }, { dtype = dt })
         H.assert_dtype(t, dt)
         local mean, _, v = stats(t)
         for i = 1, #v do assert(v[i] >= 0 and v[i] <= 1, tostring(dt) .. " " .. v[i]) end
         assert.is_true(math.abs(mean - 0.5) < 0.05)
         H.assert_dtype(lm.randn({ 10 }, { dtype = dt }), dt)
      end
   end)

   it("randint gives int64 in [low, high), every value", function()
      lm.manual_seed(3)
      local t = lm.randint(-3, 4, { 10000 })
      H.assert_dtype(t, lm.int64)
      local seen = {}
      for _, x in ipairs(H.values(t)) do
         assert(x >= -3 and x < 4 and x % 1 == 0, "value " .. x)
         seen[x] = (seen[x] or 0) + 1
      end
      for k = -3, 3 do
         assert.is_true((seen[k] or 0) > 1200, "value " .. k .. " too rare")
      end
      local u = lm.randint(0, 2, { 3, 4 }, { dtype = lm.int32 })
      H.assert_dtype(u, lm.int32)
      H.assert_sizes(u, { 3, 4 })
   end)

   it("randint with a huge range stays in range", function()
      local t = lm.randint(0, 2 ^ 40, { 1000 })
      for _, x in ipairs(H.values(t)) do assert(x >= 0 and x < 2 ^ 40) end
   end)

   it("gives the same values with 1 and 2 threads", function()
      local n = 1000003
      local orig = lm.get_num_threads()
      finally(function() lm.set_num_threads(orig) end)
      lm.set_num_threads(1)
      lm.manual_seed(99)
      local a, b, c = lm.rand({ n }), lm.randn({ n }), lm.randint(0, 1000, { n })
      lm.set_num_threads(2)
      lm.manual_seed(99)
      local a2, b2, c2 = lm.rand({ n }), lm.randn({ n }), lm.randint(0, 1000, { n })
      assert.is_true((a - a2):abs():max():item() == 0, "rand")
      assert.is_true((b - b2):abs():max():item() == 0, "randn")
      assert.is_true((c - c2):abs():max():item() == 0, "randint")
   end)

   it("rand_like / randn_like keep the layout and draw new numbers", function()
      local x = lm.zeros({ 2, 3, 4, 5 }, { memory_format = lm.channels_last })
      local r = lm.rand_like(x)
      H.assert_strides(r, { 60, 1, 15, 3 })
      local mean = stats(r)
      assert.is_true(mean > 0.3 and mean < 0.7)
      H.assert_strides(lm.randn_like(x), { 60, 1, 15, 3 })
      lm.manual_seed(5)
      local p = lm.rand_like(x)
      lm.manual_seed(5)
      assert.is_true(same(p, lm.rand_like(x)))
   end)

   it("empty tensors and 0-dim tensors", function()
      assert.equal(0, lm.rand({ 0 }):numel())
      local s = lm.rand({})
      assert.equal(0, s:dim())
      assert.is_true(s:item() >= 0 and s:item() < 1)
   end)
end)
