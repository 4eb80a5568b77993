-- lumen -- `local lm = require("lumen")`: the public namespace.
--
-- Core pieces (this directory): C.lua (FFI binding), dtype.lua (dtype / memory-format
-- constants), tensor.lua (the Tensor type, views, layout, math), creation.lua (factories),
-- format.lua (tostring), memory.lua (GC pressure, allocator statistics).
-- Optional parts (autograd, autocast, nn, optim, layout, functional, models, amp) are loaded
-- when present.

-- lumen is built on LuaJIT's FFI. Under PUC Lua (luarocks often installs for lua5.1) say so
-- plainly, before require("ffi") fails with a message that names no cause.
if type(jit) ~= "table" then
   error("lumen requires LuaJIT (found " .. tostring(_VERSION) .. "); run scripts with " ..
         "`lumen script.lua` or `luajit script.lua`", 2)
end

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local creation = require("lumen.creation")
local memory = require("lumen.memory")
local format = require("lumen.format")

local lm = {}

lm._VERSION = "0.1.0"
lm._C = C                       -- keeps the library namespace referenced

-- constants
for _, d in ipairs(dtypes.dtypes) do lm[d.name] = d end
lm.contiguous_format = dtypes.contiguous_format
lm.channels_last = dtypes.channels_last
lm.channels_last_3d = dtypes.channels_last_3d
lm.preserve_format = dtypes.preserve_format
lm.dtypes = dtypes

-- the Tensor type (method table) and helpers for other modules
lm.Tensor = T.Tensor
lm.is_tensor = T.is_tensor
lm.tensor_mt = T.mt
lm.format = format
lm.memory = memory

-- creation
for k, v in pairs(creation) do lm[k] = v end

-- joining and selection
lm.cat = function(...) return T.cat(...) end
lm.stack = function(...) return T.stack(...) end
lm.where = function(...) return T.where(...) end

-- functional forms of the methods: lm.add(a, b) == a:add(b). They look the method up at call
-- time, so wrappers installed later (autograd) apply here too. For the binary ops a number may
-- come first (lm.sub(1, t)).
local functional = {
   "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
   "logical_and", "logical_or", "logical_not", "fmod", "atan2",
   "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "square",
   "reciprocal", "sign", "floor", "ceil", "round", "sin", "cos", "log1p", "expm1", "clamp",
   "addcmul", "addcdiv", "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin",
   "matmul", "mm", "view", "reshape", "permute", "transpose", "expand", "narrow", "select",
   "unsqueeze", "squeeze", "flatten", "clone", "contiguous", "numel", "equal", "allclose",
   "isnan", "all", "any", "var", "std", "masked_fill", "chunk", "split",
   -- composed (lua/lumen/autograd/composed_math.lua, composed_shape.lua)
   "softmax", "log_softmax", "logsumexp", "norm", "isinf", "isposinf", "isneginf", "isfinite",
   "nan_to_num", "lerp", "clamp_min", "clamp_max", "bmm", "baddbmm", "addmm", "mv", "dot",
   "outer", "tril", "triu", "unbind", "movedim", "moveaxis", "swapaxes", "swapdims", "unflatten",
   "broadcast_to", "tile", "remainder", "count_nonzero", "aminmax", "var_mean", "std_mean",
   "trace", "roll", "diagonal", "diag",
   -- more unary math (tensor.lua's unary ops)
   "trunc", "log2", "log10", "exp2", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
   "acosh", "atanh", "erf", "erfc", "nonzero", "argwhere", "masked_select",
   -- indexing (lua/lumen/autograd/indexing.lua)
   "sort", "argsort", "topk", "gather", "scatter_add", "index_select", "cumsum", "flip",
}
local Tensor = T.Tensor
for _, name in ipairs(functional) do
   lm[name] = function(...) return Tensor[name](...) end
end

-- devices: the factories' default (torch.set_default_device); LUMEN_DEFAULT_DEVICE sets it now
function lm.set_default_device(dev)
   T.set_default_device("set_default_device", dev)
end
function lm.get_default_device() return T.device_name(T.default_device()) end
do
   local env = os.getenv("LUMEN_DEFAULT_DEVICE")
   if env and env ~= "" then
      local id = T.device_id(env)
      if id == nil then
         error("lumen: LUMEN_DEFAULT_DEVICE: unknown device '" .. env .. "'", 0)
      end
      T.set_default_device("set_default_device", env)
   end
end

-- lm.cuda (torch.cuda's queries: is_available, device_count, memory_allocated, synchronize, ...)
-- and lm.backends (cudnn.benchmark, ...): lua/lumen/cuda.lua. is_available() is false and
-- device_count() 0 in a build without CUDA or on a machine without a GPU.
lm.cuda = require("lumen.cuda")
lm.cuda.install(lm)
-- lm.backends.cpu.disable / enable / implementations and lm.backends.verbose: lua/lumen/impl.lua
require("lumen.impl").install(lm)

-- threads
function lm.set_num_threads(n)
   if type(n) ~= "number" or n % 1 ~= 0 or n < 1 or n > 4096 then
      error("lumen.set_num_threads: expected a positive integer, got " .. tostring(n), 2)
   end
   C.lm_set_num_threads(n)
end

-- the random generator's whole state {seed, offset} (as numbers), for checkpoints
function lm.get_rng_state()
   local seed, off = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")
   C.lm_rng_get_state(seed, off)
   return { tonumber(seed[0]), tonumber(off[0]) }
end

function lm.set_rng_state(st)
   if type(st) ~= "table" or type(st[1]) ~= "number" or type(st[2]) ~= "number"
      or st[1] < 0 or st[2] < 0 or st[1] % 1 ~= 0 or st[2] % 1 ~= 0 then
      error("lumen.set_rng_state: expected {seed, offset} from lm.get_rng_state()", 2)
   end
   C.lm_rng_set_state(st[1], st[2])
end

function lm.get_num_threads()
   return C.lm_get_num_threads()
end

package.loaded["lumen"] = lm

-- optional parts owned by other modules. autograd patches the Tensor type, so it is loaded
-- now; the others load on first use (lm.nn, lm.optim, ...) to keep `require` cheap and free of
-- cycles. A module with an install(lm) function gets it called once.
local function exists(name)
   return package.searchpath and package.searchpath(name, package.path) ~= nil
end

local function load_part(modname)
   local m = require(modname)
   if type(m) == "table" and type(m.install) == "function" then m.install(lm) end
   return m
end

if exists("lumen.autograd") then lm.autograd = load_part("lumen.autograd") end
-- autocast wraps autograd's Tensor methods (matmul, sum, ...), so it loads right after it:
-- lm.autocast, lm.is_autocast_enabled, lm.get_autocast_dtype
if exists("lumen.autocast") then load_part("lumen.autocast") end

local lazy = {
   nn = "lumen.nn", optim = "lumen.optim", layout = "lumen.layout", data = "lumen.data",
   functional = "lumen.functional", models = "lumen.models", serialize = "lumen.serialize",
   checkpoint = "lumen.checkpoint", doc = "lumen.doc", comm = "lumen.comm", amp = "lumen.amp",
   jit = "lumen.jit", onnx = "lumen.onnx", ops = "lumen.ops",
   distributed = "lumen.distributed",
}
-- single functions that live in an optional module: name -> {module field, module}
local lazy_fn = {
   save = { "serialize", "save" },
   load = { "serialize", "load" },
   to_channels_last = { "layout", "to_channels_last" },
   save_checkpoint = { "checkpoint", "save_checkpoint" },
   load_checkpoint = { "checkpoint", "load_checkpoint" },
   help = { "doc", "help" },
}
setmetatable(lm, {
   __index = function(self, key)
      local modname = lazy[key]
      if modname then
         if not exists(modname) then return nil end
         local m = load_part(modname)
         rawset(self, key, m)
         return m
      end
      local fn = lazy_fn[key]
      if fn then
         local m = self[fn[1]]
         local f = type(m) == "table" and m[fn[2]] or nil
         if f == nil and key == "to_channels_last" then
            -- docs/api.md: same as model:to(lm.channels_last), in place, returns the model
            f = function(model) return model:to(dtypes.channels_last) or model end
         end
         if f ~= nil then rawset(self, key, f) end
         return f
      end
      if key == "F" then
         local nn = self.nn
         local F = nn and nn.functional or self.functional
         if F then rawset(self, "F", F) end
         return F
      end
      return nil
   end,
})

return lm
