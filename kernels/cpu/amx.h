/* amx.h -- Intel AMX (Advanced Matrix Extensions) for the CPU kernels: enabling the tiles
 * (amx.c) and the tile operations the AMX kernels (*_amx.c) use, on the hardware or emulated.
 *
 * AMX is eight tile registers of up to 16 rows x 64 bytes and TDPBF16PS, which adds the product
 * of a 16 x 32 bfloat16 tile A and a 32 x 16 bfloat16 tile B (stored in k pairs: row r of B holds
 * the 16 words {B(2r, j), B(2r+1, j)}) to a 16 x 16 float32 tile C: 16,384 flops an
 * instruction. Linux hands a process the tile state only on request (lm_amx_enable); the tile
 * configuration (palette 1: rows and bytes per row of each tile) is per thread: an AMX kernel
 * calls lm_amx_begin() in each thread that runs tiles and lm_amx_end() when done.
 *
 * The emulation (built with -DLUMEN_AMX_EMU: `make amx-emu`, and `make asan-amx-emu` under
 * ASan): the same operations in portable C on eight thread-local tiles, with the palette-1 limits
 * checked (an operation on an unconfigured tile, or more than 16 rows / 64 bytes, aborts) and
 * TDPBF16PS's arithmetic as Intel's pseudocode writes it (bfloat16 inputs with denormals read as
 * zero, each product added to the float32 sum in turn, even k first, round to nearest even,
 * denormal sums flushed to zero). The hardware sums in another order: about half of the results
 * differ in the last bits (spec/c/test_amx_emu.c measures it and holds the emulation to 2^-20 of
 * the sum of |terms|), so specs compare both against a float64 reference, never bit for bit. The kernels' packing, blocking and edges then run, ASan-checked, on any machine with
 * AVX512_BF16 (Zen 4 and 5 included); lm_amx_enable() says yes there without asking the kernel.
 */
#ifndef LUMEN_KERNELS_AMX_H
#define LUMEN_KERNELS_AMX_H
#include <stdint.h>

/* 1 when AMX can run in this process: the CPU has AMX-BF16 and AMX-TILE, the OS enables
   XTILECFG / XTILEDATA in XCR0, and Linux granted the permission (asked once per process,
   arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). LUMEN_AMX_TEST_DENY=1 (tests) treats the
   request as refused. The emulated build answers 1 without asking. */
int lm_amx_enable(void);

/* the AMX kernels' gate: lm_cpu_isa() is LM_ISA_AMX and lm.backends.cpu.amx is on */
int lm_amx_on(void);

/* load the tile configuration used by every AMX kernel (all eight tiles 16 rows x 64 bytes) in
   the calling thread; lm_amx_end releases the tiles (TILERELEASE), so the thread's saved state
   stays small */
void lm_amx_begin(void);
void lm_amx_end(void);

/* tile operations: t, a, b are tile numbers 0..7 (compile-time constants); p a pointer, stride in
   bytes between rows. LM_TILE_LOAD_T1 is TILELOADDT1, a load hinted as streaming: data read
   once per use (the GEMM's B panels) then does not push data that is read again (the A block)
   out of L1 */
#ifdef LUMEN_AMX_EMU
void lm_amx_emu_load(int t, const void *p, int64_t stride);
void lm_amx_emu_store(int t, void *p, int64_t stride);
void lm_amx_emu_zero(int t);
void lm_amx_emu_dpbf16(int c, int a, int b);
#define LM_TILE_LOAD(t, p, s) lm_amx_emu_load(t, p, s)
#define LM_TILE_LOAD_T1(t, p, s) lm_amx_emu_load(t, p, s)
#define LM_TILE_STORE(t, p, s) lm_amx_emu_store(t, p, s)
#define LM_TILE_ZERO(t) lm_amx_emu_zero(t)
#define LM_TILE_DPBF16(c, a, b) lm_amx_emu_dpbf16(c, a, b)
#else
#include <immintrin.h>
#define LM_TILE_LOAD(t, p, s) _tile_loadd(t, p, s)
#define LM_TILE_LOAD_T1(t, p, s) _tile_stream_loadd(t, p, s)
#define LM_TILE_STORE(t, p, s) _tile_stored(t, p, s)
#define LM_TILE_ZERO(t) _tile_zero(t)
#define LM_TILE_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

#endif
