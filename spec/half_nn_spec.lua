-- float16 / bfloat16 in the nn operators (src/ops/pool.c, norm.c, softmax.c, loss.c; kernels in
-- kernels/cpu/): max_pool2d, avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d, batch_norm
-- (train / eval, residual and relu fused, mixed float32 parameters and all-half), softmax,
-- log_softmax, nll_loss, cross_entropy and mse_loss, forward and backward.
--
-- Each op on a half input is checked against the float32 op on the same (rounded) inputs: the
-- result in the input's dtype and memory format, its values within a rounding or two of the
-- float32 result (max pooling exactly), gradients likewise; batch-norm statistics and running
-- statistics in float32. Random shapes with channels 1, 3, 7, 17, 64 and spatial sizes 1, 2, 7,
-- both formats, non-dense inputs, every ISA path (best, 3, 1), and bad dtypes.

local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local C = require("lumen.C")

local CL, CONTIG = lm.channels_last, lm.contiguous_format
local HALVES = { { lm.bfloat16, "bfloat16", 1e-2 }, { lm.float16, "float16", 2e-3 } }

-- the ISA paths this CPU has: the best, then 3 (AVX-512 without BF16) and 1 (portable C)
local function isas()
   local best = C.lm_gemm_set_isa(0)
   local r = { best }
   if best > 3 then r[#r + 1] = 3 end
   if best ~= 1 then r[#r + 1] = 1 end
   return r
end

local seed = 1234
local function rnd(n) -- deterministic small integers in [1, n]
   seed = (seed * 1103515245 + 12345) % 2147483648
   return 1 + math.floor(seed / 65536) % n
end
local CHANNELS, SPATIAL = { 1, 3, 7, 17, 64 }, { 1, 2, 7 }
local function pick(list) return list[rnd(#list)] end

-- a float32 tensor of `sizes` in `fmt` and its copy in dtype dt (the same values: exactly
-- representable in float16 and bfloat16), made non-dense (narrowed views of wider ones, the same
-- strides) when strided
local function input(sizes, fmt, strided, dt, scale, shift)
   local big = { sizes[1], sizes[2], sizes[3], sizes[4] + (strided and 2 or 0) }
   local t = lm.randn(big):mul(scale or 1):add(shift or 0):to(lm.bfloat16):to(lm.float32)
   if fmt == CL then t = t:contiguous(CL) end
   local th = t:to(dt or lm.bfloat16)
   if strided then
      t, th = t:narrow(4, 2, sizes[4]), th:narrow(4, 2, sizes[4])
   end
   H.assert_strides(th, t:stride(), "the half input")
   return t, th
end

local function maxabs(t) return t:to(lm.float32):abs():max():item() end

-- |got - ref| <= tol (|ref| + max |ref| * rel_floor) elementwise; got of dtype dt
local function close(got, ref, dt, tol, what, floor)
   H.assert_dtype(got, dt, what)
   local g = got:to(lm.float32)
   local m = maxabs(ref)
   -- + half the spacing of float16's subnormals (values below 6e-5 lose bits there)
   local lim = ref:abs():mul(tol):add(tol * m * (floor or 0.1) + 2 ^ -25)
   local bad = g:sub(ref):abs():sub(lim):max():item()
   assert(bad <= 0, ("%s: off by %g beyond the tolerance %g (max |ref| %g)"):format(
      what, bad, tol, m))
end

local function exact(got, ref, dt, what)
   H.assert_dtype(got, dt, what)
   -- -inf (windows wholly in the padding) compares equal to itself; NaN is not expected
   local n = got:to(lm.float32):ne(ref:to(dt):to(lm.float32)):sum():item()
   assert(n == 0, what .. ": not exact in " .. n .. " places")
end

-- the float32 op's sizes and strides (ref: the memory-format rules are the float32 ones), else
-- dense in fmt
local function assert_format(t, fmt, what, ref)
   if ref then return H.assert_layout(t, ref:size(), ref:stride(), what) end
   if fmt == CL then
      assert(t:is_contiguous(CL), what .. ": not channels-last: " .. H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": not contiguous: " .. H.describe(t))
   end
end

-- f(x) and its gradient for the upstream gradient g: out, x.grad
local function run(f, x, g)
   local xl = x:detach():requires_grad_()
   local y = f(xl)
   y:backward(g)
   return y, xl.grad
end

local function random_shape()
   local s = pick(SPATIAL)
   return { rnd(3), pick(CHANNELS), s, s + rnd(2) - 1 }
end

describe("half-precision nn operators", function()
   after_each(function() C.lm_gemm_set_isa(0) end)

   it("pools: half in, half out, the float32 values rounded once, gradients too", function()
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, hd in ipairs(HALVES) do
            local dt, name, tol = hd[1], hd[2], hd[3]
            for trial = 1, 6 do
               local sz = random_shape()
               local fmt = trial % 2 == 0 and CL or CONTIG
               local x, xh = input(sz, fmt, trial % 3 == 0, dt)
               local what = ("%s isa %d %s %s"):format(name, isa, H.fmt_list(sz), tostring(fmt))
               local k = math.min(sz[3], 2)
               local ops = {
                  { "max_pool2d", function(t) return F.max_pool2d(t, { kernel_size = k,
                       stride = 1, padding = math.floor(k / 2), ceil_mode = true }) end, true },
                  { "max_pool2d dilated", function(t) return F.max_pool2d(t, {
                       kernel_size = { 1, 2 }, dilation = { 1, 2 }, padding = { 0, 1 } }) end,
                    true },
                  { "max_pool2d indices", function(t) return (F.max_pool2d(t, {
                       kernel_size = 3, stride = 2, padding = 1, return_indices = true })) end,
                    true },
                  { "avg_pool2d", function(t) return F.avg_pool2d(t, { kernel_size = k,
                       stride = 1, padding = math.floor(k / 2),
                       count_include_pad = trial % 2 == 0 }) end },
                  { "adaptive_avg_pool2d", function(t) return F.adaptive_avg_pool2d(t, 1) end },
                  { "adaptive_avg_pool2d 3", function(t) return F.adaptive_avg_pool2d(t, 3) end },
                  { "adaptive_max_pool2d", function(t)
                       return (F.adaptive_max_pool2d(t, { 2, 3 })) end, true },
               }
               for _, o in ipairs(ops) do
                  local w = what .. " " .. o[1]
                  local ref = o[2](x)
                  local g = lm.randn(ref:size()):to(dt):to(lm.float32)
                  if fmt == CL then g = g:contiguous(CL) end
                  local r32, gx32 = run(o[2], x, g)
                  local y, gx = run(o[2], xh, g:to(dt))
                  if o[3] then exact(y, r32, dt, w) else close(y, r32, dt, tol, w) end
                  H.assert_layout(y, r32:size(), r32:stride(), w .. " output")
                  close(gx, gx32, dt, tol, w .. " grad")
                  H.assert_layout(gx, gx32:size(), gx32:stride(), w .. " grad")
               end
               -- indices: the float32 op's
               local _, i32 = F.max_pool2d(x, { kernel_size = k, return_indices = true })
               local _, ih = F.max_pool2d(xh, { kernel_size = k, return_indices = true })
               H.assert_dtype(ih, lm.int64, what .. " indices")
               assert(maxabs(ih:to(lm.float32):sub(i32:to(lm.float32))) == 0,
                      what .. ": indices differ")
            end
         end
      end
   end)

   -- batch_norm on x (half dtype dt); params in pdt (float32: the mixed case, or dt)
   local function bn_case(dt, tol, pdt, sz, fmt, strided, opts, what)
      local C_ = sz[2]
      local x, xh0 = input(sz, fmt, strided, dt, 3, 1.5)
      local w32 = lm.randn({ C_ }):to(pdt):to(lm.float32)
      local b32 = lm.randn({ C_ }):to(pdt):to(lm.float32)
      local rm32 = lm.randn({ C_ }):mul(0.1):to(pdt):to(lm.float32)
      local rv32 = lm.rand({ C_ }):add(0.5):to(pdt):to(lm.float32)
      local res, resh = nil, nil
      if opts.residual then res, resh = input(sz, fmt, false, dt) end
      local g = lm.randn(sz):to(dt):to(lm.float32)
      if fmt == CL then g = g:contiguous(CL) end
      -- the float32 reference on the rounded inputs
      local rm_r, rv_r = rm32:clone(), rv32:clone()
      local xr = x:detach():requires_grad_()
      local wr, br = w32:clone():requires_grad_(), b32:clone():requires_grad_()
      local yr = F.batch_norm(xr, rm_r, rv_r, wr, br, { training = opts.training,
         residual = res, relu = opts.relu })
      yr:backward(g)
      -- the half op
      local rm, rv = rm32:to(pdt), rv32:to(pdt)
      local xh = xh0:detach():requires_grad_()
      local wh, bh = w32:to(pdt):requires_grad_(), b32:to(pdt):requires_grad_()
      local yh = F.batch_norm(xh, rm, rv, wh, bh, { training = opts.training,
         residual = resh, relu = opts.relu })
      yh:backward(g:to(dt))
      close(yh, yr, dt, tol, what .. " output")
      assert_format(yh, fmt, what .. " output", yr)
      close(xh.grad, xr.grad, dt, tol, what .. " grad_input")
      assert_format(xh.grad, fmt, what .. " grad_input", xr.grad)
      -- grad_weight / grad_bias in the parameters' dtype; float32 ones summed in float32
      local gtol = pdt == lm.float32 and 1e-4 or tol
      close(wh.grad, wr.grad, pdt, gtol, what .. " grad_weight", 1)
      close(bh.grad, br.grad, pdt, gtol, what .. " grad_bias", 1)
      -- running statistics: their own dtype, updated from float32 statistics
      local stol = pdt == lm.float32 and 1e-5 or tol
      close(rm, rm_r, pdt, stol, what .. " running_mean", 1)
      close(rv, rv_r, pdt, stol, what .. " running_var", 1)
   end

   it("batch_norm: train and eval, mixed and all-half, fused residual / relu, gradients",
      function()
         for _, isa in ipairs(isas()) do
            C.lm_gemm_set_isa(isa)
            for _, hd in ipairs(HALVES) do
               local dt, name, tol = hd[1], hd[2], hd[3]
               for trial = 1, 8 do
                  local sz = random_shape()
                  -- 2 values per channel: grad_input is 0 up to rounding (x_hat = +-1), all noise
                  if sz[1] * sz[3] * sz[4] <= 2 then sz[1] = 3 end
                  local fmt = trial % 2 == 0 and CL or CONTIG
                  local pdt = trial % 4 < 2 and lm.float32 or dt
                  local opts = { training = trial % 3 ~= 0, relu = trial % 3 == 1,
                                 residual = trial % 4 == 1 }
                  local what = ("%s isa %d %s %s params %s train %s"):format(name, isa,
                     H.fmt_list(sz), tostring(fmt), tostring(pdt), tostring(opts.training))
                  bn_case(dt, tol, pdt, sz, fmt, trial % 3 == 2, opts, what)
               end
            end
         end
      end)

   it("batch_norm: the ResNet shapes (channels-last, C a multiple of 16 and not)", function()
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, hd in ipairs(HALVES) do
            for _, c in ipairs({ 64, 80, 17 }) do
               for _, relu in ipairs({ false, true }) do
                  bn_case(hd[1], hd[3], lm.float32, { 4, c, 9, 7 }, CL, false,
                          { training = true, relu = relu, residual = relu }, hd[2] .. " C " .. c)
                  bn_case(hd[1], hd[3], hd[1], { 4, c, 9, 7 }, CL, false,
                          { training = false, relu = relu }, hd[2] .. " eval C " .. c)
               end
            end
            -- outputs of 1 MiB and more in fresh blocks: the AVX-512 copy's streaming stores
            -- (C a multiple of 32); C 80 keeps ordinary stores
            for _, c in ipairs({ 64, 80 }) do
               bn_case(hd[1], hd[3], lm.float32, { 8, c, 40, 40 }, CL, false,
                       { training = true, relu = true, residual = true }, hd[2] .. " big C " .. c)
            end
         end
      end
   end)

   it("batch_norm: (N, C) and channels-last-3d half inputs (the row kernels)", function()
      for _, isa in ipairs(isas()) do
         C.lm_gemm_set_isa(isa)
         for _, hd in ipairs(HALVES) do
            local dt, tol = hd[1], hd[3]
            for _, sz in ipairs({ { 6, 17 }, { 2, 17, 2, 3, 2 }, { 3, 64, 1, 1, 2 } }) do
               for _, fmt in ipairs({ CONTIG, lm.channels_last_3d }) do
                  if #sz == 5 or fmt == CONTIG then
                     local x = lm.randn(sz):mul(2):add(1):to(dt):to(lm.float32)
                     if #sz == 5 then x = x:contiguous(fmt) end
                     local xh = x:to(dt)
                     local g = lm.randn(sz):to(dt):to(lm.float32)
                     local w = lm.randn({ sz[2] })
                     local function op(t)
                        return F.batch_norm(t, nil, nil, w, nil, { training = true })
                     end
                     local r32, gx32 = run(op, x, g)
                     local y, gx = run(op, xh, g:to(dt))
                     local what = ("%s isa %d %s %s"):format(hd[2], isa, H.fmt_list(sz),
                                                             tostring(fmt))
                     close(y, r32, dt, tol, what)
                     H.assert_layout(y, r32:size(), r32:stride(), what)
                     close(gx, gx32, dt, tol, what .. " grad")
                     H.assert_layout(gx, gx32:size(), gx32:stride(), what .. " grad")
                  end
               end
            end
         end
      end
   end)

   it("batch_norm: save_mean / save_invstd are float32 for half inputs", function()
      local ffi = require("ffi")
      local T = require("lumen.tensor")
      for _, hd in ipairs(HALVES) do
         local x = lm.randn({ 2, 3, 4, 4 }):to(hd[1])
         local out = ffi.new("lm_tensor*[3]")
         assert(C.lm_batch_norm(x._c, nil, nil, nil, nil, 1, 0.1, 1e-5, out, out + 1, out + 2)
                == 0, ffi.string(C.lm_last_error()))
         local y, m, s = T.wrap(out[0]), T.wrap(out[1]), T.wrap(out[2])
         H.assert_dtype(y, hd[1], "y")
         H.assert_dtype(m, lm.float32, "save_mean")
         H.assert_dtype(s, lm.float32, "save_invstd")
         local xf = x:to(lm.float32)
         local mref = xf:mean({ 1, 3, 4 })
         close(m, mref, lm.float32, 1e-6, "save_mean", 1)
      end
   end)

   it("softmax and log_softmax: half results, contiguous, gradients", function()
      for _, hd in ipairs(HALVES) do
         local dt, name, tol = hd[1], hd[2], hd[3]
         for trial = 1, 6 do
            local sz = random_shape()
            local fmt = trial % 2 == 0 and CL or CONTIG
            local x, xh = input(sz, fmt, trial % 3 == 0, dt, 2)
            for _, f in ipairs({ "softmax", "log_softmax" }) do
               local dim = 1 + trial % 4
               local op = function(t) return F[f](t, dim) end
               local g = lm.randn(sz):to(dt):to(lm.float32)
               local r32, gx32 = run(op, x, g)
               local y, gx = run(op, xh, g:to(dt))
               local what = ("%s %s %s dim %d"):format(name, f, H.fmt_list(sz), dim)
               close(y, r32, dt, tol, what)
               assert(y:is_contiguous(), what .. ": not contiguous")
               -- the backward reads the rounded output: errors of the order of the largest term
               close(gx, gx32, dt, tol, what .. " grad", 1)
            end
         end
      end
   end)

   it("nll_loss, cross_entropy and mse_loss: half losses, float32 accumulation", function()
      for _, hd in ipairs(HALVES) do
         local dt, name, tol = hd[1], hd[2], hd[3]
         for _, n in ipairs({ 1, 7, 300 }) do
            for _, red in ipairs({ "mean", "sum", "none" }) do
               local x = lm.randn({ n, 5 }):to(dt):to(lm.float32)
               local t = lm.randint(1, 6, { n })
               local g = red == "none" and lm.randn({ n }):to(dt):to(lm.float32) or nil
               local what = ("%s n %d %s"):format(name, n, red)
               for _, f in ipairs({ "nll_loss", "cross_entropy" }) do
                  local op = function(v) return F[f](v, t, { reduction = red }) end
                  local xl = x:detach():requires_grad_()
                  local r32 = op(xl)
                  r32:backward(g)
                  local xh = x:to(dt):requires_grad_()
                  local y = op(xh)
                  y:backward(g and g:to(dt))
                  close(y, r32, dt, tol, what .. " " .. f)
                  close(xh.grad, xl.grad, dt, tol, what .. " " .. f .. " grad")
               end
               local b = lm.randn({ n, 5 }):to(dt):to(lm.float32)
               local m32 = F.mse_loss(x, b, { reduction = red })
               local mh = F.mse_loss(x:to(dt), b:to(dt), { reduction = red })
               close(mh, m32, dt, tol, what .. " mse_loss")
            end
         end
      end
      -- a sum of many bfloat16 terms accumulates in float32 or wider: 4096 ones sum to 4096
      local ones = lm.ones({ 4096 }, { dtype = lm.bfloat16 })
      assert(ones:sum():item() == 4096, "bfloat16 sum accumulates in bfloat16")
      assert(ones:mean():item() == 1, "bfloat16 mean")
   end)

   it("runs on meta with the CPU's dtypes and formats", function()
      for _, hd in ipairs(HALVES) do
         local x = lm.empty({ 2, 3, 5, 5 }, { dtype = hd[1], device = "meta",
                                               memory_format = CL })
         local y = F.max_pool2d(x, { kernel_size = 2 })
         H.assert_dtype(y, hd[1], "meta max_pool2d")
         assert(y:is_contiguous(CL) and y:device() == "meta", "meta max_pool2d format")
         local rm = lm.zeros({ 3 }, { device = "meta" })
         local rv = lm.ones({ 3 }, { device = "meta" })
         local b = F.batch_norm(x, rm, rv, nil, nil, { training = true })
         H.assert_dtype(b, hd[1], "meta batch_norm")
         assert(b:is_contiguous(CL), "meta batch_norm format")
         H.assert_dtype(F.softmax(x, 2), hd[1], "meta softmax")
      end
   end)

   it("refuses non-floating inputs with the function's name", function()
      local xi = lm.zeros({ 2, 3, 4, 4 }, { dtype = lm.int64 })
      local cases = {
         { "max_pool2d", function() F.max_pool2d(xi, { kernel_size = 2 }) end },
         { "avg_pool2d", function() F.avg_pool2d(xi, { kernel_size = 2 }) end },
         { "adaptive_avg_pool2d", function() F.adaptive_avg_pool2d(xi, 1) end },
         { "batch_norm", function() F.batch_norm(xi, nil, nil, nil, nil, { training = true }) end },
         { "softmax", function() F.softmax(xi, 2) end },
         { "nll_loss", function() F.nll_loss(xi:select(3, 1):select(3, 1),
                                              lm.ones({ 2 }, { dtype = lm.int64 })) end },
      }
      for _, c in ipairs(cases) do
         local ok, e = pcall(c[2])
         assert(not ok, c[1] .. " accepted int64")
         assert(tostring(e):find("lumen." .. c[1], 1, true), c[1] .. ": " .. tostring(e))
      end
      -- a half grad_output against a float input (and the other way) is a dtype error
      local ffi = require("ffi")
      local x = lm.randn({ 2, 3, 4, 4 })
      local gb = lm.randn({ 2, 3, 4, 4 }):to(lm.bfloat16)
      local out = ffi.new("lm_tensor*[1]")
      assert(C.lm_softmax_backward(gb._c, x._c, 1, out) ~= 0, "mixed softmax_backward")
      assert(ffi.string(C.lm_last_error()):find("dtype"), ffi.string(C.lm_last_error()))
   end)
end)
