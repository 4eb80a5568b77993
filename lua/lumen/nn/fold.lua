-- lumen.nn.fold -- batch-norm folding for inference: a BatchNorm2d (BatchNorm3d) in evaluation mode
-- that follows a Conv2d (Conv3d) is a per-channel affine map,
-- y = (conv(x) - mean) / sqrt(var + eps) * gamma + beta,
-- so it can be folded into the convolution's weight and bias:
--    scale = gamma / sqrt(var + eps)
--    w'    = w * scale            (per output channel; w keeps its memory format)
--    b'    = (b - mean) * scale + beta
-- The folded model computes the same function (to rounding) with one pass over each activation
-- fewer. lm.models' ResNet blocks (2-D and video) then also run their ReLU and residual add in the
-- convolution's epilogue (Conv2d:forward / Conv3d:forward(x, {residual =, relu =})), so a
-- Bottleneck is three kernels.
--
--    lm.nn.utils.fuse_conv_bn_weights(w, b, mean, var, eps, gamma, beta) -> w', b'
--    lm.nn.utils.fuse_conv_bn_eval(conv, bn) -> a new Conv2d / Conv3d (conv and bn left alone)
--    lm.nn.fold_batch_norm(model) -> model, n   folds every Conv2d -> BatchNorm2d and
--                                               Conv3d -> BatchNorm3d pair in place
--
-- In evaluation mode with gradients off, a convolution followed by an activation the epilogue
-- knows (ReLU, ReLU6, SiLU, Hardswish, Hardsigmoid, Sigmoid, GELU: F.conv2d's act option) runs
-- the activation in the convolution's epilogue too: a Sequential (Conv2d, BatchNorm2d, SiLU),
-- folded or not (torchvision's Conv2dNormActivation in MobileNet and EfficientNet), is one
-- kernel, as the squeeze-and-excitation gates' two 1x1 convolutions with their activations are.
--
-- fold_batch_norm walks the module tree: Sequential containers fold adjacent (Conv2d,
-- BatchNorm2d) and (Conv3d, BatchNorm3d) children and put an Identity where the batch norm was;
-- a module class that knows its own data flow (lm.models' BasicBlock, Bottleneck, ResNet, the
-- video models' stems and BasicBlock) defines fold_batch_norm(self)
-- itself; any other module folds inside its children (a custom module with a conv and a batch
-- norm in its own forward is left as it is unless it defines fold_batch_norm). The model must
-- be in evaluation mode (model:eval()), else the call raises before changing anything. A pair
-- is left unfolded (the model still computes what it did) when the batch norm has no running
-- statistics (it normalizes with the batch's own, which no weight can express), when the
-- convolution is used in more than one place in the model, or when their tensors are not what
-- the formula needs. Folding is one-way and meant for inference: the batch norms' parameters
-- and buffers leave the model (and its state_dict), the convolutions gain a bias.
local Module = require("lumen.nn.module")
local layers = require("lumen.nn.layers")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local dtypes = require("lumen.dtype")
local creation = require("lumen.creation")
local Tensor = T.Tensor

local M = {}

-- raise "lumen.<fname>: <msg>", blaming the first caller outside lumen
local function fail(fname, msg) error("lumen." .. fname .. ": " .. msg, T.user_level()) end

-- the convolutions that fold: their batch norm's class name and their weight's rank
local FOLDS = { Conv2d = { "BatchNorm2d", 4 }, Conv3d = { "BatchNorm3d", 5 } }
local function conv_kind(m)
   return Module.is_module(m) and FOLDS[m:type_name()] and m:type_name() or nil
end

local function sizes_string(t) return "(" .. table.concat(Tensor.size(t), ", ") .. ")" end
local function requires_grad(t) return rawget(t, "requires_grad") == true end

-- a batch norm's eps: a finite non-negative number
local function eps_ok(eps)
   return type(eps) == "number" and eps == eps and eps >= 0 and eps ~= math.huge
end

local function tensor_or_nil(fname, v, what, allow_nil)
   if v == nil then
      if allow_nil then return nil end
      fail(fname, what .. ": tensor expected, got nil")
   end
   if not T.is_tensor(v) then
      fail(fname, what .. ": tensor expected, got " .. T.typename(v))
   end
   return v
end

-- fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b) -> w', b' (PyTorch's
-- torch.nn.utils.fuse_conv_bn_weights). conv_b, bn_w and bn_b may be nil (no bias: 0; no affine:
-- gamma 1, beta 0). The results are new tensors in conv_w's dtype; w' has conv_w's strides
-- (channels-last and channels_last_3d stay so), and requires grad as conv_w does.
function M.fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b)
   local fname = "fuse_conv_bn_weights"
   tensor_or_nil(fname, conv_w, "conv_w")
   tensor_or_nil(fname, conv_b, "conv_b", true)
   tensor_or_nil(fname, bn_rm, "bn_rm")
   tensor_or_nil(fname, bn_rv, "bn_rv")
   tensor_or_nil(fname, bn_w, "bn_w", true)
   tensor_or_nil(fname, bn_b, "bn_b", true)
   if not eps_ok(bn_eps) then
      fail(fname, "bn_eps must be a finite non-negative number, got " .. tostring(bn_eps))
   end
   if Tensor.dim(conv_w) < 1 then fail(fname, "conv_w must have an output-channel dimension") end
   local O = Tensor.size(conv_w, 1)
   local dt = Tensor.dtype(conv_w)
   if not Tensor.is_floating_point(conv_w) then
      fail(fname, "conv_w must be a floating-point tensor, got " .. tostring(dt))
   end
   for _, nv in ipairs({ { "conv_b", conv_b }, { "bn_rm", bn_rm }, { "bn_rv", bn_rv },
                         { "bn_w", bn_w }, { "bn_b", bn_b } }) do
      local v = nv[2]
      if v ~= nil and (Tensor.dim(v) ~= 1 or Tensor.size(v, 1) ~= O) then
         fail(fname, ("%s must be 1-D with %d elements (conv_w's output channels), got size %s")
              :format(nv[1], O, sizes_string(v)))
      end
      if v ~= nil and not Tensor.is_floating_point(v) then
         fail(fname, nv[1] .. " must be a floating-point tensor, got " ..
              tostring(Tensor.dtype(v)))
      end
   end
   local w, b = A.no_grad(function()
      local function as(v) return Tensor.to(v, dt) end
      local scale = Tensor.rsqrt(Tensor.add(as(bn_rv), bn_eps))
      if bn_w ~= nil then scale = Tensor.mul(scale, as(bn_w)) end
      local shape = { O }
      for _ = 2, Tensor.dim(conv_w) do shape[#shape + 1] = 1 end
      -- w * scale keeps w's layout (the elementwise output rule: the full-size operand decides)
      local fw = Tensor.mul(conv_w, Tensor.view(scale, shape))
      local fb
      if conv_b ~= nil then
         fb = Tensor.mul(Tensor.sub(as(conv_b), as(bn_rm)), scale)
      else
         fb = Tensor.mul(Tensor.neg(as(bn_rm)), scale)
      end
      if bn_b ~= nil then fb = Tensor.add(fb, as(bn_b)) end
      T.force(fw)                       -- computed now (not left deferred)
      T.force(fb)
      return fw, fb
   end)
   if requires_grad(conv_w) then
      Tensor.requires_grad_(w, true)
      Tensor.requires_grad_(b, true)
   end
   return w, b
end

-- modules that appear more than once in the model being folded (fold_batch_norm sets it for the
-- duration of the call): a convolution used in two places cannot take one place's batch norm
local shared = nil

local function vec_ok(v, O)
   return v == nil or (T.is_tensor(v) and Tensor.dim(v) == 1 and Tensor.size(v, 1) == O
                       and Tensor.is_floating_point(v))
end

-- why bn cannot be folded into conv (a message), or nil when it can. Everything that
-- fuse_conv_bn_weights would reject is checked here, so that a fold that starts cannot fail
-- halfway through a model.
local function cannot_fold(conv, bn)
   local cname = conv_kind(conv)
   if not cname then return "the first module is not a Conv2d or Conv3d" end
   local bname, rank = FOLDS[cname][1], FOLDS[cname][2]
   if not (Module.is_module(bn) and bn:type_name() == bname) then
      return "the second module is not a " .. bname .. " (the " .. cname .. "'s batch norm)"
   end
   if conv.training or bn.training then
      return "folding is for evaluation mode only (call model:eval() first)"
   end
   if bn.running_mean == nil or bn.running_var == nil then
      return "the " .. bname .. " has no running statistics (track_running_stats = false)"
   end
   if bn.num_features ~= conv.out_channels then
      return ("the %s has %d features but the %s %d output channels")
             :format(bname, bn.num_features, cname, conv.out_channels)
   end
   if shared and shared[conv] then
      return "the " .. cname .. " is used in more than one place in the model"
   end
   local w = conv.weight
   if not T.is_tensor(w) or Tensor.dim(w) ~= rank or not Tensor.is_floating_point(w) then
      return ("the %s's weight is not a %d-D floating-point tensor"):format(cname, rank)
   end
   local O = Tensor.size(w, 1)
   if not (vec_ok(conv.bias, O) and vec_ok(bn.running_mean, O) and vec_ok(bn.running_var, O)
           and vec_ok(bn.weight, O) and vec_ok(bn.bias, O)) then
      return ("the %s's statistics or parameters, or the %s's bias, are not 1-D " ..
              "floating-point tensors of the output channels"):format(bname, cname)
   end
   if not eps_ok(bn.eps) then
      return "the " .. bname .. "'s eps is not a finite non-negative number"
   end
   return nil
end

-- fold bn into conv (from src, conv itself by default): conv gets the new weight and bias
-- parameters, which require grad as src's weight does
local function fold_into(conv, bn, src)
   src = src or conv
   local w, b = M.fuse_conv_bn_weights(src.weight, src.bias, bn.running_mean, bn.running_var,
                                       bn.eps, bn.weight, bn.bias)
   local wg = requires_grad(src.weight)
   conv:register_parameter("weight", w)
   conv:register_parameter("bias", b)
   Tensor.requires_grad_(w, wg)
   Tensor.requires_grad_(b, wg)
end

-- fuse_conv_bn_eval(conv, bn) -> a new Conv2d (Conv3d) computing bn(conv(x)) (PyTorch's
-- torch.nn.utils.fuse_conv_bn_eval); conv and bn are not changed. Both must be in evaluation
-- mode, and bn must have running statistics.
function M.fuse_conv_bn_eval(conv, bn)
   local why = cannot_fold(conv, bn)
   if why then fail("fuse_conv_bn_eval", why) end
   -- the constructor draws initial weights: leave the random generator as it was
   local lm = require("lumen")
   local rng = lm.get_rng_state()
   local c = layers[conv_kind(conv)](conv.in_channels, conv.out_channels, conv.kernel_size,
                           { stride = conv.stride, padding = conv.padding,
                             dilation = conv.dilation, groups = conv.groups,
                             bias = false, dtype = Tensor.dtype(conv.weight) })
   lm.set_rng_state(rng)
   c:eval()
   fold_into(c, bn, conv)
   return c
end

-- fold_pair_(conv, bn) -> true when bn was folded into conv (in place), false (and the reason)
-- when it cannot be. For model classes that define their own fold_batch_norm.
function M.fold_pair_(conv, bn)
   local why = cannot_fold(conv, bn)
   if why then return false, why end
   fold_into(conv, bn)
   return true
end

-- fold_named_(module, conv_name, bn_name) -> true when module[bn_name] was folded into
-- module[conv_name]; an Identity (in evaluation mode) then takes the batch norm's place
function M.fold_named_(module, conv_name, bn_name)
   if not M.fold_pair_(module[conv_name], module[bn_name]) then return false end
   module:add_module(bn_name, layers.Identity():eval())   -- folding happens in eval mode
   return true
end

-- can every pair be folded? (a block folds all its pairs or none)
function M.can_fold_all(pairs_list)
   for _, p in ipairs(pairs_list) do
      if p[2] ~= nil and cannot_fold(p[1], p[2]) then return false end
   end
   return true
end

-- Folding per call, for models in evaluation mode that were not folded (lm.models' ResNet
-- blocks and stems, Sequential's (conv, batch norm) pairs): with gradients off and both modules
-- in evaluation mode, bn(conv(x)) (with the block's residual add and ReLU) runs as one
-- convolution whose weight and bias are folded for this call and freed after it. A forward then
-- reads and writes each activation once instead of three times; the price is one pass over the
-- weights. Measured on resnet50 batch 8 channels-last, 2 threads (bench/models.lua):
-- see docs/performance.md ("Batch norm through the convolution"). The results are those of the
-- folded model, equal to the unfolded ones to rounding (as nn.fold_batch_norm's).
-- Not when something watches the modules' own calls: a module whose forward was replaced on the
-- instance (lm.layout.check / trace do that), or a jit recording (which must see conv2d and
-- batch_norm as the model wrote them).
local recorder_state = nil
local function recording()
   if recorder_state == nil then recorder_state = package.loaded["lumen.jit.recorder"] end
   return recorder_state ~= nil and recorder_state.active > 0
end

-- may a model give a block's intermediate t back to the allocator at once (t:free()) once the
-- next operation has read it? Not while autograd holds it (requires_grad) or a jit recording
-- may still refer to it.
function M.releasable(t)
   return t ~= nil and rawget(t, "requires_grad") ~= true and not recording()
end

-- has no module of `block` (itself included) had its forward replaced on the instance? A
-- wrapper there (lm.layout.trace, a user's capture of features) may keep what its module made
-- or read, so the block must not free its intermediates under it
function M.unwrapped(block)
   for _, m in ipairs(block:modules()) do
      if rawget(m, "forward") ~= nil then return false end
   end
   return true
end

-- can the (conv, bn) pairs (and the other modules listed) run folded in this call?
function M.eval_foldable(pairs_list, others)
   if A.is_grad_enabled() or recording() then return false end
   for _, p in ipairs(pairs_list) do
      local conv, bn = p[1], p[2]
      if rawget(conv, "forward") ~= nil or rawget(bn, "forward") ~= nil
         or cannot_fold(conv, bn) then
         return false
      end
   end
   if others then
      for _, m in ipairs(others) do
         if rawget(m, "forward") ~= nil then return false end
      end
   end
   return true
end

-- the dtype lm.autocast makes a convolution on x's device run in, or nil outside a region
local function autocast_dtype(x)
   local AC = package.loaded["lumen.autocast"]
   if AC == nil or not AC.is_active() then return nil end
   local dev = Tensor.device(x):match("^cuda") and "cuda" or "cpu"
   if not AC.is_autocast_enabled(dev) then return nil end
   return AC.get_autocast_dtype(dev)
end

-- the activation modules a convolution's epilogue can run (F.conv2d's act option), by class:
-- the act name, or a function of the module giving it
local ACT_MODULES = {
   ReLU = "relu", ReLU6 = "relu6", SiLU = "silu", Hardswish = "hardswish",
   Hardsigmoid = "hardsigmoid", Sigmoid = "sigmoid",
   GELU = function(m)
      if m.approximate == "tanh" then return "gelu_tanh" end
      return m.approximate == "none" and "gelu" or nil
   end,
}

-- module_act(m) -> the name of the epilogue activation (F.conv2d's act) that computes what the
-- module m computes, or nil: a plain ReLU, ReLU6, SiLU, Hardswish, Hardsigmoid, Sigmoid or
-- GELU whose forward was not replaced on the instance (a wrapper there must see the call)
function M.module_act(m)
   if not Module.is_module(m) or rawget(m, "forward") ~= nil then return nil end
   local a = ACT_MODULES[m:type_name()]
   if type(a) == "function" then a = a(m) end
   return a
end

-- fuse_act(a) -> {act = a}, one table per name (the second argument of Conv2d:forward, read
-- only: no table made per call)
local FUSE_ACT = {}
function M.fuse_act(a)
   local t = FUSE_ACT[a]
   if t == nil then
      t = { act = a }
      FUSE_ACT[a] = t
   end
   return t
end

-- conv_act(conv, act_module) -> the act name when conv's output may go through act_module in
-- conv's epilogue in this call (gradients off, no jit recording, neither module's forward
-- replaced, an activation module_act knows), else nil. For model classes that fuse their own
-- (convolution, activation) pairs in evaluation (lm.models' squeeze-and-excitation gates).
function M.conv_act(conv, act_module)
   if A.is_grad_enabled() or recording() or not conv_kind(conv)
      or rawget(conv, "forward") ~= nil then
      return nil
   end
   return M.module_act(act_module)
end

local F = nil
-- bn(conv(x)), with fuse = {residual =, relu =, act =} applied after it, as one convolution (the
-- pair has passed eval_foldable)
function M.conv_bn(conv, bn, x, fuse)
   F = F or require("lumen.functional")
   local w, rv = conv.weight, bn.running_var
   local wdt = Tensor.dtype(w)
   -- a 16-bit model (m:to(lm.bfloat16)): scale, shift and w * scale in float32, rounded once to
   -- the weight's dtype, as close as the batch norm's own float32 arithmetic gets
   local low = wdt == dtypes.float16 or wdt == dtypes.bfloat16
   local dt = low and dtypes.float32 or wdt
   local function as(v) return Tensor.to(v, dt) end
   local scale = Tensor.rsqrt(Tensor.add(as(rv), bn.eps))
   if bn.weight ~= nil then scale = Tensor.mul(scale, as(bn.weight)) end
   local shape = { Tensor.size(w, 1) }
   for _ = 2, Tensor.dim(w) do shape[#shape + 1] = 1 end
   local sv = Tensor.view(scale, shape)
   local fw
   local cast_to = not low and wdt == dtypes.float32 and autocast_dtype(x)
   if cast_to and cast_to ~= wdt then
      -- under autocast the convolution would cast the folded weight to the region's dtype:
      -- make it in that dtype at once (w * scale rounded once, as the cast would; one pass over
      -- the weights instead of two)
      fw = creation.empty_like(w, { dtype = cast_to })
      T.binary(T.BINARY.MUL, w, sv, 1, "conv_bn", fw._c, 1)
   else
      fw = Tensor.mul(as(w), sv)
   end
   local fb
   if conv.bias ~= nil then
      fb = Tensor.mul(Tensor.sub(as(conv.bias), as(bn.running_mean)), scale)
   else
      fb = Tensor.mul(Tensor.neg(as(bn.running_mean)), scale)
   end
   if bn.bias ~= nil then fb = Tensor.add(fb, as(bn.bias)) end
   if low then
      local f32 = fw
      fw, fb = Tensor.to(f32, wdt), Tensor.to(fb, wdt)
      Tensor.free(f32)
   end
   local y = F[conv._functional](x, fw, fb, { stride = conv.stride, padding = conv.padding,
                                  dilation = conv.dilation, groups = conv.groups,
                                  residual = fuse and fuse.residual, relu = fuse and fuse.relu,
                                  act = fuse and fuse.act })
   -- nobody else holds the folded weight: give its block back now, while it is in cache
   Tensor.free(fw)
   return y
end

-- bn_relu(bn, relu, x [, residual]) -> relu(bn(x) [+ residual]), the tail of a ResNet block
-- unfolded (training, or evaluation before folding): when bn is a batch norm that takes the fused
-- options (BatchNorm1d/2d/3d, SyncBatchNorm) and relu a plain nn.ReLU, one fused batch norm
-- (F.batch_norm's residual / relu options): one pass over the activation forward instead of three
-- (bn, add, relu_) and one backward (the relu's mask read from the saved result, the residual's
-- gradient written in the same pass) instead of three. Anything else in their place (another
-- activation, a norm of another kind) runs as the modules themselves, op by op.
local FUSED_BN = { BatchNorm1d = true, BatchNorm2d = true, BatchNorm3d = true,
                   SyncBatchNorm = true }
local RELU_ONLY = { relu = true }
function M.bn_relu(bn, relu, x, residual)
   if not Module.is_module(bn) then
      fail("nn.utils.bn_relu", "bn: Module expected, got " .. T.typename(bn))
   end
   if not Module.is_module(relu) then
      fail("nn.utils.bn_relu", "relu: Module expected, got " .. T.typename(relu))
   end
   if FUSED_BN[bn:type_name()] and relu:type_name() == "ReLU" then
      local y = bn:forward(x, residual ~= nil and { residual = residual, relu = true } or RELU_ONLY)
      -- lm.layout.check sets this while it runs: the ReLU gets a row, marked fused into bn
      local hook = M._fused_hook
      if hook ~= nil then hook(relu, bn) end
      return y
   end
   local y = bn(x)
   if residual ~= nil then y = y + residual end
   return relu(y)
end

-- the default: fold inside each child
function Module:fold_batch_norm()
   local n = 0
   for _, nm in ipairs(self:named_children()) do n = n + nm[2]:fold_batch_norm() end
   return n
end

-- Sequential: adjacent (Conv2d, BatchNorm2d) and (Conv3d, BatchNorm3d) children fold, an
-- Identity takes the batch norm's place (so indices and the other children's names stay); the
-- rest fold inside themselves
function layers.Sequential:fold_batch_norm()
   local n = 0
   local kids = self:named_children()
   local i = 1
   while i <= #kids do
      local m = kids[i][2]
      local nxt = kids[i + 1]
      if nxt and conv_kind(m) and M.fold_named_(self, kids[i][1], nxt[1]) then
         n = n + 1
         i = i + 2
      else
         n = n + m:fold_batch_norm()
         i = i + 1
      end
   end
   return n
end

-- Sequential in evaluation mode with gradients off: an adjacent (Conv2d, BatchNorm2d) or
-- (Conv3d, BatchNorm3d) pair runs folded for the call (M.conv_bn); a convolution (folded or
-- not) or a Linear followed by an activation the epilogue knows (M.module_act: torchvision's
-- Conv2dNormActivation, with Identity where nn.fold_batch_norm took the batch norm out;
-- ConvNeXt's Linear -> GELU) runs that activation in the convolution's (the GEMM's) epilogue;
-- the rest as they are.
local function plain_identity(m)
   return m ~= nil and m:type_name() == "Identity" and rawget(m, "forward") == nil
end
-- the activation after the convolution at kids[j] on (Identity modules skipped): its name and
-- the index after it, or nil
local function act_after(kids, j)
   while plain_identity(kids[j]) do j = j + 1 end
   local a = kids[j] ~= nil and M.module_act(kids[j])
   if a then return a, j + 1 end
   return nil
end
-- An in-place activation whose input autograd differentiates saves a copy of that input for
-- its backward (F.silu(x, true): one pass to copy, one to overwrite). Inside a Sequential whose
-- previous child is a batch norm or a convolution as written (their result is a fresh tensor
-- that only this loop holds: nothing else can see it change), the out-of-place form computes the
-- same values into a new tensor and saves its input as is, two passes fewer. torchvision's
-- Conv2dNormActivation with SiLU(inplace) (EfficientNet) or Hardswish(inplace) (MobileNet V3):
-- EfficientNet-B0's 33 copies took 21 ms of its training step (Zen 4, 2 threads, verbose
-- kernel time; the out-of-place activations then write fresh memory, about a third of that
-- back); the step, this path against the in-place one alternated in one process, 8 rounds:
-- 281.2 -> 272.4 ms (MobileNet V3: 21 copies, 4.4 ms; the step inside the noise). The
-- activation modules that save their input (ReLU6 saves nothing: relu6's gradient comes from
-- its result); a module whose forward was replaced runs as written.
local COPYING_ACT = { SiLU = "silu", Hardswish = "hardswish", Hardsigmoid = "hardsigmoid",
                      Mish = "mish" }
local FRESH = { Conv1d = true, Conv2d = true, Conv3d = true, BatchNorm1d = true,
                BatchNorm2d = true, BatchNorm3d = true, SyncBatchNorm = true }
local function out_of_place_act(m, prev)
   if not (Module.is_module(m) and Module.is_module(prev)) then return nil end
   local fn = COPYING_ACT[m:type_name()]
   if fn == nil or m.inplace ~= true or rawget(m, "forward") ~= nil then return nil end
   if not FRESH[prev:type_name()] or rawget(prev, "forward") ~= nil then return nil end
   return fn
end

local seq_forward = layers.Sequential.forward
function layers.Sequential:forward(x)
   if self.training or A.is_grad_enabled() then
      if not A.is_grad_enabled() or recording() then
         return seq_forward(self, x)
      end
      F = F or require("lumen.functional")
      local kids = self:children()
      for i = 1, #kids do
         local m = kids[i]
         local fn = i > 1 and A.needs(x) and out_of_place_act(m, kids[i - 1])
         if fn then x = F[fn](x) else x = m(x) end
      end
      return x
   end
   local kids = self:children()
   local i, n = 1, #kids
   local watched = recording()
   while i <= n do
      local m, nxt = kids[i], kids[i + 1]
      if nxt ~= nil and conv_kind(m) and M.eval_foldable({ { m, nxt } }) then
         local act, after = act_after(kids, i + 2)
         if act then
            x = M.conv_bn(m, nxt, x, M.fuse_act(act))
            i = after
         else
            x = M.conv_bn(m, nxt, x)
            i = i + 2
         end
      else
         local act, after
         if (conv_kind(m) or (Module.is_module(m) and m:type_name() == "Linear"))
            and not watched and rawget(m, "forward") == nil then
            act, after = act_after(kids, i + 1)
         end
         if act then
            x = m:forward(x, M.fuse_act(act))
            i = after
         else
            x = m(x)
            i = i + 1
         end
      end
   end
   return x
end

-- conv_bn_add(conv, bn, x, residual [, relu]) -> residual + bn(conv(x)), then relu when given:
-- the tail of a residual block (MobileNet's inverted residuals, EfficientNet's MBConv in
-- evaluation, RegNet's bottleneck), conv a convolution, bn its batch norm or the Identity
-- nn.fold_batch_norm left in its place, relu nil or a plain nn.ReLU. The add (and the ReLU) run
-- inside one of them, as lm.models' ResNet blocks do: in the convolution's epilogue when folded
-- or (evaluation, gradients off) folded for the call, else, with the ReLU, in the batch norm
-- (F.batch_norm's residual / relu options: one pass over the activation forward and one
-- backward instead of three). Anything else (a wrapped forward, a jit recording in evaluation,
-- other modules, training without the ReLU) runs as written. The caller checks that nothing
-- wraps the block's modules (M.unwrapped).
function M.conv_bn_add(conv, bn, x, residual, relu)
   if conv_kind(conv) and rawget(conv, "forward") == nil and Module.is_module(bn)
      and (relu == nil or M.module_act(relu) == "relu") then
      if plain_identity(bn) then
         return conv:forward(x, relu and { residual = residual, relu = true }
                                or { residual = residual })
      end
      if not bn.training and M.eval_foldable({ { conv, bn } }, relu and { relu } or nil) then
         return M.conv_bn(conv, bn, x, relu and { residual = residual, relu = true }
                                       or { residual = residual })
      end
      -- the batch norm's residual option only with the ReLU: without it the fused backward
      -- writes the residual's gradient (a copy of grad_out) where the add's passes grad_out
      -- itself on (MobileNet V3's training step, the two alternated: 1.03-1.09x slower)
      if relu and FUSED_BN[bn:type_name()] and rawget(bn, "forward") == nil then
         return M.bn_relu(bn, relu, conv(x), residual)
      end
   end
   local y = residual + bn(conv(x))
   if relu then return relu(y) end
   return y
end

-- block_add(seq, x [, residual [, relu]]) -> seq(x) + residual (residual defaults to x), then
-- relu when given: seq a block's Sequential ending in a convolution and its batch norm, either
-- as its last two children (MobileNet V2's inverted residual) or as a last child that is a
-- Sequential of the two (torchvision's Conv2dNormActivation without activation: MobileNet V3,
-- EfficientNet, RegNet's "c"). The children before that run as they are; the add (and the
-- ReLU) through conv_bn_add.
function M.block_add(seq, x, residual, relu)
   if residual == nil then residual = x end
   local kids = seq:children()
   local n = #kids
   local last = kids[n]
   local conv, bn, body
   local pair = Module.is_module(last) and rawget(last, "forward") == nil and last:children()
                or {}
   if #pair == 2 and conv_kind(pair[1]) then
      conv, bn, body = pair[1], pair[2], n - 1
   elseif n >= 2 and conv_kind(kids[n - 1]) then
      conv, bn, body = kids[n - 1], last, n - 2
   end
   if conv == nil then
      local y = residual + seq(x)
      if relu then return relu(y) end
      return y
   end
   local h = x
   for i = 1, body do h = kids[i](h) end
   return M.conv_bn_add(conv, bn, h, residual, relu)
end

-- fold_batch_norm(model) -> model, n: folds every foldable Conv2d -> BatchNorm2d and
-- Conv3d -> BatchNorm3d pair in place
-- (n: how many). The model must be in evaluation mode.
function M.fold_batch_norm(model)
   local fname = "fold_batch_norm"
   if not Module.is_module(model) then
      fail(fname, "expected a Module, got " .. T.typename(model))
   end
   for _, pm in ipairs(model:named_modules()) do
      if pm[2].training then
         fail(fname, "the model is in training mode" .. (pm[1] ~= "" and " (module '" .. pm[1]
              .. "')" or "") .. "; call model:eval() first: folding uses the running statistics")
      end
   end
   -- how often each module is some module's child (the model itself counts once)
   local uses = { [model] = 1 }
   for _, pm in ipairs(model:named_modules()) do
      for _, nm in ipairs(pm[2]:named_children()) do uses[nm[2]] = (uses[nm[2]] or 0) + 1 end
   end
   shared = {}
   for m, k in pairs(uses) do
      if k > 1 then shared[m] = true end
   end
   local ok, n = pcall(model.fold_batch_norm, model)
   shared = nil
   if not ok then error(n, 0) end
   return model, n
end

-- scale_add(sd, scale, y, x) -> x + sd(scale * y): a residual block's layer-scaled tail
-- (ConvNeXt's CNBlock: scale a per-channel C x 1 x 1 parameter, sd its StochasticDepth). Where
-- nothing records or differentiates the call, sd is the identity (evaluation, or p = 0) and no
-- wrapper replaced its forward, it is one pass, x:addcmul(scale, y), with the bits of the two
-- (scale * y rounded, then the add); else it runs as written. ConvNeXt-tiny's 18 blocks, batch 8:
-- the multiply and the add took 16.7 ms of an inference's 443 (LUMEN_VERBOSE)
function M.scale_add(sd, scale, y, x)
   if not A.is_grad_enabled() and not recording() and rawget(sd, "forward") == nil
      and (not sd.training or sd.p == 0) then
      return Tensor.addcmul(x, scale, y)
   end
   return sd(scale * y) + x
end

return M
