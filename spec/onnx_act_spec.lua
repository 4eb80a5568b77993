-- lm.onnx.export of the issue-40 operators (the activations, with hardtanh, softplus, selu,
-- celu, softsign, tanhshrink, softshrink, hardshrink, threshold and logsigmoid, F.pad constant,
-- the shuffles, Dropout2d and lm.ops.StochasticDepth in evaluation) at
-- opsets 13, 17, 18 and 20 (Gelu's own node from 20, HardSwish from 14, Mish from 18):
-- onnx.checker and ONNX Runtime within 1e-5 of the eager model, channels-last; a
-- StochasticDepth in training mode refused. Skipped (with the reason) without the writer or ONNX
-- Runtime (tools/setup_onnx_venv.sh), as spec/onnx_spec.lua. The resampling operators (Resize,
-- the Pad modes, ConvTranspose) are in spec/onnx_resample_spec.lua.
local lm = require("lumen")
local shell = require("spec.shell")
local nn = lm.nn
local F = lm.F

local OIO = require("spec.onnx_io")
local write_f32, read_f32 = OIO.write_f32, OIO.read_f32

local Net = nn.Module:extend("ActNet")
function Net:__init()
   self.conv = nn.Conv2d(3, 8, 3, { padding = 1 })
   self.acts = nn.Sequential(nn.SiLU(true), nn.GELU(), nn.Hardswish(), nn.Hardsigmoid(),
                             nn.ReLU6(), nn.LeakyReLU(0.2), nn.ELU(0.5), nn.Mish(),
                             nn.GELU("tanh"), nn.Dropout2d(0.3), lm.ops.StochasticDepth(0.4),
                             nn.Hardtanh(-0.5, 0.8), nn.Softplus(2), nn.SELU(), nn.CELU(0.7),
                             nn.Softplus(), nn.Softsign(), nn.Tanhshrink(), nn.Softshrink(0.1),
                             nn.Hardshrink(0.05), nn.Threshold(-0.2, 0.3), nn.LogSigmoid())
   self.shuf = nn.Sequential(nn.PixelShuffle(2), nn.PixelUnshuffle(2), nn.ChannelShuffle(4))
end
function Net:forward(x)
   local y = self.acts(self.conv(x) * 2)
   y = F.pad(y, { 1, 2, 0, 1 }, { value = 0.25 })
   return self.shuf(y)
end

describe("lm.onnx.export of the issue-40 operators", function()
   it("onnx.checker and ONNX Runtime at opsets 13, 17, 18, 20", function()
      local py, why = OIO.runtime()
      if not py then
         pending(why)
         return
      end
      lm.manual_seed(40)
      local model = Net():eval()
      lm.to_channels_last(model)
      local x = lm.randn({ 2, 3, 6, 5 }):contiguous(lm.channels_last)
      local want = lm.no_grad(function() return model(x) end)
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir -p " .. shell.q(dir)) == 0)
      write_f32(dir .. "/x", x)
      local args = {}
      local OPSETS = { 13, 17, 18, 20 }
      for _, opset in ipairs(OPSETS) do
         local p = dir .. "/m" .. opset .. ".onnx"
         lm.onnx.export(model, x, p, { opset = opset })
         for _, a in ipairs({ p, dir .. "/x", dir .. "/y" .. opset }) do
            args[#args + 1] = shell.q(a)
         end
      end
      local o2, rc2 = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
      assert.are.equal(0, rc2, o2)
      -- the ops that opset brings: Gelu (20), HardSwish (14), Mish (18); below, their formulas;
      -- pixel_shuffle of a 4-D input is DepthToSpace (CRD) at every opset
      local first = { Gelu = 20, HardSwish = 14, Mish = 18, DepthToSpace = 13 }
      for _, opset in ipairs(OPSETS) do
         local got = read_f32(dir .. "/y" .. opset, want:size())
         local d = (got - want):abs():max():item()
         assert.is_true(d <= 1e-5, "opset " .. opset .. ": " .. d)
         local bytes = assert(shell.read_file(dir .. "/m" .. opset .. ".onnx"))
         for op, from in pairs(first) do
            assert.are.equal(opset >= from, bytes:find(op .. "_", 1, true) ~= nil,
                             op .. " at opset " .. opset)
         end
      end
      os.execute("rm -rf " .. shell.q(dir))
   end)

   it("the shuffles of 3-D and 5-D inputs (Reshape, Transpose, Reshape): ONNX Runtime",
      function()
      local py, why = OIO.runtime()
      if not py then
         pending(why)
         return
      end
      local fn = function(x)                                -- x: 2 x 1 x 8 x 3 x 4
         local y = F.pixel_unshuffle(F.pixel_shuffle(x, 2) * 3, 2)   -- 5-D both ways
         y = y:reshape({ 2, 8, 12 })
         return F.channel_shuffle(y, 4)                    -- 3-D
      end
      local x = lm.randn({ 2, 1, 8, 3, 4 })
      local want = fn(x)
      local p = os.tmpname()
      lm.onnx.export(fn, x, p .. ".onnx")
      write_f32(p .. ".x", x)
      local o2, rc2 = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(p .. ".onnx") ..
                               " " .. shell.q(p .. ".x") .. " " .. shell.q(p .. ".y"))
      assert.are.equal(0, rc2, o2)
      local got = read_f32(p .. ".y", want:size())
      assert.is_true((got - want):abs():max():item() <= 1e-5)
      assert.is_nil(assert(shell.read_file(p .. ".onnx")):find("DepthToSpace", 1, true))
      for _, e in ipairs({ "", ".onnx", ".x", ".y" }) do os.remove(p .. e) end
   end)

   it("a StochasticDepth in training mode is refused (its mask would be a constant)", function()
      local M = nn.Module:extend("SDNet")
      function M:__init() self.sd = lm.ops.StochasticDepth(0.2) end
      function M:forward(x) return self.sd(x) * 2 end
      local m = M()
      local p = os.tmpname()
      os.remove(p)
      local ok, err = pcall(lm.onnx.export, m, lm.randn({ 2, 3 }), p)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.onnx.export: a StochasticDepth in training mode " ..
                                       "(call model:eval() first)", 1, true), tostring(err))
      assert.is_nil(io.open(p))
      -- p = 0 is the identity in either mode
      if lm.onnx.available() then
         m.sd.p = 0
         assert.are.equal(p, lm.onnx.export(m, lm.randn({ 2, 3 }), p))
         os.remove(p)
      end
   end)
end)
