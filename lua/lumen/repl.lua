-- lumen.repl -- the `lumen` command: runs scripts like the `lua` command does and, with no script,
-- opens an interactive REPL with `lm` (= require("lumen")) preloaded.
--
--    lumen [options] [script [args...]]
--      -e STMT   run STMT            -l NAME   require NAME into the global NAME
--      -i        REPL after the rest -v        version
--      -h        help                --        stop handling options
--      -         run standard input
--
-- This file is the command line; the REPL is in lua/lumen/repl/: session.lua (the loop: read,
-- run, print; `_`, `lm`, `help(x)` and `?x`), line.lua (GNU readline through the FFI when
-- libreadline loads: line editing, history in $LUMEN_HISTORY or ~/.lumen_history; plain io.read
-- otherwise), complete.lua (TAB completion of globals and of fields: `lm.ze<TAB>`, and of
-- lumen's lazily loaded parts before they are loaded: `lm.op<TAB>`), interrupt.lua (Ctrl-C: at
-- the prompt it drops the line being typed, during an evaluation it stops it and returns to
-- the prompt, every time) and display.lua (printing values, errors and help).
--
-- Used as a module, require("lumen.repl") gives { main = fn(argv), repl = fn(opts),
-- complete = fn(text, env), repr = fn(value), help = fn(x) } (and hint, help_text,
-- module_summary). bin/lumen runs this file as a script.

local display = require("lumen.repl.display")
local session = require("lumen.repl.session")
local line_input = require("lumen.repl.line")

local M = {}

M.repl = session.repl
M.complete = require("lumen.repl.complete").complete
M.hint, M.repr, M.module_summary = display.hint, display.repr, display.module_summary
M.help_text, M.help = display.help_text, display.help

local VERSION_LINE = session.VERSION_LINE
local stderr, stdout = io.stderr, io.stdout
local errmsg, traceback = display.errmsg, display.traceback

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

   if #actions > 0 then session.install_lazy_lm() end
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
      if line_input.stdin_is_tty() then
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

