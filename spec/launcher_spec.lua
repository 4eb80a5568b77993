-- spec/launcher_spec.lua -- bin/lumen-run (lua/lumen/launcher.lua) without MPI: its arguments,
-- the hostfile check, the mpirun command it builds, lm.distributed.restart_count() and
-- heartbeat(), and its restarts, watchdog and clean-up driven through a stand-in for mpirun
-- (LUMEN_MPIRUN: a shell script that starts -np copies of the command, as mpirun does on one
-- machine). The real thing, on Open MPI, is spec/mpi/restart_launch.lua (make test-mpi).
local launcher = require("lumen.launcher")
local ffi = require("ffi")

pcall(ffi.cdef, "int kill(int pid, int sig);")
pcall(ffi.cdef, "int usleep(unsigned int usec);")

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function read_file(path)
   local f = io.open(path, "rb")
   if not f then return nil end
   local s = f:read("*a")
   f:close()
   return s
end

local function write_file(path, text)
   local f = assert(io.open(path, "wb"))
   f:write(text)
   f:close()
end

local WORK = os.tmpname()
os.remove(WORK)
os.execute("mkdir -p " .. q(WORK))

local function sh(cmd)
   local p = assert(io.popen("timeout 60 " .. cmd .. " 2>&1; echo \"rc=$?\""))
   local out = p:read("*a")
   p:close()
   return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- a stand-in for mpirun: skips its options (-np K, -x VAR, --flags), then starts K copies of
-- the rest with OMPI_COMM_WORLD_RANK set, and fails with the first failure's status
local FAKE = WORK .. "/fake-mpirun"
write_file(FAKE, [[
np=1
while [ $# -gt 0 ]; do
   case "$1" in
      -np) np=$2; shift 2 ;;
      -x) shift 2 ;;
      --*) shift ;;
      *) break ;;
   esac
done
pids=
r=0
while [ $r -lt $np ]; do
   OMPI_COMM_WORLD_RANK=$r "$@" &
   pids="$pids $!"
   r=$((r + 1))
done
st=0
for p in $pids; do wait $p || { s=$?; [ $st -eq 0 ] && st=$s; }; done
exit $st
]])
local RUN = "env LUMEN_MPIRUN=" .. q("sh " .. FAKE) .. " bin/lumen-run "

local function script(name, text)
   local path = WORK .. "/" .. name .. ".lua"
   write_file(path, 'local lm = require("lumen")\n' .. text)
   return path
end

local function alive(pid)
   if ffi.C.kill(pid, 0) ~= 0 then return false end
   local st = read_file("/proc/" .. pid .. "/stat")
   return st ~= nil and st:match("^%d+ %(.*%) (%S)") ~= "Z"
end

describe("lumen-run's arguments", function()
   local good = script("ok", "print('ok')\n")

   local function parse(...)
      return launcher.parse({ ... })
   end

   it("takes -np, --hostfile, --max-restarts, --watchdog, --mpirun-arg and the script", function()
      local hosts = WORK .. "/hosts"
      write_file(hosts, "# two machines\nnode1 slots=2\nnode2 slots=2 max_slots=4  # spare\n\n")
      local o = assert(parse("-np", "4", "--hostfile", hosts, "--max-restarts", "2",
                             "--watchdog", "30", "--mpirun-arg", "--mca",
                             "--mpirun-arg", "btl_tcp_if_include", "--mpirun-arg", "eth0", "--",
                             good, "--distributed", "--epochs", "2"))
      assert.are.equal(4, o.np)
      assert.are.equal(2, o.max_restarts)
      assert.are.equal(30, o.watchdog)
      assert.are.equal(120, o.startup_timeout)       -- 120 s, or the watchdog when larger
      assert.are.same({ { host = "node1", slots = 2 }, { host = "node2", slots = 2,
                                                         max_slots = 4 } }, o.hosts)
      assert.are.same({ "--distributed", "--epochs", "2" }, o.args)
      local argv = launcher.mpirun_argv(o)
      local line = table.concat(argv, " ")
      assert.is_truthy(line:find("-np 4 --hostfile " .. hosts .. " -x LUMEN_RESTART_COUNT -x " ..
                                 "LUMEN_HEARTBEAT_DIR -x LUMEN_RUN_ID --mca btl_tcp_if_include " ..
                                 "eth0 ", 1, true), line)
      assert.are.equal(good, argv[#argv - 3])
      assert.are.equal("2", argv[#argv])
      -- defaults: 3 restarts, no watchdog; --flag=value works too
      o = assert(parse("--np=2", good))
      assert.are.equal(3, o.max_restarts)
      assert.are.equal(0, o.watchdog)
      o = assert(parse("-np", "2", "--watchdog", "200", good))
      assert.are.equal(200, o.startup_timeout)
   end)

   it("refuses bad input with a clear message", function()
      local cases = {
         { { good }, "-np K is required" },
         { { "-np", "0", good }, "-np needs a positive whole number of processes, got '0'" },
         { { "-np", "two", good }, "got 'two'" },
         { { "-np", "2" }, "no script" },
         { { "-np", "2", "--", WORK .. "/missing.lua" }, "the script " .. WORK ..
           "/missing.lua does not exist or cannot be read" },
         { { "-np", "2", "--max-restarts", "-1", good }, "--max-restarts needs a whole number" },
         { { "-np", "2", "--watchdog", "soon", good }, "--watchdog needs a number of seconds" },
         { { "-np", "2", "--watchdog" }, "--watchdog needs a value" },
         { { "-np", "2", "--frobnicate", good }, "unknown option '--frobnicate'" },
         { { "-np", "2", "--hostfile", WORK .. "/none", good }, "cannot read the hostfile" },
      }
      for _, c in ipairs(cases) do
         local o, err = parse(unpack(c[1]))
         assert.is_nil(o)
         assert.is_truthy(err:find(c[2], 1, true), err)
      end
      local bad = {
         { "", "names no host" },
         { "# only a comment\n", "names no host" },
         { "node1 slots=0\n", "line 1: slots needs a positive whole number, got '0'" },
         { "node1\nnode2 cpus=4\n", "line 2: unknown 'cpus=4'" },
         { "slots=2\n", "line 1: 'slots=2' is not a host name" },
         { "node1 slots=4 max_slots=2\n", "max_slots=2 is below slots=4" },
      }
      for i, c in ipairs(bad) do
         local path = WORK .. "/bad" .. i
         write_file(path, c[1])
         local hosts, err = launcher.read_hostfile(path)
         assert.is_nil(hosts)
         assert.is_truthy(err:find(c[2], 1, true), err)
      end
   end)

   it("the command: -h, bad input (status 2), --dry-run", function()
      local out, rc = sh("bin/lumen-run -h")
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("usage: lumen-run -np K", 1, true), out)
      assert.is_truthy(out:find("--max-restarts N", 1, true), out)
      out, rc = sh("bin/lumen-run -np 0 -- " .. good)
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("lumen-run: -np needs a positive whole number", 1, true), out)
      out, rc = sh("env LUMEN_MPIRUN='mpirun --mca x y' bin/lumen-run -np 2 --dry-run -- " ..
                   good .. " a")
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("^mpirun %-%-mca x y %-np 2 %-x LUMEN_RESTART_COUNT"), out)
      assert.is_truthy(out:find("/bin/lumen " .. good .. " a\n", 1, true), out)
      -- without LUMEN_MPIRUN: the flags mpirun needs (as root, more ranks than cores)
      out = sh("env -u LUMEN_MPIRUN bin/lumen-run -np 2 --dry-run -- " .. good)
      assert.is_truthy(out:find("^mpirun .*%-%-oversubscribe %-np 2"), out)
   end)
end)

describe("lm.distributed.restart_count and heartbeat", function()
   it("are 0 and a no-op outside lumen-run", function()
      local out, rc = sh("env -u LUMEN_RESTART_COUNT -u LUMEN_HEARTBEAT_DIR bin/lumen -e " ..
                         q("lm.distributed.heartbeat(); print('count', " ..
                           "lm.distributed.restart_count())"))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("count\t0", 1, true), out)
      out = sh("env LUMEN_RESTART_COUNT=x bin/lumen -e " ..
               q("print('count', lm.distributed.restart_count())"))
      assert.is_truthy(out:find("count\t0", 1, true), out)
   end)

   it("under lumen-run: the restart count, and rank.R rewritten at every heartbeat", function()
      local dir = WORK .. "/hb"
      os.execute("mkdir -p " .. q(dir))
      local out, rc = sh("env LUMEN_RESTART_COUNT=2 LUMEN_HEARTBEAT_DIR=" .. q(dir) ..
                         " OMPI_COMM_WORLD_RANK=3 bin/lumen -e " ..
                         q("local d = lm.distributed; d.heartbeat(); d.heartbeat(); " ..
                           "local f = io.open('" .. dir .. "/rank.3'); print(f:read('*l')); " ..
                           "print('count', d.restart_count())"))
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("count\t2", 1, true), out)
      assert.is_truthy(out:find("beat            2 pid %d+ host %S+"), out)
      -- a successful exit marks the rank finished: the watchdog stops watching it
      assert.is_truthy(read_file(dir .. "/rank.3"):find("^done            3 pid %d+"),
                       read_file(dir .. "/rank.3"))
   end)
end)

describe("lumen-run's restarts (a stand-in for mpirun)", function()
   it("restarts a failed job with LUMEN_RESTART_COUNT and exits 0 when a start succeeds",
      function()
      local s = script("flaky", [[
local n = lm.distributed.restart_count()
io.write(("rank %s start %d\n"):format(os.getenv("OMPI_COMM_WORLD_RANK"), n))
if n < 2 and os.getenv("OMPI_COMM_WORLD_RANK") == "1" then os.exit(3) end
]])
      local out, rc = sh(RUN .. "-np 2 -- " .. s)
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("lumen%-run: the job failed: mpirun exited with status 3 after " ..
                                "[%d.]+ s; restart 1 of 3 %(LUMEN_RESTART_COUNT=1%)"), out)
      assert.is_truthy(out:find("restart 2 of 3 (LUMEN_RESTART_COUNT=2)", 1, true), out)
      assert.is_nil(out:find("restart 3 of", 1, true), out)
      assert.is_truthy(out:find("rank 0 start 2", 1, true), out)
   end)

   it("gives up after --max-restarts with the last status; status 2 is not restarted",
      function()
      local s = script("always", "os.exit(5)\n")
      local out, rc = sh(RUN .. "-np 2 --max-restarts 1 -- " .. s)
      assert.are.equal(5, rc, out)
      assert.is_truthy(out:find("restart 1 of 1", 1, true), out)
      assert.is_truthy(out:find("no restart left (--max-restarts 1): giving up with status 5",
                                1, true), out)
      s = script("usage", "os.exit(2)\n")
      out, rc = sh(RUN .. "-np 2 --max-restarts 3 -- " .. s)
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("status 2 is the script refusing its input: no restart", 1,
                                true), out)
      assert.is_nil(out:find("restart 1 of", 1, true), out)
   end)

   it("the watchdog ends a stopped rank's job, then restarts it", function()
      local s = script("stops", [[
local ffi = require("ffi")
pcall(ffi.cdef, "int kill(int pid, int sig); int getpid(void);")
local d = lm.distributed
for i = 1, 5 do d.heartbeat() end
if d.restart_count() == 0 and os.getenv("OMPI_COMM_WORLD_RANK") == "1" then
   ffi.C.kill(ffi.C.getpid(), 19)
end
]])
      local out, rc = sh(RUN .. "-np 2 --watchdog 1 -- " .. s)
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("lumen%-run: watchdog: rank 1 %(pid %d+ on [^,]+, stopped%) " ..
                                "made no progress for [%d.]+ s %(%-%-watchdog 1; silent ranks: " ..
                                "1%); the job was ended %(mpirun [^)]+%); restart 1 of 3"), out)
   end)

   it("a rank without a first heartbeat: --startup-timeout", function()
      local s = script("silent", "os.execute('sleep 30')\n")
      local t0 = os.time()
      local out, rc = sh(RUN .. "-np 1 --watchdog 1 --startup-timeout 1 --max-restarts 0 -- " .. s)
      assert.are_not.equal(0, rc, out)
      assert.is_truthy(out:find("lumen-run: watchdog: rank 0 sent no heartbeat within 1 s of " ..
                                "the start (--startup-timeout 1)", 1, true), out)
      assert.is_true(os.time() - t0 < 20, out)
   end)

   it("leaves no process behind: an orphan of the job and SIGTERM to the launcher", function()
      local pidfile = WORK .. "/orphan.pid"
      local s = script("orphan", ([[
os.execute("sleep 300 > /dev/null 2>&1 & echo $! > %s")
os.exit(1)
]]):format(pidfile))
      local out, rc = sh(RUN .. "-np 1 --max-restarts 0 -- " .. s)
      assert.are.equal(1, rc, out)
      local pid = tonumber(read_file(pidfile))
      assert.is_number(pid)
      assert.is_false(alive(pid), "the orphaned sleep " .. pid .. " is still running")
      -- SIGTERM to the launcher: the job is ended, no restart, status 143
      local long = script("long", ([[
os.execute("sleep 300 > /dev/null 2>&1 & echo $! > %s.2")
lm.distributed.heartbeat()
os.execute("sleep 300")
]]):format(pidfile))
      local log = WORK .. "/term.log"
      os.execute(RUN .. "-np 2 --max-restarts 3 -- " .. long .. " > " .. q(log) ..
                 " 2>&1 & echo $! > " .. q(WORK .. "/launcher.pid"))
      local lpid = tonumber(read_file(WORK .. "/launcher.pid"))
      local t_end = os.time() + 30
      while read_file(pidfile .. ".2") == nil and os.time() < t_end do ffi.C.usleep(50000) end
      ffi.C.usleep(200000)
      local orphan = tonumber(read_file(pidfile .. ".2"))
      assert.is_number(orphan)
      ffi.C.kill(lpid, 15)
      while alive(lpid) and os.time() < t_end do ffi.C.usleep(50000) end
      assert.is_false(alive(lpid))
      assert.is_false(alive(orphan))
      local text = read_file(log)
      assert.is_truthy(text:find("lumen-run: interrupted (signal 15): the job was ended; no " ..
                                 "restart", 1, true), text)
   end)

   teardown(function() os.execute("rm -rf " .. q(WORK)) end)
end)
