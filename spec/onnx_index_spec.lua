-- lm.onnx.export of the indexing operators (lua/lumen/onnx.lua): cumsum as CumSum, flip as
-- Slice with step -1, gather as GatherElements, index_select as Gather, scatter_add as
-- ScatterElements (reduction add, opset 16 on), F.embedding as Gather, each index exported minus
-- 1 (lumen's are 1-based): onnx.checker and ONNX Runtime within 1e-5 of the eager model,
-- channels-last input. sort / topk are refused with the reason. Skipped (with the reason)
-- without the writer or ONNX Runtime (tools/setup_onnx_venv.sh), as spec/onnx_spec.lua.
local lm = require("lumen")
local shell = require("spec.shell")
local nn = lm.nn

local OIO = require("spec.onnx_io")
local write_f32, read_f32 = OIO.write_f32, OIO.read_f32

local Net = nn.Module:extend("IndexNet")
function Net:__init()
   lm.manual_seed(5)
   self.idx = lm.randint(1, 5, { 2, 3, 3, 5 })        -- along dim 3 (size 4)
   self.sel = lm.tensor({ 5, 1, 1, 3 }, { dtype = lm.int64 })
   self.sidx = lm.randint(1, 4, { 2, 2, 3, 4 })       -- along dim 2 (size 3)
   self.emb = nn.Embedding(7, 5, { padding_idx = 2 })
   self.eidx = lm.randint(1, 8, { 2, 3, 4 })
end
function Net:forward(x)
   x = x + self.emb(self.eidx)                         -- Gather of the weight's rows
   local y = x:cumsum(2) + x:flip({ 2, 4 }) + lm.cumsum(x, -1)
   local z = y:gather(3, self.idx)                     -- 2 x 3 x 3 x 5
   z = z:index_select(4, self.sel)                     -- 2 x 3 x 3 x 4
   return z:scatter_add(2, self.sidx, z:narrow(2, 1, 2))
end

describe("lm.onnx.export of the indexing operators", function()
   it("onnx.checker and ONNX Runtime at opsets 16, 17, 18", function()
      local py, why = OIO.runtime()
      if not py then
         pending(why)
         return
      end
      local model = Net():eval()
      local x = lm.randn({ 2, 3, 4, 5 }):contiguous(lm.channels_last)
      local want = lm.no_grad(function() return model(x) end)
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir -p " .. shell.q(dir)) == 0)
      write_f32(dir .. "/x", x)
      local args = {}
      local OPSETS = { 16, 17, 18 }
      for _, opset in ipairs(OPSETS) do
         local p = dir .. "/m" .. opset .. ".onnx"
         lm.onnx.export(model, x, p, { opset = opset })
         for _, a in ipairs({ p, dir .. "/x", dir .. "/y" .. opset }) do
            args[#args + 1] = shell.q(a)
         end
      end
      local o2, rc2 = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
      assert.are.equal(0, rc2, o2)
      for _, opset in ipairs(OPSETS) do
         local got = read_f32(dir .. "/y" .. opset, want:size())
         local d = (got - want):abs():max():item()
         assert.is_true(d <= 1e-5, "opset " .. opset .. ": " .. d)
      end
      -- ScatterElements' reduction needs opset 16
      local ok, e = pcall(lm.onnx.export, model, x, dir .. "/m13.onnx", { opset = 13 })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("opset 16", 1, true), tostring(e))
      os.execute("rm -rf " .. shell.q(dir))
   end)

   it("refuses sort and topk, naming them", function()
      local M = nn.Module:extend("SortNet")
      function M:forward(x) return (x:topk(2, 2)) end
      local path = os.tmpname()
      os.remove(path)
      local ok, e = pcall(lm.onnx.export, M(), lm.randn({ 2, 5 }), path)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("Tensor.topk has no ONNX export", 1, true), tostring(e))
      assert.is_nil(io.open(path, "rb"))
   end)
end)
