-- lm.onnx.export: resnet50 (channels-last), resnext50_32x4d and alexnet exported at opset 17 pass
-- onnx.checker, and ONNX Runtime gives the eager model's logits within 1e-4. ONNX Runtime runs in
-- a test-only virtual environment (tools/setup_onnx_venv.sh, under ~/.cache); when it cannot be
-- made, or the writer (build/liblumen_onnx.so) is not built, the comparison is skipped with a
-- message saying why. Bad input is checked in any case.
local lm = require("lumen")
local shell = require("spec.shell")
local nn = lm.nn

local OIO = require("spec.onnx_io")
local write_f32, read_f32 = OIO.write_f32, OIO.read_f32

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

-- ONNX Runtime's python (spec/onnx_io.lua), or nil with why_not set
local why_not
local function venv()
   local py, why = OIO.runtime()
   why_not = why
   return py
end

-- export each {name, channels_last, opset} model of lm.models (10 classes, warmed batch norms,
-- a 1 x 3 x 64 x 64 input), run them all through ONNX Runtime in one process, and compare with
-- the eager logits (within 1e-4 of the largest); pending with the reason without the venv
local function check_models(cases, seed)
   local py = venv()
   if not py then
      print("\nSKIPPED onnx_spec (ONNX Runtime comparison): " .. why_not)
      pending("ONNX Runtime comparison skipped: " .. why_not)
      return
   end
   local dir = os.tmpname()
   os.remove(dir)
   assert(os.execute("mkdir -p " .. shell.q(dir)) == 0)
   local want, args, opsets = {}, {}, {}
   for i, mm in ipairs(cases) do
      local name, cl, opset = mm[1], mm[2], mm[3] or 17
      lm.manual_seed(seed + i)
      local model = lm.models[name]({ num_classes = 10 }):eval()
      warm(model)
      local x = lm.randn({ 1, 3, 64, 64 })
      if cl then
         lm.to_channels_last(model)
         x = x:contiguous(lm.channels_last)            -- exported in logical NCHW order
      end
      local key = name .. "_" .. opset
      local p = dir .. "/" .. key
      assert.are.equal(p .. ".onnx", lm.onnx.export(model, x, p .. ".onnx", { opset = opset }))
      write_f32(p .. ".x", x)
      want[key], opsets[key] = lm.no_grad(function() return model(x) end), opset
      for _, a in ipairs({ p .. ".onnx", p .. ".x", p .. ".y" }) do
         args[#args + 1] = shell.q(a)
      end
   end
   local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
   assert.are.equal(0, rc, out)
   for key, y in pairs(want) do
      assert.truthy(out:find("checked " .. dir .. "/" .. key .. ".onnx opset " .. opsets[key], 1,
                             true), out)
      local got = read_f32(dir .. "/" .. key .. ".y", y:size())
      local d = (got - y):abs():max():item() / math.max(1, y:abs():max():item())
      if os.getenv("JIT_VERBOSE") then print(key, "ONNX Runtime vs eager", d) end
      assert.is_true(d <= 1e-4, key .. ": " .. d)
      assert.is_true(y:abs():max():item() > 1e-3, key .. ": logits too small to compare")
   end
   os.execute("rm -rf " .. shell.q(dir))
end

describe("lm.onnx.export", function()
   it("resnet50, resnext50_32x4d, alexnet: onnx.checker, ONNX Runtime within 1e-4", function()
      check_models({ { "resnet50", true }, { "resnext50_32x4d", false }, { "alexnet", false } },
                   20)
   end)

   it("the issue-40 families (shufflenet_v2 at opsets 13 and 18: narrow as Slice, mean as "
      .. "ReduceMean), channels-last: ONNX Runtime within 1e-4", function()
      check_models({ { "shufflenet_v2_x0_5", true, 13 }, { "shufflenet_v2_x0_5", true, 18 },
                     { "mobilenet_v3_small", true }, { "mobilenet_v2", true },
                     { "efficientnet_b0", true }, { "regnet_y_400mf", true },
                     { "convnext_tiny", true } }, 40)
   end)

   it("the video models (r3d_18, r2plus1d_18, mc3_18, channels_last_3d): ONNX Runtime within "
      .. "1e-4", function()
      local py = venv()
      if not py then
         pending("ONNX Runtime comparison skipped: " .. why_not)
         return
      end
      local dir = os.tmpname()
      os.remove(dir)
      assert(os.execute("mkdir -p " .. shell.q(dir)) == 0)
      local want, args = {}, {}
      for i, name in ipairs({ "r3d_18", "r2plus1d_18", "mc3_18" }) do
         lm.manual_seed(40 + i)
         local model = lm.models[name]({ num_classes = 7 }):eval()
         warm(model)
         lm.to_channels_last(model)
         local x = lm.randn({ 1, 3, 4, 32, 32 }):contiguous(lm.channels_last_3d)
         local p = dir .. "/" .. name
         lm.onnx.export(model, x, p .. ".onnx")
         write_f32(p .. ".x", x)
         want[name] = lm.no_grad(function() return model(x) end)
         for _, a in ipairs({ p .. ".onnx", p .. ".x", p .. ".y" }) do
            args[#args + 1] = shell.q(a)
         end
      end
      local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
      assert.are.equal(0, rc, out)
      for name, y in pairs(want) do
         local got = read_f32(dir .. "/" .. name .. ".y", y:size())
         local d = (got - y):abs():max():item() / math.max(1, y:abs():max():item())
         if os.getenv("JIT_VERBOSE") then print(name, "ONNX Runtime vs eager", d) end
         assert.is_true(d <= 1e-4, name .. ": " .. d)
      end
      os.execute("rm -rf " .. shell.q(dir))
   end)

   it("exports a small graph (adaptive pool to a larger size, cat, 4-D linear)", function()
      local py = venv()
      if not py then
         pending("ONNX Runtime comparison skipped: " .. why_not)
         return
      end
      lm.manual_seed(5)
      local w = lm.randn({ 4, 3, 3, 3 })
      local lin, lin4 = nn.Linear(6, 2), nn.Linear(4, 2)
      local fn = function(x)
         local y = lm.F.conv2d(x, w, nil, { padding = 1, stride = 2, relu = true })
         y = lm.F.adaptive_avg_pool2d(y, { 5, 3 })              -- 4x4 -> 5x3: MatMuls
         y = lm.cat({ y, y * 2 }, 2)
         y = lm.F.avg_pool2d(y, { kernel_size = 2, stride = 1, padding = 1 })
         return lin(y:reshape({ 1, 8, 6, 4 }):transpose(3, 4):contiguous():view(1, 32, 6))
      end
      local x = lm.randn({ 1, 3, 8, 8 })
      local ok, err = pcall(lm.onnx.export, fn, x, "/tmp/never.onnx")
      -- transpose has no exporter: a clear error, nothing written
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.onnx.export: node %d+: operator Tensor.transpose " ..
                                       "has no ONNX export"))
      assert.is_nil(io.open("/tmp/never.onnx"))
      local fn2 = function(t)
         local y = lm.F.conv2d(t, w, nil, { padding = 1, stride = 2, relu = true })
         y = lm.F.adaptive_avg_pool2d(y, { 5, 3 })
         y = lm.cat({ y, y * 2 }, 2)
         y = lm.F.avg_pool2d(y, { kernel_size = 2, stride = 1, padding = 1 })
         return lin4(y:reshape({ 1, 8, 6, 4 }))
      end
      local dir = os.tmpname()
      os.remove(dir)
      lm.onnx.export(fn2, x, dir .. ".onnx")
      write_f32(dir .. ".x", x)
      local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(dir .. ".onnx") ..
                               " " .. shell.q(dir .. ".x") .. " " .. shell.q(dir .. ".y"))
      assert.are.equal(0, rc, out)
      local want = lm.no_grad(function() return fn2(x) end)
      local got = read_f32(dir .. ".y", want:size())
      assert.is_true((got - want):abs():max():item() < 1e-5)
      os.remove(dir .. ".onnx")
      os.remove(dir .. ".x")
      os.remove(dir .. ".y")
   end)

   it("exports a frozen graph (fused conv epilogues with residual adds)", function()
      local py = venv()
      if not py then
         pending("ONNX Runtime comparison skipped: " .. why_not)
         return
      end
      lm.manual_seed(6)
      local model = lm.models.small_resnet({ in_channels = 3, width = 8, blocks = 2,
                                             num_classes = 4 }):eval()
      warm(model)
      local x = lm.randn({ 2, 3, 16, 16 })
      local f = lm.jit.freeze(lm.jit.trace(model, x))
      -- the blocks' batch norms carry their relu and residual add (nn.utils.bn_relu), and
      -- folding them moves both into the convolutions' epilogues
      assert.is_true(f.freeze_stats.fold_bn > 0)
      local with_residual = 0
      for _, node in ipairs(f.graph.nodes) do
         local o = node.op == "F.conv2d" and node.args[4]
         if type(o) == "table" and type(o.map) == "table" and o.map.residual ~= nil then
            with_residual = with_residual + 1
         end
      end
      assert.is_true(with_residual > 0)
      local p = os.tmpname()
      lm.onnx.export(f, nil, p .. ".onnx")
      write_f32(p .. ".x", x)
      local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(p .. ".onnx") ..
                               " " .. shell.q(p .. ".x") .. " " .. shell.q(p .. ".y"))
      assert.are.equal(0, rc, out)
      local want = lm.no_grad(function() return model(x) end)
      local got = read_f32(p .. ".y", want:size())
      local d = (got - want):abs():max():item() / math.max(1, want:abs():max():item())
      assert.is_true(d <= 1e-4, "frozen: " .. d)
      for _, e in ipairs({ "", ".onnx", ".x", ".y" }) do os.remove(p .. e) end
   end)

   it("dynamic_axes: the exported model runs in ONNX Runtime at any batch size", function()
      local py = venv()
      if not py then
         pending("ONNX Runtime comparison skipped: " .. why_not)
         return
      end
      lm.manual_seed(8)
      local Net = nn.Module:extend("DynNet")
      function Net:__init()
         self.conv = nn.Conv2d(3, 6, 3, { padding = 1 })
         self.pool = nn.AdaptiveAvgPool2d(2)
         self.fc = nn.Linear(24, 5)
      end
      function Net:forward(x)
         local y = self.pool(lm.F.relu(self.conv(x)))
         return self.fc(y:reshape({ y:size(1), 24 }))     -- the batch in a Reshape
      end
      local model = Net():eval()
      local p = os.tmpname()
      lm.onnx.export(model, lm.randn({ 2, 3, 8, 8 }), p .. ".onnx",
                     { dynamic_axes = { input = { [1] = "batch" }, output = { [1] = "batch" } } })
      for _, n in ipairs({ 1, 3, 7 }) do
         local x = lm.randn({ n, 3, 8, 8 })
         write_f32(p .. ".x", x)
         local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(p .. ".onnx") ..
                                  " " .. shell.q(p .. ".x") .. " " .. shell.q(p .. ".y"))
         assert.are.equal(0, rc, out)
         assert.truthy(out:find("input ['batch', 3, 8, 8]", 1, true), out)
         assert.truthy(out:find("output dims ['batch', 5]", 1, true), out)
         local want = lm.no_grad(function() return model(x) end)
         local got = read_f32(p .. ".y", want:size())
         assert.is_true((got - want):abs():max():item() < 1e-5, "batch " .. n)
      end
      -- without dynamic_axes the batch is fixed: another batch size is refused by ONNX Runtime
      lm.onnx.export(model, lm.randn({ 2, 3, 8, 8 }), p .. ".onnx")
      write_f32(p .. ".x", lm.randn({ 3, 3, 8, 8 }))
      local _, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(p .. ".onnx") ..
                             " " .. shell.q(p .. ".x") .. " " .. shell.q(p .. ".y"))
      assert.are_not.equal(0, rc)
      for _, e in ipairs({ "", ".onnx", ".x", ".y" }) do os.remove(p .. e) end
   end)

   it("rejects bad dynamic_axes, naming what is wrong", function()
      local m = nn.Sequential(nn.Linear(3, 2)):eval()
      local x = lm.randn({ 1, 3 })
      local function err(da, needle)
         local ok, e = pcall(lm.onnx.export, m, x, "/tmp/never.onnx", { dynamic_axes = da })
         assert.is_false(ok)
         assert.truthy(tostring(e):find("lumen.onnx.export: ", 1, true), tostring(e))
         assert.truthy(tostring(e):find(needle, 1, true), tostring(e))
      end
      err(5, "dynamic_axes must be a table")
      err({ input = "batch" }, "dynamic_axes.input must be a table")
      err({ input = { [0] = "batch" } }, "dims are 1-based integers, got 0")
      err({ input = { [1] = true } }, "dynamic_axes.input[1] must be a name")
      err({ images = { [1] = "batch" } }, "dynamic_axes names 'images', which is not an input " ..
          "or output of the graph (input, output)")
      if lm.onnx.available() then
         err({ input = { [3] = "x" } }, "dynamic_axes.input: dim 3, but input has 2 dims")
      end
      assert.is_nil(io.open("/tmp/never.onnx"))
   end)

   it("rejects bad options and models it cannot export", function()
      local m = nn.Sequential(nn.Linear(3, 2), nn.Dropout(0.5))
      local x = lm.randn({ 1, 3 })
      assert.has_error(function() lm.onnx.export(m, x, "/tmp/x.onnx", { opset = 7 }) end,
                       "lumen.onnx.export: opset must be an integer from 13 to 21, got 7")
      assert.has_error(function() lm.onnx.export(m, x, "/tmp/x.onnx", { op = 17 }) end,
                       "lumen.onnx.export: unknown option 'op'")
      assert.has_error(function() lm.onnx.export(m, x, 5) end,
                       "lumen.onnx.export: path must be a non-empty string, got number")
      local ok, err = pcall(lm.onnx.export, m, x, "/tmp/x.onnx")   -- training mode
      assert.is_false(ok)
      assert.truthy(tostring(err):find("a dropout in training mode", 1, true))
   end)
end)
