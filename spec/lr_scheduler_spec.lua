-- spec/lr_scheduler_spec.lua -- lm.optim.lr_scheduler against PyTorch 2.x step by step
-- (spec/fixtures/lr_scheduler/cases.lua, made by spec/fixtures/lr_scheduler/gen.py): every
-- group's lr and momentum (beta1 for Adam) after construction and after each step, get_last_lr,
-- last_epoch; state_dict / load_state_dict mid-run (also through lm.save_checkpoint); options by
-- PyTorch's names; bad input.

local lm = require("lumen")
local cases = dofile("spec/fixtures/lr_scheduler/cases.lua")
local S = lm.optim.lr_scheduler

-- the same functions as gen.py's LAMBDAS
local LAMBDAS = {
   pow095 = function(e) return 0.95 ^ e end,
   inv = function(e) return 1.0 / (e + 1) end,
   warmup5 = function(e) return math.min(1.0, (e + 1) / 5) end,
}

local function make_opt(kind, lrs)
   local groups = { { params = { lm.zeros({ 2 }) }, lr = lrs[1] },
                    { params = { lm.zeros({ 2 }) }, lr = lrs[2] } }
   if kind == "SGD" then return lm.optim.SGD(groups, { lr = lrs[1], momentum = 0.9 }) end
   return lm.optim.Adam(groups, { lr = lrs[1] })
end

local function build(opt, name, kwargs)
   local kw = {}
   for k, v in pairs(kwargs) do kw[k] = v end
   if name == "LambdaLR" then
      local f = kw.lr_lambda
      if type(f) == "table" then
         local fs = {}
         for i, n in ipairs(f) do fs[i] = LAMBDAS[n] end
         kw.lr_lambda = fs
      else
         kw.lr_lambda = LAMBDAS[f]
      end
   end
   if name == "SequentialLR" then
      local ss = {}
      for i, s in ipairs(kw.schedulers) do ss[i] = build(opt, s.name, s.kwargs) end
      kw.schedulers = ss
   end
   return S[name](opt, kw)
end

local function momentum(opt)
   local r = {}
   for i, g in ipairs(opt.param_groups) do r[i] = g.betas and g.betas[1] or g.momentum end
   return r
end

local function label(c)
   local parts = {}
   local keys = {}
   for k in pairs(c.kwargs) do keys[#keys + 1] = k end
   table.sort(keys)
   for _, k in ipairs(keys) do
      local v = c.kwargs[k]
      parts[#parts + 1] = k .. "=" .. (type(v) == "table" and "{...}" or tostring(v))
   end
   return c.name .. "(" .. table.concat(parts, ", ") .. ") on " .. c.optimizer
end

local function lrs(opt)
   local r = {}
   for i, g in ipairs(opt.param_groups) do r[i] = g.lr end
   return r
end

-- exact equality: the same operations in the same order give the same doubles
local function same(a, b, what)
   assert.are.equal(#b, #a, what)
   for i = 1, #b do
      assert(a[i] == b[i], ("%s: group %d: got %.17g, PyTorch %.17g"):format(what, i, a[i], b[i]))
   end
end

local function run_steps(c, opt, sched, from, to)
   for i = from, to do
      opt:step()
      if c.metrics then sched:step(c.metrics[i]) else sched:step() end
      same(lrs(opt), c.lr[i + 1], label(c) .. " lr after step " .. i)
      same(sched:get_last_lr(), c.last_lr[i + 1], label(c) .. " get_last_lr after step " .. i)
      same(momentum(opt), c.momentum[i + 1], label(c) .. " momentum after step " .. i)
   end
end

describe("lm.optim.lr_scheduler", function()
   it("equals PyTorch step by step (" .. #cases .. " cases)", function()
      for _, c in ipairs(cases) do
         local opt = make_opt(c.optimizer, c.lrs0)
         local sched = build(opt, c.name, c.kwargs)
         same(lrs(opt), c.lr[1], label(c) .. " lr after construction")
         same(sched:get_last_lr(), c.last_lr[1], label(c) .. " get_last_lr after construction")
         same(momentum(opt), c.momentum[1], label(c) .. " momentum after construction")
         run_steps(c, opt, sched, 1, #c.lr - 1)
         assert.are.equal(c.last_epoch, sched.last_epoch, label(c))
      end
   end)

   it("state_dict / load_state_dict continue a run exactly, also through a checkpoint", function()
      local path = os.tmpname()
      for _, c in ipairs(cases) do
         local n = #c.lr - 1
         local half = math.floor(n / 2)
         local opt = make_opt(c.optimizer, c.lrs0)
         local sched = build(opt, c.name, c.kwargs)
         run_steps(c, opt, sched, 1, half)
         lm.save_checkpoint(path, { optimizer = opt, scheduler = sched:state_dict() })
         -- a new run: the same construction, then the saved states
         local opt2 = make_opt(c.optimizer, c.lrs0)
         local sched2 = build(opt2, c.name, c.kwargs)
         local ck = lm.load_checkpoint(path, { optimizer = opt2 })
         sched2:load_state_dict(ck.scheduler)
         same(sched2:get_last_lr(), c.last_lr[half + 1], label(c) .. " restored get_last_lr")
         run_steps(c, opt2, sched2, half + 1, n)
         assert.are.equal(c.last_epoch, sched2.last_epoch, label(c))
      end
      os.remove(path)
   end)

   it("sets what a user sets by hand in opt.param_groups[i].lr", function()
      local opt = make_opt("SGD", { 0.1, 0.01 })
      local sched = S.StepLR(opt, { step_size = 2, gamma = 0.5 })
      opt.param_groups[2].lr = 0.04            -- by hand: the chainable form continues from it
      sched:step()
      sched:step()
      assert.are.same({ 0.05, 0.02 }, sched:get_last_lr())
      assert.truthy(tostring(sched):find("StepLR (last_epoch 2", 1, true))
   end)

   it("ReduceLROnPlateau takes a one-element tensor as the metric", function()
      local opt = make_opt("SGD", { 0.1, 0.01 })
      local sched = S.ReduceLROnPlateau(opt, { patience = 0 })
      sched:step(lm.tensor(1.0))
      sched:step(lm.tensor(2.0))
      assert.are.same({ 0.1 * 0.1, 0.01 * 0.1 }, sched:get_last_lr())
   end)

   it("rejects bad options with PyTorch's names in the message", function()
      local opt = make_opt("SGD", { 0.1, 0.01 })
      local function err(name, needle, f)
         local ok, msg = pcall(f)
         assert.is_false(ok, name)
         assert.truthy(msg:find("lumen.optim.lr_scheduler." .. name, 1, true), msg)
         assert.truthy(msg:find(needle, 1, true), msg)
         assert.truthy(msg:find("lr_scheduler_spec.lua:%d+:"), msg)  -- the caller's line
      end
      err("StepLR", "unknown option 'stepsize'", function() S.StepLR(opt, { stepsize = 3 }) end)
      err("StepLR", "step_size is required", function() S.StepLR(opt, {}) end)
      err("StepLR", "step_size must be an integer", function()
         S.StepLR(opt, { step_size = 1.5 }) end)
      err("StepLR", "expected an optimizer", function() S.StepLR({}, { step_size = 1 }) end)
      err("MultiStepLR", "milestones must be an array", function()
         S.MultiStepLR(opt, { milestones = 3 }) end)
      err("LinearLR", "start_factor expected to be greater than 0", function()
         S.LinearLR(opt, { start_factor = 0 }) end)
      err("CosineAnnealingLR", "T_max is required", function() S.CosineAnnealingLR(opt) end)
      err("CosineAnnealingWarmRestarts", "T_mult must be >= 1", function()
         S.CosineAnnealingWarmRestarts(opt, { T_0 = 2, T_mult = 0 }) end)
      err("OneCycleLR", "either total_steps OR (epochs AND steps_per_epoch)", function()
         S.OneCycleLR(opt, { max_lr = 0.1 }) end)
      err("OneCycleLR", "anneal_strategy must be one of", function()
         S.OneCycleLR(opt, { max_lr = 0.1, total_steps = 4, anneal_strategy = "exp" }) end)
      err("OneCycleLR", "expected 2 values for max_lr, got 3", function()
         S.OneCycleLR(opt, { max_lr = { 1, 2, 3 }, total_steps = 4 }) end)
      local oc = S.OneCycleLR(make_opt("SGD", { 0.1, 0.01 }), { max_lr = 0.1, total_steps = 2 })
      oc:step(); oc:step()
      err("OneCycleLR.step", "tried to step 3 times", function() oc:step() end)
      err("LambdaLR", "lr_lambda must be a function", function() S.LambdaLR(opt, {}) end)
      err("LambdaLR", "expected 2 lr_lambdas, but got 1", function()
         S.LambdaLR(opt, { lr_lambda = { LAMBDAS.inv } }) end)
      err("ReduceLROnPlateau", "mode avg is unknown", function()
         S.ReduceLROnPlateau(opt, { mode = "avg" }) end)
      err("ReduceLROnPlateau", "factor should be < 1.0", function()
         S.ReduceLROnPlateau(opt, { factor = 2 }) end)
      err("ReduceLROnPlateau.step", "expected the metric", function()
         S.ReduceLROnPlateau(opt):step() end)
      err("SequentialLR", "one milestone fewer than schedulers", function()
         S.SequentialLR(opt, { schedulers = { S.StepLR(opt, { step_size = 1 }) },
                              milestones = { 2 } }) end)
      err("SequentialLR", "does not support ReduceLROnPlateau", function()
         S.SequentialLR(opt, { schedulers = { S.ReduceLROnPlateau(opt) }, milestones = {} }) end)
      err("StepLR", "step(epoch) is deprecated", function()
         S.StepLR(opt, { step_size = 1 }):step(3) end)
      err("StepLR.load_state_dict", "expected a table", function()
         S.StepLR(opt, { step_size = 1 }):load_state_dict(3) end)
   end)
end)
