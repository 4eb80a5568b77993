-- lumen.doc -- the docstrings of lumen's public API: ONE table that both the REPL's help
-- (`help(lm.zeros)`, `?lm.zeros`, lua/lumen/repl.lua) and docs/api.md (made by
-- tools/gen_api.lua: `bin/lumen tools/gen_api.lua > docs/api.md`) are made from.
-- spec/api_doc_spec.lua checks that every public name has an entry here and that docs/api.md is
-- up to date: a new public function needs an entry, then `bin/lumen tools/gen_api.lua >
-- docs/api.md`.
--
-- Entry names: `lm.zeros`, `lm.nn.Conv2d`, `lm.F.conv2d` (= lm.nn.functional.conv2d),
-- `Tensor:add` (a method of lm.Tensor), `Tensor.requires_grad` (a field), `Module:forward`
-- (lm.nn.Module), `Optimizer:step` (lm.optim.Optimizer).
-- Entry fields: sig (the call, with `-> result`), desc (one line), and optionally opts (the
-- options with their defaults), fmt (memory-format behaviour), err (the errors raised), note.
--
-- Loading this module loads nothing else; help() only looks at the lumen modules already loaded.

local M = {}

M.sections = {}      -- { {id =, title =, intro =, entries = {entry...}} ...} in document order
M.entries = {}       -- name -> entry
M.list = {}          -- every entry, in document order

local section

local function S(id, title, intro)
   section = { id = id, title = title, intro = intro, entries = {} }
   M.sections[#M.sections + 1] = section
end

local function E(name, sig, desc, more)
   assert(M.entries[name] == nil, "lumen.doc: two entries named " .. name)
   local e = { name = name, sig = sig, desc = desc, section = section.id }
   if more then
      for k, v in pairs(more) do e[k] = v end
   end
   section.entries[#section.entries + 1] = e
   M.entries[name] = e
   M.list[#M.list + 1] = e
   return e
end

S("creation", "Creation", "")
E("lm.zeros", "lm.zeros(sizes, opts) -> Tensor", "A new tensor filled with 0.")
E("lm.Tensor", "lm.Tensor", "The tensor type.")
E("lm.nn.Module", "lm.nn.Module", "Module base class.")
--[[ENTRIES]]

-- ---------------------------------------------------------------------------------------------
-- lookup

-- where the object prefixes of entry names live
local OWNERS = {
   Tensor = { "Tensor" },
   Module = { "nn", "Module" },
   Optimizer = { "optim", "Optimizer" },
}

-- the value an entry names, looked up with rawget only (nothing is loaded); nil when its
-- module is not loaded yet or the entry is a field
local function resolve(name)
   local lm = package.loaded["lumen"]
   if type(lm) ~= "table" then return nil end
   local parts = {}
   local owner, method = name:match("^(%u%a*):([%w_]+)$")
   if owner then
      local path = OWNERS[owner]
      if not path then return nil end
      for _, p in ipairs(path) do parts[#parts + 1] = p end
      parts[#parts + 1] = method
   else
      local rest = name:match("^lm%.(.+)$")
      if not rest then return nil end
      for p in rest:gmatch("[^%.]+") do parts[#parts + 1] = p end
   end
   local v = lm
   for _, p in ipairs(parts) do
      if type(v) ~= "table" then return nil end
      v = rawget(v, p)
      if v == nil then return nil end
   end
   return v
end
M.resolve = resolve

-- value -> the first entry (document order) naming it, among the loaded modules
local function find_value(v)
   if v == nil then return nil end
   for _, e in ipairs(M.list) do
      if resolve(e.name) == v then return e end
   end
   return nil
end

-- a name as typed: `lm.nn.functional.x` and `lm.functional.x` are `lm.F.x`; `t:add` (any
-- object) is found through its value
local function normalize(name)
   name = name:gsub("^lm%.nn%.functional%.", "lm.F."):gsub("^lm%.functional%.", "lm.F.")
   return name
end

-- entries whose name is `name` or ends in `.name` / `:name`
local function find_name(name)
   name = normalize(name)
   if M.entries[name] then return { M.entries[name] } end
   local out = {}
   for _, e in ipairs(M.list) do
      local tail = e.name:match("[%.:]([%w_]+)$")
      if tail == name then out[#out + 1] = e end
   end
   return out
end

local function wrap(text, indent, width)
   local lines, line = {}, indent
   for word in text:gmatch("%S+") do
      if #line > #indent and #line + 1 + #word > width then
         lines[#lines + 1] = line
         line = indent .. word
      else
         line = (#line > #indent) and (line .. " " .. word) or (line .. word)
      end
   end
   if #line > #indent then lines[#lines + 1] = line end
   return table.concat(lines, "\n")
end

local function entry_text(e, short)
   local out = { e.sig, wrap(e.desc, "  ", 96) }
   if not short then
      if e.opts then out[#out + 1] = wrap("options: " .. e.opts, "  ", 96) end
      if e.fmt then out[#out + 1] = wrap("memory format: " .. e.fmt, "  ", 96) end
      if e.err then out[#out + 1] = wrap("errors: " .. e.err, "  ", 96) end
      out[#out + 1] = "  (docs/api.md, " .. e.name .. ")"
   end
   return table.concat(out, "\n")
end
M.entry_text = entry_text

local GENERAL = [[
lumen REPL: `lm` is require("lumen"). Type a Lua statement or expression; values are printed,
the last one is kept in `_`.
  help(x), ?x     the signature and description of x (a function, module or class; or a name:
                  help("conv2d"))
  TAB             completes globals and fields (lm.op<TAB> -> lm.optim)
  Ctrl-C          drops the line being typed; stops a running computation
  Ctrl-D          quits
The whole API: docs/api.md.]]

--- help(x [, expr]) -> text. x: a value (function, module, class, tensor, module instance), a
--- name ("lm.zeros", "conv2d", "Tensor:add") or nothing; expr: the text the value came from.
function M.help(...)
   local n = select("#", ...)
   local x, expr = ...
   if n == 0 then return GENERAL end
   if expr then
      local hits = find_name(expr)
      if #hits == 1 then return entry_text(hits[1]) end
   end
   local e = type(x) ~= "string" and find_value(x) or nil
   if e then return entry_text(e) end
   local lm = package.loaded["lumen"]
   if type(lm) == "table" then
      if type(rawget(lm, "is_tensor")) == "function" and lm.is_tensor(x) then
         return tostring(x) .. "\n" .. entry_text(M.entries["lm.Tensor"], true)
            .. "\n  (methods: help(\"Tensor:<name>\"); docs/api.md, Tensor methods)"
      end
      local nn = rawget(lm, "nn")
      if type(nn) == "table" and type(x) == "table" and nn.is_module and nn.is_module(x) then
         local cls = getmetatable(x)
         local ce = cls and find_value(cls)
         if ce then return entry_text(ce) end
         return entry_text(M.entries["lm.nn.Module"])
      end
   end
   if type(x) == "string" then
      local hits = find_name(x)
      if #hits == 1 then return entry_text(hits[1]) end
      if #hits > 1 then
         local out = {}
         for _, h in ipairs(hits) do out[#out + 1] = entry_text(h, true) end
         return table.concat(out, "\n")
      end
      return "no help for " .. string.format("%q", x)
   end
   local what = expr or tostring(x)
   if type(x) == "function" then
      local info = debug.getinfo(x, "S")
      local where = info and info.short_src and info.linedefined
         and (info.short_src .. ":" .. info.linedefined) or "?"
      return "no help for " .. what .. " (a function defined at " .. where .. ")"
   end
   return "no help for " .. what .. " (a " .. type(x) .. " value)"
end

return M
