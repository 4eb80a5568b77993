-- models/efficientnet.lua -- EfficientNet B0-B3, as torchvision builds them (one definition:
-- torchvision's MBConvConfig with width_mult / depth_mult per variant).
--
-- MBConv: 1x1 expansion (BatchNorm, SiLU), depthwise k x k (BatchNorm, SiLU), squeeze-and-
-- excitation (SiLU, sigmoid), 1x1 projection (BatchNorm); the residual through stochastic depth
-- (torchvision's StochasticDepth "row", its probability growing linearly over the blocks to
-- stochastic_depth_prob). torchvision's state_dict keys (features.2.1.block.2.fc1.weight,
-- features.8.0.weight, classifier.1.bias, ...), so torchvision's weights load unchanged.
--
--    local model = lm.models.efficientnet_b0({num_classes = 10, stochastic_depth_prob = 0.2})
local M = {}

-- torchvision's _efficientnet_conf: width_mult, depth_mult, dropout
local VARIANTS = {
   efficientnet_b0 = { 1.0, 1.0, 0.2 },
   efficientnet_b1 = { 1.0, 1.1, 0.2 },
   efficientnet_b2 = { 1.1, 1.2, 0.3 },
   efficientnet_b3 = { 1.2, 1.4, 0.3 },
}
M.VARIANTS = VARIANTS

local function builder(lm, models)
   local nn = lm.nn
   local init = nn.init
   local B = models._blocks(lm)
   local cna, divisible = B.conv_norm_act, models._make_divisible
   local fold = require("lumen.nn.fold")

   local MBConv = nn.Module:extend("MBConv")
   function MBConv:__init(cnf, sd_prob)
      self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
      local layers = {}
      local expanded = divisible(cnf.input_channels * cnf.expand_ratio, 8)
      if expanded ~= cnf.input_channels then
         layers[#layers + 1] = cna(cnf.input_channels, expanded, 1, { act = nn.SiLU(true) })
      end
      layers[#layers + 1] = cna(expanded, expanded, cnf.kernel, { stride = cnf.stride,
                                                                  groups = expanded,
                                                                  act = nn.SiLU(true) })
      local sq = math.max(1, math.floor(cnf.input_channels / 4))
      layers[#layers + 1] = B.SqueezeExcitation(expanded, sq, nn.SiLU, nn.Sigmoid)
      layers[#layers + 1] = cna(expanded, cnf.out_channels, 1)
      self.block = nn.Sequential(layers)
      self.stochastic_depth = lm.ops.StochasticDepth(sd_prob, "row")
      self.out_channels = cnf.out_channels
   end
   function MBConv:forward(x)
      local sd = self.stochastic_depth
      if self.use_res_connect and (not sd.training or sd.p == 0) and fold.unwrapped(self) then
         return fold.block_add(self.block, x) -- stochastic depth is the identity here
      end
      local y = self.block(x)
      if self.use_res_connect then y = self.stochastic_depth(y) + x end
      return y
   end

   local EfficientNet = nn.Module:extend("EfficientNet")
   function EfficientNet:__init(width_mult, depth_mult, opts)
      local function conf(e, k, s, i, o, n)
         return { expand_ratio = e, kernel = k, stride = s,
                  input_channels = divisible(i * width_mult, 8),
                  out_channels = divisible(o * width_mult, 8),
                  num_layers = math.ceil(n * depth_mult) }
      end
      local setting = {
         conf(1, 3, 1, 32, 16, 1), conf(6, 3, 2, 16, 24, 2), conf(6, 5, 2, 24, 40, 2),
         conf(6, 3, 2, 40, 80, 3), conf(6, 5, 1, 80, 112, 3), conf(6, 5, 2, 112, 192, 4),
         conf(6, 3, 1, 192, 320, 1),
      }
      local sdp = opts.stochastic_depth_prob or 0.2
      local layers = { cna(3, setting[1].input_channels, 3, { stride = 2, act = nn.SiLU(true) }) }
      local total = 0
      for _, c in ipairs(setting) do total = total + c.num_layers end
      local id = 0
      for _, c in ipairs(setting) do
         local stage = {}
         for j = 1, c.num_layers do
            local bc = { expand_ratio = c.expand_ratio, kernel = c.kernel, stride = c.stride,
                         input_channels = c.input_channels, out_channels = c.out_channels }
            if j > 1 then
               bc.input_channels, bc.stride = bc.out_channels, 1
            end
            stage[#stage + 1] = MBConv(bc, sdp * id / total)
            id = id + 1
         end
         layers[#layers + 1] = nn.Sequential(stage)
      end
      local lin = setting[#setting].out_channels
      local lout = 4 * lin
      layers[#layers + 1] = cna(lin, lout, 1, { act = nn.SiLU(true) })
      self.features = nn.Sequential(layers)
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.classifier = nn.Sequential(nn.Dropout(opts.dropout),
                                      nn.Linear(lout, opts.num_classes or 1000))
      for _, m in ipairs(self:modules()) do
         local ty = m:type_name()
         if ty == "Conv2d" then
            init.kaiming_normal_(m.weight, 0, "fan_out")
            if m.bias ~= nil then init.zeros_(m.bias) end
         elseif ty == "BatchNorm2d" then
            init.ones_(m.weight)
            init.zeros_(m.bias)
         elseif ty == "Linear" then
            local r = 1 / math.sqrt(m.out_features)
            init.uniform_(m.weight, -r, r)
            init.zeros_(m.bias)
         end
      end
   end
   function EfficientNet:forward(x)
      x = self.avgpool(self.features(x))
      return self.classifier(lm.F.flatten(x, 2))
   end
   return { EfficientNet = EfficientNet, MBConv = MBConv }
end

function M.install(lm, models)
   local mob = models._mobilenet_checks
   local classes
   for name, v in pairs(VARIANTS) do
      models[name] = function(opts)
         local o = models._opts_of(name, opts)
         mob.check_dropout(name, o)
         local p = o.stochastic_depth_prob
         if p ~= nil and (type(p) ~= "number" or not (p >= 0 and p <= 1)) then
            error(("lumen.models.%s: stochastic_depth_prob must be a number in [0, 1], got %s")
                  :format(name, tostring(p)), 3)
         end
         if o.dropout == nil then o.dropout = v[3] end
         classes = classes or builder(lm, models)
         return classes.EfficientNet(v[1], v[2], o)
      end
   end
   return models
end

return M
