-- lumen.jit.recorder -- records the operators one call of a function runs into a graph
-- (lumen.jit.graph's form).
--
-- While the function runs, every operator entry point is wrapped, as lm.layout.trace does: the
-- functional ops (F.*), the Tensor methods (so also + - * / on tensors) and lm.*'s operator
-- functions. Only the outermost call is recorded (an operator that calls others inside is one
-- node). Each tensor the recorder sees is a value: the inputs, the weights it knows by name
-- (parameters and buffers, by their state_dict names), each node's results; any other tensor
-- an operator receives is recorded as a constant (saved with the weights). An operator that
-- returns a tensor it received (relu_, an in-place op, or a no-op such as dropout in
-- evaluation mode) gives a new value too: later uses of that tensor refer to the new one.
-- Tensor:item() and totable() are not operators: their value is baked into the graph, so the
-- recorder warns once per trace when the function reads one (data-dependent control flow is
-- the caller's to avoid, as in torch.jit.trace).
local T = require("lumen.tensor")
local G = require("lumen.jit.graph")
local function_keys = require("lumen.util").function_keys
local Tensor = T.Tensor

local pairs, ipairs, type, select, error, pcall = pairs, ipairs, type, select, error, pcall
local unpack = unpack -- luacheck: ignore

local M = {}
-- how many recordings are running now: lumen.nn.fold's per-call batch-norm folding stays out of
-- a recording, so the graph holds the model's own operators (conv2d, batch_norm)
M.active = 0

local function pack(...) return { n = select("#", ...), ... } end

-- is the table of results one with a tensor somewhere in it (one level of nesting)?
local function has_tensor(r)
   for i = 1, r.n do
      local x = r[i]
      if T.is_tensor(x) then return true end
      if type(x) == "table" and getmetatable(x) == nil then
         for _, y in pairs(x) do if T.is_tensor(y) then return true end end
      end
   end
   return false
end

-- record(fn, inputs, named, opts) -> graph, results (packed)
--   inputs: array of tensors passed to fn; named: array of {name, tensor, kind} (kind "param"
--   or "buffer"); opts.warn(msg) receives the warnings (default: stderr), opts.fname the
--   caller's name for messages
function M.record(fn, inputs, named, opts)
   opts = opts or {}
   local fname = opts.fname or "jit.trace"
   local warn = opts.warn or function(msg) io.stderr:write(msg, "\n") end
   local lm = require("lumen")
   local F = require("lumen.functional")

   local g = { version = G.VERSION, values = {}, nodes = {}, inputs = {}, warnings = {} }
   local id_of = setmetatable({}, { __mode = "k" })  -- tensor -> its current value id
   local next_id = 0
   local by_name = {}                                -- weight name -> tensor
   local known = {}                                  -- tensor -> {name, kind}
   for _, e in ipairs(named) do
      if known[e[2]] == nil then known[e[2]] = { e[1], e[3] } end
   end
   local nconst = 0

   local function new_value(t, extra)
      next_id = next_id + 1
      local v = G.describe(t)
      for k, x in pairs(extra or {}) do v[k] = x end
      g.values[next_id] = v
      id_of[t] = next_id
      return next_id
   end
   -- the value id of a tensor an operator receives
   local function ref(t)
      local id = id_of[t]
      if id then return id end
      local k = known[t]
      if k then
         by_name[k[1]] = t
         return new_value(t, { kind = k[2], name = k[1] })
      end
      nconst = nconst + 1
      local name = "_const." .. nconst
      by_name[name] = t
      return new_value(t, { kind = "const", name = name })
   end
   for i, x in ipairs(inputs) do
      g.inputs[i] = new_value(x, { kind = "input", index = i })
   end

   local depth = 0
   local patched = {}
   local warned = {}
   local function record_call(opname, f, ...)
      if depth > 0 then return f(...) end
      local args = pack(...)
      local enc = {}
      local ok, err = pcall(function()
         for j = 1, args.n do enc[j] = G.encode(args[j], ref) end
      end)
      if not ok then
         error(("lumen.%s: operator %s: %s (only tensors, numbers, strings, booleans, dtypes, " ..
            "memory formats and plain tables of them can be recorded)"):format(fname, opname,
            tostring(err)), 0)
      end
      depth = 1
      local res = pack(pcall(f, ...))
      depth = 0
      if not res[1] then error(res[2], 0) end
      local r = { n = res.n - 1, unpack(res, 2, res.n) }
      if not has_tensor(r) then
         -- an operator that gave no tensor (a number): its value is baked into the graph
         return unpack(r, 1, r.n)
      end
      local function out_ref(t) return new_value(t) end
      local outs
      if r.n == 1 and T.is_tensor(r[1]) then
         outs = { v = new_value(r[1]) }
      else
         local l = {}
         for j = 1, r.n do
            local okj, e = pcall(G.encode, r[j], out_ref)
            l[j] = okj and e or { ["nil"] = true }
         end
         outs = { list = l }
      end
      local node = { op = opname, args = enc, nargs = args.n, outs = outs }
      -- an in-place operator (add_, relu_, copy_, ...) writes into its first argument; other
      -- operators that return their input (contiguous on a contiguous tensor) only alias it
      local first = args[1]
      if opname:sub(-1) == "_" and T.is_tensor(first) then
         for j = 1, r.n do
            if r[j] == first then node.inplace = true end
         end
      end
      g.nodes[#g.nodes + 1] = node
      return unpack(r, 1, r.n)
   end

   local function wrap(tbl, key, opname)
      local f = rawget(tbl, key)
      if type(f) ~= "function" then return end
      patched[#patched + 1] = { tbl, key, f }
      rawset(tbl, key, function(...) return record_call(opname, f, ...) end)
   end
   local function wrap_read(key)
      local f = rawget(Tensor, key)
      if type(f) ~= "function" then return end
      patched[#patched + 1] = { Tensor, key, f }
      rawset(Tensor, key, function(...)
         if not warned[key] then
            warned[key] = true
            local msg = ("lumen.%s: warning: the traced function read a tensor's value " ..
               "(Tensor.%s); the graph keeps the value it had in this trace, and control " ..
               "flow that depends on it is not recorded"):format(fname, key)
            g.warnings[#g.warnings + 1] = msg
            warn(msg)
         end
         return f(...)
      end)
   end

   local ok, err = pcall(function()
      for _, k in ipairs(function_keys(F)) do wrap(F, k, "F." .. k) end
      for _, k in ipairs(function_keys(Tensor, function(k) return not G.TENSOR_SKIP[k] end)) do
         wrap(Tensor, k, "Tensor." .. k)
      end
      for k in pairs(G.LM_OPS) do wrap(lm, k, "lm." .. k) end
      wrap_read("item")
      wrap_read("totable")
      wrap_read("tolist")
   end)
   local results
   if ok then
      M.active = M.active + 1
      results = pack(pcall(fn, unpack(inputs)))
      M.active = M.active - 1
      ok, err = results[1], results[2]
   end
   for i = #patched, 1, -1 do
      local p = patched[i]
      rawset(p[1], p[2], p[3])
   end
   if not ok then error(err, 0) end
   results = { n = results.n - 1, unpack(results, 2, results.n) }

   -- the outputs: one tensor, or several (a list)
   local function out_enc(x)
      local okx, e = pcall(G.encode, x, ref)
      if not okx then
         error(("lumen.%s: the traced function must return tensors (or a plain table of " ..
            "them), got %s"):format(fname, T.typename(x)), 0)
      end
      return e
   end
   if results.n == 1 then
      g.outputs = out_enc(results[1])
   else
      local l = {}
      for i = 1, results.n do l[i] = out_enc(results[i]) end
      g.outputs = { list = l }
      g.multi = true
   end
   if not has_tensor(results) then
      error(("lumen.%s: the traced function returned no tensor"):format(fname), 0)
   end
   return g, by_name, results
end

return M
