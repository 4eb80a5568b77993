-- lumen.functional.loss_pointwise -- lm.F's elementwise losses, composed from the elementwise
-- ops and reductions: l1_loss, smooth_l1_loss, huber_loss, binary_cross_entropy,
-- binary_cross_entropy_with_logits, kl_div. Formulas and edge cases are ATen's
-- (aten/src/ATen/native/Loss.cpp); binary_cross_entropy has ATen's own backward (the log
-- clamped at -100 forward, (x - y) / max(x (1 - x), 1e-12) back), the others are
-- differentiable through their ops (input, target and weights). The element losses keep the
-- input's memory format (reduction = "none"). 16-bit operands compute in float32 with one
-- rounding at the end, as PyTorch's fused loss kernels accumulate in float32.

local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local type, tostring = type, tostring

local Tensor, R = T.Tensor, T.raw
local needs, record, fresh = A.needs, A.record, A.fresh
local err, tensor_arg, check_opts, check_float = H.err, H.tensor_arg, H.check_opts,
   H.check_float

local F = H.F

-- inside lm.autocast the losses compute in float32, as the others (lua/lumen/autocast.lua)
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_f32 = AC.f32

local option_set = H.option_set

-- the reduced loss, rounded once to hd (the 16-bit dtype of the operands, computed in float32:
-- H.widen) when given
local function reduce(fname, loss, r, batch, hd)
   r = r or "mean"
   local out
   if r == "mean" then out = Tensor.mean(loss)
   elseif r == "sum" then out = Tensor.sum(loss)
   elseif r == "none" then out = loss
   elseif r == "batchmean" and batch then out = Tensor.div(Tensor.sum(loss), batch)
   else err(fname, tostring(r) .. " is not a valid value for reduction") end
   if hd then out = Tensor.to(out, hd) end
   return out
end

-- 16-bit operands: their dtype, and the operands widened to float32
local function widen2(input, target)
   local hd = H.half_dtype(input) or H.half_dtype(target)
   if hd then return hd, H.widen(input), H.widen(target) end
   return nil, input, target
end

-- do sizes a and b broadcast together (one_way: a into b's sizes, as a weight into the
-- input's)?
local function broadcasts(a, b, one_way)
   if one_way and #a > #b then return false end
   for k = 1, math.max(#a, #b) do
      local x, y = a[#a - k + 1] or 1, b[#b - k + 1] or 1
      if x ~= y and x ~= 1 and (one_way or y ~= 1) then return false end
   end
   return true
end

local function pair(fname, input, target)
   local ic = tensor_arg(fname, input, "input")
   local tc = tensor_arg(fname, target, "target")
   check_float(fname, ic, "input")
   check_float(fname, tc, "target")
   -- PyTorch broadcasts (with a warning when the sizes differ); sizes that do not broadcast are
   -- an error naming both
   if not broadcasts(Tensor.size(input), Tensor.size(target)) then
      err(fname, ("input of size %s and target of size %s do not broadcast"):format(
          H.sizes_str(ic), H.sizes_str(tc)))
   end
end

local function number_opt(fname, v, what, default, min)
   v = H.number_arg(fname, v, what, default)
   if min and v < min then err(fname, ("%s must be >= %s, got %s"):format(what, min, v)) end
   return v
end

-- what the losses of two operands start with: autocast's float32, the operands' sizes and
-- dtypes, the options; then 16-bit operands widened to float32 (hd: the dtype to round back to)
local function begin(fname, input, target, opts, known)
   if ac_on then input, target = ac_f32(input), ac_f32(target) end
   pair(fname, input, target)
   opts = check_opts(fname, opts, known)
   local hd
   hd, input, target = widen2(input, target)
   return opts, hd, input, target
end

local RED_OPTS = option_set("reduction")

-- l1_loss(input, target, {reduction = "mean"}): |input - target|
F._OPTIONS.l1_loss = RED_OPTS
function F.l1_loss(input, target, opts)
   local hd
   opts, hd, input, target = begin("l1_loss", input, target, opts, RED_OPTS)
   return reduce("l1_loss", Tensor.abs(Tensor.sub(input, target)), opts.reduction, nil, hd)
end

-- smooth_l1_loss(input, target, {reduction = "mean", beta = 1}): with z = |input - target|,
-- 0.5 z^2 / beta where z < beta, else z - 0.5 beta; beta = 0 is l1_loss
local SMOOTH_OPTS = option_set("reduction", "beta")
F._OPTIONS.smooth_l1_loss = SMOOTH_OPTS
function F.smooth_l1_loss(input, target, opts)
   local fname = "smooth_l1_loss"
   local hd
   opts, hd, input, target = begin(fname, input, target, opts, SMOOTH_OPTS)
   local beta = number_opt(fname, opts.beta, "beta", 1, 0)
   local z = Tensor.abs(Tensor.sub(input, target))
   if beta == 0 then return reduce(fname, z, opts.reduction, nil, hd) end
   local loss = T.where(Tensor.lt(z, beta), Tensor.mul(Tensor.mul(z, z), 0.5 / beta),
                        Tensor.sub(z, 0.5 * beta))
   return reduce(fname, loss, opts.reduction, nil, hd)
end

-- huber_loss(input, target, {reduction = "mean", delta = 1}): 0.5 z^2 where z < delta, else
-- delta (z - 0.5 delta)
local HUBER_OPTS = option_set("reduction", "delta")
F._OPTIONS.huber_loss = HUBER_OPTS
function F.huber_loss(input, target, opts)
   local fname = "huber_loss"
   local hd
   opts, hd, input, target = begin(fname, input, target, opts, HUBER_OPTS)
   local delta = number_opt(fname, opts.delta, "delta", 1)
   if delta <= 0 then err(fname, "delta must be > 0, got " .. tostring(delta)) end
   local z = Tensor.abs(Tensor.sub(input, target))
   local loss = T.where(Tensor.lt(z, delta), Tensor.mul(Tensor.mul(z, z), 0.5),
                        Tensor.mul(Tensor.sub(z, 0.5 * delta), delta))
   return reduce(fname, loss, opts.reduction, nil, hd)
end

-- an optional weight that broadcasts to the input's sizes
local function weight_arg(fname, w, input, what)
   if w == nil then return nil end
   local wc = tensor_arg(fname, w, what)
   local ic = tensor_arg(fname, input, "input")
   H.input_dtype(fname, wc, what, ic)
   if not broadcasts(Tensor.size(w), Tensor.size(input), true) then
      err(fname, ("%s of size %s does not broadcast to the input's size %s"):format(what,
          H.sizes_str(wc), H.sizes_str(ic)))
   end
   return w
end

-- binary_cross_entropy(input, target, {weight =, reduction = "mean"}): -w (y log x + (1 - y)
-- log(1 - x)) with each log clamped at -100 (PyTorch's); input must be probabilities in [0, 1]
local BCE_OPTS = option_set("weight", "reduction")
F._OPTIONS.binary_cross_entropy = BCE_OPTS
function F.binary_cross_entropy(input, target, opts)
   local fname = "binary_cross_entropy"
   if ac_on then
      err(fname, "is unsafe to autocast (as in PyTorch): use binary_cross_entropy_with_logits, " ..
          "or call it outside lm.autocast")
   end
   pair(fname, input, target)
   opts = check_opts(fname, opts, BCE_OPTS)
   if Tensor.numel(input) > 0 and Tensor.device(input) ~= "meta" then
      local bad = Tensor.any(Tensor.logical_or(Tensor.logical_not(Tensor.ge(input, 0)),
                                               Tensor.gt(input, 1)))
      if Tensor.item(bad) then
         err(fname, "all elements of input should be between 0 and 1")
      end
   end
   local w = weight_arg(fname, opts.weight, input, "weight")
   local hd
   hd, input, target = widen2(input, target)
   if hd and w ~= nil then w = H.widen(w) end
   local function logs(x)
      return R.clamp(R.log(x), -100, nil), R.clamp(R.log1p(R.neg(x)), -100, nil)
   end
   local lx, l1x = logs(input)
   -- -(y lx + (1 - y) l1x) = -(l1x + y (lx - l1x))
   local loss = R.neg(R.add(l1x, R.mul(target, R.sub(lx, l1x))))
   if A.is_grad_enabled() and (needs(input) or needs(target)) then
      local ni, nt = needs(input), needs(target)
      record(loss, "BinaryCrossEntropyBackward", function(g)
         local gi, gt
         if ni then
            local den = R.clamp(R.mul(R.neg(R.sub(input, 1)), input), 1e-12, nil)
            gi = R.div(R.mul(g, R.sub(input, target)), den)
         end
         if nt then gt = R.mul(g, R.sub(l1x, lx)) end
         return fresh(gi), fresh(gt)
      end, input, target)
   end
   if w ~= nil then loss = Tensor.mul(loss, w) end
   return reduce(fname, loss, opts.reduction, nil, hd)
end

-- binary_cross_entropy_with_logits(input, target, {weight =, reduction = "mean", pos_weight =}):
-- ATen's (1 - y) x - lw logsigmoid(x), lw = (pos_weight - 1) y + 1; stable for any logit, and
-- differentiable in input, target, weight and pos_weight
local BCEL_OPTS = option_set("weight", "reduction", "pos_weight")
F._OPTIONS.binary_cross_entropy_with_logits = BCEL_OPTS
function F.binary_cross_entropy_with_logits(input, target, opts)
   local fname = "binary_cross_entropy_with_logits"
   if ac_on then input, target = ac_f32(input), ac_f32(target) end
   pair(fname, input, target)
   opts = check_opts(fname, opts, BCEL_OPTS)
   local w = weight_arg(fname, opts.weight, input, "weight")
   local pw = opts.pos_weight
   if pw ~= nil then
      tensor_arg(fname, pw, "pos_weight")
      local sp, si = Tensor.size(pw), Tensor.size(input)
      if #sp > #si or (#sp > 0 and sp[#sp] ~= 1 and sp[#sp] ~= si[#si]) then
         err(fname, ("pos_weight of size %s must broadcast along the input's last dim (size %s)")
             :format(H.sizes_str(tensor_arg(fname, pw, "pos_weight")),
                     H.sizes_str(tensor_arg(fname, input, "input"))))
      end
   end
   local hd
   hd, input, target = widen2(input, target)
   if hd then
      if w ~= nil then w = H.widen(w) end
      if pw ~= nil then pw = H.widen(pw) end
   end
   local ls = F.logsigmoid(input)
   if pw ~= nil then
      ls = Tensor.mul(ls, Tensor.add(Tensor.mul(Tensor.sub(pw, 1), target), 1))
   end
   local loss = Tensor.sub(Tensor.mul(Tensor.sub(1, target), input), ls)
   if w ~= nil then loss = Tensor.mul(loss, w) end
   return reduce(fname, loss, opts.reduction, nil, hd)
end

-- kl_div(input, target, {reduction = "mean", log_target = false}): input holds log-probabilities;
-- target * (log(target) - input) with 0 where target is 0 (xlogy), or exp(target) (target -
-- input) with log_target. reduction "batchmean" divides the sum by the batch size (dim 1), the
-- mathematically right KL divergence; "mean" (the default, as PyTorch's) divides by every element
local KL_OPTS = option_set("reduction", "log_target")
F._OPTIONS.kl_div = KL_OPTS
function F.kl_div(input, target, opts)
   local fname = "kl_div"
   local hd
   opts, hd, input, target = begin(fname, input, target, opts, KL_OPTS)
   local lt = opts.log_target
   if lt ~= nil and type(lt) ~= "boolean" then
      err(fname, "log_target must be a boolean, got " .. T.typename(lt))
   end
   local loss
   if lt then
      loss = Tensor.mul(Tensor.exp(target), Tensor.sub(target, input))
   else
      -- xlogy(t, t): 0 where t is 0 (log of 1 there, so no NaN reaches the gradient through
      -- where); NaN for a negative t, as PyTorch
      local zero = Tensor.eq(target, 0)
      local safe = T.where(zero, 1, target)
      local xlogy = T.where(zero, 0, Tensor.mul(target, Tensor.log(safe)))
      loss = Tensor.sub(xlogy, Tensor.mul(target, input))
   end
   local batch = Tensor.dim(input) > 0 and Tensor.size(input, 1) or 1
   return reduce(fname, loss, opts.reduction, batch, hd)
end

return F
