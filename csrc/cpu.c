/* cpu.c -- runtime ISA choice (once, at import), OpenMP facts and tile sizes for build_info(). */
#include "fa_tiles.h"
#include "fastattn.h"

static fa_isa_t g_level = FA_ISA_GENERIC;

fa_isa_t fa_cpu_level(void) { return g_level; }

int fa_cpu_supports(int level)
{
    switch (level) {
    case FA_ISA_GENERIC:
        return 1;
#if defined(FA_HAVE_V3)
    case FA_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v3") != 0;
#endif
#if defined(FA_HAVE_V4)
    case FA_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v4") != 0;
#endif
    default:
        return 0;
    }
}

int fa_cpu_init(int forced)
{
    if (forced >= 0) {
        if (!fa_cpu_supports(forced)) return -1;
        g_level = (fa_isa_t)forced;
        return 0;
    }
    g_level = fa_cpu_supports(FA_ISA_AVX512) ? FA_ISA_AVX512
            : fa_cpu_supports(FA_ISA_AVX2)   ? FA_ISA_AVX2
                                             : FA_ISA_GENERIC;
    return 0;
}

int fa_openmp_enabled(void) { return FA_OMP; }

int fa_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

const char *fa_build_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}

int fa_build_native(void)
{
#if defined(FA_NATIVE_BUILD)
    return 1;
#else
    return 0;
#endif
}

int fa_build_debug(void)
{
#if defined(FA_DEBUG_BUILD)
    return 1;
#else
    return 0;
#endif
}

int fa_build_sanitize(void)
{
#if defined(FA_SANITIZE_BUILD)
    return 1;
#else
    return 0;
#endif
}

/* One level's column of fa_tiles.h, in fa_tile_t order. */
#define FA_TILES_OF(sfx)                                                                      \
    do {                                                                                      \
        out[FA_TILE_VECTOR_WIDTH] = FA_VL_##sfx;                                              \
        out[FA_TILE_ATTENTION_BLOCK_Q] = ATT_NR_##sfx * FA_VL_##sfx;                          \
        out[FA_TILE_PACKED_TILE_ROWS] = SK_RB_##sfx;                                          \
        out[FA_TILE_PACKED_TILE_FEATURES] = SK_NV_##sfx * FA_VL_##sfx;                        \
        out[FA_TILE_SOFTMAX_CHUNK] = SM_CHUNK * FA_VL_##sfx;                                  \
    } while (0)

int fa_build_tiles(int isa, int64_t *out)
{
    switch (isa) {
    case FA_ISA_GENERIC:
        FA_TILES_OF(generic);
        break;
#if defined(FA_HAVE_V3)
    case FA_ISA_AVX2:
        FA_TILES_OF(v3);
        break;
#endif
#if defined(FA_HAVE_V4)
    case FA_ISA_AVX512:
        FA_TILES_OF(v4);
        break;
#endif
    default:
        return -1;
    }
    out[FA_TILE_ATTENTION_BLOCK_K] = ATT_BK;
    out[FA_TILE_ATTENTION_ROWS_MAX_Q] = out[FA_TILE_ATTENTION_BLOCK_Q] / ATT_ROWS_DIV;
    out[FA_TILE_ATTENTION_BACKWARD_BLOCK_Q] = ATT_BWD_BR;
    out[FA_TILE_PACKED_PANEL] = FA_PANEL;
    out[FA_TILE_PACKED_MAX_ROWS] = PACKED_MAX_ROWS;
    out[FA_TILE_SKINNY_ROWS] = SKINNY_ROWS;
    out[FA_TILE_MIN_ROWS_PER_THREAD] = MIN_ROWS;
    out[FA_TILE_ROW_BLOCK] = ROW_BLOCK;
    out[FA_TILE_FEATURE_ALIGN] = COL_ALIGN;
    out[FA_TILE_REDUCE_ROWS] = REDUCE_ROWS;
    return 0;
}
