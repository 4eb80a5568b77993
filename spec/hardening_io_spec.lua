-- Hardening of the C core and the file readers: sizes whose strides overflow, FIFOs given as
-- files, corrupt JPEG / PNG / gzip data, orphaned temporary files of lm.save, corrupt images in
-- an ImageFolder, hostile safetensors headers and checkpoint metadata. Every case here once
-- crashed, hung, or gave silently wrong data (docs/file_formats.md says what is checked).
--
-- A regression in the FIFO checks would hang: those calls run in a child process under
-- `timeout`, so the spec fails instead.

local H = require("spec.helpers")
local lm = H.lm
local ffi = require("ffi")
local data = require("lumen.data")
local serialize = require("lumen.serialize")

local FOLDER = "spec/fixtures/data/folder"

---------------------------------------------------------------------------------------------
-- helpers
---------------------------------------------------------------------------------------------

local TMP
local function tmpdir()
   if not TMP then
      TMP = os.tmpname()
      os.remove(TMP)
      os.execute("mkdir -p '" .. TMP .. "'")
   end
   return TMP
end

local function write_file(path, bytes)
   local f = assert(io.open(path, "wb"))
   f:write(bytes)
   f:close()
   return path
end

local function read_file(path)
   local f = assert(io.open(path, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

local function exists(path)
   return os.execute("test -e '" .. path .. "'") == 0
end

local function be32(n)
   return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
      math.floor(n / 256) % 256, n % 256)
end

local function le32(n)
   return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256,
      math.floor(n / 16777216) % 256)
end

local function u64le(n)
   local b = {}
   for i = 1, 8 do
      b[i] = string.char(n % 256)
      n = math.floor(n / 256)
   end
   return table.concat(b)
end

pcall(ffi.cdef, [[
   unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned len);
   int compress2(unsigned char *dest, unsigned long *destLen, const unsigned char *source,
                 unsigned long sourceLen, int level);
   int getpid(void);
]])
local zlib
do
   local ok, lib = pcall(ffi.load, "libz.so.1")
   if not ok then ok, lib = pcall(ffi.load, "z") end
   zlib = ok and lib or nil
end

local function crc32(s) return tonumber(zlib.crc32(0, s, #s)) end

local function zcompress(s)
   local cap = #s + 1024
   local out, len = ffi.new("unsigned char[?]", cap), ffi.new("unsigned long[1]", cap)
   assert(zlib.compress2(out, len, s, #s, 9) == 0)
   return ffi.string(out, len[0])
end

-- a gzip member with the payload in one stored (uncompressed) deflate block, so that a payload
-- byte can be flipped without making the deflate data itself invalid: only the CRC can tell
local function gzip_stored(payload, opts)
   opts = opts or {}
   assert(#payload < 65536)
   local body = payload
   if opts.flip then
      local p = opts.flip
      body = body:sub(1, p - 1) .. string.char((body:byte(p) + 1) % 256) .. body:sub(p + 1)
   end
   local n = #payload
   local parts = {
      string.char(0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3), -- header, no flags
      string.char(1, n % 256, math.floor(n / 256), 255 - n % 256, 255 - math.floor(n / 256)),
      body,
   }
   if not opts.no_trailer then parts[#parts + 1] = le32(crc32(payload)) .. le32(n) end
   return table.concat(parts)
end

local function idx_bytes(code, dims, payload)
   local parts = { string.char(0, 0, code, #dims) }
   for _, d in ipairs(dims) do parts[#parts + 1] = be32(d) end
   parts[#parts + 1] = payload or ""
   return table.concat(parts)
end

-- a safetensors file from a header table (encoded as given) and data bytes
local function safetensors(header_text, bytes)
   local pad = string.rep(" ", (8 - #header_text % 8) % 8)
   return u64le(#header_text + #pad) .. header_text .. pad .. (bytes or "")
end

-- run `code` (Lua, with lumen loaded as lm) in a child LuaJIT under `timeout`; returns the
-- child's output and whether it timed out
local function run_child(code, seconds)
   local script = write_file(tmpdir() .. "/child_" .. math.random(1, 1e9) .. ".lua",
      "package.path = " .. string.format("%q", package.path) .. "\n" ..
      "package.cpath = " .. string.format("%q", package.cpath) .. "\n" ..
      "local lm = require('lumen')\n" .. code .. "\n")
   local luajit = os.getenv("LUAJIT") or "luajit"
   local p = io.popen("timeout " .. (seconds or 10) .. " " .. luajit .. " '" .. script ..
      "' 2>&1; echo \"exit=$?\"")
   local out = p:read("*a")
   p:close()
   local rc = tonumber(out:match("exit=(%d+)%s*$"))
   return out, rc == 124 or rc == 137
end

---------------------------------------------------------------------------------------------
-- 1. sizes and strides that overflow int64
---------------------------------------------------------------------------------------------

describe("sizes whose strides overflow", function()
   local BIG = 2 ^ 40

   it("are refused by empty even when a zero size makes the tensor empty", function()
      local msg = H.assert_error("empty", lm.empty, { 0, BIG, BIG, BIG })
      assert.truthy(msg:find("sizes {0, 1099511627776, 1099511627776, 1099511627776} overflow",
         1, true), msg)
      H.assert_error_like("zeros", "overflow", lm.zeros, { BIG, BIG, BIG, 0 })
      -- large but representable: fine, as in PyTorch
      local t = lm.empty({ 0, 2 ^ 30, 2 ^ 30 })
      H.assert_strides(t, { 2 ^ 60, 2 ^ 30, 1 })
   end)

   it("are refused by view, reshape and expand", function()
      local e = lm.empty({ 0 })
      H.assert_error_like("view", "overflow", e.view, e, { -1, BIG, BIG })
      H.assert_error_like("reshape", "overflow", e.reshape, e, { 0, BIG, BIG })
      local one = lm.empty({ 1, 0 })
      H.assert_error_like("expand", "overflow", one.expand, one, { BIG, BIG, BIG, 0 })
   end)

   it("are refused by as_strided instead of wrapping into a small extent", function()
      -- 4096 * 2^52 wraps to 0 in 64 bits: the view looked as if it reached 1 element
      local t = lm.zeros({ 4 })
      H.assert_error_like("as_strided", "overflow", t.as_strided, t, { 4097 }, { 2 ^ 52 })
   end)

   it("in a safetensors header give a lumen.load error", function()
      local path = write_file(tmpdir() .. "/overflow.safetensors", safetensors(
         '{"x":{"dtype":"F32","shape":[0,1099511627776,1099511627776,1099511627776],' ..
         '"data_offsets":[0,0]}}'))
      local msg = H.assert_error("load", lm.load, path)
      assert.truthy(msg:find("tensor 'x'", 1, true) and msg:find("overflow", 1, true), msg)
   end)

   it("in an IDX header give a read_idx error", function()
      local path = write_file(tmpdir() .. "/overflow.idx",
         idx_bytes(0x08, { 0, 4294967295, 4294967295, 4294967295 }))
      H.assert_error_like("data.read_idx", "too large", data.read_idx, path)
      local gz = write_file(tmpdir() .. "/overflow.idx.gz",
         gzip_stored(idx_bytes(0x08, { 0, 4294967295, 4294967295, 4294967295 })))
      H.assert_error_like("data.read_idx", "too large", data.read_idx, gz)
   end)
end)

---------------------------------------------------------------------------------------------
-- 2. FIFOs (and other non-regular files) are refused without blocking
---------------------------------------------------------------------------------------------

describe("a FIFO given as a file", function()
   local fifo
   setup(function()
      fifo = tmpdir() .. "/pipe.fifo"
      os.remove(fifo)
      assert(os.execute("mkfifo '" .. fifo .. "'") == 0, "mkfifo failed")
   end)

   local cases = {
      { "load", "lm.load(P)" },
      { "load_checkpoint", "lm.load_checkpoint(P)" },
      { "data.read_idx", "lm.data.read_idx(P)" },
      { "data.read_image", "lm.data.read_image(P)" },
      { "data.load_image", "lm.data.load_image(P, {size = 4})" },
   }
   for _, c in ipairs(cases) do
      it("is refused by " .. c[1] .. " without hanging", function()
         local out, timed_out = run_child("local P = " .. string.format("%q", fifo) ..
            "\nlocal ok, err = pcall(function() return " .. c[2] .. " end)\n" ..
            "print(ok, err)")
         assert.is_false(timed_out, "lumen." .. c[1] .. " blocked on a FIFO")
         assert.truthy(out:find("false\tlumen." .. c[1] .. ": ", 1, true), out)
         assert.truthy(out:find("is not a regular file (it is a FIFO", 1, true), out)
      end)
   end

   it("is refused by data.fashion_mnist without hanging", function()
      local root = tmpdir() .. "/fifo_mnist"
      os.execute("mkdir -p '" .. root .. "'")
      for _, n in ipairs({ "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz" }) do
         os.remove(root .. "/" .. n)
         assert(os.execute("mkfifo '" .. root .. "/" .. n .. "'") == 0)
      end
      local out, timed_out = run_child("print(pcall(lm.data.fashion_mnist, 'train', " ..
         string.format("%q", root) .. "))")
      assert.is_false(timed_out, "data.fashion_mnist blocked on a FIFO")
      assert.truthy(out:find("is not a regular file", 1, true), out)
   end)

   it("is neither listed nor opened by ImageFolder", function()
      local root = tmpdir() .. "/fifo_folder"
      os.execute("mkdir -p '" .. root .. "/a'")
      write_file(root .. "/a/good.png", read_file(FOLDER .. "/bird/rgb.png"))
      os.remove(root .. "/a/pipe.png")
      assert(os.execute("mkfifo '" .. root .. "/a/pipe.png'") == 0)
      local out, timed_out = run_child("local ds = lm.data.ImageFolder(" ..
         string.format("%q", root) .. ", {size = 4})\n" ..
         "local n = 0\nfor x in lm.data.DataLoader(ds, {batch_size = 4}):iter() do " ..
         "n = n + x:size(1) end\nprint('files', #ds.paths, 'samples', n)\n" ..
         "print(pcall(lm.data.ImageFolder, " .. string.format("%q", fifo) .. "))")
      assert.is_false(timed_out, "ImageFolder blocked on a FIFO")
      assert.truthy(out:find("files\t1\tsamples\t1", 1, true), out)
      assert.truthy(out:find("false\tlumen.data.ImageFolder: ", 1, true), out)
   end)

   it("and a folder are refused with a message naming what they are", function()
      H.assert_error_like("data.read_idx", "is a directory", data.read_idx, tmpdir())
      H.assert_error_like("load", "is a directory", lm.load, tmpdir())
      H.assert_error_like("data.read_image", "is a character device", data.read_image,
         "/dev/null")
   end)
end)

---------------------------------------------------------------------------------------------
-- 3. corrupt JPEG / PNG data
---------------------------------------------------------------------------------------------

describe("corrupt image data", function()
   it("a JPEG whose SOF height was enlarged is an error, not invented rows", function()
      for _, src in ipairs({ "cat/rgb.jpg", "cat/gray.jpg", "cat/cmyk.jpg" }) do
         local jpg = read_file(FOLDER .. "/" .. src)
         local sof = jpg:find("\255\192", 1, true)
         local h = jpg:byte(sof + 5) * 256 + jpg:byte(sof + 6)
         local nh = 3 * h
         local path = write_file(tmpdir() .. "/tall_" .. src:gsub("/", "_"), jpg:sub(1, sof + 4) ..
            string.char(math.floor(nh / 256), nh % 256) .. jpg:sub(sof + 7))
         local msg = H.assert_error_like("data.read_image", "bad JPEG data", data.read_image,
            path)
         assert.truthy(msg:find(path, 1, true), msg)
         H.assert_error_like("data.load_image", "bad JPEG data", data.load_image, path,
            { size = 4 })
      end
   end)

   it("a file far larger than any image is refused before it is read", function()
      local path = tmpdir() .. "/huge.jpg"
      os.remove(path)
      -- sparse: no disk space is used
      assert(os.execute("truncate -s 2G '" .. path .. "'") == 0)
      H.assert_error_like("data.read_image", "too large for an image file", data.read_image,
         path)
      os.remove(path)
   end)

   it("a JPEG cut before its end marker is an error, also for a sample of few rows", function()
      for _, src in ipairs({ "cat/rgb.jpg", "cat/gray.jpg", "cat/cmyk.jpg" }) do
         local jpg = read_file(FOLDER .. "/" .. src)
         assert.equal("\255\217", jpg:sub(-2))
         local path = write_file(tmpdir() .. "/noeoi_" .. src:gsub("/", "_"), jpg:sub(1, -3))
         H.assert_error_like("data.read_image", "truncated JPEG", data.read_image, path)
         -- a 4x4 centre crop reads only the middle rows; the rest is still checked
         H.assert_error_like("data.load_image", "truncated JPEG", data.load_image, path,
            { size = 4, crop = "center" })
         H.assert_error_like("data.load_image", "truncated JPEG", data.load_image, path,
            { size = 4, crop = "center", draft = true })
      end
   end)

   it("a decompression bomb (a small JPEG declaring 30000 x 30000) is refused up front", function()
      local jpg = read_file(FOLDER .. "/cat/rgb.jpg")
      local sof = jpg:find("\255\192", 1, true)
      local dims = string.char(117, 48, 117, 48)          -- height, width 30000
      local path = write_file(tmpdir() .. "/bomb.jpg", jpg:sub(1, sof + 4) .. dims ..
         jpg:sub(sof + 9))
      local msg = H.assert_error_like("data.read_image", "decompression bomb", data.read_image,
         path)
      assert.truthy(msg:find("178956970", 1, true), msg)
      H.assert_error_like("data.load_image", "decompression bomb", data.load_image, path,
         { size = 4 })
   end)

   it("LUMEN_MAX_IMAGE_PIXELS sets the limit", function()
      pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
      ffi.C.setenv("LUMEN_MAX_IMAGE_PIXELS", "10", 1)
      local ok, msg = pcall(data.read_image, FOLDER .. "/cat/rgb.jpg")
      ffi.C.unsetenv("LUMEN_MAX_IMAGE_PIXELS")
      assert.is_false(ok)
      assert.truthy(tostring(msg):find("limit of 10 ", 1, true), msg)
      assert.truthy(data.read_image(FOLDER .. "/cat/rgb.jpg"))
   end)

   -- an 8x6 RGB PNG; rows_h rows of data whatever IHDR says
   local function png(h_header, rows_h, zmut)
      local rows = {}
      for y = 1, rows_h do
         local r = { "\0" }
         for x = 1, 24 do r[#r + 1] = string.char((x * 7 + y * 13) % 256) end
         rows[y] = table.concat(r)
      end
      local z = zcompress(table.concat(rows))
      if zmut then z = zmut(z) end
      local function chunk(t, d) return be32(#d) .. t .. d .. be32(crc32(t .. d)) end
      return "\137PNG\r\n\26\n" ..
         chunk("IHDR", be32(8) .. be32(h_header) .. string.char(8, 2, 0, 0, 0)) ..
         chunk("IDAT", z) .. chunk("IEND", "")
   end

   it("a PNG is read when whole", function()
      local x = data.read_image(write_file(tmpdir() .. "/ok.png", png(6, 6)))
      H.assert_sizes(x, { 6, 8, 3 })
   end)

   it("a PNG with more rows of data than its IHDR says is an error, not a cropped image",
      function()
         local path = write_file(tmpdir() .. "/short_ihdr.png", png(6, 9))
         H.assert_error_like("data.read_image", "too much image data", data.read_image, path)
      end)

   it("a PNG whose image data is cut short or has a wrong checksum is an error", function()
      local cut = write_file(tmpdir() .. "/cut_idat.png", png(6, 6, function(z)
         return z:sub(1, math.floor(#z / 2))
      end))
      H.assert_error_like("data.read_image", "bad PNG data", data.read_image, cut)
      local adler = write_file(tmpdir() .. "/adler.png", png(6, 6, function(z)
         return z:sub(1, -2) .. string.char((z:byte(-1) + 1) % 256)
      end))
      H.assert_error_like("data.read_image", "bad PNG data", data.read_image, adler)
   end)
end)

---------------------------------------------------------------------------------------------
-- 4. gzip'd IDX files: the stream must end with a valid trailer
---------------------------------------------------------------------------------------------

describe("a gzip'd IDX file", function()
   local payload = {}
   for i = 1, 200 do payload[i] = string.char(i % 256) end
   local idx = idx_bytes(0x08, { 10, 20 }, table.concat(payload))

   it("is read when whole, and with garbage after the member (as gzip does)", function()
      local x = data.read_idx(write_file(tmpdir() .. "/ok.idx.gz", gzip_stored(idx)))
      H.assert_sizes(x, { 10, 20 })
      assert.equal(5, x:totable()[1][5])
      x = data.read_idx(write_file(tmpdir() .. "/garbage.idx.gz",
         gzip_stored(idx) .. "trailing garbage"))
      H.assert_sizes(x, { 10, 20 })
   end)

   it("with a flipped payload byte and no trailer is an error", function()
      local path = write_file(tmpdir() .. "/flip_notrailer.idx.gz",
         gzip_stored(idx, { flip = 100, no_trailer = true }))
      H.assert_error_like("data.read_idx", "truncated", data.read_idx, path)
   end)

   it("without its trailer is an error", function()
      local path = write_file(tmpdir() .. "/notrailer.idx.gz",
         gzip_stored(idx, { no_trailer = true }))
      H.assert_error_like("data.read_idx", "ends before its trailer", data.read_idx, path)
   end)

   it("with a flipped payload byte is an error (CRC-32)", function()
      local path = write_file(tmpdir() .. "/flip.idx.gz", gzip_stored(idx, { flip = 100 }))
      H.assert_error_like("data.read_idx", "corrupt", data.read_idx, path)
   end)

   it("with more data than its dimensions need is an error, gzip'd or plain", function()
      local gz = write_file(tmpdir() .. "/long.idx.gz", gzip_stored(idx .. "xyz"))
      H.assert_error_like("data.read_idx", "3 bytes of data after", data.read_idx, gz)
      local plain = write_file(tmpdir() .. "/long.idx", idx .. "xyz")
      H.assert_error_like("data.read_idx", "has 3 bytes after", data.read_idx, plain)
   end)
end)

---------------------------------------------------------------------------------------------
-- 5. temporary files of interrupted saves
---------------------------------------------------------------------------------------------

describe("lm.save's temporary files", function()
   local function dead_pid()
      local p = io.popen("sh -c 'echo $$'")
      local pid = tonumber(p:read("*a"))
      p:close()
      return pid
   end

   local function make_tmp(target, pid, age)
      local path = string.format("%s.tmp.%d.%d.%d", target, pid, os.time() - age, 12345)
      write_file(path, "half a file")
      if age > 0 then
         assert(os.execute(string.format("touch -d @%d '%s'", os.time() - age, path)) == 0)
      end
      return path
   end

   it("are removed when their writer is dead, and only then", function()
      local dir = tmpdir() .. "/orphans"
      os.execute("mkdir -p '" .. dir .. "'")
      local target = dir .. "/model.safetensors"
      local dead = dead_pid()
      local sleeper = io.popen("sleep 60 & echo $!")
      local live = tonumber(sleeper:read("*l"))
      local orphan = make_tmp(target, dead, 3600)
      local live_tmp = make_tmp(target, live, 3600)
      local init_tmp = make_tmp(target, 1, 3600)
      local fresh = make_tmp(target, dead, 0) -- a writer we cannot see may be at work
      local other = make_tmp(dir .. "/other.safetensors", dead, 3600)
      local odd = write_file(target .. ".tmp.notapid", "x")
      lm.save({ w = lm.ones({ 2 }) }, target)
      os.execute("kill " .. live .. " 2>/dev/null")
      sleeper:close()
      assert.is_false(exists(orphan), "the orphan of a dead writer is still there")
      assert.is_true(exists(live_tmp), "a live writer's file was removed")
      assert.is_true(exists(init_tmp), "a live writer's file was removed")
      assert.is_true(exists(fresh), "a recently written file was removed")
      assert.is_true(exists(other), "another target's file was removed")
      assert.is_true(exists(odd), "a file not named as lm.save names them was removed")
      assert.same({ 1, 1 }, lm.load(target).w:totable())
   end)

   it("are removed by save_checkpoint too", function()
      local dir = tmpdir() .. "/orphans_ck"
      os.execute("mkdir -p '" .. dir .. "'")
      local target = dir .. "/ck.safetensors"
      local orphan = make_tmp(target, dead_pid(), 600)
      lm.save_checkpoint(target, { epoch = 3 })
      assert.is_false(exists(orphan))
      assert.equal(3, lm.load_checkpoint(target).epoch)
   end)
end)

---------------------------------------------------------------------------------------------
-- 6. ImageFolder(root, {skip_corrupt = true})
---------------------------------------------------------------------------------------------

describe("ImageFolder skip_corrupt", function()
   local root
   setup(function()
      root = tmpdir() .. "/skipfolder"
      os.execute("mkdir -p '" .. root .. "/a' '" .. root .. "/b'")
      write_file(root .. "/a/good1.png", read_file(FOLDER .. "/bird/rgb.png"))
      write_file(root .. "/a/good2.png", read_file(FOLDER .. "/bird/rgb.png"))
      write_file(root .. "/b/bad.jpg", read_file(FOLDER .. "/cat/rgb.jpg"):sub(1, 300))
      write_file(root .. "/b/good3.jpg", read_file(FOLDER .. "/cat/rgb.jpg"))
   end)

   -- run f with io.stderr captured; returns the text written
   local function capture_stderr(f)
      local real = io.stderr
      local buf = {}
      rawset(io, "stderr", { write = function(_, ...)
         for i = 1, select("#", ...) do buf[#buf + 1] = tostring((select(i, ...))) end
      end })
      local ok, err = pcall(f)
      rawset(io, "stderr", real)
      assert(ok, err)
      return table.concat(buf)
   end

   it("leaves a corrupt image out with one warning per file", function()
      local ds = data.ImageFolder(root, { size = 4, skip_corrupt = true })
      assert.equal(4, #ds.paths)
      local L = data.DataLoader(ds, { batch_size = 2, shuffle = false, workers = 2 })
      local text = capture_stderr(function()
         for _ = 1, 2 do -- two epochs: the warning is given once
            local sizes, labels = {}, {}
            for x, y in L:iter() do
               sizes[#sizes + 1] = x:size(1)
               for _, l in ipairs(y:totable()) do labels[#labels + 1] = l end
               H.assert_sizes(x, { x:size(1), 3, 4, 4 })
            end
            assert.same({ 2, 1 }, sizes)
            assert.same({ 1, 1, 2 }, labels)
         end
      end)
      local n = 0
      for line in text:gmatch("[^\n]+") do
         n = n + 1
         assert.truthy(line:find("skipping a corrupt image", 1, true), line)
         assert.truthy(line:find(root .. "/b/bad.jpg", 1, true), line)
      end
      assert.equal(1, n)
   end)

   it("skips a batch whose every image is corrupt", function()
      local r = tmpdir() .. "/allbad"
      os.execute("mkdir -p '" .. r .. "/a'")
      write_file(r .. "/a/1.png", read_file(FOLDER .. "/bird/rgb.png"))
      write_file(r .. "/a/2.jpg", "\255\216\255 not really")
      local ds = data.ImageFolder(r, { size = 4, skip_corrupt = true })
      local L = data.DataLoader(ds, { batch_size = 1, shuffle = false })
      local got = {}
      capture_stderr(function()
         for x, _, i in L:iter() do got[#got + 1] = { x:size(1), i } end
      end)
      assert.same({ { 1, 1 } }, got)
   end)

   it("is off by default (an error naming the file) and checked", function()
      local ds = data.ImageFolder(root, { size = 4 })
      local L = data.DataLoader(ds, { batch_size = 4, shuffle = false })
      local it_ = L:iter()
      local msg = H.assert_error("data.DataLoader", it_)
      assert.truthy(msg:find("bad.jpg", 1, true), msg)
      H.assert_error_like("data.ImageFolder", "skip_corrupt must be a boolean",
         data.ImageFolder, root, { skip_corrupt = 1 })
      H.assert_error_like("data.ImageFolder", "unknown option 'skip_corupt'",
         data.ImageFolder, root, { skip_corupt = true })
   end)
end)

---------------------------------------------------------------------------------------------
-- 7. hostile safetensors headers and checkpoint metadata
---------------------------------------------------------------------------------------------

describe("a hostile safetensors header", function()
   local function load_text(name, text, bytes)
      return write_file(tmpdir() .. "/" .. name .. ".safetensors", safetensors(text, bytes))
   end

   it("naming a tensor twice is an error (readers disagree on which one is meant)", function()
      local path = load_text("dup", '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' ..
         '"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "ab")
      H.assert_error_like("load", 'names "w" twice', lm.load, path)
      local esc = load_text("dup_esc", '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},' ..
         '"\\u0077":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "ab")
      H.assert_error_like("load", "twice", lm.load, esc)
   end)

   it("that is not valid UTF-8 is an error", function()
      local path = load_text("utf8", '{"w\255":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
         "a")
      H.assert_error_like("load", "not valid UTF-8", lm.load, path)
   end)

   it("that is a JSON array is an error", function()
      H.assert_error_like("load", "bad JSON header", lm.load, load_text("array", "[]"))
   end)

   it("with negative, fractional or huge dims, or offsets past the end, is an error", function()
      local function entry(shape, offs)
         return '{"w":{"dtype":"F32","shape":' .. shape .. ',"data_offsets":' .. offs .. '}}'
      end
      H.assert_error_like("load", "bad shape", lm.load,
         load_text("neg", entry("[-1]", "[0,0]")))
      H.assert_error_like("load", "bad shape", lm.load,
         load_text("frac", entry("[1.5]", "[0,6]"), string.rep("\0", 6)))
      H.assert_error_like("load", "need", lm.load,
         load_text("mismatch", entry("[3]", "[0,8]"), string.rep("\0", 8)))
      H.assert_error_like("load", "truncated", lm.load,
         load_text("past", entry("[2]", "[0,8]"), "1234"))
      H.assert_error_like("load", "larger than", lm.load,
         write_file(tmpdir() .. "/hugeheader.safetensors", u64le(2 ^ 40) .. "{}"))
   end)

   it("still loads a well-formed file", function()
      local path = tmpdir() .. "/good.safetensors"
      lm.save({ ["ü"] = lm.ones({ 2, 3 }) }, path)
      assert.same({ 2, 3 }, lm.load(path)["ü"]:size())
      assert.is_nil(serialize._duplicate_key('{"a":{"b":1},"c":{"b":2},"d":["a","a"]}'))
   end)
end)

describe("malformed checkpoint metadata", function()
   local function checkpoint_with(user_json)
      local meta = '{"version":1,"user":' .. user_json .. ',"optimizer":null,' ..
         '"has_model":false,"rng":null}'
      local header = '{"__metadata__":{"lumen.checkpoint":' .. serialize.json.encode(meta) .. '}}'
      return write_file(tmpdir() .. "/ck_" .. math.random(1, 1e9) .. ".safetensors",
         safetensors(header))
   end

   it("is a load_checkpoint error, never a Lua error or a wrong value", function()
      for _, bad in ipairs({
         '{"$kv":[1]}',                            -- an entry that is not a pair
         '{"$kv":5}',                              -- $kv not a list
         '{"$kv":[["x",{"$n":"oops"}]]}',          -- an unknown number marker
         '{"$kv":[[{"$n":"nan"},1]]}',             -- a NaN key
         '{"$kv":[["d",{"$dtype":"float99"}]]}',   -- an unknown dtype
         '{"$kv":[["x",{"what":1}]]}',             -- an object without a marker
      }) do
         H.assert_error_like("load_checkpoint", "malformed lumen.checkpoint metadata",
            lm.load_checkpoint, checkpoint_with(bad))
      end
      local ok = lm.load_checkpoint(checkpoint_with('{"$kv":[["x",{"$n":"-inf"}]]}'))
      assert.equal(-math.huge, ok.x)
   end)
end)
