-- lumen.optim.lr_scheduler -- lm.optim.lr_scheduler: PyTorch's learning-rate schedules, step by
-- step the same values (PyTorch 2.x's formulas, in the same order of floating-point operations:
-- spec/lr_scheduler_spec.lua checks them against spec/fixtures/lr_scheduler/cases.lua).
--
--    local opt = lm.optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
--    local sched = lm.optim.lr_scheduler.StepLR(opt, {step_size = 30, gamma = 0.1})
--    for epoch = 1, 90 do
--       train(...)                 -- opt:step() every batch
--       sched:step()               -- once per epoch (OneCycleLR: once per batch)
--    end
--    sched:get_last_lr()           -- {lr of group 1, ...}
--
-- Options are PyTorch's keyword arguments, by the same names (../shared/API.md, third wave), plus
-- last_epoch (default -1). Each scheduler sets opt.param_groups[i].lr (OneCycleLR also the
-- momentum, or beta1 for Adam) exactly as PyTorch's does. sched:state_dict() is a plain table
-- (numbers, strings, booleans, nested tables: lm.save_checkpoint saves it);
-- sched:load_state_dict(sd) restores it into a scheduler built on the same optimizer.

local T = require("lumen.tensor")

local type, pairs, ipairs, tostring, error, setmetatable, getmetatable =
   type, pairs, ipairs, tostring, error, setmetatable, getmetatable
local floor, cos, pi, huge, max, min, log =
   math.floor, math.cos, math.pi, math.huge, math.max, math.min, math.log

local M = {}

local function fail(fname, msg, ...)
   error(("lumen.optim.lr_scheduler.%s: " .. msg):format(fname, ...), T.user_level())
end

local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end

local function is_optimizer(x)
   return type(x) == "table" and type(x.param_groups) == "table" and type(x.step) == "function"
end

local function deep_copy(v)
   if type(v) ~= "table" then return v end
   local r = {}
   for k, x in pairs(v) do r[k] = deep_copy(x) end
   return r
end

local function lr_list(opt)
   local r = {}
   for i, g in ipairs(opt.param_groups) do r[i] = g.lr end
   return r
end

-- the groups' lr changed: an optimizer that keeps a device copy of it (SGD with capturable =
-- true, for CUDA graphs) updates it now
local function lr_changed(opt)
   if opt._lr_changed then opt:_lr_changed() end
end

-- option checks --------------------------------------------------------------------------------

local function check_opts(fname, opts, known)
   if opts == nil then opts = {} end
   if not plain_table(opts) then
      fail(fname, "options must be a table, got %s", T.typename(opts))
   end
   for k in pairs(opts) do
      if not known[k] then fail(fname, "unknown option '%s'", tostring(k)) end
   end
   return opts
end

local function num(fname, v, name, lo, hi, lo_open)
   if type(v) ~= "number" or v ~= v then
      fail(fname, "%s must be a number, got %s", name, T.typename(v))
   end
   if (lo and (v < lo or (lo_open and v == lo))) or (hi and v > hi) then
      fail(fname, "invalid %s: %s", name, tostring(v))
   end
   return v
end

local function int(fname, v, name, lo)
   if type(v) ~= "number" or v % 1 ~= 0 then
      fail(fname, "%s must be an integer, got %s", name, type(v) == "number" and tostring(v) or
           T.typename(v))
   end
   if lo and v < lo then fail(fname, "%s must be >= %d, got %d", name, lo, v) end
   return v
end

-- a number, or an array with one per parameter group (PyTorch's _format_param)
local function per_group(fname, opt, v, name)
   local n = #opt.param_groups
   if type(v) == "table" then
      if #v ~= n then fail(fname, "expected %d values for %s, got %d", n, name, #v) end
      local r = {}
      for i = 1, n do r[i] = num(fname, v[i], name) end
      return r
   end
   num(fname, v, name)
   local r = {}
   for i = 1, n do r[i] = v end
   return r
end

---------------------------------------------------------------------------------------------
-- the base class (PyTorch's LRScheduler)
---------------------------------------------------------------------------------------------

local Base = {}
Base.__index = Base
M.LRScheduler = Base

-- a class: cls(opt, opts) builds a scheduler
local function class(name, known)
   local cls = setmetatable({}, { __index = Base })
   cls.__index = cls
   cls.__name = name
   cls.__tostring = Base.__tostring
   known.last_epoch = true
   cls._known = known
   return setmetatable(cls, { __index = Base, __call = function(c, opt, opts)
      if not is_optimizer(opt) then
         fail(name, "expected an optimizer (lm.optim.SGD, Adam, ...), got %s", T.typename(opt))
      end
      opts = check_opts(name, opts, c._known)
      local self = setmetatable({ optimizer = opt }, c)
      c._init(self, opt, opts)
      return self
   end })
end

function Base._base_init(self, opt, last_epoch)
   local fname = self.__name
   last_epoch = int(fname, last_epoch == nil and -1 or last_epoch, "last_epoch", -1)
   if last_epoch == -1 then
      for _, g in ipairs(opt.param_groups) do
         if g.initial_lr == nil then g.initial_lr = g.lr end
      end
   else
      for i, g in ipairs(opt.param_groups) do
         if g.initial_lr == nil then
            fail(fname, "param 'initial_lr' is not specified in param_groups[%d] when resuming " ..
                 "with last_epoch >= 0 (load the optimizer's state first)", i)
         end
      end
   end
   self.base_lrs = {}
   for i, g in ipairs(opt.param_groups) do self.base_lrs[i] = g.initial_lr end
   self.last_epoch = last_epoch
   self:_initial_step()
end

function Base:_initial_step()
   self._step_count = 0
   self._is_initial = true
   self:step()
   self._is_initial = false
end

--- sched:step(): one step of the schedule (after opt:step(); once per epoch, or per batch for
--- OneCycleLR), setting every group's lr
function Base:step(epoch)
   if epoch ~= nil then
      fail(self.__name, "step(epoch) is deprecated in PyTorch and not supported: call step()")
   end
   self._step_count = self._step_count + 1
   self:_update_lr(nil)
end

function Base:_update_lr(epoch)
   local values
   if epoch == nil then
      self.last_epoch = self.last_epoch + 1
      values = self:get_lr()
   else
      self.last_epoch = epoch
      if self._get_closed_form_lr then values = self:_get_closed_form_lr()
      else values = self:get_lr() end
   end
   for i, g in ipairs(self.optimizer.param_groups) do g.lr = values[i] end
   lr_changed(self.optimizer)
   self._last_lr = lr_list(self.optimizer)
end

--- sched:get_last_lr() -> array: the lr of each parameter group after the last step
function Base:get_last_lr()
   local r = {}
   for i, v in ipairs(self._last_lr) do r[i] = v end
   return r
end

-- the fields state_dict leaves out (the optimizer; functions)
local NOT_STATE = { optimizer = true, lr_lambdas = true, _schedulers = true }

--- sched:state_dict() -> table: every field but the optimizer (PyTorch's __dict__)
function Base:state_dict()
   local sd = {}
   for k, v in pairs(self) do
      if not NOT_STATE[k] and type(v) ~= "function" then sd[k] = deep_copy(v) end
   end
   return sd
end

--- sched:load_state_dict(sd): restores what state_dict returned
function Base:load_state_dict(sd)
   local fname = self.__name .. ".load_state_dict"
   if not plain_table(sd) then fail(fname, "expected a table from state_dict(), got %s",
                                    T.typename(sd)) end
   for k, v in pairs(sd) do
      if not NOT_STATE[k] then self[k] = deep_copy(v) end
   end
end

function Base:__tostring()
   local lrs = {}
   for i, v in ipairs(self._last_lr or {}) do lrs[i] = ("%.6g"):format(v) end
   return ("%s (last_epoch %s, lr {%s})"):format(self.__name, tostring(self.last_epoch),
                                                 table.concat(lrs, ", "))
end

local function group_lrs(self)
   return lr_list(self.optimizer)
end

---------------------------------------------------------------------------------------------
-- the schedules
---------------------------------------------------------------------------------------------

M.LambdaLR = class("LambdaLR", { lr_lambda = true })
function M.LambdaLR._init(self, opt, o)
   local f = o.lr_lambda
   local n = #opt.param_groups
   self.lr_lambdas = {}
   if type(f) == "function" then
      for i = 1, n do self.lr_lambdas[i] = f end
   elseif plain_table(f) then
      if #f ~= n then fail("LambdaLR", "expected %d lr_lambdas, but got %d", n, #f) end
      for i = 1, n do
         if type(f[i]) ~= "function" then
            fail("LambdaLR", "lr_lambda[%d] should be a function, but got %s", i,
                 T.typename(f[i]))
         end
         self.lr_lambdas[i] = f[i]
      end
   else
      fail("LambdaLR", "lr_lambda must be a function(epoch) -> factor (or one per group), " ..
           "got %s", T.typename(f))
   end
   Base._base_init(self, opt, o.last_epoch)
end
function M.LambdaLR:get_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do r[i] = base * self.lr_lambdas[i](self.last_epoch) end
   return r
end

M.StepLR = class("StepLR", { step_size = true, gamma = true })
function M.StepLR._init(self, opt, o)
   if o.step_size == nil then fail("StepLR", "step_size is required") end
   self.step_size = int("StepLR", o.step_size, "step_size", 1)
   self.gamma = num("StepLR", o.gamma == nil and 0.1 or o.gamma, "gamma")
   Base._base_init(self, opt, o.last_epoch)
end
function M.StepLR:get_lr()
   if self.last_epoch == 0 or self.last_epoch % self.step_size ~= 0 then return group_lrs(self) end
   local r = {}
   for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * self.gamma end
   return r
end
function M.StepLR:_get_closed_form_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do
      r[i] = base * self.gamma ^ floor(self.last_epoch / self.step_size)
   end
   return r
end

M.MultiStepLR = class("MultiStepLR", { milestones = true, gamma = true })
function M.MultiStepLR._init(self, opt, o)
   if not plain_table(o.milestones) then
      fail("MultiStepLR", "milestones must be an array of epochs, got %s",
           T.typename(o.milestones))
   end
   -- a Counter, as PyTorch's: milestone -> how many times it is listed
   self.milestones = {}
   for i, m in ipairs(o.milestones) do
      int("MultiStepLR", m, "milestones[" .. i .. "]")
      self.milestones[m] = (self.milestones[m] or 0) + 1
   end
   self.gamma = num("MultiStepLR", o.gamma == nil and 0.1 or o.gamma, "gamma")
   Base._base_init(self, opt, o.last_epoch)
end
function M.MultiStepLR:get_lr()
   local n = self.milestones[self.last_epoch]
   if n == nil then return group_lrs(self) end
   local r = {}
   for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * self.gamma ^ n end
   return r
end
function M.MultiStepLR:_get_closed_form_lr()
   local passed = 0
   for m, n in pairs(self.milestones) do
      if m <= self.last_epoch then passed = passed + n end
   end
   local r = {}
   for i, base in ipairs(self.base_lrs) do r[i] = base * self.gamma ^ passed end
   return r
end

M.LinearLR = class("LinearLR", { start_factor = true, end_factor = true, total_iters = true })
function M.LinearLR._init(self, opt, o)
   local sf = num("LinearLR", o.start_factor == nil and 1.0 / 3 or o.start_factor,
                  "start_factor")
   if sf > 1.0 or sf <= 0 then
      fail("LinearLR", "start_factor expected to be greater than 0 and less or equal to 1, " ..
           "got %s", tostring(sf))
   end
   local ef = num("LinearLR", o.end_factor == nil and 1.0 or o.end_factor, "end_factor")
   if ef > 1.0 or ef < 0 then
      fail("LinearLR", "end_factor expected to be between 0 and 1, got %s", tostring(ef))
   end
   self.start_factor, self.end_factor = sf, ef
   self.total_iters = int("LinearLR", o.total_iters == nil and 5 or o.total_iters,
                          "total_iters", 1)
   Base._base_init(self, opt, o.last_epoch)
end
function M.LinearLR:get_lr()
   local r = {}
   if self.last_epoch == 0 then
      for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * self.start_factor end
      return r
   end
   if self._is_initial or self.last_epoch > self.total_iters then return group_lrs(self) end
   local f = 1.0 + (self.end_factor - self.start_factor) /
      (self.total_iters * self.start_factor + (self.last_epoch - 1) *
       (self.end_factor - self.start_factor))
   for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * f end
   return r
end
function M.LinearLR:_get_closed_form_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do
      r[i] = base * (self.start_factor + (self.end_factor - self.start_factor) *
         min(self.total_iters, self.last_epoch) / self.total_iters)
   end
   return r
end

M.ExponentialLR = class("ExponentialLR", { gamma = true })
function M.ExponentialLR._init(self, opt, o)
   if o.gamma == nil then fail("ExponentialLR", "gamma is required") end
   self.gamma = num("ExponentialLR", o.gamma, "gamma")
   Base._base_init(self, opt, o.last_epoch)
end
function M.ExponentialLR:get_lr()
   if self._is_initial then return group_lrs(self) end
   local r = {}
   for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * self.gamma end
   return r
end
function M.ExponentialLR:_get_closed_form_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do r[i] = base * self.gamma ^ self.last_epoch end
   return r
end

M.PolynomialLR = class("PolynomialLR", { total_iters = true, power = true })
function M.PolynomialLR._init(self, opt, o)
   self.total_iters = int("PolynomialLR", o.total_iters == nil and 5 or o.total_iters,
                          "total_iters", 1)
   self.power = num("PolynomialLR", o.power == nil and 1.0 or o.power, "power")
   Base._base_init(self, opt, o.last_epoch)
end
function M.PolynomialLR:get_lr()
   if self._is_initial or self.last_epoch > self.total_iters then return group_lrs(self) end
   local f = ((1.0 - self.last_epoch / self.total_iters) /
              (1.0 - (self.last_epoch - 1) / self.total_iters)) ^ self.power
   local r = {}
   for i, g in ipairs(self.optimizer.param_groups) do r[i] = g.lr * f end
   return r
end
function M.PolynomialLR:_get_closed_form_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do
      r[i] = base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ^ self.power
   end
   return r
end

M.CosineAnnealingLR = class("CosineAnnealingLR", { T_max = true, eta_min = true })
function M.CosineAnnealingLR._init(self, opt, o)
   if o.T_max == nil then fail("CosineAnnealingLR", "T_max is required") end
   self.T_max = int("CosineAnnealingLR", o.T_max, "T_max", 1)
   self.eta_min = num("CosineAnnealingLR", o.eta_min == nil and 0.0 or o.eta_min, "eta_min")
   Base._base_init(self, opt, o.last_epoch)
end
function M.CosineAnnealingLR:get_lr()
   local groups, r = self.optimizer.param_groups, {}
   local e, T_max, eta = self.last_epoch, self.T_max, self.eta_min
   if self._is_initial then return group_lrs(self) end
   if self._step_count == 1 and e > 0 then
      for i, base in ipairs(self.base_lrs) do
         r[i] = eta + (base - eta) * (1 + cos(e * pi / T_max)) / 2
      end
   elseif (e - 1 - T_max) % (2 * T_max) == 0 then
      for i, base in ipairs(self.base_lrs) do
         r[i] = groups[i].lr + (base - eta) * (1 - cos(pi / T_max)) / 2
      end
   else
      for i, g in ipairs(groups) do
         r[i] = (1 + cos(pi * e / T_max)) / (1 + cos(pi * (e - 1) / T_max)) * (g.lr - eta) + eta
      end
   end
   return r
end
function M.CosineAnnealingLR:_get_closed_form_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do
      r[i] = self.eta_min + (base - self.eta_min) * (1 + cos(pi * self.last_epoch / self.T_max)) / 2
   end
   return r
end

M.CosineAnnealingWarmRestarts = class("CosineAnnealingWarmRestarts",
                                      { T_0 = true, T_mult = true, eta_min = true })
function M.CosineAnnealingWarmRestarts._init(self, opt, o)
   local fname = "CosineAnnealingWarmRestarts"
   if o.T_0 == nil then fail(fname, "T_0 is required") end
   self.T_0 = int(fname, o.T_0, "T_0", 1)
   self.T_i = self.T_0
   self.T_mult = int(fname, o.T_mult == nil and 1 or o.T_mult, "T_mult", 1)
   self.eta_min = num(fname, o.eta_min == nil and 0.0 or o.eta_min, "eta_min")
   self.T_cur = o.last_epoch == nil and -1 or o.last_epoch
   Base._base_init(self, opt, o.last_epoch)
end
function M.CosineAnnealingWarmRestarts:get_lr()
   local r = {}
   for i, base in ipairs(self.base_lrs) do
      r[i] = self.eta_min + (base - self.eta_min) * (1 + cos(pi * self.T_cur / self.T_i)) / 2
   end
   return r
end
--- step(epoch): epoch may be fractional (step(epoch + i / iters) inside an epoch), as PyTorch's
function M.CosineAnnealingWarmRestarts:step(epoch)
   local fname = "CosineAnnealingWarmRestarts.step"
   if epoch == nil and self.last_epoch < 0 then epoch = 0 end
   if epoch == nil then
      epoch = self.last_epoch + 1
      self.T_cur = self.T_cur + 1
      if self.T_cur >= self.T_i then
         self.T_cur = self.T_cur % self.T_i
         self.T_i = self.T_i * self.T_mult
      end
   else
      num(fname, epoch, "epoch")
      if epoch < 0 then fail(fname, "expected a non-negative epoch, got %s", tostring(epoch)) end
      if epoch >= self.T_0 then
         if self.T_mult == 1 then
            self.T_cur = epoch % self.T_0
         else
            local n = log(epoch / self.T_0 * (self.T_mult - 1) + 1) / log(self.T_mult)
            n = n >= 0 and floor(n) or -floor(-n)
            self.T_cur = epoch - self.T_0 * (self.T_mult ^ n - 1) / (self.T_mult - 1)
            self.T_i = self.T_0 * self.T_mult ^ n
         end
      else
         self.T_i = self.T_0
         self.T_cur = epoch
      end
   end
   self._step_count = (self._step_count or 0) + 1
   self.last_epoch = floor(epoch)
   local v = self:get_lr()
   for i, g in ipairs(self.optimizer.param_groups) do g.lr = v[i] end
   lr_changed(self.optimizer)
   self._last_lr = lr_list(self.optimizer)
end

M.OneCycleLR = class("OneCycleLR", {
   max_lr = true, total_steps = true, epochs = true, steps_per_epoch = true, pct_start = true,
   anneal_strategy = true, cycle_momentum = true, base_momentum = true, max_momentum = true,
   div_factor = true, final_div_factor = true, three_phase = true })
function M.OneCycleLR._init(self, opt, o)
   local fname = "OneCycleLR"
   if o.total_steps ~= nil then
      self.total_steps = int(fname, o.total_steps, "total_steps", 1)
   elseif o.epochs ~= nil and o.steps_per_epoch ~= nil then
      self.total_steps = int(fname, o.epochs, "epochs", 1) *
         int(fname, o.steps_per_epoch, "steps_per_epoch", 1)
   else
      fail(fname, "you must define either total_steps OR (epochs AND steps_per_epoch)")
   end
   local pct = num(fname, o.pct_start == nil and 0.3 or o.pct_start, "pct_start", 0, 1)
   local ts = self.total_steps
   if o.three_phase then
      self._schedule_phases = {
         { end_step = pct * ts - 1, start_lr = "initial_lr", end_lr = "max_lr",
           start_momentum = "max_momentum", end_momentum = "base_momentum" },
         { end_step = 2 * pct * ts - 2, start_lr = "max_lr", end_lr = "initial_lr",
           start_momentum = "base_momentum", end_momentum = "max_momentum" },
         { end_step = ts - 1, start_lr = "initial_lr", end_lr = "min_lr",
           start_momentum = "max_momentum", end_momentum = "max_momentum" } }
   else
      self._schedule_phases = {
         { end_step = pct * ts - 1, start_lr = "initial_lr", end_lr = "max_lr",
           start_momentum = "max_momentum", end_momentum = "base_momentum" },
         { end_step = ts - 1, start_lr = "max_lr", end_lr = "min_lr",
           start_momentum = "base_momentum", end_momentum = "max_momentum" } }
   end
   local strategy = o.anneal_strategy == nil and "cos" or o.anneal_strategy
   if strategy ~= "cos" and strategy ~= "linear" then
      fail(fname, "anneal_strategy must be one of 'cos' or 'linear', got %s", tostring(strategy))
   end
   self._anneal_func_type = strategy
   if o.max_lr == nil then fail(fname, "max_lr is required") end
   local max_lrs = per_group(fname, opt, o.max_lr, "max_lr")
   local div = num(fname, o.div_factor == nil and 25.0 or o.div_factor, "div_factor", 0, nil,
                   true)
   local fdiv = num(fname, o.final_div_factor == nil and 1e4 or o.final_div_factor,
                    "final_div_factor", 0, nil, true)
   local last_epoch = o.last_epoch == nil and -1 or o.last_epoch
   if last_epoch == -1 then
      for i, g in ipairs(opt.param_groups) do
         g.initial_lr = max_lrs[i] / div
         g.max_lr = max_lrs[i]
         g.min_lr = g.initial_lr / fdiv
      end
   end
   self.cycle_momentum = o.cycle_momentum ~= false
   if self.cycle_momentum then
      local d = opt.defaults or {}
      if d.momentum == nil and d.betas == nil then
         fail(fname, "optimizer must support momentum or beta1 with the cycle_momentum option")
      end
      self.use_beta1 = d.betas ~= nil
      local maxm = per_group(fname, opt, o.max_momentum == nil and 0.95 or o.max_momentum,
                             "max_momentum")
      local basem = per_group(fname, opt, o.base_momentum == nil and 0.85 or o.base_momentum,
                              "base_momentum")
      if last_epoch == -1 then
         for i, g in ipairs(opt.param_groups) do
            if self.use_beta1 then g.betas = { maxm[i], g.betas[2] }
            else g.momentum = maxm[i] end
            g.max_momentum = maxm[i]
            g.base_momentum = basem[i]
         end
      end
   end
   Base._base_init(self, opt, last_epoch)
end
local function anneal(kind, start, stop, pct)
   if kind == "cos" then
      local cos_out = cos(pi * pct) + 1
      return stop + (start - stop) / 2.0 * cos_out
   end
   return (stop - start) * pct + start
end
function M.OneCycleLR:get_lr()
   local step_num = self.last_epoch
   if step_num > self.total_steps then
      fail("OneCycleLR.step", "tried to step %d times; the specified number of total steps " ..
           "is %d", step_num, self.total_steps)
   end
   local r = {}
   local phases = self._schedule_phases
   for gi, g in ipairs(self.optimizer.param_groups) do
      local start_step = 0.0
      local lr, mom
      for i, ph in ipairs(phases) do
         local end_step = ph.end_step
         if step_num <= end_step or i == #phases then
            local pct = (step_num - start_step) / (end_step - start_step)
            lr = anneal(self._anneal_func_type, g[ph.start_lr], g[ph.end_lr], pct)
            if self.cycle_momentum then
               mom = anneal(self._anneal_func_type, g[ph.start_momentum], g[ph.end_momentum],
                            pct)
            end
            break
         end
         start_step = ph.end_step
      end
      r[gi] = lr
      if self.cycle_momentum then
         if self.use_beta1 then g.betas = { mom, g.betas[2] } else g.momentum = mom end
      end
   end
   return r
end

M.SequentialLR = class("SequentialLR", { schedulers = true, milestones = true })
local function bisect_right(list, x)
   local n = 0
   for _, v in ipairs(list) do if v <= x then n = n + 1 end end
   return n
end
function M.SequentialLR._init(self, opt, o)
   local fname = "SequentialLR"
   local scheds, ms = o.schedulers, o.milestones
   if not plain_table(scheds) or #scheds < 1 then
      fail(fname, "schedulers must be an array of at least one scheduler")
   end
   for i, s in ipairs(scheds) do
      if type(s) ~= "table" or getmetatable(s) == nil or s.optimizer == nil then
         fail(fname, "schedulers[%d] is not a scheduler (got %s)", i, T.typename(s))
      end
      if getmetatable(s) == M.ReduceLROnPlateau then
         fail(fname, "does not support ReduceLROnPlateau (schedulers[%d]): its step needs a " ..
              "metric", i)
      end
      if s.optimizer ~= opt then
         fail(fname, "schedulers[%d] belongs to another optimizer", i)
      end
   end
   if not plain_table(ms) or #ms ~= #scheds - 1 then
      fail(fname, "expects one milestone fewer than schedulers: got %d schedulers and %s " ..
           "milestones", #scheds, plain_table(ms) and tostring(#ms) or T.typename(ms))
   end
   for i, m in ipairs(ms) do int(fname, m, "milestones[" .. i .. "]") end
   self._schedulers = scheds
   self._milestones = deep_copy(ms)
   self.last_epoch = (o.last_epoch == nil and -1 or o.last_epoch) + 1
   for _, g in ipairs(opt.param_groups) do g.lr = g.initial_lr end
   lr_changed(opt)
   -- "undo" the step each scheduler took when it was built
   for _, s in ipairs(scheds) do s:_undo() end
   local idx = bisect_right(self._milestones, 0) + 1
   scheds[idx]:_initial_step()
   self._last_lr = scheds[idx]:get_last_lr()
end
function Base:_undo()
   if self._schedulers then
      for _, s in ipairs(self._schedulers) do s:_undo() end
   elseif self.last_epoch ~= nil then
      self.last_epoch = self.last_epoch - 1
   end
end
function M.SequentialLR:step()
   self.last_epoch = self.last_epoch + 1
   local idx = bisect_right(self._milestones, self.last_epoch) + 1
   local s = self._schedulers[idx]
   if idx > 1 and self._milestones[idx - 1] == self.last_epoch then
      s:_update_lr(0)
   else
      s:step()
   end
   self._last_lr = s:get_last_lr()
end
function M.SequentialLR:state_dict()
   local sd = Base.state_dict(self)
   sd._schedulers = {}
   for i, s in ipairs(self._schedulers) do sd._schedulers[i] = s:state_dict() end
   return sd
end
function M.SequentialLR:load_state_dict(sd)
   Base.load_state_dict(self, sd)
   if plain_table(sd._schedulers) then
      for i, s in ipairs(self._schedulers) do
         if sd._schedulers[i] then s:load_state_dict(sd._schedulers[i]) end
      end
   end
end

---------------------------------------------------------------------------------------------
-- ReduceLROnPlateau
---------------------------------------------------------------------------------------------

M.ReduceLROnPlateau = class("ReduceLROnPlateau", {
   mode = true, factor = true, patience = true, threshold = true, threshold_mode = true,
   cooldown = true, min_lr = true, eps = true })
function M.ReduceLROnPlateau._init(self, opt, o)
   local fname = "ReduceLROnPlateau"
   if o.last_epoch ~= nil then fail(fname, "unknown option 'last_epoch'") end
   self.factor = num(fname, o.factor == nil and 0.1 or o.factor, "factor")
   if self.factor >= 1.0 then
      fail(fname, "factor should be < 1.0, got %s", tostring(self.factor))
   end
   local n = #opt.param_groups
   local min_lr = o.min_lr == nil and 0 or o.min_lr
   if type(min_lr) == "table" then
      if #min_lr ~= n then fail(fname, "expected %d min_lrs, got %d", n, #min_lr) end
      self.default_min_lr = nil
      self.min_lrs = deep_copy(min_lr)
   else
      num(fname, min_lr, "min_lr")
      self.default_min_lr = min_lr
      self.min_lrs = {}
      for i = 1, n do self.min_lrs[i] = min_lr end
   end
   self.patience = int(fname, o.patience == nil and 10 or o.patience, "patience", 0)
   self.cooldown = int(fname, o.cooldown == nil and 0 or o.cooldown, "cooldown", 0)
   self.eps = num(fname, o.eps == nil and 1e-8 or o.eps, "eps")
   self.last_epoch = 0
   self._last_lr = lr_list(opt)
   local mode = o.mode == nil and "min" or o.mode
   local tmode = o.threshold_mode == nil and "rel" or o.threshold_mode
   if mode ~= "min" and mode ~= "max" then fail(fname, "mode %s is unknown", tostring(mode)) end
   if tmode ~= "rel" and tmode ~= "abs" then
      fail(fname, "threshold mode %s is unknown", tostring(tmode))
   end
   self.mode, self.threshold_mode = mode, tmode
   self.threshold = num(fname, o.threshold == nil and 1e-4 or o.threshold, "threshold")
   self.mode_worse = mode == "min" and huge or -huge
   self.best = self.mode_worse
   self.cooldown_counter = 0
   self.num_bad_epochs = 0
end
function M.ReduceLROnPlateau:_is_better(a, best)
   if self.mode == "min" and self.threshold_mode == "rel" then
      return a < best * (1.0 - self.threshold)
   elseif self.mode == "min" then
      return a < best - self.threshold
   elseif self.threshold_mode == "rel" then
      return a > best * (self.threshold + 1.0)
   end
   return a > best + self.threshold
end
--- sched:step(metric): metric is a number (or a one-element tensor), the quantity watched
function M.ReduceLROnPlateau:step(metrics)
   local fname = "ReduceLROnPlateau.step"
   if T.is_tensor(metrics) then metrics = metrics:item() end
   if type(metrics) ~= "number" then
      fail(fname, "expected the metric (a number, e.g. the validation loss), got %s",
           T.typename(metrics))
   end
   local current = metrics
   self.last_epoch = self.last_epoch + 1
   if self:_is_better(current, self.best) then
      self.best = current
      self.num_bad_epochs = 0
   else
      self.num_bad_epochs = self.num_bad_epochs + 1
   end
   if self.cooldown_counter > 0 then
      self.cooldown_counter = self.cooldown_counter - 1
      self.num_bad_epochs = 0
   end
   if self.num_bad_epochs > self.patience then
      local groups = self.optimizer.param_groups
      if #groups ~= #self.min_lrs then
         if self.default_min_lr == nil then
            fail(fname, "the optimizer has %d param groups, min_lr had %d", #groups,
                 #self.min_lrs)
         end
         self.min_lrs = {}
         for i = 1, #groups do self.min_lrs[i] = self.default_min_lr end
      end
      for i, g in ipairs(groups) do
         local old = g.lr
         local new = max(old * self.factor, self.min_lrs[i])
         if old - new > self.eps then g.lr = new end
      end
      lr_changed(self.optimizer)
      self.cooldown_counter = self.cooldown
      self.num_bad_epochs = 0
   end
   self._last_lr = lr_list(self.optimizer)
end

return M
