/* attention_bf16_body.h -- bf16 attention (a->bf16) for one ISA level, included by
 * attention_body.h: the rounding, the fma path (every level) and, per block, the choice among
 * the units paths.c chose for the call (fa_att_units: the dot path of attention_dot_body.h and
 * the AMX tiles of attention_amx_body.h, both on the avx512 level only; on other levels
 * ATT_BF16_UNITS is 0 and those branches compile away).
 */

/* ==== bf16 compute (a->bf16; fastattn.h says what it computes) ==================================
 * The fma path (every level) rounds q, k, v and P to bf16 in float32 registers and runs the
 * float32 tiles on them: products of two bf16 are exact in float32. The dot path (avx512 level,
 * AVX512_BF16 CPU, the units' dot) packs the same rounded values in pairs of bf16 and multiplies
 * them with vdpbf16ps. Extra per-thread scratch of the tiled pass (floats):
 *   kb  (BK, D + 32)      the key block, rounded (fma) or in pairs along D (dot; rows of
 *                         ceil(D / 2) pairs padded with zeros to whole vectors)
 *   vb  (BK + 2, Dv + 16) the value block, rounded (fma) or in pairs of keys (dot; rows of
 *                         Dv pairs padded to whole vectors)
 *   pp  (BK / 2 + 1, BQ)  P in pairs of keys (dot)
 * Rounding as vcvtneps2bf16: nearest even; subnormal inputs to +-0 (so every path gives the
 * same bits: the instruction treats them as zero); NaN stays NaN (quiet); past the largest bf16
 * (3.39e38), +-inf.
 *   scalar math:  b = bits(x);  NaN: (b | 0x400000) & 0xffff0000;  |x| < 2^-126: b & sign;
 *                 else (b + 0x7fff + bit 16 of b) & 0xffff0000 */
FA_INLINE VF att_bf16(VF x)
{
    const VU b = (VU)x, mag = b & vsplatu(0x7fffffffu);
    const VU nan = (VU)(mag > vsplatu(0x7f800000u)), sub = (VU)(mag < vsplatu(0x00800000u));
    const VU r = (b + vsplatu(0x7fffu) + ((b >> 16) & vsplatu(1u))) & vsplatu(0xffff0000u);
    const VU q = (b | vsplatu(0x00400000u)) & vsplatu(0xffff0000u);
    return (VF)((r & ~(nan | sub)) | (q & nan) | (b & vsplatu(0x80000000u) & sub));
}


/* dst[e] = bf16(src[e]) for e < n, widened */
static void att_bf16_row(float *FA_RESTRICT dst, const float *FA_RESTRICT src, int64_t n)
{
    int64_t e = 0;
    for (; e + FA_VL <= n; e += FA_VL) vstore(dst + e, att_bf16(vload(src + e)));
    for (; e < n; e++) dst[e] = att_bf16s(src[e]);
}

#include "attention_dot_body.h"
#include "attention_amx_body.h"

/* dst[e] = bf16(src[e]) for e < n, widened (with cvt, the instruction: the CPU has it); dst
 * may be src */
static void att_round(float *dst, const float *src, int64_t n, int cvt)
{
    if (ATT_BF16_UNITS && cvt) {
        att_bf16_row_cvt(dst, src, n);
        return;
    }
    int64_t e = 0;
    for (; e + FA_VL <= n; e += FA_VL) vstore(dst + e, att_bf16(vload(src + e)));
    for (; e < n; e++) dst[e] = att_bf16s(src[e]);
}

/* bf16 scores of key block k (nb rows, row stride ksl), masks not yet applied:
 * st[j][:] = (k^_j . q^) * scale * log2 e, mx their lane-wise max. qt holds q^ (transposed, not
 * scaled; in pairs on the dot path); kb receives the block's rounded (or paired) keys. */
static void bf16_scores(const fa_attention_args *a, const float *k, float *st, VF *mx, VI *wd,
                        const float *qt, float *kb, int64_t nb, const fa_att_units *u)
{
    const int64_t D = a->D, ksl = a->k_st[2];
    const float sc = a->scale * FA_LOG2E;
    for (int c = 0; c < NR; c++) mx[c] = vsplat(-INFINITY);
    if (ATT_BF16_UNITS && (u->tiles || u->dot)) {
        if (u->tiles) {
            amx_scores(a, k, st, mx, qt, kb, nb, u->tiles);
        } else {
            dot_pack_k((uint32_t *)kb, k, ksl, nb, D);
            dot_score_tile(st, mx, qt, (const uint32_t *)kb, nb, D, sc);
        }
        for (int64_t j = 0; j < nb; j++) /* wd as score_rows forms it */
            for (int c = 0; c < NR; c++) *wd = att_wide_acc(*wd, vload(st + j * BQ + c * FA_VL));
        return;
    }
    if (a->bf16 == ATT_BF16_KV_ROUNDED) { /* the keys rounded once (attention_forward) */
        score_tile(st, mx, wd, qt, k, ksl, nb, D, sc);
        return;
    }
    for (int64_t j = 0; j < nb; j++) att_round(kb + j * D, k + j * ksl, D, u->cvt);
    score_tile(st, mx, wd, qt, kb, D, nb, D, sc);
}
/* bf16 P.V of key block [jb, jb+nb) (v: its first value row; st holds P^, rounded), v rounded:
 * ot[e][:] += sum_j P^_j v^_j[e]; a block whose hidden keys hold inf or NaN in v (care) on the
 * fma path's scalar loop. */
static void bf16_pv(const fa_attention_args *a, int64_t b, int64_t h, int64_t i0, int64_t nq,
                    int64_t jb, int64_t nb, float *st, float *ot, const float *v, float *vb,
                    float *pp, int care, const fa_att_units *u)
{
    const int64_t Dv = a->Dv;
    int64_t vsl = a->v_st[2];
    if (ATT_BF16_UNITS && u->tiles && !care) {
        amx_pv(a, nb, st, ot, v, vb, pp, u->tiles);
        return;
    }
    if (ATT_BF16_UNITS && u->dot && !care) {
        dot_pv_tile(ot, st, v, vsl, nb, Dv, (uint32_t *)vb, (uint32_t *)pp);
        return;
    }
    if (a->bf16 != ATT_BF16_KV_ROUNDED) { /* else the values rounded once (attention_forward) */
        for (int64_t j = 0; j < nb; j++) att_round(vb + j * Dv, v + j * vsl, Dv, u->cvt);
        v = vb;
        vsl = Dv;
    }
    if (care)
        pv_visible(a, b, h, i0, nq, jb, nb, st, ot, v, vsl);
    else
        pv_tile(ot, st, v, vsl, nb, Dv);
}
/* bf16 on the fma path (the paths that pack k and v their own way excepted) with more than one
 * query block per head: every block would round the same keys and values again (their
 * rounding costs about as much as the block's products on AVX2), so they are rounded once
 * here, over the threads, into copies (B, H, Lk, D) and (B, H, Lk, Dv) that the tasks read in
 * place (*r: the call's arguments on the copies, bf16 = ATT_BF16_KV_ROUNDED). The same bits:
 * rounding is per value. Returns the copies' buffer (the caller frees it), or NULL where this
 * does not apply or the memory is not there (the blocks then round as they go). */
static float *att_round_kv(const fa_attention_args *a, const fa_att_units *u, int rows,
                           int64_t nqb, int nthreads, fa_attention_args *r)
{
    if (ATT_BF16_UNITS && (u->dot || u->tiles)) return NULL;
    if (a->bf16 != 1 || rows || nqb < 2) return NULL;
    const int64_t BH = a->B * a->H, Lk = a->Lk, D = a->D, Dv = a->Dv, n = BH * Lk * (D + Dv);
    float *kv = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!kv) return NULL;
    *r = *a;
    float *kr = kv, *vr = kv + BH * Lk * D;
    const int64_t kst[3] = {a->H * Lk * D, Lk * D, D}, vst[3] = {a->H * Lk * Dv, Lk * Dv, Dv};
    const int nt FA_OMP_ONLY = fa_team_size(nthreads, (double)n, 1.3e5);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t t = 0; t < BH * Lk; t++) {
        const int64_t b = t / (a->H * Lk), h = t / Lk % a->H, j = t % Lk;
        att_round(kr + t * D, a->k + b * a->k_st[0] + h * a->k_st[1] + j * a->k_st[2], D,
                  u->cvt);
        att_round(vr + t * Dv, a->v + b * a->v_st[0] + h * a->v_st[1] + j * a->v_st[2], Dv,
                  u->cvt);
    }
    r->k = kr;
    r->v = vr;
    for (int i = 0; i < 3; i++) {
        r->k_st[i] = kst[i];
        r->v_st[i] = vst[i];
    }
    r->bf16 = ATT_BF16_KV_ROUNDED;
    return kv;
}
