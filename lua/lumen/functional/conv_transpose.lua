-- lumen.functional.conv_transpose -- lm.F.conv_transpose1d / 2d / 3d (issue 40), each with its
-- backward, on the convolution kernels (no kernel of their own).
--
-- A transposed convolution is the backward-data of a convolution: with PyTorch's weight layout
-- (C_in, C_out / groups, k...) the weight IS the weight of the convolution that maps the
-- transposed convolution's output (C_out channels) back to its input (C_in channels), so
--   forward:     out = grad_input of that convolution for grad_output = x
--                (lm_conv2d_backward / lm_conv3d_backward with grad_x only; the convolution's
--                input, whose sizes alone are read, is a broadcast element standing in), + bias;
--   grad_input:  the convolution itself run forward on grad_out (lm_conv2d / lm_conv3d);
--   grad_weight: that convolution's weight gradient with input grad_out and grad_output x;
--   grad_bias:   grad_out summed over all dims but the channels.
-- output_padding widens the output (the stand-in's sizes); the rows it adds get only the bias.
-- conv_transpose1d runs the 2-D path on N x C x 1 x L views, as conv1d does. Output and
-- gradients are channels-last (channels_last / channels_last_3d) when x or w suggests it (the
-- convolution's rule; PyTorch's conv_transpose3d drops channels_last_3d, lumen keeps it).

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")
local AC = require("lumen.autocast")

local tonumber = tonumber

-- inside lm.autocast the transposed convolutions cast their floating inputs to the low dtype,
-- as the convolutions do (PyTorch's lower-precision list has conv_transpose1d/2d/3d)
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_low = AC.low

local Tensor, R, wrap = T.Tensor, T.raw, T.wrap
local needs, record, fresh = A.needs, A.record, A.fresh
local err, check, tensor_arg, opt_tensor = H.err, H.check, H.tensor_arg, H.opt_tensor
local check_opts, int_opt = H.check_opts, H.int_opt
local sizes_str, dtype_name, check_float = H.sizes_str, H.dtype_name, H.check_float
local suggest, ntuple, fill, option_set = H.suggest, H.ntuple, H.fill, H.option_set

local F = H.F

local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")
local sbuf, pbuf, dbuf = ffi.new("int64_t[3]"), ffi.new("int64_t[3]"), ffi.new("int64_t[3]")

local OPTS = option_set("stride", "padding", "output_padding", "groups", "dilation")
F._OPTIONS.conv_transpose1d = OPTS
F._OPTIONS.conv_transpose2d = OPTS
F._OPTIONS.conv_transpose3d = OPTS

-- the kernels per spatial rank (the 1-D op runs the 2-D ones)
local K = {
   [2] = { run = C.lm_conv2d, backward = C.lm_conv2d_backward, memory_format =
           C.lm_conv_memory_format, cl = 1 },
   [3] = { run = C.lm_conv3d, backward = C.lm_conv3d_backward, memory_format =
           C.lm_conv3d_memory_format, cl = 2 },
}

-- x as the convolution's grad_output: that convolution, run on the output's sizes, has
-- n + floor(output_padding / stride) positions in a dim where x has n, more than n when an
-- output_padding of at least the stride (allowed below the dilation: stride 1, dilation 2,
-- output_padding 1) widens the output. x zero-padded at the end to those sizes stands in then
-- (the added positions add nothing), in the forward and the weight gradient.
local function x_for_conv(nd, x, geo)
   local sizes, grow = { R.size(x, 1), R.size(x, 2) }, false
   for i = 1, nd do
      local n = R.size(x, i + 2)
      sizes[i + 2] = n + math.floor(geo.output_padding[i] / geo.stride[i])
      if sizes[i + 2] ~= n then grow = true end
   end
   if not grow then return x end
   local dt = require("lumen.dtype")
   local z = require("lumen.creation").zeros(sizes, { dtype = R.dtype(x), device = R.device(x),
      memory_format = geo.fmt == 0 and dt.contiguous_format
         or (nd == 2 and dt.channels_last or dt.channels_last_3d) })
   local v = z
   for i = 1, nd do v = R.narrow(v, i + 2, 1, R.size(x, i + 2)) end
   R.copy_(v, x)
   return z
end

-- the forward over raw tensors x (N, Cin, ...), w (Cin, Cout/g, k...): the output (raw)
local function forward(nd, fname, x, w, b, geo)
   local k = K[nd]
   x = x_for_conv(nd, x, geo)
   local osz = { R.size(x, 1), geo.cout }
   local zs = {}
   for i = 1, nd + 2 do zs[i] = 0 end
   for i = 1, nd do osz[i + 2] = geo.out[i] end
   local one = require("lumen.creation").zeros({ 1 }, { dtype = R.dtype(x),
                                                         device = R.device(x) })
   local stand = R.as_strided(one, osz, zs, 0)
   p1[0] = nil
   check(k.backward(stand._c, w._c, x._c, fill(sbuf, geo.stride), fill(pbuf, geo.padding),
                    fill(dbuf, geo.dilation), geo.groups, geo.fmt, p1, nil, nil), fname)
   local out = wrap(p1[0])
   if b ~= nil then
      local bs = { 1, geo.cout }
      for i = 1, nd do bs[i + 2] = 1 end
      R.add_(out, R.view(b, bs))
   end
   return out
end

-- the gradients (raw; nil where not wanted) for the raw gradient g of the output
local function backward(nd, fname, x, w, g, geo, need_x, need_w, need_b)
   local k = K[nd]
   local fmt = geo.fmt
   if fmt == 0 and suggest(g._c) == k.cl then fmt = k.cl end
   local gx, gw, gb
   if need_x then
      p1[0] = nil
      check(k.run(g._c, w._c, nil, fill(sbuf, geo.stride), fill(pbuf, geo.padding),
                  fill(dbuf, geo.dilation), geo.groups, fmt, 0, nil, p1), fname .. "_backward")
      gx = wrap(p1[0])
      -- an output_padding of at least the stride (allowed below the dilation) gives the
      -- convolution more outputs than x has: x's are the first
      local narrowed = false
      for i = 1, nd do
         local n = R.size(x, i + 2)
         if R.size(gx, i + 2) ~= n then gx = R.narrow(gx, i + 2, 1, n); narrowed = true end
      end
      if narrowed then
         gx = R.contiguous(gx, fmt ~= 0 and (nd == 2 and "channels_last" or "channels_last_3d")
                           or nil)
      end
   end
   if need_w then
      p2[0] = nil
      local xs = x_for_conv(nd, x, geo)
      check(k.backward(g._c, w._c, xs._c, fill(sbuf, geo.stride), fill(pbuf, geo.padding),
                       fill(dbuf, geo.dilation), geo.groups, fmt, nil, p2, nil),
            fname .. "_backward")
      gw = wrap(p2[0])
   end
   if need_b then
      local dims = { 1 }
      for i = 1, nd do dims[i + 1] = i + 2 end
      gb = R.sum(g, dims)
   end
   return gx, gw, gb
end

-- the checks and the geometry: {stride, padding, output_padding, dilation, groups, cout, out}
local function geometry(fname, nd, xc, wc, bc, opts, sp)
   local stride = ntuple(sp, fname, opts.stride, "stride", 1, 1)
   local padding = ntuple(sp, fname, opts.padding, "padding", 0, 0)
   local opad = ntuple(sp, fname, opts.output_padding, "output_padding", 0, 0)
   local dilation = ntuple(sp, fname, opts.dilation, "dilation", 1, 1)
   local groups = int_opt(fname, opts.groups, "groups", 1, 1)
   local cin = tonumber(xc.sizes[1])
   if tonumber(wc.sizes[0]) ~= cin then
      err(fname, ("expected weight of size (%d, C_out / groups, ...) for input with %d " ..
          "channels, got weight of size %s"):format(cin, cin, sizes_str(wc)))
   end
   if cin % groups ~= 0 then
      err(fname, ("in_channels (%d) must be divisible by groups (%d)"):format(cin, groups))
   end
   local cout = tonumber(wc.sizes[1]) * groups
   if bc ~= nil then
      if bc.ndim ~= 1 or tonumber(bc.sizes[0]) ~= cout then
         err(fname, ("bias must be 1-D of size %d, got size %s"):format(cout, sizes_str(bc)))
      end
      H.input_dtype(fname, bc, "bias", xc)
   end
   local out = {}
   for i = 1, sp do
      if opad[i] >= stride[i] and opad[i] >= dilation[i] then
         err(fname, ("output padding must be smaller than either stride or dilation, got " ..
             "output_padding %d, stride %d, dilation %d"):format(opad[i], stride[i],
             dilation[i]))
      end
      local n = tonumber(xc.sizes[i + 1 + (nd - sp)])
      local kk = tonumber(wc.sizes[i + 1 + (nd - sp)])
      out[i] = (n - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kk - 1) + opad[i] + 1
      if out[i] < 1 then
         err(fname, ("the output size (%d) of spatial dim %d is not positive (input %d, " ..
             "kernel %d, stride %d, padding %d, dilation %d, output_padding %d)"):format(out[i],
             i, n, kk, stride[i], padding[i], dilation[i], opad[i]))
      end
   end
   return { stride = stride, padding = padding, output_padding = opad, dilation = dilation,
            groups = groups, cout = cout, out = out }
end

local INPUT = { [1] = "(N, C, L)", [2] = "(N, C, H, W)", [3] = "(N, C, D, H, W)" }

-- conv_transpose{sp}d(x, w, b, {stride=, padding=, output_padding=, groups=, dilation=})
local function conv_transpose(sp, x, w, b, opts)
   local fname = "conv_transpose" .. sp .. "d"
   if ac_on then x, w, b = ac_low(x), ac_low(w), ac_low(b) end
   local xc = tensor_arg(fname, x, "input")
   local wc = tensor_arg(fname, w, "weight")
   local bc = opt_tensor(fname, b, "bias")
   opts = check_opts(fname, opts, OPTS)
   H.same_device(fname, x, w, "weight", b, "bias")
   if xc.ndim == sp + 1 then                -- unbatched
      return Tensor.squeeze(conv_transpose(sp, Tensor.unsqueeze(x, 1), w, b, opts), 1)
   end
   if xc.ndim ~= sp + 2 then
      err(fname, ("expected %d-D (unbatched) or %d-D (batched) input %s, got %d-D input of " ..
          "size %s"):format(sp + 1, sp + 2, INPUT[sp], xc.ndim, sizes_str(xc)))
   end
   if wc.ndim ~= sp + 2 then
      err(fname, ("weight must be %d-D (in_channels, out_channels / groups, kernel...), got " ..
          "%d-D of size %s"):format(sp + 2, wc.ndim, sizes_str(wc)))
   end
   check_float(fname, xc, "input")
   if wc.dtype ~= xc.dtype then
      err(fname, ("input (%s) and weight (%s) must have the same dtype"):format(dtype_name(xc),
          dtype_name(wc)))
   end
   local geo = geometry(fname, sp, xc, wc, bc, opts, sp)
   local nd = sp == 1 and 2 or sp
   local xr, wr = x, w
   if sp == 1 then
      -- the 2-D geometry over N x C x 1 x L views
      xr, wr = R.unsqueeze(x, 3), R.unsqueeze(w, 3)
      geo.stride = { 1, geo.stride[1] }
      geo.padding = { 0, geo.padding[1] }
      geo.dilation = { 1, geo.dilation[1] }
      geo.output_padding = { 0, geo.output_padding[1] }
      geo.out = { 1, geo.out[1] }
   end
   local xcl = suggest(xr._c) == K[nd].cl
   local wcl = suggest(wr._c) == K[nd].cl
   geo.fmt = (xcl or wcl) and K[nd].cl or 0
   local out = forward(nd, fname, xr, wr, b, geo)
   if sp == 1 then out = R.squeeze(out, 3) end
   if A.is_grad_enabled() and (needs(x) or needs(w) or needs(b)) then
      local need_x, need_w, need_b = needs(x), needs(w), needs(b)
      record(out, "ConvolutionBackward", function(g)
         local gr = sp == 1 and R.unsqueeze(g, 3) or g
         local gx, gw, gb = backward(nd, fname, xr, wr, gr, geo, need_x, need_w, need_b)
         if sp == 1 then
            gx = gx and R.squeeze(gx, 3)
            gw = gw and R.squeeze(gw, 3)
         end
         return fresh(gx), fresh(gw), fresh(gb)
      end, x, w, b or false)
   end
   return out
end

-- conv_transpose1d(x, w, b, opts): x (N, C_in, L) or (C_in, L), w (C_in, C_out / groups, k)
function F.conv_transpose1d(x, w, b, opts) return conv_transpose(1, x, w, b, opts) end
-- conv_transpose2d(x, w, b, opts): x (N, C_in, H, W) or (C_in, H, W), w (C_in, C_out / groups,
-- kH, kW); sizes are numbers or {h, w}
function F.conv_transpose2d(x, w, b, opts) return conv_transpose(2, x, w, b, opts) end
-- conv_transpose3d(x, w, b, opts): x (N, C_in, D, H, W) or (C_in, D, H, W), w (C_in,
-- C_out / groups, kD, kH, kW); sizes are numbers or {d, h, w}
function F.conv_transpose3d(x, w, b, opts) return conv_transpose(3, x, w, b, opts) end

return F
