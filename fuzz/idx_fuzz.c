/* libFuzzer harness: lm_idx_read (src/data.c) on arbitrary bytes, plain or gzip-compressed (the
 * seeds hold both; gzopen reads either). A success must give a tensor whose size matches the
 * header, and its data is read back in full (ASan checks the bounds). */
#include "common.h"
#include "lumen.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
   (void)argc;
   (void)argv;
   setenv("OMP_NUM_THREADS", "1", 0);
   return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
   const char *path = fuzz_file(data, size);
   lm_tensor *t = NULL;
   if (lm_idx_read(path, &t) == LM_OK) {
      FUZZ_CHECK(t != NULL, "lm_idx_read returned LM_OK without a tensor");
      int64_t numel = 1;
      for (int d = 0; d < t->ndim; d++) numel *= t->sizes[d];
      size_t nbytes = (size_t)numel * lm_dtype_size(t->dtype);
      const volatile unsigned char *p = lm_tensor_data(t);
      unsigned sum = 0;
      for (size_t i = 0; i < nbytes; i++) sum += p[i];
      (void)sum;
      lm_tensor_free(t);
   }
   return 0;
}
