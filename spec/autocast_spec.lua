-- spec/autocast_spec.lua -- lm.autocast (lua/lumen/autocast.lua): which op runs in which
-- precision (docs/mixed_precision.md), values and gradients against float32, the weight-cast
-- cache, nesting, no_grad, the state after an error, bad input, memory in a training loop.
--
-- Cases that need the bfloat16 kernels of conv2d, the pools and batch norm are skipped while
-- those kernels are missing (a pcall probe below): they are marked NEEDS_BF16_NN.
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local nn = lm.nn
local AC = require("lumen.autocast")

local function dt(t) return tostring(t:dtype()) end

local function probe(f)
   local ok = pcall(f)
   return ok
end
-- NEEDS_BF16_NN: bfloat16 conv2d / max_pool2d / avg_pool2d / batch_norm kernels
local HAS_BF16_CONV = probe(function()
   F.conv2d(lm.randn(1, 1, 3, 3):bfloat16(), lm.randn(1, 1, 1, 1):bfloat16())
end)
local HAS_BF16_POOL = probe(function()
   F.max_pool2d(lm.randn(1, 1, 4, 4):bfloat16(), 2)
   F.avg_pool2d(lm.randn(1, 1, 4, 4):bfloat16(), 2)
end)
local HAS_BF16_BN = probe(function()
   F.batch_norm(lm.randn(2, 3, 2, 2):bfloat16(), lm.zeros(3), lm.ones(3), lm.ones(3), lm.zeros(3),
                { training = true })
end)
local function guarded(has, name, fn)
   if has then it(name, fn) else pending(name .. " (NEEDS_BF16_NN: no bfloat16 kernel yet)") end
end

local BF = { dtype = lm.bfloat16 }

-- max |a - b| / max(|b|, tiny), both as float32
local function rel_err(a, b)
   a, b = a:float(), b:float()
   local d = (a - b):abs():max():item()
   local s = b:abs():max():item()
   return d / math.max(s, 1e-12)
end

describe("lm.autocast policy", function()
   local x, w, b
   before_each(function()
      lm.manual_seed(1)
      x = lm.randn(6, 5)
      w = lm.randn(4, 5, { requires_grad = true })
      b = lm.randn(4, { requires_grad = true })
   end)

   it("runs linear, matmul and mm in bfloat16 (float32 inputs cast)", function()
      lm.autocast(BF, function()
         assert.equal("bfloat16", dt(F.linear(x, w, b)))
         assert.equal("bfloat16", dt(F.linear(x, w)))
         assert.equal("bfloat16", dt(x:matmul(w:t())))
         assert.equal("bfloat16", dt(x:mm(w:t())))
         assert.equal("bfloat16", dt(lm.matmul(x, w:t())))
         assert.equal("bfloat16", dt(nn.Linear(5, 3)(x)))
         -- a 3-D input to linear, a bfloat16 x float32 matmul
         assert.equal("bfloat16", dt(F.linear(lm.randn(2, 3, 5), w, b)))
         assert.equal("bfloat16", dt(x:bfloat16():matmul(w:t())))
      end)
   end)

   it("runs them in float16 when asked", function()
      lm.autocast({ dtype = lm.float16 }, function()
         assert.equal("float16", dt(F.linear(x, w, b)))
         assert.equal("float16", dt(x:matmul(w:t())))
         assert.equal("float16", dt(x:bfloat16():matmul(w:t())))  -- other low dtypes cast too
      end)
   end)

   it("leaves float64 alone (PyTorch casts only float32 and the other half type)", function()
      lm.autocast(BF, function()
         assert.equal("float64", dt(x:double():matmul(w:t():double())))
         assert.equal("float64", dt(F.linear(x:double(), w:double())))
         assert.equal("float64", dt(x:double():sum()))
      end)
   end)

   it("runs softmax, log_softmax and the losses in float32", function()
      local y = lm.randint(1, 5, { 6 })
      lm.autocast(BF, function()
         local h = F.linear(x, w, b)
         assert.equal("bfloat16", dt(h))
         assert.equal("float32", dt(F.softmax(h, 2)))
         assert.equal("float32", dt(F.log_softmax(h, 2)))
         assert.equal("float32", dt(F.cross_entropy(h, y)))
         assert.equal("float32", dt(F.nll_loss(F.log_softmax(h, 2), y)))
         assert.equal("float32", dt(F.nll_loss(h, y, { weight = lm.ones(4):bfloat16() })))
         assert.equal("float32", dt(F.mse_loss(h, lm.zeros(6, 4))))
         assert.equal("float32", dt(F.mse_loss(h, h:detach(), { reduction = "none" })))
         assert.equal("float32", dt(nn.CrossEntropyLoss()(h, y)))
      end)
   end)

   it("runs sum, prod, exp, log, pow, ... in float32; mean follows its input", function()
      local h = x:bfloat16()
      lm.autocast(BF, function()
         for _, name in ipairs({ "sum", "prod", "exp", "log1p", "expm1", "reciprocal" }) do
            assert.equal("float32", dt(h[name](h)), name)
         end
         assert.equal("float32", dt(h:abs():log()))
         assert.equal("float32", dt(h:abs():rsqrt()))
         assert.equal("float32", dt(h:pow(2)))
         assert.equal("float32", dt(h ^ 2))
         assert.equal("float32", dt(lm.pow(h, 2)))
         assert.equal("float32", dt(h:sum(2)))
         assert.equal("float32", dt(lm.sum(h)))
         -- a dtype given to sum is used as given
         assert.equal("float64", dt(h:sum(nil, false, lm.float64)))
         assert.equal("bfloat16", dt(h:sum(nil, false, lm.bfloat16)))
         -- PyTorch's lists leave mean out: it follows its input
         assert.equal("bfloat16", dt(h:mean()))
         -- integer tensors are not touched
         assert.equal("int64", dt(lm.arange(5):sum()))
      end)
   end)

   it("lets elementwise ops, views and cat follow their inputs", function()
      local h = x:bfloat16()
      lm.autocast(BF, function()
         assert.equal("bfloat16", dt(h:relu()))
         assert.equal("bfloat16", dt(F.relu(h)))
         assert.equal("bfloat16", dt(h:sigmoid()))
         assert.equal("bfloat16", dt(h + h))
         assert.equal("bfloat16", dt(h * 2))
         assert.equal("float32", dt(h + x))             -- promotion to the wider type
         assert.equal("float32", dt(x:relu()))          -- float32 stays float32
         assert.equal("bfloat16", dt(h:reshape(30)))
         assert.equal("bfloat16", dt(h:t()))
         assert.equal("float32", dt(lm.cat({ h, x })))  -- cat promotes, as PyTorch
         assert.equal("bfloat16", dt(lm.cat({ h, h })))
         assert.equal("bfloat16", dt(F.dropout(h, 0.5, true)))
      end)
   end)

   it("lets the pools and batch norm follow a float32 input", function()
      local img = lm.randn(2, 3, 6, 6)
      lm.autocast(BF, function()
         assert.equal("float32", dt(F.max_pool2d(img, 2)))
         assert.equal("float32", dt(F.avg_pool2d(img, 2)))
         assert.equal("float32", dt(F.adaptive_avg_pool2d(img, 1)))
         assert.equal("float32", dt(F.batch_norm(img, lm.zeros(3), lm.ones(3), lm.ones(3),
                                                 lm.zeros(3), { training = true })))
      end)
   end)

   guarded(HAS_BF16_CONV, "runs conv2d in bfloat16 (input, weight and bias cast)", function()
      local img = lm.randn(2, 3, 6, 6):contiguous(lm.channels_last)
      local conv = nn.Conv2d(3, 4, 3, { padding = 1 })
      lm.autocast(BF, function()
         local y = conv(img)
         assert.equal("bfloat16", dt(y))
         assert.is_true(y:is_contiguous(lm.channels_last))
         assert.equal("bfloat16", dt(F.conv2d(img:select(1, 1), conv.weight, conv.bias)))
         local r = F.conv2d(img, conv.weight, nil, { padding = 1, residual = y })
         assert.equal("bfloat16", dt(r))
      end)
   end)

   guarded(HAS_BF16_CONV, "runs conv1d, conv3d and the transposed convolutions in the low dtype "
      .. "(a UNet trains under it), keeping channels-last and giving float32 weights float32 "
      .. "gradients", function()
      for _, low in ipairs({ BF, { dtype = lm.float16 } }) do
         local name = low.dtype == lm.float16 and "float16" or "bfloat16"
         local img = lm.randn(2, 3, 6, 6):contiguous(lm.channels_last)
         local net = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), nn.ReLU(),
                                   nn.ConvTranspose2d(8, 4, 2, { stride = 2 }))
         lm.autocast(low, function()
            local y = net(img)
            assert.equal(name, dt(y))
            assert.same({ 2, 4, 12, 12 }, y:size())
            assert.is_true(y:is_contiguous(lm.channels_last))
            y:float():sum():backward()
            local t1 = nn.ConvTranspose1d(3, 2, 3)
            assert.equal(name, dt(t1(lm.randn(2, 3, 5))))
            assert.equal(name, dt(F.conv1d(lm.randn(2, 3, 5), lm.randn(2, 3, 3))))
            local v = lm.randn(1, 2, 3, 4, 4):contiguous(lm.channels_last_3d)
            assert.equal(name, dt(F.conv3d(v, lm.randn(2, 2, 1, 1, 1))))
            local t3 = F.conv_transpose3d(v, lm.randn(2, 3, 2, 2, 2), nil, { stride = 2 })
            assert.equal(name, dt(t3))
            assert.is_true(t3:is_contiguous(lm.channels_last_3d))
         end)
         local wg = net[3].weight.grad
         assert.equal("float32", dt(wg))
         assert.is_true(wg:abs():sum():item() > 0)
      end
   end)

   guarded(HAS_BF16_POOL, "lets the pools follow a bfloat16 input", function()
      local img = lm.randn(2, 3, 6, 6):bfloat16()
      lm.autocast(BF, function()
         assert.equal("bfloat16", dt(F.max_pool2d(img, 2)))
         assert.equal("bfloat16", dt(F.avg_pool2d(img, 2)))
         assert.equal("bfloat16", dt(F.adaptive_avg_pool2d(img, 1)))
      end)
   end)

   guarded(HAS_BF16_BN, "keeps batch norm's output in its input's dtype (float32 weights and "
      .. "statistics)", function()
      local bn = nn.BatchNorm2d(3)
      local img = lm.randn(2, 3, 4, 4):bfloat16()
      lm.autocast(BF, function()
         local y = bn(img)
         assert.equal("bfloat16", dt(y))
         assert.equal("float32", dt(bn.running_mean))
         assert.equal("float32", dt(bn.weight))
      end)
   end)

   it("changes nothing outside a region, nor for a CUDA region on CPU tensors", function()
      -- CPU tensors, also when the suite runs on a test device (LUMEN_TEST_DEVICE=cuda:0)
      local x, w, b = x:to("cpu"), w:to("cpu"), b:to("cpu") -- luacheck: ignore 431
      assert.equal("float32", dt(F.linear(x, w, b)))
      assert.equal("float32", dt(x:matmul(w:t())))
      assert.equal("bfloat16", dt(x:bfloat16():sum()))
      assert.equal("bfloat16", dt(x:bfloat16():exp()))
      lm.autocast({ device = "cuda" }, function()
         assert.equal("float32", dt(F.linear(x, w, b)))
         assert.equal("bfloat16", dt(x:bfloat16():sum()))
         assert.is_true(lm.is_autocast_enabled("cuda"))
         assert.is_false(lm.is_autocast_enabled("cpu"))
         assert.equal("float16", tostring(lm.get_autocast_dtype("cuda")))
      end)
      lm.autocast(BF, function() end)
      assert.equal("float32", dt(F.linear(x, w, b)))
   end)

   it("computes linear like float32 on the rounded inputs", function()
      lm.manual_seed(2)
      for _, sz in ipairs({ { 1, 1, 1 }, { 7, 17, 3 }, { 64, 64, 17 } }) do
         local xx, ww, bb = lm.randn(sz[1], sz[2]), lm.randn(sz[3], sz[2]), lm.randn(sz[3])
         local got = lm.autocast(BF, F.linear, xx, ww, bb)
         local ref = F.linear(xx:bfloat16():float(), ww:bfloat16():float(), bb:bfloat16():float())
         assert.equal("bfloat16", dt(got))
         assert.is_true(rel_err(got, ref) < 1e-2, "linear " .. table.concat(sz, "x"))
         local got16 = lm.autocast({ dtype = lm.float16 }, F.linear, xx, ww, bb)
         local ref16 = F.linear(xx:half():float(), ww:half():float(), bb:half():float())
         assert.is_true(rel_err(got16, ref16) < 2e-3, "linear fp16 " .. table.concat(sz, "x"))
      end
   end)

   it("casts a pending (deferred) float32 result for matmul", function()
      local big = lm.randn(512, 512)
      local s = big + big            -- may be deferred (LUMEN_LAZY_MIN)
      local r = lm.autocast(BF, function() return s:matmul(big) end)
      assert.equal("bfloat16", dt(r))
      assert.is_true(rel_err(r, (big * 2):bfloat16():float():matmul(big:bfloat16():float()))
                     < 1e-2)
   end)
end)

describe("lm.autocast gradients", function()
   local function mlp()
      lm.manual_seed(3)
      return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
   end

   it("gives float32 parameters float32 gradients close to the float32 model's", function()
      local m = mlp()
      local x, y = lm.randn(32, 8), lm.randint(1, 5, { 32 })
      F.cross_entropy(m(x), y):backward()
      local ref = {}
      for i, p in ipairs(m:parameters()) do ref[i] = p.grad:clone(); p.grad = nil end
      for _, d in ipairs({ lm.bfloat16, lm.float16 }) do
         local loss = lm.autocast({ dtype = d }, function() return F.cross_entropy(m(x), y) end)
         assert.equal("float32", dt(loss))
         loss:backward()
         for i, p in ipairs(m:parameters()) do
            assert.equal("float32", dt(p.grad))
            assert.equal("float32", dt(p))
            local tol = d == lm.bfloat16 and 3e-2 or 5e-3
            assert.is_true(rel_err(p.grad, ref[i]) < tol,
                           ("%s param %d: rel err %g"):format(tostring(d), i,
                                                             rel_err(p.grad, ref[i])))
            p.grad = nil
         end
      end
   end)

   it("backpropagates through matmul, sum and exp into a float32 leaf", function()
      local a = lm.randn(3, 4, { requires_grad = true })
      local bm = lm.randn(4, 2)
      local out = lm.autocast(BF, function() return a:matmul(bm):exp():sum() end)
      assert.equal("float32", dt(out))
      out:backward()
      assert.equal("float32", dt(a.grad))
      local a2 = a:detach():requires_grad_()
      a2:matmul(bm):exp():sum():backward()
      assert.is_true(rel_err(a.grad, a2.grad) < 3e-2)
   end)

   guarded(HAS_BF16_CONV and HAS_BF16_BN and HAS_BF16_POOL, "trains a conv net: float32 "
      .. "gradients close to float32's", function()
      lm.manual_seed(4)
      -- no conv bias: before a batch norm its gradient is ~0, no relative error to check
      local m = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1, bias = false }),
                              nn.BatchNorm2d(8), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
      m:to(lm.channels_last)
      local x = lm.randn(4, 3, 8, 8):contiguous(lm.channels_last)
      local y = lm.randint(1, 6, { 4 })
      F.cross_entropy(m(x), y):backward()
      local ref = {}
      for i, p in ipairs(m:parameters()) do ref[i] = p.grad:clone(); p.grad = nil end
      local loss = lm.autocast(BF, function() return F.cross_entropy(m(x), y) end)
      assert.equal("float32", dt(loss))
      loss:backward()
      for i, p in ipairs(m:parameters()) do
         assert.equal("float32", dt(p.grad))
         assert.is_true(rel_err(p.grad, ref[i]) < 6e-2, "param " .. i)
      end
   end)
end)

describe("lm.autocast weight cache", function()
   it("casts a parameter once per region and again in the next region", function()
      local lin = nn.Linear(5, 3)
      local x = lm.randn(2, 5)
      local e1, e2, e3
      lm.autocast(BF, function()
         local y1, y2 = lin(x), lin(x)
         e1, e2 = y1.grad_fn.inputs[2], y2.grad_fn.inputs[2]     -- the cast weight's node
         assert.equal(2, AC._cache_size(lm.bfloat16))            -- weight and bias
         assert.equal(0, AC._cache_size(lm.float16))
      end)
      assert.equal(0, AC._cache_size(lm.bfloat16))                -- emptied on exit
      lm.autocast(BF, function() e3 = lin(x).grad_fn.inputs[2] end)
      assert.is_truthy(e1)
      assert.equal(e1, e2)
      assert.not_equal(e1, e3)
   end)

   it("caches per dtype, only parameters, and keeps the cache through nested regions", function()
      local w = lm.randn(3, 5, { requires_grad = true })
      local x = lm.randn(2, 5)
      lm.autocast(BF, function()
         F.linear(x, w)
         lm.autocast({ dtype = lm.float16 }, function() F.linear(x, w) end)
         assert.equal(1, AC._cache_size(lm.float16))   -- kept until the outermost exit
         assert.equal(1, AC._cache_size(lm.bfloat16))
         -- not parameters: a non-leaf, a tensor that does not require grad
         local leaf = lm.randn(3, 5, { requires_grad = true })
         F.linear(x, leaf * 1)
         F.linear(x, lm.randn(3, 5))
         assert.equal(1, AC._cache_size(lm.bfloat16))
      end)
      assert.equal(0, AC._cache_size(lm.float16))
   end)

   it("does not reuse a cast made under no_grad once recording is on", function()
      local lin = nn.Linear(5, 3)
      local x = lm.randn(2, 5)
      lm.autocast(BF, function()
         lm.no_grad(function() lin(x) end)
         lin(x):sum():backward()
      end)
      assert.equal("float32", dt(lin.weight.grad))
      assert.is_true(lin.weight.grad:abs():sum():item() > 0)
   end)

   it("can be turned off (cache_enabled = false)", function()
      local lin = nn.Linear(5, 3)
      lm.autocast({ cache_enabled = false }, function()
         lin(lm.randn(2, 5))
         assert.equal(0, AC._cache_size(lm.bfloat16))
      end)
   end)
end)

describe("lm.autocast regions", function()
   local x, w
   before_each(function()
      x, w = lm.randn(2, 5), lm.randn(3, 5)
   end)

   it("returns fn's results, passes its arguments, and has defaults", function()
      local a, b2, c, n = lm.autocast({}, function(p, q) return p + 1, nil, q, 7 end, 1, "z")
      assert.equal(2, a); assert.is_nil(b2); assert.equal("z", c); assert.equal(7, n)
      assert.equal(3, select("#", lm.autocast(nil, function() return 1, nil, 3 end)))
      -- lm.autocast(fn, ...) is lm.autocast({}, fn, ...): the default device's type, whose
      -- default dtype is bfloat16 on "cpu" and float16 on "cuda" (the suite on cuda:0)
      local cuda_default = lm.get_default_device():match("^cuda") ~= nil
      assert.equal(cuda_default and "float16" or "bfloat16", dt(lm.autocast(F.linear, x, w)))
      assert.equal("bfloat16", tostring(lm.get_autocast_dtype("cpu")))
      assert.equal("float16", tostring(lm.get_autocast_dtype("cuda")))
      assert.is_false(lm.is_autocast_enabled())
      lm.autocast({ dtype = "float16" }, function()
         assert.is_true(lm.is_autocast_enabled())
         assert.equal("float16", tostring(lm.get_autocast_dtype()))
      end)
   end)

   it("nests: an inner region may disable or change the dtype; restored after", function()
      lm.autocast(BF, function()
         assert.equal("bfloat16", dt(F.linear(x, w)))
         lm.autocast({ enabled = false }, function()
            assert.is_false(lm.is_autocast_enabled())
            assert.equal("float32", dt(F.linear(x, w)))
            lm.autocast({ dtype = lm.float16 }, function()
               assert.equal("float16", dt(F.linear(x, w)))
            end)
            assert.equal("float32", dt(F.linear(x, w)))
         end)
         assert.is_true(lm.is_autocast_enabled())
         lm.autocast({ dtype = lm.float16 }, function()
            assert.equal("float16", dt(F.linear(x, w)))
         end)
         assert.equal("bfloat16", dt(F.linear(x, w)))
         assert.equal("bfloat16", tostring(lm.get_autocast_dtype()))
      end)
      assert.is_false(lm.is_autocast_enabled())
   end)

   it("composes with no_grad both ways", function()
      local wp = lm.randn(3, 5, { requires_grad = true })
      local y = lm.no_grad(function() return lm.autocast(BF, F.linear, x, wp) end)
      assert.equal("bfloat16", dt(y)); assert.is_falsy(y.requires_grad)
      y = lm.autocast(BF, function() return lm.no_grad(F.linear, x, wp) end)
      assert.equal("bfloat16", dt(y)); assert.is_falsy(y.requires_grad)
      y = lm.autocast(BF, F.linear, x, wp)
      assert.is_true(y.requires_grad)
      assert.is_true(lm.is_grad_enabled())
   end)

   it("is off again after an error inside fn (and rethrows it)", function()
      local ok, msg = pcall(lm.autocast, BF, function()
         F.linear(x, lm.randn(3, 5, { requires_grad = true }))
         error("boom")
      end)
      assert.is_false(ok)
      assert.truthy(tostring(msg):find("boom", 1, true))
      assert.is_false(lm.is_autocast_enabled())
      assert.equal(0, AC._cache_size(lm.bfloat16))
      assert.equal("float32", dt(F.linear(x, w)))
      -- an error in a nested region restores the outer region's state
      lm.autocast(BF, function()
         assert.is_false(pcall(lm.autocast, { dtype = lm.float16 }, error, "inner"))
         assert.equal("bfloat16", dt(F.linear(x, w)))
         assert.is_false(pcall(lm.autocast, { enabled = false }, error, "inner"))
         assert.is_true(lm.is_autocast_enabled())
      end)
      -- a lumen error inside fn keeps its message
      local ok2, msg2 = pcall(lm.autocast, BF, F.linear, x, lm.randn(3, 4))
      assert.is_false(ok2)
      assert.truthy(msg2:find("lumen.linear:", 1, true), msg2)
      assert.is_false(lm.is_autocast_enabled())
   end)

   it("rejects bad input with errors naming lumen.autocast", function()
      local f = function() end
      H.assert_error_like("autocast", "lm.bfloat16 or lm.float16", lm.autocast,
                          { dtype = lm.float64 }, f)
      H.assert_error_like("autocast", "int64", lm.autocast, { dtype = lm.int64 }, f)
      H.assert_error_like("autocast", "float32", lm.autocast, { dtype = "float32" }, f)
      H.assert_error_like("autocast", "'bf16'", lm.autocast, { dtype = "bf16" }, f)
      H.assert_error_like("autocast", "unknown option 'dtpye'", lm.autocast, { dtpye = 1 }, f)
      H.assert_error_like("autocast", "device", lm.autocast, { device = "tpu" }, f)
      H.assert_error_like("autocast", "device", lm.autocast, { device = "cuda:0" }, f)
      H.assert_error_like("autocast", "expected a function", lm.autocast, {}, 42)
      H.assert_error_like("autocast", "expected a function", lm.autocast, {})
      H.assert_error_like("autocast", "options table", lm.autocast, "bf16", f)
      H.assert_error_like("autocast", "enabled must be a boolean", lm.autocast,
                          { enabled = 1 }, f)
      H.assert_error_like("autocast", "cache_enabled", lm.autocast, { cache_enabled = "no" }, f)
      H.assert_error_like("is_autocast_enabled", "device", lm.is_autocast_enabled, "gpu")
      H.assert_error_like("get_autocast_dtype", "device", lm.get_autocast_dtype, 3)
      assert.is_false(lm.is_autocast_enabled())
   end)
end)

describe("Module:to(dtype)", function()
   it("converts floating parameters and buffers in place, not integer buffers", function()
      local m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                              nn.Linear(4, 2))
      local w = m:parameters()[1]
      m:parameters()[1].grad = lm.zeros(4, 3, 3, 3)
      for _, d in ipairs({ lm.bfloat16, lm.float16, lm.float32 }) do
         assert.equal(m, m:to(d))
         for _, p in ipairs(m:parameters()) do assert.equal(tostring(d), dt(p)) end
         for _, kv in ipairs(m:named_buffers()) do
            local want = kv[1]:find("num_batches_tracked") and "int64" or tostring(d)
            assert.equal(want, dt(kv[2]), kv[1])
         end
         assert.equal(w, m:parameters()[1])                 -- the same parameter objects
         assert.equal(tostring(d), dt(w.grad))
      end
      m:bfloat16(); assert.equal("bfloat16", dt(w))
      m:half(); assert.equal("float16", dt(w))
      m:to("cpu", lm.bfloat16); assert.equal("bfloat16", dt(w))
      m:to({ dtype = lm.float32, memory_format = lm.channels_last })
      assert.equal("float32", dt(w)); assert.is_true(w:is_contiguous(lm.channels_last))
   end)

   it("gives a bfloat16 linear model bfloat16 outputs and gradients", function()
      local m = nn.Linear(5, 3):to(lm.bfloat16)
      local y = m(lm.randn(2, 5):bfloat16())
      assert.equal("bfloat16", dt(y))
      y:float():sum():backward()
      assert.equal("bfloat16", dt(m.weight.grad))
   end)
end)

describe("a bfloat16 training loop", function()
   it("keeps memory flat and learns", function()
      lm.manual_seed(5)
      local m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
      local opt = lm.optim.SGD(m, { lr = 0.1, momentum = 0.9 })
      local x = lm.randn(64, 32)
      local y = x:narrow(2, 1, 4):argmax(2)
      local function step()
         opt:zero_grad()
         local loss = lm.autocast(BF, function() return F.cross_entropy(m(x), y) end)
         loss:backward()
         opt:step()
         return loss:item()
      end
      local first = step()
      for _ = 1, 10 do step() end
      collectgarbage(); collectgarbage()
      local base = lm.memory.live_bytes()
      local last
      for _ = 1, 40 do last = step() end
      collectgarbage(); collectgarbage()
      local after = lm.memory.live_bytes()
      assert.is_true(after <= base + 64 * 1024,
                     ("live bytes %d after 11 steps, %d after 51"):format(base, after))
      assert.is_true(last < 0.5 * first, ("loss %g -> %g"):format(first, last))
      assert.equal(0, AC._cache_size(lm.bfloat16))
   end)
end)
