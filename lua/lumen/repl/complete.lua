-- lumen.repl.complete -- TAB completion for the REPL's line editor: globals, fields of tables
-- and objects (`lm.ze<TAB>`, `t:ad<TAB>`), and lumen's lazily loaded parts before they are
-- loaded (`lm.op<TAB>`).

local M = {}

local KEYWORDS = {
   "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
   "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}

-- the fields one can reach on v with `.` or `:`: its own keys (tables), then what its metatable's
-- __index table offers (several levels: class chains), for tables, cdata and userdata alike
local function collect_fields(v, out, seen)
   seen = seen or {}
   for _ = 1, 8 do
      if v == nil or seen[v] then return end
      seen[v] = true
      if type(v) == "table" then
         for k in pairs(v) do
            if type(k) == "string" then out[k] = true end
         end
      end
      local mt = debug.getmetatable(v)
      if type(mt) ~= "table" then return end
      local idx = rawget(mt, "__index")
      if type(idx) ~= "table" then
         -- an __index function (tensors: methods plus the t.shape property) may name its method
         -- table in mt.__fields (lua/lumen/tensor.lua)
         local fields = rawget(mt, "__fields")
         if type(fields) == "table" then v = fields; goto continue end
         -- objects whose __index is a function: offer the methods of their metatable
         for k in pairs(mt) do
            if type(k) == "string" and not k:match("^__") then out[k] = true end
         end
         return
      end
      v = idx
      ::continue::
   end
end

-- the names a table's __index function loads on first use: lumen's `lazy` and `lazy_fn` tables
-- (lua/lumen/init.lua), found by name among the function's upvalues, and lm.F. So `lm.op<TAB>`
-- offers `lm.optim` before anything touched it. Nothing is loaded here; completing a path
-- (`lm.optim.S<TAB>`) loads it, as evaluating it would.
local LAZY_TABLES = { lazy = true, lazy_fn = true }
local function add_lazy_names(v, out)
   if type(v) ~= "table" then return end
   local mt = debug.getmetatable(v)
   local idx = type(mt) == "table" and rawget(mt, "__index")
   if type(idx) ~= "function" then return end
   for i = 1, 255 do
      local name, val = debug.getupvalue(idx, i)
      if name == nil then break end
      if LAZY_TABLES[name] and type(val) == "table" then
         for k in pairs(val) do
            if type(k) == "string" then out[k] = true end
         end
      end
   end
   if v == package.loaded["lumen"] then out.F = true end
end

-- complete `text` (the word under the cursor) against the environment env: a dotted/colon path
-- is resolved from env, its last part is matched as a prefix. Returns a sorted array of the full
-- replacement words.
function M.complete(text, env)
   env = env or _G
   local head, sep, tail = text:match("^(.-)([%.:])([%w_]*)$")
   local names = {}
   if not head then
      if not text:match("^[%w_]*$") then return {} end
      tail = text
      collect_fields(env, names)
      for _, kw in ipairs(KEYWORDS) do names[kw] = true end
      head, sep = "", ""
   else
      -- walk the path a.b.c (only plain names; no calls are made)
      local v = env
      for part in head:gmatch("[^%.:]+") do
         if not part:match("^[%a_][%w_]*$") then return {} end
         local ok, nv = pcall(function() return v[part] end)
         if not ok or nv == nil then return {} end
         v = nv
      end
      if head:match("[^%w_%.:]") or head == "" then return {} end
      collect_fields(v, names)
      add_lazy_names(v, names)
   end
   local out = {}
   for name in pairs(names) do
      -- private names (`_c`, `_VERSION`) only once a `_` is typed
      if name:sub(1, #tail) == tail and name:match("^[%a_][%w_]*$")
         and (name:sub(1, 1) ~= "_" or tail:sub(1, 1) == "_") then
         out[#out + 1] = head .. sep .. name
      end
   end
   table.sort(out)
   return out
end

return M
