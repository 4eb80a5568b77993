/* cpu.h -- what the CPU kernels share (internal): the hardware probe and the kernel table.
 *
 * lm_cpu_isa() is the one probe: the instruction set the CPU kernels use (LM_ISA_C, LM_ISA_AVX2,
 * LM_ISA_AVX512, LM_ISA_AVX512_BF16, LM_ISA_AMX of lumen.h), the best the CPU has unless
 * lm_cpu_set_isa forced a lower one (the specs force every path on every machine). Kernels
 * compare it with those names, never with bare numbers. kernels/cpu/backend.c fills the kernel table
 * from it: each family's file has a register function that stores its kernels for that ISA;
 * forcing another ISA refills the table. */
#ifndef LUMEN_KERNELS_CPU_H
#define LUMEN_KERNELS_CPU_H
#include "backend.h"

/* the ISA in use (LM_ISA_C portable C, LM_ISA_AVX2 AVX2 + FMA, LM_ISA_AVX512 AVX-512,
   LM_ISA_AVX512_BF16 AVX-512 + AVX512_BF16, LM_ISA_AMX the AMX tiles too): the probe's answer
   or the one lm_cpu_set_isa forced */
int lm_cpu_isa(void);

/* does vdpbf16ps pay here (gemm.c, lm_bf16_path_ratio: the packed bfloat16 GEMM against the
   float32 route, measured once per process; 1 when it is at least 1.1 times as fast)? Where it
   does not (the Intel Xeon of session 19), bfloat16 convolutions and GEMMs without AMX take the
   float32 route. LUMEN_BF16_DOT=0 / 1 forces the answer. 0 below LM_ISA_AVX512_BF16.
   lm_bf16_dot_ratio (probe_avx512bf16.c): the two instructions' flops, kept for the benchmarks
   (it does not predict the kernels: 1.6 on that Xeon). */
int lm_cpu_bf16_dot_pays(void);
double lm_bf16_path_ratio(void);
double lm_bf16_dot_ratio(void);

/* a CPU switch (LM_CPU_OPT_*, lm_cpu_set_option): 0 or 1, read by the kernels at each call */
int lm_cpu_option(int which);

/* Each family stores its kernels in table[LM_OP_...] for isa. Called once at start and after
 * every change of ISA; the table is read without locks by lm_dispatch (a kernel pointer is
 * written atomically, and every kernel a table ever held stays valid). */
void lm_cpu_register_elementwise(lm_kernel_fn *table, int isa);
void lm_cpu_register_reduce(lm_kernel_fn *table, int isa);
void lm_cpu_register_random(lm_kernel_fn *table, int isa);
void lm_cpu_register_linalg(lm_kernel_fn *table, int isa);
void lm_cpu_register_conv(lm_kernel_fn *table, int isa);
/* supports_op of LM_OP_CONV3D (kernels/cpu/conv.c): whether the CPU runs this conv3d natively */
int lm_cpu_conv3d_supports(const lm_op *op);
/* supports_op of LM_OP_LINEAR (kernels/cpu/linalg.c): float32 */
int lm_cpu_linear_supports(const lm_op *op);
void lm_cpu_register_pool(lm_kernel_fn *table, int isa);
void lm_cpu_register_pool3d(lm_kernel_fn *table, int isa);
void lm_cpu_register_norm(lm_kernel_fn *table, int isa);
void lm_cpu_register_group_norm(lm_kernel_fn *table, int isa);
void lm_cpu_register_softmax(lm_kernel_fn *table, int isa);
void lm_cpu_register_resample(lm_kernel_fn *table, int isa);
void lm_cpu_register_loss(lm_kernel_fn *table, int isa);
void lm_cpu_register_optim(lm_kernel_fn *table, int isa);
void lm_cpu_register_indexing(lm_kernel_fn *table, int isa);

/* refill the table for the current lm_cpu_isa() (isa.c calls it when the ISA changes) */
void lm_cpu_backend_refresh(void);

#endif
