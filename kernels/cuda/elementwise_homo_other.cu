/* elementwise_homo_other.cu -- the dense elementwise kernels (elementwise_impl.cuh: HomoBody) of the
 * LM_EW_OTHER table, one instantiation per (op, kind, storage dtype); a file of their own so the three
 * tables compile in parallel. */
#include "elementwise_impl.cuh"

namespace lmew {
lm_status homo_other(const HomoLaunch &l, int op) { return homo_dispatch<LM_EW_OTHER, 0>(l, op); }
} /* namespace lmew */
