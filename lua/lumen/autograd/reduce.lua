-- lumen.autograd.reduce -- the backward rules of the reductions: sum, mean, amax / amin, max /
-- min (over everything, along a dim, or elementwise against a tensor). Loading it replaces those
-- methods of lumen.tensor's Tensor table with differentiable versions over the raw forward
-- functions (lumen.tensor.raw); lumen.autograd loads it once.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type = type

local Tensor, raw, wrap, check, wrap_dim = T.Tensor, T.raw, T.wrap, T.check, T.wrap_dim
local is_tensor = T.is_tensor
local grad_enabled = G.is_grad_enabled
local needs, edge, attach, sizes_of, cast_like = G.needs, G.edge, G.attach, G.sizes_of,
   G.cast_like

local outp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")

-- int64 1..n along dim d (0-based) of an nd-dim shape (other dims 1)
-- made on the CPU, then copied to device id dev (the indices' device) when that is another
local function iota_along(n, d, nd, dev)
   local buf = ffi.new("double[?]", n)
   for i = 0, n - 1 do buf[i] = i + 1 end
   for i = 0, nd - 1 do sizebuf[i] = 1 end
   sizebuf[d] = n
   outp[0] = nil
   check(C.lm_empty(nd, sizebuf, 4, 0, 0, outp), "backward")
   local t = wrap(outp[0])
   check(C.lm_from_doubles(t._c, buf), "backward")
   if dev ~= nil and dev ~= T.DEV_CPU then t = raw.to(t, T.device_name(dev)) end
   return t
end

-- normalised 0-based dims of a reduction (nil: all), as a sorted array
local function reduce_dims(fname, dims, nd)
   local r = {}
   if dims == nil then
      for i = 0, nd - 1 do r[#r + 1] = i end
   elseif type(dims) == "table" then
      for i = 1, #dims do r[#r + 1] = wrap_dim(fname, dims[i], nd) end
   else
      r[1] = wrap_dim(fname, dims, nd)
   end
   table.sort(r)
   return r
end

-- the gradient of a reduction over dims (0-based, sorted) brought back to the input's shape:
-- unsqueeze the reduced dims unless keepdim, then expand
local function unreduce(g, dims, keepdim, in_sizes)
   if not keepdim then
      local ks = {}
      for i = 1, #in_sizes do ks[i] = in_sizes[i] end
      for i = 1, #dims do ks[dims[i] + 1] = 1 end
      g = raw.reshape(g, ks)
   end
   return raw.expand(g, in_sizes)
end

do
   local r_sum, r_mean = raw.sum, raw.mean

   local function rec_sum(out, self, dims, keepdim, dtype)
      local c = self._c
      local in_sizes, did = sizes_of(c), c.dtype
      local rd = reduce_dims("sum", dims, c.ndim)
      attach(out, "SumBackward", function(g)
         return cast_like(unreduce(g, rd, keepdim, in_sizes), did)
      end, { edge(self) })
   end
   function Tensor.sum(self, dims, keepdim, dtype)
      local out = r_sum(self, dims, keepdim, dtype)
      if grad_enabled() and needs(self) then rec_sum(out, self, dims, keepdim, dtype) end
      return out
   end

   local function rec_mean(out, self, dims, keepdim, dtype)
      local c = self._c
      local in_sizes, did = sizes_of(c), c.dtype
      local rd = reduce_dims("mean", dims, c.ndim)
      local count = 1
      for i = 1, #rd do count = count * in_sizes[rd[i] + 1] end
      attach(out, "MeanBackward", function(g)
         return cast_like(unreduce(raw.div(g, count), rd, keepdim, in_sizes), did)
      end, { edge(self) })
   end
   function Tensor.mean(self, dims, keepdim, dtype)
      local out = r_mean(self, dims, keepdim, dtype)
      if grad_enabled() and needs(self) then rec_mean(out, self, dims, keepdim, dtype) end
      return out
   end

   -- amax / amin: the gradient is shared evenly between tied extremes
   local function amaxmin(name, rawf)
      local function rec(out, self, dims, keepdim)
         local c = self._c
         local in_sizes = sizes_of(c)
         local rd = reduce_dims(name, dims, c.ndim)
         local d1 = {}
         for i = 1, #rd do d1[i] = rd[i] + 1 end
         attach(out, name:gsub("^%l", string.upper) .. "Backward", function(g)
            local y = unreduce(out, rd, keepdim, in_sizes)
            local mask = raw.eq(self, y)
            local cnt = raw.sum(mask, d1, true)
            local gk = unreduce(g, rd, keepdim, in_sizes)
            return raw.div(raw.mul(gk, mask), cnt)
         end, { edge(self) })
      end
      return function(self, dims, keepdim)
         local out = rawf(self, dims, keepdim)
         if grad_enabled() and needs(self) then rec(out, self, dims, keepdim) end
         return out
      end
   end
   Tensor.amax = amaxmin("amax", raw.amax)
   Tensor.amin = amaxmin("amin", raw.amin)

   -- max / min: no dim -> evenly distributed among ties; a dim -> to the returned index; a
   -- tensor -> elementwise maximum / minimum
   local function maxmin(name, rawf, elementwise)
      local slow
      local function fast(self, dim, keepdim)
         if is_tensor(dim) then return Tensor[elementwise](self, dim) end
         local values, indices = rawf(self, dim, keepdim)
         if not (grad_enabled() and needs(self)) then
            return values, indices
         end
         return slow(self, dim, keepdim, values, indices)
      end
      slow = function(self, dim, keepdim, values, indices)
         local c = self._c
         local in_sizes = sizes_of(c)
         local bname = name:gsub("^%l", string.upper) .. "Backward"
         if dim == nil then
            attach(values, bname, function(g)
               local mask = raw.eq(self, values)
               local ones = {}
               for i = 1, #in_sizes do ones[i] = 1 end
               local share = raw.reshape(raw.div(g, raw.sum(mask)), ones)
               return raw.mul(raw.expand(share, in_sizes), mask)
            end, { edge(self) })
            return values
         end
         local d = wrap_dim(name, dim, c.ndim)
         local nd = c.ndim
         attach(values, bname, function(g)
            local idx = indices
            if not keepdim and nd > 0 then
               g = raw.unsqueeze(g, d + 1)
               idx = raw.unsqueeze(idx, d + 1)
            end
            local mask = raw.eq(iota_along(in_sizes[d + 1] or 1, d, math.max(nd, 1),
                                           idx._c.device), idx)
            if nd == 0 then mask = raw.reshape(mask, {}) end
            return T.where(mask, raw.expand(g, in_sizes), 0)
         end, { edge(self) })
         return values, indices
      end
      return fast
   end
   Tensor.max = maxmin("max", raw.max, "maximum")
   Tensor.min = maxmin("min", raw.min, "minimum")
end
