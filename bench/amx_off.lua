-- bench/amx_off.lua -- resnet50 batch 8 channels-last inference in float32 and under bf16 autocast
-- with lm.backends.cpu.amx = false, alternated in one process (3 rounds of 2-call medians): is
-- bfloat16 without AMX slower than float32 on this CPU? (docs/performance.md, AMX)
-- Usage: bin/lumen bench/amx_off.lua   (LUMEN_BF16_DOT=1 forces the vdpbf16ps kernels)
local lm = require("lumen")
local util = require("lumen.util")
lm.set_num_threads(2)
lm.backends.cpu.amx = false
local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
local model = lm.models.resnet50({ num_classes = 1000 }); model:eval(); lm.to_channels_last(model)
local function f32() lm.no_grad(function() return model(x) end) end
local function bf() lm.autocast({dtype = lm.bfloat16}, f32) end
f32(); bf()
for r = 1, 3 do
  print("float32", util.median_ms(f32, 2), "bf16 (amx off)", util.median_ms(bf, 2))
end
