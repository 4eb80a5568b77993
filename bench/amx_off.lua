-- bench/amx_off.lua -- float32 against bf16 autocast with lm.backends.cpu.amx = false, alternated
-- in one process: is bfloat16 without AMX slower than float32 on this CPU? (docs/performance.md,
-- AMX; issue 35: "--amp bf16 is never slower than float32" with AMX off)
--   infer: resnet50 batch 8 channels-last, evaluation under lm.no_grad
--   train: one training step as examples/train.lua runs it (autocast around the forward and the
--          loss, backward and SGD outside it): small_resnet (the main job's model, batch 128 of
--          28x28, 10 classes) or resnet50 (batch 8 of 224x224)
-- Usage: bin/lumen bench/amx_off.lua [rounds=3] [calls=2] [infer|train] [model]
--   (LUMEN_BF16_DOT=1 forces the vdpbf16ps kernels). Each round: float32 then bf16, each the
--   median of `calls` calls; the last line gives the median over the rounds of bf16 / float32
--   (the host's speed moves between rounds, the ratio within one round much less).
local lm = require("lumen")
local util = require("lumen.util")
lm.set_num_threads(2)
lm.backends.cpu.amx = false
local rounds, calls = tonumber(arg[1]) or 3, tonumber(arg[2]) or 2
local mode = arg[3] or "infer"
local name = arg[4] or (mode == "train" and "small_resnet" or "resnet50")
if mode ~= "infer" and mode ~= "train" then
   error("bench/amx_off.lua: mode must be infer or train, got " .. tostring(mode), 0)
end
lm.manual_seed(0)
local model, x, tgt
if name == "small_resnet" then
   model = lm.models.small_resnet({ num_classes = 10 })
   x = lm.randn({ 128, 1, 28, 28 }):contiguous(lm.channels_last)
   tgt = lm.randint(1, 11, { 128 }) -- 1-based class indices
else
   model = lm.models[name]({ num_classes = 1000 })
   x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
   tgt = lm.randint(1, 1001, { 8 })
end
lm.to_channels_last(model)
local f32, bf
if mode == "infer" then
   model:eval()
   f32 = function() lm.no_grad(function() return model(x) end) end
   bf = function() lm.autocast({ dtype = lm.bfloat16 }, f32) end
else
   model:train()
   local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
   local function step(amp)
      opt:zero_grad(true)
      local loss
      if amp then
         loss = lm.autocast({ dtype = lm.bfloat16 }, function()
            return lm.F.cross_entropy(model(x), tgt)
         end)
      else
         loss = lm.F.cross_entropy(model(x), tgt)
      end
      loss:backward()
      opt:step()
   end
   f32 = function() step(false) end
   bf = function() step(true) end
end
f32(); bf()
local ratios = {}
for r = 1, rounds do
   local a, b = util.median_ms(f32, calls), util.median_ms(bf, calls)
   ratios[r] = b / a
   print(("%s %s: float32 %.1f ms, bf16 (amx off) %.1f ms"):format(name, mode, a, b))
end
table.sort(ratios)
print(("median bf16 / float32 over %d rounds: %.3f (%.3f - %.3f)"):format(rounds,
      ratios[math.floor((rounds + 1) / 2)], ratios[1], ratios[rounds]))
