-- lumen.impl -- which kernel ran, and choosing by name: the CPU implementation lists
-- (src/impl.h: every family with several kernels tries an ordered list of named
-- implementations), switched off and on by name, and the LUMEN_VERBOSE lines.
--   lm.backends.cpu.implementations()  -> { {name=, fallback=, alias=, doc=}, ... } in list order
--   lm.backends.cpu.disable(name, ...)  switch implementations off (the next entry runs; the
--                                       values keep PyTorch's semantics, the speed changes)
--   lm.backends.cpu.enable(name, ...)   switch them on again
--   lm.backends.cpu.disabled()          -> the names switched off now (sorted)
--   lm.backends.verbose(level)          0, 1 (a line per kernel call on stderr) or 2 (also why
--                                       earlier entries were skipped); returns the level before;
--                                       no argument: the level now. LUMEN_VERBOSE sets it at start.
-- docs/performance.md ("Which kernel ran") lists the names and shows how to read the lines.
local ffi = require("ffi")
local C = require("lumen.C")

local M = {}

local function last_error()
   local msg = ffi.string(C.lm_last_error())
   C.lm_clear_error()
   return msg
end

function M.implementations()
   local out = {}
   local fb = ffi.new("int[1]")
   local alias, doc = ffi.new("const char *[1]"), ffi.new("const char *[1]")
   for i = 0, C.lm_cpu_impl_count() - 1 do
      local name = C.lm_cpu_impl_info(i, fb, alias, doc)
      out[#out + 1] = {
         name = ffi.string(name),
         fallback = fb[0] ~= 0,
         alias = alias[0] ~= nil and ffi.string(alias[0]) or nil,
         doc = ffi.string(doc[0]),
      }
   end
   return out
end

local function switch(fname, off, ...)
   local n = select("#", ...)
   if n == 0 then error("lumen.backends.cpu." .. fname .. ": expected one or more names", 3) end
   for i = 1, n do
      local name = select(i, ...)
      if type(name) ~= "string" then
         error("lumen.backends.cpu." .. fname .. ": expected implementation names (strings), got "
               .. type(name) .. " as argument " .. i, 3)
      end
      if C.lm_cpu_disable(name, off) ~= 0 then
         error("lumen.backends.cpu." .. fname .. ": " .. last_error(), 3)
      end
   end
end

function M.disable(...) switch("disable", 1, ...) end
function M.enable(...) switch("enable", 0, ...) end

function M.disabled()
   local out = {}
   for _, im in ipairs(M.implementations()) do
      if C.lm_cpu_impl_disabled(im.name) == 1 then out[#out + 1] = im.name end
   end
   table.sort(out)
   return out
end

function M.verbose(level)
   if level == nil then return C.lm_get_verbose() end
   if type(level) ~= "number" or level % 1 ~= 0 or level < 0 or level > 2 then
      error("lumen.backends.verbose: expected 0, 1 or 2, got " .. tostring(level), 2)
   end
   return C.lm_set_verbose(level)
end

function M.install(lm)
   local cpu = lm.backends.cpu
   rawset(cpu, "implementations", M.implementations)
   rawset(cpu, "disable", M.disable)
   rawset(cpu, "enable", M.enable)
   rawset(cpu, "disabled", M.disabled)
   rawset(lm.backends, "verbose", M.verbose)
end

return M
