-- lumen.autograd -- reverse-mode automatic differentiation on a graph recorded as ops run.
--
-- Requiring this module installs differentiable versions of the Tensor methods (and of
-- lumen.tensor's where / cat) on top of the raw forward functions kept in lumen.tensor.raw.
-- Each differentiable result gets
--
--    t.requires_grad = true
--    t.grad_fn = { name = "MulBackward", backward = function(grad_out) ... end, inputs = {...} }
--
-- `backward` returns one gradient per entry of `inputs` (nil where none flows). An entry of
-- `inputs` is the producer of that input: its grad_fn node, or the input tensor itself when it is
-- a leaf that requires grad, or false (no gradient wanted). Saved tensors live only in the
-- backward closures: after t:backward() the nodes drop their closures and inputs (unless
-- {retain_graph = true}), so activations are freed even while the loss tensor lives on.
--
-- Gradient layout (memory_format.md section 7, accumulate_grad): a leaf's .grad has the leaf's
-- strides when the leaf is non-overlapping and dense, else it is contiguous; later gradients are
-- added into it in place. No version counters: a tensor saved for backward must not be modified
-- in place before backward runs (relu_ after a conv or batch norm is fine, as in PyTorch).

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local util = require("lumen.util")
local memory = require("lumen.memory")

local type, rawget, rawset, getmetatable, select, error, pcall = type, rawget, rawset,
   getmetatable, select, error, pcall
local unpack = unpack
local tonumber, tostring = tonumber, tostring

local Tensor, mt, raw = T.Tensor, T.mt, T.raw
local wrap, check, argerror, wrap_dim = T.wrap, T.check, T.argerror, T.wrap_dim

local A = {}

---------------------------------------------------------------------------------------------
-- grad mode
---------------------------------------------------------------------------------------------

local enabled = true

function A.is_grad_enabled() return enabled end

function A.set_grad_enabled(flag)
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
function A.no_grad(fn, ...) return run_with(false, "no_grad", fn, ...) end
function A.enable_grad(fn, ...) return run_with(true, "enable_grad", fn, ...) end

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
A.needs = needs

-- the graph edge for input x: its grad_fn, the leaf itself, or false
local function edge(x)
   if type(x) ~= "table" or rawget(x, "requires_grad") ~= true then return false end
   return rawget(x, "grad_fn") or x
end
A.edge = edge

-- make `out` the result of a recorded op
local function attach(out, name, backward, inputs)
   rawset(out, "requires_grad", true)
   rawset(out, "grad_fn", { name = name, backward = backward, inputs = inputs })
   return out
end
A.attach = attach

-- record(out, name, backward, x1, x2, ...): attach when grad mode is on and an input needs grad.
-- Returns true when recorded. Functional ops use it with their own backward closures.
function A.record(out, name, backward, ...)
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
function A.recording(a, b, c, d)
   return enabled and (needs(a) or needs(b) or needs(c) or needs(d))
end

local function sizes_of(c)
   local r = {}
   for i = 0, c.ndim - 1 do r[i + 1] = tonumber(c.sizes[i]) end
   return r
end
A.sizes_of = sizes_of

local function same_sizes(ac, bc)
   if ac.ndim ~= bc.ndim then return false end
   for i = 0, ac.ndim - 1 do
      if ac.sizes[i] ~= bc.sizes[i] then return false end
   end
   return true
end
A.same_sizes = same_sizes

-- shape / dtype of an input when they differ from the output's (what sum_to needs), else false
local function meta(x, out)
   if not is_tensor(x) then return false end
   local xc, oc = x._c, out._c
   if xc.dtype == oc.dtype and same_sizes(xc, oc) then return false end
   return { ndim = xc.ndim, sizes = sizes_of(xc), dtype = dtypes.from_id(xc.dtype) }
end
A.meta = meta

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
A.sum_to = sum_to

-- gradient with an input's dtype (for ops whose output dtype may differ)
local function cast_like(g, dtype_id)
   if g._c.dtype ~= dtype_id then return raw.to(g, dtypes.from_id(dtype_id)) end
   return g
end

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
A.zeros_for = zeros_for

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

---------------------------------------------------------------------------------------------
-- Tensor methods: requires_grad_, detach, is_leaf, hooks
---------------------------------------------------------------------------------------------

-- t.requires_grad reads false (not nil) on tensors that never required grad: the method table
-- answers for them. The per-tensor field is only ever true or absent.
Tensor.requires_grad = false

function Tensor.requires_grad_(self, flag)
   local c = T.tc(self, "requires_grad_")
   if flag == nil then flag = true end
   if type(flag) ~= "boolean" then
      argerror("requires_grad_", "flag must be a boolean, got " .. T.typename(flag))
   end
   if flag then
      if C.lm_dtype_is_floating(c.dtype) == 0 then
         argerror("requires_grad_", "only tensors of floating point dtype can require " ..
                  "gradients, got " .. tostring(dtypes.from_id(c.dtype)))
      end
      rawset(self, "requires_grad", true)
   else
      if rawget(self, "grad_fn") then
         argerror("requires_grad_", "you can only change requires_grad flags of leaf tensors " ..
                  "(use detach())")
      end
      rawset(self, "requires_grad", nil)
   end
   return self
end

-- a new tensor on the same data, out of the graph
function Tensor.detach(self)
   return raw.alias(self)
end

-- drop the graph history of self in place
function Tensor.detach_(self)
   T.tc(self, "detach_")
   rawset(self, "grad_fn", nil)
   rawset(self, "requires_grad", nil)
   return self
end

function Tensor.is_leaf(self)
   T.tc(self, "is_leaf")
   return rawget(self, "grad_fn") == nil
end

-- register_hook(fn): fn(grad) runs when the gradient for self is computed; a tensor it returns
-- replaces the gradient. Returns a handle with :remove().
function Tensor.register_hook(self, fn)
   T.tc(self, "register_hook")
   if not needs(self) then
      argerror("register_hook", "cannot register a hook on a tensor that doesn't require gradient")
   end
   if type(fn) ~= "function" then
      argerror("register_hook", "hook must be a function, got " .. T.typename(fn))
   end
   local holder = rawget(self, "grad_fn") or self
   local hooks = rawget(holder, "_hooks")
   if not hooks then hooks = {}; rawset(holder, "_hooks", hooks) end
   hooks[#hooks + 1] = fn
   return { remove = function()
      for i = #hooks, 1, -1 do if hooks[i] == fn then table.remove(hooks, i) end end
   end }
end

-- register_post_accumulate_grad_hook(fn) (PyTorch's name), on a leaf that requires grad:
-- fn(self) runs once per backward, after self.grad has received every gradient of that backward
-- (a leaf used several times in the graph gets its hook after the last accumulation); its result
-- is ignored. DistributedDataParallel starts a bucket's all-reduce from it. Returns a handle with
-- :remove().
function Tensor.register_post_accumulate_grad_hook(self, fn)
   local fname = "register_post_accumulate_grad_hook"
   T.tc(self, fname)
   if not needs(self) then
      argerror(fname, "cannot register a hook on a tensor that doesn't require gradient")
   end
   if rawget(self, "grad_fn") ~= nil then
      argerror(fname, "post accumulate grad hooks cannot be registered on non-leaf tensors")
   end
   if type(fn) ~= "function" then
      argerror(fname, "hook must be a function, got " .. T.typename(fn))
   end
   local hooks = rawget(self, "_post_hooks")
   if not hooks then hooks = {}; rawset(self, "_post_hooks", hooks) end
   hooks[#hooks + 1] = fn
   return { remove = function()
      for i = #hooks, 1, -1 do if hooks[i] == fn then table.remove(hooks, i) end end
      if #hooks == 0 and rawget(self, "_post_hooks") == hooks then
         rawset(self, "_post_hooks", nil)
      end
   end }
end

-- keep the gradient of a non-leaf tensor in self.grad after backward
function Tensor.retain_grad(self)
   T.tc(self, "retain_grad")
   if not needs(self) then
      argerror("retain_grad", "can't retain_grad on a tensor that has requires_grad=false")
   end
   if rawget(self, "grad_fn") == nil or rawget(self, "_retains") then return self end
   rawset(self, "_retains", true)
   Tensor.register_hook(self, function(g)
      local cur = rawget(self, "grad")
      if cur == nil then rawset(self, "grad", raw.clone(g))
      else raw.add_(cur, g) end
   end)
   return self
end

---------------------------------------------------------------------------------------------
-- the engine
---------------------------------------------------------------------------------------------

local function run_hooks(holder, g)
   local hooks = rawget(holder, "_hooks")
   if hooks then
      for i = 1, #hooks do
         local r = hooks[i](g)
         if r ~= nil then g = r end
      end
   end
   return g
end

-- mark a gradient that a backward function allocated and hands to nobody else: the leaf may
-- take it as its .grad without a copy (when its layout obeys the contract)
local function fresh(t)
   if t ~= nil then rawset(t, "_fresh", true) end
   return t
end
A.fresh = fresh

-- Free a dead gradient now instead of at the next garbage collection: its memory goes straight
-- back to the allocator's cache (and is reused, still in cache, by the next backward op), and the
-- collections that tensor memory triggers come less often. Only for fresh tensors, which nobody
-- but the engine holds, once they are used up.
local function release(t)
   local c = rawget(t, "_c")
   if c ~= nil then
      rawset(t, "_c", nil)
      C.lm_tensor_release_storage(c)
   end
end

-- may a fresh gradient gc become the .grad of leaf lc as it is?
local function stealable(lc, gc)
   if gc.dtype ~= lc.dtype or gc.device ~= lc.device or gc.ndim ~= lc.ndim then return false end
   if C.lm_is_non_overlapping_and_dense(lc) ~= 0 then
      if C.lm_is_non_overlapping_and_dense(gc) == 0 then return false end
      for i = 0, lc.ndim - 1 do
         if lc.sizes[i] ~= gc.sizes[i] then return false end
         if lc.sizes[i] ~= 1 and lc.strides[i] ~= gc.strides[i] then return false end
      end
      return true
   end
   return C.lm_is_contiguous(gc, 0) ~= 0
end

-- gradient layout contract: the leaf's strides when it is NOD, else contiguous
local function accumulate(leaf, g)
   g = run_hooks(leaf, g)
   local lc = rawget(leaf, "_c")
   if lc == nil then return end
   local cur = rawget(leaf, "grad")
   if cur == nil and rawget(g, "_fresh") and stealable(lc, g._c) then
      rawset(g, "_fresh", nil)
      rawset(leaf, "grad", g)
   elseif cur == nil then
      outp[0] = nil
      local st
      if C.lm_is_non_overlapping_and_dense(lc) ~= 0 then
         st = C.lm_empty_strided(lc.ndim, lc.sizes, lc.strides, lc.dtype, lc.device, outp)
      else
         st = C.lm_empty(lc.ndim, lc.sizes, lc.dtype, 0, lc.device, outp)
      end
      check(st, "backward")
      local dst = wrap(outp[0])
      check(C.lm_copy_(dst._c, g._c), "backward")
      rawset(leaf, "grad", dst)
      if rawget(g, "_fresh") and not rawget(leaf, "_hooks") then release(g) end
   else
      local gc = g
      if g._c.dtype ~= cur._c.dtype then gc = raw.to(g, dtypes.from_id(cur._c.dtype)) end
      raw.add_(cur, gc)
      if rawget(g, "_fresh") and not rawget(leaf, "_hooks") then release(g) end
   end
end

local function is_node(e) return getmetatable(e) ~= mt end

local function run_post_hooks(leaf)
   local hooks = rawget(leaf, "_post_hooks")
   if hooks then
      for i = 1, #hooks do hooks[i](leaf) end
   end
end

-- A.queue_callback(fn): during a backward pass (from a hook), fn() runs once that pass has
-- finished, before backward returns (PyTorch's Variable._execution_engine.queue_callback);
-- callbacks run in the order queued, with grad mode off. DistributedDataParallel waits for its
-- all-reduces there. Outside a backward pass it is an error.
local callbacks = nil
function A.queue_callback(fn)
   if type(fn) ~= "function" then
      error("lumen.autograd.queue_callback: expected a function, got " .. T.typename(fn), 2)
   end
   if callbacks == nil then
      error("lumen.autograd.queue_callback: no backward pass is running (queue callbacks from " ..
            "a hook during backward)", 2)
   end
   callbacks[#callbacks + 1] = fn
end

---------------------------------------------------------------------------------------------
-- profiling: A.set_profiler(fn) makes backward call fn(name, seconds) after each node's backward
-- function ("AccumulateGrad" for the leaf accumulations, "GradAdd" for summing the gradients of a
-- node used more than once); nil turns it off. LUMEN_PROFILE=1 in the environment starts a
-- collecting profiler at load, which prints its table to stderr at exit: A.profile_stats()
-- returns {name = {calls, seconds}}, A.profile_report() the table as text, A.profile_reset()
-- clears it. bench/train_step.lua breaks a whole training step down (forward ops too).
---------------------------------------------------------------------------------------------

local profiler = nil
local clock
do
   -- a private name for clock_gettime: scripts declare clock_gettime with their own timespec
   -- type, and a second declaration of the same symbol would be ignored
   pcall(ffi.cdef, [[
      typedef struct { long tv_sec; long tv_nsec; } lm_ag_timespec;
      int lm_ag_clock_gettime(int clk, lm_ag_timespec *tp) __asm__("clock_gettime");
   ]])
   local ts = ffi.new("lm_ag_timespec")
   clock = function()
      ffi.C.lm_ag_clock_gettime(1, ts) -- CLOCK_MONOTONIC
      return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
   end
end
A.clock = clock

-- set_profiler(fn [, clockfn]): clockfn (seconds, default A.clock: monotonic wall time) times
-- the nodes; returns the previous fn
local wall_clock = clock
function A.set_profiler(fn, clockfn)
   if fn ~= nil and type(fn) ~= "function" then
      error("lumen.autograd.set_profiler: expected a function or nil, got " .. T.typename(fn), 2)
   end
   if clockfn ~= nil and type(clockfn) ~= "function" then
      error("lumen.autograd.set_profiler: clock must be a function, got " .. T.typename(clockfn), 2)
   end
   local prev = profiler
   profiler = fn
   clock = clockfn or wall_clock
   return prev
end

local pstats = {}
function A.profile_stats() return pstats end
function A.profile_reset() pstats = {} end
local function collect(name, dt)
   local s = pstats[name]
   if s == nil then s = { 0, 0 }; pstats[name] = s end
   s[1] = s[1] + 1
   s[2] = s[2] + dt
end
A.profile_collect = collect
-- the collected times as text, slowest first
function A.profile_report()
   local rows, total = {}, 0
   for name, st in pairs(pstats) do
      rows[#rows + 1] = { name, st[1], st[2] }
      total = total + st[2]
   end
   table.sort(rows, function(a, b) return a[3] > b[3] end)
   local out = { ("autograd backward profile: %.1f ms in %d kinds of nodes"):format(total * 1e3,
                                                                                    #rows) }
   for _, r in ipairs(rows) do
      out[#out + 1] = ("  %-36s %8d calls %10.3f ms %8.1f us/call"):format(r[1], r[2], r[3] * 1e3,
                                                                          r[3] / r[2] * 1e6)
   end
   return table.concat(out, "\n")
end

do
   local env = os.getenv("LUMEN_PROFILE")
   if env and env ~= "" and env ~= "0" then
      profiler = collect
      -- printed to stderr when the Lua state closes (bin/lumen closes it on exit)
      local sentinel = newproxy(true)
      getmetatable(sentinel).__gc = function()
         if next(pstats) ~= nil then io.stderr:write(A.profile_report(), "\n") end
      end
      A._profile_sentinel = sentinel
   end
end

-- bw(g) as a table of results, timed when a profiler is set. g stops being fresh: a backward may
-- hand it on to several inputs (AddBackward returns it twice), so nobody may take it over.
local function call_backward(node, bw, g)
   if rawget(g, "_fresh") then rawset(g, "_fresh", nil) end
   if profiler == nil then return { bw(g) } end
   local t0 = clock()
   local r = { bw(g) }
   profiler(node.name, clock() - t0)
   return r
end

local function accumulate_timed(e, gi)
   if profiler == nil then return accumulate(e, gi) end
   local t0 = clock()
   accumulate(e, gi)
   profiler("AccumulateGrad", clock() - t0)
end

-- the sum of two gradients for the same node. A fresh prev (allocated by a backward function and
-- held by nobody else) of the same dtype, sizes and strides as gi takes the sum in place: the
-- same values and layout as raw.add would give, without a new tensor.
local function same_layout(ac, bc)
   if ac.dtype ~= bc.dtype or ac.ndim ~= bc.ndim or ac.device ~= bc.device then return false end
   for i = 0, ac.ndim - 1 do
      if ac.sizes[i] ~= bc.sizes[i] or ac.strides[i] ~= bc.strides[i] then return false end
   end
   return C.lm_is_non_overlapping_and_dense(ac) ~= 0
end

local function grad_sum(prev, gi)
   if rawequal(prev, gi) then return raw.add(prev, gi) end
   local fp, fg = rawget(prev, "_fresh"), rawget(gi, "_fresh")
   local r
   if fp and same_layout(prev._c, gi._c) then
      r = raw.add_(prev, gi)
   else
      r = raw.add(prev, gi)
      if fp then release(prev) end
   end
   if fg then release(gi) end
   return r
end

local function grad_add(prev, gi)
   if profiler == nil then return grad_sum(prev, gi) end
   local t0 = clock()
   local r = grad_sum(prev, gi)
   profiler("GradAdd", clock() - t0)
   return r
end

local function run_backward(root_tensor, grad, retain)
   local root = rawget(root_tensor, "grad_fn")
   if root == nil then
      accumulate(root_tensor, grad)
      run_post_hooks(root_tensor)
      return
   end
   -- dependency counts over the nodes reachable from root; leaves with post-accumulate hooks:
   -- how many edges lead to them (their hooks run after the last one)
   local deps = { [root] = 0 }
   local lcount = nil
   local stack, sp = { root }, 1
   while sp > 0 do
      local node = stack[sp]; stack[sp] = nil; sp = sp - 1
      local inputs = node.inputs
      if inputs == nil then
         error("lumen.backward: trying to backward through the graph a second time (or directly " ..
               "access saved tensors after they have already been freed); pass " ..
               "{retain_graph = true} to the first backward", 0)
      end
      for i = 1, #inputs do
         local e = inputs[i]
         if e and is_node(e) then
            local d = deps[e]
            if d == nil then
               deps[e] = 1
               sp = sp + 1; stack[sp] = e
            else
               deps[e] = d + 1
            end
         elseif e and rawget(e, "_post_hooks") then
            if lcount == nil then lcount = {} end
            lcount[e] = (lcount[e] or 0) + 1
         end
      end
   end
   local lgot = lcount and {}
   local grads = { [root] = grad }
   local ready, rp = { root }, 1
   while rp > 0 do
      local node = ready[rp]; ready[rp] = nil; rp = rp - 1
      local g = grads[node]
      grads[node] = nil
      local inputs = node.inputs
      local results
      if g ~= nil then
         g = run_hooks(node, g)
         local bw = node.backward
         if bw == nil then
            error("lumen.backward: trying to backward through the graph a second time; pass " ..
                  "{retain_graph = true} to the first backward", 0)
         end
         local owned = rawget(g, "_fresh") and not rawget(node, "_hooks")
         results = call_backward(node, bw, g)
         if owned then
            -- used up unless the backward handed it on as it is
            local alive = false
            for i = 1, table.maxn(results) do
               if rawequal(results[i], g) then alive = true break end
            end
            if not alive then release(g) end
         end
      end
      for i = 1, #inputs do
         local e = inputs[i]
         if e then
            local gi = results and results[i]
            if is_node(e) then
               if gi ~= nil then
                  local prev = grads[e]
                  if prev == nil then grads[e] = gi else grads[e] = grad_add(prev, gi) end
               end
               local d = deps[e] - 1
               deps[e] = d
               if d == 0 then rp = rp + 1; ready[rp] = e end
            else
               if gi ~= nil then
                  accumulate_timed(e, gi)
                  if lgot then lgot[e] = true end
               end
               local lc = lcount and lcount[e]
               if lc then
                  lcount[e] = lc - 1
                  if lc == 1 and lgot[e] then run_post_hooks(e) end
               end
            end
         end
      end
      if not retain then
         node.backward = nil
         node.inputs = nil
      end
   end
end

-- t:backward(grad, {retain_graph = false})
local BACKWARD_OPTS = util.option_set("retain_graph")
function Tensor.backward(self, grad, opts)
   local c = T.tc(self, "backward")
   if not needs(self) then
      argerror("backward", "element 0 of tensors does not require grad and does not have a grad_fn")
   end
   if grad == nil then
      if c.numel ~= 1 then
         argerror("backward", "grad can be implicitly created only for scalar outputs (got " ..
                  tonumber(c.numel) .. " elements)")
      end
      outp[0] = nil
      check(C.lm_empty_like(c, -1, 3, outp), "backward")
      grad = wrap(outp[0])
      check(C.lm_fill_(grad._c, 1), "backward")
   else
      local gc = T.tc(grad, "backward", "grad")
      if not same_sizes(gc, c) then
         argerror("backward", ("grad has sizes (%s), expected (%s)"):format(
            table.concat(sizes_of(gc), ","), table.concat(sizes_of(c), ",")))
      end
      if gc.dtype ~= c.dtype then grad = raw.to(grad, dtypes.from_id(c.dtype)) end
   end
   local retain = false
   if opts ~= nil then
      if type(opts) ~= "table" then argerror("backward", "options must be a table") end
      local k = util.unknown_option(opts, BACKWARD_OPTS)
      if k ~= nil then argerror("backward", util.unknown_option_msg(k)) end
      retain = opts.retain_graph and true or false
   end
   local prev = enabled
   enabled = false
   T.suspend_lazy(true)        -- no deferred results inside backward (tensor.lua)
   local prev_cb = callbacks
   local cbs = {}
   callbacks = cbs
   local ok, err = pcall(run_backward, self, grad, retain)
   T.suspend_lazy(false)
   -- the callbacks queued during the pass (A.queue_callback), in order; more may be queued
   local i = 1
   while ok and i <= #cbs do
      ok, err = pcall(cbs[i])
      i = i + 1
   end
   callbacks = prev_cb
   enabled = prev
   if not ok then
      if type(err) == "string" and not err:find("^lumen%.") then
         err = "lumen.backward: " .. err
      end
      error(err, 0)
   end
   memory.settle_pool()
end

---------------------------------------------------------------------------------------------
-- differentiable Tensor methods
---------------------------------------------------------------------------------------------

local function scalar_or_tensor_needs(a, b)
   return needs(a) or needs(b)
end

-- binary ops: add, sub, mul, div, pow, maximum, minimum -----------------------------------

do
   local r_add, r_sub, r_mul, r_div, r_pow = raw.add, raw.sub, raw.mul, raw.div, raw.pow
   local r_neg = raw.neg

   local function rec_add(out, a, b, alpha)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      local al = alpha or 1
      attach(out, "AddBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(g, ma) end
         if need_b then gb = sum_to(al == 1 and g or r_mul(g, al), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.add(a, b, alpha)
      local out = r_add(a, b, alpha)
      if enabled and scalar_or_tensor_needs(a, b) then rec_add(out, a, b, alpha) end
      return out
   end

   local function rec_sub(out, a, b, alpha)
      local ma, mb = meta(a, out), meta(b, out)
      local al = alpha or 1
      local need_a, need_b = needs(a), needs(b)
      attach(out, "SubBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(g, ma) end
         if need_b then gb = sum_to(al == 1 and r_neg(g) or r_mul(g, -al), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.sub(a, b, alpha)
      local out = r_sub(a, b, alpha)
      if enabled and scalar_or_tensor_needs(a, b) then rec_sub(out, a, b, alpha) end
      return out
   end

   local function rec_mul(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local sa = needs(b) and a or nil     -- save only what the other gradient needs
      local sb = needs(a) and b or nil
      attach(out, "MulBackward", function(g)
         local ga, gb
         if sb ~= nil then ga = sum_to(r_mul(g, sb), ma) end
         if sa ~= nil then gb = sum_to(r_mul(g, sa), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.mul(a, b)
      local out = r_mul(a, b)
      if enabled and scalar_or_tensor_needs(a, b) then rec_mul(out, a, b) end
      return out
   end

   local function rec_div(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      local sout = need_b and out or nil
      attach(out, "DivBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_div(g, b), ma) end
         if need_b then gb = sum_to(r_neg(r_div(r_mul(g, sout), b)), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.div(a, b)
      local out = r_div(a, b)
      if enabled and scalar_or_tensor_needs(a, b) then rec_div(out, a, b) end
      return out
   end

   local function rec_pow(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "PowBackward", function(g)
         local ga, gb
         if need_a then
            -- d/da a^b = b * a^(b-1); b == 0 gives 0 (PyTorch masks it)
            if type(b) == "number" then
               if b == 0 then ga = r_mul(g, 0)
               elseif b == 1 then ga = g
               elseif b == 2 then ga = r_mul(r_mul(g, a), 2)
               else ga = r_mul(r_mul(g, r_pow(a, b - 1)), b) end
            else
               ga = r_mul(r_mul(g, b), r_pow(a, r_sub(b, 1)))
            end
            ga = sum_to(ga, ma)
         end
         if need_b then
            -- d/db a^b = a^b * log(a)
            local la = type(a) == "number" and math.log(a) or raw.log(a)
            gb = sum_to(r_mul(r_mul(g, out), la), mb)
         end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.pow(a, b)
      local out = r_pow(a, b)
      if enabled and scalar_or_tensor_needs(a, b) then rec_pow(out, a, b) end
      return out
   end

   local function minmax_binary(name, rf, cmp)
      local function rec(out, a, b)
         local ma, mb = meta(a, out), meta(b, out)
         attach(out, name, function(g)
            -- ties split the gradient in half, as PyTorch does
            local ga, gb
            local wa = raw.add(raw.mul(cmp(a, b), 1.0), raw.mul(raw.eq(a, b), -0.5))
            if is_tensor(a) and needs(a) then ga = sum_to(r_mul(g, wa), ma) end
            if is_tensor(b) and needs(b) then
               gb = sum_to(r_mul(g, raw.sub(1, wa)), mb)
            end
            return ga, gb
         end, { edge(a), edge(b) })
      end
      return function(a, b)
         local out = rf(a, b)
         if enabled and scalar_or_tensor_needs(a, b) then rec(out, a, b) end
         return out
      end
   end
   Tensor.maximum = minmax_binary("MaximumBackward", raw.maximum, raw.ge)
   Tensor.minimum = minmax_binary("MinimumBackward", raw.minimum, raw.le)
end

-- unary ops --------------------------------------------------------------------------------

do
   local r_mul, r_div = raw.mul, raw.div
   -- name -> { save = "x" | "out", grad = function(g, saved) }
   local unary = {
      neg = { grad = function(g) return raw.neg(g) end },
      exp = { save = "out", grad = function(g, y) return r_mul(g, y) end },
      log = { save = "x", grad = function(g, x) return r_div(g, x) end },
      sqrt = { save = "out", grad = function(g, y) return r_div(g, r_mul(y, 2)) end },
      rsqrt = { save = "out", grad = function(g, y)
         return r_mul(r_mul(g, raw.mul(raw.mul(y, y), y)), -0.5) end },
      abs = { save = "x", grad = function(g, x) return r_mul(g, raw.sign(x)) end },
      relu = { save = "out", grad = function(g, y) return raw.relu_backward(g, y) end },
      sigmoid = { save = "out", grad = function(g, y) return raw.sigmoid_backward(g, y) end },
      tanh = { save = "out", grad = function(g, y) return raw.tanh_backward(g, y) end },
      square = { save = "x", grad = function(g, x) return r_mul(r_mul(g, x), 2) end },
      reciprocal = { save = "out", grad = function(g, y)
         return raw.neg(r_mul(g, r_mul(y, y))) end },
      sin = { save = "x", grad = function(g, x) return r_mul(g, raw.cos(x)) end },
      cos = { save = "x", grad = function(g, x) return raw.neg(r_mul(g, raw.sin(x))) end },
      log1p = { save = "x", grad = function(g, x) return r_div(g, raw.add(x, 1)) end },
      expm1 = { save = "out", grad = function(g, y) return r_mul(g, raw.add(y, 1)) end },
      sign = { grad = function(g) return r_mul(g, 0) end },
      floor = { grad = function(g) return r_mul(g, 0) end },
      ceil = { grad = function(g) return r_mul(g, 0) end },
      round = { grad = function(g) return r_mul(g, 0) end },
   }
   local function titled(name)
      return (name:gsub("^%l", string.upper):gsub("_(%l)", string.upper)) .. "Backward"
   end
   for name, spec in pairs(unary) do
      local f = raw[name]
      local grad = spec.grad
      local bname = titled(name)
      -- (the closures are made in rec, not in the method: a function that makes closures is
      -- not compiled by LuaJIT past its returns, and these methods are on every hot path)
      if spec.save == "x" then
         local function rec(out, self)
            attach(out, bname, function(g) return grad(g, self) end, { edge(self) })
         end
         Tensor[name] = function(self)
            local out = f(self)
            if enabled and needs(self) then rec(out, self) end
            return out
         end
      elseif spec.save == "out" then
         local function rec(out, self)
            attach(out, bname, function(g) return grad(g, out) end, { edge(self) })
         end
         Tensor[name] = function(self)
            local out = f(self)
            if enabled and needs(self) then rec(out, self) end
            return out
         end
      else
         Tensor[name] = function(self)
            local out = f(self)
            if enabled and needs(self) then
               attach(out, bname, grad, { edge(self) })
            end
            return out
         end
      end
   end

   local r_clamp = raw.clamp
   local function clamp_mask(x, lo, hi)
      -- gradient flows where lo <= x <= hi (PyTorch)
      local m
      if lo ~= nil then m = raw.ge(x, lo) end
      if hi ~= nil then
         local mh = raw.le(x, hi)
         m = m and raw.logical_and(m, mh) or mh
      end
      return m
   end
   local function rec_clamp(out, self, lo, hi)
      attach(out, "ClampBackward", function(g)
         return r_mul(g, clamp_mask(self, lo, hi))
      end, { edge(self) })
   end
   function Tensor.clamp(self, lo, hi)
      local out = r_clamp(self, lo, hi)
      if enabled and needs(self) then rec_clamp(out, self, lo, hi) end
      return out
   end
   Tensor.clip = Tensor.clamp
   A._clamp_mask = clamp_mask
end

-- in-place ops -----------------------------------------------------------------------------

local function inplace_check(self, fname)
   if needs(self) and rawget(self, "grad_fn") == nil then
      argerror(fname, "a leaf tensor that requires grad is being used in an in-place operation")
   end
end

-- rebase self onto a new node whose first input is self's previous history
local function rebase(self, name, backward, other_edges)
   local inputs = { edge(self) }
   if other_edges then
      for i = 1, #other_edges do inputs[i + 1] = other_edges[i] end
   end
   attach(self, name, backward, inputs)
end

do
   local r_mul, r_div = raw.mul, raw.div
   local function inplace_binary(name, rawf, bname)
      local function slow(self, b, alpha)
         inplace_check(self, name)
         local need_self, need_b = needs(self), needs(b)
         local mb = is_tensor(b) and meta(b, self) or false
         local old                 -- the value of self before the op, when a gradient needs it
         if (name == "mul_" and need_b) or (name == "div_" and need_b) then
            old = raw.clone(self)
         end
         local bsave = (name == "mul_" or name == "div_") and b or nil
         rawf(self, b, alpha)
         local al = alpha or 1
         rebase(self, bname, function(g)
            local gs, gb
            if name == "add_" then
               gs = need_self and g or nil
               if need_b then gb = sum_to(al == 1 and g or r_mul(g, al), mb) end
            elseif name == "sub_" then
               gs = need_self and g or nil
               if need_b then gb = sum_to(r_mul(g, -al), mb) end
            elseif name == "mul_" then
               if need_self then gs = r_mul(g, bsave) end
               if need_b then gb = sum_to(r_mul(g, old), mb) end
            else -- div_
               if need_self then gs = r_div(g, bsave) end
               if need_b then
                  gb = sum_to(raw.neg(r_div(r_mul(g, old), r_mul(bsave, bsave))), mb)
               end
            end
            return gs, gb
         end, { edge(b) })
         return self
      end
      return function(self, b, alpha)
         if not enabled or not (needs(self) or needs(b)) then
            return rawf(self, b, alpha)
         end
         return slow(self, b, alpha)
      end
   end
   Tensor.add_ = inplace_binary("add_", raw.add_, "AddBackward")
   Tensor.sub_ = inplace_binary("sub_", raw.sub_, "SubBackward")
   Tensor.mul_ = inplace_binary("mul_", raw.mul_, "MulBackward")
   Tensor.div_ = inplace_binary("div_", raw.div_, "DivBackward")

   local function inplace_unary(name, rawf, bname, grad)     -- grad(g, out)
      local function slow(self)
         inplace_check(self, name)
         rawf(self)
         rebase(self, bname, function(g) return grad(g, self) end)
         return self
      end
      return function(self)
         if not enabled or not needs(self) then return rawf(self) end
         return slow(self)
      end
   end
   local relu_plain = inplace_unary("relu_", raw.relu_, "ReluBackward",
      function(g, y) return raw.relu_backward(g, y) end)
   -- relu_ of a batch norm's result (nn.ReLU(true) after nn.BatchNorm2d): the node's relu_fuse
   -- (functional.lua) gives a backward that masks the gradient by the relu's output inside the
   -- batch norm's backward, which then replaces both nodes. Not when a hook watches the batch
   -- norm's result (it would miss its gradient). The batch norm's own node stays as it was for
   -- any other user of the pre-relu values.
   local function slow_relu_(self)
      local node = rawget(self, "grad_fn")
      local fuse = node and rawget(node, "relu_fuse")
      if fuse == nil or rawget(node, "_hooks") or node.backward == nil then
         return relu_plain(self)
      end
      raw.relu_(self)
      local inputs = {}
      for i = 1, #node.inputs do inputs[i] = node.inputs[i] end
      attach(self, "NativeBatchNormReluBackward", fuse(self), inputs)
      return self
   end
   function Tensor.relu_(self)
      if not enabled or not needs(self) then return raw.relu_(self) end
      return slow_relu_(self)
   end
   Tensor.sigmoid_ = inplace_unary("sigmoid_", raw.sigmoid_, "SigmoidBackward",
      function(g, y) return raw.sigmoid_backward(g, y) end)
   Tensor.tanh_ = inplace_unary("tanh_", raw.tanh_, "TanhBackward",
      function(g, y) return raw.tanh_backward(g, y) end)
   Tensor.exp_ = inplace_unary("exp_", raw.exp_, "ExpBackward",
      function(g, y) return r_mul(g, y) end)
   Tensor.neg_ = inplace_unary("neg_", raw.neg_, "NegBackward",
      function(g) return raw.neg(g) end)

   local function slow_clamp_(self, lo, hi)
      inplace_check(self, "clamp_")
      local mask = A._clamp_mask(self, lo, hi)
      raw.clamp_(self, lo, hi)
      rebase(self, "ClampBackward", function(g) return r_mul(g, mask) end)
      return self
   end
   function Tensor.clamp_(self, lo, hi)
      if not enabled or not needs(self) then
         return raw.clamp_(self, lo, hi)
      end
      return slow_clamp_(self, lo, hi)
   end

   -- fill_ / zero_: the old value gets no gradient
   local function inplace_fill(name, rawf)
      return function(self, ...)
         if not enabled or not needs(self) then return rawf(self, ...) end
         inplace_check(self, name)
         rawf(self, ...)
         rawset(self, "grad_fn", nil)
         rawset(self, "requires_grad", nil)
         return self
      end
   end
   Tensor.fill_ = inplace_fill("fill_", raw.fill_)
   Tensor.zero_ = inplace_fill("zero_", raw.zero_)

   local function slow_copy_(self, src)
      inplace_check(self, "copy_")
      raw.copy_(self, src)
      local ms = meta(src, self)
      if not needs(src) then
         rawset(self, "grad_fn", nil)
         rawset(self, "requires_grad", nil)
         return self
      end
      attach(self, "CopyBackward", function(g) return nil, sum_to(g, ms) end,
             { false, edge(src) })
      return self
   end
   function Tensor.copy_(self, src)
      if not enabled or not (needs(self) or needs(src)) then
         return raw.copy_(self, src)
      end
      return slow_copy_(self, src)
   end

   local function slow_addcmul_(self, a, b, value)
      inplace_check(self, "addcmul_")
      local v = value or 1
      local ma, mb = meta(a, self), meta(b, self)
      raw.addcmul_(self, a, b, value)
      rebase(self, "AddcmulBackward", function(g)
         local ga, gb
         if needs(a) then ga = sum_to(r_mul(r_mul(g, b), v), ma) end
         if needs(b) then gb = sum_to(r_mul(r_mul(g, a), v), mb) end
         return g, ga, gb
      end, { edge(a), edge(b) })
      return self
   end
   function Tensor.addcmul_(self, a, b, value)
      if not enabled or not (needs(self) or needs(a) or needs(b)) then
         return raw.addcmul_(self, a, b, value)
      end
      return slow_addcmul_(self, a, b, value)
   end
end

-- ternary ops ------------------------------------------------------------------------------

do
   local r_mul, r_div = raw.mul, raw.div
   local function rec_addcmul(out, self, a, b, value)
      local v = value or 1
      local ms, ma, mb = meta(self, out), meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "AddcmulBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_mul(r_mul(g, b), v), ma) end
         if need_b then gb = sum_to(r_mul(r_mul(g, a), v), mb) end
         return sum_to(g, ms), ga, gb
      end, { edge(self), edge(a), edge(b) })
   end
   function Tensor.addcmul(self, a, b, value)
      local out = raw.addcmul(self, a, b, value)
      if enabled and (needs(self) or needs(a) or needs(b)) then
         rec_addcmul(out, self, a, b, value)
      end
      return out
   end

   local function rec_addcdiv(out, self, a, b, value)
      local v = value or 1
      local ms, ma, mb = meta(self, out), meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "AddcdivBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_mul(r_div(g, b), v), ma) end
         if need_b then
            gb = sum_to(r_mul(r_div(r_mul(g, a), r_mul(b, b)), -v), mb)
         end
         return sum_to(g, ms), ga, gb
      end, { edge(self), edge(a), edge(b) })
   end
   function Tensor.addcdiv(self, a, b, value)
      local out = raw.addcdiv(self, a, b, value)
      if enabled and (needs(self) or needs(a) or needs(b)) then
         rec_addcdiv(out, self, a, b, value)
      end
      return out
   end

   local r_where = raw.where
   local function rec_where(out, cond, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "WhereBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_where(cond, g, 0), ma) end
         if need_b then gb = sum_to(r_where(cond, 0, g), mb) end
         return nil, ga, gb
      end, { false, edge(a), edge(b) })
   end
   local function where(cond, a, b)
      local out = r_where(cond, a, b)
      if enabled and (needs(a) or needs(b)) then rec_where(out, cond, a, b) end
      return out
   end
   T.where = where
   A.where = where
end

-- reductions -------------------------------------------------------------------------------

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
      if enabled and needs(self) then rec_sum(out, self, dims, keepdim, dtype) end
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
      if enabled and needs(self) then rec_mean(out, self, dims, keepdim, dtype) end
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
         if enabled and needs(self) then rec(out, self, dims, keepdim) end
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
         if not (enabled and needs(self)) then
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
         if enabled and out ~= self and needs(self) then rec(out, self) end
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
         if enabled and out ~= self and needs(self) then rec(out, self) end
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
      if enabled and needs(self) then rec_permute(out, self, ...) end
      return out
   end

   local function rec_transpose(out, self, d0, d1)
      attach(out, "TransposeBackward", function(g) return raw.transpose(g, d0, d1) end,
             { edge(self) })
   end
   function Tensor.transpose(self, d0, d1)
      local out = raw.transpose(self, d0, d1)
      if enabled and needs(self) then rec_transpose(out, self, d0, d1) end
      return out
   end

   local function rec_expand(out, self)
      local m = { ndim = self._c.ndim, sizes = sizes_of(self._c),
                  dtype = dtypes.from_id(self._c.dtype) }
      attach(out, "ExpandBackward", function(g) return sum_to(g, m) end, { edge(self) })
   end
   function Tensor.expand(self, ...)
      local out = raw.expand(self, ...)
      if enabled and needs(self) then rec_expand(out, self) end
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
      if enabled and needs(self) then rec_narrow(out, self, d, start, length) end
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
      if enabled and needs(self) then rec_select(out, self, d, i) end
      return out
   end

   local function rec_as_strided(out, self, sizes, strides, offset)
      argerror("as_strided", "as_strided is not differentiable in lumen (use detach())")
   end
   function Tensor.as_strided(self, sizes, strides, offset)
      local out = raw.as_strided(self, sizes, strides, offset)
      if enabled and needs(self) then rec_as_strided(out, self, sizes, strides, offset) end
      return out
   end
end

-- matmul -----------------------------------------------------------------------------------

do
   local r_matmul, r_t, r_reshape = raw.matmul, raw.transpose, raw.reshape
   local function rec_matmul(out, self, other)
      local ac, bc = self._c, other._c
      local a_sizes, b_sizes = sizes_of(ac), sizes_of(bc)
      local na, nb = ac.ndim, bc.ndim
      local need_a, need_b = needs(self), needs(other)
      local a_dt, b_dt = ac.dtype, bc.dtype
      attach(out, "MmBackward", function(g)
         -- promote 1-D operands to matrices, then use the 2-D / batched formulas
         local a2, b2 = self, other
         if na == 1 then a2 = r_reshape(self, { 1, a_sizes[1] }) end
         if nb == 1 then b2 = r_reshape(other, { b_sizes[1], 1 }) end
         -- g has the shape of a2 @ b2 with the promoted dims removed
         local gs = sizes_of(g._c)
         if na == 1 then table.insert(gs, #gs - (nb == 1 and 0 or 1) + 1, 1) end
         if nb == 1 then gs[#gs + 1] = 1 end
         local g2 = r_reshape(g, gs)
         local ga, gb
         if need_a then
            ga = r_matmul(g2, r_t(b2, -1, -2))
            ga = sum_to(ga, { ndim = na == 1 and 2 or na,
                              sizes = na == 1 and { 1, a_sizes[1] } or a_sizes,
                              dtype = dtypes.from_id(a_dt) })
            if na == 1 then ga = r_reshape(ga, a_sizes) end
         end
         if need_b then
            gb = r_matmul(r_t(a2, -1, -2), g2)
            gb = sum_to(gb, { ndim = nb == 1 and 2 or nb,
                              sizes = nb == 1 and { b_sizes[1], 1 } or b_sizes,
                              dtype = dtypes.from_id(b_dt) })
            if nb == 1 then gb = r_reshape(gb, b_sizes) end
         end
         return ga, gb
      end, { edge(self), edge(other) })
   end
   function Tensor.matmul(self, other)
      local out = r_matmul(self, other)
      if enabled and (needs(self) or needs(other)) then rec_matmul(out, self, other) end
      return out
   end
   Tensor.mm = Tensor.matmul
end

-- cat --------------------------------------------------------------------------------------

do
   local r_cat = raw.cat
   local rec_cat
   local function cat(list, dim)
      local out = r_cat(list, dim)
      if enabled then
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
   A.cat = cat
end

-- lumen's init.lua calls install(lm) once: the grad-mode functions join the namespace
function A.install(lm)
   lm.no_grad = A.no_grad
   lm.enable_grad = A.enable_grad
   lm.is_grad_enabled = A.is_grad_enabled
   lm.set_grad_enabled = A.set_grad_enabled
   lm.where = function(...) return T.where(...) end
   lm.cat = function(...) return T.cat(...) end
end

return A
