-- lumen.models -- lm.models: the model constructors defined in the models/ folder
-- (models/resnet.lua, models/alexnet.lua, models/small_resnet.lua).
--
-- Installed by luarocks, the folder is lumen/models/ on package.path; in the source tree it is
-- <repo>/models, found relative to this file.
local M = {}

local files = { "resnet", "alexnet", "small_resnet" }

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

-- called once by lumen's init (lm.models is this table): fills in the constructors
function M.install(lm)
   for _, name in ipairs(files) do
      load_model_file(name).install(lm, M)
   end
   return M
end

return M
