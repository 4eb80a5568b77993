-- lumen.functional.conv -- lm.F's convolutions: conv1d, conv2d, conv3d, each with its backward.
-- conv2d and conv3d share one body (conv_nd); conv1d runs the 2-D kernels on N×C×1×L views, as
-- PyTorch does.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local H = require("lumen.functional.common")

local type, tostring, tonumber, getmetatable = type, tostring, tonumber, getmetatable

local Tensor, raw, wrap = T.Tensor, T.raw, T.wrap
local needs, record, fresh = A.needs, A.record, A.fresh
local err, check, tensor_arg, opt_tensor = H.err, H.check, H.tensor_arg, H.opt_tensor
local check_opts, opts_with, int_opt = H.check_opts, H.opts_with, H.int_opt
local sizes_str, dtype_name, input_dtype, check_float = H.sizes_str, H.dtype_name, H.input_dtype,
   H.check_float
local suggest, ntuple, fill, option_set = H.suggest, H.ntuple, H.fill, H.option_set

local F = H.F

-- inside lm.autocast the convolutions cast their floating inputs to the low dtype
-- (lua/lumen/autocast.lua); off, one upvalue test
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_low = AC.low

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")
local p3 = ffi.new("lm_tensor*[1]")
local sbuf, pbuf, dbuf, obuf = ffi.new("int64_t[2]"), ffi.new("int64_t[2]"),
   ffi.new("int64_t[2]"), ffi.new("int64_t[2]")
local sbuf3, pbuf3, dbuf3, obuf3 = ffi.new("int64_t[3]"), ffi.new("int64_t[3]"),
   ffi.new("int64_t[3]"), ffi.new("int64_t[3]")

local CONV_OPTS = option_set("stride", "padding", "dilation", "groups", "relu", "act", "residual")
F._OPTIONS.conv2d = CONV_OPTS

-- the epilogue activations (opts.act): their lm_conv_act codes, the ops autograd differentiates,
-- the option's check (shared with F.linear: functional/common.lua)
local ACT_CODE, ACT_OP, act_opt = H.ACT_CODE, H.ACT_OP, H.act_opt

-- the channel checks every convolution makes (input, weight, groups, bias) -> out_channels
local function conv_channels(fname, xc, wc, bc, groups)
   local cin, cout = tonumber(xc.sizes[1]), tonumber(wc.sizes[0])
   if cout % groups ~= 0 then
      err(fname, ("out_channels (%d) must be divisible by groups (%d)"):format(cout, groups))
   end
   if cin % groups ~= 0 then
      err(fname, ("in_channels (%d) must be divisible by groups (%d)"):format(cin, groups))
   end
   if tonumber(wc.sizes[1]) * groups ~= cin then
      err(fname, ("expected input with %d channels (weight of size %s, groups %d), got %d " ..
          "channels (input of size %s)"):format(tonumber(wc.sizes[1]) * groups, sizes_str(wc),
          groups, cin, sizes_str(xc)))
   end
   if bc ~= nil then
      if bc.ndim ~= 1 or tonumber(bc.sizes[0]) ~= cout then
         err(fname, ("bias must be 1-D of size %d, got size %s"):format(cout, sizes_str(bc)))
      end
      input_dtype(fname, bc, "bias", xc)
   end
   return cout
end

---------------------------------------------------------------------------------------------
-- 1-D convolution (the 2-D op over an N×C×1×L view, as PyTorch does)
---------------------------------------------------------------------------------------------

-- The 4-D view N×C×1×L of an N×C×L tensor (autograd-free): the contiguous N×C×L gives a
-- contiguous view, the N×L×C-strided one (strides {L*C, 1, C}) the channels_last view
-- {L*C, 1, L*C, C}.
local r_unsqueeze, r_squeeze, r_contiguous = raw.unsqueeze, raw.squeeze, raw.contiguous
local function view4(t) return r_unsqueeze(t, 3) end
-- a 4-D result t4 (N×C×1×L) as a 3-D tensor in the layout cl (true: N×L×C strides)
local function squeeze_as(t4, cl)
   local have = suggest(t4._c) == 1
   if have ~= cl then
      local c = r_contiguous(t4, cl and "channels_last" or nil)
      if c ~= t4 then t4:free() end
      t4 = c
   end
   local r = r_squeeze(t4, 3)
   if r ~= t4 then t4:free() end
   return r
end

-- conv1d(x, w, b, {stride=, padding=, dilation=, groups=}): x (N, C, L) or unbatched (C, L),
-- w (O, C / groups, k); padding is a number, {n}, "valid" or "same" (stride 1; an odd total
-- padding puts the extra one on the right, as PyTorch). Runs lm_conv2d on the views
-- x: N×C×1×L and w: O×C/g×1×k; a channels-last-like x (N×L×C strides) or w runs the NHWC kernels
-- on the data in place. The output's layout follows
-- the weight's as PyTorch's does (N×L×C strides for a channels-last-like weight, else
-- contiguous; the input's layout does not matter); so do both gradients (PyTorch's; a leaf's
-- .grad then takes the leaf's layout).
local CONV1D_OPTS = option_set("stride", "padding", "dilation", "groups")
F._OPTIONS.conv1d = CONV1D_OPTS
function F.conv1d(x, w, b, opts)
   local fname = "conv1d"
   if ac_on then x, w, b = ac_low(x), ac_low(w), ac_low(b) end
   local xc = tensor_arg(fname, x, "input")
   local wc = tensor_arg(fname, w, "weight")
   local bc = opt_tensor(fname, b, "bias")
   opts = check_opts(fname, opts, CONV1D_OPTS)
   if xc.ndim == 2 then                     -- unbatched (C, L)
      return Tensor.squeeze(F.conv1d(Tensor.unsqueeze(x, 1), w, b, opts), 1)
   end
   if xc.ndim ~= 3 then
      err(fname, ("expected 2-D (unbatched) or 3-D (batched) input, got %d-D input of size %s")
          :format(xc.ndim, sizes_str(xc)))
   end
   if wc.ndim ~= 3 then
      err(fname, ("weight must be 3-D (out_channels, in_channels / groups, kW), got %d-D " ..
          "of size %s"):format(wc.ndim, sizes_str(wc)))
   end
   check_float(fname, xc, "input")
   if wc.dtype ~= xc.dtype then
      err(fname, ("input (%s) and weight (%s) must have the same dtype"):format(dtype_name(xc),
          dtype_name(wc)))
   end
   local stride = ntuple(1, fname, opts.stride, "stride", 1, 1)[1]
   local dilation = ntuple(1, fname, opts.dilation, "dilation", 1, 1)[1]
   local groups = int_opt(fname, opts.groups, "groups", 1, 1)
   local k = tonumber(wc.sizes[2])
   local padding, drop_first
   if opts.padding == "valid" then
      padding = 0
   elseif opts.padding == "same" then
      if stride ~= 1 then
         err(fname, "padding='same' is not supported for strided convolutions")
      end
      -- an odd total is padded one more on the right (PyTorch): computed as the convolution
      -- padded (tot + 1) / 2 on both sides without its first output
      local tot = dilation * (k - 1)
      padding = (tot + tot % 2) / 2
      drop_first = tot % 2 == 1
   else
      padding = ntuple(1, fname, opts.padding, "padding", 0, 0)[1]
   end
   conv_channels(fname, xc, wc, bc, groups)
   local L = tonumber(xc.sizes[2])
   local ek = dilation * (k - 1) + 1
   if ek > L + 2 * padding then
      err(fname, ("kernel size (%d, %d after dilation) can't be greater than the padded input " ..
          "size (%d)"):format(k, ek, L + 2 * padding))
   end
   local x4, w4 = view4(x), view4(w)
   local xcl, wcl = suggest(x4._c) == 1, suggest(w4._c) == 1
   local fmt = (xcl or wcl) and 1 or 0        -- NHWC in place when either is channels-last-like
   sbuf[0], sbuf[1], pbuf[0], pbuf[1], dbuf[0], dbuf[1] = 1, stride, 0, padding, 1, dilation
   outp[0] = nil
   check(C.lm_conv2d(x4._c, w4._c, bc, sbuf, pbuf, dbuf, groups, fmt, 0, nil, outp), fname)
   x4:free(); w4:free()
   local out = squeeze_as(wrap(outp[0]), wcl)
   if A.is_grad_enabled() and (needs(x) or needs(w) or needs(b)) then
      local need_x, need_w, need_b = needs(x), needs(w), needs(b)
      record(out, "ConvolutionBackward", function(g)
         local g4, bx, bw = view4(g), view4(x), view4(w)
         local gfmt = fmt
         if gfmt == 0 and suggest(g4._c) == 1 then gfmt = 1 end
         sbuf[0], sbuf[1], pbuf[0], pbuf[1], dbuf[0], dbuf[1] = 1, stride, 0, padding, 1, dilation
         p1[0], p2[0], p3[0] = nil, nil, nil
         check(C.lm_conv2d_backward(bx._c, bw._c, g4._c, sbuf, pbuf, dbuf, groups, gfmt,
                                    need_x and p1 or nil, need_w and p2 or nil,
                                    need_b and p3 or nil), "conv1d_backward")
         g4:free(); bx:free(); bw:free()
         local gx = need_x and squeeze_as(wrap(p1[0]), wcl) or nil
         local gw = need_w and squeeze_as(wrap(p2[0]), wcl) or nil
         local gb = need_b and wrap(p3[0]) or nil
         return fresh(gx), fresh(gw), fresh(gb)
      end, x, w, b or false)
   end
   if drop_first then           -- odd padding='same': the output without its first position
      out = Tensor.unsqueeze(Tensor.narrow(out, 3, 2, L), 3)
      out = Tensor.squeeze(Tensor.contiguous(out, wcl and "channels_last" or nil), 3)
   end
   return out
end

---------------------------------------------------------------------------------------------
-- 2-D and 3-D convolution
---------------------------------------------------------------------------------------------

-- what differs between conv2d and conv3d: the scratch buffers, the C entry points, the
-- channels-last format id and the words of the errors
local CONV_ND = {
   [2] = { fname = "conv2d", sb = sbuf, pb = pbuf, db = dbuf, ob = obuf,
           output_size = C.lm_conv2d_output_size, run = C.lm_conv2d,
           backward = C.lm_conv2d_backward, memory_format = C.lm_conv_memory_format, cl = 1,
           input = "(N, C, H, W)", unbatched = "(C, H, W)", kernel = "kH, kW" },
   [3] = { fname = "conv3d", sb = sbuf3, pb = pbuf3, db = dbuf3, ob = obuf3,
           output_size = C.lm_conv3d_output_size, run = C.lm_conv3d,
           backward = C.lm_conv3d_backward, memory_format = C.lm_conv3d_memory_format, cl = 2,
           input = "(N, C, D, H, W)", unbatched = "(C, D, H, W)", kernel = "kD, kH, kW" },
}

local function dims_str(t, add)
   local r = {}
   for i = 1, #t do r[i] = tostring(t[i] + (add and add[i] or 0)) end
   return table.concat(r, " x ")
end

-- conv{nd}d(x, w, b, {stride=, padding=, dilation=, groups=, residual=, relu=, act=}); sizes are
-- numbers or tables of nd values; padding may be "valid" or "same". The epilogue
-- act(conv + b + residual) (residual: a tensor of the output's shape and dtype, any strides;
-- act: "relu", "relu6", "silu", "hardswish", "hardsigmoid", "sigmoid", "gelu", "gelu_tanh" or
-- "none"; relu = true is act = "relu") runs inside the kernel, as the results are stored, when
-- no gradient is wanted (inference, a folded model); when one is, it runs as the separate ops
-- (Tensor.add, F.silu, ...), which autograd differentiates. The output is channels-last
-- (channels_last / channels_last_3d) when x or w suggests it (PyTorch's rule), else contiguous.
local function conv_nd(nd, x, w, b, opts)
   local K = CONV_ND[nd]
   local fname = K.fname
   if ac_on then
      x, w, b = ac_low(x), ac_low(w), ac_low(b)
      local r = type(opts) == "table" and getmetatable(opts) == nil and opts.residual
      local r2 = r and ac_low(r)
      if r2 ~= r then opts = opts_with(opts, "residual", r2) end
   end
   local xc = tensor_arg(fname, x, "input")
   local wc = tensor_arg(fname, w, "weight")
   local bc = opt_tensor(fname, b, "bias")
   opts = check_opts(fname, opts, CONV_OPTS)
   if xc.ndim == nd + 1 then                -- unbatched; so is a residual
      local rc = opt_tensor(fname, opts.residual, "residual")
      if rc ~= nil then
         if rc.ndim ~= nd + 1 then
            err(fname, ("residual must be %d-D %s like the unbatched input, got size %s")
                :format(nd + 1, K.unbatched, sizes_str(rc)))
         end
         opts = opts_with(opts, "residual", Tensor.unsqueeze(opts.residual, 1))
      end
      return Tensor.squeeze(conv_nd(nd, Tensor.unsqueeze(x, 1), w, b, opts), 1)
   end
   if xc.ndim ~= nd + 2 then
      err(fname, ("expected %d-D (unbatched) or %d-D (batched) input, got %d-D input of size %s")
          :format(nd + 1, nd + 2, xc.ndim, sizes_str(xc)))
   end
   if wc.ndim ~= nd + 2 then
      err(fname, ("weight must be %d-D (out_channels, in_channels / groups, %s), got %d-D " ..
          "of size %s"):format(nd + 2, K.kernel, wc.ndim, sizes_str(wc)))
   end
   check_float(fname, xc, "input")
   if wc.dtype ~= xc.dtype then
      err(fname, ("input (%s) and weight (%s) must have the same dtype"):format(dtype_name(xc),
          dtype_name(wc)))
   end
   local stride = ntuple(nd, fname, opts.stride, "stride", 1, 1)
   local dilation = ntuple(nd, fname, opts.dilation, "dilation", 1, 1)
   local groups = int_opt(fname, opts.groups, "groups", 1, 1)
   local k, padding = {}, {}
   for i = 1, nd do k[i] = tonumber(wc.sizes[i + 1]) end
   if opts.padding == "valid" then
      for i = 1, nd do padding[i] = 0 end
   elseif opts.padding == "same" then
      for i = 1, nd do
         if stride[i] ~= 1 then
            err(fname, "padding='same' is not supported for strided convolutions")
         end
      end
      -- an odd total (an even kernel extent) puts the extra zero on the right, as PyTorch:
      -- the input padded by one there (F.pad, differentiable, format kept), then the
      -- symmetric half on both sides
      local extra, odd = {}, false
      for i = 1, nd do
         local t = dilation[i] * (k[i] - 1)
         padding[i] = math.floor(t / 2)
         extra[i] = t % 2
         if extra[i] ~= 0 then odd = true end
      end
      if odd then
         local pads = {}
         for i = nd, 1, -1 do
            pads[#pads + 1] = 0
            pads[#pads + 1] = extra[i]
         end
         return conv_nd(nd, F.pad(x, pads), w, b, opts_with(opts, "padding", padding))
      end
   else
      padding = ntuple(nd, fname, opts.padding, "padding", 0, 0)
   end
   local cout = conv_channels(fname, xc, wc, bc, groups)
   local insz, ext, pad2 = {}, {}, {}
   local fits = true
   for i = 1, nd do
      insz[i] = tonumber(xc.sizes[i + 1])
      ext[i] = dilation[i] * (k[i] - 1) + 1
      pad2[i] = 2 * padding[i]
      if ext[i] > insz[i] + pad2[i] then fits = false end
   end
   if not fits then
      err(fname, ("kernel size (%s, %s after dilation) can't be greater than the padded input " ..
          "size (%s)"):format(dims_str(k), dims_str(ext), dims_str(insz, pad2)))
   end
   local act = act_opt(fname, opts)
   local residual = opts.residual
   local resc = opt_tensor(fname, residual, "residual")
   local sb, pb, db = fill(K.sb, stride), fill(K.pb, padding), fill(K.db, dilation)
   if resc ~= nil then
      -- exactly the output's shape and the input's dtype, whichever path runs below
      check(K.output_size(xc.sizes + 2, wc.sizes + 2, sb, pb, db, K.ob), fname)
      local osz = { tonumber(xc.sizes[0]), cout }
      for i = 1, nd do osz[i + 2] = tonumber(K.ob[i - 1]) end
      local same = resc.ndim == nd + 2
      for d = 1, nd + 2 do same = same and tonumber(resc.sizes[d - 1]) == osz[d] end
      if not same then
         err(fname, ("residual of size %s does not match the output size (%s)")
             :format(sizes_str(resc), table.concat(osz, ", ")))
      end
      input_dtype(fname, resc, "residual", xc)
   end
   if act or resc ~= nil then
      local rec = A.is_grad_enabled() and (needs(x) or needs(w) or needs(b) or
                                           (resc ~= nil and needs(residual)))
      if rec then
         -- the separate ops, which autograd differentiates: act(conv(x, w, b) + residual)
         local o = opts_with(opts, "residual", nil, "relu", nil)
         o.act = nil
         local y = conv_nd(nd, x, w, b, o)
         if residual ~= nil then y = Tensor.add(y, residual) end
         if act then y = ACT_OP[act](y) end
         return y
      end
   end
   local fmt = K.memory_format(xc, wc)
   outp[0] = nil
   check(K.run(xc, wc, bc, sb, pb, db, groups, fmt, act and ACT_CODE[act] or C.LM_ACT_NONE, resc,
               outp), fname)
   local out = wrap(outp[0])
   if act or resc ~= nil then return out end     -- no gradient wanted (checked above)
   if A.is_grad_enabled() and (needs(x) or needs(w) or needs(b)) then
      local need_x, need_w, need_b = needs(x), needs(w), needs(b)
      record(out, "ConvolutionBackward", function(g)
         local gc = g._c
         local gfmt = fmt
         if gfmt == 0 and suggest(gc) == K.cl then gfmt = K.cl end
         p1[0], p2[0], p3[0] = nil, nil, nil
         check(K.backward(x._c, w._c, gc, fill(K.sb, stride), fill(K.pb, padding),
                          fill(K.db, dilation), groups, gfmt, need_x and p1 or nil,
                          need_w and p2 or nil, need_b and p3 or nil), fname .. "_backward")
         local gx = need_x and wrap(p1[0]) or nil
         local gw = need_w and wrap(p2[0]) or nil
         local gb = need_b and wrap(p3[0]) or nil
         return fresh(gx), fresh(gw), fresh(gb)
      end, x, w, b or false)
   end
   return out
end

-- conv2d(x, w, b, opts): x (N, C, H, W) or unbatched (C, H, W), w (O, C / groups, kH, kW);
-- sizes are numbers or {h, w} (see conv_nd)
function F.conv2d(x, w, b, opts) return conv_nd(2, x, w, b, opts) end

-- conv3d(x, w, b, opts): x (N, C, D, H, W) or unbatched (C, D, H, W), w (O, C / groups, kD, kH,
-- kW); sizes are numbers or {d, h, w}. lm_conv3d runs it as conv2d over the N*Do output depth
-- planes (src/ops/conv3d.c); the output is channels_last_3d when x or w suggests it.
function F.conv3d(x, w, b, opts) return conv_nd(3, x, w, b, opts) end
F._OPTIONS.conv3d = CONV_OPTS
