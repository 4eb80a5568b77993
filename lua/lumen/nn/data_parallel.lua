-- lumen.nn.data_parallel -- lm.nn.DataParallel(module, devices, {output_device=, dim=1}): PyTorch's
-- torch.nn.DataParallel in one process. Each forward
--   1. scatters every tensor argument along dim over the devices (lm.comm.scatter: chunks keep
--      the batch's memory format; a batch shorter than the device list uses fewer devices),
--   2. replicates the module onto each device: replica 1 is the module itself (its parameters
--      and buffers live on devices[1]); replica i > 1 is a copy of the module tree whose
--      parameters are differentiable copies p:to(devices[i]) of the originals and whose buffers
--      are plain copies,
--   3. runs the replicas one after the other (one Lua thread) and
--   4. gathers their outputs on output_device (default devices[1]) along dim (lm.comm.gather).
-- Backward goes back through the gather, the replicas and the copies, so each original
-- parameter's .grad receives the sum of the replicas' gradients, on devices[1].
--
-- Buffers, as in PyTorch: updates made during forward on replica 1 (batch-norm running
-- statistics in training mode) are kept, since it is the module itself; those on the other
-- replicas are made on copies and lost. Batch norm in training mode normalises each chunk with
-- the chunk's own statistics (as PyTorch's DataParallel without SyncBatchNorm).
-- A device list may name one device several times ({"cpu", "cpu"}); the module's parameters and
-- buffers must be on devices[1] (m:to(devices[1]) first), else forward raises.

local T = require("lumen.tensor")
local Module = require("lumen.nn.module")
local comm = require("lumen.comm")
local A = require("lumen.autograd")

local type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, select, error =
   type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, select, error
local unpack = unpack -- luacheck: ignore

local Tensor, is_tensor, is_module = T.Tensor, T.is_tensor, Module.is_module

local function fail(msg)
   error("lumen.nn.DataParallel: " .. msg, T.user_level())
end

local DataParallel = Module:extend("DataParallel")

-- DataParallel(module, devices = {default device}, {output_device = devices[1], dim = 1})
function DataParallel:__init(module, devices, opts)
   if not is_module(module) then
      fail("module: a Module expected, got " .. T.typename(module))
   end
   if devices == nil then devices = { T.device_name(T.default_device()) } end
   if type(devices) ~= "table" or getmetatable(devices) ~= nil or #devices == 0 then
      fail("devices must be a non-empty array of device strings, got " .. T.typename(devices))
   end
   local devs = {}
   for i, d in ipairs(devices) do
      local id = T.device_id(d)
      if id == nil then
         fail("unknown device " .. (type(d) == "string" and ("'" .. d .. "'") or T.typename(d))
              .. " (devices[" .. i .. "])")
      end
      devs[i] = T.device_name(id)
   end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail("options must be a table, got " .. T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if k ~= "output_device" and k ~= "dim" then fail("unknown option '" .. tostring(k) .. "'") end
   end
   local out_dev = devs[1]
   if opts.output_device ~= nil then
      local id = T.device_id(opts.output_device)
      if id == nil then fail("unknown device '" .. tostring(opts.output_device) ..
                             "' (output_device)") end
      out_dev = T.device_name(id)
   end
   local dim = opts.dim == nil and 1 or opts.dim
   if type(dim) ~= "number" or dim % 1 ~= 0 or dim == 0 then
      fail("dim must be a non-zero integer, got " .. tostring(dim))
   end
   self.module = module                 -- a child: state_dict keys are "module.<name>", as torch
   rawset(self, "device_ids", devs)
   rawset(self, "output_device", out_dev)
   rawset(self, "dim", dim)
end

-- every parameter and buffer of the module must be on devices[1] (torch's check)
local function check_source_device(self)
   local dev = self.device_ids[1]
   for _, regname in ipairs({ "named_parameters", "named_buffers" }) do
      for _, nt in ipairs(self.module[regname](self.module)) do
         local d = Tensor.device(nt[2])
         if d ~= dev then
            fail(("module must have its parameters and buffers on devices[1] (%s), but %s " ..
                  "is on %s; move it first with model:to(\"%s\")"):format(dev, nt[1], d, dev))
         end
      end
   end
end

-- a copy of the module tree m on device dev: parameters are differentiable copies (autograd
-- carries their gradients back to the originals), buffers detached copies, other tensors moved,
-- child modules copied (memo: a module or tensor shared in the tree stays shared in the copy)
local function replicate(m, dev, memo)
   if memo[m] then return memo[m] end
   local r = setmetatable({}, getmetatable(m))
   memo[m] = r
   local params, buffers = rawget(m, "_params"), rawget(m, "_buffers")
   local function tensor_copy(t, is_buffer)
      if memo[t] then return memo[t] end
      local u
      if is_buffer then
         u = A.no_grad(function() return Tensor.to(t, dev, { copy = true }) end)
      else
         u = Tensor.to(t, dev, { copy = true })
      end
      memo[t] = u
      return u
   end
   for k, v in pairs(m) do
      if k == "_params" or k == "_buffers" or k == "_children" then
         -- the registries hold names; fresh tables so that the replica shares nothing mutable
         local reg = {}
         for kk, vv in pairs(v) do
            if type(vv) == "table" then
               local sub = {}
               for a, b in pairs(vv) do sub[a] = b end
               reg[kk] = sub
            else
               reg[kk] = vv
            end
         end
         rawset(r, k, reg)
      elseif is_module(v) then
         rawset(r, k, replicate(v, dev, memo))
      elseif is_tensor(v) then
         local is_buffer = type(k) == "string" and buffers and buffers.set[k]
         local is_param = type(k) == "string" and params and params.set[k]
         if is_param or is_buffer then
            rawset(r, k, tensor_copy(v, is_buffer and not is_param))
         elseif Tensor.device(v) ~= dev then
            rawset(r, k, Tensor.to(v, dev))
         else
            rawset(r, k, v)
         end
      else
         rawset(r, k, v)
      end
   end
   return r
end

-- gather the replicas' outputs: tensors, or (nested) arrays of them
local function gather(outputs, dest, dim)
   local first = outputs[1]
   if is_tensor(first) then
      return comm.gather(outputs, { dim = dim, destination = dest })
   end
   if type(first) == "table" and getmetatable(first) == nil then
      local r = {}
      for k in pairs(first) do
         local col = {}
         for i = 1, #outputs do col[i] = outputs[i][k] end
         r[k] = gather(col, dest, dim)
      end
      return r
   end
   return first                         -- numbers, strings, nil: replica 1's
end

function DataParallel:forward(...)
   local devs = self.device_ids
   local n = select("#", ...)
   local args = { ... }
   if #devs == 1 then
      -- one device: the module itself (as torch with a single device id)
      check_source_device(self)
      return self.module(...)
   end
   check_source_device(self)
   -- scatter every tensor argument; the others go to every replica as they are
   local chunks, k = {}, nil
   for i = 1, n do
      local a = args[i]
      if is_tensor(a) then
         local ok, parts = pcall(comm.scatter, a, devs, { dim = self.dim })
         if not ok then fail((tostring(parts):gsub("^lumen%.comm%.scatter: ", "scatter: "))) end
         chunks[i] = parts
         if k == nil or #parts < k then k = #parts end
      end
   end
   if k == nil then fail("forward needs at least one tensor argument to scatter") end
   local outputs = {}
   for r = 1, k do
      local rep = r == 1 and self.module or replicate(self.module, devs[r], {})
      local rargs = {}
      for i = 1, n do rargs[i] = chunks[i] and chunks[i][r] or args[i] end
      outputs[r] = rep(unpack(rargs, 1, n))
   end
   return gather(outputs, self.output_device, self.dim)
end

function DataParallel:extra_repr()
   return "devices={" .. table.concat(self.device_ids, ", ") .. "}"
end

return DataParallel
