-- spec/helpers.lua -- shared assertions for lumen's busted specs.
--
--    local H = require("spec.helpers")
--    local lm = H.lm
--
-- Everything is written against docs/api.md (the API reference): 1-based dims, sizes and
-- strides as Lua arrays in logical (N, C, H, W) order, formats compared through tostring()
-- (the API fixes tostring(lm.channels_last) == "channels_last").

local lm = require("lumen")

local H = { lm = lm }

local function fmt_list(t)
   if type(t) ~= "table" then return tostring(t) end
   local parts = {}
   for i = 1, #t do parts[i] = tostring(t[i]) end
   return "(" .. table.concat(parts, ",") .. ")"
end
H.fmt_list = fmt_list

-- "(2,3,4,5)@(60,1,15,3)"
function H.describe(t)
   return fmt_list(t:size()) .. "@" .. fmt_list(t:stride())
end

local function list_equal(a, b)
   if #a ~= #b then return false end
   for i = 1, #a do
      if a[i] ~= b[i] then return false end
   end
   return true
end
H.list_equal = list_equal

function H.assert_sizes(t, sizes, what)
   local got = t:size()
   assert(list_equal(got, sizes), string.format("%ssizes: expected %s, got %s",
      what and (what .. ": ") or "", fmt_list(sizes), fmt_list(got)))
end

function H.assert_strides(t, strides, what)
   local got = t:stride()
   assert(list_equal(got, strides), string.format("%sstrides: expected %s, got %s (sizes %s)",
      what and (what .. ": ") or "", fmt_list(strides), fmt_list(got), fmt_list(t:size())))
end

-- sizes and strides at once
function H.assert_layout(t, sizes, strides, what)
   H.assert_sizes(t, sizes, what)
   H.assert_strides(t, strides, what)
end

-- a memory format (or dtype) compared by name
function H.name(x) return tostring(x) end

function H.assert_format_name(got, expected, what)
   assert(tostring(got) == tostring(expected), string.format("%sexpected %s, got %s",
      what and (what .. ": ") or "", tostring(expected), tostring(got)))
end

function H.assert_dtype(t, dtype, what)
   H.assert_format_name(t:dtype(), dtype, (what and (what .. ": ") or "") .. "dtype")
end

-- Checks the predicates of spec section 2.6 for one tensor.
-- exp = { c=bool, clc=bool, cl3dc=bool (optional), nod=bool, suggest=format }
function H.assert_predicates(t, exp, what)
   local d = (what or H.describe(t)) .. ": "
   if exp.c ~= nil then
      assert(t:is_contiguous() == exp.c, d .. "is_contiguous() should be " .. tostring(exp.c))
      assert(t:is_contiguous(lm.contiguous_format) == exp.c,
         d .. "is_contiguous(contiguous_format) should be " .. tostring(exp.c))
   end
   if exp.clc ~= nil then
      assert(t:is_contiguous(lm.channels_last) == exp.clc,
         d .. "is_contiguous(channels_last) should be " .. tostring(exp.clc))
   end
   if exp.cl3dc ~= nil then
      assert(t:is_contiguous(lm.channels_last_3d) == exp.cl3dc,
         d .. "is_contiguous(channels_last_3d) should be " .. tostring(exp.cl3dc))
   end
   if exp.nod ~= nil then
      assert(t:is_non_overlapping_and_dense() == exp.nod,
         d .. "is_non_overlapping_and_dense() should be " .. tostring(exp.nod))
   end
   if exp.suggest ~= nil then
      H.assert_format_name(t:suggest_memory_format(), exp.suggest, d .. "suggest_memory_format()")
   end
end

-- flat list of every element of a nested table (totable) in logical order
local function flatten_into(x, out)
   if type(x) == "table" then
      for i = 1, #x do flatten_into(x[i], out) end
   else
      out[#out + 1] = x
   end
   return out
end
function H.flatten(x) return flatten_into(x, {}) end

-- every element of t, in logical (row-major) order, as a flat Lua array
function H.values(t)
   if t:dim() == 0 then return { t:item() } end
   return flatten_into(t:totable(), {})
end

local function tonum(v)
   if type(v) == "boolean" then return v and 1 or 0 end
   return tonumber(v)
end

-- t's values equal `expected` (flat array or nested table) within an absolute+relative tolerance
-- (exact when tol is 0 / nil for integer checks use tol = 0). NaN equals NaN.
-- t was just written with streaming stores (AVX-512 machines; lumen.h lm_mem_note_streamed):
-- its block is marked, so that it counts as cold when a collection hands it out again. Frees t.
function H.assert_streamed(t)
   local C = require("lumen.C")
   -- the streaming mark lives in the host allocator's block header: a CPU-only fact (on the test
   -- device the header is device memory, which the host must not read)
   if C.lm_gemm_isa() < 3 or t:device() ~= "cpu" then
      t:free()
      return
   end
   local c = require("lumen.tensor").cdata(t)
   local n, p = c.storage.nbytes, c.storage.data
   local streamed = C.lm_mem_was_streamed(p, n)
   t:free()
   if streamed ~= 1 then error("not marked streamed", 2) end
end

-- max |a - b| / max(1, max |b|), in float64: two tensors of the same size (a result against its
-- float64 reference)
function H.rel_diff(a, b)
   local d = (a:double() - b:double()):abs():max():item()
   return d / math.max(1, b:double():abs():max():item())
end

function H.assert_close(t, expected, tol, what)
   tol = tol or 1e-5
   local got
   if type(t) == "table" and getmetatable(t) == nil then got = flatten_into(t, {})
   else got = H.values(t) end
   local exp = flatten_into(expected, {})
   local d = what and (what .. ": ") or ""
   assert(#got == #exp, string.format("%sexpected %d values, got %d", d, #exp, #got))
   for i = 1, #exp do
      local g, e = tonum(got[i]), tonum(exp[i])
      local ok
      if e ~= e then
         ok = (g ~= g)
      elseif e == math.huge or e == -math.huge then
         ok = (g == e)
      else
         ok = math.abs(g - e) <= tol * (1 + math.abs(e))
      end
      assert(ok, string.format("%svalue %d: expected %.9g, got %s (tol %g)", d, i, e,
         tostring(got[i]), tol))
   end
end

-- exact equality of values (integers, booleans)
function H.assert_values(t, expected, what)
   local got = H.values(t)
   local exp = flatten_into(expected, {})
   local d = what and (what .. ": ") or ""
   assert(#got == #exp, string.format("%sexpected %d values, got %d", d, #exp, #got))
   for i = 1, #exp do
      assert(got[i] == exp[i], string.format("%svalue %d: expected %s, got %s", d, i,
         tostring(exp[i]), tostring(got[i])))
   end
end

-- 0, 1, ..., n-1 as a Lua array
function H.iota(n, start)
   local r = {}
   start = start or 0
   for i = 1, n do r[i] = start + i - 1 end
   return r
end

function H.prod(sizes)
   local n = 1
   for i = 1, #sizes do n = n * sizes[i] end
   return n
end

-- a float32 (or opts.dtype) tensor of `sizes` holding 0..n-1 (or `values`) in logical order,
-- in memory format `fmt` (default contiguous)
function H.seq(sizes, fmt, dtype, values)
   local n = H.prod(sizes)
   local t = lm.arange(n):to(dtype or lm.float32):view(sizes)
   if values then
      t = lm.tensor(values, { dtype = dtype or lm.float32 }):view(sizes)
   end
   if fmt and tostring(fmt) ~= "contiguous_format" then
      local out = lm.empty(sizes, { dtype = dtype or lm.float32, memory_format = fmt })
      out:copy_(t)
      t = out
   end
   return t
end

-- a tensor with the given (possibly non-dense) sizes and strides, holding 0..n-1 (or f(i)) in
-- logical order; built with lm.empty_strided + copy_ (copy_ keeps the destination's strides)
function H.strided(sizes, strides, dtype, values)
   local t = lm.empty_strided(sizes, strides, { dtype = dtype or lm.float32 })
   local n = H.prod(sizes)
   if n > 0 then
      local src
      if values then
         src = lm.tensor(values, { dtype = dtype or lm.float32 }):view(sizes)
      else
         src = lm.arange(n):to(dtype or lm.float32):view(sizes)
      end
      t:copy_(src)
   end
   return t
end

-- true when writing into b is seen through a (b is modified!). Both must hold at least 1 element.
function H.writes_through(a, b, sentinel)
   sentinel = sentinel or -12345
   b:fill_(sentinel)
   for _, v in ipairs(H.values(a)) do
      if v == sentinel then return true end
   end
   return false
end

-- Calls f(...) and checks it raised an error whose message starts with "lumen.<fname>:".
-- lumen raises with error(msg, level), so Lua may put the caller's position in front
-- ("spec/x_spec.lua:12: lumen.view: ..."). That prefix is accepted, but it must blame the
-- caller's code, never a file of lumen itself (lua/lumen/...): a wrong level is reported.
-- Set H.STRICT_PREFIX = true to demand the message start with "lumen.<fname>:" exactly.
H.STRICT_PREFIX = false

function H.assert_error(fname, f, ...)
   local ok, msg = pcall(f, ...)
   assert(not ok, "lumen." .. fname .. ": expected an error, call succeeded")
   assert(type(msg) == "string", "lumen." .. fname .. ": error is a " .. type(msg) ..
      ", not a string message")
   local prefix = "lumen." .. fname .. ":"
   local at = msg:find(prefix, 1, true)
   local good = (at == 1)
   if not good and not H.STRICT_PREFIX and at then
      local pos = msg:sub(1, at - 1)
      good = pos:match("^[^%s]+:%d+: $") ~= nil and not pos:find("lua/lumen/", 1, true)
         and not pos:find("lumen/", 1, true)
   end
   assert(good, string.format("expected a message starting with %q, got %q", prefix, msg))
   -- a message that only names the function is not enough: it must say what is wrong
   assert(#msg > at + #prefix + 2, "error message names no problem: " .. msg)
   return msg
end

-- like assert_error, and the message (lowercased) contains `needle` (a plain substring)
function H.assert_error_like(fname, needle, f, ...)
   local msg = H.assert_error(fname, f, ...)
   assert(msg:lower():find(needle:lower(), 1, true),
      string.format("error for lumen.%s should mention %q, got %q", fname, needle, msg))
   return msg
end

-- standard row-major strides (spec section 1, with max(size, 1))
function H.contig_strides(sizes)
   local s, acc = {}, 1
   for i = #sizes, 1, -1 do
      s[i] = acc
      acc = acc * math.max(sizes[i], 1)
   end
   return s
end

-- channels-last strides (plain products, no max)
function H.cl_strides(sizes)
   local c, h, w = sizes[2], sizes[3], sizes[4]
   return { h * w * c, 1, w * c, c }
end

function H.cl3d_strides(sizes)
   local c, d, h, w = sizes[2], sizes[3], sizes[4], sizes[5]
   return { d * h * w * c, 1, h * w * c, w * c, c }
end

-- the ISA levels whose kernels a spec runs in turn: 1 (portable C), then this CPU's best
-- (lm_gemm_set_isa(0) restores the best and answers it)
-- the activation ops an epilogue's act name stands for (F.conv2d's and F.linear's act), unfused
H.ACT_NAMES = { "relu", "relu6", "silu", "hardswish", "hardsigmoid", "sigmoid", "gelu",
                "gelu_tanh" }
H.ACT_OP = {
   relu = function(y) return y:relu() end,
   relu6 = function(y) return lm.F.relu6(y) end,
   silu = function(y) return lm.F.silu(y) end,
   hardswish = function(y) return lm.F.hardswish(y) end,
   hardsigmoid = function(y) return lm.F.hardsigmoid(y) end,
   sigmoid = function(y) return y:sigmoid() end,
   gelu = function(y) return lm.F.gelu(y) end,
   gelu_tanh = function(y) return lm.F.gelu(y, "tanh") end,
}

function H.isas()
   local best = require("lumen.C").lm_gemm_set_isa(0)
   local r = { 1 }
   if best ~= 1 then r[#r + 1] = best end
   return r
end

-- loads a fixture table from spec/fixtures/core/<name>.lua
function H.fixture(name)
   local f = assert(loadfile("spec/fixtures/core/" .. name .. ".lua"))
   return f()
end

return H
