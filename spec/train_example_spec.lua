-- examples/train.lua end to end on a tiny generated IDX data set: it trains, writes a checkpoint,
-- and a run stopped after one epoch then resumed computes exactly the losses of an uninterrupted
-- run (model, optimizer, schedule, epoch and random state restored). --log writes one JSON line
-- per step and per epoch, flushed as written, and a resumed run appends to it.
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

local lm = require("lumen")
local json = require("lumen.serialize").json

-- the log's records, in order; every line must be a whole JSON object
local function read_log(path)
   local f = assert(io.open(path, "r"), "no log at " .. path)
   local text = f:read("*a")
   f:close()
   assert.are.equal("\n", text:sub(-1), "the log does not end with a newline")
   local records = {}
   for line in text:gmatch("([^\n]*)\n") do
      local r, err = json.decode(line)
      assert.is_table(r, "not JSON: " .. line .. " (" .. tostring(err) .. ")")
      records[#records + 1] = r
   end
   return records
end

local function check_step(r, step, epoch)
   assert.are.equal("step", r.event)
   assert.are.equal(step, r.step)
   assert.are.equal(epoch, r.epoch)
   assert.is_number(r.loss)
   assert.is_true(r.loss > 0 and r.loss < 10, "loss " .. tostring(r.loss))
   assert.is_true(r.lr > 0 and r.lr <= 0.1, "lr " .. tostring(r.lr))
   assert.is_true(r.images_per_s > 0)
   assert.is_true(r.time >= 0)
end

local function check_epoch(r, epoch, step)
   assert.are.equal("epoch", r.event)
   assert.are.equal(epoch, r.epoch)
   assert.are.equal(step, r.step)
   assert.is_true(r.train_loss > 0 and r.train_loss < 10)
   assert.is_true(r.test_accuracy >= 0 and r.test_accuracy <= 1)
   assert.is_true(r.live_bytes > 0 and r.peak_bytes >= r.live_bytes)
   assert.is_true(r.images_per_s > 0 and r.epoch_time > 0)
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
      local log = dir .. "/run.jsonl"
      local ok1, out1, first = run(common .. "--epochs 1 --checkpoint " .. ckpt .. " --log " .. log)
      assert.is_true(ok1, out1)
      -- the checkpoint of an epoch-1 run, resumed for a second epoch (its log appended)
      local ok2, out2, resumed = run(common .. "--epochs 2 --resume --checkpoint " .. ckpt ..
                                     " --log=" .. log)
      assert.is_true(ok2, out2)
      assert.is_truthy(out2:find("resumed from", 1, true), out2)
      for step = 9, 16 do
         assert.are.equal(full[step], resumed[step], "loss at step " .. step)
      end

      -- the log: start, 8 steps, epoch 1, start (resumed at step 8), 8 steps, epoch 2
      local recs = read_log(log)
      assert.are.equal(1 + 8 + 1 + 1 + 8 + 1, #recs)
      assert.are.equal("start", recs[1].event)
      assert.are.equal(lm._VERSION, recs[1].version)
      assert.are.equal(8, recs[1].steps_per_epoch)
      assert.are.equal(32, recs[1].batch_size)
      assert.are.equal(json.null, recs[1].resumed_at_step)
      for s = 1, 8 do
         check_step(recs[1 + s], s, 1)
         -- the logged loss is the one printed (same float, 9 significant digits)
         assert.is_true(math.abs(recs[1 + s].loss - tonumber(first[s])) <= 1e-6 *
                        math.abs(recs[1 + s].loss), "loss at step " .. s)
      end
      check_epoch(recs[10], 1, 8)
      assert.are.equal("start", recs[11].event)
      assert.are.equal(8, recs[11].resumed_at_step)
      for s = 9, 16 do
         check_step(recs[3 + s], s, 2)
         assert.is_true(math.abs(recs[3 + s].loss - tonumber(resumed[s])) <= 1e-6 *
                        math.abs(recs[3 + s].loss), "loss at step " .. s)
      end
      check_epoch(recs[20], 2, 16)
      -- the epoch's mean loss is the mean of its steps
      local sum = 0
      for s = 2, 9 do sum = sum + recs[s].loss end
      assert.is_true(math.abs(recs[10].train_loss - sum / 8) < 1e-6)
   end)

   it("--log writes each line as it goes: a run killed mid-epoch leaves whole lines", function()
      local log = dir .. "/killed.jsonl"
      -- the first step record is on disk while the run is still going: kill it there
      local cmd = "bin/lumen examples/train.lua --quiet --threads 1 --data " .. dir ..
         " --batch-size 32 --width 4 --eval-batch 64 --epochs 50 --checkpoint " .. dir ..
         "/killed.ckpt --log " .. log .. " >/dev/null 2>&1 & pid=$!; " ..
         "for i in $(seq 1 600); do grep -q '\"event\":\"step\"' " .. log ..
         " 2>/dev/null && break; sleep 0.1; done; kill -9 $pid; wait $pid 2>/dev/null; true"
      os.execute(cmd)
      local recs = read_log(log)
      assert.is_true(#recs >= 2, "expected the start and at least one step record")
      assert.are.equal("start", recs[1].event)
      check_step(recs[2], 1, 1)
   end)

   it("--log into a missing directory is a usage error", function()
      local ok, out = run("--data " .. dir .. " --log " .. dir .. "/no/such/dir/run.jsonl")
      assert.is_false(ok)
      assert.is_truthy(out:find("--log: cannot open", 1, true), out)
   end)

   it("rejects bad flags", function()
      local ok, out = run("--format nhwcx")
      assert.is_false(ok)
      assert.is_truthy(out:find("nhwc or nchw", 1, true), out)
      ok, out = run("--schedule linear")
      assert.is_false(ok)
      assert.is_truthy(out:find("--schedule is one of constant, cosine, exponential", 1, true),
                       out)
      ok, out = run("--epochs x")
      assert.is_false(ok)
      assert.is_truthy(out:find("--epochs needs a number, got 'x'", 1, true), out)
      ok, out = run("--no-such-flag")
      assert.is_false(ok)
      assert.is_truthy(out:find("unknown option '--no-such-flag'", 1, true), out)
   end)

   it("-h prints every flag with its default and meaning", function()
      local ok, out = run("-h")
      assert.is_true(ok, out)
      for _, needle in ipairs({ "--epochs N", "(default: 12)", "--schedule VALUE",
                                "(default: warmup-cosine)", "--checkpoint VALUE",
                                "train.ckpt)", "--resume", "--force",
                                "CHECKPOINT.best", "--limit N" }) do
         assert.is_truthy(out:find(needle, 1, true), needle .. " in\n" .. out)
      end
      local ok2, out2 = run("--help")
      assert.is_true(ok2)
      assert.are.equal(out, out2)
   end)

   describe("never loses a run", function()
      local common = "--data " .. dir .. " --width 4 --eval-batch 64 --batch-size 32 "
      local ck = dir .. "/keep.ckpt"

      it("records the configuration, keeps the last and the best checkpoint", function()
         local ok, out = run(common .. "--epochs 2 --checkpoint " .. ck)
         assert.is_true(ok, out)
         local c = lm.load_checkpoint(ck)
         assert.are.equal(32, c.fields.config["batch-size"])
         assert.are.equal(0, c.fields.config.limit)
         assert.are.equal("nhwc", c.fields.config.format)
         assert.are.equal("warmup-cosine", c.fields.config.schedule)
         assert.are.equal(2, c.fields.config.epochs)
         assert.are.equal(lm._VERSION, c.fields.version)
         assert.are.equal(3, c.fields.epoch)
         local best = lm.load_checkpoint(ck .. ".best")
         assert.is_true(best.fields.best_acc >= 0)
         assert.are.equal(best.fields.best_acc, c.fields.best_acc)
         assert.is_table(c.fields.scheduler)
         assert.are.equal(16, c.fields.scheduler.last_epoch)
      end)

      it("a new run refuses to replace the checkpoint of another configuration", function()
         local before = lm.load_checkpoint(ck).fields.step
         local ok, out = run(common .. "--epochs 1 --limit 64 --seed 9 --checkpoint " .. ck)
         assert.is_false(ok)
         assert.is_truthy(out:find(ck .. " already holds the checkpoint of another " ..
                                   "configuration", 1, true), out)
         assert.is_truthy(out:find("--limit 64 (the checkpoint's run: 0)", 1, true), out)
         assert.is_truthy(out:find("--seed 9 (the checkpoint's run: 1)", 1, true), out)
         assert.is_truthy(out:find("--epochs 1 (the checkpoint's run: 2)", 1, true), out)
         assert.is_truthy(out:find("--checkpoint PATH", 1, true), out)
         assert.is_truthy(out:find("--force", 1, true), out)
         assert.are.equal(before, lm.load_checkpoint(ck).fields.step)   -- untouched
         -- a file that is not a checkpoint of this trainer is not replaced either
         local other = dir .. "/notes.txt"
         local f = assert(io.open(other, "w")); f:write("keep me"); f:close()
         ok, out = run(common .. "--epochs 1 --checkpoint " .. other)
         assert.is_false(ok)
         assert.is_truthy(out:find("a file this run would replace", 1, true), out)
         f = assert(io.open(other)); assert.are.equal("keep me", f:read("*a")); f:close()
      end)

      it("--resume refuses a differing configuration and names each flag", function()
         local ok, out = run(common:gsub("--batch%-size 32", "--batch-size 16") ..
                             "--epochs 3 --format nchw --resume --checkpoint " .. ck)
         assert.is_false(ok)
         assert.is_truthy(out:find("is a run of another configuration", 1, true), out)
         assert.is_truthy(out:find("--batch-size 16 (the checkpoint's run: 32)", 1, true), out)
         assert.is_truthy(out:find("--format nchw (the checkpoint's run: nhwc)", 1, true), out)
         assert.is_falsy(out:find("--epochs 3", 1, true), out)       -- --epochs may grow
         -- fewer epochs than the checkpoint's run is a change too
         ok, out = run(common .. "--epochs 1 --resume --checkpoint " .. ck)
         assert.is_false(ok)
         assert.is_truthy(out:find("--epochs 1 (the checkpoint's run: 2; --epochs may only " ..
                                   "grow)", 1, true), out)
         -- the same flags and more epochs resume
         ok, out = run(common .. "--epochs 3 --resume --checkpoint " .. ck)
         assert.is_true(ok, out)
         assert.is_truthy(out:find("resumed from", 1, true), out)
      end)

      it("--force replaces, or resumes despite differences", function()
         local ok, out = run(common .. "--epochs 1 --limit 64 --force --checkpoint " .. ck)
         assert.is_true(ok, out)
         assert.are.equal(64, lm.load_checkpoint(ck).fields.config.limit)
         ok, out = run(common .. "--epochs 2 --limit 96 --force --resume --checkpoint " .. ck)
         assert.is_true(ok, out)
         assert.is_truthy(out:find("(--force: resuming anyway)", 1, true), out)
      end)

      it("a schedule that spans the run may not change --epochs on --resume", function()
         local oc = dir .. "/onecycle.ckpt"
         local ok, out = run(common .. "--epochs 1 --schedule onecycle --checkpoint " .. oc)
         assert.is_true(ok, out)
         ok, out = run(common .. "--epochs 2 --schedule onecycle --resume --checkpoint " .. oc)
         assert.is_false(ok)
         assert.is_truthy(out:find("the onecycle schedule spans the run", 1, true), out)
      end)
   end)

   it("--schedule: the lr of every step follows lm.optim.lr_scheduler", function()
      local log = dir .. "/step.jsonl"
      local ok, out = run("--data " .. dir .. " --width 4 --eval-batch 64 --batch-size 32 " ..
                          "--epochs 3 --lr 0.05 --schedule step --log " .. log ..
                          " --checkpoint " .. dir .. "/step.ckpt")
      assert.is_true(ok, out)
      local lrs = {}
      for _, r in ipairs(read_log(log)) do
         assert.are.equal(lm._VERSION, r.version)   -- every record names lumen's version
         if r.event == "step" then lrs[r.epoch] = lrs[r.epoch] or r.lr end
      end
      -- StepLR(step_size = 1, gamma = 0.1): 0.05, 0.005, 0.0005
      assert.is_true(math.abs(lrs[1] - 0.05) < 1e-12)
      assert.is_true(math.abs(lrs[2] - 0.005) < 1e-12)
      assert.is_true(math.abs(lrs[3] - 0.0005) < 1e-12)
   end)

   -- --device cuda and --cuda-graph: on a GPU, or through the emulated CUDA library when it is
   -- built (make cuda-emu), which runs the kernels on the host and replays captured graphs
   it("--device cuda --cuda-graph replays the eager step: the same losses, schedule included",
      function()
      local emu = "build/liblumen_cuda_emu.so"
      local env = ""
      if not lm.cuda.is_available() then
         local f = io.open(emu, "rb")
         if not f then pending("no GPU and no emulated CUDA library (make cuda-emu)") return end
         f:close()
         env = "LUMEN_CUDA_LIB=$PWD/" .. emu .. " "
      end
      local common = "--data " .. dir .. " --width 4 --eval-batch 64 --batch-size 32 " ..
         "--epochs 2 --lr 0.05 --device cuda:0 --force --checkpoint " .. dir .. "/gpu.ckpt "
      local function go(args)
         local cmd = env .. "LUMEN_TRAIN_PRINT_LOSSES=1 bin/lumen examples/train.lua --quiet " ..
            "--threads 1 " .. common .. args .. " 2>&1; echo \"exit=$?\""
         local p = assert(io.popen(cmd))
         local out = p:read("*a")
         p:close()
         assert.are.equal("0", out:match("exit=(%d+)%s*$"), out)
         local losses = {}
         for step, loss in out:gmatch("step (%d+) loss (%S+)") do losses[tonumber(step)] = loss end
         return losses, out
      end
      local eager = go("")
      local graphed, out = go("--cuda-graph")
      assert.are.equal(16, #eager)
      assert.are.same(eager, graphed)
      assert.matches("final test accuracy", out)
      local _, bf = go("--cuda-graph --amp bf16 --schedule onecycle")
      assert.matches("final test accuracy", bf)
   end)

   it("--device and --cuda-graph reject what cannot work", function()
      for _, c in ipairs({
         {"--device gpu", "--device is cpu, cuda or cuda:N"},
         {"--cuda-graph", "--cuda-graph needs --device cuda"},
      }) do
         local ok, out = run("--data " .. dir .. " " .. c[1])
         assert.is_false(ok)
         assert.matches(c[2], out, 1, true)
      end
   end)
end)
