-- lumen.launcher -- the `lumen-run` command (bin/lumen-run): an MPI job that survives a lost or
-- stuck process. It starts `mpirun -np K bin/lumen SCRIPT ARGS...`; when the job fails (mpirun
-- ends with a non-zero status, or the watchdog finds a rank that made no progress) it ends every
-- process of the job and starts it again, up to --max-restarts times, with LUMEN_RESTART_COUNT
-- (0, 1, 2, ...) in the ranks' environment. A script resumes from its last checkpoint when
-- lm.distributed.restart_count() > 0 (examples/train.lua does; docs/distributed.md, "Surviving
-- failures").
--
--    lumen-run -np K [--hostfile F] [--max-restarts N] [--watchdog SECONDS]
--              [--startup-timeout SECONDS] [--heartbeat-dir DIR] [--mpirun-arg ARG]...
--              [--dry-run] -- SCRIPT ARGS...
--
-- The watchdog: every rank's lm.distributed.heartbeat() rewrites a small file, rank.R, in the
-- folder LUMEN_HEARTBEAT_DIR names (a fresh one per start, under --heartbeat-dir); the launcher
-- reads them four times a second, and a rank whose file has not changed for --watchdog seconds
-- (stopped, stuck in a collective, deadlocked) ends the job. Before a rank's first heartbeat it
-- is given --startup-timeout seconds from the start (default 120, or --watchdog when larger):
-- MPI's start, loading the data, building the model and reading a checkpoint all come first.
-- lm.distributed.finalize() marks the rank finished: it is not watched any more, and when every
-- rank has finished, mpirun has --watchdog seconds to exit.
--
-- Ending a job (a failure, the watchdog, Ctrl-C): the launcher is a child subreaper
-- (prctl(PR_SET_CHILD_SUBREAPER)), so every process the job started stays below it even when
-- its parent dies. It sends SIGKILL to every process below mpirun (the ranks; Open MPI puts each
-- in its own process group, so a process-group kill would miss them), gives mpirun 10 s to tear
-- down ranks on other machines, then SIGKILLs whatever is left below itself, SIGCONT first to
-- stopped ones, until nothing is left: no orphans.
--
-- Exit status: 0 when a start succeeded; 2 for bad arguments (no restart either when the job
-- itself ends with status 2: the script refused its flags or its checkpoint, which a restart
-- would not change); else the last failure's status (mpirun's, 128 + the signal for a signal).
-- Every failure prints one line "lumen-run: ..." on stderr with its reason.
--
-- Runs under plain LuaJIT (no tensor library needed): bin/lumen-run starts it; as a module,
-- require("lumen.launcher") gives { main = fn(argv) -> status, parse = fn(argv) -> opts or nil,
-- err, read_hostfile = fn(path) -> hosts or nil, err, mpirun_argv = fn(opts) -> array }.

local ffi = require("ffi")
local bit = require("bit")

local M = {}

local function cdef(src) pcall(ffi.cdef, src) end
cdef("int getpid(void);")
cdef("int kill(int pid, int sig);")
cdef("int fork(void);")
cdef("int setpgid(int pid, int pgid);")
cdef("int execvp(const char *file, char *const argv[]);")
cdef("void _exit(int status);")
cdef("int waitpid(int pid, int *status, int options);")
cdef("int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, " ..
     "unsigned long a5);")
cdef("typedef struct { unsigned long val[16]; } lm_run_sigset;")
cdef("int sigemptyset(lm_run_sigset *set);")
cdef("int sigaddset(lm_run_sigset *set, int sig);")
cdef("int sigprocmask(int how, const lm_run_sigset *set, lm_run_sigset *old);")
cdef("typedef struct { long tv_sec; long tv_nsec; } lm_run_timespec;")
cdef("int sigtimedwait(const lm_run_sigset *set, void *info, const lm_run_timespec *timeout);")
cdef("int clock_gettime(int clk, lm_run_timespec *ts);")
cdef("int open(const char *path, int flags, ...);")
cdef("int dup2(int oldfd, int newfd);")
cdef("int close(int fd);")
cdef("int setenv(const char *name, const char *value, int overwrite);")
cdef("char *mkdtemp(char *template);")
cdef("int geteuid(void);")
cdef("char *strerror(int errnum);")
cdef("int unlink(const char *path);")
cdef("int rmdir(const char *path);")
-- glibc's sigset_t (1024 bits) and struct dirent on 64-bit Linux (x86_64, aarch64)
cdef("typedef struct lm_run_DIR lm_run_DIR;")
cdef([[typedef struct { uint64_t d_ino; int64_t d_off; unsigned short d_reclen;
        unsigned char d_type; char d_name[256]; } lm_run_dirent;]])
cdef("lm_run_DIR *opendir(const char *name);")
cdef("lm_run_dirent *readdir(lm_run_DIR *dir);")
cdef("int closedir(lm_run_DIR *dir);")

local C = ffi.C
local SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGCHLD, SIGCONT = 1, 2, 9, 15, 17, 18
local WNOHANG = 1
local SIG_BLOCK, SIG_SETMASK = 0, 2
local PR_SET_CHILD_SUBREAPER = 36
local CLOCK_MONOTONIC = 1
local POLL = 0.25             -- seconds between two looks at the heartbeats
local GRACE = 10              -- seconds mpirun gets to end the other machines' ranks
M.DEFAULT_MAX_RESTARTS = 3
M.DEFAULT_STARTUP_TIMEOUT = 120

local USAGE = [[
usage: lumen-run -np K [--hostfile F] [--max-restarts N] [--watchdog SECONDS]
                 [--startup-timeout SECONDS] [--heartbeat-dir DIR] [--mpirun-arg ARG]...
                 [--dry-run] -- SCRIPT ARGS...]]

local HELP = USAGE .. [[


Start SCRIPT on K processes with mpirun (bin/lumen SCRIPT ARGS on every rank) and restart the
job when it fails, so that a lost or stuck process does not need a person. The script resumes
from its checkpoint when lm.distributed.restart_count() > 0 (examples/train.lua --distributed
--save-every N does); docs/distributed.md, "Surviving failures".

  -np K                  processes (ranks) to start (-n K, --np K)
  --hostfile F           Open MPI hostfile: one "host [slots=N] [max_slots=N]" per line
  --max-restarts N       restarts after a failure before giving up (default 3)
  --watchdog SECONDS     end and restart the job when a rank makes no progress (calls no
                         lm.distributed.heartbeat()) for SECONDS; 0: no watchdog (default)
  --startup-timeout S    with --watchdog: the time a rank has from the start until its first
                         heartbeat (default 120, or --watchdog when larger)
  --heartbeat-dir DIR    where the ranks write their heartbeats (a folder every rank can
                         write: a shared file system across machines); default: a new folder
                         under $TMPDIR or /tmp, removed at the end
  --mpirun-arg ARG       one more argument for mpirun (repeat it: --mpirun-arg --mca
                         --mpirun-arg btl_tcp_if_include --mpirun-arg eth0)
  --dry-run              print the mpirun command of the first start and exit
  -h, --help             this text

Every start gets LUMEN_RESTART_COUNT (0 for the first, as torchrun's), LUMEN_HEARTBEAT_DIR and
LUMEN_RUN_ID (the same for every start of this launcher) in its environment, also on other
machines (mpirun -x). The mpirun command is "mpirun --oversubscribe" (plus --allow-run-as-root
as root), or the words of $LUMEN_MPIRUN. The ranks run $LUMEN_RUN_LUMEN (bin/lumen beside
bin/lumen-run). Standard input is /dev/null (a restarted job could not read it again).

A failure (mpirun's status is not 0, or the watchdog fired) prints one line on stderr, then every
process of the job is ended (SIGKILL; nothing is left behind) and the job starts again. A job that
ends with status 2 (the script refused its flags or its checkpoint) is not restarted.
Exit status: 0 when a start succeeded; 2 for bad arguments; else the last failure's status.]]
M.HELP = HELP

local function now()
   local ts = ffi.new("lm_run_timespec")
   C.clock_gettime(CLOCK_MONOTONIC, ts)
   return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function errno_str()
   return ffi.string(C.strerror(ffi.errno()))
end

local function say(fmt, ...)
   io.stderr:write("lumen-run: ", string.format(fmt, ...), "\n")
   io.stderr:flush()
end

---------------------------------------------------------------------------------------------
-- arguments
---------------------------------------------------------------------------------------------

local function is_whole(s)
   return type(s) == "string" and s:match("^%d+$") ~= nil
end

local function is_seconds(s)
   local n = tonumber(s)
   return type(s) == "string" and s:match("^[%d.]+$") ~= nil and n ~= nil and n >= 0 and
      n < 1e9
end

--- read_hostfile(path) -> array of {host =, slots =} or nil, why. Open MPI's syntax: one host
--- per line, optionally followed by slots=N and max_slots=N (max-slots=N); # starts a comment.
function M.read_hostfile(path)
   local f, err = io.open(path, "r")
   if not f then return nil, ("cannot read the hostfile %s (%s)"):format(path, tostring(err)) end
   local text = f:read("*a") or ""
   f:close()
   local hosts = {}
   local n = 0
   for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      line = line:gsub("#.*$", "")
      local words = {}
      for w in line:gmatch("%S+") do words[#words + 1] = w end
      if #words > 0 then
         local host = words[1]
         if not host:match("^[%w][%w%.%-_:%[%]]*$") or host:find("=", 1, true) then
            return nil, ("hostfile %s, line %d: '%s' is not a host name"):format(path, n, host)
         end
         local h = { host = host, slots = 1 }
         for i = 2, #words do
            local k, v = words[i]:match("^([%w_%-]+)=(.*)$")
            if k == "max-slots" then k = "max_slots" end
            if k ~= "slots" and k ~= "max_slots" then
               return nil, ("hostfile %s, line %d: unknown '%s' (a line is \"host " ..
                            "[slots=N] [max_slots=N]\")"):format(path, n, words[i])
            end
            if not is_whole(v) or tonumber(v) < 1 then
               return nil, ("hostfile %s, line %d: %s needs a positive whole number, got '%s'")
                  :format(path, n, k, v)
            end
            h[k] = tonumber(v)
         end
         if h.max_slots and h.max_slots < h.slots then
            return nil, ("hostfile %s, line %d: max_slots=%d is below slots=%d")
               :format(path, n, h.max_slots, h.slots)
         end
         hosts[#hosts + 1] = h
      end
   end
   if #hosts == 0 then return nil, ("hostfile %s names no host"):format(path) end
   return hosts
end

--- parse(argv) -> opts or nil, why, help (help = true: -h was given)
function M.parse(argv)
   local o = { np = nil, hostfile = nil, max_restarts = M.DEFAULT_MAX_RESTARTS, watchdog = 0,
               startup_timeout = nil, heartbeat_dir = nil, mpirun_args = {}, dry_run = false,
               script = nil, args = {} }
   local i = 1
   local function value(flag)
      local v = argv[i + 1]
      if v == nil then return nil, flag .. " needs a value" end
      i = i + 2
      return v
   end
   while i <= #argv do
      local a = argv[i]
      local flag, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
      if flag then
         a = flag
         table.insert(argv, i + 1, inline)
      end
      local v, err
      if a == "--" then
         i = i + 1
         break
      elseif a == "-h" or a == "--help" then
         return nil, nil, true
      elseif a == "-np" or a == "-n" or a == "--np" then
         v, err = value(a)
         if not v then return nil, err end
         if not is_whole(v) or tonumber(v) < 1 then
            return nil, ("%s needs a positive whole number of processes, got '%s'"):format(a, v)
         end
         o.np = tonumber(v)
      elseif a == "--hostfile" or a == "--machinefile" then
         v, err = value(a)
         if not v then return nil, err end
         o.hostfile = v
      elseif a == "--max-restarts" then
         v, err = value(a)
         if not v then return nil, err end
         if not is_whole(v) then
            return nil, ("--max-restarts needs a whole number (0 or more), got '%s'"):format(v)
         end
         o.max_restarts = tonumber(v)
      elseif a == "--watchdog" or a == "--startup-timeout" then
         v, err = value(a)
         if not v then return nil, err end
         if not is_seconds(v) then
            return nil, ("%s needs a number of seconds (0 or more), got '%s'"):format(a, v)
         end
         if a == "--watchdog" then o.watchdog = tonumber(v) else o.startup_timeout = tonumber(v) end
      elseif a == "--heartbeat-dir" then
         v, err = value(a)
         if not v then return nil, err end
         o.heartbeat_dir = v
      elseif a == "--mpirun-arg" then
         v, err = value(a)
         if not v then return nil, err end
         o.mpirun_args[#o.mpirun_args + 1] = v
      elseif a == "--dry-run" then
         o.dry_run = true
         i = i + 1
      elseif a:sub(1, 1) == "-" then
         return nil, ("unknown option '%s' (lumen-run -h lists them; mpirun's own options go " ..
                      "through --mpirun-arg)"):format(a)
      else
         break
      end
   end
   o.script = argv[i]
   for k = i + 1, #argv do o.args[#o.args + 1] = argv[k] end
   if o.np == nil then return nil, "-np K is required (the number of processes)" end
   if o.script == nil then return nil, "no script: lumen-run ... -- SCRIPT ARGS..." end
   local f = io.open(o.script, "r")
   if not f then
      return nil, ("the script %s does not exist or cannot be read"):format(o.script)
   end
   f:close()
   if o.hostfile then
      local hosts, herr = M.read_hostfile(o.hostfile)
      if not hosts then return nil, herr end
      o.hosts = hosts
   end
   if o.startup_timeout == nil then
      o.startup_timeout = math.max(M.DEFAULT_STARTUP_TIMEOUT, o.watchdog)
   end
   return o
end

local function split_words(s)
   local w = {}
   for x in s:gmatch("%S+") do w[#w + 1] = x end
   return w
end

--- mpirun_argv(opts) -> the command of one start (an array of words)
function M.mpirun_argv(o)
   local cmd
   local env = os.getenv("LUMEN_MPIRUN")
   if env and env:match("%S") then
      cmd = split_words(env)
   else
      cmd = { "mpirun" }
      if C.geteuid() == 0 then cmd[#cmd + 1] = "--allow-run-as-root" end
      cmd[#cmd + 1] = "--oversubscribe"
   end
   local function add(...)
      for k = 1, select("#", ...) do cmd[#cmd + 1] = select(k, ...) end
   end
   add("-np", tostring(o.np))
   if o.hostfile then add("--hostfile", o.hostfile) end
   add("-x", "LUMEN_RESTART_COUNT", "-x", "LUMEN_HEARTBEAT_DIR", "-x", "LUMEN_RUN_ID")
   for _, a in ipairs(o.mpirun_args) do add(a) end
   local lumen = os.getenv("LUMEN_RUN_LUMEN")
   add(lumen and lumen ~= "" and lumen or "lumen", o.script)
   for _, a in ipairs(o.args) do add(a) end
   return cmd
end

-- a word for a shell command line (for messages)
local function shell_word(s)
   if s:match("^[%w%-%._/=:,+@]+$") then return s end
   return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function on_path(prog)
   if prog:find("/", 1, true) then return io.open(prog, "r") ~= nil end
   for dir in (os.getenv("PATH") or ""):gmatch("[^:]+") do
      local f = io.open(dir .. "/" .. prog, "r")
      if f then f:close(); return true end
   end
   return false
end

---------------------------------------------------------------------------------------------
-- processes
---------------------------------------------------------------------------------------------

local mask = ffi.new("lm_run_sigset")
local old_mask = ffi.new("lm_run_sigset")

-- spawn(argv) -> pid: fork, then in the child: the launcher's signal mask undone, a process group
-- of its own (Ctrl-C reaches the launcher, which ends the job), stdin from /dev/null, exec
local function spawn(argv)
   local n = #argv
   local cargv = ffi.new("char *[?]", n + 1)
   local keep = {}
   for k = 1, n do
      keep[k] = ffi.new("char[?]", #argv[k] + 1, argv[k])
      cargv[k - 1] = keep[k]
   end
   cargv[n] = nil
   local devnull = "/dev/null"
   io.stdout:flush()
   io.stderr:flush()
   local pid = C.fork()
   if pid < 0 then return nil, "fork: " .. errno_str() end
   if pid == 0 then
      C.sigprocmask(SIG_SETMASK, old_mask, nil)
      C.setpgid(0, 0)
      local fd = C.open(devnull, 0)
      if fd >= 0 then C.dup2(fd, 0); C.close(fd) end
      C.execvp(cargv[0], cargv)
      io.stderr:write("lumen-run: cannot start ", argv[1], ": ", errno_str(), "\n")
      io.stderr:flush()
      C._exit(127)
   end
   M._argv_strings = keep -- (the strings stay alive while the child execs)
   return pid
end

-- the status waitpid gave -> a shell-style exit status, and words for it
local function decode_status(st)
   local sig = bit.band(st, 0x7f)
   if sig == 0 then
      local code = bit.band(bit.rshift(st, 8), 0xff)
      return code, "exited with status " .. code
   end
   return 128 + sig, "was killed by signal " .. sig
end

-- every process: pid -> {ppid =, state =} (from /proc/PID/stat)
local function processes()
   local list = {}
   local d = C.opendir("/proc")
   if d == nil then return list end
   while true do
      local e = C.readdir(d)
      if e == nil then break end
      local name = ffi.string(e.d_name)
      if name:match("^%d+$") then
         local f = io.open("/proc/" .. name .. "/stat", "r")
         if f then
            local s = f:read("*a") or ""
            f:close()
            -- pid (comm) state ppid ...: comm may hold spaces and parentheses
            local state, ppid = s:match("^%d+ %(.*%) (%S) (%d+)")
            if state then list[tonumber(name)] = { ppid = tonumber(ppid), state = state } end
         end
      end
   end
   C.closedir(d)
   return list
end

-- the processes below root (not root), with their states
local function descendants(root)
   local list = processes()
   local children = {}
   for pid, p in pairs(list) do
      local c = children[p.ppid]
      if not c then c = {}; children[p.ppid] = c end
      c[#c + 1] = pid
   end
   local out = {}
   local queue, qi = { root }, 1
   while qi <= #queue do
      local p = queue[qi]
      qi = qi + 1
      for _, c in ipairs(children[p] or {}) do
         out[#out + 1] = { pid = c, state = list[c].state }
         queue[#queue + 1] = c
      end
   end
   return out
end
M._descendants = descendants

local status_buf = ffi.new("int[1]")

-- reap every child that has ended; returns mpirun's status when it was one of them
local function reap(mpirun)
   local got
   while true do
      local pid = C.waitpid(-1, status_buf, WNOHANG)
      if pid <= 0 then break end
      if pid == mpirun then got = status_buf[0] end
   end
   return got
end

local wait_ts = ffi.new("lm_run_timespec")
-- wait for a signal (SIGCHLD, SIGINT, ...) or seconds; returns the signal number or nil
local function wait_signal(seconds)
   wait_ts.tv_sec = math.floor(seconds)
   wait_ts.tv_nsec = math.floor((seconds % 1) * 1e9)
   local s = C.sigtimedwait(mask, nil, wait_ts)
   if s > 0 then return s end
   return nil
end

local interrupted -- the signal that asked the launcher to stop (SIGINT, SIGTERM, SIGHUP)

-- end the job: SIGKILL below mpirun, GRACE seconds for mpirun to go, then SIGKILL everything
-- below the launcher (SIGCONT to stopped ones) until nothing is left. Returns mpirun's status
-- when it was reaped here.
local function end_job(mpirun, mpirun_status)
   local me = C.getpid()
   if mpirun_status == nil then
      for _, p in ipairs(descendants(mpirun)) do
         C.kill(p.pid, SIGKILL)
         if p.state == "T" or p.state == "t" then C.kill(p.pid, SIGCONT) end
      end
      local t_end = now() + GRACE
      while mpirun_status == nil and now() < t_end do
         local s = wait_signal(0.1)
         if s == SIGINT or s == SIGTERM or s == SIGHUP then interrupted = interrupted or s end
         mpirun_status = reap(mpirun)
      end
   end
   local t_end = now() + 30
   while true do
      local st = reap(mpirun)
      if st then mpirun_status = st end
      local left = {}
      for _, p in ipairs(descendants(me)) do
         if p.state ~= "Z" and p.state ~= "X" then left[#left + 1] = p end
      end
      if #left == 0 and (mpirun_status ~= nil or #descendants(me) == 0) then break end
      for _, p in ipairs(left) do
         C.kill(p.pid, SIGKILL)
         if p.state == "T" or p.state == "t" then C.kill(p.pid, SIGCONT) end
      end
      if now() > t_end then
         say("warning: processes still left after 30 s: %d", #left)
         break
      end
      wait_signal(0.05)
   end
   return mpirun_status
end

---------------------------------------------------------------------------------------------
-- the heartbeats
---------------------------------------------------------------------------------------------

local function read_file(path)
   local f = io.open(path, "rb")
   if not f then return nil end
   local s = f:read("*a")
   f:close()
   return s
end

cdef("int gethostname(char *name, size_t len);")
local host_name
local function hostname()
   if not host_name then
      local b = ffi.new("char[256]")
      host_name = C.gethostname(b, 255) == 0 and ffi.string(b):gsub("%s", "_") or "?"
   end
   return host_name
end

-- the watchdog of one start: check() -> nil, or the reason the job must end
local function watchdog(o, dir, t_start)
   local seen, last, content, done = {}, {}, {}, {}
   local all_done_at
   return function(t)
      local ndone = 0
      for r = 0, o.np - 1 do
         local s = read_file(dir .. "/rank." .. r)
         if s and s ~= "" and s ~= content[r] then
            content[r] = s
            seen[r] = true
            last[r] = t
            if s:match("^done") then done[r] = true end
         end
         if done[r] then ndone = ndone + 1 end
      end
      if ndone == o.np then
         all_done_at = all_done_at or t
         if t - all_done_at > o.watchdog then
            return ("watchdog: every rank finished (lm.distributed.finalize) but the job did " ..
                    "not end within %g s"):format(o.watchdog)
         end
         return nil
      end
      -- the silent ranks: a stopped one is named (the others then wait for it in a
      -- collective), else the one silent the longest
      local worst, worst_age, worst_where, worst_stopped
      local silent = {}
      for r = 0, o.np - 1 do
         if not done[r] then
            if not seen[r] then
               if t - t_start > o.startup_timeout then
                  return ("watchdog: rank %d sent no heartbeat within %g s of the start " ..
                          "(--startup-timeout %g)"):format(r, o.startup_timeout, o.startup_timeout)
               end
            elseif t - last[r] > o.watchdog then
               silent[#silent + 1] = r
               local age = t - last[r]
               local where, stopped = "", false
               local pid, host = content[r]:match("pid (%d+) host (%S+)")
               if pid then
                  local st = host == hostname() and read_file("/proc/" .. pid .. "/stat")
                  local state = st and st:match("^%d+ %(.*%) (%S)")
                  stopped = state == "T" or state == "t"
                  where = (" (pid %s on %s%s)"):format(pid, host, stopped and ", stopped" or "")
               end
               if worst == nil or (stopped and not worst_stopped) or
                  (stopped == worst_stopped and age > worst_age) then
                  worst, worst_age, worst_where, worst_stopped = r, age, where, stopped
               end
            end
         end
      end
      if worst then
         return ("watchdog: rank %d%s made no progress for %.1f s (--watchdog %g; silent " ..
                 "ranks: %s)"):format(worst, worst_where, worst_age, o.watchdog,
                                      table.concat(silent, ", "))
      end
      return nil
   end
end

local function remove_dir(dir)
   local d = C.opendir(dir)
   if d ~= nil then
      local names = {}
      while true do
         local e = C.readdir(d)
         if e == nil then break end
         local n = ffi.string(e.d_name)
         if n ~= "." and n ~= ".." then names[#names + 1] = n end
      end
      C.closedir(d)
      for _, n in ipairs(names) do
         if C.unlink(dir .. "/" .. n) ~= 0 then remove_dir(dir .. "/" .. n) end
      end
   end
   C.rmdir(dir)
end

---------------------------------------------------------------------------------------------
-- main
---------------------------------------------------------------------------------------------

-- one start: returns ok, status, reason
local function run_once(o, argv, hb_dir)
   local t_start = now()
   local pid, err = spawn(argv)
   if not pid then return false, 1, err end
   local check = o.watchdog > 0 and watchdog(o, hb_dir, t_start) or nil
   local next_check = t_start + POLL
   local status, reason
   while true do
      local s = wait_signal(POLL)
      if s == SIGINT or s == SIGTERM or s == SIGHUP then
         interrupted = s
         reason = "interrupted (signal " .. s .. ")"
         break
      end
      status = reap(pid)
      if status then break end
      local t = now()
      if check and t >= next_check then
         next_check = t + POLL
         reason = check(t)
         if reason then break end
      end
   end
   status = end_job(pid, status)
   if status == nil then return false, 1, (reason or "") .. "; mpirun could not be reaped" end
   local code, how = decode_status(status)
   if reason == nil then
      if code == 0 then return true, 0 end
      return false, code, ("the job failed: mpirun %s after %.1f s"):format(how, now() - t_start)
   end
   if code == 0 then code = 1 end
   return false, code, reason .. "; the job was ended (mpirun " .. how .. ")"
end

--- main(argv) -> exit status
function M.main(argv)
   local copy = {}
   for k = 1, #(argv or {}) do copy[k] = argv[k] end
   local o, err, help = M.parse(copy)
   if help then
      io.write(HELP, "\n")
      return 0
   end
   if not o then
      io.stderr:write("lumen-run: ", err, "\n", USAGE, "\n(lumen-run -h for every option)\n")
      return 2
   end
   local argv_ = M.mpirun_argv(o)
   if o.dry_run then
      local words = {}
      for k, w in ipairs(argv_) do words[k] = shell_word(w) end
      io.write(table.concat(words, " "), "\n")
      return 0
   end
   if not on_path(argv_[1]) then
      say("%s not found (apt-get install openmpi-bin, or set LUMEN_MPIRUN)", argv_[1])
      return 2
   end
   -- the heartbeat folder, one sub-folder per start
   local base, own_base = o.heartbeat_dir, false
   if base == nil then
      local tmp = os.getenv("TMPDIR")
      if tmp == nil or tmp == "" then tmp = "/tmp" end
      local template = ffi.new("char[?]", #tmp + 32, tmp .. "/lumen-run.XXXXXX")
      if C.mkdtemp(template) == nil then
         say("cannot make a heartbeat folder under %s: %s", tmp, errno_str())
         return 1
      end
      base, own_base = ffi.string(template), true
   else
      os.execute("mkdir -p " .. shell_word(base))
   end
   if o.watchdog > 0 and o.hostfile and own_base then
      say("warning: --watchdog with --hostfile: the ranks on other machines must be able to " ..
          "write %s (choose a folder on a shared file system with --heartbeat-dir), or they " ..
          "send no heartbeat", base)
   end
   -- every process the job starts stays below this one (orphans come back here), so that
   -- ending a job leaves nothing behind
   C.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
   C.sigemptyset(mask)
   for _, s in ipairs({ SIGCHLD, SIGINT, SIGTERM, SIGHUP }) do C.sigaddset(mask, s) end
   C.sigprocmask(SIG_BLOCK, mask, old_mask)
   C.setenv("LUMEN_RUN_ID", ("%d-%d"):format(os.time(), C.getpid()), 1)
   local status, ok = 1, false
   for start = 0, o.max_restarts do
      local dir = ("%s/start.%d"):format(base, start)
      os.execute("mkdir -p " .. shell_word(dir))
      C.setenv("LUMEN_RESTART_COUNT", tostring(start), 1)
      C.setenv("LUMEN_HEARTBEAT_DIR", dir, 1)
      local reason
      ok, status, reason = run_once(o, argv_, dir)
      remove_dir(dir)
      if ok then break end
      if interrupted then
         say("interrupted (signal %d): the job was ended; no restart", interrupted)
         status = 128 + interrupted
         break
      end
      if status == 2 then
         say("%s; status 2 is the script refusing its input: no restart", reason)
         break
      end
      if start < o.max_restarts then
         say("%s; restart %d of %d (LUMEN_RESTART_COUNT=%d)", reason, start + 1, o.max_restarts,
             start + 1)
      else
         say("%s; no restart left (--max-restarts %d): giving up with status %d", reason,
             o.max_restarts, status)
      end
   end
   if own_base then remove_dir(base) end
   C.sigprocmask(SIG_SETMASK, old_mask, nil)
   return ok and 0 or status
end

-- run as a script (bin/lumen-run): luajit lumen/launcher.lua ARGS...
local this = debug.getinfo(1, "S").source
if type(arg) == "table" and arg[0] and this == "@" .. arg[0] then
   local argv = {}
   for k = 1, #arg do argv[k] = arg[k] end
   os.exit(M.main(argv))
end

return M
