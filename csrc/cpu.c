/* cpu.c -- runtime ISA choice (once, at import) and OpenMP facts for build_info(). */
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
