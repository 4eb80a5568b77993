-- Regenerate the seed corpora in fuzz/corpus/ (run from the repository root, after `make`):
--
--    bin/lumen fuzz/gen_seeds.lua
--
-- Small valid files of each kind, written by lumen itself where lumen writes the format
-- (lm.save, lm.save_checkpoint) and by hand where it only reads it (IDX, gzip through the
-- `gzip` command), plus a few corrupt ones (truncated, bad magic, huge dimensions). The images
-- are copied from spec/fixtures/data/ (PIL-made JPEG and PNG files, see make_fixtures.py there)
-- with truncated and bit-flipped variants. Every file is deterministic; the corpora are small
-- (a few KB each) on purpose: the fuzzer grows its own working corpus under build-fuzz/.
local lm = require("lumen")

local OUT = "fuzz/corpus/"

local function write(path, s)
   local f = assert(io.open(path, "wb"))
   f:write(s)
   f:close()
end

local function read(path)
   local f = assert(io.open(path, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

local function reset(dir)
   assert(os.execute("rm -rf '" .. OUT .. dir .. "' && mkdir -p '" .. OUT .. dir .. "'"))
   return OUT .. dir .. "/"
end

local function gzip(s)
   local tmp = os.tmpname()
   write(tmp, s)
   assert(os.execute("gzip -n -9 -c '" .. tmp .. "' > '" .. tmp .. ".gz'"))
   local z = read(tmp .. ".gz")
   os.remove(tmp)
   os.remove(tmp .. ".gz")
   return z
end

local function be32(n)
   return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                      math.floor(n / 256) % 256, n % 256)
end

-- an IDX file: type code (0x08 u8, 0x0C i32, 0x0D f32, 0x0E f64), dims, raw big-endian data
local function idx(code, dims, data)
   local h = { "\0\0", string.char(code, #dims) }
   for _, d in ipairs(dims) do h[#h + 1] = be32(d) end
   return table.concat(h) .. data
end

local function bytes(n, f)
   local t = {}
   for i = 0, n - 1 do t[#t + 1] = string.char(f(i) % 256) end
   return table.concat(t)
end

---------------------------------------------------------------------------------------------
-- IDX (plain and gzip): fuzz/corpus/idx; the payloads alone for idx_gz (which compresses)
---------------------------------------------------------------------------------------------
local idx_seeds = {
   images_u8 = idx(0x08, { 2, 4, 3 }, bytes(24, function(i) return i * 11 end)),
   labels_u8 = idx(0x08, { 5 }, bytes(5, function(i) return i end)),
   i32 = idx(0x0C, { 3 }, be32(1) .. be32(65536) .. "\255\255\255\255"),
   f32 = idx(0x0D, { 2, 1 }, "\63\128\0\0" .. "\127\192\0\1"),        -- 1.0, a NaN with a payload
   f64 = idx(0x0E, { 1 }, "\127\248\0\0\0\0\0\7"),                     -- a NaN with a payload
   zero_dim = idx(0x08, { 0, 28, 28 }, ""),
   rank4 = idx(0x08, { 1, 2, 2, 2 }, bytes(8, function(i) return 255 - i end)),
}
local d = reset("idx")
local g = reset("idx_gz")
for name, s in pairs(idx_seeds) do
   write(d .. name .. ".idx", s)
   write(d .. name .. ".idx.gz", gzip(s))
   write(g .. name, "\0" .. s)                       -- control byte 0: a clean gzip file
end
-- corrupt ones
local good = idx_seeds.images_u8
write(d .. "bad_magic.idx", "\1\2" .. good:sub(3))
write(d .. "bad_type.idx", "\0\0\9\3" .. good:sub(5))
write(d .. "truncated.idx", good:sub(1, #good - 5))
write(d .. "huge_dims.idx", idx(0x08, { 65536, 65536, 65536 }, "xyz"))
write(d .. "huge_zero_dim.idx", idx(0x0E, { 0, 4294967295, 4294967295 }, ""))
local gz = gzip(good)
write(d .. "truncated_trailer.idx.gz", gz:sub(1, #gz - 4))
write(d .. "bad_crc.idx.gz", gz:sub(1, #gz - 8) .. "\0\0\0\0" .. gz:sub(#gz - 3))
write(d .. "truncated_deflate.idx.gz", gz:sub(1, 20))
write(g .. "truncated_trailer", "\4" .. good)
write(g .. "bad_crc", "\8" .. good)
write(g .. "two_members", "\32" .. good)

---------------------------------------------------------------------------------------------
-- safetensors: every dtype, shapes of rank 0..5, channels-last, metadata, an empty file
---------------------------------------------------------------------------------------------
d = reset("safetensors")
local ar = function(n, dt) return lm.arange(n):to(dt) end
lm.save({ f32 = ar(6, lm.float32):view({ 2, 3 }) }, d .. "f32.safetensors")
lm.save({ a = ar(4, lm.float64), b = ar(3, lm.int64), c = ar(5, lm.uint8),
          e = ar(2, lm.int32), f = ar(3, lm.float16), h = ar(3, lm.bfloat16),
          z = ar(4, lm.bool) }, d .. "all_dtypes.safetensors", { note = "seed" })
lm.save({ x = lm.arange(24):view({ 1, 2, 3, 4 }):contiguous(lm.channels_last) },
        d .. "channels_last.safetensors")
lm.save({ v = lm.arange(32):view({ 1, 2, 2, 2, 4 }):contiguous(lm.channels_last_3d),
          s = lm.tensor(3.5), e = lm.empty({ 0, 3 }) }, d .. "cl3d_scalar_empty.safetensors")
lm.save({}, d .. "empty.safetensors")
local f = read(d .. "f32.safetensors")
write(d .. "truncated.safetensors", f:sub(1, #f - 3))
local hdr = '{"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}'
local function stfile(h, data)
   local n = #h
   local len = {}
   for i = 1, 8 do len[i] = string.char(n % 256); n = math.floor(n / 256) end
   return table.concat(len) .. h .. data
end
write(d .. "nan_payload.safetensors", stfile(hdr, "\7\0\0\0\0\0\248\127"))
write(d .. "huge_zero_dim.safetensors", stfile(
   '{"t":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}', ""))
write(d .. "overlap.safetensors", stfile(
   '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},' ..
   '"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', "abc"))
write(d .. "bad_json.safetensors", stfile('{"a":{"dtype":"U8",', ""))

---------------------------------------------------------------------------------------------
-- checkpoints: a model and optimizer like the harness's, user fields of every kind
---------------------------------------------------------------------------------------------
d = reset("checkpoint")
lm.manual_seed(1)
local nn = lm.nn
local m = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))
local o = lm.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
local loss = m:forward(lm.randn({ 2, 2, 2, 2 })):sum()
loss:backward()
o:step()
lm.save_checkpoint(d .. "model_opt.checkpoint", { model = m, optimizer = o, epoch = 3,
   best = 0 / 0, hist = { 1, 2, math.huge }, name = "seed", flag = true,
   dt = lm.float16, fmt = lm.channels_last, extra = lm.arange(3), [1] = "one" })
lm.save_checkpoint(d .. "model_only.checkpoint", { model = m })
lm.save_checkpoint(d .. "user_only.checkpoint", { step = 7, nested = { a = { b = { c = "d" } } } })
f = read(d .. "model_only.checkpoint")
write(d .. "truncated.checkpoint", f:sub(1, #f - 5))
write(d .. "plain.safetensors", read(OUT .. "safetensors/f32.safetensors"))

---------------------------------------------------------------------------------------------
-- lm.jit files: a traced and a frozen graph (conv, batch norm, relu, pool, dropout, linear), one
-- traced from a function (constants, several outputs, in-place ops), a truncated one
---------------------------------------------------------------------------------------------
d = reset("jit")
lm.manual_seed(2)
local jm = nn.Sequential(nn.Conv2d(2, 3, 3, { padding = 1 }), nn.BatchNorm2d(3), nn.ReLU(true),
                         nn.MaxPool2d(2), nn.Dropout(0.2), nn.Flatten(), nn.Linear(3, 2)):eval()
local jg = lm.jit.trace(jm, lm.randn({ 1, 2, 2, 2 }))
jg:save(d .. "traced.safetensors")
lm.jit.freeze(jg):save(d .. "frozen.safetensors")
local jc = lm.tensor({ 1, 2 })
lm.jit.trace(function(a, b)
   local s = a + b * jc
   s:mul_(2)
   return s, lm.cat({ a, s }, 1)
end, { lm.ones({ 2 }), lm.ones({ 2 }) }):save(d .. "function.safetensors")
f = read(d .. "traced.safetensors")
write(d .. "truncated.safetensors", f:sub(1, #f - 7))

---------------------------------------------------------------------------------------------
-- images: the spec fixtures, and corrupt variants
---------------------------------------------------------------------------------------------
d = reset("image")
local FIX = "spec/fixtures/data/"
local images = {
   "folder/bird/rgb.png", "folder/bird/gray.png", "folder/bird/graya.png",
   "folder/bird/rgba.png", "folder/bird/palette.png", "folder/bird/pal2.png",
   "folder/cat/bits1.png", "folder/cat/gray16.png", "folder/cat/interlaced.png",
   "folder/cat/rgb.jpg", "folder/cat/gray.jpg", "folder/cat/cmyk.jpg", "folder/cat/prog.jpg",
   "folder/bird/nested/deep.jpg", "smooth.jpg",
}
for _, p in ipairs(images) do
   local s = read(FIX .. p)
   local name = p:gsub("^folder/", ""):gsub("/", "_")
   write(d .. name, s)
end
local jpg = read(FIX .. "folder/cat/rgb.jpg")
write(d .. "jpg_truncated_half", jpg:sub(1, math.floor(#jpg / 2)))
write(d .. "jpg_no_eoi", jpg:sub(1, #jpg - 2))
local png = read(FIX .. "folder/bird/rgb.png")
write(d .. "png_truncated", png:sub(1, #png - 20))
write(d .. "png_bad_crc", png:sub(1, 40) .. string.char((png:byte(41) + 1) % 256) .. png:sub(42))
-- a PNG header that claims a 60000 x 60000 image
write(d .. "png_huge", png:sub(1, 16) .. be32(60000) .. be32(60000) .. png:sub(25))
print("seeds written to " .. OUT)
