-- The indexing kernels of the CUDA backend (kernels/cuda/indexing.cu) against the CPU's
-- (kernels/cpu/indexing.c): sort (both orders, ties, NaN, long rows), gather, scatter_add,
-- cumsum (both directions through the gradient), random shapes and dims, contiguous,
-- channels-last and strided inputs, every dtype, bad index values. Both devices run the same
-- per-row bodies (src/ops/indexing.h), so the results are compared bit for bit. Runs on cuda:0
-- (a GPU, or the emulated build: LUMEN_CUDA_LIB=build/liblumen_cuda_emu.so); skips without one.

local H = require("spec.helpers")
local lm = H.lm

local DTYPES = { lm.float32, lm.float64, lm.float16, lm.bfloat16, lm.int64, lm.int32, lm.uint8 }

-- every "CPU" tensor is made on the CPU explicitly: under make test-cuda-emu the factories'
-- default device is cuda:0
-- an LCG, so the shapes are the same on every run
local state = 12345
local function rnd(n)
   state = (state * 1103515245 + 12345) % 2147483648
   return state % n
end

local function values(t)
   t = t:cpu():contiguous()
   if t:dtype() == lm.float16 or t:dtype() == lm.bfloat16 then t = t:float() end
   return t:view(-1):totable()
end

local function same(a, b, what)
   local x, y = values(a), values(b)
   assert.are.equal(#x, #y, what .. ": element count")
   for i = 1, #x do
      assert(x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i]),
             ("%s [%d]: cpu %s, cuda %s"):format(what, i, tostring(x[i]), tostring(y[i])))
   end
   assert.are.same(a:stride(), b:stride(), what .. ": strides")
end

-- a random CPU input: small integers (ties), NaN in the floating dtypes, in a random layout
local function input(sizes, dt, layout)
   local x = lm.randint(-4, 5, sizes):cpu():double()
   if dt == lm.uint8 then x = x:abs() end
   if dt.is_floating_point then x = lm.where(lm.rand(sizes):cpu():lt(0.1), 0 / 0, x) end
   x = x:to(dt)
   if layout == 1 and #sizes == 4 then return x:contiguous(lm.channels_last) end
   if layout == 2 then
      local nd = #sizes
      return lm.stack({ x, x }, nd + 1):select(nd + 1, 2)
   end
   return x
end

describe("CUDA indexing (kernels/cuda/indexing.cu) against the CPU", function()
   if not lm.cuda.is_available() then
      pending("no CUDA device")
      return
   end
   local DEV = "cuda:0"

   it("sort, argsort, gather, scatter_add and cumsum on random shapes", function()
      for i = 1, 60 do
         local nd = 1 + rnd(4)
         local sizes = {}
         for d = 1, nd do sizes[d] = 1 + rnd(6) end
         if i % 10 == 0 then sizes[nd] = 300 + rnd(200) end -- a long row: many merge passes
         local dt = DTYPES[(i - 1) % #DTYPES + 1]
         local dim = 1 + rnd(nd)
         local desc = rnd(2) == 0
         local what = ("%s %s dim %d %s"):format(tostring(dt), table.concat(sizes, "x"), dim,
            desc and "descending" or "ascending")
         local x = input(sizes, dt, rnd(3))
         local xd = x:to(DEV)
         local v, ix = x:sort(dim, desc)
         local vd, ixd = xd:sort(dim, desc)
         same(v, vd, what .. " sort values")
         same(ix, ixd, what .. " sort indices")
         -- gather and scatter_add with the sort's indices (a permutation) and a random index
         local isz = {}
         for d = 1, nd do isz[d] = d == dim and 1 + rnd(8) or math.max(1, sizes[d] - rnd(2)) end
         local idx = lm.randint(1, sizes[dim] + 1, isz):cpu()
         same(x:gather(dim, idx), xd:gather(dim, idx:to(DEV)), what .. " gather")
         same(x:gather(dim, ix), xd:gather(dim, ixd), what .. " gather (sort's indices)")
         if dt ~= lm.uint8 then
            local src = input(isz, dt, 0)
            same(x:scatter_add(dim, idx, src), xd:scatter_add(dim, idx:to(DEV), src:to(DEV)),
                 what .. " scatter_add")
         end
         same(x:cumsum(dim), xd:cumsum(dim), what .. " cumsum")
      end
   end)

   it("gradients: sort and gather scatter back, cumsum reverses", function()
      for _, fmt in ipairs({ lm.contiguous_format, lm.channels_last }) do
         local x = lm.randn({ 2, 3, 4, 5 }):cpu():contiguous(fmt):requires_grad_(true)
         local xd = x:detach():to(DEV):requires_grad_(true)
         local g = lm.randn({ 2, 3, 4, 5 }):cpu()
         for d = 1, 4 do
            x.grad, xd.grad = nil, nil
            local y = (x:sort(d, true)) + x:cumsum(d) + x:flip(d)
            local yd = (xd:sort(d, true)) + xd:cumsum(d) + xd:flip(d)
            y:backward(g)
            yd:backward(g:to(DEV))
            assert.is_true(H.rel_diff(x.grad, xd.grad:cpu()) < 1e-6, "grad dim " .. d)
            assert.are.equal("cpu", tostring(x.grad:device()))
         end
      end
   end)

   it("bad index values: the CPU's error, nothing written", function()
      local x = lm.randn({ 3, 4 }):to(DEV)
      local bad = lm.tensor({ { 1, 2 }, { 4, 5 } }, { dtype = lm.int64 }):to(DEV)
      H.assert_error_like("gather", "index 5 is out of bounds for dimension 2 with size 4",
         function() return x:gather(2, bad) end)
      local t = x:clone()
      H.assert_error_like("scatter_add_", "index 5 is out of bounds", function()
         return t:scatter_add_(2, bad, x)
      end)
      assert.is_true(t:equal(x))
   end)
end)
