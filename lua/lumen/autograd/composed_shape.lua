-- lumen.autograd.composed_shape -- the shape Tensor methods a PyTorch user reaches for on day
-- one, composed from views and differentiable copies: unbind, movedim / moveaxis, swapaxes /
-- swapdims, unflatten, broadcast_to, roll, diagonal (a view with its own backward), diag, repeat,
-- tile; and the new_* factories (new_zeros, new_ones,
-- new_full, new_empty, new_tensor) and the in-place random fills (uniform_, normal_,
-- bernoulli_, random_), which make values with self's dtype and device. lumen.autograd loads it
-- once, after the families it composes.

local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")
local C = require("lumen.C")

local type, tostring, pairs, select, floor, math = type, tostring, pairs, select, math.floor,
   math

local Tensor, argerror = T.Tensor, T.argerror
local grad_enabled, needs = G.is_grad_enabled, G.needs

local M = {}

local function creation() return require("lumen.creation") end

local tensor_arg = require("lumen.autograd.composed").tensor_arg

local function int_arg(fname, v, what)
   if type(v) ~= "number" or v % 1 ~= 0 then
      argerror(fname, ("%s must be an integer, got %s"):format(what,
               type(v) == "number" and tostring(v) or T.typename(v)))
   end
   return v
end

-- a list of integers given as a table or as the varargs
local function int_list(fname, what, ...)
   local first = ...
   local list
   if type(first) == "table" and not T.is_tensor(first) then
      list = {}
      for i = 1, #first do list[i] = first[i] end
   else
      list = { ... }
   end
   for i = 1, #list do int_arg(fname, list[i], ("%s[%d]"):format(what, i)) end
   return list
end

---------------------------------------------------------------------------------------------
-- views
---------------------------------------------------------------------------------------------

-- unbind(dim = 1): the selects along dim, as a Lua array of views
function Tensor.unbind(self, dim)
   tensor_arg("unbind", self)
   local nd = Tensor.dim(self)
   if nd == 0 then argerror("unbind", "cannot unbind a 0-dim tensor") end
   local d = T.wrap_dim("unbind", dim or 1, nd) + 1
   local out = {}
   for i = 1, Tensor.size(self, d) do out[i] = Tensor.select(self, d, i) end
   return out
end

-- movedim(source, destination): the dims of source (a dim or a list) moved to the places of
-- destination, the others keeping their order (torch.movedim), as one permute view
function Tensor.movedim(self, source, destination)
   tensor_arg("movedim", self)
   local nd = Tensor.dim(self)
   local src = type(source) == "table" and source or { source }
   local dst = type(destination) == "table" and destination or { destination }
   if #src ~= #dst then
      argerror("movedim", ("source and destination must have the same number of dims, got %d " ..
               "and %d"):format(#src, #dst))
   end
   local order, taken, placed = {}, {}, {}
   for i = 1, #src do
      local s = T.wrap_dim("movedim", src[i], nd)
      local t = T.wrap_dim("movedim", dst[i], nd)
      if taken[s] then argerror("movedim", "repeated dim in source: " .. tostring(src[i])) end
      if placed[t] then argerror("movedim", "repeated dim in destination: " .. tostring(dst[i])) end
      taken[s], placed[t] = true, true
      order[t] = s
   end
   local rest = 0
   for t = 0, nd - 1 do
      if order[t] == nil then
         while taken[rest] do rest = rest + 1 end
         order[t] = rest
         rest = rest + 1
      end
   end
   local perm = {}
   for t = 0, nd - 1 do perm[t + 1] = order[t] + 1 end
   if nd == 0 then return Tensor.alias(self) end
   return Tensor.permute(self, perm)
end
Tensor.moveaxis = Tensor.movedim

-- swapaxes(a, b) / swapdims(a, b): transpose
function Tensor.swapaxes(self, a, b)
   tensor_arg("swapaxes", self)
   return Tensor.transpose(self, a, b)
end
Tensor.swapdims = Tensor.swapaxes

-- unflatten(dim, sizes): dim viewed as sizes (one of them may be -1), torch.unflatten
function Tensor.unflatten(self, dim, sizes)
   tensor_arg("unflatten", self)
   local nd = Tensor.dim(self)
   local d = T.wrap_dim("unflatten", dim, nd) + 1
   if type(sizes) ~= "table" or #sizes == 0 then
      argerror("unflatten", "sizes must be a non-empty list of integers, got " ..
               (type(sizes) == "table" and "an empty list" or T.typename(sizes)))
   end
   local n, known, free = Tensor.size(self, d), 1, nil
   for i = 1, #sizes do
      local s = int_arg("unflatten", sizes[i], ("sizes[%d]"):format(i))
      if s == -1 then
         if free then argerror("unflatten", "only one size may be -1") end
         free = i
      elseif s < 0 then
         argerror("unflatten", ("sizes[%d] must be non-negative or -1, got %d"):format(i, s))
      else
         known = known * s
      end
   end
   if (free == nil and known ~= n) or (free ~= nil and (known == 0 or n % known ~= 0)) then
      argerror("unflatten", ("sizes {%s} do not multiply to dim %d's size %d"):format(
               table.concat(sizes, ", "), d, n))
   end
   local full = {}
   for i = 1, d - 1 do full[#full + 1] = Tensor.size(self, i) end
   for i = 1, #sizes do full[#full + 1] = sizes[i] == -1 and floor(n / known) or sizes[i] end
   for i = d + 1, nd do full[#full + 1] = Tensor.size(self, i) end
   return Tensor.view(self, full)
end

-- broadcast_to(sizes): expand
function Tensor.broadcast_to(self, ...)
   tensor_arg("broadcast_to", self)
   return Tensor.expand(self, ...)
end

-- roll(shifts, dims): the elements shifted by shifts along dims (numbers or equal-length lists),
-- wrapping around; no dims: over the flattened tensor, sizes kept (torch.roll). Two narrows and
-- a cat per dim, so the gradient rolls back.
function Tensor.roll(self, shifts, dims)
   tensor_arg("roll", self)
   local sh = type(shifts) == "table" and shifts or { shifts }
   for i = 1, #sh do int_arg("roll", sh[i], ("shifts[%d]"):format(i)) end
   if dims == nil then
      if #sh ~= 1 then
         argerror("roll", "without dims, shifts must be one number, got " .. #sh)
      end
      local sizes = Tensor.size(self)
      return Tensor.view(Tensor.roll(Tensor.reshape(self, { -1 }), sh[1], 1), sizes)
   end
   local ds = type(dims) == "table" and dims or { dims }
   if #ds ~= #sh then
      argerror("roll", ("shifts and dims must have the same length, got %d and %d"):format(#sh,
               #ds))
   end
   local y = self
   for i = 1, #ds do
      local d = T.wrap_dim("roll", ds[i], Tensor.dim(self)) + 1
      local n = Tensor.size(y, d)
      local k = n > 0 and sh[i] % n or 0
      if k ~= 0 then
         y = T.cat({ Tensor.narrow(y, d, n - k + 1, k), Tensor.narrow(y, d, 1, n - k) }, d)
      end
   end
   if y == self then y = Tensor.clone(self) end
   return y
end

-- the diagonal view of t over the 0-based dims d1, d2, from t's own strides
local function diagonal_view(t, offset, d1, d2)
   local nd = Tensor.dim(t)
   local sizes, strides = Tensor.size(t), Tensor.stride(t)
   local s1, s2, t1, t2 = sizes[d1 + 1], sizes[d2 + 1], strides[d1 + 1], strides[d2 + 1]
   local len
   local at = Tensor.storage_offset(t)
   if offset >= 0 then
      len = math.max(0, math.min(s1, s2 - offset))
      if len > 0 then at = at + offset * t2 end
   else
      len = math.max(0, math.min(s1 + offset, s2))
      if len > 0 then at = at - offset * t1 end
   end
   local ns, nt = {}, {}
   for i = 1, nd do
      if i ~= d1 + 1 and i ~= d2 + 1 then ns[#ns + 1], nt[#nt + 1] = sizes[i], strides[i] end
   end
   ns[#ns + 1], nt[#nt + 1] = len, t1 + t2
   return T.raw.as_strided(t, ns, nt, at)
end

-- diagonal(offset = 0, dim1 = 1, dim2 = 2): a view of the diagonal of dims dim1 and dim2 (above
-- the main one for offset > 0, below for < 0) as a new last dim (torch.diagonal); its gradient
-- lands on that diagonal of a zero tensor
function Tensor.diagonal(self, offset, dim1, dim2)
   tensor_arg("diagonal", self)
   local nd = Tensor.dim(self)
   if nd < 2 then
      argerror("diagonal", "expected a tensor with at least 2 dims, got " .. nd)
   end
   offset = int_arg("diagonal", offset or 0, "offset")
   local d1 = T.wrap_dim("diagonal", dim1 or 1, nd)
   local d2 = T.wrap_dim("diagonal", dim2 or 2, nd)
   if d1 == d2 then argerror("diagonal", "dim1 and dim2 cannot be the same dim") end
   local out = diagonal_view(self, offset, d1, d2)
   if grad_enabled() and needs(self) then
      G.record(out, "DiagonalBackward", function(g)
         local z = creation().zeros(Tensor.size(self), { dtype = Tensor.dtype(self),
                                                        device = Tensor.device(self) })
         T.raw.copy_(diagonal_view(z, offset, d1, d2), g)
         return z
      end, self)
   end
   return out
end

-- diag(v, diagonal = 0): a 1-D v on the diagonal of a square matrix (zeros elsewhere), or the
-- diagonal of a 2-D v as a new 1-D tensor (torch.diag)
function Tensor.diag(self, diagonal)
   tensor_arg("diag", self)
   local k = int_arg("diag", diagonal or 0, "diagonal")
   local nd = Tensor.dim(self)
   if nd == 2 then return Tensor.clone(Tensor.diagonal(self, k)) end
   if nd ~= 1 then argerror("diag", "expected a 1-D or 2-D tensor, got " .. nd .. "-D") end
   local n = Tensor.size(self, 1) + math.abs(k)
   local cr = creation()
   local dev = Tensor.device(self)
   local rows = Tensor.view(cr.arange(0, n, { device = dev }), n, 1)
   local cols = Tensor.view(cr.arange(0, n, { device = dev }), 1, n)
   local on = T.raw.eq(T.raw.sub(cols, rows), k)
   -- row i of the result holds v[i] (k >= 0) or v[i + k] (k < 0) on the diagonal: v padded with
   -- |k| zeros at the end or the front, broadcast along the rows
   local z = cr.zeros({ math.abs(k) }, { dtype = Tensor.dtype(self), device = dev })
   local padded = k >= 0 and T.cat({ self, z }, 1) or T.cat({ z, self }, 1)
   local zero = 0
   if tostring(Tensor.dtype(self)) == "bool" then zero = false end
   return T.where(on, Tensor.view(padded, n, 1), zero)
end

---------------------------------------------------------------------------------------------
-- nonzero / argwhere / masked_select: results of data-dependent size. The true positions of a
-- flattened mask come first, in order, from a stable descending argsort; their count is read
-- back (a host sync, as in PyTorch).
---------------------------------------------------------------------------------------------

-- the 1-based row-major positions where the bool tensor m is true, and their count
local function true_positions(m)
   local flat = Tensor.reshape(m, { -1 })
   local n = Tensor.item(Tensor.sum(flat))
   local order = Tensor.argsort(flat, 1, true)
   return Tensor.narrow(order, 1, 1, n), n
end

-- nonzero({as_tuple = false}): the n x ndim int64 1-based coordinates of the non-zero elements
-- in row-major order (torch.nonzero); as_tuple: a Lua array of ndim 1-D index tensors
function Tensor.nonzero(self, opts)
   tensor_arg("nonzero", self)
   local as_tuple = false
   if opts ~= nil then
      if type(opts) ~= "table" or T.is_tensor(opts) then
         argerror("nonzero", "expected an options table {as_tuple =}, got " .. T.typename(opts))
      end
      for k in pairs(opts) do
         if k ~= "as_tuple" then argerror("nonzero", "unknown option '" .. tostring(k) .. "'") end
      end
      as_tuple = opts.as_tuple == true
   end
   local m = tostring(Tensor.dtype(self)) == "bool" and self or Tensor.ne(self, 0)
   local pos, n = true_positions(m)
   local sizes = Tensor.size(self)
   local nd = #sizes
   local cols = {}
   -- coordinate d = floor(p / stride_d) mod size_d + 1 over the 0-based position p, in float64
   -- (exact below 2^53 elements)
   local p0 = Tensor.sub(Tensor.to(pos, "float64"), 1)
   local stride = 1
   for d = nd, 1, -1 do
      local c = Tensor.fmod(Tensor.floor(Tensor.div(p0, stride)), sizes[d])
      cols[d] = Tensor.to(Tensor.add(c, 1), "int64")
      stride = stride * sizes[d]
   end
   if as_tuple then
      if nd == 0 then return { Tensor.sub(pos, 1) } end
      return cols
   end
   if nd == 0 then
      return creation().zeros({ n, 0 }, { dtype = "int64", device = Tensor.device(self) })
   end
   return T.stack(cols, 2)
end
Tensor.argwhere = function(self) return Tensor.nonzero(self) end

-- masked_select(mask): the elements of self where the bool mask is true (both broadcast to their
-- common sizes) as a 1-D tensor in row-major order; the gradient flows back to those elements
function Tensor.masked_select(self, mask)
   tensor_arg("masked_select", self)
   tensor_arg("masked_select", mask, "mask")
   if tostring(Tensor.dtype(mask)) ~= "bool" then
      argerror("masked_select", "mask must be a bool tensor, got " .. tostring(Tensor.dtype(mask)))
   end
   local a, b = Tensor.size(self), Tensor.size(mask)
   local nd = math.max(#a, #b)
   local sizes = {}
   for k = nd, 1, -1 do
      local x, y = a[#a - nd + k] or 1, b[#b - nd + k] or 1
      if x ~= y and x ~= 1 and y ~= 1 then
         argerror("masked_select", ("the mask's size does not broadcast with self's (dim %d: %d " ..
                  "and %d)"):format(k, x, y))
      end
      sizes[k] = x == 1 and y or x
   end
   local x = nd == 0 and self or Tensor.expand(self, sizes)
   local m = nd == 0 and mask or Tensor.expand(mask, sizes)
   local pos = true_positions(m)
   return Tensor.index_select(Tensor.reshape(x, { -1 }), 1, pos)
end

---------------------------------------------------------------------------------------------
-- repeat / tile
---------------------------------------------------------------------------------------------

-- repeat(r1, r2, ...) (or a list): self tiled r_i times along each dim, with leading dims added
-- when there are more repeats than dims (torch.Tensor.repeat); a new contiguous tensor. Made as
-- the expand of an unsqueezed view, reshaped: one copy, and the gradient sums the tiles back.
local function repeat_(fname, self, reps)
   local nd = Tensor.dim(self)
   if #reps < nd then
      argerror(fname, ("number of repeat dims (%d) can not be smaller than the tensor's " ..
               "dimension (%d)"):format(#reps, nd))
   end
   for i = 1, #reps do
      if reps[i] < 0 then
         argerror(fname, ("repeats[%d] must be non-negative, got %d"):format(i, reps[i]))
      end
   end
   local lead = #reps - nd
   local view, expand, final = {}, {}, {}
   for i = 1, #reps do
      local s = i > lead and Tensor.size(self, i - lead) or 1
      view[#view + 1], view[#view + 2] = 1, s
      expand[#expand + 1], expand[#expand + 2] = reps[i], s
      final[i] = reps[i] * s
   end
   local x = Tensor.contiguous(self)
   local y = Tensor.expand(Tensor.reshape(x, view), expand)
   return Tensor.contiguous(Tensor.reshape(y, final))
end

-- `repeat` is a Lua keyword: t["repeat"](t, 2, 1) works, and t:repeatTensor(2, 1) (Torch7's
-- name) is the same method
Tensor["repeat"] = function(self, ...)
   tensor_arg("repeat", self)
   return repeat_("repeat", self, int_list("repeat", "repeats", ...))
end
Tensor.repeatTensor = Tensor["repeat"]

-- tile(dims): repeat, with ones prepended when dims has fewer entries than self's dims
function Tensor.tile(self, ...)
   tensor_arg("tile", self)
   local reps = int_list("tile", "dims", ...)
   local nd = Tensor.dim(self)
   while #reps < nd do table.insert(reps, 1, 1) end
   return repeat_("tile", self, reps)
end

---------------------------------------------------------------------------------------------
-- new_* factories: self's dtype and device unless the options say otherwise
---------------------------------------------------------------------------------------------

-- the sizes (a list, or the leading numbers) and the options table that may follow them
local function sizes_opts(fname, ...)
   local first = ...
   if type(first) == "table" and not T.is_tensor(first) then
      local opts = select(2, ...)
      if select("#", ...) > 2 then argerror(fname, "expected (sizes, opts)") end
      return first, opts
   end
   local n = select("#", ...)
   local sizes, opts = {}, nil
   for i = 1, n do
      local v = select(i, ...)
      if i == n and type(v) == "table" then opts = v else sizes[#sizes + 1] = v end
   end
   return sizes, opts
end

local function with_defaults(fname, self, opts)
   if opts ~= nil and type(opts) ~= "table" then
      argerror(fname, "options must be a table, got " .. T.typename(opts))
   end
   local o = {}
   if opts then for k, v in pairs(opts) do o[k] = v end end
   if o.dtype == nil then o.dtype = Tensor.dtype(self) end
   if o.device == nil then o.device = Tensor.device(self) end
   return o
end

local function new_factory(name, make)
   Tensor["new_" .. name] = function(self, ...)
      tensor_arg("new_" .. name, self)
      return make(self, ...)
   end
end

new_factory("zeros", function(self, ...)
   local sizes, opts = sizes_opts("new_zeros", ...)
   return creation().zeros(sizes, with_defaults("new_zeros", self, opts))
end)
new_factory("ones", function(self, ...)
   local sizes, opts = sizes_opts("new_ones", ...)
   return creation().ones(sizes, with_defaults("new_ones", self, opts))
end)
new_factory("empty", function(self, ...)
   local sizes, opts = sizes_opts("new_empty", ...)
   return creation().empty(sizes, with_defaults("new_empty", self, opts))
end)
-- new_full(sizes, value, opts)
new_factory("full", function(self, sizes, value, opts)
   if type(sizes) ~= "table" then
      argerror("new_full", "sizes must be a table, got " .. T.typename(sizes))
   end
   return creation().full(sizes, value, with_defaults("new_full", self, opts))
end)
-- new_tensor(data, opts): a copy of data (numbers, nested tables or a tensor), self's dtype and
-- device by default
new_factory("tensor", function(self, data, opts)
   return creation().tensor(data, with_defaults("new_tensor", self, opts))
end)

---------------------------------------------------------------------------------------------
-- in-place random fills (torch.Tensor.uniform_ ...), from lumen's generator (lm.manual_seed)
---------------------------------------------------------------------------------------------

local function check_status(st, fname)
   if st ~= 0 then T.check(st, fname) end
end

-- a leaf that requires grad refuses (as fill_); a tensor with history loses it (its old value
-- gets no gradient)
local function random_fill(fname, float_only, body)
   Tensor[fname] = function(self, ...)
      tensor_arg(fname, self)
      local dt = tostring(Tensor.dtype(self))
      if float_only and not (dt == "float32" or dt == "float64" or dt == "float16"
                             or dt == "bfloat16") then
         argerror(fname, "expected a floating point tensor, got " .. dt)
      end
      local tracked = grad_enabled() and needs(self)
      if tracked and rawget(self, "grad_fn") == nil then
         argerror(fname, "a leaf tensor that requires grad is being used in an in-place operation")
      end
      if Tensor.device(self) ~= "meta" then body(self, ...) end
      if tracked then
         rawset(self, "grad_fn", nil)
         rawset(self, "requires_grad", nil)
      end
      return self
   end
end

local function num(fname, v, default, what)
   if v == nil then return default end
   if type(v) ~= "number" or v ~= v then
      argerror(fname, ("%s must be a number, got %s"):format(what, tostring(v)))
   end
   return v
end

-- uniform_(from = 0, to = 1)
random_fill("uniform_", true, function(self, a, b)
   a, b = num("uniform_", a, 0, "from"), num("uniform_", b, 1, "to")
   if a > b then
      argerror("uniform_", ("expects from <= to, got from=%s to=%s"):format(tostring(a),
               tostring(b)))
   end
   check_status(C.lm_uniform_(self._c, a, b), "uniform_")
end)

-- normal_(mean = 0, std = 1)
random_fill("normal_", true, function(self, mean, std)
   mean, std = num("normal_", mean, 0, "mean"), num("normal_", std, 1, "std")
   if std < 0 then argerror("normal_", "expects std >= 0, got " .. tostring(std)) end
   check_status(C.lm_normal_(self._c, mean, std), "normal_")
end)

-- bernoulli_(p = 0.5): 1 with probability p, else 0, in self's dtype
random_fill("bernoulli_", false, function(self, p)
   p = num("bernoulli_", p, 0.5, "p")
   if p < 0 or p > 1 then
      argerror("bernoulli_", "expects 0 <= p <= 1, got " .. tostring(p))
   end
   check_status(C.lm_bernoulli_(self._c, p), "bernoulli_")
end)

-- random_(from, to) / random_(to): integers drawn uniformly from [from, to) ([0, to))
random_fill("random_", false, function(self, a, b)
   if a == nil then
      argerror("random_", "give the range: random_(to) or random_(from, to)")
   end
   if b == nil then a, b = 0, a end
   a, b = int_arg("random_", a, "from"), int_arg("random_", b, "to")
   if a >= b then
      argerror("random_", ("expects from < to, got from=%d to=%d"):format(a, b))
   end
   if tostring(Tensor.dtype(self)) == "bool" and (a < 0 or b > 2) then
      argerror("random_", "a bool tensor takes a range within [0, 2)")
   end
   check_status(C.lm_randint_(self._c, a, b), "random_")
end)

return M
