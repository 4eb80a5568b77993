-- lumen.util -- small helpers shared by training scripts (examples/train*.lua): command-line
-- flags, a monotonic clock, a status line, weight-decay parameter groups, a warm-up + cosine
-- learning-rate schedule, top-1 accuracy, and running a loop that Ctrl-C can interrupt cleanly.
local ffi = require("ffi")

local M = {}

local C = require("lumen.C")

pcall(ffi.cdef, "int isatty(int fd);")

--- seconds on a monotonic clock
M.clock = function() return C.lm_clock() end

-- the benchmarks' measure (the peer's too): fn() once to warm up, then the median of `iters`
-- timed calls, in milliseconds
function M.median_ms(fn, iters)
   fn()
   local ts = {}
   for i = 1, iters do
      local t0 = C.lm_clock()
      fn()
      ts[i] = C.lm_clock() - t0
   end
   table.sort(ts)
   return ts[math.floor(iters / 2) + 1] * 1e3
end

-- the median of a list of numbers (the mean of the middle two for an even count), and a sorted
-- copy of the list; t itself is left as it is
function M.median(t)
   if type(t) ~= "table" then
      error("lumen.util.median: expected a list of numbers, got " .. type(t), 2)
   end
   local s = {}
   for i, v in ipairs(t) do
      if type(v) ~= "number" then
         error(("lumen.util.median: element %d is a %s, expected a number"):format(i, type(v)), 2)
      end
      s[i] = v
   end
   table.sort(s)
   local n = #s
   if n == 0 then return nil, s end
   if n % 2 == 1 then return s[(n + 1) / 2], s end
   return (s[n / 2] + s[n / 2 + 1]) / 2, s
end

--- the string keys of t whose values are functions that keep(k) accepts (all when keep is nil),
--- without those starting with "_" unless private: the operators lm.layout.trace and
--- lm.jit.trace wrap
function M.function_keys(t, keep, private)
   local keys = {}
   for k, v in pairs(t) do
      if type(v) == "function" and type(k) == "string" and (private or k:sub(1, 1) ~= "_")
         and (keep == nil or keep(k)) then
         keys[#keys + 1] = k
      end
   end
   return keys
end

--- the set {name = true, ...} of the option names given as arguments
function M.option_set(...)
   local set = {}
   for i = 1, select("#", ...) do set[(select(i, ...))] = true end
   return set
end

--- the first key of the options table opts that is not in the set `known` (option_set), or nil.
--- Every function that takes an options table calls this once per call (a `next` loop over the
--- few keys given; nothing allocated), so that a misspelt option is an error, not ignored.
function M.unknown_option(opts, known)
   for k in next, opts do
      if known[k] == nil then return k end
   end
   return nil
end

--- "unknown option 'paddding'": the message for a key that unknown_option returned
function M.unknown_option_msg(k)
   return "unknown option '" .. tostring(k) .. "'"
end

function M.isatty(fd) return ffi.C.isatty(fd or 1) == 1 end

--- "m:ss"
function M.hms(s)
   s = math.max(0, math.floor(s + 0.5))
   return string.format("%d:%02d", math.floor(s / 60), s % 60)
end

--- parse `--name value`, `--name=value` and boolean `--flag` arguments against a table of
--- defaults (the type of each default decides how its value is read; a default of "" or false
--- is a string or a boolean flag). Prints usage and exits on --help or a bad flag.
-- parse_flags(defaults, usage_text, args [, help]) -> opt, usage: the examples' flags, parsed
-- with lua-argparse (Debian's lua-argparse, luarocks' argparse). defaults maps each flag name
-- (without --) to its default: a boolean is a flag without a value, a number an option that must
-- be a number, a string any value ("" shows no default). help maps a flag to its meaning (and
-- optionally help.__description, help.__order = {names in the order -h lists them}). -h/--help
-- prints the usage with every flag's default and meaning and exits 0. usage(msg) prints msg and
-- the usage line to stderr and exits 2.
function M.parse_flags(defaults, usage_text, args, help)
   help = help or {}
   local ok, argparse = pcall(require, "argparse")
   if not ok then
      io.stderr:write("the examples parse their flags with lua-argparse: apt-get install " ..
                      "lua-argparse (or luarocks install argparse)\n")
      os.exit(2)
   end
   local prog = usage_text:match("^(.-)%s+%[") or usage_text
   local p = argparse(prog, help.__description)
   p:usage_max_width(100)
   p:help_max_width(100)
   local names = {}
   if help.__order then
      local seen = {}
      for _, k in ipairs(help.__order) do names[#names + 1] = k; seen[k] = true end
      local rest = {}
      for k in pairs(defaults) do if not seen[k] then rest[#rest + 1] = k end end
      table.sort(rest)
      for _, k in ipairs(rest) do names[#names + 1] = k end
   else
      for k in pairs(defaults) do names[#names + 1] = k end
      table.sort(names)
   end
   for _, k in ipairs(names) do
      local d = defaults[k]
      local text = help[k] or ""
      if type(d) == "boolean" then
         p:flag("--" .. k, text):target(k)
      else
         local o = p:option("--" .. k, text):target(k):argname(type(d) == "number" and "N" or
            "VALUE")
         if d ~= "" then o:default(tostring(d)) end
         if type(d) == "number" then
            o:convert(function(v)
               local n = tonumber(v)
               if n == nil then return nil, ("--%s needs a number, got '%s'"):format(k, v) end
               return n
            end)
         end
      end
   end
   local function usage(msg)
      io.stderr:write((msg and (msg .. "\n") or "") .. p:get_usage() .. "\n" ..
                      "(-h for every flag, its default and meaning)\n")
      os.exit(msg and 2 or 0)
   end
   local parsed_ok, res = p:pparse(args or {})
   if not parsed_ok then usage(res) end
   local opt = {}
   for k, d in pairs(defaults) do
      local v = res[k]
      if type(d) == "boolean" then opt[k] = v == true
      elseif v == nil then opt[k] = d
      elseif type(d) == "number" then opt[k] = tonumber(v)
      else opt[k] = v end
   end
   return opt, usage
end

-- help_only(args, text): the examples that take positional arguments print text and exit 0 on
-- -h / --help (the ones with flags use parse_flags)
function M.help_only(args, text)
   for _, a in ipairs(args or {}) do
      if a == "-h" or a == "--help" then
         io.write(text:gsub("\n?$", "\n"))
         os.exit(0)
      end
   end
end

--- write a status line: redrawn in place on a terminal, printed as is otherwise
function M.status(line, tty, final)
   if tty then
      -- ESC [K erases what a longer previous line left after this one ("ETA 12:513")
      io.write("\r" .. line .. "\27[K" .. (final and "\n" or ""))
      io.flush()
   else
      print(line)
   end
end

--- parameters split for weight decay: {decay = >1-D tensors, no_decay = biases and BN}
function M.decay_groups(model, weight_decay)
   local decay, no_decay = {}, {}
   for _, p in ipairs(model:parameters()) do
      if p:dim() > 1 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
   end
   return { { params = decay, weight_decay = weight_decay },
            { params = no_decay, weight_decay = 0 } }
end

--- a learning rate for step (0-based): linear warm-up over `warmup` steps, then a cosine decay
--- to zero at `total`
function M.warmup_cosine(base, warmup, total)
   warmup = math.max(1, warmup)
   return function(step)
      if step < warmup then return base * (step + 1) / warmup end
      local t = (step - warmup) / math.max(1, total - warmup)
      return base * 0.5 * (1 + math.cos(math.pi * math.min(1, t)))
   end
end

function M.set_lr(optimizer, lr)
   for _, g in ipairs(optimizer.param_groups) do g.lr = lr end
end

--- top-1 accuracy of model over a loader (eval mode, no graph); the model is left in train mode
function M.accuracy(lm, model, loader)
   model:eval()
   local correct, n = 0, 0
   lm.no_grad(function()
      for x, y in loader:iter(1) do
         correct = correct + model(x):argmax(2):eq(y):sum():item()
         n = n + y:size(1)
      end
   end)
   model:train()
   return correct / math.max(n, 1)
end

--- run fn(); on Ctrl-C call on_interrupt() and exit with status 130; on any other error print
--- the traceback and exit with status 1
function M.run_interruptible(fn, on_interrupt)
   local ok, err = xpcall(fn, debug.traceback)
   if ok then return end
   -- after lm.distributed.init, leaving aborts the whole job (no rank waits for this one)
   local function exit(code)
      local dist = package.loaded["lumen.distributed"]
      if dist and dist._at_exit then dist._at_exit(code) end
      os.exit(code)
   end
   if tostring(err):find("interrupted", 1, true) then
      io.write("\n")
      on_interrupt()
      exit(130)
   end
   io.stderr:write(tostring(err) .. "\n")
   exit(1)
end

return M
