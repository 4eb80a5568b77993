-- Convolutions with small groups (4, 8 or 16 channels a group: RegNet, ResNeXt), the float32
-- channels-last kernels of kernels/cpu/conv_grouped_f32_avx512.c ("grouped_avx512"): forward
-- (bias, residual, activation), grad_input (stride 1, and strided by phases, including a phase
-- that no tap reaches) and grad_weight / grad_bias against the float64 convolution of the same
-- operands on the portable kernels, with random gradients (every output channel different, so a
-- block reading another block's grad_output shows), group counts that leave a partial 16-lane
-- block, N > 1; the same values with the implementation switched off; formats of the output and
-- gradients; LUMEN_VERBOSE naming it where it runs; grad_bias alone = with grad_weight.
local lm = require("lumen")
local sh = require("spec.shell")
local F = lm.F

local on_cpu = lm.get_default_device() == "cpu"

local rel_diff = require("spec.helpers").rel_diff

-- {name, N, C, H, W, O, kh, kw, stride, padding, dilation, groups, bias, residual, act}
local GEOMS = {
   { "8 a group, 13 groups (a partial block)", 2, 104, 9, 8, 104, 3, 3, 1, 1, 1, 13, true, true,
     "relu" },
   { "8 a group, stride 2, 55 groups", 2, 440, 6, 7, 440, 3, 3, 2, 1, 1, 55, true, false, nil },
   { "4 a group, dilation 2", 3, 32, 9, 9, 32, 3, 3, 1, 2, 2, 8, false, true, nil },
   { "16 a group, 5x5 stride 2", 2, 48, 11, 10, 48, 5, 5, 2, 2, 1, 3, true, false, "silu" },
   { "8 in, 4 out a group", 2, 24, 7, 8, 12, 3, 3, 1, 1, 1, 3, true, true, nil },
   { "4 in, 16 out a group, 1x1 stride 2 (a phase no tap reaches)", 2, 12, 7, 9, 48, 1, 1, 2, 0,
     1, 3, true, false, nil },
   { "8 a group, 2x2 maps", 2, 208, 2, 2, 208, 3, 3, 1, 1, 1, 26, true, false, nil },
   { "8 a group, 4x4 kernel stride 2", 2, 24, 8, 9, 24, 4, 4, 2, 1, 1, 3, false, false, nil },
   -- the 8-lane forward's partial block is above (8 in, 4 out); these three: the weight
   -- gradient's 16-lane block with one group of 4 in it, its taps in chunks (25 taps), and a
   -- strided forward whose rows take two tiles each
   { "4 a group, 5 groups (a partial block)", 2, 20, 7, 7, 20, 3, 3, 1, 1, 1, 5, true, false,
     nil },
   { "8 a group, 5x5", 2, 16, 9, 9, 16, 5, 5, 1, 2, 1, 2, false, true, "relu" },
   { "8 a group, stride 2, 30 output columns", 1, 16, 5, 60, 16, 3, 3, 2, 1, 1, 2, true, false,
     nil },
}

local function operands(g)
   local _, N, Cn, Hh, W, O, kh, kw, s, p, d, groups, hb, hr = unpack(g)
   local x = lm.randn({ N, Cn, Hh, W }):contiguous(lm.channels_last)
   local w = (lm.randn({ O, Cn / groups, kh, kw }) * 0.3):contiguous(lm.channels_last)
   local b = hb and lm.randn({ O }) or nil
   local opts = { stride = s, padding = p, dilation = d, groups = groups }
   local y = F.conv2d(x, w, nil, opts)
   local r = hr and lm.randn(y:size()):contiguous(lm.channels_last) or nil
   local gy = lm.randn(y:size()):contiguous(lm.channels_last)
   return x, w, b, r, gy, opts
end

-- forward, then every gradient of (y * gy):sum() (the activation applied after the residual)
local function run(x, w, b, r, gy, opts, act)
   local xx, ww = x:clone():requires_grad_(true), w:clone():requires_grad_(true)
   local bb = b and b:clone():requires_grad_(true) or nil
   local y = F.conv2d(xx, ww, bb, opts)
   if r then y = y + r end
   if act == "relu" then y = y:relu() elseif act == "silu" then y = F.silu(y) end
   (y * gy):sum():backward()
   return y, xx.grad, ww.grad, bb and bb.grad or nil
end

local function d64(t) return t and t:double():contiguous() or nil end

-- fwd(x, w, b, r, gy) -> y, grad_x, grad_w, grad_b: its float32 results against float64, the
-- output and gradients channels-last, and the same values with `impl` switched off (the next
-- entry of the implementation list)
local function check_grads(fwd, impl, x, w, b, r, gy)
   local y, gx, gw, gb = fwd(x, w, b, r, gy)
   local y64, gx64, gw64, gb64 = fwd(d64(x), d64(w), d64(b), d64(r), d64(gy))
   assert.is_true(rel_diff(y, y64) < 1e-5, "output " .. rel_diff(y, y64))
   assert.is_true(rel_diff(gx, gx64) < 1e-5, "grad_input " .. rel_diff(gx, gx64))
   assert.is_true(rel_diff(gw, gw64) < 1e-5, "grad_weight " .. rel_diff(gw, gw64))
   if gb then assert.is_true(rel_diff(gb, gb64) < 1e-5, "grad_bias") end
   assert.is_true(y:is_contiguous(lm.channels_last), "output channels-last")
   assert.is_true(gx:is_contiguous(lm.channels_last), "grad_input channels-last")
   assert.is_true(gw:is_contiguous(lm.channels_last), "grad_weight channels-last")
   if on_cpu then
      lm.backends.cpu.disable(impl)
      local ok, y2, gx2, gw2 = pcall(fwd, x, w, b, r, gy)
      lm.backends.cpu.enable(impl)
      assert(ok, y2)
      assert.is_true(rel_diff(y, y2) < 1e-5 and rel_diff(gx, gx2) < 1e-5 and
                     rel_diff(gw, gw2) < 1e-5, "the kernel switched off")
   end
   return y, y64
end

describe("conv2d with small groups (grouped_avx512)", function()
   for _, g in ipairs(GEOMS) do
      it(g[1] .. ": values and every gradient against float64", function()
         lm.manual_seed(11)
         local x, w, b, r, gy, opts = operands(g)
         local act = g[15]
         check_grads(function(xx, ww, bb, rr, gg) return run(xx, ww, bb, rr, gg, opts, act) end,
                     "grouped_avx512", x, w, b, r, gy)
      end)
   end

   it("grad_bias alone equals grad_bias beside grad_weight (the same sums)", function()
      lm.manual_seed(12)
      local x, w, b, _, gy, opts = operands(GEOMS[1])
      local _, _, _, gb1 = run(x, w, b, nil, gy, opts)
      local bb = b:clone():requires_grad_(true)
      local y = F.conv2d(x, w, bb, opts);
      (y * gy):sum():backward()
      assert.is_true((bb.grad - gb1):abs():max():item() == 0, "same bits")
   end)

   it("LUMEN_VERBOSE names grouped_avx512 in forward, grad_input and grad_weight (AVX-512)",
      function()
      local C = require("lumen.C")
      if not on_cpu or C.lm_cpu_get_isa() < C.LM_ISA_AVX512 then
         pending("the CPU's AVX-512 kernels")
         return
      end
      -- the lines go to the C library's stderr: a child luajit
      local out = sh.luajit([[
local lm = require("lumen")
local x = lm.randn({ 2, 104, 8, 8 }):contiguous(lm.channels_last):requires_grad_(true)
local w = lm.randn({ 104, 8, 3, 3 }):contiguous(lm.channels_last):requires_grad_(true)
lm.F.conv2d(x, w, nil, { stride = 2, padding = 1, groups = 13 }):sum():backward()
]], "LUMEN_VERBOSE=1")
      local fwd = out:match("lumen_verbose,exec,cpu,conv2d,([^,]+),float32")
      local bwd = out:match("lumen_verbose,exec,cpu,conv2d_backward,([^,]+),float32")
      assert.are.equal("grouped_avx512", fwd, out)
      assert.are.equal("grouped_avx512", bwd, out)
   end)
end)

-- Depthwise layers on AVX-512 ("depthwise_avx512", kernels/cpu/conv_depthwise_f32_avx512.c):
-- its tiled rows (forwards of 3x3 (4 pixels x 4 channel vectors), 5x5 and 7x7 (8 pixels x 1)
-- at stride 1 and 2; backward data at stride 1 and 2 (the parity-split tiles, odd and even
-- padding); the weight gradient) beside its 4-pixel x 64-channel blocks (column dilation,
-- strides above 2), each geometry against float64: channel counts that leave a
-- partial 16-lane vector, rows of one partial tile, rows of several tiles and a remainder, maps
-- where every pixel is a border one, padding 0 and k - 1, row dilation 2, bias / residual /
-- activation in the epilogue; and the same values with the kernel switched off.
-- {name, N, C, H, W, k, stride, padding, dilation, bias, residual, act}
local DW_GEOMS = {
   { "7x7 stride 1, 24 channels, rows of 3 tiles", 2, 24, 9, 20, 7, 1, 3, 1, true, true, "silu" },
   { "7x7 stride 1 on 7x7 maps (every pixel a border one)", 2, 48, 7, 7, 7, 1, 3, 1, true,
     false, nil },
   { "7x7 stride 2, 40 channels", 2, 40, 15, 19, 7, 2, 3, 1, false, false, "relu" },
   { "5x5 stride 1, 72 channels, padding 0", 2, 72, 9, 21, 5, 1, 0, 1, true, false, nil },
   { "5x5 stride 2, 144 channels", 1, 144, 12, 17, 5, 2, 2, 1, true, true, "hardswish" },
   { "5x5 stride 1, padding 4, row dilation 2", 2, 16, 10, 11, 5, 1, 4, { 2, 1 }, false, false,
     nil },
   { "3x3 stride 1, 40 channels, a 2x3 map", 3, 40, 2, 3, 3, 1, 1, 1, true, false, nil },
   { "3x3 stride 1, 32 channels (8 pixels x 2 vectors), rows of 4 tiles", 2, 32, 6, 30, 3, 1,
     1, 1, false, true, nil },
   { "3x3 stride 1, 16 channels (8 pixels x 1 vector), relu", 2, 16, 7, 19, 3, 1, 1, 1, true,
     false, "relu" },
   { "3x3 stride 2 (tiles forward, blocks backward)", 2, 24, 9, 13, 3, 2, 1, 1, true, false,
     "relu6" },
   { "3x3 stride 1, 80 channels (a tile of 4 vectors, one partial), 13 columns", 2, 80, 5, 13,
     3, 1, 1, 1, true, true, "silu" },
   { "3x3 dilation 2 (the blocks)", 2, 32, 9, 9, 3, 1, 2, 2, false, false, nil },
   { "3x3 stride 2, padding 0 (even), 72 channels, 21 columns", 2, 72, 9, 21, 3, 2, 0, 1, true,
     false, nil },
   { "5x5 stride 2, padding 1 (odd), 24 channels", 2, 24, 11, 18, 5, 2, 1, 1, false, false,
     nil },
   { "7x7 stride 2, padding 3, 16 channels, 2x2 output", 2, 16, 4, 3, 7, 2, 3, 1, true, false,
     nil },
   { "3x3 stride 3 (the blocks)", 2, 16, 10, 11, 3, 3, 1, 1, true, false, nil },
}

describe("depthwise conv2d on AVX-512 (depthwise_avx512: tiles and blocks)", function()
   for _, g in ipairs(DW_GEOMS) do
      it(g[1] .. ": values and every gradient against float64", function()
         local _, N, Cn, Hh, W, k, s, p, d, hb, hr, act = unpack(g)
         lm.manual_seed(13)
         local x = lm.randn({ N, Cn, Hh, W }):contiguous(lm.channels_last)
         local w = (lm.randn({ Cn, 1, k, k }) * 0.3):contiguous(lm.channels_last)
         local b = hb and lm.randn({ Cn }) or nil
         local opts = { stride = s, padding = p, dilation = d, groups = Cn }
         local y0 = F.conv2d(x, w, nil, opts)
         local r = hr and lm.randn(y0:size()):contiguous(lm.channels_last) or nil
         local gy = lm.randn(y0:size()):contiguous(lm.channels_last)
         local function go(xx, ww, bb, rr, gg)
            xx, ww = xx:clone():requires_grad_(true), ww:clone():requires_grad_(true)
            bb = bb and bb:clone():requires_grad_(true) or nil
            local y
            if act and not rr then
               y = F.conv2d(xx, ww, bb, { stride = s, padding = p, dilation = d, groups = Cn,
                                          act = act })
            else
               y = F.conv2d(xx, ww, bb, opts)
               if rr then y = y + rr end
               if act then y = F[act](y) end
            end
            (y * gg):sum():backward()
            return y, xx.grad, ww.grad, bb and bb.grad or nil
         end
         check_grads(go, "depthwise_avx512", x, w, b, r, gy)
      end)
   end
end)

-- Below AVX-512 (forced to AVX2 on any CPU that has it, so AVX-512 machines run these too):
-- kernels/cpu/conv_grouped_f32_avx2.c ("grouped_avx2": groups of 2, 4 or 8k output channels,
-- O a multiple of 8; forward, grad_input (strided: by phases), grad_weight; and groups 1 with
-- at most 4 input channels, the stems) and
-- kernels/cpu/conv_depthwise_f32_avx2.c ("depthwise_avx2": C a multiple of 8, 5x5 and larger,
-- 3x3 at stride 1; the same three). Each geometry: values and every gradient against float64,
-- the same values with the implementation switched off, the fused epilogue (bias, residual,
-- activation inside the kernel) against float64, and LUMEN_VERBOSE naming the kernel.
local C = require("lumen.C")
local has_avx2 = on_cpu and C.lm_cpu_get_isa() >= C.LM_ISA_AVX2

local function at_avx2(fn)
   C.lm_cpu_set_isa(C.LM_ISA_AVX2)
   local ok, a, b2, c2, d2 = pcall(fn)
   C.lm_cpu_set_isa(C.LM_ISA_AUTO)
   assert(ok, a)
   return a, b2, c2, d2
end

-- one geometry g (the GEOMS fields) with implementation `impl`, seed `seed`
local function avx2_case(g, impl, seed)
   it(g[1] .. ": values and every gradient against float64, and with the kernel off", function()
      if not has_avx2 then
         pending("a CPU with AVX2")
         return
      end
      lm.manual_seed(seed)
      local x, w, b, r, gy, opts = operands(g)
      local act = g[15]
      local _, y64 = check_grads(function(xx, ww, bb, rr, gg)
         return at_avx2(function() return run(xx, ww, bb, rr, gg, opts, act) end)
      end, impl, x, w, b, r, gy)
      if act == "relu" then
         local yf = at_avx2(function()
            return lm.no_grad(function()
               return F.conv2d(x, w, b, { stride = opts.stride, padding = opts.padding,
                                          dilation = opts.dilation, groups = opts.groups,
                                          residual = r, act = "relu" })
            end)
         end)
         assert.is_true(rel_diff(yf, y64) < 1e-5, "fused " .. rel_diff(yf, y64))
      end
   end)
end

-- LUMEN_VERBOSE at AVX2 names impl in forward and backward for the layer `setup` builds
local function avx2_verbose(impl, setup)
   it("LUMEN_VERBOSE names " .. impl .. " in forward and backward at AVX2", function()
      if not has_avx2 then
         pending("a CPU with AVX2")
         return
      end
      local out = sh.luajit([[
local lm = require("lumen")
local C = require("lumen.C")
C.lm_cpu_set_isa(C.LM_ISA_AVX2)
]] .. setup, "LUMEN_VERBOSE=1")
      local fwd = out:match("lumen_verbose,exec,cpu,conv2d,([^,]+),float32")
      local bwd = out:match("lumen_verbose,exec,cpu,conv2d_backward,([^,]+),float32")
      assert.are.equal(impl, fwd, out)
      assert.is_truthy(bwd and bwd:find("^" .. impl), out)
   end)
end

describe("conv2d with small groups below AVX-512 (grouped_avx2)", function()
   local AVX2_GEOMS = {
      GEOMS[1], GEOMS[2], GEOMS[3], GEOMS[4], GEOMS[7], GEOMS[8],
      { "2 a group, 5x5 dilation 2, stride 1", 2, 16, 9, 11, 16, 5, 5, 1, 4, 2, 8, true, true,
        "relu" },
      { "8 a group, 1 x 13 maps (the one-pixel loop only)", 1, 32, 1, 13, 32, 3, 3, 1, 1, 1, 4,
        true, false, nil },
      { "8 a group, 30 columns (tiles of 12, 4 and 1, and edges)", 2, 64, 5, 30, 64, 3, 3, 1,
        1, 1, 8, false, true, nil },
      -- strided grad_input by phases (lm_conv_grp_bwdd_nhwc_avx2)
      { "8 a group, 3x3 stride 2, 28 columns (RegNet's downsampling)", 2, 48, 12, 28, 48, 3, 3,
        2, 1, 1, 6, true, false, nil },
      { "8 a group, 1x1 stride 2 (phases no tap reaches: zero)", 2, 16, 7, 9, 16, 1, 1, 2, 0, 1,
        2, true, false, nil },
      { "4 a group, 5x5 stride 3, dilation 2", 1, 16, 14, 15, 16, 5, 5, 3, 4, 2, 4, false,
        false, nil },
      { "2 a group, 3x3 stride 2, padding 3 (wider than the kernel)", 2, 8, 9, 10, 8, 3, 3, 2,
        3, 1, 4, true, false, nil },
      -- narrow inputs, groups 1 (the RGB stems): forward and weight gradient
      { "stem: 3 -> 16, 3x3 stride 2 (MobileNet V3's), relu", 2, 3, 17, 30, 16, 3, 3, 2, 1, 1,
        1, true, true, "relu" },
      { "stem: 3 -> 24, 4x4 stride 4 (ConvNeXt's patchify)", 2, 3, 16, 20, 24, 4, 4, 4, 0, 1, 1,
        true, false, nil },
      { "stem: 4 -> 8, 3x3 dilation 2 (the tap-by-tap loop)", 1, 4, 11, 13, 8, 3, 3, 1, 2, 2,
        1, false, false, nil },
   }
   for _, g in ipairs(AVX2_GEOMS) do avx2_case(g, "grouped_avx2", 21) end
   avx2_verbose("grouped_avx2", [[
local x = lm.randn({ 2, 104, 8, 8 }):contiguous(lm.channels_last):requires_grad_(true)
local w = lm.randn({ 104, 8, 3, 3 }):contiguous(lm.channels_last):requires_grad_(true)
lm.F.conv2d(x, w, nil, { padding = 1, groups = 13 }):sum():backward()
]])
end)

describe("depthwise conv2d below AVX-512 (depthwise_avx2)", function()
   -- {name, N, C, H, W, O, kh, kw, stride, padding, dilation, groups, bias, residual, act}
   local DW = {
      { "7x7 (ConvNeXt), bias", 2, 16, 9, 30, 16, 7, 7, 1, 3, 1, 16, true, false, nil },
      { "5x5 stride 2, residual, relu", 2, 24, 11, 12, 24, 5, 5, 2, 2, 1, 24, true, true,
        "relu" },
      { "5x5 dilation 2", 1, 8, 12, 17, 8, 5, 5, 1, 4, 2, 8, false, false, nil },
      { "7x7 on a 2x3 map (every tap checked)", 2, 32, 2, 3, 32, 7, 7, 1, 3, 1, 32, true,
        false, nil },
      { "7x7 on a 1 x 13 row", 1, 8, 1, 13, 8, 7, 7, 1, 3, 1, 8, true, true, "relu" },
      { "3x3 stride 1, 16 channels (MobileNet V3's first), relu", 2, 16, 10, 29, 16, 3, 3, 1,
        1, 1, 16, true, true, "relu" },
      { "3x3 stride 2, 16 channels (forward: tiles; grad_input gathered; grad_weight: the " ..
        "portable loops)", 2, 16, 9, 11, 16, 3, 3, 2, 1, 1, 16, true, false, nil },
      { "3x3 stride 3, dilation 2, 24 channels (grad_input gathered)", 2, 24, 11, 10, 24, 3, 3,
        3, 2, 2, 24, false, false, nil },
      { "1x1 stride 2 (grad_input gathered: pixels no tap reads are zero)", 2, 16, 7, 9, 16, 1,
        1, 2, 0, 1, 16, true, false, nil },
      { "3x3 stride 2, 72 channels (forward pixel by pixel), relu", 2, 72, 9, 12, 72, 3, 3, 2, 1,
        1, 72, true, true, "relu" },
      { "7x7 stride 2, rows of several tiles and a remainder", 2, 24, 11, 29, 24, 7, 7, 2, 3, 1,
        24, true, false, nil },
      { "7x7, 40 channels, 21 columns (tiles of 4, the last partial), relu", 2, 40, 8, 21, 40, 7,
        7, 1, 3, 1, 40, false, true, "relu" },
      { "5x5 padding 0, 24 channels, 19 columns", 2, 24, 9, 19, 24, 5, 5, 1, 0, 1, 24, true,
        false, nil },
      { "3x3, 120 channels (pixel by pixel: 64 + 32 + 16 + 8), residual, relu", 2, 120, 6,
        9, 120, 3, 3, 1, 1, 1, 120, true, true, "relu" },
      { "3x3 dilation 2, 56 channels (pixel by pixel)", 1, 56, 9, 10, 56, 3, 3, 1, 2, 2, 56,
        false, false, nil },
      { "5x5 with 12 channels (not taken: the next entry)", 2, 12, 7, 9, 12, 5, 5, 1, 2, 1, 12,
        true, false, nil },
   }
   for _, g in ipairs(DW) do avx2_case(g, "depthwise_avx2", 31) end
   avx2_verbose("depthwise_avx2", [[
local x = lm.randn({ 2, 32, 10, 10 }):contiguous(lm.channels_last):requires_grad_(true)
local w = lm.randn({ 32, 1, 7, 7 }):contiguous(lm.channels_last):requires_grad_(true)
lm.F.conv2d(x, w, nil, { padding = 3, groups = 32 }):sum():backward()
]])
end)
