-- The 3-D pools (F.max_pool3d, F.avg_pool3d, F.adaptive_avg_pool3d, F.adaptive_max_pool3d;
-- src/ops/pool3d.c, kernels/cpu/pool3d.c) and their modules: values, indices and gradients
-- against PyTorch 2.15 fixtures (spec/fixtures/nn/pool3d.lua, gen_pool3d.py) in float32 and
-- float64, contiguous and channels_last_3d input, odd sizes, size-1 dims, padding, ceil_mode,
-- dilation, divisor_override, unbatched input; output and gradient layouts (issue 19's rule: a
-- channels_last_3d input gives channels_last_3d results for every op, where PyTorch 2.15 gives
-- contiguous for avg_pool3d and the adaptive pools); float64 gradchecks; every ISA path;
-- float16 / bfloat16; bad input. Under LUMEN_TEST_DEVICE=cuda:0 (make test-cuda-emu, a GPU) the
-- same checks run on the CUDA kernels (kernels/cuda/pool3d.cu; spec/cuda_pool3d_spec.lua compares
-- them with the CPU's).

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local C = require("lumen.C")
local lm = H.lm
local F = lm.F

local CL3, CONTIG = lm.channels_last_3d, lm.contiguous_format
local DTYPES = { { lm.float64, 1e-7 }, { lm.float32, 2e-5 } }
local close = G.close

-- a fixture tensor in dtype and format (5-D only), a fresh leaf
local function fx(d, dtype, fmt, rg)
   local t = lm.tensor(d.data, { dtype = dtype or lm.float64 }):view(d.sizes)
   if fmt and #d.sizes == 5 then t = t:to(fmt) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function assert_format(t, fmt, what)
   if tostring(fmt) == "channels_last_3d" then
      assert(t:is_contiguous(CL3) and tostring(t:suggest_memory_format()) == "channels_last_3d",
             (what or "") .. ": expected channels_last_3d, got " .. H.describe(t))
   else
      assert(t:is_contiguous(), (what or "") .. ": expected contiguous, got " .. H.describe(t))
   end
end

local isas = H.isas -- 1 (portable C), then this CPU's best

-- the four ops as (x, case) -> out[, indices]
local RUN = {
   max_pool3d = function(x, c)
      local o = {}
      for k, v in pairs(c.opts) do o[k] = v end
      o.return_indices = true
      return F.max_pool3d(x, o)
   end,
   avg_pool3d = function(x, c) return F.avg_pool3d(x, c.opts) end,
   adaptive_avg_pool3d = function(x, c) return F.adaptive_avg_pool3d(x, c.size) end,
   adaptive_max_pool3d = function(x, c) return F.adaptive_max_pool3d(x, c.size, true) end,
}
local OPS = { "max_pool3d", "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d" }

describe("3-D pools against PyTorch", function()
   local P = G.fixture("pool3d")
   after_each(function() C.lm_gemm_set_isa(0) end)

   for _, name in ipairs(OPS) do
      for _, c in ipairs(P[name]) do
         local fmts = #c.x.sizes == 5 and { CONTIG, CL3 } or { CONTIG }
         for _, dt in ipairs(DTYPES) do
            for _, fmt in ipairs(fmts) do
               it(("%s %s %s %s"):format(name, c.name, tostring(dt[1]), tostring(fmt)), function()
                  for _, isa in ipairs(isas()) do
                     C.lm_gemm_set_isa(isa)
                     local x = fx(c.x, dt[1], fmt, true)
                     local out, idx = RUN[name](x, c)
                     H.assert_sizes(out, c.out.sizes, "output")
                     close(out, c.out.data, dt[2], "output")
                     assert_format(out, fmt, "output")
                     H.assert_dtype(out, dt[1], "output")
                     if c.indices then
                        local exp = {}
                        for k, e in ipairs(c.indices.data) do exp[k] = e + 1 end -- 1-based
                        H.assert_values(idx, exp, "indices")
                        H.assert_dtype(idx, lm.int64, "indices")
                        assert_format(idx, fmt, "indices")
                     end
                     local h = x * 1
                     local box = {}
                     h:register_hook(function(g) box.g = g end)
                     local o2 = RUN[name](h, c)
                     o2:backward(fx(c.gout, dt[1]))
                     close(box.g, c.gx.data, dt[2], "grad input")
                     assert_format(box.g, fmt, "grad input")
                  end
               end)
            end
         end
      end
   end

   it("keeps channels_last_3d for every op (PyTorch 2.15: max_pool3d only), same values",
      function()
      local torch_keeps = { max_pool3d = 0, avg_pool3d = 0, adaptive_avg_pool3d = 0,
                            adaptive_max_pool3d = 0 }
      for _, name in ipairs(OPS) do
         for _, c in ipairs(P[name]) do
            if c.torch_cl3d_strides then
               local s = c.torch_cl3d_strides
               local sz = c.out.sizes
               -- PyTorch's strides are channels_last_3d ones (unambiguous cases: C > 1 and
               -- some spatial size > 1)
               local ambiguous = sz[2] == 1 or sz[3] * sz[4] * sz[5] == 1
               local cl = H.list_equal(s, H.cl3d_strides(sz))
               if not ambiguous and cl then torch_keeps[name] = torch_keeps[name] + 1 end
               if not ambiguous and not cl then
                  assert(H.list_equal(s, H.contig_strides(sz)), name .. " " .. c.name)
               end
               local x = fx(c.x, lm.float64, CL3)
               local a = RUN[name](x, c)
               local b = RUN[name](fx(c.x, lm.float64, CONTIG), c)
               H.assert_strides(a, H.cl3d_strides(sz), name .. " " .. c.name)
               H.assert_strides(b, H.contig_strides(sz), name .. " " .. c.name)
               assert(lm.equal(a, b), name .. " " .. c.name .. ": values differ by layout")
            end
         end
      end
      assert(torch_keeps.max_pool3d > 0, "PyTorch keeps channels_last_3d for max_pool3d")
      assert.are.equal(0, torch_keeps.avg_pool3d)
      assert.are.equal(0, torch_keeps.adaptive_avg_pool3d + torch_keeps.adaptive_max_pool3d
                          - 0, "PyTorch's adaptive pools return contiguous")
   end)
end)

describe("3-D pools", function()
   after_each(function() C.lm_gemm_set_isa(0) end)

   for _, fmt in ipairs({ CONTIG, CL3 }) do
      it("pass gradcheck in float64 (" .. tostring(fmt) .. ")", function()
         local x = G.input({ 2, 3, 4, 5, 3 }, fmt, 19)
         G.check(function(u) return F.max_pool3d(u, { kernel_size = 2, stride = 1 }) end, { x })
         G.check(function(u) return F.max_pool3d(u, { kernel_size = { 3, 2, 3 }, stride = 2,
                                                     padding = 1, ceil_mode = true }) end, { x })
         G.check(function(u) return F.max_pool3d(u, { kernel_size = 2, dilation = { 2, 1, 2 },
                                                     stride = 1 }) end, { x })
         G.check(function(u) return F.avg_pool3d(u, { kernel_size = 3, stride = 2, padding = 1,
                                                     count_include_pad = false }) end, { x })
         G.check(function(u) return F.avg_pool3d(u, { kernel_size = { 2, 3, 2 }, ceil_mode = true,
                                                     divisor_override = 3 }) end, { x })
         G.check(function(u) return F.adaptive_avg_pool3d(u, { 3, 2, 4 }) end, { x })
         G.check(function(u) return F.adaptive_max_pool3d(u, { 2, 3, 2 }) end, { x })
      end)
   end

   it("gives the same results on every ISA path and for strided input", function()
      lm.manual_seed(7)
      local base = lm.randn({ 3, 37, 5, 6, 7 })
      local strided = lm.randn({ 3, 37, 5, 6, 15 }):narrow(5, 2, 7):copy_(base)
      local ops = {
         function(x) return F.max_pool3d(x, { kernel_size = 3, stride = 2, padding = 1 }) end,
         function(x) return F.avg_pool3d(x, { kernel_size = 2, ceil_mode = true }) end,
         function(x) return F.adaptive_avg_pool3d(x, { 2, 4, 3 }) end,
         function(x) return F.adaptive_max_pool3d(x, 3) end,
      }
      for k, f in ipairs(ops) do
         local ref
         for _, isa in ipairs(isas()) do
            C.lm_gemm_set_isa(isa)
            for _, x in ipairs({ base, base:contiguous(CL3), strided }) do
               local y = f(x):contiguous()
               ref = ref or y
               close(y, ref, 1e-6, "op " .. k)
            end
         end
      end
   end)

   it("gives bit-identical gradients for any thread count (the backwards are deterministic)",
      function()
      local threads0 = lm.get_num_threads()
      lm.manual_seed(11)
      local x0 = lm.randn({ 2, 40, 5, 6, 7 })
      local ops = {
         function(u) return F.max_pool3d(u, { kernel_size = 3, stride = 1, padding = 1 }) end,
         function(u) return F.avg_pool3d(u, { kernel_size = 3, stride = 2, padding = 1,
                                              ceil_mode = true }) end,
         function(u) return F.adaptive_avg_pool3d(u, { 3, 4, 5 }) end,
         function(u) return F.adaptive_max_pool3d(u, { 4, 4, 4 }) end,
      }
      for _, fmt in ipairs({ CONTIG, CL3 }) do
         for k, f in ipairs(ops) do
            local ref
            for _, nt in ipairs({ 1, 2, 3 }) do
               lm.set_num_threads(nt)
               local x = x0:contiguous(fmt):detach():requires_grad_(true)
               local y = f(x)
               y:backward(lm.full(y:size(), 0.3))
               ref = ref or x.grad
               assert(lm.equal(ref, x.grad), ("op %d, %d threads"):format(k, nt))
            end
         end
      end
      lm.set_num_threads(threads0)
   end)

   it("follows PyTorch on NaN, -inf and ties in max pools", function()
      local x = lm.full({ 1, 2, 2, 2, 2 }, 1.0)
      x:select(1, 1):select(1, 1):select(1, 2):select(1, 1):select(1, 2):fill_(0 / 0)
      x:select(1, 1):select(1, 2):fill_(-1 / 0)
      for _, fmt in ipairs({ CONTIG, CL3 }) do
         local v, i = F.max_pool3d(x:contiguous(fmt), { kernel_size = 2, return_indices = true })
         local vv, ii = v:view({ 2 }):totable(), i:view({ 2 }):totable()
         assert(vv[1] ~= vv[1], "NaN wins")
         assert.are.equal(6, ii[1]) -- (d, h, w) = (1, 0, 1): flat 5, 1-based 6
         assert.are.equal(-1 / 0, vv[2])
         assert.are.equal(1, ii[2]) -- all -inf: the first tap
         local av, ai = F.adaptive_max_pool3d(x:contiguous(fmt), 1, true)
         assert(lm.equal(av:isnan(), v:isnan()) and lm.equal(ai, i))
      end
      -- a window without an input element (dilation and padding): -inf and index 0 (the
      -- kernels' -1, as max_pool2d; PyTorch 2.15 returns indices that name no tap there), and no
      -- gradient
      local e = lm.randn({ 1, 2, 1, 3, 3 })
      for _, fmt in ipairs({ CONTIG, CL3 }) do
         local xe = e:contiguous(fmt):detach():requires_grad_(true)
         local o = { kernel_size = { 2, 1, 1 }, stride = 1, padding = { 1, 0, 0 },
                     dilation = { 2, 1, 1 }, return_indices = true }
         local v, i = F.max_pool3d(xe, o)
         assert(lm.equal(v, lm.full({ 1, 2, 1, 3, 3 }, -1 / 0)))
         assert(lm.equal(i, lm.zeros({ 1, 2, 1, 3, 3 }, { dtype = lm.int64 })))
         v:sum():backward()
         assert(lm.equal(xe.grad, lm.zeros({ 1, 2, 1, 3, 3 })))
      end
      -- ties keep the first position
      local _, it1 = F.max_pool3d(lm.ones({ 1, 1, 3, 3, 3 }), { kernel_size = 2, stride = 1,
                                                               return_indices = true })
      assert.are.same({ 1, 2, 4, 5, 10, 11, 13, 14 }, it1:view({ 8 }):totable())
   end)

   it("computes float16 and bfloat16 in float32, rounded once, in the input's layout",
      function()
      lm.manual_seed(5)
      for _, dt in ipairs({ lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ CONTIG, CL3 }) do
            local x = lm.randn({ 2, 3, 4, 5, 6 }):to(dt):contiguous(fmt):requires_grad_(true)
            local x32 = x:detach():float():requires_grad_(true)
            for _, f in ipairs({
               function(u) return F.max_pool3d(u, { kernel_size = 2, padding = 1 }) end,
               function(u) return F.avg_pool3d(u, 3) end,
               function(u) return F.adaptive_avg_pool3d(u, { 2, 3, 4 }) end,
               function(u) return F.adaptive_max_pool3d(u, 2) end,
            }) do
               local y, y32 = f(x), f(x32)
               H.assert_dtype(y, dt)
               assert_format(y, fmt, "half output")
               assert(lm.equal(y, y32:to(dt)), "rounded once")
               x.grad, x32.grad = nil, nil
               y:sum():backward()
               y32:sum():backward()
               H.assert_dtype(x.grad, dt)
               assert_format(x.grad, fmt, "half gradient")
               assert(lm.equal(x.grad, x32.grad:to(dt)), "gradient rounded once")
            end
         end
      end
   end)

   it("lm_max_pool3d_backward_geom (autograd's): lm_max_pool3d_backward's gradient, its errors",
      function()
      local ffi = require("ffi")
      local wrap = require("lumen.tensor").wrap
      local pa, pb = ffi.new("lm_tensor*[1]"), ffi.new("lm_tensor*[1]")
      local function i3(a) return ffi.new("int64_t[3]", a[1], a[2], a[3]) end
      local function ok(st) assert(st == 0, ffi.string(C.lm_last_error())) end
      local K, S, P, D = i3({ 3, 2, 3 }), i3({ 2, 1, 2 }), i3({ 1, 1, 0 }), i3({ 1, 2, 1 })
      for _, fmt in ipairs({ CONTIG, CL3 }) do
         local x = ((lm.randn({ 2, 3, 5, 6, 8 }) * 2):round() / 2):contiguous(fmt)
         pa[0], pb[0] = nil, nil
         ok(C.lm_max_pool3d(x._c, K, S, P, D, 1, pa, pb))
         local out, ind = wrap(pa[0]), wrap(pb[0])
         local g = lm.randn(out:size()):contiguous(fmt)
         pa[0] = nil
         ok(C.lm_max_pool3d_backward(g._c, x._c, ind._c, pa))
         local ref = wrap(pa[0])
         pa[0] = nil
         ok(C.lm_max_pool3d_backward_geom(g._c, x._c, ind._c, K, S, P, D, 1, pa))
         local got = wrap(pa[0])
         assert(lm.equal(got, ref), "same gradient")
         H.assert_strides(got, ref:stride(), "same strides")
         -- the geometry must give grad_output's shape (ceil_mode 0: one output fewer here)
         pa[0] = nil
         local st = C.lm_max_pool3d_backward_geom(g._c, x._c, ind._c, K, S, P, D, 0, pa)
         assert(st ~= 0 and ffi.string(C.lm_last_error()):find("expected grad_output of shape",
                                                             1, true),
                ffi.string(C.lm_last_error()))
         local bad = ind:clone()
         bad:select(1, 1):select(1, 1):select(1, 1):select(1, 1):select(1, 1):fill_(5 * 6 * 8)
         pa[0] = nil
         st = C.lm_max_pool3d_backward_geom(g._c, x._c, bad._c, K, S, P, D, 1, pa)
         assert(st ~= 0 and ffi.string(C.lm_last_error()):find("out of range", 1, true),
                ffi.string(C.lm_last_error()))
      end
   end)

   it("takes unbatched C x D x H x W input and an empty batch", function()
      local x = lm.randn({ 3, 4, 5, 6 })
      local y = F.max_pool3d(x, 2)
      H.assert_sizes(y, { 3, 2, 2, 3 })
      assert(lm.equal(y, F.max_pool3d(x:unsqueeze(1), 2):squeeze(1)))
      H.assert_sizes(F.avg_pool3d(lm.randn({ 0, 3, 4, 5, 6 }), 2), { 0, 3, 2, 2, 3 })
      H.assert_sizes(F.adaptive_avg_pool3d(x, { 1, false, 2 }), { 3, 1, 5, 2 })
   end)

   it("rejects bad input", function()
      local x = lm.randn({ 1, 2, 4, 4, 4 })
      H.assert_error_like("max_pool3d", "5-d", F.max_pool3d, lm.randn({ 4, 4, 4 }), 2)
      H.assert_error_like("avg_pool3d", "5-d", F.avg_pool3d, lm.randn({ 1, 1, 1, 4, 4, 4 }), 2)
      H.assert_error_like("adaptive_avg_pool3d", "5-d", F.adaptive_avg_pool3d,
                          lm.randn({ 4, 4 }), 1)
      H.assert_error_like("adaptive_max_pool3d", "5-d", F.adaptive_max_pool3d,
                          lm.randn({ 4, 4 }), 1)
      H.assert_error_like("max_pool3d", "output size is too small", F.max_pool3d,
                          lm.randn({ 1, 1, 2, 4, 4 }), 3)
      H.assert_error_like("avg_pool3d", "output size is too small", F.avg_pool3d,
                          lm.randn({ 1, 1, 4, 2, 4 }), 3)
      H.assert_error_like("max_pool3d", "half", F.max_pool3d, x, { kernel_size = 2, padding = 2 })
      H.assert_error_like("avg_pool3d", "half", F.avg_pool3d, x,
                          { kernel_size = { 2, 3, 2 }, padding = { 0, 0, 2 } })
      H.assert_error_like("max_pool3d", "kernel_size", F.max_pool3d, x, 0)
      H.assert_error_like("max_pool3d", "kernel_size", F.max_pool3d, x, { 2, 2 })
      H.assert_error_like("max_pool3d", "stride", F.max_pool3d, x, { kernel_size = 2, stride = 0 })
      H.assert_error_like("max_pool3d", "dilation", F.max_pool3d, x,
                          { kernel_size = 2, dilation = 0 })
      H.assert_error_like("avg_pool3d", "divisor", F.avg_pool3d, x,
                          { kernel_size = 2, divisor_override = 0 })
      H.assert_error_like("max_pool3d", "dtype", F.max_pool3d,
                          lm.ones({ 1, 1, 4, 4, 4 }, { dtype = lm.int64 }), 2)
      H.assert_error_like("adaptive_avg_pool3d", "output_size", F.adaptive_avg_pool3d, x, -1)
      H.assert_error_like("adaptive_max_pool3d", "output_size", F.adaptive_max_pool3d, x,
                          { 1, "a", 1 })
      H.assert_error_like("max_pool3d", "non-zero size", F.max_pool3d,
                          lm.randn({ 1, 2, 0, 4, 4 }), 2)
      H.assert_error_like("adaptive_avg_pool3d", "non-zero size", F.adaptive_avg_pool3d,
                          lm.randn({ 1, 2, 4, 0, 4 }), 2)
      H.assert_error_like("max_pool3d", "unknown option", F.max_pool3d, x,
                          { kernel_size = 2, groups = 2 })
   end)
end)

describe("3-D pooling modules", function()
   it("take PyTorch's arguments and print as PyTorch does", function()
      local nn = lm.nn
      assert.are.equal("MaxPool3d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)",
                       tostring(nn.MaxPool3d(2)))
      assert.are.equal("MaxPool3d(kernel_size=(1, 2, 3), stride=1, padding=(0, 1, 1), " ..
                       "dilation=2, ceil_mode=True)",
                       tostring(nn.MaxPool3d({ kernel_size = { 1, 2, 3 }, stride = 1,
                                               padding = { 0, 1, 1 }, dilation = 2,
                                               ceil_mode = true })))
      assert.are.equal("AvgPool3d(kernel_size=3, stride=3, padding=0)", tostring(nn.AvgPool3d(3)))
      assert.are.equal("AvgPool3d(kernel_size=(1, 2, 2), stride=1, padding=1)",
                       tostring(nn.AvgPool3d({ 1, 2, 2 }, 1, 1, true, false, 3)))
      assert.are.equal("AdaptiveAvgPool3d(output_size=(2, None, 3))",
                       tostring(nn.AdaptiveAvgPool3d({ 2, false, 3 })))
      assert.are.equal("AdaptiveAvgPool3d(output_size=1)", tostring(nn.AdaptiveAvgPool3d(1)))
      assert.are.equal("AdaptiveMaxPool3d(output_size=2)", tostring(nn.AdaptiveMaxPool3d(2)))
      local x = lm.randn({ 2, 3, 5, 6, 7 }):contiguous(CL3)
      assert(lm.equal(nn.MaxPool3d(2, 1, 1)(x), F.max_pool3d(x, { kernel_size = 2, stride = 1,
                                                                  padding = 1 })))
      local ap = nn.AvgPool3d({ kernel_size = 3, stride = 2, padding = 1,
                                count_include_pad = false, divisor_override = 4 })
      assert(lm.equal(ap(x), F.avg_pool3d(x, { kernel_size = 3, stride = 2, padding = 1,
                                               count_include_pad = false, divisor_override = 4 })))
      assert(lm.equal(nn.AdaptiveAvgPool3d({ 2, 3, 1 })(x), F.adaptive_avg_pool3d(x, { 2, 3, 1 })))
      local v, i = nn.AdaptiveMaxPool3d(2, true)(x)
      local v2, i2 = F.adaptive_max_pool3d(x, 2, true)
      assert(lm.equal(v, v2) and lm.equal(i, i2))
      local _, mi = nn.MaxPool3d({ kernel_size = 2, return_indices = true })(x)
      H.assert_dtype(mi, lm.int64)
      H.assert_error_like("MaxPool3d", "kernel_size", nn.MaxPool3d)
      H.assert_error_like("AdaptiveAvgPool3d", "output_size", nn.AdaptiveAvgPool3d)
   end)
end)
