/* linear.c -- GEMM-based linear and feed-forward layers with fused bias/activation epilogues:
 * forward and backward.
 *
 * One thread pool: OpenMP splits the work and every BLAS call runs single-threaded inside it
 * (OpenBLAS's own pool is kept at one thread for the whole process, see fa_blas.h), so OpenBLAS
 * never starts (or spins) threads of its own next to ours. Many rows: each thread takes blocks
 * of rows, runs the GEMM and then the epilogue while the block is in cache. Few rows (decode
 * steps): each thread takes a slice of the output features instead; in between (large teams),
 * groups of rows times slices of features (grid_tile). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fa_blas.h"
#include "fa_kernels.h"
#include "fa_tiles.h"

/* Sizes (fa_tiles.h): ROW_BLOCK rows per GEMM block; below MIN_ROWS rows per thread the
 * features are split instead, in slices starting on multiples of COL_ALIGN; up to SKINNY_ROWS
 * rows, the skinny kernel replaces BLAS. */

/* dst[i] = src[i] rounded to bf16, as float32 values (the bfloat16 compute type's rounding:
 * fa_round_bfloat16), for i < n; dst may be src */
static void round_bf16(float *dst, const float *src, int64_t n)
{
    if (n > 0) fa_k->bfc_round_row(dst, src, n, n, 1);
}

/* One product by rows, A not transposed: with bp (bf16 training, its B packed once per call
 * for the bf16 tiles, fa_bf16_b_make) on the tiles, else float32 BLAS. bf16 training's
 * operands are bf16 values held in float32s, so BLAS gives the same exact products; the
 * products that split the features (few rows) or transpose A (the weight gradients) run on
 * BLAS. */
static void gemm(const fa_bf16_b *bp, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc)
{
    if (bp)
        fa_bf16_b_gemm(bp, 0, tb, M, N, K, A, lda, B, ldb, 0.0f, C, ldc);
    else
        fa_sgemm_rowmajor(0, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

/* Number of row blocks: about N / ROW_BLOCK, rounded up to a multiple of the team size so that
 * every thread gets the same number of (equal) blocks. */
static int64_t row_blocks(int64_t N, int nt)
{
    const int64_t nblk = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    return (nblk + nt - 1) / nt * nt;
}

/* Rows per block of nblk blocks: an even share rounded up to a multiple of BLAS_ROW_ALIGN, so
 * that BLAS computes each row the same way whatever the team size (the last blocks may be
 * short or empty). */
static int64_t block_rows(int64_t N, int64_t nblk)
{
    const int64_t per = (N + nblk - 1) / nblk;
    return (per + BLAS_ROW_ALIGN - 1) / BLAS_ROW_ALIGN * BLAS_ROW_ALIGN;
}

/* This thread's tile [r0, r1) x [m0, m1) of an (N, M) output that a team splits when it has
 * fewer than MIN_ROWS rows per thread: rg groups of at least MIN_ROWS rows times cg slices of
 * the features (starting on multiples of COL_ALIGN), thread t taking row group t / cg and slice
 * t % cg; threads past rg * cg (fewer than cg) get an empty tile. With fewer than 2 * MIN_ROWS
 * rows (or a team too small for two groups) that is the feature split alone. Rows grouped so,
 * each thread packs a share of the input rather than all of it: the Transformer-base encoder's
 * (1024, 512) -> 512 projection on 16 threads otherwise had every thread pack all 1024 rows for
 * a slice of 32 features. Groups are sized as row blocks are (block_rows). */
static void grid_tile(int64_t N, int64_t M, int64_t *r0, int64_t *r1, int64_t *m0, int64_t *m1)
{
    const int64_t T = fa_team(), t = fa_thread_id();
    const int64_t rg_max = N / MIN_ROWS > 1 ? N / MIN_ROWS : 1;
    int64_t cg = (T + rg_max - 1) / rg_max, rg = T / cg;
    if (rg <= 1) rg = 1, cg = T;
    *r0 = *r1 = *m0 = *m1 = 0;
    if (t >= rg * cg) return;
    const int64_t rows = block_rows(N, rg);
    const int64_t cols = ((M + cg - 1) / cg + COL_ALIGN - 1) / COL_ALIGN * COL_ALIGN;
    *r0 = (t / cg) * rows < N ? (t / cg) * rows : N;
    *r1 = *r0 + rows < N ? *r0 + rows : N;
    *m0 = (t % cg) * cols < M ? (t % cg) * cols : M;
    *m1 = *m0 + cols < M ? *m0 + cols : M;
}

/* y = drop(act(x w^T + b)) on this thread's tile (grid_tile); pre (if not NULL) keeps the
 * value before the activation. w is (M, K). xp: x with rows padded to a multiple of 4 for the
 * skinny kernel (N <= SKINNY_ROWS, one row group), or NULL to use BLAS. drop may be NULL. */
static void linear_cols(float *y, float *pre, const float *x, const float *xp, const float *w,
                        const float *b, int64_t N, int64_t K, int64_t M, int act,
                        const fa_dropout_t *drop)
{
    int64_t r0, r1, m0, m1;
    grid_tile(N, M, &r0, &r1, &m0, &m1);
    if (r0 >= r1 || m0 >= m1) return;
    float *z = pre ? pre : y;                             /* where the GEMM writes */
    if (xp)
        fa_k->skinny_gemm(z + m0, M, xp, N, w + m0 * K, m1 - m0, K);
    else
        fa_sgemm_rowmajor(0, 1, r1 - r0, m1 - m0, K, 1.0f, x + r0 * K, K, w + m0 * K, K, 0.0f,
                          z + r0 * M + m0, M);
    fa_k->bias_act_rows(y + r0 * M + m0, pre ? pre + r0 * M + m0 : NULL, b ? b + m0 : NULL,
                        r1 - r0, m1 - m0, M, act, r0, m0, drop);
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

/* fa_linear_forward, with the weight (M, K), or with ldt > 0 its transpose (K, ldt) */
static void linear_forward(float *y, float *pre, const float *x, const float *weight, int64_t ldt,
                           const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                           int bf16, const fa_bf16_b *wpack, int nthreads)
{
    if (N <= 0 || M <= 0) return;
    const int nt = fa_team_size(nthreads, 2.0 * (double)N * (double)K * (double)M, 2e6);
    /* the transposed weight (the bf16 path's widened copy) is always split by rows: its
     * results must not depend on the team size (BLAS's may for another split of features) */
    const int by_rows = ldt > 0 || N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = block_rows(N, nblk);
    float *xp = by_rows ? NULL : skinny_rows(x, N, K);
    fa_bf16_b *own = NULL;
    const fa_bf16_b *bp = bf16 && by_rows ? fa_bf16_b_for(wpack, ldt > 0 ? 0 : 1, per, K, M,
                                                          weight, ldt > 0 ? ldt : K, &own)
                                          : NULL;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (by_rows) {
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
                if (rows <= 0) continue;
                float *p_r = pre ? pre + r0 * M : NULL;
                gemm(bp, ldt > 0 ? 0 : 1, rows, M, K, x + r0 * K, K, weight, ldt > 0 ? ldt : K,
                     p_r ? p_r : y + r0 * M, M);
                fa_k->bias_act_rows(y + r0 * M, p_r, bias, rows, M, M, activation, r0, 0, NULL);
            }
        } else {
            linear_cols(y, pre, x, xp, weight, bias, N, K, M, activation, NULL);
        }
    }
    free(xp);
    fa_bf16_b_free(own);
}

void fa_linear_forward(float *y, float *pre, const float *x, const float *weight,
                       const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                       int bf16, const fa_bf16_b *wpack, int nthreads)
{
    linear_forward(y, pre, x, weight, 0, bias, N, K, M, activation, bf16, wpack, nthreads);
}

void fa_linear_forward_t(float *y, const float *x, const float *wt, int64_t ldt,
                         const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                         int nthreads)
{
    linear_forward(y, NULL, x, wt, ldt, bias, N, K, M, activation, 0, NULL, nthreads);
}

/* ---- backward helpers ------------------------------------------------------------------------- */

/* out[m0:m1] (= or, with accumulate, +=) the column sums of z (N rows, row stride ld): each
 * column summed in row order, REDUCE_ROWS rows per float partial, the partials added in double.
 * Each column's sum is the same however the columns are split: bit-identical for every thread
 * count. */
static void col_sums(float *out, const float *z, int64_t N, int64_t ld, int64_t m0, int64_t m1,
                     int accumulate)
{
    enum { W = 256 };
    for (int64_t cs = m0; cs < m1; cs += W) {
        const int64_t w = m1 - cs < W ? m1 - cs : W;
        double acc[W];
        float part[W];
        for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
        for (int64_t r0 = 0; r0 < N; r0 += REDUCE_ROWS) {
            const int64_t r1 = N - r0 < REDUCE_ROWS ? N : r0 + REDUCE_ROWS;
            for (int64_t j = 0; j < w; j++) part[j] = 0.0f;
            for (int64_t n = r0; n < r1; n++) {
                const float *z_n = z + n * ld + cs;
                for (int64_t j = 0; j < w; j++) part[j] += z_n[j];
            }
            for (int64_t j = 0; j < w; j++) acc[j] += (double)part[j];
        }
        for (int64_t j = 0; j < w; j++)
            out[cs + j] = accumulate ? out[cs + j] + (float)acc[j] : (float)acc[j];
    }
}

/* This thread's slice of c (M, P) = a^T b (+ c with accumulate): a (R, M) row stride lda,
 * b (R, P) row stride ldb. The larger of M and P is split (fa_split), and each slice is one
 * single-threaded product: BLAS, or with bf16 (bf16 training's operands) the bf16 tiles where
 * the CPU has them, this thread's slice of b packed for them. */
static void gemm_tn_slice(float *c, const float *a, int64_t lda, const float *b, int64_t ldb,
                          int64_t R, int64_t M, int64_t P, int accumulate, int bf16)
{
    const float beta = accumulate ? 1.0f : 0.0f;
    int64_t lo, hi;
    if (M >= P) {
        fa_split(M, COL_ALIGN, &lo, &hi);
        if (lo >= hi) return;
        fa_bf16_b *bp = bf16 ? fa_bf16_b_make(0, hi - lo, R, P, b, ldb) : NULL;
        fa_bf16_b_gemm(bp, 1, 0, hi - lo, P, R, a + lo, lda, b, ldb, beta, c + lo * P, P);
        fa_bf16_b_free(bp);
    } else {
        fa_split(P, COL_ALIGN, &lo, &hi);
        if (lo >= hi) return;
        fa_bf16_b *bp = bf16 ? fa_bf16_b_make(0, M, R, hi - lo, b + lo, ldb) : NULL;
        fa_bf16_b_gemm(bp, 1, 0, M, hi - lo, R, a, lda, b + lo, ldb, beta, c + lo, P);
        fa_bf16_b_free(bp);
    }
}

static void zero(float *p, int64_t n)
{
    if (p && n > 0) memset(p, 0, (size_t)n * sizeof(float));
}

void fa_linear_backward(float *dx, float *dweight, float *dbias, float *dz,
                        const float *dy, const float *pre, const float *x, const float *weight,
                        int64_t N, int64_t K, int64_t M, int activation, int accumulate,
                        int bf16, const fa_bf16_b *wpack, int nthreads)
{
    if (M <= 0) { /* no outputs: dx is an empty sum */
        if (N > 0 && K > 0) zero(dx, N * K);
        return;
    }
    if (N <= 0) { /* no rows: the parameter gradients are empty sums */
        if (!accumulate) {
            zero(dweight, M * K);
            zero(dbias, M);
        }
        return;
    }
    const int act = activation;
    const float *g = act != FA_ACT_NONE || bf16 ? dz : dy;    /* dL/dz, z = x w^T + b */
    const double gemms = (dx != NULL) + (dweight != NULL);
    const int nt = fa_team_size(nthreads, 2.0 * gemms * (double)N * (double)K * (double)M
                                              + (double)N * (double)M, 2e6);
    const int by_rows = N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = block_rows(N, nblk);
    fa_bf16_b *own = NULL;
    const fa_bf16_b *bp = bf16 && by_rows && dx ? fa_bf16_b_for(wpack, 0, per, M, K, weight, K,
                                                                &own)
                                                : NULL;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* dz = dy * act'(pre), then dx = dz w */
        if (by_rows) {
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
                if (rows <= 0) continue;
                if (act != FA_ACT_NONE)
                    fa_k->grad_act_rows(dz + r0 * M, NULL, dy + r0 * M, pre + r0 * M, rows, M, M,
                                        act, r0, 0, NULL);
                if (bf16)
                    round_bf16(dz + r0 * M, act != FA_ACT_NONE ? dz + r0 * M : dy + r0 * M,
                                  rows * M);
                if (dx) gemm(bp, 0, rows, K, M, g + r0 * M, M, weight, K, dx + r0 * K, K);
            }
        } else {
            int64_t lo, hi;
            if (act != FA_ACT_NONE) {
                fa_split(N, 1, &lo, &hi);
                if (lo < hi)
                    fa_k->grad_act_rows(dz + lo * M, NULL, dy + lo * M, pre + lo * M, hi - lo, M,
                                        M, act, lo, 0, NULL);
            }
            if (bf16) {
                fa_split(N, 1, &lo, &hi);
                if (lo < hi)
                    round_bf16(dz + lo * M, act != FA_ACT_NONE ? dz + lo * M : dy + lo * M,
                                  (hi - lo) * M);
            }
#pragma omp barrier
            if (dx) {                                       /* few rows: slices of K */
                fa_split(K, COL_ALIGN, &lo, &hi);
                if (lo < hi)
                    fa_sgemm_rowmajor(0, 0, N, hi - lo, M, 1.0f, g, M, weight + lo, K, 0.0f,
                                      dx + lo, K);
            }
        }
#pragma omp barrier
        /* dweight = dz^T x, dbias = column sums of dz: slices of the outputs */
        if (dweight) gemm_tn_slice(dweight, g, M, x, K, N, M, K, accumulate, bf16);
        if (dbias) {
            int64_t m0, m1;
            fa_split(M, COL_ALIGN, &m0, &m1);
            col_sums(dbias, g, N, M, m0, m1, accumulate);
        }
    }
    fa_bf16_b_free(own);
}

int fa_ffn_forward(float *y, float *pre, const float *x, const float *w1, const float *b1,
                   const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                   int activation, double dropout_p, uint64_t seed, int bf16,
                   const fa_bf16_b *pack1, const fa_bf16_b *pack2, int nthreads)
{
    if (N <= 0 || C <= 0) return 0;
    if (F <= 0) { /* an empty hidden layer: y = b2 */
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) y[n * C + c] = b2 ? b2[c] : 0.0f;
        return 0;
    }
    const fa_dropout_t drop = fa_dropout_make(dropout_p, seed);
    const int nt = fa_team_size(nthreads, 4.0 * (double)N * (double)C * (double)F, 2e6);
    const int by_rows = N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = block_rows(N, nblk);
    /* by rows: one (per, F) hidden block per thread; by features: the whole (N, F), N small */
    float *hidden = malloc((size_t)(by_rows ? per * F * nt : (N + 3) / 4 * 4 * F) * sizeof(float));
    if (!hidden) return -1;
    float *xp = by_rows ? NULL : skinny_rows(x, N, C);
    fa_bf16_b *own1 = NULL, *own2 = NULL;
    const fa_bf16_b *bp1 = bf16 && by_rows ? fa_bf16_b_for(pack1, 1, per, C, F, w1, C, &own1)
                                           : NULL;
    const fa_bf16_b *bp2 = bf16 && by_rows ? fa_bf16_b_for(pack2, 1, per, F, C, w2, F, &own2)
                                           : NULL;
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
                float *p_r = pre ? pre + r0 * F : NULL;
                gemm(bp1, 1, rows, F, C, x + r0 * C, C, w1, C, p_r ? p_r : h, F);
                fa_k->bias_act_rows(h, p_r, b1, rows, F, F, activation, r0, 0, &drop);
                if (bf16) round_bf16(h, h, rows * F);
                gemm(bp2, 1, rows, C, F, h, F, w2, F, y + r0 * C, C);
                fa_k->bias_act_rows(y + r0 * C, NULL, b2, rows, C, C, FA_ACT_NONE, r0, 0, NULL);
            }
        } else {
            /* the whole team writes the hidden, waits, then reads all of it */
            linear_cols(hidden, pre, x, xp, w1, b1, N, C, F, activation, &drop);
            if (bf16) {
#pragma omp barrier
                int64_t lo, hi;
                fa_split(N, 1, &lo, &hi);
                if (lo < hi) round_bf16(hidden + lo * F, hidden + lo * F, (hi - lo) * F);
            }
#pragma omp barrier
            linear_cols(y, NULL, hidden, xp ? hidden : NULL, w2, b2, N, F, C, FA_ACT_NONE, NULL);
        }
    }
    free(xp);
    free(hidden);
    fa_bf16_b_free(own1);
    fa_bf16_b_free(own2);
    return 0;
}

void fa_ffn_backward(float *dx, float *dw1, float *db1, float *dw2, float *db2,
                     float *h, float *dpre,
                     const float *dy, const float *pre, const float *x,
                     const float *w1, const float *w2, int64_t N, int64_t C, int64_t F,
                     int activation, double dropout_p, uint64_t seed, int accumulate,
                     int bf16, const fa_bf16_b *pack1, const fa_bf16_b *pack2, int nthreads)
{
    if (N <= 0 || C <= 0 || F <= 0) { /* empty sums (F = 0: y = b2, so only db2 remains) */
        if (!accumulate) {
            zero(dw1, F * C);
            zero(db1, F);
            zero(dw2, C * F);
            zero(db2, C);
        }
        if (N > 0 && C > 0) {
            zero(dx, N * C);
            if (db2) col_sums(db2, dy, N, C, 0, C, accumulate);
        }
        return;
    }
    const fa_dropout_t drop = fa_dropout_make(dropout_p, seed);
    const int nt = fa_team_size(nthreads, 8.0 * (double)N * (double)C * (double)F, 2e6);
    const int by_rows = N >= (int64_t)nt * MIN_ROWS;
    const int64_t nblk = row_blocks(N, nt), per = block_rows(N, nblk);
    fa_bf16_b *own1 = NULL, *own2 = NULL;
    const fa_bf16_b *bp2 = bf16 && by_rows ? fa_bf16_b_for(pack2, 0, per, C, F, w2, F, &own2)
                                           : NULL;
    const fa_bf16_b *bp1 = bf16 && by_rows && dx
                               ? fa_bf16_b_for(pack1, 0, per, F, C, w1, C, &own1)
                               : NULL;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* dh = dy w2 (into h); then h = drop(act(pre)) and dpre = dh * drop' * act'(pre) in one
         * pass; then dx = dpre w1 */
        if (by_rows) {
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = blk * per, rows = N - r0 < per ? N - r0 : per;
                if (rows <= 0) continue;
                float *h_r = h + r0 * F, *d_r = dpre + r0 * F;
                gemm(bp2, 0, rows, F, C, dy + r0 * C, C, w2, F, h_r, F);
                fa_k->grad_act_rows(d_r, h_r, h_r, pre + r0 * F, rows, F, F, activation, r0, 0,
                                    &drop);
                if (bf16) {
                    round_bf16(h_r, h_r, rows * F);
                    round_bf16(d_r, d_r, rows * F);
                }
                if (dx) gemm(bp1, 0, rows, C, F, d_r, F, w1, C, dx + r0 * C, C);
            }
        } else {
            int64_t lo, hi;                                 /* few rows: feature slices */
            fa_split(F, COL_ALIGN, &lo, &hi);
            if (lo < hi) {
                fa_sgemm_rowmajor(0, 0, N, hi - lo, C, 1.0f, dy, C, w2 + lo, F, 0.0f, h + lo, F);
                fa_k->grad_act_rows(dpre + lo, h + lo, h + lo, pre + lo, N, hi - lo, F, activation,
                                    0, lo, &drop);
                if (bf16) {
                    for (int64_t n = 0; n < N; n++) {
                        round_bf16(h + n * F + lo, h + n * F + lo, hi - lo);
                        round_bf16(dpre + n * F + lo, dpre + n * F + lo, hi - lo);
                    }
                }
            }
#pragma omp barrier
            if (dx) {
                fa_split(C, COL_ALIGN, &lo, &hi);
                if (lo < hi)
                    fa_sgemm_rowmajor(0, 0, N, hi - lo, F, 1.0f, dpre, F, w1 + lo, C, 0.0f,
                                      dx + lo, C);
            }
        }
#pragma omp barrier
        /* parameter gradients: slices of the outputs */
        if (dw2) gemm_tn_slice(dw2, dy, C, h, F, N, C, F, accumulate, bf16);    /* dy^T h */
        if (dw1) gemm_tn_slice(dw1, dpre, F, x, C, N, F, C, accumulate, bf16);  /* dpre^T x */
        int64_t lo, hi;
        if (db2) {
            fa_split(C, COL_ALIGN, &lo, &hi);
            col_sums(db2, dy, N, C, lo, hi, accumulate);
        }
        if (db1) {
            fa_split(F, COL_ALIGN, &lo, &hi);
            col_sums(db1, dpre, N, F, lo, hi, accumulate);
        }
    }
    fa_bf16_b_free(own1);
    fa_bf16_b_free(own2);
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

void fa_linear_packed_forward(float *y, const float *x, const float *wp, const float *bias,
                              int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return;
    const int64_t P = (M + FA_PANEL - 1) / FA_PANEL;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads < P ? nthreads : (int)P,
                                2.0 * (double)N * (double)K * (double)M, 2e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t p0, p1;                                   /* this thread's panels */
        fa_split(P, 1, &p0, &p1);
        if (p0 < p1) {
            fa_k->packed_gemm(y, M, x, N, wp, p0, p1, M, K);
            const int64_t m0 = p0 * FA_PANEL, m1 = p1 * FA_PANEL < M ? p1 * FA_PANEL : M;
            fa_k->bias_act_rows(y + m0, NULL, bias ? bias + m0 : NULL, N, m1 - m0, M, activation, 0,
                                m0, NULL);
        }
    }
}
