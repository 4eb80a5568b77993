/* image.h -- what the batch loader (data.c) uses from the image decoder (image.c). Internal: not
 * part of the FFI header. */
#ifndef LUMEN_IMAGE_H
#define LUMEN_IMAGE_H
#include "lumen.h"

struct lm_image_list {
   int refcount;      /* atomic: the Lua handle and every loader hold one */
   int64_t n;
   const char **paths; /* n pointers into blob */
   char *blob;
   int64_t *labels;    /* n labels, or NULL */
};

void lm_image_list_retain(lm_image_list *l);

/* the opts a loader or lm_image_load accepts (error set otherwise) */
lm_status lm_image_opts_check(const lm_image_opts *io);

/* decode paths[idx] and write it, resampled per io, into dst: the sample's first element, with
   element strides sC, sH, sW; out = value * scale[c] + shift[c] for value in [0, 255]. rng is the
   sample's random stream seed (RANDOM crop); flip mirrors the sample horizontally. */
lm_status lm_image_sample(const char *path, const lm_image_opts *io, uint64_t rng, int flip,
                          float *dst, int64_t sC, int64_t sH, int64_t sW, const float *scale,
                          const float *shift);

#endif
