/* gemm_body.h -- the float32 GEMM engine's register tiles and its single-thread block, per ISA
 * (gemm.c chooses the blocks and hands them to the threads; fa_gemm_t in fa_kernels.h).
 *
 *   C[r][m] = sum_k op(A)[r][k] * B[k][m]
 *
 * B comes packed in panels of FA_PANEL features with all of K: bp[p][k][f] = B[k][p FA_PANEL + f]
 * (fa_gemm_pack), so a panel's K block is one contiguous stream and vectors run along the
 * features (no horizontal sums). op(A) is read where it lies: row r, column k at
 * a[r rs + k ks] (rs = lda, ks = 1; transposed, rs = 1, ks = lda), one broadcast per row and k
 * (AVX2 and generic: copied k-major per row tile and K block first, GM_PACK_A).
 *
 * Summation order, the engine's promise: every element of C has one accumulator, which starts
 * at 0 and takes k = 0, 1, ..., K - 1 in order, one vfma each (a fused
 * multiply-add on AVX2 and AVX-512, a multiply then an add on the generic level). Between K
 * blocks the accumulator is stored to C and loaded back, which rounds nothing, so the result
 * does not depend on the blocking, the tile an element falls in, or the team: 1 and N threads
 * give the same bits, and so do the cache sizes of two machines at the same level.
 *
 * Register tiles: SK_RB rows x SK_NV vectors of FA_VL features (fa_tiles.h: 8 x 3 on AVX-512,
 * a whole panel; 6 x 2 on AVX2, a third of one), the broadcast side's rows staying in L1 while
 * the tile streams the panel's K block. Fewer rows (a block's last rows, a decode step's one
 * or few) take the widest slice of the panel that fits as many accumulators (gemm_nv). */

#define GM_ACC (SK_RB * SK_NV)
#define GM_PV (FA_PANEL / FA_VL)
#define GM_KC_MAX 1024   /* the largest K block (gemm.c's k_block clamps to it) */
/* Pack a row tile's K block of op(A) before its panels (AVX2, generic): its few rows read in
 * place sit lda apart, at K = 2048 in the same L1 sets, and a third-of-a-panel tile meets
 * them three times per panel. AVX-512's whole-panel tile meets them once per panel, where
 * the copy costs more than it saves. */
#define GM_PACK_A (FA_VL < 16)

/* Vectors per tile for `rows` rows: SK_NV for a full tile; fewer rows the widest divisor of the
 * panel's vectors that fits GM_ACC accumulators, so one or a few rows read each panel once, in
 * order, with as many independent sums as the registers hold. A constant after inlining. */
FA_INLINE int gemm_nv(int rows)
{
    if (rows >= SK_RB) return SK_NV;
    for (int nv = GM_PV; nv > 1; nv--)
        if (GM_PV % nv == 0 && rows * nv <= GM_ACC) return nv;
    return 1;
}

/* One register tile: C[r][f] for r < ROWS, f < nf (nf <= NV FA_VL), over kc values of k.
 *   c  tile's first element (row stride ldc)    a  op(A) at (row 0, k 0) of the tile, (rs, ks)
 *   w  the panel at (k 0, feature 0) of the tile, rows of FA_PANEL floats
 *   load  0: the sums start at 0; 1: at C (a later K block) */
FA_INLINE void gemm_tile(float *FA_RESTRICT c, int64_t ldc, const float *FA_RESTRICT a,
                         int64_t rs, int64_t ks, const float *FA_RESTRICT w, int64_t kc, int load,
                         const int ROWS, const int NV, int64_t nf)
{
    VF acc[SK_RB][GM_PV];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++) {
            acc[r][v] = vsplat(0.0f);
            if (!load) continue;
            if ((v + 1) * FA_VL <= nf) {
                acc[r][v] = vload(c + r * ldc + v * FA_VL);
            } else {
                for (int i = 0; v * FA_VL + i < nf; i++) acc[r][v][i] = c[r * ldc + v * FA_VL + i];
            }
        }
    for (int64_t k = 0; k < kc; k++, w += FA_PANEL) {
        if (NV * FA_VL < FA_PANEL) __builtin_prefetch(w + 12 * FA_PANEL);
        VF wv[GM_PV];
        for (int v = 0; v < NV; v++) wv[v] = vload(w + v * FA_VL);
        for (int r = 0; r < ROWS; r++) {
            const VF xv = vsplat(a[r * rs + k * ks]);
            for (int v = 0; v < NV; v++) acc[r][v] = vfma(xv, wv[v], acc[r][v]);
        }
    }
    vstore_tile(c, ldc, acc, ROWS, NV, nf);
}

/* `rows` (<= ROWS_MAX) rows of one panel's K block: its tiles across the panel's width */
FA_INLINE void gemm_panel_rows(float *c, int64_t ldc, const float *a, int64_t rs, int64_t ks,
                               const float *w, int64_t kc, int load, int64_t width,
                               const int ROWS)
{
    const int NV = gemm_nv(ROWS);
    for (int64_t f0 = 0; f0 < width; f0 += NV * FA_VL) {
        const int64_t nf = width - f0 < NV * FA_VL ? width - f0 : NV * FA_VL;
        gemm_tile(c + f0, ldc, a, rs, ks, w + f0, kc, load, ROWS, NV, nf);
    }
}

/* The finished tile's epilogue: the product was written to pre (if kept) or to c; then
 * c = drop(act(product + bias)) (bias_act_rows, while the tile is in L1) */
FA_INLINE void gemm_epilogue(const fa_gemm_t *g, int64_t r, int64_t rows, int64_t m0,
                             int64_t width)
{
    if (!g->bias && g->act == FA_ACT_NONE && !g->pre && !(g->drop && g->drop->on)) return;
    bias_act_rows(g->c + r * g->ldc + m0, g->pre ? g->pre + r * g->ldc + m0 : NULL,
                  g->bias ? g->bias + m0 : NULL, rows, width, g->ldc, g->act, g->row0 + r,
                  g->col0 + m0, g->drop);
}

/* The block rows [r0, r1) x panels [p0, p1) of g's C, on the calling thread: K in blocks of
 * kc (the broadcast side's SK_RB x kc in L1, the block's panels' kc x FA_PANEL in L2); each
 * tile's epilogue right after its last K block. */
static void gemm_block(const fa_gemm_t *g, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
                       int64_t kc)
{
    const int64_t K = g->K, ldc = g->ldc;
    const int64_t rs = g->trans_a ? 1 : g->lda, ks = g->trans_a ? g->lda : 1;
    float *z = g->pre ? g->pre : g->c;                  /* where the sums go */
    if (K <= 0) { /* empty sums: 0, then the epilogue */
        for (int64_t p = p0; p < p1; p++) {
            const int64_t m0 = p * FA_PANEL, width = g->N - m0 < FA_PANEL ? g->N - m0 : FA_PANEL;
            for (int64_t r = r0; r < r1; r++)
                memset(z + r * ldc + m0, 0, (size_t)width * sizeof(float));
            gemm_epilogue(g, r0, r1 - r0, m0, width);
        }
        return;
    }
    if (kc <= 0 || kc > GM_KC_MAX) kc = kc <= 0 && K < GM_KC_MAX ? K : GM_KC_MAX;
#if GM_PACK_A
    float ap[SK_RB * GM_KC_MAX];                        /* a row tile's K block, packed */
#endif
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t kn = K - k0 < kc ? K - k0 : kc;
        const int load = k0 > 0, last = k0 + kn >= K;
        for (int64_t r = r0; r < r1; r += SK_RB) {
            const int64_t rows = r1 - r < SK_RB ? r1 - r : SK_RB;
            const float *a = g->a + r * rs + k0 * ks;
#if GM_PACK_A
            /* the tile's rows of this K block packed k-major (ap[k][SK_RB]): one stream of
             * broadcasts for every panel of the task, whatever the stride of op(A) */
            for (int64_t k = 0; k < kn; k++)
                for (int64_t i = 0; i < rows; i++) ap[k * SK_RB + i] = a[i * rs + k * ks];
            a = ap;
            const int64_t ars = 1, aks = SK_RB;
#else
            const int64_t ars = rs, aks = ks;
#endif
            for (int64_t p = p0; p < p1; p++) {
                const int64_t m0 = p * FA_PANEL;
                const int64_t width = g->N - m0 < FA_PANEL ? g->N - m0 : FA_PANEL;
                const float *w = g->bp + (p * K + k0) * FA_PANEL;
                float *c = z + r * ldc + m0;
                /* (n capped at SK_RB: the cases past SK_RB - 1 rows never run, but compile) */
#define GM_ROWS(n) gemm_panel_rows(c, ldc, a, ars, aks, w, kn, load, width, GM_CAP(n))
#define GM_CAP(n) ((n) < SK_RB ? (n) : SK_RB)
                switch (rows) {
                case 1: GM_ROWS(1); break;
                case 2: GM_ROWS(2); break;
                case 3: GM_ROWS(3); break;
                case 4: GM_ROWS(4); break;
                case 5: GM_ROWS(5); break;
                case 6: GM_ROWS(6); break;
                case 7: GM_ROWS(7); break;
                default: GM_ROWS(SK_RB); break;
                }
#undef GM_CAP
#undef GM_ROWS
                if (last) gemm_epilogue(g, r, rows, m0, width);
            }
        }
    }
}
/* The level's FMA roofline: `iters` steps of 24 independent vfma (12 accumulators, two each,
 * enough chains for any core's latency x throughput); flops = 48 FA_VL iters. Returns the sum
 * of the lanes so the loop is not dropped. */
static float gemm_fma_peak(int64_t iters)
{
    const VF w = vsplat(1e-3f), x = vsplat(1e-3f);
    VF a[12];
    for (int i = 0; i < 12; i++) a[i] = vsplat(0.0f);
    for (int64_t it = 0; it < iters; it++) {
        for (int i = 0; i < 12; i++) a[i] = vfma(w, x, a[i]);
        for (int i = 0; i < 12; i++) a[i] = vfma(w, x, a[i]);
    }
    VF s = vsplat(0.0f);
    for (int i = 0; i < 12; i++) s += a[i];
    return hsum(s);
}

_Static_assert(SK_RB <= 8, "gemm_block handles at most 7 rows left over");
_Static_assert(FA_PANEL % (SK_NV * FA_VL) == 0, "a panel is whole register tiles wide");
#undef GM_ACC
#undef GM_PACK_A
#undef GM_KC_MAX
#undef GM_PV
