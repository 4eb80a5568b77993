-- spec/reduce_spec.lua -- sum / mean / max / min / argmax (docs/api.md "Reductions") in both
-- memory formats: values against PyTorch 1.13 (spec/fixtures/core/values.lua) and output strides.
--
-- Output layout: PyTorch 1.13 allocates every reduction output contiguous, also for
-- channels-last inputs (checked with /usr/bin/python3: x_cl.sum(1, keepdim=True) has strides
-- (20,20,5,1), x_cl.sum((2,3), keepdim=True) has (3,1,1,1), x_cl.max(1) values and indices are
-- contiguous). lumen follows.
--
-- Indices: lumen's max(dim) / min(dim) / argmax / argmin return 1-BASED int64 indices (like every
-- index of the Lua API; lua/lumen/tensor.lua documents it). PyTorch's 0-based indices from the
-- fixture are shifted by one here. Ties resolve to the first occurrence, as PyTorch's CPU kernels.
local H = require("spec.helpers")
local lm = H.lm

local V = H.fixture("values")
local R = V.reduce
local SIZES = { 2, 3, 4, 5 }

local function g(fmt, dtype) return H.seq(SIZES, fmt, dtype, V.g) end

local function contig(sizes) return H.contig_strides(sizes) end

local function without(sizes, d, keep)
   local r = {}
   for i = 1, #sizes do
      if i ~= d then r[#r + 1] = sizes[i] elseif keep then r[#r + 1] = 1 end
   end
   return r
end

local function plus1(list)
   local r = {}
   for i = 1, #list do r[i] = list[i] + 1 end
   return r
end

local formats = { { "contiguous", nil }, { "channels_last", lm.channels_last } }

for _, F in ipairs(formats) do
   local fname, fmt = F[1], F[2]
   describe("reductions of a " .. fname .. " (2,3,4,5) tensor", function()
      for _, op in ipairs({ "sum", "mean" }) do
         it(op .. " over every dim, with and without keepdim; contiguous outputs", function()
            for d = 1, 4 do
               local exp = R[op .. "_" .. d]
               local r = g(fmt)[op](g(fmt), d)
               H.assert_layout(r, exp.sizes, contig(exp.sizes), op .. "(" .. d .. ")")
               H.assert_close(r, exp.v, 1e-6, op .. "(" .. d .. ")")
               H.assert_dtype(r, lm.float32)
               local k = g(fmt)[op](g(fmt), d, true)
               local ks = without(SIZES, d, true)
               H.assert_layout(k, ks, contig(ks), op .. "(" .. d .. ", keepdim)")
               H.assert_close(k, exp.v, 1e-6, op .. "(" .. d .. ", keepdim)")
               -- negative dims
               H.assert_close(g(fmt)[op](g(fmt), d - 5), exp.v, 1e-6, op .. "(" .. (d - 5) .. ")")
            end
         end)
         it(op .. " over several dims {3, 4}", function()
            local exp = R[op .. "_34"]
            local r = g(fmt)[op](g(fmt), { 3, 4 })
            H.assert_layout(r, { 2, 3 }, { 3, 1 })
            H.assert_close(r, exp.v, 1e-6)
            local k = g(fmt)[op](g(fmt), { 3, 4 }, true)
            H.assert_layout(k, { 2, 3, 1, 1 }, { 3, 1, 1, 1 })
            H.assert_close(k, exp.v, 1e-6)
            H.assert_close(g(fmt)[op](g(fmt), { -1, -2 }), exp.v, 1e-6, "negative dims")
         end)
         it(op .. " over all elements is 0-dim", function()
            local r = g(fmt)[op](g(fmt))
            assert.equal(0, r:dim())
            H.assert_close({ r:item() }, R[op .. "_all"], 1e-6)
         end)
      end

      for _, op in ipairs({ "max", "min" }) do
         it(op .. "(dim) returns values and 1-based int64 indices", function()
            for d = 1, 4 do
               local exp = R[op .. "_" .. d]
               local x = g(fmt)
               local v, i = x[op](x, d)
               local s = without(SIZES, d, false)
               H.assert_layout(v, s, contig(s), op .. " values")
               H.assert_layout(i, s, contig(s), op .. " indices")
               H.assert_dtype(i, lm.int64)
               H.assert_close(v, exp.v, 0, op .. "(" .. d .. ") values")
               H.assert_values(i, plus1(exp.i0), op .. "(" .. d .. ") indices")
               local vk, ik = x[op](x, d, true)
               local sk = without(SIZES, d, true)
               H.assert_layout(vk, sk, contig(sk), op .. " keepdim values")
               H.assert_layout(ik, sk, contig(sk), op .. " keepdim indices")
               H.assert_values(ik, plus1(exp.i0))
            end
         end)
         it(op .. "() over all elements is a 0-dim value", function()
            local r = g(fmt)[op](g(fmt))
            assert.equal(0, r:dim())
            assert.equal(R[(op == "max" and "amax" or "amin") .. "_all"][1], r:item())
         end)
      end

      for _, op in ipairs({ "argmax", "argmin" }) do
         it(op .. "(dim) and " .. op .. "() are 1-based", function()
            for d = 1, 4 do
               local x = g(fmt)
               local r = x[op](x, d)
               local s = without(SIZES, d, false)
               H.assert_layout(r, s, contig(s))
               H.assert_dtype(r, lm.int64)
               H.assert_values(r, plus1(R[op .. "_" .. d]))
               local k = x[op](x, d, true)
               H.assert_sizes(k, without(SIZES, d, true))
            end
            local a = g(fmt)[op](g(fmt))
            assert.equal(0, a:dim())
            assert.equal(R[op .. "_all"] + 1, a:item())
         end)
      end
   end)
end

describe("reductions: details", function()
   it("argmax / max ties pick the first occurrence", function()
      local t = lm.tensor({ 1, 3, 3, 2 }, { dtype = lm.float32 })
      assert.equal(2, t:argmax():item())
      local m = lm.tensor({ { 1, 3, 3 }, { 2, 2, 1 } }, { dtype = lm.float32 })
      H.assert_values(m:argmax(2), { 2, 1 })
      local v, i = m:max(2)
      H.assert_values(v, { 3, 2 })
      H.assert_values(i, { 2, 1 })
      local n = lm.tensor({ { 1, 1, 3 }, { 2, 0, 0 } }, { dtype = lm.float32 })
      H.assert_values(n:argmin(2), { 1, 2 })
      local _, j = n:min(2)
      H.assert_values(j, { 1, 2 })
      -- ties in a channels-last tensor are still resolved in logical order
      local c = lm.zeros({ 1, 3, 2, 2 }, { memory_format = lm.channels_last })
      H.assert_values(c:argmax(2), { 1, 1, 1, 1 })
      assert.equal(1, c:argmax():item())
   end)

   it("keepdim output of a channels-last input is contiguous (as PyTorch 1.13)", function()
      local x = H.seq({ 2, 3, 4, 5 }, lm.channels_last)
      H.assert_layout(x:sum(2, true), { 2, 1, 4, 5 }, { 20, 20, 5, 1 })
      H.assert_layout(x:mean({ 3, 4 }, true), { 2, 3, 1, 1 }, { 3, 1, 1, 1 })
      H.assert_layout(x:sum(1, true), { 1, 3, 4, 5 }, { 60, 20, 5, 1 })
   end)

   it("non-dense and expanded inputs reduce their logical values", function()
      local w = H.strided({ 2, 3, 4, 3 }, { 60, 1, 15, 6 })
      H.assert_close(w:sum(), { 71 * 72 / 2 }, 0)
      local e = H.seq({ 3 }):view({ 3, 1 }):expand({ 3, 1000 })
      H.assert_values(e:sum(2), { 0, 1000, 2000 })
      H.assert_close(e:mean(), { 1 }, 1e-6)
   end)

   it("integer and bool sums are int64; float16 stays float16", function()
      local s = lm.tensor({ 1, 2, 3 }, { dtype = lm.int32 }):sum()
      H.assert_dtype(s, lm.int64)
      assert.equal(6, s:item())
      local b = lm.tensor({ true, true, false }, { dtype = lm.bool }):sum()
      H.assert_dtype(b, lm.int64)
      assert.equal(2, b:item())
      local h = lm.tensor({ 1, 2 }, { dtype = lm.float16 }):sum()
      H.assert_dtype(h, lm.float16)
      assert.equal(3, h:item())
      H.assert_dtype(lm.tensor({ 1, 2 }, { dtype = lm.float64 }):mean(), lm.float64)
   end)

   it("sums of many float32 values stay accurate", function()
      local t = lm.full({ 1000000 }, 0.1)
      H.assert_close({ t:sum():item() }, { 100000 }, 1e-4)
      H.assert_close({ t:mean():item() }, { 0.1 }, 1e-5)
   end)

   -- kernels/cpu/reduce.c colsum_f32: float32 column sums in chunks of rows
   it("column sums of large float32 matrices and channels-last sums over N, H, W", function()
      lm.manual_seed(5)
      local cases = {
         { lm.randn({ 3000, 300 }) + 2, { 1 } },
         { lm.randn({ 8, 40, 50, 60 }):contiguous(lm.channels_last), { 1, 3, 4 } },
         { lm.randn({ 100000, 7 }), { 1 } },
      }
      for _, c in ipairs(cases) do
         local x, dims = c[1], c[2]
         local got, ref = x:sum(dims), x:double():sum(dims)
         local err = (got:double() - ref):abs():max():item()
         assert.is_true(err <= 1e-6 * math.max(1, ref:abs():max():item()), "error " .. err)
         assert.is_true(got:dtype() == lm.float32)
         local m = x:mean(dims, true)
         assert.is_true((m:double() - x:double():mean(dims, true)):abs():max():item() < 1e-6)
         -- the same bits on one thread as on two
         local nt = lm.get_num_threads()
         lm.set_num_threads(1)
         local one = x:sum(dims)
         lm.set_num_threads(nt)
         assert.is_true((one - got):abs():max():item() == 0, "thread count changed the bits")
      end
   end)

   it("empty inputs: sum is 0, mean is NaN", function()
      assert.equal(0, lm.zeros({ 0 }):sum():item())
      H.assert_values(lm.zeros({ 0, 3 }):sum(1), { 0, 0, 0 })
      local m = H.values(lm.zeros({ 0, 3 }):mean(1))
      assert.equal(3, #m)
      assert.is_true(m[1] ~= m[1])
   end)

   it("NaN propagates through max and sum", function()
      local t = lm.tensor({ 1, 0 / 0, 3 }, { dtype = lm.float32 })
      local m = t:max():item()
      assert.is_true(m ~= m)
      local s = t:sum():item()
      assert.is_true(s ~= s)
   end)

   it("max / min of a 1-D tensor along dim 1", function()
      local t = lm.tensor({ 4, 9, 2 }, { dtype = lm.float32 })
      local v, i = t:max(1)
      assert.equal(0, v:dim())
      assert.equal(9, v:item())
      assert.equal(2, i:item())
      local w, j = t:min(1, true)
      H.assert_sizes(w, { 1 })
      assert.equal(2, w:item())
      assert.equal(3, j:item())
   end)
end)
