-- lm.nn: the Module base (registration, names, state_dict, to(), train/eval) and the layers
-- (PyTorch's defaults and initialisations, forward against lm.F, errors).

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local nn = lm.nn
local F = lm.F

local CL = lm.channels_last
local close = G.close

local function keys_of(named)
   local r = {}
   for i, nt in ipairs(named) do r[i] = nt[1] end
   return r
end

local function sorted_keys(t)
   local r = {}
   for k in pairs(t) do r[#r + 1] = k end
   table.sort(r)
   return r
end

-- a small ResNet-like block with PyTorch's attribute names
local Block = nn.Module:extend("Block")
function Block:__init(c)
   self.conv1 = nn.Conv2d(c, c, 3, { padding = 1, bias = false })
   self.bn1 = nn.BatchNorm2d(c)
   self.relu = nn.ReLU(true)
   self.conv2 = nn.Conv2d(c, c, 1, { bias = false })
   self.bn2 = nn.BatchNorm2d(c)
end
function Block:forward(x)
   local out = self.relu(self.bn1(self.conv1(x)))
   out = self.bn2(self.conv2(out))
   out = out + x
   return out:relu()
end

local Net = nn.Module:extend("Net")
function Net:__init()
   self.conv1 = nn.Conv2d(3, 4, 3, { padding = 1 })
   self.bn1 = nn.BatchNorm2d(4)
   self.layer1 = nn.Sequential(Block(4), Block(4))
   self.pool = nn.AdaptiveAvgPool2d(1)
   self.fc = nn.Linear(4, 3)
end
function Net:forward(x)
   local h = self.layer1(self.bn1(self.conv1(x)):relu())
   return self.fc(F.flatten(self.pool(h), 2))
end

describe("Module", function()
   it("names parameters and buffers as PyTorch does, in registration order", function()
      local net = Net()
      local names = keys_of(net:named_parameters())
      assert.are.same({
         "conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
         "layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
         "layer1.0.conv2.weight", "layer1.0.bn2.weight", "layer1.0.bn2.bias",
         "layer1.1.conv1.weight", "layer1.1.bn1.weight", "layer1.1.bn1.bias",
         "layer1.1.conv2.weight", "layer1.1.bn2.weight", "layer1.1.bn2.bias",
         "fc.weight", "fc.bias" }, names)
      assert.are.equal(#names, #net:parameters())
      for _, p in ipairs(net:parameters()) do assert.is_true(p.requires_grad) end
      local buf = keys_of(net:named_buffers())
      assert.are.same({ "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked" },
                      { buf[1], buf[2], buf[3] })
      for _, b in ipairs(net:buffers()) do assert.is_false(b.requires_grad) end
      local sd = net:state_dict()
      assert.are.equal(#names + #buf, #sorted_keys(sd))
      H.assert_dtype(sd["layer1.1.bn2.num_batches_tracked"], lm.int64)
      assert.are.equal(0, sd["bn1.num_batches_tracked"]:dim())
      local keys = net:state_keys()
      assert.are.same({ "conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                        "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked" },
                      { keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7] })
      -- state_dict tensors share storage and are detached
      assert.is_true(sd["fc.weight"]:is_same_storage(net.fc.weight))
      assert.is_false(sd["fc.weight"].requires_grad)
   end)

   it("calls forward and walks modules", function()
      local net = Net()
      local y = net(lm.randn({ 2, 3, 5, 5 }))
      H.assert_sizes(y, { 2, 3 })
      local mods = net:named_modules()
      assert.are.equal("", mods[1][1])
      assert.are.equal("conv1", mods[2][1])
      local paths = keys_of(mods)
      assert.is_truthy(table.concat(paths, " "):find("layer1.0.conv2", 1, true))
      assert.are.equal(5, #net:children())
      assert.are.equal(net.layer1, net.layer1)
      assert.are.equal(net.layer1[2], net.layer1:get(2))
      assert.are.equal(2, net.layer1:size())
   end)

   it("switches train / eval recursively", function()
      local net = Net()
      assert.is_true(net.layer1[1].bn1.training)
      net:eval()
      assert.is_false(net.training)
      assert.is_false(net.layer1[1].bn1.training)
      net:train()
      assert.is_true(net.layer1[2].bn2.training)
   end)

   it("zero_grad zeroes or drops gradients", function()
      local net = Net()
      F.cross_entropy(net(lm.randn({ 2, 3, 4, 4 })), lm.tensor({ 1, 3 }, { dtype = lm.int64 }))
         :backward()
      local g = net.fc.weight.grad
      assert.is_not_nil(g)
      net:zero_grad()
      assert.are.equal(g, net.fc.weight.grad)
      close(g:abs():sum(), { 0 })
      net:zero_grad(true)
      assert.is_nil(net.fc.weight.grad)
   end)

   it("to(channels_last) converts 4-D parameters only, keeping their identity", function()
      local net = Net()
      local w = net.conv1.weight
      local w1x1 = net.layer1[1].conv2.weight
      local fcw = net.fc.weight
      local before = w:clone()
      assert.are.equal(net, net:to(CL))
      assert.are.equal(w, net.conv1.weight)
      assert.is_true(w:is_contiguous(CL))
      H.assert_format_name(w:suggest_memory_format(), CL)
      -- the ambiguous 1x1 weight is tagged
      H.assert_format_name(w1x1:suggest_memory_format(), CL)
      H.assert_strides(fcw, { 4, 1 })
      close(w, before, 0)
      local y = net.conv1(lm.randn({ 1, 3, 4, 4 }))
      H.assert_format_name(y:suggest_memory_format(), CL)
      -- the rank rule: channels_last_3d on 4-D weights is an error
      H.assert_error_like("to", "rank 5", function() net:to(lm.channels_last_3d) end)
   end)

   it("depthwise conv weights get tagged by to(channels_last)", function()
      local m = nn.Conv2d(8, 8, 3, { groups = 8 })
      m:to(CL)
      H.assert_strides(m.weight, { 9, 1, 3, 1 })
      H.assert_format_name(m.weight:suggest_memory_format(), CL)
   end)

   it("to(dtype) converts floating tensors only", function()
      local net = Net()
      local opt_ref = net.fc.weight
      net:to(lm.float64)
      H.assert_dtype(net.fc.weight, lm.float64)
      assert.are.equal(opt_ref, net.fc.weight)
      H.assert_dtype(net.bn1.running_var, lm.float64)
      H.assert_dtype(net.bn1.num_batches_tracked, lm.int64)
      net:to({ dtype = lm.float32, memory_format = CL })
      H.assert_dtype(net.conv1.weight, lm.float32)
      assert.is_true(net.conv1.weight:is_contiguous(CL))
      H.assert_error_like("Module.to", "floating", function() net:to(lm.int64) end)
   end)

   it("load_state_dict copies values into the existing tensors", function()
      local a, b = Net(), Net()
      b:to(CL)
      b:load_state_dict(a:state_dict())
      close(b.conv1.weight, a.conv1.weight, 0)
      assert.is_true(b.conv1.weight:is_contiguous(CL))
      close(b.layer1[2].bn1.running_var, a.layer1[2].bn1.running_var, 0)
   end)

   it("load_state_dict reports missing, unexpected and mismatched keys", function()
      local net = Net()
      local sd = net:state_dict()
      sd["fc.bias"] = nil
      H.assert_error_like("load_state_dict", "missing key(s) in state_dict: fc.bias", function()
         net:load_state_dict(sd)
      end)
      sd = net:state_dict()
      sd["extra.weight"] = lm.zeros({ 1 })
      H.assert_error_like("load_state_dict", "unexpected key(s) in state_dict: extra.weight",
                          function() net:load_state_dict(sd) end)
      local r = net:load_state_dict(sd, { strict = false })
      assert.are.same({ "extra.weight" }, r.unexpected_keys)
      assert.are.same({}, r.missing_keys)
      sd = net:state_dict()
      sd["fc.weight"] = lm.zeros({ 3, 5 })
      H.assert_error_like("load_state_dict", "size mismatch for fc.weight", function()
         net:load_state_dict(sd, { strict = false })
      end)
      sd = net:state_dict()
      sd["fc.bias"] = nil
      r = net:load_state_dict(sd, { strict = false })
      assert.are.same({ "fc.bias" }, r.missing_keys)
   end)

   it("registers children assigned as fields, and prints like PyTorch", function()
      local s = tostring(Net())
      assert.is_truthy(s:find("(conv1): Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), " ..
                              "padding=(1, 1))", 1, true), s)
      assert.is_truthy(s:find("(fc): Linear(in_features=4, out_features=3, bias=True)", 1, true))
      assert.is_truthy(s:find("(relu): ReLU(inplace=True)", 1, true))
      assert.is_truthy(s:find("(0): Block(", 1, true))
   end)

   it("registers nn.Parameter fields and applies the rank rule of to()", function()
      local Mixed = nn.Module:extend("Mixed")
      function Mixed:__init()
         self.w2d = nn.Parameter(lm.randn({ 2, 3, 2, 2 }))
         self.w3d = nn.Parameter(lm.randn({ 2, 3, 2, 2, 2 }))
         self.scale = nn.Parameter(lm.ones({ 1 }), false)
         self.cache = lm.zeros({ 3 })                        -- a plain field, not registered
      end
      local m = Mixed()
      assert.are.same({ "w2d", "w3d", "scale" }, keys_of(m:named_parameters()))
      assert.is_true(m.w2d.requires_grad)
      assert.is_false(m.scale.requires_grad)
      H.assert_error_like("to", "rank 4", function() m:to(CL) end)
      local only3d = Mixed()
      only3d.w2d = nil
      only3d:to(lm.channels_last_3d)
      assert.is_true(only3d.w3d:is_contiguous(lm.channels_last_3d))
      H.assert_error_like("Parameter", "tensor expected", nn.Parameter, 3)
   end)

   it("supports shared parameters once", function()
      local lin = nn.Linear(3, 3)
      local seq = nn.Sequential(lin, nn.ReLU(), lin)
      assert.are.equal(2, #seq:parameters())
      assert.are.same({ "0.weight", "0.bias" }, keys_of(seq:named_parameters()))
   end)
end)

describe("layers", function()
   it("Conv2d has PyTorch's shapes and default initialisation", function()
      lm.manual_seed(0)
      local m = nn.Conv2d(16, 32, 3)
      H.assert_sizes(m.weight, { 32, 16, 3, 3 })
      H.assert_sizes(m.bias, { 32 })
      local bound = 1 / math.sqrt(16 * 9)
      assert.is_true(m.weight:abs():max():item() <= bound + 1e-7)
      assert.is_true(m.bias:abs():max():item() <= bound + 1e-7)
      -- uniform(-b, b) has std b / sqrt(3)
      local std = m.weight:pow(2):mean():sqrt():item()
      assert.is_true(math.abs(std - bound / math.sqrt(3)) < 0.1 * bound, "std " .. std)
      local g = nn.Conv2d(4, 6, { 3, 1 }, { groups = 2, bias = false, stride = 2 })
      H.assert_sizes(g.weight, { 6, 2, 3, 1 })
      assert.is_nil(g.bias)
      assert.are.equal(1, #g:parameters())
   end)

   it("Conv2d forward equals F.conv2d", function()
      local m = nn.Conv2d(3, 5, 3, { stride = 2, padding = 1, dilation = 1 })
      local x = lm.randn({ 2, 3, 7, 7 })
      close(m(x), F.conv2d(x, m.weight, m.bias, { stride = 2, padding = 1 }), 1e-6)
   end)

   it("Conv2d rejects bad configurations", function()
      H.assert_error_like("Conv2d", "divisible by groups", nn.Conv2d, 3, 4, 3, { groups = 2 })
      H.assert_error_like("Conv2d", "in_channels", nn.Conv2d, 0, 4, 3)
      H.assert_error_like("Conv2d", "padding_mode", nn.Conv2d, 3, 4, 3,
                          { padding_mode = "reflect" })
      local m = nn.Conv2d(3, 4, 3)
      H.assert_error_like("conv2d", "channels", function() m(lm.randn({ 1, 2, 5, 5 })) end)
   end)

   it("Linear has PyTorch's default initialisation and forward", function()
      local m = nn.Linear(20, 7)
      H.assert_sizes(m.weight, { 7, 20 })
      local bound = 1 / math.sqrt(20)
      assert.is_true(m.weight:abs():max():item() <= bound + 1e-7)
      assert.is_true(m.bias:abs():max():item() <= bound + 1e-7)
      local x = lm.randn({ 3, 20 })
      close(m(x), x:matmul(m.weight:t()) + m.bias, 1e-5)
      assert.is_nil(nn.Linear(2, 3, { bias = false }).bias)
   end)

   it("BatchNorm2d starts at weight 1, bias 0, mean 0, var 1 and tracks batches", function()
      local bn = nn.BatchNorm2d(3)
      close(bn.weight, { 1, 1, 1 }, 0)
      close(bn.bias, { 0, 0, 0 }, 0)
      close(bn.running_mean, { 0, 0, 0 }, 0)
      close(bn.running_var, { 1, 1, 1 }, 0)
      local x = lm.randn({ 4, 3, 2, 2 }, { dtype = lm.float32 }) * 2 + 1
      bn(x)
      assert.are.equal(1, bn.num_batches_tracked:item())
      local m = x:mean({ 1, 3, 4 })
      local v = ((x - m:view({ 1, 3, 1, 1 })) ^ 2):sum({ 1, 3, 4 }) / 15      -- unbiased
      close(bn.running_mean, m * 0.1, 1e-5)
      close(bn.running_var, v * 0.1 + 0.9, 1e-5)
      -- eval mode normalises with the running statistics
      bn:eval()
      local y = bn(x)
      local ref = (x - bn.running_mean:view({ 1, 3, 1, 1 })) /
                  (bn.running_var:view({ 1, 3, 1, 1 }) + 1e-5):sqrt()
      close(y, ref, 1e-5)
      assert.are.equal(1, bn.num_batches_tracked:item())
      H.assert_error_like("BatchNorm2d", "expected 4D input", function() bn(lm.randn({ 2, 3 })) end)
   end)

   it("BatchNorm2d with momentum = false keeps a cumulative average", function()
      local bn = nn.BatchNorm2d(2, { momentum = false })
      local a = lm.randn({ 3, 2, 2, 2 })
      local b = lm.randn({ 3, 2, 2, 2 }) + 3
      bn(a)
      bn(b)
      local ma, mb = a:mean({ 1, 3, 4 }), b:mean({ 1, 3, 4 })
      close(bn.running_mean, (ma + mb) / 2, 1e-5)
      assert.are.equal(2, bn.num_batches_tracked:item())
      assert.is_truthy(tostring(bn):find("momentum=None", 1, true))
   end)

   it("BatchNorm2d without affine or running stats", function()
      local bn = nn.BatchNorm2d(2, { affine = false, track_running_stats = false })
      assert.are.equal(0, #bn:parameters())
      assert.are.equal(0, #bn:buffers())
      bn:eval()
      local x = lm.randn({ 3, 2, 2, 2 })
      local y = bn(x)      -- batch statistics even in eval mode
      close(y:mean({ 1, 3, 4 }), { 0, 0 }, 1e-5)
   end)

   it("pools, activations, flatten, identity, dropout", function()
      local x = lm.randn({ 2, 3, 6, 6 })
      close(nn.MaxPool2d({ kernel_size = 3, stride = 2, padding = 1 })(x),
            F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 }), 0)
      close(nn.MaxPool2d(2)(x), F.max_pool2d(x, 2), 0)
      close(nn.AvgPool2d(3, 2, 1)(x), F.avg_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 }),
            0)
      close(nn.AdaptiveAvgPool2d({ 2, 3 })(x), F.adaptive_avg_pool2d(x, { 2, 3 }), 0)
      close(nn.AdaptiveMaxPool2d(1)(x), (F.adaptive_max_pool2d(x, 1)), 0)
      H.assert_sizes(nn.Flatten()(x), { 2, 108 })
      H.assert_sizes(nn.Flatten(1)(x), { 216 })
      assert.are.equal(x, nn.Identity()(x))
      close(nn.ReLU()(x), x:relu(), 0)
      local xr = x:clone()
      local r = nn.ReLU(true)(xr)
      assert.are.equal(xr, r)
      local d = nn.Dropout(0.5)
      assert.are_not.equal(x, d(x))
      d:eval()
      assert.are.equal(x, d(x))
      H.assert_error_like("Dropout", "between 0 and 1", nn.Dropout, 2)
      assert.are.equal("MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, " ..
                       "ceil_mode=False)", tostring(nn.MaxPool2d(2)))
   end)

   it("Sequential builds from a list and by add", function()
      local s = nn.Sequential({ nn.Linear(3, 4), nn.ReLU() })
      s:add(nn.Linear(4, 2))
      assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, keys_of(s:named_parameters()))
      H.assert_sizes(s(lm.randn({ 5, 3 })), { 5, 2 })
      H.assert_error_like("Sequential", "not a Module", nn.Sequential, nn.ReLU(), 3)
   end)

   it("losses as modules", function()
      local x = lm.randn({ 4, 3 })
      local t = lm.tensor({ 1, 2, 3, 1 }, { dtype = lm.int64 })
      close(nn.CrossEntropyLoss()(x, t), F.cross_entropy(x, t), 0)
      close(nn.NLLLoss()(F.log_softmax(x, 2), t), F.cross_entropy(x, t), 1e-6)
   end)

   it("gradients of a whole network match finite differences (float64, both formats)", function()
      for _, fmt in ipairs({ lm.contiguous_format, CL }) do
         lm.manual_seed(4)
         local net = nn.Sequential(nn.Conv2d(2, 3, 3, { padding = 1 }), nn.BatchNorm2d(3),
                                   nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 2))
         net:to(lm.float64):to(fmt)
         local x = G.input({ 2, 2, 4, 4 }, fmt, 5)
         local params = net:parameters()
         local inputs = { x }
         for _, p in ipairs(params) do inputs[#inputs + 1] = p end
         G.check(function(u) return net(u) end, inputs)
         for _, p in ipairs(params) do
            H.assert_strides(p.grad, p:stride(), "grad layout")
         end
      end
   end)
end)
