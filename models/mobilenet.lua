-- models/mobilenet.lua -- MobileNet V2 and V3 (large, small), as torchvision builds them.
--
-- torchvision's module tree and state_dict keys (features.1.conv.0.0.weight,
-- features.4.block.2.fc1.bias, classifier.3.weight, ...), so torchvision's weights load with
-- load_state_dict unchanged. Every Conv2dNormActivation is a Sequential (Conv2d, BatchNorm2d,
-- activation): nn.fold_batch_norm folds its pair, and in evaluation with gradients off the pair
-- runs folded for the call (the Sequential's own rule). The squeeze-and-excitation gate
-- (N x C x 1 x 1) multiplies the block's activation in its own memory format.
--
--    local model = lm.models.mobilenet_v3_large({num_classes = 10})
--    lm.to_channels_last(model)
local M = {}

local function builder(lm, models)
   local nn = lm.nn
   local init = nn.init
   local B = models._blocks(lm)
   local cna, divisible = B.conv_norm_act, models._make_divisible
   local fold = require("lumen.nn.fold")

   local function tv_init(model)
      for _, m in ipairs(model:modules()) do
         local ty = m:type_name()
         if ty == "Conv2d" then
            init.kaiming_normal_(m.weight, 0, "fan_out")
            if m.bias ~= nil then init.zeros_(m.bias) end
         elseif ty == "BatchNorm2d" then
            init.ones_(m.weight)
            init.zeros_(m.bias)
         elseif ty == "Linear" then
            init.normal_(m.weight, 0, 0.01)
            init.zeros_(m.bias)
         end
      end
   end

   -- MobileNet V2 ------------------------------------------------------------------------------
   local IR2 = nn.Module:extend("InvertedResidual")
   function IR2:__init(inp, oup, stride, expand_ratio)
      local hidden = math.floor(inp * expand_ratio + 0.5)
      self.stride = stride
      self.use_res_connect = stride == 1 and inp == oup
      local layers = {}
      if expand_ratio ~= 1 then
         layers[#layers + 1] = cna(inp, hidden, 1, { act = nn.ReLU6(true) })
      end
      layers[#layers + 1] = cna(hidden, hidden, 3, { stride = stride, groups = hidden,
                                                     act = nn.ReLU6(true) })
      layers[#layers + 1] = nn.Conv2d(hidden, oup, 1, { bias = false })
      layers[#layers + 1] = nn.BatchNorm2d(oup)
      self.conv = nn.Sequential(layers)
      self.out_channels = oup
   end
   -- x + conv(x) as torchvision's, the add inside the last convolution (fold.block_add) where
   -- nothing watches the block's modules' own calls
   function IR2:forward(x)
      if not self.use_res_connect then return self.conv(x) end
      if fold.unwrapped(self) then return fold.block_add(self.conv, x) end
      return x + self.conv(x)
   end

   local V2 = nn.Module:extend("MobileNetV2")
   function V2:__init(opts)
      local width_mult = opts.width_mult or 1.0
      local round_nearest = opts.round_nearest or 8
      local setting = opts.inverted_residual_setting or {
         { 1, 16, 1, 1 }, { 6, 24, 2, 2 }, { 6, 32, 3, 2 }, { 6, 64, 4, 2 },
         { 6, 96, 3, 1 }, { 6, 160, 3, 2 }, { 6, 320, 1, 1 },
      }
      if #setting == 0 or #setting[1] ~= 4 then
         error("lumen.models.mobilenet_v2: inverted_residual_setting should be non-empty or a " ..
               "4-element list", 4)
      end
      local input_channel = divisible(32 * width_mult, round_nearest)
      self.last_channel = divisible(1280 * math.max(1.0, width_mult), round_nearest)
      local features = { cna(3, input_channel, 3, { stride = 2, act = nn.ReLU6(true) }) }
      for _, s in ipairs(setting) do
         local t, c, n, st = s[1], s[2], s[3], s[4]
         local out = divisible(c * width_mult, round_nearest)
         for i = 1, n do
            features[#features + 1] = IR2(input_channel, out, i == 1 and st or 1, t)
            input_channel = out
         end
      end
      features[#features + 1] = cna(input_channel, self.last_channel, 1, { act = nn.ReLU6(true) })
      self.features = nn.Sequential(features)
      self.classifier = nn.Sequential(nn.Dropout(opts.dropout or 0.2),
                                      nn.Linear(self.last_channel, opts.num_classes or 1000))
      tv_init(self)
   end
   function V2:forward(x)
      x = lm.F.adaptive_avg_pool2d(self.features(x), { 1, 1 })
      return self.classifier(lm.F.flatten(x, 2))
   end

   -- MobileNet V3 ------------------------------------------------------------------------------
   local IR3 = nn.Module:extend("InvertedResidual")
   -- cnf: {input_channels, kernel, expanded_channels, out_channels, use_se, use_hs, stride,
   -- dilation} (channels already adjusted)
   function IR3:__init(cnf, bn)
      self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
      local act = cnf.use_hs and nn.Hardswish or nn.ReLU
      local layers = {}
      if cnf.expanded_channels ~= cnf.input_channels then
         layers[#layers + 1] = cna(cnf.input_channels, cnf.expanded_channels, 1,
                                   { bn = bn, act = act(true) })
      end
      layers[#layers + 1] = cna(cnf.expanded_channels, cnf.expanded_channels, cnf.kernel,
                                { stride = cnf.dilation > 1 and 1 or cnf.stride,
                                  dilation = cnf.dilation, groups = cnf.expanded_channels,
                                  bn = bn, act = act(true) })
      if cnf.use_se then
         local sq = divisible(math.floor(cnf.expanded_channels / 4), 8)
         layers[#layers + 1] = B.SqueezeExcitation(cnf.expanded_channels, sq, nn.ReLU,
                                                   nn.Hardsigmoid)
      end
      layers[#layers + 1] = cna(cnf.expanded_channels, cnf.out_channels, 1, { bn = bn })
      self.block = nn.Sequential(layers)
      self.out_channels = cnf.out_channels
   end
   function IR3:forward(x)
      if self.use_res_connect and fold.unwrapped(self) then
         return fold.block_add(self.block, x)
      end
      local y = self.block(x)
      if self.use_res_connect then y = y + x end
      return y
   end

   local V3 = nn.Module:extend("MobileNetV3")
   function V3:__init(setting, last_channel, opts)
      local bn = { eps = 0.001, momentum = 0.01 }
      local layers = { cna(3, setting[1].input_channels, 3, { stride = 2, bn = bn,
                                                              act = nn.Hardswish(true) }) }
      for _, cnf in ipairs(setting) do layers[#layers + 1] = IR3(cnf, bn) end
      local lin = setting[#setting].out_channels
      local lout = 6 * lin
      layers[#layers + 1] = cna(lin, lout, 1, { bn = bn, act = nn.Hardswish(true) })
      self.features = nn.Sequential(layers)
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.classifier = nn.Sequential(nn.Linear(lout, last_channel), nn.Hardswish(true),
                                      nn.Dropout(opts.dropout or 0.2),
                                      nn.Linear(last_channel, opts.num_classes or 1000))
      tv_init(self)
   end
   function V3:forward(x)
      x = self.avgpool(self.features(x))
      return self.classifier(lm.F.flatten(x, 2))
   end

   -- torchvision's _mobilenet_v3_conf
   local function v3_conf(arch, opts)
      local wm = opts.width_mult or 1.0
      local rd = opts.reduced_tail and 2 or 1
      local dil = opts.dilated and 2 or 1
      local function adj(c) return divisible(c * wm, 8) end
      local function c(i, k, e, o, se, a, s, d)
         return { input_channels = adj(i), kernel = k, expanded_channels = adj(e),
                  out_channels = adj(o), use_se = se, use_hs = a == "HS", stride = s,
                  dilation = d }
      end
      local fl = math.floor
      if arch == "mobilenet_v3_large" then
         return {
            c(16, 3, 16, 16, false, "RE", 1, 1),
            c(16, 3, 64, 24, false, "RE", 2, 1),
            c(24, 3, 72, 24, false, "RE", 1, 1),
            c(24, 5, 72, 40, true, "RE", 2, 1),
            c(40, 5, 120, 40, true, "RE", 1, 1),
            c(40, 5, 120, 40, true, "RE", 1, 1),
            c(40, 3, 240, 80, false, "HS", 2, 1),
            c(80, 3, 200, 80, false, "HS", 1, 1),
            c(80, 3, 184, 80, false, "HS", 1, 1),
            c(80, 3, 184, 80, false, "HS", 1, 1),
            c(80, 3, 480, 112, true, "HS", 1, 1),
            c(112, 3, 672, 112, true, "HS", 1, 1),
            c(112, 5, 672, fl(160 / rd), true, "HS", 2, dil),
            c(fl(160 / rd), 5, fl(960 / rd), fl(160 / rd), true, "HS", 1, dil),
            c(fl(160 / rd), 5, fl(960 / rd), fl(160 / rd), true, "HS", 1, dil),
         }, adj(fl(1280 / rd))
      end
      return {
         c(16, 3, 16, 16, true, "RE", 2, 1),
         c(16, 3, 72, 24, false, "RE", 2, 1),
         c(24, 3, 88, 24, false, "RE", 1, 1),
         c(24, 5, 96, 40, true, "HS", 2, 1),
         c(40, 5, 240, 40, true, "HS", 1, 1),
         c(40, 5, 240, 40, true, "HS", 1, 1),
         c(40, 5, 120, 48, true, "HS", 1, 1),
         c(48, 5, 144, 48, true, "HS", 1, 1),
         c(48, 5, 288, fl(96 / rd), true, "HS", 2, dil),
         c(fl(96 / rd), 5, fl(576 / rd), fl(96 / rd), true, "HS", 1, dil),
         c(fl(96 / rd), 5, fl(576 / rd), fl(96 / rd), true, "HS", 1, dil),
      }, adj(fl(1024 / rd))
   end

   return { MobileNetV2 = V2, MobileNetV3 = V3, v3_conf = v3_conf }
end

local function check_number(fname, o, k, lo)
   local v = o[k]
   if v ~= nil and (type(v) ~= "number" or v ~= v or v < lo) then
      error(("lumen.models.%s: %s must be a number >= %s, got %s"):format(fname, k, tostring(lo),
            tostring(v)), 4)
   end
end

local function check_dropout(fname, o)
   local p = o.dropout
   if p ~= nil and (type(p) ~= "number" or not (p >= 0 and p <= 1)) then
      error(("lumen.models.%s: dropout must be a number in [0, 1], got %s"):format(fname,
            tostring(p)), 4)
   end
end
M.check_number, M.check_dropout = check_number, check_dropout

function M.install(lm, models)
   models._mobilenet_checks = M
   local classes
   local function get()
      classes = classes or builder(lm, models)
      return classes
   end
   models.mobilenet_v2 = function(opts)
      local o = models._opts_of("mobilenet_v2", opts)
      check_number("mobilenet_v2", o, "width_mult", 0)
      check_number("mobilenet_v2", o, "round_nearest", 1)
      check_dropout("mobilenet_v2", o)
      return get().MobileNetV2(o)
   end
   for _, arch in ipairs({ "mobilenet_v3_large", "mobilenet_v3_small" }) do
      models[arch] = function(opts)
         local o = models._opts_of(arch, opts)
         check_number(arch, o, "width_mult", 0)
         check_dropout(arch, o)
         local setting, last = get().v3_conf(arch, o)
         return get().MobileNetV3(setting, last, o)
      end
   end
   return models
end

return M
