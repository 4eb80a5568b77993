-- F.pad (constant, reflect, replicate, circular; 1-D to 3-D) and the shuffles (F.pixel_shuffle,
-- F.pixel_unshuffle, F.channel_shuffle) with their modules (issue 40): values and input
-- gradients against PyTorch 2.x float64 references (spec/fixtures/nn/act.lua, gen_act.py) in
-- float64, float32, bfloat16 and float16; contiguous and channels_last / channels_last_3d input
-- (output and gradient keep the input's format, where PyTorch drops it for some pads);
-- float64 gradchecks; bad input.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local nn = lm.nn

local FX = G.fixture("act")
local CL, CL3 = lm.channels_last, lm.channels_last_3d

local function fx(d, dtype, cl, rg)
   local t = lm.tensor(d.data, { dtype = dtype or lm.float64 }):view(d.sizes)
   if cl and #d.sizes == 4 then t = t:to(CL) elseif cl and #d.sizes == 5 then t = t:to(CL3) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function check_layout(t, cl, what)
   local nd = t:dim()
   if cl and nd == 4 then
      assert(t:is_contiguous(CL), what .. ": expected channels_last, got " .. H.describe(t))
   elseif cl and nd == 5 then
      assert(t:is_contiguous(CL3), what .. ": expected channels_last_3d, got " .. H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

-- bfloat16 / float16: copies only (pad, shuffles), so the values are the inputs' roundings
local DT = {
   { lm.float64, 1e-9 }, { lm.float32, 1e-6 }, { lm.bfloat16, 3e-2 }, { lm.float16, 4e-3 },
}

local function run_pad(c, x)
   if c.mode == "constant" then return F.pad(x, c.pad, { mode = "constant", value = c.value }) end
   return F.pad(x, c.pad, { mode = c.mode })
end

local function run_shuffle(c, x) return F[c.fn](x, c.arg) end

local function against(cases, runf)
   for _, c in ipairs(cases) do
      for _, dt in ipairs(DT) do
         for _, cl in ipairs({ false, true }) do
            if not cl or #c.x.sizes >= 4 then
               it(("%s %s %s"):format(c.name, tostring(dt[1]), cl and "channels-last" or
                  "contiguous"), function()
                  local x = fx(c.x, dt[1], cl, true)
                  local out = runf(c, x)
                  assert(out:dtype() == dt[1], "dtype")
                  H.assert_sizes(out, c.out.sizes, c.name)
                  check_layout(out, cl, c.name .. " output")
                  out:backward(fx(c.gout, dt[1], cl))
                  check_layout(x.grad, cl, c.name .. " gradient")
                  G.close(out:double():contiguous(), G.tensor(c.out), dt[2], c.name .. " output")
                  -- pad's gradient sums border slices: relative to the values' size
                  G.close(x.grad:double():contiguous(), G.tensor(c.gx), dt[2] * 4,
                          c.name .. " gradient")
               end)
            end
         end
      end
   end
end

describe("F.pad against PyTorch", function() against(FX.pad, run_pad) end)
describe("shuffles against PyTorch", function() against(FX.shuffle, run_shuffle) end)

describe("pad and the shuffles", function()
   it("the positional form pad(x, pad, mode, value)", function()
      local x = lm.randn({ 1, 2, 3, 4 })
      H.assert_close(H.values(F.pad(x, { 1, 1 }, "constant", 2)),
                     H.values(F.pad(x, { 1, 1 }, { value = 2 })), 0)
      H.assert_close(H.values(F.pad(x, { 1, 1, 2, 0 }, "reflect")),
                     H.values(F.pad(x, { 1, 1, 2, 0 }, { mode = "reflect" })), 0)
   end)

   it("gradchecks (float64, both layouts)", function()
      for _, cl in ipairs({ false, true }) do
         local fmt = cl and CL or nil
         for _, mode in ipairs({ "constant", "reflect", "replicate", "circular" }) do
            G.check(function(t) return F.pad(t, { 2, 1, 1, 2 }, { mode = mode }) end,
                    { G.input({ 1, 2, 3, 4 }, fmt, 3) })
         end
         G.check(function(t) return F.pad(t, { -1, 2, 1, -1 }, { value = 0.5 }) end,
                 { G.input({ 1, 2, 3, 4 }, fmt, 4) })
         G.check(function(t) return F.pixel_shuffle(t, 2) end, { G.input({ 1, 8, 2, 3 }, fmt, 5) })
         G.check(function(t) return F.pixel_unshuffle(t, 2) end,
                 { G.input({ 1, 2, 4, 2 }, fmt, 6) })
         G.check(function(t) return F.channel_shuffle(t, 2) end,
                 { G.input({ 1, 4, 2, 3 }, fmt, 7) })
      end
      G.check(function(t) return F.pad(t, { 1, 2, 2, 1, 1, 1 }, { mode = "replicate" }) end,
              { G.input({ 1, 2, 2, 3, 3 }, CL3, 8) })
      G.check(function(t) return F.pad(t, { 1, 1, 1, 0, 1, 1 }, { mode = "reflect" }) end,
              { G.input({ 1, 2, 2, 3, 3 }, CL3, 9) })
   end)

   it("pixel_unshuffle inverts pixel_shuffle; channel_shuffle by k undoes groups g", function()
      local x = lm.randn({ 2, 12, 3, 4 }):to(CL)
      H.assert_close(H.values(F.pixel_unshuffle(F.pixel_shuffle(x, 2), 2)), H.values(x), 0)
      H.assert_close(H.values(F.channel_shuffle(F.channel_shuffle(x, 3), 4)), H.values(x), 0)
   end)

   it("modules", function()
      local x = lm.randn({ 2, 12, 3, 4 }):to(CL)
      local m = nn.PixelShuffle(2)
      assert(tostring(m) == "PixelShuffle(upscale_factor=2)", tostring(m))
      H.assert_close(H.values(m(x)), H.values(F.pixel_shuffle(x, 2)), 0)
      check_layout(m(x), true, "PixelShuffle")
      local u = nn.PixelUnshuffle(2)
      assert(tostring(u) == "PixelUnshuffle(downscale_factor=2)", tostring(u))
      H.assert_close(H.values(u(m(x))), H.values(x), 0)
      local cs = nn.ChannelShuffle(3)
      assert(tostring(cs) == "ChannelShuffle(groups=3)", tostring(cs))
      H.assert_close(H.values(cs(x)), H.values(F.channel_shuffle(x, 3)), 0)
      check_layout(cs(x), true, "ChannelShuffle")
      H.assert_error_like("PixelShuffle", "upscale_factor", nn.PixelShuffle, 0)
      H.assert_error_like("ChannelShuffle", "groups", nn.ChannelShuffle, "a")
   end)

   it("bad input", function()
      local x = lm.randn({ 1, 2, 3, 4 })
      H.assert_error_like("pad", "tensor expected", F.pad, nil, { 1, 1 })
      H.assert_error_like("pad", "pad must be", F.pad, x, nil)
      H.assert_error_like("pad", "even", F.pad, x, { 1 })
      H.assert_error_like("pad", "too large", F.pad, x, { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 })
      H.assert_error_like("pad", "integers", F.pad, x, { 1.5, 1 })
      H.assert_error_like("pad", "mode", F.pad, x, { 1, 1 }, { mode = "wrap" })
      H.assert_error_like("pad", "unknown option", F.pad, x, { 1, 1 }, { bogus = 1 })
      H.assert_error_like("pad", "value", F.pad, x, { 1, 1 }, { mode = "reflect", value = 1 })
      H.assert_error_like("pad", "less than", F.pad, x, { 4, 0, 0, 0 }, { mode = "reflect" })
      H.assert_error_like("pad", "at most", F.pad, x, { 5, 0, 0, 0 }, { mode = "circular" })
      H.assert_error_like("pad", "non-negative", F.pad, x, { -1, 0, 0, 0 }, { mode = "replicate" })
      H.assert_error_like("pad", "expects", F.pad, x, { 1, 1 }, { mode = "reflect" })
      H.assert_error_like("pad", "negative", F.pad, x, { -3, -2 })
      for _, fn in ipairs({ "pixel_shuffle", "pixel_unshuffle", "channel_shuffle" }) do
         H.assert_error_like(fn, "tensor expected", F[fn], nil, 2)
         H.assert_error_like(fn, "integer", F[fn], x, nil)
         H.assert_error_like(fn, "positive", F[fn], x, 0)
         H.assert_error_like(fn, "3 dims", F[fn], lm.randn({ 4, 4 }), 2)
      end
      H.assert_error_like("pixel_shuffle", "divisible", F.pixel_shuffle, x, 2)
      H.assert_error_like("pixel_unshuffle", "divisible", F.pixel_unshuffle, x, 2)
      H.assert_error_like("channel_shuffle", "divisible", F.channel_shuffle, x, 3)
   end)
end)
