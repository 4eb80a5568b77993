-- lm.models.r3d_18, mc3_18, r2plus1d_18 (models/video_resnet.lua): torchvision's video ResNets.
-- state_dict keys, shapes, dtypes and parameter counts against torchvision's
-- (spec/fixtures/models/torchvision.lua, gen.py); logits, running statistics and gradients
-- against PyTorch on formula weights (spec/fixtures/models/video.lua, gen_video.py: every
-- parameter and buffer is a closed formula of its state_dict index, evaluated here bit for bit
-- as the generator does, so the 130 MB of weights are never stored), in NCDHW and after
-- lm.to_channels_last (channels_last_3d), evaluation and training mode, float32 and (the
-- gradients) float64; a channels_last_3d SGD step whose weight gradients are channels_last_3d;
-- lm.layout.check; batch-norm folding (nn.fold_batch_norm) against the evaluation-mode model;
-- initialisation; option errors.

local H = require("spec.helpers")
local lm = H.lm
local F, nn = lm.F, lm.nn

local TV = dofile("spec/fixtures/models/torchvision.lua")
local FX = dofile("spec/fixtures/models/video.lua")
local CL3 = lm.channels_last_3d
local NAMES = { "r3d_18", "mc3_18", "r2plus1d_18" }

local on_cuda = lm.get_default_device():match("^cuda") ~= nil

local function rel_err(a, b)
   local ad, bd = a:double(), b:double()
   local s = bd:abs():max():item()
   if s == 0 then s = 1 end
   return (ad - bd):abs():max():item() / s
end

local function count(model, type_name)
   local n = 0
   for _, m in ipairs(model:modules()) do
      if m:type_name() == type_name then n = n + 1 end
   end
   return n
end

-- gen_video.py's formula: u = ((7 j^2 + 131 j + 977 (p + 1)) mod 10007) / 10007 - 0.5 with
-- j = i mod 10007, in float64 (every integer step exact), then each kind's affine map and a cast
-- to float32. u repeats with period 10007 in i: the first period is computed and tiled.
local MOD = 10007
local function formula(n, p, map)
   local m = math.min(n, MOD)
   local j = lm.arange(m, { dtype = lm.float64 })
   local u = (j * j * 7 + j * 131 + 977 * (p + 1)):fmod(MOD) / MOD - 0.5
   local v = map(u):float()
   if n > m then
      local k = math.ceil(n / MOD)
      v = v:view({ 1, MOD }):expand({ k, MOD }):reshape({ k * MOD }):narrow(1, 1, n)
   end
   return v
end

local function prod(sizes)
   local n = 1
   for _, s in ipairs(sizes) do n = n * s end
   return n
end

-- the value of state_dict entry `key` (0-based index p) of the given sizes
local function formula_value(key, sizes, p)
   local n = prod(sizes)
   local leaf = key:match("([^.]+)$")
   local map
   if leaf == "weight" and #sizes >= 2 then
      local scale = 2 * math.sqrt(6 / (n / sizes[1]))           -- fan_in = n / out
      map = function(u) return u * scale end
   elseif leaf == "weight" or leaf == "running_var" then
      map = function(u) return u * 0.5 + 1 end
   elseif leaf == "bias" or leaf == "running_mean" then
      map = function(u) return u * 0.2 end
   else
      error("no formula for " .. key)
   end
   return formula(n, p, map):view(sizes)
end

-- every floating-point entry of the model's state_dict from the formula (float32 values, also in
-- a float64 model, as gen_video.py converts its float32 model; in place: the tensors keep their
-- memory format); num_batches_tracked back to 0
local function set_formula(model)
   lm.no_grad(function()
      for p, kv in ipairs(model:state_entries()) do
         local key, t = kv[1], kv[2]
         if t:is_floating_point() then
            t:copy_(formula_value(key, t:size(), p - 1))       -- float32 values, as PyTorch's
         else
            t:zero_()
         end
      end
   end)
   model:zero_grad()
end

local function formula_input()
   local s = FX.input
   return formula(prod(s), 100000, function(u) return u * 2 end):view(s)
end

local function fixture_logits(name, mode)
   return lm.tensor(FX[name][mode]):view({ FX.input[1], FX.num_classes })
end

local function target()
   local t = {}
   for i, v in ipairs(FX.target) do t[i] = v + 1 end     -- lumen's classes are 1-based
   return lm.tensor(t, { dtype = lm.int64 })
end

-- the running statistics the training-mode forward left, against PyTorch's (first 6 channels)
local function check_stats(name, model, tag)
   local sd = model:state_dict()
   for key, ref in pairs(FX[name].stats) do
      local got = sd[key]:narrow(1, 1, #ref)
      local e = (got:double() - lm.tensor(ref, { dtype = lm.float64 })):abs():max():item()
      assert.is_true(e < 1e-5, ("%s %s %s: max difference %g"):format(name, tag, key, e))
   end
end

-- gradients after cross_entropy(train logits):backward(), against PyTorch's float64 ones (norm,
-- largest element and six elements: gen_video.py).
-- float32 (f64 = false): fc's and the last convolution's, within 1e-4 (of the norm, of the
-- largest element) plus 10 times what float32 costs PyTorch itself there (f32_norm, f32_dev).
-- Not the stem's: a gradient that deep crosses every ReLU, and float32 rounding flips the odd
-- pre-activation that is within ~1e-6 of zero (mc3_18 in channels_last_3d has one in
-- layer3.1.conv1, |x| = 2.5e-6, which moves the stem's gradient by 1 % of its largest element;
-- r2plus1d_18's stem gradient moves by 0.2 % in PyTorch's own float32). That is float32, not an
-- error: the float64 run checks every gradient, the stem's included.
-- float64 (f64 = true): every recorded gradient within 1e-9 relative (they agree to ~1e-12).
local function check_grads(name, model, tag, f64)
   local params = {}
   for _, np in ipairs(model:named_parameters()) do params[np[1]] = np[2] end
   for key, ref in pairs(FX[name].grads) do
      if f64 or not key:match("^stem") then
         local g = params[key].grad
         assert.is_not_nil(g, key)
         local gd = g:contiguous():double():view({ -1 })
         local norm = math.sqrt((gd * gd):sum():item())
         local en = math.abs(norm - ref.norm)
         local got = gd:narrow(1, ref.at + 1, #ref.values)
         local ev = (got - lm.tensor(ref.values, { dtype = lm.float64 })):abs():max():item()
         if os.getenv("VIDEO_SPEC_VERBOSE") then
            print(("%s %s %s: norm off by %.3g (PyTorch float32 %.3g), elements by %.3g (%.3g)")
                  :format(name, tag, key, en, ref.f32_norm, ev, ref.f32_dev))
         end
         local tn = f64 and 1e-9 * ref.norm or 1e-4 * ref.norm + 10 * ref.f32_norm
         local tv = f64 and 1e-9 * ref.amax or 1e-4 * ref.amax + 10 * ref.f32_dev
         assert.is_true(en <= tn, ("%s %s %s: gradient norm %.12g, PyTorch %.12g")
                        :format(name, tag, key, norm, ref.norm))
         assert.is_true(ev <= tv, ("%s %s %s: gradient elements off by %g (largest %g)")
                        :format(name, tag, key, ev, ref.amax))
      end
   end
end

describe("lm.models video ResNets", function()
   after_each(function() collectgarbage() end)

   -- one model of each kind, built once and used by the tests below in their order (building
   -- one draws its ~30 M initial weights at random, the slowest part of some tests)
   local built = {}
   local function model(name)
      built[name] = built[name] or lm.models[name]()
      return built[name]
   end

   it("has the three constructors", function()
      for _, name in ipairs(NAMES) do assert.is_function(lm.models[name], name) end
   end)

   for _, name in ipairs(NAMES) do
      it(name .. ": torchvision's keys, shapes, dtypes and parameter counts", function()
         local m = model(name)
         local fx = TV[name]
         local entries = m:state_entries()
         assert.are.equal(#fx.keys, #entries, name .. ": number of state_dict keys")
         for i, k in ipairs(fx.keys) do
            local key, t = entries[i][1], entries[i][2]
            assert.are.equal(k[1], key, name .. ": key " .. i)
            H.assert_format_name(t:dtype(), k[2], name .. ": " .. key)
            local sizes = {}
            for j = 3, #k do sizes[#sizes + 1] = k[j] end
            H.assert_sizes(t, sizes, name .. ": " .. key)
         end
         local np, nb = 0, 0
         for _, p in ipairs(m:parameters()) do np = np + p:numel() end
         for _, b in ipairs(m:buffers()) do nb = nb + b:numel() end
         assert.are.equal(fx.params, np, name .. ": parameter elements")
         assert.are.equal(fx.buffers, nb, name .. ": buffer elements")
         assert.are.equal(fx.nparams, #m:parameters(), name .. ": parameter tensors")
      end)
   end

   it("initialises like torchvision (kaiming fan_out convs, BN 1 and 0, fc normal(0, 0.01))",
      function()
      local m = model("r3d_18")
      assert.are.equal(64, m.stem[2].weight:sum():item())
      assert.are.equal(0, m.stem[2].bias:abs():sum():item())
      assert.are.equal(0, m.stem[2].running_mean:abs():sum():item())
      assert.are.equal(64, m.stem[2].running_var:sum():item())
      local w = m.stem[1].weight                    -- 64 x 3 x 3 x 7 x 7: fan_out 64 * 147
      local std = math.sqrt(((w * w):mean()):item())
      assert.is_true(math.abs(std - math.sqrt(2 / (64 * 147))) < 0.002, tostring(std))
      w = m.layer4[2].conv2[1].weight               -- fan_out 512 * 27
      std = math.sqrt(((w * w):mean()):item())
      assert.is_true(math.abs(std - math.sqrt(2 / (512 * 27))) < 0.001, tostring(std))
      local fw = m.fc.weight
      assert.is_true(math.abs(math.sqrt(((fw * fw):mean()):item()) - 0.01) < 0.001)
      assert.are.equal(0, m.fc.bias:abs():sum():item())
      local r = model("r2plus1d_18")
      assert.are.equal(45, r.stem[2].weight:sum():item())
      -- torchvision's midplanes: (in * out * 27) // (in * 9 + 3 * out), once per block (from
      -- the block's inplanes and planes: conv2 has conv1's)
      assert.are.equal(144, r.layer1[1].conv1[1][2].num_features)
      assert.are.equal(230, r.layer2[1].conv1[1][2].num_features)
      assert.are.equal(230, r.layer2[1].conv2[1][2].num_features)
      assert.are.equal(288, r.layer2[2].conv1[1][2].num_features)
      assert.are.equal(1152, r.layer4[2].conv2[1][2].num_features)
   end)

   it("num_classes changes the classifier; bad options are errors", function()
      for _, name in ipairs(NAMES) do
         for _, bad in ipairs({ 0, 1.5, "x" }) do
            H.assert_error_like("models." .. name, "num_classes", lm.models[name],
                                { num_classes = bad })
         end
         H.assert_error_like("models." .. name, "opts must be a table", lm.models[name], 42)
         H.assert_error_like("models." .. name, "unknown option 'groups'", lm.models[name],
                             { groups = 2 })
         H.assert_error_like("models." .. name, "zero_init_residual", lm.models[name],
                             { zero_init_residual = 1 })
      end
      -- zero_init_residual is accepted as torchvision accepts it (it touches only Bottleneck
      -- blocks: none here)
      local m = lm.models.mc3_18({ num_classes = 7, zero_init_residual = true })
      H.assert_sizes(m.fc.weight, { 7, 512 })
      H.assert_sizes(m.fc.bias, { 7 })
      assert.are.equal(128, m.layer2[1].conv2[2].weight:sum():item())
   end)

   -- F.conv3d and the 3-D pools have no CUDA kernels: the forwards run on the CPU and sim:N
   for _, name in ipairs(on_cuda and {} or NAMES) do
      it(name .. ": PyTorch's logits, statistics and gradients, NCDHW then channels_last_3d, " ..
         "and a channels_last_3d SGD step", function()
         local m = model(name)
         local x = formula_input()
         for _, fmt in ipairs({ lm.contiguous_format, CL3 }) do
            local tag = tostring(fmt)
            set_formula(m)
            if fmt == CL3 then
               lm.to_channels_last(m)
               x = x:to(CL3)
               assert.is_true(m.stem[1].weight:is_contiguous(CL3))
            end
            m:eval()
            local y = lm.no_grad(function() return m(x) end)
            local e = rel_err(y, fixture_logits(name, "eval"))
            assert.is_true(e < 1e-3, ("%s %s eval: relative error %g"):format(name, tag, e))
            m:train()
            local t = m(x)
            e = rel_err(t, fixture_logits(name, "train"))
            assert.is_true(e < 1e-3, ("%s %s train: relative error %g"):format(name, tag, e))
            check_stats(name, m, tag)
            local loss = F.cross_entropy(t, target())
            e = math.abs(loss:item() - FX[name].loss) / FX[name].loss
            assert.is_true(e < 1e-4, ("%s %s loss: relative error %g"):format(name, tag, e))
            loss:backward()
            check_grads(name, m, tag)
         end
         -- the channels_last_3d model's gradients are channels_last_3d; one SGD step keeps the
         -- weights so and changes them
         local w5 = {}
         for _, np in ipairs(m:named_parameters()) do
            local p = np[2]
            if p:dim() == 5 then
               assert.is_true(p.grad:is_contiguous(CL3), np[1] .. ".grad: " .. H.describe(p.grad))
               w5[#w5 + 1] = { np[1], p, p:clone() }
            end
         end
         assert.is_true(#w5 > 0)
         local opt = lm.optim.SGD(m:parameters(), { lr = 0.01, momentum = 0.9 })
         opt:step()
         for _, e in ipairs(w5) do
            assert.is_true(e[2]:is_contiguous(CL3), e[1] .. " after the step")
            assert.is_false(e[2]:equal(e[3]), e[1] .. " did not change")
         end
         m:eval()
         local y = lm.no_grad(function() return m(x) end)
         local amax = y:abs():max():item()
         assert.is_true(amax == amax and amax < math.huge, "logits after the step: " .. amax)
         -- lm.layout.check: every layer keeps channels_last_3d, forward and backward, and the
         -- 5-D parameter gradients are channels_last_3d
         m:train()
         local r = lm.layout.check(m, x, { backward = true })
         assert.is_true(r.ok, tostring(r))
      end)

      it(name .. ": float64 channels_last_3d gradients == PyTorch's float64 (1e-9)", function()
         local m = model(name):double()
         set_formula(m)
         lm.to_channels_last(m)
         m:train()
         local t = m(formula_input():double():to(CL3))
         H.assert_dtype(t, lm.float64)
         F.cross_entropy(t, target()):backward()
         check_grads(name, m, "float64 channels_last_3d", true)
         for _, np in ipairs(m:named_parameters()) do
            if np[2]:dim() == 5 then
               assert.is_true(np[2].grad:is_contiguous(CL3), np[1] .. ".grad")
            end
         end
      end)

      it(name .. ": folded (every BatchNorm3d) == evaluation mode, channels_last_3d kept",
         function()
         local m = model(name):float()
         built[name] = nil                          -- folding is the model's last use
         set_formula(m)
         m:eval()
         lm.to_channels_last(m)
         local x = formula_input():to(CL3)
         local ref = lm.no_grad(function() return m(x) end)
         local nbn = count(m, "BatchNorm3d")
         local _, n = nn.fold_batch_norm(m)
         assert.are.equal(nbn, n)
         assert.are.equal(0, count(m, "BatchNorm3d"))
         local y = lm.no_grad(function() return m(x) end)
         local e = rel_err(y, ref)
         assert.is_true(e < 1e-4, name .. " folded: relative error " .. e)
         for _, np in ipairs(m:named_parameters()) do
            if np[2]:dim() == 5 then
               assert.is_true(np[2]:is_contiguous(CL3), np[1])
            end
         end
         -- the stems and blocks run the fused forward: their ReLU modules are not called
         local Boom = nn.Module:extend("Boom")
         function Boom:forward() error("the unfolded forward ran") end
         for _, mm in ipairs(m:modules()) do
            local ty = mm:type_name()
            if ty == "BasicBlock" or ty == "BasicStem" or ty == "R2Plus1dStem" then
               assert.is_true(mm.folded, ty)
            end
            if ty == "BasicBlock" then mm.relu = Boom() end
            if ty == "BasicStem" or ty == "R2Plus1dStem" then mm:add_module("2", Boom()) end
         end
         local y2 = lm.no_grad(function() return m(x) end)
         assert.is_true(rel_err(y2, ref) < 1e-4)
         -- no batch-norm entries left; every convolution has a bias
         local keys = {}
         for _, k in ipairs(m:state_keys()) do
            assert.is_nil(k:find("running", 1, true), k)
            keys[k] = true
         end
         assert.is_true(keys["stem.0.bias"])
         assert.is_true(keys["layer1.0.conv2.0.bias"] or keys["layer1.0.conv2.0.3.bias"])
      end)
   end
end)
