-- lumen.optim.optimizer -- the Optimizer base class: parameter groups, per-parameter state,
-- zero_grad, step(closure), state_dict / load_state_dict.
--
-- A subclass provides `defaults` (a table of hyper-parameters; a value of REQUIRED must be given)
-- and `update(group, p, grad, state)`, called for every parameter that has a gradient, with
-- autograd off.

local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")

local type, pairs, ipairs, rawget, getmetatable, setmetatable, tostring, error = type, pairs,
   ipairs, rawget, getmetatable, setmetatable, tostring, error

local Tensor, raw = T.Tensor, T.raw

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.REQUIRED = setmetatable({}, { __tostring = function() return "<required>" end })

local function fail(fname, msg)
   error("lumen." .. fname .. ": " .. msg, T.user_level and T.user_level() or 3)
end
Optimizer._fail = fail

local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end

-- Optimizer.class(name, defaults, update) -> a class; calling it builds an optimizer
function Optimizer.class(name, defaults, update, validate)
   local cls = setmetatable({}, { __index = Optimizer })
   cls.__index = cls
   cls.__name = name
   cls.defaults = defaults
   cls.update = update
   cls.validate = validate
   cls.__tostring = Optimizer.__tostring
   return setmetatable(cls, { __index = Optimizer, __call = function(c, params, opts)
      return Optimizer.new(c, params, opts)
   end })
end

-- params: an array of tensors, a Module (its parameters), or an array of groups
-- {params = {...}, lr = ..., ...}; opts: hyper-parameters for every group
function Optimizer.new(cls, params, opts)
   local fname = cls.__name
   if opts ~= nil and not plain_table(opts) then fail(fname, "options must be a table") end
   opts = opts or {}
   for k in pairs(opts) do
      if cls.defaults[k] == nil then
         fail(fname, "unknown option '" .. tostring(k) .. "'")
      end
   end
   if type(params) == "table" and type(params.parameters) == "function"
      and not plain_table(params) then
      params = params:parameters()
   end
   if not plain_table(params) then
      fail(fname, "params must be an array of tensors or of parameter groups, got " ..
           T.typename(params))
   end
   if #params == 0 then fail(fname, "optimizer got an empty parameter list") end
   local self = setmetatable({ param_groups = {}, state = {} }, cls)
   local groups = params
   if T.is_tensor(params[1]) then groups = { { params = params } } end
   local seen = {}
   for gi, g in ipairs(groups) do
      if not plain_table(g) or type(g.params) ~= "table" then
         fail(fname, "parameter group " .. gi .. " must be a table with a 'params' array")
      end
      local group = {}
      for k, v in pairs(cls.defaults) do group[k] = v end
      for k, v in pairs(opts) do group[k] = v end
      for k, v in pairs(g) do
         if k ~= "params" then
            if cls.defaults[k] == nil then
               fail(fname, "unknown option '" .. tostring(k) .. "' in parameter group " .. gi)
            end
            group[k] = v
         end
      end
      for k, v in pairs(group) do
         if v == Optimizer.REQUIRED then
            fail(fname, "parameter group didn't specify a value of required option '" .. k .. "'")
         end
      end
      local plist = {}
      local src = g.params
      if T.is_tensor(src) then src = { src } end
      for i, p in ipairs(src) do
         if not T.is_tensor(p) then
            fail(fname, ("params[%d] is not a tensor (got %s)"):format(i, T.typename(p)))
         end
         if not Tensor.is_floating_point(p) then
            fail(fname, "can't optimize a tensor of dtype " .. tostring(Tensor.dtype(p)))
         end
         if rawget(p, "grad_fn") ~= nil then
            fail(fname, "can't optimize a non-leaf tensor")
         end
         if seen[p] then
            fail(fname, "some parameters appear in more than one parameter group")
         end
         seen[p] = true
         plist[#plist + 1] = p
      end
      group.params = plist
      if cls.validate then cls.validate(fname, group, fail) end
      self.param_groups[#self.param_groups + 1] = group
   end
   return self
end

function Optimizer:add_param_group(g)
   local other = Optimizer.new(getmetatable(self), { g }, nil)
   local seen = {}
   for _, grp in ipairs(self.param_groups) do
      for _, p in ipairs(grp.params) do seen[p] = true end
   end
   for _, p in ipairs(other.param_groups[1].params) do
      if seen[p] then
         fail(self.__name, "some parameters appear in more than one parameter group")
      end
   end
   self.param_groups[#self.param_groups + 1] = other.param_groups[1]
end

-- zero_grad(set_to_none = false)
function Optimizer:zero_grad(set_to_none)
   for _, g in ipairs(self.param_groups) do
      for _, p in ipairs(g.params) do
         local gr = rawget(p, "grad")
         if gr ~= nil then
            if set_to_none then p.grad = nil else raw.zero_(gr) end
         end
      end
   end
end

-- step(closure): closure (optional) re-evaluates the loss with autograd on; returns its result
function Optimizer:step(closure)
   local loss
   if closure ~= nil then loss = A.enable_grad(closure) end
   A.no_grad(function()
      for _, group in ipairs(self.param_groups) do
         for _, p in ipairs(group.params) do
            local g = rawget(p, "grad")
            if g ~= nil then
               local st = self.state[p]
               if st == nil then st = {}; self.state[p] = st end
               self.update(group, p, g, st)
            end
         end
      end
   end)
   return loss
end

local function copy_value(v)
   if T.is_tensor(v) then return raw.clone(v) end
   if plain_table(v) then
      local r = {}
      for k, x in pairs(v) do r[k] = copy_value(x) end
      return r
   end
   return v
end

-- state_dict() -> {state = {[i] = {...}}, param_groups = {{..., params = {i, ...}}}}: parameters
-- are numbered 1, 2, ... across the groups in order; tensors in the state are copies
function Optimizer:state_dict()
   -- state kept on a device by the optimizer itself (a capturable Adam's step counts) first
   if self._sync_state then self:_sync_state() end
   local index, n = {}, 0
   local groups = {}
   for _, g in ipairs(self.param_groups) do
      local pg = {}
      for k, v in pairs(g) do if k ~= "params" then pg[k] = copy_value(v) end end
      local ids = {}
      for _, p in ipairs(g.params) do
         n = n + 1
         index[p] = n
         ids[#ids + 1] = n
      end
      pg.params = ids
      groups[#groups + 1] = pg
   end
   local state = {}
   for p, st in pairs(self.state) do
      if index[p] then state[index[p]] = copy_value(st) end
   end
   return { state = state, param_groups = groups }
end

-- load_state_dict(sd): the groups must match in number and sizes; state tensors are copied and
-- converted to their parameter's dtype (floating ones) and memory format
function Optimizer:load_state_dict(sd)
   local fname = self.__name .. ".load_state_dict"
   if not plain_table(sd) or not plain_table(sd.param_groups)
      or not plain_table(sd.state or {}) then
      fail(fname, "expected a table {state = ..., param_groups = ...}")
   end
   if #sd.param_groups ~= #self.param_groups then
      fail(fname, "loaded state dict has a different number of parameter groups")
   end
   local params_by_id = {}
   for gi, g in ipairs(self.param_groups) do
      local sg = sd.param_groups[gi]
      if not plain_table(sg.params) or #sg.params ~= #g.params then
         fail(fname, "loaded state dict contains a parameter group that doesn't match the size " ..
              "of optimizer's group")
      end
      for i, p in ipairs(g.params) do params_by_id[sg.params[i]] = p end
   end
   local new_state = {}
   for id, st in pairs(sd.state or {}) do
      local p = params_by_id[id]
      if p ~= nil then
         local s = {}
         for k, v in pairs(st) do
            if T.is_tensor(v) then
               if Tensor.is_floating_point(v) and Tensor.dim(v) == Tensor.dim(p) then
                  local u = raw.to(v, { dtype = Tensor.dtype(p), copy = true })
                  local dst = raw.clone(p)     -- the parameter's layout
                  raw.copy_(dst, u)
                  s[k] = dst
               else
                  s[k] = raw.clone(v)
               end
            else
               s[k] = copy_value(v)
            end
         end
         new_state[p] = s
      end
   end
   for gi, g in ipairs(self.param_groups) do
      for k, v in pairs(sd.param_groups[gi]) do
         if k ~= "params" then g[k] = copy_value(v) end
      end
   end
   self.state = new_state
end

function Optimizer:__tostring()
   local lines = { self.__name .. " (" }
   for i, g in ipairs(self.param_groups) do
      lines[#lines + 1] = "Parameter Group " .. (i - 1)
      local keys = {}
      for k in pairs(g) do if k ~= "params" then keys[#keys + 1] = k end end
      table.sort(keys)
      for _, k in ipairs(keys) do
         local v = g[k]
         if type(v) == "table" then
            local parts = {}
            for j = 1, #v do parts[j] = tostring(v[j]) end
            v = "(" .. table.concat(parts, ", ") .. ")"
         end
         lines[#lines + 1] = "    " .. k .. ": " .. tostring(v)
      end
   end
   lines[#lines + 1] = ")"
   return table.concat(lines, "\n")
end

Optimizer._dtypes = dtypes

return Optimizer
