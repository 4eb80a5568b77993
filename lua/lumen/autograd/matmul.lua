-- lumen.autograd.matmul -- the backward rule of matmul / mm (1-D operands promoted to matrices,
-- batched and broadcast operands reduced back to their shapes). Loading it replaces those
-- methods of lumen.tensor's Tensor table with differentiable versions over the raw forward
-- function (lumen.tensor.raw); lumen.autograd loads it once.

local dtypes = require("lumen.dtype")
local T = require("lumen.tensor")
local G = require("lumen.autograd.graph")

local Tensor, raw = T.Tensor, T.raw
local grad_enabled = G.is_grad_enabled
local needs, edge, attach, sizes_of, sum_to = G.needs, G.edge, G.attach, G.sizes_of, G.sum_to

do
   local r_matmul, r_t, r_reshape = raw.matmul, raw.transpose, raw.reshape
   local function rec_matmul(out, self, other)
      local ac, bc = self._c, other._c
      local a_sizes, b_sizes = sizes_of(ac), sizes_of(bc)
      local na, nb = ac.ndim, bc.ndim
      local need_a, need_b = needs(self), needs(other)
      local a_dt, b_dt = ac.dtype, bc.dtype
      attach(out, "MmBackward", function(g)
         -- promote 1-D operands to matrices, then use the 2-D / batched formulas
         local a2, b2 = self, other
         if na == 1 then a2 = r_reshape(self, { 1, a_sizes[1] }) end
         if nb == 1 then b2 = r_reshape(other, { b_sizes[1], 1 }) end
         -- g has the shape of a2 @ b2 with the promoted dims removed
         local gs = sizes_of(g._c)
         if na == 1 then table.insert(gs, #gs - (nb == 1 and 0 or 1) + 1, 1) end
         if nb == 1 then gs[#gs + 1] = 1 end
         local g2 = r_reshape(g, gs)
         local ga, gb
         if need_a then
            ga = r_matmul(g2, r_t(b2, -1, -2))
            ga = sum_to(ga, { ndim = na == 1 and 2 or na,
                              sizes = na == 1 and { 1, a_sizes[1] } or a_sizes,
                              dtype = dtypes.from_id(a_dt) })
            if na == 1 then ga = r_reshape(ga, a_sizes) end
         end
         if need_b then
            gb = r_matmul(r_t(a2, -1, -2), g2)
            gb = sum_to(gb, { ndim = nb == 1 and 2 or nb,
                              sizes = nb == 1 and { b_sizes[1], 1 } or b_sizes,
                              dtype = dtypes.from_id(b_dt) })
            if nb == 1 then gb = r_reshape(gb, b_sizes) end
         end
         return ga, gb
      end, { edge(self), edge(other) })
   end
   function Tensor.matmul(self, other)
      local out = r_matmul(self, other)
      if grad_enabled() and (needs(self) or needs(other)) then rec_matmul(out, self, other) end
      return out
   end
   Tensor.mm = Tensor.matmul
end
