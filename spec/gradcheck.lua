-- spec/gradcheck.lua -- finite-difference gradient checks for lumen's autograd (float64).
--
--    local gradcheck = require("spec.gradcheck")
--    gradcheck.check(function(x, w) return lm.F.conv2d(x, w) end, { x, w })
--
-- fn(...) gets `inputs` (tensors, plus any non-tensor values passed through) and returns a
-- tensor. Each tensor input that requires grad is checked: the analytical gradient of
-- L = sum(fn(...) * g) for a fixed random g (from out:backward(g)) against central differences
-- (L(x + eps) - L(x - eps)) / (2 eps), element by element. Inputs should be float64 and small.

local ffi = require("ffi")
local lm = require("lumen")
local C = require("lumen.C")

local G = {}

local idx = ffi.new("int64_t[8]")
local val = ffi.new("double[1]")

-- visit every logical index of c (a cdata lm_tensor*), calling f() with idx filled
local function each_index(c, f)
   local nd = c.ndim
   local n = tonumber(c.numel)
   for i = 0, nd - 1 do idx[i] = 0 end
   for _ = 1, n do
      f()
      local d = nd - 1
      while d >= 0 do
         idx[d] = idx[d] + 1
         if idx[d] < c.sizes[d] then break end
         idx[d] = 0
         d = d - 1
      end
   end
end

local function get(c)
   assert(C.lm_get(c, idx, val) == 0, ffi.string(C.lm_last_error()))
   return val[0]
end

local function set(c, v)
   assert(C.lm_set(c, idx, v) == 0, ffi.string(C.lm_last_error()))
end

local function first(x, ...) return x end

-- L(inputs) = sum(fn(inputs) * g), no graph
local function loss(fn, inputs, g)
   return lm.no_grad(function()
      local out = first(fn(unpack(inputs)))
      return (out:double() * g):sum():item()
   end)
end

-- check(fn, inputs, {eps=1e-6, atol=1e-5, rtol=1e-3, seed=0}) -> true, or raises with details
function G.check(fn, inputs, opts)
   opts = opts or {}
   local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
   lm.manual_seed(opts.seed or 0)
   for _, x in ipairs(inputs) do
      if lm.is_tensor(x) then x.grad = nil end
   end
   local out = first(fn(unpack(inputs)))
   assert(lm.is_tensor(out), "gradcheck: fn must return a tensor")
   assert(out.requires_grad, "gradcheck: the output does not require grad")
   local g = lm.randn(out:size(), { dtype = lm.float64 })
   out:backward(g:to(out:dtype()))
   for k, x in ipairs(inputs) do
      if lm.is_tensor(x) and x.requires_grad then
         local analytic = x.grad
         assert(analytic ~= nil, ("gradcheck: input %d got no gradient"):format(k))
         local xc, ac = x._c, analytic._c
         local worst, where = 0, nil
         each_index(xc, function()
            local orig = get(xc)
            set(xc, orig + eps)
            local lp = loss(fn, inputs, g)
            set(xc, orig - eps)
            local lmn = loss(fn, inputs, g)
            set(xc, orig)
            local num = (lp - lmn) / (2 * eps)
            local ana = get(ac)
            local err = math.abs(num - ana)
            if err > atol + rtol * math.abs(num) and err > worst then
               worst = err
               local s = {}
               for i = 0, xc.ndim - 1 do s[#s + 1] = tostring(tonumber(idx[i]) + 1) end
               where = ("input %d at (%s): numerical %.10g, analytical %.10g"):format(k,
                  table.concat(s, ","), num, ana)
            end
         end)
         if where then error("gradcheck failed: " .. where, 2) end
      end
   end
   return true
end

-- a float64 tensor of the given sizes in format fmt with values from randn (seeded), requiring
-- grad
function G.input(sizes, fmt, seed, scale)
   lm.manual_seed(seed or 1)
   local t = lm.randn(sizes, { dtype = lm.float64 })
   if scale then t = t * scale end
   if fmt and tostring(fmt) ~= "contiguous_format" then t = t:to(fmt) else t = t:contiguous() end
   return t:detach():requires_grad_(true)
end

-- a fixture tensor {sizes=, data=} as a tensor of dtype (float64 default) in format fmt (only
-- applied to 4-D tensors), a fresh leaf; requires_grad when rg is true
function G.tensor(d, dtype, fmt, rg)
   local t = lm.tensor(d.data, { dtype = dtype or lm.float64 })
   t = t:view(d.sizes)
   if fmt and #d.sizes == 4 then t = t:to(fmt) end
   t = t:detach()
   if rg then t:requires_grad_(true) end
   return t
end

-- loads spec/fixtures/nn/<name>.lua
function G.fixture(name)
   return assert(loadfile("spec/fixtures/nn/" .. name .. ".lua"))()
end

-- H.assert_close for tensors or (nested) tables
function G.close(t, expected, tol, what)
   local H = require("spec.helpers")
   if lm.is_tensor(expected) then expected = H.values(expected) end
   H.assert_close(lm.is_tensor(t) and H.values(t) or t, expected, tol, what)
end

return G
