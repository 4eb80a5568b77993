-- examples/train.lua end to end on a tiny generated IDX data set: it trains, writes a checkpoint,
-- and a run stopped after one epoch then resumed computes exactly the losses of an uninterrupted
-- run (model, optimizer, schedule, epoch and random state restored).
local function write_idx(path, kind, dims, fill)
   local f = assert(io.open(path, "wb"))
   f:write(string.char(0, 0, kind, #dims))
   local n = 1
   for _, d in ipairs(dims) do
      f:write(string.char(math.floor(d / 16777216) % 256, math.floor(d / 65536) % 256,
                          math.floor(d / 256) % 256, d % 256))
      n = n * d
   end
   local bytes = {}
   for i = 1, n do bytes[i] = string.char(fill(i)) end
   f:write(table.concat(bytes))
   f:close()
end

local function make_dataset(dir, ntrain, ntest)
   os.execute("mkdir -p " .. dir)
   local seed = 12345
   local function rnd()
      seed = (seed * 1103515245 + 12345) % 2147483648
      return seed
   end
   for _, split in ipairs({ { "train", ntrain }, { "t10k", ntest } }) do
      local n = split[2]
      local labels = {}
      for i = 1, n do labels[i] = rnd() % 10 end
      -- images whose brightness depends on the label, plus noise: learnable
      write_idx(dir .. "/" .. split[1] .. "-images-idx3-ubyte", 8, { n, 28, 28 }, function(i)
         local img = math.floor((i - 1) / 784) + 1
         return (labels[img] * 20 + rnd() % 40) % 256
      end)
      write_idx(dir .. "/" .. split[1] .. "-labels-idx1-ubyte", 8, { n }, function(i)
         return labels[i]
      end)
   end
end

local function run(args)
   local cmd = "LUMEN_TRAIN_PRINT_LOSSES=1 bin/lumen examples/train.lua --quiet --threads 1 " ..
      args .. " 2>&1; echo \"exit=$?\""
   local p = assert(io.popen(cmd))
   local out = p:read("*a")
   p:close()
   local ok = out:match("exit=(%d+)%s*$") == "0"
   local losses = {}
   for step, loss in out:gmatch("step (%d+) loss (%S+)") do losses[tonumber(step)] = loss end
   return ok, out, losses
end

describe("examples/train.lua", function()
   local dir = os.tmpname() .. "-fmnist"
   local ckpt = dir .. "/run.ckpt"
   setup(function() make_dataset(dir, 256, 64) end)
   teardown(function() os.execute("rm -rf " .. dir) end)

   it("trains, reports accuracy, and resumes exactly", function()
      local common = "--data " .. dir .. " --batch-size 32 --width 4 --eval-batch 64 --seed 3 "
      local ok, out, full = run(common .. "--epochs 2 --checkpoint " .. ckpt .. ".full")
      assert.is_true(ok, out)
      assert.is_truthy(out:find("final test accuracy", 1, true), out)
      assert.are.equal(16, #full) -- 2 epochs of 8 batches
      local ok1, out1 = run(common .. "--epochs 1 --checkpoint " .. ckpt)
      assert.is_true(ok1, out1)
      -- the checkpoint of an epoch-1 run, resumed for a second epoch
      local ok2, out2, resumed = run(common .. "--epochs 2 --resume --checkpoint " .. ckpt)
      assert.is_true(ok2, out2)
      assert.is_truthy(out2:find("resumed from", 1, true), out2)
      for step = 9, 16 do
         assert.are.equal(full[step], resumed[step], "loss at step " .. step)
      end
   end)

   it("rejects bad flags", function()
      local ok, out = run("--format nhwcx")
      assert.is_false(ok)
      assert.is_truthy(out:find("nhwc or nchw", 1, true), out)
   end)
end)
