-- spec/util_spec.lua -- lumen.util's helpers for benchmarks and training scripts
local util = require("lumen.util")

describe("util.median", function()
   it("takes the middle of an odd count, the mean of the middle two of an even one", function()
      assert.are.equal(3, (util.median({ 5, 1, 3 })))
      assert.are.equal(2.5, (util.median({ 4, 1, 3, 2 })))
      assert.are.equal(7, (util.median({ 7 })))
   end)
   it("returns a sorted copy and leaves the list as it was", function()
      local t = { 3, 1, 2 }
      local m, s = util.median(t)
      assert.are.equal(2, m)
      assert.are.same({ 1, 2, 3 }, s)
      assert.are.same({ 3, 1, 2 }, t)
   end)
   it("rejects what is not a list of numbers, naming itself", function()
      assert.has_error(function() util.median(nil) end,
                       "lumen.util.median: expected a list of numbers, got nil")
      assert.has_error(function() util.median({ 1, "2", 3 }) end,
                       "lumen.util.median: element 2 is a string, expected a number")
   end)
   it("gives nil for an empty list", function()
      local m, s = util.median({})
      assert.is_nil(m)
      assert.are.same({}, s)
   end)
end)

describe("util.status", function()
   local function captured(fn)
      local path = os.tmpname()
      local f = assert(io.open(path, "w"))
      local old = io.output()
      io.output(f)
      local ok, err = pcall(fn)
      io.output(old)
      f:close()
      f = assert(io.open(path))
      local s = f:read("*a")
      f:close()
      os.remove(path)
      assert(ok, err)
      return s
   end

   it("redraws a terminal line in place and erases what a longer line left", function()
      local s = captured(function()
         util.status("epoch 1 ETA 12:51", true, false)
         util.status("ETA 9:59", true, true)
      end)
      assert.are.equal("\repoch 1 ETA 12:51\27[K\rETA 9:59\27[K\n", s)
   end)
end)

describe("util.parse_flags (lua-argparse)", function()
   local defaults = { epochs = 12, lr = 0.1, name = "x", quiet = false, data = "" }
   local help = { epochs = "epochs to train", lr = "learning rate", name = "a name",
                  quiet = "no output", data = "a folder" }

   it("parses numbers, strings and flags, keeping the defaults", function()
      local opt = util.parse_flags(defaults, "prog.lua", { "--epochs", "3", "--quiet",
                                                          "--name=y" }, help)
      assert.are.same({ epochs = 3, lr = 0.1, name = "y", quiet = true, data = "" }, opt)
   end)

   it("prints every flag's default and meaning on -h, and exits 0", function()
      local cmd = "bin/lumen -e 'require(\"lumen.util\").parse_flags({epochs = 12, " ..
         "lr = 0.1}, \"prog.lua\", {\"-h\"}, {epochs = \"epochs to train\"})' 2>&1; echo rc=$?"
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      assert.truthy(out:find("--epochs N%s+epochs to train %(default: 12%)"), out)
      assert.truthy(out:find("(default: 0.1)", 1, true), out)
      assert.truthy(out:find("rc=0", 1, true), out)
   end)

   it("names a bad flag or value and exits 2", function()
      local cmd = "bin/lumen -e 'require(\"lumen.util\").parse_flags({epochs = 12}, " ..
         "\"prog.lua\", {\"--epochs\", \"many\"})' 2>&1; echo rc=$?"
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      assert.truthy(out:find("--epochs needs a number, got 'many'", 1, true), out)
      assert.truthy(out:find("rc=2", 1, true), out)
   end)
end)
