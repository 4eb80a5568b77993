-- lumen.optim.composed -- RMSprop and Adagrad, with PyTorch's single-tensor update formulas
-- (torch/optim/rmsprop.py, adagrad.py), composed from in-place tensor ops: no kernel of their
-- own, so every device, dtype and layout the ops take. State tensors are made like the
-- parameter (its memory format), as the other optimizers'.
--
--    -- torchvision's MobileNet V3 recipe
--    local opt = lm.optim.RMSprop(model, {lr = 0.016, alpha = 0.9, eps = 0.0316, momentum = 0.9,
--                                        weight_decay = 1e-5})

local T = require("lumen.tensor")
local Optimizer = require("lumen.optim.optimizer")

local type, tostring = type, tostring
local raw = T.raw

local M = {}

local function number_opt(fname, group, k, fail, min, what)
   local v = group[k]
   if type(v) ~= "number" or v ~= v then fail(fname, k .. " must be a number") end
   if min and v < min then fail(fname, "invalid " .. (what or k) .. " value: " .. tostring(v)) end
end

-- zeros (or v) in p's layout
local function like(p, v)
   local t = raw.clone(p)
   if v == nil or v == 0 then return raw.zero_(t) end
   return raw.fill_(t, v)
end

-- RMSprop(params, {lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0,
--         centered = false, maximize = false})
M.RMSprop = Optimizer.class("RMSprop", {
   lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0, centered = false,
   maximize = false,
}, function(group, p, grad, st)
   local lr, alpha, eps, wd, mom = group.lr, group.alpha, group.eps, group.weight_decay,
      group.momentum
   if st.step == nil then
      st.step = 0
      st.square_avg = like(p)
      if mom > 0 then st.momentum_buffer = like(p) end
      if group.centered then st.grad_avg = like(p) end
   end
   st.step = st.step + 1
   if group.maximize then grad = raw.neg(grad) end
   if wd ~= 0 then grad = raw.add(grad, p, wd) end
   local sq = st.square_avg
   raw.mul_(sq, alpha)
   raw.addcmul_(sq, grad, grad, 1 - alpha)
   local avg
   if group.centered then
      local ga = st.grad_avg
      -- ga.lerp_(grad, 1 - alpha): ga + (1 - alpha) (grad - ga)
      raw.add_(ga, raw.sub(grad, ga), 1 - alpha)
      avg = raw.sqrt_(raw.addcmul(sq, ga, ga, -1))
   else
      avg = raw.sqrt(sq)
   end
   raw.add_(avg, eps)
   if mom > 0 then
      local buf = st.momentum_buffer
      raw.mul_(buf, mom)
      raw.addcdiv_(buf, grad, avg, 1)
      raw.add_(p, buf, -lr)
   else
      raw.addcdiv_(p, grad, avg, -lr)
   end
end, function(fname, group, fail)
   number_opt(fname, group, "lr", fail, 0, "learning rate")
   number_opt(fname, group, "alpha", fail, 0, "alpha")
   number_opt(fname, group, "eps", fail, 0, "epsilon")
   number_opt(fname, group, "weight_decay", fail, 0, "weight_decay")
   number_opt(fname, group, "momentum", fail, 0, "momentum")
end)

-- Adagrad(params, {lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0,
--         eps = 1e-10, maximize = false})
M.Adagrad = Optimizer.class("Adagrad", {
   lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10,
   maximize = false,
}, function(group, p, grad, st)
   if st.step == nil then
      st.step = 0
      st.sum = like(p, group.initial_accumulator_value)
   end
   st.step = st.step + 1
   if group.maximize then grad = raw.neg(grad) end
   if group.weight_decay ~= 0 then grad = raw.add(grad, p, group.weight_decay) end
   local clr = group.lr / (1 + (st.step - 1) * group.lr_decay)
   raw.addcmul_(st.sum, grad, grad, 1)
   local std = raw.add_(raw.sqrt(st.sum), group.eps)
   raw.addcdiv_(p, grad, std, -clr)
end, function(fname, group, fail)
   number_opt(fname, group, "lr", fail, 0, "learning rate")
   number_opt(fname, group, "lr_decay", fail, 0, "lr_decay")
   number_opt(fname, group, "weight_decay", fail, 0, "weight_decay")
   number_opt(fname, group, "initial_accumulator_value", fail, 0, "initial_accumulator_value")
   number_opt(fname, group, "eps", fail, 0, "epsilon")
end)

return M
