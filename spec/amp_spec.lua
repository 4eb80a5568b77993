-- spec/amp_spec.lua -- lm.amp.GradScaler (lua/lumen/amp.lua): PyTorch's options and defaults,
-- scale / unscale_ / step / update (skip on inf or NaN, backoff, growth), the per-step order
-- errors, state_dict, the disabled scaler, and a float16 training loop with it.
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local nn = lm.nn

local function dt(t) return tostring(t:dtype()) end

-- one parameter p (zeros) and an SGD optimizer on it; grad(v) gives p the gradient v everywhere
local function scaler_setup(opts)
   local p = lm.zeros(3, { requires_grad = true })
   local opt = lm.optim.SGD({ p }, { lr = 1 })
   local scaler = lm.amp.GradScaler(opts)
   local function backward(v)
      opt:zero_grad()
      local loss = (p * v):sum()                       -- d loss / d p = v
      scaler:scale(loss):backward()
   end
   return p, opt, scaler, backward
end

describe("lm.amp.GradScaler", function()
   it("has PyTorch's defaults", function()
      local s = lm.amp.GradScaler()
      assert.equal(65536, s:get_scale())
      assert.is_true(s:is_enabled())
      assert.equal(2, s:get_growth_factor())
      assert.equal(0.5, s:get_backoff_factor())
      assert.equal(2000, s:get_growth_interval())
      assert.same({ scale = 65536, growth_factor = 2, backoff_factor = 0.5,
                    growth_interval = 2000, _growth_tracker = 0 }, s:state_dict())
      assert.truthy(tostring(s):find("GradScaler(scale = 65536", 1, true))
   end)

   it("scales a loss (differentiably) and unscales the gradients", function()
      local p, opt, scaler, backward = scaler_setup({ init_scale = 1024 })
      local loss = (p + 1):sum()
      local scaled = scaler:scale(loss)
      assert.equal(3 * 1024, scaled:item())
      assert.equal("float32", dt(scaled))
      backward(lm.tensor({ 1, 2, 3 }))
      H.assert_close(p.grad, { 1024, 2048, 3072 })
      scaler:unscale_(opt)
      H.assert_close(p.grad, { 1, 2, 3 })
      scaler:step(opt)                                 -- no second unscale
      H.assert_close(p, { -1, -2, -3 })
      scaler:update()
      assert.equal(1024, scaler:get_scale())
      -- an array of outputs gives an array
      local r = scaler:scale({ loss, loss * 2 })
      assert.equal(2, #r)
      assert.equal(6 * 1024, r[2]:item())
   end)

   it("skips the step on an inf or NaN gradient and halves the scale", function()
      for _, bad in ipairs({ math.huge, -math.huge, 0 / 0 }) do
         local p, opt, scaler, backward = scaler_setup()
         backward(lm.tensor({ 1, bad, 1 }))
         assert.is_nil(scaler:step(opt))
         H.assert_close(p, { 0, 0, 0 })               -- untouched
         scaler:update()
         assert.equal(32768, scaler:get_scale())
         assert.equal(0, scaler:state_dict()._growth_tracker)
         -- the next clean step runs
         backward(lm.tensor({ 1, 1, 1 }))
         scaler:step(opt)
         H.assert_close(p, { -1, -1, -1 })
         scaler:update()
         assert.equal(32768, scaler:get_scale())
      end
   end)

   it("grows the scale after growth_interval clean steps", function()
      local _, opt, scaler, backward = scaler_setup({ init_scale = 8, growth_interval = 3 })
      local seen = {}
      for i = 1, 7 do
         backward(lm.tensor({ 1, 1, 1 }))
         scaler:step(opt)
         scaler:update()
         seen[i] = scaler:get_scale()
      end
      assert.same({ 8, 8, 16, 16, 16, 32, 32 }, seen)
      -- an inf resets the count of clean steps
      backward(lm.tensor({ math.huge, 1, 1 }))
      scaler:step(opt); scaler:update()
      assert.equal(16, scaler:get_scale())
      for _ = 1, 2 do
         backward(lm.tensor({ 1, 1, 1 })); scaler:step(opt); scaler:update()
      end
      assert.equal(16, scaler:get_scale())
      backward(lm.tensor({ 1, 1, 1 })); scaler:step(opt); scaler:update()
      assert.equal(32, scaler:get_scale())
   end)

   it("shrinks by backoff_factor and grows by growth_factor", function()
      local _, opt, scaler, backward = scaler_setup({ init_scale = 64, backoff_factor = 0.25,
                                               growth_factor = 3, growth_interval = 1 })
      backward(lm.tensor({ 0 / 0, 1, 1 })); scaler:step(opt); scaler:update()
      assert.equal(16, scaler:get_scale())
      backward(lm.tensor({ 1, 1, 1 })); scaler:step(opt); scaler:update()
      assert.equal(48, scaler:get_scale())
      scaler:update(5)                                -- explicit new scale
      assert.equal(5, scaler:get_scale())
      scaler:update(lm.tensor({ 7 }))
      assert.equal(7, scaler:get_scale())
   end)

   it("does not grow past float32's range", function()
      local _, opt, scaler, backward = scaler_setup({ init_scale = 2 ^ 127,
                                                      growth_interval = 1 })
      backward(lm.tensor({ 0, 0, 0 }))
      scaler:step(opt); scaler:update()
      assert.equal(2 ^ 127, scaler:get_scale())
   end)

   it("raises on the wrong order of calls", function()
      local _, opt, scaler, backward = scaler_setup()
      H.assert_error_like("GradScaler.step", "scale(loss)", scaler.step, scaler, opt)
      H.assert_error_like("GradScaler.unscale_", "scale(loss)", scaler.unscale_, scaler, opt)
      H.assert_error_like("GradScaler.update", "scale(loss)", scaler.update, scaler)
      backward(lm.tensor({ 1, 1, 1 }))
      H.assert_error_like("GradScaler.update", "no inf checks", scaler.update, scaler)
      scaler:unscale_(opt)
      H.assert_error_like("GradScaler.unscale_", "already been called", scaler.unscale_, scaler,
                          opt)
      scaler:step(opt)
      H.assert_error_like("GradScaler.unscale_", "after step", scaler.unscale_, scaler, opt)
      H.assert_error_like("GradScaler.step", "already been called", scaler.step, scaler, opt)
      scaler:update()
      -- the next iteration may unscale again
      backward(lm.tensor({ 1, 1, 1 }))
      scaler:unscale_(opt)
      scaler:step(opt)
      scaler:update()
   end)

   it("rejects bad input", function()
      local G = lm.amp.GradScaler
      H.assert_error_like("GradScaler", "unknown option 'init_scal'", G, { init_scal = 2 })
      H.assert_error_like("GradScaler", "init_scale", G, { init_scale = -1 })
      H.assert_error_like("GradScaler", "init_scale", G, { init_scale = 0 })
      H.assert_error_like("GradScaler", "init_scale", G, { init_scale = math.huge })
      H.assert_error_like("GradScaler", "growth_factor", G, { growth_factor = 1 })
      H.assert_error_like("GradScaler", "backoff_factor", G, { backoff_factor = 1 })
      H.assert_error_like("GradScaler", "backoff_factor", G, { backoff_factor = 0 })
      H.assert_error_like("GradScaler", "growth_interval", G, { growth_interval = 0 })
      H.assert_error_like("GradScaler", "growth_interval", G, { growth_interval = 1.5 })
      H.assert_error_like("GradScaler", "enabled", G, { enabled = "yes" })
      H.assert_error_like("GradScaler", "device", G, { device = "tpu" })
      H.assert_error_like("GradScaler", "options must be a table", G, 5)
      local s = G()
      H.assert_error_like("GradScaler.scale", "tensor", s.scale, s, 3)
      H.assert_error_like("GradScaler.scale", "outputs[2]", s.scale, s, { lm.ones(1), "x" })
      H.assert_error_like("GradScaler.scale", "expected a GradScaler", s.scale, lm.ones(1))
      H.assert_error_like("GradScaler.step", "optimizer", s.step, s, {})
      H.assert_error_like("GradScaler.update", "new_scale", s.update, s, -1)
      local p = lm.zeros(2, { requires_grad = true })
      local opt = lm.optim.SGD({ p }, { lr = 1 })
      s:scale((p * 1):sum()):backward()
      H.assert_error_like("GradScaler.step", "closure", s.step, s, opt, function() end)
      H.assert_error_like("GradScaler.load_state_dict", "empty", s.load_state_dict, s, {})
      H.assert_error_like("GradScaler.load_state_dict", "valid", s.load_state_dict, s,
                          { scale = -2, growth_factor = 2, backoff_factor = 0.5,
                            growth_interval = 10 })
      -- float16 gradients (a model converted with m:half()) cannot be unscaled
      local q = lm.zeros(2, { dtype = lm.float16, requires_grad = true })
      local opt16 = lm.optim.SGD({ q }, { lr = 1 })
      local s2 = G()
      s2:scale((q:float() * 1):sum()):backward()
      H.assert_error_like("GradScaler.unscale_", "float16", s2.unscale_, s2, opt16)
   end)

   it("does nothing when disabled", function()
      local p, opt, scaler, backward = scaler_setup({ enabled = false })
      assert.is_false(scaler:is_enabled())
      local loss = p:sum()
      assert.equal(loss, scaler:scale(loss))
      assert.equal(1, scaler:get_scale())
      backward(lm.tensor({ 1, 2, 3 }))
      scaler:unscale_(opt)
      scaler:step(opt)
      H.assert_close(p, { -1, -2, -3 })
      scaler:update()
      assert.same({}, scaler:state_dict())
      scaler:load_state_dict({})
   end)

   it("round-trips state_dict", function()
      local _, opt, scaler, backward = scaler_setup({ init_scale = 16, growth_interval = 5 })
      for _ = 1, 3 do
         backward(lm.tensor({ 1, 1, 1 })); scaler:step(opt); scaler:update()
      end
      local sd = scaler:state_dict()
      assert.same({ scale = 16, growth_factor = 2, backoff_factor = 0.5, growth_interval = 5,
                    _growth_tracker = 3 }, sd)
      local other = lm.amp.GradScaler()
      other:load_state_dict(sd)
      assert.same(sd, other:state_dict())
      assert.equal(16, other:get_scale())
      -- through a checkpoint's fields (JSON)
      local path = os.tmpname()
      lm.save_checkpoint(path, { model = nn.Linear(1, 1), fields = { scaler = sd } })
      local ck = lm.load_checkpoint(path)
      os.remove(path)
      local third = lm.amp.GradScaler()
      third:load_state_dict(ck.fields.scaler)
      assert.same(sd, third:state_dict())
   end)
end)

describe("a float16 training loop with GradScaler", function()
   it("learns, keeps float32 parameters and gradients, and keeps memory flat", function()
      lm.manual_seed(7)
      local m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
      local opt = lm.optim.SGD(m, { lr = 0.1, momentum = 0.9 })
      local scaler = lm.amp.GradScaler({ growth_interval = 10 })
      local x = lm.randn(64, 16)
      local y = x:narrow(2, 1, 4):argmax(2)
      local function step()
         opt:zero_grad()
         local loss = lm.autocast({ dtype = lm.float16 }, function()
            return F.cross_entropy(m(x), y)
         end)
         assert.equal("float32", dt(loss))
         scaler:scale(loss):backward()
         scaler:step(opt)
         scaler:update()
         return loss:item()
      end
      local first = step()
      for _ = 1, 9 do step() end
      collectgarbage(); collectgarbage()
      local base = lm.memory.live_bytes()
      local last
      for _ = 1, 40 do last = step() end
      collectgarbage(); collectgarbage()
      local after = lm.memory.live_bytes()
      assert.is_true(after <= base + 64 * 1024,
                     ("live bytes %d after 10 steps, %d after 50"):format(base, after))
      assert.is_true(last < 0.5 * first, ("loss %g -> %g"):format(first, last))
      for _, p in ipairs(m:parameters()) do
         assert.equal("float32", dt(p)); assert.equal("float32", dt(p.grad))
      end
      assert.is_true(scaler:get_scale() >= 65536)     -- no overflow in 50 steps: grew
   end)
end)

-- examples/train.lua --amp on a tiny generated IDX data set. The runs need the low-precision
-- conv2d / batch_norm / pool kernels (NEEDS_BF16_NN: skipped while a pcall probe fails).
local function probe_nn(d)
   return (pcall(function()
      local x = F.conv2d(lm.randn(2, 1, 4, 4):to(d), lm.randn(2, 1, 3, 3):to(d))
      x = F.batch_norm(x, lm.zeros(2), lm.ones(2), lm.ones(2), lm.zeros(2), { training = true })
      F.adaptive_avg_pool2d(F.max_pool2d(x, 2), 1)
   end))
end

local function write_idx(path, dims, fill)
   local f = assert(io.open(path, "wb"))
   f:write(string.char(0, 0, 8, #dims))
   local n = 1
   for _, d in ipairs(dims) do
      f:write(string.char(math.floor(d / 16777216) % 256, math.floor(d / 65536) % 256,
                          math.floor(d / 256) % 256, d % 256))
      n = n * d
   end
   local bytes = {}
   for i = 1, n do bytes[i] = string.char(fill(i)) end
   f:write(table.concat(bytes))
   f:close()
end

local function run_train(args)
   -- the example makes its tensors on the CPU (LUMEN_DEFAULT_DEVICE cleared for it)
   local p = assert(io.popen("LUMEN_DEFAULT_DEVICE= bin/lumen examples/train.lua --quiet " ..
                             "--threads 1 " .. args ..
                             " 2>&1; echo \"exit=$?\""))
   local out = p:read("*a")
   p:close()
   return out:match("exit=(%d+)%s*$"), out
end

describe("examples/train.lua --amp", function()
   local dir = os.tmpname() .. "-amp"
   setup(function()
      os.execute("mkdir -p " .. dir)
      local seed = 99
      for _, split in ipairs({ { "train", 128 }, { "t10k", 32 } }) do
         local labels = {}
         for i = 1, split[2] do
            seed = (seed * 1103515245 + 12345) % 2147483648
            labels[i] = seed % 10
         end
         write_idx(dir .. "/" .. split[1] .. "-images-idx3-ubyte", { split[2], 28, 28 },
                   function(i)
                      return (labels[math.floor((i - 1) / 784) + 1] * 25 + i % 7) % 256
                   end)
         write_idx(dir .. "/" .. split[1] .. "-labels-idx1-ubyte", { split[2] },
                   function(i) return labels[i] end)
      end
   end)
   teardown(function() os.execute("rm -rf " .. dir) end)

   local common = "--batch-size 32 --width 4 --eval-batch 32 --epochs 1 --workers 1 "

   it("rejects an unknown --amp", function()
      local code, out = run_train("--data " .. dir .. " --amp fp8")
      assert.equal("2", code, out)
      assert.truthy(out:find("--amp is bf16 or fp16", 1, true), out)
   end)

   for _, case in ipairs({ { "bf16", lm.bfloat16 }, { "fp16", lm.float16 } }) do
      local name = "trains with --amp " .. case[1]
      if probe_nn(case[2]) then
         it(name, function()
            local code, out = run_train(common .. "--data " .. dir .. " --amp " .. case[1] ..
                                        " --checkpoint " .. dir .. "/" .. case[1] .. ".ckpt")
            assert.equal("0", code, out)
            assert.truthy(out:find("mixed precision " .. case[1], 1, true), out)
            assert.truthy(out:find("final test accuracy", 1, true), out)
         end)
      else
         pending(name .. " (NEEDS_BF16_NN: no " .. tostring(case[2]) .. " conv kernels yet)")
      end
   end
end)
