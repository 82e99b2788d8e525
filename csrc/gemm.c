/* gemm.c -- the float32 GEMM engine's driver (fa_gemm.h): cache blocking from the CPU's cache
 * sizes, packing of B, and the tasks a team shares. The tiles are per ISA (gemm_body.h, through
 * fa_k->gemm_block).
 *
 * Blocking, after BLIS's loops around a register tile: the tile's rows of op(A) (SK_RB x kc)
 * stay in L1 while it streams one panel's K block (kc x FA_PANEL) from L2, where a task's group
 * of nbp panels stays while every row tile of its block passes over it. kc is what half of L1
 * holds of the broadcast side; nbp what half of L2 holds of panels. A task is mb rows x nbp
 * panels; the tasks of a product are handed out one at a time to whichever thread is free, so
 * a core slowed by a neighbour takes fewer (no static halves). None of these sizes changes a
 * result (gemm_body.h: one sum per element, in k order). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fa_gemm.h"
#include "fa_tiles.h"

static int64_t cache_l1 = 32 << 10, cache_l2 = 1 << 20, cache_l3 = 8 << 20;

static int64_t cache_size(int name, int64_t fallback)
{
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    const long v = sysconf(name);
    return v >= 4096 ? (int64_t)v : fallback;
#else
    (void)name;
    return fallback;
#endif
}

void fa_gemm_init(void)
{
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    cache_l1 = cache_size(_SC_LEVEL1_DCACHE_SIZE, cache_l1);
    cache_l2 = cache_size(_SC_LEVEL2_CACHE_SIZE, cache_l2);
    cache_l3 = cache_size(_SC_LEVEL3_CACHE_SIZE, cache_l3);
#endif
}

void fa_gemm_caches(int64_t out[3])
{
    out[0] = cache_l1;
    out[1] = cache_l2;
    out[2] = cache_l3;
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* K block for tiles of tr rows: the row tile's kc floats per row in half of L1 (a multiple of
 * 16) */
static int64_t k_block(int64_t tr) { return clamp64((cache_l1 / 2) / (tr * 4) / 16 * 16, 64, 1024); }

int fa_gemm_info(int isa, int64_t *out)
{
    const fa_kernels *k = fa_kernels_of(isa);
    if (!k) return -1;
    out[0] = cache_l1;
    out[1] = cache_l2;
    out[2] = cache_l3;
    out[3] = k_block(k->tiles.packed_tile_rows);
    return 4;
}

fa_gemm_plan fa_gemm_plan_for(int64_t M, int64_t N, int64_t K, int trans_a, int nt)
{
    const int64_t tr = fa_k->tiles.packed_tile_rows;
    fa_gemm_plan p;
    /* op(A) transposed and read in place (AVX-512): a tile's rows of one k are a piece of a
     * cache line, so each k holds a whole line in L1: half the K block keeps the same bytes */
    p.kc = trans_a ? clamp64(k_block(tr) / 2 / 16 * 16, 64, 1024) : k_block(tr);
    if (K > 0 && K < p.kc + p.kc / 2) p.kc = K;          /* no short last block */
    const int64_t kc = K > 0 && K < p.kc ? K : p.kc;
    /* panels per task: its panels' K blocks in half of L2 */
    p.nbp = clamp64((cache_l2 / 2) / (kc * FA_PANEL * 4), 1, 64);
    p.mb = 16 * tr;
    /* at least 4 tasks per thread where the product allows, for the dynamic handout */
    const int64_t P = (N + FA_PANEL - 1) / FA_PANEL;
    for (;;) {
        const int64_t tasks = ((M + p.mb - 1) / p.mb) * ((P + p.nbp - 1) / p.nbp);
        if (tasks >= 4 * (int64_t)nt || nt <= 1) break;
        if (p.nbp > 1)
            p.nbp = (p.nbp + 1) / 2;
        else if (p.mb > tr)
            p.mb = (p.mb / 2 + tr - 1) / tr * tr;
        else
            break;
    }
    return p;
}

int64_t fa_gemm_packed_size(int64_t K, int64_t N)
{
    return (N + FA_PANEL - 1) / FA_PANEL * FA_PANEL * (K > 0 ? K : 0);
}

void fa_gemm_pack_panels(float *bp, int trans_b, int64_t K, int64_t N, const float *B,
                         int64_t ldb, int64_t p0, int64_t p1)
{
    enum { KB = 64 }; /* trans_b: K in blocks, the panel's KB rows written while in L1 */
    for (int64_t p = p0; p < p1; p++) {
        float *dst = bp + p * K * FA_PANEL;
        const int64_t m0 = p * FA_PANEL, width = N - m0 < FA_PANEL ? N - m0 : FA_PANEL;
        if (!trans_b) {
            for (int64_t k = 0; k < K; k++) {
                memcpy(dst + k * FA_PANEL, B + k * ldb + m0, (size_t)width * sizeof(float));
                memset(dst + k * FA_PANEL + width, 0, (size_t)(FA_PANEL - width) * sizeof(float));
            }
            continue;
        }
        for (int64_t k0 = 0; k0 < K; k0 += KB) {
            const int64_t k1 = K - k0 < KB ? K : k0 + KB;
            for (int64_t f = 0; f < FA_PANEL; f++) {
                float *d = dst + f;
                if (f >= width) {
                    for (int64_t k = k0; k < k1; k++) d[k * FA_PANEL] = 0.0f;
                    continue;
                }
                const float *s = B + (m0 + f) * ldb;
                for (int64_t k = k0; k < k1; k++) d[k * FA_PANEL] = s[k];
            }
        }
    }
}

void fa_gemm_pack_team(float *bp, int trans_b, int64_t K, int64_t N, const float *B,
                       int64_t ldb)
{
    const int64_t P = (N + FA_PANEL - 1) / FA_PANEL;
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < P; p++) fa_gemm_pack_panels(bp, trans_b, K, N, B, ldb, p, p + 1);
}

void fa_gemm_team(const fa_gemm_t *g)
{
    if (g->M <= 0 || g->N <= 0) return;
    const fa_gemm_plan pl = fa_gemm_plan_for(g->M, g->N, g->K, g->trans_a, fa_team());
    const int64_t P = (g->N + FA_PANEL - 1) / FA_PANEL;
    const int64_t njb = (P + pl.nbp - 1) / pl.nbp, nib = (g->M + pl.mb - 1) / pl.mb;
    /* task t: row block t / njb, panel group t % njb (a thread's next task mostly shares its
     * rows, still in cache) */
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nib * njb; t++) {
        const int64_t r0 = (t / njb) * pl.mb, p0 = (t % njb) * pl.nbp;
        fa_k->gemm_block(g, r0, g->M - r0 < pl.mb ? g->M : r0 + pl.mb, p0,
                         P - p0 < pl.nbp ? P : p0 + pl.nbp, pl.kc);
    }
}

void fa_gemm_run(const fa_gemm_t *g, int nthreads)
{
    if (g->M <= 0 || g->N <= 0) return;
    const int nt FA_OMP_ONLY =
        fa_team_size(nthreads, 2.0 * (double)g->M * (double)g->N * (double)g->K, 2e5);
#pragma omp parallel num_threads(nt) if (nt > 1)
    fa_gemm_team(g);
}

void fa_gemm_rows(const fa_gemm_t *g, int64_t r0, int64_t r1)
{
    if (r0 >= r1 || g->N <= 0) return;
    const fa_gemm_plan pl = fa_gemm_plan_for(r1 - r0, g->N, g->K, g->trans_a, 1);
    const int64_t P = (g->N + FA_PANEL - 1) / FA_PANEL;
    /* panels in groups that stay in L2 while every row tile passes */
    for (int64_t p0 = 0; p0 < P; p0 += pl.nbp)
        fa_k->gemm_block(g, r0, r1, p0, P - p0 < pl.nbp ? P : p0 + pl.nbp, pl.kc);
}

void fa_gemm_add_rows(float *c, int64_t ldc, const float *t, int64_t N, int64_t r0, int64_t r1)
{
    for (int64_t i = r0; i < r1; i++) {
        float *c_i = c + i * ldc;
        const float *t_i = t + i * N;
        for (int64_t j = 0; j < N; j++) c_i[j] += t_i[j];
    }
}
