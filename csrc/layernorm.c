/* layernorm.c -- layer norm over the last axis, fused with the residual add: forward and
 * backward. */
#include <math.h>
#include <stdlib.h>

#include "fa_kernels.h"
#include "fa_tiles.h"

/* Rows whose float32 sums cannot hold their moments (the fast path's squares overflow past
 * |s| ~ 1e19, or underflow into denormals when eps is as small as they are) are redone here
 * in double, which holds every sum of finite float32 values (C * FLT_MAX^2 < DBL_MAX): layer
 * norm is scale-invariant, so a row of 1e30s normalises like a row of 1s. The per-ISA bodies
 * call these for such rows only (compiled once, here, so every level gets the same bits); the
 * common path keeps its one float32 pass. */

/* One row, two passes in double:
 *   mean = sum(s) / C;  var = sum((s - mean)^2) / C;  rstd = 1 / sqrt(var + eps);
 *   y = (s - mean) * rstd * weight + bias
 * A row holding inf or NaN (given, or an x + residual past the float32 range) gets NaN, as in
 * the twin. s_n may be y_n (each element is read before it is written). */
void ln_row_wide(float *y_n, float *mean_n, float *rstd_n, const float *s_n, const float *weight,
                 const float *bias, int64_t C, float eps)
{
    double sum = 0.0;
    for (int64_t c = 0; c < C; c++) sum += (double)s_n[c];
    const double mu = sum / (double)C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; c++) {
        const double t = (double)s_n[c] - mu;
        ss += t * t;
    }
    const double rs = 1.0 / sqrt(ss / (double)C + (double)eps);
    if (mean_n) *mean_n = (float)mu;
    if (rstd_n) *rstd_n = (float)rs; /* as small as ~2.9e-39 (a denormal) for the widest rows */
    for (int64_t c = 0; c < C; c++) {
        double t = ((double)s_n[c] - mu) * rs;
        if (weight) t *= (double)weight[c];
        if (bias) t += (double)bias[c];
        y_n[c] = (float)t;
    }
}

/* The backward of one such row (rstd below LN_WIDE_RSTD: a standard deviation past ~1e30,
 * where s - mean may overflow float32 and rstd may be a denormal), in double:
 *   xhat = (s - mean) * rstd;  g = dy * weight;
 *   dx = rstd * (g - sum(g)/C - xhat * sum(g * xhat)/C);  dw_part += dy * xhat;  db_part += dy
 * s = x + residual in float32, as the forward formed it. */
void ln_bwd_row_wide(float *dx_n, float *dw_part, float *db_part, const float *dy_n, float mean,
                     float rstd, const float *x_n, const float *r_n, const float *weight,
                     int64_t C)
{
    const double mu = mean, rs = rstd;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t c = 0; c < C; c++) {
        const float s = r_n ? x_n[c] + r_n[c] : x_n[c];
        const double xh = ((double)s - mu) * rs, d = dy_n[c];
        if (db_part) {
            db_part[c] += dy_n[c];
            dw_part[c] += (float)(d * xh);
        }
        const double g = weight ? d * (double)weight[c] : d;
        s1 += g;
        s2 += g * xh;
    }
    if (!dx_n) return;
    const double m1 = s1 / (double)C, m2 = s2 / (double)C;
    for (int64_t c = 0; c < C; c++) {
        const float s = r_n ? x_n[c] + r_n[c] : x_n[c];
        const double xh = ((double)s - mu) * rs, d = dy_n[c];
        const double g = weight ? d * (double)weight[c] : d;
        dx_n[c] = (float)(rs * (g - m1 - xh * m2));
    }
}

void fa_layer_norm_forward(float *y, float *sum_out, float *mean, float *rstd,
                           const float *x, const float *residual,
                           const float *weight, const float *bias,
                           int64_t N, int64_t C, float eps, int nthreads)
{
    if (N <= 0 || C <= 0) return; /* C = 0: no statistics to write (ops.py asks the twin) */
        const int nt = fa_team_size(nthreads, (double)N * (double)C, 1.3e5); /* >= 0.5 MB */
    if (nt <= 1) {                                   /* no OpenMP region: see fa_team_size */
        fa_k->layer_norm_rows(y, sum_out, mean, rstd, x, residual, weight, bias, 0, N, C, eps);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        /* static split: each row is computed by one thread in one fixed order */
        int64_t r0, r1;
        fa_split(N, 1, &r0, &r1);
        if (r0 < r1)
            fa_k->layer_norm_rows(y, sum_out, mean, rstd, x, residual, weight, bias, r0, r1, C,
                                  eps);
    }
}

/* Rows per partial-sum block: REDUCE_ROWS, or a multiple of it that keeps the blocks to at most
 * REDUCE_MAX_BLOCKS. A function of N alone, never of the thread count. */
static int64_t ln_block_rows(int64_t N)
{
    const int64_t per = REDUCE_ROWS * (int64_t)REDUCE_MAX_BLOCKS;
    return REDUCE_ROWS * ((N + per - 1) / per);
}

/* out[c0:c1] (= or +=) the sum over blocks b = 0, 1, ... of part[b * stride + c], in double,
 * block by block in order: the same for any thread that computes it. */
static void sum_partials(float *out, const float *part, int64_t nblk, int64_t stride, int64_t c0,
                         int64_t c1, int accumulate)
{
    enum { W = 256 };
    for (int64_t cs = c0; cs < c1; cs += W) {
        const int64_t w = c1 - cs < W ? c1 - cs : W;
        double acc[W];
        for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
        for (int64_t b = 0; b < nblk; b++) {
            const float *p_b = part + b * stride + cs;
            for (int64_t j = 0; j < w; j++) acc[j] += (double)p_b[j];
        }
        for (int64_t j = 0; j < w; j++)
            out[cs + j] = accumulate ? out[cs + j] + (float)acc[j] : (float)acc[j];
    }
}

int fa_layer_norm_backward(float *dx, float *dweight, float *dbias,
                           const float *dy, const float *mean, const float *rstd,
                           const float *x, const float *residual, const float *weight,
                           int64_t N, int64_t C, int accumulate, int nthreads)
{
    if (C <= 0) return 0;
    if (N <= 0) { /* no rows: parameter gradients are empty sums */
        for (int64_t c = 0; c < C && !accumulate; c++) {
            if (dweight) dweight[c] = 0.0f;
            if (dbias) dbias[c] = 0.0f;
        }
        return 0;
    }
    const int64_t rb = ln_block_rows(N), nblk = (N + rb - 1) / rb;
    /* scratch: per block, [dweight partial (C) | dbias partial (C)]; every block is written
     * whatever the team, so every slice is summed */
    float *part = NULL;
    if (dweight || dbias) {
        part = malloc((size_t)(nblk * 2 * C) * sizeof(float));
        if (!part) return -1;
    }
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)C, 1.3e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nblk; b++) {
            const int64_t r0 = b * rb, r1 = r0 + rb < N ? r0 + rb : N;
            float *p_b = part ? part + b * 2 * C : NULL;
            fa_k->layer_norm_backward_rows(dx, p_b, p_b ? p_b + C : NULL, dy, mean, rstd, x,
                                           residual, weight, r0, r1, C);
        }
        /* (the loop's barrier) then each thread sums its columns over every block, in order */
        if (part) {
            int64_t c0, c1;
            fa_split(C, COL_ALIGN, &c0, &c1);
            if (dweight && c0 < c1) sum_partials(dweight, part, nblk, 2 * C, c0, c1, accumulate);
            if (dbias && c0 < c1) sum_partials(dbias, part + C, nblk, 2 * C, c0, c1, accumulate);
        }
    }
    free(part);
    return 0;
}
