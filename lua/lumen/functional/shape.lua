-- lumen.functional.shape -- lm.F's shape operators: flatten and cat (their gradients are the
-- Tensor methods' and lumen.autograd's cat's).

local T = require("lumen.tensor")
local H = require("lumen.functional.common")

local tonumber = tonumber

local Tensor, wrap_dim = T.Tensor, T.wrap_dim
local err, tensor_arg = H.err, H.tensor_arg

local F = H.F

-- flatten(x, start_dim = 1, end_dim = -1): a reshape, so a channels-last input is copied into a
-- contiguous result (as PyTorch)
function F.flatten(x, s, e)
   local fname = "flatten"
   local xc = tensor_arg(fname, x, "input")
   local nd = xc.ndim
   if nd == 0 then return Tensor.reshape(x, { 1 }) end
   local s0 = wrap_dim(fname, s == nil and 1 or s, nd)
   local e0 = wrap_dim(fname, e == nil and -1 or e, nd)
   if s0 > e0 then err(fname, "start_dim cannot come after end_dim") end
   if s0 == e0 then return x end
   local sizes = {}
   for i = 0, s0 - 1 do sizes[#sizes + 1] = tonumber(xc.sizes[i]) end
   local m = 1
   for i = s0, e0 do m = m * tonumber(xc.sizes[i]) end
   sizes[#sizes + 1] = m
   for i = e0 + 1, nd - 1 do sizes[#sizes + 1] = tonumber(xc.sizes[i]) end
   return Tensor.reshape(x, sizes)
end

function F.cat(list, dim) return T.cat(list, dim) end
