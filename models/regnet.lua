-- models/regnet.lua -- the RegNet family (RegNetY with squeeze-and-excitation, RegNetX without),
-- as torchvision builds them, from one definition: torchvision's BlockParams.from_init_params
-- turns (depth, w_0, w_a, w_m, group_width, se_ratio) into per-stage widths, depths and group
-- widths (quantized linear widths in log space, widths made compatible with the groups).
--
-- ResBottleneckBlock: f = a (1x1, BN, ReLU), b (grouped 3x3 with stride, BN, ReLU),
-- se (SqueezeExcitation: ReLU, sigmoid; Y only), c (1x1, BN); the shortcut through proj (1x1
-- with stride, BN) when the width or the resolution changes; ReLU after the sum.
-- torchvision's module tree and state_dict keys (stem.0.weight,
-- trunk_output.block1.block1-0.f.b.0.weight, trunk_output.block2.block2-0.proj.1.running_mean,
-- trunk_output.block1.block1-0.f.se.fc1.bias, fc.weight, ...), so torchvision's weights load
-- unchanged.
--
--    local model = lm.models.regnet_y_400mf({num_classes = 10})
local M = {}

-- torchvision's constructors: depth, w_0, w_a, w_m, group_width, se_ratio (nil: RegNetX)
local VARIANTS = {
   regnet_y_400mf = { 16, 48, 27.89, 2.09, 8, 0.25 },
   regnet_y_800mf = { 14, 56, 38.84, 2.4, 16, 0.25 },
   regnet_y_1_6gf = { 27, 48, 20.71, 2.65, 24, 0.25 },
   regnet_y_3_2gf = { 21, 80, 42.63, 2.66, 24, 0.25 },
   regnet_y_8gf = { 17, 192, 76.82, 2.19, 56, 0.25 },
   regnet_y_16gf = { 18, 200, 106.23, 2.48, 112, 0.25 },
   regnet_y_32gf = { 20, 232, 115.89, 2.53, 232, 0.25 },
   regnet_y_128gf = { 27, 456, 160.83, 2.52, 264, 0.25 },
   regnet_x_400mf = { 22, 24, 24.48, 2.54, 16 },
   regnet_x_800mf = { 16, 56, 35.73, 2.28, 16 },
   regnet_x_1_6gf = { 18, 80, 34.01, 2.25, 24 },
   regnet_x_3_2gf = { 25, 88, 26.31, 2.25, 48 },
   regnet_x_8gf = { 23, 80, 49.56, 2.88, 120 },
   regnet_x_16gf = { 22, 216, 55.59, 2.1, 128 },
   regnet_x_32gf = { 23, 320, 69.86, 2.0, 168 },
}
M.VARIANTS = VARIANTS

-- Python's round (half to even)
local function round(x)
   local f = math.floor(x)
   local d = x - f
   if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
   return f
end

-- torchvision's BlockParams.from_init_params (bottleneck_multiplier 1): a list of stages
-- {width, depth, group_width}, and the se_ratio. torchvision computes the widths in float32;
-- rounded to multiples of 8 the double results are the same for every listed variant (the
-- peer spec compares all their state_dict shapes).
function M.block_params(depth, w_0, w_a, w_m, group_width, divisible)
   local QUANT = 8
   local widths = {}
   for i = 0, depth - 1 do
      local cont = i * w_a + w_0
      local cap = round(math.log(cont / w_0) / math.log(w_m))
      widths[#widths + 1] = round(w_0 * w_m ^ cap / QUANT) * QUANT
   end
   -- a stage starts wherever the width changes
   local stages = {}
   for i, w in ipairs(widths) do
      if i == 1 or w ~= widths[i - 1] then
         stages[#stages + 1] = { w, 0 }
      end
      stages[#stages][2] = stages[#stages][2] + 1
   end
   -- _adjust_widths_groups_compatibilty
   for _, s in ipairs(stages) do
      local g = math.min(group_width, s[1])
      s[1] = divisible(s[1], g)
      s[3] = g
   end
   return stages
end

local function builder(lm, models)
   local nn = lm.nn
   local init = nn.init
   local B = models._blocks(lm)
   local cna = B.conv_norm_act
   local fold = require("lumen.nn.fold")

   local ResBottleneckBlock = nn.Module:extend("ResBottleneckBlock")
   function ResBottleneckBlock:__init(win, wout, stride, group_width, se_ratio)
      if win ~= wout or stride ~= 1 then
         self.proj = cna(win, wout, 1, { stride = stride })
      end
      local w_b = wout   -- bottleneck_multiplier 1
      local f = nn.Sequential()
      f:add_module("a", cna(win, w_b, 1, { act = nn.ReLU(true) }))
      f:add_module("b", cna(w_b, w_b, 3, { stride = stride, groups = math.floor(w_b / group_width),
                                           act = nn.ReLU(true) }))
      if se_ratio then
         f:add_module("se", B.SqueezeExcitation(w_b, round(se_ratio * win), nn.ReLU, nn.Sigmoid))
      end
      f:add_module("c", cna(w_b, wout, 1))
      self.f = f
      self.activation = nn.ReLU(true)
   end
   -- relu(proj(x) + f(x)) as torchvision's, with the add and the ReLU inside f's last
   -- convolution and batch norm (fold.block_add) where nothing watches the block's modules'
   -- own calls
   function ResBottleneckBlock:forward(x)
      local identity = self.proj ~= nil and self.proj(x) or x
      if fold.unwrapped(self) then return fold.block_add(self.f, x, identity, self.activation) end
      return self.activation(identity + self.f(x))
   end

   local RegNet = nn.Module:extend("RegNet")
   function RegNet:__init(stages, se_ratio, opts)
      local stem_width = 32
      self.stem = cna(3, stem_width, 3, { stride = 2, act = nn.ReLU(true) })
      local trunk = nn.Sequential()
      local cur = stem_width
      for i, s in ipairs(stages) do
         local stage = nn.Sequential()
         for j = 0, s[2] - 1 do
            stage:add_module(("block%d-%d"):format(i, j),
                             ResBottleneckBlock(j == 0 and cur or s[1], s[1], j == 0 and 2 or 1,
                                                s[3], se_ratio))
         end
         trunk:add_module("block" .. i, stage)
         cur = s[1]
      end
      self.trunk_output = trunk
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc = nn.Linear(cur, opts.num_classes or 1000)
      for _, m in ipairs(self:modules()) do
         local ty = m:type_name()
         if ty == "Conv2d" then
            local k = m.weight:size()
            init.normal_(m.weight, 0, math.sqrt(2.0 / (k[3] * k[4] * m.weight:size(1))))
         elseif ty == "BatchNorm2d" then
            init.ones_(m.weight)
            init.zeros_(m.bias)
         elseif ty == "Linear" then
            init.normal_(m.weight, 0, 0.01)
            init.zeros_(m.bias)
         end
      end
   end
   function RegNet:forward(x)
      x = self.avgpool(self.trunk_output(self.stem(x)))
      return self.fc(lm.F.flatten(x, 2))
   end
   return { RegNet = RegNet, ResBottleneckBlock = ResBottleneckBlock }
end

function M.install(lm, models)
   local classes
   for name, v in pairs(VARIANTS) do
      models[name] = function(opts)
         local o = models._opts_of(name, opts)
         classes = classes or builder(lm, models)
         local stages = M.block_params(v[1], v[2], v[3], v[4], v[5], models._make_divisible)
         return classes.RegNet(stages, v[6], o)
      end
   end
   return models
end

return M
