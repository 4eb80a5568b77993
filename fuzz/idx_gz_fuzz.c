/* libFuzzer harness: gzip-compressed IDX files (src/data.c, lm_idx_read through zlib).
 * Mutating deflate streams byte by byte rarely gives a valid stream, so this harness compresses
 * the input itself: byte 0 is a control byte, the rest is the IDX payload. The payload is
 * gzip-compressed (zlib, deflate level 1), then, following the control byte:
 *   bits 0-2 (c & 7): 1..7 cut that many bytes off the end (into the CRC-32 / length trailer)
 *   bit 3:   flip a bit of the trailer's CRC-32
 *   bit 4:   flip a bit of the trailer's length (ISIZE)
 *   bit 5:   append a second gzip member holding the last byte of the payload
 * Check beyond crashes: a file whose trailer was cut or corrupted must be rejected (gzip's
 * CRC-32 and length are how a reader knows the data is whole); a file that only gained a valid
 * second member must read the same as without it would (no check: either is defensible). */
#include "common.h"
#include "lumen.h"
#include <zlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
   (void)argc;
   (void)argv;
   setenv("OMP_NUM_THREADS", "1", 0);
   return 0;
}

/* gzip-compress src into a new buffer (*out, *out_len); 0 on success */
static int gz(const uint8_t *src, size_t n, uint8_t **out, size_t *out_len) {
   z_stream z;
   memset(&z, 0, sizeof z);
   if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
   size_t cap = deflateBound(&z, (uLong)n) + 32;
   uint8_t *buf = malloc(cap);
   if (!buf) {
      deflateEnd(&z);
      return -1;
   }
   z.next_in = (Bytef *)src;
   z.avail_in = (uInt)n;
   z.next_out = buf;
   z.avail_out = (uInt)cap;
   int r = deflate(&z, Z_FINISH);
   *out_len = cap - z.avail_out;
   deflateEnd(&z);
   if (r != Z_STREAM_END) {
      free(buf);
      return -1;
   }
   *out = buf;
   return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
   if (size < 1 || size > (1 << 20)) return 0;
   unsigned c = data[0];
   uint8_t *z = NULL, *z2 = NULL;
   size_t zn = 0, z2n = 0;
   if (gz(data + 1, size - 1, &z, &zn) != 0) return 0;
   int corrupt = 0;
   if (c & 8) {
      z[zn - 8] ^= (uint8_t)(1u << (c >> 6)); /* the CRC-32's first byte */
      corrupt = 1;
   }
   if (c & 16) {
      z[zn - 4] ^= 1; /* the length's low byte */
      corrupt = 1;
   }
   size_t cut = c & 7;
   if (cut) {
      zn -= cut;
      corrupt = 1;
   }
   if (!corrupt && (c & 32) && size > 1 && gz(data + size - 1, 1, &z2, &z2n) == 0) {
      uint8_t *both = realloc(z, zn + z2n);
      if (both) {
         memcpy(both + zn, z2, z2n);
         z = both;
         zn += z2n;
      }
      free(z2);
   }
   const char *path = fuzz_file(z, zn);
   free(z);
   lm_tensor *t = NULL;
   lm_status st = lm_idx_read(path, &t);
   if (st == LM_OK) lm_tensor_free(t);
   FUZZ_CHECK(!(st == LM_OK && corrupt), "a gzip IDX file with a %s trailer was accepted "
              "(control byte 0x%02x)", cut ? "truncated" : "corrupt", c);
   return 0;
}
