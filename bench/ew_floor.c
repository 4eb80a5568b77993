/* bench/ew_floor.c -- the memory floor of x + x then relu on 8x64x56x56 float32 (6.4 MB): a
 * bare AVX-512 loop over 2 OpenMP threads, writing into `buffers` output blocks in rotation,
 * with streaming stores (stream 1) or ordinary ones (0). With 15 buffers every result lands in
 * cold memory, as a result dropped in Lua does until the collector frees it (lumen's add_relu
 * row); with 1 or 2 the block is still in cache, as after PyTorch's immediate free.
 *
 *   cc -O2 -mavx512f -fopenmp bench/ew_floor.c -o /tmp/ew_floor
 *   /tmp/ew_floor 15 1; /tmp/ew_floor 15 0; /tmp/ew_floor 1 0
 *
 * Prints the median and the minimum of 50 timed calls after 10 warm-up ones. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec * 1e-6; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
   const long n = 8L * 64 * 56 * 56;
   const int nb = argc > 1 ? atoi(argv[1]) : 15, stream = argc > 2 ? atoi(argv[2]) : 1;
   float *x = aligned_alloc(64, n * 4);
   for (long i = 0; i < n; i++) x[i] = (float)(i % 17) - 8;
   float **o = malloc(nb * sizeof(float *));
   for (int b = 0; b < nb; b++) { o[b] = aligned_alloc(64, n * 4); memset(o[b], 0, n * 4); }
   double t[60];
   for (int it = 0; it < 60; it++) {
      float *y = o[it % nb];
      double a = now();
#pragma omp parallel for num_threads(2) schedule(static)
      for (long i = 0; i < n; i += 16) {
         __m512 v = _mm512_load_ps(x + i);
         v = _mm512_max_ps(_mm512_add_ps(v, v), _mm512_setzero_ps());
         if (stream) _mm512_stream_ps(y + i, v); else _mm512_store_ps(y + i, v);
      }
      t[it] = now() - a;
   }
   qsort(t + 10, 50, sizeof(double), cmp);
   printf("buffers %d stream %d: median %.3f ms, min %.3f\n", nb, stream, t[35], t[10]);
   return 0;
}
