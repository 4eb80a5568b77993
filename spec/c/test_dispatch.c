/* test_dispatch.c -- the seam between operators and devices (src/backend.h) itself, through the
 * public entry points and the internal ones the library exports (lm_backend_get, lm_device_name,
 * lm_dispatch, lm_op_name):
 *   - the registry: each device's backend (name, id, host_visible, has_memory); an unavailable
 *     device gives NULL and an LM_ERR_DEVICE message naming it; lm_device_name for every id;
 *   - sim:k memory: the storage address is not host-readable (bit 61 set) while lm_get / lm_set /
 *     lm_to_doubles / lm_from_doubles / lm_copy_ move values in and out exactly;
 *   - meta: no bytes to read (lm_get, lm_set, lm_to_doubles, copying out refuse with a message),
 *     copying in succeeds, and a meta tensor allocates nothing;
 *   - lm_dispatch: tensors on two devices ("same device", naming both and the op), op kinds out
 *     of range ("not supported"), an op run directly through it on cpu, sim:0 and meta;
 *   - lm_gemm_set_isa: forcing the portable ISA and back refills the CPU kernel table (every kind
 *     has a kernel; conv and pool results equal before and after; sim follows the CPU);
 *   - memory: lm_mem_live_bytes returns to its start after sim and meta tensors are freed.
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *
 *   make && cc -std=c11 -fopenmp -Isrc spec/c/test_dispatch.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_dispatch && /tmp/test_dispatch
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "conv.h"
#include "lumen.h"
#include "nn.h"
#include "ops/softmax.h"

#include "check.h"

#define CASE(...) snprintf(g_case, sizeof g_case, __VA_ARGS__)

/* st must be `want` and the message must hold every non-NULL part */
static void expect(lm_status st, lm_status want, const char *what, const char *p1, const char *p2,
                   const char *p3) {
   const char *msg = lm_last_error();
   check(st == want, "%s: status %d, wanted %d (%s)", what, (int)st, (int)want, msg);
   const char *parts[3] = {p1, p2, p3};
   for (int i = 0; i < 3; i++)
      if (parts[i])
         check(strstr(msg, parts[i]) != NULL, "%s: message '%s' lacks '%s'", what, msg, parts[i]);
}

static lm_tensor *mk(int nd, const int64_t *sz, int dt, int dev) {
   lm_tensor *t = NULL;
   OK(lm_empty(nd, sz, dt, LM_CONTIGUOUS, dev, &t));
   return t;
}

/* ---- the registry --------------------------------------------------------------------------- */

static void registry(void) {
   char buf[32], want[32];
   CASE("lm_backend_get");
   const lm_backend *cpu = lm_backend_get(LM_CPU);
   check(cpu != NULL, "cpu backend");
   if (cpu) {
      check(strcmp(cpu->name, "cpu") == 0, "cpu name '%s'", cpu->name);
      check(cpu->device == LM_CPU, "cpu id %d", cpu->device);
      check(cpu->host_visible == 1 && cpu->has_memory == 1, "cpu: host_visible %d has_memory %d",
            cpu->host_visible, cpu->has_memory);
      check(cpu == lm_cpu_backend(), "lm_backend_get(LM_CPU) is lm_cpu_backend()");
      check(cpu->alloc && cpu->free && cpu->memcpy && cpu->supports_op && cpu->compute,
            "cpu: every function is set");
   }
   const lm_backend *meta = lm_backend_get(LM_META);
   check(meta != NULL, "meta backend");
   if (meta) {
      check(strcmp(meta->name, "meta") == 0, "meta name '%s'", meta->name);
      check(meta->device == LM_META, "meta id %d", meta->device);
      check(meta->host_visible == 0 && meta->has_memory == 0,
            "meta: host_visible %d has_memory %d", meta->host_visible, meta->has_memory);
      check(meta->alloc && meta->free && meta->memcpy && meta->supports_op && meta->compute,
            "meta: every function is set");
   }
   for (int k = 0; k < LM_NUM_SIM; k++) {
      const lm_backend *b = lm_backend_get(LM_SIM0 + k);
      check(b != NULL, "sim:%d backend", k);
      if (!b) continue;
      snprintf(want, sizeof want, "sim:%d", k);
      check(strcmp(b->name, want) == 0, "sim:%d name '%s'", k, b->name);
      check(b->device == LM_SIM0 + k, "sim:%d id %d", k, b->device);
      check(b->host_visible == 0 && b->has_memory == 1, "sim:%d: host_visible %d has_memory %d", k,
            b->host_visible, b->has_memory);
      check(b == lm_sim_backend(k), "lm_backend_get(sim:%d) is lm_sim_backend(%d)", k, k);
      check(b->alloc && b->free && b->memcpy && b->supports_op && b->compute,
            "sim:%d: every function is set", k);
   }
   check(lm_sim_backend(-1) == NULL && lm_sim_backend(LM_NUM_SIM) == NULL,
         "lm_sim_backend out of range is NULL");

   /* cuda:k: available only in a CUDA build (this program cannot tell: either answer, each
      with its own checks) */
   for (int k = 0; k < LM_NUM_CUDA; k++) {
      CASE("lm_backend_get cuda:%d", k);
      lm_clear_error();
      const lm_backend *b = lm_backend_get(LM_CUDA0 + k);
      snprintf(want, sizeof want, "cuda:%d", k);
      if (b) {
         check(strcmp(b->name, want) == 0 && b->device == LM_CUDA0 + k && b->has_memory == 1,
               "cuda:%d: name '%s' id %d", k, b->name, b->device);
      } else {
         expect(LM_ERR_DEVICE, LM_ERR_DEVICE, "cuda unavailable", want, "not available", NULL);
         /* and a tensor cannot be made there: LM_ERR_DEVICE with the registry's message */
         lm_tensor *t = NULL;
         const int64_t sz[1] = {4};
         lm_status st = lm_empty(1, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_CUDA0 + k, &t);
         check(st == LM_ERR_DEVICE && t == NULL, "lm_empty on %s: status %d", want, (int)st);
         expect(LM_ERR_DEVICE, LM_ERR_DEVICE, "lm_empty on cuda", want, "not available", NULL);
      }
   }
   /* ids outside every range */
   const int bad[] = {-1, LM_SIM0 + LM_NUM_SIM, LM_MAX_DEVICES, 100, -1000};
   for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      CASE("lm_backend_get(%d)", bad[i]);
      lm_clear_error();
      const lm_backend *b = lm_backend_get(bad[i]);
      check(b == NULL, "a backend for id %d", bad[i]);
      snprintf(want, sizeof want, "device %d", bad[i]);
      expect(LM_ERR_DEVICE, LM_ERR_DEVICE, "out-of-range id", want, "not available", NULL);
      lm_tensor *t = NULL;
      const int64_t sz[1] = {4};
      lm_status st = lm_empty(1, sz, LM_FLOAT32, LM_CONTIGUOUS, bad[i], &t);
      check(st != LM_OK && t == NULL, "lm_empty on device %d: status %d", bad[i], (int)st);
      expect(LM_ERR_DEVICE, LM_ERR_DEVICE, "lm_empty out-of-range id", want, NULL, NULL);
   }

   CASE("lm_device_name");
   check(strcmp(lm_device_name(LM_CPU, buf, sizeof buf), "cpu") == 0, "cpu: '%s'", buf);
   check(strcmp(lm_device_name(LM_META, buf, sizeof buf), "meta") == 0, "meta: '%s'", buf);
   for (int k = 0; k < LM_NUM_CUDA; k++) {
      snprintf(want, sizeof want, "cuda:%d", k);
      check(strcmp(lm_device_name(LM_CUDA0 + k, buf, sizeof buf), want) == 0, "%s: '%s'", want,
            buf);
   }
   for (int k = 0; k < LM_NUM_SIM; k++) {
      snprintf(want, sizeof want, "sim:%d", k);
      check(strcmp(lm_device_name(LM_SIM0 + k, buf, sizeof buf), want) == 0, "%s: '%s'", want,
            buf);
   }
   for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      snprintf(want, sizeof want, "device %d", bad[i]);
      check(strcmp(lm_device_name(bad[i], buf, sizeof buf), want) == 0, "%s: '%s'", want, buf);
   }
   /* every id 0 .. LM_MAX_DEVICES - 1 has a name of its own and returns buf */
   for (int d = 0; d < LM_MAX_DEVICES; d++) {
      check(lm_device_name(d, buf, sizeof buf) == buf, "returns buf for %d", d);
      check(strncmp(buf, "device ", 7) != 0, "id %d is a known device: '%s'", d, buf);
   }
   /* a short buffer is truncated, not overrun */
   char small[8];
   memset(small, 'x', sizeof small);
   lm_device_name(LM_SIM0 + 3, small, 4);
   check(strcmp(small, "sim") == 0 && small[4] == 'x', "truncated to 3 characters: '%.8s'", small);

   CASE("lm_op_name");
   check(strcmp(lm_op_name(LM_OP_SOFTMAX), "softmax") == 0, "softmax");
   check(strcmp(lm_op_name(LM_OP_CONV2D), "conv2d") == 0, "conv2d");
   check(strcmp(lm_op_name(LM_OP_COPY), "copy_") == 0, "copy_");
   check(strcmp(lm_op_name(LM_OP_COUNT), "unknown operator") == 0, "LM_OP_COUNT");
   check(strcmp(lm_op_name(-1), "unknown operator") == 0, "-1");
   for (int k = 0; k < LM_OP_COUNT; k++) {
      const char *n = lm_op_name(k);
      check(n && *n && strcmp(n, "unknown operator") != 0, "kind %d has a name", k);
      for (int j = 0; j < k; j++)
         if (strcmp(n, lm_op_name(j)) == 0) check(0, "kinds %d and %d share the name %s", j, k, n);
   }
}

/* ---- sim memory ------------------------------------------------------------------------------ */

#define SIM_TAG ((uintptr_t)1 << 61)

static void sim_memory(void) {
   const int dts[] = {LM_FLOAT32, LM_FLOAT64, LM_FLOAT16, LM_BFLOAT16,
                      LM_INT64,   LM_INT32,   LM_UINT8,   LM_BOOL};
   const int64_t sz[3] = {3, 4, 5};
   const int64_t n = 60;
   double *v = malloc(sizeof(double) * (size_t)n), *back = malloc(sizeof(double) * (size_t)n);
   for (int di = 0; di < (int)(sizeof dts / sizeof dts[0]); di++) {
      const int dt = dts[di];
      for (int k = 0; k < LM_NUM_SIM; k++) {
         CASE("sim:%d memory, dtype %d", k, dt);
         /* values every dtype holds exactly */
         for (int64_t i = 0; i < n; i++)
            v[i] = dt == LM_BOOL ? (double)(i % 3 == 0) : (double)((i * 7) % 50);
         lm_tensor *s = mk(3, sz, dt, LM_SIM0 + k);
         check(s->device == LM_SIM0 + k, "device %d", s->device);
         check(s->storage && s->storage->device == LM_SIM0 + k, "storage device");
         check(((uintptr_t)s->storage->data & SIM_TAG) != 0,
               "the storage address %p is not tagged (bit 61)", s->storage->data);
         check(((uintptr_t)lm_tensor_data(s) & SIM_TAG) != 0, "lm_tensor_data is not tagged");
         /* in with lm_from_doubles, out with lm_to_doubles and lm_get */
         OK(lm_from_doubles(s, v));
         memset(back, 0, sizeof(double) * (size_t)n);
         OK(lm_to_doubles(s, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "lm_from/to_doubles round trip");
         const int64_t idx[3] = {2, 1, 3};
         double got = -1;
         OK(lm_get(s, idx, &got));
         check(got == v[2 * 20 + 1 * 5 + 3], "lm_get %g, wanted %g", got, v[2 * 20 + 5 + 3]);
         /* lm_set one element, read it back alone and in bulk */
         OK(lm_set(s, idx, 1));
         OK(lm_get(s, idx, &got));
         check(got == 1, "lm_set then lm_get: %g", got);
         OK(lm_to_doubles(s, back));
         for (int64_t i = 0; i < n; i++)
            if (back[i] != (i == 48 ? 1 : v[i])) {
               check(0, "element %lld after lm_set: %g", (long long)i, back[i]);
               break;
            }
         /* lm_copy_ cpu -> sim -> cpu, the same layout (one transfer each way) */
         lm_tensor *c = mk(3, sz, dt, LM_CPU), *c2 = mk(3, sz, dt, LM_CPU);
         OK(lm_from_doubles(c, v));
         OK(lm_copy_(s, c));
         OK(lm_copy_(c2, s));
         OK(lm_to_doubles(c2, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "lm_copy_ cpu -> sim -> cpu");
         /* through a transposed view on each side (the host-mirror path) */
         lm_tensor *ct = NULL, *st = NULL, *c3 = mk(3, sz, dt, LM_CPU);
         OK(lm_transpose(c, 0, 2, &ct));
         lm_tensor *s2 = NULL;
         OK(lm_empty(3, ct->sizes, dt, LM_CONTIGUOUS, LM_SIM0 + k, &s2));
         OK(lm_copy_(s2, ct)); /* sim (contiguous) <- cpu (transposed) */
         OK(lm_transpose(s2, 0, 2, &st));
         check(st->device == LM_SIM0 + k, "a view keeps the device");
         check(((uintptr_t)lm_tensor_data(st) & SIM_TAG) != 0, "a view's data is tagged");
         OK(lm_copy_(c3, st)); /* cpu <- sim (transposed) */
         OK(lm_to_doubles(c3, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "copies through transposes");
         OK(lm_to_doubles(st, back)); /* lm_to_doubles of a non-contiguous sim view */
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "lm_to_doubles of a sim view");
         const int64_t tidx[3] = {3, 1, 2}; /* st[2][1][3] read through s2's layout */
         OK(lm_get(s2, tidx, &got));
         check(got == v[48], "lm_get on a transposed copy: %g, wanted %g", got, v[48]);
         /* sim:k -> sim:(k+1) (a device-to-device transfer), then back to the host (s holds v again:
            the cpu -> sim copy above overwrote the lm_set) */
         const int k2 = (k + 1) % LM_NUM_SIM;
         lm_tensor *o = mk(3, sz, dt, LM_SIM0 + k2);
         OK(lm_copy_(o, s));
         OK(lm_copy_(c2, o));
         OK(lm_to_doubles(c2, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "lm_copy_ sim:%d -> sim:%d", k,
               k2);
         /* within one sim device (a COPY op through lm_dispatch), contiguous and transposed */
         lm_tensor *s3 = mk(3, sz, dt, LM_SIM0 + k), *c4 = mk(3, sz, dt, LM_CPU);
         OK(lm_copy_(s3, s));
         OK(lm_copy_(c4, s3));
         OK(lm_to_doubles(c4, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0, "lm_copy_ within sim:%d", k);
         OK(lm_copy_(s3, st));
         OK(lm_to_doubles(s3, back));
         check(memcmp(v, back, sizeof(double) * (size_t)n) == 0,
               "lm_copy_ within sim:%d from a transposed view", k);
         lm_tensor_free_many((lm_tensor *[]){s, c, c2, ct, st, c3, s2, o, s3, c4}, 10);
      }
   }
   /* an out-of-bounds index is refused before any transfer */
   CASE("sim lm_get bounds");
   lm_tensor *s = mk(3, sz, LM_FLOAT32, LM_SIM0);
   const int64_t oob[3] = {3, 0, 0};
   double got = 0;
   expect(lm_get(s, oob, &got), LM_ERR_ARG, "lm_get out of bounds", "out of bounds", NULL, NULL);
   expect(lm_set(s, oob, 1), LM_ERR_ARG, "lm_set out of bounds", "out of bounds", NULL, NULL);
   /* 0-dim and empty sim tensors */
   lm_tensor *z = mk(0, NULL, LM_FLOAT64, LM_SIM0), *e = NULL;
   OK(lm_set(z, NULL, 2.5));
   OK(lm_get(z, NULL, &got));
   check(got == 2.5, "0-dim sim tensor: %g", got);
   const int64_t esz[2] = {0, 3};
   e = mk(2, esz, LM_FLOAT32, LM_SIM0);
   OK(lm_to_doubles(e, back));
   lm_tensor_free(s), lm_tensor_free(z), lm_tensor_free(e);
   free(v), free(back);
}

/* ---- meta: no data --------------------------------------------------------------------------- */

static void meta_data(void) {
   CASE("meta has no data");
   const int64_t sz[2] = {3, 4};
   lm_tensor *m = mk(2, sz, LM_FLOAT32, LM_META), *c = mk(2, sz, LM_FLOAT32, LM_CPU);
   lm_tensor *s = mk(2, sz, LM_FLOAT32, LM_SIM0);
   check(m->device == LM_META && m->storage && m->storage->device == LM_META, "meta storage");
   check(m->storage->data != NULL, "the meta data pointer is not NULL");
   check(m->strides[0] == 4 && m->strides[1] == 1 && m->numel == 12, "meta sizes and strides");
   OK(lm_fill_(c, 3));
   OK(lm_copy_(s, c));
   const int64_t idx[2] = {1, 2};
   double got = 0, buf[12];
   expect(lm_get(m, idx, &got), LM_ERR_DEVICE, "lm_get", "meta tensors have no data", NULL, NULL);
   expect(lm_set(m, idx, 1), LM_ERR_DEVICE, "lm_set", "meta tensors have no data", NULL, NULL);
   expect(lm_to_doubles(m, buf), LM_ERR_DEVICE, "lm_to_doubles", "meta tensors have no data",
          NULL, NULL);
   expect(lm_copy_(c, m), LM_ERR_DEVICE, "lm_copy_ meta -> cpu", "cannot copy out of a meta tensor",
          NULL, NULL);
   expect(lm_copy_(s, m), LM_ERR_DEVICE, "lm_copy_ meta -> sim",
          "cannot copy out of a meta tensor", NULL, NULL);
   OK(lm_to_doubles(c, buf));
   check(buf[0] == 3 && buf[11] == 3, "the cpu tensor is unchanged by the failed copy");
   /* into meta: the shapes are checked, nothing is moved */
   OK(lm_copy_(m, c));
   OK(lm_copy_(m, s));
   lm_tensor *m2 = mk(2, sz, LM_FLOAT64, LM_META);
   OK(lm_copy_(m2, m));
   const int64_t sz2[2] = {5, 4};
   lm_tensor *cw = mk(2, sz2, LM_FLOAT32, LM_CPU);
   check(lm_copy_(m, cw) == LM_ERR_SHAPE, "cpu -> meta with a wrong shape: %s", lm_last_error());
   /* ops on meta compute nothing and still succeed */
   lm_tensor *y = NULL;
   OK(lm_softmax(m, 1, &y));
   check(y->device == LM_META && y->numel == 12, "softmax on meta gives a meta tensor");
   lm_tensor_free_many((lm_tensor *[]){m, c, s, m2, cw, y}, 6);
}

/* ---- lm_dispatch ----------------------------------------------------------------------------- */

static void dispatch(void) {
   const int64_t sz[2] = {4, 6};
   lm_tensor *cx = mk(2, sz, LM_FLOAT32, LM_CPU), *cy = mk(2, sz, LM_FLOAT32, LM_CPU);
   OK(lm_uniform_(cx, -2, 2));
   lm_tensor *sx = mk(2, sz, LM_FLOAT32, LM_SIM0), *sy = mk(2, sz, LM_FLOAT32, LM_SIM0);
   lm_tensor *s1y = mk(2, sz, LM_FLOAT32, LM_SIM0 + 1);
   lm_tensor *mx = mk(2, sz, LM_FLOAT32, LM_META), *my = mk(2, sz, LM_FLOAT32, LM_META);
   OK(lm_copy_(sx, cx));
   const lm_softmax_params p = {1, 0};

   /* tensors on two devices: refused before any compute, naming both devices and the op */
   struct {
      lm_tensor *a, *b;
      const char *da, *db;
   } mixed[] = {
      {cx, sy, "cpu", "sim:0"}, {sx, cy, "sim:0", "cpu"},   {cx, my, "cpu", "meta"},
      {mx, sy, "meta", "sim:0"}, {sx, s1y, "sim:0", "sim:1"},
   };
   for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; i++) {
      CASE("lm_dispatch %s and %s", mixed[i].da, mixed[i].db);
      lm_tensor *ts[2] = {mixed[i].a, mixed[i].b};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX, 2, ts, &p);
      expect(lm_dispatch(&op), LM_ERR_DEVICE, "mixed", "same device", mixed[i].da, "(softmax)");
      char want[64];
      snprintf(want, sizeof want, "got %s and %s", mixed[i].da, mixed[i].db);
      check(strstr(lm_last_error(), want) != NULL, "'%s' lacks '%s'", lm_last_error(), want);
   }
   /* NULL slots (an absent optional tensor) are skipped: the device is the first present one */
   CASE("lm_dispatch NULL slots");
   {
      lm_tensor *ts[4] = {NULL, cx, NULL, sy};
      const lm_op op = lm_op_make(LM_OP_COPY, 4, ts, NULL);
      expect(lm_dispatch(&op), LM_ERR_DEVICE, "NULL then mixed", "same device", "got cpu and sim:0",
             "copy_");
   }
   /* lm_check_same_device itself */
   CASE("lm_check_same_device");
   check(lm_check_same_device(cx, cy, "x") == LM_OK, "cpu and cpu");
   check(lm_check_same_device(cx, NULL, "x") == LM_OK && lm_check_same_device(NULL, sy, "x") ==
                                                                LM_OK,
         "NULL is on every device");
   expect(lm_check_same_device(sx, mx, "my op"), LM_ERR_DEVICE, "sim and meta", "same device",
          "got sim:0 and meta", "(my op)");

   /* op kinds out of range: "not supported" on the devices that compute; meta computes nothing */
   const int kinds[2] = {LM_OP_COUNT, -1};
   for (int i = 0; i < 2; i++) {
      CASE("lm_dispatch kind %d", kinds[i]);
      lm_tensor *tc[2] = {cx, cy}, *ts[2] = {sx, sy}, *tm[2] = {mx, my};
      lm_op op = lm_op_make(kinds[i], 2, tc, &p);
      expect(lm_dispatch(&op), LM_ERR_DEVICE, "cpu", "not supported on cpu", NULL, NULL);
      op.t = ts;
      expect(lm_dispatch(&op), LM_ERR_DEVICE, "sim:0", "not supported on sim:0", NULL, NULL);
      op.t = tm;
      check(lm_dispatch(&op) == LM_OK, "meta returns LM_OK at once");
      op.nt = 0; /* no tensors: the CPU */
      expect(lm_dispatch(&op), LM_ERR_DEVICE, "no tensors", "not supported on cpu", NULL, NULL);
   }
   /* every kind is supported on cpu, sim:k and meta; none past the end */
   CASE("supports_op");
   for (int d = 0; d < 2 + LM_NUM_SIM; d++) {
      const int dev = d == 0 ? LM_CPU : d == 1 ? LM_META : LM_SIM0 + d - 2;
      const lm_backend *b = lm_backend_get(dev);
      for (int k = 0; k < LM_OP_COUNT; k++) {
         const lm_op op = lm_op_make(k, 0, NULL, NULL);
         if (!b->supports_op(b, &op)) check(0, "%s has no kernel for %s", b->name, lm_op_name(k));
      }
      const lm_op op = lm_op_make(LM_OP_COUNT, 0, NULL, NULL);
      if (dev != LM_META) check(!b->supports_op(b, &op), "%s supports LM_OP_COUNT", b->name);
   }

   /* an op run straight through lm_dispatch: the same values as the public front end */
   CASE("lm_dispatch softmax");
   lm_tensor *ref = NULL;
   OK(lm_softmax(cx, 1, &ref));
   double a[24], b[24];
   OK(lm_to_doubles(ref, a));
   {
      lm_tensor *ts[2] = {cx, cy};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX, 2, ts, &p);
      OK(lm_dispatch(&op));
      OK(lm_to_doubles(cy, b));
      check(memcmp(a, b, sizeof a) == 0, "cpu: lm_dispatch and lm_softmax differ");
   }
   {
      lm_tensor *ts[2] = {sx, sy};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX, 2, ts, &p);
      OK(lm_dispatch(&op));
      OK(lm_to_doubles(sy, b));
      check(memcmp(a, b, sizeof a) == 0, "sim:0: lm_dispatch and lm_softmax differ");
   }
   {
      lm_tensor *ts[2] = {mx, my};
      const lm_op op = lm_op_make(LM_OP_SOFTMAX, 2, ts, &p);
      check(lm_dispatch(&op) == LM_OK, "meta: %s", lm_last_error());
   }
   lm_tensor_free_many((lm_tensor *[]){cx, cy, sx, sy, s1y, mx, my, ref}, 8);
}

/* ---- lm_gemm_set_isa refills the table ------------------------------------------------------- */

typedef struct {
   double *conv, *mpool, *apool, *smax;
   int64_t nconv, npool;
} isa_results;

static void isa_run(isa_results *r, int dev) {
   const int64_t xs[4] = {2, 8, 13, 11}, ws[4] = {16, 8, 3, 3};
   const int64_t st[2] = {1, 1}, pd[2] = {1, 1}, dl[2] = {1, 1}, k2[2] = {2, 2}, s2[2] = {2, 2};
   const int64_t z2[2] = {0, 0};
   /* the same inputs every time (the seed), made on the CPU, moved to dev */
   lm_manual_seed(99);
   lm_tensor *cx = mk(4, xs, LM_FLOAT32, LM_CPU), *cw = mk(4, ws, LM_FLOAT32, LM_CPU);
   OK(lm_uniform_(cx, -1, 1));
   OK(lm_uniform_(cw, -1, 1));
   lm_tensor *x = cx, *w = cw;
   if (dev != LM_CPU) {
      x = mk(4, xs, LM_FLOAT32, dev), w = mk(4, ws, LM_FLOAT32, dev);
      OK(lm_copy_(x, cx));
      OK(lm_copy_(w, cw));
   }
   lm_tensor *y = NULL, *mp = NULL, *ap = NULL, *sm = NULL;
   OK(lm_conv2d(x, w, NULL, st, pd, dl, 1, LM_PRESERVE, 0, NULL, &y));
   OK(lm_max_pool2d(x, k2, s2, z2, dl, 0, &mp, NULL));
   OK(lm_avg_pool2d(x, k2, s2, z2, 0, 1, NULL, &ap));
   OK(lm_softmax(x, 1, &sm));
   r->nconv = y->numel;
   r->npool = mp->numel;
   r->conv = malloc(sizeof(double) * (size_t)y->numel);
   r->mpool = malloc(sizeof(double) * (size_t)mp->numel);
   r->apool = malloc(sizeof(double) * (size_t)ap->numel);
   r->smax = malloc(sizeof(double) * (size_t)sm->numel);
   OK(lm_to_doubles(y, r->conv));
   OK(lm_to_doubles(mp, r->mpool));
   OK(lm_to_doubles(ap, r->apool));
   OK(lm_to_doubles(sm, r->smax));
   if (dev != LM_CPU) lm_tensor_free(x), lm_tensor_free(w);
   lm_tensor_free_many((lm_tensor *[]){cx, cw, y, mp, ap, sm}, 6);
}

static void isa_free(isa_results *r) { free(r->conv), free(r->mpool), free(r->apool), free(r->smax); }

static int same_doubles(const double *a, const double *b, int64_t n) {
   return memcmp(a, b, sizeof(double) * (size_t)n) == 0;
}

static int close_doubles(const double *a, const double *b, int64_t n, double tol) {
   for (int64_t i = 0; i < n; i++)
      if (fabs(a[i] - b[i]) > tol * (1 + fabs(a[i]))) return 0;
   return 1;
}

static void isa(void) {
   CASE("lm_gemm_set_isa");
   const int best = lm_gemm_isa();
   check(best >= LM_ISA_C && best <= LM_ISA_MAX, "lm_gemm_isa() = %d", best);
   isa_results before, forced, forced_sim, after, after_sim;
   isa_run(&before, LM_CPU);
   check(lm_gemm_set_isa(1) == 1, "lm_gemm_set_isa(1) returns 1");
   check(lm_gemm_isa() == 1, "lm_gemm_isa() after forcing: %d", lm_gemm_isa());
   /* every kind still has a kernel after the refill */
   const lm_backend *cpu = lm_backend_get(LM_CPU);
   for (int k = 0; k < LM_OP_COUNT; k++) {
      const lm_op op = lm_op_make(k, 0, NULL, NULL);
      if (!cpu->supports_op(cpu, &op)) check(0, "portable: no kernel for %s", lm_op_name(k));
   }
   isa_run(&forced, LM_CPU);
   isa_run(&forced_sim, LM_SIM0);
   check(lm_gemm_set_isa(0) == best, "lm_gemm_set_isa(0) returns the probe's %d", best);
   check(lm_gemm_isa() == best, "lm_gemm_isa() after auto: %d", lm_gemm_isa());
   for (int k = 0; k < LM_OP_COUNT; k++) {
      const lm_op op = lm_op_make(k, 0, NULL, NULL);
      if (!cpu->supports_op(cpu, &op)) check(0, "auto: no kernel for %s", lm_op_name(k));
   }
   isa_run(&after, LM_CPU);
   isa_run(&after_sim, LM_SIM0);
   /* the machine's kernels again: bit for bit what they gave before the round trip */
   check(same_doubles(before.conv, after.conv, before.nconv), "conv2d before/after differ");
   check(same_doubles(before.mpool, after.mpool, before.npool), "max_pool2d before/after differ");
   check(same_doubles(before.apool, after.apool, before.npool), "avg_pool2d before/after differ");
   check(same_doubles(before.smax, after.smax, 2 * 8 * 13 * 11), "softmax before/after differ");
   /* the portable kernels: the same results up to rounding (max pool exactly) */
   check(close_doubles(before.conv, forced.conv, before.nconv, 1e-5), "conv2d portable differs");
   check(same_doubles(before.mpool, forced.mpool, before.npool), "max_pool2d portable differs");
   check(close_doubles(before.apool, forced.apool, before.npool, 1e-6),
         "avg_pool2d portable differs");
   /* sim runs the CPU's table as it is at the time: bit for bit the CPU's, at either ISA */
   check(same_doubles(forced.conv, forced_sim.conv, forced.nconv), "sim conv2d (portable)");
   check(same_doubles(forced.apool, forced_sim.apool, forced.npool), "sim avg_pool2d (portable)");
   check(same_doubles(after.conv, after_sim.conv, after.nconv), "sim conv2d (auto)");
   check(same_doubles(after.mpool, after_sim.mpool, after.npool), "sim max_pool2d (auto)");
   check(same_doubles(after.smax, after_sim.smax, 2 * 8 * 13 * 11), "sim softmax (auto)");
   /* an unknown request changes nothing */
   check(lm_gemm_set_isa(7) == best && lm_gemm_isa() == best, "lm_gemm_set_isa(7) ignored");
   isa_free(&before), isa_free(&forced), isa_free(&forced_sim), isa_free(&after),
      isa_free(&after_sim);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static void memory(void) {
   CASE("lm_mem_live_bytes");
   const int64_t start = lm_mem_live_bytes();
   /* meta allocates nothing, however large */
   const int64_t big[3] = {1024, 1024, 1024};
   lm_tensor *m = mk(3, big, LM_FLOAT32, LM_META);
   check(m->numel == (int64_t)1 << 30, "meta numel %lld", (long long)m->numel);
   check(lm_mem_live_bytes() == start, "a 4 GiB meta tensor took %lld bytes",
         (long long)(lm_mem_live_bytes() - start));
   lm_tensor *mv = NULL;
   OK(lm_transpose(m, 0, 2, &mv));
   lm_tensor *mc = NULL;
   OK(lm_clone(mv, LM_CONTIGUOUS, LM_FLOAT64, &mc)); /* an 8 GiB meta clone */
   check(mc->device == LM_META && mc->dtype == LM_FLOAT64, "meta clone");
   check(lm_mem_live_bytes() == start, "meta views and clones took %lld bytes",
         (long long)(lm_mem_live_bytes() - start));
   lm_tensor_free_many((lm_tensor *[]){m, mv, mc}, 3);
   check(lm_mem_live_bytes() == start, "after freeing meta: %lld bytes",
         (long long)(lm_mem_live_bytes() - start));

   /* sim: its memory is counted while held and returned when freed, on every sim device */
   const int64_t sz[2] = {256, 129};
   lm_tensor *s[LM_NUM_SIM];
   for (int k = 0; k < LM_NUM_SIM; k++) s[k] = mk(2, sz, LM_FLOAT64, LM_SIM0 + k);
   const int64_t held = lm_mem_live_bytes() - start;
   check(held >= (int64_t)LM_NUM_SIM * 256 * 129 * 8, "sim tensors counted: %lld bytes",
         (long long)held);
   /* work on them: transfers, ops, views, temporaries (host mirrors, dense copies) */
   lm_tensor *c = mk(2, sz, LM_FLOAT64, LM_CPU);
   OK(lm_uniform_(c, 0, 1));
   lm_tensor *ct = NULL, *st = NULL, *y = NULL, *gy = NULL;
   OK(lm_copy_(s[0], c));
   OK(lm_copy_(s[1], s[0]));
   OK(lm_transpose(c, 0, 1, &ct));
   OK(lm_transpose(s[1], 0, 1, &st));
   OK(lm_softmax(st, 0, &y)); /* st is not contiguous: a dense copy first */
   OK(lm_softmax_backward(st, y, 0, &gy));
   double *buf = malloc(sizeof(double) * 256 * 129);
   OK(lm_to_doubles(st, buf));
   OK(lm_from_doubles(s[2], buf));
   OK(lm_copy_(ct, st)); /* sim (transposed) -> cpu (transposed) */
   OK(lm_copy_(c, s[3]));
   free(buf);
   lm_tensor_free_many((lm_tensor *[]){c, ct, st, y, gy}, 5);
   for (int k = 0; k < LM_NUM_SIM; k++) lm_tensor_free(s[k]);
   check(lm_mem_live_bytes() == start, "after freeing sim: %lld bytes left",
         (long long)(lm_mem_live_bytes() - start));
}

int main(void) {
   lm_manual_seed(1234);
   registry();
   sim_memory();
   meta_data();
   dispatch();
   isa();
   memory();
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
