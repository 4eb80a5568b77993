-- lumen.nn.parallel -- lm.nn.parallel: the modules that spread a model over several devices or
-- processes, one file each: DataParallel (several devices in one process,
-- lumen/nn/data_parallel.lua), DistributedDataParallel (one replica per process,
-- lumen/nn/distributed_data_parallel.lua) and SyncBatchNorm (batch norm over every process's
-- batch, lumen/nn/sync_batch_norm.lua). lm.nn also has the three at its top level.

return {
   DataParallel = require("lumen.nn.data_parallel"),
   DistributedDataParallel = require("lumen.nn.distributed_data_parallel"),
   SyncBatchNorm = require("lumen.nn.sync_batch_norm"),
}
