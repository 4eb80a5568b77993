-- max_pool2d backward given the window geometry (kernels/cpu/pool_max.c):
--   lm_max_pool2d_backward_geom (int64 indices) and lm_max_pool2d_taps / _taps_backward (uint8 tap
--   numbers), against the scatter of lm_max_pool2d_backward: bit-identical gradients on random
--   shapes, both memory formats, float32 and float64, NaN / -inf / ties, every ISA path and thread
--   count; the tap numbers against the indices; F.max_pool2d's autograd through them; bad input.

local ffi = require("ffi")
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local C = require("lumen.C")
local T = require("lumen.tensor")
local wrap = T.wrap

local CL, CONTIG = lm.channels_last, lm.contiguous_format

local pa = ffi.new("lm_tensor*[1]")
local pb = ffi.new("lm_tensor*[1]")
local function i2(a) return ffi.new("int64_t[2]", a[1], a[2]) end

local function cerr() return ffi.string(C.lm_last_error()) end

-- t[a][b][c][d] = v (1-based), through a view
local function setv(t, a, b, c, d, v)
   t:select(1, a):select(1, b):select(1, c):select(1, d):fill_(v)
end
local function ok(st) assert(st == 0, cerr()) end

-- the same bytes, sizes and strides
local function same_bits(a, b, what)
   -- the bytes are read on the host: CPU copies of tensors on another device (strides kept)
   a, b = a:cpu(), b:cpu()
   local ca, cb = a._c, b._c
   assert(ca.dtype == cb.dtype and ca.ndim == cb.ndim, what .. ": dtype / rank")
   for d = 0, ca.ndim - 1 do
      assert(ca.sizes[d] == cb.sizes[d], what .. ": sizes")
      assert(ca.sizes[d] == 1 or ca.strides[d] == cb.strides[d],
             what .. ": strides " .. H.describe(a) .. " vs " .. H.describe(b))
   end
   local n = tonumber(ca.numel) * (ca.dtype == 0 and 4 or 8)
   local x = ffi.cast("const uint8_t *", C.lm_tensor_data(ca))
   local y = ffi.cast("const uint8_t *", C.lm_tensor_data(cb))
   for i = 0, n - 1 do
      if x[i] ~= y[i] then error(what .. ": bytes differ at byte " .. i, 2) end
   end
end

-- a deterministic generator for the shapes (the values come from lm's seeded RNG)
local seed = 12345
local function rnd(n)
   seed = (seed * 1103515245 + 12345) % 2147483648
   return seed % n
end
local function pick(t) return t[rnd(#t) + 1] end

-- values with ties (halves), and NaN / -inf when asked
local function input(sizes, dtype, fmt, special)
   local x = (lm.randn(sizes, { dtype = dtype }) * 2):round() / 2
   if special then
      x = lm.where(lm.rand(sizes):lt(0.15), -1 / 0, x)
      x = lm.where(lm.rand(sizes):lt(0.15), 0 / 0, x)
   end
   if #sizes == 3 then return x:contiguous() end
   return x:contiguous(fmt)
end

-- forward (indices and taps), then the three backwards; they must agree bit for bit
local function run_case(c)
   local x = input(c.sizes, c.dtype, c.fmt, c.special)
   local K, S, P, D = i2(c.k), i2(c.s), i2(c.p), i2(c.d)
   pa[0], pb[0] = nil, nil
   if C.lm_max_pool2d(x._c, K, S, P, D, c.ceil, pa, pb) ~= 0 then return false end
   local out, ind = wrap(pa[0]), wrap(pb[0])
   pa[0], pb[0] = nil, nil
   ok(C.lm_max_pool2d_taps(x._c, K, S, P, D, c.ceil, pa, pb))
   local out2, taps = wrap(pa[0]), wrap(pb[0])
   same_bits(out, out2, c.name .. " taps forward values")
   H.assert_dtype(taps, lm.uint8, c.name .. " taps")
   local g = lm.randn(out:size(), { dtype = c.dtype })
   if c.special then g = lm.where(lm.rand(out:size()):lt(0.05), 0 / 0, g) end
   g = #c.sizes == 3 and g:contiguous() or g:contiguous(c.fmt)
   pa[0] = nil
   ok(C.lm_max_pool2d_backward(g._c, x._c, ind._c, pa))
   local ref = wrap(pa[0])
   pa[0] = nil
   ok(C.lm_max_pool2d_backward_geom(g._c, x._c, ind._c, K, S, P, D, c.ceil, pa))
   same_bits(wrap(pa[0]), ref, c.name .. " geom backward")
   pa[0] = nil
   ok(C.lm_max_pool2d_taps_backward(g._c, x._c, taps._c, K, S, P, D, c.ceil, pa))
   same_bits(wrap(pa[0]), ref, c.name .. " taps backward")
   return true, x, ind, taps
end

local function random_case(dtype, fmt)
   local k = { rnd(4) + 1, rnd(4) + 1 }
   local d = { rnd(3) == 0 and 2 or 1, rnd(4) == 0 and 3 or 1 }
   local p = {}
   for i = 1, 2 do p[i] = rnd(math.floor(((k[i] - 1) * d[i] + 1) / 2) + 1) end
   local N, Cc = rnd(3) + 1, pick({ 1, 3, 7, 16, 17, 64, 65, 130 })
   local Hh, Ww = pick({ 1, 2, 3, 7, 8 }), pick({ 1, 2, 3, 7, 8 })
   local sizes = { N, Cc, Hh, Ww }
   if rnd(8) == 0 then sizes = { Cc, Hh, Ww } end
   local c = {
      sizes = sizes, k = k, s = { rnd(3) + 1, rnd(3) + 1 }, p = p, d = d, ceil = rnd(2),
      dtype = dtype, fmt = fmt, special = rnd(3) == 0,
   }
   c.name = ("%s k%dx%d s%dx%d p%dx%d d%dx%d ceil%d %s %s%s"):format(H.fmt_list(sizes), k[1], k[2],
      c.s[1], c.s[2], p[1], p[2], d[1], d[2], c.ceil, tostring(dtype), tostring(fmt),
      c.special and " nan/-inf" or "")
   return c
end

local isas = H.isas -- 1 (portable C), then this CPU's best

describe("max_pool2d backward with the window geometry", function()
   local threads0
   before_each(function() threads0 = lm.get_num_threads() end)
   after_each(function()
      C.lm_gemm_set_isa(0)
      lm.set_num_threads(threads0)
   end)

   it("is bit-identical to the scatter on random shapes, formats, dtypes, ISAs and threads",
      function()
         lm.manual_seed(7)
         local n = 0
         for _, isa in ipairs(isas()) do
            C.lm_gemm_set_isa(isa)
            for _, nt in ipairs({ 1, 2 }) do
               lm.set_num_threads(nt)
               for _ = 1, 40 do
                  for _, fmt in ipairs({ CL, CONTIG }) do
                     for _, dt in ipairs({ lm.float32, lm.float64 }) do
                        if run_case(random_case(dt, fmt)) then n = n + 1 end
                     end
                  end
               end
            end
         end
         assert(n > 200, "too few valid cases: " .. n)
      end)

   it("covers the listed channel counts and spatial sizes with padding, dilation and ceil_mode",
      function()
         lm.manual_seed(11)
         for _, isa in ipairs(isas()) do
            C.lm_gemm_set_isa(isa)
            for _, Cc in ipairs({ 1, 3, 7, 17, 64 }) do
               for _, hw in ipairs({ 1, 2, 7 }) do
                  for _, geo in ipairs({
                     { k = { 3, 3 }, s = { 2, 2 }, p = { 1, 1 }, d = { 1, 1 }, ceil = 0 },
                     { k = { 2, 3 }, s = { 1, 2 }, p = { 1, 1 }, d = { 2, 1 }, ceil = 1 },
                     { k = { 3, 2 }, s = { 2, 1 }, p = { 0, 1 }, d = { 1, 2 }, ceil = 1 },
                     { k = { 1, 1 }, s = { 2, 2 }, p = { 0, 0 }, d = { 1, 1 }, ceil = 0 },
                  }) do
                     for _, fmt in ipairs({ CL, CONTIG }) do
                        for _, dt in ipairs({ lm.float32, lm.float64 }) do
                           for _, special in ipairs({ false, true }) do
                              local c = {
                                 sizes = { 2, Cc, hw, hw + 1 }, k = geo.k, s = geo.s, p = geo.p,
                                 d = geo.d, ceil = geo.ceil, dtype = dt, fmt = fmt,
                                 special = special,
                              }
                              c.name = ("C%d hw%d k%dx%d %s %s"):format(Cc, hw, geo.k[1], geo.k[2],
                                 tostring(dt), tostring(fmt))
                              run_case(c)
                           end
                        end
                     end
                  end
               end
            end
         end
      end)

   it("gives the tap number of each index (255 for an empty window)", function()
      lm.manual_seed(3)
      for _, fmt in ipairs({ CL, CONTIG }) do
         for _, geo in ipairs({
            { k = { 3, 3 }, s = { 2, 2 }, p = { 1, 1 }, d = { 1, 1 } },
            { k = { 2, 2 }, s = { 1, 1 }, p = { 2, 1 }, d = { 3, 2 } }, -- has empty windows
         }) do
            local c = { sizes = { 2, 5, 1, 6 }, k = geo.k, s = geo.s, p = geo.p, d = geo.d,
                        ceil = 0, dtype = lm.float32, fmt = fmt, special = true, name = "taps" }
            local good, x, ind, taps = run_case(c)
            assert(good)
            local W = x:size(4)
            local it, ix = taps:contiguous():cpu(), ind:contiguous():cpu()
            local ti = ffi.cast("const uint8_t *", C.lm_tensor_data(it._c))
            local ii = ffi.cast("const int64_t *", C.lm_tensor_data(ix._c))
            local OH, OW = ind:size(3), ind:size(4)
            local empty = 0
            for e = 0, tonumber(it._c.numel) - 1 do
               local ow, oh = e % OW, math.floor(e / OW) % OH
               local idx, code = tonumber(ii[e]), ti[e]
               if idx == -1 then
                  assert.equal(255, code)
                  empty = empty + 1
               else
                  local i, j = math.floor(code / geo.k[2]), code % geo.k[2]
                  local ih = oh * geo.s[1] - geo.p[1] + i * geo.d[1]
                  local iw = ow * geo.s[2] - geo.p[2] + j * geo.d[2]
                  assert.equal(ih * W + iw, idx)
               end
            end
            if geo.d[1] == 3 then assert(empty > 0, "expected empty windows") end
         end
      end
   end)

   it("is what F.max_pool2d's autograd runs (with and without return_indices)", function()
      lm.manual_seed(5)
      for _, fmt in ipairs({ CL, CONTIG }) do
         for _, dt in ipairs({ lm.float32, lm.float64 }) do
            local x = input({ 2, 17, 9, 8 }, dt, fmt, true)
            local opts = { kernel_size = 3, stride = 2, padding = 1, ceil_mode = true }
            local _, ind = F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1,
                                             ceil_mode = true, return_indices = true })
            local ind0 = ind - 1
            local xr = x:clone():requires_grad_(true)
            local y = F.max_pool2d(xr, opts)
            local g = lm.randn(y:size(), { dtype = dt }):contiguous(fmt)
            y:backward(g)
            pa[0] = nil
            ok(C.lm_max_pool2d_backward(g._c, x._c, ind0:contiguous(fmt)._c, pa))
            local ref = wrap(pa[0])
            same_bits(xr.grad, ref, "autograd (taps)")
            -- return_indices: int64 indices, the geometry backward
            local xr2 = x:clone():requires_grad_(true)
            local y2 = F.max_pool2d(xr2, { kernel_size = 3, stride = 2, padding = 1,
                                           ceil_mode = true, return_indices = true })
            y2:backward(g, { retain_graph = true })
            same_bits(xr2.grad, ref, "autograd (indices)")
            y2:backward(g) -- the freed indices are computed again
            H.assert_close(xr2.grad, (ref * 2):totable(), 0, "twice (indices)")
            -- a retained graph runs the backward again (the saved indices / taps were freed)
            local xr3 = x:clone():requires_grad_(true)
            local y3 = F.max_pool2d(xr3, opts)
            y3:backward(g, { retain_graph = true })
            y3:backward(g)
            H.assert_close(xr3.grad, (ref * 2):totable(), 0, "twice")
         end
      end
   end)

   it("streams large cold NHWC gradients (max and avg pool), with the same values", function()
      -- a fresh block (the cache emptied first) is cold: the AVX-512 gathers write a 1.2 MB
      -- channels-last float32 grad_input with 64 channels through streaming stores
      lm.manual_seed(9)
      local x = input({ 4, 64, 41, 29 }, lm.float32, CL, true)
      local opts = { kernel_size = 3, stride = 2, padding = 1 }
      local _, ind = F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1,
                                       return_indices = true })
      local g = lm.randn(ind:size()):contiguous(CL)
      pa[0] = nil
      ok(C.lm_max_pool2d_backward(g._c, x._c, (ind - 1):contiguous(CL)._c, pa))
      local ref = wrap(pa[0])
      local function grad_of(f)
         lm.memory.empty_cache()
         local xr = x:clone():requires_grad_(true)
         f(xr):backward(g)
         return xr.grad
      end
      local gm = grad_of(function(t) return F.max_pool2d(t, opts) end)
      same_bits(gm, ref, "max_pool2d")
      local ga = grad_of(function(t) return F.avg_pool2d(t, opts) end)
      local x64 = x:double():contiguous():requires_grad_(true)
      F.avg_pool2d(x64, opts):backward(g:double():contiguous())
      H.assert_close(ga:double(), x64.grad:totable(), 1e-6, "avg_pool2d")
      H.assert_streamed(gm)
      H.assert_streamed(ga)
   end)

   it("errors on bad input", function()
      local x = lm.randn({ 1, 2, 5, 5 }):contiguous(CL)
      local K, S, P = i2({ 3, 3 }), i2({ 2, 2 }), i2({ 1, 1 })
      pa[0], pb[0] = nil, nil
      ok(C.lm_max_pool2d(x._c, K, S, P, nil, 0, pa, pb))
      local out, ind = wrap(pa[0]), wrap(pb[0])
      pa[0], pb[0] = nil, nil
      ok(C.lm_max_pool2d_taps(x._c, K, S, P, nil, 0, pa, pb))
      local taps = wrap(pb[0])
      local g = lm.ones_like(out)
      local function fails(st, code, needle, what)
         assert(st ~= 0, what .. ": expected an error")
         assert.equal(code, tonumber(st), what .. ": status")
         local msg = cerr()
         assert(msg:find(needle, 1, true), what .. ": message " .. msg .. " lacks " .. needle)
      end
      local LM_ERR_ARG, LM_ERR_SHAPE, LM_ERR_DTYPE = C.LM_ERR_ARG, C.LM_ERR_SHAPE, C.LM_ERR_DTYPE
      local geom, tapsb = C.lm_max_pool2d_backward_geom, C.lm_max_pool2d_taps_backward
      pa[0] = nil
      fails(geom(g._c, x._c, taps._c, K, S, P, nil, 0, pa), LM_ERR_DTYPE, "int64", "uint8 indices")
      fails(tapsb(g._c, x._c, ind._c, K, S, P, nil, 0, pa), LM_ERR_DTYPE, "uint8", "int64 taps")
      fails(geom(g._c, x._c, ind._c, K, i2({ 1, 1 }), P, nil, 0, pa), LM_ERR_SHAPE,
            "expected grad_output of shape", "other geometry")
      local g3 = lm.ones({ 1, 2, 2, 3 })
      fails(tapsb(g3._c, x._c, taps._c, K, S, P, nil, 0, pa), LM_ERR_SHAPE,
            "expected grad_output of shape", "bad grad_output")
      fails(geom(g._c, x._c, ind:narrow(3, 1, 2)._c, K, S, P, nil, 0, pa), LM_ERR_SHAPE,
            "expected indices of shape", "bad indices shape")
      fails(geom(g:double()._c, x._c, ind._c, K, S, P, nil, 0, pa), LM_ERR_DTYPE, "dtype",
            "grad_output dtype")
      fails(geom(g._c, x._c, ind._c, i2({ 0, 3 }), S, P, nil, 0, pa), LM_ERR_ARG, "kernel size",
            "zero kernel")
      assert.is_nil(pa[0] ~= nil and pa[0] or nil, "no result on error")
      -- an index outside its window, or outside the plane
      for _, fmt in ipairs({ CL, CONTIG }) do
         local xf = x:contiguous(fmt)
         local bad = ind:clone():contiguous(fmt)
         setv(bad, 1, 1, 1, 1, 24) -- the last pixel: not in window (0, 0)
         pa[0] = nil
         local st = geom(g:contiguous(fmt)._c, xf._c, bad._c, K, S, P, nil, 0, pa)
         if fmt == CL then
            fails(st, LM_ERR_ARG, "out of range for their pooling windows", "index off window")
         else
            ok(st) -- contiguous: the scatter only needs the index inside the plane
         end
         setv(bad, 1, 1, 1, 1, 25)
         pa[0] = nil
         fails(geom(g:contiguous(fmt)._c, xf._c, bad._c, K, S, P, nil, 0, pa), LM_ERR_ARG,
               "out of range", "index off plane")
         -- -1 (an empty window) is skipped
         setv(bad, 1, 1, 1, 1, -1)
         pa[0] = nil
         ok(geom(g:contiguous(fmt)._c, xf._c, bad._c, K, S, P, nil, 0, pa))
         -- tap numbers: past the last tap, or a tap in the padding (window (0, 0), tap 0)
         for _, v in ipairs({ 9, 200, 0 }) do
            local bt = taps:clone():contiguous(fmt)
            setv(bt, 1, 2, 1, 1, v)
            pa[0] = nil
            fails(tapsb(g:contiguous(fmt)._c, xf._c, bt._c, K, S, P, nil, 0, pa), LM_ERR_ARG,
                  "out of range", "tap number " .. v .. " " .. tostring(fmt))
         end
      end
      -- the taps forward: no out= tensor, at most 255 taps
      pa[0], pb[0] = nil, taps._c
      fails(C.lm_max_pool2d_taps(x._c, K, S, P, nil, 0, pa, pb), LM_ERR_ARG, "NULL", "out= taps")
      local xb = lm.randn({ 1, 1, 20, 20 })
      pa[0], pb[0] = nil, nil
      fails(C.lm_max_pool2d_taps(xb._c, i2({ 16, 16 }), nil, nil, nil, 0, pa, pb), LM_ERR_ARG,
            "255", "too many taps")
      -- through F: the message names the backward
      local xr = x:clone():requires_grad_(true)
      local y = F.max_pool2d(xr, { kernel_size = 3, stride = 2, padding = 1 })
      H.assert_error_like("max_pool2d_backward", "shape", function()
         return y.grad_fn.backward(lm.ones({ 1, 2, 2, 2 }))
      end)
      -- a kernel of more than 255 taps takes the int64 indices
      local xg = lm.randn({ 1, 2, 20, 20 }):contiguous(CL):requires_grad_(true)
      local y2 = F.max_pool2d(xg, { kernel_size = 16, stride = 4 })
      y2:backward(lm.ones_like(y2))
      assert.equal(y2:numel(), xg.grad:sum():item())
   end)
end)
