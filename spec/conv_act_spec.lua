-- The convolution epilogue's activations (F.conv2d / F.conv3d / Conv2d:forward with act =
-- "relu" | "relu6" | "silu" | "hardswish" | "hardsigmoid" | "sigmoid" | "gelu" | "gelu_tanh";
-- lm_conv2d's lm_conv_act): values against the convolution followed by the activation op, on
-- every CPU kernel (each implementation list entry in turn) and ISA level, float32 / float64 /
-- bfloat16 / float16, both memory formats, with and without a residual; the differentiable
-- fallback when a gradient is wanted; bad input. Then where the fusion happens: a Sequential
-- (conv[, batch norm], activation) and the squeeze-and-excitation gates in evaluation with
-- gradients off, nn.fold_batch_norm, lm.jit.freeze: mobilenet_v3_large, efficientnet_b0 and
-- mobilenet_v2 give the unfolded model's logits, with one kernel per (conv, activation) in
-- LUMEN_VERBOSE.
local lm = require("lumen")
local H = require("spec.helpers")
local gradcheck = require("spec.gradcheck")
local C = require("lumen.C")
local sh = require("spec.shell")
local F = lm.F
local nn = lm.nn

-- the activation names and their unfused ops (spec/helpers.lua)
local ACTS, OP = H.ACT_NAMES, H.ACT_OP

local on_cpu = lm.get_default_device() == "cpu"

local rel_diff = H.rel_diff

-- float32 within 1e-5 relative (the same formulas: in practice the same bits, but for the
-- residual's order of addition in some NCHW kernels); the 16-bit types round once fused, twice
-- unfused
local TOL = { float32 = 1e-5, float64 = 1e-12, bfloat16 = 2e-2, float16 = 4e-3 }

-- {name, N, C, H, W, O, k, stride, padding, groups}: one geometry per float32 kernel of
-- kernels/cpu/conv.c's list (depthwise, Winograd, pointwise, narrow input, register-blocked,
-- direct; the portable im2col at the other ISA levels, in float64, and NCHW) and grouped
local GEOMS = {
   { "depthwise", 2, 16, 9, 9, 16, 3, 1, 1, 16 }, { "winograd", 2, 64, 8, 8, 64, 3, 1, 1, 1 },
   { "pointwise", 2, 16, 7, 7, 40, 1, 1, 0, 1 }, { "narrow", 2, 3, 16, 16, 24, 3, 2, 1, 1 },
   { "register-blocked", 2, 8, 16, 16, 16, 3, 1, 1, 1 },
   { "direct", 2, 20, 9, 9, 24, 3, 2, 1, 1 }, { "grouped", 2, 8, 6, 6, 8, 3, 1, 1, 2 },
   { "groups of 8", 2, 24, 9, 9, 24, 3, 2, 1, 3 },
   -- 13 outputs: the AVX2 epilogue's partial vector (conv_epi_f32_avx2.c)
   { "13 outputs", 2, 6, 7, 7, 13, 3, 1, 1, 1 },
}

local function operands(g, dt, fmt)
   local _, N, Cn, Hh, W, O, k, s, p, groups = unpack(g)
   local x = (lm.randn({ N, Cn, Hh, W }) * 2):contiguous(fmt):to(dt)
   local w = (lm.randn({ O, Cn / groups, k, k }) * 0.3):contiguous(fmt):to(dt)
   local b = lm.randn({ O }):to(dt)
   local Ho, Wo = math.floor((Hh + 2 * p - k) / s) + 1, math.floor((W + 2 * p - k) / s) + 1
   -- the residual in the other layout: any strides are accepted
   local other = fmt == lm.channels_last and lm.contiguous_format or lm.channels_last
   local r = lm.randn({ N, O, Ho, Wo }):contiguous(other):to(dt)
   return x, w, b, r, { stride = s, padding = p, groups = groups }
end

-- every activation, with and without residual, against the unfused ops
local function check_all(g, dt, fmt, what)
   local x, w, b, r, opts = operands(g, dt, fmt)
   local tol = TOL[tostring(dt)]
   for _, a in ipairs(ACTS) do
      for _, res in ipairs({ false, true }) do
         local o = { stride = opts.stride, padding = opts.padding, groups = opts.groups,
                     act = a, residual = res and r or nil }
         local y = F.conv2d(x, w, b, o)
         local ref = F.conv2d(x, w, b, opts)
         if res then ref = ref + r end
         ref = OP[a](ref)
         local tag = ("%s %s residual=%s"):format(what, a, tostring(res))
         local d = rel_diff(y, ref)
         assert(d <= tol, tag .. ": relative difference " .. d)
         assert.are.equal(fmt, y:suggest_memory_format(), tag .. " format")
         assert.are.equal(dt, y:dtype(), tag .. " dtype")
         assert.is_nil(y.grad_fn, tag)
      end
   end
end

-- the ISA levels this CPU has (the forced lower ones refill the kernel table)
local function isas()
   local best = C.lm_cpu_set_isa(C.LM_ISA_AUTO)
   local r = { best }
   for _, l in ipairs({ C.LM_ISA_AVX512_BF16, C.LM_ISA_AVX512, C.LM_ISA_AVX2, C.LM_ISA_C }) do
      if l < best then r[#r + 1] = l end
   end
   return r
end

describe("conv2d epilogue activations: values", function()
   local levels = on_cpu and isas() or { C.lm_cpu_set_isa(C.LM_ISA_AUTO) }
   for _, isa in ipairs(levels) do
      for _, dt in ipairs({ lm.float32, lm.float64, lm.bfloat16, lm.float16 }) do
         for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
            local what = ("isa %d %s %s"):format(isa, tostring(dt), tostring(fmt))
            it(what .. ": every activation on every geometry equals the unfused ops", function()
               C.lm_cpu_set_isa(isa)
               local ok, err = pcall(function()
                  for gi, g in ipairs(GEOMS) do
                     lm.manual_seed(gi)
                     check_all(g, dt, fmt, what .. " " .. g[1])
                  end
               end)
               C.lm_cpu_set_isa(C.LM_ISA_AUTO)
               if not ok then error(err, 0) end
            end)
         end
      end
   end
end)

-- one implementation of a list at a time: the others switched off (the fallback last)
local function only(list, keep, fn)
   local off = {}
   for _, name in ipairs(list) do
      if name ~= keep then off[#off + 1] = name end
   end
   if #off > 0 then lm.backends.cpu.disable(unpack(off)) end
   local ok, err = pcall(fn)
   if #off > 0 then lm.backends.cpu.enable(unpack(off)) end
   if not ok then error(err, 0) end
end

describe("conv2d epilogue activations: each CPU implementation", function()
   if not on_cpu then
      pending("the implementation switches are the CPU's")
      return
   end
   local f32 = { "depthwise_avx512", "winograd_f4x4_avx512", "pointwise_avx512",
                 "narrow_c_avx512", "grouped_avx512", "direct_rb_avx512", "direct_avx512" }
   for _, keep in ipairs(f32) do
      it("float32 channels-last: " .. keep .. " (or the portable fallback where it declines)",
         function()
         only(f32, keep, function()
            for gi, g in ipairs(GEOMS) do
               lm.manual_seed(gi)
               check_all(g, lm.float32, lm.channels_last, keep .. " " .. g[1])
            end
         end)
      end)
   end
   local bf16 = { "amx_bf16", "winograd_f4x4_avx512bf16", "direct_avx512bf16" }
   for _, keep in ipairs(bf16) do
      it("bfloat16 channels-last: " .. keep .. " (or the float32 route where it declines)",
         function()
         only(bf16, keep, function()
            for gi, g in ipairs(GEOMS) do
               lm.manual_seed(gi)
               check_all(g, lm.bfloat16, lm.channels_last, keep .. " " .. g[1])
               -- Winograd with bfloat16 products wants 64+ channels
               check_all({ "wide", 1, 96, 8, 8, 64, 3, 1, 1, 1 }, lm.bfloat16, lm.channels_last,
                         keep .. " wide")
            end
         end)
      end)
   end
   it("float32 on AMX tiles (lm.backends.cpu.fp32_precision = 'bf16')", function()
      local old = lm.backends.cpu.fp32_precision
      lm.backends.cpu.fp32_precision = "bf16"
      local ok, err = pcall(function()
         for gi, g in ipairs(GEOMS) do
            lm.manual_seed(gi)
            check_all(g, lm.float32, lm.channels_last, "fp32_bf16 " .. g[1])
         end
      end)
      lm.backends.cpu.fp32_precision = old
      if not ok then error(err, 0) end
   end)
end)

describe("conv2d epilogue activations: API", function()
   it("act = 'relu' is relu = true, act = 'none' is no activation", function()
      lm.manual_seed(4)
      local x, w, b = lm.randn({ 2, 4, 6, 6 }), lm.randn({ 5, 4, 3, 3 }), lm.randn({ 5 })
      local r1 = F.conv2d(x, w, b, { padding = 1, relu = true })
      local r2 = F.conv2d(x, w, b, { padding = 1, act = "relu" })
      local r3 = F.conv2d(x, w, b, { padding = 1, act = "relu", relu = true })
      assert.are.equal(0, (r1 - r2):abs():max():item())
      assert.are.equal(0, (r1 - r3):abs():max():item())
      local n = F.conv2d(x, w, b, { padding = 1, act = "none" })
      assert.are.equal(0, (n - F.conv2d(x, w, b, { padding = 1 })):abs():max():item())
   end)

   it("with a gradient wanted: the separate ops, the activation's derivative (gradcheck)",
      function()
      lm.manual_seed(7)
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         for _, a in ipairs(ACTS) do
            local x = lm.randn({ 2, 3, 5, 5 }, { dtype = lm.float64 }):contiguous(fmt)
            local w = lm.randn({ 4, 3, 3, 3 }, { dtype = lm.float64 }):contiguous(fmt)
            local b = lm.randn({ 4 }, { dtype = lm.float64 })
            local r = lm.randn({ 2, 4, 5, 5 }, { dtype = lm.float64 })
            for _, t in ipairs({ x, w, b, r }) do t:requires_grad_(true) end
            local y = F.conv2d(x, w, b, { padding = 1, residual = r, act = a })
            assert.is_not_nil(y.grad_fn, a)
            assert.are.equal(fmt, y:suggest_memory_format(), a)
            local ref = lm.no_grad(function()
               return F.conv2d(x, w, b, { padding = 1, residual = r, act = a })
            end)
            assert(rel_diff(y:detach(), ref) <= 1e-12, a .. ": values")
            gradcheck.check(function(xx, ww, bb, rr)
               return F.conv2d(xx, ww, bb, { padding = 1, residual = rr, act = a })
            end, { x, w, b, r })
            y:sum():backward()
            assert.are.equal(fmt, x.grad:suggest_memory_format(), a .. " grad format")
         end
      end
   end)

   it("Conv2d:forward(x, {act =}) and conv3d", function()
      lm.manual_seed(2)
      local conv = nn.Conv2d(4, 6, 3, { padding = 1 })
      local x = lm.randn({ 2, 4, 5, 5 }):contiguous(lm.channels_last)
      for _, a in ipairs(ACTS) do
         local y = lm.no_grad(function() return conv:forward(x, { act = a }) end)
         local ref = lm.no_grad(function() return OP[a](conv(x)) end)
         assert(rel_diff(y, ref) <= 1e-5, a)
         assert.are.equal(lm.channels_last, y:suggest_memory_format())
      end
      -- conv3d: the per-tap and packed plans run it in their last conv2d, the temporal GEMM
      -- as an op after its sum
      for _, k in ipairs({ { 3, 3, 3 }, { 3, 1, 1 }, { 1, 3, 3 } }) do
         local x3 = lm.randn({ 2, 8, 4, 6, 6 }):contiguous(lm.channels_last_3d)
         local w3 = lm.randn({ 16, 8, k[1], k[2], k[3] }):contiguous(lm.channels_last_3d)
         local b3 = lm.randn({ 16 })
         local pad = { math.floor(k[1] / 2), math.floor(k[2] / 2), math.floor(k[3] / 2) }
         for _, a in ipairs(ACTS) do
            local y = F.conv3d(x3, w3, b3, { padding = pad, act = a })
            local ref = OP[a](F.conv3d(x3, w3, b3, { padding = pad }))
            assert(rel_diff(y, ref) <= 1e-5, "conv3d " .. a)
            assert.is_true(y:is_contiguous(lm.channels_last_3d), "conv3d format")
         end
      end
   end)

   it("rejects an unknown activation, a non-string one, relu with another", function()
      local x, w = lm.randn({ 1, 3, 5, 5 }), lm.randn({ 4, 3, 3, 3 })
      H.assert_error_like("conv2d", "act must be one of", F.conv2d, x, w, nil, { act = "tanh" })
      H.assert_error_like("conv2d", "act must be one of", F.conv2d, x, w, nil, { act = 3 })
      H.assert_error_like("conv2d", "together", F.conv2d, x, w, nil,
                          { act = "silu", relu = true })
      H.assert_error_like("conv3d", "act must be one of", F.conv3d, lm.randn({ 1, 3, 3, 5, 5 }),
                          lm.randn({ 4, 3, 1, 3, 3 }), nil, { act = "mish" })
      -- the C entry points check the code
      local out = require("ffi").new("lm_tensor*[1]")
      assert.are_not.equal(C.LM_OK, C.lm_conv2d(x._c, w._c, nil, nil, nil, nil, 1, -1,
                                                C.LM_NUM_ACT, nil, out))
      assert.truthy(require("ffi").string(C.lm_last_error()):match("activation"))
      C.lm_clear_error()
      assert.are_not.equal(C.LM_OK, C.lm_conv2d(x._c, w._c, nil, nil, nil, nil, 1, -1, -1, nil,
                                                out))
      C.lm_clear_error()
   end)
end)

---------------------------------------------------------------------------------------------
-- where the fusion happens
---------------------------------------------------------------------------------------------

-- batch norms with non-trivial running statistics and affine parameters
local function warm(model)
   lm.no_grad(function()
      for _, m in ipairs(model:modules()) do
         if m:type_name() == "BatchNorm2d" then
            local c = m.num_features
            m.running_mean:copy_(lm.randn({ c }) * 0.1)
            m.running_var:copy_(lm.rand({ c }) + 0.5)
            m.weight:copy_(lm.rand({ c }) + 0.5)
            m.bias:copy_(lm.randn({ c }) * 0.1)
         end
      end
   end)
   return model
end

-- the model op by op (gradients on: nothing is folded or fused per call), detached
local function unfolded(m, x)
   return lm.enable_grad(function() return m(x):detach() end)
end

local function act_module(a)
   if a == "gelu" then return nn.GELU() end
   if a == "gelu_tanh" then return nn.GELU("tanh") end
   local cls = { relu = "ReLU", relu6 = "ReLU6", silu = "SiLU", hardswish = "Hardswish",
                 hardsigmoid = "Hardsigmoid", sigmoid = "Sigmoid" }
   return nn[cls[a]]()
end

describe("fused in evaluation with gradients off", function()
   it("Sequential (Conv2d, BatchNorm2d, act) and (Conv2d, act): per call, folded, and " ..
      "the same when a module is watched", function()
      lm.manual_seed(11)
      for _, a in ipairs(ACTS) do
         local m = warm(nn.Sequential(nn.Conv2d(4, 8, 3, { padding = 1, bias = false }),
                                      nn.BatchNorm2d(8), act_module(a),
                                      nn.Conv2d(8, 6, 1), act_module(a)))
         lm.to_channels_last(m)
         m:eval()
         local x = lm.randn({ 2, 4, 7, 7 }):contiguous(lm.channels_last)
         local ref = unfolded(m, x)
         local y = lm.no_grad(function() return m(x) end)
         assert(rel_diff(y, ref) <= 1e-5, a .. " per call")
         assert.are.equal(lm.channels_last, y:suggest_memory_format())
         -- a wrapper on the activation sees its call: that pair is not fused
         local act = m:children()[3]
         local calls = 0
         act.forward = function(self, t)
            calls = calls + 1
            return getmetatable(self).forward(self, t)
         end
         local yw = lm.no_grad(function() return m(x) end)
         assert.are.equal(1, calls, a .. ": the watched activation ran")
         assert(rel_diff(yw, ref) <= 1e-5, a .. " watched")
         act.forward = nil
         lm.nn.fold_batch_norm(m)
         local yf = lm.no_grad(function() return m(x) end)
         assert(rel_diff(yf, ref) <= 1e-5, a .. " folded")
         assert.are.equal(lm.channels_last, yf:suggest_memory_format())
      end
   end)

   local MODELS = { "mobilenet_v3_large", "efficientnet_b0", "mobilenet_v2" }
   for _, name in ipairs(MODELS) do
      it(name .. ": per-call, folded and frozen logits equal the unfolded model's", function()
         lm.manual_seed(40)
         local m = warm(lm.models[name]({ num_classes = 10 }))
         lm.to_channels_last(m)
         m:eval()
         local x = lm.randn({ 2, 3, 64, 64 }):contiguous(lm.channels_last)
         local ref = unfolded(m, x)
         local scale = ref:abs():max():item()
         local function same(y, what)
            local d = (y:double() - ref:double()):abs():max():item()
            assert(d <= 1e-5 * scale, ("%s %s: max difference %g (max |logit| %g)")
                   :format(name, what, d, scale))
         end
         same(lm.no_grad(function() return m(x) end), "per call")
         local tr = lm.jit.trace(m, x)
         local g = lm.jit.freeze(tr)
         same(lm.no_grad(function() return g(x) end), "frozen")
         -- no activation is left after a convolution in the frozen graph (the classifier's
         -- Hardswish follows a linear layer)
         local left = 0
         for _, node in ipairs(g.graph.nodes) do
            if node.op:match("relu") or node.op:match("silu") or node.op:match("hard")
               or node.op:match("sigmoid") then
               left = left + 1
            end
         end
         assert.are.equal(name == "mobilenet_v3_large" and 1 or 0, left, name .. " activations")
         lm.nn.fold_batch_norm(m)
         same(lm.no_grad(function() return m(x) end), "folded")
      end)
   end
end)

-- the LUMEN_VERBOSE lines of a child luajit running a folded model (the lines go to the C
-- library's stderr)
local function verbose_counts(name)
   local path = os.tmpname()
   local f = assert(io.open(path, "w"))
   f:write(("package.path = %q\npackage.cpath = %q\n"):format(package.path, package.cpath))
   f:write(([[
local lm = require('lumen')
lm.manual_seed(1)
local m = lm.models[%q]({ num_classes = 10 })
lm.to_channels_last(m)
m:eval()
local x = lm.randn({ 1, 3, 32, 32 }):contiguous(lm.channels_last)
lm.nn.fold_batch_norm(m)
local n = 0
for _, mod in ipairs(m:modules()) do
   if mod:type_name() == 'Conv2d' then n = n + 1 end
end
io.stdout:write('convs ', n, '\n')
lm.backends.verbose(1)
lm.no_grad(function() return m(x) end)
lm.backends.verbose(0)
]]):format(name))
   f:close()
   local out = sh.sh("luajit " .. sh.q(path) .. " 2>&1")
   os.remove(path)
   local counts = {}
   for line in out:gmatch("[^\n]+") do
      local op = line:match("^lumen_verbose,exec,[^,]*,([^,]+),")
      if op then counts[op] = (counts[op] or 0) + 1 end
   end
   return tonumber(out:match("convs (%d+)")), counts, out
end

describe("LUMEN_VERBOSE: one convolution where there were a convolution and its activation",
         function()
   for _, e in ipairs({ { "mobilenet_v3_large", 1 }, { "efficientnet_b0", 0 },
                        { "mobilenet_v2", 0 } }) do
      it(e[1], function()
         local convs, counts, out = verbose_counts(e[1])
         assert.is_not_nil(convs, out)
         assert.are.equal(convs, counts.conv2d, out)
         -- no activation left: no clamp (relu6), no unary op (silu, hardswish, hardsigmoid,
         -- sigmoid, relu); mobilenet_v3's classifier Linear -> Hardswish runs in the GEMM's
         -- epilogue where the device fuses linear layers (LM_OP_LINEAR: "linear" lines; the CPU
         -- in float32), elsewhere its Hardswish is the one unary op left (e[2])
         local want = counts.linear and 0 or e[2]
         assert.are.equal(want, counts.unary or 0, out)
         assert.is_nil(counts.clamp, out)
      end)
   end
end)
