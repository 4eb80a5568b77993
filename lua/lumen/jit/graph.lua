-- lumen.jit.graph -- the graph a trace records, how it runs, and how it prints.
--
-- A graph is plain data (what lumen.jit.serialize writes as JSON):
--   g.values[id] = {sizes = {...}, dtype = "float32", format = "channels_last", device = "cpu",
--                   kind = "input" | "param" | "buffer" | "const" | nil (a node's result),
--                   name = state_dict name (param, buffer, const), index = k (input)}
--   g.nodes[i]   = {op = "F.conv2d", args = {encoded, ...}, nargs = n, outs = encoded result,
--                   inplace = true when the op wrote into its first argument}
--   g.inputs     = {value id, ...}; g.outputs = the encoded result of the forward
-- An encoded argument is JSON-able: a number, string or boolean as itself (a non-integer number
-- as {num = "%.17g"} so it survives any JSON writer), nil as {["nil"] = true}, a tensor as
-- {v = id}, a dtype as {dtype = name}, a memory format as {format = name}, a plain table as
-- {list = {...}} or {map = {...}}.
-- The operators are named by namespace: F.<name> (lumen.functional), Tensor.<name> (the Tensor
-- methods), lm.<name> (lumen's own functions); they are looked up when the graph runs, so the
-- wrappers autograd and autocast install apply as in eager code.
local T = require("lumen.tensor")
local dtypes = require("lumen.dtype")
local Tensor = T.Tensor

local type, pairs, ipairs, tostring, select = type, pairs, ipairs, tostring, select
local unpack = unpack -- luacheck: ignore

local M = {}

M.VERSION = 1     -- the graph format; lumen.jit.load refuses a newer one

---------------------------------------------------------------------------------------------
-- the operators a graph may name
---------------------------------------------------------------------------------------------

-- Tensor methods that only inspect, or that act outside the tensor (hooks, files): not operators
M.TENSOR_SKIP = {
   size = true, stride = true, dim = true, ndimension = true, numel = true, nelement = true,
   dtype = true, device = true, storage_offset = true, is_floating_point = true,
   is_contiguous = true, is_non_overlapping_and_dense = true, suggest_memory_format = true,
   is_same_storage = true, item = true, totable = true, tolist = true, free = true,
   is_leaf = true, requires_grad_ = true, register_hook = true, retain_grad = true,
   backward = true, equal = true, allclose = true, data_ptr = true, element_size = true,
   is_cuda = true, is_meta = true, get_device = true, untyped_storage = true,
}
-- the lm.* functions that are operators: init.lua's functional forms, joining, the factories
local LM_OPS = {
   cat = true, stack = true, where = true,
   empty = true, zeros = true, ones = true, full = true, rand = true, randn = true,
   randint = true, arange = true, linspace = true, eye = true, tensor = true,
   empty_strided = true, randperm = true, empty_like = true, zeros_like = true,
   ones_like = true, full_like = true, rand_like = true, randn_like = true, randint_like = true,
   -- indexing (lua/lumen/autograd/indexing.lua)
   sort = true, argsort = true, topk = true, gather = true, scatter_add = true,
   index_select = true, cumsum = true, flip = true,
}
for _, n in ipairs({
   "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
   "logical_and", "logical_or", "logical_not", "fmod", "atan2",
   "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "square",
   "reciprocal", "sign", "floor", "ceil", "round", "sin", "cos", "log1p", "expm1", "clamp",
   "trunc", "log2", "log10", "exp2", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
   "acosh", "atanh", "erf", "erfc",
   "addcmul", "addcdiv", "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin",
   "matmul", "mm", "view", "reshape", "permute", "transpose", "expand", "narrow", "select",
   "unsqueeze", "squeeze", "flatten", "clone", "contiguous" }) do
   LM_OPS[n] = true
end
M.LM_OPS = LM_OPS

local function F() return require("lumen.functional") end
local function lm() return require("lumen") end

-- the namespace table of "F.x", "Tensor.x", "lm.x", and the key; nil when op names nothing a
-- graph may run
function M.resolve(op)
   if type(op) ~= "string" then return nil end
   local ns, key = op:match("^(%a+)%.([%a_][%w_]*)$")
   if not key or key:sub(1, 1) == "_" then return nil end
   local tbl
   if ns == "F" then
      tbl = F()
   elseif ns == "Tensor" then
      if M.TENSOR_SKIP[key] then return nil end
      tbl = Tensor
   elseif ns == "lm" then
      if not LM_OPS[key] then return nil end
      tbl = lm()
   else
      return nil
   end
   if type(tbl[key]) ~= "function" then return nil end
   return tbl, key
end

---------------------------------------------------------------------------------------------
-- values
---------------------------------------------------------------------------------------------

-- the memory format a tensor is dense in ("contiguous", "channels_last", "channels_last_3d"),
-- or "strided"
function M.format_of(t)
   local f = Tensor.suggest_memory_format(t)
   if Tensor.is_contiguous(t, f) then return f.name == "contiguous_format" and "contiguous"
      or f.name end
   if Tensor.is_contiguous(t) then return "contiguous" end
   return "strided"
end

function M.describe(t)
   local s = Tensor.size(t)
   local sizes = {}
   for i = 1, #s do sizes[i] = s[i] end
   return { sizes = sizes, dtype = Tensor.dtype(t).name, format = M.format_of(t),
            device = Tensor.device(t) }
end

---------------------------------------------------------------------------------------------
-- arguments
---------------------------------------------------------------------------------------------

-- encode(x, ref) -> the JSON-able form; ref(tensor) -> value id. Raises (a string) on what
-- cannot be recorded.
function M.encode(x, ref)
   local tx = type(x)
   if x == nil then return { ["nil"] = true } end
   if tx == "boolean" or tx == "string" then return x end
   if tx == "number" then
      if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return x end
      return { num = ("%.17g"):format(x) }
   end
   if T.is_tensor(x) then return { v = ref(x) } end
   if dtypes.is_dtype(x) then return { dtype = x.name } end
   if dtypes.is_memory_format(x) then return { format = x.name } end
   if tx == "table" then
      if getmetatable(x) ~= nil and not T.is_sizes(x) then
         error("a " .. T.typename(x) .. " cannot be recorded", 0)
      end
      local n = 0
      for _ in pairs(x) do n = n + 1 end
      local arr = n == #x
      if arr then
         local l = {}
         for i = 1, n do l[i] = M.encode(x[i], ref) end
         return { list = l }
      end
      local m = {}
      for k, v in pairs(x) do
         if type(k) ~= "string" then
            error("a table with a " .. type(k) .. " key cannot be recorded", 0)
         end
         m[k] = M.encode(v, ref)
      end
      return { map = m }
   end
   error("a " .. T.typename(x) .. " cannot be recorded", 0)
end

-- a decoded argument: constants as themselves, a tensor as a slot {ref = id}; tables that hold
-- a tensor are marked {__dyn = true} so that materialize copies them. check(where, cond, msg)
-- raises for malformed input.
local REF = {}
REF.__index = REF
M.REF = REF

function M.decode(e, bad)
   local te = type(e)
   if te == "number" or te == "boolean" or te == "string" then return e, false end
   if te ~= "table" then bad("an argument of type " .. te) end
   if e["nil"] == true then return nil, false end
   if e.v ~= nil then
      if type(e.v) ~= "number" or e.v % 1 ~= 0 then bad("a tensor reference that is not an id") end
      return setmetatable({ id = e.v }, REF), true
   end
   if e.num ~= nil then
      local v = type(e.num) == "string" and tonumber(e.num)
      if v == nil then bad("a number that does not parse") end
      return v, false
   end
   if e.dtype ~= nil then
      local d = type(e.dtype) == "string" and dtypes.lookup(e.dtype)
      if not d then bad("an unknown dtype '" .. tostring(e.dtype) .. "'") end
      return d, false
   end
   if e.format ~= nil then
      local f = type(e.format) == "string" and dtypes.lookup_format(e.format)
      if not f then bad("an unknown memory format '" .. tostring(e.format) .. "'") end
      return f, false
   end
   if e.list ~= nil or e.map ~= nil then
      local src = e.list or e.map
      if type(src) ~= "table" then bad("a list or map that is not one") end
      local out, dyn = {}, false
      if e.list ~= nil then
         for i = 1, #src do
            local v, d = M.decode(src[i], bad)
            out[i] = v
            dyn = dyn or d
         end
      else
         for k, v in pairs(src) do
            if type(k) ~= "string" then bad("a map with a non-string key") end
            local dv, d = M.decode(v, bad)
            out[k] = dv
            dyn = dyn or d
         end
      end
      if dyn then out = { __dyn = true, t = out, list = e.list ~= nil, n = #src } end
      return out, dyn
   end
   bad("an argument of unknown form")
end

-- the tensor ids a decoded argument refers to, into out (a set)
function M.refs(a, out)
   if type(a) == "table" then
      if getmetatable(a) == REF then
         out[a.id] = true
      elseif a.__dyn then
         for _, v in pairs(a.t) do M.refs(v, out) end
      end
   end
   return out
end

-- the decoded argument with every slot filled from env
local function materialize(a, env)
   if type(a) ~= "table" then return a end
   if getmetatable(a) == REF then return env[a.id] end
   if a.__dyn then
      local o = {}
      for k, v in pairs(a.t) do o[k] = materialize(v, env) end
      return o
   end
   return a
end
M.materialize = materialize

---------------------------------------------------------------------------------------------
-- running
---------------------------------------------------------------------------------------------

-- prepare(g): decodes every node's arguments once (g.plan[i] = {tbl, key, args, n, outs});
-- raises with bad(msg) on anything malformed
function M.prepare(g, bad)
   local plan = {}
   for i, node in ipairs(g.nodes) do
      local tbl, key = M.resolve(node.op)
      if not tbl then bad(("node %d: unknown operator '%s'"):format(i, tostring(node.op))) end
      local args = {}
      local function nbad(m) bad(("node %d (%s): %s"):format(i, node.op, m)) end
      if type(node.args) ~= "table" then nbad("no argument list") end
      local n = node.nargs or #node.args
      for j = 1, n do args[j] = M.decode(node.args[j], nbad) end
      local outs = M.decode(node.outs, nbad)
      plan[i] = { tbl = tbl, key = key, args = args, n = n, outs = outs }
   end
   g.plan = plan
   return plan
end

-- bind the results of a node (res, packed) to the output slots
local function bind(slot, v, env)
   if type(slot) ~= "table" then return end
   if getmetatable(slot) == REF then
      env[slot.id] = v
   elseif slot.__dyn and type(v) == "table" then
      for k, s in pairs(slot.t) do bind(s, v[k], env) end
   end
end

-- run(g, tensors, ...) -> the graph's results; tensors: name -> tensor (params, buffers, consts)
function M.run(g, tensors, ...)
   local plan = g.plan
   local env = {}
   local nin = #g.inputs
   if select("#", ...) ~= nin then
      error(("lumen.jit: the graph takes %d input(s), got %d"):format(nin, select("#", ...)),
            T.user_level())
   end
   for i = 1, nin do
      local x = select(i, ...)
      if not T.is_tensor(x) then
         error(("lumen.jit: input %d: tensor expected, got %s"):format(i, T.typename(x)),
               T.user_level())
      end
      env[g.inputs[i]] = x
   end
   for id, v in pairs(g.values) do
      if v.name ~= nil then env[id] = tensors[v.name] end
   end
   local args = {}
   for i = 1, #plan do
      local p = plan[i]
      local pa = p.args
      for j = 1, p.n do args[j] = materialize(pa[j], env) end
      local outs = p.outs
      if getmetatable(outs) == REF then
         env[outs.id] = p.tbl[p.key](unpack(args, 1, p.n))
      else
         local r = { p.tbl[p.key](unpack(args, 1, p.n)) }
         if type(outs) == "table" and outs.__dyn then
            for k, s in pairs(outs.t) do bind(s, r[k], env) end
         end
      end
      for j = 1, p.n do args[j] = nil end
   end
   local o = materialize(g.out_slot, env)
   if g.out_multi then return unpack(o, 1, g.out_n) end
   return o
end

---------------------------------------------------------------------------------------------
-- printing
---------------------------------------------------------------------------------------------

local function vname(g, id)
   local v = g.values[id]
   if v and v.name then return "%" .. v.name end
   if v and v.kind == "input" then return "%x" .. tostring(v.index or "") end
   return "%" .. tostring(id)
end

local function vtype(v)
   if not v then return "?" end
   return ("%s[%s] %s%s"):format(v.dtype or "?", table.concat(v.sizes or {}, ", "),
      v.format or "?", (v.device and v.device ~= "cpu") and (" " .. v.device) or "")
end

local function show(g, e)
   local te = type(e)
   if te == "string" then return ("%q"):format(e) end
   if te ~= "table" then return tostring(e) end
   if e["nil"] then return "nil" end
   if e.v then return vname(g, e.v) end
   if e.num then return tostring(tonumber(e.num)) end
   if e.dtype then return "lm." .. e.dtype end
   if e.format then return "lm." .. e.format end
   if e.list then
      local p = {}
      for i, x in ipairs(e.list) do p[i] = show(g, x) end
      return "{" .. table.concat(p, ", ") .. "}"
   end
   if e.map then
      local ks = {}
      for k in pairs(e.map) do ks[#ks + 1] = k end
      table.sort(ks)
      local p = {}
      for i, k in ipairs(ks) do p[i] = k .. " = " .. show(g, e.map[k]) end
      return "{" .. table.concat(p, ", ") .. "}"
   end
   return "?"
end
M.show = show

-- the ids an encoded value refers to, in order
local function enc_ids(e, out)
   if type(e) == "table" then
      if e.v then out[#out + 1] = e.v
      elseif e.list then for _, x in ipairs(e.list) do enc_ids(x, out) end
      elseif e.map then
         local ks = {}
         for k in pairs(e.map) do ks[#ks + 1] = k end
         table.sort(ks)
         for _, k in ipairs(ks) do enc_ids(e.map[k], out) end
      end
   end
   return out
end
M.enc_ids = enc_ids

-- one line per node: "%5 : float32[1, 64, 32, 32] channels_last = F.conv2d(%x1, %conv1.weight,
-- nil, {padding = 3, ...})"
function M.to_string(g)
   local lines = {}
   local ins = {}
   for i, id in ipairs(g.inputs) do ins[i] = vname(g, id) .. " : " .. vtype(g.values[id]) end
   local np, nel = 0, 0
   for _, v in pairs(g.values) do
      if v.kind == "param" or v.kind == "buffer" or v.kind == "const" then
         np = np + 1
         local n = 1
         for _, s in ipairs(v.sizes or {}) do n = n * s end
         nel = nel + n
      end
   end
   lines[1] = ("graph(%s):  # %d node(s), %d weight tensor(s), %d elements"):format(
      table.concat(ins, ", "), #g.nodes, np, nel)
   for _, node in ipairs(g.nodes) do
      local a = {}
      for j = 1, node.nargs or #node.args do a[j] = show(g, node.args[j]) end
      local outs = enc_ids(node.outs, {})
      local o = {}
      for j, id in ipairs(outs) do o[j] = vname(g, id) .. " : " .. vtype(g.values[id]) end
      local lhs = #o > 0 and (table.concat(o, ", ") .. " = ") or ""
      lines[#lines + 1] = "  " .. lhs .. node.op .. "(" .. table.concat(a, ", ") .. ")" ..
         (node.inplace and "  # in place" or "")
   end
   lines[#lines + 1] = "  return " .. show(g, g.outputs)
   return table.concat(lines, "\n")
end

---------------------------------------------------------------------------------------------
-- the traced module: a callable object over a graph and its tensors
---------------------------------------------------------------------------------------------

local Traced = {}
Traced.__index = Traced
Traced.__name = "TracedModule"
M.Traced = Traced

Traced.__call = function(self, ...) return M.run(self.graph, self.tensors, ...) end
Traced.__tostring = function(self) return M.to_string(self.graph) end

function Traced.forward(self, ...) return M.run(self.graph, self.tensors, ...) end

-- out slot of the graph's results (set by M.new from g.outputs)
local function set_outputs(g, bad)
   local o, _ = M.decode(g.outputs, bad)
   if g.multi and type(o) == "table" and o.__dyn and o.list then
      g.out_slot, g.out_multi, g.out_n = o, true, o.n
   else
      g.out_slot, g.out_multi = o, false
   end
end

-- new(graph, tensors) -> a traced module; bad(msg) raises for a malformed graph
function M.new(g, tensors, bad)
   bad = bad or function(m) error("lumen.jit: " .. m, 0) end
   M.prepare(g, bad)
   set_outputs(g, bad)
   return setmetatable({ graph = g, tensors = tensors }, Traced)
end

-- the graph's weights: {name, tensor, kind} in the graph's order of first use
function Traced.named_tensors(self)
   local out = {}
   local ids = {}
   for id, v in pairs(self.graph.values) do
      if v.name ~= nil then ids[#ids + 1] = id end
   end
   table.sort(ids)
   for _, id in ipairs(ids) do
      local v = self.graph.values[id]
      out[#out + 1] = { v.name, self.tensors[v.name], v.kind }
   end
   return out
end

function Traced.named_parameters(self)
   local out = {}
   for _, e in ipairs(self:named_tensors()) do
      if e[3] == "param" then out[#out + 1] = { e[1], e[2] } end
   end
   return out
end

function Traced.parameters(self)
   local out = {}
   for _, e in ipairs(self:named_parameters()) do out[#out + 1] = e[2] end
   return out
end

function Traced.state_dict(self)
   local sd = {}
   for _, e in ipairs(self:named_tensors()) do sd[e[1]] = e[2] end
   return sd
end

-- the nodes whose operator is op (a name such as "F.batch_norm")
function Traced.count(self, op)
   local n = 0
   for _, node in ipairs(self.graph.nodes) do
      if node.op == op then n = n + 1 end
   end
   return n
end

function Traced.save(self, path)
   return require("lumen.jit.serialize").save(self, path)
end

function Traced.freeze(self)
   return require("lumen.jit.freeze").freeze(self)
end

return M
