/* Shared by the libFuzzer harnesses in fuzz/: the lumen parsers read from a path, so each input
 * is written to an in-memory file (memfd_create) once per process and rewritten for every input;
 * the parsers open it as /proc/self/fd/N. No disk traffic, nothing left behind after a crash, and
 * parallel jobs (-fork, -jobs) each get their own file. */
#ifndef LUMEN_FUZZ_COMMON_H
#define LUMEN_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fuzz_fd = -1;
static char fuzz_path[64];

/* write data to the per-process file and return its path */
static const char *fuzz_file(const uint8_t *data, size_t size) {
   if (fuzz_fd < 0) {
      fuzz_fd = memfd_create("lumen-fuzz", 0);
      if (fuzz_fd < 0) {
         perror("memfd_create");
         abort();
      }
      snprintf(fuzz_path, sizeof fuzz_path, "/proc/self/fd/%d", fuzz_fd);
   }
   if (ftruncate(fuzz_fd, 0) != 0) {
      perror("ftruncate");
      abort();
   }
   size_t done = 0;
   while (done < size) {
      ssize_t w = pwrite(fuzz_fd, data + done, size - done, (off_t)done);
      if (w <= 0) {
         perror("pwrite");
         abort();
      }
      done += (size_t)w;
   }
   return fuzz_path;
}

/* an expected-behaviour check that failed: a finding, like a crash. LUMEN_FUZZ_NO_CHECKS=1 turns
   these checks off (crashes and sanitizer reports still count), to explore past a known finding
   that a check would report on nearly every input. */
static int fuzz_checks_on(void) {
   static int on = -1;
   if (on < 0) {
      const char *e = getenv("LUMEN_FUZZ_NO_CHECKS");
      on = !(e && *e && strcmp(e, "0") != 0);
   }
   return on;
}

#define FUZZ_CHECK(cond, ...)                                                                      \
   do {                                                                                           \
      if (fuzz_checks_on() && !(cond)) {                                                         \
         fprintf(stderr, "fuzz: check failed: " __VA_ARGS__);                                     \
         fputc('\n', stderr);                                                                     \
         abort();                                                                                 \
      }                                                                                          \
   } while (0)

#endif
