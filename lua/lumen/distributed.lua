-- lumen.distributed -- lm.distributed: collectives across processes on MPI (Open MPI), through the
-- FFI. Loaded on first use as lm.distributed; libmpi.so.40 is loaded by init(), never when lumen
-- loads, so lumen works where MPI is not installed. Launch a job with
--
--    mpirun -np 2 bin/lumen script.lua          (as root add --allow-run-as-root)
--
--    local dist = lm.distributed
--    dist.init({backend = "mpi"})
--    dist.all_reduce(t, {op = "mean"})          -- in place, returns t
--    local h = dist.all_reduce(t, {async = true}); ...; h:wait()
--    dist.finalize()
--
-- Ranks are 0-based, as MPI numbers them. Every collective must be called by every rank, in the
-- same order, with tensors of the same sizes and dtype: before the data moves, the ranks exchange
-- a small header (which collective, op, root, dtype, sizes, strides) and every rank raises the
-- same error when they differ ("lumen.distributed.all_reduce: ranks disagree: ..."), instead of
-- exchanging garbage or hanging.
--
-- Memory formats: a tensor that is non-overlapping and dense (contiguous, channels-last, any
-- permuted dense layout) with the same strides on every rank is handed to MPI in place: no copy.
-- Otherwise (a strided view, different layouts on different ranks) each rank packs its tensor into
-- one canonical layout (contiguous), communicates, and copies the result back into the tensor.
-- float16 and bfloat16 have no MPI type: broadcast and all_gather move their bits (as 16-bit
-- integers, no copy); the reductions run in float32 on a converted copy, written back rounded.
-- Tensors on another device (sim:N, cuda:N) go through a CPU copy.
--
-- Non-blocking forms: {async = true} returns a Work handle at once (MPI_Iallreduce, MPI_Ibcast,
-- ...): h:wait() blocks until done and returns what the blocking call returns; h:is_completed()
-- tests without blocking. The tensors must not be used until then. MPI progresses a non-blocking
-- collective while some MPI call runs in this process: M.progress() (DistributedDataParallel
-- calls it from its hooks) lets in-flight operations advance.
--
-- Failure: lumen sets MPI_ERRORS_RETURN on MPI_COMM_WORLD, so an MPI error becomes a Lua error
-- "lumen.distributed.<fn>: MPI error: ...". When a process exits with an error (bin/lumen calls
-- M._at_exit with its exit status) after init, it calls MPI_Abort: mpirun then stops every rank,
-- so a failure on one rank never leaves the others waiting in a collective. A rank killed by a
-- signal is noticed by mpirun, which stops the others (docs/distributed.md, "Failures").

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local dtypes = require("lumen.dtype")

local type, pairs, ipairs, tostring, tonumber, error, pcall, getmetatable, setmetatable =
   type, pairs, ipairs, tostring, tonumber, error, pcall, getmetatable, setmetatable
local Tensor, raw = T.Tensor, T.raw

local M = {}

-- Open MPI's ABI: handles are pointers; MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM ... are the addresses
-- of exported globals (ompi_mpi_comm_world, ...). MPI_STATUS_IGNORE is NULL, MPI_IN_PLACE is 1.
local CDEF = [[
typedef struct lm_mpi_sym { char opaque[1]; } lm_mpi_sym;
extern lm_mpi_sym ompi_mpi_comm_world;
extern lm_mpi_sym ompi_mpi_errors_return;
extern lm_mpi_sym ompi_mpi_float;
extern lm_mpi_sym ompi_mpi_double;
extern lm_mpi_sym ompi_mpi_int64_t;
extern lm_mpi_sym ompi_mpi_int32_t;
extern lm_mpi_sym ompi_mpi_uint8_t;
extern lm_mpi_sym ompi_mpi_uint16_t;
extern lm_mpi_sym ompi_mpi_op_sum;
extern lm_mpi_sym ompi_mpi_op_max;
extern lm_mpi_sym ompi_mpi_op_min;
extern lm_mpi_sym ompi_mpi_op_prod;
extern lm_mpi_sym ompi_mpi_op_lor;
extern lm_mpi_sym ompi_mpi_op_land;
int MPI_Initialized(int *flag);
int MPI_Finalized(int *flag);
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
int MPI_Finalize(void);
int MPI_Abort(void *comm, int errorcode);
int MPI_Comm_rank(void *comm, int *rank);
int MPI_Comm_size(void *comm, int *size);
int MPI_Comm_set_errhandler(void *comm, void *errhandler);
int MPI_Error_string(int errorcode, char *string, int *resultlen);
int MPI_Get_library_version(char *version, int *resultlen);
int MPI_Barrier(void *comm);
int MPI_Ibarrier(void *comm, void **request);
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, void *datatype, void *op,
                  void *comm);
int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, void *datatype, void *op,
                   void *comm, void **request);
int MPI_Bcast(void *buffer, int count, void *datatype, int root, void *comm);
int MPI_Ibcast(void *buffer, int count, void *datatype, int root, void *comm, void **request);
int MPI_Allgather(const void *sendbuf, int sendcount, void *sendtype, void *recvbuf,
                  int recvcount, void *recvtype, void *comm);
int MPI_Iallgather(const void *sendbuf, int sendcount, void *sendtype, void *recvbuf,
                   int recvcount, void *recvtype, void *comm, void **request);
int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, void *datatype,
                             void *op, void *comm);
int MPI_Ireduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, void *datatype,
                              void *op, void *comm, void **request);
int MPI_Wait(void **request, void *status);
int MPI_Test(void **request, int *flag, void *status);
]]
-- busted reloads modules for each spec file: declare once
if not pcall(ffi.typeof, "lm_mpi_sym") then ffi.cdef(CDEF) end

local MPI_THREAD_FUNNELED = 1
local IN_PLACE = ffi.cast("void*", 1)
local INT_MAX = 2147483647

-- the library and the handles, set by load_mpi()
local lib, WORLD, TYPES, OPS
-- the process's state lives in the Lua registry, not in this module: busted reloads modules for
-- each spec file, and MPI is initialized once per process
local registry = debug.getregistry()
local state = registry["lumen.distributed.state"]
if state == nil then
   state = { initialized = false, finalized = false, rank = 0, size = 1, owner = false,
             inflight = {}, ninflight = 0 }
   registry["lumen.distributed.state"] = state
end
M._state = state

local function fail(fname, msg)
   error("lumen.distributed." .. fname .. ": " .. msg, T.user_level())
end

---------------------------------------------------------------------------------------------
-- loading MPI
---------------------------------------------------------------------------------------------

local LIB_NAMES = { "libmpi.so.40", "libmpi.so" }

-- load libmpi (RTLD_GLOBAL: Open MPI's components resolve symbols in it); returns lib or nil, why
local function load_mpi()
   if lib then return lib end
   local names = LIB_NAMES
   local env = os.getenv("LUMEN_MPI_LIB")
   if env and env ~= "" then names = { env } end
   local errs = {}
   for _, name in ipairs(names) do
      local ok, l = pcall(ffi.load, name, true)
      if ok then
         lib = l
         local function h(sym) return ffi.cast("void*", l[sym]) end
         local ok2, why = pcall(function()
            WORLD = h("ompi_mpi_comm_world")
            TYPES = {
               float = h("ompi_mpi_float"), double = h("ompi_mpi_double"),
               int64 = h("ompi_mpi_int64_t"), int32 = h("ompi_mpi_int32_t"),
               uint8 = h("ompi_mpi_uint8_t"), uint16 = h("ompi_mpi_uint16_t"),
            }
            OPS = {
               sum = h("ompi_mpi_op_sum"), max = h("ompi_mpi_op_max"), min = h("ompi_mpi_op_min"),
               prod = h("ompi_mpi_op_prod"), lor = h("ompi_mpi_op_lor"),
               land = h("ompi_mpi_op_land"),
            }
            M._errors_return = h("ompi_mpi_errors_return")
         end)
         if not ok2 then
            lib = nil
            return nil, name .. " is not Open MPI (" .. tostring(why) .. ")"
         end
         return lib
      end
      errs[#errs + 1] = tostring(l)
   end
   return nil, table.concat(errs, "; ")
end

--- is_available() -> true when the MPI library can be loaded (Open MPI's libmpi.so.40)
function M.is_available()
   return load_mpi() ~= nil
end

local function mpi_error_string(rc)
   local buf = ffi.new("char[512]")
   local len = ffi.new("int[1]")
   if lib.MPI_Error_string(rc, buf, len) == 0 then return ffi.string(buf, len[0]) end
   return "error code " .. tostring(rc)
end

local function mpi_check(rc, fname)
   if rc ~= 0 then fail(fname, "MPI error: " .. mpi_error_string(rc)) end
end

local function need_init(fname)
   if state.initialized and lib == nil then load_mpi() end
   if not state.initialized then
      if state.finalized then
         fail(fname, "the process group was finalized (lm.distributed.finalize)")
      end
      fail(fname, "the process group is not initialized; call " ..
           "lm.distributed.init({backend = \"mpi\"}) first (and start the script with " ..
           "mpirun -np K bin/lumen script.lua)")
   end
end

---------------------------------------------------------------------------------------------
-- in-flight operations
---------------------------------------------------------------------------------------------

-- every non-blocking operation not yet completed: its buffers stay referenced here until MPI is
-- done with them, even if the caller drops the handle
local inflight = state.inflight
local flag = ffi.new("int[1]")

local Work = {}
Work.__index = Work
M.Work = Work

local function complete(w)
   if w.done then return end
   w.done = true
   inflight[w] = nil
   state.ninflight = state.ninflight - 1
   if w.finish then w.result = w.finish() end
   w.finish = nil
end

local function new_work(fname, finish, result)
   local w = setmetatable({ req = ffi.new("void*[1]"), done = false, fname = fname,
                            finish = finish, result = result }, Work)
   return w
end

local function launch(w)
   inflight[w] = true
   state.ninflight = state.ninflight + 1
   return w
end

--- h:wait() -> blocks until the operation has completed; returns the blocking call's result
function Work:wait()
   if not self.done then
      if self.req[0] ~= nil then
         local rc = lib.MPI_Wait(self.req, nil)
         if rc ~= 0 then
            inflight[self] = nil
            state.ninflight = state.ninflight - 1
            self.done = true
            mpi_check(rc, self.fname)
         end
      end
      complete(self)
   end
   return self.result
end

--- h:is_completed() -> true when the operation has completed (MPI_Test; never blocks)
function Work:is_completed()
   if self.done then return true end
   if self.req[0] ~= nil then
      mpi_check(lib.MPI_Test(self.req, flag, nil), self.fname)
      if flag[0] == 0 then return false end
   end
   complete(self)
   return true
end

-- a handle whose operation is already done (an empty tensor, one rank)
local function done_work(fname, finish)
   local w = new_work(fname, finish)
   w.done = true
   if finish then w.result = finish() end
   w.finish = nil
   return w
end

--- progress(): let in-flight non-blocking operations advance (one MPI_Test each); cheap
function M.progress()
   if state.ninflight == 0 or not state.initialized then return end
   for w in pairs(inflight) do
      if w.req[0] ~= nil then
         lib.MPI_Test(w.req, flag, nil)
         if flag[0] ~= 0 then complete(w) end
      end
   end
end

local function wait_all_inflight()
   for w in pairs(inflight) do pcall(Work.wait, w) end
end

---------------------------------------------------------------------------------------------
-- init / finalize / queries
---------------------------------------------------------------------------------------------


--- init({backend = "mpi"}): join the job (MPI_Init_thread, MPI_THREAD_FUNNELED: MPI is called
--- from the Lua thread only). Started without mpirun, the process is a job of one (rank 0).
--- backend "nccl" (GPUs) is not available yet. Returns nothing.
local INIT_OPTS = { backend = true }
function M.init(opts)
   local fname = "init"
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table, got " .. T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if not INIT_OPTS[k] then fail(fname, "unknown option '" .. tostring(k) .. "'") end
   end
   local backend = opts.backend == nil and "mpi" or opts.backend
   if backend == "nccl" then
      fail(fname, "backend 'nccl' is not available yet (CPU processes use backend = \"mpi\")")
   elseif backend ~= "mpi" then
      fail(fname, "unknown backend " .. tostring(backend) .. " (expected \"mpi\")")
   end
   if state.initialized then
      fail(fname, "the process group is already initialized")
   end
   if state.finalized then
      fail(fname, "the process group was finalized; MPI cannot be initialized again in the " ..
           "same process")
   end
   local l, why = load_mpi()
   if not l then
      fail(fname, "cannot load the MPI library (" .. tostring(why) .. "); install Open MPI " ..
           "(Debian: apt-get install libopenmpi-dev openmpi-bin) or set LUMEN_MPI_LIB")
   end
   local fl = ffi.new("int[1]")
   mpi_check(lib.MPI_Finalized(fl), fname)
   if fl[0] ~= 0 then
      fail(fname, "MPI was finalized in this process; it cannot be initialized again")
   end
   mpi_check(lib.MPI_Initialized(fl), fname)
   if fl[0] == 0 then
      local provided = ffi.new("int[1]")
      mpi_check(lib.MPI_Init_thread(nil, nil, MPI_THREAD_FUNNELED, provided), fname)
      state.owner = true
   end
   -- errors come back as return codes (Lua errors), not as an abort inside MPI
   lib.MPI_Comm_set_errhandler(WORLD, M._errors_return)
   local r = ffi.new("int[1]")
   mpi_check(lib.MPI_Comm_rank(WORLD, r), fname)
   state.rank = r[0]
   mpi_check(lib.MPI_Comm_size(WORLD, r), fname)
   state.size = r[0]
   state.initialized = true
   state.backend = backend
   -- when the Lua state closes after init without finalize and without passing through
   -- M._at_exit (a script run by plain luajit that failed), abort rather than leave the other
   -- ranks waiting
   if registry["lumen.distributed.sentinel"] == nil then
      local sentinel = newproxy(true)
      local at_exit = M._at_exit
      getmetatable(sentinel).__gc = function()
         if state.initialized and not state.finalized and state.owner then
            at_exit(state.exit_code or 1)
         end
      end
      registry["lumen.distributed.sentinel"] = sentinel
   end
end

--- is_initialized() -> true between init() and finalize()
function M.is_initialized()
   return state.initialized
end

--- rank() -> this process's rank, 0 .. world_size() - 1
function M.rank()
   need_init("rank")
   return state.rank
end

--- world_size() -> the number of processes in the job
function M.world_size()
   need_init("world_size")
   return state.size
end

--- get_backend() -> "mpi"
function M.get_backend()
   need_init("get_backend")
   return state.backend
end

--- finalize(): wait for in-flight operations, then leave the job (MPI_Finalize). Every rank
--- must call it; afterwards collectives raise, and init cannot be called again.
function M.finalize()
   need_init("finalize")
   M._heartbeat_done()
   wait_all_inflight()
   state.initialized = false
   state.finalized = true
   if state.owner then mpi_check(lib.MPI_Finalize(), "finalize") end
end

---------------------------------------------------------------------------------------------
-- lumen-run (bin/lumen-run, lua/lumen/launcher.lua): the restart count and the heartbeat
---------------------------------------------------------------------------------------------

--- restart_count() -> how many times lumen-run restarted this job before this start
--- (LUMEN_RESTART_COUNT: 0 on the first start, and outside lumen-run). Needs no init.
function M.restart_count()
   local n = tonumber(os.getenv("LUMEN_RESTART_COUNT") or "")
   if n == nil or n < 0 or n % 1 ~= 0 then return 0 end
   return n
end

-- this process's rank for the heartbeat file: MPI's when initialized, else the launcher's
-- environment (Open MPI sets OMPI_COMM_WORLD_RANK before the script runs)
local function heartbeat_rank()
   if state.initialized then return state.rank end
   return tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMIX_RANK") or "") or 0
end

pcall(ffi.cdef, "int getpid(void);")
pcall(ffi.cdef, "int usleep(unsigned int usec);")
pcall(ffi.cdef, "int gethostname(char *name, size_t len);")

-- write the heartbeat file: a fixed-width line rewritten in place (no truncation: the launcher
-- never reads a half-empty file), flushed to the file system at once
local function heartbeat_write(word)
   local hb = state.heartbeat
   if hb == nil then
      local dir = os.getenv("LUMEN_HEARTBEAT_DIR")
      hb = { off = dir == nil or dir == "", count = 0 }
      state.heartbeat = hb
      if not hb.off then
         local path = dir .. "/rank." .. heartbeat_rank()
         local f, err = io.open(path, "w")
         if not f then
            io.stderr:write("lumen.distributed.heartbeat: cannot write ", tostring(err),
                            "; no heartbeats from this rank\n")
            hb.off = true
         else
            local name = ffi.new("char[256]")
            hb.host = ffi.C.gethostname(name, 255) == 0 and ffi.string(name) or "?"
            hb.pid = ffi.C.getpid()
            hb.file = f
         end
      end
   end
   if hb.off then return end
   hb.count = hb.count + 1
   local f = hb.file
   f:seek("set", 0)
   f:write(("%-4s %12d pid %d host %s\n"):format(word, hb.count, hb.pid,
                                                  (hb.host:gsub("%s", "_"))))
   f:flush()
end

--- heartbeat(): tell lumen-run's watchdog that this rank makes progress (call it every step:
--- a rank that calls none for --watchdog seconds has the job ended and restarted). Rewrites
--- LUMEN_HEARTBEAT_DIR/rank.R; a no-op outside lumen-run. Needs no init.
function M.heartbeat()
   heartbeat_write("beat")
end

-- finalize (and a successful exit) mark the rank finished: the watchdog stops watching it
function M._heartbeat_done()
   if state.heartbeat and state.heartbeat.file then heartbeat_write("done") end
end

-- the process exits with status code (bin/lumen's exit path, lumen.repl): code 0 finalizes MPI
-- (a script need not call finalize); another code, after init, aborts the whole job so that no
-- rank waits forever for this one
function M._at_exit(code)
   state.exit_code = code
   if code == 0 then M._heartbeat_done() end
   if not state.initialized or state.finalized or not state.owner then return end
   if code == 0 then
      local ok = pcall(M.finalize)
      if ok then return end
      code = 1
   end
   io.stdout:flush()
   io.stderr:write(("lumen.distributed: rank %d of %d exits with status %d; aborting the job " ..
                    "(MPI_Abort) so that the other ranks stop\n"):format(state.rank, state.size,
                                                                         code))
   io.stderr:flush()
   state.initialized = false
   -- a moment before the abort kills the others: ranks that failed in the same collective (a
   -- mismatched all_reduce fails on every rank at once) get to print why. Without it a fresh-clone
   -- CI run lost rank 1's message once, mpirun having killed it before it wrote.
   ffi.C.usleep(300000)
   lib.MPI_Abort(WORLD, code)
end

--- barrier({async = false}): wait until every rank has reached it
function M.barrier(opts)
   local fname = "barrier"
   need_init(fname)
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table, got " .. T.typename(opts))
   end
   for k in pairs(opts or {}) do
      if k ~= "async" then fail(fname, "unknown option '" .. tostring(k) .. "'") end
   end
   if opts and opts.async then
      local w = new_work(fname, nil)
      mpi_check(lib.MPI_Ibarrier(WORLD, w.req), fname)
      return launch(w)
   end
   mpi_check(lib.MPI_Barrier(WORLD), fname)
end

---------------------------------------------------------------------------------------------
-- tensors: checks, the header exchange, buffers
---------------------------------------------------------------------------------------------

local KINDS = { all_reduce = 1, broadcast = 2, all_gather = 3, reduce_scatter = 4 }
local KIND_NAMES = { "all_reduce", "broadcast", "all_gather", "reduce_scatter" }
local OP_IDS = { sum = 1, mean = 2, max = 3, min = 4, prod = 5 }
local OP_NAMES = { "sum", "mean", "max", "min", "prod" }

local F32, F64, F16, BF16 = dtypes.float32.id, dtypes.float64.id, dtypes.float16.id,
   dtypes.bfloat16.id
local I64, I32, U8, BOOL = dtypes.int64.id, dtypes.int32.id, dtypes.uint8.id, dtypes.bool.id

-- the MPI datatype that moves a dtype's bits (nil: none)
local function bits_type(id)
   if id == F32 then return TYPES.float
   elseif id == F64 then return TYPES.double
   elseif id == I64 then return TYPES.int64
   elseif id == I32 then return TYPES.int32
   elseif id == U8 or id == BOOL then return TYPES.uint8
   elseif id == F16 or id == BF16 then return TYPES.uint16
   end
end

-- the MPI op for a reduction on a dtype (float16/bfloat16: reduced in float32)
local function mpi_op(id, op)
   if id == BOOL then
      return (op == "sum" or op == "max") and OPS.lor or OPS.land
   end
   return OPS[op == "mean" and "sum" or op]
end

local function check_tensor(fname, t)
   if not T.is_tensor(t) then fail(fname, "tensor expected, got " .. T.typename(t)) end
   local c = T.cdata(t)
   if c == nil then fail(fname, "the tensor was freed") end
   if c.device == T.DEV_META then fail(fname, "a meta tensor has no data to communicate") end
   if c.numel > INT_MAX then
      fail(fname, ("tensors of more than %d elements are not supported (got %d)")
           :format(INT_MAX, tonumber(c.numel)))
   end
   return c
end

local function check_op(fname, op, c)
   if op == nil then return "sum" end
   if OP_IDS[op] == nil then
      fail(fname, "op must be \"sum\", \"mean\", \"max\", \"min\" or \"prod\", got " ..
           (type(op) == "string" and ("\"" .. op .. "\"") or T.typename(op)))
   end
   if op == "mean" and C.lm_dtype_is_floating(c.dtype) == 0 then
      fail(fname, "op \"mean\" needs a floating-point tensor, got " ..
           tostring(dtypes.from_id(c.dtype)))
   end
   return op
end

local function opts_table(fname, opts, known)
   if opts == nil then return {} end
   if type(opts) ~= "table" or getmetatable(opts) ~= nil then
      fail(fname, "options must be a table, got " .. T.typename(opts))
   end
   for k in pairs(opts) do
      if not known[k] then fail(fname, "unknown option '" .. tostring(k) .. "'") end
   end
   return opts
end

-- header: 24 int64 per rank
local HN = 24
local hsend = ffi.new("int64_t[?]", HN)
local hrecv_cap, hrecv = 0, nil

local function sizes_str(h, base)
   local nd = tonumber(h[base + 5])
   local p = {}
   for i = 0, nd - 1 do p[#p + 1] = tostring(tonumber(h[base + 6 + i])) end
   return "(" .. table.concat(p, ", ") .. ")"
end

local function desc(h, base)
   local d = dtypes.from_id(tonumber(h[base + 4]))
   return tostring(d) .. " " .. sizes_str(h, base)
end

-- exchange the header of this call with every rank (MPI_Allgather of HN int64) and check that
-- the ranks agree; returns the strides every rank uses (a Lua array) or nil: all NOD with the
-- same strides (the tensor goes in place where its strides are those), else nil (contiguous)
local function exchange(fname, kind, op, root, c)
   local n = state.size
   hsend[0] = 0x4c4d4449   -- "LMDI"
   hsend[1] = kind
   hsend[2] = op and OP_IDS[op] or 0
   hsend[3] = root or 0
   hsend[4] = c.dtype
   hsend[5] = c.ndim
   for i = 0, 7 do
      hsend[6 + i] = i < c.ndim and c.sizes[i] or 0
      hsend[14 + i] = i < c.ndim and c.strides[i] or 0
   end
   hsend[22] = C.lm_is_non_overlapping_and_dense(c) ~= 0 and 1 or 0
   hsend[23] = 0
   if hrecv_cap < n then
      hrecv = ffi.new("int64_t[?]", HN * n)
      hrecv_cap = n
   end
   mpi_check(lib.MPI_Allgather(hsend, HN, TYPES.int64, hrecv, HN, TYPES.int64, WORLD), fname)
   local h = hrecv
   local me = state.rank
   local same_strides = true
   for r = 0, n - 1 do
      local b = r * HN
      if h[b] ~= 0x4c4d4449 then
         fail(fname, ("ranks disagree: rank %d sent no lumen.distributed header (another MPI " ..
                      "call?)"):format(r))
      end
      if h[b + 1] ~= hsend[1] then
         local k = KIND_NAMES[tonumber(h[b + 1])] or "?"
         fail(fname, ("ranks disagree: rank %d called %s, rank %d called %s (every rank must " ..
                      "call the same collectives in the same order)")
              :format(me, KIND_NAMES[kind], r, k))
      end
      if h[b + 2] ~= hsend[2] then
         fail(fname, ("ranks disagree: rank %d uses op \"%s\", rank %d uses op \"%s\"")
              :format(me, OP_NAMES[tonumber(hsend[2])] or "?", r,
                      OP_NAMES[tonumber(h[b + 2])] or "?"))
      end
      if h[b + 3] ~= hsend[3] then
         fail(fname, ("ranks disagree: rank %d uses root %d, rank %d uses root %d")
              :format(me, tonumber(hsend[3]), r, tonumber(h[b + 3])))
      end
      local same = h[b + 4] == hsend[4] and h[b + 5] == hsend[5]
      for i = 0, 7 do same = same and h[b + 6 + i] == hsend[6 + i] end
      if not same then
         fail(fname, ("ranks disagree on the tensor: rank %d has %s, rank %d has %s (sizes " ..
                      "and dtype must match on every rank)"):format(me, desc(hsend, 0), r,
                                                                    desc(h, b)))
      end
      if h[b + 22] == 0 then
         same_strides = false
      else
         for i = 0, 7 do
            if h[b + 14 + i] ~= hsend[14 + i] then same_strides = false end
         end
      end
   end
   if not same_strides then return nil end
   local s = {}
   for i = 0, c.ndim - 1 do s[i + 1] = tonumber(c.strides[i]) end
   return s
end

local function sizes_of(c)
   local s = {}
   for i = 0, c.ndim - 1 do s[i + 1] = tonumber(c.sizes[i]) end
   return s
end

local function is_cpu(c) return c.device == T.DEV_CPU end

-- a tensor of sizes with the given strides (nil: contiguous), dtype id, on the CPU
local function empty_cpu(sizes, strides, dtype_id)
   local creation = require("lumen.creation")
   local d = dtypes.from_id(dtype_id)
   if strides then
      return creation.empty_strided(sizes, strides, { dtype = d, device = "cpu" })
   end
   return creation.empty(sizes, { dtype = d, device = "cpu" })
end

-- does c have exactly these strides (nil: contiguous)?
local function has_strides(c, strides)
   if strides == nil then return C.lm_is_contiguous(c, 0) ~= 0 end
   if C.lm_is_non_overlapping_and_dense(c) == 0 then return false end
   for i = 0, c.ndim - 1 do
      if c.sizes[i] ~= 1 and c.strides[i] ~= strides[i + 1] then return false end
   end
   return true
end

-- the buffer a tensor is communicated through: t itself when it is on the CPU, of a dtype MPI
-- can take as is, with the canonical strides; else a CPU copy with those strides (of work_dtype
-- when given). Returns buf (a tensor), staged (true when buf is a copy to copy back).
-- M.stats.staged counts the copies (specs check that dense tensors go in place)
M.stats = { staged = 0 }
local function buffer_for(t, c, strides, work_dtype, fill)
   if is_cpu(c) and (work_dtype == nil or work_dtype == c.dtype) and has_strides(c, strides) then
      return t, false
   end
   M.stats.staged = M.stats.staged + 1
   local b = empty_cpu(sizes_of(c), strides, work_dtype or c.dtype)
   if fill then raw.copy_(b, t) end
   return b, true
end

local function ptr(t)
   local c = T.cdata(t)
   T.barrier(c)
   return C.lm_tensor_data(c)
end

-- divide a summed buffer by the world size (op "mean")
local function mean_fix(buf, op)
   if op == "mean" and state.size > 1 then raw.div_(buf, state.size) end
end

---------------------------------------------------------------------------------------------
-- the collectives
---------------------------------------------------------------------------------------------

--- all_reduce(t, {op = "sum", async = false}) -> t: every rank's t becomes the reduction over
--- the ranks ("sum", "mean", "max", "min", "prod"), in place. With async = true, returns a Work
--- handle (h:wait() -> t).
local AR_OPTS = { op = true, async = true }
function M.all_reduce(t, opts)
   local fname = "all_reduce"
   need_init(fname)
   local c = check_tensor(fname, t)
   opts = opts_table(fname, opts, AR_OPTS)
   local op = check_op(fname, opts.op, c)
   local strides = exchange(fname, KINDS.all_reduce, op, 0, c)
   return M._all_reduce_unchecked(fname, t, c, op, strides, opts.async)
end

-- the data part of all_reduce, without the header exchange (DistributedDataParallel's buckets,
-- whose sizes are the same on every rank by construction)
function M._all_reduce_unchecked(fname, t, c, op, strides, async)
   c = c or T.cdata(t)
   local half = c.dtype == F16 or c.dtype == BF16
   local buf, staged = buffer_for(t, c, strides, half and F32 or nil, true)
   local bc = T.cdata(buf)
   local count = tonumber(bc.numel)
   local dt, mop = bits_type(bc.dtype), mpi_op(c.dtype, op)
   local function finish()
      mean_fix(buf, op)
      if staged then raw.copy_(t, buf) end
      return t
   end
   if count == 0 or state.size == 1 then
      if async then return done_work(fname, finish) end
      return finish()
   end
   local p = ptr(buf)
   if async then
      local w = new_work(fname, finish)
      w.keep = buf
      mpi_check(lib.MPI_Iallreduce(IN_PLACE, p, count, dt, mop, WORLD, w.req), fname)
      return launch(w)
   end
   mpi_check(lib.MPI_Allreduce(IN_PLACE, p, count, dt, mop, WORLD), fname)
   return finish()
end

--- broadcast(t, {root = 0, async = false}) -> t: every rank's t becomes root's t, in place
local BC_OPTS = { root = true, async = true }
function M.broadcast(t, opts)
   local fname = "broadcast"
   need_init(fname)
   local c = check_tensor(fname, t)
   opts = opts_table(fname, opts, BC_OPTS)
   local root = opts.root == nil and 0 or opts.root
   if type(root) ~= "number" or root % 1 ~= 0 or root < 0 or root >= state.size then
      fail(fname, ("root must be a rank in 0..%d, got %s"):format(state.size - 1, tostring(root)))
   end
   local strides = exchange(fname, KINDS.broadcast, nil, root, c)
   return M._broadcast_unchecked(fname, t, c, root, strides, opts.async)
end

function M._broadcast_unchecked(fname, t, c, root, strides, async)
   c = c or T.cdata(t)
   local is_root = state.rank == root
   local buf, staged = buffer_for(t, c, strides, nil, is_root)
   local count = tonumber(T.cdata(buf).numel)
   local function finish()
      if staged and not is_root then raw.copy_(t, buf) end
      return t
   end
   if count == 0 or state.size == 1 then
      if async then return done_work(fname, finish) end
      return finish()
   end
   local p = ptr(buf)
   local dt = bits_type(c.dtype)
   if async then
      local w = new_work(fname, finish)
      w.keep = buf
      mpi_check(lib.MPI_Ibcast(p, count, dt, root, WORLD, w.req), fname)
      return launch(w)
   end
   mpi_check(lib.MPI_Bcast(p, count, dt, root, WORLD), fname)
   return finish()
end

--- all_gather(t, {async = false}) -> array of world_size() tensors: [r + 1] is rank r's t (the
--- sizes and dtype of t, its strides when they are dense and the same on every rank, else
--- contiguous; on t's device). t is not changed.
local AG_OPTS = { async = true }
function M.all_gather(t, opts)
   local fname = "all_gather"
   need_init(fname)
   local c = check_tensor(fname, t)
   opts = opts_table(fname, opts, AG_OPTS)
   local strides = exchange(fname, KINDS.all_gather, nil, 0, c)
   local n = state.size
   local send = buffer_for(t, c, strides, nil, true)
   local numel = tonumber(c.numel)
   local sizes = sizes_of(c)
   local creation = require("lumen.creation")
   local big = creation.empty({ math.max(n * numel, 1) },
                              { dtype = dtypes.from_id(c.dtype), device = "cpu" })
   local st = strides
   if st == nil then
      st = {}
      local acc = 1
      for i = #sizes, 1, -1 do st[i] = acc; acc = acc * sizes[i] end
   end
   local dev = Tensor.device(t)
   local function finish()
      local out = {}
      for r = 1, n do
         local v = Tensor.as_strided(big, sizes, st, (r - 1) * numel)
         if dev ~= "cpu" then v = Tensor.to(v, dev) end
         out[r] = v
      end
      return out
   end
   if numel == 0 then
      if opts.async then return done_work(fname, finish) end
      return finish()
   end
   local sp, rp = ptr(send), ptr(big)
   local dt = bits_type(c.dtype)
   if opts.async then
      local w = new_work(fname, finish)
      w.keep, w.keep2 = send, big
      mpi_check(lib.MPI_Iallgather(sp, numel, dt, rp, numel, dt, WORLD, w.req), fname)
      return launch(w)
   end
   mpi_check(lib.MPI_Allgather(sp, numel, dt, rp, numel, dt, WORLD), fname)
   return finish()
end

--- reduce_scatter(t, {op = "sum", async = false}) -> a new tensor: t reduced over the ranks, then
--- cut along dim 1 into world_size() equal chunks; rank r gets chunk r + 1. t's dim 1 must be a
--- multiple of world_size(). t is not changed.
local RS_OPTS = { op = true, async = true }
function M.reduce_scatter(t, opts)
   local fname = "reduce_scatter"
   need_init(fname)
   local c = check_tensor(fname, t)
   opts = opts_table(fname, opts, RS_OPTS)
   local op = check_op(fname, opts.op, c)
   local n = state.size
   if c.ndim == 0 then fail(fname, "cannot scatter a 0-dim tensor") end
   local d1 = tonumber(c.sizes[0])
   if d1 % n ~= 0 then
      fail(fname, ("the size of dim 1 (%d) must be a multiple of the world size (%d)")
           :format(d1, n))
   end
   local strides = exchange(fname, KINDS.reduce_scatter, op, 0, c)
   -- chunks along dim 1 are consecutive in memory only when dim 1 is the outermost
   if strides and c.ndim > 0 and d1 > 1 and strides[1] * d1 ~= tonumber(c.numel) then
      strides = nil
   end
   local half = c.dtype == F16 or c.dtype == BF16
   local work = half and F32 or nil
   local send = buffer_for(t, c, strides, work, true)
   local sizes = sizes_of(c)
   sizes[1] = d1 / n
   local out_st = strides
   local out = empty_cpu(sizes, out_st, work or c.dtype)
   local count = tonumber(T.cdata(out).numel)
   local dev = Tensor.device(t)
   local function finish()
      mean_fix(out, op)
      local r = out
      if half then r = Tensor.to(r, dtypes.from_id(c.dtype)) end
      if dev ~= "cpu" then r = Tensor.to(r, dev) end
      return r
   end
   if count == 0 then
      if opts.async then return done_work(fname, finish) end
      return finish()
   end
   local sp, rp = ptr(send), ptr(out)
   local dt, mop = bits_type(T.cdata(send).dtype), mpi_op(c.dtype, op)
   if opts.async then
      local w = new_work(fname, finish)
      w.keep, w.keep2 = send, out
      mpi_check(lib.MPI_Ireduce_scatter_block(sp, rp, count, dt, mop, WORLD, w.req), fname)
      return launch(w)
   end
   mpi_check(lib.MPI_Reduce_scatter_block(sp, rp, count, dt, mop, WORLD), fname)
   return finish()
end

--- library_version() -> MPI_Get_library_version's text (loads MPI; needs no init)
function M.library_version()
   local l, why = load_mpi()
   if not l then
      fail("library_version", "cannot load the MPI library (" .. tostring(why) .. ")")
   end
   local buf = ffi.new("char[8192]")
   local len = ffi.new("int[1]")
   mpi_check(lib.MPI_Get_library_version(buf, len), "library_version")
   return (ffi.string(buf, len[0]):gsub("%s+$", ""))
end

-- for DistributedDataParallel
M._exchange = exchange
M._check_tensor = check_tensor

return M
