-- lumen.data -- data sets and the batch loader.
--
--   lm.data.read_idx(path)                 IDX file (MNIST format, .gz or plain) -> tensor
--   lm.data.fashion_mnist(split, root)     {images = uint8 (N,28,28), labels = int64 (N)}
--   lm.data.DataLoader(dataset, opts)      batches of float32 (B,C,H,W) in channels-last
--
-- The loader's worker threads run in C (src/data.c): they gather the samples of a batch, apply
-- the random crop / flip, normalise, and write straight into a channels-last float32 batch, while
-- Lua trains on the previous one. The epoch's order comes from lm_permutation(seed + epoch), and
-- each sample's augmentation from a hash of (seed, epoch, position), so the batches are the same
-- whatever the number of workers.

local ffi = require("ffi")
local C = require("lumen.C")
local tensor = require("lumen.tensor")
local dtypes = require("lumen.dtype")

local M = {}

local wrap, check, argerror = tensor.wrap, tensor.check, tensor.argerror

M.FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
M.FASHION_MNIST_CLASSES = { "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
   "Shirt", "Sneaker", "Bag", "Ankle boot" }

--- read an IDX file into a contiguous tensor (uint8, int32, float32 or float64 as stored)
function M.read_idx(path)
   if type(path) ~= "string" then argerror("data.read_idx", "path must be a string, got " .. type(path)) end
   local p = ffi.new("lm_tensor*[1]")
   check(C.lm_idx_read(path, p), "data.read_idx")
   return wrap(p[0])
end

local function exists(path)
   local f = io.open(path, "rb")
   if f then f:close() return true end
   return false
end

local function find(root, base)
   for _, name in ipairs({ base .. ".gz", base }) do
      local p = root .. "/" .. name
      if exists(p) then return p end
   end
   return nil
end

--- Fashion-MNIST (or MNIST: same file names) from Debian's dataset-fashion-mnist.
--- split is "train" or "test"; returns {images = uint8 (N,28,28), labels = int64 (N)} with
--- 1-based labels (1..10; the files store 0..9).
function M.fashion_mnist(split, root)
   split = split or "train"
   root = root or os.getenv("LUMEN_FASHION_MNIST") or M.FASHION_MNIST_ROOT
   if split ~= "train" and split ~= "test" then
      argerror("data.fashion_mnist", "split must be 'train' or 'test', got " .. tostring(split))
   end
   local prefix = split == "train" and "train" or "t10k"
   local ipath = find(root, prefix .. "-images-idx3-ubyte")
   local lpath = find(root, prefix .. "-labels-idx1-ubyte")
   if not ipath or not lpath then
      argerror("data.fashion_mnist", "no " .. split .. " files in " .. root ..
         " (install Debian's dataset-fashion-mnist or pass the folder)")
   end
   local images = M.read_idx(ipath)
   local labels = M.read_idx(lpath)
   if images:dim() ~= 3 or labels:dim() ~= 1 or images:size(1) ~= labels:size(1) then
      argerror("data.fashion_mnist", "images and labels do not match in " .. root)
   end
   -- class labels are 1-based in lumen (cross_entropy, argmax): 1..10
   return { images = images, labels = labels:to(dtypes.int64):add(1) }
end

--- a permutation of 1..n as a 0-based int64 C array (internal) depending only on seed
local function permutation(n, seed)
   local idx = ffi.new("int64_t[?]", math.max(n, 1))
   check(C.lm_permutation(idx, n, seed), "data.DataLoader")
   return idx
end
M._permutation = permutation

local Loader = {}
Loader.__index = Loader

--- DataLoader(dataset, opts): dataset = {images = uint8 (N,H,W[,C]), labels = int64 (N)}.
--- opts: batch_size (64), shuffle (true), seed (0), drop_last (false), workers (2),
--- prefetch (2), memory_format (lm.channels_last), pad (0), crop ({h, w} or number; default
--- none), hflip (false), mean / std (per-channel arrays of the [0,1] values; default 0 / 1).
function M.DataLoader(dataset, opts)
   local fname = "data.DataLoader"
   if type(dataset) ~= "table" or not tensor.is_tensor(dataset.images) then
      argerror(fname, "dataset must be a table with an images tensor")
   end
   opts = opts or {}
   if type(opts) ~= "table" then argerror(fname, "opts must be a table") end
   local images, labels = dataset.images, dataset.labels
   if labels ~= nil and not tensor.is_tensor(labels) then argerror(fname, "labels must be a tensor") end
   if labels and labels:dtype() ~= dtypes.int64 then labels = labels:to(dtypes.int64) end
   local self = setmetatable({}, Loader)
   self.images, self.labels = images, labels
   self.n = images:size(1)
   self.batch_size = opts.batch_size or 64
   if not tensor.is_integer(self.batch_size) or self.batch_size < 1 then
      argerror(fname, "batch_size must be a positive integer")
   end
   self.shuffle = opts.shuffle ~= false
   self.seed = opts.seed or 0
   self.epoch = 0
   local o = ffi.new("lm_loader_opts")
   o.batch_size = self.batch_size
   o.drop_last = opts.drop_last and 1 or 0
   local fmt = opts.memory_format or dtypes.channels_last
   o.out_fmt = fmt == dtypes.channels_last and 1 or (fmt == dtypes.contiguous_format and 0 or -1)
   if o.out_fmt < 0 then argerror(fname, "memory_format must be channels_last or contiguous_format") end
   o.pad = opts.pad or 0
   local crop = opts.crop
   if type(crop) == "number" then crop = { crop, crop } end
   if crop ~= nil and type(crop) ~= "table" then argerror(fname, "crop must be a number or {h, w}") end
   o.crop_h = crop and crop[1] or 0
   o.crop_w = crop and crop[2] or 0
   o.hflip = opts.hflip and 1 or 0
   o.workers = opts.workers or 2
   o.prefetch = opts.prefetch or 2
   local nch = images:dim() == 4 and images:size(4) or 1
   local mean, std = opts.mean or {}, opts.std or {}
   if type(mean) == "number" then mean = { mean } end
   if type(std) == "number" then std = { std } end
   for c = 0, 3 do
      o.mean[c] = mean[c + 1] or mean[1] or 0
      o.std[c] = std[c + 1] or std[1] or 1
   end
   self.nch = nch
   self.opts = o
   self.drop_last = opts.drop_last and true or false
   return self
end

function Loader:num_batches()
   if self.drop_last then return math.floor(self.n / self.batch_size) end
   return math.ceil(self.n / self.batch_size)
end
Loader.__len = Loader.num_batches

--- iterate over one epoch: `for x, y, i in loader:iter(epoch) do ... end`.
--- epoch defaults to the loader's own counter, which then advances. start_batch (1-based,
--- default 1) resumes an epoch part-way: the batches are the same as in a full pass.
function Loader:iter(epoch, start_batch)
   if epoch == nil then
      self.epoch = self.epoch + 1
      epoch = self.epoch
   end
   local n = self.n
   local order
   if self.shuffle then
      order = permutation(n, self.seed * 1000003 + epoch)
   else
      order = ffi.new("int64_t[?]", math.max(n, 1))
      for i = 0, n - 1 do order[i] = i end
   end
   local o = ffi.new("lm_loader_opts", self.opts)
   o.seed = self.seed * 7919 + epoch * 104729 + 1
   start_batch = start_batch or 1
   if not tensor.is_integer(start_batch) or start_batch < 1 then
      argerror("data.DataLoader", "start_batch must be a positive integer")
   end
   o.start_batch = start_batch - 1
   local lp = ffi.new("lm_loader*[1]")
   check(C.lm_loader_new(self.images._c, self.labels and self.labels._c or nil, order, n, o, lp),
      "data.DataLoader")
   local handle = ffi.gc(lp[0], C.lm_loader_free)
   local xp, yp = ffi.new("lm_tensor*[1]"), ffi.new("lm_tensor*[1]")
   local i = start_batch - 1
   return function()
      if handle == nil then return nil end
      check(C.lm_loader_next(handle, xp, yp), "data.DataLoader")
      if xp[0] == nil then
         ffi.gc(handle, nil)
         C.lm_loader_free(handle)
         handle = nil
         return nil
      end
      i = i + 1
      local x = wrap(xp[0])
      local y = yp[0] ~= nil and wrap(yp[0]) or nil
      return x, y, i
   end
end

return M
