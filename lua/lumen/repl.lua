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
-- $LUMEN_HISTORY or ~/.lumen_history, TAB completion of globals and of fields: `lm.ze<TAB>`, and
-- of lumen's lazily loaded parts before they are loaded: `lm.op<TAB>`); plain io.read otherwise.
-- Expressions print their values (a line is first tried as "return <line>"), errors are printed
-- and the session goes on, incomplete chunks continue on a ">>" prompt. The last value is kept in
-- `_`. `help(x)` and `?x` print x's signature and description (lua/lumen/doc.lua).
--
-- Ctrl-C (see "interrupts" below): at the prompt it drops the line being typed (and an incomplete
-- chunk); during an evaluation it stops it and returns to the prompt, every time.
--
-- Used as a module, require("lumen.repl") gives { main = fn(argv), repl = fn(opts),
-- complete = fn(text, env), repr = fn(value), help = fn(x) }. bin/lumen runs this file as a
-- script.

local ffi = require("ffi")

local M = {}

local VERSION_LINE = "lumen -- " .. (jit and jit.version or _VERSION)

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

-- ---------------------------------------------------------------------------------------------
-- the C functions (libc, readline); each declaration is guarded, since other modules may already
-- have declared the same names in this LuaJIT state
local function cdef(src)
   pcall(ffi.cdef, src)
end
cdef("int isatty(int fd);")
cdef("void free(void *p);")
cdef("char *strdup(const char *s);")
cdef("typedef void (*lumen_sighandler_t)(int);")
cdef("lumen_sighandler_t signal(int signum, lumen_sighandler_t handler);")
cdef("struct pollfd { int fd; short events; short revents; };")
cdef("int poll(struct pollfd *fds, unsigned long nfds, int timeout);")

local SIGINT, EINTR, POLLIN = 2, 4, 1    -- the same on Linux and the BSDs

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
local function print_results(n, ...)
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
      void using_history(void);
      typedef char *lumen_rl_compentry_func_t(const char *, int);
      typedef char **lumen_rl_completion_func_t(const char *, int, int);
      typedef void lumen_rl_vcpfunc_t(char *);
      char **rl_completion_matches(const char *text, lumen_rl_compentry_func_t *entry_func);
      lumen_rl_completion_func_t *rl_attempted_completion_function;
      int rl_attempted_completion_over;
      int rl_completion_append_character;
      const char *rl_completer_word_break_characters;
      const char *rl_readline_name;
      void rl_callback_handler_install(const char *prompt, lumen_rl_vcpfunc_t *lhandler);
      void rl_callback_read_char(void);
      void rl_callback_handler_remove(void);
      int rl_set_signals(void);
      int rl_clear_signals(void);
      void rl_free_line_state(void);
      void rl_callback_sigcleanup(void);
      void rl_cleanup_after_signal(void);
      void rl_redisplay(void);
      int rl_catch_signals;
      int rl_point;
      int rl_end;
      int _rl_caught_signal;
   ]])
   if not ok and not pcall(ffi.typeof, "lumen_rl_vcpfunc_t") then return nil end
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

local function remember(s)
   if s:match("%S") then
      rl.add_history(s)
      if history_path then rl.append_history(1, history_path) end
   end
end

local function read_line_rl(prompt)
   local p = rl.readline(prompt)
   if p == nil then return nil end
   local s = ffi.string(p)
   ffi.C.free(p)
   remember(s)
   return s
end
-- readline calls back into Lua (completion): the call must not come from compiled code
if jit then jit.off(read_line_rl) end

-- ---------------------------------------------------------------------------------------------
-- interrupts (Ctrl-C)
--
-- What runs the REPL is LuaJIT's `luajit` command, whose SIGINT handler (set around the script)
-- makes the next Lua instruction raise "interrupted!" once and then resets SIGINT to the default:
-- a Ctrl-C at the prompt ended the session when Enter was pressed (the error came from the REPL's
-- own loop), and a second Ctrl-C during a computation killed the process. A Lua function cannot be
-- a signal handler (it would run in the middle of other Lua code), so the REPL uses a C handler
-- that only sets a flag: readline's own (rl_signal_handler, which stores the signal number in
-- readline's `_rl_caught_signal`), taken from rl_set_signals() once and kept installed for the
-- whole session, with readline's signal catching off (rl_catch_signals = 0) so that readline
-- never replaces it. Then:
--   * at the prompt, readline's callback interface reads the line: the REPL waits in poll() on
--     stdin, which a signal interrupts (EINTR, never restarted); on SIGINT the line is dropped
--     (and an incomplete chunk with it) and a fresh prompt comes. poll() also wakes every 250 ms,
--     so a flag set by a signal delivered to another thread (OpenMP workers) is seen too.
--   * during an evaluation, a count hook (every HOOK_COUNT VM instructions) reads the flag and
--     raises "interrupted!"; it keeps raising until the evaluation is over, so a pcall in the
--     interrupted code cannot swallow it. The flag is cleared before each prompt: every Ctrl-C
--     works, not only the first.
-- Hooks only run in LuaJIT's interpreter, not in compiled traces: a loop compiled by the JIT
-- (`for i = 1, 1e10 do end`) would never see the flag. So the chunks typed at the prompt (and the
-- functions they define) run with the JIT off for their own code (jit.off(chunk, true)); what they
-- call (lumen's operators, modules loaded with require/dofile) is compiled as usual. A long C
-- call (a big convolution) finishes before the interrupt is seen. A pure-Lua loop inside a
-- compiled function from a file cannot be interrupted this way; Ctrl-\ (SIGQUIT) still ends the
-- process.
-- Without readline (LUMEN_NO_READLINE, no libreadline), the luajit handler is re-armed before
-- every read and every evaluation instead: Ctrl-C at the prompt drops the line when Enter is
-- pressed, and interrupts a computation every time (in interpreted code).

local HOOK_COUNT = 10000
local intr = { mode = nil }      -- mode: "flag" (readline's handler), "host" (luajit's), or false

local function handler_id(h)
   return tonumber(ffi.cast("intptr_t", h))
end

local function setup_interrupts()
   if intr.mode ~= nil then return end
   intr.mode = false
   local okh, host = pcall(ffi.C.signal, SIGINT, ffi.cast("lumen_sighandler_t", 0))
   if not okh then return end
   ffi.C.signal(SIGINT, host)                  -- looked at, put back
   intr.host = host
   local hid = handler_id(host)
   if rl then
      local ok = pcall(function()
         local _ = rl._rl_caught_signal         -- the flag must be reachable
         rl.rl_catch_signals = 1
         rl.rl_set_signals()                    -- SIGINT -> rl_signal_handler (unless ignored)
         local h = ffi.C.signal(SIGINT, host)
         rl.rl_clear_signals()                  -- puts back the other signals' handlers
         local id = handler_id(h)
         if id == 0 or id == 1 or id == hid then error("no readline handler") end
         intr.flag_handler = h
      end)
      if ok then
         rl.rl_catch_signals = 0
         ffi.C.signal(SIGINT, intr.flag_handler)
         rl._rl_caught_signal = 0
         intr.mode = "flag"
         return
      end
      ffi.C.signal(SIGINT, host)
   end
   if hid ~= 0 and hid ~= 1 then intr.mode = "host" end
end

local function restore_interrupts()
   if intr.mode == "flag" then rl.rl_catch_signals = 1 end
   if intr.host ~= nil then ffi.C.signal(SIGINT, intr.host) end
   intr.mode = nil
end

-- "host" mode: the luajit handler resets itself to the default when it fires; arm it again
local function arm_host()
   if intr.mode == "host" then ffi.C.signal(SIGINT, intr.host) end
end

local function take_flag()
   local s = rl._rl_caught_signal
   if s ~= 0 then rl._rl_caught_signal = 0 end
   return s
end

local interrupting = false
local interrupt_hook
function interrupt_hook()
   if interrupting or rl._rl_caught_signal == SIGINT then
      rl._rl_caught_signal = 0
      if not interrupting then
         -- from now on at every instruction: a pcall that caught the error is left at once
         -- (with the count kept, the hook could land in the pcall'd function every time)
         interrupting = true
         debug.sethook(interrupt_hook, "", 1)
      end
      error("interrupted!", 2)
   end
end

-- around one evaluation
local function start_eval()
   interrupting = false
   if intr.mode == "flag" then
      -- the flag is not cleared here: a Ctrl-C right after Enter is meant for this evaluation
      -- (read_line_cb clears it before each prompt)
      debug.sethook(interrupt_hook, "", HOOK_COUNT)
   else
      arm_host()
   end
end

local function stop_eval()
   if intr.mode == "flag" then debug.sethook() end
   interrupting = false
end

-- a line read with readline's callback interface; returns the line, nil at end of input, or
-- false when Ctrl-C dropped it
local CANCELLED = false
local cb_done, cb_line
local function read_line_cb(prompt)
   if not rl_keep.line_handler then
      rl_keep.line_handler = ffi.cast("lumen_rl_vcpfunc_t *", function(p)
         cb_done = true
         if p == nil then
            cb_line = nil
         else
            cb_line = ffi.string(p)
            ffi.C.free(p)
         end
         -- removed here, so that readline does not print the prompt again after the line
         rl.rl_callback_handler_remove()
      end)
      rl_keep.pfd = ffi.new("struct pollfd[1]")
   end
   local pfd = rl_keep.pfd
   pfd[0].fd, pfd[0].events = 0, POLLIN
   cb_done, cb_line = false, nil
   take_flag()                                  -- a Ctrl-C from before this prompt is old news
   rl.rl_callback_handler_install(prompt, rl_keep.line_handler)
   while not cb_done do
      local r = ffi.C.poll(pfd, 1, 250)
      local errno = r < 0 and ffi.errno() or 0
      if rl._rl_caught_signal == SIGINT then
         take_flag()
         -- show the dropped line whole, mark it, and start over on a new line
         -- the cursor to the end of the dropped line, then readline's own clean-up after a
         -- signal (the terminal back in its usual mode), as Python's readline module does
         rl.rl_point = rl.rl_end
         rl.rl_redisplay()
         stdout:write("^C")
         stdout:flush()
         rl.rl_free_line_state()
         rl.rl_callback_sigcleanup()
         rl.rl_cleanup_after_signal()
         rl.rl_callback_handler_remove()
         stdout:write("\n")
         stdout:flush()
         rl.using_history()
         return CANCELLED
      end
      if r > 0 then
         rl.rl_callback_read_char()
      elseif r < 0 and errno ~= EINTR then
         rl.rl_callback_handler_remove()
         return nil
      end
   end
   if cb_line then remember(cb_line) end
   return cb_line
end
if jit then jit.off(read_line_cb) end

local function read_line_plain(prompt)
   stdout:write(prompt)
   stdout:flush()
   -- "host" mode: the luajit handler raises its error at the first Lua instruction after the
   -- read returns; the REPL loop takes that error for a dropped line
   arm_host()
   local line = io.read("*l")        -- not a tail call: the error must come from inside step
   return line
end

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

-- the REPL's error handler: the interrupt hook must not fire inside it
local function repl_traceback(msg)
   if intr.mode == "flag" then debug.sethook() end
   return traceback(msg)
end

-- fn returns pack(<values>) (expressions) or runs a statement; prints the values or the error
local function run_chunk_repl(fn, is_expr)
   -- the chunk and the functions it defines stay in the interpreter, where Ctrl-C reaches them
   -- (see "interrupts" above)
   if jit then jit.off(fn, true) end
   start_eval()
   local ok, res = xpcall(fn, repl_traceback, pack)
   local was_interrupted = interrupting
   stop_eval()
   if not ok then
      -- after the terminal's "^C"
      if was_interrupted then stderr:write("\n") end
      stderr:write(hint(short_error(res)), "\n")
      stderr:flush()
      return
   end
   if is_expr and type(res) == "table" then
      if res.n >= 1 then rawset(_G, "_", res[1]) end
      print_results(res.n, unpack(res, 1, res.n))
   end
end

-- `?x`: help for the expression x (`?lm.zeros`, `?t:add`, `?"conv2d"`); the text goes to help
-- too, so that a name is found even where the value is shared
local function help_line(expr)
   expr = expr:match("^%s*(.-)%s*$")
   if expr == "" then
      M.help()
      return
   end
   local obj, method = expr:match("^(.-):([%a_][%w_]*)$")
   local src = obj and ("return (" .. obj .. ")." .. method) or ("return " .. expr)
   local fn, cerr = loadstring(src, "=stdin")
   if not fn then
      stderr:write(cerr, "\n")
      stderr:flush()
      return
   end
   start_eval()
   local ok, v = xpcall(fn, repl_traceback)
   stop_eval()
   if not ok then
      stderr:write(short_error(v), "\n")
      stderr:flush()
      return
   end
   M.help(v, expr)
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

-- one line of input: returns the new incomplete-chunk buffer (nil when the chunk is done)
local function handle_line(buffer, line)
   if not buffer and line:match("^%s*%?") then
      help_line(line:match("^%s*%?(.*)$"))
      return nil
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
   if not fn and is_incomplete(cerr) then return src end
   if fn then
      run_chunk_repl(fn, is_expr)
   else
      stderr:write(cerr, "\n")
      stderr:flush()
   end
   return nil
end

--- Run the interactive loop until end of input. opts.quiet: no banner.
function M.repl(opts)
   opts = opts or {}
   install_lazy_lm()
   if rawget(_G, "help") == nil then rawset(_G, "help", M.help) end
   local ok, lm_or_err = pcall(function() return _G.lm end)
   if not opts.quiet then
      stdout:write(VERSION_LINE, "\n")
      if ok then
         local v = type(lm_or_err) == "table" and rawget(lm_or_err, "_VERSION")
         stdout:write("lm = require(\"lumen\")", v and (" (" .. tostring(v) .. ")") or "",
                      " is loaded. help() or ?x for help, TAB completes, Ctrl-C cancels,",
                      " Ctrl-D quits.\n")
      else
         local first = short_error(lm_or_err):match("^[^\n]*")
         stdout:write("could not load lumen: ", first, "\n(`make` builds it; `lm` stays unset)\n")
      end
      stdout:flush()
   end

   if rl == nil and stdin_is_tty() then rl = load_readline(_G) or false end
   setup_interrupts()
   local read_line = intr.mode == "flag" and read_line_cb or rl and read_line_rl
      or read_line_plain

   -- one prompt: read a line and run it; returns false at end of input. Each step runs under
   -- pcall: an interrupt that lands outside an evaluation (the luajit handler fires at whatever
   -- Lua instruction comes next) drops the line instead of ending the session
   local buffer
   local function step()
      local line = read_line(buffer and ">> " or "> ")
      if line == nil then
         if buffer then stderr:write("incomplete input dropped\n") end
         stdout:write("\n")
         return false
      end
      if line == CANCELLED then
         buffer = nil
      else
         buffer = handle_line(buffer, line)
      end
      return true
   end
   while true do
      local oks, more = pcall(step)
      if oks and not more then break end
      if not oks then
         buffer = nil
         if not tostring(more):find("interrupted!", 1, true) then
            stderr:write(short_error(more), "\n")
            stderr:flush()
         end
      end
   end
   restore_interrupts()
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
   -- lm.distributed after init: finalize MPI on success, abort the whole job on failure
   local dist = package.loaded["lumen.distributed"]
   if dist and dist._at_exit then dist._at_exit(code) end
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
