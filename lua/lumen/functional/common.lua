-- lumen.functional.common -- what the operator families of lm.F (lua/lumen/functional/*.lua)
-- share: the lm.F table itself, which each family fills with its operators, and the argument
-- checks (tensors, options, dtypes, n-tuple sizes) that give every operator the same errors
-- ("lumen.<fn>: ...").
--
-- The families define their operators on this one table, and call each other through it
-- (F.max_pool1d runs F.max_pool2d, F.cross_entropy F.log_softmax and F.nll_loss): whatever is
-- installed over an entry of lm.F (layout.trace's and lm.jit's recorders) sees the inner calls
-- too, as it did when lm.F was one file.

local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local util = require("lumen.util")

local type, tostring, tonumber, getmetatable, pairs = type, tostring, tonumber, getmetatable,
   pairs
local ffi_string = require("ffi").string

local typename, argerror = T.typename, T.argerror

local H = {}

-- lm.F; _OPTIONS: the known option keys per function (private: for tools and specs)
H.F = { _OPTIONS = {} }

---------------------------------------------------------------------------------------------
-- errors
---------------------------------------------------------------------------------------------

local function err(fname, msg) argerror(fname, msg) end
H.err = err

-- raise "lumen.<fname>: <the C error>"
local function raise(fname)
   error("lumen." .. fname .. ": " .. ffi_string(C.lm_last_error()), T.user_level and
         T.user_level() or 2)
end
H.raise = raise

function H.check(st, fname)
   if st ~= 0 then raise(fname) end
end

---------------------------------------------------------------------------------------------
-- tensor arguments
---------------------------------------------------------------------------------------------

-- the cdata of tensor argument x (named what), or an error
local function tensor_arg(fname, x, what)
   if getmetatable(x) ~= T.mt then
      err(fname, what .. ": tensor expected, got " .. typename(x))
   end
   local c = T.cdata(x)
   if c == nil then err(fname, what .. " is a freed tensor") end
   return c
end
H.tensor_arg = tensor_arg

-- an optional tensor argument: nil (or false) -> nil
function H.opt_tensor(fname, x, what)
   if x == nil or x == false then return nil end
   return tensor_arg(fname, x, what)
end

-- every tensor of the list on x's device, checked before any work (so the error names the
-- operator the user called, not the op inside it that meets the other device first):
-- H.same_device(fname, x, t1, "weight", t2, "bias", ...); nil entries are skipped
function H.same_device(fname, x, ...)
   local dev = T.raw.device(x)
   for i = 1, select("#", ...), 2 do
      local t, what = select(i, ...)
      if t ~= nil and t ~= false then
         local d = T.raw.device(t)
         if d ~= dev then
            err(fname, ("expected all tensors to be on the same device, got %s and %s (%s)")
                :format(dev, d, what))
         end
      end
   end
end

function H.sizes_str(c)
   local s = {}
   for i = 0, c.ndim - 1 do s[#s + 1] = tostring(tonumber(c.sizes[i])) end
   return "(" .. table.concat(s, ", ") .. ")"
end

-- the floating dtypes; float16 and bfloat16 compute in float32 where a kernel has no native path
local function is_float(c)
   local d = c.dtype
   return d == C.LM_FLOAT32 or d == C.LM_FLOAT64 or d == C.LM_FLOAT16 or d == C.LM_BFLOAT16
end

H.is_float = is_float

-- the losses composed from several ops widen 16-bit operands to float32 and round their result
-- once at the end (half_dtype: the dtype to round to, nil for float32 / float64 operands), as
-- PyTorch's fused loss kernels accumulate in float32: in float16 each intermediate rounding
-- would add up to a few units in the last place (spec/peer_ops_spec.lua's half comparison)
-- an optional number argument: default when nil; NaN and non-numbers are errors
function H.number_arg(fname, v, what, default)
   if v == nil then return default end
   if type(v) ~= "number" or v ~= v then
      err(fname, what .. " must be a number, got " .. T.typename(v))
   end
   return v
end

function H.half_dtype(t)
   if not T.is_tensor(t) then return nil end
   local d = T.Tensor.dtype(t)
   if d == dtypes.float16 or d == dtypes.bfloat16 then return d end
   return nil
end
function H.widen(t)
   if H.half_dtype(t) then return T.Tensor.to(t, dtypes.float32) end
   return t
end

local function dtype_name(c) return tostring(dtypes.from_id(c.dtype)) end
H.dtype_name = dtype_name

-- an operand (cdata c, named what) that must have the input's dtype
function H.input_dtype(fname, c, what, xc)
   if c.dtype ~= xc.dtype then
      err(fname, ("%s (%s) must have the input's dtype (%s)"):format(what, dtype_name(c),
          dtype_name(xc)))
   end
end

function H.check_float(fname, c, what)
   if not is_float(c) then
      err(fname, ("expected %s of a floating dtype (float32, float64, float16, bfloat16), got %s")
          :format(what, dtype_name(c)))
   end
end

-- a normalization's parameters (weight, bias, running statistics: cdata or nil, in pairs with
-- their names) share one dtype, the input's or float32 for a float16 / bfloat16 input, as
-- PyTorch requires ("mixed dtype (CPU): expect parameter to have scalar type of Float"): a
-- float64 weight on float32 activations is a half-converted model, not a request
function H.param_dtypes(fname, xc, ...)
   local first, fwhat
   for i = 1, select("#", ...), 2 do
      local c, what = select(i, ...)
      if c ~= nil then
         if first == nil then
            first, fwhat = c, what
            local d, xd = c.dtype, xc.dtype
            local half = xd == C.LM_FLOAT16 or xd == C.LM_BFLOAT16
            if d ~= xd and not (d == C.LM_FLOAT32 and half) then
               err(fname, ("%s is %s but the input is %s: the parameters must have the input's " ..
                   "dtype (or float32 for a float16 / bfloat16 input)")
                   :format(what, dtype_name(c), dtype_name(xc)))
            end
         elseif c.dtype ~= first.dtype then
            err(fname, ("%s is %s but %s is %s: the parameters must share one dtype")
                :format(what, dtype_name(c), fwhat, dtype_name(first)))
         end
      end
   end
end

-- the (C) format of a tensor as a kernel picks it (lm_suggest_memory_format)
function H.suggest(c) return C.lm_suggest_memory_format(c, 0) end

---------------------------------------------------------------------------------------------
-- options
---------------------------------------------------------------------------------------------

H.option_set = util.option_set

-- a copy of the options table with some entries replaced (nil removes one)
function H.opts_with(opts, k1, v1, k2, v2)
   local o = {}
   for k, v in pairs(opts) do o[k] = v end
   o[k1] = v1
   if k2 ~= nil then o[k2] = v2 end
   return o
end

-- opts: nil or a plain table whose keys are all in the set known (an unknown key is an error)
function H.check_opts(fname, opts, known)
   if opts ~= nil then
      if type(opts) ~= "table" or getmetatable(opts) ~= nil then
         err(fname, "options must be a table, got " .. typename(opts))
      end
      local k = util.unknown_option(opts, known)
      if k ~= nil then err(fname, util.unknown_option_msg(k)) end
   end
   return opts or {}
end

-- PyTorch's positional trailing arguments (F.batch_norm(x, rm, rv, w, b, training, momentum,
-- eps)) as the options table lumen takes in their place: opts is returned as is when it is nil
-- or a table and nothing follows; otherwise opts and the values after it are the options
-- names[1], names[2], ... (nil ones left out)
function H.positional(fname, names, opts, ...)
   local extra = select("#", ...)
   if extra == 0 and (opts == nil or type(opts) == "table") then return opts end
   if type(opts) == "table" and getmetatable(opts) == nil then
      err(fname, "an options table must be the last argument")
   end
   if extra + 1 > #names then
      err(fname, ("too many arguments: after the tensors it takes at most %d (%s)")
          :format(#names, table.concat(names, ", ")))
   end
   local o = {}
   o[names[1]] = opts
   for i = 1, extra do o[names[i + 1]] = (select(i, ...)) end
   return o
end

function H.int_opt(fname, v, what, default, min)
   if v == nil then return default end
   if type(v) ~= "number" or v % 1 ~= 0 then
      err(fname, what .. " must be an integer, got " .. tostring(v))
   end
   if v < min then err(fname, ("%s must be at least %d, got %d"):format(what, min, v)) end
   return v
end

function H.bool_opt(fname, v, what, default)
   if v == nil then return default end
   if type(v) ~= "boolean" then err(fname, what .. " must be a boolean, got " .. typename(v)) end
   return v
end

---------------------------------------------------------------------------------------------
-- sizes of the 1-D, 2-D and 3-D operators (kernel_size, stride, padding, dilation, output_size)
---------------------------------------------------------------------------------------------

-- how an n-tuple is written in the errors
local TUPLE_FORM = { "{n}", "{h, w}", "{d, h, w}" }

local function list(r, fmt)
   local s = {}
   for i = 1, #r do s[i] = fmt and fmt:format(r[i]) or tostring(r[i]) end
   return table.concat(s, ", ")
end

-- ntuple(n, fname, v, what, default, min): a number, or a table of 1 (repeated) or n numbers
-- (a plain array or a Size), -> an array of n integers of at least min (n = 1, 2 or 3); default
-- when v is nil (an error when there is none). The one parser of the 1-D, 2-D and 3-D
-- operators' sizes. It runs on every call of those operators, so it has no loop (a loop in a
-- helper cuts the caller's compiled trace in pieces) and makes its result with a constructor
-- of the exact size (a table grown entry by entry cost twice the time).
local function is_int(e) return type(e) == "number" and e % 1 == 0 end
local function ntuple(n, fname, v, what, default, min)
   if v == nil then
      if default == nil then err(fname, what .. " is required") end
      v = default
   end
   local a, b, c
   if type(v) == "number" then
      a, b, c = v, v, v
   elseif T.is_sizes(v) then
      local k = #v
      if k == 1 then
         a = v[1]; b, c = a, a
      elseif k == n then
         a, b, c = v[1], v[2], v[3]
      else
         err(fname, ("%s must be a number or %s, got %d values"):format(what, TUPLE_FORM[n], k))
      end
   else
      err(fname, ("%s must be a number or %s, got %s"):format(what, TUPLE_FORM[n], typename(v)))
   end
   local r = n == 3 and { a, b, c } or n == 2 and { a, b } or { a }
   if not (is_int(a) and (n < 2 or is_int(b)) and (n < 3 or is_int(c))) then
      err(fname, what .. (n == 1 and " must be an integer, got " or " must hold integers, got ")
          .. list(r))
   end
   if a < min or (n > 1 and b < min) or (n > 2 and c < min) then
      local got = n == 1 and ("%d"):format(a) or "(" .. list(r, "%d") .. ")"
      err(fname, ("%s must be %s, got %s"):format(what,
          min == 0 and "non-negative" or ("at least " .. min), got))
   end
   return r
end
H.ntuple = ntuple

-- output_size(n, fname, xc, size) of the adaptive pools (n = 2 or 3): a number, or a table of n
-- entries where false / nil keeps the input's size (xc: the input's cdata, spatial dims last)
function H.output_size(n, fname, xc, size)
   if size == nil then err(fname, "output_size is required") end
   local r
   if type(size) == "number" then
      r = n == 3 and { size, size, size } or { size, size }
   elseif T.is_sizes(size) then
      if size[1] == nil and size[2] == nil and (n == 2 or size[3] == nil) then
         err(fname, "output_size must be a number or " .. TUPLE_FORM[n])
      end
      r = n == 3 and { size[1], size[2], size[3] } or { size[1], size[2] }
      for i = 1, n do
         if r[i] == nil or r[i] == false then r[i] = tonumber(xc.sizes[xc.ndim - n + i - 1]) end
      end
   else
      err(fname, ("output_size must be a number or %s, got %s"):format(TUPLE_FORM[n],
          typename(size)))
   end
   for i = 1, n do
      local v = r[i]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
         err(fname, "output_size must hold non-negative integers, got " .. list(r))
      end
   end
   return r
end

-- the entries of p (1 to 3 of them) into the int64_t array buf (the C entry points' sizes);
-- returns buf. No loop, as in ntuple.
function H.fill(buf, p)
   local n = #p
   buf[0] = p[1]
   if n > 1 then buf[1] = p[2] end
   if n > 2 then buf[2] = p[3] end
   return buf
end

-- the activations a kernel's epilogue runs (F.conv2d's and F.linear's opts.act): the name -> the
-- lm_conv_act of src/conv.h, and the ops autograd differentiates when a gradient is wanted (the
-- same formulas: kernels/cpu/act.h)
local C_ = require("lumen.C")
H.ACT_CODE = {
   relu = C_.LM_ACT_RELU, relu6 = C_.LM_ACT_RELU6, silu = C_.LM_ACT_SILU,
   hardswish = C_.LM_ACT_HARDSWISH, hardsigmoid = C_.LM_ACT_HARDSIGMOID,
   sigmoid = C_.LM_ACT_SIGMOID, gelu = C_.LM_ACT_GELU, gelu_tanh = C_.LM_ACT_GELU_TANH,
}
H.ACT_OP = {
   relu = function(y) return y:relu() end,
   relu6 = function(y) return H.F.relu6(y) end,
   silu = function(y) return H.F.silu(y) end,
   hardswish = function(y) return H.F.hardswish(y) end,
   hardsigmoid = function(y) return H.F.hardsigmoid(y) end,
   sigmoid = function(y) return y:sigmoid() end,
   gelu = function(y) return H.F.gelu(y) end,
   gelu_tanh = function(y) return H.F.gelu(y, "tanh") end,
}
local ACT_NAMES = 'relu, relu6, silu, hardswish, hardsigmoid, sigmoid, gelu, gelu_tanh'

-- act_opt(fname, opts) -> opts.act (with opts.relu, the older flag) as an activation's name, or
-- nil for none
function H.act_opt(fname, opts)
   local relu = H.bool_opt(fname, opts.relu, "relu", false)
   local act = opts.act
   if act == nil or act == "none" then
      return relu and "relu" or nil
   end
   if type(act) ~= "string" or H.ACT_CODE[act] == nil then
      err(fname, ("act must be one of none, %s, got %s"):format(ACT_NAMES,
          type(act) == "string" and ("'" .. act .. "'") or typename(act)))
   end
   if relu and act ~= "relu" then
      err(fname, "relu = true and act = '" .. act .. "' given together")
   end
   return act
end

return H
