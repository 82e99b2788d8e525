/* softmax.c -- softmax over the last axis (max-subtracted), parallel over rows. */
#include "fa_kernels.h"

void fa_softmax_forward(float *y, const float *x, int64_t N, int64_t C, int nthreads)
{
    if (N <= 0 || C <= 0) return;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)C, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t r0, r1;                                   /* this thread's rows */
        fa_split(N, 1, &r0, &r1);
        if (r0 < r1) fa_k->softmax_rows(y, x, r0, r1, C);
    }
}
