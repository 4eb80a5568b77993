-- F.interpolate with antialias = true (issue 40; lua/lumen/functional/resample.lua, aa_rows):
-- PyTorch's _upsample_bilinear2d_aa / _upsample_bicubic2d_aa. Values and input gradients
-- against PyTorch 2.x fixtures (spec/fixtures/nn/resample_aa.lua, gen_resample_aa.py: float64
-- references, and PyTorch's own float32 output) for both modes, downsampling and upsampling,
-- integer and non-integer scales, size =, align_corners, recompute_scale_factor, odd sizes; in
-- float64, float32, float16 and bfloat16, from contiguous, channels-last and strided
-- (non-dense) inputs; the output and the gradient keep the input's memory format; float64
-- gradchecks; bad input. Under LUMEN_TEST_DEVICE (sim:0, the emulated cuda:0) the same checks run
-- there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local FX = dofile("spec/fixtures/nn/resample_aa.lua").interpolate_aa

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local DTYPES = { { lm.float64, 1e-9 }, { lm.float32, 3e-5 },
                 { lm.float16, 2e-2 }, { lm.bfloat16, 8e-2 } }

-- layouts of the input: contiguous, channels-last, and a non-dense view (every other column of
-- a wider tensor), whose output and gradient are contiguous
local LAYOUTS = { "contiguous", "channels_last", "strided" }

local function fx(d, dtype, layout, rg)
   local t = lm.tensor(d.data, { dtype = lm.float64 }):view(d.sizes)
   t = t:to(dtype or lm.float64)
   if DEV then t = t:to(DEV) end
   if layout == "channels_last" then
      t = t:contiguous(lm.channels_last)
   elseif layout == "strided" then
      local w = d.sizes[4]
      t = lm.stack({ t, lm.zeros_like(t) }, 5):view(d.sizes[1], d.sizes[2], d.sizes[3], 2 * w)
      t = t:as_strided(d.sizes, { t:stride(1), t:stride(2), t:stride(3), 2 })
      assert(not t:is_contiguous() and not t:is_contiguous(lm.channels_last))
   end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function maxerr(t, expected)
   local e = lm.tensor(expected.data, { dtype = lm.float64 }):view(expected.sizes):cpu()
   local got = t:detach():cpu():double()
   assert(got:dim() == #expected.sizes, "rank")
   for i, s in ipairs(expected.sizes) do
      assert(got:size(i) == s, ("size %s, expected %s"):format(table.concat(got:size(), "x"),
             table.concat(expected.sizes, "x")))
   end
   return (got - e):abs():max():item(), math.max(1, e:abs():max():item())
end

local function close(t, expected, tol, what)
   local err, scale = maxerr(t, expected)
   assert(err <= tol * scale, ("%s: max error %g > %g"):format(what, err, tol * scale))
end

local function assert_format(t, layout, what)
   if layout == "channels_last" then
      assert(t:is_contiguous(lm.channels_last), what .. ": expected channels_last, got " ..
             H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

local function by_name(name)
   for _, c in ipairs(FX) do if c.name == name then return c end end
   error("no fixture case " .. name)
end

describe("F.interpolate antialias against PyTorch", function()
   for _, c in ipairs(FX) do
      for _, layout in ipairs(LAYOUTS) do
         for _, dt in ipairs(DTYPES) do
            it(("%s %s %s: values, gradient, formats"):format(c.name, tostring(dt[1]), layout),
               function()
               local x = fx(c.x, dt[1], layout, true)
               local y = F.interpolate(x, c.opts)
               assert.are.equal(dt[1], y:dtype())
               close(y, c.out, dt[2], "out")
               assert_format(y, layout, "out")
               y:backward(fx(c.gout, dt[1], layout))
               -- PyTorch's backward is not its forward's transpose where a dim keeps its size
               -- under a scale_factor other than 1 (the fixture's gx_true is): lumen's is
               close(x.grad, c.grad_is_transpose and c.gx or c.gx_true, dt[2] * 4, "grad_input")
               if layout ~= "strided" then assert_format(x.grad, layout, "grad_input") end
            end)
         end
      end
      it(c.name .. " float32: PyTorch's float32 output (weights computed in float)", function()
         local x = fx(c.x, lm.float32)
         close(F.interpolate(x, c.opts), c.out32, 2e-6, "out (float32)")
      end)
      it(c.name .. ": PyTorch keeps channels_last too", function()
         assert.is_true(c.torch_keeps_cl)
      end)
   end

   it("the gradient's own layout is the input's (a hook before the leaf)", function()
      for _, layout in ipairs({ "contiguous", "channels_last" }) do
         for _, mode in ipairs({ "bilinear", "bicubic" }) do
            local x = fx(by_name("bilinear_size_odd").x, lm.float64, layout, true)
            local h = x * 1
            local box = {}
            h:register_hook(function(g) box.g = g end)
            F.interpolate(h, { size = { 5, 7 }, mode = mode, antialias = true }):sum():backward()
            assert_format(box.g, layout, mode .. " gradient")
         end
      end
   end)

   it("a gradient of any strides still gives grad_input in the input's format", function()
      local c = by_name("bicubic_size_odd")
      local x = fx(c.x, lm.float64, "channels_last", true)
      local y = F.interpolate(x, c.opts)
      y:backward(fx(c.gout, lm.float64))     -- contiguous gradient, channels-last output
      close(x.grad, c.gx, 1e-9, "grad_input")
      assert_format(x.grad, "channels_last", "grad_input")
   end)

   it("upsampling bilinear with antialias is bilinear (align_corners = false)", function()
      local c = by_name("bilinear_up")
      local x = fx(c.x)
      local a = F.interpolate(x, { size = { 11, 9 }, mode = "bilinear", antialias = true })
      local b = F.interpolate(x, { size = { 11, 9 }, mode = "bilinear" })
      assert.is_true((a - b):abs():max():item() < 1e-12)
   end)

   it("antialias = false is the mode without it; a size kept is the identity", function()
      local x = fx(by_name("bilinear_half").x)
      local a = F.interpolate(x, { size = { 3, 7 }, mode = "bicubic", antialias = false })
      local b = F.interpolate(x, { size = { 3, 7 }, mode = "bicubic" })
      assert.are.equal(0, (a - b):abs():max():item())
      local y = F.interpolate(x, { size = { 8, 10 }, mode = "bicubic", antialias = true })
      assert.are.equal(0, (y - x):abs():max():item())
   end)

   it("records UpsampleBilinearAaBackward / UpsampleBicubicAaBackward", function()
      local x = fx(by_name("bilinear_half").x, lm.float64, nil, true)
      for mode, name in pairs({ bilinear = "UpsampleBilinearAaBackward",
                                bicubic = "UpsampleBicubicAaBackward" }) do
         local y = F.interpolate(x, { scale_factor = 0.5, mode = mode, antialias = true })
         assert.are.equal(name, y.grad_fn.name)
      end
   end)
end)

describe("F.interpolate antialias gradcheck (float64)", function()
   local cases = {
      { { 1, 2, 7, 9 }, nil, { size = { 3, 4 }, mode = "bilinear" } },
      { { 1, 2, 9, 8 }, lm.channels_last, { scale_factor = 0.4, mode = "bicubic" } },
      { { 1, 2, 6, 5 }, lm.channels_last, { size = { 3, 8 }, mode = "bilinear",
                                             align_corners = true } },
      { { 1, 1, 8, 7 }, nil, { size = { 3, 9 }, mode = "bicubic", align_corners = true } },
      -- H keeps its size under scale 1.1: the identity forward, and its transpose backward
      { { 1, 2, 5, 9 }, nil, { scale_factor = { 1.1, 0.5 }, mode = "bilinear" } },
   }
   for i, cs in ipairs(cases) do
      cs[3].antialias = true
      it(cs[3].mode .. " " .. i, function()
         local x = G.input(cs[1], cs[2], i)
         if DEV then x = x:detach():to(DEV):requires_grad_(true) end
         assert.is_true(G.check(function(t) return F.interpolate(t, cs[3]) end, { x }))
      end)
   end
end)

describe("F.interpolate antialias bad input", function()
   local x = lm.zeros({ 1, 2, 6, 8 })
   local function aa(t, mode, extra)
      local o = { size = 2, mode = mode, antialias = true }
      for k, v in pairs(extra or {}) do o[k] = v end
      return function() return F.interpolate(t, o) end
   end
   local RESTRICTED = "restricted to bilinear and bicubic modes and requires a 4-D tensor"
   local cases = {
      { aa(x, "nearest"), RESTRICTED },
      { aa(x, "nearest-exact"), RESTRICTED },
      { aa(lm.zeros({ 1, 2, 6 }), "linear"), RESTRICTED },
      { aa(lm.zeros({ 1, 2, 6 }), "bilinear"), RESTRICTED },
      { aa(lm.zeros({ 1, 2, 4, 6, 8 }), "trilinear"), RESTRICTED },
      { aa(lm.zeros({ 1, 2, 4, 6, 8 }), "bicubic"), RESTRICTED },
      { aa(lm.zeros({ 1, 2, 4, 6, 8 }), "bilinear"), RESTRICTED },
      { aa(x, "area"), RESTRICTED },
      { aa(x, "box"), "mode must be" },
      { aa(x, "bilinear", { antialias = 1 }), "antialias must be a boolean, got number" },
      { aa(x, "bilinear", { antialias = "yes" }), "antialias must be a boolean, got string" },
      { aa(x:long(), "bilinear"), "interpolate" },
      { aa(x, "bilinear", { scale_factor = 0.5 }), "only one of" },
      { aa(x, "bilinear", { size = { 2, 3, 4 } }), "2 elements" },
   }
   for i, cs in ipairs(cases) do
      it(cs[2] .. " " .. i, function()
         H.assert_error_like("interpolate", cs[2], cs[1])
      end)
   end

   it("antialias = false is accepted with every mode", function()
      local y = F.interpolate(x, { size = 3, mode = "nearest", antialias = false })
      assert.are.same({ 1, 2, 3, 3 }, { y:size(1), y:size(2), y:size(3), y:size(4) })
   end)
end)
