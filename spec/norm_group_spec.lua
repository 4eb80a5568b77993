-- F.group_norm, F.layer_norm, F.instance_norm (issue 40; src/ops/norm_group.c,
-- kernels/cpu/norm_group.c, lua/lumen/functional/norm.lua) and nn.GroupNorm, nn.LayerNorm,
-- nn.InstanceNorm1d/2d/3d: values and the gradients of input, weight and bias against PyTorch 2.x
-- float64 fixtures (spec/fixtures/nn/norm.lua, gen_norm.py) in float64 and float32, contiguous and
-- channels-last input; float16 / bfloat16 within their rounding; output and gradient keep the
-- input's memory format (also where PyTorch drops it); ConvNeXt's permuted layer_norm without a
-- copy; running statistics; float64 gradchecks; bad input. Under LUMEN_TEST_DEVICE (sim:0, the
-- emulated cuda:0) the same checks run there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local FX = dofile("spec/fixtures/nn/norm.lua")

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local DTYPES = { { lm.float64, 1e-9 }, { lm.float32, 3e-5 } }
local HALVES = { { lm.float16, 2e-2 }, { lm.bfloat16, 8e-2 } }

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
   local err = (got - e):abs():max():item()
   local scale = math.max(1, e:abs():max():item())
   assert(err <= tol * scale, ("%s: max error %g > %g"):format(what, err, tol * scale))
end

local function assert_format(t, fmt, what, c)
   if c and c.permuted and not fmt then return end -- the permuted view's result: PyTorch's strides
   if fmt then
      assert(t:is_contiguous(fmt), what .. ": expected " .. tostring(fmt) .. ", got " ..
             H.describe(t))
   else
      assert(t:is_contiguous(), what .. ": expected contiguous, got " .. H.describe(t))
   end
end

local RUN = {
   group_norm = function(x, w, b, c) return F.group_norm(x, c.groups, w, b, { eps = 1e-5 }) end,
   layer_norm = function(x, w, b, c)
      if c.permuted then
         return F.layer_norm(x:permute(1, 3, 4, 2), c.normalized_shape, w, b,
                             { eps = c.eps }):permute(1, 4, 2, 3)
      end
      return F.layer_norm(x, c.normalized_shape, w, b, { eps = 1e-5 })
   end,
   instance_norm = function(x, w, b) return F.instance_norm(x, nil, nil, w, b) end,
}

for _, op in ipairs({ "group_norm", "layer_norm", "instance_norm" }) do
   describe("F." .. op .. " against PyTorch", function()
      for _, c in ipairs(FX[op]) do
         local nd = #c.x.sizes
         local fmts = { false }
         if cl_of(nd) then fmts[2] = cl_of(nd) end
         for _, fmt in ipairs(fmts) do
            for _, dt in ipairs(DTYPES) do
               local label = ("%s %s %s"):format(c.name, tostring(dt[1]),
                                                 fmt and tostring(fmt) or "contiguous")
               it(label .. ": values, gradients, formats", function()
                  local x = fx(c.x, dt[1], fmt or nil, true)
                  local w = fx(c.w, dt[1], nil, true)
                  local b = fx(c.b, dt[1], nil, true)
                  local y = RUN[op](x, w, b, c)
                  close(y, c.out, dt[2], "output")
                  y:backward(fx(c.gout, dt[1], fmt or nil))
                  close(x.grad, c.gx, dt[2] * 10, "grad_input")
                  if w then
                     close(w.grad, c.gw, dt[2] * 10, "grad_weight")
                     close(b.grad, c.gb, dt[2] * 10, "grad_bias")
                  end
                  assert_format(y, fmt or nil, "output", c)
                  assert_format(x.grad, fmt or nil, "grad_input", c)
               end)
            end
            for _, dt in ipairs(HALVES) do
               it(("%s %s %s: within the half's rounding, format kept"):format(c.name,
                  tostring(dt[1]), fmt and tostring(fmt) or "contiguous"), function()
                  local x = fx(c.x, dt[1], fmt or nil, true)
                  local w = fx(c.w, lm.float32, nil, true)
                  local b = fx(c.b, lm.float32, nil, true)
                  local y = RUN[op](x, w, b, c)
                  assert(y:dtype() == dt[1], "output dtype")
                  close(y, c.out, dt[2], "output")
                  y:backward(fx(c.gout, dt[1], fmt or nil))
                  assert(x.grad:dtype() == dt[1], "grad_input dtype")
                  close(x.grad, c.gx, dt[2] * 4, "grad_input")
                  if w then
                     assert(w.grad:dtype() == lm.float32, "grad_weight keeps the weight's dtype")
                     close(w.grad, c.gw, dt[2] * 4, "grad_weight")
                  end
                  assert_format(y, fmt or nil, "output", c)
                  assert_format(x.grad, fmt or nil, "grad_input", c)
               end)
            end
         end
      end
   end)
end

describe("channels-last where PyTorch drops it", function()
   it("every channels-last case keeps channels-last in lumen", function()
      local dropped = 0
      for _, op in ipairs({ "group_norm", "layer_norm", "instance_norm" }) do
         for _, c in ipairs(FX[op]) do
            local fmt = cl_of(#c.x.sizes)
            if fmt then
               if c.torch_keeps_cl == false then dropped = dropped + 1 end
               local y = RUN[op](fx(c.x, lm.float32, fmt), fx(c.w, lm.float32),
                                 fx(c.b, lm.float32), c)
               assert_format(y, fmt, op .. " " .. c.name)
            end
         end
      end
      assert(dropped > 0, "the fixtures record cases where PyTorch drops the format")
   end)
   it("ConvNeXt's LayerNorm2d: the permuted view is normalised in place of a copy", function()
      local x = fx(FX.layer_norm[5].x, lm.float32, lm.channels_last)
      local xp = x:permute(1, 3, 4, 2)
      assert(xp:is_contiguous(), "the NHWC view of a channels-last tensor is contiguous")
      local y = F.layer_norm(xp, { 6 }, nil, nil)
      assert(y:is_contiguous() and y:permute(1, 4, 2, 3):is_contiguous(lm.channels_last))
   end)
end)

describe("instance_norm running statistics", function()
   for _, c in ipairs(FX.instance_norm) do
      it(c.name .. ": updated as PyTorch, and eval with them", function()
         local x = fx(c.x, lm.float64, cl_of(#c.x.sizes))
         local rm, rv = fx(c.running_mean0), fx(c.running_var0)
         F.instance_norm(x, rm, rv, nil, nil, { momentum = c.momentum })
         close(rm, c.running_mean, 1e-9, "running_mean")
         close(rv, c.running_var, 1e-9, "running_var")
         local y = F.instance_norm(x, fx(c.running_mean0), fx(c.running_var0), nil, nil,
                                   { use_input_stats = false })
         close(y, c.eval_out, 1e-9, "eval output")
      end)
   end
end)

describe("gradcheck (float64)", function()
   local function r(s) return lm.randn(s, { dtype = lm.float64 }) end
   local function dev(t) if DEV then t = t:to(DEV) end return t:detach():requires_grad_(true) end
   it("group_norm contiguous and channels-last", function()
      for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
         assert(G.check(function(x, w, b) return F.group_norm(x, 2, w, b) end,
                        { dev(r({ 2, 4, 3, 3 }):contiguous(fmt)), dev(r({ 4 })), dev(r({ 4 })) }))
      end
   end)
   it("group_norm channels_last_3d", function()
      assert(G.check(function(x, w, b) return F.group_norm(x, 3, w, b) end,
                     { dev(r({ 1, 6, 2, 2, 3 }):contiguous(lm.channels_last_3d)), dev(r({ 6 })),
                       dev(r({ 6 })) }))
   end)
   it("layer_norm over two trailing dims", function()
      assert(G.check(function(x, w, b) return F.layer_norm(x, { 3, 4 }, w, b) end,
                     { dev(r({ 2, 3, 4 })), dev(r({ 3, 4 })), dev(r({ 3, 4 })) }))
   end)
   it("instance_norm channels-last", function()
      assert(G.check(function(x, w, b) return F.instance_norm(x, nil, nil, w, b) end,
                     { dev(r({ 2, 3, 3, 4 }):contiguous(lm.channels_last)), dev(r({ 3 })),
                       dev(r({ 3 })) }))
   end)
end)

describe("modules", function()
   it("GroupNorm, LayerNorm, InstanceNorm1d/2d/3d: parameters, buffers, forward", function()
      local g = lm.nn.GroupNorm(2, 4)
      assert(g.weight and g.bias and tostring(g) == "GroupNorm(2, 4, eps=1e-05, affine=True)")
      local x = lm.randn({ 2, 4, 3, 3 }):contiguous(lm.channels_last)
      if DEV then g:to(DEV); x = x:to(DEV) end
      assert(g(x):is_contiguous(lm.channels_last))
      local l = lm.nn.LayerNorm({ 3, 3 })
      assert(#l.weight:size() == 2)
      assert(lm.nn.LayerNorm(4, { elementwise_affine = false }).weight == nil)
      local i2 = lm.nn.InstanceNorm2d(4, { affine = true, track_running_stats = true })
      assert(i2.running_mean and i2.weight)
      local i1 = lm.nn.InstanceNorm1d(4)
      assert(i1.weight == nil and i1.running_mean == nil)
      assert(#i1(lm.randn({ 4, 5 })):size() == 2, "unbatched")
   end)
end)

describe("bad input", function()
   local x = lm.randn({ 2, 6, 3, 3 })
   local bad = H.assert_error_like
   it("names the function and the problem", function()
      bad("group_norm", "divisible", F.group_norm, x, 4)
      bad("group_norm", "num_groups", F.group_norm, x, 0)
      bad("group_norm", "weight", F.group_norm, x, 2, lm.ones({ 5 }))
      bad("group_norm", "2 dims", F.group_norm, lm.ones({ 3 }), 1)
      bad("group_norm", "floating", F.group_norm, x:long(), 2)
      bad("group_norm", "epsilon", F.group_norm, x, 2, nil, nil, { epsilon = 1 })
      bad("group_norm", "eps", F.group_norm, x, 2, nil, nil, { eps = -1 })
      bad("layer_norm", "normalized_shape", F.layer_norm, x, { 4 })
      bad("layer_norm", "weight", F.layer_norm, x, { 3 }, lm.ones({ 4 }))
      bad("layer_norm", "normalized_shape", F.layer_norm, x, "a")
      bad("instance_norm", "3 dims", F.instance_norm, lm.randn({ 2, 6 }))
      bad("instance_norm", "together", F.instance_norm, x, lm.zeros({ 6 }))
      bad("instance_norm", "running", F.instance_norm, x, nil, nil, nil, nil,
          { use_input_stats = false })
      bad("instance_norm", "cpu (running_mean)", F.instance_norm, x:to("sim:0"),
          lm.zeros({ 6 }):to("cpu"), lm.ones({ 6 }):to("cpu"))
      bad("instance_norm", "cpu (weight)", F.instance_norm, x:to("sim:0"), nil, nil,
          lm.ones({ 6 }):to("cpu"))
      bad("GroupNorm", "divisible", lm.nn.GroupNorm, 4, 6)
      bad("InstanceNorm3d", "5D",
          function() return lm.nn.InstanceNorm3d(4)(lm.randn({ 2, 4, 3 })) end)
   end)
end)

-- PyTorch 2.x's answers (spec/fixtures/nn/gen_norm.py has no part in it: the matrix was read off
-- torch.nn.functional in a loop over input and parameter dtypes): the parameters have the input's
-- dtype, or float32 under a float16 / bfloat16 input; anything else is refused
describe("parameter dtypes as PyTorch", function()
   local names = { "float32", "float64", "bfloat16", "float16" }
   local OK = {                               -- OK[input][parameter]
      float32 = { float32 = true }, float64 = { float64 = true },
      bfloat16 = { float32 = true, bfloat16 = true }, float16 = { float32 = true, float16 = true },
   }
   local ops = {
      layer_norm = function(x, w) return F.layer_norm(x, { 3 }, w, w) end,
      group_norm = function(x, w) return F.group_norm(x, 2, w, w) end,
      instance_norm = function(x, w) return F.instance_norm(x, nil, nil, w, w) end,
      batch_norm = function(x, w)
         return F.batch_norm(x, lm.zeros({ 4 }, { dtype = w:dtype() }),
                             lm.ones({ 4 }, { dtype = w:dtype() }), w, w)
      end,
   }
   for op, f in pairs(ops) do
      it(op, function()
         for _, xn in ipairs(names) do
            for _, wn in ipairs(names) do
               local x = lm.randn({ 2, 4, 3, 3 }):to(lm[xn])
               local w = lm.ones({ op == "layer_norm" and 3 or 4 }, { dtype = lm[wn] })
               local ok, r = pcall(f, x, w)
               if OK[xn][wn] then
                  assert(ok, ("%s %s / %s: %s"):format(op, xn, wn, tostring(r)))
                  assert(r:dtype() == lm[xn], op .. ": the input's dtype")
               else
                  assert(not ok, ("%s accepted a %s input with %s parameters"):format(op, xn, wn))
                  assert(tostring(r):find("lumen." .. op .. ": ", 1, true)
                         and tostring(r):find("dtype", 1, true), tostring(r))
               end
            end
         end
      end)
   end
   it("running statistics share the weight's dtype (batch_norm, instance_norm)", function()
      local x = lm.randn({ 2, 4, 3, 3 }):to(lm.bfloat16)
      local wb = lm.ones({ 4 }, { dtype = lm.bfloat16 })
      H.assert_error_like("batch_norm", "share one dtype", F.batch_norm, x, lm.zeros({ 4 }),
                          lm.ones({ 4 }), wb, wb)
      H.assert_error_like("instance_norm", "share one dtype", F.instance_norm, x, lm.zeros({ 4 }),
                          lm.ones({ 4 }), wb, wb)
      -- float32 statistics and parameters under a bfloat16 input: autocast's batch norm
      assert(F.batch_norm(x, lm.zeros({ 4 }), lm.ones({ 4 }), lm.ones({ 4 }), lm.zeros({ 4 }))
             :dtype() == lm.bfloat16)
   end)
end)

describe("PyTorch's positional forms", function()
   local x = lm.randn({ 2, 4, 3, 3 }):contiguous(lm.channels_last)
   local function same(a, b) assert(H.rel_diff(a, b) == 0, "not the same values") end
   it("batch_norm(x, rm, rv, w, b, training, momentum, eps)", function()
      local rm1, rv1, rm2, rv2 = lm.zeros({ 4 }), lm.ones({ 4 }), lm.zeros({ 4 }), lm.ones({ 4 })
      same(F.batch_norm(x, rm1, rv1, nil, nil, true, 0.3, 1e-3),
           F.batch_norm(x, rm2, rv2, nil, nil, { training = true, momentum = 0.3, eps = 1e-3 }))
      same(rm1, rm2)
      same(rv1, rv2)
      same(F.batch_norm(x, rm1, rv1, nil, nil, nil, nil, 0.5),
           F.batch_norm(x, rm1, rv1, nil, nil, { eps = 0.5 }))
   end)
   it("layer_norm, group_norm (..., eps), instance_norm (..., use_input_stats, momentum, eps)",
      function()
      same(F.layer_norm(x, { 3 }, nil, nil, 0.25), F.layer_norm(x, { 3 }, nil, nil, { eps = 0.25 }))
      same(F.group_norm(x, 2, nil, nil, 0.25), F.group_norm(x, 2, nil, nil, { eps = 0.25 }))
      same(F.instance_norm(x, nil, nil, nil, nil, true, 0.1, 0.25),
           F.instance_norm(x, nil, nil, nil, nil, { eps = 0.25 }))
   end)
   it("refuses more arguments than PyTorch takes, or a table before them", function()
      H.assert_error_like("layer_norm", "too many arguments", F.layer_norm, x, { 3 }, nil, nil,
                          1e-5, 1)
      H.assert_error_like("batch_norm", "last argument", F.batch_norm, x, lm.zeros({ 4 }),
                          lm.ones({ 4 }), nil, nil, { eps = 1 }, 0.1)
      H.assert_error_like("group_norm", "eps", F.group_norm, x, 2, nil, nil, "a")
   end)
end)

describe("ONNX export", function()
   local ffi = require("ffi")
   local C = require("lumen.C")
   local shell = require("spec.shell")
   local nn = lm.nn
   local LN2d = nn.Module:extend("LN2dSpec")
   function LN2d:__init(c) self.ln = nn.LayerNorm(c, { eps = 1e-6 }) end
   function LN2d:forward(x) return self.ln(x:permute(1, 3, 4, 2)):permute(1, 4, 2, 3) end
   it("GroupNorm, InstanceNorm2d, LayerNorm over C: onnx.checker and ONNX Runtime within 1e-4 " ..
      "(LayerNormalization at opset 17, its decomposition at 13 and 16)", function()
      if DEV then
         pending("the host device only")
         return
      end
      local py, why = require("spec.onnx_io").runtime()
      if not py then
         pending(why)
         return
      end
      lm.manual_seed(7)
      local model = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), nn.GroupNorm(4, 8),
                                  nn.InstanceNorm2d(8, { affine = true }), LN2d(8),
                                  nn.GroupNorm(2, 8, { affine = false }),
                                  nn.LayerNorm({ 6, 5 }, { elementwise_affine = false }),
                                  nn.LayerNorm(5, { bias = false })):eval()
      lm.no_grad(function()
         for _, p in ipairs(model:parameters()) do p:copy_(lm.randn(p:size()) * 0.3 + 0.5) end
      end)
      lm.to_channels_last(model)
      local x = lm.randn({ 2, 3, 6, 5 }):contiguous(lm.channels_last)
      local want = lm.no_grad(function() return model(x) end)
      local p = os.tmpname()
      local f = assert(io.open(p .. ".x", "wb"))
      local xc = x:contiguous()
      f:write(ffi.string(C.lm_tensor_data(xc._c), xc:numel() * 4))
      f:close()
      local args = {}
      for _, opset in ipairs({ 17, 13, 16 }) do
         lm.onnx.export(model, x, p .. opset .. ".onnx", { opset = opset })
         args[#args + 1] = shell.q(p .. opset .. ".onnx") .. " " .. shell.q(p .. ".x") .. " " ..
            shell.q(p .. opset .. ".y")
      end
      local o2, rc2 = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
      assert.are.equal(0, rc2, o2)
      for _, opset in ipairs({ 17, 13, 16 }) do
         local s = assert(shell.read_file(p .. opset .. ".y"))
         local got = lm.zeros(want:size())
         assert(#s == got:numel() * 4)
         ffi.copy(C.lm_tensor_data(got._c), s, #s)
         local d = (got - want):abs():max():item()
         local bytes = assert(shell.read_file(p .. opset .. ".onnx"))
         assert.are.equal(opset >= 17, bytes:find("LayerNormalization", 1, true) ~= nil)
         assert(d <= 1e-4, "opset " .. opset .. ": ONNX Runtime vs lumen: " .. d)
      end
      os.execute("rm -f " .. shell.q(p) .. "*")
   end)
end)
