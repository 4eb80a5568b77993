-- bench/families.lua -- one torchvision model family member (mobilenet_v2, mobilenet_v3_large,
-- efficientnet_b0, convnext_tiny, regnet_y_400mf, shufflenet_v2_x1_0, ...) in float32,
-- channels-last, as the peer's ../shared/peer/bench_models.py times it in PyTorch 2.x eager mode
-- (`bench_models.py MODEL BATCH RES infer|train nhwc ITERS THREADS`): the same model with
-- torchvision's default options (dropout and stochastic depth as torchvision sets them, active in
-- training only, on both sides), lm.to_channels_last on the model and a channels-last input.
--   infer: evaluation mode under lm.no_grad, two rows from one process:
--          <model>_infer_b<B> nhwc <ms>         the model as built, batch norms as modules
--          <model>_infer_folded_b<B> nhwc <ms>  after lm.nn.fold_batch_norm (what a lumen user
--                                               deploys, docs/inference.md; PyTorch's eager
--                                               mode does not fold). Left out when the model
--                                               has no batch norm to fold (convnext_tiny).
--   train: one training step, as the peer's: zero_grad (to none), forward, cross_entropy against
--          random targets, backward, SGD step (lr 0.01, momentum 0.9):
--          <model>_train_b<B> nhwc <ms>
-- Each row: the median of ITERS timed runs after two warm-ups (the peer's count). A first line
-- starting with '#' gives what was built (parameters, dropout, stochastic depth, batch norms
-- folded), to check against torchvision's; it does not end in a number, so bench/compare skips
-- it. bench/families.sh runs this beside the peer, alternating.
-- Usage: bin/lumen bench/families.lua MODEL [batch=8] [res=224] [infer|train] [iters=5]
--          [threads=2]
-- e.g.   bin/lumen bench/families.lua efficientnet_b0 8 224 train 5 2
local lm = require("lumen")
local util = require("lumen.util")

local name = arg[1] or "mobilenet_v2"
local B, res, mode = tonumber(arg[2]) or 8, tonumber(arg[3]) or 224, arg[4] or "infer"
local iters = math.max(1, tonumber(arg[5]) or 5)
lm.set_num_threads(tonumber(arg[6]) or 2)
if mode ~= "infer" and mode ~= "train" then
   error("bench/families.lua: mode must be infer or train, got " .. tostring(mode), 0)
end
local ctor = lm.models[name]
if type(ctor) ~= "function" then
   error("bench/families.lua: no model lm.models." .. tostring(name), 0)
end

lm.manual_seed(0)
local model = ctor({ num_classes = 1000 })   -- torchvision's defaults for everything else
lm.to_channels_last(model)
local x = lm.randn({ B, 3, res, res }):contiguous(lm.channels_last)

-- what was built: parameters, dropout and stochastic-depth probabilities, batch norms
local nparam, drop, sd_max, sd_n, nbn = 0, {}, 0, 0, 0
for _, p in ipairs(model:parameters()) do nparam = nparam + p:numel() end
for _, m in ipairs(model:modules()) do
   local ty = m:type_name()
   if ty == "Dropout" then
      drop[#drop + 1] = tostring(m.p)
   elseif ty == "StochasticDepth" then
      sd_n, sd_max = sd_n + 1, math.max(sd_max, m.p)
   elseif ty == "BatchNorm2d" then
      nbn = nbn + 1
   end
end

local function row(tag, fn)
   fn()                                 -- warm-up; util.median_ms makes the second
   print(("%s_%s_b%d nhwc %.3f"):format(name, tag, B, util.median_ms(fn, iters)))
   io.stdout:flush()
end

if mode == "train" then
   local tgt = lm.randint(1, 1001, { B }) -- 1-based class indices
   model:train()
   local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
   local function step()
      opt:zero_grad(true)
      lm.F.cross_entropy(model(x), tgt):backward()
      opt:step()
   end
   print(("# %s train: %d parameters, dropout {%s}, stochastic depth in %d blocks up to p %.4f, "
          .. "%d batch norms in training mode"):format(name, nparam, table.concat(drop, ", "),
                                                        sd_n, sd_max, nbn))
   row("train", step)
else
   model:eval()
   local function infer() lm.no_grad(function() return model(x) end) end
   print(("# %s infer (eval, no_grad): %d parameters, dropout {%s} and stochastic depth in %d "
          .. "blocks (inactive), %d batch norms"):format(name, nparam, table.concat(drop, ", "),
                                                         sd_n, nbn))
   row("infer", infer)
   if nbn > 0 then
      collectgarbage()
      local _, n = lm.nn.fold_batch_norm(model)
      print(("# %s: lm.nn.fold_batch_norm folded %d of %d batch norms"):format(name, n, nbn))
      row("infer_folded", infer)
   end
end
