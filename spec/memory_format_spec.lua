-- spec/memory_format_spec.lua -- every worked table of /work/shared/spec/memory_format.md
-- (sections 1, 2.6, 5 and 6), plus a check of the predicates, *_like, clone and the elementwise
-- output strides against PyTorch 1.13 on a generated set of layouts
-- (spec/fixtures/core/layouts.lua).
local H = require("spec.helpers")
local lm = H.lm

local CONTIG, CL, CL3D = "contiguous_format", "channels_last", "channels_last_3d"

local function es(sizes, strides) return lm.empty_strided(sizes, strides) end

-- x = 0..119 as (2,3,4,5) float32, contiguous / channels-last
local function x_nchw() return H.seq({ 2, 3, 4, 5 }) end
local function x_cl() return H.seq({ 2, 3, 4, 5 }, lm.channels_last) end

-- expected values of x[..., ::2] and friends, computed in Lua from the logical index
local function values_of(sizes, f)
   local out = {}
   local n, c, h, w = sizes[1], sizes[2], sizes[3], sizes[4]
   for i = 0, n - 1 do
      for j = 0, c - 1 do
         for k = 0, h - 1 do
            for l = 0, w - 1 do out[#out + 1] = f(i, j, k, l) end
         end
      end
   end
   return out
end

-- ---------------------------------------------------------------------------------------------
-- A plain-Lua model of the predicates of spec section 2 (used on layouts PyTorch cannot build,
-- e.g. with 5-D "strides like" checks, and to cross-check lumen on many layouts).
-- ---------------------------------------------------------------------------------------------
local model = {}

function model.contiguous(sizes, strides)
   local numel = H.prod(sizes)
   if numel == 0 then return true end
   local expected = 1
   for d = #sizes, 1, -1 do
      if sizes[d] ~= 1 then
         if strides[d] ~= expected then return false end
         expected = expected * sizes[d]
      end
   end
   return true
end

local function cl_walk(sizes, strides, order)
   local expected = 1
   for _, d in ipairs(order) do
      if sizes[d] ~= 1 then
         if strides[d] ~= expected then return false end
         expected = expected * sizes[d]
      end
   end
   return true
end

function model.cl_contiguous(sizes, strides)
   return #sizes == 4 and cl_walk(sizes, strides, { 2, 4, 3, 1 })
end

function model.cl3d_contiguous(sizes, strides)
   return #sizes == 5 and cl_walk(sizes, strides, { 2, 5, 4, 3, 1 })
end

local function strides_like(sizes, strides, order)
   local c = order[1]
   if strides[c] == 0 then return false end
   local min = 0
   for _, d in ipairs(order) do
      if sizes[d] == 0 then return false end
      if strides[d] < min then return false end
      if d == 1 and min == strides[c] then return false end
      min = strides[d] * (sizes[d] > 1 and sizes[d] or 1)
   end
   return true
end

function model.cl_like(sizes, strides)
   return #sizes == 4 and strides_like(sizes, strides, { 2, 4, 3, 1 })
end

function model.cl3d_like(sizes, strides)
   return #sizes == 5 and strides_like(sizes, strides, { 2, 5, 4, 3, 1 })
end

function model.nod(sizes, strides)
   if model.contiguous(sizes, strides) or model.cl_contiguous(sizes, strides)
      or model.cl3d_contiguous(sizes, strides) then
      return true
   end
   local nd = #sizes
   if nd == 1 then return sizes[1] < 2 or strides[1] == 1 end
   local perm = {}
   for i = 1, nd do perm[i] = i end
   -- stable insertion sort: size<2 dims go last, else by ascending stride
   local function less(a, b)
      if sizes[a] < 2 then return false end
      if sizes[b] < 2 then return true end
      return strides[a] < strides[b]
   end
   for i = 2, nd do
      local j = i
      while j > 1 and less(perm[j], perm[j - 1]) do
         perm[j], perm[j - 1] = perm[j - 1], perm[j]
         j = j - 1
      end
   end
   local require_ = 1
   for i = 1, nd do
      local d = perm[i]
      if sizes[d] < 2 then return true end
      if strides[d] ~= require_ then return false end
      require_ = require_ * sizes[d]
   end
   return true
end

function model.suggest(sizes, strides)
   if model.cl_like(sizes, strides) then return CL end
   if model.cl3d_like(sizes, strides) then return CL3D end
   return CONTIG
end

-- ---------------------------------------------------------------------------------------------
describe("memory formats: constants", function()
   it("print their names", function()
      assert.equal("contiguous_format", tostring(lm.contiguous_format))
      assert.equal("channels_last", tostring(lm.channels_last))
      assert.equal("channels_last_3d", tostring(lm.channels_last_3d))
      assert.equal("preserve_format", tostring(lm.preserve_format))
   end)
end)

describe("memory formats: section 1, allocation strides", function()
   local rows = {
      { { 10, 3, 16, 16 }, { 768, 256, 16, 1 }, { 768, 1, 48, 3 } },
      { { 2, 3, 4, 5 }, { 60, 20, 5, 1 }, { 60, 1, 15, 3 } },
      { { 2, 1, 4, 5 }, { 20, 20, 5, 1 }, { 20, 1, 5, 1 } },
      { { 2, 3, 1, 1 }, { 3, 1, 1, 1 }, { 3, 1, 3, 3 } },
      { { 4, 1, 1, 1 }, { 1, 1, 1, 1 }, { 1, 1, 1, 1 } },
      { { 0, 3, 4, 5 }, { 60, 20, 5, 1 }, { 60, 1, 15, 3 } },
      { { 2, 0, 4, 5 }, { 20, 20, 5, 1 }, { 0, 1, 0, 0 } },
   }
   for _, r in ipairs(rows) do
      local sizes, cs, cls = r[1], r[2], r[3]
      it("sizes " .. H.fmt_list(sizes), function()
         H.assert_layout(lm.empty(sizes), sizes, cs, "empty")
         H.assert_layout(lm.empty(sizes, { memory_format = lm.contiguous_format }), sizes, cs,
            "empty contiguous_format")
         H.assert_layout(lm.empty(sizes, { memory_format = lm.channels_last }), sizes, cls,
            "empty channels_last")
         H.assert_strides(lm.zeros(sizes, { memory_format = lm.channels_last }), cls, "zeros cl")
         H.assert_strides(lm.ones(sizes, { memory_format = lm.channels_last }), cls, "ones cl")
         H.assert_strides(lm.full(sizes, 7, { memory_format = lm.channels_last }), cls, "full cl")
         H.assert_strides(lm.rand(sizes, { memory_format = lm.channels_last }), cls, "rand cl")
         H.assert_strides(lm.randn(sizes, { memory_format = lm.channels_last }), cls, "randn cl")
         H.assert_strides(lm.empty(sizes, { memory_format = lm.channels_last, dtype = lm.float16 }),
            cls, "empty cl float16")
      end)
   end

   it("channels_last_3d for (2,3,4,5,6)", function()
      local s = { 2, 3, 4, 5, 6 }
      H.assert_strides(lm.empty(s), { 360, 120, 30, 6, 1 }, "contiguous")
      H.assert_strides(lm.empty(s, { memory_format = lm.channels_last_3d }), { 360, 1, 90, 18, 3 },
         "cl3d")
      H.assert_strides(lm.zeros(s, { memory_format = lm.channels_last_3d }), { 360, 1, 90, 18, 3 },
         "zeros cl3d")
   end)

   it("size-0 dims: contiguous uses max(size,1), channels-last uses plain products", function()
      H.assert_strides(lm.empty({ 2, 3, 0, 5 }), { 15, 5, 5, 1 })
      H.assert_strides(lm.empty({ 2, 3, 0, 5 }, { memory_format = lm.channels_last }),
         { 0, 1, 15, 3 })
      H.assert_strides(lm.empty({ 2, 3, 4, 0, 6 }, { memory_format = lm.channels_last_3d }),
         { 0, 1, 0, 18, 3 })
   end)

   it("channels_last on a tensor that is not 4-D fails (rank 4)", function()
      for _, s in ipairs({ { 2, 3, 4 }, { 2, 3, 4, 5, 6 }, { 6 }, { 2, 3 } }) do
         H.assert_error_like("empty", "rank 4", lm.empty, s, { memory_format = lm.channels_last })
         H.assert_error_like("zeros", "rank 4", lm.zeros, s, { memory_format = lm.channels_last })
         H.assert_error_like("ones", "rank 4", lm.ones, s, { memory_format = lm.channels_last })
         H.assert_error_like("rand", "rank 4", lm.rand, s, { memory_format = lm.channels_last })
      end
   end)

   it("channels_last_3d on a tensor that is not 5-D fails (rank 5)", function()
      for _, s in ipairs({ { 2, 3, 4, 5 }, { 2, 3, 4 }, { 1, 2, 3, 4, 5, 6 } }) do
         H.assert_error_like("empty", "rank 5", lm.empty, s,
            { memory_format = lm.channels_last_3d })
         H.assert_error_like("zeros", "rank 5", lm.zeros, s,
            { memory_format = lm.channels_last_3d })
      end
   end)

   it("a tensor stores no tag: empty_strided with CL strides is channels-last", function()
      local t = es({ 2, 3, 4, 5 }, { 60, 1, 15, 3 })
      H.assert_predicates(t, { c = false, clc = true, nod = true, suggest = CL })
   end)
end)

-- ---------------------------------------------------------------------------------------------
describe("memory formats: section 2.6 worked table", function()
   -- sizes, strides, c, clc, cll, nod, suggest, exact
   local T, F = true, false
   local rows = {
      { { 2, 3, 4, 5 }, { 60, 20, 5, 1 }, T, F, F, T, CONTIG, CONTIG },
      { { 2, 3, 4, 5 }, { 60, 1, 15, 3 }, F, T, T, T, CL, CL },
      { { 2, 1, 4, 5 }, { 20, 20, 5, 1 }, T, T, F, T, CONTIG, CONTIG },
      { { 2, 1, 4, 5 }, { 20, 1, 5, 1 }, T, T, T, T, CL, CL },
      { { 2, 3, 1, 1 }, { 3, 1, 1, 1 }, T, T, F, T, CONTIG, CONTIG },
      { { 2, 3, 1, 1 }, { 3, 1, 3, 3 }, T, T, T, T, CL, CL },
      { { 4, 1, 1, 1 }, { 1, 1, 1, 1 }, T, T, F, T, CONTIG, CONTIG },
      { { 2, 1, 1, 1 }, { 5, 5, 5, 5 }, F, F, F, F, CONTIG, CONTIG },
      { { 1, 4, 1, 3 }, { 12, 1, 4, 4 }, F, T, F, T, CONTIG, CONTIG },
      { { 0, 3, 4, 5 }, { 60, 1, 15, 3 }, T, T, F, T, CONTIG, CONTIG },
      { { 2, 2, 4, 5 }, { 60, 1, 15, 3 }, F, F, T, F, CL, CONTIG },
      { { 2, 3, 4, 3 }, { 60, 1, 15, 6 }, F, F, F, F, CONTIG, CONTIG },
      { { 64, 32, 1, 1 }, { 32, 1, 32, 32 }, T, T, T, T, CL, CL },
      { { 32, 1, 3, 3 }, { 9, 1, 3, 1 }, T, T, T, T, CL, CL },
   }

   for _, r in ipairs(rows) do
      local sizes, strides = r[1], r[2]
      local name = H.fmt_list(sizes) .. "@" .. H.fmt_list(strides)
      it(name .. " built with empty_strided", function()
         local t = es(sizes, strides)
         H.assert_layout(t, sizes, strides)
         H.assert_predicates(t, { c = r[3], clc = r[4], cl3dc = false, nod = r[6], suggest = r[7] })
         -- cl-like is what suggest reports for a 4-D tensor
         assert.equal(r[5], tostring(t:suggest_memory_format()) == CL, name .. ": cl-like")
         -- suggest_memory_format(exact): lumen's extension of the API (PyTorch's exact=True)
         H.assert_format_name(t:suggest_memory_format(true), r[8], name .. ": suggest(exact)")
         -- the model of the spec agrees with the table (guards the table transcription)
         assert.equal(r[3], model.contiguous(sizes, strides))
         assert.equal(r[4], model.cl_contiguous(sizes, strides))
         assert.equal(r[5], model.cl_like(sizes, strides))
         assert.equal(r[6], model.nod(sizes, strides))
      end)
   end

   it("(2,3,4,5,6)@(360,1,90,18,3): cl3d contiguous, suggests channels_last_3d", function()
      local t = es({ 2, 3, 4, 5, 6 }, { 360, 1, 90, 18, 3 })
      H.assert_predicates(t, { c = false, clc = false, cl3dc = true, nod = true, suggest = CL3D })
   end)

   it("5-D contiguous tensors are not channels_last_3d; cl never applies to 5-D", function()
      local t = lm.empty({ 2, 3, 4, 5, 6 })
      H.assert_predicates(t, { c = true, clc = false, cl3dc = false, nod = true, suggest = CONTIG })
   end)

   describe("rows built by the views the table names", function()
      it("contiguous (2,3,4,5)", function()
         H.assert_predicates(x_nchw(), { c = true, clc = false, nod = true, suggest = CONTIG })
      end)
      it("channels-last (2,3,4,5) from :to(channels_last)", function()
         local t = x_nchw():to(lm.channels_last)
         H.assert_strides(t, { 60, 1, 15, 3 })
         H.assert_predicates(t, { c = false, clc = true, nod = true, suggest = CL })
      end)
      it("N1HW contiguous, then after :to(channels_last)", function()
         local t = lm.zeros({ 2, 1, 4, 5 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CONTIG })
         local u = t:to(lm.channels_last)
         H.assert_strides(u, { 20, 1, 5, 1 }, "N1HW .to(cl)")
         H.assert_predicates(u, { c = true, clc = true, nod = true, suggest = CL })
      end)
      it("NC11 contiguous, then after :to(channels_last)", function()
         local t = lm.zeros({ 2, 3, 1, 1 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CONTIG })
         local u = t:to(lm.channels_last)
         H.assert_strides(u, { 3, 1, 3, 3 }, "NC11 .to(cl)")
         H.assert_predicates(u, { c = true, clc = true, nod = true, suggest = CL })
      end)
      it("N111 either way", function()
         local t = lm.zeros({ 4, 1, 1, 1 })
         local u = t:to(lm.channels_last)
         for _, v in ipairs({ t, u }) do
            H.assert_strides(v, { 1, 1, 1, 1 })
            H.assert_predicates(v, { c = true, clc = true, nod = true, suggest = CONTIG })
         end
      end)
      it("transposed 1C1W: (1,3,1,4) contiguous transposed (2,4)", function()
         local t = lm.zeros({ 1, 3, 1, 4 }):transpose(2, 4)
         H.assert_layout(t, { 1, 4, 1, 3 }, { 12, 1, 4, 4 })
         H.assert_predicates(t, { c = false, clc = true, nod = true, suggest = CONTIG })
      end)
      it("empty channels-last (0,3,4,5)", function()
         local t = lm.empty({ 0, 3, 4, 5 }, { memory_format = lm.channels_last })
         H.assert_layout(t, { 0, 3, 4, 5 }, { 60, 1, 15, 3 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CONTIG })
      end)
      it("x_cl[:, :2] is :narrow(2, 1, 2)", function()
         local t = x_cl():narrow(2, 1, 2)
         H.assert_layout(t, { 2, 2, 4, 5 }, { 60, 1, 15, 3 })
         H.assert_predicates(t, { c = false, clc = false, nod = false, suggest = CL })
      end)
      it("1x1 conv weight (64,32,1,1) after :to(channels_last)", function()
         local t = lm.zeros({ 64, 32, 1, 1 }):to(lm.channels_last)
         H.assert_strides(t, { 32, 1, 32, 32 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CL })
      end)
      it("depthwise weight (32,1,3,3) after :to(channels_last)", function()
         local t = lm.zeros({ 32, 1, 3, 3 }):to(lm.channels_last)
         H.assert_strides(t, { 9, 1, 3, 1 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CL })
      end)
      it("(2,3,4,5,6) after :to(channels_last_3d)", function()
         local t = lm.zeros({ 2, 3, 4, 5, 6 }):to(lm.channels_last_3d)
         H.assert_strides(t, { 360, 1, 90, 18, 3 })
         H.assert_predicates(t,
            { c = false, clc = false, cl3dc = true, nod = true, suggest = CL3D })
      end)
   end)

   describe("section 2.3 / memory_format_test.cpp notes", function()
      it("a broadcast C (stride 0) is never channels-last", function()
         local t = lm.zeros({ 1, 1, 4, 5 }):expand({ 2, 3, 4, 5 })
         H.assert_strides(t, { 0, 0, 5, 1 })
         H.assert_predicates(t, { c = false, clc = false, nod = false, suggest = CONTIG })
         local u = lm.zeros({ 2, 1, 4, 5 }, { memory_format = lm.channels_last }) -- (20,1,5,1)?
         local v = u:expand({ 2, 3, 4, 5 })
         assert.equal(0, v:stride(2))
         H.assert_format_name(v:suggest_memory_format(), CONTIG)
      end)
      it("contiguous:transpose(2,4) is not CL, then :transpose(3,4) is", function()
         local t = lm.zeros({ 2, 3, 4, 5 }):transpose(2, 4)
         H.assert_format_name(t:suggest_memory_format(), CONTIG, "after transpose(2,4)")
         local u = t:transpose(3, 4)
         H.assert_layout(u, { 2, 5, 3, 4 }, { 60, 1, 20, 5 })
         H.assert_predicates(u, { c = false, clc = true, nod = true, suggest = CL })
      end)
      it("channels-last survives step-2 slicing of H and W (not of W alone)", function()
         local hw = es({ 2, 3, 2, 3 }, { 60, 1, 30, 6 }) -- x_cl[:, :, ::2, ::2]
         H.assert_predicates(hw, { c = false, clc = false, nod = false, suggest = CL })
         local h = es({ 2, 3, 2, 5 }, { 60, 1, 30, 3 }) -- x_cl[:, :, ::2]
         H.assert_predicates(h, { c = false, clc = false, nod = false, suggest = CL })
         local w = es({ 2, 3, 4, 3 }, { 60, 1, 15, 6 }) -- x_cl[..., ::2]
         H.assert_predicates(w, { c = false, clc = false, nod = false, suggest = CONTIG })
      end)
      it("an empty tensor is never channels-last (suggest), but may be cl-contiguous", function()
         local t = lm.empty({ 2, 0, 4, 5 }, { memory_format = lm.channels_last })
         H.assert_strides(t, { 0, 1, 0, 0 })
         H.assert_predicates(t, { c = true, clc = true, nod = true, suggest = CONTIG })
         local u = lm.empty({ 2, 3, 0, 5 })
         H.assert_predicates(u, { c = true, clc = false, nod = true, suggest = CONTIG })
      end)
      it("section 2.5: both flags exactly when C==1 or H==W==1", function()
         for _, s in ipairs({ { 3, 1, 4, 5 }, { 3, 4, 1, 1 }, { 1, 1, 2, 2 } }) do
            local t = lm.zeros(s)
            assert.is_true(t:is_contiguous() and t:is_contiguous(lm.channels_last), H.fmt_list(s))
         end
         for _, s in ipairs({ { 3, 2, 4, 1 }, { 3, 2, 1, 5 }, { 1, 2, 2, 2 } }) do
            local t = lm.zeros(s)
            assert.is_false(t:is_contiguous(lm.channels_last), H.fmt_list(s))
         end
      end)
      it("preserve_format in is_contiguous behaves like contiguous_format", function()
         assert.is_true(x_nchw():is_contiguous(lm.preserve_format))
         assert.is_false(x_cl():is_contiguous(lm.preserve_format))
      end)
   end)

   describe("section 4, non-overlapping and dense", function()
      it("a transposed tensor (2,3,5,4)@(60,20,1,5) is NOD", function()
         local t = lm.zeros({ 2, 3, 4, 5 }):transpose(3, 4)
         H.assert_layout(t, { 2, 3, 5, 4 }, { 60, 20, 1, 5 })
         H.assert_predicates(t, { c = false, clc = false, nod = true, suggest = CONTIG })
      end)
      it("expanded tensors and slices with gaps are not NOD", function()
         assert.is_false(lm.zeros({ 3, 1 }):expand({ 3, 4 }):is_non_overlapping_and_dense())
         assert.is_false(lm.zeros({ 4, 6 }):narrow(2, 2, 3):is_non_overlapping_and_dense())
         assert.is_true(lm.zeros({ 4, 6 }):narrow(1, 2, 3):is_non_overlapping_and_dense())
      end)
      it("1-D: true iff size < 2 or stride 1; 0-D is NOD", function()
         assert.is_true(es({ 5 }, { 1 }):is_non_overlapping_and_dense())
         assert.is_false(es({ 5 }, { 2 }):is_non_overlapping_and_dense())
         assert.is_true(es({ 1 }, { 7 }):is_non_overlapping_and_dense())
         assert.is_true(lm.tensor(3.5):is_non_overlapping_and_dense())
      end)
      it("every empty tensor is NOD", function()
         assert.is_true(es({ 0, 3 }, { 9, 3 }):is_non_overlapping_and_dense())
      end)
   end)
end)

-- ---------------------------------------------------------------------------------------------
describe("memory formats: layouts generated by PyTorch 1.13 (fixtures/core/layouts.lua)", function()
   local cases = H.fixture("layouts")

   it("the plain-Lua model of section 2 agrees with PyTorch", function()
      for _, k in ipairs(cases) do
         local name = H.fmt_list(k.sizes) .. "@" .. H.fmt_list(k.strides)
         assert.equal(k.c, model.contiguous(k.sizes, k.strides), name .. " contiguous")
         if k.clc ~= nil then
            assert.equal(k.clc, model.cl_contiguous(k.sizes, k.strides), name .. " cl")
         end
         if k.cl3dc ~= nil then
            assert.equal(k.cl3dc, model.cl3d_contiguous(k.sizes, k.strides), name .. " cl3d")
         end
         assert.equal(k.nod, model.nod(k.sizes, k.strides), name .. " nod")
         if k.pool then
            local cl = H.list_equal(k.pool, H.cl_strides(k.sizes))
            local ct = H.list_equal(k.pool, H.contig_strides(k.sizes))
            if cl ~= ct then
               assert.equal(cl, model.cl_like(k.sizes, k.strides), name .. " cl-like")
            end
         end
      end
   end)

   for _, k in ipairs(cases) do
      local name = H.fmt_list(k.sizes) .. "@" .. H.fmt_list(k.strides) .. " (" .. k.why .. ")"
      it(name, function()
         local t = es(k.sizes, k.strides)
         H.assert_layout(t, k.sizes, k.strides, "empty_strided")
         H.assert_predicates(t, {
            c = k.c, clc = k.clc or false, cl3dc = k.cl3dc or false, nod = k.nod,
            suggest = model.suggest(k.sizes, k.strides),
         })
         H.assert_strides(lm.empty_like(t), k.like, "empty_like")
         H.assert_strides(lm.zeros_like(t), k.like, "zeros_like")
         H.assert_strides(t:clone(), k.clone, "clone")
         H.assert_strides(t:relu(), k.relu, "relu")
         H.assert_strides(t + lm.ones(k.sizes), k.addc, "t + contiguous")
         H.assert_strides(lm.ones(k.sizes) + t, k.cadd, "contiguous + t")
         H.assert_strides(t + 2, k.adds, "t + 2")
      end)
   end

   it("the model and lumen agree on an exhaustive set of small 4-D and 5-D layouts", function()
      -- every dim size in {1,2}, a 0 or 3 somewhere, strides from permutations and tags
      local checked = 0
      local size_choices = { 1, 2, 3 }
      local function perms(n)
         local out = {}
         local function rec(a, k)
            if k > n then out[#out + 1] = { unpack(a) } return end
            for i = k, n do
               a[k], a[i] = a[i], a[k]
               rec(a, k + 1)
               a[k], a[i] = a[i], a[k]
            end
         end
         local a = {}
         for i = 1, n do a[i] = i end
         rec(a, 1)
         return out
      end
      local p4 = perms(4)
      local function try(sizes, strides)
         local t = es(sizes, strides)
         local exp = {
            c = model.contiguous(sizes, strides), clc = model.cl_contiguous(sizes, strides),
            cl3dc = model.cl3d_contiguous(sizes, strides), nod = model.nod(sizes, strides),
            suggest = model.suggest(sizes, strides),
         }
         H.assert_predicates(t, exp)
         checked = checked + 1
      end
      for a = 1, 3 do for b = 1, 3 do for c = 1, 3 do for d = 1, 3 do
         local sizes = { size_choices[a], size_choices[b], size_choices[c], size_choices[d] }
         for pi = 1, #p4, 3 do
            local order = p4[pi]
            local st, acc = {}, 1
            for _, dd in ipairs(order) do st[dd] = acc acc = acc * sizes[dd] end
            try(sizes, st)
            -- tag strides on size-1 dims
            local tagged = { unpack(st) }
            for i = 1, 4 do if sizes[i] == 1 then tagged[i] = (i * 7) % 5 + 1 end end
            try(sizes, tagged)
            -- a gap
            local gap = { unpack(st) }
            gap[order[2]] = gap[order[2]] * 2
            try(sizes, gap)
         end
      end end end end
      for _, st in ipairs({ { 60, 1, 20, 5, 1 }, { 24, 1, 12, 6, 2 }, { 360, 1, 90, 18, 3 } }) do
         try({ 2, 3, 4, 5, 6 }, st)
      end
      try({ 2, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1 })
      try({ 2, 3, 1, 1, 1 }, { 3, 1, 3, 3, 3 })
      assert.is_true(checked > 500)
   end)
end)

-- ---------------------------------------------------------------------------------------------
describe("memory formats: section 5, preserve format", function()
   local function nc11_tagged() return H.strided({ 2, 3, 1, 1 }, { 3, 1, 3, 3 }) end
   local function x_cl_w2() return H.strided({ 2, 3, 4, 3 }, { 60, 1, 15, 6 }) end -- x_cl[..., ::2]

   describe("*_like", function()
      local likes = {
         { "empty_like", function(t, o) return lm.empty_like(t, o) end },
         { "zeros_like", function(t, o) return lm.zeros_like(t, o) end },
         { "ones_like", function(t, o) return lm.ones_like(t, o) end },
         { "full_like", function(t, o) return lm.full_like(t, 3, o) end },
         { "rand_like", function(t, o) return lm.rand_like(t, o) end },
         { "randn_like", function(t, o) return lm.randn_like(t, o) end },
      }
      for _, l in ipairs(likes) do
         local name, f = l[1], l[2]
         it(name .. ": NOD input keeps its strides exactly, tag strides included", function()
            H.assert_strides(f(x_cl()), { 60, 1, 15, 3 }, "x_cl")
            H.assert_strides(f(x_nchw()), { 60, 20, 5, 1 }, "x")
            H.assert_strides(f(nc11_tagged()), { 3, 1, 3, 3 }, "NC11 tagged")
            H.assert_strides(f(lm.zeros({ 2, 3, 1, 1 })), { 3, 1, 1, 1 }, "NC11 untagged")
            H.assert_strides(f(es({ 1, 4, 1, 3 }, { 12, 1, 4, 4 })), { 12, 1, 4, 4 }, "1C1W")
            H.assert_strides(f(lm.zeros({ 2, 3, 4, 5 }):transpose(3, 4)), { 60, 20, 1, 5 },
               "transposed")
            local c3 = lm.zeros({ 2, 3, 4, 5, 6 }, { memory_format = lm.channels_last_3d })
            H.assert_strides(f(c3),
               { 360, 1, 90, 18, 3 }, "cl3d")
            H.assert_strides(f(x_cl(), { memory_format = lm.preserve_format }), { 60, 1, 15, 3 },
               "explicit preserve")
         end)
         it(name .. ": non-NOD input gets infer_dense_strides", function()
            H.assert_strides(f(x_cl_w2()), { 36, 1, 9, 3 }, "x_cl[..., ::2]")
            H.assert_strides(f(x_cl():narrow(2, 1, 2)), { 40, 1, 10, 2 }, "x_cl[:, :2]")
            H.assert_strides(f(x_nchw():narrow(4, 1, 3)), { 36, 12, 3, 1 }, "x[..., :3]")
            H.assert_strides(f(es({ 2, 1, 1, 1 }, { 5, 5, 5, 5 })), { 1, 1, 1, 1 }, "N111 @5")
            H.assert_strides(f(lm.zeros({ 3, 1 }):expand({ 3, 4 })), { 4, 1 }, "expanded")
         end)
         it(name .. ": an explicit memory_format wins", function()
            H.assert_strides(f(x_cl(), { memory_format = lm.contiguous_format }), { 60, 20, 5, 1 })
            H.assert_strides(f(x_nchw(), { memory_format = lm.channels_last }), { 60, 1, 15, 3 })
            H.assert_strides(f(lm.zeros({ 2, 3, 1, 1 }), { memory_format = lm.channels_last }),
               { 3, 1, 3, 3 })
         end)
         it(name .. ": an explicit channels_last on a 5-D input raises the rank error", function()
            H.assert_error_like(name, "rank 4", f, lm.zeros({ 2, 3, 4, 5, 6 }),
               { memory_format = lm.channels_last })
            H.assert_error_like(name, "rank 5", f, lm.zeros({ 2, 3, 4, 5 }),
               { memory_format = lm.channels_last_3d })
         end)
         it(name .. ": dtype option with preserved strides", function()
            local r = f(x_cl(), { dtype = lm.float64 })
            H.assert_dtype(r, lm.float64)
            H.assert_strides(r, { 60, 1, 15, 3 })
         end)
      end

      it("values of zeros_like / ones_like / full_like", function()
         H.assert_values(lm.zeros_like(x_cl_w2()),
            values_of({ 2, 3, 4, 3 }, function() return 0 end))
         H.assert_values(lm.ones_like(x_cl()), values_of({ 2, 3, 4, 5 }, function() return 1 end))
         H.assert_values(lm.full_like(x_cl(), 2.5), values_of({ 2, 3, 4, 5 },
            function() return 2.5 end))
         H.assert_dtype(lm.full_like(lm.zeros({ 2 }, { dtype = lm.int32 }), 7), lm.int32)
      end)
   end)

   describe("clone", function()
      it("preserve by default: NOD keeps strides, non-NOD gets infer_dense_strides", function()
         local c = x_cl():clone()
         H.assert_strides(c, { 60, 1, 15, 3 })
         H.assert_close(c, H.iota(120), 0)
         H.assert_strides(nc11_tagged():clone(), { 3, 1, 3, 3 }, "NC11 tagged")
         local w2 = x_cl_w2():clone()
         H.assert_strides(w2, { 36, 1, 9, 3 }, "x_cl[..., ::2]")
         H.assert_close(w2, H.iota(72), 0)
         H.assert_strides(x_cl():narrow(2, 1, 2):clone(), { 40, 1, 10, 2 }, "x_cl[:, :2]")
      end)
      it("with an explicit memory format", function()
         local c = x_nchw():clone({ memory_format = lm.channels_last })
         H.assert_strides(c, { 60, 1, 15, 3 })
         H.assert_close(c, H.iota(120), 0)
         H.assert_strides(x_cl():clone({ memory_format = lm.contiguous_format }), { 60, 20, 5, 1 })
         H.assert_strides(lm.zeros({ 2, 3, 1, 1 }):clone({ memory_format = lm.channels_last }),
            { 3, 1, 3, 3 })
      end)
      it("copies: the clone does not share storage", function()
         local x = x_cl()
         local c = x:clone()
         assert.is_false(H.writes_through(x, c))
      end)
   end)

   describe(":to(memory_format)", function()
      it("contiguous -> channels_last copies into CL strides, same logical values", function()
         local x = x_nchw()
         local y = x:to(lm.channels_last)
         H.assert_strides(y, { 60, 1, 15, 3 })
         H.assert_close(y, H.iota(120), 0)
         assert.is_true(y:is_contiguous(lm.channels_last))
      end)
      it("tags NC11 and N1HW", function()
         H.assert_strides(lm.ones({ 2, 3, 1, 1 }):to(lm.channels_last), { 3, 1, 3, 3 }, "NC11")
         H.assert_strides(lm.ones({ 2, 1, 4, 5 }):to(lm.channels_last), { 20, 1, 5, 1 }, "N1HW")
         H.assert_strides(lm.ones({ 2, 3, 1, 1, 1 }):to(lm.channels_last_3d), { 3, 1, 3, 3, 3 },
            "NC111 .to(cl3d)")
      end)
      it("N111 copies every time (suggest stays contiguous)", function()
         local t = lm.ones({ 4, 1, 1, 1 })
         local u = t:to(lm.channels_last)
         H.assert_strides(u, { 1, 1, 1, 1 })
         assert.is_false(H.writes_through(t, u), "N111 :to(cl) must be a copy")
      end)
      it("returns self when nothing changes", function()
         local x = x_cl()
         assert.is_true(H.writes_through(x, x:to(lm.channels_last)), "CL :to(cl)")
         local y = x_nchw()
         assert.is_true(H.writes_through(y, y:to(lm.contiguous_format)), "NCHW :to(contig)")
         local z = x_cl()
         assert.is_true(H.writes_through(z, z:to(lm.preserve_format)), "CL :to(preserve)")
         local n = nc11_tagged()
         assert.is_true(H.writes_through(n, n:to(lm.channels_last)), "tagged NC11 :to(cl)")
         local f = x_cl()
         assert.is_true(H.writes_through(f, f:to(lm.float32)), "same dtype")
         local d = x_cl()
         assert.is_true(H.writes_through(d, d:to(d:device())), "same device")
      end)
      it("always returns a tensor that is_contiguous(fmt) (unlike PyTorch)", function()
         -- PyTorch quirk (a): a non-dense CL-like view would come back unchanged
         local v = x_cl():narrow(2, 1, 2)
         local r = v:to(lm.channels_last)
         H.assert_strides(r, { 40, 1, 10, 2 })
         assert.is_true(r:is_contiguous(lm.channels_last))
         H.assert_close(r, values_of({ 2, 2, 4, 5 }, function(n, c, h, w)
            return n * 60 + c * 20 + h * 5 + w
         end), 0)
         -- PyTorch quirk (b): a non-contiguous NCHW view would come back unchanged
         local u = x_nchw():narrow(4, 1, 3)
         local s = u:to(lm.contiguous_format)
         H.assert_strides(s, { 36, 12, 3, 1 })
         assert.is_true(s:is_contiguous())
         H.assert_close(s, values_of({ 2, 3, 4, 3 }, function(n, c, h, w)
            return n * 60 + c * 20 + h * 5 + w
         end), 0)
      end)
      it("channels_last_3d", function()
         local t = H.seq({ 2, 3, 4, 5, 6 })
         local u = t:to(lm.channels_last_3d)
         H.assert_strides(u, { 360, 1, 90, 18, 3 })
         H.assert_close(u, H.iota(720), 0)
      end)
      it("rank errors", function()
         H.assert_error_like("to", "rank 4", function()
            return lm.zeros({ 2, 3, 4 }):to(lm.channels_last)
         end)
         H.assert_error_like("to", "rank 5", function()
            return lm.zeros({ 2, 3, 4, 5 }):to(lm.channels_last_3d)
         end)
      end)
   end)

   describe(":to(dtype) and :to(opts) preserve the layout", function()
      it("NOD keeps strides, non-NOD gets infer_dense_strides", function()
         local a = x_cl():to(lm.float64)
         H.assert_dtype(a, lm.float64)
         H.assert_strides(a, { 60, 1, 15, 3 })
         H.assert_close(a, H.iota(120), 0)
         H.assert_strides(nc11_tagged():to(lm.float16), { 3, 1, 3, 3 }, "NC11 tagged")
         local b = x_cl_w2():to(lm.float64)
         H.assert_strides(b, { 36, 1, 9, 3 })
         H.assert_close(b, H.iota(72), 0)
      end)
      it("an opts table", function()
         local a = x_nchw():to({ dtype = lm.float64, memory_format = lm.channels_last })
         H.assert_dtype(a, lm.float64)
         H.assert_strides(a, { 60, 1, 15, 3 })
         H.assert_close(a, H.iota(120), 0)
         local b = x_cl():to({ dtype = lm.int32 })
         H.assert_dtype(b, lm.int32)
         H.assert_strides(b, { 60, 1, 15, 3 })
      end)
   end)

   describe(":contiguous(fmt)", function()
      it("returns self when already contiguous in fmt", function()
         local x = x_nchw()
         assert.is_true(H.writes_through(x, x:contiguous()))
         local y = x_cl()
         assert.is_true(H.writes_through(y, y:contiguous(lm.channels_last)))
      end)
      it("on NC11 is a no-op and does not tag", function()
         local t = lm.ones({ 2, 3, 1, 1 })
         local u = t:contiguous(lm.channels_last)
         H.assert_strides(u, { 3, 1, 1, 1 })
         H.assert_format_name(u:suggest_memory_format(), CONTIG)
         assert.is_true(H.writes_through(t, u))
         local n = lm.ones({ 2, 1, 4, 5 }):contiguous(lm.channels_last)
         H.assert_strides(n, { 20, 20, 5, 1 }, "N1HW")
      end)
      it("copies otherwise", function()
         local c = x_nchw():contiguous(lm.channels_last)
         H.assert_strides(c, { 60, 1, 15, 3 })
         H.assert_close(c, H.iota(120), 0)
         local d = x_cl():contiguous()
         H.assert_strides(d, { 60, 20, 5, 1 })
         H.assert_close(d, H.iota(120), 0)
         local e = x_cl_w2():contiguous()
         H.assert_strides(e, { 36, 12, 3, 1 })
         H.assert_close(e, H.iota(72), 0)
         local f = x_cl_w2():contiguous(lm.channels_last)
         H.assert_strides(f, { 36, 1, 9, 3 })
         H.assert_close(f, H.iota(72), 0)
         local g = H.seq({ 2, 3, 4, 5, 6 }):contiguous(lm.channels_last_3d)
         H.assert_strides(g, { 360, 1, 90, 18, 3 })
      end)
      it("preserve_format is rejected", function()
         H.assert_error_like("contiguous", "preserve", function()
            return x_cl():contiguous(lm.preserve_format)
         end)
      end)
      it("rank errors", function()
         H.assert_error_like("contiguous", "rank 4", function()
            return lm.zeros({ 2, 3, 4, 5, 6 }):contiguous(lm.channels_last)
         end)
      end)
   end)
end)

-- ---------------------------------------------------------------------------------------------
describe("memory formats: section 6, layout of elementwise outputs", function()
   local NCHW, CLS = { 60, 20, 5, 1 }, { 60, 1, 15, 3 }
   local function xv(n, c, h, w) return n * 60 + c * 20 + h * 5 + w end

   it("relu(CL) and CL + CL: fast path, CL", function()
      local x = x_cl() - 60
      local r = x:relu()
      H.assert_strides(r, CLS)
      H.assert_close(r, values_of({ 2, 3, 4, 5 }, function(...)
         return math.max(xv(...) - 60, 0)
      end), 0)
      local s = x_cl() + x_cl()
      H.assert_strides(s, CLS)
      H.assert_close(s, values_of({ 2, 3, 4, 5 }, function(...) return 2 * xv(...) end), 0)
   end)

   it("NCHW + CL: contiguous (first operand wins); CL + NCHW: CL", function()
      local a = x_nchw() + x_cl()
      H.assert_strides(a, NCHW)
      H.assert_close(a, values_of({ 2, 3, 4, 5 }, function(...) return 2 * xv(...) end), 0)
      local b = x_cl() + x_nchw()
      H.assert_strides(b, CLS)
      H.assert_close(b, values_of({ 2, 3, 4, 5 }, function(...) return 2 * xv(...) end), 0)
   end)

   it("CL + bias.view(1,C,1,1), bias + CL, CL + (C,1,1): CL", function()
      local bias = lm.tensor({ 100, 200, 300 }, { dtype = lm.float32 })
      local b4 = bias:view({ 1, 3, 1, 1 })
      local expect = values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         return xv(n, c, h, w) + 100 * (c + 1)
      end)
      for _, r in ipairs({ x_cl() + b4, b4 + x_cl(), x_cl() + bias:view({ 3, 1, 1 }),
         x_cl():add(b4) }) do
         H.assert_strides(r, CLS)
         H.assert_close(r, expect, 0)
      end
   end)

   it("CL + 2.0, 2.0 + CL: CL (the scalar does not vote)", function()
      for _, r in ipairs({ x_cl() + 2.5, 2.5 + x_cl(), x_cl() * 2, 2 * x_cl(), x_cl() - 1,
         1 - x_cl(), x_cl() / 2, -x_cl() }) do
         H.assert_strides(r, CLS)
      end
      H.assert_close(1 - x_cl(), values_of({ 2, 3, 4, 5 }, function(...) return 1 - xv(...) end), 0)
      H.assert_close(x_cl() / 2, values_of({ 2, 3, 4, 5 }, function(...) return xv(...) / 2 end), 0)
   end)

   it("CL + (H,W), (H,W) + CL, CL + (W,): CL", function()
      local hw = H.seq({ 4, 5 })
      local wv = H.seq({ 5 })
      H.assert_strides(x_cl() + hw, CLS)
      H.assert_strides(hw + x_cl(), CLS)
      H.assert_strides(x_cl() + wv, CLS)
      H.assert_close(hw + x_cl(), values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         return xv(n, c, h, w) + h * 5 + w
      end), 0)
      -- a (C,) bias broadcasts against W, not C
      H.assert_close(x_cl() + wv, values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         return xv(n, c, h, w) + w
      end), 0)
   end)

   it("CL * SE gate (N,C,1,1)@(3,1,1,1), either order: CL", function()
      local g = H.seq({ 2, 3, 1, 1 })
      H.assert_strides(g, { 3, 1, 1, 1 })
      local expect = values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         return xv(n, c, h, w) * (n * 3 + c)
      end)
      for _, r in ipairs({ x_cl() * g, g * x_cl(), x_cl():mul(g) }) do
         H.assert_strides(r, CLS)
         H.assert_close(r, expect, 0)
      end
   end)

   it("ternary: (N,1,H,W) contiguous first, then CL, CL: CL", function()
      local m = H.seq({ 2, 1, 4, 5 })
      local r = m:addcmul(x_cl(), x_cl(), 0.5)
      H.assert_strides(r, CLS)
      H.assert_close(r, values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         return (n * 20 + h * 5 + w) + 0.5 * xv(n, c, h, w) ^ 2
      end), 1e-6)
      local cond = H.seq({ 2, 1, 4, 5 }) - 20
      local cb = lm.where(cond:relu():to(lm.bool), x_cl(), -x_cl())
      H.assert_strides(cb, CLS)
      H.assert_close(cb, values_of({ 2, 3, 4, 5 }, function(n, c, h, w)
         local v = xv(n, c, h, w)
         return (n * 20 + h * 5 + w - 20 > 0) and v or -v
      end), 0)
   end)

   it("NC11@(3,1,3,3): unary or + NC11 contiguous loses the tag, + scalar keeps it", function()
      local t = H.strided({ 2, 3, 1, 1 }, { 3, 1, 3, 3 })
      H.assert_strides(t:relu(), { 3, 1, 1, 1 }, "relu")
      H.assert_strides(t:exp(), { 3, 1, 1, 1 }, "exp")
      H.assert_strides(t + lm.ones({ 2, 3, 1, 1 }), { 3, 1, 1, 1 }, "+ NC11 contiguous")
      H.assert_strides(t + 2, { 3, 1, 3, 3 }, "+ scalar")
      H.assert_close(t + 2, { 2, 3, 4, 5, 6, 7 }, 0)
   end)

   it("non-dense x_cl[..., ::2] unary: dense CL (36,1,9,3)", function()
      local t = H.strided({ 2, 3, 4, 3 }, { 60, 1, 15, 6 })
      for _, r in ipairs({ t:relu(), t:neg(), t:abs(), t + 1, t:sqrt(), t * t }) do
         H.assert_strides(r, { 36, 1, 9, 3 })
         assert.is_true(r:is_non_overlapping_and_dense())
      end
      local neg = H.iota(72)
      for i = 1, #neg do neg[i] = -neg[i] end
      H.assert_close(-t, neg, 0, "-x")
      H.assert_close(t:relu(), H.iota(72), 0, "relu")
   end)

   it("cl3d + contiguous 5-D: cl3d (first wins)", function()
      local a = H.seq({ 2, 3, 4, 5, 6 }, lm.channels_last_3d)
      local b = H.seq({ 2, 3, 4, 5, 6 })
      local r = a + b
      H.assert_strides(r, { 360, 1, 90, 18, 3 })
      local e = {}
      for i = 0, 719 do e[i + 1] = 2 * i end
      H.assert_close(r, e, 0)
      H.assert_strides(b + a, { 360, 120, 30, 6, 1 })
   end)

   it("(2,3,1,1)@(3,1,3,3) + (3,1,3)@(1,3,3) -> (2,3,1,3)@(9,1,3,3)", function()
      local a = H.strided({ 2, 3, 1, 1 }, { 3, 1, 3, 3 })
      local b = H.strided({ 3, 1, 3 }, { 1, 3, 3 })
      local r = a + b
      H.assert_layout(r, { 2, 3, 1, 3 }, { 9, 1, 3, 3 })
      H.assert_close(r, values_of({ 2, 3, 1, 3 }, function(n, c, _, w)
         return (n * 3 + c) + (c * 3 + w)
      end), 0)
   end)

   it("in-place ops and copy_ keep their own strides", function()
      local x = x_cl()
      x:add_(x_nchw())
      H.assert_strides(x, CLS)
      H.assert_close(x, values_of({ 2, 3, 4, 5 }, function(...) return 2 * xv(...) end), 0)
      local y = x_nchw()
      y:mul_(x_cl())
      H.assert_strides(y, NCHW)
      H.assert_close(y, values_of({ 2, 3, 4, 5 }, function(...) return xv(...) ^ 2 end), 0)
      local z = H.strided({ 2, 3, 1, 1 }, { 3, 1, 3, 3 })
      z:relu_()
      H.assert_strides(z, { 3, 1, 3, 3 })
      local w = H.strided({ 2, 3, 4, 3 }, { 60, 1, 15, 6 })
      w:fill_(2)
      H.assert_strides(w, { 60, 1, 15, 6 })
      w:zero_()
      H.assert_close(w, values_of({ 2, 3, 4, 3 }, function() return 0 end), 0)
      local c = lm.empty({ 2, 3, 4, 5 }, { memory_format = lm.channels_last })
      c:copy_(x_nchw())
      H.assert_strides(c, CLS)
      H.assert_close(c, H.iota(120), 0)
   end)
end)
