/* optim.c -- the optimiser's elementwise passes over many tensors at once: the Adam / AdamW
 * update, the sum of squares behind the global gradient norm, and the in-place scale of
 * gradient clipping. */
#include <math.h>

#include "fa_kernels.h"

/* Tasks: tensor i is cut into chunks(sizes[i]) tasks of FA_OPTIM_CHUNK floats (the last one
 * shorter), numbered tensor after tensor. */
static inline int64_t chunks(int64_t n)
{
    return n > 0 ? (n + FA_OPTIM_CHUNK - 1) / FA_OPTIM_CHUNK : 0;
}

/* Which tensor task t belongs to, and its [lo, hi): `ti` and `first` (the number of the
 * tensor's first task) are the calling thread's cursor, moved forward only (the tasks of an
 * `omp for schedule(dynamic)` reach each thread in increasing order). */
static inline void locate(int64_t t, const int64_t *sizes, int64_t *ti, int64_t *first,
                          int64_t *lo, int64_t *hi)
{
    while (t >= *first + chunks(sizes[*ti])) {
        *first += chunks(sizes[*ti]);
        ++*ti;
    }
    *lo = (t - *first) * FA_OPTIM_CHUNK;
    *hi = *lo + FA_OPTIM_CHUNK < sizes[*ti] ? *lo + FA_OPTIM_CHUNK : sizes[*ti];
}

static int64_t total_tasks(const int64_t *sizes, int64_t count, double *elements)
{
    int64_t n = 0;
    double e = 0.0;
    for (int64_t i = 0; i < count; i++) {
        n += chunks(sizes[i]);
        e += sizes[i] > 0 ? (double)sizes[i] : 0.0;
    }
    *elements = e;
    return n;
}

void fa_adam_step(float *const *params, float *const *exp_avgs, float *const *exp_avg_sqs,
                  const float *const *grads, const int64_t *sizes, int64_t count, int64_t step,
                  double lr, double beta1, double beta2, double eps, double weight_decay,
                  int decoupled, int nthreads)
{
    double elements;
    const int64_t ntasks = total_tasks(sizes, count, &elements);
    if (ntasks == 0) return;
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
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            fa_k->adam_span(params[ti], exp_avgs[ti], exp_avg_sqs[ti], grads[ti], lo, hi, &k);
        }
    }
}

int64_t fa_sum_squares_blocks(const int64_t *sizes, int64_t count)
{
    double elements;
    return total_tasks(sizes, count, &elements);
}

double fa_sum_squares(double *partials, const float *const *xs, const int64_t *sizes,
                      int64_t count, int nthreads)
{
    double elements;
    const int64_t ntasks = total_tasks(sizes, count, &elements);
    if (ntasks == 0) return 0.0;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            partials[t] = fa_k->sum_squares(xs[ti] + lo, hi - lo);
        }
    }
    double total = 0.0;                                   /* block order: thread-independent */
    for (int64_t t = 0; t < ntasks; t++) total += partials[t];
    return total;
}

void fa_scale_inplace(float *const *xs, const int64_t *sizes, int64_t count, float s,
                      int nthreads)
{
    double elements;
    const int64_t ntasks = total_tasks(sizes, count, &elements);
    if (ntasks == 0) return;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            fa_k->scale_span(xs[ti] + lo, hi - lo, s);
        }
    }
}
