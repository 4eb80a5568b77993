-- F.conv_transpose1d / 2d / 3d and nn.ConvTranspose1d/2d/3d (issue 40;
-- lua/lumen/functional/conv_transpose.lua, on the convolution kernels): values and the gradients
-- of input, weight and bias against PyTorch 2.x float64 fixtures (spec/fixtures/nn/resample.lua,
-- gen_resample.py) for stride, padding, output_padding, groups, dilation, with and without bias,
-- in float64, float32, float16, bfloat16, contiguous and channels-last input; output and gradients
-- keep channels_last / channels_last_3d (PyTorch's conv_transpose3d drops channels_last_3d: the
-- fixtures record it); float64 gradchecks; bad input. Under LUMEN_TEST_DEVICE (sim:0, the emulated
-- cuda:0) the same checks run there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local FX = dofile("spec/fixtures/nn/resample.lua")

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local DTYPES = { { lm.float64, 1e-8 }, { lm.float32, 3e-5 },
                 { lm.float16, 2e-2 }, { lm.bfloat16, 8e-2 } }

local function cl_of(nd)
   if nd == 4 then return lm.channels_last elseif nd == 5 then return lm.channels_last_3d end
end

local function fx(d, dtype, fmt, rg)
   if d == nil then return nil end
   local t = lm.tensor(d.data, { dtype = lm.float64 }):view(d.sizes)
   t = t:to(dtype or lm.float64)
   if fmt then t = t:contiguous(fmt) end
   if DEV then t = t:to(DEV) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

local function close(t, expected, tol, what)
   local e = lm.tensor(expected.data, { dtype = lm.float64 }):view(expected.sizes):cpu()
   local got = t:detach():cpu():double()
   assert(got:dim() == #expected.sizes, what .. ": rank")
   for i, s in ipairs(expected.sizes) do
      assert(got:size(i) == s, ("%s: size %s, expected %s"):format(what,
             table.concat(got:size(), "x"), table.concat(expected.sizes, "x")))
   end
   local err = (got - e):abs():max():item()
   local scale = math.max(1, e:abs():max():item())
   assert(err <= tol * scale, ("%s: max error %g > %g"):format(what, err, tol * scale))
end

local function assert_format(t, fmt, what)
   if fmt then
      assert(t:is_contiguous(fmt), what .. ": expected " .. tostring(fmt) .. ", got " ..
             H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

describe("F.conv_transpose against PyTorch", function()
   for _, c in ipairs(FX.conv_transpose) do
      local nd = #c.x.sizes
      local fn = F["conv_transpose" .. c.nd .. "d"]
      local fmts = { false }
      if cl_of(nd) then fmts[2] = cl_of(nd) end
      for _, fmt in ipairs(fmts) do
         for _, dt in ipairs(DTYPES) do
            it(("%s %s %s: values, gradients, formats"):format(c.name, tostring(dt[1]),
               fmt and tostring(fmt) or "contiguous"), function()
               local x = fx(c.x, dt[1], fmt or nil, true)
               local w = fx(c.w, dt[1], nil, true)
               local b = fx(c.b, dt[1], nil, true)
               local y = fn(x, w, b, c.opts)
               assert.are.equal(dt[1], y:dtype())
               close(y, c.out, dt[2], "out")
               assert_format(y, fmt or nil, "out")
               y:backward(fx(c.gout, dt[1], fmt or nil))
               close(x.grad, c.gx, dt[2] * 2, "grad_input")
               close(w.grad, c.gw, dt[2] * 4, "grad_weight")
               if b then close(b.grad, c.gb, dt[2] * 4, "grad_bias") end
               assert_format(x.grad, fmt or nil, "grad_input")
               -- a leaf's .grad takes the leaf's layout (PyTorch's rule): w is contiguous
               assert_format(w.grad, nil, "grad_weight")
            end)
         end
      end
   end

   it("keeps channels_last_3d where PyTorch's conv_transpose3d drops it", function()
      local c = FX.conv_transpose[8]
      assert.are.equal("3d_basic", c.name)
      assert.is_false(c.torch_keeps_cl)
      local y = F.conv_transpose3d(fx(c.x, lm.float32, lm.channels_last_3d), fx(c.w, lm.float32),
                                   fx(c.b, lm.float32), c.opts)
      assert_format(y, lm.channels_last_3d, "out")
   end)

   it("unbatched input", function()
      local c = FX.conv_transpose[1]
      local x = fx(c.x)
      local y = F.conv_transpose2d(x[1], fx(c.w), fx(c.b), c.opts)
      local full = F.conv_transpose2d(x, fx(c.w), fx(c.b), c.opts)
      assert.are.equal(3, y:dim())
      assert.is_true(((y - full[1]):abs():max():item()) < 1e-12)
   end)
end)

-- PyTorch 2.15's answers for x = sin(0, 1, ...), w = cos(0, 1, ...) viewed to the sizes, stride
-- 1, dilation 2, output_padding 1 (the output's last positions reached only by x's last taps):
-- sum(y), sum(x.grad), sum(w.grad) for the loss sum(y^2)
describe("F.conv_transpose with output_padding >= stride", function()
   local cases = {
      { 3, { 2, 4, 6, 6, 6 }, { 4, 1, 2, 2, 2 }, { padding = 1, output_padding = 1, groups = 2,
        dilation = 2 }, { 2, 2, 7, 7, 7 }, { -0.3213068257, 3.629122724, 90.39531495 } },
      { 2, { 1, 1, 1, 2 }, { 1, 3, 4, 3 }, { padding = 2, output_padding = 1, dilation = 2 },
        { 1, 3, 4, 3 }, { 0.07021256014, 7.831790466, 0.1181636643 } },
      { 1, { 1, 1, 5 }, { 1, 1, 3 }, { output_padding = 1, dilation = 2 }, { 1, 1, 10 },
        { 1.27601305, 5.245752474, 2.887898283 } },
      { 2, { 2, 2, 5, 4 }, { 2, 3, 3, 3 }, { padding = 1, output_padding = 1, dilation = 2 },
        { 2, 3, 8, 7 }, { -1.049738289, 17.17171172, -6.43741135 } },
   }
   for i, c in ipairs(cases) do
      it(c[1] .. "-D " .. i .. ", contiguous and channels-last", function()
         local fmts = { false, c[1] == 2 and lm.channels_last or c[1] == 3 and
                        lm.channels_last_3d or false }
         for _, fmt in ipairs(fmts) do
            local nx, nw = H.prod(c[2]), H.prod(c[3])
            local x = lm.arange(0, nx):double():sin():view(c[2])
            if fmt then x = x:contiguous(fmt) end
            local w = lm.arange(0, nw):double():cos():view(c[3])
            if DEV then x, w = x:to(DEV), w:to(DEV) end
            x:requires_grad_(true)
            w:requires_grad_(true)
            local y = F["conv_transpose" .. c[1] .. "d"](x, w, nil, c[4])
            assert.is_true(H.list_equal(c[5], y:size()), "output size")
            if fmt and x:suggest_memory_format() == fmt then
               assert.is_true(y:is_contiguous(fmt), "keeps the format")
            end
            y:pow(2):sum():backward()
            local got = { y:sum():item(), x.grad:sum():item(), w.grad:sum():item() }
            for k = 1, 3 do
               assert.is_true(math.abs(got[k] - c[6][k]) <= 1e-8 * (1 + math.abs(c[6][k])),
                              ("value %d: %.10g, PyTorch %.10g"):format(k, got[k], c[6][k]))
            end
         end
      end)
   end
end)

describe("F.conv_transpose gradcheck (float64)", function()
   local cases = {
      { 1, { 1, 2, 4 }, { 2, 2, 3 }, nil, { stride = 2, padding = 1, output_padding = 1 } },
      { 2, { 1, 2, 3, 3 }, { 2, 1, 2, 3 }, lm.channels_last,
        { stride = { 2, 1 }, groups = 2, dilation = { 1, 2 } } },
      { 3, { 1, 2, 2, 2, 2 }, { 2, 2, 2, 2, 2 }, lm.channels_last_3d,
        { stride = 2, padding = { 0, 1, 0 }, output_padding = { 1, 0, 0 } } },
      -- output_padding not below the stride (allowed below the dilation): the convolution of
      -- the output's sizes is longer than x
      { 1, { 1, 1, 5 }, { 1, 2, 3 }, nil, { output_padding = 1, dilation = 2 } },
      { 2, { 1, 2, 3, 2 }, { 2, 3, 2, 2 }, lm.channels_last,
        { padding = 1, output_padding = { 1, 0 }, dilation = 2 } },
      { 3, { 1, 2, 2, 2, 2 }, { 2, 1, 2, 2, 2 }, lm.channels_last_3d,
        { padding = 1, output_padding = 1, dilation = 2, groups = 2 } },
   }
   for i, cs in ipairs(cases) do
      it(cs[1] .. "-D " .. i, function()
         local x = G.input(cs[2], cs[4], i)
         local w = G.input(cs[3], nil, i + 10)
         local cout = cs[3][2] * (cs[5].groups or 1)
         local b = G.input({ cout }, nil, i + 20)
         if DEV then
            x = x:detach():to(DEV):requires_grad_(true)
            w = w:detach():to(DEV):requires_grad_(true)
            b = b:detach():to(DEV):requires_grad_(true)
         end
         local fn = F["conv_transpose" .. cs[1] .. "d"]
         assert.is_true(G.check(function(a, c, d) return fn(a, c, d, cs[5]) end, { x, w, b }))
      end)
   end
end)

describe("nn.ConvTranspose1d/2d/3d", function()
   it("parameters as PyTorch's and the forward of F.conv_transpose*", function()
      for nd = 1, 3 do
         local m = lm.nn["ConvTranspose" .. nd .. "d"](4, 6, 3, { stride = 2, padding = 1,
                                                                 output_padding = 1, groups = 2 })
         local ws = m.weight:size()
         assert.are.same(4, ws[1]); assert.are.same(3, ws[2]); assert.are.same(3, ws[3])
         assert.are.same(6, m.bias:size(1))
         local xs = { 2, 4 }
         for i = 1, nd do xs[i + 2] = 3 end
         local x = lm.randn(xs)
         if DEV then m:to(DEV); x = x:to(DEV) end
         local y = m:forward(x)
         assert.are.equal(6, y:size(3))
         local ref = F["conv_transpose" .. nd .. "d"](x, m.weight, m.bias, { stride = 2,
                     padding = 1, output_padding = 1, groups = 2 })
         assert.is_true(((y - ref):abs():max():item()) == 0)
         assert.truthy(tostring(m):find("output_padding", 1, true))
      end
      local nb = lm.nn.ConvTranspose2d(2, 2, 2, { bias = false })
      assert.is_nil(nb.bias)
   end)
end)

describe("nn.ConvTranspose1d/2d/3d:forward(x, output_size)", function()
   -- PyTorch's _output_padding: min = (in - 1) * stride - 2 * padding + dilation * (k - 1) + 1,
   -- max = min + stride - 1, output_padding = size - min
   local function mod(nd, opts)
      local m = lm.nn["ConvTranspose" .. nd .. "d"](3, 4, 3, opts)
      if DEV then m:to(DEV) end
      return m
   end
   local function input(sizes, fmt)
      local x = lm.randn(sizes)
      if fmt then x = x:contiguous(fmt) end
      if DEV then x = x:to(DEV) end
      return x
   end
   local function same(a, b)
      assert.are.same(b:size(), a:size())
      assert.are.equal(0, (a - b):abs():max():item())
   end

   it("every valid size equals the explicit output_padding (1-D, 2-D, 3-D)", function()
      for nd = 1, 3 do
         local stride, ins = {}, { 2, 3 }
         for i = 1, nd do stride[i] = i + 1; ins[i + 2] = 4 end   -- strides 2, 3, 4
         local m = mod(nd, { stride = stride, padding = 1, dilation = 1 })
         local x = input(ins)
         local fn = F["conv_transpose" .. nd .. "d"]
         for extra = 0, 1 do
            local want, opad = {}, {}
            for i = 1, nd do
               -- the size with no output padding: (4 - 1) * s - 2 + 2 + 1 = 3 s + 1
               opad[i] = math.min(extra * i, stride[i] - 1)
               want[i] = 3 * stride[i] + 1 + opad[i]
            end
            local ref = fn(x, m.weight, m.bias, { stride = stride, padding = 1,
                                                   output_padding = opad })
            same(m:forward(x, want), ref)
            -- the full size N, C, spatial; N and C are not read (PyTorch's rule)
            local full = { 7, 9 }
            for i = 1, nd do full[i + 2] = want[i] end
            same(m(x, full), ref)
            -- a Size object, as t:size() returns
            same(m(x, ref:size()), ref)
         end
      end
   end)

   it("the largest size, dilation, and the module's output_padding ignored", function()
      local m = mod(2, { stride = { 3, 2 }, padding = { 0, 1 }, dilation = { 2, 1 },
                         output_padding = 1 })
      local x = input({ 1, 3, 5, 6 })
      -- min: (5 - 1) * 3 + 2 * 2 + 1 = 17; (6 - 1) * 2 - 2 + 2 + 1 = 11; max 19, 12
      local y = m(x, { 19, 12 })
      same(y, F.conv_transpose2d(x, m.weight, m.bias, { stride = { 3, 2 }, padding = { 0, 1 },
                                  dilation = { 2, 1 }, output_padding = { 2, 1 } }))
      local y0 = m(x, { 17, 11 })
      same(y0, F.conv_transpose2d(x, m.weight, m.bias, { stride = { 3, 2 },
                                   padding = { 0, 1 }, dilation = { 2, 1 } }))
      -- no output_size: the module's output_padding = 1
      assert.are.same({ 1, 4, 18, 12 }, m(x):size())
   end)

   it("unbatched input takes C, spatial or the spatial sizes", function()
      local m = mod(2, { stride = 2 })
      local x = input({ 3, 4, 5 })
      local ref = m(x:unsqueeze(1), { 10, 12 })[1]
      same(m(x, { 10, 12 }), ref)
      same(m(x, { 4, 10, 12 }), ref)
      assert.are.same({ 4, 10, 12 }, ref:size())
   end)

   it("channels-last in, channels-last out and gradients", function()
      local m = mod(2, { stride = 2, padding = 1 })
      local x = input({ 2, 3, 4, 4 }, lm.channels_last):requires_grad_(true)
      local y = m(x, { 8, 8 })
      assert.are.same({ 2, 4, 8, 8 }, y:size())
      assert_format(y, lm.channels_last, "out")
      y:sum():backward()
      assert_format(x.grad, lm.channels_last, "grad_input")
      local m3 = mod(3, { stride = 2 })
      local x3 = input({ 1, 3, 2, 3, 2 }, lm.channels_last_3d)
      assert_format(m3(x3, { 6, 8, 5 }), lm.channels_last_3d, "out 3-D")
   end)

   it("bad output_size: the function and the problem named", function()
      local m2 = mod(2, { stride = 2, padding = 1 })
      local x = input({ 1, 3, 4, 4 })    -- valid sizes 7..8 per dim
      local cases = {
         { function() m2(x, { 6, 7 }) end,
           "requested an output size of {6, 7}, but valid sizes range from {7, 7} to {8, 8} " ..
           "(for an input of {4, 4})" },
         { function() m2(x, { 7, 9 }) end, "valid sizes range from {7, 7} to {8, 8}" },
         { function() m2(x, { 1, 4, 9, 7 }) end, "requested an output size of {9, 7}" },
         { function() m2(x, { 7, 7, 7 }) end,
           "for 4D input, output_size must have 2 or 4 elements (got 3)" },
         { function() m2(x[1], { 1, 4, 7, 7 }) end,
           "for 3D input, output_size must have 2 or 3 elements (got 4)" },
         { function() m2(x, {}) end, "output_size must have 2 or 4 elements (got 0)" },
         { function() m2(x, { 7.5, 7 }) end, "output_size must hold integers, got 7.5" },
         { function() m2(x, { "7", 7 }) end, "output_size must hold integers" },
         { function() m2(x, 7) end, "output_size must be a table of sizes, got number" },
         { function() m2(lm.zeros({ 3, 4 }), { 7, 7 }) end,
           "expected 3D (unbatched) or 4D (batched) input, got 2D input" },
         { function() m2("x", { 7, 7 }) end, "input: tensor expected" },
         { function() mod(1, { stride = 3 })(input({ 1, 3, 5 }), { 18 }) end,
           "valid sizes range from {15} to {17} (for an input of {5})" },
         { function() mod(3, {})(input({ 1, 3, 2, 2, 2 }), { 4, 4, 5 }) end,
           "valid sizes range from {4, 4, 4} to {4, 4, 4}" },
      }
      for i, cs in ipairs(cases) do
         local ok, e = pcall(cs[1])
         assert.is_false(ok, "case " .. i)
         e = tostring(e)
         assert.truthy(e:find("lumen.ConvTranspose%dd: "), "case " .. i .. ": " .. e)
         assert.truthy(e:find(cs[2], 1, true), "case " .. i .. ": " .. e)
      end
   end)
end)

describe("F.conv_transpose bad input", function()
   local x = lm.zeros({ 1, 4, 3, 3 })
   local w = lm.zeros({ 4, 2, 3, 3 })
   local cases = {
      { function() F.conv_transpose2d(x, lm.zeros({ 3, 2, 3, 3 })) end, "expected weight" },
      { function() F.conv_transpose2d(x, w, nil, { groups = 3 }) end, "divisible by groups" },
      { function() F.conv_transpose2d(x, w, lm.zeros({ 3 })) end, "bias must be" },
      { function() F.conv_transpose2d(x, w, nil, { output_padding = 1 }) end,
        "output padding must be smaller" },
      { function() F.conv_transpose2d(x, w, nil, { padding = 4 }) end, "not positive" },
      { function() F.conv_transpose2d(lm.zeros({ 4, 3 }), w) end, "expected 3%-D" },
      { function() F.conv_transpose2d(x, lm.zeros({ 4, 2, 3 })) end, "weight must be 4%-D" },
      { function() F.conv_transpose2d(x, w:double()) end, "same dtype" },
      { function() F.conv_transpose2d(x, w, nil, { stride = 0 }) end, "stride" },
      { function() F.conv_transpose2d(x, w, nil, { bogus = 1 }) end, "bogus" },
      { function() F.conv_transpose1d(lm.zeros({ 1, 4, 3 }), lm.zeros({ 4, 2, 3, 3 })) end,
        "weight must be 3%-D" },
      { function() F.conv_transpose3d(lm.zeros({ 4, 3, 3 }), w) end, "expected 4%-D" },
      -- a weight or bias on another device: named before any work, as the op's own error
      { function() F.conv_transpose2d(x:to("sim:0"), w:to("cpu")) end, "same device.*weight" },
      { function() F.conv_transpose2d(x:to("sim:0"), w:to("sim:0"), lm.zeros({ 2 }):to("cpu")) end,
        "same device.*bias" },
   }
   for i, cs in ipairs(cases) do
      it(cs[2] .. " " .. i, function()
         local ok, e = pcall(cs[1])
         assert.is_false(ok)
         assert.truthy(tostring(e):find("lumen.conv_transpose", 1, true), tostring(e))
         assert.truthy(tostring(e):find(cs[2]), tostring(e))
      end)
   end
end)
