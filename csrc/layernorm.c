/* layernorm.c -- layer norm forward over the last axis, fused with the residual add. */
#include <math.h>

#include "fastattn.h"

#define FA_BODY "layernorm_body.h"
#include "fa_instantiate.h"

typedef void (*ln_rows_fn)(float *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, int64_t, int64_t, int64_t, float);

void fa_layer_norm_forward(float *y, float *sum_out, float *mean, float *rstd,
                           const float *x, const float *residual,
                           const float *weight, const float *bias,
                           int64_t N, int64_t C, float eps, int nthreads)
{
    if (N <= 0 || C <= 0) return; /* C = 0: no statistics to write (ops.py asks the twin) */
    const ln_rows_fn rows = FA_DISPATCH(layer_norm_rows_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)C, 1.3e5); /* >= 0.5 MB */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* static split: each row is computed by one thread in one fixed order */
        int64_t r0, r1;
        fa_split(N, 1, &r0, &r1);
        if (r0 < r1) rows(y, sum_out, mean, rstd, x, residual, weight, bias, r0, r1, C, eps);
    }
}
