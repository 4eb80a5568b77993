-- bench/amx_off.lua -- resnet50 batch 8 channels-last inference in float32 and under bf16 autocast
-- with lm.backends.cpu.amx = false, alternated in one process (3 rounds of 2-call medians): is
-- bfloat16 without AMX slower than float32 on this CPU? (docs/performance.md, AMX)
-- Usage: bin/lumen bench/amx_off.lua [rounds=3] [calls=2]   (LUMEN_BF16_DOT=1 forces the
-- vdpbf16ps kernels). Each round: float32 then bf16, each the median of `calls` calls; the last
-- line gives the median over the rounds of bf16 / float32 (the host's speed moves between
-- rounds, the ratio within one round much less).
local lm = require("lumen")
local util = require("lumen.util")
lm.set_num_threads(2)
lm.backends.cpu.amx = false
local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
local model = lm.models.resnet50({ num_classes = 1000 }); model:eval(); lm.to_channels_last(model)
local function f32() lm.no_grad(function() return model(x) end) end
local function bf() lm.autocast({dtype = lm.bfloat16}, f32) end
f32(); bf()
local rounds, calls = tonumber(arg[1]) or 3, tonumber(arg[2]) or 2
local ratios = {}
for r = 1, rounds do
  local a, b = util.median_ms(f32, calls), util.median_ms(bf, calls)
  ratios[r] = b / a
  print("float32", a, "bf16 (amx off)", b)
end
table.sort(ratios)
print(("median bf16 / float32 over %d rounds: %.3f (%.3f - %.3f)"):format(rounds,
      ratios[math.floor((rounds + 1) / 2)], ratios[1], ratios[rounds]))
