-- bench/video_models.lua -- torchvision's r3d_18 (lm.models.r3d_18, 1000 classes) on a batch of
-- BATCH clips of 3x8x112x112, float32, channels_last_3d (ndhwc: model converted with
-- lm.to_channels_last, input channels_last_3d) and NCDHW (contiguous model and input); as the
-- peer's ../shared/peer/bench_models.py times it ("r3d_18 BATCH 112 infer|train nhwc|nchw ITERS
-- THREADS"). Rows '<row> <fmt> <ms per batch>':
--   r3d_18_infer_b<B> ndhwc|ncdhw   inference (eval, no gradients)
--   r3d_18_train_b<B> ndhwc|ncdhw   one training step: zero_grad, forward, cross_entropy,
--                                   backward, SGD (lr 0.01, momentum 0.9)
-- each the median of ITERS runs after two warm-ups (bench_models.py's measure); clips/s =
-- 1000 * BATCH / ms. bench/video.sh runs it beside the peer.
-- Until lm.models.r3d_18 exists it prints one line saying the rows are skipped (a line that does
-- not end in a number, so bench/compare ignores it) and exits 0.
-- Usage: bin/lumen bench/video_models.lua [threads] [iters] [batch] [infer] [train] [ndhwc] [ncdhw]
-- (no words: both modes, both formats)
local lm = require("lumen")
local util = require("lumen.util")

local threads = tonumber(arg and arg[1]) or 2
local iters = tonumber(arg and arg[2]) or 3
local B = tonumber(arg and arg[3]) or 2
local words = {}
for i = 4, arg and #arg or 0 do words[arg[i]] = true end
local modes = {}
if words.infer or not words.train then modes[#modes + 1] = "infer" end
if words.train or not words.infer then modes[#modes + 1] = "train" end
local fmts = {}
if words.ndhwc or not words.ncdhw then fmts[#fmts + 1] = "ndhwc" end
if words.ncdhw or not words.ndhwc then fmts[#fmts + 1] = "ncdhw" end
lm.set_num_threads(threads)

if not (lm.models and lm.models.r3d_18) then
   print("r3d_18 rows skipped: lm.models.r3d_18 does not exist in this build yet")
   return
end

local function median_ms(fn)
   fn() -- the second warm-up (util.median_ms makes the first)
   return util.median_ms(fn, iters)
end

for _, mode in ipairs(modes) do
   for _, fmt in ipairs(fmts) do
      lm.manual_seed(0)
      local model = lm.models.r3d_18({ num_classes = 1000 })
      local x = lm.randn({ B, 3, 8, 112, 112 })
      if fmt == "ndhwc" then
         lm.to_channels_last(model)
         x = x:contiguous(lm.channels_last_3d)
      end
      local ms
      if mode == "train" then
         model:train()
         local tgt = lm.randint(1, 1001, { B })   -- 1-based classes
         local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
         ms = median_ms(function()
            opt:zero_grad(true)
            lm.F.cross_entropy(model(x), tgt):backward()
            opt:step()
         end)
      else
         model:eval()
         ms = median_ms(function() lm.no_grad(function() return model(x) end) end)
      end
      print(string.format("r3d_18_%s_b%d %s %.3f", mode, B, fmt, ms))
      model = nil
      collectgarbage()
   end
end
