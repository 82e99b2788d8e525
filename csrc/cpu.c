/* cpu.c -- runtime ISA choice (once, at import: the kernel table fa_k), OpenMP facts and tile
 * sizes for build_info(). */
#include "fa_kernels.h"
#include "fa_tiles.h"

static fa_isa_t g_level = FA_ISA_GENERIC;
const fa_kernels *fa_k = &fa_kernels_generic;

fa_isa_t fa_cpu_level(void) { return g_level; }

const fa_kernels *fa_kernels_of(int level)
{
    switch (level) {
    case FA_ISA_GENERIC:
        return &fa_kernels_generic;
#if defined(FA_HAVE_V3)
    case FA_ISA_AVX2:
        return &fa_kernels_avx2;
#endif
#if defined(FA_HAVE_V4)
    case FA_ISA_AVX512:
        return &fa_kernels_avx512;
#endif
    default:
        return NULL;
    }
}

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
    } else {
        g_level = fa_cpu_supports(FA_ISA_AVX512) ? FA_ISA_AVX512
                : fa_cpu_supports(FA_ISA_AVX2)   ? FA_ISA_AVX2
                                                 : FA_ISA_GENERIC;
    }
    fa_k = fa_kernels_of(g_level);
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

int fa_build_tiles(int isa, int64_t *out)
{
    const fa_kernels *k = fa_kernels_of(isa);
    if (!k) return -1;
    out[FA_TILE_VECTOR_WIDTH] = k->tiles.vector_width;
    out[FA_TILE_ATTENTION_BLOCK_Q] = k->tiles.attention_block_q;
    out[FA_TILE_PACKED_TILE_ROWS] = k->tiles.packed_tile_rows;
    out[FA_TILE_PACKED_TILE_FEATURES] = k->tiles.packed_tile_features;
    out[FA_TILE_SOFTMAX_CHUNK] = k->tiles.softmax_chunk;
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
