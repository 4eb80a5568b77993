-- lumen.serialize -- lm.save / lm.load in the safetensors format.
--
-- File layout (the format other safetensors readers and writers use):
--   8 bytes   little-endian u64 N, the header length
--   N bytes   JSON: { name = {dtype = "F32", shape = {..}, data_offsets = {begin, end}}, ...,
--                     __metadata__ = {string = string} }  (padded with spaces to 8 bytes)
--   the data  every tensor's elements in row-major (logical) order, back to back
-- lumen writes tensors in logical order, so any reader gets the right values, and records each
-- non-contiguous tensor's memory format in __metadata__["lumen.memory_formats"] (a JSON object
-- name -> "channels_last"); lm.load restores those formats.
--
-- Loading maps the file (no read of the data): contiguous tensors whose data is aligned are views
-- of the mapping, with no copy. Every number in the header is checked against the file size and
-- the other entries before any tensor is made, so a truncated, corrupt or hostile file gives an
-- error, never a read past the end.
-- Saving goes to a temporary file that is fsync'd and renamed over the target: a crash mid-write
-- leaves the previous file intact.

local ffi = require("ffi")
local C = require("lumen.C")

local M = {}

local MAX_HEADER = 100 * 1024 * 1024 -- as the reference implementation

local json
do
   local ok, cjson = pcall(require, "cjson.safe")
   if ok then
      json = { encode = cjson.encode, decode = cjson.decode }
   else
      local ok2, dk = pcall(require, "dkjson")
      if not ok2 then error("lumen.serialize: needs lua-cjson or lua-dkjson (apt-get install lua-cjson)") end
      json = {
         encode = function(v) return dk.encode(v) end,
         decode = function(s)
            local v, _, err = dk.decode(s, 1, nil)
            if err then return nil, err end
            return v
         end,
      }
   end
end
M.json = json

-- safetensors dtype code <-> lm_dtype id
local code_of = { [0] = "F32", [1] = "F64", [2] = "F16", [3] = "BF16", [4] = "I64", [5] = "I32",
   [6] = "U8", [7] = "BOOL" }
local id_of = {}
for id, code in pairs(code_of) do id_of[code] = id end

local function fail(fname, msg, ...)
   error(string.format("lumen.%s: " .. msg, fname, ...), 3)
end

local function cerr(fname)
   error("lumen." .. fname .. ": " .. ffi.string(C.lm_last_error()), 3)
end

local Tensor -- lumen.tensor, required lazily (it requires this module's siblings)
local function T()
   if not Tensor then Tensor = require("lumen.tensor") end
   return Tensor
end

local function u64le(n)
   local b = {}
   for i = 1, 8 do
      b[i] = string.char(n % 256)
      n = math.floor(n / 256)
   end
   return table.concat(b)
end

--- lm.save(tensors, path, metadata): tensors is a table name -> tensor; metadata an optional
--- table of string -> string.
function M.save(tensors, path, metadata)
   if type(tensors) ~= "table" then fail("save", "expected a table of tensors, got %s", type(tensors)) end
   if type(path) ~= "string" then fail("save", "expected a path string, got %s", type(path)) end
   if metadata ~= nil and type(metadata) ~= "table" then
      fail("save", "metadata must be a table of strings, got %s", type(metadata))
   end
   local names = {}
   for name, t in pairs(tensors) do
      if type(name) ~= "string" then fail("save", "tensor names must be strings, got %s", type(name)) end
      if name == "__metadata__" then fail("save", "'__metadata__' is reserved") end
      if not T().is_tensor(t) then fail("save", "'%s' is not a tensor", name) end
      names[#names + 1] = name
   end
   table.sort(names)
   local header, formats, list = {}, {}, {}
   local nformats = 0
   local offset = 0
   for i, name in ipairs(names) do
      local t = tensors[name]
      local c = t._c
      local nbytes = tonumber(c.numel) * C.lm_dtype_size(c.dtype)
      local shape = {}
      for d = 0, c.ndim - 1 do shape[d + 1] = tonumber(c.sizes[d]) end
      header[name] = { dtype = code_of[c.dtype], shape = shape, data_offsets = { offset, offset + nbytes } }
      offset = offset + nbytes
      local fmt = C.lm_suggest_memory_format(c, 0)
      if fmt ~= 0 and C.lm_is_contiguous(c, fmt) ~= 0 then
         formats[name] = fmt == 1 and "channels_last" or "channels_last_3d"
         nformats = nformats + 1
      end
      list[i] = c
   end
   local meta = {}
   for k, v in pairs(metadata or {}) do
      if type(k) ~= "string" or type(v) ~= "string" then
         fail("save", "metadata keys and values must be strings")
      end
      meta[k] = v
   end
   if nformats > 0 then meta["lumen.memory_formats"] = json.encode(formats) end
   if next(meta) then header.__metadata__ = meta end
   local text
   if next(header) == nil then text = "{}" else text = json.encode(header) end
   -- shapes of 0-dim tensors encode as {} with cjson; safetensors wants []
   text = text:gsub('"shape":{}', '"shape":[]')
   local pad = (8 - #text % 8) % 8
   text = text .. string.rep(" ", pad)
   local head = u64le(#text) .. text
   local arr = ffi.new("const lm_tensor *[?]", #list + 1)
   for i, c in ipairs(list) do arr[i - 1] = c end
   local tmp = string.format("%s.tmp.%d.%d", path, os.time(), math.random(1, 1e9))
   if C.lm_write_file_atomic(tmp, path, head, #head, #list, arr) ~= 0 then cerr("save") end
   -- keep the tensors alive across the call
   for _, name in ipairs(names) do local _ = tensors[name] end
end

local function is_int(x) return type(x) == "number" and x == math.floor(x) and x >= 0 and x < 2 ^ 53 end

--- lm.load(path) -> table name -> tensor, metadata table
function M.load(path)
   if type(path) ~= "string" then fail("load", "expected a path string, got %s", type(path)) end
   local buf = ffi.new("uint8_t[8]")
   local fsize = ffi.new("int64_t[1]")
   if C.lm_read_file_range(path, 0, 0, buf, fsize) ~= 0 then cerr("load") end
   local file_size = tonumber(fsize[0])
   if file_size < 8 then fail("load", "'%s' is not a safetensors file (only %d bytes)", path, file_size) end
   if C.lm_read_file_range(path, 0, 8, buf, nil) ~= 0 then cerr("load") end
   local n = 0
   for i = 7, 0, -1 do n = n * 256 + buf[i] end
   if n > MAX_HEADER then fail("load", "header length %.0f is larger than the %d-byte limit", n, MAX_HEADER) end
   if n < 2 or 8 + n > file_size then
      fail("load", "header length %.0f is past the end of the file (%d bytes)", n, file_size)
   end
   local hbuf = ffi.new("char[?]", n)
   if C.lm_read_file_range(path, 8, n, hbuf, nil) ~= 0 then cerr("load") end
   local text = ffi.string(hbuf, n)
   local header, err = json.decode(text)
   if type(header) ~= "table" then fail("load", "bad JSON header: %s", tostring(err or "not an object")) end
   local data_start = 8 + n
   local data_len = file_size - data_start
   local meta = header.__metadata__
   if meta ~= nil then
      if type(meta) ~= "table" then fail("load", "__metadata__ must be an object") end
      for k, v in pairs(meta) do
         if type(k) ~= "string" or type(v) ~= "string" then fail("load", "__metadata__ values must be strings") end
      end
   end
   -- validate every entry, then check the ranges tile the data without overlap
   local entries = {}
   for name, e in pairs(header) do
      if name ~= "__metadata__" then
         if type(name) ~= "string" or type(e) ~= "table" then fail("load", "bad header entry") end
         local id = id_of[e.dtype]
         if id == nil then fail("load", "tensor '%s' has unsupported dtype '%s'", name, tostring(e.dtype)) end
         local shape, offs = e.shape, e.data_offsets
         if type(shape) ~= "table" or #shape > 8 then fail("load", "tensor '%s' has a bad shape", name) end
         local numel = 1
         for i = 1, #shape do
            if not is_int(shape[i]) then fail("load", "tensor '%s' has a bad shape", name) end
            numel = numel * shape[i]
         end
         if type(offs) ~= "table" or #offs ~= 2 or not is_int(offs[1]) or not is_int(offs[2]) or offs[2] < offs[1] then
            fail("load", "tensor '%s' has bad data_offsets", name)
         end
         local esize = C.lm_dtype_size(id)
         if offs[2] - offs[1] ~= numel * esize then
            fail("load", "tensor '%s': data_offsets span %.0f bytes but shape and dtype need %.0f",
               name, offs[2] - offs[1], numel * esize)
         end
         if offs[2] > data_len then
            fail("load", "tensor '%s': data_offsets end %.0f is past the end of the data (%d bytes); the file is truncated",
               name, offs[2], data_len)
         end
         entries[#entries + 1] = { name = name, id = id, shape = shape, b = offs[1], e = offs[2], esize = esize }
      end
   end
   table.sort(entries, function(a, b) if a.b ~= b.b then return a.b < b.b end return a.e < b.e end)
   local pos = 0
   for _, e in ipairs(entries) do
      if e.b ~= pos then
         if e.b < pos then fail("load", "tensor '%s' overlaps another tensor's data", e.name) end
         fail("load", "gap in the data before tensor '%s' (offset %.0f, expected %.0f)", e.name, e.b, pos)
      end
      pos = e.e
   end
   if pos ~= data_len then fail("load", "the data section has %.0f bytes but the tensors use %.0f", data_len, pos) end
   local formats = {}
   if meta and meta["lumen.memory_formats"] then
      local f = json.decode(meta["lumen.memory_formats"])
      if type(f) == "table" then formats = f end
   end
   local out = {}
   if #entries == 0 then return out, meta or {} end
   local sp = ffi.new("lm_storage *[1]")
   if C.lm_map_file(path, sp) ~= 0 then cerr("load") end
   local storage = sp[0]
   local ok, lerr = pcall(function()
      local sizes = ffi.new("int64_t[8]")
      local strides = ffi.new("int64_t[8]")
      local tp = ffi.new("lm_tensor *[1]")
      local lm = require("lumen")
      for _, e in ipairs(entries) do
         local nd = #e.shape
         for i = 1, nd do sizes[i - 1] = e.shape[i] end
         C.lm_compute_strides(nd, sizes, 0, strides)
         local byte_off = data_start + e.b
         local t
         if byte_off % e.esize == 0 then
            if C.lm_tensor_from_storage(storage, byte_off / e.esize, nd, sizes, strides, e.id, tp) ~= 0 then
               cerr("load")
            end
            t = T().wrap(tp[0])
         else -- unaligned data: copy it out
            if C.lm_empty(nd, sizes, e.id, 0, 0, tp) ~= 0 then cerr("load") end
            t = T().wrap(tp[0])
            ffi.copy(C.lm_tensor_data(t._c), ffi.cast("char *", storage.data) + byte_off, e.e - e.b)
         end
         local f = formats[e.name]
         if f == "channels_last" and nd == 4 then
            t = t:to(lm.channels_last)
         elseif f == "channels_last_3d" and nd == 5 then
            t = t:to(lm.channels_last_3d)
         end
         out[e.name] = t
      end
   end)
   C.lm_storage_release(storage) -- the tensors hold their own references
   if not ok then error(lerr, 2) end
   return out, meta or {}
end

return M
