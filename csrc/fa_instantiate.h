/* fa_instantiate.h -- compile a kernel body once per ISA level.
 *
 * Usage, in a family's .c file:
 *     #define FA_BODY "attention_body.h"
 *     #include "fa_instantiate.h"
 * defines every FA_CAT(name_, FA_SFX) function of the body three times: _generic (baseline
 * x86-64), _v3 (arch=x86-64-v3: AVX2 + FMA) and _v4 (arch=x86-64-v4: AVX-512), the last two only
 * when build_tools/cpu.py found that the compiler supports them (FA_HAVE_V3 / FA_HAVE_V4).
 * The per-ISA knobs (vector width, register tile sizes) come from the one table, fa_tiles.h.
 * A family's backward body goes in the same *_body.h as its forward, so both are instantiated
 * together.
 */
#include "fa_tiles.h"

#define FA_SFX generic
#define FA_VL FA_VL_generic
#define ATT_NR ATT_NR_generic
#define ATT_MR_S ATT_MR_S_generic
#define ATT_MR_P ATT_MR_P_generic
#define SK_NV SK_NV_generic
#define SK_RB SK_RB_generic
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"

#if defined(FA_HAVE_V3)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define FA_SFX v3
#define FA_VL FA_VL_v3
#define ATT_NR ATT_NR_v3
#define ATT_MR_S ATT_MR_S_v3
#define ATT_MR_P ATT_MR_P_v3
#define SK_NV SK_NV_v3
#define SK_RB SK_RB_v3
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"
#pragma GCC pop_options
#endif

#if defined(FA_HAVE_V4)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define FA_SFX v4
#define FA_VL FA_VL_v4
#define ATT_NR ATT_NR_v4
#define ATT_MR_S ATT_MR_S_v4
#define ATT_MR_P ATT_MR_P_v4
#define SK_NV SK_NV_v4
#define SK_RB SK_RB_v4
#include "fa_simd.h"
#include FA_BODY
#include "fa_simd_end.h"
#pragma GCC pop_options
#endif
