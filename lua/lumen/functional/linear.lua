-- lumen.functional.linear -- lm.F.linear (x @ w^T + b) with its backward.

local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local tonumber = tonumber

local raw = T.raw
local needs, record, sizes_of, fresh = A.needs, A.record, A.sizes_of, A.fresh
local err, check, tensor_arg, opt_tensor = H.err, H.check, H.tensor_arg, H.opt_tensor
local sizes_str, dtype_name, input_dtype, check_float = H.sizes_str, H.dtype_name, H.input_dtype,
   H.check_float

local F = H.F

-- inside lm.autocast linear casts its floating inputs to the low dtype (lua/lumen/autocast.lua);
-- off, one upvalue test
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_low = AC.low

local ffi = require("ffi")
local outp = ffi.new("lm_tensor*[1]")
local check_opts, option_set = H.check_opts, H.option_set
local ACT_CODE, ACT_OP, act_opt = H.ACT_CODE, H.ACT_OP, H.act_opt
local LINEAR_OPTS = option_set("act")
F._OPTIONS.linear = LINEAR_OPTS

-- linear(x, w, b[, opts]) = x @ w^T + b; x is (..., in), w (out, in), b (out) or nil.
-- opts.act (a lumen extension, as F.conv2d's): an activation applied to the result, in the
-- GEMM's epilogue where gradients are off (float32 on the CPU: each tile as it is finished, no
-- pass over the output); with gradients on, the activation op after it. float32 and float64 add
-- the bias in the same kernel call (LM_OP_LINEAR: lm_linear).
function F.linear(x, w, b, opts)
   local fname = "linear"
   local act = nil
   if opts ~= nil then
      check_opts(fname, opts, LINEAR_OPTS)
      act = act_opt(fname, opts)
   end
   if ac_on then x, w, b = ac_low(x), ac_low(w), ac_low(b) end
   local xc = tensor_arg(fname, x, "input")
   local wc = tensor_arg(fname, w, "weight")
   local bc = opt_tensor(fname, b, "bias")
   if wc.ndim ~= 2 then
      err(fname, "weight must be 2-D (out_features, in_features), got size " .. sizes_str(wc))
   end
   if xc.ndim < 1 then err(fname, "input must have at least 1 dim, got a 0-dim tensor") end
   local fin, fout = tonumber(wc.sizes[1]), tonumber(wc.sizes[0])
   if tonumber(xc.sizes[xc.ndim - 1]) ~= fin then
      err(fname, ("input has %d features in its last dim (size %s), weight expects %d " ..
          "(weight of size %s)"):format(tonumber(xc.sizes[xc.ndim - 1]), sizes_str(xc), fin,
          sizes_str(wc)))
   end
   check_float(fname, xc, "input")
   if wc.dtype ~= xc.dtype then
      err(fname, ("input (%s) and weight (%s) must have the same dtype"):format(dtype_name(xc),
          dtype_name(wc)))
   end
   if bc ~= nil and (bc.ndim ~= 1 or tonumber(bc.sizes[0]) ~= fout) then
      err(fname, ("bias must be 1-D of size %d, got size %s"):format(fout, sizes_str(bc)))
   end
   if bc ~= nil then input_dtype(fname, bc, "bias", xc) end
   local in_sizes = sizes_of(xc)
   local x2 = x
   if xc.ndim ~= 2 then x2 = raw.reshape(x, { -1, fin }) end
   local out
   local d = xc.dtype
   local grad = A.is_grad_enabled() and (needs(x) or needs(w) or needs(b))
   -- the activation in the kernel only where nothing needs its input for a gradient
   local fused_act = act ~= nil and not grad
   if bc ~= nil and (d == C.LM_BFLOAT16 or d == C.LM_FLOAT16) then
      -- 16 bits: the bias joins the float32 sums before the one rounding (torch.addmm), not the
      -- already rounded product (which would round twice)
      out = raw.clone(raw.expand(b, { tonumber(x2._c.sizes[0]), fout }))
      check(C.lm_addmm_(out._c, x2._c, raw.transpose(w, 1, 2)._c), fname)
      fused_act = false
   elseif d == C.LM_FLOAT32 or d == C.LM_FLOAT64 or fused_act then
      outp[0] = nil
      check(C.lm_linear(x2._c, wc, bc, fused_act and ACT_CODE[act] or C.LM_ACT_NONE, outp), fname)
      out = T.wrap(outp[0])
   else
      out = raw.matmul(x2, raw.transpose(w, 1, 2))
      if bc ~= nil then raw.add_(out, b) end
   end
   if xc.ndim ~= 2 then
      local os = {}
      for i = 1, #in_sizes - 1 do os[i] = in_sizes[i] end
      os[#os + 1] = fout
      out = raw.reshape(out, os)
   end
   if grad then
      local need_x, need_w, need_b = needs(x), needs(w), needs(b)
      record(out, "AddmmBackward", function(g)
         local g2 = g
         if g._c.ndim ~= 2 then g2 = raw.reshape(g, { -1, fout }) end
         local gx, gw, gb
         if need_x then
            gx = raw.matmul(g2, w)
            if #in_sizes ~= 2 then gx = raw.reshape(gx, in_sizes) end
         end
         if need_w then gw = raw.matmul(raw.transpose(g2, 1, 2), x2) end
         if need_b then gb = raw.sum(g2, 1) end
         return fresh(gx), fresh(gw), fresh(gb)
      end, x, w, b or false)
   end
   if act ~= nil and not fused_act then out = ACT_OP[act](out) end
   return out
end
