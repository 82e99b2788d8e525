/* linear.c -- GEMM-based linear and feed-forward layers with fused bias/activation epilogues.
 *
 * Threading rule (never oversubscribed): with enough rows, OpenMP splits the rows into blocks
 * and each thread runs single-threaded BLAS on its block, then the epilogue while the block is
 * still in cache; with few rows, one multi-threaded BLAS call, then the epilogue. */
#include <math.h>
#include <stdlib.h>

#include "fa_blas.h"
#include "fastattn.h"

#define FA_BODY "linear_body.h"
#include "fa_instantiate.h"

#define ROW_BLOCK 512  /* rows per GEMM block: large enough for BLAS to run near its peak */
#define MIN_ROWS 128   /* below this many rows per thread, let BLAS thread a single call */

typedef void (*epi_fn)(float *, const float *, int64_t, int64_t, int64_t, int);

/* Row blocks: nblk blocks of about N / nblk rows, a multiple of the team size. */
static int64_t row_blocks(int64_t N, int nt)
{
    int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    return (nblk + nt - 1) / nt * nt;
}

void fa_linear_forward(float *y, const float *x, const float *weight, const float *bias,
                       int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return;
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const double flops = 2.0 * (double)N * (double)K * (double)M;
    const int nt = fa_team_size(nthreads, flops, 4e6);
    if (nt == 1 || N < (int64_t)nt * MIN_ROWS) {
        const int prev = fa_blas_threads_push(fa_in_parallel() || nthreads < 1 ? 1 : nthreads);
        fa_sgemm_rowmajor(0, 1, N, M, K, 1.0f, x, K, weight, K, 0.0f, y, M);
        fa_blas_threads_pop(prev);
        const int et = fa_team_size(nthreads, 10.0 * (double)N * (double)M, 1e5);
#pragma omp parallel for num_threads(et) if (et > 1) schedule(static)
        for (int64_t r = 0; r < N; r++) epi(y + r * M, bias, 1, M, M, activation);
        return;
    }
    const int64_t nblk = row_blocks(N, nt), per = (N + nblk - 1) / nblk;
    const int prev = fa_blas_threads_push(1);
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
            if (rows <= 0) continue;
            fa_sgemm_rowmajor(0, 1, rows, M, K, 1.0f, x + r0 * K, K, weight, K, 0.0f,
                              y + r0 * M, M);
            epi(y + r0 * M, bias, rows, M, M, activation);
        }
    }
    fa_blas_threads_pop(prev);
}

int fa_ffn_forward(float *y, const float *x, const float *w1, const float *b1,
                   const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                   int activation, int nthreads)
{
    if (N <= 0) return 0;
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const double flops = 4.0 * (double)N * (double)C * (double)F;
    int nt = fa_team_size(nthreads, flops, 4e6);
    if (N < (int64_t)nt * MIN_ROWS) nt = 1;
    const int64_t nblk = row_blocks(N, nt), per = (N + nblk - 1) / nblk;
    float *hidden = malloc((size_t)(per * F * nt) * sizeof(float));
    if (!hidden) return -1;
    /* one team member: BLAS may use the caller's threads; a team: BLAS single-threaded */
    const int prev = fa_blas_threads_push(nt > 1 || fa_in_parallel() ? 1 : nthreads);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *h = hidden + per * F * fa_thread_id();   /* (per, F): this thread's hidden block */
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
            if (rows <= 0) continue;
            fa_sgemm_rowmajor(0, 1, rows, F, C, 1.0f, x + r0 * C, C, w1, C, 0.0f, h, F);
            epi(h, b1, rows, F, F, activation);
            fa_sgemm_rowmajor(0, 1, rows, C, F, 1.0f, h, F, w2, F, 0.0f, y + r0 * C, C);
            epi(y + r0 * C, b2, rows, C, C, FA_ACT_NONE);
        }
    }
    fa_blas_threads_pop(prev);
    free(hidden);
    return 0;
}
