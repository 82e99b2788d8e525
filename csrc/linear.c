/* linear.c -- GEMM-based linear and feed-forward layers with fused bias/activation epilogues.
 *
 * One thread pool: OpenMP splits the work and every BLAS call runs single-threaded inside it
 * (OpenBLAS's own pool is kept at one thread for the whole process, see fa_blas.h), so OpenBLAS
 * never starts (or spins) threads of its own next to ours. Many rows: each thread takes blocks
 * of rows, runs the GEMM and then the epilogue while the block is in cache. Few rows (decode
 * steps): each thread takes a slice of the output features instead. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fa_blas.h"
#include "fastattn.h"

#define FA_BODY "linear_body.h"
#include "fa_instantiate.h"

/* Sizes (fa_tiles.h): ROW_BLOCK rows per GEMM block; below MIN_ROWS rows per thread the
 * features are split instead, in slices starting on multiples of COL_ALIGN; up to SKINNY_ROWS
 * rows, the skinny kernel replaces BLAS. */

typedef void (*epi_fn)(float *, const float *, int64_t, int64_t, int64_t, int);
typedef void (*skinny_fn)(float *, int64_t, const float *, int64_t, const float *, int64_t,
                          int64_t);

/* Number of row blocks: about N / ROW_BLOCK, rounded up to a multiple of the team size so that
 * every thread gets the same number of (equal) blocks. */
static int64_t row_blocks(int64_t N, int nt)
{
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    return (nblk + nt - 1) / nt * nt;
}

/* y[:, m0:m1] = act(x w[m0:m1]^T + b[m0:m1]) for this thread's slice of the M features (split
 * over the team actually running, fa_split). xp: x with rows padded to a multiple of 4 for the
 * skinny kernel (N <= SKINNY_ROWS), or NULL to use BLAS. */
static void linear_cols(float *y, const float *x, const float *xp, const float *w,
                        const float *b, int64_t N, int64_t K, int64_t M, int act, epi_fn epi,
                        skinny_fn skinny)
{
    int64_t m0, m1;
    fa_split(M, COL_ALIGN, &m0, &m1);
    if (m0 >= m1) return;
    if (xp)
        skinny(y + m0, M, xp, N, w + m0 * K, m1 - m0, K);
    else
        fa_sgemm_rowmajor(0, 1, N, m1 - m0, K, 1.0f, x, K, w + m0 * K, K, 0.0f, y + m0, M);
    epi(y + m0, b ? b + m0 : NULL, N, m1 - m0, M, act);
}

/* x (N, K) copied into rows padded with zeros to a multiple of 4, for the skinny kernel; NULL
 * when N is too large for it, for K = 0 (x may then be NULL) or out of memory: BLAS (the
 * wrapper, for K = 0) then takes the call. */
static float *skinny_rows(const float *x, int64_t N, int64_t K)
{
    if (N > SKINNY_ROWS || K <= 0) return NULL;
    const int64_t n4 = (N + 3) / 4 * 4;
    float *xp = calloc((size_t)(n4 * K), sizeof(float));
    if (xp) memcpy(xp, x, (size_t)(N * K) * sizeof(float));
    return xp;
}

void fa_linear_forward(float *y, const float *x, const float *weight, const float *bias,
                       int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return;
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const int nt = fa_team_size(nthreads, 2.0 * (double)N * (double)K * (double)M, 2e6);
    const int by_rows = N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = (N + nblk - 1) / nblk;
    const skinny_fn skinny = FA_DISPATCH(skinny_gemm_);
    float *xp = by_rows ? NULL : skinny_rows(x, N, K);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (by_rows) {
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
                if (rows <= 0) continue;
                fa_sgemm_rowmajor(0, 1, rows, M, K, 1.0f, x + r0 * K, K, weight, K, 0.0f,
                                  y + r0 * M, M);
                epi(y + r0 * M, bias, rows, M, M, activation);
            }
        } else {
            linear_cols(y, x, xp, weight, bias, N, K, M, activation, epi, skinny);
        }
    }
    free(xp);
}

int fa_ffn_forward(float *y, const float *x, const float *w1, const float *b1,
                   const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                   int activation, int nthreads)
{
    if (N <= 0 || C <= 0) return 0;
    if (F <= 0) { /* an empty hidden layer: y = b2 */
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) y[n * C + c] = b2 ? b2[c] : 0.0f;
        return 0;
    }
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const int nt = fa_team_size(nthreads, 4.0 * (double)N * (double)C * (double)F, 2e6);
    const int by_rows = N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = (N + nblk - 1) / nblk;
    /* by rows: one (per, F) hidden block per thread; by features: the whole (N, F), N small */
    float *hidden = malloc((size_t)(by_rows ? per * F * nt : (N + 3) / 4 * 4 * F) * sizeof(float));
    if (!hidden) return -1;
    const skinny_fn skinny = FA_DISPATCH(skinny_gemm_);
    float *xp = by_rows ? NULL : skinny_rows(x, N, C);
    /* skinny: the hidden doubles as the padded input of the second GEMM (pad rows zeroed) */
    if (xp) memset(hidden + N * F, 0, (size_t)(((N + 3) / 4 * 4 - N) * F) * sizeof(float));
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (by_rows) {
            float *h = hidden + per * F * fa_thread_id(); /* id < team <= nt blocks */
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
                if (rows <= 0) continue;
                fa_sgemm_rowmajor(0, 1, rows, F, C, 1.0f, x + r0 * C, C, w1, C, 0.0f, h, F);
                epi(h, b1, rows, F, F, activation);
                fa_sgemm_rowmajor(0, 1, rows, C, F, 1.0f, h, F, w2, F, 0.0f, y + r0 * C, C);
                epi(y + r0 * C, b2, rows, C, C, FA_ACT_NONE);
            }
        } else {
            /* the whole team writes the hidden, waits, then reads all of it */
            linear_cols(hidden, x, xp, w1, b1, N, C, F, activation, epi, skinny);
#pragma omp barrier
            linear_cols(y, hidden, xp ? hidden : NULL, w2, b2, N, F, C, FA_ACT_NONE, epi,
                        skinny);
        }
    }
    free(xp);
    free(hidden);
    return 0;
}

int64_t fa_packed_size(int64_t M, int64_t K)
{
    return (M + FA_PANEL - 1) / FA_PANEL * FA_PANEL * K;
}

void fa_pack_panels(float *wp, const float *w, int64_t M, int64_t K, int nthreads)
{
    const int64_t P = (M + FA_PANEL - 1) / FA_PANEL;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * FA_PANEL * K), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        float *w_p = wp + p * K * FA_PANEL;
        for (int64_t f = 0; f < FA_PANEL; f++) {       /* wp[p][k][f] = w[p*PANEL + f][k] */
            const int64_t m = p * FA_PANEL + f;
            for (int64_t k = 0; k < K; k++) w_p[k * FA_PANEL + f] = m < M ? w[m * K + k] : 0.0f;
        }
    }
}

typedef void (*packed_fn)(float *, int64_t, const float *, int64_t, const float *, int64_t,
                          int64_t, int64_t, int64_t);

void fa_linear_packed_forward(float *y, const float *x, const float *wp, const float *bias,
                              int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return;
    const packed_fn gemm = FA_DISPATCH(packed_gemm_);
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const int64_t P = (M + FA_PANEL - 1) / FA_PANEL;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads < P ? nthreads : (int)P,
                                2.0 * (double)N * (double)K * (double)M, 2e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t p0, p1;                                   /* this thread's panels */
        fa_split(P, 1, &p0, &p1);
        if (p0 < p1) {
            gemm(y, M, x, N, wp, p0, p1, M, K);
            const int64_t m0 = p0 * FA_PANEL, m1 = p1 * FA_PANEL < M ? p1 * FA_PANEL : M;
            epi(y + m0, bias ? bias + m0 : NULL, N, m1 - m0, M, activation);
        }
    }
}
