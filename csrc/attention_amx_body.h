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
#else
#define amx_pad_q(...) ((void)0)
#define amx_scores(...) ((void)0)
#define amx_pv(...) ((void)0)
#endif
