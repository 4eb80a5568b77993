-- spec/amx_spec.lua -- the AMX kernels (kernels/cpu/gemm_bf16_amx.c, conv_bf16_amx.c over the
-- tiles of amx.h) against a float64 reference computed from the same bfloat16 values, on real AMX
-- or through the emulated tiles (`make amx-emu`, `make test-amx-emu`; every tile operation in
-- portable C with the palette-1 limits checked, ASan-checked under `make asan`):
--   * the bfloat16 GEMM: lm.mm / lm.matmul (batched, broadcast), F.linear with a bias, lm_addmm_
--     (out += a b), and lm_bgemm_strided / lm_bgemm_strided_bf16c directly (float32 and bfloat16
--     outputs, alpha, beta, row- / column-major / strided C), with m, n, k off the 16 / 32 tile
--     sizes, k deeper than one 512 k block, n wider than one 512 column block, transposed and
--     strided operands, empty operands;
--   * conv2d in bfloat16, channels-last and contiguous inputs: forward with bias, residual and
--     ReLU, backward data and weight through autograd; channels off the 16 / 32 tile sizes,
--     kernels 1x1 to 7x7, strides, padding, dilation; a ResNet-like 64 -> 64 3x3 layer;
--   * lm.backends.cpu.amx: off and on give the same values within the bfloat16 tolerance, and
--     lm.backends.cpu.isa() names the level;
--   * Linux's permission refused (LUMEN_AMX_TEST_DENY=1, a child bin/lumen): no AMX, the
--     AVX512_BF16 level, and the same bits as this process with lm.backends.cpu.amx = false;
--   * bad values for the switch and the C entry points.
-- Without AMX in this process (a CPU without it, or Linux refusing) the kernel specs are pending.
-- The tensors are made on the CPU whatever LUMEN_DEFAULT_DEVICE says (the CPU's instruction-set
-- levels are the subject; tools/run_tests.sh skips this file on test devices).
local H = require("spec.helpers")
local lm = H.lm
local F = lm.F
local C = require("lumen.C")
local ffi = require("ffi")

pcall(ffi.cdef, [[
void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                      int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb,
                      float beta, float *c, int64_t rsc, int64_t csc);
void lm_bgemm_strided_bf16c(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                            int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb,
                            int64_t csb, float beta, uint16_t *c, int64_t rsc, int64_t csc);
]])

local CL, CONTIG = lm.channels_last, lm.contiguous_format
local CPU = { device = "cpu" }
local AMX = lm.backends.cpu.amx_available()

local function randn(sizes) return lm.randn(sizes, CPU) end
local function bf(sizes) return randn(sizes):bfloat16() end
local function is_cl(t) return tostring(t:suggest_memory_format()) == "channels_last" end

-- it() where this process has AMX tiles, pending() elsewhere
local function amx_it(name, fn)
   if AMX then
      it(name, fn)
   else
      pending(name .. " (no AMX in this process: lm.backends.cpu.amx_available() is false)")
   end
end

-- fn() on the AMX level with the switch on, whatever the spec set before; restored after.
-- Winograd with bfloat16 products (lm.backends.cpu.bf16_winograd: 3x3 stride 1 from 64
-- channels, about ten times the direct kernels' error, spec/conv_bf16_spec.lua checks it) is
-- off, so that every convolution runs the tile kernels (or the direct ones where AMX has none)
-- and is held to one bfloat16 rounding
-- LUMEN_CONV_AMX=2: the tiles take every geometry they can run, also the 16..31-channel
-- spatial kernels that the float32 route takes by default (kernels/cpu/conv_bf16_amx.c,
-- amx_pays_2d), so that the odd channel counts below reach the tile kernels
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")
local function on_amx(fn)
   assert.equal(C.LM_ISA_AMX, C.lm_cpu_set_isa(C.LM_ISA_AMX))
   lm.backends.cpu.amx = true
   lm.backends.cpu.bf16_winograd = false
   assert.equal("amx", lm.backends.cpu.isa())
   ffi.C.setenv("LUMEN_CONV_AMX", "2", 1)
   local ok, err = pcall(fn)
   ffi.C.unsetenv("LUMEN_CONV_AMX")
   C.lm_cpu_set_isa(C.LM_ISA_AUTO)
   lm.backends.cpu.amx = true
   lm.backends.cpu.bf16_winograd = true
   if not ok then error(err, 0) end
end

-- a bfloat16 copy of src with the given strides (lm.empty_strided + copy_)
local function strided(src, strides)
   local t = lm.empty_strided(src:size(), strides, { dtype = src:dtype(), device = "cpu" })
   t:copy_(src)
   return t
end

-- an m x k bfloat16 operand in layout lay: "rm" row-major, "t" a transposed view of a row-major
-- k x m, "rs" rows apart by more than k (a narrowed wider tensor), "s2" every element apart
-- (strides both ways), "cm" column-major through empty_strided
local function operand(r, s, lay)
   if lay == "t" then return bf({ s, r }):t() end
   if lay == "rs" then return bf({ r, s + 5 }):narrow(2, 3, s) end
   local v = bf({ r, s })
   if lay == "s2" then return strided(v, { 2 * s + 3, 2 }) end
   if lay == "cm" then return strided(v, { 1, math.max(r, 1) }) end
   return v
end

-- |got - ref| <= rel * |ref| + abs_tol * mag everywhere (mag: |a| @ |b|, the sum of |terms|,
-- float64), reporting the worst element
local function assert_gemm_close(got, ref, mag, rel, abs_tol, what)
   H.assert_sizes(got, ref:size(), what)
   if got:numel() == 0 then return end
   local d = (got:double() - ref):abs()
   local over = d - (ref:abs() * rel + mag * abs_tol)
   local worst = over:max():item()
   if worst > 0 then
      local i = over:argmax():item()
      local g, r = H.values(got:double():contiguous()), H.values(ref:contiguous())
      error(("%s: element %d (row-major, 1-based) got %.9g, float64 reference %.9g (%g past "
         .. "the tolerance)"):format(what, i, g[i], r[i], worst), 2)
   end
end

-- the tolerance of a bfloat16 GEMM result: one rounding to bfloat16 (2^-9 relative, 2^-8 to be
-- safe) and the float32 sums' error relative to the sum of |terms| (k terms, blocked sums)
local function gemm_tols(k, out_bf16)
   local sums = 2 ^ -24 * (8 + math.sqrt(k) * 4)
   return out_bf16 and 2 ^ -8 or 0, sums
end

-- float64 reference of a @ b on the same bfloat16 values, and |a| @ |b|
local function ref_mm(a, b)
   local ad, bd = a:double():contiguous(), b:double():contiguous()
   return ad:matmul(bd), ad:abs():matmul(bd:abs())
end

local function close_bf16(got, ref, mag, k, what)
   assert.equal("bfloat16", tostring(got:dtype()), what .. ": dtype")
   local rel, abs_tol = gemm_tols(k, true)
   assert_gemm_close(got, ref, mag, rel, abs_tol, what)
end

-- conv: |got - ref| <= rel * |ref| + rel / 10 * max |ref| (conv_bf16_spec's native tolerance)
local function conv_close(got, ref, rel, what)
   local g, r = got:double(), ref:double()
   local mx = r:abs():max():item()
   local over = ((g - r):abs() - (r:abs() * rel + (mx + 1e-30) * rel / 10)):max():item()
   assert(over <= 0, ("%s: off by %g beyond the tolerance (max |ref| %g)"):format(what, over, mx))
end

-- fn() with environment variable `name` set to `value` (the kernels read their switches at each
-- call), then unset again
local function with_env(name, value, fn)
   ffi.C.setenv(name, value, 1)
   local ok, err = pcall(fn)
   ffi.C.unsetenv(name)
   if not ok then error(err, 0) end
end

local function bytes(t)
   t = t:contiguous()
   local size = ({ bfloat16 = 2, float16 = 2, float32 = 4, float64 = 8 })[tostring(t:dtype())]
   return ffi.string(C.lm_tensor_data(t._c), t:numel() * size)
end

-- m, n, k: off the tile sizes (16 rows, 16 / 32 columns, 32 k), whole tiles, several k blocks
-- (k > 512), several column blocks (n > 512), the row-block order with its per-thread sums
-- (512 < k <= 1536 with two or more 32-row blocks: { 48, 64, 513 }, { 70, 600, 700 },
-- { 96, 64, 1536 }), and below the AMX path's minimum (m or n < 16, k < 32: the AVX-512
-- kernels, the gate checked too)
local SHAPES = {
   { 1, 1, 1 }, { 2, 3, 17 }, { 3, 17, 33 }, { 17, 17, 32 }, { 16, 16, 32 }, { 17, 31, 33 },
   { 31, 33, 65 }, { 33, 65, 100 }, { 65, 100, 31 }, { 100, 33, 530 }, { 17, 530, 65 },
   { 530, 17, 100 }, { 32, 32, 512 }, { 48, 64, 513 }, { 33, 31, 1100 }, { 65, 100, 1100 },
   { 100, 1100, 40 }, { 31, 530, 1100 }, { 70, 600, 700 }, { 96, 64, 1536 },
}

describe("the bfloat16 GEMM on AMX tiles against float64", function()
   after_each(function()
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.amx = true
      lm.backends.cpu.bf16_winograd = true
   end)

   amx_it("lm.mm: m, n, k off the tile sizes, deep k, wide n, transposed and strided operands",
      function()
      lm.manual_seed(35)
      on_amx(function()
         local lays = { "rm", "t", "rs", "s2", "cm" }
         for si, s in ipairs(SHAPES) do
            local m, n, k = s[1], s[2], s[3]
            -- every shape row-major, and each with one other layout pair in turn
            local la, lb = lays[si % #lays + 1], lays[(si * 2) % #lays + 1]
            for _, ls in ipairs({ { "rm", "rm" }, { la, lb } }) do
               local a, b = operand(m, k, ls[1]), operand(k, n, ls[2])
               local what = ("mm %dx%dx%d a %s b %s"):format(m, n, k, ls[1], ls[2])
               local ref, mag = ref_mm(a, b)
               close_bf16(lm.mm(a, b), ref, mag, k, what)
            end
         end
      end)
   end)

   amx_it("lm.matmul batched (3-D by 3-D, by a broadcast 2-D) and 0-size operands", function()
      lm.manual_seed(36)
      on_amx(function()
         for _, s in ipairs({ { 3, 33, 65, 17 }, { 2, 17, 100, 530 }, { 1, 48, 40, 1100 } }) do
            local B, m, n, k = s[1], s[2], s[3], s[4]
            local a, b = bf({ B, m, k }), bf({ B, k, n })
            local ref, mag = ref_mm(a, b)
            close_bf16(lm.matmul(a, b), ref, mag, k, ("bmm %d x %dx%dx%d"):format(B, m, n, k))
            local w = bf({ k, n })
            ref, mag = ref_mm(a, w)
            close_bf16(lm.matmul(a, w), ref, mag, k, ("broadcast %d x %dx%dx%d"):format(B, m, n, k))
            local at = bf({ B, k, m }):transpose(2, 3)
            ref, mag = ref_mm(at, b)
            close_bf16(lm.matmul(at, b), ref, mag, k, ("bmm transposed a %dx%dx%d"):format(m, n, k))
         end
         -- empty: no rows, no columns, k = 0 (zeros)
         for _, s in ipairs({ { 0, 33, 64 }, { 33, 0, 64 }, { 33, 40, 0 }, { 0, 0, 0 } }) do
            local y = lm.mm(bf({ s[1], s[3] }), bf({ s[3], s[2] }))
            H.assert_sizes(y, { s[1], s[2] }, "0-size")
            assert.equal("bfloat16", tostring(y:dtype()))
            if y:numel() > 0 then assert.equal(0, y:float():abs():max():item()) end
         end
         local y = lm.matmul(bf({ 0, 17, 33 }), bf({ 0, 33, 40 }))
         H.assert_sizes(y, { 0, 17, 40 }, "0 batches")
      end)
   end)

   amx_it("F.linear with a bias (rounded once), forward and gradients", function()
      lm.manual_seed(37)
      on_amx(function()
         for _, s in ipairs({ { 5, 17, 33 }, { 33, 100, 65 }, { 40, 1100, 24 }, { 65, 31, 530 },
                              { 17, 600, 17 } }) do
            local rows, fin, fout = s[1], s[2], s[3]
            local what = ("linear %d x %d -> %d"):format(rows, fin, fout)
            local x, w, b = bf({ 2, rows, fin }), bf({ fout, fin }), bf({ fout })
            local y = F.linear(x, w, b)
            local ref, mag = ref_mm(x, w:t())
            ref = ref + b:double()
            mag = mag + b:double():abs()
            close_bf16(y, ref, mag, fin, what)
            -- gradients (grad_x = g w, grad_w = g^T x: GEMMs with k = fout and k = 2 * rows)
            local xg, wg, bg = x:clone():requires_grad_(true), w:clone():requires_grad_(true),
                               b:clone():requires_grad_(true)
            local g = bf({ 2, rows, fout })
            F.linear(xg, wg, bg):backward(g)
            local gd = g:double()
            local rx, mx = ref_mm(g, w)
            close_bf16(xg.grad, rx, mx, fout, what .. " grad input")
            local g2, x2 = gd:reshape({ 2 * rows, fout }), x:double():reshape({ 2 * rows, fin })
            local rw = g2:t():matmul(x2)
            local mw = g2:abs():t():matmul(x2:abs())
            close_bf16(wg.grad, rw, mw, 2 * rows, what .. " grad weight")
            conv_close(bg.grad, gd:reshape({ 2 * rows, fout }):sum(1), 1e-2, what .. " grad bias")
         end
      end)
   end)

   amx_it("lm_addmm_: out += a b with the sum rounded once (beta = 1)", function()
      lm.manual_seed(38)
      on_amx(function()
         for _, s in ipairs({ { 17, 31, 33 }, { 33, 65, 100 }, { 100, 33, 1100 }, { 16, 530, 64 },
                              { 3, 40, 50 } }) do
            local m, n, k = s[1], s[2], s[3]
            local what = ("addmm %dx%dx%d"):format(m, n, k)
            local a, b, out = bf({ m, k }), bf({ k, n }), bf({ m, n })
            local ref, mag = ref_mm(a, b)
            ref = ref + out:double()
            mag = mag + out:double():abs()
            assert.equal(0, C.lm_addmm_(out._c, a._c, b._c))
            close_bf16(out, ref, mag, k, what)
            -- a transposed left operand
            local at, o2 = bf({ k, m }):t(), bf({ m, n })
            ref, mag = ref_mm(at, b)
            ref, mag = ref + o2:double(), mag + o2:double():abs()
            assert.equal(0, C.lm_addmm_(o2._c, at._c, b._c))
            close_bf16(o2, ref, mag, k, what .. " a transposed")
         end
      end)
   end)

   amx_it("lm_bgemm_strided (float32 C) and lm_bgemm_strided_bf16c: alpha, beta, C layouts",
      function()
      lm.manual_seed(39)
      local u16 = "const uint16_t *"
      on_amx(function()
         local cases = {
            -- m, n, k, alpha, beta, C layout ("rm", "cm" or "rs": rows apart by n + 7)
            { 17, 31, 33, 1, 0, "rm" }, { 33, 65, 100, 0.5, 1, "rm" },
            { 65, 17, 1100, 1, -2, "cm" }, { 100, 530, 65, 2, 0.25, "rs" },
            { 16, 16, 32, 1, 1, "rm" }, { 48, 33, 513, -1, 0, "cm" },
            { 31, 1100, 40, 1, 1, "rs" }, { 2, 3, 17, 1, 1, "rm" },
         }
         for ci, c in ipairs(cases) do
            local m, n, k, alpha, beta, lay = c[1], c[2], c[3], c[4], c[5], c[6]
            local a = operand(m, k, ({ "rm", "t", "s2" })[ci % 3 + 1])
            local b = operand(k, n, ({ "rm", "t", "rs" })[(ci + 1) % 3 + 1])
            for _, out_bf16 in ipairs({ false, true }) do
               local what = ("bgemm %dx%dx%d alpha %g beta %g C %s %s"):format(m, n, k, alpha,
                  beta, lay, out_bf16 and "bf16" or "f32")
               local c0 = randn({ m, n })
               if out_bf16 then c0 = c0:bfloat16() end
               local cst = lay == "cm" and { 1, m } or lay == "rs" and { n + 7, 1 } or { n, 1 }
               local ct
               if lay == "rs" then
                  ct = lm.zeros({ m, n + 7 }, { dtype = c0:dtype(), device = "cpu" })
                          :narrow(2, 1, n)
                  ct:copy_(c0)
               else
                  ct = strided(c0, cst)
               end
               local ref, mag = ref_mm(a, b)
               ref = ref * alpha + c0:double() * beta
               mag = mag * math.abs(alpha) + c0:double():abs() * math.abs(beta)
               local sa, sb = a:stride(), b:stride()
               local pa = ffi.cast(u16, C.lm_tensor_data(a._c))
               local pb = ffi.cast(u16, C.lm_tensor_data(b._c))
               if out_bf16 then
                  C.lm_bgemm_strided_bf16c(m, n, k, alpha, pa, sa[1], sa[2], pb, sb[1], sb[2],
                     beta, ffi.cast("uint16_t *", C.lm_tensor_data(ct._c)), cst[1], cst[2])
               else
                  C.lm_bgemm_strided(m, n, k, alpha, pa, sa[1], sa[2], pb, sb[1], sb[2], beta,
                     ffi.cast("float *", C.lm_tensor_data(ct._c)), cst[1], cst[2])
               end
               local rel, abs_tol = gemm_tols(k, out_bf16)
               assert_gemm_close(ct, ref, mag, rel, abs_tol, what)
               if lay == "rs" then -- the gap between C's rows is never written
                  local base = ct:as_strided({ m, 7 }, { n + 7, 1 }, n)
                  assert.equal(0, base:float():abs():max():item(), what .. ": wrote past n")
               end
            end
         end
      end)
   end)
end)

-- conv2d cases: C, O, H, W, k, stride, pad, dil, batch
local CONVS = {
   { 16, 16, 5, 5, 1, 1, 0, 1, 1 }, { 17, 31, 7, 6, 1, 1, 0, 1, 2 },
   { 31, 17, 9, 8, 1, 2, 0, 1, 3 }, { 48, 80, 6, 7, 1, 1, 1, 1, 1 },
   { 16, 17, 8, 8, 3, 1, 1, 1, 2 }, { 17, 16, 7, 9, 3, 1, 0, 1, 1 },
   { 31, 48, 10, 11, 3, 2, 1, 1, 2 }, { 48, 31, 9, 9, 3, 1, 2, 2, 1 },
   { 64, 17, 12, 10, 3, 2, 2, 2, 3 }, { 80, 64, 6, 6, 3, 1, 1, 1, 1 },
   { 17, 48, 11, 9, 5, 1, 2, 1, 1 }, { 64, 31, 13, 12, 5, 2, 2, 1, 2 },
   { 16, 80, 15, 15, 5, 1, 0, 2, 1 }, { 31, 31, 9, 10, 7, 1, 2, 1, 1 },
   { 17, 64, 15, 14, 7, 2, 1, 1, 2 }, { 48, 16, 13, 13, 7, 1, 2, 2, 1 },
   { 80, 80, 5, 5, 1, 2, 1, 1, 2 }, { 64, 48, 8, 7, 3, 1, 0, 2, 3 },
   -- stride 2 over a wider image (blocks over the padded width), 1x1 stride 2 with no padding
   -- (the GEMM over a row map), 5x5 stride 2 with dilation (backward data by phases)
   { 32, 48, 30, 29, 3, 2, 1, 1, 1 }, { 64, 80, 14, 15, 1, 2, 0, 1, 2 },
   { 48, 33, 15, 13, 5, 2, 2, 2, 1 },
   -- weights past one 512 KiB chunk of packed panels (96 padded columns x 9 taps x 320)
   { 320, 80, 6, 5, 3, 1, 1, 1, 1 },
   -- stride 3 (blocks over the padded width read past the last image: the copy's margin), even
   -- kernels, rows of x that no output reads (backward data's phases run past grad_out)
   { 32, 32, 20, 22, 3, 3, 1, 1, 2 }, { 16, 48, 17, 16, 5, 3, 2, 1, 1 },
   { 40, 36, 10, 10, 4, 2, 1, 1, 1 }, { 24, 40, 9, 9, 2, 2, 0, 1, 1 },
   { 32, 32, 10, 10, 1, 3, 0, 1, 1 }, { 16, 16, 8, 8, 3, 3, 0, 1, 2 },
}

-- few input channels (the stem's form on AMX: kernel rows of at most 64 values, one or two tile
-- steps, dense along W; its backward data stays on the AVX-512 kernels): C, O, H, W, k, stride,
-- pad, dil, batch. Two steps: 9 x 7 = 63 values (conv3d's stem, 3 depth taps of 3 channels
-- folded), 5 x 9 = 45, 12 x 5 = 60, 8 x 8 = 64; 13 x 5 = 65 is past it (the AVX-512 kernels)
local STEMS = {
   { 3, 64, 15, 14, 7, 2, 3, 1, 2 }, { 3, 16, 9, 9, 3, 1, 1, 1, 1 },
   { 4, 17, 11, 10, 5, 2, 2, 1, 1 }, { 7, 31, 10, 9, 3, 2, 0, 1, 3 },
   { 2, 48, 8, 8, 7, 1, 3, 2, 1 }, { 15, 32, 7, 7, 1, 1, 0, 1, 2 },
   { 8, 40, 12, 12, 4, 1, 1, 1, 1 }, { 3, 32, 20, 20, 7, 3, 3, 1, 1 },
   { 9, 64, 16, 15, 7, 2, 3, 1, 2 }, { 5, 24, 12, 12, 9, 1, 4, 1, 1 },
   { 12, 33, 9, 10, 5, 2, 2, 1, 1 }, { 8, 16, 11, 11, 8, 1, 3, 1, 1 },
   { 13, 32, 8, 8, 5, 1, 2, 1, 1 },
}

local function conv_name(c, fmt)
   return ("C%d O%d %dx%d k%d s%d p%d d%d N%d %s"):format(c[1], c[2], c[3], c[4], c[5], c[6],
      c[7], c[8], c[9], fmt)
end

-- x, w, b, opts of one case; x and w channels-last for "cl", contiguous for "contig"
local function conv_inputs(c, fmt)
   local mf = fmt == "cl" and CL or CONTIG
   local x = randn({ c[9], c[1], c[3], c[4] }):contiguous(mf):bfloat16()
   local w = (randn({ c[2], c[1], c[5], c[5] }) / math.sqrt(c[1] * c[5] * c[5]))
                :contiguous(mf):bfloat16()
   local b = bf({ c[2] })
   return x, w, b, { stride = c[6], padding = c[7], dilation = c[8] }
end

-- forward (bias; bias + residual + ReLU) and backward (data, weight, bias) against float64;
-- returns the bfloat16 results for the switch's comparison
local function conv_check(c, fmt, what)
   local x, w, b, opts = conv_inputs(c, fmt)
   local xd, wd, bd = x:double(), w:double(), b:double()
   local y = F.conv2d(x, w, b, opts)
   local ref = F.conv2d(xd, wd, bd, opts)
   assert.equal("bfloat16", tostring(y:dtype()))
   H.assert_sizes(y, ref:size(), what)
   assert.equal(fmt == "cl", is_cl(y), what .. ": output format")
   conv_close(y, ref, 1e-2, what .. " forward")
   local r = bf(y:size())
   if fmt == "cl" then r = r:contiguous(CL) end
   local fused = { stride = c[6], padding = c[7], dilation = c[8], residual = r, relu = true }
   local yr = F.conv2d(x, w, b, fused)
   local refr = F.conv2d(xd, wd, bd, { stride = c[6], padding = c[7], dilation = c[8],
                                       residual = r:double(), relu = true })
   assert(refr:abs():max():item() > 0)
   conv_close(yr, refr, 1e-2, what .. " residual + relu")
   local g = bf(y:size())
   if fmt == "cl" then g = g:contiguous(CL) end
   local xg, wg, bg = x:clone():requires_grad_(true), w:clone():requires_grad_(true),
                      b:clone():requires_grad_(true)
   F.conv2d(xg, wg, bg, opts):backward(g)
   local xr, wr, br = xd:clone():requires_grad_(true), wd:clone():requires_grad_(true),
                      bd:clone():requires_grad_(true)
   F.conv2d(xr, wr, br, opts):backward(g:double())
   for _, p in ipairs({ { xg, xr, "grad input" }, { wg, wr, "grad weight" },
                        { bg, br, "grad bias" } }) do
      assert.equal("bfloat16", tostring(p[1].grad:dtype()), what .. " " .. p[3])
      H.assert_sizes(p[1].grad, p[2].grad:size(), what .. " " .. p[3])
      conv_close(p[1].grad, p[2].grad, 1e-2, what .. " " .. p[3])
   end
   if fmt == "cl" then assert(is_cl(xg.grad), what .. ": grad input channels-last") end
   return { y, yr, xg.grad, wg.grad, bg.grad }
end

describe("conv2d in bfloat16 on AMX tiles against float64", function()
   after_each(function()
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.amx = true
      lm.backends.cpu.bf16_winograd = true
   end)

   for _, fmt in ipairs({ "cl", "contig" }) do
      amx_it(("forward with bias / residual / ReLU, backward data and weight (%s)"):format(fmt),
         function()
         lm.manual_seed(350)
         on_amx(function()
            for _, c in ipairs(CONVS) do conv_check(c, fmt, conv_name(c, fmt)) end
         end)
      end)
   end

   amx_it("few input channels (the stem), channels-last: forward, epilogues, backward", function()
      lm.manual_seed(354)
      on_amx(function()
         for _, c in ipairs(STEMS) do conv_check(c, "cl", conv_name(c, "cl") .. " stem") end
      end)
   end)

   amx_it("non-square kernels, strides and padding per axis, channels-last", function()
      lm.manual_seed(355)
      on_amx(function()
         -- C, O, H, W, batch; kernel, stride, padding, dilation per axis
         for gi, q in ipairs({
            { 17, 33, 9, 11, 2, k = { 1, 3 }, s = { 1, 2 }, p = { 0, 1 }, d = { 1, 1 } },
            { 32, 16, 10, 7, 1, k = { 3, 1 }, s = { 2, 1 }, p = { 2, 0 }, d = { 1, 1 } },
            { 48, 31, 11, 12, 1, k = { 2, 3 }, s = { 1, 1 }, p = { 0, 1 }, d = { 2, 1 } },
            { 3, 32, 12, 13, 2, k = { 5, 3 }, s = { 2, 2 }, p = { 2, 1 }, d = { 2, 1 } },
         }) do
            local what = ("geometry %d C%d O%d"):format(gi, q[1], q[2])
            local x = randn({ q[5], q[1], q[3], q[4] }):contiguous(CL):bfloat16()
            local w = (randn({ q[2], q[1], q.k[1], q.k[2] }) / math.sqrt(q[1] * q.k[1] * q.k[2]))
                        :contiguous(CL):bfloat16()
            local b = bf({ q[2] })
            local opts = { stride = q.s, padding = q.p, dilation = q.d }
            local xd, wd = x:double(), w:double()
            local y = F.conv2d(x, w, b, opts)
            conv_close(y, F.conv2d(xd, wd, b:double(), opts), 1e-2, what .. " forward")
            local xg, wg = x:clone():requires_grad_(true), w:clone():requires_grad_(true)
            local g = bf(y:size()):contiguous(CL)
            F.conv2d(xg, wg, nil, opts):backward(g)
            local xr, wr = xd:clone():requires_grad_(true), wd:clone():requires_grad_(true)
            F.conv2d(xr, wr, nil, opts):backward(g:double())
            conv_close(xg.grad, xr.grad, 1e-2, what .. " grad input")
            conv_close(wg.grad, wr.grad, 1e-2, what .. " grad weight")
         end
      end)
   end)

   amx_it("a ResNet-like 64 -> 64 3x3 layer at 28x28, channels-last, batch 2; outputs written " ..
      "with and without streaming stores (LUMEN_CONV_STREAM=1 / 0)", function()
      lm.manual_seed(351)
      on_amx(function()
         local c = { 64, 64, 28, 28, 3, 1, 1, 1, 2 }
         conv_check(c, "cl", "resnet 64->64 3x3 28x28")
         for _, v in ipairs({ "1", "0" }) do
            with_env("LUMEN_CONV_STREAM", v, function()
               conv_check(c, "cl", "resnet 64->64 3x3 28x28 LUMEN_CONV_STREAM=" .. v)
               conv_check({ 64, 64, 28, 28, 1, 1, 0, 1, 2 }, "cl",
                          "resnet 64->64 1x1 28x28 LUMEN_CONV_STREAM=" .. v)
            end)
         end
      end)
   end)

   amx_it("empty batches and grouped / depthwise layers (not AMX's: the AVX-512 kernels)",
      function()
      on_amx(function()
         local x = randn({ 0, 32, 6, 6 }):contiguous(CL):bfloat16()
         local w = bf({ 48, 32, 3, 3 }):contiguous(CL)
         local y = F.conv2d(x, w, nil, { padding = 1 })
         H.assert_sizes(y, { 0, 48, 6, 6 }, "empty batch")
         for _, gr in ipairs({ 2, 32 }) do
            local xx = randn({ 2, 32, 7, 7 }):contiguous(CL):bfloat16()
            local ww = bf({ 32, 32 / gr, 3, 3 }):contiguous(CL)
            local o = { padding = 1, groups = gr }
            conv_close(F.conv2d(xx, ww, nil, o), F.conv2d(xx:double(), ww:double(), nil, o), 1e-2,
                       "groups " .. gr)
         end
      end)
   end)
end)

describe("lm.backends.cpu.amx and lm.backends.cpu.isa()", function()
   if os.getenv("LUMEN_EXPECT_AMX") == "1" then
      -- make test-amx-emu / asan-amx-emu: the emulated tiles must be there (an AVX512_BF16 CPU),
      -- or every kernel spec above would be pending and the stage would check nothing
      it("has AMX in this process (LUMEN_EXPECT_AMX=1): isa() is \"amx\"", function()
         assert(AMX, "LUMEN_EXPECT_AMX=1 but lm.backends.cpu.amx_available() is false (the " ..
                "emulated build needs an AVX512_BF16 CPU; LUMEN_LIB=" ..
                tostring(os.getenv("LUMEN_LIB")) .. ")")
         C.lm_cpu_set_isa(C.LM_ISA_AUTO)
         assert.equal("amx", lm.backends.cpu.isa())
      end)
   end

   after_each(function()
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.amx = true
      lm.backends.cpu.bf16_winograd = true
   end)

   it("isa() names the level lm_cpu_set_isa chose; amx_available() agrees with the levels",
      function()
      local names = { "c", "avx2", "avx512", "avx512_bf16", "amx" }
      local best = C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      assert.equal(names[best], lm.backends.cpu.isa())
      assert.equal(AMX, best == C.LM_ISA_AMX)
      assert.equal("boolean", type(lm.backends.cpu.amx_available()))
      for lv = best, C.LM_ISA_C, -1 do
         assert.equal(lv, C.lm_cpu_set_isa(lv))
         assert.equal(names[lv], lm.backends.cpu.isa())
      end
      -- the switch leaves the level alone: isa() says "amx", the bf16 kernels are AVX-512's
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.amx = false
      assert.equal(false, lm.backends.cpu.amx)
      assert.equal(names[best], lm.backends.cpu.isa())
      lm.backends.cpu.amx = true
      assert.equal(true, lm.backends.cpu.amx)
      assert.equal("unknown", ffi.string(C.lm_cpu_isa_name(42)))
   end)

   amx_it("amx = false and amx = true give the same values within the bfloat16 tolerance",
      function()
      lm.manual_seed(352)
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.bf16_winograd = false -- the direct kernels beside the tiles (on_amx)
      for _, c in ipairs({ CONVS[2], CONVS[7], CONVS[10], CONVS[14] }) do
         local x, w, b, opts = conv_inputs(c, "cl")
         local a1, b1 = bf({ 33, 100 }), bf({ 100, 65 })
         local function run()
            local xg = x:clone():requires_grad_(true)
            local wg = w:clone():requires_grad_(true)
            local y = F.conv2d(xg, wg, b, opts)
            y:backward(y:detach())
            return { y, xg.grad, wg.grad, lm.mm(a1, b1) }
         end
         lm.backends.cpu.amx = false
         local off = run()
         lm.backends.cpu.amx = true
         local on = run()
         for i = 1, #on do
            conv_close(on[i], off[i], 2e-2, conv_name(c, "cl") .. " switch result " .. i)
         end
      end
   end)

   amx_it("fp32_precision = \"bf16\": float32 convolutions and products on the tiles from "
          .. "bfloat16-rounded operands, float32 results, against float64", function()
      lm.manual_seed(353)
      on_amx(function()
         local function rel(a, b)
            return (a:double() - b:double()):abs():max():item() /
                   (b:double():abs():max():item() + 1e-30)
         end
         for _, c in ipairs({ CONVS[2], CONVS[5], CONVS[7], CONVS[12], CONVS[20] }) do
            local opts = { stride = c[6], padding = c[7], dilation = c[8] }
            local x = lm.randn({ c[9], c[1], c[3], c[4] }):contiguous(lm.channels_last)
            local w = (lm.randn({ c[2], c[1], c[5], c[5] }) * 0.2):contiguous(lm.channels_last)
            local b = lm.randn({ c[2] })
            local ref = F.conv2d(x:double(), w:double(), b:double(), opts)
            local g = lm.randn(ref:size()):contiguous(lm.channels_last)
            local xd, wd = x:double():requires_grad_(true), w:double():requires_grad_(true)
            F.conv2d(xd, wd, nil, opts):backward(g:double())
            lm.backends.cpu.fp32_precision = "bf16"
            local ok, err = pcall(function()
               local xg, wg, bg = x:clone():requires_grad_(true), w:clone():requires_grad_(true),
                                  b:clone():requires_grad_(true)
               local y = F.conv2d(xg, wg, bg, opts)
               assert.equal(tostring(lm.float32), tostring(y:dtype()))
               assert.is_true(y:is_contiguous(lm.channels_last))
               y:backward(g)
               local what = conv_name(c, "cl") .. " fp32_precision bf16"
               assert(rel(y, ref) < 1e-2, what .. ": output " .. rel(y, ref))
               assert(rel(xg.grad, xd.grad) < 1e-2, what .. ": grad input")
               assert(rel(wg.grad, wd.grad) < 1e-2, what .. ": grad weight")
               -- the bias gradient stays an exact float32 sum
               assert(rel(bg.grad, g:double():sum({ 1, 3, 4 })) < 1e-5, what .. ": grad bias")
            end)
            lm.backends.cpu.fp32_precision = "ieee"
            if not ok then error(err, 0) end
         end
         local a, bm = lm.randn({ 70, 300 }), lm.randn({ 300, 90 })
         local refm = lm.mm(a:double(), bm:double())
         local ieee = lm.mm(a, bm):clone()
         lm.backends.cpu.fp32_precision = "bf16"
         local m = lm.mm(a, bm):clone()
         lm.backends.cpu.fp32_precision = "ieee"
         assert.equal(tostring(lm.float32), tostring(m:dtype()))
         assert(rel(m, refm) < 1e-2, "mm fp32_precision bf16 " .. rel(m, refm))
         assert(rel(m, refm) > 1e-5, "mm fp32_precision bf16 ran in float32 " .. rel(m, refm))
         assert(rel(ieee, refm) < 1e-4, "mm ieee " .. rel(ieee, refm))
         local ok, err = pcall(function() lm.backends.cpu.fp32_precision = "tf32" end)
         assert.is_false(ok)
         assert.matches('expected "ieee" or "bf16"', err, 1, true)
         assert.equal("ieee", lm.backends.cpu.fp32_precision)
      end)
   end)

   it("rejects values that are not booleans, and bad levels / options in C", function()
      for _, v in ipairs({ 1, 0, "true", {} }) do
         local ok, err = pcall(function() lm.backends.cpu.amx = v end)
         assert.is_false(ok)
         assert.truthy(tostring(err):find("lumen.backends.cpu.amx: expected a boolean", 1, true))
      end
      assert.equal(true, lm.backends.cpu.amx)
      local ok, err = pcall(function() lm.backends.cpu.amx_on = true end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("no setting named 'amx_on'", 1, true))
      -- lm_cpu_set_option: 0 or 1 only; an unknown option
      assert.are_not.equal(0, C.lm_cpu_set_option(C.LM_CPU_OPT_AMX, 2))
      assert.truthy(ffi.string(C.lm_last_error()):find("0 or 1", 1, true))
      assert.are_not.equal(0, C.lm_cpu_set_option(C.LM_CPU_NUM_OPTS, 1))
      C.lm_clear_error()
      assert.equal(true, lm.backends.cpu.amx)
      -- lm_cpu_set_isa: a level outside the enum changes nothing
      local best = C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      assert.equal(best, C.lm_cpu_set_isa(C.LM_ISA_MAX + 1))
      assert.equal(best, C.lm_cpu_set_isa(-1))
   end)
end)

describe("AMX refused by Linux (LUMEN_AMX_TEST_DENY=1) and off from the start (LUMEN_AMX=0)",
   function()
   local dir = os.tmpname()
   setup(function() os.remove(dir); os.execute("mkdir -p " .. dir) end)
   teardown(function() os.execute("rm -rf " .. dir) end)

   -- bin/lumen -e CODE with the given environment, on the CPU; returns its output
   local function child(env, code)
      local cmd = ("LUMEN_DEFAULT_DEVICE= LUMEN_AMX= LUMEN_AMX_TEST_DENY= %s bin/lumen -e '%s' " ..
                   "2>&1; echo \"exit=$?\""):format(env, code)
      local p = assert(io.popen(cmd))
      local out = p:read("*a")
      p:close()
      assert(out:match("exit=0%s*$"), "the child failed:\n" .. out)
      return out
   end

   -- the child: report amx_available(), isa(), the switch; run the inputs' conv2d (forward,
   -- backward) and mm, save the results
   local CHILD = table.concat({
      "local t = lm.load(\"%s/in.safetensors\")",
      "print(\"available=\" .. tostring(lm.backends.cpu.amx_available()))",
      "print(\"isa=\" .. lm.backends.cpu.isa())",
      "print(\"switch=\" .. tostring(lm.backends.cpu.amx))",
      "local x = t.x:clone():requires_grad_(true)",
      "local w = t.w:clone():requires_grad_(true)",
      "local y = lm.F.conv2d(x, w, t.b, { padding = 1, residual = t.r, relu = true })",
      "local y2 = lm.F.conv2d(x, w, t.b, { padding = 1 })",
      "y2:backward(t.g)",
      "lm.save({ y = y, y2 = y2, gx = x.grad, gw = w.grad, mm = lm.mm(t.a, t.bm) },",
      "        \"%s/out.safetensors\")",
   }, " ")

   local function results(t)
      local x = t.x:clone():requires_grad_(true)
      local w = t.w:clone():requires_grad_(true)
      local y = F.conv2d(x, w, t.b, { padding = 1, residual = t.r, relu = true })
      local y2 = F.conv2d(x, w, t.b, { padding = 1 })
      y2:backward(t.g)
      return { y = y, y2 = y2, gx = x.grad, gw = w.grad, mm = lm.mm(t.a, t.bm) }
   end

   it("refused: no AMX, the AVX512_BF16 level, and the bits of amx = false here", function()
      lm.manual_seed(353)
      local x = randn({ 2, 48, 9, 9 }):contiguous(CL):bfloat16()
      local inputs = {
         x = x, w = (randn({ 40, 48, 3, 3 }) * 0.1):contiguous(CL):bfloat16(), b = bf({ 40 }),
         r = randn({ 2, 40, 9, 9 }):contiguous(CL):bfloat16(),
         g = randn({ 2, 40, 9, 9 }):contiguous(CL):bfloat16(),
         a = bf({ 33, 100 }), bm = bf({ 100, 65 }),
      }
      lm.save(inputs, dir .. "/in.safetensors")
      -- without AMX in use the bfloat16 kernels are chosen by a timed probe, once per process
      -- (vdpbf16ps against FMA, kernels/cpu/probe_avx512bf16.c): the child is given this
      -- process's answer, so that both run the same kernels whatever the machine's load
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      local dot = ""
      local okp, pays = pcall(function()
         pcall(ffi.cdef, "int lm_cpu_bf16_dot_pays(void);")
         return C.lm_cpu_bf16_dot_pays()
      end)
      if okp then dot = "LUMEN_BF16_DOT=" .. tostring(pays) end
      local out = child("LUMEN_AMX_TEST_DENY=1 " .. dot, CHILD:format(dir, dir))
      assert.truthy(out:find("available=false", 1, true), out)
      assert.falsy(out:find("isa=amx", 1, true), out)
      local best = C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      if best >= C.LM_ISA_AVX512_BF16 then
         assert.truthy(out:find("isa=avx512_bf16", 1, true), out)
      end
      local got = lm.load(dir .. "/out.safetensors")
      lm.backends.cpu.amx = false
      local ok, want = pcall(results, lm.load(dir .. "/in.safetensors"))
      lm.backends.cpu.amx = true
      assert(ok, want)
      for _, k in ipairs({ "y", "y2", "gx", "gw", "mm" }) do
         H.assert_sizes(got[k], want[k]:size(), k)
         assert.equal(tostring(want[k]:dtype()), tostring(got[k]:dtype()), k)
         assert(bytes(got[k]) == bytes(want[k]), k .. ": the refused process's result differs " ..
                "from amx = false's here")
      end
   end)

   it("LUMEN_AMX=0: the switch starts off, AMX stays available", function()
      local out = child("LUMEN_AMX=0", "print(\"switch=\" .. tostring(lm.backends.cpu.amx)); " ..
                        "print(\"available=\" .. tostring(lm.backends.cpu.amx_available()))")
      assert.truthy(out:find("switch=false", 1, true), out)
      assert.truthy(out:find("available=" .. tostring(AMX), 1, true), out)
      out = child("", "print(\"switch=\" .. tostring(lm.backends.cpu.amx))")
      assert.truthy(out:find("switch=true", 1, true), out)
   end)
end)

-- conv3d on the tiles (LM_OP_CONV3D, "conv3d_amx_bf16": kernels/cpu/conv_bf16_amx.c's engine
-- with the depth taps as more taps of one padded copy; src/ops/conv3d.c asks the CPU's
-- supports_op first): bfloat16 channels_last_3d with every depth tap live. N, C, D, H, W, O,
-- kernel, stride, padding, dilation
local CONV3DS = {
   { 2, 3, 6, 20, 18, 64, { 3, 7, 7 }, { 1, 2, 2 }, { 1, 3, 3 }, { 1, 1, 1 } }, -- r3d's stem
   { 1, 16, 5, 9, 9, 16, { 3, 3, 3 }, { 1, 1, 1 }, { 1, 1, 1 }, { 1, 1, 1 } },
   { 2, 20, 6, 7, 8, 33, { 3, 3, 3 }, { 2, 2, 2 }, { 1, 1, 1 }, { 1, 1, 1 } },
   { 1, 32, 4, 6, 6, 48, { 2, 3, 3 }, { 1, 1, 1 }, { 0, 1, 1 }, { 1, 1, 1 } },
   { 1, 17, 7, 8, 9, 31, { 3, 2, 3 }, { 2, 1, 2 }, { 2, 0, 1 }, { 2, 1, 1 } },
   { 2, 64, 4, 5, 5, 64, { 3, 1, 1 }, { 1, 1, 1 }, { 1, 0, 0 }, { 1, 1, 1 } },  -- (2+1)-D temporal
   { 1, 40, 5, 10, 10, 16, { 3, 3, 3 }, { 1, 1, 1 }, { 1, 2, 2 }, { 1, 2, 2 } },
   { 1, 5, 4, 7, 9, 24, { 2, 3, 9 }, { 1, 1, 1 }, { 1, 1, 4 }, { 1, 1, 1 } },   -- 45-value rows
}

describe("conv3d in bfloat16 on AMX tiles against float64", function()
   after_each(function()
      C.lm_cpu_set_isa(C.LM_ISA_AUTO)
      lm.backends.cpu.amx = true
      lm.backends.cpu.bf16_winograd = true
   end)

   local function c3name(c)
      return ("N%d C%d %dx%dx%d O%d k%s s%s p%s d%s"):format(c[1], c[2], c[3], c[4], c[5], c[6],
         table.concat(c[7], "x"), table.concat(c[8], ""), table.concat(c[9], ""),
         table.concat(c[10], ""))
   end

   amx_it("forward with bias, and residual + ReLU in the epilogue; channels_last_3d out",
      function()
      lm.manual_seed(360)
      on_amx(function()
         for _, c in ipairs(CONV3DS) do
            local what = c3name(c)
            local x = randn({ c[1], c[2], c[3], c[4], c[5] }):contiguous(lm.channels_last_3d)
                         :bfloat16()
            local w = (randn({ c[6], c[2], c[7][1], c[7][2], c[7][3] }) /
                       math.sqrt(c[2] * c[7][1] * c[7][2] * c[7][3]))
                         :contiguous(lm.channels_last_3d):bfloat16()
            local b = bf({ c[6] })
            local opts = { stride = c[8], padding = c[9], dilation = c[10] }
            local y = F.conv3d(x, w, b, opts)
            local ref = F.conv3d(x:double(), w:double(), b:double(), opts)
            H.assert_sizes(y, ref:size(), what)
            assert.equal("bfloat16", tostring(y:dtype()))
            assert(y:is_contiguous(lm.channels_last_3d), what .. ": channels_last_3d")
            conv_close(y, ref, 1e-2, what .. " forward")
            local r = bf(y:size()):contiguous(lm.channels_last_3d)
            local yr = F.conv3d(x, w, b, { stride = c[8], padding = c[9], dilation = c[10],
                                           residual = r, relu = true })
            local refr = (ref + r:double()):clamp(0)
            conv_close(yr, refr, 1e-2, what .. " residual + relu")
            -- the conv2d route (the implementation switched off): the same within bfloat16
            lm.backends.cpu.disable("conv3d_amx_bf16")
            local y2 = F.conv3d(x, w, b, opts)
            lm.backends.cpu.enable("conv3d_amx_bf16")
            conv_close(y2, ref, 1e-2, what .. " conv2d route")
         end
      end)
   end)

   amx_it("LUMEN_VERBOSE names conv3d_amx_bf16; what it does not take keeps the conv2d route",
      function()
      local code = "local lm = require(\"lumen\"); local F = lm.F; " ..
         "local CL3 = lm.channels_last_3d; " ..
         "local x = lm.randn({1, 32, 4, 6, 6}):contiguous(CL3):bfloat16(); " ..
         "local w = lm.randn({32, 32, 3, 3, 3}):contiguous(CL3):bfloat16(); " ..
         "F.conv3d(x, w, nil, {padding = 1}); " ..                        -- native
         "F.conv3d(x, w, nil, {padding = {0, 1, 1}}); " ..                -- depth 4 -> 2: native
         "F.conv3d(x:float(), w:float(), nil, {padding = 1}); " ..        -- float32: conv2d
         "F.conv3d(x, w:narrow(3, 2, 1), nil, {padding = {0, 1, 1}})"     -- kernel depth 1: conv2d
      local p = assert(io.popen("LUMEN_DEFAULT_DEVICE= LUMEN_AMX= LUMEN_VERBOSE=1 bin/lumen -e '" ..
                                code .. "' 2>&1"))
      local out = p:read("*a")
      p:close()
      local native = 0
      for _ in out:gmatch("exec,cpu,conv3d,conv3d_amx_bf16,bfloat16,channels_last_3d") do
         native = native + 1
      end
      assert.equal(2, native, out)
      assert.truthy(out:find("plan,cpu,conv3d,conv3d_per_tap,float32", 1, true) or
                    out:find("plan,cpu,conv3d,conv3d_packed_taps,float32", 1, true), out)
      -- 16 channels and a spatial kernel: the float32 route pays more than the tiles
      local code16 = "local lm = require(\"lumen\"); local CL3 = lm.channels_last_3d; " ..
         "local x = lm.randn({1, 16, 4, 6, 6}):contiguous(CL3):bfloat16(); " ..
         "local w = lm.randn({16, 16, 3, 3, 3}):contiguous(CL3):bfloat16(); " ..
         "lm.F.conv3d(x, w, nil, {padding = 1})"
      p = assert(io.popen("LUMEN_DEFAULT_DEVICE= LUMEN_AMX= LUMEN_CONV_AMX= LUMEN_VERBOSE=1 " ..
                          "bin/lumen -e '" .. code16 .. "' 2>&1"))
      out = p:read("*a")
      p:close()
      assert.falsy(out:find("conv3d_amx_bf16", 1, true), out)
      assert.truthy(out:find("plan,cpu,conv3d,conv3d_packed_taps,bfloat16", 1, true), out)
   end)
end)
