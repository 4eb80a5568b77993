-- spec/mpi/restart_launch.lua -- bin/lumen-run (issue 39): a training job that survives lost
-- and stuck processes and ends exactly where a run without failures ends. Run by
-- tools/mpi_tests.sh with plain busted (not under mpirun); every job runs under `timeout`.
--
-- The acceptance case: 2 ranks train examples/train.lua --distributed (a generated data set of
-- 1024 images, width 4, 1 thread per rank, --save-every 4, 3 epochs: 192 steps) under
-- `lumen-run --max-restarts 4 --watchdog W`. The harness reads the ranks' heartbeat files
-- (--heartbeat-dir: "beat N pid P ...") and, at random moments (after a random number of steps of
-- the current start) and on random ranks, injects three faults in a random order: SIGKILL, SIGKILL
-- with the latest checkpoint damaged before the restart reads it (the launcher is held with
-- SIGSTOP meanwhile), and SIGSTOP (the watchdog must end the job). The job must finish by
-- itself with status 0 after exactly 3 restarts, name each reason, leave no process behind, and
-- its final parameters must equal those of the same command without faults (max relative
-- difference <= 1e-5; on one machine with deterministic reductions they are bit-identical).
-- LUMEN_RESTART_SEED fixes the harness's random choices (printed at the start).
local lm = require("lumen")
local ffi = require("ffi")

pcall(ffi.cdef, "int kill(int pid, int sig);")
pcall(ffi.cdef, "int usleep(unsigned int usec);")
pcall(ffi.cdef, "typedef struct { long s; long ns; } lm_restart_ts; " ..
                "int clock_gettime(int, lm_restart_ts *);")
local ts = ffi.new("lm_restart_ts")
local function now()
   ffi.C.clock_gettime(1, ts)
   return tonumber(ts.s) + tonumber(ts.ns) * 1e-9
end
local function sleep(s) ffi.C.usleep(math.floor(s * 1e6)) end

local SIGKILL, SIGCONT, SIGSTOP = 9, 18, 19
local WATCHDOG = tonumber(os.getenv("LUMEN_RESTART_WATCHDOG") or "") or 4
local LIMIT = 240 -- seconds before timeout(1) ends a job that hangs
local seed = tonumber(os.getenv("LUMEN_RESTART_SEED") or "") or os.time()
math.randomseed(seed)
print(("restart_launch: random seed %d (LUMEN_RESTART_SEED=%d repeats these faults)")
      :format(seed, seed))

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local WORK = os.tmpname()
os.remove(WORK)
assert(os.execute("mkdir -p " .. q(WORK)) == 0)

local function read_file(path)
   local f = io.open(path, "rb")
   if not f then return nil end
   local s = f:read("*a")
   f:close()
   return s
end

-- the data set: IDX files as Fashion-MNIST's, images whose brightness depends on the label
local function write_idx(path, dims, fill)
   local f = assert(io.open(path, "wb"))
   f:write(string.char(0, 0, 8, #dims))
   local n = 1
   for _, d in ipairs(dims) do
      f:write(string.char(math.floor(d / 16777216) % 256, math.floor(d / 65536) % 256,
                          math.floor(d / 256) % 256, d % 256))
      n = n * d
   end
   local bytes = {}
   for i = 1, n do bytes[i] = string.char(fill(i)) end
   f:write(table.concat(bytes))
   f:close()
end

local DATA = WORK .. "/data"
do
   os.execute("mkdir -p " .. q(DATA))
   local s = 12345
   local function rnd()
      s = (s * 1103515245 + 12345) % 2147483648
      return s
   end
   for _, split in ipairs({ { "train", 1024 }, { "t10k", 64 } }) do
      local n = split[2]
      local labels = {}
      for i = 1, n do labels[i] = rnd() % 10 end
      write_idx(DATA .. "/" .. split[1] .. "-images-idx3-ubyte", { n, 28, 28 }, function(i)
         return (labels[math.floor((i - 1) / 784) + 1] * 20 + rnd() % 40) % 256
      end)
      write_idx(DATA .. "/" .. split[1] .. "-labels-idx1-ubyte", { n }, function(i)
         return labels[i]
      end)
   end
end

local TRAIN = "examples/train.lua --distributed --threads 1 --workers 1 --data " .. q(DATA) ..
   " --limit 1024 --batch-size 16 --width 4 --epochs 3 --eval-batch 64 --save-every 4 --quiet"

-- run a command to the end (under timeout): output, status
local function run(cmd)
   local p = assert(io.popen(("timeout %d %s 2>&1; echo \"rc=$?\""):format(LIMIT, cmd)))
   local out = p:read("*a")
   p:close()
   return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- start a command in the background: a job handle {log =, rc_file =}
local function start(cmd, tag)
   local job = { log = WORK .. "/" .. tag .. ".log", rc_file = WORK .. "/" .. tag .. ".rc" }
   os.remove(job.rc_file)
   assert(os.execute(("(timeout %d %s > %s 2>&1; echo $? > %s) &")
                     :format(LIMIT, cmd, q(job.log), q(job.rc_file))) == 0)
   return job
end

local function finished(job)
   local s = read_file(job.rc_file)
   if s and s:match("%d") then return tonumber(s:match("%d+")) end
end

local function wait_job(job, seconds)
   local t_end = now() + seconds
   while now() < t_end do
      local rc = finished(job)
      if rc then return rc, read_file(job.log) or "" end
      sleep(0.1)
   end
   return nil, read_file(job.log) or ""
end

-- rank r's heartbeat in start k: count, pid (nil before the first)
local function beat(hb, k, r)
   local s = read_file(("%s/start.%d/rank.%d"):format(hb, k, r))
   if not s then return nil end
   local word, n, pid = s:match("^(%a+)%s+(%d+) pid (%d+)")
   if not word then return nil end
   return tonumber(n), tonumber(pid), word
end

-- wait until rank r has sent `steps` heartbeats in start k: its pid
local function wait_beats(job, hb, k, r, steps)
   local t_end = now() + 90
   while now() < t_end do
      local n, pid, word = beat(hb, k, r)
      if n and n >= steps and word == "beat" then return pid end
      if finished(job) then
         error(("the job ended before the fault in start %d:\n%s"):format(k,
               read_file(job.log) or ""))
      end
      sleep(0.02)
   end
   error(("no %d heartbeats from rank %d in start %d within 90 s:\n%s"):format(steps, r, k,
         read_file(job.log) or ""))
end

local function alive(pid)
   if ffi.C.kill(pid, 0) ~= 0 then return false end
   local st = read_file("/proc/" .. pid .. "/stat")
   return st ~= nil and st:match("^%d+ %(.*%) (%S)") ~= "Z"
end

-- the pids of the processes whose command line contains s (this spec's own work folder)
local function processes_now(s)
   local out = {}
   local p = io.popen("ls /proc")
   for name in p:lines() do
      if name:match("^%d+$") then
         local cmd = read_file("/proc/" .. name .. "/cmdline")
         if cmd and cmd:find(s, 1, true) and tonumber(name) ~= nil then
            out[#out + 1] = tonumber(name)
         end
      end
   end
   p:close()
   return out
end

-- the same, once the shells around a job that just ended are gone too (up to 5 s)
local function processes_with(s)
   local t_end = now() + 5
   local left = processes_now(s)
   while #left > 0 and now() < t_end do
      sleep(0.1)
      left = processes_now(s)
   end
   return left
end

-- flip 16 bytes near the end of a file (the tensor data of a safetensors file)
local function damage(path)
   local f = assert(io.open(path, "r+b"))
   local size = f:seek("end")
   f:seek("set", size - 80)
   local b = f:read(16)
   local flipped = {}
   for i = 1, #b do flipped[i] = string.char(255 - b:byte(i)) end
   f:seek("set", size - 80)
   f:write(table.concat(flipped))
   f:close()
end

-- max relative difference between two checkpoints' floating-point model tensors
local function max_rel_diff(a_path, b_path)
   local a = lm.load_checkpoint(a_path).model
   local b = lm.load_checkpoint(b_path).model
   local worst, identical, n = 0, true, 0
   for k, t in pairs(a) do
      local u = assert(b[k], "the fault run's checkpoint has no " .. k)
      if t:is_floating_point() then
         local t64, u64 = t:to(lm.float64), u:to(lm.float64)
         local d = (t64 - u64):abs():max():item()
         local m = t64:abs():max():item()
         if d ~= 0 then identical = false end
         worst = math.max(worst, d / math.max(m, 1e-30))
         n = n + 1
      else
         assert.is_true(t:eq(u):all():item(), k)
      end
   end
   return worst, identical, n
end

local LUMEN_RUN = "bin/lumen-run"

describe("lumen-run: a job that survives failures", function()
   teardown(function() os.execute("rm -rf " .. q(WORK)) end)

   local ref = WORK .. "/ref.ckpt"

   it("the reference: the same command without faults", function()
      local out, rc = run(("%s -np 2 -- %s --checkpoint %s"):format(LUMEN_RUN, TRAIN, q(ref)))
      assert.are.equal(0, rc, out)
      assert.is_nil(out:find("lumen-run:", 1, true), out)
      assert.are.equal(192, lm.load_checkpoint(ref).fields.step)
   end)

   it("two SIGKILLs (one with a damaged checkpoint) and a SIGSTOP: it finishes by itself, " ..
      "with the reference's parameters", function()
      local ck = WORK .. "/faults.ckpt"
      local hb = WORK .. "/hb.faults"
      local t0 = now()
      local job = start(("%s -np 2 --max-restarts 4 --watchdog %g --heartbeat-dir %s -- %s " ..
                         "--checkpoint %s"):format(LUMEN_RUN, WATCHDOG, q(hb), TRAIN, q(ck)),
                        "faults")
      local kinds = { "kill", "kill+damage", "stop" }
      for i = #kinds, 2, -1 do
         local j = math.random(i)
         kinds[i], kinds[j] = kinds[j], kinds[i]
      end
      local plan = {}
      for k = 0, 2 do
         -- a random rank after a random number of steps of this start (a start replays at
         -- most 3 steps; 3 starts of at most 40 steps leave the 192-step run unfinished)
         -- (about 5 heartbeats come before the first step; damaging needs two checkpoints)
         local fault = { kind = kinds[k + 1], rank = math.random(0, 1) }
         fault.steps = math.random(fault.kind == "kill+damage" and 24 or 10, 40)
         plan[#plan + 1] = fault
         local pid = wait_beats(job, hb, k, fault.rank, fault.steps)
         if fault.kind == "stop" then
            ffi.C.kill(pid, SIGSTOP)
         elseif fault.kind == "kill" then
            ffi.C.kill(pid, SIGKILL)
         else
            -- hold the launcher, kill the rank, wait for the job to be gone, damage the
            -- latest checkpoint, let the launcher restart: the restart must use .prev
            local launcher = processes_now("launcher.lua")
            local mine
            for _, p in ipairs(launcher) do
               if (read_file("/proc/" .. p .. "/cmdline") or ""):find(hb, 1, true) then
                  mine = p
               end
            end
            assert.is_not_nil(mine, "the launcher's process")
            ffi.C.kill(mine, SIGSTOP)
            ffi.C.kill(pid, SIGKILL)
            local other = select(2, beat(hb, k, 1 - fault.rank))
            local t_end = now() + 30
            while (alive(pid) or (other and alive(other))) and now() < t_end do sleep(0.05) end
            assert.is_false(alive(pid))
            assert.is_true(read_file(ck) ~= nil and read_file(ck .. ".prev") ~= nil,
                           "two checkpoints before the damage")
            damage(ck)
            ffi.C.kill(mine, SIGCONT)
         end
         print(("restart_launch: fault %d: %s on rank %d after %d heartbeats of start %d " ..
                "(%.1f s)"):format(k + 1, fault.kind, fault.rank, fault.steps, k, now() - t0))
      end
      local rc, out = wait_job(job, LIMIT)
      local dt = now() - t0
      print(("restart_launch: the job ended with status %s after %.1f s"):format(tostring(rc),
                                                                             dt))
      assert.are.equal(0, rc, out)
      -- one line per restart, each with its reason
      local lines = {}
      for l in out:gmatch("lumen%-run: [^\n]*") do lines[#lines + 1] = l end
      assert.are.equal(3, #lines, out)
      for k, fault in ipairs(plan) do
         local l = lines[k]
         assert.is_truthy(l:find(("restart %d of 4 (LUMEN_RESTART_COUNT=%d)"):format(k, k), 1,
                                 true), l)
         if fault.kind == "stop" then
            assert.is_truthy(l:find(("watchdog: rank %d %%(pid %%d+ on [^,]+, stopped%%) made " ..
                                     "no progress"):format(fault.rank)), l)
         else
            assert.is_truthy(l:find("the job failed: mpirun exited with status 137", 1, true), l)
         end
      end
      -- the damaged checkpoint was passed over for the one before
      assert.is_truthy(out:find(ck .. " cannot be used: '" .. ck .. "' is damaged", 1, true), out)
      assert.is_truthy(out:find("resuming from " .. ck .. ".prev", 1, true), out)
      assert.are.equal(3, select(2, out:gsub("resumed from", "")), out)
      -- nothing left behind
      assert.are.same({}, processes_with(ck))
      -- the reference's parameters
      assert.are.equal(192, lm.load_checkpoint(ck).fields.step)
      local diff, identical, n = max_rel_diff(ref, ck)
      print(("restart_launch: %d parameter tensors, max relative difference %.3g (%s)")
            :format(n, diff, identical and "bit-identical" or "not bit-identical"))
      assert.is_true(diff <= 1e-5, "max relative difference " .. diff)
   end)

   it("more failures than --max-restarts: non-zero, with every reason", function()
      local ck = WORK .. "/giveup.ckpt"
      local hb = WORK .. "/hb.giveup"
      local job = start(("%s -np 2 --max-restarts 1 --watchdog %g --heartbeat-dir %s -- %s " ..
                         "--checkpoint %s"):format(LUMEN_RUN, WATCHDOG, q(hb), TRAIN, q(ck)),
                        "giveup")
      for k = 0, 1 do
         local r = math.random(0, 1)
         ffi.C.kill(wait_beats(job, hb, k, r, math.random(6, 20)), SIGKILL)
      end
      local rc, out = wait_job(job, LIMIT)
      assert.are.equal(137, rc, out)
      assert.is_truthy(out:find("lumen%-run: the job failed: mpirun exited with status 137 " ..
                                "after [%d.]+ s; restart 1 of 1"), out)
      assert.is_truthy(out:find("lumen%-run: the job failed: mpirun exited with status 137 " ..
                                "after [%d.]+ s; no restart left %(%-%-max%-restarts 1%): " ..
                                "giving up with status 137"), out)
      assert.are.same({}, processes_with(ck))
   end)

   it("a checkpoint of another configuration: a clear error and no restart", function()
      local before = read_file(ref)
      local out, rc = run(("%s -np 2 --max-restarts 3 -- %s --seed 7 --checkpoint %s")
                          :format(LUMEN_RUN, TRAIN, q(ref)))
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find(ref .. " already holds the checkpoint of another " ..
                                "configuration:\n  --seed 7 (the checkpoint's run: 1)", 1, true),
                       out)
      assert.is_truthy(out:find("status 2 is the script refusing its input: no restart", 1,
                                true), out)
      assert.is_nil(out:find("restart 1 of", 1, true), out)
      assert.are.equal(before, read_file(ref))
      -- --resume with other flags names them, and is not restarted either
      out, rc = run(("%s -np 2 -- %s --seed 7 --resume --checkpoint %s")
                    :format(LUMEN_RUN, TRAIN, q(ref)))
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("--resume: " .. ref .. " is a run of another configuration", 1,
                                true), out)
   end)

   it("bad input: a missing script, -np 0, a bad hostfile", function()
      local out, rc = run(LUMEN_RUN .. " -np 2 -- " .. q(WORK .. "/missing.lua"))
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("lumen-run: the script " .. WORK .. "/missing.lua does not " ..
                                "exist or cannot be read", 1, true), out)
      out, rc = run(LUMEN_RUN .. " -np 0 -- " .. TRAIN)
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("lumen-run: -np needs a positive whole number of processes, " ..
                                "got '0'", 1, true), out)
      out, rc = run(LUMEN_RUN .. " -np 2 --hostfile " .. q(WORK .. "/nohosts") .. " -- " .. TRAIN)
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("lumen-run: cannot read the hostfile " .. WORK .. "/nohosts", 1,
                                true), out)
      local f = assert(io.open(WORK .. "/hosts", "w"))
      f:write("# two machines\nlocalhost slots=1\nnode2 slots=two\n")
      f:close()
      out, rc = run(LUMEN_RUN .. " -np 2 --hostfile " .. q(WORK .. "/hosts") .. " -- " .. TRAIN)
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("hostfile " .. WORK .. "/hosts, line 3: slots needs a positive " ..
                                "whole number, got 'two'", 1, true), out)
   end)
end)
