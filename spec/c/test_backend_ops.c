/* test_backend_ops.c -- every operator kind of LM_OP_LIST (src/backend.h) on every device against
 * the CPU, from one table (as ggml's test-backend-ops).
 *
 * OPS[] (at the end) has one entry per operator family: the LM_OP kinds it covers, a case builder,
 * the CPU instruction-set levels it runs at, and the family's device rules. A case builder makes
 * CPU inputs (shapes; dtypes; contiguous, channels-last, strided, narrowed and transposed views)
 * and hands run_case a function that calls the public front ends (lumen.h, conv.h, nn.h) on
 * whatever device its inputs are on. run_case runs it on the CPU (the reference, on copies of the
 * inputs, so that in-place ops see the same values everywhere), then on each other device with
 * the inputs copied there (the same sizes and strides), and compares every result:
 *   sim:0   the test device (kernels/sim/: the CPU's kernels on memory the host cannot read): the
 *           CPU's sizes, strides and dtype, the values bit for bit;
 *   meta    LM_OK, the CPU's sizes, strides and dtype (no values);
 *   cuda:0  when the CUDA library loads (a GPU with build/liblumen_cuda.so, or the emulated
 *           build: LUMEN_CUDA_LIB=build/liblumen_cuda_emu.so, `make test-ops-cuda-emu`): the CPU's
 *           sizes, strides and dtype, the values within the cuda specs' tolerances (relative to
 *           max(1, max |reference|); integers and bools exact; NaN where the CPU has NaN). Kinds
 *           the CUDA table lacks must fail with "<op> is not supported on cuda:0".
 * Each family runs at the machine's best instruction-set level and at lower ones (lm_cpu_set_isa:
 * LM_ISA_AVX512, LM_ISA_AVX2, LM_ISA_C; the entry's `isas` says which), so every kernel copy is
 * compared with the others through sim:0. Inside a case, results that must agree on the CPU are
 * compared too (a gradient asked for alone and with the others, max_pool2d with and without
 * indices and through tap numbers, out= tensors).
 *
 * Coverage: the program fails when an LM_OP kind has no entry in OPS[] (the message says what to
 * add), and when an entry's cases never dispatch one of its kinds on cpu, sim:0 (and cuda:0), or
 * never run on meta. Which kernels ran is read from lm_dispatch's LUMEN_VERBOSE lines: stderr goes
 * to a file while a case runs (its other lines are echoed to stdout; after a crash the file is
 * named at the start of the output).
 *
 * Device rules (each family's `rules`, once): a CPU tensor mixed with a sim:0 one gives
 * LM_ERR_DEVICE "same device" (naming both devices and the op), out= tensors on another device,
 * copies between devices and into / out of meta, element access on meta, the kernels' value
 * errors (an index or tap number out of range, a target out of bounds) from sim:0 as from the CPU
 * and not looked at on meta, the front ends' argument errors on every device.
 *
 * A standalone program: prints "N passed, N failed", exits non-zero on any failure.
 *   make && cc -std=c11 -fopenmp -Isrc spec/c/test_backend_ops.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -lm -o /tmp/test_backend_ops && /tmp/test_backend_ops
 *   LUMEN_CUDA_LIB=$PWD/build/liblumen_cuda_emu.so /tmp/test_backend_ops     (after make cuda-emu)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend.h"
#include "conv.h"
#include "lumen.h"
#include "nn.h"

#include "check.h"

#define TRY(expr)                                                                                \
   do {                                                                                          \
      lm_status s_ = (expr);                                                                     \
      if (s_ != LM_OK) return s_;                                                                \
   } while (0)

/* ---- the op kinds' enum names (for messages) --------------------------------------------- */
static const char *const KIND_ID[LM_OP_COUNT] = {
#define KIND_ID_(k, name) "LM_OP_" #k,
   LM_OP_LIST(KIND_ID_)
#undef KIND_ID_
};

static int kind_of(const char *name) {
   for (int k = 0; k < LM_OP_COUNT; k++)
      if (strcmp(lm_op_name(k), name) == 0) return k;
   return -1;
}

/* ---- devices ------------------------------------------------------------------------------ */
enum { D_CPU, D_SIM, D_META, D_CUDA, NDEV };
static const int DEV_ID[NDEV] = {LM_CPU, LM_SIM0, LM_META, LM_CUDA0};
static const char *const DEV_NAME[NDEV] = {"cpu", "sim:0", "meta", "cuda:0"};
static int g_has_cuda;

/* ---- tensors kept until the end of a case ------------------------------------------------ */
enum { KEEP_MAX = 2048 };
static lm_tensor *g_keep[KEEP_MAX];
static int g_nkeep;
static lm_tensor *keep(lm_tensor *t) {
   if (!t) return NULL;
   for (int i = 0; i < g_nkeep; i++)
      if (g_keep[i] == t) return t;
   if (g_nkeep == KEEP_MAX) {
      printf("keep: too many tensors\n");
      exit(2);
   }
   g_keep[g_nkeep++] = t;
   return t;
}
static void free_kept(void) {
   while (g_nkeep > 0) lm_tensor_free(g_keep[--g_nkeep]);
}

/* ---- inputs -------------------------------------------------------------------------------- */
/* contiguous; channels-last (4-D) / channels_last_3d (5-D), else contiguous; every other element
   of the last dim at offset 1; the last dim narrowed out of a wider one (offset 1); the last two
   dims transposed */
enum { L_CONTIG, L_CL, L_STRIDED, L_NARROW, L_TRANS };
static const char *const LAYOUT_NAME[] = {"contiguous", "channels_last", "strided", "narrow",
                                          "transposed"};

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double rnd01(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (double)(g_rng >> 11) / 9007199254740992.0;
}

static int is_float(int dt) {
   return dt == LM_FLOAT32 || dt == LM_FLOAT64 || dt == LM_FLOAT16 || dt == LM_BFLOAT16;
}

/* a CPU tensor of sizes sz in `layout`, values uniform in [lo, hi) (integers: floor; bool: half
   true) */
static lm_tensor *cpu_rand(int nd, const int64_t *sz, int dt, int layout, double lo, double hi) {
   int64_t bsz[LM_MAX_DIMS];
   if (nd > 0) memcpy(bsz, sz, sizeof(int64_t) * (size_t)nd);
   if (nd == 0 || (layout == L_TRANS && nd < 2)) layout = L_CONTIG;
   if (layout == L_STRIDED) bsz[nd - 1] = 2 * sz[nd - 1] + 1;
   if (layout == L_NARROW) bsz[nd - 1] = sz[nd - 1] + 3;
   if (layout == L_TRANS) bsz[nd - 2] = sz[nd - 1], bsz[nd - 1] = sz[nd - 2];
   const int fmt = layout != L_CL ? LM_CONTIGUOUS
                   : nd == 4      ? LM_CHANNELS_LAST
                   : nd == 5      ? LM_CHANNELS_LAST_3D
                                  : LM_CONTIGUOUS;
   lm_tensor *base = NULL, *t = NULL;
   OK(lm_empty(nd, bsz, dt, fmt, LM_CPU, &base));
   keep(base);
   const int64_t n = base->numel;
   double *v = malloc(sizeof(double) * (size_t)(n + 1));
   for (int64_t i = 0; i < n; i++) {
      const double u = rnd01();
      v[i] = is_float(dt) ? lo + (hi - lo) * u : dt == LM_BOOL ? (u < 0.5) : floor(lo + (hi - lo) * u);
   }
   OK(lm_from_doubles(base, v));
   free(v);
   if (layout == L_STRIDED) {
      int64_t st[LM_MAX_DIMS];
      memcpy(st, base->strides, sizeof(int64_t) * (size_t)nd);
      st[nd - 1] = 2;
      OK(lm_as_strided(base, nd, sz, st, 1, &t));
   } else if (layout == L_NARROW) {
      OK(lm_narrow(base, nd - 1, 1, sz[nd - 1], &t));
   } else if (layout == L_TRANS) {
      OK(lm_transpose(base, nd - 2, nd - 1, &t));
   } else {
      return base;
   }
   return keep(t);
}

/* the same tensor (sizes, strides, storage offset, values) on dev; meta: no values. A view at an
   offset is taken, on dev, of a 1-D tensor that spans it */
static lm_tensor *to_dev(const lm_tensor *c, int dev) {
   if (!c) return NULL;
   lm_tensor *t = NULL;
   if (c->offset > 0 && c->numel > 0) {
      int64_t span = c->offset + 1;
      for (int i = 0; i < c->ndim; i++) span += (c->sizes[i] - 1) * c->strides[i];
      lm_tensor *base = NULL;
      OK(lm_empty(1, &span, c->dtype, LM_CONTIGUOUS, dev, &base));
      keep(base);
      OK(lm_as_strided(base, c->ndim, c->sizes, c->strides, c->offset, &t));
   } else {
      OK(lm_empty_strided(c->ndim, c->sizes, c->strides, c->dtype, dev, &t));
   }
   keep(t);
   if (dev != LM_META) OK(lm_copy_(t, c));
   check(t->device == dev, "to_dev: device %d, wanted %d", t->device, dev);
   return t;
}

/* t's values (any device but meta) as doubles in logical order, through a CPU copy */
static double *host_values(const lm_tensor *t) {
   lm_tensor *h = NULL;
   OK(lm_empty_strided(t->ndim, t->sizes, t->strides, t->dtype, LM_CPU, &h));
   OK(lm_copy_(h, t));
   double *v = malloc(sizeof(double) * (size_t)(t->numel + 1));
   OK(lm_to_doubles(h, v));
   lm_tensor_free(h);
   return v;
}

/* ---- comparisons --------------------------------------------------------------------------- */
/* CUDA tolerances (the cuda specs'), relative to max(1, max |reference|) */
typedef struct {
   double f64, f32, f16, bf16;
} tol_t;
static const tol_t TOL_EW = {1e-12, 1e-5, 1e-2, 2e-2};   /* spec/cuda_elementwise_spec.lua */
static const tol_t TOL_DNN = {1e-9, 1e-4, 1e-2, 4e-2};   /* matmul, softmax, nll: cuda_dnn_spec's exact */
static const tol_t TOL_BN = {4e-9, 4e-4, 4e-2, 1.6e-1};  /* batch norm gradients: 4 x that */
static const tol_t TOL_CONV = {2e-9, 1e-2, 2e-2, 8e-2};  /* cuDNN (TF32 float32), x 2 for gradients */
static tol_t g_tol;
/* the dtype a case computes in, when its results may have a wider one (batch norm's float64
   statistics of a float32 input): its tolerance at least; -1: none */
static int g_compute_dt = -1;

static double tol_of(int dt) {
   return dt == LM_FLOAT64 ? g_tol.f64 : dt == LM_FLOAT32 ? g_tol.f32 : dt == LM_FLOAT16 ? g_tol.f16
          : dt == LM_BFLOAT16 ? g_tol.bf16 : 0;
}

/* d (on dev) against the CPU's c: device, dtype, sizes and strides; values bit for bit off meta
   and cuda, within tol_of(dtype) on cuda */
static void same(const char *what, const lm_tensor *c, const lm_tensor *d, int dslot) {
   const char *dn = DEV_NAME[dslot];
   if (!c || !d) {
      check(!c && !d, "%s on %s: one result is missing (cpu %p, %s %p)", what, dn, (void *)c, dn,
            (void *)d);
      return;
   }
   check(d->device == DEV_ID[dslot], "%s on %s: the result is on device %d", what, dn, d->device);
   check(d->dtype == c->dtype, "%s on %s: dtype %s, cpu %s", what, dn, lm_dtype_name(d->dtype),
         lm_dtype_name(c->dtype));
   int shape = d->ndim == c->ndim;
   for (int i = 0; shape && i < c->ndim; i++)
      shape = d->sizes[i] == c->sizes[i] && d->strides[i] == c->strides[i];
   check(shape, "%s on %s: sizes or strides differ from the cpu's", what, dn);
   if (!shape || dslot == D_META || d->dtype != c->dtype) return;
   double *a = host_values(c), *b = host_values(d);
   const int64_t n = c->numel;
   if (dslot != D_CUDA || !is_float(c->dtype)) {
      check(memcmp(a, b, sizeof(double) * (size_t)n) == 0, "%s on %s: values differ from the cpu's",
            what, dn);
   } else {
      double scale = 1, worst = 0;
      int64_t bad = -1;
      for (int64_t i = 0; i < n; i++)
         if (isfinite(a[i]) && fabs(a[i]) > scale) scale = fabs(a[i]);
      for (int64_t i = 0; i < n && bad < 0; i++) {
         if (isnan(a[i]) || isnan(b[i]) || isinf(a[i]) || isinf(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i])) && a[i] != b[i]) bad = i;
            continue;
         }
         const double e = fabs(a[i] - b[i]);
         if (e > worst) worst = e;
      }
      double tol = tol_of(c->dtype);
      if (g_compute_dt >= 0 && tol_of(g_compute_dt) > tol) tol = tol_of(g_compute_dt);
      tol *= scale;
      check(bad < 0 && worst <= tol,
            "%s on %s: max |cuda - cpu| = %.3g > %.3g (scale %.3g)%s", what, dn, worst, tol, scale,
            bad >= 0 ? ", or a NaN / inf differs" : "");
   }
   free(a);
   free(b);
}

/* two CPU results of one case that must agree: sizes and values (strides may differ) */
static void same_values(const lm_tensor *a, const lm_tensor *b, const char *what) {
   int shape = a && b && a->ndim == b->ndim && a->dtype == b->dtype;
   for (int d = 0; shape && d < a->ndim; d++) shape = a->sizes[d] == b->sizes[d];
   check(shape, "%s: shapes differ", what);
   if (!shape) return;
   double *x = host_values(a), *y = host_values(b);
   check(memcmp(x, y, sizeof(double) * (size_t)a->numel) == 0, "%s: values differ", what);
   free(x);
   free(y);
}

/* a and b within tol of each other, relative to max(1, |b|) */
static void close_values(const lm_tensor *a, const lm_tensor *b, double tol, const char *what) {
   int shape = a && b && a->ndim == b->ndim && a->dtype == b->dtype;
   for (int d = 0; shape && d < a->ndim; d++) shape = a->sizes[d] == b->sizes[d];
   check(shape, "%s: shapes differ", what);
   if (!shape) return;
   double *x = host_values(a), *y = host_values(b);
   double worst = 0;
   for (int64_t i = 0; i < a->numel; i++) {
      const double d = fabs(x[i] - y[i]) / (fabs(y[i]) > 1 ? fabs(y[i]) : 1);
      if (!(d <= worst)) worst = d;
   }
   check(worst <= tol, "%s: values differ by %g (relative) > %g", what, worst, tol);
   free(x);
   free(y);
}

static void expect_device_error(lm_status st, const char *what) {
   check(st == LM_ERR_DEVICE, "%s: status %d, wanted LM_ERR_DEVICE", what, (int)st);
   check(strstr(lm_last_error(), "same device") != NULL, "%s: message '%s'", what,
         lm_last_error());
}

static void expect_status(lm_status st, lm_status want, const char *msg_part, const char *what) {
   check(st == want, "%s: status %d, wanted %d (%s)", what, (int)st, (int)want, lm_last_error());
   if (msg_part)
      check(strstr(lm_last_error(), msg_part) != NULL, "%s: message '%s' lacks '%s'", what,
            lm_last_error(), msg_part);
}

/* ---- which kernels ran: lm_dispatch's LUMEN_VERBOSE lines ---------------------------------- */
/* the entry running (OPS[] index), its CUDA state, and the runs that succeeded on each device */
static int g_entry;
enum { MAX_ENTRIES = 64 };
/* the kinds each entry's cases dispatched on each device (meta: never printed) */
static unsigned char g_seen[MAX_ENTRIES][NDEV][LM_OP_COUNT];
static char g_cap_path[256];
static FILE *g_cap;
static int g_cap_saved = -1, g_cap_prev;

/* a crash while stderr goes to the file: put it back and show what the case printed */
static void cap_crash(int sig) {
   if (g_cap_saved >= 0) {
      dup2(g_cap_saved, 2);
      char buf[4096];
      ssize_t n;
      off_t off = 0;
      while ((n = pread(fileno(g_cap), buf, sizeof buf, off)) > 0) {
         if (write(2, buf, (size_t)n) < 0) break;
         off += n;
      }
   }
   signal(sig, SIG_DFL);
   raise(sig);
}

static void cap_open(void) {
   const char *tmp = getenv("TMPDIR");
   snprintf(g_cap_path, sizeof g_cap_path, "%s/test_backend_ops.%d.stderr", tmp && *tmp ? tmp : "/tmp",
            (int)getpid());
   g_cap = fopen(g_cap_path, "w+");
   if (!g_cap) {
      printf("cannot open %s\n", g_cap_path);
      exit(2);
   }
   printf("test_backend_ops: each case's stderr goes to %s while it runs\n", g_cap_path);
   signal(SIGABRT, cap_crash);
#ifndef __SANITIZE_ADDRESS__
   signal(SIGSEGV, cap_crash);
   signal(SIGBUS, cap_crash);
   signal(SIGFPE, cap_crash);
   signal(SIGILL, cap_crash);
#endif
}

static void cap_begin(void) {
   fflush(stderr);
   rewind(g_cap);
   if (ftruncate(fileno(g_cap), 0) != 0) {
      printf("cannot truncate %s\n", g_cap_path);
      exit(2);
   }
   g_cap_saved = dup(2);
   dup2(fileno(g_cap), 2);
   g_cap_prev = lm_set_verbose(1);
}

static void cap_end(int dslot) {
   lm_set_verbose(g_cap_prev);
   fflush(stderr);
   dup2(g_cap_saved, 2);
   close(g_cap_saved);
   g_cap_saved = -1;
   rewind(g_cap);
   char line[2048];
   while (fgets(line, sizeof line, g_cap)) {
      if (strncmp(line, "lumen_verbose,", 14) != 0) {
         printf("[%s, stderr] %s", g_case, line);
         continue;
      }
      if (strncmp(line, "lumen_verbose,exec,", 19) != 0) continue;
      char *dev = line + 19, *op = strchr(dev, ',');
      if (!op) continue;
      *op++ = 0;
      char *end = strchr(op, ',');
      if (!end) continue;
      *end = 0;
      const int k = kind_of(op);
      if (k >= 0 && strcmp(dev, DEV_NAME[dslot]) == 0) g_seen[g_entry][dslot][k] = 1;
   }
}

/* ---- run_case ---------------------------------------------------------------------------- */
enum { MAXT = 16 };
/* the CPU's results of the last case (kept until free_kept) */
static lm_tensor *g_ref[MAXT];
static int g_cuda_partial; /* one of the entry's kinds has no CUDA kernel */
static int g_no_cuda;      /* this case is not run on cuda:0 (the builder says why) */
static int g_ran[NDEV][MAX_ENTRIES];
static int g_ncases;

/* a case: reads in[0 .. nin), writes out[0 .. nout) (new tensors, or inputs written in place) */
typedef lm_status (*case_fn)(lm_tensor **in, lm_tensor **out, const void *arg);

/* the j-th name of a comma-separated list */
static const char *nth_name(const char *names, int j, char *buf, size_t cap) {
   const char *p = names;
   for (int i = 0; i < j && p; i++) {
      p = strchr(p, ',');
      if (p) p++;
   }
   if (!p) {
      snprintf(buf, cap, "output %d", j);
      return buf;
   }
   const char *e = strchr(p, ',');
   const size_t n = e ? (size_t)(e - p) : strlen(p);
   snprintf(buf, cap, "%.*s", (int)(n < cap - 1 ? n : cap - 1), p);
   return buf;
}

/* run f on the CPU (on copies of cin), then on every other device; compare each output. Returns
   0 when the CPU run fails (a failed check), else 1 with the CPU's results in g_ref. */
static int run_case(const char *outs, int nin, lm_tensor *const *cin, int nout, case_fn f,
                    const void *arg) {
   lm_tensor *in[MAXT] = {0}, *out[MAXT] = {0};
   memset(g_ref, 0, sizeof g_ref);
   for (int i = 0; i < nin; i++) in[i] = to_dev(cin[i], LM_CPU);
   cap_begin();
   lm_status st = f(in, out, arg);
   cap_end(D_CPU);
   check(st == LM_OK, "on cpu: status %d (%s)", (int)st, st == LM_OK ? "" : lm_last_error());
   for (int j = 0; j < nout; j++) g_ref[j] = keep(out[j]);
   if (st != LM_OK) return 0;
   g_ncases++;
   g_ran[D_CPU][g_entry]++;
   for (int d = D_SIM; d < NDEV; d++) {
      if (d == D_CUDA && (!g_has_cuda || g_no_cuda)) continue;
      lm_tensor *din[MAXT] = {0}, *dout[MAXT] = {0};
      for (int i = 0; i < nin; i++) din[i] = to_dev(cin[i], DEV_ID[d]);
      if (d != D_META) cap_begin();
      st = f(din, dout, arg);
      if (d != D_META) cap_end(d);
      for (int j = 0; j < nout; j++) keep(dout[j]);
      if (d == D_CUDA && g_cuda_partial && st == LM_ERR_DEVICE &&
          strstr(lm_last_error(), "is not supported on cuda:0")) {
         check(1, "");
         continue;
      }
      check(st == LM_OK, "on %s: status %d (%s)", DEV_NAME[d], (int)st,
            st == LM_OK ? "" : lm_last_error());
      if (st != LM_OK) continue;
      g_ran[d][g_entry]++;
      char nb[64];
      for (int j = 0; j < nout; j++) same(nth_name(outs, j, nb, sizeof nb), g_ref[j], dout[j], d);
   }
   return 1;
}

/* the CPU instruction-set level in use, the machine's best, and the roles of the passes */
static int g_isa, g_best;
enum { I_BEST = 1, I_AVX512 = 2, I_AVX2 = 4, I_C = 8, I_ALL = 15 };
static int g_role; /* the I_* role of the pass running */

#define CASE(...) snprintf(g_case, sizeof g_case, __VA_ARGS__)

/* ======================================================================================== */
/* elementwise, reductions, cat, random fills, optimizer steps                              */
/* ======================================================================================== */

static const int64_t S4[4] = {2, 3, 4, 5}, BIG[4] = {2, 8, 16, 16}, BC[3] = {3, 1, 1};
static const char *isa_name(void) { return lm_cpu_isa_name(g_isa); }

static int g_uop, g_bop, g_rev, g_rop, g_keepdim, g_dims[4], g_nd, g_flag, g_cat_dim;
static double g_s;

static lm_status f_unary(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_unary(g_uop, in[0], &out[0]);
}
static lm_status f_clamp(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   TRY(lm_clamp(in[0], -0.3, 0.4, 1, 1, &out[0]));
   return lm_clamp(in[0], -0.3, 0, 1, 0, &out[1]); /* clamp_min */
}
static lm_status f_binary(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_binary(g_bop, in[0], in[1], 1.0, &out[0]);
}
static lm_status f_binary_alpha(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_binary(LM_SUB, in[0], in[1], 0.5, &out[0]);
}
/* into an out= tensor: in[2] itself */
static lm_status f_binary_out(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   out[0] = in[2];
   TRY(lm_binary(LM_MUL, in[0], in[1], 1.0, &out[0]));
   check(out[0] == in[2], "mul out=: the result is the out tensor");
   return LM_OK;
}
static lm_status f_scalar(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_binary_scalar(g_bop, in[0], g_s, 0, g_rev, 1.0, &out[0]);
}
static lm_status f_binary_unary(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_binary_unary(LM_ADD, in[0], in[1], 1.0, LM_RELU, &out[0]);
}
static lm_status f_scalar_unary(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_binary_scalar_unary(LM_MUL, in[0], 3.0, 1, 0, 1.0, LM_TANH, &out[0]);
}
static lm_status f_where(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   TRY(lm_binary_scalar(LM_GT, in[0], 0.0, 0, 0, 1.0, &out[1]));
   return lm_where(out[1], in[0], in[1], &out[0]);
}
static lm_status f_addcmul(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_addcmul(in[0], in[1], in[2], 0.7, &out[0]);
}
static lm_status f_addcdiv(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_addcdiv(in[0], in[1], in[2], -1.5, &out[0]);
}
/* copy_ into in[1] (its layout and dtype) */
static lm_status f_copy(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   out[0] = in[1];
   return lm_copy_(in[1], in[0]);
}
static lm_status f_fill(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   out[0] = in[0];
   return lm_fill_(in[0], -2.25);
}
static lm_status f_reduce(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_reduce(g_rop, in[0], g_dims, g_nd, g_keepdim, -1, &out[0], NULL);
}
static lm_status f_reduce_idx(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_reduce(g_rop, in[0], g_dims, g_nd, g_keepdim, -1, &out[0], &out[1]);
}
static lm_status f_cat(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   return lm_cat(3, (const lm_tensor *const *)in, g_cat_dim, &out[0]);
}
/* every random fill from one seed: sim:0 and cuda:0 give the CPU's values */
static lm_status f_random(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   lm_manual_seed(1234);
   for (int i = 0; i < 4; i++) out[i] = in[i];
   TRY(lm_uniform_(in[0], -1, 2));
   TRY(lm_normal_(in[1], 0.5, 2));
   TRY(lm_randint_(in[2], -3, 9));
   TRY(lm_bernoulli_(in[3], 0.3));
   /* randperm into an out= tensor on in[0]'s device */
   int64_t n = 37;
   TRY(lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, in[0]->device, &out[4]));
   return lm_randperm(n, &out[4]);
}
static lm_status f_sgd(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   out[0] = in[0];
   out[1] = in[2];
   return lm_sgd_step(in[0], in[1], in[2], 0.1, 0.9, 0.1, 0.01, g_flag, 0, 0);
}
/* the learning rate from a one-element float64 tensor on the device (capturable SGD) */
static lm_status f_sgd_lr(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   out[0] = in[0];
   out[1] = in[2];
   return lm_sgd_step_lr(in[0], in[1], in[2], in[3], 0.9, 0.1, 0.01, g_flag, 0, 0);
}
/* lr and the step count from one-element float64 tensors on the device (capturable Adam) */
static lm_status f_adam_dev(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   for (int i = 0; i < 5; i++) out[i] = in[i];
   return lm_adam_step_dev(in[0], in[1], in[2], in[3], g_flag ? in[4] : NULL, in[5], in[6], 0.9,
                           0.999, 1e-8, 0.01, g_flag, 0);
}
static lm_status f_adam(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   for (int i = 0; i < 5; i++) out[i] = in[i];
   return lm_adam_step(in[0], in[1], in[2], in[3], g_flag ? in[4] : NULL, 1e-2, 0.9, 0.999, 1e-8,
                       0.01, g_flag, 0, 3);
}

static const int EW_DTS[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};

static void cases_unary(void) {
   g_tol = TOL_EW;
   /* trunc, atan, erf: the libm ops (inputs in [-2, 2], inside every one's domain) */
   const int uops[7] = {LM_EXP, LM_NEG, LM_RELU, LM_SIGMOID, LM_TRUNC, LM_ATAN, LM_ERF};
   const int lays[3] = {L_CONTIG, L_CL, L_TRANS};
   for (int di = 0; di < 4; di++)
      for (int u = 0; u < 7; u++)
         for (int f = 0; f < 3; f++) {
            const int dt = EW_DTS[di];
            CASE("unary %d %s %s isa %s", uops[u], lm_dtype_name(dt), LAYOUT_NAME[lays[f]], isa_name());
            lm_tensor *in[1] = {cpu_rand(4, S4, dt, lays[f], -2, 2)};
            g_uop = uops[u];
            run_case("out", 1, in, 1, f_unary, NULL);
            free_kept();
         }
   for (int di = 0; di < 2; di++) {
      const int dt = EW_DTS[di];
      CASE("clamp, clamp_min %s isa %s", lm_dtype_name(dt), isa_name());
      lm_tensor *in[1] = {cpu_rand(4, S4, dt, L_CL, -1, 1)};
      run_case("clamp,clamp_min", 1, in, 2, f_clamp, NULL);
      free_kept();
   }
}

static void cases_binary(void) {
   g_tol = TOL_EW;
   const int bops[5] = {LM_ADD, LM_MUL, LM_DIV, LM_MAXIMUM, LM_LT};
   for (int di = 0; di < 4; di++) {
      const int dt = EW_DTS[di];
      const char *dn = lm_dtype_name(dt);
      /* channels-last with contiguous (small and large), with [3,1,1], with another dtype */
      for (int o = 0; o < 5; o++)
         for (int c = 0; c < 4; c++) {
            if (di >= 2 && c == 2) continue;
            const int64_t *sa = c >= 2 ? BIG : S4;
            CASE("binary %d %s case %d isa %s", bops[o], dn, c, isa_name());
            lm_tensor *in[2] = {cpu_rand(4, sa, dt, L_CL, -2, 2),
                                c == 1 ? cpu_rand(3, BC, dt, L_CONTIG, -2, 2)
                                       : cpu_rand(4, sa, c == 3 ? LM_FLOAT64 : dt, L_CONTIG, -2, 2)};
            g_bop = bops[o];
            run_case("out", 2, in, 1, f_binary, NULL);
            free_kept();
         }
      if (di >= 2) continue;
      CASE("sub alpha %s (small path) isa %s", dn, isa_name());
      {
         lm_tensor *in[2] = {cpu_rand(4, S4, dt, L_CL, -1, 1), cpu_rand(4, S4, dt, L_CL, -1, 1)};
         run_case("out", 2, in, 1, f_binary_alpha, NULL);
         free_kept();
      }
      CASE("mul out= %s isa %s", dn, isa_name());
      {
         lm_tensor *in[3] = {cpu_rand(4, S4, dt, L_CL, -1, 1), cpu_rand(3, BC, dt, L_CONTIG, -1, 1),
                             cpu_rand(4, S4, LM_FLOAT64, L_CL, -1, 1)};
         run_case("out", 3, in, 1, f_binary_out, NULL);
         free_kept();
      }
   }
}

static void cases_binary_scalar(void) {
   g_tol = TOL_EW;
   const int sops[4] = {LM_ADD, LM_SUB, LM_POW, LM_POW};
   const double svals[4] = {1.5, 2.0, 2.0, 1.7};
   for (int di = 0; di < 2; di++)
      for (int o = 0; o < 4; o++)
         for (int rev = 0; rev < 2; rev++)
            for (int f = 0; f < 2; f++) {
               const int dt = EW_DTS[di];
               CASE("scalar %d %g rev %d %s big %d isa %s", sops[o], svals[o], rev,
                    lm_dtype_name(dt), f, isa_name());
               lm_tensor *in[1] = {cpu_rand(4, f ? BIG : S4, dt, L_CL, -1, 1)};
               g_bop = sops[o];
               g_s = svals[o];
               g_rev = rev;
               run_case("out", 1, in, 1, f_scalar, NULL);
               free_kept();
            }
}

static void cases_fused_ternary(void) {
   g_tol = TOL_EW;
   for (int di = 0; di < 2; di++) {
      const int dt = EW_DTS[di];
      const char *dn = lm_dtype_name(dt);
      lm_tensor *in2[2] = {cpu_rand(4, S4, dt, L_CL, -1, 1), cpu_rand(3, BC, dt, L_CONTIG, -1, 1)};
      CASE("add+relu %s isa %s", dn, isa_name());
      run_case("out", 2, in2, 1, f_binary_unary, NULL);
      CASE("mul 3 + tanh %s isa %s", dn, isa_name());
      run_case("out", 1, in2, 1, f_scalar_unary, NULL);
      CASE("where %s isa %s", dn, isa_name());
      run_case("out,condition", 2, in2, 2, f_where, NULL);
      free_kept();
      lm_tensor *in3[3] = {cpu_rand(4, S4, dt, L_CL, -1, 1), cpu_rand(3, BC, dt, L_CONTIG, -1, 1),
                           cpu_rand(4, S4, dt, L_TRANS, -1, 1)};
      CASE("addcmul %s isa %s", dn, isa_name());
      run_case("out", 3, in3, 1, f_addcmul, NULL);
      CASE("addcdiv %s isa %s", dn, isa_name());
      run_case("out", 3, in3, 1, f_addcdiv, NULL);
      free_kept();
   }
}

static void cases_copy_fill(void) {
   g_tol = TOL_EW;
   for (int di = 0; di < 4; di++) {
      const int dt = EW_DTS[di];
      const char *dn = lm_dtype_name(dt);
      /* between formats and dtypes (float16 targets, the big case vectorised) */
      for (int f = 0; f < 4; f++) {
         const int64_t *sz = f >= 2 ? BIG : S4;
         lm_tensor *in[2] = {cpu_rand(4, sz, dt, L_CL, -1, 1),
                             cpu_rand(4, sz, f & 1 ? LM_FLOAT16 : dt, L_CONTIG, -1, 1)};
         CASE("copy_ %s case %d isa %s", dn, f, isa_name());
         run_case("dst", 2, in, 1, f_copy, NULL);
         CASE("fill_ %s case %d isa %s", dn, f, isa_name());
         run_case("dst", 1, in, 1, f_fill, NULL);
         free_kept();
      }
      /* broadcast into int64; a strided source into a transposed destination */
      CASE("copy_ broadcast into int64 %s isa %s", dn, isa_name());
      lm_tensor *in[2] = {cpu_rand(3, BC, dt, L_CONTIG, -3, 3), cpu_rand(4, S4, LM_INT64, L_CL, -5, 6)};
      run_case("dst", 2, in, 1, f_copy, NULL);
      CASE("copy_ strided into transposed %s isa %s", dn, isa_name());
      lm_tensor *in2[2] = {cpu_rand(4, S4, dt, L_STRIDED, -1, 1), cpu_rand(4, S4, LM_FLOAT32, L_TRANS, -1, 1)};
      run_case("dst", 2, in2, 1, f_copy, NULL);
      free_kept();
   }
   /* integers and bools */
   CASE("copy_ int64 -> bool, bool -> float32 isa %s", isa_name());
   lm_tensor *in[2] = {cpu_rand(4, S4, LM_INT64, L_CL, -2, 3), cpu_rand(4, S4, LM_BOOL, L_CONTIG, 0, 1)};
   run_case("dst", 2, in, 1, f_copy, NULL);
   lm_tensor *in2[2] = {in[1], cpu_rand(4, S4, LM_FLOAT32, L_TRANS, -1, 1)};
   run_case("dst", 2, in2, 1, f_copy, NULL);
   free_kept();
}

static void cases_reduce(void) {
   g_tol = TOL_EW;
   const int rops[4] = {LM_SUM, LM_MEAN, LM_MAX, LM_ARGMIN};
   for (int di = 0; di < 2; di++) {
      const int dt = EW_DTS[di];
      for (int r = 0; r < 4; r++)
         for (int c = 0; c < 4; c++) {
            CASE("reduce %d %s case %d isa %s", rops[r], lm_dtype_name(dt), c, isa_name());
            lm_tensor *in[1] = {cpu_rand(4, S4, dt, c & 1 ? L_CL : L_CONTIG, -1, 1)};
            g_rop = rops[r];
            g_keepdim = c >= 2;
            if (rops[r] == LM_ARGMIN) {
               g_nd = 1;
               g_dims[0] = 1;
            } else if (c & 2) {
               g_nd = 2;
               g_dims[0] = 2;
               g_dims[1] = 3;
            } else {
               g_nd = c == 0 ? 0 : 1;
               g_dims[0] = -3;
            }
            run_case("out", 1, in, 1, f_reduce, NULL);
            free_kept();
         }
      CASE("max with indices %s isa %s", lm_dtype_name(dt), isa_name());
      lm_tensor *in[1] = {cpu_rand(4, S4, dt, L_CL, -1, 1)};
      g_rop = LM_MAX;
      g_nd = 1;
      g_dims[0] = 1;
      g_keepdim = 1;
      run_case("values,indices", 1, in, 2, f_reduce_idx, NULL);
      free_kept();
   }
}

static void cases_cat(void) {
   g_tol = TOL_EW;
   /* channels-last inputs (the result stays channels-last), a contiguous one, another dtype */
   for (int di = 0; di < 2; di++)
      for (int c = 0; c < 3; c++) {
         const int dt = EW_DTS[di];
         const int64_t a[4] = {2, 3, 4, 5}, b[4] = {2, 2, 4, 5}, d[4] = {2, 1, 4, 5};
         CASE("cat %s case %d isa %s", lm_dtype_name(dt), c, isa_name());
         lm_tensor *in[3] = {cpu_rand(4, a, dt, L_CL, -1, 1), cpu_rand(4, b, dt, L_CL, -1, 1),
                             cpu_rand(4, d, c == 2 ? LM_FLOAT64 : dt, c == 1 ? L_CONTIG : L_CL, -1, 1)};
         g_cat_dim = 1;
         run_case("out", 3, in, 1, f_cat, NULL);
         free_kept();
      }
}

static void cases_random(void) {
   g_tol = TOL_EW;
   for (int di = 0; di < 2; di++) {
      const int dt = EW_DTS[di];
      CASE("random fills %s isa %s", lm_dtype_name(dt), isa_name());
      lm_tensor *in[4] = {cpu_rand(4, BIG, dt, L_CL, -1, 1), cpu_rand(4, S4, dt, L_CONTIG, -1, 1),
                          cpu_rand(4, S4, LM_INT64, L_CL, -5, 6), cpu_rand(4, S4, dt, L_TRANS, -1, 1)};
      run_case("uniform_,normal_,randint_,bernoulli_,randperm", 4, in, 5, f_random, NULL);
      free_kept();
   }
}

static void cases_optim(void) {
   g_tol = TOL_EW;
   for (int di = 0; di < 2; di++)
      for (int fl = 0; fl < 2; fl++) {
         const int dt = EW_DTS[di];
         lm_tensor *in[5];
         for (int i = 0; i < 5; i++) in[i] = cpu_rand(4, S4, dt, L_CL, i >= 3 ? 0 : -1, 1);
         g_flag = fl;
         CASE("sgd nesterov %d %s isa %s", fl, lm_dtype_name(dt), isa_name());
         run_case("param,momentum_buffer", 3, in, 2, f_sgd, NULL);
         const int64_t one[1] = {1};
         lm_tensor *sg[4] = {in[0], in[1], in[2], cpu_rand(0, one, LM_FLOAT64, L_CONTIG, 0.01, 0.5)};
         CASE("sgd lr tensor nesterov %d %s isa %s", fl, lm_dtype_name(dt), isa_name());
         run_case("param,momentum_buffer", 4, sg, 2, f_sgd_lr, NULL);
         lm_tensor *ad[7] = {in[0], in[1], in[2], in[3], in[4], sg[3],
                             cpu_rand(0, one, LM_FLOAT64, L_CONTIG, 1, 1)}; /* step 1 */
         {
            double *sp = (double *)((char *)ad[6]->storage->data + ad[6]->offset * 8);
            *sp = 3.0; /* a later step's bias corrections */
         }
         CASE("adam lr/step tensors decoupled/amsgrad %d %s isa %s", fl, lm_dtype_name(dt),
              isa_name());
         run_case("param,grad,exp_avg,exp_avg_sq,max_exp_avg_sq", 7, ad, 5, f_adam_dev, NULL);
         CASE("adam decoupled/amsgrad %d %s isa %s", fl, lm_dtype_name(dt), isa_name());
         run_case("param,grad,exp_avg,exp_avg_sq,max_exp_avg_sq", 5, in, 5, f_adam, NULL);
         free_kept();
      }
}

/* mixing devices, copies between devices and into / out of meta, element access */
static void rules_elementwise(void) {
   CASE("elementwise device rules");
   const int64_t sz[2] = {3, 4};
   lm_tensor *c = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -1, 1), *s = to_dev(c, LM_SIM0);
   lm_tensor *m = NULL, *o = NULL;
   OK(lm_empty(2, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_META, &m));
   keep(m);
   lm_status st = lm_binary(LM_ADD, c, s, 1.0, &o);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"),
         "cpu + sim:0: LM_ERR_DEVICE 'same device', got %d '%s'", st, lm_last_error());
   check(o == NULL, "cpu + sim:0: no output");
   st = lm_where(s, c, c, &o);
   check(st == LM_ERR_DEVICE || st == LM_ERR_DTYPE, "where with mixed devices refused");
   lm_tensor *three[3] = {c, s, c};
   st = lm_cat(3, (const lm_tensor *const *)three, 0, &o);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "cat mixed devices: %s",
         lm_last_error());
   int dim0 = 0;
   lm_tensor *so = NULL;
   OK(lm_empty(1, &sz[1], LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &so));
   keep(so);
   st = lm_reduce(LM_SUM, c, &dim0, 1, 0, -1, &so, NULL);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "sum out= on sim: %s",
         lm_last_error());
   st = lm_sgd_step(s, c, NULL, 0.1, 0, 0, 0, 0, 0, 0);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "same device"), "sgd mixed: %s",
         lm_last_error());
   /* copy_ across devices: cpu -> sim:1 (transposed layout, other dtype) -> sim:0 -> cpu */
   lm_tensor *ct = NULL, *s1d = NULL, *s1 = NULL, *s1t = NULL, *back = NULL;
   OK(lm_transpose(c, 0, 1, &ct));
   keep(ct);
   const int64_t szt[2] = {4, 3};
   OK(lm_empty(2, szt, LM_FLOAT64, LM_CONTIGUOUS, LM_SIM0 + 1, &s1d));
   keep(s1d);
   OK(lm_copy_(s1d, ct));
   OK(lm_empty(2, szt, LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &s1));
   keep(s1);
   OK(lm_copy_(s1, s1d)); /* sim:1 -> sim:0, float64 -> float32 */
   OK(lm_transpose(s1d, 0, 1, &s1t)); /* sim:1 view [3, 4] */
   keep(s1t);
   OK(lm_empty(2, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_CPU, &back));
   keep(back);
   OK(lm_copy_(back, s1t));
   double *a = host_values(c), *b = host_values(back);
   check(memcmp(a, b, sizeof(double) * 12) == 0, "cpu -> sim:1 (float64, transposed) -> cpu");
   free(a);
   free(b);
   /* meta: copying in is a no-op success (after the shape check); copying out is an error */
   check(lm_copy_(m, c) == LM_OK, "copy_ cpu -> meta is a no-op");
   check(lm_copy_(m, s) == LM_OK, "copy_ sim -> meta is a no-op");
   const int64_t bad[2] = {5, 4};
   lm_tensor *mb = NULL;
   OK(lm_empty(2, bad, LM_FLOAT32, LM_CONTIGUOUS, LM_META, &mb));
   keep(mb);
   st = lm_copy_(mb, c);
   check(st == LM_ERR_SHAPE, "copy_ into meta checks shapes (got %d)", st);
   st = lm_copy_(c, m);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "cannot copy out of a meta tensor"),
         "copy_ meta -> cpu: %s", lm_last_error());
   st = lm_copy_(s, m);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "cannot copy out of a meta tensor"),
         "copy_ meta -> sim: %s", lm_last_error());
   /* element access */
   int64_t idx[2] = {1, 2};
   double v = 0, w = 0;
   st = lm_get(m, idx, &v);
   check(st == LM_ERR_DEVICE && strstr(lm_last_error(), "meta tensors have no data"), "get meta");
   check(lm_set(m, idx, 1.0) == LM_ERR_DEVICE, "set meta");
   double buf[12] = {0};
   check(lm_to_doubles(m, buf) == LM_ERR_DEVICE, "to_doubles meta");
   check(lm_from_doubles(m, buf) == LM_ERR_DEVICE, "from_doubles meta");
   OK(lm_get(c, idx, &v));
   OK(lm_get(s, idx, &w));
   check(v == w, "get on sim");
   OK(lm_set(s, idx, 7.5));
   OK(lm_get(s, idx, &w));
   check(w == 7.5, "set on sim");
   /* randperm on meta: allocates, computes nothing */
   int64_t n = 5;
   lm_tensor *mp = NULL;
   OK(lm_empty(1, &n, LM_INT64, LM_CONTIGUOUS, LM_META, &mp));
   keep(mp);
   check(lm_randperm(n, &mp) == LM_OK, "randperm into meta");
   /* meta consumes no random numbers */
   uint64_t s0, o0, s1_, o1;
   lm_rng_get_state(&s0, &o0);
   OK(lm_uniform_(m, 0, 1));
   lm_rng_get_state(&s1_, &o1);
   check(o0 == o1, "uniform_ on meta leaves the generator alone");
   free_kept();
}

/* ======================================================================================== */
/* matmul and convolution                                                                   */
/* ======================================================================================== */

typedef struct {
   const char *name;
   int na, nb;
   int64_t as[4], bs[4];
   int va, vb;
} mcase;

static const mcase MCASES[] = {
   {"dot", 1, 1, {7}, {7}, L_CONTIG, L_CONTIG},
   {"dot narrow", 1, 1, {9}, {9}, L_NARROW, L_CONTIG},
   {"2d", 2, 2, {5, 7}, {7, 6}, L_CONTIG, L_CONTIG},
   {"2d transposed", 2, 2, {5, 7}, {7, 6}, L_TRANS, L_TRANS},
   {"2d narrow", 2, 2, {33, 17}, {17, 40}, L_NARROW, L_NARROW},
   {"1d . 2d", 1, 2, {7}, {7, 6}, L_CONTIG, L_TRANS},
   {"2d . 1d", 2, 1, {5, 7}, {7}, L_TRANS, L_CONTIG},
   {"1d . 3d", 1, 3, {4}, {3, 4, 5}, L_CONTIG, L_CONTIG},
   {"3d . 1d", 3, 1, {3, 5, 4}, {4}, L_NARROW, L_CONTIG},
   {"batched", 3, 3, {4, 5, 6}, {4, 6, 3}, L_CONTIG, L_CONTIG},
   {"batched transposed", 3, 3, {4, 5, 6}, {4, 6, 3}, L_TRANS, L_NARROW},
   {"linear layer", 3, 2, {4, 5, 6}, {6, 3}, L_CONTIG, L_TRANS},
   {"broadcast", 4, 3, {2, 1, 3, 4}, {5, 4, 2}, L_CONTIG, L_CONTIG},
   {"broadcast 2", 3, 4, {3, 1, 4}, {2, 1, 4, 6}, L_TRANS, L_CONTIG},
   {"empty", 2, 2, {0, 3}, {3, 4}, L_CONTIG, L_CONTIG},
   {"k = 0", 2, 2, {3, 0}, {0, 4}, L_CONTIG, L_CONTIG},
   {"large", 2, 2, {70, 130}, {130, 90}, L_CONTIG, L_TRANS},
};

/* a @ b, and (2-D) into in[2], an out= tensor with its own strides (transposed) */
static lm_status f_matmul(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   TRY(lm_matmul(in[0], in[1], &out[0]));
   if (!in[2]) return LM_OK;
   out[1] = in[2];
   TRY(lm_matmul(in[0], in[1], &out[1]));
   check(out[1] == in[2], "matmul out=: the result is the out tensor");
   return LM_OK;
}

/* lm_linear (LM_OP_LINEAR where the device fuses it: the CPU in float32): out[0] the fused call,
   out[1] the composed ops (x w^T, + bias, the activation op) on the same device */
typedef struct {
   const char *name;
   int64_t m, k, n;
   int bias, act, vx;
} lcase;

static const lcase LCASES[] = {
   {"relu", 5, 7, 6, 1, LM_ACT_RELU, L_CONTIG},
   {"gelu, several tiles", 70, 130, 90, 1, LM_ACT_GELU, L_CONTIG},
   {"silu, no bias", 33, 17, 40, 0, LM_ACT_SILU, L_CONTIG},
   {"hardswish, rows not dense", 20, 9, 35, 1, LM_ACT_HARDSWISH, L_NARROW},
   {"relu6, one row", 1, 9, 20, 1, LM_ACT_RELU6, L_CONTIG},
   {"gelu_tanh, one column", 40, 50, 1, 1, LM_ACT_GELU_TANH, L_CONTIG},
   {"sigmoid", 64, 96, 48, 1, LM_ACT_SIGMOID, L_CONTIG},
   {"bias only", 50, 40, 33, 1, LM_ACT_NONE, L_CONTIG},
   {"empty", 0, 3, 4, 1, LM_ACT_RELU, L_CONTIG},
};

static lm_status act_ref(lm_tensor *t, int act) {
   lm_tensor *o = t;
   switch (act) {
   case LM_ACT_NONE: return LM_OK;
   case LM_ACT_RELU: return lm_unary(LM_RELU, t, &o);
   case LM_ACT_RELU6: return lm_clamp(t, 0, 6, 1, 1, &o);
   case LM_ACT_SILU: return lm_unary(LM_SILU, t, &o);
   case LM_ACT_HARDSWISH: return lm_unary(LM_HARDSWISH, t, &o);
   case LM_ACT_HARDSIGMOID: return lm_unary(LM_HARDSIGMOID, t, &o);
   case LM_ACT_SIGMOID: return lm_unary(LM_SIGMOID, t, &o);
   case LM_ACT_GELU: return lm_unary(LM_GELU, t, &o);
   default: return lm_unary(LM_GELU_TANH, t, &o);
   }
}

static lm_status f_linear(lm_tensor **in, lm_tensor **out, const void *arg) {
   const lcase *c = arg;
   TRY(lm_linear(in[0], in[1], in[2], c->act, &out[0]));
   lm_tensor *wt = NULL;
   TRY(lm_transpose(in[1], 0, 1, &wt));
   lm_status st = lm_matmul(in[0], wt, &out[1]);
   lm_tensor_free(wt);
   TRY(st);
   if (in[2]) {
      lm_tensor *o = out[1];
      TRY(lm_binary(LM_ADD, out[1], in[2], 1.0, &o));
   }
   return act_ref(out[1], c->act);
}

static void cases_linear(void) {
   const int dts[2] = {LM_FLOAT32, LM_FLOAT64};
   for (size_t i = 0; i < sizeof LCASES / sizeof LCASES[0]; i++)
      for (int t = 0; t < 2; t++) {
         const lcase *c = &LCASES[i];
         g_tol = TOL_DNN;
         CASE("linear %s %s isa %s", c->name, lm_dtype_name(dts[t]), isa_name());
         const int64_t xs[2] = {c->m, c->k}, ws[2] = {c->n, c->k}, bs[1] = {c->n};
         lm_tensor *in[3] = {cpu_rand(2, xs, dts[t], c->vx, -2, 2),
                             cpu_rand(2, ws, dts[t], L_CONTIG, -1, 1),
                             c->bias ? cpu_rand(1, bs, dts[t], L_CONTIG, -1, 1) : NULL};
         if (run_case("fused,composed", 3, in, 2, f_linear, c))
            close_values(g_ref[0], g_ref[1], dts[t] == LM_FLOAT32 ? 1e-5 : 1e-12,
                         "linear: the fused call = matmul, add and the activation (cpu)");
         free_kept();
      }
   /* the other activations of the table, one case each */
   static const lcase more = {"hardsigmoid", 30, 20, 17, 1, LM_ACT_HARDSIGMOID, L_CONTIG};
   CASE("linear %s float32 isa %s", more.name, isa_name());
   const int64_t xs[2] = {more.m, more.k}, ws[2] = {more.n, more.k}, bs[1] = {more.n};
   lm_tensor *in[3] = {cpu_rand(2, xs, LM_FLOAT32, L_CONTIG, -4, 4),
                       cpu_rand(2, ws, LM_FLOAT32, L_CONTIG, -1, 1),
                       cpu_rand(1, bs, LM_FLOAT32, L_CONTIG, -1, 1)};
   if (run_case("fused,composed", 3, in, 2, f_linear, &more))
      close_values(g_ref[0], g_ref[1], 1e-5, "linear hardsigmoid: fused = composed (cpu)");
   free_kept();
}

static void cases_matmul(void) {
   cases_linear();
   g_tol = TOL_DNN;
   const int dts[2] = {LM_FLOAT32, LM_FLOAT64};
   for (size_t i = 0; i < sizeof MCASES / sizeof MCASES[0]; i++)
      for (int t = 0; t < 2; t++) {
         const mcase *c = &MCASES[i];
         CASE("matmul %s %s isa %s", c->name, lm_dtype_name(dts[t]), isa_name());
         const int two = c->na == 2 && c->nb == 2;
         const int64_t os[2] = {c->as[0], c->bs[1]};
         lm_tensor *in[3] = {cpu_rand(c->na, c->as, dts[t], c->va, -1, 1),
                             cpu_rand(c->nb, c->bs, dts[t], c->vb, -1, 1),
                             two ? cpu_rand(2, os, dts[t], L_TRANS, -1, 1) : NULL};
         if (run_case("out,out=", 3, in, two ? 2 : 1, f_matmul, NULL) && two)
            same_values(g_ref[1], g_ref[0], "matmul out= on the cpu");
         free_kept();
      }
}

typedef struct {
   const char *name;
   int64_t N, C, H, W, O, kh, kw, s[2], p[2], d[2], groups;
   int bias, res, act; /* act: the epilogue's lm_conv_act */
} ccase;

static const ccase CCASES[] = {
   /* name               N  C   H   W   O  kh kw stride  pad     dil    groups b r act */
   {"3x3 s1 p1",         2, 16, 8,  9,  16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 1, LM_ACT_RELU},
   {"3x3 s2 p1",         2, 8,  9,  7,  12, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, 1, 0, LM_ACT_SILU},
   {"1x1 pointwise",     2, 32, 5,  6,  24, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, 1, 1,
    LM_ACT_HARDSWISH},
   {"rgb stem 7x7 s2",   1, 3,  20, 22, 16, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, 0, 0, LM_ACT_RELU},
   {"rb 3x3 C=3",        1, 3,  16, 18, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 0, LM_ACT_RELU6},
   {"grey stem C=1",     2, 1,  16, 16, 8,  3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 0,
    LM_ACT_GELU_TANH},
   {"groups 2",          2, 8,  7,  7,  6,  3, 3, {1, 1}, {1, 1}, {1, 1}, 2, 1, 1, LM_ACT_SIGMOID},
   /* small groups (grouped_avx512: 4, 8 or 16 channels a group; blocks of 16 lanes that a
      group count prime to 2 leaves partial, stride 2, dilation, in != out per group) */
   {"groups of 8",       2, 24, 9,  10, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, 1, 1, LM_ACT_RELU},
   {"groups of 8 s2",    2, 40, 11, 9,  40, 3, 3, {2, 2}, {1, 1}, {1, 1}, 5, 1, 0, LM_ACT_SILU},
   {"groups of 4 dil 2", 1, 12, 9,  9,  12, 3, 3, {1, 1}, {2, 2}, {2, 2}, 3, 0, 1, LM_ACT_NONE},
   {"groups of 16 5x5",  1, 32, 10, 11, 32, 5, 5, {2, 2}, {2, 2}, {1, 1}, 2, 1, 1, LM_ACT_RELU},
   {"groups 8 in 4 out", 2, 16, 7,  8,  8,  3, 3, {1, 1}, {1, 1}, {1, 1}, 2, 1, 1, LM_ACT_GELU},
   {"groups 4 in 8 out", 2, 12, 7,  6,  24, 1, 3, {2, 1}, {0, 1}, {1, 1}, 3, 1, 0, LM_ACT_NONE},
   /* strided grad_input by phases: one no tap reaches (1x1 s2, 3x3 s2 dilation 2), even kernel */
   {"groups of 8 1x1 s2",1, 24, 9,  8,  24, 1, 1, {2, 2}, {0, 0}, {1, 1}, 3, 1, 0, LM_ACT_NONE},
   {"groups 8 s2 dil 2", 1, 16, 10, 11, 16, 3, 3, {2, 2}, {2, 2}, {2, 2}, 2, 0, 0, LM_ACT_NONE},
   {"groups 8 4x4 s2",   2, 24, 8,  9,  24, 4, 4, {2, 2}, {1, 1}, {1, 1}, 3, 1, 0, LM_ACT_RELU},
   {"depthwise",         2, 16, 7,  8,  16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 16, 1, 1, LM_ACT_SILU},
   {"depthwise s2",      1, 8,  9,  9,  8,  3, 3, {2, 2}, {1, 1}, {1, 1}, 8, 0, 0,
    LM_ACT_HARDSIGMOID},
   {"dilation 2",        1, 4,  9,  10, 5,  3, 3, {1, 1}, {2, 2}, {2, 2}, 1, 1, 0, LM_ACT_GELU},
   {"asymmetric",        2, 5,  6,  11, 7,  2, 3, {1, 2}, {0, 1}, {2, 1}, 1, 1, 1, LM_ACT_RELU},
   {"plain",             2, 6,  6,  6,  10, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 0, 0, LM_ACT_NONE},
};
enum { NCC = sizeof CCASES / sizeof CCASES[0] };

typedef struct {
   const ccase *c;
   int fmt;
} conv_arg;

/* forward (bias, residual, activation) and backward (every gradient; then grad_input and grad_bias
   alone: the kernel gets NULL for grad_weight) */
static lm_status f_conv(lm_tensor **in, lm_tensor **out, const void *arg) {
   const conv_arg *a = arg;
   const ccase *c = a->c;
   TRY(lm_conv2d(in[0], in[1], in[2], c->s, c->p, c->d, c->groups, a->fmt, c->act, in[3], &out[0]));
   TRY(lm_conv2d_backward(in[0], in[1], in[4], c->s, c->p, c->d, c->groups, a->fmt, &out[1],
                          &out[2], &out[3]));
   return lm_conv2d_backward(in[0], in[1], in[4], c->s, c->p, c->d, c->groups, a->fmt, &out[4],
                             NULL, &out[5]);
}

/* one geometry, dtype and pair of input views (fmt: LM_PRESERVE decides) on every device */
static void conv_case(const ccase *c, int dt, int vx, int vw, int fmt) {
   g_tol = TOL_CONV;
   CASE("conv2d %s %s x:%s w:%s fmt %d isa %s", c->name, lm_dtype_name(dt), LAYOUT_NAME[vx],
        LAYOUT_NAME[vw], fmt, isa_name());
   const int64_t xs[4] = {c->N, c->C, c->H, c->W};
   const int64_t ws[4] = {c->O, c->C / c->groups, c->kh, c->kw};
   const int64_t bs[1] = {c->O};
   int64_t ohw[2];
   OK(lm_conv2d_output_size(&xs[2], &ws[2], c->s, c->p, c->d, ohw));
   const int64_t os[4] = {c->N, c->O, ohw[0], ohw[1]};
   lm_tensor *in[5] = {cpu_rand(4, xs, dt, vx, -1, 1), cpu_rand(4, ws, dt, vw, -1, 1),
                       c->bias ? cpu_rand(1, bs, dt, vx == L_NARROW ? L_NARROW : L_CONTIG, -1, 1)
                               : NULL,
                       c->res ? cpu_rand(4, os, dt, vx, -1, 1) : NULL,
                       cpu_rand(4, os, dt, vx, -1, 1)};
   const conv_arg a = {c, fmt};
   if (run_case("out,grad_input,grad_weight,grad_bias,grad_input alone,grad_bias alone", 5, in, 6,
                f_conv, &a)) {
      same_values(g_ref[4], g_ref[1], "grad_input alone = grad_input with the others (cpu)");
      same_values(g_ref[5], g_ref[3], "grad_bias alone = grad_bias with grad_weight (cpu)");
   }
   free_kept();
}

/* out= tensors: written in place (dense in the format) or through a temporary */
static lm_status f_conv_out(lm_tensor **in, lm_tensor **out, const void *arg) {
   const ccase *c = arg;
   out[0] = in[2];
   TRY(lm_conv2d(in[0], in[1], NULL, c->s, c->p, c->d, 1, LM_PRESERVE, 0, NULL, &out[0]));
   check(out[0] == in[2], "conv2d out=: the result is the out tensor");
   return LM_OK;
}

/* conv3d (src/ops/conv3d.c: its plans run as conv2d kinds, or LM_OP_CONV3D where the device
   runs the call natively: bfloat16 channels_last_3d on AMX tiles on the CPU) */
typedef struct {
   int64_t xs[5], ws[5], s[3], p[3], d[3], groups;
} c3case;
static lm_status f_conv3d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const c3case *c = arg;
   TRY(lm_conv3d(in[0], in[1], in[2], c->s, c->p, c->d, c->groups, LM_PRESERVE, 0, NULL, &out[0]));
   return lm_conv3d_backward(in[0], in[1], in[3], c->s, c->p, c->d, c->groups, LM_PRESERVE,
                             &out[1], &out[2], &out[3]);
}

static void cases_conv(void) {
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   static const int vpairs[][2] = {{L_CONTIG, L_CONTIG}, {L_CL, L_CL}, {L_CL, L_CONTIG},
                                   {L_NARROW, L_CONTIG}, {L_NARROW, L_CL}};
   const int np = (int)(sizeof vpairs / sizeof vpairs[0]);
   if (g_role == I_BEST) {
      for (int i = 0; i < NCC; i++)
         for (int t = 0; t < 4; t++)
            for (int v = 0; v < np; v++)
               conv_case(&CCASES[i], dts[t], vpairs[v][0], vpairs[v][1], LM_PRESERVE);
      /* an explicit format against the inputs' own */
      conv_case(&CCASES[0], LM_FLOAT32, L_CONTIG, L_CONTIG, LM_CHANNELS_LAST);
      conv_case(&CCASES[7], LM_FLOAT32, L_CL, L_CL, LM_CONTIGUOUS);
      conv_case(&CCASES[0], LM_BFLOAT16, L_CONTIG, L_CONTIG, LM_CHANNELS_LAST);
      /* out= on every device */
      const ccase *c = &CCASES[0];
      const int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C, c->kh, c->kw};
      int64_t ohw[2];
      OK(lm_conv2d_output_size(&xs[2], &ws[2], c->s, c->p, c->d, ohw));
      const int64_t os[4] = {c->N, c->O, ohw[0], ohw[1]};
      for (int view = L_CONTIG; view <= L_NARROW; view++) {
         g_tol = TOL_CONV;
         CASE("conv2d out=%s isa %s", LAYOUT_NAME[view], isa_name());
         lm_tensor *in[3] = {cpu_rand(4, xs, LM_FLOAT32, L_CL, -1, 1),
                             cpu_rand(4, ws, LM_FLOAT32, L_CL, -1, 1),
                             cpu_rand(4, os, LM_FLOAT32, view, -1, 1)};
         run_case("out", 3, in, 1, f_conv_out, c);
         free_kept();
      }
      /* conv3d, both formats, a depth-1 kernel (in place on channels_last_3d) and a 3x3x3 */
      static const c3case c3[2] = {
         {{2, 4, 3, 6, 5}, {6, 4, 1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1},
         {{1, 4, 5, 6, 7}, {4, 2, 3, 3, 3}, {1, 2, 1}, {1, 1, 1}, {1, 1, 2}, 2},
      };
      for (int i = 0; i < 2; i++)
         for (int lay = 0; lay < 2; lay++) {
            g_tol = TOL_CONV;
            CASE("conv3d %d %s isa %s", i, LAYOUT_NAME[lay], isa_name());
            const int64_t bs[1] = {c3[i].ws[0]};
            int64_t od[3];
            OK(lm_conv3d_output_size(&c3[i].xs[2], &c3[i].ws[2], c3[i].s, c3[i].p, c3[i].d, od));
            const int64_t os3[5] = {c3[i].xs[0], c3[i].ws[0], od[0], od[1], od[2]};
            lm_tensor *in[4] = {cpu_rand(5, c3[i].xs, LM_FLOAT32, lay, -1, 1),
                                cpu_rand(5, c3[i].ws, LM_FLOAT32, lay, -1, 1),
                                cpu_rand(1, bs, LM_FLOAT32, L_CONTIG, -1, 1),
                                cpu_rand(5, os3, LM_FLOAT32, lay, -1, 1)};
            run_case("out,grad_input,grad_weight,grad_bias", 4, in, 4, f_conv3d, &c3[i]);
            free_kept();
         }
      /* bfloat16 channels_last_3d with every depth tap live: LM_OP_CONV3D where AMX is in use
         (32+ channels, and a stem's 3 channels 7 wide), the conv2d route elsewhere */
      static const c3case b3[3] = {
         {{2, 32, 4, 6, 5}, {40, 32, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, 1},
         {{1, 3, 4, 9, 10}, {32, 3, 3, 7, 7}, {1, 2, 2}, {1, 3, 3}, {1, 1, 1}, 1},
         {{1, 33, 5, 5, 6}, {48, 33, 2, 3, 1}, {2, 1, 1}, {0, 1, 0}, {2, 1, 1}, 1},
      };
      for (int i = 0; i < 3; i++) {
         g_tol = TOL_CONV;
         CASE("conv3d bfloat16 %d channels_last_3d isa %s", i, isa_name());
         const int64_t bs[1] = {b3[i].ws[0]};
         int64_t od[3];
         OK(lm_conv3d_output_size(&b3[i].xs[2], &b3[i].ws[2], b3[i].s, b3[i].p, b3[i].d, od));
         const int64_t os3[5] = {b3[i].xs[0], b3[i].ws[0], od[0], od[1], od[2]};
         lm_tensor *in[4] = {cpu_rand(5, b3[i].xs, LM_BFLOAT16, L_CL, -1, 1),
                             cpu_rand(5, b3[i].ws, LM_BFLOAT16, L_CL, -1, 1),
                             cpu_rand(1, bs, LM_BFLOAT16, L_CONTIG, -1, 1),
                             cpu_rand(5, os3, LM_BFLOAT16, L_CL, -1, 1)};
         run_case("out,grad_input,grad_weight,grad_bias", 4, in, 4, f_conv3d, &b3[i]);
         free_kept();
      }
   }
   /* bfloat16 through the float32 fallback with the AVX-512 kernels, where the CPU has more */
   if (g_role == I_AVX512)
      for (int i = 0; i < NCC; i++) conv_case(&CCASES[i], LM_BFLOAT16, L_CL, L_CL, LM_PRESERVE);
   /* the AVX2 GEMM under the portable im2col path */
   if (g_role == I_AVX2)
      for (int i = 0; i < NCC; i++) conv_case(&CCASES[i], LM_FLOAT32, L_CONTIG, L_CONTIG, LM_PRESERVE);
   /* the portable kernels */
   if (g_role == I_C)
      for (int i = 0; i < NCC; i++) {
         conv_case(&CCASES[i], LM_FLOAT32, L_CL, L_CL, LM_PRESERVE);
         conv_case(&CCASES[i], LM_FLOAT32, L_CONTIG, L_CONTIG, LM_PRESERVE);
         conv_case(&CCASES[i], LM_BFLOAT16, L_CL, L_CL, LM_PRESERVE);
      }
}

/* a CPU tensor with a sim:0 one; lm_clone on meta */
static void rules_conv(void) {
   CASE("conv2d / matmul device rules");
   {
      const int64_t sz[2] = {3, 4};
      lm_tensor *t = to_dev(cpu_rand(2, sz, LM_FLOAT32, L_TRANS, -1, 1), LM_META), *c = NULL;
      check(lm_clone(t, LM_CONTIGUOUS, -1, &c) == LM_OK, "lm_clone of a non-dense meta tensor (%s)",
            lm_last_error());
      keep(c);
   }
   const int64_t xs[4] = {1, 2, 5, 5}, ws[4] = {3, 2, 3, 3}, bs[1] = {3}, os[4] = {1, 3, 3, 3};
   lm_tensor *xc = cpu_rand(4, xs, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *wc = cpu_rand(4, ws, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *bc = cpu_rand(1, bs, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *rc = cpu_rand(4, os, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *xs0 = to_dev(xc, LM_SIM0), *ws0 = to_dev(wc, LM_SIM0), *bs0 = to_dev(bc, LM_SIM0);
   lm_tensor *rs0 = to_dev(rc, LM_SIM0);
   lm_tensor *o = NULL;
   expect_device_error(lm_conv2d(xc, ws0, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d x cpu, w sim:0");
   expect_device_error(lm_conv2d(xs0, wc, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d x sim:0, w cpu");
   expect_device_error(lm_conv2d(xc, wc, bs0, NULL, NULL, NULL, 1, -1, 0, NULL, &o),
                       "conv2d bias sim:0");
   expect_device_error(lm_conv2d(xs0, ws0, bs0, NULL, NULL, NULL, 1, -1, 0, rc, &o),
                       "conv2d residual cpu");
   check(o == NULL, "conv2d: no result after an error");
   lm_tensor *oc = cpu_rand(4, os, LM_FLOAT32, L_CONTIG, -1, 1);
   expect_device_error(lm_conv2d(xs0, ws0, NULL, NULL, NULL, NULL, 1, -1, 0, NULL, &oc),
                       "conv2d out= cpu");
   lm_tensor *gx = NULL, *gw = NULL, *gb = NULL;
   expect_device_error(lm_conv2d_backward(xs0, ws0, rc, NULL, NULL, NULL, 1, -1, &gx, &gw, &gb),
                       "conv2d_backward grad_output cpu");
   expect_device_error(lm_conv2d_backward(xc, ws0, rc, NULL, NULL, NULL, 1, -1, &gx, &gw, &gb),
                       "conv2d_backward w sim:0");
   lm_tensor *gxc = cpu_rand(4, xs, LM_FLOAT32, L_CONTIG, -1, 1);
   expect_device_error(lm_conv2d_backward(xs0, ws0, rs0, NULL, NULL, NULL, 1, -1, &gxc, NULL, NULL),
                       "conv2d_backward grad_input= cpu");
   check(!gx && !gw && !gb, "conv2d_backward: no result after an error");
   const int64_t as[2] = {3, 4}, bsm[2] = {4, 2}, ms[2] = {3, 2};
   lm_tensor *ac = cpu_rand(2, as, LM_FLOAT64, L_CONTIG, -1, 1);
   lm_tensor *bm = to_dev(cpu_rand(2, bsm, LM_FLOAT64, L_CONTIG, -1, 1), LM_SIM0);
   lm_tensor *as0 = to_dev(ac, LM_SIM0);
   lm_tensor *m = NULL;
   expect_device_error(lm_matmul(ac, bm, &m), "matmul a cpu, b sim:0");
   expect_device_error(lm_matmul(bm, ac, &m), "matmul a sim:0, b cpu");
   lm_tensor *mc = cpu_rand(2, ms, LM_FLOAT64, L_CONTIG, -1, 1);
   expect_device_error(lm_matmul(as0, bm, &mc), "matmul out= cpu");
   check(m == NULL, "matmul: no result after an error");
   free_kept();
}

/* ======================================================================================== */
/* batch norm, nll_loss, softmax                                                            */
/* ======================================================================================== */

typedef struct {
   int nd;
   int64_t sz[5];
   int layout;
} shape;

typedef struct {
   int training, relu, residual;
} bn_arg;

/* the fused forward (running statistics updated in place), the fused backward, and grad_input
   alone through the plain backward */
static lm_status f_bn(lm_tensor **in, lm_tensor **out, const void *arg) {
   const bn_arg *a = arg;
   lm_tensor *x = in[0], *w = in[1], *b = in[2], *rm = in[3], *rv = in[4], *res = in[5], *g = in[6];
   out[3] = rm, out[4] = rv;
   TRY(lm_batch_norm_fused(x, w, b, rm, rv, a->training, 0.1, 1e-5, res, a->relu, &out[0], &out[1],
                           &out[2]));
   const int fused_bwd = a->relu; /* the relu's backward inside: mask = y */
   TRY(lm_batch_norm_backward_fused(g, fused_bwd ? out[0] : NULL, x, w, out[1], out[2], a->training,
                                    &out[5], &out[6], &out[7],
                                    fused_bwd && a->residual ? &out[8] : NULL));
   return lm_batch_norm_backward(g, x, w, out[1], out[2], a->training, &out[9], NULL, NULL);
}

static void bn_case(const shape *sh, int dt, int training, int affine, int stats, int residual,
                    int relu, int pdt, int strided_param) {
   g_tol = TOL_BN;
   const int64_t csz[1] = {sh->sz[1]};
   lm_tensor *in[7] = {
      cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 3),
      affine ? cpu_rand(1, csz, pdt, strided_param ? L_STRIDED : L_CONTIG, 0.5, 1.5) : NULL,
      affine ? cpu_rand(1, csz, pdt, L_CONTIG, -1, 1) : NULL,
      stats ? cpu_rand(1, csz, pdt, strided_param ? L_STRIDED : L_CONTIG, -1, 1) : NULL,
      stats ? cpu_rand(1, csz, pdt, L_CONTIG, 0.5, 2) : NULL,
      residual ? cpu_rand(sh->nd, sh->sz, dt, L_STRIDED, -1, 1) : NULL,
      cpu_rand(sh->nd, sh->sz, dt, sh->layout == L_CL ? L_CL : L_STRIDED, -1, 1)};
   const bn_arg a = {training, relu, residual};
   g_compute_dt = dt;
   run_case("output,save_mean,save_invstd,running_mean,running_var,grad_input,grad_weight,"
            "grad_bias,grad_masked,grad_input alone",
            7, in, 10, f_bn, &a);
   g_compute_dt = -1;
}

static void cases_batch_norm(void) {
   static const shape shapes[] = {
      {4, {4, 3, 5, 6}, L_CONTIG}, {4, {4, 3, 5, 6}, L_CL},     {4, {4, 3, 5, 6}, L_STRIDED},
      {2, {6, 5}, L_CONTIG},       {2, {6, 5}, L_STRIDED},      {3, {3, 4, 7}, L_CONTIG},
      {5, {2, 3, 2, 3, 4}, L_CL},  {5, {2, 3, 2, 3, 4}, L_CONTIG}, {4, {2, 70, 3, 3}, L_CL},
      {4, {2, 19, 3, 3}, L_CL},    {4, {2, 70, 3, 3}, L_CONTIG}, {4, {8, 64, 24, 24}, L_CL},
      {4, {8, 16, 48, 48}, L_CONTIG}, {4, {0, 3, 2, 2}, L_CONTIG},
   };
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const shape *sh = &shapes[s];
      const int64_t big = sh->sz[0] * sh->sz[1] * (sh->nd > 2 ? sh->sz[2] : 1);
      for (int dti = 0; dti < 4; dti++) {
         const int dt = dts[dti];
         for (int variant = 0; variant < 12; variant++) {
            const int training = variant & 1, affine = (variant >> 1) & 1;
            const int fused = variant >> 2; /* 0 plain, 1 relu, 2 residual + relu */
            /* big shapes: a few variants only */
            if (big > 10000 && variant != 1 && variant != 3 && variant != 11) continue;
            const int residual = fused == 2, relu = fused >= 1;
            for (int stats = 0; stats < 2; stats++) {
               if (!training && !stats) continue; /* eval needs the running statistics */
               /* the parameters: float32 with half inputs (the mixed case) or the input dtype */
               const int pdt = (s + variant) % 3 == 0 ? (dt == LM_FLOAT32 ? LM_FLOAT64 : LM_FLOAT32)
                                                      : dt;
               /* the halves: a third of the variants (each one still seen across the shapes),
                  the big shapes once */
               if (dti >= 2 && (big > 10000 ? variant != 3 : (variant + s + dti) % 3 != 0)) continue;
               const int sp = (s + variant + stats) % 2;
               CASE("batch_norm %dD [%lld,%lld,...] %s %s train %d affine %d stats %d residual %d "
                    "relu %d param %s%s isa %s",
                    sh->nd, (long long)sh->sz[0], (long long)sh->sz[1], LAYOUT_NAME[sh->layout],
                    lm_dtype_name(dt), training, affine, stats, residual, relu, lm_dtype_name(pdt),
                    sp ? " strided" : "", isa_name());
               bn_case(sh, dt, training, affine, stats, residual, relu, pdt, sp);
               free_kept();
            }
         }
      }
   }
}

/* group norm: forward (mean and rstd too), the three gradients, grad_input alone */
typedef struct {
   int groups, affine;
} gn_arg;

static lm_status f_gn(lm_tensor **in, lm_tensor **out, const void *arg) {
   const gn_arg *a = arg;
   lm_tensor *x = in[0], *w = in[1], *b = in[2], *g = in[3];
   TRY(lm_group_norm(x, a->groups, w, b, 1e-5, &out[0], &out[1], &out[2]));
   TRY(lm_group_norm_backward(g, x, out[1], out[2], w, a->groups, &out[3], a->affine ? &out[4] : NULL,
                              a->affine ? &out[5] : NULL));
   return lm_group_norm_backward(g, x, out[1], out[2], w, a->groups, &out[6], NULL, NULL);
}

static void cases_group_norm(void) {
   static const shape shapes[] = {
      {4, {2, 8, 5, 6}, L_CONTIG}, {4, {2, 8, 5, 6}, L_CL},   {4, {2, 8, 5, 6}, L_STRIDED},
      {2, {3, 12}, L_CONTIG},      {3, {2, 6, 7}, L_CONTIG},  {5, {2, 4, 2, 3, 4}, L_CL},
      {4, {2, 64, 12, 12}, L_CL},  {4, {0, 4, 2, 2}, L_CONTIG},
   };
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const shape *sh = &shapes[s];
      const int64_t csz[1] = {sh->sz[1]};
      for (int dti = 0; dti < 4; dti++) {
         const int dt = dts[dti];
         for (int variant = 0; variant < 4; variant++) {
            const int affine = variant & 1, groups = (variant >> 1) ? 2 : (int)sh->sz[1] > 0
                                                                             ? (int)sh->sz[1] : 1;
            /* float16 / bfloat16 parameters are float32 (as the Lua side passes them) */
            const int pdt = dt == LM_FLOAT64 ? LM_FLOAT64 : LM_FLOAT32;
            CASE("group_norm %dD [%lld,%lld,...] %s %s groups %d affine %d isa %s", sh->nd,
                 (long long)sh->sz[0], (long long)sh->sz[1], LAYOUT_NAME[sh->layout],
                 lm_dtype_name(dt), groups, affine, isa_name());
            g_tol = TOL_BN;
            lm_tensor *in[4] = {
               cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 3),
               affine ? cpu_rand(1, csz, pdt, L_CONTIG, 0.5, 1.5) : NULL,
               affine ? cpu_rand(1, csz, pdt, L_CONTIG, -1, 1) : NULL,
               cpu_rand(sh->nd, sh->sz, dt, sh->layout == L_CL ? L_CL : L_STRIDED, -1, 1)};
            const gn_arg a = {groups, affine};
            g_compute_dt = dt;
            run_case("output,mean,rstd,grad_input,grad_weight,grad_bias,grad_input alone", 4, in, 7,
                     f_gn, &a);
            g_compute_dt = -1;
            free_kept();
         }
      }
   }
}

static void rules_batch_norm(void) {
   CASE("batch_norm device rules");
   const int64_t sz[4] = {2, 3, 4, 4}, csz[1] = {3};
   lm_tensor *x = cpu_rand(4, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *rm = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *rv = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, 1, 2);
   lm_tensor *w = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *srm = to_dev(rm, LM_SIM0), *sw = to_dev(w, LM_SIM0);
   lm_tensor *y = NULL, *sm = NULL, *si = NULL;
   expect_device_error(lm_batch_norm(x, sw, NULL, rm, rv, 1, 0.1, 1e-5, &y, NULL, NULL),
                       "weight on sim:0");
   expect_device_error(lm_batch_norm(x, NULL, NULL, srm, rv, 1, 0.1, 1e-5, &y, NULL, NULL),
                       "running_mean on sim:0");
   expect_device_error(lm_batch_norm(sx, NULL, NULL, rm, rv, 0, 0.1, 1e-5, &y, NULL, NULL),
                       "input on sim:0");
   expect_device_error(lm_batch_norm_fused(x, NULL, NULL, rm, rv, 0, 0.1, 1e-5, sx, 1, &y, NULL, NULL),
                       "residual on sim:0");
   check(y == NULL, "no output after a device error");
   OK(lm_batch_norm(x, w, NULL, rm, rv, 1, 0.1, 1e-5, &y, &sm, &si));
   keep(y), keep(sm), keep(si);
   lm_tensor *gx = NULL;
   expect_device_error(lm_batch_norm_backward(sx, x, w, sm, si, 1, &gx, NULL, NULL),
                       "grad_output on sim:0");
   expect_device_error(lm_batch_norm_backward(x, x, sw, sm, si, 1, &gx, NULL, NULL),
                       "weight on sim:0 (backward)");
   lm_tensor *ssm = to_dev(sm, LM_SIM0);
   expect_device_error(lm_batch_norm_backward(x, x, w, ssm, si, 1, &gx, NULL, NULL),
                       "save_mean on sim:0");
   expect_device_error(lm_batch_norm_backward_fused(x, sx, x, w, sm, si, 1, &gx, NULL, NULL, NULL),
                       "relu_out on sim:0");
   /* an out= tensor on another device */
   lm_tensor *yo = NULL;
   OK(lm_empty(4, sz, LM_FLOAT32, LM_CONTIGUOUS, LM_SIM0, &yo));
   keep(yo);
   lm_status st = lm_batch_norm(x, NULL, NULL, rm, rv, 0, 0.1, 1e-5, &yo, NULL, NULL);
   check(st == LM_ERR_DEVICE, "out= on sim:0: status %d", (int)st);
   free_kept();
}

/* nll_loss targets: (i * 7 + 3) mod C, the second one `ignore`; strided: every other row of a
   wider int64 tensor */
static lm_tensor *cpu_target(int nd, const int64_t *sz, int64_t C, int64_t ignore, int strided) {
   int64_t n = 1;
   for (int i = 0; i < nd; i++) n *= sz[i];
   double *v = malloc(sizeof(double) * (size_t)(n + 1));
   for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7 + 3) % C);
   if (n > 2) v[1] = (double)ignore; /* at least one ignored sample */
   lm_tensor *t = NULL;
   if (strided && nd > 0) {
      int64_t big[LM_MAX_DIMS], st[LM_MAX_DIMS];
      memcpy(big, sz, sizeof(int64_t) * (size_t)nd);
      big[0] = 2 * sz[0];
      lm_tensor *b = NULL;
      OK(lm_empty(nd, big, LM_INT64, LM_CONTIGUOUS, LM_CPU, &b));
      keep(b);
      OK(lm_fill_(b, 0));
      memcpy(st, b->strides, sizeof(int64_t) * (size_t)nd);
      st[0] *= 2;
      OK(lm_as_strided(b, nd, sz, st, 0, &t));
      keep(t);
      lm_tensor *c = NULL;
      OK(lm_empty(nd, sz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &c));
      keep(c);
      OK(lm_from_doubles(c, v));
      OK(lm_copy_(t, c));
   } else {
      OK(lm_empty(nd, sz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &t));
      keep(t);
      OK(lm_from_doubles(t, v));
   }
   free(v);
   return t;
}

typedef struct {
   int reduction;
   int64_t ignore;
} nll_arg;

static lm_status f_nll(lm_tensor **in, lm_tensor **out, const void *arg) {
   const nll_arg *a = arg;
   TRY(lm_nll_loss(in[0], in[1], in[2], a->reduction, a->ignore, &out[0], &out[1]));
   TRY(lm_nll_loss_backward(in[3], in[0], in[1], in[2], a->reduction, a->ignore, out[1], &out[2]));
   /* without total_weight */
   return lm_nll_loss(in[0], in[1], in[2], a->reduction, a->ignore, &out[3], NULL);
}

static void cases_nll_loss(void) {
   static const shape shapes[] = {
      {1, {5}, L_CONTIG},          {2, {7, 5}, L_CONTIG},       {2, {7, 5}, L_STRIDED},
      {4, {2, 5, 3, 4}, L_CONTIG}, {4, {2, 5, 3, 4}, L_CL},     {3, {3, 4, 6}, L_STRIDED},
      {2, {0, 5}, L_CONTIG},
   };
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   g_tol = TOL_DNN;
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++)
      for (int dti = 0; dti < 4; dti++)
         for (int red = 0; red < 3; red++)
            for (int wv = 0; wv < 3; wv++)
               for (int ig = 0; ig < 2; ig++) {
                  const shape *sh = &shapes[s];
                  const int dt = dts[dti];
                  const int wdt = wv == 2 ? (dt == LM_FLOAT32 ? LM_FLOAT64 : LM_FLOAT32) : dt;
                  const int64_t ignore = ig ? 2 : -100;
                  const int st = (s + red + wv) % 2;
                  CASE("nll_loss %dD %s %s reduction %d weight %d ignore %lld target %s isa %s",
                       sh->nd, LAYOUT_NAME[sh->layout], lm_dtype_name(dt), red, wv,
                       (long long)ignore, st ? "strided" : "contiguous", isa_name());
                  const int cdim = sh->nd == 1 ? 0 : 1;
                  const int64_t C = sh->sz[cdim], csz[1] = {C};
                  int64_t tsz[4];
                  int tnd = 0;
                  for (int i = 0; i < sh->nd; i++)
                     if (i != cdim) tsz[tnd++] = sh->sz[i];
                  lm_tensor *in[4] = {
                     cpu_rand(sh->nd, sh->sz, dt, sh->layout, -3, 0),
                     cpu_target(tnd, tsz, C, ignore, st),
                     wv > 0 ? cpu_rand(1, csz, wdt, L_CONTIG, 0.5, 2) : NULL,
                     red == LM_REDUCTION_NONE ? cpu_rand(tnd, tsz, dt, L_STRIDED, -1, 1)
                                              : cpu_rand(0, NULL, dt, L_CONTIG, 0.5, 1.5)};
                  const nll_arg a = {red, ignore};
                  if (run_case("output,total_weight,grad_input,output (no total_weight)", 4, in, 4,
                               f_nll, &a))
                     same_values(g_ref[3], g_ref[0], "output without total_weight (cpu)");
                  free_kept();
               }
}

static void rules_nll_loss(void) {
   CASE("nll_loss device rules");
   const int64_t sz[2] = {4, 3}, tsz[1] = {4}, csz[1] = {3};
   lm_tensor *in = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -2, 0);
   lm_tensor *tg = cpu_target(1, tsz, 3, -100, 0);
   lm_tensor *w = cpu_rand(1, csz, LM_FLOAT32, L_CONTIG, 1, 2);
   lm_tensor *sin = to_dev(in, LM_SIM0), *stg = to_dev(tg, LM_SIM0), *sw = to_dev(w, LM_SIM0);
   lm_tensor *out = NULL, *tw = NULL, *gi = NULL;
   expect_device_error(lm_nll_loss(in, stg, NULL, 1, -100, &out, NULL), "target on sim:0");
   expect_device_error(lm_nll_loss(sin, tg, NULL, 1, -100, &out, NULL), "input on sim:0");
   expect_device_error(lm_nll_loss(in, tg, sw, 1, -100, &out, NULL), "weight on sim:0");
   check(out == NULL, "no output after a device error");
   OK(lm_nll_loss(in, tg, w, 1, -100, &out, &tw));
   keep(out), keep(tw);
   lm_tensor *sout = to_dev(out, LM_SIM0), *stw = to_dev(tw, LM_SIM0);
   expect_device_error(lm_nll_loss_backward(sout, in, tg, w, 1, -100, tw, &gi),
                       "grad_output on sim:0");
   expect_device_error(lm_nll_loss_backward(out, in, tg, w, 1, -100, stw, &gi),
                       "total_weight on sim:0");
   expect_device_error(lm_nll_loss_backward(out, in, stg, w, 1, -100, tw, &gi),
                       "target on sim:0 (backward)");
   check(gi == NULL, "no grad_input after a device error");
   /* a target out of range is the kernel's error, on every device that computes */
   double bad[4] = {0, 1, 5, 2};
   lm_tensor *tb = NULL;
   OK(lm_empty(1, tsz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &tb));
   keep(tb);
   OK(lm_from_doubles(tb, bad));
   lm_tensor *stb = to_dev(tb, LM_SIM0), *mtb = to_dev(tb, LM_META);
   lm_tensor *o1 = NULL;
   lm_status st = lm_nll_loss(in, tb, NULL, 1, -100, &o1, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !o1,
         "cpu bad target: %d %s", (int)st, lm_last_error());
   /* into an out= tensor (0-dim) on the CPU, then on sim:0 */
   st = lm_nll_loss(in, tg, NULL, 2, -100, &out, NULL);
   check(st == LM_OK, "cpu out=: %d %s", (int)st, lm_last_error());
   st = lm_nll_loss(sin, stg, NULL, 2, -100, &sout, NULL);
   check(st == LM_OK, "sim out=: %d %s", (int)st, lm_last_error());
   same("out= result", out, sout, D_SIM);
   lm_tensor *o2 = NULL;
   st = lm_nll_loss(sin, stb, NULL, 1, -100, &o2, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !o2,
         "sim bad target: %d %s", (int)st, lm_last_error());
   st = lm_nll_loss_backward(sout, sin, stb, NULL, 2, -100, NULL, &gi);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds") && !gi,
         "sim bad target (backward): %d %s", (int)st, lm_last_error());
   lm_tensor *min = to_dev(in, LM_META);
   st = lm_nll_loss(min, mtb, NULL, 1, -100, &o2, NULL);
   check(st == LM_OK, "meta: values are not looked at: %d", (int)st);
   keep(o2);
   free_kept();
}

typedef lm_status (*sm_fwd_fn)(const lm_tensor *, int, lm_tensor **);
typedef lm_status (*sm_bwd_fn)(const lm_tensor *, const lm_tensor *, int, lm_tensor **);
typedef struct {
   int dim, lg;
} sm_arg;

/* forward and backward over dim; the backward also from a strided copy of the forward's result;
   out= tensors (contiguous: used in place; strided: filled through a copy) for both */
static lm_status f_softmax(lm_tensor **in, lm_tensor **out, const void *arg) {
   const sm_arg *a = arg;
   const sm_fwd_fn fwd = a->lg ? lm_log_softmax : lm_softmax;
   const sm_bwd_fn bwd = a->lg ? lm_log_softmax_backward : lm_softmax_backward;
   lm_tensor *x = in[0], *g = in[1];
   TRY(fwd(x, a->dim, &out[0]));
   TRY(bwd(g, out[0], a->dim, &out[1]));
   TRY(lm_copy_(in[2], out[0]));
   TRY(bwd(g, in[2], a->dim, &out[2]));
   for (int i = 0; i < 4; i++) out[3 + i] = in[3 + i];
   TRY(fwd(x, a->dim, &out[3]));
   TRY(fwd(x, a->dim, &out[4]));
   TRY(bwd(g, out[0], a->dim, &out[5]));
   TRY(bwd(g, out[0], a->dim, &out[6]));
   for (int i = 0; i < 4; i++) check(out[3 + i] == in[3 + i], "out=: the result is the out tensor");
   return LM_OK;
}

static lm_tensor *cpu_like(const lm_tensor *c) {
   lm_tensor *t = NULL;
   OK(lm_empty_strided(c->ndim, c->sizes, c->strides, c->dtype, LM_CPU, &t));
   return keep(t);
}

static void cases_softmax(void) {
   static const shape shapes[] = {
      {0, {0}, L_CONTIG},             {1, {7}, L_CONTIG},             {1, {7}, L_STRIDED},
      {1, {1}, L_CONTIG},             {2, {5, 9}, L_CONTIG},          {2, {5, 9}, L_STRIDED},
      {2, {1, 33}, L_CONTIG},         {3, {3, 4, 6}, L_CONTIG},       {3, {3, 4, 6}, L_STRIDED},
      {4, {2, 3, 4, 5}, L_CONTIG},    {4, {2, 3, 4, 5}, L_CL},        {4, {2, 3, 4, 5}, L_STRIDED},
      {4, {2, 1, 3, 1}, L_CL},        {5, {2, 3, 2, 3, 4}, L_CL},     {5, {2, 3, 2, 3, 4}, L_STRIDED},
      {2, {0, 5}, L_CONTIG},          {3, {2, 0, 3}, L_STRIDED},      {2, {64, 300}, L_CONTIG},
      {3, {4, 130, 17}, L_CONTIG},    {4, {4, 40, 6, 7}, L_CL},
   };
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   g_tol = TOL_DNN;
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const shape *sh = &shapes[s];
      const int n = sh->nd > 0 ? sh->nd : 1;
      for (int dti = 0; dti < 4; dti++) {
         const int dt = dts[dti];
         for (int dim = -n; dim < n; dim++)
            for (int lg = 0; lg < 2; lg++) {
               if (dti >= 2 && (dim + s + lg) % 2 != 0) continue; /* halves: half the cases */
               CASE("%s %dD [%lld,...] %s %s dim %d isa %s", lg ? "log_softmax" : "softmax",
                    sh->nd, (long long)sh->sz[0], LAYOUT_NAME[sh->layout], lm_dtype_name(dt), dim,
                    isa_name());
               lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -4, 4);
               lm_tensor *g = cpu_rand(sh->nd, sh->sz, dt, sh->layout == L_CL ? L_CL : L_STRIDED, -1, 1);
               /* the out= tensors: the layouts of the cpu's results, and strided */
               lm_tensor *y = NULL, *gx = NULL;
               OK((lg ? lm_log_softmax : lm_softmax)(x, dim, &y));
               keep(y);
               OK((lg ? lm_log_softmax_backward : lm_softmax_backward)(g, y, dim, &gx));
               keep(gx);
               lm_tensor *in[7] = {x, g, cpu_rand(sh->nd, sh->sz, dt, L_STRIDED, 0, 1), cpu_like(y),
                                   cpu_rand(sh->nd, sh->sz, dt, L_STRIDED, 0, 1), cpu_like(gx),
                                   cpu_rand(sh->nd, sh->sz, dt, L_STRIDED, 0, 1)};
               const sm_arg a = {dim, lg};
               if (run_case("output,grad_input,grad_input (strided output),output out= contiguous,"
                            "output out= strided,grad_input out= contiguous,grad_input out= strided",
                            7, in, 7, f_softmax, &a)) {
                  same_values(g_ref[3], g_ref[0], "out= contiguous = output (cpu)");
                  same_values(g_ref[4], g_ref[0], "out= strided = output (cpu)");
               }
               free_kept();
            }
      }
   }
}

/* ---------------------------------------------------------------------------------------- */
/* resample (F.interpolate's passes)                                                         */

/* a 1-D CPU tensor of dtype dt holding v[0 .. n) */
static lm_tensor *cpu_vec(int64_t n, int dt, const double *v) {
   lm_tensor *t = NULL;
   OK(lm_empty(1, &n, dt, LM_CONTIGUOUS, LM_CPU, &t));
   keep(t);
   if (n > 0) OK(lm_from_doubles(t, v));
   return t;
}

static lm_status f_resample(lm_tensor **in, lm_tensor **out, const void *arg) {
   (void)arg;
   TRY(lm_resample(in[0], in[1], in[2], in[3], &out[0]));
   out[1] = in[4];
   TRY(lm_resample(in[0], in[1], in[2], in[3], &out[1]));
   check(out[1] == in[4], "out=: the result is the out tensor");
   return LM_OK;
}

static void cases_resample(void) {
   /* tap tables over In = 5: nearest 2x (one tap of weight 1), linear 5 -> 3 (pairs, the last
      repeating its index), bicubic-like (four clamped taps), rows without taps, and the
      transposed table of a linear one (variable counts) */
   static const struct {
      const char *name;
      int64_t out, nnz;
      double ptr[11], idx[24], w[24];
   } tabs[] = {
      {"nearest 2x", 10, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {0, 0, 1, 1, 2, 2, 3, 3, 4, 4},
       {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
      {"linear", 3, 6, {0, 2, 4, 6}, {0, 1, 2, 3, 4, 4}, {0.75, 0.25, 0.5, 0.5, 1, 0}},
      {"cubic", 2, 8, {0, 4, 8}, {0, 0, 1, 2, 2, 3, 4, 4}, {-0.1, 0.6, 0.6, -0.1, -0.05, 0.5, 0.6, -0.05}},
      {"empty rows", 4, 3, {0, 0, 2, 2, 3}, {4, 1, 2}, {0.3, 0.7, 2}},
      {"transposed", 5, 7, {0, 2, 3, 4, 6, 7}, {0, 1, 1, 2, 3, 4, 4}, {1, 0.25, 0.75, 0.5, 0.5, 0.5, 0.25}},
   };
   static const struct {
      int64_t B, R;
      int layout;
   } shp[] = {{1, 1, L_CONTIG}, {3, 7, L_CONTIG}, {2, 16, L_STRIDED}, {4, 33, L_CONTIG}};
   static const int dts[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};
   g_tol = TOL_DNN;
   for (int t = 0; t < (int)(sizeof tabs / sizeof tabs[0]); t++)
      for (int s = 0; s < (int)(sizeof shp / sizeof shp[0]); s++)
         for (int dti = 0; dti < 4; dti++) {
            const int dt = dts[dti];
            CASE("resample %s B %lld R %lld %s %s isa %s", tabs[t].name, (long long)shp[s].B,
                 (long long)shp[s].R, LAYOUT_NAME[shp[s].layout], lm_dtype_name(dt), isa_name());
            const int64_t xs[3] = {shp[s].B, 5, shp[s].R}, ys[3] = {shp[s].B, tabs[t].out, shp[s].R};
            const int wdt = dt == LM_FLOAT64 ? LM_FLOAT64 : LM_FLOAT32;
            lm_tensor *in[5] = {cpu_rand(3, xs, dt, shp[s].layout, -2, 2),
                                cpu_vec(tabs[t].out + 1, LM_INT64, tabs[t].ptr),
                                cpu_vec(tabs[t].nnz, LM_INT64, tabs[t].idx),
                                cpu_vec(tabs[t].nnz, wdt, tabs[t].w),
                                cpu_rand(3, ys, dt, L_STRIDED, 0, 1)};
            if (run_case("output,output out= strided", 5, in, 2, f_resample, NULL))
               same_values(g_ref[1], g_ref[0], "out= strided = output (cpu)");
            free_kept();
         }
}

static void rules_resample(void) {
   CASE("resample rules");
   const int64_t xs[3] = {2, 5, 3};
   const double ptr[3] = {0, 1, 2}, idx[2] = {0, 4}, bad[2] = {0, 5}, w[2] = {1, 0.5};
   const double dptr[3] = {0, 2, 1};
   lm_tensor *x = cpu_rand(3, xs, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *p = cpu_vec(3, LM_INT64, ptr), *i = cpu_vec(2, LM_INT64, idx);
   lm_tensor *wv = cpu_vec(2, LM_FLOAT32, w), *y = NULL;
   OK(lm_resample(x, p, i, wv, &y));
   keep(y);
   check(y->ndim == 3 && y->sizes[1] == 2 && lm_is_contiguous(y, LM_CONTIGUOUS), "shape");
   expect_device_error(lm_resample(x, to_dev(p, LM_SIM0), i, wv, &y), "ptr on sim:0");
   expect_device_error(lm_resample(to_dev(x, LM_SIM0), p, i, wv, &y), "x on sim:0");
   y = NULL;
   expect_status(lm_resample(x, p, cpu_vec(2, LM_INT64, bad), wv, &y), LM_ERR_ARG,
                 "reads index 5 of a dim of size 5", "index out of range");
   expect_status(lm_resample(x, cpu_vec(3, LM_INT64, dptr), i, wv, &y), LM_ERR_ARG,
                 "ptr decreases", "ptr decreasing");
   expect_status(lm_resample(x, p, i, cpu_vec(2, LM_FLOAT64, w), &y), LM_ERR_DTYPE, "w must be float32",
                 "w dtype");
   expect_status(lm_resample(x, p, cpu_vec(2, LM_FLOAT32, idx), wv, &y), LM_ERR_DTYPE,
                 "idx must be int64", "idx dtype");
   const int64_t s2[2] = {5, 3};
   expect_status(lm_resample(cpu_rand(2, s2, LM_FLOAT32, L_CONTIG, 0, 1), p, i, wv, &y),
                 LM_ERR_SHAPE, "3-D input", "rank");
   check(y == NULL, "no output after an error");
   free_kept();
}

static void rules_softmax(void) {
   CASE("softmax device rules");
   const int64_t sz[2] = {3, 4}, sz2[2] = {3, 5};
   lm_tensor *x = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *y = NULL, *ly = NULL;
   OK(lm_softmax(x, 1, &y));
   keep(y);
   OK(lm_log_softmax(x, 1, &ly));
   keep(ly);
   lm_tensor *sx = to_dev(x, LM_SIM0), *sy = to_dev(y, LM_SIM0), *sly = to_dev(ly, LM_SIM0);
   lm_tensor *my = to_dev(y, LM_META), *s1y = to_dev(y, LM_SIM0 + 1);
   lm_tensor *gx = NULL;
   /* the backward's two tensors on different devices */
   expect_device_error(lm_softmax_backward(x, sy, 1, &gx), "softmax_backward cpu grad, sim y");
   check(strstr(lm_last_error(), "cpu") && strstr(lm_last_error(), "sim:0") &&
            strstr(lm_last_error(), "softmax_backward"),
         "the message names both devices and the op: '%s'", lm_last_error());
   expect_device_error(lm_softmax_backward(sx, y, 1, &gx), "softmax_backward sim grad, cpu y");
   expect_device_error(lm_log_softmax_backward(x, sly, 1, &gx),
                       "log_softmax_backward cpu grad, sim y");
   check(strstr(lm_last_error(), "log_softmax_backward") != NULL, "names the op: '%s'",
         lm_last_error());
   expect_device_error(lm_log_softmax_backward(sx, ly, 1, &gx),
                       "log_softmax_backward sim grad, cpu y");
   expect_device_error(lm_softmax_backward(x, my, 1, &gx), "softmax_backward cpu grad, meta y");
   expect_device_error(lm_softmax_backward(sx, s1y, 1, &gx), "softmax_backward sim:0 and sim:1");
   check(gx == NULL, "no grad_input after a device error");
   /* an out= tensor on another device than the input */
   lm_tensor *so = to_dev(y, LM_SIM0), *co = cpu_like(y), *mo = to_dev(y, LM_META);
   lm_tensor *o = so;
   expect_status(lm_softmax(x, 1, &o), LM_ERR_DEVICE, "out tensor is on sim:0",
                 "softmax cpu input, sim out=");
   o = co;
   expect_status(lm_log_softmax(sx, 1, &o), LM_ERR_DEVICE, "out tensor is on cpu",
                 "log_softmax sim input, cpu out=");
   o = mo;
   expect_status(lm_softmax(sx, 1, &o), LM_ERR_DEVICE, "out tensor is on meta",
                 "softmax sim input, meta out=");
   o = so;
   expect_status(lm_softmax_backward(x, y, 1, &o), LM_ERR_DEVICE, "out tensor is on sim:0",
                 "softmax_backward cpu inputs, sim out=");
   o = co;
   expect_status(lm_log_softmax_backward(sx, sly, 1, &o), LM_ERR_DEVICE, "out tensor is on cpu",
                 "log_softmax_backward sim inputs, cpu out=");
   /* the front end's argument errors are the same on every device */
   const int devs[3] = {LM_CPU, LM_SIM0, LM_META};
   for (int k = 0; k < 3; k++) {
      const int dev = devs[k];
      lm_tensor *dx = dev == LM_CPU ? x : to_dev(x, dev);
      lm_tensor *dy = dev == LM_CPU ? y : to_dev(y, dev);
      lm_tensor *r = NULL;
      expect_status(lm_softmax(dx, 2, &r), LM_ERR_ARG, "dimension out of range", "dim 2");
      expect_status(lm_log_softmax(dx, -3, &r), LM_ERR_ARG, "dimension out of range", "dim -3");
      expect_status(lm_softmax_backward(dx, dy, 5, &r), LM_ERR_ARG, "dimension out of range",
                    "backward dim 5");
      check(r == NULL, "no result after an error");
      lm_tensor *xi = NULL, *xd = NULL, *wrong = NULL;
      OK(lm_empty(2, sz, LM_INT64, LM_CONTIGUOUS, dev, &xi));
      keep(xi);
      expect_status(lm_softmax(xi, 1, &r), LM_ERR_DTYPE, "floating tensor", "int64 input");
      OK(lm_empty(2, sz, LM_FLOAT64, LM_CONTIGUOUS, dev, &xd));
      keep(xd);
      expect_status(lm_softmax_backward(xd, dy, 1, &r), LM_ERR_DTYPE, "dtype", "dtype mismatch");
      OK(lm_empty(2, sz2, LM_FLOAT32, LM_CONTIGUOUS, dev, &wrong));
      keep(wrong);
      expect_status(lm_log_softmax_backward(wrong, dy, 1, &r), LM_ERR_SHAPE, "does not match",
                    "shape mismatch");
      lm_tensor *wo = wrong;
      expect_status(lm_softmax(dx, 1, &wo), LM_ERR_SHAPE, "out tensor of shape", "out= shape");
      expect_status(lm_softmax(dx, 1, NULL), LM_ERR_ARG, "out is NULL", "out NULL");
      check(r == NULL, "no result after an error");
   }
   free_kept();
}

/* ======================================================================================== */
/* pooling, 2-D and 3-D                                                                     */
/* ======================================================================================== */

static const int POOL_DTS[4] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16};

/* a grad_output of out's shape: channels-last when the input is, else strided or contiguous */
static lm_tensor *cpu_grad(const shape *sh, const lm_tensor *out, int alt) {
   const int lay = sh->layout == L_CL ? L_CL : alt ? L_STRIDED : L_CONTIG;
   return cpu_rand(out->ndim, out->sizes, out->dtype, lay, -1, 1);
}

/* geometry: 2-D uses the first two of each */
typedef struct {
   int64_t k[3], s[3], p[3], d[3];
   int ceil, cip;
   int64_t div; /* avg: 0 = no divisor_override */
} geo;

/* max_pool2d with and without indices, through tap numbers; the three backwards */
static lm_status f_max2d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const geo *q = arg;
   lm_tensor *x = in[0], *g = in[1];
   TRY(lm_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil, &out[0], &out[1]));
   TRY(lm_max_pool2d_taps(x, q->k, q->s, q->p, q->d, q->ceil, &out[2], &out[3]));
   TRY(lm_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil, &out[4], NULL));
   TRY(lm_max_pool2d_backward(g, x, out[1], &out[5]));
   TRY(lm_max_pool2d_backward_geom(g, x, out[1], q->k, q->s, q->p, q->d, q->ceil, &out[6]));
   return lm_max_pool2d_taps_backward(g, x, out[3], q->k, q->s, q->p, q->d, q->ceil, &out[7]);
}
static lm_status f_max3d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const geo *q = arg;
   lm_tensor *x = in[0], *g = in[1];
   TRY(lm_max_pool3d(x, q->k, q->s, q->p, q->d, q->ceil, &out[0], &out[1]));
   TRY(lm_max_pool3d(x, q->k, q->s, q->p, q->d, q->ceil, &out[2], NULL));
   TRY(lm_max_pool3d_backward(g, x, out[1], &out[3]));
   return lm_max_pool3d_backward_geom(g, x, out[1], q->k, q->s, q->p, q->d, q->ceil, &out[4]);
}
static lm_status f_avg2d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const geo *q = arg;
   const int64_t *dv = q->div ? &q->div : NULL;
   TRY(lm_avg_pool2d(in[0], q->k, q->s, q->p, q->ceil, q->cip, dv, &out[0]));
   return lm_avg_pool2d_backward(in[1], in[0], q->k, q->s, q->p, q->ceil, q->cip, dv, &out[1]);
}
static lm_status f_avg3d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const geo *q = arg;
   const int64_t *dv = q->div ? &q->div : NULL;
   TRY(lm_avg_pool3d(in[0], q->k, q->s, q->p, q->ceil, q->cip, dv, &out[0]));
   return lm_avg_pool3d_backward(in[1], in[0], q->k, q->s, q->p, q->ceil, q->cip, dv, &out[1]);
}
static lm_status f_adaptive2d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const int64_t *osz = arg;
   TRY(lm_adaptive_avg_pool2d(in[0], osz, &out[0]));
   TRY(lm_adaptive_max_pool2d(in[0], osz, &out[1], &out[2]));
   TRY(lm_adaptive_avg_pool2d_backward(in[1], in[0], &out[3]));
   return lm_adaptive_max_pool2d_backward(in[2], in[0], out[2], &out[4]);
}
static lm_status f_adaptive3d(lm_tensor **in, lm_tensor **out, const void *arg) {
   const int64_t *osz = arg;
   TRY(lm_adaptive_avg_pool3d(in[0], osz, &out[0]));
   TRY(lm_adaptive_max_pool3d(in[0], osz, &out[1], &out[2]));
   TRY(lm_adaptive_avg_pool3d_backward(in[1], in[0], &out[3]));
   return lm_adaptive_max_pool3d_backward(in[2], in[0], out[2], &out[4]);
}

static void max_case(const shape *sh, int dt, const geo *q, int three) {
   g_tol = TOL_EW;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *o = NULL;
   OK(three ? lm_max_pool3d(x, q->k, q->s, q->p, q->d, q->ceil, &o, NULL)
            : lm_max_pool2d(x, q->k, q->s, q->p, q->d, q->ceil, &o, NULL));
   keep(o);
   lm_tensor *in[2] = {x, cpu_grad(sh, o, 1)};
   if (three) {
      if (run_case("output,indices,output (no indices),grad_input,grad_input (geometry)", 2, in, 5,
                   f_max3d, q)) {
         same_values(g_ref[2], g_ref[0], "max_pool3d without indices = with (cpu)");
         same_values(g_ref[4], g_ref[3], "max_pool3d_backward_geom = max_pool3d_backward (cpu)");
      }
   } else if (run_case("output,indices,output (taps),taps,output (no indices),grad_input,"
                       "grad_input (geometry),grad_input (taps)",
                       2, in, 8, f_max2d, q)) {
      same_values(g_ref[4], g_ref[0], "max_pool2d without indices = with (cpu)");
      same_values(g_ref[2], g_ref[0], "max_pool2d_taps output = max_pool2d's (cpu)");
      same_values(g_ref[6], g_ref[5], "max_pool2d_backward_geom = max_pool2d_backward (cpu)");
      same_values(g_ref[7], g_ref[5], "max_pool2d_taps_backward = max_pool2d_backward (cpu)");
   }
}

static void avg_case(const shape *sh, int dt, const geo *q, int three) {
   g_tol = TOL_EW;
   const int64_t *dv = q->div ? &q->div : NULL;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *o = NULL;
   OK(three ? lm_avg_pool3d(x, q->k, q->s, q->p, q->ceil, q->cip, dv, &o)
            : lm_avg_pool2d(x, q->k, q->s, q->p, q->ceil, q->cip, dv, &o));
   keep(o);
   lm_tensor *in[2] = {x, cpu_grad(sh, o, 0)};
   run_case("output,grad_input", 2, in, 2, three ? f_avg3d : f_avg2d, q);
}

static void adaptive_case(const shape *sh, int dt, const int64_t *osz, int three) {
   g_tol = TOL_EW;
   lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, -2, 2);
   lm_tensor *ao = NULL, *mo = NULL;
   OK(three ? lm_adaptive_avg_pool3d(x, osz, &ao) : lm_adaptive_avg_pool2d(x, osz, &ao));
   keep(ao);
   OK(three ? lm_adaptive_max_pool3d(x, osz, &mo, NULL) : lm_adaptive_max_pool2d(x, osz, &mo, NULL));
   keep(mo);
   lm_tensor *in[3] = {x, cpu_grad(sh, ao, 1), cpu_grad(sh, mo, 0)};
   run_case("avg output,max output,max indices,avg grad_input,max grad_input", 3, in, 5,
            three ? f_adaptive3d : f_adaptive2d, osz);
}

static const shape POOL2D_SHAPES[] = {
   {4, {2, 5, 9, 11}, L_CONTIG}, {4, {2, 5, 9, 11}, L_CL},  {4, {2, 5, 9, 11}, L_STRIDED},
   {4, {3, 32, 8, 7}, L_CL},     {4, {1, 17, 6, 6}, L_CL},  {3, {5, 9, 11}, L_CONTIG},
   {3, {5, 9, 11}, L_STRIDED},   {4, {0, 4, 5, 5}, L_CONTIG},
};
static const geo MAX2D[] = {
   {{3, 3}, {2, 2}, {1, 1}, {1, 1}, 0, 0, 0},
   {{2, 3}, {1, 2}, {1, 0}, {2, 1}, 1, 0, 0},
   {{3, 3}, {3, 3}, {0, 0}, {1, 1}, 1, 0, 0},
   {{2, 2}, {2, 2}, {1, 1}, {3, 3}, 0, 0, 0},
};
static const geo AVG2D[] = {
   {{3, 3}, {2, 2}, {1, 1}, {1, 1}, 0, 1, 0},
   {{2, 3}, {1, 2}, {1, 1}, {1, 1}, 1, 0, 0},
   {{3, 2}, {2, 3}, {1, 0}, {1, 1}, 1, 1, 5},
};
static const int64_t ADA2D[][2] = {{4, 5}, {1, 1}, {12, 13}, {3, 1}};

static const shape POOL3D_SHAPES[] = {
   {5, {2, 5, 5, 7, 6}, L_CONTIG}, {5, {2, 5, 5, 7, 6}, L_CL}, {5, {2, 5, 5, 7, 6}, L_STRIDED},
   {5, {1, 33, 4, 5, 5}, L_CL},    {5, {1, 1, 1, 4, 3}, L_CL}, {4, {5, 4, 6, 7}, L_CONTIG},
   {4, {5, 4, 6, 7}, L_STRIDED},   {5, {0, 4, 3, 5, 5}, L_CONTIG},
};
static const geo MAX3D[] = {
   {{3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, 0, 0, 0},
   {{2, 2, 3}, {1, 1, 2}, {1, 1, 0}, {2, 2, 1}, 1, 0, 0},
   {{1, 3, 3}, {1, 3, 3}, {0, 0, 0}, {1, 1, 1}, 1, 0, 0},
};
static const geo AVG3D[] = {
   {{3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, 0, 1, 0},
   {{2, 2, 3}, {1, 1, 2}, {1, 1, 1}, {1, 1, 1}, 1, 0, 0},
   {{1, 3, 2}, {1, 2, 3}, {0, 1, 0}, {1, 1, 1}, 1, 1, 5},
};
static const int64_t ADA3D[][3] = {{2, 4, 5}, {1, 1, 1}, {6, 9, 8}, {3, 1, 2}};

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* which: 0 max, 1 avg, 2 adaptive */
static void pool_family(int three, int which) {
   const shape *shapes = three ? POOL3D_SHAPES : POOL2D_SHAPES;
   const int ns = three ? NELEM(POOL3D_SHAPES) : NELEM(POOL2D_SHAPES);
   const geo *mg = three ? MAX3D : MAX2D, *ag = three ? AVG3D : AVG2D;
   const int nmg = three ? NELEM(MAX3D) : NELEM(MAX2D), nag = three ? NELEM(AVG3D) : NELEM(AVG2D);
   const int nad = three ? NELEM(ADA3D) : NELEM(ADA2D);
   for (int s = 0; s < ns; s++)
      for (int dti = 0; dti < 4; dti++) {
         /* the halves: computed on float32 copies, rounded once; the same on every device */
         const int dt = POOL_DTS[dti];
         const shape *sh = &shapes[s];
         const char *dn = lm_dtype_name(dt), *ln = LAYOUT_NAME[sh->layout];
         if (which == 0)
            for (int i = 0; i < nmg; i++) {
               /* the 1x1x4x3 input is too small for 3-deep windows without padding */
               if (three && sh->sz[2] == 1 && mg[i].k[0] > 1 && mg[i].p[0] == 0) continue;
               CASE("max_pool%dd %dD %s %s geometry %d isa %s", three ? 3 : 2, sh->nd, ln, dn, i,
                    isa_name());
               max_case(sh, dt, &mg[i], three);
               free_kept();
            }
         if (which == 1)
            for (int i = 0; i < nag; i++) {
               if (three && sh->sz[2] == 1 && ag[i].k[0] > 1 && ag[i].p[0] == 0) continue;
               CASE("avg_pool%dd %dD %s %s geometry %d isa %s", three ? 3 : 2, sh->nd, ln, dn, i,
                    isa_name());
               avg_case(sh, dt, &ag[i], three);
               free_kept();
            }
         if (which == 2)
            for (int i = 0; i < nad; i++) {
               const int64_t *osz = three ? ADA3D[i] : ADA2D[i];
               CASE("adaptive pool%dd %dD %s %s out %lldx%lldx%lld isa %s", three ? 3 : 2, sh->nd,
                    ln, dn, (long long)osz[0], (long long)osz[1], three ? (long long)osz[2] : 1LL,
                    isa_name());
               adaptive_case(sh, dt, osz, three);
               free_kept();
            }
      }
   /* a grad_input of 1 MiB (float32, channels-last, 16 | C): the AVX-512 gathers may stream */
   if (!three && which < 2) {
      const shape big = {4, {2, 32, 64, 64}, L_CL};
      CASE("%s big channels-last isa %s", which ? "avg_pool2d" : "max_pool2d", isa_name());
      if (which == 0) max_case(&big, LM_FLOAT32, &MAX2D[0], 0);
      else avg_case(&big, LM_FLOAT32, &AVG2D[0], 0);
      free_kept();
   }
}

static void cases_max_pool2d(void) { pool_family(0, 0); }
static void cases_avg_pool2d(void) { pool_family(0, 1); }
static void cases_adaptive_pool2d(void) { pool_family(0, 2); }
static void cases_max_pool3d(void) { pool_family(1, 0); }
static void cases_avg_pool3d(void) { pool_family(1, 1); }
static void cases_adaptive_pool3d(void) { pool_family(1, 2); }

/* mixed devices, out= tensors, values out of range, argument errors */
static void rules_pool2d(void) {
   CASE("pool2d device rules");
   const int64_t sz[4] = {2, 3, 6, 6}, k[2] = {2, 2}, os[2] = {3, 3};
   lm_tensor *x = cpu_rand(4, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *mx = to_dev(x, LM_META);
   lm_tensor *out = NULL, *ind = NULL, *taps = NULL, *outt = NULL;
   OK(lm_max_pool2d(x, k, NULL, NULL, NULL, 0, &out, &ind));
   keep(out), keep(ind);
   OK(lm_max_pool2d_taps(x, k, NULL, NULL, NULL, 0, &outt, &taps));
   keep(outt), keep(taps);
   lm_tensor *g = cpu_rand(4, out->sizes, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sg = to_dev(g, LM_SIM0), *sind = to_dev(ind, LM_SIM0), *staps = to_dev(taps, LM_SIM0);
   lm_tensor *gx = NULL;
   expect_device_error(lm_max_pool2d_backward(sg, x, ind, &gx), "grad_output on sim:0");
   expect_device_error(lm_max_pool2d_backward(g, x, sind, &gx), "indices on sim:0");
   expect_device_error(lm_max_pool2d_backward(sg, sx, ind, &gx), "indices on the cpu");
   expect_device_error(lm_adaptive_max_pool2d_backward(g, sx, ind, &gx), "input on sim:0");
   expect_device_error(lm_max_pool2d_backward_geom(g, x, sind, k, NULL, NULL, NULL, 0, &gx),
                       "geom: indices on sim:0");
   expect_device_error(lm_max_pool2d_taps_backward(sg, x, taps, k, NULL, NULL, NULL, 0, &gx),
                       "taps_backward: grad_output on sim:0");
   expect_device_error(lm_max_pool2d_taps_backward(g, x, staps, k, NULL, NULL, NULL, 0, &gx),
                       "taps_backward: taps on sim:0");
   expect_device_error(lm_avg_pool2d_backward(sg, x, k, NULL, NULL, 0, 1, NULL, &gx),
                       "avg: grad_output on sim:0");
   lm_tensor *ao = NULL;
   OK(lm_adaptive_avg_pool2d(x, os, &ao));
   keep(ao);
   lm_tensor *sao = to_dev(ao, LM_SIM0);
   expect_device_error(lm_adaptive_avg_pool2d_backward(sao, x, &gx), "adaptive avg: grad on sim");
   expect_device_error(lm_adaptive_avg_pool2d_backward(ao, mx, &gx), "adaptive avg: x on meta");
   check(gx == NULL, "no grad_input after a device error");
   /* an out= tensor on another device than the input */
   lm_tensor *o1 = out, *i1 = NULL;
   lm_status st = lm_max_pool2d(sx, k, NULL, NULL, NULL, 0, &o1, &i1);
   check(st == LM_ERR_DEVICE && i1 == NULL, "cpu out= for a sim:0 input: %d %s", (int)st,
         lm_last_error());
   lm_tensor *si1 = sind;
   o1 = NULL;
   st = lm_max_pool2d(x, k, NULL, NULL, NULL, 0, &o1, &si1);
   check(st == LM_ERR_DEVICE && o1 == NULL, "sim:0 indices out= for a cpu input: %d %s", (int)st,
         lm_last_error());
   /* out= on sim:0, in another layout (a temporary, then a copy within the device) */
   lm_tensor *xc = cpu_rand(4, sz, LM_FLOAT64, L_CL, -1, 1);
   lm_tensor *sxc = to_dev(xc, LM_SIM0);
   lm_tensor *oc = NULL, *soc = NULL;
   const int64_t osz[4] = {2, 3, 3, 3};
   OK(lm_empty(4, osz, LM_FLOAT64, LM_CONTIGUOUS, LM_CPU, &oc));
   keep(oc);
   OK(lm_avg_pool2d(xc, k, NULL, NULL, 0, 1, NULL, &oc));
   OK(lm_empty(4, osz, LM_FLOAT64, LM_CONTIGUOUS, LM_SIM0, &soc));
   keep(soc);
   lm_tensor *soc_in = soc;
   OK(lm_avg_pool2d(sxc, k, NULL, NULL, 0, 1, NULL, &soc));
   check(soc == soc_in, "out= on sim:0 kept");
   same("avg_pool2d into an out= tensor on sim:0", oc, soc, D_SIM);
   /* values out of range: the kernels' errors, on sim:0 as on the CPU; meta does not look */
   lm_tensor *bad = NULL;
   OK(lm_empty(4, ind->sizes, LM_INT64, LM_CONTIGUOUS, LM_CPU, &bad));
   keep(bad);
   OK(lm_fill_(bad, 1000));
   lm_tensor *sbad = to_dev(bad, LM_SIM0), *mbad = to_dev(bad, LM_META);
   lm_tensor *mg = to_dev(g, LM_META);
   st = lm_max_pool2d_backward(g, x, bad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "cpu bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool2d_backward(sg, sx, sbad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "sim bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool2d_backward_geom(sg, sx, sbad, k, NULL, NULL, NULL, 0, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "sim bad index (geom): %d %s", (int)st, lm_last_error());
   st = lm_max_pool2d_backward(mg, mx, mbad, &gx);
   check(st == LM_OK && gx && gx->device == LM_META, "meta: values are not looked at: %d", (int)st);
   keep(gx);
   gx = NULL;
   lm_tensor *btaps = NULL;
   OK(lm_empty(4, taps->sizes, LM_UINT8, LM_CONTIGUOUS, LM_CPU, &btaps));
   keep(btaps);
   OK(lm_fill_(btaps, 7));
   lm_tensor *sbtaps = to_dev(btaps, LM_SIM0);
   st = lm_max_pool2d_taps_backward(sg, sx, sbtaps, k, NULL, NULL, NULL, 0, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "sim bad taps: %d %s", (int)st, lm_last_error());
   /* argument errors are the front end's, the same on every device */
   const int64_t k0[2] = {0, 2};
   lm_tensor *o3 = NULL;
   st = lm_max_pool2d(mx, k0, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "kernel size should be greater than zero"),
         "meta: bad kernel: %d %s", (int)st, lm_last_error());
   const int64_t dz = 0;
   st = lm_avg_pool2d(sx, k, NULL, NULL, 0, 1, &dz, &o3);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "divisor must be not zero"),
         "sim: divisor 0: %d %s", (int)st, lm_last_error());
   free_kept();
}

static void rules_pool3d(void) {
   CASE("pool3d device rules");
   const int64_t sz[5] = {2, 3, 4, 6, 6}, k[3] = {2, 2, 2}, os[3] = {2, 3, 3};
   lm_tensor *x = cpu_rand(5, sz, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sx = to_dev(x, LM_SIM0), *mx = to_dev(x, LM_META);
   lm_tensor *out = NULL, *ind = NULL;
   OK(lm_max_pool3d(x, k, NULL, NULL, NULL, 0, &out, &ind));
   keep(out), keep(ind);
   lm_tensor *g = cpu_rand(5, out->sizes, LM_FLOAT32, L_CONTIG, -1, 1);
   lm_tensor *sg = to_dev(g, LM_SIM0), *sind = to_dev(ind, LM_SIM0);
   lm_tensor *gx = NULL;
   expect_device_error(lm_max_pool3d_backward(sg, x, ind, &gx), "grad_output on sim:0");
   expect_device_error(lm_max_pool3d_backward(g, x, sind, &gx), "indices on sim:0");
   expect_device_error(lm_adaptive_max_pool3d_backward(g, sx, ind, &gx), "input on sim:0");
   expect_device_error(lm_avg_pool3d_backward(sg, x, k, NULL, NULL, 0, 1, NULL, &gx),
                       "avg: grad_output on sim:0");
   lm_tensor *ao = NULL;
   OK(lm_adaptive_avg_pool3d(x, os, &ao));
   keep(ao);
   lm_tensor *sao = to_dev(ao, LM_SIM0);
   expect_device_error(lm_adaptive_avg_pool3d_backward(sao, x, &gx), "adaptive avg: grad on sim");
   expect_device_error(lm_adaptive_avg_pool3d_backward(ao, mx, &gx), "adaptive avg: x on meta");
   check(gx == NULL, "no grad_input after a device error");
   lm_tensor *o1 = out, *i1 = NULL;
   lm_status st = lm_max_pool3d(sx, k, NULL, NULL, NULL, 0, &o1, &i1);
   check(st == LM_ERR_DEVICE && i1 == NULL, "cpu out= for a sim:0 input: %d %s", (int)st,
         lm_last_error());
   /* values out of range: the kernels' errors, on sim:0 as on the CPU; meta does not look */
   lm_tensor *bad = NULL;
   OK(lm_empty(5, ind->sizes, LM_INT64, LM_CONTIGUOUS, LM_CPU, &bad));
   keep(bad);
   OK(lm_fill_(bad, 1000));
   lm_tensor *sbad = to_dev(bad, LM_SIM0), *mbad = to_dev(bad, LM_META);
   lm_tensor *mg = to_dev(g, LM_META);
   st = lm_max_pool3d_backward(g, x, bad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "cpu bad index: %d %s",
         (int)st, lm_last_error());
   st = lm_max_pool3d_backward(sg, sx, sbad, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx, "sim bad index: %d %s",
         (int)st, lm_last_error());
   lm_tensor *xcl = cpu_rand(5, sz, LM_FLOAT64, L_CL, -1, 1), *ocl = NULL, *icl = NULL;
   OK(lm_max_pool3d(xcl, k, NULL, NULL, NULL, 0, &ocl, &icl));
   keep(ocl), keep(icl);
   lm_tensor *gcl = cpu_rand(5, ocl->sizes, LM_FLOAT64, L_CL, -1, 1);
   OK(lm_fill_(icl, -5));
   st = lm_max_pool3d_backward(gcl, xcl, icl, &gx);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of range") && !gx,
         "cpu bad index (channels_last_3d): %d %s", (int)st, lm_last_error());
   st = lm_max_pool3d_backward(mg, mx, mbad, &gx);
   check(st == LM_OK && gx && gx->device == LM_META, "meta: values are not looked at: %d", (int)st);
   keep(gx);
   gx = NULL;
   /* argument errors are the front end's, the same on every device */
   const int64_t k0[3] = {2, 0, 2};
   lm_tensor *o3 = NULL;
   st = lm_max_pool3d(mx, k0, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "kernel size should be greater than zero"),
         "meta: bad kernel: %d %s", (int)st, lm_last_error());
   const int64_t dz = 0;
   st = lm_avg_pool3d(sx, k, NULL, NULL, 0, 1, &dz, &o3);
   check(st == LM_ERR_ARG && strstr(lm_last_error(), "divisor must be not zero"),
         "sim: divisor 0: %d %s", (int)st, lm_last_error());
   const int64_t k5[3] = {5, 2, 2};
   st = lm_max_pool3d(mx, k5, NULL, NULL, NULL, 0, &o3, NULL);
   check(st == LM_ERR_SHAPE && strstr(lm_last_error(), "Output size is too small"),
         "meta: too small: %d %s", (int)st, lm_last_error());
   free_kept();
}

/* ======================================================================================== */
/* indexing: sort, gather, scatter_add_, cumsum                                              */
/* ======================================================================================== */

typedef struct {
   int dim, desc;
   int64_t base;
} ix_arg;

/* sort (both orders), cumsum (both directions), gather and scatter_add_ along one dim; in[0] x,
   in[1] an index for x's dim, in[2] the scatter target, in[3] the scatter source */
static lm_status f_indexing(lm_tensor **in, lm_tensor **out, const void *arg) {
   const ix_arg *a = arg;
   TRY(lm_sort(in[0], a->dim, a->desc, a->base, &out[0], &out[1]));
   TRY(lm_cumsum(in[0], a->dim, a->desc, -1, &out[2]));
   TRY(lm_gather(in[0], a->dim, in[1], a->base, &out[3]));
   TRY(lm_scatter_add_(in[2], a->dim, in[1], in[3], a->base));
   out[4] = in[2];
   /* cumsum into an out= tensor: dense in any layout (written in place) or not (a copy) */
   out[5] = in[4];
   TRY(lm_cumsum(in[0], a->dim, !a->desc, -1, &out[5]));
   check(out[5] == in[4], "cumsum out=: the result is the out tensor");
   return LM_OK;
}

static void cases_indexing(void) {
   static const shape shapes[] = {
      {0, {0}, L_CONTIG},          {1, {7}, L_CONTIG},             {1, {40}, L_STRIDED},
      {2, {5, 9}, L_CONTIG},       {2, {5, 9}, L_TRANS},           {2, {3, 37}, L_NARROW},
      {3, {3, 4, 6}, L_STRIDED},   {4, {2, 3, 4, 5}, L_CL},        {4, {2, 3, 4, 5}, L_CONTIG},
      {5, {2, 3, 2, 3, 4}, L_CL},  {2, {0, 5}, L_CONTIG},          {2, {4, 70}, L_CONTIG},
   };
   static const int dts[7] = {LM_FLOAT32, LM_FLOAT64, LM_BFLOAT16, LM_FLOAT16,
                              LM_INT64,   LM_INT32,   LM_UINT8};
   g_tol = TOL_EW;
   const int ns = (int)(sizeof shapes / sizeof shapes[0]);
   for (int s = 0; s < ns; s++) {
      const shape *sh = &shapes[s];
      const int n = sh->nd > 0 ? sh->nd : 1;
      for (int dti = 0; dti < 7; dti++)
         for (int dim = -n; dim < n; dim++) {
            const int desc = (s + dti + dim) & 1, d = dim < 0 ? dim + n : dim;
            const int64_t base = (s + dim) & 1;
            const int dt = dts[dti];
            CASE("indexing %dD [%lld,...] %s %s dim %d %s base %lld isa %s", sh->nd,
                 (long long)sh->sz[0], LAYOUT_NAME[sh->layout], lm_dtype_name(dt), dim,
                 desc ? "descending / reverse" : "ascending", (long long)base, isa_name());
            /* small integers: the floating dtypes get ties, which the stable order settles */
            lm_tensor *x = cpu_rand(sh->nd, sh->sz, dt, sh->layout, dt == LM_UINT8 ? 0 : -4, 5);
            if (is_float(dt) && (dti & 1)) {
               lm_tensor *r = NULL;
               OK(lm_unary(LM_FLOOR, x, &r));
               OK(lm_copy_(x, keep(r)));
            }
            /* the index: x's sizes, one more along dim, one fewer elsewhere (not below 1) */
            int64_t isz[5];
            for (int i = 0; i < sh->nd; i++)
               isz[i] = i == d ? sh->sz[i] + 1 : sh->sz[i] > 1 ? sh->sz[i] - 1 : sh->sz[i];
            const int64_t lim = sh->nd == 0 ? 1 : sh->sz[d];
            lm_tensor *ix = cpu_rand(sh->nd, isz, LM_INT64, (s & 1) ? L_STRIDED : sh->layout,
                                     (double)base, (double)(base + lim));
            /* the scatter target: x's layout; the source: the index's sizes plus one */
            int64_t ssz[5];
            for (int i = 0; i < sh->nd; i++) ssz[i] = isz[i] + (i == 0);
            lm_tensor *in[5] = {x, ix, cpu_rand(sh->nd, sh->sz, dt, sh->layout, 0, 3),
                                cpu_rand(sh->nd, ssz, dt, L_STRIDED, 0, 3),
                                cpu_rand(sh->nd, sh->sz, is_float(dt) ? dt : LM_INT64,
                                         (s + dti) % 3 == 0 ? L_STRIDED : sh->layout, 0, 1)};
            if (lim == 0 && ix->numel > 0) {
               free_kept();
               continue; /* gather from an empty dim: every index is out of range */
            }
            const ix_arg a = {dim, desc, base};
            run_case("values,indices,cumsum,gather,scatter_add_,cumsum out=", 5, in, 6, f_indexing,
                     &a);
            free_kept();
         }
   }
}

/* device rules: mixed devices; out-of-range index values from every computing device */
static void rules_indexing(void) {
   CASE("indexing device rules");
   const int64_t sz[2] = {4, 3};
   lm_tensor *x = cpu_rand(2, sz, LM_FLOAT32, L_CONTIG, -2, 2);
   lm_tensor *ix = cpu_rand(2, sz, LM_INT64, L_CONTIG, 0, 3);
   lm_tensor *sx = to_dev(x, LM_SIM0), *six = to_dev(ix, LM_SIM0);
   lm_tensor *out = NULL;
   expect_device_error(lm_gather(x, 1, six, 0, &out), "gather: index on sim:0");
   expect_device_error(lm_gather(sx, 1, ix, 0, &out), "gather: input on sim:0");
   lm_tensor *t = to_dev(x, LM_CPU);
   expect_device_error(lm_scatter_add_(t, 1, six, x, 0), "scatter_add_: index on sim:0");
   expect_device_error(lm_scatter_add_(t, 1, ix, sx, 0), "scatter_add_: src on sim:0");
   check(out == NULL, "no output after a device error");
   double bad[12] = {0, 1, 2, 2, 1, 0, 0, 3, 1, 2, 2, 2};
   lm_tensor *ib = NULL;
   OK(lm_empty(2, sz, LM_INT64, LM_CONTIGUOUS, LM_CPU, &ib));
   keep(ib);
   OK(lm_from_doubles(ib, bad));
   static const int devs[3] = {LM_CPU, LM_SIM0, LM_CUDA0};
   static const char *const dnames[3] = {"cpu", "sim:0", "cuda:0"};
   for (int dv = 0; dv < 3; dv++) {
      if (dv == 2 && (!g_has_cuda || g_no_cuda)) continue;
      const int dev = devs[dv];
      lm_tensor *dx = to_dev(x, dev), *dib = to_dev(ib, dev), *o = NULL;
      lm_status st = lm_gather(dx, 1, dib, 0, &o);
      check(st == LM_ERR_ARG && strstr(lm_last_error(), "index 3 is out of bounds for dimension 1") &&
               !o,
            "%s gather bad index: %d %s", dnames[dv], (int)st, lm_last_error());
      st = lm_gather(dx, 1, dib, 1, &o);
      check(st == LM_ERR_ARG && strstr(lm_last_error(), "index 0 is out of bounds for dimension 2") &&
               !o,
            "%s gather bad 1-based index: %d %s", dnames[dv], (int)st, lm_last_error());
      lm_tensor *dt = to_dev(x, dev);
      st = lm_scatter_add_(dt, 1, dib, dx, 0);
      check(st == LM_ERR_ARG && strstr(lm_last_error(), "out of bounds"), "%s scatter bad index",
            dnames[dv]);
   }
   lm_tensor *mx = to_dev(x, LM_META), *mib = to_dev(ib, LM_META), *mo = NULL;
   check(lm_gather(mx, 1, mib, 0, &mo) == LM_OK, "meta: values are not looked at");
   keep(mo);
   free_kept();
}

/* ======================================================================================== */
/* the table                                                                                */
/* ======================================================================================== */

typedef struct {
   const char *family;
   void (*build)(void);  /* the cases (g_role: which level is running) */
   void (*rules)(void);  /* the device rules, once (or NULL) */
   int isas;             /* I_* passes it runs in */
   int nk;
   int kinds[8];         /* the LM_OP kinds its cases dispatch */
} op_entry;

#define KINDS(...) .nk = (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), .kinds = {__VA_ARGS__}

/* Every LM_OP kind is in one entry's kinds (main() fails otherwise). A new kind: add it to its
   family's entry and a case to the family's builder, or a new entry with a builder (and its device
   rules) above; docs/writing_operators.md, section 10, "Every device: the parity test". */
static const op_entry OPS[] = {
   {"unary, clamp", cases_unary, NULL, I_BEST | I_C, KINDS(LM_OP_UNARY, LM_OP_CLAMP)},
   {"binary", cases_binary, rules_elementwise, I_BEST | I_C, KINDS(LM_OP_BINARY)},
   {"binary_scalar", cases_binary_scalar, NULL, I_BEST | I_C, KINDS(LM_OP_BINARY_SCALAR)},
   {"fused and ternary", cases_fused_ternary, NULL, I_BEST | I_C,
    KINDS(LM_OP_BINARY_UNARY, LM_OP_BINARY_SCALAR_UNARY, LM_OP_ADDCMUL, LM_OP_ADDCDIV, LM_OP_WHERE)},
   {"copy_, fill_", cases_copy_fill, NULL, I_BEST | I_C, KINDS(LM_OP_COPY, LM_OP_FILL)},
   {"reduce", cases_reduce, NULL, I_BEST | I_C, KINDS(LM_OP_REDUCE)},
   {"cat", cases_cat, NULL, I_BEST | I_C, KINDS(LM_OP_CAT)},
   {"random fills", cases_random, NULL, I_BEST | I_C,
    KINDS(LM_OP_UNIFORM, LM_OP_NORMAL, LM_OP_RANDINT, LM_OP_BERNOULLI, LM_OP_RANDPERM)},
   {"matmul, linear", cases_matmul, NULL, I_ALL, KINDS(LM_OP_MATMUL, LM_OP_LINEAR)},
   {"conv2d", cases_conv, rules_conv, I_ALL,
    KINDS(LM_OP_CONV2D, LM_OP_CONV2D_BACKWARD, LM_OP_CONV3D)},
   {"max_pool2d", cases_max_pool2d, rules_pool2d, I_BEST | I_C,
    KINDS(LM_OP_MAX_POOL2D, LM_OP_MAX_POOL2D_BACKWARD, LM_OP_MAX_POOL2D_TAPS,
          LM_OP_MAX_POOL2D_TAPS_BACKWARD)},
   {"avg_pool2d", cases_avg_pool2d, NULL, I_BEST | I_C,
    KINDS(LM_OP_AVG_POOL2D, LM_OP_AVG_POOL2D_BACKWARD)},
   {"adaptive pool2d", cases_adaptive_pool2d, NULL, I_BEST | I_C,
    KINDS(LM_OP_ADAPTIVE_AVG_POOL2D, LM_OP_ADAPTIVE_AVG_POOL2D_BACKWARD, LM_OP_ADAPTIVE_MAX_POOL2D,
          LM_OP_ADAPTIVE_MAX_POOL2D_BACKWARD)},
   {"max_pool3d", cases_max_pool3d, rules_pool3d, I_BEST | I_C,
    KINDS(LM_OP_MAX_POOL3D, LM_OP_MAX_POOL3D_BACKWARD)},
   {"avg_pool3d", cases_avg_pool3d, NULL, I_BEST | I_C,
    KINDS(LM_OP_AVG_POOL3D, LM_OP_AVG_POOL3D_BACKWARD)},
   {"adaptive pool3d", cases_adaptive_pool3d, NULL, I_BEST | I_C,
    KINDS(LM_OP_ADAPTIVE_AVG_POOL3D, LM_OP_ADAPTIVE_AVG_POOL3D_BACKWARD, LM_OP_ADAPTIVE_MAX_POOL3D,
          LM_OP_ADAPTIVE_MAX_POOL3D_BACKWARD)},
   {"batch_norm", cases_batch_norm, rules_batch_norm, I_BEST | I_C,
    KINDS(LM_OP_BATCH_NORM, LM_OP_BATCH_NORM_BACKWARD)},
   {"group_norm", cases_group_norm, NULL, I_BEST | I_C,
    KINDS(LM_OP_GROUP_NORM, LM_OP_GROUP_NORM_BACKWARD)},
   {"softmax", cases_softmax, rules_softmax, I_BEST | I_C,
    KINDS(LM_OP_SOFTMAX, LM_OP_SOFTMAX_BACKWARD)},
   {"resample", cases_resample, rules_resample, I_BEST | I_C, KINDS(LM_OP_RESAMPLE)},
   {"nll_loss", cases_nll_loss, rules_nll_loss, I_BEST | I_C,
    KINDS(LM_OP_NLL_LOSS, LM_OP_NLL_LOSS_BACKWARD)},
   {"optimizer steps", cases_optim, NULL, I_BEST | I_C, KINDS(LM_OP_SGD_STEP, LM_OP_ADAM_STEP)},
   {"indexing", cases_indexing, rules_indexing, I_BEST | I_C,
    KINDS(LM_OP_SORT, LM_OP_GATHER, LM_OP_SCATTER_ADD, LM_OP_CUMSUM)},
};
enum { NOPS = sizeof OPS / sizeof OPS[0] };

static int entry_of(int kind) {
   for (int e = 0; e < NOPS; e++)
      for (int i = 0; i < OPS[e].nk; i++)
         if (OPS[e].kinds[i] == kind) return e;
   return -1;
}

/* does cuda:0 have a kernel for kind? */
static int cuda_has(int kind) {
   const lm_backend *b = lm_backend_get(LM_CUDA0);
   const lm_op op = lm_op_make(kind, 0, NULL, NULL);
   return b && b->supports_op(b, &op);
}

/* every kind has an entry: before anything runs, so that the message comes first */
static void check_table(void) {
   CASE("the table");
   check((int)NOPS <= (int)MAX_ENTRIES, "OPS[] has %d entries, MAX_ENTRIES is %d", (int)NOPS, (int)MAX_ENTRIES);
   check(lm_op_count() == LM_OP_COUNT, "liblumen.so has %d op kinds, src/backend.h %d: rebuild (make)",
         lm_op_count(), LM_OP_COUNT);
   for (int k = 0; k < LM_OP_COUNT; k++)
      check(entry_of(k) >= 0,
            "%s (\"%s\") has no entry in OPS[] of spec/c/test_backend_ops.c: add it to the kinds of "
            "its family's entry and a case that calls its front end to that entry's builder, or a "
            "new entry {\"family\", cases_<family>, rules_<family> or NULL, I_BEST | I_C, "
            "KINDS(%s, ...)} with a builder that calls run_case (docs/writing_operators.md, "
            "section 10, \"Every device: the parity test\")",
            KIND_ID[k], lm_op_name(k), KIND_ID[k]);
   for (int e = 0; e < NOPS; e++)
      for (int i = 0; i < OPS[e].nk; i++)
         check(OPS[e].kinds[i] >= 0 && OPS[e].kinds[i] < LM_OP_COUNT, "%s: kind %d out of range",
               OPS[e].family, OPS[e].kinds[i]);
}

/* kinds a device runs only where its supports_op takes the call, the front end having another
   route: LM_OP_CONV3D reaches the CPU's kernel only with AMX tiles in use (bfloat16) */
static int kind_reachable_on_cpu(int k) {
   if (k != LM_OP_CONV3D) return 1;
   int amx = 0;
   return g_best == LM_ISA_AMX && lm_cpu_amx_available() &&
          lm_cpu_get_option(LM_CPU_OPT_AMX, &amx) == LM_OK && amx;
}

/* every entry's kinds reached a kernel on every device (meta: a case ran there) */
static void check_coverage(void) {
   CASE("coverage");
   for (int e = 0; e < NOPS; e++) {
      for (int i = 0; i < OPS[e].nk; i++) {
         const int k = OPS[e].kinds[i];
         if (k < 0 || k >= LM_OP_COUNT) continue; /* check_table said so */
         for (int d = D_CPU; d < NDEV; d++) {
            if (d == D_META || (d == D_CUDA && (!g_has_cuda || !cuda_has(k)))) continue;
            if (!kind_reachable_on_cpu(k)) continue; /* nor on sim:0, which runs the CPU's */
            check(g_seen[e][d][k],
                  "%s (\"%s\") never reached a kernel on %s in the cases of OPS[]'s \"%s\" "
                  "entry: it lists the kind in KINDS() but no case calls a front end that "
                  "dispatches it",
                  KIND_ID[k], lm_op_name(k), DEV_NAME[d], OPS[e].family);
         }
      }
      check(g_ran[D_META][e] > 0 && g_ran[D_SIM][e] > 0,
            "OPS[]'s \"%s\" entry ran no case on meta or sim:0", OPS[e].family);
   }
}

int main(void) {
   setvbuf(stdout, NULL, _IOLBF, 0);
   cap_open();
   g_best = lm_cpu_get_isa();
   /* cuda:0: a GPU with liblumen_cuda.so beside liblumen.so, or LUMEN_CUDA_LIB (the emulated
      build) */
   const char *cuda_lib = getenv("LUMEN_CUDA_LIB");
   g_has_cuda = lm_backend_get(LM_CUDA0) != NULL;
   if (cuda_lib && *cuda_lib) {
      CASE("LUMEN_CUDA_LIB");
      check(g_has_cuda, "LUMEN_CUDA_LIB=%s is set but cuda:0 is not available: %s", cuda_lib,
            lm_last_error());
   }
   printf("test_backend_ops: %d op kinds, %d entries; devices cpu (the reference), sim:0, meta%s; "
          "CPU levels from %s\n",
          LM_OP_COUNT, NOPS, g_has_cuda ? ", cuda:0" : " (no cuda:0)", lm_cpu_isa_name(g_best));
   check_table();
   /* the passes: the best level, then each lower one the machine has */
   const int levels[4] = {g_best, LM_ISA_AVX512, LM_ISA_AVX2, LM_ISA_C};
   const int roles[4] = {I_BEST, I_AVX512, I_AVX2, I_C};
   for (int p = 0; p < 4; p++) {
      if (p > 0 && levels[p] >= g_best) continue;
      g_isa = lm_cpu_set_isa(levels[p]);
      if (g_isa != levels[p]) continue;
      g_role = roles[p];
      for (int e = 0; e < NOPS; e++) {
         if (!(OPS[e].isas & g_role)) continue;
         g_entry = e;
         g_cuda_partial = 0;
         for (int i = 0; g_has_cuda && i < OPS[e].nk; i++) g_cuda_partial |= !cuda_has(OPS[e].kinds[i]);
         g_no_cuda = 0;
         const int before = g_fail, cases = g_ncases;
         OPS[e].build();
         printf("  %-20s at %-12s %5d cases  %s\n", OPS[e].family, lm_cpu_isa_name(g_isa),
                g_ncases - cases, g_fail == before ? "ok" : "FAILED");
      }
   }
   g_isa = lm_cpu_set_isa(LM_ISA_AUTO);
   g_role = I_BEST;
   for (int e = 0; e < NOPS; e++)
      if (OPS[e].rules) {
         g_entry = e;
         OPS[e].rules();
      }
   check_coverage();
   fclose(g_cap);
   remove(g_cap_path);
   printf("test_backend_ops: %d cases\n", g_ncases);
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail ? 1 : 0;
}
