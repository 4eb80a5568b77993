-- spec/plot_spec.lua -- tools/plot.lua draws a training log (examples/train.lua --log) with
-- gnuplot: PNG and SVG by the output's extension, the curves in their colours, and clear errors
-- (no gnuplot, a bad extension, a log with no records).

local lm = require("lumen")
local shell = require("spec.shell")
local q, sh, read_file = shell.q, shell.sh, shell.read_file

-- the launcher of this run: the install tree's in an installed run, else the source tree's
local TREE = os.getenv("LUMEN_INSTALL_TREE")
local LUMEN = (TREE and TREE ~= "") and (TREE .. "/bin/lumen") or "bin/lumen"

local function plot(args, env)
   return sh((env or "") .. " " .. LUMEN .. " tools/plot.lua " .. args)
end

-- pixels of img (uint8 H x W x 3) within tol of the colour {r, g, b}
local function count_colour(img, rgb, tol)
   local mask
   for c = 1, 3 do
      local ch = img:select(3, c):float()
      local near = ch:sub(rgb[c]):abs():le(tol)
      mask = mask and mask:logical_and(near) or near
   end
   return mask:sum():item()
end

-- a small log as examples/train.lua writes it: 3 epochs of 20 steps, resumed after epoch 1 (a
-- second start record and steps 19..20 written twice: the later values win), one diverged step
-- (null) and one line cut short
local function write_log(path)
   local f = assert(io.open(path, "w"))
   f:write('{"event":"start","version":"0.1.0","model":"small_resnet","format":"nhwc",' ..
           '"batch_size":32,"epochs":3,"lr":0.1,"steps_per_epoch":20}\n')
   local function step(s, e, loss)
      f:write(('{"event":"step","step":%d,"epoch":%d,"batch":%d,"loss":%s,"lr":0.1,' ..
               '"images_per_s":900,"time":%d}\n'):format(s, e, (s - 1) % 20 + 1, loss, s))
   end
   local function epoch(e, s, tl, acc)
      f:write(('{"event":"epoch","epoch":%d,"step":%d,"train_loss":%.6f,"test_accuracy":%.4f,' ..
               '"live_bytes":1000,"peak_bytes":2000,"time":%d}\n'):format(e, s, tl, acc, s))
   end
   for s = 1, 20 do step(s, 1, ("%.6f"):format(2.3 * math.exp(-s / 25))) end
   epoch(1, 20, 1.6, 0.61)
   f:write('{"event":"start","version":"0.1.0","model":"small_resnet","resumed_at_step":18}\n')
   for s = 19, 40 do
      step(s, s <= 20 and 1 or 2, s == 30 and "null" or ("%.6f"):format(2.3 * math.exp(-s / 25)))
   end
   epoch(2, 40, 0.7, 0.72)
   f:write('{"event":"step","step":41,"ep\n') -- a line cut short
   for s = 41, 60 do step(s, 3, ("%.6f"):format(2.3 * math.exp(-s / 25))) end
   epoch(3, 60, 0.3, 0.8)
   f:close()
end

describe("tools/plot.lua", function()
   local dir
   setup(function()
      dir = os.tmpname() .. "-plot"
      os.execute("mkdir -p " .. q(dir))
      write_log(dir .. "/run.jsonl")
   end)
   teardown(function() os.execute("rm -rf " .. q(dir)) end)

   local have_gnuplot = select(2, sh("command -v gnuplot")) == 0;

   (have_gnuplot and it or pending)("draws a PNG with the loss and accuracy curves", function()
      local out, rc = plot(q(dir .. "/run.jsonl")) -- default output: run.png beside the log
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("60 steps, 3 epochs", 1, true), out)
      -- the cut line is reported, not fatal
      assert.is_truthy(out:find("run.jsonl:47: not a JSON record, skipped", 1, true), out)
      local png = read_file(dir .. "/run.png")
      assert.is_not_nil(png, out)
      assert.are.equal("\137PNG\r\n\26\n", png:sub(1, 8))
      assert.is_true(#png > 10000, "PNG of " .. #png .. " bytes")
      local img = lm.data.read_image(dir .. "/run.png")
      assert.are.same({ 800, 1000, 3 }, img:size())
      -- each curve is drawn in its colour (per-step loss, epoch loss, accuracy)
      assert.is_true(count_colour(img, { 0x44, 0x77, 0xaa }, 40) > 100, "per-step loss curve")
      assert.is_true(count_colour(img, { 0xcc, 0x33, 0x11 }, 40) > 100, "epoch loss curve")
      assert.is_true(count_colour(img, { 0x22, 0x88, 0x33 }, 40) > 100, "accuracy curve")
   end);

   (have_gnuplot and it or pending)("draws an SVG when the output ends in .svg", function()
      local svg_path = dir .. "/curves.svg"
      local out, rc = plot(q(dir .. "/run.jsonl") .. " -o " .. q(svg_path))
      assert.are.equal(0, rc, out)
      local svg = read_file(svg_path)
      assert.is_not_nil(svg, out)
      assert.is_truthy(svg:match("^%s*<%?xml"), svg:sub(1, 100))
      assert.is_truthy(svg:find("<svg", 1, true))
      assert.is_truthy(svg:find("</svg>%s*$"))
      for _, title in ipairs({ "training loss (per step)", "train loss (epoch mean)",
                               "test accuracy", "small_resnet" }) do
         assert.is_truthy(svg:find(title, 1, true), title)
      end
      -- XML-ish: every element opened is closed (no stray '<' in text)
      local opened, closed = 0, 0
      for tag in svg:gmatch("<(/?)[%a]") do
         if tag == "/" then closed = closed + 1 else opened = opened + 1 end
      end
      local selfclosed = select(2, svg:gsub("/>", ""))
      assert.are.equal(opened, closed + selfclosed)
   end)

   it("says clearly when gnuplot is missing", function()
      local out, rc = plot(q(dir .. "/run.jsonl") .. " -o " .. q(dir .. "/x.png"),
                           "GNUPLOT=/nonexistent/gnuplot")
      assert.are_not.equal(0, rc)
      assert.is_truthy(out:find("gnuplot not found", 1, true), out)
      assert.is_truthy(out:find("apt-get install gnuplot-nox", 1, true), out)
      assert.is_nil(read_file(dir .. "/x.png"))
   end)

   it("rejects an output that is neither .png nor .svg, and a log with no records", function()
      local out, rc = plot(q(dir .. "/run.jsonl") .. " -o " .. q(dir .. "/x.pdf"))
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("must end in .png or .svg", 1, true), out)
      local empty = dir .. "/empty.jsonl"
      local f = assert(io.open(empty, "w"))
      f:write("not json\n")
      f:close()
      out, rc = plot(q(empty))
      assert.are.equal(1, rc, out)
      assert.is_truthy(out:find("no step or epoch records", 1, true), out)
      out, rc = plot(q(dir .. "/missing.jsonl"))
      assert.are.equal(1, rc, out)
      assert.is_truthy(out:find("cannot read the log", 1, true), out)
      out, rc = plot("")
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("usage:", 1, true), out)
   end)
end)
