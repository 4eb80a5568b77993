-- lumen.layout_coverage -- lm.layout.coverage: run every operator on a contiguous input and on the
-- same values in its rank's channels-last layout, and report what comes out:
--
--    print(lm.layout.coverage())              -- three tables: 2-D, 3-D and 1-D operators
--    local row = lm.layout.coverage().by_op["max_pool3d 3/2"]
--    print(row.nchw, row.nhwc, row.preserves, row.native)
--
-- Three groups of operators, each with its own input:
--   2-D  N x C x H x W: contiguous (NCHW) and channels_last (NHWC)
--   3-D  N x C x D x H x W: contiguous (NCDHW) and channels_last_3d (NDHWC)
--   1-D  N x C x L: contiguous (NCL) and N x L x C strides (NLC: x:permute(1, 3, 2) of a contiguous
--        N x L x C tensor; PyTorch has no memory-format constant for it)
-- In the channels-last run every operand and weight of the group's rank is converted alike (as
-- lm.to_channels_last would; 1-D weights O x C x k get O x k x C strides). The row fields keep the
-- 2-D names for every group: nchw is the contiguous run, nhwc the channels-last one.
-- The classification helpers are lm.layout's (lua/lumen/layout.lua).

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local L = require("lumen.layout")

local type, pairs, ipairs, tostring, tonumber, error, pcall, rawget, getmetatable, setmetatable =
   type, pairs, ipairs, tostring, tonumber, error, pcall, rawget, getmetatable, setmetatable

local Tensor, raw = T.Tensor, T.raw
local classify, keeps_cl, is_nlc_dense, render = L._classify, L._keeps_cl, L._is_nlc_dense,
   L._render

local M = {}

local function fail(fname, msg, ...)
   error(string.format("lumen.%s: " .. msg, fname, ...), T.user_level())
end

local function cdata_of(x)
   if getmetatable(x) ~= T.mt then return nil end
   return T.cdata(x)
end

---------------------------------------------------------------------------------------------
-- the groups: input rank, default shape, names of the two layouts
---------------------------------------------------------------------------------------------

local GROUPS = {
   { name = "2-D", rank = 4, option = "shape", default = { 2, 32, 96, 96 }, plain = "NCHW",
     cl = "NHWC", keeps = "keeps CL",
     title = "2-D operators: N x C x H x W input, contiguous (NCHW) and channels_last (NHWC)" },
   { name = "3-D", rank = 5, option = "shape3d", default = { 2, 32, 8, 24, 24 }, plain = "NCDHW",
     cl = "NDHWC", keeps = "keeps CL3d",
     title = "3-D operators: N x C x D x H x W input, contiguous (NCDHW) and channels_last_3d " ..
        "(NDHWC)" },
   { name = "1-D", rank = 3, option = "shape1d", default = { 8, 32, 1024 }, plain = "NCL",
     cl = "NLC", keeps = "keeps NLC",
     title = "1-D operators: N x C x L input, contiguous (NCL) and N x L x C strides (NLC)" },
}
local GROUP_BY_NAME = {}
for _, g in ipairs(GROUPS) do GROUP_BY_NAME[g.name] = g end

local COVERAGE_OPTIONS = { shape = true, shape3d = true, shape1d = true, backward = true,
                           only = true }

-- a tensor in its group's channels-last layout
local function to_cl(t, rank)
   if rank == 4 then return raw.to(t, dtypes.channels_last) end
   if rank == 5 then return raw.to(t, dtypes.channels_last_3d) end
   -- 1-D: N x C x L with N x L x C strides (the last two dims swapped in memory), as
   -- x:permute(1, 3, 2) of a contiguous N x L x C tensor; a fresh copy, so that the size-1 dims
   -- of a 1 x C x 1 bias or an O x C x 1 weight get those strides too (contiguous() would hand
   -- back a view that is already contiguous, untagged)
   return raw.transpose(raw.clone(raw.transpose(t, 2, 3), dtypes.contiguous_format), 2, 3)
end

-- does a result of the group's rank keep the channels-last-like layout?
local function keeps(c, rank)
   if rank == 3 then return is_nlc_dense(c) end
   return keeps_cl(c)
end

---------------------------------------------------------------------------------------------
-- the operators
---------------------------------------------------------------------------------------------

-- Operators with sample-argument builders. Each run(x, s) gets the input x (contiguous or the
-- group's channels-last layout, positive values) and a context s with the operands and weights
-- made in the same layout as x (as after lm.to_channels_last), and returns the result.
-- grad = false: not differentiable. group: "2-D", "3-D" or "1-D".
local function operator_list(lm)
   local F = lm.F
   local ops = {}
   local group
   local function add(kind, op, run, extra)
      local e = { kind = kind, op = op, run = run, group = group }
      for k, v in pairs(extra or {}) do e[k] = v end
      ops[#ops + 1] = e
   end

   group = "2-D"
   -- elementwise, unary
   for _, name in ipairs({ "neg", "abs", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh",
      "square", "reciprocal", "sin", "cos", "log1p", "expm1" }) do
      add("unary", name, function(x) return x[name](x) end)
   end
   for _, name in ipairs({ "sign", "floor", "ceil", "round" }) do
      add("unary", name, function(x) return x[name](x) end, { grad = false })
   end
   add("unary", "logical_not", function(x) return x:logical_not() end, { grad = false })
   add("unary", "clamp", function(x) return x:clamp(0.2, 0.8) end)
   add("unary", "relu_ (in place)", function(x) return x:clone():relu_() end, { grad = false })
   -- elementwise, binary (both operands in the input's format)
   for _, name in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2" }) do
      add("binary", name, function(x, s) return x[name](x, s.y) end)
   end
   for _, name in ipairs({ "eq", "lt", "ge", "fmod", "logical_and" }) do
      add("binary", name, function(x, s) return x[name](x, s.y) end, { grad = false })
   end
   add("binary", "add (scalar)", function(x) return x + 2 end)
   add("binary", "add (bias 1xCx1x1)", function(x, s) return x + s.bias end)
   add("binary", "mul (gate NxCx1x1)", function(x, s) return x * s.gate end)
   add("binary", "add (x + NCHW y)", function(x, s) return x + s.y_plain end)
   add("binary", "add_ (in place)", function(x, s) return x:clone():add_(s.y) end, { grad = false })
   add("ternary", "addcmul", function(x, s) return x:addcmul(s.y, s.y, 0.5) end)
   add("ternary", "addcdiv", function(x, s) return x:addcdiv(s.y, s.y, 0.5) end)
   add("ternary", "where", function(x, s) return lm.where(s.mask, x, s.y) end)
   -- conversions and factories
   add("copy", "clone", function(x) return x:clone() end)
   add("copy", "contiguous", function(x) return x:contiguous() end)
   add("copy", "to(float64)", function(x) return x:to(lm.float64) end)
   add("copy", "to(float16)", function(x) return x:to(lm.float16) end, { grad = false })
   add("copy", "to(bfloat16)", function(x) return x:to(lm.bfloat16) end, { grad = false })
   add("copy", "to(int32)", function(x) return x:to(lm.int32) end, { grad = false })
   add("copy", "copy_ (into empty_like)", function(x) return lm.empty_like(x):copy_(x) end,
       { grad = false })
   for _, name in ipairs({ "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like" }) do
      add("factory", name, function(x) return lm[name](x) end, { grad = false })
   end
   add("factory", "full_like", function(x) return lm.full_like(x, 3) end, { grad = false })
   -- reductions
   add("reduction", "sum (all)", function(x) return x:sum() end)
   add("reduction", "sum(2, keepdim)", function(x) return x:sum(2, true) end)
   add("reduction", "sum({3,4}, keepdim)", function(x) return x:sum({ 3, 4 }, true) end)
   add("reduction", "sum(1, keepdim)", function(x) return x:sum(1, true) end)
   add("reduction", "mean({3,4}, keepdim)", function(x) return x:mean({ 3, 4 }, true) end)
   add("reduction", "mean(4, keepdim)", function(x) return x:mean(4, true) end)
   add("reduction", "amax(2, keepdim)", function(x) return x:amax(2, true) end)
   add("reduction", "max(2, keepdim)", function(x) return (x:max(2, true)) end)
   add("reduction", "argmax(2, keepdim)", function(x) return x:argmax(2, true) end,
       { grad = false })
   add("reduction", "prod(4, keepdim)", function(x) return x:prod(4, true) end, { grad = false })
   -- indexing (lua/lumen/autograd/indexing.lua); index tensors 1-based, made on x's device
   local function ones_index(x, sizes)
      return require("lumen.creation").ones(sizes, { dtype = "int64", device = Tensor.device(x) })
   end
   add("indexing", "sort(2)", function(x) return (x:sort(2)) end)
   add("indexing", "topk(2, 4)", function(x) return (x:topk(2, 4)) end)
   add("indexing", "cumsum(2)", function(x) return x:cumsum(2) end)
   add("indexing", "flip(4)", function(x) return x:flip(4) end)
   add("indexing", "gather(3, index)", function(x)
      return x:gather(3, ones_index(x, Tensor.size(x)))
   end)
   add("indexing", "index_select(2, {1, 1})", function(x)
      return x:index_select(2, ones_index(x, { 2 }))
   end)
   add("indexing", "scatter_add(2, index, x)", function(x)
      return x:scatter_add(2, ones_index(x, Tensor.size(x)), x)
   end)
   -- views and shape
   add("view", "view (same sizes)", function(x) return x:view(x:size()) end)
   add("view", "reshape (same sizes)", function(x) return x:reshape(x:size()) end)
   add("view", "reshape (N, C, H*W)", function(x)
      local s = x:size()
      return x:reshape({ s[1], s[2], s[3] * s[4] })
   end)
   add("view", "permute(1,3,4,2)", function(x) return x:permute(1, 3, 4, 2) end)
   add("view", "transpose(3,4)", function(x) return x:transpose(3, 4) end)
   add("view", "narrow(2, 1, C/2)", function(x) return x:narrow(2, 1, x:size(2) / 2) end)
   add("view", "narrow(3, 2, H-2)", function(x) return x:narrow(3, 2, x:size(3) - 2) end)
   add("view", "select(1, 1)", function(x) return x:select(1, 1) end)
   add("view", "unsqueeze(1)", function(x) return x:unsqueeze(1) end)
   add("view", "expand (gate NxCx1x1)", function(x, s) return s.gate:expand(x:size()) end,
       { grad = false })
   add("view", "flatten(2)", function(x) return x:flatten(2) end)
   add("join", "cat(dim 2, channels)", function(x, s) return lm.cat({ x, s.y }, 2) end)
   add("join", "cat(dim 1, batch)", function(x, s) return lm.cat({ x, s.y }, 1) end)
   add("join", "cat(x, NCHW y, dim 2)", function(x, s) return lm.cat({ x, s.y_plain }, 2) end)
   add("join", "stack(dim 1)", function(x, s) return lm.stack({ x, s.y }, 1) end)
   -- nn.functional
   add("conv", "conv2d 3x3", function(x, s) return F.conv2d(x, s.w3, s.b, { padding = 1 }) end)
   add("conv", "conv2d 1x1", function(x, s) return F.conv2d(x, s.w1, nil) end)
   add("conv", "conv2d 3x3 stride 2", function(x, s)
      return F.conv2d(x, s.w3, s.b, { padding = 1, stride = 2 })
   end)
   add("conv", "conv2d grouped (g=4)", function(x, s)
      return F.conv2d(x, s.wg, nil, { padding = 1, groups = 4 })
   end)
   add("conv", "conv2d depthwise", function(x, s)
      return F.conv2d(x, s.wd, nil, { padding = 1, groups = s.C })
   end)
   add("conv", "conv2d dilated", function(x, s)
      return F.conv2d(x, s.w3, nil, { padding = 2, dilation = 2 })
   end)
   add("pool", "max_pool2d 3/2", function(x)
      return F.max_pool2d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   add("pool", "avg_pool2d 2", function(x) return F.avg_pool2d(x, { kernel_size = 2 }) end)
   add("pool", "adaptive_avg_pool2d(1)", function(x) return F.adaptive_avg_pool2d(x, 1) end)
   add("pool", "adaptive_avg_pool2d(7)", function(x) return F.adaptive_avg_pool2d(x, 7) end)
   add("pool", "adaptive_max_pool2d(5)", function(x) return (F.adaptive_max_pool2d(x, 5)) end)
   add("norm", "batch_norm (train)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = true })
   end)
   add("norm", "batch_norm (eval)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = false })
   end)
   add("norm", "group_norm (2 groups)", function(x, s)
      return F.group_norm(x, 2, s.gamma, s.beta)
   end)
   add("norm", "instance_norm", function(x, s)
      return F.instance_norm(x, nil, nil, s.gamma, s.beta)
   end)
   add("norm", "layer_norm over C (NHWC view)", function(x, s)
      return F.layer_norm(x:permute(1, 3, 4, 2), s.C, s.gamma, s.beta):permute(1, 4, 2, 3)
   end)
   add("activation", "F.relu", function(x) return F.relu(x) end)
   add("activation", "F.dropout (train)", function(x) return F.dropout(x, 0.5, true) end)
   add("activation", "softmax(2)", function(x) return F.softmax(x, 2) end)
   add("activation", "log_softmax(2)", function(x) return F.log_softmax(x, 2) end)
   -- issue 40 (wt-act): the modern activations, pad, the shuffles, feature dropout
   for _, name in ipairs({ "silu", "gelu", "hardswish", "hardsigmoid", "relu6", "leaky_relu",
      "elu", "mish" }) do
      add("activation", "F." .. name, function(x) return F[name](x) end)
   end
   add("activation", "F.gelu (tanh)", function(x) return F.gelu(x, "tanh") end)
   add("activation", "F.silu (in place)", function(x) return F.silu(x:clone(), true) end,
       { grad = false })
   add("activation", "F.elu_ (in place)", function(x) return F.elu_(x:clone()) end,
       { grad = false })
   add("activation", "F.leaky_relu_ (in place)", function(x) return F.leaky_relu_(x:clone()) end,
       { grad = false })
   add("activation", "F.hardtanh", function(x) return F.hardtanh(x, 0.2, 0.8) end)
   add("activation", "F.hardtanh_ (in place)", function(x) return F.hardtanh_(x:clone()) end,
       { grad = false })
   add("activation", "F.softplus", function(x) return F.softplus(x, 2) end)
   add("activation", "F.selu", function(x) return F.selu(x) end)
   add("activation", "F.celu", function(x) return F.celu(x, 0.5) end)
   add("activation", "F.celu_ (in place)", function(x) return F.celu_(x:clone(), 0.5) end,
       { grad = false })
   -- the composed activations (functional/activation_composed.lua)
   for _, name in ipairs({ "logsigmoid", "softsign", "tanhshrink", "softshrink", "hardshrink" }) do
      add("activation", "F." .. name, function(x) return F[name](x) end)
   end
   add("activation", "F.threshold", function(x) return F.threshold(x, 0.1, -1) end)
   add("activation", "F.glu (dim 2)", function(x) return F.glu(x, 2) end)
   add("activation", "F.prelu (per channel)", function(x, s) return F.prelu(x, s.gamma) end)
   add("activation", "F.softmin(2)", function(x) return F.softmin(x, 2) end)
   add("activation", "F.normalize (dim 2)", function(x) return F.normalize(x) end)
   add("activation", "F.cosine_similarity (dim 2)", function(x, s)
      return F.cosine_similarity(x, s.y)
   end)
   add("activation", "F.pairwise_distance (last dim)", function(x, s)
      return F.pairwise_distance(x, s.y)
   end)
   add("activation", "F.dropout2d (train)", function(x) return F.dropout2d(x, 0.5, true) end)
   add("activation", "stochastic_depth (row)", function(x)
      return lm.ops.stochastic_depth(x, 0.5, "row", true)
   end)
   for _, mode in ipairs({ "constant", "reflect", "replicate", "circular" }) do
      add("pad", "F.pad " .. mode, function(x)
         return F.pad(x, { 1, 2, 2, 1 }, { mode = mode })
      end)
   end
   add("shuffle", "F.pixel_shuffle(2)", function(x) return F.pixel_shuffle(x, 2) end)
   add("shuffle", "F.pixel_unshuffle(2)", function(x) return F.pixel_unshuffle(x, 2) end)
   add("shuffle", "F.channel_shuffle(4)", function(x) return F.channel_shuffle(x, 4) end)
   -- issue 40 (wt-resample): interpolate and the transposed convolution
   for _, mode in ipairs({ "nearest", "nearest-exact", "bilinear", "bicubic" }) do
      add("resample", "interpolate " .. mode, function(x)
         return F.interpolate(x, { scale_factor = 1.5, mode = mode })
      end)
   end
   add("resample", "F.upsample_nearest", function(x) return F.upsample_nearest(x, nil, 2) end)
   add("resample", "F.upsample_bilinear", function(x) return F.upsample_bilinear(x, nil, 2) end)
   for _, mode in ipairs({ "bilinear", "bicubic" }) do
      add("resample", "interpolate " .. mode .. " antialias", function(x)
         return F.interpolate(x, { scale_factor = 0.5, mode = mode, antialias = true })
      end)
   end
   add("conv", "conv_transpose2d 3x3 stride 2", function(x, s)
      return F.conv_transpose2d(x, s.w3, s.b, { stride = 2, padding = 1, output_padding = 1 })
   end)
   add("linear", "linear (on W)", function(x, s) return F.linear(x, s.lw, s.lb) end)
   add("linear", "matmul (x @ W x W)", function(x, s) return x:matmul(s.mm) end)
   add("linear", "F.flatten(x, 2)", function(x) return F.flatten(x, 2) end)
   add("loss", "mse_loss (none)", function(x, s)
      return F.mse_loss(x, s.y, { reduction = "none" })
   end)
   for _, name in ipairs({ "l1_loss", "smooth_l1_loss", "huber_loss" }) do
      add("loss", name .. " (none)", function(x, s)
         return F[name](x, s.y, { reduction = "none" })
      end)
   end
   add("loss", "binary_cross_entropy (none)", function(x, s)
      return F.binary_cross_entropy(x:sigmoid(), s.y:sigmoid(), { reduction = "none" })
   end)
   add("loss", "binary_cross_entropy_with_logits (none)", function(x, s)
      return F.binary_cross_entropy_with_logits(x, s.y:sigmoid(), { reduction = "none" })
   end)
   add("loss", "kl_div (none)", function(x, s)
      return F.kl_div(F.log_softmax(x, 2), s.y:sigmoid(), { reduction = "none" })
   end)
   add("loss", "one_hot (N,H,W targets)", function(_, s) return F.one_hot(s.target) end,
       { grad = false })
   add("loss", "embedding (N,H,W indices)", function(x, s)
      return F.embedding(s.target, x:reshape(-1, x:size(4)))
   end)
   add("loss", "cross_entropy (N,C,H,W)", function(x, s) return F.cross_entropy(x, s.target) end)
   add("loss", "nll_loss (N,C,H,W)", function(x, s) return F.nll_loss(x, s.target) end)

   -- 3-D operators (video, volumes): N x C x D x H x W
   group = "3-D"
   add("unary", "relu (5-D)", function(x) return x:relu() end)
   add("binary", "add (5-D)", function(x, s) return x + s.y end)
   add("binary", "add (bias 1xCx1x1x1)", function(x, s) return x + s.bias end)
   add("binary", "mul (gate NxCx1x1x1)", function(x, s) return x * s.gate end)
   add("binary", "add (x + NCDHW y)", function(x, s) return x + s.y_plain end)
   add("copy", "clone (5-D)", function(x) return x:clone() end)
   add("copy", "contiguous (5-D)", function(x) return x:contiguous() end)
   add("factory", "empty_like (5-D)", function(x) return lm.empty_like(x) end, { grad = false })
   add("reduction", "mean({3,4,5}, keepdim) (5-D)", function(x)
      return x:mean({ 3, 4, 5 }, true)
   end)
   add("view", "narrow(3, 2, D-2) (5-D)", function(x) return x:narrow(3, 2, x:size(3) - 2) end)
   add("view", "select(3, 1) (5-D -> 4-D)", function(x) return x:select(3, 1) end)
   add("join", "cat(dim 2, channels) (5-D)", function(x, s) return lm.cat({ x, s.y }, 2) end)
   -- issue 40 (wt-act)
   add("unary", "F.silu (5-D)", function(x) return F.silu(x) end)
   add("unary", "F.hardswish (5-D)", function(x) return F.hardswish(x) end)
   add("activation", "F.dropout3d (train)", function(x) return F.dropout3d(x, 0.5, true) end)
   add("pad", "F.pad replicate (5-D)", function(x)
      return F.pad(x, { 1, 1, 2, 0, 1, 1 }, { mode = "replicate" })
   end)
   add("pad", "F.pad constant (5-D)", function(x) return F.pad(x, { 1, 1, 1, 1, 1, 1 }) end)
   for _, mode in ipairs({ "reflect", "circular" }) do
      add("pad", "F.pad " .. mode .. " (5-D)", function(x)
         return F.pad(x, { 1, 2, 2, 1, 1, 1 }, { mode = mode })
      end)
   end
   for _, name in ipairs({ "gelu", "hardsigmoid", "relu6", "leaky_relu", "elu", "mish" }) do
      add("unary", "F." .. name .. " (5-D)", function(x) return F[name](x) end)
   end
   add("activation", "stochastic_depth (row) (5-D)", function(x)
      return lm.ops.stochastic_depth(x, 0.5, "row", true)
   end)
   add("shuffle", "F.channel_shuffle(4) (5-D)", function(x) return F.channel_shuffle(x, 4) end)
   add("conv", "conv3d 3x3x3", function(x, s) return F.conv3d(x, s.w3, s.b, { padding = 1 }) end)
   add("conv", "conv3d 1x1x1", function(x, s) return F.conv3d(x, s.w1, nil) end)
   add("conv", "conv3d 1x1x1 stride 2", function(x, s)
      return F.conv3d(x, s.w1, nil, { stride = 2 })
   end)
   add("conv", "conv3d stem 3x7x7 s(1,2,2)", function(x, s)
      return F.conv3d(x, s.wstem, nil, { stride = { 1, 2, 2 }, padding = { 1, 3, 3 } })
   end)
   add("conv", "conv3d (2+1)-D 1x3x3", function(x, s)
      return F.conv3d(x, s.wsp, nil, { padding = { 0, 1, 1 } })
   end)
   add("conv", "conv3d (2+1)-D 3x1x1", function(x, s)
      return F.conv3d(x, s.wt, nil, { padding = { 1, 0, 0 } })
   end)
   add("conv", "conv3d grouped (g=4)", function(x, s)
      return F.conv3d(x, s.wg, nil, { padding = 1, groups = 4 })
   end)
   add("conv", "conv3d depthwise", function(x, s)
      return F.conv3d(x, s.wd, nil, { padding = 1, groups = s.C })
   end)
   add("conv", "conv3d dilated", function(x, s)
      return F.conv3d(x, s.w3, nil, { padding = 2, dilation = 2 })
   end)
   add("conv", "conv3d 3x3x3 (NCDHW weight)", function(x, s)
      return F.conv3d(x, s.w3_plain, s.b, { padding = 1 })
   end)
   add("pool", "max_pool3d 3/2", function(x)
      return F.max_pool3d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   add("pool", "max_pool3d 2 (indices)", function(x)
      local _, idx = F.max_pool3d(x, { kernel_size = 2, return_indices = true })
      return idx
   end, { grad = false })
   add("pool", "avg_pool3d 2", function(x) return F.avg_pool3d(x, { kernel_size = 2 }) end)
   add("pool", "avg_pool3d 3/2 pad 1", function(x)
      return F.avg_pool3d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   add("pool", "adaptive_avg_pool3d(1)", function(x) return F.adaptive_avg_pool3d(x, 1) end)
   add("pool", "adaptive_avg_pool3d(2,5,5)", function(x)
      return F.adaptive_avg_pool3d(x, { 2, 5, 5 })
   end)
   add("pool", "adaptive_max_pool3d(2,5,5)", function(x)
      return F.adaptive_max_pool3d(x, { 2, 5, 5 })
   end)
   add("norm", "batch_norm 5-D (train)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = true })
   end)
   add("norm", "batch_norm 5-D (eval)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = false })
   end)
   add("norm", "group_norm 5-D (2 groups)", function(x, s)
      return F.group_norm(x, 2, s.gamma, s.beta)
   end)
   add("norm", "instance_norm 5-D", function(x, s)
      return F.instance_norm(x, nil, nil, s.gamma, s.beta)
   end)
   add("resample", "upsample nearest (5-D, the deprecated spelling)", function(x)
      return F.upsample(x, nil, 2, "nearest")
   end)
   add("resample", "interpolate nearest (5-D)", function(x)
      return F.interpolate(x, { scale_factor = 2, mode = "nearest" })
   end)
   add("resample", "interpolate trilinear (5-D)", function(x)
      return F.interpolate(x, { scale_factor = 1.5, mode = "trilinear" })
   end)
   add("resample", "interpolate nearest-exact (5-D)", function(x)
      return F.interpolate(x, { scale_factor = 1.5, mode = "nearest-exact" })
   end)
   add("norm", "layer_norm over C (NDHWC view) (5-D)", function(x, s)
      return F.layer_norm(x:permute(1, 3, 4, 5, 2), s.C, s.gamma, s.beta):permute(1, 5, 2, 3, 4)
   end)
   add("conv", "conv_transpose3d 3x3x3 s2", function(x, s)
      return F.conv_transpose3d(x, s.w3, nil, { stride = 2, padding = 1 })
   end)
   add("activation", "softmax(2) (5-D)", function(x) return F.softmax(x, 2) end)
   add("activation", "F.dropout (train) (5-D)", function(x) return F.dropout(x, 0.5, true) end)
   add("linear", "F.flatten(x, 2) (5-D)", function(x) return F.flatten(x, 2) end)

   -- 1-D operators (audio, sequences): N x C x L
   group = "1-D"
   add("unary", "relu (3-D)", function(x) return x:relu() end)
   add("binary", "add (3-D)", function(x, s) return x + s.y end)
   add("binary", "add (bias 1xCx1)", function(x, s) return x + s.bias end)
   add("binary", "add (x + NCL y)", function(x, s) return x + s.y_plain end)
   add("copy", "clone (3-D)", function(x) return x:clone() end)
   add("copy", "contiguous (3-D)", function(x) return x:contiguous() end)
   add("conv", "conv1d 3", function(x, s) return F.conv1d(x, s.w3, s.b, { padding = 1 }) end)
   add("conv", "conv1d 1", function(x, s) return F.conv1d(x, s.w1, nil) end)
   add("conv", "conv_transpose1d 3 stride 2", function(x, s)
      return F.conv_transpose1d(x, s.w3, s.b, { padding = 1, stride = 2, output_padding = 1 })
   end)
   add("conv", "conv1d 3 stride 2", function(x, s)
      return F.conv1d(x, s.w3, s.b, { padding = 1, stride = 2 })
   end)
   add("conv", "conv1d grouped (g=4)", function(x, s)
      return F.conv1d(x, s.wg, nil, { padding = 1, groups = 4 })
   end)
   add("conv", "conv1d depthwise", function(x, s)
      return F.conv1d(x, s.wd, nil, { padding = 1, groups = s.C })
   end)
   add("conv", "conv1d 3 (NCL weight)", function(x, s)
      return F.conv1d(x, s.w3_plain, s.b, { padding = 1 })
   end)
   add("pool", "max_pool1d 3/2", function(x)
      return F.max_pool1d(x, { kernel_size = 3, stride = 2, padding = 1 })
   end)
   add("pool", "avg_pool1d 2", function(x) return F.avg_pool1d(x, { kernel_size = 2 }) end)
   add("pool", "adaptive_avg_pool1d(1)", function(x) return F.adaptive_avg_pool1d(x, 1) end)
   add("pool", "adaptive_avg_pool1d(7)", function(x) return F.adaptive_avg_pool1d(x, 7) end)
   add("pool", "adaptive_max_pool1d(5)", function(x) return (F.adaptive_max_pool1d(x, 5)) end)
   add("norm", "batch_norm 3-D (train)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = true })
   end)
   add("norm", "batch_norm 3-D (eval)", function(x, s)
      return F.batch_norm(x, s.rm, s.rv, s.gamma, s.beta, { training = false })
   end)
   add("activation", "softmax(2) (3-D)", function(x) return F.softmax(x, 2) end)
   add("activation", "F.dropout1d (train) (3-D)", function(x) return F.dropout1d(x, 0.5, true) end)
   -- issue 40's operators on N x C x L (InstanceNorm1d, 1-D pads and resampling)
   add("norm", "group_norm 3-D (2 groups)", function(x, s)
      return F.group_norm(x, 2, s.gamma, s.beta)
   end)
   add("norm", "instance_norm 3-D", function(x, s)
      return F.instance_norm(x, nil, nil, s.gamma, s.beta)
   end)
   add("norm", "layer_norm over C (NLC view) (3-D)", function(x, s)
      return F.layer_norm(x:permute(1, 3, 2), s.C, s.gamma, s.beta):permute(1, 3, 2)
   end)
   for _, mode in ipairs({ "constant", "reflect", "replicate", "circular" }) do
      add("pad", "F.pad " .. mode .. " (3-D)", function(x)
         return F.pad(x, { 1, 2 }, { mode = mode })
      end)
   end
   for _, mode in ipairs({ "nearest", "nearest-exact", "linear" }) do
      add("resample", "interpolate " .. mode .. " (3-D)", function(x)
         return F.interpolate(x, { scale_factor = 1.5, mode = mode })
      end)
   end
   for _, name in ipairs({ "silu", "gelu", "hardswish", "relu6", "leaky_relu", "mish" }) do
      add("unary", "F." .. name .. " (3-D)", function(x) return F[name](x) end)
   end
   return ops
end

-- the operands and weights of a group, made once (the same values in both layouts); convert
-- lists the ones of the group's rank that the channels-last run converts
local function make_base(lm, g, shape)
   local N, Cc = shape[1], shape[2]
   local s = { C = Cc }
   s.x = lm.rand(shape) + 0.1
   s.y = lm.rand(shape) + 0.1
   s.rm, s.rv = lm.zeros({ Cc }), lm.ones({ Cc })
   s.gamma, s.beta = lm.ones({ Cc }), lm.zeros({ Cc })
   s.b = lm.randn({ Cc })
   local convert = { x = true, y = true, bias = true, gate = true, mask = true, w3 = true,
                     w1 = true, wg = true, wd = true }
   if g.rank == 4 then
      local H, W = shape[3], shape[4]
      s.bias = lm.rand({ 1, Cc, 1, 1 })
      s.gate = lm.rand({ N, Cc, 1, 1 })
      s.mask = lm.rand(shape):gt(0.5)
      s.w3 = lm.randn({ Cc, Cc, 3, 3 }) * 0.05
      s.w1 = lm.randn({ Cc, Cc, 1, 1 }) * 0.1
      s.wg = lm.randn({ Cc, Cc / 4, 3, 3 }) * 0.1
      s.wd = lm.randn({ Cc, 1, 3, 3 }) * 0.1
      s.lw, s.lb = lm.randn({ 16, W }) * 0.1, lm.zeros({ 16 })
      s.mm = lm.randn({ W, W }) * 0.1
      s.target = lm.randint(1, Cc + 1, { N, H, W })
   elseif g.rank == 5 then
      s.bias = lm.rand({ 1, Cc, 1, 1, 1 })
      s.gate = lm.rand({ N, Cc, 1, 1, 1 })
      s.w3 = lm.randn({ Cc, Cc, 3, 3, 3 }) * 0.03
      s.w1 = lm.randn({ Cc, Cc, 1, 1, 1 }) * 0.1
      s.wstem = lm.randn({ Cc, Cc, 3, 7, 7 }) * 0.01
      s.wsp = lm.randn({ Cc, Cc, 1, 3, 3 }) * 0.05
      s.wt = lm.randn({ Cc, Cc, 3, 1, 1 }) * 0.1
      s.wg = lm.randn({ Cc, Cc / 4, 3, 3, 3 }) * 0.05
      s.wd = lm.randn({ Cc, 1, 3, 3, 3 }) * 0.1
      s.w3_plain = s.w3
      convert.wstem, convert.wsp, convert.wt = true, true, true
   else
      s.bias = lm.rand({ 1, Cc, 1 })
      s.w3 = lm.randn({ Cc, Cc, 3 }) * 0.1
      s.w1 = lm.randn({ Cc, Cc, 1 }) * 0.1
      s.wg = lm.randn({ Cc, Cc / 4, 3 }) * 0.1
      s.wd = lm.randn({ Cc, 1, 3 }) * 0.3
      s.w3_plain = s.w3
   end
   return s, convert
end

local function check_shape(fname, g, shape)
   local r = g.rank
   local names = ({ [3] = "{N, C, L}", [4] = "{N, C, H, W}", [5] = "{N, C, D, H, W}" })[r]
   if type(shape) ~= "table" or #shape ~= r then
      fail(fname, "%s must be %s", g.option, names)
   end
   for i = 1, r do
      if type(shape[i]) ~= "number" or shape[i] ~= math.floor(shape[i]) then
         fail(fname, "%s must be %s (integers)", g.option, names)
      end
   end
   local Cc = shape[2]
   local small = shape[1] < 1 or Cc < 8 or Cc % 8 ~= 0
   if r == 3 then small = small or shape[3] < 16 end
   if r >= 4 then small = small or shape[r - 1] < 8 or shape[r] < 8 end
   if r == 5 then small = small or shape[3] < 4 end
   if small then
      local s = {}
      for i = 1, r do s[i] = tostring(shape[i]) end
      fail(fname, "%s needs C a multiple of 8, %s, got (%s)", g.option,
           r == 3 and "L >= 16" or (r == 5 and "D >= 4 and H, W >= 8" or "H, W >= 8"),
           table.concat(s, ","))
   end
end

---------------------------------------------------------------------------------------------
-- the report
---------------------------------------------------------------------------------------------

local Coverage = {}
Coverage.__index = Coverage

local function yes_no(v)
   if v == nil then return "-" end
   return v and "yes" or "NO"
end

function Coverage.__tostring(r)
   local parts = {}
   for _, g in ipairs(GROUPS) do
      local rows = {}
      for _, row in ipairs(r.rows) do
         if row.group == g.name then
            rows[#rows + 1] = { row.op, row.kind, row.nchw, row.nhwc, yes_no(row.preserves),
                                row.native, row.grad_nhwc or "-" }
         end
      end
      if #rows > 0 then
         parts[#parts + 1] = g.title .. "\n\n" .. render({ "operator", "kind",
            g.plain .. " input ->", g.cl .. " input ->", g.keeps, "native",
            "grad (" .. g.cl .. ")" }, rows)
      end
   end
   parts[#parts + 1] = r.legend
   return table.concat(parts, "\n\n")
end

local LEGEND = table.concat({
   "NCHW / NHWC input -> the format of the result when the inputs (and weights) are contiguous /",
   "  channels-last (3-D operators: NCDHW / NDHWC, channels_last_3d; 1-D operators: NCL / NLC, N x",
   "  L x C strides): channels_last, channels_last_3d, nlc, contiguous, ambiguous (both: C == 1 or",
   "  H == W == 1; ambiguous_cl / ambiguous_cl3d: with the channels-last tag strides),",
   "  cl_strided / cl3d_strided (a channels-last-ordered view), strided, broadcast, or an error;",
   "  (k-D) for results of another rank than the input's. keeps CL: a result of the input's rank",
   "  from the channels-last input is still channels-last, ambiguous or a channels-last-ordered",
   "  view (keeps NLC: N x L x C strides; '-': the result has another rank). native: the formats",
   "  the operator computes in place of its input layout, i.e. without allocating a temporary",
   "  copy of the input (measured: the allocator's peak bytes during the call minus what is",
   "  still live after it, single-threaded; a format is NOT native when it needs >= 90% of an",
   "  input's bytes more temporary memory than the other format). grad: the format of the",
   "  gradient the backward hands to the channels-last input (seed: ones in the result's format).",
}, "\n")

---------------------------------------------------------------------------------------------
-- coverage
---------------------------------------------------------------------------------------------

--- lm.layout.coverage({shape = {2, 32, 96, 96}, shape3d = {2, 32, 8, 24, 24}, shape1d = {8, 32,
--- 1024}, backward = true, only = {op names}}) -> report
--- Runs every operator of the list on a contiguous input and on the same values in its rank's
--- channels-last layout (weights converted alike) and reports, per operator, the result formats,
--- whether the layout is kept, which layouts run natively, and the gradient format.
--- report.rows[i] = {op=, kind=, group=, rank=, nchw=, nhwc=, preserves=, native=,
--- native_nchw=, native_nhwc=, temp_bytes = {nchw=, nhwc=}, input_bytes=, grad_nhwc=,
--- grad_nchw=, errors = {nchw=, nhwc=}}; report.by_op[name] = row. For the 3-D and 1-D groups
--- nchw / nhwc are the contiguous and the channels-last-like runs (NCDHW / NDHWC, NCL / NLC).
function M.coverage(opts)
   local fname = "layout.coverage"
   if opts ~= nil and (type(opts) ~= "table" or getmetatable(opts) ~= nil) then
      fail(fname, "options must be a table {shape =, shape3d =, shape1d =, backward =, only =}, " ..
           "got %s", T.typename(opts))
   end
   opts = opts or {}
   for k in pairs(opts) do
      if not COVERAGE_OPTIONS[k] then fail(fname, "unknown option '%s'", tostring(k)) end
   end
   local lm = require("lumen")
   local memory = require("lumen.memory")
   local shapes = {}
   for _, g in ipairs(GROUPS) do
      local shape = opts[g.option] or g.default
      check_shape(fname, g, shape)
      shapes[g.name] = shape
   end
   local backward = opts.backward ~= false
   local only
   if opts.only ~= nil then
      if type(opts.only) ~= "table" then fail(fname, "only must be an array of operator names") end
      only = {}
      for _, n in ipairs(opts.only) do only[n] = true end
   end

   local ops = operator_list(lm)
   local report = setmetatable({ rows = {}, by_op = {}, shape = shapes["2-D"],
                                 shape3d = shapes["3-D"], shape1d = shapes["1-D"],
                                 legend = LEGEND }, Coverage)

   -- the operands of each group that has an operator to run, made once
   local bases = {}
   for _, e in ipairs(ops) do
      if (not only or only[e.op]) and not bases[e.group] then
         local g = GROUP_BY_NAME[e.group]
         local s, convert = A.no_grad(make_base, lm, g, shapes[e.group])
         bases[e.group] = { s = s, convert = convert }
      end
   end
   -- x + 0.1 may be a deferred result (lumen/deferred.lua): computed now, not inside the first call
   -- that reads it (which would count it as that call's temporary memory)
   T.force_all()
   local function context(group, cl)
      local b = bases[group]
      local rank = GROUP_BY_NAME[group].rank
      local s = {}
      for k, v in pairs(b.s) do
         if cl and b.convert[k] then s[k] = to_cl(v, rank) else s[k] = v end
      end
      s.y_plain = b.s.y
      -- batch-norm running stats are updated in place: fresh ones per run
      s.rm, s.rv = raw.clone(b.s.rm), raw.clone(b.s.rv)
      return s
   end

   local prev_threads = C.lm_get_num_threads()
   local prev_limit = memory.soft_limit()
   C.lm_set_num_threads(1)
   memory.set_soft_limit(2 ^ 50)

   -- the bytes a call needs beyond what it leaves live: the host allocator's, plus the device
   -- allocator's when the tensors are on a GPU (its kernels' workspace; in the emulated build the
   -- CPU kernels an op falls back to still take theirs from the host)
   local gpu = nil
   do
      local any = next(bases) and bases[next(bases)].s.x
      local dev = any and cdata_of(any).device or 0
      if dev >= T.DEV_CUDA0 and dev < T.DEV_CUDA0 + T.NUM_CUDA then gpu = dev - T.DEV_CUDA0 end
   end
   local gstats = ffi.new("int64_t[?]", C.LM_CUDA_NSTATS)
   local function gpu_stat(which)
      if gpu == nil or C.lm_cuda_memory_stats(gpu, gstats) ~= 0 then return 0 end
      return tonumber(gstats[which])
   end

   -- run one op on one layout: returns {format=, keeps=, temp=, err=, grad=}
   local function run_one(e, cl)
      local rank = GROUP_BY_NAME[e.group].rank
      local s = context(e.group, cl)
      local x = s.x
      local r = {}
      collectgarbage()
      memory.settle()
      collectgarbage("stop")
      local live0 = tonumber(C.lm_mem_live_bytes()) + gpu_stat(C.LM_CUDA_STAT_LIVE)
      C.lm_mem_reset_peak()
      if gpu then C.lm_cuda_reset_peak(gpu) end
      local ok, out = pcall(A.no_grad, e.run, x, s)
      local peak = tonumber(C.lm_mem_peak_bytes())
      local gpeak = gpu_stat(C.LM_CUDA_STAT_PEAK)
      collectgarbage("restart")
      collectgarbage()
      memory.settle()
      local live1 = tonumber(C.lm_mem_live_bytes())
      r.temp = math.max(0, peak - live1) + math.max(0, gpeak - gpu_stat(C.LM_CUDA_STAT_LIVE))
      r.base = live0
      if not ok then
         r.err = tostring(out):gsub("^.-(lumen%.)", "%1")
         r.format = "error"
         return r
      end
      local oc = cdata_of(out)
      if oc == nil then
         r.format = "-"
      else
         r.format = classify(oc)
         if oc.ndim ~= rank then r.format = r.format .. " (" .. oc.ndim .. "-D)" end
         r.ndim = oc.ndim
         if oc.ndim == rank then r.keeps = keeps(oc, rank) end
      end
      -- backward: the gradient handed to the input
      if backward and e.grad ~= false and oc ~= nil and C.lm_dtype_is_floating(oc.dtype) ~= 0 then
         local xg = raw.alias(x)
         Tensor.requires_grad_(xg, true)
         local gf
         local okb, berr = pcall(function()
            Tensor.register_hook(xg, function(g)
               local gc = cdata_of(g)
               gf = gc and classify(gc) or "-"
            end)
            local s2 = context(e.group, cl)
            local o2 = e.run(xg, s2)
            if rawget(o2, "requires_grad") == true then
               Tensor.backward(o2, lm.ones_like(o2))
            end
         end)
         if okb then r.grad = gf or "-" else r.grad = "error" ; r.grad_err = berr end
      end
      return r
   end

   local ok, err = pcall(function()
      for _, e in ipairs(ops) do
         if not only or only[e.op] then
            local g = GROUP_BY_NAME[e.group]
            local input_bytes = 4
            for _, n in ipairs(shapes[e.group]) do input_bytes = input_bytes * n end
            local a = run_one(e, false)
            local b = run_one(e, true)
            local row = { op = e.op, kind = e.kind, group = e.group, rank = g.rank,
                          nchw = a.format, nhwc = b.format,
                          temp_bytes = { nchw = a.temp, nhwc = b.temp }, input_bytes = input_bytes,
                          grad_nchw = a.grad, grad_nhwc = b.grad,
                          errors = { nchw = a.err, nhwc = b.err } }
            if b.err then row.preserves = false
            elseif b.ndim == g.rank then row.preserves = b.keeps and true or false end
            local margin = 0.9 * input_bytes
            row.native_nchw = a.err == nil and a.temp < b.temp + margin
            row.native_nhwc = b.err == nil and b.temp < a.temp + margin
            if row.native_nchw and row.native_nhwc then row.native = "both"
            elseif row.native_nchw then row.native = g.plain:lower()
            elseif row.native_nhwc then row.native = g.cl:lower()
            else row.native = "none" end
            report.rows[#report.rows + 1] = row
            report.by_op[e.op] = row
         end
      end
   end)
   C.lm_set_num_threads(prev_threads)
   memory.set_soft_limit(prev_limit)
   if not ok then error(err, 0) end
   return report
end

-- the operator list, for documentation and specs: array of {op=, kind=, group=}
function M.operators()
   local r = {}
   for i, e in ipairs(operator_list(require("lumen"))) do
      r[i] = { op = e.op, kind = e.kind, group = e.group }
   end
   return r
end

M._groups = GROUPS

return M
