-- lumen.repl -- the `lumen` command: runs scripts like the `lua` command does and, with no script,
-- opens an interactive REPL with `lm` (= require("lumen")) preloaded.
--
--    lumen [options] [script [args...]]
--      -e STMT   run STMT            -l NAME   require NAME into the global NAME
--      -i        REPL after the rest -v        version
--      -h        help                --        stop handling options
--      -         run standard input
--
-- REPL: GNU readline through the FFI when libreadline loads (line editing, history in
-- $LUMEN_HISTORY or ~/.lumen_history, TAB completion of globals and of fields: `lm.ze<TAB>`);
-- plain io.read otherwise. Expressions print their values (a line is first tried as
-- "return <line>"), errors are printed and the session goes on, incomplete chunks continue on a
-- ">>" prompt. The last value is kept in `_`.
--
-- Used as a module, require("lumen.repl") gives { main = fn(argv), repl = fn(opts),
-- complete = fn(text, env), repr = fn(value) }. bin/lumen runs this file as a script.

local ffi = require("ffi")

local M = {}

local VERSION_LINE = "lumen -- " .. (jit and jit.version or _VERSION)

local stderr, stdout = io.stderr, io.stdout

local function errmsg(msg)
   stderr:write("lumen: ", tostring(msg), "\n")
   stderr:flush()
end

-- ---------------------------------------------------------------------------------------------
-- the C functions (libc, readline); each declaration is guarded, since other modules may already
-- have declared the same names in this LuaJIT state
local function cdef(src)
   pcall(ffi.cdef, src)
end
cdef("int isatty(int fd);")
cdef("void free(void *p);")
cdef("char *strdup(const char *s);")

local function stdin_is_tty()
   local ok, r = pcall(function() return ffi.C.isatty(0) end)
   return ok and r == 1
end

-- ---------------------------------------------------------------------------------------------
-- printing values

local KEYWORDS = {
   "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
   "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}

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

-- top level: strings raw, as the lua REPL does
local function print_results(n, ...)
   if n == 0 then return end
   local out = {}
   for i = 1, n do
      local v = select(i, ...)
      out[i] = type(v) == "string" and v or repr(v)
   end
   stdout:write(table.concat(out, "\t"), "\n")
   stdout:flush()
end

-- ---------------------------------------------------------------------------------------------
-- completion

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
         -- objects whose __index is a function: offer the methods of their metatable
         for k in pairs(mt) do
            if type(k) == "string" and not k:match("^__") then out[k] = true end
         end
         return
      end
      v = idx
   end
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

-- ---------------------------------------------------------------------------------------------
-- line input: readline when it loads, io.read otherwise

local rl                -- the readline namespace, or nil
local rl_keep = {}      -- C strings and callbacks readline points at: never collected
local history_path

local function history_file()
   local p = os.getenv("LUMEN_HISTORY")
   if p and p ~= "" then return p end
   local home = os.getenv("HOME")
   if home and home ~= "" then return home .. "/.lumen_history" end
   return nil
end

local function c_string(s)
   local buf = ffi.new("char[?]", #s + 1, s)
   rl_keep[#rl_keep + 1] = buf
   return buf
end

local function load_readline(env)
   if os.getenv("LUMEN_NO_READLINE") then return nil end
   local ok = pcall(ffi.cdef, [[
      char *readline(const char *prompt);
      void add_history(const char *line);
      int read_history(const char *filename);
      int append_history(int nelements, const char *filename);
      int history_truncate_file(const char *filename, int nlines);
      typedef char *lumen_rl_compentry_func_t(const char *, int);
      typedef char **lumen_rl_completion_func_t(const char *, int, int);
      char **rl_completion_matches(const char *text, lumen_rl_compentry_func_t *entry_func);
      lumen_rl_completion_func_t *rl_attempted_completion_function;
      int rl_attempted_completion_over;
      int rl_completion_append_character;
      const char *rl_completer_word_break_characters;
      const char *rl_readline_name;
   ]])
   if not ok and not pcall(ffi.typeof, "lumen_rl_compentry_func_t") then return nil end
   local lib
   for _, name in ipairs({ "libreadline.so.8", "readline", "libreadline.so.7",
                           "libreadline.so.6" }) do
      local okl, l = pcall(ffi.load, name)
      if okl then lib = l break end
   end
   if not lib then return nil end
   rl_keep.lib = lib

   -- completion: readline asks for the matches of the word before the cursor; the generator
   -- hands them out one malloc'd string at a time (state 0 = a new word)
   local matches, pos = {}, 0
   local generator = ffi.cast("lumen_rl_compentry_func_t *", function(text, state)
      if state == 0 then
         local okc, list = pcall(M.complete, ffi.string(text), env)
         matches, pos = okc and list or {}, 0
      end
      pos = pos + 1
      local m = matches[pos]
      if m == nil then return nil end
      return ffi.C.strdup(m)
   end)
   local attempted = ffi.cast("lumen_rl_completion_func_t *", function(text)
      lib.rl_attempted_completion_over = 1        -- no file-name completion as a fallback
      lib.rl_completion_append_character = 0      -- no space after `lm.zeros`
      return lib.rl_completion_matches(text, generator)
   end)
   rl_keep.generator, rl_keep.attempted = generator, attempted
   lib.rl_readline_name = c_string("lumen")
   -- words break on operators and brackets but not on `.` and `:`, so `lm.nn.Co` is one word
   lib.rl_completer_word_break_characters = c_string(" \t\n\"'`@$><=;|&{}()[],+-*/%^~#")
   lib.rl_attempted_completion_function = attempted

   history_path = history_file()
   if history_path then
      lib.read_history(history_path)
      local f = io.open(history_path, "a")        -- append_history needs an existing file
      if f then f:close() else history_path = nil end
   end
   return lib
end

local function read_line_rl(prompt)
   local p = rl.readline(prompt)
   if p == nil then return nil end
   local s = ffi.string(p)
   ffi.C.free(p)
   if s:match("%S") then
      rl.add_history(s)
      if history_path then rl.append_history(1, history_path) end
   end
   return s
end
-- readline calls back into Lua (completion): the call must not come from compiled code
if jit then jit.off(read_line_rl) end

local function read_line_plain(prompt)
   stdout:write(prompt)
   stdout:flush()
   return io.read("*l")
end

-- ---------------------------------------------------------------------------------------------
-- running chunks

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

local function is_incomplete(err)
   return err ~= nil and (err:find("<eof>'?$") ~= nil or err:find("<eof>\"?$") ~= nil)
end

local function pack(...)
   return { n = select("#", ...), ... }
end

-- fn returns pack(<values>) (expressions) or runs a statement; prints the values or the error
local function run_chunk_repl(fn, is_expr)
   local ok, res = xpcall(fn, traceback, pack)
   if not ok then
      stderr:write(short_error(res), "\n")
      stderr:flush()
      return
   end
   if is_expr and type(res) == "table" then
      if res.n >= 1 then rawset(_G, "_", res[1]) end
      print_results(res.n, unpack(res, 1, res.n))
   end
end

-- `lm` as a global for -e and the REPL, loaded on first use (a failed load is reported where it
-- is used, with the loader's message)
local function install_lazy_lm()
   local mt = getmetatable(_G) or {}
   local old = mt.__index
   mt.__index = function(t, k)
      if k == "lm" then
         local m = require("lumen")
         rawset(t, "lm", m)
         return m
      end
      if type(old) == "function" then return old(t, k) end
      if type(old) == "table" then return old[k] end
      return nil
   end
   setmetatable(_G, mt)
end

--- Run the interactive loop until end of input. opts.quiet: no banner.
function M.repl(opts)
   opts = opts or {}
   install_lazy_lm()
   local ok, lm_or_err = pcall(function() return _G.lm end)
   if not opts.quiet then
      stdout:write(VERSION_LINE, "\n")
      if ok then
         local v = type(lm_or_err) == "table" and rawget(lm_or_err, "_VERSION")
         stdout:write("lm = require(\"lumen\")", v and (" (" .. tostring(v) .. ")") or "",
                      " is loaded. TAB completes, Ctrl-D quits.\n")
      else
         local first = short_error(lm_or_err):match("^[^\n]*")
         stdout:write("could not load lumen: ", first, "\n(`make` builds it; `lm` stays unset)\n")
      end
      stdout:flush()
   end

   if rl == nil and stdin_is_tty() then rl = load_readline(_G) or false end
   local read_line = rl and read_line_rl or read_line_plain

   local buffer
   while true do
      local line = read_line(buffer and ">> " or "> ")
      if line == nil then
         if buffer then stderr:write("incomplete input dropped\n") end
         stdout:write("\n")
         break
      end
      local src = buffer and (buffer .. "\n" .. line) or line
      if not buffer and src:sub(1, 1) == "=" then src = "return " .. src:sub(2) end
      -- an expression list? The values go through a call (not `return <src>`), so that an error
      -- raised by the expression keeps its position (a tail call would lose it)
      local fn, cerr
      local is_expr = loadstring("return " .. src, "=stdin") ~= nil
      if is_expr then
         fn = loadstring("local __lumen_pack = ...; return __lumen_pack(" .. src .. ")", "=stdin")
         is_expr = fn ~= nil
      end
      if not fn then fn, cerr = loadstring(src, "=stdin") end
      if not fn and is_incomplete(cerr) then
         buffer = src
      else
         buffer = nil
         if fn then
            run_chunk_repl(fn, is_expr)
         else
            stderr:write(cerr, "\n")
            stderr:flush()
         end
      end
   end
   if rl and history_path then rl.history_truncate_file(history_path, 2000) end
end

-- ---------------------------------------------------------------------------------------------
-- the command line

local USAGE = [==[
usage: lumen [options] [script [args]]
  -e stmt   execute string 'stmt'
  -l name   require library 'name' (into the global 'name')
  -i        enter interactive mode after running the script / -e
  -v        show version information
  -h        show this help
  --        stop handling options
  -         execute stdin and stop handling options
With no script and no -e, lumen opens the REPL (or runs standard input when it is not a terminal).
]==]

local function finish(code)
   io.stdout:flush()
   collectgarbage()
   collectgarbage()
   os.exit(code, true)
end

local function report(ok, err)
   if not ok then
      errmsg(err)
      return false
   end
   return true
end

local function docall(fn, ...)
   return xpcall(fn, traceback, ...)
end

--- Entry point: argv is an `arg`-style table (argv[1..] are the command-line words).
function M.main(argv)
   argv = argv or {}
   local i, n = 1, #argv
   local interactive, ran_something, version = false, false, false
   local actions = {}
   local script_index
   while i <= n do
      local a = argv[i]
      if a == "--" then
         i = i + 1
         if i <= n then script_index = i end
         break
      elseif a == "-" then
         script_index = i
         break
      elseif a == "-i" then
         interactive = true
      elseif a == "-v" then
         version = true
      elseif a == "-h" or a == "--help" then
         stdout:write(USAGE)
         finish(0)
      elseif a == "-e" or a == "-l" then
         local v = argv[i + 1]
         if v == nil then
            errmsg("'" .. a .. "' needs an argument")
            stderr:write(USAGE)
            finish(1)
         end
         actions[#actions + 1] = { a, v }
         i = i + 1
      elseif a:sub(1, 2) == "-e" or a:sub(1, 2) == "-l" then
         actions[#actions + 1] = { a:sub(1, 2), a:sub(3) }
      elseif a:sub(1, 1) == "-" then
         errmsg("unrecognized option '" .. a .. "'")
         stderr:write(USAGE)
         finish(1)
      else
         script_index = i
         break
      end
      i = i + 1
   end

   if version then
      stdout:write(VERSION_LINE, "\n")
      ran_something = true
   end

   -- `arg` as lua sets it: arg[0] = the script, arg[1..] its arguments, options below 0
   local new_arg = {}
   local base = script_index or (n + 1)
   for k = 1, n do new_arg[k - base] = argv[k] end
   new_arg[-base] = "lumen"
   _G.arg = new_arg

   if #actions > 0 then install_lazy_lm() end
   for _, act in ipairs(actions) do
      local kind, v = act[1], act[2]
      local ok, err
      if kind == "-e" then
         local fn, cerr = loadstring(v, "=(command line)")
         if not fn then
            ok, err = false, cerr
         else
            ok, err = docall(fn)
         end
      else
         ok, err = docall(function() rawset(_G, v, require(v)) end)
      end
      if not report(ok, err) then finish(1) end
      ran_something = true
   end

   if script_index then
      local path = argv[script_index]
      local fn, cerr
      if path == "-" then
         fn, cerr = loadstring(io.read("*a"), "=stdin")
      else
         fn, cerr = loadfile(path)
      end
      if not fn then
         errmsg(cerr)
         finish(1)
      end
      local ok, err = docall(fn, unpack(argv, script_index + 1, n))
      if not report(ok, err) then finish(1) end
      ran_something = true
   end

   if interactive then
      M.repl()
   elseif not ran_something then
      if stdin_is_tty() then
         M.repl()
      else
         local fn, cerr = loadstring(io.read("*a"), "=stdin")
         if not fn then
            errmsg(cerr)
            finish(1)
         end
         if not report(docall(fn)) then finish(1) end
      end
   end
   finish(0)
end

-- run as a script (bin/lumen execs `luajit .../lumen/repl.lua args...`): the chunk's source is
-- then the file named by arg[0]
local this = debug.getinfo(1, "S").source
if type(arg) == "table" and arg[0] and this == "@" .. arg[0] then
   M.main(arg)
end

return M
