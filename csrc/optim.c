/* optim.c -- the optimiser's elementwise passes: the Adam / AdamW update, the sum of squares
 * behind the global gradient norm, and the in-place scale of gradient clipping. */
#include <math.h>

#include "fastattn.h"

/* The per-tensor constants of one Adam step, each computed in double and rounded to float
 * once, as torch does with its Python-float hyper-parameters. */
typedef struct {
    float decay;      /* AdamW: 1 - lr * weight_decay (p *= decay first); Adam: 1 */
    float l2;         /* Adam: weight_decay (g += l2 * p); AdamW: 0 */
    float w1;         /* torch's lerp weight 1 - beta1 (m = lerp(m, g, w1)) */
    float beta2, w2;  /* v = v * beta2 + w2 * g * g, w2 = 1 - beta2 */
    float bc2_sqrt;   /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step;   /* -lr / (1 - beta1^step) */
} adam_consts;

#define SUMSQ_BLOCK 8192 /* floats per block of fa_sum_squares: one double per block */
#define SPLIT_ALIGN 16   /* elements per 64 bytes: thread slices start on cache lines */

#define FA_BODY "optim_body.h"
#include "fa_instantiate.h"

typedef void (*adam_fn)(float *, float *, float *, const float *, int64_t, int64_t,
                        const adam_consts *);
typedef double (*sumsq_fn)(const float *, int64_t);
typedef void (*scale_fn)(float *, int64_t, float);

void fa_adam_step(float *param, float *exp_avg, float *exp_avg_sq, const float *grad, int64_t n,
                  int64_t step, double lr, double beta1, double beta2, double eps,
                  double weight_decay, int decoupled, int nthreads)
{
    if (n <= 0) return;
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    adam_consts k;
    k.decay = decoupled ? (float)(1.0 - lr * weight_decay) : 1.0f;
    k.l2 = decoupled ? 0.0f : (float)weight_decay;
    k.w1 = (float)(1.0 - beta1);
    k.beta2 = (float)beta2;
    k.w2 = (float)(1.0 - beta2);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = (float)eps;
    k.neg_step = (float)(-(lr / bc1));
    const adam_fn body = FA_DISPATCH(adam_span_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t i0, i1;                                   /* this thread's elements */
        fa_split(n, SPLIT_ALIGN, &i0, &i1);
        if (i0 < i1) body(param, exp_avg, exp_avg_sq, grad, i0, i1, &k);
    }
}

int64_t fa_sum_squares_scratch(int64_t n)
{
    return n > 0 ? (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK : 0;
}

double fa_sum_squares(double *partials, const float *x, int64_t n, int nthreads)
{
    if (n <= 0) return 0.0;
    const int64_t nb = fa_sum_squares_scratch(n);
    const sumsq_fn body = FA_DISPATCH(sum_squares_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t b0, b1;                                   /* this thread's blocks */
        fa_split(nb, 1, &b0, &b1);
        for (int64_t b = b0; b < b1; b++) {
            const int64_t i0 = b * SUMSQ_BLOCK;
            const int64_t len = n - i0 < SUMSQ_BLOCK ? n - i0 : SUMSQ_BLOCK;
            partials[b] = body(x + i0, len);
        }
    }
    double total = 0.0;                                   /* block order: thread-independent */
    for (int64_t b = 0; b < nb; b++) total += partials[b];
    return total;
}

void fa_scale_inplace(float *x, int64_t n, float s, int nthreads)
{
    if (n <= 0) return;
    const scale_fn body = FA_DISPATCH(scale_span_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t i0, i1;
        fa_split(n, SPLIT_ALIGN, &i0, &i1);
        if (i0 < i1) body(x + i0, i1 - i0, s);
    }
}
