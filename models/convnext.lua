-- models/convnext.lua -- ConvNeXt tiny, small and base, as torchvision builds them.
--
-- CNBlock: 7x7 depthwise convolution, Permute to N x H x W x C, LayerNorm over C, Linear 4C,
-- GELU, Linear C, Permute back, layer scale, stochastic depth, residual. LayerNorm2d (the stem,
-- the downsampling layers, the classifier) is permute + layer_norm over the last dim + permute
-- back. On a channels-last tensor both permutes are views of the same memory: the N x H x W x C
-- view is contiguous, so layer_norm and the Linears run on it without a copy, and the result
-- permuted back is channels-last again (torchvision's own code; in PyTorch the same holds).
-- torchvision's state_dict keys (features.1.0.block.0.weight, features.1.0.layer_scale,
-- features.2.0.weight (a LayerNorm2d), classifier.0.weight, ...).
--
--    local model = lm.models.convnext_tiny({num_classes = 10})
local M = {}

-- block setting {input, output (false: none), layers} per stage, stochastic_depth_prob default
local VARIANTS = {
   convnext_tiny = { { { 96, 192, 3 }, { 192, 384, 3 }, { 384, 768, 9 }, { 768, false, 3 } }, 0.1 },
   convnext_small = { { { 96, 192, 3 }, { 192, 384, 3 }, { 384, 768, 27 }, { 768, false, 3 } },
                      0.4 },
   convnext_base = { { { 128, 256, 3 }, { 256, 512, 3 }, { 512, 1024, 27 }, { 1024, false, 3 } },
                     0.5 },
}

local function builder(lm)
   local nn = lm.nn
   local init = nn.init
   local fold = require("lumen.nn.fold")

   local Permute = nn.Module:extend("Permute")
   function Permute:__init(dims) self.dims = dims end
   function Permute:forward(x) return x:permute(unpack(self.dims)) end
   function Permute:extra_repr() return table.concat(self.dims, ", ") end

   -- torchvision's LayerNorm2d: an nn.LayerNorm over C of an N x C x H x W tensor
   local LayerNorm2d = nn.LayerNorm:extend("LayerNorm2d")
   function LayerNorm2d:forward(x)
      local y = lm.F.layer_norm(x:permute(1, 3, 4, 2), self.normalized_shape, self.weight,
                                self.bias, { eps = self.eps })
      return y:permute(1, 4, 2, 3)
   end

   local CNBlock = nn.Module:extend("CNBlock")
   function CNBlock:__init(dim, layer_scale, sd_prob)
      self.block = nn.Sequential(
         nn.Conv2d(dim, dim, 7, { padding = 3, groups = dim, bias = true }),
         Permute({ 1, 3, 4, 2 }),
         nn.LayerNorm(dim, { eps = 1e-6 }),
         nn.Linear(dim, 4 * dim),
         nn.GELU(),
         nn.Linear(4 * dim, dim),
         Permute({ 1, 4, 2, 3 }))
      self:register_parameter("layer_scale", lm.ones({ dim, 1, 1 }) * layer_scale)
      self.stochastic_depth = lm.ops.StochasticDepth(sd_prob, "row")
   end
   function CNBlock:forward(x)
      -- x + stochastic_depth(layer_scale * block(x)), in one pass where it can (fold.scale_add)
      return fold.scale_add(self.stochastic_depth, self.layer_scale, self.block(x), x)
   end

   local ConvNeXt = nn.Module:extend("ConvNeXt")
   function ConvNeXt:__init(setting, opts)
      local sdp = opts.stochastic_depth_prob
      local ls = opts.layer_scale or 1e-6
      local function norm(c) return LayerNorm2d(c, { eps = 1e-6 }) end
      local layers = { nn.Sequential(nn.Conv2d(3, setting[1][1], 4, { stride = 4, bias = true }),
                                     norm(setting[1][1])) }
      local total = 0
      for _, c in ipairs(setting) do total = total + c[3] end
      local id = 0
      for _, c in ipairs(setting) do
         local stage = {}
         for _ = 1, c[3] do
            stage[#stage + 1] = CNBlock(c[1], ls, sdp * id / (total - 1.0))
            id = id + 1
         end
         layers[#layers + 1] = nn.Sequential(stage)
         if c[2] then
            layers[#layers + 1] = nn.Sequential(norm(c[1]),
                                                nn.Conv2d(c[1], c[2], 2, { stride = 2 }))
         end
      end
      self.features = nn.Sequential(layers)
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      local last = setting[#setting]
      local lout = last[2] or last[1]
      self.classifier = nn.Sequential(norm(lout), nn.Flatten(2),
                                      nn.Linear(lout, opts.num_classes or 1000))
      for _, m in ipairs(self:modules()) do
         local ty = m:type_name()
         if ty == "Conv2d" or ty == "Linear" then
            init.normal_(m.weight, 0, 0.02)   -- trunc_normal_(std=0.02) truncates at +-2: no-op
            if m.bias ~= nil then init.zeros_(m.bias) end
         end
      end
   end
   function ConvNeXt:forward(x)
      return self.classifier(self.avgpool(self.features(x)))
   end
   return { ConvNeXt = ConvNeXt, CNBlock = CNBlock, LayerNorm2d = LayerNorm2d }
end

function M.install(lm, models)
   local classes
   for name, v in pairs(VARIANTS) do
      models[name] = function(opts)
         local o = models._opts_of(name, opts)
         local p = o.stochastic_depth_prob
         if p ~= nil and (type(p) ~= "number" or not (p >= 0 and p <= 1)) then
            error(("lumen.models.%s: stochastic_depth_prob must be a number in [0, 1], got %s")
                  :format(name, tostring(p)), 3)
         end
         if p == nil then o.stochastic_depth_prob = v[2] end
         local ls = o.layer_scale
         if ls ~= nil and type(ls) ~= "number" then
            error(("lumen.models.%s: layer_scale must be a number, got %s"):format(name,
                  tostring(ls)), 3)
         end
         classes = classes or builder(lm)
         return classes.ConvNeXt(v[1], o)
      end
   end
   return models
end

return M
