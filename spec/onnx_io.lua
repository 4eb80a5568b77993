-- spec/onnx_io.lua -- the raw float32 files the ONNX specs hand to ONNX Runtime
-- (spec/onnx_check.py reads the input and writes the output in this form).
--
--    local OIO = require("spec.onnx_io")
--    OIO.write_f32(path, tensor)          -- the values in contiguous order, float32
--    local t = OIO.read_f32(path, sizes)  -- a float32 tensor of these sizes (the file must fit)
--    local py, why = OIO.runtime()        -- ONNX Runtime's python, or nil and why not
local lm = require("lumen")
local ffi = require("ffi")
local C = require("lumen.C")
local shell = require("spec.shell")

local M = {}

-- the python of ONNX Runtime's test venv (tools/setup_onnx_venv.sh, made once per process), or
-- nil and why not: the ONNX writer is not built, or the venv cannot be made
local python, why_not
function M.runtime()
   if python or why_not then return python, why_not end
   if not lm.onnx.available() then
      why_not = "the ONNX writer build/liblumen_onnx.so is not built (libprotobuf-c-dev, " ..
                "protobuf-c-compiler)"
      return nil, why_not
   end
   local out, rc = shell.sh("bash tools/setup_onnx_venv.sh")
   if rc ~= 0 then
      why_not = "the ONNX Runtime venv could not be made: " .. out:sub(-300)
      return nil, why_not
   end
   python = out:match("([^\n]+)%s*$")
   return python
end

function M.write_f32(path, t)
   -- host memory: a tensor on another device (sim:N's memory is not the host's) comes over first
   local c = t:cpu():float():contiguous()
   local f = assert(io.open(path, "wb"))
   f:write(ffi.string(C.lm_tensor_data(c._c), c:numel() * 4))
   f:close()
end

function M.read_f32(path, sizes)
   local s = assert(shell.read_file(path))
   local t = lm.zeros(sizes, { device = "cpu" })
   assert(#s == t:numel() * 4, "output size")
   ffi.copy(C.lm_tensor_data(t._c), s, #s)
   return t
end

return M
