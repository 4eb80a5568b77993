-- spec/mpi/fault_job.lua MODE CHECKPOINT -- a DDP training job on 2 ranks that fails on purpose
-- (spec/mpi/faults_launch.lua starts it under mpirun and checks that the job ends, how, and
-- that the checkpoint written before the failure is intact):
--   kill      rank 1 kills itself (SIGKILL) at step 5, while rank 0 waits in an all-reduce
--   error     rank 1 raises a Lua error at step 5
--   exit      rank 1 calls os.exit(0) at step 5 without finalize
--   mismatch  the ranks all_reduce tensors of different sizes, without pcall
-- Rank 0 writes CHECKPOINT after step 3.
local lm = require("lumen")
local ffi = require("ffi")
local nn = lm.nn
local mode, ckpt = arg[1], arg[2]
local dist = lm.distributed
dist.init()
local r = dist.rank()
io.stdout:setvbuf("line")
lm.manual_seed(1)
local model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
local ddp = nn.parallel.DistributedDataParallel(model)
local opt = lm.optim.SGD(model:parameters(), { lr = 0.1 })
if mode == "mismatch" then
   dist.all_reduce(lm.zeros({ r + 2 }))
end
for step = 1, 1000 do
   local x = lm.randn({ 4, 3, 6, 6 })
   local y = lm.randint(1, 11, { 4 }):to(lm.int64)
   opt:zero_grad()
   lm.F.cross_entropy(ddp(x), y):backward()
   opt:step()
   if step == 3 and r == 0 then
      lm.save_checkpoint(ckpt, { model = model, optimizer = opt, fields = { step = step } })
      print("rank 0 wrote the checkpoint at step 3")
   end
   if step == 5 and r == 1 then
      if mode == "kill" then
         pcall(ffi.cdef, "int kill(int pid, int sig); int getpid(void);")
         ffi.C.kill(ffi.C.getpid(), 9)
      elseif mode == "error" then
         error("deliberate failure on rank 1")
      elseif mode == "exit" then
         os.exit(0)
      end
   end
end
print("not reached")
