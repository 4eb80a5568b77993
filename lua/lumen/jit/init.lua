-- lumen.jit -- lm.jit: trace a model into a graph, save it as one file, load it without the
-- model's source, freeze it for inference. docs/shipping_models.md has the guide.
--
--    local g = lm.jit.trace(model, x)     -- records one forward (model:eval() first to trace
--                                         -- inference); g(x) runs it, tostring(g) prints it
--    g:save("model.safetensors")          -- weights + the graph as JSON in the metadata
--    local g2 = lm.jit.load("model.safetensors")
--    local f = lm.jit.freeze(g2)          -- batch norms folded, conv+bias+relu(+add) fused,
--                                         -- dropout removed, layout conversions that cancel
--                                         -- removed
-- One job per file: recorder.lua (the trace), graph.lua (the graph, running it, printing),
-- serialize.lua (save and load), freeze.lua (the inference passes).
local T = require("lumen.tensor")
local G = require("lumen.jit.graph")
local R = require("lumen.jit.recorder")

local M = {}

local function fail(fname, msg) error("lumen." .. fname .. ": " .. msg, T.user_level()) end

local function is_module(m)
   local ok, Module = pcall(require, "lumen.nn.module")
   return ok and Module.is_module(m)
end

local function inputs_of(fname, input)
   if T.is_tensor(input) then return { input } end
   if type(input) == "table" and getmetatable(input) == nil and #input > 0 then
      for i, x in ipairs(input) do
         if not T.is_tensor(x) then
            fail(fname, ("input %d: tensor expected, got %s"):format(i, T.typename(x)))
         end
      end
      return { unpack(input) }
   end
   fail(fname, "input must be a tensor or an array of tensors (the forward's arguments), got " ..
        T.typename(input))
end

--- lm.jit.trace(model, input, {warn = fn}) -> a traced module g. model: an nn.Module (its
--- parameters and buffers are named by their state_dict keys) or a function; input: a tensor or
--- an array of tensors (the forward's arguments). g(x) runs the recorded operators on the
--- model's own tensors (autograd works through it), tostring(g) prints the graph, g:save(path)
--- writes one file. Warns (stderr, or opts.warn(msg)) when the forward reads a tensor's value.
function M.trace(model, input, opts)
   local fname = "jit.trace"
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table {warn =}, got " .. T.typename(opts))
   end
   for k in pairs(opts or {}) do
      if k ~= "warn" then fail(fname, "unknown option '" .. tostring(k) .. "'") end
   end
   local inputs = inputs_of(fname, input)
   local fn, named = nil, {}
   if is_module(model) then
      for _, pm in ipairs(model:named_modules()) do
         local path, m = pm[1], pm[2]
         local pre = path == "" and "" or (path .. ".")
         for _, name in ipairs(rawget(m, "_params")) do
            local t = rawget(m, name)
            if t ~= nil then named[#named + 1] = { pre .. name, t, "param" } end
         end
         for _, name in ipairs(rawget(m, "_buffers")) do
            local t = rawget(m, name)
            if t ~= nil then named[#named + 1] = { pre .. name, t, "buffer" } end
         end
      end
      fn = function(...) return model(...) end
   elseif getmetatable(model) == G.Traced then
      for _, e in ipairs(model:named_tensors()) do named[#named + 1] = e end
      fn = function(...) return model(...) end
   elseif type(model) == "function" then
      fn = model
   else
      fail(fname, "model must be an nn.Module, a traced module or a function, got " ..
           T.typename(model))
   end
   local A = require("lumen.autograd")
   local g, tensors = A.no_grad(function()
      return R.record(fn, inputs, named, { fname = fname, warn = opts and opts.warn })
   end)
   return G.new(g, tensors)
end

--- lm.jit.load(path) -> the traced module saved by g:save(path); needs no model source
function M.load(path)
   return require("lumen.jit.serialize").load(path)
end

--- lm.jit.freeze(g) -> a new traced module for inference (g is left as it is)
function M.freeze(g)
   return require("lumen.jit.freeze").freeze(g)
end

function M.is_traced(x) return getmetatable(x) == G.Traced end

return M
