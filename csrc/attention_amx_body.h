/* attention_amx_body.h -- bf16 attention's tile pass, for the avx512 level (included by
 * attention_bf16_body.h, after the dot path whose pairs it uses): the many-query pass's two
 * products (scores, P.V) on the AMX tiles the call's units name (fa_att_units.tiles: real or
 * emulated, bf16_amx.h). Elsewhere (ATT_BF16_UNITS 0) the names below stand for nothing: their
 * callers' branches compile away. */
#if ATT_BF16_UNITS
/* ---- the amx paths: the many-query pass's two products on the tiles (fa_att_units.tiles,
 * bf16_amx.h), the queries in the dot path's pairs (dot_pack_q), the rest as above */
_Static_assert(BQ % 32 == 0, "the tiles' attention products take pairs of 16 queries");
_Static_assert(ATT_BK % 32 == 0, "the tiles' scratch (st, pp, vb) holds whole pairs of 16 keys");

/* qt in pairs (dot_pack_q): its pair rows past ceil(D / 2), up to a whole block of 16, zeroed */
static void amx_pad_q(float *qt, int64_t D)
{
    const int64_t d2s = (D + 1) / 2;
    for (int64_t d2 = d2s; d2 < (d2s + 15) / 16 * 16; d2++)
        for (int64_t i = 0; i < BQ; i++) qt[d2 * BQ + i] = 0.0f;
}

static void amx_scores(const fa_attention_args *a, const float *k, float *st, VF *mx,
                       const float *qt, float *kb, int64_t nb, const fa_amx_kernels *tiles)
{
    const float sc = a->scale * FA_LOG2E;
    tiles->att_scores(st, BQ, k, a->k_st[2], nb, a->D, (const uint32_t *)qt, (uint32_t *)kb);
    for (int64_t j = 0; j < nb; j++)
        for (int c = 0; c < NR; c++) {
            const VF x = vload(st + j * BQ + c * FA_VL) * vsplat(sc);
            vstore(st + j * BQ + c * FA_VL, x);
            mx[c] = vmax(mx[c], x);
        }
}

/* pp[t][:] = the pairs (P^[2t][:], P^[2t + 1][:]), zero past nb, for whole blocks of 16 t */
static void amx_pv(const fa_attention_args *a, int64_t nb, const float *st, float *ot,
                   const float *v, float *vb, float *pp, const fa_amx_kernels *tiles)
{
    const int64_t n16 = ((nb + 1) / 2 + 15) / 16 * 16;
    for (int64_t t = 0; t < n16; t++)
        for (int c = 0; c < NR; c++) {
            VF lo = vsplat(0.0f), hi = vsplat(0.0f);
            if (2 * t < nb) lo = vload(st + 2 * t * BQ + c * FA_VL);
            if (2 * t + 1 < nb) hi = vload(st + (2 * t + 1) * BQ + c * FA_VL);
            *(VU *)(pp + t * BQ + c * FA_VL) = att_pair(lo, hi);
        }
    tiles->att_pv(ot, BQ, a->Dv, v, a->v_st[2], nb, (const uint32_t *)pp, (uint32_t *)vb);
}

/* ---- the backward's operands in pairs (attention_body.h: bwd_pair with a->tiles) ------------
 * Every operand of the five products is a bf16 value (q, k, v and dout rounded by the caller,
 * P' and dS by bwd_probs), rounded again here (which leaves a bf16 value as it is) and paired
 * as the tiles read them: along a row's consecutive elements (the A operand) or down two
 * consecutive rows (the B operand). */
_Static_assert(FA_VL == 16, "the pair packers are written for 16 lanes");

/* the bits of two rounded floats as one word: lo in the low half */
static uint32_t amx_pair1(float lo, float hi)
{
    uint32_t l, h;
    lo = att_bf16s(lo);
    hi = att_bf16s(hi);
    memcpy(&l, &lo, 4);
    memcpy(&h, &hi, 4);
    return (l >> 16) | (h & 0xffff0000u);
}

/* dst[r][w] = (x[r][2w], x[r][2w + 1]) for r < R and 2w < F (a missing second element 0), zero
 * for rows R <= r < Rp and words past F up to W (dst's row stride); x's rows xs floats apart */
static void amx_rows_pairs(uint32_t *dst, int64_t W, const float *x, int64_t xs, int64_t R,
                           int64_t Rp, int64_t F)
{
    const VI even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    for (int64_t r = 0; r < Rp; r++) {
        uint32_t *d = dst + r * W;
        int64_t w = 0;
        if (r < R) {
            const float *x_r = x + r * xs;
            for (; 2 * w + 32 <= F; w += 16) {
                const VF a = att_bf16(vload(x_r + 2 * w)), b = att_bf16(vload(x_r + 2 * w + 16));
                *(VU *)(d + w) = att_pair(__builtin_shuffle(a, b, even),
                                          __builtin_shuffle(a, b, even + 1));
            }
            for (; 2 * w < F; w++)
                d[w] = amx_pair1(x_r[2 * w], 2 * w + 1 < F ? x_r[2 * w + 1] : 0.0f);
        }
        for (; w < W; w++) d[w] = 0;
    }
}

/* dst[t][j] = (x[2t][j], x[2t + 1][j]) for j < N (a multiple of 16), rows of x past R read as
 * 0, for t < T (dst's row stride N words) */
static void amx_pairs_rows(uint32_t *dst, int64_t N, const float *x, int64_t xs, int64_t R,
                           int64_t T)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j += 16) {
            VF lo = vsplat(0.0f), hi = vsplat(0.0f);
            if (2 * t < R) lo = att_bf16(vload(x + 2 * t * xs + j));
            if (2 * t + 1 < R) hi = att_bf16(vload(x + (2 * t + 1) * xs + j));
            *(VU *)(dst + t * N + j) = att_pair(lo, hi);
        }
}
#else
#define amx_pad_q(...) ((void)0)
#define amx_scores(...) ((void)0)
#define amx_pv(...) ((void)0)
#define amx_rows_pairs(...) ((void)0)
#define amx_pairs_rows(...) ((void)0)
#endif
