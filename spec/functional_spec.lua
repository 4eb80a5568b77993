-- lm.nn.functional: values against the peer's fixtures (spec/fixtures/nn, PyTorch 1.13) in
-- float32 and float64 and in both memory formats, output formats, gradients (fixtures and
-- finite differences), gradient formats, and errors for bad input.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F

local CL, CONTIG = lm.channels_last, lm.contiguous_format
local FORMATS = { CONTIG, CL }
local DTYPES = { { lm.float64, 1e-7 }, { lm.float32, 2e-5 } }
local close = G.close

local function fx(d, dtype, fmt, rg) return G.tensor(d, dtype, fmt, rg) end

-- true when t is channels-last (unambiguously or by tag)
local function is_cl(t) return tostring(t:suggest_memory_format()) == "channels_last" end

local function assert_format(t, fmt, what)
   if tostring(fmt) == "channels_last" then
      assert(t:is_contiguous(CL) and is_cl(t), (what or "") .. ": expected channels_last, got " ..
             H.describe(t))
   else
      assert(t:is_contiguous(), (what or "") .. ": expected contiguous, got " .. H.describe(t))
   end
end

-- the gradient an op sends to its input x, before any leaf accumulation: x goes through an
-- identity node (x * 1) whose hook captures the incoming gradient
local function through(x)
   local h = x * 1
   local box = {}
   h:register_hook(function(g) box.g = g end)
   return h, box
end

---------------------------------------------------------------------------------------------
describe("F.conv2d", function()
   local cases = G.fixture("conv2d")
   for _, c in ipairs(cases) do
      for _, dt in ipairs(DTYPES) do
         for _, fmt in ipairs(FORMATS) do
            it(("%s %s %s"):format(c.name, tostring(dt[1]), tostring(fmt)), function()
               local x = fx(c.x, dt[1], fmt, true)
               local w = fx(c.w, dt[1], fmt, true)
               local b = c.b and fx(c.b, dt[1], nil, true) or nil
               local out = F.conv2d(x, w, b, c.opts)
               close(out, c.out.data, dt[2], "output")
               assert_format(out, fmt, "output")
               out:backward(fx(c.gout, dt[1]))
               close(x.grad, c.gx.data, dt[2], "grad input")
               close(w.grad, c.gw.data, dt[2], "grad weight")
               if b then close(b.grad, c.gb.data, dt[2], "grad bias") end
               assert_format(x.grad, fmt, "grad input")
               assert_format(w.grad, fmt, "grad weight")
            end)
         end
      end
   end

   it("outputs channels-last when the input or the weight suggests it", function()
      local x = lm.randn({ 2, 3, 6, 6 })
      local w = lm.randn({ 4, 3, 3, 3 })
      assert_format(F.conv2d(x, w), CONTIG, "both contiguous")
      assert_format(F.conv2d(x:to(CL), w), CL, "CL input")
      assert_format(F.conv2d(x, w:to(CL)), CL, "CL weight")
      -- a 1x1 weight tagged by :to(channels_last) counts as channels-last
      local w1 = lm.randn({ 4, 3, 1, 1 }):to(CL)
      assert_format(F.conv2d(x, w1), CL, "tagged 1x1 weight")
      close(F.conv2d(x, w1), F.conv2d(x, w1:contiguous():clone(CONTIG)), 1e-5)
   end)

   it("sends gradients in the chosen format (input or weight channels-last)", function()
      local x = G.input({ 2, 3, 5, 5 }, nil, 1)
      local w = G.input({ 4, 3, 3, 3 }, CL, 2)
      local hx, bx = through(x)
      local hw, bw = through(w)
      F.conv2d(hx, hw, nil, { padding = 1 }):sum():backward()
      assert_format(bx.g, CL, "grad input (weight CL)")
      assert_format(bw.g, CL, "grad weight")
      -- the leaf keeps its own layout
      assert_format(x.grad, CONTIG, "leaf x.grad")
      assert_format(w.grad, CL, "leaf w.grad")
   end)

   for _, fmt in ipairs(FORMATS) do
      it("passes gradcheck (" .. tostring(fmt) .. ")", function()
         local x = G.input({ 2, 4, 5, 4 }, fmt, 3)
         local w = G.input({ 6, 2, 3, 2 }, fmt, 4)
         local b = G.input({ 6 }, nil, 5)
         G.check(function(u, v, z)
            return F.conv2d(u, v, z, { stride = { 2, 1 }, padding = { 1, 0 }, dilation = 1,
                            groups = 2 })
         end, { x, w, b })
         G.check(function(u, v) return F.conv2d(u, v, nil, { dilation = 2, padding = 2 }) end,
                 { G.input({ 1, 2, 5, 5 }, fmt, 6), G.input({ 3, 2, 2, 2 }, fmt, 7) })
      end)
   end

   it("accepts an unbatched 3-D input and padding='same'", function()
      local x, w = lm.randn({ 3, 5, 5 }), lm.randn({ 2, 3, 3, 3 })
      local y = F.conv2d(x, w, nil, { padding = "same" })
      H.assert_sizes(y, { 2, 5, 5 })
      close(y, F.conv2d(x:unsqueeze(1), w, nil, { padding = 1 }):squeeze(1), 1e-5)
   end)

   it("writes large cold channels-last 1x1 results with streaming stores, with the same values",
      function()
      -- a fresh block (the cache emptied first) is cold: the pointwise kernels (AVX-512) stream
      -- the 820 KB output and the 410 KB input gradient, and mark their blocks; the values must
      -- match the float64 NCHW reference
      lm.manual_seed(11)
      local x64 = lm.randn({ 2, 32, 40, 40 }, { dtype = lm.float64 })
      local w64 = lm.randn({ 64, 32, 1, 1 }, { dtype = lm.float64 })
      local g64 = lm.randn({ 2, 64, 40, 40 }, { dtype = lm.float64 })
      local function run(x, w, g)
         x = x:clone():requires_grad_(true)
         local y = F.conv2d(x, w)
         y:backward(g)
         return y, x.grad
      end
      local yr, gr = run(x64, w64, g64)
      lm.memory.empty_cache()
      local y, gx = run(x64:float():contiguous(CL), w64:float():contiguous(CL),
                        g64:float():contiguous(CL))
      assert.is_true(is_cl(y) and is_cl(gx))
      close(y:double(), yr, 1e-4, "output")
      close(gx:double(), gr, 1e-4, "grad input")
      H.assert_streamed(y)
      H.assert_streamed(gx)
   end)

   it("streams a 1x1 result larger than half the cache share even into a block still cached",
      function()
      -- y:free() then the same call: the block comes back at once, not cold (alloc.c), but the
      -- 17.3 MB channels-last output is over half the cache share (at most 32 MiB)
      if lm.memory.cache_share() > 32 * 2 ^ 20 then return end  -- LUMEN_CACHE_SHARE set larger
      lm.manual_seed(12)
      -- the allocator's coldness is a host-memory fact: CPU tensors on every test device
      local x = lm.randn({ 1, 64, 130, 130 }, { device = "cpu" }):contiguous(CL)
      local w = lm.randn({ 256, 64, 1, 1 }, { device = "cpu" }):contiguous(CL)
      local ref = F.conv2d(x:double(), w:double())
      local y = F.conv2d(x, w)
      y:free()
      y = F.conv2d(x, w)
      local c = require("lumen.tensor").cdata(y)
      assert.equal(0, require("lumen.C").lm_mem_is_cold(c.storage.data, c.storage.nbytes))
      close(y:double(), ref, 1e-4, "output")
      H.assert_streamed(y)
   end)

   it("rejects bad input", function()
      local x, w = lm.randn({ 2, 3, 5, 5 }), lm.randn({ 4, 3, 3, 3 })
      H.assert_error_like("conv2d", "channels", F.conv2d, lm.randn({ 2, 5, 5, 5 }), w)
      H.assert_error_like("conv2d", "divisible by groups", F.conv2d, lm.randn({ 2, 4, 5, 5 }),
                          lm.randn({ 3, 2, 3, 3 }), nil, { groups = 2 })
      H.assert_error_like("conv2d", "divisible by groups", F.conv2d, x, w, nil, { groups = 2 })
      H.assert_error_like("conv2d", "padded input", F.conv2d, lm.randn({ 1, 3, 2, 2 }), w)
      H.assert_error_like("conv2d", "padded input", F.conv2d, x, lm.randn({ 4, 3, 7, 7 }), nil,
                          { padding = 0 })
      H.assert_error_like("conv2d", "4-d", F.conv2d, lm.randn({ 3, 5 }), w)
      H.assert_error_like("conv2d", "weight must be 4-d", F.conv2d, x, lm.randn({ 4, 3, 3 }))
      H.assert_error_like("conv2d", "dtype", F.conv2d,
                          lm.ones({ 2, 3, 5, 5 }, { dtype = lm.int64 }),
                          lm.ones({ 4, 3, 3, 3 }, { dtype = lm.int64 }))
      H.assert_error_like("conv2d", "same dtype", F.conv2d, x, w:double())
      H.assert_error_like("conv2d", "bias", F.conv2d, x, w, lm.randn({ 3 }))
      H.assert_error_like("conv2d", "stride", F.conv2d, x, w, nil, { stride = 0 })
      H.assert_error_like("conv2d", "padding", F.conv2d, x, w, nil, { padding = -1 })
      H.assert_error_like("conv2d", "tensor expected", F.conv2d, "x", w)
   end)
end)

---------------------------------------------------------------------------------------------
describe("pooling", function()
   local P = G.fixture("pool")

   local function pool_case(fname, c, run)
      for _, dt in ipairs(DTYPES) do
         for _, fmt in ipairs(FORMATS) do
            it(("%s %s %s %s"):format(fname, c.name, tostring(dt[1]), tostring(fmt)), function()
               local x = fx(c.x, dt[1], fmt, true)
               local out = run(x)
               close(out, c.out.data, dt[2], "output")
               assert_format(out, fmt, "output")
               out:backward(fx(c.gout, dt[1]))
               close(x.grad, c.gx.data, dt[2], "grad input")
            end)
         end
      end
   end

   for _, c in ipairs(P.max_pool2d) do
      pool_case("max_pool2d", c, function(x) return F.max_pool2d(x, c.opts) end)
   end
   for _, c in ipairs(P.avg_pool2d) do
      pool_case("avg_pool2d", c, function(x) return F.avg_pool2d(x, c.opts) end)
   end
   for _, c in ipairs(P.adaptive_avg_pool2d) do
      pool_case("adaptive_avg_pool2d", c, function(x) return F.adaptive_avg_pool2d(x, c.size) end)
   end
   for _, c in ipairs(P.adaptive_max_pool2d) do
      pool_case("adaptive_max_pool2d", c, function(x)
         local v, i = F.adaptive_max_pool2d(x, c.size)
         local exp = {}
         for k, e in ipairs(c.indices.data) do exp[k] = e + 1 end       -- 1-based
         H.assert_values(i, exp, "indices")
         H.assert_dtype(i, lm.int64)
         return v
      end)
   end

   it("averages windows of whole wide rows (NCHW contiguous runs) like the float64 mean",
      function()
      -- windows 37..45 wide that span whole rows take the contiguous-run path in avg_fwd_nchw
      lm.manual_seed(3)
      local x = lm.randn({ 2, 3, 37, 45 })
      local xd = x:double()
      close(F.adaptive_avg_pool2d(x, 1):double(), xd:mean({ 3, 4 }, true), 1e-6, "global")
      -- three bands of whole rows: rows [0, 13), [12, 25), [24, 37) (PyTorch's adaptive windows)
      local bands = F.adaptive_avg_pool2d(x, { 3, 1 }):double()
      local exp = lm.cat({ xd:narrow(3, 1, 13):mean({ 3, 4 }, true),
                           xd:narrow(3, 13, 13):mean({ 3, 4 }, true),
                           xd:narrow(3, 25, 13):mean({ 3, 4 }, true) }, 3)
      close(bands, exp, 1e-6, "bands")
      close(F.avg_pool2d(x, { kernel_size = { 5, 45 } }):double(),
            F.avg_pool2d(xd, { kernel_size = { 5, 45 } }), 1e-6, "avg_pool2d whole rows")
   end)

   it("keeps the channels-last tag of a global average pool", function()
      local x = lm.randn({ 2, 3, 4, 4 }):to(CL)
      H.assert_strides(F.adaptive_avg_pool2d(x, 1), { 3, 1, 3, 3 })
      H.assert_strides(F.adaptive_avg_pool2d(x:contiguous(), 1), { 3, 1, 1, 1 })
   end)

   it("gives gradients in the input's format", function()
      for _, fmt in ipairs(FORMATS) do
         local x = G.input({ 2, 3, 6, 6 }, fmt, 8)
         for _, run in ipairs({
            function(h) return F.max_pool2d(h, { kernel_size = 3, stride = 2, padding = 1 }) end,
            function(h) return F.avg_pool2d(h, 2) end,
            function(h) return F.adaptive_avg_pool2d(h, { 2, 3 }) end,
            function(h) return (F.adaptive_max_pool2d(h, 2)) end,
         }) do
            local h, box = through(x)
            run(h):sum():backward()
            assert_format(box.g, fmt, "pool gradient")
         end
      end
   end)

   for _, fmt in ipairs(FORMATS) do
      it("passes gradcheck (" .. tostring(fmt) .. ")", function()
         local x = G.input({ 2, 2, 5, 6 }, fmt, 9)
         G.check(function(u) return F.max_pool2d(u, { kernel_size = 2, stride = 1 }) end, { x })
         G.check(function(u) return F.max_pool2d(u, { kernel_size = 3, stride = 2, padding = 1,
                                                     ceil_mode = true }) end, { x })
         G.check(function(u) return F.avg_pool2d(u, { kernel_size = 3, stride = 2, padding = 1,
                                                     count_include_pad = false }) end, { x })
         G.check(function(u) return F.avg_pool2d(u, { kernel_size = { 2, 3 }, ceil_mode = true })
                 end, { x })
         G.check(function(u) return F.adaptive_avg_pool2d(u, { 3, 4 }) end, { x })
         G.check(function(u) return (F.adaptive_max_pool2d(u, { 2, 2 })) end, { x })
      end)
   end

   it("returns 1-based max_pool2d indices on request", function()
      local x = lm.randn({ 1, 2, 4, 4 })
      local v, i = F.max_pool2d(x, { kernel_size = 2, return_indices = true })
      local flat = x:view({ 2, 16 }):totable()
      local vv, ii = v:view({ 2, 4 }):totable(), i:view({ 2, 4 }):totable()
      for c = 1, 2 do
         for k = 1, 4 do assert.are.equal(vv[c][k], flat[c][ii[c][k]]) end
      end
   end)

   it("rejects bad input", function()
      local x = lm.randn({ 1, 2, 4, 4 })
      H.assert_error_like("max_pool2d", "output size is too small", F.max_pool2d,
                          lm.randn({ 1, 1, 2, 2 }), 3)
      H.assert_error_like("avg_pool2d", "output size is too small", F.avg_pool2d,
                          lm.randn({ 1, 1, 2, 2 }), 3)
      H.assert_error_like("max_pool2d", "half", F.max_pool2d, x, { kernel_size = 2, padding = 2 })
      H.assert_error_like("avg_pool2d", "half", F.avg_pool2d, x, { kernel_size = 2, padding = 2 })
      H.assert_error_like("max_pool2d", "4-d", F.max_pool2d, lm.randn({ 4, 4 }), 2)
      H.assert_error_like("avg_pool2d", "4-d", F.avg_pool2d, lm.randn({ 4 }), 2)
      H.assert_error_like("adaptive_avg_pool2d", "4-d", F.adaptive_avg_pool2d,
                          lm.randn({ 4, 4 }), 1)
      H.assert_error_like("adaptive_max_pool2d", "4-d", F.adaptive_max_pool2d,
                          lm.randn({ 4, 4 }), 1)
      H.assert_error_like("max_pool2d", "dtype", F.max_pool2d,
                          lm.ones({ 1, 1, 4, 4 }, { dtype = lm.int64 }), 2)
      H.assert_error_like("adaptive_avg_pool2d", "dtype", F.adaptive_avg_pool2d,
                          lm.ones({ 1, 1, 4, 4 }, { dtype = lm.uint8 }), 2)
      H.assert_error_like("max_pool2d", "kernel_size", F.max_pool2d, x, {})
      H.assert_error_like("max_pool2d", "kernel_size", F.max_pool2d, x, 0)
      H.assert_error_like("adaptive_avg_pool2d", "output_size", F.adaptive_avg_pool2d, x, -1)
   end)
end)

---------------------------------------------------------------------------------------------
describe("F.batch_norm", function()
   local cases = G.fixture("batch_norm")
   for _, c in ipairs(cases) do
      for _, dt in ipairs(DTYPES) do
         for _, fmt in ipairs(FORMATS) do
            it(("%s %s %s"):format(c.name, tostring(dt[1]), tostring(fmt)), function()
               local x = fx(c.x, dt[1], fmt, true)
               local w = c.w and fx(c.w, dt[1], nil, true) or nil
               local b = c.b and fx(c.b, dt[1], nil, true) or nil
               local rm, rv = fx(c.running_mean, dt[1]), fx(c.running_var, dt[1])
               local out = F.batch_norm(x, rm, rv, w, b, { training = c.training,
                                        momentum = c.momentum, eps = c.eps })
               close(out, c.out.data, dt[2] * 10, "output")
               assert_format(out, fmt, "output")
               close(rm, c.new_running_mean.data, dt[2], "running_mean")
               close(rv, c.new_running_var.data, dt[2], "running_var")
               out:backward(fx(c.gout, dt[1]))
               close(x.grad, c.gx.data, dt[2] * 10, "grad input")
               if w then
                  close(w.grad, c.gw.data, dt[2] * 10, "grad weight")
                  close(b.grad, c.gb.data, dt[2] * 10, "grad bias")
               end
            end)
         end
      end
   end

   for _, fmt in ipairs(FORMATS) do
      it("passes gradcheck in training and eval (" .. tostring(fmt) .. ")", function()
         local x = G.input({ 3, 2, 3, 2 }, fmt, 10)
         local w, b = G.input({ 2 }, nil, 11), G.input({ 2 }, nil, 12)
         G.check(function(u, v, z) return F.batch_norm(u, nil, nil, v, z, { training = true }) end,
                 { x, w, b })
         local rm = lm.tensor({ 0.1, -0.2 }, { dtype = lm.float64 })
         local rv = lm.tensor({ 0.9, 1.3 }, { dtype = lm.float64 })
         G.check(function(u, v, z) return F.batch_norm(u, rm, rv, v, z, { training = false }) end,
                 { x, w, b })
         G.check(function(u) return F.batch_norm(u, nil, nil, nil, nil, { training = true }) end,
                 { x })
         local h, box = through(x)
         F.batch_norm(h, nil, nil, w, b, { training = true }):sum():backward()
         assert_format(box.g, fmt, "grad input")
      end)
   end

   it("writes large cold NHWC results with streaming stores, with the same values", function()
      -- a fresh block (the cache emptied first) is cold: the forward and the backward of a
      -- 1.2 MB channels-last float32 batch norm with 64 channels stream their results (AVX-512
      -- machines); the values must match the float64 NCHW reference
      lm.manual_seed(7)
      local x64 = lm.randn({ 4, 64, 41, 29 }, { dtype = lm.float64 })
      local w64 = lm.rand({ 64 }, { dtype = lm.float64 }) + 0.5
      local b64 = lm.randn({ 64 }, { dtype = lm.float64 })
      local g64 = lm.randn({ 4, 64, 41, 29 }, { dtype = lm.float64 })
      local function run(x, w, b, g)
         x = x:clone():requires_grad_(true)
         local y = F.batch_norm(x, nil, nil, w, b, { training = true })
         y:backward(g)
         return y, x.grad
      end
      local yr, gr = run(x64, w64, b64, g64)
      lm.memory.empty_cache()
      local y, gx = run(x64:float():contiguous(CL), w64:float(), b64:float(),
                        g64:float():contiguous(CL))
      assert.is_true(is_cl(y) and is_cl(gx))
      close(y:double(), yr, 1e-5, "output")
      close(gx:double(), gr, 1e-5, "grad input")
      H.assert_streamed(y)
   end)

   it("rejects bad input", function()
      local x = lm.randn({ 2, 3, 4, 4 })
      H.assert_error_like("batch_norm", "3 elements", F.batch_norm, x, lm.zeros({ 4 }),
                          lm.ones({ 4 }))
      H.assert_error_like("batch_norm", "3 elements", F.batch_norm, x, nil, nil, lm.ones({ 2 }),
                          nil, { training = true })
      H.assert_error_like("batch_norm", "more than 1 value per channel", F.batch_norm,
                          lm.randn({ 1, 3, 1, 1 }), nil, nil, nil, nil, { training = true })
      H.assert_error_like("batch_norm", "evaluation", F.batch_norm, x, nil, nil)
      H.assert_error_like("batch_norm", "dtype", F.batch_norm,
                          lm.ones({ 2, 3, 2, 2 }, { dtype = lm.int64 }), nil, nil, nil, nil,
                          { training = true })
      H.assert_error_like("batch_norm", "at least 2 dims", F.batch_norm, lm.randn({ 3 }), nil,
                          nil, nil, nil, { training = true })
   end)
end)

---------------------------------------------------------------------------------------------
describe("linear, softmax, losses", function()
   local M = G.fixture("misc")

   for _, dt in ipairs(DTYPES) do
      it("linear " .. tostring(dt[1]), function()
         local c = M.linear
         local x, w, b = fx(c.x, dt[1], nil, true), fx(c.w, dt[1], nil, true),
                         fx(c.b, dt[1], nil, true)
         local out = F.linear(x, w, b)
         close(out, c.out.data, dt[2])
         out:backward(fx(c.gout, dt[1]))
         close(x.grad, c.gx.data, dt[2])
         close(w.grad, c.gw.data, dt[2])
         close(b.grad, c.gb.data, dt[2])
      end)

      for _, name in ipairs({ "softmax", "log_softmax" }) do
         it(name .. " " .. tostring(dt[1]), function()
            for _, c in ipairs(M[name]) do
               for _, fmt in ipairs(FORMATS) do
                  local x = fx(c.x, dt[1], fmt, true)
                  local out = F[name](x, c.dim + 1)
                  close(out, c.out.data, dt[2], name .. " dim " .. (c.dim + 1))
                  assert(out:is_contiguous(), "softmax output is contiguous")
                  out:backward(fx(c.gout, dt[1]))
                  close(x.grad, c.gx.data, dt[2], name .. " grad")
               end
            end
         end)
      end

      it("nll_loss " .. tostring(dt[1]), function()
         for _, c in ipairs(M.nll_loss) do
            local x = fx(c.x, dt[1], nil, true)
            local tgt = {}
            for i, v in ipairs(c.target.data) do tgt[i] = v >= 0 and v + 1 or v end
            local opts
            if c.ignore_index then
               local ig = c.ignore_index
               opts = { ignore_index = ig >= 0 and ig + 1 or ig }
            end
            local out = F.nll_loss(x, lm.tensor(tgt, { dtype = lm.int64 }), opts)
            assert.are.equal(0, out:dim())
            close(out, { c.out.data[1] }, dt[2])
            out:backward()
            close(x.grad, c.gx.data, dt[2])
         end
      end)

      it("cross_entropy " .. tostring(dt[1]), function()
         local c = M.cross_entropy
         local x = fx(c.x, dt[1], nil, true)
         local tgt = {}
         for i, v in ipairs(c.target.data) do tgt[i] = v + 1 end
         local out = F.cross_entropy(x, lm.tensor(tgt, { dtype = lm.int64 }))
         close(out, { c.out.data[1] }, dt[2])
         out:backward()
         close(x.grad, c.gx.data, dt[2])
      end)
   end

   it("linear on 1-D and 3-D inputs, without bias, and gradcheck", function()
      local w = G.input({ 4, 5 }, nil, 13)
      local b = G.input({ 4 }, nil, 14)
      G.check(function(u, v, z) return F.linear(u, v, z) end,
              { G.input({ 2, 3, 5 }, nil, 15), w, b })
      G.check(function(u, v) return F.linear(u, v) end, { G.input({ 5 }, nil, 16), w })
      local x = lm.randn({ 2, 3, 5 }, { dtype = lm.float64 })
      close(F.linear(x, w:detach()), x:matmul(w:detach():t()), 1e-12)
   end)

   it("softmax / losses pass gradcheck", function()
      local x = G.input({ 4, 5 }, nil, 17)
      G.check(function(u) return F.softmax(u, 2) end, { x })
      G.check(function(u) return F.log_softmax(u, 1) end, { x })
      local x4 = G.input({ 2, 3, 2, 2 }, CL, 18)
      G.check(function(u) return F.log_softmax(u, 2) end, { x4 })
      local t = lm.tensor({ 2, 5, 1, 3 }, { dtype = lm.int64 })
      G.check(function(u) return F.cross_entropy(u, t) end, { x })
      G.check(function(u) return F.nll_loss(u, t, { reduction = "sum" }) end, { x })
      G.check(function(u) return F.nll_loss(u, t, { reduction = "none" }) end, { x })
      G.check(function(u) return F.nll_loss(u, t, { ignore_index = 5 }) end, { x })
      G.check(function(u, v) return F.mse_loss(u, v) end, { x, G.input({ 4, 5 }, nil, 19) })
   end)

   it("cross_entropy over (N, C, H, W) logits", function()
      local x = G.input({ 2, 3, 2, 2 }, CL, 20)
      local t = lm.tensor({ { { 1, 2 }, { 3, 1 } }, { { 2, 2 }, { 1, 3 } } }, { dtype = lm.int64 })
      local l = F.cross_entropy(x, t)
      local ref = F.cross_entropy(x:permute(1, 3, 4, 2):reshape({ 8, 3 }), t:reshape({ 8 }))
      close(l, { ref:item() }, 1e-12)
      G.check(function(u) return F.cross_entropy(u, t) end, { x })
   end)

   -- PyTorch 2.15's values (float64) for x = sin(0..23) viewed 2 x 3 x 2 x 2, class targets t
   -- (0-based 0 1 2 1 0 2 2 1) and probability targets softmax(2 cos x, dim 2)
   it("cross_entropy: label_smoothing and probability targets as PyTorch", function()
      for _, fmt in ipairs(FORMATS) do
         local x = lm.arange(0, 24):double():sin():view({ 2, 3, 2, 2 }):contiguous(fmt)
         local t = lm.tensor({ 1, 2, 3, 2, 1, 3, 3, 2 }, { dtype = lm.int64 }):view({ 2, 2, 2 })
         local w = lm.tensor({ 0.5, 2, 1 }, { dtype = lm.float64 })
         close(F.cross_entropy(x, t, { label_smoothing = 0.1 }), { 1.40405183087495 }, 1e-12)
         close(F.cross_entropy(x, t, { label_smoothing = 0.3, weight = w, ignore_index = 2 }),
               { 1.65964387363297 }, 1e-12)
         close(F.cross_entropy(x, t, { label_smoothing = 0.3, weight = w, ignore_index = 2,
                                       reduction = "sum" }), { 6.63857549453189 }, 1e-12)
         close(F.cross_entropy(x, t, { label_smoothing = 0.3, ignore_index = 2,
                                       reduction = "none" }),
               { 1.40194024229126, 0, 1.71227308090928, 0, 1.708634951486984, 0.823022678195336,
                 1.407661930259309, 0 }, 1e-12)
         local p = F.softmax(x:cos() * 2, 2)
         close(F.cross_entropy(x, p), { 1.32527424927155 }, 1e-12)
         close(F.cross_entropy(x, p, { label_smoothing = 0.2, weight = w }), { 1.71583201199787 },
               1e-12)
         close(F.cross_entropy(x, p, { reduction = "none" }),
               { 1.443730987191133, 1.230464519247964, 1.45503174727019, 1.153130027137369,
                 1.459204999753721, 1.226869512942198, 1.447714820077395, 1.186047380552444 },
               1e-12)
         local xg = G.input({ 2, 3, 2, 2 }, fmt, 23)
         G.check(function(u) return F.cross_entropy(u, t, { label_smoothing = 0.2, weight = w,
                                                            ignore_index = 2 }) end, { xg })
         G.check(function(u) return F.cross_entropy(u, p, { label_smoothing = 0.1 }) end, { xg })
      end
      local m = lm.nn.CrossEntropyLoss({ label_smoothing = 0.1 })
      close(m(lm.arange(0, 24):double():sin():view({ 2, 3, 2, 2 }),
              lm.tensor({ 1, 2, 3, 2, 1, 3, 3, 2 }, { dtype = lm.int64 }):view({ 2, 2, 2 })),
            { 1.40405183087495 }, 1e-12)
      local x = lm.randn({ 3, 4 })
      H.assert_error_like("cross_entropy", "label_smoothing", F.cross_entropy, x,
                          lm.tensor({ 1, 2, 3 }, { dtype = lm.int64 }), { label_smoothing = 1.5 })
      H.assert_error_like("cross_entropy", "ignore_index is not supported", F.cross_entropy, x,
                          F.softmax(x, 2), { ignore_index = 1 })
      H.assert_error_like("cross_entropy", "size", F.cross_entropy, x, lm.rand({ 3, 3 }))
   end)

   it("rejects bad input", function()
      H.assert_error_like("linear", "features", F.linear, lm.randn({ 2, 3 }), lm.randn({ 4, 5 }))
      H.assert_error_like("linear", "2-d", F.linear, lm.randn({ 2, 3 }), lm.randn({ 3 }))
      H.assert_error_like("linear", "bias", F.linear, lm.randn({ 2, 3 }), lm.randn({ 4, 3 }),
                          lm.randn({ 3 }))
      H.assert_error_like("linear", "dtype", F.linear, lm.randn({ 2, 3 }):double(),
                          lm.randn({ 4, 3 }))
      H.assert_error_like("softmax", "dim", F.softmax, lm.randn({ 2, 3 }), 3)
      H.assert_error_like("log_softmax", "dtype", F.log_softmax,
                          lm.ones({ 2, 3 }, { dtype = lm.int64 }), 1)
      local x = lm.randn({ 3, 4 })
      H.assert_error_like("nll_loss", "int64", F.nll_loss, x, lm.ones({ 3 }))
      H.assert_error_like("nll_loss", "out of bounds", F.nll_loss, x,
                          lm.tensor({ 1, 5, 2 }, { dtype = lm.int64 }))
      H.assert_error_like("nll_loss", "target 0", F.nll_loss, x,
                          lm.tensor({ 1, 0, 2 }, { dtype = lm.int64 }))
      H.assert_error_like("nll_loss", "batch", F.nll_loss, x,
                          lm.tensor({ 1, 2 }, { dtype = lm.int64 }))
      H.assert_error_like("nll_loss", "reduction", F.nll_loss, x,
                          lm.tensor({ 1, 2, 3 }, { dtype = lm.int64 }), { reduction = "avg" })
      H.assert_error_like("cross_entropy", "tensor expected", F.cross_entropy, x, { 1, 2, 3 })
   end)
end)

---------------------------------------------------------------------------------------------
describe("relu, dropout, flatten, cat", function()
   it("relu and relu_", function()
      for _, fmt in ipairs(FORMATS) do
         local x = G.input({ 2, 3, 2, 2 }, fmt, 21)
         local y = F.relu(x)
         assert_format(y, fmt, "relu")
         G.check(function(u) return F.relu(u) end, { x })
         G.check(function(u) return F.relu_(u * 1) end, { x })
         local z = lm.randn({ 2, 3, 2, 2 }):to(fmt)
         local r = F.relu_(z)
         assert.are.equal(z, r)
         assert.is_true(z:min():item() >= 0)
      end
   end)

   it("dropout zeroes about p of the elements and scales the rest", function()
      lm.manual_seed(3)
      local x = lm.ones({ 100, 100 })
      local y = F.dropout(x, 0.3)
      local kept = y:ne(0):sum():item()
      assert.is_true(math.abs(kept / 10000 - 0.7) < 0.03, "kept fraction " .. kept / 10000)
      close(y:max(), { 1 / 0.7 }, 1e-6)
      assert.are.equal(x, F.dropout(x, 0.3, false))
      assert.are.equal(x, F.dropout(x, 0))
      close(F.dropout(x, 1):sum(), { 0 })
      -- same seed, same mask
      lm.manual_seed(3)
      close(F.dropout(x, 0.3), y, 0)
      H.assert_error_like("dropout", "between 0 and 1", F.dropout, x, 1.5)
   end)

   it("dropout gradient uses the same mask, in the input's format", function()
      for _, fmt in ipairs(FORMATS) do
         local x = G.input({ 2, 3, 3, 3 }, fmt, 22)
         G.check(function(u)
            lm.manual_seed(11)
            return F.dropout(u, 0.4)
         end, { x })
         lm.manual_seed(11)
         assert_format(F.dropout(x, 0.4), fmt, "dropout output")
      end
   end)

   it("flatten copies a channels-last input and views a tagged NC11", function()
      local x = lm.randn({ 2, 3, 4, 5 })
      local xc = x:to(CL)
      local f = F.flatten(xc, 2)
      H.assert_layout(f, { 2, 60 }, { 60, 1 })
      close(f, x:reshape({ 2, 60 }), 0)
      local g = F.adaptive_avg_pool2d(xc, 1)
      local gf = F.flatten(g, 2)
      H.assert_layout(gf, { 2, 3 }, { 3, 1 })
      assert.is_true(gf:is_same_storage(g))
      G.check(function(u) return F.flatten(u, 2) end, { G.input({ 2, 3, 2, 2 }, CL, 23) })
      H.assert_sizes(F.flatten(x), { 120 })
      H.assert_sizes(F.flatten(x, 2, 3), { 2, 12, 5 })
      H.assert_error_like("flatten", "start_dim", F.flatten, x, 3, 2)
   end)

   it("cat keeps the common format", function()
      local a, b = lm.randn({ 2, 3, 2, 2 }):to(CL), lm.randn({ 2, 2, 2, 2 }):to(CL)
      assert_format(F.cat({ a, b }, 2), CL, "cat")
      G.check(function(u, v) return F.cat({ u, v }, 2) end,
              { G.input({ 2, 3, 2, 2 }, CL, 24), G.input({ 2, 2, 2, 2 }, CL, 25) })
   end)
end)
