-- lumen.format -- tostring(t): the values in a grid (Torch7 / PyTorch style), then a footer
-- with dtype, sizes and memory format, e.g.
--
--     (1,1,.,.) =
--      0.1000  0.2000
--      ...
--     [lumen.Tensor float32 of size 2x3x4x5, channels_last]
--
-- Tensors with more than options.threshold elements are abbreviated: edgeitems elements at each
-- end of every dim, "..." for the rest. Only the printed elements are read (lm_get, which copies
-- them from the device's memory: a sim or cuda tensor prints its values, and device='sim:0' in
-- the footer). A meta tensor has no values: PyTorch's `tensor(..., device='meta', size=(2, 3))`.

local ffi = require("ffi")
local C = require("lumen.C")
local dtypes = require("lumen.dtype")

local M = {}

M.options = { threshold = 1000, edgeitems = 3, linewidth = 80 }

local idxbuf = ffi.new("int64_t[8]")
local valbuf = ffi.new("double[1]")
-- read through read_double: a NaN with a payload must not reach Lua as a double (tensor.lua)
local valbuf_hi = ffi.cast("uint32_t*", valbuf)

local fmt_by_id = {
   [0] = dtypes.contiguous_format, dtypes.channels_last, dtypes.channels_last_3d,
   dtypes.preserve_format,
}

local ELLIPSIS = -1
local read_double               -- tensor.read_double (tensor.lua requires this file lazily)

local function format_desc(c)
   local f = C.lm_suggest_memory_format(c, 0)
   local name = tostring(fmt_by_id[f])
   if C.lm_is_contiguous(c, f) ~= 0 then return name end
   if f ~= 0 then return name .. " (non-contiguous)" end
   return "non-contiguous"
end

function M.footer(c)
   local nd = c.ndim
   local parts = {}
   for i = 0, nd - 1 do parts[i + 1] = tostring(tonumber(c.sizes[i])) end
   local size = nd == 0 and "()" or table.concat(parts, "x")
   local dev = ""
   if c.device ~= C.LM_CPU then
      dev = ", device='" .. require("lumen.tensor").device_name(c.device) .. "'"
   end
   local dt = dtypes.from_id(c.dtype)
   return ("[lumen.Tensor %s of size %s%s, %s]"):format(dt and dt.name or "?", size, dev,
                                                          format_desc(c))
end

-- number formatter for a set of values of one dtype
local function make_formatter(values, dtype_id)
   if dtype_id == 7 then
      return function(v) return v ~= 0 and "true" or "false" end
   end
   if C.lm_dtype_is_floating(dtype_id) == 0 then
      return function(v) return ("%.0f"):format(v) end
   end
   local maxabs, minabs, all_int = 0, math.huge, true
   for i = 1, #values do
      local v = values[i]
      if v == v and v ~= math.huge and v ~= -math.huge then
         local a = math.abs(v)
         if a > maxabs then maxabs = a end
         if a > 0 and a < minabs then minabs = a end
         if v % 1 ~= 0 then all_int = false end
      end
   end
   local pattern
   if all_int and maxabs < 1e9 then
      pattern = "%.0f"
   elseif maxabs >= 1e5 or minabs < 1e-4 then
      pattern = "%.4e"
   else
      pattern = "%.4f"
   end
   return function(v)
      if v ~= v then return "nan" end
      if v == math.huge then return "inf" end
      if v == -math.huge then return "-inf" end
      local s = pattern:format(v)
      if s == "-0" then s = "0" end
      return s
   end
end

function M.tostring(t)
   local T = require("lumen.tensor")
   read_double = T.read_double
   local c = T.cdata(t)
   if c == nil then return "[lumen.Tensor (freed)]" end
   local footer = M.footer(c)
   local nd = c.ndim
   if c.device == C.LM_META then
      -- PyTorch's form: no values to show (then lumen's footer, for dtype and layout)
      local parts = {}
      for i = 0, nd - 1 do parts[i + 1] = tostring(tonumber(c.sizes[i])) end
      local size = nd == 1 and ("(" .. parts[1] .. ",)")
         or ("(" .. table.concat(parts, ", ") .. ")")
      local dt = dtypes.from_id(c.dtype)
      local dts = (dt and dt ~= dtypes.float32) and (", dtype=lumen." .. dt.name) or ""
      return ("tensor(..., device='meta', size=%s%s)\n%s"):format(size, dts, footer)
   end
   local numel = tonumber(c.numel)
   if numel == 0 then return footer end

   local opts = M.options
   local summarize = numel > opts.threshold
   local edge = opts.edgeitems
   local lists = {}
   for d = 1, nd do
      local n = tonumber(c.sizes[d - 1])
      local l = {}
      if summarize and n > 2 * edge then
         for i = 0, edge - 1 do l[#l + 1] = i end
         l[#l + 1] = ELLIPSIS
         for i = n - edge, n - 1 do l[#l + 1] = i end
      else
         for i = 0, n - 1 do l[i + 1] = i end
      end
      lists[d] = l
   end

   -- pass 1: read every printed element in display order
   local values = {}
   local function gather(d)
      if d > nd then
         if C.lm_get(c, idxbuf, valbuf) ~= 0 then
            error("lumen.tostring: " .. ffi.string(C.lm_last_error()), 0)
         end
         values[#values + 1] = read_double(valbuf, valbuf_hi, 0)
         return
      end
      for _, i in ipairs(lists[d]) do
         if i ~= ELLIPSIS then
            idxbuf[d - 1] = i
            gather(d + 1)
         end
      end
   end
   gather(1)
   local fmt = make_formatter(values, c.dtype)
   local strs, width = {}, 0
   for i = 1, #values do
      local s = fmt(values[i])
      strs[i] = s
      if #s > width then width = #s end
   end
   local pad = "%" .. width .. "s"

   -- pass 2: render, consuming strs in the same order
   local out = {}
   local pos = 0
   local function nextval()
      pos = pos + 1
      return pad:format(strs[pos])
   end
   local function row(list)
      local cells = {}
      for _, j in ipairs(list) do
         if j == ELLIPSIS then cells[#cells + 1] = ("%" .. width .. "s"):format("...")
         else cells[#cells + 1] = nextval() end
      end
      return cells
   end

   if nd == 0 then
      out[1] = " " .. nextval()
   elseif nd == 1 then
      local cells = row(lists[1])
      local line = ""
      for _, s in ipairs(cells) do
         if #line > 0 and #line + 2 + #s > opts.linewidth then
            out[#out + 1] = line
            line = ""
         end
         line = line .. (#line > 0 and "  " or " ") .. s
      end
      out[#out + 1] = line
   else
      local function matrix()
         for _, i in ipairs(lists[nd - 1]) do
            if i == ELLIPSIS then
               out[#out + 1] = " ..."
            else
               out[#out + 1] = " " .. table.concat(row(lists[nd]), "  ")
            end
         end
      end
      if nd == 2 then
         matrix()
      else
         local head = {}
         local function slices(d)
            if d > nd - 2 then
               local parts = {}
               for k = 1, nd - 2 do parts[k] = tostring(head[k] + 1) end
               out[#out + 1] = "(" .. table.concat(parts, ",") .. ",.,.) = "
               matrix()
               out[#out + 1] = ""
               return
            end
            for _, i in ipairs(lists[d]) do
               if i == ELLIPSIS then
                  out[#out + 1] = "..."
                  out[#out + 1] = ""
               else
                  head[d] = i
                  slices(d + 1)
               end
            end
         end
         slices(1)
      end
   end
   out[#out + 1] = footer
   return table.concat(out, "\n")
end

return M
