-- lumen.ops -- lm.ops: torchvision.ops' operators that models use (issue 40):
-- stochastic_depth and the StochasticDepth module.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local H = require("lumen.functional.common")
local Module = require("lumen.nn.module")

local type, tostring = type, tostring

local Tensor, raw, wrap = T.Tensor, T.raw, T.wrap
local err, check, tensor_arg, check_float = H.err, H.check, H.tensor_arg, H.check_float

local M = {}

local outp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")

local function check_p(fname, p)
   if type(p) ~= "number" or p < 0 or p > 1 or p ~= p then
      err(fname, "drop probability has to be between 0 and 1, but got " .. tostring(p))
   end
end

local function check_mode(fname, mode)
   if mode ~= "row" and mode ~= "batch" then
      err(fname, "mode has to be either \"batch\" or \"row\", but got " ..
          (type(mode) == "string" and ("\"" .. mode .. "\"") or T.typename(mode)))
   end
end

-- stochastic_depth(x, p, mode = "row", training = true) (torchvision.ops.stochastic_depth):
-- "row" zeroes whole samples (a mask N x 1 x ... x 1), "batch" the whole input, each with
-- probability p, and scales what survives by 1 / (1 - p); the identity when not training or p is
-- 0. A broadcast multiply: the result and its gradient keep the input's memory format.
function M.stochastic_depth(x, p, mode, training)
   local fname = "ops.stochastic_depth"
   local xc = tensor_arg(fname, x, "input")
   check_p(fname, p)
   if mode == nil then mode = "row" end
   check_mode(fname, mode)
   training = H.bool_opt(fname, training, "training", true)
   check_float(fname, xc, "input")
   if not training or p == 0 then return x end
   local nd = xc.ndim
   if nd == 0 and mode == "row" then err(fname, "\"row\" mode needs an input of at least 1 dim") end
   for d = 0, nd - 1 do sizebuf[d] = (d == 0 and mode == "row") and xc.sizes[0] or 1 end
   outp[0] = nil
   check(C.lm_empty(nd, sizebuf, xc.dtype, 0, xc.device, outp), fname)
   local noise = wrap(outp[0])
   check(C.lm_bernoulli_(noise._c, 1 - p), fname)
   if p < 1 then raw.div_(noise, 1 - p) end
   return Tensor.mul(x, noise)
end

-- StochasticDepth(p, mode = "row") (torchvision.ops.StochasticDepth): stochastic_depth while
-- training
local StochasticDepth = Module:extend("StochasticDepth")
M.StochasticDepth = StochasticDepth
function StochasticDepth:__init(p, mode)
   check_p("StochasticDepth", p)
   if mode == nil then mode = "row" end
   check_mode("StochasticDepth", mode)
   self.p, self.mode = p, mode
end
function StochasticDepth:forward(x)
   return M.stochastic_depth(x, self.p, self.mode, self.training)
end
function StochasticDepth:extra_repr()
   return ("p=%s, mode=%s"):format(tostring(self.p), self.mode)
end

return M
