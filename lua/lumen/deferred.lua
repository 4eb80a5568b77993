-- lumen.deferred -- deferred elementwise results: the engine behind LUMEN_LAZY / LUMEN_LAZY_MIN.
--
-- A large float a + b (or -, *, /, maximum, minimum; a tensor or a number on the right) made
-- outside autograd is not computed at once: the result is a "pending" tensor that holds the
-- recipe. If the next thing done with it is a float unary op (x:relu(), x:exp(), ...), that op
-- computes uop(a op b) in one pass (lm_binary_unary) and the pending result, usually a dead
-- temporary, is never materialized: (x + y):relu() writes one array, not two, and reads x and
-- y once (PyTorch materializes x + y, then frees it at once by reference counting; lumen cannot
-- free before the collector runs, so the temporary would land in memory that has left the
-- caches). Anything else done with a pending result computes it first ("forcing"), with the
-- bits the eager op would have given, so deferral is invisible:
--   * a pending tensor's metatable is pmt, which reports the tensor metatable to getmetatable
--     (so it passes every tensor check) and forces on any field or method lookup (x._c,
--     x:size(), ...) except the fusable unary methods; every rawget(x, "_c") in lumen goes
--     through cdata()/tc(), which force too;
--   * the recipe holds aliases of the inputs (their own structs on the same storage), so
--     freeing or re-pointing an input tensor does not change it;
--   * writes: every lumen function that writes into an existing tensor's memory (in-place ops,
--     out=, copy_, fill_, the optimizers, batch norm's running statistics, nn.init) first calls
--     barrier(c), which forces the pending results that read c's storage.
-- Only float results (float32/64, float16, bfloat16) of at least MIN_ELEMENTS elements with
-- inputs of the same sizes are deferred (no broadcasting, so no error can surface later), never
-- when an input requires grad, never during backward. LUMEN_LAZY=0 turns deferral off;
-- LUMEN_LAZY_MIN=n (elements) lowers the size threshold (the specs run once with
-- LUMEN_LAZY_MIN=1).
--
-- lumen.tensor owns the Tensor type and calls in here from its binary and unary ops; it hands
-- over the three things of its own the engine needs (attach below) instead of this module
-- requiring it, since lumen.tensor loads this module while it is itself being loaded. Its
-- public names (T.force, T.cdata, T.barrier, T.force_all, T.suspend_lazy, T.pending_count,
-- T.drop_pending) are these functions.

local ffi = require("ffi")
local C = require("lumen.C")
local memory = require("lumen.memory")

local rawget, rawset, setmetatable, pairs = rawget, rawset, setmetatable, pairs
local own = memory.own

local M = {}

local CPU, F32, F64 = C.LM_CPU, C.LM_FLOAT32, C.LM_FLOAT64

-- set by attach(): the tensor metatable, the one tensor constructor, the C-error raiser
local mt, wrap, raise

-- attach(tensor_mt, wrap, raise): the Tensor type whose results are deferred (lumen.tensor
-- calls it once, before any op runs)
function M.attach(tensor_mt, wrap_fn, raise_fn)
   mt, wrap, raise = tensor_mt, wrap_fn, raise_fn
end

local MIN_ELEMENTS = 2 ^ 18
if tonumber(os.getenv("LUMEN_LAZY_MIN") or "") then    -- tests: defer small results too
   MIN_ELEMENTS = math.max(1, tonumber(os.getenv("LUMEN_LAZY_MIN")))
end
-- the callers test it before calling defer: a small result costs them one compare
M.MIN_ELEMENTS = MIN_ELEMENTS
local lazy_on = os.getenv("LUMEN_LAZY") ~= "0"
local lazy_suspended = 0               -- > 0 during backward (autograd)
local pmt = {}                         -- the metatable of pending tensors (filled by seal)
local pending = setmetatable({}, { __mode = "k" })   -- pending tensor -> true
local npending = 0                     -- > 0 when pending may hold entries (recounted by barrier)
local LAZY_OPS = { [0] = true, [1] = true, [2] = true, [3] = true, [5] = true, [6] = true }
-- float16 / bfloat16 too: the fused pass rounds the binary result to 16 bits before the unary
-- op, as the eager pair does (lm_binary_unary), so (x + y):relu() reads and writes 16-bit
-- memory once, computing in float32
local LAZY_DTYPES = { [F32] = true, [F64] = true, [C.LM_FLOAT16] = true, [C.LM_BFLOAT16] = true }
-- the unary ops (lm_unary numbers) that fuse with a pending result (lm_binary_unary takes them)
local FUSABLE_UNARY = { [0] = true, [1] = true, [2] = true, [3] = true, [4] = true, [5] = true,
   [6] = true, [7] = true, [8] = true, [9] = true, [10] = true, [16] = true, [17] = true,
   [18] = true, [19] = true }
M.FUSABLE_UNARY = FUSABLE_UNARY

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")

-- make a pending tensor a plain (freed) one: no recipe, the tensor metatable
local function drop_pending(x)
   if rawget(x, "_lz") == nil then return end
   rawset(x, "_lz", nil)
   debug.setmetatable(x, mt)
   pending[x] = nil
end
M.drop_pending = drop_pending

-- compute a pending tensor (its recipe's op, with the eager op's error on failure); returns
-- its cdata
local function force(x)
   local r = rawget(x, "_lz")
   if r == nil then return rawget(x, "_c") end
   outp[0] = nil
   local st
   if r.bc ~= nil then
      st = C.lm_binary(r.op, r.ac, r.bc, r.alpha, outp)
   else
      st = C.lm_binary_scalar(r.op, r.ac, r.s, r.is_int, r.rev, r.alpha, outp)
   end
   if st ~= 0 then raise(r.fname) end
   local c = own(outp[0])
   rawset(x, "_lz", nil)
   rawset(x, "_c", c)
   debug.setmetatable(x, mt)
   pending[x] = nil
   if C.lm_mem_pressure() ~= 0 then memory.collect() end
   return c
end
M.force = force

-- a tensor's cdata (forcing a pending one), nil for a freed tensor; x must be a tensor
function M.cdata(x)
   local c = rawget(x, "_c")
   if c == nil and rawget(x, "_lz") ~= nil then c = force(x) end
   return c
end

-- before writing into the memory of the tensor whose cdata is c: compute the pending results
-- that read that memory
function M.barrier(c)
   if npending == 0 or c == nil then return end
   local s = c.storage
   local n = 0
   for x in pairs(pending) do
      local r = rawget(x, "_lz")
      if r ~= nil and (r.sa == s or r.sb == s) then
         force(x)
      elseif r ~= nil then
         n = n + 1
      end
   end
   npending = n
end

-- compute every pending result now (for code that hands memory to something lumen cannot see)
function M.force_all()
   for x in pairs(pending) do force(x) end
   npending = 0
end

-- autograd suspends deferral while it runs a backward pass
function M.suspend_lazy(on)
   lazy_suspended = lazy_suspended + (on and 1 or -1)
end

-- the number of pending results that may still be waiting (tests, diagnostics)
function M.pending_count()
   local n = 0
   for x in pairs(pending) do if rawget(x, "_lz") ~= nil then n = n + 1 end end
   return n
end

local alias_p = ffi.new("lm_tensor*[1]")
local function alias_of(c, fname)
   alias_p[0] = nil
   if C.lm_alias(c, alias_p) ~= 0 then raise(fname) end
   return own(alias_p[0])
end

-- A pending result keeps its inputs alive. One that has outlived two collections is being kept,
-- not dropped: compute it, so that its inputs can go (checked whenever a result is deferred)
local seen_cycles = 0
local function force_kept()
   seen_cycles = memory.cycles
   if npending == 0 then return end
   local n = 0
   for x in pairs(pending) do
      local r = rawget(x, "_lz")
      if r ~= nil and r.cycle < seen_cycles - 1 then
         force(x)
      elseif r ~= nil then
         n = n + 1
      end
   end
   npending = n
end

-- a pending tensor for a op b (b a cdata, or nil with the scalar s), or nil when the op runs now
function M.defer(op, a, ac, b, bc, s, is_int, rev, alpha, fname)
   if not lazy_on or lazy_suspended > 0 or not LAZY_OPS[op] then return nil end
   if memory.cycles ~= seen_cycles then force_kept() end
   local dt = ac.dtype
   if not LAZY_DTYPES[dt] or ac.device ~= CPU then return nil end
   if ac.numel < MIN_ELEMENTS then return nil end
   if rawget(a, "requires_grad") then return nil end
   if bc ~= nil then
      if bc.dtype ~= dt or bc.device ~= CPU or bc.ndim ~= ac.ndim or rawget(b, "requires_grad") then
         return nil
      end
      for d = 0, ac.ndim - 1 do
         if bc.sizes[d] ~= ac.sizes[d] then return nil end
      end
   end
   local r = { op = op, ac = alias_of(ac, fname), alpha = alpha, fname = fname, sa = ac.storage,
               cycle = memory.cycles }
   if bc ~= nil then
      r.bc = alias_of(bc, fname)
      r.sb = bc.storage
   else
      r.s, r.is_int, r.rev = s, is_int, rev
   end
   local x = setmetatable({ _lz = r }, pmt)
   pending[x] = true
   npending = npending + 1
   return x
end

-- uop(x) for a pending x: one fused pass; nil when it cannot be fused
function M.fused_unary(x, uop)
   local r = rawget(x, "_lz")
   outp[0] = nil
   local st
   if r.bc ~= nil then
      st = C.lm_binary_unary(r.op, r.ac, r.bc, r.alpha, uop, outp)
   else
      st = C.lm_binary_scalar_unary(r.op, r.ac, r.s, r.is_int, r.rev, r.alpha, uop, outp)
   end
   if st ~= 0 then return nil end
   return wrap(outp[0])
end

-- seal(Tensor, unary_names): fill the pending tensors' metatable once the tensor metatable has
-- all its metamethods (lumen.tensor calls it last). Every metamethod of the tensor metatable
-- (they reach the tensor through methods or tc, which force it); getmetatable reports the
-- tensor metatable; any field or method lookup forces, except the fusable unary methods
-- (unary_names: {name, lm_unary number} pairs), which see the pending tensor, and free, which
-- drops the recipe.
function M.seal(Tensor, unary_names)
   local fusable_names = {}
   for _, u in ipairs(unary_names) do
      if FUSABLE_UNARY[u[2]] then fusable_names[u[1]] = true end
   end
   for k, v in pairs(mt) do if k ~= "__index" then pmt[k] = v end end
   pmt.__metatable = mt
   pmt.__index = function(x, k)
      if fusable_names[k] or k == "free" then return Tensor[k] end
      force(x)
      return x[k]
   end
   pmt.__newindex = function(x, k, v)
      force(x)
      x[k] = v
   end
end

return M
