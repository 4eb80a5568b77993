-- lumen.autograd.shape -- the backward rules of the views and layout changes (view, reshape,
-- flatten, squeeze, unsqueeze, contiguous, clone, to, alias, permute, transpose, expand, narrow,
-- select, as_strided) and of cat. Loading it replaces those methods of lumen.tensor's Tensor
-- table (and T.cat) with differentiable versions over the raw forward functions
-- (lumen.tensor.raw); lumen.autograd loads it once. Returns { cat = the differentiable cat }.

local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type, tonumber = type, tonumber
local unpack = unpack

local Tensor, raw, argerror, wrap_dim = T.Tensor, T.raw, T.argerror, T.wrap_dim
local grad_enabled = G.is_grad_enabled
local needs, edge, attach, sizes_of, sum_to = G.needs, G.edge, G.attach, G.sizes_of, G.sum_to
local cast_like, zeros_for = G.cast_like, G.zeros_for

local R = {}

-- views and layout -------------------------------------------------------------------------

do
   local r_reshape = raw.reshape

   -- ops whose gradient is the incoming gradient reshaped to the input's sizes
   local function reshaping(name, bname)
      local f = raw[name]
      local function rec(out, self)
         local in_sizes = sizes_of(self._c)
         attach(out, bname, function(g) return r_reshape(g, in_sizes) end, { edge(self) })
      end
      Tensor[name] = function(self, ...)
         local out = f(self, ...)
         if grad_enabled() and out ~= self and needs(self) then rec(out, self) end
         return out
      end
   end
   reshaping("view", "ViewBackward")
   reshaping("reshape", "ReshapeBackward")
   reshaping("flatten", "FlattenBackward")
   reshaping("squeeze", "SqueezeBackward")
   reshaping("unsqueeze", "UnsqueezeBackward")

   -- ops whose gradient passes through unchanged (same sizes)
   local function identity(name, bname)
      local f = raw[name]
      local function rec(out, self)
         local did = self._c.dtype
         local dev = self._c.device
         attach(out, bname, function(g)
            if g._c.device ~= dev then g = raw.to(g, T.device_name(dev)) end
            return cast_like(g, did)
         end, { edge(self) })
      end
      Tensor[name] = function(self, ...)
         local out = f(self, ...)
         if grad_enabled() and out ~= self and needs(self) then rec(out, self) end
         return out
      end
   end
   identity("contiguous", "ContiguousBackward")
   identity("clone", "CloneBackward")
   identity("to", "ToCopyBackward")
   identity("alias", "AliasBackward")

   local function rec_permute(out, self, ...)
      local dims = ...
      if type(dims) ~= "table" then dims = { ... } end
      local nd = self._c.ndim
      local inv = {}
      for i = 1, nd do inv[wrap_dim("permute", dims[i], nd) + 1] = i end
      attach(out, "PermuteBackward", function(g) return raw.permute(g, inv) end,
             { edge(self) })
   end
   function Tensor.permute(self, ...)
      local out = raw.permute(self, ...)
      if grad_enabled() and needs(self) then rec_permute(out, self, ...) end
      return out
   end

   local function rec_transpose(out, self, d0, d1)
      attach(out, "TransposeBackward", function(g) return raw.transpose(g, d0, d1) end,
             { edge(self) })
   end
   function Tensor.transpose(self, d0, d1)
      local out = raw.transpose(self, d0, d1)
      if grad_enabled() and needs(self) then rec_transpose(out, self, d0, d1) end
      return out
   end

   local function rec_expand(out, self)
      local m = { ndim = self._c.ndim, sizes = sizes_of(self._c),
                  dtype = dtypes.from_id(self._c.dtype) }
      attach(out, "ExpandBackward", function(g) return sum_to(g, m) end, { edge(self) })
   end
   function Tensor.expand(self, ...)
      local out = raw.expand(self, ...)
      if grad_enabled() and needs(self) then rec_expand(out, self) end
      return out
   end

   local function rec_narrow(out, self, d, start, length)
      local in_sizes = sizes_of(self._c)
      local fmt = C.lm_suggest_memory_format(self._c, 0)
      attach(out, "NarrowBackward", function(g)
         local z = zeros_for(g, in_sizes, fmt)
         raw.copy_(raw.narrow(z, d, start, length), g)
         return z
      end, { edge(self) })
   end
   function Tensor.narrow(self, d, start, length)
      local out = raw.narrow(self, d, start, length)
      if grad_enabled() and needs(self) then rec_narrow(out, self, d, start, length) end
      return out
   end

   local function rec_select(out, self, d, i)
      local in_sizes = sizes_of(self._c)
      local fmt = C.lm_suggest_memory_format(self._c, 0)
      attach(out, "SelectBackward", function(g)
         local z = zeros_for(g, in_sizes, fmt)
         raw.copy_(raw.select(z, d, i), g)
         return z
      end, { edge(self) })
   end
   function Tensor.select(self, d, i)
      local out = raw.select(self, d, i)
      if grad_enabled() and needs(self) then rec_select(out, self, d, i) end
      return out
   end

   local function rec_as_strided(out, self, sizes, strides, offset)
      argerror("as_strided", "as_strided is not differentiable in lumen (use detach())")
   end
   function Tensor.as_strided(self, sizes, strides, offset)
      local out = raw.as_strided(self, sizes, strides, offset)
      if grad_enabled() and needs(self) then rec_as_strided(out, self, sizes, strides, offset) end
      return out
   end
end

-- cat --------------------------------------------------------------------------------------

do
   local r_cat = raw.cat
   local rec_cat
   local function cat(list, dim)
      local out = r_cat(list, dim)
      if grad_enabled() then
         local any = false
         for i = 1, #list do if needs(list[i]) then any = true break end end
         if any then rec_cat(out, list, dim) end
      end
      return out
   end
   rec_cat = function(out, list, dim)
      local d0 = wrap_dim("cat", dim == nil and 1 or dim, list[1]._c.ndim)
      local inputs, lens, dts = {}, {}, {}
      for i = 1, #list do
         inputs[i] = edge(list[i])
         local c = list[i]._c
         -- legacy: 1-D empty tensors are skipped by cat
         if c.ndim == 1 and c.sizes[0] == 0 and out._c.ndim ~= 1 then
            lens[i] = 0                   -- legacy: empty 1-D tensors are skipped
         else
            lens[i] = tonumber(c.sizes[d0])
         end
         dts[i] = c.dtype
      end
      attach(out, "CatBackward", function(g)
         local res, off = {}, 1
         for i = 1, #inputs do
            if inputs[i] and lens[i] > 0 then
               res[i] = cast_like(raw.narrow(g, d0 + 1, off, lens[i]), dts[i])
            end
            off = off + lens[i]
         end
         return unpack(res, 1, #inputs)
      end, inputs)
   end
   T.cat = cat
   R.cat = cat
end

return R
