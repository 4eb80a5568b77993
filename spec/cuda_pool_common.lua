-- What the CUDA pool specs share (cuda_pool_spec.lua: the 2-D pools, cuda_pool3d_spec.lua: the
-- 3-D ones): the device, the dtypes with their tolerances, the shape generator, the comparison
-- against the CPU, the inputs made on both devices, the gradients through autograd, and the
-- checks of the C entry points' statuses and messages. Sizes are (N, C, spatial...), 4-D or 5-D.

local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local C = require("lumen.C")
local wrap = require("lumen.tensor").wrap

local M = {}

M.DEV = "cuda:0"
M.CPU = { device = "cpu" }

-- { dtype, name, tolerance against the CPU }
M.DTYPES = {
   { lm.float32, "float32", 1e-5 },
   { lm.float64, "float64", 1e-12 },
   { lm.float16, "float16", 1e-2 },
   { lm.bfloat16, "bfloat16", 1e-2 },
}

-- a deterministic generator of whole numbers in [0, n) for the shapes (the values come from lm's
-- seeded RNG): an LCG from seed, taken modulo n, or (high) from its high bits, since its low bits
-- repeat with short periods
function M.generator(seed, high)
   return function(n)
      seed = (seed * 1103515245 + 12345) % 2147483648
      if high then return math.floor(seed / 65536) % n end
      return seed % n
   end
end

-- same sizes and strides, values within tol (NaN equals NaN); a is on cuda:0, b on the CPU
function M.same(a, b, tol, what)
   assert(a:device() == M.DEV, what .. ": result on " .. a:device())
   H.assert_sizes(a, b:size(), what)
   if a:numel() > 0 then H.assert_strides(a, b:stride(), what) end
   -- exact when tol is 0 (NaN equals NaN; int64 indices are exact in a double)
   H.assert_close(a:cpu():double(), H.values(b:double()), tol, what)
end

-- x (CPU) with ties (multiples of 0.5), and NaN / -inf when special, of dtype dt in fmt; when
-- strided, a narrowed view (along the last dimension) of a wider tensor (made on each device from
-- the same values): base_cpu, base_dev, view
function M.inputs(sizes, dt, fmt, special, strided)
   local last = #sizes
   local big = {}
   for i = 1, last do big[i] = sizes[i] end
   big[last] = sizes[last] + (strided and 3 or 0)
   local b = (lm.randn(big, M.CPU) * 2):round() / 2
   if special then
      b = lm.where(lm.rand(big, M.CPU):lt(0.1), -1 / 0, b)
      b = lm.where(lm.rand(big, M.CPU):lt(0.1), 0 / 0, b)
   end
   b = b:to(dt):contiguous(fmt)
   local function view(t)
      if strided then return t:narrow(last, 2, sizes[last]) end
      return t
   end
   return b, b:to(M.DEV), view
end

-- the gradient of sum(f(x) * g) on both devices: the base tensors' .grad
function M.grads(f, bc, bd, view, g)
   local xc = bc:clone():requires_grad_(true)
   local xd = bd:clone():requires_grad_(true)
   local yc, yd = f(view(xc)), f(view(xd))
   yc:backward(g)
   yd:backward(g:to(M.DEV))
   return xc.grad, xd.grad, yc, yd
end

-- a max pool (pool: F.max_pool2d or F.max_pool3d) with options opts against the CPU: values and
-- indices exactly (a maximum is one of the inputs), and the gradient through autograd for one
-- random grad_output in fmt (when the CPU computes the output; an empty one is an error there)
function M.check_max_pool(pool, opts, bc, bd, view, dt, fmt, what)
   local ok = pcall(pool, view(bc), opts)
   if not ok then return end
   local ro = { return_indices = true }
   for key, v in pairs(opts) do ro[key] = v end
   local yc, ic = pool(view(bc), ro)
   local yd, id = pool(view(bd), ro)
   M.same(yd, yc, 0, what .. " values")
   M.same(id, ic, 0, what .. " indices")
   local g = lm.randn(yc:size(), M.CPU):to(dt[1]):contiguous(fmt)
   local gc, gd = M.grads(function(t) return pool(t, opts) end, bc, bd, view, g)
   M.same(gd, gc, dt[3], what .. " grad")
end

-- f (a pool with its options) against the CPU: its values (when the CPU computes them; an
-- options set that leaves the output empty is an error there, and then nothing is checked) and
-- the gradient for one random grad_output in fmt; dt: an entry of DTYPES
function M.check_pool(f, bc, bd, view, dt, fmt, what)
   local ok, yc = pcall(f, view(bc))
   if not ok then return end
   M.same(f(view(bd)), yc, dt[3], what .. " values")
   local g = lm.randn(yc:size(), M.CPU):to(dt[1]):contiguous(fmt)
   local gc, gd = M.grads(f, bc, bd, view, g)
   M.same(gd, gc, dt[3], what .. " grad")
end

-- the adaptive pools at one output size against the CPU: avg's values, max's values and indices
-- (maxi returns both), and both gradients for one random grad_output in fmt (maxg: max's values
-- alone, as autograd sees it)
function M.check_adaptive(avg, maxi, maxg, bc, bd, view, dt, fmt, what)
   local yc = avg(view(bc))
   M.same(avg(view(bd)), yc, dt[3], what .. " avg values")
   local mc, ic = maxi(view(bc))
   local md, id = maxi(view(bd))
   M.same(md, mc, 0, what .. " max values")
   M.same(id, ic, 0, what .. " max indices")
   local g = lm.randn(yc:size(), M.CPU):to(dt[1]):contiguous(fmt)
   local gc, gd = M.grads(avg, bc, bd, view, g)
   M.same(gd, gc, dt[3], what .. " avg grad")
   gc, gd = M.grads(maxg, bc, bd, view, g)
   M.same(gd, gc, dt[3], what .. " max grad")
end

-- the global average (a model's head: the adaptive average to a few outputs) of case
-- { sizes, output_size } in fmt against the CPU in every dtype: values and gradient, and avg_pool
-- with a kernel of the input's spatial size (the same reduction); adaptive, avg: the rank's
-- adaptive_avg_pool and avg_pool, name: avg's name
function M.check_global(adaptive, avg, name, c, fmt)
   for _, dt in ipairs(M.DTYPES) do
      local what = ("global %s %s %s"):format(table.concat(c[1], "x"), tostring(fmt), dt[2])
      local bc, bd, view = M.inputs(c[1], dt[1], fmt, false, false)
      local yc = adaptive(bc, c[2])
      M.same(adaptive(bd, c[2]), yc, dt[3], what)
      local g = lm.randn(yc:size(), M.CPU):to(dt[1]):contiguous(fmt)
      local gc, gd = M.grads(function(t) return adaptive(t, c[2]) end, bc, bd, view, g)
      M.same(gd, gc, dt[3], what .. " grad")
      local k = {}
      for i = 3, #c[1] do k[#k + 1] = c[1][i] end
      M.same(avg(bd, { kernel_size = k }), avg(bc, { kernel_size = k }), dt[3],
             what .. " " .. name)
   end
end

-- a C entry point's status: success
function M.ok(st) assert(st == 0, ffi.string(C.lm_last_error())) end

-- call(f, ...): f(...) (which writes its result into pa[0]) must succeed; its result wrapped
function M.caller(pa)
   return function(f, ...)
      pa[0] = nil
      M.ok(f(...))
      return wrap(pa[0])
   end
end

-- a C entry point's status: LM_ERR_ARG, with a message holding needle
function M.fails(st, needle, what)
   assert(st ~= 0, what .. ": expected an error")
   -- (plain Lua's assert here: busted gives luassert's only to the spec files)
   assert(tonumber(st) == tonumber(C.LM_ERR_ARG),
          what .. ": status " .. tonumber(st) .. ", expected " .. tonumber(C.LM_ERR_ARG))
   local msg = ffi.string(C.lm_last_error())
   assert(msg:find(needle, 1, true), what .. ": message " .. msg .. " lacks " .. needle)
end

return M
