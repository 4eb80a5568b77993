-- bench/method_lookup.lua -- the cost of Tensor method lookup and of new fields on tensors (the
-- metatable's __index / __newindex, which also carry Torch7 indexing t[i]): run it under two
-- trees alternately (LUA_PATH="<tree>/lua/?.lua;<tree>/lua/?/init.lua" luajit
-- bench/method_lookup.lua NAME)
-- and compare the medians. Before/after the indexing change (2 cores, shared): method loop
-- 0.099-0.183 s old vs 0.100-0.161 s new, autograd loop 0.145-0.257 s vs 0.140-0.257 s over
-- seven alternations: no difference beyond the noise.
local lm = require("lumen")
local a, b = lm.ones({4}), lm.ones({4})
local function run()
   local t0 = os.clock()
   for _ = 1, 300000 do local c = a:add(b); c:dim(); c:numel() end
   return os.clock() - t0
end
local function run2()
   local t0 = os.clock()
   local x = lm.ones({4}):requires_grad_(true)
   for _ = 1, 100000 do local _ = x * 2 end
   return os.clock() - t0
end
run(); run2()
local r, r2 = {}, {}
for i = 1, 5 do r[i] = run(); r2[i] = run2() end
table.sort(r); table.sort(r2)
print(("%s method loop median %.3f s  autograd op loop median %.3f s")
   :format(arg and arg[1] or "this tree", r[3], r2[3]))
