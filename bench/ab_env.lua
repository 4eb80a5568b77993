-- bench/ab_env.lua -- a paired A/B of an environment switch in one process: the kernel switches
-- (LUMEN_CONV_WINOGRAD, LUMEN_CONV_PW, LUMEN_CONV_NC, LUMEN_CONV_STREAM, ...) are read at every
-- call, so one process can alternate them round by round. On a shared host whose speed drifts
-- by 10-30 % over minutes (other tenants loading the shared cache and memory), comparing two
-- processes run one after the other measures the drift; the paired difference of rounds run
-- back to back does not (docs/performance.md, "Measuring").
--
--   bin/lumen bench/ab_env.lua VAR A B [what] [rounds] [reps]
--
-- VAR is set to A, then B, then B, then A, ... ("-" unsets it), one round each; a round runs the
-- workload once untimed and then `reps` timed calls (their median). Prints each side's median
-- over the rounds and the median of the paired differences B - A (negative: B is faster), with
-- every difference, so a skewed spread shows.
-- what: train | infer | folded (resnet50, batch 8, channels-last, float32; default folded),
--   train_bf16 | infer_bf16 (the same under lm.autocast with bfloat16), or
--   conv:N,C,O,H,k,s,p[,bf16] (one convolution forward with bias and ReLU, gradients off).
-- rounds: default 16; reps: default 2 (model) or 3 (conv).
-- E.g. bin/lumen bench/ab_env.lua LUMEN_CONV_NC 0 1 folded
--      bin/lumen bench/ab_env.lua LUMEN_CONV_WINOGRAD 0 - conv:8,256,256,14,3,1,1 20
local lm = require("lumen")
local ffi = require("ffi")
local util = require("lumen.util")

pcall(ffi.cdef, [[
   int setenv(const char *name, const char *value, int overwrite);
   int unsetenv(const char *name);
]])

local VAR, A, B = arg and arg[1], arg and arg[2], arg and arg[3]
if not (VAR and A and B) then
   error("usage: bin/lumen bench/ab_env.lua VAR A B [train|infer|folded|conv:N,C,O,H,k,s,p[,bf16]]"
         .. " [rounds] [reps]", 0)
end
local what = arg[4] or "folded"
local rounds = tonumber(arg[5]) or 16
local is_conv = what:sub(1, 5) == "conv:"
local reps = tonumber(arg[6]) or (is_conv and 3 or 2)
lm.set_num_threads(tonumber(os.getenv("OMP_NUM_THREADS") or "") or 2)
lm.manual_seed(0)

local run
if is_conv then
   local f = {}
   for v in what:sub(6):gmatch("[^,]+") do f[#f + 1] = v end
   local n = {}
   for i = 1, 7 do
      n[i] = tonumber(f[i])
      if not n[i] then error("bench/ab_env.lua: conv:N,C,O,H,k,s,p needs seven numbers", 0) end
   end
   local N, C, O, H, k, s, p = n[1], n[2], n[3], n[4], n[5], n[6], n[7]
   local x = lm.randn({ N, C, H, H }):contiguous(lm.channels_last)
   local w = (lm.randn({ O, C, k, k }) * (1 / math.sqrt(C * k * k))):contiguous(lm.channels_last)
   local b = lm.randn({ O })
   if f[8] == "bf16" then x, w, b = x:to(lm.bfloat16), w:to(lm.bfloat16), b:to(lm.bfloat16) end
   local opts = { stride = s, padding = p, relu = true }
   run = function()
      lm.no_grad(function() return lm.F.conv2d(x, w, b, opts) end)
   end
else
   local bf16 = what:match("_bf16$") ~= nil
   what = what:gsub("_bf16$", "")
   if what ~= "train" and what ~= "infer" and what ~= "folded" then
      error("bench/ab_env.lua: what is train, infer, folded (each optionally _bf16) or conv:...,"
            .. " got " .. what, 0)
   end
   local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
   local model = lm.models.resnet50({ num_classes = 1000 })
   lm.to_channels_last(model)
   if what == "train" then
      local tgt = lm.randint(1, 1001, { 8 })
      model:train()
      local opt = lm.optim.SGD(model:parameters(), { lr = 0.001, momentum = 0.9 })
      local function loss() return lm.F.cross_entropy(model(x), tgt) end
      run = function()
         opt:zero_grad(true)
         local l = bf16 and lm.autocast({ dtype = lm.bfloat16 }, loss) or loss()
         l:backward()
         opt:step()
      end
   else
      model:eval()
      if what == "folded" then lm.nn.fold_batch_norm(model) end
      local function fwd() return lm.no_grad(function() return model(x) end) end
      run = bf16 and function() lm.autocast({ dtype = lm.bfloat16 }, fwd) end or fwd
   end
end

local function set(v)
   if v == "-" then ffi.C.unsetenv(VAR) else ffi.C.setenv(VAR, v, 1) end
end

run()
run()
local res = { [A] = {}, [B] = {} }
for r = 1, rounds do
   for _, v in ipairs(r % 2 == 1 and { A, B } or { B, A }) do
      set(v)
      run()
      res[v][r] = util.median_ms(run, reps)
   end
end

local median = util.median
local d = {}
for i = 1, rounds do d[i] = res[B][i] - res[A][i] end
local ma, mb = median(res[A]), median(res[B])
local md, ds = median(d)
local shown = {}
for i, v in ipairs(ds) do shown[i] = string.format("%.2f", v) end
print(string.format("%s, %d rounds of %d calls: %s=%s %.3f ms, %s=%s %.3f ms", what, rounds, reps,
                    VAR, A, ma, VAR, B, mb))
print(string.format("paired B - A: median %.3f ms (%.1f %%) [%s]", md, 100 * md / ma,
                    table.concat(shown, " ")))
