-- lumen.functional.dropout -- lm.F.dropout with its backward.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tostring, getmetatable = type, tostring, getmetatable

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

-- dropout2d / dropout3d (PyTorch's feature dropout): whole channels zeroed with probability p
-- and the rest scaled by 1 / (1 - p), training only. The mask is N x C x 1 x ... (one draw per
-- sample and channel; an unbatched dropout3d input C x D x H x W draws one per channel),
-- broadcast in a multiply, so the result and its gradient (the same multiply) keep the input's
-- memory format. dropout2d takes 3-D (N, C, L: PyTorch's 1-D channel-wise reading) or 4-D input,
-- dropout3d 4-D (unbatched) or 5-D.
local FEATURE_OPTS = H.option_set("p", "training", "inplace")
local sizebuf = ffi.new("int64_t[8]")

local function feature_dropout(fname, x, p, training, inplace, ranks, unbatched_rank)
   local xc = tensor_arg(fname, x, "input")
   if type(p) == "table" and getmetatable(p) == nil then
      if training ~= nil or inplace ~= nil then
         err(fname, "options table and positional arguments given together")
      end
      local o = H.check_opts(fname, p, FEATURE_OPTS)
      p, training, inplace = o.p, o.training, o.inplace
   end
   if p == nil then p = 0.5 end
   if type(p) ~= "number" or p < 0 or p > 1 or p ~= p then
      err(fname, "dropout probability has to be between 0 and 1, but got " .. tostring(p))
   end
   training = H.bool_opt(fname, training, "training", true)
   inplace = H.bool_opt(fname, inplace, "inplace", false)
   local nd = xc.ndim
   if nd ~= ranks[1] and nd ~= ranks[2] then
      err(fname, ("expected a %d-D or %d-D input, got %d-D"):format(ranks[1], ranks[2], nd))
   end
   check_float(fname, xc, "input")
   if not training or p == 0 then return x end
   -- the mask: one value per (sample, channel)
   local lead = nd == unbatched_rank and 1 or 2
   for d = 0, nd - 1 do sizebuf[d] = d < lead and xc.sizes[d] or 1 end
   outp[0] = nil
   check(C.lm_empty(nd, sizebuf, xc.dtype, 0, xc.device, outp), fname)
   local mask = wrap(outp[0])
   check(C.lm_bernoulli_(mask._c, 1 - p), fname)
   if p < 1 then raw.mul_(mask, 1 / (1 - p)) end
   if inplace then return Tensor.mul_(x, mask) end
   return Tensor.mul(x, mask)
end

-- dropout1d(x, p = 0.5, training = true, inplace = false): whole channels of a (N, C, L) input
-- (or an unbatched (C, L) one) zeroed, as dropout2d
function F.dropout1d(x, p, training, inplace)
   return feature_dropout("dropout1d", x, p, training, inplace, { 2, 3 }, 2)
end
-- dropout2d(x, p = 0.5, training = true, inplace = false) or dropout2d(x, {p =, training =,
-- inplace =})
function F.dropout2d(x, p, training, inplace)
   return feature_dropout("dropout2d", x, p, training, inplace, { 3, 4 }, nil)
end
-- dropout3d(x, p = 0.5, training = true, inplace = false): as dropout2d, 4-D or 5-D input
function F.dropout3d(x, p, training, inplace)
   return feature_dropout("dropout3d", x, p, training, inplace, { 4, 5 }, 4)
end
F._OPTIONS.dropout1d, F._OPTIONS.dropout2d, F._OPTIONS.dropout3d = FEATURE_OPTS, FEATURE_OPTS,
   FEATURE_OPTS
