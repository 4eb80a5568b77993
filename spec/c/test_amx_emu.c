/* test_amx_emu.c -- the emulated AMX tiles (kernels/cpu/tiles_amx.c as `make amx-emu` builds it,
 * -DLUMEN_AMX_EMU) against the hardware where this machine has AMX: the emulation is what CI
 * runs the AMX kernels' specs on (Zen 4 / 5 have no AMX), so it must compute what TDPBF16PS
 * computes, up to the order of the float32 additions. Cases: random tiles of mixed magnitudes,
 * bfloat16 denormals (read as zero), products that cancel in the float32 sum, sums that
 * overflow, float32 sums in the denormal range, accumulation over several instructions into the
 * same tile, and loads / stores with row strides other than 64 (bit for bit).
 *
 * What holds, measured on a Xeon with AMX (December 2026): the hardware's sums are NOT the
 * emulation's bit for bit. On one TDPBF16PS of random tiles about half the results differ in the
 * last bits, and no simple model matches the hardware (the products added one by one in float32
 * as the emulation does, the pair summed exactly first, the 32 products summed exactly and
 * rounded once, pairwise trees, truncation: each matches 35-50 %); where the products overflow
 * one gives +-inf where the other's sum met inf - inf and gives NaN, both ways. So this program
 * checks the emulation within a tolerance of the hardware (2^-20 of the sum of |terms|, plus the
 * float32 denormal range once per product for the flushed partial sums), a result that is not
 * finite on one side not finite on the other (an infinity or NaN) unless the terms reach the
 * float32 limit (there the order decides between finite, inf and NaN: both were seen), and
 * prints how many results agree bit for bit.
 * Without AMX in this process (the CPU lacks it, or Linux refuses the tiles) only the emulation's
 * own checks run (zeroed and reloaded tiles, a store that writes 64 bytes a row and nothing
 * between rows). The emulation is compiled into this program under other names (the library
 * keeps its own).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

#define LUMEN_AMX_EMU 1
#define lm_amx_begin test_emu_begin
#define lm_amx_end test_emu_end
#define lm_amx_emu_load test_emu_load
#define lm_amx_emu_store test_emu_store
#define lm_amx_emu_zero test_emu_zero
#define lm_amx_emu_dpbf16 test_emu_dpbf16
#define lm_amx_enable test_emu_enable
#define lm_amx_on test_emu_on
#include "../../kernels/cpu/tiles_amx.c"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

/* AMX-TILE and AMX-BF16 in CPUID, XTILECFG and XTILEDATA enabled in XCR0, Linux's permission */
static int hw_amx(void) {
   unsigned a, b, c, d;
   if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
   if (!((d >> 24) & 1) || !((d >> 22) & 1)) return 0;
   if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;
   unsigned lo, hi;
   __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
   if (((lo >> 17) & 3) != 3) return 0;
   return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

static const tile_config g_hw_cfg __attribute__((aligned(64))) = {
   1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* c (16 x 16 float32, rows cs bytes apart) += sum over r < reps of a_r b_r on the hardware */
__attribute__((target("amx-tile,amx-bf16"))) static void hw_dp(const uint16_t *a,
                                                               const uint16_t *b, int reps,
                                                               float *c, int64_t cs) {
   _tile_loadconfig(&g_hw_cfg);
   _tile_loadd(0, c, cs);
   for (int r = 0; r < reps; r++) {
      _tile_loadd(1, a + r * 512, 64);
      _tile_loadd(2, b + r * 512, 64);
      _tile_dpbf16ps(0, 1, 2);
   }
   _tile_stored(0, c, cs);
   _tile_release();
}

/* a 16-row tile loaded with row stride ls and stored with stride ss, on the hardware */
__attribute__((target("amx-tile"))) static void hw_copy(const void *src, int64_t ls, void *dst,
                                                       int64_t ss) {
   _tile_loadconfig(&g_hw_cfg);
   _tile_loadd(3, src, ls);
   _tile_stored(3, dst, ss);
   _tile_release();
}
#else
static int hw_amx(void) { return 0; }
static void hw_dp(const uint16_t *a, const uint16_t *b, int reps, float *c, int64_t cs) {
   (void)a, (void)b, (void)reps, (void)c, (void)cs;
}
static void hw_copy(const void *src, int64_t ls, void *dst, int64_t ss) {
   (void)src, (void)ls, (void)dst, (void)ss;
}
#endif

static void emu_dp(const uint16_t *a, const uint16_t *b, int reps, float *c, int64_t cs) {
   test_emu_begin();
   test_emu_load(0, c, cs);
   for (int r = 0; r < reps; r++) {
      test_emu_load(1, a + r * 512, 64);
      test_emu_load(2, b + r * 512, 64);
      test_emu_dpbf16(0, 1, 2);
   }
   test_emu_store(0, c, cs);
   test_emu_end();
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
   g_rng ^= g_rng << 13;
   g_rng ^= g_rng >> 7;
   g_rng ^= g_rng << 17;
   return (uint32_t)(g_rng >> 32);
}

/* a bfloat16 with a random sign and mantissa and an exponent field in [e0, e1] */
static uint16_t rbf(int e0, int e1) {
   const uint32_t r = rnd32();
   const int e = e0 + (int)(r % (uint32_t)(e1 - e0 + 1));
   return (uint16_t)(((r >> 16) & 0x8000u) | ((uint32_t)e << 7) | ((r >> 8) & 0x7fu));
}

static uint32_t fbits(float f) {
   uint32_t u;
   memcpy(&u, &f, 4);
   return u;
}

enum { MAXREP = 4 };

/* one case: `reps` pairs of A (16 x 32) and B (16 rows of 16 pairs) tiles filled by fill(), C
   random or zero, then hardware and emulation from the same C */
static void run_case(const char *name, int reps, void (*fill)(uint16_t *a, uint16_t *b, int n),
                     int c_random, int hw) {
   static uint16_t a[MAXREP * 512], b[MAXREP * 512];
   static float c0[16 * 24], ch[16 * 24], ce[16 * 24];
   snprintf(g_case, sizeof g_case, "%s, %d tile product(s)", name, reps);
   fill(a, b, reps * 512);
   for (int i = 0; i < 16 * 24; i++) {
      c0[i] = c_random ? ldexpf((float)((int)(rnd32() % 2001u) - 1000), -6) : 0.0f;
   }
   /* C rows 96 bytes apart: the 8 floats between rows must stay as they were */
   memcpy(ch, c0, sizeof c0);
   memcpy(ce, c0, sizeof c0);
   emu_dp(a, b, reps, ce, 96);
   int bad = 0;
   for (int i = 0; i < 16 && !bad; i++)
      for (int j = 16; j < 24; j++)
         if (fbits(ce[i * 24 + j]) != fbits(c0[i * 24 + j])) {
            check(0, "emulated store wrote between rows (row %d, float %d)", i, j);
            bad = 1;
            break;
         }
   if (!hw) return;
   hw_dp(a, b, reps, ch, 96);
   int bad_n = 0, exact = 0;
   for (int i = 0; i < 16; i++)
      for (int j = 0; j < 24; j++) {
         const float h = ch[i * 24 + j], e = ce[i * 24 + j];
         if (j >= 16) { /* between rows: the hardware left it too */
            if (fbits(h) != fbits(c0[i * 24 + j]) && bad_n++ < 4)
               check(0, "the hardware's store wrote between rows (row %d, float %d)", i, j);
            continue;
         }
         /* the sum of |terms| (float64: every product of two bfloat16 is exact there) */
         double mag = fabs((double)c0[i * 24 + j]);
         for (int r = 0; r < reps; r++)
            for (int k = 0; k < 32; k++)
               mag += fabs((double)emu_bf(a[r * 512 + i * 32 + k]) *
                           (double)emu_bf(b[r * 512 + (k / 2) * 32 + 2 * j + (k & 1)]));
         const double tol = ldexp(mag, -20) + 32.0 * reps * 0x1p-126;
         int ok;
         if (fbits(h) == fbits(e)) ok = 1, exact++;
         else if (!isfinite(h) || !isfinite(e))
            /* both not finite; or terms near the float32 limit, where the order of the
               additions decides between a finite sum, +-inf and NaN */
            ok = (!isfinite(h) && !isfinite(e)) || mag >= 0x1p126;
         else ok = isfinite(e) && fabs((double)h - (double)e) <= tol;
         if (!ok && bad_n++ < 4)
            check(0, "C[%d][%d]: hardware %a (0x%08x), emulation %a (0x%08x), tolerance %g", i,
                  j, (double)h, fbits(h), (double)e, fbits(e), tol);
      }
   if (bad_n > 4) check(0, "%d elements beyond the tolerance in all", bad_n);
   if (!bad_n) check(1, "");
   printf("%-28s %d product(s), C %s: %3d of 256 results bit for bit the hardware's\n", name,
          reps, c_random ? "random" : "zero", exact);
}

static void fill_mixed(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) a[i] = rbf(117, 137), b[i] = rbf(110, 144);
}

/* a few bfloat16 denormals (exponent field 0) among normal values */
static void fill_denormal(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) {
      a[i] = rnd32() % 4u ? rbf(120, 134) : (uint16_t)(rnd32() & 0x807fu);
      b[i] = rnd32() % 4u ? rbf(120, 134) : (uint16_t)(rnd32() & 0x807fu);
   }
}

/* large products of both signs next to small ones: the float32 sum's order and rounding show */
static void fill_cancel(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) {
      const int big = rnd32() % 3u == 0;
      a[i] = big ? rbf(150, 152) : rbf(100, 127);
      b[i] = big ? rbf(150, 152) : rbf(100, 127);
   }
}

/* products near the float32 maximum: sums overflow to +-infinity, some to NaN (inf - inf) */
static void fill_overflow(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) a[i] = rbf(185, 192), b[i] = rbf(185, 192);
}

/* tiny products: float32 sums in and around the denormal range (flushed to zero), and products
   that are themselves below float32's normal range */
static void fill_tiny(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) a[i] = rbf(1, 70), b[i] = rbf(1, 66);
}

/* inputs that are infinities or NaN here and there */
static void fill_special(uint16_t *a, uint16_t *b, int n) {
   for (int i = 0; i < n; i++) {
      a[i] = rbf(120, 134);
      b[i] = rbf(120, 134);
      const uint32_t r = rnd32() % 64u;
      if (r == 0) a[i] = 0x7f80u;
      if (r == 1) b[i] = 0xff80u;
      if (r == 2) a[i] = 0x7fc1u;
   }
}

int main(void) {
   const int hw = hw_amx();
   printf("AMX on this machine: %s\n",
          hw ? "yes: the emulation against the hardware"
             : "no: the emulation's own checks only");
   for (int reps = 1; reps <= MAXREP; reps += 3) {
      for (int rnd = 0; rnd < 2; rnd++) {
         run_case("mixed magnitudes", reps, fill_mixed, rnd, hw);
         run_case("bfloat16 denormal inputs", reps, fill_denormal, rnd, hw);
         run_case("cancelling products", reps, fill_cancel, rnd, hw);
         run_case("overflow", reps, fill_overflow, rnd, hw);
         run_case("denormal sums", reps, fill_tiny, 0, hw);
         run_case("infinities and NaN inputs", reps, fill_special, rnd, hw);
      }
   }
   /* loads and stores with row strides other than 64 bytes, and a zeroed tile */
   snprintf(g_case, sizeof g_case, "tile load / store strides");
   static uint8_t src[16 * 200], de[16 * 136], dh[16 * 136];
   for (int i = 0; i < (int)sizeof src; i++) src[i] = (uint8_t)rnd32();
   memset(de, 0xa5, sizeof de);
   memset(dh, 0xa5, sizeof dh);
   test_emu_begin();
   test_emu_load(3, src, 200);
   test_emu_store(3, de, 136);
   test_emu_zero(4);
   static float z[256];
   for (int i = 0; i < 256; i++) z[i] = 1.0f;
   test_emu_store(4, z, 64);
   test_emu_end();
   int zeros = 1;
   for (int i = 0; i < 256; i++) zeros &= fbits(z[i]) == 0;
   check(zeros, "a zeroed tile stores zeros");
   int rows_ok = 1;
   for (int r = 0; r < 16; r++) {
      rows_ok &= memcmp(de + r * 136, src + r * 200, 64) == 0;
      for (int j = 64; j < 136; j++) rows_ok &= de[r * 136 + j] == 0xa5;
   }
   check(rows_ok, "emulated load (stride 200) and store (stride 136): 64 bytes a row, no more");
   if (hw) {
      hw_copy(src, 200, dh, 136);
      check(memcmp(dh, de, sizeof de) == 0, "the hardware's load / store gives the same bytes");
   }
   printf("%d passed, %d failed\n", g_pass, g_fail);
   return g_fail != 0;
}
