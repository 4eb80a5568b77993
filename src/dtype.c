/* dtype.c -- element types: sizes, names, PyTorch's promote_types table, half/bfloat16
 * conversions, and the thread-count wrappers. */
#include "internal.h"

int lm_dtype_size(int dtype) {
   switch (dtype) {
   case LM_FLOAT32: return 4;
   case LM_FLOAT64: return 8;
   case LM_FLOAT16: return 2;
   case LM_BFLOAT16: return 2;
   case LM_INT64: return 8;
   case LM_INT32: return 4;
   case LM_UINT8: return 1;
   case LM_BOOL: return 1;
   default: return 0;
   }
}

const char *lm_dtype_name(int dtype) {
   switch (dtype) {
   case LM_FLOAT32: return "float32";
   case LM_FLOAT64: return "float64";
   case LM_FLOAT16: return "float16";
   case LM_BFLOAT16: return "bfloat16";
   case LM_INT64: return "int64";
   case LM_INT32: return "int32";
   case LM_UINT8: return "uint8";
   case LM_BOOL: return "bool";
   default: return "invalid";
   }
}

int lm_dtype_is_floating(int dtype) { return lm_is_float_dtype(dtype) ? 1 : 0; }

/* rank of an integer type in the promotion lattice (uint8 < int32 < int64) */
static int int_rank(int dt) {
   switch (dt) {
   case LM_UINT8: return 0;
   case LM_INT32: return 1;
   default: return 2;
   }
}

/* PyTorch's promote_types, restricted to lumen's dtypes. -1 for an invalid dtype. */
int lm_promote_types(int a, int b) {
   if (!lm_valid_dtype(a) || !lm_valid_dtype(b)) return -1;
   if (a == b) return a;
   if (a == LM_BOOL) return b;
   if (b == LM_BOOL) return a;
   int fa = lm_is_float_dtype(a), fb = lm_is_float_dtype(b);
   if (fa && fb) {
      if (a == LM_FLOAT64 || b == LM_FLOAT64) return LM_FLOAT64;
      return LM_FLOAT32; /* f32 with f16/bf16, and f16 with bf16 */
   }
   if (fa) return a;
   if (fb) return b;
   return int_rank(a) >= int_rank(b) ? a : b;
}

float lm_half_to_float(uint16_t h) { return lm_h2f(h); }
uint16_t lm_float_to_half(float f) { return lm_f2h(f); }
float lm_bf16_to_float(uint16_t h) { return lm_bf2f(h); }
uint16_t lm_float_to_bf16(float f) { return lm_f2bf(f); }

void lm_set_num_threads(int n) {
#ifdef _OPENMP
   if (n >= 1) omp_set_num_threads(n);
#else
   (void)n;
#endif
}

int lm_get_num_threads(void) {
#ifdef _OPENMP
   return omp_get_max_threads();
#else
   return 1;
#endif
}
