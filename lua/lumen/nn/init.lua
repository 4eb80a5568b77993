-- lumen.nn -- lm.nn: the Module base class, the standard layers, lm.nn.functional (lm.F) and
-- lm.nn.init (weight initialisers).
--
--    local nn = lm.nn
--    local net = nn.Sequential(nn.Conv2d(3, 16, 3, {padding = 1}), nn.BatchNorm2d(16),
--                              nn.ReLU(true), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
--                              nn.Linear(16, 10))
--    net:to(lm.channels_last)
--    local loss = lm.F.cross_entropy(net(x), y)     -- y: 1-based int64 class indices

local Module = require("lumen.nn.module")
local layers = require("lumen.nn.layers")

local nn = {}

nn.Module = Module
nn.is_module = Module.is_module
nn.Parameter = Module.Parameter
nn.functional = require("lumen.functional")
nn.init = require("lumen.nn.weight_init")

for k, v in pairs(layers) do
   if k:sub(1, 1) ~= "_" then nn[k] = v end
end

return nn
