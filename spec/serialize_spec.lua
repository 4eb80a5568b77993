-- lm.save / lm.load (lua/lumen/serialize.lua): the safetensors format.
--
-- Other writers: spec/fixtures/safetensors/*.safetensors were written by Python (gen.py, a
-- writer that follows the format description, as the reference package lays files out); their
-- values are in python_values.lua. Other readers: `make check-peer` reads lumen's output back
-- with Python (tools/gen_peer_models.py verify). Here: every dtype, memory formats, zero-copy
-- mapping, corrupt files, atomic writes.

local H = require("spec.helpers")
local lm = H.lm
local S = require("lumen.serialize")
local ffi = require("ffi")

local FIX = "spec/fixtures/safetensors/"

local function tmpdir()
   local base = os.tmpname()
   os.remove(base)
   assert(os.execute("mkdir -p '" .. base .. "'"))
   return base
end

local function rmdir(d) os.execute("rm -rf '" .. d .. "'") end

local function read_file(p)
   local f = assert(io.open(p, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

local function write_file(p, s)
   local f = assert(io.open(p, "wb"))
   f:write(s)
   f:close()
end

local function listdir(d)
   local r = {}
   local p = io.popen("ls -A '" .. d .. "'")
   for line in p:lines() do r[#r + 1] = line end
   p:close()
   table.sort(r)
   return r
end

local function u64le(n)
   local b = {}
   for i = 1, 8 do b[i] = string.char(n % 256); n = math.floor(n / 256) end
   return table.concat(b)
end

-- a safetensors file from a header text and a data string
local function st_file(header, data)
   return u64le(#header) .. header .. (data or "")
end

local function load_error(path)
   local ok, err = pcall(S.load, path)
   assert.is_false(ok, "expected lm.load to fail on " .. path)
   err = tostring(err)
   assert.truthy(err:find("lumen.load: ", 1, true), "error should name lumen.load: " .. err)
   return err
end

local function mapped(t) return t._c.storage.deleter ~= nil end

describe("lm.save / lm.load (safetensors)", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() rmdir(dir); collectgarbage() end)

   it("round-trips every dtype, 0-dim and empty tensors, and metadata", function()
      local t = {
         f32 = lm.randn({ 2, 3 }),
         f64 = lm.randn({ 4 }, { dtype = lm.float64 }),
         f16 = lm.tensor({ 0.5, -1.25, 65504, 6e-5 }):to(lm.float16),
         bf16 = lm.tensor({ 1, -2.5, 3e38 }):to(lm.bfloat16),
         i64 = lm.tensor({ 1, -2, 2 ^ 40, -2 ^ 53 }, { dtype = lm.int64 }),
         i32 = lm.tensor({ 7, -8, 2 ^ 31 - 1 }, { dtype = lm.int32 }),
         u8 = lm.tensor({ 0, 1, 255 }, { dtype = lm.uint8 }),
         bool = lm.tensor({ true, false, true }, { dtype = lm.bool }),
         scalar = lm.tensor(3.5),
         empty = lm.zeros({ 0, 3 }),
         ["name with spaces/and \"quotes\""] = lm.ones({ 2 }),
      }
      local path = dir .. "/all.safetensors"
      S.save(t, path, { note = "hello", ["k\"ey"] = "v\nalue" })
      local r, meta = S.load(path)
      for k, v in pairs(t) do
         assert.is_not_nil(r[k], k)
         H.assert_dtype(r[k], v:dtype(), k)
         H.assert_sizes(r[k], v:size(), k)
         assert.is_true(r[k]:equal(v:cpu()), k)   -- lm.load gives CPU tensors
      end
      local n = 0
      for _ in pairs(r) do n = n + 1 end
      assert.are.equal(11, n)
      assert.are.equal("hello", meta.note)
      assert.are.equal("v\nalue", meta["k\"ey"])
   end)

   it("saves an empty table as a valid file", function()
      local path = dir .. "/none.safetensors"
      S.save({}, path)
      local r, meta = S.load(path)
      assert.are.same({}, r)
      assert.are.same({}, meta)
   end)

   it("reads a file written by another writer (Python, every dtype)", function()
      local exp = dofile(FIX .. "python_values.lua").all_dtypes
      local r, meta = S.load(FIX .. "python_all_dtypes.safetensors")
      assert.are.equal("pt", meta.format)
      for name, e in pairs(exp) do
         local t = r[name]
         assert.is_not_nil(t, name)
         H.assert_format_name(t:dtype(), e.dtype, name)
         H.assert_sizes(t, e.size, name)
         local got = H.values(t)
         if t:numel() == 0 then got = {} end
         assert.are.same(e.values, got, name)
      end
   end)

   it("maps aligned tensors without copying and copies unaligned ones", function()
      local r = S.load(FIX .. "python_all_dtypes.safetensors")
      for name, t in pairs(r) do
         assert.is_true(mapped(t), name .. " should be a view of the mapping")
      end
      assert.is_true(r.f32:is_same_storage(r.i64))
      -- lumen's own files are laid out aligned too (larger elements first)
      local path = dir .. "/mixed.safetensors"
      S.save({ a = lm.ones({ 3 }, { dtype = lm.uint8 }), b = lm.ones({ 3 }),
               c = lm.ones({ 3 }, { dtype = lm.float64 }),
               d = lm.ones({ 1 }, { dtype = lm.float16 }) }, path)
      local m = S.load(path)
      for name, t in pairs(m) do assert.is_true(mapped(t), name) end
      -- a file whose data is not aligned to the element size (valid, written by Python)
      local exp = dofile(FIX .. "python_values.lua").unaligned
      local u = S.load(FIX .. "python_unaligned.safetensors")
      assert.is_true(mapped(u.a_u8))
      assert.is_false(mapped(u.b_f32))
      assert.is_false(mapped(u.c_f64))
      for name, e in pairs(exp) do assert.are.same(e.values, H.values(u[name]), name) end
   end)

   it("loaded tensors are copy-on-write: writing them never changes the file", function()
      local path = dir .. "/cow.safetensors"
      S.save({ x = lm.arange(4):to(lm.float32) }, path)
      local before = read_file(path)
      local r = S.load(path)
      assert.is_true(mapped(r.x))
      r.x:fill_(7)
      assert.are.same({ 7, 7, 7, 7 }, r.x:totable())
      assert.are.equal(before, read_file(path))
      assert.are.same({ 0, 1, 2, 3 }, S.load(path).x:totable())
   end)

   it("writes tensors in logical order and restores their memory format", function()
      local x = lm.randn({ 2, 3, 4, 5 })
      local t = {
         cl = x:to(lm.channels_last),
         cl3d = lm.randn({ 2, 3, 2, 4, 5 }):to(lm.channels_last_3d),
         tagged = lm.randn({ 4, 8, 1, 1 }):to(lm.channels_last),   -- ambiguous NC11 with tag
         plain_nc11 = lm.randn({ 4, 8, 1, 1 }),
         nchw = x,
         transposed = x:transpose(3, 4),                          -- a non-dense-order view
         sliced = x:narrow(2, 2, 2),
      }
      local path = dir .. "/formats.safetensors"
      S.save(t, path)
      local r, meta = S.load(path)
      for k, v in pairs(t) do assert.is_true(r[k]:equal(v:cpu()), k) end
      H.assert_layout(r.cl, { 2, 3, 4, 5 }, { 60, 1, 15, 3 }, "cl")
      assert.is_true(r.cl3d:is_contiguous(lm.channels_last_3d))
      assert.is_false(r.cl3d:is_contiguous())
      H.assert_layout(r.tagged, { 4, 8, 1, 1 }, { 8, 1, 8, 8 }, "tagged NC11")
      H.assert_format_name(r.tagged:suggest_memory_format(), lm.channels_last)
      H.assert_layout(r.plain_nc11, { 4, 8, 1, 1 }, { 8, 1, 1, 1 }, "plain NC11")
      assert.is_true(r.nchw:is_contiguous())
      assert.is_true(r.transposed:is_contiguous())
      assert.is_true(r.sliced:is_contiguous())
      local fm = S.json.decode(meta["lumen.memory_formats"])
      assert.are.same({ cl = "channels_last", cl3d = "channels_last_3d", tagged = "channels_last" },
                      fm)
      -- the stored bytes are row-major (NCHW): the same bytes as the contiguous tensor's
      local path2 = dir .. "/nchw.safetensors"
      S.save({ cl = x }, path2)
      local a, b = read_file(path), read_file(path2)
      local function data_of(s, name)
         local n = 0
         for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
         local h = S.json.decode(s:sub(9, 8 + n))
         local o = h[name].data_offsets
         return s:sub(9 + n + o[1], 8 + n + o[2])
      end
      assert.are.equal(data_of(b, "cl"), data_of(a, "cl"))
   end)

   it("lays the header out like the reference writer (aligned, padded, no gaps)", function()
      local path = dir .. "/layout.safetensors"
      S.save({ z = lm.ones({ 3 }, { dtype = lm.uint8 }), a = lm.ones({ 2 }, { dtype = lm.float64 }),
               m = lm.ones({ 5 }), s = lm.tensor(1.5) }, path)
      local s = read_file(path)
      local n = 0
      for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
      assert.are.equal(0, n % 8)
      assert.are.equal(#s, 8 + n + 8 * 2 + 4 * 5 + 4 + 3)
      local h = S.json.decode(s:sub(9, 8 + n))
      assert.are.same({ 0, 16 }, h.a.data_offsets)
      assert.are.same({ 16, 36 }, h.m.data_offsets)
      assert.are.same({ 36, 40 }, h.s.data_offsets)
      assert.are.same({ 40, 43 }, h.z.data_offsets)
      assert.are.equal("F64", h.a.dtype)
      assert.are.equal(0, #h.s.shape)
      assert.truthy(s:sub(9, 8 + n):find('"shape":[]', 1, true))
   end)

   describe("corrupt files give lumen.load errors", function()
      local good_header = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
      local data8 = string.rep("\0", 8)

      local function case(name, content)
         local p = dir .. "/" .. name
         write_file(p, content)
         return load_error(p)
      end

      it("accepts the well-formed base case", function()
         local p = dir .. "/good"
         write_file(p, st_file(good_header, data8))
         assert.are.same({ 0, 0 }, S.load(p).a:totable())
      end)

      it("truncated data", function()
         local err = case("trunc", st_file(good_header, string.rep("\0", 5)))
         assert.truthy(err:find("truncated"))
      end)
      it("a file shorter than the 8-byte header length", function()
         case("tiny", "abc")
         case("empty", "")
      end)
      it("a file of another kind says it is not safetensors, and what it looks like", function()
         local err = case("text", "hello, this is a text file\n")
         assert.truthy(err:find("is not a safetensors file", 1, true), err)
         assert.truthy(err:find('it starts with the text "hello, this is a"', 1, true), err)
         assert.falsy(err:find("header length %d"), err)
         err = case("zip", "PK\3\4" .. string.rep("\0", 40))
         assert.truthy(err:find("zip archive, as PyTorch's torch.save", 1, true), err)
         err = case("pickle", "\128\2}q\0(X\1\0\0\0aq\1" .. string.rep("\0", 20))
         assert.truthy(err:find("Python pickle", 1, true), err)
         err = case("png", "\137PNG\r\n\26\n" .. string.rep("\0", 20))
         assert.truthy(err:find("PNG image", 1, true), err)
         err = case("bin", "\1\2\3\4\5\6\7\8\200\201\202\203")
         assert.truthy(err:find("it starts with the bytes 01 02 03 04", 1, true), err)
      end)
      it("a header length past the end of the file", function()
         local err = case("past", u64le(1000) .. "{}")
         assert.truthy(err:find("past the end"))
      end)
      it("a huge header length", function()
         local err = case("huge", u64le(2 ^ 52) .. "{}")
         assert.truthy(err:find("limit"))
         case("huge2", string.rep("\255", 8) .. "{}")
      end)
      it("overlapping offsets", function()
         local err = case("overlap", st_file(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
            '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data8))
         assert.truthy(err:find("overlap"))
      end)
      it("a gap or unused bytes in the data", function()
         case("gap", st_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data8))
         case("tail", st_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', data8))
      end)
      it("offsets that disagree with shape and dtype", function()
         case("span", st_file('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', data8))
         case("rev", st_file('{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', data8))
      end)
      it("a bad dtype", function()
         local err = case("dtype", st_file(
            '{"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}}', data8))
         assert.truthy(err:find("F8_E4M3", 1, true))
         case("nodtype", st_file('{"a":{"shape":[2],"data_offsets":[0,8]}}', data8))
      end)
      it("bad JSON", function()
         local err = case("json", st_file('{"a":{"dtype":"F32",', data8))
         assert.truthy(err:find("JSON"))
         case("array", st_file('[1,2,3]   ', data8))
         case("number", st_file('42', data8))
      end)
      it("bad shapes and offsets", function()
         case("negshape", st_file('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', data8))
         case("fracshape", st_file('{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}}',
                                   data8))
         case("objshape", st_file('{"a":{"dtype":"F32","shape":{"x":2},"data_offsets":[0,8]}}',
                                  data8))
         case("strshape", st_file('{"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}}', data8))
         case("nooffs", st_file('{"a":{"dtype":"F32","shape":[2]}}', data8))
         case("3offs", st_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}', data8))
         case("9dims", st_file('{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],' ..
            '"data_offsets":[0,1]}}', "\0"))
         case("bigshape", st_file('{"a":{"dtype":"F32","shape":[4294967296,4294967296],' ..
            '"data_offsets":[0,8]}}', data8))
      end)
      it("bad metadata", function()
         case("meta", st_file('{"__metadata__":{"a":1}}', ""))
         case("meta2", st_file('{"__metadata__":"x"}', ""))
      end)
      it("a missing file or a directory", function()
         load_error(dir .. "/does-not-exist")
         load_error(dir)
      end)
   end)

   describe("atomic writes", function()
      it("a failing save leaves the previous file intact and no temporary behind", function()
         local path = dir .. "/model.safetensors"
         S.save({ w = lm.ones({ 4 }) }, path)
         local before = read_file(path)
         local bad = { w = lm.zeros({ 4 }), oops = "not a tensor" }
         local ok, err = pcall(S.save, bad, path)
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.save: ", 1, true))
         local freed = lm.zeros({ 4 })
         freed:free()
         assert.is_false(pcall(S.save, { w = lm.zeros({ 4 }), f = freed }, path))
         assert.are.equal(before, read_file(path))
         assert.are.same({ "model.safetensors" }, listdir(dir))
      end)

      it("a failure after the data was written (rename) removes the temporary", function()
         local target = dir .. "/target"
         assert(os.execute("mkdir -p '" .. target .. "/inner'"))  -- a non-empty directory
         local ok, err = pcall(S.save, { w = lm.ones({ 1000 }) }, target)
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.save: ", 1, true))
         assert.are.same({ "target" }, listdir(dir))
         assert.are.same({ "inner" }, listdir(target))
      end)

      it("a missing folder is an error", function()
         local ok, err = pcall(S.save, { w = lm.ones({ 1 }) }, dir .. "/no/such/dir/f.safetensors")
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.save: ", 1, true))
      end)

      it("replaces the file as a whole: tensors mapped from the old file stay valid", function()
         local path = dir .. "/w.safetensors"
         S.save({ w = lm.full({ 1000 }, 1) }, path)
         local old = S.load(path)
         assert.is_true(mapped(old.w))
         S.save({ w = lm.full({ 1000 }, 2) }, path)
         assert.are.equal(1000, old.w:sum():item())
         assert.are.equal(2000, S.load(path).w:sum():item())
         assert.are.same({ "w.safetensors" }, listdir(dir))
      end)
   end)

   it("rejects bad arguments with lumen.save errors", function()
      local path = dir .. "/x"
      for _, args in ipairs({
         { "not a table", path }, { lm.ones({ 1 }), path }, { {}, nil }, { {}, 42 },
         { { [1] = lm.ones({ 1 }) }, path }, { { __metadata__ = lm.ones({ 1 }) }, path },
         { { a = lm.ones({ 1 }) }, path, "meta" }, { { a = lm.ones({ 1 }) }, path, { k = 1 } },
      }) do
         local ok, err = pcall(S.save, args[1], args[2], args[3])
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.save: ", 1, true), tostring(err))
      end
      local ok, err = pcall(S.load, 42)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("lumen.load: ", 1, true))
   end)

   it("is what lm.save / lm.load call", function()
      assert.are.equal(S.save, lm.save)
      assert.are.equal(S.load, lm.load)
   end)

   it("keeps ffi scratch safe across many loads (no leaked mappings)", function()
      local path = dir .. "/many.safetensors"
      S.save({ a = lm.ones({ 16 }), b = lm.ones({ 3 }, { dtype = lm.uint8 }) }, path)
      for _ = 1, 200 do
         local r = S.load(path)
         assert.are.equal(16, r.a:sum():item())
      end
      collectgarbage()
      assert.is_true(ffi.abi("le"))
   end)
end)
