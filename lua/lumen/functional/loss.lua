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
local MSE_OPTS = option_set("reduction")
F._OPTIONS.nll_loss, F._OPTIONS.cross_entropy, F._OPTIONS.mse_loss = NLL_OPTS, NLL_OPTS, MSE_OPTS

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

-- cross_entropy(logits, target, opts) = nll_loss(log_softmax(logits, class dim), target, opts)
function F.cross_entropy(input, target, opts)
   if ac_on then input = ac_f32(input) end
   check_opts("cross_entropy", opts, NLL_OPTS)
   local ic = tensor_arg("cross_entropy", input, "input")
   tensor_arg("cross_entropy", target, "target")
   if ic.ndim < 1 then err("cross_entropy", "input must have at least 1 dim") end
   local d = ic.ndim == 1 and 1 or 2
   return F.nll_loss(F.log_softmax(input, d), target, opts)
end

-- mse_loss(a, b, {reduction="mean"})
function F.mse_loss(a, b, opts)
   if ac_on then a, b = ac_f32(a), ac_f32(b) end
   tensor_arg("mse_loss", a, "input")
   tensor_arg("mse_loss", b, "target")
   opts = check_opts("mse_loss", opts, MSE_OPTS)
   local d = Tensor.sub(a, b)
   local sq = Tensor.mul(d, d)
   local r = opts.reduction or "mean"
   if r == "mean" then return Tensor.mean(sq)
   elseif r == "sum" then return Tensor.sum(sq)
   elseif r == "none" then return sq end
   err("mse_loss", tostring(r) .. " is not a valid value for reduction")
end
