-- lumen.functional.pool -- lm.F's pools: max, average and adaptive (average and max) pooling
-- in 1-D, 2-D and 3-D, each with its backward. Index conventions follow the Lua API: the
-- indices the max pools return are 1-BASED (the C kernels are 0-based; the conversion happens
-- here). The 1-D pools run the 2-D ones on an N×C×1×L view, as PyTorch does.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, pcall, error = type, pcall, error

local Tensor, raw, wrap = T.Tensor, T.raw, T.wrap
local needs, record, fresh = A.needs, A.record, A.fresh
local err, check, tensor_arg, check_float = H.err, H.check, H.tensor_arg, H.check_float
local check_opts, int_opt, bool_opt = H.check_opts, H.int_opt, H.bool_opt
local sizes_str, suggest, option_set = H.sizes_str, H.suggest, H.option_set
local ntuple, output_size, fill = H.ntuple, H.output_size, H.fill

local F = H.F

-- scratch (FFI calls never re-enter Lua, so sharing is safe)
local outp = ffi.new("lm_tensor*[1]")
local idxp = ffi.new("lm_tensor*[1]")
local p1 = ffi.new("lm_tensor*[1]")
local p2 = ffi.new("lm_tensor*[1]")
local kbuf, sbuf, pbuf, dbuf, obuf = ffi.new("int64_t[2]"), ffi.new("int64_t[2]"),
   ffi.new("int64_t[2]"), ffi.new("int64_t[2]"), ffi.new("int64_t[2]")
local kbuf3, sbuf3, pbuf3, dbuf3, obuf3 = ffi.new("int64_t[3]"), ffi.new("int64_t[3]"),
   ffi.new("int64_t[3]"), ffi.new("int64_t[3]"), ffi.new("int64_t[3]")

local MAX_POOL_OPTS = option_set("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                 "return_indices")
local AVG_POOL_OPTS = option_set("kernel_size", "stride", "padding", "ceil_mode",
                                 "count_include_pad", "divisor_override")
F._OPTIONS.max_pool2d, F._OPTIONS.avg_pool2d = MAX_POOL_OPTS, AVG_POOL_OPTS

---------------------------------------------------------------------------------------------
-- 2-D pooling, and the 1-D pools on it
---------------------------------------------------------------------------------------------

-- the input of a pool over nd spatial dims: (N, C, ...) or unbatched (C, ...), floating
local function pool_input(fname, x, nd)
   local xc = tensor_arg(fname, x, "input")
   if xc.ndim ~= nd + 1 and xc.ndim ~= nd + 2 then
      err(fname, ("expected %d-D (unbatched) or %d-D (batched) input, got %d-D input of size %s")
          :format(nd + 1, nd + 2, xc.ndim, sizes_str(xc)))
   end
   check_float(fname, xc, "input")
   return xc
end

-- pooling options: a table, or the kernel size (a number or a table of sizes)
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
   local xc = pool_input(fname, x, 2)
   opts = pool_opts(fname, opts, MAX_POOL_OPTS)
   local kernel = ntuple(2, fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = ntuple(2, fname, opts.stride, "stride", kernel, 1)
   local padding = ntuple(2, fname, opts.padding, "padding", 0, 0)
   local dilation = ntuple(2, fname, opts.dilation, "dilation", 1, 1)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local want_idx = bool_opt(fname, opts.return_indices, "return_indices", false)
   check_pad(fname, kernel, padding, dilation)
   local rec = A.is_grad_enabled() and needs(x)
   local taps = rec and not want_idx and kernel[1] * kernel[2] <= 255 and suggest(xc) == 1
   local cm = ceil_mode and 1 or 0
   outp[0], idxp[0] = nil, nil
   if taps then
      check(C.lm_max_pool2d_taps(xc, fill(kbuf, kernel), fill(sbuf, stride),
                                 fill(pbuf, padding), fill(dbuf, dilation), cm, outp, idxp),
            fname)
   else
      check(C.lm_max_pool2d(xc, fill(kbuf, kernel), fill(sbuf, stride), fill(pbuf, padding),
                            fill(dbuf, dilation), cm, outp, (rec or want_idx) and idxp or nil),
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
            check(fwd(x._c, fill(kbuf, kernel), fill(sbuf, stride), fill(pbuf, padding),
                      fill(dbuf, dilation), cm, p2, idxp), "max_pool2d_backward")
            C.lm_tensor_free(p2[0])
            idx = wrap(idxp[0])
            ic = idx._c
         end
         p1[0] = nil
         check(bwd(g._c, x._c, ic, fill(kbuf, kernel), fill(sbuf, stride),
                   fill(pbuf, padding), fill(dbuf, dilation), cm, p1), "max_pool2d_backward")
         idx:free()
         return fresh(wrap(p1[0]))
      end, x)
   end
   if want_idx then return out, raw.add(idx, 1) end
   return out
end

-- avg_pool2d / avg_pool3d(x, {kernel_size=, stride=, padding=, ceil_mode=, count_include_pad=,
-- divisor_override=}) and adaptive_avg_pool2d / 3d(x, output_size: a number or {h, w} /
-- {d, h, w}, where false / nil keeps the input's size): one body each for both ranks, which differ
-- only in the C entry points (cf, cb) and the names
local function avg_pool_nd(n, cf, cb)
   local fname, bname = "avg_pool" .. n .. "d", "AvgPool" .. n .. "DBackward"
   local kb, sb, pb = n == 2 and kbuf or kbuf3, n == 2 and sbuf or sbuf3, n == 2 and pbuf or pbuf3
   return function(x, opts)
      local xc = pool_input(fname, x, n)
      opts = pool_opts(fname, opts, AVG_POOL_OPTS)
      local kernel = ntuple(n, fname, opts.kernel_size, "kernel_size", nil, 1)
      local stride = ntuple(n, fname, opts.stride, "stride", kernel, 1)
      local padding = ntuple(n, fname, opts.padding, "padding", 0, 0)
      local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
      local cip = bool_opt(fname, opts.count_include_pad, "count_include_pad", true)
      local dov = opts.divisor_override
      if dov ~= nil then dov = int_opt(fname, dov, "divisor_override", nil, 1) end
      check_pad(fname, kernel, padding, nil)
      local dovbuf = dov and ffi.new("int64_t[1]", dov) or nil
      local cm, ci = ceil_mode and 1 or 0, cip and 1 or 0
      outp[0] = nil
      check(cf(xc, fill(kb, kernel), fill(sb, stride), fill(pb, padding), cm, ci, dovbuf, outp),
            fname)
      local out = wrap(outp[0])
      if A.is_grad_enabled() and needs(x) then
         record(out, bname, function(g)
            p1[0] = nil
            check(cb(g._c, x._c, fill(kb, kernel), fill(sb, stride), fill(pb, padding), cm, ci,
                     dovbuf, p1), fname .. "_backward")
            return fresh(wrap(p1[0]))
         end, x)
      end
      return out
   end
end

local function adaptive_avg_pool_nd(n, cf, cb)
   local fname, bname = "adaptive_avg_pool" .. n .. "d", "AdaptiveAvgPool" .. n .. "DBackward"
   local ob = n == 2 and obuf or obuf3
   return function(x, size)
      local xc = pool_input(fname, x, n)
      local osz = output_size(n, fname, xc, size)
      outp[0] = nil
      check(cf(xc, fill(ob, osz), outp), fname)
      local out = wrap(outp[0])
      if A.is_grad_enabled() and needs(x) then
         record(out, bname, function(g)
            p1[0] = nil
            check(cb(g._c, x._c, p1), fname .. "_backward")
            return fresh(wrap(p1[0]))
         end, x)
      end
      return out
   end
end

F.avg_pool2d = avg_pool_nd(2, function(...) return C.lm_avg_pool2d(...) end,
                           function(...) return C.lm_avg_pool2d_backward(...) end)
F.avg_pool3d = avg_pool_nd(3, function(...) return C.lm_avg_pool3d(...) end,
                           function(...) return C.lm_avg_pool3d_backward(...) end)
F.adaptive_avg_pool2d = adaptive_avg_pool_nd(2,
   function(...) return C.lm_adaptive_avg_pool2d(...) end,
   function(...) return C.lm_adaptive_avg_pool2d_backward(...) end)
F.adaptive_avg_pool3d = adaptive_avg_pool_nd(3,
   function(...) return C.lm_adaptive_avg_pool3d(...) end,
   function(...) return C.lm_adaptive_avg_pool3d_backward(...) end)

-- adaptive_max_pool2d(x, size) -> values, indices (int64, 1-based flat positions h*W + w + 1
-- within the input plane)
function F.adaptive_max_pool2d(x, size)
   local fname = "adaptive_max_pool2d"
   local xc = pool_input(fname, x, 2)
   local osz = output_size(2, fname, xc, size)
   outp[0], idxp[0] = nil, nil
   check(C.lm_adaptive_max_pool2d(xc, fill(obuf, osz), outp, idxp), fname)
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
   pool_input(fname, x, 1)
   opts = pool_opts(fname, opts, MAX_POOL_OPTS)
   local k = ntuple(1, fname, opts.kernel_size, "kernel_size", nil, 1)[1]
   local s = ntuple(1, fname, opts.stride, "stride", k, 1)[1]
   local p = ntuple(1, fname, opts.padding, "padding", 0, 0)[1]
   local d = ntuple(1, fname, opts.dilation, "dilation", 1, 1)[1]
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
   pool_input(fname, x, 1)
   opts = pool_opts(fname, opts, AVG_POOL1D_OPTS)
   local k = ntuple(1, fname, opts.kernel_size, "kernel_size", nil, 1)[1]
   local s = ntuple(1, fname, opts.stride, "stride", k, 1)[1]
   local p = ntuple(1, fname, opts.padding, "padding", 0, 0)[1]
   local cm = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local cip = bool_opt(fname, opts.count_include_pad, "count_include_pad", true)
   check_pad(fname, { k }, { p }, { 1 })
   return (via2d(fname, "avg_pool2d", F.avg_pool2d, x,
                 { kernel_size = { 1, k }, stride = { 1, s }, padding = { 0, p },
                   ceil_mode = cm, count_include_pad = cip }))
end

-- adaptive_avg_pool1d(x, output_size)
function F.adaptive_avg_pool1d(x, size)
   local fname = "adaptive_avg_pool1d"
   pool_input(fname, x, 1)
   local n = ntuple(1, fname, size, "output_size", nil, 0)[1]
   return (via2d(fname, "adaptive_avg_pool2d", F.adaptive_avg_pool2d, x, { 1, n }))
end

-- adaptive_max_pool1d(x, output_size) -> values, indices (int64, 1-based positions along L)
function F.adaptive_max_pool1d(x, size)
   local fname = "adaptive_max_pool1d"
   pool_input(fname, x, 1)
   local n = ntuple(1, fname, size, "output_size", nil, 0)[1]
   return via2d(fname, "adaptive_max_pool2d", F.adaptive_max_pool2d, x, { 1, n })
end

---------------------------------------------------------------------------------------------
-- 3-D pooling (N x C x D x H x W, or unbatched C x D x H x W; src/ops/pool3d.c). A
-- channels_last_3d input gives channels_last_3d results for every one of them (issue 19's rule;
-- PyTorch 2.15 returns contiguous for avg_pool3d and the adaptive pools, with the same values).
---------------------------------------------------------------------------------------------

F._OPTIONS.max_pool3d = MAX_POOL_OPTS
F._OPTIONS.avg_pool3d = AVG_POOL_OPTS


-- max_pool3d(x, {kernel_size=, stride=, padding=, dilation=, ceil_mode=, return_indices=})
-- -> out[, indices (int64, 1-based flat positions (d*H + h)*W + w + 1 in the input volume)]
function F.max_pool3d(x, opts)
   local fname = "max_pool3d"
   local xc = pool_input(fname, x, 3)
   opts = pool_opts(fname, opts, MAX_POOL_OPTS)
   local kernel = ntuple(3, fname, opts.kernel_size, "kernel_size", nil, 1)
   local stride = ntuple(3, fname, opts.stride, "stride", kernel, 1)
   local padding = ntuple(3, fname, opts.padding, "padding", 0, 0)
   local dilation = ntuple(3, fname, opts.dilation, "dilation", 1, 1)
   local ceil_mode = bool_opt(fname, opts.ceil_mode, "ceil_mode", false)
   local want_idx = bool_opt(fname, opts.return_indices, "return_indices", false)
   check_pad(fname, kernel, padding, dilation)
   local rec = A.is_grad_enabled() and needs(x)
   outp[0], idxp[0] = nil, nil
   check(C.lm_max_pool3d(xc, fill(kbuf3, kernel), fill(sbuf3, stride), fill(pbuf3, padding),
                         fill(dbuf3, dilation), ceil_mode and 1 or 0, outp,
                         (rec or want_idx) and idxp or nil), fname)
   local out = wrap(outp[0])
   local idx = (rec or want_idx) and wrap(idxp[0]) or nil
   if rec then
      record(out, "MaxPool3DWithIndicesBackward", function(g)
         p1[0] = nil
         -- with the geometry: the CUDA kernels gather instead of scattering
         check(C.lm_max_pool3d_backward_geom(g._c, x._c, idx._c, fill(kbuf3, kernel),
                                             fill(sbuf3, stride), fill(pbuf3, padding),
                                             fill(dbuf3, dilation), ceil_mode and 1 or 0, p1),
               "max_pool3d_backward")
         return fresh(wrap(p1[0]))
      end, x)
   end
   if want_idx then return out, raw.add(idx, 1) end
   return out
end

-- adaptive_max_pool3d(x, size[, return_indices]) -> values[, indices (int64, 1-based flat
-- positions (d*H + h)*W + w + 1 in the input volume)]. Unlike adaptive_max_pool2d (which always
-- returns both), the indices come only with return_indices = true, as in PyTorch.
function F.adaptive_max_pool3d(x, size, return_indices)
   local fname = "adaptive_max_pool3d"
   local xc = pool_input(fname, x, 3)
   local osz = output_size(3, fname, xc, size)
   local want_idx = bool_opt(fname, return_indices, "return_indices", false)
   outp[0], idxp[0] = nil, nil
   check(C.lm_adaptive_max_pool3d(xc, fill(obuf3, osz), outp, idxp), fname)
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
