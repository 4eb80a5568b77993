-- examples/demo.lua -- a tour of lumen's memory formats.
--    bin/lumen examples/demo.lua        (after `make`; or `make demo`)
--
-- A channels-last tensor is NCHW *logically* (sizes and indices are always N, C, H, W) and NHWC
-- *in memory* (C is the fastest-moving dimension). Only the strides differ. See
-- docs/memory_formats.md for the rules this walks through.

local lm = require("lumen")
require("lumen.util").help_only(arg, [[
usage: bin/lumen examples/demo.lua
A tour of lumen's memory formats (channels-last strides, what each operator keeps); no
arguments. docs/memory_formats.md has the rules it walks through.]])
lm.manual_seed(0)

local function list(t)
   return "(" .. table.concat(t, ",") .. ")"
end

local function yes(b) return b and "yes" or "no" end

local function show(name, t)
   print(string.format("  %-32s %-10s %-13s %-4s %-4s %s", name, list(t:size()),
      list(t:stride()), yes(t:is_contiguous()), yes(t:is_contiguous(lm.channels_last)),
      tostring(t:suggest_memory_format())))
end

local function header()
   print(string.format("  %-32s %-10s %-13s %-4s %-4s %s", "", "sizes", "strides", "cont",
      "cl", "suggest_memory_format()"))
end

print("cont = is_contiguous(), cl = is_contiguous(lm.channels_last)\n")
print("1. The same logical tensor in two layouts")
header()
local x = lm.randn({2, 3, 4, 5})                      -- N=2, C=3, H=4, W=5, contiguous (NCHW)
local y = x:to(lm.channels_last)                      -- same values, NHWC in memory
show("x = randn{2,3,4,5}", x)
show("y = x:to(channels_last)", y)
print("  same values:           " .. yes((x - y):abs():max():item() == 0))
print("  x[1][2][3][4], y[1][2][3][4]: " .. x:totable()[1][2][3][4] .. ", "
   .. y:totable()[1][2][3][4])
print("  stride of C in y is 1: channels are adjacent in memory, one pixel after another")

print("\n2. Allocating directly in channels-last")
header()
local z = lm.zeros({2, 3, 4, 5}, { memory_format = lm.channels_last })
show("zeros(..., channels_last)", z)
show("empty_like(y)  (preserve)", lm.empty_like(y))
show("y:contiguous()", y:contiguous())
show("y:clone()  (preserve)", y:clone())

print("\n3. Elementwise results pick their layout from the inputs")
header()
local bias = lm.randn({3}):view({1, 3, 1, 1})
show("y:relu()", y:relu())
show("y + x   (first operand wins)", y + x)
show("x + y", x + y)
show("y + bias (broadcast C)", y + bias)
show("y * 2", y * 2)
show("y:add_(1)  (in place)", y:add_(1))

print("\n4. Ambiguous shapes: C == 1 or H == W == 1 are contiguous both ways")
header()
local nc11 = lm.ones({2, 3, 1, 1})
show("ones{2,3,1,1}", nc11)
show("ones{2,3,1,1}:to(channels_last)", nc11:to(lm.channels_last))
show("ones{2,3,1,1}:contiguous(cl)", nc11:contiguous(lm.channels_last))
local n1hw = lm.ones({2, 1, 4, 5})
show("ones{2,1,4,5}", n1hw)
show("ones{2,1,4,5}:to(channels_last)", n1hw:to(lm.channels_last))

print("\n5. Views")
header()
local part = y:narrow(2, 1, 2)                        -- the first two channels: not dense
show("y:narrow(2, 1, 2)", part)
print("  non-overlapping and dense: " .. yes(part:is_non_overlapping_and_dense()))
show("y:permute(1, 3, 4, 2)  (NHWC)", y:permute(1, 3, 4, 2))
show("y:flatten(2)  (copies: no view)", y:flatten(2))

print("\n6. Reductions do not care about the layout")
print(string.format("  sum over x: %.5f   sum over x:to(channels_last): %.5f", x:sum():item(),
   x:to(lm.channels_last):sum():item()))

print("\n7. A small channels-last tensor, printed")
print(lm.arange(12):view({1, 3, 2, 2}):to(lm.channels_last))
