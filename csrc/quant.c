/* quant.c -- int8 weight products (per-row scales, dynamic per-row activation quantisation,
 * exact int32 sums): packing, and the thread loops over the int8 path's tiles (quant_<arch>.c,
 * the path chosen by paths.c) and the ISA level's quantiser (quant_body.h). The rules (rounding,
 * the epilogue's float formula) are in fastattn.h. (bf16 weights: bf16.c.) */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fa_paths.h"
#include "fa_tiles.h"

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* the packed weight's layout: the same for every rows' kernels (fa_paths.h) */
static const fa_q8_kernels *layout(void) { return fa_paths_int8(INT64_MAX); }

int fa_quant_tiles(int64_t *out)
{
    out[0] = layout()->np;
    out[1] = layout()->g;
    out[2] = fa_paths_int8(INT64_MAX)->mr;
    out[3] = Q8_ROW_BLOCK;
    out[4] = Q8_MIN_ROWS;
    out[5] = BF_PANEL;
    out[6] = FA_BF16_PACKED_MAX_ROWS;
    out[7] = BFC_NP;
    return 8;
}

/* ---- int8 --------------------------------------------------------------------------------------
 * Packed weight: panels of np features, K in groups of g (see quant_int8.h):
 *   wp[p][kg][f][j] = q[p np + f][kg g + j], zero past M and K */

int64_t fa_int8_packed_size(int64_t M, int64_t K)
{
    return round_up(M, layout()->np) * round_up(K, layout()->g);
}

void fa_int8_pack(int8_t *wp, const int8_t *q, int64_t M, int64_t K, int nthreads)
{
    const int64_t NP = layout()->np, G = layout()->g, Kp = round_up(K, G), P = (M + NP - 1) / NP;
    if (Kp == 0) return;                /* no weights: wp has no elements */
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * NP * Kp), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        int8_t *w_p = wp + p * NP * Kp;
        for (int64_t f = 0; f < NP; f++) {
            const int64_t m = p * NP + f;
            for (int64_t k = 0; k < Kp; k++)
                w_p[(k / G) * NP * G + f * G + k % G] = m < M && k < K ? q[m * K + k] : 0;
        }
    }
}

int64_t fa_quantize_int8(int8_t *q, float *scale, const float *x, int64_t N, int64_t K,
                         int nthreads)
{
    if (K <= 0) {                       /* empty rows: amax = 0, scale 0 (q has no elements) */
        for (int64_t n = 0; n < N; n++) scale[n] = 0.0f;
        return -1;
    }
    int64_t bad = N;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)K, 1e5);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static) reduction(min : bad)
    for (int64_t n = 0; n < N; n++) {
        scale[n] = fa_k->q8_quant_row(q + n * K, x + n * K, K, K, Q8_FMT_I8);
        if (scale[n] != scale[n] && n < bad) bad = n;
    }
    return bad == N ? -1 : bad;
}

/* Start of row block blk of nblk over N rows (N for blk = nblk): blocks of about N / nblk
 * rows, each starting at a multiple of the tile height mr */
static int64_t q8_block_start(int64_t blk, int64_t nblk, int64_t N, int64_t mr)
{
    return blk >= nblk ? N : blk * N / nblk / mr * mr;
}

/* A product's activations on path q8: rows of x (row stride K) into the path's rows of xq (row
 * stride Kp int16, or as many bytes of Q8_FMT_HILO rows, which are zero from `rows` up to a
 * multiple of the tile height: the AMX tiles read whole 16-row blocks), scales into sx. */
static void q8_quant(const fa_q8_kernels *q8, int16_t *xq, float *sx, const float *x,
                     int64_t rows, int64_t K, int64_t Kp)
{
    if (q8->fmt == Q8_FMT_I16) {
        q8->isa->q8_quant_rows(xq, sx, x, rows, K, Kp);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        sx[r] = q8->isa->q8_quant_row(xq + r * Kp, x + r * K, K, Kp, q8->fmt);
    memset(xq + rows * Kp, 0, (size_t)((round_up(rows, q8->mr) - rows) * Kp) * 2);
}

/* Rows [r0, r0 + rows) of y, panels [p0, p1): every tile, then gelu (relu is in the tiles). */
static void q8_panels(const fa_q8_kernels *im, float *y, const int16_t *xq, const float *sx,
                      int64_t rows, int64_t Kp, const int8_t *wp, const float *scale,
                      const float *bias, int64_t p0, int64_t p1, int64_t M, int act)
{
    for (int64_t p = p0; p < p1; p++) {
        const int64_t m0 = p * im->np, nf = M - m0 < im->np ? M - m0 : im->np;
        im->panel(y + m0, M, xq, Kp, rows, wp + m0 * Kp, sx, scale + m0,
                  bias ? bias + m0 : NULL, Kp / im->g, nf, act == FA_ACT_RELU);
        if (act == FA_ACT_GELU || act == FA_ACT_GELU_TANH || act == FA_ACT_SILU)
            im->isa->bias_act_rows(y + m0, NULL, NULL, rows, nf, M, act, 0, 0, NULL);
    }
}

int fa_linear_int8_forward(float *y, const float *x, const int8_t *wp, const float *scale,
                           const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                           int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const fa_q8_kernels *im = fa_paths_int8(N);
    if (K <= 0) {                       /* acc = 0, sx = 0: y = act(0 * 0 + bias) */
        fa_empty_product(y, bias, N, M, activation, im->isa);
        return 0;
    }
    const int64_t Kp = round_up(K, im->g), P = (M + im->np - 1) / im->np;
    /* a second thread pays off from about 200K multiply-adds: a decode step's weights come
     * from L3 rather than L2 (its working set is many distinct weights), and two threads
     * stream them faster than one; only a weight already in L2 runs as fast on one thread */
    const int nt = fa_team_size(nthreads, (double)N * (double)K * (double)M, 2e5);
    const int by_rows = N >= (int64_t)nt * Q8_MIN_ROWS;
    /* by rows: blocks of about Q8_ROW_BLOCK rows, a multiple of the team in number (equal
     * shares), starting at multiples of the tile height (only the last block ends in a
     * partial tile: blocks of any other height would each end in a slow short tile); the AMX
     * tiles (max_block) take blocks as tall as half a thread's share, up to max_block rows and
     * AMX_BLOCK_BYTES of quantised rows (in L2), since each block reads the weight from L3;
     * by panels: every thread quantises all N rows for itself (no barrier) */
    int64_t rb = Q8_ROW_BLOCK;
    if (im->max_block > 0) {
        const int64_t fit = AMX_BLOCK_BYTES / (2 * Kp), half = N / (2 * nt);
        rb = half < rb ? rb : half;
        rb = rb < im->max_block ? rb : im->max_block;
        rb = rb < fit ? rb : fit;
        rb = rb > im->mr ? rb : im->mr;
    }
    const int64_t nblk = by_rows ? round_up((N + rb - 1) / rb, nt) : 1;
    /* the largest block, in whole tiles (the AMX path reads its rows in 16-row tiles) */
    const int64_t per = round_up(by_rows ? (N + nblk - 1) / nblk + im->mr : N, im->mr);
    const int64_t stride = round_up(per * Kp * 2 + per * 4, 64) + 64;  /* bytes per thread: int16
                                                                         * rows, then scales */
    char *buf = aligned_alloc(64, (size_t)(stride * nt));
    if (!buf) return -1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int16_t *xq = (int16_t *)(buf + stride * fa_thread_id());
        float *sx = (float *)((char *)xq + round_up(per * Kp * 2, 64));
        if (by_rows) {
            /* blocks handed out as threads come free: a thread slowed by other processes
             * takes fewer, rather than holding the team at the end (with equal static shares,
             * the others wait for it). Any split gives the same bits: a row's sums do not
             * depend on the block or thread that computes it. */
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = q8_block_start(blk, nblk, N, im->mr);
                const int64_t rows = q8_block_start(blk + 1, nblk, N, im->mr) - r0;
                if (rows <= 0) continue;
                q8_quant(im, xq, sx, x + r0 * K, rows, K, Kp);
                q8_panels(im, y + r0 * M, xq, sx, rows, Kp, wp, scale, bias, 0, P, M,
                          activation);
            }
        } else {
            int64_t p0, p1;
            fa_split(P, 1, &p0, &p1);
            if (p0 < p1) {
                q8_quant(im, xq, sx, x, N, K, Kp);
                q8_panels(im, y, xq, sx, N, Kp, wp, scale, bias, p0, p1, M, activation);
            }
        }
    }
    free(buf);
    return 0;
}

