-- models/video_resnet.lua -- torchvision's video ResNets (torchvision.models.video): r3d_18,
-- mc3_18 and r2plus1d_18, for clips N x 3 x T x H x W.
--
-- One builder (VideoResNet) with torchvision's pieces: two stems (BasicStem: a 3x7x7 convolution,
-- stride (1, 2, 2); R2Plus1dStem: 1x7x7 then 3x1x1), three convolution builders (Conv3DSimple:
-- 3x3x3; Conv3DNoTemporal: 1x3x3; Conv2Plus1D: 1x3x3, batch norm, ReLU, 3x1x1 with torchvision's
-- midplanes) and the BasicBlock, whose convolutions are Sequentials (conv, BatchNorm3d[, ReLU]).
-- Module and parameter names follow torchvision's state_dict keys exactly (stem.0.weight,
-- layer1.0.conv1.0.weight, layer2.0.conv1.0.3.weight, layer2.0.downsample.1.running_var,
-- fc.bias, ...), so weights exported from torchvision load with load_state_dict unchanged.
-- Conv3DSimple and Conv3DNoTemporal are plain Conv3d modules here (torchvision's subclasses add
-- nothing but a name).
--
--    local model = lm.models.r3d_18({num_classes = 400})
--    lm.to_channels_last(model)              -- 5-D weights to channels_last_3d
--
-- nn.fold_batch_norm folds every (Conv3d, BatchNorm3d) pair; the stems and blocks then run their
-- ReLUs and the residual add in the convolutions' epilogues (Conv3d:forward(x, {residual =,
-- relu =})), as the 2-D ResNets do.
local M = {}

local function builder(lm)
   local nn = lm.nn
   local fold = require("lumen.nn.fold")
   local init = nn.init
   local RELU = { relu = true }             -- the epilogue options of a conv followed by a ReLU

   -- Sequential subclasses keep Sequential's numeric indexing (seq[1] is child "0")
   local function sequential_class(name)
      local cls = nn.Sequential:extend(name)
      cls.__index = function(self, k)
         if type(k) == "number" then return rawget(self, tostring(k - 1)) end
         return cls[k]
      end
      return cls
   end

   -- the convolution builders: (in_planes, out_planes, midplanes, stride, padding) -> module,
   -- and the downsample's stride for a block's stride
   local function conv3d(cin, cout, k, stride, padding)
      return nn.Conv3d(cin, cout, k, { stride = stride, padding = padding, bias = false })
   end
   local Conv3DSimple = {
      name = "Conv3DSimple",
      new = function(cin, cout, _, stride, padding)
         stride, padding = stride or 1, padding or 1
         return conv3d(cin, cout, { 3, 3, 3 }, { stride, stride, stride },
                       { padding, padding, padding })
      end,
      downsample_stride = function(s) return { s, s, s } end,
   }
   local Conv3DNoTemporal = {
      name = "Conv3DNoTemporal",
      new = function(cin, cout, _, stride, padding)
         stride, padding = stride or 1, padding or 1
         return conv3d(cin, cout, { 1, 3, 3 }, { 1, stride, stride }, { 0, padding, padding })
      end,
      downsample_stride = function(s) return { 1, s, s } end,
   }
   -- Conv2Plus1D: a Sequential (1x3x3 conv, BatchNorm3d, ReLU, 3x1x1 conv)
   local Conv2Plus1DClass = sequential_class("Conv2Plus1D")
   local Conv2Plus1D = {
      name = "Conv2Plus1D",
      new = function(cin, cout, midplanes, stride, padding)
         stride, padding = stride or 1, padding or 1
         return Conv2Plus1DClass(
            conv3d(cin, midplanes, { 1, 3, 3 }, { 1, stride, stride }, { 0, padding, padding }),
            nn.BatchNorm3d(midplanes), nn.ReLU(true),
            conv3d(midplanes, cout, { 3, 1, 1 }, { stride, 1, 1 }, { padding, 0, 0 }))
      end,
      downsample_stride = function(s) return { s, s, s } end,
   }

   -- the stems: Sequentials; after folding, their ReLUs run in the convolutions' epilogues
   local BasicStem = sequential_class("BasicStem")
   function BasicStem:__init()
      nn.Sequential.__init(self,
         conv3d(3, 64, { 3, 7, 7 }, { 1, 2, 2 }, { 1, 3, 3 }), nn.BatchNorm3d(64), nn.ReLU(true))
   end
   function BasicStem:fold_batch_norm()
      if self.folded then return 0 end
      if not nn.utils.fold_named_(self, "0", "1") then return 0 end
      self.folded = true
      return 1
   end
   function BasicStem:forward(x)
      if self.folded then return self[1]:forward(x, RELU) end
      return nn.Sequential.forward(self, x)
   end

   local R2Plus1dStem = sequential_class("R2Plus1dStem")
   function R2Plus1dStem:__init()
      nn.Sequential.__init(self,
         conv3d(3, 45, { 1, 7, 7 }, { 1, 2, 2 }, { 0, 3, 3 }), nn.BatchNorm3d(45), nn.ReLU(true),
         conv3d(45, 64, { 3, 1, 1 }, { 1, 1, 1 }, { 1, 0, 0 }), nn.BatchNorm3d(64), nn.ReLU(true))
   end
   function R2Plus1dStem:fold_batch_norm()
      if self.folded or not nn.utils.can_fold_all({ { self[1], self[2] }, { self[4], self[5] } })
      then
         return 0
      end
      nn.utils.fold_named_(self, "0", "1")
      nn.utils.fold_named_(self, "3", "4")
      self.folded = true
      return 2
   end
   function R2Plus1dStem:forward(x)
      if self.folded then return self[4]:forward(self[1]:forward(x, RELU), RELU) end
      return nn.Sequential.forward(self, x)
   end

   local BasicBlock = nn.Module:extend("BasicBlock")
   BasicBlock.expansion = 1
   -- BasicBlock(inplanes, planes, conv_builder, stride = 1, downsample = nil)
   function BasicBlock:__init(inplanes, planes, conv_builder, stride, downsample)
      -- torchvision's midplanes (Conv2Plus1D's middle width: about the parameters of a 3x3x3 conv)
      local midplanes = math.floor((inplanes * planes * 3 * 3 * 3) /
                                  (inplanes * 3 * 3 + 3 * planes))
      self.conv1 = nn.Sequential(conv_builder.new(inplanes, planes, midplanes, stride),
                                 nn.BatchNorm3d(planes), nn.ReLU(true))
      self.conv2 = nn.Sequential(conv_builder.new(planes, planes, midplanes),
                                 nn.BatchNorm3d(planes))
      self.relu = nn.ReLU(true)
      if downsample then self.downsample = downsample end
      self.stride = stride or 1
   end

   -- a folded branch (self.conv1 or self.conv2): its convolution(s), the last one with `fuse`
   local function run_branch(seq, x, fuse)
      local c = seq[1]
      if getmetatable(c) == Conv2Plus1DClass then
         return c[4]:forward(c[1]:forward(x, RELU), fuse)
      end
      return c:forward(x, fuse)
   end

   function BasicBlock:forward(x)
      if self.folded then
         local out = run_branch(self.conv1, x, RELU)
         local identity = x
         if self.downsample then identity = self.downsample(x) end
         return run_branch(self.conv2, out, { residual = identity, relu = true })
      end
      -- unfolded (training): the branch's last batch norm, the residual add and the ReLU as
      -- one fused batch norm (nn.utils.bn_relu), when conv2 is still (convolution, batch norm)
      local c2 = self.conv2
      local identity = x
      if self.downsample then identity = self.downsample(x) end
      if c2:size() == 2 then
         -- evaluation with gradients off: conv2 and its batch norm folded for the call, the
         -- residual add and the ReLU in the convolution's epilogue (lumen.nn.fold.conv_bn), as
         -- the 2-D ResNet blocks do (conv1, a Sequential, folds itself). r3d_18 bf16 inference,
         -- 2 clips: the batch-norm passes of conv2 and the weight's separate autocast cast go.
         if not self.training and fold.eval_foldable({ { c2[1], c2[2] } }, { self.relu }) then
            local out = self.conv1(x)
            local y = fold.conv_bn(c2[1], c2[2], out, { residual = identity, relu = true })
            if fold.unwrapped(self) and fold.releasable(out) then out:free() end
            return y
         end
         return nn.utils.bn_relu(c2[2], self.relu, c2[1](self.conv1(x)), identity)
      end
      return self.relu(c2(self.conv1(x)) + identity)
   end

   -- a branch's (conv container, conv name, bn container, bn name) pairs: the builder's own
   -- (Conv2Plus1D's inner batch norm) and the builder's last convolution with the branch's
   -- batch norm
   local function branch_pairs(seq, list)
      local c = seq[1]
      if getmetatable(c) == Conv2Plus1DClass then
         list[#list + 1] = { c, "0", c, "1" }
         list[#list + 1] = { c, "3", seq, "1" }
      else
         list[#list + 1] = { seq, "0", seq, "1" }
      end
   end

   -- nn.fold_batch_norm: all of the block's pairs or none (a batch norm without running
   -- statistics cannot be folded), and its downsample (a Sequential) on its own
   function BasicBlock:fold_batch_norm()
      local n = self.downsample and self.downsample:fold_batch_norm() or 0
      if self.folded then return n end
      local list = {}
      branch_pairs(self.conv1, list)
      branch_pairs(self.conv2, list)
      local pl = {}
      for i, p in ipairs(list) do pl[i] = { p[1][p[2]], p[3][p[4]] } end
      if not nn.utils.can_fold_all(pl) then return n end
      for _, p in ipairs(list) do
         nn.utils.fold_pair_(rawget(p[1], p[2]), rawget(p[3], p[4]))
         p[3]:add_module(p[4], nn.Identity():eval())      -- folding happens in eval mode
      end
      self.folded = true
      return n + #list
   end

   local VideoResNet = nn.Module:extend("VideoResNet")
   -- VideoResNet(block, conv_makers, layers, stem, opts)
   function VideoResNet:__init(block, conv_makers, layers, stem, opts)
      opts = opts or {}
      self.inplanes = 64
      self.stem = stem()
      self.layer1 = self:_make_layer(block, conv_makers[1], 64, layers[1], 1)
      self.layer2 = self:_make_layer(block, conv_makers[2], 128, layers[2], 2)
      self.layer3 = self:_make_layer(block, conv_makers[3], 256, layers[3], 2)
      self.layer4 = self:_make_layer(block, conv_makers[4], 512, layers[4], 2)
      self.avgpool = nn.AdaptiveAvgPool3d({ 1, 1, 1 })
      self.fc = nn.Linear(512 * block.expansion, opts.num_classes or 400)
      -- torchvision's initialisation (zero_init_residual only touches Bottleneck blocks in
      -- torchvision's VideoResNet; these models have none)
      for _, m in ipairs(self:modules()) do
         local ty = m:type_name()
         if ty == "Conv3d" then
            init.kaiming_normal_(m.weight, 0, "fan_out", "relu")
            if m.bias ~= nil then init.constant_(m.bias, 0) end
         elseif ty == "BatchNorm3d" then
            init.constant_(m.weight, 1)
            init.constant_(m.bias, 0)
         elseif ty == "Linear" then
            init.normal_(m.weight, 0, 0.01)
            init.constant_(m.bias, 0)
         end
      end
   end
   function VideoResNet:_make_layer(block, conv_builder, planes, blocks, stride)
      local downsample
      if stride ~= 1 or self.inplanes ~= planes * block.expansion then
         downsample = nn.Sequential(
            nn.Conv3d(self.inplanes, planes * block.expansion, 1,
                      { stride = conv_builder.downsample_stride(stride), bias = false }),
            nn.BatchNorm3d(planes * block.expansion))
      end
      local list = { block(self.inplanes, planes, conv_builder, stride, downsample) }
      self.inplanes = planes * block.expansion
      for _ = 2, blocks do list[#list + 1] = block(self.inplanes, planes, conv_builder) end
      return nn.Sequential(list)
   end
   function VideoResNet:forward(x)
      x = self.stem(x)
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      x = self.avgpool(x)
      x = lm.F.flatten(x, 2)
      return self.fc(x)
   end

   return {
      BasicBlock = BasicBlock, VideoResNet = VideoResNet, BasicStem = BasicStem,
      R2Plus1dStem = R2Plus1dStem, Conv3DSimple = Conv3DSimple,
      Conv3DNoTemporal = Conv3DNoTemporal, Conv2Plus1D = Conv2Plus1D,
   }
end


-- name -> {conv builders of the four stages, stem}; every one has BasicBlocks {2, 2, 2, 2}
local configs = {
   r3d_18 = { { "Conv3DSimple", "Conv3DSimple", "Conv3DSimple", "Conv3DSimple" }, "BasicStem" },
   mc3_18 = { { "Conv3DSimple", "Conv3DNoTemporal", "Conv3DNoTemporal", "Conv3DNoTemporal" },
              "BasicStem" },
   r2plus1d_18 = { { "Conv2Plus1D", "Conv2Plus1D", "Conv2Plus1D", "Conv2Plus1D" },
                   "R2Plus1dStem" },
}

--- install the model constructors into `models` (lm.models), built on `lm`
function M.install(lm, models)
   local classes, opts_of = models._class_cache(builder), models._opts_of
   for name, cfg in pairs(configs) do
      models[name] = function(opts)
         local o = opts_of(name, opts)
         local c = classes(lm)
         local makers = {}
         for i, m in ipairs(cfg[1]) do makers[i] = c[m] end
         return c.VideoResNet(c.BasicBlock, makers, { 2, 2, 2, 2 }, c[cfg[2]], o)
      end
   end
   return models
end

return M
