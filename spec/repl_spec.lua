-- spec/repl_spec.lua -- the `lumen` REPL in a real terminal (tmux): Ctrl-C at the prompt and
-- during computations, help(x) / ?x, TAB completion of lazily loaded names. See the
-- comments of lua/lumen/repl/interrupt.lua and README.md ("The REPL").
--
-- Each block starts its own tmux server (a unique -L socket) running bin/lumen (or
-- $LUMEN_INSTALL_TREE/bin/lumen for the installed run) with LUMEN_HISTORY in a temporary
-- directory. Every step waits for its output by polling the screen (generous timeouts: the
-- machine may be loaded), and computations print a marker before they start so that Ctrl-C is
-- only sent once they run. Skipped when tmux is missing.

local shell = require("spec.shell")
local q, sh = shell.q, shell.sh
local TREE = os.getenv("LUMEN_INSTALL_TREE")
if TREE == "" then TREE = nil end

local ROOT = (sh("pwd -P"):gsub("%s+$", ""))
local LAUNCHER = TREE and (TREE .. "/bin/lumen") or (ROOT .. "/bin/lumen")

local function env_prefix(extra)
   local parts = { "env" }
   for _, k in ipairs({ "LUMEN_LIB", "LUA_PATH", "LUA_CPATH", "LD_PRELOAD", "ASAN_OPTIONS",
                        "UBSAN_OPTIONS" }) do
      local v = os.getenv(k)
      if v then parts[#parts + 1] = k .. "=" .. q(v) end
   end
   for k, v in pairs(extra) do parts[#parts + 1] = k .. "=" .. q(v) end
   return table.concat(parts, " ")
end

local have_tmux = select(2, sh("command -v tmux")) == 0
local describe_tmux = have_tmux and describe or pending

-- a REPL session: start(), keys(...), type_line(text), wait_for(text, n), stop()
local function session()
   local s = {}
   local tmp = os.tmpname()              -- a unique name: the socket and the temporary directory
   os.remove(tmp)
   local dir = tmp .. ".d"
   local tmux = "tmux -L lumen-repl-spec-" .. tmp:match("[^/]+$")
   local name = "repl"

   function s.capture()
      return (sh(tmux .. " capture-pane -p -J -S -400 -t " .. name))
   end

   -- wait until the screen holds `text` (plain) at least n times; returns the screen
   function s.wait_for(text, n, seconds)
      n = n or 1
      local screen
      for _ = 1, (seconds or 60) * 10 do
         screen = s.capture()
         local count, from = 0, 1
         while true do
            local a, b = screen:find(text, from, true)
            if not a then break end
            count, from = count + 1, b + 1
         end
         if count >= n then return screen end
         -- the REPL died (the pane closed): no point waiting
         if select(2, sh(tmux .. " has-session -t " .. name)) ~= 0 then
            error("the REPL exited while waiting for " .. string.format("%q", text)
               .. "; last screen:\n" .. tostring(screen))
         end
         sh("sleep 0.1")
      end
      error("timed out waiting for " .. string.format("%q", text) .. " x" .. n .. "; screen:\n"
         .. tostring(screen))
   end

   function s.keys(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = q((select(i, ...))) end
      sh(tmux .. " send-keys -t " .. name .. " " .. table.concat(parts, " "))
   end

   function s.text(str)
      sh(tmux .. " send-keys -t " .. name .. " -l " .. q(str))
   end

   function s.type_line(str)
      s.text(str)
      s.keys("Enter")
   end

   function s.start()
      assert(sh("mkdir -p " .. q(dir)))
      local cmd = env_prefix({ LUMEN_HISTORY = dir .. "/history", HISTFILE = dir .. "/hist",
                               HOME = dir }) .. " " .. q(LAUNCHER)
      local out, rc = sh("env -u LD_PRELOAD " .. tmux .. " new-session -d -s " .. name
         .. " -x 160 -y 60 " .. q(cmd))
      assert(rc == 0, out)
      s.wait_for("Ctrl-D quits")
   end

   function s.stop()
      sh(tmux .. " kill-server")
      sh("rm -rf " .. q(dir))
   end

   return s
end

describe_tmux("REPL Ctrl-C", function()
   local s = session()
   setup(function() s.start() end)
   teardown(function() s.stop() end)

   it("at the prompt drops the line and the session goes on", function()
      s.text("this line is dropped")
      s.wait_for("this line is dropped")
      s.keys("C-c")
      s.wait_for("dropped^C")
      s.type_line("print('alive' .. 1)")
      s.wait_for("alive1")
      local screen = s.capture()
      assert.falsy(screen:find("interrupted", 1, true), screen)
   end)

   it("twice in a row at the prompt", function()
      s.text("abc")
      s.keys("C-c")
      s.keys("C-c")
      s.wait_for("^C", 3)
      s.type_line("print('alive' .. 2)")
      s.wait_for("alive2")
   end)

   it("drops an incomplete chunk", function()
      s.type_line("for i = 1, 2 do")
      s.wait_for(">> ")
      s.keys("C-c")
      s.type_line("print('alive' .. 3)")
      s.wait_for("alive3")
   end)

   it("interrupts a compiled-looking Lua loop, twice", function()
      for k = 1, 2 do
         s.type_line("io.write('busy', " .. k .. ", '\\n') for i = 1, 1e12 do end")
         s.wait_for("busy" .. k)
         s.keys("C-c")
         s.wait_for("interrupted!", k)
         s.type_line("print('back' .. " .. k .. ")")
         s.wait_for("back" .. k)
      end
   end)

   it("interrupts a loop of lumen operators, twice", function()
      s.type_line("x = lm.zeros({64, 64})")
      for k = 3, 4 do
         s.type_line("io.write('busy', " .. k .. ", '\\n') for i = 1, 1e12 do x = x + 1 end")
         s.wait_for("busy" .. k)
         s.keys("C-c")
         s.wait_for("interrupted!", k)
         s.type_line("print('back' .. " .. k .. ")")
         s.wait_for("back" .. k)
      end
   end)

   it("interrupts code that catches errors with pcall", function()
      s.type_line("io.write('busy', 5, '\\n') while true do pcall(function() "
         .. "for j = 1, 1e5 do end end) end")
      s.wait_for("busy5")
      s.keys("C-c")
      s.wait_for("interrupted!", 5)
      s.type_line("print('back' .. 5)")
      s.wait_for("back5")
   end)
end)

describe_tmux("REPL help and completion", function()
   local s = session()
   setup(function() s.start() end)
   teardown(function() s.stop() end)

   it("completes lazily loaded names before they are loaded: lm.opt<TAB> -> lm.optim", function()
      s.type_line("print('optim loaded: ' .. tostring(rawget(lm, 'optim') ~= nil))")
      s.wait_for("optim loaded: false")
      s.text("lm.opt")
      s.keys("Tab")
      s.wait_for("lm.optim")
      s.text(".SG")
      s.keys("Tab")
      s.wait_for("lm.optim.SGD")
      s.keys("C-u")
   end)

   it("help(lm.zeros) prints the signature and the description", function()
      s.type_line("help(lm.zeros)")
      local screen = s.wait_for("lm.zeros(sizes, opts) -> Tensor")
      local doc = require("lumen.doc")
      assert.truthy(screen:find(doc.entries["lm.zeros"].desc:sub(1, 30), 1, true), screen)
   end)

   it("?lm.zeros does the same", function()
      s.type_line("?lm.zeros")
      s.wait_for("lm.zeros(sizes, opts) -> Tensor", 2)
   end)

   it("?t:add finds a method through an object", function()
      s.type_line("t = lm.ones({2})")
      s.type_line("?t:add")
      s.wait_for(require("lumen.doc").entries["Tensor:add"].sig)
   end)
end)

describe("repl completion (no terminal)", function()
   local lm = require("lumen")
   local repl = require("lumen.repl")
   it("completes a tensor's methods through its __index function (mt.__fields)", function()
      local env = { x = lm.ones({ 2 }) }
      local got = repl.complete("x:ad", env)
      local set = {}
      for _, c in ipairs(got) do set[c] = true end
      assert.is_true(set["x:add"] and set["x:add_"] and true or false, table.concat(got, " "))
   end)
   it("lm.help returns the entry's text", function()
      assert.truthy(lm.help(lm.zeros):find("lm.zeros(sizes, opts) -> Tensor", 1, true))
   end)
end)

-- the REPL without a terminal (stdin piped, -i): what it prints for namespaces and the hint it
-- adds to Lua's comparison error
describe("the REPL's printing and hints", function()
   local function repl(input)
      local path = os.tmpname()
      local f = assert(io.open(path, "w"))
      f:write(input)
      f:close()
      local p = assert(io.popen("bin/lumen -i < " .. path .. " 2>&1"))
      local out = p:read("*a")
      p:close()
      os.remove(path)
      return out
   end

   it("prints lm.optim and other namespaces as a summary, not function addresses", function()
      local out = repl("lm.optim\nlm.optim.lr_scheduler\nlm.nn\n")
      assert.truthy(out:find("lm.optim: a lumen module", 1, true), out)
      assert.truthy(out:find("functions and classes: Adagrad, Adam, AdamW, RMSprop, SGD", 1,
                             true), out)
      assert.truthy(out:find("tables: Optimizer, lr_scheduler", 1, true), out)
      assert.truthy(out:find("lm.optim.lr_scheduler: a lumen module", 1, true), out)
      assert.truthy(out:find("OneCycleLR", 1, true), out)
      assert.truthy(out:find("lm.nn: a lumen module", 1, true), out)
      assert.truthy(out:find("help(lm.optim)", 1, true), out)
      assert.falsy(out:find("function: 0x", 1, true), out)
      -- a plain table is still listed as it is
      local t = repl("{a = 1, 2}\n")
      assert.truthy(t:find("{2, a = 1}", 1, true), t)
   end)

   it("says how to compare a tensor with a number when Lua's < > raise", function()
      local out = repl("local t = lm.ones({2}); return t > 2\n")
      assert.truthy(out:find("attempt to compare number with table", 1, true), out)
      assert.truthy(out:find("hint: Lua's < > <= >= cannot compare a tensor: use t:gt(2)", 1,
                             true), out)
      -- and in scripts too
      local p = assert(io.popen("bin/lumen -e 'return lm.ones({2}) <= 1' 2>&1"))
      local s = p:read("*a")
      p:close()
      assert.truthy(s:find("use t:gt(2)", 1, true), s)
      -- other errors carry no hint
      assert.falsy(repl("error('boom')\n"):find("hint:", 1, true))
   end)
end)
