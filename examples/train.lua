-- examples/train.lua -- train a small ResNet on Fashion-MNIST in channels-last (or NCHW).
--
--   bin/lumen examples/train.lua [--model small_resnet] [--epochs 12] [--batch-size 128]
--       [--lr 0.1] [--schedule warmup-cosine] [--format nhwc|nchw]
--       [--data /usr/share/datasets/fashion-mnist] [--checkpoint train.ckpt] [--resume]
--       [--force] [--threads 2] [--seed 1] [--width 16] [--blocks 1] [--limit N] [--quiet]
--       [--log run.jsonl] [--amp bf16|fp16] [--distributed] [--sync-bn] [--save-every N]
--       [--device cpu|cuda|cuda:N] [--cuda-graph]
--   bin/lumen examples/train.lua -h      every flag, its default and meaning
--
-- --device cuda trains on the GPU (the model, the optimizer's state and each batch there; the
-- data is loaded and augmented on the CPU). --cuda-graph captures the training step (forward,
-- loss, backward, optimizer) in a CUDA graph after the first step and replays it for every
-- later batch (docs/cuda.md, "CUDA graphs"): the batch is copied into the graph's input
-- tensors, the schedule reaches the captured step through the optimizer's capturable learning
-- rate, and the results equal the eager run's. Not with --distributed or --amp fp16 (the
-- GradScaler reads its check back every step); a model with dropout cannot be captured.
--
-- --schedule picks the learning-rate schedule, an lm.optim.lr_scheduler (docs/training.md):
-- warmup-cosine (default: a linear warm-up over the first epoch, at most 200 steps, then a
-- cosine to zero, per step: LambdaLR), onecycle (OneCycleLR, per step, momentum cycled), cosine
-- (CosineAnnealingLR over the epochs), step (StepLR, x0.1 every third of the run), multistep
-- (MultiStepLR, x0.1 at 50% and 75%), exponential (ExponentialLR, x0.9 per epoch), plateau
-- (ReduceLROnPlateau on the test accuracy), constant.
--
-- --distributed trains data-parallel over the processes of an MPI job (docs/distributed.md):
--   mpirun -np 2 bin/lumen examples/train.lua --distributed --threads 1
-- --batch-size stays the global batch (each rank runs batch-size / world-size samples of its
-- DistributedSampler share); the model is wrapped in nn.parallel.DistributedDataParallel, which
-- averages the gradients while backward runs, so every rank takes the same optimizer steps as
-- one process with the global batch. Rank 0 alone prints, evaluates, writes the log and the
-- checkpoint (the plain model's state: a distributed checkpoint resumes without --distributed
-- and the other way round); --resume reads the checkpoint on every rank (one machine, or a
-- shared file system). --sync-bn uses nn.SyncBatchNorm (statistics over the global batch);
-- without it each rank's batch norms use the rank's own samples, as PyTorch's DDP.
--
-- --amp bf16 runs the forward pass and the loss under lm.autocast({dtype = lm.bfloat16}):
-- convolutions and linear layers in bfloat16, batch-norm statistics, softmax and the loss in
-- float32, the weights and the optimizer in float32 (docs/mixed_precision.md). --amp fp16 uses
-- float16 and a GradScaler (loss scaling; steps with inf/NaN gradients are skipped).
--
-- Prints a progress bar (images/s, loss, ETA), the test accuracy after every epoch, and writes a
-- checkpoint after every epoch (atomically: a temporary file renamed over the old one), and the
-- best one so far (by test accuracy) to CHECKPOINT.best. --resume continues from the checkpoint
-- exactly (model, optimizer, schedule, epoch and the position in the epoch). Ctrl-C saves a
-- checkpoint at the current step, then exits.
--
-- --save-every N also writes the checkpoint after every N optimizer steps (all ranks take part:
-- every rank's random state is gathered; rank 0 writes). Every write of the checkpoint keeps the
-- one before as CHECKPOINT.prev, and checkpoints carry a checksum (lm.save_checkpoint), so a
-- resume whose CHECKPOINT is damaged or missing uses CHECKPOINT.prev instead.
--
-- Under bin/lumen-run (a job that restarts itself after a failure; docs/distributed.md,
-- "Surviving failures") a restarted start (LUMEN_RESTART_COUNT > 0) resumes by itself from the
-- newest usable checkpoint this job wrote (its LUMEN_RUN_ID), as --resume would, and the rank
-- calls lm.distributed.heartbeat() every step (and while it waits for rank 0's evaluation), for
-- the launcher's watchdog. The final parameters are those of a run without failures:
--   bin/lumen-run -np 2 --max-restarts 4 --watchdog 30 -- examples/train.lua --distributed \
--       --threads 1 --save-every 50
--
-- A run never loses another: the checkpoint records the run's configuration (the flags that
-- change what is trained). --resume with a configuration that differs refuses and names each
-- differing flag (--epochs may grow, except for the schedules that span the run); a new run
-- refuses to replace the checkpoint of another configuration, and says how to keep both
-- (--checkpoint PATH) or replace it (--force).
--
-- --log FILE writes one JSON object per line (JSON Lines, encoded by lumen's JSON library): a
-- "start" record, one "step" record per optimizer step (loss, lr, images/s, time) and one "epoch"
-- record per epoch (mean train loss, test accuracy, live/peak tensor bytes); every record has
-- lumen's version. Every line is flushed as it is written, so a crash or Ctrl-C loses nothing;
-- --resume appends to the file. Plot it with
-- `bin/lumen tools/plot.lua FILE -o curves.png` (docs/training.md).
local lm = require("lumen")

local util = require("lumen.util")
io.stdout:setvbuf("line") -- progress shows up at once, also when the output is a file or pipe

---------------------------------------------------------------------------------------------
-- flags
---------------------------------------------------------------------------------------------
local FLAG_HELP = {
   __description = "Train a small ResNet on Fashion-MNIST, channels-last by default " ..
      "(docs/training.md).",
   __order = { "model", "epochs", "batch-size", "lr", "schedule", "momentum", "weight-decay",
               "format", "amp", "data", "limit", "width", "blocks", "seed", "checkpoint",
               "save-every", "resume", "force", "log", "threads", "workers", "eval-batch", "quiet",
               "distributed", "sync-bn", "device", "cuda-graph" },
   model = "model: small_resnet, or any lm.models name (resnet18, ...)",
   epochs = "epochs to train (--resume may raise it)",
   ["batch-size"] = "images per optimizer step (the global batch with --distributed)",
   lr = "peak learning rate",
   schedule = "learning-rate schedule: warmup-cosine, onecycle, cosine, step, multistep, " ..
      "exponential, plateau, constant",
   momentum = "SGD momentum (Nesterov)",
   ["weight-decay"] = "weight decay (not on biases and batch-norm parameters)",
   format = "memory format of activations and weights: nhwc (channels-last) or nchw",
   amp = "mixed precision: bf16 (autocast) or fp16 (autocast and loss scaling)",
   data = "folder with the Fashion-MNIST IDX files (default: /usr/share/datasets/fashion-mnist)",
   limit = "use only the first N training and test images (0: all)",
   width = "small_resnet: channels of the first stage",
   blocks = "small_resnet: residual blocks per stage",
   seed = "random seed (weights, shuffling, augmentation)",
   checkpoint = "checkpoint file (the one before is kept in CHECKPOINT.prev, the best epoch " ..
      "in CHECKPOINT.best)",
   ["save-every"] = "also write the checkpoint every N optimizer steps (0: at the end of " ..
      "every epoch only)",
   resume = "continue the run saved in --checkpoint (its configuration must match)",
   force = "replace a checkpoint of another configuration; with --resume, resume despite " ..
      "differences",
   log = "write JSON Lines records (start, step, epoch) to this file",
   threads = "CPU threads",
   workers = "data-loading worker threads",
   ["eval-batch"] = "batch size of the test-set evaluation",
   quiet = "no progress bar",
   distributed = "data-parallel over the processes of an MPI job (mpirun -np K ...)",
   ["sync-bn"] = "with --distributed: batch-norm statistics over the global batch",
   device = "where the model trains: cpu, cuda or cuda:N",
   ["cuda-graph"] = "with --device cuda: capture the training step in a CUDA graph and " ..
      "replay it for every batch after the first",
}
local opt, usage = util.parse_flags({
   model = "small_resnet", epochs = 12, ["batch-size"] = 128, lr = 0.1, format = "nhwc",
   data = "", checkpoint = "train.ckpt", resume = false, threads = 2, seed = 1, width = 16,
   blocks = 1, limit = 0, quiet = false, momentum = 0.9, ["weight-decay"] = 5e-4,
   workers = 2, ["eval-batch"] = 500, log = "", amp = "", distributed = false,
   ["sync-bn"] = false, schedule = "warmup-cosine", force = false, ["save-every"] = 0,
   device = "cpu", ["cuda-graph"] = false,
}, "bin/lumen examples/train.lua", arg, FLAG_HELP)
local device = opt.device
if device ~= "cpu" and device ~= "cuda" and not device:match("^cuda:%d+$") then
   usage("--device is cpu, cuda or cuda:N; got '" .. device .. "'")
end
local on_gpu = device ~= "cpu"
if on_gpu and not lm.cuda.is_available() then
   usage("--device " .. device .. ": CUDA is not available on this machine")
end
if opt["cuda-graph"] then
   if not on_gpu then usage("--cuda-graph needs --device cuda") end
   if opt.distributed then usage("--cuda-graph does not go with --distributed") end
   if opt.amp == "fp16" then
      usage("--cuda-graph does not go with --amp fp16 (the loss scaler reads its inf check " ..
            "back every step); --amp bf16 needs no scaler")
   end
end
if opt.format ~= "nhwc" and opt.format ~= "nchw" then usage("--format is nhwc or nchw") end
local fmt = opt.format == "nhwc" and lm.channels_last or lm.contiguous_format
if opt.amp ~= "" and opt.amp ~= "bf16" and opt.amp ~= "fp16" then
   usage("--amp is bf16 or fp16")
end
-- mixed precision: the autocast options (nil: float32 throughout)
local amp_opts = opt.amp == "bf16" and { dtype = lm.bfloat16 } or
   opt.amp == "fp16" and { dtype = lm.float16 } or nil
if opt["save-every"] < 0 or opt["save-every"] % 1 ~= 0 then
   usage("--save-every is a whole number of steps (0: at the end of every epoch only)")
end
lm.set_num_threads(opt.threads)
lm.manual_seed(opt.seed)

-- under bin/lumen-run: the restart count (0 on the first start and outside lumen-run), and the
-- heartbeat its watchdog watches (a no-op function otherwise)
local restart_count = lm.distributed.restart_count()
local heartbeat = os.getenv("LUMEN_HEARTBEAT_DIR") and lm.distributed.heartbeat or function() end
local RUN_ID = os.getenv("LUMEN_RUN_ID")

-- data parallel over an MPI job: rank 0 is the one that talks and writes
local dist = opt.distributed and lm.distributed or nil
local rank, world = 0, 1
if dist then
   dist.init({ backend = "mpi" })
   rank, world = dist.rank(), dist.world_size()
   heartbeat()
   if opt["batch-size"] % world ~= 0 then
      usage(("--batch-size %d is the global batch: it must be a multiple of the %d processes")
            :format(opt["batch-size"], world))
   end
elseif opt["sync-bn"] then
   usage("--sync-bn needs --distributed")
end
local main = rank == 0
local print = main and print or function() end
local local_batch = opt["batch-size"] / world

-- the ranks other than 0 wait for rank 0 (its evaluation, its checkpoint) in a non-blocking
-- barrier, with heartbeats, so that the watchdog does not take a wait for a hang
local ffi = require("ffi")
pcall(ffi.cdef, "int usleep(unsigned int usec);")
local function wait_for_all()
   if not dist then return end
   local w = dist.barrier({ async = true })
   local t = util.clock()
   while not w:is_completed() do
      if util.clock() - t > 0.1 then
         heartbeat()
         t = util.clock()
      end
      ffi.C.usleep(2000)
   end
   heartbeat()
end

---------------------------------------------------------------------------------------------
-- data, model, optimizer, schedule
---------------------------------------------------------------------------------------------
local data_dir = opt.data ~= "" and opt.data or nil
local train = lm.data.fashion_mnist("train", data_dir)
local test = lm.data.fashion_mnist("test", data_dir)
if opt.limit > 0 then
   local n = math.min(opt.limit, train.images:size(1))
   train = { images = train.images:narrow(1, 1, n), labels = train.labels:narrow(1, 1, n) }
   local m = math.min(opt.limit, test.images:size(1))
   test = { images = test.images:narrow(1, 1, m), labels = test.labels:narrow(1, 1, m) }
end
local MEAN, STD = 0.2860, 0.3530 -- Fashion-MNIST pixel statistics
local loader = lm.data.DataLoader(train, {
   batch_size = local_batch, shuffle = true, seed = opt.seed, drop_last = true,
   memory_format = fmt, pad = 2, crop = 28, hflip = true, mean = { MEAN }, std = { STD },
   workers = opt.workers, prefetch = 3,
   -- each rank its share of every epoch's order (one process: the loader's own order)
   sampler = dist and lm.data.DistributedSampler(train, { seed = opt.seed }) or nil,
})
local test_loader = lm.data.DataLoader(test, {
   batch_size = opt["eval-batch"], shuffle = false, memory_format = fmt, mean = { MEAN },
   std = { STD }, workers = opt.workers,
})
-- the test loader for util.accuracy, with a heartbeat per batch (a long evaluation is progress)
local beating_test_loader = {
   iter = function(_, ...)
      local it = test_loader:iter(...)
      return function()
         heartbeat()
         local x, y = it()
         if x ~= nil and on_gpu then x, y = x:to(device), y:to(device) end
         return x, y
      end
   end,
}
heartbeat()

local ctor = lm.models[opt.model]
if not ctor then usage("unknown model '" .. opt.model .. "'") end
local model
if opt.model == "small_resnet" then
   model = ctor({ num_classes = 10, width = opt.width, blocks = opt.blocks })
else
   model = ctor({ num_classes = 10 })
end
model:to(fmt)
if on_gpu then model:to(device) end
heartbeat()
if opt["sync-bn"] then model = lm.nn.SyncBatchNorm.convert_sync_batchnorm(model) end

-- no weight decay on batch-norm parameters and biases
-- (capturable: the learning rate on the device, so a captured step follows the schedule)
local optimizer = lm.optim.SGD(util.decay_groups(model, opt["weight-decay"]),
                               { lr = opt.lr, momentum = opt.momentum, nesterov = true,
                                 capturable = opt["cuda-graph"] })

-- float16 needs loss scaling (its range is small); bfloat16 has float32's range
local scaler = opt.amp == "fp16" and lm.amp.GradScaler() or nil

local steps_per_epoch = loader:num_batches()
local total_steps = steps_per_epoch * opt.epochs

-- the learning-rate schedule (lm.optim.lr_scheduler): stepped after every optimizer step
-- (per_step) or after every epoch
local S = lm.optim.lr_scheduler
local SCHEDULES = {
   ["warmup-cosine"] = function()
      local lr_at = util.warmup_cosine(1.0, math.min(steps_per_epoch, 200), total_steps)
      return S.LambdaLR(optimizer, { lr_lambda = lr_at }), true
   end,
   onecycle = function()
      return S.OneCycleLR(optimizer, { max_lr = opt.lr, total_steps = total_steps }), true
   end,
   cosine = function() return S.CosineAnnealingLR(optimizer, { T_max = opt.epochs }) end,
   step = function()
      return S.StepLR(optimizer, { step_size = math.max(1, math.floor(opt.epochs / 3)) })
   end,
   multistep = function()
      return S.MultiStepLR(optimizer, { milestones = { math.floor(opt.epochs * 0.5),
                                                       math.floor(opt.epochs * 0.75) } })
   end,
   exponential = function() return S.ExponentialLR(optimizer, { gamma = 0.9 }) end,
   plateau = function()
      return S.ReduceLROnPlateau(optimizer, { mode = "max", patience = 1 })
   end,
   constant = function() return nil end,
}
-- the schedules whose shape spans the whole run: --epochs may not change on --resume
local SPANS_RUN = { onecycle = true, cosine = true, step = true, multistep = true }
if not SCHEDULES[opt.schedule] then
   local names = {}
   for k in pairs(SCHEDULES) do names[#names + 1] = k end
   table.sort(names)
   usage("--schedule is one of " .. table.concat(names, ", ") .. "; got '" .. opt.schedule .. "'")
end
local scheduler, per_step = SCHEDULES[opt.schedule]()

---------------------------------------------------------------------------------------------
-- checkpoints
---------------------------------------------------------------------------------------------
local state = { epoch = 1, batch = 1, step = 0, best_acc = -1 } -- the next epoch / batch

-- the flags that change what a run trains: recorded in the checkpoint, compared on --resume
local CONFIG_FLAGS = { "data", "limit", "batch-size", "format", "model", "width", "blocks",
                       "amp", "seed", "lr", "momentum", "weight-decay", "schedule" }
local config = {}
for _, k in ipairs(CONFIG_FLAGS) do config[k] = opt[k] end
config.epochs = opt.epochs

-- the differences between this run's configuration and a checkpoint's, one "--flag A (was B)"
-- each; --epochs may grow unless the schedule spans the run
local function config_diffs(old, resuming)
   local diffs = {}
   for _, k in ipairs(CONFIG_FLAGS) do
      if old[k] ~= config[k] then
         diffs[#diffs + 1] = ("--%s %s (the checkpoint's run: %s)"):format(k,
            tostring(config[k] == "" and '""' or config[k]),
            tostring(old[k] == "" and '""' or old[k]))
      end
   end
   local oe = old.epochs
   if oe ~= nil and oe ~= opt.epochs and (not resuming or opt.epochs < oe or
                                         SPANS_RUN[opt.schedule]) then
      diffs[#diffs + 1] = ("--epochs %d (the checkpoint's run: %d%s)"):format(opt.epochs, oe,
         resuming and (SPANS_RUN[opt.schedule] and "; the " .. opt.schedule ..
                       " schedule spans the run" or "; --epochs may only grow") or "")
   end
   return diffs
end

-- every rank's random state (rank r's at [r + 1]); a collective under --distributed
local function rng_states()
   local st = lm.get_rng_state()
   if not dist then return { st } end
   local all = dist.all_gather(lm.tensor(st, { dtype = lm.int64 }))
   local out = {}
   for r = 1, #all do out[r] = { all[r][1], all[r][2] } end
   return out
end

-- rngs: rng_states() (nil: rank 0's state only, as at Ctrl-C, where the ranks do not meet)
local function save_checkpoint(path, rngs)
   lm.save_checkpoint(path, {
      model = model, optimizer = optimizer,
      fields = { epoch = state.epoch, batch = state.batch, step = state.step,
                 best_acc = state.best_acc, config = config, version = lm._VERSION,
                 rng = rngs and rngs[1] or lm.get_rng_state(), rng_ranks = rngs, world = world,
                 run_id = RUN_ID,
                 scheduler = scheduler and scheduler:state_dict() or nil,
                 scaler = scaler and scaler:state_dict() or nil },
   })
end

local function exists(path)
   local f = io.open(path, "rb")
   if f then f:close() end
   return f ~= nil
end

-- the checkpoint is written over CHECKPOINT, and the one there before is kept as
-- CHECKPOINT.prev: a damaged CHECKPOINT falls back to it. latest_usable is false after a resume
-- that had to skip CHECKPOINT, which is then dropped rather than kept as the previous one.
-- The new one is written (atomically) beside it first, then the two renames: a failure at any
-- moment leaves CHECKPOINT or CHECKPOINT.prev whole.
local PREV = opt.checkpoint .. ".prev"
local latest_usable = true
local function save_main(rngs)
   local new = opt.checkpoint .. ".new"
   save_checkpoint(new, rngs)
   if exists(opt.checkpoint) then
      if latest_usable then
         local ok, err = os.rename(opt.checkpoint, PREV)
         if not ok then
            error("examples/train.lua: cannot keep the previous checkpoint: " .. tostring(err), 0)
         end
      else
         os.remove(opt.checkpoint)
      end
   end
   local ok, err = os.rename(new, opt.checkpoint)
   if not ok then error("examples/train.lua: cannot write the checkpoint: " .. tostring(err), 0) end
   latest_usable = true
end

-- the configuration a checkpoint file records (nil, why: not a checkpoint of this trainer)
local function checkpoint_config(path)
   local ok, ck = pcall(lm.load_checkpoint, path)
   if not ok then return nil, tostring(ck):gsub("^.-lumen%.load_checkpoint: ", "") end
   local f = ck.fields
   if type(f) ~= "table" or type(f.config) ~= "table" then
      return nil, "it records no configuration (written by another program or an older lumen)"
   end
   return f.config, f
end

-- the checkpoint a resume reads: CHECKPOINT, or CHECKPOINT.prev when CHECKPOINT is missing or
-- cannot be loaded (damaged, truncated); after a restart (auto) only one written by this job
-- (LUMEN_RUN_ID). Returns path or nil, and a note per file passed over.
local function choose_checkpoint(auto)
   local notes = {}
   for _, path in ipairs({ opt.checkpoint, PREV }) do
      if exists(path) then
         local ok, ck = pcall(lm.load_checkpoint, path)
         local why
         if not ok then
            why = tostring(ck):gsub("^.-lumen%.load_checkpoint: ", "")
         elseif auto and (type(ck.fields) ~= "table" or ck.fields.run_id ~= RUN_ID or
                          RUN_ID == nil) then
            why = "it was not written by this job (LUMEN_RUN_ID " .. tostring(RUN_ID) .. ")"
         end
         if why == nil then return path, notes end
         notes[#notes + 1] = ("%s cannot be used: %s"):format(path, why)
      end
   end
   return nil, notes
end

-- net: what the training step calls (the model, or its DistributedDataParallel wrapper, made
-- after the resume has loaded the checkpoint; the wrapper broadcasts rank 0's weights anyway)
local net = model
local auto_resume = restart_count > 0 and not opt.resume
local resumed = false
if opt.resume or auto_resume then
   local path, notes = choose_checkpoint(auto_resume)
   for _, n in ipairs(notes) do print(n) end
   if path == nil then
      if opt.resume then
         usage(#notes > 0 and "--resume: no usable checkpoint (" .. table.concat(notes, "; ") ..
               ")" or "--resume: no checkpoint at " .. opt.checkpoint)
      end
      print(("restart %d: no checkpoint of this job yet; training from the start")
            :format(restart_count))
   else
      if path ~= opt.checkpoint then
         latest_usable = false
         print(("resuming from %s, the checkpoint before the latest"):format(path))
      end
      local old, why = checkpoint_config(path)
      if old == nil then
         if not opt.force then
            usage(("--resume: %s cannot be checked: %s; --force resumes it anyway")
                  :format(path, why))
         end
      else
         local diffs = config_diffs(old, true)
         if #diffs > 0 then
            local msg = ("%s: %s is a run of another configuration:\n  %s")
               :format(opt.resume and "--resume" or "restart " .. restart_count, path,
                       table.concat(diffs, "\n  "))
            if not opt.force then
               usage(msg .. "\nResume with the same flags, start a new run with --checkpoint " ..
                     "PATH, or resume anyway with --force")
            end
            print(msg .. "\n(--force: resuming anyway)")
         end
      end
      local ck = lm.load_checkpoint(path, { model = model, optimizer = optimizer })
      local fields = ck.fields
      state.epoch, state.batch, state.step = fields.epoch, fields.batch, fields.step
      state.best_acc = fields.best_acc or -1
      -- every rank's own random state when the checkpoint has them for this many ranks
      local rr = fields.rng_ranks
      if type(rr) == "table" and fields.world == world and type(rr[rank + 1]) == "table" then
         lm.set_rng_state(rr[rank + 1])
      elseif fields.rng then
         lm.set_rng_state(fields.rng)
      end
      if scheduler and type(fields.scheduler) == "table" then
         scheduler:load_state_dict(fields.scheduler)
      end
      if scaler and fields.scaler and next(fields.scaler) then
         scaler:load_state_dict(fields.scaler)
      end
      resumed = true
      print(string.format("%sresumed from %s at epoch %d, batch %d (step %d)",
                          auto_resume and ("restart %d: "):format(restart_count) or "", path,
                          state.epoch, state.batch, state.step))
   end
elseif main and exists(opt.checkpoint) then
   -- a new run: never replace the checkpoint of another run without being told
   local old, why = checkpoint_config(opt.checkpoint)
   local diffs = old and config_diffs(old, false) or nil
   if (old == nil or #diffs > 0) and not opt.force then
      usage(("%s already holds %s:\n  %s\nResume it with --resume, keep both with " ..
             "--checkpoint PATH, or replace it with --force"):format(opt.checkpoint,
             old and "the checkpoint of another configuration" or "a file this run would replace",
             old and table.concat(diffs, "\n  ") or why))
   end
end
if dist then
   -- every rank must have read the same checkpoint (one machine, or a shared file system)
   local steps = dist.all_gather(lm.tensor({ state.step }, { dtype = lm.int64 }))
   for r = 1, world do
      if steps[r][1] ~= state.step then
         error(("examples/train.lua: rank %d starts at step %d but rank %d at step %d: every " ..
                "rank must read the same checkpoint (keep it on a file system they share)")
               :format(rank, state.step, r - 1, steps[r][1]), 0)
      end
   end
   heartbeat()
end
if dist then net = lm.nn.parallel.DistributedDataParallel(model) end

---------------------------------------------------------------------------------------------
-- the JSON Lines log (--log)
---------------------------------------------------------------------------------------------
-- Records are encoded by lumen's JSON library (lua-cjson, or dkjson: lumen.serialize.json). JSON
-- has no NaN or infinity: a diverged loss is written as null, as is every field without a value.
local json = require("lumen.serialize").json
local log_file
local function json_value(v)
   if v == nil then return json.null end
   if type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
      return json.null
   end
   return v
end

-- log_record("step", "loss", 0.5, "lr", 0.1, ...): one line, flushed at once; every record
-- has the event and lumen's version
local function log_record(event, ...)
   if not log_file then return end
   local rec = { event = event, version = lm._VERSION }
   for i = 1, select("#", ...), 2 do
      local k, v = select(i, ...)
      rec[k] = json_value(v)
   end
   local text, jerr = json.encode(rec)
   if not text then
      error("examples/train.lua: cannot encode a log record: " .. tostring(jerr), 0)
   end
   local ok, err = log_file:write(text .. "\n")
   if ok then ok, err = log_file:flush() end
   if not ok then error("examples/train.lua: cannot write the log " .. opt.log .. ": " ..
                        tostring(err), 0) end
end

if opt.log ~= "" and main then
   -- a resumed run continues the log of the run it resumes
   local err
   log_file, err = io.open(opt.log, resumed and "a" or "w")
   if not log_file then usage("--log: cannot open " .. opt.log .. ": " .. tostring(err)) end
   log_record("start", "model", opt.model, "format", opt.format, "schedule", opt.schedule,
      "batch_size", opt["batch-size"], "epochs", opt.epochs, "lr", opt.lr,
      "steps_per_epoch", steps_per_epoch, "train_images", train.images:size(1),
      "test_images", test.images:size(1), "threads", opt.threads, "seed", opt.seed,
      "amp", opt.amp ~= "" and opt.amp or nil,
      "resumed_at_step", resumed and state.step or nil, "restart", restart_count > 0 and
      restart_count or nil, "unix_time", os.time())
end

---------------------------------------------------------------------------------------------
-- progress
---------------------------------------------------------------------------------------------
local tty = util.isatty(1) and not opt.quiet and main
local now = util.clock
local function progress(epoch, b, nb, ips, loss, eta, final)
   if not main then return end
   if not tty and not final and b % math.max(1, math.floor(nb / 4)) ~= 0 then return end
   local width = 24
   local filled = math.floor(width * b / nb)
   local bar = string.rep("=", filled) .. (filled < width and ">" or "") ..
      string.rep(" ", math.max(0, width - filled - 1))
   util.status(string.format("epoch %d/%d [%s] %d/%d  %.0f img/s  loss %.4f  ETA %s",
      epoch, opt.epochs, bar, b, nb, ips, loss, util.hms(eta)), tty, final)
end

---------------------------------------------------------------------------------------------
-- training
---------------------------------------------------------------------------------------------
print(string.format("lumen %s: %s on Fashion-MNIST (%d train, %d test), %s, batch %d, %d epochs, "
   .. "%d threads%s%s", lm._VERSION, opt.model, train.images:size(1), test.images:size(1),
   opt.format, opt["batch-size"], opt.epochs, opt.threads,
   amp_opts and (", mixed precision " .. opt.amp) or "",
   dist and (", %d processes x batch %d (MPI)%s"):format(world, local_batch,
                                                        opt["sync-bn"] and ", SyncBatchNorm" or "")
   or ""))

local t_start = now()
local print_losses = os.getenv("LUMEN_TRAIN_PRINT_LOSSES") == "1" -- for the resume spec
local last_acc
local function forward_loss(x, y) return lm.F.cross_entropy(net(x), y) end

-- --cuda-graph: the step captured once (after one eager step, which makes the optimizer's
-- state) on static input tensors, then replayed; graph_step returns the loss tensor the graph
-- rewrites
local graph, static_x, static_y, static_loss
local eager_steps = 0
local function graph_step(x, y)
   if graph == nil then
      static_x = lm.empty_like(x):contiguous(fmt)
      static_y = lm.empty_like(y)
      static_x:copy_(x)
      static_y:copy_(y)
      optimizer:zero_grad(true) -- the gradients are made inside the capture
      graph = lm.cuda.CUDAGraph()
      static_loss = lm.cuda.graph(graph, function()
         local loss
         if amp_opts then
            loss = lm.autocast(amp_opts, forward_loss, static_x, static_y)
         else
            loss = forward_loss(static_x, static_y)
         end
         loss:backward()
         optimizer:step()
         return loss
      end, { device = device })
   end
   static_x:copy_(x)
   static_y:copy_(y)
   graph:replay()
   return static_loss
end

local function run()
   model:train()
   while state.epoch <= opt.epochs do
      local epoch = state.epoch
      local t0, seen, loss_avg = now(), 0, nil
      local loss_sum, loss_n = 0, 0
      for x, y, b in loader:iter(epoch, state.batch) do
         local lr = optimizer.param_groups[1].lr
         if on_gpu then x, y = x:to(device), y:to(device) end
         local loss
         -- the graph is captured once this process has taken an eager step
         local replayed = opt["cuda-graph"] and (graph ~= nil or eager_steps > 0)
         if replayed then
            loss = graph_step(x, y)
         else
            eager_steps = eager_steps + 1
            optimizer:zero_grad()
            if amp_opts then
               loss = lm.autocast(amp_opts, forward_loss, x, y) -- float32 (cross_entropy's policy)
            else
               loss = forward_loss(x, y)
            end
         end
         -- (a replay did the backward and the optimizer step itself)
         if not replayed and scaler then
            scaler:scale(loss):backward()
            scaler:step(optimizer)          -- skipped when a gradient overflowed
            scaler:update()
         elseif not replayed then
            loss:backward()
            optimizer:step()
         end
         if scheduler and per_step then scheduler:step() end
         local l = loss:item()
         loss_avg = loss_avg and (0.98 * loss_avg + 0.02 * l) or l
         loss_sum, loss_n = loss_sum + l, loss_n + 1
         seen = seen + x:size(1) * world
         state.batch, state.step = b + 1, state.step + 1
         local dt = now() - t0
         local ips = seen / math.max(dt, 1e-9)
         local eta = (total_steps - state.step) * opt["batch-size"] / ips
         progress(epoch, b, steps_per_epoch, ips, loss_avg, eta, b == steps_per_epoch)
         log_record("step", "step", state.step, "epoch", epoch, "batch", b, "loss", l, "lr", lr,
            "images_per_s", ips, "time", now() - t_start)
         if print_losses then
            print(string.format("step %d loss %.9g", state.step, l))
         end
         heartbeat()
         -- --save-every: the end of an epoch saves anyway (after its evaluation)
         if opt["save-every"] > 0 and state.step % opt["save-every"] == 0 and
            b < steps_per_epoch then
            local rngs = rng_states()
            if main then save_main(rngs) end
            wait_for_all()
         end
      end
      local epoch_time = now() - t0
      state.epoch, state.batch = epoch + 1, 1
      if main then
         if amp_opts then
            last_acc = lm.autocast(amp_opts, util.accuracy, lm, model, beating_test_loader)
         else
            last_acc = util.accuracy(lm, model, beating_test_loader)
         end
      end
      wait_for_all()
      if scheduler and not per_step then
         -- ReduceLROnPlateau watches the test accuracy (every rank gets rank 0's)
         if opt.schedule == "plateau" then
            local acc = last_acc or 0
            if dist then
               local t = lm.tensor({ acc }, { dtype = lm.float64 })
               dist.broadcast(t, { root = 0 })
               acc = t[1]
            end
            scheduler:step(acc)
         else
            scheduler:step()
         end
      end
      local rngs = rng_states()
      if main then
         save_main(rngs)
         if last_acc > state.best_acc then
            state.best_acc = last_acc
            save_checkpoint(opt.checkpoint .. ".best", rngs)
         end
      end
      wait_for_all()
      log_record("epoch", "epoch", epoch, "step", state.step,
         "train_loss", loss_n > 0 and loss_sum / loss_n or nil, "test_accuracy", last_acc,
         "images_per_s", seen / math.max(epoch_time, 1e-9), "epoch_time", epoch_time,
         "live_bytes", lm.memory.live_bytes(), "peak_bytes", lm.memory.peak_bytes(),
         "time", now() - t_start)
      if main then
         print(string.format("epoch %d: test accuracy %.2f%%  (%.0f s elapsed, checkpoint %s, "
            .. "tensor memory %.1f MB live, %.1f MB peak)", epoch, 100 * last_acc,
            now() - t_start, opt.checkpoint, lm.memory.live_bytes() / 2 ^ 20,
            lm.memory.peak_bytes() / 2 ^ 20))
      end
   end
end

util.run_interruptible(run, function()
   if not main then return end
   save_main(nil)
   log_record("interrupted", "step", state.step, "epoch", state.epoch, "batch", state.batch,
      "time", now() - t_start)
   print(string.format("interrupted: saved %s at epoch %d, batch %d (resume with --resume)",
                       opt.checkpoint, state.epoch, state.batch))
end)
if log_file then log_file:close() end
if dist then dist.finalize() end
if last_acc then
   print(string.format("final test accuracy: %.2f%% in %.1f s (%s%s)", 100 * last_acc,
                       now() - t_start, opt.format, amp_opts and (", amp " .. opt.amp) or ""))
end
