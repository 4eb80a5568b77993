-- Fused kernels: batch_norm with {relu=, residual=} (and the automatic fusion of an in-place
-- relu_ after batch_norm) against the same computation done op by op; the single-pass optimizer
-- steps against the generic path (a strided parameter forces the generic elementwise path).
local lm = require("lumen")
local F = lm.F

local function maxdiff(a, b)
   if a == nil and b == nil then return 0 end
   return (a - b):abs():max():item()
end

local function close(tag, a, b, tol)
   if a == nil and b == nil then return end
   assert.is_not_nil(a, tag)
   assert.is_not_nil(b, tag)
   local d = maxdiff(a, b)
   local scale = math.max(1, b:abs():max():item())
   assert.is_true(d <= tol * scale, tag .. ": max difference " .. d)
end

describe("fused batch_norm", function()
   local shapes = { { 4, 16, 5, 7 }, { 3, 17, 4, 4 }, { 2, 3, 5, 5 }, { 8, 64, 7, 7 } }
   -- 1: batch_norm then relu_ (fused by autograd), 2: {relu}, 3: {residual, relu}, 4: {residual}
   local modes = { "bn+relu_", "relu", "residual+relu", "residual" }
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         for _, training in ipairs({ true, false }) do
            for mode = 1, 4 do
               local name = string.format("%s %s training=%s %s", tostring(dt), tostring(fmt),
                                          tostring(training), modes[mode])
               it(name .. ": values, gradients, running stats and formats", function()
                  lm.manual_seed(3)
                  local tol = dt == lm.float32 and 2e-5 or 1e-10
                  for _, sz in ipairs(shapes) do
                     local function mk() return lm.randn(sz, { dtype = dt }):contiguous(fmt) end
                     local x0, r0, g = mk(), mk(), mk()
                     local C = sz[2]
                     local w0, b0 = lm.randn({ C }, { dtype = dt }), lm.randn({ C }, { dtype = dt })
                     local function run(fused)
                        local x = x0:clone():requires_grad_()
                        local r = r0:clone():requires_grad_()
                        local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
                        local rm = lm.zeros({ C }, { dtype = dt })
                        local rv = lm.ones({ C }, { dtype = dt })
                        local opts = { training = training }
                        local y
                        if fused then
                           if mode == 1 then
                              y = F.batch_norm(x, rm, rv, w, b, opts):relu_()
                           else
                              opts.relu = mode ~= 4
                              if mode >= 3 then opts.residual = r end
                              y = F.batch_norm(x, rm, rv, w, b, opts)
                           end
                        else
                           local t = F.batch_norm(x, rm, rv, w, b, opts) * 1 -- no fusion
                           if mode >= 3 then t = t + r end
                           if mode ~= 4 then t = t:relu() end
                           y = t
                        end
                        y:backward(g)
                        return { y, x.grad, w.grad, b.grad, mode >= 3 and r.grad or nil, rm, rv }
                     end
                     local a, e = run(true), run(false)
                     local what = { "output", "grad x", "grad weight", "grad bias", "grad residual",
                                    "running_mean", "running_var" }
                     local shape = table.concat(sz, "x")
                     for i = 1, 7 do close(shape .. " " .. what[i], a[i], e[i], tol) end
                     assert.is_true(a[1]:is_contiguous(fmt), "output format")
                     assert.is_true(a[2]:is_contiguous(fmt), "grad x format")
                  end
               end)
            end
         end
      end
   end

   it("falls back to separate ops for a broadcast residual", function()
      local x = lm.randn({ 4, 8, 3, 3 }):requires_grad_()
      local r = lm.randn({ 8, 1, 1 }):requires_grad_()
      local y = F.batch_norm(x, nil, nil, nil, nil, { training = true, residual = r, relu = true })
      local ref = (F.batch_norm(x, nil, nil, nil, nil, { training = true }) + r):relu()
      close("broadcast residual", y, ref, 1e-6)
      y:sum():backward()
      assert.are.same({ 8, 1, 1 }, r.grad:size())
   end)

   it("works without recording (no_grad)", function()
      lm.no_grad(function()
         local x = lm.randn({ 4, 8, 3, 3 })
         local y = F.batch_norm(x, nil, nil, nil, nil,
                                { training = true, residual = x, relu = true })
         assert.is_true(y:min():item() >= 0)
      end)
   end)
end)

describe("fused optimizer steps", function()
   local cases = {
      { "SGD", { lr = 0.1 } }, { "SGD", { lr = 0.1, momentum = 0.9 } },
      { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 5e-4 } },
      { "SGD", { lr = 0.1, momentum = 0.9, dampening = 0.3, weight_decay = 1e-2,
                 maximize = true } },
      { "Adam", { lr = 1e-2 } }, { "Adam", { lr = 1e-2, weight_decay = 0.1, amsgrad = true } },
      { "Adam", { lr = 1e-2, maximize = true } },
      { "AdamW", { lr = 1e-2 } }, { "AdamW", { lr = 1e-2, amsgrad = true, maximize = true } },
   }
   for _, dt in ipairs({ lm.float32, lm.float64 }) do
      for _, c in ipairs(cases) do
         local opts = {}
         for k, v in pairs(c[2]) do opts[#opts + 1] = k .. "=" .. tostring(v) end
         table.sort(opts)
         it(string.format("%s %s {%s}: fused == generic", tostring(dt), c[1],
                          table.concat(opts, ", ")), function()
            lm.manual_seed(0)
            local n = 37
            local v = lm.randn({ n }, { dtype = dt })
            local p1 = v:clone():requires_grad_()            -- dense: the fused kernel
            local p2 = lm.zeros({ n, 2 }, { dtype = dt }):select(2, 1) -- strided: generic ops
            p2:copy_(v)
            p2:requires_grad_()
            local o1, o2 = lm.optim[c[1]]({ p1 }, c[2]), lm.optim[c[1]]({ p2 }, c[2])
            for _ = 1, 6 do
               local g = lm.randn({ n }, { dtype = dt })
               p1.grad, p2.grad = g:clone(), g:clone()
               o1:step()
               o2:step()
            end
            local d = (p1 - p2):abs():max():item()
            assert.is_true(d <= (dt == lm.float32 and 1e-6 or 1e-14), "difference " .. d)
         end)
      end
   end
end)
