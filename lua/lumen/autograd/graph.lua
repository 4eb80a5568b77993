-- lumen.autograd.graph -- recording the graph: grad mode, the nodes an op attaches to its result
-- (attach, record, edge) and the helpers backward rules share (meta / sum_to for broadcast
-- inputs, cast_like, zeros_for).
--
-- A differentiable result gets
--
--    t.requires_grad = true
--    t.grad_fn = { name = "MulBackward", backward = function(grad_out) ... end, inputs = {...} }
--
-- `backward` returns one gradient per entry of `inputs` (nil where none flows). An entry of
-- `inputs` is the producer of that input: its grad_fn node, or the input tensor itself when it is
-- a leaf that requires grad, or false (no gradient wanted).
--
-- This is the half of the engine that the backward rules (lumen/autograd/*.lua), lumen.functional
-- and the modules need while ops run; running the graph backward is lumen.autograd's. It is its
-- own module so that the rules can require it while lumen.autograd is still loading them.
-- lumen.autograd re-exports every name here (lm.autograd.record, needs, ...).

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")

local type, rawget, rawset, getmetatable, select, error, pcall = type, rawget, rawset,
   getmetatable, select, error, pcall
local unpack = unpack
local tonumber = tonumber

local mt, raw = T.mt, T.raw
local wrap, check = T.wrap, T.check

local G = {}

---------------------------------------------------------------------------------------------
-- grad mode
---------------------------------------------------------------------------------------------

local enabled = true

function G.is_grad_enabled() return enabled end

function G.set_grad_enabled(flag)
   local prev = enabled
   enabled = not not flag
   return prev
end

local function run_with(mode, fname, fn, ...)
   if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn)
      and getmetatable(fn).__call) then
      error("lumen." .. fname .. ": expected a function, got " .. T.typename(fn), 3)
   end
   local prev = enabled
   enabled = mode
   local res = { pcall(fn, ...) }
   enabled = prev
   if not res[1] then error(res[2], 0) end
   return unpack(res, 2, table.maxn(res))
end

-- no_grad(fn, ...): runs fn(...) with recording off and returns its results
function G.no_grad(fn, ...) return run_with(false, "no_grad", fn, ...) end
function G.enable_grad(fn, ...) return run_with(true, "enable_grad", fn, ...) end

---------------------------------------------------------------------------------------------
-- helpers
---------------------------------------------------------------------------------------------

local outp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")

local function is_tensor(x) return getmetatable(x) == mt end

-- does x take part in the graph?
local function needs(x)
   return type(x) == "table" and rawget(x, "requires_grad") == true
end
G.needs = needs

-- the graph edge for input x: its grad_fn, the leaf itself, or false
local function edge(x)
   if type(x) ~= "table" or rawget(x, "requires_grad") ~= true then return false end
   return rawget(x, "grad_fn") or x
end
G.edge = edge

-- make `out` the result of a recorded op
local function attach(out, name, backward, inputs)
   rawset(out, "requires_grad", true)
   rawset(out, "grad_fn", { name = name, backward = backward, inputs = inputs })
   return out
end
G.attach = attach

-- record(out, name, backward, x1, x2, ...): attach when grad mode is on and an input needs grad.
-- Returns true when recorded. Functional ops use it with their own backward closures.
function G.record(out, name, backward, ...)
   if not enabled then return false end
   local n = select("#", ...)
   local inputs, any = {}, false
   for i = 1, n do
      local e = edge((select(i, ...)))
      inputs[i] = e
      if e then any = true end
   end
   if not any then return false end
   attach(out, name, backward, inputs)
   return true
end

-- true when grad mode is on and one of the arguments requires grad
function G.recording(a, b, c, d)
   return enabled and (needs(a) or needs(b) or needs(c) or needs(d))
end

local function sizes_of(c)
   local r = {}
   for i = 0, c.ndim - 1 do r[i + 1] = tonumber(c.sizes[i]) end
   return r
end
G.sizes_of = sizes_of

local function same_sizes(ac, bc)
   if ac.ndim ~= bc.ndim then return false end
   for i = 0, ac.ndim - 1 do
      if ac.sizes[i] ~= bc.sizes[i] then return false end
   end
   return true
end
G.same_sizes = same_sizes

-- shape / dtype of an input when they differ from the output's (what sum_to needs), else false
local function meta(x, out)
   if not is_tensor(x) then return false end
   local xc, oc = x._c, out._c
   if xc.dtype == oc.dtype and same_sizes(xc, oc) then return false end
   return { ndim = xc.ndim, sizes = sizes_of(xc), dtype = dtypes.from_id(xc.dtype) }
end
G.meta = meta

-- reduce a broadcast gradient back to an input's shape and dtype (m from meta; false: as is)
local function sum_to(g, m)
   if not m then return g end
   local gc = g._c
   local lead = gc.ndim - m.ndim
   if lead > 0 or not same_sizes(gc, { ndim = m.ndim, sizes = m.sizes }) then
      local dims = {}
      for i = 0, lead - 1 do dims[#dims + 1] = i + 1 end
      for i = 1, m.ndim do
         if m.sizes[i] == 1 and gc.sizes[lead + i - 1] ~= 1 then dims[#dims + 1] = lead + i end
      end
      if #dims > 0 then g = raw.sum(g, dims, true) end
      g = raw.reshape(g, m.sizes)
   end
   if g._c.dtype ~= m.dtype.id then g = raw.to(g, m.dtype) end
   return g
end
G.sum_to = sum_to

-- gradient with an input's dtype (for ops whose output dtype may differ)
local function cast_like(g, dtype_id)
   if g._c.dtype ~= dtype_id then return raw.to(g, dtypes.from_id(dtype_id)) end
   return g
end
G.cast_like = cast_like

-- zeros with the given sizes, the dtype of g and memory format id fmt (0 when nil)
local function zeros_for(g, sizes, fmt)
   fmt = fmt or 0
   local n = #sizes
   if fmt == 1 and n ~= 4 then fmt = 0 end
   if fmt == 2 and n ~= 5 then fmt = 0 end
   for i = 1, n do sizebuf[i - 1] = sizes[i] end
   outp[0] = nil
   check(C.lm_empty(n, sizebuf, g._c.dtype, fmt, g._c.device, outp), "backward")
   local z = wrap(outp[0])
   check(C.lm_fill_(z._c, 0), "backward")
   return z
end
G.zeros_for = zeros_for

return G
