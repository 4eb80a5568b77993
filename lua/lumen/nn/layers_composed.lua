-- lumen.nn.layers_composed -- the modules of lm.F's composed operators, as PyTorch's:
--   losses: L1Loss, SmoothL1Loss, HuberLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss;
--   activations: LogSigmoid, Softsign, Tanhshrink, Softshrink, Hardshrink, Threshold, GLU, PReLU,
--     Softmin;
--   distances: CosineSimilarity, PairwiseDistance;
--   padding: ZeroPad1d/2d/3d, ConstantPad1d/2d/3d, ReflectionPad1d/2d/3d,
--     ReplicationPad1d/2d/3d, CircularPad1d/2d/3d (F.pad);
--   Unflatten.
-- Constructors take PyTorch's positional arguments or an options table with its keyword names.

local T = require("lumen.tensor")
local F = require("lumen.functional")
local Module = require("lumen.nn.module")
local util = require("lumen.util")
local creation = require("lumen.creation")

local type, tostring, getmetatable, ipairs = type, tostring, getmetatable, ipairs

local M = {}

local function fail(fname, msg) T.argerror(fname, msg) end
local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end
local option_set = util.option_set

local opts_arg = require("lumen.nn.layers")._opts_arg

---------------------------------------------------------------------------------------------
-- losses: Module(opts) -> F.<fn>(input, target, opts); tensors in the options (weight,
-- pos_weight) are buffers, so module:to(device) moves them
---------------------------------------------------------------------------------------------

local function loss_module(name, fn, ...)
   local cls = Module:extend(name)
   M[name] = cls
   local known = option_set("reduction", ...)
   function cls:__init(opts)
      opts = opts_arg(name, opts, known)
      local r = opts.reduction
      if r ~= nil and r ~= "mean" and r ~= "sum" and r ~= "none"
         and not (r == "batchmean" and fn == "kl_div") then
         fail(name, tostring(r) .. " is not a valid value for reduction")
      end
      self._opt_names = {}
      for k, v in pairs(opts) do
         if T.is_tensor(v) then
            self:register_buffer(k, v)
         else
            self[k] = v
         end
         self._opt_names[#self._opt_names + 1] = k
      end
      if self.reduction == nil then self.reduction = "mean" end
   end
   function cls:forward(input, target)
      local o = { reduction = self.reduction }
      for _, k in ipairs(self._opt_names) do o[k] = self[k] end
      return F[fn](input, target, o)
   end
   function cls:extra_repr() return "reduction=" .. self.reduction end
   return cls
end
loss_module("L1Loss", "l1_loss")
loss_module("SmoothL1Loss", "smooth_l1_loss", "beta")
loss_module("HuberLoss", "huber_loss", "delta")
loss_module("BCELoss", "binary_cross_entropy", "weight")
loss_module("BCEWithLogitsLoss", "binary_cross_entropy_with_logits", "weight", "pos_weight")
loss_module("KLDivLoss", "kl_div", "log_target")

---------------------------------------------------------------------------------------------
-- activations
---------------------------------------------------------------------------------------------

local function plain_module(name, fn)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:forward(x) return F[fn](x) end
   return cls
end
plain_module("LogSigmoid", "logsigmoid")
plain_module("Softsign", "softsign")
plain_module("Tanhshrink", "tanhshrink")

-- Softshrink(lambd = 0.5) / Hardshrink(lambd = 0.5), or ({lambd =})
local function shrink_module(name, fn)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(lambd)
      if plain_table(lambd) then lambd = opts_arg(name, lambd, option_set("lambd")).lambd end
      if lambd == nil then lambd = 0.5 end
      if type(lambd) ~= "number" then
         fail(name, "lambd must be a number, got " .. T.typename(lambd))
      end
      self.lambd = lambd
   end
   function cls:forward(x) return F[fn](x, self.lambd) end
   function cls:extra_repr() return tostring(self.lambd) end
   return cls
end
shrink_module("Softshrink", "softshrink")
shrink_module("Hardshrink", "hardshrink")

-- Threshold(threshold, value, inplace = false) or ({threshold =, value =, inplace =})
local Threshold = Module:extend("Threshold")
M.Threshold = Threshold
function Threshold:__init(threshold, value, inplace)
   if plain_table(threshold) then
      local o = opts_arg("Threshold", threshold, option_set("threshold", "value", "inplace"))
      threshold, value, inplace = o.threshold, o.value, o.inplace
   end
   if type(threshold) ~= "number" or type(value) ~= "number" then
      fail("Threshold", "threshold and value must be numbers, got " .. T.typename(threshold) ..
           " and " .. T.typename(value))
   end
   if inplace ~= nil and type(inplace) ~= "boolean" then
      fail("Threshold", "inplace must be a boolean, got " .. T.typename(inplace))
   end
   self.threshold, self.value, self.inplace = threshold, value, inplace == true
end
function Threshold:forward(x) return F.threshold(x, self.threshold, self.value, self.inplace) end
function Threshold:extra_repr()
   return ("threshold=%s, value=%s%s"):format(self.threshold, self.value,
                                               self.inplace and ", inplace=True" or "")
end

-- GLU(dim = -1) / Softmin(dim)
local function dim_module(name, fn, default)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(dim)
      if plain_table(dim) then dim = opts_arg(name, dim, option_set("dim")).dim end
      if dim == nil then dim = default end
      if dim ~= nil and (type(dim) ~= "number" or dim % 1 ~= 0) then
         fail(name, "dim must be an integer, got " .. tostring(dim))
      end
      self.dim = dim
   end
   function cls:forward(x) return F[fn](x, self.dim) end
   function cls:extra_repr() return self.dim and ("dim=" .. self.dim) or "" end
   return cls
end
dim_module("GLU", "glu", -1)
dim_module("Softmin", "softmin", nil)

-- PReLU(num_parameters = 1, init = 0.25) or ({num_parameters =, init =, dtype =, device =}):
-- a learnable slope, one or one per channel
local PReLU = Module:extend("PReLU")
M.PReLU = PReLU
function PReLU:__init(num_parameters, init)
   local dtype, device
   if plain_table(num_parameters) then
      local o = opts_arg("PReLU", num_parameters,
                         option_set("num_parameters", "init", "dtype", "device"))
      num_parameters, init, dtype, device = o.num_parameters, o.init, o.dtype, o.device
   end
   num_parameters = num_parameters or 1
   init = init or 0.25
   if type(num_parameters) ~= "number" or num_parameters % 1 ~= 0 or num_parameters < 1 then
      fail("PReLU", "num_parameters must be a positive integer, got " .. tostring(num_parameters))
   end
   if type(init) ~= "number" then
      fail("PReLU", "init must be a number, got " .. T.typename(init))
   end
   self.num_parameters = num_parameters
   self.weight = Module.Parameter(creation.full({ num_parameters }, init,
                                                { dtype = dtype, device = device }))
end
function PReLU:forward(x) return F.prelu(x, self.weight) end
function PReLU:extra_repr() return "num_parameters=" .. self.num_parameters end

---------------------------------------------------------------------------------------------
-- distances
---------------------------------------------------------------------------------------------

-- CosineSimilarity(dim = 2, eps = 1e-8) or ({dim =, eps =})
local CosineSimilarity = Module:extend("CosineSimilarity")
M.CosineSimilarity = CosineSimilarity
function CosineSimilarity:__init(dim, eps)
   if plain_table(dim) then
      local o = opts_arg("CosineSimilarity", dim, option_set("dim", "eps"))
      dim, eps = o.dim, o.eps
   end
   self.dim, self.eps = dim or 2, eps or 1e-8
end
function CosineSimilarity:forward(a, b)
   return F.cosine_similarity(a, b, { dim = self.dim, eps = self.eps })
end

-- PairwiseDistance(p = 2, eps = 1e-6, keepdim = false) or ({p =, eps =, keepdim =})
local PairwiseDistance = Module:extend("PairwiseDistance")
M.PairwiseDistance = PairwiseDistance
function PairwiseDistance:__init(p, eps, keepdim)
   if plain_table(p) then
      local o = opts_arg("PairwiseDistance", p, option_set("p", "eps", "keepdim"))
      p, eps, keepdim = o.p, o.eps, o.keepdim
   end
   self.norm, self.eps, self.keepdim = p or 2, eps or 1e-6, keepdim == true
end
function PairwiseDistance:forward(a, b)
   return F.pairwise_distance(a, b, { p = self.norm, eps = self.eps, keepdim = self.keepdim })
end

---------------------------------------------------------------------------------------------
-- padding: <Kind>Pad<k>d(padding[, value]) = F.pad(x, padding, {mode =, value =}); padding a
-- number (the same on every side) or PyTorch's 2k-list, last dim first
---------------------------------------------------------------------------------------------

local function pad_module(name, mode, k, with_value)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(padding, value)
      if plain_table(padding) and padding.padding ~= nil then
         local o = opts_arg(name, padding, with_value and option_set("padding", "value")
                            or option_set("padding"))
         padding, value = o.padding, o.value
      end
      local list = {}
      if type(padding) == "number" then
         for i = 1, 2 * k do list[i] = padding end
      elseif plain_table(padding) and #padding == 2 * k then
         for i = 1, 2 * k do list[i] = padding[i] end
      else
         fail(name, ("padding must be a number or a list of %d numbers, got %s"):format(2 * k,
              plain_table(padding) and (#padding .. " numbers") or T.typename(padding)))
      end
      for i, p in ipairs(list) do
         if type(p) ~= "number" or p % 1 ~= 0 then
            fail(name, ("padding[%d] must be an integer, got %s"):format(i, tostring(p)))
         end
      end
      if with_value then
         if value == nil and mode == "constant" and name:find("^Constant") then
            fail(name, "value is required (the fill value)")
         end
         if value ~= nil and type(value) ~= "number" then
            fail(name, "value must be a number, got " .. T.typename(value))
         end
      end
      self.padding, self.value = list, value or 0
   end
   function cls:forward(x)
      local want = k + 2
      local nd = T.Tensor.dim(x)
      if nd ~= want and nd ~= want - 1 then
         fail(name, ("expected a %d-D or %d-D input, got %d-D"):format(want - 1, want, nd))
      end
      return F.pad(x, self.padding, { mode = mode, value = mode == "constant" and self.value
                                        or nil })
   end
   function cls:extra_repr()
      local parts = {}
      for i, p in ipairs(self.padding) do parts[i] = tostring(p) end
      local s = "(" .. table.concat(parts, ", ") .. ")"
      if mode == "constant" and name:find("^Constant") then s = s .. ", value=" .. self.value end
      return s
   end
   return cls
end
for k = 1, 3 do
   pad_module("ZeroPad" .. k .. "d", "constant", k, false)
   pad_module("ConstantPad" .. k .. "d", "constant", k, true)
   pad_module("ReflectionPad" .. k .. "d", "reflect", k, false)
   pad_module("ReplicationPad" .. k .. "d", "replicate", k, false)
   pad_module("CircularPad" .. k .. "d", "circular", k, false)
end

---------------------------------------------------------------------------------------------
-- Embedding(num_embeddings, embedding_dim, {padding_idx =, dtype =, device =}): a learned table
-- looked up by 1-based int64 indices (F.embedding); weight drawn from N(0, 1), the padding row
-- zero, as PyTorch's. Embedding.from_pretrained(weights, {freeze = true, padding_idx =}).
---------------------------------------------------------------------------------------------

local Embedding = Module:extend("Embedding")
M.Embedding = Embedding
local EMBEDDING_OPTS = option_set("padding_idx", "dtype", "device", "max_norm",
                                  "scale_grad_by_freq", "sparse", "_weight", "_freeze")
function Embedding:__init(num_embeddings, embedding_dim, opts)
   opts = opts_arg("Embedding", opts, EMBEDDING_OPTS)
   for _, v in ipairs({ num_embeddings, embedding_dim }) do
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
         fail("Embedding", ("num_embeddings and embedding_dim must be non-negative integers, " ..
              "got %s and %s"):format(tostring(num_embeddings), tostring(embedding_dim)))
      end
   end
   if opts.max_norm ~= nil or opts.scale_grad_by_freq or opts.sparse then
      fail("Embedding", "max_norm, scale_grad_by_freq and sparse are not supported")
   end
   local p = opts.padding_idx
   if p ~= nil then
      if type(p) ~= "number" or p % 1 ~= 0 or p == 0 or p > num_embeddings
         or p < -num_embeddings then
         fail("Embedding", ("padding_idx must be within num_embeddings (1..%d or -%d..-1), " ..
              "got %s"):format(num_embeddings, num_embeddings, tostring(p)))
      end
      if p < 0 then p = num_embeddings + p + 1 end
   end
   self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, p
   local w = opts._weight
   if w == nil then
      w = creation.empty({ num_embeddings, embedding_dim },
                         { dtype = opts.dtype, device = opts.device })
      require("lumen.autograd").no_grad(function()
         T.Tensor.normal_(w)
         if p ~= nil then T.Tensor.fill_(T.Tensor.select(w, 1, p), 0) end
      end)
   end
   self.weight = Module.Parameter(w, not opts._freeze)
end
function Embedding:forward(x) return F.embedding(x, self.weight, self.padding_idx) end
function Embedding:extra_repr()
   local s = ("%d, %d"):format(self.num_embeddings, self.embedding_dim)
   if self.padding_idx then s = s .. ", padding_idx=" .. self.padding_idx end
   return s
end
-- from_pretrained(embeddings, {freeze = true, padding_idx =}): a table holding a copy of
-- embeddings (2-D), not trained when freeze
function Embedding.from_pretrained(embeddings, opts)
   opts = opts_arg("Embedding.from_pretrained", opts, option_set("freeze", "padding_idx"))
   if not T.is_tensor(embeddings) or T.Tensor.dim(embeddings) ~= 2 then
      fail("Embedding.from_pretrained", "embeddings must be a 2-D tensor")
   end
   local freeze = opts.freeze
   if freeze == nil then freeze = true end
   return Embedding(T.Tensor.size(embeddings, 1), T.Tensor.size(embeddings, 2),
                    { padding_idx = opts.padding_idx,
                      _weight = T.Tensor.clone(T.Tensor.detach(embeddings)), _freeze = freeze })
end

---------------------------------------------------------------------------------------------
-- Unflatten(dim, sizes): Tensor:unflatten
---------------------------------------------------------------------------------------------

local Unflatten = Module:extend("Unflatten")
M.Unflatten = Unflatten
function Unflatten:__init(dim, sizes)
   if type(dim) ~= "number" or dim % 1 ~= 0 then
      fail("Unflatten", "dim must be an integer, got " .. tostring(dim))
   end
   if not plain_table(sizes) or #sizes == 0 then
      fail("Unflatten", "unflattened_size must be a non-empty list of sizes")
   end
   self.dim, self.unflattened_size = dim, sizes
end
function Unflatten:forward(x) return T.Tensor.unflatten(x, self.dim, self.unflattened_size) end
function Unflatten:extra_repr()
   return ("dim=%d, unflattened_size=(%s)"):format(self.dim,
                                                   table.concat(self.unflattened_size, ", "))
end

return M
