-- spec/install_spec.lua -- where lumen is loaded from, and the `lumen` command (scripts, -e, stdin,
-- the REPL driven through tmux).
--
-- In-tree run (make test): require("lumen") must resolve to ./lua and the library to LUMEN_LIB
-- (or build/liblumen.so). Installed run (.ci/run sets LUMEN_INSTALL_TREE to a `luarocks make
-- --tree` directory and runs busted with --run=installed): everything must come from that tree,
-- and the launcher tested is <tree>/bin/lumen.

local TREE = os.getenv("LUMEN_INSTALL_TREE")
if TREE == "" then TREE = nil end

local function q(s)
   return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- run a shell command; returns its output (stdout and stderr together) and exit status
local function sh(cmd)
   local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\""))
   local out = p:read("*a")
   p:close()
   local rc = tonumber(out:match("__rc=(%d+)%s*$"))
   out = out:gsub("__rc=%d+%s*$", "")
   return out, rc
end

local function realpath(path)
   local out, rc = sh("readlink -f -- " .. q(path))
   if rc ~= 0 then return nil end
   return (out:gsub("%s+$", ""))
end

local function write_file(path, text)
   local f = assert(io.open(path, "w"))
   f:write(text)
   f:close()
end

local function read_file(path)
   local f = io.open(path, "r")
   if not f then return nil end
   local s = f:read("*a")
   f:close()
   return s
end

local ROOT = realpath(".")
local LAUNCHER = TREE and (TREE .. "/bin/lumen") or (ROOT .. "/bin/lumen")

-- environment the launcher gets (explicitly, so that tmux sessions see it too)
local function env_prefix(extra)
   local parts = { "env" }
   for _, k in ipairs({ "LUMEN_LIB", "LUA_PATH", "LUA_CPATH", "LD_PRELOAD", "ASAN_OPTIONS",
                        "UBSAN_OPTIONS", "HOME" }) do
      local v = os.getenv(k)
      if v then parts[#parts + 1] = k .. "=" .. q(v) end
   end
   for k, v in pairs(extra or {}) do parts[#parts + 1] = k .. "=" .. q(v) end
   return table.concat(parts, " ")
end

local function lumen(args, stdin)
   local cmd = env_prefix() .. " " .. q(LAUNCHER) .. " " .. args
   if stdin then
      local tmp = os.tmpname()
      write_file(tmp, stdin)
      local out, rc = sh(cmd .. " < " .. q(tmp))
      os.remove(tmp)
      return out, rc
   end
   return sh(cmd .. " < /dev/null")
end

describe("install", function()
   it("require('lumen') resolves to " .. (TREE and "the install tree" or "the source tree"),
      function()
         local path = package.searchpath("lumen", package.path)
         assert.is_not_nil(path, "lumen is not on package.path")
         local real = realpath(path)
         if TREE then
            local prefix = realpath(TREE) .. "/share/lua/5.1/lumen/"
            assert.are.equal(prefix, real:sub(1, #prefix))
         else
            assert.are.equal(ROOT .. "/lua/lumen/init.lua", real)
         end
         local lm = require("lumen")
         assert.is_table(lm)
      end)

   -- every module of the source tree (lua/lumen/**/*.lua, and models/*.lua, which the install
   -- puts under lumen/models/) resolves to the same place and loads: .ci/run's installed pass runs
   -- only the spec files that depend on where lumen was loaded from, so this is what makes sure
   -- that nothing the others load is missing from the install
   local function source_modules()
      local mods = {}
      for f in io.popen("cd lua && find lumen -name '*.lua' | sort"):lines() do
         mods[#mods + 1] = (f:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", "."))
      end
      return mods
   end
   local function model_files()
      local names = {}
      for f in io.popen("ls models/*.lua 2>/dev/null"):lines() do
         names[#names + 1] = f:match("([^/]+)%.lua$")
      end
      return names
   end

   it("every lumen module of the source tree comes from the same place and loads", function()
      local where = TREE and (realpath(TREE) .. "/share/lua/5.1/") or (ROOT .. "/lua/")
      local mods = source_modules()
      assert.is_true(#mods > 30, "lua/lumen lists " .. #mods .. " modules")
      for _, mod in ipairs(mods) do
         local path = package.searchpath(mod, package.path)
         assert.is_not_nil(path, mod .. " is not on package.path")
         local real = realpath(path)
         assert.are.equal(where, real:sub(1, #where), mod .. " resolved to " .. real)
         local ok, err = pcall(require, mod)
         assert.is_true(ok, mod .. ": " .. tostring(err))
      end
   end)

   it("lm.models finds every model file " ..
      (TREE and "installed under lumen/models/" or "in models/"), function()
      local lm = require("lumen")
      local names = model_files()
      assert.is_true(#names >= 4, "models/ lists " .. #names .. " files")
      for _, name in ipairs(names) do
         local path = package.searchpath("lumen.models." .. name, package.path)
         if TREE then
            assert.is_not_nil(path, "lumen.models." .. name .. " is not installed")
            local prefix = realpath(TREE) .. "/share/lua/5.1/lumen/models/"
            assert.are.equal(prefix, realpath(path):sub(1, #prefix))
         else
            assert.is_nil(path, "models/ on package.path in-tree: " .. tostring(path))
         end
      end
      for _, ctor in ipairs({ "resnet18", "resnet50", "alexnet", "small_resnet", "r3d_18" }) do
         assert.is_function(lm.models[ctor], ctor)
      end
      lm.manual_seed(1)
      local m = lm.models.small_resnet({ num_classes = 10, width = 8, blocks = 1 }):eval()
      local y = lm.no_grad(function() return m(lm.randn({ 2, 1, 28, 28 })) end)
      assert.are.same({ 2, 10 }, y:size())
   end)


   it("loads liblumen.so from LUMEN_LIB / the expected place", function()
      require("lumen")
      local expected = os.getenv("LUMEN_LIB")
      if not expected or expected == "" then
         expected = TREE and (TREE .. "/lib/lua/5.1/lumen/liblumen.so") or
            (ROOT .. "/build/liblumen.so")
      end
      expected = realpath(expected)
      local maps = read_file("/proc/self/maps")
      assert.is_not_nil(maps, "/proc/self/maps is not readable")
      local seen = {}
      for path in maps:gmatch("(/%S*liblumen[^/%s]*%.so)") do
         -- the CUDA backend (liblumen_cuda.so, loaded by liblumen when a spec in this process
         -- asked for cuda:N) must sit beside the library, unless LUMEN_CUDA_LIB names another
         local dir, name = path:match("^(.*)/(liblumen_cuda[^/]*%.so)$")
         if dir then
            local env = os.getenv("LUMEN_CUDA_LIB")
            if env and env ~= "" then
               assert.are.equal(realpath(env), path, "the CUDA library is not LUMEN_CUDA_LIB")
            else
               assert.are.equal(expected:match("^(.*)/"), dir, name .. " is not beside liblumen.so")
            end
         else
            seen[path] = true
         end
      end
      assert.is_true(seen[expected] == true, "liblumen.so mapped from elsewhere than " ..
         tostring(expected))
      for path in pairs(seen) do
         assert.are.equal(expected, path, "a second liblumen.so is mapped")
      end
   end)

   if TREE then
      it("the install tree holds the libraries in lib/lua/5.1/lumen/, where package.cpath " ..
         "finds them; no top-level liblumen, no CUDA library unless asked", function()
         local path = package.searchpath("lumen.liblumen", package.cpath)
         assert.are.equal(realpath(TREE .. "/lib/lua/5.1/lumen/liblumen.so"),
                          path and realpath(path))
         assert.is_nil(io.open(TREE .. "/lib/lua/5.1/liblumen.so"))
         if os.getenv("LUMEN_CUDA") ~= "1" then
            assert.is_nil(io.open(TREE .. "/lib/lua/5.1/lumen/liblumen_cuda.so"))
         end
      end)
   end

   -- the ONNX writer is looked for beside liblumen.so (lua/lumen/onnx.lua): in the installed run
   -- the tree's copy must be the one loaded (last: the test above wants no other liblumen*.so)
   local onnx_lib = TREE and (TREE .. "/lib/lua/5.1/lumen/liblumen_onnx.so")
   local have_onnx = TREE and read_file(onnx_lib) ~= nil or
      (not TREE and read_file(ROOT .. "/build/liblumen_onnx.so") ~= nil)
   ;(have_onnx and it or pending)("lm.onnx.export loads its writer " ..
      (TREE and "from the install tree" or "from the build") ..
      (have_onnx and "" or " (not built: protoc-c / libprotobuf-c-dev missing)"), function()
      local lm = require("lumen")
      lm.manual_seed(2)
      local w = lm.randn({ 4, 3, 3, 3 })
      local fn = function(x) return lm.F.conv2d(x, w, nil, { padding = 1, relu = true }) end
      local path = os.tmpname()
      lm.onnx.export(fn, lm.randn({ 1, 3, 8, 8 }), path)
      local bytes = read_file(path)
      os.remove(path)
      assert.is_true(bytes ~= nil and #bytes > 100, "no ONNX file written")
      if TREE then
         local maps = read_file("/proc/self/maps")
         local want = realpath(onnx_lib)
         local seen = {}
         for lib in maps:gmatch("(/%S*liblumen_onnx%.so)") do seen[lib] = true end
         assert.is_true(seen[want] == true, "liblumen_onnx.so not loaded from the tree")
         for lib in pairs(seen) do assert.are.equal(want, lib, "a second liblumen_onnx.so") end
      end
   end)
end)

describe("the lumen command", function()
   it("runs a script with arg set as lua does", function()
      local script = os.tmpname()
      -- `...` of the chunk are its arguments; arg[0] is the script
      write_file(script, "local a, b = ...\n"
         .. "print(arg[0] == " .. string.format("%q", script) .. ", a, b, #arg, arg[-1] ~= nil)\n")
      local out, rc = lumen(q(script) .. " x 'y z'")
      os.remove(script)
      assert.are.equal(0, rc, out)
      assert.are.equal("true\tx\ty z\t2\ttrue\n", out)
   end)

   it("has lm on -e and runs standard input", function()
      local out, rc = lumen("-e 'print(type(lm), lm == require(\"lumen\"))'")
      assert.are.equal(0, rc, out)
      assert.are.equal("table\ttrue\n", out)
      out, rc = lumen("", "print(40 + 2)\n")
      assert.are.equal(0, rc, out)
      assert.are.equal("42\n", out)
   end)

   it("reports errors with a non-zero exit", function()
      local out, rc = lumen("-e 'error(\"boom\")'")
      assert.are.equal(1, rc)
      assert.truthy(out:find("boom", 1, true), out)
      out, rc = lumen(q("/nonexistent/script.lua"))
      assert.are.equal(1, rc)
      assert.truthy(out:find("cannot open", 1, true), out)
      out, rc = lumen("--no-such-option")
      assert.are.equal(1, rc)
      assert.truthy(out:find("usage", 1, true), out)
   end)

   it("prints tensors built in a script", function()
      local out, rc = lumen("-e 'local t = lm.zeros({2, 3, 4, 5}, {memory_format = "
         .. "lm.channels_last}); print(table.concat(t:stride(), \",\"))'")
      assert.are.equal(0, rc, out)
      assert.are.equal("60,1,15,3\n", out)
   end)
end)

-- the REPL in a real terminal (tmux); skipped when tmux is missing
local have_tmux = select(2, sh("command -v tmux")) == 0
local describe_tmux = have_tmux and describe or pending

describe_tmux("the REPL (tmux)", function()
   -- a unique socket name: .ci/run runs this file in two passes at once (in-tree and installed),
   -- and math.random is not seeded (the same number in every process)
   local sock = "lumen-spec-" .. (os.tmpname():match("([^/]+)$") or tostring(os.time()))
   local tmux = "tmux -L " .. sock
   local history
   local session = "repl"

   local function capture()
      return (sh(tmux .. " capture-pane -p -J -S -200 -t " .. session))
   end

   -- wait until the screen holds `pattern` (plain text); returns the screen
   local function wait_for(text, seconds)
      local screen
      for _ = 1, (seconds or 15) * 20 do
         screen = capture()
         if screen:find(text, 1, true) then return screen end
         sh("sleep 0.05")
      end
      error("timed out waiting for " .. string.format("%q", text) .. "; screen:\n" .. screen)
   end

   local function keys(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = q((select(i, ...))) end
      sh(tmux .. " send-keys -t " .. session .. " " .. table.concat(parts, " "))
   end
   local function type_line(text)
      sh(tmux .. " send-keys -t " .. session .. " -l " .. q(text))
      keys("Enter")
   end

   setup(function()
      history = os.tmpname()
      os.remove(history)
      local cmd = env_prefix({ LUMEN_HISTORY = history }) .. " " .. q(LAUNCHER)
      local out, rc = sh("env -u LD_PRELOAD " .. tmux .. " new-session -d -s " .. session
         .. " -x 150 -y 50 " .. q(cmd))
      assert(rc == 0, out)
   end)

   teardown(function()
      sh(tmux .. " kill-server")
      if history then os.remove(history) end
   end)

   it("starts with lm loaded", function()
      local screen = wait_for("> ")
      assert.truthy(screen:find("is loaded", 1, true), screen)
      assert.falsy(screen:find("could not load", 1, true), screen)
   end)

   it("prints expressions and keeps going after errors", function()
      type_line("1 + 41")
      wait_for("\n42")
      type_line("error('boom')")
      wait_for("stdin:1: boom")
      type_line("{1, 2, x = 'a'}")
      wait_for("{1, 2, x = \"a\"}")
   end)

   it("continues incomplete chunks", function()
      type_line("for i = 1, 3 do")
      wait_for(">> ")
      type_line("io.write(i * 111, ' ')")
      type_line("end")
      wait_for("111 222 333")
   end)

   it("completes globals and fields with TAB", function()
      keys("math.flo", "Tab")
      wait_for("math.floor")
      sh(tmux .. " send-keys -t " .. session .. " -l " .. q("(7.5)"))
      keys("Enter")
      wait_for("\n7\n")
      keys("lm.ze", "Tab")
      wait_for("lm.zeros")
      keys("C-u")
   end)

   it("prints tensors with tostring", function()
      type_line("t = lm.ones({1, 2, 1, 1})")
      type_line("t")
      wait_for("float32")
   end)

   it("writes the history and exits on Ctrl-D", function()
      type_line("history_marker = 12345")
      keys("C-d")
      local gone = false
      for _ = 1, 100 do
         local _, rc = sh(tmux .. " has-session -t " .. session)
         if rc ~= 0 then gone = true break end
         sh("sleep 0.05")
      end
      assert.is_true(gone, "the REPL did not exit on Ctrl-D")
      local h = read_file(history) or ""
      assert.truthy(h:find("history_marker = 12345", 1, true), h)
      assert.truthy(h:find("1 + 41", 1, true), h)
   end)
end)
