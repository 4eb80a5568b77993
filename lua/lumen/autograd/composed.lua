-- lumen.autograd.composed -- Tensor methods composed from differentiable ops (tinygrad's rule:
-- compose in Lua before writing C): var / std, masked_fill, chunk / split. Their values, formats,
-- devices and gradients come from the ops they are made of (mean, sub, mul, sum, sqrt, where,
-- narrow); std has its own backward only where sqrt's would divide by a zero deviation.
-- lumen.autograd loads it once, after the families it composes.

local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type, tostring, ipairs, pairs = type, tostring, ipairs, pairs

local Tensor, raw, argerror = T.Tensor, T.raw, T.argerror
local grad_enabled, needs, record = G.is_grad_enabled, G.needs, G.record

local M = {}

-- the self / operand check of the composed methods (composed_math.lua, composed_shape.lua too)
function M.tensor_arg(fname, t, what)
   if not T.is_tensor(t) then
      argerror(fname, ("%s must be a tensor, got %s"):format(what or "self", T.typename(t)))
   end
   return t
end

local FLOATS = { float32 = true, float64 = true, float16 = true, bfloat16 = true }

-- the reduced dims of a reduction's dims argument (nil: every dim, a number, or a list): the
-- 1-based list and the set of their 0-based positions (shared with composed_math.lua)
-- y in self's memory format (PyTorch's empty_like(self) results: masked_fill, tril, nan_to_num)
function M.keep_format(y, self)
   local fmt = Tensor.suggest_memory_format(self)
   if tostring(fmt) ~= "contiguous_format" and not Tensor.is_contiguous(y, fmt) then
      y = Tensor.contiguous(y, fmt)
   end
   return y
end

function M.dim_list(fname, self, dims)
   local nd = Tensor.dim(self)
   local list = {}
   if dims == nil then
      for i = 1, nd do list[i] = i end
   elseif type(dims) == "number" then
      list[1] = dims
   elseif type(dims) == "table" then
      for i = 1, #dims do list[i] = dims[i] end
   else
      argerror(fname, "dim must be nil, a number or a list of numbers, got " .. T.typename(dims))
   end
   local set = {}
   for _, d in ipairs(list) do
      local z = T.wrap_dim(fname, d, nd, 3)
      if set[z] then argerror(fname, ("dim %d appears more than once in the list"):format(d)) end
      set[z] = true
   end
   return list, set
end

-- how many elements each output value of a reduction over dims sums
local function reduced(fname, self, dims)
   local sizes = Tensor.size(self)
   local _, set = M.dim_list(fname, self, dims)
   local n = 1
   for z in pairs(set) do n = n * sizes[z + 1] end
   return n
end

-- var(dims, unbiased | {correction = 1, keepdim = false}, keepdim): PyTorch's variance over dims
-- (nil: every element), divided by N - correction (unbiased = true is correction 1, false 0;
-- N - correction <= 0 gives inf or NaN, as PyTorch's, which also warns)
local function var_args(fname, self, dims, opt, keepdim)
   local dt = tostring(Tensor.dtype(self))
   if not FLOATS[dt] then
      argerror(fname, "std and var only support floating point dtypes, got " .. dt, 4)
   end
   local correction = 1
   if type(opt) == "boolean" then
      correction = opt and 1 or 0
   elseif type(opt) == "table" then
      for k in pairs(opt) do
         if k ~= "correction" and k ~= "keepdim" and k ~= "unbiased" then
            argerror(fname, "unknown option '" .. tostring(k) .. "'", 4)
         end
      end
      if opt.unbiased ~= nil then correction = opt.unbiased and 1 or 0 end
      if opt.correction ~= nil then
         if type(opt.correction) ~= "number" then
            argerror(fname, "correction must be a number, got " .. T.typename(opt.correction), 4)
         end
         correction = opt.correction
      end
      if opt.keepdim ~= nil then keepdim = opt.keepdim end
   elseif opt ~= nil then
      argerror(fname, "expected unbiased (a boolean) or an options table {correction =, " ..
               "keepdim =}, got " .. T.typename(opt), 4)
   end
   if keepdim ~= nil and type(keepdim) ~= "boolean" then
      argerror(fname, "keepdim must be a boolean, got " .. T.typename(keepdim), 4)
   end
   local n = reduced(fname, self, dims)
   local den = n - correction
   if den < 0 then den = 0 end
   return correction, keepdim == true, den
end

local function variance(self, dims, keepdim, den)
   local m = Tensor.mean(self, dims, true)
   local d = Tensor.sub(self, m)
   return Tensor.div(Tensor.sum(Tensor.mul(d, d), dims, keepdim), den), d
end

function Tensor.var(self, dims, opt, keepdim)
   local _, kd, den = var_args("var", self, dims, opt, keepdim)
   return (variance(self, dims, kd, den))
end

-- std = sqrt(var); its gradient (x - mean) / (den * std) is 0 where std is 0 (PyTorch's), where
-- sqrt's would be 0 * inf
function Tensor.std(self, dims, opt, keepdim)
   local _, kd, den = var_args("std", self, dims, opt, keepdim)
   if not (grad_enabled() and needs(self)) then
      local v = variance(self, dims, kd, den)
      return raw.sqrt(v)
   end
   local v, dev = G.no_grad(function() return variance(Tensor.detach(self), dims, kd, den) end)
   local out = raw.sqrt(v)
   record(out, "StdBackward", function(g)
      local s, gk = out, g
      if not kd and dims ~= nil then
         -- put the reduced dims back as size 1, so g and std broadcast against x
         local sizes = Tensor.size(self)
         local keep = {}
         local list = type(dims) == "number" and { dims } or dims
         local red = {}
         for _, d in ipairs(list) do red[T.wrap_dim("std", d, #sizes) + 1] = true end
         for i = 1, #sizes do keep[i] = red[i] and 1 or sizes[i] end
         s, gk = raw.reshape(out, keep), raw.reshape(g, keep)
      end
      local scale = raw.where(raw.eq(s, 0), 0, raw.div(gk, raw.mul(s, den)))
      return raw.mul(dev, scale)
   end, self)
   return out
end

-- masked_fill(mask, value): value where the bool mask (broadcast to self's sizes) is true, self
-- elsewhere; the result has self's sizes and memory format, as PyTorch's (a clone filled in
-- place); the gradient flows to self where the mask is false
function Tensor.masked_fill(self, mask, value)
   if not T.is_tensor(mask) or tostring(Tensor.dtype(mask)) ~= "bool" then
      argerror("masked_fill", "mask must be a bool tensor, got " ..
               (T.is_tensor(mask) and tostring(Tensor.dtype(mask)) or T.typename(mask)))
   end
   if type(value) ~= "number" and not (T.is_tensor(value) and Tensor.dim(value) == 0) then
      argerror("masked_fill", "value must be a number or a 0-dim tensor, got " ..
               (T.is_tensor(value) and (Tensor.dim(value) .. "-D tensor") or T.typename(value)))
   end
   if T.is_tensor(value) then
      -- a 0-dim tensor value keeps its gradient (the sum of the gradient where the mask is
      -- true, as PyTorch's); it joins self's device and dtype first
      if Tensor.device(value) ~= Tensor.device(self) then
         value = Tensor.to(value, Tensor.device(self))
      end
      if Tensor.dtype(value) ~= Tensor.dtype(self) then
         value = Tensor.to(value, Tensor.dtype(self))
      end
   end
   local ms, ss = Tensor.size(mask), Tensor.size(self)
   if #ms > #ss then
      argerror("masked_fill", ("mask of %d dims does not broadcast to self's %d"):format(#ms, #ss))
   end
   local y = T.where(Tensor.expand(mask, ss), value, self)
   if Tensor.dtype(y) ~= Tensor.dtype(self) then y = Tensor.to(y, Tensor.dtype(self)) end
   return M.keep_format(y, self)
end

-- the 1-based dim of chunk / split (default 1; negative from the end) and its size
local function split_dim(fname, self, dim)
   local sizes = Tensor.size(self)
   if #sizes == 0 then argerror(fname, "cannot split a 0-dim tensor", 3) end
   local d = T.wrap_dim(fname, dim or 1, #sizes, 2) + 1
   return d, sizes[d]
end

-- chunk(chunks, dim = 1): views of ceil(size / chunks) along dim, the last smaller (fewer than
-- chunks when the size runs out), as torch.chunk
function Tensor.chunk(self, chunks, dim)
   if type(chunks) ~= "number" or chunks % 1 ~= 0 or chunks < 1 then
      argerror("chunk", "chunks must be a positive integer, got " .. tostring(chunks))
   end
   local n
   dim, n = split_dim("chunk", self, dim)
   local step = math.ceil(n / chunks)
   if step == 0 then return { self } end
   local out = {}
   for s = 1, n, step do out[#out + 1] = Tensor.narrow(self, dim, s, math.min(step, n - s + 1)) end
   return out
end

-- split(size | {sizes}, dim = 1): views along dim of size each (the last smaller), or of the
-- listed sizes (which must sum to the dim's size), as torch.split
function Tensor.split(self, split, dim)
   local n
   dim, n = split_dim("split", self, dim)
   local out = {}
   if type(split) == "number" then
      if split % 1 ~= 0 or split < 1 then
         argerror("split", "split_size must be a positive integer, got " .. tostring(split))
      end
      for s = 1, n, split do
         out[#out + 1] = Tensor.narrow(self, dim, s, math.min(split, n - s + 1))
      end
      if n == 0 then out[1] = self end
      return out
   end
   if type(split) ~= "table" then
      argerror("split", "expected a size or a list of sizes, got " .. T.typename(split))
   end
   local total = 0
   for i = 1, #split do
      local v = split[i]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
         argerror("split", ("sizes[%d] must be a non-negative integer, got %s"):format(i,
                  tostring(v)))
      end
      total = total + v
   end
   if total ~= n then
      argerror("split", ("split sizes sum to %d but dim %d has size %d"):format(total, dim, n))
   end
   local s = 1
   for i = 1, #split do
      out[i] = Tensor.narrow(self, dim, s, split[i])
      s = s + split[i]
   end
   return out
end

return M
