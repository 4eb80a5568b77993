-- lumen.autocast -- mixed-precision regions: lm.autocast(opts, fn, ...) runs fn(...) with some
-- operators computed in a low-precision dtype (bfloat16 or float16) and others in float32, as
-- PyTorch's torch.autocast does (docs/mixed_precision.md has the table).
--
-- This module holds the state (on / off and the dtype for each device type, the nesting depth),
-- the policy (which op runs in which precision), the casts and the weight-cast cache. The ops
-- ask it at their entry:
--   * lm.F.conv2d, linear, softmax, log_softmax, nll_loss, cross_entropy, mse_loss call
--     low() / f32() on their tensor arguments (lua/lumen/functional/*.lua; their hook is one
--     upvalue test, kept current by subscribe());
--   * the Tensor methods of the two lists below (matmul / mm; sum, prod, exp, log, pow, ...)
--     are wrapped here, on top of autograd's differentiable versions (a wrapper under autograd
--     could not record its cast), when this module loads (lua/lumen/init.lua loads it right
--     after autograd). Off, a wrapper costs one upvalue test and a tail call.
-- Every cast is t:to(dtype) with autograd on, so a gradient flows back through it and reaches a
-- float32 parameter as float32. Everything else (elementwise ops, pools, batch norm, cat, views)
-- follows its inputs by lumen's usual type promotion.
--
-- The weight cache: a leaf float32 tensor that requires grad (a parameter) is cast to the low
-- dtype once per region; later uses in the same region get the same cast tensor. The cache is
-- emptied when the outermost region exits (as PyTorch's autocast cache).

local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local util = require("lumen.util")

local type, rawget, getmetatable, setmetatable, pcall, error, pairs, ipairs, tonumber,
   tostring = type, rawget, getmetatable, setmetatable, pcall, error, pairs, ipairs, tonumber,
   tostring

local Tensor, mt, argerror, typename = T.Tensor, T.mt, T.argerror, T.typename

local F32 = tonumber(C.LM_FLOAT32)
local F16, BF16 = tonumber(C.LM_FLOAT16), tonumber(C.LM_BFLOAT16)
local DEV_CUDA0, NUM_CUDA = T.DEV_CUDA0, T.NUM_CUDA

local M = {}

---------------------------------------------------------------------------------------------
-- state
---------------------------------------------------------------------------------------------

-- one entry per device type: "cuda" covers cuda:N; "cpu" every other device (cpu, and the test
-- devices sim:N and meta, which run the CPU's kernels)
local cpu_on, cpu_dt = false, BF16      -- PyTorch's defaults: bfloat16 on the CPU,
local cuda_on, cuda_dt = false, F16     -- float16 on CUDA
local active = false                    -- cpu_on or cuda_on: the hooks' one test
local cache_on = true
local depth = 0                         -- regions entered and not left (enabled or not)
local cache = {}                        -- dtype id -> {tensor -> its cast} (weak keys)

local listeners = {}
local function set_active(on)
   if on == active then return end
   active = on
   for i = 1, #listeners do listeners[i](on) end
end

-- subscribe(fn): fn(active) now and on every change (the functional hooks keep an upvalue)
function M.subscribe(fn)
   listeners[#listeners + 1] = fn
   fn(active)
end

local function is_cuda(dev) return dev >= DEV_CUDA0 and dev < DEV_CUDA0 + NUM_CUDA end

---------------------------------------------------------------------------------------------
-- casts
---------------------------------------------------------------------------------------------

-- the cdata of x when x is a tensor autocast may cast (floating, not float64), else nil. A
-- pending (deferred) result is float32 or float64 (lumen.tensor defers only those): computed
-- when `force` (a cast to the low dtype needs its data), else left as it is.
local function castable(x, force)
   if getmetatable(x) ~= mt then return nil end
   local c = rawget(x, "_c")
   if c == nil then
      if not force or rawget(x, "_lz") == nil then return nil end  -- freed: the op raises
      c = T.cdata(x)
   end
   local d = c.dtype
   if d == F32 or d == BF16 or d == F16 then return c end
   return nil
end

local function cast(x, did)
   return Tensor.to(x, dtypes.from_id(did))
end

-- x cast to the low dtype of its device type's region (x itself when not castable, off there,
-- or already in that dtype). Parameters (leaf float32 tensors that require grad) go through
-- the cache.
local function low(x)
   local c = castable(x, true)
   if c == nil then return x end
   local did
   if is_cuda(c.device) then
      if not cuda_on then return x end
      did = cuda_dt
   else
      if not cpu_on then return x end
      did = cpu_dt
   end
   if c.dtype == did then return x end
   if cache_on and c.dtype == F32 and rawget(x, "requires_grad") == true
      and rawget(x, "grad_fn") == nil then
      local per = cache[did]
      if per == nil then
         per = setmetatable({}, { __mode = "k" })
         cache[did] = per
      end
      local y = per[x]
      -- a cast made with recording off has no edge to x: not reused when recording is on
      if y ~= nil and (rawget(y, "requires_grad") == true or not A.is_grad_enabled()) then
         return y
      end
      y = cast(x, did)
      per[x] = y
      return y
   end
   return cast(x, did)
end
M.low = low

-- x cast to float32 when castable and its device type's region is on
local function f32(x)
   local c = castable(x, false)
   if c == nil or c.dtype == F32 then return x end
   if is_cuda(c.device) then
      if not cuda_on then return x end
   elseif not cpu_on then
      return x
   end
   return cast(x, F32)
end
M.f32 = f32

function M.is_active() return active end

---------------------------------------------------------------------------------------------
-- the policy for Tensor methods (lm.F's ops call low / f32 themselves)
---------------------------------------------------------------------------------------------

-- run in the low dtype (PyTorch's lower-precision list, the ops lumen has)
M.LOW_METHODS = { "matmul", "mm" }
-- run in float32 (PyTorch's CUDA float32 list, the ops lumen has). sum and prod take a dtype
-- argument: given, it is used as is (PyTorch's fp32_set_opt_dtype).
M.F32_METHODS = { "sum", "prod", "exp", "log", "log1p", "expm1", "pow", "rsqrt", "reciprocal" }
-- cumsum(dim, dtype) too (PyTorch's fp32_set_opt_dtype: a given dtype is used as is)
M.F32_METHODS[#M.F32_METHODS + 1] = "cumsum"
-- the functional ops, for the documentation and the specs
M.LOW_FUNCTIONS = { "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d", "linear" }
M.F32_FUNCTIONS = { "softmax", "log_softmax", "nll_loss", "cross_entropy", "mse_loss" }

do
   local replaced = {}                  -- old function -> its wrapper (aliases share one)
   local function wrap_method(name, make)
      local f = Tensor[name]
      if type(f) ~= "function" then return end
      if replaced[f] == nil then replaced[f] = make(f) end
   end
   for _, name in ipairs(M.LOW_METHODS) do
      wrap_method(name, function(f)
         return function(a, b, ...)
            if active then a, b = low(a), low(b) end
            return f(a, b, ...)
         end
      end)
   end
   for _, name in ipairs(M.F32_METHODS) do
      if name == "cumsum" then
         wrap_method(name, function(f)
            return function(self, dim, dtype)
               if active and dtype == nil then self = f32(self) end
               return f(self, dim, dtype)
            end
         end)
      elseif name == "sum" or name == "prod" then
         wrap_method(name, function(f)
            return function(self, dims, keepdim, dtype)
               if active and dtype == nil then self = f32(self) end
               return f(self, dims, keepdim, dtype)
            end
         end)
      else
         wrap_method(name, function(f)
            return function(a, b, ...)
               if active then a, b = f32(a), f32(b) end
               return f(a, b, ...)
            end
         end)
      end
   end
   -- every name bound to a wrapped function (t:mm is t:matmul) gets the same wrapper
   for k, v in pairs(Tensor) do
      if replaced[v] ~= nil then Tensor[k] = replaced[v] end
   end
end

---------------------------------------------------------------------------------------------
-- lm.autocast
---------------------------------------------------------------------------------------------

local OPTS = util.option_set("dtype", "device", "enabled", "cache_enabled")
local LOW = { [BF16] = true, [F16] = true }

local function default_device_type()
   return is_cuda(T.default_device()) and "cuda" or "cpu"
end

local function check_device(fname, dev)
   if dev ~= "cpu" and dev ~= "cuda" then
      argerror(fname, "device must be \"cpu\" or \"cuda\" (a device type), got " ..
               (type(dev) == "string" and ("\"" .. dev .. "\"") or typename(dev)))
   end
   return dev
end

local function is_callable(fn)
   if type(fn) == "function" then return true end
   local m = type(fn) == "table" and getmetatable(fn)
   return type(m) == "table" and m.__call ~= nil
end

-- the results of pcall(fn, ...) after the state is restored: the values, or the error again
local function finish(ok, ...)
   if not ok then error((...), 0) end
   return ...
end

local function leave(p_cpu_on, p_cpu_dt, p_cuda_on, p_cuda_dt, p_cache, ok, ...)
   cpu_on, cpu_dt, cuda_on, cuda_dt, cache_on = p_cpu_on, p_cpu_dt, p_cuda_on, p_cuda_dt, p_cache
   depth = depth - 1
   if depth == 0 then cache = {} end
   set_active(cpu_on or cuda_on)
   return finish(ok, ...)
end

-- autocast(opts, fn, ...) or autocast(fn, ...): fn(...) inside a region; returns its results
function M.autocast(opts, fn, ...)
   local fname = "autocast"
   if is_callable(opts) then return M.autocast(nil, opts, fn, ...) end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      argerror(fname, "expected an options table {dtype =, device =, enabled =} and a " ..
               "function, got " .. typename(opts))
   end
   opts = opts or {}
   local k = util.unknown_option(opts, OPTS)
   if k ~= nil then argerror(fname, util.unknown_option_msg(k)) end
   if not is_callable(fn) then
      argerror(fname, "expected a function, got " .. typename(fn))
   end
   local dev = opts.device
   if dev == nil then dev = default_device_type() end
   check_device(fname, dev)
   local did
   if opts.dtype == nil then
      did = dev == "cuda" and F16 or BF16
   else
      local x = opts.dtype
      local d = dtypes.is_dtype(x) and x or (type(x) == "string" and dtypes.lookup(x) or nil)
      if d == nil or not LOW[d.id] then
         local got = d and tostring(d) or (type(x) == "string" and ("'" .. x .. "'"))
            or typename(x)
         argerror(fname, "dtype must be lm.bfloat16 or lm.float16, got " .. got)
      end
      did = d.id
   end
   local enabled = opts.enabled
   if enabled == nil then enabled = true end
   if type(enabled) ~= "boolean" then
      argerror(fname, "enabled must be a boolean, got " .. typename(enabled))
   end
   local cache_enabled = opts.cache_enabled
   if cache_enabled == nil then cache_enabled = cache_on end
   if type(cache_enabled) ~= "boolean" then
      argerror(fname, "cache_enabled must be a boolean, got " .. typename(cache_enabled))
   end
   local p_cpu_on, p_cpu_dt, p_cuda_on, p_cuda_dt, p_cache = cpu_on, cpu_dt, cuda_on, cuda_dt,
      cache_on
   if dev == "cuda" then cuda_on, cuda_dt = enabled, did
   else cpu_on, cpu_dt = enabled, did end
   cache_on = cache_enabled
   depth = depth + 1
   set_active(cpu_on or cuda_on)
   return leave(p_cpu_on, p_cpu_dt, p_cuda_on, p_cuda_dt, p_cache, pcall(fn, ...))
end

-- is_autocast_enabled(device = the default device's type)
function M.is_autocast_enabled(dev)
   if dev == nil then dev = default_device_type() end
   check_device("is_autocast_enabled", dev)
   if dev == "cuda" then return cuda_on end
   return cpu_on
end

-- get_autocast_dtype(device = the default device's type): the dtype a region there uses (also
-- outside one: the default, or the innermost region's)
function M.get_autocast_dtype(dev)
   if dev == nil then dev = default_device_type() end
   check_device("get_autocast_dtype", dev)
   return dtypes.from_id(dev == "cuda" and cuda_dt or cpu_dt)
end

-- for the specs: the number of cached casts for dtype d (a dtype)
function M._cache_size(d)
   local per = cache[d.id]
   local n = 0
   if per then for _ in pairs(per) do n = n + 1 end end
   return n
end

function M.install(lm)
   lm.autocast = M.autocast
   lm.is_autocast_enabled = M.is_autocast_enabled
   lm.get_autocast_dtype = M.get_autocast_dtype
end

return M
