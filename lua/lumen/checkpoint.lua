-- lumen.checkpoint -- lm.save_checkpoint / lm.load_checkpoint: a model's state, an optimizer's
-- state and any user fields (epoch, best accuracy, a config table, extra tensors) in ONE
-- safetensors file, written atomically (lumen.serialize: temporary file, fsync, rename), so an
-- interrupted save never leaves a half-written checkpoint behind.
--
--    lm.save_checkpoint("ckpt.safetensors", {model = net, optimizer = opt, epoch = 3,
--                                            best = 0.91, config = {lr = 0.1, arch = "resnet50"}})
--    local ck = lm.load_checkpoint("ckpt.safetensors", {model = net, optimizer = opt})
--    print(ck.epoch, ck.best, ck.config.arch)
--
-- File layout (an ordinary safetensors file: any reader sees the tensors):
--   model.<key>                  the model's state_dict tensors (torchvision key names), with
--                                their memory formats recorded (lumen.serialize)
--   optimizer.<param id>.<name>  the optimizer's per-parameter state tensors (momentum buffers)
--   user.<n>                     tensors found in the user fields
--   __metadata__["lumen.checkpoint"]  JSON: {version = 1, user = <fields>, optimizer = <groups and
--                                non-tensor state>, rng = <lm.get_rng_state()>}; Lua values are
--                                encoded losslessly (numbers with 17 digits, inf / nan, number
--                                keys, nested tables); a tensor is a reference to its entry above.
--   __metadata__["lumen.checkpoint.crc32"]  CRC-32 of the tensors and of the JSON above: a file
--                                damaged after it was written fails to load (see checksum below).

local serialize = require("lumen.serialize")
local T = require("lumen.tensor")
local dtypes = require("lumen.dtype")

local type, pairs, ipairs, tostring, error, getmetatable, rawget = type, pairs, ipairs,
   tostring, error, getmetatable, rawget

local M = {}

local json = serialize.json
local util = require("lumen.util")
local LOAD_OPTS = util.option_set("model", "optimizer", "strict", "rng")
local VERSION = 1

local function fail(fname, msg, ...)
   error(string.format("lumen.%s: " .. msg, fname, ...), T.user_level())
end

local function plain_table(x) return type(x) == "table" and getmetatable(x) == nil end

---------------------------------------------------------------------------------------------
-- the checksum: CRC-32 (zlib's) of every tensor's name and elements (logical order, sorted by
-- name) and of the lumen.checkpoint metadata, stored as __metadata__["lumen.checkpoint.crc32"]
-- and checked by load_checkpoint, so a damaged file (bytes overwritten in the tensor data, which
-- the safetensors header cannot show) is an error, never silent garbage. Files without it (older
-- lumen) load unchecked.
---------------------------------------------------------------------------------------------
local ffi = require("ffi")
local C = require("lumen.C")
pcall(ffi.cdef, "unsigned long crc32(unsigned long crc, const unsigned char *buf, " ..
                "unsigned int len);")
local zlib
local function crc32_lib()
   if zlib == nil then
      zlib = false
      for _, name in ipairs({ "libz.so.1", "z" }) do
         local ok, l = pcall(ffi.load, name)
         if ok then zlib = l; break end
      end
   end
   return zlib or nil
end

local function crc_bytes(z, crc, ptr, n)
   ptr = ffi.cast("const unsigned char *", ptr)
   local CHUNK = 2 ^ 30
   while n > 0 do
      local k = math.min(n, CHUNK)
      crc = z.crc32(crc, ptr, k)
      ptr, n = ptr + k, n - k
   end
   return crc
end

-- checksum(tensors, text) -> 8 hex digits, or nil when zlib cannot be loaded
local function checksum(tensors, text)
   local z = crc32_lib()
   if not z then return nil end
   local names = {}
   for k in pairs(tensors) do names[#names + 1] = k end
   table.sort(names)
   local crc = z.crc32(0, nil, 0)
   for _, name in ipairs(names) do
      local t = tensors[name]
      crc = crc_bytes(z, crc, name, #name)
      local c = T.cdata(t)
      if c.device ~= C.LM_CPU then t = t:to("cpu") end
      t = t:contiguous()
      c = T.cdata(t)
      local n = tonumber(c.numel) * C.lm_dtype_size(c.dtype)
      if n > 0 then
         T.barrier(c)
         crc = crc_bytes(z, crc, C.lm_tensor_data(c), n)
      end
   end
   crc = crc_bytes(z, crc, text, #text)
   return string.format("%08x", tonumber(crc))
end
M._checksum = checksum

local function is_module(x)
   if type(x) ~= "table" then return false end
   local mt = getmetatable(x)
   return type(mt) == "table" and rawget(mt, "__is_module_class") == true
end

local function is_optimizer(x)
   return type(x) == "table" and type(x.state_dict) == "function" and
          type(x.load_state_dict) == "function" and type(rawget(x, "param_groups")) == "table"
end

---------------------------------------------------------------------------------------------
-- lossless encoding of Lua values as JSON
---------------------------------------------------------------------------------------------

-- number -> JSON text (17 significant digits round-trip a double; inf / nan get markers)
local function enc_number(x)
   if x ~= x then return '{"$n":"nan"}' end
   if x == math.huge then return '{"$n":"inf"}' end
   if x == -math.huge then return '{"$n":"-inf"}' end
   if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return string.format("%.0f", x) end
   return string.format("%.17g", x)
end

-- encode(v, ctx, where): ctx.tensors collects tensors (name -> tensor); ctx.prefix names them
local function encode(v, ctx, where, seen)
   local tv = type(v)
   if tv == "string" then return json.encode(v) end
   if tv == "boolean" then return v and "true" or "false" end
   if tv == "number" then return enc_number(v) end
   if T.is_tensor(v) then
      if T.cdata(v) == nil then fail(ctx.fname, "%s is a freed tensor", where) end
      local name = ctx.names[v]
      if not name then
         ctx.count = ctx.count + 1
         name = ctx.prefix .. ctx.count
         ctx.names[v] = name
         ctx.tensors[name] = v
      end
      return '{"$tensor":' .. json.encode(name) .. "}"
   end
   if dtypes.is_dtype(v) then return '{"$dtype":' .. json.encode(v.name) .. "}" end
   if dtypes.is_memory_format(v) then return '{"$format":' .. json.encode(v.name) .. "}" end
   -- a Size (t:size(), t.shape) is a plain array with a metatable: saved as the array it is
   if plain_table(v) or T.is_sizes(v) then
      seen = seen or {}
      if seen[v] then fail(ctx.fname, "%s contains a cycle", where) end
      seen[v] = true
      local keys = {}
      for k in pairs(v) do
         if type(k) ~= "string" and type(k) ~= "number" then
            fail(ctx.fname, "%s has a key of type %s (only strings and numbers are saved)", where,
                 type(k))
         end
         keys[#keys + 1] = k
      end
      table.sort(keys, function(a, b)
         if type(a) ~= type(b) then return type(a) == "number" end
         return a < b
      end)
      local parts = {}
      for i, k in ipairs(keys) do
         parts[i] = "[" .. encode(k, ctx, where, seen) .. "," ..
            encode(v[k], ctx, where .. "." .. tostring(k), seen) .. "]"
      end
      seen[v] = nil
      return '{"$kv":[' .. table.concat(parts, ",") .. "]}"
   end
   fail(ctx.fname, "%s has a value of type %s, which a checkpoint cannot hold (numbers, " ..
        "strings, booleans, tensors, dtypes and tables of them)", where,
        is_module(v) and "Module" or type(v))
end

-- the inverse of encode. The metadata comes from a file, so every marker's shape is checked: a
-- malformed one is a "malformed lumen.checkpoint metadata" error, never a Lua error from deep
-- inside (indexing a number, a NaN table key) or a silently wrong value.
local function decode(v, tensors, fname, path)
   local function bad(what)
      fail(fname, "'%s': malformed lumen.checkpoint metadata (%s)", path, what)
   end
   if type(v) ~= "table" then
      if v == json.null then return nil end
      return v
   end
   if v["$n"] ~= nil then
      local s = v["$n"]
      if s == "nan" then return 0 / 0 elseif s == "inf" then return math.huge
      elseif s == "-inf" then return -math.huge end
      bad("bad number marker " .. tostring(s))
   end
   if v["$tensor"] ~= nil then
      local t = type(v["$tensor"]) == "string" and tensors[v["$tensor"]] or nil
      if t == nil then
         fail(fname, "'%s': the checkpoint refers to a missing tensor '%s'", path,
              tostring(v["$tensor"]))
      end
      return t
   end
   if v["$dtype"] ~= nil then
      local ok, d = pcall(dtypes.lookup, v["$dtype"])
      if not ok or d == nil then bad("unknown dtype " .. tostring(v["$dtype"])) end
      return d
   end
   if v["$format"] ~= nil then
      local ok, f = pcall(dtypes.lookup_format, v["$format"])
      if not ok or f == nil then bad("unknown memory format " .. tostring(v["$format"])) end
      return f
   end
   if v["$kv"] ~= nil then
      local kvs = v["$kv"]
      if type(kvs) ~= "table" then bad("$kv is not a list") end
      local r = {}
      for _, kv in ipairs(kvs) do
         if type(kv) ~= "table" then bad("a $kv entry is not a pair") end
         local k = decode(kv[1], tensors, fname, path)
         if k ~= nil then
            if type(k) ~= "string" and type(k) ~= "number" then
               bad("a key is not a string or a number")
            end
            if k ~= k then bad("a key is NaN") end
            r[k] = decode(kv[2], tensors, fname, path)
         end
      end
      return r
   end
   bad("an object without a lumen marker")
end

---------------------------------------------------------------------------------------------
-- save / load
---------------------------------------------------------------------------------------------

--- lm.save_checkpoint(path, state): state.model is a Module (or a state_dict table),
--- state.optimizer an optimizer (or its state_dict), every other field is a user field.
function M.save_checkpoint(path, state)
   local fname = "save_checkpoint"
   if type(path) ~= "string" or path == "" then
      fail(fname, "expected a path string, got %s", type(path))
   end
   if not plain_table(state) then
      fail(fname, "expected a table {model = ..., optimizer = ..., <fields>}, got %s",
           T.typename(state))
   end
   local tensors = {}
   -- the model
   local model = state.model
   if model ~= nil then
      local sd
      if is_module(model) then sd = model:state_dict()
      elseif plain_table(model) then sd = model
      else
         fail(fname, "model must be a Module or a state_dict table, got %s", T.typename(model))
      end
      for k, t in pairs(sd) do
         if type(k) ~= "string" then fail(fname, "model state keys must be strings") end
         if not T.is_tensor(t) then fail(fname, "model state '%s' is not a tensor", k) end
         tensors["model." .. k] = t
      end
   end
   -- the optimizer: per-parameter tensors become entries, the rest goes into the JSON
   local opt_json = "null"
   local opt = state.optimizer
   if opt ~= nil then
      local osd
      if is_optimizer(opt) then osd = opt:state_dict()
      elseif plain_table(opt) and plain_table(opt.param_groups) then osd = opt
      else
         fail(fname, "optimizer must be an optimizer or its state_dict, got %s", T.typename(opt))
      end
      local ctx = { fname = fname, tensors = {}, names = {}, count = 0, prefix = "" }
      local state_parts = {}
      local ids = {}
      for id in pairs(osd.state or {}) do ids[#ids + 1] = id end
      table.sort(ids, function(a, b) return tostring(a) < tostring(b) end)
      for _, id in ipairs(ids) do
         local st = osd.state[id]
         local fields = {}
         for k, v in pairs(st) do
            if T.is_tensor(v) then
               local name = "optimizer." .. tostring(id) .. "." .. tostring(k)
               tensors[name] = v
               fields[#fields + 1] = "[" .. json.encode(k) .. ',{"$tensor":' ..
                  json.encode(name) .. "}]"
            else
               ctx.prefix = "optimizer." .. tostring(id) .. "." .. tostring(k) .. "."
               fields[#fields + 1] = "[" .. encode(k, ctx, "optimizer.state") .. "," ..
                  encode(v, ctx, "optimizer.state." .. tostring(id) .. "." .. tostring(k)) .. "]"
            end
         end
         state_parts[#state_parts + 1] = "[" .. encode(id, ctx, "optimizer.state") ..
            ',{"$kv":[' .. table.concat(fields, ",") .. "]}]"
      end
      ctx.prefix = "optimizer.groups."
      local groups = encode(osd.param_groups, ctx, "optimizer.param_groups")
      for k, v in pairs(ctx.tensors) do tensors[k] = v end
      opt_json = '{"state":{"$kv":[' .. table.concat(state_parts, ",") .. ']},"param_groups":' ..
         groups .. "}"
   end
   -- user fields
   local ctx = { fname = fname, tensors = {}, names = {}, count = 0, prefix = "user." }
   local user = {}
   for k, v in pairs(state) do
      if k ~= "model" and k ~= "optimizer" then user[k] = v end
   end
   local user_json = encode(user, ctx, "checkpoint")
   for k, v in pairs(ctx.tensors) do tensors[k] = v end
   -- the random generator's state, restored on request (load_checkpoint(path, {rng = true}))
   local rng_json = "null"
   local lm = package.loaded["lumen"]
   if type(lm) == "table" and type(rawget(lm, "get_rng_state")) == "function" then
      local st = lm.get_rng_state()
      rng_json = encode(st, { fname = fname, tensors = {}, names = {}, count = 0, prefix = "" },
                        "rng")
   end
   local meta = {
      ["lumen.checkpoint"] = '{"version":' .. VERSION .. ',"user":' .. user_json ..
         ',"optimizer":' .. opt_json .. ',"has_model":' .. tostring(model ~= nil) ..
         ',"rng":' .. rng_json .. "}",
   }
   meta["lumen.checkpoint.crc32"] = checksum(tensors, meta["lumen.checkpoint"])
   local ok, err = pcall(serialize.save, tensors, path, meta)
   if not ok then
      err = tostring(err):gsub("^.-lumen%.save: ", "")
      fail(fname, "%s", err)
   end
end

--- lm.load_checkpoint(path, {model = m, optimizer = o, strict = true, rng = false}) -> the user
--- fields, plus .model (the model's state table), .optimizer (the optimizer's state_dict, or
--- nil) and .rng_state (the random generator's state at save time, or nil).
--- When opts.model / opts.optimizer are given, the states are loaded into them; rng = true also
--- restores the random generator (lm.set_rng_state), so dropout and shuffling continue exactly.
function M.load_checkpoint(path, opts)
   local fname = "load_checkpoint"
   if type(path) ~= "string" then fail(fname, "expected a path string, got %s", type(path)) end
   if opts ~= nil and not plain_table(opts) then
      fail(fname, "options must be a table {model =, optimizer =, strict =}, got %s",
           T.typename(opts))
   end
   opts = opts or {}
   local bad = util.unknown_option(opts, LOAD_OPTS)
   if bad ~= nil then fail(fname, "%s", util.unknown_option_msg(bad)) end
   local ok, tensors, meta = pcall(serialize.load, path)
   if not ok then
      local err = tostring(tensors):gsub("^.-lumen%.load: ", "")
      fail(fname, "%s", err)
   end
   local text = meta["lumen.checkpoint"]
   if text == nil then
      fail(fname, "'%s' is not a lumen checkpoint (no lumen.checkpoint metadata; use lm.load " ..
           "for plain safetensors files)", path)
   end
   local want = meta["lumen.checkpoint.crc32"]
   if want ~= nil then
      local got = checksum(tensors, text)
      if got ~= nil and got ~= want then
         fail(fname, "'%s' is damaged: its checksum (CRC-32 %s) is not the one it was saved " ..
              "with (%s); bytes of the file were changed after it was written", path, got,
              tostring(want))
      end
   end
   local info = json.decode(text)
   if type(info) ~= "table" or info.version ~= VERSION then
      fail(fname, "'%s': unsupported checkpoint version %s", path,
           tostring(type(info) == "table" and info.version or "?"))
   end
   local user = decode(info.user, tensors, fname, path) or {}
   if type(user) ~= "table" then fail(fname, "'%s': malformed lumen.checkpoint metadata", path) end
   local sd = {}
   for k, t in pairs(tensors) do
      local key = k:match("^model%.(.+)$")
      if key then sd[key] = t end
   end
   local osd
   -- json.null is a table with dkjson (lightuserdata with cjson): a checkpoint without an
   -- optimizer stores null there, which must not read as an empty optimizer state
   if type(info.optimizer) == "table" and info.optimizer ~= json.null then
      osd = {
         state = decode(info.optimizer.state, tensors, fname, path) or {},
         param_groups = decode(info.optimizer.param_groups, tensors, fname, path) or {},
      }
   end
   if opts.model ~= nil then
      if not is_module(opts.model) then
         fail(fname, "opts.model must be a Module, got %s", T.typename(opts.model))
      end
      if not info.has_model then fail(fname, "'%s' holds no model state", path) end
      local strict = true
      if opts.strict ~= nil then strict = opts.strict and true or false end
      opts.model:load_state_dict(sd, { strict = strict })
   end
   if opts.optimizer ~= nil then
      if not is_optimizer(opts.optimizer) then
         fail(fname, "opts.optimizer must be an optimizer, got %s", T.typename(opts.optimizer))
      end
      if osd == nil then fail(fname, "'%s' holds no optimizer state", path) end
      opts.optimizer:load_state_dict(osd)
   end
   local rng = type(info.rng) == "table" and info.rng ~= json.null and
      decode(info.rng, tensors, fname, path) or nil
   if opts.rng then
      if rng == nil then fail(fname, "'%s' holds no random generator state", path) end
      require("lumen").set_rng_state(rng)
   end
   user.model = info.has_model and sd or nil
   user.optimizer = osd
   user.rng_state = rng
   return user
end

-- lumen's init may call install(lm): the two functions join the namespace
function M.install(lm)
   lm.save_checkpoint = M.save_checkpoint
   lm.load_checkpoint = M.load_checkpoint
end

return M
