-- lumen.functional -- lm.nn.functional (alias lm.F): convolution, pooling, batch norm,
-- activations, dropout, softmax and losses, each with its backward.
--
-- The kernels live in C (src/conv.h, src/nn.h); this file validates arguments (errors are
-- "lumen.<fn>: ..."), picks memory formats the way PyTorch does (memory_format.md section 7) and
-- records the autograd node. Index conventions follow the Lua API: class targets of nll_loss /
-- cross_entropy and the indices returned by the max pools are 1-BASED (the C kernels are
-- 0-based; the conversion happens here).

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local AC = require("lumen.autocast")
local util = require("lumen.util")
local unknown_option = util.unknown_option

local type, tostring, tonumber, getmetatable, rawget, pairs = type, tostring, tonumber,
   getmetatable, rawget, pairs
local floor = math.floor

local Tensor, raw, wrap, argerror = T.Tensor, T.raw, T.wrap, T.argerror
local typename, wrap_dim = T.typename, T.wrap_dim
local needs, record, sizes_of, fresh = A.needs, A.record, A.sizes_of, A.fresh

local F = {}

-- inside lm.autocast: conv2d / linear cast their floating inputs to the low dtype, softmax,
-- log_softmax and the losses to float32 (lua/lumen/autocast.lua); off, one upvalue test
local ac_on = false
AC.subscribe(function(on) ac_on = on end)
local ac_low, ac_f32 = AC.low, AC.f32

---------------------------------------------------------------------------------------------
-- helpers
---------------------------------------------------------------------------------------------

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local idxp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")
local p3 = ffi.new("lm_tensor*[1]")
local kbuf = ffi.new("int64_t[2]")
local sbuf = ffi.new("int64_t[2]")
local pbuf = ffi.new("int64_t[2]")
local dbuf = ffi.new("int64_t[2]")
local obuf = ffi.new("int64_t[2]")

local function err(fname, msg) argerror(fname, msg) end

local function raise(fname)
   error("lumen." .. fname .. ": " .. ffi.string(C.lm_last_error()), T.user_level and
         T.user_level() or 2)
end

local function check(st, fname)
   if st ~= 0 then raise(fname) end
end

local function tensor_arg(fname, x, what)
   if getmetatable(x) ~= T.mt then
      err(fname, what .. ": tensor expected, got " .. typename(x))
   end
   local c = T.cdata(x)
   if c == nil then err(fname, what .. " is a freed tensor") end
   return c
end

local function opt_tensor(fname, x, what)
   if x == nil or x == false then return nil end
   return tensor_arg(fname, x, what)
end

-- a copy of the options table with some entries replaced (nil removes one)
local function opts_with(opts, k1, v1, k2, v2)
   local o = {}
   for k, v in pairs(opts) do o[k] = v end
   o[k1] = v1
   if k2 ~= nil then o[k2] = v2 end
   return o
end

-- opts: nil or a plain table whose keys are all in the set known (an unknown key is an error)
local function check_opts(fname, opts, known)
   if opts ~= nil then
      if type(opts) ~= "table" or getmetatable(opts) ~= nil then
         err(fname, "options must be a table, got " .. typename(opts))
      end
      local k = unknown_option(opts, known)
      if k ~= nil then err(fname, util.unknown_option_msg(k)) end
   end
   return opts or {}
end

-- the options each function takes
local option_set = util.option_set
local CONV_OPTS = option_set("stride", "padding", "dilation", "groups", "relu", "residual")
local MAX_POOL_OPTS = option_set("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                 "return_indices")
local AVG_POOL_OPTS = option_set("kernel_size", "stride", "padding", "ceil_mode",
                                 "count_include_pad", "divisor_override")
local BN_OPTS = option_set("training", "momentum", "eps", "residual", "relu")
local NLL_OPTS = option_set("weight", "ignore_index", "reduction")
local MSE_OPTS = option_set("reduction")
local RELU_OPTS = option_set("inplace")
-- the known keys per function (private: for tools and specs)
F._OPTIONS = { conv2d = CONV_OPTS, max_pool2d = MAX_POOL_OPTS, avg_pool2d = AVG_POOL_OPTS,
              batch_norm = BN_OPTS, nll_loss = NLL_OPTS, cross_entropy = NLL_OPTS,
              mse_loss = MSE_OPTS }

local function sizes_str(c)
   local s = {}
   for i = 0, c.ndim - 1 do s[#s + 1] = tostring(tonumber(c.sizes[i])) end
   return "(" .. table.concat(s, ", ") .. ")"
end

-- the floating dtypes; float16 and bfloat16 compute in float32 where a kernel has no native path
local function is_float(c)
   local d = c.dtype
   return d == C.LM_FLOAT32 or d == C.LM_FLOAT64 or d == C.LM_FLOAT16 or d == C.LM_BFLOAT16
end

local function dtype_name(c) return tostring(dtypes.from_id(c.dtype)) end

-- an operand (cdata c, named what) that must have the input's dtype
local function input_dtype(fname, c, what, xc)
   if c.dtype ~= xc.dtype then
      err(fname, ("%s (%s) must have the input's dtype (%s)"):format(what, dtype_name(c),
          dtype_name(xc)))
   end
end

local function check_float(fname, c, what)
   if not is_float(c) then
      err(fname, ("expected %s of a floating dtype (float32, float64, float16, bfloat16), got %s")
          :format(what, dtype_name(c)))
   end
end

-- a number or {h, w} -> {h, w} of integers; min is the smallest allowed value
local function pair(fname, v, what, default, min)
   if v == nil then
      if default == nil then err(fname, what .. " is required") end
      v = default
   end
   local h, w
   if type(v) == "number" then h, w = v, v
   elseif T.is_sizes(v) then
      if #v == 1 then h, w = v[1], v[1]
      elseif #v == 2 then h, w = v[1], v[2]
      else err(fname, what .. " must be a number or {h, w}, got " .. #v .. " values") end
   else
      err(fname, what .. " must be a number or {h, w}, got " .. typename(v))
   end
   if type(h) ~= "number" or type(w) ~= "number" or h % 1 ~= 0 or w % 1 ~= 0 then
      err(fname, what .. " must hold integers, got " .. tostring(h) .. ", " .. tostring(w))
   end
   if h < min or w < min then
      err(fname, ("%s must be %s, got (%d, %d)"):format(what,
          min == 0 and "non-negative" or ("at least " .. min), h, w))
   end
   return { h, w }
end

local function fill2(buf, p) buf[0] = p[1]; buf[1] = p[2]; return buf end

local function int_opt(fname, v, what, default, min)
   if v == nil then return default end
   if type(v) ~= "number" or v % 1 ~= 0 then
      err(fname, what .. " must be an integer, got " .. tostring(v))
   end
   if v < min then err(fname, ("%s must be at least %d, got %d"):format(what, min, v)) end
   return v
end

local function bool_opt(fname, v, what, default)
   if v == nil then return default end
   if type(v) ~= "boolean" then err(fname, what .. " must be a boolean, got " .. typename(v)) end
   return v
end

-- the (C) format of a tensor as a kernel picks it (lm_suggest_memory_format)
local function suggest(c) return C.lm_suggest_memory_format(c, 0) end

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
-- convolution
---------------------------------------------------------------------------------------------

-- F.conv2d and F.conv3d: below the 3-D pools' helpers (conv_nd)

---------------------------------------------------------------------------------------------
-- 1-D convolution and pooling (on the 2-D ops over an N×C×1×L view, as PyTorch does)
---------------------------------------------------------------------------------------------

-- a number or {n} -> n, an integer of at least min
local function single(fname, v, what, default, min)
   if v == nil then
      if default == nil then err(fname, what .. " is required") end
      v = default
   end
   if T.is_sizes(v) then
      if #v ~= 1 then err(fname, what .. " must be a number or {n}, got " .. #v .. " values") end
      v = v[1]
   end
   if type(v) ~= "number" then
      err(fname, what .. " must be a number or {n}, got " .. typename(v))
   end
   if v % 1 ~= 0 then err(fname, what .. " must be an integer, got " .. tostring(v)) end
   if v < min then
      err(fname, ("%s must be %s, got %d"):format(what,
          min == 0 and "non-negative" or ("at least " .. min), v))
   end
   return v
end

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
   local stride = single(fname, opts.stride, "stride", 1, 1)
   local dilation = single(fname, opts.dilation, "dilation", 1, 1)
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
      padding = single(fname, opts.padding, "padding", 0, 0)
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
-- pooling
---------------------------------------------------------------------------------------------

local function pool_input(fname, x)
   local xc = tensor_arg(fname, x, "input")
   if xc.ndim ~= 3 and xc.ndim ~= 4 then
      err(fname, ("expected 3-D (unbatched) or 4-D (batched) input, got %d-D input of size %s")
          :format(xc.ndim, sizes_str(xc)))
   end
   check_float(fname, xc, "input")
   return xc
end

-- pooling options: a table, or the kernel size (number or {h, w})
local function pool_opts(fname, opts, known)
   if type(opts) == "number" or (T.is_sizes(opts) and opts[1] ~= nil) then
      return { kernel_size = opts }
   end
   if opts == nil then err(fname, "kernel_size is required") end
   return check_opts(fname, opts, known)
end

-- kernel, padding, dilation: one entry per spatial dim (2-D and 3-D pools)
local function check_pad(fname, kernel, padding, dilation)
   for i = 1, #kernel do
      local ek = dilation and (dilation[i] * (kernel[i] - 1) + 1) or kernel[i]
      if padding[i] * 2 > ek then
         err(fname, ("pad should be at most half of effective kernel size, but got pad=%d, " ..
             "kernel_size=%d and dilation=%d"):format(padding[i], kernel[i],
             dilation and dilation[i] or 1))
      end
   end
end

-- max_pool2d(x, {kernel_size=, stride=, padding=, dilation=, ceil_mode=, return_indices=})
-- For autograd the backward is given the window geometry (channels-last gathers instead of
-- scattering). Without return_indices, a channels-last input (suggest == 1) saves the tap number
-- of each window's max (uint8, lm_max_pool2d_taps) instead of the int64 index: an eighth of the
-- memory (contiguous inputs keep the indices, which they scatter faster). The saved indices or
-- taps are internal (return_indices hands out a 1-based copy): they are freed as soon as the
-- backward has used them, so the next forward reuses their memory while it is still in cache. A
-- second backward through a retained graph (the closure cannot tell) computes them again from x,
-- which must not have changed since the forward (the autograd rule for saved tensors).
function F.max_pool2d(x, opts)
   local fname = "max_pool2d"
   local xc = pool_input(fname, x)
   opts = pool_opts(fname, opts, MAX_POOL_OPTS)
   local kernel = pair(fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = pair(fname, opts.stride, "stride", kernel, 1)
   local padding = pair(fname, opts.padding, "padding", 0, 0)
   local dilation = pair(fname, opts.dilation, "dilation", 1, 1)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local want_idx = bool_opt(fname, opts.return_indices, "return_indices", false)
   check_pad(fname, kernel, padding, dilation)
   local rec = A.is_grad_enabled() and needs(x)
   local taps = rec and not want_idx and kernel[1] * kernel[2] <= 255 and suggest(xc) == 1
   local cm = ceil_mode and 1 or 0
   outp[0], idxp[0] = nil, nil
   if taps then
      check(C.lm_max_pool2d_taps(xc, fill2(kbuf, kernel), fill2(sbuf, stride),
                                 fill2(pbuf, padding), fill2(dbuf, dilation), cm, outp, idxp),
            fname)
   else
      check(C.lm_max_pool2d(xc, fill2(kbuf, kernel), fill2(sbuf, stride), fill2(pbuf, padding),
                            fill2(dbuf, dilation), cm, outp, (rec or want_idx) and idxp or nil),
            fname)
   end
   local out = wrap(outp[0])
   local idx = (rec or want_idx) and wrap(idxp[0]) or nil
   if rec then
      local bwd = taps and C.lm_max_pool2d_taps_backward or C.lm_max_pool2d_backward_geom
      record(out, "MaxPool2DWithIndicesBackward", function(g)
         local ic = idx._c
         if ic == nil then -- freed by an earlier backward: the same ones again
            local fwd = taps and C.lm_max_pool2d_taps or C.lm_max_pool2d
            p2[0], idxp[0] = nil, nil
            check(fwd(x._c, fill2(kbuf, kernel), fill2(sbuf, stride), fill2(pbuf, padding),
                      fill2(dbuf, dilation), cm, p2, idxp), "max_pool2d_backward")
            C.lm_tensor_free(p2[0])
            idx = wrap(idxp[0])
            ic = idx._c
         end
         p1[0] = nil
         check(bwd(g._c, x._c, ic, fill2(kbuf, kernel), fill2(sbuf, stride),
                   fill2(pbuf, padding), fill2(dbuf, dilation), cm, p1), "max_pool2d_backward")
         idx:free()
         return fresh(wrap(p1[0]))
      end, x)
   end
   if want_idx then return out, raw.add(idx, 1) end
   return out
end

-- avg_pool2d(x, {kernel_size=, stride=, padding=, ceil_mode=, count_include_pad=,
--                divisor_override=})
function F.avg_pool2d(x, opts)
   local fname = "avg_pool2d"
   local xc = pool_input(fname, x)
   opts = pool_opts(fname, opts, AVG_POOL_OPTS)
   local kernel = pair(fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = pair(fname, opts.stride, "stride", kernel, 1)
   local padding = pair(fname, opts.padding, "padding", 0, 0)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local cip = bool_opt(fname, opts.count_include_pad, "count_include_pad", true)
   local dov = opts.divisor_override
   if dov ~= nil then
      dov = int_opt(fname, dov, "divisor_override", nil, 1)
   end
   check_pad(fname, kernel, padding, nil)
   local dovbuf = dov and ffi.new("int64_t[1]", dov) or nil
   outp[0] = nil
   check(C.lm_avg_pool2d(xc, fill2(kbuf, kernel), fill2(sbuf, stride), fill2(pbuf, padding),
                         ceil_mode and 1 or 0, cip and 1 or 0, dovbuf, outp), fname)
   local out = wrap(outp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AvgPool2DBackward", function(g)
         p1[0] = nil
         check(C.lm_avg_pool2d_backward(g._c, x._c, fill2(kbuf, kernel), fill2(sbuf, stride),
                                        fill2(pbuf, padding), ceil_mode and 1 or 0,
                                        cip and 1 or 0, dovbuf, p1), "avg_pool2d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   return out
end

-- output size: a number, or {h, w} where false / nil keeps the input's size
local function adaptive_size(fname, xc, size)
   if size == nil then err(fname, "output_size is required") end
   local H, W = tonumber(xc.sizes[xc.ndim - 2]), tonumber(xc.sizes[xc.ndim - 1])
   local h, w
   if type(size) == "number" then h, w = size, size
   elseif T.is_sizes(size) then
      h, w = size[1], size[2]
      if size[1] == nil and size[2] == nil then
         err(fname, "output_size must be a number or {h, w}")
      end
      if h == nil or h == false then h = H end
      if w == nil or w == false then w = W end
   else
      err(fname, "output_size must be a number or {h, w}, got " .. typename(size))
   end
   if type(h) ~= "number" or type(w) ~= "number" or h % 1 ~= 0 or w % 1 ~= 0 or h < 0
      or w < 0 then
      err(fname, "output_size must hold non-negative integers, got " .. tostring(h) .. ", " ..
          tostring(w))
   end
   return { h, w }
end

function F.adaptive_avg_pool2d(x, size)
   local fname = "adaptive_avg_pool2d"
   local xc = pool_input(fname, x)
   local osz = adaptive_size(fname, xc, size)
   outp[0] = nil
   check(C.lm_adaptive_avg_pool2d(xc, fill2(obuf, osz), outp), fname)
   local out = wrap(outp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AdaptiveAvgPool2DBackward", function(g)
         p1[0] = nil
         check(C.lm_adaptive_avg_pool2d_backward(g._c, x._c, p1), "adaptive_avg_pool2d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   return out
end

-- adaptive_max_pool2d(x, size) -> values, indices (int64, 1-based flat positions h*W + w + 1
-- within the input plane)
function F.adaptive_max_pool2d(x, size)
   local fname = "adaptive_max_pool2d"
   local xc = pool_input(fname, x)
   local osz = adaptive_size(fname, xc, size)
   outp[0], idxp[0] = nil, nil
   check(C.lm_adaptive_max_pool2d(xc, fill2(obuf, osz), outp, idxp), fname)
   local out = wrap(outp[0])
   local idx = wrap(idxp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AdaptiveMaxPool2DBackward", function(g)
         p1[0] = nil
         check(C.lm_adaptive_max_pool2d_backward(g._c, x._c, idx._c, p1),
               "adaptive_max_pool2d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   return out, raw.add(idx, 1)
end

-- The 1-D pools: the 2-D pool over the view N×C×1×L (unbatched C×L: C×1×L) with the geometry
-- {1, k}; the output and the gradient keep the input's layout (contiguous, or N×L×C strides) as
-- PyTorch's do. Errors the 2-D op raises name the 1-D function.
local function pool1d_input(fname, x)
   local xc = tensor_arg(fname, x, "input")
   if xc.ndim ~= 2 and xc.ndim ~= 3 then
      err(fname, ("expected 2-D (unbatched) or 3-D (batched) input, got %d-D input of size %s")
          :format(xc.ndim, sizes_str(xc)))
   end
   check_float(fname, xc, "input")
   return xc
end

local function pool1d_opts(fname, opts, known)
   if type(opts) == "number" or (T.is_sizes(opts) and opts[1] ~= nil) then
      return { kernel_size = opts }
   end
   if opts == nil then err(fname, "kernel_size is required") end
   return check_opts(fname, opts, known)
end

-- run f(x4, ...) (a 2-D pool), errors renamed from lumen.<name2d> to lumen.<fname>; the results
-- squeezed back to the input's rank
local function via2d(fname, name2d, f, x, a)
   local x4 = Tensor.unsqueeze(x, -2)
   local ok, r1, r2 = pcall(f, x4, a)
   if not ok then
      if type(r1) == "string" then
         r1 = r1:gsub("lumen%." .. name2d .. ":", "lumen." .. fname .. ":", 1)
      end
      error(r1, 0)
   end
   r1 = Tensor.squeeze(r1, -2)
   if r2 ~= nil then r2 = raw.squeeze(r2, -2) end
   return r1, r2
end

-- max_pool1d(x, {kernel_size=, stride=, padding=, dilation=, ceil_mode=, return_indices=}) or
-- max_pool1d(x, kernel_size); indices (return_indices) are 1-based positions along L
function F.max_pool1d(x, opts)
   local fname = "max_pool1d"
   pool1d_input(fname, x)
   opts = pool1d_opts(fname, opts, MAX_POOL_OPTS)
   local k = single(fname, opts.kernel_size, "kernel_size", nil, 1)
   local s = single(fname, opts.stride, "stride", k, 1)
   local p = single(fname, opts.padding, "padding", 0, 0)
   local d = single(fname, opts.dilation, "dilation", 1, 1)
   local cm = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local ri = bool_opt(fname, opts.return_indices, "return_indices", false)
   check_pad(fname, { k }, { p }, { d })
   return via2d(fname, "max_pool2d", F.max_pool2d, x,
                { kernel_size = { 1, k }, stride = { 1, s }, padding = { 0, p },
                  dilation = { 1, d }, ceil_mode = cm, return_indices = ri })
end

-- avg_pool1d(x, {kernel_size=, stride=, padding=, ceil_mode=, count_include_pad=}) or
-- avg_pool1d(x, kernel_size)
local AVG_POOL1D_OPTS = option_set("kernel_size", "stride", "padding", "ceil_mode",
                                   "count_include_pad")
F._OPTIONS.max_pool1d, F._OPTIONS.avg_pool1d = MAX_POOL_OPTS, AVG_POOL1D_OPTS
function F.avg_pool1d(x, opts)
   local fname = "avg_pool1d"
   pool1d_input(fname, x)
   opts = pool1d_opts(fname, opts, AVG_POOL1D_OPTS)
   local k = single(fname, opts.kernel_size, "kernel_size", nil, 1)
   local s = single(fname, opts.stride, "stride", k, 1)
   local p = single(fname, opts.padding, "padding", 0, 0)
   local cm = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local cip = bool_opt(fname, opts.count_include_pad, "count_include_pad", true)
   check_pad(fname, { k }, { p }, { 1 })
   return (via2d(fname, "avg_pool2d", F.avg_pool2d, x,
                 { kernel_size = { 1, k }, stride = { 1, s }, padding = { 0, p },
                   ceil_mode = cm, count_include_pad = cip }))
end

local function adaptive1d_size(fname, size)
   if size == nil then err(fname, "output_size is required") end
   return single(fname, size, "output_size", nil, 0)
end

-- adaptive_avg_pool1d(x, output_size)
function F.adaptive_avg_pool1d(x, size)
   local fname = "adaptive_avg_pool1d"
   pool1d_input(fname, x)
   local n = adaptive1d_size(fname, size)
   return (via2d(fname, "adaptive_avg_pool2d", F.adaptive_avg_pool2d, x, { 1, n }))
end

-- adaptive_max_pool1d(x, output_size) -> values, indices (int64, 1-based positions along L)
function F.adaptive_max_pool1d(x, size)
   local fname = "adaptive_max_pool1d"
   pool1d_input(fname, x)
   local n = adaptive1d_size(fname, size)
   return via2d(fname, "adaptive_max_pool2d", F.adaptive_max_pool2d, x, { 1, n })
end

---------------------------------------------------------------------------------------------
-- 3-D pooling (N x C x D x H x W, or unbatched C x D x H x W; src/ops/pool3d.c). A
-- channels_last_3d input gives channels_last_3d results for every one of them (issue 19's rule;
-- PyTorch 2.15 returns contiguous for avg_pool3d and the adaptive pools, with the same values).
---------------------------------------------------------------------------------------------

F._OPTIONS.max_pool3d = MAX_POOL_OPTS
F._OPTIONS.avg_pool3d = AVG_POOL_OPTS

local kbuf3, sbuf3, pbuf3, dbuf3, obuf3 = ffi.new("int64_t[3]"), ffi.new("int64_t[3]"),
   ffi.new("int64_t[3]"), ffi.new("int64_t[3]"), ffi.new("int64_t[3]")

local function pool3d_input(fname, x)
   local xc = tensor_arg(fname, x, "input")
   if xc.ndim ~= 4 and xc.ndim ~= 5 then
      err(fname, ("expected 4-D (unbatched) or 5-D (batched) input, got %d-D input of size %s")
          :format(xc.ndim, sizes_str(xc)))
   end
   check_float(fname, xc, "input")
   return xc
end

-- a number or {d, h, w} (a one-element table repeats) -> {d, h, w}
local function triple(fname, v, what, default, min)
   if v == nil then
      if default == nil then err(fname, what .. " is required") end
      v = default
   end
   local r
   if type(v) == "number" then r = { v, v, v }
   elseif T.is_sizes(v) then
      if #v == 1 then r = { v[1], v[1], v[1] }
      elseif #v == 3 then r = { v[1], v[2], v[3] }
      else err(fname, what .. " must be a number or {d, h, w}, got " .. #v .. " values") end
   else
      err(fname, what .. " must be a number or {d, h, w}, got " .. typename(v))
   end
   for i = 1, 3 do
      if type(r[i]) ~= "number" or r[i] % 1 ~= 0 then
         err(fname, what .. " must hold integers, got " .. tostring(r[i]))
      end
   end
   if r[1] < min or r[2] < min or r[3] < min then
      err(fname, ("%s must be %s, got (%d, %d, %d)"):format(what,
          min == 0 and "non-negative" or ("at least " .. min), r[1], r[2], r[3]))
   end
   return r
end

local function fill3(buf, p) buf[0] = p[1]; buf[1] = p[2]; buf[2] = p[3]; return buf end

---------------------------------------------------------------------------------------------
-- 2-D and 3-D convolution
---------------------------------------------------------------------------------------------

-- what differs between conv2d and conv3d: the number of spatial dims, their option parser and
-- scratch buffers, the C entry points, the channels-last format id and the words of the errors
local CONV_ND = {
   [2] = { fname = "conv2d", tuple = pair, fill = fill2, sb = sbuf, pb = pbuf, db = dbuf,
           ob = obuf, output_size = C.lm_conv2d_output_size, run = C.lm_conv2d,
           backward = C.lm_conv2d_backward, memory_format = C.lm_conv_memory_format, cl = 1,
           input = "(N, C, H, W)", unbatched = "(C, H, W)", kernel = "kH, kW" },
   [3] = { fname = "conv3d", tuple = triple, fill = fill3, sb = sbuf3, pb = pbuf3, db = dbuf3,
           ob = obuf3, output_size = C.lm_conv3d_output_size, run = C.lm_conv3d,
           backward = C.lm_conv3d_backward, memory_format = C.lm_conv3d_memory_format, cl = 2,
           input = "(N, C, D, H, W)", unbatched = "(C, D, H, W)", kernel = "kD, kH, kW" },
}

local function dims_str(t, add)
   local r = {}
   for i = 1, #t do r[i] = tostring(t[i] + (add and add[i] or 0)) end
   return table.concat(r, " x ")
end

-- conv{nd}d(x, w, b, {stride=, padding=, dilation=, groups=, residual=, relu=}); sizes are
-- numbers or tables of nd values; padding may be "valid" or "same". The epilogue
-- relu(conv + b + residual) (residual: a tensor of the output's shape and dtype, any strides;
-- relu: boolean) runs inside the kernel, as the results are stored, when no gradient is wanted
-- (inference, a folded model); when one is, it runs as the separate ops, which autograd
-- differentiates. The output is channels-last (channels_last / channels_last_3d) when x or w
-- suggests it (PyTorch's rule), else contiguous.
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
   local stride = K.tuple(fname, opts.stride, "stride", 1, 1)
   local dilation = K.tuple(fname, opts.dilation, "dilation", 1, 1)
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
      for i = 1, nd do
         local t = dilation[i] * (k[i] - 1)
         if t % 2 ~= 0 then
            err(fname, "padding='same' needs an even total padding (odd kernel extent)")
         end
         padding[i] = t / 2
      end
   else
      padding = K.tuple(fname, opts.padding, "padding", 0, 0)
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
   local relu = bool_opt(fname, opts.relu, "relu", false)
   local residual = opts.residual
   local resc = opt_tensor(fname, residual, "residual")
   local sb, pb, db = K.fill(K.sb, stride), K.fill(K.pb, padding), K.fill(K.db, dilation)
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
   if relu or resc ~= nil then
      local rec = A.is_grad_enabled() and (needs(x) or needs(w) or needs(b) or
                                           (resc ~= nil and needs(residual)))
      if rec then
         -- the separate ops, which autograd differentiates: relu(conv(x, w, b) + residual)
         local y = conv_nd(nd, x, w, b, opts_with(opts, "residual", nil, "relu", nil))
         if residual ~= nil then y = Tensor.add(y, residual) end
         if relu then y = Tensor.relu(y) end
         return y
      end
   end
   local fmt = K.memory_format(xc, wc)
   outp[0] = nil
   check(K.run(xc, wc, bc, sb, pb, db, groups, fmt, relu and 1 or 0, resc, outp), fname)
   local out = wrap(outp[0])
   if relu or resc ~= nil then return out end     -- no gradient wanted (checked above)
   if A.is_grad_enabled() and (needs(x) or needs(w) or needs(b)) then
      local need_x, need_w, need_b = needs(x), needs(w), needs(b)
      record(out, "ConvolutionBackward", function(g)
         local gc = g._c
         local gfmt = fmt
         if gfmt == 0 and suggest(gc) == K.cl then gfmt = K.cl end
         p1[0], p2[0], p3[0] = nil, nil, nil
         check(K.backward(x._c, w._c, gc, K.fill(K.sb, stride), K.fill(K.pb, padding),
                          K.fill(K.db, dilation), groups, gfmt, need_x and p1 or nil,
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

-- max_pool3d(x, {kernel_size=, stride=, padding=, dilation=, ceil_mode=, return_indices=})
-- -> out[, indices (int64, 1-based flat positions (d*H + h)*W + w + 1 in the input volume)]
function F.max_pool3d(x, opts)
   local fname = "max_pool3d"
   local xc = pool3d_input(fname, x)
   opts = pool_opts(fname, opts, MAX_POOL_OPTS)
   local kernel = triple(fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = triple(fname, opts.stride, "stride", kernel, 1)
   local padding = triple(fname, opts.padding, "padding", 0, 0)
   local dilation = triple(fname, opts.dilation, "dilation", 1, 1)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local want_idx = bool_opt(fname, opts.return_indices, "return_indices", false)
   check_pad(fname, kernel, padding, dilation)
   local rec = A.is_grad_enabled() and needs(x)
   outp[0], idxp[0] = nil, nil
   check(C.lm_max_pool3d(xc, fill3(kbuf3, kernel), fill3(sbuf3, stride), fill3(pbuf3, padding),
                         fill3(dbuf3, dilation), ceil_mode and 1 or 0, outp,
                         (rec or want_idx) and idxp or nil), fname)
   local out = wrap(outp[0])
   local idx = (rec or want_idx) and wrap(idxp[0]) or nil
   if rec then
      record(out, "MaxPool3DWithIndicesBackward", function(g)
         p1[0] = nil
         check(C.lm_max_pool3d_backward(g._c, x._c, idx._c, p1), "max_pool3d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   if want_idx then return out, raw.add(idx, 1) end
   return out
end

-- avg_pool3d(x, {kernel_size=, stride=, padding=, ceil_mode=, count_include_pad=,
--                divisor_override=})
function F.avg_pool3d(x, opts)
   local fname = "avg_pool3d"
   local xc = pool3d_input(fname, x)
   opts = pool_opts(fname, opts, AVG_POOL_OPTS)
   local kernel = triple(fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = triple(fname, opts.stride, "stride", kernel, 1)
   local padding = triple(fname, opts.padding, "padding", 0, 0)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local cip = bool_opt(fname, opts.count_include_pad, "count_include_pad", true)
   local dov = opts.divisor_override
   if dov ~= nil then dov = int_opt(fname, dov, "divisor_override", nil, 1) end
   check_pad(fname, kernel, padding, nil)
   local dovbuf = dov and ffi.new("int64_t[1]", dov) or nil
   local cm, ci = ceil_mode and 1 or 0, cip and 1 or 0
   outp[0] = nil
   check(C.lm_avg_pool3d(xc, fill3(kbuf3, kernel), fill3(sbuf3, stride), fill3(pbuf3, padding),
                         cm, ci, dovbuf, outp), fname)
   local out = wrap(outp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AvgPool3DBackward", function(g)
         p1[0] = nil
         check(C.lm_avg_pool3d_backward(g._c, x._c, fill3(kbuf3, kernel), fill3(sbuf3, stride),
                                        fill3(pbuf3, padding), cm, ci, dovbuf, p1),
               "avg_pool3d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   return out
end

-- output size: a number, or {d, h, w} where false / nil keeps the input's size
local function adaptive_size3(fname, xc, size)
   if size == nil then err(fname, "output_size is required") end
   local nd = xc.ndim
   local r
   if type(size) == "number" then r = { size, size, size }
   elseif type(size) == "table" and getmetatable(size) == nil then
      if size[1] == nil and size[2] == nil and size[3] == nil then
         err(fname, "output_size must be a number or {d, h, w}")
      end
      r = { size[1], size[2], size[3] }
      for i = 1, 3 do
         if r[i] == nil or r[i] == false then r[i] = tonumber(xc.sizes[nd - 4 + i]) end
      end
   else
      err(fname, "output_size must be a number or {d, h, w}, got " .. typename(size))
   end
   for i = 1, 3 do
      local v = r[i]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 0 then
         err(fname, "output_size must hold non-negative integers, got " .. tostring(v))
      end
   end
   return r
end

function F.adaptive_avg_pool3d(x, size)
   local fname = "adaptive_avg_pool3d"
   local xc = pool3d_input(fname, x)
   local osz = adaptive_size3(fname, xc, size)
   outp[0] = nil
   check(C.lm_adaptive_avg_pool3d(xc, fill3(obuf3, osz), outp), fname)
   local out = wrap(outp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AdaptiveAvgPool3DBackward", function(g)
         p1[0] = nil
         check(C.lm_adaptive_avg_pool3d_backward(g._c, x._c, p1), "adaptive_avg_pool3d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   return out
end

-- adaptive_max_pool3d(x, size[, return_indices]) -> values[, indices (int64, 1-based flat
-- positions (d*H + h)*W + w + 1 in the input volume)]. Unlike adaptive_max_pool2d (which always
-- returns both), the indices come only with return_indices = true, as in PyTorch.
function F.adaptive_max_pool3d(x, size, return_indices)
   local fname = "adaptive_max_pool3d"
   local xc = pool3d_input(fname, x)
   local osz = adaptive_size3(fname, xc, size)
   local want_idx = bool_opt(fname, return_indices, "return_indices", false)
   outp[0], idxp[0] = nil, nil
   check(C.lm_adaptive_max_pool3d(xc, fill3(obuf3, osz), outp, idxp), fname)
   local out = wrap(outp[0])
   local idx = wrap(idxp[0])
   if A.is_grad_enabled() and needs(x) then
      record(out, "AdaptiveMaxPool3DBackward", function(g)
         p1[0] = nil
         check(C.lm_adaptive_max_pool3d_backward(g._c, x._c, idx._c, p1),
               "adaptive_max_pool3d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   if want_idx then return out, raw.add(idx, 1) end
   return out
end

---------------------------------------------------------------------------------------------
-- batch norm
---------------------------------------------------------------------------------------------

-- batch_norm(x, running_mean, running_var, weight, bias, {training=false, momentum=0.1,
--            eps=1e-5, residual=nil, relu=false}); running stats are updated in place when
-- training. residual (a tensor) and relu fuse the tail of a ResNet block into the same pass:
-- the result is relu(batch_norm(x) + residual) (each part optional), computed and
-- differentiated as the three ops would be. A residual of another dtype or shape (broadcast)
-- falls back to the separate ops.
--
-- The recorded node also lets autograd fuse a later in-place relu_ of the result (nn.ReLU(true)
-- after a batch norm): the relu's backward then runs inside the batch norm's backward, its mask
-- read from the relu's output (see Tensor.relu_ in autograd.lua).
local bn_fused_fwd = function(...) return C.lm_batch_norm_fused(...) end
local bn_fused_bwd = function(...) return C.lm_batch_norm_backward_fused(...) end

function F.batch_norm(x, running_mean, running_var, weight, bias, opts)
   local fname = "batch_norm"
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
-- activations, linear, dropout, flatten
---------------------------------------------------------------------------------------------

-- relu(x, inplace = false)
-- relu(x, inplace) or relu(x, {inplace = true})
function F.relu(x, inplace)
   if type(inplace) == "table" then inplace = check_opts("relu", inplace, RELU_OPTS).inplace end
   if inplace then return Tensor.relu_(x) end
   return Tensor.relu(x)
end
function F.relu_(x) return Tensor.relu_(x) end
function F.sigmoid(x) return Tensor.sigmoid(x) end
function F.tanh(x) return Tensor.tanh(x) end

-- linear(x, w, b) = x @ w^T + b; x is (..., in), w (out, in), b (out) or nil
function F.linear(x, w, b)
   local fname = "linear"
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
   if bc ~= nil and (d == C.LM_BFLOAT16 or d == C.LM_FLOAT16) then
      -- 16 bits: the bias joins the float32 sums before the one rounding (torch.addmm), not the
      -- already rounded product (which would round twice)
      out = raw.clone(raw.expand(b, { tonumber(x2._c.sizes[0]), fout }))
      check(C.lm_addmm_(out._c, x2._c, raw.transpose(w, 1, 2)._c), fname)
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
   if A.is_grad_enabled() and (needs(x) or needs(w) or needs(b)) then
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
   return out
end

-- dropout(x, p = 0.5, training = true): zeroes elements with probability p (lm_bernoulli_ on the
-- global generator) and scales the rest by 1 / (1 - p); the identity when not training
function F.dropout(x, p, training)
   local fname = "dropout"
   local xc = tensor_arg(fname, x, "input")
   if p == nil then p = 0.5 end
   if type(p) ~= "number" or p < 0 or p > 1 or p ~= p then
      err(fname, "dropout probability has to be between 0 and 1, but got " .. tostring(p))
   end
   if training == nil then training = true end
   if not training or p == 0 then return x end
   check_float(fname, xc, "input")
   if p == 1 then return Tensor.mul(x, 0) end
   outp[0] = nil
   check(C.lm_empty_like(xc, -1, 3, outp), fname)
   local mask = wrap(outp[0])
   check(C.lm_bernoulli_(mask._c, 1 - p), fname)
   raw.mul_(mask, 1 / (1 - p))
   local out = raw.mul(x, mask)
   if A.is_grad_enabled() and needs(x) then
      record(out, "MulBackward", function(g) return raw.mul(g, mask) end, x)
   end
   return out
end

-- flatten(x, start_dim = 1, end_dim = -1): a reshape, so a channels-last input is copied into a
-- contiguous result (as PyTorch)
function F.flatten(x, s, e)
   local fname = "flatten"
   local xc = tensor_arg(fname, x, "input")
   local nd = xc.ndim
   if nd == 0 then return Tensor.reshape(x, { 1 }) end
   local s0 = wrap_dim(fname, s == nil and 1 or s, nd)
   local e0 = wrap_dim(fname, e == nil and -1 or e, nd)
   if s0 > e0 then err(fname, "start_dim cannot come after end_dim") end
   if s0 == e0 then return x end
   local sizes = {}
   for i = 0, s0 - 1 do sizes[#sizes + 1] = tonumber(xc.sizes[i]) end
   local m = 1
   for i = s0, e0 do m = m * tonumber(xc.sizes[i]) end
   sizes[#sizes + 1] = m
   for i = e0 + 1, nd - 1 do sizes[#sizes + 1] = tonumber(xc.sizes[i]) end
   return Tensor.reshape(x, sizes)
end

function F.cat(list, dim) return T.cat(list, dim) end

---------------------------------------------------------------------------------------------
-- softmax and losses
---------------------------------------------------------------------------------------------

-- PyTorch's legacy implicit dim: 0 for 0-, 1- and 3-D inputs, else 1 (0-based)
local function softmax_dim(fname, xc, dim)
   if dim == nil then
      local nd = xc.ndim
      return (nd == 0 or nd == 1 or nd == 3) and 0 or 1
   end
   return wrap_dim(fname, dim, xc.ndim)
end

local function softmax_like(fname, cfwd, cbwd, bname)
   return function(x, dim)
      if ac_on then x = ac_f32(x) end
      local xc = tensor_arg(fname, x, "input")
      check_float(fname, xc, "input")
      local d = softmax_dim(fname, xc, dim)
      outp[0] = nil
      check(cfwd(xc, d, outp), fname)
      local out = wrap(outp[0])
      if A.is_grad_enabled() and needs(x) then
         record(out, bname, function(g)
            p1[0] = nil
            check(cbwd(g._c, out._c, d, p1), fname .. "_backward")
            return fresh(wrap(p1[0]))
         end, x)
      end
      return out
   end
end
F.softmax = softmax_like("softmax", function(...) return C.lm_softmax(...) end,
                         function(...) return C.lm_softmax_backward(...) end, "SoftmaxBackward")
F.log_softmax = softmax_like("log_softmax", function(...) return C.lm_log_softmax(...) end,
                             function(...) return C.lm_log_softmax_backward(...) end,
                             "LogSoftmaxBackward")

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

F._pair = pair
F._floor = floor

return F
