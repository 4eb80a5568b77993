-- lumen.functional.vector -- lm.F's operators on vectors along a dim, composed from the
-- reductions and elementwise ops (Tensor:norm's backward included): normalize,
-- cosine_similarity, pairwise_distance, one_hot, and embedding (a lookup through index_select).
-- Dims are 1-based (dim 2 is PyTorch's default dim=1); one_hot's classes and embedding's
-- indices are 1-based, as the losses' targets and argmax's indices.

local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tostring, getmetatable = type, tostring, getmetatable

local Tensor = T.Tensor
local err, tensor_arg, check_opts, check_float = H.err, H.tensor_arg, H.check_opts,
   H.check_float

local F = H.F
local option_set = H.option_set

local number_opt = H.number_arg

-- normalize(x, {p = 2, dim = 2, eps = 1e-12}): x / max(||x||_p over dim, eps)
local NORMALIZE_OPTS = option_set("p", "dim", "eps")
F._OPTIONS.normalize = NORMALIZE_OPTS
function F.normalize(x, opts)
   local fname = "normalize"
   local xc = tensor_arg(fname, x, "input")
   check_float(fname, xc, "input")
   opts = check_opts(fname, opts, NORMALIZE_OPTS)
   local p = number_opt(fname, opts.p, "p", 2)
   local eps = number_opt(fname, opts.eps, "eps", 1e-12)
   local dim = opts.dim or 2
   if xc.ndim == 0 then err(fname, "expected a tensor with at least 1 dim") end
   if xc.ndim == 1 and opts.dim == nil then dim = 1 end
   T.wrap_dim(fname, dim, xc.ndim)
   local n = Tensor.clamp(Tensor.norm(x, p, dim, true), eps, nil)
   return Tensor.div(x, n)
end

-- the two floating tensor operands x1, x2 (their cdata)
local function float_pair(fname, x1, x2)
   local c1 = tensor_arg(fname, x1, "x1")
   local c2 = tensor_arg(fname, x2, "x2")
   check_float(fname, c1, "x1")
   check_float(fname, c2, "x2")
   return c1, c2
end

-- a value that reads as v clamped to at least eps and differentiates as v (PyTorch clamps the
-- norms of cosine_similarity in place under no_grad)
local function clamp_value_only(v, eps)
   local c = A.no_grad(function()
      local d = Tensor.detach(v)
      return Tensor.sub(Tensor.clamp(d, eps, nil), d)
   end)
   return Tensor.add(v, c)
end

-- cosine_similarity(x1, x2, {dim = 2, eps = 1e-8}): sum over dim of (x1 / |x1|) (x2 / |x2|),
-- ATen's order (each side divided by its norm, clamped at eps, before the product), so the
-- result stays within [-1, 1]; x1 and x2 broadcast
local COS_OPTS = option_set("dim", "eps")
F._OPTIONS.cosine_similarity = COS_OPTS
function F.cosine_similarity(x1, x2, opts)
   local fname = "cosine_similarity"
   local c1, c2 = float_pair(fname, x1, x2)
   opts = check_opts(fname, opts, COS_OPTS)
   local eps = number_opt(fname, opts.eps, "eps", 1e-8)
   local nd = math.max(c1.ndim, c2.ndim)
   if nd == 0 then err(fname, "expected tensors with at least 1 dim") end
   local dim = opts.dim or (nd == 1 and 1 or 2)
   -- broadcast the pair first, as ATen's expand_outplace (the norms are of the broadcast pair)
   local s1, s2, sizes = Tensor.size(x1), Tensor.size(x2), {}
   for k = nd, 1, -1 do
      local a, b = s1[#s1 - nd + k] or 1, s2[#s2 - nd + k] or 1
      if a ~= b and a ~= 1 and b ~= 1 then
         err(fname, ("x1 of size %s and x2 of size %s do not broadcast"):format(
             H.sizes_str(c1), H.sizes_str(c2)))
      end
      sizes[k] = a == 1 and b or a
   end
   local a, b = Tensor.expand(x1, sizes), Tensor.expand(x2, sizes)
   T.wrap_dim(fname, dim, #sizes)
   local na = clamp_value_only(Tensor.norm(a, 2, dim, true), eps)
   local nb = clamp_value_only(Tensor.norm(b, 2, dim, true), eps)
   return Tensor.sum(Tensor.mul(Tensor.div(a, na), Tensor.div(b, nb)), dim)
end

-- pairwise_distance(x1, x2, {p = 2, eps = 1e-6, keepdim = false}): ||x1 - x2 + eps||_p over the
-- last dim (ATen's)
local PAIRWISE_OPTS = option_set("p", "eps", "keepdim")
F._OPTIONS.pairwise_distance = PAIRWISE_OPTS
function F.pairwise_distance(x1, x2, opts)
   local fname = "pairwise_distance"
   float_pair(fname, x1, x2)
   opts = check_opts(fname, opts, PAIRWISE_OPTS)
   local p = number_opt(fname, opts.p, "p", 2)
   local eps = number_opt(fname, opts.eps, "eps", 1e-6)
   local kd = opts.keepdim
   if kd ~= nil and type(kd) ~= "boolean" then
      err(fname, "keepdim must be a boolean, got " .. T.typename(kd))
   end
   local d = Tensor.add(Tensor.sub(x1, x2), eps)
   if Tensor.dim(d) == 0 then return Tensor.norm(d, p) end
   return Tensor.norm(d, p, -1, kd == true)
end

-- one_hot(t, num_classes): int64 with a last dim of num_classes (default: t's largest class),
-- 1 at each 1-based class of t, 0 elsewhere
function F.one_hot(t, num_classes)
   local fname = "one_hot"
   local tc = tensor_arg(fname, t, "tensor")
   if tostring(Tensor.dtype(t)) ~= "int64" then
      err(fname, "class values must be int64 (1-based classes), got " .. H.dtype_name(tc))
   end
   if num_classes ~= nil and num_classes ~= -1 and
      (type(num_classes) ~= "number" or num_classes % 1 ~= 0 or num_classes < 0) then
      err(fname, "num_classes must be a non-negative integer or -1, got " ..
          tostring(num_classes))
   end
   local n = Tensor.numel(t)
   if num_classes == nil or num_classes == -1 then
      if n == 0 then
         err(fname, "can not infer the total number of classes from an empty tensor")
      end
      num_classes = Tensor.item(Tensor.amax(t))
   end
   if n > 0 then
      local lo, hi = Tensor.item(Tensor.amin(t)), Tensor.item(Tensor.amax(t))
      if lo < 1 then err(fname, ("class values must be >= 1 (1-based), got %d"):format(lo)) end
      if hi > num_classes then
         err(fname, ("class values must be at most num_classes (%d), got %d"):format(
             num_classes, hi))
      end
   end
   local classes = require("lumen.creation").arange(1, num_classes + 1,
                                                     { device = Tensor.device(t) })
   return Tensor.to(Tensor.eq(Tensor.unsqueeze(t, -1), classes), "int64")
end

-- embedding(input, weight, padding_idx) or (input, weight, {padding_idx =}): the rows of weight
-- (num_embeddings x dim) at input's 1-based int64 indices, input's sizes with dim appended
-- (index_select, so the gradient adds into the rows used); the rows looked up at padding_idx
-- (1-based, negative from the end) pass no gradient, as PyTorch's. max_norm, scale_grad_by_freq
-- and sparse are refused: lumen has no in-place renormalization or sparse gradients.
local EMBEDDING_OPTS = option_set("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
                                  "sparse")
F._OPTIONS.embedding = EMBEDDING_OPTS
function F.embedding(input, weight, padding_idx)
   local fname = "embedding"
   local ic = tensor_arg(fname, input, "input")
   local wc = tensor_arg(fname, weight, "weight")
   if tostring(Tensor.dtype(input)) ~= "int64" and tostring(Tensor.dtype(input)) ~= "int32" then
      err(fname, "input must hold int64 (or int32) 1-based indices, got " .. H.dtype_name(ic))
   end
   if wc.ndim ~= 2 then
      err(fname, "weight must be 2-D (num_embeddings, embedding_dim), got size " ..
          H.sizes_str(wc))
   end
   if type(padding_idx) == "table" and getmetatable(padding_idx) == nil then
      local o = check_opts(fname, padding_idx, EMBEDDING_OPTS)
      if o.max_norm ~= nil then
         err(fname, "max_norm is not supported (it renormalizes weight in place)")
      end
      if o.scale_grad_by_freq or o.sparse then
         err(fname, "scale_grad_by_freq and sparse are not supported")
      end
      padding_idx = o.padding_idx
   end
   local n = Tensor.size(weight, 1)
   if padding_idx ~= nil then
      if type(padding_idx) ~= "number" or padding_idx % 1 ~= 0 or padding_idx == 0
         or padding_idx > n or padding_idx < -n then
         err(fname, ("padding_idx must be within num_embeddings (1..%d or -%d..-1), got %s")
             :format(n, n, tostring(padding_idx)))
      end
      if padding_idx < 0 then padding_idx = n + padding_idx + 1 end
   end
   local sizes = Tensor.size(input)
   local flat = Tensor.reshape(input, { -1 })
   local ok, rows = pcall(Tensor.index_select, weight, 1, flat)
   if not ok then
      -- an index out of range, named as the user called it
      local msg = tostring(rows):match("lumen%.index_select: (.*)$")
      if msg then err(fname, msg) end
      error(rows, 0)
   end
   sizes[#sizes + 1] = Tensor.size(weight, 2)
   local out = Tensor.reshape(rows, sizes)
   if padding_idx ~= nil and A.is_grad_enabled() and Tensor.numel(input) > 0 then
      local pad = Tensor.unsqueeze(Tensor.eq(input, padding_idx), -1)
      out = T.where(pad, Tensor.detach(out), out)
   end
   return out
end

return F
