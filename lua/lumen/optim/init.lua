-- lumen.optim -- lm.optim: SGD, Adam and AdamW with PyTorch's (1.13) update formulas.
--
--    local opt = lm.optim.SGD(net:parameters(), {lr = 0.1, momentum = 0.9, weight_decay = 1e-4})
--    opt:zero_grad(); loss:backward(); opt:step()
--
-- State (momentum buffers, Adam moments) is allocated like the parameter (same memory format)
-- and kept per parameter; opt:state_dict() / opt:load_state_dict() save and restore it.

local T = require("lumen.tensor")
local Optimizer = require("lumen.optim.optimizer")

local sqrt, type = math.sqrt, type
local raw = T.raw
local REQUIRED = Optimizer.REQUIRED

local M = { Optimizer = Optimizer }

local function number_opt(fname, group, k, fail, min, max, what)
   local v = group[k]
   if type(v) ~= "number" or v ~= v then fail(fname, k .. " must be a number") end
   if (min and v < min) or (max and v > max) then
      fail(fname, "invalid " .. (what or k) .. " value: " .. tostring(v))
   end
end

---------------------------------------------------------------------------------------------
-- SGD
---------------------------------------------------------------------------------------------

-- SGD(params, {lr=, momentum=0, dampening=0, weight_decay=0, nesterov=false, maximize=false})
M.SGD = Optimizer.class("SGD", {
   lr = REQUIRED, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
   maximize = false,
}, function(group, p, grad, st)
   local wd, momentum, lr = group.weight_decay, group.momentum, group.lr
   local d_p = grad
   if group.maximize then d_p = raw.neg(d_p) end
   if wd ~= 0 then d_p = raw.add(d_p, p, wd) end
   if momentum ~= 0 then
      local buf = st.momentum_buffer
      if buf == nil then
         buf = raw.clone(d_p)
         st.momentum_buffer = buf
      else
         raw.mul_(buf, momentum)
         raw.add_(buf, d_p, 1 - group.dampening)
      end
      if group.nesterov then d_p = raw.add(d_p, buf, momentum) else d_p = buf end
   end
   raw.add_(p, d_p, -lr)
end, function(fname, group, fail)
   number_opt(fname, group, "lr", fail, 0, nil, "learning rate")
   number_opt(fname, group, "momentum", fail, 0, nil, "momentum")
   number_opt(fname, group, "dampening", fail)
   number_opt(fname, group, "weight_decay", fail, 0, nil, "weight_decay")
   if group.nesterov and (group.momentum <= 0 or group.dampening ~= 0) then
      fail(fname, "Nesterov momentum requires a momentum and zero dampening")
   end
end)

---------------------------------------------------------------------------------------------
-- Adam / AdamW
---------------------------------------------------------------------------------------------

local function adam_update(decoupled)
   return function(group, p, grad, st)
      local lr, wd, eps = group.lr, group.weight_decay, group.eps
      local b1, b2 = group.betas[1], group.betas[2]
      if group.maximize then grad = raw.neg(grad) end
      if st.step == nil then
         st.step = 0
         st.exp_avg = raw.zero_(raw.clone(p))         -- zeros in the parameter's layout
         st.exp_avg_sq = raw.zero_(raw.clone(p))
         if group.amsgrad then st.max_exp_avg_sq = raw.zero_(raw.clone(p)) end
      end
      st.step = st.step + 1
      local step = st.step
      if wd ~= 0 then
         if decoupled then raw.mul_(p, 1 - lr * wd)
         else grad = raw.add(grad, p, wd) end
      end
      local m, v = st.exp_avg, st.exp_avg_sq
      raw.mul_(m, b1)
      raw.add_(m, grad, 1 - b1)
      raw.mul_(v, b2)
      raw.addcmul_(v, grad, grad, 1 - b2)
      local bc1 = 1 - b1 ^ step
      local bc2_sqrt = sqrt(1 - b2 ^ step)
      local step_size = lr / bc1
      local denom
      if group.amsgrad then
         local mx = st.max_exp_avg_sq
         raw.copy_(mx, raw.maximum(mx, v))
         denom = raw.sqrt(mx)
      else
         denom = raw.sqrt(v)
      end
      raw.div_(denom, bc2_sqrt)
      raw.add_(denom, eps)
      raw.addcdiv_(p, m, denom, -step_size)
   end
end

local function adam_validate(fname, group, fail)
   number_opt(fname, group, "lr", fail, 0, nil, "learning rate")
   number_opt(fname, group, "eps", fail, 0, nil, "epsilon")
   number_opt(fname, group, "weight_decay", fail, 0, nil, "weight_decay")
   local b = group.betas
   if type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
      fail(fname, "betas must be a table {beta1, beta2}")
   end
   if b[1] < 0 or b[1] >= 1 then fail(fname, "invalid beta parameter at index 1: " .. b[1]) end
   if b[2] < 0 or b[2] >= 1 then fail(fname, "invalid beta parameter at index 2: " .. b[2]) end
end

-- Adam(params, {lr=1e-3, betas={0.9, 0.999}, eps=1e-8, weight_decay=0, amsgrad=false,
--      maximize=false})
M.Adam = Optimizer.class("Adam", {
   lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, amsgrad = false,
   maximize = false,
}, adam_update(false), adam_validate)

-- AdamW: Adam with decoupled weight decay (default 1e-2)
M.AdamW = Optimizer.class("AdamW", {
   lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, amsgrad = false,
   maximize = false,
}, adam_update(true), adam_validate)

return M
