/* quant_amx.c -- the int8 path "amx": quant_amx.h on the AMX tiles, when the compiler knows the
 * tile instructions (FA_HAVE_AMX). The default where the CPU has the tiles and Linux grants
 * them, for 16 rows or more (paths.c: fa_int8_init, fa_int8_path_rows). */
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
#define FA_TARGET "arch=x86-64-v4,amx-tile,amx-int8,amx-bf16,avx512bf16"
#include "fa_target.h"
#define AMX_KERNELS fa_q8_amx
#include "quant_amx.h"
FA_TARGET_END
#endif
