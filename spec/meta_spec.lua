-- spec/meta_spec.lua -- whole models on the meta device (sizes, strides, dtype and format; no
-- data, nothing computed): resnet50 and resnet152 in channels-last run forward and backward, and
-- lm.layout.check reports for every module the output sizes, strides and formats (and gradient
-- formats) it reports for the same model on the CPU.
local H = require("spec.helpers")
local lm = H.lm

-- per leaf-module call: path, output sizes, strides, format, gradient format
local function summary(report)
   local r = {}
   for i, row in ipairs(report.rows) do
      local out = row._out
      r[i] = {
         path = row.path, type = row.type, input = row.input_size, output = row.output_size,
         format = row.output_format, grad = row.grad_format,
         strides = out and lm.is_tensor(out) and out:stride() or nil,
      }
   end
   return r
end

local function model(name)
   lm.manual_seed(1)
   local m = lm.models[name]()
   m:to(lm.channels_last)
   return m
end

for _, name in ipairs({ "resnet50", "resnet152" }) do
   describe(name .. " on meta", function()
      it("runs forward and backward, channels-last", function()
         local m = model(name):to("meta")
         for _, p in ipairs(m:parameters()) do assert.are.equal("meta", p:device()) end
         local x = lm.empty({ 2, 3, 64, 64 }, { device = "meta", memory_format = lm.channels_last })
         local y = m(x)
         assert.are.equal("meta", y:device())
         assert.are.same({ 2, 1000 }, y:size())
         y:sum():backward()
         local w = m.conv1.weight
         assert.are.equal("meta", w.grad:device())
         assert.are.same(w:size(), w.grad:size())
         assert.is_true(w.grad:is_contiguous(lm.channels_last))
      end)

      it("gives the CPU's per-module sizes, strides and formats in lm.layout.check", function()
         local cpu_x = lm.rand({ 1, 3, 64, 64 }, { device = "cpu" }):to(lm.channels_last)
         local cpu = summary(lm.layout.check(model(name):to("cpu"), cpu_x))
         local meta_x = lm.empty({ 1, 3, 64, 64 }, { device = "meta",
                                                     memory_format = lm.channels_last })
         local meta = summary(lm.layout.check(model(name):to("meta"), meta_x))
         assert.are.equal(#cpu, #meta)
         assert.is_true(#cpu > 50)
         for i = 1, #cpu do
            assert.are.same(cpu[i], meta[i], "row " .. i .. " (" .. tostring(cpu[i].path) .. ")")
         end
      end)
   end)
end
