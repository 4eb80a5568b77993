-- bench/train_step.lua -- time one training step of examples/train.lua (small_resnet, width 16,
-- Fashion-MNIST-sized input, batch 128, SGD momentum 0.9 nesterov + weight decay, cross_entropy)
-- and break it down by operator.
--
--   bin/lumen bench/train_step.lua [--format nhwc|nchw|both] [--threads N] [--steps N]
--       [--warmup N] [--batch N] [--width N] [--blocks N] [--profile] [--no-profile]
--       [--spincount N] [--wait-policy active|passive]
--
-- --spincount / --wait-policy set GOMP_SPINCOUNT / OMP_WAIT_POLICY before lumen (and so
-- libgomp) is loaded, for comparing OpenMP wait settings; the environment variables work too.
-- On a busy machine libgomp's default (spin 300000 rounds at every barrier) can make a step 10x
-- slower: a thread spinning at a barrier holds a core the descheduled thread it waits for needs.
--
-- Prints, per format: wall time per step (best / median of --steps), process CPU time per step
-- (best / median; with --threads 1 it is the single-thread cost and hardly depends on the load
-- of the machine), allocator calls per step (lm.memory.alloc_count(): should stay flat when the
-- cache serves). With --profile (the default) it then runs --steps more steps with every lm.F
-- function, the Tensor methods the model uses, the garbage collections the allocator asks for
-- (lm.memory.collect) and every autograd backward function (autograd's profiler hook) timed, and
-- prints the time per step of each (self time: nested timed calls are subtracted), sorted. The
-- timer is the wall clock, or with --threads 1 the thread's CPU time, which the other load on
-- the machine hardly inflates. Profiled steps are a little slower (a few us per timed call).
--
-- Typical use: bin/lumen bench/train_step.lua --threads 1 (the cost of each op), then
-- bin/lumen bench/train_step.lua --no-profile (the step with 2 threads, both formats).
local ffi = require("ffi")

local opt = { format = "both", threads = 2, steps = 20, warmup = 3, batch = 128, width = 16,
              blocks = 1, profile = true, spincount = false, ["wait-policy"] = false }
do
   local args = arg or {}
   local i = 1
   while i <= #args do
      local a = args[i]
      local k, v = a:match("^%-%-([%w%-]+)=(.*)$")
      if not k then k = a:match("^%-%-([%w%-]+)$") end
      if k == "profile" then opt.profile = true
      elseif k == "no-profile" then opt.profile = false
      elseif k and opt[k] ~= nil then
         if v == nil then i = i + 1; v = args[i] end
         opt[k] = tonumber(v) or v
      else
         io.stderr:write("usage: bin/lumen bench/train_step.lua [--format nhwc|nchw|both] " ..
                         "[--threads N] [--steps N] [--warmup N] [--batch N] [--width N] " ..
                         "[--blocks N] [--profile|--no-profile] [--spincount N] " ..
                         "[--wait-policy active|passive]\n")
         os.exit(2)
      end
      i = i + 1
   end
end

-- OpenMP settings: only effective before libgomp is loaded (with liblumen, by require "lumen")
pcall(ffi.cdef, [[int lm_bts_setenv(const char *name, const char *value, int overwrite)
                  __asm__("setenv");]])
if opt.spincount then ffi.C.lm_bts_setenv("GOMP_SPINCOUNT", tostring(opt.spincount), 1) end
if opt["wait-policy"] then ffi.C.lm_bts_setenv("OMP_WAIT_POLICY", opt["wait-policy"], 1) end

local lm = require("lumen")
local A = require("lumen.autograd")
local T = require("lumen.tensor")
lm.set_num_threads(opt.threads)
local function loadavg()
   local f = io.open("/proc/loadavg")
   if not f then return "?" end
   local l = f:read("*l")
   f:close()
   return (l or "?"):match("^(%S+ %S+ %S+)") or "?"
end
print(string.format("OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s, %d threads, load average %s",
   os.getenv("OMP_WAIT_POLICY") or "(unset)", os.getenv("GOMP_SPINCOUNT") or "(unset)",
   lm.get_num_threads(), loadavg()))

pcall(ffi.cdef, [[
   typedef struct { long tv_sec; long tv_nsec; } lm_bts_timespec;
   int lm_bts_clock_gettime(int clk, lm_bts_timespec *tp) __asm__("clock_gettime");
]])
local ts = ffi.new("lm_bts_timespec")
local function clock_of(id)
   ffi.C.lm_bts_clock_gettime(id, ts) -- 1: MONOTONIC, 2: PROCESS_CPUTIME_ID, 3: THREAD_CPUTIME_ID
   return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local function clock(id) return clock_of(id or 1) end
-- the profile's clock: wall time, or with --threads 1 the thread's CPU time (what a loaded
-- machine does not inflate: the op's own cost)
local pclock = opt.threads == 1 and function() return clock_of(3) end or clock

---------------------------------------------------------------------------------------------
-- profiler: self time per name
---------------------------------------------------------------------------------------------

local stats = {}          -- name -> {calls, seconds}
local child = { 0 }       -- stack of child time of the wrapped calls in progress
local active = false

local function add_stat(name, dt)
   local s = stats[name]
   if s == nil then s = { 0, 0 }; stats[name] = s end
   s[1] = s[1] + 1
   s[2] = s[2] + dt
end

local function pack(...) return { n = select("#", ...), ... } end

-- f wrapped: its self time (minus the wrapped calls it makes) goes to stats[name]; child[d]
-- accumulates the time of the direct children of the call at depth d
local function timed(name, f)
   return function(...)
      if not active then return f(...) end
      local depth = #child + 1
      child[depth] = 0
      local t0 = pclock()
      local r = pack(f(...))
      local dt = pclock() - t0
      local inner = child[depth]
      child[depth] = nil
      add_stat(name, dt - inner)
      child[depth - 1] = child[depth - 1] + dt
      return unpack(r, 1, r.n)
   end
end

local function wrap_table(tbl, prefix, names)
   local saved = {}
   for _, k in ipairs(names) do
      local f = tbl[k]
      if type(f) == "function" then
         saved[k] = f
         tbl[k] = timed(prefix .. k, f)
      end
   end
   return function() for k, f in pairs(saved) do tbl[k] = f end end
end

---------------------------------------------------------------------------------------------
-- one format
---------------------------------------------------------------------------------------------

local function median(t)
   local c = {}
   for i = 1, #t do c[i] = t[i] end
   table.sort(c)
   return c[math.floor((#c + 1) / 2)]
end
local function best(t)
   local m = math.huge
   for i = 1, #t do if t[i] < m then m = t[i] end end
   return m
end
local function worst(t)
   local m = -math.huge
   for i = 1, #t do if t[i] > m then m = t[i] end end
   return m
end

local function run(fmtname)
   local fmt = fmtname == "nhwc" and lm.channels_last or lm.contiguous_format
   lm.manual_seed(1)
   local model = lm.models.small_resnet({ num_classes = 10, width = opt.width,
                                          blocks = opt.blocks })
   model:to(fmt)
   model:train()
   local decay, no_decay = {}, {}
   for _, p in ipairs(model:parameters()) do
      if p:dim() > 1 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
   end
   local optimizer = lm.optim.SGD({
      { params = decay, weight_decay = 5e-4 },
      { params = no_decay, weight_decay = 0 },
   }, { lr = 0.05, momentum = 0.9, nesterov = true })
   local x = lm.randn({ opt.batch, 1, 28, 28 }):contiguous(fmt)
   local y = lm.randint(1, 11, { opt.batch })

   local function step()
      optimizer:zero_grad()
      local loss = lm.F.cross_entropy(model(x), y)
      loss:backward()
      optimizer:step()
      return loss:item()
   end

   for _ = 1, opt.warmup do step() end
   local walls, cpus, allocs = {}, {}, {}
   local loss
   for i = 1, opt.steps do
      local a0 = lm.memory.alloc_count()
      local c0, w0 = clock(2), clock(1)
      loss = step()
      walls[i] = clock(1) - w0
      cpus[i] = clock(2) - c0
      allocs[i] = lm.memory.alloc_count() - a0
   end
   print(string.format("%s  threads %d  batch %d: step wall best %.1f ms, median %.1f ms | " ..
      "process cpu best %.1f ms, median %.1f ms | allocs/step %d..%d | loss %.6f",
      fmtname, opt.threads, opt.batch, best(walls) * 1e3, median(walls) * 1e3,
      best(cpus) * 1e3, median(cpus) * 1e3, best(allocs), worst(allocs), loss))

   if not opt.profile then return end
   -- breakdown
   local F = lm.F
   local fnames = {}
   for k, v in pairs(F) do
      if type(v) == "function" and k:sub(1, 1) ~= "_" then fnames[#fnames + 1] = k end
   end
   local tnames = { "add", "add_", "sub", "mul", "mul_", "relu", "relu_", "reshape", "view",
                    "flatten", "item", "contiguous", "zero_" }
   local restore_f = wrap_table(F, "F.", fnames)
   local restore_t = wrap_table(T.Tensor, "Tensor.", tnames)
   local restore_m = wrap_table(lm.memory, "lm.memory.", { "collect" })
   local zg, st = optimizer.zero_grad, optimizer.step
   optimizer.zero_grad = timed("optimizer:zero_grad", zg)
   optimizer.step = timed("optimizer:step", st)
   local fwd = timed("model forward (Lua, modules)", function(inp) return model(inp) end)
   -- backward nodes are called by the engine and reported by autograd's profiler hook (after
   -- each node): wrapped calls made inside a node (a collection) were already charged to the
   -- engine's child time since the previous report, so the node's self time is dt minus them
   local mark = 0
   local bwd = timed("backward engine (Lua)", function(l)
      mark = 0
      return l:backward()
   end)
   local set_profiler = A.set_profiler or function() end  -- older autograd: no backward nodes
   local prev_prof = set_profiler(function(name, dt)
      local d = #child
      local inner = child[d] - mark
      add_stat("bw " .. name, dt - inner)
      child[d] = mark + dt
      mark = child[d]
   end, pclock)
   stats = {}
   active = true
   local t0 = pclock()
   for _ = 1, opt.steps do
      optimizer:zero_grad()
      local out = fwd(x)
      local l = lm.F.cross_entropy(out, y)
      bwd(l)
      optimizer:step()
      l:item()
   end
   local total = pclock() - t0
   active = false
   set_profiler(prev_prof)
   restore_f(); restore_t(); restore_m()
   optimizer.zero_grad, optimizer.step = nil, nil
   local rows, sum = {}, 0
   for name, s in pairs(stats) do
      rows[#rows + 1] = { name, s[1] / opt.steps, s[2] / opt.steps }
      sum = sum + s[2]
   end
   table.sort(rows, function(a, b) return a[3] > b[3] end)
   print(string.format("  profile (%s, %d steps, %.1f ms/step profiled; self %s time per step):",
                       fmtname, opt.steps, total / opt.steps * 1e3,
                       opt.threads == 1 and "CPU" or "wall"))
   for _, r in ipairs(rows) do
      print(string.format("    %-40s %6.1f calls %8.3f ms  %5.1f%%", r[1], r[2], r[3] * 1e3,
                          100 * r[3] * opt.steps / total))
   end
   print(string.format("    %-40s %15.3f ms", "(unaccounted: the loop itself)",
                       (total - sum) / opt.steps * 1e3))
end

local formats = opt.format == "both" and { "nhwc", "nchw" } or { opt.format }
for _, f in ipairs(formats) do run(f) end
