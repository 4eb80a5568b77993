-- lm.optim: SGD / Adam / AdamW trajectories against PyTorch 1.13 (spec/fixtures/nn/optim.lua),
-- state layout, zero_grad, state_dict round trips and option errors.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local optim = lm.optim

local close = G.close
local CL = lm.channels_last

describe("optimizers against the peer", function()
   local fx = G.fixture("optim")
   for _, c in ipairs(fx.cases) do
      local desc = {}
      for k, v in pairs(c.opts) do
         desc[#desc + 1] = k .. "=" .. (type(v) == "table" and table.concat(v, "/") or tostring(v))
      end
      table.sort(desc)
      it(c.optimizer .. " " .. table.concat(desc, " "), function()
         local p = G.tensor(fx.p0, lm.float64, nil, true)
         local opt = optim[c.optimizer]({ p }, c.opts)
         for step, g in ipairs(fx.grads) do
            p.grad = G.tensor(g, lm.float64)
            opt:step()
            close(p, c.trajectory[step].data, 1e-9, "step " .. step)
         end
      end)
   end
end)

describe("optimizer state and API", function()
   local function cl_param()
      lm.manual_seed(1)
      return lm.randn({ 2, 3, 2, 2 }):to(CL):requires_grad_()
   end

   it("keeps momentum buffers and moments in the parameter's memory format", function()
      for _, name in ipairs({ "SGD", "Adam", "AdamW" }) do
         local p = cl_param()
         local opt = optim[name]({ p }, { lr = 0.1, momentum = name == "SGD" and 0.9 or nil })
         for _ = 1, 2 do
            p.grad = lm.randn({ 2, 3, 2, 2 }):to(CL)
            opt:step()
         end
         assert.is_true(p:is_contiguous(CL), name .. ": parameter stays channels-last")
         for k, v in pairs(opt.state[p]) do
            if lm.is_tensor(v) then
               assert.is_true(v:is_contiguous(CL), name .. ": state " .. k .. " is channels-last")
            end
         end
      end
   end)

   it("skips parameters without gradients and zero_grad clears them", function()
      local a = lm.ones({ 2 }, { requires_grad = true })
      local b = lm.ones({ 2 }, { requires_grad = true })
      local opt = optim.SGD({ a, b }, { lr = 1 })
      a.grad = lm.ones({ 2 })
      opt:step()
      close(a, { 0, 0 })
      close(b, { 1, 1 })
      opt:zero_grad()
      close(a.grad, { 0, 0 })
      opt:zero_grad(true)
      assert.is_nil(a.grad)
   end)

   it("trains through autograd, with a closure", function()
      local w = lm.tensor({ 3, -2 }, { dtype = lm.float64, requires_grad = true })
      local opt = optim.SGD({ w }, { lr = 0.1 })
      local loss = opt:step(function()
         opt:zero_grad()
         local l = (w * w):sum()
         l:backward()
         return l
      end)
      close(loss, { 13 }, 1e-12)
      close(w, { 3 - 0.6, -2 + 0.4 }, 1e-12)
   end)

   it("accepts parameter groups and a module", function()
      local net = lm.nn.Linear(3, 2)
      local opt = optim.SGD(net, { lr = 0.5 })
      assert.are.equal(2, #opt.param_groups[1].params)
      local g = optim.Adam({ { params = { net.weight } }, { params = { net.bias }, lr = 0.1 } },
                           { lr = 0.01 })
      assert.are.equal(0.01, g.param_groups[1].lr)
      assert.are.equal(0.1, g.param_groups[2].lr)
      assert.are.same({ 0.9, 0.999 }, g.param_groups[2].betas)
   end)

   it("saves and restores its state", function()
      local function run(opt, p, from, to)
         for i = from, to do
            lm.manual_seed(100 + i)
            p.grad = lm.randn({ 2, 3, 2, 2 }):to(CL)
            opt:step()
         end
      end
      for _, spec in ipairs({ { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true } },
                              { "Adam", { lr = 0.01, amsgrad = true } },
                              { "AdamW", { lr = 0.01 } } }) do
         local name, opts = spec[1], spec[2]
         local p1 = cl_param()
         local o1 = optim[name]({ p1 }, opts)
         run(o1, p1, 1, 3)
         local sd = o1:state_dict()
         assert.are.same({ 1 }, sd.param_groups[1].params)
         assert.is_not_nil(sd.state[1])
         local p2 = p1:detach():clone():requires_grad_()
         local o2 = optim[name]({ p2 }, { lr = 123 })
         o2:load_state_dict(sd)
         assert.are.equal(opts.lr, o2.param_groups[1].lr)
         run(o1, p1, 4, 6)
         run(o2, p2, 4, 6)
         close(p2, p1, 0, name .. " after restore")
         -- the saved state is a copy: running o1 did not change it
         local sd2 = o1:state_dict()
         if name == "SGD" then
            assert.is_false(sd2.state[1].momentum_buffer:equal(sd.state[1].momentum_buffer))
         else
            assert.are.equal(3, sd.state[1].step)
            assert.are.equal(6, sd2.state[1].step)
         end
      end
   end)

   it("rejects bad options", function()
      local p = lm.ones({ 2 }, { requires_grad = true })
      H.assert_error_like("SGD", "lr", optim.SGD, { p })
      H.assert_error_like("SGD", "learning rate", optim.SGD, { p }, { lr = -1 })
      H.assert_error_like("SGD", "nesterov", optim.SGD, { p }, { lr = 0.1, nesterov = true })
      H.assert_error_like("SGD", "unknown option", optim.SGD, { p }, { lr = 0.1, betas = 1 })
      H.assert_error_like("SGD", "empty parameter list", optim.SGD, {}, { lr = 0.1 })
      H.assert_error_like("SGD", "non-leaf", optim.SGD, { p * 2 }, { lr = 0.1 })
      H.assert_error_like("SGD", "more than one", optim.SGD,
                          { { params = { p } }, { params = { p } } },
                          { lr = 0.1 })
      H.assert_error_like("Adam", "beta", optim.Adam, { p }, { betas = { 1.5, 0.9 } })
      H.assert_error_like("Adam", "epsilon", optim.Adam, { p }, { eps = -1 })
      H.assert_error_like("AdamW", "dtype", optim.AdamW, { lm.ones({ 2 }, { dtype = lm.int64 }) })
      H.assert_error_like("SGD", "capturable must be a boolean", optim.SGD, { p },
                          { lr = 0.1, capturable = 1 })
   end)

   -- capturable = true: the learning rate read from a device tensor (for CUDA graphs,
   -- spec/cuda_graph_spec.lua); the steps are those of the plain SGD, schedulers included
   it("takes the same steps with capturable = true, through every scheduler kind", function()
      local sched = lm.optim.lr_scheduler
      local function run(capturable, make_sched, fused)
         lm.manual_seed(3)
         local m = lm.nn.Sequential(lm.nn.Conv2d(3, 4, 3), lm.nn.Flatten(), lm.nn.Linear(144, 3))
         m = lm.to_channels_last(m)
         local o = optim.SGD(m:parameters(), { lr = 0.5, momentum = 0.9, weight_decay = 1e-3,
                                              nesterov = true, capturable = capturable })
         local s = make_sched(o)
         lm.manual_seed(4)
         for i = 1, 6 do
            local x = lm.randn({ 2, 3, 8, 8 })
            local y = lm.randint(1, 4, { 2 }, { dtype = lm.int64 })
            o:zero_grad(true)
            lm.F.cross_entropy(m(x), y):backward()
            if not fused then -- gradients in another layout: the unfused update
               for _, p in ipairs(m:parameters()) do
                  if p:dim() == 4 then p.grad = p.grad:contiguous() end
               end
            end
            o:step()
            if s.mode then s:step(1.0) else s:step() end
            if i == 3 then o.param_groups[1].lr = o.param_groups[1].lr * 0.9 end
         end
         return m:parameters()
      end
      local makers = {
         function(o) return sched.StepLR(o, { step_size = 2, gamma = 0.5 }) end,
         function(o) return sched.OneCycleLR(o, { max_lr = 0.8, total_steps = 10 }) end,
         function(o) return sched.ReduceLROnPlateau(o, { patience = 0 }) end,
      }
      for k, make in ipairs(makers) do
         for _, fused in ipairs({ true, false }) do
            local a, b = run(false, make, fused), run(true, make, fused)
            for i = 1, #a do
               local d = (a[i] - b[i]):abs():max():item()
               assert(d == 0, ("scheduler %d, fused %s, parameter %d: %g apart"):format(
                  k, tostring(fused), i, d))
            end
         end
      end
   end)

   -- Adam / AdamW capturable = true: lr and the step count on the device; the same steps, the
   -- count read back by state_dict and written back after load_state_dict
   it("Adam and AdamW take the same steps with capturable = true; state_dict keeps the count",
      function()
      local function run(cls, capturable, amsgrad, reload)
         lm.manual_seed(3)
         local m = lm.nn.Sequential(lm.nn.Conv2d(3, 4, 3), lm.nn.Flatten(), lm.nn.Linear(144, 3))
         m = lm.to_channels_last(m)
         local o = optim[cls](m:parameters(), { lr = 0.01, weight_decay = 1e-2,
                                                amsgrad = amsgrad, capturable = capturable })
         local s = lm.optim.lr_scheduler.StepLR(o, { step_size = 2, gamma = 0.5 })
         lm.manual_seed(4)
         for i = 1, 6 do
            local x = lm.randn({ 2, 3, 8, 8 })
            local y = lm.randint(1, 4, { 2 }, { dtype = lm.int64 })
            o:zero_grad(true)
            lm.F.cross_entropy(m(x), y):backward()
            o:step()
            s:step()
            if reload and i == 3 then -- a round trip through state_dict mid-run
               local sd = o:state_dict()
               assert.are.equal(3, sd.state[1].step)
               sd.state[1].step = 2 -- the host's count wins at the next step
               o:load_state_dict(sd)
            end
         end
         return m:parameters(), o:state_dict()
      end
      for _, cls in ipairs({ "Adam", "AdamW" }) do
         for _, amsgrad in ipairs({ false, true }) do
            for _, reload in ipairs({ false, true }) do
               local a, sa = run(cls, false, amsgrad, reload)
               local b, sb = run(cls, true, amsgrad, reload)
               assert.are.equal(sa.state[1].step, sb.state[1].step)
               for i = 1, #a do
                  local d = (a[i] - b[i]):abs():max():item()
                  assert(d == 0, ("%s amsgrad %s reload %s, parameter %d: %g apart"):format(
                     cls, tostring(amsgrad), tostring(reload), i, d))
               end
            end
         end
      end
      H.assert_error_like("Adam", "capturable must be a boolean", optim.Adam,
                          { lm.ones({ 2 }, { requires_grad = true }) }, { capturable = "yes" })
   end)
end)
