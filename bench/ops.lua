-- bench/ops.lua -- lumen's side of ../shared/peer/bench_ops.py: the same rows, the same measure
-- (median milliseconds of ITERS runs after one warm-up), printed as '<op> <fmt> <ms>'.
-- Extra rows for the core: elementwise add / mul / add+relu with their GB/s; and the rows of
-- bench/peer_extra.py (pool and batch-norm backward, avg_pool2d).
-- Usage: bin/lumen bench/ops.lua [threads] [iters] [filter]
local lm = require("lumen")
local F = lm.nn and lm.nn.functional

local threads = tonumber(arg and arg[1]) or 2
local ITERS = tonumber(arg and arg[2]) or 20
local filter = arg and arg[3]
lm.set_num_threads(threads)

local median_ms = require("lumen.util").median_ms
local force = require("lumen.tensor").force

local function med(fn, iters) return median_ms(fn, iters or ITERS) end

local function row(name, fmt, fn, bytes)
   if filter and not name:find(filter, 1, true) then return end
   local ok, ms = pcall(med, fn)
   if not ok then
      print(string.format("%s %s error: %s", name, fmt, tostring(ms)))
      return
   end
   print(string.format("%s %s %.3f", name, fmt, ms))
   if bytes then
      -- informational line (does not end in a number, so bench/compare skips it)
      print(string.format("   %s %s: %.1f GB/s", name, fmt, bytes / (ms * 1e-3) / 1e9))
   end
   collectgarbage()
end

lm.manual_seed(0)
for _, fmt in ipairs({ "nchw", "nhwc" }) do
   local mf = fmt == "nhwc" and lm.channels_last or lm.contiguous_format
   local x = lm.randn({ 8, 64, 56, 56 }):contiguous(mf)
   local nbytes = x:numel() * 4
   if F then
      local w3 = lm.randn({ 64, 64, 3, 3 }):contiguous(mf)
      local w1 = lm.randn({ 256, 64, 1, 1 }):contiguous(mf)
      local bn = lm.nn.BatchNorm2d(64)
      bn:train()
      row("conv3x3_64_56_b8_fwd", fmt, function() return F.conv2d(x, w3, nil, { padding = 1 }) end)
      row("conv1x1_64to256_56_b8_fwd", fmt, function() return F.conv2d(x, w1) end)
      row("max_pool2d_3s2p1", fmt, function()
         return F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 })
      end)
      row("adaptive_avg_pool2d_1", fmt, function() return F.adaptive_avg_pool2d(x, 1) end)
      row("adaptive_avg_pool2d_7", fmt, function() return F.adaptive_avg_pool2d(x, 7) end)
      row("batch_norm_train_fwd", fmt, function() return bn(x) end)
   end
   row("add_relu", fmt, function() return (x + x):relu() end, 3 * nbytes)
   -- lumen only: the same with the result freed at once (t:free()), as the peer's reference
   -- counting does for a dropped result; compare it with the peer's add_relu row
   row("add_relu_freed", fmt, function()
      local y = (x + x):relu()
      y:free()
   end, 3 * nbytes)
   -- a lone large x + x is deferred (lumen/deferred.lua) and, dropped unused, never computed:
   -- force it, so these rows time the operation itself (add_relu above runs as one fused pass)
   row("add", fmt, function() return force(x + x) end, 3 * nbytes)
   row("mul", fmt, function() return force(x * x) end, 3 * nbytes)
   if F then
      -- the rows of bench/peer_extra.py (lumen's own peer script): pools and batch norm with
      -- their backward, avg_pool2d; gradients reset before every backward on both sides
      local xg = x:clone():requires_grad_(true)
      local g = lm.randn_like(x)
      local bng = lm.nn.BatchNorm2d(64)
      bng:train()
      local function fwd_bwd(f)
         return function()
            xg.grad, bng.weight.grad, bng.bias.grad = nil, nil, nil
            local y = f(xg)
            y:backward(y:numel() == x:numel() and g or lm.ones_like(y))
         end
      end
      row("avg_pool2d_3s2p1", fmt, function()
         return F.avg_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 })
      end)
      row("avg_pool2d_2s2", fmt, function()
         return F.avg_pool2d(x, { kernel_size = 2, stride = 2 })
      end)
      row("max_pool2d_3s2p1_fwd_bwd", fmt, fwd_bwd(function(t)
         return F.max_pool2d(t, { kernel_size = 3, stride = 2, padding = 1 })
      end))
      row("avg_pool2d_3s2p1_fwd_bwd", fmt, fwd_bwd(function(t)
         return F.avg_pool2d(t, { kernel_size = 3, stride = 2, padding = 1 })
      end))
      for _, s in ipairs({ 1, 7 }) do
         row("adaptive_avg_pool2d_" .. s .. "_fwd_bwd", fmt, fwd_bwd(function(t)
            return F.adaptive_avg_pool2d(t, s)
         end))
      end
      row("batch_norm_train_fwd_bwd", fmt, fwd_bwd(function(t) return bng(t) end))

      local xr = x:clone():requires_grad_(true)
      local w3 = lm.randn({ 64, 64, 3, 3 }):contiguous(mf):requires_grad_(true)
      row("conv3x3_64_56_b8_fwd_bwd", fmt, function()
         local y = F.conv2d(xr, w3, nil, { padding = 1 })
         y:backward(lm.ones_like(y))
         xr.grad, w3.grad = nil, nil
      end)
   end
end

local a, b = lm.randn({ 4 }), lm.randn({ 4 })
do
   -- per-op overhead: time a batch of 10000 adds, report per op (ms like the peer's row)
   local N = 10000
   local ms = med(function()
      for _ = 1, N do local _ = a + b end
   end, 21) / N
   print(string.format("add_4_elements overhead %.6f", ms))
end
