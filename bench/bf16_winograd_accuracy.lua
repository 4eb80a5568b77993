-- bench/bf16_winograd_accuracy.lua -- how far bfloat16 Winograd (lm.backends.cpu.bf16_winograd)
-- moves ResNet50's 3x3 stride-1 layers from the exact result, against the direct kernels.
--
--   bin/lumen bench/bf16_winograd_accuracy.lua
--
-- For each layer (batch 8, channels-last, bfloat16 input and weights of unit variance / fan-in):
-- the relative error in 2-norm, sqrt(sum (got - exact)^2 / sum exact^2), of the output, the
-- gradient of the input and the gradient of the weights, the exact values computed in float64
-- from the same bfloat16 inputs; once with the switch off (the direct kernels: only the output's
-- rounding to bfloat16), once on. docs/mixed_precision.md quotes the figures.
local lm = require("lumen")
local F = lm.F

local function rel(got, ref)
   local e = got:double() - ref
   return math.sqrt((e * e):sum():item() / (ref * ref):sum():item())
end

print(("%-24s %-6s %10s %10s %10s"):format("layer", "path", "output", "grad in", "grad w"))
for _, s in ipairs({ { 64, 56 }, { 128, 28 }, { 256, 14 }, { 512, 7 } }) do
   local C, H = s[1], s[2]
   lm.manual_seed(3)
   local x = lm.randn({ 8, C, H, H }):contiguous(lm.channels_last):bfloat16()
   local w = (lm.randn({ C, C, 3, 3 }) / math.sqrt(9 * C)):contiguous(lm.channels_last)
      :bfloat16()
   local g = lm.randn({ 8, C, H, H }):contiguous(lm.channels_last):bfloat16()
   local xr = x:double():requires_grad_(true)
   local wr = w:double():requires_grad_(true)
   local yr = F.conv2d(xr, wr, nil, { padding = 1 })
   yr:backward(g:double())
   for _, on in ipairs({ false, true }) do
      lm.backends.cpu.bf16_winograd = on
      local xg = x:clone():requires_grad_(true)
      local wg = w:clone():requires_grad_(true)
      local y = F.conv2d(xg, wg, nil, { padding = 1 })
      y:backward(g)
      print(("%-24s %-6s %10.2e %10.2e %10.2e"):format(("3x3 %d->%d at %dx%d"):format(C, C, H, H),
         on and "wino" or "direct", rel(y, yr:detach()), rel(xg.grad, xr.grad),
         rel(wg.grad, wr.grad)))
   end
end
lm.backends.cpu.bf16_winograd = true
