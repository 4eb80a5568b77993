-- lumen.nn.parallel -- lm.nn.DataParallel(module, devices, {output_device=, dim=1}): PyTorch's
-- torch.nn.DataParallel in one process. Each forward
--   1. scatters every tensor argument along dim over the devices (lm.comm.scatter: chunks keep
--      the batch's memory format; a batch shorter than the device list uses fewer devices),
--   2. replicates the module onto each device: replica 1 is the module itself (its parameters
--      and buffers live on devices[1]); replica i > 1 is a copy of the module tree whose
--      parameters are differentiable copies p:to(devices[i]) of the originals and whose buffers
--      are plain copies,
--   3. runs the replicas one after the other (one Lua thread) and
--   4. gathers their outputs on output_device (default devices[1]) along dim (lm.comm.gather).
-- Backward goes back through the gather, the replicas and the copies, so each original
-- parameter's .grad receives the sum of the replicas' gradients, on devices[1].
--
-- Buffers, as in PyTorch: updates made during forward on replica 1 (batch-norm running
-- statistics in training mode) are kept, since it is the module itself; those on the other
-- replicas are made on copies and lost. Batch norm in training mode normalises each chunk with
-- the chunk's own statistics (as PyTorch's DataParallel without SyncBatchNorm).
-- A device list may name one device several times ({"cpu", "cpu"}); the module's parameters and
-- buffers must be on devices[1] (m:to(devices[1]) first), else forward raises.

local T = require("lumen.tensor")
local Module = require("lumen.nn.module")
local comm = require("lumen.comm")
local A = require("lumen.autograd")

local type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, select, error =
   type, rawget, rawset, getmetatable, setmetatable, pairs, ipairs, tostring, select, error
local unpack = unpack -- luacheck: ignore

local Tensor, is_tensor, is_module = T.Tensor, T.is_tensor, Module.is_module
local C = require("lumen.C")
local function C_dtype_size(id) return C.lm_dtype_size(id) end
local function C_nod(c) return C.lm_is_non_overlapping_and_dense(c) ~= 0 end

local M = {}

local function fail(msg)
   error("lumen.nn.DataParallel: " .. msg, T.user_level())
end

local DataParallel = Module:extend("DataParallel")
M.DataParallel = DataParallel

-- DataParallel(module, devices = {default device}, {output_device = devices[1], dim = 1})
function DataParallel:__init(module, devices, opts)
   if not is_module(module) then
      fail("module: a Module expected, got " .. T.typename(module))
   end
   if devices == nil then devices = { T.device_name(T.default_device()) } end
   if type(devices) ~= "table" or getmetatable(devices) ~= nil or #devices == 0 then
      fail("devices must be a non-empty array of device strings, got " .. T.typename(devices))
   end
   local devs = {}
   for i, d in ipairs(devices) do
      local id = T.device_id(d)
      if id == nil then
         fail("unknown device " .. (type(d) == "string" and ("'" .. d .. "'") or T.typename(d))
              .. " (devices[" .. i .. "])")
      end
      devs[i] = T.device_name(id)
   end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail("options must be a table, got " .. T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if k ~= "output_device" and k ~= "dim" then fail("unknown option '" .. tostring(k) .. "'") end
   end
   local out_dev = devs[1]
   if opts.output_device ~= nil then
      local id = T.device_id(opts.output_device)
      if id == nil then fail("unknown device '" .. tostring(opts.output_device) ..
                             "' (output_device)") end
      out_dev = T.device_name(id)
   end
   local dim = opts.dim == nil and 1 or opts.dim
   if type(dim) ~= "number" or dim % 1 ~= 0 or dim == 0 then
      fail("dim must be a non-zero integer, got " .. tostring(dim))
   end
   self.module = module                 -- a child: state_dict keys are "module.<name>", as torch
   rawset(self, "device_ids", devs)
   rawset(self, "output_device", out_dev)
   rawset(self, "dim", dim)
end

-- every parameter and buffer of the module must be on devices[1] (torch's check)
local function check_source_device(self)
   local dev = self.device_ids[1]
   for _, regname in ipairs({ "named_parameters", "named_buffers" }) do
      for _, nt in ipairs(self.module[regname](self.module)) do
         local d = Tensor.device(nt[2])
         if d ~= dev then
            fail(("module must have its parameters and buffers on devices[1] (%s), but %s " ..
                  "is on %s; move it first with model:to(\"%s\")"):format(dev, nt[1], d, dev))
         end
      end
   end
end

-- a copy of the module tree m on device dev: parameters are differentiable copies (autograd
-- carries their gradients back to the originals), buffers detached copies, other tensors moved,
-- child modules copied (memo: a module or tensor shared in the tree stays shared in the copy)
local function replicate(m, dev, memo)
   if memo[m] then return memo[m] end
   local r = setmetatable({}, getmetatable(m))
   memo[m] = r
   local params, buffers = rawget(m, "_params"), rawget(m, "_buffers")
   local function tensor_copy(t, is_buffer)
      if memo[t] then return memo[t] end
      local u
      if is_buffer then
         u = A.no_grad(function() return Tensor.to(t, dev, { copy = true }) end)
      else
         u = Tensor.to(t, dev, { copy = true })
      end
      memo[t] = u
      return u
   end
   for k, v in pairs(m) do
      if k == "_params" or k == "_buffers" or k == "_children" then
         -- the registries hold names; fresh tables so that the replica shares nothing mutable
         local reg = {}
         for kk, vv in pairs(v) do
            if type(vv) == "table" then
               local sub = {}
               for a, b in pairs(vv) do sub[a] = b end
               reg[kk] = sub
            else
               reg[kk] = vv
            end
         end
         rawset(r, k, reg)
      elseif is_module(v) then
         rawset(r, k, replicate(v, dev, memo))
      elseif is_tensor(v) then
         local is_buffer = type(k) == "string" and buffers and buffers.set[k]
         local is_param = type(k) == "string" and params and params.set[k]
         if is_param or is_buffer then
            rawset(r, k, tensor_copy(v, is_buffer and not is_param))
         elseif Tensor.device(v) ~= dev then
            rawset(r, k, Tensor.to(v, dev))
         else
            rawset(r, k, v)
         end
      else
         rawset(r, k, v)
      end
   end
   return r
end

-- gather the replicas' outputs: tensors, or (nested) arrays of them
local function gather(outputs, dest, dim)
   local first = outputs[1]
   if is_tensor(first) then
      return comm.gather(outputs, { dim = dim, destination = dest })
   end
   if type(first) == "table" and getmetatable(first) == nil then
      local r = {}
      for k in pairs(first) do
         local col = {}
         for i = 1, #outputs do col[i] = outputs[i][k] end
         r[k] = gather(col, dest, dim)
      end
      return r
   end
   return first                         -- numbers, strings, nil: replica 1's
end

function DataParallel:forward(...)
   local devs = self.device_ids
   local n = select("#", ...)
   local args = { ... }
   if #devs == 1 then
      -- one device: the module itself (as torch with a single device id)
      check_source_device(self)
      return self.module(...)
   end
   check_source_device(self)
   -- scatter every tensor argument; the others go to every replica as they are
   local chunks, k = {}, nil
   for i = 1, n do
      local a = args[i]
      if is_tensor(a) then
         local ok, parts = pcall(comm.scatter, a, devs, { dim = self.dim })
         if not ok then fail((tostring(parts):gsub("^lumen%.comm%.scatter: ", "scatter: "))) end
         chunks[i] = parts
         if k == nil or #parts < k then k = #parts end
      end
   end
   if k == nil then fail("forward needs at least one tensor argument to scatter") end
   local outputs = {}
   for r = 1, k do
      local rep = r == 1 and self.module or replicate(self.module, devs[r], {})
      local rargs = {}
      for i = 1, n do rargs[i] = chunks[i] and chunks[i][r] or args[i] end
      outputs[r] = rep(unpack(rargs, 1, n))
   end
   return gather(outputs, self.output_device, self.dim)
end

function DataParallel:extra_repr()
   return "devices={" .. table.concat(self.device_ids, ", ") .. "}"
end

---------------------------------------------------------------------------------------------
-- DistributedDataParallel: one model replica per process (lm.distributed, MPI)
---------------------------------------------------------------------------------------------
-- DistributedDataParallel(module, {bucket_cap_mb = 25, broadcast_buffers = true, overlap = true})
-- wraps a module in a job started by mpirun (lm.distributed.init first). Each rank runs the
-- module on its own shard of the batch; backward leaves in every parameter's .grad the mean of
-- the ranks' gradients, so that the same optimizer step on every rank keeps the replicas equal.
--
--  * At wrap time the ranks check that their modules have the same parameters (count, sizes,
--    dtypes), then rank 0's parameters and buffers are broadcast to the others.
--  * The gradients are grouped into buckets of at most bucket_cap_mb MB (PyTorch's default 25;
--    the first bucket at most 1 MB, so that communication starts early), in reverse parameter
--    order: roughly the order in which backward produces them. Each bucket has one flat buffer,
--    and each parameter's .grad becomes a view of its slice (with the parameter's strides:
--    channels-last weights keep channels-last gradients), so gradients are reduced in place.
--  * A post-accumulate-grad hook on every parameter (Tensor.register_post_accumulate_grad_hook)
--    counts the bucket's ready gradients; when a bucket is complete its non-blocking all-reduce
--    (MPI_Iallreduce, op "mean") starts at once, while backward goes on with the earlier layers.
--    Buckets start in index order on every rank (MPI needs the same order everywhere). A callback
--    queued on the autograd engine (lm.autograd.queue_callback) waits for them at the end of
--    backward; a parameter that took no part in this backward contributes zeros.
--    overlap = false starts every all-reduce in that callback instead (communication after
--    backward: the baseline of bench/ddp.lua).
--  * broadcast_buffers = true (PyTorch's default): every forward in training mode first copies
--    rank 0's buffers (batch-norm running statistics) to the others, in one broadcast per dtype.
--    The batch statistics themselves are per rank, as PyTorch's; SyncBatchNorm shares them.
--  * ddp:no_sync(fn, ...) runs fn (forward and backward) without communication: gradients
--    accumulate locally, and the next synchronised backward reduces the accumulated sums.
-- Each forward in grad mode arms the next backward; a backward without a forward before it does
-- not communicate. state_dict keys are "module.<name>", as PyTorch's.

local A_lib = A
local DDP = Module:extend("DistributedDataParallel")
M.DistributedDataParallel = DDP

local function dfail(msg)
   error("lumen.nn.DistributedDataParallel: " .. msg, T.user_level())
end

local DDP_OPTS = { bucket_cap_mb = true, broadcast_buffers = true, overlap = true }
local FIRST_BUCKET_BYTES = 2 ^ 20

local function dist_lib()
   local dist = require("lumen.distributed")
   if not dist.is_initialized() then
      dfail("the process group is not initialized; call lm.distributed.init({backend = " ..
            "\"mpi\"}) first")
   end
   return dist
end

-- a number that identifies the parameters' count, dtypes and sizes (the same on every rank when
-- the modules match)
local function signature(params)
   local h = #params
   local function mix(v) h = (h * 1000003 + v) % 2147483629 end
   for _, p in ipairs(params) do
      local c = T.cdata(p)
      mix(c.dtype + 17)
      mix(c.ndim + 31)
      for i = 0, c.ndim - 1 do mix(tonumber(c.sizes[i]) % 2147483629) end
   end
   return h
end

function DDP:__init(module, opts)
   if not is_module(module) then
      dfail("module: a Module expected, got " .. T.typename(module))
   end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      dfail("options must be a table, got " .. T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if not DDP_OPTS[k] then dfail("unknown option '" .. tostring(k) .. "'") end
   end
   local cap = opts.bucket_cap_mb == nil and 25 or opts.bucket_cap_mb
   if type(cap) ~= "number" or cap ~= cap or cap <= 0 or cap == math.huge then
      dfail("bucket_cap_mb must be a positive number, got " .. tostring(cap))
   end
   for _, k in ipairs({ "broadcast_buffers", "overlap" }) do
      if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
         dfail(k .. " must be a boolean, got " .. T.typename(opts[k]))
      end
   end
   local dist = dist_lib()
   self.module = module
   rawset(self, "bucket_cap_mb", cap)
   rawset(self, "broadcast_buffers", opts.broadcast_buffers ~= false)
   rawset(self, "overlap", opts.overlap ~= false)
   rawset(self, "require_backward_grad_sync", true)
   rawset(self, "_dist", dist)
   local params = {}
   for _, p in ipairs(module:parameters()) do
      if rawget(p, "requires_grad") == true then params[#params + 1] = p end
   end
   rawset(self, "_ddp_params", params)
   -- the same parameters on every rank?
   local creation = require("lumen.creation")
   local buffers = module:buffers()
   local mine = creation.tensor({ #params, signature(params), #buffers, signature(buffers) },
                                { dtype = "float64" })
   local all = dist.all_gather(mine)
   local function at(t, i) return Tensor.item(Tensor.select(t, 1, i)) end
   for r = 1, #all do
      local n = at(all[r], 1)
      if n ~= #params or at(all[r], 2) ~= at(mine, 2) then
         dfail(("the modules differ across ranks: rank %d has %d parameters, rank %d has %d%s")
               :format(dist.rank(), #params, r - 1, n,
                       n == #params and " (with other sizes or dtypes)" or ""))
      end
      local nb = at(all[r], 3)
      if nb ~= #buffers or at(all[r], 4) ~= at(mine, 4) then
         dfail(("the modules differ across ranks: rank %d has %d buffers, rank %d has %d%s")
               :format(dist.rank(), #buffers, r - 1, nb,
                       nb == #buffers and " (with other sizes or dtypes)" or ""))
      end
   end
   -- rank 0's parameters and buffers everywhere
   A_lib.no_grad(function()
      for _, p in ipairs(module:parameters()) do dist.broadcast(p, { root = 0 }) end
      for _, b in ipairs(module:buffers()) do dist.broadcast(b, { root = 0 }) end
   end)
   self:_build_buckets()
   local hooks = {}
   for _, p in ipairs(params) do
      hooks[#hooks + 1] = Tensor.register_post_accumulate_grad_hook(p, function(q)
         self:_grad_ready(q)
      end)
   end
   rawset(self, "_hooks", hooks)
   rawset(self, "_armed", false)
   rawset(self, "stats", { started_in_backward = 0, started_after_backward = 0 })
end

-- buckets over the parameters in reverse order, one dtype and device each
function DDP:_build_buckets()
   local creation = require("lumen.creation")
   local params = rawget(self, "_ddp_params")
   local cap = self.bucket_cap_mb * 2 ^ 20
   local buckets, of = {}, {}
   local cur, cur_bytes, cur_key = nil, 0, nil
   for i = #params, 1, -1 do
      local p = params[i]
      local c = T.cdata(p)
      local key = c.dtype * 1000 + c.device
      local bytes = tonumber(c.numel) * C_dtype_size(c.dtype)
      local limit = #buckets <= 1 and math.min(cap, FIRST_BUCKET_BYTES) or cap
      if cur == nil or key ~= cur_key or (cur_bytes + bytes > limit and #cur.params > 0) then
         cur = { params = {}, offsets = {}, numel = 0 }
         buckets[#buckets + 1] = cur
         cur_bytes, cur_key = 0, key
      end
      cur.params[#cur.params + 1] = p
      cur.offsets[#cur.params] = cur.numel
      cur.numel = cur.numel + tonumber(c.numel)
      cur_bytes = cur_bytes + bytes
      of[p] = cur
   end
   local views, pc = {}, {}
   for bi, b in ipairs(buckets) do
      b.index = bi
      b.flat = creation.zeros({ math.max(b.numel, 1) }, { dtype = Tensor.dtype(b.params[1]),
                                                         device = Tensor.device(b.params[1]) })
      for k, p in ipairs(b.params) do
         local c = T.cdata(p)
         local sizes, strides = {}, {}
         for d = 0, c.ndim - 1 do sizes[d + 1] = tonumber(c.sizes[d]) end
         if C_nod(c) then
            for d = 0, c.ndim - 1 do strides[d + 1] = tonumber(c.strides[d]) end
         else
            local acc = 1
            for d = c.ndim, 1, -1 do strides[d] = acc; acc = acc * sizes[d] end
         end
         views[p] = Tensor.as_strided(b.flat, sizes, strides, b.offsets[k])
         pc[p] = c
      end
      b.ready = 0
      b.is_ready = {}
      b.work = nil
   end
   rawset(self, "_buckets", buckets)
   rawset(self, "_bucket_of", of)
   rawset(self, "_views", views)
   rawset(self, "_param_c", pc)
   rawset(self, "_next", 1)
end

-- bucket sizes in MB (bench, docs)
function DDP:bucket_sizes()
   local r = {}
   for i, b in ipairs(rawget(self, "_buckets")) do
      r[i] = b.numel * C_dtype_size(T.cdata(b.flat).dtype) / 2 ^ 20
   end
   return r
end

-- put p's gradient into its bucket slice (unless .grad already is that slice); p.grad becomes
-- the slice. No gradient: zeros.
local function stage_grad(self, p)
   local v = rawget(self, "_views")[p]
   local g = rawget(p, "grad")
   if g == nil then
      T.raw.zero_(v)
   elseif not rawequal(g, v) then
      T.raw.copy_(v, g)
   end
   rawset(p, "grad", v)
end

-- start the all-reduce of every complete bucket from the next one on, in index order;
-- in_backward: counted in stats.started_in_backward (else stats.started_after_backward)
local function launch_ready(self, in_backward)
   local buckets = rawget(self, "_buckets")
   local i = rawget(self, "_next")
   local stats = rawget(self, "stats")
   while i <= #buckets and buckets[i].ready == #buckets[i].params do
      local b = buckets[i]
      b.work = self._dist._all_reduce_unchecked("DistributedDataParallel", b.flat, nil, "mean",
                                                nil, true)
      if in_backward then
         stats.started_in_backward = stats.started_in_backward + 1
      else
         stats.started_after_backward = stats.started_after_backward + 1
      end
      i = i + 1
   end
   rawset(self, "_next", i)
end

-- the end of backward (queued on the engine by the first hook): start what is left, wait for
-- every bucket, reset
local function finish_backward(self)
   local buckets = rawget(self, "_buckets")
   for _, b in ipairs(buckets) do
      if b.ready < #b.params then
         for _, p in ipairs(b.params) do
            if not b.is_ready[p] then stage_grad(self, p) end
         end
         b.ready = #b.params
      end
   end
   launch_ready(self, false)
   for _, b in ipairs(buckets) do
      if b.work then b.work:wait() end
      b.work = nil
      b.ready = 0
      b.is_ready = {}
   end
   rawset(self, "_next", 1)
   rawset(self, "_queued", false)
end

function DDP:_grad_ready(p)
   if not rawget(self, "_armed") then return end
   if not rawget(self, "_queued") then
      rawset(self, "_queued", true)
      A_lib.queue_callback(function()
         rawset(self, "_armed", false)
         finish_backward(self)
      end)
   end
   local b = rawget(self, "_bucket_of")[p]
   if b == nil or b.is_ready[p] then return end
   stage_grad(self, p)
   b.is_ready[p] = true
   b.ready = b.ready + 1
   if self.overlap then
      if b.ready == #b.params then launch_ready(self, true) end
      self._dist.progress()
   end
end

-- rank 0's buffers to every rank: one broadcast per dtype (packed)
local function sync_buffers(self)
   local dist = self._dist
   if dist.world_size() == 1 then return end
   local groups, order = {}, {}
   for _, b in ipairs(self.module:buffers()) do
      local key = tostring(Tensor.dtype(b)) .. "@" .. Tensor.device(b)
      if not groups[key] then groups[key] = {}; order[#order + 1] = key end
      local g = groups[key]
      g[#g + 1] = b
   end
   A_lib.no_grad(function()
      for _, key in ipairs(order) do
         local g = groups[key]
         local flat = {}
         for i, b in ipairs(g) do flat[i] = Tensor.reshape(b, { -1 }) end
         local packed = #flat == 1 and Tensor.clone(flat[1]) or T.raw.cat(flat, 1)
         dist._broadcast_unchecked("DistributedDataParallel", packed, nil, 0, nil, false)
         if dist.rank() ~= 0 then
            local off = 1
            for _, b in ipairs(g) do
               local n = Tensor.numel(b)
               T.raw.copy_(b, Tensor.view(Tensor.narrow(packed, 1, off, n), Tensor.size(b)))
               off = off + n
            end
         end
      end
   end)
end

function DDP:forward(...)
   -- a backward that failed part-way may have left all-reduces running
   if rawget(self, "_queued") then
      for _, b in ipairs(rawget(self, "_buckets")) do
         if b.work then pcall(b.work.wait, b.work) end
         b.work, b.ready, b.is_ready = nil, 0, {}
      end
      rawset(self, "_next", 1)
      rawset(self, "_queued", false)
   end
   -- parameters given new data (module:to(...)) need new buckets
   local pc = rawget(self, "_param_c")
   for _, p in ipairs(rawget(self, "_ddp_params")) do
      if T.cdata(p) ~= pc[p] then self:_build_buckets(); break end
   end
   if self.training and self.broadcast_buffers then sync_buffers(self) end
   local armed = A_lib.is_grad_enabled() and self.require_backward_grad_sync
   rawset(self, "_armed", armed)
   if A_lib.is_grad_enabled() then
      -- per backward: how many bucket all-reduces started during backward and after it
      rawset(self, "stats", { started_in_backward = 0, started_after_backward = 0 })
   end
   return self.module(...)
end

-- no_sync(fn, ...): fn(...) with gradient synchronisation off (gradient accumulation); returns
-- fn's results
function DDP:no_sync(fn, ...)
   if type(fn) ~= "function" then dfail("no_sync: expected a function, got " .. T.typename(fn)) end
   local prev = self.require_backward_grad_sync
   rawset(self, "require_backward_grad_sync", false)
   local res = { pcall(fn, ...) }
   rawset(self, "require_backward_grad_sync", prev)
   if not res[1] then error(res[2], 0) end
   return unpack(res, 2, table.maxn(res))
end

function DDP:extra_repr()
   local dist = self._dist
   return ("world_size=%d, rank=%d, buckets=%d, bucket_cap_mb=%s"):format(
      dist.world_size(), dist.rank(), #rawget(self, "_buckets"), tostring(self.bucket_cap_mb))
end

---------------------------------------------------------------------------------------------
-- SyncBatchNorm
---------------------------------------------------------------------------------------------
-- SyncBatchNorm(num_features, opts): BatchNorm2d's options, for inputs of any rank >= 2
-- (N, C, ...). In training mode in a job of more than one rank, the batch mean and variance are
-- those of the global batch (every rank's samples): per-channel sums are all-reduced (two
-- collectives forward: the sum, then the sum of squared deviations from the global mean; two in
-- backward through the same all-reduces). Otherwise it is BatchNorm2d. Every rank must run it in
-- the same order. SyncBatchNorm.convert_sync_batchnorm(module) replaces every BatchNorm1d/2d/3d
-- of a module tree by a SyncBatchNorm holding the same parameters and buffers.

local layers = require("lumen.nn.layers")
local SyncBatchNorm = layers.BatchNorm2d:extend("SyncBatchNorm")
M.SyncBatchNorm = SyncBatchNorm

function SyncBatchNorm:_check_input_dim(d)
   if d < 2 then
      error(("lumen.nn.SyncBatchNorm: expected at least 2D input (got %dD input)"):format(d),
            T.user_level())
   end
end

-- sum over the ranks, differentiable: the gradient of each rank's input is the sum of the
-- ranks' gradients of the output
local function all_reduce_sum(dist, v)
   local out = A_lib.no_grad(function() return Tensor.clone(v) end)
   dist.all_reduce(out)
   A_lib.record(out, "AllReduceBackward", function(g)
      local gg = T.raw.clone(g)
      dist.all_reduce(gg)
      return gg
   end, v)
   return out
end

function SyncBatchNorm:forward(x, fuse)
   local dist = package.loaded["lumen.distributed"]
   if not (self.training and dist and dist.is_initialized() and dist.world_size() > 1) then
      return layers.BatchNorm2d.forward(self, x, fuse)
   end
   if not T.is_tensor(x) then
      error("lumen.nn.SyncBatchNorm: input: tensor expected, got " .. T.typename(x),
            T.user_level())
   end
   local nd = Tensor.dim(x)
   self:_check_input_dim(nd)
   local Cn = Tensor.size(x, 2)
   local dims, shape = { 1 }, { 1, Cn }
   for d = 3, nd do dims[#dims + 1] = d; shape[d] = 1 end
   -- the global count (a plain number: every rank's element count per channel)
   local cnt = A_lib.no_grad(function()
      local creation = require("lumen.creation")
      local t = creation.tensor({ Tensor.numel(x) / Cn }, { dtype = "float64" })
      dist.all_reduce(t)
      return Tensor.item(t)
   end)
   if cnt <= 1 then
      error("lumen.nn.SyncBatchNorm: expected more than 1 value per channel when training, " ..
            "got " .. cnt, T.user_level())
   end
   local mean = Tensor.div(all_reduce_sum(dist, Tensor.sum(x, dims)), cnt)
   local xc = Tensor.sub(x, Tensor.view(mean, shape))
   local var = Tensor.div(all_reduce_sum(dist, Tensor.sum(Tensor.mul(xc, xc), dims)), cnt)
   local invstd = Tensor.rsqrt(Tensor.add(var, self.eps))
   local y = Tensor.mul(xc, Tensor.view(invstd, shape))
   if self.weight ~= nil then y = Tensor.mul(y, Tensor.view(self.weight, shape)) end
   if self.bias ~= nil then y = Tensor.add(y, Tensor.view(self.bias, shape)) end
   if fuse and fuse.residual ~= nil then y = Tensor.add(y, fuse.residual) end
   if fuse and fuse.relu then y = Tensor.relu(y) end
   if self.track_running_stats and self.running_mean ~= nil then
      A_lib.no_grad(function()
         T.raw.add_(self.num_batches_tracked, 1)
         local m = self.momentum
         if m == false then m = 1 / Tensor.item(self.num_batches_tracked) end
         local raw = T.raw
         local dm = Tensor.detach(mean)
         local dv = Tensor.mul(Tensor.detach(var), cnt / (cnt - 1))
         raw.mul_(self.running_mean, 1 - m)
         raw.add_(self.running_mean, raw.mul(raw.to(dm, Tensor.dtype(self.running_mean)), m))
         raw.mul_(self.running_var, 1 - m)
         raw.add_(self.running_var, raw.mul(raw.to(dv, Tensor.dtype(self.running_var)), m))
      end)
   end
   return y
end

local BN_CLASSES = { BatchNorm1d = true, BatchNorm2d = true, BatchNorm3d = true }

local function to_sync(m)
   local name = m:type_name()
   if not BN_CLASSES[name] then return m end
   local s = SyncBatchNorm(m.num_features, { eps = m.eps, momentum = m.momentum,
      affine = m.affine, track_running_stats = m.track_running_stats })
   for _, k in ipairs({ "weight", "bias", "running_mean", "running_var",
                        "num_batches_tracked" }) do
      rawset(s, k, rawget(m, k))
   end
   rawset(s, "training", rawget(m, "training"))
   return s
end

-- convert_sync_batchnorm(module) -> the module with its batch norms replaced (in place for
-- children; a batch norm given directly is returned converted)
function SyncBatchNorm.convert_sync_batchnorm(module)
   if not is_module(module) then
      error("lumen.nn.SyncBatchNorm.convert_sync_batchnorm: a Module expected, got " ..
            T.typename(module), T.user_level())
   end
   local function walk(m)
      for _, nm in ipairs(m:named_children()) do
         local child = nm[2]
         local s = to_sync(child)
         if s ~= child then rawset(m, nm[1], s) else walk(child) end
      end
   end
   local top = to_sync(module)
   if top ~= module then return top end
   walk(module)
   return module
end

return M
