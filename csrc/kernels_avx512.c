/* kernels_avx512.c -- every kernel body for x86-64-v4 (AVX-512 F, BW, DQ, VL): fa_kernels_avx512,
 * when the compiler supports that target (FA_HAVE_V4, build_tools/cpu.py). */
#if defined(FA_HAVE_V4)
#define FA_ISA_LEVEL 2
#define FA_TARGET "arch=x86-64-v4"
#define FA_KERNELS fa_kernels_avx512
#include "fa_kernels_isa.h"
#endif
