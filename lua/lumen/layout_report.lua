-- lumen.layout_report -- lm.layout.check's report as one self-contained HTML page:
--
--    lm.layout.check(model, x, {html = "report.html"})
--    report:to_html("report.html")           -- or without a path: the page as a string
--
-- The page shows the verdict, the module tree coloured by the memory format of each module's
-- output (channels-last: channels_last for a 4-D output, channels_last_3d for a 5-D one;
-- contiguous; mixed for a container whose modules differ; neutral for outputs that carry no
-- format: other ranks, ambiguous shapes), the module that lost its channels-last format and the
-- operator that did it (from lm.layout.trace) highlighted, the operator table, and the text
-- report. Everything is
-- inline (CSS in a <style> element, no scripts, no external files): the page can be mailed or
-- attached to an issue. Collapsing uses <details>, which needs no script.

local M = {}

local function esc(s)
   return (tostring(s):gsub("[&<>\"']", {
      ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&#39;",
   }))
end

-- the colour classes; the legend lists them in this order
local CLASSES = {
   { "cl", "channels-last", "4-D output in channels_last, 5-D output in channels_last_3d " ..
     "(dense, or a view ordered like it)" },
   { "contiguous", "contiguous", "4-D or 5-D output in NC(D)HW order (contiguous or another " ..
     "stride order)" },
   { "mixed", "mixed", "a container whose modules produce both" },
   { "lost", "loses channels-last", "channels-last input, NC(D)HW output of the same rank: the " ..
     "operator is named" },
   { "neutral", "no format", "not 4-D or 5-D (the 1-D operators' N x C x L included), ambiguous " ..
     "(C == 1 or H == W == 1; 5-D: C == 1 or D == H == W == 1), or not called" },
}

local CSS = [[
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212121;
       margin: 24px; background: #ffffff; }
h1 { font-size: 22px; margin: 0 0 12px 0; }
h2 { font-size: 17px; margin: 24px 0 8px 0; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 13px; }
.verdict { padding: 10px 14px; border-radius: 6px; font-weight: 600; margin-bottom: 12px; }
.verdict.ok { background: #c8e6c9; color: #1b5e20; }
.verdict.bad { background: #ffebee; color: #b71c1c; border: 1px solid #ef9a9a; }
table.facts td { padding: 2px 12px 2px 0; vertical-align: top; }
table.facts td:first-child { color: #616161; white-space: nowrap; }
.legend span.sw { display: inline-block; width: 14px; height: 14px; border-radius: 3px;
                  vertical-align: -2px; margin: 0 6px 0 14px; border: 1px solid #9e9e9e; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 22px; }
ul.tree { padding-left: 0; }
ul.tree li { margin: 2px 0; }
.box { display: inline-block; padding: 2px 8px; border-radius: 4px; border-left: 5px solid; }
summary { cursor: pointer; }
.name { font-weight: 600; }
.type { color: #424242; margin-left: 6px; }
.fmt, .size { margin-left: 10px; }
.note { margin-left: 10px; font-weight: 600; }
.c-cl { background: #e8f5e9; border-color: #2e7d32; }
.c-contiguous { background: #e3f2fd; border-color: #1565c0; }
.c-mixed { background: #fff3e0; border-color: #ef6c00; }
.c-lost { background: #ffcdd2; border-color: #c62828; }
.c-neutral { background: #f5f5f5; border-color: #9e9e9e; }
.box.c-lost { border-left-width: 10px; }
.box.c-lost .note { color: #b71c1c; }
.contains-lost { color: #c62828; margin-left: 8px; font-weight: 600; }
.gradlost { color: #6a1b9a; }
table.ops { border-collapse: collapse; }
table.ops th, table.ops td { border: 1px solid #bdbdbd; padding: 3px 8px; text-align: left; }
table.ops th { background: #eeeeee; }
pre { background: #fafafa; border: 1px solid #e0e0e0; padding: 10px; overflow-x: auto; }
]]

-- "(2,8,4,4)" -> 4
local function rank_of(size)
   if type(size) ~= "string" then return 0 end
   local n = 0
   for _ in size:gmatch("%-?%d+") do n = n + 1 end
   return n
end

local CL_LIKE = { channels_last = true, cl_strided = true, channels_last_3d = true,
                  cl3d_strided = true }
local AMBIGUOUS = { ambiguous = true, ambiguous_cl = true, ambiguous_cl3d = true }

-- the class of one leaf call, from its output
local function call_class(row)
   if row.lost then return "lost" end
   local rank = rank_of(row.output_size)
   if rank ~= 4 and rank ~= 5 then return "neutral" end
   if CL_LIKE[row.output_format] then return "cl" end
   if AMBIGUOUS[row.output_format] then return "neutral" end
   return "contiguous"
end

local function anchor(path)
   return "m-" .. ((path == "" or path == "(model)") and "root" or path:gsub("[^%w]", "_"))
end

local function parent_of(path)
   if path == "" then return nil end
   return path:match("^(.*)%.[^.]+$") or ""
end

-- the class of a module from the calls under it (itself or its descendants)
local function summarise(calls)
   local seen = {}
   for _, row in ipairs(calls) do seen[call_class(row)] = true end
   local class
   if seen.lost then class = "mixed"
   elseif seen.cl and seen.contiguous then class = "mixed"
   elseif seen.cl then class = "cl"
   elseif seen.contiguous then class = "contiguous"
   else class = "neutral" end
   return class, seen.lost == true
end

local function row_details(row, backward)
   local parts = {}
   parts[#parts + 1] = ('<span class="fmt mono">%s &rarr; %s</span>'):format(
      esc(row.input_format or "-"), esc(row.output_format or "-"))
   if row.output_size then
      parts[#parts + 1] = ('<span class="size mono">%s</span>'):format(esc(row.output_size))
   end
   if backward and (row.grad_format or row.param_grad_format) then
      parts[#parts + 1] = ('<span class="fmt mono">grad %s%s</span>'):format(
         esc(row.grad_format or "-"),
         row.param_grad_format and (", weight grad " .. esc(row.param_grad_format)) or "")
   end
   if row.fused_into then
      parts[#parts + 1] = '<span class="fmt">fused into <code>' .. esc(row.fused_into) ..
         '</code></span>'
   end
   if row.lost then
      local ops = row.lost_ops and table.concat(row.lost_ops, ", ") or nil
      local fmt = row.lost_format == "channels_last_3d" and "channels_last_3d" or "channels-last"
      local what = "loses " .. fmt
      if row.own_code then what = "loses " .. fmt .. " in its own forward"
      elseif row.lost_where == "input" then what = "input not " .. fmt
      elseif row.lost_where == "inside" then what = "loses " .. fmt .. " inside its forward" end
      parts[#parts + 1] = '<span class="note">&#9888; ' .. what ..
         (ops and (': operator <code>' .. esc(ops) .. '</code>') or "") .. '</span>'
   end
   if row.input_note then
      parts[#parts + 1] = '<span class="fmt">(' .. esc(row.input_note) .. ')</span>'
   end
   if row.grad_lost then
      parts[#parts + 1] = '<span class="note gradlost">output gradient not ' ..
         (row.grad_lost_format == "channels_last_3d" and "channels_last_3d" or "channels-last") ..
         (row.grad_from and (" (from " .. esc(row.grad_from) .. ")") or "") .. '</span>'
   elseif row.grad_note then
      parts[#parts + 1] = '<span class="fmt">(output gradient ' .. esc(row.grad_note) .. ')</span>'
   end
   return table.concat(parts)
end

--- html(report) -> the page (a string). report is what lm.layout.check returns.
function M.html(report)
   local modules = report.modules
   if type(modules) ~= "table" or #modules == 0 then
      -- a report made before modules were recorded: the leaf rows alone
      modules = { { path = "", type = "(model)" } }
      local seen = {}
      for _, row in ipairs(report.rows) do
         if not seen[row.path] and row.path ~= "" then
            seen[row.path] = true
            modules[#modules + 1] = { path = row.path, type = row.type }
         end
      end
   end

   -- calls per module path, and the calls under each module (its own and its descendants')
   local own, under, children = {}, {}, {}
   for _, m in ipairs(modules) do
      own[m.path], under[m.path], children[m.path] = {}, {}, {}
   end
   for _, m in ipairs(modules) do
      local p = parent_of(m.path)
      if p and children[p] then table.insert(children[p], m) end
   end
   for _, row in ipairs(report.rows) do
      if own[row.path] then table.insert(own[row.path], row) end
      local p = row.path
      while p do
         if under[p] then table.insert(under[p], row) end
         p = parent_of(p)
      end
   end

   local out = {}
   local function w(s) out[#out + 1] = s end

   local function node(m)
      local name = m.path == "" and "(model)" or m.path:match("([^.]+)$")
      local kids = children[m.path]
      local class, contains_lost
      if #kids == 0 then
         -- a leaf: highlighted when one of its calls lost channels-last
         local lost
         class, lost = summarise(own[m.path])
         if lost then class = "lost" end
      else
         class, contains_lost = summarise(under[m.path])
      end
      local head = ('<span class="box c-%s" id="%s" title="%s"><span class="name">%s</span>' ..
         '<span class="type">%s</span>'):format(class, anchor(m.path), esc(m.path),
         esc(name), esc(m.type or "?"))
      if #kids == 0 then
         local calls = {}
         for _, row in ipairs(own[m.path]) do
            if not row.not_called then calls[#calls + 1] = row end
         end
         if #calls == 0 then
            w('<li>' .. head .. '<span class="fmt">not called</span></span></li>')
         else
            for i, row in ipairs(calls) do
               local h = head
               if i > 1 then h = h:gsub(' id="[^"]*"', "") end
               w('<li>' .. h .. (#calls > 1 and ('<span class="fmt">call ' .. i .. '</span>')
                  or "") .. row_details(row, report.backward) .. '</span></li>')
            end
         end
         return
      end
      -- a loss in the container's own forward (rows made by the check for it)
      local own_note = ""
      for _, row in ipairs(own[m.path]) do
         if row.own_code then own_note = own_note .. row_details(row, false) end
      end
      w('<li><details open><summary>' .. head .. own_note .. '</span>' ..
        (contains_lost and '<span class="contains-lost">&#9888; contains the loss</span>' or "")
        .. '</summary><ul>')
      for _, k in ipairs(kids) do node(k) end
      w('</ul></details></li>')
   end

   w('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n')
   w('<title>lumen layout check' .. (report.ok and "" or ": channels-last lost") .. '</title>\n')
   w('<style>\n' .. CSS .. '</style>\n</head>\n<body>\n')
   w('<h1>lumen layout check</h1>\n')

   -- the verdict
   -- the operator the verdict counted (one called by a module's own code), when it is known
   local first_op = report.first_lost_entry
   local ranks = report.output_ranks or {}
   if report.ok then
      local params = (report.n_params5 or 0) > 0 and ((report.n_params4 or 0) > 0 and
         "4-D and 5-D" or "5-D") or "4-D"
      w('<div class="verdict ok">ok: ' .. (ranks[5] and not ranks[4] and "channels_last_3d" or
        "channels-last") .. ' all the way' ..
        (report.backward and not report.backward_skipped and
         (" (forward, backward and every " .. params .. " parameter gradient)") or " (forward)")
        .. '</div>\n')
   elseif report.first_lost then
      w('<div class="verdict bad">' .. esc(report.first_lost_format == "channels_last_3d" and
        "channels_last_3d" or "channels-last") .. ' is lost at module <a href="#' ..
        anchor(report.first_lost) .. '"><code>' .. esc(report.first_lost) .. '</code></a>' ..
        (first_op and (' by operator <code>' .. esc(first_op.op) .. '</code>') or "") ..
        '</div>\n')
   elseif report.first_grad_lost then
      w('<div class="verdict bad">the gradient stops being ' .. esc(
        report.first_grad_lost_format == "channels_last_3d" and "channels_last_3d" or
        "channels-last") .. ' at module <a href="#' .. anchor(report.first_grad_lost) ..
        '"><code>' .. esc(report.first_grad_lost) .. '</code></a></div>\n')
   elseif #report.non_cl > 0 then
      w('<div class="verdict bad">not ok: ' .. #report.non_cl .. ' module output(s) are not ' ..
        'channels-last (first: <code>' .. esc(report.non_cl[1]) .. '</code>)</div>\n')
   else
      w('<div class="verdict bad">not ok: see below</div>\n')
   end

   -- the facts
   w('<table class="facts">\n')
   local function fact(k, v) w('<tr><td>' .. esc(k) .. '</td><td>' .. v .. '</td></tr>\n') end
   fact("input", '<code>' .. esc(report.input_format or "-") .. '</code>')
   fact("output", '<code>' .. esc(report.output_format or "-") .. '</code>')
   fact("module calls", tostring(#report.rows))
   if report.first_lost then
      fact("first module to lose " .. (report.first_lost_format == "channels_last_3d" and
           "channels_last_3d" or "channels-last"), '<code>' .. esc(report.first_lost) .. '</code>')
   elseif #report.non_cl > 0 then
      local rk, fmt = require("lumen.layout")._ranks_phrase(ranks)
      fact("not channels-last", ("%d leaf-module output(s) are %s and not %s " ..
         "(first: <code>%s</code>); %s"):format(#report.non_cl, rk, fmt, esc(report.non_cl[1]),
         report.non_cl_rank_change and ("it changes the rank of a " ..
            esc(report.non_cl_rank_change) .. " input (not counted as a loss)") or
         "was the model converted (lm.to_channels_last)?"))
   end
   if first_op then
      fact("operator that lost it", '<code>' .. esc(first_op.op) .. '</code>' ..
           (first_op.chain_str ~= "-" and (" (called from <code>" .. esc(first_op.chain_str) ..
            "</code>)") or "") .. '<br><span class="mono">' .. esc(first_op.input) ..
           ' &rarr; ' .. esc(first_op.output) .. '</span>')
   end
   if report.backward then
      if report.backward_skipped then
         fact("backward", "skipped: " .. esc(report.backward_skipped))
      else
         if report.first_grad_lost then
            fact("first output gradient not " .. (report.first_grad_lost_format ==
                 "channels_last_3d" and "channels_last_3d" or "channels-last"), '<code>' ..
                 esc(report.first_grad_lost) .. '</code>' .. (report.first_grad_lost_by and
                 (" (from <code>" .. esc(report.first_grad_lost_by) .. "</code>)") or ""))
         end
         if report.input_grad_format then
            fact("input gradient", '<code>' .. esc(report.input_grad_format) .. '</code>' ..
                 (report.input_grad_lost and " (NOT in the input's channels-last format)" or ""))
         end
         -- "4-D parameter gradients: all 20 channels-last", and the 5-D line
         for _, line in ipairs(require("lumen.layout")._param_lines(report)) do
            local k, v = line:match("^(.-): (.*)$")
            local head, names = v:match("^(.-NOT [%w_%-]+): (.*)$")
            if head then v = esc(head) .. ": <code>" .. esc(names) .. "</code>" else v = esc(v) end
            fact(k, v)
         end
      end
   end
   w('</table>\n')

   -- legend and tree
   w('<h2>Modules</h2>\n<div class="legend">')
   for _, c in ipairs(CLASSES) do
      w(('<span class="sw c-%s" title="%s"></span>%s'):format(c[1], esc(c[3]), esc(c[2])))
   end
   w('</div>\n<p>Each module is coloured by the memory format of its output; a container by the ' ..
     'outputs of the modules inside it. Arrows read input &rarr; output.</p>\n')
   w('<ul class="tree">\n')
   node(modules[1])
   w('</ul>\n')

   -- the operators
   if report.trace then
      local tr = report.trace
      w('<h2>Operators</h2>\n')
      if #tr.lost == 0 then
         w(('<p>No operator lost channels-last (%d operator calls traced, %d with a ' ..
            'channels-last input).</p>\n'):format(tr.calls, tr.cl_calls))
      else
         w(('<p>%d operator call(s) lost channels-last (%d calls traced, %d with a ' ..
            'channels-last input):</p>\n'):format(#tr.lost, tr.calls, tr.cl_calls))
         w('<table class="ops"><tr><th>#</th><th>operator</th><th>called from</th>' ..
           '<th>channels-last input</th><th>output</th></tr>\n')
         for i, l in ipairs(tr.lost) do
            w(('<tr class="c-lost"><td>%d</td><td><code>%s</code></td><td><code>%s</code></td>' ..
               '<td class="mono">%s</td><td class="mono">%s</td></tr>\n'):format(i, esc(l.op),
               esc(l.chain_str), esc(l.input), esc(l.output)))
         end
         w('</table>\n')
      end
   end

   w('<h2>Text report</h2>\n<details><summary>print(report)</summary><pre>' ..
     esc(tostring(report)) .. '</pre></details>\n')
   w('<p class="mono" style="color:#9e9e9e">made by lm.layout.check; docs/checking_models.md ' ..
     'explains the columns</p>\n</body>\n</html>\n')
   return table.concat(out)
end

M._call_class = call_class

return M
