/*
 * pool.c -- max / average / adaptive pooling over 2-D planes, forward and backward: the CPU
 * kernels of the pooling ops (src/ops/pool.h; front ends: src/ops/pool.c, which check the
 * arguments, allocate every result and make every operand dense in mf).
 *
 * Layout (spec section 7): mf = x.suggest_memory_format(); output, indices and grad_input are
 * allocated in mf. Channels-last runs NHWC kernels whose inner loop walks the channels with unit
 * stride (vectorized; float32 under AVX-512 has its own kernels, pool_nhwc_v512.c),
 * contiguous runs NCHW kernels over planes (max_pool2d / avg_pool2d forward vectorized along the
 * output row, one pass per window tap). An input that is not dense in mf is cloned into mf once
 * (by the front end).
 * Windows are precomputed per output row / column, so max_pool2d and adaptive_max_pool2d share
 * the NHWC kernel and the backward, avg_pool2d and adaptive_avg_pool2d likewise.
 *
 * max_pool2d's backward also comes with the window geometry (lm_max_pool2d_backward_geom, and
 * lm_max_pool2d_taps_backward for the uint8 tap numbers lm_max_pool2d_taps saves instead of int64
 * indices): channels-last then gathers, each input pixel summing the windows that have it as a tap
 * (lists per input row / column, tap_lists) in window order, bit-identical to the scatter.
 *
 * The files: pool_geom.h (the window rules and launch helpers the 2-D and 3-D pools share),
 * pool2d.h (the geometry of one op: pool_t, the windows of every output row and column, the tap
 * lists of the backward), pool_max.c (max_pool2d and adaptive_max_pool2d: portable kernels, their
 * AVX-512 copies, the drivers), pool_avg.c (avg_pool2d and adaptive_avg_pool2d, likewise),
 * pool_nhwc_v512.c (the AVX-512 float kernels for channels-last) and this file (the kernel
 * table). The adaptive pools have no kernels of their own: their windows (pool_window's adaptive
 * rule) run through the max and average kernels. Max pooling's semantics: pool_max.c.
 */
#include "pool2d.h"

/* ------------------------------------------------------------------------------------------ */
/* the kernel table                                                                           */

/* the kernels of the table: the portable copies, and the AVX-512 ones; the implementation list
   of two (src/impl.h): pool_avx512 where registered and on, else pool_portable
   (pool_impl_v512) */
#define POOL_KERNELS(name)                                                                         \
   static lm_status k_##name(const lm_op *op) {                                                    \
      return lm_pool2d_##name(op, pool_impl_v512(0));                                              \
   }                                                                                               \
   static lm_status k_##name##_512(const lm_op *op) {                                              \
      return lm_pool2d_##name(op, pool_impl_v512(1));                                              \
   }
POOL_KERNELS(max_forward)
POOL_KERNELS(max_backward)
POOL_KERNELS(avg_forward)
POOL_KERNELS(avg_backward)
#undef POOL_KERNELS

/* ---- registration (cpu.h) ---- */
void lm_cpu_register_pool(lm_kernel_fn *table, int isa) {
#ifdef POOL_X86
   const int v512 = isa >= LM_ISA_AVX512;
#else
   const int v512 = 0;
   (void)isa;
#endif
   const lm_kernel_fn maxf = v512 ? k_max_forward_512 : k_max_forward;
   const lm_kernel_fn maxb = v512 ? k_max_backward_512 : k_max_backward;
   const lm_kernel_fn avgf = v512 ? k_avg_forward_512 : k_avg_forward;
   const lm_kernel_fn avgb = v512 ? k_avg_backward_512 : k_avg_backward;
   table[LM_OP_MAX_POOL2D] = maxf;
   table[LM_OP_ADAPTIVE_MAX_POOL2D] = maxf;
   table[LM_OP_MAX_POOL2D_TAPS] = maxf;
   table[LM_OP_MAX_POOL2D_BACKWARD] = maxb;
   table[LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD] = maxb;
   table[LM_OP_MAX_POOL2D_TAPS_BACKWARD] = maxb;
   table[LM_OP_AVG_POOL2D] = avgf;
   table[LM_OP_ADAPTIVE_AVG_POOL2D] = avgf;
   table[LM_OP_AVG_POOL2D_BACKWARD] = avgb;
   table[LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD] = avgb;
}
