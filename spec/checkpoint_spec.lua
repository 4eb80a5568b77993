-- lm.save_checkpoint / lm.load_checkpoint (lua/lumen/checkpoint.lua): model state, optimizer
-- state and user fields in one safetensors file, written atomically.

local H = require("spec.helpers")
local lm = H.lm
local CK = require("lumen.checkpoint")
local S = require("lumen.serialize")
local nn = lm.nn

local function tmpdir()
   local base = os.tmpname()
   os.remove(base)
   assert(os.execute("mkdir -p '" .. base .. "'"))
   return base
end

local function read_file(p)
   local f = assert(io.open(p, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

local function net()
   return nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 4))
end

local function train_steps(model, opt, n, cl)
   for i = 1, n do
      local x = lm.randn({ 4, 3, 8, 8 })
      if cl then x = x:to(lm.channels_last) end
      local y = lm.tensor({ 1, 2, 3, i % 4 + 1 }, { dtype = lm.int64 })
      opt:zero_grad()
      lm.F.cross_entropy(model(x), y):backward()
      opt:step()
   end
end

local function same_state(a, b)
   local sa, sb = a:state_dict(), b:state_dict()
   for k, v in pairs(sa) do
      assert.is_not_nil(sb[k], k)
      assert.is_true(v:equal(sb[k]), k)
   end
end

describe("lm.save_checkpoint / lm.load_checkpoint", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() os.execute("rm -rf '" .. dir .. "'"); collectgarbage() end)

   for _, case in ipairs({
      { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true } },
      { "Adam", { lr = 1e-3, betas = { 0.8, 0.99 }, weight_decay = 1e-4 } },
   }) do
      it("resumes training exactly (" .. case[1] .. ", channels-last)", function()
         lm.manual_seed(1)
         local m1 = net()
         lm.to_channels_last(m1)
         local o1 = lm.optim[case[1]](m1:parameters(), case[2])
         train_steps(m1, o1, 3, true)
         local path = dir .. "/ck.safetensors"
         CK.save_checkpoint(path, { model = m1, optimizer = o1, epoch = 3, best = 1 / 3 })

         local m2 = net()
         lm.to_channels_last(m2)
         local o2 = lm.optim[case[1]](m2:parameters(), { lr = 42 })
         local ck = CK.load_checkpoint(path, { model = m2, optimizer = o2 })
         assert.are.equal(3, ck.epoch)
         assert.are.equal(1 / 3, ck.best)
         same_state(m1, m2)
         assert.are.same(o1.param_groups[1].lr, o2.param_groups[1].lr)
         if case[1] == "Adam" then assert.are.same({ 0.8, 0.99 }, o2.param_groups[1].betas) end
         -- optimizer state restored in the parameters' format
         local p2 = m2:parameters()
         local st = o2.state[p2[1]]
         assert.is_not_nil(st)
         for _, v in pairs(st) do
            if lm.is_tensor(v) and v:dim() == 4 then
               assert.is_true(v:is_contiguous(lm.channels_last))
            end
         end
         -- both continue identically
         lm.manual_seed(7)
         train_steps(m1, o1, 2, true)
         lm.manual_seed(7)
         train_steps(m2, o2, 2, true)
         same_state(m1, m2)
      end)
   end

   it("keeps user fields: numbers (17 digits, inf, nan), strings, booleans, nested tables, " ..
      "tensors, dtypes", function()
      local path = dir .. "/u.safetensors"
      local t = lm.arange(6):view({ 2, 3 })
      CK.save_checkpoint(path, {
         epoch = 12, lr = 0.1 + 0.2, big = 2 ^ 60, neg = -1e-300, inf = math.huge,
         ninf = -math.huge, nan = 0 / 0, name = "run \"7\"\n", flag = false,
         cfg = { arch = "resnet50", widths = { 64, 128 }, [10] = "ten", nested = { deep = true } },
         extra = t, same = t, list = { lm.ones({ 2 }), lm.zeros({ 1 }) }, dt = lm.bfloat16,
         fmt = lm.channels_last,
      })
      local ck = CK.load_checkpoint(path)
      assert.are.equal(12, ck.epoch)
      assert.are.equal(0.1 + 0.2, ck.lr)
      assert.are.equal(2 ^ 60, ck.big)
      assert.are.equal(-1e-300, ck.neg)
      assert.are.equal(math.huge, ck.inf)
      assert.are.equal(-math.huge, ck.ninf)
      assert.is_true(ck.nan ~= ck.nan)
      assert.are.equal("run \"7\"\n", ck.name)
      assert.are.equal(false, ck.flag)
      assert.are.equal("resnet50", ck.cfg.arch)
      assert.are.same({ 64, 128 }, ck.cfg.widths)
      assert.are.equal("ten", ck.cfg[10])
      assert.is_true(ck.cfg.nested.deep)
      assert.is_true(ck.extra:equal(t:cpu()))      -- checkpoints load on the CPU
      assert.are.equal(ck.extra, ck.same)            -- one tensor, stored once
      assert.is_true(ck.list[1]:equal(lm.ones({ 2 }, { device = "cpu" })))
      assert.are.equal(lm.bfloat16, ck.dt)
      assert.are.equal(lm.channels_last, ck.fmt)
      assert.is_nil(ck.model)
      assert.is_nil(ck.optimizer)
   end)

   it("is an ordinary safetensors file (model.<key>, optimizer.<id>.<name>)", function()
      local m = net()
      local o = lm.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
      train_steps(m, o, 1)
      local path = dir .. "/plain.safetensors"
      CK.save_checkpoint(path, { model = m, optimizer = o })
      local t, meta = S.load(path)
      assert.is_not_nil(t["model.0.weight"])
      assert.is_not_nil(t["model.1.running_mean"])
      assert.is_not_nil(t["model.1.num_batches_tracked"])
      assert.is_not_nil(t["optimizer.1.momentum_buffer"])
      assert.is_not_nil(meta["lumen.checkpoint"])
      local ck = CK.load_checkpoint(path)
      assert.is_true(ck.model["0.weight"]:equal(m[1].weight:cpu()))
      assert.are.equal(0.9, ck.optimizer.param_groups[1].momentum)
   end)

   it("loads into a model by key (strict), and reports problems", function()
      local m = net()
      local path = dir .. "/m.safetensors"
      CK.save_checkpoint(path, { model = m })
      local other = nn.Sequential(nn.Linear(2, 2))
      local ok, err = pcall(CK.load_checkpoint, path, { model = other })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("load_state_dict", 1, true))
      ok, err = pcall(CK.load_checkpoint, path, { optimizer = lm.optim.SGD(m:parameters(),
                                                                            { lr = 1 }) })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("no optimizer state", 1, true))
      -- a state_dict table is accepted in place of the model
      CK.save_checkpoint(path, { model = m:state_dict() })
      local m2 = net()
      CK.load_checkpoint(path, { model = m2 })
      same_state(m, m2)
   end)

   it("writes atomically: a failing save keeps the previous checkpoint", function()
      local path = dir .. "/a.safetensors"
      CK.save_checkpoint(path, { model = net(), epoch = 1 })
      local before = read_file(path)
      local ok, err = pcall(CK.save_checkpoint, path, { model = net(), bad = function() end })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.save_checkpoint: ", 1, true))
      assert.truthy(tostring(err):find("function", 1, true))
      local cyc = {}
      cyc.self = cyc
      assert.is_false(pcall(CK.save_checkpoint, path, { cyc = cyc }))
      assert.is_false(pcall(CK.save_checkpoint, path, { model = 42 }))
      assert.is_false(pcall(CK.save_checkpoint, path, { x = { [true] = 1 } }))
      assert.are.equal(before, read_file(path))
      local p = io.popen("ls -A '" .. dir .. "'")
      local files = p:read("*a")
      p:close()
      assert.are.equal("a.safetensors\n", files)
   end)

   it("keeps the random generator's state and restores it on request", function()
      local path = dir .. "/rng.safetensors"
      lm.manual_seed(123)
      lm.rand({ 5 })
      CK.save_checkpoint(path, { step = 1 })
      local after = lm.rand({ 4 })
      lm.manual_seed(999)
      local ck = CK.load_checkpoint(path)             -- not restored unless asked
      assert.is_table(ck.rng_state)
      assert.is_false(lm.rand({ 4 }):equal(after))
      CK.load_checkpoint(path, { rng = true })
      assert.is_true(lm.rand({ 4 }):equal(after))
   end)

   it("errors name the function", function()
      local path = dir .. "/plain.safetensors"
      S.save({ a = lm.ones({ 1 }) }, path)
      local ok, err = pcall(CK.load_checkpoint, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.load_checkpoint: .*not a lumen checkpoint"))
      ok, err = pcall(CK.load_checkpoint, dir .. "/missing")
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.load_checkpoint: ", 1, true))
      ok, err = pcall(CK.save_checkpoint, 42, {})
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.save_checkpoint: ", 1, true))
      ok = pcall(CK.save_checkpoint, path, "x")
      assert.is_false(ok)
   end)
end)

describe("a Size in a checkpoint's user fields", function()
   it("is saved as the array it is (t:size() and t.shape carry a metatable)", function()
      local dir = tmpdir()
      local path = dir .. "/size.ckpt"
      local x = lm.zeros({ 2, 3, 4, 4 })
      lm.save_checkpoint(path, { shape = x.shape, sizes = x:size() })
      local back = lm.load_checkpoint(path)
      assert.same({ 2, 3, 4, 4 }, { back.shape[1], back.shape[2], back.shape[3], back.shape[4] })
      assert.equal(4, #back.sizes)
      os.remove(path)
   end)
end)
