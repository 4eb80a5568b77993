-- lumen.nn -- lm.nn: the Module base class, the standard layers, lm.nn.functional (lm.F),
-- lm.nn.init (weight initialisers), and batch-norm folding for inference (lm.nn.fold_batch_norm,
-- lm.nn.utils.fuse_conv_bn_eval / fuse_conv_bn_weights), lm.nn.DataParallel (lumen.nn.parallel),
-- lm.nn.parallel.DistributedDataParallel and lm.nn.SyncBatchNorm (several processes on MPI).
--
--    local nn = lm.nn
--    local net = nn.Sequential(nn.Conv2d(3, 16, 3, {padding = 1}), nn.BatchNorm2d(16),
--                              nn.ReLU(true), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
--                              nn.Linear(16, 10))
--    net:to(lm.channels_last)
--    local loss = lm.F.cross_entropy(net(x), y)     -- y: 1-based int64 class indices

local Module = require("lumen.nn.module")
local layers = require("lumen.nn.layers")

local nn = {}

nn.Module = Module
nn.is_module = Module.is_module
nn.Parameter = Module.Parameter
nn.functional = require("lumen.functional")
nn.init = require("lumen.nn.weight_init")

for k, v in pairs(layers) do
   if k:sub(1, 1) ~= "_" then nn[k] = v end
end
-- ModuleList, ModuleDict (lumen.nn.containers); the modules of lm.F's composed operators
-- (lumen.nn.layers_composed: L1Loss ... BCEWithLogitsLoss, PReLU, the padding modules, ...)
for _, mod in ipairs({ require("lumen.nn.containers"), require("lumen.nn.layers_composed") }) do
   for k, v in pairs(mod) do nn[k] = v end
end

-- several devices in one process (lumen.nn.parallel): nn.DataParallel(model, devices)
nn.DataParallel = require("lumen.nn.parallel").DataParallel
-- several processes (lm.distributed, MPI): nn.parallel.DistributedDataParallel (also
-- nn.DistributedDataParallel), nn.SyncBatchNorm
nn.parallel = require("lumen.nn.parallel")
nn.DistributedDataParallel = nn.parallel.DistributedDataParallel
nn.SyncBatchNorm = nn.parallel.SyncBatchNorm

-- batch-norm folding for inference (lumen.nn.fold): nn.fold_batch_norm(model) and PyTorch's
-- nn.utils.fuse_conv_bn_eval / fuse_conv_bn_weights
local fold = require("lumen.nn.fold")
nn.fold_batch_norm = fold.fold_batch_norm
nn.utils = {
   fuse_conv_bn_eval = fold.fuse_conv_bn_eval,
   fuse_conv_bn_weights = fold.fuse_conv_bn_weights,
   fold_pair_ = fold.fold_pair_,
   fold_named_ = fold.fold_named_,
   can_fold_all = fold.can_fold_all,
   bn_relu = fold.bn_relu,
}
-- the gradient tools of training loops (lumen.nn.clip_grad), PyTorch's names
local clip = require("lumen.nn.clip_grad")
nn.utils.clip_grad_norm_ = clip.clip_grad_norm_
nn.utils.clip_grad_value_ = clip.clip_grad_value_
nn.utils.parameters_to_vector = clip.parameters_to_vector
nn.utils.vector_to_parameters = clip.vector_to_parameters

return nn
