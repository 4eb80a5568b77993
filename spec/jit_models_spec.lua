-- lm.jit acceptance: resnet50 (channels-last), resnext50_32x4d and alexnet are traced and saved
-- here, then loaded, run and frozen in a fresh process whose Lua path is a copy of lua/ without
-- lumen/models.lua (so no model source can be found): the loaded graph's logits equal the eager
-- model's within 1e-5, the frozen graph's within 1e-4 with no batch_norm node left.
-- Small inputs (1x3x64x64; r3d_18, in channels_last_3d: 1x3x4x32x32) keep it fast.
local lm = require("lumen")
local shell = require("spec.shell")

-- {name, channels-last, input sizes}
local MODELS = {
   { "resnet50", true }, { "resnext50_32x4d", false }, { "alexnet", false },
   { "r3d_18", true, { 1, 3, 4, 32, 32 } },
}

local function rel(a, b)
   return (a - b):abs():max():item() / math.max(1, b:abs():max():item())
end

-- batch norms with statistics that make folding do something
local function warm(model)
   lm.no_grad(function()
      for _, m in ipairs(model:modules()) do
         if m:type_name() == "BatchNorm2d" or m:type_name() == "BatchNorm3d" then
            local c = m.num_features
            m.running_mean:copy_(lm.randn({ c }) * 0.1)
            m.running_var:copy_(lm.rand({ c }) * 0.5 + 0.75)
            m.weight:copy_(lm.rand({ c }) * 0.5 + 0.75)
            m.bias:copy_(lm.randn({ c }) * 0.1)
         end
      end
   end)
end

describe("lm.jit on the torchvision models, loaded in a fresh process", function()
   it("resnet50, resnext50_32x4d, alexnet, r3d_18: loaded within 1e-5, frozen within 1e-4",
      function()
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir -p " .. shell.q(dir .. "/lua")) == 0)
      -- lua/ without the model source
      assert(os.execute(("cp -r lua/lumen %s/lua/ && rm -f %s/lua/lumen/models.lua"):format(
         shell.q(dir), shell.q(dir))) == 0)
      local expect = {}
      for i, mm in ipairs(MODELS) do
         lm.manual_seed(10 + i)
         local model = lm.models[mm[1]]({ num_classes = 10 }):eval()
         warm(model)
         local x = lm.randn(mm[3] or { 1, 3, 64, 64 })
         if mm[2] then
            lm.to_channels_last(model)
            x = x:contiguous(#x:size() == 5 and lm.channels_last_3d or lm.channels_last)
         end
         local g = lm.jit.trace(model, x)
         g:save(dir .. "/" .. mm[1] .. ".safetensors")
         expect[mm[1]] = lm.no_grad(function() return model(x) end)
         expect[mm[1] .. ".x"] = x
      end
      lm.save(expect, dir .. "/expect.safetensors")
      local script = dir .. "/run.lua"
      local f = assert(io.open(script, "w"))
      f:write([==[
local dir = ...
assert(package.searchpath("lumen.models", package.path) == nil, "model source on the path")
local lm = require("lumen")
assert(lm.models == nil, "lm.models found")
local e = lm.load(dir .. "/expect.safetensors")
local out = {}
for _, name in ipairs({ "resnet50", "resnext50_32x4d", "alexnet", "r3d_18" }) do
   local g = lm.jit.load(dir .. "/" .. name .. ".safetensors")
   local x = e[name .. ".x"]
   out[name] = lm.no_grad(function() return g(x) end)
   local f = lm.jit.freeze(g)
   out[name .. ".frozen"] = lm.no_grad(function() return f(x) end)
   print(name, "batch_norm nodes", f:count("F.batch_norm"),
         "conv2d nodes", f:count("F.conv2d") + f:count("F.conv3d"),
         "conversions", f:count("Tensor.contiguous"), "input format",
         g.graph.values[g.graph.inputs[1]].format)
end
lm.save(out, dir .. "/out.safetensors")
print("done")
]==])
      f:close()
      -- the library this process runs (LUMEN_LIB: the ASan build in `make asan`), else the build
      local lib = os.getenv("LUMEN_LIB")
      if not lib or lib == "" then lib = os.getenv("PWD") .. "/build/liblumen.so" end
      local cmd = ("cd %s && LUMEN_LIB=%s LUA_PATH=%s luajit lua/lumen/repl.lua run.lua %s"):format(
         shell.q(dir), shell.q(lib),
         shell.q(dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua"), shell.q(dir))
      local output, rc = shell.sh(cmd)
      assert.are.equal(0, rc, output)
      assert.truthy(output:find("done", 1, true), output)
      local got = lm.load(dir .. "/out.safetensors")
      if os.getenv("JIT_VERBOSE") then print(output) end
      for _, mm in ipairs(MODELS) do
         local name = mm[1]
         local want = expect[name]
         if os.getenv("JIT_VERBOSE") then
            print(name, rel(got[name], want), rel(got[name .. ".frozen"], want))
         end
         assert.is_true(rel(got[name], want) <= 1e-5, name .. ": loaded " .. rel(got[name], want))
         assert.is_true(rel(got[name .. ".frozen"], want) <= 1e-4,
                        name .. ": frozen " .. rel(got[name .. ".frozen"], want))
         local line = output:match(name .. "%s+batch_norm nodes%s+(%d+)")
         assert.are.equal("0", line, output)
      end
      assert.truthy(output:find("resnet50%s+batch_norm nodes%s+0%s+conv2d nodes%s+53%s+" ..
                                "conversions%s+1%s+input format%s+channels_last"), output)
      os.execute("rm -rf " .. shell.q(dir))
   end)
end)
