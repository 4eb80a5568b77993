/* data.c -- data loading in C: the IDX reader (MNIST / Fashion-MNIST files, gzip through zlib)
 * and a batch loader whose worker threads (pthreads) gather, augment and normalise batches
 * straight into channels-last float32 tensors while Lua trains.
 *
 * Loader design: the epoch's sample order is fixed up front (Lua passes it, from the seeded RNG).
 * Batch b is produced by whichever worker claims it, but every random choice for it (crop offset,
 * flip) comes from a counter-based hash of (seed, sample position), so the batches do not depend
 * on the number of workers or their timing. Batches are handed out strictly in order through a
 * ring of `prefetch` slots.
 *
 * The samples come from a uint8 tensor (lm_loader_new) or from image files (lm_image_loader_new:
 * JPEG / PNG decoded, cropped and resized by image.c inside the same worker threads, written
 * straight into the batch). */
#include "internal.h"
#include "image.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------------ IDX */

/* zlib's message without the "<fd:N>: " it puts in front for a gzdopen'ed file */
static const char *gz_message(gzFile f, int *zerr) {
   const char *m = gzerror(f, zerr);
   if (!m) return "gzip error";
   if (strncmp(m, "<fd:", 4) == 0) {
      const char *c = strstr(m, ": ");
      if (c) m = c + 2;
   }
   return m;
}

static lm_status gz_read_exact(gzFile f, void *buf, size_t n, const char *path, const char *what) {
   size_t got = 0;
   while (got < n) {
      unsigned chunk = (n - got) > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
      int r = gzread(f, (char *)buf + got, chunk);
      if (r < 0) {
         int zerr;
         const char *m = gz_message(f, &zerr);
         return lm_error(LM_ERR_IO, "'%s' is corrupt (%s while reading the %s)", path, m, what);
      }
      if (r == 0)
         return lm_error(LM_ERR_IO, "'%s' is truncated: %zu of %zu bytes of the %s", path, got, n,
                         what);
      got += (size_t)r;
   }
   return LM_OK;
}

/* after the data: the stream must end here, and end properly. For gzip, zlib checks the
   trailer's CRC-32 and length (ISIZE) only when it reads past the data, so without this a
   flipped byte, or a stream cut short of its trailer, would go unnoticed. Bytes after a complete
   gzip member that do not start another member are ignored, as gzip does; decompressed data
   beyond what the dimensions need is an error, as for a plain file. */
static lm_status gz_check_end(gzFile f, const char *path, const char *dims) {
   unsigned char extra[4096];
   int64_t more = 0;
   for (;;) {
      int r = gzread(f, extra, sizeof extra);
      if (r <= 0) {
         int zerr = Z_OK;
         const char *m = gz_message(f, &zerr);
         if (r < 0 || zerr == Z_DATA_ERROR || zerr == Z_STREAM_ERROR || zerr == Z_ERRNO)
            return lm_error(LM_ERR_IO, "'%s' is corrupt (%s)", path, m);
         if (zerr == Z_BUF_ERROR)
            return lm_error(LM_ERR_IO, "'%s' is truncated: the gzip stream ends before its "
                            "trailer (%s)", path, m);
         if (zerr != Z_OK)
            return lm_error(LM_ERR_IO, "'%s' is corrupt (%s)", path, m);
         break;
      }
      more += r;
      if (more > (1 << 20)) break; /* enough to say so */
   }
   if (more > 0)
      return lm_error(LM_ERR_IO, "'%s' has %s%lld bytes of data after what its dimensions (%s) "
                      "need", path, more > (1 << 20) ? "more than " : "", (long long)more, dims);
   return LM_OK;
}

lm_status lm_idx_read(const char *path, lm_tensor **out) {
   if (!path || !out) return lm_error(LM_ERR_ARG, "path is nil");
   int fd;
   int64_t fsize = 0;
   LM_TRY(lm_open_regular(path, &fd, &fsize)); /* never blocks on a FIFO */
   gzFile f = gzdopen(fd, "rb");
   if (!f) {
      close(fd);
      return lm_error(LM_ERR_OOM, "cannot read '%s': out of memory", path);
   }
   unsigned char magic[4];
   lm_status st = gz_read_exact(f, magic, 4, path, "magic number");
   if (st != LM_OK) goto done;
   if (magic[0] != 0 || magic[1] != 0) {
      st = lm_error(LM_ERR_IO, "'%s' is not an IDX file (bad magic number)", path);
      goto done;
   }
   int dtype, esize;
   switch (magic[2]) {
   case 0x08: dtype = LM_UINT8; esize = 1; break;
   case 0x0C: dtype = LM_INT32; esize = 4; break;
   case 0x0D: dtype = LM_FLOAT32; esize = 4; break;
   case 0x0E: dtype = LM_FLOAT64; esize = 8; break;
   default:
      st = lm_error(LM_ERR_IO, "'%s': unsupported IDX element type 0x%02x", path, magic[2]);
      goto done;
   }
   int nd = magic[3];
   if (nd < 1 || nd > LM_MAX_DIMS) {
      st = lm_error(LM_ERR_IO, "'%s': bad IDX rank %d", path, nd);
      goto done;
   }
   int64_t sizes[LM_MAX_DIMS];
   for (int d = 0; d < nd; d++) {
      unsigned char b[4];
      st = gz_read_exact(f, b, 4, path, "dimensions");
      if (st != LM_OK) goto done;
      sizes[d] = ((int64_t)b[0] << 24) | ((int64_t)b[1] << 16) | ((int64_t)b[2] << 8) | b[3];
   }
   char dims[160];
   {
      int len = 0;
      dims[0] = 0;
      for (int d = 0; d < nd && len < (int)sizeof dims - 24; d++)
         len += snprintf(dims + len, sizeof dims - (size_t)len, "%s%lld", d ? " x " : "",
                         (long long)sizes[d]);
   }
   /* every product of the sizes is checked, even past a zero size: {0, 2^32-1, 2^32-1, ...}
      holds no data but its strides would overflow (lm_check_sizes) */
   if (lm_check_sizes(nd, sizes) != LM_OK) {
      st = lm_error(LM_ERR_IO, "'%s': IDX dimensions (%s) are too large (their product or "
                    "strides overflow)", path, dims);
      goto done;
   }
   int64_t numel = lm_numel_of(nd, sizes); /* <= 2^50 */
   /* the data must fit in the file: exactly for a plain file; for gzip, within deflate's
      largest possible ratio (about 1032:1). Checked before anything is allocated. */
   int64_t need = numel * esize;
   int64_t head = 4 + 4 * (int64_t)nd;
   if (gzdirect(f)) {
      if (need != fsize - head) {
         if (need > fsize - head)
            st = lm_error(LM_ERR_IO, "'%s' is truncated: its dimensions (%s) need %lld bytes of "
                          "data, the file holds %lld", path, dims, (long long)need,
                          (long long)(fsize - head));
         else
            st = lm_error(LM_ERR_IO, "'%s' has %lld bytes after the %lld bytes of data its "
                          "dimensions (%s) need", path, (long long)(fsize - head - need),
                          (long long)need, dims);
         goto done;
      }
   } else if (need / 1032 > fsize) {
      st = lm_error(LM_ERR_IO, "'%s': IDX dimensions (%s) are too large for the file", path,
                    dims);
      goto done;
   }
   lm_tensor *t = NULL;
   st = lm_empty(nd, sizes, dtype, LM_CONTIGUOUS, LM_CPU, &t);
   if (st != LM_OK) goto done;
   st = gz_read_exact(f, lm_tensor_data(t), (size_t)(numel * esize), path, "data");
   if (st == LM_OK) st = gz_check_end(f, path, dims);
   if (st != LM_OK) {
      lm_tensor_free(t);
      goto done;
   }
   if (esize > 1) { /* IDX is big-endian */
      unsigned char *p = lm_tensor_data(t);
      for (int64_t i = 0; i < numel; i++, p += esize)
         for (int a = 0, b = esize - 1; a < b; a++, b--) {
            unsigned char c = p[a];
            p[a] = p[b];
            p[b] = c;
         }
   }
   *out = t;
done:
   gzclose(f);
   return st;
}

/* ------------------------------------------------------------------ loader */


typedef struct slot {
   int64_t batch; /* which batch this slot holds, -1 when empty */
   int ready;
   lm_tensor *x, *y;
   lm_status status;
   char err[1024]; /* the worker's message (as long as lm_error's buffer) */
   char *skipped;  /* skip_corrupt: "<index>\t<message>\n" per sample left out, or NULL */
} slot;

struct lm_loader {
   lm_tensor *images; /* uint8 (N, H, W) or (N, H, W, C), contiguous; NULL for files */
   lm_tensor *labels; /* int64 (N) or NULL */
   lm_image_list *files; /* image files instead of images/labels, or NULL */
   lm_image_opts io;     /* how files become samples */
   int64_t *order, n_order, n_batches;
   int64_t H, W, Cn, oh, ow;
   lm_loader_opts o;
   pthread_mutex_t mu;
   pthread_cond_t cv_work, cv_ready;
   int64_t next_claim, next_take;
   int stop;
   slot *slots;
   pthread_t *threads;
   int nthreads;
   char *skipped; /* the log of the batch taken last (lm_loader_skipped) */
};

/* append "<idx>\t<msg>\n" to *log (a malloc'd string); on out of memory the line is dropped
   (the sample is still left out; only its warning is lost) */
static void log_skip(char **log, int64_t idx, const char *msg) {
   size_t old = *log ? strlen(*log) : 0, add = strlen(msg) + 32;
   char *n = realloc(*log, old + add);
   if (!n) return;
   snprintf(n + old, add, "%lld\t%s\n", (long long)idx, msg);
   *log = n;
}

static uint64_t mix64(uint64_t x) {
   x += 0x9e3779b97f4a7c15ull;
   x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
   x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
   return x ^ (x >> 31);
}

static lm_status make_batch(lm_loader *L, int64_t b, lm_tensor **px, lm_tensor **py,
                            char **skipped) {
   int64_t first = b * L->o.batch_size;
   int64_t n = L->n_order - first < L->o.batch_size ? L->n_order - first : L->o.batch_size;
   int64_t xs[4] = {n, L->Cn, L->oh, L->ow};
   lm_tensor *x = NULL, *y = NULL;
   LM_TRY(lm_empty(4, xs, LM_FLOAT32, L->o.out_fmt, LM_CPU, &x));
   const int64_t *labels = L->labels ? lm_tensor_data(L->labels)
                                     : L->files ? L->files->labels : NULL;
   if (labels) {
      lm_status st = lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, LM_CPU, &y);
      if (st != LM_OK) {
         lm_tensor_free(x);
         return st;
      }
   }
   float *xo = lm_tensor_data(x);
   const int64_t sN = x->strides[0], sC = x->strides[1], sH = x->strides[2], sW = x->strides[3];
   const int64_t H = L->H, W = L->W, Cn = L->Cn, pad = L->o.pad;
   float scale[4], shift[4];
   for (int c = 0; c < Cn; c++) {
      scale[c] = 1.0f / (255.0f * L->o.std[c]);
      shift[c] = -L->o.mean[c] / L->o.std[c];
   }
   int64_t k = 0; /* samples kept: with skip_corrupt, a sample that fails is left out and the
                     next one takes its row */
   for (int64_t i = 0; i < n; i++) {
      int64_t pos = first + i, idx = L->order[pos];
      /* every random choice for this sample comes from (seed, position in the epoch) */
      uint64_t r = mix64(L->o.seed ^ mix64((uint64_t)pos));
      int flip = L->o.hflip && ((r >> 40) & 1);
      if (y) ((int64_t *)lm_tensor_data(y))[k] = labels[idx];
      if (L->files) {
         lm_status st = lm_image_sample(L->files->paths[idx], &L->io,
                                        mix64(r ^ 0x5851f42d4c957f2dull), flip, xo + k * sN, sC,
                                        sH, sW, scale, shift);
         if (st != LM_OK && L->o.skip_corrupt && st != LM_ERR_OOM) {
            log_skip(skipped, idx, lm_last_error());
            continue;
         }
         if (st != LM_OK) {
            lm_tensor_free(x);
            lm_tensor_free(y);
            return st;
         }
         k++;
         continue;
      }
      k++;
      int64_t range_h = H + 2 * pad - L->oh + 1, range_w = W + 2 * pad - L->ow + 1;
      int64_t oy = (int64_t)(r % (uint64_t)range_h) - pad;
      int64_t ox = (int64_t)((r >> 20) % (uint64_t)range_w) - pad;
      const uint8_t *src = (const uint8_t *)lm_tensor_data(L->images) + idx * H * W * Cn;
      float *dst = xo + i * sN;
      for (int64_t yy = 0; yy < L->oh; yy++) {
         int64_t sy = yy + oy;
         for (int64_t xx = 0; xx < L->ow; xx++) {
            int64_t sx = flip ? (L->ow - 1 - xx) + ox : xx + ox;
            float *d = dst + yy * sH + xx * sW;
            if (sy < 0 || sy >= H || sx < 0 || sx >= W) {
               for (int64_t c = 0; c < Cn; c++) d[c * sC] = shift[c]; /* zero pixel, normalised */
            } else {
               const uint8_t *s = src + (sy * W + sx) * Cn;
               for (int64_t c = 0; c < Cn; c++) d[c * sC] = (float)s[c] * scale[c] + shift[c];
            }
         }
      }
   }
   if (k < n) { /* samples were left out: the batch is the first k rows */
      lm_tensor *xk = NULL, *yk = NULL;
      lm_status st = lm_narrow(x, 0, 0, k, &xk);
      if (st == LM_OK && y) st = lm_narrow(y, 0, 0, k, &yk);
      lm_tensor_free(x);
      lm_tensor_free(y);
      if (st != LM_OK) {
         lm_tensor_free(xk);
         return st;
      }
      x = xk;
      y = yk;
   }
   *px = x;
   *py = y;
   return LM_OK;
}

static void *worker(void *arg) {
   lm_loader *L = arg;
   pthread_mutex_lock(&L->mu);
   for (;;) {
      /* claim the next batch if a slot for it is free */
      while (!L->stop && (L->next_claim >= L->n_batches ||
                          L->next_claim >= L->next_take + L->o.prefetch))
         pthread_cond_wait(&L->cv_work, &L->mu);
      if (L->stop) break;
      int64_t b = L->next_claim++;
      slot *s = &L->slots[b % L->o.prefetch];
      pthread_mutex_unlock(&L->mu);
      lm_tensor *x = NULL, *y = NULL;
      char *skipped = NULL;
      lm_status st = make_batch(L, b, &x, &y, &skipped);
      pthread_mutex_lock(&L->mu);
      s->batch = b;
      s->x = x;
      s->y = y;
      free(s->skipped);
      s->skipped = skipped;
      s->status = st;
      if (st != LM_OK) snprintf(s->err, sizeof s->err, "%s", lm_last_error());
      s->ready = 1;
      pthread_cond_broadcast(&L->cv_ready);
   }
   pthread_mutex_unlock(&L->mu);
   return NULL;
}

void lm_loader_free(lm_loader *L) {
   if (!L) return;
   pthread_mutex_lock(&L->mu);
   L->stop = 1;
   pthread_cond_broadcast(&L->cv_work);
   pthread_mutex_unlock(&L->mu);
   for (int i = 0; i < L->nthreads; i++) pthread_join(L->threads[i], NULL);
   for (int i = 0; L->slots && i < L->o.prefetch; i++) {
      lm_tensor_free(L->slots[i].x);
      lm_tensor_free(L->slots[i].y);
      free(L->slots[i].skipped);
   }
   free(L->skipped);
   pthread_mutex_destroy(&L->mu);
   pthread_cond_destroy(&L->cv_work);
   pthread_cond_destroy(&L->cv_ready);
   lm_tensor_free(L->images);
   lm_tensor_free(L->labels);
   lm_image_list_free(L->files);
   free(L->order);
   free(L->slots);
   free(L->threads);
   free(L);
}

/* the checks every loader shares */
static lm_status check_common(int64_t N, const int64_t *order, int64_t n_order,
                              const lm_loader_opts *o, int64_t Cn) {
   if (o->batch_size < 1) return lm_error(LM_ERR_ARG, "batch_size must be positive");
   if (n_order < 0 || (n_order > 0 && !order)) return lm_error(LM_ERR_ARG, "bad sample order");
   for (int64_t i = 0; i < n_order; i++)
      if (order[i] < 0 || order[i] >= N)
         return lm_error(LM_ERR_ARG, "sample index %lld out of range", (long long)order[i] + 1);
   if (o->start_batch < 0) return lm_error(LM_ERR_ARG, "start_batch must be >= 0");
   if (o->workers > 256 || o->prefetch > 4096)
      return lm_error(LM_ERR_ARG, "workers must be <= 256 and prefetch <= 4096");
   for (int c = 0; c < Cn; c++) {
      if (!(o->std[c] > 0) || !(o->std[c] < INFINITY))
         return lm_error(LM_ERR_ARG, "std must be positive and finite");
      if (!(o->mean[c] > -INFINITY && o->mean[c] < INFINITY))
         return lm_error(LM_ERR_ARG, "mean must be finite");
   }
   if (o->out_fmt != LM_CHANNELS_LAST && o->out_fmt != LM_CONTIGUOUS)
      return lm_error(LM_ERR_FORMAT, "batches are channels_last or contiguous");
   return LM_OK;
}

/* allocate the rest, copy the order, start the workers; frees L on failure */
static lm_status loader_start(lm_loader *L, const int64_t *order, int64_t n_order,
                              const lm_loader_opts *o, lm_loader **out) {
   L->o = *o;
   if (L->o.workers < 1) L->o.workers = 1;
   if (L->o.prefetch < 1) L->o.prefetch = 1;
   L->n_order = n_order;
   L->n_batches = o->drop_last ? n_order / o->batch_size
                               : (n_order + o->batch_size - 1) / o->batch_size;
   pthread_mutex_init(&L->mu, NULL);
   pthread_cond_init(&L->cv_work, NULL);
   pthread_cond_init(&L->cv_ready, NULL);
   L->order = malloc(sizeof(int64_t) * (size_t)(n_order > 0 ? n_order : 1));
   L->slots = calloc((size_t)L->o.prefetch, sizeof(slot));
   L->threads = calloc((size_t)L->o.workers, sizeof(pthread_t));
   lm_status st = LM_OK;
   if (!L->order || !L->slots || !L->threads) st = lm_error(LM_ERR_OOM, "out of memory");
   if (st == LM_OK && n_order) memcpy(L->order, order, sizeof(int64_t) * (size_t)n_order);
   L->next_claim = L->next_take = o->start_batch;
   for (int i = 0; st == LM_OK && i < L->o.prefetch; i++) L->slots[i].batch = -1;
   for (int i = 0; st == LM_OK && i < L->o.workers; i++) {
      if (pthread_create(&L->threads[i], NULL, worker, L) != 0) {
         st = lm_error(LM_ERR_INTERNAL, "cannot start a loader thread");
         break;
      }
      L->nthreads++;
   }
   if (st != LM_OK) {
      lm_loader_free(L);
      return st;
   }
   *out = L;
   return LM_OK;
}

lm_status lm_loader_new(const lm_tensor *images, const lm_tensor *labels, const int64_t *order,
                        int64_t n_order, const lm_loader_opts *o, lm_loader **out) {
   if (!images || !o || !out) return lm_error(LM_ERR_ARG, "images and options are required");
   if (images->dtype != LM_UINT8) return lm_error(LM_ERR_DTYPE, "images must be uint8");
   if (images->device != LM_CPU) return lm_error(LM_ERR_DEVICE, "images must be on the CPU");
   if (images->ndim != 3 && images->ndim != 4)
      return lm_error(LM_ERR_SHAPE, "images must be (N, H, W) or (N, H, W, C), got %d dims",
                      images->ndim);
   int64_t N = images->sizes[0];
   int64_t Cn = images->ndim == 4 ? images->sizes[3] : 1;
   if (Cn < 1 || Cn > 4) return lm_error(LM_ERR_SHAPE, "images must have 1 to 4 channels");
   if (labels && (labels->dtype != LM_INT64 || labels->ndim != 1 || labels->sizes[0] != N ||
                  labels->device != LM_CPU))
      return lm_error(LM_ERR_SHAPE, "labels must be int64 of size %lld", (long long)N);
   LM_TRY(check_common(N, order, n_order, o, Cn));
   if (o->pad < 0 || o->crop_h < 0 || o->crop_w < 0) return lm_error(LM_ERR_ARG, "bad crop");
   int64_t H = images->sizes[1], W = images->sizes[2];
   if (H < 1 || W < 1) return lm_error(LM_ERR_SHAPE, "images must not be empty");
   int64_t oh = o->crop_h ? o->crop_h : H, ow = o->crop_w ? o->crop_w : W;
   if (oh > H + 2 * o->pad || ow > W + 2 * o->pad)
      return lm_error(LM_ERR_ARG, "crop is larger than the padded image");
   lm_loader *L = calloc(1, sizeof *L);
   if (!L) return lm_error(LM_ERR_OOM, "out of memory");
   L->H = H;
   L->W = W;
   L->Cn = Cn;
   L->oh = oh;
   L->ow = ow;
   /* private contiguous references to the data (views share the storage; no copy) */
   lm_status st;
   if (lm_is_contiguous(images, LM_CONTIGUOUS)) st = lm_alias(images, &L->images);
   else st = lm_clone(images, LM_CONTIGUOUS, -1, &L->images);
   if (st == LM_OK && labels) {
      if (lm_is_contiguous(labels, LM_CONTIGUOUS)) st = lm_alias(labels, &L->labels);
      else st = lm_clone(labels, LM_CONTIGUOUS, -1, &L->labels);
   }
   if (st != LM_OK) {
      lm_tensor_free(L->images);
      lm_tensor_free(L->labels);
      free(L);
      return st;
   }
   return loader_start(L, order, n_order, o, out);
}

lm_status lm_image_loader_new(lm_image_list *files, const int64_t *order, int64_t n_order,
                              const lm_image_opts *io, const lm_loader_opts *o,
                              lm_loader **out) {
   if (!files || !io || !o || !out)
      return lm_error(LM_ERR_ARG, "files, image options and options are required");
   LM_TRY(lm_image_opts_check(io));
   LM_TRY(check_common(files->n, order, n_order, o, 3));
   if (o->pad != 0 || o->crop_h != 0 || o->crop_w != 0)
      return lm_error(LM_ERR_ARG, "pad and crop apply to tensor data sets; image files are "
                      "cropped through their image options");
   if (!lm_image_support())
      return lm_error(LM_ERR_IO, "lumen was built without libjpeg and libpng (link liblumen with "
                      "-Wl,--no-as-needed -ljpeg -lpng)");
   lm_loader *L = calloc(1, sizeof *L);
   if (!L) return lm_error(LM_ERR_OOM, "out of memory");
   lm_image_list_retain(files);
   L->files = files;
   L->io = *io;
   L->Cn = 3;
   L->oh = io->out_h;
   L->ow = io->out_w;
   return loader_start(L, order, n_order, o, out);
}

int64_t lm_loader_num_batches(const lm_loader *L) { return L ? L->n_batches : 0; }

const char *lm_loader_skipped(const lm_loader *L) {
   return L && L->skipped ? L->skipped : "";
}

/* the next batch in order; *x == NULL at the end of the epoch */
lm_status lm_loader_next(lm_loader *L, lm_tensor **x, lm_tensor **y) {
   if (!L || !x || !y) return lm_error(LM_ERR_ARG, "loader is nil");
   *x = *y = NULL;
   pthread_mutex_lock(&L->mu);
   if (L->next_take >= L->n_batches) {
      pthread_mutex_unlock(&L->mu);
      return LM_OK;
   }
   slot *s = &L->slots[L->next_take % L->o.prefetch];
   while (!(s->ready && s->batch == L->next_take)) pthread_cond_wait(&L->cv_ready, &L->mu);
   lm_status st = s->status;
   if (st != LM_OK) lm_error(st, "%s", s->err);
   *x = s->x;
   *y = s->y;
   s->x = s->y = NULL;
   free(L->skipped);
   L->skipped = s->skipped;
   s->skipped = NULL;
   s->ready = 0;
   s->batch = -1;
   L->next_take++;
   pthread_cond_broadcast(&L->cv_work);
   pthread_mutex_unlock(&L->mu);
   return st;
}

/* idx[0..n) = a permutation of 0..n-1 that depends only on seed (Fisher-Yates over splitmix64) */
lm_status lm_permutation(int64_t *idx, int64_t n, uint64_t seed) {
   if (n < 0 || (n > 0 && !idx)) return lm_error(LM_ERR_ARG, "bad permutation size");
   for (int64_t i = 0; i < n; i++) idx[i] = i;
   uint64_t state = seed;
   for (int64_t i = n - 1; i > 0; i--) {
      state += 0x9e3779b97f4a7c15ull;
      uint64_t r = mix64(state);
      int64_t j = (int64_t)(r % (uint64_t)(i + 1));
      int64_t t = idx[i];
      idx[i] = idx[j];
      idx[j] = t;
   }
   return LM_OK;
}
