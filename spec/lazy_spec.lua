-- spec/lazy_spec.lua -- deferred elementwise results (lua/lumen/deferred.lua, used by tensor.lua):
-- a large float a op b made outside autograd is pending until used; a float unary op on it runs
-- fused (lm_binary_unary); anything else computes it first. Deferral must be invisible: the
-- same bits, layouts and errors as eager evaluation, whatever is written in place afterwards.
local H = require("spec.helpers")
local lm = H.lm
local T = require("lumen.tensor")

local SIZES = { 4, 16, 64, 64 }          -- 262144 elements: at the deferral threshold

local function big(fmt, dtype)
   local x = lm.randn(SIZES, { dtype = dtype or lm.float32 })
   return fmt and x:contiguous(fmt) or x
end

local function is_pending(x) return rawget(x, "_lz") ~= nil end

-- equal values, NaN where the other has NaN (float16 a / b can overflow, and sin(inf) is NaN)
local function same(x, y)
   local nx, ny = x:isnan(), y:isnan()
   if not lm.equal(nx, ny) then return false end
   return lm.equal(lm.where(nx, 0, x), lm.where(ny, 0, y))
end

-- the eager value of f(): its result computed at once, element by element
local function snapshot(t) return t:clone() end

describe("deferred elementwise results", function()
   lm.manual_seed(11)

   it("defer large float binary ops and fuse the unary op that follows, bit for bit", function()
      local binops = {
         { "add", function(a, b) return a + b end },
         { "sub", function(a, b) return a - b end },
         { "mul", function(a, b) return a * b end },
         { "div", function(a, b) return a / b end },
         { "add alpha", function(a, b) return a:add(b, 0.25) end },
         { "maximum", function(a, b) return a:maximum(b) end },
         { "minimum", function(a, b) return a:minimum(b) end },
         { "scalar", function(a) return a * 1.5 end },
         { "scalar add", function(a) return a + 2 end },
      }
      local unops = { "relu", "neg", "abs", "exp", "sigmoid", "tanh", "square", "sin",
                      "expm1" }
      -- float16 / bfloat16: computed in float32, rounded to 16 bits between the two ops as the
      -- eager pair stores it, and once at the end
      for _, dt in ipairs({ lm.float32, lm.float64, lm.bfloat16, lm.float16 }) do
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            local a, b = big(fmt, dt), big(lm.contiguous_format, dt)   -- mixed layouts too
            for _, bo in ipairs(binops) do
               for _, u in ipairs(unops) do
                  local what = ("%s %s %s %s"):format(tostring(dt), tostring(fmt), bo[1], u)
                  local p = bo[2](a, b)
                  assert.is_true(is_pending(p), what .. ": not deferred")
                  local fused = p[u](p)
                  assert.is_true(is_pending(p), what .. ": the fused op forced its input")
                  local q = bo[2](a, b)
                  local eager = T.tc(q, "spec")      -- force q: the eager binary result
                  assert.is_true(eager ~= nil)
                  local ref = q[u](q)
                  H.assert_layout(fused, ref:size(), ref:stride(), what)
                  assert.is_true(same(fused, ref), what .. ": fused values differ")
                  -- and the pending one, forced now, equals the eager binary result
                  assert.is_true(same(p, q), what .. ": forced values differ")
                  H.assert_layout(p, q:size(), q:stride(), what)
               end
            end
         end
      end
   end)

   it("fuse 16-bit ops on strided inputs (views dense in no format) bit for bit", function()
      for _, dt in ipairs({ lm.bfloat16, lm.float16 }) do
         local base = lm.randn({ 4, 32, 64, 130 }):to(dt)
         local a = base:narrow(2, 1, 16):narrow(4, 3, 64)           -- 262144 elements, strided
         local b = lm.randn({ 4, 64, 16, 64 }):to(dt):transpose(2, 3)
         for _, u in ipairs({ "relu", "neg", "sigmoid" }) do
            for _, bo in ipairs({ function(x, y) return x + y end,
                                  function(x, y) return x * y end,
                                  function(x) return x * 0.3 end }) do
               local p = bo(a, b)
               assert.is_true(is_pending(p), tostring(dt))
               local fused = p[u](p)
               local q = bo(a, b)
               T.tc(q, "spec")
               local ref = q[u](q)
               assert.are.equal(dt, fused:dtype())
               H.assert_layout(fused, ref:size(), ref:stride(), tostring(dt) .. " " .. u)
               assert.is_true(lm.equal(fused, ref), tostring(dt) .. " " .. u)
            end
         end
      end
   end)

   it("give fused results the layout of the eager pair, size-1 dims included", function()
      local cases = {
         { lm.randn({ 1, 64, 64, 64 }):transpose(1, 2), 1 },
         { lm.randn({ 64, 64, 1, 64 }), lm.randn({ 64, 64, 1, 64 }):contiguous(lm.channels_last) },
         { lm.randn({ 64, 64, 1, 64 }):contiguous(lm.channels_last), lm.randn({ 64, 64, 1, 64 }) },
         { lm.randn({ 64, 1, 64, 64 }):contiguous(lm.channels_last), 0.5 },
         { lm.randn({ 64, 64, 64, 2 }):transpose(2, 4), lm.randn({ 64, 2, 64, 64 }) },
      }
      for i, c in ipairs(cases) do
         local a, b = c[1], c[2]
         local p = a + b
         assert.is_true(is_pending(p), "case " .. i)
         local fused = p:relu()
         local q = a + b
         T.tc(q, "spec")
         local ref = q:relu()
         H.assert_layout(fused, ref:size(), ref:stride(), "case " .. i)
         assert.is_true(lm.equal(fused, ref), "case " .. i)
      end
   end)

   it("keep small, integer, broadcast and autograd operations eager", function()
      local small = lm.randn({ 4, 4 })
      if not os.getenv("LUMEN_LAZY_MIN") then           -- the stress run defers everything
         assert.is_false(is_pending(small + small))
      end
      local ints = lm.ones(SIZES, { dtype = lm.int64 })
      assert.is_false(is_pending(ints + ints))
      local x = big()
      assert.is_false(is_pending(x + lm.randn({ 64 })))             -- broadcasting
      assert.is_false(is_pending(x + big(nil, lm.float64)))          -- promotion
      local w = big():requires_grad_(true)
      assert.is_false(is_pending(w + x))
      assert.is_false(is_pending(2 - x))                             -- scalar on the left
      local r = lm.no_grad(function() return x + x end)
      assert.is_true(is_pending(r))
   end)

   it("raise eager errors at once", function()
      local x = big()
      H.assert_error("add", function() return x + lm.randn({ 3, 3 }) end)
   end)

   it("compute a pending result before any write into an input's memory", function()
      local writers = {
         { "add_", function(a) a:add_(1) end },
         { "mul_", function(a) a:mul_(2) end },
         { "copy_", function(a) a:copy_(lm.zeros(SIZES)) end },
         { "fill_", function(a) a:fill_(3) end },
         { "zero_", function(a) a:zero_() end },
         { "clamp_", function(a) a:clamp_(0, 0.5) end },
         { "relu_", function(a) a:relu_() end },
         { "exp_", function(a) a:exp_() end },
         { "addcmul_", function(a) a:addcmul_(a, a, 0.5) end },
         { "view add_", function(a) a:view(-1):narrow(1, 1, 1000):add_(7) end },
         { "transpose fill_", function(a) a:transpose(1, 2):fill_(-1) end },
         { "out of another op", function(a) a:add_(a) end },
         { "nn.init.normal_", function(a) lm.nn.init.normal_(a, 0, 1) end },
         { "nn.init.constant_", function(a) lm.nn.init.constant_(a, 0.5) end },
      }
      for _, w in ipairs(writers) do
         for _, side in ipairs({ "left", "right" }) do
            local a, b = big(), big()
            local before = side == "left" and snapshot(a) + b or a + snapshot(b)
            T.tc(before, "spec")
            local p = a + b
            assert.is_true(is_pending(p), w[1])
            w[2](side == "left" and a or b)
            assert.is_true(lm.equal(p, before), w[1] .. " (" .. side .. "): pending result " ..
                           "saw the write")
         end
      end
   end)

   it("is computed before an optimizer step or a batch norm updates its inputs", function()
      local p = big():requires_grad_(true)
      local opt = lm.optim.SGD({ p }, { lr = 0.5, momentum = 0.9 })
      local x = big()
      local pd = p:detach()                  -- shares p's memory, needs no grad
      local before = snapshot(pd) * x
      T.tc(before, "spec")
      local q = pd * x
      assert.is_true(is_pending(q))
      p.grad = lm.ones(SIZES)
      opt:step()
      assert.is_true(lm.equal(q, before), "SGD step")

      local bn = lm.nn.BatchNorm2d(16)
      bn:train()
      local rm = bn.running_mean
      local r0 = snapshot(rm)
      local m = lm.ones({ 16 })
      -- running statistics are small; use a large tensor sharing nothing, and one reading them
      local big_rm = rm:view(1, 16, 1, 1):expand(SIZES):contiguous()
      local s = big_rm + big_rm
      assert.is_true(is_pending(s))
      bn(big())
      assert.is_false(lm.equal(rm, r0))      -- the update happened
      assert.is_true(lm.equal(s, (r0 * 2):view(1, 16, 1, 1):expand(SIZES)))
      assert.is_true(m ~= nil)
   end)

   it("survives freeing its inputs, and can itself be freed without being computed", function()
      local a, b = big(), big()
      local ref = snapshot(a) + snapshot(b)
      local p = a + b
      a:free()
      b:free()
      assert.is_true(lm.equal(p, ref))
      local q = ref + ref
      assert.is_true(is_pending(q))
      local live = lm.memory.live_bytes()
      q:free()                                          -- nothing computed, nothing allocated
      assert.equal(live, lm.memory.live_bytes())
      H.assert_error("size", function() return q:size() end)
      H.assert_error("add", function() return q + 1 end)
      -- a module replacing a pending tensor's data (param.data = ...) gets the new data
      local r = ref * 2
      assert.is_true(is_pending(r))
      require("lumen.nn.module")._set_data(r, lm.zeros(SIZES))
      assert.equal(0, r:sum():item())
   end)

   it("computes a result kept across two collections, so its inputs can go", function()
      local a, b = big(), big()
      local kept = a + b
      assert.is_true(is_pending(kept))
      for _ = 1, 3 do lm.memory.collect() end
      local other = a * b                                -- deferring checks the kept ones
      assert.is_true(is_pending(other))
      assert.is_false(is_pending(kept))
      assert.is_true(lm.equal(kept, a + b + 0))
   end)

   it("behaves as a tensor everywhere", function()
      local x = big(lm.channels_last)
      local p = x * 2
      assert.is_true(lm.is_tensor(p))
      assert.is_true(getmetatable(p) == T.mt)
      assert.equal(4, p:dim())
      assert.is_false(is_pending(p))                    -- the lookup of dim forced it
      assert.is_true(p:is_contiguous(lm.channels_last))

      local q = x * 2
      assert.is_truthy(tostring(q):find("float32", 1, true))
      local r = x * 2
      assert.is_true(lm.equal(r + 1, x * 2 + 1))
      assert.is_true(lm.equal(-(x * 2), (x * 2):neg()))
      local s = x * 2
      assert.is_true(lm.equal(lm.cat({ s, s }, 1):narrow(1, 1, 4), x * 2))
      local u = x * 2
      u.tag = "hello"                                     -- a field: forces, then stores
      assert.equal("hello", u.tag)
      assert.is_false(is_pending(u))
      local v = x * 2
      local y = lm.nn.functional.conv2d(v, lm.ones({ 1, 16, 1, 1 }))
      assert.is_true(lm.equal(y, lm.nn.functional.conv2d(x * 2 + 0, lm.ones({ 1, 16, 1, 1 }))))
      -- serialization and checkpoints see values, not recipes
      local path = os.tmpname()
      lm.save({ t = x * 2 }, path)
      local back = lm.load(path)
      os.remove(path)
      assert.is_true(lm.equal(back.t, x * 2))
      -- requires_grad_ and autograd on a formerly pending tensor
      local g = (x * 2):requires_grad_(true)
      local l = (g * g):sum()
      l:backward()
      assert.is_true(lm.equal(g.grad, g:detach() * 2))
   end)

   it("never defers inside backward", function()
      local w = big():requires_grad_(true)
      local seen
      local y = w * 3
      y:register_hook(function(gr)
         local t = gr + gr                   -- runs inside backward
         seen = is_pending(t)
         return nil
      end)
      y:sum():backward()
      assert.is_false(seen)
   end)

   it("can be turned off with LUMEN_LAZY=0", function()
      local exe = H.root and (H.root .. "/bin/lumen") or "bin/lumen"
      local f = io.popen("LUMEN_LAZY=0 " .. exe .. " -e \"local T = require('lumen.tensor'); " ..
                         "local x = lm.randn({4, 16, 64, 64}); local p = x + x; " ..
                         "io.write(tostring(rawget(p, '_lz') == nil))\" 2>&1")
      local out = f:read("*a")
      f:close()
      assert.equal("true", out)
   end)
end)
