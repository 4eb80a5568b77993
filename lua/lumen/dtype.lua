-- lumen.dtype -- dtype and memory-format constants (objects with __tostring) and name lookup.
--
-- A dtype is a table {name = "float32", id = 0 (lm_dtype), size = 4, is_floating = true}; a
-- memory format is {name = "channels_last", id = 1 (lm_memfmt)}. Both print as their name and are
-- unique objects, so `t:dtype() == lm.float32` works. Options may also name them by string
-- ("float32", "float", "double", "channels_last", ...).

local M = {}

local dtype_mt = {
   __tostring = function(d) return d.name end,
   __metatable = "lumen.dtype",
}
local memfmt_mt = {
   __tostring = function(f) return f.name end,
   __metatable = "lumen.memory_format",
}

local dtype_defs = {
   -- name, id, bytes, floating
   { "float32", 0, 4, true },
   { "float64", 1, 8, true },
   { "float16", 2, 2, true },
   { "bfloat16", 3, 2, true },
   { "int64", 4, 8, false },
   { "int32", 5, 4, false },
   { "uint8", 6, 1, false },
   { "bool", 7, 1, false },
}

local by_id = {}     -- lm_dtype id -> object
local by_name = {}   -- name or alias -> object
M.dtypes = {}        -- array in id order

for _, d in ipairs(dtype_defs) do
   local obj = setmetatable({ name = d[1], id = d[2], size = d[3], is_floating = d[4] }, dtype_mt)
   by_id[d[2]] = obj
   by_name[d[1]] = obj
   M[d[1]] = obj
   M.dtypes[#M.dtypes + 1] = obj
end

local aliases = {
   float = "float32", double = "float64", half = "float16", long = "int64", int = "int32",
   byte = "uint8", boolean = "bool",
}
for alias, name in pairs(aliases) do by_name[alias] = by_name[name] end

local fmt_defs = {
   { "contiguous_format", 0 },
   { "channels_last", 1 },
   { "channels_last_3d", 2 },
   { "preserve_format", 3 },
}
local fmt_by_id, fmt_by_name = {}, {}
for _, f in ipairs(fmt_defs) do
   local obj = setmetatable({ name = f[1], id = f[2] }, memfmt_mt)
   fmt_by_id[f[2]] = obj
   fmt_by_name[f[1]] = obj
   M[f[1]] = obj
end
fmt_by_name.contiguous = fmt_by_name.contiguous_format
fmt_by_name.preserve = fmt_by_name.preserve_format

M.default_dtype = M.float32

function M.is_dtype(x)
   return type(x) == "table" and getmetatable(x) == "lumen.dtype"
end

function M.is_memory_format(x)
   return type(x) == "table" and getmetatable(x) == "lumen.memory_format"
end

function M.from_id(id)
   return by_id[tonumber(id)]
end

function M.format_from_id(id)
   return fmt_by_id[tonumber(id)]
end

-- dtype object or name -> object, or nil plus a message
function M.lookup(x)
   if type(x) == "table" and getmetatable(x) == "lumen.dtype" then return x end
   if type(x) == "string" then
      local d = by_name[x]
      if d then return d end
      return nil, "unknown dtype '" .. x .. "'"
   end
   return nil, "dtype expected, got " .. type(x)
end

-- memory format object or name -> object, or nil plus a message
function M.lookup_format(x)
   if type(x) == "table" and getmetatable(x) == "lumen.memory_format" then return x end
   if type(x) == "string" then
      local f = fmt_by_name[x]
      if f then return f end
      return nil, "unknown memory format '" .. x .. "'"
   end
   return nil, "memory format expected, got " .. type(x)
end

function M.is_name(x)
   return by_name[x] ~= nil
end

function M.is_format_name(x)
   return fmt_by_name[x] ~= nil
end

return M
