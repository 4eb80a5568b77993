-- lumen.autograd.elementwise -- the backward rules of the elementwise Tensor methods: binary
-- (add, sub, mul, div, pow, maximum, minimum), unary (neg, exp, log, relu, ..., clamp), their
-- in-place forms (add_, relu_, copy_, fill_, addcmul_, ...) and the ternary ops (addcmul,
-- addcdiv, where). Loading it replaces those methods of lumen.tensor's Tensor table (and
-- T.where) with differentiable versions over the raw forward functions (lumen.tensor.raw);
-- lumen.autograd loads it once. Returns { where = the differentiable where, clamp_mask = clamp's
-- gradient mask }.

local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type, rawget, rawset, pairs = type, rawget, rawset, pairs

local Tensor, raw, argerror, is_tensor = T.Tensor, T.raw, T.argerror, T.is_tensor
local grad_enabled = G.is_grad_enabled
local needs, edge, attach, meta, sum_to = G.needs, G.edge, G.attach, G.meta, G.sum_to

local R = {}

local function scalar_or_tensor_needs(a, b)
   return needs(a) or needs(b)
end

-- binary ops: add, sub, mul, div, pow, maximum, minimum -----------------------------------

do
   local r_add, r_sub, r_mul, r_div, r_pow = raw.add, raw.sub, raw.mul, raw.div, raw.pow
   local r_neg = raw.neg

   local function rec_add(out, a, b, alpha)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      local al = alpha or 1
      attach(out, "AddBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(g, ma) end
         if need_b then gb = sum_to(al == 1 and g or r_mul(g, al), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.add(a, b, alpha)
      local out = r_add(a, b, alpha)
      if grad_enabled() and scalar_or_tensor_needs(a, b) then rec_add(out, a, b, alpha) end
      return out
   end

   local function rec_sub(out, a, b, alpha)
      local ma, mb = meta(a, out), meta(b, out)
      local al = alpha or 1
      local need_a, need_b = needs(a), needs(b)
      attach(out, "SubBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(g, ma) end
         if need_b then gb = sum_to(al == 1 and r_neg(g) or r_mul(g, -al), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.sub(a, b, alpha)
      local out = r_sub(a, b, alpha)
      if grad_enabled() and scalar_or_tensor_needs(a, b) then rec_sub(out, a, b, alpha) end
      return out
   end

   local function rec_mul(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local sa = needs(b) and a or nil     -- save only what the other gradient needs
      local sb = needs(a) and b or nil
      attach(out, "MulBackward", function(g)
         local ga, gb
         if sb ~= nil then ga = sum_to(r_mul(g, sb), ma) end
         if sa ~= nil then gb = sum_to(r_mul(g, sa), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.mul(a, b)
      local out = r_mul(a, b)
      if grad_enabled() and scalar_or_tensor_needs(a, b) then rec_mul(out, a, b) end
      return out
   end

   local function rec_div(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      local sout = need_b and out or nil
      attach(out, "DivBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_div(g, b), ma) end
         if need_b then gb = sum_to(r_neg(r_div(r_mul(g, sout), b)), mb) end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.div(a, b)
      local out = r_div(a, b)
      if grad_enabled() and scalar_or_tensor_needs(a, b) then rec_div(out, a, b) end
      return out
   end

   local function rec_pow(out, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "PowBackward", function(g)
         local ga, gb
         if need_a then
            -- d/da a^b = b * a^(b-1); b == 0 gives 0 (PyTorch masks it)
            if type(b) == "number" then
               if b == 0 then ga = r_mul(g, 0)
               elseif b == 1 then ga = g
               elseif b == 2 then ga = r_mul(r_mul(g, a), 2)
               else ga = r_mul(r_mul(g, r_pow(a, b - 1)), b) end
            else
               ga = r_mul(r_mul(g, b), r_pow(a, r_sub(b, 1)))
            end
            ga = sum_to(ga, ma)
         end
         if need_b then
            -- d/db a^b = a^b * log(a)
            local la = type(a) == "number" and math.log(a) or raw.log(a)
            gb = sum_to(r_mul(r_mul(g, out), la), mb)
         end
         return ga, gb
      end, { edge(a), edge(b) })
   end
   function Tensor.pow(a, b)
      local out = r_pow(a, b)
      if grad_enabled() and scalar_or_tensor_needs(a, b) then rec_pow(out, a, b) end
      return out
   end

   local function minmax_binary(name, rf, cmp)
      local function rec(out, a, b)
         local ma, mb = meta(a, out), meta(b, out)
         attach(out, name, function(g)
            -- ties split the gradient in half, as PyTorch does
            local ga, gb
            local wa = raw.add(raw.mul(cmp(a, b), 1.0), raw.mul(raw.eq(a, b), -0.5))
            if is_tensor(a) and needs(a) then ga = sum_to(r_mul(g, wa), ma) end
            if is_tensor(b) and needs(b) then
               gb = sum_to(r_mul(g, raw.sub(1, wa)), mb)
            end
            return ga, gb
         end, { edge(a), edge(b) })
      end
      return function(a, b)
         local out = rf(a, b)
         if grad_enabled() and scalar_or_tensor_needs(a, b) then rec(out, a, b) end
         return out
      end
   end
   Tensor.maximum = minmax_binary("MaximumBackward", raw.maximum, raw.ge)
   Tensor.minimum = minmax_binary("MinimumBackward", raw.minimum, raw.le)
end

-- unary ops --------------------------------------------------------------------------------

do
   local r_mul, r_div = raw.mul, raw.div
   local LN2, LN10, TWO_OVER_SQRT_PI = math.log(2), math.log(10), 2 / math.sqrt(math.pi)
   -- name -> { save = "x" | "out", grad = function(g, saved) }
   local unary = {
      neg = { grad = function(g) return raw.neg(g) end },
      exp = { save = "out", grad = function(g, y) return r_mul(g, y) end },
      log = { save = "x", grad = function(g, x) return r_div(g, x) end },
      sqrt = { save = "out", grad = function(g, y) return r_div(g, r_mul(y, 2)) end },
      rsqrt = { save = "out", grad = function(g, y)
         return r_mul(r_mul(g, raw.mul(raw.mul(y, y), y)), -0.5) end },
      abs = { save = "x", grad = function(g, x) return r_mul(g, raw.sign(x)) end },
      relu = { save = "out", grad = function(g, y) return raw.relu_backward(g, y) end },
      sigmoid = { save = "out", grad = function(g, y) return raw.sigmoid_backward(g, y) end },
      tanh = { save = "out", grad = function(g, y) return raw.tanh_backward(g, y) end },
      square = { save = "x", grad = function(g, x) return r_mul(r_mul(g, x), 2) end },
      reciprocal = { save = "out", grad = function(g, y)
         return raw.neg(r_mul(g, r_mul(y, y))) end },
      sin = { save = "x", grad = function(g, x) return r_mul(g, raw.cos(x)) end },
      cos = { save = "x", grad = function(g, x) return raw.neg(r_mul(g, raw.sin(x))) end },
      log1p = { save = "x", grad = function(g, x) return r_div(g, raw.add(x, 1)) end },
      expm1 = { save = "out", grad = function(g, y) return r_mul(g, raw.add(y, 1)) end },
      sign = { grad = function(g) return r_mul(g, 0) end },
      floor = { grad = function(g) return r_mul(g, 0) end },
      ceil = { grad = function(g) return r_mul(g, 0) end },
      round = { grad = function(g) return r_mul(g, 0) end },
      -- more math: PyTorch's derivatives (tools/autograd/derivatives.yaml)
      trunc = { grad = function(g) return r_mul(g, 0) end },
      log2 = { save = "x", grad = function(g, x) return r_div(g, r_mul(x, LN2)) end },
      log10 = { save = "x", grad = function(g, x) return r_div(g, r_mul(x, LN10)) end },
      exp2 = { save = "out", grad = function(g, y) return r_mul(g, r_mul(y, LN2)) end },
      tan = { save = "out", grad = function(g, y)
         return r_mul(g, raw.add(r_mul(y, y), 1)) end },
      asin = { save = "x", grad = function(g, x)
         return r_mul(g, raw.rsqrt(raw.add(raw.neg(r_mul(x, x)), 1))) end },
      acos = { save = "x", grad = function(g, x)
         return raw.neg(r_mul(g, raw.rsqrt(raw.add(raw.neg(r_mul(x, x)), 1)))) end },
      atan = { save = "x", grad = function(g, x) return r_div(g, raw.add(r_mul(x, x), 1)) end },
      sinh = { save = "x", grad = function(g, x) return r_mul(g, raw.cosh(x)) end },
      cosh = { save = "x", grad = function(g, x) return r_mul(g, raw.sinh(x)) end },
      asinh = { save = "x", grad = function(g, x)
         return r_mul(g, raw.rsqrt(raw.add(r_mul(x, x), 1))) end },
      acosh = { save = "x", grad = function(g, x)
         return r_mul(g, raw.rsqrt(raw.sub(r_mul(x, x), 1))) end },
      atanh = { save = "x", grad = function(g, x)
         return r_div(g, raw.add(raw.neg(r_mul(x, x)), 1)) end },
      erf = { save = "x", grad = function(g, x)
         return r_mul(g, r_mul(raw.exp(raw.neg(r_mul(x, x))), TWO_OVER_SQRT_PI)) end },
      erfc = { save = "x", grad = function(g, x)
         return r_mul(g, r_mul(raw.exp(raw.neg(r_mul(x, x))), -TWO_OVER_SQRT_PI)) end },
   }
   local function titled(name)
      return (name:gsub("^%l", string.upper):gsub("_(%l)", string.upper)) .. "Backward"
   end
   for name, spec in pairs(unary) do
      local f = raw[name]
      local grad = spec.grad
      local bname = titled(name)
      -- (the closures are made in rec, not in the method: a function that makes closures is
      -- not compiled by LuaJIT past its returns, and these methods are on every hot path)
      if spec.save == "x" then
         local function rec(out, self)
            attach(out, bname, function(g) return grad(g, self) end, { edge(self) })
         end
         Tensor[name] = function(self)
            local out = f(self)
            if grad_enabled() and needs(self) then rec(out, self) end
            return out
         end
      elseif spec.save == "out" then
         local function rec(out, self)
            attach(out, bname, function(g) return grad(g, out) end, { edge(self) })
         end
         Tensor[name] = function(self)
            local out = f(self)
            if grad_enabled() and needs(self) then rec(out, self) end
            return out
         end
      else
         Tensor[name] = function(self)
            local out = f(self)
            if grad_enabled() and needs(self) then
               attach(out, bname, grad, { edge(self) })
            end
            return out
         end
      end
   end

   local r_clamp = raw.clamp
   local function clamp_mask(x, lo, hi)
      -- gradient flows where lo <= x <= hi (PyTorch)
      local m
      if lo ~= nil then m = raw.ge(x, lo) end
      if hi ~= nil then
         local mh = raw.le(x, hi)
         m = m and raw.logical_and(m, mh) or mh
      end
      return m
   end
   local function rec_clamp(out, self, lo, hi)
      attach(out, "ClampBackward", function(g)
         return r_mul(g, clamp_mask(self, lo, hi))
      end, { edge(self) })
   end
   function Tensor.clamp(self, lo, hi)
      local out = r_clamp(self, lo, hi)
      if grad_enabled() and needs(self) then rec_clamp(out, self, lo, hi) end
      return out
   end
   Tensor.clip = Tensor.clamp
   R.clamp_mask = clamp_mask
end

-- in-place ops -----------------------------------------------------------------------------

local function inplace_check(self, fname)
   if needs(self) and rawget(self, "grad_fn") == nil then
      argerror(fname, "a leaf tensor that requires grad is being used in an in-place operation")
   end
end

-- rebase self onto a new node whose first input is self's previous history
local function rebase(self, name, backward, other_edges)
   local inputs = { edge(self) }
   if other_edges then
      for i = 1, #other_edges do inputs[i + 1] = other_edges[i] end
   end
   attach(self, name, backward, inputs)
end

do
   local r_mul, r_div = raw.mul, raw.div
   local function inplace_binary(name, rawf, bname)
      local function slow(self, b, alpha)
         inplace_check(self, name)
         local need_self, need_b = needs(self), needs(b)
         local mb = is_tensor(b) and meta(b, self) or false
         local old                 -- the value of self before the op, when a gradient needs it
         if (name == "mul_" and need_b) or (name == "div_" and need_b) then
            old = raw.clone(self)
         end
         local bsave = (name == "mul_" or name == "div_") and b or nil
         rawf(self, b, alpha)
         local al = alpha or 1
         rebase(self, bname, function(g)
            local gs, gb
            if name == "add_" then
               gs = need_self and g or nil
               if need_b then gb = sum_to(al == 1 and g or r_mul(g, al), mb) end
            elseif name == "sub_" then
               gs = need_self and g or nil
               if need_b then gb = sum_to(r_mul(g, -al), mb) end
            elseif name == "mul_" then
               if need_self then gs = r_mul(g, bsave) end
               if need_b then gb = sum_to(r_mul(g, old), mb) end
            else -- div_
               if need_self then gs = r_div(g, bsave) end
               if need_b then
                  gb = sum_to(raw.neg(r_div(r_mul(g, old), r_mul(bsave, bsave))), mb)
               end
            end
            return gs, gb
         end, { edge(b) })
         return self
      end
      return function(self, b, alpha)
         if not grad_enabled() or not (needs(self) or needs(b)) then
            return rawf(self, b, alpha)
         end
         return slow(self, b, alpha)
      end
   end
   Tensor.add_ = inplace_binary("add_", raw.add_, "AddBackward")
   Tensor.sub_ = inplace_binary("sub_", raw.sub_, "SubBackward")
   Tensor.mul_ = inplace_binary("mul_", raw.mul_, "MulBackward")
   Tensor.div_ = inplace_binary("div_", raw.div_, "DivBackward")

   local function inplace_unary(name, rawf, bname, grad)     -- grad(g, out)
      local function slow(self)
         inplace_check(self, name)
         rawf(self)
         rebase(self, bname, function(g) return grad(g, self) end)
         return self
      end
      return function(self)
         if not grad_enabled() or not needs(self) then return rawf(self) end
         return slow(self)
      end
   end
   local relu_plain = inplace_unary("relu_", raw.relu_, "ReluBackward",
      function(g, y) return raw.relu_backward(g, y) end)
   -- relu_ of a batch norm's result (nn.ReLU(true) after nn.BatchNorm2d): the node's relu_fuse
   -- (functional/norm.lua) gives a backward that masks the gradient by the relu's output inside
   -- the batch norm's backward, which then replaces both nodes. Not when a hook watches the
   -- batch norm's result (it would miss its gradient). The batch norm's own node stays as it was
   -- for any other user of the pre-relu values.
   local function slow_relu_(self)
      local node = rawget(self, "grad_fn")
      local fuse = node and rawget(node, "relu_fuse")
      if fuse == nil or rawget(node, "_hooks") or node.backward == nil then
         return relu_plain(self)
      end
      raw.relu_(self)
      local inputs = {}
      for i = 1, #node.inputs do inputs[i] = node.inputs[i] end
      attach(self, "NativeBatchNormReluBackward", fuse(self), inputs)
      return self
   end
   function Tensor.relu_(self)
      if not grad_enabled() or not needs(self) then return raw.relu_(self) end
      return slow_relu_(self)
   end
   Tensor.sigmoid_ = inplace_unary("sigmoid_", raw.sigmoid_, "SigmoidBackward",
      function(g, y) return raw.sigmoid_backward(g, y) end)
   Tensor.tanh_ = inplace_unary("tanh_", raw.tanh_, "TanhBackward",
      function(g, y) return raw.tanh_backward(g, y) end)
   Tensor.exp_ = inplace_unary("exp_", raw.exp_, "ExpBackward",
      function(g, y) return r_mul(g, y) end)
   Tensor.neg_ = inplace_unary("neg_", raw.neg_, "NegBackward",
      function(g) return raw.neg(g) end)

   local function slow_clamp_(self, lo, hi)
      inplace_check(self, "clamp_")
      local mask = R.clamp_mask(self, lo, hi)
      raw.clamp_(self, lo, hi)
      rebase(self, "ClampBackward", function(g) return r_mul(g, mask) end)
      return self
   end
   function Tensor.clamp_(self, lo, hi)
      if not grad_enabled() or not needs(self) then
         return raw.clamp_(self, lo, hi)
      end
      return slow_clamp_(self, lo, hi)
   end

   -- fill_ / zero_: the old value gets no gradient
   local function inplace_fill(name, rawf)
      return function(self, ...)
         if not grad_enabled() or not needs(self) then return rawf(self, ...) end
         inplace_check(self, name)
         rawf(self, ...)
         rawset(self, "grad_fn", nil)
         rawset(self, "requires_grad", nil)
         return self
      end
   end
   Tensor.fill_ = inplace_fill("fill_", raw.fill_)
   Tensor.zero_ = inplace_fill("zero_", raw.zero_)

   local function slow_copy_(self, src)
      inplace_check(self, "copy_")
      raw.copy_(self, src)
      local ms = meta(src, self)
      if not needs(src) then
         rawset(self, "grad_fn", nil)
         rawset(self, "requires_grad", nil)
         return self
      end
      attach(self, "CopyBackward", function(g) return nil, sum_to(g, ms) end,
             { false, edge(src) })
      return self
   end
   function Tensor.copy_(self, src)
      if not grad_enabled() or not (needs(self) or needs(src)) then
         return raw.copy_(self, src)
      end
      return slow_copy_(self, src)
   end

   local function slow_addcmul_(self, a, b, value)
      inplace_check(self, "addcmul_")
      local v = value or 1
      local ma, mb = meta(a, self), meta(b, self)
      raw.addcmul_(self, a, b, value)
      rebase(self, "AddcmulBackward", function(g)
         local ga, gb
         if needs(a) then ga = sum_to(r_mul(r_mul(g, b), v), ma) end
         if needs(b) then gb = sum_to(r_mul(r_mul(g, a), v), mb) end
         return g, ga, gb
      end, { edge(a), edge(b) })
      return self
   end
   function Tensor.addcmul_(self, a, b, value)
      if not grad_enabled() or not (needs(self) or needs(a) or needs(b)) then
         return raw.addcmul_(self, a, b, value)
      end
      return slow_addcmul_(self, a, b, value)
   end
end

-- ternary ops ------------------------------------------------------------------------------

do
   local r_mul, r_div = raw.mul, raw.div
   local function rec_addcmul(out, self, a, b, value)
      local v = value or 1
      local ms, ma, mb = meta(self, out), meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "AddcmulBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_mul(r_mul(g, b), v), ma) end
         if need_b then gb = sum_to(r_mul(r_mul(g, a), v), mb) end
         return sum_to(g, ms), ga, gb
      end, { edge(self), edge(a), edge(b) })
   end
   function Tensor.addcmul(self, a, b, value)
      local out = raw.addcmul(self, a, b, value)
      if grad_enabled() and (needs(self) or needs(a) or needs(b)) then
         rec_addcmul(out, self, a, b, value)
      end
      return out
   end

   local function rec_addcdiv(out, self, a, b, value)
      local v = value or 1
      local ms, ma, mb = meta(self, out), meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "AddcdivBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_mul(r_div(g, b), v), ma) end
         if need_b then
            gb = sum_to(r_mul(r_div(r_mul(g, a), r_mul(b, b)), -v), mb)
         end
         return sum_to(g, ms), ga, gb
      end, { edge(self), edge(a), edge(b) })
   end
   function Tensor.addcdiv(self, a, b, value)
      local out = raw.addcdiv(self, a, b, value)
      if grad_enabled() and (needs(self) or needs(a) or needs(b)) then
         rec_addcdiv(out, self, a, b, value)
      end
      return out
   end

   local r_where = raw.where
   local function rec_where(out, cond, a, b)
      local ma, mb = meta(a, out), meta(b, out)
      local need_a, need_b = needs(a), needs(b)
      attach(out, "WhereBackward", function(g)
         local ga, gb
         if need_a then ga = sum_to(r_where(cond, g, 0), ma) end
         if need_b then gb = sum_to(r_where(cond, 0, g), mb) end
         return nil, ga, gb
      end, { false, edge(a), edge(b) })
   end
   local function where(cond, a, b)
      local out = r_where(cond, a, b)
      if grad_enabled() and (needs(a) or needs(b)) then rec_where(out, cond, a, b) end
      return out
   end
   T.where = where
   R.where = where
end

return R
