-- lm.jit: trace (the recorded graph, running it, autograd through it, printing, the item()
-- warning), save / load (one file, no model source; bad files give clear errors) and the freeze
-- passes on small graphs. The three torchvision models in a fresh process: jit_models_spec.lua.
local lm = require("lumen")
local nn = lm.nn
local F = lm.F
local S = require("lumen.serialize")

local function tmpfile(suffix)
   local p = os.tmpname()
   os.remove(p)
   return p .. (suffix or ".safetensors")
end

local function maxdiff(a, b) return (a - b):abs():max():item() end

local function small_net()
   lm.manual_seed(1)
   local m = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), nn.BatchNorm2d(8), nn.ReLU(true),
                           nn.MaxPool2d(2), nn.Dropout(0.3), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
   lm.no_grad(function()
      local bn = m:get(2)
      bn.running_mean:copy_(lm.randn({ 8 }))
      bn.running_var:copy_(lm.rand({ 8 }) + 0.5)
      bn.weight:copy_(lm.randn({ 8 }))
      bn.bias:copy_(lm.randn({ 8 }))
   end)
   return m:eval()
end

-- the model run eagerly with its own operators, which the trace replays bit for bit. (With
-- gradients off, a model in evaluation mode runs its (conv, batch norm) pairs as one convolution
-- with the batch norm folded per call (lumen.nn.fold), equal to this only to rounding.)
local function eager(m, x)
   return lm.enable_grad(function() return m(x):detach() end)
end

local function ops_of(g)
   local r = {}
   for i, n in ipairs(g.graph.nodes) do r[i] = n.op end
   return r
end

describe("lm.jit.trace", function()
   it("records one node per operator, with the weights by state_dict name", function()
      local m = small_net()
      local x = lm.randn({ 2, 3, 8, 8 })
      local g = lm.jit.trace(m, x)
      assert.are.same({ "F.conv2d", "F.batch_norm", "Tensor.relu_", "F.max_pool2d",
                        "F.dropout", "F.flatten", "F.linear" }, ops_of(g))
      local names = {}
      for _, e in ipairs(g:named_tensors()) do names[#names + 1] = e[1] end
      table.sort(names)
      assert.are.same({ "0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var",
                        "1.weight", "6.bias", "6.weight" }, names)
      assert.are.equal(m:get(1).weight, g.tensors["0.weight"])   -- the model's own tensors
      local want = eager(m, x)
      assert.are.equal(0, maxdiff(want, lm.no_grad(function() return g(x) end)))
      -- another batch size runs too (flatten's sizes are computed when it runs)
      local x3 = lm.randn({ 3, 3, 8, 8 })
      assert.are.equal(0, maxdiff(m(x3), g(x3)))
   end)

   it("records sizes, dtype, format and device of every value; tostring prints them", function()
      local m = small_net()
      lm.to_channels_last(m)
      local x = lm.randn({ 2, 3, 8, 8 }):contiguous(lm.channels_last)
      local g = lm.jit.trace(m, x)
      local conv_out = g.graph.values[g.graph.nodes[1].outs.v]
      assert.are.same({ 2, 8, 8, 8 }, conv_out.sizes)
      assert.are.equal("float32", conv_out.dtype)
      assert.are.equal("channels_last", conv_out.format)
      assert.are.equal(lm.get_default_device(), conv_out.device)
      local s = tostring(g)
      local lines = {}
      for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
      assert.are.equal(#g.graph.nodes + 2, #lines)       -- header, one per node, return
      assert.truthy(lines[1]:find("graph(%x1 : float32[2, 3, 8, 8] channels_last", 1, true))
      assert.truthy(lines[2]:find("float32[2, 8, 8, 8] channels_last", 1, true))
      assert.truthy(lines[2]:find("= F.conv2d(%x1, %0.weight, %0.bias,", 1, true))
      assert.truthy(s:find("return %", 1, true))
   end)

   it("autograd works through the traced module (the model's parameters get gradients)", function()
      local m = small_net()
      local x = lm.randn({ 2, 3, 8, 8 })
      local g = lm.jit.trace(m, x)
      m(x):sum():backward()
      local want = m:get(1).weight.grad:clone()
      m:zero_grad()
      local y = g(x)
      assert.is_true(y.requires_grad)
      y:sum():backward()
      assert.is_true(maxdiff(want, m:get(1).weight.grad) < 1e-6)
   end)

   it("traces functions, several inputs and outputs, constants and in-place ops", function()
      local c = lm.tensor({ 1, 2, 3 })
      local fn = function(a, b)
         local s = a + b * c
         s:mul_(2)
         return s, lm.cat({ a, s }, 1)
      end
      local a, b = lm.randn({ 3 }), lm.randn({ 3 })
      local g = lm.jit.trace(fn, { a, b })
      local r1, r2 = g(a, b)
      local w1, w2 = fn(a, b)
      assert.are.equal(0, maxdiff(w1, r1))
      assert.are.equal(0, maxdiff(w2, r2))
      assert.are.equal("const", g.graph.values[g.graph.nodes[1].args[2].v].kind)
      local path = tmpfile()
      g:save(path)
      local g2 = lm.jit.load(path)
      local l1, l2 = g2(a, b)
      assert.are.equal(0, maxdiff(w1, l1))
      assert.are.equal(0, maxdiff(w2, l2))
      os.remove(path)
   end)

   it("warns when the traced forward reads a tensor's value", function()
      local msgs = {}
      local fn = function(x)
         if x:sum():item() > 0 then return x * 2 end
         return x
      end
      local g = lm.jit.trace(fn, lm.ones({ 2 }), { warn = function(m) msgs[#msgs + 1] = m end })
      assert.are.equal(1, #msgs)
      assert.truthy(msgs[1]:find("Tensor.item", 1, true))
      assert.are.equal(1, #g.graph.warnings)
   end)

   it("rejects what it cannot trace", function()
      assert.has_error(function() lm.jit.trace(42, lm.ones({ 2 })) end,
                       "lumen.jit.trace: model must be an nn.Module, a traced module or a " ..
                       "function, got number")
      assert.has_error(function() lm.jit.trace(function(x) return x end, 3) end)
      assert.has_error(function() lm.jit.trace(function() return 1 end, lm.ones({ 1 })) end)
      local ok, err = pcall(lm.jit.trace, function(x) return x:add(x, { f = print }) end,
                            lm.ones({ 1 }))
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.jit.trace: operator Tensor.add", 1, true))
      -- the operators are put back also after an error
      assert.are.equal(2, (lm.ones({ 1 }) + lm.ones({ 1 })):item())
   end)
end)

describe("g:save / lm.jit.load", function()
   local path
   before_each(function() path = tmpfile() end)
   after_each(function() os.remove(path) end)

   it("writes one safetensors file that loads without the model, formats kept", function()
      local m = small_net()
      lm.to_channels_last(m)
      local x = lm.randn({ 2, 3, 8, 8 }):contiguous(lm.channels_last)
      local g = lm.jit.trace(m, x)
      g:save(path)
      local t, meta = lm.load(path)                      -- any safetensors reader reads it
      assert.are.equal("1", meta["lumen.jit.version"])
      assert.truthy(meta["lumen.jit.graph"])
      assert.is_true(t["0.weight"]:is_contiguous(lm.channels_last))
      local g2 = lm.jit.load(path)
      assert.are.equal(tostring(g), tostring(g2))
      local y = lm.no_grad(function() return g2(x) end)
      assert.are.equal(0, maxdiff(eager(m, x), y))
      -- the loaded graph reproduces the formats: trace the loaded module again
      local g3 = lm.jit.trace(g2, x)
      for i, n in ipairs(g3.graph.nodes) do
         local o = g.graph.values[g.graph.nodes[i].outs.v]
         assert.are.equal(o.format, g3.graph.values[n.outs.v].format)
      end
   end)

   -- rewrite the file's metadata (a valid checksum unless keep_sum)
   local function rewrite(src, dst, edit, keep_sum)
      local t, meta = lm.load(src)
      local own = {}
      for k, v in pairs(t) do own[k] = v:clone() end
      edit(meta, own)
      if not keep_sum then
         meta["lumen.jit.checksum"] = require("lumen.jit.serialize").checksum(
            meta["lumen.jit.graph"], own)
      end
      S.save(own, dst, meta)
   end

   local function load_error(p)
      local ok, err = pcall(lm.jit.load, p)
      assert.is_false(ok)
      return tostring(err)
   end

   it("gives clear errors for bad files", function()
      local g = lm.jit.trace(small_net(), lm.randn({ 1, 3, 8, 8 }))
      g:save(path)
      local bad = tmpfile()
      local json = S.json
      -- not a file / not a jit file / truncated
      assert.truthy(load_error(bad):find("^lumen.jit.load: "))
      lm.save({ a = lm.ones({ 2 }) }, bad)
      assert.truthy(load_error(bad):find("no graph in the file's metadata", 1, true))
      local f = io.open(path, "rb")
      local bytes = f:read("*a")
      f:close()
      f = io.open(bad, "wb")
      f:write(bytes:sub(1, #bytes - 100))
      f:close()
      assert.truthy(load_error(bad):find("^lumen.jit.load: "))
      -- tampered: a weight's value, or the graph text, changed after saving
      rewrite(path, bad, function(_, t) t["0.weight"]:add_(1) end, true)
      assert.truthy(load_error(bad):find("checksum mismatch", 1, true))
      rewrite(path, bad, function(meta)
         meta["lumen.jit.graph"] = meta["lumen.jit.graph"]:gsub("F.max_pool2d", "F.avg_pool2d")
      end, true)
      assert.truthy(load_error(bad):find("checksum mismatch", 1, true))
      -- a newer format
      rewrite(path, bad, function(meta) meta["lumen.jit.version"] = "99" end)
      assert.truthy(load_error(bad):find("format version 99; this lumen reads version 1", 1, true))
      -- a damaged graph (valid checksum)
      rewrite(path, bad, function(meta)
         meta["lumen.jit.graph"] = "{\"version\": 1, \"nodes\": ["
      end)
      assert.truthy(load_error(bad):find("damaged graph", 1, true))
      for _, edit in ipairs({
         function(d) d.nodes[2].args[1] = { v = 999 } end,
         function(d) d.values[1].dtype = "float99" end,
         function(d) d.nodes[3].outs = { v = 1 } end,
         function(d) d.inputs = { "x" } end,
         function(d) d.nodes = 5 end,
      }) do
         rewrite(path, bad, function(meta)
            local d = json.decode(meta["lumen.jit.graph"])
            edit(d)
            meta["lumen.jit.graph"] = json.encode(d)
         end)
         assert.truthy(load_error(bad):find("damaged graph", 1, true))
      end
      -- an unknown node, and operators a file may not name
      for _, op in ipairs({ "F.no_such_op", "lm.save", "Tensor.backward", "os.execute" }) do
         rewrite(path, bad, function(meta)
            local d = json.decode(meta["lumen.jit.graph"])
            d.nodes[1].op = op
            meta["lumen.jit.graph"] = json.encode(d)
         end)
         assert.truthy(load_error(bad):find("unknown operator '" .. op .. "'", 1, true))
      end
      -- graph / weight mismatch: a weight missing, of another size, one the graph does not use
      rewrite(path, bad, function(_, t) t["6.bias"] = nil end)
      assert.truthy(load_error(bad):find("graph/weight mismatch: the graph's weight '6.bias'",
                                         1, true))
      rewrite(path, bad, function(_, t) t["6.bias"] = lm.zeros({ 4 }) end)
      assert.truthy(load_error(bad):find("'6.bias' is float32[5] in the graph but float32[4]",
                                         1, true))
      rewrite(path, bad, function(_, t) t.extra = lm.zeros({ 4 }) end)
      assert.truthy(load_error(bad):find("the file's tensor 'extra' is not in the graph", 1, true))
      os.remove(bad)
   end)
end)

describe("lm.jit.freeze", function()
   local function close(tag, a, b, tol)
      local d = maxdiff(a, b)
      local scale = math.max(1, b:abs():max():item())
      assert.is_true(d <= tol * scale, tag .. ": max difference " .. d)
   end
   local function conv_opts(g, k)
      local n = 0
      for _, node in ipairs(g.graph.nodes) do
         if node.op == "F.conv2d" then
            n = n + 1
            if n == k then return node.args[4].map end
         end
      end
   end

   it("removes dropout, folds the batch norm, fuses bias + relu into the convolution", function()
      local m = small_net()
      local x = lm.randn({ 2, 3, 8, 8 })
      local g = lm.jit.trace(m, x)
      local f = lm.jit.freeze(g)
      assert.are.same({ "Tensor.contiguous", "F.conv2d", "F.max_pool2d", "F.flatten", "F.linear" },
                      ops_of(f))
      assert.are.equal(1, f.freeze_stats.dropout)
      assert.are.equal(1, f.freeze_stats.fold_bn)
      assert.is_true(conv_opts(f, 1).relu)
      close("frozen", lm.no_grad(function() return f(x) end), m(x), 1e-5)
      -- g is unchanged; the frozen weights do not require grad; it saves and loads
      assert.are.equal(7, #g.graph.nodes)
      for _, p in ipairs(f:parameters()) do assert.is_falsy(p.requires_grad) end
      local path = tmpfile()
      f:save(path)
      local f2 = lm.jit.load(path)
      os.remove(path)
      close("loaded", lm.no_grad(function() return f2(x) end), m(x), 1e-5)
   end)

   it("fuses conv -> add -> relu into the convolution's residual epilogue", function()
      lm.manual_seed(2)
      local w1, w2 = lm.randn({ 4, 4, 3, 3 }), lm.randn({ 4, 4, 1, 1 })
      local b1 = lm.randn({ 4 })
      local fn = function(x)
         local y = F.conv2d(x, w1, b1, { padding = 1 }):relu()
         local z = F.conv2d(y, w2) + x
         return z:relu_(), F.conv2d(x, w2) + y      -- the second: conv + residual, no relu
      end
      local x = lm.randn({ 1, 4, 5, 5 })
      local f = lm.jit.freeze(lm.jit.trace(fn, x))
      assert.are.same({ "Tensor.contiguous", "F.conv2d", "F.conv2d", "F.conv2d",
                        "Tensor.contiguous", "Tensor.contiguous" }, ops_of(f))
      assert.is_true(conv_opts(f, 1).relu)
      assert.is_true(conv_opts(f, 2).relu)
      assert.is_not_nil(conv_opts(f, 2).residual.v)
      assert.is_nil(conv_opts(f, 3).relu)
      assert.is_not_nil(conv_opts(f, 3).residual.v)
      local a1, a2 = f(x)
      local e1, e2 = fn(x)
      close("relu(conv + x)", a1, e1, 1e-5)
      close("conv + y", a2, e2, 1e-5)
      assert.is_true(a1:is_contiguous())            -- the output keeps the traced format
   end)

   it("folds a batch norm that adds a residual, with its own eps", function()
      lm.manual_seed(4)
      local w = lm.randn({ 6, 6, 1, 1 })
      local rm, rv = lm.randn({ 6 }) * 0.1, lm.rand({ 6 }) + 0.5
      local gw, gb = lm.randn({ 6 }), lm.randn({ 6 })
      local fn = function(x)
         -- eps 1e-3 (MobileNet V3's): the options refer to x, and were read without it
         return F.batch_norm(F.conv2d(x, w), rm, rv, gw, gb,
                             { eps = 1e-3, training = false, residual = x })
      end
      local x = lm.randn({ 2, 6, 4, 5 }):contiguous(lm.channels_last)
      local f = lm.jit.freeze(lm.jit.trace(fn, x))
      assert.are.equal(1, f.freeze_stats.fold_bn)
      close("bn(conv(x)) + x", f(x), fn(x), 1e-5)
   end)

   it("does not move a convolution past an in-place write into its input", function()
      local w = lm.randn({ 3, 3, 1, 1 })
      local fn = function(x)
         local y = x * 1
         local c = F.conv2d(y, w)
         y:neg_()
         return (c + y):relu()
      end
      local x = lm.randn({ 1, 3, 4, 4 })
      local f = lm.jit.freeze(lm.jit.trace(fn, x))
      assert.are.equal(0, f.freeze_stats.fuse)
      close("in place", f(x), fn(x), 1e-6)
      -- nor past one that writes into it through a view
      local fv = function(t)
         local y = t * 1
         local c = F.conv2d(y, w)
         y:view(-1):neg_()
         return (c + y):relu()
      end
      local fvz = lm.jit.freeze(lm.jit.trace(fv, x))
      assert.are.equal(0, fvz.freeze_stats.fuse)
      close("in place through a view", fvz(x), fv(x), 1e-6)
   end)

   it("leaves a batch norm after no convolution, and one whose input has other uses", function()
      local bn = nn.BatchNorm2d(3):eval()
      local w = lm.randn({ 3, 3, 1, 1 })
      local fn = function(x)
         local c = F.conv2d(x, w)
         return bn(x) + bn(c) + c
      end
      local x = lm.randn({ 1, 3, 4, 4 })
      local f = lm.jit.freeze(lm.jit.trace(fn, x))
      assert.are.equal(2, f:count("F.batch_norm"))
      close("bn", f(x), fn(x), 1e-6)
   end)

   it("propagates channels-last: conversions in between cancel, one at input, output", function()
      lm.manual_seed(3)
      local w1, w2 = lm.randn({ 8, 3, 3, 3 }), lm.randn({ 8, 8, 3, 3 })
      local fn = function(x)
         local y = F.conv2d(x:contiguous(lm.channels_last), w1:contiguous(lm.channels_last))
         y = y:contiguous():relu()
         y = F.conv2d(y:contiguous(lm.channels_last), w2)
         y = F.max_pool2d(y:contiguous(), 2)
         return y:contiguous(lm.channels_last):contiguous()
      end
      local x = lm.randn({ 2, 3, 9, 9 })
      local g = lm.jit.trace(fn, x)
      assert.are.equal(7, g:count("Tensor.contiguous"))
      local f = lm.jit.freeze(g)
      assert.are.equal(2, f:count("Tensor.contiguous"))
      assert.are.equal("Tensor.contiguous", f.graph.nodes[1].op)
      assert.are.equal("Tensor.contiguous", f.graph.nodes[#f.graph.nodes].op)
      for i = 2, #f.graph.nodes - 1 do
         local n = f.graph.nodes[i]
         assert.are.equal("channels_last", f.graph.values[n.outs.v].format, n.op)
      end
      local y = f(x)
      assert.is_true(y:is_contiguous())
      close("layout", y, fn(x), 1e-5)
      -- a graph with a view of a 4-D value keeps its layouts (the view needs them)
      local fv = function(t) return F.conv2d(t, w1):contiguous():view(2, -1) end
      local xv = lm.randn({ 2, 3, 9, 9 })
      local ff = lm.jit.freeze(lm.jit.trace(fv, xv))
      assert.truthy(ff.freeze_stats.layout_skipped:find("Tensor.view", 1, true))
      close("view", ff(xv), fv(xv), 1e-5)
   end)

   it("refuses graphs traced in training mode", function()
      local m = small_net():train()
      local g = lm.jit.trace(m, lm.randn({ 2, 3, 8, 8 }))
      assert.has_error(function() lm.jit.freeze(g) end,
         "lumen.jit.freeze: node 2: a batch norm in training mode: trace the model after " ..
         "model:eval()")
      assert.has_error(function() lm.jit.freeze(m) end)
   end)
end)

describe("lm.jit on the video models (5-D, channels_last_3d)", function()
   it("traces, saves, loads and freezes r3d_18, r2plus1d_18, mc3_18", function()
      if lm.get_default_device():match("^cuda") then return end
      for i, name in ipairs({ "r3d_18", "r2plus1d_18", "mc3_18" }) do
         lm.manual_seed(60 + i)
         local m = lm.models[name]({ num_classes = 6 })
         lm.to_channels_last(m)
         m:eval()
         local x = lm.randn({ 1, 3, 4, 24, 24 }):to(lm.channels_last_3d)
         local ref = eager(m, x)
         local path = os.tmpname()
         lm.jit.trace(m, x):save(path)
         local g = lm.jit.load(path)
         os.remove(path)
         assert.are.equal(0, maxdiff(lm.no_grad(function() return g(x) end), ref), name)
         local f = lm.jit.freeze(g)
         local d = maxdiff(lm.no_grad(function() return f(x) end), ref)
         assert.is_true(d <= 1e-4 * ref:abs():max():item(), name .. " frozen: " .. d)
         assert.is_nil(tostring(f):find("batch_norm", 1, true), name .. ": a batch norm left")
         assert.truthy(tostring(f):find("channels_last_3d", 1, true), name)
      end
   end)
end)

describe("lm.jit and lm.onnx in lumen's namespace", function()
   it("are loaded on first use, not by require('lumen')", function()
      local shell = require("spec.shell")
      local out, rc = shell.sh("bin/lumen -e 'local lm = require(\"lumen\"); " ..
         "print(package.loaded[\"lumen.jit\"], package.loaded[\"lumen.onnx\"], " ..
         "type(lm.jit.trace), type(lm.onnx.export))'")
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("nil\tnil\tfunction\tfunction", 1, true), out)
   end)
end)
