-- lumen.autograd.composed_math -- the math Tensor methods a PyTorch user reaches for on day one,
-- composed from differentiable ops (tinygrad's rule: compose in Lua before writing C):
--   softmax / log_softmax (the methods of F.softmax / F.log_softmax), logsumexp, norm,
--   isinf / isposinf / isneginf / isfinite, nan_to_num, lerp, clamp_min / clamp_max,
--   bmm / baddbmm / addmm / mv / dot / outer (through matmul), tril / triu.
-- Values, formats, devices and gradients come from the ops they are made of; norm and logsumexp
-- have their own backward (PyTorch's formulas), where the composition would divide by zero or
-- overflow. lumen.autograd loads it once, after the families it composes.

local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local type, tostring, pairs, math = type, tostring, pairs, math

local Tensor, raw, argerror = T.Tensor, T.raw, T.argerror
local grad_enabled, needs, record = G.is_grad_enabled, G.needs, G.record

local M = {}

local FLOATS = { float32 = true, float64 = true, float16 = true, bfloat16 = true }

local function dtname(t) return tostring(Tensor.dtype(t)) end

local tensor_arg = require("lumen.autograd.composed").tensor_arg

local function F() return require("lumen.functional") end

-- y in self's memory format (composed.lua's)
local keep_format = require("lumen.autograd.composed").keep_format

-- self's sizes without the dims of set (0-based)
local function reduced_sizes(self, set)
   local sizes, out = Tensor.size(self), {}
   for i = 1, #sizes do
      if not set[i - 1] then out[#out + 1] = sizes[i] end
   end
   return out
end

local dim_list = require("lumen.autograd.composed").dim_list

-- g (reduced without keepdim) viewed with the reduced dims back as size 1, to broadcast against x
local function unreduce(g, self, set, keepdim)
   if keepdim then return g end
   local sizes = Tensor.size(self)
   local keep = {}
   for i = 1, #sizes do keep[i] = set[i - 1] and 1 or sizes[i] end
   return raw.reshape(g, keep)
end

local function check_keepdim(fname, keepdim)
   if keepdim ~= nil and type(keepdim) ~= "boolean" then
      argerror(fname, "keepdim must be a boolean, got " .. T.typename(keepdim))
   end
   return keepdim == true
end

---------------------------------------------------------------------------------------------
-- softmax / log_softmax as methods, logsumexp
---------------------------------------------------------------------------------------------

-- t:softmax(dim, dtype): F.softmax(t, dim), after a cast to dtype when given (PyTorch's dtype=)
local function softmax_method(name)
   return function(self, dim, dtype)
      tensor_arg(name, self)
      if dim == nil then argerror(name, "dim is required (the dim to normalize over)") end
      if dtype ~= nil then self = Tensor.to(self, dtype) end
      return F()[name](self, dim)
   end
end
Tensor.softmax = softmax_method("softmax")
Tensor.log_softmax = softmax_method("log_softmax")

-- logsumexp(dim, keepdim): log(sum(exp(x))) over dim (a number or a list; nil: every dim),
-- computed as PyTorch's: max + log(sum(exp(x - max))) with an infinite max taken as 0, so a row
-- of -inf gives -inf and a +inf gives +inf; integers are promoted to float32. Gradient
-- g * exp(x - result) (PyTorch's logsumexp_backward).
function Tensor.logsumexp(self, dim, keepdim)
   tensor_arg("logsumexp", self)
   local kd = check_keepdim("logsumexp", keepdim)
   local _, set = dim_list("logsumexp", self, dim)
   if not FLOATS[dtname(self)] then self = Tensor.to(self, "float32") end
   local function forward(x)
      local m = raw.amax(x, dim, true)
      m = raw.where(raw.eq(raw.abs(m), math.huge), 0, m)
      local s = raw.log(raw.sum(raw.exp(raw.sub(x, m)), dim, true))
      local out = raw.add(s, m)
      if not kd then out = raw.reshape(out, reduced_sizes(x, set)) end
      return out
   end
   if Tensor.numel(self) == 0 then
      -- PyTorch: the logsumexp of nothing is -inf; sum keeps the reduced sizes right
      return Tensor.log(Tensor.sum(Tensor.exp(self), dim, kd))
   end
   if not (grad_enabled() and needs(self)) then return forward(self) end
   local out = G.no_grad(function() return forward(Tensor.detach(self)) end)
   record(out, "LogsumexpBackward", function(g)
      local o = unreduce(out, self, set, kd)
      return raw.mul(unreduce(g, self, set, kd), raw.exp(raw.sub(self, o)))
   end, self)
   return out
end

---------------------------------------------------------------------------------------------
-- norm
---------------------------------------------------------------------------------------------

-- t:norm(p, dim, keepdim, dtype): the vector p-norm over dim (nil: every element), as
-- torch.norm / torch.linalg.vector_norm: p a number (2 by default; math.huge and -math.huge for
-- the max / min of |x|; 0 counts the non-zeros) or "fro" (2). The backward is PyTorch's
-- (linalg_vector_norm_backward): 0 where the norm is 0, the max norm's gradient split evenly
-- among the elements that reach it.
function Tensor.norm(self, p, dim, keepdim, dtype)
   tensor_arg("norm", self)
   if type(p) == "table" and not T.is_tensor(p) then
      -- an options table {p =, dim =, keepdim =, dtype =}
      for k in pairs(p) do
         if k ~= "p" and k ~= "dim" and k ~= "keepdim" and k ~= "dtype" then
            argerror("norm", "unknown option '" .. tostring(k) .. "'")
         end
      end
      p, dim, keepdim, dtype = p.p, p.dim, p.keepdim, p.dtype
   end
   if p == nil or p == "fro" then
      p = 2
   elseif p == "nuc" then
      argerror("norm", "the nuclear norm ('nuc') needs a singular value decomposition, which " ..
               "lumen does not have")
   elseif type(p) ~= "number" or p ~= p then
      argerror("norm", "p must be a number, 'fro' or nil, got " .. tostring(p))
   end
   if dtype ~= nil then self = Tensor.to(self, dtype) end
   if not FLOATS[dtname(self)] then
      argerror("norm", "expected a floating point input (or dtype =), got " .. dtname(self))
   end
   local kd = check_keepdim("norm", keepdim)
   local _, set = dim_list("norm", self, dim)
   local function forward(x)
      if p == math.huge or p == -math.huge then
         if Tensor.numel(x) == 0 then
            argerror("norm", "the infinity norm of an empty tensor has no identity to return")
         end
         local a = raw.abs(x)
         return p > 0 and raw.amax(a, dim, kd) or raw.amin(a, dim, kd)
      elseif p == 0 then
         return raw.sum(Tensor.to(raw.ne(x, 0), Tensor.dtype(x)), dim, kd)
      elseif p == 1 then
         return raw.sum(raw.abs(x), dim, kd)
      elseif p == 2 then
         return raw.sqrt(raw.sum(raw.mul(x, x), dim, kd))
      end
      return raw.pow(raw.sum(raw.pow(raw.abs(x), p), dim, kd), 1 / p)
   end
   if not (grad_enabled() and needs(self)) then return forward(self) end
   local out = G.no_grad(function() return forward(Tensor.detach(self)) end)
   record(out, "NormBackward", function(g)
      local x = self
      local n, gk = unreduce(out, x, set, kd), unreduce(g, x, set, kd)
      if p == 0 then return raw.mul(x, 0) end
      if p == 1 then return raw.mul(raw.sign(x), gk) end
      if p == 2 then
         return raw.mul(x, raw.where(raw.eq(n, 0), 0, raw.div(gk, n)))
      end
      if p == math.huge or p == -math.huge then
         local a = raw.abs(x)
         local mask = raw.logical_or(raw.eq(a, n), raw.isnan(a))
         local count = raw.sum(mask, dim, true)
         local share = raw.div(gk, count)
         return raw.mul(raw.sign(x), raw.where(mask, share, 0))
      end
      local a = raw.abs(x)
      if p < 1 then
         local scaled = raw.where(raw.eq(x, 0), 0, raw.mul(raw.sign(x), raw.pow(a, p - 1)))
         return raw.mul(raw.mul(scaled, gk), raw.pow(n, 1 - p))
      end
      local scaled = p < 2 and raw.mul(raw.sign(x), raw.pow(a, p - 1))
         or raw.mul(x, raw.pow(a, p - 2))
      local sv = raw.where(raw.eq(n, 0), 0, raw.div(gk, raw.pow(n, p - 1)))
      return raw.mul(scaled, sv)
   end, self)
   return out
end

---------------------------------------------------------------------------------------------
-- isinf / isfinite / nan_to_num, lerp, clamp_min / clamp_max
---------------------------------------------------------------------------------------------

local function is_float(t) return FLOATS[dtname(t)] end

-- the bool masks; integer and bool tensors are finite everywhere
function Tensor.isinf(self)
   tensor_arg("isinf", self)
   if not is_float(self) then return raw.ne(self, self) end
   return raw.eq(raw.abs(self), math.huge)
end
function Tensor.isposinf(self)
   tensor_arg("isposinf", self)
   if not is_float(self) then return raw.ne(self, self) end
   return raw.eq(self, math.huge)
end
function Tensor.isneginf(self)
   tensor_arg("isneginf", self)
   if not is_float(self) then return raw.ne(self, self) end
   return raw.eq(self, -math.huge)
end
-- x - x is 0 for every finite x and NaN for NaN and both infinities
function Tensor.isfinite(self)
   tensor_arg("isfinite", self)
   if not is_float(self) then return raw.eq(self, self) end
   return raw.eq(raw.sub(self, self), 0)
end

-- the largest finite value of each float dtype (torch.finfo(dtype).max)
local FINFO_MAX = {
   float32 = 3.4028234663852886e38, float64 = 1.7976931348623157e308, float16 = 65504,
   bfloat16 = 3.3895313892515355e38,
}

local function opt_number(fname, v, what)
   if v ~= nil and type(v) ~= "number" then
      argerror(fname, ("%s must be a number or nil, got %s"):format(what, T.typename(v)))
   end
   return v
end

-- nan_to_num(nan = 0, posinf = dtype max, neginf = dtype lowest): self's sizes, dtype and
-- format; the gradient flows where self is finite (PyTorch's grad * isfinite(self))
function Tensor.nan_to_num(self, nan, posinf, neginf)
   tensor_arg("nan_to_num", self)
   if type(nan) == "table" then
      for k in pairs(nan) do
         if k ~= "nan" and k ~= "posinf" and k ~= "neginf" then
            argerror("nan_to_num", "unknown option '" .. tostring(k) .. "'")
         end
      end
      nan, posinf, neginf = nan.nan, nan.posinf, nan.neginf
   end
   nan = opt_number("nan_to_num", nan, "nan") or 0
   posinf = opt_number("nan_to_num", posinf, "posinf")
   neginf = opt_number("nan_to_num", neginf, "neginf")
   if not is_float(self) then return Tensor.clone(self) end
   local big = FINFO_MAX[dtname(self)]
   local y = T.where(Tensor.isnan(self), nan, self)
   y = T.where(Tensor.eq(self, math.huge), posinf or big, y)
   y = T.where(Tensor.eq(self, -math.huge), neginf or -big, y)
   return keep_format(y, self)
end

-- lerp(end, weight): self + weight * (end - self), with PyTorch's two forms (end - (end - self) *
-- (1 - weight) where |weight| >= 0.5, which keeps lerp(a, b, 1) == b); PyTorch's vectorized CPU
-- kernel fuses the multiply-add, so float32 results may differ from it in the last bit
function Tensor.lerp(self, finish, weight)
   tensor_arg("lerp", self)
   tensor_arg("lerp", finish, "end")
   if type(weight) ~= "number" and not T.is_tensor(weight) then
      argerror("lerp", "weight must be a number or a tensor, got " .. T.typename(weight))
   end
   local diff = Tensor.sub(finish, self)
   if type(weight) == "number" then
      if math.abs(weight) < 0.5 then return Tensor.add(self, Tensor.mul(diff, weight)) end
      return Tensor.sub(finish, Tensor.mul(diff, 1 - weight))
   end
   local lo = Tensor.add(self, Tensor.mul(diff, weight))
   local hi = Tensor.sub(finish, Tensor.mul(diff, Tensor.sub(1, weight)))
   return T.where(Tensor.lt(Tensor.abs(weight), 0.5), lo, hi)
end

function Tensor.clamp_min(self, min) return Tensor.clamp(self, min, nil) end
function Tensor.clamp_max(self, max) return Tensor.clamp(self, nil, max) end
function Tensor.clamp_min_(self, min) return Tensor.clamp_(self, min, nil) end
function Tensor.clamp_max_(self, max) return Tensor.clamp_(self, nil, max) end

-- remainder(other): Python's modulo, the result taking other's sign (ATen's: fmod, then other
-- added where the fmod is non-zero and its sign differs from other's); a number first works too
-- (lm.remainder(5, t))
function Tensor.remainder(self, other)
   if not T.is_tensor(self) and not T.is_tensor(other) then
      argerror("remainder", "expected a tensor argument, got " .. T.typename(self) .. " and " ..
               T.typename(other))
   end
   if not T.is_tensor(self) then
      self = require("lumen.creation").full({}, self, { dtype = Tensor.dtype(other),
                                                        device = Tensor.device(other) })
   end
   local m = Tensor.fmod(self, other)
   local neg_o = type(other) == "number" and other < 0 or nil
   local flip
   if neg_o == nil then
      flip = Tensor.ne(Tensor.lt(other, 0), Tensor.lt(m, 0))
   else
      flip = neg_o and Tensor.gt(m, 0) or Tensor.lt(m, 0)
   end
   return T.where(Tensor.logical_and(Tensor.ne(m, 0), flip), Tensor.add(m, other), m)
end

-- count_nonzero(dims): the int64 count of non-zero elements over dims (nil: all)
function Tensor.count_nonzero(self, dims)
   tensor_arg("count_nonzero", self)
   return Tensor.sum(Tensor.ne(self, 0), dims)
end

-- aminmax({dim =, keepdim =}) -> min, max (torch.aminmax's two results)
function Tensor.aminmax(self, opts)
   tensor_arg("aminmax", self)
   if opts ~= nil and (type(opts) ~= "table" or T.is_tensor(opts)) then
      argerror("aminmax", "expected an options table {dim =, keepdim =}, got " ..
               T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if k ~= "dim" and k ~= "keepdim" then
         argerror("aminmax", "unknown option '" .. tostring(k) .. "'")
      end
   end
   if opts.dim ~= nil and type(opts.dim) ~= "number" then
      argerror("aminmax", "dim must be a number, got " .. T.typename(opts.dim))
   end
   local kd = check_keepdim("aminmax", opts.keepdim)
   return Tensor.amin(self, opts.dim, kd), Tensor.amax(self, opts.dim, kd)
end

-- var_mean / std_mean(dims, unbiased | {correction =, keepdim =}, keepdim) -> var (std), mean
function Tensor.var_mean(self, dims, opt, keepdim)
   local v = Tensor.var(self, dims, opt, keepdim)
   local kd = keepdim
   if type(opt) == "table" and opt.keepdim ~= nil then kd = opt.keepdim end
   return v, Tensor.mean(self, dims, kd == true)
end
function Tensor.std_mean(self, dims, opt, keepdim)
   local v = Tensor.std(self, dims, opt, keepdim)
   local kd = keepdim
   if type(opt) == "table" and opt.keepdim ~= nil then kd = opt.keepdim end
   return v, Tensor.mean(self, dims, kd == true)
end

-- trace(): the sum of a 2-D tensor's main diagonal (0-d)
function Tensor.trace(self)
   tensor_arg("trace", self)
   if Tensor.dim(self) ~= 2 then
      argerror("trace", "expected a 2-D tensor, got " .. Tensor.dim(self) .. "-D")
   end
   return Tensor.sum(Tensor.diagonal(self))
end

---------------------------------------------------------------------------------------------
-- matrix products through matmul, with PyTorch's shape rules
---------------------------------------------------------------------------------------------

local function sizes_str(t)
   local s = Tensor.size(t)
   local parts = {}
   for i = 1, #s do parts[i] = tostring(s[i]) end
   return #parts == 0 and "()" or table.concat(parts, "x")
end

local function need_dim(fname, t, nd, what)
   tensor_arg(fname, t, what)
   if Tensor.dim(t) ~= nd then
      argerror(fname, ("%s must be a %d-D tensor, got size %s"):format(what, nd, sizes_str(t)))
   end
end

local function same_dtype(fname, a, b, wa, wb)
   if Tensor.dtype(a) ~= Tensor.dtype(b) then
      argerror(fname, ("expected %s and %s to have the same dtype, got %s and %s"):format(wa, wb,
               dtname(a), dtname(b)))
   end
end

-- bmm(mat2): (b, n, m) @ (b, m, p) -> (b, n, p), no broadcasting (PyTorch's bmm)
function Tensor.bmm(self, mat2)
   need_dim("bmm", self, 3, "batch1")
   need_dim("bmm", mat2, 3, "batch2")
   local a, b = Tensor.size(self), Tensor.size(mat2)
   if a[1] ~= b[1] or a[3] ~= b[2] then
      argerror("bmm", ("expected batch2 of size %dx%dx(any), got %s (batch1 is %s)"):format(a[1],
               a[3], sizes_str(mat2), sizes_str(self)))
   end
   same_dtype("bmm", self, mat2, "batch1", "batch2")
   return Tensor.matmul(self, mat2)
end

-- mv(vec): (n, m) @ (m) -> (n)
function Tensor.mv(self, vec)
   need_dim("mv", self, 2, "self")
   need_dim("mv", vec, 1, "vec")
   if Tensor.size(self, 2) ~= Tensor.size(vec, 1) then
      argerror("mv", ("size mismatch: self is %s, vec is %s"):format(sizes_str(self),
               sizes_str(vec)))
   end
   same_dtype("mv", self, vec, "self", "vec")
   return Tensor.matmul(self, vec)
end

-- dot(other): the 0-dim sum of the products of two 1-D tensors of one size and dtype
function Tensor.dot(self, other)
   need_dim("dot", self, 1, "self")
   need_dim("dot", other, 1, "other")
   if Tensor.size(self, 1) ~= Tensor.size(other, 1) then
      argerror("dot", ("self and other must have the same size, got %d and %d"):format(
               Tensor.size(self, 1), Tensor.size(other, 1)))
   end
   same_dtype("dot", self, other, "self", "other")
   return Tensor.sum(Tensor.mul(self, other))
end

-- outer(vec2): (n) x (m) -> (n, m), self[i] * vec2[j]
function Tensor.outer(self, vec2)
   need_dim("outer", self, 1, "self")
   need_dim("outer", vec2, 1, "vec2")
   return Tensor.mul(Tensor.unsqueeze(self, 2), Tensor.unsqueeze(vec2, 1))
end
Tensor.ger = Tensor.outer

-- beta and alpha, positional or {beta =, alpha =} (PyTorch's keyword arguments)
local function beta_alpha(fname, beta, alpha)
   if type(beta) == "table" then
      for k in pairs(beta) do
         if k ~= "beta" and k ~= "alpha" then
            argerror(fname, "unknown option '" .. tostring(k) .. "'")
         end
      end
      beta, alpha = beta.beta, beta.alpha
   end
   beta, alpha = beta == nil and 1 or beta, alpha == nil and 1 or alpha
   if type(beta) ~= "number" or type(alpha) ~= "number" then
      argerror(fname, "beta and alpha must be numbers")
   end
   return beta, alpha
end

-- beta * self + alpha * product; beta = 0 ignores self's values (its NaN and inf too) and gives
-- it a zero gradient, as PyTorch
local function add_scaled(self, prod, beta, alpha)
   if alpha ~= 1 then prod = Tensor.mul(prod, alpha) end
   if beta == 0 then
      local never = require("lumen.creation").full({}, false, { device = Tensor.device(prod) })
      return T.where(never, self, prod)
   end
   if beta ~= 1 then self = Tensor.mul(self, beta) end
   return Tensor.add(self, prod)
end

local function broadcastable(fname, self, sizes)
   local s = Tensor.size(self)
   local ok = #s <= #sizes
   for i = 1, #s do
      local a, b = s[#s - i + 1], sizes[#sizes - i + 1]
      if ok and a ~= 1 and a ~= b then ok = false end
   end
   if not ok then
      local parts = {}
      for i = 1, #sizes do parts[i] = tostring(sizes[i]) end
      argerror(fname, ("self of size %s does not broadcast to the product's size %s"):format(
               sizes_str(self), table.concat(parts, "x")))
   end
end

-- addmm(mat1, mat2, beta, alpha): beta * self + alpha * (mat1 @ mat2), 2-D
function Tensor.addmm(self, mat1, mat2, beta, alpha)
   tensor_arg("addmm", self)
   need_dim("addmm", mat1, 2, "mat1")
   need_dim("addmm", mat2, 2, "mat2")
   beta, alpha = beta_alpha("addmm", beta, alpha)
   local a, b = Tensor.size(mat1), Tensor.size(mat2)
   if a[2] ~= b[1] then
      argerror("addmm", ("mat1 and mat2 shapes cannot be multiplied (%dx%d and %dx%d)"):format(
               a[1], a[2], b[1], b[2]))
   end
   same_dtype("addmm", mat1, mat2, "mat1", "mat2")
   same_dtype("addmm", self, mat1, "self", "mat1")
   broadcastable("addmm", self, { a[1], b[2] })
   return add_scaled(self, Tensor.matmul(mat1, mat2), beta, alpha)
end

-- baddbmm(batch1, batch2, beta, alpha): beta * self + alpha * bmm(batch1, batch2)
function Tensor.baddbmm(self, batch1, batch2, beta, alpha)
   tensor_arg("baddbmm", self)
   beta, alpha = beta_alpha("baddbmm", beta, alpha)
   local prod = Tensor.bmm(batch1, batch2)
   same_dtype("baddbmm", self, batch1, "self", "batch1")
   local sizes = Tensor.size(prod)
   broadcastable("baddbmm", self, sizes)
   return add_scaled(self, prod, beta, alpha)
end

---------------------------------------------------------------------------------------------
-- tril / triu
---------------------------------------------------------------------------------------------

-- the bool mask over the last two dims: col - row <= diagonal (tril) or >= diagonal (triu),
-- made on self's device
local function tri(fname, self, diagonal, lower)
   tensor_arg(fname, self)
   if Tensor.dim(self) < 2 then
      argerror(fname, ("input must be at least 2-D, got size %s"):format(sizes_str(self)))
   end
   diagonal = diagonal or 0
   if type(diagonal) ~= "number" or diagonal % 1 ~= 0 then
      argerror(fname, "diagonal must be an integer, got " .. tostring(diagonal))
   end
   local s = Tensor.size(self)
   local r, c = s[#s - 1], s[#s]
   local cr = require("lumen.creation")
   local dev = Tensor.device(self)
   local rows = Tensor.view(cr.arange(0, r, { device = dev }), r, 1)
   local cols = Tensor.view(cr.arange(0, c, { device = dev }), 1, c)
   local d = raw.sub(cols, rows)
   local mask = lower and raw.le(d, diagonal) or raw.ge(d, diagonal)
   local zero = 0
   if dtname(self) == "bool" then zero = false end
   return keep_format(T.where(mask, self, zero), self)
end
function Tensor.tril(self, diagonal) return tri("tril", self, diagonal, true) end
function Tensor.triu(self, diagonal) return tri("triu", self, diagonal, false) end

return M
