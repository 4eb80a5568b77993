-- lumen.layout -- lm.layout: tools to convert a model to channels-last and to check, debug and
-- survey how memory formats propagate (memory_format.md sections 8 and 9).
--
--    lm.to_channels_last(model)                  -- model:to(lm.channels_last), in place
--    local r = lm.layout.check(model, x, {backward = true})
--    print(r)                                    -- one row per leaf-module call
--    assert(r.ok, r.first_lost)
--    lm.layout.check(model, x, {html = "report.html"}) -- also a page: the module tree coloured
--                                                 -- by format (lua/lumen/layout_report.lua)
--    local t = lm.layout.trace(function() return model(x) end)   -- which OPERATOR lost it
--    print(lm.layout.coverage())                 -- every operator, run on NCHW and NHWC
--
-- "Channels-last" is the predicate of memory_format.md section 9 (the tutorial's contains_cl):
-- 4-D, channels-last contiguous and NOT contiguous. Ambiguous tensors (both contiguous and
-- channels-last contiguous: C == 1 or H == W == 1) carry no information and count as keeping the
-- format; so does a non-dense view whose strides are still ordered like channels-last (a slice
-- of a channels-last tensor), because every kernel picks its format from
-- suggest_memory_format, which says channels-last for it.
--
-- Everything here reads the C predicates directly (no Tensor method is called on the tensors it
-- inspects), so wrapping the Tensor methods (trace) cannot recurse into the checks.

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")

local type, pairs, ipairs, tostring, tonumber, select, error, pcall, rawget, rawset,
   getmetatable, setmetatable = type, pairs, ipairs, tostring, tonumber, select, error, pcall,
   rawget, rawset, getmetatable, setmetatable
local unpack = unpack -- luacheck: ignore

local Tensor, raw = T.Tensor, T.raw

local M = {}

local function fail(fname, msg, ...)
   error(string.format("lumen.%s: " .. msg, fname, ...), T.user_level())
end

local function is_module(x)
   if type(x) ~= "table" then return false end
   local mt = getmetatable(x)
   return type(mt) == "table" and rawget(mt, "__is_module_class") == true
end

local function cdata_of(x)
   if getmetatable(x) ~= T.mt then return nil end
   return T.cdata(x)
end

local function pack(...) return { n = select("#", ...), ... } end

---------------------------------------------------------------------------------------------
-- classification
---------------------------------------------------------------------------------------------

local function has_broadcast(c)
   for d = 0, c.ndim - 1 do
      if c.strides[d] == 0 and c.sizes[d] > 1 then return true end
   end
   return false
end

-- the format of a tensor cdata, as a short name:
--   "channels_last" / "channels_last_3d"   dense in that format and not contiguous
--   "contiguous"                            dense row-major (and not channels-last dense)
--   "ambiguous_cl" / "ambiguous_cl3d"       both (C == 1 or H == W == 1), with the channels-last
--                                           tag strides (.to(lm.channels_last) made it)
--   "ambiguous"                             both, without the tag (N111, or made contiguous)
--   "cl_strided" / "cl3d_strided"           a non-dense view ordered like channels-last
--   "broadcast"                             an expanded tensor (a stride 0 over a size > 1)
--   "strided"                               anything else (a permuted or sliced view)
local function classify(c)
   local nd = c.ndim
   local ct = C.lm_is_contiguous(c, 0) ~= 0
   if nd == 4 or nd == 5 then
      local f = nd == 4 and 1 or 2
      local cl = C.lm_is_contiguous(c, f) ~= 0
      if cl and ct then
         -- both: tagged with channels-last strides (suggest_memory_format says so) or not
         if C.lm_suggest_memory_format(c, 0) == f then
            return nd == 4 and "ambiguous_cl" or "ambiguous_cl3d"
         end
         return "ambiguous"
      end
      if cl then return nd == 4 and "channels_last" or "channels_last_3d" end
      if ct then return "contiguous" end
      if has_broadcast(c) then return "broadcast" end
      if C.lm_suggest_memory_format(c, 0) == f then
         return nd == 4 and "cl_strided" or "cl3d_strided"
      end
      return "strided"
   end
   if ct then return "contiguous" end
   if has_broadcast(c) then return "broadcast" end
   return "strided"
end

--- lm.layout.format(t) -> the short format name of a tensor (see classify), or nil
function M.format(t)
   local c = cdata_of(t)
   if c == nil then return nil end
   return classify(c)
end

-- memory_format.md section 9: 4-D, channels-last contiguous, not contiguous
local function is_cl(c)
   return c.ndim == 4 and C.lm_is_contiguous(c, 1) ~= 0 and C.lm_is_contiguous(c, 0) == 0
end

--- lm.layout.is_channels_last(t): the predicate of memory_format.md section 9 (unambiguous)
function M.is_channels_last(t)
   local c = cdata_of(t)
   return c ~= nil and is_cl(c)
end

-- does a 4-D tensor keep channels-last? (cl dense, ambiguous, or a cl-ordered view)
local function keeps_cl(c)
   if c.ndim ~= 4 then return true end
   if C.lm_is_contiguous(c, 1) ~= 0 then return true end
   return C.lm_suggest_memory_format(c, 0) == 1
end

local function sizes_str(c)
   local s = {}
   for d = 0, c.ndim - 1 do s[#s + 1] = tostring(tonumber(c.sizes[d])) end
   return "(" .. table.concat(s, ",") .. ")"
end

local function strides_str(c)
   local s = {}
   for d = 0, c.ndim - 1 do s[#s + 1] = tostring(tonumber(c.strides[d])) end
   return "(" .. table.concat(s, ",") .. ")"
end

local function describe(c)
   return sizes_str(c) .. "@" .. strides_str(c) .. " " .. tostring(dtypes.from_id(c.dtype)) ..
      " " .. classify(c)
end
M._describe = describe

---------------------------------------------------------------------------------------------
-- tables
---------------------------------------------------------------------------------------------

-- render rows (arrays of strings) as an aligned text table with a header line
local function render(header, rows)
   local w = {}
   for i, h in ipairs(header) do w[i] = #h end
   for _, r in ipairs(rows) do
      for i = 1, #header do
         local s = r[i] or ""
         if #s > w[i] then w[i] = #s end
      end
   end
   local function line(r)
      local parts = {}
      for i = 1, #header do
         local s = r[i] or ""
         parts[i] = i == #header and s or (s .. string.rep(" ", w[i] - #s))
      end
      return (table.concat(parts, "  "):gsub("%s+$", ""))
   end
   local out = { line(header) }
   local dash = {}
   for i = 1, #header do dash[i] = string.rep("-", w[i]) end
   out[#out + 1] = line(dash)
   for _, r in ipairs(rows) do out[#out + 1] = line(r) end
   return table.concat(out, "\n")
end
M._render = render

---------------------------------------------------------------------------------------------
-- to_channels_last
---------------------------------------------------------------------------------------------

--- lm.to_channels_last(model) -> model: every 4-D parameter and buffer (and gradient) to
--- channels_last, every 5-D one to channels_last_3d (1x1 and depthwise weights tagged with the
--- format's strides), in place: the same parameter objects, as Module:to. A model mixing 2-D and
--- 3-D layers converts each to its own format (model:to(lm.channels_last) raises PyTorch's rank
--- error on the 5-D tensors instead). A tensor argument returns the tensor in its rank's format.
local function cl_format_of(t)
   local d = Tensor.dim(t)
   if d == 4 then return dtypes.channels_last end
   if d == 5 then return dtypes.channels_last_3d end
   return nil
end

function M.to_channels_last(model)
   local fname = "to_channels_last"
   if T.is_tensor(model) then
      local fmt = cl_format_of(model)
      if fmt == nil then return Tensor.to(model, dtypes.channels_last) end -- the rank error
      return Tensor.to(model, fmt)
   end
   if not is_module(model) then
      fail(fname, "expected a Module (or a tensor), got %s", T.typename(model))
   end
   return model:_convert_tensors(function(t)
      local fmt = cl_format_of(t)
      if fmt == nil then return t end
      return raw.to(t, { memory_format = fmt })
   end)
end

---------------------------------------------------------------------------------------------
-- check: module-level report, forward and backward
---------------------------------------------------------------------------------------------

local Report = {}
Report.__index = Report

local function row_name(r)
   local p = r.path == "" and "(model)" or r.path
   if r.call > 1 then p = p .. " #" .. r.call end
   return p
end

function Report.__tostring(r)
   local header = { "module", "type", "input", "output", "output size" }
   if r.backward then
      header[#header + 1] = "grad (output)"
      header[#header + 1] = "weight grad"
   end
   local rows = {}
   for _, row in ipairs(r.rows) do
      local mark = ""
      if row.lost then
         mark = "  <-- lost channels_last" ..
            (row.lost_ops and (" (by " .. table.concat(row.lost_ops, ", ") .. ")") or "")
      end
      if row.grad_note then mark = mark .. "  (output gradient " .. row.grad_note .. ")" end
      if row.grad_lost then
         mark = mark .. "  <-- output gradient not channels_last" ..
            (row.grad_from and (" (from " .. row.grad_from .. ")") or "")
      end
      local line = { row_name(row), row.type, row.input_format or "-", row.output_format or "-",
                     row.output_size or "-" }
      if r.backward then
         line[#line + 1] = row.grad_format or "-"
         line[#line + 1] = (row.param_grad_format or "-") .. mark
      else
         line[#line] = line[#line] .. mark
      end
      rows[#rows + 1] = line
   end
   local lines = { render(header, rows), "" }
   lines[#lines + 1] = "ok: " .. tostring(r.ok)
   lines[#lines + 1] = "input: " .. tostring(r.input_format)
   if r.first_lost then
      lines[#lines + 1] = "first module to lose channels_last: " .. r.first_lost
   elseif #r.non_cl > 0 then
      lines[#lines + 1] = ("%d leaf-module output(s) are 4-D and not channels-last (first: %s); " ..
         "was the model converted (lm.to_channels_last)?"):format(#r.non_cl, r.non_cl[1])
   else
      lines[#lines + 1] = "every 4-D module output is channels-last"
   end
   if r.backward then
      if r.backward_skipped then
         lines[#lines + 1] = "backward skipped: " .. r.backward_skipped
      else
         if r.first_grad_lost then
            lines[#lines + 1] = "first module whose output gradient is not channels-last " ..
               "(backward order): " .. r.first_grad_lost ..
               (r.first_grad_lost_by and (" (the gradient comes from " .. r.first_grad_lost_by ..
                ")") or "")
         end
         if r.params_ok then
            lines[#lines + 1] = ("4-D parameter gradients: all %d channels-last")
               :format(r.n_params4)
         else
            lines[#lines + 1] = ("4-D parameter gradients: %d of %d NOT channels-last: %s")
               :format(#r.bad_params, r.n_params4, table.concat(r.bad_params, ", "))
         end
      end
   end
   return table.concat(lines, "\n")
end

--- report:to_html(path) -> the report as a self-contained HTML page (string); with a path, also
--- written there. The page is made by lua/lumen/layout_report.lua.
function Report.to_html(r, path)
   if getmetatable(r) ~= Report then
      fail("layout.Report.to_html", "call it as report:to_html(path)")
   end
   if path ~= nil and type(path) ~= "string" then
      fail("layout.Report.to_html", "path must be a string, got %s", T.typename(path))
   end
   local html = require("lumen.layout_report").html(r)
   if path then
      local f, err = io.open(path, "wb")
      if not f then fail("layout.Report.to_html", "cannot write %s: %s", path, tostring(err)) end
      local ok, werr = f:write(html)
      f:close()
      if not ok then fail("layout.Report.to_html", "cannot write %s: %s", path, tostring(werr)) end
   end
   return html
end

local CHECK_OPTIONS = { backward = true, loss = true, html = true, trace = true }
local TRACE_OPTIONS = { raise = true, on_lost = true }
local COVERAGE_OPTIONS = { shape = true, backward = true, only = true }

-- the tensor results of a forward (first tensor among the results)
local function first_tensor(res)
   for i = 1, res.n do
      if T.is_tensor(res[i]) then return res[i] end
   end
   return nil
end

--- lm.layout.check(model, input, {backward = true, loss = fn, trace = false, html = path})
--- -> report
--- Runs one forward (and one backward) with every leaf module's forward wrapped, then restores
--- everything: the forwards, the parameters' .grad, and the buffers (batch-norm running stats
--- updated by a training-mode forward are put back). input is a tensor or an array of
--- arguments. loss(output) -> scalar defaults to output:sum(). trace = true also runs the forward
--- under lm.layout.trace: report.trace is that report, and a row that lost channels-last gets
--- row.lost_ops (the operators, e.g. "Tensor.contiguous"). html = path writes
--- report:to_html(path) (and implies trace). report.modules lists every module {path, type}.
function M.check(model, input, opts)
   local fname = "layout.check"
   if not is_module(model) then fail(fname, "expected a Module, got %s", T.typename(model)) end
   local args
   if T.is_tensor(input) then args = { n = 1, input }
   elseif type(input) == "table" and getmetatable(input) == nil then
      args = { n = #input, unpack(input) }
   else
      fail(fname, "input must be a tensor or an array of arguments, got %s", T.typename(input))
   end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table {backward =, loss =, trace =, html =}, got %s",
           T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if not CHECK_OPTIONS[k] then fail(fname, "unknown option '%s'", tostring(k)) end
   end
   if opts.html ~= nil and (type(opts.html) ~= "string" or opts.html == "") then
      fail(fname, "html must be a file name (string), got %s", T.typename(opts.html))
   end
   local want_trace = opts.trace == true or opts.html ~= nil
   local backward = opts.backward ~= false
   if opts.loss ~= nil and type(opts.loss) ~= "function" then
      fail(fname, "loss must be a function(output) -> scalar tensor")
   end

   local report = setmetatable({ rows = {}, backward = backward, non_cl = {}, bad_params = {},
                                 n_params4 = 0 }, Report)
   local first_in = cdata_of(args[1])
   report.input_format = first_in and classify(first_in) or "-"

   -- leaf modules (and every module, for the report's tree)
   local leaves = {}
   report.modules = {}
   for _, pm in ipairs(model:named_modules()) do
      report.modules[#report.modules + 1] = { path = pm[1], type = pm[2]:type_name() }
      if #pm[2]:named_children() == 0 then leaves[#leaves + 1] = { path = pm[1], m = pm[2] } end
   end

   -- snapshots: buffers (running stats), existing gradients
   local buffers, grads = {}, {}
   A.no_grad(function()
      for _, nt in ipairs(model:named_buffers()) do
         buffers[#buffers + 1] = { nt[2], raw.clone(nt[2]) }
      end
   end)
   local params = model:named_parameters()
   for i, nt in ipairs(params) do
      grads[i] = rawget(nt[2], "grad")
      rawset(nt[2], "grad", nil)
   end
   local input_grads = {}
   for i = 1, args.n do
      if T.is_tensor(args[i]) then input_grads[i] = rawget(args[i], "grad") end
   end

   -- wrap the leaf forwards
   local current_row -- the leaf call running now (trace's losses are put on it)
   local hooks = {}
   local calls = {}
   local saved = {}
   for _, leaf in ipairs(leaves) do
      local m = leaf.m
      saved[#saved + 1] = { m, rawget(m, "forward") }
      local orig = m.forward
      rawset(m, "forward", function(self, ...)
         calls[m] = (calls[m] or 0) + 1
         local row = { path = leaf.path, type = m:type_name(), call = calls[m], module = m }
         report.rows[#report.rows + 1] = row
         row._in = (...)
         local xc = cdata_of((...))
         if xc ~= nil then
            row.input_format = classify(xc)
            row.input_size = sizes_str(xc)
            row._in_cl = is_cl(xc)
         end
         local outer = current_row
         current_row = row
         local res = pack(orig(self, ...))
         current_row = outer
         local out = first_tensor(res)
         local oc = out and cdata_of(out)
         row._out = out
         if oc ~= nil then
            row.output_format = classify(oc)
            row.output_size = sizes_str(oc)
            row._out_ndim = oc.ndim
            row._out_keeps = keeps_cl(oc)
            row._out_cl_like = oc.ndim == 4 and keeps_cl(oc)
            if backward and A.is_grad_enabled() and rawget(out, "requires_grad") == true then
               hooks[#hooks + 1] = Tensor.register_hook(out, function(g)
                  local gc = cdata_of(g)
                  if gc ~= nil then
                     row.grad_format = classify(gc)
                     row._grad_c = { ndim = gc.ndim, keeps = keeps_cl(gc),
                                     broadcast = has_broadcast(gc) }
                  end
               end)
            end
         end
         return unpack(res, 1, res.n)
      end)
   end

   -- reshapes to a lower rank (flatten before a classifier) seen during the forward: their
   -- backward hands a contiguous gradient to a channels-last tensor, as in PyTorch; that is
   -- shown, not counted as a loss
   local flattened = setmetatable({}, { __mode = "k" })
   local F = require("lumen.functional")
   local reshapers = { { Tensor, "reshape" }, { Tensor, "view" }, { Tensor, "flatten" },
                       { F, "flatten" } }
   for _, rp in ipairs(reshapers) do
      local tbl, key = rp[1], rp[2]
      local f = rawget(tbl, key)
      rp[3] = f
      rawset(tbl, key, function(self, ...)
         local out = f(self, ...)
         local ic, oc = cdata_of(self), cdata_of(out)
         if ic ~= nil and oc ~= nil and oc.ndim < ic.ndim then flattened[self] = true end
         return out
      end)
   end
   local function unwrap_reshapers()
      for i = #reshapers, 1, -1 do
         local rp = reshapers[i]
         if rp[3] ~= nil then rawset(rp[1], rp[2], rp[3]); rp[3] = nil end
      end
   end

   local function restore()
      unwrap_reshapers()
      for i = #saved, 1, -1 do rawset(saved[i][1], "forward", saved[i][2]) end
      for _, h in ipairs(hooks) do pcall(h.remove) end
      for i, nt in ipairs(params) do rawset(nt[2], "grad", grads[i]) end
      for i = 1, args.n do
         if T.is_tensor(args[i]) then rawset(args[i], "grad", input_grads[i]) end
      end
      A.no_grad(function()
         for _, b in ipairs(buffers) do raw.copy_(b[1], b[2]) end
      end)
   end

   local function on_lost(l)
      local row = current_row
      if row then
         row.lost_ops = row.lost_ops or {}
         row.lost_ops[#row.lost_ops + 1] = l.op
      end
   end

   local ok, err = pcall(function()
      local res
      if want_trace then
         -- trace wraps the operators over the reshape wrappers above and puts them back first
         local tr = pack(M.trace(function() return model:forward(unpack(args, 1, args.n)) end,
                                 { on_lost = on_lost }))
         report.trace = tr[1]
         report.trace.results = nil -- the report must not keep the model's outputs alive
         res = { n = tr.n - 1, unpack(tr, 2, tr.n) }
      else
         res = pack(model:forward(unpack(args, 1, args.n)))
      end
      unwrap_reshapers()
      for i = #saved, 1, -1 do rawset(saved[i][1], "forward", saved[i][2]) end
      local out = first_tensor(res)
      report.output_format = out and classify(cdata_of(out)) or "-"
      if backward then
         local loss
         if opts.loss then loss = opts.loss(unpack(res, 1, res.n))
         elseif out ~= nil then
            loss = out
            if Tensor.numel(out) ~= 1 then loss = Tensor.sum(out) end
         end
         if not T.is_tensor(loss) then
            report.backward_skipped = "the loss is not a tensor"
         elseif rawget(loss, "requires_grad") ~= true then
            report.backward_skipped = "the output does not require grad (no parameter needs " ..
               "a gradient, or grad mode is off)"
         else
            Tensor.backward(loss)
         end
      end
   end)
   if not ok then
      -- read the parameter gradients (if any) before restoring, then rethrow
      restore()
      error(err, 0)
   end

   -- parameter gradients (read before the old .grad are put back)
   local leaf_of_param = {}
   for _, leaf in ipairs(leaves) do
      for _, nt in ipairs(leaf.m:named_parameters()) do leaf_of_param[nt[2]] = leaf end
   end
   local pgrad = {}
   if backward and not report.backward_skipped then
      for _, nt in ipairs(params) do
         local p = nt[2]
         local pc = cdata_of(p)
         if pc ~= nil and pc.ndim == 4 then
            report.n_params4 = report.n_params4 + 1
            local g = rawget(p, "grad")
            local gc = g and cdata_of(g)
            local f = gc and classify(gc) or "none"
            local good = gc ~= nil and C.lm_is_contiguous(gc, 1) ~= 0
            if not good then
               report.bad_params[#report.bad_params + 1] = nt[1] .. " (" .. f .. ")"
            end
            local leaf = leaf_of_param[p]
            if leaf then pgrad[leaf.m] = f end
         end
      end
   end
   restore()

   -- verdicts
   local rows = report.rows
   for i, row in ipairs(rows) do
      row.param_grad_format = pgrad[row.module]
      if row._out_ndim == 4 and not row._out_keeps then
         report.non_cl[#report.non_cl + 1] = row_name(row)
         if row._in_cl then
            row.lost = true
            if not report.first_lost then report.first_lost = row.path end
         end
      end
      local gcl = row._grad_c
      if gcl and row._out_cl_like and gcl.ndim == 4 and not gcl.keeps and not gcl.broadcast then
         -- who handed this gradient back: the leaf modules that consumed the output
         local consumers, all_reshape = {}, true
         for j, r2 in ipairs(rows) do
            if j ~= i and r2._in ~= nil and rawequal(r2._in, row._out) then
               consumers[#consumers + 1] = row_name(r2)
               if r2._out_ndim == 4 then all_reshape = false end
            end
         end
         row.grad_from = #consumers > 0 and table.concat(consumers, ", ") or nil
         if row._out ~= nil and flattened[row._out] then
            row.grad_from = row.grad_from or "a reshape to a lower rank"
            all_reshape = true
            consumers[#consumers + 1] = "reshape"
         end
         if #consumers > 0 and all_reshape then
            -- a flatten / reshape to a lower rank: its backward is a view of a contiguous
            -- gradient (as in PyTorch); shown, not counted as a loss
            row.grad_note = "from " .. row.grad_from .. " (rank change)"
         else
            row.grad_lost = true
            report.first_grad_lost = row.path   -- the latest in forward order runs first backward
            report.first_grad_lost_by = row.grad_from
         end
      end
   end
   for _, row in ipairs(rows) do
      row._in_cl, row._out_ndim, row._out_keeps, row._out_cl_like, row._grad_c = nil, nil, nil,
         nil, nil
      row._in, row._out, row.module = nil, nil, nil
   end
   report.params_ok = #report.bad_params == 0
   report.ok = report.first_lost == nil and #report.non_cl == 0
   if backward and not report.backward_skipped then
      report.ok = report.ok and report.params_ok and report.first_grad_lost == nil
   end
   if opts.html then Report.to_html(report, opts.html) end
   return report
end

---------------------------------------------------------------------------------------------
-- trace: which operator lost channels-last
---------------------------------------------------------------------------------------------

-- Tensor methods that only inspect (never produce a tensor from a tensor)
local INSPECT = {
   size = true, stride = true, dim = true, ndimension = true, numel = true, nelement = true,
   dtype = true, device = true, storage_offset = true, is_floating_point = true,
   is_contiguous = true, is_non_overlapping_and_dense = true, suggest_memory_format = true,
   is_same_storage = true, item = true, totable = true, free = true, is_leaf = true,
   requires_grad_ = true, register_hook = true, retain_grad = true, backward = true,
   equal = true, allclose = true,
}
-- lm.* functions that are not operators
local LM_SKIP = {
   no_grad = true, enable_grad = true, is_grad_enabled = true, set_grad_enabled = true,
   manual_seed = true, initial_seed = true, set_num_threads = true, get_num_threads = true,
   is_tensor = true, save = true, load = true, save_checkpoint = true, load_checkpoint = true,
   to_channels_last = true,
}

local Trace = {}
Trace.__index = Trace

function Trace.__tostring(r)
   local lines = {}
   if r.ok then
      lines[1] = ("no operator lost channels_last (%d operator calls traced, %d with a " ..
         "channels-last input)"):format(r.calls, r.cl_calls)
      return lines[1]
   end
   lines[1] = ("%d operator call(s) lost channels_last (%d calls traced, %d with a " ..
      "channels-last input):"):format(#r.lost, r.calls, r.cl_calls)
   local rows = {}
   for i, l in ipairs(r.lost) do
      rows[i] = { tostring(i), l.op, l.chain_str, l.input, l.output }
   end
   lines[2] = render({ "#", "operator", "called from", "channels-last input", "output" }, rows)
   lines[3] = "first: " .. r.message
   return table.concat(lines, "\n")
end

local function chain_string(stack, depth)
   local parts = {}
   for i = 1, depth - 1 do parts[i] = stack[i] end
   return #parts > 0 and table.concat(parts, " > ") or "-"
end

-- every tensor among the arguments (and inside array arguments, one level deep)
local function cl_input(args)
   for i = 1, args.n do
      local a = args[i]
      local c = cdata_of(a)
      if c ~= nil then
         if is_cl(c) then return c end
      elseif type(a) == "table" and getmetatable(a) == nil then
         for j = 1, #a do
            local cj = cdata_of(a[j])
            if cj ~= nil and is_cl(cj) then return cj end
         end
      end
   end
   return nil
end

--- lm.layout.trace(fn, {raise = false}) -> report, fn's results
--- Runs fn() with every operator wrapped: the functional ops (lm.F.*), the Tensor methods (so
--- also + - * / on tensors) and the lm.* functions. A call that receives an unambiguously
--- channels-last tensor and returns a 4-D tensor that is not channels-last is recorded
--- (report.lost, in call order; report.first, report.message). With {raise = true} the first
--- one raises "lumen.layout.trace: Operator `X` lost channels_last property ..." at once.
--- {on_lost = function(entry)} is called with each entry as it is recorded (check uses it).
--- Everything is restored afterwards, also when fn raises.
function M.trace(fn, opts)
   local fname = "layout.trace"
   if type(fn) ~= "function" then fail(fname, "expected a function, got %s", T.typename(fn)) end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table {raise =}, got %s", T.typename(opts))
   end
   for k in pairs(opts or {}) do
      if not TRACE_OPTIONS[k] then fail(fname, "unknown option '%s'", tostring(k)) end
   end
   local raise = opts and opts.raise or false
   local on_lost = opts and opts.on_lost
   if on_lost ~= nil and type(on_lost) ~= "function" then
      fail(fname, "on_lost must be a function(entry), got %s", T.typename(on_lost))
   end
   local lm = require("lumen")
   local F = require("lumen.functional")
   local report = setmetatable({ lost = {}, calls = 0, cl_calls = 0, ok = true, ops = {} }, Trace)
   local stack, depth = {}, 0
   local patched = {}

   local function wrap(tbl, key, name)
      local f = rawget(tbl, key)
      if type(f) ~= "function" then return end
      patched[#patched + 1] = { tbl, key, f }
      rawset(tbl, key, function(...)
         local args = pack(...)
         depth = depth + 1
         stack[depth] = name
         report.calls = report.calls + 1
         report.ops[name] = (report.ops[name] or 0) + 1
         local incl = cl_input(args)
         local res = pack(pcall(f, ...))
         local my_depth = depth
         stack[depth] = nil
         depth = depth - 1
         if not res[1] then error(res[2], 0) end
         if incl ~= nil then
            report.cl_calls = report.cl_calls + 1
            local oc = cdata_of(res[2])
            if oc ~= nil and oc.ndim == 4 and not keeps_cl(oc) then
               local saved_stack = {}
               for i = 1, my_depth - 1 do saved_stack[i] = stack[i] end
               saved_stack[my_depth] = name
               local l = { op = name, chain = saved_stack,
                           chain_str = chain_string(saved_stack, my_depth),
                           input = describe(incl), output = describe(oc) }
               report.lost[#report.lost + 1] = l
               if on_lost then on_lost(l) end
               if report.ok then
                  report.ok = false
                  report.first = l
                  report.message = ("Operator `%s`%s lost channels_last property: " ..
                     "channels-last input %s -> output %s"):format(name,
                     l.chain_str ~= "-" and (" (called from " .. l.chain_str .. ")") or "",
                     l.input, l.output)
               end
               if raise then
                  error("lumen.layout.trace: " .. report.message, 0)
               end
            end
         end
         return unpack(res, 2, res.n)
      end)
   end

   local ok, err = pcall(function()
      local keys = {}
      for k, v in pairs(F) do
         if type(v) == "function" and type(k) == "string" and k:sub(1, 1) ~= "_" then
            keys[#keys + 1] = k
         end
      end
      for _, k in ipairs(keys) do wrap(F, k, "F." .. k) end
      keys = {}
      for k, v in pairs(Tensor) do
         if type(v) == "function" and type(k) == "string" and not INSPECT[k] then
            keys[#keys + 1] = k
         end
      end
      for _, k in ipairs(keys) do wrap(Tensor, k, "Tensor." .. k) end
      keys = {}
      for k, v in pairs(lm) do
         if type(v) == "function" and type(k) == "string" and not LM_SKIP[k] then
            keys[#keys + 1] = k
         end
      end
      for _, k in ipairs(keys) do wrap(lm, k, "lm." .. k) end
   end)
   local results
   if ok then
      results = pack(pcall(fn))
      ok, err = results[1], results[2]
   end
   for i = #patched, 1, -1 do
      local p = patched[i]
      rawset(p[1], p[2], p[3])
   end
   if not ok then error(err, 0) end
   report.results = { n = results.n - 1, unpack(results, 2, results.n) }
   return report, unpack(results, 2, results.n)
end

---------------------------------------------------------------------------------------------
-- coverage: run every operator on NCHW and NHWC inputs
---------------------------------------------------------------------------------------------

-- Operators with sample-argument builders. Each run(x, s) gets the input x (NCHW or NHWC, shape
-- s.shape, positive values) and a context s with weights made in the same format as x (as after
-- lm.to_channels_last), and returns the result. grad = false: not differentiable.
local function operator_list(lm)
   local F = lm.F
   local ops = {}
   local function add(kind, op, run, extra)
      local e = { kind = kind, op = op, run = run }
      for k, v in pairs(extra or {}) do e[k] = v end
      ops[#ops + 1] = e
   end
   -- elementwise, unary
   for _, name in ipairs({ "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh",
      "square", "reciprocal", "sin", "cos", "log1p", "expm1" }) do
      add("unary", name, function(x) return x[name](x) end)
   end
   for _, name in ipairs({ "sign", "floor", "ceil", "round" }) do
      add("unary", name, function(x) return x[name](x) end, { grad = false })
   end
   add("unary", "logical_not", function(x) return x:logical_not() end, { grad = false })
   add("unary", "clamp", function(x) return x:clamp(0.2, 0.8) end)
   add("unary", "relu_ (in place)", function(x) return x:clone():relu_() end, { grad = false })
   -- elementwise, binary (both operands in the input's format)
   for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2" }) do
      add("binary", name, function(x, s) return x[name](x, s.y) end)
   end
   for _, name in ipairs({ "eq", "lt", "ge", "fmod", "logical_and" }) do
      add("binary", name, function(x, s) return x[name](x, s.y) end, { grad = false })
   end
   add("binary", "add (scalar)", function(x) return x + 2 end)
   add("binary", "add (bias 1xCx1x1)", function(x, s) return x + s.bias4 end)
   add("binary", "mul (gate NxCx1x1)", function(x, s) return x * s.gate end)
   add("binary", "add (x + NCHW y)", function(x, s) return x + s.y_nchw end)
   add("binary", "add_ (in place)", function(x, s) return x:clone():add_(s.y) end, { grad = false })
   add("ternary", "addcmul", function(x, s) return x:addcmul(s.y, s.y, 0.5) end)
   add("ternary", "addcdiv", function(x, s) return x:addcdiv(s.y, s.y, 0.5) end)
   add("ternary", "where", function(x, s) return lm.where(s.mask, x, s.y) end)
   -- conversions and factories
   add("copy", "clone", function(x) return x:clone() end)
   add("copy", "contiguous", function(x) return x:contiguous() end)
   add("copy", "to(float64)", function(x) return x:to(lm.float64) end)
   add("copy", "to(float16)", function(x) return x:to(lm.float16) end, { grad = false })
   add("copy", "to(bfloat16)", function(x) return x:to(lm.bfloat16) end, { grad = false })
   add("copy", "to(int32)", function(x) return x:to(lm.int32) end, { grad = false })
   add("copy", "copy_ (into empty_like)", function(x) return lm.empty_like(x):copy_(x) end,
       { grad = false })
   for _, name in ipairs({ "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like" }) do
      add("factory", name, function(x) return lm[name](x) end, { grad = false })
   end
   add("factory", "full_like", function(x) return lm.full_like(x, 3) end, { grad = false })
   -- reductions
   add("reduction", "sum (all)", function(x) return x:sum() end)
   add("reduction", "sum(2, keepdim)", function(x) return x:sum(2, true) end)
   add("reduction", "sum({3,4}, keepdim)", function(x) return x:sum({ 3, 4 }, true) end)
   add("reduction", "sum(1, keepdim)", function(x) return x:sum(1, true) end)
   add("reduction", "mean({3,4}, keepdim)", function(x) return x:mean({ 3, 4 }, true) end)
   add("reduction", "mean(4, keepdim)", function(x) return x:mean(4, true) end)
   add("reduction", "amax(2, keepdim)", function(x) return x:amax(2, true) end)
   add("reduction", "max(2, keepdim)", function(x) return (x:max(2, true)) end)
   add("reduction", "argmax(2, keepdim)", function(x) return x:argmax(2, true) end,
       { grad = false })
   add("reduction", "prod(4, keepdim)", function(x) return x:prod(4, true) end, { grad = false })
   -- views and shape
   add("view", "view (same sizes)", function(x) return x:view(x:size()) end)
   add("view", "reshape (same sizes)", function(x) return x:reshape(x:size()) end)
   add("view", "reshape (N, C, H*W)", function(x)
      local s = x:size()
      return x:reshape({ s[1], s[2], s[3] * s[4] })
   end)
   add("view", "permute(1,3,4,2)", function(x) return x:permute(1, 3, 4, 2) end)
   add("view", "transpose(3,4)", function(x) return x:transpose(3, 4) end)
   add("view", "narrow(2, 1, C/2)", function(x) return x:narrow(2, 1, x:size(2) / 2) end)
   add("view", "narrow(3, 2, H-2)", function(x) return x:narrow(3, 2, x:size(3) - 2) end)
   add("view", "select(1, 1)", function(x) return x:select(1, 1) end)
   add("view", "unsqueeze(1)", function(x) return x:unsqueeze(1) end)
   add("view", "expand (gate NxCx1x1)", function(x, s) return s.gate:expand(x:size()) end,
       { grad = false })
   add("view", "flatten(2)", function(x) return x:flatten(2) end)
   add("join", "cat(dim 2, channels)", function(x, s) return lm.cat({ x, s.y }, 2) end)
   add("join", "cat(dim 1, batch)", function(x, s) return lm.cat({ x, s.y }, 1) end)
   add("join", "cat(x, NCHW y, dim 2)", function(x, s) return lm.cat({ x, s.y_nchw }, 2) end)
   add("join", "stack(dim 1)", function(x, s) return lm.stack({ x, s.y }, 1) end)
   -- nn.functional
   add("conv", "conv2d 3x3", function(x, s) return F.conv2d(x, s.w3, s.b, { padding = 1 }) end)
   add("conv", "conv2d 1x1", function(x, s) return F.conv2d(x, s.w1, nil) end)
   add("conv", "conv2d 3x3 stride 2", function(x, s)
      return F.conv2d(x, s.w3, s.b, { padding = 1, stride = 2 })
   end)
   add("conv", "conv2d grouped (g=4)", function(x, s)
      return F.conv2d(x, s.wg, nil, { padding = 1, groups = 4 })
   end)
   add("conv", "conv2d depthwise", function(x, s)
      return F.conv2d(x, s.wd, nil, { padding = 1, groups = s.C })
   end)
   add("conv", "conv2d dilated", function(x, s)
      return F.conv2d(x, s.w3, nil, { padding = 2, dilation = 2 })
   end)
   add("pool", "max_pool2d 3/2", function(x)
      return F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   add("pool", "avg_pool2d 2", function(x) return F.avg_pool2d(x, { kernel_size = 2 }) end)
   add("pool", "adaptive_avg_pool2d(1)", function(x) return F.adaptive_avg_pool2d(x, 1) end)
   add("pool", "adaptive_avg_pool2d(7)", function(x) return F.adaptive_avg_pool2d(x, 7) end)
   add("pool", "adaptive_max_pool2d(5)", function(x) return (F.adaptive_max_pool2d(x, 5)) end)
   add("norm", "batch_norm (train)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = true })
   end)
   add("norm", "batch_norm (eval)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = false })
   end)
   add("activation", "F.relu", function(x) return F.relu(x) end)
   add("activation", "F.dropout (train)", function(x) return F.dropout(x, 0.5, true) end)
   add("activation", "softmax(2)", function(x) return F.softmax(x, 2) end)
   add("activation", "log_softmax(2)", function(x) return F.log_softmax(x, 2) end)
   add("linear", "linear (on W)", function(x, s) return F.linear(x, s.lw, s.lb) end)
   add("linear", "matmul (x @ W x W)", function(x, s) return x:matmul(s.mm) end)
   add("linear", "F.flatten(x, 2)", function(x) return F.flatten(x, 2) end)
   add("loss", "mse_loss (none)", function(x, s)
      return F.mse_loss(x, s.y, { reduction = "none" })
   end)
   add("loss", "cross_entropy (N,C,H,W)", function(x, s) return F.cross_entropy(x, s.target) end)
   return ops
end

local Coverage = {}
Coverage.__index = Coverage

local function yes_no(v)
   if v == nil then return "-" end
   return v and "yes" or "NO"
end

function Coverage.__tostring(r)
   local rows = {}
   for _, row in ipairs(r.rows) do
      rows[#rows + 1] = { row.op, row.kind, row.nchw, row.nhwc, yes_no(row.preserves), row.native,
                          row.grad_nhwc or "-" }
   end
   local s = render({ "operator", "kind", "NCHW input ->", "NHWC input ->", "keeps CL",
                      "native", "grad (NHWC)" }, rows)
   return s .. "\n\n" .. r.legend
end

local LEGEND = table.concat({
   "NCHW / NHWC input -> the format of the result when the inputs (and weights) are contiguous /",
   "  channels-last: channels_last, contiguous, ambiguous (both: C == 1 or H == W == 1;",
   "  ambiguous_cl: with the channels-last tag strides),",
   "  cl_strided (a channels-last-ordered view), strided, broadcast, or an error; (k-D) for other",
   "  ranks. keeps CL: a 4-D result of the NHWC input is channels-last, ambiguous or cl_strided",
   "  ('-': the result is not 4-D). native: the formats the operator computes in place of its",
   "  input layout, i.e. without allocating a temporary copy of the input (measured: the",
   "  allocator's peak bytes during the call minus what is still live after it, single-threaded;",
   "  a format is NOT native when it needs >= 90% of an input's bytes more temporary memory than",
   "  the other format). grad (NHWC): the format of the gradient the backward hands to the NHWC",
   "  input (seed: ones in the result's format).",
}, "\n")

--- lm.layout.coverage({shape = {2, 32, 96, 96}, backward = true, only = {op names}}) -> report
--- Runs every operator of the list on an NCHW input and on the same values in NHWC (weights
--- converted alike) and reports, per operator, the result formats, whether channels-last is kept,
--- which formats run natively, and the gradient format. report.rows[i] = {op=, kind=, nchw=,
--- nhwc=, preserves=, native=, native_nchw=, native_nhwc=, temp_bytes = {nchw=, nhwc=},
--- input_bytes=, grad_nhwc=, grad_nchw=, errors = {nchw=, nhwc=}}; report.by_op[name] = row.
function M.coverage(opts)
   local fname = "layout.coverage"
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table {shape =, backward =, only =}, got %s", T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if not COVERAGE_OPTIONS[k] then fail(fname, "unknown option '%s'", tostring(k)) end
   end
   local lm = require("lumen")
   local memory = require("lumen.memory")
   local shape = opts.shape or { 2, 32, 96, 96 }
   if type(shape) ~= "table" or #shape ~= 4 then fail(fname, "shape must be {N, C, H, W}") end
   local N, Cc, H, W = shape[1], shape[2], shape[3], shape[4]
   if Cc % 8 ~= 0 or Cc < 8 or H < 8 or W < 8 or N < 1 then
      fail(fname, "shape needs C a multiple of 8 and H, W >= 8, got (%d,%d,%d,%d)", N, Cc, H, W)
   end
   local backward = opts.backward ~= false
   local only
   if opts.only then
      only = {}
      for _, n in ipairs(opts.only) do only[n] = true end
   end

   local ops = operator_list(lm)
   local report = setmetatable({ rows = {}, by_op = {}, shape = shape, legend = LEGEND }, Coverage)

   -- inputs and weights, made once (same values in both formats)
   local base = A.no_grad(function()
      local s = {}
      s.x = lm.rand(shape) + 0.1
      s.y = lm.rand(shape) + 0.1
      s.bias4 = lm.rand({ 1, Cc, 1, 1 })
      s.gate = lm.rand({ N, Cc, 1, 1 })
      s.mask = lm.rand(shape):gt(0.5)
      s.w3 = lm.randn({ Cc, Cc, 3, 3 }) * 0.05
      s.w1 = lm.randn({ Cc, Cc, 1, 1 }) * 0.1
      s.wg = lm.randn({ Cc, Cc / 4, 3, 3 }) * 0.1
      s.wd = lm.randn({ Cc, 1, 3, 3 }) * 0.1
      s.b = lm.randn({ Cc })
      s.rm, s.rv = lm.zeros({ Cc }), lm.ones({ Cc })
      s.gamma, s.beta = lm.ones({ Cc }), lm.zeros({ Cc })
      s.lw, s.lb = lm.randn({ 16, W }) * 0.1, lm.zeros({ 16 })
      s.mm = lm.randn({ W, W }) * 0.1
      s.target = lm.randint(1, Cc + 1, { N, H, W })
      s.C = Cc
      return s
   end)
   local four_d = { x = true, y = true, bias4 = true, gate = true, mask = true, w3 = true,
                    w1 = true, wg = true, wd = true }
   local function context(cl)
      local s = {}
      for k, v in pairs(base) do
         if cl and four_d[k] then s[k] = raw.to(v, dtypes.channels_last) else s[k] = v end
      end
      s.y_nchw = base.y
      -- batch-norm running stats are updated in place: fresh ones per run
      s.rm, s.rv = raw.clone(base.rm), raw.clone(base.rv)
      return s
   end

   local function fmt_result(c)
      local f = classify(c)
      if c.ndim ~= 4 then f = f .. " (" .. c.ndim .. "-D)" end
      return f
   end

   local prev_threads = C.lm_get_num_threads()
   local prev_limit = memory.soft_limit()
   C.lm_set_num_threads(1)
   memory.set_soft_limit(2 ^ 50)

   -- the bytes a call needs beyond what it leaves live: the host allocator's, plus the device
   -- allocator's when the tensors are on a GPU (its kernels' workspace; in the emulated build the
   -- CPU kernels an op falls back to still take theirs from the host)
   local gpu = nil
   do
      local dev = cdata_of(base.x).device
      if dev >= T.DEV_CUDA0 and dev < T.DEV_CUDA0 + T.NUM_CUDA then gpu = dev - T.DEV_CUDA0 end
   end
   local gstats = ffi.new("int64_t[?]", C.LM_CUDA_NSTATS)
   local function gpu_stat(which)
      if gpu == nil or C.lm_cuda_memory_stats(gpu, gstats) ~= 0 then return 0 end
      return tonumber(gstats[which])
   end

   -- run one op on one format: returns {format=, keeps=, temp=, err=, grad=}
   local function run_one(e, cl)
      local s = context(cl)
      local x = s.x
      local r = {}
      collectgarbage()
      memory.settle()
      collectgarbage("stop")
      local live0 = tonumber(C.lm_mem_live_bytes()) + gpu_stat(C.LM_CUDA_STAT_LIVE)
      C.lm_mem_reset_peak()
      if gpu then C.lm_cuda_reset_peak(gpu) end
      local ok, out = pcall(A.no_grad, e.run, x, s)
      local peak = tonumber(C.lm_mem_peak_bytes())
      local gpeak = gpu_stat(C.LM_CUDA_STAT_PEAK)
      collectgarbage("restart")
      collectgarbage()
      memory.settle()
      local live1 = tonumber(C.lm_mem_live_bytes())
      r.temp = math.max(0, peak - live1) + math.max(0, gpeak - gpu_stat(C.LM_CUDA_STAT_LIVE))
      r.base = live0
      if not ok then
         r.err = tostring(out):gsub("^.-(lumen%.)", "%1")
         r.format = "error"
         return r
      end
      local oc = cdata_of(out)
      if oc == nil then
         r.format = "-"
      else
         r.format = fmt_result(oc)
         r.ndim = oc.ndim
         r.keeps = oc.ndim == 4 and keeps_cl(oc) or nil
         if oc.ndim ~= 4 then r.keeps = nil end
      end
      -- backward: the gradient handed to the input
      if backward and e.grad ~= false and oc ~= nil and C.lm_dtype_is_floating(oc.dtype) ~= 0 then
         local xg = raw.alias(x)
         Tensor.requires_grad_(xg, true)
         local gf
         local okb, berr = pcall(function()
            Tensor.register_hook(xg, function(g)
               local gc = cdata_of(g)
               gf = gc and classify(gc) or "-"
            end)
            local s2 = context(cl)
            local o2 = e.run(xg, s2)
            if rawget(o2, "requires_grad") == true then
               Tensor.backward(o2, lm.ones_like(o2))
            end
         end)
         if okb then r.grad = gf or "-" else r.grad = "error" ; r.grad_err = berr end
      end
      return r
   end

   local ok, err = pcall(function()
      local input_bytes = N * Cc * H * W * 4
      for _, e in ipairs(ops) do
         if not only or only[e.op] then
            local a = run_one(e, false)
            local b = run_one(e, true)
            local row = { op = e.op, kind = e.kind, nchw = a.format, nhwc = b.format,
                          temp_bytes = { nchw = a.temp, nhwc = b.temp }, input_bytes = input_bytes,
                          grad_nchw = a.grad, grad_nhwc = b.grad,
                          errors = { nchw = a.err, nhwc = b.err } }
            if b.err then row.preserves = false
            elseif b.ndim == 4 then row.preserves = b.keeps and true or false end
            local margin = 0.9 * input_bytes
            row.native_nchw = a.err == nil and a.temp < b.temp + margin
            row.native_nhwc = b.err == nil and b.temp < a.temp + margin
            if row.native_nchw and row.native_nhwc then row.native = "both"
            elseif row.native_nchw then row.native = "nchw"
            elseif row.native_nhwc then row.native = "nhwc"
            else row.native = "none" end
            report.rows[#report.rows + 1] = row
            report.by_op[e.op] = row
         end
      end
   end)
   C.lm_set_num_threads(prev_threads)
   memory.set_soft_limit(prev_limit)
   if not ok then error(err, 0) end
   return report
end

-- the operator list, for documentation and specs: array of {op=, kind=}
function M.operators()
   local r = {}
   for i, e in ipairs(operator_list(require("lumen"))) do r[i] = { op = e.op, kind = e.kind } end
   return r
end

-- lumen's init calls install(lm) when lm.layout is first used
function M.install(lm)
   if rawget(lm, "to_channels_last") == nil then lm.to_channels_last = M.to_channels_last end
end

M._classify = classify
M._keeps_cl = keeps_cl
M._ffi = ffi

return M
