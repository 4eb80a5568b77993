-- bench/models.lua -- whole-model inference: torchvision's resnet50 (lm.models.resnet50) on a
-- batch of 8 224x224 images, channels-last, evaluation mode, no gradients; as the peer's
-- ../shared/peer/bench_models.py times it ("resnet50 8 224 infer nhwc"). Rows:
--   resnet50_infer_b8 nhwc <ms>          the model as built (batch norms run as modules)
--   resnet50_infer_folded_b8 nhwc <ms>   after lm.nn.fold_batch_norm (lumen only: PyTorch's
--                                        eager mode does not fold)
-- Median of max(3, iters / 4) runs after one warm-up (a run takes about 0.25 s on 2 threads).
-- bench/run.sh runs this file and the peer's model benchmark only with BENCH_MODELS=1.
-- Usage: bin/lumen bench/models.lua [threads] [iters]
local lm = require("lumen")
local clock = require("lumen.util").clock

local threads = tonumber(arg and arg[1]) or 2
local iters = math.max(3, math.floor((tonumber(arg and arg[2]) or 20) / 4))
lm.set_num_threads(threads)
lm.manual_seed(0)

local function median_ms(fn)
   fn()
   local ts = {}
   for i = 1, iters do
      local t0 = clock()
      fn()
      ts[i] = clock() - t0
   end
   table.sort(ts)
   return ts[math.floor(iters / 2) + 1] * 1e3
end

local model = lm.models.resnet50({ num_classes = 1000 })
model:eval()
lm.to_channels_last(model)
local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
local function infer() lm.no_grad(function() return model(x) end) end

print(string.format("resnet50_infer_b8 nhwc %.3f", median_ms(infer)))
collectgarbage()
lm.nn.fold_batch_norm(model)
print(string.format("resnet50_infer_folded_b8 nhwc %.3f", median_ms(infer)))
