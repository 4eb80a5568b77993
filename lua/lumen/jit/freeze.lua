-- lumen.jit.freeze -- lm.jit.freeze(g): the inference pass pipeline over a traced graph.
--
-- Passes, in order (each is also callable on its own for the specs: M.passes.<name>(st)):
--   check        the graph was traced in evaluation mode (no batch norm or dropout in training
--                mode: a frozen graph is for inference)
--   dropout      F.dropout in evaluation mode is the identity: removed, its uses read its input
--   fold_bn      F.batch_norm(conv(x, w, b), mean, var, gamma, beta) whose convolution result
--                is used only there: folded into the convolution's weight and bias
--                (nn.utils.fuse_conv_bn_weights; the batch norm's own residual / relu options go
--                to the convolution)
--   fuse         conv -> add(., r) -> act and conv -> act (and conv -> add) become one
--                F.conv2d(x, w, b, {residual = r, relu = true}) (or act = "silu", ...): the
--                epilogue runs in the kernel. act: relu, relu6, silu, hardswish, hardsigmoid,
--                sigmoid, gelu (both forms), as F or Tensor ops (in place or not)
--   layout       (graphs with a convolution and no view of a 4-D value, whose layout a
--                change upstream could break: freeze_stats.layout_skipped says why)
--                channels-last through the graph: 4-D convolution weights are stored
--                channels-last, every layout conversion between 4-D values (contiguous(fmt),
--                to(fmt)) is removed (they cancel: lumen's operators keep channels-last), and one
--                conversion is put at each 4-D input (to channels-last) and at each 4-D output
--                (back to the format the trace gave it, when that was not channels-last)
--   dce          nodes whose results nothing uses are removed
-- A node moves only later in the graph (to the place of the last node it replaces), and only
-- when no in-place operator lies in between (it could write into one of its inputs). After the
-- passes the graph is traced again on a zero input of the recorded sizes, so every value's sizes
-- and memory format in the result are the ones the frozen graph really produces. The frozen
-- weights do not require grad (the fused epilogue runs inside the kernel).
local T = require("lumen.tensor")
local G = require("lumen.jit.graph")
local Tensor = T.Tensor

local M = {}

local function fail(msg) error("lumen.jit.freeze: " .. msg, T.user_level()) end

local function deep_copy(x)
   if type(x) ~= "table" then return x end
   local o = {}
   for k, v in pairs(x) do o[k] = deep_copy(v) end
   return o
end

---------------------------------------------------------------------------------------------
-- helpers over the encoded graph
---------------------------------------------------------------------------------------------

local function out_id(node)
   return type(node.outs) == "table" and node.outs.v or nil
end

local function arg_id(node, j)
   local a = node.args[j]
   return type(a) == "table" and a.v or nil
end

local function arg_value(node, j)
   if j > (node.nargs or #node.args) then return nil end
   return (G.decode(node.args[j], function(m) error(m) end))
end

-- the encoded options map of argument j (created when absent)
local function opts_map(node, j)
   local n = node.nargs or #node.args
   local a = node.args[j]
   if j > n or a == nil or (type(a) == "table" and a["nil"]) then
      for k = n + 1, j - 1 do node.args[k] = { ["nil"] = true } end
      a = { map = {} }
      node.args[j] = a
      node.nargs = math.max(n, j)
   end
   if type(a) ~= "table" or type(a.map) ~= "table" then return nil end
   return a.map
end

-- replace every reference to an id in subst (followed to its end)
local function resolve(subst, id)
   while subst[id] do id = subst[id] end
   return id
end

local function rewrite(e, subst)
   if type(e) ~= "table" then return end
   if e.v then e.v = resolve(subst, e.v)
   elseif e.list then for _, x in ipairs(e.list) do rewrite(x, subst) end
   elseif e.map then for _, x in pairs(e.map) do rewrite(x, subst) end end
end

local function apply_subst(st, subst)
   for _, node in ipairs(st.nodes) do
      for j = 1, node.nargs or #node.args do rewrite(node.args[j], subst) end
   end
   rewrite(st.outputs, subst)
end

local function live(st)
   local out = {}
   for _, n in ipairs(st.nodes) do
      if not n.dead then out[#out + 1] = n end
   end
   st.nodes = out
end

-- uses[id] = number of references (node arguments and graph outputs)
local function use_counts(st)
   local uses = {}
   for _, node in ipairs(st.nodes) do
      for j = 1, node.nargs or #node.args do
         for _, id in ipairs(G.enc_ids(node.args[j], {})) do uses[id] = (uses[id] or 0) + 1 end
      end
   end
   for _, id in ipairs(G.enc_ids(st.outputs, {})) do uses[id] = (uses[id] or 0) + 100 end
   return uses
end

-- the position of each node, and the node defining each value
local function index(st)
   local pos, def = {}, {}
   for i, node in ipairs(st.nodes) do
      pos[node] = i
      for _, id in ipairs(G.enc_ids(node.outs, {})) do def[id] = node end
   end
   return pos, def
end

-- may `node` (at position i) run at position j > i instead? Not when an in-place node lies in
-- between: it may write into one of node's inputs, directly or through a view or alias (the
-- graph does not track storage), so any in-place node blocks the move.
local function can_move(st, node, i, j)
   local _ = node
   for k = i + 1, j - 1 do
      local n = st.nodes[k]
      if n.inplace and not n.dead then return false end
   end
   return true
end

local CONV = { ["F.conv2d"] = true, ["F.conv3d"] = true }
local ADD = { ["Tensor.add"] = true, ["lm.add"] = true }
-- the activations a convolution's epilogue runs (F.conv2d's act option): op -> the act name
local ACT = { ["Tensor.relu"] = "relu", ["Tensor.relu_"] = "relu", ["F.relu"] = "relu",
              ["F.relu_"] = "relu", ["lm.relu"] = "relu", ["F.relu6"] = "relu6",
              ["F.silu"] = "silu", ["F.hardswish"] = "hardswish",
              ["F.hardsigmoid"] = "hardsigmoid", ["Tensor.sigmoid"] = "sigmoid",
              ["F.sigmoid"] = "sigmoid", ["lm.sigmoid"] = "sigmoid", ["F.gelu"] = "gelu" }
local CONVERT = { ["Tensor.contiguous"] = true, ["Tensor.to"] = true, ["lm.contiguous"] = true }

local function conv_fused(node)
   local o = node.args[4]
   if type(o) ~= "table" or type(o.map) ~= "table" then return false end
   local r = o.map.residual
   local a = o.map.act
   return (r ~= nil and not (type(r) == "table" and r["nil"])) or o.map.relu == true
      or (a ~= nil and a ~= "none" and not (type(a) == "table" and a["nil"]))
end

-- the epilogue activation (F.conv2d's act) node computes from its first argument alone, or nil:
-- one of ACT's ops with no argument but an inplace flag (F.gelu: its approximate option)
local function act_of(node)
   local a = ACT[node.op]
   if not a then return nil end
   local n = node.nargs or #node.args
   if a == "gelu" then
      if n > 2 then return nil end
      local ap = n == 2 and arg_value(node, 2) or nil
      if type(ap) == "table" then
         for k in pairs(ap) do if k ~= "approximate" then return nil end end
         ap = ap.approximate
      end
      if ap == nil or ap == "none" then return "gelu" end
      return ap == "tanh" and "gelu_tanh" or nil
   end
   if n == 1 then return a end
   if n ~= 2 or node.op:sub(1, 7) == "Tensor." or node.op:sub(1, 3) == "lm." then return nil end
   local ip = arg_value(node, 2)
   if type(ip) == "table" then
      for k in pairs(ip) do if k ~= "inplace" then return nil end end
      ip = ip.inplace
   end
   return (ip == nil or type(ip) == "boolean") and a or nil
end

local function same_sizes(a, b)
   if not a or not b or #a.sizes ~= #b.sizes then return false end
   for k = 1, #a.sizes do if a.sizes[k] ~= b.sizes[k] then return false end end
   return true
end

-- a fresh weight name based on base
local function fresh_name(st, base)
   local name, k = base, 1
   while st.tensors[name] ~= nil or st.taken[name] do
      k = k + 1
      name = base .. "#" .. k
   end
   st.taken[name] = true
   return name
end

-- a new weight value holding t
local function new_weight(st, name, t)
   st.next_id = st.next_id + 1
   local v = G.describe(t)
   v.kind, v.name = "param", name
   st.values[st.next_id] = v
   st.tensors[name] = t
   return st.next_id
end

---------------------------------------------------------------------------------------------
-- the passes
---------------------------------------------------------------------------------------------

local P = {}
M.passes = P

-- the dropouts that are the identity in evaluation mode
local DROPOUTS = { ["F.dropout"] = true, ["F.dropout2d"] = true, ["F.dropout3d"] = true }

function P.check(st)
   for i, node in ipairs(st.nodes) do
      if node.op == "F.batch_norm" then
         local o = arg_value(node, 6)
         if type(o) == "table" and o.training == true then
            fail(("node %d: a batch norm in training mode: trace the model after model:eval()")
                 :format(i))
         end
      elseif DROPOUTS[node.op] then
         local p, tr = arg_value(node, 2), arg_value(node, 3)
         if (tr == nil or tr == true) and p ~= 0 then
            fail(("node %d: a dropout in training mode: trace the model after model:eval()")
                 :format(i))
         end
      end
   end
end

function P.dropout(st)
   local subst, n = {}, 0
   for _, node in ipairs(st.nodes) do
      if DROPOUTS[node.op] and out_id(node) and arg_id(node, 1) then
         subst[out_id(node)] = arg_id(node, 1)
         node.dead = true
         n = n + 1
      end
   end
   live(st)
   apply_subst(st, subst)
   return n
end

local function tensor_of(st, id)
   if id == nil then return nil end
   local v = st.values[id]
   return v and v.name and st.tensors[v.name] or nil
end

function P.fold_bn(st)
   local n = 0
   local uses = use_counts(st)
   local pos, def = index(st)
   local subst = {}
   for j, bn in ipairs(st.nodes) do
      local x = bn.op == "F.batch_norm" and arg_id(bn, 1)
      local conv = x and def[x]
      if conv and CONV[conv.op] and not conv.dead and uses[x] == 1 and not conv_fused(conv) then
         local o = arg_value(bn, 6) or {}
         -- options that refer to a value (residual = %x) decode wrapped: the constants in o.t
         -- (read through the wrapper, eps fell back to 1e-5: a frozen MobileNet V3, eps 1e-3,
         -- was off by 5e-4 where its blocks add in the batch norm)
         if type(o) == "table" and o.__dyn then o = o.t end
         local W = tensor_of(st, arg_id(conv, 2))
         local B = tensor_of(st, arg_id(conv, 3))
         local rm, rv = tensor_of(st, arg_id(bn, 2)), tensor_of(st, arg_id(bn, 3))
         local gw, gb = tensor_of(st, arg_id(bn, 4)), tensor_of(st, arg_id(bn, 5))
         local ok_args = W and rm and rv and (B or not arg_id(conv, 3))
            and (gw or not arg_id(bn, 4)) and (gb or not arg_id(bn, 5))
            and o.training ~= true and type(o.eps or 1e-5) == "number"
         if ok_args and can_move(st, conv, pos[conv], j) then
            local fw, fb = require("lumen.nn.fold").fuse_conv_bn_weights(W, B, rm, rv,
               o.eps or 1e-5, gw, gb)
            fw, fb = Tensor.detach(fw), Tensor.detach(fb)
            -- a weight (or bias) used only here is replaced under its own name
            local function put(k, t, name)
               local id = arg_id(conv, k)
               if id and uses[id] == 1 then
                  st.tensors[st.values[id].name] = t
                  st.values[id] = G.describe(t)
                  st.values[id].kind, st.values[id].name = "param", name
               else
                  conv.args[k] = { v = new_weight(st, fresh_name(st, name), t) }
                  -- a bias given to F.conv2d(x, w) (two arguments) is a third one now: counted,
                  -- or opts_map below would fill it with nil before the options
                  if conv.nargs and conv.nargs < k then conv.nargs = k end
               end
            end
            local wname = st.values[arg_id(conv, 2)].name
            local base = wname:gsub("%.weight$", "")
            local bid = arg_id(conv, 3)
            put(2, fw, wname)
            put(3, fb, bid and st.values[bid].name or (base .. ".bias"))
            local bo = bn.args[6]
            if type(bo) == "table" and type(bo.map) == "table" then
               local m = opts_map(conv, 4)
               if bo.map.residual ~= nil then m.residual = bo.map.residual end
               if bo.map.relu ~= nil then m.relu = bo.map.relu end
            end
            -- the convolution takes the batch norm's place (and its result id)
            subst[out_id(bn)] = x
            st.nodes[pos[conv]] = { dead = true }
            st.nodes[j] = conv
            pos[conv] = j
            n = n + 1
         end
      end
   end
   live(st)
   apply_subst(st, subst)
   return n
end

-- phase 1 fuses chains that end in an activation; phase 2 the adds left (conv + residual, no
-- activation)
local function fuse_phase(st, phase)
   local n = 0
   local changed = true
   while changed do
      changed = false
      local uses = use_counts(st)
      local pos, def = index(st)
      for j, node in ipairs(st.nodes) do
         -- node is the last of the chain: an activation (relu, silu, ...: actn), or an add
         local conv, add, actn, r
         local act = act_of(node)
         local x = (act or ADD[node.op]) and arg_id(node, 1)
         if act and x and uses[x] == 1 then
            actn = node
            local d = def[x]
            if d and ADD[d.op] then add = d elseif d and CONV[d.op] then conv = d end
         elseif phase == 2 and ADD[node.op] and (node.nargs or #node.args) == 2 then
            add = node
         end
         if add then
            conv = nil
            local a, b = arg_id(add, 1), arg_id(add, 2)
            local da, db = a and def[a], b and def[b]
            if da and CONV[da.op] and uses[a] == 1 and a ~= b then conv, r = da, b
            elseif db and CONV[db.op] and uses[b] == 1 and a ~= b then conv, r = db, a end
            if conv and actn and uses[out_id(add)] ~= 1 then conv = nil end
            if conv and (not r or not same_sizes(st.values[r], st.values[out_id(conv)])
                         or st.values[r].dtype ~= st.values[out_id(conv)].dtype) then
               conv = nil
            end
         end
         if conv and not conv_fused(conv) and (actn or add)
            and can_move(st, conv, pos[conv], j) then
            local m = opts_map(conv, 4)
            if m then
               if r then m.residual = { v = r } end
               -- relu keeps the older option (frozen graphs saved before act existed read it)
               if actn and act == "relu" then m.relu = true
               elseif actn then m.act = act end
               local last = actn or add
               local subst = { [out_id(last)] = out_id(conv) }
               st.nodes[pos[conv]] = { dead = true }
               if add and add ~= last then add.dead = true end
               st.nodes[j] = conv
               live(st)
               apply_subst(st, subst)
               n = n + 1
               changed = true
               break
            end
         end
      end
   end
   return n
end

function P.fuse(st)
   return fuse_phase(st, 1) + fuse_phase(st, 2)
end

-- operators that need their input laid out as it was (a view of a contiguous tensor)
local LAYOUT_SENSITIVE = { ["Tensor.view"] = true, ["lm.view"] = true,
                           ["Tensor.as_strided"] = true, ["Tensor.view_as"] = true }

local function is_conversion(st, node)
   if not CONVERT[node.op] then return false end
   local x, y = arg_id(node, 1), out_id(node)
   if not x or not y then return false end
   local vx, vy = st.values[x], st.values[y]
   if not vx or not vy or #vx.sizes ~= 4 or vx.dtype ~= vy.dtype or not same_sizes(vx, vy)
      or vx.format == "strided" then
      return false
   end
   for _, n in ipairs(st.nodes) do
      if LAYOUT_SENSITIVE[n.op] and arg_id(n, 1) == y then return false end
   end
   for k = 2, node.nargs or #node.args do
      local a = arg_value(node, k)
      if not require("lumen.dtype").is_memory_format(a) then return false end
   end
   return true
end

function P.layout(st)
   local removed = 0
   local has_conv = false
   for _, node in ipairs(st.nodes) do
      if CONV[node.op] then has_conv = true end
   end
   if not has_conv then return 0 end
   -- a view (view, view_as, as_strided) of a 4-D value needs the layout the trace had: changing
   -- any format upstream could break it, so such a graph keeps its layouts
   for k, node in ipairs(st.nodes) do
      local x = LAYOUT_SENSITIVE[node.op] and arg_id(node, 1)
      if x and st.values[x] and #st.values[x].sizes >= 4 then
         st.layout_skipped = ("node %d (%s) views a 4-D value"):format(k, node.op)
         return 0
      end
   end
   local cl = require("lumen.dtype").channels_last
   -- convolution weights channels-last
   for _, node in ipairs(st.nodes) do
      local w = CONV[node.op] and arg_id(node, 2)
      local v = w and st.values[w]
      if v and v.name and #v.sizes == 4 then
         local t = st.tensors[v.name]
         if not Tensor.is_contiguous(t, cl) then
            st.tensors[v.name] = Tensor.contiguous(t, cl)
         end
         v.format = "channels_last"
      end
   end
   -- the conversions in between cancel
   local subst = {}
   for _, node in ipairs(st.nodes) do
      if is_conversion(st, node) then
         subst[out_id(node)] = arg_id(node, 1)
         node.dead = true
         removed = removed + 1
      end
   end
   live(st)
   apply_subst(st, subst)
   -- one conversion at each 4-D floating input, one at each 4-D output
   local head = {}
   local function layout_sensitive_use(id)
      for _, n in ipairs(st.nodes) do
         if LAYOUT_SENSITIVE[n.op] and arg_id(n, 1) == id then return true end
      end
      return false
   end
   for _, id in ipairs(st.inputs) do
      local v = st.values[id]
      if #v.sizes == 4 and (v.dtype == "float32" or v.dtype == "float64" or v.dtype == "float16"
                             or v.dtype == "bfloat16") and not layout_sensitive_use(id) then
         st.next_id = st.next_id + 1
         local nid = st.next_id
         st.values[nid] = { sizes = v.sizes, dtype = v.dtype, format = "channels_last",
                            device = v.device }
         head[#head + 1] = { op = "Tensor.contiguous", args = { { v = id }, { format =
            "channels_last" } }, nargs = 2, outs = { v = nid } }
         local s = { [id] = nid }
         apply_subst(st, s)
      end
   end
   for i = #head, 1, -1 do table.insert(st.nodes, 1, head[i]) end
   local k_out = 0
   local function convert_out(e)
      if type(e) ~= "table" then return e end
      if e.v then
         local v = st.values[e.v]
         k_out = k_out + 1
         local want = st.out_formats[k_out] or (v and v.format)
         if v and #v.sizes == 4 and want ~= "channels_last" and want ~= "strided" then
            st.next_id = st.next_id + 1
            local nid = st.next_id
            st.values[nid] = { sizes = v.sizes, dtype = v.dtype, format = want,
                               device = v.device }
            st.nodes[#st.nodes + 1] = { op = "Tensor.contiguous", args = { { v = e.v },
               { format = want == "contiguous" and "contiguous_format" or want } }, nargs = 2,
               outs = { v = nid } }
            return { v = nid }
         end
         return e
      end
      if e.list then for k, x in ipairs(e.list) do e.list[k] = convert_out(x) end end
      return e
   end
   st.outputs = convert_out(st.outputs)
   return removed
end

function P.dce(st)
   local n, changed = 0, true
   while changed do
      changed = false
      local uses = use_counts(st)
      for _, node in ipairs(st.nodes) do
         if not node.inplace then
            local any = false
            for _, id in ipairs(G.enc_ids(node.outs, {})) do
               if (uses[id] or 0) > 0 then any = true end
            end
            if not any then
               node.dead = true
               n = n + 1
               changed = true
            end
         end
      end
      live(st)
   end
   return n
end

---------------------------------------------------------------------------------------------
-- the pipeline
---------------------------------------------------------------------------------------------

-- state(g) -> the working copy the passes change
function M.state(traced)
   local g = traced.graph
   local st = { nodes = deep_copy(g.nodes), values = deep_copy(g.values),
                inputs = deep_copy(g.inputs), outputs = deep_copy(g.outputs), multi = g.multi,
                tensors = {}, taken = {}, next_id = 0, out_formats = {} }
   for id in pairs(st.values) do
      if id > st.next_id then st.next_id = id end
   end
   for k, id in ipairs(G.enc_ids(g.outputs, {})) do st.out_formats[k] = g.values[id].format end
   for k, t in pairs(traced.tensors) do st.tensors[k] = Tensor.detach(t) end
   return st
end

-- the traced module of a state, traced again on zeros of the recorded input sizes (fresh
-- metadata and numbering)
function M.finish(st)
   local g = { version = G.VERSION, values = st.values, nodes = st.nodes, inputs = st.inputs,
               outputs = st.outputs, multi = st.multi, warnings = {} }
   local tensors = {}
   for _, v in pairs(st.values) do
      if v.name then tensors[v.name] = st.tensors[v.name] end
   end
   local tr = G.new(g, tensors)
   local lm = require("lumen")
   local xs = {}
   for i, id in ipairs(st.inputs) do
      local v = st.values[id]
      local x = lm.zeros(v.sizes, { dtype = v.dtype, device = v.device })
      if v.format == "channels_last" then x = Tensor.contiguous(x, lm.channels_last) end
      xs[i] = x
   end
   return require("lumen.jit").trace(tr, xs)
end

--- lm.jit.freeze(g) -> a new traced module for inference; g is not changed
function M.freeze(traced)
   if getmetatable(traced) ~= G.Traced then
      fail("expected a traced module (lm.jit.trace or lm.jit.load), got " .. T.typename(traced))
   end
   local st = M.state(traced)
   local stats = {}
   P.check(st)
   stats.dropout = P.dropout(st)
   stats.fold_bn = P.fold_bn(st)
   stats.fuse = P.fuse(st)
   stats.layout = P.layout(st)
   stats.layout_skipped = st.layout_skipped
   stats.dce = P.dce(st)
   local A = require("lumen.autograd")
   local out = A.no_grad(function() return M.finish(st) end)
   out.freeze_stats = stats
   return out
end

return M
