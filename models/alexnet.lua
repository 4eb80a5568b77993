-- models/alexnet.lua -- AlexNet as torchvision builds it (features / avgpool / classifier), with
-- torchvision's state_dict keys (features.0.weight, classifier.1.weight, ...).
local M = {}

function M.install(lm, models)
   local nn = lm.nn
   local AlexNet
   local function class()
      if AlexNet then return AlexNet end
      AlexNet = nn.Module:extend("AlexNet")
      function AlexNet:__init(opts)
         opts = opts or {}
         local num_classes = opts.num_classes or 1000
         local dropout = opts.dropout or 0.5
         self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, { stride = 4, padding = 2 }), nn.ReLU(true),
            nn.MaxPool2d({ kernel_size = 3, stride = 2 }),
            nn.Conv2d(64, 192, 5, { padding = 2 }), nn.ReLU(true),
            nn.MaxPool2d({ kernel_size = 3, stride = 2 }),
            nn.Conv2d(192, 384, 3, { padding = 1 }), nn.ReLU(true),
            nn.Conv2d(384, 256, 3, { padding = 1 }), nn.ReLU(true),
            nn.Conv2d(256, 256, 3, { padding = 1 }), nn.ReLU(true),
            nn.MaxPool2d({ kernel_size = 3, stride = 2 }))
         self.avgpool = nn.AdaptiveAvgPool2d({ 6, 6 })
         self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(true),
            nn.Dropout(dropout), nn.Linear(4096, 4096), nn.ReLU(true),
            nn.Linear(4096, num_classes))
      end
      function AlexNet:forward(x)
         x = self.avgpool(self.features(x))
         x = lm.F.flatten(x, 2)
         return self.classifier(x)
      end
      return AlexNet
   end
   models.alexnet = function(opts)
      if opts ~= nil and type(opts) ~= "table" then
         error("lumen.models.alexnet: opts must be a table, got " .. type(opts), 2)
      end
      return class()(opts)
   end
   return models
end

return M
