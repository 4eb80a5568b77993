-- models/resnet.lua -- ResNet, ResNeXt and Wide ResNet, as torchvision builds them.
--
-- One builder (ResNet) with two block types (BasicBlock, Bottleneck), groups and width per group.
-- ReLUs are in place, as torchvision's (ReLU(inplace=True)); unfolded, each batch norm that a ReLU
-- follows runs with it (and with the residual add at a block's end) as one fused batch norm
-- (nn.utils.bn_relu: one pass forward, one backward), folded the convolution's epilogue does.
-- Module and parameter names follow torchvision's state_dict keys exactly (conv1.weight,
-- layer1.0.bn1.running_mean, layer2.0.downsample.0.weight, fc.bias, ...), so weights exported from
-- torchvision load with load_state_dict unchanged.
--
--    local model = lm.models.resnet50({num_classes = 1000})
--    lm.to_channels_last(model)
local M = {}

local function builder(lm)
   local nn = lm.nn
   local init = nn.init
   -- evaluation mode with gradients off runs each (conv, bn) pair as one convolution with the
   -- batch norm folded for the call (lumen.nn.fold's eval_foldable / conv_bn)
   local fold = require("lumen.nn.fold")
   local RELU = { relu = true }
   local BASIC_PAIRS = { { "conv1", "bn1" }, { "conv2", "bn2" } }
   local BOTTLENECK_PAIRS = { { "conv1", "bn1" }, { "conv2", "bn2" }, { "conv3", "bn3" } }
   local function pairs_of(self, names)
      local l = {}
      for i, nm in ipairs(names) do l[i] = { self[nm[1]], self[nm[2]] } end
      return l
   end
   local bn_relu = nn.utils.bn_relu
   -- Folded (or folded for the call), a block's intermediates are read once, by the next
   -- convolution: give their blocks back to the allocator at once (t:free()) rather than leave
   -- them to the collector, unless autograd or a jit recording holds them (fold.releasable),
   -- or a module of the block had its forward replaced on the instance (fold.unwrapped: a
   -- wrapper may keep what it made or read). The pool then holds the few activations alive at a
   -- time instead of whatever garbage the collector has not reached yet. resnet50 inference,
   -- batch 8: peak tensor memory above the weights 289 -> 170 MB (folded 288 -> 180), fresh
   -- blocks in the first ten calls 28 -> 18.
   local function release(free, t, keep)
      if free and t ~= keep and fold.releasable(t) then t:free() end
   end

   local function conv3x3(cin, cout, stride, groups, dilation)
      return nn.Conv2d(cin, cout, 3, { stride = stride or 1, padding = dilation or 1,
                                       groups = groups or 1, dilation = dilation or 1,
                                       bias = false })
   end
   local function conv1x1(cin, cout, stride)
      return nn.Conv2d(cin, cout, 1, { stride = stride or 1, bias = false })
   end

   local BasicBlock = nn.Module:extend("BasicBlock")
   BasicBlock.expansion = 1
   function BasicBlock:__init(inplanes, planes, stride, downsample, groups, base_width, dilation)
      if (groups or 1) ~= 1 or (base_width or 64) ~= 64 then
         error("lumen.models.resnet: BasicBlock only supports groups=1 and base_width=64", 3)
      end
      if (dilation or 1) > 1 then
         error("lumen.models.resnet: dilation > 1 is not supported in BasicBlock", 3)
      end
      self.conv1 = conv3x3(inplanes, planes, stride)
      self.bn1 = nn.BatchNorm2d(planes)
      self.relu = nn.ReLU(true)
      self.conv2 = conv3x3(planes, planes)
      self.bn2 = nn.BatchNorm2d(planes)
      if downsample then self.downsample = downsample end
      self.stride = stride or 1
   end
   -- after nn.fold_batch_norm: each convolution carries its batch norm in its weights, and the
   -- ReLU and the residual add run in the convolutions' epilogues
   function BasicBlock:forward(x)
      if self.folded then
         local free = fold.unwrapped(self)
         local out = self.conv1:forward(x, { relu = true })
         local identity = x
         if self.downsample then identity = self.downsample(x) end
         local y = self.conv2:forward(out, { residual = identity, relu = true })
         release(free, out)
         release(free, identity, x)
         return y
      end
      if not self.training and fold.eval_foldable(pairs_of(self, BASIC_PAIRS),
                                                  { self.relu }) then
         local free = fold.unwrapped(self)
         local out = fold.conv_bn(self.conv1, self.bn1, x, RELU)
         local identity = x
         if self.downsample then identity = self.downsample(x) end
         local y = fold.conv_bn(self.conv2, self.bn2, out, { residual = identity, relu = true })
         release(free, out)
         release(free, identity, x)
         return y
      end
      -- otherwise (training, or gradients on): relu(bn(conv)) and relu(bn(conv) + identity),
      -- each one fused batch norm, forward and backward (nn.utils.bn_relu)
      local out = bn_relu(self.bn1, self.relu, self.conv1(x))
      local identity = x
      if self.downsample then identity = self.downsample(x) end
      return bn_relu(self.bn2, self.relu, self.conv2(out), identity)
   end

   local Bottleneck = nn.Module:extend("Bottleneck")
   Bottleneck.expansion = 4
   function Bottleneck:__init(inplanes, planes, stride, downsample, groups, base_width, dilation)
      groups, base_width = groups or 1, base_width or 64
      local width = math.floor(planes * (base_width / 64.0)) * groups
      self.conv1 = conv1x1(inplanes, width)
      self.bn1 = nn.BatchNorm2d(width)
      self.conv2 = conv3x3(width, width, stride, groups, dilation)
      self.bn2 = nn.BatchNorm2d(width)
      self.conv3 = conv1x1(width, planes * 4)
      self.bn3 = nn.BatchNorm2d(planes * 4)
      self.relu = nn.ReLU(true)
      if downsample then self.downsample = downsample end
      self.stride = stride or 1
   end
   function Bottleneck:forward(x)
      if self.folded then
         local free = fold.unwrapped(self)
         local out1 = self.conv1:forward(x, { relu = true })
         local out = self.conv2:forward(out1, { relu = true })
         release(free, out1)
         local identity = x
         if self.downsample then identity = self.downsample(x) end
         local y = self.conv3:forward(out, { residual = identity, relu = true })
         release(free, out)
         release(free, identity, x)
         return y
      end
      if not self.training and fold.eval_foldable(pairs_of(self, BOTTLENECK_PAIRS),
                                                  { self.relu }) then
         local free = fold.unwrapped(self)
         local out1 = fold.conv_bn(self.conv1, self.bn1, x, RELU)
         local out = fold.conv_bn(self.conv2, self.bn2, out1, RELU)
         release(free, out1)
         local identity = x
         if self.downsample then identity = self.downsample(x) end
         local y = fold.conv_bn(self.conv3, self.bn3, out, { residual = identity, relu = true })
         release(free, out)
         release(free, identity, x)
         return y
      end
      local out = bn_relu(self.bn1, self.relu, self.conv1(x))
      out = bn_relu(self.bn2, self.relu, self.conv2(out))
      local identity = x
      if self.downsample then identity = self.downsample(x) end
      return bn_relu(self.bn3, self.relu, self.conv3(out), identity)
   end

   -- nn.fold_batch_norm: fold the block's (conv, bn) pairs, all or none (a batch norm without
   -- running statistics cannot be folded), and its downsample (a Sequential) on its own
   local function fold_block(self, names)
      local n = self.downsample and self.downsample:fold_batch_norm() or 0
      local pairs_list = {}
      for _, nm in ipairs(names) do pairs_list[#pairs_list + 1] = { self[nm[1]], self[nm[2]] } end
      if self.folded or not nn.utils.can_fold_all(pairs_list) then return n end
      for _, nm in ipairs(names) do nn.utils.fold_named_(self, nm[1], nm[2]) end
      self.folded = true
      return n + #names
   end
   function BasicBlock:fold_batch_norm()
      return fold_block(self, { { "conv1", "bn1" }, { "conv2", "bn2" } })
   end
   function Bottleneck:fold_batch_norm()
      return fold_block(self, { { "conv1", "bn1" }, { "conv2", "bn2" }, { "conv3", "bn3" } })
   end

   local ResNet = nn.Module:extend("ResNet")
   function ResNet:__init(block, layers, opts)
      opts = opts or {}
      local num_classes = opts.num_classes or 1000
      self.inplanes, self.dilation_ = 64, 1
      self.groups_ = opts.groups or 1
      self.base_width = opts.width_per_group or 64
      self.conv1 = nn.Conv2d(3, 64, 7, { stride = 2, padding = 3, bias = false })
      self.bn1 = nn.BatchNorm2d(64)
      self.relu = nn.ReLU(true)
      self.maxpool = nn.MaxPool2d({ kernel_size = 3, stride = 2, padding = 1 })
      self.layer1 = self:_make_layer(block, 64, layers[1], 1)
      self.layer2 = self:_make_layer(block, 128, layers[2], 2)
      self.layer3 = self:_make_layer(block, 256, layers[3], 2)
      self.layer4 = self:_make_layer(block, 512, layers[4], 2)
      self.avgpool = nn.AdaptiveAvgPool2d({ 1, 1 })
      self.fc = nn.Linear(512 * block.expansion, num_classes)
      -- torchvision's initialisation
      for _, m in ipairs(self:modules()) do
         local ty = m:type_name()
         if ty == "Conv2d" then
            init.kaiming_normal_(m.weight, 0, "fan_out", "relu")
         elseif ty == "BatchNorm2d" then
            init.constant_(m.weight, 1)
            init.constant_(m.bias, 0)
         end
      end
      if opts.zero_init_residual then
         for _, m in ipairs(self:modules()) do
            if m.bn3 and m:type_name() == "Bottleneck" then init.constant_(m.bn3.weight, 0) end
            if m.bn2 and m:type_name() == "BasicBlock" then init.constant_(m.bn2.weight, 0) end
         end
      end
   end
   function ResNet:_make_layer(block, planes, blocks, stride)
      local downsample
      if stride ~= 1 or self.inplanes ~= planes * block.expansion then
         downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                    nn.BatchNorm2d(planes * block.expansion))
      end
      local list = { block(self.inplanes, planes, stride, downsample, self.groups_,
                           self.base_width, 1) }
      self.inplanes = planes * block.expansion
      for _ = 2, blocks do
         list[#list + 1] = block(self.inplanes, planes, 1, nil, self.groups_, self.base_width, 1)
      end
      return nn.Sequential(list)
   end
   function ResNet:fold_batch_norm()
      local n = 0                                     -- the stem, then the blocks and the rest
      if not self.folded and nn.utils.fold_named_(self, "conv1", "bn1") then
         self.folded, n = true, 1
      end
      return n + nn.Module.fold_batch_norm(self)
   end
   function ResNet:forward(x)
      if self.folded then
         x = self.maxpool(self.conv1:forward(x, { relu = true }))
      elseif not self.training and fold.eval_foldable({ { self.conv1, self.bn1 } },
                                                    { self.relu }) then
         x = self.maxpool(fold.conv_bn(self.conv1, self.bn1, x, RELU))
      else
         x = self.maxpool(bn_relu(self.bn1, self.relu, self.conv1(x)))
      end
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      x = self.avgpool(x)
      x = lm.F.flatten(x, 2)
      return self.fc(x)
   end

   return { BasicBlock = BasicBlock, Bottleneck = Bottleneck, ResNet = ResNet }
end


local configs = {
   resnet18 = { "BasicBlock", { 2, 2, 2, 2 } },
   resnet34 = { "BasicBlock", { 3, 4, 6, 3 } },
   resnet50 = { "Bottleneck", { 3, 4, 6, 3 } },
   resnet101 = { "Bottleneck", { 3, 4, 23, 3 } },
   resnet152 = { "Bottleneck", { 3, 8, 36, 3 } },
   resnext50_32x4d = { "Bottleneck", { 3, 4, 6, 3 }, 32, 4 },
   resnext101_32x8d = { "Bottleneck", { 3, 4, 23, 3 }, 32, 8 },
   wide_resnet50_2 = { "Bottleneck", { 3, 4, 6, 3 }, 1, 128 },
   wide_resnet101_2 = { "Bottleneck", { 3, 4, 23, 3 }, 1, 128 },
}

--- install the model constructors into `models` (lm.models), built on `lm`
function M.install(lm, models)
   local classes, opts_of = models._class_cache(builder), models._opts_of
   for name, cfg in pairs(configs) do
      models[name] = function(opts)
         local o = opts_of(name, opts)
         o.groups = cfg[3] or o.groups
         o.width_per_group = cfg[4] or o.width_per_group
         local c = classes(lm)
         return c.ResNet(c[cfg[1]], cfg[2], o)
      end
   end
   models.ResNet = function(block, layers, opts)
      local c = classes(lm)
      return c.ResNet(type(block) == "string" and c[block] or block, layers, opts)
   end
   models.BasicBlock = function(...) return classes(lm).BasicBlock(...) end
   models.Bottleneck = function(...) return classes(lm).Bottleneck(...) end
   return models
end

return M
