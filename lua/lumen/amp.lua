-- lumen.amp -- lm.amp.GradScaler: loss scaling for float16 training (PyTorch's
-- torch.amp.GradScaler: the same options, defaults, methods, errors and state_dict keys).
--
--    local scaler = lm.amp.GradScaler()
--    opt:zero_grad()
--    local loss = lm.autocast({dtype = lm.float16}, function() return F.cross_entropy(m(x), y) end)
--    scaler:scale(loss):backward()
--    scaler:step(opt)            -- unscales the gradients; skips opt:step() on inf / NaN
--    scaler:update()             -- backoff on inf / NaN, growth after growth_interval clean steps
--
-- The scale is a Lua number (the CPU needs no device tensor for it); it stays a float32 value
-- as PyTorch's (growth that would overflow float32 is not taken). Per optimizer, a step goes
-- READY -> UNSCALED (unscale_) -> STEPPED (step) -> READY (update).

local T = require("lumen.tensor")
local A = require("lumen.autograd")
local util = require("lumen.util")
local dtypes = require("lumen.dtype")

local type, rawget, getmetatable, setmetatable, pairs, ipairs, tostring, error, select, next =
   type, rawget, getmetatable, setmetatable, pairs, ipairs, tostring, error, select, next
local math_huge = math.huge

local Tensor, raw, typename = T.Tensor, T.raw, T.typename

local FLT_MAX = 3.4028234663852886e38

local M = {}

local GradScaler = {}
GradScaler.__index = GradScaler
GradScaler.__name = "GradScaler"

local READY, UNSCALED, STEPPED = 0, 1, 2

local function fail(fname, msg)
   error("lumen.GradScaler" .. (fname ~= "" and ("." .. fname) or "") .. ": " .. msg,
         T.user_level and T.user_level() or 3)
end

local function finite_number(x) return type(x) == "number" and x == x and x > -math_huge
   and x < math_huge end

local OPTS = util.option_set("init_scale", "growth_factor", "backoff_factor", "growth_interval",
                             "enabled", "device")

-- GradScaler(opts): {init_scale = 65536, growth_factor = 2, backoff_factor = 0.5,
-- growth_interval = 2000, enabled = true, device = "cpu"}
local function new(opts)
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail("", "options must be a table, got " .. typename(opts))
   end
   opts = opts or {}
   local k = util.unknown_option(opts, OPTS)
   if k ~= nil then fail("", util.unknown_option_msg(k)) end
   local init_scale = opts.init_scale == nil and 65536 or opts.init_scale
   local growth = opts.growth_factor == nil and 2 or opts.growth_factor
   local backoff = opts.backoff_factor == nil and 0.5 or opts.backoff_factor
   local interval = opts.growth_interval == nil and 2000 or opts.growth_interval
   local enabled = opts.enabled
   if enabled == nil then enabled = true end
   local device = opts.device == nil and "cpu" or opts.device
   if not finite_number(init_scale) or init_scale <= 0 then
      fail("", "init_scale must be a positive finite number, got " .. tostring(init_scale))
   end
   if not finite_number(growth) or growth <= 1 then
      fail("", "growth_factor must be a number > 1, got " .. tostring(growth))
   end
   if not finite_number(backoff) or backoff <= 0 or backoff >= 1 then
      fail("", "backoff_factor must be a number in (0, 1), got " .. tostring(backoff))
   end
   if type(interval) ~= "number" or interval % 1 ~= 0 or interval < 1 then
      fail("", "growth_interval must be a positive integer, got " .. tostring(interval))
   end
   if type(enabled) ~= "boolean" then
      fail("", "enabled must be a boolean, got " .. typename(enabled))
   end
   if device ~= "cpu" and device ~= "cuda" then
      fail("", "device must be \"cpu\" or \"cuda\", got " .. tostring(device))
   end
   return setmetatable({
      _enabled = enabled, _device = device, _init_scale = init_scale, _growth_factor = growth,
      _backoff_factor = backoff, _growth_interval = interval,
      _scale = nil,                  -- set by the first scale() (PyTorch's lazy init)
      _growth_tracker = 0,
      _per_optimizer = setmetatable({}, { __mode = "k" }),   -- opt -> {stage, found_inf}
   }, GradScaler)
end
M.GradScaler = setmetatable(GradScaler, { __call = function(_, opts) return new(opts) end })

local function check_self(self, fname)
   if getmetatable(self) ~= GradScaler then
      fail(fname, "expected a GradScaler (call it as scaler:" .. fname .. "(...)), got " ..
           typename(self))
   end
end

local function check_opt(fname, opt)
   if type(opt) ~= "table" or type(rawget(opt, "param_groups")) ~= "table" then
      fail(fname, "expected an optimizer (with param_groups), got " .. typename(opt))
   end
end

local function opt_state(self, opt)
   local st = self._per_optimizer[opt]
   if st == nil then
      st = { stage = READY, found_inf = false }
      self._per_optimizer[opt] = st
   end
   return st
end

function GradScaler:is_enabled()
   check_self(self, "is_enabled")
   return self._enabled
end

-- scale(outputs): outputs * scale (a tensor, or an array of tensors: a new array); outputs as
-- they are when disabled
function GradScaler:scale(outputs)
   check_self(self, "scale")
   if not self._enabled then return outputs end
   if self._scale == nil then self._scale = self._init_scale end
   local s = self._scale
   if T.is_tensor(outputs) then return Tensor.mul(outputs, s) end
   if type(outputs) == "table" and getmetatable(outputs) == nil and #outputs > 0 then
      local r = {}
      for i, o in ipairs(outputs) do
         if not T.is_tensor(o) then
            fail("scale", ("outputs[%d] must be a tensor, got %s"):format(i, typename(o)))
         end
         r[i] = Tensor.mul(o, s)
      end
      return r
   end
   fail("scale", "outputs must be a tensor or an array of tensors, got " .. typename(outputs))
end

-- true when g holds an inf or a NaN: 0 * g is 0 for finite elements and NaN for the others,
-- so its sum is NaN exactly then
local function non_finite(g)
   local v = raw.sum(raw.mul(g, 0)):item()
   return v ~= v
end

-- divide the gradients of opt's parameters by the scale (in place); records found_inf
local function unscale_grads(self, opt, fname)
   local inv = 1 / self._scale
   local found = false
   A.no_grad(function()
      for _, group in ipairs(opt.param_groups) do
         for _, p in ipairs(group.params) do
            local g = rawget(p, "grad")
            if g ~= nil then
               if Tensor.dtype(g) == dtypes.float16 then
                  fail(fname, "attempting to unscale float16 gradients (keep the parameters " ..
                       "in float32 and run the forward pass under lm.autocast)")
               end
               if not found and non_finite(g) then found = true end
               raw.mul_(g, inv)
            end
         end
      end
   end)
   return found
end

local function need_scale(self, fname)
   if self._scale == nil then
      fail(fname, "no scale yet: call scaler:scale(loss) (and backward) earlier in the " ..
           "iteration")
   end
end

-- unscale_(opt): once per optimizer between two update() calls, before step()
function GradScaler:unscale_(opt)
   check_self(self, "unscale_")
   if not self._enabled then return end
   check_opt("unscale_", opt)
   need_scale(self, "unscale_")
   local st = opt_state(self, opt)
   if st.stage == UNSCALED then
      fail("unscale_", "unscale_() has already been called on this optimizer since the last " ..
           "update()")
   elseif st.stage == STEPPED then
      fail("unscale_", "unscale_() is being called after step()")
   end
   st.found_inf = unscale_grads(self, opt, "unscale_")
   st.stage = UNSCALED
end

-- step(opt, ...): unscale_ when not done yet, then opt:step(...) unless a gradient holds an inf
-- or a NaN; returns what opt:step returns (nil when skipped)
function GradScaler:step(opt, ...)
   check_self(self, "step")
   check_opt("step", opt)
   if not self._enabled then return opt:step(...) end
   if select("#", ...) > 0 and type((...)) == "function" then
      fail("step", "closure use is not supported when the GradScaler is enabled")
   end
   need_scale(self, "step")
   local st = opt_state(self, opt)
   if st.stage == STEPPED then
      fail("step", "step() has already been called since the last update()")
   end
   if st.stage == READY then
      st.found_inf = unscale_grads(self, opt, "step")
   end
   st.stage = STEPPED
   if st.found_inf then return nil end
   return opt:step(...)
end

-- update(new_scale): without new_scale, backoff when an inf / NaN was found since the last
-- update, growth after growth_interval clean updates in a row; with it, the scale is set
function GradScaler:update(new_scale)
   check_self(self, "update")
   if not self._enabled then return end
   need_scale(self, "update")
   if new_scale ~= nil then
      if T.is_tensor(new_scale) then
         if Tensor.numel(new_scale) ~= 1 then
            fail("update", "new_scale should be a number or a 1-element tensor")
         end
         new_scale = Tensor.item(new_scale)
      end
      if not finite_number(new_scale) or new_scale <= 0 then
         fail("update", "new_scale must be a positive finite number, got " ..
              tostring(new_scale))
      end
      self._scale = new_scale
   else
      local any, found = false, false
      for _, st in pairs(self._per_optimizer) do
         if st.stage ~= READY then
            any = true
            if st.found_inf then found = true end
         end
      end
      if not any then
         fail("update", "no inf checks were recorded prior to update() (call step() or " ..
              "unscale_() first)")
      end
      if found then
         self._scale = self._scale * self._backoff_factor
         self._growth_tracker = 0
      else
         local n = self._growth_tracker + 1
         if n == self._growth_interval then
            local grown = self._scale * self._growth_factor
            if grown <= FLT_MAX then self._scale = grown end
            n = 0
         end
         self._growth_tracker = n
      end
   end
   self._per_optimizer = setmetatable({}, { __mode = "k" })
end

function GradScaler:get_scale()
   check_self(self, "get_scale")
   if not self._enabled then return 1.0 end
   return self._scale or self._init_scale
end

function GradScaler:get_growth_factor() return self._growth_factor end
function GradScaler:set_growth_factor(v)
   if not finite_number(v) or v <= 1 then
      fail("set_growth_factor", "growth_factor must be a number > 1, got " .. tostring(v))
   end
   self._growth_factor = v
end
function GradScaler:get_backoff_factor() return self._backoff_factor end
function GradScaler:set_backoff_factor(v)
   if not finite_number(v) or v <= 0 or v >= 1 then
      fail("set_backoff_factor", "backoff_factor must be a number in (0, 1), got " .. tostring(v))
   end
   self._backoff_factor = v
end
function GradScaler:get_growth_interval() return self._growth_interval end
function GradScaler:set_growth_interval(v)
   if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
      fail("set_growth_interval", "growth_interval must be a positive integer, got " ..
           tostring(v))
   end
   self._growth_interval = v
end

-- state_dict(): PyTorch's keys (scale, growth_factor, backoff_factor, growth_interval,
-- _growth_tracker); {} when disabled
function GradScaler:state_dict()
   check_self(self, "state_dict")
   if not self._enabled then return {} end
   return { scale = self:get_scale(), growth_factor = self._growth_factor,
            backoff_factor = self._backoff_factor, growth_interval = self._growth_interval,
            _growth_tracker = self._growth_tracker }
end

function GradScaler:load_state_dict(sd)
   check_self(self, "load_state_dict")
   if not self._enabled then return end
   if type(sd) ~= "table" or getmetatable(sd) ~= nil then
      fail("load_state_dict", "expected a table from scaler:state_dict(), got " .. typename(sd))
   end
   if next(sd) == nil then
      fail("load_state_dict", "the state dict is empty, possibly because it was saved from a " ..
           "disabled GradScaler")
   end
   local s, gf, bf, gi, tr = sd.scale, sd.growth_factor, sd.backoff_factor,
      sd.growth_interval, sd._growth_tracker
   if not finite_number(s) or s <= 0 or not finite_number(gf) or gf <= 1
      or not finite_number(bf) or bf <= 0 or bf >= 1 or type(gi) ~= "number" or gi % 1 ~= 0
      or gi < 1 or (tr ~= nil and (type(tr) ~= "number" or tr % 1 ~= 0 or tr < 0)) then
      fail("load_state_dict", "expected {scale, growth_factor, backoff_factor, " ..
           "growth_interval, _growth_tracker} with valid values")
   end
   self._init_scale, self._growth_factor, self._backoff_factor = s, gf, bf
   self._growth_interval, self._growth_tracker = gi, tr or 0
   if self._scale ~= nil then self._scale = s end     -- else the first scale() starts from it
end

function GradScaler:__tostring()
   return ("GradScaler(scale = %g, growth_factor = %g, backoff_factor = %g, growth_interval = " ..
           "%d, enabled = %s)"):format(self:get_scale(), self._growth_factor,
           self._backoff_factor, self._growth_interval, tostring(self._enabled))
end

return M
