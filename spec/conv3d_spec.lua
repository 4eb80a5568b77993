-- F.conv3d and nn.Conv3d (src/ops/conv3d.c: one conv2d over the batch N*Do with the depth taps
-- side by side in the channels): values and gradients against PyTorch 2.15 fixtures
-- (spec/fixtures/nn/conv3d.lua, gen_conv3d.py) in float64 and float32, contiguous and
-- channels_last_3d, on every ISA path; output and gradient strides (channels_last_3d in,
-- channels_last_3d out, as PyTorch's float32 path); the fused epilogue; strided inputs; the
-- half dtypes; float64 gradchecks; bad input.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local C = require("lumen.C")
local lm = H.lm
local F = lm.F

local CL3, CONTIG = lm.channels_last_3d, lm.contiguous_format
local close = G.close

-- a fixture tensor in dtype and format (5-D only), a fresh leaf
local function fx(d, dtype, fmt, rg)
   if d == nil then return nil end
   local t = lm.tensor(d.data, { dtype = dtype or lm.float64 }):view(d.sizes)
   if fmt and #d.sizes == 5 then t = t:to(fmt) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local isas = H.isas -- 1 (portable C), then this CPU's best

-- LUMEN_CONV3D_SPLIT: "0" packs the depth taps into one conv2d, "1" runs one conv2d per tap,
-- nil lets lm_conv3d choose (src/ops/conv3d.c, split_taps)
local ffi = require("ffi")
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
local function with_split(mode, f)
   if mode then ffi.C.setenv("LUMEN_CONV3D_SPLIT", mode, 1) end
   local ok, e = pcall(f)
   ffi.C.unsetenv("LUMEN_CONV3D_SPLIT")
   if not ok then error(e, 0) end
end
local SPLITS = { false, "0", "1" }

local function fmt_strides(fmt, sizes)
   if #sizes ~= 5 then return H.contig_strides(sizes) end
   return tostring(fmt) == "channels_last_3d" and H.cl3d_strides(sizes) or H.contig_strides(sizes)
end

describe("conv3d against PyTorch", function()
   local P = G.fixture("conv3d")
   after_each(function() C.lm_gemm_set_isa(0) end)
   for _, c in ipairs(P.conv3d) do
      local fmts = #c.x.sizes == 5 and { CONTIG, CL3 } or { CONTIG }
      for _, dt in ipairs({ { lm.float64, 1e-7 }, { lm.float32, 2e-4 } }) do
         for _, fmt in ipairs(fmts) do
            it(("%s %s %s"):format(c.name, tostring(dt[1]), tostring(fmt)), function()
               local function run(isa, split)
                  C.lm_gemm_set_isa(isa)
                  local what = (" (isa %d, split %s)"):format(isa, tostring(split))
                  local x, w = fx(c.x, dt[1], fmt, true), fx(c.w, dt[1], fmt, true)
                  local b = fx(c.b, dt[1], nil, true)
                  local y = F.conv3d(x, w, b, c.opts)
                  H.assert_sizes(y, c.out.sizes, "output")
                  H.assert_dtype(y, dt[1], "output")
                  close(y, c.out.data, dt[2], "output" .. what)
                  H.assert_strides(y, fmt_strides(fmt, c.out.sizes), "output")
                  y:backward(fx(c.gout, dt[1]))
                  close(x.grad, c.gx.data, dt[2], "grad input" .. what)
                  close(w.grad, c.gw.data, dt[2], "grad weight" .. what)
                  if b then close(b.grad, c.gb.data, dt[2], "grad bias" .. what) end
                  H.assert_strides(x.grad, fmt_strides(fmt, c.x.sizes), "grad input" .. what)
                  H.assert_strides(w.grad, fmt_strides(fmt, c.w.sizes), "grad weight" .. what)
               end
               for _, isa in ipairs(isas()) do
                  for _, split in ipairs(SPLITS) do
                     with_split(split, function() run(isa, split) end)
                  end
               end
            end)
         end
      end
   end

   it("gives channels_last_3d outputs and gradients as PyTorch's float32 path does", function()
      local torch_cl = 0
      for _, c in ipairs(P.conv3d) do
         if c.torch_cl3d_strides then
            local x, w = fx(c.x, lm.float32, CL3, true), fx(c.w, lm.float32, CL3, true)
            local y = F.conv3d(x, w, fx(c.b, lm.float32), c.opts)
            y:backward(fx(c.gout, lm.float32))
            local want = H.cl3d_strides(c.out.sizes)
            if H.list_equal(c.torch_cl3d_strides, want) then
               torch_cl = torch_cl + 1
               H.assert_strides(y, c.torch_cl3d_strides, c.name .. " output")
               H.assert_strides(x.grad, c.torch_cl3d_gx_strides, c.name .. " grad input")
               H.assert_strides(w.grad, c.torch_cl3d_gw_strides, c.name .. " grad weight")
            else
               -- PyTorch's slow path (here: a tiny input) returns contiguous; lumen keeps
               -- channels_last_3d whatever the kernel (issue 19's rule)
               assert(H.list_equal(c.torch_cl3d_strides, H.contig_strides(c.out.sizes)), c.name)
               H.assert_strides(y, want, c.name .. " output")
            end
         end
      end
      assert(torch_cl >= 9, "PyTorch kept channels_last_3d in " .. torch_cl .. " cases")
   end)

   it("follows the weight's format too (contiguous input, channels_last_3d weight)", function()
      local c = P.conv3d[1]
      local y = F.conv3d(fx(c.x, lm.float32), fx(c.w, lm.float32, CL3), fx(c.b, lm.float32),
                         c.opts)
      H.assert_strides(y, H.cl3d_strides(c.out.sizes), "output")
      close(y, c.out.data, 2e-4, "output")
   end)
end)

describe("conv3d", function()
   after_each(function() C.lm_gemm_set_isa(0) end)

   for _, fmt in ipairs({ CONTIG, CL3 }) do
      it("passes gradcheck in float64 (" .. tostring(fmt) .. ")", function()
         local x = G.input({ 2, 4, 4, 3, 5 }, fmt, 31)
         local w = G.input({ 6, 2, 3, 2, 3 }, fmt, 32)
         local b = G.input({ 6 }, nil, 33)
         G.check(function(u, v, z) return F.conv3d(u, v, z, { padding = { 1, 1, 0 }, groups = 2,
                                                              stride = { 2, 1, 1 } }) end,
                 { x, w, b })
         local w2 = G.input({ 3, 4, 1, 1, 1 }, fmt, 34)
         G.check(function(u, v) return F.conv3d(u, v, nil, { stride = 2 }) end, { x, w2 })
         local w3 = G.input({ 3, 4, 2, 2, 2 }, fmt, 35)
         G.check(function(u, v) return F.conv3d(u, v, nil, { dilation = { 2, 1, 2 },
                                                             padding = { 2, 0, 1 } }) end,
                 { x, w3 })
      end)
   end

   it("reads strided inputs (narrowed, permuted) as their dense copies", function()
      lm.manual_seed(3)
      local x = lm.randn({ 2, 5, 4, 6, 9 }):narrow(5, 2, 6)       -- not dense
      local w = lm.randn({ 7, 5, 3, 3, 2 }):permute({ 1, 2, 3, 5, 4 }) -- 7x5x3x2x3, permuted
      local b = lm.randn({ 7 })
      local ref = F.conv3d(x:contiguous(), w:contiguous(), b, { padding = 1 })
      local y = F.conv3d(x, w, b, { padding = 1 })
      close(y, ref, 1e-5, "strided")
      local y2 = F.conv3d(x:contiguous(CL3), w, b, { padding = 1 })
      close(y2, ref, 1e-5, "channels_last_3d")
      assert(y2:is_contiguous(CL3), H.describe(y2))
   end)

   it("fuses bias, residual and relu into the epilogue, equal to the separate ops", function()
      lm.manual_seed(5)
      for _, split in ipairs(SPLITS) do with_split(split, function()
      for _, fmt in ipairs({ CONTIG, CL3 }) do
         for _, k in ipairs({ { 3, 3, 3 }, { 1, 1, 1 }, { 1, 3, 3 }, { 3, 1, 1 } }) do
            local x = lm.randn({ 2, 6, 4, 5, 6 }):to(fmt)
            local w = lm.randn({ 6, 6, k[1], k[2], k[3] }):to(fmt)
            local b = lm.randn({ 6 })
            local pad = { (k[1] - 1) / 2, (k[2] - 1) / 2, (k[3] - 1) / 2 }
            local r = lm.randn({ 2, 6, 4, 5, 6 }):to(fmt)
            local ref = F.relu(F.conv3d(x, w, b, { padding = pad }) + r)
            local y
            lm.no_grad(function()
               y = F.conv3d(x, w, b, { padding = pad, residual = r, relu = true })
            end)
            close(y, ref, 1e-5, tostring(fmt) .. " fused")
            -- with a gradient wanted: the separate, differentiable ops
            local xg = x:detach():requires_grad_(true)
            local y2 = F.conv3d(xg, w, b, { padding = pad, residual = r, relu = true })
            close(y2, ref, 1e-5, "differentiable")
            y2:sum():backward()
            assert(xg.grad ~= nil)
         end
      end
      end) end
   end)

   it("runs float16 and bfloat16 as the rounded float32 convolution", function()
      lm.manual_seed(9)
      for _, dt in ipairs({ lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ CONTIG, CL3 }) do
            local x = lm.randn({ 2, 4, 3, 5, 6 }):to(dt):to(fmt)
            local w = (lm.randn({ 8, 4, 3, 3, 3 }) * 0.2):to(dt):to(fmt)
            local y = F.conv3d(x, w, nil, { padding = 1 })
            H.assert_dtype(y, dt, "output")
            assert(y:is_contiguous(fmt), H.describe(y))
            local ref = F.conv3d(x:float(), w:float(), nil, { padding = 1 })
            close(y:float(), ref, dt == lm.bfloat16 and 2e-2 or 2e-3, tostring(dt))
         end
      end
   end)

   it("handles unbatched input and empty batches", function()
      local x = lm.randn({ 3, 4, 5, 5 })
      local w = lm.randn({ 2, 3, 2, 2, 2 })
      local y = F.conv3d(x, w)
      H.assert_sizes(y, { 2, 3, 4, 4 }, "unbatched")
      close(y, F.conv3d(x:unsqueeze(1), w):squeeze(1), 1e-6, "unbatched")
      local e = lm.randn({ 0, 3, 4, 5, 5 }):requires_grad_(true)
      local wg = w:detach():requires_grad_(true)
      local ye = F.conv3d(e, wg)
      H.assert_sizes(ye, { 0, 2, 3, 4, 4 }, "empty")
      ye:sum():backward()
      close(wg.grad, lm.zeros({ 2, 3, 2, 2, 2 }), 0, "empty batch weight gradient")
   end)

   it("runs depth-only kernels (kd x 1 x 1) as GEMMs in place, equal to the conv2d route",
      function()
      -- src/ops/conv3d.c temporal_products; LUMEN_CONV3D_GEMM=0 is the gathered conv2d route
      local function both(f)
         local a = f()
         ffi.C.setenv("LUMEN_CONV3D_GEMM", "0", 1)
         local ok, b = pcall(f)
         ffi.C.unsetenv("LUMEN_CONV3D_GEMM")
         assert(ok, b)
         return a, b
      end
      lm.manual_seed(17)
      for _, c in ipairs({ { k = 3, p = 1, d = 1 }, { k = 3, p = 0, d = 2 },
                           { k = 2, p = 2, d = 1 }, { k = 5, p = 2, d = 1, n = 3 },
                           { k = 3, p = 4, d = 1 } }) do
         for _, dt in ipairs({ lm.float64, lm.float32, lm.bfloat16 }) do
            local tol = dt == lm.bfloat16 and 2e-2 or dt == lm.float32 and 1e-5 or 1e-12
            local x0 = lm.randn({ c.n or 2, 6, 5, 4, 3 }, { dtype = dt }):to(CL3)
            local w0 = lm.randn({ 7, 6, c.k, 1, 1 }, { dtype = dt }):to(CL3)
            local b0 = lm.randn({ 7 }, { dtype = dt })
            local opts = { padding = { c.p, 0, 0 }, dilation = { c.d, 1, 1 } }
            local run = function()
               local x, w = x0:detach():requires_grad_(true), w0:detach():requires_grad_(true)
               local b = b0:detach():requires_grad_(true)
               local y = F.conv3d(x, w, b, opts)
               y:backward(y:detach() * 0.5 + 1)
               return { y, x.grad, w.grad, b.grad }
            end
            local a, r = both(run)
            for i = 1, 4 do
               close(a[i], r[i], tol, ("k %d p %d d %d %s result %d"):format(c.k, c.p, c.d,
                     tostring(dt), i))
            end
            H.assert_strides(a[1], H.cl3d_strides(a[1]:size()), "output")
            -- fused residual + relu, and a non-dense input
            local res = lm.randn(a[1]:size(), { dtype = dt }):to(CL3)
            local fa, fr = both(function()
               return lm.no_grad(function()
                  return F.conv3d(x0:narrow(2, 1, 6), w0, b0,
                                  { padding = opts.padding, dilation = opts.dilation,
                                    residual = res, relu = true })
               end)
            end)
            close(fa, fr, tol, "fused")
         end
      end
   end)

   it("gives PyTorch's sizes and strides on the meta device, without data", function()
      local M = { device = "meta" }
      local x = lm.empty({ 2, 4, 5, 6, 7 }, M):contiguous(CL3):requires_grad_(true)
      local w = lm.empty({ 6, 4, 3, 3, 3 }, M):requires_grad_(true)
      local y = F.conv3d(x, w, nil, { padding = 1 })
      assert.equal("meta", y:device())
      H.assert_layout(y, { 2, 6, 5, 6, 7 }, { 1260, 1, 252, 42, 6 }, "output")
      y:backward(lm.empty(y:size(), M))
      H.assert_strides(x.grad, { 840, 1, 168, 28, 4 }, "grad input")
      H.assert_strides(w.grad, { 108, 27, 9, 3, 1 }, "grad weight (the leaf's layout)")
      H.assert_layout(F.conv3d(x:contiguous(), w, nil, { padding = 1, stride = 2 }),
                      { 2, 6, 3, 3, 4 }, { 216, 36, 12, 4, 1 }, "NCDHW, stride 2")
   end)

   it("gives the same gradients run after run (conv2d's fixed reduction order)", function()
      lm.manual_seed(13)
      local x0 = lm.randn({ 2, 8, 4, 6, 6 }):to(CL3)
      local w0 = lm.randn({ 8, 8, 3, 3, 3 }):to(CL3)
      local ref
      for _ = 1, 2 do
         local x, w = x0:detach():requires_grad_(true), w0:detach():requires_grad_(true)
         F.conv3d(x, w, nil, { padding = 1 }):sum():backward()
         if ref then assert(lm.equal(x.grad, ref[1]) and lm.equal(w.grad, ref[2])) end
         ref = { x.grad, w.grad }
      end
   end)

   it("rejects bad input with errors naming conv3d", function()
      local x = lm.randn({ 1, 4, 3, 5, 5 })
      local w = lm.randn({ 2, 4, 3, 3, 3 })
      H.assert_error_like("conv3d", "5-D", F.conv3d, lm.randn({ 4, 25 }), w)
      H.assert_error_like("conv3d", "weight must be 5-D", F.conv3d, x, lm.randn({ 2, 4, 3, 3 }))
      H.assert_error_like("conv3d", "channels", F.conv3d, x, lm.randn({ 2, 3, 3, 3, 3 }))
      H.assert_error_like("conv3d", "dtype", F.conv3d, x, w:double())
      H.assert_error_like("conv3d", "floating", F.conv3d, x:long(), w:long())
      H.assert_error_like("conv3d", "can't be greater", F.conv3d, x, w, nil, { padding = 0,
                          dilation = 2 })
      H.assert_error_like("conv3d", "stride", F.conv3d, x, w, nil, { stride = 0 })
      H.assert_error_like("conv3d", "stride", F.conv3d, x, w, nil, { stride = { 1, 2 } })
      H.assert_error_like("conv3d", "padding", F.conv3d, x, w, nil, { padding = -1 })
      H.assert_error_like("conv3d", "groups", F.conv3d, x, w, nil, { groups = 3 })
      H.assert_error_like("conv3d", "bias", F.conv3d, x, w, lm.randn({ 3 }))
      H.assert_error_like("conv3d", "unknown option", F.conv3d, x, w, nil, { strides = 1 })
      H.assert_error_like("conv3d", "strided", F.conv3d, x, w, nil, { padding = "same",
                          stride = 2 })
      H.assert_error_like("conv3d", "input", F.conv3d, nil, w)
      H.assert_error_like("conv3d", "residual", F.conv3d, x, w, nil,
                          { residual = lm.randn({ 1, 2, 1, 3, 4 }) })
   end)
end)

describe("nn.Conv3d", function()
   it("holds PyTorch's parameters and prints as PyTorch does", function()
      local m = lm.nn.Conv3d(4, 6, { 3, 7, 7 }, { stride = { 1, 2, 2 }, padding = { 1, 3, 3 },
                                                  bias = false })
      H.assert_sizes(m.weight, { 6, 4, 3, 7, 7 }, "weight")
      assert.is_nil(m.bias)
      assert.are.equal("Conv3d(4, 6, kernel_size=(3, 7, 7), stride=(1, 2, 2), " ..
                       "padding=(1, 3, 3), bias=False)", tostring(m))
      local m2 = lm.nn.Conv3d(4, 8, 3, { groups = 2, dilation = 2, padding = "same" })
      assert.are.equal("Conv3d(4, 8, kernel_size=(3, 3, 3), stride=(1, 1, 1), padding=same, " ..
                       "dilation=(2, 2, 2), groups=2)", tostring(m2))
      H.assert_sizes(m2.bias, { 8 }, "bias")
      local x = lm.randn({ 1, 4, 5, 6, 7 })
      close(m2(x), F.conv3d(x, m2.weight, m2.bias, { groups = 2, dilation = 2, padding = 2 }),
            1e-6, "forward")
   end)

   it("becomes channels_last_3d under lm.to_channels_last and trains there", function()
      lm.manual_seed(21)
      local m = lm.nn.Sequential(lm.nn.Conv3d(3, 8, 3, { padding = 1 }), lm.nn.BatchNorm3d(8),
                                 lm.nn.ReLU(), lm.nn.Conv3d(8, 4, { 1, 3, 3 }))
      lm.to_channels_last(m)
      assert(m[1].weight:is_contiguous(CL3), H.describe(m[1].weight))
      local x = lm.randn({ 2, 3, 4, 6, 6 }):to(CL3)
      local y = m(x)
      assert(y:is_contiguous(CL3), H.describe(y))
      y:sum():backward()
      assert(m[1].weight.grad:is_contiguous(CL3), H.describe(m[1].weight.grad))
      assert(m[4].weight.grad:is_contiguous(CL3), H.describe(m[4].weight.grad))
   end)

   it("rejects bad arguments with errors naming Conv3d", function()
      H.assert_error_like("Conv3d", "kernel_size", lm.nn.Conv3d, 3, 4, { 3, 3 })
      H.assert_error_like("Conv3d", "divisible", lm.nn.Conv3d, 3, 4, 3, { groups = 2 })
      H.assert_error_like("Conv3d", "padding", lm.nn.Conv3d, 3, 4, 3, { padding = -1 })
      H.assert_error_like("Conv3d", "strided", lm.nn.Conv3d, 3, 4, 3, { padding = "same",
                          stride = 2 })
      H.assert_error_like("Conv3d", "padding_mode", lm.nn.Conv3d, 3, 4, 3,
                          { padding_mode = "reflect" })
   end)
end)
