/* bf16.c -- bf16 weights in inference: bf16 storage (weights widened to float32 in registers:
 * the few-row kernels, or the widened weight and the float32 linear) and the bfloat16 compute
 * type (both operands rounded to bf16: the FMA and AVX512_BF16 tiles of quant_body.h, or the
 * AMX tiles of bf16_amx.h where paths.c chooses them), with their packing and the bf16
 * conversions of arrays. The rules are in fastattn.h. (bf16 training's products: bf16_gemm.c.) */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fa_paths.h"
#include "fa_tiles.h"

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* ---- bf16 storage ------------------------------------------------------------------------------ */

static inline uint16_t bf16_round(float v)
{
    uint32_t b;
    memcpy(&b, &v, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x0040u);   /* NaN */
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

void fa_to_bfloat16(uint16_t *bits, const float *x, int64_t n, int nthreads)
{
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) bits[i] = bf16_round(x[i]);
}

/* the bf16 training's passes over activations (a few hundred thousand values a call) split
 * over the threads from this many values: their fork costs a few microseconds */
#define BF16_PASS_GRAIN 65536.0

/* src (n) rounded by bfc_round_row in chunks over the threads: float32 values (wide) or bits */
static void round_chunks(void *dst, const float *src, int64_t n, int wide, int nthreads)
{
    const int64_t chunk = 16384;
    const int64_t nchunks = (n + chunk - 1) / chunk;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, BF16_PASS_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        const int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
        void *d = wide ? (void *)((float *)dst + lo) : (void *)((uint16_t *)dst + lo);
        fa_k->bfc_round_row(d, src + lo, len, len, wide);
    }
}

void fa_round_bfloat16(float *dst, const float *src, int64_t n, int nthreads)
{
    round_chunks(dst, src, n, 1, nthreads);
}

void fa_round_bfloat16_bits(uint16_t *bits, const float *src, int64_t n, int nthreads)
{
    round_chunks(bits, src, n, 0, nthreads);
}

void fa_widen_bfloat16(float *dst, const uint16_t *bits, int64_t n, int nthreads)
{
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, BF16_PASS_GRAIN);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint32_t w = (uint32_t)bits[i] << 16;
        memcpy(dst + i, &w, sizeof w);
    }
}

int64_t fa_bf16_packed_size(int64_t M, int64_t K) { return round_up(M, BF_PANEL) * K; }

static inline uint16_t bfc_round(uint16_t bits)          /* a bf16 weight, as bfr would */
{
    return (bits & 0x7f80u) == 0 ? (uint16_t)(bits & 0x8000u) : bits;
}

/* w (M, K) bf16 bits into panels of NP features, K in groups of G (zero padded):
 * wp[p][kg][f][j] = w[p NP + f][kg G + j]; flush: subnormal bits become a zero of their sign
 * (bfloat16 compute's operand rounding, bfc_round) */
static void pack_bits(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int64_t NP,
                      int64_t G, int flush, int nthreads)
{
    const int64_t Kp = round_up(K, G), P = (M + NP - 1) / NP;
    if (Kp == 0) return;                /* no weights: wp has no elements */
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * NP * Kp), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        uint16_t *w_p = wp + p * NP * Kp;
        for (int64_t f = 0; f < NP; f++) {
            const int64_t m = p * NP + f;
            for (int64_t k = 0; k < Kp; k++) {
                const uint16_t b = m < M && k < K ? w[m * K + k] : 0;
                w_p[(k / G) * NP * G + f * G + k % G] = flush ? bfc_round(b) : b;
            }
        }
    }
}

void fa_bf16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
{
    pack_bits(wp, w, M, K, BF_PANEL, 1, 0, nthreads);
}

int fa_linear_bf16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                           int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const int64_t P = (M + BF_PANEL - 1) / BF_PANEL;
    if (K <= 0) {                       /* wp has no elements */
        fa_empty_product(y, bias, N, M, activation, fa_k);
        return 0;
    }
    const fa_amx_kernels *tiles = fa_paths_bf16_storage();
    if (N > FA_BF16_PACKED_MAX_ROWS && tiles)                  /* the AMX paths' tiles */
        return tiles->bf16_forward(y, x, wp, bias, N, K, M, activation, nthreads);
    if (N <= FA_BF16_PACKED_MAX_ROWS) {                /* few rows: stream the packed weight */
        const int nt FA_OMP_ONLY = fa_team_size(nthreads < P ? nthreads : (int)P,
                                                2.0 * (double)N * (double)K * (double)M, 2e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int64_t p0, p1;
            fa_split(P, 1, &p0, &p1);
            if (p0 < p1) {
                fa_k->bf16_packed_gemm(y, M, x, N, wp, p0, p1, M, K);
                const int64_t m0 = p0 * BF_PANEL, m1 = p1 * BF_PANEL < M ? p1 * BF_PANEL : M;
                fa_k->bias_act_rows(y + m0, NULL, bias ? bias + m0 : NULL, N, m1 - m0, M,
                                    activation, 0, m0, NULL);
            }
        }
        return 0;
    }
    /* many rows: the panels widened to float32 (exact) as weight^T (K, P BF_PANEL), each
     * panel's row k a contiguous run of BF_PANEL features; then the fp32 linear (the engine) */
    const int64_t ldt = P * BF_PANEL;
    float *wide = malloc((size_t)(ldt * K) * sizeof(float));             /* K > 0 here */
    if (!wide) return -1;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)M * (double)K, 1e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t lo, hi;
        fa_split(K, 1, &lo, &hi);
        if (lo < hi) fa_k->bf16_widen_t(wide, wp, lo, hi, K, P);
    }
    const int rc = fa_linear_forward_t(y, x, wide, ldt, bias, N, K, M, activation, nthreads);
    free(wide);
    return rc;
}

/* ---- bfloat16 compute (the rule in fastattn.h; tiles in quant_body.h) ------------------------ */

int64_t fa_bfloat16_packed_size(int64_t M, int64_t K)
{
    return round_up(M, BFC_NP) * round_up(K, 2);
}

void fa_bfloat16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
{
    pack_bits(wp, w, M, K, BFC_NP, 2, 1, nthreads);
}

/* Start of row block blk of nblk over N rows: multiples of the tile height (every block but
 * the last ends on a whole tile) */
static int64_t bfc_block_start(int64_t blk, int64_t nblk, int64_t N)
{
    return blk >= nblk ? N : blk * N / nblk / BFC_TILE_ROWS * BFC_TILE_ROWS;
}

/* How a bfloat16 product's rows come and go: float32 (x, y), or bf16 bits (xb: rows of K, the
 * operand rounding done already; yb: rows of M, the result after its epilogue rounded as the
 * operands are): the FFN's hidden (fa_ffn_bfloat16_forward), which only feeds a product. */
typedef struct {
    const uint16_t *xb;
    uint16_t *yb;
} bfc_io;

/* rows [r0, r1) of y (or io->yb), panels [p0, p1): the rows rounded into xr (or taken as
 * bits), every tile, the epilogue; tmp: one panel of the block in float32 (io->yb only) */
static void bfc_block(float *y, const float *x, char *xr, float *wf, float *tmp, int64_t r0,
                      int64_t r1, const uint32_t *w32, const float *bias, int64_t p0, int64_t p1,
                      int64_t K, int64_t Kp, int64_t M, int activation, int dp,
                      const fa_kernels *isa, const bfc_io *io)
{
    const int64_t esize = dp ? 2 : 4, Kh = Kp / 2, ldx = dp ? Kh : Kp;
    /* bf16 bits of an even K are the dp tiles' rows as they stand: read in place */
    const int in_place = io->xb && dp && Kp == K;
    const void *xin = in_place ? (const void *)(io->xb + r0 * K) : (const void *)xr;
    for (int64_t r = r0; r < r1 && !in_place; r++) {
        char *xr_r = xr + (r - r0) * Kp * esize;
        if (!io->xb) {
            isa->bfc_round_row(xr_r, x + r * K, K, Kp, !dp);
        } else if (dp) {                               /* the bits as they are, zero to Kp */
            memcpy(xr_r, io->xb + r * K, (size_t)K * 2);
            memset(xr_r + K * 2, 0, (size_t)(Kp - K) * 2);
        } else {                                       /* widened (exact) */
            uint32_t *w = (uint32_t *)xr_r;
            for (int64_t k = 0; k < Kp; k++)
                w[k] = k < K ? (uint32_t)io->xb[r * K + k] << 16 : 0;
        }
    }
    if (!io->yb && !dp && r1 - r0 <= BFC_FEW_ROWS) {   /* a decode step's rows */
        isa->bfc_panels_few(y + r0 * M, M, xr, ldx, r1 - r0, w32, p0, p1, Kh, M);
        const int64_t m0 = p0 * BFC_NP, m1 = p1 * BFC_NP < M ? p1 * BFC_NP : M;
        isa->bias_act_rows(y + r0 * M + m0, NULL, bias ? bias + m0 : NULL, r1 - r0, m1 - m0, M,
                           activation, 0, m0, NULL);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const int64_t m0 = p * BFC_NP, nf = M - m0 < BFC_NP ? M - m0 : BFC_NP;
        float *out = io->yb ? tmp : y + r0 * M + m0;
        const int64_t ldo = io->yb ? BFC_NP : M;
        (dp ? isa->bfc_panel_dp : isa->bfc_panel)(out, ldo, xin, ldx, r1 - r0, w32 + m0 * Kh,
                                                  Kh, nf, wf);
        isa->bias_act_rows(out, NULL, bias ? bias + m0 : NULL, r1 - r0, nf, ldo, activation, 0,
                           m0, NULL);
        if (io->yb)                                    /* still in L1: rounded to bits */
            for (int64_t r = 0; r < r1 - r0; r++)
                isa->bfc_round_row(io->yb + (r0 + r) * M + m0, tmp + r * BFC_NP, nf, nf, 0);
    }
}

static int bfloat16_product(float *y, const float *x, const uint16_t *wp, const float *bias,
                            int64_t N, int64_t K, int64_t M, int activation, int nthreads,
                            const bfc_io *io)
{
    const fa_kernels *isa = fa_k;
    fa_bf16_path_t path;
    const fa_amx_kernels *tiles = fa_paths_bfloat16(N, &path);
    if (tiles)
        return tiles->bfloat16_forward(y, x, wp, bias, N, K, M, activation, nthreads, io->xb,
                                       io->yb);
    const int dp = path == FA_BF16_AVX512BF16;
    const int64_t Kp = round_up(K, 2), P = (M + BFC_NP - 1) / BFC_NP;
    const int64_t esize = dp ? 2 : 4;                   /* bytes per rounded element */
    const uint32_t *w32 = (const uint32_t *)wp;
    const int nt = fa_team_size(nthreads, 2.0 * (double)N * (double)K * (double)M, 2e5);
    const int by_rows = N >= (int64_t)nt * BFC_MIN_ROWS;
    /* as the int8 product: blocks of rows handed out as threads come free, or (few rows) the
     * panels split, each thread rounding every row itself. A row's sums do not depend on its
     * block, tile or thread: every split gives the same bits. */
    const int64_t nblk = by_rows ? round_up((N + BFC_ROW_BLOCK - 1) / BFC_ROW_BLOCK, nt) : 1;
    const int64_t per = by_rows ? (N + nblk - 1) / nblk + BFC_TILE_ROWS : N;
    const int64_t xbytes = round_up(per * Kp * esize, 64);
    const int64_t tbytes = io->yb ? round_up(per * BFC_NP * 4, 64) : 0;
    const int64_t stride = xbytes + tbytes + (dp ? 0 : 2 * BFC_KB * BFC_NP * 4); /* + a
                                                                         widened block */
    char *buf = aligned_alloc(64, (size_t)(stride * nt));
    if (!buf) return -1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        char *xr = buf + stride * fa_thread_id();
        float *tmp = (float *)(xr + xbytes);
        float *wf = (float *)(xr + xbytes + tbytes);
        if (by_rows) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = bfc_block_start(blk, nblk, N);
                const int64_t r1 = bfc_block_start(blk + 1, nblk, N);
                if (r1 > r0)
                    bfc_block(y, x, xr, wf, tmp, r0, r1, w32, bias, 0, P, K, Kp, M,
                              activation, dp, isa, io);
            }
        } else {
            int64_t p0, p1;
            fa_split(P, 1, &p0, &p1);
            if (p0 < p1)
                bfc_block(y, x, xr, wf, tmp, 0, N, w32, bias, p0, p1, K, Kp, M, activation, dp,
                          isa, io);
        }
    }
    free(buf);
    return 0;
}

int fa_linear_bfloat16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                               int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    if (K <= 0) {
        fa_empty_product(y, bias, N, M, activation, fa_k);
        return 0;
    }
    const bfc_io io = {NULL, NULL};
    return bfloat16_product(y, x, wp, bias, N, K, M, activation, nthreads, &io);
}

/* The hidden as bf16 bits wherever it takes more than a decode step's rows and the path can
 * write it so (the tiles: when the first product's K is one chunk of theirs); it only feeds
 * the second product, which rounds it to exactly these bits: the same result as two products
 * through a float32 hidden, with a quarter of its memory traffic. */
int fa_ffn_bfloat16_forward(float *y, const float *x, const uint16_t *w1p, const float *b1,
                            const uint16_t *w2p, const float *b2, int64_t N, int64_t C,
                            int64_t F, int activation, int nthreads)
{
    if (N <= 0 || C <= 0) return 0;
    fa_bf16_path_t path;
    const int tiles = fa_paths_bfloat16(N, &path) != NULL;
    const int bits = N > BFC_FEW_ROWS && F > 0 && (!tiles || C <= AMX_KB * 32);
    void *h = malloc((size_t)(N * (F > 0 ? F : 1)) * (bits ? 2 : 4));
    if (!h) return -1;
    int rc;
    if (bits) {
        const bfc_io first = {NULL, h}, second = {h, NULL};
        rc = bfloat16_product(NULL, x, w1p, b1, N, C, F, activation, nthreads, &first);
        if (rc == 0)
            rc = bfloat16_product(y, NULL, w2p, b2, N, F, C, FA_ACT_NONE, nthreads, &second);
    } else {
        rc = fa_linear_bfloat16_forward(h, x, w1p, b1, N, C, F, activation, nthreads);
        if (rc == 0)
            rc = fa_linear_bfloat16_forward(y, h, w2p, b2, N, F, C, FA_ACT_NONE, nthreads);
    }
    free(h);
    return rc;
}

static volatile float g_peak_sink;

double fa_peak(int64_t iters, int nthreads, int kind)
{
    nthreads = fa_team_allowed(nthreads);
    if (kind == FA_PEAK_AMX_BF16 || kind == FA_PEAK_AMX_INT8) {
        /* the real tiles only (granted by Linux: asked for here), 4 TDP a step */
        const fa_amx_kernels *tiles = fa_paths_amx_tiles();
        if (!tiles || !tiles->tile_peak) return -1.0;
        const int int8 = kind == FA_PEAK_AMX_INT8;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
        g_peak_sink = tiles->tile_peak(iters, int8);
        return 4.0 * (int8 ? 32768.0 : 16384.0) * (double)iters * (double)nthreads;
    }
    /* fma: the level's own FMA loop (gemm_body.h; zmm or ymm), 48 x vector width flops an
     * iteration. The generic level has no FMA: -1. */
    const int fma = kind == FA_PEAK_FMA;
    float (*const loop)(int64_t) = kind == FA_PEAK_VDPBF16PS        ? fa_k->bfc_dp_peak
                                   : !fma                           ? NULL
                                   : fa_k->tiles.vector_width >= 8 ? fa_k->gemm_fma_peak
                                                                    : NULL;
    if (!loop || (!fma && !fa_bfloat16_cpu_has_avx512bf16())) return -1.0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    g_peak_sink = loop(iters);
    return (fma ? 48.0 * (double)fa_k->tiles.vector_width : 64.0 * 24.0) * (double)iters *
           (double)nthreads;
}
