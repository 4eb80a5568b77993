-- lumen.functional.pad -- lm.F.pad (constant, reflect, replicate, circular; PyTorch's flat pad
-- list, last dim first) and the shuffles (pixel_shuffle, pixel_unshuffle, channel_shuffle), each
-- with its backward (issue 40).
--
-- Both are composed from views and copies of the elementwise engine (no kernel of their own):
-- pad allocates its result in the input's memory format (channels-last in, channels-last out,
-- in every mode: PyTorch drops the format in some), copies the input into the centre and fills
-- the borders one padded dim at a time (a few slab copies per dim: reflect copies each border
-- slice, replicate broadcasts the edge, circular copies the opposite block). The backward runs
-- the adjoint of each dim's step in reverse order: the centre plus the border slabs added back
-- onto their sources. The shuffles are a reshape / permute view copied into the input's format.

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tostring, tonumber, getmetatable, ipairs = type, tostring, tonumber, getmetatable,
   ipairs

local wrap, tc = T.wrap, T.tc
local needs, record, fresh = A.needs, A.record, A.fresh
local err, check, tensor_arg, check_opts = H.err, H.check, H.tensor_arg, H.check_opts

local F = H.F

local outp = ffi.new("lm_tensor*[1]")
local sizebuf = ffi.new("int64_t[8]")
local dimbuf = ffi.new("int[8]")

---------------------------------------------------------------------------------------------
-- raw helpers over cdata (0-based dims), results wrapped (freed with their Lua object)
---------------------------------------------------------------------------------------------

local function narrow(fname, t, d, s, n)
   outp[0] = nil
   check(C.lm_narrow(tc(t, fname), d, s, n, outp), fname)
   return wrap(outp[0])
end

local function copy_(fname, dst, src)
   check(C.lm_copy_(tc(dst, fname), tc(src, fname)), fname)
end

local function add_(fname, dst, src)
   local dc = tc(dst, fname)
   outp[0] = dc
   check(C.lm_binary(C.LM_ADD, dc, tc(src, fname), 1, outp), fname)
end

local function empty(fname, sizes, nd, dtype, fmt, device)
   for i = 1, nd do sizebuf[i - 1] = sizes[i] end
   outp[0] = nil
   check(C.lm_empty(nd, sizebuf, dtype, fmt, device, outp), fname)
   return wrap(outp[0])
end

local function clone(fname, t, fmt)
   outp[0] = nil
   check(C.lm_clone(tc(t, fname), fmt, -1, outp), fname)
   return wrap(outp[0])
end

local function sum_keep(fname, t, d)
   dimbuf[0] = d
   outp[0] = nil
   check(C.lm_reduce(C.LM_SUM, tc(t, fname), dimbuf, 1, 1, -1, outp, nil), fname)
   return wrap(outp[0])
end

-- the memory format results keep: the input's (channels_last for 4-D, channels_last_3d for 5-D
-- inputs in those formats), else contiguous
local function format_of(xc)
   local f = C.lm_suggest_memory_format(xc, 0)
   if (f == C.LM_CHANNELS_LAST and xc.ndim == 4) or (f == C.LM_CHANNELS_LAST_3D and xc.ndim == 5)
   then
      return f
   end
   return C.LM_CONTIGUOUS
end

---------------------------------------------------------------------------------------------
-- pad
---------------------------------------------------------------------------------------------

local PAD_OPTS = H.option_set("mode", "value")
F._OPTIONS.pad = PAD_OPTS
local MODES = { constant = true, reflect = true, replicate = true, circular = true }

-- the padded dims as {d = 0-based dim, l = left pad, r = right pad}, last dim first (pad's order)
local function parse_pad(fname, xc, pad, mode)
   if type(pad) ~= "table" or getmetatable(pad) ~= nil and not T.is_sizes(pad) then
      err(fname, "pad must be a table of integers, got " .. T.typename(pad))
   end
   local n = #pad
   if n == 0 or n % 2 ~= 0 then
      err(fname, "padding length must be even and positive, got " .. n)
   end
   local nd = xc.ndim
   if n / 2 > nd then
      err(fname, ("padding length (%d) too large for a %d-D input"):format(n, nd))
   end
   local np = n / 2
   if mode ~= "constant" then
      if np > 3 then
         err(fname, mode .. " padding pads at most 3 dims, got a padding of length " .. n)
      end
      if nd ~= np + 1 and nd ~= np + 2 then
         err(fname, ("%s padding of length %d expects a %d-D or %d-D input, got %d-D"):format(
             mode, n, np + 1, np + 2, nd))
      end
   end
   local dims = {}
   for k = 1, np do
      local l, r = pad[2 * k - 1], pad[2 * k]
      if type(l) ~= "number" or l % 1 ~= 0 or type(r) ~= "number" or r % 1 ~= 0 then
         err(fname, "pad must hold integers, got " .. tostring(l) .. ", " .. tostring(r))
      end
      local d = nd - k
      local sz = tonumber(xc.sizes[d])
      if mode == "constant" then
         if sz + l + r < 0 then
            err(fname, ("the padded size of dim %d would be negative (%d)"):format(d + 1,
                sz + l + r))
         end
      else
         if l < 0 or r < 0 then
            err(fname, mode .. " padding must be non-negative, got " .. l .. ", " .. r)
         end
         if mode == "reflect" and (l >= sz or r >= sz) then
            err(fname, ("reflect padding (%d, %d) must be less than the size of dim %d (%d)")
                :format(l, r, d + 1, sz))
         elseif mode == "circular" and (l > sz or r > sz) then
            err(fname, ("circular padding (%d, %d) must be at most the size of dim %d (%d)")
                :format(l, r, d + 1, sz))
         elseif sz == 0 and (l > 0 or r > 0) then
            err(fname, ("%s padding of the empty dim %d"):format(mode, d + 1))
         end
      end
      dims[k] = { d = d, l = l, r = r, sz = sz }
   end
   return dims
end

-- out narrowed to the ranges rng (per 0-based dim: {start, length} or nil for the whole dim)
local function ranged(fname, t, rng, nd)
   local v = t
   for d = 0, nd - 1 do
      local r = rng[d]
      if r ~= nil then v = narrow(fname, v, d, r[1], r[2]) end
   end
   return v
end

-- fill the borders of dim p (already holding its centre) of view v
local function fill_borders(fname, v, p, mode)
   local d, l, r, sz = p.d, p.l, p.r, p.sz
   if mode == "reflect" then
      for j = 0, l - 1 do             -- out j <- in (l - j), i.e. out index l + (l - j)
         copy_(fname, narrow(fname, v, d, j, 1), narrow(fname, v, d, 2 * l - j, 1))
      end
      for j = 0, r - 1 do             -- out l + sz + j <- in (sz - 2 - j)
         copy_(fname, narrow(fname, v, d, l + sz + j, 1), narrow(fname, v, d, l + sz - 2 - j, 1))
      end
   elseif mode == "replicate" then
      if l > 0 then copy_(fname, narrow(fname, v, d, 0, l), narrow(fname, v, d, l, 1)) end
      if r > 0 then
         copy_(fname, narrow(fname, v, d, l + sz, r), narrow(fname, v, d, l + sz - 1, 1))
      end
   else -- circular
      if l > 0 then copy_(fname, narrow(fname, v, d, 0, l), narrow(fname, v, d, sz, l)) end
      if r > 0 then copy_(fname, narrow(fname, v, d, l + sz, r), narrow(fname, v, d, l, r)) end
   end
end

-- the adjoint of one dim's padding: g (padded along p.d) -> the gradient of the unpadded tensor
local function unpad_dim(fname, g, p, mode, fmt)
   local d, l, r, sz = p.d, p.l, p.r, p.sz
   local res = clone(fname, narrow(fname, g, d, l, sz), fmt)
   if mode == "reflect" then
      for j = 0, l - 1 do
         add_(fname, narrow(fname, res, d, l - j, 1), narrow(fname, g, d, j, 1))
      end
      for j = 0, r - 1 do
         add_(fname, narrow(fname, res, d, sz - 2 - j, 1), narrow(fname, g, d, l + sz + j, 1))
      end
   elseif mode == "replicate" then
      if l > 0 then
         add_(fname, narrow(fname, res, d, 0, 1), sum_keep(fname, narrow(fname, g, d, 0, l), d))
      end
      if r > 0 then
         add_(fname, narrow(fname, res, d, sz - 1, 1),
              sum_keep(fname, narrow(fname, g, d, l + sz, r), d))
      end
   else
      if l > 0 then add_(fname, narrow(fname, res, d, sz - l, l), narrow(fname, g, d, 0, l)) end
      if r > 0 then add_(fname, narrow(fname, res, d, 0, r), narrow(fname, g, d, l + sz, r)) end
   end
   return res
end

-- pad(x, pad, {mode = "constant", value = 0}) or pad(x, pad, mode, value)
function F.pad(x, pad, mode, value)
   local fname = "pad"
   local xc = tensor_arg(fname, x, "input")
   if type(mode) == "table" and getmetatable(mode) == nil then
      if value ~= nil then err(fname, "options table and value given together") end
      local o = check_opts(fname, mode, PAD_OPTS)
      mode, value = o.mode, o.value
   end
   if mode == nil then mode = "constant" end
   if type(mode) ~= "string" or not MODES[mode] then
      err(fname, "mode must be \"constant\", \"reflect\", \"replicate\" or \"circular\", got " ..
          (type(mode) == "string" and ("\"" .. mode .. "\"") or T.typename(mode)))
   end
   if value == nil then value = 0 end
   if type(value) ~= "number" then
      err(fname, "value must be a number, got " .. T.typename(value))
   end
   if mode ~= "constant" and value ~= 0 then
      err(fname, "padding mode \"" .. mode .. "\" doesn't take in value argument")
   end
   local dims = parse_pad(fname, xc, pad, mode)
   local nd = xc.ndim
   local fmt = format_of(xc)
   local sizes, xsizes = {}, {}
   for d = 0, nd - 1 do sizes[d + 1] = tonumber(xc.sizes[d]); xsizes[d + 1] = sizes[d + 1] end
   for _, p in ipairs(dims) do sizes[p.d + 1] = p.sz + p.l + p.r end
   local out = empty(fname, sizes, nd, xc.dtype, fmt, xc.device)
   -- the centre: where the input lands in out (and the part of the input kept by negative pads)
   local orng, irng = {}, {}
   for _, p in ipairs(dims) do
      local cl, cr = p.l < 0 and -p.l or 0, p.r < 0 and -p.r or 0
      local len = p.sz - cl - cr
      orng[p.d] = { p.l > 0 and p.l or 0, len }
      irng[p.d] = { cl, len }
   end
   if mode == "constant" then
      check(C.lm_fill_(tc(out, fname), value), fname)
      copy_(fname, ranged(fname, out, orng, nd), ranged(fname, x, irng, nd))
   else
      copy_(fname, ranged(fname, out, orng, nd), x)
      -- dim by dim, outermost padded dim first: the view spans the whole of the dims done and
      -- the centre of the others
      for k = #dims, 1, -1 do
         local p = dims[k]
         orng[p.d] = nil
         fill_borders(fname, ranged(fname, out, orng, nd), p, mode)
      end
   end
   if A.is_grad_enabled() and needs(x) then
      record(out, mode == "constant" and "ConstantPadNdBackward" or
             (mode == "reflect" and "ReflectionPadBackward" or
              mode == "replicate" and "ReplicationPadBackward" or "CircularPadBackward"),
             function(g)
         if mode == "constant" then
            local negative = false
            for _, p in ipairs(dims) do
               if p.l < 0 or p.r < 0 then negative = true end
               orng[p.d] = { p.l > 0 and p.l or 0, irng[p.d][2] }
            end
            if not negative then return fresh(clone(fname, ranged(fname, g, orng, nd), fmt)) end
            local gx = empty(fname, xsizes, nd, tc(g, fname).dtype, fmt, xc.device)
            check(C.lm_fill_(tc(gx, fname), 0), fname)
            copy_(fname, ranged(fname, gx, irng, nd), ranged(fname, g, orng, nd))
            return fresh(gx)
         end
         -- the adjoints in reverse order: innermost padded dim first. A 16-bit gradient adds
         -- up in float32 and rounds once (H.widen), as PyTorch's padding backward kernels do:
         -- a circular or reflected element collects several border slabs
         local hd = H.half_dtype(g)
         local r = hd and H.widen(g) or g
         for k = 1, #dims do r = unpad_dim(fname, r, dims[k], mode, fmt) end
         if hd then r = T.Tensor.to(r, hd) end
         return fresh(r)
      end, x)
   end
   return out
end

---------------------------------------------------------------------------------------------
-- pixel_shuffle, pixel_unshuffle, channel_shuffle
---------------------------------------------------------------------------------------------

local function sizes_of(xc)
   local s = {}
   for d = 0, xc.ndim - 1 do s[d + 1] = tonumber(xc.sizes[d]) end
   return s
end

local function int_arg(fname, v, what)
   if type(v) ~= "number" or v % 1 ~= 0 then
      err(fname, what .. " must be an integer, got " .. (type(v) == "number" and tostring(v)
          or T.typename(v)))
   end
   if v < 1 then err(fname, what .. " must be positive, got " .. v) end
   return v
end

local permbuf = ffi.new("int[12]")

-- out (sizes o, format fmt) = x (a Tensor, or its cdata) viewed as sizes v, permuted by perm
-- (1-based), in one copy: out is written through its own view of sizes ov (the permuted v), so a
-- channels-last input gives a channels-last result with no intermediate copy
local function shuffle_raw(fname, x, v, perm, ov, o, fmt, device, dtype)
   local n = #v
   for i = 1, n do sizebuf[i - 1] = v[i] end
   outp[0] = nil
   check(C.lm_reshape(tc(x, fname), n, sizebuf, outp), fname)
   local xv = wrap(outp[0])
   for i = 1, n do permbuf[i - 1] = perm[i] - 1 end
   outp[0] = nil
   check(C.lm_permute(tc(xv, fname), permbuf, outp), fname)
   local xp = wrap(outp[0])
   local out = empty(fname, o, #o, dtype, fmt, device)
   for i = 1, n do sizebuf[i - 1] = ov[i] end
   outp[0] = nil
   check(C.lm_view(tc(out, fname), n, sizebuf, outp), fname)
   copy_(fname, wrap(outp[0]), xp)
   return out
end

-- a shuffle: the forward (v, perm, ov, o) and the backward's (the inverse permutation)
local function shuffle(fname, bname, x, xc, v, perm, ov, o, fmt)
   local out = shuffle_raw(fname, x, v, perm, ov, o, fmt, xc.device, xc.dtype)
   if A.is_grad_enabled() and needs(x) then
      local inv = {}
      for i = 1, #perm do inv[perm[i]] = i end
      local xs = sizes_of(xc)
      record(out, bname, function(g)
         return fresh(shuffle_raw(fname, g, ov, inv, v, xs, fmt, xc.device, tc(g, fname).dtype))
      end, x)
   end
   return out
end

-- pixel_shuffle(x, r): (*, C r^2, H, W) -> (*, C, H r, W r)
function F.pixel_shuffle(x, r)
   local fname = "pixel_shuffle"
   local xc = tensor_arg(fname, x, "input")
   r = int_arg(fname, r, "upscale_factor")
   local nd = xc.ndim
   if nd < 3 then
      err(fname, ("expected an input of at least 3 dims (*, C, H, W), got %d-D"):format(nd))
   end
   local s = sizes_of(xc)
   local c, h, w = s[nd - 2], s[nd - 1], s[nd]
   if c % (r * r) ~= 0 then
      err(fname, ("the channel dim (%d) must be divisible by upscale_factor^2 (%d)"):format(
          c, r * r))
   end
   local oc = c / (r * r)
   local v, perm, ov, o = {}, {}, {}, {}
   local b = nd - 3
   for i = 1, b do v[i] = s[i]; perm[i] = i; ov[i] = s[i]; o[i] = s[i] end
   -- x as (*, oc, r, r, h, w) -> (*, oc, h, r, w, r) -> (*, oc, h r, w r)
   v[b + 1], v[b + 2], v[b + 3], v[b + 4], v[b + 5] = oc, r, r, h, w
   perm[b + 1], perm[b + 2], perm[b + 3], perm[b + 4], perm[b + 5] = b + 1, b + 4, b + 2, b + 5,
      b + 3
   ov[b + 1], ov[b + 2], ov[b + 3], ov[b + 4], ov[b + 5] = oc, h, r, w, r
   o[b + 1], o[b + 2], o[b + 3] = oc, h * r, w * r
   return shuffle(fname, "PixelShuffleBackward", x, xc, v, perm, ov, o, format_of(xc))
end

-- pixel_unshuffle(x, r): (*, C, H r, W r) -> (*, C r^2, H, W)
function F.pixel_unshuffle(x, r)
   local fname = "pixel_unshuffle"
   local xc = tensor_arg(fname, x, "input")
   r = int_arg(fname, r, "downscale_factor")
   local nd = xc.ndim
   if nd < 3 then
      err(fname, ("expected an input of at least 3 dims (*, C, H, W), got %d-D"):format(nd))
   end
   local s = sizes_of(xc)
   local c, h, w = s[nd - 2], s[nd - 1], s[nd]
   if h % r ~= 0 or w % r ~= 0 then
      err(fname, ("the spatial sizes (%d, %d) must be divisible by downscale_factor (%d)"):format(
          h, w, r))
   end
   local oh, ow = h / r, w / r
   local v, perm, ov, o = {}, {}, {}, {}
   local b = nd - 3
   for i = 1, b do v[i] = s[i]; perm[i] = i; ov[i] = s[i]; o[i] = s[i] end
   -- x as (*, c, oh, r, ow, r) -> (*, c, r, r, oh, ow) -> (*, c r r, oh, ow)
   v[b + 1], v[b + 2], v[b + 3], v[b + 4], v[b + 5] = c, oh, r, ow, r
   perm[b + 1], perm[b + 2], perm[b + 3], perm[b + 4], perm[b + 5] = b + 1, b + 3, b + 5, b + 2,
      b + 4
   ov[b + 1], ov[b + 2], ov[b + 3], ov[b + 4], ov[b + 5] = c, r, r, oh, ow
   o[b + 1], o[b + 2], o[b + 3] = c * r * r, oh, ow
   return shuffle(fname, "PixelUnshuffleBackward", x, xc, v, perm, ov, o, format_of(xc))
end

-- channel_shuffle(x, groups): (N, C, *) with C = g k: x as (N, g, k, *) -> (N, k, g, *)
function F.channel_shuffle(x, groups)
   local fname = "channel_shuffle"
   local xc = tensor_arg(fname, x, "input")
   local g = int_arg(fname, groups, "groups")
   local nd = xc.ndim
   if nd < 3 then
      err(fname, ("expected an input of at least 3 dims (N, C, *), got %d-D"):format(nd))
   end
   local s = sizes_of(xc)
   local c = s[2]
   if c % g ~= 0 then
      err(fname, ("the number of channels (%d) must be divisible by groups (%d)"):format(c, g))
   end
   local k = c / g
   local v, perm, ov = { s[1], g, k }, { 1, 3, 2 }, { s[1], k, g }
   for i = 3, nd do v[i + 1] = s[i]; perm[i + 1] = i + 1; ov[i + 1] = s[i] end
   return shuffle(fname, "ChannelShuffleBackward", x, xc, v, perm, ov, s, format_of(xc))
end
