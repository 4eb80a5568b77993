-- Issue 19, the 1-D part: F.conv1d, F.max_pool1d, F.avg_pool1d, F.adaptive_avg_pool1d,
-- F.adaptive_max_pool1d and F.batch_norm on 2-D to 5-D input against the peer's fixtures
-- (spec/fixtures/nn/nn1d.lua, made by gen_1d.py with PyTorch 2.x): values in float64 and
-- float32, the strides PyTorch gives the output and the gradients for each input layout (3-D:
-- contiguous N×C×L and the N×L×C-strided permuted tensor; 5-D: contiguous and
-- channels_last_3d), float64 gradchecks, errors; the modules Conv1d, MaxPool1d, AvgPool1d,
-- AdaptiveAvgPool1d, AdaptiveMaxPool1d, BatchNorm1d and BatchNorm3d.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm
local F = lm.F
local nn = lm.nn

local FIX = G.fixture("nn1d")
local DTYPES = { { lm.float64, 1e-7 }, { lm.float32, 2e-5 } }
local close = G.close

-- a fixture tensor in layout l ("c" contiguous, "p": 3-D N×L×C strides, 5-D channels_last_3d)
local function fx(d, dtype, l, rg)
   local t = G.tensor(d, dtype)
   if l == "p" and #d.sizes == 3 then
      t = t:permute(1, 3, 2):contiguous():permute(1, 3, 2)
   elseif l == "p" and #d.sizes == 5 then
      t = t:contiguous(lm.channels_last_3d)
   end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

-- strides equal where the size is above 1 (a size-1 dim's stride is arbitrary)
local function assert_strides(t, exp, what)
   local s, z = t:stride(), t:size()
   assert(#s == #exp, what .. ": rank")
   for i = 1, #exp do
      if z[i] > 1 and s[i] ~= exp[i] then
         error(("%s: strides {%s}, PyTorch's {%s} (sizes {%s})"):format(what,
               table.concat(s, ", "), table.concat(exp, ", "), table.concat(z, ", ")), 2)
      end
   end
end

local function plus1(d)
   local r = {}
   for i, v in ipairs(d.data) do r[i] = v + 1 end
   return r
end

---------------------------------------------------------------------------------------------
describe("F.conv1d", function()
   for _, c in ipairs(FIX.conv1d) do
      for _, dt in ipairs(DTYPES) do
         for _, lay in ipairs({ "cc", "cp", "pc", "pp" }) do
            it(("%s %s x:%s w:%s"):format(c.name, tostring(dt[1]), lay:sub(1, 1), lay:sub(2, 2)),
               function()
               local x = fx(c.x, dt[1], lay:sub(1, 1), true)
               local w = fx(c.w, dt[1], lay:sub(2, 2), true)
               local b = c.b and fx(c.b, dt[1], "c", true) or nil
               local out = F.conv1d(x, w, b, c.opts)
               close(out, c.out.data, dt[2], "output")
               local st = c.strides[lay]
               assert_strides(out, st.out, "output")
               out:backward(fx(c.gout, dt[1]))
               close(x.grad, c.gx.data, dt[2], "grad input")
               close(w.grad, c.gw.data, dt[2], "grad weight")
               if b then close(b.grad, c.gb.data, dt[2], "grad bias") end
               assert_strides(x.grad, st.gx, "grad input")
               assert_strides(w.grad, st.gw, "grad weight")
            end)
         end
      end
   end

   it("gradcheck (float64) in both input layouts, groups, stride, dilation, bias", function()
      for _, l in ipairs({ "c", "p" }) do
         local x = G.input({ 2, 4, 7 }, nil, 1)
         if l == "p" then x = x:detach():permute(1, 3, 2):contiguous():permute(1, 3, 2)
            :requires_grad_(true) end
         local w = G.input({ 6, 2, 3 }, nil, 2)
         local b = G.input({ 6 }, nil, 3)
         G.check(function(a, ww, bb)
            return F.conv1d(a, ww, bb, { stride = 2, padding = 2, dilation = 2, groups = 2 })
         end, { x, w, b })
      end
   end)

   it("computes only the gradients wanted; none under no_grad", function()
      local x = lm.randn({ 2, 4, 7 }):permute(1, 3, 2):contiguous():permute(1, 3, 2)
      local w = lm.randn({ 3, 2, 4 }):permute(1, 3, 2):requires_grad_(true)
      local b = lm.randn({ 3 })
      local xr = x:detach():requires_grad_(true)
      local wr = w:detach():requires_grad_(true)
      local ref = F.conv1d(xr, wr, b)
      ref:sum():backward()
      F.conv1d(x, w, b):sum():backward()
      close(w.grad, wr.grad, 1e-6, "grad weight alone")
      assert.is_nil(x.grad)
      local y
      lm.no_grad(function() y = F.conv1d(x, w, b) end)
      assert.is_false(y.requires_grad)
   end)

   it("runs the channels-last-like input on the NHWC path (its 4-D view is channels_last)",
      function()
      local x = lm.randn({ 2, 9, 4 }):permute(1, 3, 2)
      assert(tostring(x:unsqueeze(3):suggest_memory_format()) == "channels_last")
      local w = lm.randn({ 5, 4, 3 })
      close(F.conv1d(x, w, nil, { padding = 1 }), F.conv1d(x:contiguous(), w, nil,
            { padding = 1 }), 1e-5)
   end)

   it("raises lumen.conv1d errors for bad input", function()
      local x, w = lm.randn({ 2, 4, 6 }), lm.randn({ 6, 4, 3 })
      H.assert_error_like("conv1d", "3-D", F.conv1d, lm.randn({ 2, 4, 6, 1 }), w)
      H.assert_error_like("conv1d", "weight must be 3-D", F.conv1d, x, lm.randn({ 6, 4, 3, 1 }))
      H.assert_error_like("conv1d", "channels", F.conv1d, x, lm.randn({ 6, 3, 3 }))
      H.assert_error_like("conv1d", "divisible", F.conv1d, x, lm.randn({ 6, 4, 3 }),
                          nil, { groups = 4 })
      H.assert_error_like("conv1d", "strided", F.conv1d, x, w, nil,
                          { padding = "same", stride = 2 })
      H.assert_error_like("conv1d", "kernel size", F.conv1d, lm.randn({ 2, 4, 2 }), w)
      H.assert_error_like("conv1d", "stride", F.conv1d, x, w, nil, { stride = { 1, 1 } })
      H.assert_error_like("conv1d", "padding", F.conv1d, x, w, nil, { padding = -1 })
      H.assert_error_like("conv1d", "bias", F.conv1d, x, w, lm.randn({ 5 }))
      H.assert_error_like("conv1d", "dtype", F.conv1d, x, w:double())
      H.assert_error_like("conv1d", "unknown option", F.conv1d, x, w, nil, { strid = 1 })
   end)
end)

---------------------------------------------------------------------------------------------
local POOLS = {
   { "max_pool1d", function(x, o)
      local oo = {}
      for k, v in pairs(o) do oo[k] = v end
      return F.max_pool1d(x, oo)
   end },
   { "avg_pool1d", function(x, o) return F.avg_pool1d(x, o) end },
   { "adaptive_avg_pool1d", function(x, o) return F.adaptive_avg_pool1d(x, o.output_size) end },
   { "adaptive_max_pool1d", function(x, o) return F.adaptive_max_pool1d(x, o.output_size) end },
}

for _, p in ipairs(POOLS) do
   local name, fn = p[1], p[2]
   describe("F." .. name, function()
      for _, c in ipairs(FIX[name]) do
         for _, dt in ipairs(DTYPES) do
            for _, l in ipairs({ "c", "p" }) do
               it(("%s %s %s"):format(c.name, tostring(dt[1]), l), function()
                  local x = fx(c.x, dt[1], l, true)
                  local out, idx = fn(x, c.opts)
                  close(out, c.out.data, dt[2], "output")
                  local st = c.strides[l]
                  assert_strides(out, st.out, "output")
                  if c.idx then
                     H.assert_values(idx, plus1(c.idx), "indices (1-based)")
                     assert_strides(idx, st.idx, "indices")
                  end
                  out:backward(fx(c.gout, dt[1]))
                  close(x.grad, c.gx.data, dt[2], "grad input")
                  assert_strides(x.grad, st.gx, "grad input")
               end)
            end
         end
      end

      it("gradcheck (float64), both layouts", function()
         for _, l in ipairs({ "c", "p" }) do
            local x = G.input({ 2, 3, 9 }, nil, 5)
            if l == "p" then x = x:detach():permute(1, 3, 2):contiguous():permute(1, 3, 2)
               :requires_grad_(true) end
            local o = name:match("adaptive") and { output_size = 4 } or
                      { kernel_size = 3, stride = 2, padding = 1, ceil_mode = true }
            G.check(function(a) return (fn(a, o)) end, { x })
         end
      end)
   end)
end

describe("1-D pool errors", function()
   local x = lm.randn({ 2, 3, 6 })
   it("are lumen.<fn> errors", function()
      H.assert_error_like("max_pool1d", "2-D", F.max_pool1d, lm.randn({ 2, 3, 4, 4 }), 2)
      H.assert_error_like("max_pool1d", "kernel_size", F.max_pool1d, x, {})
      H.assert_error_like("max_pool1d", "kernel_size", F.max_pool1d, x, 0)
      H.assert_error_like("max_pool1d", "half", F.max_pool1d, x, { kernel_size = 2,
                          padding = 2 })
      H.assert_error_like("max_pool1d", "too small", F.max_pool1d, x, 7)
      H.assert_error_like("max_pool1d", "{n}", F.max_pool1d, x, { kernel_size = { 2, 2 } })
      H.assert_error_like("avg_pool1d", "stride", F.avg_pool1d, x, { kernel_size = 2,
                          stride = 0 })
      H.assert_error_like("avg_pool1d", "unknown option", F.avg_pool1d, x, { kernel_size = 2,
                          divisor_override = 2 })
      H.assert_error_like("avg_pool1d", "floating", F.avg_pool1d, x:long(), 2)
      H.assert_error_like("adaptive_avg_pool1d", "output_size", F.adaptive_avg_pool1d, x)
      H.assert_error_like("adaptive_avg_pool1d", "non-negative", F.adaptive_avg_pool1d, x, -1)
      H.assert_error_like("adaptive_max_pool1d", "3-D", F.adaptive_max_pool1d, lm.randn({ 3 }),
                          2)
   end)
end)

---------------------------------------------------------------------------------------------
describe("F.batch_norm on 2-D to 5-D input", function()
   for _, c in ipairs(FIX.batch_norm) do
      for _, dt in ipairs(DTYPES) do
         for _, l in ipairs({ "c", "p" }) do
            it(("%s %s %s"):format(c.name, tostring(dt[1]), l), function()
               local x = fx(c.x, dt[1], l, true)
               local w, b = fx(c.weight, dt[1], "c", true), fx(c.bias, dt[1], "c", true)
               local rm, rv = fx(c.running_mean, dt[1]), fx(c.running_var, dt[1])
               local out = F.batch_norm(x, rm, rv, w, b, { training = c.training,
                                        momentum = 0.2, eps = 1e-4 })
               local tol = dt[2] * 10
               close(out, c.out.data, tol, "output")
               close(rm, c.new_mean.data, tol, "running_mean")
               close(rv, c.new_var.data, tol, "running_var")
               assert_strides(out, c.strides[l].out, "output")
               out:backward(fx(c.gout, dt[1]))
               close(x.grad, c.gx.data, tol, "grad input")
               close(w.grad, c.gw.data, tol, "grad weight")
               close(b.grad, c.gb.data, tol, "grad bias")
               assert_strides(x.grad, c.strides[l].gx, "grad input")
            end)
         end
      end
   end

   it("gradcheck (float64) on 2-D, 3-D and channels_last_3d 5-D input", function()
      for _, s in ipairs({ { 5, 3 }, { 2, 3, 4 }, { 2, 3, 2, 2, 3 } }) do
         local x = G.input(s, #s == 5 and lm.channels_last_3d or nil, 7)
         local w, b = G.input({ 3 }, nil, 8), G.input({ 3 }, nil, 9)
         G.check(function(a, ww, bb)
            return F.batch_norm(a, nil, nil, ww, bb, { training = true })
         end, { x, w, b })
      end
   end)

   it("fuses residual and relu on 3-D and 5-D input as the separate ops", function()
      for _, s in ipairs({ { 2, 3, 5 }, { 2, 3, 2, 3, 4 } }) do
         local x, r = lm.randn(s), lm.randn(s)
         local rm, rv = lm.zeros({ 3 }), lm.ones({ 3 })
         local fused = F.batch_norm(x, rm, rv, nil, nil, { residual = r, relu = true })
         local sep = (F.batch_norm(x, rm, rv) + r):relu()
         close(fused, sep, 1e-6)
      end
   end)
end)

---------------------------------------------------------------------------------------------
describe("1-D modules and BatchNorm1d / BatchNorm3d", function()
   it("Conv1d: PyTorch's parameters, init bounds, state_dict keys, tostring", function()
      local m = nn.Conv1d(4, 6, 3, { padding = 1, groups = 2 })
      H.assert_sizes(m.weight, { 6, 2, 3 })
      H.assert_sizes(m.bias, { 6 })
      local keys = {}
      for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
      table.sort(keys)
      assert.same({ "bias", "weight" }, keys)
      -- kaiming_uniform(a = sqrt(5)) and the bias: both bounded by 1 / sqrt(fan_in)
      local bound = 1 / math.sqrt(2 * 3)
      assert(m.weight:abs():max():item() <= bound + 1e-6)
      assert(m.bias:abs():max():item() <= bound + 1e-6)
      assert.equal("Conv1d(4, 6, kernel_size=(3,), stride=(1,), padding=(1,), groups=2)",
                   tostring(m))
      assert.equal("Conv1d(3, 5, kernel_size=(2,), stride=(2,), dilation=(3,), bias=False)",
                   tostring(nn.Conv1d(3, 5, 2, { stride = 2, dilation = 3, bias = false })))
      assert.equal("Conv1d(3, 5, kernel_size=(3,), stride=(1,), padding=same)",
                   tostring(nn.Conv1d(3, 5, 3, { padding = "same" })))
      local x = lm.randn({ 2, 4, 9 })
      close(m(x), F.conv1d(x, m.weight, m.bias, { padding = 1, groups = 2 }), 1e-6)
      H.assert_error_like("Conv1d", "divisible", nn.Conv1d, 3, 6, 3, { groups = 2 })
      H.assert_error_like("Conv1d", "strided", nn.Conv1d, 3, 6, 3, { padding = "same",
                          stride = 2 })
      H.assert_error_like("Conv1d", "kernel_size", nn.Conv1d, 3, 6, { 3, 3 })
   end)

   it("pool modules: forward, tostring", function()
      local x = lm.randn({ 2, 3, 10 })
      close(nn.MaxPool1d(3, 2, 1)(x), F.max_pool1d(x, { kernel_size = 3, stride = 2,
            padding = 1 }), 0)
      assert.equal("MaxPool1d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)",
                   tostring(nn.MaxPool1d(3, 2, 1)))
      local v, i = nn.MaxPool1d({ kernel_size = 2, return_indices = true })(x)
      H.assert_sizes(i, { 2, 3, 5 })
      close(v, F.max_pool1d(x, 2), 0)
      close(nn.AvgPool1d(3, 1, 1, true, false)(x), F.avg_pool1d(x, { kernel_size = 3,
            stride = 1, padding = 1, ceil_mode = true, count_include_pad = false }), 0)
      assert.equal("AvgPool1d(kernel_size=(3,), stride=(3,), padding=(0,))",
                   tostring(nn.AvgPool1d(3)))
      close(nn.AdaptiveAvgPool1d(4)(x), F.adaptive_avg_pool1d(x, 4), 0)
      assert.equal("AdaptiveAvgPool1d(output_size=4)", tostring(nn.AdaptiveAvgPool1d(4)))
      close(nn.AdaptiveMaxPool1d(4)(x), (F.adaptive_max_pool1d(x, 4)), 0)
      H.assert_error_like("MaxPool1d", "kernel_size", nn.MaxPool1d)
      H.assert_error_like("AdaptiveAvgPool1d", "output_size", nn.AdaptiveAvgPool1d)
   end)

   it("BatchNorm1d takes 2-D or 3-D input, BatchNorm3d 5-D, with PyTorch's keys", function()
      for _, cls in ipairs({ "BatchNorm1d", "BatchNorm3d" }) do
         local m = nn[cls](4)
         local keys = {}
         for k in pairs(m:state_dict()) do keys[#keys + 1] = k end
         table.sort(keys)
         assert.same({ "bias", "num_batches_tracked", "running_mean", "running_var", "weight" },
                     keys)
         assert.equal(cls .. "(4, eps=1e-05, momentum=0.1, affine=True, " ..
                      "track_running_stats=True)", tostring(m))
      end
      local b1 = nn.BatchNorm1d(4)
      for _, s in ipairs({ { 5, 4 }, { 3, 4, 6 } }) do
         local x = lm.randn(s)
         local y = b1(x)
         close(y, F.batch_norm(x, nil, nil, nil, nil, { training = true }), 1e-5)
      end
      assert.equal(2, b1.num_batches_tracked:item())
      H.assert_error_like("BatchNorm1d", "expected 2D or 3D input (got 4D input)", b1,
                          lm.randn({ 2, 4, 3, 3 }))
      H.assert_error_like("BatchNorm1d", "expected 2D or 3D input (got 1D input)", b1,
                          lm.randn({ 4 }))
      local b3 = nn.BatchNorm3d(4)
      local x = lm.randn({ 2, 4, 3, 3, 3 }):contiguous(lm.channels_last_3d)
      local y = b3(x)
      assert(y:is_contiguous(lm.channels_last_3d))
      b3:eval()
      close(b3(x), F.batch_norm(x, b3.running_mean, b3.running_var, b3.weight, b3.bias), 1e-6)
      H.assert_error_like("BatchNorm3d", "expected 5D input (got 4D input)", b3,
                          lm.randn({ 2, 4, 3, 3 }))
      H.assert_error_like("BatchNorm2d", "expected 4D input (got 5D input)", nn.BatchNorm2d(4),
                          x)
   end)
end)

describe("conv1d's gradient layouts", function()
   it("follow the weight's layout before the leaf's .grad contract, as PyTorch 2.15's", function()
      -- PyTorch: torch.autograd.grad(conv1d(x, w), [x, w]) gives N,L,C-strided gradients for an
      -- N,k,C-strided weight and contiguous ones otherwise, whatever x's layout; x.grad then
      -- takes x's layout (the gradient layout contract)
      for _, xcl in ipairs({ false, true }) do
         for _, wcl in ipairs({ false, true }) do
            local x, w = lm.randn({ 2, 6, 9 }), lm.randn({ 4, 6, 3 })
            if xcl then x = x:transpose(2, 3):contiguous():transpose(2, 3) end
            if wcl then w = w:transpose(2, 3):contiguous():transpose(2, 3) end
            x:requires_grad_(true); w:requires_grad_(true)
            local box = {}
            local hx, hw = x * 1, w * 1
            hx:register_hook(function(g) box.x = g end)
            hw:register_hook(function(g) box.w = g end)
            local y = F.conv1d(hx, hw, nil, { padding = 1 })
            y:backward(lm.randn(y:size()))
            local what = ("x %s, w %s"):format(tostring(xcl), tostring(wcl))
            H.assert_strides(box.x, wcl and { 54, 1, 6 } or { 54, 9, 1 }, "grad input " .. what)
            H.assert_strides(box.w, wcl and { 18, 1, 6 } or { 18, 3, 1 }, "grad weight " .. what)
            H.assert_strides(x.grad, xcl and { 54, 1, 6 } or { 54, 9, 1 }, "x.grad " .. what)
         end
      end
   end)
end)

describe("1-D operators on the meta device", function()
   it("give PyTorch's sizes and strides without data", function()
      local M = { device = "meta" }
      local x = lm.empty({ 2, 7, 4 }, M):permute(1, 3, 2):requires_grad_(true)
      local w = lm.empty({ 6, 4, 3 }, M):requires_grad_(true)
      local o = F.conv1d(x, w, nil, { padding = 1 })
      assert.equal("meta", o:device())
      H.assert_layout(o, { 2, 6, 7 }, { 42, 7, 1 }, "conv1d")
      o:backward(lm.empty(o:size(), M))
      H.assert_strides(x.grad, { 28, 1, 4 }, "grad input")
      H.assert_strides(w.grad, { 12, 3, 1 }, "grad weight")
      local p, i = F.max_pool1d(x, { kernel_size = 2, return_indices = true })
      H.assert_layout(p, { 2, 4, 3 }, { 12, 1, 4 }, "max_pool1d")
      assert.equal("meta", i:device())
      H.assert_strides(F.avg_pool1d(x, 2), { 12, 1, 4 }, "avg_pool1d")
      H.assert_strides(F.adaptive_avg_pool1d(x, 3), { 12, 1, 4 }, "adaptive_avg_pool1d")
      H.assert_strides(nn.BatchNorm1d(4, M)(x), { 28, 7, 1 }, "BatchNorm1d")
      local y = nn.BatchNorm3d(4, M)(lm.empty({ 2, 4, 3, 3, 3 }, M):contiguous(lm.channels_last_3d))
      assert(y:is_contiguous(lm.channels_last_3d))
   end)
end)
