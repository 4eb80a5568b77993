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
--    print(lm.layout.coverage())                 -- every operator, run on NCHW and NHWC (and
--                                                 -- the 3-D ones on NCDHW and NDHWC, the 1-D
--                                                 -- ones on NCL and NLC: layout_coverage.lua)
--
-- "Channels-last" is the predicate of memory_format.md section 9 (the tutorial's contains_cl):
-- 4-D, channels-last contiguous and NOT contiguous; for 5-D tensors the same with
-- channels_last_3d. A 4-D activation is expected to stay channels_last and a 5-D one
-- channels_last_3d, so a model mixing 2-D and 3-D layers is checked rank by rank. Ambiguous
-- tensors (both contiguous and channels-last contiguous: C == 1 or H == W == 1, and C == 1 or
-- D == H == W == 1 in 5-D) carry no information and count as keeping the format; so does a
-- non-dense view whose strides are still ordered like channels-last (a slice of a channels-last
-- tensor), because every kernel picks its format from suggest_memory_format, which says
-- channels-last for it. 3-D tensors (the 1-D operators' N x C x L) are named ("contiguous", or
-- "nlc" for N x L x C strides) but never judged: there is no 1-D memory format, and PyTorch's own
-- 1-D operators do not keep N x L x C (batch_norm returns contiguous, conv1d follows its weight).
--
-- Everything here reads the C predicates directly (no Tensor method is called on the tensors it
-- inspects), so wrapping the Tensor methods (trace) cannot recurse into the checks.

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local function_keys = require("lumen.util").function_keys

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

-- the channels-last format of a rank (memory_format.md section 1): its C enum value and its name
local CL_ENUM = { [4] = 1, [5] = 2 }
local CL_NAME = { [4] = "channels_last", [5] = "channels_last_3d" }
M._CL_NAME = CL_NAME

-- a 3-D N x C x L tensor with the strides of a permuted contiguous N x L x C one (the 1-D
-- "channels-last" layout, which has no memory-format constant: memory_formats.md, 1-D
-- operators); size-1 dims are skipped, as in the contiguity predicates
local function is_nlc_dense(c)
   if c.ndim ~= 3 then return false end
   local expected = 1
   for _, d in ipairs({ 1, 2, 0 }) do
      local n = tonumber(c.sizes[d])
      if n ~= 1 then
         if tonumber(c.strides[d]) ~= expected then return false end
         expected = expected * n
      end
   end
   return true
end

-- the format of a tensor cdata, as a short name:
--   "channels_last" / "channels_last_3d"   dense in that format and not contiguous
--   "contiguous"                            dense row-major (and not channels-last dense)
--   "ambiguous_cl" / "ambiguous_cl3d"       both (C == 1 or H == W == 1; 5-D: C == 1 or
--                                           D == H == W == 1), with the channels-last tag strides
--                                           (.to(lm.channels_last) made it)
--   "ambiguous"                             both, without the tag (N111, or made contiguous)
--   "cl_strided" / "cl3d_strided"           a non-dense view ordered like channels-last
--   "nlc"                                   3-D N x C x L with N x L x C strides (x:permute(1, 3,
--                                           2) of a contiguous N x L x C), not contiguous; a 3-D
--                                           tensor that is both (C == 1 or L == 1) is "ambiguous"
--   "broadcast"                             an expanded tensor (a stride 0 over a size > 1)
--   "strided"                               anything else (a permuted or sliced view)
local function classify(c)
   local nd = c.ndim
   local ct = C.lm_is_contiguous(c, 0) ~= 0
   if nd == 4 or nd == 5 then
      local f = CL_ENUM[nd]
      local cl = C.lm_is_contiguous(c, f) ~= 0
      if cl and ct then
         -- both: tagged with channels-last strides (suggest_memory_format says so) or not
         if C.lm_suggest_memory_format(c, 0) == f then
            return nd == 4 and "ambiguous_cl" or "ambiguous_cl3d"
         end
         return "ambiguous"
      end
      if cl then return CL_NAME[nd] end
      if ct then return "contiguous" end
      if has_broadcast(c) then return "broadcast" end
      if C.lm_suggest_memory_format(c, 0) == f then
         return nd == 4 and "cl_strided" or "cl3d_strided"
      end
      return "strided"
   end
   if nd == 3 and is_nlc_dense(c) then
      -- both (C == 1 or L == 1) carries no 1-D layout
      return ct and "ambiguous" or "nlc"
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

-- memory_format.md section 9, for both ranks: 4-D (5-D), channels-last (3d) contiguous, not
-- contiguous
local function is_cl(c)
   local f = CL_ENUM[c.ndim]
   return f ~= nil and C.lm_is_contiguous(c, f) ~= 0 and C.lm_is_contiguous(c, 0) == 0
end

--- lm.layout.is_channels_last(t): the predicate of memory_format.md section 9 (unambiguous)
function M.is_channels_last(t)
   local c = cdata_of(t)
   return c ~= nil and c.ndim == 4 and is_cl(c)
end

--- lm.layout.is_channels_last_3d(t): the same for 5-D tensors and channels_last_3d
function M.is_channels_last_3d(t)
   local c = cdata_of(t)
   return c ~= nil and c.ndim == 5 and is_cl(c)
end

-- does a 4-D (5-D) tensor keep channels_last (channels_last_3d)? (dense in it, ambiguous, or a
-- view ordered like it). Other ranks carry no format: always true.
local function keeps_cl(c)
   local f = CL_ENUM[c.ndim]
   if f == nil then return true end
   if C.lm_is_contiguous(c, f) ~= 0 then return true end
   return C.lm_suggest_memory_format(c, 0) == f
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

-- how the summary names the formats a report checked: 4-D outputs only (or none) "channels-last",
-- 5-D only "channels_last_3d", both "in their channels-last format"
local function ranks_phrase(ranks)
   if ranks[5] and ranks[4] then return "4-D or 5-D", "in their channels-last format" end
   if ranks[5] then return "5-D", "channels_last_3d" end
   return "4-D", "channels-last"
end
M._ranks_phrase = ranks_phrase

-- the parameter-gradient lines: 4-D ones (also when there are none and no 5-D ones either, as
-- before 5-D models), then 5-D ones
local function param_lines(r)
   local out = {}
   for _, rank in ipairs({ 4, 5 }) do
      local n = r["n_params" .. rank] or 0
      if n > 0 or (rank == 4 and (r.n_params5 or 0) == 0) then
         local bad = r.bad_params_by_rank and r.bad_params_by_rank[rank] or {}
         local fmt = rank == 4 and "channels-last" or "channels_last_3d"
         if #bad == 0 then
            out[#out + 1] = ("%d-D parameter gradients: all %d %s"):format(rank, n, fmt)
         else
            out[#out + 1] = ("%d-D parameter gradients: %d of %d NOT %s: %s")
               :format(rank, #bad, n, fmt, table.concat(bad, ", "))
         end
      end
   end
   return out
end
M._param_lines = param_lines

function Report.__tostring(r)
   local header = { "module", "type", "input", "output", "output size" }
   if r.backward then
      header[#header + 1] = "grad (output)"
      header[#header + 1] = "weight grad"
   end
   local rows = {}
   for _, row in ipairs(r.rows) do
      local mark = ""
      if row.not_called then mark = "  (not called)" end
      if row.fused_into then mark = "  (fused into " .. row.fused_into .. ")" end
      if row.lost then
         local fmt = row.lost_format or "channels_last"
         local by = row.lost_ops and (" (by " .. table.concat(row.lost_ops, ", ") .. ")") or ""
         if row.own_code then
            mark = mark .. "  <-- lost " .. fmt .. " in its own forward" .. by
         elseif row.lost_where == "input" then
            mark = mark .. "  <-- input not " .. fmt .. " (lost before this module)" .. by
         elseif row.lost_where == "inside" then
            mark = mark .. "  <-- lost " .. fmt .. " inside its forward" .. by
         else
            mark = mark .. "  <-- lost " .. fmt .. by
         end
      end
      if row.nhwc then
         mark = mark .. "  (channels-to-last order of a channels-last tensor, a view: kept)"
      end
      if row.input_note then mark = mark .. "  (" .. row.input_note .. ")" end
      if row.grad_note then mark = mark .. "  (output gradient " .. row.grad_note .. ")" end
      if row.grad_lost then
         mark = mark .. "  <-- output gradient not " .. (row.grad_lost_format or "channels_last") ..
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
   local ranks = r.output_ranks or {}
   if r.first_lost then
      local where = ""
      if r.first_lost_where == "inside" then
         where = r.first_lost_op and (" (operator " .. r.first_lost_op .. " in its forward)") or
            " (inside its forward)"
      elseif r.first_lost_where == "input" then
         where = " (its input is not " .. (r.first_lost_format or "channels_last") .. ")"
      elseif r.first_lost_where == "output" then
         where = r.first_lost == "(model)" and " (its output, after the last module)" or
            (r.first_lost_op and (" (its output, by " .. r.first_lost_op .. ")") or
             " (its output)")
      end
      lines[#lines + 1] = "first module to lose " .. (r.first_lost_format or "channels_last") ..
         ": " .. r.first_lost .. where
   elseif #r.non_cl > 0 then
      local rk, fmt = ranks_phrase(ranks)
      lines[#lines + 1] = ("%d leaf-module output(s) are %s and not %s (first: %s); %s")
         :format(#r.non_cl, rk, fmt, r.non_cl[1], r.non_cl_rank_change and
            ("it changes the rank of a " .. r.non_cl_rank_change .. " input (not counted as " ..
             "a loss)") or "was the model converted (lm.to_channels_last)?")
   elseif ranks[4] and ranks[5] then
      lines[#lines + 1] = "every 4-D module output is channels-last and every 5-D one " ..
         "channels_last_3d"
   elseif ranks[5] then
      lines[#lines + 1] = "every 5-D module output is channels_last_3d"
   elseif ranks[4] or #r.rows == 0 then
      lines[#lines + 1] = "every 4-D module output is channels-last"
   else
      lines[#lines + 1] = "no module output is 4-D or 5-D: nothing to check (other ranks carry " ..
         "no memory format)"
   end
   if r.backward then
      if r.backward_skipped then
         lines[#lines + 1] = "backward skipped: " .. r.backward_skipped
      else
         if r.first_grad_lost then
            lines[#lines + 1] = "first module whose output gradient is not " ..
               (r.first_grad_lost_format == "channels_last_3d" and "channels_last_3d" or
                "channels-last") .. " (backward order): " .. r.first_grad_lost ..
               (r.first_grad_lost_by and (" (the gradient comes from " .. r.first_grad_lost_by ..
                ")") or "")
         end
         if r.input_grad_format then
            lines[#lines + 1] = "input gradient: " .. r.input_grad_format ..
               (r.input_grad_lost and " (NOT in the input's channels-last format)" or "")
         end
         for _, l in ipairs(param_lines(r)) do lines[#lines + 1] = l end
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
--- A 4-D output is expected to stay channels_last and a 5-D one channels_last_3d: a module whose
--- input is unambiguously in its rank's channels-last format and whose output of the same rank
--- is not is a loss (row.lost, row.lost_format); 4-D and 5-D parameter gradients are checked
--- against their parameter's format (report.n_params4, report.n_params5). Other ranks (the 1-D
--- operators' N x C x L) are shown, never judged.
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
                                 bad_params_by_rank = { [4] = {}, [5] = {} }, n_params4 = 0,
                                 n_params5 = 0, output_ranks = {} }, Report)
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
      if T.is_tensor(args[i]) then
         input_grads[i] = rawget(args[i], "grad")
         rawset(args[i], "grad", nil)
      end
   end

   -- Every module's forward is wrapped. A leaf call gets a row; a container call pushes itself on
   -- the stack of running modules, so that an operator that loses the format in a container's
   -- own code (an x:contiguous() between two children, a residual add with a contiguous tensor)
   -- is put on a row of that container, placed where it happened.
   local mstack = {}   -- the module calls running now, outermost first: {path =, m =, row =}
   local hooks, calls, saved = {}, {}, {}
   local path_of, is_leaf = {}, {}
   for _, pm in ipairs(model:named_modules()) do path_of[pm[2]] = path_of[pm[2]] or pm[1] end
   for _, leaf in ipairs(leaves) do is_leaf[leaf.m] = true end

   -- the channels-to-last views: x:permute(1, 3, 4, 2) of a channels-last N x C x H x W tensor
   -- (torchvision's Permute, ConvNeXt's LayerNorm2d) is its N x H x W x C view, the same memory,
   -- contiguous: no copy, and permuting it back gives channels-last again. Such a view, and what
   -- a module computes from it keeping N, H, W in that order (contiguous: LayerNorm, Linear,
   -- GELU over the last dim), keeps the layout (row.nhwc); likewise 5-D N x D x H x W x C views
   -- of channels_last_3d tensors. The permute itself is then no loss inside a module's forward.
   local nhwc = setmetatable({}, { __mode = "k" })   -- tensor -> rank
   local nhwc_permute = false   -- the latest Tensor.permute made such a view (for on_lost)
   local function nhwc_order_of(ic, oc, same_c)
      local nd = ic.ndim
      if oc.ndim ~= nd or CL_NAME[nd] == nil or C.lm_is_contiguous(oc, 0) == 0 then
         return false
      end
      if same_c then   -- a view: (N, C, H, W) -> (N, H, W, C)
         if oc.sizes[nd - 1] ~= ic.sizes[1] then return false end
         for d = 2, nd - 1 do
            if oc.sizes[d - 1] ~= ic.sizes[d] then return false end
         end
      else             -- computed from such a view: N, H, W kept, the last dim free
         for d = 1, nd - 2 do
            if oc.sizes[d] ~= ic.sizes[d] then return false end
         end
      end
      return oc.sizes[0] == ic.sizes[0]
   end
   local orig_permute = rawget(Tensor, "permute")
   rawset(Tensor, "permute", function(self, ...)
      nhwc_permute = false
      local out = orig_permute(self, ...)
      local ic, oc = cdata_of(self), cdata_of(out)
      if ic ~= nil and oc ~= nil and is_cl(ic) and nhwc_order_of(ic, oc, true) then
         nhwc[out] = ic.ndim
         nhwc_permute = true
      end
      return out
   end)

   local function hook_grad(row, out)
      if backward and A.is_grad_enabled() and rawget(out, "requires_grad") == true then
         hooks[#hooks + 1] = Tensor.register_hook(out, function(g)
            local gc = cdata_of(g)
            if gc ~= nil then
               row.grad_format = classify(gc)
               row._grad_c = { ndim = gc.ndim, keeps = keeps_cl(gc), broadcast = has_broadcast(gc),
                               contig = C.lm_is_contiguous(gc, 0) ~= 0 }
            end
         end)
      end
   end

   for _, pm in ipairs(model:named_modules()) do
      local path, m = pm[1], pm[2]
      saved[#saved + 1] = { m, rawget(m, "forward") }
      local orig = m.forward
      if is_leaf[m] then
         rawset(m, "forward", function(self, ...)
            calls[m] = (calls[m] or 0) + 1
            local row = { path = path, type = m:type_name(), call = calls[m], module = m }
            report.rows[#report.rows + 1] = row
            row._in = (...)
            local xc = cdata_of((...))
            if xc ~= nil then
               row.input_format = classify(xc)
               row.input_size = sizes_str(xc)
               row._in_cl = is_cl(xc) and xc.ndim or nil   -- the rank whose format it has
               row._in_ndim = xc.ndim
               row._in_keeps = keeps_cl(xc)
               if nhwc[(...)] then row._in_nhwc, row._in_keeps = xc, true end
            end
            local top = #mstack + 1
            mstack[top] = { path = path, m = m, row = row }
            local res = pack(orig(self, ...))
            mstack[top] = nil
            local out = first_tensor(res)
            local oc = out and cdata_of(out)
            row._out = out
            if oc ~= nil then
               row.output_format = classify(oc)
               row.output_size = sizes_str(oc)
               row._out_ndim = oc.ndim
               row._out_keeps = keeps_cl(oc)
               row._out_is_cl = is_cl(oc)
               row._out_cl_like = CL_NAME[oc.ndim] ~= nil and keeps_cl(oc)
               if not row._out_keeps and (nhwc[out] or
                  row._in_nhwc and nhwc_order_of(row._in_nhwc, oc, false)) then
                  nhwc[out] = oc.ndim
                  row.nhwc, row._out_keeps = true, true
               end
               hook_grad(row, out)
            end
            return unpack(res, 1, res.n)
         end)
      else
         rawset(m, "forward", function(self, ...)
            calls[m] = (calls[m] or 0) + 1
            local top = #mstack + 1
            mstack[top] = { path = path, m = m, call = calls[m] }
            local res = pack(orig(self, ...))
            mstack[top] = nil
            return unpack(res, 1, res.n)
         end)
      end
   end

   -- a ReLU fused into the batch norm before it (nn.utils.bn_relu) is never called: it gets a
   -- row marked fused, with the batch norm's output format
   local fold = require("lumen.nn.fold")
   local saved_fused_hook = fold._fused_hook
   fold._fused_hook = function(fused, into)
      local into_row
      for i = #report.rows, 1, -1 do
         if report.rows[i].module == into then into_row = report.rows[i]; break end
      end
      if into_row == nil or path_of[fused] == nil then return end
      calls[fused] = (calls[fused] or 0) + 1
      report.rows[#report.rows + 1] = {
         path = path_of[fused], type = fused:type_name(), call = calls[fused], module = fused,
         fused_into = row_name(into_row), _fused_row = into_row,
         input_format = into_row.output_format, output_format = into_row.output_format,
         output_size = into_row.output_size }
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
      if orig_permute ~= nil then
         rawset(Tensor, "permute", orig_permute)
         orig_permute = nil
      end
      for i = #reshapers, 1, -1 do
         local rp = reshapers[i]
         if rp[3] ~= nil then rawset(rp[1], rp[2], rp[3]); rp[3] = nil end
      end
   end
   local function unwrap_forwards()
      for i = #saved, 1, -1 do rawset(saved[i][1], "forward", saved[i][2]) end
      fold._fused_hook = saved_fused_hook
   end

   local function restore()
      unwrap_reshapers()
      unwrap_forwards()
      for _, h in ipairs(hooks) do pcall(h.remove) end
      for i, nt in ipairs(params) do rawset(nt[2], "grad", grads[i]) end
      for i = 1, args.n do
         if T.is_tensor(args[i]) then rawset(args[i], "grad", input_grads[i]) end
      end
      A.no_grad(function()
         for _, b in ipairs(buffers) do raw.copy_(b[1], b[2]) end
      end)
   end

   -- the forward always runs under lm.layout.trace: an operator called by a module's own code
   -- (depth 1: not inside another operator, whose own result is what counts) that loses the
   -- format is put on the row of the module running it
   local function on_lost(l)
      if l.op == "Tensor.permute" and nhwc_permute then
         nhwc_permute = false
         return   -- a channels-to-last view (above): no loss
      end
      if l.depth ~= 1 then return end
      local top = mstack[#mstack]
      if top == nil then return end
      local row = top.row
      if row == nil then
         -- a container's own code: one row for this call of it, where the loss happened
         row = { path = top.path, type = top.m:type_name(), call = top.call or 1, own_code = true,
                 input_format = l.input_format, output_format = l.output_format,
                 output_size = l.output_size, lost = true, lost_format = l.format,
                 lost_where = "inside" }
         report.rows[#report.rows + 1] = row
         top.row = row
      end
      row.lost_ops = row.lost_ops or {}
      row.lost_ops[#row.lost_ops + 1] = l.op
      row._inside_lost = row._inside_lost or l.format
      row._lost_entry = row._lost_entry or l
   end

   -- the gradient that reaches a channels-last input which requires grad (a hook: the .grad a
   -- leaf accumulates is always put in the leaf's own format, so it cannot show a loss)
   if backward then
      for i = 1, args.n do
         local ic = cdata_of(args[i])
         if ic ~= nil and is_cl(ic) and rawget(args[i], "requires_grad") == true then
            hooks[#hooks + 1] = Tensor.register_hook(args[i], function(g)
               local gc = cdata_of(g)
               if gc ~= nil and report.input_grad_format == nil then
                  report.input_grad_format = classify(gc)
                  if not keeps_cl(gc) and not has_broadcast(gc) then
                     report.input_grad_lost = true
                  end
               end
            end)
            break
         end
      end
   end

   local ok, err = pcall(function()
      local tr = pack(M.trace(function() return model:forward(unpack(args, 1, args.n)) end,
                              { on_lost = on_lost }))
      if want_trace then
         report.trace = tr[1]
         report.trace.results = nil -- the report must not keep the model's outputs alive
      end
      local res = { n = tr.n - 1, unpack(tr, 2, tr.n) }
      unwrap_reshapers()
      unwrap_forwards()
      local out = first_tensor(res)
      local outc = out and cdata_of(out)
      report.output_format = outc and classify(outc) or "-"
      if outc ~= nil then
         report._out_ndim, report._out_keeps = outc.ndim, keeps_cl(outc)
      end
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
      restore()
      error(err, 0)
   end

   -- parameter gradients and the input's (read before the old .grad are put back)
   local leaf_of_param = {}
   for _, leaf in ipairs(leaves) do
      for _, nt in ipairs(leaf.m:named_parameters()) do leaf_of_param[nt[2]] = leaf end
   end
   local pgrad = {}
   if backward and not report.backward_skipped then
      for _, nt in ipairs(params) do
         local p = nt[2]
         local pc = cdata_of(p)
         if pc ~= nil and CL_NAME[pc.ndim] ~= nil then
            local rank = pc.ndim
            local key = "n_params" .. rank
            report[key] = report[key] + 1
            local g = rawget(p, "grad")
            local gc = g and cdata_of(g)
            local f = gc and classify(gc) or "none"
            local good = gc ~= nil and C.lm_is_contiguous(gc, CL_ENUM[rank]) ~= 0
            local leaf = leaf_of_param[p]
            if gc == nil and leaf and not calls[leaf.m] then
               good = true   -- a module never called has no gradient: nothing to judge
            end
            if not good then
               local name = nt[1] .. " (" .. f .. ")"
               report.bad_params[#report.bad_params + 1] = name
               local by = report.bad_params_by_rank[rank]
               by[#by + 1] = name
            end
            if leaf then pgrad[leaf.m] = f end
         end
      end
   end
   restore()

   -- verdicts, in forward order. state[rank]: "cl" while the last activation of that rank was
   -- channels-last (the input, or a module's output), "lost" after a loss was reported (the
   -- modules that then get a non-channels-last input are its consequence, not a new loss)
   local rows = report.rows
   local state, last_loss = {}, {}
   if first_in ~= nil and is_cl(first_in) then state[first_in.ndim] = "cl" end
   local function loss_event(row, rank)
      state[rank] = "lost"
      last_loss[rank] = row
      if not report.first_lost then
         report.first_lost = row.path == "" and "(model)" or row.path
         report.first_lost_format = row.lost_format
         report.first_lost_where = row.lost_where
         report.first_lost_op = row.lost_ops and row.lost_ops[1] or nil
         report.first_lost_entry = row._lost_entry
      end
   end
   local RANK_OF = { channels_last = 4, channels_last_3d = 5 }
   for i, row in ipairs(rows) do
      if row.own_code then
         loss_event(row, RANK_OF[row.lost_format])
      elseif row.fused_into then
         local fr = row._fused_row
         row.grad_format = fr.grad_format
      else
         row.param_grad_format = pgrad[row.module]
         local rank = row._out_ndim
         if CL_NAME[rank] then report.output_ranks[rank] = true end
         -- the input: not channels-last although the activation before it was
         local irank = row._in_ndim
         if CL_NAME[irank] and not row._in_keeps then
            if state[irank] == "cl" then
               row.lost, row.lost_format, row.lost_where = true, CL_NAME[irank], "input"
            elseif state[irank] == "lost" and last_loss[irank] and last_loss[irank].own_code and
               not last_loss[irank]._noted then
               -- the loss a container's own code made shows here first
               last_loss[irank]._noted = true
               row.input_note = "input not " .. CL_NAME[irank] .. ": lost by " ..
                  row_name(last_loss[irank]) .. (last_loss[irank].lost_ops and
                  (" (" .. table.concat(last_loss[irank].lost_ops, ", ") .. ")") or "")
            end
         end
         if row._in_cl then state[row._in_cl] = state[row._in_cl] or "cl" end
         -- an operator inside its forward lost it (the output may be channels-last again)
         if row._inside_lost then
            row.lost = true
            row.lost_format = row.lost_format or row._inside_lost
            row.lost_where = row.lost_where or "inside"
         end
         -- the output
         if CL_NAME[rank] and not row._out_keeps then
            report.non_cl[#report.non_cl + 1] = row_name(row)
            if #report.non_cl == 1 and row._in_cl and row._in_cl ~= rank then
               -- the first one came from a channels-last input of another rank (a temporal mean)
               report.non_cl_rank_change = CL_NAME[row._in_cl]
            end
            if row._in_cl == rank then
               row.lost = true
               row.lost_format = CL_NAME[rank]
               if row.lost_where ~= "input" then row.lost_where = "output" end
            end
         end
         if row.lost then loss_event(row, RANK_OF[row.lost_format]) end
         if CL_NAME[rank] and row._out_is_cl then state[rank] = "cl" end
      end
      local rank = row._out_ndim
      local gcl = row._grad_c
      -- (the gradient of a channels-to-last view is itself one: contiguous in that order)
      if gcl and gcl.ndim == rank and not gcl.broadcast and
         (row._out_cl_like and not gcl.keeps or row.nhwc and not gcl.contig) then
         -- who handed this gradient back: the leaf modules that consumed the output
         local consumers, all_reshape = {}, true
         for j, r2 in ipairs(rows) do
            if j ~= i and r2._in ~= nil and rawequal(r2._in, row._out) then
               consumers[#consumers + 1] = row_name(r2)
               if (r2._out_ndim or 0) >= rank then all_reshape = false end
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
            row.grad_lost_format = row.nhwc and "contiguous (channels-to-last order)" or
               CL_NAME[rank]
            report.first_grad_lost = row.path   -- the latest in forward order runs first backward
            report.first_grad_lost_by = row.grad_from
            report.first_grad_lost_format = row.grad_lost_format
         end
      end
   end
   -- the model's output: lost after the last module, by code the trace does not see
   local orank = report._out_ndim
   if CL_NAME[orank] and not report._out_keeps and state[orank] == "cl" then
      report.output_lost = true
      rows[#rows + 1] = { path = "", type = model:type_name(), call = 1, own_code = true,
                          lost = true, lost_format = CL_NAME[orank], lost_where = "output",
                          output_format = report.output_format }
      if not report.first_lost then
         report.first_lost = "(model)"
         report.first_lost_format = CL_NAME[orank]
         report.first_lost_where = "output"
      end
   end
   report._out_ndim, report._out_keeps = nil, nil
   -- every leaf module has a row: those never called (nor fused) get one at the end
   for _, leaf in ipairs(leaves) do
      if not calls[leaf.m] then
         rows[#rows + 1] = { path = leaf.path, type = leaf.m:type_name(), call = 0,
                             not_called = true }
      end
   end
   for _, row in ipairs(rows) do
      row._in_cl, row._out_ndim, row._out_keeps, row._out_cl_like, row._grad_c = nil, nil, nil,
         nil, nil
      row._in_ndim, row._in_keeps, row._out_is_cl, row._inside_lost, row._noted = nil, nil, nil,
         nil, nil
      row._in, row._out, row.module, row._fused_row, row._lost_entry = nil, nil, nil, nil, nil
      row._in_nhwc = nil
   end
   report.params_ok = #report.bad_params == 0
   report.ok = report.first_lost == nil and #report.non_cl == 0
   if backward and not report.backward_skipped then
      report.ok = report.ok and report.params_ok and report.first_grad_lost == nil and
         not report.input_grad_lost
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

-- "channels_last", "channels_last_3d" or both, for the formats in a set {[4] =, [5] =}
local function formats_phrase(ranks)
   if ranks[4] and ranks[5] then return "channels_last or channels_last_3d" end
   if ranks[5] then return "channels_last_3d" end
   return "channels_last"
end

function Trace.__tostring(r)
   local lines = {}
   if r.ok then
      lines[1] = ("no operator lost %s (%d operator calls traced, %d with a " ..
         "channels-last input)"):format(formats_phrase(r.cl_ranks or {}), r.calls, r.cl_calls)
      return lines[1]
   end
   local lost_ranks = {}
   for _, l in ipairs(r.lost) do lost_ranks[l.format == "channels_last_3d" and 5 or 4] = true end
   lines[1] = ("%d operator call(s) lost %s (%d calls traced, %d with a " ..
      "channels-last input):"):format(#r.lost, formats_phrase(lost_ranks), r.calls, r.cl_calls)
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

-- the first unambiguously channels_last (4-D) and channels_last_3d (5-D) tensors among the
-- arguments (and inside array arguments, one level deep)
local function cl_inputs(args)
   local c4, c5
   local function see(c)
      if c ~= nil and is_cl(c) then
         if c.ndim == 4 then c4 = c4 or c else c5 = c5 or c end
      end
   end
   for i = 1, args.n do
      local a = args[i]
      local c = cdata_of(a)
      if c ~= nil then
         see(c)
      elseif type(a) == "table" and getmetatable(a) == nil then
         for j = 1, #a do see(cdata_of(a[j])) end
      end
   end
   return c4, c5
end

--- lm.layout.trace(fn, {raise = false}) -> report, fn's results
--- Runs fn() with every operator wrapped: the functional ops (lm.F.*), the Tensor methods (so
--- also + - * / on tensors) and the lm.* functions. A call that receives an unambiguously
--- channels-last tensor and returns a 4-D tensor that is not channels-last is recorded
--- (report.lost, in call order; report.first, report.message); so is one that receives a
--- channels_last_3d tensor and returns a 5-D one that is not (entry.format says which: a result
--- is judged against the format of an input of its own rank). With {raise = true} the first one
--- raises "lumen.layout.trace: Operator `X` lost channels_last property ..." (or
--- "channels_last_3d property") at once.
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
   local report = setmetatable({ lost = {}, calls = 0, cl_calls = 0, ok = true, ops = {},
                                 cl_ranks = {} }, Trace)
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
         local in4, in5 = cl_inputs(args)
         local res = pack(pcall(f, ...))
         local my_depth = depth
         stack[depth] = nil
         depth = depth - 1
         if not res[1] then error(res[2], 0) end
         if in4 ~= nil or in5 ~= nil then
            report.cl_calls = report.cl_calls + 1
            if in4 then report.cl_ranks[4] = true end
            if in5 then report.cl_ranks[5] = true end
            local oc = cdata_of(res[2])
            -- a result of the rank of a channels-last input that does not keep that format
            local incl = oc ~= nil and (oc.ndim == 4 and in4 or oc.ndim == 5 and in5) or nil
            if incl ~= nil and not keeps_cl(oc) then
               local fmt = CL_NAME[oc.ndim]
               local saved_stack = {}
               for i = 1, my_depth - 1 do saved_stack[i] = stack[i] end
               saved_stack[my_depth] = name
               local l = { op = name, chain = saved_stack, format = fmt, depth = my_depth,
                           chain_str = chain_string(saved_stack, my_depth),
                           input = describe(incl), output = describe(oc),
                           input_format = classify(incl), output_format = classify(oc),
                           output_size = sizes_str(oc) }
               report.lost[#report.lost + 1] = l
               if on_lost then on_lost(l) end
               if report.ok then
                  report.ok = false
                  report.first = l
                  report.message = ("Operator `%s`%s lost %s property: " ..
                     "%s input %s -> output %s"):format(name,
                     l.chain_str ~= "-" and (" (called from " .. l.chain_str .. ")") or "", fmt,
                     fmt == "channels_last" and "channels-last" or fmt, l.input, l.output)
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
      for _, k in ipairs(function_keys(F)) do wrap(F, k, "F." .. k) end
      -- Tensor's and lm's private "_" functions too (as they always were): only INSPECT and
      -- LM_SKIP are left alone
      for _, k in ipairs(function_keys(Tensor, function(k) return not INSPECT[k] end, true)) do
         wrap(Tensor, k, "Tensor." .. k)
      end
      for _, k in ipairs(function_keys(lm, function(k) return not LM_SKIP[k] end, true)) do
         wrap(lm, k, "lm." .. k)
      end
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
-- coverage: lua/lumen/layout_coverage.lua
---------------------------------------------------------------------------------------------

--- lm.layout.coverage(opts) -> report: every operator run on contiguous and channels-last input
--- (the 2-D ones on NCHW / NHWC, the 3-D ones on NCDHW / NDHWC, the 1-D ones on NCL / NLC);
--- see lua/lumen/layout_coverage.lua
function M.coverage(opts)
   return require("lumen.layout_coverage").coverage(opts)
end

-- the operator list, for documentation and specs: array of {op=, kind=, group=}
function M.operators()
   return require("lumen.layout_coverage").operators()
end

-- lumen's init calls install(lm) when lm.layout is first used
function M.install(lm)
   if rawget(lm, "to_channels_last") == nil then lm.to_channels_last = M.to_channels_last end
end

M._classify = classify
M._keeps_cl = keeps_cl
M._is_nlc_dense = is_nlc_dense
M._ffi = ffi

return M
