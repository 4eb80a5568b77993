-- spec/layout_verdict_spec.lua -- lm.layout.check never says ok wrongly: hand-made models that
-- lose channels-last (or channels_last_3d) in different places -- a container's own code between
-- two children, a leaf's output, inside a leaf's forward (a functional call), a module's input
-- (code the trace does not see), a view, the model's output, a gradient only, the input's
-- gradient -- each gives ok = false, names the module in first_lost, and the text, the rows and
-- the HTML page say the same. Models that keep the format stay ok, with a row for every module.

local lm = require("lumen")
local T = require("lumen.tensor")
local A = require("lumen.autograd")
local nn = lm.nn
local F = lm.F
local CL, CL3 = lm.channels_last, lm.channels_last_3d

local function esc(s)
   return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;",
                                          ['"'] = "&quot;", ["'"] = "&#39;" }))
end

-- the three views of a report agree: the text's verdict line, the HTML banner, first_lost
local function assert_agree(r)
   local text = tostring(r)
   local html = r:to_html()
   assert.truthy(text:find("ok: " .. tostring(r.ok), 1, true), text)
   if r.ok then
      assert.truthy(html:find('<div class="verdict ok">', 1, true))
      assert.falsy(html:find('<div class="verdict bad">', 1, true))
      assert.falsy(text:find("<--", 1, true), text)
      assert.falsy(html:find("&#9888;", 1, true))
   else
      assert.truthy(html:find('<div class="verdict bad">', 1, true))
      assert.falsy(html:find('<div class="verdict ok">', 1, true))
      assert.falsy(html:find("all the way", 1, true))
   end
   if r.first_lost then
      assert.truthy(text:find("first module to lose " .. r.first_lost_format .. ": " ..
                              r.first_lost, 1, true), text)
      local banner = html:match('<div class="verdict bad">(.-)</div>')
      assert.truthy(banner:find("<code>" .. esc(r.first_lost) .. "</code>", 1, true), banner)
      if r.first_lost_op then
         assert.truthy(banner:find("<code>" .. esc(r.first_lost_op) .. "</code>", 1, true),
                       banner)
      end
      -- the module is marked in the table and on the page
      assert.truthy(text:find("<-- ", 1, true), text)
      assert.truthy(html:find("&#9888;", 1, true))
   end
   return text, html
end

local function x4() return lm.randn({ 2, 4, 6, 6 }):to(CL) end
local function row_of(r, path, call)
   for _, row in ipairs(r.rows) do
      if row.path == path and (call == nil or row.call == call) then return row end
   end
   error("no row " .. path)
end

-- two convolutions and what happens between them, in the container's own forward
local function between(fn)
   local Net = nn.Module:extend("Net")
   function Net:__init()
      self.conv1 = nn.Conv2d(4, 4, 3, { padding = 1 })
      self.conv2 = nn.Conv2d(4, 4, 3, { padding = 1 })
   end
   function Net:forward(x) return self.conv2(fn(self.conv1(x))) end
   lm.manual_seed(1)
   return lm.to_channels_last(Net())
end

describe("lm.layout.check's verdict", function()
   it("1. contiguous() between two convolutions in the model's forward", function()
      local r = lm.layout.check(between(function(y) return y:contiguous() end), x4())
      assert.is_false(r.ok)
      assert.are.equal("(model)", r.first_lost)
      assert.are.equal("channels_last", r.first_lost_format)
      assert.are.equal("inside", r.first_lost_where)
      assert.are.equal("Tensor.contiguous", r.first_lost_op)
      -- a row for the model's own code, between the two convolutions
      assert.are.same({ "conv1", "", "conv2" }, { r.rows[1].path, r.rows[2].path,
                                                 r.rows[3].path })
      assert.is_true(r.rows[2].own_code)
      assert.is_true(r.rows[2].lost)
      assert.are.equal("contiguous", r.rows[2].output_format)
      -- the second convolution's input shows it (not counted twice)
      assert.are.equal("contiguous", r.rows[3].input_format)
      assert.truthy(r.rows[3].input_note:find("lost by (model)", 1, true))
      assert.is_nil(r.rows[3].lost)
      local text, html = assert_agree(r)
      assert.truthy(text:find("lost channels_last in its own forward (by Tensor.contiguous)",
                              1, true), text)
      assert.truthy(html:find('href="#m-root"', 1, true))
      assert.truthy(html:find("in its own forward", 1, true))
   end)

   it("2. contiguous() in a submodule's own forward names that submodule", function()
      local Block = nn.Module:extend("Block")
      function Block:__init()
         self.conv = nn.Conv2d(4, 4, 1)
         self.bn = nn.BatchNorm2d(4)
      end
      function Block:forward(x) return self.bn(self.conv(x):contiguous()) end
      lm.manual_seed(2)
      local m = lm.to_channels_last(nn.Sequential(nn.Conv2d(4, 4, 3), Block(), nn.ReLU()))
      local r = lm.layout.check(m, x4())
      assert.is_false(r.ok)
      assert.are.equal("1", r.first_lost)
      assert.are.equal("Tensor.contiguous", r.first_lost_op)
      -- the batch norm then keeps what it got (contiguous): shown, not a loss of its own
      assert.are.equal("contiguous", row_of(r, "1.bn").output_format)
      assert.are.same({ "1.bn", "2" }, r.non_cl)
      local _, html = assert_agree(r)
      assert.truthy(html:find("contains the loss", 1, true))
   end)

   it("3. a leaf whose output is contiguous (its forward calls contiguous())", function()
      local Lossy = nn.Module:extend("Lossy")
      function Lossy:forward(x) return x:contiguous() end
      local m = lm.to_channels_last(nn.Sequential(nn.Conv2d(4, 4, 3), Lossy(), nn.ReLU()))
      local r = lm.layout.check(m, x4())
      assert.is_false(r.ok)
      assert.are.equal("1", r.first_lost)
      assert.are.equal("output", r.first_lost_where)
      assert.are.same({ "Tensor.contiguous" }, row_of(r, "1").lost_ops)
      assert_agree(r)
   end)

   it("4. a functional call inside a leaf's forward that loses it and converts back", function()
      -- the leaf's output is channels-last again, but its forward made a contiguous copy
      local MyConv = nn.Module:extend("MyConv")
      function MyConv:__init()
         self:register_parameter("weight", lm.randn({ 4, 4, 3, 3 }))
      end
      function MyConv:forward(x)
         local y = F.softmax(x, 2)                  -- over channels: contiguous (as PyTorch)
         return F.conv2d(y, self.weight, nil, { padding = 1 })
      end
      local m = lm.to_channels_last(nn.Sequential(nn.Conv2d(4, 4, 3, { padding = 1 }),
                                                  MyConv()))
      local r = lm.layout.check(m, x4())
      assert.are.equal("channels_last", row_of(r, "1").output_format)
      assert.is_false(r.ok)
      assert.are.equal("1", r.first_lost)
      assert.are.equal("inside", r.first_lost_where)
      assert.are.equal("F.softmax", r.first_lost_op)
      local text = assert_agree(r)
      assert.truthy(text:find("lost channels_last inside its forward (by F.softmax)", 1, true))
   end)

   it("5. a module's input, lost by code the trace does not see", function()
      -- T.raw.* are not wrapped by the trace: only the next module's input shows the loss
      local r = lm.layout.check(between(function(y) return T.raw.contiguous(y) end), x4())
      assert.is_false(r.ok)
      assert.are.equal("conv2", r.first_lost)
      assert.are.equal("input", r.first_lost_where)
      local row = row_of(r, "conv2")
      assert.is_true(row.lost)
      assert.are.equal("contiguous", row.input_format)
      assert.are.equal("channels_last", row.output_format)   -- the weight's format restores it
      local text = assert_agree(r)
      assert.truthy(text:find("<-- input not channels_last", 1, true))
   end)

   it("6. a view: transposing H and W", function()
      local r = lm.layout.check(between(function(y) return y:transpose(3, 4) end), x4())
      assert.is_false(r.ok)
      assert.are.equal("(model)", r.first_lost)
      assert.are.equal("Tensor.transpose", r.first_lost_op)
      assert.are.equal("strided", row_of(r, "").output_format)
      assert_agree(r)
      -- a slice keeps the channels-last order: not a loss
      local ok = lm.layout.check(between(function(y) return y:narrow(3, 2, 4) end), x4())
      assert.is_true(ok.ok, tostring(ok))
      assert_agree(ok)
   end)

   it("7. a residual add whose first operand is contiguous", function()
      local r = lm.layout.check(between(function(y)
         return lm.zeros(y:size()) + y            -- the result follows the contiguous operand
      end), x4())
      assert.is_false(r.ok)
      assert.are.equal("(model)", r.first_lost)
      assert.are.equal("Tensor.add", r.first_lost_op)
      assert_agree(r)
   end)

   it("8. cat with a contiguous tensor", function()
      local Net = nn.Module:extend("CatNet")
      function Net:__init()
         self.a = nn.Conv2d(4, 2, 1)
         self.b = nn.Conv2d(4, 2, 1)
      end
      function Net:forward(x) return lm.cat({ self.a(x), self.b(x):contiguous() }, 2) end
      lm.manual_seed(3)
      local r = lm.layout.check(lm.to_channels_last(Net()), x4())
      assert.is_false(r.ok)
      assert.are.equal("(model)", r.first_lost)
      local own = row_of(r, "")
      assert.are.same({ "Tensor.contiguous", "lm.cat" }, own.lost_ops)
      -- nothing consumes the result: the model's output shows it
      assert.are.equal("contiguous", r.output_format)
      assert_agree(r)
   end)

   it("9. the model's output, lost after the last module by code the trace does not see",
      function()
      local Net = nn.Module:extend("OutNet")
      function Net:__init() self.conv = nn.Conv2d(4, 4, 3) end
      function Net:forward(x) return T.raw.contiguous(self.conv(x)) end
      local r = lm.layout.check(lm.to_channels_last(Net()), x4(), { backward = false })
      assert.is_false(r.ok)
      assert.is_true(r.output_lost)
      assert.are.equal("(model)", r.first_lost)
      assert.are.equal("output", r.first_lost_where)
      local text = assert_agree(r)
      assert.truthy(text:find("its output, after the last module", 1, true))
   end)

   it("10. a gradient only: a module whose backward hands back a contiguous gradient", function()
      local GradBreaker = nn.Module:extend("GradBreaker")
      function GradBreaker:forward(x)
         local out = T.raw.clone(x)
         A.record(out, "GradBreakerBackward", function(g) return T.raw.contiguous(g) end, x)
         return out
      end
      local m = lm.to_channels_last(nn.Sequential(nn.Conv2d(4, 4, 3), GradBreaker(),
                                                  nn.Conv2d(4, 4, 3)))
      local r = lm.layout.check(m, x4())
      assert.is_nil(r.first_lost)                 -- the forward is fine
      assert.is_false(r.ok)
      assert.are.equal("0", r.first_grad_lost)
      assert.are.equal("1", r.first_grad_lost_by)
      local _, html = assert_agree(r)
      assert.truthy(html:find("the gradient stops being channels-last at module", 1, true))
      -- and without the backward, the forward alone is ok
      assert.is_true(lm.layout.check(m, x4(), { backward = false }).ok)
   end)

   it("11. the input's gradient (the first module's backward loses it)", function()
      local GradBreaker = nn.Module:extend("GradBreaker2")
      function GradBreaker:forward(x)
         local out = T.raw.clone(x)
         A.record(out, "GradBreakerBackward", function(g) return T.raw.contiguous(g) end, x)
         return out
      end
      local m = lm.to_channels_last(nn.Sequential(GradBreaker(), nn.Conv2d(4, 4, 3)))
      local x = x4():requires_grad_(true)
      local r = lm.layout.check(m, x)
      assert.is_nil(r.first_lost)
      assert.is_nil(r.first_grad_lost)
      assert.is_true(r.input_grad_lost)
      assert.are.equal("contiguous", r.input_grad_format)
      assert.is_false(r.ok)
      local text = assert_agree(r)
      assert.truthy(text:find("input gradient: contiguous (NOT", 1, true))
      assert.is_nil(x.grad)                        -- put back as it was
      -- a clean model: the input's gradient is channels-last, and ok
      local clean = lm.layout.check(lm.to_channels_last(nn.Sequential(nn.Conv2d(4, 4, 3))), x)
      assert.are.equal("channels_last", clean.input_grad_format)
      assert.is_true(clean.ok)
   end)

   it("12. channels_last_3d lost in a video block's own forward", function()
      local Net = nn.Module:extend("Net3d")
      function Net:__init()
         self.a = nn.Conv3d(3, 4, 3, { padding = 1 })
         self.b = nn.Conv3d(4, 4, 3, { padding = 1 })
      end
      function Net:forward(x) return self.b(self.a(x):contiguous()) end
      local r = lm.layout.check(lm.to_channels_last(Net()),
                                lm.randn({ 1, 3, 4, 6, 6 }):to(CL3))
      assert.is_false(r.ok)
      assert.are.equal("(model)", r.first_lost)
      assert.are.equal("channels_last_3d", r.first_lost_format)
      assert_agree(r)
   end)

   it("13. an unconverted model is not ok, with no first_lost", function()
      local m = nn.Sequential(nn.Conv2d(4, 4, 3), nn.ReLU())
      local r = lm.layout.check(m, lm.randn({ 2, 4, 6, 6 }))
      assert.is_false(r.ok)
      assert.is_nil(r.first_lost)
      assert_agree(r)
   end)

   it("14. kept all the way: ok, a fused ReLU's row, a module never called", function()
      local Net = nn.Module:extend("FusedNet")
      function Net:__init()
         self.conv = nn.Conv2d(4, 4, 3, { padding = 1, bias = false })
         self.bn = nn.BatchNorm2d(4)
         self.relu = nn.ReLU()
         self.spare = nn.Conv2d(4, 4, 1)            -- registered, never used
      end
      function Net:forward(x)
         local y = nn.utils.bn_relu(self.bn, self.relu, self.conv(x))
         return y:narrow(3, 1, 4) * 2
      end
      local r = lm.layout.check(lm.to_channels_last(Net()), x4())
      assert.is_true(r.ok, tostring(r))
      local relu = row_of(r, "relu")
      assert.are.equal("bn", relu.fused_into)
      assert.are.equal("channels_last", relu.output_format)
      assert.are.equal("channels_last", relu.grad_format)
      local spare = row_of(r, "spare")
      assert.is_true(spare.not_called)
      local text, html = assert_agree(r)
      assert.truthy(text:find("(fused into bn)", 1, true), text)
      assert.truthy(text:find("(not called)", 1, true), text)
      assert.truthy(html:find("fused into <code>bn</code>", 1, true))
      assert.truthy(html:find("not called", 1, true))
      -- the hook is gone afterwards
      assert.is_nil(require("lumen.nn.fold")._fused_hook)
   end)

   it("15. lumen's models stay ok (resnet18 in training mode, forward and backward)", function()
      lm.manual_seed(5)
      local m = lm.to_channels_last(lm.models.resnet18({ num_classes = 3 }))
      local r = lm.layout.check(m, lm.randn({ 2, 3, 32, 32 }):to(CL))
      assert.is_true(r.ok, tostring(r))
      assert_agree(r)
   end)
end)
