-- lumen.onnx -- lm.onnx.export(model, input, path, {opset = 17}): an ONNX model of the traced
-- graph (lm.jit.trace), which ONNX Runtime runs with the same results.
--
-- The model is traced (or a traced module is taken as it is) and each node becomes ONNX nodes:
--   F.conv2d            Conv (a fused epilogue {residual =, relu =, act =} adds Add and the
--                       activation's nodes, as below)
--   F.batch_norm        BatchNormalization (evaluation mode only)
--   F.group_norm        Reshape, InstanceNormalization, Reshape, Mul, Add (any opset)
--   F.layer_norm        LayerNormalization (opset 17 or later), below 17 ReduceMean, Sub, Mul,
--                       ReduceMean, Add, Sqrt, Div (torch.onnx's decomposition)
--   F.instance_norm     InstanceNormalization (BatchNormalization with use_input_stats = false)
--   relu, relu_         Relu;  sigmoid, tanh: Sigmoid, Tanh;  F.softmax: Softmax
--   F.max_pool2d        MaxPool;  F.avg_pool2d: AveragePool (and the 3-D pools, F.conv3d)
--   F.adaptive_avg_pool2d  GlobalAveragePool (1x1), AveragePool (sizes that divide), else two
--                       MatMuls with constant averaging matrices (the same regions as lumen's)
--   F.linear            Gemm (2-D input) or MatMul + Add (an act option adds the activation's
--                       nodes, as F.conv2d's)
--   F.flatten           Flatten (to the end) or Reshape;  view, reshape: Reshape
--   permute             Transpose
--   add, sub, mul, div  Add, Sub, Mul, Div;  cat: Concat;  narrow: Slice;  mean: ReduceMean
--   F.conv_transpose1d/2d/3d  ConvTranspose (output_padding, group, dilations)
--   F.interpolate, F.upsample  Resize (torch.onnx's attributes for each mode; scales or sizes;
--                       antialias from opset 18, not with align_corners)
--   F.silu  Sigmoid * x;  F.gelu: Gelu (opset 20+) or the erf (or tanh) formula;  F.hardswish:
--   HardSwish (opset 14+);  F.hardsigmoid: HardSigmoid;  F.relu6: Clip;  F.leaky_relu:
--   LeakyRelu;  F.elu: Elu;  F.mish: Mish (opset 18+) or x * Tanh(Softplus(x));
--   F.hardtanh: Clip;  F.softplus: Softplus (Mul, Softplus, Div for beta ~= 1);  F.selu: Selu;
--   F.celu: Celu;  F.upsample_nearest / F.upsample_bilinear: Resize
--   F.pad: Pad (constant, reflect, edge; circular: wrap from opset 19, Slice + Concat below)
--   F.pixel_shuffle: DepthToSpace (CRD; 4-D), F.pixel_unshuffle, F.channel_shuffle (and
--   pixel_shuffle of other ranks): Reshape, Transpose, Reshape
--   dropout, dropout1d/2d/3d (evaluation), contiguous, to(memory format), clone: nothing (the
--   value is passed on); lm.ops.stochastic_depth in evaluation returns its input (no node)
-- The lm.F functions that have no ONNX form are listed in NO_ONNX below with the reason (export
-- names it when it refuses a graph).
-- ONNX tensors are NCHW by definition: a channels-last value is exported with its logical sizes,
-- and weights are written in logical (row-major) order, whatever their memory format.
-- The protobuf is written by build/liblumen_onnx.so (src/onnx/onnx_shim.c over Debian's
-- protobuf-c and the ONNX schema), loaded the first time export runs.
local ffi = require("ffi")
local T = require("lumen.tensor")
local G = require("lumen.jit.graph")
local Tensor = T.Tensor

local M = {}

M.DEFAULT_OPSET = 17
M.MIN_OPSET, M.MAX_OPSET = 13, 21

local function fail(msg, level)
   error("lumen.onnx.export: " .. msg, level or T.user_level())
end

---------------------------------------------------------------------------------------------
-- the shim
---------------------------------------------------------------------------------------------

local CDEF = [[
typedef struct lm_onnx lm_onnx;
const char *lm_onnx_error(void);
lm_onnx *lm_onnx_new(const char *graph_name, const char *producer, const char *producer_version,
                     int64_t opset, int64_t ir_version);
void lm_onnx_free(lm_onnx *m);
int lm_onnx_add_io(lm_onnx *m, int is_output, const char *name, int32_t elem_type, int ndims,
                   const int64_t *dims);
int lm_onnx_add_initializer(lm_onnx *m, const char *name, int32_t elem_type, int ndims,
                            const int64_t *dims, const void *data, size_t nbytes);
int lm_onnx_add_node(lm_onnx *m, const char *op_type, const char *name, int nin,
                     const char **inputs, int nout, const char **outputs);
int lm_onnx_attr_int(lm_onnx *m, int node, const char *name, int64_t v);
int lm_onnx_attr_float(lm_onnx *m, int node, const char *name, float v);
int lm_onnx_attr_ints(lm_onnx *m, int node, const char *name, int n, const int64_t *v);
int lm_onnx_attr_string(lm_onnx *m, int node, const char *name, const char *v);
int lm_onnx_save(lm_onnx *m, const char *path);
int lm_onnx_set_dim_param(lm_onnx *m, int is_output, int index, int dim, const char *param);
]]

local lib
local function shim()
   if lib then return lib end
   pcall(ffi.cdef, CDEF)
   local tried = {}
   local list = {}
   local env = os.getenv("LUMEN_ONNX_LIB")
   if env and env ~= "" then list[1] = env end
   local lumen_lib = os.getenv("LUMEN_LIB")
   if lumen_lib and lumen_lib ~= "" then
      list[#list + 1] = (lumen_lib:match("^(.*)/[^/]*$") or ".") .. "/liblumen_onnx.so"
   end
   local src = debug.getinfo(1, "S").source
   if src:sub(1, 1) == "@" then
      list[#list + 1] = (src:sub(2):match("^(.*)[/\\]") or ".") .. "/../../build/liblumen_onnx.so"
   end
   for template in package.cpath:gmatch("[^;]+") do
      if template:find("?", 1, true) then
         -- installed: lib/lua/5.1/lumen/ beside liblumen.so (older installs: lib/lua/5.1/)
         list[#list + 1] = (template:gsub("%?", "lumen/liblumen_onnx"))
         list[#list + 1] = (template:gsub("%?", "liblumen_onnx"))
      end
   end
   for _, path in ipairs(list) do
      local f = io.open(path, "rb")
      if f then
         f:close()
         local ok, l = pcall(ffi.load, path)
         -- a writer built before the string attributes (lm_onnx_attr_string) is stale
         if ok and not pcall(function() return l.lm_onnx_attr_string end) then
            ok, l = false, "built before lm_onnx_attr_string: rebuild it with make"
         end
         if ok then
            lib = l
            return lib
         end
         tried[#tried + 1] = path .. " (" .. tostring(l) .. ")"
      else
         tried[#tried + 1] = path .. " (not found)"
      end
   end
   fail("the ONNX writer build/liblumen_onnx.so is not built (apt-get install " ..
        "libprotobuf-c-dev protobuf-c-compiler, then make); tried:\n  " ..
        table.concat(tried, "\n  "), 0)
end

-- is the writer there? (specs skip with a message when it is not)
function M.available()
   return (pcall(shim))
end

---------------------------------------------------------------------------------------------
-- export
---------------------------------------------------------------------------------------------

local ELEM = { float32 = 1, uint8 = 2, int8 = 3, int32 = 6, int64 = 7, bool = 9, float16 = 10,
               float64 = 11, bfloat16 = 16 }

local function ir_version(opset)
   if opset <= 14 then return 7 end
   if opset <= 18 then return 8 end
   if opset <= 20 then return 9 end
   return 10
end

local function pair(v, default)
   if v == nil then return { default, default } end
   if type(v) == "number" then return { v, v } end
   return { v[1], v[2] or v[1] }
end

-- a number or {d, h, w} (one value repeats) -> {d, h, w}
local function triple(v, default)
   if v == nil then return { default, default, default } end
   if type(v) == "number" then return { v, v, v } end
   return { v[1], v[2] or v[1], v[3] or v[1] }
end

-- the writer for one export: names, initializers, nodes
local function builder(L, m, g, tensors)
   local B = { names = {}, added = {}, n = 0 }
   local function check(rc, what)
      if rc < 0 then fail(what .. ": " .. ffi.string(L.lm_onnx_error()), 0) end
      return rc
   end
   local function dims(sizes)
      local d = ffi.new("int64_t[?]", math.max(1, #sizes))
      for i, s in ipairs(sizes) do d[i - 1] = s end
      return d
   end
   function B.fresh(base)
      B.n = B.n + 1
      return (base or "t") .. "_" .. B.n
   end
   -- an initializer from a tensor (its logical order)
   function B.init(name, t)
      if B.added[name] then return name end
      local dt = Tensor.dtype(t).name
      local et = ELEM[dt]
      if not et then fail("a weight of dtype " .. dt .. " has no ONNX type", 0) end
      if Tensor.device(t) ~= "cpu" then t = Tensor.to(t, "cpu") end
      local c = Tensor.contiguous(t)
      local sz = Tensor.size(c)
      local n = Tensor.numel(c) * Tensor.dtype(c).size
      check(L.lm_onnx_add_initializer(m, name, et, #sz, dims(sz),
                                      require("lumen.C").lm_tensor_data(c._c), n), name)
      B.added[name] = true
      return name
   end
   function B.const_f(values, sizes, dtype)
      local lm = require("lumen")
      local t = lm.tensor(values, { dtype = dtype or "float32" })
      if sizes then t = Tensor.reshape(t, sizes) end
      return B.init(B.fresh("const"), t)
   end
   function B.const_i64(values)
      local lm = require("lumen")
      return B.init(B.fresh("shape"), lm.tensor(values, { dtype = "int64" }))
   end
   -- the ONNX name of value id
   function B.name(id)
      local nm = B.names[id]
      if nm then return nm end
      local v = g.values[id]
      if v and v.name then
         return B.init(v.name, tensors[v.name])
      end
      fail("internal: value " .. tostring(id) .. " has no ONNX name", 0)
   end
   -- a node: inputs (names; "" leaves an optional input out), outputs (names), attributes
   -- {name = number (INT) | {ints} (INTS) | {f = x} (FLOAT) | "text" (STRING)}
   function B.node(op, inputs, outputs, attrs)
      local ci = ffi.new("const char *[?]", math.max(1, #inputs))
      for i, s in ipairs(inputs) do ci[i - 1] = s end
      local co = ffi.new("const char *[?]", #outputs)
      for i, s in ipairs(outputs) do co[i - 1] = s end
      local k = check(L.lm_onnx_add_node(m, op, B.fresh(op), #inputs, ci, #outputs, co), op)
      local keys = {}
      for a in pairs(attrs or {}) do keys[#keys + 1] = a end
      table.sort(keys)
      for _, a in ipairs(keys) do
         local v = attrs[a]
         if type(v) == "number" then
            check(L.lm_onnx_attr_int(m, k, a, v), op)
         elseif type(v) == "table" and v.f then
            check(L.lm_onnx_attr_float(m, k, a, v.f), op)
         elseif type(v) == "string" then
            check(L.lm_onnx_attr_string(m, k, a, v), op)
         elseif type(v) == "table" then
            local arr = ffi.new("int64_t[?]", math.max(1, #v))
            for i, x in ipairs(v) do arr[i - 1] = x end
            check(L.lm_onnx_attr_ints(m, k, a, #v, arr), op)
         else
            fail(("internal: attribute %s of %s is a %s"):format(a, op, type(v)), 0)
         end
      end
   end
   return B
end

local function value_sizes(g, id) return g.values[id].sizes end

-- averaging matrix (out x n): row i averages lumen's adaptive region [floor(i n / out),
-- ceil((i + 1) n / out))
local function adaptive_matrix(n, out)
   local rows = {}
   for i = 0, out - 1 do
      local s = math.floor(i * n / out)
      local e = math.ceil((i + 1) * n / out)
      local row = {}
      for j = 0, n - 1 do row[j + 1] = (j >= s and j < e) and 1 / (e - s) or 0 end
      rows[i + 1] = row
   end
   return rows
end

-- the exporters of the graph's operators: f(B, node, args (decoded), out names, g) -> nil
local OPS = {}

-- a fused epilogue's activation (F.conv2d's act) -> the exporter of its op and that op's
-- second argument
local ACT_EXPORT = { relu = { "F.relu" }, relu6 = { "F.relu6" }, silu = { "F.silu" },
                     hardswish = { "F.hardswish" }, hardsigmoid = { "F.hardsigmoid" },
                     sigmoid = { "F.sigmoid" }, gelu = { "F.gelu" },
                     gelu_tanh = { "F.gelu", "tanh" } }

local function relu_chain(B, y, opts, outs)
   local cur = y
   local res = opts and opts.residual
   local act = opts and (opts.act ~= "none" and opts.act or nil)
   if opts and opts.relu then act = "relu" end
   if res ~= nil then
      local nxt = act and B.fresh("add") or outs[1]
      B.node("Add", { cur, B.name(res.id) }, { nxt })
      cur = nxt
   end
   if act then
      local e = ACT_EXPORT[act]
      if not e then fail("a convolution epilogue with act '" .. tostring(act) .. "'", 0) end
      -- the exporter reads its input as a value id: a name of our own for cur
      local key = {}
      B.names[key] = cur
      OPS[e[1]](B, nil, { { id = key }, e[2] }, outs)
   end
end

-- Conv of 2 or 3 spatial dims (ONNX's Conv is N-D: pads are all the begins, then the ends)
local function conv_op(nd)
   local tuple, name = nd == 3 and triple or pair, nd == 3 and "conv3d" or "conv2d"
   return function(B, _, a, outs, g)
      local o = a[4] or {}
      local p = o.padding
      if type(p) == "string" then
         if p ~= "valid" then fail(name .. " with padding '" .. p .. "' is not exported", 0) end
         p = 0
      end
      local pad, st, dl = tuple(p, 0), tuple(o.stride, 1), tuple(o.dilation, 1)
      local w = g.values[a[2].id]
      local ins = { B.name(a[1].id), B.name(a[2].id) }
      if a[3] ~= nil then ins[3] = B.name(a[3].id) end
      local fused = o.residual ~= nil or o.relu or (o.act ~= nil and o.act ~= "none")
      local y = fused and B.fresh("conv") or outs[1]
      local ks, pads = {}, {}
      for i = 1, nd do
         ks[i] = w.sizes[i + 2]
         pads[i], pads[i + nd] = pad[i], pad[i]
      end
      B.node("Conv", ins, { y }, { kernel_shape = ks, strides = st, pads = pads, dilations = dl,
         group = o.groups or 1 })
      if fused then relu_chain(B, y, o, outs) end
   end
end
OPS["F.conv2d"] = conv_op(2)
OPS["F.conv3d"] = conv_op(3)

-- issue 40 (wt-resample): ConvTranspose of 1 to 3 spatial dims (weight (C_in, C_out / groups,
-- k...) is ONNX's layout too, output_padding and groups as attributes)
local function conv_transpose_op(nd)
   local function tuple(v, d)
      local r = {}
      for i = 1, nd do
         if v == nil then r[i] = d
         elseif type(v) == "number" then r[i] = v
         else r[i] = #v == 1 and v[1] or v[i] end
      end
      return r
   end
   return function(B, _, a, outs, g)
      local o = a[4] or {}
      local pad, st, dl = tuple(o.padding, 0), tuple(o.stride, 1), tuple(o.dilation, 1)
      local op = tuple(o.output_padding, 0)
      local w = g.values[a[2].id]
      local ins = { B.name(a[1].id), B.name(a[2].id) }
      if a[3] ~= nil then ins[3] = B.name(a[3].id) end
      local ks, pads = {}, {}
      for i = 1, nd do
         ks[i] = w.sizes[i + 2]
         pads[i], pads[i + nd] = pad[i], pad[i]
      end
      B.node("ConvTranspose", ins, outs, { kernel_shape = ks, strides = st, pads = pads,
         dilations = dl, output_padding = op, group = o.groups or 1 })
   end
end
OPS["F.conv_transpose1d"] = conv_transpose_op(1)
OPS["F.conv_transpose2d"] = conv_transpose_op(2)
OPS["F.conv_transpose3d"] = conv_transpose_op(3)

-- F.interpolate / F.upsample: Resize with the attributes torch.onnx writes for each mode (opset
-- 11+ symbolic): nearest -> mode "nearest", "asymmetric", nearest_mode "floor" (PyTorch's
-- floor(dst * scale)); linear / bilinear / trilinear -> "linear", bicubic -> "cubic" with
-- cubic_coeff_a -0.75, both "half_pixel" (PyTorch's (dst + 0.5) * scale - 0.5, linear clamped at
-- 0; not "pytorch_half_pixel", which maps an output of size 1 to 0 where PyTorch takes the
-- centre), or "align_corners"; nearest-exact (which torch.onnx does not export) -> "nearest",
-- "half_pixel", nearest_mode "round_prefer_ceil": round_prefer_ceil((dst + 0.5) / s - 0.5) is
-- floor((dst + 0.5) / s), PyTorch's rule.
-- The scales: with scale_factor (and not recompute_scale_factor) PyTorch maps coordinates with
-- 1 / scale_factor, so Resize gets the scales input (1, 1, scale_factor...), as torch.onnx
-- writes it; ONNX's output size is then floor(in * float32(scale)) (ONNX Runtime in float32,
-- onnx's shape inference in double), and where either is not lumen's size (in * scale an integer
-- that float32 rounds below it: 10 * 0.7 -> 6.9999999 in double) the sizes input is written
-- instead (in * scale is then out, so out / in is the same scale). With size
-- (or recompute_scale_factor) Resize gets the sizes input (N, C, size...); with a dynamic batch
-- N and C come from Shape(x) (Shape, Slice, Concat: torch.onnx's form).
-- antialias = true (bilinear, bicubic): Resize's antialias = 1 (opset 18 or later) with
-- exclude_outside = 1 and cubic_coeff_a -0.5, "half_pixel"; a dim that keeps its size gets scale
-- 1 (PyTorch skips it). Refused below opset 18, and with align_corners (PyTorch's filter centres
-- (in - 1) / (out - 1) * (dst + 0.5) match no coordinate_transformation_mode).
local RESIZE_MODE = { nearest = "nearest", ["nearest-exact"] = "nearest", linear = "linear",
                      bilinear = "linear", trilinear = "linear", bicubic = "cubic" }
local f32buf = ffi.new("float[1]")
local function f32(v) f32buf[0] = v; return f32buf[0] end

local function resize(B, x, xs, ys, o, outs)
   local mode = o.mode or "nearest"
   local onnx_mode = RESIZE_MODE[mode]
   if not onnx_mode then
      fail("interpolate with mode '" .. tostring(mode) .. "'" .. (mode == "area" and
           " (an adaptive average pooling; Resize has no such mode)" or ""), 0)
   end
   local aa = o.antialias == true
   if aa and B.opset < 18 then
      fail(("interpolate with antialias = true needs opset 18 or later (Resize's antialias " ..
            "attribute), got opset %d"):format(B.opset), 0)
   end
   if aa and o.align_corners then
      fail("interpolate with antialias = true and align_corners = true is not exported: " ..
           "PyTorch centres its filter at (in - 1) / (out - 1) * (dst + 0.5), which no " ..
           "coordinate_transformation_mode of Resize gives", 0)
   end
   local k = #xs - 2
   local ctm, nearest = "half_pixel", "floor"
   if mode == "nearest" then ctm = "asymmetric"
   elseif mode == "nearest-exact" then nearest = "round_prefer_ceil"
   elseif o.align_corners then ctm = "align_corners" end
   local attrs = { mode = onnx_mode, coordinate_transformation_mode = ctm,
                   nearest_mode = nearest, cubic_coeff_a = { f = -0.75 } }
   if aa then
      -- PyTorch's antialias: Keys' A = -0.5 for bicubic, the taps outside the input dropped and
      -- the rest renormalized (exclude_outside); ONNX Runtime gives PyTorch's values with these
      attrs.antialias, attrs.exclude_outside, attrs.cubic_coeff_a = 1, 1, { f = -0.5 }
   end
   local sf = o.scale_factor
   local use_scales = sf ~= nil and not o.recompute_scale_factor
   local scales = { 1, 1 }
   if use_scales then
      for i = 1, k do
         local s = type(sf) == "number" and sf or sf[i]
         -- a dim that keeps its size is left as it is, whatever the scale, by antialias, the
         -- linear modes and 2-D nearest (PyTorch's kernels; F.interpolate's rows)
         if xs[i + 2] == ys[i + 2] and (aa or onnx_mode == "linear"
                                        or (mode == "nearest" and k == 2)) then
            s = 1
         end
         scales[i + 2] = s
         -- the output size from the scale: ONNX Runtime multiplies in float32, onnx's shape
         -- inference in double (both by the float32 scale): each must give lumen's
         local sc = f32(s)
         if math.floor(f32(f32(xs[i + 2]) * sc)) ~= ys[i + 2]
            or math.floor(xs[i + 2] * sc) ~= ys[i + 2] then
            use_scales = false
         end
      end
   end
   if use_scales then
      -- every dim keeps its size but one is still resampled (1-D / 3-D nearest, nearest-exact,
      -- bicubic under a scale other than 1): ONNX Runtime's Resize copies a tensor whose shape
      -- does not change, so no Resize gives these values
      local same, resampled = true, false
      for i = 1, k do
         if xs[i + 2] ~= ys[i + 2] then same = false end
         if scales[i + 2] ~= 1 then resampled = true end
      end
      if same and resampled then
         fail(("interpolate mode '%s' with a scale_factor that keeps every size (%s): its "
              .. "values move, but ONNX Runtime's Resize copies a tensor whose shape does not "
              .. "change"):format(mode, table.concat(ys, " x ", 3)), 0)
      end
      return B.node("Resize", { x, "", B.const_f(scales, { #scales }) }, outs, attrs)
   end
   local sizes
   if B.dyn_batch and xs[1] == B.dyn_batch then
      local sh, nc = B.fresh("shape"), B.fresh("shape")
      B.node("Shape", { x }, { sh })
      B.node("Slice", { sh, B.const_i64({ 0 }), B.const_i64({ 2 }), B.const_i64({ 0 }) }, { nc })
      local sp = {}
      for i = 1, k do sp[i] = ys[i + 2] end
      sizes = B.fresh("sizes")
      B.node("Concat", { nc, B.const_i64(sp) }, { sizes }, { axis = 0 })
   else
      sizes = B.const_i64(ys)
   end
   B.node("Resize", { x, "", "", sizes }, outs, attrs)
end
-- interpolate's options from its call: the options table, or PyTorch's positional arguments
-- (size, scale_factor, mode, align_corners, recompute_scale_factor, antialias) from a[first]
local function interp_opts(a, first)
   local o = a[first]
   if type(o) == "table" and getmetatable(o) == nil and o[1] == nil then return o end
   return { size = o, scale_factor = a[first + 1], mode = a[first + 2],
            align_corners = a[first + 3], recompute_scale_factor = a[first + 4],
            antialias = a[first + 5] }
end
OPS["F.interpolate"] = function(B, node, a, outs, g)
   resize(B, B.name(a[1].id), value_sizes(g, a[1].id), value_sizes(g, node.outs.v),
          interp_opts(a, 2), outs)
end
-- upsample(x, size, scale_factor, mode, align_corners): interpolate's deprecated spelling
OPS["F.upsample"] = function(B, node, a, outs, g)
   local o = interp_opts(a, 2)
   o.recompute_scale_factor, o.antialias = nil, nil
   resize(B, B.name(a[1].id), value_sizes(g, a[1].id), value_sizes(g, node.outs.v), o, outs)
end
-- upsample_nearest(x, size, scale_factor) / upsample_bilinear(x, size, scale_factor): nearest,
-- and bilinear with align_corners = true (PyTorch's deprecated functions)
OPS["F.upsample_nearest"] = function(B, node, a, outs, g)
   local o = interp_opts(a, 2)
   resize(B, B.name(a[1].id), value_sizes(g, a[1].id), value_sizes(g, node.outs.v),
          { size = o.size, scale_factor = o.scale_factor }, outs)
end
OPS["F.upsample_bilinear"] = function(B, node, a, outs, g)
   local o = interp_opts(a, 2)
   resize(B, B.name(a[1].id), value_sizes(g, a[1].id), value_sizes(g, node.outs.v),
          { size = o.size, scale_factor = o.scale_factor, mode = "bilinear",
            align_corners = true }, outs)
end

OPS["F.batch_norm"] = function(B, _, a, outs, g)
   local o = a[6] or {}
   if o.training then fail("a batch norm in training mode (call model:eval() first)", 0) end
   if a[2] == nil or a[3] == nil then fail("a batch norm without running statistics", 0) end
   local c = value_sizes(g, a[2].id)[1]
   local ones, zeros = {}, {}
   for i = 1, c do ones[i], zeros[i] = 1, 0 end
   local scale = a[4] and B.name(a[4].id) or B.const_f(ones)
   local bias = a[5] and B.name(a[5].id) or B.const_f(zeros)
   local fused = o.residual ~= nil or o.relu
   local y = fused and B.fresh("bn") or outs[1]
   B.node("BatchNormalization", { B.name(a[1].id), scale, bias, B.name(a[2].id),
      B.name(a[3].id) }, { y }, { epsilon = { f = o.eps or 1e-5 } })
   if fused then relu_chain(B, y, o, outs) end
end

-- Tensor.permute(x, d1, d2, ...) or (x, {d1, ...}) with 1-based (possibly negative) dims: Transpose
OPS["Tensor.permute"] = function(B, _, a, outs, g)
   local nd = #value_sizes(g, a[1].id)
   local dims = type(a[2]) == "table" and a[2] or {}
   if type(a[2]) ~= "table" then
      for i = 2, #a do dims[#dims + 1] = a[i] end
   end
   local perm = {}
   for i, d in ipairs(dims) do perm[i] = d < 0 and d + nd or d - 1 end
   B.node("Transpose", { B.name(a[1].id) }, outs, { perm = perm })
end

-- F.group_norm: Reshape (N, G, -1), InstanceNormalization (unit scale), Reshape back, then the
-- per-channel weight and bias (Mul, Add over (C, 1, ...)): valid at every opset (GroupNormalization
-- of opset 18 scales per group, of opset 21 per channel; the decomposition is both's meaning)
local function channel_param(B, id, c, nd)
   local shape = { c }
   for i = 2, nd - 1 do shape[i] = 1 end
   local y = B.fresh("param")
   B.node("Reshape", { B.name(id), B.const_i64(shape) }, { y })
   return y
end

local function ones_zeros(n)
   local ones, zeros = {}, {}
   for i = 1, n do ones[i], zeros[i] = 1, 0 end
   return ones, zeros
end

OPS["F.group_norm"] = function(B, _, a, outs, g)
   local xs = value_sizes(g, a[1].id)
   local ng, o = a[2], a[5] or {}
   local ones, zeros = ones_zeros(ng)
   local r1, r2 = B.fresh("gn"), B.fresh("gn")
   B.node("Reshape", { B.name(a[1].id), B.const_i64({ 0, ng, -1 }) }, { r1 })
   B.node("InstanceNormalization", { r1, B.const_f(ones), B.const_f(zeros) }, { r2 },
          { epsilon = { f = o.eps or 1e-5 } })
   local shape = { 0 }
   for i = 2, #xs do shape[i] = xs[i] end
   local w, b = a[3], a[4]
   local y = (w or b) and B.fresh("gn") or outs[1]
   B.node("Reshape", { r2, B.const_i64(shape) }, { y })
   if w then
      local y2 = b and B.fresh("gn") or outs[1]
      B.node("Mul", { y, channel_param(B, w.id, xs[2], #xs) }, { y2 })
      y = y2
   end
   if b then B.node("Add", { y, channel_param(B, b.id, xs[2], #xs) }, outs) end
end

-- F.layer_norm: LayerNormalization (opset 17) over the trailing dims; below opset 17
-- torch.onnx's decomposition: d = x - ReduceMean(x), y = d / Sqrt(ReduceMean(d * d) + eps), then
-- Mul weight, Add bias (ReduceMean's axes an attribute up to opset 17)
OPS["F.layer_norm"] = function(B, _, a, outs, g)
   local ns, o = a[2], a[5] or {}
   if type(ns) == "number" then ns = { ns } end
   if B.opset < 17 then
      local nd = #value_sizes(g, a[1].id)
      local axes = {}
      for i = 1, #ns do axes[i] = nd - #ns + i - 1 end
      local dt = g.values[a[1].id].dtype
      local x = B.name(a[1].id)
      local mean, d, d2, var, ve, sd = B.fresh("ln"), B.fresh("ln"), B.fresh("ln"),
         B.fresh("ln"), B.fresh("ln"), B.fresh("ln")
      B.node("ReduceMean", { x }, { mean }, { axes = axes, keepdims = 1 })
      B.node("Sub", { x, mean }, { d })
      B.node("Mul", { d, d }, { d2 })
      B.node("ReduceMean", { d2 }, { var }, { axes = axes, keepdims = 1 })
      B.node("Add", { var, B.const_f({ o.eps or 1e-5 }, {}, dt) }, { ve })
      B.node("Sqrt", { ve }, { sd })
      local w, b = a[3], a[4]
      local y = (w or b) and B.fresh("ln") or outs[1]
      B.node("Div", { d, sd }, { y })
      if w then
         local y2 = b and B.fresh("ln") or outs[1]
         B.node("Mul", { y, B.name(w.id) }, { y2 })
         y = y2
      end
      if b then B.node("Add", { y, B.name(b.id) }, outs) end
      return
   end
   local n = 1
   for i = 1, #ns do n = n * ns[i] end
   local ones = ones_zeros(n)
   local scale = a[3] and B.name(a[3].id) or B.const_f(ones, ns)
   local ins = { B.name(a[1].id), scale }
   if a[4] then ins[3] = B.name(a[4].id) end
   B.node("LayerNormalization", ins, outs, { axis = -#ns, epsilon = { f = o.eps or 1e-5 } })
end

-- F.instance_norm: InstanceNormalization (the input's statistics), or BatchNormalization with the
-- running statistics (use_input_stats = false)
OPS["F.instance_norm"] = function(B, _, a, outs, g)
   local o = a[6] or {}
   local c = value_sizes(g, a[1].id)[2]
   local ones, zeros = ones_zeros(c)
   local scale = a[4] and B.name(a[4].id) or B.const_f(ones)
   local bias = a[5] and B.name(a[5].id) or B.const_f(zeros)
   if o.use_input_stats == false then
      B.node("BatchNormalization", { B.name(a[1].id), scale, bias, B.name(a[2].id),
         B.name(a[3].id) }, outs, { epsilon = { f = o.eps or 1e-5 } })
   else
      B.node("InstanceNormalization", { B.name(a[1].id), scale, bias }, outs,
             { epsilon = { f = o.eps or 1e-5 } })
   end
end

for _, op in ipairs({ "Tensor.relu", "Tensor.relu_", "F.relu", "F.relu_", "lm.relu" }) do
   OPS[op] = function(B, _, a, outs) B.node("Relu", { B.name(a[1].id) }, outs) end
end
for op, onnx in pairs({ ["Tensor.sigmoid"] = "Sigmoid", ["F.sigmoid"] = "Sigmoid",
                        ["Tensor.tanh"] = "Tanh", ["F.tanh"] = "Tanh" }) do
   OPS[op] = function(B, _, a, outs) B.node(onnx, { B.name(a[1].id) }, outs) end
end

-- issue 40 (wt-act): the activations, pad and the shuffles ---------------------------------
OPS["F.silu"] = function(B, _, a, outs)
   local x, sg = B.name(a[1].id), B.fresh("sigmoid")
   B.node("Sigmoid", { x }, { sg })
   B.node("Mul", { x, sg }, outs)
end
OPS["F.hardsigmoid"] = function(B, _, a, outs)
   B.node("HardSigmoid", { B.name(a[1].id) }, outs, { alpha = { f = 1 / 6 }, beta = { f = 0.5 } })
end
OPS["F.hardswish"] = function(B, _, a, outs)
   local x = B.name(a[1].id)
   if B.opset >= 14 then return B.node("HardSwish", { x }, outs) end
   local hs = B.fresh("hardsigmoid")
   B.node("HardSigmoid", { x }, { hs }, { alpha = { f = 1 / 6 }, beta = { f = 0.5 } })
   B.node("Mul", { x, hs }, outs)
end
OPS["F.relu6"] = function(B, _, a, outs)
   B.node("Clip", { B.name(a[1].id), B.const_f({ 0 }, {}), B.const_f({ 6 }, {}) }, outs)
end
OPS["F.leaky_relu"] = function(B, _, a, outs)
   local s = a[2]
   if type(s) == "table" then s = s.negative_slope end
   B.node("LeakyRelu", { B.name(a[1].id) }, outs, { alpha = { f = s or 0.01 } })
end
OPS["F.elu"] = function(B, _, a, outs)
   local al = a[2]
   if type(al) == "table" then al = al.alpha end
   B.node("Elu", { B.name(a[1].id) }, outs, { alpha = { f = al or 1 } })
end
OPS["F.elu_"] = OPS["F.elu"]
-- hardtanh(x, min_val, max_val[, inplace]) or (x, {min_val =, max_val =}): Clip, its bounds
-- inputs (opset 11+)
OPS["F.hardtanh"] = function(B, _, a, outs, g)
   local lo, hi = a[2], a[3]
   if type(lo) == "table" then lo, hi = lo.min_val, lo.max_val end
   local dt = g.values[a[1].id].dtype
   B.node("Clip", { B.name(a[1].id), B.const_f({ lo or -1 }, {}, dt),
                    B.const_f({ hi or 1 }, {}, dt) }, outs)
end
OPS["F.hardtanh_"] = OPS["F.hardtanh"]
-- softplus(x, beta, threshold): Softplus (log(1 + exp(x))), as torch.onnx writes it:
-- Softplus(x * beta) / beta for beta ~= 1; the threshold is not written (above it log(1 +
-- exp(beta x)) / beta and x differ by less than exp(-threshold))
OPS["F.softplus"] = function(B, _, a, outs, g)
   local beta = a[2]
   if type(beta) == "table" then beta = beta.beta end
   beta = beta or 1
   local x = B.name(a[1].id)
   if beta == 1 then return B.node("Softplus", { x }, outs) end
   local dt = g.values[a[1].id].dtype
   local bx, sp = B.fresh("softplus"), B.fresh("softplus")
   B.node("Mul", { x, B.const_f({ beta }, {}, dt) }, { bx })
   B.node("Softplus", { bx }, { sp })
   B.node("Div", { sp, B.const_f({ beta }, {}, dt) }, outs)
end
OPS["F.selu"] = function(B, _, a, outs)
   B.node("Selu", { B.name(a[1].id) }, outs, { alpha = { f = 1.6732632423543772848170429916717 },
      gamma = { f = 1.0507009873554804934193349852946 } })
end
-- celu(x, alpha[, inplace]) or (x, {alpha =}): Celu (opset 12+)
OPS["F.celu"] = function(B, _, a, outs)
   local al = a[2]
   if type(al) == "table" then al = al.alpha end
   B.node("Celu", { B.name(a[1].id) }, outs, { alpha = { f = al or 1 } })
end
OPS["F.celu_"] = OPS["F.celu"]
OPS["F.leaky_relu_"] = OPS["F.leaky_relu"]
OPS["F.mish"] = function(B, _, a, outs)
   local x = B.name(a[1].id)
   if B.opset >= 18 then return B.node("Mish", { x }, outs) end
   local sp, th = B.fresh("softplus"), B.fresh("tanh")
   B.node("Softplus", { x }, { sp })
   B.node("Tanh", { sp }, { th })
   B.node("Mul", { x, th }, outs)
end
-- the composed activations (lua/lumen/functional/activation_composed.lua)
OPS["F.logsigmoid"] = function(B, _, a, outs)       -- log(sigmoid(x)) = -softplus(-x)
   local nx, sp = B.fresh("neg"), B.fresh("softplus")
   B.node("Neg", { B.name(a[1].id) }, { nx })
   B.node("Softplus", { nx }, { sp })
   B.node("Neg", { sp }, outs)
end
OPS["F.softsign"] = function(B, _, a, outs) B.node("Softsign", { B.name(a[1].id) }, outs) end
OPS["F.tanhshrink"] = function(B, _, a, outs)
   local x, th = B.name(a[1].id), B.fresh("tanh")
   B.node("Tanh", { x }, { th })
   B.node("Sub", { x, th }, outs)
end
-- softshrink / hardshrink(x, lambd) or (x, {lambd =}): Shrink, whose bias is what is taken off
-- outside [-lambd, lambd] (lambd for softshrink, 0 for hardshrink)
local function shrink(soft)
   return function(B, _, a, outs)
      local l = a[2]
      if type(l) == "table" then l = l.lambd end
      l = l or 0.5
      B.node("Shrink", { B.name(a[1].id) }, outs,
             { lambd = { f = l }, bias = { f = soft and l or 0 } })
   end
end
OPS["F.softshrink"], OPS["F.hardshrink"] = shrink(true), shrink(false)
-- threshold(x, threshold, value) or (x, {threshold =, value =}): Where(x <= threshold, value, x)
OPS["F.threshold"] = function(B, _, a, outs, g)
   local th, v = a[2], a[3]
   if type(th) == "table" then th, v = th.threshold, th.value end
   local x, le = B.name(a[1].id), B.fresh("le")
   local dt = g.values[a[1].id].dtype
   B.node("LessOrEqual", { x, B.const_f({ th }, {}, dt) }, { le })
   B.node("Where", { le, B.const_f({ v }, {}, dt), x }, outs)
end
-- gelu: Gelu (opset 20 or later, approximate "none" or "tanh", as torch.onnx), below it its
-- formula (torch.onnx's decomposition)
OPS["F.gelu"] = function(B, _, a, outs)
   local ap = a[2]
   if type(ap) == "table" then ap = ap.approximate end
   local x = B.name(a[1].id)
   if B.opset >= 20 then
      return B.node("Gelu", { x }, outs, { approximate = ap == "tanh" and "tanh" or "none" })
   end
   local inner
   if ap == "tanh" then
      -- 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      local x3, t1, t2, t3 = B.fresh("cube"), B.fresh("g"), B.fresh("g"), B.fresh("g")
      B.node("Pow", { x, B.const_f({ 3 }, {}) }, { x3 })
      B.node("Mul", { x3, B.const_f({ 0.044715 }, {}) }, { t1 })
      B.node("Add", { x, t1 }, { t2 })
      B.node("Mul", { t2, B.const_f({ math.sqrt(2 / math.pi) }, {}) }, { t3 })
      inner = B.fresh("tanh")
      B.node("Tanh", { t3 }, { inner })
   else
      -- 0.5 x (1 + erf(x / sqrt(2)))
      local t1 = B.fresh("g")
      B.node("Mul", { x, B.const_f({ 1 / math.sqrt(2) }, {}) }, { t1 })
      inner = B.fresh("erf")
      B.node("Erf", { t1 }, { inner })
   end
   local p1, hx = B.fresh("g"), B.fresh("g")
   B.node("Add", { inner, B.const_f({ 1 }, {}) }, { p1 })
   B.node("Mul", { x, B.const_f({ 0.5 }, {}) }, { hx })
   B.node("Mul", { hx, p1 }, outs)
end
-- F.pad: Pad with mode "constant" (its value an input), "reflect" (PyTorch's reflect: the edge
-- not repeated), "edge" (replicate); circular: Pad "wrap" at opset 19 or later, below it (and
-- as torch.onnx writes it at every opset) each padded dim as Concat(Slice(the last l), x,
-- Slice(the first r)). lumen's pad list is PyTorch's: last dim first, (left, right) pairs.
local PAD_MODE = { constant = "constant", reflect = "reflect", replicate = "edge",
                   circular = "wrap" }
OPS["F.pad"] = function(B, _, a, outs, g)
   local o, value = a[3], a[4]
   local mode = o
   if type(o) == "table" then mode, value = o.mode, o.value end
   mode = mode or "constant"
   if not PAD_MODE[mode] then fail("F.pad with mode '" .. tostring(mode) .. "'", 0) end
   local pad = a[2]
   local xs = value_sizes(g, a[1].id)
   local nd = #xs
   local x = B.name(a[1].id)
   if mode == "circular" and B.opset < 19 then
      local cur = x
      local sizes = {}
      for i = 1, nd do sizes[i] = xs[i] end
      local steps = {}
      for k = 1, #pad / 2 do
         local l, r = pad[2 * k - 1], pad[2 * k]
         if l ~= 0 or r ~= 0 then steps[#steps + 1] = { nd - k, l, r } end
      end
      if #steps == 0 then return B.node("Identity", { x }, outs) end
      for j, st in ipairs(steps) do
         local d, l, r = st[1], st[2], st[3]         -- d: 0-based axis
         local sz = sizes[d + 1]
         local parts = {}
         if l > 0 then
            parts[#parts + 1] = B.fresh("wrap")
            B.node("Slice", { cur, B.const_i64({ sz - l }), B.const_i64({ sz }),
                              B.const_i64({ d }) }, { parts[#parts] })
         end
         parts[#parts + 1] = cur
         if r > 0 then
            parts[#parts + 1] = B.fresh("wrap")
            B.node("Slice", { cur, B.const_i64({ 0 }), B.const_i64({ r }), B.const_i64({ d }) },
                   { parts[#parts] })
         end
         local nxt = j == #steps and outs[1] or B.fresh("wrap")
         B.node("Concat", parts, { nxt }, { axis = d })
         sizes[d + 1] = sz + l + r
         cur = nxt
      end
      return
   end
   local pads = {}
   for i = 1, 2 * nd do pads[i] = 0 end
   for k = 1, #pad / 2 do
      local d = nd - k + 1        -- 1-based dim
      pads[d], pads[d + nd] = pad[2 * k - 1], pad[2 * k]
   end
   local ins = { x, B.const_i64(pads) }
   if mode == "constant" then
      ins[3] = B.const_f({ value or 0 }, {}, g.values[a[1].id].dtype)
   end
   B.node("Pad", ins, outs, { mode = PAD_MODE[mode] })
end
-- end of issue 40 (wt-act) -------------------------------------------------------------------

-- MaxPool / AveragePool of 2 or 3 spatial dims
local function pool_op(nd, avg)
   local tuple = nd == 3 and triple or pair
   local name = (avg and "avg_pool" or "max_pool") .. nd .. "d"
   return function(B, _, a, outs)
      local o = a[2] or {}
      if type(o) == "number" then o = { kernel_size = o } end
      if o.return_indices then fail(name .. " with return_indices is not exported", 0) end
      if o.divisor_override ~= nil then
         fail(name .. " with divisor_override is not exported", 0)
      end
      local k = tuple(o.kernel_size)
      local st, pad = tuple(o.stride, nil), tuple(o.padding, 0)
      if st[1] == nil then st = k end
      local pads = {}
      for i = 1, nd do pads[i], pads[i + nd] = pad[i], pad[i] end
      local attrs = { kernel_shape = k, strides = st, pads = pads,
                      ceil_mode = o.ceil_mode and 1 or 0 }
      if avg then
         attrs.count_include_pad = (o.count_include_pad == false) and 0 or 1
      else
         attrs.dilations = tuple(o.dilation, 1)
      end
      B.node(avg and "AveragePool" or "MaxPool", { B.name(a[1].id) }, outs, attrs)
   end
end
OPS["F.max_pool2d"] = pool_op(2, false)
OPS["F.avg_pool2d"] = pool_op(2, true)
OPS["F.max_pool3d"] = pool_op(3, false)
OPS["F.avg_pool3d"] = pool_op(3, true)

-- adaptive_avg_pool3d: GlobalAveragePool (1x1x1) or an AveragePool when the sizes divide
OPS["F.adaptive_avg_pool3d"] = function(B, node, a, outs, g)
   local xs = value_sizes(g, a[1].id)
   local ys = value_sizes(g, node.outs.v)
   local k = {}
   for i = 1, 3 do
      if xs[i + 2] % ys[i + 2] ~= 0 then
         fail("adaptive_avg_pool3d to sizes that do not divide the input is not exported", 0)
      end
      k[i] = xs[i + 2] / ys[i + 2]
   end
   if ys[3] == 1 and ys[4] == 1 and ys[5] == 1 then
      B.node("GlobalAveragePool", { B.name(a[1].id) }, outs)
   else
      B.node("AveragePool", { B.name(a[1].id) }, outs, { kernel_shape = k, strides = k })
   end
end

OPS["F.adaptive_avg_pool2d"] = function(B, node, a, outs, g)
   local x = B.name(a[1].id)
   local xs = value_sizes(g, a[1].id)
   local ys = value_sizes(g, node.outs.v)
   local H, W, oh, ow = xs[3], xs[4], ys[3], ys[4]
   if oh == 1 and ow == 1 then
      B.node("GlobalAveragePool", { x }, outs)
   elseif H % oh == 0 and W % ow == 0 then
      local kh, kw = H / oh, W / ow
      B.node("AveragePool", { x }, outs, { kernel_shape = { kh, kw }, strides = { kh, kw } })
   else
      -- y = Ph x Pw^T: the regions of an adaptive pool are products of row and column ranges
      local dt = g.values[a[1].id].dtype
      local ph = adaptive_matrix(H, oh)
      local pw = adaptive_matrix(W, ow)
      local pwt = {}
      for j = 1, W do
         pwt[j] = {}
         for i = 1, ow do pwt[j][i] = pw[i][j] end
      end
      local mid = B.fresh("pool_rows")
      B.node("MatMul", { B.const_f(ph, nil, dt), x }, { mid })
      B.node("MatMul", { mid, B.const_f(pwt, nil, dt) }, outs)
   end
end

-- F.linear(x, w, b[, {act =}]): Gemm or MatMul + Add, then the activation's nodes (as a
-- convolution's epilogue)
OPS["F.linear"] = function(B, _, a, outs, g)
   local x = a[1].id
   local nd = #value_sizes(g, x)
   local o = a[4]
   local fused = o ~= nil and o.act ~= nil and o.act ~= "none"
   local res = fused and { B.fresh("linear") } or outs
   if nd == 2 then
      local ins = { B.name(x), B.name(a[2].id) }
      if a[3] ~= nil then ins[3] = B.name(a[3].id) end
      B.node("Gemm", ins, res, { transB = 1 })
   else
      local wt = B.fresh("wt")
      B.node("Transpose", { B.name(a[2].id) }, { wt }, { perm = { 1, 0 } })
      local y = a[3] ~= nil and B.fresh("mm") or res[1]
      B.node("MatMul", { B.name(x), wt }, { y })
      if a[3] ~= nil then B.node("Add", { y, B.name(a[3].id) }, res) end
   end
   if fused then relu_chain(B, res[1], { act = o.act }, outs) end
end

-- a Reshape to the traced sizes; with a dynamic batch (dynamic_axes on dim 1) a first size
-- equal to the traced batch that the input also has becomes 0 (ONNX: copy the input's dim)
local function reshape_to(B, x, sizes, outs, in_sizes)
   if B.dyn_batch and in_sizes and sizes[1] == B.dyn_batch and in_sizes[1] == B.dyn_batch then
      local s = { 0 }
      for i = 2, #sizes do s[i] = sizes[i] end
      sizes = s
   end
   B.node("Reshape", { x, B.const_i64(sizes) }, outs)
end

-- issue 40 (wt-act): the shuffles: x reshaped to v, transposed by perm (0-based), reshaped to
-- the result's sizes
local function shuffle_op(plan)
   return function(B, node, a, outs, g)
      local s = value_sizes(g, a[1].id)
      local v, perm = plan(s, a[2])
      local r1, t = B.fresh("shuffle"), B.fresh("shuffle")
      reshape_to(B, B.name(a[1].id), v, { r1 }, s)
      B.node("Transpose", { r1 }, { t }, { perm = perm })
      reshape_to(B, t, value_sizes(g, node.outs.v), outs, s)
   end
end
local pixel_shuffle_nd = shuffle_op(function(s, r)
   local n = #s
   local v, perm = {}, {}
   for i = 1, n - 3 do v[i] = s[i]; perm[i] = i - 1 end
   local b = n - 3
   v[b + 1], v[b + 2], v[b + 3], v[b + 4], v[b + 5] = s[n - 2] / (r * r), r, r, s[n - 1], s[n]
   perm[b + 1], perm[b + 2], perm[b + 3], perm[b + 4], perm[b + 5] = b, b + 3, b + 1, b + 4, b + 2
   return v, perm
end)
-- pixel_shuffle of a 4-D input: DepthToSpace with mode "CRD" (channel c * r * r + i * r + j to
-- pixel (i, j) of channel c), as torch.onnx; other ranks: the Reshape / Transpose / Reshape.
-- pixel_unshuffle has no such node: SpaceToDepth orders its channels (i * r + j) * C + c, the
-- inverse of DepthToSpace's "DCR", not PyTorch's c * r * r + i * r + j
OPS["F.pixel_shuffle"] = function(B, node, a, outs, g)
   if #value_sizes(g, a[1].id) ~= 4 then return pixel_shuffle_nd(B, node, a, outs, g) end
   B.node("DepthToSpace", { B.name(a[1].id) }, outs, { blocksize = a[2], mode = "CRD" })
end
OPS["F.pixel_unshuffle"] = shuffle_op(function(s, r)
   local n = #s
   local v, perm = {}, {}
   for i = 1, n - 3 do v[i] = s[i]; perm[i] = i - 1 end
   local b = n - 3
   v[b + 1], v[b + 2], v[b + 3], v[b + 4], v[b + 5] = s[n - 2], s[n - 1] / r, r, s[n] / r, r
   perm[b + 1], perm[b + 2], perm[b + 3], perm[b + 4], perm[b + 5] = b, b + 2, b + 4, b + 1, b + 3
   return v, perm
end)
OPS["F.channel_shuffle"] = shuffle_op(function(s, gr)
   local v, perm = { s[1], gr, s[2] / gr }, { 0, 2, 1 }
   for i = 3, #s do v[i + 1] = s[i]; perm[i + 1] = i end
   return v, perm
end)
-- end of issue 40 (wt-act)

OPS["F.flatten"] = function(B, node, a, outs, g)
   local nd = #value_sizes(g, a[1].id)
   local s = a[2] or 1
   local e = a[3] or -1
   if s < 0 then s = s + nd + 1 end
   if e < 0 then e = e + nd + 1 end
   if e == nd and s >= 2 and s == 2 then
      B.node("Flatten", { B.name(a[1].id) }, outs, { axis = 1 })
   else
      reshape_to(B, B.name(a[1].id), value_sizes(g, node.outs.v), outs,
                 value_sizes(g, a[1].id))
   end
end
for _, op in ipairs({ "Tensor.view", "Tensor.reshape", "lm.view", "lm.reshape" }) do
   OPS[op] = function(B, node, a, outs, g)
      reshape_to(B, B.name(a[1].id), value_sizes(g, node.outs.v), outs,
                 value_sizes(g, a[1].id))
   end
end

-- narrow(x, d, start, length) (1-based d and start, negative from the end; ShuffleNet V2's
-- channel split): Slice over axis d - 1
local function narrow(B, node, a, outs, g)
   local sizes = value_sizes(g, a[1].id)
   local d, start, len = a[2], a[3], a[4]
   if type(d) ~= "number" or type(start) ~= "number" or type(len) ~= "number" then
      fail(node.op .. " with a tensor dim, start or length is not exported", 0)
   end
   if d < 0 then d = d + #sizes + 1 end
   local s0 = start >= 1 and start - 1 or sizes[d] + start
   B.node("Slice", { B.name(a[1].id), B.const_i64({ s0 }), B.const_i64({ s0 + len }),
      B.const_i64({ d - 1 }) }, outs)
end
OPS["Tensor.narrow"] = narrow
OPS["lm.narrow"] = narrow

-- mean(x, dims, keepdim) (dims 1-based, a number or a list; nil: all): ReduceMean, its axes an
-- attribute up to opset 17 and an input from 18 (ShuffleNet V2's global pool, x:mean({3, 4}))
local function mean(B, node, a, outs, g)
   local nd = #value_sizes(g, a[1].id)
   local dims, keep = a[2], a[3]
   if a[4] ~= nil then fail(node.op .. " with a dtype argument is not exported", 0) end
   if type(dims) == "number" then dims = { dims } end
   local axes = {}
   if dims == nil then
      for i = 1, nd do axes[i] = i - 1 end
   elseif type(dims) == "table" and getmetatable(dims) == nil then
      for i, d in ipairs(dims) do
         if type(d) ~= "number" then fail(node.op .. " with a non-number dim", 0) end
         axes[i] = (d < 0 and d + nd + 1 or d) - 1
      end
   else
      fail(node.op .. " with dims that are not numbers", 0)
   end
   local kd = keep and 1 or 0
   if B.opset < 18 then
      B.node("ReduceMean", { B.name(a[1].id) }, outs, { axes = axes, keepdims = kd })
   else
      B.node("ReduceMean", { B.name(a[1].id), B.const_i64(axes) }, outs, { keepdims = kd })
   end
end
OPS["Tensor.mean"] = mean
OPS["lm.mean"] = mean

-- a binary elementwise op: tensor or number operands
local function binary(onnx)
   return function(B, node, a, outs, g)
      local dt = g.values[node.outs.v].dtype
      local ins = {}
      for i = 1, 2 do
         local x = a[i]
         if type(x) == "number" then
            ins[i] = B.const_f({ x }, {}, dt)
         elseif type(x) == "table" and getmetatable(x) == G.REF then
            ins[i] = B.name(x.id)
         else
            fail("an operand of " .. node.op .. " is not a tensor or a number", 0)
         end
      end
      if (node.nargs or 2) > 2 and a[3] ~= nil then
         fail(node.op .. " with a third argument (alpha) is not exported", 0)
      end
      B.node(onnx, ins, outs)
   end
end
for name, onnx in pairs({ add = "Add", sub = "Sub", mul = "Mul", div = "Div" }) do
   OPS["Tensor." .. name] = binary(onnx)
   OPS["lm." .. name] = binary(onnx)
   OPS["Tensor." .. name .. "_"] = binary(onnx)
end

local function concat(B, _, a, outs, g)
   local list = a[1]
   if type(list) ~= "table" or getmetatable(list) == G.REF then fail("cat of a non-list", 0) end
   local ins = {}
   local nd
   for i, r in ipairs(list) do
      ins[i] = B.name(r.id)
      nd = nd or #value_sizes(g, r.id)
   end
   local d = a[2] or 1
   if d < 0 then d = d + nd + 1 end
   B.node("Concat", ins, outs, { axis = d - 1 })
end
OPS["lm.cat"] = concat
OPS["Tensor.cat"] = concat
OPS["F.cat"] = concat

-- the indexing operators (lua/lumen/autograd/indexing.lua). lumen's indices are 1-based, ONNX's
-- 0-based: an index input is exported minus 1 (a Sub node). sort, argsort and topk are not
-- exported (ONNX's TopK is not a stable sort: ties could come out in another order).
local function tensor_ref(node, x, what)
   if type(x) ~= "table" or getmetatable(x) ~= G.REF then
      fail(node.op .. ": " .. what .. " is not a tensor", 0)
   end
   return x
end
local function export_dim(node, d, nd)
   if type(d) ~= "number" then fail(node.op .. " with a dim that is not a number", 0) end
   if d < 0 then d = d + math.max(nd, 1) + 1 end
   return d - 1
end
local function zero_based(B, node, ref)
   local dt = B.fresh("index0")
   tensor_ref(node, ref, "the index")
   B.node("Sub", { B.name(ref.id), B.const_i64({ 1 }) }, { dt })
   return dt
end
local FLOAT_DT = { float32 = true, float64 = true, float16 = true, bfloat16 = true }

-- cumsum(x, dim): CumSum with a 0-D axis (floating x, no dtype argument)
local function cumsum(B, node, a, outs, g)
   local x = tensor_ref(node, a[1], "the input")
   if a[3] ~= nil then fail(node.op .. " with a dtype argument is not exported", 0) end
   if not FLOAT_DT[g.values[x.id].dtype] then
      fail(node.op .. " of an integer tensor is not exported (lumen sums it into int64)", 0)
   end
   local axis = B.init(B.fresh("axis"), require("lumen").tensor(
      export_dim(node, a[2], #value_sizes(g, x.id)), { dtype = "int64" }))
   B.node("CumSum", { B.name(x.id), axis }, outs)
end
OPS["Tensor.cumsum"] = cumsum
OPS["lm.cumsum"] = cumsum

-- flip(x, dims): Slice with step -1 along each dim
local function flip(B, node, a, outs, g)
   local x = tensor_ref(node, a[1], "the input")
   local nd = #value_sizes(g, x.id)
   local dims = type(a[2]) == "number" and { a[2] } or a[2]
   if type(dims) ~= "table" or getmetatable(dims) == G.REF then
      fail(node.op .. " with dims that are not numbers", 0)
   end
   if #dims == 0 or nd == 0 then return B.node("Identity", { B.name(x.id) }, outs) end
   local starts, ends, axes, steps = {}, {}, {}, {}
   for i, d in ipairs(dims) do
      starts[i], ends[i], axes[i], steps[i] = -1, -9223372036854775808, export_dim(node, d, nd), -1
   end
   B.node("Slice", { B.name(x.id), B.const_i64(starts), B.const_i64(ends), B.const_i64(axes),
      B.const_i64(steps) }, outs)
end
OPS["Tensor.flip"] = flip
OPS["lm.flip"] = flip

-- gather(x, dim, index): GatherElements
local function gather(B, node, a, outs, g)
   local x = tensor_ref(node, a[1], "the input")
   local axis = export_dim(node, a[2], #value_sizes(g, x.id))
   B.node("GatherElements", { B.name(x.id), zero_based(B, node, a[3]) }, outs, { axis = axis })
end
OPS["Tensor.gather"] = gather
OPS["lm.gather"] = gather

-- index_select(x, dim, index): Gather of a 1-D index
local function index_select(B, node, a, outs, g)
   local x = tensor_ref(node, a[1], "the input")
   local idx = tensor_ref(node, a[3], "the index")
   if #value_sizes(g, idx.id) ~= 1 then fail(node.op .. " with a 0-D index is not exported", 0) end
   local axis = export_dim(node, a[2], #value_sizes(g, x.id))
   B.node("Gather", { B.name(x.id), zero_based(B, node, idx) }, outs, { axis = axis })
end
-- embedding(input, weight, ...): Gather of weight's rows (axis 0) at the 0-based input
OPS["F.embedding"] = function(B, node, a, outs)
   local w = tensor_ref(node, a[2], "the weight")
   B.node("Gather", { B.name(w.id), zero_based(B, node, a[1]) }, outs, { axis = 0 })
end
OPS["Tensor.index_select"] = index_select
OPS["lm.index_select"] = index_select

-- scatter_add(x, dim, index, src): ScatterElements with reduction "add" (opset 16 on), src of
-- the index's sizes (ONNX's updates have the indices' shape)
local function scatter_add(B, node, a, outs, g)
   if B.opset < 16 then fail(node.op .. " needs opset 16 or later (ScatterElements add)", 0) end
   local x = tensor_ref(node, a[1], "the input")
   local idx = tensor_ref(node, a[3], "the index")
   local src = tensor_ref(node, a[4], "src")
   local si, ss = value_sizes(g, idx.id), value_sizes(g, src.id)
   for i = 1, math.max(#si, #ss) do
      if si[i] ~= ss[i] then
         fail(node.op .. " with src larger than the index is not exported", 0)
      end
   end
   local axis = export_dim(node, a[2], #value_sizes(g, x.id))
   B.node("ScatterElements", { B.name(x.id), zero_based(B, node, idx), B.name(src.id) }, outs,
      { axis = axis, reduction = "add" })
end
OPS["Tensor.scatter_add"] = scatter_add
OPS["lm.scatter_add"] = scatter_add

OPS["F.softmax"] = function(B, _, a, outs, g)
   local nd = #value_sizes(g, a[1].id)
   local d = a[2] or -1
   if d < 0 then d = d + nd + 1 end
   B.node("Softmax", { B.name(a[1].id) }, outs, { axis = d - 1 })
end

-- a decoded argument with its tables of references unwrapped (graph.decode keeps a table that
-- holds a tensor as {__dyn = true, t = {...}}); the references stay
local function unwrap(x)
   if type(x) ~= "table" or getmetatable(x) == G.REF then return x end
   if x.__dyn then
      local o = {}
      for k, v in pairs(x.t) do o[k] = unwrap(v) end
      return o
   end
   return x
end

-- operators that pass their input on (the value is the same in ONNX's logical view)
local PASS = { ["F.dropout"] = true, ["F.dropout1d"] = true, ["F.dropout2d"] = true,
               ["F.dropout3d"] = true,
               ["Tensor.contiguous"] = true, ["lm.contiguous"] = true,
               ["Tensor.clone"] = true, ["lm.clone"] = true, ["Tensor.to"] = true,
               ["Tensor.detach"] = true }

-- lm.F functions with no ONNX form (export refuses a graph that uses one, with this reason).
-- spec/op_registry_spec.lua requires every lm.F function to be in OPS, in PASS or here: a new
-- F.<name> gets an exporter in OPS (or PASS), or a line here saying why it has none.
local NO_ONNX = {
   ["F.conv1d"] = "not written yet: Conv with one spatial dim",
   ["F.max_pool1d"] = "not written yet: MaxPool with one spatial dim",
   ["F.avg_pool1d"] = "not written yet: AveragePool with one spatial dim",
   ["F.adaptive_avg_pool1d"] = "not written yet",
   ["F.adaptive_max_pool1d"] = "ONNX has no adaptive max pooling",
   ["F.adaptive_max_pool2d"] = "ONNX has no adaptive max pooling",
   ["F.adaptive_max_pool3d"] = "ONNX has no adaptive max pooling",
   ["F.log_softmax"] = "not written yet: LogSoftmax",
   ["F.nll_loss"] = "a loss: export the model, not its training objective",
   ["F.cross_entropy"] = "a loss: export the model, not its training objective",
   ["F.mse_loss"] = "a loss: export the model, not its training objective",
   ["F.l1_loss"] = "a loss: export the model, not its training objective",
   ["F.smooth_l1_loss"] = "a loss: export the model, not its training objective",
   ["F.huber_loss"] = "a loss: export the model, not its training objective",
   ["F.binary_cross_entropy"] = "a loss: export the model, not its training objective",
   ["F.binary_cross_entropy_with_logits"] = "a loss: export the model, not its training objective",
   ["F.kl_div"] = "a loss: export the model, not its training objective",
   ["F.glu"] = "not written yet: Split, Sigmoid and Mul",
   ["F.prelu"] = "not written yet: PRelu with the slope reshaped to the channels",
   ["F.softmin"] = "not written yet: Neg and Softmax",
   ["F.normalize"] = "not written yet: LpNormalization",
   ["F.cosine_similarity"] = "not written yet",
   ["F.pairwise_distance"] = "not written yet",
   ["F.one_hot"] = "not written yet: OneHot (with lumen's 1-based classes)",
}

-- dynamic_axes = {input = {[1] = "batch"}, output = {[1] = "batch"}} (PyTorch's option, with
-- 1-based dims) -> {input = {{dim0, name}, ...}, ...} checked; also PyTorch's list form
-- {input = {1}} (names made up as PyTorch does: "input_dynamic_axes_1")
local function parse_dynamic_axes(da)
   if type(da) ~= "table" or getmetatable(da) ~= nil then
      fail("dynamic_axes must be a table {input = {[1] = \"batch\"}, output = {[1] = " ..
           "\"batch\"}}, got " .. T.typename(da))
   end
   local r = {}
   for io_name, axes in pairs(da) do
      if type(io_name) ~= "string" then
         fail("dynamic_axes: keys are input and output names (\"input\", \"output\", " ..
              "\"input.2\"), got " .. T.typename(io_name))
      end
      if type(axes) ~= "table" or getmetatable(axes) ~= nil then
         fail(("dynamic_axes.%s must be a table {[dim] = \"name\"} (dims 1-based), got %s")
              :format(io_name, T.typename(axes)))
      end
      local list = {}
      local is_list = #axes > 0 and type(axes[1]) == "number" and
         (type(axes[#axes]) == "number")
      if is_list then
         for i, d in ipairs(axes) do
            list[i] = { d, io_name .. "_dynamic_axes_" .. i }
         end
      else
         for d, nm in pairs(axes) do list[#list + 1] = { d, nm } end
      end
      for _, e in ipairs(list) do
         local d, nm = e[1], e[2]
         if type(d) ~= "number" or d % 1 ~= 0 or d < 1 then
            fail(("dynamic_axes.%s: dims are 1-based integers, got %s"):format(io_name,
                 tostring(d)))
         end
         if type(nm) ~= "string" or nm == "" then
            fail(("dynamic_axes.%s[%d] must be a name (a non-empty string), got %s")
                 :format(io_name, d, T.typename(nm)))
         end
      end
      table.sort(list, function(x, y) return x[1] < y[1] end)
      r[io_name] = list
   end
   return r
end

--- lm.onnx.export(model, input, path, {opset = 17, dynamic_axes = {input = {[1] = "batch"},
--- output = {[1] = "batch"}}}) -> path
--- model: an nn.Module (traced here with input), or a traced module (lm.jit.trace / load /
--- freeze). The ONNX graph's inputs are named "input" (or "input.1", ...), its outputs
--- "output" (or "output.1", ...), its weights by their state_dict names. dynamic_axes (PyTorch's
--- option, dims 1-based) makes those dims symbolic (dim_param) in the graph's inputs and
--- outputs; a dynamic batch (dim 1 of the inputs) also keeps the batch out of the graph's
--- Reshape constants, so ONNX Runtime runs the model at any batch size.
function M.export(model, input, path, opts)
   if type(path) ~= "string" or path == "" then
      fail("path must be a non-empty string, got " .. T.typename(path))
   end
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail("options must be a table {opset =, dynamic_axes =}, got " .. T.typename(opts))
   end
   for k in pairs(opts or {}) do
      if k ~= "opset" and k ~= "dynamic_axes" then
         fail("unknown option '" .. tostring(k) .. "'")
      end
   end
   local dyn = opts and opts.dynamic_axes ~= nil and parse_dynamic_axes(opts.dynamic_axes) or {}
   local opset = opts and opts.opset or M.DEFAULT_OPSET
   if type(opset) ~= "number" or opset % 1 ~= 0 or opset < M.MIN_OPSET or opset > M.MAX_OPSET then
      fail(("opset must be an integer from %d to %d, got %s"):format(M.MIN_OPSET, M.MAX_OPSET,
           tostring(opset)))
   end
   local jit = require("lumen.jit")
   -- lm.ops.StochasticDepth is not an lm.F function: the trace would keep the random mask of
   -- its one call as a constant, so a module in training mode is refused (as dropout is below)
   if not jit.is_traced(model) and type(model) == "table" and type(model.modules) == "function"
   then
      for _, mod in ipairs(model:modules()) do
         if getmetatable(mod) == require("lumen.ops").StochasticDepth and mod.training and
            mod.p ~= 0 then
            fail("a StochasticDepth in training mode (call model:eval() first)")
         end
      end
   end
   local traced = jit.is_traced(model) and model or jit.trace(model, input)
   local g = traced.graph
   -- every operator must be one ONNX can express: checked before anything is written
   for i, node in ipairs(g.nodes) do
      if not OPS[node.op] and not PASS[node.op] then
         fail(("node %d: operator %s has no ONNX export%s"):format(i, node.op,
            NO_ONNX[node.op] and " (" .. NO_ONNX[node.op] .. ")" or ""))
      end
      if node.op == "Tensor.to" then
         for j = 2, node.nargs or #node.args do
            local e = node.args[j]
            if not (type(e) == "table" and e.format) then
               fail(("node %d: Tensor.to with other than a memory format is not exported")
                    :format(i))
            end
         end
      end
      if node.op == "F.dropout" or node.op == "F.dropout2d" or node.op == "F.dropout3d" then
         local p, tr = node.args[2], node.args[3]
         if tr == nil and type(p) == "table" and (p.training ~= nil or p.p ~= nil) then
            p, tr = p.p, p.training
         end
         if (tr == nil or tr == true or (type(tr) == "table" and tr["nil"])) and p ~= 0 then
            fail(("node %d: a dropout in training mode (call model:eval() first)"):format(i))
         end
      end
   end
   local L = shim()
   local m = L.lm_onnx_new("lumen", "lumen", require("lumen")._VERSION, opset, ir_version(opset))
   if m == nil then fail(ffi.string(L.lm_onnx_error())) end
   m = ffi.gc(m, L.lm_onnx_free)
   local B = builder(L, m, g, traced.tensors)
   B.opset = opset
   local function io_name(base, i, n) return n == 1 and base or (base .. "." .. i) end
   -- the names the graph will have, to check dynamic_axes against
   local names_in, names_out = {}, {}
   for i = 1, #g.inputs do names_in[io_name("input", i, #g.inputs)] = g.inputs[i] end
   local out_ids0 = G.enc_ids(g.outputs, {})
   for i = 1, #out_ids0 do names_out[io_name("output", i, #out_ids0)] = out_ids0[i] end
   for nm, list in pairs(dyn) do
      local id = names_in[nm] or names_out[nm]
      if id == nil then
         local known = {}
         for k in pairs(names_in) do known[#known + 1] = k end
         for k in pairs(names_out) do known[#known + 1] = k end
         table.sort(known)
         fail(("dynamic_axes names '%s', which is not an input or output of the graph (%s)")
              :format(nm, table.concat(known, ", ")))
      end
      local nd = #g.values[id].sizes
      for _, e in ipairs(list) do
         if e[1] > nd then
            fail(("dynamic_axes.%s: dim %d, but %s has %d dims"):format(nm, e[1], nm, nd))
         end
         -- a dynamic first dim of an input: the batch, kept out of the Reshape constants
         if names_in[nm] and e[1] == 1 then B.dyn_batch = g.values[id].sizes[1] end
      end
   end
   local function add_io(is_out, name, id)
      local v = g.values[id]
      local et = ELEM[v.dtype]
      if not et then fail("a value of dtype " .. v.dtype .. " has no ONNX type") end
      local d = ffi.new("int64_t[?]", math.max(1, #v.sizes))
      for i, s in ipairs(v.sizes) do d[i - 1] = s end
      if L.lm_onnx_add_io(m, is_out and 1 or 0, name, et, #v.sizes, d) < 0 then
         fail(ffi.string(L.lm_onnx_error()))
      end
   end
   local function set_dyn(is_out, index, name)
      for _, e in ipairs(dyn[name] or {}) do
         if L.lm_onnx_set_dim_param(m, is_out and 1 or 0, index, e[1] - 1, e[2]) < 0 then
            fail(ffi.string(L.lm_onnx_error()))
         end
      end
   end
   for i, id in ipairs(g.inputs) do
      local name = io_name("input", i, #g.inputs)
      B.names[id] = name
      add_io(false, name, id)
      set_dyn(false, i - 1, name)
   end
   local ok, err = pcall(function()
      for k, node in ipairs(g.nodes) do
         local a = {}
         for j = 1, g.plan[k].n do a[j] = unwrap(g.plan[k].args[j]) end
         if PASS[node.op] then
            B.names[node.outs.v] = B.name(a[1].id)
         else
            local out = B.fresh("v")
            B.names[node.outs.v] = out
            OPS[node.op](B, node, a, { out }, g)
         end
      end
   end)
   if not ok then
      if type(err) == "string" and err:find("^lumen%.onnx%.export: ") then error(err, 0) end
      fail(tostring(err))
   end
   local out_ids = G.enc_ids(g.outputs, {})
   for i, id in ipairs(out_ids) do
      local name = io_name("output", i, #out_ids)
      B.node("Identity", { B.name(id) }, { name })
      add_io(true, name, id)
      set_dyn(true, i - 1, name)
   end
   if L.lm_onnx_save(m, path) < 0 then fail(ffi.string(L.lm_onnx_error())) end
   return path
end

-- the exporter tables, for specs (spec/op_registry_spec.lua): op name -> exporter, pass-through
-- ops, and the lm.F functions without an ONNX form (with the reason)
M._OPS, M._PASS, M._NO_ONNX = OPS, PASS, NO_ONNX

return M
