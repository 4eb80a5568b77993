-- lumen.functional.dropout -- lm.F.dropout with its backward.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tostring = type, tostring

local Tensor, raw, wrap = T.Tensor, T.raw, T.wrap
local needs, record = A.needs, A.record
local err, check, tensor_arg, check_float = H.err, H.check, H.tensor_arg, H.check_float

local F = H.F

local outp = ffi.new("lm_tensor*[1]")

-- dropout(x, p = 0.5, training = true): zeroes elements with probability p (lm_bernoulli_ on the
-- global generator) and scales the rest by 1 / (1 - p); the identity when not training
function F.dropout(x, p, training)
   local fname = "dropout"
   local xc = tensor_arg(fname, x, "input")
   if p == nil then p = 0.5 end
   if type(p) ~= "number" or p < 0 or p > 1 or p ~= p then
      err(fname, "dropout probability has to be between 0 and 1, but got " .. tostring(p))
   end
   if training == nil then training = true end
   if not training or p == 0 then return x end
   check_float(fname, xc, "input")
   if p == 1 then return Tensor.mul(x, 0) end
   outp[0] = nil
   check(C.lm_empty_like(xc, -1, 3, outp), fname)
   local mask = wrap(outp[0])
   check(C.lm_bernoulli_(mask._c, 1 - p), fname)
   raw.mul_(mask, 1 / (1 - p))
   local out = raw.mul(x, mask)
   if A.is_grad_enabled() and needs(x) then
      record(out, "MulBackward", function(g) return raw.mul(g, mask) end, x)
   end
   return out
end
