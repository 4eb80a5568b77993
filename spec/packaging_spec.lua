-- spec/packaging_spec.lua -- the released rock: rockspec/lumen-0.1.0-1.rockspec's fields, LICENSE,
-- the version numbers agree, the PUC-Lua guard in lumen/init.lua, and a full round trip: `make
-- dist` makes the versioned tarball and the .src.rock, that rock alone (the dist folder removed)
-- is installed into an empty tree with `luarocks install`, offline, and the installed `lumen`
-- command runs.

local lm = require("lumen")
local shell = require("spec.shell")
local q, sh, read_file = shell.q, shell.sh, shell.read_file

local ROCKSPEC = "rockspec/lumen-0.1.0-1.rockspec"
local SCM = "rockspec/lumen-scm-1.rockspec"

local function write_file(path, text)
   local f = assert(io.open(path, "wb"))
   f:write(text)
   f:close()
end

-- a rockspec is Lua assigning globals: run it in an empty environment and return that
local function load_rockspec(path)
   local text = assert(read_file(path), "cannot read " .. path)
   local chunk = assert(loadstring(text, "@" .. path))
   local env = {}
   setfenv(chunk, env)
   chunk()
   return env, text
end

local function have(cmd)
   local _, rc = sh("command -v " .. cmd .. " >/dev/null")
   return rc == 0
end

local have_luarocks = have("luarocks")
local INSTALLED = (os.getenv("LUMEN_INSTALL_TREE") or "") ~= ""

describe("rockspec/lumen-0.1.0-1.rockspec", function()
   local spec = load_rockspec(ROCKSPEC)

   it("names the package and a version that matches lm._VERSION", function()
      assert.are.equal("3.0", spec.rockspec_format)
      assert.are.equal("lumen", spec.package)
      assert.are.equal("0.1.0-1", spec.version)
      -- the file name carries the same version, as luarocks requires
      assert.are.equal("rockspec/" .. spec.package .. "-" .. spec.version .. ".rockspec", ROCKSPEC)
      assert.are.equal(spec.version:match("^(.-)%-%d+$"), lm._VERSION)
   end)

   it("fetches a git tag v<version> over https", function()
      assert.is_string(spec.source.url)
      assert.is_truthy(spec.source.url:match("^git%+https://github%.com/[%w%-_.]+/lumen%.git$"),
                       spec.source.url)
      assert.are.equal("v" .. lm._VERSION, spec.source.tag)
   end)

   it("describes the package with license MIT", function()
      local d = spec.description
      assert.are.equal("MIT", d.license)
      assert.is_truthy(#d.summary > 10 and #d.summary <= 100, d.summary)
      assert.is_truthy(#d.detailed > 50)
      assert.is_truthy(d.homepage:match("^https://"))
   end)

   it("declares Lua 5.1 (LuaJIT) and a JSON library", function()
      local deps = table.concat(spec.dependencies, "\n")
      assert.is_truthy(deps:match("lua ~> 5%.1"), deps)
      assert.is_truthy(deps:match("lua%-cjson") or deps:match("dkjson"), deps)
   end)

   it("declares zlib, libjpeg and libpng with a header and a library each", function()
      local ext = spec.external_dependencies
      for name, lib in pairs({ ZLIB = "z", JPEG = "jpeg", PNG = "png" }) do
         assert.is_table(ext[name], name)
         assert.are.equal(lib, ext[name].library, name)
         assert.is_truthy(ext[name].header:match("%.h$"), name)
      end
      -- and the build passes their directories on to the compiler and the linker
      local vars = spec.build.build_variables
      for _, name in ipairs({ "ZLIB", "JPEG", "PNG" }) do
         assert.is_truthy(vars.CFLAGS:find("$(" .. name .. "_INCDIR)", 1, true), name)
         assert.is_truthy(vars.LDFLAGS:find("$(" .. name .. "_LIBDIR)", 1, true), name)
      end
   end)

   it("builds with the Makefile like the scm rockspec", function()
      local scm = load_rockspec(SCM)
      assert.are.equal("make", spec.build.type)
      assert.are.same(scm.build, spec.build)
      assert.are.same(scm.external_dependencies, spec.external_dependencies)
      assert.are.equal(spec.description.license, scm.description.license)
      assert.are.equal("scm-1", scm.version)
   end);

   (have_luarocks and it or pending)("passes luarocks lint (both rockspecs)", function()
      for _, path in ipairs({ ROCKSPEC, SCM }) do
         local out, rc = sh("luarocks lint " .. q(path))
         assert.are.equal(0, rc, path .. ": " .. out)
      end
   end)
end)

describe("LICENSE", function()
   it("is the MIT license of the lumen authors", function()
      local text = read_file("LICENSE")
      assert.is_not_nil(text, "LICENSE is missing")
      assert.is_truthy(text:find("MIT License", 1, true))
      assert.is_truthy(text:find("Copyright %(c%) %d+ the lumen authors"))
      assert.is_truthy(text:find("THE SOFTWARE IS PROVIDED \"AS IS\"", 1, true))
   end)
end)

local have_puc = have("lua5.1")
describe("require('lumen') under PUC Lua", function()
   (have_puc and it or pending)("says that LuaJIT is needed (lua5.1 is " ..
      (have_puc and "installed)" or "NOT installed: skipped)"), function()
      local luadir = INSTALLED and (os.getenv("LUMEN_INSTALL_TREE") .. "/share/lua/5.1") or "lua"
      local out, rc = sh("lua5.1 -e " .. q("package.path='" .. luadir .. "/?.lua;" .. luadir ..
                         "/?/init.lua;'..package.path; require('lumen')"))
      assert.are_not.equal(0, rc)
      assert.is_truthy(out:find("lumen requires LuaJIT (found Lua 5.1)", 1, true), out)
      assert.is_falsy(out:find("module 'ffi' not found", 1, true), out)
   end)
end)

-- the round trip: pack a source rock from the working tree and install it into a fresh tree
local function roundtrip_reason()
   if not have_luarocks then return "luarocks is not installed: pack/install round trip skipped" end
   if not have("git") then return "git is not installed: pack/install round trip skipped" end
   if INSTALLED then
      return "installed run: the pack/install round trip runs in the in-tree run only"
   end
   return nil
end
local skip = roundtrip_reason()

describe("luarocks pack + install", function()
   local tmp
   teardown(function()
      if tmp then sh("rm -rf " .. q(tmp)) end
   end);

   (skip and pending or it)(skip or "make dist: a source rock that installs offline into an " ..
      "empty tree",
      function()
      local out, rc = sh("mktemp -d /tmp/lumen-pack.XXXXXX")
      assert.are.equal(0, rc, out)
      tmp = out:gsub("%s+$", "")
      -- make dist: the tarball of the files git would commit (tracked, plus new files not
      -- ignored), the rockspec pointed at it, and the .src.rock holding both
      out, rc = sh("make dist DIST=" .. q(tmp .. "/dist"))
      assert.are.equal(0, rc, out)
      local ver = lm._VERSION
      assert.is_not_nil(read_file(tmp .. "/dist/lumen-" .. ver .. ".tar.gz"), out)
      local listing = sh("tar -tzf " .. q(tmp .. "/dist/lumen-" .. ver .. ".tar.gz"))
      assert.is_truthy(listing:find("lumen-" .. ver .. "/Makefile", 1, true), listing:sub(1, 300))
      assert.is_truthy(listing:find("lumen-" .. ver .. "/lua/lumen/init.lua", 1, true))
      assert.is_falsy(listing:find("lumen-" .. ver .. "/build/", 1, true), "build/ in the tarball")
      -- the rock alone, elsewhere, with the dist folder gone: nothing is fetched
      out, rc = sh("cp " .. q(tmp .. "/dist/lumen-" .. ver .. "-1.src.rock") .. " " .. q(tmp) ..
                   " && rm -rf " .. q(tmp .. "/dist"))
      assert.are.equal(0, rc, out)

      -- luarocks does not see the distribution's lua-cjson (apt), and the tests run offline:
      -- tell it the dependency is provided when the library loads here
      local cfg = { ('rocks_trees = { "%s/tree" }'):format(tmp) }
      local provided = {}
      local okj, cjson = pcall(require, "cjson")
      if okj then
         local v = tostring(cjson._VERSION or "2.1.0"):match("(%d+%.%d+[%.%d]*)") or "2.1.0"
         provided[#provided + 1] = ('["lua-cjson"] = "%s-1"'):format(v)
      end
      local oka, argparse = pcall(require, "argparse")
      if oka then
         local v = tostring(argparse.version or "0.7.1"):match("(%d+%.%d+[%.%d]*)") or "0.7.1"
         provided[#provided + 1] = ('argparse = "%s-1"'):format(v)
      end
      if #provided > 0 then
         cfg[#cfg + 1] = "rocks_provided = { " .. table.concat(provided, ", ") .. " }"
      end
      write_file(tmp .. "/config.lua", table.concat(cfg, "\n") .. "\n")
      -- nothing of the test run leaks into the build: not the library, the paths, nor an ASan
      -- preload (make asan), which would slow every compiler process down
      local env = "env -u LUMEN_LIB -u LUA_PATH -u LUA_CPATH -u LD_PRELOAD LUAROCKS_CONFIG=" ..
         q(tmp .. "/config.lua") .. " "

      local rock = tmp .. "/lumen-0.1.0-1.src.rock"
      assert.is_not_nil(read_file(rock), "no source rock: " .. out)
      -- the rock carries the rockspec and the sources of the tag
      if have("unzip") then
         local list = sh("unzip -l " .. q(rock))
         assert.is_truthy(list:find("lumen-0.1.0-1.rockspec", 1, true), list)
      end

      out, rc = sh("cd " .. q(tmp) .. " && " .. env .. "MAKEFLAGS=-j2 luarocks install --tree " ..
                   q(tmp .. "/tree") .. " " .. q(rock))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("lumen 0.1.0-1 is now installed", 1, true), out)

      -- the installed command, with nothing from the source tree in its environment
      out, rc = sh("cd /tmp && env -u LUMEN_LIB -u LUA_PATH -u LUA_CPATH -u LD_PRELOAD " ..
                   q(tmp .. "/tree/bin/lumen") .. " -e " ..
                   q("print(lm.ones({2,2})); print(package.searchpath('lumen', package.path)); " ..
                     "print(lm._VERSION)"))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("[lumen.Tensor float32 of size 2x2", 1, true), out)
      assert.is_truthy(out:find(tmp .. "/tree/share/lua/5.1/lumen/init.lua", 1, true), out)
      assert.is_truthy(out:find("\n" .. lm._VERSION .. "\n", 1, true), out)
      -- lumen-run beside it: it finds its launcher in the tree and starts the tree's lumen
      out, rc = sh("cd /tmp && env -u LUMEN_LIB -u LUA_PATH -u LUA_CPATH -u LD_PRELOAD " ..
                   "-u LUMEN_MPIRUN " .. q(tmp .. "/tree/bin/lumen-run") ..
                   " -np 2 --dry-run -- " .. q(tmp .. "/config.lua"))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find(" -np 2 ", 1, true), out)
      assert.is_truthy(out:find(tmp .. "/tree/bin/lumen " .. tmp .. "/config.lua", 1, true), out)
      -- the libraries under lib/lua/5.1/lumen/, no CUDA library unless asked for
      assert.is_not_nil(read_file(tmp .. "/tree/lib/lua/5.1/lumen/liblumen.so"))
      assert.is_nil(read_file(tmp .. "/tree/lib/lua/5.1/liblumen.so"))
      assert.is_nil(read_file(tmp .. "/tree/lib/lua/5.1/lumen/liblumen_cuda.so"))
   end)
end)
