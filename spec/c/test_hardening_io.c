/* test_hardening_io.c -- the C API on hostile sizes and files: sizes and strides whose products
 * overflow int64 (every entry point that makes a tensor), file ranges whose end overflows, FIFOs
 * and folders given as files, and lm_remove_stale_tmp's choices. Run under `make asan`, an
 * overflow that slipped through is a UBSan abort here.
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *
 *   make && cc -std=c11 -O2 -Isrc spec/c/test_hardening_io.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -o /tmp/test_hio && /tmp/test_hio
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>
#include "lumen.h"

static int g_pass, g_fail;

static void check(int ok, const char *fmt, ...) {
   if (ok) {
      g_pass++;
      return;
   }
   g_fail++;
   va_list ap;
   va_start(ap, fmt);
   printf("FAIL: ");
   vprintf(fmt, ap);
   printf(" (last error: %s)\n", lm_last_error());
   va_end(ap);
}

static int has(const char *needle) { return strstr(lm_last_error(), needle) != NULL; }

#define BIG ((int64_t)1 << 40)

static void test_sizes(void) {
   lm_tensor *t = NULL;
   int64_t sz[4] = {0, BIG, BIG, BIG}, st[4];
   check(lm_empty(4, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &t) == LM_ERR_SHAPE && has("overflow"),
         "lm_empty {0, 2^40, 2^40, 2^40}");
   check(lm_empty(4, sz, LM_FLOAT32, LM_CHANNELS_LAST, LM_CPU, &t) == LM_ERR_SHAPE,
         "lm_empty channels_last {0, 2^40, 2^40, 2^40}");
   check(lm_compute_strides(4, sz, LM_CONTIGUOUS, st) == LM_ERR_SHAPE,
         "lm_compute_strides {0, 2^40, 2^40, 2^40}");
   check(lm_compute_strides(4, sz, LM_CHANNELS_LAST, st) == LM_ERR_SHAPE,
         "lm_compute_strides channels_last {0, 2^40, 2^40, 2^40}");
   int64_t neg[2] = {2, -3};
   check(lm_compute_strides(2, neg, LM_CONTIGUOUS, st) == LM_ERR_SHAPE,
         "lm_compute_strides negative size");
   check(lm_compute_strides(99, sz, LM_CONTIGUOUS, st) == LM_ERR_SHAPE,
         "lm_compute_strides 99 dims");
   int64_t ok[3] = {0, (int64_t)1 << 30, (int64_t)1 << 30};
   check(lm_compute_strides(3, ok, LM_CONTIGUOUS, st) == LM_OK && st[0] == (int64_t)1 << 60 &&
            st[1] == (int64_t)1 << 30 && st[2] == 1,
         "lm_compute_strides {0, 2^30, 2^30}");
   /* strides that wrap: 4096 * 2^52 == 2^64 == 0 */
   lm_tensor *base = NULL;
   int64_t four = 4;
   check(lm_empty(1, &four, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &base) == LM_OK, "base");
   int64_t vsz = 4097, vst = (int64_t)1 << 52;
   check(lm_as_strided(base, 1, &vsz, &vst, 0, &t) == LM_ERR_SHAPE, "as_strided wrapping stride");
   int64_t vsz2[2] = {2, 2}, vst2[2] = {INT64_MAX, 1};
   check(lm_as_strided(base, 2, vsz2, vst2, 0, &t) != LM_OK, "as_strided INT64_MAX stride");
   check(lm_as_strided(base, 1, &four, &four, INT64_MAX, &t) != LM_OK, "as_strided huge offset");
   int64_t esz[2] = {(int64_t)1 << 21, 2}, est[2] = {(int64_t)1 << 50, 1};
   check(lm_empty_strided(2, esz, est, LM_FLOAT64, LM_CPU, &t) != LM_OK,
         "empty_strided extent overflow");
   /* view / reshape / expand */
   lm_tensor *empty = NULL;
   int64_t zero = 0;
   check(lm_empty(1, &zero, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &empty) == LM_OK, "empty");
   int64_t vs[3] = {-1, BIG, BIG};
   check(lm_view(empty, 3, vs, &t) == LM_ERR_SHAPE && has("overflow"), "view {-1, 2^40, 2^40}");
   int64_t rs[3] = {0, BIG, BIG};
   check(lm_reshape(empty, 3, rs, &t) == LM_ERR_SHAPE, "reshape {0, 2^40, 2^40}");
   int64_t xs[4] = {BIG, BIG, BIG, 0};
   lm_tensor *one = NULL;
   int64_t oz[2] = {1, 0};
   check(lm_empty(2, oz, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &one) == LM_OK, "one");
   check(lm_expand(one, 4, xs, &t) == LM_ERR_SHAPE, "expand {2^40, 2^40, 2^40, 0}");
   /* narrow: start + length must not overflow */
   check(lm_narrow(base, 0, INT64_MAX, INT64_MAX, &t) != LM_OK, "narrow INT64_MAX");
   check(lm_narrow(base, 0, 2, INT64_MAX - 1, &t) != LM_OK, "narrow start + length overflow");
   /* unsqueeze of an empty tensor with huge sizes and strides */
   lm_tensor *wide = NULL;
   int64_t wsz[2] = {0, (int64_t)1 << 59}, wst[2] = {(int64_t)1 << 59, (int64_t)1 << 59};
   check(lm_as_strided(empty, 2, wsz, wst, 0, &wide) == LM_OK, "wide empty view");
   if (wide) {
      check(lm_unsqueeze(wide, 1, &t) == LM_OK, "unsqueeze of a wide empty view");
      lm_tensor_free(t);
      /* cat along the huge dim: 17 * 2^59 overflows int64 */
      const lm_tensor *many[17];
      for (int i = 0; i < 17; i++) many[i] = wide;
      t = NULL;
      check(lm_cat(17, many, 1, &t) == LM_ERR_SHAPE && has("overflow"), "cat size overflow");
      lm_tensor_free(wide);
   }
   lm_tensor_free(base);
   lm_tensor_free(empty);
   lm_tensor_free(one);
}

static void test_files(const char *dir) {
   char path[512], fifo[512];
   snprintf(path, sizeof path, "%s/ten.bin", dir);
   FILE *f = fopen(path, "wb");
   fwrite("0123456789", 1, 10, f);
   fclose(f);
   char buf[16];
   int64_t size = -1;
   check(lm_read_file_range(path, 2, 4, buf, &size) == LM_OK && size == 10 &&
            memcmp(buf, "2345", 4) == 0,
         "read_file_range");
   check(lm_read_file_range(path, INT64_MAX - 1, 4, buf, NULL) == LM_ERR_IO && has("truncated"),
         "read_file_range offset + len overflow");
   check(lm_read_file_range(path, 8, 4, buf, NULL) == LM_ERR_IO, "read_file_range past the end");
   check(lm_read_file_range(path, 0, -1, buf, NULL) == LM_ERR_ARG, "read_file_range len -1");
   snprintf(fifo, sizeof fifo, "%s/pipe", dir);
   unlink(fifo);
   check(mkfifo(fifo, 0600) == 0, "mkfifo");
   /* in a child, so that a regression hangs the child (killed by alarm) and not the test */
   pid_t pid = fork();
   if (pid == 0) {
      alarm(10);
      lm_storage *s = NULL;
      lm_tensor *t = NULL;
      int bad = 0;
      bad |= lm_map_file(fifo, &s) != LM_ERR_IO || !has("FIFO");
      bad |= lm_read_file_range(fifo, 0, 0, buf, NULL) != LM_ERR_IO || !has("FIFO");
      bad |= lm_idx_read(fifo, &t) != LM_ERR_IO || !has("FIFO");
      bad |= lm_image_read(fifo, &t) != LM_ERR_IO || !has("FIFO");
      bad |= lm_map_file(dir, &s) != LM_ERR_IO || !has("directory");
      _exit(bad ? 1 : 0);
   }
   int status = 0;
   waitpid(pid, &status, 0);
   check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "FIFOs and folders refused without blocking (child status %d)", status);
   check(lm_path_kind(fifo) == 3 && lm_path_kind(path) == 1 && lm_path_kind(dir) == 2 &&
            lm_path_kind("/nonexistent/x") == 0,
         "lm_path_kind");
   unlink(fifo);
   unlink(path);
}

static void touch(const char *p, time_t when) {
   FILE *f = fopen(p, "wb");
   fputs("x", f);
   fclose(f);
   struct utimbuf u = {when, when};
   utime(p, &u);
}

static void test_stale_tmp(const char *dir) {
   char target[512], dead[600], live[600], fresh[600], odd[600], other[600];
   snprintf(target, sizeof target, "%s/w.safetensors", dir);
   pid_t child = fork();
   if (child == 0) _exit(0);
   waitpid(child, NULL, 0); /* a pid that is gone */
   time_t old = time(NULL) - 3600;
   snprintf(dead, sizeof dead, "%s.tmp.%d.1.2", target, (int)child);
   snprintf(live, sizeof live, "%s.tmp.%d.1.2", target, 1);
   snprintf(fresh, sizeof fresh, "%s.tmp.%d.3.4", target, (int)child);
   snprintf(odd, sizeof odd, "%s.tmp.%d.1", target, (int)child);
   snprintf(other, sizeof other, "%s/v.safetensors.tmp.%d.1.2", dir, (int)child);
   touch(dead, old);
   touch(live, old);
   touch(fresh, time(NULL));
   touch(odd, old);
   touch(other, old);
   int32_t removed = -1;
   check(lm_remove_stale_tmp(target, 60, &removed) == LM_OK && removed == 1,
         "remove_stale_tmp removed %d", removed);
   check(access(dead, F_OK) != 0, "dead writer's file removed");
   check(access(live, F_OK) == 0, "live writer's file kept");
   check(access(fresh, F_OK) == 0, "recent file kept");
   check(access(odd, F_OK) == 0, "oddly named file kept");
   check(access(other, F_OK) == 0, "other target's file kept");
   check(lm_remove_stale_tmp(target, 0, &removed) == LM_OK && removed == 1 &&
            access(fresh, F_OK) != 0,
         "min_age 0 removes the recent file");
   check(lm_remove_stale_tmp("/nonexistent/dir/w", 60, &removed) == LM_OK && removed == 0,
         "an unreadable folder removes nothing");
   unlink(live);
   unlink(odd);
   unlink(other);
}

int main(void) {
   char dir[] = "/tmp/lumen_hio_XXXXXX";
   if (!mkdtemp(dir)) {
      perror("mkdtemp");
      return 1;
   }
   test_sizes();
   test_files(dir);
   test_stale_tmp(dir);
   rmdir(dir);
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
