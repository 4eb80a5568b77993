-- lumen.nn.containers -- PyTorch's module containers besides Sequential: ModuleList and
-- ModuleDict. Their children are registered as Sequential's are, so parameters(), to(),
-- state_dict() (keys "layers.0.weight", "heads.cls.bias" as PyTorch's) and the layout tools see
-- them; they have no forward of their own.

local T = require("lumen.tensor")
local Module = require("lumen.nn.module")

local type, tostring, getmetatable, ipairs, pairs, select = type, tostring, getmetatable,
   ipairs, pairs, select

local M = {}

local function fail(fname, msg) T.argerror(fname, msg) end
local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end

---------------------------------------------------------------------------------------------
-- ModuleList
---------------------------------------------------------------------------------------------

local ModuleList = Module:extend("ModuleList")
M.ModuleList = ModuleList

-- list[i] (1-based, negative from the end) is the i-th module; other keys the usual fields
ModuleList.__index = function(self, k)
   if type(k) == "number" then
      local n = #rawget(self, "_children")
      if k < 0 then k = n + k + 1 end
      return rawget(self, tostring(k - 1))
   end
   return ModuleList[k]
end

-- list[i] = m replaces the i-th module (1 <= i <= #list); names stay "0", "1", ...
ModuleList.__newindex = function(self, k, v)
   if type(k) == "number" then
      local n = #rawget(self, "_children")
      if k < 0 then k = n + k + 1 end
      if k % 1 ~= 0 or k < 1 or k > n then
         fail("ModuleList", ("index %s out of range for a list of %d modules"):format(
              tostring(k), n))
      end
      if not Module.is_module(v) then
         fail("ModuleList", "only Modules can be stored, got " .. T.typename(v))
      end
      rawset(self, tostring(k - 1), v)
      return
   end
   Module.__newindex(self, k, v)
end

local function check_module(fname, m, i)
   if not Module.is_module(m) then
      fail(fname, ("element %d is not a Module (got %s)"):format(i, T.typename(m)))
   end
end

-- ModuleList({m1, m2, ...}) or ModuleList() (PyTorch's takes one iterable)
function ModuleList:__init(list, ...)
   if select("#", ...) > 0 then fail("ModuleList", "expected one list of modules") end
   if list == nil then return end
   if not plain_table(list) then
      fail("ModuleList", "expected a list of modules, got " .. T.typename(list))
   end
   for i, m in ipairs(list) do
      check_module("ModuleList", m, i)
      self:add_module(tostring(i - 1), m)
   end
end

-- append(m) -> self
function ModuleList:append(m)
   check_module("ModuleList.append", m, #rawget(self, "_children") + 1)
   self:add_module(tostring(#rawget(self, "_children")), m)
   return self
end

-- extend({m, ...}) -> self
function ModuleList:extend(list)
   if not plain_table(list) then
      fail("ModuleList.extend", "expected a list of modules, got " .. T.typename(list))
   end
   for i, m in ipairs(list) do check_module("ModuleList.extend", m, i) end
   for _, m in ipairs(list) do self:append(m) end
   return self
end

-- insert(i, m): m becomes the i-th module (1-based), the later ones move up one
function ModuleList:insert(i, m)
   local mods = self:children()
   local n = #mods
   if type(i) ~= "number" or i % 1 ~= 0 then
      fail("ModuleList.insert", "index must be an integer, got " .. tostring(i))
   end
   if i < 0 then i = n + i + 1 end
   if i < 1 then i = 1 elseif i > n + 1 then i = n + 1 end
   check_module("ModuleList.insert", m, i)
   table.insert(mods, i, m)
   for k = 1, #mods do self:add_module(tostring(k - 1), mods[k]) end
   return self
end

-- the number of modules (#list does not call __len on LuaJIT tables: use list:len())
function ModuleList:len() return #rawget(self, "_children") end
ModuleList.size = ModuleList.len

-- for i, m in list:ipairs() do ... end
function ModuleList:ipairs() return ipairs(self:children()) end

function ModuleList:forward()
   fail("ModuleList", "a ModuleList has no forward: call its modules (for _, m in " ..
        "list:ipairs() do x = m(x) end)")
end

---------------------------------------------------------------------------------------------
-- ModuleDict
---------------------------------------------------------------------------------------------

local ModuleDict = Module:extend("ModuleDict")
M.ModuleDict = ModuleDict

-- ModuleDict({name = m, ...}) (registered in sorted key order: a Lua table has no order) or
-- ModuleDict({{"name", m}, ...}) (in the given order)
function ModuleDict:__init(modules)
   if modules == nil then return end
   if not plain_table(modules) then
      fail("ModuleDict", "expected a table of modules, got " .. T.typename(modules))
   end
   self:update(modules)
end

function ModuleDict:update(modules)
   if not plain_table(modules) then
      fail("ModuleDict.update", "expected a table of modules, got " .. T.typename(modules))
   end
   if modules[1] ~= nil then
      for i, kv in ipairs(modules) do
         if not plain_table(kv) or type(kv[1]) ~= "string" then
            fail("ModuleDict", ("entry %d must be a {name, module} pair"):format(i))
         end
         check_module("ModuleDict", kv[2], i)
         self:add_module(kv[1], kv[2])
      end
      return self
   end
   local keys = {}
   for k in pairs(modules) do
      if type(k) ~= "string" then
         fail("ModuleDict", "keys must be strings, got " .. T.typename(k))
      end
      keys[#keys + 1] = k
   end
   table.sort(keys)
   for i, k in ipairs(keys) do
      check_module("ModuleDict", modules[k], i)
      self:add_module(k, modules[k])
   end
   return self
end

-- dict:get(name) -> module or nil; dict.name works too
function ModuleDict:get(name) return rawget(self, name) end
function ModuleDict:keys()
   local r = {}
   for _, nm in ipairs(self:named_children()) do r[#r + 1] = nm[1] end
   return r
end
function ModuleDict:values() return self:children() end
-- items() -> array of {name, module}
function ModuleDict:items() return self:named_children() end
function ModuleDict:len() return #self:named_children() end
function ModuleDict:contains(name) return Module.is_module(rawget(self, name)) end

-- pop(name) -> the module, removed
function ModuleDict:pop(name)
   local m = rawget(self, name)
   if not Module.is_module(m) then
      fail("ModuleDict.pop", "no module named '" .. tostring(name) .. "'")
   end
   local reg = rawget(self, "_children")
   for i, k in ipairs(reg) do
      if k == name then table.remove(reg, i) break end
   end
   reg.set[name] = nil
   rawset(self, name, nil)
   return m
end

function ModuleDict:forward()
   fail("ModuleDict", "a ModuleDict has no forward: call its modules (dict.name(x))")
end

return M
