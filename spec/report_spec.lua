-- spec/report_spec.lua -- lm.layout.check's HTML report (lua/lumen/layout_report.lua): the page's
-- content for a small model with one operator that loses channels-last, the options, and a
-- screenshot in a real headless browser (chromium) to see that it renders with the highlight.

local lm = require("lumen")
local shell = require("spec.shell")
local q, sh, read_file = shell.q, shell.sh, shell.read_file
local nn = lm.nn
local CL = lm.channels_last

local function count(s, plain)
   local n, i = 0, 1
   while true do
      local a, b = s:find(plain, i, true)
      if not a then return n end
      n, i = n + 1, b + 1
   end
end

-- x:contiguous() on a channels-last tensor: the one operator that loses the format
local Lossy = nn.Module:extend("Lossy")
function Lossy:forward(x) return x:contiguous() end

-- a container, so that the tree has depth
local Block = nn.Module:extend("Block")
function Block:__init(c)
   self.conv = nn.Conv2d(c, c, 3, { padding = 1 })
   self.bn = nn.BatchNorm2d(c)
   self.relu = nn.ReLU()
end
function Block:forward(x) return self.relu(self.bn(self.conv(x))) end

local function lossy_model()
   lm.manual_seed(0)
   local m = nn.Sequential(nn.Conv2d(3, 8, 3), Block(8), Lossy(), nn.ReLU(), nn.Conv2d(8, 8, 3),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
   return lm.to_channels_last(m)
end

local function clean_model()
   lm.manual_seed(0)
   local m = nn.Sequential(nn.Conv2d(3, 8, 3), Block(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
   return lm.to_channels_last(m)
end

local function input() return lm.randn({ 2, 3, 12, 12 }):to(CL) end

describe("lm.layout.check HTML report", function()
   local dir
   setup(function()
      dir = os.tmpname() .. "-report"
      os.execute("mkdir -p " .. q(dir))
   end)
   teardown(function() os.execute("rm -rf " .. q(dir)) end)

   it("writes a self-contained page with the tree, the lost module and its operator", function()
      local path = dir .. "/report.html"
      local r = lm.layout.check(lossy_model(), input(), { html = path })
      assert.is_false(r.ok)
      assert.are.equal("2", r.first_lost)
      local html = read_file(path)
      assert.is_not_nil(html, "no report written")
      assert.are.equal(html, r:to_html())          -- the same page as a string
      assert.is_truthy(html:match("^<!DOCTYPE html>"))
      assert.is_truthy(html:find("</html>%s*$"))
      assert.is_truthy(html:find("<style>", 1, true))
      -- self-contained: no scripts, no external style sheets, images or fonts
      assert.is_falsy(html:find("<script", 1, true))
      assert.is_falsy(html:find("<link", 1, true))
      assert.is_falsy(html:find("src=", 1, true))
      assert.is_falsy(html:find("url(", 1, true))
      assert.is_falsy(html:find("https?://"))
      -- the verdict names the module and the operator
      assert.is_truthy(html:find('channels-last is lost at module <a href="#m-2"><code>2</code>' ..
                                 '</a> by operator <code>Tensor.contiguous</code>', 1, true))
      -- exactly one module box is highlighted, and it is the Lossy one
      assert.are.equal(1, count(html, '<span class="box c-lost"'))
      assert.is_truthy(html:find('<span class="box c-lost" id="m-2" title="2"><span ' ..
                                 'class="name">2</span><span class="type">Lossy</span>', 1, true))
      assert.is_truthy(html:find("loses channels-last: operator <code>Tensor.contiguous</code>",
                                 1, true))
      -- the tree: every module, containers with their children, coloured by format
      for _, pm in ipairs({ { "0", "Conv2d", "cl" }, { "1", "Block", "cl" },
                            { "1.conv", "Conv2d", "cl" }, { "1.bn", "BatchNorm2d", "cl" },
                            { "3", "ReLU", "contiguous" }, { "4", "Conv2d", "cl" },
                            { "5", "AdaptiveAvgPool2d", "neutral" }, { "7", "Linear", "neutral" },
                            { "", "Sequential", "mixed" } }) do
         local id = pm[1] == "" and "root" or pm[1]:gsub("%.", "_")
         assert.is_truthy(html:find(('<span class="box c-%s" id="m-%s"'):format(pm[3], id), 1,
                                    true), pm[1] .. " " .. pm[3])
         assert.is_truthy(html:find('<span class="type">' .. pm[2] .. '</span>', 1, true), pm[2])
      end
      assert.is_truthy(html:find("contains the loss", 1, true))
      assert.are.equal(2, count(html, "<details open>")) -- the containers: (model) and Block
      -- the operator table and the text report
      assert.is_truthy(html:find("1 operator call(s) lost channels-last", 1, true))
      assert.is_truthy(html:find("first module to lose channels_last: 2", 1, true))
      -- the report keeps the operator on the row, and in the text form too
      assert.are.same({ "Tensor.contiguous" }, r.rows[5].lost_ops)
      assert.is_truthy(tostring(r):find("<-- lost channels_last (by Tensor.contiguous)", 1, true))
   end)

   it("marks a clean model ok, with nothing highlighted", function()
      local r = lm.layout.check(clean_model(), input(), { trace = true })
      assert.is_true(r.ok)
      local html = r:to_html()
      assert.is_truthy(html:find('<div class="verdict ok">', 1, true))
      assert.are.equal(0, count(html, "box c-lost"))
      assert.is_truthy(html:find("No operator lost channels-last", 1, true))
   end)

   it("escapes names and keeps the trace's report only when asked", function()
      local Odd = nn.Module:extend("Odd<&>\"")
      function Odd:forward(x) return x:contiguous() end
      local m = lm.to_channels_last(nn.Sequential(nn.Conv2d(3, 4, 3), Odd()))
      local r = lm.layout.check(m, input(), { backward = false })
      assert.is_nil(r.trace)                              -- no trace without trace/html
      -- the operators are always traced: the row names the one that lost the format
      assert.are.same({ "Tensor.contiguous" }, r.rows[2].lost_ops)
      assert.is_true(r.rows[2].lost)
      local html = r:to_html()
      assert.is_truthy(html:find("Odd&lt;&amp;&gt;&quot;", 1, true))
      assert.is_falsy(html:find("Odd<", 1, true))
      -- without the trace's report the module is still highlighted, with its operator named,
      -- and there is no operator table
      assert.are.equal(1, count(html, '<span class="box c-lost"'))
      assert.is_truthy(html:find("operator <code>Tensor.contiguous</code>", 1, true))
      assert.is_falsy(html:find("Operators</h2>", 1, true))
   end)

   it("rejects unknown options and bad paths", function()
      local m, x = clean_model(), input()
      local ok, err = pcall(lm.layout.check, m, x, { htm = "x.html" })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("lumen.layout.check: unknown option 'htm'", 1, true),
                       err)
      ok, err = pcall(lm.layout.check, m, x, { html = 42 })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("lumen.layout.check: html must be a file name", 1,
                                          true), err)
      ok, err = pcall(lm.layout.check, m, x, { html = dir .. "/no/such/dir/r.html" })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("cannot write", 1, true), err)
      local r = lm.layout.check(m, x)
      ok, err = pcall(r.to_html, r, 42)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("path must be a string", 1, true), err)
      ok, err = pcall(lm.layout.trace, function() end, { on_lost = 1 })
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find("on_lost must be a function", 1, true), err)
   end)
end)

-- pixels of img (uint8 H x W x 3) within tol of the colour {r, g, b}
local function count_colour(img, rgb, tol)
   local mask
   for c = 1, 3 do
      local near = img:select(3, c):float():sub(rgb[c]):abs():le(tol)
      mask = mask and mask:logical_and(near) or near
   end
   return mask:sum():item()
end

local have_chromium = select(2, sh("command -v chromium >/dev/null")) == 0

describe("the HTML report in a headless browser", function()
   local dir
   setup(function()
      dir = os.tmpname() .. "-shot"
      os.execute("mkdir -p " .. q(dir))
   end)
   teardown(function() os.execute("rm -rf " .. q(dir)) end)

   -- its own profile directory: other chromium processes may be running. The browser runs
   -- without the sanitizer preload of `make asan` (LD_PRELOAD=libasan: chromium hung under it
   -- until the timeout), and gets a second try with a fresh profile if the first leaves no file.
   local function screenshot(html_path, png_path)
      local out = ""
      for attempt = 1, 2 do
         out = out .. sh("env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS -u LSAN_OPTIONS " ..
                   "timeout -k 5 90 chromium --headless --no-sandbox --disable-gpu " ..
                   "--disable-dev-shm-usage --no-first-run --no-default-browser-check " ..
                   "--disable-extensions --disable-background-networking " ..
                   "--user-data-dir=" .. q(dir .. "/profile" .. attempt) .. " --hide-scrollbars " ..
                   "--screenshot=" .. q(png_path) .. " --window-size=1200,900 " ..
                   q("file://" .. html_path))
         if read_file(png_path) then break end
      end
      return out
   end

   local HIGHLIGHT = { 0xff, 0xcd, 0xd2 } -- .c-lost's background
   local GREEN = { 0xe8, 0xf5, 0xe9 }     -- .c-cl
   local BLUE = { 0xe3, 0xf2, 0xfd }      -- .c-contiguous

   ;(have_chromium and it or pending)("renders, with the lost module highlighted" ..
      (have_chromium and "" or " (chromium is not installed: skipped)"), function()
      local html_path, png_path = dir .. "/lossy.html", dir .. "/lossy.png"
      lm.layout.check(lossy_model(), input(), { html = html_path })
      local out = screenshot(html_path, png_path)
      local png = read_file(png_path)
      assert.is_not_nil(png, "no screenshot: " .. out)
      assert.are.equal("\137PNG\r\n\26\n", png:sub(1, 8))
      local img = lm.data.read_image(png_path)
      assert.are.same({ 900, 1200, 3 }, img:size())
      -- not blank: mostly white page, with the module colours and a large highlighted area
      local total = 900 * 1200
      local white = count_colour(img, { 255, 255, 255 }, 0)
      assert.is_true(white > total / 2 and white < total * 0.97, "white pixels: " .. white)
      assert.is_true(count_colour(img, GREEN, 3) > 5000, "channels-last modules")
      assert.is_true(count_colour(img, BLUE, 3) > 2000, "contiguous modules")
      local lossy_hl = count_colour(img, HIGHLIGHT, 3)
      assert.is_true(lossy_hl > 10000, "highlighted pixels: " .. lossy_hl)

      -- the same model without the loss: only the legend's swatch has the highlight colour
      local clean_html, clean_png = dir .. "/clean.html", dir .. "/clean.png"
      lm.layout.check(clean_model(), input(), { html = clean_html })
      out = screenshot(clean_html, clean_png)
      assert.is_not_nil(read_file(clean_png), "no screenshot: " .. out)
      local clean_hl = count_colour(lm.data.read_image(clean_png), HIGHLIGHT, 3)
      assert.is_true(clean_hl < 1000, "highlighted pixels in a clean report: " .. clean_hl)
   end)
end)
