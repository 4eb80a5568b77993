-- lumen.functional -- lm.nn.functional (alias lm.F): convolution, pooling, batch norm,
-- activations, linear, dropout, softmax and losses, each with its backward.
--
-- The kernels live in C (src/conv.h, src/nn.h); the operators validate their arguments (errors
-- are "lumen.<fn>: ..."), pick memory formats the way PyTorch does (memory_format.md section 7)
-- and record the autograd node. One file per family in lua/lumen/functional/, each adding its
-- operators to the one lm.F table (functional/common.lua, which also holds the argument checks
-- they share). Index conventions follow the Lua API: class targets of nll_loss / cross_entropy
-- and the indices returned by the max pools are 1-BASED (the C kernels are 0-based; the
-- conversion happens in the families).

local H = require("lumen.functional.common")

require("lumen.functional.conv")        -- conv1d, conv2d, conv3d
require("lumen.functional.pool")        -- max / avg / adaptive pools, 1-D, 2-D and 3-D
require("lumen.functional.norm")        -- batch_norm
require("lumen.functional.activation")  -- relu, sigmoid, tanh, softmax, log_softmax
require("lumen.functional.linear")      -- linear
require("lumen.functional.dropout")     -- dropout
require("lumen.functional.shape")       -- flatten, cat
require("lumen.functional.pad")         -- pad, pixel_shuffle, pixel_unshuffle, channel_shuffle
require("lumen.functional.resample")    -- interpolate (upsample)
require("lumen.functional.conv_transpose") -- conv_transpose1d, conv_transpose2d, conv_transpose3d
require("lumen.functional.loss")        -- nll_loss, cross_entropy, mse_loss
-- l1_loss, smooth_l1_loss, huber_loss, binary_cross_entropy(_with_logits), kl_div
require("lumen.functional.loss_pointwise")
-- logsigmoid, softsign, tanhshrink, softshrink, hardshrink, threshold, glu, prelu, softmin
require("lumen.functional.activation_composed")
require("lumen.functional.vector")      -- normalize, cosine_similarity, pairwise_distance, one_hot

local F = H.F

-- private, kept for scripts that used them: the 2-D size parser and math.floor
F._pair = function(fname, v, what, default, min)
   return H.ntuple(2, fname, v, what, default, min)
end
F._floor = math.floor

return F
