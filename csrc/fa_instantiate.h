/* fa_instantiate.h -- compile a kernel body once per ISA level.
 *
 * Usage, in a family's .c file:
 *     #define FA_BODY "attention_body.h"
 *     #include "fa_instantiate.h"
 * defines every FA_CAT(name_, FA_SFX) function of the body three times: _generic (baseline
 * x86-64), _v3 (arch=x86-64-v3: AVX2 + FMA) and _v4 (arch=x86-64-v4: AVX-512), the last two only
 * when build_tools/cpu.py found that the compiler supports them (FA_HAVE_V3 / FA_HAVE_V4).
 * Per-ISA tuning knobs (vector width, register tile sizes) live here, in one table:
 *   FA_VL     floats per vector         ATT_NR    query vectors per attention tile (BQ = NR*VL)
 *   ATT_MR_S  keys per score tile       ATT_MR_P  value features per P.V tile
 *   SK_NV     weight vectors per packed-GEMM tile   SK_RB  rows of x per packed-GEMM tile
 */
#define FA_PANEL 48 /* features per packed weight panel: a multiple of every SK_NV * FA_VL */
#define FA_SFX generic
#define FA_VL 4
#define ATT_NR 2
#define ATT_MR_S 6
#define ATT_MR_P 4
#define SK_NV 2
#define SK_RB 6
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"

#if defined(FA_HAVE_V3)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define FA_SFX v3
#define FA_VL 8
#define ATT_NR 2
#define ATT_MR_S 6
#define ATT_MR_P 4
#define SK_NV 2
#define SK_RB 6
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"
#pragma GCC pop_options
#endif

#if defined(FA_HAVE_V4)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define FA_SFX v4
#define FA_VL 16
#define ATT_NR 4
#define ATT_MR_S 6
#define ATT_MR_P 4
#define SK_NV 3
#define SK_RB 8
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"
#pragma GCC pop_options
#endif
