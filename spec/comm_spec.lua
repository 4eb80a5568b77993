-- spec/comm_spec.lua -- lm.comm (torch.cuda.comm in one process): scatter / gather / broadcast /
-- reduce_add over cpu and the sim test devices. Channels-last inputs give channels-last results
-- (PyTorch issue #28077: its scatter gave contiguous chunks); scatter and gather are
-- differentiable (torch.nn.parallel's Scatter / Gather).
local H = require("spec.helpers")
local lm = H.lm
local comm = lm.comm

local function cl_batch(n)
   return lm.rand({ n, 3, 4, 5 }, { device = "cpu" }):to(lm.channels_last)
end

describe("lm.comm.scatter", function()
   it("chunks a channels-last batch along dim 1 into channels-last chunks", function()
      local x = cl_batch(5)
      local parts = comm.scatter(x, { "cpu", "sim:1", "sim:0" })
      assert.are.equal(3, #parts)
      local devs, ns = {}, {}
      for i, p in ipairs(parts) do
         devs[i], ns[i] = p:device(), p:size(1)
         assert.is_true(p:is_contiguous(lm.channels_last), H.describe(p))
      end
      assert.are.same({ "cpu", "sim:1", "sim:0" }, devs)
      assert.are.same({ 2, 2, 1 }, ns)                  -- torch.chunk's sizes
      assert.is_true(parts[2]:cpu():equal(x:narrow(1, 3, 2)))
      assert.is_true(parts[3]:cpu():equal(x:narrow(1, 5, 1)))
   end)

   it("takes chunk sizes, another dim, and a device named several times", function()
      local x = cl_batch(4)
      local parts = comm.scatter(x, { "sim:0", "sim:0", "cpu" }, { chunk_sizes = { 1, 0, 3 } })
      assert.are.same({ 1, 0, 3 }, { parts[1]:size(1), parts[2]:size(1), parts[3]:size(1) })
      assert.is_true(parts[3]:equal(x:narrow(1, 2, 3)))
      local c = comm.scatter(x, { "cpu", "sim:1" }, { dim = 2, chunk_sizes = { 2, 1 } })
      assert.are.same({ 4, 2, 4, 5 }, c[1]:size())
      assert.are.same({ 4, 1, 4, 5 }, c[2]:size())
      assert.is_true(c[2]:is_contiguous(lm.channels_last))
      assert.is_true(c[2]:cpu():equal(x:narrow(2, 3, 1)))
      local w = comm.scatter(x, { "sim:0", "sim:1" }, { dim = -1 })
      assert.are.same({ 3, 2 }, { w[1]:size(4), w[2]:size(4) })
      -- fewer rows than devices: fewer chunks (torch.chunk)
      assert.are.equal(2, #comm.scatter(cl_batch(2), { "cpu", "cpu", "cpu" }))
   end)

   it("is differentiable: chunk gradients reach the batch on its device", function()
      local x = cl_batch(4):requires_grad_()
      local parts = comm.scatter(x, { "sim:0", "sim:1" })
      local loss = parts[1]:cpu():sum() + (parts[2]:cpu() * 2):sum()
      loss:backward()
      assert.are.equal("cpu", x.grad:device())
      assert.is_true(x.grad:narrow(1, 1, 2):eq(1):all():item())
      assert.is_true(x.grad:narrow(1, 3, 2):eq(2):all():item())
   end)

   it("names the problem with bad input", function()
      local x = cl_batch(4)
      H.assert_error_like("comm.scatter", "unknown device 'gpu'", comm.scatter, x, { "cpu", "gpu" })
      H.assert_error_like("comm.scatter", "must not be empty", comm.scatter, x, {})
      H.assert_error_like("comm.scatter", "array of device strings", comm.scatter, x, "cpu")
      H.assert_error_like("comm.scatter", "sum to 3", comm.scatter, x, { "cpu", "cpu" },
                          { chunk_sizes = { 1, 2 } })
      H.assert_error_like("comm.scatter", "2 devices, 3 chunk sizes", comm.scatter, x,
                          { "cpu", "cpu" }, { chunk_sizes = { 1, 2, 1 } })
      H.assert_error_like("comm.scatter", "chunk_sizes[1]", comm.scatter, x, { "cpu", "cpu" },
                          { chunk_sizes = { -1, 5 } })
      H.assert_error_like("comm.scatter", "out of range", comm.scatter, x, { "cpu" }, { dim = 5 })
      H.assert_error_like("comm.scatter", "tensor expected", comm.scatter, 3, { "cpu" })
      H.assert_error_like("comm.scatter", "unknown option", comm.scatter, x, { "cpu" },
                          { dims = 1 })
   end)
end)

describe("lm.comm.gather", function()
   it("concatenates channels-last chunks into a channels-last batch on the destination", function()
      local x = cl_batch(5)
      local parts = comm.scatter(x, { "sim:0", "cpu", "sim:1" })
      local g = comm.gather(parts, { destination = "sim:1" })
      assert.are.equal("sim:1", g:device())
      assert.is_true(g:is_contiguous(lm.channels_last))
      assert.is_true(g:cpu():equal(x))
      local gc = comm.gather(parts, { destination = "cpu" })
      assert.are.equal("cpu", gc:device())
      assert.is_true(gc:is_contiguous(lm.channels_last))
      assert.is_true(gc:equal(x))
      -- the default destination is the default device
      assert.are.equal(lm.get_default_device(), comm.gather(parts):device())
      -- along another dim
      local c = comm.scatter(x, { "sim:0", "sim:1" }, { dim = 2 })
      assert.is_true(comm.gather(c, { dim = 2, destination = "cpu" }):equal(x))
   end)

   it("is differentiable: gradients go back to each chunk's device", function()
      local a = lm.rand({ 2, 3 }, { device = "sim:0", requires_grad = true })
      local b = lm.rand({ 1, 3 }, { device = "sim:1", requires_grad = true })
      local g = comm.gather({ a, b }, { destination = "cpu" })
      g:backward(lm.arange(9, { device = "cpu", dtype = lm.float32 }):view(3, 3))
      assert.are.equal("sim:0", a.grad:device())
      assert.are.same({ { 0, 1, 2 }, { 3, 4, 5 } }, a.grad:totable())
      assert.are.same({ { 6, 7, 8 } }, b.grad:totable())
   end)

   it("names the problem with bad input", function()
      local a, b = lm.rand({ 2, 3 }, { device = "cpu" }), lm.rand({ 2, 4 }, { device = "cpu" })
      H.assert_error_like("comm.gather", "size 4 in dim 2", comm.gather, { a, b })
      H.assert_error_like("comm.gather", "non-empty", comm.gather, {})
      H.assert_error_like("comm.gather", "unknown device 'x'", comm.gather, { a },
                          { destination = "x" })
      H.assert_error_like("comm.gather", "dims", comm.gather, { a, lm.rand({ 2 }) })
      H.assert_error_like("comm.gather", "tensors[2]", comm.gather, { a, 1 })
   end)
end)

describe("lm.comm.broadcast and reduce_add", function()
   it("broadcast copies to every device, keeping the format", function()
      local x = cl_batch(2)
      local r = comm.broadcast(x, { "sim:0", "cpu", "sim:1", "sim:1" })
      assert.are.equal(4, #r)
      assert.are.equal(x, r[2])                         -- already there: itself (as torch)
      for i, d in ipairs({ "sim:0", "cpu", "sim:1", "sim:1" }) do
         assert.are.equal(d, r[i]:device())
         assert.is_true(r[i]:is_contiguous(lm.channels_last))
         assert.is_true(r[i]:cpu():equal(x))
      end
      assert.are_not.equal(r[3], r[4])
      H.assert_error_like("comm.broadcast", "unknown device", comm.broadcast, x, { "cpu", "tpu" })
      H.assert_error_like("comm.broadcast", "must not be empty", comm.broadcast, x, {})
   end)

   it("reduce_add sums copies on the destination, in the first one's format", function()
      local x = cl_batch(2)
      local list = comm.broadcast(x, { "sim:0", "sim:1", "cpu" })
      local s = comm.reduce_add(list, "sim:1")
      assert.are.equal("sim:1", s:device())
      assert.is_true(s:is_contiguous(lm.channels_last))
      assert.is_true(s:cpu():allclose(x * 3))
      local one = comm.reduce_add({ x }, "cpu")
      assert.are_not.equal(x, one)
      assert.is_true(one:equal(x))
      H.assert_error_like("comm.reduce_add", "all must match", comm.reduce_add,
                          { x, lm.rand({ 2, 3 }) }, "cpu")
      H.assert_error_like("comm.reduce_add", "non-empty", comm.reduce_add, {}, "cpu")
      H.assert_error_like("comm.reduce_add", "unknown device", comm.reduce_add, { x }, "sim:9")
   end)
end)
