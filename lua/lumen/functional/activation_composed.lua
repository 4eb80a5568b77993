-- lumen.functional.activation_composed -- the rest of PyTorch's activations, composed from the
-- elementwise ops (tinygrad's rule: compose in Lua before writing C): logsigmoid, softsign,
-- tanhshrink, softshrink, hardshrink, threshold, glu, prelu, softmin. The formulas, NaN
-- behaviour included, are ATen's CPU kernels' (aten/src/ATen/native/cpu/Activation.cpp);
-- logsigmoid has its own backward (g * sigmoid(-x), where the composition's abs and min would
-- give the wrong slope at 0). Every device and layout runs them as their ops do: a channels-last
-- input gives a channels-last result and gradient.

local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, getmetatable, tostring = type, getmetatable, tostring

local Tensor, R = T.Tensor, T.raw
local needs, record, fresh = A.needs, A.record, A.fresh
local tensor_arg, check_float, check_opts = H.tensor_arg, H.check_float, H.check_opts

local F = H.F

local function float_input(fname, x)
   local xc = tensor_arg(fname, x, "input")
   check_float(fname, xc, "input")
   return xc
end

local number_arg = H.number_arg

-- (x, value) or (x, {name = value}): the one parameter of shrink-like activations
local function one_param(fname, opts_set, name, v, default)
   if type(v) == "table" and getmetatable(v) == nil then
      v = check_opts(fname, v, opts_set)[name]
   end
   return number_arg(fname, v, name, default)
end

-- logsigmoid(x) = log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), without overflow; gradient
-- g * sigmoid(-x) (PyTorch's log_sigmoid_backward)
function F.logsigmoid(x)
   float_input("logsigmoid", x)
   local out = R.sub(R.minimum(x, 0), R.log1p(R.exp(R.neg(R.abs(x)))))
   if A.is_grad_enabled() and needs(x) then
      record(out, "LogSigmoidBackward", function(g)
         return fresh(R.mul(g, R.sigmoid(R.neg(x))))
      end, x)
   end
   return out
end

-- softsign(x) = x / (1 + |x|) (composed in PyTorch too)
function F.softsign(x)
   float_input("softsign", x)
   return Tensor.div(x, Tensor.add(Tensor.abs(x), 1))
end

-- tanhshrink(x) = x - tanh(x)
function F.tanhshrink(x)
   float_input("tanhshrink", x)
   return Tensor.sub(x, Tensor.tanh(x))
end

-- softshrink(x, lambd = 0.5): x - lambd above lambd, x + lambd below -lambd, 0 between (x * 0,
-- so NaN stays NaN, as ATen's); gradient 1 outside [-lambd, lambd]
local SHRINK_OPTS = H.option_set("lambd")
F._OPTIONS.softshrink = SHRINK_OPTS
function F.softshrink(x, lambd)
   float_input("softshrink", x)
   local l = one_param("softshrink", SHRINK_OPTS, "lambd", lambd, 0.5)
   if l < 0 then H.err("softshrink", "lambd must be >= 0, got " .. tostring(l)) end
   return T.where(Tensor.gt(x, l), Tensor.sub(x, l),
                  T.where(Tensor.lt(x, -l), Tensor.add(x, l), Tensor.mul(x, 0)))
end

-- hardshrink(x, lambd = 0.5): 0 in [-lambd, lambd], x elsewhere (NaN stays NaN); the gradient
-- flows only where |x| > lambd (ATen's backward gives a NaN input no gradient)
F._OPTIONS.hardshrink = SHRINK_OPTS
function F.hardshrink(x, lambd)
   float_input("hardshrink", x)
   local l = one_param("hardshrink", SHRINK_OPTS, "lambd", lambd, 0.5)
   local outside = Tensor.logical_or(Tensor.gt(x, l), Tensor.lt(x, -l))
   local inside = Tensor.logical_and(Tensor.ge(x, -l), Tensor.le(x, l))
   return T.where(outside, x, T.where(inside, 0, Tensor.detach(x)))
end

-- threshold(x, threshold, value, inplace = false): value where x <= threshold, else x (NaN stays
-- NaN); gradient where x > threshold
local THRESHOLD_OPTS = H.option_set("threshold", "value", "inplace")
F._OPTIONS.threshold = THRESHOLD_OPTS
function F.threshold(x, threshold, value, inplace)
   local fname = "threshold"
   if type(threshold) == "table" and getmetatable(threshold) == nil then
      local o = check_opts(fname, threshold, THRESHOLD_OPTS)
      threshold, value, inplace = o.threshold, o.value, o.inplace
   end
   tensor_arg(fname, x, "input")
   if type(threshold) ~= "number" or type(value) ~= "number" then
      H.err(fname, "threshold and value must be numbers, got " .. T.typename(threshold) ..
            " and " .. T.typename(value))
   end
   if inplace ~= nil and type(inplace) ~= "boolean" then
      H.err(fname, "inplace must be a boolean, got " .. T.typename(inplace))
   end
   local y = T.where(Tensor.le(x, threshold), value, x)
   if Tensor.dtype(y) ~= Tensor.dtype(x) then y = Tensor.to(y, Tensor.dtype(x)) end
   if inplace then return Tensor.copy_(x, y) end
   return y
end

-- glu(x, dim = -1): a * sigmoid(b), a and b the two halves of x along dim
function F.glu(x, dim)
   local xc = float_input("glu", x)
   if xc.ndim == 0 then H.err("glu", "glu does not support scalars (0-dim tensors)") end
   local d = T.wrap_dim("glu", dim or -1, xc.ndim) + 1
   local n = Tensor.size(x, d)
   if n % 2 ~= 0 then
      H.err("glu", ("halving dimension must be even, but dimension %d is size %d"):format(d, n))
   end
   local a = Tensor.narrow(x, d, 1, n / 2)
   local b = Tensor.narrow(x, d, n / 2 + 1, n / 2)
   return Tensor.mul(a, Tensor.sigmoid(b))
end

-- prelu(x, weight): x where x > 0, weight * x elsewhere; weight has 1 element or one per channel
-- (dim 2 of x), broadcast over the others
function F.prelu(x, weight)
   local fname = "prelu"
   local xc = float_input(fname, x)
   local wc = tensor_arg(fname, weight, "weight")
   H.input_dtype(fname, wc, "weight", xc)
   local nw = Tensor.numel(weight)
   local w = weight
   if nw ~= 1 then
      if xc.ndim < 2 or Tensor.size(x, 2) ~= nw then
         H.err(fname, ("mismatch of parameter numbers and input channel size: weight has %d " ..
               "elements, input has %s channels"):format(nw, xc.ndim < 2 and "no" or
               tostring(Tensor.size(x, 2))))
      end
      local shape = { 1, nw }
      for _ = 3, xc.ndim do shape[#shape + 1] = 1 end
      w = Tensor.reshape(weight, shape)
   elseif Tensor.dim(weight) > 0 then
      w = Tensor.reshape(weight, {})
   end
   return T.where(Tensor.gt(x, 0), x, Tensor.mul(x, w))
end

-- softmin(x, dim) = softmax(-x, dim)
function F.softmin(x, dim)
   float_input("softmin", x)
   return F.softmax(Tensor.neg(x), dim)
end

return F
