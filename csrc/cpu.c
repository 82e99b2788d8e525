/* cpu.c -- what build_info() reports of the build: compiler, OpenMP, build knobs and each
 * level's tile sizes (the runtime choice of level and paths is in paths.c). */
#include <pthread.h>

#include "fa_kernels.h"
#include "fa_tiles.h"

int fa_openmp_enabled(void) { return FA_OMP; }

/* fork(): see fa_team_allowed in fa_common.h. The handler runs in the child, inside fork(),
 * before any Python code (os.register_at_fork's hooks included). */
int fa_fork_state = 0;

static void fork_child(void)
{
    if (fa_fork_state & FA_FORK_TEAM_STARTED) fa_fork_state |= FA_FORK_CHILD_AFTER_TEAM;
}

__attribute__((constructor)) static void fork_guard_install(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

int fa_forked_after_team(void) { return (fa_fork_state & FA_FORK_CHILD_AFTER_TEAM) != 0; }

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
    out[FA_TILE_ROW_BLOCK] = ROW_BLOCK;
    out[FA_TILE_FEATURE_ALIGN] = COL_ALIGN;
    out[FA_TILE_REDUCE_ROWS] = REDUCE_ROWS;
    return 0;
}
