-- spec/index_ops_spec.lua -- the indexing operators (lua/lumen/autograd/indexing.lua over
-- src/ops/indexing.c): sort / argsort / topk, gather / scatter_add / scatter_add_ /
-- index_select, cumsum, flip. (spec/indexing_spec.lua is Torch7's t[i] indexing.)
-- Values, indices and gradients against PyTorch 2.x (spec/fixtures/nn/gen_indexing.py ->
-- spec/fixtures/nn/indexing.lua) for every case in three layouts (contiguous, channels-last for
-- 4-D and 5-D, strided); the results' layouts as PyTorch's; float16 / bfloat16 against float32
-- on the rounded inputs; finite differences in float64; long rows; bad input. Under
-- LUMEN_TEST_DEVICE the same run there.

local H = require("spec.helpers")
local G = require("spec.gradcheck")
local lm = H.lm

local DEV = os.getenv("LUMEN_TEST_DEVICE")
if DEV == "" then DEV = nil end

local CASES = assert(loadfile("spec/fixtures/nn/indexing.lua"))()

local DT = { float64 = lm.float64, float32 = lm.float32, int64 = lm.int64, int32 = lm.int32,
             uint8 = lm.uint8, bool = lm.bool, float16 = lm.float16, bfloat16 = lm.bfloat16 }

local function on_dev(t)
   if DEV then return t:to(DEV) end
   return t
end

-- a tensor of sizes and dtype name dt from row-major values, in layout lay: "contiguous",
-- "channels_last" (channels_last_3d for 5-D) or "strided" (every other element of a wider one)
local function make(vals, sizes, dt, lay)
   local t = lm.tensor(vals, { dtype = lm.float64 }):view(sizes)
   t = dt == "bool" and t:ne(0) or t:to(DT[dt])
   if lay == "channels_last" then
      t = t:contiguous(#sizes == 4 and lm.channels_last or lm.channels_last_3d)
   elseif lay == "strided" then
      local nd = #sizes
      t = lm.stack({ t, t }, nd + 1):select(nd + 1, 1)
   end
   return on_dev(t)
end

local function index_of(vals, sizes)
   return on_dev(lm.tensor(vals, { dtype = lm.int64 }):view(sizes))
end

local function vals(t)
   t = t:cpu():contiguous()
   if t:dtype() == lm.bool then t = t:to(lm.int64) end
   if t:dtype() == lm.float16 or t:dtype() == lm.bfloat16 then t = t:float() end
   return t:view(-1):totable()
end

local function close(t, exp, dt, what)
   local got = vals(t)
   assert.are.equal(#exp, #got, what .. ": element count")
   local scale = 1
   for i = 1, #exp do
      if exp[i] == exp[i] and math.abs(exp[i]) > scale then scale = math.abs(exp[i]) end
   end
   local tol = dt == "float64" and 1e-12 or dt == "float32" and 2e-6 or
               (dt == "float16" or dt == "bfloat16") and 2e-2 or 0
   for i = 1, #exp do
      local g, e = got[i], exp[i]
      local ok = (e ~= e and g ~= g) or math.abs(g - e) <= tol * scale
      assert(ok, ("%s [%d]: got %s, PyTorch %s"):format(what, i, tostring(g), tostring(e)))
   end
end

local function layouts(nd)
   if nd == 4 or nd == 5 then return { "contiguous", "channels_last", "strided" } end
   return { "contiguous", "strided" }
end

local function cl_fmt(nd) return nd == 4 and lm.channels_last or lm.channels_last_3d end

local function float(dt) return dt == "float64" or dt == "float32" end

-- run one fixture case in one layout
local function run(c, lay)
   local fl = float(c.dtype)
   local x = make(c.x, c.sizes, c.dtype, lay)
   if fl then x = x:detach():requires_grad_(true) end
   local nd = #c.sizes
   local w = ("%s %s %s dim %s"):format(c.op, c.dtype, lay, tostring(c.dim))
   local y, grads
   if c.op == "sort" then
      local v, i = x:sort(c.dim, c.descending)
      close(v, c.values, c.dtype, w .. " values")
      close(i, c.indices, "int64", w .. " indices")
      assert.are.equal(lm.int64, i:dtype())
      if lay == "channels_last" then
         -- PyTorch: sort's results keep a dense input's strides
         assert.is_true(v:is_contiguous(cl_fmt(nd)), w .. ": values channels-last")
         assert.is_true(i:is_contiguous(cl_fmt(nd)), w .. ": indices channels-last")
      end
      close(x:argsort(c.dim, c.descending), c.indices, "int64", w .. " argsort")
      y = v
   elseif c.op == "topk" then
      local v, i = x:topk(c.k, c.dim, c.largest)
      assert.is_true(H.list_equal(c.out_sizes, v:size()), w .. ": sizes")
      close(v, c.values, c.dtype, w .. " values")
      close(i, c.indices, "int64", w .. " indices")
      assert.is_true(v:is_contiguous(), w .. ": contiguous (PyTorch's)")
      y = v
   elseif c.op == "gather" then
      y = x:gather(c.dim, index_of(c.index, c.index_sizes))
      close(y, c.out, c.dtype, w)
      assert.is_true(y:is_contiguous(), w .. ": contiguous (PyTorch's)")
   elseif c.op == "scatter_add" then
      local src = make(c.src, c.src_sizes, c.dtype, lay == "channels_last" and "contiguous" or lay)
      if fl then src = src:detach():requires_grad_(true) end
      y = x:scatter_add(c.dim, index_of(c.index, c.index_sizes), src)
      close(y, c.out, c.dtype, w)
      assert.is_true(y:is_contiguous(), w .. ": contiguous (PyTorch's)")
      -- in place on a copy in the input's layout: the same values, self keeps its strides
      local t = x:detach():clone()
      local r = t:scatter_add_(c.dim, index_of(c.index, c.index_sizes), src:detach())
      assert.are.equal(t, r)
      close(t, c.out, c.dtype, w .. " (in place)")
      grads = { { src, c.gsrc } }
   elseif c.op == "index_select" then
      y = x:index_select(c.dim, on_dev(lm.tensor(c.index, { dtype = lm.int64 })))
      assert.is_true(H.list_equal(c.out_sizes, y:size()), w .. ": sizes")
      close(y, c.out, c.dtype, w)
   elseif c.op == "cumsum" then
      y = x:cumsum(c.dim)
      assert.are.equal(DT[c.out_dtype], y:dtype(), w .. ": dtype")
      close(y, c.out, fl and c.dtype or "int64", w)
      assert.is_true(y:is_contiguous(), w .. ": contiguous (PyTorch's)")
   elseif c.op == "flip" then
      y = x:flip(c.dims)
      close(y, c.out, c.dtype, w)
      if lay == "channels_last" then
         assert.is_true(y:is_contiguous(cl_fmt(nd)), w .. ": keeps channels-last (PyTorch's)")
      end
   end
   if fl and c.gout then
      y:backward(on_dev(lm.tensor(c.gout, { dtype = DT[c.dtype] }):view(y:size())))
      close(x.grad, c.gx, c.dtype, w .. " grad input")
      for _, p in ipairs(grads or {}) do close(p[1].grad, p[2], c.dtype, w .. " grad src") end
   end
end

describe("indexing against PyTorch", function()
   for n, c in ipairs(CASES) do
      it(("%d %s %s [%s] dim %s"):format(n, c.op, c.dtype, table.concat(c.sizes, "x"),
                                         tostring(c.dim or table.concat(c.dims, ","))), function()
         for _, lay in ipairs(layouts(#c.sizes)) do run(c, lay) end
      end)
   end
end)

describe("indexing: half precision", function()
   -- float16 / bfloat16 against float32 on the rounded inputs: sort and gather move values
   -- exactly; cumsum adds in float32 and rounds each partial sum
   for _, hd in ipairs({ "float16", "bfloat16" }) do
      it(hd .. " sort, topk, gather, index_select, scatter_add, cumsum, flip", function()
         local x = on_dev(lm.randn({ 2, 3, 4, 5 }):mul(3):to(DT[hd]))
         local x32 = x:float()
         for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
            local xh = x:contiguous(fmt)
            for d = 1, 4 do
               local v, i = xh:sort(d, d % 2 == 0)
               local v32, i32 = x32:sort(d, d % 2 == 0)
               assert.are.equal(DT[hd], v:dtype())
               assert.are.same(vals(v32), vals(v))
               assert.are.same(vals(i32), vals(i))
               local tv = xh:topk(2, d)
               assert.are.same(vals(x32:topk(2, d)), vals(tv))
               local idx = on_dev(lm.randint(1, x:size(d) + 1, { 2, 2, 3, 4 }))
               assert.are.same(vals(x32:gather(d, idx)), vals(xh:gather(d, idx)))
               local sel = on_dev(lm.tensor({ 2, 1, 2 }, { dtype = lm.int64 }))
               assert.are.same(vals(x32:index_select(d, sel)), vals(xh:index_select(d, sel)))
               local c = xh:cumsum(d)
               assert.are.equal(DT[hd], c:dtype())
               close(c, vals(x32:cumsum(d):to(DT[hd])), hd, hd .. " cumsum")
               local z = on_dev(lm.zeros({ 2, 3, 4, 5 }, { dtype = DT[hd] }))
               local s = z:scatter_add(d, idx, xh:narrow(1, 1, 2):narrow(2, 1, 2):narrow(3, 1, 3)
                                            :narrow(4, 1, 4):contiguous())
               close(s, vals(z:float():scatter_add(d, idx, x32:narrow(1, 1, 2):narrow(2, 1, 2)
                                                    :narrow(3, 1, 3):narrow(4, 1, 4):contiguous())),
                     hd, hd .. " scatter_add")
               assert.are.same(vals(x32:flip(d)), vals(xh:flip(d)))
            end
         end
      end)
   end
end)

describe("indexing: gradients", function()
   local function input(sizes, fmt, seed)
      local x = G.input(sizes, fmt, seed)
      if DEV then x = x:detach():to(DEV):requires_grad_(true) end
      return x
   end
   it("finite differences in float64, contiguous and channels-last", function()
      for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
         local x = input({ 2, 3, 4, 2 }, fmt, 13)
         local idx = on_dev(lm.tensor({ { { { 1, 2 } }, { { 3, 3 } } } }, { dtype = lm.int64 }))
            :expand({ 2, 2, 1, 2 }):contiguous()
         assert.is_true(G.check(function(a) return (a:sort(2)) end, { x }))
         assert.is_true(G.check(function(a) return (a:sort(4, true)) end, { x }))
         assert.is_true(G.check(function(a) return (a:topk(2, 3)) end, { x }))
         assert.is_true(G.check(function(a) return a:gather(3, idx) end, { x }))
         assert.is_true(G.check(function(a) return a:index_select(2, on_dev(lm.tensor({ 3, 1, 3 },
            { dtype = lm.int64 }))) end, { x }))
         assert.is_true(G.check(function(a) return a:cumsum(2) end, { x }))
         assert.is_true(G.check(function(a) return a:flip({ 1, 3 }) end, { x }))
         local src = input({ 2, 2, 1, 2 }, nil, 17)
         assert.is_true(G.check(function(a, s) return a:scatter_add(2, idx, s) end, { x, src }))
         -- a src larger than the index: the gradient is zero where the index does not reach
         local big = input({ 3, 2, 2, 2 }, nil, 19)
         assert.is_true(G.check(function(a, s) return a:scatter_add(2, idx, s) end, { x, big }))
         assert.is_true(G.check(function(a, s)
            return (a * 1):scatter_add_(2, idx, s)
         end, { x, src }))
      end
   end)

   it("the gradient of sort, gather, index_select and cumsum comes back in the input's layout",
      function()
      local x = on_dev(lm.randn({ 2, 3, 4, 5 }):contiguous(lm.channels_last)):requires_grad_(true)
      for _, f in ipairs({
         function(h) return (h:sort(2)) end,
         function(h) return h:gather(4, on_dev(lm.ones({ 2, 3, 4, 2 }, { dtype = lm.int64 }))) end,
         function(h)
            return h:index_select(3, on_dev(lm.tensor({ 1, 4 }, { dtype = lm.int64 })))
         end,
         function(h) return h:cumsum(2) end,
      }) do
         local box = {}
         local h = x * 1
         h:register_hook(function(g) box.g = g end)
         f(h):sum():backward()
         assert.is_true(box.g:is_contiguous(lm.channels_last))
      end
   end)

   it("a leaf that requires grad refuses scatter_add_", function()
      local x = on_dev(lm.zeros({ 3 })):requires_grad_(true)
      H.assert_error_like("scatter_add_", "leaf", function()
         return x:scatter_add_(1, on_dev(lm.tensor({ 1 }, { dtype = lm.int64 })),
                               on_dev(lm.ones({ 1 })))
      end)
   end)
end)

describe("indexing: shapes, options and functional forms", function()
   it("long rows sort stably (merges across many runs), any length", function()
      for _, n in ipairs({ 1, 15, 16, 17, 33, 1000, 4099 }) do
         local x = on_dev(lm.randint(0, 9, { 2, n }):double())
         for _, desc in ipairs({ false, true }) do
            local v, i = x:sort(2, desc)
            local xs = x:cpu():totable()
            for r = 1, 2 do
               local p = {}
               for j = 1, n do p[j] = j end
               table.sort(p, function(a, b)
                  local xa, xb = xs[r][a], xs[r][b]
                  if xa ~= xb then
                     if desc then return xa > xb end
                     return xa < xb
                  end
                  return a < b
               end)
               local iv, vv = i:cpu():totable()[r], v:cpu():totable()[r]
               for j = 1, n do
                  assert(iv[j] == p[j], ("n %d row %d [%d]: %d, stable order %d"):format(n, r, j,
                         iv[j], p[j]))
                  assert(vv[j] == xs[r][p[j]])
               end
            end
         end
      end
   end)

   it("the options table, defaults, lm.* forms, 0-dim and empty tensors", function()
      local x = on_dev(lm.tensor({ { 3, 1, 2 }, { 0, 5, 4 } }))
      local v, i = x:sort({ dim = 1, descending = true, stable = true })
      assert.are.same({ { 3, 5, 4 }, { 0, 1, 2 } }, v:cpu():totable())
      assert.are.same({ { 1, 2, 2 }, { 2, 1, 1 } }, i:cpu():totable())
      v = x:sort() -- the last dim, ascending
      assert.are.same({ { 1, 2, 3 }, { 0, 4, 5 } }, v:cpu():totable())
      local a, b = lm.sort(x, 2, true)
      assert.are.same({ { 3, 2, 1 }, { 5, 4, 0 } }, a:cpu():totable())
      assert.are.same({ { 1, 3, 2 }, { 2, 3, 1 } }, b:cpu():totable())
      assert.are.same({ { 2, 3, 1 }, { 1, 3, 2 } }, lm.argsort(x):cpu():totable())
      local tv, ti = lm.topk(x, 2)
      assert.are.same({ { 3, 2 }, { 5, 4 } }, tv:cpu():totable())
      assert.are.same({ { 1, 3 }, { 2, 3 } }, ti:cpu():totable())
      tv = x:topk(1, 1, false)
      assert.are.same({ { 0, 1, 2 } }, tv:cpu():totable())
      tv, ti = x:topk(1, { dim = 1, largest = false, sorted = true })
      assert.are.same({ { 0, 1, 2 } }, tv:cpu():totable())
      assert.are.same({ { 2, 1, 1 } }, ti:cpu():totable())
      assert.are.same({ 2, 0 }, x:topk(0):size())
      local idx = on_dev(lm.tensor({ { 3 }, { 1 } }, { dtype = lm.int64 }))
      assert.are.same({ { 2 }, { 0 } }, lm.gather(x, 2, idx):cpu():totable())
      assert.are.same({ { 2, 3 }, { 4, 0 } }, lm.index_select(x, 2, on_dev(lm.tensor({ 3, 1 },
         { dtype = lm.int64 }))):cpu():totable())
      assert.are.same({ { 3, 4, 6 }, { 0, 5, 9 } }, lm.cumsum(x, 2):cpu():totable())
      assert.are.same({ { 4, 5, 0 }, { 2, 1, 3 } }, lm.flip(x, { 1, 2 }):cpu():totable())
      assert.are.same({ { 3, 1, 3 }, { 1, 5, 4 } },
         lm.scatter_add(x, 2, idx, on_dev(lm.ones({ 2, 1 }, { dtype = lm.int64 }))):cpu():totable())
      -- 0-dim
      local s = on_dev(lm.tensor(2.5))
      v, i = s:sort()
      assert.are.equal(0, v:dim())
      assert.are.equal(2.5, v:item())
      assert.are.equal(1, i:item())
      assert.are.equal(2.5, s:cumsum(1):item())
      assert.are.equal(2.5, s:gather(1, on_dev(lm.tensor(1, { dtype = lm.int64 }))):item())
      -- empty
      local e = on_dev(lm.zeros({ 0, 3 }))
      assert.are.same({ 0, 3 }, (e:sort(1)):size())
      assert.are.same({ 0, 3 }, e:cumsum(1):size())
      local e_idx = on_dev(lm.zeros({ 0, 3 }, { dtype = lm.int64 }))
      assert.are.same({ 0, 3 }, e:gather(2, e_idx):size())
      -- cumsum's dtype argument; bool input sums into int64
      assert.are.equal(lm.float64, x:cumsum(1, lm.float64):dtype())
      local bl = on_dev(lm.tensor({ 1, 0, 1 })):ne(0)
      assert.are.same({ 1, 1, 2 }, bl:cumsum(1):cpu():totable())
      assert.are.equal(lm.int64, bl:cumsum(1):dtype())
   end)

   it("cumsum runs in float32 under autocast (PyTorch's fp32_set_opt_dtype)", function()
      local x = on_dev(lm.randn({ 3, 4 })):to(lm.bfloat16)
      lm.autocast({ dtype = lm.bfloat16 }, function()
         assert.are.equal(lm.float32, x:cumsum(2):dtype())
         assert.are.equal(lm.float32, lm.cumsum(x, 1):dtype())
         assert.are.equal(lm.float64, x:cumsum(2, lm.float64):dtype())
      end)
      assert.are.equal(lm.bfloat16, x:cumsum(2):dtype())
   end)

   it("sort of a transposed or sliced input: dense strides in its order (PyTorch's)", function()
      local t = on_dev(lm.randn({ 6, 8 })):t()
      local v, i = t:sort(1)
      assert.are.same(t:stride(), v:stride())
      assert.are.same(t:stride(), i:stride())
      local sl = on_dev(lm.randn({ 6, 8 })):narrow(1, 1, 3):t() -- sizes 8x3, strides 1, 8
      v = sl:sort(2)
      assert.are.same({ 1, 8 }, v:stride())
   end)
end)

describe("indexing: bad input names the function and the problem", function()
   local x = on_dev(lm.randn({ 3, 4 }))
   local idx = on_dev(lm.tensor({ { 1, 2 } }, { dtype = lm.int64 }))
   it("index values out of range", function()
      H.assert_error_like("gather", "index 5 is out of bounds for dimension 2 with size 4",
         function() return x:gather(2, on_dev(lm.tensor({ { 1, 5 } }, { dtype = lm.int64 }))) end)
      H.assert_error_like("gather", "index 0 is out of bounds for dimension 1 with size 3",
         function() return x:gather(1, on_dev(lm.tensor({ { 0, 1 } }, { dtype = lm.int64 }))) end)
      H.assert_error_like("scatter_add", "index -1 is out of bounds", function()
         return x:scatter_add(2, on_dev(lm.tensor({ { -1 } }, { dtype = lm.int64 })), x)
      end)
      local t = x:clone()
      H.assert_error_like("scatter_add_", "index 9 is out of bounds", function()
         return t:scatter_add_(1, on_dev(lm.tensor({ { 1, 9 } }, { dtype = lm.int64 })), x)
      end)
      assert.is_true(t:equal(x), "nothing written before the error")
      H.assert_error_like("index_select", "index 4 is out of bounds for dimension 1 with size 3",
         function() return x:index_select(1, on_dev(lm.tensor({ 1, 4 }, { dtype = lm.int64 }))) end)
   end)
   it("wrong types, ranks, dims and options", function()
      H.assert_error_like("gather", "int64", function()
         return x:gather(2, on_dev(lm.tensor({ { 1, 2 } }, { dtype = lm.float32 })))
      end)
      H.assert_error_like("gather", "tensor expected", function() return x:gather(2, { 1 }) end)
      H.assert_error_like("gather", "tensor expected", function() return x:gather(2, nil) end)
      H.assert_error_like("gather", "same number of dimensions", function()
         return x:gather(2, on_dev(lm.tensor({ 1 }, { dtype = lm.int64 })))
      end)
      H.assert_error_like("gather", "no larger than", function()
         return x:gather(2, on_dev(lm.ones({ 5, 1 }, { dtype = lm.int64 })))
      end)
      H.assert_error_like("gather", "out of range", function() return x:gather(3, idx) end)
      H.assert_error_like("gather", "dim must be an integer", function()
         return x:gather(nil, idx)
      end)
      H.assert_error_like("sort", "out of range", function() return x:sort(3) end)
      H.assert_error_like("sort", "unknown option", function() return x:sort({ dims = 1 }) end)
      H.assert_error_like("sort", "descending must be a boolean", function()
         return x:sort(1, 1)
      end)
      H.assert_error_like("sort", "tensor expected", function() return lm.sort(7) end)
      H.assert_error_like("argsort", "out of range", function() return x:argsort(-3) end)
      H.assert_error_like("topk", "out of range", function() return x:topk(5) end)
      H.assert_error_like("topk", "k must be an integer", function() return x:topk(1.5) end)
      H.assert_error_like("topk", "unknown option", function() return x:topk(1, { dims = 1 }) end)
      H.assert_error_like("scatter_add", "src", function() return x:scatter_add(2, idx, 3) end)
      H.assert_error_like("scatter_add", "dtype", function()
         return x:scatter_add(2, idx, x:double())
      end)
      H.assert_error_like("scatter_add_", "memory location", function()
         return on_dev(lm.zeros({ 1, 4 })):expand({ 3, 4 }):scatter_add_(2, idx, x)
      end)
      H.assert_error_like("scatter_add_", "single memory location", function()
         local t = x:clone()
         return t:scatter_add_(2, idx, t)
      end)
      H.assert_error_like("index_select", "1-D", function()
         return x:index_select(1, on_dev(lm.ones({ 1, 1 }, { dtype = lm.int64 })))
      end)
      H.assert_error_like("cumsum", "out of range", function() return x:cumsum(3) end)
      H.assert_error_like("cumsum", "dim must be an integer", function() return x:cumsum() end)
      H.assert_error_like("flip", "multiple times", function() return x:flip({ 1, -2 }) end)
      H.assert_error_like("flip", "dims", function() return x:flip() end)
   end)
end)

describe("indexing in a traced model", function()
   it("lm.jit.trace replays them; ONNX export names the operator it cannot write", function()
      local sel = on_dev(lm.tensor({ 2, 1, 4, 3 }, { dtype = lm.int64 }))
      local function f(x)
         local v, i = x:sort(2, true)
         local t = v:cumsum(2) + x:gather(2, i) + lm.topk(x, 4)
         return t:flip(1):index_select(2, sel):scatter_add(2, i:narrow(1, 1, 2), x:narrow(1, 1, 2))
      end
      local x = on_dev(lm.randn({ 3, 4 }))
      local tr = lm.jit.trace(f, x)
      local x2 = on_dev(lm.randn({ 3, 4 }))
      assert.is_true(tr(x2):equal(f(x2)))
      local path = os.tmpname()
      os.remove(path)
      local ok, e = pcall(lm.onnx.export, tr, x:cpu(), path)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("Tensor.sort has no ONNX export", 1, true), tostring(e))
      assert.is_nil(io.open(path, "rb"))
   end)
end)
