-- lumen.models -- lm.models: the model constructors defined in the models/ folder
-- (models/resnet.lua, models/alexnet.lua, models/small_resnet.lua, models/video_resnet.lua,
-- models/mobilenet.lua, ...).
--
-- Installed by luarocks, the folder is lumen/models/ on package.path; in the source tree it is
-- <repo>/models, found relative to this file.
local M = {}

local files = { "resnet", "alexnet", "small_resnet", "video_resnet", "mobilenet", "efficientnet",
                "convnext", "regnet", "shufflenet" }

local function this_dir()
   local src = debug.getinfo(1, "S").source
   if src:sub(1, 1) ~= "@" then return nil end
   return src:sub(2):match("^(.*)[/\\]") or "."
end

local function load_model_file(name)
   local ok, mod = pcall(require, "lumen.models." .. name)
   if ok then return mod end
   local dir = this_dir()
   local path = dir and (dir .. "/../../models/" .. name .. ".lua")
   local f = path and io.open(path, "r")
   if not f then
      error("lumen.models: cannot find models/" .. name .. ".lua (" .. tostring(mod) .. ")", 2)
   end
   f:close()
   return dofile(path)
end

-- the options each constructor takes (models/*.lua read them); anything else is an error,
-- checked here around the constructors the files install
local util = require("lumen.util")
local RESNET_OPTS = util.option_set("num_classes", "groups", "width_per_group",
                                    "zero_init_residual")
-- torchvision's VideoResNet takes num_classes and zero_init_residual (which touches only
-- Bottleneck blocks: none in r3d_18, mc3_18, r2plus1d_18)
local VIDEO_OPTS = util.option_set("num_classes", "zero_init_residual")
local OPTIONS = {
   alexnet = util.option_set("num_classes", "dropout"),
   small_resnet = util.option_set("width", "blocks", "in_channels", "num_classes"),
   resnet18 = RESNET_OPTS, resnet34 = RESNET_OPTS, resnet50 = RESNET_OPTS,
   resnet101 = RESNET_OPTS, resnet152 = RESNET_OPTS, resnext50_32x4d = RESNET_OPTS,
   resnext101_32x8d = RESNET_OPTS, wide_resnet50_2 = RESNET_OPTS, wide_resnet101_2 = RESNET_OPTS,
   r3d_18 = VIDEO_OPTS, mc3_18 = VIDEO_OPTS, r2plus1d_18 = VIDEO_OPTS,
   mobilenet_v2 = util.option_set("num_classes", "width_mult", "round_nearest", "dropout",
                                  "inverted_residual_setting"),
   mobilenet_v3_large = util.option_set("num_classes", "width_mult", "dropout", "reduced_tail",
                                        "dilated"),
   mobilenet_v3_small = util.option_set("num_classes", "width_mult", "dropout", "reduced_tail",
                                        "dilated"),
}
for _, b in ipairs({ "b0", "b1", "b2", "b3" }) do
   OPTIONS["efficientnet_" .. b] = util.option_set("num_classes", "dropout",
                                                   "stochastic_depth_prob")
end
for _, v in ipairs({ "tiny", "small", "base" }) do
   OPTIONS["convnext_" .. v] = util.option_set("num_classes", "stochastic_depth_prob",
                                               "layer_scale")
end
for _, v in ipairs({ "y_400mf", "y_800mf", "y_1_6gf", "y_3_2gf", "y_8gf", "y_16gf", "y_32gf",
                     "y_128gf", "x_400mf", "x_800mf", "x_1_6gf", "x_3_2gf", "x_8gf", "x_16gf",
                     "x_32gf" }) do
   OPTIONS["regnet_" .. v] = util.option_set("num_classes")
end
for _, v in ipairs({ "x0_5", "x1_0", "x1_5", "x2_0" }) do
   OPTIONS["shufflenet_v2_" .. v] = util.option_set("num_classes")
end
M._OPTIONS = OPTIONS   -- the known keys per constructor (private: for tools and specs)

local function check_keys(name, opts, known)
   if type(opts) == "table" and getmetatable(opts) == nil then
      local k = util.unknown_option(opts, known)
      if k ~= nil then
         error("lumen.models." .. name .. ": " .. util.unknown_option_msg(k),
               require("lumen.tensor").user_level())
      end
   end
end

-- what the model files share (models/*.lua call these through the table install gets):
-- a builder's classes made once per lm, on first use, and a constructor's options copied with
-- the common checks (the unknown keys are checked around the constructors, below)
function M._class_cache(builder)
   local cache = setmetatable({}, { __mode = "k" })
   return function(lm)
      local c = cache[lm]
      if not c then
         c = builder(lm)
         cache[lm] = c
      end
      return c
   end
end

function M._opts_of(fname, opts)
   if opts ~= nil and type(opts) ~= "table" then
      error("lumen.models." .. fname .. ": opts must be a table, got " .. type(opts), 3)
   end
   local o = {}
   for k, v in pairs(opts or {}) do o[k] = v end
   local nc = o.num_classes
   if nc ~= nil and (type(nc) ~= "number" or nc < 1 or nc % 1 ~= 0) then
      error("lumen.models." .. fname .. ": num_classes must be a positive integer", 3)
   end
   local z = o.zero_init_residual
   if z ~= nil and type(z) ~= "boolean" then
      error("lumen.models." .. fname .. ": zero_init_residual must be a boolean", 3)
   end
   return o
end

-- torchvision's building blocks the model families share (models/mobilenet.lua,
-- efficientnet.lua, regnet.lua, ...): made once per lm
--   make_divisible(v, divisor, min_value)  torchvision's _make_divisible
--   conv_norm_act(cin, cout, k, {stride=, groups=, dilation=, act=, bn=, bias=})
--       torchvision's Conv2dNormActivation: a Sequential (0: Conv2d, 1: BatchNorm2d, 2: the
--       activation, a module or nil), padding (k - 1) / 2 * dilation; bn: the batch norm's
--       options ({eps =, momentum =}), or false for none (then the convolution has a bias)
--   SqueezeExcitation(cin, csq, act, scale_act)  torchvision.ops.SqueezeExcitation (avgpool,
--       fc1, fc2, activation, scale_activation); act / scale_act: module classes
function M._make_divisible(v, divisor, min_value)
   min_value = min_value or divisor
   local new_v = math.max(min_value, math.floor((v + divisor / 2) / divisor) * divisor)
   if new_v < 0.9 * v then new_v = new_v + divisor end
   return new_v
end

M._blocks = M._class_cache(function(lm)
   local nn = lm.nn
   local B = {}
   function B.conv_norm_act(cin, cout, k, o)
      o = o or {}
      local dil = o.dilation or 1
      local bn = o.bn
      local bias = o.bias
      if bias == nil then bias = bn == false end
      local conv = nn.Conv2d(cin, cout, k, { stride = o.stride or 1,
                                             padding = math.floor((k - 1) / 2) * dil,
                                             groups = o.groups or 1, dilation = dil,
                                             bias = bias })
      local list = { conv }
      if bn ~= false then list[#list + 1] = nn.BatchNorm2d(cout, bn) end
      if o.act then list[#list + 1] = o.act end
      return nn.Sequential(list)
   end
   local SE = nn.Module:extend("SqueezeExcitation")
   function SE:__init(cin, csq, act, scale_act)
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc1 = nn.Conv2d(cin, csq, 1)
      self.fc2 = nn.Conv2d(csq, cin, 1)
      self.activation = (act or nn.ReLU)()
      self.scale_activation = (scale_act or nn.Sigmoid)()
   end
   -- the N x C x 1 x 1 gate broadcast over the input keeps the input's memory format. In
   -- evaluation with gradients off each convolution runs its activation in its epilogue
   -- (lumen.nn.fold's conv_act: fc1 with the activation, fc2 with the scale activation)
   local fold = require("lumen.nn.fold")
   function SE:forward(x)
      local p = self.avgpool(x)
      local a1 = not self.training and fold.conv_act(self.fc1, self.activation)
      local s = a1 and self.fc1:forward(p, fold.fuse_act(a1)) or self.activation(self.fc1(p))
      local a2 = not self.training and fold.conv_act(self.fc2, self.scale_activation)
      s = a2 and self.fc2:forward(s, fold.fuse_act(a2)) or self.scale_activation(self.fc2(s))
      return s * x
   end
   B.SqueezeExcitation = SE
   return B
end)

-- called once by lumen's init (lm.models is this table): fills in the constructors
function M.install(lm)
   for _, name in ipairs(files) do
      load_model_file(name).install(lm, M)
   end
   for name, known in pairs(OPTIONS) do
      local ctor = M[name]
      if ctor ~= nil then
         M[name] = function(opts, ...)
            check_keys(name, opts, known)
            return ctor(opts, ...)
         end
      end
   end
   local resnet = M.ResNet
   if resnet ~= nil then
      M.ResNet = function(block, layers, opts, ...)
         check_keys("ResNet", opts, RESNET_OPTS)
         return resnet(block, layers, opts, ...)
      end
   end
   return M
end

return M
