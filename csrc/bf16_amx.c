/* bf16_amx.c -- the bf16 family's products on the AMX tiles (bf16_amx.h), when the compiler
 * knows the tile instructions (FA_HAVE_AMX). paths.c says which calls run here. */
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
#define FA_TARGET "arch=x86-64-v4,amx-tile,amx-int8,amx-bf16,avx512bf16"
#define AMX_ROUND_CVT 1
#include "fa_target.h"
#define AMX_KERNELS fa_amx
#include "bf16_amx.h"
FA_TARGET_END
#endif
