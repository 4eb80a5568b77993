-- bench/train_profile.lua -- the resnet50 training step of bench/models.lua (torchvision's
-- resnet50, batch 8, 3x224x224, channels-last, SGD lr 0.01 momentum 0.9, cross_entropy;
-- zero_grad, forward, loss, backward, step) timed plainly, then with every op timed, in the rows
-- bench/peer_train_profile.py gives PyTorch's profiler the same step in. bench/train_profile.sh
-- runs both alternately and prints them side by side (docs/performance.md, "Where the training
-- step's time goes").
--
--   bin/lumen bench/train_profile.lua [threads] [steps] [bf16] [nosplit] [raw]
--
-- Prints '<row>|<ms per step>' lines:
--   step|<ms>            median of `steps` plain steps (after two warm-ups)
--   profiled step|<ms>   wall time per step with the timers on (the difference is their cost)
--   op:<row>|<ms>        self time per step of the calls of one kind (below)
--   other (framework: Lua / Python)|<ms>  the profiled step minus the sum of the op rows: the
--                        modules' Lua, the loop, what no timer covers
--   shape:<kxk Cin->Cout sS, HxW in>|<fwd ms>|<bwd data ms>|<bwd weight ms>|<calls>  the
--                        convolutions by shape (per step; the same self times as the rows)
-- and '# ...' comment lines (allocator calls and collections per step). "bf16": the forward and
-- the loss under lm.autocast({dtype = lm.bfloat16}) (PyTorch's recipe, as bench/models.lua).
-- "raw": the timed names before they are put in rows, on stderr.
--
-- What is timed (self time: a timed call made inside another timed call is not counted twice):
--   * every lm.F function and the Tensor methods the model calls (relu_, add, to, ...), from
--     Lua: the outermost timed call owns what it calls (cross_entropy holds its log_softmax and
--     nll_loss, the allocations an op makes are the op's, as in PyTorch's rows), except the
--     dtype casts (Tensor.to, autocast's), which are a row of their own on both sides;
--   * every autograd backward node, by autograd's profiler hook (A.set_profiler);
--   * the convolution backward split into backward data and backward weight: the step's
--     ConvolutionBackward nodes call lm_conv2d_backward through the table conv_nd keeps
--     (CONV_ND[2].backward, found with debug.getupvalue); while profiling it is replaced by a
--     function that calls the C entry point twice, once for grad_input and once for grad_weight
--     (and grad_bias), each timed. The kernels are the same either way (src/ops/conv.c runs
--     backward data, then backward weight); the second call repeats only the argument checks.
--     "nosplit" leaves the node whole;
--   * the garbage collections the allocator asks for (lm.memory.collect, also when the count
--     trigger in memory.own calls it) and the sweeps after the collector's own cycles: the
--     allocation/collection row. The system allocator's calls happen inside the ops (their time
--     is the op's, as in PyTorch); '# allocator calls/step' counts them.
-- The timer is the monotonic wall clock; a timed call costs about 1-2 us.
-- bench/run.sh skips this file (it takes about a minute; bench/train_profile.sh runs it).
local lm = require("lumen")
local A = require("lumen.autograd")
local T = require("lumen.tensor")
local util = require("lumen.util")
local clock = util.clock

local threads = tonumber(arg and arg[1]) or 2
local steps = tonumber(arg and arg[2]) or 5
local words = {}
for i = 3, arg and #arg or 0 do words[arg[i]] = true end
lm.set_num_threads(threads)

---------------------------------------------------------------------------------------------
-- the step (bench/models.lua's resnet50_train_b8 / resnet50_train_bf16_b8)
---------------------------------------------------------------------------------------------
lm.manual_seed(0)
local x = lm.randn({ 8, 3, 224, 224 }):contiguous(lm.channels_last)
local tgt = lm.randint(1, 1001, { 8 })
local model = lm.models.resnet50({ num_classes = 1000 })
model:train()
lm.to_channels_last(model)
local opt = lm.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
local AMP = words.bf16 and { dtype = lm.bfloat16 } or nil
local function loss_of() return lm.F.cross_entropy(model(x), tgt) end
local backward = function(l) return l:backward() end
local function step()
   opt:zero_grad(true)
   local loss = AMP and lm.autocast(AMP, loss_of) or loss_of()
   backward(loss)
   opt:step()
end

step()
step()
local plain = {}
for i = 1, steps do
   local t0 = clock()
   step()
   plain[i] = clock() - t0
end
table.sort(plain)
local n = #plain
local plain_med = n % 2 == 1 and plain[(n + 1) / 2] or (plain[n / 2] + plain[n / 2 + 1]) / 2

---------------------------------------------------------------------------------------------
-- the timers: self time per name
---------------------------------------------------------------------------------------------
local stats = {}          -- name -> {calls, seconds}
local child = { 0 }       -- child[d]: time of the timed calls made directly inside frame d
local active = false
local opaque = 0          -- > 0 inside a plain timed call: plain wrappers pass through

local function add_stat(name, dt)
   local s = stats[name]
   if s == nil then s = { 0, 0 }; stats[name] = s end
   s[1] = s[1] + 1
   s[2] = s[2] + dt
end

local function pack(...) return { n = select("#", ...), ... } end

-- the convolutions by shape: "kxk Cin->Cout sS, HxW in" -> {fwd, bwd data, bwd weight} seconds
-- (the same self times as their rows), beside oneDNN's per-primitive times on PyTorch's side
local shapes = {}
local function shape_add(key, which, dt)
   local e = shapes[key]
   if e == nil then e = { 0, 0, 0, 0 }; shapes[key] = e end
   e[which] = e[which] + dt
   if which == 1 then e[4] = e[4] + 1 end
end
local function conv_key(kh, kw, cin, cout, s, h, w)
   return string.format("%dx%d %d->%d s%d, %dx%d in", kh, kw, cin, cout, s, h, w)
end

-- f wrapped: its self time (minus the timed calls it makes) goes to stats[name]. A plain
-- wrapper called inside another plain one passes through (the outer call owns it); an `always`
-- one (casts, collections, the convolution backward halves) is timed wherever it runs.
-- extra(self_time, results, ...) is called after a timed call (the per-shape table).
local function timed(name, f, always, extra)
   return function(...)
      if not active or (opaque > 0 and not always) then return f(...) end
      local depth = #child + 1
      child[depth] = 0
      if not always then opaque = opaque + 1 end
      local t0 = clock()
      local r = pack(f(...))
      local dt = clock() - t0
      if not always then opaque = opaque - 1 end
      local inner = child[depth]
      child[depth] = nil
      add_stat(name, dt - inner)
      child[depth - 1] = child[depth - 1] + dt
      if extra then extra(dt - inner, r, ...) end
      return unpack(r, 1, r.n)
   end
end

local restore = {}
local function wrap_field(tbl, key, name, always, extra)
   local f = tbl[key]
   if type(f) ~= "function" then return end
   tbl[key] = timed(name, f, always, extra)
   restore[#restore + 1] = function() tbl[key] = f end
end

-- a function's upvalue by name: its index and value
local function upvalue(f, want)
   for i = 1, 200 do
      local name, v = debug.getupvalue(f, i)
      if name == nil then return nil end
      if name == want then return i, v end
   end
   return nil
end

local function install()
   local F = lm.F
   local conv2d = F.conv2d      -- before it is wrapped (its upvalues lead to CONV_ND)
   for k, v in pairs(F) do
      if type(v) == "function" and k:sub(1, 1) ~= "_" and k ~= "conv2d" then
         wrap_field(F, k, "F." .. k)
      end
   end
   wrap_field(F, "conv2d", "F.conv2d", false, function(dt, r, xt, wt)
      local y = r[1]
      local h, ho = xt:size(3), y:size(3)
      shape_add(conv_key(wt:size(3), wt:size(4), xt:size(2), wt:size(1),
                         math.floor(h / ho + 0.5), h, xt:size(4)), 1, dt)
   end)
   for _, k in ipairs({ "add", "add_", "relu", "relu_", "reshape", "view", "flatten", "item",
                        "contiguous", "zero_", "mul", "mul_", "sub", "sum", "mean" }) do
      wrap_field(T.Tensor, k, "Tensor." .. k)
   end
   wrap_field(T.Tensor, "to", "dtype casts", true)
   -- collections: lm.memory.collect, the count trigger's local copy of it in memory.own, and
   -- the sweep own() runs after the collector's own cycles (the same local as collect's)
   local mem = lm.memory
   local own = mem.own
   local ci, collect_now = upvalue(own, "collect_now")
   local si, sweep = upvalue(own, "sweep")
   local collect = mem.collect
   local tcollect = timed("collect", collect, true)
   mem.collect = tcollect
   restore[#restore + 1] = function() mem.collect = collect end
   if ci then
      debug.setupvalue(own, ci, tcollect)
      restore[#restore + 1] = function() debug.setupvalue(own, ci, collect_now) end
   end
   if si then
      debug.setupvalue(own, si, timed("sweep", sweep, true))
      restore[#restore + 1] = function() debug.setupvalue(own, si, sweep) end
   end
   -- the convolution backward in two timed halves
   if not words.nosplit then
      local _, conv_nd = upvalue(conv2d, "conv_nd")
      local _, K = nil, nil
      if conv_nd then _, K = upvalue(conv_nd, "CONV_ND") end
      if K and K[2] and K[2].backward then
         local real = K[2].backward
         local function by_shape(which)
            return function(dt, _, xc, wc, _, sb)
               shape_add(conv_key(tonumber(wc.sizes[2]), tonumber(wc.sizes[3]),
                                  tonumber(xc.sizes[1]), tonumber(wc.sizes[0]),
                                  tonumber(sb[0]), tonumber(xc.sizes[2]),
                                  tonumber(xc.sizes[3])), which, dt)
            end
         end
         local bd = timed("conv bwd data", real, true, by_shape(2))
         local bw = timed("conv bwd weight", real, true, by_shape(3))
         K[2].backward = function(xc, wc, gc, sb, pb, db, groups, fmt, gx, gw, gb)
            if not active then return real(xc, wc, gc, sb, pb, db, groups, fmt, gx, gw, gb) end
            local st = 0
            if gx ~= nil then st = bd(xc, wc, gc, sb, pb, db, groups, fmt, gx, nil, nil) end
            if st ~= 0 or (gw == nil and gb == nil) then return st end
            return bw(xc, wc, gc, sb, pb, db, groups, fmt, nil, gw, gb)
         end
         restore[#restore + 1] = function() K[2].backward = real end
      else
         io.stderr:write("train_profile: conv_nd's CONV_ND not found; the convolution " ..
                         "backward stays whole\n")
      end
   end
   local zg, st = opt.zero_grad, opt.step
   opt.zero_grad = timed("optimizer:zero_grad", zg)
   opt.step = timed("optimizer:step", st)
   restore[#restore + 1] = function() opt.zero_grad, opt.step = nil, nil end
   -- backward nodes: autograd calls the hook after each; the always-timed calls made inside a
   -- node were already added to the engine frame's child time since the previous report, so
   -- the node's self time is dt minus them
   local mark = 0
   local engine = timed("backward engine", function(l)
      mark = 0
      return l:backward()
   end)
   backward = engine
   restore[#restore + 1] = function() backward = function(l) return l:backward() end end
   local prev = A.set_profiler(function(name, dt)
      local d = #child
      local inner = child[d] - mark
      add_stat("bw " .. name, dt - inner)
      child[d] = mark + dt
      mark = child[d]
   end)
   restore[#restore + 1] = function() A.set_profiler(prev) end
end

install()
collectgarbage()
stats = {}
local a0 = lm.memory.alloc_count()
active = true
local t0 = clock()
for _ = 1, steps do step() end
local total = clock() - t0
active = false
local allocs = lm.memory.alloc_count() - a0
for i = #restore, 1, -1 do restore[i]() end

---------------------------------------------------------------------------------------------
-- rows (the names bench/peer_train_profile.py uses)
---------------------------------------------------------------------------------------------
local FWD = {
   ["F.conv2d"] = "conv forward", ["F.batch_norm"] = "batch norm forward",
   ["Tensor.relu_"] = "relu forward", ["Tensor.relu"] = "relu forward",
   ["F.relu"] = "relu forward", ["F.relu_"] = "relu forward",
   ["Tensor.add"] = "add forward (residual)", ["Tensor.add_"] = "add forward (residual)",
   ["F.max_pool2d"] = "max_pool2d forward",
   ["F.adaptive_avg_pool2d"] = "adaptive_avg_pool2d forward",
   ["F.linear"] = "linear forward", ["F.cross_entropy"] = "cross_entropy forward",
   ["F.flatten"] = "flatten/view", ["Tensor.flatten"] = "flatten/view",
   ["Tensor.view"] = "flatten/view", ["Tensor.reshape"] = "flatten/view",
   ["dtype casts"] = "dtype casts (bf16)",
   ["optimizer:step"] = "optimizer step", ["optimizer:zero_grad"] = "zero_grad",
   ["collect"] = "allocation/collection", ["sweep"] = "allocation/collection",
   ["conv bwd data"] = "conv backward data", ["conv bwd weight"] = "conv backward weight",
   ["backward engine"] = "autograd engine (Lua)",
}
-- autograd node names (lumen's, without PyTorch's trailing 0), as Lua patterns; the first that
-- matches gives the row. NativeBatchNormReluBackward is lumen's batch norm whose output went
-- through relu_ (the two backwards fused in one kernel): it counts as batch norm backward.
local BWD = {
   { "^Convolution", words.nosplit and "conv backward (data + weight)" or
                     "conv backward (node: Lua, checks)" },
   { "BatchNorm", "batch norm backward" }, { "^Relu", "relu backward" },
   { "^Threshold", "relu backward" }, { "^AddBackward", "add backward (residual)" },
   { "^AccumulateGrad", "gradient accumulation" }, { "^GradAdd", "gradient accumulation" },
   { "^MaxPool", "max_pool2d backward" }, { "^AdaptiveAvgPool", "adaptive_avg_pool2d backward" },
   { "^Mean", "adaptive_avg_pool2d backward" }, { "^Addmm", "linear backward" },
   { "^Linear", "linear backward" }, { "^Mm", "linear backward" },
   { "^TBackward", "linear backward" },
   { "^NllLoss", "cross_entropy backward" }, { "^LogSoftmax", "cross_entropy backward" },
   { "^CrossEntropy", "cross_entropy backward" }, { "^View", "flatten/view" },
   { "^Reshape", "flatten/view" }, { "^Flatten", "flatten/view" },
   { "^ToCopy", "dtype casts (bf16)" }, { "^ToBackward", "dtype casts (bf16)" },
}
local function row_of(name)
   if FWD[name] then return FWD[name] end
   local bw = name:match("^bw (.*)$")
   if bw then
      for _, p in ipairs(BWD) do
         if bw:find(p[1]) then return p[2] end
      end
   end
   return "other op: " .. name
end

local rows, order = {}, {}
local sum = 0
if words.raw then io.stderr:write("timed names (ms per step, calls per step):\n") end
local raw = {}
for name, s in pairs(stats) do raw[#raw + 1] = { name, s[1] / steps, s[2] / steps * 1e3 } end
table.sort(raw, function(a, b) return a[3] > b[3] end)
for _, r in ipairs(raw) do
   if words.raw then
      io.stderr:write(string.format("  %-44s %8.3f ms %7.1f calls\n", r[1], r[3], r[2]))
   end
   local row = row_of(r[1])
   if rows[row] == nil then rows[row] = 0; order[#order + 1] = row end
   rows[row] = rows[row] + r[3]
   sum = sum + r[3]
end
table.sort(order, function(a, b) return rows[a] > rows[b] end)
print(string.format("# lumen %s, %d threads, %d steps%s; allocator calls/step %.1f",
                    lm._VERSION, lm.get_num_threads(), steps, AMP and ", bf16 autocast" or "",
                    allocs / steps))
print(string.format("# collections/step %.1f, sweeps/step %.1f",
                    (stats.collect and stats.collect[1] or 0) / steps,
                    (stats.sweep and stats.sweep[1] or 0) / steps))
print(string.format("step|%.3f", plain_med * 1e3))
print(string.format("profiled step|%.3f", total / steps * 1e3))
local small = 0
for _, row in ipairs(order) do
   if row:find("^other op: ") and rows[row] < 0.5 then
      small = small + rows[row]
   else
      print(string.format("op:%s|%.3f", row, rows[row]))
   end
end
if small > 0 then print(string.format("op:other op: (each < 0.5 ms)|%.3f", small)) end
print(string.format("other (framework: Lua / Python)|%.3f", total / steps * 1e3 - sum))
for key, e in pairs(shapes) do
   print(string.format("shape:%s|%.3f|%.3f|%.3f|%.1f", key, e[1] / steps * 1e3,
                       e[2] / steps * 1e3, e[3] / steps * 1e3, e[4] / steps))
end
