-- examples/check_layout.lua -- convert a ResNet-50 to channels-last and check that the layout
-- survives the whole forward and backward pass.
--
--    bin/lumen examples/check_layout.lua            (after `make`)
--    bin/lumen examples/check_layout.lua 2 96       (batch size, image size)
--    bin/lumen examples/check_layout.lua 1 64 report.html
--                                                   (also the report as a page: the module tree
--                                                    coloured by format; open it in a browser)
--
-- See docs/checking_models.md for what the report means and docs/debugging_channels_last.md for
-- what to do when it is not ok.

local lm = require("lumen")
require("lumen.util").help_only(arg, [[
usage: bin/lumen examples/check_layout.lua [BATCH] [SIZE] [HTML]
Convert a ResNet-50 to channels-last and check that the layout survives the forward and the
backward pass (lm.layout.check; docs/checking_models.md).
  BATCH  batch size (default: 1)
  SIZE   image size in pixels (default: 64)
  HTML   also write the report as a page to this file (default: none)]])

local batch = tonumber(arg and arg[1]) or 1
local size = tonumber(arg and arg[2]) or 64
local html = arg and arg[3] or nil

lm.manual_seed(0)
local model = lm.models.resnet50({ num_classes = 1000 })
lm.to_channels_last(model)                     -- every 4-D parameter and buffer, in place

-- the input is converted separately (a model cannot do it for you)
local x = lm.randn({ batch, 3, size, size }):to(lm.channels_last)

-- one forward and one backward (loss = output:sum()), then everything is put back as it was:
-- forwards, gradients, batch-norm running statistics
local t0 = os.clock()
local report = lm.layout.check(model, x, { backward = true, html = html })
print(report)
if html then print("\nHTML report written to " .. html) end
print(("\n%d rows (module calls, fused ReLUs) checked in %.2f s of CPU time"):format(#report.rows,
   os.clock() - t0))

if report.ok then
   print("channels-last all the way: forward, backward and every 4-D parameter gradient")
else
   print("channels-last was lost; the operator responsible:")
   local trace = lm.layout.trace(function() return model(x) end)
   print(trace)
end
