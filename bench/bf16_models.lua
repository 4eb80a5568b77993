-- bench/bf16_models.lua -- one torchvision model under bfloat16 autocast, channels-last, as the
-- peer's ../shared/peer/bench_models.py times it with its "bf16" variant
-- (`bench_models.py MODEL BATCH RES infer|train nhwc ITERS THREADS bf16`): inference (eval, no
-- gradients) or one training step (zero_grad, forward and cross_entropy under autocast,
-- backward, SGD with momentum 0.9; float32 parameters). Video models (r3d_18) take RES x RES
-- clips of 8 frames in channels_last_3d, as the peer's.
-- Prints '<model>_<mode>_bf16_b<batch> nhwc <median ms>' (median of max(3, iters) runs after
-- two warm-ups) and the images (clips) a second.
-- Usage: bin/lumen bench/bf16_models.lua MODEL BATCH RES infer|train [iters] [threads]
-- e.g.   bin/lumen bench/bf16_models.lua resnet50 32 224 infer 5
local lm = require("lumen")
local util = require("lumen.util")

local name, B, res, mode = arg[1] or "resnet50", tonumber(arg[2]) or 8, tonumber(arg[3]) or 224,
   arg[4] or "infer"
local iters = math.max(3, tonumber(arg[5]) or 5)
lm.set_num_threads(tonumber(arg[6]) or 2)
lm.manual_seed(0)
local ctor = lm.models[name]
if not ctor then error("bench/bf16_models.lua: no model lm.models." .. tostring(name), 0) end
local video = name == "r3d_18" or name == "mc3_18" or name == "r2plus1d_18"
local x = video and lm.randn({ B, 3, 8, res, res }):contiguous(lm.channels_last_3d)
   or lm.randn({ B, 3, res, res }):contiguous(lm.channels_last)
local model = ctor({ num_classes = 1000 })
lm.to_channels_last(model)
local AMP = { dtype = lm.bfloat16 }
local run
if mode == "train" then
   local tgt = lm.randint(1, 1001, { B })
   model:train()
   local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
   local function loss() return lm.F.cross_entropy(model(x), tgt) end
   run = function()
      opt:zero_grad(true)
      lm.autocast(AMP, loss):backward()
      opt:step()
   end
else
   model:eval()
   run = function() lm.autocast(AMP, function() lm.no_grad(function() return model(x) end) end) end
end
run()
run()
local ms = util.median_ms(run, iters)
print(("%s_%s_bf16_b%d nhwc %.3f"):format(name, mode, B, ms))
print(("img/s %.2f"):format(B * 1000 / ms))
