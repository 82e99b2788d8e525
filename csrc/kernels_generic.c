/* kernels_generic.c -- every kernel body at the baseline (x86-64: SSE2): fa_kernels_generic. */
#define FA_ISA_LEVEL 0
#define FA_KERNELS fa_kernels_generic
#include "fa_kernels_isa.h"
