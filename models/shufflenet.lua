-- models/shufflenet.lua -- ShuffleNet V2 x0.5, x1.0, x1.5, x2.0, as torchvision builds them.
--
-- InvertedResidual: with stride 1 the input's channels split in two halves (narrow: views, no
-- copy), the second half through branch2 (1x1, BN, ReLU, depthwise 3x3, BN, 1x1, BN, ReLU), the
-- halves concatenated; with stride 2 branch1 (depthwise 3x3 stride 2, BN, 1x1, BN, ReLU) and
-- branch2 both take the whole input. Then channel_shuffle(2): lm.F.channel_shuffle, which keeps
-- a channels-last input channels-last (torchvision's view / transpose / contiguous returns a
-- contiguous tensor in PyTorch). torchvision's state_dict keys (conv1.0.weight,
-- stage2.0.branch1.0.weight, stage3.4.branch2.5.weight, conv5.1.running_var, fc.bias, ...).
--
--    local model = lm.models.shufflenet_v2_x1_0({num_classes = 10})
local M = {}

-- stages_repeats, stages_out_channels
local VARIANTS = {
   shufflenet_v2_x0_5 = { { 4, 8, 4 }, { 24, 48, 96, 192, 1024 } },
   shufflenet_v2_x1_0 = { { 4, 8, 4 }, { 24, 116, 232, 464, 1024 } },
   shufflenet_v2_x1_5 = { { 4, 8, 4 }, { 24, 176, 352, 704, 1024 } },
   shufflenet_v2_x2_0 = { { 4, 8, 4 }, { 24, 244, 488, 976, 2048 } },
}
M.VARIANTS = VARIANTS

local function builder(lm)
   local nn = lm.nn
   local F = lm.F

   local function dwconv(c, stride)
      return nn.Conv2d(c, c, 3, { stride = stride, padding = 1, groups = c, bias = false })
   end
   local function conv1x1(cin, cout)
      return nn.Conv2d(cin, cout, 1, { bias = false })
   end

   local IR = nn.Module:extend("InvertedResidual")
   function IR:__init(inp, oup, stride)
      self.stride = stride
      local bf = math.floor(oup / 2)
      if stride > 1 then
         self.branch1 = nn.Sequential(dwconv(inp, stride), nn.BatchNorm2d(inp),
                                      conv1x1(inp, bf), nn.BatchNorm2d(bf), nn.ReLU(true))
      else
         self.branch1 = nn.Sequential()
      end
      self.branch2 = nn.Sequential(conv1x1(stride > 1 and inp or bf, bf), nn.BatchNorm2d(bf),
                                   nn.ReLU(true), dwconv(bf, stride), nn.BatchNorm2d(bf),
                                   conv1x1(bf, bf), nn.BatchNorm2d(bf), nn.ReLU(true))
   end
   function IR:forward(x)
      local out
      if self.stride == 1 then
         local c = math.floor(x:size(2) / 2)   -- torchvision's x.chunk(2, dim=1)
         out = lm.cat({ x:narrow(2, 1, c), self.branch2(x:narrow(2, c + 1, c)) }, 2)
      else
         out = lm.cat({ self.branch1(x), self.branch2(x) }, 2)
      end
      return F.channel_shuffle(out, 2)
   end

   local ShuffleNetV2 = nn.Module:extend("ShuffleNetV2")
   function ShuffleNetV2:__init(repeats, outs, opts)
      self.conv1 = nn.Sequential(
         nn.Conv2d(3, outs[1], 3, { stride = 2, padding = 1, bias = false }),
         nn.BatchNorm2d(outs[1]), nn.ReLU(true))
      self.maxpool = nn.MaxPool2d({ kernel_size = 3, stride = 2, padding = 1 })
      local cin = outs[1]
      for i, r in ipairs(repeats) do
         local seq = { IR(cin, outs[i + 1], 2) }
         for _ = 2, r do seq[#seq + 1] = IR(outs[i + 1], outs[i + 1], 1) end
         self["stage" .. (i + 1)] = nn.Sequential(seq)
         cin = outs[i + 1]
      end
      self.conv5 = nn.Sequential(conv1x1(cin, outs[5]), nn.BatchNorm2d(outs[5]), nn.ReLU(true))
      self.fc = nn.Linear(outs[5], opts.num_classes or 1000)
   end
   function ShuffleNetV2:forward(x)
      x = self.maxpool(self.conv1(x))
      x = self.conv5(self.stage4(self.stage3(self.stage2(x))))
      return self.fc(x:mean({ 3, 4 }))   -- the global pool
   end
   return { ShuffleNetV2 = ShuffleNetV2, InvertedResidual = IR }
end

function M.install(lm, models)
   local classes
   for name, v in pairs(VARIANTS) do
      models[name] = function(opts)
         local o = models._opts_of(name, opts)
         classes = classes or builder(lm)
         return classes.ShuffleNetV2(v[1], v[2], o)
      end
   end
   return models
end

return M
