-- lumen.creation -- tensor factories: empty, zeros, ones, full, rand, randn, randint, arange,
-- linspace, eye, tensor, empty_strided, randperm, the *_like family and the RNG seed.
--
-- Sizes may be given as one array ({2, 3}) or as leading numbers (lm.zeros(2, 3)); options are a
-- trailing table {dtype=, device=, memory_format=, requires_grad=}.

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")

local type, tostring, select = type, tostring, select
local floor, ceil = math.floor, math.ceil

local Tensor, wrap, raise, check, argerror = T.Tensor, T.wrap, T.raise, T.check, T.argerror
local tc, typename, parse_sizes, fill_sizes = T.tc, T.typename, T.parse_sizes, T.fill_sizes
local check_opts, opt_dtype, opt_format, opt_device = T.check_opts, T.opt_dtype, T.opt_format,
   T.opt_device
local finish, is_tensor, check_int, check_number = T.finish, T.is_tensor, T.check_int,
   T.check_number
local check_fits = T.check_fits
-- a plain array, or a Size (t:size(), t.shape): sizes and nested data tables accept both
local is_sizes = T.is_sizes

local M = {}

local outp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")
local stridebuf = ffi.new("int64_t[8]")

local FLOAT32, INT64, BOOL = dtypes.float32, dtypes.int64, dtypes.bool

-- A meta tensor has no data: the factories give it its sizes, strides and dtype, and write
-- nothing (PyTorch's meta factories neither fill nor draw random numbers: the seed's stream is
-- left as it was). The value checks (a fill value the dtype cannot hold, ...) still run.
local DEV_META = T.DEV_META
local function is_meta(t) return t._c.device == DEV_META end
local CONTIG, PRESERVE = dtypes.contiguous_format, dtypes.preserve_format

-- lm_empty from the sizes in sizebuf and opts; level relative to the caller
local function empty_from(fname, nd, opts, default_dtype, level)
   level = (level or 2) + 1
   check_opts(fname, opts, level)
   local d = opt_dtype(fname, opts, default_dtype or FLOAT32, level)
   local f = opt_format(fname, opts, CONTIG, level)
   if f == PRESERVE then
      argerror(fname, "preserve_format is only valid for *_like and clone", level)
   end
   local dev = opt_device(fname, opts, nil, level)
   outp[0] = nil
   if C.lm_empty(nd, sizebuf, d.id, f.id, dev, outp) ~= 0 then raise(fname, level) end
   return wrap(outp[0])
end

-- floats_too: check v against float32/16/bfloat16 too (fill_'s rule; lm.tensor checks only the
-- integer dtypes, as torch.tensor does)
local function fill(t, v, fname, level, floats_too)
   T.check_fits(fname, v, t._c.dtype, floats_too ~= false)
   if is_meta(t) then return t end
   if C.lm_fill_(t._c, v) ~= 0 then raise(fname, (level or 2) + 1) end
   return t
end

local function require_float(fname, t, level)
   if C.lm_dtype_is_floating(t._c.dtype) == 0 then
      argerror(fname, "expected a floating point dtype, got " .. tostring(Tensor.dtype(t)),
               (level or 2) + 1)
   end
end

function M.empty(...)
   local nd, opts = parse_sizes("empty", sizebuf, 0, 2, ...)
   return finish(empty_from("empty", nd, opts), opts)
end

function M.zeros(...)
   local nd, opts = parse_sizes("zeros", sizebuf, 0, 2, ...)
   return finish(fill(empty_from("zeros", nd, opts), 0, "zeros"), opts)
end

function M.ones(...)
   local nd, opts = parse_sizes("ones", sizebuf, 0, 2, ...)
   return finish(fill(empty_from("ones", nd, opts), 1, "ones"), opts)
end

local function fill_value(fname, v, level)
   if type(v) == "boolean" then return v and 1 or 0, BOOL end
   if type(v) ~= "number" then
      argerror(fname, "fill value must be a number or boolean, got " .. typename(v),
               (level or 2) + 1)
   end
   return v, FLOAT32
end

-- full(sizes, value, opts): dtype bool for a boolean value, else float32 unless opts.dtype
function M.full(sizes, value, opts)
   if not is_sizes(sizes) then
      argerror("full", "sizes must be a table, got " .. typename(sizes))
   end
   local nd = fill_sizes("full", sizes, sizebuf, 0)
   local v, d = fill_value("full", value)
   return finish(fill(empty_from("full", nd, opts, d), v, "full"), opts)
end

function M.rand(...)
   local nd, opts = parse_sizes("rand", sizebuf, 0, 2, ...)
   local t = empty_from("rand", nd, opts)
   require_float("rand", t)
   if not is_meta(t) then check(C.lm_uniform_(t._c, 0, 1), "rand") end
   return finish(t, opts)
end

function M.randn(...)
   local nd, opts = parse_sizes("randn", sizebuf, 0, 2, ...)
   local t = empty_from("randn", nd, opts)
   require_float("randn", t)
   if not is_meta(t) then check(C.lm_normal_(t._c, 0, 1), "randn") end
   return finish(t, opts)
end

local function randint_bounds(fname, low, high, level)
   level = (level or 2) + 1
   low = check_int(fname, low, "low", level)
   high = check_int(fname, high, "high", level)
   if high <= low then
      argerror(fname, ("random_ expects 'from' (%d) to be less than 'to' (%d)"):format(low, high),
               level)
   end
   return low, high
end

-- randint(low, high, sizes, opts) or randint(high, sizes, opts): int64 in [low, high)
function M.randint(a, b, c, d)
   local low, high, sizes, opts
   if type(b) == "table" then low, high, sizes, opts = 0, a, b, c
   else low, high, sizes, opts = a, b, c, d end
   low, high = randint_bounds("randint", low, high)
   if not is_sizes(sizes) then
      argerror("randint", "sizes must be a table, got " .. typename(sizes))
   end
   local nd = fill_sizes("randint", sizes, sizebuf, 0)
   local t = empty_from("randint", nd, opts, INT64)
   if not is_meta(t) then check(C.lm_randint_(t._c, low, high), "randint") end
   return finish(t, opts)
end

local direct_ct = {
   [0] = "float*", [1] = "double*", [4] = "int64_t*", [5] = "int32_t*", [6] = "uint8_t*",
   [7] = "uint8_t*",
}

-- fill a fresh contiguous tensor with gen(i) for i = 0 .. n-1
local function fill_gen(t, n, gen, fname, level)
   if n == 0 then return t end
   local c = t._c
   if c.device == DEV_META then
      if c.dtype >= C.LM_INT64 and c.dtype <= C.LM_UINT8 then
         for i = 0, n - 1 do check_fits(fname, gen(i), c.dtype, false) end
      end
      return t
   end
   local ct = direct_ct[c.dtype]
   if ct and c.device == C.LM_CPU and C.lm_is_contiguous(c, C.LM_CONTIGUOUS) ~= 0 then
      local p = ffi.cast(ct, C.lm_tensor_data(c))
      if c.dtype >= C.LM_INT64 and c.dtype <= C.LM_UINT8 then
         for i = 0, n - 1 do
            local v = gen(i)
            check_fits(fname, v, c.dtype, false)
            p[i] = v
         end
      elseif c.dtype == C.LM_BOOL then
         for i = 0, n - 1 do p[i] = gen(i) ~= 0 and 1 or 0 end
      else
         for i = 0, n - 1 do p[i] = gen(i) end
      end
   else
      local buf = ffi.new("double[?]", n)
      local int = c.dtype >= 4 and c.dtype <= 6
      for i = 0, n - 1 do
         local v = gen(i)
         if int then check_fits(fname, v, c.dtype, false) end
         buf[i] = v
      end
      check(C.lm_from_doubles(c, buf), fname, (level or 2) + 1)
   end
   return t
end

-- arange(stop) / arange(start, stop) / arange(start, stop, step), optional opts last.
-- int64 when every argument is an integer, else float32 (as PyTorch).
function M.arange(...)
   local nums, opts = {}, nil
   local n = select("#", ...)
   for i = 1, n do
      local x = select(i, ...)
      if type(x) == "number" then
         if opts ~= nil then argerror("arange", "options must come last") end
         nums[#nums + 1] = x
      elseif type(x) == "table" and i == n then
         opts = x
      elseif x ~= nil or i < n then
         argerror("arange", "arguments must be numbers, got " .. typename(x))
      end
   end
   local start, stop, step
   if #nums == 1 then start, stop, step = 0, nums[1], 1
   elseif #nums == 2 then start, stop, step = nums[1], nums[2], 1
   elseif #nums == 3 then start, stop, step = nums[1], nums[2], nums[3]
   else argerror("arange", "expected 1 to 3 numbers (stop, or start, stop[, step])") end
   for _, v in ipairs({ start, stop, step }) do
      if v ~= v or v == math.huge or v == -math.huge then
         argerror("arange", "unsupported range: " .. start .. " -> " .. stop)
      end
   end
   if step == 0 then argerror("arange", "step must be nonzero") end
   if (step > 0 and stop < start) or (step < 0 and stop > start) then
      argerror("arange", "upper bound and larger bound inconsistent with step sign")
   end
   local all_int = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
   local count = ceil((stop - start) / step)
   if count > 2 ^ 50 then argerror("arange", "tensor too large") end
   sizebuf[0] = count
   local t = empty_from("arange", 1, opts, all_int and INT64 or FLOAT32)
   fill_gen(t, count, function(i) return start + i * step end, "arange")
   return finish(t, opts)
end

-- linspace(start, stop, steps, opts): float32 unless opts.dtype
function M.linspace(start, stop, steps, opts)
   start = check_number("linspace", start, "start")
   stop = check_number("linspace", stop, "end")
   steps = check_int("linspace", steps, "steps")
   if steps < 0 then argerror("linspace", "number of steps must be non-negative") end
   sizebuf[0] = steps
   local t = empty_from("linspace", 1, opts)
   local step = steps > 1 and (stop - start) / (steps - 1) or 0
   -- PyTorch's halves: the first from start, the second back from stop (so both ends are
   -- exact); one step is start (torch.linspace(-1, 1, 1) is -1), which the halves would make stop
   local half = steps == 1 and 1 or floor(steps / 2)
   fill_gen(t, steps, function(i)
      if i < half then return start + step * i end
      return stop - step * (steps - 1 - i)
   end, "linspace")
   return finish(t, opts)
end

-- eye(n, m, opts): ones on the diagonal
function M.eye(n, m, opts)
   if type(m) == "table" then m, opts = nil, m end
   n = check_int("eye", n, "n")
   m = m == nil and n or check_int("eye", m, "m")
   if n < 0 or m < 0 then argerror("eye", "sizes must be non-negative") end
   sizebuf[0], sizebuf[1] = n, m
   local t = empty_from("eye", 2, opts)
   fill_gen(t, n * m, function(i) return (i % m == floor(i / m)) and 1 or 0 end, "eye")
   return finish(t, opts)
end

-- an integral number that int64 holds: what PyTorch would get as a Python int
local function is_int64(v)
   return v % 1 == 0 and v >= -9223372036854775808 and v < 9223372036854775808
end

-- the dtype torch.tensor infers: bool when every element is a boolean, else int64 when every
-- number is integral (booleans count as 0 / 1), else float32 (the default float dtype); an empty
-- table is float32. Lua has one number type, so 2.0 counts as the integer 2: write
-- lm.tensor({1, 2}, {dtype = lm.float32}) (or any non-integral element) for a float tensor.
local function infer_dtype(seen_num, seen_bool, seen_float)
   if seen_float then return FLOAT32 end
   if seen_num then return INT64 end
   if seen_bool then return BOOL end
   return FLOAT32
end

-- tensor(data, opts): data is a number, a boolean, a (nested) table of them, or a tensor (copied).
-- The dtype unless opts.dtype: see infer_dtype (as PyTorch); ragged tables are an error.
function M.tensor(data, opts)
   check_opts("tensor", opts)
   if is_tensor(data) then
      local c = tc(data, "tensor", "data")
      local d = opt_dtype("tensor", opts, nil)
      local r = T.alloc_like("tensor", c, d and d.id or c.dtype, PRESERVE.id,
                             opt_device("tensor", opts, c.device))
      if not is_meta(r) then check(C.lm_copy_(r._c, c), "tensor") end
      return finish(r, opts)
   end
   local tp = type(data)
   if tp == "number" or tp == "boolean" then
      local d = opt_dtype("tensor", opts, infer_dtype(tp == "number", tp == "boolean",
                                                      tp == "number" and not is_int64(data)))
      local t = empty_from("tensor", 0, opts, d)
      fill(t, tp == "boolean" and (data and 1 or 0) or data, "tensor", nil, false)
      return finish(t, opts)
   end
   if not is_sizes(data) then
      argerror("tensor", "expected a number, boolean, table or tensor, got " .. typename(data))
   end
   -- infer the shape from the first element at every depth
   local shape = {}
   local x = data
   while is_sizes(x) do
      local n = #x
      if n == 0 and next(x) ~= nil then
         argerror("tensor", "tables must be arrays (found a non-integer key)")
      end
      shape[#shape + 1] = n
      if #shape > 8 then argerror("tensor", "tensors have at most 8 dimensions") end
      if n == 0 then break end
      x = x[1]
   end
   local nd = #shape
   local total = 1
   for i = 1, nd do total = total * shape[i] end
   local buf = ffi.new("double[?]", total > 0 and total or 1)
   local pos = 0
   local seen_num, seen_bool, seen_float = false, false, false
   local at = {}                       -- indices of the table being walked (for messages)
   local function path(d)
      local p = "data"
      for k = 1, d - 1 do p = p .. "[" .. at[k] .. "]" end
      return p
   end
   local function walk(t, d)
      local n = shape[d]
      if #t ~= n then
         argerror("tensor", ("ragged nested table: expected %d elements at %s, got %d")
                  :format(n, path(d), #t))
      end
      if d == nd then
         for i = 1, n do
            local v = t[i]
            local tv = type(v)
            if tv == "number" then
               seen_num = true
               if not seen_float and not is_int64(v) then seen_float = true end
               buf[pos] = v
            elseif tv == "boolean" then
               seen_bool = true
               buf[pos] = v and 1 or 0
            elseif is_sizes(v) then
               argerror("tensor", ("ragged nested table: expected a number at %s[%d], got a table")
                        :format(path(d), i))
            else
               argerror("tensor", ("expected a number or boolean at %s[%d], got %s")
                        :format(path(d), i, typename(v)))
            end
            pos = pos + 1
         end
      else
         for i = 1, n do
            local v = t[i]
            if not is_sizes(v) then
               argerror("tensor", ("ragged nested table: expected a table at %s[%d], got %s")
                        :format(path(d), i, typename(v)))
            end
            at[d] = i
            walk(v, d + 1)
         end
      end
   end
   walk(data, 1)
   local default = infer_dtype(seen_num, seen_bool, seen_float)
   for i = 1, nd do sizebuf[i - 1] = shape[i] end
   local t = empty_from("tensor", nd, opts, default)
   local did = t._c.dtype
   if did >= 4 and did <= 6 then
      for i = 0, total - 1 do check_fits("tensor", buf[i], did, false) end
   end
   if total > 0 and not is_meta(t) then check(C.lm_from_doubles(t._c, buf), "tensor") end
   return finish(t, opts)
end

function M.empty_strided(sizes, strides, opts)
   if not is_sizes(sizes) then
      argerror("empty_strided", "sizes must be a table, got " .. typename(sizes))
   end
   if not is_sizes(strides) then
      argerror("empty_strided", "strides must be a table, got " .. typename(strides))
   end
   local n = fill_sizes("empty_strided", sizes, sizebuf, 0)
   local m = fill_sizes("empty_strided", strides, stridebuf, 0, "strides")
   if n ~= m then
      argerror("empty_strided", ("mismatch in length of sizes (%d) and strides (%d)"):format(n, m))
   end
   check_opts("empty_strided", opts)      -- memory_format: the explicit message below
   local d = opt_dtype("empty_strided", opts, FLOAT32)
   local dev = opt_device("empty_strided", opts, nil)
   if opts and opts.memory_format ~= nil then
      argerror("empty_strided", "memory_format cannot be given with explicit strides")
   end
   outp[0] = nil
   check(C.lm_empty_strided(n, sizebuf, stridebuf, d.id, dev, outp), "empty_strided")
   return finish(wrap(outp[0]), opts)
end

local RANDPERM_OPTS = require("lumen.util").option_set("dtype", "device", "requires_grad")

-- randperm(n, opts): a random permutation of 1..n (1-based, Torch7 style), int64
function M.randperm(n, opts)
   n = check_int("randperm", n, "n")
   if n < 0 then argerror("randperm", "n must be non-negative, got " .. n) end
   check_opts("randperm", opts, nil, RANDPERM_OPTS)
   outp[0] = nil
   check(C.lm_randperm(n, outp), "randperm")
   local t = wrap(outp[0])
   if n > 0 then
      outp[0] = t._c
      check(C.lm_binary_scalar(0, t._c, 1, 1, 0, 1, outp), "randperm")
   end
   local d = opt_dtype("randperm", opts, nil)
   if d and d ~= INT64 then t = Tensor.to(t, d) end
   -- made on the CPU (lm_randperm), then moved to opts.device or the default device
   local dev = opt_device("randperm", opts, nil)
   if dev ~= T.DEV_CPU then t = Tensor.to(t, T.device_name(dev)) end
   return finish(t, opts)
end

---------------------------------------------------------------------------------------------
-- *_like: opts.memory_format defaults to preserve_format (spec section 5)
---------------------------------------------------------------------------------------------

local function like(fname, t, opts, level)
   level = (level or 2) + 1
   local c = tc(t, fname, "input", level)
   check_opts(fname, opts, level)
   local d = opt_dtype(fname, opts, nil, level)
   local f = opt_format(fname, opts, PRESERVE, level)
   local dev = opt_device(fname, opts, c.device, level)
   return T.alloc_like(fname, c, d and d.id or c.dtype, f.id, dev, level)
end

function M.empty_like(t, opts)
   return finish(like("empty_like", t, opts), opts)
end

function M.zeros_like(t, opts)
   return finish(fill(like("zeros_like", t, opts), 0, "zeros_like"), opts)
end

function M.ones_like(t, opts)
   return finish(fill(like("ones_like", t, opts), 1, "ones_like"), opts)
end

function M.full_like(t, value, opts)
   tc(t, "full_like", "input")
   local v = fill_value("full_like", value)
   return finish(fill(like("full_like", t, opts), v, "full_like"), opts)
end

function M.rand_like(t, opts)
   local r = like("rand_like", t, opts)
   require_float("rand_like", r)
   if not is_meta(r) then check(C.lm_uniform_(r._c, 0, 1), "rand_like") end
   return finish(r, opts)
end

function M.randn_like(t, opts)
   local r = like("randn_like", t, opts)
   require_float("randn_like", r)
   if not is_meta(r) then check(C.lm_normal_(r._c, 0, 1), "randn_like") end
   return finish(r, opts)
end

-- randint_like(t, low, high, opts) or randint_like(t, high, opts)
function M.randint_like(t, a, b, c)
   local low, high, opts
   if type(b) == "number" then low, high, opts = a, b, c else low, high, opts = 0, a, b end
   low, high = randint_bounds("randint_like", low, high)
   local r = like("randint_like", t, opts)
   if not is_meta(r) then check(C.lm_randint_(r._c, low, high), "randint_like") end
   return finish(r, opts)
end

---------------------------------------------------------------------------------------------
-- random seed
---------------------------------------------------------------------------------------------

function M.manual_seed(n)
   n = T.to_number(n) or n
   if type(n) ~= "number" or n % 1 ~= 0 or n < 0 or n >= 2 ^ 64 then
      argerror("manual_seed", "seed must be a non-negative integer, got " ..
               (type(n) == "number" and tostring(n) or typename(n)))
   end
   C.lm_manual_seed(n)
end

function M.initial_seed()
   return tonumber(C.lm_initial_seed())
end

return M
