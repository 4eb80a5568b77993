-- lumen.repl.display -- what the REPL and the `lumen` command print: values (strings raw at the
-- top level, tables shallowly, lumen's namespaces as a summary), errors (with a hint for the
-- mistakes a Torch7 or PyTorch user makes first) and help (lua/lumen/doc.lua's entries).

local M = {}

local stderr, stdout = io.stderr, io.stdout

-- hint(msg) -> msg, with a line of advice for Lua errors a Torch7 or PyTorch user meets first:
-- t > 2 (Lua's comparison operators do not work on tensors and numbers)
local COMPARE_HINT = "\n(hint: Lua's < > <= >= cannot compare a tensor: use t:gt(2), t:lt(x), " ..
   "t:ge(x), t:le(x), t:eq(x), t:ne(x), which give bool tensors; and t == 2 is always false, " ..
   "use t:eq(2))"
local function hint(msg)
   if type(msg) ~= "string" then return msg end
   if msg:find("attempt to compare %a+ with table") or msg:find("attempt to compare table with")
      or msg:find("attempt to compare two table values") then
      local cut = msg:find("\nstack traceback:", 1, true)
      if cut then return msg:sub(1, cut - 1) .. COMPARE_HINT .. msg:sub(cut) end
      return msg .. COMPARE_HINT
   end
   return msg
end
M.hint = hint

local function errmsg(msg)
   stderr:write("lumen: ", tostring(hint(msg)), "\n")
   stderr:flush()
end
M.errmsg = errmsg

-- ---------------------------------------------------------------------------------------------
-- values

local function has_tostring(v)
   local mt = debug.getmetatable(v)
   return type(mt) == "table" and mt.__tostring ~= nil
end

local function key_repr(k)
   if type(k) == "string" and k:match("^[%a_][%w_]*$") then return k end
   if type(k) == "string" then return "[" .. string.format("%q", k) .. "]" end
   return "[" .. tostring(k) .. "]"
end

local MAX_ITEMS = 24

-- lumen's namespaces (lm, lm.nn, lm.optim, lm.optim.lr_scheduler, ...) by table, for printing
-- them as a summary instead of a list of "function: 0x..." (only what is loaded)
local function namespaces()
   local lm = package.loaded["lumen"]
   local map = {}
   if type(lm) ~= "table" then return map end
   local function walk(t, name, depth)
      if map[t] then return end
      map[t] = name
      if depth >= 2 then return end
      for k, v in pairs(t) do
         local mt = type(v) == "table" and getmetatable(v)
         if type(k) == "string" and k:match("^[%a][%w_]*$") and type(v) == "table" and
            not has_tostring(v) and (mt == nil or (type(mt) == "table" and mt.__call == nil))
            and rawget(v, "__index") == nil then
            -- a namespace: functions, or classes (callable tables)
            local funcs = 0
            for _, x in pairs(v) do
               local xm = type(x) == "table" and getmetatable(x)
               if type(x) == "function" or (type(xm) == "table" and xm.__call ~= nil) then
                  funcs = funcs + 1
               end
            end
            if funcs > 0 then walk(v, name .. "." .. k, depth + 1) end
         end
      end
   end
   walk(lm, "lm", 0)
   return map
end

-- "lm.optim: Adam, AdamW, Optimizer, SGD; tables: lr_scheduler (help(lm.optim))"
local function module_summary(name, t)
   local funcs, tables, values = {}, {}, {}
   for k, v in pairs(t) do
      if type(k) == "string" and not k:match("^_") then
         local tv = type(v)
         local vm = tv == "table" and debug.getmetatable(v)
         if tv == "function" or (type(vm) == "table" and vm.__call ~= nil) then
            funcs[#funcs + 1] = k
         elseif tv == "table" and not has_tostring(v) then
            tables[#tables + 1] = k
         else
            values[#values + 1] = k
         end
      end
   end
   table.sort(funcs); table.sort(tables); table.sort(values)
   local function list(l)
      if #l <= 40 then return table.concat(l, ", ") end
      local head = {}
      for i = 1, 40 do head[i] = l[i] end
      return table.concat(head, ", ") .. ", ... (" .. #l .. ")"
   end
   local parts = { name .. ": a lumen module" }
   if #funcs > 0 then parts[#parts + 1] = "  functions and classes: " .. list(funcs) end
   if #tables > 0 then parts[#parts + 1] = "  tables: " .. list(tables) end
   if #values > 0 then parts[#parts + 1] = "  values: " .. list(values) end
   parts[#parts + 1] = "  (help(" .. name .. ") or ?" .. name .. " describes it; " .. name ..
      ".<TAB> completes)"
   return table.concat(parts, "\n")
end
M.module_summary = module_summary

-- a short, one-line picture of a value: strings quoted (inside tables), tables shallowly listed
-- (array part first), anything with __tostring (tensors, dtypes, formats) through tostring
local function repr(v, depth, seen)
   local tv = type(v)
   if tv == "string" then return string.format("%q", v) end
   if tv ~= "table" or has_tostring(v) then
      local ok, s = pcall(tostring, v)
      return ok and s or ("<tostring failed: " .. tostring(s) .. ">")
   end
   depth = depth or 0
   seen = seen or {}
   if seen[v] then return "<cycle>" end
   if depth >= 2 then return tostring(v) end
   seen[v] = true
   local parts, n = {}, #v
   for i = 1, math.min(n, MAX_ITEMS) do
      parts[#parts + 1] = repr(v[i], depth + 1, seen)
   end
   local keys = {}
   for k in pairs(v) do
      if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then
         keys[#keys + 1] = k
      end
   end
   table.sort(keys, function(a, b)
      local ta, tb = type(a), type(b)
      if ta ~= tb then return ta < tb end
      if ta == "string" or ta == "number" then return a < b end
      return tostring(a) < tostring(b)
   end)
   for _, k in ipairs(keys) do
      if #parts >= MAX_ITEMS then break end
      parts[#parts + 1] = key_repr(k) .. " = " .. repr(v[k], depth + 1, seen)
   end
   local total = n + #keys
   if total > #parts then parts[#parts + 1] = "... (" .. total .. " entries)" end
   seen[v] = nil
   return "{" .. table.concat(parts, ", ") .. "}"
end
M.repr = function(v) return repr(v) end

-- top level: strings raw, as the lua REPL does; lumen's namespaces (lm.optim) as a summary
function M.print_results(n, ...)
   if n == 0 then return end
   local out = {}
   local ns
   for i = 1, n do
      local v = select(i, ...)
      if type(v) == "table" and not has_tostring(v) then
         ns = ns or namespaces()
         if ns[v] then out[i] = module_summary(ns[v], v) end
      end
      out[i] = out[i] or (type(v) == "string" and v or repr(v))
   end
   stdout:write(table.concat(out, "\t"), "\n")
   stdout:flush()
end

-- ---------------------------------------------------------------------------------------------
-- errors

local function traceback(msg)
   if type(msg) ~= "string" and not has_tostring(msg) then
      msg = "(error object is a " .. type(msg) .. " value)"
   end
   return debug.traceback(tostring(msg), 2)
end

-- first line of an error with a traceback, cut where the REPL's own frames begin
local function short_error(msg)
   msg = tostring(msg)
   local cut = msg:find("\nstack traceback:", 1, true)
   if cut then msg = msg:sub(1, cut - 1) end
   return msg
end
M.traceback, M.short_error = traceback, short_error

-- ---------------------------------------------------------------------------------------------
-- help: help(x) / ?x print x's entry of lua/lumen/doc.lua (the table docs/api.md is made from)

local doc_module
local function get_doc()
   if doc_module == nil then
      local ok, d = pcall(require, "lumen.doc")
      doc_module = ok and d or false
      if not ok then errmsg("help: cannot load lumen.doc: " .. tostring(d)) end
   end
   return doc_module or nil
end

--- help(x [, name]) -> the help text for x: a value (a function, a module, a class), a name
--- ("lm.zeros", "zeros", "Tensor:add"), or nothing (how to use the REPL).
function M.help_text(...)
   local d = get_doc()
   if not d then return "help: lumen.doc is not available" end
   return d.help(...)
end

function M.help(...)
   stdout:write(M.help_text(...), "\n")
   stdout:flush()
end

return M
