-- The convolution's fused epilogue (F.conv2d / Conv2d:forward with {residual =, relu =}) against
-- the same computation op by op; batch-norm folding for inference (nn.utils.fuse_conv_bn_weights,
-- nn.utils.fuse_conv_bn_eval, nn.fold_batch_norm) against the unfolded modules in evaluation
-- mode: values, memory formats, gradients, bad input; the same for Conv3d -> BatchNorm3d
-- (channels_last_3d kept; the video models: spec/video_models_spec.lua).
local lm = require("lumen")
local H = require("spec.helpers")
local gradcheck = require("spec.gradcheck")
local F = lm.F
local nn = lm.nn

local function close(tag, a, b, tol)
   assert.is_not_nil(a, tag)
   local d = (a - b):abs():max():item()
   local scale = math.max(1, b:abs():max():item())
   assert.is_true(d <= tol * scale, tag .. ": max difference " .. d)
end

local function count(model, type_name)
   local n = 0
   for _, m in ipairs(model:modules()) do
      if m:type_name() == type_name then n = n + 1 end
   end
   return n
end

-- a batch norm with non-trivial running statistics and affine parameters (BatchNorm3d when
-- cls says so)
local function warmed_bn(c, dt, cls)
   local bn = (cls or nn.BatchNorm2d)(c, { dtype = dt })
   lm.no_grad(function()
      bn.running_mean:copy_(lm.randn({ c }, { dtype = dt }))
      bn.running_var:copy_(lm.rand({ c }, { dtype = dt }) + 0.5)
      bn.weight:copy_(lm.randn({ c }, { dtype = dt }))
      bn.bias:copy_(lm.randn({ c }, { dtype = dt }))
   end)
   return bn
end

-- the model's modules one by one, batch norms as batch norms: with gradients on (the output
-- detached), no (conv, batch norm) pair is folded per call (lumen.nn.fold's eval_foldable)
local function unfolded(m, x)
   return lm.enable_grad(function() return m(x):detach() end)
end

describe("conv2d epilogue {residual =, relu =}", function()
   -- {N, C, H, W, O, k, stride, padding, groups}: pointwise, 3x3 (Winograd and direct sizes),
   -- strided, grouped, depthwise, few channels
   local geoms = {
      { 2, 16, 7, 7, 32, 1, 1, 0, 1 }, { 2, 64, 8, 8, 64, 3, 1, 1, 1 },
      { 2, 8, 9, 9, 16, 3, 2, 1, 1 }, { 2, 8, 6, 6, 8, 3, 1, 1, 2 },
      { 2, 16, 6, 6, 16, 3, 1, 1, 16 }, { 1, 3, 5, 5, 7, 3, 1, 0, 1 },
   }
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         for gi, g in ipairs(geoms) do
            for _, mode in ipairs({ "relu", "residual", "residual+relu" }) do
               local name = ("%s %s geometry %d %s"):format(tostring(dt), tostring(fmt), gi, mode)
               it(name, function()
                  lm.manual_seed(gi)
                  local N, Cn, Hh, W, O, k, s, p, groups = unpack(g)
                  local x = lm.randn({ N, Cn, Hh, W }, { dtype = dt }):contiguous(fmt)
                  local w = lm.randn({ O, Cn / groups, k, k }, { dtype = dt }):contiguous(fmt)
                  local b = gi % 2 == 0 and lm.randn({ O }, { dtype = dt }) or nil
                  local opts = { stride = s, padding = p, groups = groups }
                  local ref = F.conv2d(x, w, b, opts)
                  local eopts = { stride = s, padding = p, groups = groups }
                  if mode:find("residual") then
                     -- the residual in the other layout: any strides are accepted
                     local other = fmt == lm.channels_last and lm.contiguous_format
                                   or lm.channels_last
                     eopts.residual = lm.randn(ref:size(), { dtype = dt }):contiguous(other)
                     ref = ref + eopts.residual
                  end
                  if mode:find("relu") then
                     eopts.relu = true
                     ref = ref:relu()
                  end
                  local y = F.conv2d(x, w, b, eopts)
                  close(name, y, ref, dt == lm.float32 and 1e-5 or 1e-12)
                  assert.are.equal(ref:suggest_memory_format(), y:suggest_memory_format())
                  assert.is_nil(y.grad_fn)
               end)
            end
         end
      end
   end

   it("runs as the separate ops when a gradient is wanted, and gradchecks", function()
      lm.manual_seed(7)
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         local x = lm.randn({ 2, 3, 5, 5 }, { dtype = lm.float64 }):contiguous(fmt)
         local w = lm.randn({ 4, 3, 3, 3 }, { dtype = lm.float64 }):contiguous(fmt)
         local b = lm.randn({ 4 }, { dtype = lm.float64 })
         local r = lm.randn({ 2, 4, 5, 5 }, { dtype = lm.float64 })
         for _, t in ipairs({ x, w, b, r }) do t:requires_grad_(true) end
         local y = F.conv2d(x, w, b, { padding = 1, residual = r, relu = true })
         assert.is_not_nil(y.grad_fn)
         assert.are.equal(fmt, y:suggest_memory_format())
         gradcheck.check(function(xx, ww, bb, rr)
            return F.conv2d(xx, ww, bb, { padding = 1, residual = rr, relu = true })
         end, { x, w, b, r })
         -- the gradients keep the input's layout
         y:sum():backward()
         assert.are.equal(fmt, x.grad:suggest_memory_format())
      end
   end)

   it("a residual must have the output's shape and the input's dtype, with or without grad",
      function()
      local x, w = lm.randn({ 1, 3, 5, 5 }), lm.randn({ 4, 3, 3, 3 })
      local wg = w:clone():requires_grad_(true)
      for _, ww in ipairs({ w, wg }) do
         -- broadcastable is not enough: the same rule on the fused and the differentiable path
         H.assert_error_like("conv2d", "residual", F.conv2d, x, ww, nil,
                             { residual = lm.randn({ 1, 4, 1, 1 }) })
         H.assert_error_like("conv2d", "residual", F.conv2d, x, ww, nil,
                             { residual = lm.randn({ 2, 4, 3, 3 }) })
         H.assert_error_like("conv2d", "dtype", F.conv2d, x, ww, nil,
                             { residual = lm.randn({ 1, 4, 3, 3 }, { dtype = lm.float64 }) })
         H.assert_error_like("conv2d", "3-D", F.conv2d, lm.randn({ 3, 5, 5 }), ww, nil,
                             { residual = lm.randn({ 1, 4, 3, 3 }) })
      end
      local freed = lm.randn({ 4, 3, 3 })
      freed:free()
      H.assert_error("conv2d", F.conv2d, lm.randn({ 3, 5, 5 }), w, nil, { residual = freed })
      H.assert_error_like("conv2d", "residual", function()
         nn.Conv2d(3, 4, 3)(x, { residual = lm.randn({ 1, 4, 5, 5 }) })
      end)
   end)

   it("an unbatched input takes an unbatched residual", function()
      local x, w, r = lm.randn({ 3, 5, 5 }), lm.randn({ 4, 3, 3, 3 }), lm.randn({ 4, 3, 3 })
      local y = F.conv2d(x, w, nil, { residual = r, relu = true })
      H.assert_sizes(y, { 4, 3, 3 })
      close("unbatched", y, (F.conv2d(x, w) + r):relu(), 1e-5)
   end)

   it("Conv2d:forward(x, {residual =, relu =})", function()
      lm.manual_seed(2)
      local conv = nn.Conv2d(4, 6, 3, { padding = 1 })
      local x = lm.randn({ 2, 4, 5, 5 }):contiguous(lm.channels_last)
      local r = lm.randn({ 2, 6, 5, 5 })
      local y = lm.no_grad(function() return conv:forward(x, { residual = r, relu = true }) end)
      close("module", y, lm.no_grad(function() return (conv(x) + r):relu() end), 1e-5)
      assert.are.equal(lm.channels_last, y:suggest_memory_format())
   end)

   it("rejects bad epilogue arguments", function()
      local x, w = lm.randn({ 1, 3, 5, 5 }), lm.randn({ 4, 3, 3, 3 })
      H.assert_error_like("conv2d", "residual", F.conv2d, x, w, nil,
                          { residual = lm.randn({ 1, 4, 5, 5 }) })
      H.assert_error_like("conv2d", "residual", F.conv2d, x, w, nil, { residual = 3 })
      H.assert_error_like("conv2d", "relu", F.conv2d, x, w, nil, { relu = 1 })
      H.assert_error_like("Conv2d", "table", function()
         nn.Conv2d(3, 4, 3)(x, true)
      end)
   end)
end)

describe("fuse_conv_bn_weights / fuse_conv_bn_eval", function()
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         for _, with_bias in ipairs({ true, false }) do
            local name = ("%s %s bias=%s"):format(tostring(dt), tostring(fmt), tostring(with_bias))
            it(name, function()
               lm.manual_seed(11)
               local conv = nn.Conv2d(5, 7, 3, { padding = 1, bias = with_bias, dtype = dt })
               local bn = warmed_bn(7, dt)
               conv:to(fmt)
               conv:eval()
               bn:eval()
               local x = lm.randn({ 2, 5, 6, 6 }, { dtype = dt }):contiguous(fmt)
               local ref = lm.no_grad(function() return bn(conv(x)) end)
               local w0 = conv.weight:clone()
               local fused = nn.utils.fuse_conv_bn_eval(conv, bn)
               local y = lm.no_grad(function() return fused(x) end)
               close(name, y, ref, dt == lm.float32 and 1e-5 or 1e-12)
               assert.are.equal(ref:suggest_memory_format(), y:suggest_memory_format())
               -- the folded weight keeps the convolution weight's layout
               assert.are.equal(fmt, fused.weight:suggest_memory_format())
               H.assert_dtype(fused.weight, dt)
               assert.is_true(fused.weight.requires_grad)
               -- conv itself is unchanged
               assert.are.equal(0, (conv.weight - w0):abs():max():item())
               assert.are.equal(with_bias, conv.bias ~= nil)
               -- the formula, by hand
               local w, b = nn.utils.fuse_conv_bn_weights(conv.weight, conv.bias,
                  bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
               local scale = bn.weight / (bn.running_var + bn.eps):sqrt()
               local cb = conv.bias or lm.zeros({ 7 }, { dtype = dt })
               close("bias", b, (cb - bn.running_mean) * scale + bn.bias, 1e-6)
               close("weight", w, conv.weight * scale:view({ 7, 1, 1, 1 }), 1e-6)
            end)
         end
      end
   end

   it("leaves the random generator and the batch norm as they were", function()
      local conv, bn = nn.Conv2d(4, 6, 3):eval(), warmed_bn(6):eval()
      local rm, g = bn.running_mean:clone(), bn.weight:clone()
      lm.manual_seed(5)
      local expect = lm.randn({ 3 })
      lm.manual_seed(5)
      nn.utils.fuse_conv_bn_eval(conv, bn)
      assert.are.equal(0, (lm.randn({ 3 }) - expect):abs():max():item())
      assert.are.equal(0, (bn.running_mean - rm):abs():max():item())
      assert.are.equal(0, (bn.weight - g):abs():max():item())
   end)

   it("works without affine parameters", function()
      local conv = nn.Conv2d(2, 3, 1)
      local bn = nn.BatchNorm2d(3, { affine = false })
      lm.no_grad(function() bn.running_var:fill_(4) bn.running_mean:fill_(1) end)
      conv:eval()
      bn:eval()
      local x = lm.randn({ 1, 2, 3, 3 })
      close("no affine", lm.no_grad(function() return nn.utils.fuse_conv_bn_eval(conv, bn)(x) end),
            lm.no_grad(function() return bn(conv(x)) end), 1e-5)
   end)

   it("rejects what cannot be folded", function()
      local conv, bn = nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)
      H.assert_error_like("fuse_conv_bn_eval", "evaluation", nn.utils.fuse_conv_bn_eval, conv, bn)
      conv:eval()
      bn:eval()
      H.assert_error_like("fuse_conv_bn_eval", "conv2d", nn.utils.fuse_conv_bn_eval, bn, bn)
      H.assert_error_like("fuse_conv_bn_eval", "batchnorm2d", nn.utils.fuse_conv_bn_eval, conv,
                          conv)
      H.assert_error_like("fuse_conv_bn_eval", "features", nn.utils.fuse_conv_bn_eval, conv,
                          nn.BatchNorm2d(4):eval())
      H.assert_error_like("fuse_conv_bn_eval", "running",  nn.utils.fuse_conv_bn_eval, conv,
                          nn.BatchNorm2d(3, { track_running_stats = false }):eval())
      local bad = nn.BatchNorm2d(3):eval()
      bad.eps = -1
      H.assert_error_like("fuse_conv_bn_eval", "eps", nn.utils.fuse_conv_bn_eval, conv, bad)
      local w, v = lm.randn({ 3, 2, 1, 1 }), lm.ones({ 3 })
      local f = nn.utils.fuse_conv_bn_weights
      H.assert_error_like("fuse_conv_bn_weights", "conv_w", f, nil, nil, v, v, 1e-5)
      H.assert_error_like("fuse_conv_bn_weights", "bn_rm", f, w, nil, nil, v, 1e-5)
      H.assert_error_like("fuse_conv_bn_weights", "bn_rv", f, w, nil, v, lm.ones({ 4 }), 1e-5)
      H.assert_error_like("fuse_conv_bn_weights", "bn_eps", f, w, nil, v, v, -1)
      H.assert_error_like("fuse_conv_bn_weights", "bn_eps", f, w, nil, v, v, 0 / 0)
      H.assert_error_like("fuse_conv_bn_weights", "floating", f,
                          lm.ones({ 3, 2, 1, 1 }, { dtype = lm.int64 }), nil, v, v, 1e-5)
   end)
end)

describe("nn.fold_batch_norm", function()
   it("folds adjacent Conv2d, BatchNorm2d pairs of a Sequential", function()
      lm.manual_seed(4)
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         local net = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), warmed_bn(8),
                                   nn.ReLU(true), nn.Conv2d(8, 8, 1, { bias = false }),
                                   warmed_bn(8), nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1))
         net:eval()
         net:to(fmt)
         local x = lm.randn({ 2, 3, 6, 6 }):contiguous(fmt)
         local ref = unfolded(net, x)
         local model, n = nn.fold_batch_norm(net)
         assert.are.equal(net, model)
         assert.are.equal(2, n)
         -- the third batch norm follows a batch norm, not a convolution: it stays
         assert.are.equal(1, count(net, "BatchNorm2d"))
         assert.are.equal("Identity", net[2]:type_name())
         assert.are.equal("Identity", net[5]:type_name())
         assert.are.equal("BatchNorm2d", net[6]:type_name())
         local y = lm.no_grad(function() return net(x) end)
         close(tostring(fmt), y, ref, 1e-5)
         assert.are.equal(fmt, net[1].weight:suggest_memory_format())
         -- a second call finds nothing more to fold
         local _, again = nn.fold_batch_norm(net)
         assert.are.equal(0, again)
      end
   end)

   local models = {
      { "small_resnet", { num_classes = 10 }, 1, 28 },
      { "resnet18", { num_classes = 10 }, 3, 32 },
      { "resnet50", { num_classes = 10 }, 3, 32 },
      { "resnext50_32x4d", { num_classes = 10 }, 3, 32 },
   }
   for _, spec in ipairs(models) do
      local name, opts, inch, res = unpack(spec)
      it(name .. ": same outputs, channels-last kept, every batch norm folded", function()
         lm.manual_seed(9)
         local m = lm.models[name](opts)
         -- running statistics away from their initial values
         lm.no_grad(function() m(lm.randn({ 4, inch, res, res })) end)
         m:eval()
         lm.to_channels_last(m)
         local x = lm.randn({ 2, inch, res, res }):contiguous(lm.channels_last)
         local ref = unfolded(m, x)
         local nbn = count(m, "BatchNorm2d")
         local _, n = nn.fold_batch_norm(m)
         assert.are.equal(nbn, n)
         assert.are.equal(0, count(m, "BatchNorm2d"))
         local y = lm.no_grad(function() return m(x) end)
         close(name, y, ref, 1e-4)
         for _, p in ipairs(m:named_parameters()) do
            if lm.is_tensor(p[2]) and p[2]:dim() == 4 then
               assert.are.equal(lm.channels_last, p[2]:suggest_memory_format(), p[1])
            end
         end
         local report = lm.layout.check(m, x)
         assert.is_true(report.ok, tostring(report))
         -- the blocks run the fused forward: their ReLU modules are no longer called
         local Boom = nn.Module:extend("Boom")
         function Boom:forward() error("the unfolded forward ran") end
         for _, mm in ipairs(m:modules()) do
            local ty = mm:type_name()
            if ty == "BasicBlock" or ty == "Bottleneck" or ty == "ResNet" or
               ty == "SmallResNet" then
               assert.is_true(mm.folded, ty)
               mm.relu = Boom()
            end
            if ty == "Identity" then assert.is_false(mm.training) end
         end
         close(name .. " fused forward", lm.no_grad(function() return m(x) end), ref, 1e-4)
         -- the state_dict: no batch-norm entries, a bias for every convolution
         local keys = m:state_keys()
         for _, k in ipairs(keys) do assert.is_nil(k:find("bn", 1, true), k) end
         local set = {}
         for _, k in ipairs(keys) do set[k] = true end
         assert.is_true(set["conv1.bias"])
      end)
   end

   it("folds an NCHW float64 model too", function()
      lm.manual_seed(8)
      local m = lm.models.small_resnet({ num_classes = 10 }):double()
      lm.no_grad(function() m(lm.randn({ 4, 1, 28, 28 }, { dtype = lm.float64 })) end)
      m:eval()
      local x = lm.randn({ 2, 1, 28, 28 }, { dtype = lm.float64 })
      local ref = unfolded(m, x)
      nn.fold_batch_norm(m)
      local y = lm.no_grad(function() return m(x) end)
      close("float64", y, ref, 1e-12)
      assert.are.equal(lm.contiguous_format, y:suggest_memory_format())
   end)

   it("does not fold into a convolution used in two places, nor a pair it cannot", function()
      lm.manual_seed(6)
      local conv = nn.Conv2d(4, 4, 3, { padding = 1 })
      local bad = nn.BatchNorm2d(4, { track_running_stats = false })   -- batch statistics
      local net = nn.Sequential(conv, warmed_bn(4), nn.ReLU(), conv, warmed_bn(4),
                                nn.Conv2d(4, 4, 1), warmed_bn(4), nn.Conv2d(4, 4, 1), bad)
      net:eval()
      local x = lm.randn({ 1, 4, 5, 5 })
      local ref = unfolded(net, x)
      local _, n = nn.fold_batch_norm(net)
      assert.are.equal(1, n)                -- only the (6, 7) pair
      assert.are.equal("BatchNorm2d", net[2]:type_name())
      assert.are.equal("BatchNorm2d", net[5]:type_name())
      assert.are.equal("Identity", net[7]:type_name())
      assert.are.equal("BatchNorm2d", net[9]:type_name())
      close("shared", lm.no_grad(function() return net(x) end), ref, 1e-5)
   end)

   it("a folded model still trains (the epilogue falls back to differentiable ops)", function()
      lm.manual_seed(5)
      local m = lm.models.small_resnet({ num_classes = 10 })
      m:eval()
      nn.fold_batch_norm(m)
      m:train()
      local x = lm.randn({ 2, 1, 28, 28 }):contiguous(lm.channels_last)
      local loss = F.cross_entropy(m(x), lm.tensor({ 1, 2 }, { dtype = lm.int64 }))
      loss:backward()
      assert.is_not_nil(m.conv1.weight.grad)
      assert.is_not_nil(m.conv1.bias.grad)
      assert.is_not_nil(m.layer1[1].conv2.weight.grad)
   end)

   it("leaves a block with an unfoldable batch norm as it was", function()
      local m = lm.models.resnet18({ num_classes = 10 })
      local blk = m.layer1[1]
      blk:add_module("bn2", nn.BatchNorm2d(64, { track_running_stats = false }))
      m:eval()
      local x = lm.randn({ 1, 3, 32, 32 })
      local ref = unfolded(m, x)
      local nbn = count(m, "BatchNorm2d")
      local _, n = nn.fold_batch_norm(m)
      assert.are.equal(nbn - 2, n)              -- the block's two batch norms stay
      assert.are.equal("BatchNorm2d", blk.bn1:type_name())
      assert.is_nil(blk.folded)
      close("partly folded", lm.no_grad(function() return m(x) end), ref, 1e-4)
   end)

   it("refuses a model in training mode, before changing anything", function()
      local m = lm.models.small_resnet({ num_classes = 10 })
      local nbn = count(m, "BatchNorm2d")
      H.assert_error_like("fold_batch_norm", "training mode", nn.fold_batch_norm, m)
      m:eval()
      m.layer2:train()
      H.assert_error_like("fold_batch_norm", "layer2", nn.fold_batch_norm, m)
      assert.are.equal(nbn, count(m, "BatchNorm2d"))
      H.assert_error_like("fold_batch_norm", "module", nn.fold_batch_norm, nil)
      H.assert_error_like("fold_batch_norm", "module", nn.fold_batch_norm, lm.randn({ 2 }))
   end)
end)

describe("folding Conv3d -> BatchNorm3d", function()
   -- F.conv3d has no CUDA kernel
   local on_cuda = lm.get_default_device():match("^cuda") ~= nil
   local CL3 = lm.channels_last_3d

   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, fmt in ipairs({ CL3, lm.contiguous_format }) do
         it(("fuse_conv_bn_weights on 5-D weights keeps their format: %s %s")
            :format(tostring(dt), tostring(fmt)), function()
            lm.manual_seed(21)
            local w = lm.randn({ 6, 4, 3, 1, 2 }, { dtype = dt }):contiguous(fmt)
            local bn = warmed_bn(6, dt, nn.BatchNorm3d)
            local cb = lm.randn({ 6 }, { dtype = dt })
            local fw, fb = nn.utils.fuse_conv_bn_weights(w, cb, bn.running_mean, bn.running_var,
                                                         bn.eps, bn.weight, bn.bias)
            assert.is_true(fw:is_contiguous(fmt), H.describe(fw))
            assert.are.equal(fmt, fw:suggest_memory_format())
            H.assert_dtype(fw, dt)
            local scale = bn.weight / (bn.running_var + bn.eps):sqrt()
            close("weight", fw, w * scale:view({ 6, 1, 1, 1, 1 }), 1e-6)
            close("bias", fb, (cb - bn.running_mean) * scale + bn.bias, 1e-6)
            -- a 1x1x1 weight too (ambiguous strides: the channels_last_3d tag survives)
            local w1 = lm.randn({ 6, 4, 1, 1, 1 }, { dtype = dt }):to(fmt)
            local f1 = nn.utils.fuse_conv_bn_weights(w1, nil, bn.running_mean, bn.running_var,
                                                     bn.eps, bn.weight, bn.bias)
            assert.are.equal(fmt, f1:suggest_memory_format())
         end)
      end
   end

   if on_cuda then return end

   for _, fmt in ipairs({ CL3, lm.contiguous_format }) do
      it("fuse_conv_bn_eval makes a Conv3d: " .. tostring(fmt), function()
         lm.manual_seed(22)
         local conv = nn.Conv3d(3, 5, { 3, 1, 3 }, { stride = { 1, 2, 1 }, padding = { 1, 0, 1 } })
         local bn = warmed_bn(5, lm.float32, nn.BatchNorm3d)
         conv:eval()
         bn:eval()
         lm.to_channels_last(conv)
         if fmt ~= CL3 then conv:to(fmt) end
         local x = lm.randn({ 2, 3, 4, 5, 6 }):contiguous(fmt)
         local ref = lm.no_grad(function() return bn(conv(x)) end)
         local fused = nn.utils.fuse_conv_bn_eval(conv, bn)
         assert.are.equal("Conv3d", fused:type_name())
         assert.are.equal(fmt, fused.weight:suggest_memory_format())
         local y = lm.no_grad(function() return fused(x) end)
         close("fused", y, ref, 1e-5)
         assert.are.equal(ref:suggest_memory_format(), y:suggest_memory_format())
      end)
   end

   it("rejects mismatched pairs", function()
      local c3, b3 = nn.Conv3d(2, 3, 1):eval(), nn.BatchNorm3d(3):eval()
      local c2, b2 = nn.Conv2d(2, 3, 1):eval(), nn.BatchNorm2d(3):eval()
      H.assert_error_like("fuse_conv_bn_eval", "batchnorm3d", nn.utils.fuse_conv_bn_eval, c3, b2)
      H.assert_error_like("fuse_conv_bn_eval", "batchnorm2d", nn.utils.fuse_conv_bn_eval, c2, b3)
      H.assert_error_like("fuse_conv_bn_eval", "conv3d", nn.utils.fuse_conv_bn_eval, b3, b3)
      H.assert_error_like("fuse_conv_bn_eval", "features", nn.utils.fuse_conv_bn_eval, c3,
                          nn.BatchNorm3d(4):eval())
   end)

   it("nn.fold_batch_norm folds the pairs of a Sequential, channels_last_3d kept", function()
      lm.manual_seed(23)
      for _, fmt in ipairs({ CL3, lm.contiguous_format }) do
         local net = nn.Sequential(nn.Conv3d(3, 8, 3, { padding = 1 }),
                                   warmed_bn(8, lm.float32, nn.BatchNorm3d), nn.ReLU(true),
                                   nn.Conv3d(8, 8, 1, { bias = false }),
                                   warmed_bn(8, lm.float32, nn.BatchNorm3d),
                                   warmed_bn(8, lm.float32, nn.BatchNorm3d),
                                   nn.AdaptiveAvgPool3d(1))
         net:eval()
         lm.to_channels_last(net)
         if fmt ~= CL3 then net:to(fmt) end
         local x = lm.randn({ 2, 3, 3, 5, 5 }):contiguous(fmt)
         local ref = unfolded(net, x)
         local _, n = nn.fold_batch_norm(net)
         assert.are.equal(2, n)
         assert.are.equal("Identity", net[2]:type_name())
         assert.are.equal("Identity", net[5]:type_name())
         assert.are.equal("BatchNorm3d", net[6]:type_name())   -- follows a batch norm: stays
         close(tostring(fmt), lm.no_grad(function() return net(x) end), ref, 1e-5)
         assert.is_true(net[1].weight:is_contiguous(fmt))
         assert.is_true(net[4].weight:is_contiguous(fmt))
      end
      -- a Conv2d followed by a BatchNorm3d is not a pair
      local odd = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm3d(3)):eval()
      local _, n = nn.fold_batch_norm(odd)
      assert.are.equal(0, n)
   end)
end)

describe("eval mode, gradients off: (conv, batch norm) pairs run folded per call", function()

   -- counts the convolutions and batch norms the model runs (F.conv2d/conv3d, F.batch_norm)
   local function op_counts(fn)
      local n = { conv = 0, bn = 0 }
      local c2, c3, b = F.conv2d, F.conv3d, F.batch_norm
      F.conv2d = function(...) n.conv = n.conv + 1 return c2(...) end
      F.conv3d = function(...) n.conv = n.conv + 1 return c3(...) end
      F.batch_norm = function(...) n.bn = n.bn + 1 return b(...) end
      local ok, err = pcall(fn)
      F.conv2d, F.conv3d, F.batch_norm = c2, c3, b
      assert(ok, err)
      return n
   end

   it("resnet18 / resnet50: the unfolded outputs to rounding, no batch_norm run, weights kept",
      function()
      for _, name in ipairs({ "resnet18", "resnet50" }) do
         for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
            lm.manual_seed(31)
            local m = lm.models[name]({ num_classes = 10 })
            lm.no_grad(function() m(lm.randn({ 4, 3, 32, 32 })) end)   -- running statistics
            m:eval()
            m:to(fmt)
            local x = lm.randn({ 2, 3, 32, 32 }):contiguous(fmt)
            local w0 = m.layer1[1].conv1.weight:clone()
            local ref = unfolded(m, x)
            local y
            local n = op_counts(function() y = lm.no_grad(function() return m(x) end) end)
            close(name .. " " .. tostring(fmt), y, ref, 1e-5)
            assert.are.equal(0, n.bn, name)
            assert.is_true(n.conv > 0)
            assert.are.equal(0, (m.layer1[1].conv1.weight - w0):abs():max():item())
            -- a block's output keeps the input's memory format
            local b = lm.no_grad(function()
               return m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x)))))
            end)
            assert.is_true(b:is_contiguous(fmt), name .. " " .. H.describe(b))
            -- bfloat16 under autocast: the unfolded result to bfloat16 rounding
            local yb = lm.autocast({ dtype = lm.bfloat16 }, function()
               return lm.no_grad(function() return m(x) end)
            end)
            close(name .. " bf16", yb:to(lm.float32), ref, 5e-2)
         end
      end
   end)

   it("a bfloat16 model (m:to(lm.bfloat16)): the fold in float32, rounded once", function()
      lm.manual_seed(34)
      local m = lm.models.resnet18({ num_classes = 10 })
      lm.no_grad(function() m(lm.randn({ 4, 3, 32, 32 })) end)
      m:eval()
      lm.to_channels_last(m)
      local x = lm.randn({ 2, 3, 32, 32 }):contiguous(lm.channels_last)
      local ref32 = unfolded(m, x)
      m:to(lm.bfloat16)
      local xb = x:to(lm.bfloat16)
      local ref = unfolded(m, xb)
      local y
      local n = op_counts(function() y = lm.no_grad(function() return m(xb) end) end)
      assert.are.equal(0, n.bn)
      assert.are.equal(lm.bfloat16, y:dtype())
      -- as close to float32 as the op-by-op bfloat16 model is
      local d_fold = (y:to(lm.float32) - ref32):abs():max():item()
      local d_ops = (ref:to(lm.float32) - ref32):abs():max():item()
      assert.is_true(d_fold <= 2 * d_ops + 1e-3, ("fold %g, op by op %g"):format(d_fold, d_ops))
      assert.are.equal(lm.bfloat16, m.layer1[1].conv1.weight:dtype())
   end)

   it("under bf16 autocast: the folded weight made in bfloat16 at once, the same bits", function()
      lm.manual_seed(35)
      local conv, bn = nn.Conv2d(16, 32, 3, { padding = 1 }), warmed_bn(32)
      local net = nn.Sequential(conv, bn)
      net:eval()
      lm.to_channels_last(net)
      local x = lm.randn({ 2, 16, 9, 9 }):contiguous(lm.channels_last)
      local fw, fb = nn.utils.fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean,
                                                  bn.running_var, bn.eps, bn.weight, bn.bias)
      local AMP = { dtype = lm.bfloat16 }
      local want = lm.autocast(AMP, function()
         return lm.no_grad(function() return F.conv2d(x, fw, fb, { padding = 1 }) end)
      end)
      local y = lm.autocast(AMP, function() return lm.no_grad(function() return net(x) end) end)
      assert.are.equal(lm.bfloat16, y:dtype())
      assert.are.equal(0, (y:to(lm.float32) - want:to(lm.float32)):abs():max():item())
      assert.is_true(y:is_contiguous(lm.channels_last))
   end)

   it("Sequential: Conv2d, BatchNorm2d and Conv3d, BatchNorm3d pairs; the rest as they are",
      function()
      lm.manual_seed(32)
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         local net = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), warmed_bn(8),
                                   nn.ReLU(true), nn.Conv2d(8, 8, 1, { bias = false }),
                                   warmed_bn(8), warmed_bn(8), nn.AdaptiveAvgPool2d(1))
         net:eval()
         net:to(fmt)
         local x = lm.randn({ 2, 3, 6, 6 }):contiguous(fmt)
         local ref = unfolded(net, x)
         local y
         local n = op_counts(function() y = lm.no_grad(function() return net(x) end) end)
         close(tostring(fmt), y, ref, 1e-5)
         assert.are.same({ conv = 2, bn = 1 }, n)    -- the batch norm after a batch norm stays
         assert.is_true(y:is_contiguous(fmt))
      end
      local fmt3 = lm.channels_last_3d
      local net3 = nn.Sequential(nn.Conv3d(3, 6, 3, { padding = 1 }),
                                 warmed_bn(6, nil, nn.BatchNorm3d), nn.ReLU(true))
      net3:eval()
      net3:to(fmt3)
      local x3 = lm.randn({ 1, 3, 4, 5, 5 }):contiguous(fmt3)
      local ref3 = unfolded(net3, x3)
      local y3
      local n3 = op_counts(function() y3 = lm.no_grad(function() return net3(x3) end) end)
      close("3-D", y3, ref3, 1e-5)
      assert.are.same({ conv = 1, bn = 0 }, n3)
      assert.is_true(y3:is_contiguous(fmt3))
   end)

   it("not in training mode, with gradients on, without running statistics, or when watched",
      function()
      lm.manual_seed(33)
      local function net_of(bn)
         return nn.Sequential(nn.Conv2d(3, 4, 3, { padding = 1 }), bn, nn.ReLU(true))
      end
      local x = lm.randn({ 2, 3, 5, 5 }):contiguous(lm.channels_last)
      -- training mode: batch statistics, running statistics updated
      local net = net_of(warmed_bn(4))
      local rm = net[2].running_mean:clone()
      local n = op_counts(function() lm.no_grad(function() return net(x) end) end)
      assert.are.same({ conv = 1, bn = 1 }, n)
      assert.is_true((net[2].running_mean - rm):abs():max():item() > 0)
      -- gradients on: the parameters get their gradients through the batch norm
      net:eval()
      n = op_counts(function() net(x):sum():backward() end)
      assert.are.same({ conv = 1, bn = 1 }, n)
      assert.is_not_nil(net[2].weight.grad)
      -- no running statistics: the batch's own, which no weight expresses
      local nostats = net_of(nn.BatchNorm2d(4, { track_running_stats = false }))
      nostats:eval()
      n = op_counts(function() lm.no_grad(function() return nostats(x) end) end)
      assert.are.same({ conv = 1, bn = 1 }, n)
      -- lm.layout.check sees every module (it replaces their forward on the instance)
      local m = lm.models.resnet18({ num_classes = 10 })
      m:eval()
      lm.to_channels_last(m)
      local xi = lm.randn({ 1, 3, 32, 32 }):contiguous(lm.channels_last)
      local report = lm.no_grad(function() return lm.layout.check(m, xi) end)
      local bns = 0
      for _, row in ipairs(report.rows) do
         if row.type == "BatchNorm2d" then bns = bns + 1 end
      end
      assert.are.equal(count(m, "BatchNorm2d"), bns)
      -- a jit trace records the model's own operators
      local g = lm.no_grad(function() return lm.jit.trace(net_of(warmed_bn(4)):eval(), x) end)
      local ops = {}
      for _, node in ipairs(g.graph.nodes) do ops[#ops + 1] = node.op end
      assert.are.same({ "F.conv2d", "F.batch_norm", "Tensor.relu_" }, ops)
   end)

   it("a block's intermediates go back to the allocator as soon as they are read", function()
      lm.manual_seed(32)
      local m = lm.models.resnet50({ num_classes = 10 })
      m:eval()
      lm.to_channels_last(m)
      local x = lm.randn({ 2, 64, 16, 16 }):contiguous(lm.channels_last)
      local function growth(block)
         return lm.no_grad(function()
            lm.memory.collect()
            local live0 = lm.memory.live_bytes()
            local y = block(x)
            return lm.memory.live_bytes() - live0, y
         end)
      end
      local ref = unfolded(m.layer1[1], x)
      for _, folded in ipairs({ false, true }) do
         if folded then nn.fold_batch_norm(m) end
         -- layer1[1]: conv1 and conv2's results (2 x 64 x 16 x 16) and the downsample's
         -- (2 x 256 x 16 x 16) are freed; only the block's result stays
         local d, y = growth(m.layer1[1])
         assert.is_true(d <= y:numel() * 4 * 1.25 + 65536,
                        ("folded=%s: grew %d bytes for a %d-byte result"):format(
                           tostring(folded), d, y:numel() * 4))
         close("block folded=" .. tostring(folded), y, ref, 1e-4)
      end
      -- a wrapper on a module of the block (a capture of features) keeps what it saw: the
      -- block frees nothing under it, folded or folded for the call
      for _, folded in ipairs({ false, true }) do
         local mw = lm.models.resnet50({ num_classes = 10 })
         mw:eval()
         lm.to_channels_last(mw)
         if folded then nn.fold_batch_norm(mw) end
         local block = mw.layer1[1]
         local kept = {}
         for _, name in ipairs({ "conv1", "downsample" }) do
            local mod = block[name]
            local inner = mod.forward              -- the class's, before the wrapper
            mod.forward = function(self, ...)
               local r = inner(self, ...)
               kept[name] = r
               return r
            end
         end
         local y = lm.no_grad(function() return block(x) end)
         assert.are.equal(64, kept.conv1:size(2), "conv1's output readable after the block")
         assert.are.equal(256, kept.downsample:size(2), "the downsample's output readable")
         assert.is_true(kept.conv1:sum():item() == kept.conv1:sum():item())
         assert.is_true(kept.downsample:abs():sum():item() > 0)
         assert.are.equal(256, y:size(2))
      end
      -- with gradients on, autograd holds them: a folded model's input gradient is the
      -- unfolded one's
      local m2 = lm.models.resnet18({ num_classes = 10 })
      m2:eval()
      lm.to_channels_last(m2)
      local xi = lm.randn({ 2, 3, 32, 32 }):contiguous(lm.channels_last)
      local function input_grad(model)
         local xg = xi:clone():requires_grad_()
         model(xg):sum():backward()
         return xg.grad
      end
      local g_ref = input_grad(m2)
      nn.fold_batch_norm(m2)
      local g = input_grad(m2)
      close("input gradient through a folded model", g, g_ref, 1e-4)
   end)
end)
