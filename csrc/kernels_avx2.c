/* kernels_avx2.c -- every kernel body for x86-64-v3 (AVX2 + FMA): fa_kernels_avx2, when the
 * compiler supports that target (FA_HAVE_V3, build_tools/cpu.py). */
#if defined(FA_HAVE_V3)
#define FA_ISA_LEVEL 1
#define FA_TARGET "arch=x86-64-v3"
#define FA_KERNELS fa_kernels_avx2
#include "fa_kernels_isa.h"
#endif
