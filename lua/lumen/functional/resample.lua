-- lumen.functional.resample -- lm.F.interpolate (modes nearest, nearest-exact, linear, bilinear,
-- bicubic, trilinear; size or scale_factor; align_corners; recompute_scale_factor; antialias)
-- with its backward (issue 40).
--
-- Every mode is separable: the output is the input with one small table of taps (each output
-- position a weighted sum of a few input positions) applied along each spatial dim d. The taps
-- hold exactly PyTorch's CPU indices and weights, in its order (area_pixel_compute_scale /
-- area_pixel_compute_source_index for the linear and cubic modes, computed in the op-math type:
-- float for float32/16/bfloat16, double for float64; nearest: floorf(dst * scale), nearest-exact:
-- floorf((dst + 0.5) * scale), both in float; bicubic: A = -0.75, four taps clamped to the
-- borders). The forward runs one lm_resample pass per resized dim (src/ops/resample.c: a row of
-- the tensor viewed as (B, In, R) in its PHYSICAL order, N, C, spatial... for contiguous; N,
-- spatial..., C for channels_last / channels_last_3d), so the result comes out in the input's
-- memory format with no permuting copy, on every device. The backward runs the transposed taps
-- over the gradient in the same order (grad_input in the input's format). float16 / bfloat16
-- compute in float32 and round once, as PyTorch's CPU kernels. Nearest modes are one tap of
-- weight 1: the values are copied (NaN and infinities as PyTorch copies them); a linear mode
-- multiplies both of its taps, so a non-finite value reaches its neighbours as in PyTorch.
-- (Until session 30 the passes were dense out x in matrices through matmul: In multiply-adds per
-- output value, 80 ms for a nearest 2x of 8 x 64 x 128 x 128, and 0 * inf spread NaN.)
-- antialias = true (bilinear / bicubic, 4-D input; PyTorch's _upsample_bilinear2d_aa /
-- _upsample_bicubic2d_aa) is the same scheme with PIL-style taps (aa_rows): a filter stretched by
-- the scale when downsampling and normalized per output row; the forward applies W before H, as
-- PyTorch's separable CPU kernel. float16 / bfloat16 compute in float32 here too (PyTorch's CPU
-- refuses them for antialias, its CUDA kernels take them).

local ffi = require("ffi")
local C = require("lumen.C")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local H = require("lumen.functional.common")

local type, tostring, tonumber, getmetatable = type, tostring, tonumber, getmetatable
local floor, min, max = math.floor, math.min, math.max

local R = T.raw
local needs, record, fresh = A.needs, A.record, A.fresh
local err, tensor_arg, check_opts = H.err, H.tensor_arg, H.check_opts

local F = H.F

local OPTS = H.option_set("size", "scale_factor", "mode", "align_corners",
                          "recompute_scale_factor", "antialias")
F._OPTIONS.interpolate = OPTS

-- the spatial rank each mode needs (nil: any of 1, 2, 3)
local MODES = { nearest = false, ["nearest-exact"] = false, area = false, linear = 1,
                bilinear = 2, bicubic = 2, trilinear = 3 }

local fbuf = ffi.new("float[1]")
local function f32(v) fbuf[0] = v; return fbuf[0] end
local function f64(v) return v end

local A_CUBIC = -0.75
local function cc1(x) return ((A_CUBIC + 2) * x - (A_CUBIC + 3)) * x * x + 1 end
local function cc2(x) return ((A_CUBIC * x - 5 * A_CUBIC) * x + 8 * A_CUBIC) * x - 4 * A_CUBIC end

-- the taps of one dim as rows (dim_rows, aa_rows, below), and whether they are the identity.
-- r: the op-math rounding (f32 or f64). scale: the user's scale factor for this dim or nil.
-- area_pixel_compute_scale: input pixels per output pixel, in the op-math type r (shared by the
-- plain and the antialiased weights)
local function area_scale(align, insz, outsz, scale, r)
   if align then return outsz > 1 and r(r(insz - 1) / (outsz - 1)) or 0 end
   return (scale ~= nil and scale > 0) and r(1.0 / scale) or r(r(insz) / outsz)
end

-- rows[o] = { i1, w1, i2, w2, ... }: output o's taps in PyTorch's order (0-based i; a tap may
-- repeat an index, as PyTorch's clamped bicubic taps and the last linear pair do).
-- k: the spatial rank. A dim whose size does not change is the identity, whatever the scale
-- factor, where PyTorch 2.x's kernels short-cut it: nearest in 2-D (its nearest_idx: also o / 2
-- at twice the size) and linear, bilinear, trilinear; nearest in 1-D and 3-D, nearest-exact and
-- bicubic take the user's scale there too (F.interpolate of 1 x 1 x 3 by scale_factor 1.25:
-- nearest 0, 0, 1, linear 0, 1, 2)
local function dim_rows(mode, insz, outsz, align, scale, r, k)
   local rows = {}
   local ident = insz == outsz
   if ident and (mode == "linear" or mode == "bilinear" or mode == "trilinear") then
      for o = 0, outsz - 1 do rows[o] = { o, 1 } end
      return rows, true
   end
   local function add(o, i, w)
      local row = rows[o]
      row[#row + 1] = i
      row[#row + 1] = w
   end
   if mode == "nearest" or mode == "nearest-exact" then
      -- compute_scales_value<float>
      local s = (scale ~= nil and scale > 0) and f32(1.0 / scale) or f32(f32(insz) / outsz)
      for o = 0, outsz - 1 do
         rows[o] = {}
         local i
         if mode == "nearest" then
            if k == 2 and outsz == insz then i = o
            elseif k == 2 and outsz == 2 * insz then i = floor(o / 2)
            else i = min(floor(f32(o * s)), insz - 1) end
         else
            i = min(floor(f32((o + 0.5) * s)), insz - 1)
         end
         if i ~= o then ident = false end
         add(o, i, 1)
      end
      return rows, ident
   end
   local s = area_scale(align, insz, outsz, scale, r)
   local cubic = mode == "bicubic"
   for o = 0, outsz - 1 do
      rows[o] = {}
      -- area_pixel_compute_source_index
      local src
      if align then src = r(s * o)
      else
         src = r(r(s * r(o + 0.5)) - 0.5)
         if not cubic and src < 0 then src = 0 end
      end
      -- guard_index_and_lambda
      local i0 = min(floor(f32(src)), insz - 1)
      if r == f64 then i0 = min(floor(src), insz - 1) end
      local t = min(max(r(src - i0), 0), 1)
      if cubic then
         local w = { r(cc2(r(t + 1))), r(cc1(t)), r(cc1(r(1 - t))), r(cc2(r(r(1 - t) + 1))) }
         for j = 0, 3 do
            add(o, max(min(i0 - 1 + j, insz - 1), 0), w[j + 1])
         end
      else
         local off = i0 < insz - 1 and 1 or 0
         add(o, i0, r(1 - t))
         add(o, i0 + off, t)
      end
      if ident then
         local row = rows[o]
         for j = 1, #row, 2 do
            local i, w = row[j], row[j + 1]
            if (i == o and w ~= 1) or (i ~= o and w ~= 0) then ident = false end
         end
      end
   end
   return rows, ident
end

-- antialias = true (bilinear, bicubic; 4-D input): PyTorch's _upsample_{bilinear,bicubic}2d_aa
-- weights of one dim, computed in the op-math type r as its CPU kernel does in scalar_t
-- (float for float32, double for float64). scale = area_pixel_compute_scale (align_corners:
-- (in - 1) / (out - 1), else 1 / scale_factor or in / out); the filter (triangle, or Keys' cubic
-- with A = -0.5) is stretched by scale when downsampling (support = interp_size / 2 * scale),
-- centred at scale * (o + 0.5) also with align_corners, cut to the input and normalized to sum
-- 1 (PIL's resampling). A dim whose size does not change is skipped (the identity), as PyTorch's
-- separable CPU kernel skips it.
local A_AA = -0.5
local function aa_filter(cubic, x, r)
   if x < 0 then x = -x end
   if cubic then
      if x < 1 then return r(r(r(r(r((A_AA + 2) * x) - (A_AA + 3)) * x) * x) + 1) end
      if x < 2 then
         return r(r(r(r(r(r(A_AA * x) - 5 * A_AA) * x) + 8 * A_AA) * x) - 4 * A_AA)
      end
      return 0
   end
   if x < 1 then return r(1 - x) end
   return 0
end

local function aa_rows(mode, insz, outsz, align, scale, r)
   local rows = {}
   if insz == outsz then
      for o = 0, outsz - 1 do rows[o] = { o, 1 } end
      return rows, true
   end
   local s = area_scale(align, insz, outsz, scale, r)
   local cubic = mode == "bicubic"
   local half = cubic and 2 or 1                          -- interp_size / 2
   local support = s >= 1 and r(half * s) or half
   local maxn = math.ceil(support) * 2 + 1
   local invscale = s >= 1 and r(1.0 / s) or 1
   local trunc = function(v) return v < 0 and math.ceil(v) or floor(v) end
   for o = 0, outsz - 1 do
      local row = {}
      rows[o] = row
      local center = r(s * (o + 0.5))
      local xmin = max(trunc(r(center - support) + 0.5), 0)
      local xsize = min(trunc(r(center + support) + 0.5), insz) - xmin
      xsize = max(min(xsize, maxn), 0)
      local w, total = {}, 0
      for j = 0, xsize - 1 do
         w[j] = aa_filter(cubic, r((r(j + xmin - center) + 0.5) * invscale), r)
         total = r(total + w[j])
      end
      for j = 0, xsize - 1 do
         local v = w[j]
         if total ~= 0 then v = r(v / total) end
         if v ~= 0 then
            row[#row + 1] = xmin + j
            row[#row + 1] = v
         end
      end
   end
   return rows, false
end

-- The plan of one resized dim, cached by key (mode, sizes, options, dtype, device): its rows
-- (dim_rows / aa_rows), whether they are the identity, and lm_resample's tensors {ptr, idx, w,
-- out size} on device, forward (p.f) and, made at the first backward, transposed (p.b: input i's
-- taps are every (o, w) that reads it, o ascending). A training loop resamples the same shapes
-- every step: neither the rows nor the tensors are made again.
local cache, ncache = {}, 0
local CACHE_MAX = 256
local function plan(key, build)
   local p = cache[key]
   if p then return p end
   local rows, ident = build()
   p = { rows = rows, ident = ident }
   if ncache >= CACHE_MAX then cache, ncache = {}, 0 end
   cache[key] = p
   ncache = ncache + 1
   return p
end

local function taps(p, insz, outsz, transpose, cdt, device)
   local have
   if transpose then have = p.b else have = p.f end
   if have then return have end
   local rows = p.rows
   local ptr, idx, w = { 0 }, {}, {}
   if transpose then
      local by = {}
      for i = 0, insz - 1 do by[i] = {} end
      for o = 0, outsz - 1 do
         local row = rows[o]
         for j = 1, #row, 2 do
            local l = by[row[j]]
            l[#l + 1] = o
            l[#l + 1] = row[j + 1]
         end
      end
      rows, outsz = by, insz
   end
   for o = 0, outsz - 1 do
      local row = rows[o]
      for j = 1, #row, 2 do
         idx[#idx + 1] = row[j]
         w[#w + 1] = row[j + 1]
      end
      ptr[o + 2] = #idx
   end
   local mk = require("lumen.creation").tensor
   local t = { mk(ptr, { dtype = "int64", device = device }),
               mk(idx, { dtype = "int64", device = device }),
               mk(w, { dtype = cdt, device = device }), outsz }
   if transpose then p.b = t else p.f = t end
   return t
end

local resample_out = ffi.new("lm_tensor*[1]")
-- one pass: v (B, In, R) dense -> (B, Out, R) by taps tp
local function pass(v, tp)
   resample_out[0] = nil
   H.check(C.lm_resample(T.tc(v, "interpolate"), T.tc(tp[1], "interpolate"),
                         T.tc(tp[2], "interpolate"), T.tc(tp[3], "interpolate"), resample_out),
           "interpolate")
   return T.wrap(resample_out[0])
end

-- t (N, C, S1..Sk) with the taps mats[i] (in_i -> out_i, or false to keep dim i) applied along
-- each spatial dim, in the physical order given by cl (true: N, S.., C); the result is dense in
-- that order (so channels-last strides when cl)
local function apply(t, mats, cl, last_first)
   local nd = R.dim(t)
   local k = nd - 2
   local perm, inv = { 1 }, {}
   if cl then
      for i = 1, k do perm[i + 1] = i + 2 end
      perm[nd] = 2
   else
      for i = 2, nd do perm[i] = i end
   end
   for i = 1, nd do inv[perm[i]] = i end
   local u = R.permute(t, perm)
   local sizes = {}
   for i = 1, nd do sizes[i] = R.size(u, i) end
   local did = false
   for step = 1, k do
      local i = last_first and k + 1 - step or step
      local m = mats[i]
      if m then
         local pos = cl and i + 1 or i + 2
         local b, rest = 1, 1
         for j = 1, pos - 1 do b = b * sizes[j] end
         for j = pos + 1, nd do rest = rest * sizes[j] end
         local v = R.reshape(u, { b, sizes[pos], rest })
         local y = pass(v, m)
         sizes[pos] = m[4]
         u = R.reshape(y, sizes)
         did = true
      end
   end
   if not did then u = R.clone(u) end      -- a copy, dense in the physical order
   return R.permute(u, inv)
end

local function num_list(fname, v, k, what, int)
   local r = {}
   if type(v) == "number" then
      for i = 1, k do r[i] = v end
   elseif type(v) == "table" and (getmetatable(v) == nil or T.is_sizes(v)) then
      if #v ~= k then
         err(fname, ("%s must have %d elements for a %d-D spatial input, got %d"):format(what,
             k, k, #v))
      end
      for i = 1, k do r[i] = v[i] end
   else
      err(fname, what .. " must be a number or a table of numbers, got " .. T.typename(v))
   end
   for i = 1, k do
      local x = r[i]
      if type(x) ~= "number" or x ~= x or (int and x % 1 ~= 0) or x <= 0 or x == math.huge then
         err(fname, ("%s must hold positive %s, got %s"):format(what,
             int and "integers" or "finite numbers", tostring(x)))
      end
   end
   return r
end

-- A size the memory cannot hold is an error before any work: the output's element count (which
-- could pass 2^63), and the plans, whose Lua rows and tap tensors take about PLAN_BYTES a
-- position of each resized dim: F.interpolate(x, {size = {1e9, 1}}) would otherwise build a
-- billion-row table until the kernel's OOM killer ends the process (the allocator's own error
-- comes only for the tensors, after the plan)
local PLAN_BYTES = 200
local mem_total
local function physical_memory()
   if mem_total == nil then
      mem_total = 8 * 2 ^ 30                            -- where /proc/meminfo cannot be read
      local f = io.open("/proc/meminfo", "r")
      if f then
         local kb = tonumber((f:read("*a") or ""):match("MemTotal:%s*(%d+)"))
         f:close()
         if kb then mem_total = kb * 1024 end
      end
   end
   return mem_total
end

local function plan_budget(fname, xc, insz, outsz)
   local numel, positions = tonumber(xc.sizes[0]) * tonumber(xc.sizes[1]), 0
   for i = 1, #outsz do
      numel = numel * outsz[i]
      if outsz[i] ~= insz[i] then positions = positions + outsz[i] + insz[i] end
   end
   if numel >= 2 ^ 62 then
      err(fname, ("output size %s is too large (%.3g elements)"):format(
          table.concat(outsz, " x "), numel))
   end
   local need = positions * PLAN_BYTES
   if need > physical_memory() / 2 then
      err(fname, ("output size %s is too large: resampling plans for it would take about " ..
          "%.3g GB, more than half of this machine's %.3g GB"):format(
          table.concat(outsz, " x "), need / 2 ^ 30, physical_memory() / 2 ^ 30))
   end
end

-- is v the options table (string keys) rather than a size list ({9, 9}, lm.Size) or a number?
local function is_opts(v)
   return type(v) == "table" and getmetatable(v) == nil and v[1] == nil
end
-- PyTorch's positional arguments (size, scale_factor, mode, align_corners,
-- recompute_scale_factor, antialias) as the options table
local function positional(size, ...)
   local sf, mode, ac, rsf, aa = ...
   return { size = size, scale_factor = sf, mode = mode, align_corners = ac,
            recompute_scale_factor = rsf, antialias = aa }
end

-- interpolate(x, {size=, scale_factor=, mode="nearest", align_corners=, recompute_scale_factor=,
-- antialias=}), or PyTorch's positional form interpolate(x, size, scale_factor, mode,
-- align_corners, recompute_scale_factor, antialias) (size a number or a list, or nil)
function F.interpolate(x, opts, ...)
   local fname = "interpolate"
   local xc = tensor_arg(fname, x, "input")
   if not is_opts(opts) and (opts ~= nil or select("#", ...) > 0) then
      if type(opts) ~= "number" and type(opts) ~= "table" and opts ~= nil then
         err(fname, "expected an options table, a size (a number or a table of numbers) or nil "
             .. "as the second argument, got " .. T.typename(opts))
      end
      opts = positional(opts, ...)
   end
   opts = check_opts(fname, opts, OPTS)
   local mode = opts.mode == nil and "nearest" or opts.mode
   if type(mode) ~= "string" or MODES[mode] == nil then
      err(fname, "mode must be one of nearest, nearest-exact, area, linear, bilinear, " ..
          "bicubic, trilinear, got " .. (type(mode) == "string" and ("\"" .. mode .. "\"")
                                or T.typename(mode)))
   end
   local aa = opts.antialias
   if aa ~= nil and type(aa) ~= "boolean" then
      err(fname, "antialias must be a boolean, got " .. T.typename(aa))
   end
   local nd = xc.ndim
   if nd < 3 or nd > 5 then
      err(fname, ("expected a 3-D, 4-D or 5-D (batched) input, got %d-D input of size %s")
          :format(nd, H.sizes_str(xc)))
   end
   if aa and not ((mode == "bilinear" or mode == "bicubic") and nd == 4) then
      err(fname, ("Anti-alias option is restricted to bilinear and bicubic modes and requires "
          .. "a 4-D tensor as input, got mode \"%s\" and %d-D input of size %s"):format(mode,
          nd, H.sizes_str(xc)))
   end
   local k = nd - 2
   if MODES[mode] and MODES[mode] ~= k then
      err(fname, ("mode \"%s\" expects a %d-D input, got %d-D input of size %s"):format(mode,
          MODES[mode] + 2, nd, H.sizes_str(xc)))
   end
   -- uint8 images (masks, decoded pictures) take the nearest modes, as PyTorch: the values pass
   -- through float32 exactly. PyTorch's uint8 bilinear rounds in its own integer arithmetic:
   -- refused here rather than given other values.
   if tostring(R.dtype(x)) == "uint8" then
      if MODES[mode] or mode == "area" then
         err(fname, ("mode \"%s\" on a uint8 input is not supported (nearest and nearest-exact "
             .. "are; convert to a floating dtype for the others)"):format(mode))
      end
   else
      H.check_float(fname, xc, "input")
   end
   local align = opts.align_corners
   if align ~= nil and type(align) ~= "boolean" then
      err(fname, "align_corners must be a boolean, got " .. T.typename(align))
   end
   if not MODES[mode] then
      if align ~= nil then
         err(fname, "align_corners option can only be set with the interpolating modes: " ..
             "linear | bilinear | bicubic | trilinear")
      end
      align = false
   end
   align = align and true or false
   local recompute = opts.recompute_scale_factor
   if recompute ~= nil and type(recompute) ~= "boolean" then
      err(fname, "recompute_scale_factor must be a boolean, got " .. T.typename(recompute))
   end
   local insz = {}
   for i = 1, k do insz[i] = tonumber(xc.sizes[i + 1]) end
   local outsz, scales = {}, {}
   if opts.size ~= nil and opts.scale_factor ~= nil then
      err(fname, "only one of size or scale_factor should be defined")
   elseif opts.size ~= nil then
      if recompute then
         err(fname, "recompute_scale_factor is not meaningful with an explicit size")
      end
      outsz = num_list(fname, opts.size, k, "size", true)
   elseif opts.scale_factor ~= nil then
      local sf = num_list(fname, opts.scale_factor, k, "scale_factor", false)
      for i = 1, k do
         outsz[i] = floor(insz[i] * sf[i])
         if outsz[i] < 1 then
            err(fname, ("scale_factor %s gives an empty output for input size %d"):format(
                tostring(sf[i]), insz[i]))
         end
         if not recompute then scales[i] = sf[i] end
      end
   else
      err(fname, "either size or scale_factor should be defined")
   end
   for i = 1, k do
      if insz[i] < 1 then
         err(fname, ("input of size %s has an empty spatial dim"):format(H.sizes_str(xc)))
      end
   end
   if mode == "area" then
      -- PyTorch's: an adaptive average pooling to the output size (its kernels keep the
      -- channels-last format and differentiate it)
      local pool = ({ F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d })[k]
      return pool(x, k == 1 and outsz[1] or outsz)
   end
   plan_budget(fname, xc, insz, outsz)
   local dtype = tostring(R.dtype(x))
   local cdt = (dtype == "float64") and "float64" or "float32"
   local r = cdt == "float64" and f64 or f32
   local device = R.device(x)
   local plans, fwd = {}, {}
   local dkey = tostring(device)
   for i = 1, k do
      local key = table.concat({ mode, k, tostring(aa), insz[i], outsz[i], tostring(align),
                                 scales[i] and ("%.17g"):format(scales[i]) or "-", cdt, dkey }, "|")
      plans[i] = plan(key, function()
         return (aa and aa_rows or dim_rows)(mode, insz[i], outsz[i], align, scales[i], r, k)
      end)
      fwd[i] = (not plans[i].ident) and taps(plans[i], insz[i], outsz[i], false, cdt, device)
   end
   local f = C.lm_suggest_memory_format(xc, 0)
   local cl = (f == C.LM_CHANNELS_LAST and nd == 4) or (f == C.LM_CHANNELS_LAST_3D and nd == 5)
   local xin = dtype == cdt and x or R.to(x, cdt)
   local out = apply(xin, fwd, cl, aa)   -- antialias: W first, then H, as PyTorch's passes
   if dtype ~= cdt then out = R.to(out, dtype) end
   if A.is_grad_enabled() and needs(x) then
      record(out, aa and (mode == "bicubic" and "UpsampleBicubicAaBackward" or
                          "UpsampleBilinearAaBackward") or
             mode == "nearest" and "UpsampleNearestBackward" or
             mode == "nearest-exact" and "UpsampleNearestExactBackward" or
             mode == "bicubic" and "UpsampleBicubicBackward" or "UpsampleLinearBackward",
             function(g)
         local bwd = {}
         for i = 1, k do
            bwd[i] = (not plans[i].ident) and taps(plans[i], insz[i], outsz[i], true, cdt, device)
         end
         local gin = tostring(R.dtype(g)) == cdt and g or R.to(g, cdt)
         local gx = apply(gin, bwd, cl)
         if dtype ~= cdt then gx = R.to(gx, dtype) end
         return fresh(gx)
      end, x)
   end
   return out
end

-- upsample(x, size, scale_factor, mode, align_corners): the deprecated spelling
function F.upsample(x, size, scale_factor, mode, align_corners)
   if is_opts(size) and scale_factor == nil and mode == nil and align_corners == nil then
      return F.interpolate(x, size)
   end
   return F.interpolate(x, { size = size, scale_factor = scale_factor, mode = mode,
                             align_corners = align_corners })
end

-- upsample_nearest(x, size, scale_factor) and upsample_bilinear(x, size, scale_factor): PyTorch's
-- deprecated spellings of interpolate's nearest mode, and of bilinear with align_corners = true
-- ({size =, scale_factor =} also works)
local UP_OPTS = H.option_set("size", "scale_factor")
F._OPTIONS.upsample_nearest, F._OPTIONS.upsample_bilinear = UP_OPTS, UP_OPTS
local function up_args(fname, size, scale_factor)
   if is_opts(size) then
      if scale_factor ~= nil then err(fname, "options table and scale_factor given together") end
      local o = check_opts(fname, size, UP_OPTS)
      return o.size, o.scale_factor
   end
   return size, scale_factor
end
function F.upsample_nearest(x, size, scale_factor)
   size, scale_factor = up_args("upsample_nearest", size, scale_factor)
   return F.interpolate(x, { size = size, scale_factor = scale_factor, mode = "nearest" })
end
function F.upsample_bilinear(x, size, scale_factor)
   size, scale_factor = up_args("upsample_bilinear", size, scale_factor)
   return F.interpolate(x, { size = size, scale_factor = scale_factor, mode = "bilinear",
                             align_corners = true })
end

return F
