-- spec/model_families_spec.lua -- issue 40's model families (MobileNet V2/V3, EfficientNet,
-- ConvNeXt, RegNet, ShuffleNet V2) as torchvision builds them.
--
-- Always (no PyTorch needed; small inputs, a few seconds per model):
--   * unknown options and bad values are clear errors;
--   * lm.to_channels_last, then lm.layout.check forward and backward is clean;
--   * a channels-last training step (float32) against the same step in float64 (contiguous):
--     loss and gradients close, every 4-D weight and gradient channels-last;
--   * evaluation: lm.jit.freeze(lm.jit.trace(model)) and lm.nn.fold_batch_norm give the model's
--     logits.
-- With the files of tools/gen_peer_families.py (`make check-peer-families` writes them into
-- /tmp/lumen-peer-families, LUMEN_PEER_FAMILIES_DIR; pending without them):
--   * torchvision's state_dict keys and shapes for every variant (b1-b3, convnext small/base,
--     the RegNet family, ...);
--   * torchvision's weights load unchanged and the eval logits equal PyTorch's within 1e-3
--     (max |a - b| / max |b|), contiguous and channels-last;
--   * a contiguous float64 training step equal to PyTorch's float64 one (loss and gradients to
--     1e-9: the arithmetic is exact);
--   * a channels-last float32 training step against PyTorch's float64 one: the loss, and the
--     gradients in the 2-norm within 5e-2 or 5x PyTorch's own float32 error: batch norm over a
--     batch of 2 at 2x2 pixels plus ReLU/ReLU6 masks that flip for pre-activations within
--     float32 rounding of 0 (mobilenet_v2's features.18: a batch-norm output of -5e-6 in float64)
--     make single float32 runs, PyTorch's included, differ from float64 by up to ~2e-2 depending
--     on the rounding; a wrong gradient is off by O(1).
local lm = require("lumen")
local S = require("lumen.serialize")

local dir = os.getenv("LUMEN_PEER_FAMILIES_DIR") or "/tmp/lumen-peer-families"

-- name, the options that make a training step deterministic, the small spec's options
local MODELS = {
   { "mobilenet_v2", { dropout = 0 } },
   { "mobilenet_v3_large", { dropout = 0 } },
   { "mobilenet_v3_small", { dropout = 0 } },
   { "efficientnet_b0", { dropout = 0, stochastic_depth_prob = 0 } },
   { "convnext_tiny", { stochastic_depth_prob = 0 }, no_bn = true, nhwc_view = true },
   { "regnet_y_400mf", {} },
   { "shufflenet_v2_x1_0", {} },
}

local function exists(p)
   local f = io.open(p, "rb")
   if f then f:close() return true end
   return false
end

local function rel_err(a, b)
   local ad, bd = a:double(), b:double()
   local scale = bd:abs():max():item()
   if scale == 0 then scale = 1 end
   return (ad - bd):abs():max():item() / scale
end

-- ||a - b|| / ||b|| (2-norm); a gradient that is zero in exact arithmetic (a batch norm's bias
-- right before another batch norm: ~1e-17 in float64) is compared against 1e-4 absolute instead
local function norm_err(a, b)
   local bd = b:double()
   local d = a:double() - bd
   local s = (bd * bd):sum():item()
   if s < 1e-8 then s = 1e-8 end
   return math.sqrt((d * d):sum():item() / s)
end

local function assert_close(a, b, tol, what, metric)
   assert.are.same(b:size(), a:size(), what .. ": sizes")
   local e = (metric or rel_err)(a, b)
   if e ~= e or e > tol then
      error(("%s: relative error %.3e > %.1e"):format(what, e, tol), 2)
   end
   return e
end

-- every tensor of a table loaded by S.load, on lm.get_default_device()
local function to_default_device(t)
   local dev = lm.get_default_device()
   local out = {}
   for k, v in pairs(t) do out[k] = v:to(dev) end
   return out
end

local function params_of(model)
   local p = {}
   for _, nt in ipairs(model:named_parameters()) do p[nt[1]] = nt[2] end
   return p
end

-- a training step: cross entropy of model(x) against target, backward; returns the loss
local function train_step(model, x, target)
   model:train()
   model:zero_grad(true)
   local loss = lm.F.cross_entropy(model(x), target)
   loss:backward()
   return loss
end

-- lm.layout.check's report, clean: also ConvNeXt's, whose torchvision Permute modules and
-- LayerNorm2d turn the channels-last N x C x H x W tensor into its N x H x W x C view (the same
-- memory, contiguous: no copy) for LayerNorm and the Linears, and back (the check counts that
-- channels-to-last order as keeping the layout: the rows say so, row.nhwc)
local function layout_ok(rep, nhwc_view)
   if not rep.ok then return false, tostring(rep.first_lost or rep.first_grad_lost) end
   if rep.params_ok == false then return false, "parameter gradients" end
   if nhwc_view then
      local n = 0
      for _, row in ipairs(rep.rows) do
         if row.nhwc then n = n + 1 end
      end
      if n == 0 then return false, "no channels-to-last rows" end
   end
   return true
end

describe("model families", function()
   it("reject unknown options and bad values with clear errors", function()
      for _, e in ipairs(MODELS) do
         local name = e[1]
         local ok, err = pcall(lm.models[name], { num_clases = 10 })
         assert.is_false(ok)
         assert.matches("lumen.models." .. name .. ": unknown option 'num_clases'", err, 1, true)
         ok, err = pcall(lm.models[name], { num_classes = 0 })
         assert.is_false(ok)
         assert.matches("num_classes must be a positive integer", err, 1, true)
         ok, err = pcall(lm.models[name], 3)
         assert.is_false(ok)
         assert.matches("opts must be a table", err, 1, true)
      end
      local ok, err = pcall(lm.models.mobilenet_v2, { width_mult = "wide" })
      assert.is_false(ok)
      assert.matches("width_mult must be a number", err, 1, true)
      ok, err = pcall(lm.models.mobilenet_v3_small, { dropout = 2 })
      assert.is_false(ok)
      assert.matches("dropout must be a number in [0, 1]", err, 1, true)
   end)

   it("mobilenet_v2 width_mult and round_nearest as torchvision's", function()
      local m = lm.models.mobilenet_v2({ width_mult = 0.5, num_classes = 7 })
      -- torchvision: features.0.0.weight 16x3x3x3, features.18.0.weight 1280x160x1x1
      local p = params_of(m)
      assert.are.same({ 16, 3, 3, 3 }, p["features.0.0.weight"]:size())
      assert.are.same({ 1280, 160, 1, 1 }, p["features.18.0.weight"]:size())
      assert.are.same({ 7, 1280 }, p["classifier.1.weight"]:size())
      m = lm.models.mobilenet_v2({ width_mult = 0.35, round_nearest = 1 })
      assert.are.same({ 11, 3, 3, 3 }, params_of(m)["features.0.0.weight"]:size())
   end)

   it("regnet_x_400mf (no squeeze-and-excitation) and shufflenet_v2_x0_5: channels-last " ..
      "forward and backward clean", function()
      for _, name in ipairs({ "regnet_x_400mf", "shufflenet_v2_x0_5" }) do
         lm.manual_seed(40)
         local m = lm.models[name]({ num_classes = 5 })
         lm.to_channels_last(m)
         m:train()
         local x = lm.randn({ 2, 3, 32, 32 }):contiguous(lm.channels_last)
         local rep = lm.layout.check(m, x, { backward = true })
         assert(layout_ok(rep))
         assert.are.same({ 2, 5 }, m(x):size())
      end
   end)

   it("the RegNet widths are torchvision's BlockParams.from_init_params", function()
      -- regnet_y_400mf: stages (width, depth, group width) from torchvision's printout
      local stages = {}
      local m = lm.models.regnet_y_400mf()
      for _, nt in ipairs(m:named_parameters()) do
         local i, j = nt[1]:match("^trunk_output%.block(%d+)%.block%d+%-(%d+)%.f%.b%.0%.weight$")
         if i then
            i, j = tonumber(i), tonumber(j)
            stages[i] = { nt[2]:size(1), j + 1, nt[2]:size(2) }
         end
      end
      assert.are.same({ { 48, 1, 8 }, { 104, 3, 8 }, { 208, 6, 8 }, { 440, 6, 8 } }, stages)
      -- the squeeze width is se_ratio times the block's input width (the stem's 32 here)
      local p = params_of(m)
      assert.are.same({ 8, 48, 1, 1 }, p["trunk_output.block1.block1-0.f.se.fc1.weight"]:size())
      assert.are.same({ 26, 104, 1, 1 }, p["trunk_output.block2.block2-1.f.se.fc1.weight"]:size())
   end)

   for _, e in ipairs(MODELS) do
      local name, topts = e[1], e[2]
      describe(name, function()
         local model
         setup(function()
            lm.manual_seed(40)
            local o = { num_classes = 10 }
            for k, v in pairs(topts) do o[k] = v end
            model = lm.models[name](o)
         end)
         teardown(function()
            model = nil
            collectgarbage()
         end)

         it("channels-last: lm.layout.check clean forward and backward", function()
            lm.to_channels_last(model)
            model:train()
            local x = lm.randn({ 2, 3, 64, 64 }):contiguous(lm.channels_last)
            local rep = lm.layout.check(model, x, { backward = true })
            assert(layout_ok(rep, e.nhwc_view))
            model:eval()
            rep = lm.layout.check(model, x, { backward = true })
            assert(layout_ok(rep, e.nhwc_view))
         end)

         it("a channels-last training step: float64's loss and gradients, 4-D weights and " ..
            "gradients channels-last", function()
            local x = lm.randn({ 2, 3, 64, 64 })
            local target = lm.tensor({ 3, 7 }, { dtype = lm.int64 })
            local ref = lm.models[name](topts and (function()
               local o = { num_classes = 10 }
               for k, v in pairs(topts) do o[k] = v end
               return o
            end)())
            ref:load_state_dict(model:state_dict())
            ref:to(lm.float64):to(lm.contiguous_format)
            local loss64 = train_step(ref, x:double(), target)
            lm.to_channels_last(model)
            local loss = train_step(model, x:contiguous(lm.channels_last), target)
            assert_close(loss, loss64, 1e-4, "loss")
            local p64 = params_of(ref)
            local n4 = 0
            for k, p in pairs(params_of(model)) do
               assert.is_not_nil(p.grad, k .. " has a gradient")
               -- (randomly initialised, batch 2: see the peer tolerances below)
               assert_close(p.grad, p64[k].grad, 1e-1, "grad " .. k, norm_err)
               if p:dim() == 4 then
                  n4 = n4 + 1
                  assert.is_true(p:is_contiguous(lm.channels_last), k .. " channels-last")
                  assert.is_true(p.grad:is_contiguous(lm.channels_last),
                                 k .. ".grad channels-last")
               end
            end
            assert.is_true(n4 > 10)
            model:zero_grad(true)
         end)

         it("evaluation: lm.jit.freeze and lm.nn.fold_batch_norm keep the logits", function()
            lm.to_channels_last(model)
            model:eval()
            local x = lm.randn({ 2, 3, 64, 64 }):contiguous(lm.channels_last)
            local y = lm.no_grad(function() return model(x) end)
            local g = lm.jit.freeze(lm.jit.trace(model, x))
            local yf = lm.no_grad(function() return g(x) end)
            assert_close(yf, y, 1e-4, "frozen logits")
            local _, n = lm.nn.fold_batch_norm(model)
            assert.is_true(e.no_bn and n == 0 or n > 0)
            local y2 = lm.no_grad(function() return model(x) end)
            assert_close(y2, y, 1e-4, "folded logits")
            assert.is_true(y2:is_contiguous())
         end)
      end)
   end
end)

-- against PyTorch (tools/gen_peer_families.py) -------------------------------------------------
local have = exists(dir .. "/.generated") and exists(dir .. "/shapes.json")

describe("model families against torchvision (" .. dir .. ")", function()
   if not have then
      pending("needs the files of `make check-peer-families` (tools/gen_peer_families.py) in " ..
              dir)
      return
   end

   it("state_dict keys and shapes of every variant are torchvision's", function()
      local f = assert(io.open(dir .. "/shapes.json", "rb"))
      local shapes = S.json.decode(f:read("*a"))
      f:close()
      local n = 0
      for vname, list in pairs(shapes) do
         local ctor = lm.models[vname]
         if ctor ~= nil then
            n = n + 1
            local mine = {}
            local m = ctor()
            for _, e in ipairs(m:state_entries()) do mine[e[1]] = e[2] end
            for _, ks in ipairs(list) do
               local t = mine[ks[1]]
               assert(t ~= nil, vname .. ": lumen lacks " .. ks[1])
               assert.are.same(ks[2], t:size(), vname .. " " .. ks[1])
               mine[ks[1]] = nil
            end
            assert.are.same({}, (function()
               local extra = {}
               for k in pairs(mine) do extra[#extra + 1] = k end
               return extra
            end)(), vname .. ": keys torchvision lacks")
            collectgarbage()
         end
      end
      assert.is_true(n >= 3)
   end)

   for _, e in ipairs(MODELS) do
      local name, topts = e[1], e[2]
      local wpath = dir .. "/" .. name .. ".weights.safetensors"
      local rpath = dir .. "/" .. name .. ".ref.safetensors"
      describe(name, function()
         if not (exists(wpath) and exists(rpath)) then
            pending(name .. ": no reference files")
            return
         end
         local model, W, ref, meta
         setup(function()
            -- S.load makes host tensors; the specs run on the test device too
            -- (LUMEN_TEST_DEVICE=sim:0 / cuda:0 sets the default device), where the model is
            W = to_default_device(S.load(wpath))
            local r
            r, meta = S.load(rpath)
            ref = to_default_device(r)
            model = lm.models[name](topts)
            model:load_state_dict(W)
         end)
         teardown(function()
            model, W, ref = nil, nil, nil
            collectgarbage()
         end)

         it("eval logits equal PyTorch's within 1e-3 (contiguous and channels-last)", function()
            model:load_state_dict(W)
            model:to(lm.contiguous_format)
            model:eval()
            local y = lm.no_grad(function() return model(ref.input:contiguous()) end)
            assert_close(y, ref.logits_eval, 1e-3, "logits (contiguous)")
            lm.to_channels_last(model)
            y = lm.no_grad(function() return model(ref.input:contiguous(lm.channels_last)) end)
            assert_close(y, ref.logits_eval, 1e-3, "logits (channels-last)")
         end)

         it("a contiguous float64 training step equals PyTorch's float64 one", function()
            local m64 = lm.models[name](topts)
            m64:load_state_dict(W)
            m64:to(lm.float64)
            local loss = train_step(m64, ref.input:double(), ref.target + 1)
            assert_close(loss, ref["f64.loss"], 1e-10, "loss")
            local p = params_of(m64)
            for _, k in ipairs(S.json.decode(meta.keys)) do
               assert_close(p[k].grad, ref["f64.grad." .. k], 1e-9, "grad " .. k, norm_err)
            end
         end)

         it("a channels-last float32 training step as close to PyTorch's float64 as " ..
            "PyTorch's float32", function()
            model:load_state_dict(W)
            lm.to_channels_last(model)
            local loss = train_step(model, ref.input:contiguous(lm.channels_last),
                                    ref.target + 1)
            local tloss = math.abs(ref.loss32:item() - ref["f64.loss"]:item()) /
                          math.abs(ref["f64.loss"]:item())
            assert_close(loss, ref["f64.loss"], math.max(10 * tloss, 1e-5), "loss")
            local p = params_of(model)
            local terr = S.json.decode(meta.torch_f32_err)
            for _, k in ipairs(S.json.decode(meta.keys)) do
               assert_close(p[k].grad, ref["f64.grad." .. k], math.max(5 * terr[k], 5e-2),
                            "grad " .. k, norm_err)
               if p[k]:dim() == 4 then
                  assert.is_true(p[k].grad:is_contiguous(lm.channels_last), k .. ".grad")
               end
            end
            model:zero_grad(true)
         end)
      end)
   end
end)
