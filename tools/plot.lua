-- tools/plot.lua -- draw the curves of a training log written by `examples/train.lua --log`.
--
--    bin/lumen tools/plot.lua run.jsonl                 writes run.png
--    bin/lumen tools/plot.lua run.jsonl -o curves.svg   the output type comes from the extension
--                                                       (.png or .svg)
--
-- Two panels: the loss of every step with the mean train loss of each epoch, and the test
-- accuracy per epoch. The drawing is done by gnuplot (apt-get install gnuplot-nox); GNUPLOT names
-- another program. A log that was resumed (a second "start" record) is drawn as one run: when a
-- step or an epoch appears twice, the later record wins. A line that is not a JSON object (a log
-- cut short by a full disk) is reported and skipped.

local json = require("lumen.serialize").json

local PROG = "tools/plot.lua"
local USAGE = "usage: bin/lumen " .. PROG .. " LOG.jsonl [-o OUT.png|OUT.svg]"

local function die(msg, code)
   io.stderr:write(PROG .. ": " .. msg .. "\n")
   os.exit(code or 1)
end

local function q(s)
   return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- gnuplot's single-quoted strings double an embedded quote
local function gq(s)
   return "'" .. tostring(s):gsub("'", "''") .. "'"
end

---------------------------------------------------------------------------------------------
-- arguments
---------------------------------------------------------------------------------------------
local args = arg or {}
local input, output
local i = 1
while i <= #args do
   local a = args[i]
   if a == "-o" or a == "--output" then
      output = args[i + 1]
      if not output then die("-o needs a file name\n" .. USAGE, 2) end
      i = i + 1
   elseif a:match("^%-%-output=") then
      output = a:sub(10)
   elseif a == "-h" or a == "--help" then
      print(USAGE)
      os.exit(0)
   elseif a:sub(1, 1) == "-" and a ~= "-" then
      die("unknown option '" .. a .. "'\n" .. USAGE, 2)
   elseif input then
      die("more than one log given ('" .. input .. "', '" .. a .. "')\n" .. USAGE, 2)
   else
      input = a
   end
   i = i + 1
end
if not input then die("no log given\n" .. USAGE, 2) end
output = output or (input:gsub("%.jsonl$", ""):gsub("%.json$", "") .. ".png")
local kind = output:lower():match("%.(%a+)$")
if kind ~= "png" and kind ~= "svg" then
   die("the output must end in .png or .svg, got '" .. output .. "'", 2)
end

---------------------------------------------------------------------------------------------
-- the log
---------------------------------------------------------------------------------------------
local f, err = io.open(input, "r")
if not f then die("cannot read the log: " .. tostring(err)) end
local steps, epochs, start = {}, {}, nil
local n_lines, skipped = 0, 0
for line in f:lines() do
   n_lines = n_lines + 1
   if line:match("%S") then
      local r = json.decode(line)
      if type(r) ~= "table" then
         skipped = skipped + 1
         io.stderr:write(("%s: %s:%d: not a JSON record, skipped\n"):format(PROG, input, n_lines))
      elseif r.event == "step" and type(r.step) == "number" then
         steps[r.step] = r
      elseif r.event == "epoch" and type(r.epoch) == "number" then
         epochs[r.epoch] = r
      elseif r.event == "start" then
         start = start or r
      end
   end
end
f:close()

local function sorted_keys(t)
   local keys = {}
   for k in pairs(t) do keys[#keys + 1] = k end
   table.sort(keys)
   return keys
end
local step_keys, epoch_keys = sorted_keys(steps), sorted_keys(epochs)
if #step_keys == 0 and #epoch_keys == 0 then
   die(("no step or epoch records in %s (%d lines%s); was it written by " ..
        "examples/train.lua --log?"):format(input, n_lines,
        skipped > 0 and (", " .. skipped .. " not JSON") or ""))
end

-- a number for gnuplot; null (a diverged loss) and missing values become NaN (a gap)
local function num(v)
   if type(v) ~= "number" or v ~= v then return "NaN" end
   return string.format("%.9g", v)
end

---------------------------------------------------------------------------------------------
-- the gnuplot script
---------------------------------------------------------------------------------------------
local s = {}
local function add(line) s[#s + 1] = line end

if kind == "png" then
   add("set terminal pngcairo size 1000,800 noenhanced font 'sans,10'")
else
   add("set terminal svg size 1000,800 dynamic noenhanced font 'sans,10'")
end
add("set output " .. gq(output))

add("$steps << EOD")
for _, k in ipairs(step_keys) do add(num(k) .. " " .. num(steps[k].loss)) end
add("EOD")
add("$epochs << EOD")
for _, k in ipairs(epoch_keys) do
   local r = epochs[k]
   local acc = type(r.test_accuracy) == "number" and 100 * r.test_accuracy or nil
   add(num(k) .. " " .. num(r.step) .. " " .. num(r.train_loss) .. " " .. num(acc))
end
add("EOD")

local title = "training log " .. input
if start then
   title = ("%s: %s, %s, batch %s, lr %s (lumen %s)"):format(input, tostring(start.model),
      tostring(start.format), tostring(start.batch_size), tostring(start.lr),
      tostring(start.version))
end
local panels = (#step_keys > 0 and 1 or 0) + (#epoch_keys > 0 and 1 or 0)
add(("set multiplot layout %d,1 title %s"):format(panels, gq(title)))
add("set grid")
add("set key top right")
if #step_keys > 0 then
   add("set title 'loss'")
   add("set xlabel 'step'")
   add("set ylabel 'cross-entropy loss'")
   local plot = "plot $steps using 1:2 with lines lw 1 lc rgb '#4477aa' " ..
      "title 'training loss (per step)'"
   if #epoch_keys > 0 then
      plot = plot .. ", $epochs using 2:3 with linespoints lw 2 pt 7 lc rgb '#cc3311' " ..
         "title 'train loss (epoch mean)'"
   end
   add(plot)
end
if #epoch_keys > 0 then
   add("set title 'test accuracy'")
   add("set xlabel 'epoch'")
   add("set ylabel 'accuracy (%)'")
   add("set xtics 1")
   add("set key bottom right") -- accuracy rises: the lower right corner stays free
   add("plot $epochs using 1:4 with linespoints lw 2 pt 7 lc rgb '#228833' " ..
       "title 'test accuracy'")
end
add("unset multiplot")
add("set output")

---------------------------------------------------------------------------------------------
-- run gnuplot
---------------------------------------------------------------------------------------------
local gnuplot = os.getenv("GNUPLOT")
if not gnuplot or gnuplot == "" then gnuplot = "gnuplot" end
local found = io.popen("command -v " .. q(gnuplot) .. " 2>/dev/null")
local where = found:read("*a")
found:close()
if not where:match("%S") then
   die(("gnuplot not found ('%s' is not on PATH): install it (apt-get install gnuplot-nox) " ..
        "or set GNUPLOT to the program"):format(gnuplot))
end

local script = os.tmpname()
local sf = assert(io.open(script, "w"))
sf:write(table.concat(s, "\n"), "\n")
sf:close()
os.remove(output) -- so that a failed run cannot leave an old picture looking new
local p = io.popen(q(gnuplot) .. " " .. q(script) .. " 2>&1; echo \"__rc=$?\"")
local out = p:read("*a")
p:close()
os.remove(script)
local rc = tonumber(out:match("__rc=(%d+)%s*$"))
out = out:gsub("__rc=%d+%s*$", "")
local of = io.open(output, "rb")
local size = of and of:seek("end") or 0
if of then of:close() end
if rc ~= 0 or size == 0 then
   die(("gnuplot failed (exit %s) writing %s:\n%s"):format(tostring(rc), output, out))
end
print(("%s: %d steps, %d epochs -> %s"):format(input, #step_keys, #epoch_keys, output))
