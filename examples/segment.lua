-- examples/segment.lua -- semantic segmentation with a small UNet, trained channels-last on
-- images the script draws itself (docs/segmentation.md).
--
--   bin/lumen examples/segment.lua [--epochs 10] [--batch-size 16] [--lr 0.004] [--size 32]
--       [--shapes 2] [--noise 0.15] [--train 2048] [--test 512] [--width 16] [--depth 2]
--       [--groups 4] [--act relu|silu] [--up convt|upsample] [--seed 1] [--threads 2]
--       [--save FILE] [--quiet]
--   bin/lumen examples/segment.lua -h      every flag, its default and meaning
--
-- The data: --size x --size RGB images of a background of a random colour with --shapes shapes
-- drawn on it, each a filled circle (radius 0.14 .. 0.25 of the side) or a filled bar (an
-- axis-aligned rectangle, 0.1 .. 0.2 of the side across and 0.4 .. 0.8 along, horizontal or
-- vertical), of a random colour at least 0.25 from the background's in every channel, at a
-- random place (a later shape covers an earlier one), plus Gaussian noise (--noise). Each
-- pixel's class is 1 background, 2 circle, 3 bar: lumen's class indices are 1-based, like
-- argmax's (PyTorch's classes 0..2, plus one). Colours say nothing about the class: the network
-- tells a circle from a bar by its shape. The images come from lm.rand / lm.randn after
-- lm.manual_seed(--seed), so a run is reproducible; the held-out set is drawn after the
-- training set from the same generator.
--
-- The model: a UNet of --depth max-pool levels. Each block is two 3x3 Conv2d + GroupNorm + ReLU
-- (or SiLU); the encoder's channels double at each level (--width at the top); the decoder goes
-- up with ConvTranspose2d(kernel 2, stride 2), whose forward(x, output_size) takes the skip
-- connection's size, so that odd sizes come back exactly (--size 36 --depth 3: 36 -> 18 -> 9 ->
-- 4 pooled; 4 -> 9 needs an output_padding of 1, which output_size picks); or with bilinear
-- F.interpolate to the skip's size and a 1x1 Conv2d (--up upsample). The skip connection is
-- lm.cat on the channels, then a block; a 1x1 convolution gives the class logits. The model and
-- the batches are channels-last, and lm.layout.check (forward and backward) shows once that
-- every activation and gradient stays channels-last.
--
-- The loss is per-pixel cross entropy: lm.F.cross_entropy on N x K x H x W logits and N x H x W
-- int64 targets. Adam with a linear warm-up and a cosine decay to zero. After every epoch it
-- prints the mean IoU over the classes on the held-out set (per class: the pixels predicted and
-- labelled that class over the pixels predicted or labelled that class, over the whole set).
-- --save FILE writes the trained weights (safetensors, lm.save).
local lm = require("lumen")
local util = require("lumen.util")
io.stdout:setvbuf("line") -- progress shows up at once, also when the output is a file or pipe

---------------------------------------------------------------------------------------------
-- flags
---------------------------------------------------------------------------------------------
local CLASSES = { "background", "circle", "bar" }
local K = #CLASSES
local opt, usage = util.parse_flags({
   epochs = 10, ["batch-size"] = 16, lr = 0.004, size = 32, train = 2048, test = 512, width = 16,
   depth = 2, groups = 4, act = "relu", up = "convt", seed = 1, threads = 2, save = "",
   quiet = false, ["weight-decay"] = 0, shapes = 2, noise = 0.15,
}, "bin/lumen examples/segment.lua", arg, {
   __description = "Train a small UNet to segment circles and rectangles on generated " ..
      "images, channels-last (docs/segmentation.md).",
   __order = { "epochs", "batch-size", "lr", "weight-decay", "size", "shapes", "noise", "train",
               "test", "width", "depth", "groups", "act", "up", "seed", "threads", "save",
               "quiet" },
   epochs = "epochs to train",
   ["batch-size"] = "images per optimizer step",
   lr = "peak learning rate (Adam; linear warm-up, then cosine to zero)",
   ["weight-decay"] = "Adam's weight decay",
   size = "image height and width in pixels (at least 2^depth)",
   shapes = "shapes drawn on each image (each a circle or a bar)",
   noise = "standard deviation of the Gaussian noise added to every pixel",
   train = "training images generated",
   test = "held-out images generated (mean IoU is measured on them)",
   width = "channels of the UNet's first level (doubled at each level down)",
   depth = "max-pool levels of the UNet",
   groups = "GroupNorm groups (must divide --width)",
   act = "activation of the blocks: relu or silu",
   up = "decoder upsampling: convt (ConvTranspose2d with output_size) or upsample " ..
      "(bilinear nn.Upsample + 1x1 conv)",
   seed = "random seed (data, weights, shuffling)",
   threads = "CPU threads",
   save = "write the trained weights to this safetensors file",
   quiet = "no progress line within an epoch",
})
for _, k in ipairs({ "epochs", "batch-size", "size", "shapes", "train", "test", "width", "depth",
                     "groups", "threads" }) do
   if opt[k] < 1 or opt[k] % 1 ~= 0 then usage("--" .. k .. " needs a positive integer") end
end
if opt.lr ~= opt.lr or opt.lr <= 0 then usage("--lr must be positive") end
if opt["weight-decay"] < 0 then usage("--weight-decay must not be negative") end
if opt.noise < 0 then usage("--noise must not be negative") end
if opt.size < 2 ^ opt.depth then
   usage(("--size %d is too small for --depth %d (at least %d)"):format(opt.size, opt.depth,
      2 ^ opt.depth))
end
if opt.width % opt.groups ~= 0 then
   usage(("--groups %d does not divide --width %d"):format(opt.groups, opt.width))
end
if opt.act ~= "relu" and opt.act ~= "silu" then usage("--act is relu or silu") end
if opt.up ~= "convt" and opt.up ~= "upsample" then usage("--up is convt or upsample") end
if opt["batch-size"] > opt.train then
   usage(("--batch-size %d is larger than --train %d"):format(opt["batch-size"], opt.train))
end
lm.set_num_threads(opt.threads)
lm.manual_seed(opt.seed)

---------------------------------------------------------------------------------------------
-- data: n images (n x 3 x S x S, channels-last float32) and their labels (n x S x S int64,
-- 1-based classes), drawn with lumen's seeded generator
---------------------------------------------------------------------------------------------
local function make_data(n, S, shapes, noise)
   local ys = lm.arange(S):double():view({ 1, S, 1 }) + 0.5   -- pixel centres, 0.5 .. S - 0.5
   local xs = lm.arange(S):double():view({ 1, 1, S }) + 0.5
   local function u(lo, hi) return lm.rand({ n, 1, 1 }, { dtype = lm.float64 }) * (hi - lo) + lo end
   local bg = lm.rand({ n, 3, 1, 1 })                           -- background colour
   local img = bg:expand({ n, 3, S, S }):contiguous()
   local label = lm.ones({ n, S, S }, { dtype = lm.int64 })
   for _ = 1, shapes do
      local is_circle = lm.rand({ n, 1, 1 }, { dtype = lm.float64 }):lt(0.5)
      local cy, cx = u(0.15 * S, 0.85 * S), u(0.15 * S, 0.85 * S)
      -- circles: radius 0.14 .. 0.25 of the side; bars: half-sides 0.05 .. 0.1 across and
      -- 0.2 .. 0.4 along, horizontal or vertical
      local r = u(0.14 * S, 0.25 * S)
      local thin, long = u(0.05 * S, 0.1 * S), u(0.2 * S, 0.4 * S)
      local horiz = lm.rand({ n, 1, 1 }, { dtype = lm.float64 }):lt(0.5)
      local hy, hx = lm.where(horiz, thin, long), lm.where(horiz, long, thin)
      local dy, dx = ys - cy, xs - cx                           -- n x S x S by broadcasting
      local circle = (dy * dy + dx * dx):le(r * r)
      local rect = dy:abs():le(hy):logical_and(dx:abs():le(hx))
      local mask = lm.where(is_circle, circle, rect)            -- n x S x S
      local cls = lm.where(is_circle, lm.full({ n, 1, 1 }, 2, { dtype = lm.int64 }),
                           lm.full({ n, 1, 1 }, 3, { dtype = lm.int64 }))
      label = lm.where(mask, cls, label)
      -- a colour at least 0.25 from the background's in every channel (either side)
      local colour = (bg + 0.25 + lm.rand({ n, 3, 1, 1 }) * 0.5):fmod(1)
      img = lm.where(mask:unsqueeze(2), colour, img)
   end
   img = img + lm.randn({ n, 3, S, S }) * noise                -- sensor noise
   return img:contiguous(lm.channels_last), label
end

local t_start = util.clock()
local train_x, train_y = make_data(opt.train, opt.size, opt.shapes, opt.noise)
local test_x, test_y = make_data(opt.test, opt.size, opt.shapes, opt.noise)

---------------------------------------------------------------------------------------------
-- model
---------------------------------------------------------------------------------------------
local nn = lm.nn
local function act() return opt.act == "relu" and nn.ReLU(true) or nn.SiLU(true) end
-- two 3x3 convolutions, each with GroupNorm and the activation
local function block(cin, cout)
   return nn.Sequential(
      nn.Conv2d(cin, cout, 3, { padding = 1, bias = false }), nn.GroupNorm(opt.groups, cout), act(),
      nn.Conv2d(cout, cout, 3, { padding = 1, bias = false }), nn.GroupNorm(opt.groups, cout),
      act())
end

-- the decoder's upsampling of a level: cin -> cout channels, twice the size, exactly the skip's
local Up = nn.Module:extend("Up")
function Up:__init(cin, cout, mode)
   self.mode = mode
   if mode == "convt" then
      self.up = nn.ConvTranspose2d(cin, cout, 2, { stride = 2 })
   else
      self.proj = nn.Conv2d(cin, cout, 1)
   end
end
function Up:forward(x, skip)
   if self.mode == "convt" then
      -- the skip's full size N, C, H, W: ConvTranspose2d reads H and W from it and picks the
      -- output_padding (0, or 1 where the max pool dropped an odd row or column)
      return self.up(x, skip:size())
   end
   local s = skip:size()
   return self.proj(lm.F.interpolate(x, { size = { s[3], s[4] }, mode = "bilinear",
                                          align_corners = false }))
end

local UNet = nn.Module:extend("UNet")
function UNet:__init(cin, classes, width, depth, up)
   self.depth = depth
   self.pool = nn.MaxPool2d({ kernel_size = 2 })
   local c = width
   self.enc1 = block(cin, c)
   for i = 2, depth + 1 do
      self["enc" .. i] = block(c, 2 * c)
      c = 2 * c
   end
   for i = depth, 1, -1 do
      self["up" .. i] = Up(c, c / 2, up)
      self["dec" .. i] = block(c, c / 2)        -- the upsampled half + the skip's half
      c = c / 2
   end
   self.head = nn.Conv2d(c, classes, 1)
end
function UNet:forward(x)
   local skips = {}
   for i = 1, self.depth do
      x = self["enc" .. i](x)
      skips[i] = x
      x = self.pool(x)
   end
   x = self["enc" .. (self.depth + 1)](x)
   for i = self.depth, 1, -1 do
      local u = self["up" .. i](x, skips[i])
      x = self["dec" .. i](lm.cat({ u, skips[i] }, 2))
   end
   return self.head(x)
end

local model = UNet(3, K, opt.width, opt.depth, opt.up)
lm.to_channels_last(model)
local nparams = 0
for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end

print(string.format("lumen %s: UNet (depth %d, width %d, %s, %s, %d parameters) on %d+%d " ..
   "generated %dx%d images, %d classes, batch %d, %d epochs, %d threads, channels-last",
   lm._VERSION, opt.depth, opt.width, opt.act, opt.up == "convt" and "ConvTranspose2d" or
   "Upsample", nparams, opt.train, opt.test, opt.size, opt.size, K, opt["batch-size"],
   opt.epochs, opt.threads))

-- channels-last everywhere, forward and backward: checked once on a small batch
local report = lm.layout.check(model, train_x:narrow(1, 1, math.min(2, opt.train)),
                               { backward = true })
print(tostring(report))
print("layout check: " .. (report.ok and "ok (channels-last throughout)" or
   ("LOST at " .. tostring(report.first_lost))))

---------------------------------------------------------------------------------------------
-- evaluation: per-class IoU over the held-out set
---------------------------------------------------------------------------------------------
local function evaluate()
   model:eval()
   local inter, union = {}, {}
   for c = 1, K do inter[c], union[c] = 0, 0 end
   local loss_sum = 0
   lm.no_grad(function()
      local bs = opt["batch-size"]
      for s = 1, opt.test, bs do
         local n = math.min(bs, opt.test - s + 1)
         local x, y = test_x:narrow(1, s, n), test_y:narrow(1, s, n)
         local logits = model(x)
         loss_sum = loss_sum + lm.F.cross_entropy(logits, y):item() * n
         local pred = logits:argmax(2)                       -- n x H x W, 1-based classes
         for c = 1, K do
            local p, t = pred:eq(c), y:eq(c)
            inter[c] = inter[c] + p:logical_and(t):sum():item()
            union[c] = union[c] + p:logical_or(t):sum():item()
         end
      end
   end)
   model:train()
   local ious, sum, m = {}, 0, 0
   for c = 1, K do
      if union[c] > 0 then
         ious[c] = inter[c] / union[c]
         sum, m = sum + ious[c], m + 1
      end
   end
   return sum / math.max(m, 1), ious, loss_sum / opt.test
end

local function iou_str(ious)
   local parts = {}
   for c = 1, K do
      parts[c] = CLASSES[c] .. " " .. (ious[c] and string.format("%.3f", ious[c]) or "-")
   end
   return table.concat(parts, ", ")
end

---------------------------------------------------------------------------------------------
-- training
---------------------------------------------------------------------------------------------
local bs = opt["batch-size"]
local steps_per_epoch = math.floor(opt.train / bs)         -- drop the last partial batch
local total = steps_per_epoch * opt.epochs
local lr_at = util.warmup_cosine(opt.lr, math.min(steps_per_epoch, math.max(1,
   math.floor(total / 10))), total)
local optimizer = lm.optim.Adam(model:parameters(), { lr = opt.lr,
                                                      weight_decay = opt["weight-decay"] })
local tty = util.isatty(1) and not opt.quiet
local step, miou, ious = 0, 0, {}
local function run()
   model:train()
   for epoch = 1, opt.epochs do
      local t0, loss_avg = util.clock(), nil
      -- a new order every epoch: each batch is the lm.cat of its samples (channels-last in,
      -- channels-last out)
      local perm = lm.randperm(opt.train):totable()
      for b = 1, steps_per_epoch do
         local xs, ys = {}, {}
         for i = 1, bs do
            local j = perm[(b - 1) * bs + i]
            xs[i], ys[i] = train_x:narrow(1, j, 1), train_y:narrow(1, j, 1)
         end
         local x, y = lm.cat(xs, 1), lm.cat(ys, 1)
         util.set_lr(optimizer, lr_at(step))
         optimizer:zero_grad()
         local loss = lm.F.cross_entropy(model(x), y)
         loss:backward()
         optimizer:step()
         step = step + 1
         local l = loss:item()
         if l ~= l then error("the loss is NaN at step " .. step) end
         loss_avg = loss_avg and (0.95 * loss_avg + 0.05 * l) or l
         if tty then
            util.status(string.format("epoch %d/%d  batch %d/%d  %.1f img/s  loss %.4f", epoch,
               opt.epochs, b, steps_per_epoch, b * bs / math.max(util.clock() - t0, 1e-9),
               loss_avg), true, false)
         end
      end
      local secs = util.clock() - t0
      local test_loss
      miou, ious, test_loss = evaluate()
      if tty then io.write("\r\27[K") end
      print(string.format("epoch %d/%d: train loss %.4f, %.1f img/s | test loss %.4f, " ..
         "mean IoU %.4f (%s) | %.0f s elapsed", epoch, opt.epochs, loss_avg,
         steps_per_epoch * bs / math.max(secs, 1e-9), test_loss, miou, iou_str(ious),
         util.clock() - t_start))
   end
end

util.run_interruptible(run, function()
   print(string.format("interrupted after %d steps", step))
end)

if opt.save ~= "" then
   lm.save(model:state_dict(), opt.save, { model = "UNet", classes = table.concat(CLASSES, ","),
      size = tostring(opt.size), width = tostring(opt.width), depth = tostring(opt.depth) })
   print("saved " .. opt.save)
end
print(string.format("final mean IoU %.4f on %d held-out images (%s); %.1f s in all", miou,
   opt.test, iou_str(ious), util.clock() - t_start))
