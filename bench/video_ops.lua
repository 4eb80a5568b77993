-- bench/video_ops.lua -- 3-D (video) operator rows, NCDHW beside channels_last_3d (NDHWC); the
-- peer is bench/peer_video.py (PyTorch 2.x, the same rows, the same measure). bench/video.sh runs
-- both alternately and compares them.
--
--   bin/lumen bench/video_ops.lua [threads] [iters] [filter]
--
-- Rows '<op> <fmt> <ms>', fmt ncdhw (contiguous) or ndhwc (channels_last_3d: input, weight and
-- gradient), the median of ITERS calls after one warm-up (the convolution rows, which take 10 to
-- 300 ms, use max(3, ITERS / 2) calls). Batch 2 of 8x112x112 clips, float32, no bias:
-- - conv3d, the layers of torchvision's r3d_18 (_fwd: forward; _fwd_bwd: forward, then backward
--   of a fixed random gradient into the input and weight gradients, the stem into the weight
--   gradient only, as in a model whose input needs no gradient):
--     stem  3->64 3x7x7 stride (1,2,2) padding (1,3,3), 8x112x112 -> 8x56x56
--     l1    64->64 3x3x3 p1 at 8x56x56
--     l2    128->128 3x3x3 p1 at 4x28x28, and l2ds its downsample 64->128 1x1x1 stride 2
--           (8x56x56 -> 4x28x28)
--     l3    256->256 3x3x3 p1 at 2x14x14
--     l4    512->512 3x3x3 p1 at 1x7x7
--   and r2plus1d_18's (2+1)-D pair of layer1 (64 -> 144 midplanes -> 64) at 8x56x56:
--     r21d_s 64->144 1x3x3 padding (0,1,1); r21d_t 144->64 3x1x1 padding (1,0,0)
-- - max_pool3d 3x3x3 stride 2 padding 1, avg_pool3d the same, adaptive_avg_pool3d(1), on the
--   64x8x56x56 activation: _fwd and _fwd_bwd
-- - batch norm 5-D (BatchNorm3d(64) on 64x8x56x56): train _fwd, train _fwd_bwd, eval (no grad)
-- Gradients are reset before every backward, on both sides.
local lm = require("lumen")
local F = lm.F

local threads = tonumber(arg and arg[1]) or 2
local ITERS = tonumber(arg and arg[2]) or 10
local filter = arg and arg[3]
if filter == "" then filter = nil end
lm.set_num_threads(threads)
local CONV_ITERS = math.max(3, math.floor(ITERS / 2))

local median_ms = require("lumen.util").median_ms

local function row(name, fmt, fn, iters)
   if filter and not name:find(filter, 1, true) then return end
   collectgarbage()
   local ok, ms = pcall(median_ms, fn, iters or ITERS)
   if not ok then
      print(string.format("%s %s error: %s", name, fmt, tostring(ms)))
      return
   end
   print(string.format("%s %s %.3f", name, fmt, ms))
   collectgarbage()
end

local function wanted(name)
   return not filter or (name .. "_fwd_bwd"):find(filter, 1, true) ~= nil
end

local N = 2
lm.manual_seed(0)
for _, fmt in ipairs({ "ncdhw", "ndhwc" }) do
   local mf = fmt == "ndhwc" and lm.channels_last_3d or lm.contiguous_format
   local function rnd(sizes, scale)
      local t = lm.randn(sizes)
      if scale then t = t * scale end
      return t:contiguous(mf)
   end

   -- one convolution layer: input cin x d x hw x hw, weight cout x cin x k
   local function conv(name, cin, cout, d, hw, k, opts, no_input_grad)
      if not wanted(name) then return end
      local x = rnd({ N, cin, d, hw, hw })
      local w = rnd({ cout, cin, k[1], k[2], k[3] }, 1 / math.sqrt(cin * k[1] * k[2] * k[3]))
      local g = rnd(F.conv3d(x, w, nil, opts):size())
      row(name .. "_fwd", fmt, function() return F.conv3d(x, w, nil, opts) end, CONV_ITERS)
      local xr = no_input_grad and x or x:clone():requires_grad_(true)
      local wr = w:clone():requires_grad_(true)
      row(name .. "_fwd_bwd", fmt, function()
         xr.grad, wr.grad = nil, nil
         F.conv3d(xr, wr, nil, opts):backward(g)
      end, CONV_ITERS)
   end

   conv("conv3d_stem_3to64_3x7x7_s122_8x112_b2", 3, 64, 8, 112, { 3, 7, 7 },
        { stride = { 1, 2, 2 }, padding = { 1, 3, 3 } }, true)
   conv("conv3d_l1_64_3x3x3_8x56_b2", 64, 64, 8, 56, { 3, 3, 3 }, { padding = 1 })
   conv("conv3d_l2_128_3x3x3_4x28_b2", 128, 128, 4, 28, { 3, 3, 3 }, { padding = 1 })
   conv("conv3d_l2ds_64to128_1x1x1_s2_8x56_b2", 64, 128, 8, 56, { 1, 1, 1 }, { stride = 2 })
   conv("conv3d_l3_256_3x3x3_2x14_b2", 256, 256, 2, 14, { 3, 3, 3 }, { padding = 1 })
   conv("conv3d_l4_512_3x3x3_1x7_b2", 512, 512, 1, 7, { 3, 3, 3 }, { padding = 1 })
   conv("conv3d_r21d_s_64to144_1x3x3_8x56_b2", 64, 144, 8, 56, { 1, 3, 3 },
        { padding = { 0, 1, 1 } })
   conv("conv3d_r21d_t_144to64_3x1x1_8x56_b2", 144, 64, 8, 56, { 3, 1, 1 },
        { padding = { 1, 0, 0 } })

   -- pools and batch norm on the 64x8x56x56 activation (layer1's)
   local x = rnd({ N, 64, 8, 56, 56 })
   local xg = x:clone():requires_grad_(true)
   local function pool(name, f)
      if not wanted(name) then return end
      local g = rnd(f(x):size())
      row(name .. "_fwd", fmt, function() return f(x) end)
      row(name .. "_fwd_bwd", fmt, function()
         xg.grad = nil
         f(xg):backward(g)
      end)
   end
   pool("max_pool3d_3s2p1_64_8x56_b2", function(t)
      return F.max_pool3d(t, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   pool("avg_pool3d_3s2p1_64_8x56_b2", function(t)
      return F.avg_pool3d(t, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   pool("adaptive_avg_pool3d_1_64_8x56_b2", function(t) return F.adaptive_avg_pool3d(t, 1) end)

   if wanted("batch_norm3d_train_64_8x56_b2") or wanted("batch_norm3d_eval_64_8x56_b2") then
      local bn = lm.nn.BatchNorm3d(64)
      bn:train()
      local g = rnd({ N, 64, 8, 56, 56 })
      row("batch_norm3d_train_64_8x56_b2_fwd", fmt, function() return bn(x) end)
      row("batch_norm3d_train_64_8x56_b2_fwd_bwd", fmt, function()
         xg.grad, bn.weight.grad, bn.bias.grad = nil, nil, nil
         bn(xg):backward(g)
      end)
      bn:eval()
      row("batch_norm3d_eval_64_8x56_b2", fmt, function()
         return lm.no_grad(function() return bn(x) end)
      end)
   end
end
