-- luacheck: max line length 120
-- spec/op_registry_spec.lua -- adding an operator checks itself (issue 37): this spec fails when an
-- operator kind of LM_OP_LIST (src/backend.h) or a public lm.F function lacks a registration it
-- needs, and each failure says what to add and where (docs/writing_operators.md lists them all).
--
-- Every LM_OP kind (lm_op_count(); names through lm_op_kind_name, identifiers from src/backend.h):
--   * a CPU kernel: lm_device_has_kernel(cpu, kind) (kernels/cpu/<family>.c's
--     lm_cpu_register_<family>, called from kernels/cpu/backend.c);
--   * a CUDA kernel: a `table[LM_OP_<KIND>] = ...` line in a register function of kernels/cuda/*.cu
--     (read from the sources, so it is checked without a GPU), and lm_device_has_kernel(cuda:0,
--     kind) when cuda:0 is there (a GPU, or LUMEN_CUDA_LIB = the emulated library); or a line in
--     NO_CUDA_KERNEL below (the op then fails with "<op> is not supported on cuda:0");
--   * an entry in the parity test spec/c/test_backend_ops.c (a KINDS(...) list of OPS[]): the
--     program checks this itself too, and that the entry's cases reach the kind on every device.
-- Every public lm.F function:
--   * its reference entry (lua/lumen/doc.lua, docs/api.md): spec/api_doc_spec.lua checks it for
--     every public name, lm.F's included, so it is not repeated here;
--   * its options: F._OPTIONS[name] (the keys its options table may have; the validation and
--     tools read it there), or a line in POSITIONAL below when it takes no options table;
--   * a layout coverage row: an entry of operator_list in lua/lumen/layout_coverage.lua whose
--     name starts with "<name>" or "F.<name>" (lm.layout.coverage runs it in both layouts);
--   * its ONNX form: lua/lumen/onnx.lua's OPS["F.<name>"] or PASS["F.<name>"], or a line in its
--     NO_ONNX table with the reason.
-- And the CUDA library checks the op count it was built with when it loads: a liblumen that
-- reports another lm_op_count() makes lm_cuda_init refuse, with the reason (with the emulated
-- library and a C compiler; pending otherwise).
local H = require("spec.helpers")
local S = require("spec.shell")
local lm = H.lm
local F = lm.F
local ffi = require("ffi")
local C = require("lumen.C")

-- lm.F functions without an options table: their arguments are positional (and checked there)
local POSITIONAL = {
   adaptive_avg_pool1d = "(x, output_size)",
   adaptive_avg_pool2d = "(x, output_size)",
   adaptive_avg_pool3d = "(x, output_size)",
   adaptive_max_pool1d = "(x, output_size)",
   adaptive_max_pool2d = "(x, output_size)",
   adaptive_max_pool3d = "(x, output_size, return_indices)",
   cat = "(list, dim)",
   dropout = "(x, p, training)",
   flatten = "(x, start_dim, end_dim)",
   softmax = "(x, dim)",
   log_softmax = "(x, dim)",
   relu_ = "(x)",
   elu_ = "(x, alpha)",
   leaky_relu_ = "(x, negative_slope)",
   celu_ = "(x, alpha)",
   hardtanh_ = "(x, min_val, max_val)",
   pixel_shuffle = "(x, upscale_factor)",
   pixel_unshuffle = "(x, downscale_factor)",
   channel_shuffle = "(x, groups)",
   upsample = "(x, size, scale_factor, mode, align_corners)",
   sigmoid = "(x)",
   tanh = "(x)",
   -- the composed activations and vector ops (functional/activation_composed.lua, vector.lua)
   logsigmoid = "(x)",
   softsign = "(x)",
   tanhshrink = "(x)",
   glu = "(x, dim)",
   prelu = "(x, weight)",
   softmin = "(x, dim)",
   one_hot = "(t, num_classes)",
   -- F.relu(x, inplace) also takes {inplace = b}, validated against functional.lua's RELU_OPTS,
   -- which is not in F._OPTIONS yet (functional.lua is being split by family; register it there)
   relu = "(x, inplace) or (x, {inplace = b})",
}

-- LM_OP kinds without a CUDA kernel, with the reason
local NO_CUDA_KERNEL = {
   -- a device runs conv3d natively only where its supports_op takes the call (the CPU: bfloat16
   -- on AMX tiles); elsewhere src/ops/conv3d.c runs it as conv2d over the depth taps, on cuDNN
   LM_OP_CONV3D = "native only where supports_op says so; conv3d runs as conv2d on cuda",
   -- linear with its activation fused: the CPU in float32; elsewhere lm_linear runs matmul (cuBLAS
   -- on cuda), add and the activation op
   LM_OP_LINEAR = "native only where supports_op says so; lm_linear composes matmul, add, act on cuda",
}

local read = S.read_file

-- {ident = "LM_OP_CONV2D", name = "conv2d"} in LM_OP_LIST's order, from src/backend.h
local function source_kinds()
   local src = read("src/backend.h")
   if not src then return nil end
   local body = src:match("#define LM_OP_LIST%(X%)(.-)\n#define") or ""
   local kinds = {}
   for id, name in body:gmatch("X%(([%u%d_]+),%s*\"([^\"]+)\"%)") do
      kinds[#kinds + 1] = { ident = "LM_OP_" .. id, name = name }
   end
   return kinds
end

-- the kinds the library was built with: names by index (0-based kinds)
local function library_kinds()
   local n = C.lm_op_count()
   local names = {}
   for k = 0, n - 1 do
      local p = C.lm_op_kind_name(k)
      names[#names + 1] = p ~= nil and ffi.string(p) or nil
   end
   return names, n
end

local function ls(pattern)
   local out = S.sh("ls " .. pattern .. " 2>/dev/null")
   local files = {}
   for f in out:gmatch("[^\n]+") do files[#files + 1] = f end
   return files
end

describe("adding an operator checks itself", function()
   local kinds = source_kinds()
   local in_tree = kinds ~= nil and #kinds > 0

   describe("every LM_OP kind", function()
      it("has a name through lm_op_kind_name, as src/backend.h's LM_OP_LIST spells it", function()
         local names, n = library_kinds()
         assert.are.equal(n, #names, "lm_op_kind_name(k) is NULL for a k below lm_op_count()")
         assert(C.lm_op_kind_name(n) == nil, "lm_op_kind_name(lm_op_count()) is not NULL")
         assert(C.lm_op_kind_name(-1) == nil, "lm_op_kind_name(-1) is not NULL")
         if not in_tree then return end
         assert(#kinds == n, ("src/backend.h lists %d kinds, liblumen.so was built with %d: rebuild (make)")
            :format(#kinds, n))
         for i, k in ipairs(kinds) do
            assert(names[i] == k.name, ("kind %d is %s in src/backend.h, \"%s\" in liblumen.so: rebuild (make)")
               :format(i - 1, k.ident, tostring(names[i])))
         end
      end)

      it("has a CPU kernel (and so sim:N) and meta takes it", function()
         local names = library_kinds()
         local missing = {}
         for i, name in ipairs(names) do
            local k = i - 1
            if C.lm_device_has_kernel(C.LM_CPU, k) ~= 1 then
               missing[#missing + 1] = ("%s (%s): register its kernel in the lm_cpu_register_<family> of " ..
                  "kernels/cpu/<family>.c (a new family: declare it in kernels/cpu/cpu.h, call it from " ..
                  "kernels/cpu/backend.c's fill)"):format(kinds and kinds[i] and kinds[i].ident or name, name)
            end
            assert.are.equal(1, C.lm_device_has_kernel(C.LM_SIM0, k), name .. " on sim:0")
            assert.are.equal(1, C.lm_device_has_kernel(C.LM_META, k), name .. " on meta")
         end
         assert(#missing == 0, "operator kinds without a CPU kernel:\n  " .. table.concat(missing, "\n  "))
         assert.are.equal(0, C.lm_device_has_kernel(C.LM_CPU, #names), "a kind past the end")
         assert.are.equal(-1, C.lm_device_has_kernel(C.LM_SIM0 + C.LM_NUM_SIM, 0), "a device that is not there")
      end)

      it("has a CUDA kernel (kernels/cuda/*.cu), or says why not", function()
         if not in_tree then
            pending("src/backend.h is not here (not run from the source tree)")
            return
         end
         local registered = {}
         local files = ls("kernels/cuda/*.cu")
         assert(#files > 0, "no kernels/cuda/*.cu")
         for _, f in ipairs(files) do
            for id in read(f):gmatch("table%[(LM_OP_[%u%d_]+)%]%s*=") do registered[id] = f end
         end
         local missing, stale = {}, {}
         for _, k in ipairs(kinds) do
            if not registered[k.ident] and not NO_CUDA_KERNEL[k.ident] then
               missing[#missing + 1] = ("%s (\"%s\"): add `table[%s] = k_...;` to the lm_cuda_register_<family> " ..
                  "of kernels/cuda/<family>.cu (a new family: declare it in kernels/cuda/cuda.cuh and call it " ..
                  "from lm_cuda_init in kernels/cuda/backend.cu), or list it in NO_CUDA_KERNEL in " ..
                  "spec/op_registry_spec.lua with the reason"):format(k.ident, k.name, k.ident)
            end
            if registered[k.ident] and NO_CUDA_KERNEL[k.ident] then stale[#stale + 1] = k.ident end
         end
         assert(#missing == 0, "operator kinds without a CUDA kernel:\n  " .. table.concat(missing, "\n  "))
         assert(#stale == 0, "NO_CUDA_KERNEL lists kinds that have a CUDA kernel: " .. table.concat(stale, ", "))
         -- the library that loaded agrees with its sources
         if lm.cuda.is_available() then
            for i, k in ipairs(kinds) do
               local want = NO_CUDA_KERNEL[k.ident] and 0 or 1
               assert(C.lm_device_has_kernel(C.LM_CUDA0, i - 1) == want,
                  ("%s: lm_device_has_kernel(cuda:0) is not %d (the CUDA library is older than its sources? " ..
                   "make cuda-emu / make CUDA=1)"):format(k.ident, want))
            end
         end
      end)

      it("has an entry in the parity test spec/c/test_backend_ops.c", function()
         local src = in_tree and read("spec/c/test_backend_ops.c")
         if not src then
            pending("spec/c/test_backend_ops.c is not here (not run from the source tree)")
            return
         end
         local listed = {}
         for list in src:gmatch("KINDS(%b())") do
            for id in list:gmatch("LM_OP_[%u%d_]+") do listed[id] = true end
         end
         local missing = {}
         for _, k in ipairs(kinds) do
            if not listed[k.ident] then
               missing[#missing + 1] = ("%s (\"%s\"): add it to the KINDS(...) of its family's entry in OPS[] " ..
                  "with a case that calls its front end, or a new entry with a case builder (see the comment " ..
                  "above OPS[])"):format(k.ident, k.name)
            end
         end
         assert(#missing == 0, "operator kinds the parity test does not run:\n  " .. table.concat(missing, "\n  "))
      end)
   end)

   describe("every lm.F function", function()
      local names = {}
      for k, v in pairs(F) do
         if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "function" then names[#names + 1] = k end
      end
      table.sort(names)

      it("is found (the walk sees the functional namespace)", function()
         assert(#names >= 20, "only " .. #names .. " lm.F functions found")
      end)

      it("registers its options (F._OPTIONS) or takes none", function()
         local missing, stale = {}, {}
         for _, n in ipairs(names) do
            local o = F._OPTIONS and F._OPTIONS[n]
            if o == nil and not POSITIONAL[n] then
               missing[#missing + 1] = ("F.%s: set F._OPTIONS.%s to the set of keys its options table takes " ..
                  "(option_set(...) in lua/lumen/functional.lua, the set check_opts validates), or, when it takes " ..
                  "no options table, add %s = \"(its arguments)\" to POSITIONAL in spec/op_registry_spec.lua")
                  :format(n, n, n)
            elseif o ~= nil then
               assert(type(o) == "table", "F._OPTIONS." .. n .. " is not a table")
               local nkeys = 0
               for key, v in pairs(o) do
                  assert(type(key) == "string" and v == true, "F._OPTIONS." .. n .. ": a set of names")
                  nkeys = nkeys + 1
               end
               assert(nkeys > 0, "F._OPTIONS." .. n .. " is empty")
               if POSITIONAL[n] then stale[#stale + 1] = n .. " (in F._OPTIONS and in POSITIONAL)" end
            end
         end
         for n in pairs(F._OPTIONS or {}) do
            if type(F[n]) ~= "function" then stale[#stale + 1] = "F._OPTIONS." .. n .. " (no F." .. n .. ")" end
         end
         for n in pairs(POSITIONAL) do
            if type(F[n]) ~= "function" then stale[#stale + 1] = "POSITIONAL." .. n .. " (no F." .. n .. ")" end
         end
         assert(#missing == 0, "lm.F functions without options registered:\n  " .. table.concat(missing, "\n  "))
         assert(#stale == 0, "stale option registrations: " .. table.concat(stale, ", "))
      end)

      it("has a row in lm.layout.coverage (lua/lumen/layout_coverage.lua)", function()
         local covered = {}
         for _, row in ipairs(require("lumen.layout_coverage").operators()) do
            local n = row.op:match("^F%.([%w_]+)") or row.op:match("^([%w_]+)")
            if n then covered[n] = true end
         end
         local missing = {}
         for _, n in ipairs(names) do
            if not covered[n] then
               missing[#missing + 1] = ("F.%s: add a row to operator_list in lua/lumen/layout_coverage.lua, " ..
                  "named \"%s ...\" (add(kind, \"%s <case>\", function(x, s) return F.%s(x, ...) end) in the group " ..
                  "of its input rank), and its line to the table in docs/operator_coverage.md"):format(n, n, n, n)
            end
         end
         assert(#missing == 0, "lm.F functions without a layout coverage row:\n  " .. table.concat(missing, "\n  "))
      end)

      it("has an ONNX form, or a reason in onnx.lua's NO_ONNX", function()
         local O = require("lumen.onnx")
         local OPS, PASS, NO = O._OPS, O._PASS, O._NO_ONNX
         assert(type(OPS) == "table" and type(PASS) == "table" and type(NO) == "table",
            "lua/lumen/onnx.lua exports M._OPS, M._PASS and M._NO_ONNX")
         local missing, both = {}, {}
         for _, n in ipairs(names) do
            local op = "F." .. n
            local has = OPS[op] ~= nil or PASS[op] ~= nil
            if not has and not NO[op] then
               missing[#missing + 1] = ("%s: add its exporter, OPS[\"%s\"] = function(B, node, args, outs, g) " ..
                  "... end, to lua/lumen/onnx.lua (PASS[\"%s\"] = true when the value passes through), or " ..
                  "[\"%s\"] = \"<why there is no ONNX form>\" to its NO_ONNX table"):format(op, op, op, op)
            end
            if has and NO[op] then both[#both + 1] = op end
            if NO[op] then
               assert(type(NO[op]) == "string" and NO[op] ~= "", "NO_ONNX[\"" .. op .. "\"]: a reason")
            end
         end
         for op in pairs(NO) do
            local n = op:match("^F%.(.+)$")
            if not n or type(F[n]) ~= "function" then both[#both + 1] = op .. " (not an lm.F function)" end
         end
         assert(#missing == 0, "lm.F functions without an ONNX registration:\n  " .. table.concat(missing, "\n  "))
         assert(#both == 0, "stale NO_ONNX entries (the function has an exporter, or does not exist): "
            .. table.concat(both, ", "))
      end)
   end)

   describe("the CUDA library", function()
      it("refuses to load into a liblumen with another op count", function()
         local lib = os.getenv("LUMEN_CUDA_LIB")
         if not lib or lib == "" then
            pending("LUMEN_CUDA_LIB is not set (make test-ops-cuda-emu sets it to the emulated library)")
            return
         end
         local cc = os.getenv("CC") or "cc"
         local dir = os.tmpname()
         os.remove(dir)
         local _, mk = S.sh("mkdir -p " .. S.q(dir))
         assert(mk == 0, "mkdir " .. dir)
         local shim = dir .. "/op_count_shim.so"
         local f = assert(io.open(dir .. "/shim.c", "w"))
         f:write("int lm_op_count(void) { return 1000; }\n")
         f:close()
         local out, rc = S.sh(S.q(cc) .. " -shared -fPIC -o " .. S.q(shim) .. " " .. S.q(dir .. "/shim.c"))
         if rc ~= 0 then
            S.sh("rm -rf " .. S.q(dir))
            pending("no C compiler (" .. cc .. "): " .. out)
            return
         end
         -- a fresh process whose lm_op_count() says 1000: the library's own comes first (LD_PRELOAD)
         local preload = os.getenv("LD_PRELOAD")
         preload = (preload and preload ~= "" and (preload .. ":") or "") .. shim
         local script = "local lm = require('lumen'); " ..
            "local ok, err = pcall(lm.zeros, {1}, {device = 'cuda:0'}); " ..
            "io.write(tostring(lm.cuda.is_available()), ' ', tostring(ok), ' ', tostring(err))"
         local lua_path = "./lua/?.lua;./lua/?/init.lua;" .. (os.getenv("LUA_PATH") or ";;")
         out = S.sh("LD_PRELOAD=" .. S.q(preload) .. " LUA_PATH=" .. S.q(lua_path) .. " " ..
            S.q(os.getenv("LUAJIT") or "luajit") .. " -e " .. S.q(script))
         S.sh("rm -rf " .. S.q(dir))
         assert(out:find("^false false"), "cuda:0 was available in a process whose liblumen has 1000 op kinds: " .. out)
         local want = ("the CUDA library was built with %d operator kinds and liblumen.so has 1000"):format(
            C.lm_op_count())
         assert(out:find(want, 1, true), "the reason is not given: " .. out)
      end)
   end)
end)
