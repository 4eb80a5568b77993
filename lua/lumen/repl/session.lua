-- lumen.repl.session -- the interactive loop of the `lumen` command: read a line, run it, print
-- its values or its error, and go on. Expressions print their values (a line is first tried as
-- "return <line>"), errors are printed and the session goes on, incomplete chunks continue on a
-- ">>" prompt. The last value is kept in `_`; `lm` is a global, loaded on first use. `help(x)`
-- and `?x` print x's signature and description (lua/lumen/doc.lua).
--
-- The line comes from lumen/repl/line.lua (readline or io.read), Ctrl-C is
-- lumen/repl/interrupt.lua's, what is printed lumen/repl/display.lua's.

local display = require("lumen.repl.display")
local line_input = require("lumen.repl.line")
local interrupt = require("lumen.repl.interrupt")

local M = {}

M.VERSION_LINE = "lumen -- " .. (jit and jit.version or _VERSION)
local VERSION_LINE = M.VERSION_LINE

local stderr, stdout = io.stderr, io.stdout
local hint, traceback, short_error = display.hint, display.traceback, display.short_error
local print_results = display.print_results

local function is_incomplete(err)
   return err ~= nil and (err:find("<eof>'?$") ~= nil or err:find("<eof>\"?$") ~= nil)
end

local function pack(...)
   return { n = select("#", ...), ... }
end

-- the REPL's error handler: the interrupt hook must not fire inside it
local function repl_traceback(msg)
   interrupt.hook_off()
   return traceback(msg)
end

-- fn returns pack(<values>) (expressions) or runs a statement; prints the values or the error
local function run_chunk_repl(fn, is_expr)
   -- the chunk and the functions it defines stay in the interpreter, where Ctrl-C reaches them
   -- (see "interrupts" above)
   if jit then jit.off(fn, true) end
   interrupt.start_eval()
   local ok, res = xpcall(fn, repl_traceback, pack)
   local was_interrupted = interrupt.interrupted()
   interrupt.stop_eval()
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
      display.help()
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
   interrupt.start_eval()
   local ok, v = xpcall(fn, repl_traceback)
   interrupt.stop_eval()
   if not ok then
      stderr:write(short_error(v), "\n")
      stderr:flush()
      return
   end
   display.help(v, expr)
end

-- `lm` as a global for -e and the REPL, loaded on first use (a failed load is reported where it
-- is used, with the loader's message)
function M.install_lazy_lm()
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
   M.install_lazy_lm()
   if rawget(_G, "help") == nil then rawset(_G, "help", display.help) end
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

   interrupt.setup(line_input.open(_G))
   local read_line = line_input.reader(interrupt.mode() == "flag")

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
      if line == line_input.CANCELLED then
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
   interrupt.restore()
   line_input.close()
end

return M
