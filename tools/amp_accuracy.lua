-- tools/amp_accuracy.lua -- lumen's bf16-autocast ResNet50 logits against PyTorch's, with the
-- weights and input tools/amp_accuracy.py writes (bench/amp_accuracy.sh runs both).
--   bin/lumen tools/amp_accuracy.lua [DIR]       (default /tmp/lumen-amp-acc)
-- Errors are against PyTorch's float64 logits: max |a - b| / max |b|, and ||a - b|| / ||b||.
-- The acceptance (issue 17): lumen's bf16 error within 2x PyTorch's own bf16 error.
local lm = require("lumen")
local S = require("lumen.serialize")

local dir = arg and arg[1] or "/tmp/lumen-amp-acc"
lm.set_num_threads(2)

local function errs(a, b)
   local ad, bd = a:double(), b:double()
   local d = ad - bd
   local mx = d:abs():max():item() / bd:abs():max():item()
   local nm = math.sqrt((d * d):sum():item() / (bd * bd):sum():item())
   return mx, nm
end

local W = S.load(dir .. "/resnet50_amp.weights.safetensors")
local ref = S.load(dir .. "/resnet50_amp.ref.safetensors")
local model = lm.models.resnet50()
model:load_state_dict(W)
model:eval()
lm.to_channels_last(model)
local x = ref.input:to(lm.channels_last)
local function run() return lm.no_grad(function() return model(x) end) end
local AMP = { dtype = lm.bfloat16 }

local rows = {}
local function report(what, logits)
   local mx, nm = errs(logits:float(), ref.logits_f64)
   rows[what] = { mx, nm }
   print(string.format("%-36s vs float64: max %.3e, norm %.3e", what, mx, nm))
end
report("PyTorch float32", ref.logits_f32)
report("PyTorch bf16 autocast", ref.logits_bf16)
report("lumen float32", run())
report("lumen bf16 autocast", lm.autocast(AMP, run))
lm.nn.fold_batch_norm(model)
report("lumen bf16 autocast, folded", lm.autocast(AMP, run))
local p = rows["PyTorch bf16 autocast"]
for _, k in ipairs({ "lumen bf16 autocast", "lumen bf16 autocast, folded" }) do
   local r = rows[k]
   print(string.format("%s / PyTorch bf16: max %.2f, norm %.2f (acceptance: <= 2)", k,
                       r[1] / p[1], r[2] / p[2]))
end
