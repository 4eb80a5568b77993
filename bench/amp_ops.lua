-- bench/amp_ops.lua -- bfloat16 operator timings, the rows of bench/peer_amp.py (PyTorch 2.x):
-- the convolutions, pools, batch norm and elementwise rows of bench/ops.lua on bfloat16 tensors
-- (batch 8, 64 channels, 56x56), in both formats, and a 1024^3 bf16 matrix product. Inputs and
-- weights are bfloat16 (no autocast: the kernels alone); batch norm has float32 parameters and
-- running statistics, as under autocast. Rows '<op>_bf16 <fmt> <median ms>'.
-- Usage: bin/lumen bench/amp_ops.lua [threads] [iters]; bench/amp.sh runs it beside the peer.
local lm = require("lumen")
local util = require("lumen.util")
local F = lm.F

local threads = tonumber(arg and arg[1]) or 2
local iters = tonumber(arg and arg[2]) or 20
lm.set_num_threads(threads)
lm.manual_seed(0)
local bf = lm.bfloat16

local function row(name, fmt, fn)
   local ok, ms = pcall(util.median_ms, fn, iters)
   if ok then
      print(string.format("%s_bf16 %s %.3f", name, fmt, ms))
   else
      print(string.format("%s_bf16 %s error: %s", name, fmt, tostring(ms)))
   end
   collectgarbage()
end

for _, fmt in ipairs({ "nchw", "nhwc" }) do
   local mf = fmt == "nhwc" and lm.channels_last or lm.contiguous_format
   local x = lm.randn({ 8, 64, 56, 56 }):to(bf):contiguous(mf)
   local w3 = (lm.randn({ 64, 64, 3, 3 }) * (1 / 24)):to(bf):contiguous(mf)
   local w1 = (lm.randn({ 256, 64, 1, 1 }) * (1 / 8)):to(bf):contiguous(mf)
   row("conv3x3_64_56_b8_fwd", fmt, function() return F.conv2d(x, w3, nil, { padding = 1 }) end)
   row("conv1x1_64to256_56_b8_fwd", fmt, function() return F.conv2d(x, w1) end)
   local xr = x:clone():requires_grad_(true)
   local w3r = w3:clone():requires_grad_(true)
   row("conv3x3_64_56_b8_fwd_bwd", fmt, function()
      local y = F.conv2d(xr, w3r, nil, { padding = 1 })
      y:backward(lm.ones_like(y))
      xr.grad, w3r.grad = nil, nil
   end)
   row("max_pool2d_3s2p1", fmt, function()
      return F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   row("adaptive_avg_pool2d_1", fmt, function() return F.adaptive_avg_pool2d(x, 1) end)
   local bn = lm.nn.BatchNorm2d(64)
   bn:train()
   local g = lm.randn({ 8, 64, 56, 56 }):to(bf):contiguous(mf)
   row("batch_norm_train_fwd_bwd", fmt, function()
      xr.grad, bn.weight.grad, bn.bias.grad = nil, nil, nil
      bn(xr):backward(g)
   end)
   -- x + x is deferred and fused with the relu (lumen.tensor): one pass over bfloat16 memory
   row("add_relu", fmt, function() return (x + x):relu() end)
end
local a = lm.randn({ 1024, 1024 }):to(bf)
local b = lm.randn({ 1024, 1024 }):to(bf)
row("matmul_1024", "-", function() return a:matmul(b) end)
