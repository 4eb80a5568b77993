-- lumen.nn.distributed_data_parallel -- lm.nn.DistributedDataParallel (also
-- lm.nn.parallel.DistributedDataParallel): one model replica per process (lm.distributed, MPI).
--
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

local C = require("lumen.C")
local T = require("lumen.tensor")
local Module = require("lumen.nn.module")
local A = require("lumen.autograd")

local type, rawget, rawset, getmetatable, pairs, ipairs, tostring, error =
   type, rawget, rawset, getmetatable, pairs, ipairs, tostring, error
local unpack = unpack -- luacheck: ignore

local Tensor, is_module = T.Tensor, Module.is_module
local function C_dtype_size(id) return C.lm_dtype_size(id) end
local function C_nod(c) return C.lm_is_non_overlapping_and_dense(c) ~= 0 end

local DDP = Module:extend("DistributedDataParallel")

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
   A.no_grad(function()
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
      A.queue_callback(function()
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
   A.no_grad(function()
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
   local armed = A.is_grad_enabled() and self.require_backward_grad_sync
   rawset(self, "_armed", armed)
   if A.is_grad_enabled() then
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

return DDP
