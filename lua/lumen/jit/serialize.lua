-- lumen.jit.serialize -- a traced module as one file: safetensors holding its weights (lm.save,
-- so memory formats are kept), with the graph as JSON in the safetensors metadata:
--   __metadata__["lumen.jit.version"]  = "1"     the graph format (graph.VERSION)
--   __metadata__["lumen.jit.graph"]    = JSON    {version, inputs, outputs, multi, values = [{id,
--                                                sizes, dtype, format, device, kind, name,
--                                                index}], nodes = [{op, args, nargs, outs,
--                                                inplace}], warnings}
--   __metadata__["lumen.jit.checksum"] = 16 hex digits: FNV-1a (64-bit, over 32-bit words) of
--                                                the graph text and every weight's name, dtype,
--                                                sizes and values (in logical order)
-- load checks, in order: the file (lm.load's checks), the version, the checksum (a file
-- changed after it was saved), the graph's structure (every id defined before use, every
-- operator known), and that the weights match the graph (names, dtypes, sizes). Every failure
-- is a "lumen.jit.load: '<path>': ..." error.
local ffi = require("ffi")
local bit = require("bit")
local C = require("lumen.C")
local T = require("lumen.tensor")
local G = require("lumen.jit.graph")
local S = require("lumen.serialize")
local dtypes = require("lumen.dtype")
local Tensor = T.Tensor
local json = S.json

local M = {}

-- the fuzzing harness (fuzz/lua_fuzz.c, fuzz_jit) sets this to false, so that mutated graphs
-- reach the structure checks behind the checksum
M._verify_checksum = true

local FNV_OFFSET = 0xcbf29ce484222325ULL
local FNV_PRIME = 0x100000001b3ULL
local bxor = bit.bxor

local function hash_bytes(h, p, n)
   local nw = math.floor(n / 4)
   local w = ffi.cast("const uint32_t *", p)
   for i = 0, nw - 1 do h = bxor(h, w[i]) * FNV_PRIME end
   local b = ffi.cast("const uint8_t *", p)
   for i = nw * 4, n - 1 do h = bxor(h, b[i]) * FNV_PRIME end
   return h
end

local function hash_string(h, s) return hash_bytes(h, s, #s) end

-- checksum(graph_text, tensors) -> 16 hex digits
function M.checksum(text, tensors)
   local h = hash_string(FNV_OFFSET, text)
   local names = {}
   for k in pairs(tensors) do names[#names + 1] = k end
   table.sort(names)
   for _, name in ipairs(names) do
      local t = tensors[name]
      h = hash_string(h, name .. "\0" .. Tensor.dtype(t).name .. "\0" ..
         table.concat(Tensor.size(t), ",") .. "\0")
      if Tensor.device(t) ~= "cpu" then t = Tensor.to(t, "cpu") end
      local c = Tensor.contiguous(t)
      local n = Tensor.numel(c) * Tensor.dtype(c).size
      if n > 0 then h = hash_bytes(h, C.lm_tensor_data(c._c), n) end
   end
   return bit.tohex(tonumber(bit.rshift(h, 32)), 8) ..
      bit.tohex(tonumber(bit.band(h, 0xffffffffULL)), 8)
end

-- the graph as JSON text
function M.graph_text(g)
   local vals = {}
   local ids = {}
   for id in pairs(g.values) do ids[#ids + 1] = id end
   table.sort(ids)
   for i, id in ipairs(ids) do
      local v = g.values[id]
      vals[i] = { id = id, sizes = v.sizes, dtype = v.dtype, format = v.format,
                  device = v.device, kind = v.kind, name = v.name, index = v.index }
   end
   local nodes = {}
   for i, n in ipairs(g.nodes) do
      nodes[i] = { op = n.op, args = n.args, nargs = n.nargs, outs = n.outs,
                   inplace = n.inplace or nil }
   end
   local doc = { version = G.VERSION, inputs = g.inputs, outputs = g.outputs,
                 multi = g.multi or false, values = vals, nodes = nodes,
                 warnings = g.warnings or {} }
   local text, err = json.encode(doc)
   if not text then error("lumen.jit.save: cannot encode the graph: " .. tostring(err), 0) end
   return text
end

--- g:save(path): one safetensors file with the weights and the graph
function M.save(traced, path)
   if type(path) ~= "string" or path == "" then
      error("lumen.jit.save: path must be a non-empty string, got " .. T.typename(path),
            T.user_level())
   end
   local text = M.graph_text(traced.graph)
   local tensors = {}
   for _, e in ipairs(traced:named_tensors()) do
      if e[2] == nil then
         error("lumen.jit.save: the graph's weight '" .. e[1] .. "' is missing", T.user_level())
      end
      tensors[e[1]] = Tensor.detach(e[2])
   end
   local meta = {
      ["lumen.jit.version"] = tostring(G.VERSION),
      ["lumen.jit.graph"] = text,
      ["lumen.jit.checksum"] = M.checksum(text, tensors),
   }
   S.save(tensors, path, meta)
   return path
end

---------------------------------------------------------------------------------------------
-- load
---------------------------------------------------------------------------------------------

local KINDS = { input = true, param = true, buffer = true, const = true }

local function is_int(x, min)
   return type(x) == "number" and x % 1 == 0 and x >= (min or 0) and x < 2 ^ 53
end

local function sizes_str(s) return "[" .. table.concat(s, ", ") .. "]" end

-- validate(g, tensors, bad): the structure of a decoded graph, and its weights against tensors
local function validate(g, tensors, bad)
   if type(g) ~= "table" then bad("damaged graph: not a JSON object") end
   if not is_int(g.version, 1) then bad("damaged graph: no version") end
   if g.version > G.VERSION then
      bad(("the graph is format version %d; this lumen reads version %d and older: load it " ..
         "with a newer lumen"):format(g.version, G.VERSION))
   end
   for _, k in ipairs({ "values", "nodes", "inputs" }) do
      if type(g[k]) ~= "table" then bad("damaged graph: '" .. k .. "' is not a list") end
   end
   if g.outputs == nil then bad("damaged graph: no outputs") end
   local values = {}
   for i, v in ipairs(g.values) do
      local function vbad(m) bad(("damaged graph: value %d: %s"):format(i, m)) end
      if type(v) ~= "table" then vbad("not an object") end
      if not is_int(v.id, 1) then vbad("no id") end
      if values[v.id] then vbad("id " .. v.id .. " appears twice") end
      if type(v.sizes) ~= "table" or #v.sizes > 8 then vbad("no sizes") end
      for _, s in ipairs(v.sizes) do if not is_int(s) then vbad("a size is not a count") end end
      if type(v.dtype) ~= "string" or not dtypes.lookup(v.dtype) then
         vbad("unknown dtype '" .. tostring(v.dtype) .. "'")
      end
      if v.kind ~= nil and not KINDS[v.kind] then
         vbad("unknown kind '" .. tostring(v.kind) .. "'")
      end
      if (v.kind == "param" or v.kind == "buffer" or v.kind == "const")
         and (type(v.name) ~= "string" or v.name == "") then
         vbad("a weight without a name")
      end
      if v.format ~= nil and type(v.format) ~= "string" then vbad("format is not a string") end
      values[v.id] = { sizes = v.sizes, dtype = v.dtype, format = v.format, device = v.device,
                       kind = v.kind, name = v.name, index = v.index }
   end
   g.values = values
   -- every id defined once, before it is used
   local defined = {}
   for id, v in pairs(values) do
      if v.name ~= nil then defined[id] = true end
   end
   for i, id in ipairs(g.inputs) do
      if not is_int(id, 1) or not values[id] or values[id].kind ~= "input" then
         bad(("damaged graph: input %d is not an input value"):format(i))
      end
      defined[id] = true
   end
   for i, node in ipairs(g.nodes) do
      if type(node) ~= "table" or type(node.op) ~= "string" then
         bad(("damaged graph: node %d has no operator"):format(i))
      end
      if not G.resolve(node.op) then
         bad(("node %d: unknown operator '%s'"):format(i, node.op))
      end
      if type(node.args) ~= "table" then
         bad(("damaged graph: node %d has no arguments"):format(i))
      end
      if node.nargs == nil then node.nargs = #node.args end
      if not is_int(node.nargs) or node.nargs > #node.args then
         bad(("damaged graph: node %d: argument count %s"):format(i, tostring(node.nargs)))
      end
      local used = {}
      for j = 1, node.nargs do
         if node.args[j] == nil then
            bad(("damaged graph: node %d: argument %d missing"):format(i, j))
         end
         G.enc_ids(node.args[j], used)
      end
      for _, id in ipairs(used) do
         if not defined[id] then
            bad(("damaged graph: node %d (%s) uses value %s before it is defined"):format(i,
               node.op, tostring(id)))
         end
      end
      for _, id in ipairs(G.enc_ids(node.outs, {})) do
         if not is_int(id, 1) or not values[id] or values[id].kind ~= nil or defined[id] then
            bad(("damaged graph: node %d (%s) defines value %s, which is not a new result"):format(
               i, node.op, tostring(id)))
         end
         defined[id] = true
      end
   end
   for _, id in ipairs(G.enc_ids(g.outputs, {})) do
      if not defined[id] then
         bad(("damaged graph: output value %s is not defined"):format(tostring(id)))
      end
   end
   -- the weights against the file
   local want = {}
   for _, v in pairs(values) do
      if v.name ~= nil then
         local t = tensors[v.name]
         if t == nil then
            bad(("graph/weight mismatch: the graph's weight '%s' is not in the file")
                :format(v.name))
         end
         local sz = Tensor.size(t)
         local same = #sz == #v.sizes and Tensor.dtype(t).name == v.dtype
         for k = 1, #sz do same = same and sz[k] == v.sizes[k] end
         if not same then
            bad(("graph/weight mismatch: '%s' is %s%s in the graph but %s%s in the file"):format(
               v.name, v.dtype, sizes_str(v.sizes), Tensor.dtype(t).name, sizes_str(sz)))
         end
         want[v.name] = true
      end
   end
   for name in pairs(tensors) do
      if not want[name] then
         bad(("graph/weight mismatch: the file's tensor '%s' is not in the graph"):format(name))
      end
   end
end

--- lm.jit.load(path) -> a traced module
function M.load(path)
   local level = T.user_level()
   local function bad(m)
      error(("lumen.jit.load: '%s': %s"):format(tostring(path), m), level)
   end
   if type(path) ~= "string" or path == "" then
      error("lumen.jit.load: path must be a non-empty string, got " .. T.typename(path), level)
   end
   local ok, tensors, meta = pcall(S.load, path)
   if not ok then
      local msg = tostring(tensors):gsub("^lumen%.load: ", "")
      error("lumen.jit.load: " .. msg, level)
   end
   meta = meta or {}
   local ver = meta["lumen.jit.version"]
   if ver == nil then
      bad("no graph in the file's metadata (not written by g:save; lm.load reads plain " ..
          "weight files)")
   end
   local vn = tonumber(ver)
   if not is_int(vn, 1) then
      bad("the graph format version '" .. tostring(ver) .. "' is not a number")
   end
   if vn > G.VERSION then
      bad(("the graph is format version %d; this lumen reads version %d and older: load it " ..
         "with a newer lumen"):format(vn, G.VERSION))
   end
   local text = meta["lumen.jit.graph"]
   if type(text) ~= "string" then bad("damaged graph: no graph text") end
   local sum = meta["lumen.jit.checksum"]
   if type(sum) ~= "string" then bad("no checksum in the metadata") end
   if M._verify_checksum ~= false and M.checksum(text, tensors) ~= sum then
      bad("checksum mismatch: the graph or the weights were changed after the file was saved")
   end
   local g, err = json.decode(text)
   if g == nil then bad("damaged graph: " .. tostring(err)) end
   local vok, verr = pcall(validate, g, tensors, function(m) error({ msg = m }, 0) end)
   if not vok then
      if type(verr) == "table" then bad(verr.msg) end
      bad("damaged graph: " .. tostring(verr))
   end
   -- the weights go to the device the trace had them on
   for _, v in pairs(g.values) do
      local t = v.name and tensors[v.name]
      if t and type(v.device) == "string" and v.device ~= Tensor.device(t) then
         local mok, moved = pcall(Tensor.to, t, v.device)
         if not mok then
            bad(("the graph's weight '%s' was on device %s, which cannot be used here (%s)")
                :format(v.name, v.device, tostring(moved)))
         end
         tensors[v.name] = moved
      end
   end
   for _, v in pairs(g.values) do
      if v.kind == "param" then Tensor.requires_grad_(tensors[v.name], true) end
   end
   local nok, traced = pcall(G.new, g, tensors, function(m) error({ msg = m }, 0) end)
   if not nok then
      if type(traced) == "table" then bad("damaged graph: " .. traced.msg) end
      bad("damaged graph: " .. tostring(traced))
   end
   return traced
end

return M
