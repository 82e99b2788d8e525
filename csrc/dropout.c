/* dropout.c -- dropout over the last axis with counter-based random bits (fa_rng.h): the mask is
 * a pure function of (seed, row, column), so the backward regenerates it instead of storing it. */
#include <string.h>

#include "fa_kernels.h"

void fa_dropout_forward(float *y, const float *x, int64_t N, int64_t C, double p, uint64_t seed,
                        int nthreads)
{
    if (N <= 0 || C <= 0) return;
    const fa_dropout_t drop = fa_dropout_make(p, seed);
    if (!drop.on) { /* p = 0: the identity */
        if (y != x) memmove(y, x, (size_t)(N * C) * sizeof(float));
        return;
    }
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)C, 1.3e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t r0, r1;                                   /* this thread's rows */
        fa_split(N, 1, &r0, &r1);
        if (r0 < r1) fa_k->dropout_rows(y, x, r0, r1, C, &drop);
    }
}

void fa_dropout_backward(float *dx, const float *dy, int64_t N, int64_t C, double p,
                         uint64_t seed, int nthreads)
{
    fa_dropout_forward(dx, dy, N, C, p, seed, nthreads); /* linear: the same mask and scale */
}
