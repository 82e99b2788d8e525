/* loss.c -- cross-entropy over the vocabulary (log-softmax + NLL + label smoothing, and the
 * gradient), fused, parallel over rows. */
#include <math.h>

#include "fastattn.h"

#define FA_BODY "loss_body.h"
#include "fa_instantiate.h"

typedef void (*ce_rows_fn)(float *, float *, const float *, const int64_t *, int64_t, int64_t,
                           int64_t, int64_t, float, float);

void fa_cross_entropy_forward(float *losses, float *dlogits, const float *logits,
                              const int64_t *targets, int64_t N, int64_t V,
                              int64_t ignore_index, float label_smoothing, float grad_scale,
                              int nthreads)
{
    if (N <= 0) return;
    const ce_rows_fn rows = FA_DISPATCH(cross_entropy_rows_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)V, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t r0, r1;                                   /* this thread's rows */
        fa_split(N, 1, &r0, &r1);
        if (r0 < r1)
            rows(losses, dlogits, logits, targets, r0, r1, V, ignore_index, label_smoothing,
                 grad_scale);
    }
}
