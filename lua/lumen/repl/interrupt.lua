-- lumen.repl.interrupt -- Ctrl-C in the REPL: at the prompt it drops the line being typed (and an
-- incomplete chunk); during an evaluation it stops it and returns to the prompt, every time.
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
--     (and an incomplete chunk with it) and a fresh prompt comes (lumen/repl/line.lua). poll()
--     also wakes every 250 ms, so a flag set by a signal delivered to another thread (OpenMP
--     workers) is seen too.
--   * during an evaluation, a count hook (every HOOK_COUNT VM instructions) reads the flag and
--     raises "interrupted!"; it keeps raising until the evaluation is over, so a pcall in the
--     interrupted code cannot swallow it. The flag is cleared before each prompt: every Ctrl-C
--     works, not only the first.
-- Hooks only run in LuaJIT's interpreter, not in compiled traces: a loop compiled by the JIT
-- (`for i = 1, 1e10 do end`) would never see the flag. So the chunks typed at the prompt (and the
-- functions they define) run with the JIT off for their own code (jit.off(chunk, true),
-- lumen/repl/session.lua); what they call (lumen's operators, modules loaded with require/dofile)
-- is compiled as usual. A long C call (a big convolution) finishes before the interrupt is seen.
-- A pure-Lua loop inside a compiled function from a file cannot be interrupted this way; Ctrl-\
-- (SIGQUIT) still ends the process.
-- Without readline (LUMEN_NO_READLINE, no libreadline), the luajit handler is re-armed before
-- every read and every evaluation instead: Ctrl-C at the prompt drops the line when Enter is
-- pressed, and interrupts a computation every time (in interpreted code).

local ffi = require("ffi")

-- each declaration is guarded, since other modules may already have declared the same names in
-- this LuaJIT state
pcall(ffi.cdef, "typedef void (*lumen_sighandler_t)(int);")
pcall(ffi.cdef, "lumen_sighandler_t signal(int signum, lumen_sighandler_t handler);")

local SIGINT = 2                 -- the same on Linux and the BSDs

local M = {}
M.SIGINT = SIGINT

local rl                         -- the readline library (flag mode), set by setup

local HOOK_COUNT = 10000
local intr = { mode = nil }      -- mode: "flag" (readline's handler), "host" (luajit's), or false

local function handler_id(h)
   return tonumber(ffi.cast("intptr_t", h))
end

-- setup(rl): take over SIGINT for a session; rl is the readline library (lumen/repl/line.lua),
-- or false / nil without it (then the luajit handler is re-armed instead)
function M.setup(lib)
   rl = lib
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

-- the SIGINT handling from before setup, at the end of a session
function M.restore()
   if intr.mode == "flag" then rl.rl_catch_signals = 1 end
   if intr.host ~= nil then ffi.C.signal(SIGINT, intr.host) end
   intr.mode = nil
end

-- "host" mode: the luajit handler resets itself to the default when it fires; arm it again
local function arm_host()
   if intr.mode == "host" then ffi.C.signal(SIGINT, intr.host) end
end
M.arm_host = arm_host

-- clear the flag (a Ctrl-C from before a prompt is old news); returns the signal it held
function M.take_flag()
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
function M.start_eval()
   interrupting = false
   if intr.mode == "flag" then
      -- the flag is not cleared here: a Ctrl-C right after Enter is meant for this evaluation
      -- (read_line_cb clears it before each prompt)
      debug.sethook(interrupt_hook, "", HOOK_COUNT)
   else
      arm_host()
   end
end

function M.stop_eval()
   if intr.mode == "flag" then debug.sethook() end
   interrupting = false
end

-- "flag" (readline's handler), "host" (luajit's), false (neither), nil (before setup)
function M.mode() return intr.mode end

-- true while an evaluation is being interrupted (read before stop_eval)
function M.interrupted() return interrupting end

-- no interrupt hook from here on (the REPL's error handler must not be interrupted itself)
function M.hook_off()
   if intr.mode == "flag" then debug.sethook() end
end

return M
