-- lumen.repl.line -- the REPL's line input: GNU readline through the FFI when libreadline loads
-- (line editing, history in $LUMEN_HISTORY or ~/.lumen_history, TAB completion from
-- lumen/repl/complete.lua), plain io.read otherwise. With readline's signal flag
-- (lumen/repl/interrupt.lua) the line is read through readline's callback interface, so that a
-- Ctrl-C at the prompt drops the line at once.

local ffi = require("ffi")
local complete = require("lumen.repl.complete").complete
local interrupt = require("lumen.repl.interrupt")

-- the C functions (libc); each declaration is guarded, since other modules may already have
-- declared the same names in this LuaJIT state
local function cdef(src)
   pcall(ffi.cdef, src)
end
cdef("int isatty(int fd);")
cdef("void free(void *p);")
cdef("char *strdup(const char *s);")
cdef("struct pollfd { int fd; short events; short revents; };")
cdef("int poll(struct pollfd *fds, unsigned long nfds, int timeout);")

local EINTR, POLLIN = 4, 1       -- the same on Linux and the BSDs
local SIGINT = interrupt.SIGINT
local take_flag = interrupt.take_flag

local stdout = io.stdout

local M = {}

local function stdin_is_tty()
   local ok, r = pcall(function() return ffi.C.isatty(0) end)
   return ok and r == 1
end
M.stdin_is_tty = stdin_is_tty

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
         local okc, list = pcall(complete, ffi.string(text), env)
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

-- a line read with readline's callback interface; returns the line, nil at end of input, or
-- false when Ctrl-C dropped it
local CANCELLED = false
M.CANCELLED = CANCELLED
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
   interrupt.arm_host()
   local line = io.read("*l")        -- not a tail call: the error must come from inside step
   return line
end

-- open(env): readline, loaded once per process when standard input is a terminal (completion
-- against env); returns the library, or false / nil without it
function M.open(env)
   if rl == nil and stdin_is_tty() then rl = load_readline(env) or false end
   return rl
end

-- reader(flag): the function that reads one line (prompt -> the line, nil at end of input, or
-- CANCELLED when Ctrl-C dropped it): readline's callback interface when Ctrl-C sets readline's
-- flag (interrupt mode "flag"), else readline, else io.read
function M.reader(flag)
   return flag and read_line_cb or rl and read_line_rl or read_line_plain
end

-- the end of a session: the history file cut to its last 2000 lines
function M.close()
   if rl and history_path then rl.history_truncate_file(history_path, 2000) end
end

return M
