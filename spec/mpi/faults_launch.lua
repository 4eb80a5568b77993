-- spec/mpi/faults_launch.lua -- failures in a 2-rank job end the job within a bounded time with a
-- clear message, and a checkpoint written before the failure is intact. Run by tools/mpi_tests.sh
-- with plain busted (not under mpirun): each case starts `mpirun -np 2 bin/lumen
-- spec/mpi/fault_job.lua MODE CKPT` under `timeout`, so a hang would fail the case, never CI.
local lm = require("lumen")
local ffi = require("ffi")

local LIMIT = 60          -- seconds before timeout(1) kills a hung job
local BOUND = 30          -- what the spec accepts

pcall(ffi.cdef, "typedef struct { long s; long ns; } lm_faults_ts; " ..
                "int clock_gettime(int, lm_faults_ts *);")
local ts = ffi.new("lm_faults_ts")
local function now()
   ffi.C.clock_gettime(1, ts)
   return tonumber(ts.s) + tonumber(ts.ns) * 1e-9
end

local MPIRUN = os.getenv("LUMEN_MPIRUN") or "mpirun --allow-run-as-root --oversubscribe"

local function job(mode, ckpt)
   os.remove(ckpt)
   local cmd = ("timeout %d %s -np 2 bin/lumen spec/mpi/fault_job.lua %s %s 2>&1; echo \"rc=$?\"")
               :format(LIMIT, MPIRUN, mode, ckpt)
   local t0 = now()
   local p = assert(io.popen(cmd))
   local out = p:read("*a")
   p:close()
   local rc = tonumber(out:match("rc=(%d+)%s*$"))
   return out, rc, now() - t0
end

local function checkpoint_intact(ckpt)
   lm.manual_seed(2)
   local nn = lm.nn
   local model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
   local opt = lm.optim.SGD(model:parameters(), { lr = 0.1 })
   local ck = lm.load_checkpoint(ckpt, { model = model, optimizer = opt })
   assert.are.equal(3, ck.fields.step)
end

describe("a failing rank ends the job", function()
   local ckpt = os.tmpname()
   teardown(function() os.remove(ckpt) end)

   it("killed (SIGKILL) while the other waits in an all-reduce", function()
      local out, rc, dt = job("kill", ckpt)
      assert.is_true(dt < BOUND, ("took %.1f s:\n%s"):format(dt, out))
      assert.are_not.equal(0, rc)
      assert.are_not.equal(124, rc, out)
      assert.matches("rank 1 .*exited on signal 9", out)
      assert.is_nil(out:find("not reached", 1, true))
      checkpoint_intact(ckpt)
   end)

   it("a Lua error: the rank aborts the job (MPI_Abort) with its message", function()
      local out, rc, dt = job("error", ckpt)
      assert.is_true(dt < BOUND, ("took %.1f s:\n%s"):format(dt, out))
      assert.are_not.equal(0, rc)
      assert.are_not.equal(124, rc, out)
      assert.matches("deliberate failure on rank 1", out)
      assert.matches("lumen%.distributed: rank 1 of 2 exits with status 1; aborting the job", out)
      -- (mpirun's own "MPI_ABORT was invoked" banner is not always printed: its help-message
      -- channel races with the kill)
      checkpoint_intact(ckpt)
   end)

   it("os.exit without finalize: mpirun stops the others", function()
      local out, rc, dt = job("exit", ckpt)
      assert.is_true(dt < BOUND, ("took %.1f s:\n%s"):format(dt, out))
      assert.are_not.equal(0, rc)
      assert.are_not.equal(124, rc, out)
      assert.matches("exited without calling \"finalize\"", out:gsub("\n", " "))
      checkpoint_intact(ckpt)
   end)

   it("mismatched all_reduce without pcall: both ranks say why and the job ends", function()
      local out, rc, dt = job("mismatch", ckpt)
      assert.is_true(dt < BOUND, ("took %.1f s:\n%s"):format(dt, out))
      assert.are_not.equal(0, rc)
      assert.are_not.equal(124, rc, out)
      assert.matches("lumen%.distributed%.all_reduce: ranks disagree on the tensor: rank 0 has " ..
                     "float32 %(2%), rank 1 has float32 %(3%)", out)
      assert.matches("rank 1 has float32 %(3%), rank 0 has float32 %(2%)", out)
   end)
end)
