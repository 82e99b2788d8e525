/* quant.c -- int8 (per-row scales, dynamic per-row activation quantisation, exact int32 sums)
 * and bf16 (widened to float32 in registers) weight products: the int8 path chosen at import,
 * packing, and the thread loops over the path's tiles (quant_<arch>.c) and the ISA level's
 * quantiser and bf16 kernels (quant_body.h). The rules (rounding, the epilogue's float formula)
 * are in fastattn.h. */
#define _GNU_SOURCE   /* syscall() under -std=c11 (the AMX permission request) */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fa_blas.h"
#include "fa_kernels.h"
#include "fa_tiles.h"

/* ---- the int8 path ---------------------------------------------------------------------------- */

static fa_int8_path_t g_path = FA_INT8_GENERIC;
static const fa_q8_kernels *g_q8 = &fa_q8_generic;   /* g_path's kernels */
static int amx_status(void);

/* The kernels of an int8 path (one this build has: fa_int8_supports checks the CPU) */
static const fa_q8_kernels *q8_of(int path)
{
    switch (path) {
#if defined(FA_HAVE_V3)
    case FA_INT8_AVX2:
        return &fa_q8_avx2;
#endif
#if defined(FA_HAVE_V4)
    case FA_INT8_AVX512BW:
        return &fa_q8_avx512bw;
    case FA_INT8_AVX512VNNI:
        return &fa_q8_avx512vnni;
    case FA_INT8_AMX_EMULATED:
        return &fa_q8_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_INT8_AMX:
        return &fa_q8_amx;
#endif
    default:
        return &fa_q8_generic;
    }
}

int fa_int8_supports(int path)
{
    switch (path) {
    case FA_INT8_GENERIC:
        return 1;
    case FA_INT8_AVX2:
        return fa_cpu_level() >= FA_ISA_AVX2;
    case FA_INT8_AVX512BW:
        return fa_cpu_level() >= FA_ISA_AVX512;           /* x86-64-v4 includes AVX-512BW */
#if defined(FA_HAVE_V4)
    case FA_INT8_AVX512VNNI:
        __builtin_cpu_init();
        return fa_cpu_level() >= FA_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    case FA_INT8_AMX_EMULATED:
        return fa_cpu_level() >= FA_ISA_AVX512;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_INT8_AMX:         /* the CPU's int8 and bf16 tiles, their state enabled by the OS */
        return fa_cpu_level() >= FA_ISA_AVX512 && (amx_status() & 7) == 7;
#endif
    default:
        return 0;
    }
}

int fa_int8_path(void) { return g_path; }

/* ---- AMX detection ---------------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FA_ARCH_GET_XCOMP_PERM 0x1022
#define FA_ARCH_REQ_XCOMP_PERM 0x1023
#define FA_XFEATURE_XTILEDATA 18

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux has granted this process the tile data (asked for only by amx_request: once granted,
 * the kernel refuses any later too-small sigaltstack in the process, so it is not asked for at
 * import, only when the amx path is chosen) */
static int amx_permitted(void)
{
    uint64_t features = 0;
    return syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &features) == 0 &&
           ((features >> FA_XFEATURE_XTILEDATA) & 1);
}

static int amx_request(void)
{
    return syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) == 0;
}

static int amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tile = (d >> 24) & 1, int8 = (d >> 25) & 1, bf16 = (d >> 22) & 1;
    int st = (tile && int8 ? 1 : 0) | (tile && bf16 ? 2 : 0);
    if (!st) return 0;
    unsigned a1, b1, c1, d1;
    if (__get_cpuid(1, &a1, &b1, &c1, &d1) && ((c1 >> 27) & 1)) {     /* OSXSAVE */
        if ((xgetbv0() & (3u << 17)) == (3u << 17)) st |= 4;          /* XTILECFG, XTILEDATA */
    }
    return st;
}
#else
static int amx_permitted(void) { return 0; }
static int amx_request(void) { return 0; }
static int amx_probe(void) { return 0; }
#endif

static int amx_status(void);
static int cpu_has_avx512bf16(void);

int fa_amx_grant(void) { return amx_permitted() || amx_request(); }

/* the bf16 tiles can run: AMX-BF16 enabled by the OS, and AVX512_BF16, whose vcvtneps2bf16
 * rounds the tiles' inputs (quant_amx.h: amx_round_row; every AMX-BF16 CPU has it) */
int fa_amx_bf16_usable(void) { return (amx_status() & 6) == 6 && cpu_has_avx512bf16(); }

/* bits 0-2 of fa_amx_status, probed once (fa_int8_supports may run before fa_int8_init) */
static int amx_status(void)
{
    static int st = -1;
    if (st < 0) st = amx_probe();
    return st;
}

int fa_amx_status(void)
{
    const int st = amx_status();
    return st | ((st & 4) && amx_permitted() ? 8 : 0);
}

int fa_int8_init(int forced)
{
    if (forced >= 0) {
        if (!fa_int8_supports(forced)) return -1;
        if (forced == FA_INT8_AMX && !fa_amx_grant()) return -2;
        g_path = (fa_int8_path_t)forced;
        g_q8 = q8_of(g_path);
        return 0;
    }
    /* amx is chosen only when forced: its tile code is tested bit for bit against the twin
     * through amx-emulated on every AVX-512 CPU, but its speed on an AMX CPU is unknown */
    g_path = fa_int8_supports(FA_INT8_AVX512VNNI) ? FA_INT8_AVX512VNNI
           : fa_int8_supports(FA_INT8_AVX512BW)   ? FA_INT8_AVX512BW
           : fa_int8_supports(FA_INT8_AVX2)       ? FA_INT8_AVX2
                                                  : FA_INT8_GENERIC;
    g_q8 = q8_of(g_path);
    return 0;
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int fa_quant_tiles(int64_t *out)
{
    out[0] = g_q8->np;
    out[1] = g_q8->g;
    out[2] = g_q8->mr;
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
    return round_up(M, g_q8->np) * round_up(K, g_q8->g);
}

void fa_int8_pack(int8_t *wp, const int8_t *q, int64_t M, int64_t K, int nthreads)
{
    const int64_t NP = g_q8->np, G = g_q8->g, Kp = round_up(K, G), P = (M + NP - 1) / NP;
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

/* y (N, M) = act(0 + bias): a product over K = 0 (empty sums: nothing of the weight is read),
 * with either weight type; 0 + bias as the twin computes it (a -0 bias gives +0) */
static void empty_product(float *y, const float *bias, int64_t N, int64_t M, int activation,
                          const fa_kernels *isa)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) y[n * M + m] = 0.0f + (bias ? bias[m] : 0.0f);
    isa->bias_act_rows(y, NULL, NULL, N, M, M, activation, 0, 0, NULL);
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
        if (act == FA_ACT_GELU || act == FA_ACT_GELU_TANH)
            im->isa->bias_act_rows(y + m0, NULL, NULL, rows, nf, M, act, 0, 0, NULL);
    }
}

int fa_linear_int8_forward(float *y, const float *x, const int8_t *wp, const float *scale,
                           const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                           int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const fa_q8_kernels *im = g_q8;
    if (K <= 0) {                       /* acc = 0, sx = 0: y = act(0 * 0 + bias) */
        empty_product(y, bias, N, M, activation, im->isa);
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
     * partial tile: blocks of any other height would each end in a slow short tile);
     * by panels: every thread quantises all N rows for itself (no barrier) */
    const int64_t nblk = by_rows ? round_up((N + Q8_ROW_BLOCK - 1) / Q8_ROW_BLOCK, nt) : 1;
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

/* ---- bf16 ------------------------------------------------------------------------------------- */

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

void fa_bf16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
{
    const int64_t P = (M + BF_PANEL - 1) / BF_PANEL;
    if (K <= 0) return;                 /* wp has no elements */
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * BF_PANEL * K), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        uint16_t *w_p = wp + p * K * BF_PANEL;
        for (int64_t f = 0; f < BF_PANEL; f++) {
            const int64_t m = p * BF_PANEL + f;
            for (int64_t k = 0; k < K; k++) w_p[k * BF_PANEL + f] = m < M ? w[m * K + k] : 0;
        }
    }
}

int fa_linear_bf16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                           int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const int64_t P = (M + BF_PANEL - 1) / BF_PANEL;
    if (K <= 0) {                       /* wp has no elements */
        empty_product(y, bias, N, M, activation, fa_k);
        return 0;
    }
    if (N > FA_BF16_PACKED_MAX_ROWS && g_q8->bf16_forward)     /* the AMX paths' tiles */
        return g_q8->bf16_forward(y, x, wp, bias, N, K, M, activation, nthreads);
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
     * panel's row k a contiguous run of BF_PANEL features; then the fp32 linear (BLAS) */
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
    fa_linear_forward_t(y, x, wide, ldt, bias, N, K, M, activation, nthreads);
    free(wide);
    return 0;
}

/* ---- bfloat16 compute (the rule in fastattn.h; tiles in quant_body.h) ------------------------ */

static fa_bf16_path_t g_bfc = FA_BF16_FMA;

int fa_bfloat16_cpu_has_avx512bf16(void) { return cpu_has_avx512bf16(); }

static int cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) && defined(__linux__)
    unsigned a, b, c, d;
    /* CPUID leaf 7 subleaf 1, EAX bit 5 (AVX512_BF16); zmm state is checked by the level */
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
#else
    return 0;
#endif
}

int fa_bfloat16_supports(int path)
{
    switch (path) {
    case FA_BF16_FMA:
        return 1;
    case FA_BF16_AVX512BF16:
        return fa_k->bfc_panel_dp != NULL && cpu_has_avx512bf16();
#if defined(FA_HAVE_V4)
    case FA_BF16_AMX_EMULATED:
        return fa_cpu_level() >= FA_ISA_AVX512;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_BF16_AMX:
        return fa_cpu_level() >= FA_ISA_AVX512 && fa_amx_bf16_usable();
#endif
    default:
        return 0;
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile float g_peak_sink;

/* Whether vdpbf16ps outruns two FMAs on this core: its throughput differs by CPU (on some it
 * is half the FMA rate per flop, on others nearly twice), and both paths give the same bits,
 * so the faster one is chosen by timing the two register-only loops, best of three (a few
 * milliseconds), once at import. */
static int dp_beats_fma(void)
{
    double dp = 1e30, fma = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = now_s();
        g_peak_sink = fa_k->bfc_dp_peak(20000);           /* 64 flops per instruction */
        t = now_s() - t;
        dp = t < dp ? t : dp;
        t = now_s();
        g_peak_sink = fa_k->bfc_fma_peak(40000);          /* 32: the same flops */
        t = now_s() - t;
        fma = t < fma ? t : fma;
    }
    return dp < 0.9 * fma;
}

/* The default path when the tiles are wanted but Linux refuses them (bfc_path) */
static fa_bf16_path_t g_bfc_fallback = FA_BF16_FMA;
/* Below this many rows a default amx hands the product to the vector path (g_bfc_fallback):
 * one or two rows (a greedy step of one sequence) stream the weight there at about the
 * memory's speed (the fma path's few-row kernel), while from 3 rows on (a batch's or a beam's
 * decode step) the vector tiles are bound by the FMA rate, and the AMX tiles, with the
 * threads splitting the weight's panels, stream it faster. A forced amx runs every size on
 * the tiles. */
#define BFC_AMX_MIN_ROWS (BFC_FEW_ROWS + 1)
static int g_bfc_forced = 0;
static int g_bfc_pending = 0; /* 1: amx chosen by default, the tile permission not asked yet */

/* The bfloat16 kernels' path, resolved: a default amx asks Linux for the tile data at the
 * first bf16 product (not at import: once granted, the kernel refuses any later sigaltstack
 * too small for the tile state, so a process that never multiplies in bf16 is not changed),
 * and falls back to the best vector path if refused. Concurrent first calls may both ask;
 * the request is idempotent. */
static fa_bf16_path_t bfc_path(void)
{
    if (__atomic_load_n(&g_bfc_pending, __ATOMIC_ACQUIRE)) {
        if (!fa_amx_grant())
            __atomic_store_n(&g_bfc, g_bfc_fallback, __ATOMIC_RELAXED);
        __atomic_store_n(&g_bfc_pending, 0, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&g_bfc, __ATOMIC_RELAXED);
}

int fa_bfloat16_init(int forced)
{
    g_bfc_pending = 0;
    g_bfc_forced = forced >= 0;
    if (forced >= 0) {
        if (!fa_bfloat16_supports(forced)) return -1;
        if (forced == FA_BF16_AMX && !fa_amx_grant()) return -2;
        g_bfc = (fa_bf16_path_t)forced;
        return 0;
    }
    g_bfc_fallback = fa_bfloat16_supports(FA_BF16_AVX512BF16) && dp_beats_fma()
                         ? FA_BF16_AVX512BF16
                         : FA_BF16_FMA;
    g_bfc = g_bfc_fallback;
    /* the tiles where the CPU has them: several times either vector path on many rows (fewer
     * than BFC_AMX_MIN_ROWS rows stay on the vector path) */
    if (fa_bfloat16_supports(FA_BF16_AMX)) {
        g_bfc = FA_BF16_AMX;
        g_bfc_pending = 1;
    }
    return 0;
}

int fa_bfloat16_path(void) { return bfc_path(); }

int fa_bfloat16_path_rows(int64_t N)
{
    const fa_bf16_path_t path = bfc_path();
    return path == FA_BF16_AMX && !g_bfc_forced && N < BFC_AMX_MIN_ROWS ? g_bfc_fallback : path;
}

struct fa_bf16_b {
    const fa_q8_kernels *q8; /* the tiles' path (real or emulated) */
    uint32_t *bq;
};

fa_bf16_b *fa_bf16_b_make(int trans_b, int64_t rows, int64_t K, int64_t N, const float *B,
                          int64_t ldb)
{
    if (rows <= 0 || K <= 0 || N <= 0) return NULL;
    const fa_q8_kernels *q8 = NULL;
    const fa_bf16_path_t path = (fa_bf16_path_t)fa_bfloat16_path_rows(rows);
#if defined(FA_HAVE_V4)
    if (path == FA_BF16_AMX_EMULATED) q8 = &fa_q8_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    if (path == FA_BF16_AMX) q8 = &fa_q8_amx;
#endif
    if (!q8 || !q8->bf16_pack_b) return NULL;
    fa_bf16_b *bp = malloc(sizeof *bp);
    if (!bp) return NULL;
    bp->q8 = q8;
    bp->bq = q8->bf16_pack_b(trans_b, K, N, B, ldb);
    if (!bp->bq) {
        free(bp);
        return NULL;
    }
    return bp;
}

void fa_bf16_b_gemm(const fa_bf16_b *bp, int trans_a, int trans_b, int64_t M, int64_t N,
                    int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float beta, float *C, int64_t ldc)
{
    if (bp && M > 0 &&
        bp->q8->bf16_gemm_packed(trans_a, M, N, K, A, lda, bp->bq, beta, C, ldc) == 0)
        return;
    fa_sgemm_rowmajor(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

void fa_bf16_b_free(fa_bf16_b *bp)
{
    if (!bp) return;
    free(bp->bq);
    free(bp);
}

const fa_bf16_b *fa_bf16_b_for(const fa_bf16_b *given, int trans_b, int64_t rows, int64_t K,
                               int64_t N, const float *B, int64_t ldb, fa_bf16_b **own)
{
    *own = NULL;
    if (!given) return *own = fa_bf16_b_make(trans_b, rows, K, N, B, ldb);
    const fa_bf16_path_t path = (fa_bf16_path_t)fa_bfloat16_path_rows(rows);
    return path == FA_BF16_AMX || path == FA_BF16_AMX_EMULATED ? given : NULL;
}

fa_bf16_b *fa_bf16_weight_pack(const float *w, int64_t M, int64_t K, int trans)
{
    /* as many rows as the tiles' path ever takes */
    return trans ? fa_bf16_b_make(1, INT64_MAX, K, M, w, K)
                 : fa_bf16_b_make(0, INT64_MAX, M, K, w, K);
}

void fa_bf16_weight_free(fa_bf16_b *packed) { fa_bf16_b_free(packed); }

static inline uint16_t bfc_round(uint16_t bits)          /* a bf16 weight, as bfr would */
{
    return (bits & 0x7f80u) == 0 ? (uint16_t)(bits & 0x8000u) : bits;
}

int64_t fa_bfloat16_packed_size(int64_t M, int64_t K)
{
    return round_up(M, BFC_NP) * round_up(K, 2);
}

void fa_bfloat16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
{
    const int64_t Kp = round_up(K, 2), P = (M + BFC_NP - 1) / BFC_NP;
    if (Kp == 0) return;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * BFC_NP * Kp), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        uint16_t *w_p = wp + p * BFC_NP * Kp;
        for (int64_t f = 0; f < BFC_NP; f++) {
            const int64_t m = p * BFC_NP + f;
            for (int64_t k = 0; k < Kp; k++)
                w_p[(k / 2) * BFC_NP * 2 + f * 2 + k % 2] =
                    m < M && k < K ? bfc_round(w[m * K + k]) : 0;
        }
    }
}

/* Start of row block blk of nblk over N rows: multiples of the tile height (every block but
 * the last ends on a whole tile) */
static int64_t bfc_block_start(int64_t blk, int64_t nblk, int64_t N)
{
    return blk >= nblk ? N : blk * N / nblk / BFC_TILE_ROWS * BFC_TILE_ROWS;
}

/* rows [r0, r1) of y, panels [p0, p1): the rows rounded into xr, every tile, the epilogue */
static void bfc_block(float *y, const float *x, char *xr, float *wf, int64_t r0, int64_t r1,
                      const uint32_t *w32, const float *bias, int64_t p0, int64_t p1, int64_t K,
                      int64_t Kp, int64_t M, int activation, int dp, const fa_kernels *isa)
{
    const int64_t esize = dp ? 2 : 4, Kh = Kp / 2, ldx = dp ? Kh : Kp;
    for (int64_t r = r0; r < r1; r++)
        isa->bfc_round_row(xr + (r - r0) * Kp * esize, x + r * K, K, Kp, !dp);
    if (!dp && r1 - r0 <= BFC_FEW_ROWS) {                /* a decode step's rows */
        isa->bfc_panels_few(y + r0 * M, M, xr, ldx, r1 - r0, w32, p0, p1, Kh, M);
        const int64_t m0 = p0 * BFC_NP, m1 = p1 * BFC_NP < M ? p1 * BFC_NP : M;
        isa->bias_act_rows(y + r0 * M + m0, NULL, bias ? bias + m0 : NULL, r1 - r0, m1 - m0, M,
                           activation, 0, m0, NULL);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const int64_t m0 = p * BFC_NP, nf = M - m0 < BFC_NP ? M - m0 : BFC_NP;
        (dp ? isa->bfc_panel_dp : isa->bfc_panel)(y + r0 * M + m0, M, xr, ldx, r1 - r0,
                                                  w32 + m0 * Kh, Kh, nf, wf);
        isa->bias_act_rows(y + r0 * M + m0, NULL, bias ? bias + m0 : NULL, r1 - r0, nf, M,
                           activation, 0, m0, NULL);
    }
}

int fa_linear_bfloat16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                               int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const fa_kernels *isa = fa_k;
    if (K <= 0) {
        empty_product(y, bias, N, M, activation, isa);
        return 0;
    }
    const fa_bf16_path_t path = (fa_bf16_path_t)fa_bfloat16_path_rows(N);
#if defined(FA_HAVE_V4)
    if (path == FA_BF16_AMX_EMULATED)
        return fa_q8_amx_emulated.bfloat16_forward(y, x, wp, bias, N, K, M, activation, nthreads);
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    if (path == FA_BF16_AMX)
        return fa_q8_amx.bfloat16_forward(y, x, wp, bias, N, K, M, activation, nthreads);
#endif
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
    const int64_t stride = xbytes + (dp ? 0 : 2 * BFC_KB * BFC_NP * 4);  /* + a widened block */
    char *buf = aligned_alloc(64, (size_t)(stride * nt));
    if (!buf) return -1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        char *xr = buf + stride * fa_thread_id();
        float *wf = (float *)(xr + xbytes);
        if (by_rows) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t blk = 0; blk < nblk; blk++) {
                const int64_t r0 = bfc_block_start(blk, nblk, N);
                const int64_t r1 = bfc_block_start(blk + 1, nblk, N);
                if (r1 > r0)
                    bfc_block(y, x, xr, wf, r0, r1, w32, bias, 0, P, K, Kp, M, activation,
                              dp, isa);
            }
        } else {
            int64_t p0, p1;
            fa_split(P, 1, &p0, &p1);
            if (p0 < p1)
                bfc_block(y, x, xr, wf, 0, N, w32, bias, p0, p1, K, Kp, M, activation, dp, isa);
        }
    }
    free(buf);
    return 0;
}

double fa_bfloat16_peak(int64_t iters, int nthreads, int fma)
{
    float (*const loop)(int64_t) = fma ? fa_k->bfc_fma_peak : fa_k->bfc_dp_peak;
    if (!loop || (!fma && !cpu_has_avx512bf16())) return -1.0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    g_peak_sink = loop(iters);
    return (fma ? 32.0 : 64.0) * 24.0 * (double)iters * (double)nthreads;
}
