/* impl.c -- implementation lists, the switches that turn implementations off by name, and the
 * LUMEN_VERBOSE lines (src/impl.h says what each is for). */
#define _POSIX_C_SOURCE 200809L
#include "impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LM_IMPL_NAME_(id, name, fb, alias, doc) name,
#define LM_IMPL_FB_(id, name, fb, alias, doc) fb,
#define LM_IMPL_ALIAS_(id, name, fb, alias, doc) alias,
#define LM_IMPL_DOC_(id, name, fb, alias, doc) doc,
static const char *const impl_names[LM_NUM_IMPLS] = {LM_CPU_IMPL_LIST(LM_IMPL_NAME_)};
static const int impl_fallback[LM_NUM_IMPLS] = {LM_CPU_IMPL_LIST(LM_IMPL_FB_)};
static const char *const impl_alias[LM_NUM_IMPLS] = {LM_CPU_IMPL_LIST(LM_IMPL_ALIAS_)};
static const char *const impl_docs[LM_NUM_IMPLS] = {LM_CPU_IMPL_LIST(LM_IMPL_DOC_)};

static int impl_off[LM_NUM_IMPLS]; /* lm_cpu_disable / LUMEN_CPU_DISABLE; atomics */
static int verbose_level;          /* atomic */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static int find_name(const char *name, size_t len) {
   for (int i = 0; i < LM_NUM_IMPLS; i++)
      if (strlen(impl_names[i]) == len && memcmp(impl_names[i], name, len) == 0) return i;
   return -1;
}

/* LUMEN_VERBOSE=0/1/2 and LUMEN_CPU_DISABLE=a,b,c (an unknown name: one warning on stderr, as a
   typo in a variable must not pass silently, and not an error: the process is already running) */
static void env_init(void) {
   const char *v = getenv("LUMEN_VERBOSE");
   if (v && *v) {
      const int l = atoi(v);
      verbose_level = l < 0 ? 0 : l > 2 ? 2 : l;
   }
   const char *d = getenv("LUMEN_CPU_DISABLE");
   while (d && *d) {
      const char *e = strchr(d, ',');
      const size_t len = e ? (size_t)(e - d) : strlen(d);
      if (len) {
         const int id = find_name(d, len);
         if (id < 0 || impl_fallback[id])
            fprintf(stderr, "lumen: LUMEN_CPU_DISABLE: %s implementation '%.*s' (see "
                            "lm.backends.cpu.implementations())\n",
                    id < 0 ? "unknown" : "cannot switch off the fallback", (int)len, d);
         else
            impl_off[id] = 1;
      }
      d = e ? e + 1 : NULL;
   }
}

static inline void ensure_env(void) { pthread_once(&env_once, env_init); }

int lm_verbose(void) {
   ensure_env();
   return __atomic_load_n(&verbose_level, __ATOMIC_RELAXED);
}

int lm_set_verbose(int level) {
   ensure_env();
   const int prev = __atomic_load_n(&verbose_level, __ATOMIC_RELAXED);
   if (level >= 0 && level <= 2) __atomic_store_n(&verbose_level, level, __ATOMIC_RELAXED);
   return prev;
}

int lm_get_verbose(void) { return lm_verbose(); }

const char *lm_impl_name(int id) { return id >= 0 && id < LM_NUM_IMPLS ? impl_names[id] : "?"; }

int lm_impl_on(int id) {
   if (id < 0 || id >= LM_NUM_IMPLS) return 0;
   ensure_env();
   if (__atomic_load_n(&impl_off[id], __ATOMIC_RELAXED)) return 0;
   /* the older variable, read at each call as before (the specs set it between calls) */
   const char *a = impl_alias[id];
   if (a) {
      const char *v = getenv(a);
      if (v && v[0] == '0' && v[1] == 0) return 0;
   }
   return 1;
}

/* ---- the public side (lumen.h) ---- */
int lm_cpu_impl_count(void) { return LM_NUM_IMPLS; }

const char *lm_cpu_impl_info(int i, int *fallback, const char **alias, const char **doc) {
   if (i < 0 || i >= LM_NUM_IMPLS) return NULL;
   if (fallback) *fallback = impl_fallback[i];
   if (alias) *alias = impl_alias[i];
   if (doc) *doc = impl_docs[i];
   return impl_names[i];
}

lm_status lm_cpu_disable(const char *name, int off) {
   if (!name) return lm_error(LM_ERR_ARG, "the implementation name is NULL");
   const int id = find_name(name, strlen(name));
   if (id < 0)
      return lm_error(LM_ERR_ARG,
                      "unknown implementation '%s' (the names: "
                      "lm.backends.cpu.implementations(), docs/performance.md)",
                      name);
   if (off && impl_fallback[id])
      return lm_error(LM_ERR_ARG,
                      "'%s' is its family's fallback and cannot be switched off",
                      name);
   ensure_env();
   __atomic_store_n(&impl_off[id], off ? 1 : 0, __ATOMIC_RELAXED);
   return LM_OK;
}

int lm_cpu_impl_disabled(const char *name) {
   if (!name) return -1;
   const int id = find_name(name, strlen(name));
   if (id < 0) return -1;
   return !lm_impl_on(id);
}

/* ---- what ran: per thread, for the lm_dispatch in progress ---- */
typedef struct {
   const lm_op *op; /* the op being dispatched (NULL: none) */
   int device;
   char note[160];
} verbose_state;
static _Thread_local verbose_state vs;
static _Thread_local int muted;

void lm_impl_mute(int on) { muted += on ? 1 : (muted > 0 ? -1 : 0); }

void lm_impl_ran_name(const char *name) {
   if (!name || !__atomic_load_n(&verbose_level, __ATOMIC_RELAXED) || !vs.op || muted) return;
   const size_t used = strlen(vs.note), len = strlen(name);
   /* once per name: a kernel calling the GEMM per tile names it once */
   for (const char *p = vs.note; (p = strstr(p, name)) != NULL; p += len)
      if ((p == vs.note || p[-1] == '+') && (p[len] == 0 || p[len] == '+')) return;
   if (used + 2 >= sizeof vs.note) return;
   snprintf(vs.note + used, sizeof vs.note - used, "%s%s", used ? "+" : "", name);
}

void lm_impl_ran(int id) { lm_impl_ran_name(lm_impl_name(id)); }

void lm_impl_ran_default(const char *name) {
   if (vs.op && !vs.note[0]) lm_impl_ran_name(name);
}

void lm_impl_skip(int id, const char *why) {
   if (__atomic_load_n(&verbose_level, __ATOMIC_RELAXED) < 2 || !vs.op) return;
   char dev[24];
   fprintf(stderr, "lumen_verbose,skip,%s,%s,%s,%s\n", lm_device_name(vs.device, dev, sizeof dev),
           lm_op_name(vs.op->kind), lm_impl_name(id), why ? why : "not usable");
}

int lm_impl_pick(const lm_impl *list, int n, const void *ctx) {
   for (int i = 0; i < n; i++) {
      if (!impl_fallback[list[i].id] && !lm_impl_on(list[i].id)) {
         lm_impl_skip(list[i].id, "switched off (lm.backends.cpu.disable, LUMEN_CPU_DISABLE or "
                                  "its LUMEN_* alias)");
         continue;
      }
      const char *why = list[i].usable ? list[i].usable(ctx) : NULL;
      if (why) {
         lm_impl_skip(list[i].id, why);
         continue;
      }
      return i;
   }
   return -1;
}

lm_status lm_impl_run(const lm_impl *list, int n, void *ctx, const char *what) {
   const int i = lm_impl_pick(list, n, ctx);
   if (i < 0) return lm_error(LM_ERR_INTERNAL, "%s: no implementation takes this call", what);
   lm_impl_ran(list[i].id);
   return list[i].run(ctx);
}

/* ---- lm_dispatch's lines ---- */
static double now_ms(void) {
   struct timespec ts;
   clock_gettime(CLOCK_MONOTONIC, &ts);
   return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void lm_verbose_begin(lm_verbose_frame *f, const lm_op *op, int device) {
   /* a kernel that dispatches again (nested): its line comes first, the outer note survives */
   f->prev_op = vs.op;
   f->prev_device = vs.device;
   memcpy(f->prev_note, vs.note, sizeof f->prev_note);
   vs.op = op;
   vs.device = device;
   vs.note[0] = 0;
   f->t0 = now_ms();
}

static const char *format_name(const lm_tensor *t) {
   if (!t) return "-";
   if (t->ndim == 4 && lm_is_contiguous(t, LM_CHANNELS_LAST) && !lm_is_contiguous(t, LM_CONTIGUOUS))
      return "channels_last";
   if (t->ndim == 5 && lm_is_contiguous(t, LM_CHANNELS_LAST_3D) &&
       !lm_is_contiguous(t, LM_CONTIGUOUS))
      return "channels_last_3d";
   if (lm_is_contiguous(t, LM_CONTIGUOUS)) return "contiguous";
   return "strided";
}

/* "8x64x56x56;64x64x3x3;-": each tensor's sizes, '-' for an absent one */
static void shape_list(const lm_tensor *const *ts, int n, char *shapes, size_t cap) {
   size_t used = 0;
   shapes[0] = 0;
   for (int i = 0; i < n; i++) {
      const lm_tensor *t = ts[i];
      if (used + 24 >= cap) break;
      if (i) shapes[used++] = ';';
      shapes[used] = 0;
      if (!t) {
         shapes[used++] = '-';
         shapes[used] = 0;
         continue;
      }
      if (t->ndim == 0) used += (size_t)snprintf(shapes + used, cap - used, "scalar");
      for (int d = 0; d < t->ndim && used + 24 < cap; d++)
         used += (size_t)snprintf(shapes + used, cap - used, "%s%lld", d ? "x" : "",
                                  (long long)t->sizes[d]);
   }
}

void lm_impl_plan(int id, const char *op, const lm_tensor *x, const lm_tensor *w) {
   if (!lm_verbose() || !x) return;
   char shapes[384], dev[24];
   const lm_tensor *ts[2] = {x, w};
   shape_list(ts, w ? 2 : 1, shapes, sizeof shapes);
   fprintf(stderr, "lumen_verbose,plan,%s,%s,%s,%s,%s,%s\n", lm_device_name(x->device, dev, sizeof dev),
           op, lm_impl_name(id), lm_dtype_name(x->dtype), format_name(x), shapes);
}

void lm_verbose_end(lm_verbose_frame *f, const lm_op *op, int device, lm_status st) {
   const double ms = now_ms() - f->t0;
   const lm_tensor *first = NULL;
   for (int i = 0; i < op->nt && !first; i++) first = op->t[i];
   char shapes[384];
   shape_list((const lm_tensor *const *)op->t, op->nt, shapes, sizeof shapes);
   char dev[24];
   fprintf(stderr, "lumen_verbose,exec,%s,%s,%s,%s,%s,%s,%.3f%s\n",
           lm_device_name(device, dev, sizeof dev), lm_op_name(op->kind),
           vs.note[0] ? vs.note : "default", first ? lm_dtype_name(first->dtype) : "-",
           format_name(first), shapes, ms, st == LM_OK ? "" : ",error");
   vs.op = f->prev_op;
   vs.device = f->prev_device;
   memcpy(vs.note, f->prev_note, sizeof vs.note);
}
