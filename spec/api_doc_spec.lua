-- spec/api_doc_spec.lua -- docs/api.md and the REPL's help() come from ONE table,
-- lua/lumen/doc.lua. This spec fails when a public name has no entry there, when an entry names
-- something that does not exist, and when docs/api.md is not what tools/gen_api.lua makes of the
-- table (fix: `bin/lumen tools/gen_api.lua > docs/api.md`).
--
-- Public names are found by walking the loaded namespaces (every lazily loaded part of lm is
-- loaded first, found the way the REPL's completion finds them): lm.*, every plain module table
-- hanging off lm (lm.nn, lm.F, lm.optim, lm.layout, lm.data, lm.models, lm.memory, lm.autograd,
-- lm.serialize, lm.checkpoint, and any added later), lm.nn.init, lm.nn.utils, the Tensor methods,
-- the Module methods and the Optimizer methods. A name is covered when an entry has that name,
-- or when it is an alias: a function or table that an entry of another name resolves to
-- (lm.functional is lm.F, t:mm is t:matmul, t:clip is t:clamp).

local lm = require("lumen")
local doc = require("lumen.doc")

-- load every lazily loaded part of lm (the `lazy` / `lazy_fn` tables of lua/lumen/init.lua)
local function lazy_names()
   local names = { "F" }
   local idx = rawget(getmetatable(lm) or {}, "__index")
   if type(idx) == "function" then
      for i = 1, 255 do
         local name, val = debug.getupvalue(idx, i)
         if name == nil then break end
         if (name == "lazy" or name == "lazy_fn") and type(val) == "table" then
            for k in pairs(val) do names[#names + 1] = k end
         end
      end
   end
   return names
end
for _, k in ipairs(lazy_names()) do local _ = lm[k] end

-- Not public, and why. Beyond these rules, the list is explicit:
--   * a name starting with "_" is private by convention (lm._C, F._pair, layout._classify, ...);
--   * "__" names in class tables are metamethods and class markers;
--   * `install` in a module is the hook lua/lumen/init.lua (or lm.models) calls once.
local EXCLUDED = {
   ["lm.memory.own"] = "the tensor wrapper's ownership bookkeeping (lua/lumen/tensor.lua)",
   ["lm.memory.release"] = "the C release function the wrapper calls",
   ["lm.memory.sweep"] = "run by the collector hooks, not by users",
   ["lm.memory.settle"] = "run by the queries before they answer",
   ["lm.memory.cycles"] = "a counter deferred results use to age their recipes",
   ["lm.serialize.json"] = "the JSON codec shared with lumen.checkpoint",
   ["lm.serialize.dtype_codes"] = "the safetensors dtype code table shared with checkpoint",
}

local function excluded(name, key)
   if key:sub(1, 1) == "_" then return true end
   if key == "install" then return true end
   return EXCLUDED[name] ~= nil
end

-- every value an entry resolves to (for aliases)
local documented_values = {}
for _, e in ipairs(doc.list) do
   local v = doc.resolve(e.name)
   if type(v) == "function" or type(v) == "table" then documented_values[v] = e.name end
end

local function sorted_keys(t)
   local ks = {}
   for k in pairs(t) do
      if type(k) == "string" then ks[#ks + 1] = k end
   end
   table.sort(ks)
   return ks
end

-- {prefix, table, method separator}
local function namespaces()
   local list = {
      { "lm", lm, "." },
      { "Tensor", lm.Tensor, ":" },
      { "Module", lm.nn.Module, ":" },
      { "Optimizer", lm.optim.Optimizer, ":" },
      { "lm.nn.init", lm.nn.init, "." },
      { "lm.nn.utils", lm.nn.utils, "." },
   }
   -- documented as a whole: helper tables (lm.dtypes, lm.format, lm.doc: the reference
   -- itself); lm.functional is lm.F, walked as lm.F
   local skip = { Tensor = true, tensor_mt = true, dtypes = true, format = true,
                  functional = true, doc = true }
   for _, k in ipairs(sorted_keys(lm)) do
      local v = rawget(lm, k)
      if type(v) == "table" and not skip[k] and k:sub(1, 1) ~= "_"
         and getmetatable(v) == nil then
         list[#list + 1] = { "lm." .. k, v, "." }
      end
   end
   return list
end

local function public_names()
   local out = {}
   for _, ns in ipairs(namespaces()) do
      local prefix, t, sep = ns[1], ns[2], ns[3]
      for _, k in ipairs(sorted_keys(t)) do
         local v = rawget(t, k)
         -- a method is Tensor:add; a plain field of an object type is Tensor.requires_grad
         local s = sep
         if sep == ":" and type(v) ~= "function" and type(v) ~= "table" then s = "." end
         local name = prefix .. s .. k
         if not excluded(name, k) then
            out[#out + 1] = { name = name, value = v }
         end
      end
   end
   return out
end

describe("docs/api.md and lua/lumen/doc.lua", function()
   it("have an entry for every public name", function()
      local missing = {}
      for _, p in ipairs(public_names()) do
         local covered = doc.entries[p.name] ~= nil
            or ((type(p.value) == "function" or type(p.value) == "table")
                and documented_values[p.value] ~= nil)
         if not covered then missing[#missing + 1] = p.name end
      end
      assert(#missing == 0, "public names without an entry in lua/lumen/doc.lua (add one, then "
         .. "`bin/lumen tools/gen_api.lua > docs/api.md`): " .. table.concat(missing, ", "))
   end)

   it("has no entry for a name that does not exist", function()
      -- lm.help and lm.doc come with two lines in lua/lumen/init.lua's lazy tables
      -- (lazy.doc = "lumen.doc", lazy_fn.help = {"doc", "help"}); until then they are absent
      local PENDING = { ["lm.help"] = true, ["lm.doc"] = true }
      local stale = {}
      for _, e in ipairs(doc.list) do
         local resolvable = e.name:match("^lm%.") or e.name:match("^%u%a*:")
         if resolvable and doc.resolve(e.name) == nil and not PENDING[e.name] then
            stale[#stale + 1] = e.name
         end
      end
      assert(#stale == 0, "entries for names that do not exist: " .. table.concat(stale, ", "))
   end)

   it("gives every entry a signature and a one-line description", function()
      for _, e in ipairs(doc.list) do
         assert(type(e.sig) == "string" and e.sig ~= "", e.name .. ": no signature")
         assert(type(e.desc) == "string" and e.desc ~= "" and not e.desc:find("\n"),
                e.name .. ": the description must be one line")
      end
   end)

   it("docs/api.md is what tools/gen_api.lua makes (regenerate it when this fails)", function()
      local p = assert(io.popen("bin/lumen tools/gen_api.lua 2>&1"))
      local fresh = p:read("*a")
      p:close()
      local f = assert(io.open("docs/api.md", "r"), "docs/api.md is missing")
      local committed = f:read("*a")
      f:close()
      assert(fresh:find("# lumen API reference", 1, true), "tools/gen_api.lua failed: " .. fresh)
      assert(fresh == committed, "docs/api.md is stale: run `bin/lumen tools/gen_api.lua > "
         .. "docs/api.md`")
   end)
end)

describe("help()", function()
   it("prints the signature and the description of a function", function()
      local text = doc.help(lm.zeros)
      assert.truthy(text:find(doc.entries["lm.zeros"].sig, 1, true), text)
      assert.truthy(text:find(doc.entries["lm.zeros"].desc, 1, true), text)
   end)

   it("finds methods, aliases, classes and names", function()
      assert.truthy(doc.help(lm.Tensor.add):find("t:add(other, alpha)", 1, true))
      assert.truthy(doc.help(lm.Tensor.mm):find("t:matmul(u)", 1, true))
      assert.truthy(doc.help(lm.nn.functional.conv2d):find("lm.F.conv2d(", 1, true))
      assert.truthy(doc.help(lm.nn.Conv2d):find("lm.nn.Conv2d(in_channels", 1, true))
      assert.truthy(doc.help(lm.nn.Linear(2, 3)):find("lm.nn.Linear(", 1, true))
      assert.truthy(doc.help("conv2d"):find("lm.F.conv2d(", 1, true))
      assert.truthy(doc.help(lm.zeros({2})):find("lm.Tensor", 1, true))
      assert.truthy(doc.help():find("Ctrl-C", 1, true))
      assert.truthy(doc.help(function() end):find("no help", 1, true))
   end)
end)
