-- lumen.data -- data sets and the batch loader.
--
--   lm.data.read_idx(path)                 IDX file (MNIST format, .gz or plain) -> tensor
--   lm.data.fashion_mnist(split, root)     {images = uint8 (N,28,28), labels = int64 (N)}
--   lm.data.ImageFolder(root, opts)        root/<class>/**.{jpg,jpeg,png}: files + 1-based labels
--   lm.data.DataLoader(dataset, opts)      batches of float32 (B,C,H,W) in channels-last
--   lm.data.DistributedSampler(n, opts)    each rank's share of the samples, per epoch
--   lm.data.read_image(path)               a JPEG / PNG file -> uint8 (H, W, 3) RGB
--   lm.data.load_image(path, opts)         one image as ImageFolder samples it -> (1,3,h,w)
--
-- The loader's worker threads run in C (src/data.c, src/image.c): they gather (or decode) the
-- samples of a batch, apply the crop / resize / flip, normalise, and write straight into a
-- channels-last float32 batch, while Lua trains on the previous one. The epoch's order comes
-- from lm_permutation(seed, epoch), and each sample's augmentation from a hash of (seed, epoch,
-- position), so the batches are the same whatever the number of workers.

local ffi = require("ffi")
local bit = require("bit")
local C = require("lumen.C")
local tensor = require("lumen.tensor")
local dtypes = require("lumen.dtype")

local M = {}

local wrap, check, argerror = tensor.wrap, tensor.check, tensor.argerror
local is_integer = tensor.is_integer

M.FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
M.FASHION_MNIST_CLASSES = { "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
   "Shirt", "Sneaker", "Bag", "Ankle boot" }
-- the usual ImageNet normalisation (torchvision's), for mean / std
M.IMAGENET_MEAN = { 0.485, 0.456, 0.406 }
M.IMAGENET_STD = { 0.229, 0.224, 0.225 }

--- read an IDX file into a contiguous tensor (uint8, int32, float32 or float64 as stored)
function M.read_idx(path)
   if type(path) ~= "string" then
      argerror("data.read_idx", "path must be a string, got " .. type(path))
   end
   local p = ffi.new("lm_tensor*[1]")
   check(C.lm_idx_read(path, p), "data.read_idx")
   return wrap(p[0])
end

-- is there something at path? (not io.open: opening a FIFO blocks until a writer comes; what
-- is found is then read by read_idx, which refuses anything but a regular file)
local function exists(path)
   return C.lm_path_kind(path) ~= 0
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
   return M.TensorDataset(images, labels:to(dtypes.int64):add(1), {
      name = "FashionMNIST", split = split, root = root, classes = M.FASHION_MNIST_CLASSES })
end

---------------------------------------------------------------------------------------------
-- data sets held in tensors
---------------------------------------------------------------------------------------------

local function sizes_text(t)
   return "(" .. table.concat(t:size(), ",") .. ")"
end

local function class_list(classes, n)
   local shown = {}
   for i = 1, math.min(#classes, n) do shown[i] = classes[i] end
   return table.concat(shown, ", ") .. (#classes > n and ", ..." or "")
end

local TensorDataset = {}
TensorDataset.__index = TensorDataset
M._TensorDataset = TensorDataset

--- TensorDataset(images, labels, info): {images = uint8 (N, H, W[, C]), labels = int64 (N) or
--- nil} with ds:len() (the number of samples), ds:size() (the same, Torch7's name) and
--- tostring(ds); info may give name, split, root and classes (what data.fashion_mnist fills in).
--- A DataLoader takes it as it takes a plain {images =, labels =} table.
function M.TensorDataset(images, labels, info)
   local fname = "data.TensorDataset"
   if not tensor.is_tensor(images) then
      argerror(fname, "images must be a tensor, got " .. tensor.typename(images))
   end
   if labels ~= nil and not tensor.is_tensor(labels) then
      argerror(fname, "labels must be a tensor or nil, got " .. tensor.typename(labels))
   end
   if labels ~= nil and (labels:dim() ~= 1 or labels:size(1) ~= images:size(1)) then
      argerror(fname, "labels must be 1-D with one label per image")
   end
   info = info or {}
   if type(info) ~= "table" then argerror(fname, "info must be a table") end
   return setmetatable({ images = images, labels = labels, name = info.name, split = info.split,
                         root = info.root, classes = info.classes }, TensorDataset)
end

function TensorDataset:len() return self.images:size(1) end
TensorDataset.size = TensorDataset.len

function TensorDataset.__tostring(self)
   local lines = { (self.name or "TensorDataset") .. (self.split and (" (" .. self.split .. ")")
                                                       or "") }
   if self.root then lines[#lines + 1] = "  root: " .. self.root end
   lines[#lines + 1] = "  samples: " .. self:len()
   if self.classes then
      lines[#lines + 1] = ("  classes: %d (%s)"):format(#self.classes, class_list(self.classes, 5))
   end
   lines[#lines + 1] = "  images: " .. tostring(self.images:dtype()) .. " " ..
      sizes_text(self.images)
   if self.labels then
      lines[#lines + 1] = "  labels: " .. tostring(self.labels:dtype()) .. " " ..
         sizes_text(self.labels)
   end
   lines[#lines + 1] = "  transforms: none here (a DataLoader pads, crops, flips and normalizes)"
   return table.concat(lines, "\n")
end

---------------------------------------------------------------------------------------------
-- option checking
---------------------------------------------------------------------------------------------

local function describe(v)
   if type(v) == "table" then
      local parts = {}
      for i = 1, #v do parts[i] = tostring(v[i]) end
      return "{" .. table.concat(parts, ", ") .. "}"
   end
   return tostring(v)
end

local function check_keys(fname, opts, known)
   for k in pairs(opts) do
      if not known[k] then argerror(fname, "unknown option '" .. tostring(k) .. "'") end
   end
end

local function opt_int(fname, v, what, lo, hi, default)
   if v == nil then return default end
   if not is_integer(v) or v < lo or (hi and v > hi) then
      argerror(fname, string.format("%s must be an integer %s, got %s", what,
         hi and ("in " .. lo .. ".." .. hi) or (">= " .. lo), describe(v)))
   end
   return v
end

local function opt_bool(fname, v, what, default)
   if v == nil then return default end
   if type(v) ~= "boolean" then
      argerror(fname, what .. " must be a boolean, got " .. describe(v))
   end
   return v
end

-- a number or {h, w} of integers in 1..65535 -> h, w
local function opt_size(fname, v, what)
   local t = type(v) == "number" and { v, v } or v
   if type(t) ~= "table" or #t ~= 2 or not is_integer(t[1]) or not is_integer(t[2]) or
      t[1] < 1 or t[2] < 1 or t[1] > 65535 or t[2] > 65535 then
      argerror(fname, what .. " must be a positive integer or {h, w}, got " .. describe(v))
   end
   return t[1], t[2]
end

-- {lo, hi} with 0 < lo <= hi (<= max)
local function opt_range(fname, v, what, default, max)
   if v == nil then return default[1], default[2] end
   if type(v) ~= "table" or #v ~= 2 or type(v[1]) ~= "number" or type(v[2]) ~= "number" or
      not (v[1] > 0 and v[1] <= v[2] and v[2] < math.huge and (not max or v[2] <= max)) then
      argerror(fname, string.format("%s must be {lo, hi} with 0 < lo <= hi%s, got %s", what,
         max and (" <= " .. max) or "", describe(v)))
   end
   return v[1], v[2]
end

-- per-channel values: a number, or a list of 1 or nch numbers -> list of nch numbers
local function opt_channels(fname, v, what, nch, default, positive)
   if v == nil then v = { default } end
   if type(v) == "number" then v = { v } end
   if type(v) ~= "table" or (#v ~= 1 and #v ~= nch) then
      argerror(fname, string.format("%s must be a number or a list of %d numbers, got %s", what,
         nch, describe(v)))
   end
   local out = {}
   for c = 1, nch do
      local x = v[#v == 1 and 1 or c]
      if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge or
         (positive and x <= 0) then
         argerror(fname, string.format("%s must hold %s numbers, got %s", what,
            positive and "positive finite" or "finite", describe(v)))
      end
      out[c] = x
   end
   return out
end

---------------------------------------------------------------------------------------------
-- images
---------------------------------------------------------------------------------------------

--- which decoders this build of lumen has: {jpeg = bool, png = bool}
function M.image_support()
   local s = C.lm_image_support()
   return { jpeg = bit.band(s, 1) ~= 0, png = bit.band(s, 2) ~= 0 }
end

--- decode a JPEG or PNG file (recognised by its content) into uint8 (H, W, 3) RGB. Grayscale is
--- replicated to three channels, alpha dropped, CMYK converted (as PIL's convert("RGB")).
function M.read_image(path)
   if type(path) ~= "string" then
      argerror("data.read_image", "path must be a string, got " .. type(path))
   end
   local p = ffi.new("lm_tensor*[1]")
   check(C.lm_image_read(path, p), "data.read_image")
   return wrap(p[0])
end

local CROP_MODES = { none = 0, center = 1, random = 2 }
local IMAGE_KEYS = { size = true, crop = true, resize = true, scale = true, ratio = true,
   draft = true }

-- lm_image_opts from the image options of ImageFolder / load_image
local function image_opts(fname, opts)
   local io = ffi.new("lm_image_opts")
   local h, w = opt_size(fname, opts.size == nil and 224 or opts.size, "size")
   io.out_h, io.out_w = h, w
   local crop = opts.crop == nil and "none" or opts.crop
   if CROP_MODES[crop] == nil then
      argerror(fname, "crop must be 'none', 'center' or 'random', got " .. describe(crop))
   end
   io.crop = CROP_MODES[crop]
   io.resize = opt_int(fname, opts.resize, "resize", 0, 65535, 0)
   io.scale[0], io.scale[1] = opt_range(fname, opts.scale, "scale", { 0.08, 1 }, 1)
   io.ratio[0], io.ratio[1] = opt_range(fname, opts.ratio, "ratio", { 3 / 4, 4 / 3 })
   io.draft = opt_bool(fname, opts.draft, "draft", true) and 1 or 0
   return io
end

local function new_sample(h, w, fmt)
   local sizes = ffi.new("int64_t[4]", 1, 3, h, w)
   local p = ffi.new("lm_tensor*[1]")
   check(C.lm_empty(4, sizes, dtypes.float32.id, fmt.id, 0, p), "data.load_image")
   return wrap(p[0])
end

--- one image, decoded and resampled as an ImageFolder sample, as float32 (1, 3, h, w) in
--- channels-last (memory_format = lm.contiguous_format for NCHW). opts: the ImageFolder image
--- options (size, crop, resize, scale, ratio, draft), mean / std, hflip (true mirrors the
--- image), seed (drives crop = "random"; default 0).
function M.load_image(path, opts)
   local fname = "data.load_image"
   if type(path) ~= "string" then argerror(fname, "path must be a string, got " .. type(path)) end
   opts = opts or {}
   if type(opts) ~= "table" then argerror(fname, "opts must be a table") end
   local known = { mean = true, std = true, hflip = true, seed = true, memory_format = true }
   for k in pairs(IMAGE_KEYS) do known[k] = true end
   check_keys(fname, opts, known)
   local io = image_opts(fname, opts)
   local mean = opt_channels(fname, opts.mean, "mean", 3, 0)
   local std = opt_channels(fname, opts.std, "std", 3, 1, true)
   local flip = opt_bool(fname, opts.hflip, "hflip", false)
   local seed = opt_int(fname, opts.seed, "seed", 0, 2 ^ 53, 0)
   local fmt = opts.memory_format or dtypes.channels_last
   if fmt ~= dtypes.channels_last and fmt ~= dtypes.contiguous_format then
      argerror(fname, "memory_format must be channels_last or contiguous_format")
   end
   local out = new_sample(io.out_h, io.out_w, fmt)
   check(C.lm_image_load(path, io, seed, flip and 1 or 0, ffi.new("float[3]", mean),
      ffi.new("float[3]", std), out._c), fname)
   return out
end

-- names in a directory, sorted (kind 1: sub-directories, 2: regular files)
local function list_dir(fname, path, kind)
   local out, n = ffi.new("char*[1]"), ffi.new("int64_t[1]")
   check(C.lm_dir_list(path, kind, out, n), fname)
   local names, p = {}, out[0]
   for i = 1, tonumber(n[0]) do
      local s = ffi.string(p)
      names[i] = s
      p = p + #s + 1
   end
   C.lm_dir_list_free(out[0])
   return names
end
M._list_dir = list_dir

local ImageFolder = {}
ImageFolder.__index = ImageFolder
ImageFolder.__len = function(self) return #self.paths end

--- ds:len() -> the number of samples (images); ds:size() is the same (Torch7's name). #ds does
--- not work on tables under LuaJIT.
function ImageFolder:len() return #self.paths end
ImageFolder.size = ImageFolder.len

function ImageFolder.__tostring(self)
   local io = self._io
   local t = { ("size %dx%d"):format(self.image_size[1], self.image_size[2]),
               "crop " .. tostring(self.crop) }
   if self.crop == "random" and io then
      t[#t + 1] = ("scale {%.3g, %.3g}, ratio {%.3g, %.3g}"):format(io.scale[0], io.scale[1],
                                                                  io.ratio[0], io.ratio[1])
   elseif self.crop == "center" and io and io.resize > 0 then
      t[#t + 1] = "resize " .. io.resize
   end
   if self.skip_corrupt then t[#t + 1] = "skip_corrupt" end
   return table.concat({
      "ImageFolder",
      "  root: " .. self.root,
      "  samples: " .. self:len(),
      ("  classes: %d (%s)"):format(#self.classes, class_list(self.classes, 5)),
      "  transforms: " .. table.concat(t, ", "),
   }, "\n")
end

--- ImageFolder(root, opts): one sub-folder of root per class (sorted names -> class ids 1..C),
--- each holding *.jpg / *.jpeg / *.png files (any depth; names compared case-insensitively).
--- Nothing is decoded here: a DataLoader over the folder decodes in its worker threads.
--- opts:
---   size        number or {h, w}: the sample size (224)
---   crop        "none": the whole image resized to size (aspect not kept); "center": the
---               shorter side scaled to `resize` (default: just covering size), then the central
---               size crop; "random": torchvision's RandomResizedCrop (scale, ratio)
---   resize      for crop = "center", e.g. 256 for 224 (ImageNet evaluation)
---   scale       {lo, hi} area fraction for crop = "random" ({0.08, 1})
---   ratio       {lo, hi} aspect ratio w/h for crop = "random" ({3/4, 4/3})
---   draft       JPEGs may decode at 1/2..1/8 size when the crop stays >= size (true)
---   classes     list of class folder names to use, in this order (ids 1..#classes)
---   extensions  list of file extensions ({"jpg", "jpeg", "png"})
---   skip_corrupt  a DataLoader over the folder leaves out an image it cannot decode (its batch
---               is one sample smaller) and says so on stderr, once per file, instead of
---               stopping with an error naming the file (false)
--- Fields: root, classes, class_to_idx, paths, labels (int64 (N), 1-based), image_size =
--- {h, w}; ds:len() (ds:size()) is the number of samples.
function M.ImageFolder(root, opts)
   local fname = "data.ImageFolder"
   if type(root) ~= "string" then argerror(fname, "root must be a string, got " .. type(root)) end
   opts = opts or {}
   if type(opts) ~= "table" then argerror(fname, "opts must be a table") end
   local known = { classes = true, extensions = true, skip_corrupt = true }
   for k in pairs(IMAGE_KEYS) do known[k] = true end
   check_keys(fname, opts, known)
   local io = image_opts(fname, opts)
   local skip_corrupt = opt_bool(fname, opts.skip_corrupt, "skip_corrupt", false)
   local exts = opts.extensions or { "jpg", "jpeg", "png" }
   if type(exts) ~= "table" or #exts == 0 then
      argerror(fname, "extensions must be a list of strings")
   end
   local ext_set = {}
   for _, e in ipairs(exts) do
      if type(e) ~= "string" then argerror(fname, "extensions must be a list of strings") end
      ext_set[e:lower():gsub("^%.", "")] = true
   end
   if #root > 1 then root = root:gsub("/+$", "") end
   local classes
   if opts.classes ~= nil then
      if type(opts.classes) ~= "table" or #opts.classes == 0 then
         argerror(fname, "classes must be a non-empty list of folder names")
      end
      classes = {}
      local seen = {}
      for i, c in ipairs(opts.classes) do
         if type(c) ~= "string" or c == "" or c:find("/", 1, true) then
            argerror(fname, "classes must be folder names, got " .. describe(c))
         end
         if seen[c] then argerror(fname, "class '" .. c .. "' is listed twice") end
         seen[c] = true
         classes[i] = c
      end
   else
      classes = list_dir(fname, root, 1)
      if #classes == 0 then argerror(fname, "no class folders in '" .. root .. "'") end
   end
   local paths, ids = {}, {}
   local function walk(dir, id)
      for _, f in ipairs(list_dir(fname, dir, 2)) do
         local ext = f:match("%.([^.]+)$")
         if ext and ext_set[ext:lower()] then
            paths[#paths + 1] = dir .. "/" .. f
            ids[#ids + 1] = id
         end
      end
      for _, sub in ipairs(list_dir(fname, dir, 1)) do walk(dir .. "/" .. sub, id) end
   end
   local class_to_idx = {}
   for id, c in ipairs(classes) do
      class_to_idx[c] = id
      local before = #paths
      walk(root .. "/" .. c, id)
      if #paths == before then
         argerror(fname, "class folder '" .. root .. "/" .. c .. "' holds no image files (" ..
            table.concat(exts, ", ") .. ")")
      end
   end
   local n = #paths
   local labels = ffi.new("int64_t[?]", math.max(n, 1))
   for i = 1, n do labels[i - 1] = ids[i] end
   local lt = ffi.new("lm_tensor*[1]")
   check(C.lm_empty(1, ffi.new("int64_t[1]", n), dtypes.int64.id, 0, 0, lt), fname)
   local label_tensor = wrap(lt[0])
   ffi.copy(C.lm_tensor_data(label_tensor._c), labels, 8 * n)
   return setmetatable({
      root = root, classes = classes, class_to_idx = class_to_idx, paths = paths,
      labels = label_tensor, image_size = { tonumber(io.out_h), tonumber(io.out_w) },
      crop = opts.crop or "none", _io = io, _labels = labels,
      skip_corrupt = skip_corrupt, _warned = {},
   }, ImageFolder)
end

function M.is_image_folder(x) return getmetatable(x) == ImageFolder end

-- the C file list (made once, shared by every loader over this folder)
function ImageFolder:_files()
   if not self._list then
      local n = #self.paths
      local cpaths = ffi.new("const char*[?]", math.max(n, 1))
      for i = 1, n do cpaths[i - 1] = self.paths[i] end
      local p = ffi.new("lm_image_list*[1]")
      check(C.lm_image_list_new(cpaths, self._labels, n, p), "data.ImageFolder")
      self._list = ffi.gc(p[0], C.lm_image_list_free)
   end
   return self._list
end

--- sample i (1-based) decoded as uint8 (H, W, 3)
function ImageFolder:read(i)
   if not is_integer(i) or i < 1 or i > #self.paths then
      argerror("data.ImageFolder", "sample index must be in 1.." .. #self.paths .. ", got " ..
         describe(i))
   end
   return M.read_image(self.paths[i])
end

--- sample i (1-based) as the loader makes it, float32 (1, 3, h, w); opts: mean, std, hflip,
--- seed, memory_format (see load_image). Returns the sample and its label.
function ImageFolder:load(i, opts)
   if not is_integer(i) or i < 1 or i > #self.paths then
      argerror("data.ImageFolder", "sample index must be in 1.." .. #self.paths .. ", got " ..
         describe(i))
   end
   opts = opts or {}
   local fname = "data.ImageFolder"
   check_keys(fname, opts, { mean = true, std = true, hflip = true, seed = true,
      memory_format = true })
   local io = self._io
   local mean = opt_channels(fname, opts.mean, "mean", 3, 0)
   local std = opt_channels(fname, opts.std, "std", 3, 1, true)
   local fmt = opts.memory_format or dtypes.channels_last
   if fmt ~= dtypes.channels_last and fmt ~= dtypes.contiguous_format then
      argerror(fname, "memory_format must be channels_last or contiguous_format")
   end
   local out = new_sample(io.out_h, io.out_w, fmt)
   check(C.lm_image_load(self.paths[i], io, opt_int(fname, opts.seed, "seed", 0, 2 ^ 53, 0),
      opt_bool(fname, opts.hflip, "hflip", false) and 1 or 0, ffi.new("float[3]", mean),
      ffi.new("float[3]", std), out._c), fname)
   return out, tonumber(self._labels[i - 1])
end

---------------------------------------------------------------------------------------------
-- the loader
---------------------------------------------------------------------------------------------

--- a permutation of 0..n-1 as a C int64 array (internal), depending only on seed (uint64)
local function permutation(n, seed)
   local idx = ffi.new("int64_t[?]", math.max(n, 1))
   check(C.lm_permutation(idx, n, seed), "data.DataLoader")
   return idx
end
M._permutation = permutation

local U64 = ffi.typeof("uint64_t")

---------------------------------------------------------------------------------------------
-- the distributed sampler
---------------------------------------------------------------------------------------------

local Sampler = {}
Sampler.__index = Sampler
Sampler.__len = function(self) return self.num_samples end
--- sampler:len() -> the samples of this rank per epoch
function Sampler:len() return self.num_samples end

--- DistributedSampler(n | dataset, opts): each rank's share of the samples 1..n for a job of
--- num_replicas ranks (PyTorch's torch.utils.data.DistributedSampler). opts: num_replicas and
--- rank (default: lm.distributed's world_size() and rank(), which must then be initialized),
--- shuffle (true), seed (0), drop_last (false). Each epoch the samples are put in one order --
--- the permutation a DataLoader with the same seed uses (lm_permutation(seed * 1000003 + epoch))
--- or 1..n without shuffle -- the same on every rank; without drop_last the order is padded by
--- repeating its start up to a multiple of num_replicas (as PyTorch), with drop_last its tail is
--- cut; rank r takes positions r + 1, r + 1 + num_replicas, ... So the ranks' shares are disjoint
--- and cover the data set, the same seed gives the same split, and set_epoch(e) reshuffles.
--- With one replica the order is exactly a shuffling DataLoader's own. Give it to a DataLoader
--- as opts.sampler: loader:iter(epoch) then calls sampler:set_epoch(epoch) and loads the rank's
--- share. Fields: num_replicas, rank, num_samples (per rank), total_size, epoch.
local SAMPLER_KEYS = { num_replicas = true, rank = true, shuffle = true, seed = true,
   drop_last = true }
function M.DistributedSampler(n, opts)
   local fname = "data.DistributedSampler"
   if type(n) == "table" and not tensor.is_tensor(n) then
      if M.is_image_folder(n) then n = #n.paths
      elseif tensor.is_tensor(n.images) then n = n.images:size(1)
      else argerror(fname, "expected a sample count, an ImageFolder or a {images =} data set") end
   end
   if not is_integer(n) or n < 0 then
      argerror(fname, "the sample count must be a non-negative integer, got " .. describe(n))
   end
   opts = opts or {}
   if type(opts) ~= "table" then argerror(fname, "opts must be a table") end
   check_keys(fname, opts, SAMPLER_KEYS)
   local R, r = opts.num_replicas, opts.rank
   if R == nil or r == nil then
      local dist = require("lumen.distributed")
      if not dist.is_initialized() then
         argerror(fname, "num_replicas and rank are needed when lm.distributed is not " ..
            "initialized")
      end
      if R == nil then R = dist.world_size() end
      if r == nil then r = dist.rank() end
   end
   R = opt_int(fname, R, "num_replicas", 1, nil)
   r = opt_int(fname, r, "rank", 0, R - 1)
   local self = setmetatable({
      n = n, num_replicas = R, rank = r,
      shuffle = opt_bool(fname, opts.shuffle, "shuffle", true),
      seed = opt_int(fname, opts.seed, "seed", 0, 2 ^ 53, 0),
      drop_last = opt_bool(fname, opts.drop_last, "drop_last", false),
      epoch = 0,
   }, Sampler)
   if self.drop_last then
      self.num_samples = math.floor(n / R)
   else
      self.num_samples = math.ceil(n / R)
   end
   self.total_size = self.num_samples * R
   return self
end

function M.is_distributed_sampler(x) return getmetatable(x) == Sampler end

--- sampler:set_epoch(epoch): the order of the next indices() (every rank must use the same)
function Sampler:set_epoch(epoch)
   self.epoch = opt_int("data.DistributedSampler", epoch, "epoch", 0, 2 ^ 40)
end

-- this rank's samples for the current epoch as a C int64 array of 0-based indices, and its length
function Sampler:_order()
   local n, R, r = self.n, self.num_replicas, self.rank
   local full
   if self.shuffle then
      full = permutation(n, U64(self.seed) * 1000003 + self.epoch)
   else
      full = ffi.new("int64_t[?]", math.max(n, 1))
      for i = 0, n - 1 do full[i] = i end
   end
   local m = self.num_samples
   local out = ffi.new("int64_t[?]", math.max(m, 1))
   for k = 0, m - 1 do
      local pos = r + k * R                   -- a position in the padded order
      if n > 0 then out[k] = full[pos % n] end
   end
   return out, m
end

--- sampler:indices() -> this rank's sample numbers (1-based) for the current epoch
function Sampler:indices()
   local order, m = self:_order()
   local t = {}
   for k = 1, m do t[k] = tonumber(order[k - 1]) + 1 end
   return t
end

local Loader = {}
Loader.__index = Loader

local LOADER_KEYS = { batch_size = true, shuffle = true, seed = true, drop_last = true,
   workers = true, prefetch = true, memory_format = true, pad = true, crop = true, hflip = true,
   mean = true, std = true, sampler = true }

--- DataLoader(dataset, opts): dataset = {images = uint8 (N,H,W[,C]), labels = int64 (N)} or an
--- ImageFolder. Batches are float32 (B, C, H, W) (C = 3 for an ImageFolder) with int64 labels.
--- opts: batch_size (64), shuffle (true), seed (0), drop_last (false), workers (2), prefetch
--- (max(2, workers)), memory_format (lm.channels_last or lm.contiguous_format), hflip (false),
--- mean / std (per-channel values on the [0,1] scale; default 0 / 1); for tensor data sets
--- also pad (0) and crop ({h, w} or number: a random crop of the padded image; default none).
--- sampler: a DistributedSampler over this data set: the loader goes over the rank's share only
--- (in the sampler's order; shuffle is then the sampler's), and the augmentations differ by rank.
function M.DataLoader(dataset, opts)
   local fname = "data.DataLoader"
   opts = opts or {}
   if type(opts) ~= "table" then argerror(fname, "opts must be a table") end
   check_keys(fname, opts, LOADER_KEYS)
   local self = setmetatable({}, Loader)
   local nch
   if M.is_image_folder(dataset) then
      self.folder = dataset
      self.n = #dataset.paths
      nch = 3
      if opts.pad ~= nil or opts.crop ~= nil then
         argerror(fname, "pad and crop apply to tensor data sets; an ImageFolder is cropped " ..
            "through its own options (size, crop, scale, ratio)")
      end
   else
      if type(dataset) ~= "table" or not tensor.is_tensor(dataset.images) then
         argerror(fname, "dataset must be an ImageFolder or a table with an images tensor")
      end
      local images, labels = dataset.images, dataset.labels
      if images:dtype() ~= dtypes.uint8 or (images:dim() ~= 3 and images:dim() ~= 4) then
         argerror(fname, "images must be uint8 (N, H, W) or (N, H, W, C), got " ..
            tostring(images:dtype()) .. " with " .. images:dim() .. " dims")
      end
      nch = images:dim() == 4 and images:size(4) or 1
      if nch < 1 or nch > 4 then argerror(fname, "images must have 1 to 4 channels") end
      if labels ~= nil then
         if not tensor.is_tensor(labels) then argerror(fname, "labels must be a tensor") end
         if labels:dim() ~= 1 or labels:size(1) ~= images:size(1) then
            argerror(fname, "labels must be 1-D with one label per image")
         end
         if labels:dtype() ~= dtypes.int64 then labels = labels:to(dtypes.int64) end
      end
      self.images, self.labels = images, labels
      self.n = images:size(1)
   end
   if opts.sampler ~= nil then
      if not M.is_distributed_sampler(opts.sampler) then
         argerror(fname, "sampler must be a DistributedSampler, got " .. describe(opts.sampler))
      end
      if opts.sampler.n ~= self.n then
         argerror(fname, string.format("the sampler is over %d samples, the data set has %d",
            opts.sampler.n, self.n))
      end
      self.sampler = opts.sampler
      self.n = opts.sampler.num_samples
   end
   self.batch_size = opt_int(fname, opts.batch_size, "batch_size", 1, nil, 64)
   self.shuffle = opt_bool(fname, opts.shuffle, "shuffle", true)
   self.seed = opt_int(fname, opts.seed, "seed", 0, 2 ^ 53, 0)
   self.drop_last = opt_bool(fname, opts.drop_last, "drop_last", false)
   self.epoch = 0
   local o = ffi.new("lm_loader_opts")
   o.batch_size = self.batch_size
   o.drop_last = self.drop_last and 1 or 0
   local fmt = opts.memory_format or dtypes.channels_last
   if fmt ~= dtypes.channels_last and fmt ~= dtypes.contiguous_format then
      argerror(fname, "memory_format must be channels_last or contiguous_format, got " ..
         tostring(fmt))
   end
   o.out_fmt = fmt.id
   o.skip_corrupt = self.folder and self.folder.skip_corrupt and 1 or 0
   o.hflip = opt_bool(fname, opts.hflip, "hflip", false) and 1 or 0
   o.workers = opt_int(fname, opts.workers, "workers", 1, 256, 2)
   o.prefetch = opt_int(fname, opts.prefetch, "prefetch", 1, 4096, math.max(2, o.workers))
   if not self.folder then
      o.pad = opt_int(fname, opts.pad, "pad", 0, 65535, 0)
      if opts.crop ~= nil then
         local ch, cw = opt_size(fname, opts.crop, "crop")
         local H, W = self.images:size(2), self.images:size(3)
         if ch > H + 2 * o.pad or cw > W + 2 * o.pad then
            argerror(fname, string.format("crop %dx%d is larger than the padded image (%dx%d)",
               ch, cw, H + 2 * o.pad, W + 2 * o.pad))
         end
         o.crop_h, o.crop_w = ch, cw
      end
   end
   local mean = opt_channels(fname, opts.mean, "mean", nch, 0)
   local std = opt_channels(fname, opts.std, "std", nch, 1, true)
   for c = 0, nch - 1 do
      o.mean[c] = mean[c + 1]
      o.std[c] = std[c + 1]
   end
   self.nch = nch
   self.opts = o
   return self
end

function Loader:num_batches()
   if self.drop_last then return math.floor(self.n / self.batch_size) end
   return math.ceil(self.n / self.batch_size)
end
Loader.__len = Loader.num_batches
--- loader:len() -> batches per epoch (PyTorch's len(loader))
Loader.len = Loader.num_batches

function Loader.__tostring(self)
   local o = self.opts
   local t = {}
   if not self.folder then
      if o.pad > 0 then t[#t + 1] = "pad " .. o.pad end
      if o.crop_h > 0 then t[#t + 1] = ("crop %dx%d"):format(o.crop_h, o.crop_w) end
   else
      t[#t + 1] = ("size %dx%d, crop %s"):format(self.folder.image_size[1],
                                                self.folder.image_size[2],
                                                tostring(self.folder.crop))
   end
   if o.hflip ~= 0 then t[#t + 1] = "hflip" end
   local mean, std = {}, {}
   for c = 0, self.nch - 1 do
      mean[#mean + 1] = ("%.4g"):format(o.mean[c])
      std[#std + 1] = ("%.4g"):format(o.std[c])
   end
   t[#t + 1] = "normalize mean {" .. table.concat(mean, ", ") .. "} std {" ..
      table.concat(std, ", ") .. "}"
   return table.concat({
      "DataLoader",
      "  samples: " .. self.n .. (self.sampler and " (this rank's share)" or ""),
      ("  batches: %d of %d%s"):format(self:len(), self.batch_size,
                                       self.drop_last and " (drop_last)" or ""),
      "  order: " .. (self.shuffle and ("shuffled, seed " .. self.seed) or "in order"),
      ("  output: float32, %d channel(s), %s; %d worker(s)"):format(self.nch,
         o.out_fmt == dtypes.channels_last.id and "channels_last" or "contiguous", o.workers),
      "  transforms: " .. table.concat(t, ", "),
   }, "\n")
end

--- iterate over one epoch: `for x, y, i in loader:iter(epoch) do ... end` (i: the batch
--- number, 1-based; y is nil for a data set without labels). epoch defaults to the loader's
--- own counter, which then advances. start_batch (1-based, default 1) resumes an epoch
--- part-way: the batches are the same as in a full pass.
function Loader:iter(epoch, start_batch)
   local fname = "data.DataLoader"
   if epoch == nil then
      self.epoch = self.epoch + 1
      epoch = self.epoch
   end
   epoch = opt_int(fname, epoch, "epoch", 0, 2 ^ 40)
   start_batch = opt_int(fname, start_batch, "start_batch", 1, nil, 1)
   local n = self.n
   local order
   local sampler = self.sampler
   if sampler then
      sampler:set_epoch(epoch)
      order, n = sampler:_order()
   elseif self.shuffle then
      order = permutation(n, U64(self.seed) * 1000003 + epoch)
   else
      order = ffi.new("int64_t[?]", math.max(n, 1))
      for i = 0, n - 1 do order[i] = i end
   end
   local o = ffi.new("lm_loader_opts", self.opts)
   o.seed = U64(self.seed) * 7919 + U64(epoch) * 104729 + 1
   -- ranks: different augmentations (the positions of their shares are the same numbers)
   if sampler and sampler.rank > 0 then o.seed = o.seed + U64(sampler.rank) * 2654435761 end
   o.start_batch = start_batch - 1
   local lp = ffi.new("lm_loader*[1]")
   if self.folder then
      check(C.lm_image_loader_new(self.folder:_files(), order, n, self.folder._io, o, lp), fname)
   else
      check(C.lm_loader_new(self.images._c, self.labels and self.labels._c or nil, order, n, o,
         lp), fname)
   end
   local handle = ffi.gc(lp[0], C.lm_loader_free)
   local xp, yp = ffi.new("lm_tensor*[1]"), ffi.new("lm_tensor*[1]")
   local i = start_batch - 1
   local folder = self.folder
   local skipping = folder and folder.skip_corrupt
   return function()
      while handle ~= nil do
         check(C.lm_loader_next(handle, xp, yp), fname)
         if xp[0] == nil then
            ffi.gc(handle, nil)
            C.lm_loader_free(handle)
            handle = nil
            return nil
         end
         i = i + 1
         local x = wrap(xp[0])
         local y = yp[0] ~= nil and wrap(yp[0]) or nil
         if skipping then
            -- the images left out of this batch: one warning per file, for the folder's life
            local log = ffi.string(C.lm_loader_skipped(handle))
            for idx, msg in log:gmatch("(%d+)\t([^\n]*)\n") do
               idx = tonumber(idx)
               if not folder._warned[idx] then
                  folder._warned[idx] = true
                  io.stderr:write("lumen.data.DataLoader: warning: skipping a corrupt image: ",
                     msg, "\n")
               end
            end
         end
         -- a batch whose every image was corrupt has no rows: go on to the next one
         if x:size(1) > 0 then return x, y, i end
      end
      return nil
   end
end

return M
