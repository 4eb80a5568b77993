-- luacheck: max line length 120
-- spec/cuda_dnn_spec.lua -- the CUDA backend's cuDNN / cuBLAS families (kernels/cuda/conv.cu,
-- norm.cu, linalg.cu) against the CPU: conv2d forward and backward (every dtype, both formats,
-- groups, depthwise, dilation, stride, bias / residual / relu; the channels-last 1x1 ones that run
-- as cuBLAS GEMMs, each gradient alone), batch norm (training with the
-- running statistics and eval, both formats, mixed half input with float32 parameters, the fused
-- residual / relu forms and their backward), matmul (2-D, batched, broadcast, transposed and
-- non-dense views, vectors, an empty inner dim, addmm's accumulate through F.linear).
--
-- Every case makes its operands on the CPU, copies them to cuda:0, runs the op on both devices and
-- compares cuda:0's result (copied back) with the CPU's, as a maximum difference relative to the
-- reference's largest magnitude. float32 convolutions may run on TF32 tensor cores (the backend's
-- default, PyTorch's cudnn.allow_tf32), so their tolerance is TF32's; float32 matmul does not
-- (the default, PyTorch's matmul.allow_tf32 = false). Skips without a CUDA device.
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F

describe("cuda:0 dnn families against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end
   local DEV = "cuda:0"
   local CPU = { device = "cpu" }

   -- tolerances relative to max(1, max |reference|)
   local CONV_TOL = { [tostring(lm.float64)] = 1e-9, [tostring(lm.float32)] = 5e-3,
                      [tostring(lm.float16)] = 1e-2, [tostring(lm.bfloat16)] = 4e-2 }
   local EXACT_TOL = { [tostring(lm.float64)] = 1e-9, [tostring(lm.float32)] = 1e-4,
                       [tostring(lm.float16)] = 1e-2, [tostring(lm.bfloat16)] = 4e-2 }
   local DTYPES = { lm.float32, lm.float64, lm.float16, lm.bfloat16 }

   local function randn(sizes, dt, fmt)
      local t = lm.randn(sizes, CPU)
      if dt then t = t:to(dt) end
      if fmt then t = t:contiguous(fmt) end
      return t
   end

   local function cmp(got, exp, tol, what)
      assert.are.equal(DEV, got:device(), what .. ": device")
      assert.are.equal("cpu", exp:device(), what .. ": reference device")
      assert.are.same(exp:size(), got:size(), what .. ": sizes")
      assert.are.equal(tostring(exp:dtype()), tostring(got:dtype()), what .. ": dtype")
      local g, e = got:cpu():double(), exp:double()
      if e:numel() == 0 then return end
      local scale = math.max(1, e:abs():max():item())
      local d = (g - e):abs():max():item()
      assert(d <= tol * scale, ("%s: max |cuda - cpu| = %.3g > %.3g (scale %.3g)"):format(what, d,
         tol * scale, scale))
   end

   local function same_format(got, exp, what)
      for _, f in ipairs({ lm.contiguous_format, lm.channels_last }) do
         assert.are.equal(exp:is_contiguous(f), got:is_contiguous(f),
            what .. ": is_contiguous(" .. tostring(f) .. ")")
      end
   end

   local function on(t) return t and t:to(DEV) or nil end

   -- ---------------------------------------------------------------------------------------------
   describe("conv2d", function()
      -- {N, C, H, W, O, kh, kw, stride, padding, dilation, groups}
      local CASES = {
         { 2, 3, 9, 8, 5, 3, 3, 1, 1, 1, 1 },    -- plain 3x3
         { 2, 4, 7, 7, 8, 1, 1, 1, 0, 1, 1 },    -- pointwise
         { 1, 6, 11, 9, 4, 3, 2, 2, 1, 1, 2 },   -- strided, grouped, non-square kernel
         { 2, 8, 10, 10, 8, 3, 3, 1, 2, 2, 8 },  -- depthwise, dilated
         { 1, 4, 12, 10, 8, 5, 5, 3, 2, 1, 4 },  -- depthwise multiplier 2, stride 3
         { 3, 5, 6, 7, 7, 2, 3, 2, 0, 2, 1 },    -- dilation 2, stride 2, no padding
      }
      local function geom_name(c)
         return ("N%d C%d %dx%d O%d k%dx%d s%d p%d d%d g%d"):format(unpack(c))
      end

      for _, dt in ipairs(DTYPES) do
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            it(("forward %s %s: bias, residual, relu"):format(tostring(dt), tostring(fmt)),
               function()
               lm.manual_seed(11)
               for _, c in ipairs(CASES) do
                  local N, C, Hh, W, O, kh, kw, s, p, d, g = unpack(c)
                  local x = randn({ N, C, Hh, W }, dt, fmt)
                  local w = randn({ O, C / g, kh, kw }, dt, fmt)
                  local b = randn({ O }, dt)
                  local opts = { stride = s, padding = p, dilation = d, groups = g }
                  local what = geom_name(c) .. " " .. tostring(dt) .. " " .. tostring(fmt)
                  local y = F.conv2d(x, w, b, opts)
                  local yc = F.conv2d(on(x), on(w), on(b), opts)
                  cmp(yc, y, CONV_TOL[tostring(dt)], what)
                  same_format(yc, y, what)
                  -- no bias
                  cmp(F.conv2d(on(x), on(w), nil, opts), F.conv2d(x, w, nil, opts),
                     CONV_TOL[tostring(dt)], what .. " no bias")
                  -- residual and relu (the fused epilogue)
                  local r = randn(y:size(), dt, fmt)
                  local ro = { stride = s, padding = p, dilation = d, groups = g, residual = r,
                               relu = true }
                  local rc = { stride = s, padding = p, dilation = d, groups = g, residual = on(r),
                               relu = true }
                  cmp(F.conv2d(on(x), on(w), on(b), rc), F.conv2d(x, w, b, ro),
                     CONV_TOL[tostring(dt)], what .. " residual relu")
               end
            end)

            it(("backward %s %s: grad_input, grad_weight, grad_bias"):format(tostring(dt),
               tostring(fmt)), function()
               lm.manual_seed(12)
               for _, c in ipairs(CASES) do
                  local N, C, Hh, W, O, kh, kw, s, p, d, g = unpack(c)
                  local what = geom_name(c) .. " " .. tostring(dt) .. " " .. tostring(fmt)
                  local x0 = randn({ N, C, Hh, W }, dt, fmt)
                  local w0 = randn({ O, C / g, kh, kw }, dt, fmt)
                  local b0 = randn({ O }, dt)
                  local opts = { stride = s, padding = p, dilation = d, groups = g }
                  local function run(x, w, b, gy)
                     x, w, b = x:clone():requires_grad_(), w:clone():requires_grad_(),
                        b:clone():requires_grad_()
                     local y = F.conv2d(x, w, b, opts)
                     if not gy then return y end
                     (y * gy):sum():backward()
                     return y, x.grad, w.grad, b.grad
                  end
                  local gy = randn(run(x0, w0, b0):size(), dt, fmt)
                  local _, gx, gw, gb = run(x0, w0, b0, gy)
                  local _, gxc, gwc, gbc = run(on(x0), on(w0), on(b0), on(gy))
                  -- the sums run over N*Ho*Wo (grad_w, grad_b) or O*kh*kw (grad_x) terms
                  local tol = CONV_TOL[tostring(dt)] * 2
                  cmp(gxc, gx, tol, what .. " grad_input")
                  cmp(gwc, gw, tol, what .. " grad_weight")
                  cmp(gbc, gb, tol, what .. " grad_bias")
                  same_format(gxc, gx, what .. " grad_input")
                  same_format(gwc, gw, what .. " grad_weight")
               end
            end)
         end
      end

      it("random geometries, float32 and float16, both formats", function()
         lm.manual_seed(13)
         math.randomseed(13)
         for _ = 1, 12 do
            local g = ({ 1, 1, 2, 3 })[math.random(4)]
            local N, Cg, Og = math.random(1, 3), math.random(1, 4), math.random(1, 4)
            local kh, kw = math.random(1, 4), math.random(1, 4)
            local s, p, d = math.random(1, 3), math.random(0, 2), math.random(1, 2)
            local Hh = d * (kh - 1) + 1 + math.random(0, 6)
            local W = d * (kw - 1) + 1 + math.random(0, 6)
            for _, dt in ipairs({ lm.float32, lm.float16 }) do
               for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
                  local x = randn({ N, Cg * g, Hh, W }, dt, fmt)
                  local w = randn({ Og * g, Cg, kh, kw }, dt, fmt)
                  local b = randn({ Og * g }, dt)
                  local opts = { stride = s, padding = p, dilation = d, groups = g }
                  local what = ("N%d C%d %dx%d O%d k%dx%d s%d p%d d%d g%d %s %s"):format(N, Cg * g,
                     Hh, W, Og * g, kh, kw, s, p, d, g, tostring(dt), tostring(fmt))
                  cmp(F.conv2d(on(x), on(w), on(b), opts), F.conv2d(x, w, b, opts),
                     CONV_TOL[tostring(dt)], what)
               end
            end
         end
      end)

      it("a channels-last weight with a contiguous input runs channels-last, as on the CPU",
         function()
         lm.manual_seed(14)
         local x = randn({ 2, 4, 8, 8 }, lm.float32)
         local w = randn({ 6, 4, 3, 3 }, lm.float32, lm.channels_last)
         local y = F.conv2d(x, w, nil, { padding = 1 })
         local yc = F.conv2d(on(x), on(w), nil, { padding = 1 })
         same_format(yc, y, "mixed formats")
         cmp(yc, y, CONV_TOL[tostring(lm.float32)], "mixed formats")
      end)

      it("a strided bias, and an input with no channels per group", function()
         lm.manual_seed(15)
         local x = randn({ 2, 4, 6, 6 }, lm.float32, lm.channels_last)
         local w = randn({ 5, 4, 3, 3 }, lm.float32)
         local bb = randn({ 15 }, lm.float32)
         local y = F.conv2d(x, w, bb:as_strided({ 5 }, { 3 }, 1), { padding = 1 })
         local yc = F.conv2d(on(x), on(w), on(bb):as_strided({ 5 }, { 3 }, 1), { padding = 1 })
         cmp(yc, y, CONV_TOL[tostring(lm.float32)], "strided bias")
         local x0 = randn({ 2, 0, 5, 5 }, lm.float32)
         local w0 = randn({ 3, 0, 3, 3 }, lm.float32)
         local b0 = randn({ 3 }, lm.float32)
         cmp(F.conv2d(on(x0), on(w0), on(b0)), F.conv2d(x0, w0, b0), 0, "no input channels")
      end)

      -- channels-last 1x1 convolutions with stride 1, no padding, one group run as GEMMs on
      -- cuBLAS (conv.cu); in the emulated build with LUMEN_CUDA_EMU_GEMM=1 over the emulated
      -- cuBLAS, so these check the orientation, transposes and leading dimensions there
      describe("1x1 channels-last (cuBLAS GEMMs)", function()
         -- {N, C, H, W, O, stride}: C ~= O both ways, odd sizes, a batch of 1, one channel in or
         -- out; strided ones (a gathered copy of the pixels read, grad_x scattered back)
         local GEMM_CASES = {
            { 2, 5, 3, 7, 9, 1 }, { 1, 16, 4, 4, 8, 1 }, { 3, 7, 5, 1, 3, 1 }, { 1, 1, 1, 1, 1, 1 },
            { 2, 3, 2, 3, 1, 1 }, { 1, 33, 3, 5, 17, 1 }, { 2, 1, 3, 3, 6, 1 },
            { 2, 6, 7, 6, 5, 2 }, { 1, 4, 5, 8, 9, 3 }, { 2, 3, 6, 5, 4, { 1, 2 } },
            { 1, 5, 4, 3, 2, { 3, 1 } }, { 1, 2, 1, 1, 3, 2 }, { 2, 3, 4, 4, 3, 5 },
            { 2, 16, 6, 5, 8, 2 }, -- rows of 16-byte units in every dtype
         }
         local GEMM_DTYPES = { lm.float32, lm.float16, lm.bfloat16, lm.float64 }
         local CL = lm.channels_last
         local function name(c, dt)
            local st = type(c[6]) == "table" and (c[6][1] .. "x" .. c[6][2]) or tostring(c[6])
            return ("1x1 N%d C%d %dx%d O%d s%s %s"):format(c[1], c[2], c[3], c[4], c[5], st,
               tostring(dt))
         end

         for _, dt in ipairs(GEMM_DTYPES) do
            it(("forward %s: no bias, bias, residual + relu, dilation 2"):format(tostring(dt)),
               function()
               lm.manual_seed(21)
               local tol = CONV_TOL[tostring(dt)]
               for _, c in ipairs(GEMM_CASES) do
                  local N, C, Hh, W, O, s = unpack(c)
                  local what = name(c, dt)
                  local x = randn({ N, C, Hh, W }, dt, CL)
                  local so = { stride = s }
                  for _, wfmt in ipairs({ CL, lm.contiguous_format }) do
                     local w = randn({ O, C, 1, 1 }, dt, wfmt)
                     local b = randn({ O }, dt)
                     local y = F.conv2d(x, w, nil, so)
                     local yc = F.conv2d(on(x), on(w), nil, so)
                     cmp(yc, y, tol, what .. " no bias")
                     same_format(yc, y, what .. " no bias")
                     cmp(F.conv2d(on(x), on(w), on(b), so), F.conv2d(x, w, b, so), tol,
                        what .. " bias")
                     local r = randn(y:size(), dt, CL)
                     cmp(F.conv2d(on(x), on(w), on(b), { stride = s, residual = on(r), relu = true }),
                        F.conv2d(x, w, b, { stride = s, residual = r, relu = true }), tol,
                        what .. " residual relu")
                     cmp(F.conv2d(on(x), on(w), nil, { stride = s, relu = true }),
                        F.conv2d(x, w, nil, { stride = s, relu = true }), tol, what .. " relu")
                     -- dilation has no effect on a 1x1 kernel (cuDNN's route)
                     cmp(F.conv2d(on(x), on(w), on(b), { stride = s, dilation = 2 }),
                        F.conv2d(x, w, b, { stride = s, dilation = 2 }), tol, what .. " dilation 2")
                  end
               end
            end)

            it(("backward %s: all gradients, and each alone"):format(tostring(dt)), function()
               lm.manual_seed(22)
               local tol = CONV_TOL[tostring(dt)] * 2
               for _, c in ipairs(GEMM_CASES) do
                  local N, C, Hh, W, O, s = unpack(c)
                  local so = { stride = s }
                  local x0 = randn({ N, C, Hh, W }, dt, CL)
                  local w0 = randn({ O, C, 1, 1 }, dt, CL)
                  local b0 = randn({ O }, dt)
                  local gy = randn(F.conv2d(x0, w0, b0, so):size(), dt, CL)
                  -- which: the operands that require grad ("xwb", "x", "w", "b")
                  local function run(x, w, b, g, which)
                     x, w, b = x:clone(), w:clone(), b:clone()
                     if which:find("x") then x:requires_grad_() end
                     if which:find("w") then w:requires_grad_() end
                     if which:find("b") then b:requires_grad_() end
                     local y = F.conv2d(x, w, b, so)
                     ;(y * g):sum():backward()
                     return x.grad, w.grad, b.grad
                  end
                  for _, which in ipairs({ "xwb", "x", "w", "b", "xw" }) do
                     local what = name(c, dt) .. " grads " .. which
                     local gx, gw, gb = run(x0, w0, b0, gy, which)
                     local gxc, gwc, gbc = run(on(x0), on(w0), on(b0), on(gy), which)
                     assert.are.equal(gx == nil, gxc == nil, what .. ": grad_input present")
                     assert.are.equal(gw == nil, gwc == nil, what .. ": grad_weight present")
                     assert.are.equal(gb == nil, gbc == nil, what .. ": grad_bias present")
                     if gx then
                        cmp(gxc, gx, tol, what .. " grad_input")
                        same_format(gxc, gx, what .. " grad_input")
                     end
                     if gw then
                        cmp(gwc, gw, tol, what .. " grad_weight")
                        same_format(gwc, gw, what .. " grad_weight")
                     end
                     if gb then cmp(gbc, gb, tol, what .. " grad_bias") end
                  end
               end
            end)
         end

         it("a larger float32 case with TF32 off (exact float32 sums)", function()
            lm.manual_seed(23)
            local x = randn({ 2, 64, 7, 9 }, lm.float32, CL)
            local w = randn({ 48, 64, 1, 1 }, lm.float32, CL)
            local b = randn({ 48 }, lm.float32)
            local prev = lm.backends.cudnn.allow_tf32
            lm.backends.cudnn.allow_tf32 = false
            local ok, e = pcall(function()
               cmp(F.conv2d(on(x), on(w), on(b)), F.conv2d(x, w, b), EXACT_TOL[tostring(lm.float32)],
                  "1x1 float32 no TF32")
            end)
            lm.backends.cudnn.allow_tf32 = prev
            assert(ok, e)
         end)

         it("an input that is a batch slice (dense, at an offset) and a weight view", function()
            lm.manual_seed(24)
            local xb = randn({ 3, 6, 4, 5 }, lm.float32, CL)
            local wb = randn({ 2, 7, 6, 1, 1 }, lm.float32)
            local x, w = xb:narrow(1, 2, 2), wb:select(1, 2)
            local xc, wc = on(xb):narrow(1, 2, 2), on(wb):select(1, 2)
            cmp(F.conv2d(xc, wc), F.conv2d(x, w), CONV_TOL[tostring(lm.float32)], "offset views")
            cmp(F.conv2d(xc, wc, nil, { stride = 2 }), F.conv2d(x, w, nil, { stride = 2 }),
               CONV_TOL[tostring(lm.float32)], "offset views, stride 2")
         end)

         it("padding (cuDNN's route) and stride", function()
            lm.manual_seed(25)
            local x = randn({ 2, 6, 7, 8 }, lm.bfloat16, CL)
            local w = randn({ 5, 6, 1, 1 }, lm.bfloat16, CL)
            for _, o in ipairs({ { stride = 2 }, { padding = 1 }, { stride = { 1, 2 } } }) do
               cmp(F.conv2d(on(x), on(w), nil, o), F.conv2d(x, w, nil, o),
                  CONV_TOL[tostring(lm.bfloat16)], "1x1 stride/padding")
            end
         end)
      end)

      it("bad input raises the front end's error on cuda:0", function()
         local x = lm.randn({ 1, 3, 8, 8 }, { device = DEV })
         local w = lm.randn({ 4, 2, 3, 3 }, { device = DEV })
         assert.has_error(function() F.conv2d(x, w) end)
         local ok, e = pcall(F.conv2d, x, w)
         assert.is_false(ok)
         assert.matches("lumen.conv2d: ", tostring(e), 1, true)
      end)
   end)

   -- ---------------------------------------------------------------------------------------------
   describe("batch_norm", function()
      -- the last one has enough rows (2048) for the kernel's partial sums to be folded once
      local SHAPES = { { 4, 6, 5, 7 }, { 2, 16, 3, 3 }, { 8, 5, 1, 1 }, { 3, 3, 9, 4 },
                       { 8, 3, 16, 16 } }

      -- x, params (weight, bias, running stats) and the options on one device
      local function bn_case(x, pdt, affine, training, extra, dev)
         local C = x:size(2)
         local pcpu = function(seed)
            lm.manual_seed(seed)
            local t = lm.randn({ C }, CPU):to(pdt)
            return dev and t:to(dev) or t
         end
         local w, b = affine and pcpu(21) or nil, affine and pcpu(22) or nil
         local rm = pcpu(23)
         local rv = pcpu(24):abs() + 0.5
         local opts = { training = training, momentum = 0.3, eps = 1e-3 }
         for k, v in pairs(extra or {}) do opts[k] = v end
         return w, b, rm, rv, opts
      end

      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            for _, training in ipairs({ true, false }) do
               it(("%s %s %s: output, running stats, gradients"):format(tostring(dt),
                  tostring(fmt), training and "train" or "eval"), function()
                  -- half inputs with float32 parameters (the mixed case of autocast) and with
                  -- parameters of their own dtype
                  local pdts = (dt == lm.float16 or dt == lm.bfloat16) and { lm.float32, dt }
                     or { dt }
                  local tol = EXACT_TOL[tostring(dt)]
                  for _, sz in ipairs(SHAPES) do
                     for _, pdt in ipairs(pdts) do
                        for _, v in ipairs({ { affine = true }, { affine = false },
                                             { affine = true, relu = true, residual = true } }) do
                           lm.manual_seed(20)
                           local x0 = randn(sz, dt, fmt)
                           local r0 = v.residual and randn(sz, dt, fmt) or nil
                           local gy = randn(sz, dt, fmt)
                           local what = ("%s %s %s %s params %s%s%s"):format(H.fmt_list(sz),
                              tostring(dt), tostring(fmt), training and "train" or "eval",
                              tostring(pdt), v.affine and " affine" or "",
                              v.relu and " residual relu" or "")
                           local function run(dev)
                              local x = (dev and x0:to(dev) or x0:clone()):requires_grad_()
                              -- a residual that wants its gradient: the masked gradient
                              -- (grad_masked) of the fused backward
                              local r = r0 and (dev and r0:to(dev) or r0:clone()):requires_grad_()
                              local w, b, rm, rv, opts = bn_case(x0, pdt, v.affine, training,
                                 { relu = v.relu, residual = r }, dev)
                              if w then
                                 w:requires_grad_()
                                 b:requires_grad_()
                              end
                              local y = F.batch_norm(x, rm, rv, w, b, opts)
                              ;(y * (dev and gy:to(dev) or gy)):sum():backward()
                              return y, rm, rv, x.grad, w and w.grad, b and b.grad, r and r.grad
                           end
                           local y, rm, rv, gx, gw, gb, gr = run(nil)
                           local yc, rmc, rvc, gxc, gwc, gbc, grc = run(DEV)
                           if gr then cmp(grc, gr, tol, what .. " grad_residual") end
                           cmp(yc, y, tol, what .. " output")
                           same_format(yc, y, what .. " output")
                           -- the running statistics are rounded to the parameters' dtype
                           local stol = math.max(1e-5, EXACT_TOL[tostring(pdt)])
                           cmp(rmc, rm, stol, what .. " running_mean")
                           cmp(rvc, rv, stol, what .. " running_var")
                           cmp(gxc, gx, tol * 4, what .. " grad_input")
                           same_format(gxc, gx, what .. " grad_input")
                           if gw then
                              cmp(gwc, gw, tol * 4, what .. " grad_weight")
                              cmp(gbc, gb, tol * 4, what .. " grad_bias")
                           end
                        end
                     end
                  end
               end)
            end
         end
      end

      it("many rows (the partial sums folded twice), float32, both formats, train", function()
         lm.manual_seed(27)
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            local x0 = randn({ 16, 2, 64, 68 }, lm.float32, fmt) * 3 + 5
            local gy = randn({ 16, 2, 64, 68 }, lm.float32, fmt)
            local function run(dev)
               local x = (dev and x0:to(dev) or x0:clone()):requires_grad_()
               local w = lm.tensor({ 1.5, -0.5 }, CPU)
               local b = lm.tensor({ 0.25, 2 }, CPU)
               local rm, rv = lm.zeros({ 2 }, CPU), lm.ones({ 2 }, CPU)
               if dev then w, b, rm, rv = w:to(dev), b:to(dev), rm:to(dev), rv:to(dev) end
               w:requires_grad_()
               b:requires_grad_()
               local y = F.batch_norm(x, rm, rv, w, b, { training = true })
               ;(y * (dev and gy:to(dev) or gy)):sum():backward()
               return y, rm, rv, x.grad, w.grad, b.grad
            end
            local ref, got = { run(nil) }, { run(DEV) }
            local names = { "output", "running_mean", "running_var", "grad_input", "grad_weight",
                            "grad_bias" }
            for i, n in ipairs(names) do
               cmp(got[i], ref[i], 1e-4, tostring(fmt) .. " " .. n)
            end
         end
      end)

      -- the fast path of kernels/cuda/norm.cu (float32 / bfloat16 / float16, every operand dense
      -- with channels innermost): vector widths 8 / 4 / 2 / 1 elements (C % 8 == 0, C % 4, C % 2,
      -- odd C, views whose first element is not 16-byte aligned), 2-D and 5-D inputs, train and
      -- eval, no weight, relu with and without a residual (the relu mask alone, and the mask
      -- with the masked gradient), and its sums folded (many rows)
      local FAST_DTS = { lm.float32, lm.bfloat16, lm.float16 }
      local FAST_VARIANTS = { { affine = true }, { affine = false },
                              { affine = true, relu = true, residual = true },
                              { affine = true, relu = true }, { affine = false, relu = true } }

      -- forward and backward on the CPU and on cuda:0 from the same operands; mk(dev) makes x,
      -- the residual and the output's gradient on a device (nil: the CPU)
      local function fast_case(what, dt, sz, training, v, mk, tol)
         local function run(dev)
            local x, r, gy = mk(dev)
            x:requires_grad_()
            if r then r:requires_grad_() end
            local w, b, rm, rv, opts = bn_case(x, lm.float32, v.affine, training,
               { relu = v.relu, residual = r }, dev)
            if w then
               w:requires_grad_()
               b:requires_grad_()
            end
            local y = F.batch_norm(x, rm, rv, w, b, opts)
            y:backward(gy)
            return y, rm, rv, x.grad, w and w.grad, b and b.grad, r and r.grad
         end
         local y, rm, rv, gx, gw, gb, gr = run(nil)
         local yc, rmc, rvc, gxc, gwc, gbc, grc = run(DEV)
         cmp(yc, y, tol, what .. " output")
         same_format(yc, y, what .. " output")
         cmp(rmc, rm, 1e-5, what .. " running_mean")
         cmp(rvc, rv, 1e-5, what .. " running_var")
         cmp(gxc, gx, tol * 4, what .. " grad_input")
         same_format(gxc, gx, what .. " grad_input")
         if gw then
            cmp(gwc, gw, tol * 4, what .. " grad_weight")
            cmp(gbc, gb, tol * 4, what .. " grad_bias")
         end
         if gr then cmp(grc, gr, tol, what .. " grad_residual") end
      end

      for _, dt in ipairs(FAST_DTS) do
         it(("%s channels innermost (the fast path): C %% 8 == 0, odd C, 2-D, 5-D"):format(
            tostring(dt)), function()
            local cases = { { { 4, 64, 5, 6 }, lm.channels_last }, { { 3, 24, 7, 5 },
               lm.channels_last }, { { 2, 6, 9, 8 }, lm.channels_last },
               { { 2, 7, 9, 8 }, lm.channels_last }, { { 200, 32 } }, { { 33, 5 } },
               { { 2, 16, 3, 4, 5 }, lm.channels_last_3d } }
            for _, cs in ipairs(cases) do
               local sz, fmt = cs[1], cs[2]
               for _, training in ipairs({ true, false }) do
                  for _, v in ipairs(FAST_VARIANTS) do
                     lm.manual_seed(40)
                     local x0 = randn(sz, dt, fmt) * 2 + 1
                     local r0 = randn(sz, dt, fmt)
                     local g0 = randn(sz, dt, fmt)
                     local what = ("%s %s %s%s%s%s"):format(H.fmt_list(sz), tostring(dt),
                        training and "train" or "eval", v.affine and " affine" or "",
                        v.relu and " relu" or "", v.residual and " residual" or "")
                     fast_case(what, dt, sz, training, v, function(dev)
                        local function on_dev(t) return dev and t:to(dev) or t:clone() end
                        return on_dev(x0), v.residual and on_dev(r0) or nil, on_dev(g0)
                     end, EXACT_TOL[tostring(dt)])
                  end
               end
            end
         end)
      end

      it("views whose first element is not 16-byte aligned (narrower vectors)", function()
         local sz = { 3, 16, 5, 4 }
         local n = 3 * 16 * 5 * 4
         local strides = { 16 * 5 * 4, 1, 4 * 16, 16 } -- channels_last
         for _, dt in ipairs(FAST_DTS) do
            for _, off in ipairs({ 1, 2, 4, 6 }) do
               for _, training in ipairs({ true, false }) do
                  lm.manual_seed(41 + off)
                  -- x, the residual and the output's gradient each a channels_last view at
                  -- element off of a longer buffer (x's and the residual's grads still fresh)
                  local bufs = { randn({ n + off }, dt), randn({ n + off }, dt),
                                 randn({ n + off }, dt) }
                  local v = { affine = true, relu = true, residual = true }
                  local what = ("%s offset %d %s"):format(tostring(dt), off,
                     training and "train" or "eval")
                  fast_case(what, dt, sz, training, v, function(dev)
                     local t = {}
                     for i, b in ipairs(bufs) do
                        local bd = dev and b:to(dev) or b:clone()
                        t[i] = bd:as_strided(sz, strides, off)
                        assert(t[i]:is_contiguous(lm.channels_last), what .. ": the view")
                     end
                     return t[1], t[2], t[3]
                  end, EXACT_TOL[tostring(dt)])
               end
            end
         end
      end)

      it("the fast path's sums folded (many rows), float32 and bfloat16, train", function()
         for _, c in ipairs({ { { 9000, 128 }, lm.float32 }, { { 4, 256, 48, 48 }, lm.bfloat16 } }) do
            local sz, dt = c[1], c[2]
            lm.manual_seed(43)
            local fmt = #sz == 4 and lm.channels_last or nil
            local x0 = randn(sz, dt, fmt) * 3 + 5
            local r0 = randn(sz, dt, fmt)
            local g0 = randn(sz, dt, fmt)
            fast_case(H.fmt_list(sz) .. " " .. tostring(dt), dt, sz, true,
               { affine = true, relu = true, residual = true }, function(dev)
                  local function on_dev(t) return dev and t:to(dev) or t:clone() end
                  return on_dev(x0), on_dev(r0), on_dev(g0)
               end, dt == lm.float32 and 1e-4 or EXACT_TOL[tostring(dt)])
         end
      end)

      it("2-D input (N, C) and a strided weight", function()
         lm.manual_seed(25)
         local x = randn({ 10, 7 }, lm.float32)
         local wbig = randn({ 14 }, lm.float32)
         local w = wbig:as_strided({ 7 }, { 2 }, 0)
         local rm, rv = lm.zeros({ 7 }, CPU), lm.ones({ 7 }, CPU)
         local rmc, rvc = rm:to(DEV), rv:to(DEV)
         local y = F.batch_norm(x, rm, rv, w, nil, { training = true })
         local yc = F.batch_norm(on(x), rmc, rvc, on(wbig):as_strided({ 7 }, { 2 }, 0), nil,
            { training = true })
         cmp(yc, y, 1e-4, "2-D")
         cmp(rmc, rm, 1e-5, "2-D running_mean")
         cmp(rvc, rv, 1e-5, "2-D running_var")
      end)

      it("float64 running statistics with a float32 input are refused, as on the CPU", function()
         -- PyTorch: "mixed dtype (CPU): expect parameter to have scalar type of Float"; the
         -- statistics are not touched
         lm.manual_seed(26)
         local x = randn({ 4, 3, 5, 5 }, lm.float32, lm.channels_last)
         local rmc = lm.zeros({ 3 }, { device = "cpu", dtype = lm.float64 }):to(DEV)
         local rvc = lm.ones({ 3 }, { device = "cpu", dtype = lm.float64 }):to(DEV)
         local ok, e = pcall(F.batch_norm, on(x), rmc, rvc, nil, nil,
                             { training = true, momentum = 0.5 })
         assert.is_false(ok)
         assert.matches("lumen.batch_norm: running_mean is float64 but the input is float32",
                        tostring(e), 1, true)
         assert.are.equal(0, rmc:cpu():abs():sum():item())
         assert.are.equal(3, rvc:cpu():sum():item())
      end)

      it("bad input raises the front end's error on cuda:0", function()
         local x = lm.randn({ 1, 3, 1, 1 }, { device = DEV })
         local ok, e = pcall(F.batch_norm, x, nil, nil, nil, nil, { training = true })
         assert.is_false(ok)
         assert.matches("lumen.batch_norm: ", tostring(e), 1, true)
         ok, e = pcall(F.batch_norm, x, nil, nil, nil, nil, { training = false })
         assert.is_false(ok)
         assert.matches("lumen.batch_norm: ", tostring(e), 1, true)
      end)
   end)

   -- ---------------------------------------------------------------------------------------------
   describe("matmul", function()
      local MM_DTYPES = { lm.float32, lm.float64, lm.float16, lm.bfloat16 }
      local function check(a, b, what, dt)
         cmp(on(a):matmul(on(b)), a:matmul(b), EXACT_TOL[tostring(dt)], what)
      end

      for _, dt in ipairs(MM_DTYPES) do
         it(tostring(dt) .. ": 2-D, transposed, batched, broadcast, vectors", function()
            lm.manual_seed(30)
            local r = function(sz) return randn(sz, dt) end
            check(r({ 5, 7 }), r({ 7, 3 }), "2-D", dt)
            check(r({ 7, 5 }):t(), r({ 7, 3 }), "a transposed", dt)
            check(r({ 5, 7 }), r({ 3, 7 }):t(), "b transposed", dt)
            check(r({ 7, 5 }):t(), r({ 3, 7 }):t(), "both transposed", dt)
            check(r({ 1, 7 }), r({ 7, 1 }), "1x1 result", dt)
            check(r({ 33, 65 }), r({ 65, 17 }), "odd sizes", dt)
            check(r({ 4, 5, 7 }), r({ 4, 7, 3 }), "batched", dt)
            check(r({ 4, 5, 7 }), r({ 7, 3 }), "batched x 2-D (shared b)", dt)
            check(r({ 5, 7 }), r({ 4, 7, 3 }), "2-D x batched (shared a)", dt)
            check(r({ 2, 1, 5, 7 }), r({ 3, 7, 4 }), "broadcast batch dims", dt)
            check(r({ 4, 7, 5 }):transpose(2, 3), r({ 4, 3, 7 }):transpose(2, 3),
               "batched transposed", dt)
            check(r({ 5, 4, 7 }):transpose(1, 2), r({ 4, 7, 3 }), "batch dim not outermost", dt)
            check(r({ 7 }), r({ 7, 3 }), "vector x matrix", dt)
            check(r({ 5, 7 }), r({ 7 }), "matrix x vector", dt)
            check(r({ 7 }), r({ 7 }), "dot", dt)
            check(r({ 3, 5, 7 }), r({ 7 }), "batched x vector", dt)
            check(r({ 7 }), r({ 2, 7, 4 }), "vector x batched", dt)
         end)

         it(tostring(dt) .. ": non-dense operands (copied to dense on the device)", function()
            lm.manual_seed(31)
            local big = randn({ 10, 14 }, dt)
            -- every other row and column: both strides > 1
            local a = big:as_strided({ 5, 7 }, { 28, 2 }, 0)
            local b = randn({ 7, 6 }, dt)
            cmp(on(big):as_strided({ 5, 7 }, { 28, 2 }, 0):matmul(on(b)), a:matmul(b),
               EXACT_TOL[tostring(dt)], "doubly strided a")
            -- an expanded matrix (a zero stride along a dim of size > 1)
            local col = randn({ 7, 1 }, dt)
            local e = col:expand({ 7, 4 })
            local x = randn({ 5, 7 }, dt)
            cmp(on(x):matmul(on(col):expand({ 7, 4 })), x:matmul(e), EXACT_TOL[tostring(dt)],
               "expanded b")
            -- batch dims that do not collapse into one stride
            local b2 = randn({ 4, 3, 7, 2 }, dt)
            local bbc = randn({ 3, 4, 5, 7 }, dt)
            cmp(on(bbc):permute(2, 1, 3, 4):matmul(on(b2)), bbc:permute(2, 1, 3, 4):matmul(b2),
               EXACT_TOL[tostring(dt)], "permuted batch dims")
         end)

         it(tostring(dt) .. ": an empty inner dim gives zeros, empty outer dims nothing", function()
            local a, b = randn({ 3, 0 }, dt), randn({ 0, 4 }, dt)
            cmp(on(a):matmul(on(b)), a:matmul(b), 0, "k = 0")
            local a2, b2 = randn({ 0, 5 }, dt), randn({ 5, 4 }, dt)
            cmp(on(a2):matmul(on(b2)), a2:matmul(b2), 0, "m = 0")
         end)
      end

      it("random shapes, float32", function()
         lm.manual_seed(32)
         math.randomseed(32)
         for _ = 1, 20 do
            local m, n, k = math.random(1, 40), math.random(1, 40), math.random(1, 70)
            local bt = math.random(1, 3)
            local a = math.random(2) == 1 and randn({ bt, m, k }, lm.float32)
               or randn({ bt, k, m }, lm.float32):transpose(2, 3)
            local b = math.random(2) == 1 and randn({ bt, k, n }, lm.float32)
               or randn({ bt, n, k }, lm.float32):transpose(2, 3)
            cmp(on(a):matmul(on(b)), a:matmul(b), 1e-4, ("%dx%dx%dx%d"):format(bt, m, k, n))
         end
      end)

      it("F.linear with a bias in bfloat16 (addmm's accumulate: one rounding)", function()
         lm.manual_seed(33)
         for _, dt in ipairs({ lm.bfloat16, lm.float32, lm.float64 }) do
            local x, w, b = randn({ 6, 9 }, dt), randn({ 5, 9 }, dt), randn({ 5 }, dt)
            cmp(F.linear(on(x), on(w), on(b)), F.linear(x, w, b), EXACT_TOL[tostring(dt)],
               "linear " .. tostring(dt))
         end
      end)

      it("gradients through matmul", function()
         lm.manual_seed(34)
         local a0, b0 = randn({ 3, 5, 7 }, lm.float32), randn({ 7, 4 }, lm.float32)
         local function run(dev)
            local a = (dev and a0:to(dev) or a0:clone()):requires_grad_()
            local b = (dev and b0:to(dev) or b0:clone()):requires_grad_()
            a:matmul(b):sum():backward()
            return a.grad, b.grad
         end
         local ga, gb = run(nil)
         local gac, gbc = run(DEV)
         cmp(gac, ga, 1e-4, "grad a")
         cmp(gbc, gb, 1e-4, "grad b")
      end)

      it("bad input raises the front end's error on cuda:0", function()
         local a = lm.randn({ 2, 3 }, { device = DEV })
         local b = lm.randn({ 4, 5 }, { device = DEV })
         local ok, e = pcall(function() return a:matmul(b) end)
         assert.is_false(ok)
         assert.matches("mat1 and mat2 shapes cannot be multiplied", tostring(e), 1, true)
      end)
   end)
end)
