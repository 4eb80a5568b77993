-- lumen.optim -- lm.optim: SGD, Adam and AdamW with PyTorch's (1.13) update formulas; RMSprop
-- and Adagrad (lumen.optim.composed).
--
--    local opt = lm.optim.SGD(net:parameters(), {lr = 0.1, momentum = 0.9, weight_decay = 1e-4})
--    opt:zero_grad(); loss:backward(); opt:step()
--
-- State (momentum buffers, Adam moments) is allocated like the parameter (same memory format)
-- and kept per parameter; opt:state_dict() / opt:load_state_dict() save and restore it.

local ffi = require("ffi")
local C = require("lumen.C")
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

-- SGD(params, {lr=, momentum=0, dampening=0, weight_decay=0, nesterov=false, maximize=false,
-- capturable=false})
-- The updates run as one fused C pass per parameter (lm_sgd_step / lm_adam_step) when the
-- gradient and the state have the parameter's dtype (float32 / float64) and layout (dense, same
-- strides) and device (any: lm_sgd_step dispatches to the device's kernel): the usual case.
-- Anything else takes the separate ops below, the reference.

-- may p's update be fused with these tensors (each nil or a tensor)?
local function fusable(p, grad, a, b, c)
   local pc = T.cdata(p)
   if pc == nil or (pc.dtype ~= C.LM_FLOAT32 and pc.dtype ~= C.LM_FLOAT64) then return false end
   if C.lm_is_non_overlapping_and_dense(pc) == 0 then return false end
   local nd = pc.ndim
   for k = 1, 4 do
      local t = k == 1 and grad or k == 2 and a or k == 3 and b or c
      if t ~= nil then
         local tc = T.cdata(t)
         if tc == nil or tc.dtype ~= pc.dtype or tc.device ~= pc.device or tc.ndim ~= nd then
            return false
         end
         for d = 0, nd - 1 do
            if tc.sizes[d] ~= pc.sizes[d] or tc.strides[d] ~= pc.strides[d] then return false end
         end
      end
   end
   return true
end

-- a zero-filled tensor with p's sizes and strides (p non-overlapping and dense)
local function state_like(p)
   local pc = p._c
   local outp = ffi.new("lm_tensor*[1]")
   if C.lm_empty_strided(pc.ndim, pc.sizes, pc.strides, pc.dtype, pc.device, outp) ~= 0 then
      error("lumen.optim: " .. ffi.string(C.lm_last_error()), 0)
   end
   local t = T.wrap(outp[0])
   raw.zero_(t)
   return t
end

local function c_check(st, fname)
   if st ~= 0 then error("lumen." .. fname .. ": " .. ffi.string(C.lm_last_error()), 0) end
end

-- capturable = true (PyTorch's name, from its Adam): the step reads the learning rate from a
-- float64 tensor on the parameters' device when its kernel runs, so a CUDA graph that captured
-- opt:step() (lm.cuda.graph) follows the schedule at each replay. The group's lr stays a number
-- (schedulers and state_dict as before); the device copy is refreshed at each eager step and
-- by the schedulers (Optimizer:_lr_changed) when the lr changed, never inside a capture.
local lr_cells = setmetatable({}, { __mode = "k" }) -- group -> {[device id] = {t =, value =}}

local function capturing(dev)
   local k = dev - T.DEV_CUDA0
   return k >= 0 and k < T.NUM_CUDA and C.lm_cuda_is_capturing(k) == 1
end

local function refresh(cell, lr, dev)
   if cell.value ~= lr and not capturing(dev) then
      raw.fill_(cell.t, lr)
      cell.value = lr
   end
end

-- a new {t =} cell: a float64 scalar tensor on a device, made outside a capture (what: what it
-- holds, for the error)
local function new_cell(fname, dev, what)
   if capturing(dev) then
      error("lumen." .. fname .. ": a capturable optimizer takes one eager step before a CUDA "
            .. "graph captures it (its " .. what .. " tensor is made then)", 0)
   end
   local outp = ffi.new("lm_tensor*[1]")
   if C.lm_empty_strided(0, nil, nil, C.LM_FLOAT64, dev, outp) ~= 0 then
      error("lumen." .. fname .. ": " .. ffi.string(C.lm_last_error()), 0)
   end
   return { t = T.wrap(outp[0]) }
end

local function lr_tensor(group, p, fname)
   local per = lr_cells[group]
   if per == nil then
      per = {}
      lr_cells[group] = per
   end
   local dev = p._c.device
   local cell = per[dev]
   if cell == nil then
      cell = new_cell(fname, dev, "learning rate")
      per[dev] = cell
   end
   refresh(cell, group.lr, dev)
   return cell.t
end

M.SGD = Optimizer.class("SGD", {
   lr = REQUIRED, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false,
   maximize = false, capturable = false,
}, function(group, p, grad, st)
   local wd, momentum, lr = group.weight_decay, group.momentum, group.lr
   local buf = st.momentum_buffer
   local lr_t = group.capturable and lr_tensor(group, p, "SGD.step") or nil
   if fusable(p, grad, buf) then
      local first = false
      if momentum ~= 0 and buf == nil then
         if lr_t and capturing(p._c.device) then
            error("lumen.SGD.step: take one eager step before a CUDA graph captures the "
                  .. "optimizer (the momentum buffers are made then)", 0)
         end
         buf = state_like(p)
         st.momentum_buffer = buf
         first = true
      end
      T.barrier(p._c)                -- the step writes p and its buffer in place
      if buf then T.barrier(buf._c) end
      if lr_t then
         T.barrier(lr_t._c)
         c_check(C.lm_sgd_step_lr(p._c, grad._c, buf and buf._c or nil, lr_t._c, momentum,
                                  group.dampening, wd, group.nesterov and 1 or 0,
                                  group.maximize and 1 or 0, first and 1 or 0), "SGD.step")
      else
         c_check(C.lm_sgd_step(p._c, grad._c, buf and buf._c or nil, lr, momentum,
                               group.dampening, wd, group.nesterov and 1 or 0,
                               group.maximize and 1 or 0, first and 1 or 0), "SGD.step")
      end
      return
   end
   local d_p = grad
   if group.maximize then d_p = raw.neg(d_p) end
   if wd ~= 0 then d_p = raw.add(d_p, p, wd) end
   if momentum ~= 0 then
      buf = st.momentum_buffer
      if buf == nil then
         buf = raw.clone(d_p)
         st.momentum_buffer = buf
      else
         raw.mul_(buf, momentum)
         raw.add_(buf, d_p, 1 - group.dampening)
      end
      if group.nesterov then d_p = raw.add(d_p, buf, momentum) else d_p = buf end
   end
   if lr_t then -- the learning rate from the device, as the fused kernel reads it
      raw.add_(p, raw.mul(d_p, raw.to(lr_t, { dtype = T.Tensor.dtype(p) })), -1)
   else
      raw.add_(p, d_p, -lr)
   end
end, function(fname, group, fail)
   number_opt(fname, group, "lr", fail, 0, nil, "learning rate")
   if type(group.capturable) ~= "boolean" then fail(fname, "capturable must be a boolean") end
   number_opt(fname, group, "momentum", fail, 0, nil, "momentum")
   number_opt(fname, group, "dampening", fail)
   number_opt(fname, group, "weight_decay", fail, 0, nil, "weight_decay")
   if group.nesterov and (group.momentum <= 0 or group.dampening ~= 0) then
      fail(fname, "Nesterov momentum requires a momentum and zero dampening")
   end
end)

-- a scheduler changed the groups' lr: the capturable groups' device copies follow at once, so a
-- CUDA graph's next replay uses the new value
local function lr_changed(self)
   for _, g in ipairs(self.param_groups) do
      local per = lr_cells[g]
      if per then
         for dev, cell in pairs(per) do refresh(cell, g.lr, dev) end
      end
   end
end
M.SGD._lr_changed = lr_changed

---------------------------------------------------------------------------------------------
-- Adam / AdamW
---------------------------------------------------------------------------------------------

-- capturable = true (PyTorch's option): the learning rate (as SGD's, above) and the step count
-- live in float64 tensors on the parameter's device, read by the fused kernel when it runs, and
-- the count is incremented there by a kernel: a CUDA graph that captured opt:step() takes the
-- right bias corrections at every replay. st.step, the count state_dict saves, is read back
-- from the device by state_dict (Optimizer:_sync_state); a count changed on the host
-- (load_state_dict) is written to the device at the next eager step.
local step_cells = setmetatable({}, { __mode = "k" }) -- state table -> {t =, host =}

local function step_tensor(st, p, fname)
   local cell = step_cells[st]
   local dev = p._c.device
   if cell == nil then
      cell = new_cell(fname, dev, "step count")
      step_cells[st] = cell
   end
   if cell.host ~= st.step and not capturing(dev) then
      raw.fill_(cell.t, st.step)
      cell.host = st.step
   end
   return cell
end

local function adam_update(decoupled)
   local fname = decoupled and "AdamW.step" or "Adam.step"
   return function(group, p, grad, st)
      local lr, wd, eps = group.lr, group.weight_decay, group.eps
      local b1, b2 = group.betas[1], group.betas[2]
      if st.step == nil then
         if group.capturable and capturing(p._c.device) then
            error("lumen." .. fname .. ": a capturable optimizer takes one eager step before a "
                  .. "CUDA graph captures it (its state is made then)", 0)
         end
         st.step = 0
         st.exp_avg = raw.zero_(raw.clone(p))         -- zeros in the parameter's layout
         st.exp_avg_sq = raw.zero_(raw.clone(p))
         if group.amsgrad then st.max_exp_avg_sq = raw.zero_(raw.clone(p)) end
      end
      local cell = group.capturable and step_tensor(st, p, fname) or nil
      st.step = st.step + 1
      local step = st.step
      local mx = group.amsgrad and st.max_exp_avg_sq or nil
      local fused = (mx ~= nil or not group.amsgrad) and
                    fusable(p, grad, st.exp_avg, st.exp_avg_sq, mx)
      if cell then
         raw.add_(cell.t, 1)     -- on the device: a captured step counts at every replay
         cell.host = st.step
         if not fused and capturing(p._c.device) then
            error("lumen." .. fname .. ": a capturable step is captured only for parameters "
                  .. "whose gradient and state share their dtype and layout", 0)
         end
      end
      if fused then
         T.barrier(p._c)             -- the step writes p and its state in place
         T.barrier(st.exp_avg._c)
         T.barrier(st.exp_avg_sq._c)
         if mx ~= nil then T.barrier(mx._c) end
         if cell then
            local lr_t = lr_tensor(group, p, fname)
            T.barrier(lr_t._c)
            T.barrier(cell.t._c)
            c_check(C.lm_adam_step_dev(p._c, grad._c, st.exp_avg._c, st.exp_avg_sq._c,
                                       mx and mx._c or nil, lr_t._c, cell.t._c, b1, b2, eps, wd,
                                       decoupled and 1 or 0, group.maximize and 1 or 0), fname)
         else
            c_check(C.lm_adam_step(p._c, grad._c, st.exp_avg._c, st.exp_avg_sq._c,
                                   mx and mx._c or nil, lr, b1, b2, eps, wd,
                                   decoupled and 1 or 0, group.maximize and 1 or 0, step),
                    fname)
         end
         return
      end
      if group.maximize then grad = raw.neg(grad) end
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
         mx = st.max_exp_avg_sq
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
   if type(group.capturable) ~= "boolean" then fail(fname, "capturable must be a boolean") end
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
--      maximize=false, capturable=false})
M.Adam = Optimizer.class("Adam", {
   lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, amsgrad = false,
   maximize = false, capturable = false,
}, adam_update(false), adam_validate)

-- AdamW: Adam with decoupled weight decay (default 1e-2)
M.AdamW = Optimizer.class("AdamW", {
   lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, amsgrad = false,
   maximize = false, capturable = false,
}, adam_update(true), adam_validate)

-- the step counts a capturable Adam keeps on the device, back into st.step (before state_dict)
local function sync_steps(self)
   for _, st in pairs(self.state) do
      local cell = step_cells[st]
      if cell and st.step ~= nil and not capturing(cell.t._c.device) then
         local v = T.Tensor.item(cell.t)
         st.step = math.floor(v + 0.5)
         cell.host = st.step
      end
   end
end
for _, cls in ipairs({ M.Adam, M.AdamW }) do
   cls._lr_changed = lr_changed
   cls._sync_state = sync_steps
end

-- RMSprop and Adagrad, composed from tensor ops (lua/lumen/optim/composed.lua)
do
   local composed = require("lumen.optim.composed")
   M.RMSprop, M.Adagrad = composed.RMSprop, composed.Adagrad
end

-- lm.optim.lr_scheduler: PyTorch's learning-rate schedules (lua/lumen/optim/lr_scheduler.lua)
M.lr_scheduler = require("lumen.optim.lr_scheduler")

return M
