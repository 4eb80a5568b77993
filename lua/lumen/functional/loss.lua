-- lumen.functional.loss -- lm.F's losses: nll_loss, cross_entropy, mse_loss, with their
-- backward. Class targets of nll_loss / cross_entropy are 1-BASED int64 indices (like argmax's;
-- the C kernels are 0-based, the conversion happens here).

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local type, tostring, tonumber, getmetatable = type, tostring, tonumber, getmetatable

local Tensor, raw, wrap = T.Tensor, T.raw, T.wrap
local needs, record = A.needs, A.record
local err, check, tensor_arg, opt_tensor = H.err, H.check, H.tensor_arg, H.opt_tensor
local check_opts = H.check_opts
local opts_with, dtype_name, check_float = H.opts_with, H.dtype_name, H.check_float

local F = H.F

-- inside lm.autocast the losses compute in float32 (lua/lumen/autocast.lua); off, one upvalue
-- test
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_f32 = AC.f32

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")

local option_set = H.option_set
local NLL_OPTS = option_set("weight", "ignore_index", "reduction")
local CE_OPTS = option_set("weight", "ignore_index", "reduction", "label_smoothing")
local MSE_OPTS = option_set("reduction")
F._OPTIONS.nll_loss, F._OPTIONS.cross_entropy, F._OPTIONS.mse_loss = NLL_OPTS, CE_OPTS, MSE_OPTS

local reductions = { none = 0, mean = 1, sum = 2 }

-- nll_loss(log_probs, target, {weight=, ignore_index=-100, reduction="mean"}); target holds
-- 1-based int64 class indices (like argmax's); targets equal to ignore_index are skipped
function F.nll_loss(input, target, opts)
   local fname = "nll_loss"
   if ac_on then
      input = ac_f32(input)
      local wt = type(opts) == "table" and getmetatable(opts) == nil and opts.weight
      local wt2 = wt and ac_f32(wt)
      if wt2 ~= wt then opts = opts_with(opts, "weight", wt2) end
   end
   local ic = tensor_arg(fname, input, "input")
   local tcd = tensor_arg(fname, target, "target")
   opts = check_opts(fname, opts, NLL_OPTS)
   local wt = opts.weight
   local wc = opt_tensor(fname, wt, "weight")
   local ignore = opts.ignore_index
   if ignore == nil then ignore = -100 end
   if type(ignore) ~= "number" or ignore % 1 ~= 0 then
      err(fname, "ignore_index must be an integer, got " .. tostring(ignore))
   end
   local red = reductions[opts.reduction or "mean"]
   if red == nil then
      err(fname, tostring(opts.reduction) .. " is not a valid value for reduction " ..
          "(none, mean or sum)")
   end
   check_float(fname, ic, "input")
   if tcd.dtype ~= C.LM_INT64 then
      err(fname, "expected target of dtype int64 (1-based class indices), got " ..
          dtype_name(tcd))
   end
   if ic.ndim < 1 then err(fname, "input must have at least 1 dim (C) or (N, C, ...)") end
   local t0 = raw.sub(target, 1)                 -- 0-based for the kernel
   local ig0 = ignore - 1
   outp[0], p1[0] = nil, nil
   if C.lm_nll_loss(ic, t0._c, wc, red, ig0, outp, p1) ~= 0 then
      -- the kernel reports 0-based targets: show the caller's 1-based value
      local msg = ffi.string(C.lm_last_error()):gsub("Target (%-?%d+) is out of bounds%.?",
         function(v)
            return ("target %d is out of bounds (1-based class indices, expected 1..%d)")
                   :format(tonumber(v) + 1, tonumber(ic.sizes[ic.ndim == 1 and 0 or 1]))
         end)
      error("lumen.nll_loss: " .. msg, T.user_level and T.user_level() or 2)
   end
   local out = wrap(outp[0])
   local total = wrap(p1[0])
   if A.is_grad_enabled() and needs(input) then
      record(out, "NllLossBackward", function(g)
         p2[0] = nil
         check(C.lm_nll_loss_backward(g._c, input._c, t0._c, wt and wt._c or nil, red, ig0,
                                      total._c, p2), "nll_loss_backward")
         return wrap(p2[0])
      end, input)
   end
   return out
end

-- cross_entropy(logits, target, {weight=, ignore_index=-100, reduction="mean",
-- label_smoothing=0}): with class targets (1-based int64), nll_loss(log_softmax(logits, class
-- dim), target, opts); with a floating target of the input's sizes, the class probabilities
-- (soft labels: -sum over classes of weight * target * log_softmax, mean over the samples).
-- label_smoothing = e mixes in the uniform distribution as PyTorch does: class targets give
-- (1 - e) * nll + e / C * (-sum over classes of weight * log_softmax) (ignored targets left out,
-- the mean over the weights of the targets kept), probability targets are replaced by
-- target * (1 - e) + e / C. Composed from log_softmax, nll_loss and the elementwise ops, so
-- every device, dtype and layout they take, and the backward, come from them.
local function class_weights_view(w, nd, cdim)
   local s = {}
   for i = 1, nd do s[i] = 1 end
   s[cdim] = raw.size(w, 1)
   return Tensor.view(w, s)
end

function F.cross_entropy(input, target, opts)
   local fname = "cross_entropy"
   if ac_on then input = ac_f32(input) end
   opts = check_opts(fname, opts, CE_OPTS)
   local ic = tensor_arg(fname, input, "input")
   local tc = tensor_arg(fname, target, "target")
   if ic.ndim < 1 then err(fname, "input must have at least 1 dim") end
   local eps = opts.label_smoothing
   if eps == nil then eps = 0 end
   if type(eps) ~= "number" or not (eps >= 0 and eps <= 1) then
      err(fname, "label_smoothing must be between 0.0 and 1.0, got " .. tostring(eps))
   end
   local d = ic.ndim == 1 and 1 or 2
   local ncls = tonumber(ic.sizes[d - 1])
   local red = opts.reduction or "mean"
   if reductions[red] == nil then
      err(fname, tostring(red) .. " is not a valid value for reduction (none, mean or sum)")
   end
   local wt = opts.weight
   if wt ~= nil then
      local wc = tensor_arg(fname, wt, "weight")
      if wc.ndim ~= 1 or tonumber(wc.sizes[0]) ~= ncls then
         err(fname, ("weight should be a 1-D tensor of %d elements (the classes), got size %s")
             :format(ncls, H.sizes_str(wc)))
      end
   end
   -- the composed forms (probability targets, label smoothing) of a 16-bit input run in
   -- float32 and round once at the end (H.widen); class targets alone take nll_loss's kernel
   local composed = eps > 0 or (tc.dtype ~= C.LM_INT64 and H.is_float(tc))
   local hd = composed and H.half_dtype(input) or nil
   if hd then
      local r = F.cross_entropy(H.widen(input), H.widen(target),
                                wt ~= nil and opts_with(opts, "weight", H.widen(wt)) or opts)
      return Tensor.to(r, hd)
   end
   local logp = F.log_softmax(input, d)
   local nll_opts = opts
   if opts.label_smoothing ~= nil then nll_opts = opts_with(opts, "label_smoothing", nil) end
   if tc.dtype ~= C.LM_INT64 and H.is_float(tc) then
      -- class probabilities
      if opts.ignore_index ~= nil and opts.ignore_index ~= -100 then
         err(fname, "ignore_index is not supported for floating point target")
      end
      if tc.ndim ~= ic.ndim or not A.same_sizes(tc, ic) then
         err(fname, ("expected a floating target of the input's size %s (class probabilities), " ..
             "got size %s"):format(H.sizes_str(ic), H.sizes_str(tc)))
      end
      local tgt = target
      if eps > 0 then tgt = Tensor.add(Tensor.mul(target, 1 - eps), eps / ncls) end
      local prod = Tensor.mul(logp, tgt)
      if wt ~= nil then prod = Tensor.mul(prod, class_weights_view(wt, ic.ndim, d)) end
      if red == "none" then return Tensor.neg(Tensor.sum(prod, d)) end
      local total = Tensor.neg(Tensor.sum(prod))
      if red == "sum" then return total end
      local n = tonumber(ic.numel) / math.max(ncls, 1)
      if n == 0 then return Tensor.div(total, 0) end      -- NaN, as PyTorch's empty mean
      return Tensor.div(total, n)
   end
   local nll = F.nll_loss(logp, target, nll_opts)
   if eps == 0 then return nll end
   -- -sum over classes of weight * log p, per sample; 0 where the target is ignored
   local lw = logp
   if wt ~= nil then lw = Tensor.mul(logp, class_weights_view(wt, ic.ndim, d)) end
   local smooth = Tensor.neg(Tensor.sum(lw, d))
   local ignore = opts.ignore_index
   if ignore == nil then ignore = -100 end
   local keep = Tensor.ne(target, ignore)
   smooth = A.where(keep, smooth, 0)         -- masked, not multiplied: an inf there stays out
   local sl
   if red == "none" then sl = smooth
   elseif red == "sum" then sl = Tensor.sum(smooth)
   else
      -- the mean over the weights of the kept targets (nll_loss's divisor): nll_loss of a
      -- constant -1 input sums weight[target] over them
      local denom
      if wt ~= nil then
         denom = A.no_grad(function()
            local ones = require("lumen.creation").ones_like(logp)
            return F.nll_loss(Tensor.neg(ones), target,
                              { weight = wt, ignore_index = ignore, reduction = "sum" })
         end)
      else
         denom = Tensor.sum(keep)
      end
      sl = Tensor.div(Tensor.sum(smooth), Tensor.to(denom, Tensor.dtype(smooth)))
   end
   return Tensor.add(Tensor.mul(nll, 1 - eps), Tensor.mul(sl, eps / ncls))
end

-- mse_loss(a, b, {reduction="mean"})
function F.mse_loss(a, b, opts)
   if ac_on then a, b = ac_f32(a), ac_f32(b) end
   tensor_arg("mse_loss", a, "input")
   tensor_arg("mse_loss", b, "target")
   opts = check_opts("mse_loss", opts, MSE_OPTS)
   local r = opts.reduction or "mean"
   if r ~= "mean" and r ~= "sum" and r ~= "none" then
      err("mse_loss", tostring(r) .. " is not a valid value for reduction")
   end
   -- 16 bits: in float32, one rounding at the end (H.widen)
   local hd = H.half_dtype(a) or H.half_dtype(b)
   local d = Tensor.sub(H.widen(a), H.widen(b))
   local sq = Tensor.mul(d, d)
   local out = sq
   if r == "mean" then out = Tensor.mean(sq) elseif r == "sum" then out = Tensor.sum(sq) end
   if hd then out = Tensor.to(out, hd) end
   return out
end
