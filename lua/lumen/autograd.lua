-- lumen.autograd -- reverse-mode automatic differentiation on a graph recorded as ops run: the
-- engine. lm.autograd is this table.
--
-- Requiring this module installs differentiable versions of the Tensor methods (and of
-- lumen.tensor's where / cat) on top of the raw forward functions kept in lumen.tensor.raw: the
-- backward rules, one file per family in lua/lumen/autograd/ (elementwise, reduce, shape,
-- matmul; composed: var / std, masked_fill, chunk / split made of those; composed_math: softmax
-- and norm and the matrix products as methods; composed_shape: movedim, repeat, new_*, the
-- random fills), loaded at the end of this file. The graph they record (grad mode, nodes, edges,
-- record / attach and the helpers the rules share) is lumen.autograd.graph, whose names this
-- table re-exports. This file runs the graph backward (t:backward, the gradient layout,
-- hooks, queued callbacks, the profiler) and holds the Tensor methods about the graph
-- (requires_grad_, detach, is_leaf, hooks, retain_grad).
--
-- Saved tensors live only in the backward closures: after t:backward() the nodes drop their
-- closures and inputs (unless {retain_graph = true}), so activations are freed even while the
-- loss tensor lives on.
--
-- Gradient layout (memory_format.md section 7, accumulate_grad): a leaf's .grad has the leaf's
-- strides when the leaf is non-overlapping and dense, else it is contiguous; later gradients are
-- added into it in place. No version counters: a tensor saved for backward must not be modified
-- in place before backward runs (relu_ after a conv or batch norm is fine, as in PyTorch).

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")
local util = require("lumen.util")
local memory = require("lumen.memory")

local type, rawget, rawset, getmetatable, error, pcall = type, rawget, rawset, getmetatable,
   error, pcall
local tonumber, tostring = tonumber, tostring

local Tensor, mt, raw = T.Tensor, T.mt, T.raw
local wrap, check, argerror = T.wrap, T.check, T.argerror

local A = {}

-- the graph's names (lumen.autograd.graph): grad mode, recording, the rules' helpers
A.is_grad_enabled, A.set_grad_enabled = G.is_grad_enabled, G.set_grad_enabled
A.no_grad, A.enable_grad = G.no_grad, G.enable_grad
A.needs, A.edge, A.attach, A.record, A.recording = G.needs, G.edge, G.attach, G.record,
   G.recording
A.sizes_of, A.same_sizes, A.meta, A.sum_to = G.sizes_of, G.same_sizes, G.meta, G.sum_to
A.zeros_for = G.zeros_for

local set_grad_enabled = G.set_grad_enabled
local needs, sizes_of, same_sizes = G.needs, G.sizes_of, G.same_sizes

local outp = ffi.new("lm_tensor*[1]")

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
   local prev = set_grad_enabled(false)
   T.suspend_lazy(true)        -- no deferred results inside backward (deferred.lua)
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
   set_grad_enabled(prev)
   if not ok then
      if type(err) == "string" and not err:find("^lumen%.") then
         err = "lumen.backward: " .. err
      end
      error(err, 0)
   end
   memory.settle_pool()
end

---------------------------------------------------------------------------------------------
-- the backward rules: each file replaces its family's Tensor methods when it loads
---------------------------------------------------------------------------------------------

local elementwise = require("lumen.autograd.elementwise")
require("lumen.autograd.reduce")
local shape = require("lumen.autograd.shape")
require("lumen.autograd.matmul")
require("lumen.autograd.composed")
require("lumen.autograd.composed_math")
require("lumen.autograd.composed_shape")
require("lumen.autograd.indexing")
A.where, A.cat = elementwise.where, shape.cat
A._clamp_mask = elementwise.clamp_mask

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
