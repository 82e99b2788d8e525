/* fa_common.h -- shared macros for the fastattn kernels: restrict/inline, the one guarded
 * OpenMP surface, and the ISA levels. */
#ifndef FA_COMMON_H
#define FA_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define FA_RESTRICT __restrict__
#define FA_INLINE static inline __attribute__((always_inline))
/* A variable read only by an `omp` pragma (a team size): unused in a FASTATTN_NO_OPENMP build,
 * where the pragmas are inert. */
#define FA_OMP_ONLY __attribute__((unused))

/* ---- OpenMP: included only here; no-op fallbacks for a FASTATTN_NO_OPENMP build. ---------- */
#ifdef _OPENMP
#include <omp.h>
#define FA_OMP 1
FA_INLINE int fa_thread_id(void) { return omp_get_thread_num(); }
FA_INLINE int fa_team(void) { return omp_get_num_threads(); }
FA_INLINE int fa_in_parallel(void) { return omp_in_parallel(); }
#else
#define FA_OMP 0
FA_INLINE int fa_thread_id(void) { return 0; }
FA_INLINE int fa_team(void) { return 1; }
FA_INLINE int fa_in_parallel(void) { return 0; }
#endif
/* fa_team() is the size of the team actually running the current parallel region (1 outside
 * one). OpenMP may start fewer threads than num_threads(n) asks for (OMP_THREAD_LIMIT,
 * OMP_DYNAMIC, nesting), so work inside a region is split by fa_team(), never by the count
 * requested: with fa_split (hand-rolled slices) or `omp for` (which splits by the team itself).
 * Per-thread scratch sized for the requested count stays in bounds: fa_thread_id() < fa_team()
 * <= requested. */

/* fork(): GNU libgomp keeps the threads of the last team in a pool tied to the thread that
 * started it; a child forked after that inherits the pool but not its threads, and its next team
 * of two or more waits for them forever. So the first team a process asks for sets
 * FA_FORK_TEAM_STARTED, the pthread_atfork child handler (cpu.c) turns that into
 * FA_FORK_CHILD_AFTER_TEAM in the child, and from then on every team is one thread (no pool
 * thread is woken; results do not depend on the count). fa_team_allowed(n) is the count a
 * parallel region may ask for: n, or 1 in such a child. */
enum { FA_FORK_TEAM_STARTED = 1, FA_FORK_CHILD_AFTER_TEAM = 2 };
extern int fa_fork_state;
FA_INLINE int fa_team_allowed(int nthreads)
{
    if (nthreads <= 1) return nthreads;
    const int state = __atomic_load_n(&fa_fork_state, __ATOMIC_RELAXED);
    if (state & FA_FORK_CHILD_AFTER_TEAM) return 1;
    if (!(state & FA_FORK_TEAM_STARTED))
        __atomic_fetch_or(&fa_fork_state, FA_FORK_TEAM_STARTED, __ATOMIC_RELAXED);
    return nthreads;
}

/* Threads to use for `work` units of roughly `grain` flops each: 1 below the grain or when
 * already inside a parallel region (no nested teams), else the caller's count. Layer norm and
 * attention forward run a team of one without an OpenMP region: opening one costs a runtime
 * round trip even when it is not parallel, comparable to a one-row layer norm itself. Those two
 * are the one-thread calls of decoding, made for every token (the other entry points run one
 * thread only on inputs smaller than a decode step's). */
FA_INLINE int fa_team_size(int nthreads, double work, double grain)
{
    if (nthreads < 1 || fa_in_parallel() || work < grain) return 1;
    return fa_team_allowed(nthreads);
}

/* [lo, hi) of `n` items for the calling thread of the team actually started: equal slices in
 * thread order, each a multiple of `align` items (the last one takes the remainder); empty
 * (lo == hi) for threads past the end. Outside a parallel region: [0, n). */
FA_INLINE void fa_split(int64_t n, int64_t align, int64_t *lo, int64_t *hi)
{
    const int64_t t = fa_thread_id(), nt = fa_team();
    int64_t per = (n + nt - 1) / nt;
    per = (per + align - 1) / align * align;
    *lo = t * per < n ? t * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* ---- ISA levels (user names: generic / avx2 / avx512; FA_ISA_LEVEL in fa_tiles.h). -------- */
typedef enum { FA_ISA_GENERIC = 0, FA_ISA_AVX2 = 1, FA_ISA_AVX512 = 2 } fa_isa_t;

fa_isa_t fa_cpu_level(void);

#endif /* FA_COMMON_H */
