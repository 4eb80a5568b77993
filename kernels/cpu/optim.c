/* optim.c -- CPU kernels of the optim family (filled in by the operator/kernel split, issue 16). */
#include "cpu.h"

void lm_cpu_register_optim(lm_kernel_fn *table, int isa) {
   (void)table, (void)isa;
}
