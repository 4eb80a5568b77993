-- bench/models.lua -- whole-model timings: torchvision's resnet50 (lm.models.resnet50) on a
-- batch of 8 224x224 images, channels-last; as the peer's ../shared/peer/bench_models.py times it
-- ("resnet50 8 224 infer|train nhwc ITERS THREADS [bf16]"). Rows:
--   resnet50_infer_b8 nhwc <ms>          inference (eval, no gradients), batch norms as modules
--   resnet50_infer_folded_b8 nhwc <ms>   after lm.nn.fold_batch_norm (lumen only: PyTorch's
--                                        eager mode does not fold; its frozen model does)
-- and with the words "bf16" and/or "train" after the iteration count:
--   resnet50_infer_bf16_b8 nhwc <ms>        inference under lm.autocast({dtype = lm.bfloat16})
--   resnet50_infer_bf16_folded_b8 nhwc <ms> the same after folding the batch norms
--   resnet50_train_b8 nhwc <ms>             one training step, float32: zero_grad, forward,
--                                           cross_entropy, backward, SGD (momentum 0.9)
--   resnet50_train_bf16_b8 nhwc <ms>        the same with forward and loss under bf16 autocast
--                                           (PyTorch's recipe: float32 parameters and gradients)
-- Median of max(3, iters / 4) runs after one warm-up (an inference run takes about 0.25-0.4 s
-- on 2 threads, a training step 1-1.5 s).
-- bench/run.sh runs this file and the peer's model benchmark only with BENCH_MODELS=1;
-- bench/amp.sh runs the bf16 and training rows beside PyTorch 2.x.
-- Usage: bin/lumen bench/models.lua [threads] [iters] [profile] [bf16] [train] [noinfer]
-- With "profile" it then times every convolution of the folded model over three runs, grouped by
-- shape, slowest first: calls per run, ms per run, GFLOP/s (2*N*Ho*Wo*Cout*Cin/groups*kh*kw over
-- the measured time), and "hot": the same call made again at once, its data now in the caches
-- (three more runs), so the cost of cold data in the model shows beside the kernel's own. Then a
-- bound: the float32 GEMM rate measured here (lm.mm of 1024x1024 matrices), and what a run would
-- take with every convolution but Winograd's (the 3x3 stride-1 layers, which do 4x fewer
-- multiply-adds) at that rate, Winograd's layers at their hot time and the rest of the run as
-- measured (the three timed runs' wall time less their convolutions): about how far tuning the
-- present kernels can take the folded model (docs/performance.md, "Figures (session 18)").
-- Those lines do not end in a number, so bench/compare skips them. "noinfer" leaves out the two
-- float32 inference rows.
local lm = require("lumen")
local util = require("lumen.util")
local clock = util.clock

local threads = tonumber(arg and arg[1]) or 2
local iters = math.max(3, math.floor((tonumber(arg and arg[2]) or 20) / 4))
local words = {}
for i = 3, arg and #arg or 0 do words[arg[i]] = true end
local profile, bf16, train = words.profile, words.bf16, words.train
lm.set_num_threads(threads)
lm.manual_seed(0)

local function median_ms(fn) return util.median_ms(fn, iters) end

local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
local AMP = { dtype = lm.bfloat16 }

if train then
   local tgt = lm.randint(1, 1001, { 8 })
   for _, amp in ipairs(bf16 and { false, true } or { false }) do
      lm.manual_seed(0)
      local model = lm.models.resnet50({ num_classes = 1000 })
      model:train()
      lm.to_channels_last(model)
      local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
      local function loss_of() return lm.F.cross_entropy(model(x), tgt) end
      local function step()
         opt:zero_grad(true)
         local loss = amp and lm.autocast(AMP, loss_of) or loss_of()
         loss:backward()
         opt:step()
      end
      step()
      print(string.format("resnet50_train%s_b8 nhwc %.3f", amp and "_bf16" or "",
                          median_ms(step)))
      model, opt = nil, nil
      collectgarbage()
   end
end

local model = lm.models.resnet50({ num_classes = 1000 })
model:eval()
lm.to_channels_last(model)
local function infer() lm.no_grad(function() return model(x) end) end
local function infer_bf16() lm.autocast(AMP, infer) end

if not words.noinfer then
   print(string.format("resnet50_infer_b8 nhwc %.3f", median_ms(infer)))
   collectgarbage()
end
if bf16 then
   print(string.format("resnet50_infer_bf16_b8 nhwc %.3f", median_ms(infer_bf16)))
   collectgarbage()
end
lm.nn.fold_batch_norm(model)
if not words.noinfer then
   print(string.format("resnet50_infer_folded_b8 nhwc %.3f", median_ms(infer)))
   collectgarbage()
end
if bf16 then
   print(string.format("resnet50_infer_bf16_folded_b8 nhwc %.3f", median_ms(infer_bf16)))
end

if profile then
   local F = lm.nn.functional
   local conv2d = F.conv2d
   local stats, order = {}, {}
   local again = false                 -- the second pass: time a repeated call instead
   infer()                             -- a warm-up (with "noinfer" the model has not run yet)
   -- a wrapper around F.conv2d for the timed runs (the blocks call F.conv2d or Conv2d:forward,
   -- which goes through it)
   F.conv2d = function(input, w, b, opts)
      local t0 = clock()
      local y = conv2d(input, w, b, opts)
      local dt = clock() - t0
      if again then
         t0 = clock()
         conv2d(input, w, b, opts):free()
         dt = clock() - t0
      end
      local st = opts and opts.stride or 1
      if type(st) == "table" then st = st[1] end
      local key = string.format("%dx%d %d->%d stride %d, %dx%d input%s", w:size(3), w:size(4),
                                input:size(2), w:size(1), st, input:size(3), input:size(4),
                                opts and opts.residual and ", +residual" or "")
      local e = stats[key]
      if not e then
         e = { n = 0, t = 0, hot = 0, flop = 0, winograd = w:size(3) == 3 and w:size(4) == 3
                                                          and st == 1 }
         stats[key] = e
         order[#order + 1] = key
      end
      if again then
         e.hot = e.hot + dt
      else
         e.n, e.t = e.n + 1, e.t + dt
         e.flop = e.flop + 2 * y:numel() * w:size(2) * w:size(3) * w:size(4)
      end
      return y
   end
   local wall = 0                      -- the first three runs' wall time, convolutions included
   local ok, err = pcall(function()
      local t0 = clock()
      for _ = 1, 3 do infer() end
      wall = clock() - t0
      again = true
      for _ = 1, 3 do infer() end
   end)
   F.conv2d = conv2d
   assert(ok, err)
   -- the GEMM rate: a dense float32 product, a practical ceiling for the convolutions' multiply-
   -- adds (the pointwise kernel reaches it on its best shapes; the FMA peak is ~10 % higher)
   local a, b = lm.randn({ 1024, 1024 }), lm.randn({ 1024, 1024 })
   local gemm_ms = util.median_ms(function() return a:mm(b) end, 15)
   local rate = 2 * 1024 ^ 3 / (gemm_ms * 1e-3)
   table.sort(order, function(p, q) return stats[p].t > stats[q].t end)
   local total, hot, wino_hot, other_flop = 0, 0, 0, 0
   print("   convolutions of the folded model, per run (3 runs; hot: the call made again):")
   for _, key in ipairs(order) do
      local e = stats[key]
      total, hot = total + e.t, hot + e.hot
      if e.winograd then
         wino_hot = wino_hot + e.hot
      else
         other_flop = other_flop + e.flop
      end
      print(string.format("   %-44s %3d calls %8.2f ms %6.0f GFLOP/s, hot %6.2f ms%s", key,
                          e.n / 3, e.t / 3 * 1e3, e.flop / e.t / 1e9, e.hot / 3 * 1e3,
                          e.winograd and " (Winograd)" or ""))
   end
   local run_ms, conv_ms = wall / 3 * 1e3, total / 3 * 1e3
   local rest_ms = run_ms - conv_ms
   print(string.format("   all convolutions: %.1f ms a run (hot %.1f); the run %.1f ms, of which "
                       .. "%.1f ms outside them", conv_ms, hot / 3 * 1e3, run_ms, rest_ms))
   local other_ms = other_flop / 3 / rate * 1e3
   print(string.format("   bound: at the GEMM rate here (%.0f GFLOP/s, lm.mm 1024^3) the "
                       .. "non-Winograd convolutions take %.1f ms; with Winograd's at their hot "
                       .. "%.1f ms and the %.1f ms outside, a run takes %.1f ms (now %.1f ms)",
                       rate / 1e9, other_ms, wino_hot / 3 * 1e3, rest_ms,
                       other_ms + wino_hot / 3 * 1e3 + rest_ms, run_ms))
end
