-- F.interpolate / nn.Upsample (issue 40; lua/lumen/functional/resample.lua): values and input
-- gradients against PyTorch 2.x float64 fixtures (spec/fixtures/nn/resample.lua, gen_resample.py)
-- for every mode (nearest, nearest-exact, linear, bilinear, bicubic, trilinear; size and
-- scale_factor, align_corners, recompute_scale_factor) in float64 and float32, contiguous and
-- channels-last input; float16 / bfloat16 within their rounding; output and gradient keep the
-- input's memory format; float64 gradchecks;
-- bad input. Under LUMEN_TEST_DEVICE (sim:0, the emulated cuda:0) the same checks run there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local FX = dofile("spec/fixtures/nn/resample.lua")

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local DTYPES = { { lm.float64, 1e-9 }, { lm.float32, 3e-5 },
                 { lm.float16, 2e-2 }, { lm.bfloat16, 8e-2 } }

local function cl_of(nd)
   if nd == 4 then return lm.channels_last elseif nd == 5 then return lm.channels_last_3d end
end

local function fx(d, dtype, fmt, rg)
   local t = lm.tensor(d.data, { dtype = lm.float64 }):view(d.sizes)
   t = t:to(dtype or lm.float64)
   if fmt then t = t:contiguous(fmt) end
   if DEV then t = t:to(DEV) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function close(t, expected, tol, what)
   local e = lm.tensor(expected.data, { dtype = lm.float64 }):view(expected.sizes):cpu()
   local got = t:detach():cpu():double()
   assert(got:dim() == #expected.sizes, what .. ": rank")
   for i, s in ipairs(expected.sizes) do
      assert(got:size(i) == s, ("%s: size %s, expected %s"):format(what,
             table.concat(got:size(), "x"), table.concat(expected.sizes, "x")))
   end
   local err = (got - e):abs():max():item()
   local scale = math.max(1, e:abs():max():item())
   assert(err <= tol * scale, ("%s: max error %g > %g"):format(what, err, tol * scale))
end

local function assert_format(t, fmt, what)
   if fmt then
      assert(t:is_contiguous(fmt), what .. ": expected " .. tostring(fmt) .. ", got " ..
             H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

describe("F.interpolate against PyTorch", function()
   for _, c in ipairs(FX.interpolate) do
      local nd = #c.x.sizes
      local fmts = { false }
      if cl_of(nd) then fmts[2] = cl_of(nd) end
      for _, fmt in ipairs(fmts) do
         for _, dt in ipairs(DTYPES) do
            it(("%s %s %s: values, gradient, formats"):format(c.name, tostring(dt[1]),
               fmt and tostring(fmt) or "contiguous"), function()
               local x = fx(c.x, dt[1], fmt or nil, true)
               local y = F.interpolate(x, c.opts)
               assert.are.equal(dt[1], y:dtype())
               close(y, c.out, dt[2], "out")
               assert_format(y, fmt or nil, "out")
               y:backward(fx(c.gout, dt[1], fmt or nil))
               close(x.grad, c.gx, dt[2] * 4, "grad_input")
               assert_format(x.grad, fmt or nil, "grad_input")
            end)
         end
      end
   end

   -- users report PyTorch's upsample_nearest3d dropping channels_last_3d; the peer (2.15) keeps it
   -- (the fixture records torch_keeps_cl); lumen keeps it in every mode
   it("keeps channels_last_3d for nearest 3-D", function()
      local c = FX.interpolate[7]
      assert.are.equal("nearest_3d", c.name)
      local y = F.interpolate(fx(c.x, lm.float32, lm.channels_last_3d), c.opts)
      assert_format(y, lm.channels_last_3d, "out")
   end)

   it("a gradient of any strides still gives grad_input in the input's format", function()
      local x = fx(FX.interpolate[14].x, lm.float64, lm.channels_last, true)
      local y = F.interpolate(x, { size = { 7, 3 }, mode = "bilinear" })
      y:backward(fx(FX.interpolate[14].gout, lm.float64))   -- contiguous gradient
      close(x.grad, FX.interpolate[14].gx, 1e-9, "grad_input")
      assert_format(x.grad, lm.channels_last, "grad_input")
   end)
end)

describe("F.interpolate passes (lm_resample)", function()
   -- nearest modes copy: NaN, infinities and -0 arrive unchanged (PyTorch copies them; the dense
   -- 0/1 matrices before session 30 spread NaN along the row through 0 * inf)
   it("nearest copies non-finite values and -0 exactly, both layouts", function()
      for _, fmt in ipairs({ false, lm.channels_last }) do
         local x = lm.randn({ 2, 3, 4, 5 })
         x[{ 1, 2, 2, 3 }] = 0 / 0
         x[{ 2, 1, 4, 5 }] = math.huge
         x[{ 2, 3, 1, 1 }] = -math.huge
         x[{ 1, 1, 1, 1 }] = -0.0
         if fmt then x = x:contiguous(fmt) end
         if DEV then x = x:to(DEV) end
         local y = F.interpolate(x, { scale_factor = 2 }):cpu():contiguous()
         local xc = x:cpu():contiguous()
         local yv, xv = y:view(-1), xc:view(-1)
         for n = 0, 1 do
            for c = 0, 2 do
               for i = 0, 7 do
                  for j = 0, 9 do
                     local a = yv[((n * 3 + c) * 8 + i) * 10 + j + 1]
                     local src = ((n * 3 + c) * 4 + math.floor(i / 2)) * 5 + math.floor(j / 2)
                     local b = xv[src + 1]
                     assert(a == b or (a ~= a and b ~= b),
                            ("(%d,%d,%d,%d): %s vs %s"):format(n, c, i, j, tostring(a),
                                                               tostring(b)))
                     if b == 0 then assert.are.equal(1 / b, 1 / a) end
                  end
               end
            end
         end
      end
   end)

   it("a linear mode reaches the neighbours of a NaN, as PyTorch's taps do", function()
      local x = lm.zeros({ 1, 1, 6 })
      x[{ 1, 1, 3 }] = 0 / 0
      if DEV then x = x:to(DEV) end
      local y = F.interpolate(x, { size = 12, mode = "linear" }):cpu()
      -- PyTorch 2.x: outputs 3..6 (0-based) read input 2 with a weight (0.25 or 0.75), the
      -- others not
      for o = 0, 11 do
         local v = y[{ 1, 1, o + 1 }]
         assert.are.equal(o >= 3 and o <= 6, v ~= v, "output " .. o)
      end
   end)

   it("takes uint8 in the nearest modes (as PyTorch), keeping the values and the format",
      function()
      local f = (lm.rand({ 2, 3, 5, 4 }) * 255):floor()
      for _, fmt in ipairs({ false, lm.channels_last }) do
         local x = f:to(lm.uint8)
         if fmt then x = x:contiguous(fmt) end
         if DEV then x = x:to(DEV) end
         for _, mode in ipairs({ "nearest", "nearest-exact" }) do
            local y = F.interpolate(x, { size = { 7, 9 }, mode = mode })
            assert.are.equal(lm.uint8, y:dtype())
            assert_format(y, fmt or nil, mode)
            local want = F.interpolate(x:float(), { size = { 7, 9 }, mode = mode })
            assert.are.equal(0, (y:float() - want):abs():max():item())
         end
      end
      H.assert_error_like("interpolate", "uint8", F.interpolate, f:to(lm.uint8),
                          { scale_factor = 2, mode = "bilinear" })
   end)

   it("runs the same taps again from its cache, and for other dtypes and sizes", function()
      local x = lm.randn({ 2, 4, 6, 7 }):contiguous(lm.channels_last)
      if DEV then x = x:to(DEV) end
      local a = F.interpolate(x, { size = { 9, 5 }, mode = "bicubic" })
      local b = F.interpolate(x, { size = { 9, 5 }, mode = "bicubic" })
      assert.are.equal(0, (a - b):abs():max():item())
      local d = F.interpolate(x:double(), { size = { 9, 5 }, mode = "bicubic" })
      assert.is_true((d:float() - a):abs():max():item() < 1e-5)
      local e = F.interpolate(x, { size = { 9, 6 }, mode = "bicubic" })
      assert.are.same({ 2, 4, 9, 6 }, e:size())
   end)
end)

describe("F.interpolate gradcheck (float64)", function()
   local cases = {
      { { 1, 2, 5 }, nil, { size = 8, mode = "linear" } },
      { { 1, 2, 4, 3 }, lm.channels_last, { size = { 5, 6 }, mode = "bilinear",
                                             align_corners = true } },
      { { 1, 2, 3, 4 }, nil, { scale_factor = 1.5, mode = "bicubic" } },
      { { 1, 2, 3, 2, 3 }, lm.channels_last_3d, { size = { 4, 3, 2 }, mode = "trilinear" } },
      { { 1, 2, 3, 5 }, lm.channels_last, { size = { 7, 2 }, mode = "nearest" } },
      { { 1, 1, 2, 3, 4 }, nil, { scale_factor = 1.6, mode = "nearest-exact" } },
   }
   for i, cs in ipairs(cases) do
      it(cs[3].mode .. " " .. i, function()
         local x = G.input(cs[1], cs[2], i)
         if DEV then x = x:detach():to(DEV):requires_grad_(true) end
         assert.is_true(G.check(function(t) return F.interpolate(t, cs[3]) end, { x }))
      end)
   end
end)

describe("nn.Upsample", function()
   it("runs F.interpolate with its options", function()
      local c = FX.interpolate[15]    -- bilinear_ac
      assert.are.equal("bilinear_ac", c.name)
      local m = lm.nn.Upsample({ scale_factor = 2, mode = "bilinear", align_corners = true })
      close(m:forward(fx(c.x)), c.out, 1e-9, "Upsample")
      assert.truthy(tostring(m):find("bilinear"))
      local u = lm.nn.UpsamplingNearest2d({ scale_factor = 2 })
      close(u:forward(fx(FX.interpolate[3].x)), FX.interpolate[3].out, 1e-9, "Nearest2d")
      local b = lm.nn.UpsamplingBilinear2d({ scale_factor = 2 })
      close(b:forward(fx(c.x)), c.out, 1e-9, "Bilinear2d")
   end)

   it("takes PyTorch's positional arguments, as F.interpolate does", function()
      local c = FX.interpolate[15]    -- bilinear_ac
      close(lm.nn.Upsample(nil, 2, "bilinear", true):forward(fx(c.x)), c.out, 1e-9, "Upsample")
      close(lm.nn.UpsamplingBilinear2d(nil, 2):forward(fx(c.x)), c.out, 1e-9, "Bilinear2d")
      close(F.interpolate(fx(c.x), nil, 2, "bilinear", true), c.out, 1e-9, "interpolate")
      local x = lm.randn({ 1, 2, 3, 4 })
      assert.are.same({ 1, 2, 5, 6 }, F.interpolate(x, { 5, 6 }):size())
      assert.are.same({ 1, 2, 7, 7 }, F.interpolate(x, 7):size())
      assert.are.same({ 1, 2, 6, 8 }, lm.nn.Upsample(nil, 2)(x):size())
      assert.are.same({ 1, 2, 5, 5 }, lm.nn.UpsamplingNearest2d(5)(x):size())
      H.assert_error_like("UpsamplingNearest2d", "size, scale_factor", lm.nn.UpsamplingNearest2d,
                          nil, 2, "bilinear")
      H.assert_error_like("interpolate", "options table, a size", F.interpolate, x, "big")
   end)
end)

-- A dim that keeps its size under a scale_factor other than 1 (3 * 1.25 floors to 3): PyTorch
-- 2.x's kernels leave it as it is for nearest in 2-D, linear, bilinear, trilinear and the
-- antialiased modes, and resample it with the scale for nearest in 1-D and 3-D, nearest-exact and
-- bicubic. Values read off PyTorch 2.15 (torch.arange inputs, float64). Its CPU backward is the
-- identity there for nearest 1-D / 3-D and the antialiased modes, so PyTorch's own gradcheck
-- fails on these calls; lumen's gradient is its forward's (gradcheck below).
describe("F.interpolate: dims that keep their size under a scale_factor", function()
   local function ar(sizes)
      local x = lm.arange(0, H.prod(sizes)):double():view(sizes)
      return DEV and x:to(DEV) or x
   end
   local function vals(y) return y:cpu():contiguous():view(-1):totable() end
   local function same(got, exp, what)
      assert.are.equal(#exp, #got, what)
      for i = 1, #exp do
         assert.is_true(math.abs(got[i] - exp[i]) < 1e-9, ("%s [%d]: %.12g, PyTorch %.12g")
                        :format(what, i, got[i], exp[i]))
      end
   end
   it("nearest: the scale in 1-D and 3-D, the identity in 2-D", function()
      same(vals(F.interpolate(ar({ 1, 1, 3 }), { scale_factor = 1.25 })), { 0, 0, 1 }, "1-D")
      same(vals(F.interpolate(ar({ 1, 1, 3, 3 }), { scale_factor = 1.25 })), H.iota(9, 0), "2-D")
      same(vals(F.interpolate(ar({ 1, 1, 3, 3, 3 }), { scale_factor = 1.25 })),
           { 0, 0, 1, 0, 0, 1, 3, 3, 4, 0, 0, 1, 0, 0, 1, 3, 3, 4, 9, 9, 10, 9, 9, 10, 12, 12,
             13 }, "3-D")
   end)
   it("nearest-exact and bicubic: the scale; linear modes: the identity", function()
      same(vals(F.interpolate(ar({ 1, 1, 9 }), { scale_factor = 1.1, mode = "nearest-exact" })),
           { 0, 1, 2, 3, 4, 5, 5, 6, 7 }, "nearest-exact")
      same(vals(F.interpolate(ar({ 1, 1, 3, 3 }), { scale_factor = 1.25, mode = "bicubic" })),
           { -0.243, 0.4285, 1.4115, 1.7715, 2.443, 3.426, 4.7205, 5.392, 6.375 }, "bicubic")
      same(vals(F.interpolate(ar({ 1, 1, 3 }), { scale_factor = 1.25, mode = "linear" })),
           { 0, 1, 2 }, "linear")
      same(vals(F.interpolate(ar({ 1, 1, 3, 3 }), { scale_factor = 1.25, mode = "bilinear" })),
           H.iota(9, 0), "bilinear")
      same(vals(F.interpolate(ar({ 1, 1, 3, 3, 3 }), { scale_factor = 1.25,
                                                        mode = "trilinear" })),
           H.iota(27, 0), "trilinear")
   end)
   it("gradients are the forward's (gradcheck, where PyTorch's fails)", function()
      local cases = {
         { { 1, 2, 3 }, { scale_factor = 1.25 } },
         { { 1, 1, 3, 2, 3 }, { scale_factor = 1.25 } },
         { { 1, 1, 3, 5 }, { scale_factor = 1.25, mode = "bicubic", antialias = true } },
         { { 1, 1, 3, 3 }, { size = { 5, 1 }, mode = "bilinear", antialias = true } },
      }
      for i, c in ipairs(cases) do
         local x = G.input(c[1], nil, 40 + i)
         if DEV then x = x:detach():to(DEV):requires_grad_(true) end
         assert.is_true(G.check(function(a) return F.interpolate(a, c[2]) end, { x }), "case " .. i)
      end
   end)
   -- PyTorch 2.15's antialiased kernels give every output row the first one's value where the
   -- output is one column wide (3 x 1 -> 5 x 1 bilinear: 0, 0, 0, 0, 0 for the column 0, 1, 2);
   -- lumen resamples that column as any other
   it("antialiased resizing to one column resamples the rows", function()
      same(vals(F.interpolate(ar({ 1, 1, 3, 1 }), { size = { 5, 1 }, mode = "bilinear",
                                                     antialias = true })),
           vals(F.interpolate(ar({ 1, 1, 3, 1 }):expand({ 1, 1, 3, 2 }):contiguous(),
                              { size = { 5, 2 }, mode = "bilinear", antialias = true })
                :narrow(4, 1, 1)),
           "the one column as the first of two")
   end)
end)

-- mode "area": PyTorch's adaptive average pooling to the output size (values read off PyTorch
-- 2.15 for arange inputs)
describe("F.interpolate mode area", function()
   it("values, the format kept, the gradient", function()
      local x = lm.arange(0, 2 * 3 * 5 * 7):double():view({ 2, 3, 5, 7 })
      if DEV then x = x:to(DEV) end
      local y = F.interpolate(x, { size = { 2, 3 }, mode = "area" })
      H.assert_close(y[1][1]:cpu(), { { 8, 10, 12 }, { 22, 24, 26 } }, 1e-12)
      local ycl = F.interpolate(x:contiguous(lm.channels_last), { scale_factor = 0.5,
                                                                   mode = "area" })
      assert.is_true(H.list_equal({ 2, 3, 2, 3 }, ycl:size()))
      assert.is_true(ycl:is_contiguous(lm.channels_last), "channels-last kept")
      local x1 = lm.arange(0, 10):double():view({ 1, 1, 10 })
      if DEV then x1 = x1:to(DEV) end
      H.assert_close(F.interpolate(x1, { scale_factor = 0.3, mode = "area" }):cpu(),
                     { { { 1.5, 4.5, 7.5 } } }, 1e-12)
      local x3 = lm.arange(0, 27):double():view({ 1, 1, 3, 3, 3 })
      if DEV then x3 = x3:to(DEV) end
      H.assert_close(F.interpolate(x3, { size = { 2, 2, 2 }, mode = "area" }):cpu():view(-1),
                     { 6.5, 7.5, 9.5, 10.5, 15.5, 16.5, 18.5, 19.5 }, 1e-12)
      local g = G.input({ 1, 2, 5, 6 }, lm.channels_last, 61)
      if DEV then g = g:detach():to(DEV):requires_grad_(true) end
      assert.is_true(G.check(function(a) return F.interpolate(a, { size = { 3, 4 },
                                                                   mode = "area" }) end, { g }))
      H.assert_error_like("interpolate", "align_corners", F.interpolate, x,
                          { size = 2, mode = "area", align_corners = false })
      H.assert_error_like("interpolate", "uint8", F.interpolate,
                          lm.zeros({ 1, 1, 4, 4 }, { dtype = lm.uint8 }),
                          { size = 2, mode = "area" })
   end)
end)

describe("F.interpolate bad input", function()
   local x = lm.zeros({ 1, 2, 3, 4 })
   local cases = {
      { function() F.interpolate(x, {}) end, "either size or scale_factor" },
      { function() F.interpolate(x, { size = 2, scale_factor = 2 }) end, "only one of" },
      { function() F.interpolate(x, { size = 2, mode = "cubic" }) end, "mode must be" },
      { function() F.interpolate(x, { size = 2, mode = "trilinear" }) end, "expects a 5%-D" },
      { function() F.interpolate(x, { size = 2, mode = "linear" }) end, "expects a 3%-D" },
      { function() F.interpolate(x, { size = { 2, 3, 4 } }) end, "2 elements" },
      { function() F.interpolate(x, { size = 0 }) end, "positive" },
      { function() F.interpolate(x, { scale_factor = -1 }) end, "positive" },
      { function() F.interpolate(x, { size = 2, align_corners = true }) end,
        "interpolating modes" },
      { function() F.interpolate(lm.zeros({ 2, 3 }), { size = 2 }) end, "3%-D, 4%-D or 5%-D" },
      { function() F.interpolate(x:long(), { size = 2 }) end, "interpolate" },
      { function() F.interpolate(x, { size = 2, bogus = 1 }) end, "bogus" },
      { function() F.interpolate("x", { size = 2 }) end, "tensor expected" },
      -- sizes no memory holds: an error before any work (the output's count passes 2^63; a
      -- billion-position plan would be built in Lua until the OOM killer ended the process)
      { function() F.interpolate(x, { size = { 1e9, 1e10 } }) end, "too large" },
      { function() F.interpolate(lm.zeros({ 1, 1, 4 }), { size = 1e12, mode = "linear" }) end,
        "too large: resampling plans" },
   }
   for i, cs in ipairs(cases) do
      it(cs[2] .. " " .. i, function()
         local ok, e = pcall(cs[1])
         assert.is_false(ok)
         assert.truthy(tostring(e):find("lumen.interpolate", 1, true), tostring(e))
         assert.truthy(tostring(e):find(cs[2]), tostring(e))
      end)
   end
end)
