/* optim.c -- the optimiser's elementwise passes over many tensors at once: the Adam / AdamW
 * update, the sum of squares behind the global gradient norm, and the in-place scale of
 * gradient clipping. */
#include <math.h>

#include "fastattn.h"

/* The constants of one Adam step, each computed in double and rounded to float once, as
 * torch does with its Python-float hyper-parameters. */
typedef struct {
    float decay;      /* AdamW: 1 - lr * weight_decay (p *= decay first); Adam: 1 */
    float l2;         /* Adam: weight_decay (g += l2 * p); AdamW: 0 */
    float w1;         /* torch's lerp weight 1 - beta1 (m = lerp(m, g, w1)) */
    float beta2, w2;  /* v = v * beta2 + w2 * g * g, w2 = 1 - beta2 */
    float bc2_sqrt;   /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step;   /* -lr / (1 - beta1^step) */
} adam_consts;

#define FA_BODY "optim_body.h"
#include "fa_instantiate.h"

typedef void (*adam_fn)(float *, float *, float *, const float *, int64_t, int64_t,
                        const adam_consts *);
typedef double (*sumsq_fn)(const float *, int64_t);
typedef void (*scale_fn)(float *, int64_t, float);

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
    const adam_fn body = FA_DISPATCH(adam_span_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 3e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            body(params[ti], exp_avgs[ti], exp_avg_sqs[ti], grads[ti], lo, hi, &k);
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
    const sumsq_fn body = FA_DISPATCH(sum_squares_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            partials[t] = body(xs[ti] + lo, hi - lo);
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
    const scale_fn body = FA_DISPATCH(scale_span_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, elements, 6e4);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t ti = 0, first = 0, lo, hi;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            locate(t, sizes, &ti, &first, &lo, &hi);
            body(xs[ti] + lo, hi - lo, s);
        }
    }
}
