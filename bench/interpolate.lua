-- bench/interpolate.lua -- F.interpolate (scale_factor 2, channels-last) forward and forward +
-- backward, as bench/peer_interpolate.py times PyTorch's: medians of 5 forwards (under no_grad)
-- and 3 forward + backward steps, ms, 2 threads.
--   bin/lumen bench/interpolate.lua [N C H ...]   (default: 8 64 32, 8 64 128, 2 32 256)
local lm = require("lumen")
local util = require("lumen.util")
lm.set_num_threads(2)
local shapes = {}
for i = 1, #arg, 3 do
   shapes[#shapes + 1] = { tonumber(arg[i]), tonumber(arg[i + 1]), tonumber(arg[i + 2]) }
end
if #shapes == 0 then shapes = { { 8, 64, 32 }, { 8, 64, 128 }, { 2, 32, 256 } } end
for _, sh in ipairs(shapes) do
   local N, C, H = sh[1], sh[2], sh[3]
   local x = lm.randn({ N, C, H, H }):contiguous(lm.channels_last):requires_grad_(true)
   local g = lm.randn({ N, C, 2 * H, 2 * H }):contiguous(lm.channels_last)
   for _, mode in ipairs({ "nearest", "bilinear" }) do
      local o = { scale_factor = 2, mode = mode }
      local f = function() return lm.no_grad(function() return lm.F.interpolate(x, o) end) end
      local fb = function() x.grad = nil; lm.F.interpolate(x, o):backward(g) end
      print(("%dx%dx%d %-8s lumen fwd %.2f fwd+bwd %.2f ms"):format(N, C, H, mode,
            util.median_ms(f, 5), util.median_ms(fb, 3)))
   end
end
