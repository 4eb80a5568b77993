-- bench/ddp.lua -- DistributedDataParallel's overlap of communication with backward, measured:
-- the training step (zero_grad, forward, loss, backward with the gradient all-reduce; no
-- optimizer step, which is the same in every mode) of resnet18 in channels-last on every rank,
-- in three modes alternated step by step in the same run:
--   overlap    DDP as it is: each bucket's all-reduce starts as soon as its gradients are ready
--   after      DDP with overlap = false: every all-reduce starts when backward has finished
--   none       the plain model: no communication at all (the floor)
-- A step's time is the slowest rank's (all-reduced with op "max" outside the timed region); the
-- ranks start each step together (barrier). Medians over the steps.
--
--   mpirun --allow-run-as-root -np 2 bin/lumen bench/ddp.lua [--steps 6] [--batch 8] [--size 112]
--       [--threads 1] [--bucket-mb 25] [--warmup 1]
--
-- --bucket-mb may list several sizes ("25,5"): each gets its own overlap / after rows.
local lm = require("lumen")
local util = require("lumen.util")

local opt, usage = util.parse_flags({
   steps = 6, batch = 8, size = 112, threads = 1, ["bucket-mb"] = "25", warmup = 1,
}, "mpirun -np 2 bin/lumen bench/ddp.lua [--steps N] [--batch N] [--size N] [--threads N] " ..
   "[--bucket-mb MB[,MB...]] [--warmup N]", arg)
local dist = lm.distributed
dist.init()
local rank, world = dist.rank(), dist.world_size()
lm.set_num_threads(opt.threads)
local say = rank == 0 and print or function() end

local caps = {}
for v in tostring(opt["bucket-mb"]):gmatch("[^,]+") do
   local x = tonumber(v)
   if not x or x <= 0 then usage("--bucket-mb: positive numbers, got " .. v) end
   caps[#caps + 1] = x
end

lm.manual_seed(0)
local model = lm.models.resnet18({ num_classes = 1000 })
model:to(lm.channels_last)
local nparams = 0
for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end

local modes = {}
for _, cap in ipairs(caps) do
   local ddp = lm.nn.parallel.DistributedDataParallel(model, { bucket_cap_mb = cap })
   modes[#modes + 1] = { name = ("overlap, %g MB buckets"):format(cap), net = ddp, ddp = ddp }
   local late = lm.nn.parallel.DistributedDataParallel(model, { bucket_cap_mb = cap,
                                                               overlap = false })
   modes[#modes + 1] = { name = ("after backward, %g MB buckets"):format(cap), net = late,
                         ddp = late }
end
modes[#modes + 1] = { name = "no communication", net = model }

lm.manual_seed(100 + rank)
local x = lm.randn({ opt.batch, 3, opt.size, opt.size }):to(lm.channels_last)
local y = lm.randint(1, 1001, { opt.batch }):to(lm.int64)

local clock = require("lumen.autograd").clock
local tmax = lm.zeros({ 1 }, { dtype = lm.float64 })
local function step(m)
   model:zero_grad()
   dist.barrier()
   local t0 = clock()
   lm.F.cross_entropy(m.net(x), y):backward()
   local dt = clock() - t0
   tmax:fill_(dt)
   dist.all_reduce(tmax, { op = "max" })
   return tmax:item()
end

say(("bench/ddp.lua: resnet18 channels-last, %d processes x %d thread(s), batch %d per rank at " ..
     "%dx%d, %.1f M parameters (%.1f MB of float32 gradients); %d steps per mode after %d warm-up")
    :format(world, opt.threads, opt.batch, opt.size, opt.size, nparams / 1e6, nparams * 4 / 2^20,
            opt.steps, opt.warmup))
say("  " .. dist.library_version():match("^[^,\n]*"))
for _, m in ipairs(modes) do
   if m.ddp then
      local sizes = m.ddp:bucket_sizes()
      m.buckets = #sizes
   end
   m.times = {}
end
for _ = 1, opt.warmup do
   for _, m in ipairs(modes) do step(m) end
end
for _ = 1, opt.steps do
   for _, m in ipairs(modes) do
      m.times[#m.times + 1] = step(m)
      if m.ddp then
         m.early = (m.early or 0) + m.ddp.stats.started_in_backward
      end
   end
end

local median = util.median
local base = median(modes[#modes].times)
say(("  %-32s %10s %10s %8s %s"):format("mode", "median ms", "min ms", "vs none", "buckets"))
for _, m in ipairs(modes) do
   local med = median(m.times)
   local mn = math.huge
   for _, v in ipairs(m.times) do mn = math.min(mn, v) end
   local extra = m.buckets and ("%d (%d started during backward per step)")
      :format(m.buckets, math.floor((m.early or 0) / opt.steps + 0.5)) or ""
   say(("  %-32s %10.1f %10.1f %7.2fx %s"):format(m.name, med * 1e3, mn * 1e3, med / base,
                                                  extra))
end
dist.finalize()
