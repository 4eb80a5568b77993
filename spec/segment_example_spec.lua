-- examples/segment.lua end to end at a tiny size (a few seconds): it trains a UNet for an epoch
-- on its generated images, prints the layout check (clean: channels-last throughout), the mean
-- IoU per epoch and at the end (finite, in 0..1), is reproducible for a seed, runs odd sizes
-- (ConvTranspose2d's output_size picks the output_padding) and the Upsample decoder, writes
-- --save, and rejects bad flags with a usage error. Host-only (tools/run_tests.sh device_skip):
-- the example is a command line making its own CPU tensors.
local S = require("spec.shell")

local TINY = "--quiet --threads 1 --epochs 1 --size 16 --train 32 --test 16 --batch-size 8 " ..
   "--width 4 --groups 2"

local function run(args)
   return S.sh("bin/lumen examples/segment.lua " .. args)
end

-- the numbers of the epoch lines and the final line; checks they are finite and in range
local function results(out)
   local epochs = {}
   for e, loss, tloss, iou in out:gmatch("epoch (%d+)/%d+: train loss (%S+), [^|]*| test loss " ..
                                         "(%S+), mean IoU (%S+) %(") do
      epochs[#epochs + 1] = { tonumber(e), tonumber(loss), tonumber(tloss), tonumber(iou) }
   end
   local final = tonumber(out:match("final mean IoU (%S+) on"))
   for _, r in ipairs(epochs) do
      for i = 2, 4 do
         assert.is_number(r[i], out)
         assert.is_true(r[i] == r[i] and r[i] > -math.huge and r[i] < math.huge, out)
      end
      assert.is_true(r[2] >= 0 and r[3] >= 0, out)
      assert.is_true(r[4] >= 0 and r[4] <= 1, out)
   end
   assert.is_number(final, out)
   assert.is_true(final >= 0 and final <= 1, out)
   return epochs, final
end

describe("examples/segment.lua", function()
   it("trains an epoch: layout check clean, IoU per epoch and at the end", function()
      local out, rc = run(TINY)
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("layout check: ok (channels-last throughout)", 1, true), out)
      assert.truthy(out:find("ok: true", 1, true), out)
      -- the report's rows: the up path's transposed convolutions and the decoder's GroupNorm
      assert.truthy(out:find("up1%.up%s+ConvTranspose2d%s+channels_last%s+channels_last"), out)
      assert.truthy(out:find("dec1%.1%s+GroupNorm%s+channels_last%s+channels_last"), out)
      local epochs, final = results(out)
      assert.are.equal(1, #epochs, out)
      assert.are.equal(epochs[1][4], final)
      -- per class IoU named
      assert.truthy(out:find("background %d%.%d+, circle [%d%.%-]+, bar [%d%.%-]+"), out)
   end)

   it("is reproducible for a seed; another seed differs", function()
      local function strip(out)   -- without the timings
         return (out:gsub("[%d%.]+ img/s", ""):gsub("[%d%.]+ s elapsed", ""):gsub(
            "[%d%.]+ s in all", ""))
      end
      local a = run(TINY .. " --seed 7")
      local b = run(TINY .. " --seed 7")
      local c = run(TINY .. " --seed 8")
      assert.are.equal(strip(a), strip(b))
      assert.are_not.equal(strip(a), strip(c))
   end)

   it("odd sizes (output_size picks the output_padding), Upsample, SiLU, --save", function()
      local path = os.tmpname()
      local out, rc = run(TINY .. " --size 13 --act silu --save " .. S.q(path))
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("layout check: ok", 1, true), out)
      results(out)
      local lm = require("lumen")
      local sd = lm.load(path)
      os.remove(path)
      assert.are.same({ 3, 4, 1, 1 }, sd["head.weight"]:size())
      assert.are.same({ 8, 4, 2, 2 }, sd["up1.up.weight"]:size())
      out, rc = run(TINY .. " --size 11 --up upsample --depth 1")
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("Upsample", 1, true), out)
      assert.truthy(out:find("layout check: ok", 1, true), out)
      results(out)
   end)

   it("rejects bad flags", function()
      local cases = {
         { "--act tanh", "--act is relu or silu" },
         { "--up nearest", "--up is convt or upsample" },
         { "--groups 3", "--groups 3 does not divide --width 16" },
         { "--size 3", "--size 3 is too small for --depth 2 (at least 4)" },
         { "--epochs 0", "--epochs needs a positive integer" },
         { "--width 2.5", "--width needs a positive integer" },
         { "--train 4 --batch-size 8", "--batch-size 8 is larger than --train 4" },
         { "--lr 0", "--lr must be positive" },
         { "--noise=-1", "--noise must not be negative" },
         { "--epochs many", "--epochs needs a number, got 'many'" },
         { "--bogus 1", "unknown option '--bogus'" },
      }
      for _, c in ipairs(cases) do
         local out, rc = run(c[1])
         assert.are.equal(2, rc, c[1] .. ": " .. out)
         assert.truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
         assert.truthy(out:find("Usage:", 1, true), c[1] .. ": " .. out)
      end
   end)

   it("-h prints every flag with its default", function()
      local out, rc = run("-h")
      assert.are.equal(0, rc, out)
      for _, f in ipairs({ "--epochs", "--batch-size", "--lr", "--seed", "--threads", "--size",
                           "--save", "--up", "--groups" }) do
         assert.truthy(out:find(f, 1, true), f .. ": " .. out)
      end
      assert.truthy(out:find("(default: 10)", 1, true), out)
   end)
end)
