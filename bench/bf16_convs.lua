-- bench/bf16_convs.lua -- every convolution shape of torchvision's resnet50 at batch 8 in bfloat16,
-- channels-last, forward (with bias: the folded model's form) and optionally backward (data and
-- weight): median ms of each, one row per shape, beside bench/peer_bf16_convs.py (the same rows
-- from PyTorch 2.x; bench/compare pairs them). The rows say which kernels AMX machines run
-- (docs/performance.md, AMX).
-- Usage: bin/lumen bench/bf16_convs.lua [threads] [iters] [bwd]
local lm = require("lumen")
local util = require("lumen.util")
local F = lm.F

local threads = tonumber(arg and arg[1]) or 2
local iters = tonumber(arg and arg[2]) or 10
local bwd = arg and arg[3] == "bwd"
lm.set_num_threads(threads)
lm.manual_seed(0)

-- C, O, H (input), k, stride: resnet50's convolutions (stride on the 3x3 of each stage's first
-- block, as torchvision's v1.5)
local shapes = {
   { 3, 64, 224, 7, 2 },
   { 64, 64, 56, 1, 1 }, { 64, 64, 56, 3, 1 }, { 64, 256, 56, 1, 1 }, { 256, 64, 56, 1, 1 },
   { 256, 128, 56, 1, 1 }, { 128, 128, 56, 3, 2 }, { 128, 128, 28, 3, 1 }, { 128, 512, 28, 1, 1 },
   { 512, 128, 28, 1, 1 }, { 256, 512, 56, 1, 2 },
   { 512, 256, 28, 1, 1 }, { 256, 256, 28, 3, 2 }, { 256, 256, 14, 3, 1 }, { 256, 1024, 14, 1, 1 },
   { 1024, 256, 14, 1, 1 }, { 512, 1024, 28, 1, 2 },
   { 1024, 512, 14, 1, 1 }, { 512, 512, 14, 3, 2 }, { 512, 512, 7, 3, 1 }, { 512, 2048, 7, 1, 1 },
   { 2048, 512, 7, 1, 1 }, { 1024, 2048, 14, 1, 2 },
}

for _, s in ipairs(shapes) do
   local C, O, H, k, st = s[1], s[2], s[3], s[4], s[5]
   local x = lm.randn({ 8, C, H, H }):to(lm.bfloat16):contiguous(lm.channels_last)
   local w = (lm.randn({ O, C, k, k }) * (1 / math.sqrt(C * k * k))):to(lm.bfloat16)
      :contiguous(lm.channels_last)
   local b = lm.randn({ O }):to(lm.bfloat16)
   local opts = { stride = st, padding = math.floor((k - 1) / 2) }
   local name = ("conv%dx%d_%dto%d_%d_s%d_b8"):format(k, k, C, O, H, st)
   print(("%s_fwd nhwc %.3f"):format(name, util.median_ms(function()
      return F.conv2d(x, w, b, opts) end, iters)))
   if bwd then
      local xr, wr = x:clone():requires_grad_(true), w:clone():requires_grad_(true)
      local y = F.conv2d(xr, wr, nil, opts)
      local g = lm.randn(y:size()):to(lm.bfloat16):contiguous(lm.channels_last)
      print(("%s_bwd nhwc %.3f"):format(name, util.median_ms(function()
         xr.grad, wr.grad = nil, nil
         F.conv2d(xr, wr, nil, opts):backward(g)
      end, iters)))
   end
   collectgarbage()
end
