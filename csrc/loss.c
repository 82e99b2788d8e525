/* loss.c -- cross-entropy over the vocabulary (log-softmax + NLL + label smoothing, and the
 * gradient), fused, parallel over rows. */
#include "fa_kernels.h"

#define CE_TASK_FLOATS 16384 /* rows per task: at least this many logits (64 KB), or one row */

void fa_cross_entropy_forward(float *losses, float *dlogits, const float *logits,
                              const int64_t *targets, int64_t N, int64_t V,
                              int64_t ignore_index, float label_smoothing, float grad_scale,
                              int nthreads)
{
    if (N <= 0) return;
    const int64_t per = V >= CE_TASK_FLOATS ? 1 : CE_TASK_FLOATS / (V > 0 ? V : 1);
    const int64_t ntasks = (N + per - 1) / per;           /* tasks of `per` rows */
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)V, 3e4);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; task++) {
        const int64_t r0 = task * per, r1 = r0 + per < N ? r0 + per : N;
        fa_k->cross_entropy_rows(losses, dlogits, logits, targets, r0, r1, V, ignore_index,
                                 label_smoothing, grad_scale);
    }
}
