-- examples/export.lua -- ship a model: trace resnet50, save it as one file, load it in a fresh
-- process that has no model source, freeze it, and export it to ONNX.
--
--   bin/lumen examples/export.lua [dir=/tmp/lumen-export] [size=224]
--
-- Writes <dir>/resnet50.safetensors (weights + graph), <dir>/input.safetensors and
-- <dir>/resnet50.onnx (when the ONNX writer is built: apt-get install libprotobuf-c-dev
-- protobuf-c-compiler, then make). docs/shipping_models.md explains each step.
local lm = require("lumen")
require("lumen.util").help_only(arg, [[
usage: bin/lumen examples/export.lua [DIR] [SIZE]
Trace resnet50, save it as one file, load it in a fresh process, freeze it and export it to
ONNX (docs/shipping_models.md).
  DIR   output folder (default: /tmp/lumen-export)
  SIZE  image size in pixels (default: 224)]])
io.stdout:setvbuf("line")   -- the fresh process prints in order with this one

-- the second half: run in a fresh process (`bin/lumen examples/export.lua --load DIR`), which
-- never touches lm.models: the file carries everything
if arg[1] == "--load" then
   local dir = arg[2]
   local g = lm.jit.load(dir .. "/resnet50.safetensors")
   local x = lm.load(dir .. "/input.safetensors").x
   local y = lm.no_grad(function() return g(x) end)
   local f = lm.jit.freeze(g)
   local yf = lm.no_grad(function() return f(x) end)
   local ref = lm.load(dir .. "/input.safetensors").logits
   print(("fresh process: loaded graph, %d nodes; max |logits - eager| = %.3g"):format(
      #g.graph.nodes, (y - ref):abs():max():item()))
   print(("fresh process: frozen graph, %d nodes (%d batch_norm); max |logits - eager| = %.3g")
         :format(#f.graph.nodes, f:count("F.batch_norm"), (yf - ref):abs():max():item()))
   return
end

local dir = arg[1] or "/tmp/lumen-export"
local size = tonumber(arg[2]) or 224
os.execute("mkdir -p '" .. dir .. "'")

lm.manual_seed(0)
local model = lm.models.resnet50({ num_classes = 1000 })
-- model:load_state_dict(lm.load("resnet50.safetensors"))   -- torchvision's weights, same keys
model:eval()                                                -- trace inference
lm.to_channels_last(model)
local x = lm.randn({ 1, 3, size, size }):contiguous(lm.channels_last)

-- 1. trace: one forward's operators, with every value's sizes, dtype and memory format
local g = lm.jit.trace(model, x)
local text = tostring(g)
print(text:sub(1, (text:find("\n", text:find("\n") + 1))))   -- the header and the first node
print(("... %d nodes"):format(#g.graph.nodes))

-- 2. save: one safetensors file (weights + the graph in its metadata)
local path = dir .. "/resnet50.safetensors"
g:save(path)
local logits = lm.no_grad(function() return model(x) end)
lm.save({ x = x, logits = logits }, dir .. "/input.safetensors")
print("saved " .. path)

-- 3. load it in a fresh process, without the model source
local self = debug.getinfo(1, "S").source:sub(2)
local lumen = (self:match("^(.*)/examples/") or ".") .. "/bin/lumen"
assert(os.execute(("'%s' '%s' --load '%s'"):format(lumen, self, dir)) == 0)

-- 4. ONNX
if lm.onnx.available() then
   local onnx_path = lm.onnx.export(model, x, dir .. "/resnet50.onnx", { opset = 17 })
   print("exported " .. onnx_path .. " (opset 17); run it with ONNX Runtime:")
   print("  python -c \"import onnxruntime as ort, numpy as np; s = ort.InferenceSession('" ..
         onnx_path .. "'); print(s.run(None, {'input': np.zeros((1, 3, " .. size .. ", " ..
         size .. "), np.float32)})[0].shape)\"")
else
   print("ONNX export skipped: the writer is not built (apt-get install libprotobuf-c-dev " ..
         "protobuf-c-compiler, then make)")
end
