-- examples/train_imagefolder.lua -- train a ResNet-50 (or --model NAME) on an image folder
-- (ImageNet layout:
-- DIR/<class>/*.jpg|jpeg|png, one sub-folder per class), in channels-last.
--
--   bin/lumen examples/train_imagefolder.lua --data DIR [--model resnet50] [--val DIR]
--       [--epochs 1]
--       [--batch-size 32] [--lr 0.1] [--size 224] [--threads 2] [--workers 2] [--seed 1]
--       [--format nhwc|nchw] [--steps N] [--checkpoint FILE] [--resume] [--quiet]
--       [--label-smoothing 0]
--
-- The images are decoded (libjpeg-turbo / libpng), randomly resized-cropped to --size, flipped
-- and normalised by the loader's worker threads in C, straight into channels-last float32
-- batches, while Lua trains on the previous batch. --val evaluates on a second folder after each
-- epoch (centre crop of the image scaled to size / 0.875, as for ImageNet). --steps stops after N
-- optimizer steps in all (a smoke test: `--size 32 --steps 2` on a tiny folder).
-- --checkpoint writes the model and optimizer after every epoch (atomically); --resume continues
-- from it at the same epoch and batch.
local lm = require("lumen")
local util = require("lumen.util")
io.stdout:setvbuf("line") -- progress shows up at once, also when the output is a file or pipe

---------------------------------------------------------------------------------------------
-- flags
---------------------------------------------------------------------------------------------
local opt, usage = util.parse_flags({
   data = "", val = "", epochs = 1, ["batch-size"] = 32, lr = 0.1, size = 224, threads = 2,
   workers = 2, seed = 1, format = "nhwc", steps = 0, checkpoint = "", resume = false,
   quiet = false, momentum = 0.9, ["weight-decay"] = 1e-4, model = "resnet50",
   ["label-smoothing"] = 0,
}, "bin/lumen examples/train_imagefolder.lua", arg, {
   __description = "Train an image model (resnet50 by default; --model picks any lm.models " ..
      "image family) on an ImageFolder tree (one folder per class), channels-last by default.",
   __order = { "data", "model", "val", "epochs", "batch-size", "lr", "momentum", "weight-decay",
               "label-smoothing", "size",
               "format", "steps", "seed", "checkpoint", "resume", "threads", "workers", "quiet" },
   data = "training images: DIR/<class>/<image> (required)",
   model = "an lm.models constructor: resnet18/50/..., mobilenet_v2, mobilenet_v3_large, " ..
      "mobilenet_v3_small, efficientnet_b0..b3, convnext_tiny/small/base, regnet_y_400mf, " ..
      "regnet_x_400mf, ..., shufflenet_v2_x0_5/x1_0/x1_5/x2_0, ...",
   val = "validation images, the same layout (optional)",
   epochs = "epochs to train",
   ["batch-size"] = "images per optimizer step",
   lr = "learning rate",
   momentum = "SGD momentum",
   ["weight-decay"] = "weight decay",
   ["label-smoothing"] = "cross_entropy's label smoothing, in [0, 1) (torchvision's recipes " ..
      "for the newer families use 0.1)",
   size = "crop size in pixels",
   format = "memory format: nhwc (channels-last) or nchw",
   steps = "stop after N optimizer steps (0: run the epochs)",
   seed = "random seed",
   checkpoint = "checkpoint file (none by default)",
   resume = "continue from --checkpoint",
   threads = "CPU threads",
   workers = "data-loading worker threads",
   quiet = "no progress bar",
})
if opt.data == "" then usage("--data DIR is required") end
if opt.format ~= "nhwc" and opt.format ~= "nchw" then usage("--format is nhwc or nchw") end
for _, k in ipairs({ "epochs", "batch-size", "size", "threads", "workers" }) do
   if opt[k] < 1 or opt[k] % 1 ~= 0 then usage("--" .. k .. " needs a positive integer") end
end
if opt.resume and opt.checkpoint == "" then usage("--resume needs --checkpoint FILE") end
if not (opt["label-smoothing"] >= 0 and opt["label-smoothing"] < 1) then
   usage("--label-smoothing needs a number in [0, 1)")
end
-- the image models lm.models offers (every constructor taking {num_classes =} on 3-channel
-- images; the video models and small_resnet are not for this script)
local MODELS = {}
for name, ctor in pairs(lm.models) do
   if type(ctor) == "function" and name:match("^[a-z]") and not name:match("^r3d") and
      not name:match("^mc3") and not name:match("^r2plus1d") and name ~= "small_resnet" and
      name ~= "install" then
      MODELS[#MODELS + 1] = name
   end
end
table.sort(MODELS)
local known_model = false
for _, n in ipairs(MODELS) do known_model = known_model or n == opt.model end
if not known_model then
   usage("--model " .. opt.model .. " is not one of: " .. table.concat(MODELS, ", "))
end
local fmt = opt.format == "nhwc" and lm.channels_last or lm.contiguous_format
lm.set_num_threads(opt.threads)
lm.manual_seed(opt.seed)

---------------------------------------------------------------------------------------------
-- data
---------------------------------------------------------------------------------------------
local MEAN, STD = lm.data.IMAGENET_MEAN, lm.data.IMAGENET_STD
local train = lm.data.ImageFolder(opt.data, { size = opt.size, crop = "random" })
local loader = lm.data.DataLoader(train, {
   batch_size = opt["batch-size"], shuffle = true, seed = opt.seed, drop_last = true,
   hflip = true, mean = MEAN, std = STD, memory_format = fmt, workers = opt.workers,
   prefetch = opt.workers + 1,
})
if loader:num_batches() == 0 then
   usage(string.format("--batch-size %d is larger than the %d images in %s", opt["batch-size"],
      #train.paths, opt.data))
end
local val_loader
if opt.val ~= "" then
   local val = lm.data.ImageFolder(opt.val, {
      size = opt.size, crop = "center", resize = math.floor(opt.size / 0.875 + 0.5),
      classes = train.classes,
   })
   val_loader = lm.data.DataLoader(val, {
      batch_size = opt["batch-size"], shuffle = false, mean = MEAN, std = STD,
      memory_format = fmt, workers = opt.workers,
   })
end

---------------------------------------------------------------------------------------------
-- model, optimizer, schedule
---------------------------------------------------------------------------------------------
local model = lm.models[opt.model]({ num_classes = #train.classes })
model:to(fmt)

-- no weight decay on batch-norm parameters and biases
local optimizer = lm.optim.SGD(util.decay_groups(model, opt["weight-decay"]),
                               { lr = opt.lr, momentum = opt.momentum, nesterov = true })

local steps_per_epoch = loader:num_batches()
local total_steps = steps_per_epoch * opt.epochs
if opt.steps > 0 then total_steps = math.min(total_steps, opt.steps) end
local warmup = math.min(steps_per_epoch, 500, math.max(1, math.floor(total_steps / 10)))
local lr_at = util.warmup_cosine(opt.lr, warmup, total_steps)

local state = { epoch = 1, batch = 1, step = 0 } -- the next epoch / batch to run
local function save_checkpoint()
   if opt.checkpoint == "" then return end
   lm.save_checkpoint(opt.checkpoint, {
      model = model, optimizer = optimizer, epoch = state.epoch, batch = state.batch,
      step = state.step, seed = opt.seed, classes = train.classes, size = opt.size,
   })
end
if opt.resume then
   local f = io.open(opt.checkpoint, "rb")
   if not f then usage("--resume: no checkpoint at " .. opt.checkpoint) end
   f:close()
   local ck = lm.load_checkpoint(opt.checkpoint, { model = model, optimizer = optimizer })
   state.epoch, state.batch, state.step = ck.epoch, ck.batch, ck.step
   print(string.format("resumed from %s at epoch %d, batch %d", opt.checkpoint, state.epoch,
      state.batch))
end

---------------------------------------------------------------------------------------------
-- progress
---------------------------------------------------------------------------------------------
local tty = util.isatty(1) and not opt.quiet
local now = util.clock
local function report(epoch, b, ips, loss, final)
   local line = string.format("epoch %d/%d  batch %d/%d  step %d  %.1f img/s  loss %.4f",
      epoch, opt.epochs, b, steps_per_epoch, state.step, ips, loss)
   if tty or final or not opt.quiet then util.status(line, tty, final) end
end

---------------------------------------------------------------------------------------------
-- training
---------------------------------------------------------------------------------------------
print(string.format("lumen %s: %s on %s (%d images, %d classes), %dx%d, %s, batch %d, "
   .. "%d epochs, %d threads, %d loader workers", lm._VERSION, opt.model, opt.data, #train.paths,
   #train.classes, opt.size, opt.size, opt.format, opt["batch-size"], opt.epochs, opt.threads,
   opt.workers))

local t_start = now()
-- the loss's options: label smoothing when asked (PyTorch's cross_entropy label_smoothing)
local smoothing = opt["label-smoothing"] > 0 and { label_smoothing = opt["label-smoothing"] }
   or nil

local function run()
   model:train()
   while state.epoch <= opt.epochs and state.step < total_steps do
      local epoch = state.epoch
      local t0, seen, loss_avg = now(), 0, nil
      for x, y, b in loader:iter(epoch, state.batch) do
         util.set_lr(optimizer, lr_at(state.step))
         optimizer:zero_grad()
         local loss = lm.F.cross_entropy(model(x), y, smoothing)
         loss:backward()
         optimizer:step()
         local l = loss:item()
         if l ~= l then error("the loss is NaN at step " .. state.step) end
         loss_avg = loss_avg and (0.98 * loss_avg + 0.02 * l) or l
         seen = seen + x:size(1)
         state.batch, state.step = b + 1, state.step + 1
         local done = b == steps_per_epoch or state.step >= total_steps
         report(epoch, b, seen / math.max(now() - t0, 1e-9), loss_avg, done)
         if state.step >= total_steps then break end
      end
      local finished = state.batch > steps_per_epoch
      if finished then state.epoch, state.batch = epoch + 1, 1 end
      save_checkpoint()
      local msg = finished
         and string.format("epoch %d done: %.0f s elapsed", epoch, now() - t_start)
         or string.format("stopped in epoch %d before batch %d (--steps %d): %.0f s elapsed", epoch,
            state.batch, opt.steps, now() - t_start)
      if val_loader then
         local acc = util.accuracy(lm, model, val_loader)
         msg = msg .. string.format(", validation accuracy %.2f%%", 100 * acc)
      end
      print(msg)
   end
end

util.run_interruptible(run, function()
   save_checkpoint()
   local saved = opt.checkpoint ~= "" and
      (" (saved " .. opt.checkpoint .. "; resume with --resume)") or ""
   print(string.format("interrupted at epoch %d, batch %d%s", state.epoch, state.batch, saved))
end)
print(string.format("trained %d steps in %.1f s", state.step, now() - t_start))
