-- lumen.functional.activation -- lm.F's activations: relu, sigmoid, tanh (the differentiable
-- Tensor methods) and softmax / log_softmax, with their backward.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local type = type

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
