-- lumen.cuda -- torch.cuda's queries (lm.cuda) and the CUDA backend's switches (lm.backends), as
-- PyTorch names them.
--
-- The backend is build/liblumen_cuda.so (kernels/cuda/), which liblumen loads the first time a
-- cuda:N device or one of these functions is asked for (src/device.c); everything here goes
-- through lumen.h's lm_cuda_* API. Without CUDA (no library, no driver, no GPU) is_available() is
-- false, device_count() 0, and the other functions raise "lumen.cuda.<fn>: CUDA is not available
-- (<why>)". The switches of lm.backends are the exception, as in PyTorch: a script that sets
-- lm.backends.cudnn.benchmark = true runs on a machine without a GPU too (the value is kept here).
--
-- Device memory: every cuda:N has a caching allocator (kernels/cuda/alloc.cu); memory_allocated
-- counts the blocks live tensors hold, memory_reserved the segments taken from the GPU (live +
-- cached). A tensor dropped in Lua gives its block back when the collector finds it dead, so the
-- queries first free what the last collection found (lumen.memory's settle), and empty_cache()
-- collects before it releases the cache.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local memory = require("lumen.memory")

local M = {}

local raise, argerror = T.raise, T.argerror

function M.is_available() return T.device_available(T.DEV_CUDA0) end

function M.device_count()
   local n = 0
   while n < T.NUM_CUDA and T.device_available(T.DEV_CUDA0 + n) do n = n + 1 end
   return n
end

-- lumen has no per-thread current device (every tensor names its own): cuda:0, as in PyTorch
-- before torch.cuda.set_device
function M.current_device() return 0 end

-- a device argument: nil (the current device, 0), an index, "cuda" or "cuda:N"; returns N
local function dev_index(fname, dev)
   if dev == nil then return 0 end
   if type(dev) == "number" and dev % 1 == 0 and dev >= 0 and dev < T.NUM_CUDA then return dev end
   if type(dev) == "string" then
      if dev == "cuda" then return 0 end
      local k = tonumber(dev:match("^cuda:(%d+)$"))
      if k and k < T.NUM_CUDA then return k end
   end
   argerror("cuda." .. fname, "expected a CUDA device (an index from 0, \"cuda\" or \"cuda:N\"), "
            .. "got " .. (type(dev) == "string" and ("'" .. dev .. "'") or tostring(dev)))
end

local function check(st, fname)
   if st ~= 0 then raise("cuda." .. fname) end
end

function M.synchronize(dev)
   check(C.lm_cuda_synchronize(dev_index("synchronize", dev)), "synchronize")
end

local stats = ffi.new("int64_t[?]", C.LM_CUDA_NSTATS)
local function stat(fname, dev, which)
   local k = dev_index(fname, dev)
   memory.settle()
   check(C.lm_cuda_memory_stats(k, stats), fname)
   return tonumber(stats[which])
end

function M.memory_allocated(dev) return stat("memory_allocated", dev, C.LM_CUDA_STAT_LIVE) end
function M.max_memory_allocated(dev)
   return stat("max_memory_allocated", dev, C.LM_CUDA_STAT_PEAK)
end
function M.memory_reserved(dev) return stat("memory_reserved", dev, C.LM_CUDA_STAT_RESERVED) end

-- torch.cuda.memory_stats's names for the counters lumen keeps
function M.memory_stats(dev)
   local k = dev_index("memory_stats", dev)
   memory.settle()
   check(C.lm_cuda_memory_stats(k, stats), "memory_stats")
   local function s(i) return tonumber(stats[i]) end
   return {
      ["allocated_bytes.all.current"] = s(C.LM_CUDA_STAT_LIVE),
      ["allocated_bytes.all.peak"] = s(C.LM_CUDA_STAT_PEAK),
      ["reserved_bytes.all.current"] = s(C.LM_CUDA_STAT_RESERVED),
      num_device_alloc = s(C.LM_CUDA_STAT_MALLOCS),
      num_device_free = s(C.LM_CUDA_STAT_FREES),
      num_alloc_retries = s(C.LM_CUDA_STAT_RETRIES),
      num_ooms = s(C.LM_CUDA_STAT_OOMS),
      -- lumen's own: live bytes may grow this much between two collections
      collection_growth_limit = s(C.LM_CUDA_STAT_GROWTH_LIMIT),
   }
end

function M.reset_peak_memory_stats(dev)
   local k = dev_index("reset_peak_memory_stats", dev)
   memory.settle()
   check(C.lm_cuda_reset_peak(k), "reset_peak_memory_stats")
end

-- release the cached blocks of every GPU (torch.cuda.empty_cache); a collection first, so that
-- the blocks of tensors already dropped are in the cache
function M.empty_cache()
   memory.collect()
   check(C.lm_cuda_empty_cache(-1), "empty_cache")
end

function M.set_per_process_memory_fraction(fraction, dev)
   if type(fraction) ~= "number" or not (fraction > 0 and fraction <= 1) then
      argerror("cuda.set_per_process_memory_fraction", "fraction must be a number in (0, 1], got "
               .. tostring(fraction))
   end
   check(C.lm_cuda_set_memory_fraction(dev_index("set_per_process_memory_fraction", dev),
                                       fraction), "set_per_process_memory_fraction")
end

local namebuf = ffi.new("char[256]")
local props = ffi.new("int64_t[?]", C.LM_CUDA_NPROPS)

function M.get_device_name(dev)
   check(C.lm_cuda_device_properties(dev_index("get_device_name", dev), namebuf, 256, nil),
         "get_device_name")
   return ffi.string(namebuf)
end

function M.get_device_properties(dev)
   check(C.lm_cuda_device_properties(dev_index("get_device_properties", dev), namebuf, 256,
                                     props), "get_device_properties")
   return {
      name = ffi.string(namebuf),
      total_memory = tonumber(props[C.LM_CUDA_PROP_TOTAL_MEMORY]),
      multi_processor_count = tonumber(props[C.LM_CUDA_PROP_SM_COUNT]),
      major = tonumber(props[C.LM_CUDA_PROP_MAJOR]),
      minor = tonumber(props[C.LM_CUDA_PROP_MINOR]),
   }
end

-- {runtime, driver, cudnn, cublas: the numbers CUDA reports (12040 is 12.4; cuDNN 90100 is
-- 9.1.0), emulated: true in the emulated build (make cuda-emu), whose numbers are 0}
function M.versions()
   local v = ffi.new("int64_t[?]", C.LM_CUDA_NVERSIONS)
   check(C.lm_cuda_versions(v), "versions")
   return {
      runtime = tonumber(v[C.LM_CUDA_VER_RUNTIME]),
      driver = tonumber(v[C.LM_CUDA_VER_DRIVER]),
      cudnn = tonumber(v[C.LM_CUDA_VER_CUDNN]),
      cublas = tonumber(v[C.LM_CUDA_VER_CUBLAS]),
      emulated = v[C.LM_CUDA_VER_EMULATED] ~= 0,
   }
end

---------------------------------------------------------------------------------------------
-- lm.backends: torch.backends.cudnn.benchmark / allow_tf32 / deterministic and
-- torch.backends.cuda.matmul.allow_tf32, as settable fields; lm.backends.cpu.bf16_winograd
---------------------------------------------------------------------------------------------
-- A table of switches: reading a field asks the backend (kernels/cuda/backend.cu holds CUDA's,
-- kernels/cpu/backend.c the CPU's: get and set are its lm_*_get_option / lm_*_set_option);
-- writing one takes a boolean and sets it there. Without CUDA the value is kept in Lua (PyTorch
-- accepts these settings on any machine), and reading gives it back.
local function switches(path, fields, defaults, get, set)
   get = get or C.lm_cuda_get_option
   set = set or C.lm_cuda_set_option
   local kept = {}
   for k, v in pairs(defaults) do kept[k] = v end
   local v = ffi.new("int[1]")
   return setmetatable({}, {
      __index = function(_, key)
         local id = fields[key]
         if id == nil then return nil end
         local names = type(id) == "table" and id.names or nil
         if names then id = id.id end
         if get(id, v) == 0 then
            if names then return names[v[0]] end
            return v[0] ~= 0
         end
         C.lm_clear_error()
         return kept[key]
      end,
      __newindex = function(_, key, value)
         local id = fields[key]
         if id == nil then
            local names = {}
            for n in pairs(fields) do names[#names + 1] = n end
            table.sort(names)
            error("lumen." .. path .. ": no setting named '" .. tostring(key) .. "' (there are: "
                  .. table.concat(names, ", ") .. ")", 2)
         end
         local names = type(id) == "table" and id.names or nil
         local num
         if names then
            for k = 0, #names do
               if names[k] == value then num = k end
            end
            if num == nil then
               local list = {}
               for k = 0, #names do list[#list + 1] = ("%q"):format(names[k]) end
               error("lumen." .. path .. "." .. key .. ": expected " .. table.concat(list, " or ")
                     .. ", got " .. tostring(value), 2)
            end
            id = id.id
         elseif type(value) ~= "boolean" then
            error("lumen." .. path .. "." .. key .. ": expected a boolean, got "
                  .. tostring(value), 2)
         else
            num = value and 1 or 0
         end
         kept[key] = value
         local st = set(id, num)
         if st ~= 0 then C.lm_clear_error() end
      end,
      __tostring = function() return "lm." .. path end,
   })
end

local backends = {
   cudnn = switches("backends.cudnn",
      { benchmark = C.LM_CUDA_OPT_BENCHMARK, allow_tf32 = C.LM_CUDA_OPT_TF32_CONV,
        deterministic = C.LM_CUDA_OPT_DETERMINISTIC },
      { benchmark = false, allow_tf32 = true, deterministic = false }),
   cuda = {
      matmul = switches("backends.cuda.matmul", { allow_tf32 = C.LM_CUDA_OPT_TF32_MATMUL },
                        { allow_tf32 = false }),
   },
   -- lumen's own: bf16_winograd, bfloat16 3x3 convolutions through Winograd with bfloat16
   -- products (faster, about ten times the rounding error; docs/mixed_precision.md); amx,
   -- bfloat16 GEMMs and convolutions on AMX tiles where the CPU and Linux allow them (on by
   -- default, LUMEN_AMX=0 starts it off; amx_available() says whether this process has AMX)
   -- fp32_precision, PyTorch's torch.backends.cpu.fp32_precision: "ieee" (default) or "bf16"
   -- (float32 convolutions and matrix products on AMX tiles from bfloat16-rounded operands)
   cpu = switches("backends.cpu", { bf16_winograd = C.LM_CPU_OPT_BF16_WINOGRAD,
                                    amx = C.LM_CPU_OPT_AMX,
                                    fp32_precision = { id = C.LM_CPU_OPT_FP32_BF16,
                                                       names = { [0] = "ieee", [1] = "bf16" } } },
                  { bf16_winograd = true, amx = true, fp32_precision = "ieee" },
                  C.lm_cpu_get_option, C.lm_cpu_set_option),
}
-- lm.backends.cpu.amx_available(): true when this process can run AMX tiles (CPU, OS and Linux's
-- permission; the emulated build, make amx-emu, says true on any AVX512_BF16 machine).
-- lm.backends.cpu.isa(): the instruction-set level the CPU kernels use ("amx", "avx512_bf16",
-- "avx512", "avx2" or "c").
rawset(backends.cpu, "amx_available", function() return C.lm_cpu_amx_available() ~= 0 end)
rawset(backends.cpu, "isa", function() return ffi.string(C.lm_cpu_isa_name(C.lm_cpu_get_isa())) end)

-- the device argument check, shared with lua/lumen/cuda_graph.lua
M._dev_index = dev_index

-- CUDA graphs (lua/lumen/cuda_graph.lua): CUDAGraph, graph, graph_pool_handle,
-- is_current_stream_capturing
do
   local G = require("lumen.cuda_graph")
   M.CUDAGraph, M.graph = G.CUDAGraph, G.graph
   M.graph_pool_handle, M.is_current_stream_capturing = G.graph_pool_handle,
                                                        G.is_current_stream_capturing
end

-- lm.backends is this module's table of switches
function M.install(lm)
   lm.backends = backends
end

return M
