-- The 3-D pooling kernels of the CUDA backend (kernels/cuda/pool3d.cu) against the CPU's
-- (kernels/cpu/pool3d.c): max_pool3d, avg_pool3d, adaptive_avg_pool3d, adaptive_max_pool3d,
-- forward and backward (through autograd and through the C entry points), random shapes, both
-- memory formats (contiguous and channels_last_3d), non-dense inputs, float32 / float64 /
-- float16 / bfloat16, NaN and -inf, int64 indices exactly the CPU's, every max_pool3d backward
-- route (the gather given the geometry; without it atomics when no voxel is named more than
-- twice, the CPU's scatter otherwise; the scatter for hand-made indices off their windows), the
-- output formats, and bad input. Runs on cuda:0 (a GPU, or the emulated build:
-- LUMEN_CUDA_LIB=build/liblumen_cuda_emu.so); skips without one.

local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local C = require("lumen.C")
local T = require("lumen.tensor")
local wrap = T.wrap

local CL3, CONTIG = lm.channels_last_3d, lm.contiguous_format
local PC = require("spec.cuda_pool_common")
local DEV, CPU, DTYPES = PC.DEV, PC.CPU, PC.DTYPES
local same, inputs, grads = PC.same, PC.inputs, PC.grads
-- the shapes: an LCG from the seed (high bits: cuda_pool_common.lua)
local rnd = PC.generator(1931, true)

local function i3(a) return ffi.new("int64_t[3]", a[1], a[2], a[3]) end

describe("CUDA 3-D pooling (kernels/cuda/pool3d.cu) against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local function cases(n, body)
      for i = 1, n do
         local dt = DTYPES[(i - 1) % #DTYPES + 1]
         local fmt = (rnd(2) == 0) and CL3 or CONTIG
         local c = 1 + rnd(4) + (rnd(3) == 0 and 7 or 0)
         local sizes = { 1 + rnd(2), c, 2 + rnd(5), 3 + rnd(6), 3 + rnd(6) }
         body(dt, fmt, sizes, rnd(3) == 0, i)
      end
   end

   it("max_pool3d forward, indices and gradients", function()
      cases(40, function(dt, fmt, sizes, strided, i)
         local k, d, p, s = {}, {}, {}, {}
         for j = 1, 3 do
            k[j] = 1 + rnd(3)
            d[j] = 1 + rnd(2)
            p[j] = rnd(math.floor(((k[j] - 1) * d[j] + 1) / 2) + 1)
            s[j] = 1 + rnd(3)
         end
         local opts = { kernel_size = k, stride = s, padding = p, dilation = d,
                        ceil_mode = rnd(2) == 0 }
         local what = ("max_pool3d %s %s %s %d"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, i % 3 == 0, strided)
         PC.check_max_pool(F.max_pool3d, opts, bc, bd, view, dt, fmt, what)
      end)
   end)

   it("avg_pool3d forward and gradients", function()
      cases(40, function(dt, fmt, sizes, strided, i)
         local k, p, s = {}, {}, {}
         for j = 1, 3 do
            k[j] = 1 + rnd(3)
            p[j] = rnd(math.floor(k[j] / 2) + 1)
            s[j] = 1 + rnd(3)
         end
         local opts = { kernel_size = k, stride = s, padding = p, ceil_mode = rnd(2) == 0,
                        count_include_pad = rnd(2) == 0,
                        divisor_override = rnd(4) == 0 and (1 + rnd(5)) or nil }
         local what = ("avg_pool3d %s %s %s %d"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, false, strided)
         PC.check_pool(function(t) return F.avg_pool3d(t, opts) end, bc, bd, view, dt, fmt, what)
      end)
   end)

   it("adaptive_avg_pool3d and adaptive_max_pool3d, forward and gradients", function()
      cases(40, function(dt, fmt, sizes, strided, i)
         local osz = { rnd(sizes[3] + 2), rnd(sizes[4] + 3), rnd(sizes[5] + 3) }
         if rnd(4) == 0 then osz = { 1, 1, 1 } end
         if osz[1] * osz[2] * osz[3] == 0 and rnd(2) == 0 then osz[1], osz[2], osz[3] = 2, 1, 3 end
         local what = ("adaptive %s %s %s -> %s %d"):format(dt[2], tostring(fmt),
            table.concat(sizes, "x"), table.concat(osz, "x"), i)
         local bc, bd, view = inputs(sizes, dt[1], fmt, i % 4 == 0, strided)
         PC.check_adaptive(function(t) return F.adaptive_avg_pool3d(t, osz) end,
                           function(t) return F.adaptive_max_pool3d(t, osz, true) end,
                           function(t) return (F.adaptive_max_pool3d(t, osz)) end,
                           bc, bd, view, dt, fmt, what)
      end)
   end)

   it("the video head (global average to 1x1x1) and large windows", function()
      for _, c in ipairs({
         { { 2, 64, 2, 7, 7 }, { 1, 1, 1 } }, { { 1, 3, 4, 20, 18 }, { 1, 1, 1 } },
         { { 2, 5, 8, 9, 7 }, { 2, 1, 3 } }, { { 3, 33, 1, 7, 7 }, { 1, 1, 1 } },
      }) do
         for _, fmt in ipairs({ CL3, CONTIG }) do
            -- values and gradient, and avg_pool3d with a whole-volume kernel (the same reduction)
            PC.check_global(F.adaptive_avg_pool3d, F.avg_pool3d, "avg_pool3d", c, fmt)
         end
      end
   end)

   -- the C entry points
   local pa = ffi.new("lm_tensor*[1]")
   local pb = ffi.new("lm_tensor*[1]")
   local ok, call, fails = PC.ok, PC.caller(pa), PC.fails

   it("max_pool3d backward, every route bit-identical to the CPU: autograd (the gather over the "
      .. "windows), and without the geometry: voxels named once or twice (atomics), more often "
      .. "(the scatter)", function()
      for _, fmt in ipairs({ CL3, CONTIG }) do
         for _, dt in ipairs({ DTYPES[1], DTYPES[2] }) do
            -- constant input: every window keeps its first tap (with padding, the first windows
            -- share theirs: up to 8 outputs on a voxel); random ties: mixed
            local x = lm.ones({ 2, 3, 4, 5, 6 }, CPU):to(dt[1]):contiguous(fmt)
            local r = ((lm.randn({ 2, 3, 4, 5, 6 }, CPU) * 2):round() / 2):to(dt[1]):contiguous(fmt)
            for _, c in ipairs({
               { x, { 3, 3, 3 }, { 1, 1, 1 }, { 1, 1, 1 }, { 1, 1, 1 } },
               { x, { 2, 2, 2 }, { 2, 2, 2 }, { 0, 0, 0 }, { 1, 1, 1 } },
               { r, { 2, 2, 2 }, { 2, 2, 2 }, { 0, 0, 0 }, { 1, 1, 1 } },
               { r, { 1, 2, 2 }, { 1, 1, 2 }, { 0, 1, 0 }, { 1, 1, 1 } },
               { r, { 3, 3, 3 }, { 1, 1, 1 }, { 1, 1, 1 }, { 1, 1, 1 } },
               { r, { 2, 3, 2 }, { 1, 2, 1 }, { 1, 1, 0 }, { 2, 1, 3 } },
            }) do
               local K, S, P, D = i3(c[2]), i3(c[3]), i3(c[4]), i3(c[5])
               local what = ("%s %s k%s s%s p%s d%s"):format(dt[2], tostring(fmt),
                  table.concat(c[2]), table.concat(c[3]), table.concat(c[4]), table.concat(c[5]))
               local opts = { kernel_size = c[2], stride = c[3], padding = c[4], dilation = c[5] }
               local xc = c[1]
               pa[0], pb[0] = nil, nil
               ok(C.lm_max_pool3d(xc._c, K, S, P, D, 0, pa, pb))
               local out, ind = wrap(pa[0]), wrap(pb[0])
               local g = lm.randn(out:size(), CPU):to(dt[1]):contiguous(fmt)
               local ref = call(C.lm_max_pool3d_backward, g._c, xc._c, ind._c, pa)
               local xd, gd, idd = xc:to(DEV), g:to(DEV), ind:to(DEV)
               same(call(C.lm_max_pool3d_backward, gd._c, xd._c, idd._c, pa), ref, 0,
                    what .. " no geometry")
               same(call(C.lm_max_pool3d_backward_geom, gd._c, xd._c, idd._c, K, S, P, D, 0, pa),
                    ref, 0, what .. " geometry")
               assert(lm.equal(call(C.lm_max_pool3d_backward_geom, g._c, xc._c, ind._c, K, S, P,
                                    D, 0, pa), ref), what .. " geometry on the CPU")
               local gc, gdv = grads(function(t) return F.max_pool3d(t, opts) end, xc, xd,
                                     function(t) return t end, g)
               same(gdv, gc, 0, what .. " autograd")
               same(gdv, ref, 0, what .. " autograd = the C backward")
            end
         end
      end
   end)

   it("4-D inputs (C, D, H, W) and empty batches", function()
      local x = lm.randn({ 3, 5, 6, 7 }, CPU)
      local xd = x:to(DEV)
      local o = { kernel_size = 3, stride = 2, padding = 1, return_indices = true }
      local yc, ic = F.max_pool3d(x, o)
      local yd, id = F.max_pool3d(xd, o)
      same(yd, yc, 0, "4-D max")
      same(id, ic, 0, "4-D max indices")
      same(F.avg_pool3d(xd, { kernel_size = 2 }), F.avg_pool3d(x, { kernel_size = 2 }), 1e-6,
           "4-D avg")
      same(F.adaptive_avg_pool3d(xd, { 4, 3, 2 }), F.adaptive_avg_pool3d(x, { 4, 3, 2 }), 1e-6,
           "4-D adaptive avg")
      local mc, jc = F.adaptive_max_pool3d(x, { 2, 4, 3 }, true)
      local md, jd = F.adaptive_max_pool3d(xd, { 2, 4, 3 }, true)
      same(md, mc, 0, "4-D adaptive max")
      same(jd, jc, 0, "4-D adaptive max indices")
      local gc, gd = grads(function(t) return F.max_pool3d(t, 2) end, x, xd,
                           function(t) return t end, lm.randn({ 3, 2, 3, 3 }, CPU))
      same(gd, gc, 1e-6, "4-D max grad")
      local e = lm.randn({ 0, 3, 4, 5, 5 }, CPU)
      same(F.max_pool3d(e:to(DEV), 2), F.max_pool3d(e, 2), 0, "empty batch")
      same(F.adaptive_avg_pool3d(e:to(DEV), 1), F.adaptive_avg_pool3d(e, 1), 0,
           "empty batch, adaptive")
   end)

   it("max backward from hand-made indices: the CPU's scatter, its errors", function()
      for _, fmt in ipairs({ CL3, CONTIG }) do
         local x = lm.randn({ 2, 3, 4, 5, 6 }, CPU):contiguous(fmt)
         local V = 4 * 5 * 6
         for _, adaptive in ipairs({ false, true }) do
            pa[0], pb[0] = nil, nil
            if adaptive then
               ok(C.lm_adaptive_max_pool3d(x._c, i3({ 2, 3, 2 }), pa, pb))
            else
               ok(C.lm_max_pool3d(x._c, i3({ 2, 2, 2 }), nil, nil, nil, 0, pa, pb))
            end
            local out, ind = wrap(pa[0]), wrap(pb[0])
            local what = (adaptive and "adaptive " or "") .. tostring(fmt)
            local bws = { adaptive and C.lm_adaptive_max_pool3d_backward
                                   or C.lm_max_pool3d_backward }
            if not adaptive then
               -- given the geometry: the check finds the indices off their windows, and the
               -- CPU's scatter runs
               bws[2] = function(g_, x_, i_, p_)
                  return C.lm_max_pool3d_backward_geom(g_, x_, i_, i3({ 2, 2, 2 }), nil, nil, nil,
                                                       0, p_)
               end
            end
            local g = lm.randn(out:size(), CPU):contiguous(fmt)
            -- every index of sample 2 moved to voxel V - 1 (the last): inside the volume, off
            -- most windows, named many times; -1 (no tap) skipped
            local moved = ind:clone():contiguous(fmt)
            moved:narrow(1, 2, 1):fill_(V - 1)
            moved:select(1, 1):select(1, 1):select(1, 1):select(1, 1):select(1, 1):fill_(-1)
            for b, bw in ipairs(bws) do
               local w = what .. (b == 2 and " geometry" or "")
               same(call(bw, g:to(DEV)._c, x:to(DEV)._c, moved:to(DEV)._c, pa),
                    call(bw, g._c, x._c, moved._c, pa), 0, w .. " moved indices")
               for _, v in ipairs({ V, -2 }) do
                  local bad = ind:clone():contiguous(fmt)
                  bad:select(1, 1):select(1, 2):select(1, 1):select(1, 1):select(1, 1):fill_(v)
                  pa[0] = nil
                  fails(bw(g:to(DEV)._c, x:to(DEV)._c, bad:to(DEV)._c, pa),
                        "1 indices are out of range for an input volume of " .. V, w .. " " .. v)
               end
            end
         end
      end
   end)

   it("keeps the memory format of outputs, indices and gradients", function()
      local x = lm.randn({ 2, 5, 4, 6, 6 }, CPU):contiguous(CL3):to(DEV):requires_grad_(true)
      for _, f in ipairs({
         function(t) return F.max_pool3d(t, { kernel_size = 3, stride = 2, padding = 1,
                                              return_indices = true }) end,
         function(t) return F.avg_pool3d(t, { kernel_size = 2 }) end,
         function(t) return F.adaptive_avg_pool3d(t, 1) end,
         function(t) return F.adaptive_max_pool3d(t, { 2, 4, 3 }, true) end,
      }) do
         x.grad = nil
         local y, i = f(x)
         assert(y:is_contiguous(CL3), "output channels_last_3d")
         assert.equal(DEV, y:device())
         if i then assert(i:is_contiguous(CL3), "indices channels_last_3d") end
         y:sum():backward()
         assert(x.grad:is_contiguous(CL3), "grad channels_last_3d")
         assert.equal(DEV, x.grad:device())
      end
   end)

   it("bad input: clear errors, as on the CPU", function()
      local xd = lm.randn({ 1, 2, 4, 4, 4 }, CPU):to(DEV)
      H.assert_error_like("max_pool3d", "half", F.max_pool3d, xd, { kernel_size = 2, padding = 2 })
      H.assert_error_like("avg_pool3d", "output size is too small", F.avg_pool3d, xd, 5)
      H.assert_error_like("adaptive_avg_pool3d", "5-d", F.adaptive_avg_pool3d,
                          lm.randn({ 4, 4 }, CPU):to(DEV), 1)
      H.assert_error_like("max_pool3d", "dtype", F.max_pool3d,
                          lm.ones({ 1, 1, 4, 4, 4 }, { dtype = lm.int64, device = DEV }), 2)
      -- grad_output on another device than the input
      pa[0], pb[0] = nil, nil
      ok(C.lm_max_pool3d(xd._c, i3({ 2, 2, 2 }), nil, nil, nil, 0, pa, pb))
      local out, ind = wrap(pa[0]), wrap(pb[0])
      pa[0] = nil
      local st = C.lm_max_pool3d_backward(lm.ones_like(out):cpu()._c, xd._c, ind._c, pa)
      assert(st ~= 0 and ffi.string(C.lm_last_error()):find("same device", 1, true),
             "mixed devices: " .. ffi.string(C.lm_last_error()))
   end)
end)
