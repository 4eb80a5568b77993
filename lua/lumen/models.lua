-- lumen.models -- lm.models: the model constructors defined in the models/ folder
-- (models/resnet.lua, models/alexnet.lua, models/small_resnet.lua, models/video_resnet.lua).
--
-- Installed by luarocks, the folder is lumen/models/ on package.path; in the source tree it is
-- <repo>/models, found relative to this file.
local M = {}

local files = { "resnet", "alexnet", "small_resnet", "video_resnet" }

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
}
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
