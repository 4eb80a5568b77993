-- luacheck: max line length 120
-- The composed Tensor methods of lua/lumen/autograd/composed_math.lua and composed_shape.lua,
-- and lm.nn.utils' gradient tools (lua/lumen/nn/clip_grad.lua): values and gradients against
-- PyTorch 2.x (spec/fixtures/nn/tensor_extras.lua, made by gen_tensor_extras.py), gradients by
-- finite differences, formats, the random fills, bad input. Under LUMEN_TEST_DEVICE the same run
-- there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end
local function dev(t) return DEV and t:to(DEV) or t end

local CASES = dofile("spec/fixtures/nn/tensor_extras.lua")

local function vals(t) return t:cpu():contiguous():view(-1):totable() end

-- equal within tol of the magnitudes; NaN where PyTorch has NaN, infinities exactly
local function same(a, b, tol)
   if a ~= a or b ~= b then return a ~= a and b ~= b end
   if a == b then return true end
   if math.abs(a) == math.huge or math.abs(b) == math.huge then return false end
   return math.abs(a - b) <= tol * math.max(1, math.abs(a), math.abs(b))
end

local function close(got, exp, tol, what)
   assert.are.equal(#exp, #got, what .. ": element count")
   for i = 1, #exp do
      local g, e = got[i], exp[i]
      if type(e) == "boolean" then
         assert.are.equal(e, g, ("%s [%d]"):format(what, i))
      else
         assert.is_true(same(g, e, tol), ("%s [%d]: %.15g, PyTorch %.15g"):format(what, i, g, e))
      end
   end
end

local function make(spec, requires_grad)
   local t = lm.tensor(spec.data, { dtype = lm[spec.dtype] }):view(spec.sizes)
   t = dev(t)
   if requires_grad and (spec.dtype == "float64") then t:requires_grad_(true) end
   return t
end

local function run(code, env)
   local f = assert(load("return " .. code, code, "t", setmetatable(env, { __index = _G })))
   return f()
end

-- H.assert_error_like with "lumen.<fname>: <problem>" (the problem a Lua pattern's plain text)
local function raises(msg, f)
   local fname, rest = msg:match("^lumen%.([%w_]+): (.*)$")
   assert(fname, "raises: " .. msg)
   H.assert_error_like(fname, (rest:gsub("%%(.)", "%1")), f)
end

local function weights(n)
   return (lm.arange(0, n):double() * 0.71 + 0.3):cos()
end

describe("composed Tensor methods against PyTorch", function()
   for _, c in ipairs(CASES) do
      if not c.clip and not c.optim then
         it(c.name .. ": values, sizes, dtype and gradients", function()
            local ins = {}
            for i, s in ipairs(c.inputs) do ins[i] = make(s, c.grads ~= nil) end
            local out = run(c.lua, { x = ins[1], y = ins[2], z = ins[3], w = ins[4], lm = lm })
            assert.is_true(H.list_equal(c.out.sizes, out:size()), c.name .. ": sizes")
            assert.are.equal(c.out.dtype, tostring(out:dtype()), c.name .. ": dtype")
            -- float32 results: within the rounding of PyTorch's (its exp and fused multiply-adds)
            local tol = c.lua:find("float", 1, true) and 2e-6 or 1e-12
            -- 16 bits: within one rounding of PyTorch's (both compute in float32 and round)
            if c.lua:find("bfloat16", 1, true) then tol = 2 ^ -8
            elseif c.lua:find("float16", 1, true) then tol = 2 ^ -11 end
            close(vals(out), c.out.data, tol, c.name)
            if c.grads then
               local n = out:numel()
               local loss = (out * dev(weights(n)):view(out:size())):sum()
               loss:backward()
               for i, g in ipairs(c.grads) do
                  if g == "zero" then
                     assert.is_true(ins[i].grad == nil or ins[i].grad:abs():sum():item() == 0)
                  elseif g ~= "none" then
                     close(vals(ins[i].grad), g, math.max(tol, 1e-11), c.name .. ": grad of input " .. i)
                  end
               end
            end
         end)
      end
   end
end)

describe("RMSprop and Adagrad against PyTorch (three steps)", function()
   for _, c in ipairs(CASES) do
      if c.optim then
         it(c.name, function()
            local p = dev(lm.tensor(c.p0, { dtype = lm.float64 }):view(3, 4)):requires_grad_(true)
            local opt = run(c.lua, { P = { p }, lm = lm })
            for _, g in ipairs(c.grads) do
               p.grad = dev(lm.tensor(g, { dtype = lm.float64 }):view(3, 4))
               opt:step()
            end
            close(vals(p), c.p, 1e-12, c.name)
         end)
      end
   end

   it("keep a channels-last parameter's layout in their state, and check their options", function()
      local p = dev(lm.randn({ 2, 3, 4, 5 }):contiguous(lm.channels_last)):requires_grad_(true)
      for _, opt in ipairs({ lm.optim.RMSprop({ p }, { momentum = 0.9, centered = true }),
                             lm.optim.Adagrad({ p }) }) do
         p.grad = dev(lm.ones({ 2, 3, 4, 5 }):contiguous(lm.channels_last))
         opt:step()
         for _, v in pairs(opt.state[p] or {}) do
            if lm.is_tensor(v) then assert.is_true(v:is_contiguous(lm.channels_last)) end
         end
      end
      assert.is_true(p:is_contiguous(lm.channels_last))
      raises("lumen.RMSprop: invalid alpha value: -1", function() lm.optim.RMSprop({ p }, { alpha = -1 }) end)
      raises("lumen.RMSprop: unknown option 'beta'", function() lm.optim.RMSprop({ p }, { beta = 1 }) end)
      raises("lumen.Adagrad: invalid lr_decay value", function() lm.optim.Adagrad({ p }, { lr_decay = -1 }) end)
   end)
end)

describe("lm.nn.utils.clip_grad_norm_ against PyTorch", function()
   for _, c in ipairs(CASES) do
      if c.clip then
         it(c.name, function()
            local P = {}
            for i, g in ipairs(c.grads_in) do
               P[i] = dev(lm.zeros(g.sizes, { dtype = lm.float64 })):requires_grad_(true)
               P[i].grad = dev(lm.tensor(g.data, { dtype = lm.float64 }):view(g.sizes))
            end
            local total = run(c.lua, { P = P, lm = lm })
            assert.are.equal(0, total:dim())
            close({ total:item() }, { c.total }, 1e-12, "total norm")
            for i, g in ipairs(c.grads_out) do close(vals(P[i].grad), g, 1e-12, "grad " .. i) end
         end)
      end
   end

   it("skips parameters without a gradient, returns 0 without any, and checks its input",
      function()
      local a = dev(lm.ones({ 2 }, { dtype = lm.float64 })):requires_grad_(true)
      local b = dev(lm.ones({ 2 }, { dtype = lm.float64 })):requires_grad_(true)
      assert.are.equal(0, lm.nn.utils.clip_grad_norm_({ a, b }, 1):item())
      b.grad = dev(lm.full({ 2 }, 3, { dtype = lm.float64 }))
      local n = lm.nn.utils.clip_grad_norm_({ a, b }, 1)
      assert.is_true(math.abs(n:item() - math.sqrt(18)) < 1e-12)
      assert.is_true(math.abs(b.grad:norm():item() - 1) < 1e-5)
      b.grad = dev(lm.tensor({ 1 / 0, 1 }, { dtype = lm.float64 }))
      raises("lumen.clip_grad_norm_: non-finite", function()
         lm.nn.utils.clip_grad_norm_(b, 1, { error_if_nonfinite = true })
      end)
      raises("lumen.clip_grad_norm_: unknown option 'norm'", function()
         lm.nn.utils.clip_grad_norm_(b, 1, { norm = 2 })
      end)
      raises("lumen.clip_grad_norm_: max_norm must be a number", function() lm.nn.utils.clip_grad_norm_(b, "1") end)
      raises("lumen.clip_grad_norm_: parameters%[2%] must be a tensor", function()
         lm.nn.utils.clip_grad_norm_({ a, 3 }, 1)
      end)
      b.grad = dev(lm.tensor({ -5, 0.5 }, { dtype = lm.float64 }))
      lm.nn.utils.clip_grad_value_({ a, b }, 1)
      assert.are.same({ -1, 0.5 }, vals(b.grad))
   end)

   it("parameters_to_vector / vector_to_parameters round trip", function()
      local m = lm.nn.Linear(3, 2)
      if DEV then m:to(DEV) end
      local v = lm.nn.utils.parameters_to_vector(m:parameters())
      assert.is_true(H.list_equal({ 8 }, v:size()))
      lm.nn.utils.vector_to_parameters(v * 2, m:parameters())
      assert.is_true(lm.nn.utils.parameters_to_vector(m:parameters()):allclose(v * 2))
      raises("lumen.vector_to_parameters: vec has 7 elements and the parameters 8", function()
         lm.nn.utils.vector_to_parameters(v:narrow(1, 1, 7), m:parameters())
      end)
   end)
end)

describe("composed methods: gradients by finite differences", function()
   local function inp(sizes, seed)
      local x = G.input(sizes, nil, seed)
      if DEV then x = x:detach():to(DEV):requires_grad_(true) end
      return x
   end
   it("norm (every p), logsumexp, lerp, the matrix products, tril", function()
      local x = inp({ 2, 3, 4 }, 11)
      for _, p in ipairs({ 2, 1, 3, 1.5, 0.7 }) do
         assert.is_true(G.check(function(a) return a:norm(p, { 1, 3 }) end, { x }), "p " .. p)
      end
      assert.is_true(G.check(function(a) return a:norm(math.huge, 2, true) end, { x }))
      assert.is_true(G.check(function(a) return a:logsumexp({ 2, 3 }) end, { x }))
      local y = inp({ 2, 3, 4 }, 12)
      local w = inp({ 4 }, 13)
      assert.is_true(G.check(function(a, b, c) return a:lerp(b, c) end, { x, y, w }))
      local b2 = inp({ 2, 4, 3 }, 14)
      local s = inp({ 3 }, 15)
      assert.is_true(G.check(function(a, b, c) return c:baddbmm(a, b, 0.5, 2) end, { x, b2, s }))
      local m = inp({ 3, 4 }, 16)
      local v = inp({ 4 }, 17)
      assert.is_true(G.check(function(a, b) return a:mv(b) end, { m, v }))
      assert.is_true(G.check(function(a, b) return a:outer(b) end, { v, s }))
      assert.is_true(G.check(function(a) return a:triu(1) end, { x }))
      assert.is_true(G.check(function(a) return a["repeat"](a, 2, 1, 1, 2) end, { x }))
   end)
end)

describe("composed methods: formats, dtypes, devices", function()
   local function cl()
      return dev((lm.arange(0, 2 * 3 * 4 * 5):double() * 0.37):sin():view({ 2, 3, 4, 5 })
         :contiguous(lm.channels_last))
   end
   it("tril / triu / nan_to_num keep channels-last; the norms and logsumexp reduce it", function()
      local x = cl()
      assert.is_true(x:tril():is_contiguous(lm.channels_last))
      assert.is_true(x:triu(-1):is_contiguous(lm.channels_last))
      assert.is_true(x:nan_to_num():is_contiguous(lm.channels_last))
      assert.is_true(x:tril():allclose(x:contiguous():tril()))
      assert.is_true(x:norm(2, 2):allclose(x:contiguous():norm(2, 2)))
      assert.is_true(x:logsumexp(2, true):allclose(x:contiguous():logsumexp(2, true)))
   end)

   it("16-bit and integer inputs", function()
      local h = dev(lm.tensor({ 1, -2, 3, 1 / 0 }, { dtype = lm.float16 }))
      assert.are.equal("float16", tostring(h:nan_to_num():dtype()))
      assert.are.same({ 1, -2, 3, 65504 }, vals(h:nan_to_num()))
      local bf = dev(lm.tensor({ 3, 4 }, { dtype = lm.bfloat16 }))
      assert.is_true(math.abs(bf:norm():item() - 5) < 1e-2)
      local i = dev(lm.tensor({ 1, 2, 3 }))
      assert.are.same({ false, false, false }, vals(i:isinf()))
      assert.are.same({ true, true, true }, vals(i:isfinite()))
      assert.are.equal("float32", tostring(i:logsumexp(1):dtype()))
      assert.are.same({ 1, 0, 1, 1 }, vals(dev(lm.ones({ 2, 2 }, { dtype = lm.int64 })):tril():view(-1)))
      local b = dev(lm.ones({ 2, 2 }, { dtype = lm.bool }))
      assert.are.same({ true, true, false, true }, vals(b:triu()))
      assert.is_true(dev(lm.ones({ 2, 3 })):t():tril():allclose(dev(lm.ones({ 3, 2 })):tril()))
   end)

   it("new_* take self's dtype and device unless told otherwise", function()
      local x = dev(lm.zeros({ 2 }, { dtype = lm.float64 }))
      local z = x:new_zeros({ 2, 3 })
      assert.are.equal("float64", tostring(z:dtype()))
      assert.are.equal(x:device(), z:device())
      assert.is_true(H.list_equal({ 2, 3 }, x:new_ones(2, 3):size()))
      assert.are.equal("int64", tostring(x:new_full({ 2 }, 7, { dtype = lm.int64 }):dtype()))
      assert.are.same({ 1, 2 }, vals(x:new_tensor({ 1, 2 })))
      assert.are.equal("float64", tostring(x:new_tensor({ 1, 2 }):dtype()))
      assert.is_true(H.list_equal({ 4 }, x:new_empty({ 4 }):size()))
      assert.is_false(x:new_ones(2).requires_grad == true)
   end)

   it("views: unbind, movedim, unflatten, swapaxes, broadcast_to share the storage", function()
      local x = dev(lm.arange(0, 24):double():view({ 2, 3, 4 }))
      local u = x:unbind(2)
      assert.are.equal(3, #u)
      assert.is_true(H.list_equal({ 2, 4 }, u[3]:size()))
      assert.is_true(u[3]:is_same_storage(x))
      assert.are.same(vals(x:select(2, 3)), vals(u[3]))
      assert.is_true(x:movedim(1, -1):is_same_storage(x))
      assert.is_true(x:unflatten(-1, { 2, 2 }):is_same_storage(x))
      assert.is_true(H.list_equal({ 5, 2, 3, 4 }, x:broadcast_to({ 5, 2, 3, 4 }):size()))
      assert.is_true(lm.moveaxis(x, 1, 2):equal(x:movedim(1, 2)))
      assert.is_true(lm.swapdims(x, 1, 2):equal(x:transpose(1, 2)))
   end)

   it("the random fills draw in range from lumen's generator", function()
      lm.manual_seed(5)
      local u = dev(lm.empty({ 1000 }, { dtype = lm.float64 })):uniform_(-2, 3)
      assert.is_true(u:min():item() >= -2 and u:max():item() < 3)
      lm.manual_seed(5)
      local u2 = dev(lm.empty({ 1000 }, { dtype = lm.float64 })):uniform_(-2, 3)
      assert.is_true(u:equal(u2))
      local n = dev(lm.empty({ 4000 })):normal_(3, 0.5)
      assert.is_true(math.abs(n:mean():item() - 3) < 0.05)
      local b = dev(lm.empty({ 4000 })):bernoulli_(0.25)
      assert.is_true(math.abs(b:mean():item() - 0.25) < 0.03)
      local r = dev(lm.empty({ 1000 }, { dtype = lm.int64 })):random_(3, 7)
      assert.are.equal(3, r:min():item())
      assert.are.equal(6, r:max():item())
      local c4 = dev(lm.empty({ 2, 3, 4, 5 })):contiguous(lm.channels_last):normal_()
      assert.is_true(c4:is_contiguous(lm.channels_last))
   end)
end)

describe("composed methods: bad input", function()
   it("names the function and the problem", function()
      local x = dev(lm.ones({ 2, 3 }))
      local v = dev(lm.ones({ 3 }))
      raises("lumen.softmax: dim is required", function() x:softmax() end)
      raises("lumen.norm: p must be a number", function() x:norm("two") end)
      raises("lumen.norm: the nuclear norm", function() x:norm("nuc") end)
      raises("lumen.norm: expected a floating point input", function()
         dev(lm.ones({ 2 }, { dtype = lm.int64 })):norm()
      end)
      raises("lumen.norm: unknown option 'ord'", function() x:norm({ ord = 2 }) end)
      raises("lumen.logsumexp: dim 3 out of range", function() x:logsumexp(3) end)
      raises("lumen.logsumexp: keepdim must be a boolean", function() x:logsumexp(1, 1) end)
      raises("lumen.bmm: batch1 must be a 3%-D tensor", function() x:bmm(x) end)
      raises("lumen.bmm: expected batch2 of size 2x3x", function()
         dev(lm.ones({ 2, 2, 3 })):bmm(dev(lm.ones({ 2, 4, 3 })))
      end)
      raises("lumen.bmm: expected batch1 and batch2 to have the same dtype", function()
         dev(lm.ones({ 1, 2, 2 })):bmm(dev(lm.ones({ 1, 2, 2 }, { dtype = lm.float64 })))
      end)
      raises("lumen.addmm: mat1 and mat2 shapes cannot be multiplied %(2x3 and 2x3%)", function()
         x:addmm(x, x)
      end)
      raises("lumen.addmm: self of size 4 does not broadcast", function()
         dev(lm.ones({ 4 })):addmm(x, x:t())
      end)
      raises("lumen.addmm: unknown option 'gamma'", function() x:addmm(x, x:t(), { gamma = 1 }) end)
      raises("lumen.mv: size mismatch", function() x:mv(dev(lm.ones({ 2 }))) end)
      raises("lumen.dot: self and other must have the same size, got 3 and 2", function()
         v:dot(dev(lm.ones({ 2 })))
      end)
      raises("lumen.outer: vec2 must be a 1%-D tensor", function() v:outer(x) end)
      raises("lumen.tril: input must be at least 2%-D", function() v:tril() end)
      raises("lumen.triu: diagonal must be an integer", function() x:triu(0.5) end)
      raises("lumen.lerp: weight must be a number or a tensor", function() x:lerp(x, "a") end)
      raises("lumen.lerp: end must be a tensor", function() x:lerp(1, 0.5) end)
      raises("lumen.nan_to_num: posinf must be a number", function() x:nan_to_num(0, "big") end)
      raises("lumen.unbind: cannot unbind a 0%-dim tensor", function()
         dev(lm.tensor(1)):unbind()
      end)
      raises("lumen.movedim: repeated dim in source", function() x:movedim({ 1, 1 }, { 1, 2 }) end)
      raises("lumen.movedim: source and destination must have the same number", function()
         x:movedim({ 1, 2 }, { 1 })
      end)
      raises("lumen.unflatten: sizes {4, %-1} do not multiply", function()
         x:unflatten(2, { 4, -1 })
      end)
      raises("lumen.unflatten: only one size may be %-1", function() x:unflatten(2, { -1, -1 }) end)
      raises("lumen.repeat: number of repeat dims %(1%) can not be smaller", function()
         x:repeatTensor(2)
      end)
      raises("lumen.repeat: repeats%[1%] must be an integer", function() x:repeatTensor(1.5, 1) end)
      raises("lumen.new_full: sizes must be a table", function() x:new_full(2, 1) end)
      raises("lumen.uniform_: expects from <= to", function() x:uniform_(2, 1) end)
      raises("lumen.uniform_: expected a floating point tensor", function()
         dev(lm.ones({ 2 }, { dtype = lm.int64 })):uniform_()
      end)
      raises("lumen.normal_: expects std >= 0", function() x:normal_(0, -1) end)
      raises("lumen.bernoulli_: expects 0 <= p <= 1", function() x:bernoulli_(2) end)
      raises("lumen.random_: give the range", function() x:random_() end)
      local leaf = dev(lm.ones({ 2 })):requires_grad_(true)
      raises("lumen.normal_: a leaf tensor that requires grad", function() leaf:normal_() end)
      lm.no_grad(function() leaf:normal_() end)
      raises("lumen.isinf: self must be a tensor", function() lm.isinf(3) end)
      raises("lumen.nonzero: unknown option 'as_list'", function() x:nonzero({ as_list = true }) end)
      raises("lumen.masked_select: mask must be a bool tensor", function() x:masked_select(x) end)
      raises("lumen.masked_select: the mask's size does not broadcast", function()
         x:masked_select(dev(lm.ones({ 4 }, { dtype = lm.bool })))
      end)
      -- an empty selection is an empty 1-D tensor, and no coordinates
      assert.are.equal(0, x:masked_select(x:gt(5)):numel())
      assert.is_true(H.list_equal({ 0, 2 }, dev(lm.zeros(2, 3)):nonzero():size()))
   end)
end)
