-- lumen.nn.layers -- the standard modules: Conv2d, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d,
-- AdaptiveAvgPool2d, AdaptiveMaxPool2d, Linear, Dropout, Flatten, Identity, Sequential, and a
-- few more (Sigmoid, Tanh, Softmax, LogSoftmax, CrossEntropyLoss, NLLLoss, MSELoss).
-- Parameters and buffers carry PyTorch's names and default initialisations.

local creation = require("lumen.creation")
local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local F = require("lumen.functional")
local Module = require("lumen.nn.module")
local init = require("lumen.nn.weight_init")
local util = require("lumen.util")

local type, tostring, getmetatable, rawget, sqrt, select = type, tostring, getmetatable,
   rawget, math.sqrt, select
local unpack = unpack or table.unpack   -- luacheck: ignore 143

local Tensor = T.Tensor

local M = {}

local function fail(fname, msg)
   error("lumen." .. fname .. ": " .. msg, T.user_level and T.user_level() or 3)
end

local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end

-- opts: nil or a plain table whose keys are all in the set known (an unknown key is an error)
local function opts_arg(fname, opts, known)
   if opts == nil then return {} end
   if not plain_table(opts) then
      fail(fname, "options must be a table, got " .. T.typename(opts))
   end
   local k = util.unknown_option(opts, known)
   if k ~= nil then fail(fname, util.unknown_option_msg(k)) end
   return opts
end

-- the options each constructor takes
local option_set = util.option_set
local CONV_OPTS = option_set("stride", "padding", "dilation", "groups", "bias", "dtype",
                             "device", "padding_mode")
local BN_OPTS = option_set("eps", "momentum", "affine", "track_running_stats", "dtype", "device")
local LINEAR_OPTS = option_set("bias", "dtype", "device")
local MAX_POOL_NAMES = { "kernel_size", "stride", "padding", "dilation", "return_indices",
                         "ceil_mode" }
local AVG_POOL_NAMES = { "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                         "divisor_override" }
local MAX_POOL_OPTS = option_set(unpack(MAX_POOL_NAMES))
local AVG_POOL_OPTS = option_set(unpack(AVG_POOL_NAMES))
local RELU_OPTS = option_set("inplace")
local DROPOUT_OPTS = option_set("p")
local LOSS_OPTS = option_set("weight", "ignore_index", "reduction")
local CE_LOSS_OPTS = option_set("weight", "ignore_index", "reduction", "label_smoothing")
local MSE_OPTS = option_set("reduction")

local function int_arg(fname, v, what, min)
   if type(v) ~= "number" or v % 1 ~= 0 then
      fail(fname, what .. " must be an integer, got " .. tostring(v))
   end
   if min and v < min then fail(fname, ("%s must be at least %d, got %d"):format(what, min, v)) end
   return v
end

local function pair_str(p)
   if type(p) ~= "table" then return tostring(p) end
   return "(" .. tostring(p[1]) .. ", " .. tostring(p[2]) .. ")"
end

local function fmt_num(x)
   if type(x) == "boolean" then return x and "True" or "False" end
   if type(x) == "number" and x % 1 == 0 then return ("%d"):format(x) end
   return tostring(x)
end

-- the factory options of the parameters: {dtype = opts.dtype or float32, device = opts.device}
local function param_opts(fname, opts)
   local d = dtypes.float32
   if opts.dtype ~= nil then
      local msg
      d, msg = dtypes.lookup(opts.dtype)
      if not d then fail(fname, msg) end
   end
   return { dtype = d, device = opts.device }
end

---------------------------------------------------------------------------------------------
-- Conv2d
---------------------------------------------------------------------------------------------

local Conv2d = Module:extend("Conv2d")
M.Conv2d = Conv2d

-- a number or a table of 1 or nd integers of at least min -> a table of nd
local NAMES = { [2] = "{h, w}", [3] = "{d, h, w}" }
local function sizes_arg(fname, v, what, min, nd)
   local t
   if type(v) == "number" then t = {}; for i = 1, nd do t[i] = v end
   elseif T.is_sizes(v) and #v == 1 then t = {}; for i = 1, nd do t[i] = v[1] end
   elseif T.is_sizes(v) and #v == nd then t = {}; for i = 1, nd do t[i] = v[i] end
   else
      fail(fname, ("%s must be a number or %s, got %s"):format(what, NAMES[nd], tostring(v)))
   end
   for i = 1, nd do int_arg(fname, t[i], what, min) end
   return t
end

-- what Conv2d and Conv3d share: the arguments' checks, the fields, the parameters weight (out,
-- in / groups, k...) and bias (out), PyTorch's init. Sizes are numbers or tables of nd values;
-- padding may also be "valid" or "same".
local function conv_init(self, fname, nd, in_channels, out_channels, kernel_size, opts)
   opts = opts_arg(fname, opts, CONV_OPTS)
   int_arg(fname, in_channels, "in_channels", 1)
   int_arg(fname, out_channels, "out_channels", 1)
   local groups = int_arg(fname, opts.groups or 1, "groups", 1)
   if in_channels % groups ~= 0 then fail(fname, "in_channels must be divisible by groups") end
   if out_channels % groups ~= 0 then fail(fname, "out_channels must be divisible by groups") end
   local k = sizes_arg(fname, kernel_size, "kernel_size", 1, nd)
   local padding = opts.padding or 0
   if padding ~= "same" and padding ~= "valid" then
      padding = sizes_arg(fname, padding, "padding", 0, nd)
   end
   if opts.padding_mode ~= nil and opts.padding_mode ~= "zeros" then
      fail(fname, "padding_mode '" .. tostring(opts.padding_mode) .. "' is not supported " ..
           "(only 'zeros')")
   end
   self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
   self.stride = sizes_arg(fname, opts.stride or 1, "stride", 1, nd)
   self.padding = padding
   self.dilation = sizes_arg(fname, opts.dilation or 1, "dilation", 1, nd)
   self.groups = groups
   if padding == "same" then
      for i = 1, nd do
         if self.stride[i] ~= 1 then
            fail(fname, "padding='same' is not supported for strided convolutions")
         end
      end
   end
   local fk = param_opts(fname, opts)
   local wsz = { out_channels, in_channels / groups }
   for i = 1, nd do wsz[i + 2] = k[i] end
   self:register_parameter("weight", creation.empty(wsz, fk))
   if opts.bias == nil or opts.bias then
      self:register_parameter("bias", creation.empty({ out_channels }, fk))
   else
      self:register_parameter("bias", nil)
   end
   self:reset_parameters()
end

-- Conv2d(in_channels, out_channels, kernel_size, {stride=1, padding=0, dilation=1, groups=1,
--        bias=true, dtype=float32})
Conv2d._functional = "conv2d"   -- forward's F function (Conv3d: conv3d)
function Conv2d:__init(in_channels, out_channels, kernel_size, opts)
   conv_init(self, "Conv2d", 2, in_channels, out_channels, kernel_size, opts)
end

function Conv2d:reset_parameters()
   init.kaiming_uniform_(self.weight, sqrt(5))
   if self.bias ~= nil then
      local fan_in = init.calculate_fan_in_and_fan_out(self.weight)
      local bound = fan_in > 0 and 1 / sqrt(fan_in) or 0
      init.uniform_(self.bias, -bound, bound)
   end
end

-- forward(x [, {residual = t, relu = true, act = "silu"}]): the optional second argument fuses
-- act(conv(x) + residual) into the convolution's epilogue (F.conv2d's residual / relu / act
-- options), as the ResNet blocks of a model folded by nn.fold_batch_norm do, and the
-- Sequential's (convolution, activation) pairs in evaluation (lumen.nn.fold)
function Conv2d:forward(x, fuse)
   if fuse ~= nil and not plain_table(fuse) then
      fail(self.__name, "the second argument must be a table {residual =, relu =, act =}, got " ..
           T.typename(fuse))
   end
   return F[self._functional](x, self.weight, self.bias, { stride = self.stride,
                                padding = self.padding,
                                dilation = self.dilation, groups = self.groups,
                                residual = fuse and fuse.residual, relu = fuse and fuse.relu,
                                act = fuse and fuse.act })
end

function Conv2d:extra_repr()
   local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
      pair_str(self.kernel_size), pair_str(self.stride))
   local p = self.padding
   if type(p) == "string" then s = s .. ", padding=" .. p
   elseif p[1] ~= 0 or p[2] ~= 0 then s = s .. ", padding=" .. pair_str(p) end
   if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then
      s = s .. ", dilation=" .. pair_str(self.dilation)
   end
   if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
   if self.bias == nil then s = s .. ", bias=False" end
   return s
end

---------------------------------------------------------------------------------------------
-- Conv1d
---------------------------------------------------------------------------------------------

local Conv1d = Module:extend("Conv1d")
M.Conv1d = Conv1d

-- number or {n} -> n (nil when neither)
local function single(v)
   if type(v) == "number" then return v end
   if T.is_sizes(v) and #v == 1 then return v[1] end
   return nil
end

-- PyTorch prints the 1-D sizes of Conv1d / AvgPool1d as 1-tuples: (3,)
local function single_str(v) return "(" .. tostring(v) .. ",)" end

-- Conv1d(in_channels, out_channels, kernel_size, {stride=1, padding=0, dilation=1, groups=1,
--        bias=true, dtype=float32}); padding is a number, {n}, "valid" or "same"
function Conv1d:__init(in_channels, out_channels, kernel_size, opts)
   local fname = "Conv1d"
   opts = opts_arg(fname, opts, CONV_OPTS)
   int_arg(fname, in_channels, "in_channels", 1)
   int_arg(fname, out_channels, "out_channels", 1)
   local groups = int_arg(fname, opts.groups or 1, "groups", 1)
   if in_channels % groups ~= 0 then fail(fname, "in_channels must be divisible by groups") end
   if out_channels % groups ~= 0 then fail(fname, "out_channels must be divisible by groups") end
   local k = single(kernel_size)
   if k == nil then
      fail(fname, "kernel_size must be a number or {n}, got " .. tostring(kernel_size))
   end
   int_arg(fname, k, "kernel_size", 1)
   local padding = opts.padding or 0
   if padding ~= "same" and padding ~= "valid" then
      padding = single(padding)
      if padding == nil then
         fail(fname, "padding must be a number, {n}, 'valid' or 'same', got " ..
              tostring(opts.padding))
      end
      int_arg(fname, padding, "padding", 0)
   end
   if opts.padding_mode ~= nil and opts.padding_mode ~= "zeros" then
      fail(fname, "padding_mode '" .. tostring(opts.padding_mode) .. "' is not supported " ..
           "(only 'zeros')")
   end
   local stride, dilation = single(opts.stride or 1), single(opts.dilation or 1)
   if stride == nil then fail(fname, "stride must be a number or {n}") end
   if dilation == nil then fail(fname, "dilation must be a number or {n}") end
   int_arg(fname, stride, "stride", 1)
   int_arg(fname, dilation, "dilation", 1)
   if padding == "same" and stride ~= 1 then
      fail(fname, "padding='same' is not supported for strided convolutions")
   end
   self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
   self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
   local fk = param_opts(fname, opts)
   self:register_parameter("weight", creation.empty({ out_channels, in_channels / groups, k },
                                                    fk))
   if opts.bias == nil or opts.bias then
      self:register_parameter("bias", creation.empty({ out_channels }, fk))
   else
      self:register_parameter("bias", nil)
   end
   self:reset_parameters()
end

Conv1d.reset_parameters = Conv2d.reset_parameters       -- PyTorch's _ConvNd init

function Conv1d:forward(x)
   return F.conv1d(x, self.weight, self.bias, { stride = self.stride, padding = self.padding,
                   dilation = self.dilation, groups = self.groups })
end

function Conv1d:extra_repr()
   local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
      single_str(self.kernel_size), single_str(self.stride))
   local p = self.padding
   if type(p) == "string" then s = s .. ", padding=" .. p
   elseif p ~= 0 then s = s .. ", padding=" .. single_str(p) end
   if self.dilation ~= 1 then s = s .. ", dilation=" .. single_str(self.dilation) end
   if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
   if self.bias == nil then s = s .. ", bias=False" end
   return s
end

---------------------------------------------------------------------------------------------
-- Conv3d
---------------------------------------------------------------------------------------------

local Conv3d = Module:extend("Conv3d")
M.Conv3d = Conv3d

local function conv3_str(p) return ("(%d, %d, %d)"):format(p[1], p[2], p[3]) end

-- Conv3d(in_channels, out_channels, kernel_size, {stride=1, padding=0, dilation=1, groups=1,
--        bias=true, dtype=float32}); sizes are numbers or {d, h, w}; padding may also be
-- "valid" or "same"
function Conv3d:__init(in_channels, out_channels, kernel_size, opts)
   conv_init(self, "Conv3d", 3, in_channels, out_channels, kernel_size, opts)
end

Conv3d.reset_parameters = Conv2d.reset_parameters       -- PyTorch's _ConvNd init
-- forward(x [, {residual = t, relu = true}]): as Conv2d:forward (F.conv3d's fused epilogue)
Conv3d.forward = Conv2d.forward
Conv3d._functional = "conv3d"

function Conv3d:extra_repr()
   local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
      conv3_str(self.kernel_size), conv3_str(self.stride))
   local p = self.padding
   if type(p) == "string" then s = s .. ", padding=" .. p
   elseif p[1] ~= 0 or p[2] ~= 0 or p[3] ~= 0 then s = s .. ", padding=" .. conv3_str(p) end
   local d = self.dilation
   if d[1] ~= 1 or d[2] ~= 1 or d[3] ~= 1 then s = s .. ", dilation=" .. conv3_str(d) end
   if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
   if self.bias == nil then s = s .. ", bias=False" end
   return s
end

---------------------------------------------------------------------------------------------
-- BatchNorm2d
---------------------------------------------------------------------------------------------

local BatchNorm2d = Module:extend("BatchNorm2d")
M.BatchNorm2d = BatchNorm2d

-- BatchNorm2d(num_features, {eps=1e-5, momentum=0.1, affine=true, track_running_stats=true});
-- momentum = false means PyTorch's momentum=None (a cumulative moving average)
function BatchNorm2d:__init(num_features, opts)
   local fname = self.__name
   opts = opts_arg(fname, opts, BN_OPTS)
   int_arg(fname, num_features, "num_features", 1)
   self.num_features = num_features
   self.eps = opts.eps or 1e-5
   if opts.momentum == nil then self.momentum = 0.1
   elseif opts.momentum == false then self.momentum = false
   elseif type(opts.momentum) == "number" then self.momentum = opts.momentum
   else fail(fname, "momentum must be a number or false, got " .. tostring(opts.momentum)) end
   self.affine = opts.affine == nil or opts.affine and true or false
   self.track_running_stats = opts.track_running_stats == nil or
                              opts.track_running_stats and true or false
   local fk = param_opts(fname, opts)
   if self.affine then
      self:register_parameter("weight", creation.ones({ num_features }, fk))
      self:register_parameter("bias", creation.zeros({ num_features }, fk))
   else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
   end
   if self.track_running_stats then
      self:register_buffer("running_mean", creation.zeros({ num_features }, fk))
      self:register_buffer("running_var", creation.ones({ num_features }, fk))
      self:register_buffer("num_batches_tracked", creation.zeros({}, { dtype = dtypes.int64,
                                                                     device = opts.device }))
   else
      self:register_buffer("running_mean", nil)
      self:register_buffer("running_var", nil)
      self:register_buffer("num_batches_tracked", nil)
   end
end

function BatchNorm2d:reset_running_stats()
   if self.track_running_stats then
      T.raw.zero_(self.running_mean)
      T.raw.fill_(self.running_var, 1)
      T.raw.zero_(self.num_batches_tracked)
   end
end

function BatchNorm2d:reset_parameters()
   self:reset_running_stats()
   if self.affine then
      T.raw.fill_(self.weight, 1)
      T.raw.zero_(self.bias)
   end
end

-- forward(x [, {residual = t, relu = true}]): the optional second argument fuses a ResNet block's
-- tail, relu(bn(x) + residual), into the batch norm (F.batch_norm's residual / relu options)
function BatchNorm2d:_check_input_dim(d)
   if d ~= 4 then fail("BatchNorm2d", ("expected 4D input (got %dD input)"):format(d)) end
end

function BatchNorm2d:forward(x, fuse)
   local name = self.__name
   if fuse ~= nil and not plain_table(fuse) then
      fail(name, "the second argument must be a table {residual =, relu =}, got " ..
           T.typename(fuse))
   end
   if not T.is_tensor(x) then
      fail(name, "input: tensor expected, got " .. T.typename(x))
   end
   self:_check_input_dim(Tensor.dim(x))
   local eaf = self.momentum or 0
   if self.training and self.track_running_stats and self.num_batches_tracked ~= nil then
      T.raw.add_(self.num_batches_tracked, 1)
      if self.momentum == false then
         -- a meta counter has no value (nothing is computed there: any factor will do)
         local nbt = self.num_batches_tracked
         eaf = Tensor.device(nbt) == "meta" and 0 or 1 / Tensor.item(nbt)
      end
   end
   local bn_training = self.training or (self.running_mean == nil and self.running_var == nil)
   local use_stats = not self.training or self.track_running_stats
   return F.batch_norm(x, use_stats and self.running_mean or nil,
                       use_stats and self.running_var or nil, self.weight, self.bias,
                       { training = bn_training, momentum = eaf, eps = self.eps,
                         residual = fuse and fuse.residual, relu = fuse and fuse.relu })
end

function BatchNorm2d:extra_repr()
   return ("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s"):format(
      self.num_features, tostring(self.eps),
      self.momentum == false and "None" or tostring(self.momentum), fmt_num(self.affine),
      fmt_num(self.track_running_stats))
end

-- BatchNorm1d (2-D (N, C) or 3-D (N, C, L) input) and BatchNorm3d (5-D input): BatchNorm2d with
-- another input check (PyTorch's _check_input_dim)
local BatchNorm1d = BatchNorm2d:extend("BatchNorm1d")
M.BatchNorm1d = BatchNorm1d
function BatchNorm1d:_check_input_dim(d)
   if d ~= 2 and d ~= 3 then
      fail("BatchNorm1d", ("expected 2D or 3D input (got %dD input)"):format(d))
   end
end

local BatchNorm3d = BatchNorm2d:extend("BatchNorm3d")
M.BatchNorm3d = BatchNorm3d
function BatchNorm3d:_check_input_dim(d)
   if d ~= 5 then fail("BatchNorm3d", ("expected 5D input (got %dD input)"):format(d)) end
end

---------------------------------------------------------------------------------------------
-- GroupNorm, LayerNorm, InstanceNorm1d/2d/3d (issue 40; lm.F.group_norm / layer_norm /
-- instance_norm in functional/norm.lua)
---------------------------------------------------------------------------------------------

local GN_OPTS = option_set("eps", "affine", "dtype", "device")
local LN_OPTS = option_set("eps", "elementwise_affine", "bias", "dtype", "device")

local GroupNorm = Module:extend("GroupNorm")
M.GroupNorm = GroupNorm

-- GroupNorm(num_groups, num_channels, {eps=1e-5, affine=true}): weight (ones) and bias (zeros)
-- of num_channels when affine
function GroupNorm:__init(num_groups, num_channels, opts)
   local fname = "GroupNorm"
   opts = opts_arg(fname, opts, GN_OPTS)
   int_arg(fname, num_groups, "num_groups", 1)
   int_arg(fname, num_channels, "num_channels", 1)
   if num_channels % num_groups ~= 0 then
      fail(fname, "num_channels must be divisible by num_groups")
   end
   self.num_groups, self.num_channels = num_groups, num_channels
   self.eps = opts.eps or 1e-5
   self.affine = opts.affine == nil or opts.affine and true or false
   local fk = param_opts(fname, opts)
   if self.affine then
      self:register_parameter("weight", creation.ones({ num_channels }, fk))
      self:register_parameter("bias", creation.zeros({ num_channels }, fk))
   else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
   end
end

function GroupNorm:reset_parameters()
   if self.affine then
      T.raw.fill_(self.weight, 1)
      T.raw.zero_(self.bias)
   end
end

function GroupNorm:forward(x)
   return F.group_norm(x, self.num_groups, self.weight, self.bias, { eps = self.eps })
end

function GroupNorm:extra_repr()
   return ("%d, %d, eps=%s, affine=%s"):format(self.num_groups, self.num_channels,
      tostring(self.eps), fmt_num(self.affine))
end

local LayerNorm = Module:extend("LayerNorm")
M.LayerNorm = LayerNorm

-- LayerNorm(normalized_shape, {eps=1e-5, elementwise_affine=true, bias=true})
function LayerNorm:__init(normalized_shape, opts)
   local fname = "LayerNorm"
   opts = opts_arg(fname, opts, LN_OPTS)
   local ns = normalized_shape
   if type(ns) == "number" then ns = { ns } end
   if not T.is_sizes(ns) or #ns == 0 then
      fail(fname, "normalized_shape must be a number or a list of numbers, got " ..
           tostring(normalized_shape))
   end
   local shape = {}
   for i = 1, #ns do shape[i] = int_arg(fname, ns[i], "normalized_shape", 0) end
   self.normalized_shape = shape
   self.eps = opts.eps or 1e-5
   self.elementwise_affine = opts.elementwise_affine == nil or opts.elementwise_affine and true
                             or false
   local with_bias = opts.bias == nil or opts.bias and true or false
   local fk = param_opts(fname, opts)
   if self.elementwise_affine then
      self:register_parameter("weight", creation.ones(shape, fk))
      self:register_parameter("bias", with_bias and creation.zeros(shape, fk) or nil)
   else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
   end
end

function LayerNorm:reset_parameters()
   if self.weight ~= nil then T.raw.fill_(self.weight, 1) end
   if self.bias ~= nil then T.raw.zero_(self.bias) end
end

function LayerNorm:forward(x)
   return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, { eps = self.eps })
end

function LayerNorm:extra_repr()
   local n = {}
   for i, v in ipairs(self.normalized_shape) do n[i] = tostring(v) end
   return ("(%s,), eps=%s, elementwise_affine=%s"):format(table.concat(n, ", "),
      tostring(self.eps), fmt_num(self.elementwise_affine))
end

local IN_OPTS = option_set("eps", "momentum", "affine", "track_running_stats", "dtype", "device")

-- InstanceNorm2d(num_features, {eps=1e-5, momentum=0.1, affine=false,
-- track_running_stats=false}); InstanceNorm1d / 3d: other input ranks (PyTorch's checks: 2-D /
-- 3-D, 3-D / 4-D, 4-D / 5-D, the lower one unbatched)
local InstanceNorm2d = Module:extend("InstanceNorm2d")
M.InstanceNorm2d = InstanceNorm2d
InstanceNorm2d._rank = 2

function InstanceNorm2d:__init(num_features, opts)
   local fname = self.__name
   opts = opts_arg(fname, opts, IN_OPTS)
   int_arg(fname, num_features, "num_features", 1)
   self.num_features = num_features
   self.eps = opts.eps or 1e-5
   if opts.momentum ~= nil and type(opts.momentum) ~= "number" then
      fail(fname, "momentum must be a number, got " .. tostring(opts.momentum))
   end
   self.momentum = opts.momentum or 0.1
   self.affine = opts.affine and true or false
   self.track_running_stats = opts.track_running_stats and true or false
   local fk = param_opts(fname, opts)
   if self.affine then
      self:register_parameter("weight", creation.ones({ num_features }, fk))
      self:register_parameter("bias", creation.zeros({ num_features }, fk))
   else
      self:register_parameter("weight", nil)
      self:register_parameter("bias", nil)
   end
   if self.track_running_stats then
      self:register_buffer("running_mean", creation.zeros({ num_features }, fk))
      self:register_buffer("running_var", creation.ones({ num_features }, fk))
      self:register_buffer("num_batches_tracked", creation.zeros({}, { dtype = dtypes.int64,
                                                                     device = opts.device }))
   else
      self:register_buffer("running_mean", nil)
      self:register_buffer("running_var", nil)
      self:register_buffer("num_batches_tracked", nil)
   end
end

function InstanceNorm2d:reset_parameters()
   if self.track_running_stats then
      T.raw.zero_(self.running_mean)
      T.raw.fill_(self.running_var, 1)
      T.raw.zero_(self.num_batches_tracked)
   end
   if self.affine then
      T.raw.fill_(self.weight, 1)
      T.raw.zero_(self.bias)
   end
end

function InstanceNorm2d:forward(x)
   local name = self.__name
   if not T.is_tensor(x) then fail(name, "input: tensor expected, got " .. T.typename(x)) end
   local r = self._rank
   local d = Tensor.dim(x)
   if d ~= r + 1 and d ~= r + 2 then
      fail(name, ("expected %dD or %dD input (got %dD input)"):format(r + 1, r + 2, d))
   end
   local unbatched = d == r + 1
   if unbatched then x = Tensor.unsqueeze(x, 1) end
   local use_input_stats = self.training or not self.track_running_stats
   local y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                             { use_input_stats = use_input_stats, momentum = self.momentum,
                               eps = self.eps })
   if unbatched then y = Tensor.squeeze(y, 1) end
   return y
end

function InstanceNorm2d:extra_repr()
   return ("%d, eps=%s, momentum=%s, affine=%s, track_running_stats=%s"):format(
      self.num_features, tostring(self.eps), tostring(self.momentum), fmt_num(self.affine),
      fmt_num(self.track_running_stats))
end

local InstanceNorm1d = InstanceNorm2d:extend("InstanceNorm1d")
M.InstanceNorm1d = InstanceNorm1d
InstanceNorm1d._rank = 1

local InstanceNorm3d = InstanceNorm2d:extend("InstanceNorm3d")
M.InstanceNorm3d = InstanceNorm3d
InstanceNorm3d._rank = 3

---------------------------------------------------------------------------------------------
-- activations
---------------------------------------------------------------------------------------------

local ReLU = Module:extend("ReLU")
M.ReLU = ReLU

-- ReLU(inplace) or ReLU({inplace = true})
function ReLU:__init(inplace)
   if plain_table(inplace) then inplace = opts_arg("ReLU", inplace, RELU_OPTS).inplace end
   self.inplace = inplace and true or false
end

function ReLU:forward(x)
   if self.inplace then return Tensor.relu_(x) end
   return Tensor.relu(x)
end

function ReLU:extra_repr() return self.inplace and "inplace=True" or "" end

-- the activations of issue 40 (F.silu, ...): SiLU, Hardswish, Hardsigmoid, ReLU6, Mish take
-- (inplace) or ({inplace = }); GELU(approximate) or GELU({approximate = "none" | "tanh"});
-- LeakyReLU(negative_slope = 0.01, inplace) or ({negative_slope =, inplace =}); ELU(alpha = 1,
-- inplace) likewise. extra_repr as PyTorch's.
local function inplace_module(name, fn)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(inplace)
      if plain_table(inplace) then inplace = opts_arg(name, inplace, RELU_OPTS).inplace end
      if inplace ~= nil and type(inplace) ~= "boolean" then
         fail(name, "inplace must be a boolean, got " .. T.typename(inplace))
      end
      self.inplace = inplace and true or false
   end
   function cls:forward(x) return F[fn](x, self.inplace) end
   function cls:extra_repr() return self.inplace and "inplace=True" or "" end
   return cls
end
inplace_module("SiLU", "silu")
inplace_module("Hardswish", "hardswish")
inplace_module("Hardsigmoid", "hardsigmoid")
inplace_module("ReLU6", "relu6")
inplace_module("Mish", "mish")

local GELU = Module:extend("GELU")
M.GELU = GELU
local GELU_OPTS = option_set("approximate")
function GELU:__init(approximate)
   if plain_table(approximate) then
      approximate = opts_arg("GELU", approximate, GELU_OPTS).approximate
   end
   if approximate == nil then approximate = "none" end
   if approximate ~= "none" and approximate ~= "tanh" then
      fail("GELU", "approximate must be \"none\" or \"tanh\", got " .. tostring(approximate))
   end
   self.approximate = approximate
end
function GELU:forward(x) return F.gelu(x, self.approximate) end
function GELU:extra_repr() return "approximate='" .. self.approximate .. "'" end

-- a module with one number parameter (named pname, default dflt) and inplace
local function param_module(name, fn, pname, dflt)
   local cls = Module:extend(name)
   M[name] = cls
   local known = option_set(pname, "inplace")
   function cls:__init(p, inplace)
      if plain_table(p) then
         local o = opts_arg(name, p, known)
         p, inplace = o[pname], o.inplace
      end
      if p == nil then p = dflt end
      if type(p) ~= "number" then
         fail(name, pname .. " must be a number, got " .. T.typename(p))
      end
      if inplace ~= nil and type(inplace) ~= "boolean" then
         fail(name, "inplace must be a boolean, got " .. T.typename(inplace))
      end
      self[pname] = p
      self.inplace = inplace and true or false
   end
   function cls:forward(x) return F[fn](x, self[pname], self.inplace) end
   function cls:extra_repr()
      local v = self[pname]
      local s = pname .. "=" .. (v % 1 == 0 and ("%.1f"):format(v) or tostring(v))
      return self.inplace and (s .. ", inplace=True") or s
   end
   return cls
end
param_module("LeakyReLU", "leaky_relu", "negative_slope", 0.01)
param_module("ELU", "elu", "alpha", 1.0)
param_module("CELU", "celu", "alpha", 1.0)
inplace_module("SELU", "selu")

local function num_repr(v) return v % 1 == 0 and ("%.1f"):format(v) or tostring(v) end

-- Hardtanh(min_val = -1, max_val = 1, inplace = false) or ({min_val =, max_val =, inplace =})
local Hardtanh = Module:extend("Hardtanh")
M.Hardtanh = Hardtanh
local HARDTANH_OPTS = option_set("min_val", "max_val", "inplace")
function Hardtanh:__init(lo, hi, inplace)
   if plain_table(lo) then
      local o = opts_arg("Hardtanh", lo, HARDTANH_OPTS)
      lo, hi, inplace = o.min_val, o.max_val, o.inplace
   end
   if lo == nil then lo = -1 end
   if hi == nil then hi = 1 end
   if type(lo) ~= "number" or type(hi) ~= "number" then
      fail("Hardtanh", "min_val and max_val must be numbers, got " .. T.typename(lo) .. " and "
           .. T.typename(hi))
   end
   if lo > hi then fail("Hardtanh", "min_val cannot be greater than max_val") end
   if inplace ~= nil and type(inplace) ~= "boolean" then
      fail("Hardtanh", "inplace must be a boolean, got " .. T.typename(inplace))
   end
   self.min_val, self.max_val, self.inplace = lo, hi, inplace and true or false
end
function Hardtanh:forward(x) return F.hardtanh(x, self.min_val, self.max_val, self.inplace) end
function Hardtanh:extra_repr()
   local s = "min_val=" .. num_repr(self.min_val) .. ", max_val=" .. num_repr(self.max_val)
   return self.inplace and (s .. ", inplace=True") or s
end

-- Softplus(beta = 1, threshold = 20) or ({beta =, threshold =})
local Softplus = Module:extend("Softplus")
M.Softplus = Softplus
local SOFTPLUS_OPTS = option_set("beta", "threshold")
function Softplus:__init(beta, threshold)
   if plain_table(beta) then
      local o = opts_arg("Softplus", beta, SOFTPLUS_OPTS)
      beta, threshold = o.beta, o.threshold
   end
   if beta == nil then beta = 1 end
   if threshold == nil then threshold = 20 end
   if type(beta) ~= "number" or type(threshold) ~= "number" then
      fail("Softplus", "beta and threshold must be numbers, got " .. T.typename(beta) .. " and "
           .. T.typename(threshold))
   end
   self.beta, self.threshold = beta, threshold
end
function Softplus:forward(x) return F.softplus(x, self.beta, self.threshold) end
function Softplus:extra_repr()
   return "beta=" .. num_repr(self.beta) .. ", threshold=" .. num_repr(self.threshold)
end

local Sigmoid = Module:extend("Sigmoid")
M.Sigmoid = Sigmoid
function Sigmoid:forward(x) return Tensor.sigmoid(x) end

local Tanh = Module:extend("Tanh")
M.Tanh = Tanh
function Tanh:forward(x) return Tensor.tanh(x) end

local Softmax = Module:extend("Softmax")
M.Softmax = Softmax
function Softmax:__init(dim) self.dim = dim end
function Softmax:forward(x) return F.softmax(x, self.dim) end
function Softmax:extra_repr() return "dim=" .. tostring(self.dim) end

local LogSoftmax = Module:extend("LogSoftmax")
M.LogSoftmax = LogSoftmax
function LogSoftmax:__init(dim) self.dim = dim end
function LogSoftmax:forward(x) return F.log_softmax(x, self.dim) end
function LogSoftmax:extra_repr() return "dim=" .. tostring(self.dim) end

---------------------------------------------------------------------------------------------
-- pooling
---------------------------------------------------------------------------------------------

-- pooling options: a table, or positional (kernel_size, stride, padding, ...); a table with
-- no array part is the options table, {2, 2} is a kernel size
local function pool_opts(fname, names, known, ...)
   local first = ...
   if first == nil then fail(fname, "kernel_size is required") end
   if plain_table(first) and first[1] == nil and next(first) ~= nil then
      opts_arg(fname, first, known)
      if first.kernel_size == nil then fail(fname, "kernel_size is required") end
      return first
   end
   local o = {}
   for i = 1, select("#", ...) do o[names[i]] = (select(i, ...)) end
   return o
end

local MaxPool2d = Module:extend("MaxPool2d")
M.MaxPool2d = MaxPool2d

-- MaxPool2d({kernel_size=, stride=, padding=0, dilation=1, ceil_mode=false}) or
-- MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode)
-- (MaxPool1d and MaxPool3d share __init and forward: the class's name and F function differ)
MaxPool2d._functional = "max_pool2d"
function MaxPool2d:__init(...)
   local o = pool_opts(self.__name, MAX_POOL_NAMES, MAX_POOL_OPTS, ...)
   self.kernel_size = o.kernel_size
   self.stride = o.stride or o.kernel_size
   self.padding = o.padding or 0
   self.dilation = o.dilation or 1
   self.ceil_mode = o.ceil_mode or false
   self.return_indices = o.return_indices or false
end

function MaxPool2d:forward(x)
   return F[self._functional](x, { kernel_size = self.kernel_size, stride = self.stride,
                       padding = self.padding, dilation = self.dilation,
                       ceil_mode = self.ceil_mode, return_indices = self.return_indices })
end

function MaxPool2d:extra_repr()
   return ("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s"):format(
      pair_str(self.kernel_size), pair_str(self.stride), pair_str(self.padding),
      pair_str(self.dilation), fmt_num(self.ceil_mode))
end

local AvgPool2d = Module:extend("AvgPool2d")
M.AvgPool2d = AvgPool2d

-- AvgPool2d({kernel_size=, stride=, padding=0, ceil_mode=false, count_include_pad=true,
-- divisor_override=}) or AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad)
-- (AvgPool3d shares __init and forward, AvgPool1d forward)
AvgPool2d._functional = "avg_pool2d"
function AvgPool2d:__init(...)
   local o = pool_opts(self.__name, AVG_POOL_NAMES, AVG_POOL_OPTS, ...)
   self.kernel_size = o.kernel_size
   self.stride = o.stride or o.kernel_size
   self.padding = o.padding or 0
   self.ceil_mode = o.ceil_mode or false
   if o.count_include_pad == nil then self.count_include_pad = true
   else self.count_include_pad = o.count_include_pad end
   self.divisor_override = o.divisor_override
end

function AvgPool2d:forward(x)
   return F[self._functional](x, { kernel_size = self.kernel_size, stride = self.stride,
                       padding = self.padding, ceil_mode = self.ceil_mode,
                       count_include_pad = self.count_include_pad,
                       divisor_override = self.divisor_override })
end

function AvgPool2d:extra_repr()
   return ("kernel_size=%s, stride=%s, padding=%s"):format(pair_str(self.kernel_size),
      pair_str(self.stride), pair_str(self.padding))
end

local AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")
M.AdaptiveAvgPool2d = AdaptiveAvgPool2d
function AdaptiveAvgPool2d:__init(size)
   if size == nil then fail("AdaptiveAvgPool2d", "output_size is required") end
   self.output_size = size
end
function AdaptiveAvgPool2d:forward(x) return F.adaptive_avg_pool2d(x, self.output_size) end
function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. pair_str(self.output_size) end

local AdaptiveMaxPool2d = Module:extend("AdaptiveMaxPool2d")
M.AdaptiveMaxPool2d = AdaptiveMaxPool2d
function AdaptiveMaxPool2d:__init(size, return_indices)
   if size == nil then fail("AdaptiveMaxPool2d", "output_size is required") end
   self.output_size = size
   self.return_indices = return_indices and true or false
end
function AdaptiveMaxPool2d:forward(x)
   local v, i = F.adaptive_max_pool2d(x, self.output_size)
   if self.return_indices then return v, i end
   return v
end
function AdaptiveMaxPool2d:extra_repr() return "output_size=" .. pair_str(self.output_size) end

-- the 1-D pools (PyTorch's constructor arguments, positional or one options table)
local MaxPool1d = Module:extend("MaxPool1d")
M.MaxPool1d = MaxPool1d

-- MaxPool1d({kernel_size=, stride=, padding=0, dilation=1, return_indices=false,
-- ceil_mode=false}) or MaxPool1d(kernel_size, stride, padding, dilation, return_indices,
-- ceil_mode)
MaxPool1d.__init, MaxPool1d.forward = MaxPool2d.__init, MaxPool2d.forward
MaxPool1d._functional = "max_pool1d"
MaxPool1d.extra_repr = MaxPool2d.extra_repr

local AVG_POOL1D_NAMES = { "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad" }
local AVG_POOL1D_OPTS = option_set(unpack(AVG_POOL1D_NAMES))
local AvgPool1d = Module:extend("AvgPool1d")
M.AvgPool1d = AvgPool1d

-- AvgPool1d({kernel_size=, stride=, padding=0, ceil_mode=false, count_include_pad=true}) or
-- AvgPool1d(kernel_size, stride, padding, ceil_mode, count_include_pad)
function AvgPool1d:__init(...)
   local o = pool_opts("AvgPool1d", AVG_POOL1D_NAMES, AVG_POOL1D_OPTS, ...)
   self.kernel_size = o.kernel_size
   self.stride = o.stride or o.kernel_size
   self.padding = o.padding or 0
   self.ceil_mode = o.ceil_mode or false
   if o.count_include_pad == nil then self.count_include_pad = true
   else self.count_include_pad = o.count_include_pad end
end

AvgPool1d.forward = AvgPool2d.forward   -- divisor_override is nil: AvgPool1d has none
AvgPool1d._functional = "avg_pool1d"

function AvgPool1d:extra_repr()
   local function s1(v) return single_str(single(v) or v) end
   return ("kernel_size=%s, stride=%s, padding=%s"):format(s1(self.kernel_size),
      s1(self.stride), s1(self.padding))
end

local AdaptiveAvgPool1d = Module:extend("AdaptiveAvgPool1d")
M.AdaptiveAvgPool1d = AdaptiveAvgPool1d
function AdaptiveAvgPool1d:__init(size)
   if size == nil then fail("AdaptiveAvgPool1d", "output_size is required") end
   self.output_size = size
end
function AdaptiveAvgPool1d:forward(x) return F.adaptive_avg_pool1d(x, self.output_size) end
function AdaptiveAvgPool1d:extra_repr()
   return "output_size=" .. tostring(single(self.output_size) or self.output_size)
end

local AdaptiveMaxPool1d = Module:extend("AdaptiveMaxPool1d")
M.AdaptiveMaxPool1d = AdaptiveMaxPool1d
function AdaptiveMaxPool1d:__init(size, return_indices)
   if size == nil then fail("AdaptiveMaxPool1d", "output_size is required") end
   self.output_size = size
   self.return_indices = return_indices and true or false
end
function AdaptiveMaxPool1d:forward(x)
   local v, i = F.adaptive_max_pool1d(x, self.output_size)
   if self.return_indices then return v, i end
   return v
end
AdaptiveMaxPool1d.extra_repr = AdaptiveAvgPool1d.extra_repr

-- 3-D pools (F.max_pool3d, ...): sizes are numbers or {d, h, w}; tostring as PyTorch prints them
local function triple_str(p)
   if type(p) ~= "table" then return tostring(p) end
   if #p == 1 then return tostring(p[1]) end
   local s = {}
   for i = 1, 3 do
      local v = p[i]
      s[i] = (v == nil or v == false) and "None" or tostring(v)
   end
   return "(" .. table.concat(s, ", ") .. ")"
end

local MaxPool3d = Module:extend("MaxPool3d")
M.MaxPool3d = MaxPool3d

-- MaxPool3d({kernel_size=, stride=, padding=0, dilation=1, return_indices=false,
-- ceil_mode=false}) or MaxPool3d(kernel_size, stride, padding, dilation, return_indices,
-- ceil_mode) (PyTorch's order)
MaxPool3d.__init, MaxPool3d.forward = MaxPool2d.__init, MaxPool2d.forward
MaxPool3d._functional = "max_pool3d"

function MaxPool3d:extra_repr()
   return ("kernel_size=%s, stride=%s, padding=%s, dilation=%s, ceil_mode=%s"):format(
      triple_str(self.kernel_size), triple_str(self.stride), triple_str(self.padding),
      triple_str(self.dilation), fmt_num(self.ceil_mode))
end

local AvgPool3d = Module:extend("AvgPool3d")
M.AvgPool3d = AvgPool3d

-- AvgPool3d({kernel_size=, stride=, padding=0, ceil_mode=false, count_include_pad=true,
-- divisor_override=}) or AvgPool3d(kernel_size, stride, padding, ceil_mode, count_include_pad,
-- divisor_override)
AvgPool3d.__init, AvgPool3d.forward = AvgPool2d.__init, AvgPool2d.forward
AvgPool3d._functional = "avg_pool3d"

function AvgPool3d:extra_repr()
   return ("kernel_size=%s, stride=%s, padding=%s"):format(triple_str(self.kernel_size),
      triple_str(self.stride), triple_str(self.padding))
end

local AdaptiveAvgPool3d = Module:extend("AdaptiveAvgPool3d")
M.AdaptiveAvgPool3d = AdaptiveAvgPool3d
function AdaptiveAvgPool3d:__init(size)
   if size == nil then fail("AdaptiveAvgPool3d", "output_size is required") end
   self.output_size = size
end
function AdaptiveAvgPool3d:forward(x) return F.adaptive_avg_pool3d(x, self.output_size) end
function AdaptiveAvgPool3d:extra_repr() return "output_size=" .. triple_str(self.output_size) end

local AdaptiveMaxPool3d = Module:extend("AdaptiveMaxPool3d")
M.AdaptiveMaxPool3d = AdaptiveMaxPool3d
function AdaptiveMaxPool3d:__init(size, return_indices)
   if size == nil then fail("AdaptiveMaxPool3d", "output_size is required") end
   self.output_size = size
   self.return_indices = return_indices and true or false
end
function AdaptiveMaxPool3d:forward(x)
   return F.adaptive_max_pool3d(x, self.output_size, self.return_indices)
end
function AdaptiveMaxPool3d:extra_repr() return "output_size=" .. triple_str(self.output_size) end

---------------------------------------------------------------------------------------------
-- Linear, Dropout, Flatten, Identity
---------------------------------------------------------------------------------------------

local Linear = Module:extend("Linear")
M.Linear = Linear

-- Linear(in_features, out_features, {bias=true, dtype=float32})
function Linear:__init(in_features, out_features, opts)
   local fname = "Linear"
   opts = opts_arg(fname, opts, LINEAR_OPTS)
   int_arg(fname, in_features, "in_features", 0)
   int_arg(fname, out_features, "out_features", 0)
   self.in_features, self.out_features = in_features, out_features
   local fk = param_opts(fname, opts)
   self:register_parameter("weight", creation.empty({ out_features, in_features }, fk))
   if opts.bias == nil or opts.bias then
      self:register_parameter("bias", creation.empty({ out_features }, fk))
   else
      self:register_parameter("bias", nil)
   end
   self:reset_parameters()
end

function Linear:reset_parameters()
   init.kaiming_uniform_(self.weight, sqrt(5))
   if self.bias ~= nil then
      local fan_in = self.in_features
      local bound = fan_in > 0 and 1 / sqrt(fan_in) or 0
      init.uniform_(self.bias, -bound, bound)
   end
end

-- fuse: nil, or {act = name} (nn.Sequential in evaluation with gradients off: the activation
-- module after this layer runs in the GEMM's epilogue, lua/lumen/nn/fold.lua)
function Linear:forward(x, fuse) return F.linear(x, self.weight, self.bias, fuse) end

function Linear:extra_repr()
   return ("in_features=%d, out_features=%d, bias=%s"):format(self.in_features,
      self.out_features, fmt_num(self.bias ~= nil))
end

local Dropout = Module:extend("Dropout")
M.Dropout = Dropout
function Dropout:__init(p)
   if plain_table(p) then p = opts_arg("Dropout", p, DROPOUT_OPTS).p end
   if p == nil then p = 0.5 end
   if type(p) ~= "number" or p < 0 or p > 1 then
      fail("Dropout", "dropout probability has to be between 0 and 1, but got " .. tostring(p))
   end
   self.p = p
end
function Dropout:forward(x) return F.dropout(x, self.p, self.training) end
function Dropout:extra_repr() return "p=" .. tostring(self.p) end

-- PixelShuffle(upscale_factor), PixelUnshuffle(downscale_factor), ChannelShuffle(groups)
-- (F.pixel_shuffle, ...: the input's memory format kept)
local function factor_module(name, fn, what)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(v)
      self[what] = int_arg(name, v, what, 1)
   end
   function cls:forward(x) return F[fn](x, self[what]) end
   function cls:extra_repr() return what .. "=" .. tostring(self[what]) end
   return cls
end
factor_module("PixelShuffle", "pixel_shuffle", "upscale_factor")
factor_module("PixelUnshuffle", "pixel_unshuffle", "downscale_factor")
factor_module("ChannelShuffle", "channel_shuffle", "groups")

-- Dropout2d / Dropout3d(p = 0.5, inplace = false) or ({p =, inplace =}): F.dropout2d/3d while
-- training
local FEATURE_DROPOUT_OPTS = option_set("p", "inplace")
local function feature_dropout_module(name, fn)
   local cls = Module:extend(name)
   M[name] = cls
   function cls:__init(p, inplace)
      if plain_table(p) then
         local o = opts_arg(name, p, FEATURE_DROPOUT_OPTS)
         p, inplace = o.p, o.inplace
      end
      if p == nil then p = 0.5 end
      if type(p) ~= "number" or p < 0 or p > 1 or p ~= p then
         fail(name, "dropout probability has to be between 0 and 1, but got " .. tostring(p))
      end
      if inplace ~= nil and type(inplace) ~= "boolean" then
         fail(name, "inplace must be a boolean, got " .. T.typename(inplace))
      end
      self.p, self.inplace = p, inplace and true or false
   end
   function cls:forward(x) return F[fn](x, self.p, self.training, self.inplace) end
   function cls:extra_repr()
      return "p=" .. tostring(self.p) .. (self.inplace and ", inplace=True" or "")
   end
   return cls
end
feature_dropout_module("Dropout1d", "dropout1d")
feature_dropout_module("Dropout2d", "dropout2d")
feature_dropout_module("Dropout3d", "dropout3d")

local Flatten = Module:extend("Flatten")
M.Flatten = Flatten
-- Flatten(start_dim = 2, end_dim = -1) (1-based: dim 2 is PyTorch's default start_dim=1)
function Flatten:__init(s, e)
   self.start_dim = s or 2
   self.end_dim = e or -1
end
function Flatten:forward(x) return F.flatten(x, self.start_dim, self.end_dim) end
function Flatten:extra_repr()
   return ("start_dim=%d, end_dim=%d"):format(self.start_dim, self.end_dim)
end

local Identity = Module:extend("Identity")
M.Identity = Identity
function Identity:forward(x) return x end

---------------------------------------------------------------------------------------------
-- losses
---------------------------------------------------------------------------------------------

local CrossEntropyLoss = Module:extend("CrossEntropyLoss")
M.CrossEntropyLoss = CrossEntropyLoss
function CrossEntropyLoss:__init(opts)
   self.opts = opts_arg("CrossEntropyLoss", opts, CE_LOSS_OPTS)
end
function CrossEntropyLoss:forward(x, target) return F.cross_entropy(x, target, self.opts) end

local NLLLoss = Module:extend("NLLLoss")
M.NLLLoss = NLLLoss
function NLLLoss:__init(opts) self.opts = opts_arg("NLLLoss", opts, LOSS_OPTS) end
function NLLLoss:forward(x, target) return F.nll_loss(x, target, self.opts) end

local MSELoss = Module:extend("MSELoss")
M.MSELoss = MSELoss
function MSELoss:__init(opts) self.opts = opts_arg("MSELoss", opts, MSE_OPTS) end
function MSELoss:forward(x, target) return F.mse_loss(x, target, self.opts) end

---------------------------------------------------------------------------------------------
-- Sequential
---------------------------------------------------------------------------------------------

local Sequential = Module:extend("Sequential")
M.Sequential = Sequential

-- seq[i] (a number, 1-based) is the i-th module; other keys are the usual fields and methods
Sequential.__index = function(self, k)
   if type(k) == "number" then return rawget(self, tostring(k - 1)) end
   return Sequential[k]
end

-- Sequential(m1, m2, ...) or Sequential({m1, m2, ...}); children are named "0", "1", ...
function Sequential:__init(...)
   local n = select("#", ...)
   local list = { ... }
   if n == 1 and plain_table(list[1]) and not Module.is_module(list[1]) then
      list = list[1]
      n = #list
   end
   for i = 1, n do
      if not Module.is_module(list[i]) then
         fail("Sequential", ("argument %d is not a Module (got %s)"):format(i, T.typename(list[i])))
      end
      self:add_module(tostring(i - 1), list[i])
   end
end

-- add(m): appends a module, returns self
function Sequential:add(m)
   if not Module.is_module(m) then fail("Sequential.add", "a Module expected") end
   self:add_module(tostring(#rawget(self, "_children")), m)
   return self
end
Sequential.append = Sequential.add

function Sequential:size() return #self:children() end
function Sequential:get(i) return self:children()[i] end

function Sequential:forward(x)
   for _, m in ipairs(self:children()) do x = m(x) end
   return x
end

---------------------------------------------------------------------------------------------
-- Resampling and transposed convolutions (issue 40): Upsample, UpsamplingNearest2d,
-- UpsamplingBilinear2d, ConvTranspose1d/2d/3d
---------------------------------------------------------------------------------------------

-- Upsample({size=, scale_factor=, mode="nearest", align_corners=, recompute_scale_factor=}):
-- F.interpolate with these options (checked at construction by a dry run of the option parser
-- on the first call's input; unknown keys fail here)
local UPSAMPLE_OPTS = option_set("size", "scale_factor", "mode", "align_corners",
                                 "recompute_scale_factor")
local function upsample_module(name, fixed)
   local cls = Module:extend(name)
   M[name] = cls
   -- (opts), or PyTorch's positional (size, scale_factor, mode, align_corners,
   -- recompute_scale_factor); the fixed modules take (size, scale_factor)
   function cls:__init(opts, ...)
      if not (type(opts) == "table" and getmetatable(opts) == nil and opts[1] == nil) and
         (opts ~= nil or select("#", ...) > 0) then
         local sf, mode, ac, rsf = ...
         if fixed and (mode ~= nil or ac ~= nil or rsf ~= nil) then
            fail(name, "takes (size, scale_factor) or an options table")
         end
         opts = { size = opts, scale_factor = sf, mode = mode, align_corners = ac,
                  recompute_scale_factor = rsf }
      end
      opts = opts_arg(name, opts, UPSAMPLE_OPTS)
      if opts.size == nil and opts.scale_factor == nil then
         fail(name, "either size or scale_factor should be defined")
      end
      self.size, self.scale_factor = opts.size, opts.scale_factor
      self.mode = fixed and fixed.mode or opts.mode or "nearest"
      if fixed then
         self.align_corners = fixed.align_corners
      else
         self.align_corners = opts.align_corners
      end
      self.recompute_scale_factor = opts.recompute_scale_factor
   end
   function cls:forward(x)
      return F.interpolate(x, { size = self.size, scale_factor = self.scale_factor,
                                mode = self.mode, align_corners = self.align_corners,
                                recompute_scale_factor = self.recompute_scale_factor })
   end
   function cls:extra_repr()
      local function v(x)
         if type(x) == "table" then return "(" .. table.concat(x, ", ") .. ")" end
         return tostring(x)
      end
      local s = self.scale_factor ~= nil and ("scale_factor=" .. v(self.scale_factor))
                or ("size=" .. v(self.size))
      s = s .. ", mode='" .. self.mode .. "'"
      if self.align_corners ~= nil and not fixed then
         s = s .. ", align_corners=" .. (self.align_corners and "True" or "False")
      end
      return s
   end
   return cls
end
upsample_module("Upsample")
upsample_module("UpsamplingNearest2d", { mode = "nearest" })
upsample_module("UpsamplingBilinear2d", { mode = "bilinear", align_corners = true })

-- ConvTranspose1d/2d/3d(in_channels, out_channels, kernel_size, {stride=1, padding=0,
-- output_padding=0, groups=1, bias=true, dilation=1, dtype=, device=}): weight (in, out / groups,
-- k...) and bias (out) as PyTorch's, PyTorch's init (kaiming_uniform_(a = sqrt(5)); fan_in from
-- the weight's dim 2 times the kernel, as PyTorch computes it); forward F.conv_transpose{nd}d
local CONVT_OPTS = option_set("stride", "padding", "output_padding", "groups", "bias",
                              "dilation", "dtype", "device", "padding_mode")
local function conv_transpose_module(nd)
   local name = "ConvTranspose" .. nd .. "d"
   local fn = "conv_transpose" .. nd .. "d"
   local cls = Module:extend(name)
   M[name] = cls
   local function sz(v, what, min)
      if nd == 1 then
         local s = single(v)
         if s == nil then fail(name, what .. " must be a number or {n}, got " .. tostring(v)) end
         return { int_arg(name, s, what, min) }
      end
      return sizes_arg(name, v, what, min, nd)
   end
   function cls:__init(in_channels, out_channels, kernel_size, opts)
      opts = opts_arg(name, opts, CONVT_OPTS)
      int_arg(name, in_channels, "in_channels", 1)
      int_arg(name, out_channels, "out_channels", 1)
      local groups = int_arg(name, opts.groups or 1, "groups", 1)
      if in_channels % groups ~= 0 then fail(name, "in_channels must be divisible by groups") end
      if out_channels % groups ~= 0 then
         fail(name, "out_channels must be divisible by groups")
      end
      if opts.padding_mode ~= nil and opts.padding_mode ~= "zeros" then
         fail(name, "Only \"zeros\" padding mode is supported for " .. name)
      end
      local k = sz(kernel_size, "kernel_size", 1)
      self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
      self.stride = sz(opts.stride or 1, "stride", 1)
      self.padding = sz(opts.padding or 0, "padding", 0)
      self.output_padding = sz(opts.output_padding or 0, "output_padding", 0)
      self.dilation = sz(opts.dilation or 1, "dilation", 1)
      self.groups = groups
      local fk = param_opts(name, opts)
      local wsz = { in_channels, out_channels / groups }
      for i = 1, nd do wsz[i + 2] = k[i] end
      self:register_parameter("weight", creation.empty(wsz, fk))
      if opts.bias == nil or opts.bias then
         self:register_parameter("bias", creation.empty({ out_channels }, fk))
      else
         self:register_parameter("bias", nil)
      end
      self:reset_parameters()
   end
   cls.reset_parameters = Conv2d.reset_parameters
   -- PyTorch's _output_padding: the output_padding per dim that gives output_size (the nd
   -- spatial sizes, or all of the output's: N, C, spatial; C, spatial for unbatched input).
   -- Each size must lie in min..max, min the size with no output padding and max = min +
   -- stride - 1; the module's own output_padding is then ignored.
   local function sizes_list(t)
      local p = {}
      for i = 1, #t do p[i] = tostring(t[i]) end
      return "{" .. table.concat(p, ", ") .. "}"
   end
   function cls:_output_padding(x, output_size)
      if output_size == nil then return self.output_padding end
      if not T.is_tensor(x) then fail(name, "input: tensor expected, got " .. T.typename(x)) end
      if not T.is_sizes(output_size) then
         fail(name, "output_size must be a table of sizes, got " .. T.typename(output_size))
      end
      local xd = Tensor.dim(x)
      if xd ~= nd + 1 and xd ~= nd + 2 then
         fail(name, ("expected %dD (unbatched) or %dD (batched) input, got %dD input")
              :format(nd + 1, nd + 2, xd))
      end
      local non_spatial = xd == nd + 2 and 2 or 1
      local n = #output_size
      local first = 0
      if n == non_spatial + nd then first = non_spatial
      elseif n ~= nd then
         fail(name, ("for %dD input, output_size must have %d or %d elements (got %d)")
              :format(xd, nd, non_spatial + nd, n))
      end
      local want, mins, maxs, ins = {}, {}, {}, {}
      for i = 1, nd do
         local v = output_size[first + i]
         if type(v) ~= "number" or v % 1 ~= 0 then
            fail(name, "output_size must hold integers, got " .. tostring(v))
         end
         want[i] = v
         ins[i] = Tensor.size(x, xd - nd + i)
         mins[i] = (ins[i] - 1) * self.stride[i] - 2 * self.padding[i] +
                   self.dilation[i] * (self.kernel_size[i] - 1) + 1
         maxs[i] = mins[i] + self.stride[i] - 1
      end
      local res = {}
      for i = 1, nd do
         if want[i] < mins[i] or want[i] > maxs[i] then
            fail(name, ("requested an output size of %s, but valid sizes range from %s to %s " ..
                 "(for an input of %s)"):format(sizes_list(want), sizes_list(mins),
                 sizes_list(maxs), sizes_list(ins)))
         end
         res[i] = want[i] - mins[i]
      end
      return res
   end
   -- forward(x, output_size): output_size (optional) as PyTorch's: picks output_padding
   function cls:forward(x, output_size)
      local opad = self.output_padding
      if output_size ~= nil then opad = self:_output_padding(x, output_size) end
      return F[fn](x, self.weight, self.bias, { stride = self.stride, padding = self.padding,
                   output_padding = opad, groups = self.groups, dilation = self.dilation })
   end
   function cls:extra_repr()
      local function t(v)
         if nd == 1 then return single_str(v[1]) end
         return "(" .. table.concat(v, ", ") .. ")"
      end
      local function nz(v, d)
         for i = 1, nd do if v[i] ~= d then return true end end
         return false
      end
      local s = ("%d, %d, kernel_size=%s, stride=%s"):format(self.in_channels, self.out_channels,
         t(self.kernel_size), t(self.stride))
      if nz(self.padding, 0) then s = s .. ", padding=" .. t(self.padding) end
      if nz(self.output_padding, 0) then s = s .. ", output_padding=" .. t(self.output_padding) end
      if nz(self.dilation, 1) then s = s .. ", dilation=" .. t(self.dilation) end
      if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
      if self.bias == nil then s = s .. ", bias=False" end
      return s
   end
   return cls
end
conv_transpose_module(1)
conv_transpose_module(2)
conv_transpose_module(3)

-- keep the autograd module referenced (the Tensor methods the modules call are its wrappers)
M._autograd = A

-- the options check the other module files share (lumen.nn.layers_composed)
M._opts_arg = opts_arg

return M
