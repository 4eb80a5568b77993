-- F.dropout2d / F.dropout3d, nn.Dropout2d / nn.Dropout3d and lm.ops.stochastic_depth /
-- lm.ops.StochasticDepth (issue 40): whole channels (samples, the batch) zeroed and the rest
-- scaled by 1 / (1 - p), training only; the drop rate; float32, float64, bfloat16, float16;
-- contiguous, channels_last and channels_last_3d input, output and gradient keep the format;
-- in place; bad input. Random masks cannot match PyTorch's draws: the checks are structural.

local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local nn = lm.nn

local CL, CL3 = lm.channels_last, lm.channels_last_3d

-- x (positive values, so a zero is a drop) in dtype and format
local function input(sizes, dtype, fmt)
   local t = lm.rand(sizes, { dtype = dtype or lm.float32 }) + 0.5
   if fmt then t = t:to(fmt) end
   return t:detach()
end

-- every slab (the first `lead` dims fixed) of y is either 0 or x * scale; returns the dropped
-- fraction
local function check_slabs(x, y, lead, scale, tol)
   local xv, yv = H.values(x:double():contiguous()), H.values(y:double():contiguous())
   local sizes = x:size()
   local slabs = 1
   for i = 1, lead do slabs = slabs * sizes[i] end
   local per = #xv / slabs
   local dropped = 0
   for s = 0, slabs - 1 do
      local zero = yv[s * per + 1] == 0
      if zero then dropped = dropped + 1 end
      for i = s * per + 1, (s + 1) * per do
         local want = zero and 0 or xv[i] * scale
         assert(math.abs(yv[i] - want) <= tol * math.abs(want) + 1e-12,
                ("slab %d element %d: %g, expected %g"):format(s, i, yv[i], want))
      end
   end
   return dropped / slabs
end

local function fmt_ok(t, fmt, what)
   assert(t:is_contiguous(fmt or lm.contiguous_format), what .. ": format lost, " .. H.describe(t))
end

local DT = { { lm.float64, 1e-12 }, { lm.float32, 1e-6 }, { lm.bfloat16, 1e-2 },
             { lm.float16, 1e-3 } }

describe("dropout2d / dropout3d", function()
   for _, dt in ipairs(DT) do
      it("dropout2d " .. tostring(dt[1]) .. ": whole channels, scaled, format kept", function()
         lm.manual_seed(1)
         for _, fmt in ipairs({ false, CL }) do
            local x = input({ 4, 64, 3, 2 }, dt[1], fmt or nil):requires_grad_()
            local y = F.dropout2d(x, 0.3)
            fmt_ok(y, fmt or nil, "output")
            local rate = check_slabs(x, y, 2, 1 / 0.7, dt[2])
            assert(rate > 0.2 and rate < 0.4, "drop rate " .. rate)
            y:backward(lm.ones_like(y))
            fmt_ok(x.grad, fmt or nil, "gradient")
            -- the gradient is the mask: 0 or 1 / (1 - p), as y / x
            check_slabs(lm.ones_like(x), x.grad, 2, 1 / 0.7, dt[2])
         end
      end)
   end

   it("dropout3d: 5-D channels_last_3d, 4-D unbatched (one draw per channel)", function()
      lm.manual_seed(2)
      local x = input({ 3, 40, 2, 2, 3 }, lm.float32, CL3)
      local y = F.dropout3d(x, 0.5)
      fmt_ok(y, CL3, "dropout3d")
      local rate = check_slabs(x, y, 2, 2, 1e-6)
      assert(rate > 0.3 and rate < 0.7, "drop rate " .. rate)
      local u = input({ 50, 2, 2, 3 })
      check_slabs(u, F.dropout3d(u, { p = 0.5 }), 1, 2, 1e-6)
      local v = input({ 2, 30, 5 })   -- dropout2d's 3-D input: (N, C, L)
      check_slabs(v, F.dropout2d(v, 0.5), 2, 2, 1e-6)
   end)

   it("eval, p = 0, p = 1, in place, modules", function()
      local x = input({ 2, 3, 4, 4 })
      assert(rawequal(F.dropout2d(x, 0.5, false), x), "not training: the input")
      assert(rawequal(F.dropout2d(x, 0), x), "p = 0: the input")
      H.assert_close(H.values(F.dropout2d(x, 1)), H.values(x * 0), 0)
      local y = x:clone()
      local r = F.dropout2d(y, 0.5, true, true)
      assert(rawequal(r, y), "in place returns its input")
      check_slabs(x, y, 2, 2, 1e-6)
      local m = nn.Dropout2d(0.25)
      assert(tostring(m) == "Dropout2d(p=0.25)", tostring(m))
      check_slabs(x, m(x), 2, 1 / 0.75, 1e-6)
      m:eval()
      assert(rawequal(m(x), x), "eval: the input")
      local m3 = nn.Dropout3d({ p = 0.5, inplace = true })
      assert(tostring(m3) == "Dropout3d(p=0.5, inplace=True)", tostring(m3))
      local z = input({ 2, 3, 2, 2, 2 })
      assert(rawequal(m3(z), z), "in place")
   end)

   it("bad input", function()
      local x = input({ 2, 3, 4, 4 })
      for _, fn in ipairs({ "dropout2d", "dropout3d" }) do
         H.assert_error_like(fn, "tensor expected", F[fn], nil)
         H.assert_error_like(fn, "between 0 and 1", F[fn], x, 1.5)
         H.assert_error_like(fn, "between 0 and 1", F[fn], x, "a")
         H.assert_error_like(fn, "unknown option", F[fn], x, { q = 1 })
         H.assert_error_like(fn, "training", F[fn], x, 0.5, "yes")
         H.assert_error_like(fn, "-d", F[fn], lm.randn({ 2, 3 }))
      end
      H.assert_error_like("dropout2d", "floating", F.dropout2d,
                          lm.tensor({ 1, 2 }, { dtype = lm.int64 }):view({ 1, 1, 2 }))
      H.assert_error_like("Dropout2d", "between 0 and 1", nn.Dropout2d, -0.1)
      H.assert_error_like("Dropout3d", "unknown option", nn.Dropout3d, { q = 0.1 })
   end)
end)

describe("lm.ops.stochastic_depth", function()
   for _, dt in ipairs(DT) do
      it("row and batch modes " .. tostring(dt[1]), function()
         lm.manual_seed(3)
         local x = input({ 200, 3, 2, 2 }, dt[1], CL):requires_grad_()
         local y = lm.ops.stochastic_depth(x, 0.2, "row", true)
         fmt_ok(y, CL, "row")
         local rate = check_slabs(x, y, 1, 1 / 0.8, dt[2])
         assert(rate > 0.1 and rate < 0.3, "drop rate " .. rate)
         y:backward(lm.ones_like(y))
         fmt_ok(x.grad, CL, "gradient")
         local b = lm.ops.stochastic_depth(x, 0.5, "batch")
         check_slabs(x, b, 0, 2, dt[2])
      end)
   end

   it("identity when not training or p = 0; p = 1 zeroes; the module", function()
      local x = input({ 4, 3, 2, 2 })
      assert(rawequal(lm.ops.stochastic_depth(x, 0.5, "row", false), x))
      assert(rawequal(lm.ops.stochastic_depth(x, 0, "batch"), x))
      H.assert_close(H.values(lm.ops.stochastic_depth(x, 1, "row")), H.values(x * 0), 0)
      local m = lm.ops.StochasticDepth(0.2, "row")
      assert(tostring(m) == "StochasticDepth(p=0.2, mode=row)", tostring(m))
      check_slabs(x, m(x), 1, 1 / 0.8, 1e-6)
      m:eval()
      assert(rawequal(m(x), x))
   end)

   it("bad input", function()
      local x = input({ 4, 3 })
      local sd = lm.ops.stochastic_depth
      H.assert_error_like("ops.stochastic_depth", "tensor expected", sd, nil, 0.5, "row")
      H.assert_error_like("ops.stochastic_depth", "between 0 and 1", sd, x, 2, "row")
      H.assert_error_like("ops.stochastic_depth", "between 0 and 1", sd, x, nil, "row")
      H.assert_error_like("ops.stochastic_depth", "mode", sd, x, 0.5, "col")
      H.assert_error_like("ops.stochastic_depth", "training", sd, x, 0.5, "row", 1)
      H.assert_error_like("StochasticDepth", "mode", lm.ops.StochasticDepth, 0.5, "x")
   end)
end)
