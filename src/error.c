/* error.c -- status codes plus a message Lua can read.
 * The message lives in a per-thread buffer (like errno): the one piece of mutable state outside
 * the allocator and the RNG, and it is thread-local, so concurrent callers do not share it. */
#include "internal.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char lm_errbuf[1024];

lm_status lm_error(lm_status status, const char *fmt, ...) {
   va_list ap;
   va_start(ap, fmt);
   vsnprintf(lm_errbuf, sizeof lm_errbuf, fmt, ap);
   va_end(ap);
   return status;
}

const char *lm_last_error(void) { return lm_errbuf[0] ? lm_errbuf : "unknown error"; }

void lm_clear_error(void) { lm_errbuf[0] = 0; }
