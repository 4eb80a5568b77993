-- lumen.comm -- moving tensors between devices in one process (torch.cuda.comm): scatter a batch
-- over devices, gather results back, broadcast one tensor to many devices, sum copies onto one.
-- Loaded on first use as lm.comm.
--
-- Devices are strings ("cpu", "sim:1", "cuda:0"); a list may name one device several times
-- (DataParallel over {"cpu", "cpu"}). Every copy keeps its source's memory format (t:to(device)
-- preserves it): a channels-last batch scatters into channels-last chunks and channels-last chunks
-- gather into a channels-last batch (PyTorch's scatter gave contiguous chunks: issue #28077).
-- scatter and gather are made of narrow, to and cat, so autograd goes through them (as
-- torch.nn.parallel's Scatter and Gather): a gradient on a chunk reaches the batch on its device.
-- Dims are 1-based as everywhere in lumen's Lua API (negative ones count from the end).

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")

local type, ipairs, tostring, getmetatable = type, ipairs, tostring, getmetatable
local Tensor, is_tensor, typename = T.Tensor, T.is_tensor, T.typename

local M = {}

local function fail(fname, msg)
   error("lumen.comm." .. fname .. ": " .. msg, T.user_level())
end

local function check_tensor(fname, t, what)
   if not is_tensor(t) then fail(fname, what .. ": tensor expected, got " .. typename(t)) end
   if T.cdata(t) == nil then fail(fname, what .. ": the tensor was freed") end
end

-- a device string, checked; returns its canonical name ("sim" -> "sim:0")
local function check_device(fname, d, what)
   local id = T.device_id(d)
   if id == nil then
      fail(fname, "unknown device " .. (type(d) == "string" and ("'" .. d .. "'") or typename(d))
           .. (what and (" (" .. what .. ")") or ""))
   end
   return T.device_name(id)
end

-- a non-empty array of device strings -> array of canonical names
local function check_devices(fname, devices)
   if type(devices) ~= "table" or getmetatable(devices) ~= nil then
      fail(fname, "devices must be an array of device strings, got " .. typename(devices))
   end
   local n = #devices
   if n == 0 then fail(fname, "devices must not be empty") end
   local r = {}
   for i = 1, n do r[i] = check_device(fname, devices[i], "devices[" .. i .. "]") end
   return r
end

-- options: nil or a plain table of known keys (tensor.lua's check, with comm's names)
local SCATTER_OPTS = require("lumen.util").option_set("chunk_sizes", "dim")
local GATHER_OPTS = require("lumen.util").option_set("dim", "destination")
local function check_opts(fname, opts, known)
   return T.check_opts("comm." .. fname, opts, nil, known) or {}
end

-- a non-empty array of tensors
local function check_list(fname, list)
   if type(list) ~= "table" or getmetatable(list) ~= nil then
      fail(fname, "expected an array of tensors, got " .. typename(list))
   end
   local n = #list
   if n == 0 then fail(fname, "expected a non-empty array of tensors") end
   for i = 1, n do check_tensor(fname, list[i], "tensors[" .. i .. "]") end
   return n
end

-- t on device (a canonical name): t itself when it is there already, else a copy that keeps
-- its memory format (differentiable)
local function move(t, device)
   if Tensor.device(t) == device then return t end
   return Tensor.to(t, device)
end

local function is_int(x) return type(x) == "number" and x % 1 == 0 end

-- scatter(t, devices, {chunk_sizes=, dim=1}) -> array of tensors, chunk i on devices[i].
-- Without chunk_sizes the chunks are torch.chunk's: ceil(size / #devices) each, the last
-- smaller, so a dim shorter than the device list gives fewer chunks than devices (as torch).
-- A chunk whose device is t's own is a view of t (torch.cuda.comm.scatter's); the others are
-- copies in t's memory format.
function M.scatter(t, devices, opts)
   local fname = "scatter"
   check_tensor(fname, t, "tensor")
   local devs = check_devices(fname, devices)
   opts = check_opts(fname, opts, SCATTER_OPTS)
   local nd = Tensor.dim(t)
   if nd == 0 then fail(fname, "cannot scatter a 0-dim tensor") end
   local dim = opts.dim == nil and 1 or opts.dim
   if not is_int(dim) or dim == 0 or dim > nd or dim < -nd then
      fail(fname, ("dim %s out of range for a %d-dimensional tensor (expected 1..%d or -%d..-1)")
           :format(tostring(dim), nd, nd, nd))
   end
   if dim < 0 then dim = nd + 1 + dim end
   local size = Tensor.size(t, dim)
   local k = #devs
   local sizes = {}
   if opts.chunk_sizes ~= nil then
      local cs = opts.chunk_sizes
      if type(cs) ~= "table" or getmetatable(cs) ~= nil then
         fail(fname, "chunk_sizes must be an array of integers, got " .. typename(cs))
      end
      if #cs ~= k then
         fail(fname, ("expected one chunk size per device: %d devices, %d chunk sizes")
              :format(k, #cs))
      end
      local sum = 0
      for i = 1, k do
         local s = cs[i]
         if not is_int(s) or s < 0 then
            fail(fname, ("chunk_sizes[%d] must be a non-negative integer, got %s")
                 :format(i, type(s) == "number" and tostring(s) or typename(s)))
         end
         sizes[i] = s
         sum = sum + s
      end
      if sum ~= size then
         fail(fname, ("chunk sizes sum to %d, but the tensor has size %d in dim %d")
              :format(sum, size, dim))
      end
   elseif size == 0 then
      for i = 1, k do sizes[i] = 0 end        -- torch.chunk: k empty chunks
   else
      local step = math.ceil(size / k)
      local left = size
      while left > 0 do
         local s = math.min(step, left)
         sizes[#sizes + 1] = s
         left = left - s
      end
   end
   local out, start = {}, 1
   for i = 1, #sizes do
      out[i] = move(Tensor.narrow(t, dim, start, sizes[i]), devs[i])
      start = start + sizes[i]
   end
   return out
end

-- gather(list, {dim=1, destination=}) -> one tensor on destination (default: the default
-- device, lm.get_default_device(), as torch's "current device"): the tensors concatenated along
-- dim, in the first one's memory format (cat's rule). Sizes must match except in dim.
function M.gather(list, opts)
   local fname = "gather"
   local n = check_list(fname, list)
   opts = check_opts(fname, opts, GATHER_OPTS)
   local dest = opts.destination == nil and T.device_name(T.default_device())
      or check_device(fname, opts.destination, "destination")
   local s1 = Tensor.size(list[1])
   local nd = #s1
   if nd == 0 then fail(fname, "cannot gather 0-dim tensors") end
   local dim = opts.dim == nil and 1 or opts.dim
   if not is_int(dim) or dim == 0 or dim > nd or dim < -nd then
      fail(fname, ("dim %s out of range for a %d-dimensional tensor (expected 1..%d or -%d..-1)")
           :format(tostring(dim), nd, nd, nd))
   end
   if dim < 0 then dim = nd + 1 + dim end
   local d1 = Tensor.dtype(list[1])
   for i = 2, n do
      local si = Tensor.size(list[i])
      if #si ~= nd then
         fail(fname, ("tensors[%d] has %d dims, tensors[1] has %d"):format(i, #si, nd))
      end
      for k = 1, nd do
         if k ~= dim and si[k] ~= s1[k] then
            fail(fname, ("tensors[%d] has size %d in dim %d, tensors[1] has %d (sizes must " ..
                 "match except in dim %d)"):format(i, si[k], k, s1[k], dim))
         end
      end
      if Tensor.dtype(list[i]) ~= d1 then
         fail(fname, ("tensors[%d] is %s, tensors[1] is %s"):format(i,
              tostring(Tensor.dtype(list[i])), tostring(d1)))
      end
   end
   local moved = {}
   for i = 1, n do moved[i] = move(list[i], dest) end
   if n == 1 then
      -- a copy even then (gather's result is new memory, not one of its inputs)
      if moved[1] == list[1] then return Tensor.clone(moved[1]) end
      return moved[1]
   end
   return T.cat(moved, dim)
end

-- NCCL (kernels/cuda/nccl.cu, through lumen.h's lm_cuda_nccl_*): broadcast and reduce_add over
-- GPUs of this process go through one collective when every tensor and device is another GPU,
-- the tensors are dense, of one dtype, sizes and strides, and autograd has nothing to record
-- (no input requires grad); else, or when NCCL is missing, through copies as on other devices.
-- LUMEN_NCCL=0 turns the NCCL path off. M._nccl_calls counts the calls that took it (specs).
local nccl_off = os.getenv("LUMEN_NCCL") == "0"
local DEV_CUDA0, NUM_CUDA, BOOL = T.DEV_CUDA0, T.NUM_CUDA, tonumber(C.LM_BOOL)
M._nccl_calls = 0
local function is_gpu(id) return id ~= nil and id >= DEV_CUDA0 and id < DEV_CUDA0 + NUM_CUDA end
local function empty_like_on(t, device)
   return require("lumen.creation").empty_strided(Tensor.size(t), Tensor.stride(t),
      { dtype = Tensor.dtype(t), device = device })
end
-- run the C call; on failure (NCCL missing, layouts that differ) forget its message: the caller
-- takes the copying path
local function nccl_ok(st)
   if st == 0 then
      M._nccl_calls = M._nccl_calls + 1
      return true
   end
   C.lm_clear_error()
   return false
end

local function nccl_broadcast(t, devs)
   if nccl_off or #devs < 2 or rawget(t, "requires_grad") == true then return nil end
   local c = T.cdata(t)
   if not is_gpu(c.device) or C.lm_is_non_overlapping_and_dense(c) == 0 then return nil end
   local seen, root = {}, nil
   for i, d in ipairs(devs) do
      local id = T.device_id(d)
      if not is_gpu(id) or seen[id] then return nil end
      seen[id] = true
      if id == c.device then root = i end
   end
   if root == nil then return nil end
   local out, arr = {}, ffi.new("lm_tensor*[?]", #devs)
   for i, d in ipairs(devs) do
      out[i] = i == root and t or empty_like_on(t, d)
      arr[i - 1] = T.cdata(out[i])
   end
   if not nccl_ok(C.lm_cuda_nccl_broadcast(arr, #devs, root - 1)) then return nil end
   return out
end

local function nccl_reduce_add(list, n, dest)
   local dest_id = T.device_id(dest)
   if nccl_off or n < 2 or not is_gpu(dest_id) then return nil end
   local seen, root = {}, nil
   for i = 1, n do
      local c = T.cdata(list[i])
      if not is_gpu(c.device) or seen[c.device] or rawget(list[i], "requires_grad") == true
         or c.dtype == BOOL then
         return nil
      end
      seen[c.device] = true
      if c.device == dest_id then root = i end
   end
   if root == nil then return nil end
   local out = empty_like_on(list[root], dest)
   local arr = ffi.new("lm_tensor*[?]", n)
   for i = 1, n do arr[i - 1] = T.cdata(list[i]) end
   if not nccl_ok(C.lm_cuda_nccl_reduce_add(arr, n, T.cdata(out))) then return nil end
   return out
end

-- broadcast(t, devices) -> array: t on each device (t itself where it already is, as
-- torch.cuda.comm.broadcast; elsewhere a copy in t's memory format)
function M.broadcast(t, devices)
   local fname = "broadcast"
   check_tensor(fname, t, "tensor")
   local devs = check_devices(fname, devices)
   local via_nccl = nccl_broadcast(t, devs)
   if via_nccl then return via_nccl end
   local out = {}
   for i, d in ipairs(devs) do out[i] = move(t, d) end
   return out
end

-- reduce_add(list, destination) -> the sum of the tensors, on destination (default: the
-- default device). All must have the same sizes; the result has the first one's memory format.
function M.reduce_add(list, destination)
   local fname = "reduce_add"
   local n = check_list(fname, list)
   local dest = destination == nil and T.device_name(T.default_device())
      or check_device(fname, destination, "destination")
   local s1 = Tensor.size(list[1])
   for i = 2, n do
      local si = Tensor.size(list[i])
      local same = #si == #s1
      for k = 1, #s1 do same = same and si[k] == s1[k] end
      if not same then
         fail(fname, ("tensors[%d] has size %s, tensors[1] has %s (all must match)")
              :format(i, tostring(si), tostring(s1)))
      end
   end
   local via_nccl = nccl_reduce_add(list, n, dest)
   if via_nccl then return via_nccl end
   -- accumulate on the destination, starting from a copy of the first (its format)
   local acc = move(list[1], dest)
   if acc == list[1] then acc = Tensor.clone(acc) end
   for i = 2, n do acc = Tensor.add(acc, move(list[i], dest)) end
   return acc
end

return M
