-- lumen.serialize -- lm.save / lm.load in the safetensors format.
--
-- File layout (the format every safetensors reader and writer uses):
--   8 bytes   little-endian u64 N, the header length
--   N bytes   JSON: { name = {dtype = "F32", shape = {..}, data_offsets = {begin, end}}, ...,
--                     __metadata__ = {string = string} }  (padded with spaces to 8 bytes)
--   the data  every tensor's elements in row-major (logical) order, back to back, covering the
--             whole rest of the file (offsets are relative to the end of the header)
-- lumen writes tensors in logical order, so any reader gets the right values, and records each
-- tensor that is channels-last (or channels-last-3d) contiguous and not plain contiguous in
-- __metadata__["lumen.memory_formats"] (a JSON object name -> "channels_last"); lm.load restores
-- those formats. Tensors are laid out as the reference writer does (larger elements first, then
-- by name), so every tensor's data is aligned to its element size.
--
-- Loading maps the file (copy-on-write, no read of the data): contiguous tensors whose data is
-- aligned are views of the mapping, with no copy. Every number in the header is checked against
-- the file size and the other entries before any tensor is made, so a truncated, corrupt or
-- hostile file gives a "lumen.load: ..." error, never a read past the end.
-- Saving goes to a temporary file in the same folder that is fsync'd and renamed over the
-- target: a failure (or a crash) mid-write leaves the previous file intact.

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")

local type, pairs, ipairs, tostring, tonumber, error, pcall = type, pairs, ipairs, tostring,
   tonumber, error, pcall
local floor = math.floor

local M = {}

local MAX_HEADER = 100 * 1024 * 1024 -- the reference implementation's limit
-- seconds a dead writer's temporary file must have been left alone before lm.save removes it:
-- a writer in another pid namespace (another container sharing the folder) looks dead from
-- here, but keeps its file's modification time fresh while it writes
local STALE_TMP_AGE = 60
M.STALE_TMP_AGE = STALE_TMP_AGE

local json
do
   local ok, cjson = pcall(require, "cjson.safe")
   if ok then
      json = { encode = cjson.encode, decode = cjson.decode, null = cjson.null }
   else
      local ok2, dk = pcall(require, "dkjson")
      if not ok2 then
         error("lumen.serialize: needs lua-cjson or lua-dkjson (apt-get install lua-cjson)")
      end
      json = {
         encode = function(v) return dk.encode(v) end,
         decode = function(s)
            local v, _, err = dk.decode(s, 1, dk.null)
            if err then return nil, err end
            return v
         end,
         null = dk.null,
      }
   end
end
M.json = json

-- getpid, for unique temporary names (declared once per LuaJIT state)
pcall(ffi.cdef, "int getpid(void);")
local function pid()
   local ok, p = pcall(function() return ffi.C.getpid() end)
   return ok and tonumber(p) or 0
end

-- safetensors dtype code <-> lm_dtype id
local code_of = { [0] = "F32", [1] = "F64", [2] = "F16", [3] = "BF16", [4] = "I64", [5] = "I32",
   [6] = "U8", [7] = "BOOL" }
local id_of = {}
for id, code in pairs(code_of) do id_of[code] = id end
M.dtype_codes = code_of

local function fail(fname, msg, ...)
   local T = require("lumen.tensor")
   error(string.format("lumen.%s: " .. msg, fname, ...), T.user_level())
end

local function cerr(fname)
   fail(fname, "%s", ffi.string(C.lm_last_error()))
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
      n = floor(n / 256)
   end
   return table.concat(b)
end

local function int_str(n) return string.format("%.0f", n) end

-- the JSON header text (deterministic: entries in data order, then __metadata__)
local function header_text(entries, meta)
   local parts = {}
   for i, e in ipairs(entries) do
      local dims = {}
      for d = 1, #e.shape do dims[d] = int_str(e.shape[d]) end
      parts[i] = json.encode(e.name) .. ':{"dtype":"' .. e.code .. '","shape":[' ..
         table.concat(dims, ",") .. '],"data_offsets":[' .. int_str(e.b) .. "," ..
         int_str(e.e) .. "]}"
   end
   local keys = {}
   for k in pairs(meta) do keys[#keys + 1] = k end
   if #keys > 0 then
      table.sort(keys)
      local m = {}
      for i, k in ipairs(keys) do m[i] = json.encode(k) .. ":" .. json.encode(meta[k]) end
      parts[#parts + 1] = '"__metadata__":{' .. table.concat(m, ",") .. "}"
   end
   return "{" .. table.concat(parts, ",") .. "}"
end

--- lm.save(tensors, path, metadata): tensors is a table name -> tensor; metadata an optional
--- table of string -> string (stored in __metadata__).
function M.save(tensors, path, metadata)
   if type(tensors) ~= "table" or T().is_tensor(tensors) then
      fail("save", "expected a table of tensors (name -> tensor), got %s", T().typename(tensors))
   end
   if type(path) ~= "string" or path == "" then
      fail("save", "expected a path string, got %s", type(path) == "string" and "''" or type(path))
   end
   if metadata ~= nil and type(metadata) ~= "table" then
      fail("save", "metadata must be a table of strings, got %s", type(metadata))
   end
   local entries = {}
   for name, t in pairs(tensors) do
      if type(name) ~= "string" then
         fail("save", "tensor names must be strings, got %s %s", type(name), tostring(name))
      end
      if name == "__metadata__" then fail("save", "the name '__metadata__' is reserved") end
      if not T().is_tensor(t) then fail("save", "'%s' is not a tensor (got %s)", name, type(t)) end
      local c = T().cdata(t)
      if c == nil then fail("save", "'%s' is a freed tensor", name) end
      if c.device ~= C.LM_CPU then
         -- the file holds host bytes: another device's tensor is copied to the host first (its
         -- format kept), as safetensors does; lm.load gives CPU tensors back
         if c.device == C.LM_META then
            fail("save", "'%s' is a meta tensor: it has no data", name)
         end
         t = t:to("cpu")
         c = T().cdata(t)
      end
      local esize = C.lm_dtype_size(c.dtype)
      local shape = {}
      for d = 0, c.ndim - 1 do shape[d + 1] = tonumber(c.sizes[d]) end
      entries[#entries + 1] = { name = name, c = c, t = t, esize = esize, shape = shape,
                                code = code_of[c.dtype],
                                nbytes = tonumber(c.numel) * esize }
   end
   -- the reference writer's order: larger elements first, then by name; with the header padded
   -- to 8 bytes every tensor is then aligned to its element size
   table.sort(entries, function(a, b)
      if a.esize ~= b.esize then return a.esize > b.esize end
      return a.name < b.name
   end)
   local formats, nformats = {}, 0
   local offset = 0
   for _, e in ipairs(entries) do
      e.b, e.e = offset, offset + e.nbytes
      offset = e.e
      local c = e.c
      if c.ndim == 4 and C.lm_is_contiguous(c, 1) ~= 0 and C.lm_is_contiguous(c, 0) == 0 then
         formats[e.name] = "channels_last"
      elseif c.ndim == 5 and C.lm_is_contiguous(c, 2) ~= 0 and C.lm_is_contiguous(c, 0) == 0 then
         formats[e.name] = "channels_last_3d"
      elseif (c.ndim == 4 or c.ndim == 5) and C.lm_suggest_memory_format(c, 0) ~= 0
         and C.lm_is_contiguous(c, c.ndim == 4 and 1 or 2) ~= 0 then
         -- an ambiguous shape (N,C,1,1 ...) carrying the channels-last tag strides
         formats[e.name] = c.ndim == 4 and "channels_last" or "channels_last_3d"
      end
      if formats[e.name] then nformats = nformats + 1 end
   end
   local meta = {}
   for k, v in pairs(metadata or {}) do
      if type(k) ~= "string" or type(v) ~= "string" then
         fail("save", "metadata keys and values must be strings (got %s = %s)", type(k), type(v))
      end
      meta[k] = v
   end
   if nformats > 0 then
      local names = {}
      for k in pairs(formats) do names[#names + 1] = k end
      table.sort(names)
      local m = {}
      for i, k in ipairs(names) do m[i] = json.encode(k) .. ":" .. json.encode(formats[k]) end
      meta["lumen.memory_formats"] = "{" .. table.concat(m, ",") .. "}"
   end
   local text = header_text(entries, meta)
   text = text .. string.rep(" ", (8 - #text % 8) % 8)
   local head = u64le(#text) .. text
   local arr = ffi.new("const lm_tensor *[?]", #entries + 1)
   for i, e in ipairs(entries) do arr[i - 1] = e.c end
   -- a save killed mid-write (SIGKILL, power cut) leaves its temporary file behind: remove
   -- those of this target whose writer is gone (never a live process's; see STALE_TMP_AGE)
   if C.lm_remove_stale_tmp(path, STALE_TMP_AGE, nil) ~= 0 then cerr("save") end
   local tmp = string.format("%s.tmp.%d.%d.%d", path, pid(), os.time(), math.random(1, 1e9))
   local st = C.lm_write_file_atomic(tmp, path, head, #head, #entries, arr)
   -- keep the tensors (and so their cdata) alive across the call
   for _, e in ipairs(entries) do e.t = e.t end
   if st ~= 0 then cerr("save") end
end

local function is_int(x) return type(x) == "number" and x == floor(x) and x >= 0 and x < 2 ^ 53 end

-- a JSON array decoded to a Lua table: keys exactly 1..n
local function is_array(x)
   if type(x) ~= "table" then return false end
   local n = #x
   local count = 0
   for k in pairs(x) do
      if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then return false end
      count = count + 1
   end
   return count == n
end

-- Is s valid UTF-8 (the JSON text of a header must be, as for the reference reader)? Checks the
-- structure: lead bytes, continuation bytes, no overlong forms, no surrogates, nothing past
-- U+10FFFF.
local function valid_utf8(s)
   local i, n = 1, #s
   local byte, find = string.byte, string.find
   while i <= n do
      local _, e = find(s, "^[%z\1-\127]+", i) -- a run of ASCII
      if e then i = e + 1 end
      if i > n then break end
      local c = byte(s, i)
      local len
      local lo, hi = 0x80, 0xBF
      if c >= 0xC2 and c <= 0xDF then len = 1
      elseif c == 0xE0 then len, lo = 2, 0xA0
      elseif c == 0xED then len, hi = 2, 0x9F
      elseif c >= 0xE1 and c <= 0xEF then len = 2
      elseif c == 0xF0 then len, lo = 3, 0x90
      elseif c >= 0xF1 and c <= 0xF3 then len = 3
      elseif c == 0xF4 then len, hi = 3, 0x8F
      else return false end
      for k = 1, len do
         local b = byte(s, i + k)
         if not b then return false end
         if k == 1 then
            if b < lo or b > hi then return false end
         elseif b < 0x80 or b > 0xBF then
            return false
         end
      end
      i = i + len + 1
   end
   return true
end
M._valid_utf8 = valid_utf8

-- The first key that appears twice in one JSON object of text, or nil. JSON decoders keep the
-- first or the last of duplicates as they please, so a header with two entries of one name
-- would mean different tensors to different readers: lm.load refuses it. A small scanner over
-- the (already decoded, so well-formed) text: strings are skipped whole, keys compared after
-- their escapes are decoded.
local function duplicate_key(text)
   local find, sub, byte = string.find, string.sub, string.byte
   local stack = {} -- per open bracket: a key set for an object, false for an array
   local depth = 0
   local i, n = 1, #text
   local expect_key = false
   while i <= n do
      local s = find(text, '[{}%[%]",:]', i)
      if not s then break end
      local c = byte(text, s)
      if c == 34 then -- '"': the string runs to the next quote that is not escaped
         local j = s + 1
         while true do
            local q = find(text, '["\\]', j)
            if not q then return nil end -- cannot happen in decoded JSON
            if byte(text, q) == 92 then j = q + 2 else j = q break end
         end
         if expect_key and depth > 0 and stack[depth] then
            local key = sub(text, s + 1, j - 1)
            if find(key, "\\", 1, true) then key = json.decode(sub(text, s, j)) or key end
            local set = stack[depth]
            if set[key] then return key end
            set[key] = true
         end
         expect_key = false
         i = j + 1
      else
         if c == 123 then -- {
            depth = depth + 1
            stack[depth] = {}
            expect_key = true
         elseif c == 91 then -- [
            depth = depth + 1
            stack[depth] = false
            expect_key = false
         elseif c == 125 or c == 93 then -- } ]
            stack[depth] = nil
            depth = depth - 1
            expect_key = false
         elseif c == 44 then -- ,
            expect_key = depth > 0 and stack[depth] and true or false
         else -- :
            expect_key = false
         end
         i = s + 1
      end
   end
   return nil
end
M._duplicate_key = duplicate_key

-- what the first bytes of a file that is not safetensors look like, for lm.load's message
local function sniff(b, n)
   local function starts(...)
      local sig = { ... }
      if n < #sig then return false end
      for i, v in ipairs(sig) do if b[i - 1] ~= v then return false end end
      return true
   end
   if starts(0x50, 0x4B, 0x03, 0x04) then
      return "this is a zip archive, as PyTorch's torch.save writes .pt/.pth files: save the " ..
         "state_dict with safetensors from PyTorch instead (docs/checking_models.md, section 6)"
   end
   if n >= 2 and b[0] == 0x80 and b[1] >= 2 and b[1] <= 5 then
      return "this is a Python pickle (torch.save's legacy format): save the state_dict with " ..
         "safetensors from PyTorch instead (docs/checking_models.md, section 6)"
   end
   if starts(0x1F, 0x8B) then return "this is a gzip file" end
   if starts(0x89, 0x50, 0x4E, 0x47) then return "this is a PNG image" end
   if starts(0xFF, 0xD8, 0xFF) then return "this is a JPEG image" end
   if n >= 3 and b[0] == 0x08 and b[1] >= 3 and b[1] < 0x20 and b[2] == 0x12 then
      return "it may be an ONNX model (lm.onnx.export writes those; lumen does not read them)"
   end
   local text = true
   for i = 0, n - 1 do
      local c = b[i]
      if c < 0x09 or (c > 0x0D and c < 0x20) or c >= 0x7F then text = false; break end
   end
   if text then
      local s = {}
      for i = 0, n - 1 do s[#s + 1] = string.char(b[i]) end
      return ("it starts with the text %q"):format(table.concat(s))
   end
   local hex = {}
   for i = 0, math.min(n, 12) - 1 do hex[#hex + 1] = ("%02x"):format(b[i]) end
   return "it starts with the bytes " .. table.concat(hex, " ")
end

--- lm.load(path) -> table name -> tensor, metadata table (string -> string)
function M.load(path)
   if type(path) ~= "string" then fail("load", "expected a path string, got %s", type(path)) end
   local buf = ffi.new("uint8_t[8]")
   local fsize = ffi.new("int64_t[1]")
   if C.lm_read_file_range(path, 0, 0, buf, fsize) ~= 0 then cerr("load") end
   local file_size = tonumber(fsize[0])
   if file_size < 8 then
      fail("load", "'%s' is not a safetensors file (only %d bytes, no header length)", path,
           file_size)
   end
   -- a safetensors file is an 8-byte header length then a JSON object: '{' (the format says so)
   -- at byte 8 (whitespace, or the '[' of a JSON array, go on to the JSON checks below).
   -- Anything else is another kind of file, named when it is a common one, rather than a header
   -- length read from its first bytes.
   local head = ffi.new("uint8_t[16]")
   local nhead = math.min(16, file_size)
   if C.lm_read_file_range(path, 0, nhead, head, nil) ~= 0 then cerr("load") end
   local b8 = file_size > 8 and head[8] or nil
   local json_start = b8 == 0x7B or b8 == 0x5B or b8 == 0x20 or b8 == 0x0A or b8 == 0x0D or
      b8 == 0x09
   if not json_start then
      fail("load", "'%s' is not a safetensors file (it should start with an 8-byte header " ..
           "length and a JSON header '{'; %s)", path, sniff(head, nhead))
   end
   if C.lm_read_file_range(path, 0, 8, buf, nil) ~= 0 then cerr("load") end
   local n = 0
   for i = 7, 0, -1 do n = n * 256 + buf[i] end
   if n > MAX_HEADER then
      fail("load", "'%s': header length %.0f is larger than the %d-byte limit", path, n, MAX_HEADER)
   end
   if 8 + n > file_size then
      fail("load", "'%s': header length %.0f is past the end of the file (%d bytes)", path, n,
           file_size)
   end
   if n < 2 then
      fail("load", "'%s': header length %.0f is too small for a JSON object", path, n)
   end
   local hbuf = ffi.new("char[?]", n)
   if C.lm_read_file_range(path, 8, n, hbuf, nil) ~= 0 then cerr("load") end
   local text = ffi.string(hbuf, n)
   if not valid_utf8(text) then fail("load", "'%s': the header is not valid UTF-8", path) end
   local header, jerr = json.decode(text)
   if type(header) ~= "table" or not text:find("^%s*{") then
      fail("load", "'%s': bad JSON header (%s)", path,
           tostring(jerr or "not a JSON object"))
   end
   local dup = duplicate_key(text)
   if dup then
      fail("load", "'%s': the header names %s twice (a file that is read differently by " ..
           "different readers)", path, json.encode(dup))
   end
   local data_start = 8 + n
   local data_len = file_size - data_start
   local meta = header.__metadata__
   if meta ~= nil then
      if type(meta) ~= "table" then fail("load", "'%s': __metadata__ must be an object", path) end
      for k, v in pairs(meta) do
         if type(k) ~= "string" or type(v) ~= "string" then
            fail("load", "'%s': __metadata__ values must be strings", path)
         end
      end
   end
   -- validate every entry, then check the ranges tile the data without overlaps or gaps
   local entries = {}
   for name, e in pairs(header) do
      if name ~= "__metadata__" then
         if type(name) ~= "string" or type(e) ~= "table" then
            fail("load", "'%s': bad header entry %s", path, tostring(name))
         end
         local id = id_of[e.dtype]
         if id == nil then
            fail("load", "'%s': tensor '%s' has unsupported dtype '%s' (lumen reads F32 F64 F16 " ..
                 "BF16 I64 I32 U8 BOOL)", path, name, tostring(e.dtype))
         end
         local shape, offs = e.shape, e.data_offsets
         if not is_array(shape) or #shape > 8 then
            fail("load", "'%s': tensor '%s' has a bad shape", path, name)
         end
         local numel = 1
         for i = 1, #shape do
            if not is_int(shape[i]) then
               fail("load", "'%s': tensor '%s' has a bad shape", path, name)
            end
            numel = numel * shape[i]
         end
         if not is_array(offs) or #offs ~= 2 or not is_int(offs[1]) or not is_int(offs[2])
            or offs[2] < offs[1] then
            fail("load", "'%s': tensor '%s' has bad data_offsets", path, name)
         end
         local esize = C.lm_dtype_size(id)
         if offs[2] - offs[1] ~= numel * esize then
            fail("load", "'%s': tensor '%s': data_offsets span %.0f bytes but its shape and " ..
                 "dtype need %.0f", path, name, offs[2] - offs[1], numel * esize)
         end
         if offs[2] > data_len then
            fail("load", "'%s': tensor '%s': data ends at %.0f, past the end of the data " ..
                 "(%d bytes): the file is truncated", path, name, offs[2], data_len)
         end
         -- every product of the sizes must fit (even with a zero size, as in PyTorch): the
         -- strides are computed here, before anything is mapped
         local nd = #shape
         local csizes, cstrides = ffi.new("int64_t[8]"), ffi.new("int64_t[8]")
         for i = 1, nd do csizes[i - 1] = shape[i] end
         if C.lm_compute_strides(nd, csizes, 0, cstrides) ~= 0 then
            fail("load", "'%s': tensor '%s': %s", path, name, ffi.string(C.lm_last_error()))
         end
         entries[#entries + 1] = { name = name, id = id, shape = shape, b = offs[1], e = offs[2],
                                   esize = esize, sizes = csizes, strides = cstrides }
      end
   end
   table.sort(entries, function(a, b)
      if a.b ~= b.b then return a.b < b.b end
      if a.e ~= b.e then return a.e < b.e end
      return a.name < b.name
   end)
   local pos = 0
   for _, e in ipairs(entries) do
      if e.b ~= pos then
         if e.b < pos then
            fail("load", "'%s': tensor '%s' overlaps another tensor's data", path, e.name)
         end
         fail("load", "'%s': gap in the data before tensor '%s' (offset %.0f, expected %.0f)",
              path, e.name, e.b, pos)
      end
      pos = e.e
   end
   if pos ~= data_len then
      fail("load", "'%s': the data section has %.0f bytes but the tensors use %.0f", path,
           data_len, pos)
   end
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
   if tonumber(storage.nbytes) ~= file_size then
      -- the file changed between reading its header and mapping it
      C.lm_storage_release(storage)
      fail("load", "'%s' changed size while it was being loaded (%d bytes, then %.0f)", path,
           file_size, tonumber(storage.nbytes))
   end
   local ok, lerr = pcall(function()
      local tp = ffi.new("lm_tensor *[1]")
      local wrap = T().wrap
      for _, e in ipairs(entries) do
         local nd = #e.shape
         local sizes, strides = e.sizes, e.strides -- checked above
         local byte_off = data_start + e.b
         local t
         tp[0] = nil
         if byte_off % e.esize == 0 then -- a view of the mapping, no copy
            if C.lm_tensor_from_storage(storage, byte_off / e.esize, nd, sizes, strides, e.id,
                                        tp) ~= 0 then
               cerr("load")
            end
            t = wrap(tp[0])
         else -- data not aligned to the element size: copy it out
            if C.lm_empty(nd, sizes, e.id, 0, 0, tp) ~= 0 then cerr("load") end
            t = wrap(tp[0])
            if e.e > e.b then
               ffi.copy(C.lm_tensor_data(t._c), ffi.cast("char *", storage.data) + byte_off,
                        e.e - e.b)
            end
         end
         local f = formats[e.name]
         if f == "channels_last" and nd == 4 then
            t = T().raw.to(t, dtypes.channels_last)
         elseif f == "channels_last_3d" and nd == 5 then
            t = T().raw.to(t, dtypes.channels_last_3d)
         end
         out[e.name] = t
      end
   end)
   C.lm_storage_release(storage) -- the tensors hold their own references
   if not ok then error(lerr, 0) end
   return out, meta or {}
end

return M
