-- bench/conv.lua -- convolution timings, layer by layer and phase by phase.
--
--   bin/lumen bench/conv.lua [threads] [iters] [filter] [bf16|fp16]
--
-- Layers: every convolution of models/small_resnet.lua (width 16, one block per stage) at batch
-- 128 on 28x28 inputs, channels-last float32, as examples/train.lua trains it; then the shapes of
-- issue 4 (3x3 64->64 56x56 batch 8, 1x1 64->256), resnet50's 3x3 stride-1 layers of issue 22
-- (128 at 28x28, 256 at 14x14, 512 at 7x7 at batch 8; 256 at batch 1, 512 at batch 2: Winograd's
-- wide schedule and the unit one); then one whole small_resnet training step
-- (forward, backward, SGD) on random data. Phases: fwd (conv2d), bwd_data (grad_input only),
-- bwd_weight (grad_weight only), each called through the C API the way autograd calls it.
--
-- Each row: '<layer>_<phase> nhwc <median ms>  (<GFLOP/s at the median>, min <ms>, cpu <ms>)'.
-- GFLOP/s counts the direct convolution's 2*N*Ho*Wo*Cout*Cin*kh*kw for every algorithm (Winograd
-- does fewer operations, so it can exceed the machine's peak). 'cpu' is the process CPU time per
-- call: with one thread the figure least disturbed by other load on a shared machine; with more,
-- short calls may miss the other threads' time (Linux adds it at scheduler ticks). The rows end
-- in ')', so bench/compare skips them (the peer has no such rows). A filter (plain substring)
-- selects rows. The load average is printed before and after: on a shared 2-core machine,
-- compare runs made close together.
-- With "bf16" (or "fp16") as the fourth argument every layer runs in that dtype (inputs, weights
-- and gradients; the rows get a "_bf16" suffix) and the training step runs under lm.autocast: the
-- float32 rows of the same shapes are the comparison (bf16 dot products have twice the FMA rate).
-- An empty filter ("") selects every row.
-- Algorithms (kernels/conv.h): LUMEN_CONV_WINOGRAD=0 turns Winograd off, =2 selects F(2x2,3x3)
-- instead of F(4x4,3x3) for forward and backward data; LUMEN_CONV_RB=0 turns the
-- register-blocked small-channel kernels off. E.g.
--   OMP_NUM_THREADS=1 LUMEN_CONV_WINOGRAD=0 bin/lumen bench/conv.lua 1 10 sr_l1
local lm = require("lumen")
local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")

local threads = tonumber(arg and arg[1]) or 2
local ITERS = tonumber(arg and arg[2]) or 20
local filter = arg and arg[3]
if filter == "" then filter = nil end
local low = arg and arg[4]
local DT = ({ bf16 = lm.bfloat16, fp16 = lm.float16 })[low or ""]
if low and not DT then error("bench/conv.lua: the dtype argument is bf16 or fp16, got " .. low) end
local SUF = DT and "_" .. low or ""
lm.set_num_threads(threads)

-- clock_gettime may already be declared by another module with its own timespec type: pass the
-- buffer as void * so that any declaration accepts it
pcall(ffi.cdef, [[
   typedef struct { long tv_sec; long tv_nsec; } lm_bench_timespec;
   int clock_gettime(int clk, lm_bench_timespec *tp);
]])
local ts = ffi.new("lm_bench_timespec")
local tsp = ffi.cast("void *", ts)
local function clock(id)
   ffi.C.clock_gettime(id, tsp)
   return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local MONO, CPU = 1, 2 -- CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID

-- median and min wall ms, median cpu ms of `iters` calls after one warm-up. The garbage is
-- collected before every call (untimed), so results go back to the allocator's cache and the
-- next call reuses them, as in a training loop, instead of touching fresh pages.
local function measure(fn, iters)
   iters = iters or ITERS
   fn()
   collectgarbage()
   local wall, cpu = {}, {}
   for i = 1, iters do
      collectgarbage()
      local c0, t0 = clock(CPU), clock(MONO)
      fn()
      wall[i], cpu[i] = (clock(MONO) - t0) * 1e3, (clock(CPU) - c0) * 1e3
   end
   table.sort(wall)
   table.sort(cpu)
   local m = math.floor(iters / 2) + 1
   return wall[m], wall[1], cpu[m]
end

local function row(name, flops, fn, iters)
   if filter and not name:find(filter, 1, true) then return end
   local ok, ms, mn, cpu = pcall(measure, fn, iters)
   if not ok then
      print(string.format("%s nhwc error: %s", name, tostring(ms)))
      return
   end
   if flops then
      print(string.format("%-30s nhwc %9.3f  (%6.1f GFLOP/s, min %.3f, cpu %.3f)", name, ms,
                          flops / (ms * 1e-3) / 1e9, mn, cpu))
   else
      print(string.format("%-30s nhwc %9.3f  (min %.3f, cpu %.3f)", name, ms, mn, cpu))
   end
end

local cl = lm.channels_last
local gx = ffi.new("lm_tensor*[1]")
local gw = ffi.new("lm_tensor*[1]")
local sbuf, pbuf = ffi.new("int64_t[2]"), ffi.new("int64_t[2]")

local function check(st)
   if st ~= 0 then
      error("lumen error " .. tostring(st) .. ": " .. ffi.string(C.lm_last_error()))
   end
end

-- one layer: batch n, cin -> cout, k x k, stride s, padding p, input size hw
local function layer(name, n, cin, cout, k, s, p, hw, opts)
   opts = opts or {}
   -- :to(cl) gives channels-last strides even where a size-1 dimension makes them ambiguous
   -- (1-channel input: contiguous(cl) keeps NCHW strides, and conv2d would pick NCHW)
   local x = lm.randn({ n, cin, hw, hw }):to(cl)
   local w = (lm.randn({ cout, cin, k, k }) * (1 / math.sqrt(cin * k * k))):to(cl)
   if DT then x, w = x:to(DT), w:to(DT) end
   local y = lm.F.conv2d(x, w, nil, { stride = s, padding = p })
   local ho, wo = y:size(3), y:size(4)
   local g = lm.randn({ n, cout, ho, wo }):to(cl)
   if DT then g = g:to(DT) end
   name = name .. SUF
   local flops = 2.0 * n * ho * wo * cout * cin * k * k
   sbuf[0], sbuf[1], pbuf[0], pbuf[1] = s, s, p, p
   local xc, wc, gc = x._c, w._c, g._c
   row(name .. "_fwd", flops, function()
      return lm.no_grad(function() return lm.F.conv2d(x, w, nil, { stride = s, padding = p }) end)
   end)
   if not opts.no_bwd_data then
      row(name .. "_bwd_data", flops, function()
         sbuf[0], sbuf[1], pbuf[0], pbuf[1] = s, s, p, p
         gx[0] = nil
         check(C.lm_conv2d_backward(xc, wc, gc, sbuf, pbuf, nil, 1, 1, gx, nil, nil))
         return T.wrap(gx[0])
      end)
   end
   row(name .. "_bwd_weight", flops, function()
      sbuf[0], sbuf[1], pbuf[0], pbuf[1] = s, s, p, p
      gw[0] = nil
      check(C.lm_conv2d_backward(xc, wc, gc, sbuf, pbuf, nil, 1, 1, nil, gw, nil))
      return T.wrap(gw[0])
   end)
end

local function loadavg()
   local f = io.open("/proc/loadavg", "r")
   if not f then return "?" end
   local l = f:read("*l") or "?"
   f:close()
   return l:match("^(%S+ %S+ %S+)") or l
end

lm.manual_seed(0)
print(string.format("== conv layers, channels-last %s, %d threads, %d iters; load average %s;"
                    .. " LUMEN_CONV_WINOGRAD=%s LUMEN_CONV_RB=%s", low or "float32", threads, ITERS,
                    loadavg(),
                    os.getenv("LUMEN_CONV_WINOGRAD") or "(default)",
                    os.getenv("LUMEN_CONV_RB") or "(default)"))
-- small_resnet (width 16, blocks 1) at batch 128; the stem needs no grad_input
local B = 128
layer("sr_stem_1to16_28", B, 1, 16, 3, 1, 1, 28, { no_bwd_data = true })
layer("sr_l1_16to16_28", B, 16, 16, 3, 1, 1, 28)   -- x2 in the model
layer("sr_l2a_16to32_s2", B, 16, 32, 3, 2, 1, 28)
layer("sr_l2b_32to32_14", B, 32, 32, 3, 1, 1, 14)
layer("sr_l2ds_16to32_1x1s2", B, 16, 32, 1, 2, 0, 28)
layer("sr_l3a_32to64_s2", B, 32, 64, 3, 2, 1, 14)
layer("sr_l3b_64to64_7", B, 64, 64, 3, 1, 1, 7)    -- x1 (block conv2)
layer("sr_l3ds_32to64_1x1s2", B, 32, 64, 1, 2, 0, 14)
-- issue 4
layer("conv3x3_64_56_b8", 8, 64, 64, 3, 1, 1, 56)
layer("conv1x1_64to256_56_b8", 8, 64, 256, 1, 1, 0, 56)
-- issue 22: resnet50's wide 3x3 stride-1 layers (Winograd's wide schedule at batch 8)
layer("conv3x3_128_28_b8", 8, 128, 128, 3, 1, 1, 28)
layer("conv3x3_256_14_b8", 8, 256, 256, 3, 1, 1, 14)
layer("conv3x3_512_7_b8", 8, 512, 512, 3, 1, 1, 7)
layer("conv3x3_256_14_b1", 1, 256, 256, 3, 1, 1, 14)
layer("conv3x3_512_7_b2", 2, 512, 512, 3, 1, 1, 7)
-- the rest of resnet50's layers at batch 8 (bench/train_profile.sh's by-shape table): the 1x1
-- layers of every stage, the strided 3x3 layers and the stem
layer("r50_1x1_64to64_56", 8, 64, 64, 1, 1, 0, 56)
layer("r50_1x1_256to64_56", 8, 256, 64, 1, 1, 0, 56)
layer("r50_1x1_256to128_56", 8, 256, 128, 1, 1, 0, 56)
layer("r50_1x1_256to512_s2", 8, 256, 512, 1, 2, 0, 56)
layer("r50_1x1_128to512_28", 8, 128, 512, 1, 1, 0, 28)
layer("r50_1x1_512to128_28", 8, 512, 128, 1, 1, 0, 28)
layer("r50_1x1_512to256_28", 8, 512, 256, 1, 1, 0, 28)
layer("r50_1x1_512to1024_s2", 8, 512, 1024, 1, 2, 0, 28)
layer("r50_1x1_256to1024_14", 8, 256, 1024, 1, 1, 0, 14)
layer("r50_1x1_1024to256_14", 8, 1024, 256, 1, 1, 0, 14)
layer("r50_1x1_1024to512_14", 8, 1024, 512, 1, 1, 0, 14)
layer("r50_1x1_1024to2048_s2", 8, 1024, 2048, 1, 2, 0, 14)
layer("r50_1x1_512to2048_7", 8, 512, 2048, 1, 1, 0, 7)
layer("r50_1x1_2048to512_7", 8, 2048, 512, 1, 1, 0, 7)
layer("r50_3x3_128_s2", 8, 128, 128, 3, 2, 1, 56)
layer("r50_3x3_256_s2", 8, 256, 256, 3, 2, 1, 28)
layer("r50_3x3_512_s2", 8, 512, 512, 3, 2, 1, 14)
layer("r50_stem_7x7_3to64", 8, 3, 64, 7, 2, 3, 224, { no_bwd_data = true })

-- one whole training step of small_resnet, batch 128, channels-last
if not filter or ("small_resnet_train_step"):find(filter, 1, true) then
   local model = lm.models.small_resnet({ num_classes = 10, width = 16, blocks = 1 })
   model:to(cl)
   model:train()
   local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
   local x = lm.randn({ B, 1, 28, 28 }):to(cl)
   local y = lm.randint(1, 11, { B }, { dtype = lm.int64 })
   local function loss_of() return lm.F.cross_entropy(model(x), y) end
   local function forward() return model(x) end
   local AMP = DT and { dtype = DT }
   row("small_resnet_train_step_b128" .. SUF, nil, function()
      opt:zero_grad()
      local loss = AMP and lm.autocast(AMP, loss_of) or loss_of()
      loss:backward()
      opt:step()
   end, math.max(5, math.floor(ITERS / 2)))
   row("small_resnet_forward_b128" .. SUF, nil, function()
      return lm.no_grad(function() return AMP and lm.autocast(AMP, forward) or forward() end)
   end, math.max(5, math.floor(ITERS / 2)))
end
print("== load average " .. loadavg() .. " (1, 5, 15 min)")
