-- Fused kernels: batch_norm with {relu=, residual=} (and the automatic fusion of an in-place
-- relu_ after batch_norm) against the same computation done op by op; the single-pass optimizer
-- steps against the generic path (a strided parameter forces the generic elementwise path).
local lm = require("lumen")
local F = lm.F

local function maxdiff(a, b)
   if a == nil and b == nil then return 0 end
   return (a - b):abs():max():item()
end

local function close(tag, a, b, tol)
   if a == nil and b == nil then return end
   assert.is_not_nil(a, tag)
   assert.is_not_nil(b, tag)
   local d = maxdiff(a, b)
   local scale = math.max(1, b:abs():max():item())
   assert.is_true(d <= tol * scale, tag .. ": max difference " .. d)
end

describe("fused batch_norm", function()
   local shapes = { { 4, 16, 5, 7 }, { 3, 17, 4, 4 }, { 2, 3, 5, 5 }, { 8, 64, 7, 7 } }
   -- 1: batch_norm then relu_ (fused by autograd), 2: {relu}, 3: {residual, relu}, 4: {residual}
   local modes = { "bn+relu_", "relu", "residual+relu", "residual" }
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         for _, training in ipairs({ true, false }) do
            for mode = 1, 4 do
               local name = string.format("%s %s training=%s %s", tostring(dt), tostring(fmt),
                                          tostring(training), modes[mode])
               it(name .. ": values, gradients, running stats and formats", function()
                  lm.manual_seed(3)
                  local tol = dt == lm.float32 and 2e-5 or 1e-10
                  for _, sz in ipairs(shapes) do
                     local function mk() return lm.randn(sz, { dtype = dt }):contiguous(fmt) end
                     local x0, r0, g = mk(), mk(), mk()
                     local C = sz[2]
                     local w0, b0 = lm.randn({ C }, { dtype = dt }), lm.randn({ C }, { dtype = dt })
                     local function run(fused)
                        local x = x0:clone():requires_grad_()
                        local r = r0:clone():requires_grad_()
                        local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
                        local rm = lm.zeros({ C }, { dtype = dt })
                        local rv = lm.ones({ C }, { dtype = dt })
                        local opts = { training = training }
                        local y
                        if fused then
                           if mode == 1 then
                              y = F.batch_norm(x, rm, rv, w, b, opts):relu_()
                           else
                              opts.relu = mode ~= 4
                              if mode >= 3 then opts.residual = r end
                              y = F.batch_norm(x, rm, rv, w, b, opts)
                           end
                        else
                           local t = F.batch_norm(x, rm, rv, w, b, opts) * 1 -- no fusion
                           if mode >= 3 then t = t + r end
                           if mode ~= 4 then t = t:relu() end
                           y = t
                        end
                        y:backward(g)
                        return { y, x.grad, w.grad, b.grad, mode >= 3 and r.grad or nil, rm, rv }
                     end
                     local a, e = run(true), run(false)
                     local what = { "output", "grad x", "grad weight", "grad bias", "grad residual",
                                    "running_mean", "running_var" }
                     local shape = table.concat(sz, "x")
                     for i = 1, 7 do close(shape .. " " .. what[i], a[i], e[i], tol) end
                     assert.is_true(a[1]:is_contiguous(fmt), "output format")
                     assert.is_true(a[2]:is_contiguous(fmt), "grad x format")
                  end
               end)
            end
         end
      end
   end

   it("falls back to separate ops for a broadcast residual", function()
      local x = lm.randn({ 4, 8, 3, 3 }):requires_grad_()
      local r = lm.randn({ 8, 1, 1 }):requires_grad_()
      local y = F.batch_norm(x, nil, nil, nil, nil, { training = true, residual = r, relu = true })
      local ref = (F.batch_norm(x, nil, nil, nil, nil, { training = true }) + r):relu()
      close("broadcast residual", y, ref, 1e-6)
      y:sum():backward()
      assert.are.same({ 8, 1, 1 }, r.grad:size())
   end)

   it("works without recording (no_grad)", function()
      lm.no_grad(function()
         local x = lm.randn({ 4, 8, 3, 3 })
         local y = F.batch_norm(x, nil, nil, nil, nil,
                                { training = true, residual = x, relu = true })
         assert.is_true(y:min():item() >= 0)
      end)
   end)
end)

describe("fused batch_norm: strided inputs, gradcheck, 16-bit", function()
   local gradcheck = require("spec.gradcheck")

   for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
      it(tostring(fmt) .. ": strided x and residual (views that are dense in no format)",
         function()
         lm.manual_seed(5)
         for _, training in ipairs({ true, false }) do
            -- every other channel and column of a wider tensor: dense in no memory format
            local function mk()
               return lm.randn({ 3, 10, 6, 10 }):contiguous(fmt)
                  :narrow(2, 1, 5):narrow(4, 2, 5)
            end
            local xb, rb, g = mk(), mk(), lm.randn({ 3, 5, 6, 5 })
            local w0, b0 = lm.randn({ 5 }), lm.randn({ 5 })
            local function run(fused)
               local x, r = xb:detach():requires_grad_(), rb:detach():requires_grad_()
               local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
               local rm, rv = lm.zeros({ 5 }), lm.ones({ 5 })
               local y
               if fused then
                  y = F.batch_norm(x, rm, rv, w, b, { training = training, residual = r,
                                                       relu = true })
               else
                  -- the separate ops (the * 1 stops autograd's fusion of a relu_)
                  local t = F.batch_norm(x, rm, rv, w, b, { training = training }) * 1
                  y = (t + r):relu()
               end
               y:backward(g)
               return { y, x.grad, w.grad, b.grad, r.grad, rm, rv }
            end
            local a, e = run(true), run(false)
            for i = 1, 7 do close("strided " .. i, a[i], e[i], 2e-5) end
         end
      end)

      it(tostring(fmt) .. ": gradcheck (float64) of every fused form", function()
         for mode = 1, 3 do
            local x = gradcheck.input({ 2, 3, 3, 2 }, fmt, 11)
            local r = gradcheck.input({ 2, 3, 3, 2 }, fmt, 12)
            local w = gradcheck.input({ 3 }, nil, 13)
            local b = gradcheck.input({ 3 }, nil, 14)
            gradcheck.check(function(xx, ww, bb, rr)
               if mode == 1 then       -- batch_norm then relu_ (autograd's fusion)
                  return F.batch_norm(xx, nil, nil, ww, bb, { training = true }):relu_()
               elseif mode == 2 then
                  return F.batch_norm(xx, nil, nil, ww, bb, { training = true, relu = true })
               end
               return F.batch_norm(xx, nil, nil, ww, bb, { training = true, residual = rr,
                                                          relu = true })
            end, mode == 3 and { x, w, b, r } or { x, w, b })
         end
      end)

      for _, dt in ipairs({ lm.bfloat16, lm.float16 }) do
         it(tostring(fmt) .. " " .. tostring(dt) .. ": fused against the separate ops",
            function()
            lm.manual_seed(6)
            for _, training in ipairs({ true, false }) do
               local sz = { 4, 24, 5, 6 }
               local xb = lm.randn(sz):to(dt):contiguous(fmt)
               local rb = lm.randn(sz):to(dt):contiguous(fmt)
               local g = lm.randn(sz):to(dt):contiguous(fmt)
               local w0, b0 = lm.randn({ 24 }), lm.randn({ 24 })  -- float32 (autocast's case)
               -- the reference: the separate ops in float32 on the same (16-bit) values. The
               -- fused op computes in float32 and rounds once, so it stays within a rounding of
               -- it; the separate 16-bit ops would round the batch norm's result before the add,
               -- which can flip the sign of a sum near zero and so the relu's mask.
               local function run(fused)
                  local x, r = xb:detach(), rb:detach()
                  if not fused then x, r = x:float(), r:float() end
                  x, r = x:requires_grad_(), r:requires_grad_()
                  local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
                  local rm, rv = lm.zeros({ 24 }), lm.ones({ 24 })
                  local y
                  if fused then
                     y = F.batch_norm(x, rm, rv, w, b, { training = training, residual = r,
                                                          relu = true })
                     y:backward(g)
                  else
                     local t = F.batch_norm(x, rm, rv, w, b, { training = training }) * 1
                     y = (t + r):relu()
                     y:backward(g:float())
                  end
                  return { y, x.grad, w.grad, b.grad, r.grad, rm, rv }
               end
               local a, e = run(true), run(false)
               local tol = dt == lm.bfloat16 and 2e-2 or 4e-3
               local what = { "output", "grad x", "grad weight", "grad bias", "grad residual",
                              "running_mean", "running_var" }
               for i = 1, 7 do close(what[i], a[i]:float(), e[i]:float(), tol) end
               assert.are.equal(dt, a[1]:dtype())
               assert.are.equal(dt, a[2]:dtype())
               assert.are.equal(dt, a[5]:dtype())
               assert.is_true(a[1]:is_contiguous(fmt), "output format")
               assert.is_true(a[2]:is_contiguous(fmt), "grad x format")
               assert.is_true(a[5]:is_contiguous(fmt), "grad residual format")
            end
         end)
      end
   end
end)

describe("ResNet blocks in training: fused batch norms == the modules op by op", function()
   local nn = lm.nn
   -- a ReLU that nn.utils.bn_relu does not recognise: the block then runs op by op
   local PlainReLU = nn.Module:extend("PlainReLU")
   function PlainReLU:forward(x) return x:relu_() end
   local function unfuse(m)
      for _, sub in ipairs(m:modules()) do
         if rawget(sub, "relu") ~= nil and lm.is_tensor(sub.relu) == false then
            sub.relu = PlainReLU()
         end
      end
   end
   local function grads(m)
      local t = {}
      for _, np in ipairs(m:named_parameters()) do t[np[1]] = np[2].grad end
      for _, nb in ipairs(m:named_buffers()) do t[nb[1]] = nb[2] end
      return t
   end
   -- a video BasicBlock (the last block of a stage) of an 18-layer video model
   local function video_block(name, layer)
      return function()
         lm.manual_seed(31)
         return lm.models[name]({ num_classes = 2 })[layer][2]
      end
   end
   local cases = {
      { "BasicBlock (downsample)", function() return lm.models.BasicBlock(8, 16, 2,
         nn.Sequential(nn.Conv2d(8, 16, 1, { stride = 2, bias = false }), nn.BatchNorm2d(16)))
         end, { 2, 8, 12, 12 } },
      { "Bottleneck", function() return lm.models.Bottleneck(16, 4) end, { 2, 16, 12, 12 } },
      -- 64x64: layer4's batch norms see 2x2 pixels of 2 images (at 32x32, 2 values a channel,
      -- whose variance turns summation-order differences into 5e-3 on the emulated CUDA device)
      { "resnet18", function() return lm.models.resnet18({ num_classes = 5 }) end,
        { 2, 3, 64, 64 } },
      { "small_resnet", function() return lm.models.small_resnet({ width = 4 }) end,
        { 2, 1, 12, 12 } },
      { "r3d_18 block", video_block("r3d_18", "layer1"), { 2, 64, 3, 5, 5 } },
      { "r2plus1d_18 block", video_block("r2plus1d_18", "layer1"), { 2, 64, 3, 5, 5 } },
   }
   for _, c in ipairs(cases) do
      local cl = #c[3] == 5 and lm.channels_last_3d or lm.channels_last
      for _, fmt in ipairs({ cl, lm.contiguous_format }) do
         it(c[1] .. " " .. tostring(fmt), function()
            lm.manual_seed(21)
            local m1 = c[2]()
            local m2 = c[2]()
            m2:load_state_dict(m1:state_dict())
            unfuse(m2)
            assert.are.equal("PlainReLU", m2.relu:type_name())
            m1:to(fmt)
            m2:to(fmt)
            local x0 = lm.randn(c[3]):contiguous(fmt)
            local outs = {}
            for k, m in ipairs({ m1, m2 }) do
               m:train()
               local x = x0:detach():requires_grad_()
               local y = m(x)
               -- the second step runs on updated running statistics (and momentum)
               y = m(x) + y
               local g = lm.ones(y:size())
               y:backward(y:dim() >= 4 and g:contiguous(fmt) or g)
               outs[k] = { y = y, gx = x.grad, g = grads(m) }
            end
            close("output", outs[1].y, outs[2].y, 1e-5)
            close("grad input", outs[1].gx, outs[2].gx, 1e-4)
            if outs[1].y:dim() >= 4 then
               assert.is_true(outs[1].y:is_contiguous(fmt), "output format")
            end
            assert.is_true(outs[1].gx:is_contiguous(fmt), "grad format")
            for k, v in pairs(outs[2].g) do
               close(k, outs[1].g[k], v, 1e-4)
            end
         end)
      end
   end
end)

describe("nn.utils.bn_relu: bad input", function()
   it("names the function and the argument", function()
      local nn = lm.nn
      local bn, relu, x = nn.BatchNorm2d(3), nn.ReLU(true), lm.randn({ 2, 3, 4, 4 })
      local ok, err = pcall(nn.utils.bn_relu, nil, relu, x)
      assert.is_false(ok)
      assert.truthy(err:find("lumen.nn.utils.bn_relu: bn: Module expected, got nil", 1, true), err)
      ok, err = pcall(nn.utils.bn_relu, bn, "relu", x)
      assert.is_false(ok)
      assert.truthy(err:find("relu: Module expected, got string", 1, true), err)
      ok, err = pcall(nn.utils.bn_relu, bn, relu, "x")
      assert.is_false(ok)
      assert.truthy(err:find("BatchNorm2d", 1, true), err)
   end)
end)

describe("fused optimizer steps", function()
   local cases = {
      { "SGD", { lr = 0.1 } }, { "SGD", { lr = 0.1, momentum = 0.9 } },
      { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 5e-4 } },
      { "SGD", { lr = 0.1, momentum = 0.9, dampening = 0.3, weight_decay = 1e-2,
                 maximize = true } },
      { "Adam", { lr = 1e-2 } }, { "Adam", { lr = 1e-2, weight_decay = 0.1, amsgrad = true } },
      { "Adam", { lr = 1e-2, maximize = true } },
      { "AdamW", { lr = 1e-2 } }, { "AdamW", { lr = 1e-2, amsgrad = true, maximize = true } },
   }
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, c in ipairs(cases) do
         local opts = {}
         for k, v in pairs(c[2]) do opts[#opts + 1] = k .. "=" .. tostring(v) end
         table.sort(opts)
         it(string.format("%s %s {%s}: fused == generic", tostring(dt), c[1],
                          table.concat(opts, ", ")), function()
            lm.manual_seed(0)
            local n = 37
            local v = lm.randn({ n }, { dtype = dt })
            local p1 = v:clone():requires_grad_()            -- dense: the fused kernel
            local p2 = lm.zeros({ n, 2 }, { dtype = dt }):select(2, 1) -- strided: generic ops
            p2:copy_(v)
            p2:requires_grad_()
            local o1, o2 = lm.optim[c[1]]({ p1 }, c[2]), lm.optim[c[1]]({ p2 }, c[2])
            for _ = 1, 6 do
               local g = lm.randn({ n }, { dtype = dt })
               p1.grad, p2.grad = g:clone(), g:clone()
               o1:step()
               o2:step()
            end
            local d = (p1 - p2):abs():max():item()
            assert.is_true(d <= (dt == lm.float32 and 1e-6 or 1e-14), "difference " .. d)
         end)
      end
   end
end)

-- lumen.nn.fold.block_add: relu(residual + seq(x)) for a Sequential (Conv2d, BatchNorm2d)
-- (RegNet's block tail), the add and the ReLU inside the batch norm (training) or the
-- convolution's epilogue (evaluation, folded per call or by nn.fold_batch_norm), against the
-- same modules run op by op
describe("nn.fold.block_add", function()
   local fold = require("lumen.nn.fold")
   local nn = lm.nn
   -- the same modules and operands on every call
   local function setup()
      lm.manual_seed(5)
      local seq = nn.Sequential({ nn.Conv2d(24, 24, 1, { bias = false }), nn.BatchNorm2d(24) })
      lm.to_channels_last(seq)
      local bn = seq:get(2)
      lm.no_grad(function()
         bn.running_mean:copy_(lm.randn({ 24 }) * 0.1)
         bn.running_var:copy_(lm.rand({ 24 }) + 0.5)
         bn.weight:copy_(lm.randn({ 24 }))
         bn.bias:copy_(lm.randn({ 24 }))
      end)
      local x = lm.randn({ 2, 24, 5, 6 }):contiguous(lm.channels_last)
      local r = lm.randn({ 2, 24, 5, 6 }):contiguous(lm.channels_last)
      return seq, x, r
   end
   local function plain(seq, x, r) return nn.ReLU()(r + seq(x)) end

   it("training: values, gradients and running statistics as op by op, channels-last", function()
      local g = lm.randn({ 2, 24, 5, 6 }):contiguous(lm.channels_last)
      local function run(fused)
         local s, x0, r0 = setup()
         local x, r = x0:clone():requires_grad_(), r0:clone():requires_grad_()
         local y = fused and fold.block_add(s, x, r, nn.ReLU(true)) or plain(s, x, r)
         y:backward(g)
         return y, x.grad, r.grad, s:get(1).weight.grad, s:get(2).weight.grad,
                s:get(2).running_mean
      end
      local ya, xa, ra, wa, ba, ma = run(true)
      local yb, xb, rb, wb, bb, mb = run(false)
      close("y", ya, yb, 2e-5)
      close("grad x", xa, xb, 2e-5)
      close("grad residual", ra, rb, 2e-5)
      close("grad conv weight", wa, wb, 2e-5)
      close("grad bn weight", ba, bb, 2e-5)
      close("running mean", ma, mb, 1e-6)
      assert.is_true(ya:is_contiguous(lm.channels_last))
      assert.is_true(xa:is_contiguous(lm.channels_last))
   end)

   it("evaluation: folded per call, after nn.fold_batch_norm, and wrapped", function()
      local seq, x, r = setup()
      seq:eval()
      local want = lm.no_grad(function() return plain(seq, x, r) end)
      local y1 = lm.no_grad(function() return fold.block_add(seq, x, r, nn.ReLU(true)) end)
      close("folded per call", y1, want, 1e-5)
      local folded = setup()
      folded:eval()
      lm.nn.fold_batch_norm(folded)
      assert.are.equal("Identity", folded:get(2):type_name())
      local y2 = lm.no_grad(function()
         return fold.block_add(folded, x, r, nn.ReLU(true))
      end)
      close("after fold_batch_norm", y2, want, 1e-5)
      -- without the ReLU (MobileNet's and EfficientNet's blocks): residual + bn(conv(x))
      local want_add = lm.no_grad(function() return r + seq(x) end)
      local y4 = lm.no_grad(function() return fold.conv_bn_add(seq:get(1), seq:get(2), x, r) end)
      close("add, folded per call", y4, want_add, 1e-5)
      local y5 = lm.no_grad(function()
         return fold.conv_bn_add(folded:get(1), folded:get(2), x, r)
      end)
      close("add, after fold_batch_norm", y5, want_add, 1e-5)
      -- a module whose forward was replaced on the instance sees its own call
      local seen = 0
      local conv = seq:get(1)
      local orig = conv.forward
      conv.forward = function(self, ...)
         seen = seen + 1
         return orig(self, ...)
      end
      local y3 = lm.no_grad(function() return fold.block_add(seq, x, r, nn.ReLU(true)) end)
      conv.forward = nil
      assert.are.equal(1, seen)
      close("wrapped", y3, want, 1e-5)
      assert.is_true(y1:is_contiguous(lm.channels_last) and y2:is_contiguous(lm.channels_last))
   end)
end)

describe("nn.fold.scale_add (ConvNeXt's layer-scaled residual)", function()
   local fold = require("lumen.nn.fold")
   local function operands()
      lm.manual_seed(41)
      local x = lm.randn({ 2, 24, 5, 6 }):contiguous(lm.channels_last)
      -- y as ConvNeXt makes it: an N x H x W x C result permuted back (channels-last)
      local y = lm.randn({ 2, 5, 6, 24 }):permute(1, 4, 2, 3)
      local scale = lm.randn({ 24, 1, 1 })
      return x, y, scale
   end

   it("evaluation without gradients: one pass, the bits of scale * y + x, channels-last", function()
      local x, y, scale = operands()
      local sd = lm.ops.StochasticDepth(0.2, "row")
      sd:eval()
      local got = lm.no_grad(function() return fold.scale_add(sd, scale, y, x) end)
      assert.are.equal(0, maxdiff(got, scale * y + x))
      assert.is_true(got:is_contiguous(lm.channels_last))
      -- p = 0 in training is the identity too
      local sd0 = lm.ops.StochasticDepth(0, "row")
      sd0:train()
      local got0 = lm.no_grad(function() return fold.scale_add(sd0, scale, y, x) end)
      assert.are.equal(0, maxdiff(got0, scale * y + x))
   end)

   it("training with stochastic depth, gradients, a wrapped forward: as written", function()
      local x, y, scale = operands()
      local sd = lm.ops.StochasticDepth(0.5, "row")
      sd:train()
      lm.manual_seed(7)
      local got = lm.no_grad(function() return fold.scale_add(sd, scale, y, x) end)
      lm.manual_seed(7)
      local want = lm.no_grad(function() return sd(scale * y) + x end)
      assert.are.equal(0, maxdiff(got, want))
      -- gradients reach scale, y and x
      sd:eval()
      local s2 = scale:clone():requires_grad_(true)
      local y2 = y:clone():requires_grad_(true)
      local x2 = x:clone():requires_grad_(true)
      fold.scale_add(sd, s2, y2, x2):sum():backward()
      close("grad scale", s2.grad, y:sum({ 1, 3, 4 }):reshape({ 24, 1, 1 }), 1e-5)
      close("grad y", y2.grad, (scale * lm.ones_like(y)):contiguous(), 0)
      close("grad x", x2.grad, lm.ones_like(x), 0)
      -- a wrapper on the stochastic depth's forward sees its call
      local seen = 0
      sd.forward = function(self, t) seen = seen + 1; return t end
      local got3 = lm.no_grad(function() return fold.scale_add(sd, scale, y, x) end)
      assert.are.equal(1, seen)
      assert.are.equal(0, maxdiff(got3, scale * y + x))
   end)
end)

describe("nn.Sequential: an in-place activation after a batch norm or convolution", function()
   local nn = lm.nn
   -- (conv, bn, act) as torchvision's Conv2dNormActivation; the same weights every call
   local function net(act, inplace)
      lm.manual_seed(11)
      local seq = nn.Sequential(nn.Conv2d(8, 16, 3, { padding = 1 }), nn.BatchNorm2d(16),
                                nn[act](inplace), nn.Conv2d(16, 8, 1), nn[act](inplace))
      lm.to_channels_last(seq)
      return seq
   end
   local function bits_equal(a, b, what)
      assert.are.equal(0, (a - b):abs():max():item(), what)
   end

   it("training: out of place under autograd (no saved copy), the same bits as in place and "
      .. "as the out-of-place module, channels-last", function()
      for _, act in ipairs({ "SiLU", "Hardswish", "Hardsigmoid", "Mish" }) do
         local x0 = lm.randn({ 2, 8, 5, 6 }):contiguous(lm.channels_last)
         local g = lm.randn({ 2, 8, 5, 6 }):contiguous(lm.channels_last)
         local res = {}
         for k, inplace in ipairs({ true, false }) do
            local seq = net(act, inplace)
            seq:train()
            local x = x0:clone():requires_grad_()
            local y = seq(x)
            y:backward(g)
            assert.is_true(y:is_contiguous(lm.channels_last), act)
            assert.is_true(x.grad:is_contiguous(lm.channels_last), act)
            res[k] = { y, x.grad, seq:get(1).weight.grad, seq:get(2).weight.grad }
         end
         for j, what in ipairs({ "y", "grad x", "grad conv weight", "grad bn weight" }) do
            bits_equal(res[1][j], res[2][j], act .. " " .. what)
         end
      end
   end)

   it("saves no copy after a batch norm; a bare in-place SiLU still does", function()
      local Tensor = lm.Tensor
      local clone = Tensor.clone
      local n = 0
      Tensor.clone = function(...) n = n + 1; return clone(...) end
      local ok, e = pcall(function()
         local seq = net("SiLU", true)
         seq:train()
         local x = lm.randn({ 2, 8, 5, 6 }):contiguous(lm.channels_last):requires_grad_()
         seq(x)
         assert.are.equal(0, n, "after conv / batch norm")
         local y = nn.Sequential(nn.Identity(), nn.SiLU(true))(x * 1)
         assert.are.equal(1, n, "after an Identity")
         y:sum():backward()
      end)
      Tensor.clone = clone
      assert(ok, e)
   end)
end)
