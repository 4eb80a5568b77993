-- bench/act_models.lua -- inference of the models whose convolutions end in SiLU, Hardswish or
-- ReLU6 (efficientnet_b0, mobilenet_v3_large, mobilenet_v2) on a batch of 8 224x224 images,
-- channels-last, evaluation with gradients off, float32: the cost of the activations that the
-- convolution epilogue now runs (F.conv2d's act option; docs/performance.md, "Activations in
-- the convolution epilogue"). Rows (median of max(3, iters / 4) runs after one warm-up):
--   <model>_infer_b8 nhwc <ms>          the model as built (batch norms folded per call)
--   <model>_infer_folded_b8 nhwc <ms>   after lm.nn.fold_batch_norm
--   <model>_infer_frozen_b8 nhwc <ms>   lm.jit.freeze(lm.jit.trace(model, x))
-- Runs from any lumen tree that has these models (an older one prints the same rows with its
-- unfused activations): cd OLD_TREE && bin/lumen NEW_TREE/bench/act_models.lua 2 12.
-- With the word "paired" (this tree only): the folded model with the activations fused against
-- the same model with every activation module watched (its forward replaced on the instance, so
-- nothing is fused: the activations run as their own ops, as before), alternating in one
-- process, `iters` rounds of 3 runs each; the rows give the medians of each side and of the
-- per-round ratio unfused / fused, robust to the shared machine's drift:
--   <model>_paired fused <ms> unfused <ms> ratio <r>
-- Usage: bin/lumen bench/act_models.lua [threads] [iters] [paired] [model ...]
local lm = require("lumen")
local util = require("lumen.util")

local threads = tonumber(arg and arg[1]) or 2
local iters = math.max(3, math.floor((tonumber(arg and arg[2]) or 12) / 4))
local names = {}
local paired = false
for i = 3, arg and #arg or 0 do
   if arg[i] == "paired" then paired = true else names[#names + 1] = arg[i] end
end
if #names == 0 then names = { "efficientnet_b0", "mobilenet_v3_large", "mobilenet_v2" } end
lm.set_num_threads(threads)

local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)

local function row(name, ms) io.write(("%s nhwc %.2f\n"):format(name, ms)); io.flush() end

local ACT = { ReLU = true, ReLU6 = true, SiLU = true, Hardswish = true, Hardsigmoid = true,
              Sigmoid = true, GELU = true }
local function watch(model, on)
   for _, m in ipairs(model:modules()) do
      if ACT[m:type_name()] then
         rawset(m, "forward", on and function(self, t)
            return getmetatable(self).forward(self, t)
         end or nil)
      end
   end
end

if paired then
   for _, name in ipairs(names) do
      lm.manual_seed(0)
      local model = lm.models[name]()
      lm.to_channels_last(model)
      model:eval()
      lm.nn.fold_batch_norm(model)
      local function run() lm.no_grad(function() return model(x) end) end
      local fused, unfused, ratio = {}, {}, {}
      for r = 1, math.max(3, iters) do
         watch(model, false)
         fused[r] = util.median_ms(run, 3)
         watch(model, true)
         unfused[r] = util.median_ms(run, 3)
         ratio[r] = unfused[r] / fused[r]
      end
      watch(model, false)
      local function med(t)
         table.sort(t)
         return t[math.floor(#t / 2) + 1]
      end
      io.write(("%s_paired fused %.2f unfused %.2f ratio %.3f\n"):format(name, med(fused),
               med(unfused), med(ratio)))
      io.flush()
   end
   return
end

for _, name in ipairs(names) do
   lm.manual_seed(0)
   local model = lm.models[name]()
   lm.to_channels_last(model)
   model:eval()
   local function run() lm.no_grad(function() return model(x) end) end
   row(name .. "_infer_b8", util.median_ms(run, iters))
   local g = lm.jit.freeze(lm.jit.trace(model, x))
   row(name .. "_infer_frozen_b8",
       util.median_ms(function() lm.no_grad(function() return g(x) end) end, iters))
   g = nil
   lm.nn.fold_batch_norm(model)
   row(name .. "_infer_folded_b8", util.median_ms(run, iters))
   model = nil
   collectgarbage()
end
