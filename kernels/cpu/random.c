/* random.c -- CPU kernels of the random family (filled in by the operator/kernel split, issue 16). */
#include "cpu.h"

void lm_cpu_register_random(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
