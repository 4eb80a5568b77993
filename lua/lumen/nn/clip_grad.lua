-- lumen.nn.clip_grad -- PyTorch's torch.nn.utils gradient tools for training loops:
-- clip_grad_norm_, clip_grad_value_, parameters_to_vector, vector_to_parameters. They act on
-- the .grad of each parameter in place, outside autograd (as PyTorch's, under no_grad).

local T = require("lumen.tensor")
local A = require("lumen.autograd")
local creation = require("lumen.creation")

local type, tostring, pairs, ipairs, math = type, tostring, pairs, ipairs, math
local Tensor = T.Tensor

local M = {}

local function fail(fname, msg) T.argerror(fname, msg) end

-- the parameters: one tensor, or a Lua array of tensors (model:parameters())
local function param_list(fname, parameters)
   if T.is_tensor(parameters) then return { parameters } end
   if type(parameters) ~= "table" then
      fail(fname, "parameters must be a tensor or a list of tensors, got " ..
           T.typename(parameters))
   end
   local list = {}
   for i, p in ipairs(parameters) do
      if not T.is_tensor(p) then
         fail(fname, ("parameters[%d] must be a tensor, got %s"):format(i, T.typename(p)))
      end
      list[i] = p
   end
   return list
end

local function number_arg(fname, v, what)
   if type(v) ~= "number" or v ~= v then
      fail(fname, ("%s must be a number, got %s"):format(what, tostring(v)))
   end
   return v
end

-- clip_grad_norm_(parameters, max_norm, norm_type = 2, error_if_nonfinite = false) -> total_norm
-- (also clip_grad_norm_(parameters, max_norm, {norm_type =, error_if_nonfinite =, foreach =})):
-- the norm of all the gradients together (the norm of their norms), returned as a 0-dim tensor;
-- each gradient is then scaled by min(1, max_norm / (total_norm + 1e-6)), as PyTorch's. With no
-- gradient at all it returns 0. norm_type may be math.huge ("inf" also reads as it).
function M.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
   local fname = "clip_grad_norm_"
   local params = param_list(fname, parameters)
   number_arg(fname, max_norm, "max_norm")
   if type(norm_type) == "table" then
      local o = norm_type
      for k in pairs(o) do
         if k ~= "norm_type" and k ~= "error_if_nonfinite" and k ~= "foreach" then
            fail(fname, "unknown option '" .. tostring(k) .. "'")
         end
      end
      norm_type, error_if_nonfinite, foreach = o.norm_type, o.error_if_nonfinite, o.foreach
   end
   local _ = foreach -- PyTorch's foreach picks a kernel, not a result: every way is one here
   if norm_type == nil then norm_type = 2 end
   if norm_type == "inf" then norm_type = math.huge end
   number_arg(fname, norm_type, "norm_type")
   if error_if_nonfinite ~= nil and type(error_if_nonfinite) ~= "boolean" then
      fail(fname, "error_if_nonfinite must be a boolean, got " ..
           T.typename(error_if_nonfinite))
   end
   local grads = {}
   for _, p in ipairs(params) do
      local g = rawget(p, "grad")
      if g ~= nil then grads[#grads + 1] = g end
   end
   if #grads == 0 then return creation.tensor(0.0) end
   return A.no_grad(function()
      local norms = {}
      for i, g in ipairs(grads) do
         if Tensor.device(g) ~= Tensor.device(grads[1]) then
            fail(fname, ("the gradients are on different devices (%s and %s)"):format(
                 Tensor.device(grads[1]), Tensor.device(g)))
         end
         norms[i] = Tensor.to(Tensor.norm(g, norm_type), Tensor.dtype(grads[1]))
      end
      local total = Tensor.norm(T.stack(norms), norm_type)
      if error_if_nonfinite and not Tensor.item(Tensor.isfinite(total)) then
         fail(fname, ("the total norm of order %s of the gradients is non-finite, so it " ..
              "cannot be clipped; pass error_if_nonfinite = false to scale them anyway")
              :format(tostring(norm_type)))
      end
      local coef = Tensor.clamp(Tensor.div(max_norm, Tensor.add(total, 1e-6)), nil, 1)
      for _, g in ipairs(grads) do Tensor.mul_(g, Tensor.to(coef, Tensor.dtype(g))) end
      return total
   end)
end

-- clip_grad_value_(parameters, clip_value): each gradient clamped to [-clip_value, clip_value]
function M.clip_grad_value_(parameters, clip_value)
   local fname = "clip_grad_value_"
   local params = param_list(fname, parameters)
   number_arg(fname, clip_value, "clip_value")
   A.no_grad(function()
      for _, p in ipairs(params) do
         local g = rawget(p, "grad")
         if g ~= nil then Tensor.clamp_(g, -clip_value, clip_value) end
      end
   end)
end

-- parameters_to_vector(parameters): the parameters flattened into one 1-D tensor (a copy)
function M.parameters_to_vector(parameters)
   local fname = "parameters_to_vector"
   local params = param_list(fname, parameters)
   if #params == 0 then fail(fname, "expected at least one parameter") end
   local flat = {}
   for i, p in ipairs(params) do
      if Tensor.device(p) ~= Tensor.device(params[1]) then
         fail(fname, ("the parameters are on different devices (%s and %s)"):format(
              Tensor.device(params[1]), Tensor.device(p)))
      end
      flat[i] = Tensor.reshape(p, { -1 })
   end
   return T.cat(flat, 1)
end

-- vector_to_parameters(vec, parameters): each parameter's values copied in from its slice of vec
function M.vector_to_parameters(vec, parameters)
   local fname = "vector_to_parameters"
   if not T.is_tensor(vec) or Tensor.dim(vec) ~= 1 then
      fail(fname, "vec must be a 1-D tensor, got " ..
           (T.is_tensor(vec) and (Tensor.dim(vec) .. "-D tensor") or T.typename(vec)))
   end
   local params = param_list(fname, parameters)
   local need = 0
   for _, p in ipairs(params) do need = need + Tensor.numel(p) end
   if need ~= Tensor.numel(vec) then
      fail(fname, ("vec has %d elements and the parameters %d"):format(Tensor.numel(vec), need))
   end
   A.no_grad(function()
      local at = 1
      for _, p in ipairs(params) do
         local n = Tensor.numel(p)
         Tensor.copy_(p, Tensor.view_as(Tensor.narrow(vec, 1, at, n), p))
         at = at + n
      end
   end)
end

return M
