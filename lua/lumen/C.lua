-- lumen.C -- the FFI binding: declares the C API (lumen.cdef, generated from src/lumen.h by make)
-- and loads liblumen.so. Returns the library namespace; keep a reference to it (package.loaded
-- does) so the library is never unloaded while tensors point into it.

local ffi = require("ffi")

-- busted reloads modules between files: declaring struct lm_tensor twice would fail, so only
-- declare once per LuaJIT state (same guard as lua-resty-core).
if not pcall(ffi.typeof, "struct lm_tensor") then
   ffi.cdef(require("lumen.cdef"))
end

local function file_exists(path)
   local f = io.open(path, "rb")
   if f then f:close() return true end
   return false
end

local function this_dir()
   local src = debug.getinfo(1, "S").source
   if src:sub(1, 1) ~= "@" then return nil end
   local path = src:sub(2)
   return path:match("^(.*)[/\\]") or "."
end

local function candidates()
   local list = {}
   local env = os.getenv("LUMEN_LIB")
   if env and env ~= "" then
      list[1] = env
      return list
   end
   -- the in-tree build first (running from the source tree), then package.cpath
   local dir = this_dir()
   if dir then
      list[#list + 1] = dir .. "/../../build/liblumen.so"
   end
   for template in package.cpath:gmatch("[^;]+") do
      if template:find("?", 1, true) then
         list[#list + 1] = template:gsub("%?", "liblumen")
         list[#list + 1] = template:gsub("%?", "lumen/liblumen")
      end
   end
   return list
end

-- Pin the library for the life of the process. The FFI unloads a library when its namespace is
-- collected (busted drops and reloads modules between spec files) and again at lua_close; the
-- OpenMP runtime it pulls in would then be unmapped under its idle worker threads, which crash
-- the process at exit. One extra dlopen with RTLD_NODELETE keeps liblumen (and so libgomp)
-- mapped until exit.
local RTLD_NOW, RTLD_NODELETE = 0x2, 0x1000
pcall(ffi.cdef, "void *dlopen(const char *filename, int flags);")
local function pin(path)
   pcall(function() return ffi.C.dlopen(path, RTLD_NOW + RTLD_NODELETE) end)
end

local function load()
   local tried = {}
   for _, path in ipairs(candidates()) do
      if file_exists(path) then
         local ok, lib = pcall(ffi.load, path)
         if ok then
            pin(path)
            return lib
         end
         tried[#tried + 1] = path .. " (" .. tostring(lib) .. ")"
      else
         tried[#tried + 1] = path .. " (not found)"
      end
   end
   error("lumen: cannot load liblumen.so (build it with `make`, or set LUMEN_LIB); tried:\n  "
         .. table.concat(tried, "\n  "), 2)
end

local lib = load()

return lib
