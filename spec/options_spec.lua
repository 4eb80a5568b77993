-- spec/options_spec.lua -- every function and constructor that takes an options table rejects
-- a key it does not know with "lumen.<fn>: unknown option '<key>'", raised at the caller's line
-- (a misspelt option used to be ignored silently: nn.Conv2d(1, 2, 3, {paddding = 1}) built a
-- convolution without padding).
local H = require("spec.helpers")
local lm = H.lm
local nn, F = lm.nn, lm.F

local function x4() return lm.randn({ 2, 3, 4, 4 }) end

-- { name in the message, function(bad) that passes the options table `bad` }
local cases = {
   -- factories
   { "empty", function(o) return lm.empty({ 2 }, o) end },
   { "empty", function(o) return lm.empty(2, 3, o) end },
   { "zeros", function(o) return lm.zeros({ 2 }, o) end },
   { "ones", function(o) return lm.ones({ 2 }, o) end },
   { "full", function(o) return lm.full({ 2 }, 1, o) end },
   { "rand", function(o) return lm.rand({ 2 }, o) end },
   { "randn", function(o) return lm.randn({ 2 }, o) end },
   { "randint", function(o) return lm.randint(0, 5, { 2 }, o) end },
   { "arange", function(o) return lm.arange(0, 5, o) end },
   { "linspace", function(o) return lm.linspace(0, 1, 5, o) end },
   { "eye", function(o) return lm.eye(3, o) end },
   { "tensor", function(o) return lm.tensor({ 1, 2 }, o) end },
   { "tensor", function(o) return lm.tensor(1, o) end },
   { "tensor", function(o) return lm.tensor(lm.zeros({ 2 }), o) end },
   { "empty_strided", function(o) return lm.empty_strided({ 2 }, { 1 }, o) end },
   { "randperm", function(o) return lm.randperm(4, o) end },
   { "empty_like", function(o) return lm.empty_like(lm.zeros({ 2 }), o) end },
   { "zeros_like", function(o) return lm.zeros_like(lm.zeros({ 2 }), o) end },
   { "ones_like", function(o) return lm.ones_like(lm.zeros({ 2 }), o) end },
   { "full_like", function(o) return lm.full_like(lm.zeros({ 2 }), 3, o) end },
   { "rand_like", function(o) return lm.rand_like(lm.zeros({ 2 }), o) end },
   { "randn_like", function(o) return lm.randn_like(lm.zeros({ 2 }), o) end },
   { "randint_like", function(o) return lm.randint_like(lm.zeros({ 2 }), 5, o) end },
   -- tensor methods
   { "to", function(o) return lm.zeros({ 2 }):to(o) end },
   { "to", function(o) return lm.zeros({ 2 }):to(lm.float64, o) end },
   { "clone", function(o) return lm.zeros({ 2 }):clone(o) end },
   { "backward", function(o)
      local x = lm.ones({ 2 }, { requires_grad = true })
      return (x * 2):sum():backward(nil, o)
   end },
   -- functional
   { "conv2d", function(o) return F.conv2d(x4(), lm.randn({ 5, 3, 3, 3 }), nil, o) end },
   { "max_pool2d", function(o) o.kernel_size = 2; return F.max_pool2d(x4(), o) end },
   { "avg_pool2d", function(o) o.kernel_size = 2; return F.avg_pool2d(x4(), o) end },
   { "batch_norm", function(o)
      return F.batch_norm(x4(), lm.zeros({ 3 }), lm.ones({ 3 }), nil, nil, o)
   end },
   { "nll_loss", function(o)
      return F.nll_loss(lm.randn({ 2, 3 }), lm.tensor({ 1, 2 }, { dtype = lm.int64 }), o)
   end },
   { "cross_entropy", function(o)
      return F.cross_entropy(lm.randn({ 2, 3 }), lm.tensor({ 1, 2 }, { dtype = lm.int64 }), o)
   end },
   { "mse_loss", function(o) return F.mse_loss(lm.zeros({ 2 }), lm.ones({ 2 }), o) end },
   { "relu", function(o) return F.relu(lm.zeros({ 2 }), o) end },
   -- nn modules
   { "Conv2d", function(o) return nn.Conv2d(3, 4, 3, o) end },
   { "BatchNorm2d", function(o) return nn.BatchNorm2d(3, o) end },
   { "Linear", function(o) return nn.Linear(3, 4, o) end },
   { "MaxPool2d", function(o) o.kernel_size = 2; return nn.MaxPool2d(o) end },
   { "AvgPool2d", function(o) o.kernel_size = 2; return nn.AvgPool2d(o) end },
   { "ReLU", function(o) return nn.ReLU(o) end },
   { "Dropout", function(o) return nn.Dropout(o) end },
   { "CrossEntropyLoss", function(o) return nn.CrossEntropyLoss(o) end },
   { "NLLLoss", function(o) return nn.NLLLoss(o) end },
   { "MSELoss", function(o) return nn.MSELoss(o) end },
   { "Module.to", function(o) return nn.Linear(2, 2):to(o) end },
   { "load_state_dict", function(o)
      local m = nn.Linear(2, 2)
      return m:load_state_dict(m:state_dict(), o)
   end },
   { "nn.init.kaiming_uniform_", function(o)
      return nn.init.kaiming_uniform_(lm.empty({ 3, 3 }), o)
   end },
   { "nn.init.kaiming_normal_", function(o)
      return nn.init.kaiming_normal_(lm.empty({ 3, 3 }), o)
   end },
   -- optimizers
   { "SGD", function(o) o.lr = 0.1; return lm.optim.SGD({ lm.zeros({ 2 }) }, o) end },
   { "Adam", function(o) return lm.optim.Adam({ lm.zeros({ 2 }) }, o) end },
   { "AdamW", function(o) return lm.optim.AdamW({ lm.zeros({ 2 }) }, o) end },
   -- models
   { "models.alexnet", function(o) return lm.models.alexnet(o) end },
   { "models.small_resnet", function(o) return lm.models.small_resnet(o) end },
   { "models.resnet18", function(o) return lm.models.resnet18(o) end },
   { "models.resnext50_32x4d", function(o) return lm.models.resnext50_32x4d(o) end },
   { "models.r3d_18", function(o) return lm.models.r3d_18(o) end },
   { "models.r2plus1d_18", function(o) return lm.models.r2plus1d_18(o) end },
   { "models.ResNet", function(o) return lm.models.ResNet("BasicBlock", { 1, 1, 1, 1 }, o) end },
   -- checkpoints and the layout tools
   { "load_checkpoint", function(o) return lm.load_checkpoint("/nonexistent.ckpt", o) end },
   { "layout.check", function(o)
      return lm.layout.check(nn.ReLU(), lm.zeros({ 1, 1, 2, 2 }), o)
   end },
   { "layout.trace", function(o) return lm.layout.trace(function() end, o) end },
   { "layout.coverage", function(o) return lm.layout.coverage(o) end },
}

local function raises_at_caller(f, expected)
   local ok, msg = pcall(f)
   assert(not ok, "expected an error: " .. expected)
   assert(type(msg) == "string", "error is a " .. type(msg))
   local pos, body = msg:match("^([^%s]*:%d+: )(.*)$")
   assert(pos, "no position in " .. msg)
   assert(pos:find("options_spec.lua", 1, true), "error not raised at the caller's line: " .. msg)
   assert(body == expected, ("expected %q, got %q"):format(expected, msg))
end

describe("an unknown option", function()
   for i, case in ipairs(cases) do
      local fname, call = case[1], case[2]
      it(("is an error: %s (case %d)"):format(fname, i), function()
         raises_at_caller(function() call({ bogus_option = 1 }) end,
                          "lumen." .. fname .. ": unknown option 'bogus_option'")
      end)
   end

   it("names a misspelt option exactly", function()
      raises_at_caller(function() nn.Conv2d(1, 2, 3, { paddding = 1 }) end,
                       "lumen.Conv2d: unknown option 'paddding'")
      raises_at_caller(function() lm.zeros({ 2 }, { dtpye = lm.int64 }) end,
                       "lumen.zeros: unknown option 'dtpye'")
      raises_at_caller(function() lm.zeros({ 2 }, { lm.int64 }) end,
                       "lumen.zeros: unknown option '1'")
   end)
end)

describe("the known options", function()
   it("are all accepted", function()
      local x = lm.zeros({ 2, 3, 4, 4 })
      lm.zeros({ 2, 3, 4, 4 }, { dtype = lm.float64, device = "cpu",
                                 memory_format = lm.channels_last, requires_grad = true })
      lm.zeros_like(x, { dtype = lm.float64, device = "cpu", memory_format = lm.preserve_format,
                         requires_grad = true })
      lm.randperm(3, { dtype = lm.int64, device = "cpu", requires_grad = false })
      x:to({ dtype = lm.float64, device = "cpu", memory_format = lm.channels_last, copy = true })
      x:clone({ memory_format = lm.contiguous_format, dtype = lm.float64, requires_grad = true })
      nn.Conv2d(3, 4, 3, { stride = 1, padding = 1, dilation = 1, groups = 1, bias = false,
                           dtype = lm.float64, padding_mode = "zeros" })
      nn.BatchNorm2d(3, { eps = 1e-3, momentum = 0.2, affine = true, track_running_stats = true,
                          dtype = lm.float32 })
      nn.Linear(3, 4, { bias = true, dtype = lm.float32 })
      nn.MaxPool2d({ kernel_size = 2, stride = 2, padding = 0, dilation = 1, ceil_mode = false,
                     return_indices = false })
      nn.MaxPool2d({ 2, 2 })                -- a kernel size, not options
      nn.MaxPool2d(2, 2, 0)
      nn.AvgPool2d({ kernel_size = 2, stride = 2, padding = 0, ceil_mode = false,
                     count_include_pad = true, divisor_override = 4 })
      nn.ReLU({ inplace = true })
      nn.Dropout({ p = 0.1 })
      nn.CrossEntropyLoss({ reduction = "sum", ignore_index = -100 })
      F.relu(lm.zeros({ 2 }), { inplace = false })
      F.max_pool2d(x, { 2, 2 })
      lm.models.small_resnet({ width = 4, blocks = 1, in_channels = 3, num_classes = 5 })
      lm.models.alexnet({ num_classes = 5, dropout = 0.2 })
   end)

   it("F.relu with {inplace = false} is not in place", function()
      local x = lm.tensor({ -1.0, 2.0 })
      local y = F.relu(x, { inplace = false })
      assert.are.same({ -1, 2 }, x:totable())
      assert.are.same({ 0, 2 }, y:totable())
   end)
end)

describe("device in the nn constructors", function()
   it("places the parameters (cpu) and reports a device that is not there", function()
      local m = nn.Linear(2, 3, { device = "cpu" })
      assert.are.equal("cpu", m.weight:device())
      assert.are.equal("cpu", nn.BatchNorm2d(3, { device = "cpu" }).num_batches_tracked:device())
      assert.are.equal("cpu", nn.Conv2d(1, 2, 3, { device = "cpu" }).bias:device())
      local ok = pcall(function() return nn.Conv2d(1, 2, 3, { device = "gpu" }) end)
      assert.is_false(ok)
   end)
end)
