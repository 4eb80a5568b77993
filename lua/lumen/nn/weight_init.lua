-- lumen.nn.weight_init -- lm.nn.init: in-place initialisers with PyTorch's formulas
-- (torch.nn.init). All run with autograd off and return the tensor.

local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local util = require("lumen.util")

local sqrt, type, tostring = math.sqrt, type, tostring
local Tensor = T.Tensor

local M = {}

local function fail(fname, msg)
   error("lumen.nn.init." .. fname .. ": " .. msg, T.user_level and T.user_level() or 3)
end

local function tensor_arg(fname, t)
   if not T.is_tensor(t) then fail(fname, "tensor expected, got " .. T.typename(t)) end
   if not Tensor.is_floating_point(t) then
      fail(fname, "expected a floating point tensor, got " .. tostring(Tensor.dtype(t)))
   end
   local c = T.cdata(t)
   T.barrier(c)                    -- it is about to be overwritten
   return c
end

local function ccheck(st, fname)
   if st ~= 0 then fail(fname, require("ffi").string(C.lm_last_error())) end
end

-- fan_in, fan_out of a weight (out, in, k...) as PyTorch computes them
function M.calculate_fan_in_and_fan_out(t)
   local d = Tensor.dim(t)
   if d < 2 then
      fail("calculate_fan_in_and_fan_out", "fan in and fan out can not be computed for a " ..
           "tensor with fewer than 2 dimensions")
   end
   local s = Tensor.size(t)
   local rf = 1
   for i = 3, d do rf = rf * s[i] end
   return s[2] * rf, s[1] * rf
end

function M.calculate_gain(nonlinearity, param)
   nonlinearity = nonlinearity or "leaky_relu"
   if nonlinearity == "linear" or nonlinearity == "sigmoid" or nonlinearity:match("^conv") then
      return 1
   elseif nonlinearity == "tanh" then return 5 / 3
   elseif nonlinearity == "relu" then return sqrt(2)
   elseif nonlinearity == "leaky_relu" then
      local slope = param or 0.01
      return sqrt(2 / (1 + slope * slope))
   elseif nonlinearity == "selu" then return 3 / 4 end
   fail("calculate_gain", "unsupported nonlinearity " .. tostring(nonlinearity))
end

function M.uniform_(t, a, b)
   local c = tensor_arg("uniform_", t)
   a, b = a or 0, b or 1
   A.no_grad(function() ccheck(C.lm_uniform_(c, a, b), "uniform_") end)
   return t
end

function M.normal_(t, mean, std)
   local c = tensor_arg("normal_", t)
   mean, std = mean or 0, std or 1
   A.no_grad(function() ccheck(C.lm_normal_(c, mean, std), "normal_") end)
   return t
end

function M.constant_(t, v)
   local c = tensor_arg("constant_", t)
   if type(v) ~= "number" then fail("constant_", "val must be a number, got " .. T.typename(v)) end
   if not T.fits_dtype(v, c.dtype, true) then
      fail("constant_", "value cannot be converted to type " .. tostring(Tensor.dtype(t)) ..
           " without overflow")
   end
   ccheck(C.lm_fill_(c, v), "constant_")
   return t
end
function M.zeros_(t) return M.constant_(t, 0) end
function M.ones_(t) return M.constant_(t, 1) end

-- kaiming options: (t, a, mode, nonlinearity) or (t, {a=, mode=, nonlinearity=})
local KAIMING_OPTS = util.option_set("a", "mode", "nonlinearity")
local function kaiming_args(fname, a, mode, nonlinearity)
   if type(a) == "table" then
      local k = util.unknown_option(a, KAIMING_OPTS)
      if k ~= nil then fail(fname, util.unknown_option_msg(k)) end
      return a.a or 0, a.mode or "fan_in", a.nonlinearity or "leaky_relu"
   end
   return a or 0, mode or "fan_in", nonlinearity or "leaky_relu"
end

local function fan(fname, t, mode)
   local fin, fout = M.calculate_fan_in_and_fan_out(t)
   if mode == "fan_in" then return fin end
   if mode == "fan_out" then return fout end
   fail(fname, "mode " .. tostring(mode) .. " not supported, use fan_in or fan_out")
end

function M.kaiming_uniform_(t, a, mode, nonlinearity)
   tensor_arg("kaiming_uniform_", t)
   a, mode, nonlinearity = kaiming_args("kaiming_uniform_", a, mode, nonlinearity)
   local f = fan("kaiming_uniform_", t, mode)
   local std = M.calculate_gain(nonlinearity, a) / sqrt(f)
   local bound = sqrt(3) * std
   return M.uniform_(t, -bound, bound)
end

function M.kaiming_normal_(t, a, mode, nonlinearity)
   tensor_arg("kaiming_normal_", t)
   a, mode, nonlinearity = kaiming_args("kaiming_normal_", a, mode, nonlinearity)
   local f = fan("kaiming_normal_", t, mode)
   return M.normal_(t, 0, M.calculate_gain(nonlinearity, a) / sqrt(f))
end

function M.xavier_uniform_(t, gain)
   tensor_arg("xavier_uniform_", t)
   local fin, fout = M.calculate_fan_in_and_fan_out(t)
   local std = (gain or 1) * sqrt(2 / (fin + fout))
   local a = sqrt(3) * std
   return M.uniform_(t, -a, a)
end

function M.xavier_normal_(t, gain)
   tensor_arg("xavier_normal_", t)
   local fin, fout = M.calculate_fan_in_and_fan_out(t)
   return M.normal_(t, 0, (gain or 1) * sqrt(2 / (fin + fout)))
end

return M
