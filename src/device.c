/* device.c -- the per-device dispatch table. The CPU entry is always present; a CUDA backend
 * (kernels/cuda, built with LM_WITH_CUDA) supplies lm_cuda_device_ops(k) for cuda:k. The table is
 * constant: nothing here changes at run time. */
#include "internal.h"

static lm_status cpu_memcpy(void *dst, const void *src, size_t nbytes, int dir) {
   (void)dir;
   if (nbytes) memcpy(dst, src, nbytes);
   return LM_OK;
}

static const lm_device_ops cpu_ops = {"cpu", lm_alloc, lm_free, cpu_memcpy};

#ifdef LM_WITH_CUDA
const lm_device_ops *lm_cuda_device_ops(int index);
#endif

const lm_device_ops *lm_device_get(int device) {
   if (device == LM_CPU) return &cpu_ops;
#ifdef LM_WITH_CUDA
   if (device >= LM_CUDA0 && device < LM_MAX_DEVICES) return lm_cuda_device_ops(device - LM_CUDA0);
#endif
   return NULL;
}

lm_status lm_check_cpu(const lm_tensor *t, const char *what) {
   if (t && t->device != LM_CPU)
      return lm_error(LM_ERR_DEVICE, "%s is on device %d; this operator runs on the CPU only",
                      what, t->device);
   return LM_OK;
}
