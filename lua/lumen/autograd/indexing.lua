-- lumen.autograd.indexing -- the indexing Tensor methods over the C operators of
-- src/ops/indexing.c, with their backward rules: sort / argsort / topk, gather / scatter_add /
-- scatter_add_ / index_select, cumsum, flip. lumen.autograd loads it once, after the families it
-- uses (narrow, contiguous).
--
-- Indices are 1-based int64 at this boundary, as argmax's and max(dim)'s: sort and topk return
-- them, gather, scatter_add and index_select take them. The C operators take the index base as
-- an argument (BASE below), so no index tensor is copied to convert it, and an out-of-range
-- value is reported as the caller wrote it ("index 7 is out of bounds for dimension 2 with size
-- 5", the dimension 1-based too).
--
-- Layouts are PyTorch 2.x's (checked against the peer): sort's values and indices keep the
-- input's strides (a channels-last input gives channels-last results); gather, scatter_add,
-- index_select, cumsum and topk give contiguous results; flip keeps the input's memory format.
-- Gradients of sort, gather and index_select are scatter_add_ into zeros in the input's memory
-- format, cumsum's a reverse cumsum written in it.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type, tostring, pairs, ipairs = type, tostring, pairs, ipairs

local Tensor, raw, wrap, check, argerror, tc = T.Tensor, T.raw, T.wrap, T.check, T.argerror,
   T.tc
local wrap_dim = T.wrap_dim
local grad_enabled, needs, record, edge, attach = G.is_grad_enabled, G.needs, G.record, G.edge,
   G.attach
local sizes_of, zeros_for, cast_like = G.sizes_of, G.zeros_for, G.cast_like

local M = {}

local BASE = 1 -- the Lua API's index base
local INT64 = 4 -- lm_dtype LM_INT64

local outp = ffi.new("lm_tensor*[1]")
local idxp = ffi.new("lm_tensor*[1]")

local function dtype_name(x) return tostring(Tensor.dtype(x)) end

-- the cdata of an int64 index tensor argument, or an error naming fname and the problem
local function index_arg(fname, index)
   if not T.is_tensor(index) then
      argerror(fname, "index: an int64 tensor expected, got " .. T.typename(index), 3)
   end
   local ic = tc(index, fname, "index", 3)
   if ic.dtype ~= INT64 then
      argerror(fname, "index must be an int64 tensor (1-based indices), got " ..
               dtype_name(index), 3)
   end
   return ic
end

local function bool_arg(fname, v, what, default)
   if v == nil then return default end
   if type(v) ~= "boolean" then
      argerror(fname, what .. " must be a boolean, got " .. T.typename(v), 3)
   end
   return v
end

-- the memory format id a gradient of x is made in (lm_suggest_memory_format)
local function fmt_of(c) return C.lm_suggest_memory_format(c, 0) end

-- an uninitialised tensor of sizes and g's dtype in memory format id fmt, on g's device
local sizebuf = ffi.new("int64_t[8]")
local function empty_for(g, sizes, fmt)
   local n = #sizes
   if (fmt == 1 and n ~= 4) or (fmt == 2 and n ~= 5) then fmt = 0 end
   for i = 1, n do sizebuf[i - 1] = sizes[i] end
   outp[0] = nil
   check(C.lm_empty(n, sizebuf, g._c.dtype, fmt, g._c.device, outp), "backward")
   return wrap(outp[0])
end

-- zeros of x's sizes and g's dtype in format fmt, with g added at index along d (0-based):
-- the backward of sort, gather and index_select
local function scatter_into(g, sizes, fmt, d, index, what)
   local z = zeros_for(g, sizes, fmt)
   check(C.lm_scatter_add_(z._c, d, index._c, g._c, BASE), what)
   return z
end

---------------------------------------------------------------------------------------------
-- sort / argsort / topk
---------------------------------------------------------------------------------------------

-- (dim, descending) or ({dim =, descending =, stable =}): the 0-based dim and descending.
-- lumen's sort is always stable (PyTorch's stable = true order), so stable only gets checked.
local SORT_OPTS = { dim = true, descending = true, stable = true }
local function sort_args(fname, self, dim, descending)
   local c = tc(self, fname, "self", 3)
   if type(dim) == "table" then
      for k in pairs(dim) do
         if not SORT_OPTS[k] then argerror(fname, "unknown option '" .. tostring(k) .. "'", 3) end
      end
      if descending ~= nil then
         argerror(fname, "descending given both in the options table and after it", 3)
      end
      bool_arg(fname, dim.stable, "stable", true)
      dim, descending = dim.dim, dim.descending
   end
   if dim == nil then dim = -1 end
   local d = wrap_dim(fname, dim, c.ndim, 3)
   return c, d, bool_arg(fname, descending, "descending", false)
end

local function sort_raw(fname, c, d, desc)
   outp[0], idxp[0] = nil, nil
   check(C.lm_sort(c, d, desc and 1 or 0, BASE, outp, idxp), fname)
   local v = wrap(outp[0])
   return v, wrap(idxp[0])
end

-- values, 1-based int64 indices along dim (default the last); ties keep their order, NaN is
-- larger than every number
local function sort(fname, self, dim, descending)
   local c, d, desc = sort_args(fname, self, dim, descending)
   local v, i = sort_raw(fname, c, d, desc)
   if grad_enabled() and needs(self) then
      local sizes, fmt = sizes_of(c), fmt_of(c)
      record(v, "SortBackward", function(g)
         return scatter_into(g, sizes, fmt, d, i, "sort_backward")
      end, self)
   end
   return v, i
end

function Tensor.sort(self, dim, descending) return sort("sort", self, dim, descending) end

function Tensor.argsort(self, dim, descending)
   local c, d, desc = sort_args("argsort", self, dim, descending)
   local _, i = sort_raw("argsort", c, d, desc)
   return i
end

-- topk(k, dim = -1, largest = true, sorted = true), or topk(k, {dim =, largest =, sorted =}):
-- the k largest (smallest) values along dim
-- and their 1-based indices, in sorted order (also for sorted = false, which PyTorch leaves
-- unspecified). Ties come in input order (the stable sort's); PyTorch's CPU kernel, a partial
-- selection, orders ties by no documented rule.
local TOPK_OPTS = { dim = true, largest = true, sorted = true }
function Tensor.topk(self, k, dim, largest, sorted)
   local fname = "topk"
   local c = tc(self, fname)
   k = T.check_int(fname, k, "k")
   if type(dim) == "table" then -- topk(k, {dim =, largest =, sorted =})
      for key in pairs(dim) do
         if not TOPK_OPTS[key] then argerror(fname, "unknown option '" .. tostring(key) .. "'") end
      end
      if largest ~= nil or sorted ~= nil then
         argerror(fname, "options given both in the options table and after it")
      end
      dim, largest, sorted = dim.dim, dim.largest, dim.sorted
   end
   if dim == nil then dim = -1 end
   local d = wrap_dim(fname, dim, c.ndim)
   largest = bool_arg(fname, largest, "largest", true)
   bool_arg(fname, sorted, "sorted", true)
   local n = c.ndim == 0 and 1 or tonumber(c.sizes[d])
   if k < 0 or k > n then
      argerror(fname, ("k (%d) is out of range for dimension %d of size %d"):format(k, d + 1, n))
   end
   local v, i = sort(fname, self, d + 1, largest)
   if c.ndim == 0 then
      if k == 1 then return v, i end
      argerror(fname, "k must be 1 for a 0-dim tensor")
   end
   -- PyTorch's topk results are new contiguous tensors, whatever the input's layout
   v = Tensor.contiguous(Tensor.narrow(v, d + 1, 1, k))
   i = raw.contiguous(raw.narrow(i, d + 1, 1, k))
   return v, i
end

---------------------------------------------------------------------------------------------
-- gather / scatter_add / index_select
---------------------------------------------------------------------------------------------

local function gather_raw(fname, c, d, ic)
   outp[0] = nil
   check(C.lm_gather(c, d, ic, BASE, outp), fname)
   return wrap(outp[0])
end

-- gather(dim, index): out[i][j] = self[index[i][j]][j] (dim 1), as torch.gather; index int64
-- (1-based) of self's rank, no larger than self but along dim; out has index's sizes
function Tensor.gather(self, dim, index)
   local fname = "gather"
   local c = tc(self, fname)
   local d = wrap_dim(fname, dim, c.ndim)
   local ic = index_arg(fname, index)
   local out = gather_raw(fname, c, d, ic)
   if grad_enabled() and needs(self) then
      local sizes, fmt = sizes_of(c), fmt_of(c)
      record(out, "GatherBackward", function(g)
         return scatter_into(g, sizes, fmt, d, index, "gather_backward")
      end, self)
   end
   return out
end

local function scatter_args(fname, self, dim, index, src)
   local c = tc(self, fname, "self", 3)
   local d = wrap_dim(fname, dim, c.ndim, 3)
   local ic = index_arg(fname, index)
   if not T.is_tensor(src) then
      argerror(fname, "src: a tensor expected, got " .. T.typename(src), 3)
   end
   return c, d, ic, tc(src, fname, "src", 3)
end

-- src's gradient of scatter_add: g gathered at index, in src's sizes (zeros where index, smaller
-- than src, does not reach)
local function scatter_src_grad(g, d, index, src_sizes)
   local gi = gather_raw("scatter_add_backward", g._c, d, index._c)
   local isz = sizes_of(index._c)
   local same = true
   for j = 1, #isz do same = same and isz[j] == src_sizes[j] end
   if same then return gi end
   local z = zeros_for(gi, src_sizes, 0)
   local view = z
   for j = 1, #isz do
      if isz[j] ~= src_sizes[j] then view = raw.narrow(view, j, 1, isz[j]) end
   end
   raw.copy_(view, gi)
   return z
end

local function scatter_backward(self, src, d, index)
   local need_self, need_src = needs(self), needs(src)
   local src_sizes = sizes_of(src._c)
   return function(g)
      return need_self and g or nil, need_src and scatter_src_grad(g, d, index, src_sizes) or nil
   end
end

-- scatter_add(dim, index, src): a copy of self with src[i][j] added at self[index[i][j]][j]
-- (dim 1), in order along dim; contiguous, as PyTorch's
function Tensor.scatter_add(self, dim, index, src)
   local fname = "scatter_add"
   local c, d, ic, sc = scatter_args(fname, self, dim, index, src)
   outp[0] = nil
   check(C.lm_clone(c, 0, -1, outp), fname)
   local out = wrap(outp[0])
   check(C.lm_scatter_add_(out._c, d, ic, sc, BASE), fname)
   if grad_enabled() and (needs(self) or needs(src)) then
      record(out, "ScatterAddBackward", scatter_backward(self, src, d, index), self, src)
   end
   return out
end

-- scatter_add_(dim, index, src): in place
function Tensor.scatter_add_(self, dim, index, src)
   local fname = "scatter_add_"
   local c, d, ic, sc = scatter_args(fname, self, dim, index, src)
   local rec = grad_enabled() and (needs(self) or needs(src))
   if rec and needs(self) and rawget(self, "grad_fn") == nil then
      argerror(fname, "a leaf tensor that requires grad is being used in an in-place operation")
   end
   local bwd = rec and scatter_backward(self, src, d, index)
   local inputs = rec and { edge(self), edge(src) }
   T.barrier(c)
   check(C.lm_scatter_add_(c, d, ic, sc, BASE), fname)
   if rec then attach(self, "ScatterAddBackward", bwd, inputs) end
   return self
end

-- index_select(dim, index): the slices of self at the 1-based positions of the 1-D index along
-- dim, as torch.index_select; a gather with the index viewed along dim and expanded (no copy);
-- its gradient is an index_add (scatter_add_ with the same expanded index)
function Tensor.index_select(self, dim, index)
   local fname = "index_select"
   local c = tc(self, fname)
   local d = wrap_dim(fname, dim, c.ndim)
   local ic = index_arg(fname, index)
   if ic.ndim > 1 then
      argerror(fname, ("index must be a 1-D (or 0-D) tensor, got %d-D"):format(ic.ndim))
   end
   local sizes = sizes_of(c)
   local iv
   if #sizes == 0 then
      iv = raw.reshape(index, {})
   else
      local shape, osz = {}, {}
      for j = 1, #sizes do shape[j], osz[j] = 1, sizes[j] end
      shape[d + 1] = tonumber(ic.numel)
      osz[d + 1] = shape[d + 1]
      iv = raw.expand(raw.reshape(index, shape), osz)
   end
   local out = gather_raw(fname, c, d, iv._c)
   if grad_enabled() and needs(self) then
      local fmt = fmt_of(c)
      record(out, "IndexSelectBackward", function(g)
         return scatter_into(g, sizes, fmt, d, iv, "index_select_backward")
      end, self)
   end
   return out
end

---------------------------------------------------------------------------------------------
-- cumsum / flip
---------------------------------------------------------------------------------------------

-- cumsum(dim, dtype): inclusive sums along dim; integer and bool inputs sum into int64 (unless
-- dtype says otherwise), as PyTorch's; the gradient is the reverse cumsum of the gradient
function Tensor.cumsum(self, dim, dtype)
   local fname = "cumsum"
   local c = tc(self, fname)
   local d = wrap_dim(fname, dim, c.ndim)
   local did = -1
   if dtype ~= nil then did = T.to_dtype(fname, dtype).id end
   outp[0] = nil
   check(C.lm_cumsum(c, d, 0, did, outp), fname)
   local out = wrap(outp[0])
   if grad_enabled() and needs(self) then
      local xdt, sizes, fmt = c.dtype, sizes_of(c), fmt_of(c)
      record(out, "CumsumBackward", function(g)
         -- written straight into a tensor in the input's format (lm_cumsum takes a dense out=)
         local gc = g._c
         local r = empty_for(g, sizes, fmt)
         outp[0] = r._c
         check(C.lm_cumsum(gc, d, 1, -1, outp), "cumsum_backward")
         return cast_like(r, xdt)
      end, self)
   end
   return out
end

-- the 1-based positions n, n-1, ..., 1 as an int64 tensor on device dev
local function reversed_positions(n, dev)
   local buf = ffi.new("double[?]", n + 1)
   for j = 0, n - 1 do buf[j] = n - j end
   local sz = ffi.new("int64_t[1]", n)
   outp[0] = nil
   check(C.lm_empty(1, sz, INT64, 0, 0, outp), "flip")
   local t = wrap(outp[0])
   check(C.lm_from_doubles(t._c, buf), "flip")
   if dev ~= T.DEV_CPU then t = raw.to(t, T.device_name(dev)) end
   return t
end

-- flip(dims): the elements in reverse order along each of dims (a dim or a list), as torch.flip;
-- index_select with reversed positions, so differentiable; the result keeps self's memory format
function Tensor.flip(self, dims)
   local fname = "flip"
   local c = tc(self, fname)
   local list
   if type(dims) == "table" then
      list = dims
   elseif dims ~= nil then
      list = { dims }
   else
      argerror(fname, "dims must be a dim or a list of dims, got nil")
   end
   local seen, ds = {}, {}
   for _, v in ipairs(list) do
      local d = wrap_dim(fname, v, c.ndim)
      if seen[d] then
         argerror(fname, ("dim %d appears multiple times in the list of dims"):format(d + 1))
      end
      seen[d] = true
      ds[#ds + 1] = d
   end
   local out = self
   for _, d in ipairs(ds) do
      local n = c.ndim == 0 and 1 or tonumber(c.sizes[d])
      if n > 1 then out = Tensor.index_select(out, d + 1, reversed_positions(n, c.device)) end
   end
   if out == self then return Tensor.clone(self) end
   local fmt = Tensor.suggest_memory_format(self)
   if tostring(fmt) ~= "contiguous_format" then out = Tensor.contiguous(out, fmt) end
   return out
end

return M
