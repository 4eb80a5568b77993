/* tiles_amx.c -- the per-thread tile configuration of the AMX kernels, and the emulated tiles
 * (amx.h). Compiled with -mamx-tile -mamx-bf16 (the Makefile's *_amx.c rule); nothing here runs
 * unless lm_amx_enable() said yes (isa.c), so the build runs on every x86-64 machine.
 *
 * Every AMX kernel uses one configuration: palette 1, all eight tiles 16 rows x 64 bytes (4
 * accumulators, 2 A tiles, 2 B tiles); edges are handled with zero-padded copies, never with a
 * second configuration, so LDTILECFG runs once per thread per kernel call. */
#include "amx.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
   uint8_t palette, start_row;
   uint8_t reserved[14];
   uint16_t colsb[16];
   uint8_t rows[16];
} tile_config;

#ifdef LUMEN_AMX_EMU
/* ---- the emulation: eight tiles of 16 x 64 bytes per thread ---- */
typedef struct {
   int configured;
   int rows[8], colsb[8];
   uint8_t data[8][16][64];
} emu_state;
static _Thread_local emu_state emu;

static void emu_fail(const char *what, int t) {
   fprintf(stderr, "lumen: AMX emulation: %s (tile %d)\n", what, t);
   abort();
}

static void emu_check(int t) {
   if (t < 0 || t > 7) emu_fail("no such tile", t);
   if (!emu.configured) emu_fail("tile used without a configuration (lm_amx_begin)", t);
}

void lm_amx_begin(void) {
   tile_config c;
   memset(&c, 0, sizeof c);
   c.palette = 1;
   for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
   for (int t = 0; t < 8; t++) {
      if (c.rows[t] > 16 || c.colsb[t] > 64) emu_fail("palette 1 allows 16 rows of 64 bytes", t);
      emu.rows[t] = c.rows[t];
      emu.colsb[t] = c.colsb[t];
   }
   memset(emu.data, 0, sizeof emu.data);
   emu.configured = 1;
}

void lm_amx_end(void) { emu.configured = 0; }

void lm_amx_emu_load(int t, const void *p, int64_t stride) {
   emu_check(t);
   for (int r = 0; r < emu.rows[t]; r++)
      memcpy(emu.data[t][r], (const char *)p + r * stride, (size_t)emu.colsb[t]);
}

void lm_amx_emu_store(int t, void *p, int64_t stride) {
   emu_check(t);
   for (int r = 0; r < emu.rows[t]; r++)
      memcpy((char *)p + r * stride, emu.data[t][r], (size_t)emu.colsb[t]);
}

void lm_amx_emu_zero(int t) {
   emu_check(t);
   memset(emu.data[t], 0, sizeof emu.data[t]);
}

/* a bfloat16 as TDPBF16PS reads it: denormals are zero */
static float emu_bf(uint16_t h) {
   if ((h & 0x7f80u) == 0) h &= 0x8000u;
   return lm_bf2f(h);
}

static float emu_ftz(float f) {
   uint32_t u;
   memcpy(&u, &f, 4);
   if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
   memcpy(&f, &u, 4);
   return f;
}

void lm_amx_emu_dpbf16(int c, int a, int b) {
   emu_check(c), emu_check(a), emu_check(b);
   if (c == a || c == b || a == b) emu_fail("TDPBF16PS needs three different tiles", c);
   const int M = emu.rows[a], K = emu.colsb[a] / 4, N = emu.colsb[b] / 4;
   if (emu.rows[c] != M || emu.colsb[c] != N * 4 || emu.rows[b] != K)
      emu_fail("TDPBF16PS shapes do not match", c);
   for (int m = 0; m < M; m++) {
      float *cr = (float *)emu.data[c][m];
      const uint16_t *ar = (const uint16_t *)emu.data[a][m];
      for (int n = 0; n < N; n++) {
         float s = cr[n];
         for (int k = 0; k < K; k++) {
            const uint16_t *br = (const uint16_t *)emu.data[b][k];
            s = emu_ftz(s + emu_bf(ar[2 * k]) * emu_bf(br[2 * n]));
            s = emu_ftz(s + emu_bf(ar[2 * k + 1]) * emu_bf(br[2 * n + 1]));
         }
         cr[n] = s;
      }
   }
}

#else
/* ---- the hardware ---- */
/* a constant in memory: GCC 12 dropped the stores into a local configuration before
   LDTILECFG (it does not see the instruction read them), which left every tile unconfigured */
static const tile_config g_config __attribute__((aligned(64))) = {
   1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

void lm_amx_begin(void) { _tile_loadconfig(&g_config); }

void lm_amx_end(void) { _tile_release(); }
#endif
