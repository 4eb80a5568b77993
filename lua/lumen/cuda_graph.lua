-- lumen.cuda_graph -- CUDA graphs, as torch.cuda's: lm.cuda.CUDAGraph, lm.cuda.graph,
-- lm.cuda.graph_pool_handle, lm.cuda.is_current_stream_capturing (lm.cuda installs them).
--
-- A graph records the kernels lumen queues on a GPU's stream while a function runs, and replays
-- them with one launch: a training step at a small batch, bound by the host's work per kernel,
-- then costs the GPU's time only. The rules are PyTorch's (docs/cuda.md, "CUDA graphs"):
--   * warm up first (a few eager steps): the optimizer's state, cuDNN's algorithm choices and
--     the caching allocator's blocks exist before the capture;
--   * nothing captured runs during the capture; each replay runs it on the tensors the capture
--     saw, so inputs are copied into the same "static" tensors before each replay and results
--     are read from the tensors the captured function made;
--   * inside the capture nothing may wait for the GPU: item(), printing, copies from or to the
--     host, tensors made from Lua values and random numbers raise an error, which ends the
--     capture (the device stays usable);
--   * the graph's memory is a private pool of the caching allocator (lm.cuda.graph_pool_handle
--     shares one between graphs replayed in their capture order); it goes back to the GPU when
--     the graph is reset or collected and no tensor made in the capture is alive.
-- The emulated build (make cuda-emu) records the work on the host and replays it, so the same
-- rules and results are checked without a GPU (spec/cuda_graph_spec.lua).

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local memory = require("lumen.memory")

local M = {}
local raise, argerror = T.raise, T.argerror

local Graph = {}
Graph.__index = Graph
Graph.__name = "lumen.cuda.CUDAGraph"

local function is_graph(g) return getmetatable(g) == Graph end
local function packn(...) return {n = select("#", ...), ...} end

-- a device argument: nil (cuda:0), an index, "cuda" or "cuda:N"; returns N (lumen.cuda's check;
-- required at the call, since lumen.cuda loads this module while it loads)
local function dev_index(fname, dev) return require("lumen.cuda")._dev_index(fname, dev) end

-- a pool argument: nil (a new pool), a lm.cuda.graph_pool_handle() or another graph's pool()
local function pool_arg(fname, pool)
   if pool == nil then return 0 end
   if type(pool) == "number" and pool % 1 == 0 and pool >= 1 then return pool end
   argerror("cuda." .. fname, "pool must be a lm.cuda.graph_pool_handle() or a graph's pool(), "
            .. "got " .. tostring(pool))
end

-- options {pool =, device =}: an unknown key is an error
local function opts_of(fname, opts)
   if opts == nil then return 0, 0 end
   if type(opts) ~= "table" then
      argerror("cuda." .. fname, "expected an options table {pool =, device =}, got "
               .. type(opts))
   end
   for k in pairs(opts) do
      if k ~= "pool" and k ~= "device" then
         argerror("cuda." .. fname, "unknown option '" .. tostring(k) .. "' (pool, device)")
      end
   end
   return pool_arg(fname, opts.pool), dev_index(fname, opts.device)
end

local function self_check(fname, g)
   if not is_graph(g) then
      argerror("cuda.CUDAGraph." .. fname, "expected a lm.cuda.CUDAGraph (call it with ':'), got "
               .. type(g))
   end
end

-- lm.cuda.CUDAGraph(): an empty graph
function M.CUDAGraph()
   return setmetatable({ptr = nil, dev = nil, capturing = false}, Graph)
end

-- g:capture_begin([{pool =, device =}]): start capturing cuda:device's stream (default cuda:0)
function Graph:capture_begin(opts)
   self_check("capture_begin", self)
   local pool, dev = opts_of("CUDAGraph.capture_begin", opts)
   if self.ptr ~= nil then
      argerror("cuda.CUDAGraph.capture_begin", "this graph already holds a capture (reset() it "
               .. "first)")
   end
   local out = ffi.new("lm_cuda_graph *[1]")
   if C.lm_cuda_graph_begin(dev, pool, out) ~= 0 then raise("cuda.CUDAGraph.capture_begin") end
   self.ptr = ffi.gc(out[0], C.lm_cuda_graph_free)
   self.dev = dev
   self.capturing = true
end

-- g:capture_end(): end the capture and make the graph replayable
function Graph:capture_end()
   self_check("capture_end", self)
   if not self.capturing then
      argerror("cuda.CUDAGraph.capture_end", "this graph is not capturing")
   end
   self.capturing = false
   if C.lm_cuda_graph_end(self.ptr, 0) ~= 0 then
      local msg = ffi.string(C.lm_last_error())
      self:reset()
      argerror("cuda.CUDAGraph.capture_end", msg)
   end
end

-- an error inside lm.cuda.graph: the capture is ended and dropped
function Graph:_abort()
   if self.capturing then
      self.capturing = false
      C.lm_cuda_graph_end(self.ptr, 1)
   end
   self:reset()
end

-- g:replay(): queue the captured work again (on the capture's device; returns at once, as a
-- kernel launch does)
function Graph:replay()
   self_check("replay", self)
   if self.ptr == nil then
      argerror("cuda.CUDAGraph.replay", "this graph holds no capture")
   end
   if C.lm_cuda_graph_replay(self.ptr) ~= 0 then raise("cuda.CUDAGraph.replay") end
end

-- g:reset(): drop the capture; its memory goes back once no tensor made in it is alive
function Graph:reset()
   self_check("reset", self)
   if self.ptr ~= nil then
      local p = self.ptr
      self.ptr = nil
      self.capturing = false
      ffi.gc(p, nil)
      C.lm_cuda_graph_free(p)
   end
end

-- g:pool(): the handle of the graph's memory pool, for another capture to share
function Graph:pool()
   self_check("pool", self)
   if self.ptr == nil then argerror("cuda.CUDAGraph.pool", "this graph holds no capture") end
   return tonumber(C.lm_cuda_graph_pool(self.ptr))
end

function Graph:__tostring()
   return "lm.cuda.CUDAGraph(" .. (self.capturing and "capturing on cuda:" .. self.dev
                                  or self.ptr ~= nil and "captured on cuda:" .. self.dev
                                  or "empty") .. ")"
end

-- lm.cuda.graph(g, fn [, {pool =, device =}]) -> fn's results: capture what fn queues into g,
-- as PyTorch's `with torch.cuda.graph(g):`. The device is synchronised and Lua's garbage
-- collected first (so blocks of dead tensors are not held by the graph); an error inside fn ends
-- the capture, resets g and is raised again.
function M.graph(g, fn, opts)
   if not is_graph(g) then
      argerror("cuda.graph", "expected a lm.cuda.CUDAGraph, got " .. type(g))
   end
   if type(fn) ~= "function" then
      argerror("cuda.graph", "expected a function to capture, got " .. type(fn))
   end
   local _, dev = opts_of("graph", opts)
   if C.lm_cuda_is_capturing(dev) == 1 then
      argerror("cuda.graph", ("a CUDA graph is already being captured on cuda:%d (captures do "
                              .. "not nest)"):format(dev))
   end
   memory.collect()
   if C.lm_cuda_synchronize(dev) ~= 0 then raise("cuda.graph") end
   g:capture_begin(opts)
   local res = packn(pcall(fn))
   if not res[1] then
      g:_abort()
      error(res[2], 0)
   end
   -- tensors fn dropped are freed now, inside the capture (lumen frees what a collection found
   -- at the next settle): the allocator then holds their blocks for the graph, which may read
   -- them at every replay
   collectgarbage()
   memory.settle()
   g:capture_end()
   return unpack(res, 2, res.n)
end

-- lm.cuda.graph_pool_handle(): a new pool handle for captures that share memory
function M.graph_pool_handle()
   local out = ffi.new("uint64_t[1]")
   if C.lm_cuda_graph_pool_handle(out) ~= 0 then raise("cuda.graph_pool_handle") end
   return tonumber(out[0])
end

-- lm.cuda.is_current_stream_capturing([device]): is cuda:device capturing a graph now?
function M.is_current_stream_capturing(dev)
   return C.lm_cuda_is_capturing(dev_index("is_current_stream_capturing", dev)) == 1
end

M.is_graph = is_graph
return M
