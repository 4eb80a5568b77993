-- lumen.memory -- GC pressure and allocator statistics.
--
-- Tensor memory lives in C, so Lua's collector does not see it: a loop creating large
-- temporaries would run out of memory long before the collector runs. The allocator raises a
-- "pressure" flag when live bytes cross a soft limit; every tensor constructor checks it (one
-- cheap FFI call) and then runs a full collection here, which frees unreachable tensors through
-- their ffi.gc finalizers, and reports back so the allocator can adapt the limit.

local C = require("lumen.C")

local M = {}

-- The allocator's base soft limit. Small enough that a loop of large temporaries stays within a
-- few dozen tensors of its real working set; the allocator grows the limit (x1.4 per collection)
-- when a program really holds more, and shrinks it back when usage falls. LUMEN_SOFT_LIMIT
-- (bytes) overrides it; lm.memory.set_soft_limit changes it at run time.
M.DEFAULT_SOFT_LIMIT = 64 * 2 ^ 20
do
   local env = tonumber(os.getenv("LUMEN_SOFT_LIMIT") or "")
   if env and env >= 0 then
      C.lm_mem_set_soft_limit(env)
   else
      C.lm_mem_set_soft_limit(M.DEFAULT_SOFT_LIMIT)
   end
end

local collecting = false

-- run a full collection now and tell the allocator
function M.collect()
   if collecting then return end      -- a finalizer that allocates must not recurse
   collecting = true
   collectgarbage()
   collecting = false
   C.lm_mem_collected()
end

-- the same check every constructor does: collect when the allocator asks for it
function M.check_pressure()
   if C.lm_mem_pressure() ~= 0 then M.collect() end
end

local function bytes_arg(fname, b)
   if type(b) ~= "number" or b ~= b or b < 0 or b % 1 ~= 0 or b > 2 ^ 62 then
      error("lumen.memory." .. fname .. ": bytes must be a non-negative integer, got " ..
            tostring(b), 3)
   end
   return b
end

function M.live_bytes() return tonumber(C.lm_mem_live_bytes()) end
function M.peak_bytes() return tonumber(C.lm_mem_peak_bytes()) end
function M.reset_peak() C.lm_mem_reset_peak() end
function M.cached_bytes() return tonumber(C.lm_mem_cached_bytes()) end
function M.empty_cache() C.lm_mem_empty_cache() end
function M.soft_limit() return tonumber(C.lm_mem_soft_limit()) end
function M.set_soft_limit(bytes) C.lm_mem_set_soft_limit(bytes_arg("set_soft_limit", bytes)) end
function M.alloc_count() return tonumber(C.lm_mem_alloc_count()) end

return M
