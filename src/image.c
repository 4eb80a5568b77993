/* image.c -- JPEG (libjpeg-turbo) and PNG (libpng) decoding for the batch loader, plus the
 * directory listing ImageFolder is built on.
 *
 * A sample is produced in one streaming pass: the decoder hands out rows of the image, each row
 * that the sample's region touches is resampled horizontally into a small ring of float rows,
 * and every output row is then combined vertically from that ring and written, normalised and
 * (optionally) mirrored, straight into the batch at the batch's strides -- so a channels-last
 * batch is filled pixel by pixel, with no whole decoded image and no CHW intermediate (the one
 * exception: an interlaced PNG, whose rows only exist once every pass is read).
 *
 * Resampling is PIL's bilinear filter (Resample.c: a triangle filter whose support grows with the
 * shrink factor, so downscaling is antialiased; weights renormalised at the borders), evaluated
 * on a region (box) of the image: the whole image, a centre crop of the image scaled to `resize`,
 * or torchvision's RandomResizedCrop. JPEGs may be decoded at 1/2..1/8 size (DCT scaling) when the
 * region still covers the output.
 *
 * Errors: libjpeg's error_exit and libpng's error function longjmp back to the sample's entry
 * point (setjmp) with the library's message; a truncated JPEG (libjpeg only warns and pads with
 * grey) is an error too. Nothing here calls exit() or abort(); the message names the file.
 *
 * Linking: the libjpeg / libpng entry points are weak references, so liblumen still loads (and
 * everything but image decoding works) when it was linked without -ljpeg / -lpng;
 * lm_image_support() tells, and decoding then fails with a message saying how to link. */
#include "internal.h"
#include "image.h"
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#define LM_STR_(x) #x
#define LM_WEAK(f) _Pragma(LM_STR_(weak f))
LM_WEAK(jpeg_std_error)
LM_WEAK(jpeg_CreateDecompress)
LM_WEAK(jpeg_destroy_decompress)
LM_WEAK(jpeg_mem_src)
LM_WEAK(jpeg_read_header)
LM_WEAK(jpeg_start_decompress)
LM_WEAK(jpeg_read_scanlines)
LM_WEAK(jpeg_skip_scanlines)
LM_WEAK(jpeg_finish_decompress)
LM_WEAK(png_create_read_struct)
LM_WEAK(png_create_info_struct)
LM_WEAK(png_destroy_read_struct)
LM_WEAK(png_set_read_fn)
LM_WEAK(png_get_io_ptr)
LM_WEAK(png_get_error_ptr)
LM_WEAK(png_read_info)
LM_WEAK(png_get_IHDR)
LM_WEAK(png_set_strip_16)
LM_WEAK(png_set_palette_to_rgb)
LM_WEAK(png_set_expand_gray_1_2_4_to_8)
LM_WEAK(png_set_interlace_handling)
LM_WEAK(png_read_update_info)
LM_WEAK(png_get_channels)
LM_WEAK(png_get_rowbytes)
LM_WEAK(png_read_row)
LM_WEAK(png_read_image)
LM_WEAK(png_error)

static int have_jpeg(void) {
   return jpeg_std_error && jpeg_CreateDecompress && jpeg_destroy_decompress && jpeg_mem_src &&
          jpeg_read_header && jpeg_start_decompress && jpeg_read_scanlines && jpeg_skip_scanlines &&
          jpeg_finish_decompress;
}

static int have_png(void) {
   return png_create_read_struct && png_create_info_struct && png_destroy_read_struct &&
          png_set_read_fn && png_get_io_ptr && png_get_error_ptr && png_read_info &&
          png_get_IHDR && png_set_strip_16 && png_set_palette_to_rgb &&
          png_set_expand_gray_1_2_4_to_8 && png_set_interlace_handling &&
          png_read_update_info && png_get_channels && png_get_rowbytes && png_read_row &&
          png_read_image && png_error;
}

int lm_image_support(void) { return (have_jpeg() ? 1 : 0) | (have_png() ? 2 : 0); }

/* ------------------------------------------------------------------ random stream */

static uint64_t rng_next(uint64_t *s) {
   uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
   z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
   return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s, double lo, double hi) {
   return lo + (hi - lo) * ((double)(rng_next(s) >> 11) * 0x1.0p-53);
}
static int64_t rng_below(uint64_t *s, int64_t n) { /* 0..n-1, n >= 1 */
   return (int64_t)(rng_next(s) % (uint64_t)n);
}

/* ------------------------------------------------------------------ options and region */

lm_status lm_image_opts_check(const lm_image_opts *io) {
   if (!io) return lm_error(LM_ERR_ARG, "image options are required");
   if (io->out_h < 1 || io->out_w < 1 || io->out_h > 65535 || io->out_w > 65535)
      return lm_error(LM_ERR_ARG, "size must be 1..65535, got %d x %d", (int)io->out_h,
                      (int)io->out_w);
   if (io->crop != LM_CROP_NONE && io->crop != LM_CROP_CENTER && io->crop != LM_CROP_RANDOM)
      return lm_error(LM_ERR_ARG, "unknown crop mode %d", (int)io->crop);
   if (io->resize < 0 || io->resize > 65535)
      return lm_error(LM_ERR_ARG, "resize must be 0..65535, got %d", (int)io->resize);
   if (io->crop == LM_CROP_RANDOM) {
      if (!(io->scale[0] > 0 && io->scale[0] <= io->scale[1] && io->scale[1] <= 1))
         return lm_error(LM_ERR_ARG, "scale must be {lo, hi} with 0 < lo <= hi <= 1, got {%g, %g}",
                         (double)io->scale[0], (double)io->scale[1]);
      if (!(io->ratio[0] > 0 && io->ratio[0] <= io->ratio[1] && isfinite(io->ratio[1])))
         return lm_error(LM_ERR_ARG, "ratio must be {lo, hi} with 0 < lo <= hi, got {%g, %g}",
                         (double)io->ratio[0], (double)io->ratio[1]);
   }
   return LM_OK;
}

/* The region of a W x H image that becomes the sample, as box = {x0, y0, x1, y1} in image pixels
   (may reach outside the image for a centre crop larger than the scaled image). Python's round()
   (half to even) is rint() here, so the integer choices match torchvision's. */
static void sample_region(const lm_image_opts *io, int64_t W, int64_t H, uint64_t *rng,
                          double box[4]) {
   const int64_t oh = io->out_h, ow = io->out_w;
   box[0] = 0;
   box[1] = 0;
   box[2] = (double)W;
   box[3] = (double)H;
   if (io->crop == LM_CROP_CENTER) {
      int64_t nw, nh; /* the scaled image size (torchvision's Resize(int) rule) */
      if (io->resize > 0) {
         if (W <= H) {
            nw = io->resize;
            nh = (int64_t)((double)io->resize * (double)H / (double)W);
         } else {
            nh = io->resize;
            nw = (int64_t)((double)io->resize * (double)W / (double)H);
         }
      } else if ((double)oh * (double)W >= (double)ow * (double)H) { /* just cover the output */
         nh = oh;
         nw = (int64_t)rint((double)W * (double)oh / (double)H);
         if (nw < ow) nw = ow;
      } else {
         nw = ow;
         nh = (int64_t)rint((double)H * (double)ow / (double)W);
         if (nh < oh) nh = oh;
      }
      if (nw < 1) nw = 1;
      if (nh < 1) nh = 1;
      double top = rint((double)(nh - oh) / 2.0), left = rint((double)(nw - ow) / 2.0);
      double sx = (double)nw / (double)W, sy = (double)nh / (double)H;
      box[0] = left / sx;
      box[1] = top / sy;
      box[2] = (left + (double)ow) / sx;
      box[3] = (top + (double)oh) / sy;
   } else if (io->crop == LM_CROP_RANDOM) {
      double area = (double)W * (double)H;
      double lr0 = log((double)io->ratio[0]), lr1 = log((double)io->ratio[1]);
      for (int attempt = 0; attempt < 10; attempt++) {
         double target = area * rng_uniform(rng, io->scale[0], io->scale[1]);
         double ar = exp(rng_uniform(rng, lr0, lr1));
         int64_t w = (int64_t)rint(sqrt(target * ar)), h = (int64_t)rint(sqrt(target / ar));
         if (w > 0 && w <= W && h > 0 && h <= H) {
            int64_t i = rng_below(rng, H - h + 1), j = rng_below(rng, W - w + 1);
            box[0] = (double)j;
            box[1] = (double)i;
            box[2] = (double)(j + w);
            box[3] = (double)(i + h);
            return;
         }
      }
      /* fallback: the central crop with the aspect ratio clamped into range */
      double in_ratio = (double)W / (double)H;
      int64_t w = W, h = H;
      if (in_ratio < io->ratio[0]) h = (int64_t)rint((double)w / io->ratio[0]);
      else if (in_ratio > io->ratio[1]) w = (int64_t)rint((double)h * io->ratio[1]);
      if (w < 1) w = 1;
      if (h < 1) h = 1;
      int64_t i = (H - h) / 2, j = (W - w) / 2;
      box[0] = (double)j;
      box[1] = (double)i;
      box[2] = (double)(j + w);
      box[3] = (double)(i + h);
   }
}

/* ------------------------------------------------------------------ resampling weights */

/* PIL's precompute_coeffs for the bilinear (triangle) filter: output pixel o takes input pixels
   lo[o] .. lo[o] + cnt[o] - 1 with weights w[o * ks ..]. */
typedef struct coeffs {
   int64_t *lo;
   int32_t *cnt;
   float *w;
   int32_t ks;
} coeffs;

static void coeffs_free(coeffs *c) {
   free(c->lo);
   free(c->cnt);
   free(c->w);
   c->lo = NULL;
   c->cnt = NULL;
   c->w = NULL;
}

static int coeffs_make(coeffs *c, int64_t in_size, double in0, double in1, int64_t out_size) {
   double scale = (in1 - in0) / (double)out_size;
   double fscale = scale < 1.0 ? 1.0 : scale, support = fscale; /* bilinear support is 1 */
   int32_t ks = (int32_t)ceil(support) * 2 + 1;
   c->ks = ks;
   c->lo = malloc(sizeof(int64_t) * (size_t)out_size);
   c->cnt = malloc(sizeof(int32_t) * (size_t)out_size);
   c->w = malloc(sizeof(float) * (size_t)out_size * (size_t)ks);
   double *kw = malloc(sizeof(double) * (size_t)ks);
   if (!c->lo || !c->cnt || !c->w || !kw) {
      free(kw);
      return 0;
   }
   for (int64_t o = 0; o < out_size; o++) {
      double center = in0 + ((double)o + 0.5) * scale;
      int64_t xmin = (int64_t)(center - support + 0.5); /* C truncation, as PIL's (int) */
      if (xmin < 0) xmin = 0;
      int64_t xmax = (int64_t)(center + support + 0.5);
      if (xmax > in_size) xmax = in_size;
      int64_t n = xmax - xmin;
      if (n < 0) n = 0;
      if (n > ks) n = ks;
      double ww = 0.0;
      for (int64_t k = 0; k < n; k++) {
         double x = ((double)(k + xmin) - center + 0.5) / fscale;
         if (x < 0) x = -x;
         kw[k] = x < 1.0 ? 1.0 - x : 0.0;
         ww += kw[k];
      }
      float *w = c->w + o * ks;
      for (int64_t k = 0; k < ks; k++) w[k] = (k < n && ww != 0.0) ? (float)(kw[k] / ww) : 0.0f;
      c->lo[o] = xmin;
      c->cnt[o] = (int32_t)n;
   }
   free(kw);
   return 1;
}

/* ------------------------------------------------------------------ decoders */

enum { KIND_JPEG = 1, KIND_PNG = 2 };
#define LM_MAX_IMAGE_FILE ((int64_t)1 << 30) /* bytes */

typedef struct dec dec;
typedef struct jerr_mgr {
   struct jpeg_error_mgr pub; /* first: libjpeg sees this */
   dec *d;
} jerr_mgr;

struct dec {
   const char *path;
   unsigned char *buf; /* the whole file */
   size_t len;
   int kind;
   jmp_buf jb;
   lm_status status;
   char msg[320];
   /* JPEG */
   jerr_mgr jerr;
   struct jpeg_decompress_struct jd;
   int jd_live, cmyk, cmyk_inverted;
   /* PNG */
   png_structp png;
   png_infop info;
   size_t pos;
   unsigned char *full; /* interlaced PNG: every row */
   size_t rowbytes;
   /* the image */
   int64_t W, H;   /* as stored */
   int64_t dw, dh; /* as decoded (JPEG DCT scaling) */
   int dc, cw;     /* decoded channels per pixel (1..4); working channels (1 gray or 3 RGB) */
   int64_t row;    /* the next row the decoder hands out */
   unsigned char *rowbuf, *wrow;
   /* resampling */
   coeffs hc, vc;
   float *ring, *vrow;
   lm_tensor *out; /* lm_image_read's result while it is being filled */
};

/* leave the sample with a message (d->status says which kind of error) */
static void dec_fail(dec *d, lm_status st, const char *fmt, ...)
   __attribute__((format(printf, 3, 4), noreturn));
static void dec_fail(dec *d, lm_status st, const char *fmt, ...) {
   va_list ap;
   va_start(ap, fmt);
   vsnprintf(d->msg, sizeof d->msg, fmt, ap);
   va_end(ap);
   d->status = st;
   longjmp(d->jb, 1);
}

static void *dec_alloc(dec *d, size_t n) {
   void *p = malloc(n ? n : 1);
   if (!p) dec_fail(d, LM_ERR_OOM, "out of memory (%zu bytes) while decoding", n);
   return p;
}

static void jerr_exit(j_common_ptr cinfo) {
   dec *d = ((jerr_mgr *)cinfo->err)->d;
   char m[JMSG_LENGTH_MAX];
   (*cinfo->err->format_message)(cinfo, m);
   dec_fail(d, LM_ERR_IO, "bad JPEG data (%s)", m);
}

static void jerr_emit(j_common_ptr cinfo, int level) {
   /* Level -1 is a warning: libjpeg found corrupt data and carries on, padding with grey or
      inventing rows (a premature end of the data, a marker in the middle of the entropy-coded
      data after an enlarged SOF height, extraneous bytes, a bad Huffman code): the sample would
      be silently wrong, so every warning is an error. Levels >= 0 are trace messages. */
   if (level >= 0) return;
   dec *d = ((jerr_mgr *)cinfo->err)->d;
   if (cinfo->err->msg_code == JWRN_JPEG_EOF)
      dec_fail(d, LM_ERR_IO, "truncated JPEG file (the data ends before the image does)");
   char m[JMSG_LENGTH_MAX];
   (*cinfo->err->format_message)(cinfo, m);
   dec_fail(d, LM_ERR_IO, "bad JPEG data (%s)", m);
}

static void png_err_fn(png_structp p, png_const_charp m) {
   dec *d = png_get_error_ptr(p);
   if (strcmp(m, "lumen: end of file") == 0)
      dec_fail(d, LM_ERR_IO, "truncated PNG file (the data ends before the image does)");
   dec_fail(d, LM_ERR_IO, "bad PNG data (%s)", m);
}

static void png_warn_fn(png_structp p, png_const_charp m) {
   /* libpng reads past many oddities with a warning or a "benign" error (which it reports here
      too). Those about ancillary chunks (a known incorrect sRGB profile, bad text) leave the
      pixels intact and are ignored, as PIL does. Those about the image data mean the pixels
      are not what the file's header promises: more rows of data than the header's height
      ("Too much image data", "Extra compressed data": a shrunk IHDR would silently crop the
      image), or an IDAT stream whose checksum is wrong. Those are errors. */
   if (strstr(m, "image data") || strstr(m, "compressed data") || strstr(m, "IDAT") ||
       strstr(m, "data check") || strstr(m, "zlib") || strstr(m, "inflate"))
      png_error(p, m);
}

static void png_read_fn(png_structp p, png_bytep out, size_t n) {
   dec *d = png_get_io_ptr(p);
   if (n > d->len - d->pos) png_error(p, "lumen: end of file");
   memcpy(out, d->buf + d->pos, n);
   d->pos += n;
}

/* read the whole file (outside the setjmp region) */
static lm_status dec_load_file(dec *d, const char *path) {
   d->path = path;
   int fd;
   int64_t fsize = 0;
   LM_TRY(lm_open_regular(path, &fd, &fsize)); /* a regular file; never blocks on a FIFO */
   /* the whole file is read into memory: a file far larger than any real image (a mislabelled
      video, a disk image) is refused before that */
   if (fsize > LM_MAX_IMAGE_FILE) {
      close(fd);
      return lm_error(LM_ERR_IO, "'%s' is too large for an image file (%lld bytes, the limit is "
                      "%lld)", path, (long long)fsize, (long long)LM_MAX_IMAGE_FILE);
   }
   FILE *f = fdopen(fd, "rb");
   if (!f) {
      int e = errno;
      close(fd);
      return lm_error(LM_ERR_IO, "cannot read '%s': %s", path, strerror(e));
   }
   lm_status st = LM_OK;
   size_t cap = 1 << 16, len = 0;
   unsigned char *buf = malloc(cap);
   while (buf) {
      if (len == cap) {
         unsigned char *nb = realloc(buf, cap *= 2);
         if (!nb) {
            free(buf);
            buf = NULL;
            break;
         }
         buf = nb;
      }
      size_t r = fread(buf + len, 1, cap - len, f);
      len += r;
      if (r == 0) break;
      if (len > (size_t)LM_MAX_IMAGE_FILE) { /* it grew while being read */
         free(buf);
         buf = NULL;
         fclose(f);
         return lm_error(LM_ERR_IO, "'%s' is too large for an image file (more than %lld bytes)",
                         path, (long long)LM_MAX_IMAGE_FILE);
      }
   }
   if (!buf) st = lm_error(LM_ERR_OOM, "out of memory reading '%s'", path);
   else if (ferror(f)) st = lm_error(LM_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
   fclose(f);
   if (st != LM_OK) {
      free(buf);
      return st;
   }
   d->buf = buf;
   d->len = len;
   static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
   if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF) {
      if (!have_jpeg())
         return lm_error(LM_ERR_IO, "cannot decode '%s': lumen was built without libjpeg (link "
                         "liblumen with -Wl,--no-as-needed -ljpeg)", path);
      d->kind = KIND_JPEG;
   } else if (len >= 8 && memcmp(buf, png_sig, 8) == 0) {
      if (!have_png())
         return lm_error(LM_ERR_IO, "cannot decode '%s': lumen was built without libpng (link "
                         "liblumen with -Wl,--no-as-needed -lpng)", path);
      d->kind = KIND_PNG;
   } else if (len == 0) {
      return lm_error(LM_ERR_IO, "'%s' is empty, not an image", path);
   } else {
      return lm_error(LM_ERR_IO, "'%s' is not a JPEG or PNG file (it starts with %02x %02x %02x)",
                      path, buf[0], len > 1 ? buf[1] : 0, len > 2 ? buf[2] : 0);
   }
   return LM_OK;
}

/* PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS * 2: PIL raises above it): a file of a
 * few hundred bytes can declare 65535 x 65535 pixels. LUMEN_MAX_IMAGE_PIXELS overrides it. */
static int64_t max_image_pixels(void) {
   const char *e = getenv("LUMEN_MAX_IMAGE_PIXELS");
   if (e && *e) {
      char *end = NULL;
      long long v = strtoll(e, &end, 10);
      if (end && *end == '\0' && v > 0) return (int64_t)v;
   }
   return 178956970;
}

/* parse the header: W, H */
static void dec_open(dec *d) {
   if (d->kind == KIND_JPEG) {
      d->jd.err = jpeg_std_error(&d->jerr.pub);
      d->jerr.pub.error_exit = jerr_exit;
      d->jerr.pub.emit_message = jerr_emit;
      d->jerr.d = d;
      jpeg_create_decompress(&d->jd);
      d->jd_live = 1;
      jpeg_mem_src(&d->jd, d->buf, (unsigned long)d->len);
      jpeg_read_header(&d->jd, TRUE);
      d->W = d->jd.image_width;
      d->H = d->jd.image_height;
   } else {
      d->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, d, png_err_fn, png_warn_fn);
      if (!d->png) dec_fail(d, LM_ERR_OOM, "cannot start libpng (out of memory?)");
      d->info = png_create_info_struct(d->png);
      if (!d->info) dec_fail(d, LM_ERR_OOM, "cannot start libpng (out of memory?)");
      png_set_read_fn(d->png, d, png_read_fn);
      png_read_info(d->png, d->info);
      png_uint_32 w, h;
      int depth, ctype, interlace;
      png_get_IHDR(d->png, d->info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
      d->W = w;
      d->H = h;
   }
   if (d->W < 1 || d->H < 1) dec_fail(d, LM_ERR_IO, "the image is empty");
   const int64_t limit = max_image_pixels();
   if (d->W * d->H > limit)
      dec_fail(d, LM_ERR_IO, "the image has %lld x %lld pixels, more than the limit of %lld "
               "(a decompression bomb?); LUMEN_MAX_IMAGE_PIXELS raises it", (long long)d->W,
               (long long)d->H, (long long)limit);
}

/* Read the rest of the image after the rows a sample needed, so that corrupt or truncated data
 * anywhere in the file is an error, as when PIL (torchvision) decodes the whole image: JPEG rows
 * are skipped (entropy decoding only, no IDCT) and jpeg_finish_decompress reads up to the EOI
 * marker (a missing one is libjpeg's "premature end" warning, an error here); PNG rows are read
 * (inflate and unfilter). */
static void dec_finish(dec *d) {
   if (d->kind == KIND_JPEG) {
      /* libjpeg-turbo's jpeg_skip_scanlines to the bottom marks the end reached without reading
         the data (found by fuzz/image): skip to the last row and decode that one */
      if (d->row < d->dh - 1) {
         JDIMENSION n = (JDIMENSION)(d->dh - 1 - d->row);
         if (jpeg_skip_scanlines(&d->jd, n) != n)
            dec_fail(d, LM_ERR_IO, "truncated JPEG file (no more rows)");
         d->row = d->dh - 1;
      }
      while (d->row < d->dh) {
         JSAMPROW r = d->rowbuf;
         if (jpeg_read_scanlines(&d->jd, &r, 1) != 1)
            dec_fail(d, LM_ERR_IO, "truncated JPEG file (no more rows)");
         d->row++;
      }
      jpeg_finish_decompress(&d->jd);
   } else if (!d->full) {
      while (d->row < d->dh) {
         png_read_row(d->png, d->rowbuf, NULL);
         d->row++;
      }
   }
}

/* start decoding at 1/denom size (JPEG; PNG ignores denom): dw, dh, dc, cw, row buffers */
static void dec_start(dec *d, int denom) {
   if (d->kind == KIND_JPEG) {
      switch (d->jd.jpeg_color_space) {
      case JCS_GRAYSCALE:
         d->jd.out_color_space = JCS_GRAYSCALE;
         d->dc = d->cw = 1;
         break;
      case JCS_CMYK:
      case JCS_YCCK:
         d->jd.out_color_space = JCS_CMYK;
         d->dc = 4;
         d->cw = 3;
         d->cmyk = 1;
         d->cmyk_inverted = d->jd.saw_Adobe_marker; /* Adobe's CMYK JPEGs store inverted inks */
         break;
      default:
         d->jd.out_color_space = JCS_RGB;
         d->dc = d->cw = 3;
      }
      d->jd.scale_num = 1;
      d->jd.scale_denom = (unsigned)denom;
      jpeg_start_decompress(&d->jd);
      d->dw = d->jd.output_width;
      d->dh = d->jd.output_height;
      if (d->jd.output_components != d->dc)
         dec_fail(d, LM_ERR_IO, "unexpected JPEG colour layout (%d components)",
                  d->jd.output_components);
      d->rowbytes = (size_t)d->dw * (size_t)d->dc;
   } else {
      png_uint_32 w, h;
      int depth, ctype, interlace;
      png_get_IHDR(d->png, d->info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
      if (depth == 16) png_set_strip_16(d->png); /* the high byte, as PIL */
      if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d->png);
      if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(d->png);
      if (interlace != PNG_INTERLACE_NONE) png_set_interlace_handling(d->png);
      png_read_update_info(d->png, d->info);
      d->dc = png_get_channels(d->png, d->info);
      d->cw = d->dc <= 2 ? 1 : 3;
      d->dw = d->W;
      d->dh = d->H;
      d->rowbytes = png_get_rowbytes(d->png, d->info);
      if (d->dc < 1 || d->dc > 4 || d->rowbytes != (size_t)d->dw * (size_t)d->dc)
         dec_fail(d, LM_ERR_IO, "unexpected PNG pixel layout (%d channels)", d->dc);
      if (interlace != PNG_INTERLACE_NONE) {
         /* the whole image is held: the same limit as lm_image_read's */
         if (d->W * d->H > ((int64_t)1 << 31))
            dec_fail(d, LM_ERR_IO, "the interlaced image is too large (%lld x %lld)",
                     (long long)d->W, (long long)d->H);
         d->full = dec_alloc(d, d->rowbytes * (size_t)d->dh);
         png_bytep *rows = dec_alloc(d, sizeof(png_bytep) * (size_t)d->dh);
         for (int64_t y = 0; y < d->dh; y++) rows[y] = d->full + (size_t)y * d->rowbytes;
         d->wrow = (unsigned char *)rows; /* freed with the decoder if png_read_image fails */
         png_read_image(d->png, rows);
         free(rows);
         d->wrow = NULL;
      }
   }
   d->rowbuf = dec_alloc(d, d->rowbytes);
   d->wrow = dec_alloc(d, (size_t)d->dw * (size_t)d->cw);
}

static inline unsigned char muldiv255(int a, int b) {
   int t = a * b + 128;
   return (unsigned char)(((t >> 8) + t) >> 8);
}

/* the next row, as cw channels per pixel */
static const unsigned char *dec_row(dec *d) {
   const unsigned char *src;
   if (d->kind == KIND_JPEG) {
      JSAMPROW r = d->rowbuf;
      if (jpeg_read_scanlines(&d->jd, &r, 1) != 1)
         dec_fail(d, LM_ERR_IO, "truncated JPEG file (no more rows)");
      src = d->rowbuf;
   } else if (d->full) {
      src = d->full + (size_t)d->row * d->rowbytes;
   } else {
      png_read_row(d->png, d->rowbuf, NULL);
      src = d->rowbuf;
   }
   d->row++;
   if (d->dc == d->cw) return src;
   unsigned char *o = d->wrow;
   const int64_t w = d->dw;
   if (d->dc == 2) { /* gray + alpha: alpha dropped */
      for (int64_t x = 0; x < w; x++) o[x] = src[2 * x];
   } else if (!d->cmyk) { /* RGBA: alpha dropped (PIL's convert("RGB")) */
      for (int64_t x = 0; x < w; x++) {
         o[3 * x] = src[4 * x];
         o[3 * x + 1] = src[4 * x + 1];
         o[3 * x + 2] = src[4 * x + 2];
      }
   } else { /* CMYK -> RGB as PIL's cmyk2rgb */
      const int inv = d->cmyk_inverted;
      for (int64_t x = 0; x < w; x++) {
         int k = src[4 * x + 3];
         if (inv) k = 255 - k;
         int nk = 255 - k;
         for (int c = 0; c < 3; c++) {
            int v = src[4 * x + c];
            if (inv) v = 255 - v;
            int r = nk - muldiv255(v, nk);
            o[3 * x + c] = (unsigned char)(r < 0 ? 0 : r);
         }
      }
   }
   return o;
}

/* skip rows up to (not including) row `to` */
static void dec_skip_to(dec *d, int64_t to) {
   if (to <= d->row) return;
   if (d->kind == KIND_JPEG) {
      JDIMENSION n = (JDIMENSION)(to - d->row);
      if (jpeg_skip_scanlines(&d->jd, n) != n)
         dec_fail(d, LM_ERR_IO, "truncated JPEG file (no more rows)");
      d->row = to;
   } else if (d->full) {
      d->row = to;
   } else {
      while (d->row < to) {
         png_read_row(d->png, d->rowbuf, NULL);
         d->row++;
      }
   }
}

static void dec_close(dec *d) {
   if (d->jd_live) jpeg_destroy_decompress(&d->jd);
   if (d->png) png_destroy_read_struct(&d->png, d->info ? &d->info : NULL, NULL);
   coeffs_free(&d->hc);
   coeffs_free(&d->vc);
   free(d->ring);
   free(d->vrow);
   free(d->rowbuf);
   free(d->wrow);
   free(d->full);
   free(d->buf);
   lm_tensor_free(d->out);
   free(d);
}

/* ------------------------------------------------------------------ one sample */

typedef struct sample_args {
   const lm_image_opts *io;
   uint64_t rng;
   int flip;
   float *dst;
   int64_t sC, sH, sW;
   const float *scale, *shift;
} sample_args;

static void run_sample(dec *d, const sample_args *a) {
   const lm_image_opts *io = a->io;
   const int64_t oh = io->out_h, ow = io->out_w;
   dec_open(d);
   uint64_t rng = a->rng;
   double box[4];
   sample_region(io, d->W, d->H, &rng, box);
   int denom = 1;
   if (io->draft && d->kind == KIND_JPEG) {
      for (int s = 8; s >= 2; s /= 2) {
         double dw = (double)((d->W + s - 1) / s), dh = (double)((d->H + s - 1) / s);
         if ((box[2] - box[0]) * dw / (double)d->W >= (double)ow &&
             (box[3] - box[1]) * dh / (double)d->H >= (double)oh) {
            denom = s;
            break;
         }
      }
   }
   dec_start(d, denom);
   const double fx = (double)d->dw / (double)d->W, fy = (double)d->dh / (double)d->H;
   if (!coeffs_make(&d->hc, d->dw, box[0] * fx, box[2] * fx, ow) ||
       !coeffs_make(&d->vc, d->dh, box[1] * fy, box[3] * fy, oh))
      dec_fail(d, LM_ERR_OOM, "out of memory (resampling weights)");
   const int cw = d->cw;
   const int32_t K = d->vc.ks, hks = d->hc.ks, vks = d->vc.ks;
   d->ring = dec_alloc(d, sizeof(float) * (size_t)K * (size_t)ow * (size_t)cw);
   d->vrow = dec_alloc(d, sizeof(float) * (size_t)ow * (size_t)cw);
   int64_t first = -1;
   for (int64_t y = 0; y < oh && first < 0; y++)
      if (d->vc.cnt[y] > 0) first = d->vc.lo[y];
   if (first > 0) dec_skip_to(d, first);
   const float *scale = a->scale, *shift = a->shift;
   for (int64_t y = 0; y < oh; y++) {
      const int32_t vn = d->vc.cnt[y];
      float *vrow = d->vrow;
      if (vn > 0) {
         const int64_t need = d->vc.lo[y] + vn;
         while (d->row < need) {
            const int64_t r = d->row;
            const unsigned char *src = dec_row(d);
            float *h = d->ring + (size_t)(r % K) * (size_t)ow * (size_t)cw;
            for (int64_t x = 0; x < ow; x++) {
               const int32_t n = d->hc.cnt[x];
               const float *w = d->hc.w + x * hks;
               const unsigned char *s = src + d->hc.lo[x] * cw;
               if (cw == 3) {
                  float a0 = 0, a1 = 0, a2 = 0;
                  for (int32_t k = 0; k < n; k++) {
                     a0 += w[k] * s[3 * k];
                     a1 += w[k] * s[3 * k + 1];
                     a2 += w[k] * s[3 * k + 2];
                  }
                  h[3 * x] = a0;
                  h[3 * x + 1] = a1;
                  h[3 * x + 2] = a2;
               } else {
                  float a0 = 0;
                  for (int32_t k = 0; k < n; k++) a0 += w[k] * s[k];
                  h[x] = a0;
               }
            }
         }
         const float *vw = d->vc.w + y * vks;
         const int64_t lo = d->vc.lo[y], m = ow * cw;
         const float *r0 = d->ring + (size_t)(lo % K) * (size_t)m;
         for (int64_t i = 0; i < m; i++) vrow[i] = vw[0] * r0[i];
         for (int32_t k = 1; k < vn; k++) {
            const float *rk = d->ring + (size_t)((lo + k) % K) * (size_t)m;
            const float wk = vw[k];
            for (int64_t i = 0; i < m; i++) vrow[i] += wk * rk[i];
         }
      } else {
         memset(vrow, 0, sizeof(float) * (size_t)(ow * cw)); /* wholly outside the image */
      }
      float *drow = a->dst + y * a->sH;
      const int64_t sC = a->sC, sW = a->sW;
      for (int64_t x = 0; x < ow; x++) {
         float *p = drow + (a->flip ? ow - 1 - x : x) * sW;
         if (cw == 3) {
            const float *v = vrow + 3 * x;
            p[0] = v[0] * scale[0] + shift[0];
            p[sC] = v[1] * scale[1] + shift[1];
            p[2 * sC] = v[2] * scale[2] + shift[2];
         } else {
            const float g = vrow[x];
            p[0] = g * scale[0] + shift[0];
            p[sC] = g * scale[1] + shift[1];
            p[2 * sC] = g * scale[2] + shift[2];
         }
      }
   }
   dec_finish(d);
}

/* run fn(d, arg) with the decoder's error exit armed; the decoder is closed afterwards */
static lm_status guarded_sample(dec *d, const sample_args *a) {
   lm_status st;
   if (setjmp(d->jb)) {
      st = lm_error(d->status, "'%s': %s", d->path, d->msg);
   } else {
      run_sample(d, a);
      st = LM_OK;
   }
   dec_close(d);
   return st;
}

lm_status lm_image_sample(const char *path, const lm_image_opts *io, uint64_t rng, int flip,
                          float *dst, int64_t sC, int64_t sH, int64_t sW, const float *scale,
                          const float *shift) {
   dec *d = calloc(1, sizeof *d);
   if (!d) return lm_error(LM_ERR_OOM, "out of memory");
   lm_status st = dec_load_file(d, path);
   if (st != LM_OK) {
      dec_close(d);
      return st;
   }
   sample_args a = {io, rng, flip, dst, sC, sH, sW, scale, shift};
   return guarded_sample(d, &a);
}

lm_status lm_image_load(const char *path, const lm_image_opts *io, uint64_t seed, int32_t hflip,
                        const float *mean, const float *std, lm_tensor *out) {
   if (!path) return lm_error(LM_ERR_ARG, "path is nil");
   LM_TRY(lm_image_opts_check(io));
   if (!out || !mean || !std) return lm_error(LM_ERR_ARG, "out, mean and std are required");
   if (out->dtype != LM_FLOAT32 || out->device != LM_CPU || out->ndim != 4 ||
       out->sizes[0] != 1 || out->sizes[1] != 3 || out->sizes[2] != io->out_h ||
       out->sizes[3] != io->out_w)
      return lm_error(LM_ERR_SHAPE, "out must be a float32 CPU tensor of size (1, 3, %d, %d)",
                      (int)io->out_h, (int)io->out_w);
   float scale[3], shift[3];
   for (int c = 0; c < 3; c++) {
      if (!(std[c] > 0) || !isfinite(mean[c]))
         return lm_error(LM_ERR_ARG, "std must be positive and mean finite");
      scale[c] = 1.0f / (255.0f * std[c]);
      shift[c] = -mean[c] / std[c];
   }
   return lm_image_sample(path, io, seed, hflip != 0, lm_tensor_data(out), out->strides[1],
                          out->strides[2], out->strides[3], scale, shift);
}

/* ------------------------------------------------------------------ whole images */

static void run_read(dec *d) {
   dec_open(d);
   if (d->W > 65535 * 4 || d->H > 65535 * 4 || d->W * d->H > ((int64_t)1 << 31))
      dec_fail(d, LM_ERR_IO, "the image is too large (%lld x %lld)", (long long)d->W,
               (long long)d->H);
   dec_start(d, 1);
   int64_t sizes[3] = {d->dh, d->dw, 3};
   if (lm_empty(3, sizes, LM_UINT8, LM_CONTIGUOUS, LM_CPU, &d->out) != LM_OK)
      dec_fail(d, LM_ERR_OOM, "%s", lm_last_error());
   unsigned char *o = lm_tensor_data(d->out);
   for (int64_t y = 0; y < d->dh; y++) {
      const unsigned char *s = dec_row(d);
      unsigned char *q = o + (size_t)y * (size_t)d->dw * 3;
      if (d->cw == 3) {
         memcpy(q, s, (size_t)d->dw * 3);
      } else {
         for (int64_t x = 0; x < d->dw; x++) q[3 * x] = q[3 * x + 1] = q[3 * x + 2] = s[x];
      }
   }
   dec_finish(d);
}

static lm_status guarded_read(dec *d, lm_tensor **out) {
   lm_status st;
   if (setjmp(d->jb)) {
      st = lm_error(d->status, "'%s': %s", d->path, d->msg);
   } else {
      run_read(d);
      *out = d->out;
      d->out = NULL;
      st = LM_OK;
   }
   dec_close(d);
   return st;
}

lm_status lm_image_read(const char *path, lm_tensor **out) {
   if (!path || !out) return lm_error(LM_ERR_ARG, "path is nil");
   dec *d = calloc(1, sizeof *d);
   if (!d) return lm_error(LM_ERR_OOM, "out of memory");
   lm_status st = dec_load_file(d, path);
   if (st != LM_OK) {
      dec_close(d);
      return st;
   }
   return guarded_read(d, out);
}

/* ------------------------------------------------------------------ file lists */

lm_status lm_image_list_new(const char *const *paths, const int64_t *labels, int64_t n,
                            lm_image_list **out) {
   if (!out || n < 0 || (n > 0 && !paths)) return lm_error(LM_ERR_ARG, "bad file list");
   size_t total = 0;
   for (int64_t i = 0; i < n; i++) {
      if (!paths[i]) return lm_error(LM_ERR_ARG, "path %lld is nil", (long long)i + 1);
      total += strlen(paths[i]) + 1;
   }
   lm_image_list *l = calloc(1, sizeof *l);
   if (!l) return lm_error(LM_ERR_OOM, "out of memory");
   l->refcount = 1;
   l->n = n;
   l->paths = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
   l->blob = malloc(total ? total : 1);
   if (labels) l->labels = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
   if (!l->paths || !l->blob || (labels && !l->labels)) {
      lm_image_list_free(l);
      return lm_error(LM_ERR_OOM, "out of memory");
   }
   char *p = l->blob;
   for (int64_t i = 0; i < n; i++) {
      size_t len = strlen(paths[i]) + 1;
      memcpy(p, paths[i], len);
      l->paths[i] = p;
      p += len;
   }
   if (labels && n > 0) memcpy(l->labels, labels, sizeof(int64_t) * (size_t)n);
   *out = l;
   return LM_OK;
}

void lm_image_list_retain(lm_image_list *l) {
   if (l) __atomic_add_fetch(&l->refcount, 1, __ATOMIC_RELAXED);
}

void lm_image_list_free(lm_image_list *l) {
   if (!l || __atomic_sub_fetch(&l->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
   free(l->paths);
   free(l->blob);
   free(l->labels);
   free(l);
}

/* ------------------------------------------------------------------ directories */

static int cmp_names(const void *a, const void *b) {
   return strcmp(*(char *const *)a, *(char *const *)b);
}

lm_status lm_dir_list(const char *path, int32_t kind, char **out, int64_t *n) {
   if (!path || !out || !n) return lm_error(LM_ERR_ARG, "path is nil");
   if (kind != 1 && kind != 2) return lm_error(LM_ERR_ARG, "kind must be 1 or 2");
   *out = NULL;
   *n = 0;
   DIR *dir = opendir(path);
   if (!dir) return lm_error(LM_ERR_IO, "cannot open directory '%s': %s", path, strerror(errno));
   lm_status st = LM_OK;
   char **names = NULL;
   size_t count = 0, cap = 0, total = 0;
   size_t plen = strlen(path);
   for (;;) {
      errno = 0;
      struct dirent *e = readdir(dir);
      if (!e) {
         if (errno != 0)
            st = lm_error(LM_ERR_IO, "cannot read directory '%s': %s", path, strerror(errno));
         break;
      }
      if (e->d_name[0] == '.') continue;
      int is_dir = 0, is_reg = 0;
      if (e->d_type == DT_DIR) is_dir = 1;
      else if (e->d_type == DT_REG) is_reg = 1;
      else {
         size_t len = plen + strlen(e->d_name) + 2;
         char *full = malloc(len);
         if (!full) {
            st = lm_error(LM_ERR_OOM, "out of memory");
            break;
         }
         snprintf(full, len, "%s/%s", path, e->d_name);
         struct stat sb;
         if (stat(full, &sb) == 0) {
            is_dir = S_ISDIR(sb.st_mode);
            is_reg = S_ISREG(sb.st_mode);
         }
         free(full);
      }
      if (!(kind == 1 ? is_dir : is_reg)) continue;
      if (count == cap) {
         size_t ncap = cap ? cap * 2 : 64;
         char **nn = realloc(names, ncap * sizeof(char *));
         if (!nn) {
            st = lm_error(LM_ERR_OOM, "out of memory");
            break;
         }
         names = nn;
         cap = ncap;
      }
      names[count] = strdup(e->d_name);
      if (!names[count]) {
         st = lm_error(LM_ERR_OOM, "out of memory");
         break;
      }
      total += strlen(names[count]) + 1;
      count++;
   }
   closedir(dir);
   char *blob = NULL;
   if (st == LM_OK) {
      if (count > 1) qsort(names, count, sizeof(char *), cmp_names);
      blob = malloc(total ? total : 1);
      if (!blob) st = lm_error(LM_ERR_OOM, "out of memory");
   }
   if (st == LM_OK) {
      char *p = blob;
      for (size_t i = 0; i < count; i++) {
         size_t len = strlen(names[i]) + 1;
         memcpy(p, names[i], len);
         p += len;
      }
      *out = blob;
      *n = (int64_t)count;
   }
   for (size_t i = 0; i < count; i++) free(names[i]);
   free(names);
   return st;
}

void lm_dir_list_free(char *names) { free(names); }
