-- lumen.tensor -- the Tensor type: a Lua table {_c = <lm_tensor* owned by memory.own>} with a
-- shared metatable, plus inspection, views, layout changes and math on top of the C API.
--
-- Conventions (see docs/api.md):
--   * dims and indices are 1-based in Lua, negative counts from the end; C takes 0-based dims.
--   * every public function validates its arguments in Lua before calling C and raises
--     "lumen.<function>: <problem>"; a failing C call raises "lumen.<function>: <lm_last_error()>".
--   * every tensor-producing operation goes through `wrap` (one small local constructor).
--   * requires_grad / grad / grad_fn are plain Lua fields on the tensor table, owned by autograd.
--     Operators (__add, __unm, ...) dispatch through the Tensor method table at call time, so
--     autograd may replace Tensor.add etc.; the unwrapped forward functions stay in M.raw.

local ffi = require("ffi")
local bit = require("bit")
local C = require("lumen.C")
local BOOL = C.LM_BOOL
local dtypes = require("lumen.dtype")
local memory = require("lumen.memory")
local util = require("lumen.util")
local unknown_option = util.unknown_option

local type, tonumber, tostring, select, error = type, tonumber, tostring, select, error
local getmetatable, setmetatable, rawget, rawset = getmetatable, setmetatable, rawget, rawset
local ffi_string = ffi.string

local M = {}
local Tensor = {}                                 -- the method table
local mt = {}                                     -- the shared instance metatable
-- t.shape is t:size() (a Size); everything else comes from the method table. A function here
-- instead of the table is one Lua call per method lookup, which the JIT inlines: a:add(b) on 4
-- elements, median of 9 x 1e6 calls, six alternating runs, measured 0.151-0.166 us against
-- 0.160-0.184 us with the plain table (no difference beyond the noise). REPLs that complete
-- method names find the method table in mt.__fields.
-- A number or a table key is Torch7 indexing (t[i], t[{i, {a, b}}]: index_get below), checked
-- only after the method table missed, so method lookup costs what it did.
local index_get, index_set
mt.__index = function(t, k)
   local v = Tensor[k]
   if v ~= nil then return v end
   if k == "shape" then return Tensor.size(t) end
   local tk = type(k)
   if tk == "number" or tk == "table" then return index_get(t, k) end
   return nil
end
-- assignments to fields the table does not have yet: t[i] = v and t[{...}] = v write into the
-- tensor; any other key (requires_grad, grad, ...) is stored in the table as before
mt.__newindex = function(t, k, v)
   local tk = type(k)
   if tk == "number" or tk == "table" then return index_set(t, k, v) end
   rawset(t, k, v)
end
mt.__fields = Tensor                              -- the names a REPL can complete on a tensor
M.Tensor, M.mt = Tensor, mt
M.raw = {}                                        -- original (autograd-free) functions

local MAX_DIMS = 8
local MAX_SIZE = 2 ^ 53

local dtype_by_id = {}
for _, d in ipairs(dtypes.dtypes) do dtype_by_id[d.id] = d end
local FMT = {
   contiguous = dtypes.contiguous_format,
   cl = dtypes.channels_last,
   cl3d = dtypes.channels_last_3d,
   preserve = dtypes.preserve_format,
}
local fmt_by_id = { [0] = FMT.contiguous, FMT.cl, FMT.cl3d, FMT.preserve }

-- scratch buffers reused by every call (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local idxp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")
local stridebuf = ffi.new("int64_t[8]")
local dimbuf = ffi.new("int[8]")
local dbl1 = ffi.new("double[1]")

-- Doubles read out of FFI memory. LuaJIT keeps type tags in the high bits of NaNs: a double
-- whose high word is 0xFFF80000 or more (a negative NaN with a payload, e.g. a float16 0xff6d
-- widened by lm_to_doubles) is taken for a tagged value as soon as it is read into a Lua
-- value, and the process crashes or a "number" turns into a table. Comparing v ~= v after the
-- read is too late, so the high word is checked as a uint32 (always a plain number) first and
-- such a NaN is replaced by the canonical one. One integer compare per element.
local NAN = 0 / 0
local dbl1_hi = ffi.cast("uint32_t*", dbl1)
local HI_WORD = ffi.abi("le") and 1 or 0
local TAGGED_HI = 0xFFF80000

-- element i (0-based) of a double buffer whose uint32 view is hi32 (ffi.cast("uint32_t*", buf))
local function read_double(buf, hi32, i)
   if hi32[2 * i + HI_WORD] >= TAGGED_HI then return NAN end
   return buf[i]
end
M.read_double = read_double
M.NAN = NAN

---------------------------------------------------------------------------------------------
-- errors
---------------------------------------------------------------------------------------------

-- Errors point at the first stack frame outside lumen's own Lua files (the user's code), however
-- deep inside lumen they are raised; the level arguments below are accepted for compatibility
-- but not needed. Only the error path pays for the stack walk.
local lumen_dir = debug.getinfo(1, "S").source:match("^@(.*)[/\\]") or "lumen"
local lumen_prefix = "@" .. lumen_dir .. "/"

-- error() level (relative to the function calling error) of the first non-lumen frame
local function user_level()
   local lvl = 3                       -- 1 = user_level, 2 = the function calling error
   while true do
      local info = debug.getinfo(lvl, "S")
      if not info then return 0 end
      local src = info.source
      if info.what == "C" or src:sub(1, #lumen_prefix) ~= lumen_prefix then return lvl - 1 end
      lvl = lvl + 1
   end
end
M.user_level = user_level

-- raise "lumen.<fname>: <C error>"
local function raise(fname)
   error("lumen." .. fname .. ": " .. ffi_string(C.lm_last_error()), user_level())
end

-- check(status, fname): raise the C error when status ~= LM_OK
local function check(st, fname)
   if st ~= 0 then raise(fname) end
end

-- raise "lumen.<fname>: <msg>"
local function argerror(fname, msg)
   error("lumen." .. fname .. ": " .. msg, user_level())
end

M.raise, M.check, M.argerror = raise, check, argerror

local function typename(x)
   local m = getmetatable(x)
   if m == mt then return "tensor" end
   if m == "lumen.dtype" then return "dtype" end
   if m == "lumen.memory_format" then return "memory format" end
   return type(x)
end
M.typename = typename

-- Sizes (t:size(), t.shape): a plain Lua array ({2, 3, 4, 4}: s[1], #s, ipairs, table.concat
-- all work as before) with a metatable that prints it as "{2, 3, 4, 4}" and compares two sizes
-- by value (s == other:size()). Every function that takes sizes accepts one (is_sizes).
local SIZE_MT = {}
SIZE_MT.__tostring = function(s)
   local parts = {}
   for i = 1, #s do parts[i] = ("%d"):format(s[i]) end
   return "{" .. table.concat(parts, ", ") .. "}"
end
SIZE_MT.__eq = function(a, b)
   local n = #a
   if #b ~= n then return false end
   for i = 1, n do
      if a[i] ~= b[i] then return false end
   end
   return true
end
SIZE_MT.__concat = function(a, b)
   return (getmetatable(a) == SIZE_MT and tostring(a) or a) ..
          (getmetatable(b) == SIZE_MT and tostring(b) or b)
end
M.SIZE_MT = SIZE_MT

-- true for a table of sizes: a plain array or a Size (t:size(), t.shape)
local function is_sizes(x)
   if type(x) ~= "table" then return false end
   local m = getmetatable(x)
   return m == nil or m == SIZE_MT
end
M.is_sizes = is_sizes

-- a Size object from a Lua array (copied)
function M.Size(t)
   local r = {}
   for i = 1, #t do r[i] = t[i] end
   return setmetatable(r, SIZE_MT)
end

---------------------------------------------------------------------------------------------
-- construction
---------------------------------------------------------------------------------------------

local own, release = memory.own, memory.release

-- The one constructor: own a fresh lm_tensor* (memory.own: freed by a sweep once its cdata is
-- unreachable) and give it the Tensor metatable. Every new tensor also gives the allocator a
-- chance to ask for a garbage collection (memory.lua).
local function wrap(p)
   local t = setmetatable({ _c = own(p) }, mt)
   if C.lm_mem_pressure() ~= 0 then memory.collect() end
   return t
end
M.wrap = wrap

local function is_tensor(x)
   return getmetatable(x) == mt
end
M.is_tensor = is_tensor

---------------------------------------------------------------------------------------------
-- deferred elementwise results (lumen.deferred: LUMEN_LAZY, LUMEN_LAZY_MIN)
---------------------------------------------------------------------------------------------
-- Large float a op b results made outside autograd may come back "pending" (computed later, or
-- fused into the unary op that follows); lumen/deferred.lua has the rules. This file calls it
-- from binary and unary, forces pending tensors wherever it reads their data (tc), and calls
-- barrier before every write into an existing tensor's memory.
local deferred = require("lumen.deferred")
deferred.attach(mt, wrap, raise)
local LAZY_MIN_ELEMENTS = deferred.MIN_ELEMENTS
local FUSABLE_UNARY = deferred.FUSABLE_UNARY
local defer, force, barrier = deferred.defer, deferred.force, deferred.barrier
local drop_pending, fused_unary = deferred.drop_pending, deferred.fused_unary
M.drop_pending, M.force, M.cdata, M.barrier = drop_pending, force, deferred.cdata, barrier
M.force_all, M.suspend_lazy, M.pending_count = deferred.force_all, deferred.suspend_lazy,
   deferred.pending_count

-- the cdata of a tensor argument, or a Lua error
local function tc(x, fname, what, level)
   if getmetatable(x) == mt then
      local c = rawget(x, "_c")
      if c ~= nil then return c end
      if rawget(x, "_lz") ~= nil then return force(x) end
      argerror(fname, (what or "self") .. " is a freed tensor", (level or 2) + 1)
   end
   argerror(fname, (what or "self") .. ": tensor expected, got " .. typename(x), (level or 2) + 1)
end
M.tc = tc

---------------------------------------------------------------------------------------------
-- argument helpers
---------------------------------------------------------------------------------------------

local function is_integer(x)
   return type(x) == "number" and x % 1 == 0 and x >= -MAX_SIZE and x <= MAX_SIZE
end
M.is_integer = is_integer

-- 1 when the Lua number is integral (for type promotion of a "wrapped number"), else 0
local function int_flag(x)
   if x % 1 == 0 and x > -9.2e18 and x < 9.2e18 then return 1 end
   return 0
end

local function to_number(x)
   if type(x) == "cdata" then
      local ok, n = pcall(tonumber, x)
      if ok then return n end
      return nil
   end
   return x
end

M.to_number = to_number

local function check_int(fname, x, what, level)
   x = to_number(x)
   if not is_integer(x) then
      argerror(fname, what .. " must be an integer, got " ..
               (type(x) == "number" and tostring(x) or typename(x)), (level or 2) + 1)
   end
   return x
end
M.check_int = check_int

local function check_number(fname, x, what, level)
   x = to_number(x)
   if type(x) ~= "number" then
      argerror(fname, what .. " must be a number, got " .. typename(x), (level or 2) + 1)
   end
   return x
end
M.check_number = check_number

local function check_bool(fname, x, what, level)
   if x == nil then return false end
   if type(x) ~= "boolean" then
      argerror(fname, what .. " must be a boolean, got " .. typename(x), (level or 2) + 1)
   end
   return x
end

-- 1-based Lua dim (negative from the end) -> 0-based; ndim 0 accepts 1 / -1 as in PyTorch
local function wrap_dim(fname, d, ndim, level)
   d = to_number(d)
   if not is_integer(d) then
      argerror(fname, "dim must be an integer, got " ..
               (type(d) == "number" and tostring(d) or typename(d)), (level or 2) + 1)
   end
   local n = ndim > 0 and ndim or 1
   if d >= 1 and d <= n then return d - 1 end
   if d <= -1 and d >= -n then return n + d end
   argerror(fname, ("dim %s out of range for a %d-dimensional tensor (expected %d..%d or -%d..-1)")
            :format(tostring(d), ndim, 1, n, n), (level or 2) + 1)
end
M.wrap_dim = wrap_dim

-- validate one size (1-based position i) and store it in buf
local function put_size(fname, buf, i, s, min_size, what)
   s = to_number(s)
   if not is_integer(s) then
      argerror(fname, ("%s[%d] must be an integer, got %s"):format(what, i,
               type(s) == "number" and tostring(s) or typename(s)))
   end
   if s < min_size then
      argerror(fname, ("%s[%d] must be %s, got %d"):format(what, i,
               min_size == 0 and "non-negative" or ">= -1", s))
   end
   buf[i - 1] = s
end

-- fill buf from an array of sizes; min_size is 0, or -1 where -1 is allowed
local function fill_sizes(fname, tbl, buf, min_size, what)
   what = what or "sizes"
   local n = #tbl
   if n == 0 and next(tbl) ~= nil then
      argerror(fname, what .. " must be an array of integers")
   end
   if n > MAX_DIMS then
      argerror(fname, ("tensors have at most %d dimensions, got %d"):format(MAX_DIMS, n))
   end
   for i = 1, n do put_size(fname, buf, i, tbl[i], min_size, what) end
   return n
end
M.fill_sizes = fill_sizes

-- sizes given as one array or as leading numbers: returns ndim (in buf) and the next argument
-- (normally the opts table). No table is allocated.
local function parse_sizes(fname, buf, min_size, level, a1, ...)
   local t1 = type(a1)
   if t1 == "table" and is_sizes(a1) then
      return fill_sizes(fname, a1, buf, min_size, "sizes"), (...)
   end
   if t1 == "number" or t1 == "cdata" then
      local n = select("#", ...)
      local k = 0                       -- numbers among the varargs after a1
      while k < n do
         local tx = type((select(k + 1, ...)))
         if tx ~= "number" and tx ~= "cdata" then break end
         k = k + 1
      end
      local rest
      if k < n then
         rest = select(k + 1, ...)
         if (rest ~= nil and (type(rest) ~= "table" or getmetatable(rest) ~= nil)) or k + 1 < n then
            argerror(fname, "sizes must be integers, got " .. typename(rest))
         end
      end
      if k + 1 > MAX_DIMS then
         argerror(fname, ("tensors have at most %d dimensions, got %d"):format(MAX_DIMS, k + 1))
      end
      put_size(fname, buf, 1, a1, min_size, "sizes")
      for i = 1, k do put_size(fname, buf, i + 1, (select(i, ...)), min_size, "sizes") end
      return k + 1, rest
   end
   if a1 == nil then argerror(fname, "sizes expected") end
   argerror(fname, "sizes must be a table or integers, got " .. typename(a1))
end
M.parse_sizes = parse_sizes

-- the options of the factories (lm.zeros, *_like, lm.tensor, ...)
local FACTORY_OPTS = util.option_set("dtype", "device", "memory_format", "requires_grad")
M.FACTORY_OPTS = FACTORY_OPTS

-- opts must be nil or a plain table whose keys are all in the set known (default: the
-- factories' options); an unknown key is an error, not ignored
local function check_opts(fname, opts, level, known)
   if opts ~= nil then
      if type(opts) ~= "table" or getmetatable(opts) ~= nil then
         argerror(fname, "options must be a table, got " .. typename(opts), (level or 2) + 1)
      end
      local k = unknown_option(opts, known or FACTORY_OPTS)
      if k ~= nil then argerror(fname, util.unknown_option_msg(k)) end
   end
   return opts
end
M.check_opts = check_opts

local function to_dtype(fname, x, level)
   local d, msg = dtypes.lookup(x)
   if not d then argerror(fname, msg, (level or 2) + 1) end
   return d
end
M.to_dtype = to_dtype

local function to_format(fname, x, level)
   local f, msg = dtypes.lookup_format(x)
   if not f then argerror(fname, msg, (level or 2) + 1) end
   return f
end
M.to_format = to_format

-- Device strings <-> ids (lumen.h's enum: LM_CPU, LM_CUDA0 + k, LM_META, LM_SIM0 + k): "cpu",
-- "cuda" / "cuda:N", "meta", "sim" / "sim:N" (the test device of kernels/sim/).
local DEV_CPU, DEV_META = tonumber(C.LM_CPU), tonumber(C.LM_META)
local DEV_CUDA0, NUM_CUDA = tonumber(C.LM_CUDA0), tonumber(C.LM_NUM_CUDA)
local DEV_SIM0, NUM_SIM = tonumber(C.LM_SIM0), tonumber(C.LM_NUM_SIM)
M.DEV_CPU, M.DEV_META, M.DEV_CUDA0, M.DEV_SIM0 = DEV_CPU, DEV_META, DEV_CUDA0, DEV_SIM0
M.NUM_CUDA, M.NUM_SIM = NUM_CUDA, NUM_SIM

-- the id of a device string, or nil
local function device_id(x)
   if type(x) ~= "string" then return nil end
   if x == "cpu" then return DEV_CPU end
   if x == "meta" then return DEV_META end
   if x == "cuda" then return DEV_CUDA0 end
   if x == "sim" then return DEV_SIM0 end
   local kind, k = x:match("^(%a+):(%d+)$")
   k = tonumber(k)
   if kind == "cuda" and k < NUM_CUDA then return DEV_CUDA0 + k end
   if kind == "sim" and k < NUM_SIM then return DEV_SIM0 + k end
   return nil
end
M.device_id = device_id

local function parse_device(fname, x, level)
   if x == nil then return nil end
   local id = device_id(x)
   if id then return id end
   argerror(fname, "unknown device " .. (type(x) == "string" and ("'" .. x .. "'") or typename(x)),
            (level or 2) + 1)
end
M.parse_device = parse_device

local function device_name(id)
   if id == DEV_CPU then return "cpu" end
   if id == DEV_META then return "meta" end
   if id >= DEV_SIM0 and id < DEV_SIM0 + NUM_SIM then return "sim:" .. (id - DEV_SIM0) end
   if id >= DEV_CUDA0 and id < DEV_CUDA0 + NUM_CUDA then return "cuda:" .. (id - DEV_CUDA0) end
   return "device " .. tostring(id)
end
M.device_name = device_name

-- The default device of the factories (PyTorch's torch.set_default_device): the id used when
-- opts.device is nil. LUMEN_DEFAULT_DEVICE sets it when lumen loads (lumen/init.lua).
local default_device = DEV_CPU
function M.set_default_device(fname, x, level)
   default_device = parse_device(fname, x == nil and "cpu" or x, (level or 2) + 1)
end
function M.default_device() return default_device end

-- opts.dtype (or default), opts.memory_format (or default), opts.device (or default)
local function opt_dtype(fname, opts, default, level)
   if opts and opts.dtype ~= nil then return to_dtype(fname, opts.dtype, (level or 2) + 1) end
   return default
end
M.opt_dtype = opt_dtype

local function opt_format(fname, opts, default, level)
   if opts and opts.memory_format ~= nil then
      return to_format(fname, opts.memory_format, (level or 2) + 1)
   end
   return default
end
M.opt_format = opt_format

-- default nil: the default device (lm.set_default_device)
local function opt_device(fname, opts, default, level)
   if opts and opts.device ~= nil then return parse_device(fname, opts.device, (level or 2) + 1) end
   if default == nil then return default_device end
   return default
end
M.opt_device = opt_device

-- apply opts.requires_grad to a fresh tensor
local function finish(t, opts)
   if opts and opts.requires_grad then
      local rg = Tensor.requires_grad_
      if rg then rg(t, true) else t.requires_grad = true end
   end
   return t
end
M.finish = finish

-- Whether the Lua number v can be stored in dtype id did, by PyTorch's checked_convert (what
-- fill_ / full / a Scalar argument go through): integer dtypes take no NaN, no infinity and
-- nothing outside their range (uint8 also takes integral -255..-1, which wrap as in PyTorch,
-- where a Python int may wrap but a float may not); with floats_too, float32 / float16 /
-- bfloat16 take infinities and NaN but no finite value beyond their largest one (float64 and
-- bool take anything). Without floats_too only the integer dtypes are checked (what
-- torch.tensor does: a float too large for float16 becomes inf there).
local FLOAT_MAX = { [0] = 3.4028234663852886e38, [2] = 65504, [3] = 3.3895313892515355e38 }
local function fits_dtype(v, did, floats_too)
   if did == 4 then return v >= -9223372036854775808 and v < 9223372036854775808 end
   if did == 5 then return v >= -2147483648 and v <= 2147483647 end
   if did == 6 then
      if v % 1 == 0 then return v >= -255 and v <= 255 end
      return v >= 0 and v <= 255
   end
   if floats_too then
      local max = FLOAT_MAX[did]
      if max ~= nil and v == v and v ~= math.huge and v ~= -math.huge then
         return v >= -max and v <= max
      end
   end
   return true
end
M.fits_dtype = fits_dtype

-- raise PyTorch's overflow error when v does not fit dtype id did (see fits_dtype)
local function check_fits(fname, v, did, floats_too)
   if not fits_dtype(v, did, floats_too) then
      argerror(fname, "value cannot be converted to type " .. dtype_by_id[did].name ..
               " without overflow")
   end
end
M.check_fits = check_fits

-- In-place writes that bypass the elementwise engine (batch norm's running statistics): a
-- target where two elements share one memory location (a dim of size > 1 and stride 0, e.g.
-- from expand) would receive every result in one slot, so it is rejected as PyTorch does
-- (assert_no_internal_overlap; layouts PyTorch finds "too hard" to decide pass, as there). The
-- elementwise ops, copy_ and the random fills make the same check in C (elementwise.c,
-- random.c); fill_ / zero_ write one value everywhere and accept it, as in PyTorch.
local OVERLAP_MSG = "unsupported operation: more than one element of the written-to tensor " ..
   "refers to a single memory location. Please clone() the tensor before performing the operation."
local function has_internal_overlap(c)
   local sizes, strides = c.sizes, c.strides
   for d = 0, c.ndim - 1 do
      if strides[d] == 0 and sizes[d] > 1 then return true end
   end
   return false
end
M.has_internal_overlap = has_internal_overlap

-- raise when the write target c overlaps itself; what names it when it is not self
local function check_no_overlap(fname, c, what)
   if has_internal_overlap(c) then
      argerror(fname, what and (what .. ": " .. OVERLAP_MSG) or OVERLAP_MSG)
   end
end
M.check_no_overlap = check_no_overlap

---------------------------------------------------------------------------------------------
-- inspection
---------------------------------------------------------------------------------------------

function Tensor.size(self, d)
   local c = tc(self, "size")
   local n = c.ndim
   if d ~= nil then
      return tonumber(c.sizes[wrap_dim("size", d, n)])
   end
   local r = {}
   for i = 0, n - 1 do r[i + 1] = tonumber(c.sizes[i]) end
   return setmetatable(r, SIZE_MT)
end

function Tensor.stride(self, d)
   local c = tc(self, "stride")
   local n = c.ndim
   if d ~= nil then
      return tonumber(c.strides[wrap_dim("stride", d, n)])
   end
   local r = {}
   for i = 0, n - 1 do r[i + 1] = tonumber(c.strides[i]) end
   return r
end

function Tensor.dim(self) return tc(self, "dim").ndim end
Tensor.ndimension = Tensor.dim
function Tensor.numel(self) return tonumber(tc(self, "numel").numel) end
Tensor.nelement = Tensor.numel
function Tensor.dtype(self) return dtype_by_id[tc(self, "dtype").dtype] end
function Tensor.device(self) return device_name(tc(self, "device").device) end
function Tensor.storage_offset(self) return tonumber(tc(self, "storage_offset").offset) end
function Tensor.is_floating_point(self)
   return C.lm_dtype_is_floating(tc(self, "is_floating_point").dtype) ~= 0
end

function Tensor.is_contiguous(self, fmt)
   local c = tc(self, "is_contiguous")
   local id = 0
   if fmt ~= nil then id = to_format("is_contiguous", fmt).id end
   return C.lm_is_contiguous(c, id) ~= 0
end

function Tensor.is_non_overlapping_and_dense(self)
   return C.lm_is_non_overlapping_and_dense(tc(self, "is_non_overlapping_and_dense")) ~= 0
end

function Tensor.suggest_memory_format(self, exact)
   local c = tc(self, "suggest_memory_format")
   exact = check_bool("suggest_memory_format", exact, "exact")
   return fmt_by_id[C.lm_suggest_memory_format(c, exact and 1 or 0)]
end

function Tensor.is_same_storage(self, other)
   return C.lm_tensor_same_storage(tc(self, "is_same_storage"),
                                   tc(other, "is_same_storage", "other")) ~= 0
end

-- values of a meta tensor: PyTorch raises too (there is no data to read)
local function check_has_data(c, fname, level)
   if c.device == DEV_META then argerror(fname, "meta tensors have no data", (level or 2) + 1) end
end
M.check_has_data = check_has_data

function Tensor.item(self)
   local c = tc(self, "item")
   check_has_data(c, "item")
   if c.numel ~= 1 then
      argerror("item", "a Tensor with " .. tonumber(c.numel) ..
               " elements cannot be converted to a scalar")
   end
   check(C.lm_to_doubles(c, dbl1), "item")
   if c.dtype == BOOL then return dbl1_hi[HI_WORD] ~= 0 end   -- 1.0 or 0.0 (high word 0)
   return read_double(dbl1, dbl1_hi, 0)
end

function Tensor.totable(self)
   local c = tc(self, "totable")
   check_has_data(c, "totable")
   local n = tonumber(c.numel)
   local nd = c.ndim
   local isbool = c.dtype == BOOL
   local buf = ffi.new("double[?]", n > 0 and n or 1)
   if n > 0 then check(C.lm_to_doubles(c, buf), "totable") end
   local hi32 = ffi.cast("uint32_t*", buf)
   if nd == 0 then
      if isbool then return hi32[HI_WORD] ~= 0 end
      return read_double(buf, hi32, 0)
   end
   local sizes = {}
   for i = 0, nd - 1 do sizes[i + 1] = tonumber(c.sizes[i]) end
   local pos = 0
   local function build(d)
      local r = {}
      local sz = sizes[d]
      if d == nd then
         for i = 1, sz do
            if isbool then r[i] = hi32[2 * pos + HI_WORD] ~= 0
            else r[i] = read_double(buf, hi32, pos) end
            pos = pos + 1
         end
      else
         for i = 1, sz do r[i] = build(d + 1) end
      end
      return r
   end
   return build(1)
end

-- Lua's __len is not honoured for tables under LuaJIT (5.1 semantics), so no #t.
mt.__tostring = function(t) return require("lumen.format").tostring(t) end
mt.__concat = function(a, b)
   return (is_tensor(a) and tostring(a) or a) .. (is_tensor(b) and tostring(b) or b)
end

---------------------------------------------------------------------------------------------
-- memory
---------------------------------------------------------------------------------------------

-- release the C tensor now instead of at the next collection; safe to call twice
function Tensor.free(self)
   if getmetatable(self) ~= mt then
      argerror("free", "self: tensor expected, got " .. typename(self))
   end
   if rawget(self, "_lz") ~= nil then   -- a pending result: drop the recipe, compute nothing
      drop_pending(self)
      return
   end
   local c = rawget(self, "_c")
   if c ~= nil then
      barrier(c)
      self._c = nil
      release(c)
   end
end

---------------------------------------------------------------------------------------------
-- views
---------------------------------------------------------------------------------------------

local function view_like(cfun, fname)
   return function(self, ...)
      local c = tc(self, fname)
      local n = parse_sizes(fname, sizebuf, -1, 2, ...)
      outp[0] = nil
      if cfun(c, n, sizebuf, outp) ~= 0 then raise(fname, 2) end
      return wrap(outp[0])
   end
end

Tensor.view = view_like(function(c, n, s, o) return C.lm_view(c, n, s, o) end, "view")
Tensor.reshape = view_like(function(c, n, s, o) return C.lm_reshape(c, n, s, o) end, "reshape")

function Tensor.view_as(self, other)
   return Tensor.view(self, Tensor.size(other))
end

function Tensor.reshape_as(self, other)
   return Tensor.reshape(self, Tensor.size(other))
end

function Tensor.permute(self, ...)
   local c = tc(self, "permute")
   local nd = c.ndim
   local dims = ...
   local n
   if type(dims) == "table" then n = #dims else dims = nil; n = select("#", ...) end
   if n ~= nd then
      argerror("permute", ("number of dims (%d) does not match the tensor's dimension (%d)")
               :format(n, nd))
   end
   local seen = 0
   for i = 1, nd do
      local d = wrap_dim("permute", dims and dims[i] or (select(i, ...)), nd)
      local b = bit.lshift(1, d)
      if bit.band(seen, b) ~= 0 then argerror("permute", "repeated dim " .. (d + 1)) end
      seen = bit.bor(seen, b)
      dimbuf[i - 1] = d
   end
   outp[0] = nil
   check(C.lm_permute(c, dimbuf, outp), "permute")
   return wrap(outp[0])
end

function Tensor.transpose(self, d0, d1)
   local c = tc(self, "transpose")
   local nd = c.ndim
   d0 = wrap_dim("transpose", d0, nd)
   d1 = wrap_dim("transpose", d1, nd)
   outp[0] = nil
   check(C.lm_transpose(c, d0, d1, outp), "transpose")
   return wrap(outp[0])
end

function Tensor.t(self)
   local c = tc(self, "t")
   if c.ndim > 2 then argerror("t", "expects a tensor with <= 2 dimensions, got " .. c.ndim) end
   if c.ndim < 2 then return Tensor.view(self, Tensor.size(self)) end
   return Tensor.transpose(self, 1, 2)
end

function Tensor.expand(self, ...)
   local c = tc(self, "expand")
   local n = parse_sizes("expand", sizebuf, -1, 2, ...)
   outp[0] = nil
   check(C.lm_expand(c, n, sizebuf, outp), "expand")
   return wrap(outp[0])
end

function Tensor.expand_as(self, other)
   return Tensor.expand(self, Tensor.size(other))
end

-- narrow(d, start, length): start is 1-based (negative counts from the end)
function Tensor.narrow(self, d, start, length)
   local c = tc(self, "narrow")
   if c.ndim == 0 then argerror("narrow", "cannot narrow a 0-dimensional tensor") end
   d = wrap_dim("narrow", d, c.ndim)
   start = check_int("narrow", start, "start")
   length = check_int("narrow", length, "length")
   local size = tonumber(c.sizes[d])
   local s0
   if start >= 1 then s0 = start - 1
   elseif start < 0 then s0 = size + start
   else argerror("narrow", "start is 1-based, got 0") end
   if s0 < 0 or length < 0 or s0 + length > size then
      argerror("narrow", ("start (%d) + length (%d) exceeds dimension size (%d)")
               :format(start, length, size))
   end
   outp[0] = nil
   check(C.lm_narrow(c, d, s0, length, outp), "narrow")
   return wrap(outp[0])
end

-- select(d, i): i is 1-based (negative counts from the end); removes dim d
function Tensor.select(self, d, i)
   local c = tc(self, "select")
   if c.ndim == 0 then argerror("select", "select cannot be applied to a 0-dim tensor") end
   d = wrap_dim("select", d, c.ndim)
   i = check_int("select", i, "index")
   local size = tonumber(c.sizes[d])
   local i0
   if i >= 1 then i0 = i - 1 elseif i < 0 then i0 = size + i else i0 = -1 end
   if i0 < 0 or i0 >= size then
      argerror("select", ("index %d out of range for dimension %d of size %d")
               :format(i, d + 1, size))
   end
   outp[0] = nil
   check(C.lm_select(c, d, i0, outp), "select")
   return wrap(outp[0])
end

function Tensor.unsqueeze(self, d)
   local c = tc(self, "unsqueeze")
   if c.ndim >= MAX_DIMS then argerror("unsqueeze", "tensors have at most 8 dimensions") end
   d = wrap_dim("unsqueeze", d, c.ndim + 1)
   outp[0] = nil
   check(C.lm_unsqueeze(c, d, outp), "unsqueeze")
   return wrap(outp[0])
end

function Tensor.squeeze(self, d)
   local c = tc(self, "squeeze")
   if d == nil then d = -1000 else d = wrap_dim("squeeze", d, c.ndim) end
   outp[0] = nil
   check(C.lm_squeeze(c, d, outp), "squeeze")
   return wrap(outp[0])
end

function Tensor.flatten(self, s, e)
   local c = tc(self, "flatten")
   local nd = c.ndim
   s = wrap_dim("flatten", s == nil and 1 or s, nd)
   e = wrap_dim("flatten", e == nil and -1 or e, nd)
   if s > e then
      argerror("flatten", "start_dim cannot come after end_dim")
   end
   outp[0] = nil
   check(C.lm_flatten(c, s, e, outp), "flatten")
   return wrap(outp[0])
end

-- as_strided(sizes, strides, offset): offset in elements (default: the tensor's own offset)
function Tensor.as_strided(self, sizes, strides, offset)
   local c = tc(self, "as_strided")
   if type(sizes) ~= "table" then argerror("as_strided", "sizes must be a table") end
   if type(strides) ~= "table" then argerror("as_strided", "strides must be a table") end
   local n = fill_sizes("as_strided", sizes, sizebuf, 0)
   local m = fill_sizes("as_strided", strides, stridebuf, 0, "strides")
   if n ~= m then
      argerror("as_strided", ("mismatch in length of sizes (%d) and strides (%d)"):format(n, m))
   end
   if offset == nil then offset = tonumber(c.offset)
   else
      offset = check_int("as_strided", offset, "offset")
      if offset < 0 then argerror("as_strided", "negative storage offset") end
   end
   outp[0] = nil
   check(C.lm_as_strided(c, n, sizebuf, stridebuf, offset, outp), "as_strided")
   return wrap(outp[0])
end

-- a new handle on the same data (same sizes and strides)
function Tensor.alias(self)
   local c = tc(self, "alias")
   outp[0] = nil
   check(C.lm_alias(c, outp), "alias")
   return wrap(outp[0])
end

---------------------------------------------------------------------------------------------
-- layout and type changes
---------------------------------------------------------------------------------------------

function Tensor.contiguous(self, fmt)
   local c = tc(self, "contiguous")
   local f = FMT.contiguous
   if fmt ~= nil then f = to_format("contiguous", fmt) end
   if f == FMT.preserve then
      argerror("contiguous", "preserve memory format is unsupported by the contiguous operator")
   end
   if C.lm_is_contiguous(c, f.id) ~= 0 then return self end
   outp[0] = nil
   check(C.lm_clone(c, f.id, -1, outp), "contiguous")
   return wrap(outp[0])
end

-- clone(opts) / clone(memory_format): memory_format defaults to preserve_format
local CLONE_OPTS = util.option_set("memory_format", "dtype", "requires_grad")
function Tensor.clone(self, opts)
   local c = tc(self, "clone")
   local f, d = FMT.preserve, -1
   if opts ~= nil then
      if dtypes.is_memory_format(opts) or type(opts) == "string" then
         f = to_format("clone", opts)
      else
         check_opts("clone", opts, nil, CLONE_OPTS)
         f = opt_format("clone", opts, FMT.preserve)
         local dt = opt_dtype("clone", opts, nil)
         if dt then d = dt.id end
      end
   end
   outp[0] = nil
   check(C.lm_clone(c, f.id, d, outp), "clone")
   return finish(wrap(outp[0]), opts ~= nil and type(opts) == "table" and opts or nil)
end

-- allocate an uninitialised tensor like c (dtype id, lm_memfmt id, device id)
local function alloc_like(fname, c, dtype_id, fmt_id, device, level)
   level = (level or 2) + 1
   outp[0] = nil
   local st
   if device == c.device then
      st = C.lm_empty_like(c, dtype_id, fmt_id, outp)
   elseif fmt_id ~= 3 then
      st = C.lm_empty(c.ndim, c.sizes, dtype_id, fmt_id, device, outp)
   elseif C.lm_is_non_overlapping_and_dense(c) ~= 0 then
      st = C.lm_empty_strided(c.ndim, c.sizes, c.strides, dtype_id, device, outp)
   else
      C.lm_infer_dense_strides(c.ndim, c.sizes, c.strides, stridebuf)
      st = C.lm_empty_strided(c.ndim, c.sizes, stridebuf, dtype_id, device, outp)
   end
   if st ~= 0 then raise(fname, level) end
   return wrap(outp[0])
end
M.alloc_like = alloc_like

-- t:to(x, ...): x is a dtype, a memory format, a device string or an opts table
-- ({dtype=, device=, memory_format=, copy=}); several may be given.
-- Returns self when nothing changes; a memory format counts as unchanged only when the tensor
-- is contiguous in it and already suggests it (so ambiguous NC11 / N1HW shapes get tagged with
-- channels-last strides, and the result is always is_contiguous(fmt)).
local TO_OPTS = util.option_set("dtype", "device", "memory_format", "copy")
function Tensor.to(self, ...)
   local c = tc(self, "to")
   local d, f, dev, copy
   local n = select("#", ...)
   if n == 0 then argerror("to", "expected a dtype, memory format, device or options table") end
   for i = 1, n do
      local x = select(i, ...)
      if dtypes.is_dtype(x) then d = x
      elseif dtypes.is_memory_format(x) then f = x
      elseif type(x) == "string" then
         if dtypes.is_name(x) then d = to_dtype("to", x)
         elseif dtypes.is_format_name(x) then f = to_format("to", x)
         else dev = parse_device("to", x) end
      elseif type(x) == "table" and getmetatable(x) == nil then
         check_opts("to", x, nil, TO_OPTS)
         if x.dtype ~= nil then d = to_dtype("to", x.dtype) end
         if x.memory_format ~= nil then f = to_format("to", x.memory_format) end
         if x.device ~= nil then dev = parse_device("to", x.device) end
         copy = check_bool("to", x.copy, "copy") or copy
      elseif is_tensor(x) then
         -- to(other): other's dtype and device
         local oc = tc(x, "to", "other")
         d = dtype_by_id[oc.dtype]
         dev = oc.device
      elseif x ~= nil then
         argerror("to", "expected a dtype, memory format, device or options table, got " ..
                  typename(x))
      end
   end
   local cur_d, cur_dev = c.dtype, c.device
   local did = d and d.id or cur_d
   local devid = dev or cur_dev
   f = f or FMT.preserve
   if not copy and did == cur_d and devid == cur_dev then
      if f == FMT.preserve then return self end
      if C.lm_is_contiguous(c, f.id) ~= 0 and C.lm_suggest_memory_format(c, 0) == f.id then
         return self
      end
   end
   if devid == cur_dev then
      outp[0] = nil
      check(C.lm_clone(c, f.id, did, outp), "to")
      return wrap(outp[0])
   end
   if cur_dev == DEV_META then
      -- PyTorch: "Cannot copy out of meta tensor"
      argerror("to", "cannot copy out of a meta tensor (it has no data); use " ..
               "lm.empty_like(t, {device = '" .. device_name(devid) .. "'}) for a tensor " ..
               "of its sizes there")
   end
   local r = alloc_like("to", c, did, f.id, devid)
   -- to meta: the sizes, strides and dtype only, nothing to copy
   if devid ~= DEV_META then check(C.lm_copy_(r._c, c), "to") end
   return r
end

function Tensor.type_as(self, other)
   return Tensor.to(self, dtype_by_id[tc(other, "type_as", "other").dtype])
end

-- Torch-style conversions: t:float(), t:double(), t:long(), ...
local short = { float = "float32", double = "float64", half = "float16", bfloat16 = "bfloat16",
                long = "int64", int = "int32", byte = "uint8", bool = "bool" }
for name, dname in pairs(short) do
   local d = dtypes[dname]
   Tensor[name] = function(self) return Tensor.to(self, d) end
end

-- Is device id usable in this build (its backend registered)? An empty tensor there tells.
local avail = {}
local function device_available(id)
   if avail[id] == nil then
      sizebuf[0] = 0
      outp[0] = nil
      local ok = C.lm_empty(1, sizebuf, 0, 0, id, outp) == 0
      if ok then Tensor.free(wrap(outp[0])) end
      avail[id] = ok
   end
   return avail[id]
end
M.device_available = device_available

function Tensor.cpu(self) return Tensor.to(self, "cpu") end
-- t:cuda(k): t:to("cuda:k") (k from 0, as CUDA numbers devices; "cuda" = cuda:0)
function Tensor.cuda(self, k)
   tc(self, "cuda")
   if k ~= nil and (type(k) ~= "number" or k % 1 ~= 0 or k < 0) then
      argerror("cuda", "device index must be a non-negative integer, got " ..
               (type(k) == "number" and tostring(k) or typename(k)))
   end
   local name = "cuda:" .. (k or 0)
   local id = device_id(name)
   if id == nil then argerror("cuda", "unknown device '" .. name .. "'") end
   if not device_available(id) then
      argerror("cuda", "device " .. name .. " is not available in this build (lumen was " ..
               "built without CUDA, or it has no such GPU)")
   end
   return Tensor.to(self, name)
end

---------------------------------------------------------------------------------------------
-- math
---------------------------------------------------------------------------------------------

local LM = {
   NEG = 0, ABS = 1, EXP = 2, LOG = 3, SQRT = 4, RSQRT = 5, RELU = 6, SIGMOID = 7, TANH = 8,
   SQUARE = 9, RECIPROCAL = 10, SIGN = 11, LOGICAL_NOT = 12, FLOOR = 13, CEIL = 14, ROUND = 15,
   SIN = 16, COS = 17, LOG1P = 18, EXPM1 = 19,
}
local B = {
   ADD = 0, SUB = 1, MUL = 2, DIV = 3, POW = 4, MAXIMUM = 5, MINIMUM = 6,
   EQ = 7, NE = 8, LT = 9, LE = 10, GT = 11, GE = 12, LOGICAL_AND = 13, LOGICAL_OR = 14,
   RELU_BACKWARD = 15, SIGMOID_BACKWARD = 16, TANH_BACKWARD = 17, FMOD = 18, ATAN2 = 19,
}
local R = { SUM = 0, MEAN = 1, MAX = 2, MIN = 3, ARGMAX = 4, ARGMIN = 5, PROD = 6 }
M.UNARY, M.BINARY, M.REDUCE = LM, B, R

-- a op b, with tensors or numbers on either side; out (cdata or nil) receives the result.
-- level: error level relative to the caller of binary.
local function binary(op, a, b, alpha, fname, out, level)
   if out ~= nil then barrier(out) end
   local st
   if getmetatable(a) == mt then
      local ac = rawget(a, "_c")
      if ac == nil then ac = tc(a, fname, "self", level + 1) end
      if getmetatable(b) == mt then
         local bc = rawget(b, "_c")
         if bc == nil then bc = tc(b, fname, "other", level + 1) end
         if out == nil and ac.numel >= LAZY_MIN_ELEMENTS then
            local x = defer(op, a, ac, b, bc, nil, nil, nil, alpha, fname)
            if x ~= nil then return x end
         end
         outp[0] = out
         st = C.lm_binary(op, ac, bc, alpha, outp)
      elseif type(b) == "number" then
         if out == nil and ac.numel >= LAZY_MIN_ELEMENTS then
            local x = defer(op, a, ac, nil, nil, b, int_flag(b), 0, alpha, fname)
            if x ~= nil then return x end
         end
         outp[0] = out
         st = C.lm_binary_scalar(op, ac, b, int_flag(b), 0, alpha, outp)
      elseif type(b) == "boolean" then
         outp[0] = out
         st = C.lm_binary_scalar(op, ac, b and 1 or 0, 1, 0, alpha, outp)
      else
         argerror(fname, "other: tensor or number expected, got " .. typename(b), level + 1)
      end
   elseif getmetatable(b) == mt and (type(a) == "number" or type(a) == "boolean") then
      if out ~= nil then argerror(fname, "self: tensor expected, got " .. type(a), level + 1) end
      local bc = rawget(b, "_c")
      if bc == nil then bc = tc(b, fname, "other", level + 1) end
      if type(a) == "boolean" then a = a and 1 or 0 end
      outp[0] = out
      st = C.lm_binary_scalar(op, bc, a, int_flag(a), 1, alpha, outp)
   else
      argerror(fname, ("expected tensors or numbers, got %s and %s"):format(typename(a),
               typename(b)), level + 1)
   end
   if st ~= 0 then raise(fname, level + 1) end
   if out ~= nil then return nil end
   return wrap(outp[0])
end
M.binary = binary

local function check_alpha(fname, alpha)
   if alpha == nil then return 1 end
   if type(alpha) ~= "number" then
      argerror(fname, "alpha must be a number, got " .. typename(alpha), 3)
   end
   return alpha
end

function Tensor.add(a, b, alpha)
   if alpha ~= nil then alpha = check_alpha("add", alpha) else alpha = 1 end
   return binary(0, a, b, alpha, "add", nil, 2)
end
function Tensor.sub(a, b, alpha)
   if alpha ~= nil then alpha = check_alpha("sub", alpha) else alpha = 1 end
   return binary(1, a, b, alpha, "sub", nil, 2)
end
function Tensor.mul(a, b) return binary(2, a, b, 1, "mul", nil, 2) end
function Tensor.div(a, b) return binary(3, a, b, 1, "div", nil, 2) end
function Tensor.pow(a, b) return binary(4, a, b, 1, "pow", nil, 2) end
function Tensor.maximum(a, b) return binary(5, a, b, 1, "maximum", nil, 2) end
function Tensor.minimum(a, b) return binary(6, a, b, 1, "minimum", nil, 2) end
function Tensor.eq(a, b) return binary(7, a, b, 1, "eq", nil, 2) end
function Tensor.ne(a, b) return binary(8, a, b, 1, "ne", nil, 2) end
function Tensor.lt(a, b) return binary(9, a, b, 1, "lt", nil, 2) end
function Tensor.le(a, b) return binary(10, a, b, 1, "le", nil, 2) end
function Tensor.gt(a, b) return binary(11, a, b, 1, "gt", nil, 2) end
function Tensor.ge(a, b) return binary(12, a, b, 1, "ge", nil, 2) end
function Tensor.logical_and(a, b) return binary(13, a, b, 1, "logical_and", nil, 2) end
function Tensor.logical_or(a, b) return binary(14, a, b, 1, "logical_or", nil, 2) end
function Tensor.fmod(a, b) return binary(18, a, b, 1, "fmod", nil, 2) end
function Tensor.atan2(a, b) return binary(19, a, b, 1, "atan2", nil, 2) end
-- backward helpers for autograd: grad * relu'(y), grad * y(1-y), grad * (1-y^2)
function Tensor.relu_backward(g, y) return binary(15, g, y, 1, "relu_backward", nil, 2) end
function Tensor.sigmoid_backward(g, y) return binary(16, g, y, 1, "sigmoid_backward", nil, 2) end
function Tensor.tanh_backward(g, y) return binary(17, g, y, 1, "tanh_backward", nil, 2) end

-- in-place binary forms: self is the out tensor
local function inplace_binary(op, fname)
   return function(self, b, alpha)
      local c = tc(self, fname)
      if alpha ~= nil then alpha = check_alpha(fname, alpha) else alpha = 1 end
      binary(op, self, b, alpha, fname, c, 2)
      return self
   end
end
Tensor.add_ = inplace_binary(0, "add_")
Tensor.sub_ = inplace_binary(1, "sub_")
Tensor.mul_ = inplace_binary(2, "mul_")
Tensor.div_ = inplace_binary(3, "div_")
Tensor.pow_ = inplace_binary(4, "pow_")

local function unary(op, fname)
   local fusable = FUSABLE_UNARY[op] == true
   return function(self)
      if fusable and type(self) == "table" and rawget(self, "_lz") ~= nil then
         local r = fused_unary(self, op)
         if r ~= nil then return r end
      end
      local c = tc(self, fname)
      outp[0] = nil
      if C.lm_unary(op, c, outp) ~= 0 then raise(fname, 2) end
      return wrap(outp[0])
   end
end
local function inplace_unary(op, fname)
   return function(self)
      local c = tc(self, fname)
      barrier(c)
      outp[0] = c
      if C.lm_unary(op, c, outp) ~= 0 then raise(fname, 2) end
      return self
   end
end
local unary_names = {
   { "neg", 0 }, { "abs", 1 }, { "exp", 2 }, { "log", 3 }, { "sqrt", 4 }, { "rsqrt", 5 },
   { "relu", 6 }, { "sigmoid", 7 }, { "tanh", 8 }, { "square", 9 }, { "reciprocal", 10 },
   { "sign", 11 }, { "logical_not", 12 }, { "floor", 13 }, { "ceil", 14 }, { "round", 15 },
   { "sin", 16 }, { "cos", 17 }, { "log1p", 18 }, { "expm1", 19 },
   -- more of PyTorch's math (the C library's functions), by their enum names
   { "trunc", C.LM_TRUNC }, { "log2", C.LM_LOG2 }, { "log10", C.LM_LOG10 },
   { "exp2", C.LM_EXP2 }, { "tan", C.LM_TAN }, { "asin", C.LM_ASIN }, { "acos", C.LM_ACOS },
   { "atan", C.LM_ATAN }, { "sinh", C.LM_SINH }, { "cosh", C.LM_COSH },
   { "asinh", C.LM_ASINH }, { "acosh", C.LM_ACOSH }, { "atanh", C.LM_ATANH },
   { "erf", C.LM_ERF }, { "erfc", C.LM_ERFC },
}
for _, u in ipairs(unary_names) do
   Tensor[u[1]] = unary(u[2], u[1])
   Tensor[u[1] .. "_"] = inplace_unary(u[2], u[1] .. "_")
end

local function clamp_args(fname, lo, hi)
   if lo ~= nil and type(lo) ~= "number" then
      argerror(fname, "min must be a number or nil, got " .. typename(lo), 3)
   end
   if hi ~= nil and type(hi) ~= "number" then
      argerror(fname, "max must be a number or nil, got " .. typename(hi), 3)
   end
   if lo == nil and hi == nil then
      argerror(fname, "at least one of min and max must not be nil", 3)
   end
end

-- a NaN bound makes every value NaN (PyTorch's clamp fills the result with NaN; its one-sided
-- kernels keep a only where a < max, a > min holds, never against NaN)
local function nan_bound(c, lo, hi)     -- c: the result
   return ((lo ~= nil and lo ~= lo) or (hi ~= nil and hi ~= hi))
      and (c.dtype == C.LM_FLOAT32 or c.dtype == C.LM_FLOAT64 or c.dtype == C.LM_FLOAT16
           or c.dtype == C.LM_BFLOAT16)
end

function Tensor.clamp(self, lo, hi)
   local c = tc(self, "clamp")
   clamp_args("clamp", lo, hi)
   outp[0] = nil
   check(C.lm_clamp(c, lo or 0, hi or 0, lo and 1 or 0, hi and 1 or 0, outp), "clamp")
   local out = wrap(outp[0])
   if nan_bound(outp[0], lo, hi) then Tensor.fill_(out, 0 / 0) end
   return out
end
Tensor.clip = Tensor.clamp

function Tensor.clamp_(self, lo, hi)
   local c = tc(self, "clamp_")
   clamp_args("clamp_", lo, hi)
   barrier(c)
   outp[0] = c
   check(C.lm_clamp(c, lo or 0, hi or 0, lo and 1 or 0, hi and 1 or 0, outp), "clamp_")
   if nan_bound(c, lo, hi) then Tensor.fill_(self, 0 / 0) end
   return self
end

local function addc(cfun, fname, inplace)
   return function(self, a, b, value)
      local c = tc(self, fname)
      local ac = tc(a, fname, "tensor1")
      local bc = tc(b, fname, "tensor2")
      if value == nil then value = 1
      elseif type(value) ~= "number" then
         argerror(fname, "value must be a number, got " .. typename(value))
      end
      if inplace then barrier(c) end
      outp[0] = inplace and c or nil
      if cfun(c, ac, bc, value, outp) ~= 0 then raise(fname, 2) end
      if inplace then return self end
      return wrap(outp[0])
   end
end
local function lm_addcmul(...) return C.lm_addcmul(...) end
local function lm_addcdiv(...) return C.lm_addcdiv(...) end
-- self + value * a * b
Tensor.addcmul = addc(lm_addcmul, "addcmul", false)
Tensor.addcmul_ = addc(lm_addcmul, "addcmul_", true)
-- self + value * a / b
Tensor.addcdiv = addc(lm_addcdiv, "addcdiv", false)
Tensor.addcdiv_ = addc(lm_addcdiv, "addcdiv_", true)

-- a number as a 0-dim tensor (int64 when integral, else float64: 0-dim tensors weigh less in
-- type promotion, so this behaves like a wrapped scalar), on device id dev (default cpu: the
-- tensor it meets is on dev, and the operators take all their tensors from one device)
local function scalar_tensor(fname, x, level, dev)
   local did
   if type(x) == "boolean" then did = 7; x = x and 1 or 0
   else did = (x % 1 == 0 and x > -9.2e18 and x < 9.2e18) and 4 or 1 end
   outp[0] = nil
   if C.lm_empty(0, sizebuf, did, 0, dev or DEV_CPU, outp) ~= 0 then
      raise(fname, (level or 2) + 1)
   end
   local t = wrap(outp[0])
   check(C.lm_fill_(t._c, x), fname, (level or 2) + 1)
   return t
end
M.scalar_tensor = scalar_tensor

-- where(cond, a, b): a and b may be tensors or numbers
function M.where(cond, a, b)
   local cc = tc(cond, "where", "condition")
   local dev = cc.device
   if type(a) == "number" or type(a) == "boolean" then a = scalar_tensor("where", a, nil, dev) end
   if type(b) == "number" or type(b) == "boolean" then b = scalar_tensor("where", b, nil, dev) end
   local ac = tc(a, "where", "input")
   local bc = tc(b, "where", "other")
   outp[0] = nil
   check(C.lm_where(cc, ac, bc, outp), "where")
   return wrap(outp[0])
end
function Tensor.where(self, cond, other) return M.where(cond, self, other) end

function Tensor.fill_(self, v)
   local c = tc(self, "fill_")
   if type(v) == "boolean" then v = v and 1 or 0
   elseif is_tensor(v) then v = Tensor.item(v)
      if type(v) == "boolean" then v = v and 1 or 0 end
   elseif type(v) ~= "number" then
      argerror("fill_", "value must be a number, got " .. typename(v))
   end
   check_fits("fill_", v, c.dtype, true)
   barrier(c)
   check(C.lm_fill_(c, v), "fill_")
   return self
end

function Tensor.zero_(self)
   local c = tc(self, "zero_")
   barrier(c)
   check(C.lm_fill_(c, 0), "zero_")
   return self
end

function Tensor.copy_(self, src)
   local c = tc(self, "copy_")
   local sc = tc(src, "copy_", "src")
   barrier(c)
   check(C.lm_copy_(c, sc), "copy_")
   return self
end

---------------------------------------------------------------------------------------------
-- reductions
---------------------------------------------------------------------------------------------

-- dims (nil, a number or an array of numbers) -> count in dimbuf (0 = all elements)
local function parse_dims(fname, dims, nd)
   if dims == nil then return 0 end
   if type(dims) == "table" and getmetatable(dims) == nil then
      local n = #dims
      if n > MAX_DIMS then argerror(fname, "too many dims") end
      local seen = 0
      for i = 1, n do
         local d = wrap_dim(fname, dims[i], nd)
         local b = bit.lshift(1, d)
         if bit.band(seen, b) ~= 0 then
            argerror(fname, "dim " .. (d + 1) .. " appears multiple times in the list of dims")
         end
         seen = bit.bor(seen, b)
         dimbuf[i - 1] = d
      end
      return n
   end
   dimbuf[0] = wrap_dim(fname, dims, nd)
   return 1
end

local function reduce(op, fname, self, dims, keepdim, dtype, level)
   level = (level or 2) + 1
   local c = tc(self, fname, "self", level)
   local n = parse_dims(fname, dims, c.ndim, level)
   keepdim = check_bool(fname, keepdim, "keepdim", level)
   local did = -1
   if dtype ~= nil then did = to_dtype(fname, dtype, level).id end
   outp[0] = nil
   if C.lm_reduce(op, c, dimbuf, n, keepdim and 1 or 0, did, outp, nil) ~= 0 then
      raise(fname, level)
   end
   return wrap(outp[0])
end

-- sum / mean / prod(dims, keepdim, dtype): dims nil (all elements), a number or an array
function Tensor.sum(self, dims, keepdim, dtype)
   return reduce(0, "sum", self, dims, keepdim, dtype, 2)
end
function Tensor.mean(self, dims, keepdim, dtype)
   return reduce(1, "mean", self, dims, keepdim, dtype, 2)
end
function Tensor.prod(self, dims, keepdim, dtype)
   return reduce(6, "prod", self, dims, keepdim, dtype, 2)
end
-- amax / amin: max / min values over one or several dims, no indices
function Tensor.amax(self, dims, keepdim) return reduce(2, "amax", self, dims, keepdim, nil, 2) end
function Tensor.amin(self, dims, keepdim) return reduce(3, "amin", self, dims, keepdim, nil, 2) end

-- add 1 in place to an int64 index tensor (C indices are 0-based; the Lua API is 1-based)
local function one_based(t, fname)
   local c = t._c
   outp[0] = c
   check(C.lm_binary_scalar(0, c, 1, 1, 0, 1, outp), fname, 3)
   return t
end

-- max(dim, keepdim) / min(dim, keepdim):
--   no dim: the largest element as a 0-dim tensor;
--   a dim: values and indices; indices are int64 and 1-BASED (Torch7 style, like every index in
--     the Lua API): t:max(2) on {{1, 5, 2}} returns {5}, {2}. PyTorch would return 0-based {1}.
--   a tensor: the elementwise maximum (same as t:maximum(other)).
local function maxmin(op, elementwise, fname)
   return function(self, dim, keepdim)
      if is_tensor(dim) then return binary(elementwise, self, dim, 1, fname, nil, 2) end
      local c = tc(self, fname)
      if dim == nil then
         if keepdim ~= nil then check_bool(fname, keepdim, "keepdim") end
         outp[0] = nil
         if C.lm_reduce(op, c, dimbuf, 0, 0, -1, outp, nil) ~= 0 then raise(fname, 2) end
         return wrap(outp[0])
      end
      if type(dim) == "table" then
         argerror(fname, "dim must be a single number (use amax / amin for several dims)")
      end
      dimbuf[0] = wrap_dim(fname, dim, c.ndim)
      keepdim = check_bool(fname, keepdim, "keepdim")
      outp[0] = nil
      idxp[0] = nil
      if C.lm_reduce(op, c, dimbuf, 1, keepdim and 1 or 0, -1, outp, idxp) ~= 0 then
         raise(fname, 2)
      end
      local values = wrap(outp[0])
      local indices = wrap(idxp[0])
      return values, one_based(indices, fname)
   end
end
Tensor.max = maxmin(2, 5, "max")
Tensor.min = maxmin(3, 6, "min")

-- argmax(dim, keepdim) / argmin: 1-BASED int64 indices (see max). Without a dim: the 1-based
-- position in the flattened (row-major) tensor, as a 0-dim tensor.
local function argmaxmin(op, fname)
   return function(self, dim, keepdim)
      local c = tc(self, fname)
      local n = 0
      if dim ~= nil then
         if type(dim) == "table" then argerror(fname, "dim must be a single number") end
         dimbuf[0] = wrap_dim(fname, dim, c.ndim)
         n = 1
      end
      keepdim = check_bool(fname, keepdim, "keepdim")
      outp[0] = nil
      if C.lm_reduce(op, c, dimbuf, n, keepdim and 1 or 0, -1, outp, nil) ~= 0 then
         raise(fname, 2)
      end
      return one_based(wrap(outp[0]), fname)
   end
end
Tensor.argmax = argmaxmin(4, "argmax")
Tensor.argmin = argmaxmin(5, "argmin")

function Tensor.all(self, dim, keepdim)
   tc(self, "all")
   local nz = Tensor.ne(self, 0)
   -- a 0-dim bool on self's device, reading no values (so it runs on every device)
   if dim == nil then return Tensor.eq(Tensor.sum(Tensor.logical_not(nz)), 0) end
   return Tensor.eq(reduce(3, "all", nz, dim, keepdim, nil, 2), 1)
end

function Tensor.any(self, dim, keepdim)
   tc(self, "any")
   local nz = Tensor.ne(self, 0)
   if dim == nil then return Tensor.ne(Tensor.sum(nz), 0) end
   return Tensor.eq(reduce(2, "any", nz, dim, keepdim, nil, 2), 1)
end

-- true when both tensors have the same sizes and equal elements
function Tensor.equal(self, other)
   local c = tc(self, "equal")
   local oc = tc(other, "equal", "other")
   if c.ndim ~= oc.ndim then return false end
   for i = 0, c.ndim - 1 do
      if c.sizes[i] ~= oc.sizes[i] then return false end
   end
   if c.numel == 0 then return true end
   return Tensor.sum(Tensor.ne(self, other)):item() == 0
end

-- |self - other| <= atol + rtol * |other| everywhere (broadcasting)
function Tensor.allclose(self, other, rtol, atol)
   tc(self, "allclose")
   tc(other, "allclose", "other")
   rtol = rtol == nil and 1e-5 or check_number("allclose", rtol, "rtol")
   atol = atol == nil and 1e-8 or check_number("allclose", atol, "atol")
   local a, b = Tensor.double(self), Tensor.double(other)
   local diff = Tensor.abs(Tensor.sub(a, b))
   local tol = Tensor.add(Tensor.mul(Tensor.abs(b), rtol), atol)
   if diff:numel() == 0 then return true end
   return Tensor.sum(Tensor.gt(diff, tol)):item() == 0 and
          Tensor.sum(Tensor.ne(Tensor.isnan(a), Tensor.isnan(b))):item() == 0
end

function Tensor.isnan(self)
   tc(self, "isnan")
   return Tensor.ne(self, self)
end

---------------------------------------------------------------------------------------------
-- linear algebra and joining
---------------------------------------------------------------------------------------------

function Tensor.matmul(self, other)
   local c = tc(self, "matmul")
   local oc = tc(other, "matmul", "other")
   outp[0] = nil
   check(C.lm_matmul(c, oc, outp), "matmul")
   return wrap(outp[0])
end
Tensor.mm = Tensor.matmul

-- cat(list, dim): dim defaults to 1
function M.cat(list, dim)
   if type(list) ~= "table" or getmetatable(list) ~= nil then
      argerror("cat", "expected an array of tensors, got " .. typename(list))
   end
   local n = #list
   if n == 0 then argerror("cat", "expected a non-empty array of tensors") end
   local arr = ffi.new("const lm_tensor*[?]", n)
   for i = 1, n do
      arr[i - 1] = tc(list[i], "cat", "tensors[" .. i .. "]")
   end
   local d = wrap_dim("cat", dim == nil and 1 or dim, arr[0].ndim)
   outp[0] = nil
   check(C.lm_cat(n, arr, d, outp), "cat")
   return wrap(outp[0])
end

-- stack(list, dim): unsqueeze each tensor at dim, then cat
function M.stack(list, dim)
   if type(list) ~= "table" or getmetatable(list) ~= nil then
      argerror("stack", "expected an array of tensors, got " .. typename(list))
   end
   local n = #list
   if n == 0 then argerror("stack", "expected a non-empty array of tensors") end
   local nd = tc(list[1], "stack", "tensors[1]").ndim
   local d = dim == nil and 1 or dim
   local d0 = wrap_dim("stack", d, nd + 1)
   local parts = {}
   for i = 1, n do
      local c = tc(list[i], "stack", "tensors[" .. i .. "]")
      if c.ndim ~= nd then argerror("stack", "all tensors must have the same number of dims") end
      for k = 0, nd - 1 do
         if c.sizes[k] ~= tc(list[1], "stack").sizes[k] then
            argerror("stack", "stack expects each tensor to be equal size")
         end
      end
      parts[i] = Tensor.unsqueeze(list[i], d0 + 1)
   end
   return M.cat(parts, d0 + 1)
end

---------------------------------------------------------------------------------------------
-- operators: dispatch through the method table at call time (autograd may replace methods)
---------------------------------------------------------------------------------------------

mt.__add = function(a, b) return Tensor.add(a, b) end
mt.__sub = function(a, b) return Tensor.sub(a, b) end
mt.__mul = function(a, b) return Tensor.mul(a, b) end
mt.__div = function(a, b) return Tensor.div(a, b) end
mt.__pow = function(a, b) return Tensor.pow(a, b) end
mt.__unm = function(a) return Tensor.neg(a) end
-- Lua's < and <= must return a boolean: point at the methods instead of comparing tables
mt.__lt = function() argerror("lt", "Lua's < cannot compare tensors elementwise; use a:lt(b)") end
mt.__le = function() argerror("le", "Lua's <= cannot compare tensors elementwise; use a:le(b)") end

---------------------------------------------------------------------------------------------
-- Torch7 indexing: t[i], t[i] = v, t[{i, {a, b}, {}, ":"}] (and = v)
---------------------------------------------------------------------------------------------

-- the view a key selects: a number is t:select(1, i) (1-based, negative from the end); a table
-- takes one entry per leading dim: a number selects (the dim goes), {a, b} is the inclusive
-- range a..b (negative from the end), {a} the range a..a, {} or ":" the whole dim. Returns the
-- view and whether every dim was selected by a number (a 0-dim result).
local function index_view(t, k, what)
   local c = tc(t, "index")
   local nd = c.ndim
   if type(k) == "number" then
      if nd == 0 then argerror("index", "cannot index a 0-dim tensor (use t:item())") end
      if k ~= k or k % 1 ~= 0 then
         argerror("index", "index must be an integer, got " .. tostring(k))
      end
      local size = tonumber(c.sizes[0])
      if k == 0 or k > size or k < -size then
         argerror("index", ("%s %d is out of range for dimension 1 of size %d (indices are " ..
                  "1-based; negative counts from the end)"):format(what, k, size))
      end
      return Tensor.select(t, 1, k), nd == 1
   end
   if getmetatable(k) ~= nil then
      argerror("index", "a tensor index (a mask or a list of indices) is not supported: index " ..
               "with numbers and ranges, or use lm.where(mask, t, 0); got " .. typename(k))
   end
   local n = #k
   if n > nd then
      argerror("index", ("%d indices for a tensor of %d dimension(s)"):format(n, nd))
   end
   local v, d, all_numbers = t, 1, n == nd
   for j = 1, n do
      local e = k[j]
      local size = Tensor.size(v, d)
      if type(e) == "number" then
         if e ~= e or e % 1 ~= 0 then
            argerror("index", ("entry %d must be an integer, got %s"):format(j, tostring(e)))
         end
         if e == 0 or e > size or e < -size then
            argerror("index", ("index %d (entry %d) is out of range for dimension %d of size %d")
                     :format(e, j, j, size))
         end
         v = Tensor.select(v, d, e)
      elseif e == ":" or (type(e) == "table" and getmetatable(e) == nil and #e <= 2) then
         all_numbers = false
         local a, b = 1, size
         if type(e) == "table" and #e >= 1 then a = e[1]; b = e[2] or e[1] end
         if type(a) ~= "number" or type(b) ~= "number" or a % 1 ~= 0 or b % 1 ~= 0 then
            argerror("index", ("entry %d: a range is {a, b} of integers, got {%s, %s}")
                     :format(j, tostring(a), tostring(b)))
         end
         local a0 = a < 0 and size + a + 1 or a
         local b0 = b < 0 and size + b + 1 or b
         if a0 < 1 or b0 > size or a0 > b0 then
            argerror("index", ("range {%d, %d} (entry %d) is out of range for dimension %d of " ..
                     "size %d"):format(a, b, j, j, size))
         end
         if a0 ~= 1 or b0 ~= size then v = Tensor.narrow(v, d, a0, b0 - a0 + 1) end
         d = d + 1
      else
         argerror("index", ("entry %d must be a number, a range {a, b}, {} or \":\", got %s")
                  :format(j, typename(e)))
      end
   end
   return v, all_numbers
end

index_get = function(t, k)
   local v, scalar = index_view(t, k, "index")
   if scalar then return Tensor.item(v) end
   return v
end

index_set = function(t, k, value)
   local v = index_view(t, k, "index")
   if type(value) == "number" or type(value) == "boolean" then
      Tensor.fill_(v, value)
   elseif is_tensor(value) then
      local vs, ts = Tensor.size(v), Tensor.size(value)
      local same = #vs == #ts
      if same then for i = 1, #vs do same = same and vs[i] == ts[i] end end
      if not same then
         local ok, e = pcall(Tensor.expand, value, vs)
         if not ok then
            argerror("index", ("cannot assign a tensor of size (%s) to a slice of size (%s)")
                     :format(table.concat(ts, ", "), table.concat(vs, ", ")))
         end
         value = e
      end
      Tensor.copy_(v, value)
   else
      argerror("index", "the value assigned must be a number or a tensor, got " ..
               typename(value))
   end
end

-- pending tensors get their metatable now that mt has all its metamethods (lumen.deferred)
deferred.seal(Tensor, unary_names)

-- keep the original forward functions for autograd wrappers
for k, v in pairs(Tensor) do M.raw[k] = v end
M.raw.where, M.raw.cat, M.raw.stack = M.where, M.cat, M.stack

return M
