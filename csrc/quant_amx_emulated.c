/* quant_amx_emulated.c -- the int8 path "amx-emulated": quant_amx.h with every tile
 * instruction emulated in C (amx_emulator.h, a test aid: see there), on any AVX-512 CPU. */
#if defined(FA_HAVE_V4)
#define FA_TARGET "arch=x86-64-v4"
#include "fa_target.h"
#define AMX_EMULATE 1
#define AMX_KERNELS fa_q8_amx_emulated
#include "quant_amx.h"
FA_TARGET_END
#endif
