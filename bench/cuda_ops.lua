-- bench/cuda_ops.lua -- convolution and pooling rows on a CUDA device: a few ResNet-50 layer shapes
-- at batch 64, contiguous (nchw) and channels-last (nhwc), float32 and bfloat16 tensors (not
-- autocast: inputs and weights in the dtype), forward alone and forward + backward (gradients of
-- the input and the weight, the output's gradient all ones). bench/cuda_peer.py ops times the
-- same rows with PyTorch, the same way.
--
--   bin/lumen bench/cuda_ops.lua [ITERS] [BATCH] [FILTER] [DEVICE]
--
-- Each figure: REPS (ITERS, default 5) timed blocks of 10 calls, each block ended by a device
-- synchronisation, after one warm-up block; the median block / 10, in milliseconds. Rows:
--   lumen <op> <fmt> <dtype> <fwd|fwdbwd> <ms>        or   lumen <op> ... error: <message>
-- float32 convolutions run as lm.backends.cudnn.allow_tf32 leaves them (on by default, as
-- PyTorch's torch.backends.cudnn.allow_tf32); lm.backends.cudnn.benchmark is set, as the peer's.
local lm = require("lumen")
local util = require("lumen.util")
local clock = util.clock
local F = lm.F

local REPS = tonumber(arg[1]) or 5
local N = tonumber(arg[2]) or 64
local FILTER = arg[3] ~= "" and arg[3] or nil
local DEVICE = arg[4] or "cuda:0"
local INNER = 10

pcall(function() lm.backends.cudnn.benchmark = true end)

local probe
local function sync()
   if lm.cuda.synchronize then
      lm.cuda.synchronize()
   else
      probe = probe or lm.zeros({ 1 }, { device = DEVICE })
      probe:item()
   end
end

-- name, input {C, H, W}, then either conv {Cout, k, stride, pad} or a pool
local OPS = {
   { "conv7x7_3_64_s2_224", { 3, 224, 224 }, conv = { 64, 7, 2, 3 } },
   { "conv3x3_64_64_56", { 64, 56, 56 }, conv = { 64, 3, 1, 1 } },
   { "conv1x1_256_64_56", { 256, 56, 56 }, conv = { 64, 1, 1, 0 } },
   { "conv3x3_256_256_14", { 256, 14, 14 }, conv = { 256, 3, 1, 1 } },
   { "conv1x1_1024_2048_s2_14", { 1024, 14, 14 }, conv = { 2048, 1, 2, 0 } },
   { "maxpool3x3_s2_64_112", { 64, 112, 112 }, pool = "max" },
   { "adaptive_avgpool_2048_7", { 2048, 7, 7 }, pool = "adaptive_avg" },
}

local function time_ms(fn)
   for _ = 1, INNER do fn() end
   sync()
   local ts = {}
   for r = 1, REPS do
      local t0 = clock()
      for _ = 1, INNER do fn() end
      sync()
      ts[r] = (clock() - t0) / INNER
      collectgarbage()
   end
   table.sort(ts)
   return ts[math.floor(REPS / 2) + 1] * 1e3
end

local function bench(op, fmt, dtname, dt)
   local c, h, w = op[2][1], op[2][2], op[2][3]
   local x = lm.randn({ N, c, h, w }):to(dt):to(DEVICE)
   local wt
   if fmt == "nhwc" then x = x:contiguous(lm.channels_last) end
   local f
   if op.conv then
      local co, k, s, p = op.conv[1], op.conv[2], op.conv[3], op.conv[4]
      wt = (lm.randn({ co, c, k, k }) * 0.05):to(dt):to(DEVICE)
      if fmt == "nhwc" then wt = wt:contiguous(lm.channels_last) end
      f = function(xx, ww) return F.conv2d(xx, ww, nil, { stride = s, padding = p }) end
   elseif op.pool == "max" then
      f = function(xx) return F.max_pool2d(xx, { kernel_size = 3, stride = 2, padding = 1 }) end
   else
      f = function(xx) return F.adaptive_avg_pool2d(xx, { 1, 1 }) end
   end
   local fwd_ms = time_ms(function() lm.no_grad(function() return f(x, wt) end) end)
   print(string.format("lumen %s %s %s fwd %.4f", op[1], fmt, dtname, fwd_ms))
   x.requires_grad = true
   if wt then wt.requires_grad = true end
   local g = lm.ones_like(f(x, wt):detach())
   local bwd_ms = time_ms(function()
      x.grad = nil
      if wt then wt.grad = nil end
      f(x, wt):backward(g)
   end)
   print(string.format("lumen %s %s %s fwdbwd %.4f", op[1], fmt, dtname, bwd_ms))
end

for _, op in ipairs(OPS) do
   for _, dtname in ipairs({ "fp32", "bf16" }) do
      for _, fmt in ipairs({ "nchw", "nhwc" }) do
         local name = string.format("%s %s %s", op[1], fmt, dtname)
         if not FILTER or name:find(FILTER, 1, true) then
            local dt = dtname == "bf16" and lm.bfloat16 or lm.float32
            local ok, err = pcall(bench, op, fmt, dtname, dt)
            if not ok then
               print(string.format("lumen %s error: %s", name, tostring(err):gsub("\n", " | ")))
            end
            io.stdout:flush()
            collectgarbage()
         end
      end
   end
end
