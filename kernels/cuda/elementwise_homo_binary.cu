/* elementwise_homo_binary.cu -- the dense elementwise kernels (elementwise_impl.cuh: HomoBody) of the
 * LM_EW_BINARY table, one instantiation per (op, kind, storage dtype); a file of their own so the three
 * tables compile in parallel. */
#include "elementwise_impl.cuh"

namespace lmew {
lm_status homo_binary(const HomoLaunch &l, int op) { return homo_dispatch<LM_EW_BINARY, 0>(l, op); }
} /* namespace lmew */
