-- spec/verbose_spec.lua -- which kernel ran: LUMEN_VERBOSE's lines, the implementation lists'
-- names and lm.backends.cpu.disable / LUMEN_CPU_DISABLE (src/impl.h, lua/lumen/impl.lua).
-- The lines go to the C library's stderr, so the cases that read them run a child luajit with
-- this process's package paths and environment (on a test device, LUMEN_DEFAULT_DEVICE too: the
-- lines then name that device).
local lm = require("lumen")
local sh = require("spec.shell")

-- run a Lua chunk in a child luajit with env (a string of VAR=value words); its output and status
local function child(code, env)
   local path = os.tmpname()
   local f = assert(io.open(path, "w"))
   f:write(("package.path = %q\npackage.cpath = %q\n"):format(package.path, package.cpath))
   f:write("local lm = require('lumen')\n", code, "\n")
   f:close()
   local out, rc = sh.sh((env or "") .. " luajit " .. sh.q(path))
   os.remove(path)
   return out, rc
end

-- the exec lines of out, as tables of their nine fields
local function exec_lines(out)
   local lines = {}
   for line in out:gmatch("[^\n]+") do
      if line:match("^lumen_verbose,exec,") then
         local f = {}
         for field in (line .. ","):gmatch("([^,]*),") do f[#f + 1] = field end
         lines[#lines + 1] = f
      end
   end
   return lines
end

-- the first line of op `op`
local function line_of(lines, op)
   for _, f in ipairs(lines) do
      if f[4] == op then return f end
   end
end

local names = {}
for _, im in ipairs(lm.backends.cpu.implementations()) do names[im.name] = im end

-- the implementations of a float32 / a bfloat16 convolution (first name of a joined note)
local f32_conv = { depthwise_avx512 = true, winograd_f4x4_avx512 = true, pointwise_avx512 = true,
                   narrow_c_avx512 = true, grouped_avx512 = true, grouped_avx2 = true,
                   depthwise_avx2 = true,
                   direct_rb_avx512 = true,
                   direct_avx512 = true,
                   im2col_gemm = true, fp32_bf16_amx = true }
local bf16_conv = { amx_bf16 = true, winograd_f4x4_avx512bf16 = true, direct_avx512bf16 = true,
                    via_f32 = true }

local CONV = [[
local x = lm.randn({2, 64, 12, 12}):contiguous(lm.channels_last)
local w = lm.randn({64, 64, 3, 3}):contiguous(lm.channels_last)
lm.F.conv2d(x, w, nil, {padding = 1})
lm.F.conv2d(x:to(lm.bfloat16), w:to(lm.bfloat16), nil, {padding = 1})
]]

describe("LUMEN_VERBOSE=1", function()
   local out, rc = child(CONV .. [[
local x = lm.randn({2, 64, 12, 12}):contiguous(lm.channels_last)
lm.F.max_pool2d(x, 2)
local bn = lm.nn.BatchNorm2d(64)
bn:forward(x)
lm.matmul(lm.randn({32, 48}), lm.randn({48, 40}))
io.write("done\n")
]], "LUMEN_VERBOSE=1")
   local lines = exec_lines(out)

   it("runs, one line per kernel call, nine comma-separated fields", function()
      assert.are.equal(0, rc, out)
      assert.truthy(out:match("done"))
      assert.is_true(#lines >= 6, out)
      for _, f in ipairs(lines) do
         assert.are.equal(9, #f, table.concat(f, ","))
         assert.truthy(tonumber(f[9]), table.concat(f, ","))
      end
   end)

   it("names conv2d's implementation, different for float32 and bfloat16", function()
      local seen = {}
      for _, f in ipairs(lines) do
         if f[4] == "conv2d" then seen[#seen + 1] = f end
      end
      assert.are.equal(2, #seen, out)
      local a, b = seen[1][5]:match("^[^+]+"), seen[2][5]:match("^[^+]+")
      assert.are.equal("float32", seen[1][6])
      assert.are.equal("bfloat16", seen[2][6])
      assert.is_true(f32_conv[a] ~= nil, a)
      assert.is_true(bf16_conv[b] ~= nil, b)
      assert.are_not.equal(a, b)
      assert.are.equal("channels_last", seen[1][7])
      assert.are.equal("2x64x12x12;64x64x3x3;-;-;2x64x12x12", seen[1][8])
   end)

   it("names max_pool2d's, batch_norm's and matmul's", function()
      local mp, bn, mm = line_of(lines, "max_pool2d"), line_of(lines, "batch_norm"),
                         line_of(lines, "matmul")
      assert.truthy(mp and bn and mm, out)
      if mp[3] == "cpu" or mp[3]:match("^sim") then
         assert.truthy(mp[5]:match("^pool_"), mp[5])
         assert.truthy(bn[5]:match("^batch_norm_"), bn[5])
      else -- CUDA: lumen's own kernels, cuDNN's or cuBLAS's names
         assert.are_not.equal("default", mp[5])
         assert.are_not.equal("default", bn[5])
      end
      assert.truthy(mm[5]:match("gemm"), mm[5])
      for _, f in ipairs({ mp, bn, mm }) do
         for name in f[5]:gmatch("[^+]+") do
            -- CPU names come from the list; a CUDA line names cuDNN's algorithm or lumen's own
            if f[3] == "cpu" or f[3]:match("^sim") then assert.truthy(names[name], name) end
         end
      end
   end)
end)

describe("LUMEN_VERBOSE=1: the float32 activations", function()
   it("name ew_act_avx512 where the CPU has AVX-512, ew_act_avx2 at AVX2, default when it is " ..
      "switched off", function()
      local out, rc = child([[
local C = require("lumen.C")
io.write("isa ", tonumber(C.lm_cpu_get_isa()), " ", tonumber(C.LM_ISA_AVX512), " ",
         tonumber(C.LM_ISA_AVX2), "\n")
local x = lm.randn({3, 37}):requires_grad_(true)
lm.F.gelu(x):backward(lm.ones({3, 37}))
lm.F.silu(x:detach())
lm.F.gelu(x:double())
lm.backends.cpu.disable("ew_act_avx512")
lm.backends.cpu.disable("ew_act_avx2")
lm.F.silu(x:detach())
]], "LUMEN_VERBOSE=1")
      assert.are.equal(0, rc, out)
      local isa, v512, v2 = out:match("isa (%d+) (%d+) (%d+)")
      local has512 = tonumber(isa) >= tonumber(v512)
      local is_avx2 = tonumber(isa) == tonumber(v2)
      local got = {}
      for _, f in ipairs(exec_lines(out)) do
         if f[4] == "unary" or f[4] == "binary" then got[#got + 1] = f end
      end
      -- gelu, its gradient (binary), silu, float64 gelu, silu switched off
      assert.are.equal(5, #got, out)
      if got[1][3] == "cpu" or got[1][3]:match("^sim") then
         local want = has512 and "ew_act_avx512" or is_avx2 and "ew_act_avx2" or "default"
         for i = 1, 3 do
            assert.are.equal(want, got[i][5], table.concat(got[i], ","))
            assert.are.equal("float32", got[i][6])
         end
         assert.are.equal("binary", got[2][4])
         assert.are.equal("default", got[4][5]) -- float64
         assert.are.equal("default", got[5][5]) -- switched off
         assert.truthy(names.ew_act_avx512)
         assert.is_false(names.ew_act_avx512.fallback)
         assert.truthy(names.ew_act_avx2)
      end
   end)
end)

describe("LUMEN_VERBOSE=2", function()
   it("also says why earlier entries were skipped", function()
      local out, rc = child(CONV, "LUMEN_VERBOSE=2 LUMEN_CPU_DISABLE=winograd_f4x4_avx512")
      assert.are.equal(0, rc, out)
      assert.truthy(out:match("lumen_verbose,skip,[^,]+,conv2d,winograd_f4x4_avx512,switched off"),
                    out)
   end)
end)

describe("lm.backends.cpu.disable", function()
   it("changes the line and not the values", function()
      local code = CONV .. [[
local x = lm.randn({2, 64, 12, 12}):contiguous(lm.channels_last)
local w = lm.randn({64, 64, 3, 3}):contiguous(lm.channels_last)
local a = lm.F.conv2d(x, w, nil, {padding = 1})
lm.backends.cpu.disable("winograd_f4x4_avx512", "direct_rb_avx512", "direct_avx512")
local b = lm.F.conv2d(x, w, nil, {padding = 1})
assert(b:is_contiguous(lm.channels_last))
io.write(("maxdiff %.3g\n"):format((a - b):abs():max():item()))
lm.backends.cpu.enable("winograd_f4x4_avx512", "direct_rb_avx512", "direct_avx512")
]]
      local out, rc = child(code, "LUMEN_VERBOSE=1")
      assert.are.equal(0, rc, out)
      local convs = {}
      for _, f in ipairs(exec_lines(out)) do
         if f[4] == "conv2d" and f[6] == "float32" then convs[#convs + 1] = f[5] end
      end
      assert.are.equal(3, #convs, out)
      local d = tonumber(out:match("maxdiff (%S+)"))
      assert.truthy(d and d < 1e-3, out)
      -- the second float32 conv2d ran with three implementations off: never one of them
      for _, off in ipairs({ "winograd_f4x4_avx512", "direct_rb_avx512", "direct_avx512" }) do
         assert.is_nil(convs[3]:match(off), convs[3])
      end
   end)

   it("LUMEN_CPU_DISABLE does it from the environment", function()
      local list = "io.write(table.concat(lm.backends.cpu.disabled(), ' '), '\\n')"
      local out, rc = child(CONV .. list,
                            "LUMEN_VERBOSE=1 LUMEN_CPU_DISABLE=winograd_f4x4_avx512,amx_bf16")
      assert.are.equal(0, rc, out)
      assert.truthy(out:match("amx_bf16 winograd_f4x4_avx512"), out)
      for _, f in ipairs(exec_lines(out)) do
         if f[4] == "conv2d" then
            assert.is_nil(f[5]:match("^winograd_f4x4_avx512$"), f[5])
            assert.is_nil(f[5]:match("^amx_bf16"), f[5])
         end
      end
   end)

   it("the older variables still switch theirs off (LUMEN_CONV_WINOGRAD=0)", function()
      local out, rc = child(CONV, "LUMEN_VERBOSE=1 LUMEN_CONV_WINOGRAD=0")
      assert.are.equal(0, rc, out)
      for _, f in ipairs(exec_lines(out)) do
         if f[4] == "conv2d" then assert.is_nil(f[5]:match("^winograd_f4x4_avx512$"), f[5]) end
      end
   end)

   it("in process: disabled() lists the names switched off, enable() undoes it", function()
      lm.backends.cpu.disable("pointwise_avx512")
      local d = lm.backends.cpu.disabled()
      local found = false
      for _, n in ipairs(d) do if n == "pointwise_avx512" then found = true end end
      assert.is_true(found)
      lm.backends.cpu.enable("pointwise_avx512")
      for _, n in ipairs(lm.backends.cpu.disabled()) do
         assert.are_not.equal("pointwise_avx512", n)
      end
   end)

   it("refuses unknown names, fallbacks, non-strings and no name", function()
      local ok, err = pcall(lm.backends.cpu.disable, "winograd_f9x9")
      assert.is_false(ok)
      assert.truthy(err:match("lumen.backends.cpu.disable: unknown implementation 'winograd_f9x9'"),
                    err)
      ok, err = pcall(lm.backends.cpu.disable, "im2col_gemm")
      assert.is_false(ok)
      assert.truthy(err:match("fallback"), err)
      ok, err = pcall(lm.backends.cpu.disable, 42)
      assert.is_false(ok)
      assert.truthy(err:match("expected implementation names"), err)
      ok, err = pcall(lm.backends.cpu.disable)
      assert.is_false(ok)
      assert.truthy(err:match("expected one or more names"), err)
      ok, err = pcall(lm.backends.cpu.enable, "nope")
      assert.is_false(ok)
      assert.truthy(err:match("lumen.backends.cpu.enable: unknown"), err)
   end)
end)

describe("lm.backends.cpu.implementations", function()
   it("lists every name once, with its description; AMX ones say amx", function()
      local seen = {}
      for _, im in ipairs(lm.backends.cpu.implementations()) do
         assert.is_nil(seen[im.name], im.name)
         seen[im.name] = true
         assert.truthy(im.name:match("^[a-z0-9_]+$"), im.name)
         assert.is_true(#im.doc > 10, im.name)
         assert.are.equal("boolean", type(im.fallback))
         if im.doc:match("on AMX tiles") then assert.truthy(im.name:match("amx"), im.name) end
      end
      for _, n in ipairs({ "winograd_f4x4_avx512", "pointwise_avx512", "direct_rb_avx512",
                           "direct_avx512bf16", "gemm_avx512", "im2col_gemm", "amx_bf16",
                           "gemm_amx_bf16", "pool_avx512", "batch_norm_avx512" }) do
         assert.is_true(seen[n], n)
      end
   end)
end)

describe("lm.backends.verbose", function()
   it("sets and reads the level, returns the one before", function()
      local before = lm.backends.verbose()
      assert.are.equal(before, lm.backends.verbose(0))
      assert.are.equal(0, lm.backends.verbose())
      lm.backends.verbose(before)
   end)
   it("refuses a level outside 0..2", function()
      for _, bad in ipairs({ 3, -1, 1.5, "1" }) do
         local ok, err = pcall(lm.backends.verbose, bad)
         assert.is_false(ok)
         assert.truthy(err:match("lumen.backends.verbose: expected 0, 1 or 2"), err)
      end
   end)
end)

describe("conv3d", function()
   it("prints its plan before the conv2d lines it runs", function()
      local out, rc = child([[
local x = lm.randn({1, 16, 4, 8, 8}):contiguous(lm.channels_last_3d)
local w = lm.randn({16, 16, 3, 3, 3})
lm.F.conv3d(x, w, nil, {padding = 1})
]], "LUMEN_VERBOSE=1")
      assert.are.equal(0, rc, out)
      local plan = out:match("lumen_verbose,plan,[^,]+,conv3d,([a-z0-9_]+),")
      assert.truthy(plan, out)
      assert.truthy(names[plan], plan)
   end)
end)

describe("on the emulated CUDA device", function()
   local avail = lm.cuda.is_available()
   local lib = os.getenv("LUMEN_CUDA_LIB")
   it("prints cuda:0 lines for conv2d, batch_norm and matmul", function()
      if not avail then
         pending("no CUDA device (make test-cuda-emu runs this with the emulated one)")
         return
      end
      local out, rc = child([[
local x = lm.randn({2, 16, 8, 8}, {device = "cuda:0"}):contiguous(lm.channels_last)
local w = lm.randn({16, 16, 3, 3}, {device = "cuda:0"}):contiguous(lm.channels_last)
lm.F.conv2d(x, w, nil, {padding = 1})
local bn = lm.nn.BatchNorm2d(16):to("cuda:0")
bn:forward(x)
lm.matmul(lm.randn({16, 16}, {device = "cuda:0"}), lm.randn({16, 16}, {device = "cuda:0"}))
]], "LUMEN_VERBOSE=1" .. (lib and (" LUMEN_CUDA_LIB=" .. sh.q(lib)) or ""))
      assert.are.equal(0, rc, out)
      local lines = exec_lines(out)
      for _, op in ipairs({ "conv2d", "batch_norm", "matmul" }) do
         local f = line_of(lines, op)
         assert.truthy(f, op .. "\n" .. out)
         assert.are.equal("cuda:0", f[3])
         assert.are_not.equal("", f[5])
      end
   end)
end)
