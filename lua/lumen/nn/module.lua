-- lumen.nn.module -- the Module base class: parameters, buffers and children registered under
-- PyTorch's key names, train / eval, to(), zero_grad, state_dict / load_state_dict, printing.
--
-- Classes are made with Module:extend(name); an instance is made by calling the class, which
-- runs the class's __init(self, ...). Assigning a Module to a new field of a module registers it
-- as a child (self.conv1 = nn.Conv2d(...)), as in PyTorch; parameters and buffers are
-- registered explicitly (register_parameter / register_buffer) and then read and written as
-- plain fields (m.weight). `m(x)` calls m:forward(x).
--
--    local Net = lm.nn.Module:extend("Net")
--    function Net:__init(n)
--       self.fc = lm.nn.Linear(n, 2)
--    end
--    function Net:forward(x) return self.fc(x):relu() end

local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local util = require("lumen.util")

local type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, error =
   type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, error

local Tensor, is_tensor = T.Tensor, T.is_tensor

local Module = {}

local function argerror(fname, msg)
   error("lumen." .. fname .. ": " .. msg, T.user_level and T.user_level() or 3)
end

local function is_module(x)
   if type(x) ~= "table" then return false end
   local mt = getmetatable(x)
   return type(mt) == "table" and rawget(mt, "__is_module_class") == true
end
Module.is_module = is_module

---------------------------------------------------------------------------------------------
-- classes
---------------------------------------------------------------------------------------------

local function instance_newindex(self, k, v)
   -- a new field holding a module registers it as a child; one holding a tensor marked by
   -- nn.Parameter registers it as a parameter
   if type(k) == "string" then
      local regname
      if is_module(v) then regname = "_children"
      elseif is_tensor(v) and rawget(v, "_is_param") then regname = "_params" end
      local reg = regname and rawget(self, regname)
      if reg and not reg.set[k] then
         reg.set[k] = true
         reg[#reg + 1] = k
      end
   end
   rawset(self, k, v)
end

-- Parameter(t, requires_grad = true): marks t so that assigning it to a new module field
-- registers it (self.weight = nn.Parameter(lm.randn(...))), as PyTorch's nn.Parameter. Returns t.
function Module.Parameter(t, requires_grad)
   if not is_tensor(t) then
      argerror("Parameter", "tensor expected, got " .. T.typename(t))
   end
   rawset(t, "_is_param", true)
   if requires_grad ~= false then Tensor.requires_grad_(t, true) end
   return t
end

local function construct(cls, ...)
   local self = setmetatable({}, cls)
   rawset(self, "_params", { set = {} })
   rawset(self, "_buffers", { set = {}, nonpersistent = {} })
   rawset(self, "_children", { set = {} })
   rawset(self, "training", true)
   local init = cls.__init
   if init then init(self, ...) end
   return self
end

local function class_tostring(cls) return "lumen.nn." .. tostring(rawget(cls, "__name")) end

-- Module:extend(name) -> a new class inheriting from self
function Module.extend(parent, name)
   if type(name) ~= "string" then argerror("Module.extend", "class name (string) expected") end
   local cls = {}
   -- metamethods are looked up raw on the metatable: copy them down the hierarchy
   for k, v in pairs(parent) do
      if type(k) == "string" and k:sub(1, 2) == "__" and k ~= "__init" and k ~= "__name" then
         cls[k] = v
      end
   end
   cls.__index = cls
   cls.__name = name
   cls.__is_module_class = true
   cls.__parent = parent
   return setmetatable(cls, { __index = parent, __call = construct, __tostring = class_tostring })
end

Module.__index = Module
Module.__name = "Module"
Module.__is_module_class = true
Module.__newindex = instance_newindex
Module.__call = function(self, ...) return self:forward(...) end
Module.__tostring = function(self) return self:repr() end
setmetatable(Module, { __call = construct, __tostring = class_tostring })

function Module:__init() end

function Module:forward()
   argerror(self.__name .. ".forward", "forward is not implemented for " .. self.__name)
end

function Module:type_name() return rawget(getmetatable(self), "__name") end

---------------------------------------------------------------------------------------------
-- registration
---------------------------------------------------------------------------------------------

local function check_name(fname, name)
   if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
      argerror(fname, "name must be a non-empty string without '.', got " .. tostring(name))
   end
end

-- register_parameter(name, t): t (or nil) becomes a leaf that requires grad
function Module:register_parameter(name, t)
   check_name("register_parameter", name)
   if t ~= nil and not is_tensor(t) then
      argerror("register_parameter", "parameter '" .. name .. "' must be a tensor or nil, got " ..
               type(t))
   end
   local reg = rawget(self, "_params")
   if not reg.set[name] then
      reg.set[name] = true
      reg[#reg + 1] = name
   end
   if t ~= nil and rawget(t, "requires_grad") ~= true then Tensor.requires_grad_(t, true) end
   rawset(self, name, t)
   return t
end

-- register_buffer(name, t, persistent = true): saved in state_dict unless persistent is false
function Module:register_buffer(name, t, persistent)
   check_name("register_buffer", name)
   if t ~= nil and not is_tensor(t) then
      argerror("register_buffer", "buffer '" .. name .. "' must be a tensor or nil, got " ..
               type(t))
   end
   local reg = rawget(self, "_buffers")
   if not reg.set[name] then
      reg.set[name] = true
      reg[#reg + 1] = name
   end
   reg.nonpersistent[name] = (persistent == false) or nil
   rawset(self, name, t)
   return t
end

function Module:add_module(name, m)
   if type(name) == "number" then name = tostring(name) end
   if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
      argerror("add_module", "name must be a non-empty string without '.', got " .. tostring(name))
   end
   if m ~= nil and not is_module(m) then
      argerror("add_module", "'" .. name .. "' is not a Module")
   end
   local reg = rawget(self, "_children")
   if not reg.set[name] then
      reg.set[name] = true
      reg[#reg + 1] = name
   end
   rawset(self, name, m)
   return m
end
Module.register_module = Module.add_module

---------------------------------------------------------------------------------------------
-- traversal
---------------------------------------------------------------------------------------------

-- named_children() -> array of {name, module}
function Module:named_children()
   local r = {}
   for _, name in ipairs(rawget(self, "_children")) do
      local m = rawget(self, name)
      if m ~= nil then r[#r + 1] = { name, m } end
   end
   return r
end

function Module:children()
   local r = {}
   for _, nm in ipairs(self:named_children()) do r[#r + 1] = nm[2] end
   return r
end

-- named_modules() -> array of {path, module}, self first ("" for self), depth first
function Module:named_modules(prefix, out, seen)
   out = out or {}
   seen = seen or {}
   if seen[self] then return out end
   seen[self] = true
   out[#out + 1] = { prefix or "", self }
   for _, nm in ipairs(self:named_children()) do
      local p = (prefix and prefix ~= "") and (prefix .. "." .. nm[1]) or nm[1]
      nm[2]:named_modules(p, out, seen)
   end
   return out
end

function Module:modules()
   local r = {}
   for _, nm in ipairs(self:named_modules()) do r[#r + 1] = nm[2] end
   return r
end

local function collect(self, regname, filter)
   local out, seen = {}, {}
   for _, pm in ipairs(self:named_modules()) do
      local path, m = pm[1], pm[2]
      local reg = rawget(m, regname)
      for _, name in ipairs(reg) do
         local t = rawget(m, name)
         if t ~= nil and not seen[t] and (not filter or filter(reg, name)) then
            seen[t] = true
            out[#out + 1] = { path == "" and name or (path .. "." .. name), t }
         end
      end
   end
   return out
end

-- named_parameters() -> array of {name, tensor} in registration order (shared ones once)
function Module:named_parameters() return collect(self, "_params") end

function Module:parameters()
   local r = {}
   for _, nt in ipairs(self:named_parameters()) do r[#r + 1] = nt[2] end
   return r
end

function Module:named_buffers() return collect(self, "_buffers") end

function Module:buffers()
   local r = {}
   for _, nt in ipairs(self:named_buffers()) do r[#r + 1] = nt[2] end
   return r
end

-- apply(fn): fn(m) on every submodule (children first) and self; returns self
function Module:apply(fn)
   for _, m in ipairs(self:children()) do m:apply(fn) end
   fn(self)
   return self
end

---------------------------------------------------------------------------------------------
-- modes, gradients, conversion
---------------------------------------------------------------------------------------------

function Module:train(flag)
   if flag == nil then flag = true end
   if type(flag) ~= "boolean" then argerror("train", "mode must be a boolean") end
   for _, m in ipairs(self:modules()) do rawset(m, "training", flag) end
   return self
end

function Module:eval() return self:train(false) end

-- zero_grad(set_to_none = false): zero the gradients in place (or drop them)
function Module:zero_grad(set_to_none)
   for _, p in ipairs(self:parameters()) do
      local g = rawget(p, "grad")
      if g ~= nil then
         if set_to_none then rawset(p, "grad", nil)
         else T.raw.zero_(g) end
      end
   end
   return self
end

function Module:requires_grad_(flag)
   if flag == nil then flag = true end
   for _, p in ipairs(self:parameters()) do Tensor.requires_grad_(p, flag) end
   return self
end

-- Replace the data of tensor t by that of u, keeping t's identity (optimizers and user code
-- keep references to parameters), like PyTorch's `param.data = ...`.
local function set_data(t, u)
   if u ~= t then T.drop_pending(t); rawset(t, "_c", T.cdata(u)) end
end
Module._set_data = set_data

-- to(x, ...): x is a dtype (floating parameters and buffers only: float32, float64, float16,
-- bfloat16; integer buffers such as num_batches_tracked keep theirs), a memory format (4-D tensors
-- for channels_last, 5-D for channels_last_3d; a tensor of the other rank raises the rank
-- error), a device string or an opts table {dtype=, memory_format=, device=}. In place, as
-- PyTorch's Module.to: the same parameter objects with their data replaced (a device copy keeps
-- each tensor's memory format), gradients moved along.
local TO_OPTS = util.option_set("dtype", "memory_format", "device")
function Module:to(...)
   local n = select("#", ...)
   if n == 0 then argerror("Module.to", "expected a dtype, memory format, device or options") end
   local dtype, fmt, device
   for i = 1, n do
      local x = select(i, ...)
      if dtypes.is_dtype(x) then dtype = x
      elseif dtypes.is_memory_format(x) then fmt = x
      elseif type(x) == "string" then
         if dtypes.is_name(x) then dtype = dtypes.lookup(x)
         elseif dtypes.is_format_name(x) then fmt = dtypes.lookup_format(x)
         else device = x end
      elseif type(x) == "table" and getmetatable(x) == nil then
         local k = util.unknown_option(x, TO_OPTS)
         if k ~= nil then argerror("Module.to", util.unknown_option_msg(k)) end
         if x.dtype ~= nil then dtype = x.dtype end
         if x.memory_format ~= nil then fmt = x.memory_format end
         if x.device ~= nil then device = x.device end
      else
         argerror("Module.to", "expected a dtype, memory format, device or options, got " ..
                  (is_tensor(x) and "tensor" or type(x)))
      end
   end
   if device ~= nil then T.parse_device("Module.to", device) end
   if dtype ~= nil and not dtype.is_floating then
      argerror("Module.to", "nn.Module.to only accepts floating point dtypes, got " ..
               tostring(dtype))
   end
   local fmt_rank
   if fmt ~= nil then
      if fmt == dtypes.channels_last then fmt_rank = 4
      elseif fmt == dtypes.channels_last_3d then fmt_rank = 5 end
   end
   local function convert(t)
      local args = {}
      if device ~= nil then args.device = device end
      if dtype ~= nil and Tensor.is_floating_point(t) then args.dtype = dtype end
      if fmt ~= nil then
         local d = Tensor.dim(t)
         if fmt_rank == nil then
            if d == 4 or d == 5 then args.memory_format = fmt end
         elseif d == 4 or d == 5 then
            args.memory_format = fmt      -- the other rank raises the rank error, as PyTorch
         end
      end
      if next(args) == nil then return t end
      local ok, u = pcall(T.raw.to, t, args)
      if not ok then error(u, 0) end
      return u
   end
   return self:_convert_tensors(convert)
end

-- m:_convert_tensors(convert): every parameter and buffer of m and its submodules, and their
-- gradients, replaced in place by convert(t) (the same objects, their data swapped: optimizers
-- keep their references), without recording autograd history. Module:to and
-- lm.to_channels_last are built on it.
function Module:_convert_tensors(convert)
   A.no_grad(function()
      for _, pm in ipairs(self:named_modules()) do
         local m = pm[2]
         for _, regname in ipairs({ "_params", "_buffers" }) do
            for _, name in ipairs(rawget(m, regname)) do
               local t = rawget(m, name)
               if t ~= nil then
                  set_data(t, convert(t))
                  local g = rawget(t, "grad")
                  if g ~= nil then set_data(g, convert(g)) end
               end
            end
         end
      end
   end)
   return self
end

function Module:float() return self:to(dtypes.float32) end
function Module:cpu() return self:to("cpu") end
function Module:double() return self:to(dtypes.float64) end
function Module:half() return self:to(dtypes.float16) end
function Module:bfloat16() return self:to(dtypes.bfloat16) end

---------------------------------------------------------------------------------------------
-- state
---------------------------------------------------------------------------------------------

local function sizes_str(t)
   return "(" .. table.concat(Tensor.size(t), ", ") .. ")"
end

-- state_entries() -> array of {key, tensor}: parameters and persistent buffers of every module,
-- module by module (own parameters, own buffers, then children), as PyTorch orders state_dict
function Module:state_entries()
   local out = {}
   for _, pm in ipairs(self:named_modules()) do
      local path, m = pm[1], pm[2]
      local pre = path == "" and "" or (path .. ".")
      for _, name in ipairs(rawget(m, "_params")) do
         local t = rawget(m, name)
         if t ~= nil then out[#out + 1] = { pre .. name, t } end
      end
      local breg = rawget(m, "_buffers")
      for _, name in ipairs(breg) do
         local t = rawget(m, name)
         if t ~= nil and not breg.nonpersistent[name] then out[#out + 1] = { pre .. name, t } end
      end
   end
   return out
end

-- state_dict() -> table key -> tensor (detached; it shares the module's storage)
function Module:state_dict()
   local sd = {}
   for _, kt in ipairs(self:state_entries()) do sd[kt[1]] = Tensor.detach(kt[2]) end
   return sd
end

-- state_keys() -> the state_dict keys in PyTorch's order
function Module:state_keys()
   local r = {}
   for _, kt in ipairs(self:state_entries()) do r[#r + 1] = kt[1] end
   return r
end

-- load_state_dict(sd, {strict = true}): copies values into the existing tensors (they keep
-- their memory format and dtype). Returns {missing_keys = {...}, unexpected_keys = {...}}.
local LOAD_OPTS = util.option_set("strict")
function Module:load_state_dict(sd, opts)
   local fname = "load_state_dict"
   if type(sd) ~= "table" then argerror(fname, "state_dict must be a table of tensors") end
   if opts ~= nil and type(opts) ~= "table" then argerror(fname, "options must be a table") end
   if opts ~= nil then
      local k = util.unknown_option(opts, LOAD_OPTS)
      if k ~= nil then argerror(fname, util.unknown_option_msg(k)) end
   end
   local strict = true
   if opts and opts.strict ~= nil then strict = opts.strict and true or false end
   local entries = self:state_entries()
   local own, missing, unexpected, mismatch = {}, {}, {}, {}
   for _, kt in ipairs(entries) do
      local k, t = kt[1], kt[2]
      own[k] = true
      local v = sd[k]
      if v == nil then
         missing[#missing + 1] = k
      elseif not is_tensor(v) then
         mismatch[#mismatch + 1] = ("value for %s is not a tensor (got %s)"):format(k, type(v))
      else
         local a, b = Tensor.size(v), Tensor.size(t)
         local same = #a == #b
         if same then for i = 1, #a do if a[i] ~= b[i] then same = false end end end
         if not same then
            mismatch[#mismatch + 1] = ("size mismatch for %s: copying a param with shape %s " ..
               "from checkpoint, the shape in current model is %s"):format(k, sizes_str(v),
               sizes_str(t))
         end
      end
   end
   local keys = {}
   for k in pairs(sd) do keys[#keys + 1] = tostring(k) end
   table.sort(keys)
   for _, k in ipairs(keys) do
      if not own[k] then unexpected[#unexpected + 1] = k end
   end
   local problems = {}
   if #mismatch > 0 then problems[#problems + 1] = table.concat(mismatch, "; ") end
   if strict and #missing > 0 then
      problems[#problems + 1] = "missing key(s) in state_dict: " .. table.concat(missing, ", ")
   end
   if strict and #unexpected > 0 then
      problems[#problems + 1] = "unexpected key(s) in state_dict: " ..
         table.concat(unexpected, ", ")
   end
   if #problems > 0 then
      argerror(fname, "error(s) in loading state_dict for " .. self:type_name() .. ": " ..
               table.concat(problems, "; "))
   end
   A.no_grad(function()
      for _, kt in ipairs(entries) do
         local v = sd[kt[1]]
         if v ~= nil then T.raw.copy_(kt[2], v) end
      end
   end)
   return { missing_keys = missing, unexpected_keys = unexpected }
end

---------------------------------------------------------------------------------------------
-- printing
---------------------------------------------------------------------------------------------

function Module:extra_repr() return "" end

function Module:repr()
   local name = self:type_name()
   local children = self:named_children()
   local extra = self:extra_repr()
   if #children == 0 then return name .. "(" .. extra .. ")" end
   local lines = { name .. "(" }
   if extra ~= "" then lines[#lines + 1] = "  " .. extra end
   for _, nm in ipairs(children) do
      local s = tostring(nm[2]):gsub("\n", "\n  ")
      lines[#lines + 1] = "  (" .. nm[1] .. "): " .. s
   end
   lines[#lines + 1] = ")"
   return table.concat(lines, "\n")
end

return Module
