-- models/small_resnet.lua -- a small ResNet for 28x28 single-channel images (Fashion-MNIST):
-- a 3x3 stem, three stages of basic blocks (widths w, 2w, 4w; strides 1, 2, 2: 28 -> 14 -> 7),
-- global average pooling and a linear classifier. The blocks are torchvision's BasicBlock.
--
--    local model = lm.models.small_resnet({num_classes = 10, width = 16, blocks = 1})
local M = {}

function M.install(lm, models)
   local nn = lm.nn
   local Small
   local function class()
      if Small then return Small end
      local Basic = models.BasicBlock
      Small = nn.Module:extend("SmallResNet")
      function Small:__init(opts)
         opts = opts or {}
         local w = opts.width or 16
         local blocks = opts.blocks or 1
         local in_ch = opts.in_channels or 1
         self.conv1 = nn.Conv2d(in_ch, w, 3, { padding = 1, bias = false })
         self.bn1 = nn.BatchNorm2d(w)
         self.relu = nn.ReLU(true)
         local inplanes = w
         local function stage(planes, stride)
            local list = {}
            for b = 1, blocks do
               local s = b == 1 and stride or 1
               local ds
               if s ~= 1 or inplanes ~= planes then
                  ds = nn.Sequential(nn.Conv2d(inplanes, planes, 1, { stride = s, bias = false }),
                                     nn.BatchNorm2d(planes))
               end
               list[#list + 1] = Basic(inplanes, planes, s, ds)
               inplanes = planes
            end
            return nn.Sequential(list)
         end
         self.layer1 = stage(w, 1)
         self.layer2 = stage(2 * w, 2)
         self.layer3 = stage(4 * w, 2)
         self.avgpool = nn.AdaptiveAvgPool2d({ 1, 1 })
         self.fc = nn.Linear(4 * w, opts.num_classes or 10)
         for _, m in ipairs(self:modules()) do
            if m:type_name() == "Conv2d" then
               nn.init.kaiming_normal_(m.weight, 0, "fan_out", "relu")
            end
         end
      end
      -- nn.fold_batch_norm: the stem's batch norm into its convolution, then the blocks
      function Small:fold_batch_norm()
         local n = 0
         if not self.folded and nn.utils.fold_named_(self, "conv1", "bn1") then
            self.folded, n = true, 1
         end
         return n + nn.Module.fold_batch_norm(self)
      end
      function Small:forward(x)
         if self.folded then
            x = self.conv1:forward(x, { relu = true })
         else
            x = nn.utils.bn_relu(self.bn1, self.relu, self.conv1(x))
         end
         x = self.layer3(self.layer2(self.layer1(x)))
         x = lm.F.flatten(self.avgpool(x), 2)
         return self.fc(x)
      end
      return Small
   end
   models.small_resnet = function(opts)
      if opts ~= nil and type(opts) ~= "table" then
         error("lumen.models.small_resnet: opts must be a table, got " .. type(opts), 2)
      end
      return class()(opts)
   end
   return models
end

return M
