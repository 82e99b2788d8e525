/* linear.c -- linear and feed-forward layers, forward and backward: their float32 products on
 * the GEMM engine (fa_gemm.h), the bias / activation / dropout epilogue applied to each
 * finished tile while it is in L1; bf16 training's products on the bf16 tiles where its path
 * runs there (bf16_gemm.c), else on the engine too (bf16 values held in float32s: exact
 * products, summed in float32).
 *
 * One thread pool: each entry point opens one OpenMP region, in which the team packs the
 * operand it multiplies by (unless the weight came packed: fa_linear_packed_forward) and then
 * shares the product's tasks, each thread taking the next as it comes free. The feed-forward
 * runs its two products per block of rows, the hidden block staying in cache between them.
 * Every element of every product is one sum in k order (gemm_body.h), so the results are
 * bit-identical for 1 and N threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gemm.h"
#include "fa_kernels.h"
#include "fa_paths.h"
#include "fa_tiles.h"

/* Sizes (fa_tiles.h): bf16 training's products on the tiles run in blocks of at most ROW_BLOCK
 * rows. A weight that comes as it is (not packed) is packed by each call, however few its rows:
 * every product then has the engine's one summation order (a few rows with a weight as given
 * give the bits of the same rows in a larger batch, or with the packed weight). */

/* dst[i] = src[i] rounded to bf16, as float32 values (the bfloat16 compute type's rounding:
 * fa_round_bfloat16), for i < n; dst may be src */
static void round_bf16(float *dst, const float *src, int64_t n)
{
    if (n > 0) fa_k->bfc_round_row(dst, src, n, n, 1);
}

static void zero(float *p, int64_t n)
{
    if (p && n > 0) memset(p, 0, (size_t)n * sizeof(float));
}

/* ---- row blocks ------------------------------------------------------------------------------ */

/* Rows per block for a team of nt: about 4 blocks per thread (handed out dynamically), a
 * multiple of 48 (every tile height: the engine's 6 and 8, the bf16 tiles' 16 and 6), at most
 * `cap`. No result depends on it. */
static int64_t rows_per_block(int64_t N, int nt, int64_t cap)
{
    int64_t per = (N + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);
    per = (per + 47) / 48 * 48;
    return per < cap ? per : cap;
}

/* bf16 training: B for the tiles, when its path puts blocks of `rows` rows there (NULL: the
 * engine runs the products). *own: what the caller frees. */
static const fa_bf16_b *tiles_b(int bf16, const fa_bf16_b *given, int trans_b, int64_t rows,
                                int64_t K, int64_t N, const float *B, int64_t ldb,
                                fa_bf16_b **own)
{
    *own = NULL;
    return bf16 ? fa_bf16_b_for(given, trans_b, rows, K, N, B, ldb, own) : NULL;
}

/* ---- the engine's operands ------------------------------------------------------------------- */

/* A packed B of (K, N) for the engine (malloc'd, the team fills it), or NULL for K = 0 (the
 * engine reads nothing of it) ; *fail set when out of memory. */
static float *packed_b(int64_t K, int64_t N, int *fail)
{
    if (K <= 0 || N <= 0) return NULL;
    float *bp = malloc((size_t)fa_gemm_packed_size(K, N) * sizeof(float));
    if (!bp) *fail = 1;
    return bp;
}

/* ---- forward --------------------------------------------------------------------------------- */

/* fa_linear_forward, with the weight (M, K), or with ldt > 0 its transpose (K, ldt) */
static int linear_forward(float *y, float *pre, const float *x, const float *weight, int64_t ldt,
                          const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                          int bf16, const fa_bf16_b *wpack, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const double flops = 2.0 * (double)N * (double)K * (double)M;
    const int nt = fa_team_size(nthreads, flops, 2e5);
    /* bf16 training on the tiles: blocks of rows, each product on them */
    const int64_t per = rows_per_block(N, nt, ROW_BLOCK);
    fa_bf16_b *own = NULL;
    const fa_bf16_b *tb = ldt > 0 ? NULL : tiles_b(bf16, wpack, 1, per < N ? per : N, K, M,
                                                   weight, K, &own);
    if (tb) {
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1)
        for (int64_t r0 = 0; r0 < N; r0 += per) {
            const int64_t rows = N - r0 < per ? N - r0 : per;
            float *z = pre ? pre + r0 * M : y + r0 * M;
            fa_bf16_b_gemm(tb, 0, 1, rows, M, K, x + r0 * K, K, weight, K, 0.0f, z, M);
            fa_k->bias_act_rows(y + r0 * M, pre ? z : NULL, bias, rows, M, M, activation, r0, 0,
                                NULL);
        }
        fa_bf16_b_free(own);
        return 0;
    }
    /* the engine: the weight packed by the team, then the product's tasks */
    int fail = 0;
    float *bp = packed_b(K, M, &fail);
    if (fail) return -1;
    const fa_gemm_t g = {.M = N, .N = M, .K = K, .a = x, .lda = K, .bp = bp, .c = y, .pre = pre,
                         .ldc = M, .bias = bias, .act = activation};
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (bp) fa_gemm_pack_team(bp, ldt > 0 ? 0 : 1, K, M, weight, ldt > 0 ? ldt : K);
        fa_gemm_team(&g);
    }
    free(bp);
    return 0;
}

int fa_linear_forward(float *y, float *pre, const float *x, const float *weight,
                      const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                      int bf16, const fa_bf16_b *wpack, int nthreads)
{
    return linear_forward(y, pre, x, weight, 0, bias, N, K, M, activation, bf16, wpack,
                          nthreads);
}

int fa_linear_forward_t(float *y, const float *x, const float *wt, int64_t ldt, const float *bias,
                        int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    return linear_forward(y, NULL, x, wt, ldt, bias, N, K, M, activation, 0, NULL, nthreads);
}

/* ---- backward -------------------------------------------------------------------------------- */

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
 * single-threaded product on the bf16 tiles (bf16 training's operands; tn_on_tiles says where
 * they run), this thread's slice of b packed for them. */
static void gemm_tn_slice(float *c, const float *a, int64_t lda, const float *b, int64_t ldb,
                          int64_t R, int64_t M, int64_t P, int accumulate)
{
    const float beta = accumulate ? 1.0f : 0.0f;
    int64_t lo, hi;
    if (M >= P) {
        fa_split(M, COL_ALIGN, &lo, &hi);
        if (lo >= hi) return;
        fa_bf16_b *bp = fa_bf16_b_make(0, M, R, P, b, ldb);   /* M rows: the product's path */
        fa_bf16_b_gemm(bp, 1, 0, hi - lo, P, R, a + lo, lda, b, ldb, beta, c + lo * P, P);
        fa_bf16_b_free(bp);
    } else {
        fa_split(P, COL_ALIGN, &lo, &hi);
        if (lo >= hi) return;
        fa_bf16_b *bp = fa_bf16_b_make(0, M, R, hi - lo, b + lo, ldb);
        fa_bf16_b_gemm(bp, 1, 0, M, hi - lo, R, a, lda, b + lo, ldb, beta, c + lo, P);
        fa_bf16_b_free(bp);
    }
}

/* Whether bf16 training's weight gradient c (M, P) = a^T b runs on the bf16 tiles
 * (gemm_tn_slice), not on the engine: the path of a product of M rows, decided once for the
 * whole product (never per thread's slice: the team size must not change a bit) */
static int tn_on_tiles(int bf16, int64_t M)
{
    if (!bf16) return 0;
    fa_bf16_path_t path;
    return fa_paths_bfloat16(M, &path) != NULL;
}

/* c (M, P) = a^T b (+ c with accumulate), a (R, M) row stride lda, b (R, P) row stride ldb, by
 * the calling team: on the tiles (tiles set: gemm_tn_slice), or on the engine with b packed
 * into bp (fa_gemm_packed_size(R, P) floats; NULL for R = 0), the product into t (M, P) first
 * when accumulating, then added (c + the sum, the twin's order) */
static void gemm_tn_team(float *c, const float *a, int64_t lda, const float *b, int64_t ldb,
                         float *bp, float *t, int64_t R, int64_t M, int64_t P, int accumulate,
                         int tiles)
{
    if (tiles) {
        gemm_tn_slice(c, a, lda, b, ldb, R, M, P, accumulate);
        return;
    }
    if (bp) fa_gemm_pack_team(bp, 0, R, P, b, ldb);
    const fa_gemm_t g = {.M = M, .N = P, .K = R, .a = a, .lda = lda, .trans_a = 1, .bp = bp,
                         .c = accumulate ? t : c, .ldc = P, .act = FA_ACT_NONE};
    fa_gemm_team(&g);
    if (accumulate && t) { /* t: NULL for an empty c */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++) fa_gemm_add_rows(c, P, t, P, r, r + 1);
    }
}

/* scratch for an accumulated weight gradient (M, P) on the engine, or NULL */
static float *grad_scratch(int want, int64_t M, int64_t P, int *fail)
{
    if (!want || M <= 0 || P <= 0) return NULL;
    float *t = malloc((size_t)(M * P) * sizeof(float));
    if (!t) *fail = 1;
    return t;
}

/* c (N, P) = a b, a (N, R), b (R, P) row strides R and P (the input gradients dz w), by the
 * calling team: on the tiles in blocks of `per` rows (tb, bf16 training), else the engine with
 * b packed into bp (NULL for R = 0) */
static void gemm_nn_team(float *c, const float *a, const float *b, const fa_bf16_b *tb, float *bp,
                         int64_t N, int64_t R, int64_t P, int64_t per)
{
    if (tb) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t r0 = 0; r0 < N; r0 += per) {
            const int64_t rows = N - r0 < per ? N - r0 : per;
            fa_bf16_b_gemm(tb, 0, 0, rows, P, R, a + r0 * R, R, b, P, 0.0f, c + r0 * P, P);
        }
        return;
    }
    if (bp) fa_gemm_pack_team(bp, 0, R, P, b, P);
    const fa_gemm_t g = {.M = N, .N = P, .K = R, .a = a, .lda = R, .bp = bp, .c = c, .ldc = P,
                         .act = FA_ACT_NONE};
    fa_gemm_team(&g);
}

int fa_linear_backward(float *dx, float *dweight, float *dbias, float *dz,
                       const float *dy, const float *pre, const float *x, const float *weight,
                       int64_t N, int64_t K, int64_t M, int activation, int accumulate,
                       int bf16, const fa_bf16_b *wpack, int nthreads)
{
    if (M <= 0) { /* no outputs: dx is an empty sum */
        if (N > 0 && K > 0) zero(dx, N * K);
        return 0;
    }
    if (N <= 0) { /* no rows: the parameter gradients are empty sums */
        if (!accumulate) {
            zero(dweight, M * K);
            zero(dbias, M);
        }
        return 0;
    }
    const int act = activation;
    const float *g = act != FA_ACT_NONE || bf16 ? dz : dy;    /* dL/dz, z = x w^T + b */
    const double gemms = (dx != NULL) + (dweight != NULL);
    const int nt = fa_team_size(nthreads, 2.0 * gemms * (double)N * (double)K * (double)M
                                              + (double)N * (double)M, 2e5);
    const int64_t per = rows_per_block(N, nt, ROW_BLOCK);
    fa_bf16_b *own = NULL;
    const fa_bf16_b *tb = dx ? tiles_b(bf16, wpack, 0, per < N ? per : N, M, K, weight, K, &own)
                             : NULL;
    const int tn = dweight && tn_on_tiles(bf16, M);
    int fail = 0;
    float *bw = dx && !tb ? packed_b(M, K, &fail) : NULL;       /* op(B) = weight (M, K) */
    float *bx = dweight && !tn ? packed_b(N, K, &fail) : NULL;  /* x (N, K) */
    float *tw = grad_scratch(dweight && !tn && accumulate, M, K, &fail);
    if (!fail) {
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            /* dz = dy * act'(pre) (rounded to bf16 for bf16 training), by row blocks */
            if (g == dz) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t r0 = 0; r0 < N; r0 += per) {
                    const int64_t rows = N - r0 < per ? N - r0 : per;
                    if (act != FA_ACT_NONE)
                        fa_k->grad_act_rows(dz + r0 * M, NULL, dy + r0 * M, pre + r0 * M,
                                            rows, M, M, act, r0, 0, NULL);
                    if (bf16)
                        round_bf16(dz + r0 * M, act != FA_ACT_NONE ? dz + r0 * M : dy + r0 * M,
                                   rows * M);
                }
            }
            if (dx) gemm_nn_team(dx, g, weight, tb, bw, N, M, K, per);        /* dz w */
            if (dweight)                                                     /* dz^T x */
                gemm_tn_team(dweight, g, M, x, K, bx, tw, N, M, K, accumulate, tn);
            if (dbias) {                                                     /* sums of dz */
                int64_t m0, m1;
                fa_split(M, COL_ALIGN, &m0, &m1);
                col_sums(dbias, g, N, M, m0, m1, accumulate);
            }
        }
    }
    free(bw);
    free(bx);
    free(tw);
    fa_bf16_b_free(own);
    return fail ? -1 : 0;
}

/* ---- feed-forward ---------------------------------------------------------------------------- */

/* Rows per block of the feed-forward: its hidden block (rows, F) in half of L2 where that
 * leaves at least 48 rows, and about 4 blocks per thread; a multiple of 48 */
static int64_t ffn_rows(int64_t N, int64_t F, int nt)
{
    int64_t caches[3];
    fa_gemm_caches(caches);
    int64_t cap = caches[1] / 2 / (F * 4) / 48 * 48;
    cap = cap < 48 ? 48 : cap > ROW_BLOCK ? ROW_BLOCK : cap;
    return rows_per_block(N, nt, cap);
}

int fa_ffn_forward(float *y, float *pre, const float *x, const float *w1, const float *b1,
                   const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                   int activation, double dropout_p, uint64_t seed, int bf16,
                   const fa_bf16_b *pack1, const fa_bf16_b *pack2, const float *wp1,
                   const float *wp2, int nthreads)
{
    if (N <= 0 || C <= 0) return 0;
    if (F <= 0) { /* an empty hidden layer: y = b2 */
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) y[n * C + c] = b2 ? b2[c] : 0.0f;
        return 0;
    }
    const fa_dropout_t drop = fa_dropout_make(dropout_p, seed);
    const int nt = fa_team_size(nthreads, 4.0 * (double)N * (double)C * (double)F, 2e5);
    const int64_t per = ffn_rows(N, F, nt);
    fa_bf16_b *own1 = NULL, *own2 = NULL;
    const int64_t rows = per < N ? per : N;          /* rows per product, for the tiles' path */
    const fa_bf16_b *tb1 = wp1 ? NULL : tiles_b(bf16, pack1, 1, rows, C, F, w1, C, &own1);
    const fa_bf16_b *tb2 = wp2 ? NULL : tiles_b(bf16, pack2, 1, rows, F, C, w2, F, &own2);
    int fail = 0;
    float *bp1 = wp1 || tb1 ? NULL : packed_b(C, F, &fail);
    float *bp2 = wp2 || tb2 ? NULL : packed_b(F, C, &fail);
    /* fewer than two blocks per thread (and no tiles): each product by the whole team, the
     * (N, F) hidden between them */
    const int whole = !tb1 && !tb2 && nt > 1 && (N + per - 1) / per < 2 * (int64_t)nt;
    const int64_t hrows = whole ? N : per * nt;
    float *hidden = fail ? NULL : malloc((size_t)(hrows * F) * sizeof(float));
    if (!hidden) fail = 1;
    const float *p1 = wp1 ? wp1 : bp1, *p2 = wp2 ? wp2 : bp2;
    if (!fail) {
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            if (whole) {
                if (bp1) fa_gemm_pack_team(bp1, 1, C, F, w1, C);
                if (bp2) fa_gemm_pack_team(bp2, 1, F, C, w2, F);
                const fa_gemm_t g1 = {.M = N, .N = F, .K = C, .a = x, .lda = C, .bp = p1,
                                      .c = hidden, .pre = pre, .ldc = F, .bias = b1,
                                      .act = activation, .drop = &drop};
                fa_gemm_team(&g1);
                if (bf16) {
                    int64_t lo, hi;
                    fa_split(N, 1, &lo, &hi);
                    if (lo < hi) round_bf16(hidden + lo * F, hidden + lo * F, (hi - lo) * F);
#pragma omp barrier
                }
                const fa_gemm_t g2 = {.M = N, .N = C, .K = F, .a = hidden, .lda = F, .bp = p2,
                                      .c = y, .ldc = C, .bias = b2, .act = FA_ACT_NONE};
                fa_gemm_team(&g2);
            } else {
                if (bp1) fa_gemm_pack_team(bp1, 1, C, F, w1, C);
                if (bp2) fa_gemm_pack_team(bp2, 1, F, C, w2, F);
                float *h = hidden + per * F * fa_thread_id(); /* id < team <= nt blocks */
#pragma omp for schedule(dynamic, 1)
                for (int64_t r0 = 0; r0 < N; r0 += per) {
                    const int64_t rows = N - r0 < per ? N - r0 : per;
                    float *p_r = pre ? pre + r0 * F : NULL, *y_r = y + r0 * C;
                    if (tb1) {
                        fa_bf16_b_gemm(tb1, 0, 1, rows, F, C, x + r0 * C, C, w1, C, 0.0f,
                                       p_r ? p_r : h, F);
                        fa_k->bias_act_rows(h, p_r, b1, rows, F, F, activation, r0, 0, &drop);
                    } else {
                        const fa_gemm_t g1 = {.M = rows, .N = F, .K = C, .a = x + r0 * C, .lda = C,
                                              .bp = p1, .c = h, .pre = p_r, .ldc = F, .bias = b1,
                                              .act = activation, .drop = &drop, .row0 = r0};
                        fa_gemm_rows(&g1, 0, rows);
                    }
                    if (bf16) round_bf16(h, h, rows * F);
                    if (tb2) {
                        fa_bf16_b_gemm(tb2, 0, 1, rows, C, F, h, F, w2, F, 0.0f, y_r, C);
                        fa_k->bias_act_rows(y_r, NULL, b2, rows, C, C, FA_ACT_NONE, r0, 0, NULL);
                    } else {
                        const fa_gemm_t g2 = {.M = rows, .N = C, .K = F, .a = h, .lda = F, .bp = p2,
                                              .c = y_r, .ldc = C, .bias = b2, .act = FA_ACT_NONE,
                                              .row0 = r0};
                        fa_gemm_rows(&g2, 0, rows);
                    }
                }
            }
        }
    }
    free(hidden);
    free(bp1);
    free(bp2);
    fa_bf16_b_free(own1);
    fa_bf16_b_free(own2);
    return fail ? -1 : 0;
}

int fa_ffn_backward(float *dx, float *dw1, float *db1, float *dw2, float *db2,
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
        return 0;
    }
    const fa_dropout_t drop = fa_dropout_make(dropout_p, seed);
    const int nt = fa_team_size(nthreads, 8.0 * (double)N * (double)C * (double)F, 2e5);
    const int64_t per = rows_per_block(N, nt, ROW_BLOCK);
    fa_bf16_b *own1 = NULL, *own2 = NULL;
    const int64_t rows = per < N ? per : N;          /* rows per product, for the tiles' path */
    const fa_bf16_b *tb2 = tiles_b(bf16, pack2, 0, rows, C, F, w2, F, &own2);
    const fa_bf16_b *tb1 = dx ? tiles_b(bf16, pack1, 0, rows, F, C, w1, C, &own1) : NULL;
    const int tn2 = dw2 && tn_on_tiles(bf16, C), tn1 = dw1 && tn_on_tiles(bf16, F);
    int fail = 0;
    float *bw2 = tb2 ? NULL : packed_b(C, F, &fail);             /* op(B) = w2 (C, F) */
    float *bw1 = dx && !tb1 ? packed_b(F, C, &fail) : NULL;      /* op(B) = w1 (F, C) */
    float *bh = dw2 && !tn2 ? packed_b(N, F, &fail) : NULL;      /* h (N, F) */
    float *bx = dw1 && !tn1 ? packed_b(N, C, &fail) : NULL;      /* x (N, C) */
    float *t2 = grad_scratch(dw2 && !tn2 && accumulate, C, F, &fail);
    float *t1 = grad_scratch(dw1 && !tn1 && accumulate, F, C, &fail);
    if (!fail) {
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            /* dh = dy w2 (into h); then h = drop(act(pre)) and dpre = dh * drop' * act'(pre) in one
             * pass by row blocks; then dx = dpre w1 */
            gemm_nn_team(h, dy, w2, tb2, bw2, N, C, F, per);
#pragma omp for schedule(dynamic, 1)
            for (int64_t r0 = 0; r0 < N; r0 += per) {
                const int64_t rows = N - r0 < per ? N - r0 : per;
                float *h_r = h + r0 * F, *d_r = dpre + r0 * F;
                fa_k->grad_act_rows(d_r, h_r, h_r, pre + r0 * F, rows, F, F, activation, r0, 0,
                                    &drop);
                if (bf16) {
                    round_bf16(h_r, h_r, rows * F);
                    round_bf16(d_r, d_r, rows * F);
                }
            }
            if (dx) gemm_nn_team(dx, dpre, w1, tb1, bw1, N, F, C, per);
            /* parameter gradients */
            if (dw2) gemm_tn_team(dw2, dy, C, h, F, bh, t2, N, C, F, accumulate, tn2); /* dy^T h */
            if (dw1)                                                              /* dpre^T x */
                gemm_tn_team(dw1, dpre, F, x, C, bx, t1, N, F, C, accumulate, tn1);
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
    }
    free(t1);
    free(t2);
    free(bw2);
    free(bw1);
    free(bh);
    free(bx);
    fa_bf16_b_free(own1);
    fa_bf16_b_free(own2);
    return fail ? -1 : 0;
}

/* ---- packed weights -------------------------------------------------------------------------- */

int64_t fa_packed_size(int64_t M, int64_t K) { return fa_gemm_packed_size(K, M); }

void fa_pack_panels(float *wp, const float *w, int64_t M, int64_t K, int nthreads)
{
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)M * (double)K, 1e6);
#pragma omp parallel num_threads(nt) if (nt > 1)
    fa_gemm_pack_team(wp, 1, K, M, w, K);
}

void fa_linear_packed_forward(float *y, const float *x, const float *wp, const float *bias,
                              int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    const fa_gemm_t g = {.M = N, .N = M, .K = K, .a = x, .lda = K, .bp = wp, .c = y, .ldc = M,
                         .bias = bias, .act = activation};
    fa_gemm_run(&g, nthreads);
}
