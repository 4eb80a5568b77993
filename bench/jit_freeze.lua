-- bench/jit_freeze.lua -- a frozen lm.jit graph against the eager model folded with
-- lm.nn.fold_batch_norm (the fastest eager inference, docs/inference.md), in the same run:
-- channels-last, evaluation mode, no gradients.
--   bin/lumen bench/jit_freeze.lua [model=resnet50] [batch=4] [size=224] [iters=5] [rounds=3]
--     [threads=2]
-- Each round times `iters` forwards of each, alternating which goes first; prints the median
-- milliseconds per forward of each and the ratio eager/frozen (> 1: the frozen graph is faster).
local lm = require("lumen")

local name = arg[1] or "resnet50"
local batch = tonumber(arg[2]) or 4
local size = tonumber(arg[3]) or 224
local iters = tonumber(arg[4]) or 5
local rounds = tonumber(arg[5]) or 3
lm.set_num_threads(tonumber(arg[6]) or 2)

lm.manual_seed(0)
local model = lm.models[name]({ num_classes = 1000 }):eval()
lm.to_channels_last(model)
local x = lm.randn({ batch, 3, size, size }):contiguous(lm.channels_last)

local frozen = lm.jit.freeze(lm.jit.trace(model, x))
lm.nn.fold_batch_norm(model)

local function now()
   local ffi = require("ffi")
   pcall(ffi.cdef, "struct jb_timespec { long tv_sec; long tv_nsec; };" ..
                   "int clock_gettime(int, struct jb_timespec *);")
   local ts = ffi.new("struct jb_timespec")
   ffi.C.clock_gettime(1, ts)
   return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function time(f)
   return lm.no_grad(function()
      f(x)                                  -- warm-up
      local t0 = now()
      for _ = 1, iters do f(x) end
      return (now() - t0) / iters * 1000
   end)
end

local d = lm.no_grad(function() return (frozen(x) - model(x)):abs():max():item() end)
local te, tf = {}, {}
for r = 1, rounds do
   if r % 2 == 1 then
      te[r] = time(model)
      tf[r] = time(frozen)
   else
      tf[r] = time(frozen)
      te[r] = time(model)
   end
end
local function median(t)
   local c = {}
   for i, v in ipairs(t) do c[i] = v end
   table.sort(c)
   return c[math.floor((#c + 1) / 2)]
end
print(("%s batch %d %dx%d NHWC, %d threads, %d rounds x %d iters"):format(name, batch, size,
   size, lm.get_num_threads(), rounds, iters))
print(("eager fold_batch_norm  %8.1f ms/forward"):format(median(te)))
print(("lm.jit.freeze          %8.1f ms/forward"):format(median(tf)))
print(("ratio eager/frozen     %8.3f   (max |difference| %.3g)"):format(median(te) / median(tf), d))
