-- lumen.functional.norm -- lm.F's normalization: batch_norm (any rank >= 2: BatchNorm1d/2d/3d
-- and SyncBatchNorm's local path), with its backward and the fused relu / residual tail;
-- group_norm (a native kernel, kernels/cpu/norm_group.c, fast in channels-last: a group's
-- channels are a contiguous run of each pixel), and layer_norm / instance_norm composed on it.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tonumber, rawget, tostring, ipairs = type, tonumber, rawget, tostring, ipairs

local Tensor, wrap, typename = T.Tensor, T.wrap, T.typename
local needs, record, fresh = A.needs, A.record, A.fresh
local err, check, tensor_arg, opt_tensor = H.err, H.check, H.tensor_arg, H.opt_tensor
local check_opts, opts_with, bool_opt = H.check_opts, H.opts_with, H.bool_opt
local sizes_str, check_float = H.sizes_str, H.check_float

local F = H.F

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local idxp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")
local p3 = ffi.new("lm_tensor*[1]")

local BN_OPTS = H.option_set("training", "momentum", "eps", "residual", "relu")
F._OPTIONS.batch_norm = BN_OPTS

-- batch_norm(x, running_mean, running_var, weight, bias, {training=false, momentum=0.1,
--            eps=1e-5, residual=nil, relu=false}); running stats are updated in place when
-- training. residual (a tensor) and relu fuse the tail of a ResNet block into the same pass:
-- the result is relu(batch_norm(x) + residual) (each part optional), computed and
-- differentiated as the three ops would be. A residual of another dtype or shape (broadcast)
-- falls back to the separate ops.
--
-- The recorded node also lets autograd fuse a later in-place relu_ of the result (nn.ReLU(true)
-- after a batch norm): the relu's backward then runs inside the batch norm's backward, its mask
-- read from the relu's output (see Tensor.relu_ in autograd/elementwise.lua).
local bn_fused_fwd = function(...) return C.lm_batch_norm_fused(...) end
local bn_fused_bwd = function(...) return C.lm_batch_norm_backward_fused(...) end

local BN_POS = { "training", "momentum", "eps" }

function F.batch_norm(x, running_mean, running_var, weight, bias, opts, ...)
   local fname = "batch_norm"
   opts = H.positional(fname, BN_POS, opts, ...)
   local xc = tensor_arg(fname, x, "input")
   local rmc = opt_tensor(fname, running_mean, "running_mean")
   local rvc = opt_tensor(fname, running_var, "running_var")
   local wc = opt_tensor(fname, weight, "weight")
   local bc = opt_tensor(fname, bias, "bias")
   opts = check_opts(fname, opts, BN_OPTS)
   local training = bool_opt(fname, opts.training, "training", false)
   local momentum = opts.momentum
   if momentum == nil then momentum = 0.1 end
   if type(momentum) ~= "number" then
      err(fname, "momentum must be a number, got " .. typename(momentum))
   end
   local eps = opts.eps
   if eps == nil then eps = 1e-5 end
   if type(eps) ~= "number" or eps < 0 then err(fname, "eps must be a non-negative number") end
   local relu = bool_opt(fname, opts.relu, "relu", false)
   local residual = opts.residual
   local resc = opt_tensor(fname, residual, "residual")
   if xc.ndim < 2 then
      err(fname, ("expected an input of at least 2 dims (N, C, ...), got %d-D"):format(xc.ndim))
   end
   check_float(fname, xc, "input")
   local Cn = tonumber(xc.sizes[1])
   local function check_vec(c, what)
      if c ~= nil and (c.ndim ~= 1 or tonumber(c.sizes[0]) ~= Cn) then
         err(fname, ("%s should contain %d elements (the input's channels), got size %s")
             :format(what, Cn, sizes_str(c)))
      end
      if c ~= nil then check_float(fname, c, what) end
   end
   check_vec(rmc, "running_mean")
   check_vec(rvc, "running_var")
   check_vec(wc, "weight")
   check_vec(bc, "bias")
   H.param_dtypes(fname, xc, wc, "weight", bc, "bias", rmc, "running_mean", rvc, "running_var")
   if not training and (rmc == nil or rvc == nil) then
      err(fname, "running_mean and running_var must be given in evaluation mode " ..
          "(training = false)")
   end
   if (rmc == nil) ~= (rvc == nil) then
      err(fname, "running_mean and running_var must be given together")
   end
   if training then
      local per = Cn > 0 and tonumber(xc.numel) / Cn or 0
      if per <= 1 then
         err(fname, "expected more than 1 value per channel when training, got input size " ..
             sizes_str(xc))
      end
   end
   if resc ~= nil and (resc.dtype ~= xc.dtype or resc.ndim ~= xc.ndim
                       or not A.same_sizes(resc, xc) or resc.device ~= xc.device) then
      -- not fusable: the separate ops (broadcasting and type promotion as Tensor.add does them)
      local y = Tensor.add(F.batch_norm(x, running_mean, running_var, weight, bias,
                                        opts_with(opts, "residual", nil, "relu", nil)), residual)
      if relu then y = Tensor.relu_(y) end
      return y
   end
   local rec = A.is_grad_enabled() and (needs(x) or needs(weight) or needs(bias) or
                                        needs(residual))
   if training then               -- the running statistics are updated in place
      if rmc ~= nil then T.check_no_overlap(fname, rmc, "running_mean") end
      if rvc ~= nil then T.check_no_overlap(fname, rvc, "running_var") end
      T.barrier(rmc)
      T.barrier(rvc)
   end
   outp[0], p1[0], p2[0] = nil, nil, nil
   check(bn_fused_fwd(xc, wc, bc, rmc, rvc, training and 1 or 0, momentum, eps, resc,
                      relu and 1 or 0, outp, rec and p1 or nil, rec and p2 or nil), fname)
   local out = wrap(outp[0])
   if rec then
      local save_mean, save_invstd = wrap(p1[0]), wrap(p2[0])
      local need_x, need_w, need_b = needs(x), needs(weight), needs(bias)
      local need_r = residual ~= nil and needs(residual)
      local wt = weight
      -- the backward of relu(bn(x) [+ residual]); mask: the relu's output (nil: no relu)
      local function make_backward(mask, with_residual)
         return function(g)
            p1[0], p2[0], p3[0], idxp[0] = nil, nil, nil, nil
            local want_gm = with_residual and mask ~= nil
            check(bn_fused_bwd(g._c, mask and mask._c or nil, x._c, wt and wt._c or nil,
                               save_mean._c, save_invstd._c, training and 1 or 0,
                               need_x and p1 or nil, need_w and p2 or nil, need_b and p3 or nil,
                               want_gm and idxp or nil), "batch_norm_backward")
            local gx = fresh(need_x and wrap(p1[0]) or nil)
            local gw = fresh(need_w and wrap(p2[0]) or nil)
            local gb = fresh(need_b and wrap(p3[0]) or nil)
            if with_residual then
               return gx, gw, gb, want_gm and fresh(wrap(idxp[0])) or g
            end
            return gx, gw, gb
         end
      end
      if residual ~= nil then
         record(out, relu and "NativeBatchNormReluBackward" or "NativeBatchNormBackward",
                make_backward(relu and out or nil, need_r), x, weight or false, bias or false,
                residual)
      else
         record(out, relu and "NativeBatchNormReluBackward" or "NativeBatchNormBackward",
                make_backward(relu and out or nil, false), x, weight or false, bias or false)
      end
      if not relu then
         -- relu_(out) may fold its backward into this node's (autograd's Tensor.relu_)
         rawget(out, "grad_fn").relu_fuse = function(y) return make_backward(y, need_r) end
      end
   end
   return out
end

---------------------------------------------------------------------------------------------
-- group_norm, layer_norm, instance_norm
---------------------------------------------------------------------------------------------

local GN_OPTS = H.option_set("eps")
F._OPTIONS.group_norm = GN_OPTS

local gn_fwd = function(...) return C.lm_group_norm(...) end
local gn_bwd = function(...) return C.lm_group_norm_backward(...) end

local function eps_opt(fname, opts)
   local eps = opts.eps
   if eps == nil then return 1e-5 end
   if type(eps) ~= "number" or eps ~= eps or eps < 0 then
      err(fname, "eps must be a non-negative number, got " .. tostring(eps))
   end
   return eps
end

-- group_norm(x, num_groups, weight, bias, {eps=1e-5}): x (N, C, ...) normalised over each
-- sample's groups of C / num_groups channels (biased variance), then weight * . + bias per
-- channel. The result and the gradients keep x's memory format (channels-last included).
-- fname: the name errors carry (layer_norm / instance_norm call it).
local function group_norm(fname, x, num_groups, weight, bias, eps)
   local xc = tensor_arg(fname, x, "input")
   local wc = opt_tensor(fname, weight, "weight")
   local bc = opt_tensor(fname, bias, "bias")
   check_float(fname, xc, "input")
   if xc.ndim < 2 then
      err(fname, ("expected an input of at least 2 dims (N, C, ...), got %d-D"):format(xc.ndim))
   end
   if type(num_groups) ~= "number" or num_groups % 1 ~= 0 or num_groups < 1 then
      err(fname, "num_groups must be a positive integer, got " .. tostring(num_groups))
   end
   local Cn = tonumber(xc.sizes[1])
   if Cn % num_groups ~= 0 then
      err(fname, ("expected the number of channels (%d) to be divisible by num_groups (%d)")
          :format(Cn, num_groups))
   end
   for _, pair in ipairs({ { wc, "weight" }, { bc, "bias" } }) do
      local c, what = pair[1], pair[2]
      if c ~= nil then
         check_float(fname, c, what)
         if c.ndim ~= 1 or tonumber(c.sizes[0]) ~= Cn then
            err(fname, ("%s should contain %d elements (the input's channels), got size %s")
                :format(what, Cn, sizes_str(c)))
         end
      end
   end
   H.param_dtypes(fname, xc, wc, "weight", bc, "bias")
   local rec = A.is_grad_enabled() and (needs(x) or needs(weight) or needs(bias))
   outp[0], p1[0], p2[0] = nil, nil, nil
   check(gn_fwd(xc, num_groups, wc, bc, eps, outp, rec and p1 or nil, rec and p2 or nil), fname)
   local out = wrap(outp[0])
   if rec then
      local mean, rstd = wrap(p1[0]), wrap(p2[0])
      local need_x, need_w, need_b = needs(x), needs(weight), needs(bias)
      local wt = weight
      record(out, "NativeGroupNormBackward", function(g)
         p1[0], p2[0], p3[0] = nil, nil, nil
         check(gn_bwd(g._c, x._c, mean._c, rstd._c, wt and wt._c or nil, num_groups,
                      need_x and p1 or nil, need_w and p2 or nil, need_b and p3 or nil),
               fname .. "_backward")
         return fresh(need_x and wrap(p1[0]) or nil), fresh(need_w and wrap(p2[0]) or nil),
                fresh(need_b and wrap(p3[0]) or nil)
      end, x, weight or false, bias or false)
   end
   return out, rec
end

local EPS_POS = { "eps" }

function F.group_norm(x, num_groups, weight, bias, opts, ...)
   opts = check_opts("group_norm", H.positional("group_norm", EPS_POS, opts, ...), GN_OPTS)
   return (group_norm("group_norm", x, num_groups, weight, bias, eps_opt("group_norm", opts)))
end

-- layer_norm(x, normalized_shape, weight, bias, {eps=1e-5}): x normalised over its trailing
-- dims normalized_shape (a number or a list), then weight * . + bias (each of
-- normalized_shape). Runs as group_norm with one group on the (M, D) view of x (D the product
-- of normalized_shape): no copy when those dims are dense, e.g. ConvNeXt's LayerNorm2d over C
-- of a channels-last tensor permuted to (N, H, W, C), whose result permuted back stays
-- channels-last.
local LN_OPTS = H.option_set("eps")
F._OPTIONS.layer_norm = LN_OPTS

local function shape_list(fname, s, what)
   if type(s) == "number" then s = { s } end
   if type(s) == "cdata" then s = { tonumber(s) } end
   if type(s) ~= "table" then
      err(fname, what .. " must be a number or a list of numbers, got " .. typename(s))
   end
   local out = {}
   for i = 1, #s do
      local v = s[i]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
         err(fname, ("%s[%d] must be a non-negative integer, got %s"):format(what, i,
             tostring(v)))
      end
      out[i] = v
   end
   return out
end

function F.layer_norm(x, normalized_shape, weight, bias, opts, ...)
   local fname = "layer_norm"
   local xc = tensor_arg(fname, x, "input")
   opts = check_opts(fname, H.positional(fname, EPS_POS, opts, ...), LN_OPTS)
   local eps = eps_opt(fname, opts)
   local ns = shape_list(fname, normalized_shape, "normalized_shape")
   local k = #ns
   if k == 0 then err(fname, "normalized_shape must have at least one dimension") end
   check_float(fname, xc, "input")
   local nd = xc.ndim
   local ok = nd >= k
   for i = 1, k do
      if ok and tonumber(xc.sizes[nd - k + i - 1]) ~= ns[i] then ok = false end
   end
   if not ok then
      err(fname, ("given normalized_shape=(%s), expected input with shape (*, %s), but got " ..
          "input of size %s"):format(table.concat(ns, ", "), table.concat(ns, ", "),
          sizes_str(xc)))
   end
   local D = 1
   for i = 1, k do D = D * ns[i] end
   for _, pair in ipairs({ { weight, "weight" }, { bias, "bias" } }) do
      local t, what = pair[1], pair[2]
      local c = opt_tensor(fname, t, what)
      if c ~= nil then
         local same = c.ndim == k
         for i = 1, k do
            if same and tonumber(c.sizes[i - 1]) ~= ns[i] then same = false end
         end
         if not same then
            err(fname, ("%s must have the shape normalized_shape (%s), got size %s")
                :format(what, table.concat(ns, ", "), sizes_str(c)))
         end
      end
   end
   local M = D > 0 and tonumber(xc.numel) / D or 0
   local sizes = {}
   for i = 0, nd - 1 do sizes[i + 1] = tonumber(xc.sizes[i]) end
   local x2 = Tensor.reshape(x, { M, D })
   local w2 = weight and Tensor.reshape(weight, { D }) or nil
   local b2 = bias and Tensor.reshape(bias, { D }) or nil
   local y = Tensor.reshape(group_norm(fname, x2, 1, w2, b2, eps), sizes)
   -- a channels-last x whose normalized dims are not its innermost ones (layer_norm over H, W)
   -- went through a copy: its result is made channels-last again (the format rule)
   local mf = H.suggest(xc)
   if mf ~= C.LM_CONTIGUOUS and not Tensor.is_contiguous(y, Tensor.suggest_memory_format(x)) then
      y = Tensor.contiguous(y, Tensor.suggest_memory_format(x))
   end
   return y
end

-- instance_norm(x, running_mean, running_var, weight, bias, {use_input_stats=true, momentum=0.1,
-- eps=1e-5}): each (sample, channel) normalised over its spatial dims (group_norm with one
-- group per channel, in x's memory format). With use_input_stats and running statistics given,
-- they are updated in place as PyTorch does (the mean over the batch of the per-instance mean
-- and unbiased variance); use_input_stats = false normalises with the running statistics.
local IN_OPTS = H.option_set("use_input_stats", "momentum", "eps")
F._OPTIONS.instance_norm = IN_OPTS

local IN_POS = { "use_input_stats", "momentum", "eps" }

function F.instance_norm(x, running_mean, running_var, weight, bias, opts, ...)
   local fname = "instance_norm"
   local xc = tensor_arg(fname, x, "input")
   local rmc = opt_tensor(fname, running_mean, "running_mean")
   local rvc = opt_tensor(fname, running_var, "running_var")
   opts = check_opts(fname, H.positional(fname, IN_POS, opts, ...), IN_OPTS)
   H.same_device(fname, x, running_mean, "running_mean", running_var, "running_var", weight,
                 "weight", bias, "bias")
   local use_input_stats = bool_opt(fname, opts.use_input_stats, "use_input_stats", true)
   local momentum = opts.momentum
   if momentum == nil then momentum = 0.1 end
   if type(momentum) ~= "number" then
      err(fname, "momentum must be a number, got " .. typename(momentum))
   end
   local eps = eps_opt(fname, opts)
   check_float(fname, xc, "input")
   if xc.ndim < 3 then
      err(fname, ("expected an input of at least 3 dims (N, C, L...), got %d-D"):format(xc.ndim))
   end
   local Cn = tonumber(xc.sizes[1])
   for _, pair in ipairs({ { rmc, "running_mean" }, { rvc, "running_var" } }) do
      local c, what = pair[1], pair[2]
      if c ~= nil then
         check_float(fname, c, what)
         if c.ndim ~= 1 or tonumber(c.sizes[0]) ~= Cn then
            err(fname, ("%s should contain %d elements (the input's channels), got size %s")
                :format(what, Cn, sizes_str(c)))
         end
      end
   end
   if (rmc == nil) ~= (rvc == nil) then
      err(fname, "running_mean and running_var must be given together")
   end
   H.param_dtypes(fname, xc, opt_tensor(fname, weight, "weight"), "weight",
                  opt_tensor(fname, bias, "bias"), "bias", rmc, "running_mean", rvc, "running_var")
   if not use_input_stats then
      if rmc == nil then
         err(fname, "expected running_mean and running_var to be defined when " ..
             "use_input_stats is false")
      end
      -- the running statistics as constants: one batch_norm in evaluation mode
      return F.batch_norm(x, running_mean, running_var, weight, bias,
                          { training = false, eps = eps })
   end
   local S = 1
   for d = 2, xc.ndim - 1 do S = S * tonumber(xc.sizes[d]) end
   if S <= 1 then
      err(fname, "expected more than 1 spatial element when training, got input size " ..
          sizes_str(xc))
   end
   local y = group_norm(fname, x, Cn, weight, bias, eps)
   if rmc ~= nil then
      -- running = (1 - m) running + m mean_n(stat[n, c]), the variance unbiased
      A.no_grad(function()
         local xd = Tensor.detach(x)
         local dims = {}
         for d = 3, xc.ndim do dims[#dims + 1] = d end
         local xf = Tensor.double(xd)
         local mk = Tensor.mean(xf, dims, true)
         local m = Tensor.reshape(mk, { tonumber(xc.sizes[0]), Cn })           -- (N, C)
         local dev = xf - mk
         local v = Tensor.reshape(Tensor.mean(dev * dev, dims), { tonumber(xc.sizes[0]), Cn })
         v = v * (S / (S - 1))
         T.raw.mul_(running_mean, 1 - momentum)
         T.raw.add_(running_mean, Tensor.mean(m, 1) * momentum)
         T.raw.mul_(running_var, 1 - momentum)
         T.raw.add_(running_var, Tensor.mean(v, 1) * momentum)
      end)
   end
   return y
end
