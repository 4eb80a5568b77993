-- luacheck: max line length 120
-- spec/cuda_reduce_spec.lua -- the CUDA kernels of kernels/cuda/reduce.cu (sum, mean, prod,
-- max/min with indices, argmax/argmin, cat), random.cu (the random fills: the CPU's values for the
-- same seed), softmax.cu (softmax / log_softmax, nll_loss / cross_entropy, forward and backward)
-- and optim.cu (the fused SGD / Adam steps), each on cuda:0 against the CPU: random shapes, both
-- memory formats, strided inputs, every dtype the CPU op takes, gradients through autograd, the
-- output's layout, and bad input. Skipped where no CUDA device is available; the emulated build
-- (make test-cuda-emu) runs it on the host.

local H = require("spec.helpers")
local lm = H.lm
local F = lm.nn.functional
local CL = lm.channels_last
local DEV = "cuda:0"

local function cpu(sizes, dtype, fmt)
   local t = lm.randn(sizes, { device = "cpu", dtype = lm.float32 })
   if fmt then t = t:contiguous(fmt) end
   if dtype and dtype ~= lm.float32 then t = t:to(dtype) end
   return t
end

-- a (CPU) integer tensor with values in [lo, hi)
local function cpu_int(sizes, dtype, lo, hi)
   return lm.randint(lo, hi, sizes, { device = "cpu", dtype = dtype })
end

-- g (on the device) against e (on the CPU): dtype, sizes, strides and values
local function same(g, e, tol, what)
   assert.equal("cuda:0", g:device(), what)
   local gc = g:cpu()
   assert.equal(tostring(e:dtype()), tostring(gc:dtype()), (what or "") .. ": dtype")
   H.assert_layout(gc, e:size(), e:stride(), what)
   local dt = e:dtype()
   local float = dt == lm.float32 or dt == lm.float64 or dt == lm.float16 or dt == lm.bfloat16
   -- exact: assert_values for integers and bools, assert_close with 0 for floats (NaN == NaN)
   if tol == 0 and not float then H.assert_values(gc, H.values(e), what)
   else H.assert_close(gc, H.values(e), tol, what) end
end

local function tol_of(dt)
   if dt == lm.float16 or dt == lm.bfloat16 then return 1e-2 end
   if dt == lm.float32 then return 1e-5 end
   if dt == lm.float64 then return 1e-12 end
   return 0
end

describe("cuda reductions against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local dim_sets = { {}, { 1 }, { 2 }, { 4 }, { 2, 3 }, { 1, 3, 4 }, { 1, 2, 3, 4 } }

   it("sum, mean, prod, amax, amin over dim sets, keepdim, both formats, float dtypes", function()
      lm.manual_seed(11)
      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ lm.contiguous_format, CL }) do
            local x = cpu({ 3, 5, 4, 7 }, dt, fmt)
            local xg = x:to(DEV)
            for _, dims in ipairs(dim_sets) do
               for _, keep in ipairs({ false, true }) do
                  local d = #dims > 0 and dims or nil
                  local what = tostring(dt) .. " " .. tostring(fmt) .. " dims {" ..
                     table.concat(dims, ",") .. "} keep " .. tostring(keep)
                  if d or not keep then
                     same(xg:sum(d, keep), x:sum(d, keep), tol_of(dt), "sum " .. what)
                     same(xg:mean(d, keep), x:mean(d, keep), tol_of(dt), "mean " .. what)
                     same(xg:amax(d, keep), x:amax(d, keep), 0, "amax " .. what)
                     same(xg:amin(d, keep), x:amin(d, keep), 0, "amin " .. what)
                  end
               end
            end
            local small = (x * 0.1 + 1):to(dt)
            same(small:to(DEV):prod(2), small:prod(2), tol_of(dt), "prod " .. tostring(dt))
            same(small:to(DEV):prod(), small:prod(), tol_of(dt), "prod all " .. tostring(dt))
         end
      end
   end)

   it("integer and bool inputs: exact sums, products, max/min, argmax", function()
      lm.manual_seed(12)
      for _, dt in ipairs({ lm.int64, lm.int32, lm.uint8 }) do
         local x = cpu_int({ 4, 6, 5 }, dt, 0, 7)
         local xg = x:to(DEV)
         for _, dims in ipairs({ {}, { 1 }, { 2, 3 }, { 3 } }) do
            local d = #dims > 0 and dims or nil
            local what = tostring(dt) .. " {" .. table.concat(dims, ",") .. "}"
            same(xg:sum(d), x:sum(d), 0, "sum " .. what)
            same(xg:prod(d), x:prod(d), 0, "prod " .. what)
            same(xg:amax(d), x:amax(d), 0, "amax " .. what)
            same(xg:amin(d), x:amin(d), 0, "amin " .. what)
         end
         same(xg:argmax(2), x:argmax(2), 0, "argmax " .. tostring(dt))
         same(xg:argmin(), x:argmin(), 0, "argmin all " .. tostring(dt))
      end
      -- int64 sums stay exact beyond 2^53 (no detour through double)
      local big = lm.tensor({ 2 ^ 53, 1, 1, 3 }, { dtype = lm.int64, device = "cpu" })
      same(big:to(DEV):sum(), big:sum(), 0, "int64 above 2^53")
      local b = lm.tensor({ { true, false, true }, { true, true, true } }, { dtype = lm.bool, device = "cpu" })
      same(b:to(DEV):sum(2), b:sum(2), 0, "bool sum")
      same(b:to(DEV):amax(1), b:amax(1), 0, "bool amax")
   end)

   it("result dtype casting (dtype=) as the CPU", function()
      local x = cpu({ 5, 9 })
      same(x:to(DEV):sum(2, false, lm.float64), x:sum(2, false, lm.float64), 1e-12, "f32 -> f64")
      same(x:to(DEV):sum(nil, false, lm.float16), x:sum(nil, false, lm.float16), 1e-2, "f32 -> f16")
      same(x:to(DEV):mean(1, true, lm.float64), x:mean(1, true, lm.float64), 1e-12, "mean f64")
      local i = cpu_int({ 5, 9 }, lm.int32, -50, 50)
      same(i:to(DEV):sum(2, false, lm.float32), i:sum(2, false, lm.float32), 1e-6, "i32 -> f32")
      same(i:to(DEV):sum(1, false, lm.int32), i:sum(1, false, lm.int32), 0, "i32 -> i32")
      same(x:to(DEV):sum(2, false, lm.int64), x:sum(2, false, lm.int64), 0, "f32 -> i64")
   end)

   it("max / min with indices and argmax: ties go to the first, NaN wins", function()
      local nan = 0 / 0
      local rows = {
         { 1, 3, 3, 2, 0 }, { nan, 1, nan, 5, 5 }, { 2, 2, 2, 2, 2 }, { -1, 4, nan, 4, -7 },
         { -math.huge, -math.huge, -3, -3, -math.huge },
      }
      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         local x = lm.tensor(rows, { dtype = dt, device = "cpu" })
         local xg = x:to(DEV)
         for _, dim in ipairs({ 1, 2 }) do
            local v, i = x:max(dim)
            local vg, ig = xg:max(dim)
            same(vg, v, 0, "max values " .. tostring(dt) .. " dim " .. dim)
            same(ig, i, 0, "max indices " .. tostring(dt) .. " dim " .. dim)
            v, i = x:min(dim, true)
            vg, ig = xg:min(dim, true)
            same(vg, v, 0, "min values keepdim")
            same(ig, i, 0, "min indices keepdim")
            same(xg:argmax(dim), x:argmax(dim), 0, "argmax dim " .. dim)
            same(xg:argmin(dim), x:argmin(dim), 0, "argmin dim " .. dim)
         end
         same(xg:argmax(), x:argmax(), 0, "argmax all")
         same(xg:argmin(), x:argmin(), 0, "argmin all")
         same(xg:amax(2), x:amax(2), 0, "amax NaN")
         same(xg:sum(2), x:sum(2), tol_of(dt), "sum with NaN and inf")
      end
      -- ties over a channels_last input still go to the first in logical order
      local t = lm.zeros({ 2, 3, 2, 2 }, { device = "cpu" }):contiguous(CL)
      local _, i = t:max(2)
      local _, ig = t:to(DEV):max(2)
      same(ig, i, 0, "ties, channels_last")
      same(t:to(DEV):argmax(), t:argmax(), 0, "argmax all ties, channels_last")
   end)

   it("strided and non-dense inputs, large ResNet-like cases", function()
      lm.manual_seed(13)
      local x = cpu({ 6, 8, 10 })
      local views = {
         x:transpose(1, 3), x:narrow(2, 2, 5), x:select(3, 4), x:permute(2, 3, 1):narrow(1, 1, 3),
      }
      for k, v in ipairs(views) do
         local vg = x:to(DEV)
         if k == 1 then vg = vg:transpose(1, 3)
         elseif k == 2 then vg = vg:narrow(2, 2, 5)
         elseif k == 3 then vg = vg:select(3, 4)
         else vg = vg:permute(2, 3, 1):narrow(1, 1, 3) end
         for _, dims in ipairs({ {}, { 1 }, { 2 } }) do
            local d = #dims > 0 and dims or nil
            same(vg:sum(d), v:sum(d), 1e-5, "view " .. k .. " sum")
            same(vg:amax(d), v:amax(d), 0, "view " .. k .. " amax")
         end
         local val, idx = v:max(1)
         local valg, idxg = vg:max(1)
         same(valg, val, 0, "view " .. k .. " max")
         same(idxg, idx, 0, "view " .. k .. " max indices")
      end
      -- per-channel sums of an NHWC activation (batch norm's statistics) and a full sum
      local a = cpu({ 8, 64, 28, 28 }, lm.float32, CL)
      local ag = a:to(DEV)
      same(ag:sum({ 1, 3, 4 }), a:sum({ 1, 3, 4 }), 1e-5, "NHWC per-channel sum")
      same(ag:mean({ 1, 3, 4 }, true), a:mean({ 1, 3, 4 }, true), 1e-5, "NHWC per-channel mean")
      same(ag:sum(), a:sum(), 1e-5, "full sum")
      same(ag:amax(), a:amax(), 0, "full amax")
      same(ag:argmax(), a:argmax(), 0, "full argmax")
      same(ag:sum({ 3, 4 }), a:sum({ 3, 4 }), 1e-5, "NHWC spatial sum")
      -- the same statistics of the NCHW tensor: N and H*W do not merge (two reduced dims)
      local an, ang = a:contiguous(), ag:contiguous()
      same(ang:sum({ 1, 3, 4 }), an:sum({ 1, 3, 4 }), 1e-5, "NCHW per-channel sum")
      local v1, i1 = an:view(8, 64, -1):max(3)
      local v1g, i1g = ang:view(8, 64, -1):max(3)
      same(v1g, v1, 0, "NCHW spatial max")
      same(i1g, i1, 0, "NCHW spatial max indices")
      local h = a:to(lm.float16)
      same(h:to(DEV):sum(), h:sum(), 1e-2, "full float16 sum")
      same(h:to(DEV):sum({ 1, 3, 4 }), h:sum({ 1, 3, 4 }), 1e-2, "NHWC float16 per-channel sum")
      local ii = cpu_int({ 3, 100, 700 }, lm.int64, -1000, 1000)
      same(ii:to(DEV):sum(), ii:sum(), 0, "full int64 sum")
      same(ii:to(DEV):sum({ 1, 3 }), ii:sum({ 1, 3 }), 0, "int64 sum over two dims")
      same(ii:to(DEV):argmin(), ii:argmin(), 0, "full int64 argmin")
      local r = cpu({ 300, 2000 })
      same(r:to(DEV):sum(2), r:sum(2), 1e-5, "row sums")
      same(r:to(DEV):sum(1), r:sum(1), 1e-5, "column sums")
      local v, i = r:max(2)
      local vg, ig = r:to(DEV):max(2)
      same(vg, v, 0, "row max")
      same(ig, i, 0, "row max indices")
   end)

   it("empty reductions and errors", function()
      local e = lm.zeros({ 0, 3 }, { device = "cpu" })
      same(e:to(DEV):sum(1), e:sum(1), 0, "sum over an empty dim")
      same(e:to(DEV):mean(1), e:mean(1), 0, "mean over an empty dim (NaN)")
      same(e:to(DEV):prod(1), e:prod(1), 0, "prod over an empty dim")
      same(e:to(DEV):sum(2), e:sum(2), 0, "no outputs")
      H.assert_error("max", function() return lm.zeros({ 0, 3 }, { device = DEV }):max(1) end)
      H.assert_error("argmax", function()
         return lm.tensor({ true }, { dtype = lm.bool, device = DEV }):argmax()
      end)
      H.assert_error("mean", function()
         return lm.tensor({ 1, 2 }, { dtype = lm.int64, device = DEV }):mean()
      end)
   end)

   it("gradients of sum, mean, amax through autograd", function()
      local x = cpu({ 4, 6, 3, 5 }, lm.float32, CL)
      local xc = x:clone():requires_grad_(true)
      local xg = x:to(DEV):requires_grad_(true)
      xc:sum({ 1, 3, 4 }):sum():backward()
      xg:sum({ 1, 3, 4 }):sum():backward()
      same(xg.grad, xc.grad, 1e-6, "sum grad")
      xc.grad, xg.grad = nil, nil
      local w = cpu({ 4, 3 })
      ;((xc:mean({ 2, 4 })) * w):sum():backward()
      ;((xg:mean({ 2, 4 })) * w:to(DEV)):sum():backward()
      same(xg.grad, xc.grad, 1e-6, "mean grad")
   end)
end)

describe("cuda cat against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   it("formats, dims, dtype promotion, strided inputs", function()
      lm.manual_seed(21)
      for _, fmt in ipairs({ lm.contiguous_format, CL }) do
         for dim = 1, 4 do
            local sz1, sz2 = { 2, 3, 4, 5 }, { 2, 3, 4, 5 }
            sz2[dim] = 3
            local a, b = cpu(sz1, lm.float32, fmt), cpu(sz2, lm.float32, fmt)
            same(lm.cat({ a:to(DEV), b:to(DEV) }, dim), lm.cat({ a, b }, dim), 0,
               tostring(fmt) .. " dim " .. dim)
         end
      end
      -- mixed formats (the result is contiguous), dtypes (promoted), views
      local a, b = cpu({ 2, 3, 4, 5 }, lm.float32, CL), cpu({ 2, 3, 4, 5 }, lm.float64)
      same(lm.cat({ a:to(DEV), b:to(DEV) }, 2), lm.cat({ a, b }, 2), 0, "mixed")
      local i = cpu_int({ 2, 3, 4, 5 }, lm.int32, -9, 9)
      same(lm.cat({ i:to(DEV), a:to(DEV), i:to(DEV) }, 1), lm.cat({ i, a, i }, 1), 0, "int32 + f32")
      local h = cpu({ 2, 3, 4, 5 }, lm.float16)
      same(lm.cat({ h:to(DEV), a:to(DEV) }, 4), lm.cat({ h, a }, 4), 0, "f16 + f32")
      local x = cpu({ 5, 6 })
      same(lm.cat({ x:to(DEV):t(), x:to(DEV):narrow(2, 1, 5), lm.zeros({ 0 }, { device = DEV }) }, 1),
           lm.cat({ x:t(), x:narrow(2, 1, 5), lm.zeros({ 0 }, { device = "cpu" }) }, 1), 0, "views")
      local bl = lm.tensor({ true, false }, { dtype = lm.bool, device = "cpu" })
      same(lm.cat({ bl:to(DEV), bl:to(DEV) }, 1), lm.cat({ bl, bl }, 1), 0, "bool")
   end)

   it("gradient through cat, and bad input", function()
      local a, b = cpu({ 3, 4 }), cpu({ 2, 4 })
      local ac, bc = a:clone():requires_grad_(true), b:clone():requires_grad_(true)
      local ag, bg = a:to(DEV):requires_grad_(true), b:to(DEV):requires_grad_(true)
      local w = cpu({ 5, 4 })
      ;(lm.cat({ ac, bc }, 1) * w):sum():backward()
      ;(lm.cat({ ag, bg }, 1) * w:to(DEV)):sum():backward()
      same(ag.grad, ac.grad, 0, "grad a")
      same(bg.grad, bc.grad, 0, "grad b")
      H.assert_error("cat", function()
         return lm.cat({ lm.zeros({ 2, 3 }, { device = DEV }), lm.zeros({ 2, 4 }, { device = DEV }) }, 1)
      end)
      H.assert_error("cat", function()
         return lm.cat({ lm.zeros({ 2, 3 }, { device = DEV }), lm.zeros({ 2, 3 }, { device = "cpu" }) }, 1)
      end)
   end)
end)

describe("cuda random fills give the CPU's values for the same seed", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local function both(seed, f)
      lm.manual_seed(seed)
      local c = f("cpu")
      local after_c = lm.rand({ 3 }, { device = "cpu" })
      lm.manual_seed(seed)
      local g = f(DEV)
      local after_g = lm.rand({ 3 }, { device = "cpu" })
      H.assert_values(after_g, H.values(after_c), "the generator advanced as on the CPU")
      return c, g
   end

   it("rand, randn, randint, randperm, bernoulli (dropout): identical values", function()
      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ lm.contiguous_format, CL }) do
            local c, g = both(5, function(d)
               return lm.rand({ 2, 3, 5, 4 }, { device = d, dtype = dt, memory_format = fmt })
            end)
            same(g, c, 0, "rand " .. tostring(dt) .. " " .. tostring(fmt))
            c, g = both(6, function(d)
               return lm.randn({ 2, 3, 5, 4 }, { device = d, dtype = dt, memory_format = fmt })
            end)
            same(g, c, 0, "randn " .. tostring(dt) .. " " .. tostring(fmt))
         end
      end
      for _, dt in ipairs({ lm.int64, lm.int32, lm.uint8 }) do
         local c, g = both(7, function(d) return lm.randint(0, 100, { 7, 9 }, { device = d, dtype = dt }) end)
         same(g, c, 0, "randint " .. tostring(dt))
      end
      local c, g = both(8, function(d) return lm.randperm(1000, { device = d }) end)
      same(g, c, 0, "randperm")
      c, g = both(9, function(d)
         return F.dropout(lm.ones({ 6, 50 }, { device = d }), 0.3, true)
      end)
      same(g, c, 0, "dropout (bernoulli_)")
   end)

   it("in-place fills of strided views leave the rest untouched", function()
      local c, g = both(10, function(d)
         local t = lm.zeros({ 6, 8 }, { device = d })
         lm.nn.init.uniform_(t:narrow(2, 2, 5), -2, 3)
         lm.nn.init.normal_(t:t():narrow(1, 7, 2), 1, 4)
         return t
      end)
      same(g, c, 0, "narrowed views")
      c, g = both(11, function(d)
         local t = lm.zeros({ 4, 6, 3 }, { device = d, dtype = lm.float64 }):permute(3, 1, 2)
         lm.nn.init.uniform_(t)
         return t
      end)
      same(g, c, 0, "a permuted (dense) tensor")
   end)

   it("an overlapping tensor is refused as on the CPU, the generator still in step", function()
      local msgs = {}
      local c, g = both(12, function(d)
         local t = lm.zeros({ 1, 4 }, { device = d }):expand(3, 4)
         local ok, msg = pcall(lm.nn.init.uniform_, t)
         assert.is_false(ok)
         msgs[#msgs + 1] = msg:gsub("^[^%s]+:%d+: ", "")
         return lm.zeros({ 1 }, { device = d })
      end)
      same(g, c, 0)
      assert.equal(msgs[1], msgs[2])
      assert.truthy(msgs[2]:find("uniform_: unsupported operation", 1, true), msgs[2])
   end)
end)

describe("cuda softmax, log_softmax and nll_loss against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   it("forward and backward over every dim, both formats, float dtypes", function()
      lm.manual_seed(31)
      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         for _, fmt in ipairs({ lm.contiguous_format, CL }) do
            local x = cpu({ 3, 7, 4, 5 }, dt, fmt) * 3
            local gout = cpu({ 3, 7, 4, 5 }, dt, fmt)
            for dim = 1, 4 do
               for _, fname in ipairs({ "softmax", "log_softmax" }) do
                  local what = fname .. " " .. tostring(dt) .. " " .. tostring(fmt) .. " dim " .. dim
                  local xc = x:clone():requires_grad_(true)
                  local xg = x:to(DEV):requires_grad_(true)
                  local yc, yg = F[fname](xc, dim), F[fname](xg, dim)
                  same(yg, yc, tol_of(dt), what)
                  yc:backward(gout)
                  yg:backward(gout:to(DEV))
                  same(xg.grad, xc.grad, tol_of(dt) * 10, what .. " grad")
               end
            end
         end
      end
   end)

   it("long rows (the classifier's logits) and -inf / large values", function()
      local x = cpu({ 16, 1000 }) * 20
      same(F.softmax(x:to(DEV), 2), F.softmax(x, 2), 1e-5, "softmax 1000 classes")
      same(F.log_softmax(x:to(DEV), 2), F.log_softmax(x, 2), 1e-5, "log_softmax 1000 classes")
      local m = lm.tensor({ { -math.huge, 0, 1 }, { 1e30, 1e30, -1e30 } }, { device = "cpu" })
      same(F.softmax(m:to(DEV), 2), F.softmax(m, 2), 1e-6, "infinities")
      same(F.log_softmax(m:to(DEV), 2), F.log_softmax(m, 2), 1e-6, "infinities (log)")
   end)

   it("nll_loss / cross_entropy: weights, ignore_index, reductions, 4-D, gradients", function()
      lm.manual_seed(32)
      for _, dt in ipairs({ lm.float32, lm.float64, lm.float16, lm.bfloat16 }) do
         for _, red in ipairs({ "mean", "sum", "none" }) do
            for _, case in ipairs({ { { 9, 5 }, { 9 } }, { { 3, 5, 4, 2 }, { 3, 4, 2 } }, { { 5 }, {} } }) do
               local x = cpu(case[1], dt)
               -- targets are 1-based class indices in Lua; the first one is the ignored class 3
               local t = cpu_int(case[2], lm.int64, 1, 6)
               if #case[2] > 0 then t:view(-1):narrow(1, 1, 1):fill_(3) end
               local w = cpu({ 5 }):abs() + 0.5
               for _, opts in ipairs({ { reduction = red }, { reduction = red, weight = w },
                                       { reduction = red, ignore_index = 3 },
                                       { reduction = red, weight = w, ignore_index = 3 } }) do
                  local what = tostring(dt) .. " " .. red .. " " .. #case[1] .. "-D" ..
                     (opts.weight and " weight" or "") .. (opts.ignore_index and " ignore" or "")
                  local go = {}
                  for k, v in pairs(opts) do go[k] = v end
                  if go.weight then go.weight = go.weight:to(DEV) end
                  local xc = x:clone():requires_grad_(true)
                  local xg = x:to(DEV):requires_grad_(true)
                  local lc = F.cross_entropy(xc, t, opts)
                  local lg = F.cross_entropy(xg, t:to(DEV), go)
                  same(lg, lc, tol_of(dt) * 10, what)
                  lc:sum():backward()
                  lg:sum():backward()
                  same(xg.grad, xc.grad, tol_of(dt) * 10, what .. " grad")
                  local nc = F.nll_loss(F.log_softmax(x, #case[1] == 1 and 1 or 2), t, opts)
                  local ng = F.nll_loss(F.log_softmax(x:to(DEV), #case[1] == 1 and 1 or 2), t:to(DEV), go)
                  same(ng, nc, tol_of(dt) * 10, what .. " nll_loss")
               end
            end
         end
      end
      -- a strided (transposed) input and target
      local x = cpu({ 6, 4 }):t():contiguous():t()
      local t = cpu_int({ 2, 6 }, lm.int64, 1, 5):select(1, 2)
      same(F.nll_loss(x:to(DEV), t:to(DEV)), F.nll_loss(x, t), 1e-6, "strided")
      same(F.nll_loss(x:to(DEV), t:to(DEV), { reduction = "none" }),
           F.nll_loss(x, t, { reduction = "none" }), 1e-6, "strided none")
   end)

   it("a target out of range gives the CPU's error (the first in sample order)", function()
      local x = lm.zeros({ 4, 3 }, { device = DEV })
      local t = lm.tensor({ 1, 3, 8, 0 }, { dtype = lm.int64, device = DEV })
      local msg = H.assert_error_like("nll_loss", "target 8 is out of bounds", F.nll_loss, x, t)
      local xc, tc = x:cpu(), t:cpu()
      local ok, cmsg = pcall(F.nll_loss, xc, tc)
      assert.is_false(ok)
      assert.equal((cmsg:gsub("^[^%s]+:%d+: ", "")), (msg:gsub("^[^%s]+:%d+: ", "")))
      H.assert_error_like("nll_loss", "target 0 is out of bounds", F.nll_loss, x, t, { ignore_index = 8 })
      local t2 = lm.tensor({ 1, 3, 8, 2 }, { dtype = lm.int64, device = "cpu" })
      same(F.nll_loss(x, t2:to(DEV), { ignore_index = 8 }), F.nll_loss(xc, t2, { ignore_index = 8 }),
           0, "ignored 8")
      local g = lm.zeros({ 4, 3 }, { device = DEV }):requires_grad_(true)
      H.assert_error_like("nll_loss", "out of bounds", F.cross_entropy, g, t)
   end)
end)

describe("cuda SGD and Adam steps against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end

   local configs = {
      { "SGD", { lr = 0.1 } },
      { "SGD", { lr = 0.05, momentum = 0.9, weight_decay = 1e-2 } },
      { "SGD", { lr = 0.05, momentum = 0.9, nesterov = true, dampening = 0 } },
      { "SGD", { lr = 0.05, momentum = 0.5, dampening = 0.3, maximize = true } },
      { "Adam", { lr = 1e-2 } },
      { "Adam", { lr = 1e-2, weight_decay = 0.1, amsgrad = true } },
      { "Adam", { lr = 1e-3, betas = { 0.8, 0.95 }, eps = 1e-6, maximize = true } },
      { "AdamW", { lr = 1e-2, weight_decay = 0.1 } },
   }

   it("trajectories of several steps, float32 and float64, both formats", function()
      lm.manual_seed(41)
      for _, dt in ipairs({ lm.float32, lm.float64 }) do
         for _, fmt in ipairs({ lm.contiguous_format, CL }) do
            for _, cfg in ipairs(configs) do
               if lm.optim[cfg[1]] then
                  local p0 = cpu({ 4, 3, 5, 2 }, dt, fmt)
                  local pc = p0:clone():requires_grad_(true)
                  local pg = p0:to(DEV):requires_grad_(true)
                  local oc = lm.optim[cfg[1]]({ pc }, cfg[2])
                  local og = lm.optim[cfg[1]]({ pg }, cfg[2])
                  for step = 1, 4 do
                     local g = cpu({ 4, 3, 5, 2 }, dt, fmt)
                     pc.grad = g
                     pg.grad = g:to(DEV)
                     oc:step()
                     og:step()
                     same(pg:detach(), pc:detach(), dt == lm.float32 and 1e-5 or 1e-12,
                        cfg[1] .. " " .. tostring(dt) .. " " .. tostring(fmt) .. " step " .. step)
                  end
               end
            end
         end
      end
   end)
end)
