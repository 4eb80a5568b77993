-- lm.onnx.export of the issue-40 resampling operators: F.interpolate / F.upsample / nn.Upsample
-- (Resize: nearest, nearest-exact, linear, bilinear, bicubic, trilinear; size and scale_factor;
-- align_corners; 1-D, 2-D, 3-D; antialias from opset 18), F.pad in the reflect, replicate and
-- circular modes (Pad "reflect" / "edge"; circular as Slice + Concat below opset 19, Pad "wrap"
-- from 19) and the transposed convolutions (ConvTranspose with stride, padding, output_padding,
-- groups, dilation).
-- Each case is exported at several opsets and checked by onnx.checker (full check, shape
-- inference) and ONNX Runtime against lumen's eager result (within 1e-5), most of them with a
-- channels-last input; skipped (with the reason) without the writer or ONNX Runtime
-- (tools/setup_onnx_venv.sh), as spec/onnx_spec.lua. Also the writer's string attributes
-- (lm_onnx_attr_string) and its errors.
local lm = require("lumen")
local ffi = require("ffi")
local shell = require("spec.shell")
local nn = lm.nn
local F = lm.F

local OIO = require("spec.onnx_io")
local write_f32, read_f32 = OIO.write_f32, OIO.read_f32

-- ONNX Runtime's python (spec/onnx_io.lua), or nil with why_not set
local why_not
local function venv()
   local py, why = OIO.runtime()
   why_not = why
   return py
end

local function fmt_of(nd)
   if nd == 4 then return lm.channels_last end
   if nd == 5 then return lm.channels_last_3d end
end

-- a module whose forward is fn
local function fn_module(name, fn)
   local M = nn.Module:extend(name)
   function M:forward(x) return fn(x) end
   return M()
end

-- cases: {name, model (module or function), input sizes, opsets, cl = channels-last input,
-- expect = {ONNX op types the file must hold}}: every case exported at each of its opsets, all
-- checked and run in one ONNX Runtime process, each output compared with the eager one
local function run_cases(cases)
   local py = venv()
   if not py then
      pending("ONNX Runtime comparison skipped: " .. why_not)
      return
   end
   local dir = os.tmpname()
   os.remove(dir)
   assert(os.execute("mkdir -p " .. shell.q(dir)) == 0)
   local args, runs = {}, {}
   for i, c in ipairs(cases) do
      lm.manual_seed(100 + i)
      local x = lm.randn(c[3])
      if c.cl and fmt_of(#c[3]) then x = x:contiguous(fmt_of(#c[3])) end
      local model = c[2]
      if type(model) == "table" and model.eval then model:eval() end
      local want = lm.no_grad(function() return model(x) end)
      write_f32(dir .. "/x" .. i, x)
      for _, opset in ipairs(c[4]) do
         local p = ("%s/m%d_%d"):format(dir, i, opset)
         lm.onnx.export(model, x, p .. ".onnx", { opset = opset })
         runs[#runs + 1] = { name = c[1], opset = opset, p = p, want = want, expect = c.expect }
         for _, a in ipairs({ p .. ".onnx", dir .. "/x" .. i, p .. ".y" }) do
            args[#args + 1] = shell.q(a)
         end
      end
   end
   local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. table.concat(args, " "))
   assert.are.equal(0, rc, out)
   for _, r in ipairs(runs) do
      local what = r.name .. " at opset " .. r.opset
      local got = read_f32(r.p .. ".y", r.want:size())
      local d = (got - r.want):abs():max():item()
      if os.getenv("JIT_VERBOSE") then print(what, d) end
      assert.is_true(d <= 1e-5, what .. ": ONNX Runtime vs lumen " .. d)
      if r.expect then
         local bytes = assert(shell.read_file(r.p .. ".onnx"))
         for _, op in ipairs(r.expect) do
            assert.truthy(bytes:find(op, 1, true), what .. ": no " .. op .. " in the file")
         end
      end
   end
   os.execute("rm -rf " .. shell.q(dir))
end

local function interp(opts)
   return function(x) return F.interpolate(x, opts) end
end

describe("lm.onnx.export: Resize", function()
   it("nearest and nearest-exact (size, scale_factor, 1-D to 3-D): ONNX Runtime within 1e-5",
      function()
      run_cases({
         { "Upsample nearest x2", nn.Upsample({ scale_factor = 2 }), { 2, 3, 4, 5 }, { 13, 17 },
           cl = true, expect = { "Resize", "asymmetric", "floor" } },
         { "nearest size 7x3", interp({ size = { 7, 3 } }), { 1, 2, 4, 5 }, { 13, 18 },
           cl = true },
         { "nearest 1-D x1.5", interp({ scale_factor = 1.5 }), { 2, 3, 5 }, { 17 } },
         -- 10 * 0.7 is 7 in double, 6.99.. in float32: written with the sizes input
         { "nearest 1-D x0.7", interp({ scale_factor = 0.7 }), { 1, 2, 10 }, { 17 } },
         { "nearest 3-D size", interp({ size = { 3, 5, 2 } }), { 1, 2, 2, 3, 4 }, { 17 },
           cl = true },
         { "nearest-exact size 7x3", interp({ size = { 7, 3 }, mode = "nearest-exact" }),
           { 1, 3, 4, 5 }, { 13, 17 }, cl = true, expect = { "half_pixel", "round_prefer_ceil" } },
         { "nearest-exact 3-D x1.5", interp({ scale_factor = 1.5, mode = "nearest-exact" }),
           { 1, 2, 3, 4, 5 }, { 17 }, cl = true },
         { "nearest-exact 1-D down", interp({ size = 3, mode = "nearest-exact" }), { 1, 2, 8 },
           { 17 } },
         { "UpsamplingNearest2d", nn.UpsamplingNearest2d({ size = { 6, 9 } }), { 1, 2, 3, 4 },
           { 17 }, cl = true },
         -- a dim that keeps its size under scale 1.25 (3 -> 3): left as it is in 2-D, resampled
         -- with the scale in 1-D and 3-D, as F.interpolate (PyTorch's kernels)
         { "nearest 2-D x1.25, one dim kept", interp({ scale_factor = 1.25 }), { 1, 2, 3, 4 },
           { 17 } },
         { "nearest 3-D x1.25", interp({ scale_factor = 1.25 }), { 1, 2, 3, 2, 4 }, { 17 } },
      })
   end)

   it("linear, bilinear, bicubic, trilinear (half_pixel, align_corners): ONNX Runtime within " ..
      "1e-5", function()
      run_cases({
         { "linear 1-D size 7", interp({ size = 7, mode = "linear" }), { 2, 3, 4 }, { 13, 17 },
           expect = { "linear", "half_pixel" } },
         { "linear 1-D align_corners", interp({ size = 9, mode = "linear", align_corners = true }),
           { 1, 2, 5 }, { 17 }, expect = { "align_corners" } },
         { "bilinear x1.5", interp({ scale_factor = 1.5, mode = "bilinear" }), { 2, 3, 4, 5 },
           { 13, 17 }, cl = true },
         { "bilinear down 3x2", interp({ size = { 3, 2 }, mode = "bilinear" }), { 1, 2, 7, 5 },
           { 17 }, cl = true },
         -- an output of size 1: PyTorch samples the centre (half_pixel), not 0
         { "bilinear to 1x3", interp({ size = { 1, 3 }, mode = "bilinear" }), { 1, 2, 4, 6 },
           { 17 } },
         { "bilinear align_corners", interp({ size = { 7, 3 }, mode = "bilinear",
                                              align_corners = true }), { 1, 3, 4, 5 }, { 17 },
           cl = true },
         { "UpsamplingBilinear2d x2", nn.UpsamplingBilinear2d({ scale_factor = 2 }),
           { 1, 2, 3, 4 }, { 17 }, cl = true },
         { "bilinear recompute_scale_factor", interp({ scale_factor = 1.7, mode = "bilinear",
                                                      recompute_scale_factor = true }),
           { 1, 2, 4, 5 }, { 17 } },
         { "bicubic size 7x3", interp({ size = { 7, 3 }, mode = "bicubic" }), { 1, 3, 4, 5 },
           { 13, 17 }, cl = true, expect = { "cubic" } },
         { "bicubic x2 align_corners", interp({ scale_factor = 2, mode = "bicubic",
                                               align_corners = true }), { 2, 2, 3, 4 }, { 17 },
           cl = true },
         { "bicubic down", interp({ scale_factor = 0.6, mode = "bicubic" }), { 1, 2, 8, 10 },
           { 17 } },
         { "trilinear x(2, 1.5, 2)", interp({ scale_factor = { 2, 1.5, 2 }, mode = "trilinear" }),
           { 1, 2, 2, 4, 3 }, { 13, 17 }, cl = true },
         { "trilinear align_corners", interp({ size = { 3, 5, 4 }, mode = "trilinear",
                                               align_corners = true }), { 1, 2, 2, 3, 3 },
           { 17 }, cl = true },
         { "F.upsample bilinear x2", function(x) return F.upsample(x, nil, 2, "bilinear") end,
           { 1, 2, 3, 4 }, { 17 } },
         { "bilinear x1.25, one dim kept", interp({ scale_factor = 1.25, mode = "bilinear" }),
           { 1, 2, 3, 4 }, { 17 } },
         { "linear 1-D x1.25, size kept", interp({ scale_factor = 1.25, mode = "linear" }),
           { 1, 2, 3 }, { 17 } },
      })
   end)

   it("antialias (opset 18+: antialias, exclude_outside, cubic_coeff_a -0.5): ONNX Runtime " ..
      "within 1e-5", function()
      local function aa(o)
         o.antialias = true
         return interp(o)
      end
      run_cases({
         { "bilinear antialias down 5x7", aa({ size = { 5, 7 }, mode = "bilinear" }),
           { 2, 3, 17, 23 }, { 18, 21 }, cl = true, expect = { "antialias", "exclude_outside" } },
         { "bicubic antialias down 3x4", aa({ size = { 3, 4 }, mode = "bicubic" }),
           { 1, 2, 40, 31 }, { 18 }, cl = true },
         { "bilinear antialias x0.4", aa({ scale_factor = 0.4, mode = "bilinear" }),
           { 1, 2, 13, 11 }, { 18 } },
         { "bicubic antialias x(0.3, 1.7)", aa({ scale_factor = { 0.3, 1.7 }, mode = "bicubic" }),
           { 1, 2, 15, 6 }, { 18, 20 }, cl = true },
         { "bicubic antialias up", aa({ size = { 9, 11 }, mode = "bicubic" }), { 1, 2, 5, 4 },
           { 18 } },
         -- H keeps its size under scale 1.1: PyTorch leaves it, Resize gets scale 1 there
         { "bilinear antialias x(1.1, 0.5)", aa({ scale_factor = { 1.1, 0.5 },
                                                   mode = "bilinear" }), { 1, 2, 5, 12 },
           { 18 } },
      })
   end)

   it("antialias below opset 18, or with align_corners: a clear error, nothing written",
      function()
      local x = lm.randn({ 1, 2, 8, 8 })
      local p = os.tmpname()
      os.remove(p)
      local function export(o, opset)
         o.antialias = true
         return pcall(lm.onnx.export, fn_module("AA", interp(o)), x, p, { opset = opset })
      end
      local ok, e = export({ size = 3, mode = "bilinear" }, 17)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("lumen.onnx.export: interpolate with antialias = true " ..
                                     "needs opset 18 or later", 1, true), tostring(e))
      ok, e = export({ size = 3, mode = "bicubic", align_corners = true }, 18)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("antialias = true and align_corners = true is not " ..
                                     "exported", 1, true), tostring(e))
      assert.is_nil(io.open(p, "rb"))
   end)

   it("values that Resize cannot give: a clear error, nothing written", function()
      local p = os.tmpname()
      os.remove(p)
      -- 1-D nearest by 1.25 keeps the size 3 but reads 0, 0, 1; Resize would copy
      local ok, e = pcall(lm.onnx.export, fn_module("N", interp({ scale_factor = 1.25 })),
                          lm.randn({ 1, 2, 3 }), p, { opset = 17 })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("keeps every size", 1, true), tostring(e))
      ok, e = pcall(lm.onnx.export, fn_module("A", interp({ size = { 2, 2 }, mode = "area" })),
                    lm.randn({ 1, 2, 4, 4 }), p, { opset = 17 })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("mode 'area'", 1, true), tostring(e))
      assert.is_nil(io.open(p, "rb"))
   end)

   it("a dynamic batch: the sizes come from Shape(x) and the model runs at another batch",
      function()
      local py = venv()
      if not py then
         pending("ONNX Runtime comparison skipped: " .. why_not)
         return
      end
      local model = fn_module("DynResize", function(x)
         return F.interpolate(x, { size = { 6, 7 }, mode = "bilinear" })
      end)
      local p = os.tmpname()
      lm.onnx.export(model, lm.randn({ 2, 3, 4, 5 }), p .. ".onnx",
                     { dynamic_axes = { input = { [1] = "batch" }, output = { [1] = "batch" } } })
      local x = lm.randn({ 3, 3, 4, 5 }):contiguous(lm.channels_last)
      write_f32(p .. ".x", x)
      local out, rc = shell.sh(shell.q(py) .. " spec/onnx_check.py " .. shell.q(p .. ".onnx") ..
                               " " .. shell.q(p .. ".x") .. " " .. shell.q(p .. ".y"))
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("output dims ['batch', 3, 6, 7]", 1, true), out)
      local want = lm.no_grad(function() return model(x) end)
      local got = read_f32(p .. ".y", want:size())
      assert.is_true((got - want):abs():max():item() <= 1e-5)
      for _, e in ipairs({ "", ".onnx", ".x", ".y" }) do os.remove(p .. e) end
   end)
end)

describe("lm.onnx.export: Pad modes", function()
   it("reflect, replicate (edge), circular (Slice + Concat below opset 19, wrap from 19): " ..
      "ONNX Runtime within 1e-5", function()
      local function pad(p, mode) return function(x) return F.pad(x, p, { mode = mode }) end end
      run_cases({
         { "reflect 2-D", pad({ 1, 2, 0, 3 }, "reflect"), { 2, 3, 4, 5 }, { 13, 17 }, cl = true,
           expect = { "reflect" } },
         { "reflect 1-D", pad({ 3, 1 }, "reflect"), { 1, 2, 5 }, { 17 } },
         { "reflect 3-D", pad({ 1, 1, 2, 0, 0, 1 }, "reflect"), { 1, 2, 2, 3, 4 }, { 17 },
           cl = true },
         { "replicate 2-D", pad({ 2, 1, 1, 3 }, "replicate"), { 2, 3, 4, 5 }, { 13, 17 },
           cl = true, expect = { "edge" } },
         { "replicate 1-D", pad({ 0, 4 }, "replicate"), { 1, 2, 3 }, { 17 } },
         { "replicate 3-D", pad({ 1, 0, 2, 1, 1, 1 }, "replicate"), { 1, 2, 2, 3, 4 }, { 18 },
           cl = true },
         { "circular 2-D", pad({ 1, 2, 4, 0 }, "circular"), { 2, 3, 4, 5 }, { 13, 17 },
           cl = true, expect = { "Slice", "Concat" } },
         { "circular 2-D (wrap)", pad({ 1, 2, 4, 0 }, "circular"), { 2, 3, 4, 5 }, { 19, 21 },
           cl = true, expect = { "wrap" } },
         { "circular 1-D", pad({ 3, 3 }, "circular"), { 1, 2, 3 }, { 17, 19 } },
         { "circular 3-D", pad({ 1, 1, 0, 2, 2, 1 }, "circular"), { 1, 2, 2, 3, 4 }, { 17, 20 },
           cl = true },
         { "constant", function(x) return F.pad(x, { 1, 1, 2, 0 }, { value = -1.5 }) end,
           { 1, 2, 3, 4 }, { 17, 19 }, cl = true },
      })
   end)
end)

describe("lm.onnx.export: ConvTranspose", function()
   it("1-D, 2-D, 3-D with stride, padding, output_padding, groups, dilation: ONNX Runtime " ..
      "within 1e-5", function()
      run_cases({
         { "ConvTranspose1d", nn.ConvTranspose1d(4, 6, 3, { stride = 2, padding = 1,
                                                            output_padding = 1, dilation = 2 }),
           { 2, 4, 5 }, { 13, 17 }, expect = { "ConvTranspose", "output_padding" } },
         { "ConvTranspose2d groups", nn.ConvTranspose2d(4, 6, { 3, 2 }, {
              stride = { 2, 3 }, padding = { 1, 0 }, output_padding = { 1, 2 }, groups = 2 }),
           { 2, 4, 4, 3 }, { 13, 17 }, cl = true },
         { "ConvTranspose2d dilation no bias", nn.ConvTranspose2d(3, 4, 3, {
              stride = 2, dilation = 2, output_padding = 1, bias = false }),
           { 1, 3, 3, 4 }, { 17 }, cl = true },
         { "ConvTranspose3d", nn.ConvTranspose3d(4, 4, 3, { stride = 2, padding = 1,
              output_padding = { 1, 0, 1 }, groups = 4, dilation = { 1, 2, 1 } }),
           { 1, 4, 2, 3, 3 }, { 17 }, cl = true },
      })
   end)
end)

describe("the writer's string attributes (lm_onnx_attr_string)", function()
   it("writes the bytes, and bad arguments fail with a message naming the function", function()
      if not lm.onnx.available() then
         pending("the ONNX writer build/liblumen_onnx.so is not built")
         return
      end
      -- lm.onnx.available() declared the shim's functions; the library itself is loaded here
      local path = os.getenv("LUMEN_ONNX_LIB")
      if path == nil or path == "" then path = "build/liblumen_onnx.so" end
      local f = io.open(path, "rb")
      if not f then
         pending(path .. " is not here (an installed run)")
         return
      end
      f:close()
      local L = ffi.load(path)
      local m = ffi.gc(L.lm_onnx_new("g", "spec", "0", 17, 8), L.lm_onnx_free)
      local ins = ffi.new("const char *[1]", { "x" })
      local outs = ffi.new("const char *[1]", { "y" })
      local k = L.lm_onnx_add_node(m, "Pad", "pad", 1, ins, 1, outs)
      assert.are.equal(0, k)
      assert.are.equal(0, L.lm_onnx_attr_string(m, k, "mode", "reflect"))
      assert.are.equal(0, L.lm_onnx_attr_string(m, k, "empty", ""))
      assert.are.equal(-1, L.lm_onnx_attr_string(m, 7, "mode", "edge"))
      assert.truthy(ffi.string(L.lm_onnx_error()):find("lm_onnx_attr: bad node 7", 1, true))
      assert.are.equal(-1, L.lm_onnx_attr_string(m, k, "mode", nil))
      assert.truthy(ffi.string(L.lm_onnx_error()):find("lm_onnx_attr_string: bad arguments", 1,
                                                        true))
      assert.are.equal(-1, L.lm_onnx_attr_string(nil, 0, "mode", "edge"))
      local p = os.tmpname()
      assert.are.equal(0, L.lm_onnx_save(m, p))
      local bytes = assert(shell.read_file(p))
      os.remove(p)
      assert.truthy(bytes:find("mode", 1, true) and bytes:find("reflect", 1, true))
      assert.is_nil(bytes:find("edge", 1, true))
   end)
end)
