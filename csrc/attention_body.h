/* attention_body.h -- fused attention, forward and backward, for one ISA level (compiled by
 * each kernels_<level>.c; attention.c calls them through the kernel table): the float32 passes
 * and their structure (query blocks, one-row decode steps, the backward). bf16 attention's
 * rounding and paths are in attention_bf16_body.h (which includes the dot path,
 * attention_dot_body.h, and the tile pass, attention_amx_body.h); the passes here call it
 * where a->bf16 is set.
 *
 * The block works "transposed": queries run along vector lanes, so the online softmax's
 * per-query max and sum are plain element-wise vector ops and no horizontal reduction is needed.
 *   scalar math, per query row i:  s_j = (q_i . k_j) * scale + bias_ij;  m = max_j s_j;
 *                                  out_i = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)
 * Scores are kept in base 2 (q is pre-multiplied by scale * log2 e) so exp is one exp2.
 *
 * Per-thread scratch (floats), carved from one buffer by the caller:
 *   qt  (D, BQ)    q block, transposed and pre-scaled; lanes past the last query are 0
 *   st  (BK, BQ)   scores, then probabilities, of one key block
 *   ot  (Dv, BQ)   output accumulator, transposed
 *   m, l (BQ)      running max (base 2) and running sum per query
 * Masking rules (DESIGN.md): causal lets query i see key j iff j <= i + (Lk - Lq), aligned to
 * the bottom right; key blocks wholly above the diagonal are skipped, not computed. A -inf in
 * either mask hides a key too; any other mask value is added (attention.c: hidden keys, finite
 * masks of any size). A query with no visible key gets a zero output and lse = -inf. NaN in q,
 * or in a visible key's k or v, propagates as NaN; a hidden key's rows take no part.
 */
#define NR ATT_NR
#define BQ (ATT_NR * FA_VL)
#define MR_S ATT_MR_S
#define MR_P ATT_MR_P
#define vsplatu(x) ((VU){0} + (uint32_t)(x))  /* broadcast a uint32 */
/* fa_attention_args.bf16 inside a call: k and v hold bf16 values already (att_round_kv) */
#define ATT_BF16_KV_ROUNDED 2

static const uint32_t att_lane_ids[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Is key j hidden from query i of head (b, h)? (causal, or -inf in either mask) */
static int att_hidden(const fa_attention_args *a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (a->causal && j > i + (a->Lk - a->Lq)) return 1;
    if (a->key_bias && a->key_bias[b * a->Lk + j] == -INFINITY) return 1;
    const int64_t *ms = a->mask_st;
    return a->mask && a->mask[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]] == -INFINITY;
}

/* Are the n floats of x all finite? */
static int att_finite(const float *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t e = 0; e < n; e++) acc += x[e] * 0.0f; /* 0 unless some x is inf or NaN */
    return acc == 0.0f;
}

/* Is value row v_j (Dv floats) finite as the call reads it? bf16: finite after rounding (a
 * float past 3.3961e38, bits 0x7f7f8000, rounds to inf) */
static int att_v_finite(const fa_attention_args *a, const float *v_j)
{
    if (!a->bf16) return att_finite(v_j, a->Dv);
    for (int64_t e = 0; e < a->Dv; e++) {
        uint32_t bits;
        memcpy(&bits, v_j + e, 4);
        if ((bits & 0x7fffffffu) >= 0x7f7f8000u) return 0;
    }
    return 1;
}

/* 2^x for the softmax's x = s - m <= 0 (or -inf, or NaN): vexp2 (fa_simd.h) without its
 * clamps, bit for bit the same result on x <= 127, in 14 vector ops instead of 24 (with its
 * load, subtraction, store and sum, a tenth of attention's vector ops at D = 64). No clamp
 * is needed: a lane with x < -126 (-inf included; its 2^n bits are garbage there) is zeroed by
 * `keep` as in vexp2, and 2^n is multiplied in, so NaN in stays NaN. n comes from the rounding
 * add's low bits (1.5 * 2^23 + n: shifted left 23, only n << 23 survives), so no conversion.
 *   scalar math:  n = round(x);  f = x - n;  2^x = P(f) * 2^n, 0 for x < -126 */
FA_INLINE VF att_exp2(VF x)
{
    const VF t = x + vsplat(12582912.0f);                /* 1.5 * 2^23 + n */
    const VF f = x - (t - vsplat(12582912.0f));          /* in [-1/2, 1/2] */
    const VF p = vexp2_poly(f);
    const VF two_n = (VF)(((VU)t << 23) + vsplatu(127u << 23));   /* 2^n, n >= -126 */
    return (VF)((VI)(p * two_n) & ~(VI)(x < vsplat(-126.0f)));
}

/* rows of qt: D, at least 16 in bf16 (the tiles read the queries' pairs in blocks of 16) */
static int64_t att_qt_rows(int64_t D, int bf16) { return bf16 && D < 16 ? 16 : D; }

static int64_t attention_scratch(int64_t D, int64_t Dv, int bf16)
{
    const int64_t extra = bf16 ? ATT_BK * (D + 32) + (ATT_BK + 2) * (Dv + 16) + (ATT_BK / 2 + 1) * BQ : 0;
    return att_qt_rows(D, bf16) * BQ + ATT_BK * BQ + Dv * BQ + 2 * BQ + extra;
}

/* The rows left over after whole register tiles of MR rows (MR <= 8): a tile of 4, of 2, of 1,
 * as needed (TILE(rows) runs one; i advances past it). */
#define ATT_TAIL(i, n, MR, TILE)                     \
    do {                                             \
        if ((MR) > 4 && (n) - (i) >= 4) {            \
            TILE(4);                                 \
            (i) += 4;                                \
        }                                            \
        if ((MR) > 2 && (n) - (i) >= 2) {            \
            TILE(2);                                 \
            (i) += 2;                                \
        }                                            \
        while ((n) - (i) >= 1) {                     \
            TILE(1);                                 \
            (i) += 1;                                \
        }                                            \
    } while (0)
_Static_assert(ATT_MR_S <= 8 && ATT_MR_P <= 8, "ATT_TAIL covers at most 7 rows left over");

/* All ones in the lanes where |x| > ATT_WIDE or x is inf or NaN. */
FA_INLINE VI att_wide_lanes(VF x)
{
    return (VI)(((VI)x & ((VI){0} + 0x7fffffff)) > ((VI){0} + ATT_WIDE_BITS));
}

/* wd and |x|'s bits as an int, their lane-wise max: a lane of the running max passes
 * ATT_WIDE_BITS iff some x seen there has |x| > ATT_WIDE or is inf or NaN (as int, |x|'s bits
 * order as |x| does, and inf and NaN sort above every finite value). Two integer ops a vector
 * (and, max), where att_wide_lanes would add a compare and an or; att_wide_any reads it once
 * per block.
 *   scalar math:  wd = max(wd, bits(|x|)) */
FA_INLINE VI att_wide_acc(VI wd, VF x)
{
    const VI ax = (VI)x & ((VI){0} + 0x7fffffff);
#if FA_VL == 16
    return (VI)_mm512_max_epi32((__m512i)wd, (__m512i)ax);
#elif FA_VL == 8
    return (VI)_mm256_max_epi32((__m256i)wd, (__m256i)ax);
#else
    const VI gt = ax > wd;
    return (ax & gt) | (wd & ~gt);
#endif
}

/* 1 when some lane of the running max wd (att_wide_acc) passed ATT_WIDE_BITS */
FA_INLINE int att_wide_any(VI wd)
{
    int wide = 0;
    for (int i = 0; i < FA_VL; i++) wide |= wd[i] > ATT_WIDE_BITS;
    return wide;
}

/* One register tile of the scores: st[r][:] = (k_r . qt[:, :]) * sc for r < ROWS keys (k_r =
 * row r, read in place through the row stride ksl), BQ queries along the lanes; mx takes the
 * lane-wise max, and wd (one vector for all NR: the block is checked as a whole) the lane-wise
 * max of the scores' |x| bits (att_wide_acc: past ATT_WIDE_BITS where some score passed
 * ATT_WIDE or came out inf or NaN; att_fix_wide forms those again). (sc: 1 for float32, whose qt is pre-scaled; bf16
 * scales the sums.)
 *   scalar math:  st[r][i] = (sum_d k[r][d] * qt[d][i]) * sc                              */
FA_INLINE void score_rows(float *FA_RESTRICT st, VF *FA_RESTRICT mx, VI *FA_RESTRICT wd,
                          const float *FA_RESTRICT qt, const float *FA_RESTRICT k, int64_t ksl,
                          int64_t D, float sc, const int ROWS)
{
    VF acc[MR_S][NR];
    const float *k_r[MR_S];
    for (int r = 0; r < ROWS; r++) {
        k_r[r] = k + r * ksl;
        for (int c = 0; c < NR; c++) acc[r][c] = vsplat(0.0f);
    }
    const float *qd = qt;
    for (int64_t d = 0; d < D; d++, qd += BQ) {
        VF qv[NR];
        for (int c = 0; c < NR; c++) qv[c] = vload(qd + c * FA_VL);
        for (int r = 0; r < ROWS; r++) {
            VF kk = vsplat(k_r[r][d]);
            for (int c = 0; c < NR; c++) acc[r][c] += kk * qv[c];
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) {
            const VF x = acc[r][c] * vsplat(sc);
            vstore(st + r * BQ + c * FA_VL, x);
            mx[c] = vmax(mx[c], x);
            *wd = att_wide_acc(*wd, x);
        }
}

/* st[j][:] = (k_j . qt[:, :]) * sc for j < nb (k_j = row j of the key block), in register tiles
 * of MR_S keys x BQ queries (the keys left over in smaller tiles); mx = lane-wise max of st, *wd
 * the lane-wise max of their |x| bits (all NR vectors of st in one) (att_wide_acc; att_fix_wide forms again the scores past
 * ATT_WIDE_BITS). */
FA_INLINE void score_tile_sc(float *FA_RESTRICT st, VF *FA_RESTRICT mx, VI *FA_RESTRICT wd,
                             const float *FA_RESTRICT qt, const float *FA_RESTRICT k, int64_t ksl,
                             int64_t nb, int64_t D, float sc)
{
    int64_t j = 0;
#define TILE(rows) score_rows(st + j * BQ, mx, wd, qt, k + j * ksl, ksl, D, sc, rows)
    for (; j + MR_S <= nb; j += MR_S) TILE(MR_S);
    ATT_TAIL(j, nb, MR_S, TILE);
#undef TILE
}
static void score_tile(float *FA_RESTRICT st, VF *FA_RESTRICT mx, VI *FA_RESTRICT wd,
                       const float *FA_RESTRICT qt, const float *FA_RESTRICT k, int64_t ksl,
                       int64_t nb, int64_t D, float sc)
{
    /* float32 (sc = 1: qt is pre-scaled) without the tiles' multiply by sc: x * 1 == x */
    if (sc == 1.0f)
        score_tile_sc(st, mx, wd, qt, k, ksl, nb, D, 1.0f);
    else
        score_tile_sc(st, mx, wd, qt, k, ksl, nb, D, sc);
}

/* One register tile of the output: ot[r][:] += sum_{j<nb} v_j[r] * st[j][:] for r < ROWS value
 * features (v_j read in place from feature 0 of v, row stride vsl).
 *   scalar math:  ot[r][i] += sum_j v[j][r] * st[j][i]                                    */
FA_INLINE void pv_rows(float *FA_RESTRICT ot, const float *FA_RESTRICT st,
                       const float *FA_RESTRICT v, int64_t vsl, int64_t nb, const int ROWS)
{
    VF acc[MR_P][NR];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = vload(ot + r * BQ + c * FA_VL);
    const float *vj = v;
    const float *pj = st;
    for (int64_t j = 0; j < nb; j++, vj += vsl, pj += BQ) {
        VF pv[NR];
        for (int c = 0; c < NR; c++) pv[c] = vload(pj + c * FA_VL);
        for (int r = 0; r < ROWS; r++) {
            VF vv = vsplat(vj[r]);
            for (int c = 0; c < NR; c++) acc[r][c] += vv * pv[c];
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) vstore(ot + r * BQ + c * FA_VL, acc[r][c]);
}

/* ot[e][:] += sum_{j<nb} v_j[e] * st[j][:], rows e in register tiles of MR_P (the features
 * left over in smaller tiles). */
static void pv_tile(float *FA_RESTRICT ot, const float *FA_RESTRICT st, const float *FA_RESTRICT v,
                    int64_t vsl, int64_t nb, int64_t Dv)
{
    int64_t e = 0;
#define TILE(rows) pv_rows(ot + e * BQ, st, v + e, vsl, nb, rows)
    for (; e + MR_P <= Dv; e += MR_P) TILE(MR_P);
    ATT_TAIL(e, Dv, MR_P, TILE);
#undef TILE
}

/* st[jj][i] for queries i0 + i (i < nq) and keys jb + jj (jj < nb) whose float32 score passed
 * ATT_WIDE or came out inf or NaN (|q . k| past the float32 range, or q * scale * log2 e), formed
 * again in double and compressed (att_score_exact); mx becomes st's lane-wise max again. Rare:
 * scalar. */
static void att_fix_wide(const fa_attention_args *a, int64_t b, int64_t h, int64_t i0, int64_t nq,
                         int64_t jb, int64_t nb, float *st, VF *mx)
{
    for (int c = 0; c < NR; c++) mx[c] = vsplat(-INFINITY);
    for (int64_t jj = 0; jj < nb; jj++) {
        float *s_j = st + jj * BQ;
        for (int64_t i = 0; i < nq; i++)
            if (!(fabsf(s_j[i]) <= ATT_WIDE))
                s_j[i] = att_score_exact(a, b, h, i0 + i, jb + jj, 0.0f, 0.0f);
        for (int c = 0; c < NR; c++) mx[c] = vmax(mx[c], vload(s_j + c * FA_VL));
    }
}

/* s[i] += kb2 (kb2 = a key bias kb times log2 e; kb is not -inf), lanes whose sum or score
 * passes ATT_WIDE (or is NaN) recomputed by att_wide_score. */
FA_INLINE void add_key_bias(float *s, float kb, float kb2)
{
    for (int c = 0; c < NR; c++) {
        const VF sv = vload(s + c * FA_VL), x = sv + vsplat(kb2);
        const VI wide = att_wide_lanes(sv) | att_wide_lanes(x);        /* or NaN */
        int any = 0;
        for (int i = 0; i < FA_VL; i++) any |= wide[i];
        vstore(s + c * FA_VL, x);
        if (any)
            for (int i = 0; i < FA_VL; i++)
                if (wide[i]) s[c * FA_VL + i] = att_wide_score(sv[i], kb, 0.0f);
    }
}

/* ot[e][i] += sum_{j<nb} st[j][i] * v_j[e] over the keys query i0+i can see (v_j = v + j vsl):
 * P.V of a block where a hidden key's value row holds inf or NaN (rare: scalar). */
static void pv_visible(const fa_attention_args *a, int64_t b, int64_t h, int64_t i0, int64_t nq,
                       int64_t jb, int64_t nb, const float *st, float *ot, const float *v,
                       int64_t vsl)
{
    for (int64_t jj = 0; jj < nb; jj++) {
        const float *v_j = v + jj * vsl;
        for (int64_t i = 0; i < nq; i++) {
            if (att_hidden(a, b, h, i0 + i, jb + jj)) continue;
            const float p = st[jj * BQ + i];
            for (int64_t e = 0; e < a->Dv; e++) ot[e * BQ + i] += p * v_j[e];
        }
    }
}

/* bf16 attention: rounding, its paths and its units (att_round, bf16_scores, bf16_pv,
 * att_round_kv) */
#include "attention_bf16_body.h"

/* Scores of key block [jb, jb+nb) for query block [i0, i0+nq), masks applied, into st;
 * mx receives the lane-wise max. Shared by the forward pass and the weights pass. Returns 1
 * when a key that some query of the block cannot see has a value row holding inf or NaN (the
 * block's P.V must then leave it out explicitly: 0 * NaN is NaN), else 0. */
static int masked_scores(const fa_attention_args *a, int64_t b, int64_t h, int64_t i0, int64_t nq,
                         int64_t jb, int64_t nb, const float *qt, float *st, VF *mx, float *kb,
                         const fa_att_units *u)
{
    const float *k_bh = a->k + b * a->k_st[0] + h * a->k_st[1];
    const int64_t off = a->Lk - a->Lq;
    VI wd = {0};
    for (int c = 0; c < NR; c++) mx[c] = vsplat(-INFINITY);
    if (a->bf16)
        bf16_scores(a, k_bh + jb * a->k_st[2], st, mx, &wd, qt, kb, nb, u);
    else
        score_tile(st, mx, &wd, qt, k_bh + jb * a->k_st[2], a->k_st[2], nb, a->D, 1.0f);
    if (att_wide_any(wd)) att_fix_wide(a, b, h, i0, nq, jb, nb, st, mx);

    const int diag = a->causal && jb + nb - 1 > i0 + off;
    if (!diag && !a->mask && !a->key_bias) return 0;
    /* Slow path, only on tiles a mask touches: hide keys (-inf, whatever the score), add the
     * other biases, cut the causal corner, redo the max. */
    const float *v_bh = a->v + b * a->v_st[0] + h * a->v_st[1];
    int care = 0;
    for (int c = 0; c < NR; c++) mx[c] = vsplat(-INFINITY);
    for (int64_t jj = 0; jj < nb; jj++) {
        const int64_t j = jb + jj;
        float *s_j = st + jj * BQ;
        const float kb = a->key_bias ? a->key_bias[b * a->Lk + j] : 0.0f;
        int hidden = kb == -INFINITY; /* hidden from some query of the block */
        if (hidden) {
            for (int64_t i = 0; i < BQ; i++) s_j[i] = -INFINITY;
        } else if (a->mask) {
            const float *m_bhj =
                a->mask + b * a->mask_st[0] + h * a->mask_st[1] + j * a->mask_st[3];
            const float kb2 = kb * FA_LOG2E;
            for (int64_t i = 0; i < nq; i++) {
                const float mk = m_bhj[(i0 + i) * a->mask_st[2]];
                float x = s_j[i] + kb2 + mk * FA_LOG2E;
                if (mk == -INFINITY) {
                    x = -INFINITY;
                    hidden = 1;
                } else if (!(fabsf(x) <= ATT_WIDE) || !(fabsf(s_j[i]) <= ATT_WIDE)) {
                    x = att_wide_score(s_j[i], kb, mk);
                }
                s_j[i] = x;
            }
        } else {
            add_key_bias(s_j, kb, kb * FA_LOG2E);
        }
        if (diag && j > i0 + off) { /* query i0+i sees key j iff j <= i0 + i + off */
            for (int64_t i = 0; i < nq && j > i0 + i + off; i++) s_j[i] = -INFINITY;
            hidden = 1;
        }
        if (hidden && !care) care = !att_v_finite(a, v_bh + j * a->v_st[2]);
        for (int c = 0; c < NR; c++) mx[c] = vmax(mx[c], vload(s_j + c * FA_VL));
    }
    return care;
}

/* dst[c][r] = src[r][c] * scale * (cscale ? cscale[c] : 1) for r < rows, c < cols: the q block
 * packing and the output write-back, in 4x4 register transposes with a scalar rim. */
static void transpose(float *FA_RESTRICT dst, int64_t ldd, const float *FA_RESTRICT src,
                      int64_t lds, int64_t rows, int64_t cols, float scale, const float *cscale)
{
    typedef float v4 __attribute__((vector_size(16), aligned(4), may_alias));
    const int64_t r4 = rows - rows % 4, c4 = cols - cols % 4;
    for (int64_t r = 0; r < r4; r += 4) {
        for (int64_t c = 0; c < c4; c += 4) {
            const v4 a = *(const v4 *)(src + r * lds + c), b = *(const v4 *)(src + (r + 1) * lds + c);
            const v4 e = *(const v4 *)(src + (r + 2) * lds + c), f = *(const v4 *)(src + (r + 3) * lds + c);
            const v4 t0 = __builtin_shufflevector(a, b, 0, 4, 1, 5);
            const v4 t1 = __builtin_shufflevector(a, b, 2, 6, 3, 7);
            const v4 t2 = __builtin_shufflevector(e, f, 0, 4, 1, 5);
            const v4 t3 = __builtin_shufflevector(e, f, 2, 6, 3, 7);
            v4 o[4] = {__builtin_shufflevector(t0, t2, 0, 1, 4, 5),
                       __builtin_shufflevector(t0, t2, 2, 3, 6, 7),
                       __builtin_shufflevector(t1, t3, 0, 1, 4, 5),
                       __builtin_shufflevector(t1, t3, 2, 3, 6, 7)};
            for (int u = 0; u < 4; u++) {
                const float s = cscale ? scale * cscale[c + u] : scale;
                *(v4 *)(dst + (c + u) * ldd + r) = o[u] * s;
            }
        }
        for (int64_t c = c4; c < cols; c++)
            for (int64_t rr = r; rr < r + 4; rr++)
                dst[c * ldd + rr] = src[rr * lds + c] * (cscale ? scale * cscale[c] : scale);
    }
    for (int64_t r = r4; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c] * (cscale ? scale * cscale[c] : scale);
}

/* Size of the key block starting at jb: up to ATT_BK keys, but never straddling jdiag, so that
 * blocks left of the causal diagonal take the unmasked fast path and only the < BQ keys right
 * of it are masked element by element. */
static int64_t key_block(int64_t jb, int64_t jend, int64_t jdiag)
{
    int64_t nb = jend - jb < ATT_BK ? jend - jb : ATT_BK;
    if (jb < jdiag && jb + nb > jdiag) nb = jdiag - jb;
    return nb;
}

static void attention_task(const fa_attention_args *a, const fa_att_units *u,
                           const fa_dropout_t *drop, int64_t b, int64_t h, int64_t qb,
                           float *scratch)
{
    const int64_t D = a->D, Dv = a->Dv, Lq = a->Lq, Lk = a->Lk, off = Lk - Lq;
    const int64_t i0 = qb * BQ, nq = Lq - i0 < BQ ? Lq - i0 : BQ;
    float *qt = scratch, *st = qt + att_qt_rows(D, a->bf16) * BQ, *ot = st + ATT_BK * BQ;
    float *m = ot + Dv * BQ, *l = m + BQ;
    float *kb = NULL, *vb = NULL, *pp = NULL;                           /* bf16 only */
    if (a->bf16) {
        kb = l + BQ;
        vb = kb + ATT_BK * (D + 32);
        pp = vb + (ATT_BK + 2) * (Dv + 16);
    }

    /* Keys this block can see: all, or up to the last row's causal limit. */
    int64_t jend = Lk, jdiag = Lk;
    if (a->causal) {
        jend = i0 + nq + off < Lk ? i0 + nq + off : Lk;
        jdiag = i0 + off + 1 < jend ? i0 + off + 1 : jend; /* first key hidden from query i0 */
        if (jend < 0) jend = 0;
        if (jdiag < 0) jdiag = 0;
    }

    const float *q_bh = a->q + b * a->q_st[0] + h * a->q_st[1];
    const float *v_bh = a->v + b * a->v_st[0] + h * a->v_st[1];
    float *o_bh = a->out + b * a->out_st[0] + h * a->out_st[1];
    const float qscale = a->scale * FA_LOG2E;
    /* The q block comes from memory once, and the output block goes back once: ask for every
     * line of both up front (the transposes' 4 x 4 walks keep only a few misses in flight at a
     * time); the output's lines, for writing, are still in L2 when the block's last key has
     * been met. */
    for (int64_t i = i0; i < i0 + nq; i++) {
        for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(q_bh + i * a->q_st[2] + d, 0, 3);
        for (int64_t e = 0; e < Dv; e += 16) __builtin_prefetch(o_bh + i * a->out_st[2] + e, 1, 2);
    }
    if (nq < BQ) /* lanes past the last query stay 0 */
        for (int64_t d = 0; d < D; d++)
            for (int64_t i = nq; i < BQ; i++) qt[d * BQ + i] = 0.0f;
    if (!a->bf16) {
        transpose(qt, BQ, q_bh + i0 * a->q_st[2], a->q_st[2], nq, D, qscale, NULL);
    } else { /* q rounded, not scaled (bf16_scores scales the sums) */
        transpose(qt, BQ, q_bh + i0 * a->q_st[2], a->q_st[2], nq, D, 1.0f, NULL);
        att_round(qt, qt, D * BQ, u->cvt);
        if (ATT_BF16_UNITS && (u->dot || u->tiles)) dot_pack_q(qt, D);
        if (ATT_BF16_UNITS && u->tiles) amx_pad_q(qt, D);
    }
    for (int64_t i = 0; i < Dv * BQ; i++) ot[i] = 0.0f;
    for (int64_t i = 0; i < BQ; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    /* dropout: each query lane's row key (fa_rng.h), row = (b * H + h) * Lq + i */
    uint32_t row_keys[BQ];
    VU rk[NR];
    for (int64_t i = 0; i < BQ; i++)
        row_keys[i] =
            drop->on ? fa_rng_row_key(drop->seed, (uint64_t)((b * a->H + h) * Lq + i0 + i)) : 0u;
    for (int c = 0; c < NR; c++) rk[c] = *(const VU *)(row_keys + c * FA_VL);

    for (int64_t jb = 0, nb; jb < jend; jb += nb) {
        nb = key_block(jb, jend, jdiag);
        VF mx[NR], muse[NR], alpha[NR], lsum[NR];
        const int care = masked_scores(a, b, h, i0, nq, jb, nb, qt, st, mx, kb, u);
        /* online softmax: m_new = max(m, block max); rescale old sums by 2^(m - m_new).
         * A lane still at -inf uses 0 as its reference so 2^(-inf - 0) = 0, never NaN. */
        int rescale = 0;
        for (int c = 0; c < NR; c++) {
            VF mo = vload(m + c * FA_VL), mn = vmax(mo, mx[c]);
            VI dead = (VI)(mn == vsplat(-INFINITY));
            muse[c] = (VF)(~dead & (VI)mn);
            alpha[c] = att_exp2(mo - muse[c]);
            vstore(m + c * FA_VL, mn);
            lsum[c] = vsplat(0.0f);
            for (int i = 0; i < FA_VL; i++) rescale |= alpha[c][i] != 1.0f;
        }
        if (!a->bf16) {
            for (int64_t jj = 0; jj < nb; jj++) {
                for (int c = 0; c < NR; c++) {
                    VF p = att_exp2(vload(st + jj * BQ + c * FA_VL) - muse[c]);
                    vstore(st + jj * BQ + c * FA_VL, p);
                    lsum[c] += p;
                }
            }
        } else { /* l sums the float32 P, st keeps P rounded (P^) for P.V (with dropout: P,
                  * rounded once the keep factor is applied) */
            for (int64_t jj = 0; jj < nb; jj++) {
                for (int c = 0; c < NR; c++) {
                    VF p = att_exp2(vload(st + jj * BQ + c * FA_VL) - muse[c]);
                    vstore(st + jj * BQ + c * FA_VL, drop->on ? p : att_bf16(p));
                    lsum[c] += p;
                }
            }
        }
        for (int c = 0; c < NR; c++)
            vstore(l + c * FA_VL, vload(l + c * FA_VL) * alpha[c] + lsum[c]);
        if (drop->on) { /* P' = P keep / (1 - p), once l has summed the undropped P */
            for (int64_t jj = 0; jj < nb; jj++) {
                const VU col = vsplatu(jb + jj);
                for (int c = 0; c < NR; c++) {
                    const VF pk = vload(st + jj * BQ + c * FA_VL) *
                                  vkeep(rk[c], col, drop->threshold, drop->scale);
                    vstore(st + jj * BQ + c * FA_VL, a->bf16 ? att_bf16(pk) : pk);
                }
            }
        }
        if (rescale && jb > 0) {
            for (int64_t e = 0; e < Dv; e++)
                for (int c = 0; c < NR; c++)
                    vstore(ot + e * BQ + c * FA_VL, vload(ot + e * BQ + c * FA_VL) * alpha[c]);
        }
        if (a->bf16)
            bf16_pv(a, b, h, i0, nq, jb, nb, st, ot, v_bh + jb * a->v_st[2], vb, pp, care, u);
        else if (care)
            pv_visible(a, b, h, i0, nq, jb, nb, st, ot, v_bh + jb * a->v_st[2], a->v_st[2]);
        else
            pv_tile(ot, st, v_bh + jb * a->v_st[2], a->v_st[2], nb, Dv);
    }

    /* out_i = ot[:, i] / l_i (0 for a row with no visible key); lse_i = (m_i + log2 l_i) ln 2 */
    if (a->lse) {
        float *lse_bh = a->lse + (b * a->H + h) * Lq + i0;
        for (int64_t i = 0; i < nq; i++) lse_bh[i] = l[i] == 0.0f ? -INFINITY : att_lse(m[i], l[i]);
    }
    for (int64_t i = 0; i < nq; i++) l[i] = l[i] == 0.0f ? 0.0f : 1.0f / l[i]; /* l becomes 1/l */
    transpose(o_bh + i0 * a->out_st[2], a->out_st[2], ot, BQ, Dv, nq, 1.0f, l);
    if (!a->weights) return;

    /* Optional second pass: weights[i][j] = 2^(s_ij - m_i) / l_i (times the dropout factor),
     * zeros where nothing is visible. (Not exp(s_ij - lse_i): lse can be far too large for
     * float32 to hold the difference, with a finite mask of -3e38.) */
    float *w_bh = a->weights + ((b * a->H + h) * Lq + i0) * Lk;
    for (int64_t i = 0; i < nq * Lk; i++) w_bh[i] = 0.0f;
    for (int64_t jb = 0, nb; jb < jend; jb += nb) {
        nb = key_block(jb, jend, jdiag);
        VF mx[NR];
        masked_scores(a, b, h, i0, nq, jb, nb, qt, st, mx, kb, u);
        for (int64_t i = 0; i < nq; i++) {
            if (l[i] == 0.0f) continue;
            for (int64_t jj = 0; jj < nb; jj++) {
                VF x = vsplat(st[jj * BQ + i] - m[i]);
                float w = vexp2(x)[0] * l[i];
                if (drop->on)
                    w *= fa_rng_keep(row_keys[i], (uint32_t)(jb + jj), drop->threshold)
                             ? drop->scale : 0.0f;
                w_bh[i * Lk + jb + jj] = w;
            }
        }
    }
}

/* Few queries (a decode step, a handful of beams): one query row at a time, vectors along the
 * head dim, so no lane is wasted on absent queries. Same masking rules and results (to
 * rounding) as the tiled path.
 *   scalar math:  s_j = (q_i . k_j) * scale + bias_ij;  out_i = sum_j 2^(s_j - m) v_j / l
 * Scratch: Lk floats (the row's scores). */
static int64_t attention_rows_scratch(int64_t Lk, int64_t D, int bf16)
{
    return Lk + FA_VL + 4 + (bf16 ? D + 48 : 0);
}
/* (scores, padded to whole vectors; bf16: the query row rounded, or in pairs of bf16 padded
 * with zeros to whole vectors on the dot path) */

/* Four dot products q . k_u (u < 4) of length n, summed in one fixed order (the same for every
 * key, whichever group of four it falls in): lanes, then a 4x4 transpose-add. */
FA_INLINE void dot4(float *out, const float *q, const float *k0, const float *k1, const float *k2,
                    const float *k3, int64_t n, const int bf)
{
    VF a0 = vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t d = 0;
#define K(p) (bf ? att_bf16(vload(p)) : vload(p)) /* bf16: k rounded as it is read */
    for (; d + FA_VL <= n; d += FA_VL) {
        const VF qv = vload(q + d);
        a0 += qv * K(k0 + d);
        a1 += qv * K(k1 + d);
        a2 += qv * K(k2 + d);
        a3 += qv * K(k3 + d);
    }
#undef K
    float4_t h[4];
    const VF acc[4] = {a0, a1, a2, a3};
    for (int u = 0; u < 4; u++) {
#if FA_VL == 16
        const __typeof__(__builtin_shufflevector(a0, a0, 0, 1, 2, 3, 4, 5, 6, 7)) h8 =
            __builtin_shufflevector(acc[u], acc[u], 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(acc[u], acc[u], 8, 9, 10, 11, 12, 13, 14, 15);
        h[u] = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
#elif FA_VL == 8
        h[u] = __builtin_shufflevector(acc[u], acc[u], 0, 1, 2, 3) +
               __builtin_shufflevector(acc[u], acc[u], 4, 5, 6, 7);
#else
        h[u] = (float4_t){acc[u][0], acc[u][1], acc[u][2], acc[u][3]};
#endif
    }
    const float4_t t0 = __builtin_shufflevector(h[0], h[1], 0, 4, 1, 5) +
                        __builtin_shufflevector(h[0], h[1], 2, 6, 3, 7);
    const float4_t t1 = __builtin_shufflevector(h[2], h[3], 0, 4, 1, 5) +
                        __builtin_shufflevector(h[2], h[3], 2, 6, 3, 7);
    const float4_t r = __builtin_shufflevector(t0, t1, 0, 1, 4, 5) +
                       __builtin_shufflevector(t0, t1, 2, 3, 6, 7);
    const float *ks[4] = {k0, k1, k2, k3};
    for (int u = 0; u < 4; u++) {
        float t = r[u];
        for (int64_t dd = d; dd < n; dd++) t += q[dd] * (bf ? att_bf16s(ks[u][dd]) : ks[u][dd]);
        out[u] = t;
    }
}

/* out_i = sum_{j < jend} s_j v_j * inv (v_j = v + j vsl), vectors along the features; with
 * `hid` (a hidden key's value row holds inf or NaN: rare) scalar, over the keys query i of head
 * (b, h) can see. bf: v rounded to bf16 as it is read (s holds P^ already). */
FA_INLINE void rows_pv(float *o_i, const float *s, const float *v, int64_t vsl, int64_t jend,
                       int64_t Dv, float inv, const fa_attention_args *hid, int64_t b, int64_t h,
                       int64_t i, const int bf)
{
#define VAL(x) (bf ? att_bf16s(x) : (x))
    int64_t e = 0;
    if (hid) { /* leave the hidden keys' rows out (0 * NaN is NaN); rare: scalar */
        for (; e < Dv; e++) {
            float acc = 0.0f;
            for (int64_t jj = 0; jj < jend; jj++)
                if (!att_hidden(hid, b, h, i, jj)) acc += s[jj] * VAL(v[jj * vsl + e]);
            o_i[e] = acc * inv;
        }
    }
    for (; e + FA_VL <= Dv; e += 4 * FA_VL) {       /* out_i = sum_j p_j v_j / l */
        const int nv = Dv - e >= 4 * FA_VL ? 4 : (int)((Dv - e) / FA_VL);
        VF acc[4] = {vsplat(0.0f), vsplat(0.0f), vsplat(0.0f), vsplat(0.0f)};
        for (int64_t jj = 0; jj < jend; jj++) {     /* independent chains: one per vector */
            const VF p = vsplat(s[jj]);
            const float *v_j = v + jj * vsl + e;
            for (int c = 0; c < 4; c++)
                if (c < nv)
                    acc[c] += p * (bf ? att_bf16(vload(v_j + c * FA_VL)) : vload(v_j + c * FA_VL));
        }
        for (int c = 0; c < nv; c++) vstore(o_i + e + c * FA_VL, acc[c] * vsplat(inv));
        if (nv < 4) {
            e += nv * FA_VL;
            break;
        }
    }
    for (; e < Dv; e++) {
        float acc = 0.0f;
        for (int64_t jj = 0; jj < jend; jj++) acc += s[jj] * VAL(v[jj * vsl + e]);
        o_i[e] = acc * inv;
    }
#undef VAL
}

/* A decode row's score of key j with biases kb, mk (not -inf) whose float32 sum, or score sv
 * (base 2), passed ATT_WIDE or is inf or NaN: from q and k again where sv itself is out of
 * range (att_score_exact), else from sv and the biases (att_wide_score). */
static float rows_wide_score(const fa_attention_args *a, int64_t b, int64_t h, int64_t i,
                             int64_t j, float sv, float kb, float mk)
{
    return fabsf(sv) <= ATT_WIDE ? att_wide_score(sv, kb, mk)
                                 : att_score_exact(a, b, h, i, j, kb, mk);
}

static void attention_rows(const fa_attention_args *a, const fa_att_units *u,
                           const fa_dropout_t *drop, int64_t b, int64_t h, int64_t i, float *s)
{
    const int64_t D = a->D, Dv = a->Dv, Lk = a->Lk, off = Lk - a->Lq;
    const float *q_i = a->q + b * a->q_st[0] + h * a->q_st[1] + i * a->q_st[2];
    const float *k_bh = a->k + b * a->k_st[0] + h * a->k_st[1];
    const float *v_bh = a->v + b * a->v_st[0] + h * a->v_st[1];
    float *o_i = a->out + b * a->out_st[0] + h * a->out_st[1] + i * a->out_st[2];
    int64_t jend = Lk;
    if (a->causal) jend = i + off + 1 < Lk ? (i + off + 1 > 0 ? i + off + 1 : 0) : Lk;

    const float qscale = a->scale * FA_LOG2E;
    const int64_t ksl = a->k_st[2];
#define DOTS(q, bf)                                                                             \
    for (int64_t j = 0; j < jend; j += 4) { /* raw dots, four keys at a time */                 \
        const float *k_j = k_bh + j * ksl;                                                      \
        dot4(s + j, q, k_j, j + 1 < jend ? k_j + ksl : k_j, j + 2 < jend ? k_j + 2 * ksl : k_j, \
             j + 3 < jend ? k_j + 3 * ksl : k_j, D, bf);                                        \
    }
    if (!a->bf16) {
        DOTS(q_i, 0);
    } else {
        float *qr = s + Lk + FA_VL + 4; /* q rounded, or its pairs (dot path) */
        if (ATT_BF16_UNITS && u->dot_rows) {
            dot_rows_scores(s, q_i, k_bh, ksl, jend, D, (uint32_t *)qr);
        } else {
            att_bf16_row(qr, q_i, D);
            DOTS(qr, 1);
        }
    }
#undef DOTS
    float m = -INFINITY;
    int care = 0; /* a hidden key's value row holds inf or NaN */
    int64_t j0 = 0;
    if (a->key_bias && !a->mask) { /* a decode step's padding: whole vectors of keys first */
        const float *kb_b = a->key_bias + b * Lk;
        VF mv = vsplat(-INFINITY);
        VI nan = (VI){0}, hidden = (VI){0};
        for (; j0 + FA_VL <= jend; j0 += FA_VL) {
            const VF kbv = vload(kb_b + j0), sv = vload(s + j0) * vsplat(qscale);
            const VI hd = (VI)(kbv == vsplat(-INFINITY));
            VF x = sv + kbv * vsplat(FA_LOG2E);
            x = (VF)(((VI)x & ~hd) | ((VI)vsplat(-INFINITY) & hd));
            const VI wide = (att_wide_lanes(x) | att_wide_lanes(sv)) & ~hd;  /* or NaN */
            int any = 0;
            for (int u = 0; u < FA_VL; u++) any |= wide[u];
            if (any)
                for (int u = 0; u < FA_VL; u++)
                    if (wide[u]) x[u] = rows_wide_score(a, b, h, i, j0 + u, sv[u], kbv[u], 0.0f);
            vstore(s + j0, x);
            mv = vmax(mv, x);
            nan |= (VI)(x != x);
            hidden |= hd;
        }
        int any_nan = 0, any_hidden = 0;
        for (int u = 0; u < FA_VL; u++) {
            any_nan |= nan[u];
            any_hidden |= hidden[u];
        }
        m = any_nan ? NAN : hmax(mv);
        for (int64_t j = 0; j < j0 && any_hidden && !care; j++)
            if (kb_b[j] == -INFINITY) care = !att_v_finite(a, v_bh + j * a->v_st[2]);
    }
    if (!a->key_bias && !a->mask) {
        for (int64_t j = 0; j < jend; j++) {
            float x = s[j] * qscale;
            if (!(fabsf(x) <= ATT_WIDE)) x = att_score_exact(a, b, h, i, j, 0.0f, 0.0f);
            s[j] = x;
            m = x > m || x != x ? x : m;              /* NaN wins, as it does in the tiles */
        }
    } else {
        for (int64_t j = j0; j < jend; j++) {  /* (the keys left, or all of them with a mask) */
            const float kb = a->key_bias ? a->key_bias[b * Lk + j] : 0.0f;
            const int64_t *ms = a->mask_st;
            const float mk =
                a->mask ? a->mask[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]] : 0.0f;
            float x;
            if (kb == -INFINITY || mk == -INFINITY) { /* hidden, whatever q . k is */
                x = -INFINITY;
                if (!care) care = !att_v_finite(a, v_bh + j * a->v_st[2]);
            } else {
                x = s[j] * qscale + kb * FA_LOG2E + mk * FA_LOG2E;
                if (!(fabsf(x) <= ATT_WIDE) || !(fabsf(s[j] * qscale) <= ATT_WIDE))
                    x = rows_wide_score(a, b, h, i, j, s[j] * qscale, kb, mk);
            }
            s[j] = x;
            m = x > m || x != x ? x : m;              /* NaN wins, as it does in the tiles */
        }
    }
    const float ref = m == -INFINITY ? 0.0f : m;
    /* l in whole vectors, the last one padded with -inf -> 0: the same sum, in the same order,
     * whether or not masked (padding) keys follow, so padding never changes a row's result */
    const int64_t jpad = (jend + FA_VL - 1) / FA_VL * FA_VL;
    for (int64_t j = jend; j < jpad; j++) s[j] = -INFINITY;
    float l = 0.0f;
    for (int64_t j = 0; j < jpad; j += FA_VL) {
        VF p = att_exp2(vload(s + j) - vsplat(ref));
        vstore(s + j, p);
        l += hsum(p);
    }
    if (drop->on) { /* P' = P keep / (1 - p), once l has summed the undropped P */
        const VU rk = vsplatu(fa_rng_row_key(drop->seed, (uint64_t)((b * a->H + h) * a->Lq + i)));
        const VU lanes = *(const VU *)att_lane_ids;
        for (int64_t j = 0; j < jpad; j += FA_VL)
            vstore(s + j, vload(s + j) * vkeep(rk, vsplatu(j) + lanes,
                                                                drop->threshold, drop->scale));
    }
    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
    if (a->weights) { /* (bf16: from P before its rounding) */
        float *w_i = a->weights + ((b * a->H + h) * a->Lq + i) * Lk;
        for (int64_t jj = 0; jj < Lk; jj++) w_i[jj] = jj < jend ? s[jj] * inv : 0.0f;
    }
    if (a->lse) a->lse[(b * a->H + h) * a->Lq + i] = l == 0.0f ? -INFINITY : att_lse(m, l);
    const int64_t vsl = a->v_st[2];
    if (!a->bf16) {
        rows_pv(o_i, s, v_bh, vsl, jend, Dv, inv, care ? a : NULL, b, h, i, 0);
        return;
    }
    for (int64_t j = 0; j < jpad; j += FA_VL) vstore(s + j, att_bf16(vload(s + j))); /* P^ */
    if (ATT_BF16_UNITS && u->dot_rows && !care) {
        dot_rows_pv(o_i, s, v_bh, vsl, jend, Dv, inv);
        return;
    }
    rows_pv(o_i, s, v_bh, vsl, jend, Dv, inv, care ? a : NULL, b, h, i, 1);
}

/* ==== backward ==================================================================================
 * Blocks of KB = BQ keys run along the vector lanes (so the softmax gradient and the dropout bits
 * are element-wise vector ops, keys being the columns of every tile) against blocks of up to BR
 * query rows. For one key block j and one query block i (a "pair"):
 *   S   (rows, KB) = q_i K_j^T            scores, base 2 (K_j^T packed, pre-scaled)
 *   dP' (rows, KB) = dout_i V_j^T
 *   P = 2^(S + masks - lse_i log2 e);  P' = P keep;  dS = P (dP' keep - Delta_i) scale
 *   dV_j^T += dout_i^T P';   dK_j^T += q_i^T dS;   dq_i += dS K_j
 * q, dout (and k, v while packing) are read in place through their row strides.
 * Per-thread scratch (floats), carved by the caller (fa_att_bwd_blk):
 *   kt  (D, KB)    K_j^T times scale * log2 e; lanes past the block's last key are 0
 *   vt  (Dv, KB)   V_j^T, same
 *   kr  (KB, Dp)   K_j's rows, each padded with zeros to Dp = D rounded up to whole vectors
 *   dkt (D, KB), dvt (Dv, KB)   the key block's dK^T, dV^T accumulators
 *   pt, ds (BR, KB)             one pair's dP' then P', and S then dS
 *   kbias (KB)     the key padding bias of the block (natural units; 0 past its last key)
 * Masking rules as in the forward (bottom-right causal alignment; a hidden key's score is -inf
 * and its dS exactly 0, whatever its k and v rows hold; a row with lse = -inf has P = 0, so
 * zero gradients).
 */
#define KB BQ
#define BR ATT_BWD_BR

/* One thread's view of one key block (carved from its scratch buffer). A bf16 call on the tiles
 * (a->tiles) has the products' operands in pairs too (bwd_pair_tiles):
 *   kp (D2, KB) K^T (unscaled) and vp (Dv2, KB) V^T, down pairs of features; krp (KB / 2, Dp)
 *   K down pairs of keys; qa (BR, D2), doa (BR, Dv2) a pair's q and dout rows along features;
 *   ta (max(D, Dv) rounded up to 16, BR / 2) dout^T or q^T along queries; pb (BR / 2, KB) P' or
 *   dS down pairs of queries; dsa (BR, KB / 2) dS along keys; tf (max(D, Dv), KB) floats, a
 *   transposed block (D2, Dv2: the features' pairs rounded up to 16) */
typedef struct {
    float *kt, *vt, *kr, *dkt, *dvt, *pt, *ds, *kbias, *tf;
    uint32_t *kp, *vp, *krp, *qa, *doa, *ta, *pb, *dsa;
    int64_t jb, nb, Dp, D2, Dv2;
    int kbad; /* a key row of the block (kr) holds inf or NaN */
} fa_att_bwd_blk;
/* The rows (or features) [i, n) left after the MR_S tiles, in tiles of 4, 2 and 1, each of a
 * size known at compile time; every row's arithmetic is the same whatever tile holds it. */

#define R16(n) (((n) + 15) / 16 * 16)
/* floats of scratch per thread; tiles: with the pairs of bwd_pair_tiles */
static int64_t attention_bwd_scratch(int64_t D, int64_t Dv, int tiles)
{
    const int64_t Dp = (D + FA_VL - 1) / FA_VL * FA_VL, Dm = D > Dv ? D : Dv;
    const int64_t D2 = R16((D + 1) / 2), Dv2 = R16((Dv + 1) / 2);
    const int64_t pairs = (D2 + Dv2) * KB + KB / 2 * Dp + BR * (D2 + Dv2) + R16(Dm) * BR / 2 +
                          BR / 2 * KB + BR * KB / 2 + Dm * KB;
    return (2 * D + 2 * Dv + Dp + 2 * BR + 1) * KB + (tiles ? pairs : 0);
}

static void attention_bwd_carve(fa_att_bwd_blk *k, float *scratch, const fa_att_bwd_args *a)
{
    const int64_t D = a->f->D, Dv = a->f->Dv, Dm = D > Dv ? D : Dv;
    k->Dp = (D + FA_VL - 1) / FA_VL * FA_VL;
    k->kt = scratch;
    k->vt = k->kt + D * KB;
    k->kr = k->vt + Dv * KB;
    k->dkt = k->kr + k->Dp * KB;
    k->dvt = k->dkt + D * KB;
    k->pt = k->dvt + Dv * KB;
    k->ds = k->pt + BR * KB;
    k->kbias = k->ds + BR * KB;
    if (!a->tiles) return;
    k->D2 = R16((D + 1) / 2);
    k->Dv2 = R16((Dv + 1) / 2);
    k->kp = (uint32_t *)(k->kbias + KB);
    k->vp = k->kp + k->D2 * KB;
    k->krp = k->vp + k->Dv2 * KB;
    k->qa = k->krp + KB / 2 * k->Dp;
    k->doa = k->qa + BR * k->D2;
    k->ta = k->doa + BR * k->Dv2;
    k->pb = k->ta + R16(Dm) * BR / 2;
    k->dsa = k->pb + BR / 2 * KB;
    k->tf = (float *)(k->dsa + BR * KB / 2);
}

/* Pack key block [jb, jb + nb) of head (b, h): kt, vt, the key bias and (with_kr) kr; on the
 * tiles (a->tiles, pairs) kp, vp and (with_kr) krp too. */
static void bwd_pack(const fa_att_bwd_args *a, fa_att_bwd_blk *kb, int64_t b,
                     int64_t h, int with_kr, int pairs)
{
    const fa_attention_args *f = a->f;
    const int64_t D = f->D, Dv = f->Dv, jb = kb->jb, nb = kb->nb;
    const float *k_j = f->k + b * f->k_st[0] + h * f->k_st[1] + jb * f->k_st[2];
    const float *v_j = f->v + b * f->v_st[0] + h * f->v_st[1] + jb * f->v_st[2];
    /* the tiles' pairs take K unscaled (below): the scaled K^T only on the vector tiles */
    const int tiles = ATT_BF16_UNITS && a->tiles && pairs;
    if (nb < KB) { /* lanes past the last key stay 0 */
        for (int64_t d = 0; d < D && !tiles; d++)
            for (int64_t jj = nb; jj < KB; jj++) kb->kt[d * KB + jj] = 0.0f;
        for (int64_t e = 0; e < Dv; e++)
            for (int64_t jj = nb; jj < KB; jj++) kb->vt[e * KB + jj] = 0.0f;
    }
    if (!tiles) transpose(kb->kt, KB, k_j, f->k_st[2], nb, D, f->scale * FA_LOG2E, NULL);
    transpose(kb->vt, KB, v_j, f->v_st[2], nb, Dv, 1.0f, NULL);
    kb->kbad = 0;
    if (with_kr && D > 0) /* (D = 0: k holds nothing, may be NULL) */
        for (int64_t jj = 0; jj < nb; jj++) {
            float *kr_j = kb->kr + jj * kb->Dp;
            memcpy(kr_j, k_j + jj * f->k_st[2], (size_t)D * sizeof(float));
            for (int64_t d = D; d < kb->Dp; d++) kr_j[d] = 0.0f;
            if (!kb->kbad) kb->kbad = !att_finite(kr_j, D);
        }
    if (f->key_bias)
        for (int64_t jj = 0; jj < KB; jj++)
            kb->kbias[jj] = jj < nb ? f->key_bias[b * f->Lk + jb + jj] : 0.0f;
    if (tiles) {
        /* K^T unscaled (the tiles multiply bf16 values; S is scaled after its sums), lanes
         * past the block's last key 0, then its pairs of features; V^T's; K's pairs of keys */
        for (int64_t d = 0; d < D; d++)
            for (int64_t jj = nb; jj < KB; jj++) kb->tf[d * KB + jj] = 0.0f;
        transpose(kb->tf, KB, k_j, f->k_st[2], nb, D, 1.0f, NULL);
        amx_pairs_rows(kb->kp, KB, kb->tf, KB, D, kb->D2);
        amx_pairs_rows(kb->vp, KB, kb->vt, KB, Dv, kb->Dv2);
        if (with_kr && D > 0) amx_pairs_rows(kb->krp, kb->Dp, kb->kr, kb->Dp, nb, KB / 2);
    }
}

/* s[r][:] = x_r . mt[:, :] for rows r < n (x_r read in place, row stride xs; mt (F, KB) a
 * packed, transposed key block): the scores (mt = K^T) or dP' (mt = V^T) of a pair, in
 * register tiles of ROWS rows x NR vectors.
 *   scalar math:  s[r][j] = sum_f x[r][f] * mt[f][j]                                      */
FA_INLINE void bwd_dot_tile(float *FA_RESTRICT s, const float *FA_RESTRICT mt,
                            const float *FA_RESTRICT x, int64_t xs, int64_t F, const int ROWS)
{
    VF acc[MR_S][NR];
    for (int u = 0; u < ROWS; u++)
        for (int c = 0; c < NR; c++) acc[u][c] = vsplat(0.0f);
    for (int64_t f = 0; f < F; f++) {
        VF m[NR];
        for (int c = 0; c < NR; c++) m[c] = vload(mt + f * KB + c * FA_VL);
        for (int u = 0; u < ROWS; u++) {
            const VF xx = vsplat(x[u * xs + f]);
            for (int c = 0; c < NR; c++) acc[u][c] += xx * m[c];
        }
    }
    for (int u = 0; u < ROWS; u++)
        for (int c = 0; c < NR; c++) vstore(s + u * KB + c * FA_VL, acc[u][c]);
}

static void bwd_dot(float *FA_RESTRICT s, const float *FA_RESTRICT mt,
                    const float *FA_RESTRICT x, int64_t xs, int64_t n, int64_t F)
{
    int64_t r = 0;
#define TILE(rows) bwd_dot_tile(s + r * KB, mt, x + r * xs, xs, F, rows)
    for (; r + MR_S <= n; r += MR_S) TILE(MR_S);
    ATT_TAIL(r, n, MR_S, TILE);
#undef TILE
}

/* acc_t[f][:] += sum_{r<n} x[r][f] * p[r][:] for f < F (x rows in place, stride xs; p rows of
 * KB floats): dV^T += dout^T P' and dK^T += q^T dS, in register tiles of COLS features x NR
 * vectors, summed over the rows in order.
 *   scalar math:  acc_t[f][j] += sum_r x[r][f] * p[r][j]                                  */
FA_INLINE void bwd_acc_tile(float *FA_RESTRICT acc_t, const float *FA_RESTRICT p,
                            const float *FA_RESTRICT x, int64_t xs, int64_t n, const int COLS)
{
    VF acc[MR_S][NR];
    for (int u = 0; u < COLS; u++)
        for (int c = 0; c < NR; c++) acc[u][c] = vload(acc_t + u * KB + c * FA_VL);
    for (int64_t r = 0; r < n; r++) {
        VF pv[NR];
        for (int c = 0; c < NR; c++) pv[c] = vload(p + r * KB + c * FA_VL);
        for (int u = 0; u < COLS; u++) {
            const VF xx = vsplat(x[r * xs + u]);
            for (int c = 0; c < NR; c++) acc[u][c] += xx * pv[c];
        }
    }
    for (int u = 0; u < COLS; u++)
        for (int c = 0; c < NR; c++) vstore(acc_t + u * KB + c * FA_VL, acc[u][c]);
}

static void bwd_acc(float *FA_RESTRICT acc_t, const float *FA_RESTRICT p,
                    const float *FA_RESTRICT x, int64_t xs, int64_t n, int64_t F)
{
    int64_t f = 0;
#define TILE(cols) bwd_acc_tile(acc_t + f * KB, p, x + f, xs, n, cols)
    for (; f + MR_S <= F; f += MR_S) TILE(MR_S);
    ATT_TAIL(f, F, MR_S, TILE);
#undef TILE
}

/* dq rows r < ROWS (stride dqs) += sum_{j<nb} ds[r][j] * kr[j][:], NV vectors of features from
 * feature d0; a vector reaching past D goes through a small buffer (dq rows hold D floats).
 *   scalar math:  dq[r][d] += sum_j ds[r][j] * kr[j][d]                                     */
FA_INLINE void bwd_dq_tile(float *FA_RESTRICT dq, int64_t dqs, const float *FA_RESTRICT ds,
                           const float *FA_RESTRICT kr, int64_t Dp, int64_t nb, int64_t d0,
                           int64_t D, const int ROWS, const int NV)
{
    VF acc[MR_S][NR];
    for (int u = 0; u < ROWS; u++)
        for (int c = 0; c < NV; c++) {
            const int64_t d = d0 + c * FA_VL;
            if (d + FA_VL <= D) {
                acc[u][c] = vload(dq + u * dqs + d);
            } else {
                float t[FA_VL] = {0};
                memcpy(t, dq + u * dqs + d, (size_t)(D - d) * sizeof(float));
                acc[u][c] = vload(t);
            }
        }
    for (int64_t j = 0; j < nb; j++) {
        VF kv[NR];
        for (int c = 0; c < NV; c++) kv[c] = vload(kr + j * Dp + d0 + c * FA_VL);
        for (int u = 0; u < ROWS; u++) {
            const VF ss = vsplat(ds[u * KB + j]);
            for (int c = 0; c < NV; c++) acc[u][c] += ss * kv[c];
        }
    }
    for (int u = 0; u < ROWS; u++)
        for (int c = 0; c < NV; c++) {
            const int64_t d = d0 + c * FA_VL;
            if (d + FA_VL <= D) {
                vstore(dq + u * dqs + d, acc[u][c]);
            } else {
                float t[FA_VL];
                vstore(t, acc[u][c]);
                memcpy(dq + u * dqs + d, t, (size_t)(D - d) * sizeof(float));
            }
        }
}

/* Row r sees the keys j < cut0 + r of the block (causal; dS is 0 past them, so they are not
 * summed: a tile of rows stops at its last row's limit). */
static void bwd_dq(float *FA_RESTRICT dq, int64_t dqs,
                   const float *FA_RESTRICT ds, const float *FA_RESTRICT kr,
                   int64_t Dp, int64_t n, int64_t nb, int64_t cut0, int64_t D)
{
    int64_t d0 = 0, r;
#define UPTO(rows) (cut0 + r + (rows) - 1 < nb ? cut0 + r + (rows) - 1 : nb)
#define TILE_NR(rows)                                                                           \
    bwd_dq_tile(dq + r * dqs, dqs, ds + r * KB, kr, Dp, UPTO(rows), d0, D, rows, \
                NR)
#define TILE_1(rows)                                                                            \
    bwd_dq_tile(dq + r * dqs, dqs, ds + r * KB, kr, Dp, UPTO(rows), d0, D, rows, \
                1)
    for (; d0 + NR * FA_VL <= Dp; d0 += NR * FA_VL) {
        for (r = 0; r + MR_S <= n; r += MR_S) TILE_NR(MR_S);
        ATT_TAIL(r, n, MR_S, TILE_NR);
    }
    for (; d0 < Dp; d0 += FA_VL) { /* the last (Dp mod NR*VL) features, a vector at a time */
        for (r = 0; r + MR_S <= n; r += MR_S) TILE_1(MR_S);
        ATT_TAIL(r, n, MR_S, TILE_1);
    }
#undef TILE_NR
#undef TILE_1
#undef UPTO
}

/* One row of a pair's scores, s_r (KB lanes, base 2), query i against the packed key block kb:
 * a key hidden from i (past the causal limit or the block, or -inf in a mask) gets -inf and
 * all ones in hid; every other key gets its biases added, a score or sum past ATT_WIDE (or inf
 * or NaN) formed again by rows_wide_score, as in the forward.
 *   scalar math:  x_j = hidden ? -inf : s_j + (key bias_j + mask_ij) log2 e */
FA_INLINE void bwd_mask_row(const fa_attention_args *f, const fa_att_bwd_blk *kb, int64_t b,
                            int64_t h, int64_t i, float *s_r, VI *hid)
{
    const int64_t jb = kb->jb;
    int64_t cut = kb->nb; /* keys [jb, jb + cut) are visible to query i, masks aside */
    if (f->causal && i + (f->Lk - f->Lq) + 1 - jb < cut) cut = i + (f->Lk - f->Lq) + 1 - jb;
    if (cut < 0) cut = 0;
    const int64_t *ms = f->mask_st;
    const float *m_i = f->mask ? f->mask + b * ms[0] + h * ms[1] + i * ms[2] + jb * ms[3] : NULL;
    const VI lanes = (VI)(*(const VU *)att_lane_ids);
    for (int c = 0; c < NR; c++) {
        const int64_t j0 = c * FA_VL;
        const VF sv = vload(s_r + j0);
        VI hd = (VI)(lanes + (int32_t)j0 >= (VI){0} + (int32_t)cut);
        VF x = sv, kbv = vsplat(0.0f), mkv = vsplat(0.0f);
        if (f->key_bias) {
            kbv = vload(kb->kbias + j0);
            hd |= (VI)(kbv == vsplat(-INFINITY));
            x += kbv * vsplat(FA_LOG2E);
        }
        if (m_i) {
            if (f->mask_st[3] == 1 && j0 + FA_VL <= cut) {
                mkv = vload(m_i + j0);
            } else {
                float t[FA_VL];
                for (int u = 0; u < FA_VL; u++)
                    t[u] = j0 + u < cut ? m_i[(j0 + u) * f->mask_st[3]] : 0.0f;
                mkv = vload(t);
            }
            hd |= (VI)(mkv == vsplat(-INFINITY));
            x += mkv * vsplat(FA_LOG2E);
        }
        x = (VF)(((VI)x & ~hd) | ((VI)vsplat(-INFINITY) & hd));
        const VI wide = (att_wide_lanes(x) | att_wide_lanes(sv)) & ~hd;  /* or NaN */
        vstore(s_r + j0, x);
        hid[c] = hd;
        int any = 0;
        for (int u = 0; u < FA_VL; u++) any |= wide[u];
        if (any)
            for (int u = 0; u < FA_VL; u++)
                if (wide[u])
                    s_r[j0 + u] = rows_wide_score(f, b, h, i, jb + j0 + u, sv[u], kbv[u], mkv[u]);
    }
}

/* A pair's probabilities and their gradient, row r = query ilo + r: ds holds S (base 2) and
 * becomes dS * scale; pt holds dP' and becomes P'.
 *   scalar math:  s = S_ij + key bias + mask (-inf where hidden: past the causal limit or the
 *                 block, or a -inf mask);
 *                 P = 2^(s - pref_i) pinv_i (pref = lse_i log2 e, pinv = 1 but for rows whose
 *                 lse is too large for that, see attention_bwd_delta), 0 where lse_i = -inf
 *                 (or NaN, as in the twin);
 *                 keep = 1 / (1 - p) or 0;  P' = P keep;  dS = P (dP' keep - Delta_i) scale,
 *                 exactly 0 for a hidden key (even where dP' is NaN: its v row is not used) */
static void bwd_probs(const fa_att_bwd_args *a, const fa_att_bwd_blk *kb,
                      int64_t b, int64_t h, int64_t ilo, int64_t n)
{
    const fa_attention_args *f = a->f;
    const int64_t Lq = f->Lq, jb = kb->jb, bh = b * f->H + h;
    const float *delta_bh = a->delta + bh * Lq;
    const float *pref_bh = a->pref + bh * Lq, *pinv_bh = a->pinv + bh * Lq;
    const VF sc = vsplat(f->scale);
    VU col[NR];
    for (int c = 0; c < NR; c++) col[c] = vsplatu(jb + c * FA_VL) + *(const VU *)att_lane_ids;
    for (int64_t r = 0; r < n; r++) {
        const int64_t i = ilo + r;
        float *s_r = kb->ds + r * KB, *p_r = kb->pt + r * KB;
        VI hid[NR];
        bwd_mask_row(f, kb, b, h, i, s_r, hid);
        const float pinv = pinv_bh[i];
        const VI live = (VI){0} + (pinv != 0.0f ? -1 : 0); /* all ones: P counts */
        const VF l2 = vsplat(pref_bh[i]);
        const VF dl = vsplat(delta_bh[i]);
        if (!a->drop.on) {
            for (int c = 0; c < NR; c++) {
                VF p = (VF)((VI)att_exp2(vload(s_r + c * FA_VL) - l2) & live);
                if (pinv != 1.0f) p *= vsplat(pinv);
                const VF dp = vload(p_r + c * FA_VL);
                const VF ds = (VF)((VI)(p * (dp - dl) * sc) & ~hid[c]);
                vstore(p_r + c * FA_VL, f->bf16 ? att_bf16(p) : p);
                vstore(s_r + c * FA_VL, f->bf16 ? att_bf16(ds) : ds);
            }
        } else {
            const VU rk = vsplatu(fa_rng_row_key(f->seed, (uint64_t)(bh * Lq + i)));
            for (int c = 0; c < NR; c++) {
                VF p = (VF)((VI)att_exp2(vload(s_r + c * FA_VL) - l2) & live);
                if (pinv != 1.0f) p *= vsplat(pinv);
                const VF kf = vkeep(rk, col[c], a->drop.threshold, a->drop.scale);
                const VF dp = vload(p_r + c * FA_VL) * kf;
                const VF ds = (VF)((VI)(p * (dp - dl) * sc) & ~hid[c]);
                const VF pk = p * kf;
                vstore(p_r + c * FA_VL, f->bf16 ? att_bf16(pk) : pk);
                vstore(s_r + c * FA_VL, f->bf16 ? att_bf16(ds) : ds);
            }
        }
    }
}

/* S (n rows x KB, base 2, into kb->ds) of the query rows q_i (row stride qs) against the packed
 * key block kb, as every pair forms it: on the tiles (a bf16 call's a->tiles), bf16 pairs summed
 * by TDPBF16PS and scaled after; else bwd_dot against K^T pre-scaled. One function, so that a
 * row's max (bwd_row_stats) and its pairs' scores agree to the bit: P = 2^(s - max) reads their
 * difference, which float32 cannot hold to better than an ulp of |s| (2^38 at |s| ~ 1e18). */
static void bwd_scores(const fa_att_bwd_args *a, const fa_att_bwd_blk *kb, const float *q_i,
                       int64_t qs, int64_t n)
{
#if ATT_BF16_UNITS
    if (a->tiles) {
        amx_rows_pairs(kb->qa, kb->D2, q_i, qs, n, R16(n), a->f->D);
        memset(kb->ds, 0, (size_t)(n * KB) * sizeof(float));
        a->tiles->pairs_gemm(kb->ds, KB, n, KB, kb->D2, kb->qa, kb->D2, kb->kp, KB);
        const VF sc = vsplat(a->f->scale * FA_LOG2E);
        for (int64_t e = 0; e < n * KB; e += FA_VL) vstore(kb->ds + e, vload(kb->ds + e) * sc);
        return;
    }
#endif
    bwd_dot(kb->ds, kb->kt, q_i, qs, n, a->f->D);
}

/* The max and sum of query i's scores (base 2, as bwd_probs forms them) over every key block
 * it can see: *pref = max, *pinv = 1 / sum 2^(s - max) (0 for a row that sees no key). For the
 * rows whose lse float32 cannot hold to the digits P needs. */
static void bwd_row_stats(const fa_att_bwd_args *a, int64_t b, int64_t h,
                          int64_t i, float *scratch, float *pref, float *pinv)
{
    const fa_attention_args *f = a->f;
    fa_att_bwd_blk kb;
    attention_bwd_carve(&kb, scratch, a);
    const float *q_i = f->q + b * f->q_st[0] + h * f->q_st[1] + i * f->q_st[2];
    int64_t jend = f->Lk;
    if (f->causal && i + (f->Lk - f->Lq) + 1 < jend) jend = i + (f->Lk - f->Lq) + 1;
    float m = -INFINITY, l = 0.0f;
    for (kb.jb = 0; kb.jb < jend; kb.jb += KB) {
        kb.nb = f->Lk - kb.jb < KB ? f->Lk - kb.jb : KB;
        bwd_pack(a, &kb, b, h, 0, 1);
        bwd_scores(a, &kb, q_i, f->q_st[2], 1);
        VI hid[NR];
        bwd_mask_row(f, &kb, b, h, i, kb.ds, hid);
        VF mx = vsplat(-INFINITY);
        for (int c = 0; c < NR; c++) mx = vmax(mx, vload(kb.ds + c * FA_VL));
        const float bm = hmax(mx);
        if (bm > m) {
            l = m == -INFINITY ? 0.0f : l * exp2f(m - bm);
            m = bm;
        }
        if (m == -INFINITY) continue;
        VF acc = vsplat(0.0f);
        for (int c = 0; c < NR; c++) acc += att_exp2(vload(kb.ds + c * FA_VL) - vsplat(m));
        l += hsum(acc);
    }
    *pref = m == -INFINITY ? 0.0f : m;
    *pinv = l > 0.0f ? 1.0f / l : l == 0.0f ? 0.0f : l; /* (NaN stays NaN) */
}

/* Per row r in [r0, r1) of the flattened (B*H*Lq) rows: Delta_r = dout_r . out_r, in one fixed
 * order (whole vectors, a tree, then the tail); and how bwd_probs forms the row's P: from its
 * lse (pref = lse log2 e, pinv = 1), or, when |lse| > ATT_LSE_MAX (float32 then holds lse to
 * less than the ~1e-5 that P needs), from the row's max and sum recomputed (bwd_row_stats). */
static void attention_bwd_delta(const fa_att_bwd_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const fa_attention_args *f = a->f;
    const fa_attention_grads *g = a->g;
    const int64_t H = f->H, Lq = f->Lq, Dv = f->Dv;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
        const float *do_i = g->dout + b * g->dout_st[0] + h * g->dout_st[1] + i * g->dout_st[2];
        const float *o_i = f->out + b * f->out_st[0] + h * f->out_st[1] + i * f->out_st[2];
        VF acc = vsplat(0.0f);
        int64_t e = 0;
        for (; e + FA_VL <= Dv; e += FA_VL) acc += vload(do_i + e) * vload(o_i + e);
        float t = hsum(acc);
        for (; e < Dv; e++) t += do_i[e] * o_i[e];
        a->delta[r] = t;
        const float lse = f->lse[r];
        if (!(lse > -INFINITY)) {                 /* no key seen (or NaN): P = 0 */
            a->pref[r] = 0.0f;
            a->pinv[r] = 0.0f;
        } else if (fabsf(lse) <= ATT_LSE_MAX) {
            a->pref[r] = lse * FA_LOG2E;
            a->pinv[r] = 1.0f;
        } else {
            bwd_row_stats(a, b, h, i, scratch, a->pref + r, a->pinv + r);
        }
    }
}

/* dq rows r < n (stride dqs) += sum_j ds[r][j] * kr[j][:] over the keys query ilo + r can see:
 * bwd_dq for a block whose hidden keys may hold inf or NaN in k (0 * NaN is NaN; rare:
 * scalar). */
static void bwd_dq_visible(const fa_att_bwd_args *a, const fa_att_bwd_blk *kb, int64_t b, int64_t h,
                           int64_t ilo, int64_t n, float *dq, int64_t dqs)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t jj = 0; jj < kb->nb; jj++) {
            if (att_hidden(a->f, b, h, ilo + r, kb->jb + jj)) continue;
            const float d = kb->ds[r * KB + jj];
            const float *kr_j = kb->kr + jj * kb->Dp;
            for (int64_t e = 0; e < a->f->D; e++) dq[r * dqs + e] += d * kr_j[e];
        }
}

#if ATT_BF16_UNITS
/* tf holds a transposed key block (D x KB) and a transposed query block (D or Dv x BR) in
 * turn, both with row stride KB */
_Static_assert(KB == BR, "bwd_pair_tiles transposes query blocks into tf with row stride KB");
/* bwd_pair on the tiles (a bf16 call, a->tiles): the same five products, every operand in
 * pairs of bf16 (kb's pair buffers), float32 sums in TDPBF16PS's order; S's sums are scaled to
 * base 2 after. dq through the scalar bwd_dq_visible where a key row holds inf or NaN. */
static void bwd_pair_tiles(const fa_att_bwd_args *a, const fa_att_bwd_blk *kb, int64_t b,
                           int64_t h, int64_t ilo, int64_t ihi, int with_dkv, int with_dq)
{
    const fa_attention_args *f = a->f;
    const fa_attention_grads *g = a->g;
    const struct fa_amx_kernels *t = a->tiles;
    const int64_t n = ihi - ilo, n16 = R16(n), n2 = R16((n + 1) / 2), D = f->D, Dv = f->Dv;
    const float *q_i = f->q + b * f->q_st[0] + h * f->q_st[1] + ilo * f->q_st[2];
    const float *do_i = g->dout + b * g->dout_st[0] + h * g->dout_st[1] + ilo * g->dout_st[2];
    bwd_scores(a, kb, q_i, f->q_st[2], n);                                    /* S */
    amx_rows_pairs(kb->doa, kb->Dv2, do_i, g->dout_st[2], n, n16, Dv);      /* dP' */
    memset(kb->pt, 0, (size_t)(n * KB) * sizeof(float));
    t->pairs_gemm(kb->pt, KB, n, KB, kb->Dv2, kb->doa, kb->Dv2, kb->vp, KB);
    bwd_probs(a, kb, b, h, ilo, n);                                          /* P', dS */
    if (with_dkv) {                            /* dV^T += dout^T P';  dK^T += q^T dS */
        transpose(kb->tf, BR, do_i, g->dout_st[2], n, Dv, 1.0f, NULL);
        amx_rows_pairs(kb->ta, n2, kb->tf, BR, Dv, R16(Dv), n);
        amx_pairs_rows(kb->pb, KB, kb->pt, KB, n, n2);
        t->pairs_gemm(kb->dvt, KB, Dv, KB, n2, kb->ta, n2, kb->pb, KB);
        transpose(kb->tf, BR, q_i, f->q_st[2], n, D, 1.0f, NULL);
        amx_rows_pairs(kb->ta, n2, kb->tf, BR, D, R16(D), n);
        amx_pairs_rows(kb->pb, KB, kb->ds, KB, n, n2);
        t->pairs_gemm(kb->dkt, KB, D, KB, n2, kb->ta, n2, kb->pb, KB);
    }
    if (with_dq) {                             /* dq += dS K */
        float *dq_i = g->dq + b * g->dq_st[0] + h * g->dq_st[1] + ilo * g->dq_st[2];
        if (kb->kbad) {
            bwd_dq_visible(a, kb, b, h, ilo, n, dq_i, g->dq_st[2]);
        } else {
            amx_rows_pairs(kb->dsa, KB / 2, kb->ds, KB, n, n16, KB);
            t->pairs_gemm(dq_i, g->dq_st[2], n, D, KB / 2, kb->dsa, KB / 2, kb->krp, kb->Dp);
        }
    }
}
#else
#define bwd_pair_tiles(...) ((void)0)
#endif

/* One pair: query rows [ilo, ihi) of head (b, h) against the packed key block kb; adds into
 * the block's dK^T, dV^T accumulators (with_dkv) and into dq's rows (with_dq). */
static void bwd_pair(const fa_att_bwd_args *a, const fa_att_bwd_blk *kb, int64_t b, int64_t h,
                     int64_t ilo, int64_t ihi, int with_dkv, int with_dq)
{
    const fa_attention_args *f = a->f;
    const fa_attention_grads *g = a->g;
    const int64_t n = ihi - ilo;
    if (ATT_BF16_UNITS && a->tiles) {
        bwd_pair_tiles(a, kb, b, h, ilo, ihi, with_dkv, with_dq);
        return;
    }
    const float *q_i = f->q + b * f->q_st[0] + h * f->q_st[1] + ilo * f->q_st[2];
    const float *do_i = g->dout + b * g->dout_st[0] + h * g->dout_st[1] + ilo * g->dout_st[2];
    bwd_scores(a, kb, q_i, f->q_st[2], n);                /* S */
    bwd_dot(kb->pt, kb->vt, do_i, g->dout_st[2], n, f->Dv);  /* dP' */
    bwd_probs(a, kb, b, h, ilo, n);                      /* P', dS */
    if (with_dkv) {
        bwd_acc(kb->dvt, kb->pt, do_i, g->dout_st[2], n, f->Dv);
        bwd_acc(kb->dkt, kb->ds, q_i, f->q_st[2], n, f->D);
    }
    if (with_dq) {
        float *dq_i = g->dq + b * g->dq_st[0] + h * g->dq_st[1] + ilo * g->dq_st[2];
        const int64_t cut0 = f->causal ? ilo + (f->Lk - f->Lq) + 1 - kb->jb : kb->nb;
        if (kb->kbad)
            bwd_dq_visible(a, kb, b, h, ilo, n, dq_i, g->dq_st[2]);
        else
            bwd_dq(dq_i, g->dq_st[2], kb->ds, kb->kr, kb->Dp, n, kb->nb, cut0,
                   f->D);
    }
}

/* The first query that sees key jb: 0, or jb - (Lk - Lq) under the causal rule. */
static int64_t bwd_first_query(const fa_attention_args *f, int64_t jb)
{
    const int64_t first = f->causal ? jb - (f->Lk - f->Lq) : 0;
    return first > 0 ? first : 0;
}

/* Key blocks [kb0, kb1) of head (b, h): dk and dv of their keys, summed over every query block
 * in order; with_dq (the task owns the whole head): dq too, zeroed first, then each pair's
 * share added in key-block order. */
static void attention_bwd_keys(const fa_att_bwd_args *a, int64_t b, int64_t h, int64_t kb0,
                               int64_t kb1, int with_dq, float *scratch)
{
    const fa_attention_args *f = a->f;
    const fa_attention_grads *g = a->g;
    const int64_t D = f->D, Dv = f->Dv, Lq = f->Lq, Lk = f->Lk;
    fa_att_bwd_blk kb;
    attention_bwd_carve(&kb, scratch, a);
    if (with_dq && D > 0) /* (D = 0: dq holds nothing, may be NULL) */
        for (int64_t i = 0; i < Lq; i++)
            memset(g->dq + b * g->dq_st[0] + h * g->dq_st[1] + i * g->dq_st[2], 0,
                   (size_t)D * sizeof(float));
    for (int64_t blk = kb0; blk < kb1; blk++) {
        kb.jb = blk * KB;
        kb.nb = Lk - kb.jb < KB ? Lk - kb.jb : KB;
        bwd_pack(a, &kb, b, h, with_dq, 1);
        memset(kb.dkt, 0, (size_t)((D + Dv) * KB) * sizeof(float)); /* dkt, dvt */
        const int64_t first = bwd_first_query(f, kb.jb);
        for (int64_t i0 = first / BR * BR; i0 < Lq; i0 += BR) {
            const int64_t ilo = i0 > first ? i0 : first, ihi = i0 + BR < Lq ? i0 + BR : Lq;
            bwd_pair(a, &kb, b, h, ilo, ihi, 1, with_dq);
        }
        float *dk_j = g->dk + b * g->dk_st[0] + h * g->dk_st[1] + kb.jb * g->dk_st[2];
        float *dv_j = g->dv + b * g->dv_st[0] + h * g->dv_st[1] + kb.jb * g->dv_st[2];
        transpose(dk_j, g->dk_st[2], kb.dkt, KB, D, kb.nb, 1.0f, NULL);
        transpose(dv_j, g->dv_st[2], kb.dvt, KB, Dv, kb.nb, 1.0f, NULL);
    }
}

/* dq of query block qb of head (b, h), over every key block in order: the same pairs, the same
 * arithmetic and the same order as attention_bwd_keys with with_dq, so the same bits. */
static void attention_bwd_queries(const fa_att_bwd_args *a, int64_t b,
                                  int64_t h, int64_t qb, float *scratch)
{
    const fa_attention_args *f = a->f;
    const fa_attention_grads *g = a->g;
    const int64_t D = f->D, Lq = f->Lq, Lk = f->Lk;
    const int64_t i0 = qb * BR, ihi = i0 + BR < Lq ? i0 + BR : Lq;
    fa_att_bwd_blk kb;
    attention_bwd_carve(&kb, scratch, a);
    for (int64_t i = i0; i < ihi && D > 0; i++)
        memset(g->dq + b * g->dq_st[0] + h * g->dq_st[1] + i * g->dq_st[2], 0,
               (size_t)D * sizeof(float));
    for (kb.jb = 0; kb.jb < Lk; kb.jb += KB) {
        kb.nb = Lk - kb.jb < KB ? Lk - kb.jb : KB;
        const int64_t first = bwd_first_query(f, kb.jb);
        const int64_t ilo = i0 > first ? i0 : first;
        if (ilo >= ihi) break; /* later key blocks are hidden from this block too */
        bwd_pack(a, &kb, b, h, 1, 1);
        bwd_pair(a, &kb, b, h, ilo, ihi, 0, 1);
    }
}

/* ==== the passes over the team ================================================================ */

/* Forward task t of B * H * nqb (head by head, each head's query blocks last first): one query
 * row (rows) or one block of queries. */
static void attention_forward_task(const fa_attention_args *a, const fa_att_units *u,
                                   const fa_dropout_t *drop, int rows, int64_t nqb, int64_t t,
                                   float *scratch)
{
    const int64_t qb = nqb - 1 - t % nqb, bh = t / nqb;
    if (rows)
        attention_rows(a, u, drop, bh / a->H, bh % a->H, qb, scratch);
    else
        attention_task(a, u, drop, bh / a->H, bh % a->H, qb, scratch);
}

/* u: the units a bf16 call runs on (fa_att_units; all zero for float32) */
static int attention_forward(const fa_attention_args *a, const fa_att_units *u, int nthreads)
{
    const int64_t B = a->B, H = a->H, Lq = a->Lq, Lk = a->Lk;
    if (B <= 0 || H <= 0 || Lq <= 0) return 0;
    const fa_dropout_t drop = fa_dropout_make(a->dropout_p, a->seed);
    /* Few queries: one row at a time along the head dim; else query blocks along the lanes. */
    const int rows = Lq * ATT_ROWS_DIV <= BQ;
    const int64_t scratch =
        rows ? attention_rows_scratch(Lk, a->D, a->bf16) : attention_scratch(a->D, a->Dv, a->bf16);
    const int64_t nqb = rows ? Lq : (Lq + BQ - 1) / BQ, ntasks = B * H * nqb;
    const double flops = 4.0 * (double)(B * H) * (double)Lq * (double)Lk *
                         (double)(a->D + a->Dv) / 2;
    const int nt = fa_team_size(nthreads < ntasks ? nthreads : (int)ntasks, flops, 2e5);

    float *buf = malloc((size_t)(scratch * nt) * sizeof(float));
    if (!buf) return -1;
    fa_attention_args rounded;
    float *kv = att_round_kv(a, u, rows, nqb, nthreads, &rounded);
    if (kv) a = &rounded;

    /* Causal tasks grow with the query block: hand out the heavy (late) blocks first. A team
     * of one runs them without an OpenMP region (see fa_team_size). */
    if (nt <= 1) {
        for (int64_t t = 0; t < ntasks; t++)
            attention_forward_task(a, u, &drop, rows, nqb, t, buf);
    } else {
#pragma omp parallel num_threads(nt)
        {
            float *mine = buf + scratch * fa_thread_id(); /* id < team <= nt buffers */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < ntasks; t++)
                attention_forward_task(a, u, &drop, rows, nqb, t, mine);
        }
    }
    free(buf);
    free(kv);
    return 0;
}

/* u: the units a bf16 call runs on (its tiles, if any, take the five products) */
static int attention_backward(const fa_attention_grads *g, const fa_attention_args *f,
                              const fa_att_units *u, int nthreads)
{
    const int64_t H = f->H, Lq = f->Lq, Lk = f->Lk, BH = f->B * H;
    if (f->B <= 0 || H <= 0) return 0;
    fa_att_bwd_args bwd = {.f = f, .g = g, .drop = fa_dropout_make(f->dropout_p, f->seed),
                           .tiles = ATT_BF16_UNITS && f->bf16 ? u->tiles : NULL};
    fa_att_bwd_args *a = &bwd;
    const int64_t nkb = (Lk + KB - 1) / KB, nqb = (Lq + BR - 1) / BR;
    const int64_t scratch = attention_bwd_scratch(f->D, f->Dv, a->tiles != NULL);
    /* five products of (rows x keys x head dim), half of them under the causal rule */
    const double flops = 5.0 * (double)BH * (double)Lq * (double)Lk *
                         (double)(f->D + f->Dv) / (f->causal ? 2.0 : 1.0);
    const int nt = fa_team_size(nthreads, flops, 2e5);
    /* Split when the (batch, head) tasks are too few for the team: a head per thread costs 5
     * products per head; the split, 7 (dq's pass recomputes S and dP') spread over every thread. */
    const int64_t per = (BH + nt - 1) / nt;
    const int split = nt > 1 && 5 * per * nt > 7 * BH;

    a->delta = malloc((size_t)(BH * Lq > 0 ? 3 * BH * Lq : 1) * sizeof(float));
    float *buf = malloc((size_t)(scratch * nt) * sizeof(float));
    if (!a->delta || !buf) {
        free(a->delta);
        free(buf);
        return -1;
    }
    a->pref = a->delta + BH * Lq;
    a->pinv = a->pref + BH * Lq;

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *mine = buf + scratch * fa_thread_id(); /* id < team <= nt buffers */
        int64_t lo, hi;
        fa_split(BH * Lq, 16, &lo, &hi);
        attention_bwd_delta(a, lo, hi, mine);
#pragma omp barrier
        if (!split) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH; t++)
                attention_bwd_keys(a, t / H, t % H, 0, nkb, 1, mine);
        } else {
            /* causal: early key blocks and late query blocks carry the most rows; hand them
             * out first, across every head */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH * nkb; t++) {
                const int64_t blk = t / BH, bh = t % BH;
                attention_bwd_keys(a, bh / H, bh % H, blk, blk + 1, 0, mine);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH * nqb; t++) {
                const int64_t qb = nqb - 1 - t / BH, bh = t % BH;
                attention_bwd_queries(a, bh / H, bh % H, qb, mine);
            }
        }
    }
    free(buf);
    free(a->delta);
    return 0;
}

#undef KB
#undef BR
#undef R16
#undef ATT_TAIL

#undef NR
#undef BQ
#undef MR_S
#undef MR_P
#undef vsplatu
#undef ATT_BF16_KV_ROUNDED
