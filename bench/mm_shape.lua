-- bench/mm_shape.lua -- one float32 lm.matmul shape, the median of 60 calls and its GFLOP/s
-- (convnext_tiny's Linear layers: 1568 384 1536, 25088 96 384, 392 768 3072; their weight
-- gradients with a transposed first operand: 384 25088 96 T). Compare two libraries by running
-- it alternately with LUMEN_LIB=... (the host's speed moves between minutes).
-- Usage: bin/lumen bench/mm_shape.lua M K N [T]      (threads: LUMEN_THREADS or 2)
local lm = require("lumen")
local util = require("lumen.util")
lm.set_num_threads(tonumber(os.getenv("LUMEN_THREADS") or 2))
local M, K, N = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3])
if not (M and K and N) then
   error("usage: bin/lumen bench/mm_shape.lua M K N [T]", 0)
end
local ta = arg[4] == "T"
local a = ta and lm.randn({ K, M }):t() or lm.randn({ M, K })
local b = lm.randn({ K, N })
local ms = util.median_ms(function() return lm.matmul(a, b) end, 60)
print(("%dx%dx%d%s %.2f ms %.0f GFLOP/s"):format(M, K, N, ta and " T" or "", ms,
                                                2 * M * K * N / ms / 1e6))
