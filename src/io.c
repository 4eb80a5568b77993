/* io.c -- file access for serialization: memory-mapped reads (tensors become views of the file
 * with no copy) and atomic writes (a temporary file, fsync, then rename, so a crash mid-write
 * leaves the previous file intact). The format itself (safetensors) is parsed in Lua. */
#include "backend.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct mapping {
   void *addr;
   size_t len;
} mapping;

static void unmap(void *ctx) {
   mapping *m = ctx;
   if (m->len) munmap(m->addr, m->len);
   free(m);
}

static const char *kind_name(mode_t m) {
   if (S_ISDIR(m)) return "a directory";
   if (S_ISFIFO(m)) return "a FIFO (named pipe)";
   if (S_ISSOCK(m)) return "a socket";
   if (S_ISCHR(m)) return "a character device";
   if (S_ISBLK(m)) return "a block device";
   return "not a regular file";
}

/* Open a user-given file for reading, only if it is a regular file. The open itself must not
   block: opening a FIFO for reading waits for a writer, forever if none comes, so it is opened
   with O_NONBLOCK and checked with fstat on the descriptor (the very file that was opened, no
   race with a rename); blocking reads are restored for a regular file. Returns the descriptor
   and the file's size, or -1 with the error set. */
lm_status lm_open_regular(const char *path, int *fd_out, int64_t *size) {
   *fd_out = -1;
   if (!path) return lm_error(LM_ERR_ARG, "path is nil");
   int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
   if (fd < 0) return lm_error(LM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
   struct stat sb;
   if (fstat(fd, &sb) != 0) {
      int e = errno;
      close(fd);
      return lm_error(LM_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
   }
   if (!S_ISREG(sb.st_mode)) {
      close(fd);
      return lm_error(LM_ERR_IO, "'%s' is not a regular file (it is %s)", path,
                      kind_name(sb.st_mode));
   }
   int fl = fcntl(fd, F_GETFL);
   if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
      int e = errno;
      close(fd);
      return lm_error(LM_ERR_IO, "cannot read '%s': %s", path, strerror(e));
   }
   if (size) *size = (int64_t)sb.st_size;
   *fd_out = fd;
   return LM_OK;
}

int32_t lm_path_kind(const char *path) {
   struct stat sb;
   if (!path || stat(path, &sb) != 0) return 0;
   if (S_ISREG(sb.st_mode)) return 1;
   if (S_ISDIR(sb.st_mode)) return 2;
   return 3;
}

lm_status lm_map_file(const char *path, lm_storage **out) {
   if (!path || !out) return lm_error(LM_ERR_ARG, "path is nil");
   int64_t fsize = 0;
   int fd;
   LM_TRY(lm_open_regular(path, &fd, &fsize));
   mapping *m = malloc(sizeof *m);
   if (!m) {
      close(fd);
      return lm_error(LM_ERR_OOM, "out of memory");
   }
   m->len = (size_t)fsize;
   m->addr = NULL;
   if (m->len) {
      /* private and writable: tensors loaded from the file may be modified in place (copy on
         write); the file itself never changes */
      m->addr = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (m->addr == MAP_FAILED) {
         int e = errno;
         close(fd);
         free(m);
         return lm_error(LM_ERR_IO, "cannot map '%s': %s", path, strerror(e));
      }
   }
   close(fd);
   lm_storage *s = lm_storage_wrap(m->addr, (int64_t)m->len, LM_CPU, unmap, m);
   if (!s) {
      unmap(m);
      return LM_ERR_OOM;
   }
   *out = s;
   return LM_OK;
}

static lm_status write_all(int fd, const void *p, size_t n, const char *path) {
   const char *c = p;
   while (n > 0) {
      ssize_t w = write(fd, c, n);
      if (w < 0) {
         if (errno == EINTR) continue;
         return lm_error(LM_ERR_IO, "write to '%s' failed: %s", path, strerror(errno));
      }
      c += w;
      n -= (size_t)w;
   }
   return LM_OK;
}

/* Does name == base + ".tmp." + <pid> "." <digits> "." <digits> (lm.save's temporary names)?
   Returns the pid, or 0. */
static long tmp_writer_pid(const char *name, const char *base, size_t blen) {
   if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0) return 0;
   const char *p = name + blen + 5;
   long pid = 0;
   for (int field = 0; field < 3; field++) {
      if (*p < '0' || *p > '9') return 0;
      long v = 0;
      while (*p >= '0' && *p <= '9') {
         if (v < 100000000000L) v = v * 10 + (*p - '0');
         p++;
      }
      if (field == 0) pid = v;
      if (field < 2 && *p++ != '.') return 0;
   }
   if (*p != 0 || pid <= 0 || pid > 0x7fffffffL) return 0;
   return pid;
}

/* is process pid gone? kill(pid, 0) fails with ESRCH only when no such process exists (EPERM:
   it exists, owned by someone else) */
static int pid_dead(long pid) { return kill((pid_t)pid, 0) != 0 && errno == ESRCH; }

lm_status lm_remove_stale_tmp(const char *path, int32_t min_age_s, int32_t *removed) {
   if (removed) *removed = 0;
   if (!path || !*path) return lm_error(LM_ERR_ARG, "path is nil");
   if (min_age_s < 0) return lm_error(LM_ERR_ARG, "min_age_s must be >= 0");
   const char *slash = strrchr(path, '/');
   const char *base = slash ? slash + 1 : path;
   size_t blen = strlen(base);
   if (blen == 0) return LM_OK;
   size_t dlen = slash ? (size_t)(slash - path) : 1;
   /* dlen + 2: room for "." or "/" and the terminator when dlen is 0 or 1 (a file in the root,
      "/name", has dlen 0: GCC 14 caught the 1-byte overflow of the old dlen + 1) */
   char *dir = malloc(dlen + 2);
   if (!dir) return lm_error(LM_ERR_OOM, "out of memory");
   if (!slash) memcpy(dir, ".", 2);
   else if (dlen == 0) memcpy(dir, "/", 2);
   else {
      memcpy(dir, path, dlen);
      dir[dlen] = 0;
   }
   /* best effort: a folder that cannot be listed only means nothing is cleaned */
   DIR *dh = opendir(dir);
   if (!dh) {
      free(dir);
      return LM_OK;
   }
   int dfd = dirfd(dh);
   time_t now = time(NULL);
   long self = (long)getpid();
   struct dirent *e;
   while ((e = readdir(dh)) != NULL) {
      long pid = tmp_writer_pid(e->d_name, base, blen);
      if (pid == 0) continue;
      /* our own pid: a file of a previous process that had it (pid reuse across restarts, e.g.
         in containers); a save of this process in flight would keep its mtime fresh */
      if (pid != self && !pid_dead(pid)) continue; /* a live writer's file: never touched */
      struct stat sb;
      if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
         continue;
      if (sb.st_uid != getuid()) continue; /* someone else's */
      /* recently written: a writer we cannot see (another pid namespace sharing the folder) may
         still be at work */
      if ((int64_t)now - (int64_t)sb.st_mtime < (int64_t)min_age_s) continue;
      if (unlinkat(dfd, e->d_name, 0) == 0 && removed) (*removed)++;
   }
   closedir(dh);
   free(dir);
   return LM_OK;
}

/* write `head` (head_len bytes) then the elements of each tensor in logical row-major order to
   tmp_path, fsync it, and rename it over final_path */
lm_status lm_write_file_atomic(const char *tmp_path, const char *final_path, const char *head,
                               int64_t head_len, int n, const lm_tensor *const *ts) {
   if (!tmp_path || !final_path) return lm_error(LM_ERR_ARG, "path is nil");
   if (head_len < 0 || (head_len > 0 && !head)) return lm_error(LM_ERR_ARG, "bad header");
   for (int i = 0; i < n; i++) {
      if (!ts[i]) return lm_error(LM_ERR_ARG, "tensor %d is nil", i + 1);
      LM_TRY(lm_check_host(ts[i], "tensor"));
   }
   /* O_EXCL | O_NOFOLLOW: a new file of our own, never a file or link planted at that name */
   int fd = open(tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
   if (fd < 0) return lm_error(LM_ERR_IO, "cannot create '%s': %s", tmp_path, strerror(errno));
   lm_status st = write_all(fd, head, (size_t)head_len, tmp_path);
   for (int i = 0; i < n && st == LM_OK; i++) {
      const lm_tensor *t = ts[i];
      int64_t nbytes = t->numel * lm_dtype_size(t->dtype);
      if (nbytes == 0) continue;
      if (lm_is_contiguous(t, LM_CONTIGUOUS)) {
         st = write_all(fd, lm_tensor_data(t), (size_t)nbytes, tmp_path);
      } else {
         lm_tensor *c = NULL;
         st = lm_clone(t, LM_CONTIGUOUS, -1, &c);
         if (st == LM_OK) st = write_all(fd, lm_tensor_data(c), (size_t)nbytes, tmp_path);
         lm_tensor_free(c);
      }
   }
   if (st == LM_OK && fsync(fd) != 0)
      st = lm_error(LM_ERR_IO, "fsync of '%s' failed: %s", tmp_path, strerror(errno));
   if (close(fd) != 0 && st == LM_OK)
      st = lm_error(LM_ERR_IO, "close of '%s' failed: %s", tmp_path, strerror(errno));
   if (st == LM_OK && rename(tmp_path, final_path) != 0)
      st = lm_error(LM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp_path, final_path,
                    strerror(errno));
   if (st != LM_OK) {
      unlink(tmp_path);
      return st;
   }
   /* the rename is durable only once the folder is synced (else a power cut can bring back the
      old file, or none); best effort: some file systems cannot fsync a folder */
   const char *slash = strrchr(final_path, '/');
   char *dir = NULL;
   if (slash) {
      size_t dlen = slash == final_path ? 1 : (size_t)(slash - final_path);
      dir = malloc(dlen + 1);
      if (dir) {
         memcpy(dir, final_path, dlen);
         dir[dlen] = 0;
      }
   }
   int dfd = open(slash ? (dir ? dir : "/") : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
   if (dfd >= 0) {
      (void)fsync(dfd);
      close(dfd);
   }
   free(dir);
   return st;
}

/* read `len` bytes at `offset` of a file into buf (used for the safetensors header, so that a
   hostile length never maps or reads past the end) */
lm_status lm_read_file_range(const char *path, int64_t offset, int64_t len, void *buf,
                             int64_t *file_size) {
   if (!path) return lm_error(LM_ERR_ARG, "path is nil");
   if (len < 0 || (len > 0 && !buf)) return lm_error(LM_ERR_ARG, "bad length %lld", (long long)len);
   int64_t size = 0;
   int fd;
   LM_TRY(lm_open_regular(path, &fd, &size));
   FILE *f = fdopen(fd, "rb");
   if (!f) {
      int e = errno;
      close(fd);
      return lm_error(LM_ERR_IO, "cannot read '%s': %s", path, strerror(e));
   }
   if (file_size) *file_size = size;
   if (len > 0) {
      if (offset < 0 || offset > size || len > size - offset) {
         fclose(f);
         return lm_error(LM_ERR_IO, "'%s' is truncated: %lld bytes wanted at offset %lld, file "
                                    "has %lld", path, (long long)len, (long long)offset,
                         (long long)size);
      }
      if (fseeko(f, (off_t)offset, SEEK_SET) != 0 || fread(buf, 1, (size_t)len, f) != (size_t)len) {
         fclose(f);
         return lm_error(LM_ERR_IO, "cannot read '%s'", path);
      }
   }
   fclose(f);
   return LM_OK;
}

/* seconds on the monotonic clock (for progress bars and benchmarks, without each script declaring
   clock_gettime through the FFI with its own struct) */
double lm_clock(void) {
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
