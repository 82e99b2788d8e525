/* softmax.c -- softmax over the last axis (max-subtracted), parallel over rows. */
#include <math.h>

#include "fastattn.h"

#define FA_BODY "softmax_body.h"
#include "fa_instantiate.h"

typedef void (*sm_rows_fn)(float *, const float *, int64_t, int64_t, int64_t);

void fa_softmax_forward(float *y, const float *x, int64_t N, int64_t C, int nthreads)
{
    if (N <= 0) return;
    const sm_rows_fn rows = FA_DISPATCH(softmax_rows_);
    const int nt = fa_team_size(nthreads, (double)N * (double)C, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t t = fa_thread_id(), per = (N + nt - 1) / nt;
        const int64_t r0 = t * per, r1 = r0 + per < N ? r0 + per : N;
        if (r0 < r1) rows(y, x, r0, r1, C);
    }
}
