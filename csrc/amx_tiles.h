/* amx_tiles.h -- what every unit of AMX tile code shares: LDTILECFG's operand, the one tile
 * shape (16 rows x 64 bytes) and the tile instructions as AMX_* operations: the instructions
 * themselves, or, with AMX_EMULATE, each one emulated in C (amx_emulator.h: the same code run
 * on CPUs without AMX, so that its layout and arithmetic are tested everywhere). Included by
 * quant_amx.h (the int8 path's tiles) and bf16_amx.h (the bf16 family's tiles). */
#ifndef AMX_TILES_H
#define AMX_TILES_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "fa_kernels.h"
#include "fa_tiles.h"

/* LDTILECFG's 64-byte operand (palette 1: 8 tiles of up to 16 rows x 64 bytes) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];      /* bytes per row of tile t */
    uint8_t rows[16];
} amx_tilecfg_t;
_Static_assert(sizeof(amx_tilecfg_t) == 64 && offsetof(amx_tilecfg_t, colsb) == 16 &&
                   offsetof(amx_tilecfg_t, rows) == 48,
               "LDTILECFG's operand: palette at 0, colsb[16] at 16, rows[16] at 48");

/* Every tile used here: 16 rows x 64 bytes. */
static void amx_config(amx_tilecfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->rows[t] = AMX_MR;
        cfg->colsb[t] = 64;
    }
}

static float amx_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t amx_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#if defined(AMX_EMULATE)
#include "amx_emulator.h"
#else
/* LDTILECFG and TILELOADD as asm that names the memory they read: GCC 12's _tile_loadconfig
 * names only the first 8 bytes of the configuration, and its _tile_loadd no memory at all, so
 * the stores that fill either could be dropped as dead or sunk past the instruction */
#define AMX_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" : : "m"(*(const amx_tilecfg_t *)(cfg)))
#define AMX_LOAD(t, base, stride)                                                             \
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #t "|tileloadd\t%%tmm" #t ", [%0+%1*1]}"  \
                     : : "r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define AMX_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_RELEASE() _tile_release()
#endif


#endif /* AMX_TILES_H */
