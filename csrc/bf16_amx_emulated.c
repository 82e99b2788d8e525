/* bf16_amx_emulated.c -- bf16_amx.h with every tile instruction emulated in C (amx_emulator.h,
 * a test aid: see there), on any AVX-512 CPU: the paths "amx-emulated" of FASTATTN_BF16_PATH
 * and FASTATTN_ATTENTION_BF16_PATH, and bf16 storage's many rows under FASTATTN_INT8_PATH=
 * amx-emulated. */
#if defined(FA_HAVE_V4)
#define FA_TARGET "arch=x86-64-v4"
#include "fa_target.h"
#define AMX_EMULATE 1
#define AMX_KERNELS fa_amx_emulated
#include "bf16_amx.h"
FA_TARGET_END
#endif
