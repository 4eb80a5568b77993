/* libFuzzer harness: JPEG and PNG decoding (src/image.c). Every input goes through
 * lm_image_read (the whole image as uint8 H x W x 3); one that decodes, and is small, also goes
 * through lm_image_load (crop, JPEG draft decoding, PIL's bilinear resampling) with options taken
 * from the input's last bytes.
 * Check beyond crashes: a JPEG that decodes must be rejected once truncated before its end (EOI)
 * marker: libjpeg only warns and pads with grey, and lumen promises an error for that
 * (src/image.c, "a truncated JPEG ... is an error too"). */
#include "common.h"
#include "lumen.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
   (void)argc;
   (void)argv;
   setenv("OMP_NUM_THREADS", "1", 0);
   return 0;
}

/* where the decoder meets the JPEG's EOI marker: walk the marker segments by their lengths and
   each scan's entropy-coded data (a data byte FF is stuffed as FF 00; FF D0-D7 are restart
   markers) to the first FF D9 outside a segment. What follows it is ignored by the decoder, so
   cutting there proves nothing (searching for the last SOS made a false finding of a file with
   a second SOS after its EOI). -1: no EOI found, or a malformed marker on the way. */
static long jpeg_eoi(const uint8_t *d, size_t n) {
   size_t i = 2;
   while (i + 1 < n) {
      if (d[i] != 0xFF) return -1;
      uint8_t m = d[i + 1];
      if (m == 0xFF) { i++; continue; }                         /* fill byte */
      if (m == 0xD9) return (long)i;
      if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { i += 2; continue; }
      if (i + 3 >= n) return -1;
      size_t len = (size_t)d[i + 2] << 8 | d[i + 3];
      if (len < 2) return -1;
      i += 2 + len;
      if (m == 0xDA) {                                          /* entropy-coded data */
         while (i + 1 < n && !(d[i] == 0xFF && d[i + 1] != 0x00 &&
                               !(d[i + 1] >= 0xD0 && d[i + 1] <= 0xD7)))
            i++;
      }
   }
   return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
   const char *path = fuzz_file(data, size);
   lm_tensor *t = NULL;
   if (lm_image_read(path, &t) != LM_OK) return 0;
   FUZZ_CHECK(t != NULL && t->ndim == 3 && t->sizes[2] == 3 && t->dtype == LM_UINT8,
              "lm_image_read returned a bad tensor");
   int64_t h = t->sizes[0], w = t->sizes[1];
   lm_tensor_free(t);

   int is_jpeg = size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
   long eoi = is_jpeg ? jpeg_eoi(data, size) : -1;
   /* drop the EOI marker and up to 7 bytes of scan data before it */
   size_t cut = eoi >= 0 && (size_t)eoi + 2 == size ? (size_t)eoi - (size % 8) : 0;
   if (cut > 2) {
      {
         path = fuzz_file(data, cut);
         lm_tensor *u = NULL;
         lm_status st = lm_image_read(path, &u);
         if (st == LM_OK) lm_tensor_free(u);
         FUZZ_CHECK(st != LM_OK, "a JPEG truncated to %zu of %zu bytes (before its EOI marker) "
                    "was accepted", cut, size);
         path = fuzz_file(data, size);
      }
   }

   if (h * w > (1 << 20) || size < 4) return 0;
   lm_image_opts io;
   memset(&io, 0, sizeof io);
   io.out_h = 1 + data[size - 1] % 24;
   io.out_w = 1 + data[size - 2] % 24;
   io.crop = data[size - 3] % 3;
   io.resize = io.crop == LM_CROP_CENTER ? (data[size - 4] & 1 ? 0 : 32) : 0;
   io.scale[0] = 0.08f;
   io.scale[1] = 1.0f;
   io.ratio[0] = 3.0f / 4.0f;
   io.ratio[1] = 4.0f / 3.0f;
   io.draft = data[size - 4] >> 7;
   int64_t sizes[4] = {1, 3, io.out_h, io.out_w};
   lm_tensor *out = NULL;
   if (lm_empty(4, sizes, LM_FLOAT32, (data[size - 4] >> 6) & 1 ? LM_CHANNELS_LAST : LM_CONTIGUOUS,
                LM_CPU, &out) != LM_OK)
      return 0;
   const float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.25f, 0.25f, 0.25f};
   int flip = (data[size - 4] >> 5) & 1;
   lm_status st = lm_image_load(path, &io, size, flip, mean, std, out);
   if (st == LM_OK && cut > 2) { /* the same check through the sampler (crop, draft) */
      path = fuzz_file(data, cut);
      st = lm_image_load(path, &io, size, flip, mean, std, out);
      FUZZ_CHECK(st != LM_OK, "lm_image_load accepted a JPEG truncated to %zu of %zu bytes "
                 "(before its EOI marker; crop %d, draft %d)", cut, size, (int)io.crop,
                 (int)io.draft);
   }
   lm_tensor_free(out);
   return 0;
}
