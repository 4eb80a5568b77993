-- lumen.data: the IDX reader, the threaded batch loader over tensors and over image folders
-- (JPEG / PNG decoded in C), and examples/train_imagefolder.lua.
--
-- Image fixtures: spec/fixtures/data/ (made by make_fixtures.py with PIL; reference.lua holds
-- PIL's decoded pixels and bilinear resizes). IDX files and corrupt images are written at run
-- time into a private temporary folder.

local H = require("spec.helpers")
local lm = H.lm
local ffi = require("ffi")
local data = require("lumen.data")

local FIX = "spec/fixtures/data/"
local FOLDER = FIX .. "folder"
local PROBE = FIX .. "probe"
local REF = dofile(FIX .. "reference.lua")

---------------------------------------------------------------------------------------------
-- helpers
---------------------------------------------------------------------------------------------

local TMP
local function tmpdir()
   if not TMP then
      TMP = os.tmpname()
      os.remove(TMP)
      assert(os.execute("mkdir -p '" .. TMP .. "'") == 0 or true)
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

local function be32(n)
   return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
      math.floor(n / 256) % 256, n % 256)
end

-- an IDX file: element type code, dims, raw big-endian payload
local function idx_bytes(code, dims, payload)
   local parts = { string.char(0, 0, code, #dims) }
   for _, d in ipairs(dims) do parts[#parts + 1] = be32(d) end
   parts[#parts + 1] = payload or ""
   return table.concat(parts)
end

-- gzip through zlib (the library liblumen reads with)
pcall(ffi.cdef, [[
   void *gzopen(const char *path, const char *mode);
   int gzwrite(void *file, const void *buf, unsigned len);
   int gzclose(void *file);
]])
local zlib
do
   local ok, lib = pcall(ffi.load, "libz.so.1")
   if not ok then ok, lib = pcall(ffi.load, "z") end
   zlib = ok and lib or nil
end
local function write_gz(path, bytes)
   assert(zlib, "zlib not found")
   local f = zlib.gzopen(path, "wb")
   assert(f ~= nil)
   assert(zlib.gzwrite(f, bytes, #bytes) == #bytes)
   assert(zlib.gzclose(f) == 0)
   return path
end

local function unhex(s)
   local t = {}
   for i = 1, #s, 2 do t[#t + 1] = tonumber(s:sub(i, i + 1), 16) end
   return t
end

-- a float/uint8 (N, C, H, W) or (H, W, C) tensor's values as a flat list in NHWC / HWC order
local function nhwc(x)
   if x:dim() == 4 then return x:permute(1, 3, 4, 2):contiguous():reshape(-1):totable() end
   return x:contiguous():reshape(-1):totable()
end

local function assert_error(pattern, fn, ...)
   local ok, err = pcall(fn, ...)
   assert(not ok, "expected an error matching '" .. pattern .. "'")
   assert(tostring(err):find(pattern),
      "error '" .. tostring(err) .. "' does not match '" .. pattern .. "'")
   return tostring(err)
end

local function batches(loader, epoch, start)
   local out = {}
   for x, y, i in loader:iter(epoch, start) do
      out[#out + 1] = { x = nhwc(x), y = y and y:totable() or nil, i = i, n = x:size(1) }
   end
   return out
end

local function same_batches(a, b)
   if #a ~= #b then return false end
   for k = 1, #a do
      if a[k].i ~= b[k].i or not H.list_equal(a[k].x, b[k].x) then return false end
      if (a[k].y == nil) ~= (b[k].y == nil) then return false end
      if a[k].y and not H.list_equal(a[k].y, b[k].y) then return false end
   end
   return true
end

local function live_bytes()
   collectgarbage()
   collectgarbage()
   return lm.memory.live_bytes()
end

teardown(function()
   if TMP and TMP:match("^/tmp/") then os.execute("rm -rf '" .. TMP .. "'") end
end)

---------------------------------------------------------------------------------------------
-- IDX
---------------------------------------------------------------------------------------------

describe("lumen.data.read_idx", function()
   local u8 = {}
   for i = 1, 2 * 3 * 4 do u8[i] = (i * 37) % 256 end
   local u8_payload = string.char(unpack(u8))

   local function check_u8(t)
      H.assert_sizes(t, { 2, 3, 4 })
      assert.equal("uint8", tostring(t:dtype()))
      assert.is_true(t:is_contiguous())
      assert.same(u8, t:reshape(-1):totable())
   end

   it("reads a plain uint8 file", function()
      local p = write_file(tmpdir() .. "/u8.idx", idx_bytes(0x08, { 2, 3, 4 }, u8_payload))
      check_u8(data.read_idx(p))
   end)

   it("reads the same file gzip-compressed", function()
      local p = write_gz(tmpdir() .. "/u8.idx.gz", idx_bytes(0x08, { 2, 3, 4 }, u8_payload))
      check_u8(data.read_idx(p))
   end)

   it("reads big-endian int32, float32 and float64", function()
      local i32 = { 1, -2, 65536, -2147483648, 2147483647, 0 }
      local payload = {}
      for k, v in ipairs(i32) do payload[k] = be32(v % 4294967296) end
      local t = data.read_idx(write_gz(tmpdir() .. "/i32.gz",
         idx_bytes(0x0C, { 2, 3 }, table.concat(payload))))
      assert.equal("int32", tostring(t:dtype()))
      H.assert_sizes(t, { 2, 3 })
      assert.same(i32, t:reshape(-1):totable())

      -- 1.5f = 0x3FC00000, -2f = 0xC0000000; 0.1 (double) = 0x3FB999999999999A
      local f = data.read_idx(write_file(tmpdir() .. "/f32.idx",
         idx_bytes(0x0D, { 2 }, string.char(0x3F, 0xC0, 0, 0, 0xC0, 0, 0, 0))))
      assert.equal("float32", tostring(f:dtype()))
      assert.same({ 1.5, -2 }, f:totable())
      local d = data.read_idx(write_file(tmpdir() .. "/f64.idx",
         idx_bytes(0x0E, { 1 }, string.char(0x3F, 0xB9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9A))))
      assert.equal("float64", tostring(d:dtype()))
      assert.equal(0.1, d:totable()[1])
   end)

   it("reads empty dimensions", function()
      local t = data.read_idx(write_file(tmpdir() .. "/empty.idx", idx_bytes(0x08, { 0, 5 })))
      H.assert_sizes(t, { 0, 5 })
   end)

   it("rejects truncated files, plain and gzip", function()
      local full = idx_bytes(0x08, { 2, 3, 4 }, u8_payload)
      local cut = full:sub(1, #full - 5)
      assert_error("^lumen%.data%.read_idx: .*truncated",
         data.read_idx, write_file(tmpdir() .. "/cut.idx", cut))
      assert_error("^lumen%.data%.read_idx: .*truncated",
         data.read_idx, write_gz(tmpdir() .. "/cut.idx.gz", cut))
      -- the compressed stream itself cut short
      local gz = read_file(write_gz(tmpdir() .. "/whole.gz", full))
      local err = assert_error("^lumen%.data%.read_idx: ", data.read_idx,
         write_file(tmpdir() .. "/gzcut.gz", gz:sub(1, #gz - 12)))
      assert.truthy(err:find("truncated") or err:find("corrupt"), err)
      -- a header cut inside the dimensions
      assert_error("truncated", data.read_idx,
         write_file(tmpdir() .. "/hdr.idx", full:sub(1, 9)))
   end)

   it("rejects a corrupt gzip stream", function()
      local gz = read_file(write_gz(tmpdir() .. "/ok.gz", idx_bytes(0x08, { 2, 3, 4 }, u8_payload)))
      -- keep the 10-byte gzip header, scramble the deflate data
      local bad = { gz:byte(1, 10) }
      for i = 11, #gz do bad[#bad + 1] = (gz:byte(i) * 7 + 91) % 256 end
      assert_error("^lumen%.data%.read_idx: .*'.*bad%.gz'",
         data.read_idx, write_file(tmpdir() .. "/bad.gz", string.char(unpack(bad))))
   end)

   it("rejects a bad magic number, element type or rank", function()
      assert_error("not an IDX file", data.read_idx,
         write_file(tmpdir() .. "/magic.idx", string.char(1, 2, 8, 1) .. be32(1) .. "x"))
      assert_error("unsupported IDX element type 0x0b", data.read_idx,
         write_file(tmpdir() .. "/type.idx", idx_bytes(0x0B, { 1 }, "xx")))
      assert_error("bad IDX rank 0", data.read_idx,
         write_file(tmpdir() .. "/rank0.idx", string.char(0, 0, 8, 0)))
      assert_error("bad IDX rank 9", data.read_idx,
         write_file(tmpdir() .. "/rank9.idx", string.char(0, 0, 8, 9) .. string.rep(be32(1), 9)))
   end)

   it("rejects dimensions the file cannot hold, before allocating", function()
      local before = lm.memory.peak_bytes()
      assert_error("truncated: its dimensions %(60000 x 28 x 28%) need 47040000 bytes",
         data.read_idx, write_file(tmpdir() .. "/big.idx",
            idx_bytes(0x08, { 60000, 28, 28 }, "abc")))
      assert_error("dimensions %(4294967295 x 4294967295 x 16%) are too large",
         data.read_idx, write_file(tmpdir() .. "/huge.idx",
            idx_bytes(0x0E, { 4294967295, 4294967295, 16 }, "abc")))
      assert_error("dimensions %(65535 x 65535 x 255%) are too large for the file",
         data.read_idx, write_gz(tmpdir() .. "/big.gz",
            idx_bytes(0x08, { 65535, 65535, 255 }, "abc")))
      assert.is_true(lm.memory.peak_bytes() - before < 2 ^ 20)
   end)

   it("names a missing file and checks its argument", function()
      assert_error("^lumen%.data%.read_idx: cannot open '/nonexistent/x.idx'", data.read_idx,
         "/nonexistent/x.idx")
      assert_error("^lumen%.data%.read_idx: path must be a string", data.read_idx, 42)
   end)

   local root = os.getenv("LUMEN_FASHION_MNIST") or data.FASHION_MNIST_ROOT
   local have_fm = io.open(root .. "/t10k-labels-idx1-ubyte.gz", "rb")
   if have_fm then have_fm:close() end
   ;(have_fm and it or pending)("reads Fashion-MNIST's test split with 1-based labels", function()
      local ds = data.fashion_mnist("test")
      H.assert_sizes(ds.images, { 10000, 28, 28 })
      assert.equal("uint8", tostring(ds.images:dtype()))
      assert.equal("int64", tostring(ds.labels:dtype()))
      assert.equal(1, ds.labels:min():item())
      assert.equal(10, ds.labels:max():item())
      assert_error("split must be 'train' or 'test'", data.fashion_mnist, "valid")
      assert.equal(10000, ds:len())
      assert.equal(10000, ds:size())
      local s = tostring(ds)
      assert.truthy(s:find("FashionMNIST (test)", 1, true), s)
      assert.truthy(s:find("samples: 10000", 1, true), s)
      assert.truthy(s:find("classes: 10 (T-shirt/top, Trouser, Pullover, Dress, Coat, ...)", 1,
                           true), s)
      assert.truthy(s:find("root: " .. root, 1, true), s)
   end)

   it("TensorDataset: len, size, tostring; a DataLoader takes it; len is batches", function()
      local images = lm.zeros({ 10, 4, 4 }, { dtype = lm.uint8 })
      local labels = lm.ones({ 10 }, { dtype = lm.int64 })
      local ds = data.TensorDataset(images, labels, { name = "Toy", classes = { "a", "b" } })
      assert.equal(10, ds:len())
      assert.equal(10, ds:size())
      local s = tostring(ds)
      assert.truthy(s:find("^Toy\n"), s)
      assert.truthy(s:find("samples: 10", 1, true), s)
      assert.truthy(s:find("images: uint8 (10,4,4)", 1, true), s)
      assert.truthy(s:find("labels: int64 (10)", 1, true), s)
      local loader = data.DataLoader(ds, { batch_size = 4, workers = 1, pad = 1, crop = 4,
                                           hflip = true, mean = { 0.5 }, std = { 0.25 } })
      assert.equal(3, loader:len())
      assert.equal(loader:num_batches(), loader:len())
      local n = 0
      for _ in loader:iter(1) do n = n + 1 end
      assert.equal(3, n)
      local ls = tostring(loader)
      assert.truthy(ls:find("^DataLoader\n"), ls)
      assert.truthy(ls:find("samples: 10", 1, true), ls)
      assert.truthy(ls:find("batches: 3 of 4", 1, true), ls)
      assert.truthy(ls:find("pad 1, crop 4x4, hflip, normalize mean {0.5} std {0.25}", 1, true),
                    ls)
      local dl = data.DataLoader(ds, { batch_size = 4, drop_last = true, workers = 1 })
      assert.equal(2, dl:len())
      assert_error("labels must be 1%-D", data.TensorDataset, images, lm.ones({ 3 }))
      assert_error("images must be a tensor", data.TensorDataset, {})
      local sampler = data.DistributedSampler(10, { num_replicas = 2, rank = 0 })
      assert.equal(5, sampler:len())
   end)
end)

---------------------------------------------------------------------------------------------
-- the loader over tensors
---------------------------------------------------------------------------------------------

describe("lumen.data.DataLoader over tensors", function()
   -- 12 gray 4x5 images; pixel (n, y, x) = 1 + 20 n + 5 y + x (0 only ever comes from padding)
   local N, IH, IW = 12, 4, 5
   local function value(n, y, x) return 1 + 20 * n + 5 * y + x end
   local flat, labels = {}, {}
   for n = 0, N - 1 do
      for y = 0, IH - 1 do
         for x = 0, IW - 1 do flat[#flat + 1] = value(n, y, x) end
      end
      labels[n + 1] = n + 1
   end
   local ds = {
      images = lm.tensor(flat, { dtype = lm.uint8 }):reshape(N, IH, IW),
      labels = lm.tensor(labels, { dtype = lm.int64 }),
   }

   it("gives channels-last float32 batches in order, with labels", function()
      local L = data.DataLoader(ds, { batch_size = 5, shuffle = false })
      assert.equal(3, L:num_batches())
      local seen = 0
      for x, y, i in L:iter() do
         seen = seen + 1
         assert.equal(seen, i)
         local b = i < 3 and 5 or 2
         H.assert_sizes(x, { b, 1, IH, IW })
         assert.equal("float32", tostring(x:dtype()))
         assert.is_true(x:is_contiguous(lm.channels_last))
         assert.equal("int64", tostring(y:dtype()))
         local v, yl = nhwc(x), y:totable()
         for s = 1, b do
            local n = (i - 1) * 5 + s - 1
            assert.equal(n + 1, yl[s])
            for yy = 0, IH - 1 do
               for xx = 0, IW - 1 do
                  local got = v[(s - 1) * IH * IW + yy * IW + xx + 1]
                  assert.equal(value(n, yy, xx), math.floor(got * 255 + 0.5))
               end
            end
         end
      end
      assert.equal(3, seen)
   end)

   it("gives NCHW batches when asked", function()
      local L = data.DataLoader(ds, { batch_size = 4, shuffle = false,
         memory_format = lm.contiguous_format })
      local a = batches(L, 1)
      local b = batches(data.DataLoader(ds, { batch_size = 4, shuffle = false }), 1)
      for x in L:iter(1) do assert.is_true(x:is_contiguous()) end
      assert.is_true(same_batches(a, b))
   end)

   it("normalises per channel: (x / 255 - mean) / std", function()
      local rgb = {}
      for i = 1, 2 * 2 * 3 * 3 do rgb[i] = (i * 29) % 256 end
      local img = lm.tensor(rgb, { dtype = lm.uint8 }):reshape(2, 2, 3, 3)
      local mean, std = { 0.5, 0.25, 0.125 }, { 0.5, 2, 0.25 }
      local L = data.DataLoader({ images = img }, { batch_size = 2, shuffle = false, mean = mean,
         std = std })
      for x, y in L:iter() do
         assert.is_nil(y)
         H.assert_sizes(x, { 2, 3, 2, 3 })
         local v = nhwc(x)
         for i = 1, #rgb do
            local c = (i - 1) % 3 + 1
            local want = (rgb[i] / 255 - mean[c]) / std[c]
            assert.is_true(math.abs(v[i] - want) < 1e-5, i .. ": " .. v[i] .. " vs " .. want)
         end
      end
   end)

   it("drop_last drops the short batch", function()
      local L = data.DataLoader(ds, { batch_size = 5, drop_last = true })
      assert.equal(2, L:num_batches())
      local n = 0
      for x in L:iter() do
         n = n + 1
         assert.equal(5, x:size(1))
      end
      assert.equal(2, n)
   end)

   it("shuffles deterministically: a permutation per epoch, fixed by seed and epoch", function()
      local opts = { batch_size = 5, seed = 7, pad = 1, crop = { 4, 5 }, hflip = true }
      local L = data.DataLoader(ds, opts)
      local a, b = batches(L, 3), batches(data.DataLoader(ds, opts), 3)
      assert.is_true(same_batches(a, b))
      local ids = {}
      for _, bt in ipairs(a) do
         for _, l in ipairs(bt.y) do ids[#ids + 1] = l end
      end
      table.sort(ids)
      for n = 1, N do assert.equal(n, ids[n]) end
      assert.is_false(same_batches(a, batches(L, 4)))
      opts.seed = 8
      assert.is_false(same_batches(a, batches(data.DataLoader(ds, opts), 3)))
   end)

   it("gives the same batches with 1, 2 or 3 workers", function()
      local function run(w)
         return batches(data.DataLoader(ds, { batch_size = 3, seed = 1, pad = 2, crop = 3,
            hflip = true, workers = w, prefetch = w }), 2)
      end
      local one = run(1)
      assert.is_true(same_batches(one, run(2)))
      assert.is_true(same_batches(one, run(3)))
   end)

   it("resumes at start_batch with the batches of a full pass", function()
      local opts = { batch_size = 3, seed = 5, pad = 1, crop = { 3, 4 }, hflip = true }
      local full = batches(data.DataLoader(ds, opts), 2)
      local rest = batches(data.DataLoader(ds, opts), 2, 3)
      assert.equal(#full - 2, #rest)
      for k = 1, #rest do
         assert.equal(k + 2, rest[k].i)
         assert.is_true(same_batches({ full[k + 2] }, { rest[k] }))
      end
      assert.equal(0, #batches(data.DataLoader(ds, opts), 2, 99))
   end)

   -- find the crop offset / flip that explains a sample, or nil
   local function explain(v, base, n, oh, ow, pad)
      for _, flip in ipairs({ false, true }) do
         for oy = -pad, IH + pad - oh do
            for ox = -pad, IW + pad - ow do
               local ok = true
               for yy = 0, oh - 1 do
                  for xx = 0, ow - 1 do
                     local sy = yy + oy
                     local sx = (flip and (ow - 1 - xx) or xx) + ox
                     local want = (sy >= 0 and sy < IH and sx >= 0 and sx < IW) and
                        value(n, sy, sx) or 0
                     if math.floor(v[base + yy * ow + xx + 1] * 255 + 0.5) ~= want then
                        ok = false
                        break
                     end
                  end
                  if not ok then break end
               end
               if ok then return oy, ox, flip end
            end
         end
      end
   end

   it("crops padded images and flips them, every sample a true crop", function()
      for _, case in ipairs({ { pad = 1, crop = { 4, 5 } }, { pad = 0, crop = { 2, 3 } },
                              { pad = 2, crop = { 3, 3 } } }) do
         local oh, ow = case.crop[1], case.crop[2]
         local L = data.DataLoader(ds, { batch_size = 4, seed = 3, pad = case.pad,
            crop = case.crop, hflip = true })
         local offsets, flips = {}, {}
         for e = 1, 4 do
            for x, y in L:iter(e) do
               H.assert_sizes(x, { x:size(1), 1, oh, ow })
               local v, yl = nhwc(x), y:totable()
               for s = 1, x:size(1) do
                  local oy, ox, flip = explain(v, (s - 1) * oh * ow, yl[s] - 1, oh, ow, case.pad)
                  assert.is_not_nil(oy, "sample " .. yl[s] .. " is not a crop of its image")
                  offsets[oy .. "," .. ox] = true
                  flips[flip] = true
               end
            end
         end
         assert.is_true(flips[true] and flips[false], "both flips occur")
         local count = 0
         for _ in pairs(offsets) do count = count + 1 end
         assert.is_true(count >= 3, "offsets vary")
      end
   end)

   it("without crop options gives the images unchanged", function()
      local L = data.DataLoader(ds, { batch_size = N, shuffle = false })
      for x in L:iter() do
         local v = nhwc(x)
         for n = 0, N - 1 do
            assert.equal(0, explain(v, n * IH * IW, n, IH, IW, 0))
         end
      end
   end)

   it("keeps memory flat over epochs", function()
      local big = { images = lm.zeros(64, 16, 16, 3, { dtype = lm.uint8 }),
         labels = lm.zeros(64, { dtype = lm.int64 }) }
      local L = data.DataLoader(big, { batch_size = 8, pad = 2, crop = 16, hflip = true })
      for x in L:iter(1) do x:sum() end
      local base = live_bytes()
      for e = 2, 10 do
         for x, y in L:iter(e) do
            x:sum()
            y:sum()
         end
      end
      local after = live_bytes()
      assert.is_true(math.abs(after - base) <= 0.1 * base,
         string.format("live bytes %d after one epoch, %d after ten", base, after))
   end)

   it("survives leaving an epoch early", function()
      local L = data.DataLoader(ds, { batch_size = 2, prefetch = 3, workers = 2 })
      for x, _, i in L:iter() do
         if i == 2 then break end
         x:sum()
      end
      collectgarbage()
      collectgarbage()
      assert.equal(6, #batches(L, 1))
   end)

   it("rejects bad options", function()
      local function bad(pattern, d, o)
         assert_error("^lumen%.data%.DataLoader: " .. pattern, data.DataLoader, d, o)
      end
      bad("batch_size must be an integer >= 1", ds, { batch_size = 0 })
      bad("batch_size must be an integer", ds, { batch_size = 1.5 })
      bad("batch_size must be an integer", ds, { batch_size = "8" })
      bad("workers must be an integer in 1..256", ds, { workers = 0 })
      bad("prefetch must be an integer", ds, { prefetch = -1 })
      bad("unknown option 'batchsize'", ds, { batchsize = 4 })
      bad("shuffle must be a boolean", ds, { shuffle = 1 })
      bad("memory_format must be channels_last or contiguous_format", ds,
         { memory_format = lm.channels_last_3d })
      bad("crop 7x5 is larger than the padded image %(6x7%)", ds, { pad = 1, crop = { 7, 5 } })
      bad("pad must be an integer", ds, { pad = -1 })
      bad("crop must be a positive integer or {h, w}", ds, { crop = { 2 } })
      bad("mean must be a number or a list of 1 numbers", ds, { mean = { 0.1, 0.2 } })
      bad("std must hold positive finite numbers", ds, { std = 0 })
      bad("seed must be an integer", ds, { seed = -1 })
      bad("dataset must be an ImageFolder or a table with an images tensor", nil)
      bad("images must be uint8", { images = lm.zeros(2, 3, 3) })
      bad("images must be uint8 %(N, H, W%) or %(N, H, W, C%)",
         { images = lm.zeros(2, 3, { dtype = lm.uint8 }) })
      bad("labels must be 1%-D with one label per image",
         { images = ds.images, labels = lm.zeros(3, { dtype = lm.int64 }) })
      bad("opts must be a table", ds, 5)
      local L = data.DataLoader(ds, {})
      assert_error("^lumen%.data%.DataLoader: start_batch must be an integer >= 1", L.iter, L, 1, 0)
      assert_error("^lumen%.data%.DataLoader: epoch must be an integer", L.iter, L, 1.5)
   end)
end)

---------------------------------------------------------------------------------------------
-- images
---------------------------------------------------------------------------------------------

describe("lumen.data images", function()
   it("has JPEG and PNG decoding (liblumen linked with -ljpeg -lpng)", function()
      local s = data.image_support()
      assert.is_true(s.jpeg and s.png, "liblumen was built without libjpeg / libpng: link it " ..
         "with -Wl,--no-as-needed -ljpeg -lpng")
   end)

   it("decodes every fixture exactly as PIL does", function()
      local n = 0
      for rel, r in pairs(REF.images) do
         n = n + 1
         local img = data.read_image(FOLDER .. "/" .. rel)
         H.assert_sizes(img, { r.h, r.w, 3 }, rel)
         assert.equal("uint8", tostring(img:dtype()))
         assert.same(unhex(r.rgb), nhwc(img), rel)
      end
      assert.is_true(n >= 13)
   end)

   it("recognises the format by content, not by the file name", function()
      local png = FOLDER .. "/bird/rgb.png"
      local disguised = write_file(tmpdir() .. "/really_a_png.JPEG", read_file(png))
      assert.same(nhwc(data.read_image(png)), nhwc(data.read_image(disguised)))
   end)

   it("resamples with PIL's bilinear filter (Resize, Resize + CenterCrop)", function()
      for _, r in ipairs(REF.resized) do
         local x = data.load_image(FOLDER .. "/" .. r.file, { size = { r.h, r.w }, crop = r.crop,
            resize = r.resize, draft = false })
         H.assert_sizes(x, { 1, 3, r.h, r.w })
         assert.is_true(x:is_contiguous(lm.channels_last))
         local want, got = unhex(r.rgb), nhwc(x)
         local worst = 0
         for i = 1, #want do worst = math.max(worst, math.abs(got[i] * 255 - want[i])) end
         -- PIL rounds to uint8 after each pass; lumen stays in float
         assert.is_true(worst <= 1.01, string.format("%s %s %dx%d: off by %.3f", r.file, r.crop,
            r.h, r.w, worst))
      end
   end)

   it("normalises, flips, and writes NCHW or channels-last alike", function()
      local path = FOLDER .. "/cat/rgb.jpg"
      local mean, std = data.IMAGENET_MEAN, data.IMAGENET_STD
      local plain = nhwc(data.load_image(path, { size = { 5, 7 } }))
      local norm = data.load_image(path, { size = { 5, 7 }, mean = mean, std = std })
      local nv = nhwc(norm)
      for i = 1, #plain do
         local c = (i - 1) % 3 + 1
         assert.is_true(math.abs(nv[i] - (plain[i] - mean[c]) / std[c]) < 1e-5)
      end
      local nchw = data.load_image(path, { size = { 5, 7 }, mean = mean, std = std,
         memory_format = lm.contiguous_format })
      assert.is_true(nchw:is_contiguous())
      assert.same(nv, nhwc(nchw))
      local flipped = nhwc(data.load_image(path, { size = { 5, 7 }, hflip = true }))
      for y = 0, 4 do
         for x = 0, 6 do
            for c = 1, 3 do
               assert.equal(plain[(y * 7 + x) * 3 + c], flipped[(y * 7 + (6 - x)) * 3 + c])
            end
         end
      end
   end)

   it("replicates gray images into three equal channels", function()
      for _, f in ipairs({ "bird/gray.png", "cat/gray.jpg", "bird/graya.png", "cat/gray16.png",
                           "cat/bits1.png" }) do
         local v = nhwc(data.load_image(FOLDER .. "/" .. f, { size = 3 }))
         for i = 1, #v, 3 do
            assert.equal(v[i], v[i + 1])
            assert.equal(v[i], v[i + 2])
         end
      end
   end)

   it("decodes JPEGs at a reduced size when draft allows it", function()
      local path = FIX .. "smooth.jpg" -- 64x48: an 8x6 sample decodes at 1/8, 16x12 at 1/4
      for _, size in ipairs({ { 6, 8 }, { 12, 16 }, { 7, 9 } }) do
         local exact = nhwc(data.load_image(path, { size = size, draft = false }))
         local draft = nhwc(data.load_image(path, { size = size }))
         local worst = 0
         for i = 1, #exact do worst = math.max(worst, math.abs(exact[i] - draft[i])) end
         assert.is_true(worst > 0, "draft decoding is used")
         assert.is_true(worst < 0.03, "draft differs by " .. worst)
      end
      -- a sample larger than 1/2 of the image decodes at full size either way
      assert.same(nhwc(data.load_image(path, { size = { 30, 40 }, draft = false })),
         nhwc(data.load_image(path, { size = { 30, 40 } })))
      -- PNGs have no draft mode
      local p = FOLDER .. "/bird/rgb.png"
      assert.same(nhwc(data.load_image(p, { size = 2, draft = false })),
         nhwc(data.load_image(p, { size = 2 })))
   end)

   it("skips the rows a crop does not need without changing the pixels", function()
      -- a centre crop at the image's own scale is an exact copy of the decoded pixels
      for _, f in ipairs({ FIX .. "smooth.jpg", FOLDER .. "/cat/rgb.jpg",
                           FOLDER .. "/cat/interlaced.png" }) do
         local full = data.read_image(f)
         local ih, iw = full:size(1), full:size(2)
         local px = nhwc(full)
         local v = nhwc(data.load_image(f, { size = { 4, 6 }, crop = "center",
            resize = math.min(ih, iw), draft = false }))
         -- torchvision's CenterCrop rounds with Python's round(): half to even
         local function pyround(z)
            local fl = math.floor(z)
            if z - fl ~= 0.5 then return math.floor(z + 0.5) end
            return fl % 2 == 0 and fl or fl + 1
         end
         local top, left = pyround((ih - 4) / 2), pyround((iw - 6) / 2)
         for y = 0, 3 do
            for x = 0, 5 do
               for c = 1, 3 do
                  local want = px[((top + y) * iw + left + x) * 3 + c]
                  assert.is_true(math.abs(v[(y * 6 + x) * 3 + c] * 255 - want) < 1e-3, f)
               end
            end
         end
      end
   end)

   it("reads crops and flips back from coordinate-coded pixels", function()
      -- probe images: R = 15 x, G = 20 y (16x12). A RANDOM crop with fixed area and ratio is
      -- 8x6; at size 6x8 it is copied exactly, so every pixel tells where it came from.
      local path = PROBE .. "/even/probe0.png"
      local seen_i, seen_j = {}, {}
      for seed = 0, 40 do
         local flip = seed % 2 == 1
         local v = nhwc(data.load_image(path, { size = { 6, 8 }, crop = "random",
            scale = { 0.25, 0.25 }, ratio = { 4 / 3, 4 / 3 }, seed = seed, hflip = flip }))
         local function at(y, x, c) return math.floor(v[(y * 8 + x) * 3 + c] * 255 + 0.5) end
         local x0 = at(0, flip and 7 or 0, 1) / 15
         local y0 = at(0, 0, 2) / 20
         assert.is_true(x0 >= 0 and x0 <= 8 and y0 >= 0 and y0 <= 6 and x0 % 1 == 0)
         for y = 0, 5 do
            for x = 0, 7 do
               local sx = flip and (7 - x) or x
               assert.equal(15 * (x0 + sx), at(y, x, 1))
               assert.equal(20 * (y0 + y), at(y, x, 2))
               assert.equal(10, at(y, x, 3))
            end
         end
         seen_i[y0], seen_j[x0] = true, true
      end
      local ni, nj = 0, 0
      for _ in pairs(seen_i) do ni = ni + 1 end
      for _ in pairs(seen_j) do nj = nj + 1 end
      assert.is_true(ni >= 3 and nj >= 3, "crop offsets vary with the seed")
      -- CENTER: 16x12 scaled to shorter side 12 (unchanged), central 8x6 at (4, 3)
      local v = nhwc(data.load_image(path, { size = { 6, 8 }, crop = "center", resize = 12 }))
      for y = 0, 5 do
         for x = 0, 7 do
            assert.equal(15 * (4 + x), math.floor(v[(y * 8 + x) * 3 + 1] * 255 + 0.5))
            assert.equal(20 * (3 + y), math.floor(v[(y * 8 + x) * 3 + 2] * 255 + 0.5))
         end
      end
   end)

   it("keeps RandomResizedCrop's regions inside the image and in range", function()
      -- whole-image area and its own aspect ratio: the crop is the image
      local path = PROBE .. "/odd/probe1.png"
      local whole = nhwc(data.load_image(path, { size = { 12, 16 } }))
      for seed = 1, 5 do
         assert.same(whole, nhwc(data.load_image(path, { size = { 12, 16 }, crop = "random",
            scale = { 1, 1 }, ratio = { 4 / 3, 4 / 3 }, seed = seed })))
      end
      -- impossible ratios fall back to the central crop with the ratio clamped
      local v = nhwc(data.load_image(path, { size = { 12, 6 }, crop = "random",
         scale = { 1, 1 }, ratio = { 0.5, 0.5 }, seed = 3 }))
      assert.equal(15 * 5, math.floor(v[1] * 255 + 0.5)) -- w = 6 of 16: columns 5..10
   end)

   describe("corrupt files", function()
      local function variants()
         local dir = tmpdir() .. "/bad"
         os.execute("mkdir -p '" .. dir .. "'")
         local jpg = read_file(FOLDER .. "/cat/rgb.jpg")
         local png = read_file(FOLDER .. "/bird/rgb.png")
         local sos = jpg:find("\255\218", 1, true)
         local idat = png:find("IDAT", 1, true)
         local b1, b2, b3, b4 = png:byte(idat - 4, idat - 1)
         local crc = idat + 4 + ((b1 * 256 + b2) * 256 + b3) * 256 + b4 -- the IDAT chunk's CRC
         local flipped = png:sub(1, crc - 1) .. string.char((png:byte(crc) + 1) % 256) ..
            png:sub(crc + 1)
         local inflate = png:sub(1, idat + 5) .. string.char((png:byte(idat + 6) + 1) % 256) ..
            png:sub(idat + 7)
         local sof = jpg:find("\255\192", 1, true)
         local badsof = jpg:sub(1, sof + 4) .. string.char(0, 0) .. jpg:sub(sof + 7)
         return {
            { write_file(dir .. "/trunc.jpg", jpg:sub(1, sos + 20)), "truncated JPEG file" },
            { write_file(dir .. "/headonly.jpg", jpg:sub(1, 200)), "truncated JPEG file" },
            { write_file(dir .. "/badsof.jpg", badsof), "bad JPEG data" },
            { write_file(dir .. "/trunc.png", png:sub(1, idat + 10)), "truncated PNG file" },
            { write_file(dir .. "/crc.png", flipped), "bad PNG data %(IDAT: CRC error%)" },
            { write_file(dir .. "/inflate.png", inflate), "bad PNG data %(IDAT: " },
            { write_file(dir .. "/text.png", "hello, world\n"), "is not a JPEG or PNG file" },
            { write_file(dir .. "/empty.jpg", ""), "is empty" },
            { dir .. "/missing.png", "cannot open" },
         }
      end

      it("give an error naming the file, never a crash", function()
         for _, v in ipairs(variants()) do
            local path, why = v[1], v[2]
            local esc = path:gsub("%p", "%%%0")
            local err = assert_error("^lumen%.data%.read_image: .*" .. esc, data.read_image, path)
            assert.truthy(err:find(why), err)
            err = assert_error("^lumen%.data%.load_image: .*" .. esc, data.load_image, path,
               { size = 4 })
            assert.truthy(err:find(why), err)
         end
      end)

      it("survive random damage", function()
         local dir = tmpdir() .. "/fuzz"
         os.execute("mkdir -p '" .. dir .. "'")
         local n_ok, n_err = 0, 0
         for _, src in ipairs({ "cat/rgb.jpg", "bird/rgb.png", "cat/interlaced.png",
                                "cat/cmyk.jpg" }) do
            local bytes = { read_file(FOLDER .. "/" .. src):byte(1, -1) }
            local state = 12345
            for k = 1, 60 do
               local b = { unpack(bytes) }
               for _ = 1, 1 + k % 4 do
                  state = (state * 1103515245 + 12345) % 2147483648
                  local pos = 3 + state % (#b - 2)
                  b[pos] = (b[pos] + 1 + state % 255) % 256
               end
               local cut = k % 5 == 0 and math.floor(#b * (k % 7 + 1) / 9) or #b
               local path = write_file(dir .. "/f" .. k .. src:match("%.%a+$"),
                  string.char(unpack(b, 1, cut)))
               local ok, err = pcall(data.load_image, path, { size = 5, crop = "random",
                  seed = k })
               if ok then n_ok = n_ok + 1 else
                  n_err = n_err + 1
                  assert.truthy(tostring(err):find(path, 1, true), tostring(err))
               end
            end
         end
         assert.is_true(n_err > 0)
      end)

      it("stop a loader with the file's name", function()
         local root = tmpdir() .. "/badfolder"
         os.execute("mkdir -p '" .. root .. "/a' '" .. root .. "/b'")
         write_file(root .. "/a/good.png", read_file(FOLDER .. "/bird/rgb.png"))
         write_file(root .. "/b/bad.jpg", read_file(FOLDER .. "/cat/rgb.jpg"):sub(1, 300))
         local ds = data.ImageFolder(root, { size = 4 })
         local L = data.DataLoader(ds, { batch_size = 1, shuffle = false })
         local it_ = L:iter()
         local x = it_()
         assert.is_not_nil(x)
         assert_error("^lumen%.data%.DataLoader: '.*/b/bad%.jpg': ", it_)
      end)
   end)
end)

---------------------------------------------------------------------------------------------
-- ImageFolder
---------------------------------------------------------------------------------------------

describe("lumen.data.ImageFolder", function()
   it("finds classes and images, sorted, skipping hidden and non-image files", function()
      local ds = data.ImageFolder(FOLDER, { size = 8 })
      assert.same({ "bird", "cat" }, ds.classes)
      assert.same({ bird = 1, cat = 2 }, ds.class_to_idx)
      local rel = {}
      for i, p in ipairs(ds.paths) do rel[i] = p:sub(#FOLDER + 2) end
      assert.same({ "bird/gray.png", "bird/graya.png", "bird/pal2.png", "bird/palette.png",
         "bird/rgb.png", "bird/rgba.png", "bird/nested/deep.jpg", "cat/bits1.png",
         "cat/cmyk.jpg", "cat/gray.jpg", "cat/gray16.png", "cat/interlaced.png", "cat/prog.jpg",
         "cat/rgb.jpg" }, rel)
      assert.same({ 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2 }, ds.labels:totable())
      assert.same({ 8, 8 }, ds.image_size)
      assert.equal(14, ds:len())
      assert.equal(14, ds:size())            -- Torch7's name: the number of samples
      local s = tostring(ds)
      assert.truthy(s:find("^ImageFolder\n"), s)
      assert.truthy(s:find("root: " .. FOLDER, 1, true), s)
      assert.truthy(s:find("samples: 14", 1, true), s)
      assert.truthy(s:find("classes: 2 (bird, cat)", 1, true), s)
      assert.truthy(s:find("transforms: size 8x8, crop none", 1, true), s)
      local loader = data.DataLoader(ds, { batch_size = 4, workers = 1 })
      assert.equal(4, loader:len())
      assert.truthy(tostring(loader):find("size 8x8, crop none", 1, true))
      H.assert_sizes(ds:read(5), { 6, 8, 3 })
      local x, label = ds:load(9)
      H.assert_sizes(x, { 1, 3, 8, 8 })
      assert.equal(2, label)
   end)

   it("takes the classes it is given, in that order", function()
      local ds = data.ImageFolder(FOLDER .. "/", { classes = { "cat", "bird" }, size = { 3, 4 } })
      assert.same({ cat = 1, bird = 2 }, ds.class_to_idx)
      assert.equal(14, #ds.paths)
      assert.equal(1, ds.labels:totable()[1])
      assert.truthy(ds.paths[1]:find("/cat/bits1.png", 1, true))
      local only = data.ImageFolder(FOLDER, { classes = { "cat" }, extensions = { "png" } })
      assert.equal(3, #only.paths)
   end)

   it("rejects bad folders and options", function()
      local function bad(pattern, root, o)
         assert_error("^lumen%.data%.ImageFolder: " .. pattern, data.ImageFolder, root, o)
      end
      bad("cannot open directory '/nonexistent'", "/nonexistent")
      bad("no class folders in", FIX .. "folder/bird/nested")
      bad("cannot open directory '.*/folder/dog'", FOLDER, { classes = { "dog" } })
      local empty = tmpdir() .. "/emptyclass"
      os.execute("mkdir -p '" .. empty .. "/a' '" .. empty .. "/b'")
      write_file(empty .. "/a/x.png", read_file(FOLDER .. "/bird/rgb.png"))
      bad("class folder '.*/b' holds no image files", empty)
      bad("size must be a positive integer or {h, w}", FOLDER, { size = 0 })
      bad("size must be a positive integer or {h, w}", FOLDER, { size = { 2, 3, 4 } })
      bad("crop must be 'none', 'center' or 'random'", FOLDER, { crop = "middle" })
      bad("scale must be {lo, hi} with 0 < lo <= hi <= 1", FOLDER, { scale = { 0, 1 } })
      bad("ratio must be {lo, hi} with 0 < lo <= hi", FOLDER, { ratio = { 2, 1 } })
      bad("resize must be an integer", FOLDER, { resize = -1 })
      bad("unknown option 'sizes'", FOLDER, { sizes = 3 })
      bad("class 'cat' is listed twice", FOLDER, { classes = { "cat", "cat" } })
      bad("root must be a string", 3)
      local ds = data.ImageFolder(FOLDER)
      assert_error("pad and crop apply to tensor data sets", data.DataLoader, ds, { crop = 3 })
      assert_error("sample index must be in 1..14", ds.read, ds, 15)
   end)

   it("loads batches in C that match single decodes, channels-last or NCHW", function()
      local ds = data.ImageFolder(FOLDER, { size = { 6, 5 } })
      local mean, std = data.IMAGENET_MEAN, data.IMAGENET_STD
      for _, fmt in ipairs({ lm.channels_last, lm.contiguous_format }) do
         local L = data.DataLoader(ds, { batch_size = 4, shuffle = false, mean = mean, std = std,
            memory_format = fmt })
         local k = 0
         for x, y, i in L:iter() do
            H.assert_sizes(x, { x:size(1), 3, 6, 5 })
            assert.is_true(x:is_contiguous(fmt))
            local v, yl = nhwc(x), y:totable()
            for s = 1, x:size(1) do
               k = k + 1
               local one, label = ds:load(k, { mean = mean, std = std })
               assert.equal(label, yl[s])
               local ov = nhwc(one)
               for j = 1, #ov do
                  assert.equal(ov[j], v[(s - 1) * #ov + j], "sample " .. k .. " batch " .. i)
               end
            end
         end
         assert.equal(14, k)
      end
   end)

   it("random crops: true crops, deterministic, worker-independent, resumable", function()
      local ds = data.ImageFolder(PROBE, { size = { 6, 8 }, crop = "random",
         scale = { 0.25, 0.25 }, ratio = { 4 / 3, 4 / 3 } })
      assert.same({ "even", "odd" }, ds.classes)
      local function loader(w, seed)
         return data.DataLoader(ds, { batch_size = 3, seed = seed or 9, hflip = true,
            workers = w, prefetch = w })
      end
      local flips = {}
      for e = 1, 3 do
         for x, y in loader(2):iter(e) do
            local v, yl = nhwc(x), y:totable()
            for s = 1, x:size(1) do
               local function at(yy, xx, c)
                  return math.floor(v[(s - 1) * 144 + (yy * 8 + xx) * 3 + c] * 255 + 0.5)
               end
               local k = (at(0, 0, 3) - 10) / 20
               assert.equal(k % 2 == 0 and 1 or 2, yl[s])
               local flip = at(0, 0, 1) > at(0, 7, 1)
               flips[flip] = true
               local x0 = at(0, flip and 7 or 0, 1) / 15
               for yy = 0, 5 do
                  for xx = 0, 7 do
                     assert.equal(15 * (x0 + (flip and 7 - xx or xx)), at(yy, xx, 1))
                     assert.equal(at(0, 0, 2) + 20 * yy, at(yy, xx, 2))
                  end
               end
            end
         end
      end
      assert.is_true(flips[true] and flips[false])
      local one = batches(loader(1), 2)
      assert.is_true(same_batches(one, batches(loader(3), 2)))
      assert.is_false(same_batches(one, batches(loader(1), 3)))
      assert.is_false(same_batches(one, batches(loader(1, 10), 2)))
      local rest = batches(loader(2), 2, 2)
      assert.is_true(same_batches({ one[2] }, rest))
   end)

   it("keeps memory flat over epochs", function()
      local ds = data.ImageFolder(FOLDER, { size = 16, crop = "random" })
      local L = data.DataLoader(ds, { batch_size = 4, hflip = true })
      for x in L:iter(1) do x:sum() end
      local base = live_bytes()
      for e = 2, 12 do
         for x in L:iter(e) do x:sum() end
      end
      local after = live_bytes()
      assert.is_true(math.abs(after - base) <= 0.1 * base,
         string.format("live bytes %d after one epoch, %d after twelve", base, after))
   end)
end)

---------------------------------------------------------------------------------------------
-- the example
---------------------------------------------------------------------------------------------

describe("examples/train_imagefolder.lua", function()
   -- the example's output with its exit status appended (__rc=N)
   local function example(args)
      local p = assert(io.popen("bin/lumen examples/train_imagefolder.lua --data " .. FOLDER ..
                                " " .. args .. " 2>&1; echo __rc=$?"))
      local out = p:read("*a")
      p:close()
      return out
   end

   it("trains resnet50 for a few steps on the fixture folder at 32x32", function()
      local out = example("--val " .. FOLDER .. " --size 32 --batch-size 4 --steps 2 --lr 0.01" ..
                          " --threads 2 --seed 3 --quiet")
      assert.truthy(out:find("__rc=0", 1, true), out)
      assert.truthy(out:find("resnet50 on " .. FOLDER .. " %(14 images, 2 classes%), 32x32"), out)
      local steps = 0
      for loss in out:gmatch("loss (%S+)") do
         steps = steps + 1
         assert.is_true(tonumber(loss) ~= nil and tonumber(loss) == tonumber(loss), out)
      end
      assert.is_true(steps >= 1, out)
      assert.truthy(out:find("validation accuracy"), out)
      assert.truthy(out:find("trained 2 steps"), out)
   end)

   it("trains the other families with --model (a step each at 32x32)", function()
      for _, model in ipairs({ "mobilenet_v3_small", "shufflenet_v2_x0_5", "regnet_y_400mf" }) do
         -- with label smoothing, as torchvision's recipes for these families
         local out = example("--model " .. model .. " --size 32 --batch-size 4 --steps 1" ..
                             " --lr 0.01 --threads 2 --label-smoothing 0.1 --seed 3 --quiet")
         assert.truthy(out:find("__rc=0", 1, true), out)
         assert.truthy(out:find(model .. " on ", 1, true), out)
         assert.truthy(out:find("trained 1 steps?"), out)
      end
      local out = example("--label-smoothing 1.5")
      assert.falsy(out:find("__rc=0", 1, true), out)
      assert.truthy(out:find("--label-smoothing needs a number in [0, 1)", 1, true), out)
   end)
end)
