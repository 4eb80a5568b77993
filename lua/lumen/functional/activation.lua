-- lumen.functional.activation -- lm.F's activations: relu, sigmoid, tanh (the differentiable
-- Tensor methods) and softmax / log_softmax, with their backward.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local type, getmetatable, rawget = type, getmetatable, rawget

local Tensor, wrap, wrap_dim = T.Tensor, T.wrap, T.wrap_dim
local needs, record, fresh = A.needs, A.record, A.fresh
local check, tensor_arg, check_opts, check_float = H.check, H.tensor_arg, H.check_opts,
   H.check_float

local F = H.F

-- inside lm.autocast softmax and log_softmax compute in float32 (lua/lumen/autocast.lua); off,
-- one upvalue test
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_f32 = AC.f32

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")

local RELU_OPTS = H.option_set("inplace")

-- relu(x, inplace = false)
-- relu(x, inplace) or relu(x, {inplace = true})
function F.relu(x, inplace)
   if type(inplace) == "table" then inplace = check_opts("relu", inplace, RELU_OPTS).inplace end
   if inplace then return Tensor.relu_(x) end
   return Tensor.relu(x)
end
function F.relu_(x) return Tensor.relu_(x) end
function F.sigmoid(x) return Tensor.sigmoid(x) end
function F.tanh(x) return Tensor.tanh(x) end

-- PyTorch's legacy implicit dim: 0 for 0-, 1- and 3-D inputs, else 1 (0-based)
local function softmax_dim(fname, xc, dim)
   if dim == nil then
      local nd = xc.ndim
      return (nd == 0 or nd == 1 or nd == 3) and 0 or 1
   end
   return wrap_dim(fname, dim, xc.ndim)
end

local function softmax_like(fname, cfwd, cbwd, bname)
   return function(x, dim)
      if ac_on then x = ac_f32(x) end
      local xc = tensor_arg(fname, x, "input")
      check_float(fname, xc, "input")
      local d = softmax_dim(fname, xc, dim)
      outp[0] = nil
      check(cfwd(xc, d, outp), fname)
      local out = wrap(outp[0])
      if A.is_grad_enabled() and needs(x) then
         record(out, bname, function(g)
            p1[0] = nil
            check(cbwd(g._c, out._c, d, p1), fname .. "_backward")
            return fresh(wrap(p1[0]))
         end, x)
      end
      return out
   end
end
F.softmax = softmax_like("softmax", function(...) return C.lm_softmax(...) end,
                         function(...) return C.lm_softmax_backward(...) end, "SoftmaxBackward")
F.log_softmax = softmax_like("log_softmax", function(...) return C.lm_log_softmax(...) end,
                             function(...) return C.lm_log_softmax_backward(...) end,
                             "LogSoftmaxBackward")

---------------------------------------------------------------------------------------------
-- the activations of the modern conv nets (issue 40): silu, gelu, hardswish, hardsigmoid,
-- relu6, leaky_relu, elu, mish. Each is one native elementwise pass (lm_unary with an
-- activation code, or lm_binary_scalar for the parameterized leaky_relu and elu), so the
-- result follows the input's memory format and every device runs it; the backward is one more
-- pass (the *_BACKWARD binary codes, from the gradient and the saved input). PyTorch's formulas
-- (aten/src/ATen/native/cpu/Activation.cpp). In place (inplace = true) where PyTorch has it;
-- under autograd the in-place form saves a copy of the input for its backward (relu6: none,
-- its result serves).
---------------------------------------------------------------------------------------------

local tc = T.tc

local function act_input(fname, x)
   local xc = tensor_arg(fname, x, "input")
   check_float(fname, xc, "input")
   return xc
end

local function inplace_arg(fname, v)
   if v == nil then return false end
   if type(v) ~= "boolean" then
      H.err(fname, "inplace must be a boolean, got " .. T.typename(v))
   end
   return v
end

local number_arg = H.number_arg

-- a leaf that requires grad cannot change in place (as Tensor's in-place methods)
local function inplace_leaf_check(fname, x)
   if needs(x) and rawget(x, "grad_fn") == nil then
      H.err(fname, "a leaf tensor that requires grad is being used in an in-place operation")
   end
end

-- the gradient g * act'(x) by the binary code bop (alpha: its parameter), or by bop(g, x) when
-- bop is a Lua function (the activations composed from other ops: hardtanh)
local function act_backward(fname, bop, g, x, alpha)
   if type(bop) == "function" then return bop(g, x) end
   p1[0] = nil
   check(C.lm_binary(bop, tc(g, fname), tc(x, fname), alpha, p1), fname .. "_backward")
   return fresh(wrap(p1[0]))
end

-- run(xc, outp) computes the activation into outp[0] (nil: a new tensor; xc: in place).
-- from_out: bop gives the same gradient from the result as from the input (relu6: its result
-- is in (0, 6) exactly where its input is, NaN where it is NaN), so the in-place form saves no
-- copy: its backward reads the tensor itself, as relu_'s does. MobileNet V2's 35 batch norm +
-- ReLU6(inplace) pairs copied 19 ms of a 260 ms training step (Zen 4, 2 threads).
local function activation(fname, bname, x, inplace, run, bop, alpha, from_out)
   local xc = act_input(fname, x)
   if inplace then
      local grad = A.is_grad_enabled() and needs(x)
      if grad then inplace_leaf_check(fname, x) end
      local saved = grad and (from_out and x or Tensor.clone(x)) or nil
      local e = grad and A.edge(x) or nil
      T.barrier(xc)
      outp[0] = xc
      check(run(xc, outp), fname)
      if grad then
         A.attach(x, bname, function(g) return act_backward(fname, bop, g, saved, alpha) end,
                  { e })
      end
      return x
   end
   outp[0] = nil
   check(run(xc, outp), fname)
   local out = wrap(outp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, bname, function(g) return act_backward(fname, bop, g, x, alpha) end, x)
   end
   return out
end

local INPLACE_OPTS = H.option_set("inplace")
-- the second argument of silu, hardswish, ...: inplace, or {inplace = }
local function inplace_opt(fname, v)
   if type(v) == "table" and getmetatable(v) == nil then
      v = check_opts(fname, v, INPLACE_OPTS).inplace
   end
   return inplace_arg(fname, v)
end

local function unary_activation(fname, uop, bop, bname)
   local function run(xc, o) return C.lm_unary(uop, xc, o) end
   F._OPTIONS[fname] = INPLACE_OPTS
   return function(x, inplace)
      return activation(fname, bname, x, inplace_opt(fname, inplace), run, bop, 1)
   end
end

-- silu(x, inplace = false): x * sigmoid(x)
F.silu = unary_activation("silu", C.LM_SILU, C.LM_SILU_BACKWARD, "SiluBackward")
-- hardswish(x, inplace = false): x * relu6(x + 3) / 6
F.hardswish = unary_activation("hardswish", C.LM_HARDSWISH, C.LM_HARDSWISH_BACKWARD,
                               "HardswishBackward")
-- hardsigmoid(x, inplace = false): relu6(x + 3) / 6
F.hardsigmoid = unary_activation("hardsigmoid", C.LM_HARDSIGMOID, C.LM_HARDSIGMOID_BACKWARD,
                                 "HardsigmoidBackward")
-- mish(x, inplace = false): x * tanh(softplus(x))
F.mish = unary_activation("mish", C.LM_MISH, C.LM_MISH_BACKWARD, "MishBackward")

-- relu6(x, inplace = false): min(max(x, 0), 6) (PyTorch's hardtanh(x, 0, 6): no gradient at 0
-- and 6)
do
   local function run(xc, o) return C.lm_clamp(xc, 0, 6, 1, 1, o) end
   F._OPTIONS.relu6 = INPLACE_OPTS
   function F.relu6(x, inplace)
      return activation("relu6", "Hardtanh", x, inplace_opt("relu6", inplace), run,
                        C.LM_RELU6_BACKWARD, 1, true)
   end
end

-- gelu(x, approximate = "none") or gelu(x, {approximate = "none" | "tanh"})
local GELU_OPTS = H.option_set("approximate")
F._OPTIONS.gelu = GELU_OPTS
do
   local function run_none(xc, o) return C.lm_unary(C.LM_GELU, xc, o) end
   local function run_tanh(xc, o) return C.lm_unary(C.LM_GELU_TANH, xc, o) end
   function F.gelu(x, approximate)
      local fname = "gelu"
      if type(approximate) == "table" and getmetatable(approximate) == nil then
         approximate = check_opts(fname, approximate, GELU_OPTS).approximate
      end
      if approximate == nil or approximate == "none" then
         return activation(fname, "GeluBackward", x, false, run_none, C.LM_GELU_BACKWARD, 1)
      elseif approximate == "tanh" then
         return activation(fname, "GeluBackward", x, false, run_tanh, C.LM_GELU_TANH_BACKWARD, 1)
      end
      H.err(fname, "approximate must be \"none\" or \"tanh\", got " ..
            (type(approximate) == "string" and ("\"" .. approximate .. "\"")
             or T.typename(approximate)))
   end
end

-- a parameterized activation's arguments: (x, p, inplace) or (x, {name = p, inplace = })
local function param_args(fname, known, name, p, inplace, default)
   if type(p) == "table" and getmetatable(p) == nil then
      if inplace ~= nil then H.err(fname, "options table and inplace given together") end
      local o = check_opts(fname, p, known)
      p, inplace = o[name], o.inplace
   end
   return number_arg(fname, p, name, default), inplace_arg(fname, inplace)
end

-- leaky_relu(x, negative_slope = 0.01, inplace = false): x > 0 ? x : negative_slope * x
local LEAKY_OPTS = H.option_set("negative_slope", "inplace")
F._OPTIONS.leaky_relu = LEAKY_OPTS
do
   local slope_now = 0.01
   local function run(xc, o)
      return C.lm_binary_scalar(C.LM_LEAKY_RELU, xc, slope_now, 0, 0, 1, o)
   end
   function F.leaky_relu(x, negative_slope, inplace)
      local fname = "leaky_relu"
      local s, ip = param_args(fname, LEAKY_OPTS, "negative_slope", negative_slope, inplace, 0.01)
      slope_now = s
      return activation(fname, "LeakyReluBackward", x, ip, run, C.LM_LEAKY_RELU_BACKWARD, s)
   end
   function F.leaky_relu_(x, negative_slope) return F.leaky_relu(x, negative_slope, true) end
end

-- elu(x, alpha = 1, inplace = false): x > 0 ? x : alpha * (exp(x) - 1)
local ELU_OPTS = H.option_set("alpha", "inplace")
F._OPTIONS.elu = ELU_OPTS
do
   local alpha_now = 1
   local function run(xc, o) return C.lm_binary_scalar(C.LM_ELU, xc, alpha_now, 0, 0, 1, o) end
   function F.elu(x, alpha, inplace)
      local fname = "elu"
      local a, ip = param_args(fname, ELU_OPTS, "alpha", alpha, inplace, 1)
      alpha_now = a
      return activation(fname, "EluBackward", x, ip, run, C.LM_ELU_BACKWARD, a)
   end
   function F.elu_(x, alpha) return F.elu(x, alpha, true) end
end

---------------------------------------------------------------------------------------------
-- hardtanh, softplus, selu, celu (PyTorch's formulas, aten/src/ATen/native/cpu/Activation.cpp;
-- composed from the elementwise ops, each with its own backward so that no branch that is not
-- taken can put a NaN into the gradient)
---------------------------------------------------------------------------------------------
local R = T.raw

-- the mask of hardtanh's gradient from its input or its result (the same: the result is in
-- (lo, hi) exactly where the input is, NaN where it is NaN): 0 where t <= lo or t >= hi
local function hardtanh_mask(t, lo, hi)
   return R.logical_not(R.logical_or(R.le(t, lo), R.ge(t, hi)))
end

-- hardtanh(x, min_val = -1, max_val = 1, inplace = false) or hardtanh(x, {min_val =, max_val =,
-- inplace =}): clamp(x, min_val, max_val); no gradient at and beyond the bounds
local HARDTANH_OPTS = H.option_set("min_val", "max_val", "inplace")
F._OPTIONS.hardtanh = HARDTANH_OPTS
function F.hardtanh(x, min_val, max_val, inplace)
   local fname = "hardtanh"
   if type(min_val) == "table" and getmetatable(min_val) == nil then
      if max_val ~= nil or inplace ~= nil then
         H.err(fname, "options table and positional arguments given together")
      end
      local o = check_opts(fname, min_val, HARDTANH_OPTS)
      min_val, max_val, inplace = o.min_val, o.max_val, o.inplace
   end
   local lo = number_arg(fname, min_val, "min_val", -1)
   local hi = number_arg(fname, max_val, "max_val", 1)
   if lo > hi then H.err(fname, "min_val cannot be greater than max_val") end
   local function run(xc, o) return C.lm_clamp(xc, lo, hi, 1, 1, o) end
   local function bwd(g, t) return fresh(R.where(hardtanh_mask(t, lo, hi), g, 0)) end
   -- in place, the mask from the result (from_out): no copy saved
   return activation(fname, "HardtanhBackward", x, inplace_arg(fname, inplace), run, bwd, nil,
                     true)
end
function F.hardtanh_(x, min_val, max_val) return F.hardtanh(x, min_val, max_val, true) end

-- softplus(x, beta = 1, threshold = 20) or softplus(x, {beta =, threshold =}):
-- log(1 + exp(beta x)) / beta, and x itself where beta x > threshold; gradient
-- sigmoid(beta x), 1 above the threshold
local SOFTPLUS_OPTS = H.option_set("beta", "threshold")
F._OPTIONS.softplus = SOFTPLUS_OPTS
function F.softplus(x, beta, threshold)
   local fname = "softplus"
   if type(beta) == "table" and getmetatable(beta) == nil then
      if threshold ~= nil then H.err(fname, "options table and threshold given together") end
      local o = check_opts(fname, beta, SOFTPLUS_OPTS)
      beta, threshold = o.beta, o.threshold
   end
   local b = number_arg(fname, beta, "beta", 1)
   local th = number_arg(fname, threshold, "threshold", 20)
   act_input(fname, x)
   local bx = b == 1 and x or R.mul(x, b)
   local above = R.gt(bx, th)
   local soft = R.log1p(R.exp(bx))
   if b ~= 1 then soft = R.div(soft, b) end
   local out = R.where(above, x, soft)
   if A.is_grad_enabled() and needs(x) then
      record(out, "SoftplusBackward", function(g)
         return fresh(R.where(above, g, R.mul(g, R.sigmoid(bx))))
      end, x)
   end
   return out
end

-- selu(x, inplace = false): scale * elu(x, alpha) with PyTorch's constants
local SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
F._OPTIONS.selu = INPLACE_OPTS
function F.selu(x, inplace)
   local ip = inplace_opt("selu", inplace)
   act_input("selu", x)
   if ip and A.is_grad_enabled() and needs(x) then inplace_leaf_check("selu", x) end
   local y = F.elu(x, SELU_ALPHA, ip)
   if ip then return Tensor.mul_(y, SELU_SCALE) end
   return Tensor.mul(y, SELU_SCALE)
end

-- celu(x, alpha = 1, inplace = false) or celu(x, {alpha =, inplace =}):
-- x > 0 ? x : alpha (exp(x / alpha) - 1); gradient 1, or exp(x / alpha)
local CELU_OPTS = H.option_set("alpha", "inplace")
F._OPTIONS.celu = CELU_OPTS
function F.celu(x, alpha, inplace)
   local fname = "celu"
   local a, ip = param_args(fname, CELU_OPTS, "alpha", alpha, inplace, 1)
   if a == 0 then H.err(fname, "alpha must not be 0 (ZeroDivisionError in PyTorch)") end
   act_input(fname, x)
   if ip and A.is_grad_enabled() and needs(x) then inplace_leaf_check(fname, x) end
   if a == 1 then return F.elu(x, 1, ip) end
   local pos = R.logical_not(R.le(x, 0))       -- as PyTorch's x <= 0 test: NaN takes x's side
   local xa = R.div(x, a)
   local out = R.where(pos, x, R.mul(R.expm1(xa), a))
   if A.is_grad_enabled() and needs(x) then
      record(out, "CeluBackward", function(g)
         return fresh(R.where(pos, g, R.mul(g, R.exp(xa))))
      end, x)
   end
   if ip then return Tensor.copy_(x, out) end
   return out
end
function F.celu_(x, alpha) return F.celu(x, alpha, true) end
