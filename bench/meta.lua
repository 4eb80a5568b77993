-- bench/meta.lua -- lm.layout.check on the meta device beside the same call on the CPU: the
-- check of a whole model's channels-last behaviour, forward and backward, without computing.
-- Rows (median ms; bench/compare reads them):
--   layout_check_resnet50_b2 cpu <ms>    resnet50, 2x3x224x224 channels-last, {backward = true}
--   layout_check_resnet50_b2 meta <ms>   the same model and input moved to "meta"
--   layout_check_resnet152_b64 meta <ms> resnet152 at batch 64 on meta (too large to be worth
--                                        running on this machine's CPU for a check)
-- Both reports are compared (every module's input and output sizes and formats, and its
-- gradient's format): a difference is an error, not a row. Median of max(3, iters / 4) runs
-- after one warm-up.
-- Usage: bin/lumen bench/meta.lua [threads] [iters]
local lm = require("lumen")
local util = require("lumen.util")

local threads = tonumber(arg and arg[1]) or 2
local iters = math.max(3, math.floor((tonumber(arg and arg[2]) or 20) / 4))
lm.set_num_threads(threads)
lm.manual_seed(0)

local function check_ms(model, x)
   local report
   local ms = util.median_ms(function()
      report = lm.layout.check(model, x, { backward = true })
   end, iters)
   return ms, report
end

-- every row of a report: module path, call, input/output sizes and formats, gradient format
local function shapes(report)
   local out = {}
   for i, r in ipairs(report.rows) do
      out[i] = table.concat({ r.path, r.call, tostring(r.input_size), tostring(r.input_format),
                              tostring(r.output_size), tostring(r.output_format),
                              tostring(r.grad_format) }, " ")
   end
   return table.concat(out, "\n")
end

local model = lm.models.resnet50()
lm.to_channels_last(model)
local x = lm.randn({ 2, 3, 224, 224 }):contiguous(lm.channels_last)
local cpu_ms, cpu_report = check_ms(model, x)
print(string.format("layout_check_resnet50_b2 cpu %.3f", cpu_ms))
model:to("meta")
local xm = x:to("meta")
local meta_ms, meta_report = check_ms(model, xm)
print(string.format("layout_check_resnet50_b2 meta %.3f", meta_ms))
if shapes(cpu_report) ~= shapes(meta_report) then
   error("bench/meta.lua: the meta report differs from the CPU's")
end

local big = lm.models.resnet152()
lm.to_channels_last(big)
big:to("meta")
local xb = lm.empty({ 64, 3, 224, 224 }, { device = "meta", memory_format = lm.channels_last })
print(string.format("layout_check_resnet152_b64 meta %.3f", (check_ms(big, xb))))
