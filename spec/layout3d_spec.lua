-- lm.layout on 5-D models (channels_last_3d) and 1-D ones (N x C x L): the formats' names, check
-- (module level, forward and backward), trace (operator level), the HTML report, and the 3-D and
-- 1-D rows of coverage (lua/lumen/layout.lua, layout_report.lua, layout_coverage.lua).

local H = require("spec.helpers")
local lm = H.lm
local L = require("lumen.layout")
local nn = lm.nn
local F = lm.F

local CL, CL3 = lm.channels_last, lm.channels_last_3d
local on_cuda = lm.get_default_device():match("^cuda") ~= nil

-- a module whose forward drops the format (x:contiguous())
local Lossy = nn.Module:extend("Lossy3d")
function Lossy:forward(x) return x:contiguous() end

-- swaps H and W (a permute: the result is a strided view, no longer channels_last_3d)
local SwapHW = nn.Module:extend("SwapHW")
function SwapHW:forward(x) return x:permute(1, 2, 3, 5, 4) end

-- a 5-D parameter (1 x C x D x H x W) multiplied in: lm.to_channels_last makes it
-- channels_last_3d, and its gradient must follow
local Scale3d = nn.Module:extend("Scale3d")
function Scale3d:__init(c, d, h, w)
   self.weight = nn.Parameter(lm.rand({ 1, c, d, h, w }) + 0.5)
end
function Scale3d:forward(x) return x * self.weight end

-- one frame of a clip: N x C x D x H x W -> N x C x H x W (a view; channels_last strides)
local Frame = nn.Module:extend("Frame")
function Frame:forward(x) return x:select(3, 1) end

-- a small video model from nn modules: a 3x7x7 stem of stride (1, 2, 2), batch norm, a 5-D
-- parameter, the 3-D pools, a (2+1)-D pair of convolutions; mid goes after the max pool
local function video_net(mid)
   local m = nn.Sequential(nn.Conv3d(3, 8, { 3, 7, 7 }, { stride = { 1, 2, 2 },
                                                          padding = { 1, 3, 3 }, bias = false }),
                           nn.BatchNorm3d(8), nn.ReLU(), Scale3d(8, 4, 8, 8),
                           nn.MaxPool3d({ kernel_size = 3, stride = 2, padding = 1 }))
   if mid then m:add(mid) end
   m:add(nn.Conv3d(8, 8, { 1, 3, 3 }, { padding = { 0, 1, 1 } }))
   m:add(nn.Conv3d(8, 8, { 3, 1, 1 }, { padding = { 1, 0, 0 } }))
   m:add(nn.BatchNorm3d(8))
   m:add(nn.AvgPool3d({ kernel_size = { 1, 2, 2 } }))
   m:add(nn.AdaptiveMaxPool3d({ 1, 2, 2 }))
   m:add(nn.AdaptiveAvgPool3d(1))
   m:add(nn.Flatten())
   m:add(nn.Linear(8, 3))
   return lm.to_channels_last(m)
end

local function clip() return lm.randn({ 2, 3, 4, 16, 16 }):to(CL3) end

-- the 3-D pools have no CUDA kernels yet ("not supported on cuda"): the tests that run them are
-- pending on cuda devices; the 1-D ones run everywhere
local it3 = on_cuda and pending or it

describe("lm.layout on 5-D and 1-D models", function()
   describe("format names", function()
      it("names the 5-D and the 1-D layouts", function()
         local x = lm.randn({ 2, 3, 2, 4, 5 })
         assert.are.equal("contiguous", L.format(x))
         assert.are.equal("channels_last_3d", L.format(x:to(CL3)))
         assert.are.equal("ambiguous_cl3d", L.format(lm.randn({ 2, 3, 1, 1, 1 }):to(CL3)))
         assert.are.equal("ambiguous", L.format(lm.randn({ 2, 3, 1, 1, 1 })))
         assert.are.equal("ambiguous", L.format(lm.randn({ 2, 1, 2, 4, 4 })))
         assert.are.equal("cl3d_strided", L.format(x:to(CL3):narrow(2, 1, 2)))
         assert.are.equal("strided", L.format(x:to(CL3):permute(1, 2, 3, 5, 4)))
         assert.is_true(L.is_channels_last_3d(x:to(CL3)))
         assert.is_false(L.is_channels_last_3d(x))
         assert.is_false(L.is_channels_last_3d(lm.randn({ 2, 3, 1, 1, 1 }):to(CL3)))
         assert.is_false(L.is_channels_last_3d(lm.randn({ 2, 3, 4, 5 }):to(CL)))
         assert.is_false(L.is_channels_last(x:to(CL3)))
         -- 1-D: N x C x L, and the N x L x C strides of x:permute(1, 3, 2) of an N x L x C one
         local nlc = lm.randn({ 2, 7, 3 }):permute(1, 3, 2)
         assert.are.equal("nlc", L.format(nlc))
         H.assert_strides(nlc, { 21, 1, 3 })
         assert.are.equal("contiguous", L.format(nlc:contiguous()))
         assert.are.equal("ambiguous", L.format(lm.randn({ 2, 3, 1 })))     -- L == 1: both
         assert.are.equal("strided", L.format(lm.randn({ 2, 3, 4 }):permute(2, 1, 3)))
      end)
   end)

   describe("check", function()
      it3("passes a 5-D model that keeps channels_last_3d, forward and backward", function()
         lm.manual_seed(1)
         local m = video_net()
         local r = L.check(m, clip(), { backward = true })
         assert.is_true(r.ok, tostring(r))
         assert.is_nil(r.first_lost)
         assert.are.equal(0, #r.non_cl)
         assert.is_true(r.output_ranks[5])
         assert.is_nil(r.output_ranks[4])
         -- the 5-D parameters (three convolutions, Scale3d) and their gradients
         assert.are.equal(4, r.n_params5)
         assert.are.equal(0, r.n_params4)
         assert.is_true(r.params_ok)
         for i = 1, 10 do
            local row = r.rows[i]
            assert.are.equal("channels_last_3d", row.input_format, row.path)
            assert.are.equal("channels_last_3d", row.output_format, row.path)
            assert.are.equal("channels_last_3d", row.grad_format, row.path)
         end
         assert.are.equal("Conv3d", r.rows[1].type)
         assert.are.equal("(2,8,4,8,8)", r.rows[1].output_size)
         for _, i in ipairs({ 1, 4, 6, 7 }) do
            assert.are.equal("channels_last_3d", r.rows[i].param_grad_format, r.rows[i].path)
         end
         assert.are.equal("MaxPool3d", r.rows[5].type)
         assert.are.equal("(2,8,2,4,4)", r.rows[5].output_size)
         assert.are.equal("ambiguous_cl3d", r.rows[11].output_format)   -- N x C x 1 x 1 x 1
         local s = tostring(r)
         assert.truthy(s:find("every 5-D module output is channels_last_3d", 1, true), s)
         assert.truthy(s:find("5-D parameter gradients: all 4 channels_last_3d", 1, true), s)
         assert.falsy(s:find("4-D parameter gradients", 1, true), s)
      end)

      it3("names the module and the operator that lose channels_last_3d", function()
         lm.manual_seed(1)
         local r = L.check(video_net(Lossy()), clip(), { trace = true })
         assert.is_false(r.ok)
         assert.are.equal("5", r.first_lost)
         assert.are.equal("channels_last_3d", r.first_lost_format)
         local row = r.rows[6]
         assert.are.equal("Lossy3d", row.type)
         assert.is_true(row.lost)
         assert.are.equal("channels_last_3d", row.lost_format)
         assert.are.equal("contiguous", row.output_format)
         assert.are.same({ "Tensor.contiguous" }, row.lost_ops)
         -- the convolution after it restores the format (its weight is channels_last_3d)
         assert.are.equal("contiguous", r.rows[7].input_format)
         assert.are.equal("channels_last_3d", r.rows[7].output_format)
         assert.are.equal("Tensor.contiguous", r.trace.first.op)
         assert.are.equal("channels_last_3d", r.trace.first.format)
         local s = tostring(r)
         assert.truthy(s:find("<-- lost channels_last_3d (by Tensor.contiguous)", 1, true), s)
         assert.truthy(s:find("first module to lose channels_last_3d: 5", 1, true), s)
         -- a permute in the middle: the same, named Tensor.permute
         lm.manual_seed(1)
         r = L.check(video_net(SwapHW()), clip(), { trace = true, backward = false })
         assert.are.equal("5", r.first_lost)
         assert.are.equal("strided", r.rows[6].output_format)
         assert.are.same({ "Tensor.permute" }, r.rows[6].lost_ops)
      end)

      it3("reports an unconverted 5-D model", function()
         lm.manual_seed(1)
         local m = nn.Sequential(nn.BatchNorm3d(8), nn.ReLU(), Scale3d(8, 4, 8, 8),
                                 nn.MaxPool3d(2))
         local r = L.check(m, lm.randn({ 2, 8, 4, 8, 8 }))
         assert.is_false(r.ok)
         assert.is_nil(r.first_lost)
         assert.are.equal(4, #r.non_cl)
         assert.are.equal(1, #r.bad_params)
         assert.truthy(r.bad_params[1]:find("^2%.weight"))
         local s = tostring(r)
         assert.truthy(s:find("4 leaf-module output(s) are 5-D and not channels_last_3d", 1,
                              true), s)
         assert.truthy(s:find("5-D parameter gradients: 1 of 1 NOT channels_last_3d", 1, true), s)
      end)

      it("checks 4-D and 5-D layers of one model each against its own format", function()
         lm.manual_seed(2)
         local function mixed(lossy2d)
            local m = nn.Sequential(nn.BatchNorm3d(8), nn.ReLU(), Scale3d(8, 4, 8, 8), Frame(),
                                    nn.Conv2d(8, 8, 3, { padding = 1 }))
            if lossy2d then m:add(Lossy()) end
            m:add(nn.BatchNorm2d(8))
            m:add(nn.AdaptiveAvgPool2d(1))
            m:add(nn.Flatten())
            m:add(nn.Linear(8, 2))
            return lm.to_channels_last(m)
         end
         local x = lm.randn({ 2, 8, 4, 8, 8 }):to(CL3)
         local r = L.check(mixed(false), x, { backward = true })
         assert.is_true(r.ok, tostring(r))
         assert.are.equal("channels_last_3d", r.rows[3].output_format)
         assert.are.equal("cl_strided", r.rows[4].output_format)   -- the frame: a 4-D view
         assert.are.equal("channels_last", r.rows[5].output_format)
         assert.are.equal(1, r.n_params4)
         assert.are.equal(1, r.n_params5)
         assert.are.equal("channels_last", r.rows[5].param_grad_format)
         assert.are.equal("channels_last_3d", r.rows[3].param_grad_format)
         local s = tostring(r)
         assert.truthy(s:find("every 4-D module output is channels-last and every 5-D one " ..
                              "channels_last_3d", 1, true), s)
         assert.truthy(s:find("4-D parameter gradients: all 1 channels-last", 1, true), s)
         assert.truthy(s:find("5-D parameter gradients: all 1 channels_last_3d", 1, true), s)
         -- a loss in the 2-D part is a channels_last loss
         r = L.check(mixed(true), x, { trace = true })
         assert.are.equal("5", r.first_lost)
         assert.are.equal("channels_last", r.first_lost_format)
         assert.truthy(tostring(r):find("first module to lose channels_last: 5", 1, true))
         -- a temporal mean (5-D -> contiguous 4-D, as PyTorch 2.15's): not channels-last, but a
         -- rank change, not a loss
         local TMean = nn.Module:extend("TMean")
         function TMean:forward(t) return t:mean(3) end
         local m = lm.to_channels_last(nn.Sequential(nn.BatchNorm3d(8), TMean(),
                                                     nn.Conv2d(8, 8, 3)))
         r = L.check(m, x)
         assert.is_false(r.ok)
         assert.is_nil(r.first_lost)
         assert.are.same({ "1" }, r.non_cl)
         assert.are.equal("contiguous", r.rows[2].output_format)
         assert.are.equal("channels_last", r.rows[3].output_format)
         local s2 = tostring(r)
         assert.truthy(s2:find("1 leaf-module output(s) are 4-D or 5-D and not in their " ..
                               "channels-last format (first: 1); it changes the rank of a " ..
                               "channels_last_3d input (not counted as a loss)", 1, true), s2)
      end)

      it("shows 1-D models (N x C x L) without judging them", function()
         lm.manual_seed(3)
         local m = nn.Sequential(nn.Conv1d(4, 8, 3, { padding = 1 }), nn.BatchNorm1d(8),
                                 nn.ReLU(), nn.MaxPool1d(2), nn.AdaptiveAvgPool1d(1),
                                 nn.Flatten(), nn.Linear(8, 2))
         -- N x L x C input, N x k x C weight: conv1d gives N x L x C; batch_norm returns
         -- contiguous on it (as PyTorch 2.15 does), which is not a loss here
         local w = m[1].weight
         m[1].weight = nn.Parameter(w:detach():permute(1, 3, 2):contiguous():permute(1, 3, 2))
         local x = lm.randn({ 2, 16, 4 }):permute(1, 3, 2)
         local r = L.check(m, x, { backward = true })
         assert.is_true(r.ok, tostring(r))
         assert.are.equal("nlc", r.input_format)
         assert.are.equal("nlc", r.rows[1].output_format)
         assert.are.equal("contiguous", r.rows[2].output_format)
         -- batch_norm's backward hands a contiguous gradient back (PyTorch 2.15's does too):
         -- shown, not judged
         assert.are.equal("contiguous", r.rows[1].grad_format)
         assert.is_nil(r.first_grad_lost)
         assert.are.equal(0, #r.non_cl)
         assert.is_nil(next(r.output_ranks))
         assert.truthy(tostring(r):find("no module output is 4-D or 5-D", 1, true))
      end)
   end)

   describe("trace", function()
      it3("finds the operator that lost channels_last_3d; 4-D and 5-D in one function", function()
         local x5 = lm.randn({ 2, 8, 4, 8, 8 }):to(CL3)
         local x4 = lm.randn({ 2, 8, 6, 6 }):to(CL)
         local r = L.trace(function()
            local a = F.max_pool3d(x5, 2)              -- keeps channels_last_3d
            local b = F.batch_norm(a, nil, nil, nil, nil, { training = true })
            local c = b:contiguous()                   -- loses it
            local d = (x4 + 1):relu()                  -- 4-D, keeps channels_last
            local e = F.softmax(d, 2)                  -- loses it
            local f = x5:select(3, 2) * 2              -- a frame of a channels_last_3d clip
            return c, e, f, x5:sum(3)                  -- sum(3): 4-D from 5-D, other rank
         end)
         assert.is_false(r.ok)
         assert.are.equal(2, #r.lost)
         assert.are.equal("Tensor.contiguous", r.lost[1].op)
         assert.are.equal("channels_last_3d", r.lost[1].format)
         assert.are.equal("F.softmax", r.lost[2].op)
         assert.are.equal("channels_last", r.lost[2].format)
         assert.truthy(r.message:find("Operator `Tensor.contiguous` lost channels_last_3d " ..
                                      "property: channels_last_3d input (2,8,2,4,4)@", 1, true))
         assert.truthy(r.lost[1].output:find("contiguous", 1, true))
         assert.truthy(r.cl_ranks[4] and r.cl_ranks[5])
         local s = tostring(r)
         assert.truthy(s:find("2 operator call(s) lost channels_last or channels_last_3d", 1,
                              true), s)
         local ok, err = pcall(L.trace, function() return F.softmax(x5, 2) end, { raise = true })
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.layout.trace: Operator `F.softmax` lost " ..
                                          "channels_last_3d property", 1, true))
      end)

      it3("passes the 5-D model; 1-D operators are never losses", function()
         lm.manual_seed(1)
         local m = video_net()
         local x = clip()
         local r = L.trace(function() return m(x) end)
         assert.is_true(r.ok, tostring(r))
         assert.truthy(tostring(r):find("no operator lost channels_last_3d", 1, true))
         local nlc = lm.randn({ 2, 16, 8 }):permute(1, 3, 2)
         r = L.trace(function()
            return F.batch_norm(nlc, nil, nil, nil, nil, { training = true }),
               F.max_pool1d(nlc, 2), F.conv1d(nlc, lm.randn({ 4, 8, 3 })), nlc:contiguous()
         end)
         assert.is_true(r.ok, tostring(r))
      end)
   end)

   describe("the HTML report", function()
      it3("names channels_last_3d in the verdict, the tree and the facts", function()
         lm.manual_seed(1)
         local r = L.check(video_net(Lossy()), clip(), { trace = true })
         local html = r:to_html()
         assert.truthy(html:find('channels_last_3d is lost at module <a href="#m-5"><code>5' ..
                                 '</code></a> by operator <code>Tensor.contiguous</code>', 1, true))
         assert.truthy(html:find("loses channels_last_3d: operator <code>Tensor.contiguous" ..
                                 "</code>", 1, true))
         assert.truthy(html:find('<span class="box c-lost" id="m-5"', 1, true))
         assert.truthy(html:find('<span class="box c-cl" id="m-4"', 1, true))  -- MaxPool3d
         assert.truthy(html:find('<span class="box c-cl" id="m-6"', 1, true))  -- Conv3d
         assert.truthy(html:find('<span class="box c-neutral" id="m-11"', 1, true)) -- 1x1x1
         assert.truthy(html:find("5-D parameter gradients", 1, true))
         lm.manual_seed(1)
         html = L.check(video_net(), clip()):to_html()
         assert.truthy(html:find("ok: channels_last_3d all the way (forward, backward and " ..
                                 "every 5-D parameter gradient)", 1, true))
      end)
   end)

   describe("coverage of the 3-D and 1-D operators", function()
      local cov
      setup(function()
         local only = {}
         for _, o in ipairs(L.operators()) do
            if o.group ~= "2-D" then only[#only + 1] = o.op end
         end
         cov = L.coverage({ only = only, shape3d = { 2, 16, 4, 12, 12 },
                            shape1d = { 4, 16, 256 } })
      end)
      teardown(function() cov = nil; collectgarbage() end)

      it("lists the 3-D and 1-D operators in their groups", function()
         local groups = {}
         for _, o in ipairs(L.operators()) do groups[o.group] = (groups[o.group] or 0) + 1 end
         assert.is_true(groups["3-D"] >= 20)
         assert.is_true(groups["1-D"] >= 15)
         assert.are.equal(groups["3-D"] + groups["1-D"], #cov.rows)
         for _, row in ipairs(cov.rows) do
            assert.are.equal(row.group == "3-D" and 5 or 3, row.rank)
         end
         local s = tostring(cov)
         assert.truthy(s:find("operator%s+kind%s+NCDHW input %->%s+NDHWC input %->%s+keeps CL3d"))
         assert.truthy(s:find("operator%s+kind%s+NCL input %->%s+NLC input %->%s+keeps NLC"))
         assert.falsy(s:find("NCHW input ->", 1, true))          -- no 2-D operator asked for
      end)

      it3("every 3-D operator keeps channels_last_3d (issue 19's rule)", function()
         local by = cov.by_op
         -- "native" reads the host allocator's peak around one call; a row that is not what is
         -- expected is measured again alone before the check (as spec/layout_spec.lua does: a
         -- loaded fresh-clone CI run once saw a call 3.8 MB over its usual temporaries there)
         local function native(op, want)
            local v = by[op].native
            if v ~= want then
               v = L.coverage({ only = { op }, shape3d = { 2, 16, 4, 12, 12 },
                                shape1d = { 4, 16, 256 } }).by_op[op].native
            end
            return v
         end
         for _, op in ipairs({ "max_pool3d 3/2", "max_pool3d 2 (indices)", "avg_pool3d 2",
                               "avg_pool3d 3/2 pad 1", "adaptive_avg_pool3d(2,5,5)",
                               "adaptive_max_pool3d(2,5,5)", "batch_norm 5-D (train)",
                               "batch_norm 5-D (eval)", "relu (5-D)", "add (bias 1xCx1x1x1)",
                               "mul (gate NxCx1x1x1)", "clone (5-D)" }) do
            assert.are.equal("contiguous", by[op].nchw, op)
            assert.are.equal("channels_last_3d", by[op].nhwc, op)
            assert.is_true(by[op].preserves, op)
            assert.are.equal("both", native(op, "both"), op)
            if op ~= "max_pool3d 2 (indices)" then
               assert.are.equal("channels_last_3d", by[op].grad_nhwc, op)
            end
         end
         -- convolutions: channels_last_3d when the input or the weight suggests it
         for _, op in ipairs({ "conv3d 3x3x3", "conv3d 1x1x1", "conv3d 1x1x1 stride 2",
                               "conv3d stem 3x7x7 s(1,2,2)", "conv3d (2+1)-D 1x3x3",
                               "conv3d (2+1)-D 3x1x1", "conv3d grouped (g=4)", "conv3d depthwise",
                               "conv3d dilated", "conv3d 3x3x3 (NCDHW weight)" }) do
            assert.are.equal("contiguous", by[op].nchw, op)
            assert.are.equal("channels_last_3d", by[op].nhwc, op)
            assert.is_true(by[op].preserves, op)
            assert.are.equal("channels_last_3d", by[op].grad_nhwc, op)
         end
         -- depth-1 kernels read a channels_last_3d input in place; NCDHW copies it
         -- (src/ops/conv3d.c). Below AVX-512 (lm_cpu_set_isa, or such a CPU) the NHWC conv2d
         -- under the (2+1)-D 1x3x3 layer is im2col + GEMM, which copies either way.
         local in_place = { "conv3d 1x1x1" }
         local isa = lm.backends.cpu.isa()
         if on_cuda or isa == "avx512" or isa == "avx512_bf16" or isa == "amx" then
            in_place[2] = "conv3d (2+1)-D 1x3x3"
         end
         for _, op in ipairs(in_place) do
            assert.are.equal("ndhwc", native(op, "ndhwc"), op)
         end
         assert.are.equal("ambiguous_cl3d", by["adaptive_avg_pool3d(1)"].nhwc)
         assert.is_true(by["adaptive_avg_pool3d(1)"].preserves)
         assert.is_false(by["contiguous (5-D)"].preserves)
         assert.is_false(by["softmax(2) (5-D)"].preserves)
         assert.are.equal("cl3d_strided", by["narrow(3, 2, D-2) (5-D)"].nhwc)
         assert.are.equal("cl_strided (4-D)", by["select(3, 1) (5-D -> 4-D)"].nhwc)
         assert.is_nil(by["select(3, 1) (5-D -> 4-D)"].preserves)
      end)

      it("1-D operators keep N x L x C as PyTorch does", function()
         local by = cov.by_op
         for _, op in ipairs({ "relu (3-D)", "add (bias 1xCx1)", "conv1d 3", "conv1d 1",
                               "conv1d depthwise", "conv1d grouped (g=4)", "max_pool1d 3/2",
                               "avg_pool1d 2", "adaptive_avg_pool1d(7)",
                               "adaptive_max_pool1d(5)" }) do
            assert.are.equal("contiguous", by[op].nchw, op)
            assert.are.equal("nlc", by[op].nhwc, op)
            assert.is_true(by[op].preserves, op)
            assert.are.equal("nlc", by[op].grad_nhwc, op)
         end
         -- conv1d follows its weight: a contiguous one gives a contiguous result
         assert.are.equal("contiguous", by["conv1d 3 (NCL weight)"].nhwc)
         assert.are.equal("contiguous", by["conv1d 3 (NCL weight)"].grad_nhwc)  -- PyTorch too
         -- batch_norm returns contiguous on N x L x C input (PyTorch 2.15 too); the input
         -- gradient keeps the input's layout
         assert.are.equal("contiguous", by["batch_norm 3-D (train)"].nhwc)
         assert.is_false(by["batch_norm 3-D (train)"].preserves)
         assert.are.equal("ambiguous", by["adaptive_avg_pool1d(1)"].nhwc)
      end)

      it("checks the shapes", function()
         assert.is_false(pcall(L.coverage, { shape3d = { 2, 8, 4, 8 } }))
         assert.is_false(pcall(L.coverage, { shape3d = { 2, 12, 4, 8, 8 } }))
         assert.is_false(pcall(L.coverage, { shape1d = { 2, 8, 4 } }))
         local ok, err = pcall(L.coverage, { shape1d = { 2, 8 } })
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.layout.coverage: shape1d must be {N, C, L}", 1,
                                          true))
      end)
   end)
end)
