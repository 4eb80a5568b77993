-- bench/cuda_models.lua -- whole-model images/s on a CUDA device, one configuration per run, timed
-- as the peer (bench/peer_models.py, variants cuda and cuda_amp) times PyTorch: two warm-up steps,
-- then `iters` steps each followed by a device synchronisation, images/s = batch / median step.
--
--   bin/lumen bench/cuda_models.lua MODE FMT BATCH PREC [ITERS] [BUDGET_S] [RES] [MODEL] [DEVICE]
--                                   [GRAPH]
--     MODE     infer | train
--     FMT      nhwc (model and input channels-last) | nchw (contiguous)
--     BATCH    images per step
--     PREC     amp (lm.autocast({device = "cuda", dtype = lm.bfloat16}): float32 parameters and
--              gradients, as torch.autocast("cuda", dtype=torch.bfloat16)) | fp32
--     ITERS    timed steps (default 10); fewer when BUDGET_S (default 20) seconds of timed steps
--              run out first, but at least 3
--     RES      image side (default 224); MODEL: an lm.models constructor (default resnet50);
--     DEVICE   default cuda:0 (tools/gpu_check.sh tests this file's logic on the emulated device)
--     GRAPH    eager (default) | graph: the step captured once in a CUDA graph (lm.cuda.graph,
--              after three eager warm-up steps) and each timed step one replay; the tag says
--              "graph" (issue 38's acceptance row: lumen's graph beside PyTorch eager)
-- Training step: zero_grad, forward and cross_entropy (under autocast for amp), backward, SGD with
-- momentum 0.9 (the peer's). Inference: eval mode, lm.no_grad, under autocast for amp.
-- Prints one line: "lumen <model> <mode> <fmt> b<batch> <prec> img/s <N> (<k> steps, median
-- <ms> ms, first step <ms> ms)", or "lumen ... error: <message>" and exits 1.
local lm = require("lumen")
local util = require("lumen.util")
local clock = util.clock

local MODE, FMT = arg[1] or "train", arg[2] or "nhwc"
local BATCH = tonumber(arg[3]) or 64
local PREC = arg[4] or "amp"
local ITERS = tonumber(arg[5]) or 10
local BUDGET = tonumber(arg[6]) or 20
local RES = tonumber(arg[7]) or 224
local MODEL = arg[8] or "resnet50"
local DEVICE = arg[9] or "cuda:0"
local GRAPH = (arg[10] or "eager") == "graph"
local tag = string.format("lumen %s %s %s b%d %s%s", MODEL, MODE, FMT, BATCH, PREC,
                          GRAPH and " graph" or "")
assert(arg[10] == nil or arg[10] == "eager" or arg[10] == "graph", "GRAPH is eager or graph")

assert(MODE == "infer" or MODE == "train", "MODE is infer or train")
assert(FMT == "nhwc" or FMT == "nchw", "FMT is nhwc or nchw")
assert(PREC == "amp" or PREC == "fp32", "PREC is amp or fp32")

-- the cuDNN switches as the peer sets them (torch.backends.cudnn.benchmark = True); lm.backends
-- may not exist in this build yet
pcall(function() lm.backends.cudnn.benchmark = true end)

-- lm.cuda.synchronize() waits for the device's queued work; without it, a copy to the host of one
-- element does the same (lumen's device-to-host copies wait for the device's one stream)
local probe
local function sync()
   if lm.cuda.synchronize then
      lm.cuda.synchronize()
   else
      probe = probe or lm.zeros({ 1 }, { device = DEVICE })
      probe:item()
   end
end

local function run()
   lm.manual_seed(0)
   local model = lm.models[MODEL]({ num_classes = 1000 })
   model:to(DEVICE)
   local x = lm.randn({ BATCH, 3, RES, RES }):to(DEVICE)
   if FMT == "nhwc" then
      lm.to_channels_last(model)
      x = x:contiguous(lm.channels_last)
   end
   local AMP = { device = "cuda", dtype = lm.bfloat16 }
   local step, tgt, opt
   if MODE == "train" then
      model:train()
      tgt = lm.randint(1, 1001, { BATCH }):to(DEVICE) -- 1-based classes
      opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
      local function loss_of() return lm.F.cross_entropy(model(x), tgt) end
      step = function()
         opt:zero_grad(true)
         local loss = PREC == "amp" and lm.autocast(AMP, loss_of) or loss_of()
         loss:backward()
         opt:step()
      end
   else
      model:eval()
      local function fwd() return model(x) end
      step = function()
         lm.no_grad(function()
            if PREC == "amp" then return lm.autocast(AMP, fwd) end
            return fwd()
         end)
      end
   end
   if GRAPH then
      -- warm-up (optimizer state, cuDNN's choices, the allocator's blocks), then one capture;
      -- the gradients are made inside it (set to none first), so each replay rewrites them
      for _ = 1, 3 do step() end
      local body = step
      if MODE == "train" then
         body = function()
            local loss = PREC == "amp" and lm.autocast(AMP, function()
               return lm.F.cross_entropy(model(x), tgt)
            end) or lm.F.cross_entropy(model(x), tgt)
            loss:backward()
            opt:step()
         end
         opt:zero_grad(true)
      end
      local g = lm.cuda.CUDAGraph()
      lm.cuda.graph(g, body)
      step = function() g:replay() end
   end
   sync()
   local t0 = clock()
   step()
   sync()
   local first = clock() - t0
   step()
   sync()
   local ts, start = {}, clock()
   for i = 1, ITERS do
      local t = clock()
      step()
      sync()
      ts[i] = clock() - t
      -- results go back to the allocator between steps, as in a training loop
      collectgarbage()
      if i >= 3 and clock() - start > BUDGET then break end
   end
   table.sort(ts)
   local med = ts[math.floor(#ts / 2) + 1]
   print(string.format("%s img/s %.2f (%d steps, median %.2f ms, first step %.1f ms)", tag,
                       BATCH / med, #ts, med * 1e3, first * 1e3))
end

local ok, err = xpcall(run, debug.traceback)
if not ok then
   print(tag .. " error: " .. tostring(err):gsub("\n", " | "))
   os.exit(1)
end
