/* quant.c -- int8 (per-row scales, dynamic per-row activation quantisation, exact int32 sums)
 * and bf16 (widened to float32 in registers) weight products; the int8 path chosen at import.
 * The rules (rounding, the epilogue's float formula) are in fastattn.h. */
#define _GNU_SOURCE   /* syscall() under -std=c11 (the AMX permission request) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fa_blas.h"
#include "fastattn.h"

#define FA_BODY "quant_body.h"
#include "fa_instantiate.h"

typedef void (*epi_fn)(float *, float *, const float *, int64_t, int64_t, int64_t, int, int64_t,
                       int64_t, const fa_dropout_t *);

/* ---- the int8 path ---------------------------------------------------------------------------- */

static fa_int8_path_t g_path = FA_INT8_GENERIC;

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
#endif
    default:
        return 0;
    }
}

int fa_int8_path(void) { return g_path; }

/* ---- AMX detection (reported only) ----------------------------------------------------------- */

static int g_amx = 0;

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FA_ARCH_REQ_XCOMP_PERM 0x1023
#define FA_XFEATURE_XTILEDATA 18

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
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
    if ((st & 4) && syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) == 0)
        st |= 8;
    return st;
}
#else
static int amx_probe(void) { return 0; }
#endif

int fa_amx_status(void) { return g_amx; }

int fa_int8_init(int forced)
{
    static int probed = 0;
    if (!probed) {
        g_amx = amx_probe();
        probed = 1;
    }
    if (forced >= 0) {
        if (!fa_int8_supports(forced)) return -1;
        g_path = (fa_int8_path_t)forced;
        return 0;
    }
    g_path = fa_int8_supports(FA_INT8_AVX512VNNI) ? FA_INT8_AVX512VNNI
           : fa_int8_supports(FA_INT8_AVX512BW)   ? FA_INT8_AVX512BW
           : fa_int8_supports(FA_INT8_AVX2)       ? FA_INT8_AVX2
                                                  : FA_INT8_GENERIC;
    return 0;
}

/* ---- layouts ------------------------------------------------------------------------------------
 * int8: panels of NP features; in a panel, K in groups of G: wp[p][kg][f][g] = q[p NP + f][kg G
 * + g], zero past M and past K. (G = 4: one int32 lane of vpdpbusd; G = 2: one of vpmaddwd.) */
static const int64_t PANEL_OF[4] = {16, 32, 64, 64};
static const int64_t GROUP_OF[4] = {2, 2, 2, 4};
#define BF_PANEL 64     /* bf16: wp[p][k][f] = w[p BF_PANEL + f][k] */

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t fa_int8_packed_size(int64_t M, int64_t K)
{
    return round_up(M, PANEL_OF[g_path]) * round_up(K, GROUP_OF[g_path]);
}

int64_t fa_int8_wsum_size(int64_t M) { return round_up(M, PANEL_OF[g_path]); }

void fa_int8_pack(int8_t *wp, int32_t *wsum, const int8_t *q, int64_t M, int64_t K,
                  int nthreads)
{
    const int64_t NP = PANEL_OF[g_path], G = GROUP_OF[g_path], Kp = round_up(K, G);
    const int64_t P = (M + NP - 1) / NP;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)(P * NP * Kp), 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        int8_t *w_p = wp + p * NP * Kp;
        for (int64_t f = 0; f < NP; f++) {
            const int64_t m = p * NP + f;
            int32_t s = 0;
            for (int64_t k = 0; k < Kp; k++) {
                const int8_t v = m < M && k < K ? q[m * K + k] : 0;
                w_p[(k / G) * NP * G + f * G + k % G] = v;
                s += v;
            }
            wsum[m] = -128 * s;
        }
    }
}

/* ---- quantisation (scalar math; the kernels' vector code computes exactly this) --------------- */

/* One row: scale and q as the rule in fastattn.h; returns 0, or -1 if the row is not finite. */
static int quantize_row(int8_t *q, float *scale, const float *x, int64_t K)
{
    uint32_t amax_bits = 0;               /* |x| as bits: NaN > inf > every finite value */
    for (int64_t k = 0; k < K; k++) {
        uint32_t b;
        memcpy(&b, x + k, 4);
        b &= 0x7fffffffu;
        amax_bits = b > amax_bits ? b : amax_bits;
    }
    if (amax_bits >= 0x7f800000u) {
        *scale = NAN;
        memset(q, 0, (size_t)K);
        return -1;
    }
    float amax;
    memcpy(&amax, &amax_bits, 4);
    if (amax < FA_INT8_MIN_AMAX) {                          /* zeros, or 127 / amax = inf */
        *scale = 0.0f;
        memset(q, 0, (size_t)K);
        return 0;
    }
    *scale = amax / 127.0f;
    const float inv = 127.0f / amax;
    for (int64_t k = 0; k < K; k++) {
        float t = x[k] * inv;                              /* |t| <= 127 (1 + 2^-23) */
        t = t > 127.0f ? 127.0f : t < -127.0f ? -127.0f : t;
        q[k] = (int8_t)lrintf(t);
    }
    return 0;
}

int64_t fa_quantize_int8(int8_t *q, float *scale, const float *x, int64_t N, int64_t K,
                         int nthreads)
{
    int64_t bad = N;
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)N * (double)K, 1e5);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static) reduction(min : bad)
    for (int64_t n = 0; n < N; n++)
        if (quantize_row(q + n * K, scale + n, x + n * K, K) != 0 && n < bad) bad = n;
    return bad == N ? -1 : bad;
}

/* fl(fl(a * s) + b) without a fused multiply-add: the asm keeps the product a float32 value. */
static inline float mul_add_rounded(float a, float s, float b)
{
    float t = a * s;
    __asm__("" : "+x"(t));
    return t + b;
}

int fa_linear_int8_forward(float *y, const float *x, const int8_t *wp, const int32_t *wsum,
                           const float *scale, const float *bias, int64_t N, int64_t K,
                           int64_t M, int activation, int nthreads)
{
    if (N <= 0 || M <= 0) return 0;
    const int64_t NP = PANEL_OF[g_path], G = GROUP_OF[g_path], Kp = round_up(K, G);
    int8_t *xq = malloc((size_t)(N * (K > 0 ? K : 1)));
    float *sx = malloc((size_t)N * sizeof(float));
    if (!xq || !sx) {
        free(xq);
        free(sx);
        return -1;
    }
    fa_quantize_int8(xq, sx, x, N, K, nthreads);
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, 2.0 * (double)N * (double)K * (double)M,
                                            2e5);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *x_n = xq + n * K;
        for (int64_t m = 0; m < M; m++) {
            const int8_t *w_p = wp + (m / NP) * NP * Kp + (m % NP) * G;
            int32_t acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (int32_t)x_n[k] * (int32_t)w_p[(k / G) * NP * G + k % G];
            y[n * M + m] = mul_add_rounded((float)acc, sx[n] * scale[m], bias ? bias[m] : 0.0f);
        }
        epi(y + n * M, NULL, NULL, 1, M, M, activation, n, 0, NULL);
    }
    (void)wsum;
    free(xq);
    free(sx);
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

static inline float bf16_widen(uint16_t h)
{
    const uint32_t b = (uint32_t)h << 16;
    float v;
    memcpy(&v, &b, 4);
    return v;
}

void fa_to_bfloat16(uint16_t *bits, const float *x, int64_t n, int nthreads)
{
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 1e6);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) bits[i] = bf16_round(x[i]);
}

int64_t fa_bf16_packed_size(int64_t M, int64_t K) { return round_up(M, BF_PANEL) * K; }

void fa_bf16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads)
{
    const int64_t P = (M + BF_PANEL - 1) / BF_PANEL;
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
    const epi_fn epi = FA_DISPATCH(bias_act_rows_);
    const int nt = fa_team_size(nthreads < P ? nthreads : (int)P,
                                2.0 * (double)N * (double)K * (double)M, 2e5);
    float *wide = malloc((size_t)(nt * (K > 0 ? K : 1) * BF_PANEL) * sizeof(float));
    float *tile = malloc((size_t)(nt * N * BF_PANEL) * sizeof(float));
    if (!wide || !tile) {
        free(wide);
        free(tile);
        return -1;
    }
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *w_t = wide + fa_thread_id() * K * BF_PANEL;
        float *z_t = tile + fa_thread_id() * N * BF_PANEL;
        int64_t p0, p1;
        fa_split(P, 1, &p0, &p1);
        for (int64_t p = p0; p < p1; p++) {
            for (int64_t i = 0; i < K * BF_PANEL; i++) w_t[i] = bf16_widen(wp[p * K * BF_PANEL + i]);
            const int64_t m0 = p * BF_PANEL, nf = M - m0 < BF_PANEL ? M - m0 : BF_PANEL;
            fa_sgemm_rowmajor(0, 0, N, BF_PANEL, K, 1.0f, x, K, w_t, BF_PANEL, 0.0f, z_t,
                              BF_PANEL);
            for (int64_t n = 0; n < N; n++)
                for (int64_t f = 0; f < nf; f++)
                    y[n * M + m0 + f] = z_t[n * BF_PANEL + f] + (bias ? bias[m0 + f] : 0.0f);
            epi(y + m0, NULL, NULL, N, nf, M, activation, 0, m0, NULL);
        }
    }
    free(wide);
    free(tile);
    return 0;
}
