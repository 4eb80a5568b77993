-- lumen.nn.sync_batch_norm -- lm.nn.SyncBatchNorm (also lm.nn.parallel.SyncBatchNorm): batch
-- norm over the global batch of a job of several processes (lm.distributed, MPI).
--
-- SyncBatchNorm(num_features, opts): BatchNorm2d's options, for inputs of any rank >= 2
-- (N, C, ...). In training mode in a job of more than one rank, the batch mean and variance are
-- those of the global batch (every rank's samples): per-channel sums are all-reduced (two
-- collectives forward: the sum, then the sum of squared deviations from the global mean; two in
-- backward through the same all-reduces). Otherwise it is BatchNorm2d. Every rank must run it in
-- the same order. SyncBatchNorm.convert_sync_batchnorm(module) replaces every BatchNorm1d/2d/3d
-- of a module tree by a SyncBatchNorm holding the same parameters and buffers.

local T = require("lumen.tensor")
local Module = require("lumen.nn.module")
local A = require("lumen.autograd")
local layers = require("lumen.nn.layers")

local rawget, rawset, ipairs, error = rawget, rawset, ipairs, error

local Tensor, is_module = T.Tensor, Module.is_module

local SyncBatchNorm = layers.BatchNorm2d:extend("SyncBatchNorm")

function SyncBatchNorm:_check_input_dim(d)
   if d < 2 then
      error(("lumen.nn.SyncBatchNorm: expected at least 2D input (got %dD input)"):format(d),
            T.user_level())
   end
end

-- sum over the ranks, differentiable: the gradient of each rank's input is the sum of the
-- ranks' gradients of the output
local function all_reduce_sum(dist, v)
   local out = A.no_grad(function() return Tensor.clone(v) end)
   dist.all_reduce(out)
   A.record(out, "AllReduceBackward", function(g)
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
   local cnt = A.no_grad(function()
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
      A.no_grad(function()
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

return SyncBatchNorm
