/* check.h -- the harness the spec/c programs share: pass/fail counts, the case name printed with
 * every failure, check(ok, fmt, ...) and OK(call) (a call that must return LM_OK; the program
 * stops otherwise). A program includes it once and ends with
 *   printf("%d passed, %d failed\n", g_pass, g_fail); return g_fail != 0;
 */
#ifndef LUMEN_SPEC_CHECK_H
#define LUMEN_SPEC_CHECK_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "lumen.h"

static int g_pass, g_fail;
static char g_case[256];

static inline void check(int ok, const char *fmt, ...) {
   if (ok) {
      g_pass++;
      return;
   }
   g_fail++;
   va_list ap;
   va_start(ap, fmt);
   printf("FAIL [%s]: ", g_case);
   vprintf(fmt, ap);
   printf("\n");
   va_end(ap);
}

#define OK(expr)                                                                                   \
   do {                                                                                            \
      lm_status st_ = (expr);                                                                      \
      if (st_ != LM_OK) {                                                                          \
         printf("FAIL [%s]: %s -> %d (%s)\n", g_case, #expr, (int)st_, lm_last_error());          \
         exit(2);                                                                                  \
      }                                                                                            \
   } while (0)

#endif
