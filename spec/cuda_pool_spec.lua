-- The pooling kernels of the CUDA backend (kernels/cuda/pool.cu) against the CPU's
-- (kernels/cpu/pool*.c): max / avg / adaptive pools, forward and backward (through autograd and
-- through the C entry points), random shapes, both memory formats, non-dense inputs, float32 /
-- float64 / float16 / bfloat16, NaN and -inf, the output formats, and bad input. Runs on cuda:0
-- (a GPU, or the emulated build: LUMEN_CUDA_LIB=build/liblumen_cuda_emu.so); skips without one.

local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local C = require("lumen.C")
local T = require("lumen.tensor")
local wrap = T.wrap

local CL, CONTIG = lm.channels_last, lm.contiguous_format
local PC = require("spec.cuda_pool_common")
local DEV, CPU, DTYPES = PC.DEV, PC.CPU, PC.DTYPES
local same, inputs = PC.same, PC.inputs
-- the shapes: an LCG from the seed (cuda_pool_common.lua)
local rnd = PC.generator(4242)

describe("CUDA pooling (kernels/cuda/pool.cu) against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local function cases(n, body)
      for i = 1, n do
         local dt = DTYPES[(i - 1) % #DTYPES + 1]
         local fmt = (rnd(2) == 0) and CL or CONTIG
         local c = 1 + rnd(5) + (rnd(3) == 0 and 13 or 0)
         local sizes = { 1 + rnd(3), c, 3 + rnd(9), 3 + rnd(9) }
         body(dt, fmt, sizes, rnd(3) == 0, i)
      end
   end

   it("max_pool2d forward, indices and gradients", function()
      cases(48, function(dt, fmt, sizes, strided, i)
         local k = { 1 + rnd(3), 1 + rnd(3) }
         local d = { 1 + rnd(2), 1 + rnd(2) }
         local p = { rnd(math.floor(((k[1] - 1) * d[1] + 1) / 2) + 1),
                     rnd(math.floor(((k[2] - 1) * d[2] + 1) / 2) + 1) }
         local opts = { kernel_size = k, stride = { 1 + rnd(3), 1 + rnd(3) }, padding = p,
                        dilation = d, ceil_mode = rnd(2) == 0 }
         local what = ("max_pool2d %s %s %s %s"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, i % 3 == 0, strided)
         -- the backward through autograd: tap numbers (channels-last) or int64 indices, with
         -- the geometry
         PC.check_max_pool(F.max_pool2d, opts, bc, bd, view, dt, fmt, what)
      end)
   end)

   it("avg_pool2d forward and gradients", function()
      cases(48, function(dt, fmt, sizes, strided, i)
         local k = { 1 + rnd(4), 1 + rnd(4) }
         local opts = { kernel_size = k, stride = { 1 + rnd(3), 1 + rnd(3) },
                        padding = { rnd(math.floor(k[1] / 2) + 1), rnd(math.floor(k[2] / 2) + 1) },
                        ceil_mode = rnd(2) == 0, count_include_pad = rnd(2) == 0,
                        divisor_override = rnd(4) == 0 and (1 + rnd(5)) or nil }
         local what = ("avg_pool2d %s %s %s %s"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, false, strided)
         PC.check_pool(function(t) return F.avg_pool2d(t, opts) end, bc, bd, view, dt, fmt, what)
      end)
   end)

   it("adaptive_avg_pool2d and adaptive_max_pool2d, forward and gradients", function()
      cases(48, function(dt, fmt, sizes, strided, i)
         local osz = { rnd(sizes[3] + 3), rnd(sizes[4] + 3) }
         if rnd(4) == 0 then osz = { 1, 1 } end
         if osz[1] == 0 and osz[2] == 0 then osz[1] = 1 end
         local what = ("adaptive %s %s %s -> %dx%d %s"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), osz[1], osz[2], i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, i % 4 == 0, strided)
         PC.check_adaptive(function(t) return F.adaptive_avg_pool2d(t, osz) end,
                           function(t) return F.adaptive_max_pool2d(t, osz) end,
                           function(t) return (F.adaptive_max_pool2d(t, osz)) end,
                           bc, bd, view, dt, fmt, what)
      end)
   end)

   it("global average pooling (the ResNet head) and large windows: the split kernels", function()
      -- few outputs with windows of >= 64 pixels take the split kernel (8 or 32 threads an
      -- output); many outputs the one-thread-per-output kernel
      for _, c in ipairs({
         { { 2, 40, 12, 12 }, { 1, 1 } }, { { 1, 3, 70, 50 }, { 1, 1 } },
         { { 2, 5, 33, 17 }, { 2, 1 } }, { { 3, 67, 7, 7 }, { 1, 1 } },
         { { 1, 9, 40, 40 }, { 3, 5 } },
      }) do
         for _, fmt in ipairs({ CL, CONTIG }) do
            -- values and gradient, and avg_pool2d with a whole-plane kernel (the same reduction)
            PC.check_global(F.adaptive_avg_pool2d, F.avg_pool2d, "avg_pool2d", c, fmt)
         end
      end
   end)

   it("3-D inputs (C, H, W) and empty batches", function()
      local x = lm.randn({ 3, 9, 8 }, CPU)
      local xd = x:to(DEV)
      same(F.max_pool2d(xd, { kernel_size = 3, stride = 2, padding = 1 }),
           F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 }), 0, "3-D max")
      same(F.avg_pool2d(xd, { kernel_size = 2 }), F.avg_pool2d(x, { kernel_size = 2 }), 1e-6,
           "3-D avg")
      same(F.adaptive_avg_pool2d(xd, { 4, 3 }), F.adaptive_avg_pool2d(x, { 4, 3 }), 1e-6,
           "3-D adaptive avg")
      local e = lm.randn({ 0, 3, 5, 5 }, CPU)
      same(F.max_pool2d(e:to(DEV), { kernel_size = 2 }), F.max_pool2d(e, { kernel_size = 2 }), 0,
           "empty batch")
   end)

   -- the C entry points: every backward (the geometry, tap numbers, none) against the CPU's
   local pa = ffi.new("lm_tensor*[1]")
   local pb = ffi.new("lm_tensor*[1]")
   local function i2(a) return ffi.new("int64_t[2]", a[1], a[2]) end
   local ok, call, fails = PC.ok, PC.caller(pa), PC.fails

   it("backward from the same saved indices, with the same grad_output", function()
      for i = 1, 24 do
         local dt = ({ lm.float32, lm.float64, lm.bfloat16 })[(i - 1) % 3 + 1]
         local tol = dt == lm.bfloat16 and 1e-2 or 1e-6
         local fmt = i % 2 == 0 and CL or CONTIG
         local sizes = { 1 + rnd(2), 1 + rnd(20), 4 + rnd(9), 4 + rnd(9) }
         local K, S = i2({ 1 + rnd(3), 1 + rnd(3) }), i2({ 1 + rnd(2), 1 + rnd(2) })
         local P, D = i2({ rnd(2), rnd(2) }), i2({ 1 + rnd(2), 1 + rnd(2) })
         local what = ("saved %d %s %s"):format(i, tostring(dt), tostring(fmt))
         local xc = ((lm.randn(sizes, CPU) * 2):round() / 2):to(dt):contiguous(fmt)
         pa[0], pb[0] = nil, nil
         if C.lm_max_pool2d(xc._c, K, S, P, D, 1, pa, pb) == 0 then
            local out, ind = wrap(pa[0]), wrap(pb[0])
            pa[0], pb[0] = nil, nil
            ok(C.lm_max_pool2d_taps(xc._c, K, S, P, D, 1, pa, pb))
            local taps = wrap(pb[0])
            local g = lm.randn(out:size(), CPU):to(dt):contiguous(fmt)
            local xd, gd, indd, tapsd = xc:to(DEV), g:to(DEV), ind:to(DEV), taps:to(DEV)
            same(call(C.lm_max_pool2d_backward_geom, gd._c, xd._c, indd._c, K, S, P, D, 1, pa),
                 call(C.lm_max_pool2d_backward_geom, g._c, xc._c, ind._c, K, S, P, D, 1, pa), tol,
                 what .. " geom")
            same(call(C.lm_max_pool2d_taps_backward, gd._c, xd._c, tapsd._c, K, S, P, D, 1, pa),
                 call(C.lm_max_pool2d_taps_backward, g._c, xc._c, taps._c, K, S, P, D, 1, pa), tol,
                 what .. " taps")
            same(call(C.lm_max_pool2d_backward, gd._c, xd._c, indd._c, pa),
                 call(C.lm_max_pool2d_backward, g._c, xc._c, ind._c, pa), tol, what .. " scatter")
         end
      end
   end)

   it("adaptive_max_pool2d backward from indices off their windows: the CPU's scatter", function()
      for _, fmt in ipairs({ CL, CONTIG }) do
         local x = lm.randn({ 2, 3, 6, 5 }, CPU):contiguous(fmt)
         pa[0], pb[0] = nil, nil
         ok(C.lm_adaptive_max_pool2d(x._c, i2({ 3, 2 }), pa, pb))
         local out, ind = wrap(pa[0]), wrap(pb[0])
         -- every index moved to pixel 29 (the last): inside the plane, outside most windows
         local bad = lm.full(ind:size(), 29, { dtype = lm.int64, device = "cpu" }):contiguous(fmt)
         bad:narrow(1, 1, 1):copy_(ind:narrow(1, 1, 1))
         local g = lm.randn(out:size(), CPU):contiguous(fmt)
         same(call(C.lm_adaptive_max_pool2d_backward, g:to(DEV)._c, x:to(DEV)._c, bad:to(DEV)._c,
                   pa),
              call(C.lm_adaptive_max_pool2d_backward, g._c, x._c, bad._c, pa), 1e-6,
              "off-window indices " .. tostring(fmt))
      end
   end)

   it("keeps the memory format of outputs and gradients", function()
      local x = lm.randn({ 2, 5, 9, 9 }, CPU):contiguous(CL):to(DEV):requires_grad_(true)
      for _, f in ipairs({
         function(t) return F.max_pool2d(t, { kernel_size = 3, stride = 2, padding = 1 }) end,
         function(t) return F.avg_pool2d(t, { kernel_size = 2 }) end,
         function(t) return F.adaptive_avg_pool2d(t, 1) end,
         function(t) return (F.adaptive_max_pool2d(t, { 4, 3 })) end,
      }) do
         x.grad = nil
         local y = f(x)
         assert(y:is_contiguous(CL), "output channels-last")
         y:sum():backward()
         assert(x.grad:is_contiguous(CL), "grad channels-last")
         assert.equal(DEV, x.grad:device())
      end
   end)

   it("bad input: clear errors", function()
      local x = lm.randn({ 1, 2, 5, 5 }, CPU):contiguous(CL)
      local K, S, P = i2({ 3, 3 }), i2({ 2, 2 }), i2({ 1, 1 })
      pa[0], pb[0] = nil, nil
      ok(C.lm_max_pool2d(x._c, K, S, P, nil, 0, pa, pb))
      local out, ind = wrap(pa[0]), wrap(pb[0])
      pa[0], pb[0] = nil, nil
      ok(C.lm_max_pool2d_taps(x._c, K, S, P, nil, 0, pa, pb))
      local taps = wrap(pb[0])
      for _, fmt in ipairs({ CL, CONTIG }) do
         local xd = x:contiguous(fmt):to(DEV)
         local g = lm.ones_like(out):contiguous(fmt):to(DEV)
         local bad = ind:clone():contiguous(fmt)
         bad:select(1, 1):select(1, 1):select(1, 1):select(1, 1):fill_(24)
         pa[0] = nil
         local st = C.lm_max_pool2d_backward_geom(g._c, xd._c, bad:to(DEV)._c, K, S, P, nil, 0, pa)
         if fmt == CL then
            fails(st, "1 indices are out of range for their pooling windows", "off window")
         else
            ok(st) -- contiguous: the CPU's scatter takes any index inside the plane
            local got = wrap(pa[0])
            local ref = call(C.lm_max_pool2d_backward_geom, lm.ones_like(out):contiguous(fmt)._c,
                             x:contiguous(fmt)._c, bad._c, K, S, P, nil, 0, pa)
            same(got, ref, 0, "off window, contiguous")
         end
         bad:select(1, 1):select(1, 1):select(1, 1):select(1, 1):fill_(25)
         pa[0] = nil
         fails(C.lm_max_pool2d_backward_geom(g._c, xd._c, bad:to(DEV)._c, K, S, P, nil, 0, pa),
               "out of range", "off plane")
         pa[0] = nil
         fails(C.lm_max_pool2d_backward(g._c, xd._c, bad:to(DEV)._c, pa),
               "1 indices are out of range for an input plane of 25", "off plane, no geometry")
         pa[0] = nil
         fails(C.lm_adaptive_max_pool2d_backward(lm.ones({ 1, 2, 3, 3 }):contiguous(fmt):to(DEV)._c,
                                                 xd._c, bad:to(DEV)._c, pa),
               "out of range for an input plane", "adaptive off plane")
         for _, v in ipairs({ 9, 200, 0 }) do
            local bt = taps:clone():contiguous(fmt)
            bt:select(1, 1):select(1, 2):select(1, 1):select(1, 1):fill_(v)
            pa[0] = nil
            fails(C.lm_max_pool2d_taps_backward(g._c, xd._c, bt:to(DEV)._c, K, S, P, nil, 0, pa),
                  "taps are out of range for their pooling windows", "tap " .. v)
         end
      end
      -- errors the front end raises before the kernel, on the device as on the CPU
      local xd = x:to(DEV)
      H.assert_error_like("max_pool2d", "pad should be at most half", function()
         return F.max_pool2d(xd, { kernel_size = 2, padding = 2 })
      end)
      H.assert_error_like("avg_pool2d", "too small", function()
         return F.avg_pool2d(xd, { kernel_size = 7 })
      end)
      H.assert_error_like("adaptive_avg_pool2d", "4-D", function()
         return F.adaptive_avg_pool2d(lm.randn({ 5, 5 }, CPU):to(DEV), 2)
      end)
      -- grad_output on another device than the input
      pa[0] = nil
      local st = C.lm_max_pool2d_backward_geom(lm.ones_like(out)._c, xd._c, ind:to(DEV)._c, K, S,
                                               P, nil, 0, pa)
      assert(st ~= 0 and ffi.string(C.lm_last_error()):find("same device", 1, true),
             "mixed devices: " .. ffi.string(C.lm_last_error()))
   end)
end)
