/* attention_dot_body.h -- bf16 attention's dot path, for the avx512 level on a compiler that
 * builds vdpbf16ps code (included by attention_bf16_body.h): q, k, v and P in pairs of bf16
 * multiplied with vdpbf16ps, in the tiled pass (dot_*: fa_att_units.dot) and the one-row pass
 * of decode steps (dot_rows_*: .dot_rows), and the rounding with vcvtneps2bf16 (.cvt). paths.c
 * sets those units only where the level and the CPU run them. On every other level
 * ATT_BF16_UNITS is 0: the callers' branches (under it) compile away, and the names below
 * stand for nothing. */
#if FA_ISA_LEVEL == 2 && defined(ATT_HAVE_BF16_DOT)
#define ATT_BF16_UNITS 1

/* ---- the dot path: vdpbf16ps on pairs of bf16 (lane i of a pair vector: element 2i in the low
 * half, 2i + 1 in the high half). Each instruction adds the odd element's product, then the
 * even one's, to the float32 sum. */
#define ATT_DOT __attribute__((target("avx512bf16")))
#define D2 ((D + 1) / 2)          /* pairs per q or k row */
#define D2P ((D2 + 15) / 16 * 16) /* the packed key rows' stride, whole vectors */

/* 16 pairs (lo[u], hi[u]) of rounded floats: the high halves of their bits */
FA_INLINE VU att_pair(VF lo, VF hi) { return ((VU)lo >> 16) | ((VU)hi & vsplatu(0xffff0000u)); }

/* The low n (<= 16) of 16 floats, the rest 0 */
ATT_DOT FA_INLINE __m512 att_load16(const float *p, int64_t n)
{
    return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}

/* qt (D, BQ), rounded, becomes its pairs in place: row d2 = (qt[2 d2], qt[2 d2 + 1]) */
static void dot_pack_q(float *qt, int64_t D)
{
    for (int64_t d2 = 0; d2 < D2; d2++)
        for (int64_t i = 0; i < BQ; i += FA_VL) {
            const VF lo = vload(qt + 2 * d2 * BQ + i);
            VF hi = vsplat(0.0f);
            if (2 * d2 + 1 < D) hi = vload(qt + (2 * d2 + 1) * BQ + i);
            *(VU *)(qt + d2 * BQ + i) = att_pair(lo, hi);
        }
}

/* kp[j][d2] = the pair (k_j[2 d2], k_j[2 d2 + 1]) rounded, for j < nb; row stride D2P */
ATT_DOT static void dot_pack_k(uint32_t *kp, const float *k, int64_t ksl, int64_t nb, int64_t D)
{
    for (int64_t j = 0; j < nb; j++)
        for (int64_t d = 0; d < 2 * D2P; d += 32) {
            const __m512 lo = att_load16(k + j * ksl + d, D - d > 0 ? D - d : 0);
            const __m512 hi = att_load16(k + j * ksl + d + 16, D - d - 16 > 0 ? D - d - 16 : 0);
            _mm512_storeu_si512(kp + j * D2P + d / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}

/* st[r][:] = sum_d2 pairs of k_r times pairs of q, for r < ROWS keys, BQ queries on the lanes
 *   scalar math:  st[r][i] = sum_d2 (k[r][2d2+1] q[2d2+1][i]) + (k[r][2d2] q[2d2][i])       */
ATT_DOT FA_INLINE void dot_score_rows(float *FA_RESTRICT st, VF *FA_RESTRICT mx,
                                      const uint32_t *FA_RESTRICT qp,
                                      const uint32_t *FA_RESTRICT kp, int64_t D, float sc,
                                      const int ROWS)
{
    __m512 acc[MR_S][NR];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t d2 = 0; d2 < D2; d2++) {
        __m512i qv[NR];
        for (int c = 0; c < NR; c++) qv[c] = _mm512_loadu_si512(qp + d2 * BQ + c * FA_VL);
        for (int r = 0; r < ROWS; r++) {
            const __m512i kk = _mm512_set1_epi32((int)kp[r * D2P + d2]);
            for (int c = 0; c < NR; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)qv[c], (__m512bh)kk);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) {
            const VF x = (VF)acc[r][c] * vsplat(sc);
            vstore(st + r * BQ + c * FA_VL, x);
            mx[c] = vmax(mx[c], x);
        }
}

ATT_DOT static void dot_score_tile(float *st, VF *mx, const float *qt, const uint32_t *kp,
                                   int64_t nb, int64_t D, float sc)
{
    int64_t j = 0;
#define TILE(rows) dot_score_rows(st + j * BQ, mx, (const uint32_t *)qt, kp + j * D2P, D, sc, rows)
    for (; j + MR_S <= nb; j += MR_S) TILE(MR_S);
    ATT_TAIL(j, nb, MR_S, TILE);
#undef TILE
}

/* pp[j2][:] = the pairs (P[2 j2][:], P[2 j2 + 1][:]) rounded, vp[j2][e] = the pairs
 * (v_2j2[e], v_2j2+1[e]) rounded (row stride Dvp, whole vectors), for 2 j2 < nb (an odd last
 * key paired with 0) */
ATT_DOT static void dot_pack_pv(uint32_t *pp, uint32_t *vp, const float *st, const float *v,
                                int64_t vsl, int64_t nb, int64_t Dv, int64_t Dvp)
{
    for (int64_t j = 0; j < nb; j += 2) {
        const int two = j + 1 < nb;
        for (int64_t i = 0; i < BQ; i += 16) {
            const __m512i lo = _mm512_cvtepu16_epi32(
                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(st + j * BQ + i)));
            const __m512i hi = two ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(
                                         _mm512_loadu_ps(st + (j + 1) * BQ + i)))
                                   : _mm512_setzero_si512();
            _mm512_storeu_si512(pp + j / 2 * BQ + i, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        for (int64_t e = 0; e < Dvp; e += 16) {
            const int64_t n = Dv - e < 16 ? Dv - e : 16;
            const __m512i lo = _mm512_cvtepu16_epi32(
                (__m256i)_mm512_cvtneps_pbh(att_load16(v + j * vsl + e, n)));
            const __m512i hi = two ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(
                                         att_load16(v + (j + 1) * vsl + e, n)))
                                   : _mm512_setzero_si512();
            _mm512_storeu_si512(vp + j / 2 * Dvp + e, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* ot[r][:] += sum_j2 pairs of P times pairs of v (feature r), r < ROWS features
 *   scalar math:  ot[r][i] += sum_j2 (P[2j2+1][i] v[2j2+1][r]) + (P[2j2][i] v[2j2][r])      */
ATT_DOT FA_INLINE void dot_pv_rows(float *FA_RESTRICT ot, const uint32_t *FA_RESTRICT pp,
                                   const uint32_t *FA_RESTRICT vp, int64_t Dvp, int64_t n2,
                                   const int ROWS)
{
    __m512 acc[MR_P][NR];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_loadu_ps(ot + r * BQ + c * FA_VL);
    for (int64_t j2 = 0; j2 < n2; j2++) {
        __m512i pv[NR];
        for (int c = 0; c < NR; c++) pv[c] = _mm512_loadu_si512(pp + j2 * BQ + c * FA_VL);
        for (int r = 0; r < ROWS; r++) {
            const __m512i vv = _mm512_set1_epi32((int)vp[j2 * Dvp + r]);
            for (int c = 0; c < NR; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)pv[c], (__m512bh)vv);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < NR; c++) _mm512_storeu_ps(ot + r * BQ + c * FA_VL, acc[r][c]);
}

ATT_DOT static void dot_pv_tile(float *ot, const float *st, const float *v, int64_t vsl,
                                int64_t nb, int64_t Dv, uint32_t *vp, uint32_t *pp)
{
    const int64_t Dvp = (Dv + 15) / 16 * 16, n2 = (nb + 1) / 2;
    dot_pack_pv(pp, vp, st, v, vsl, nb, Dv, Dvp);
    int64_t e = 0;
#define TILE(rows) dot_pv_rows(ot + e * BQ, pp, vp + e, Dvp, n2, rows)
    for (; e + MR_P <= Dv; e += MR_P) TILE(MR_P);
    ATT_TAIL(e, Dv, MR_P, TILE);
#undef TILE
}

/* dst[e] = bf16(src[e]) for e < n, widened, by vcvtneps2bf16 (the same bits as att_bf16, in
 * fewer instructions); dst may be src */
ATT_DOT static void att_bf16_row_cvt(float *dst, const float *src, int64_t n)
{
    int64_t e = 0;
    for (; e + 16 <= n; e += 16)
        _mm512_storeu_si512(dst + e, _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)
                                         _mm512_cvtneps_pbh(_mm512_loadu_ps(src + e))), 16));
    for (; e < n; e += 16) {
        const int64_t m = n - e < 16 ? n - e : 16;
        const __m512i w = _mm512_slli_epi32(
            _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(att_load16(src + e, m))), 16);
        _mm512_mask_storeu_ps(dst + e, (__mmask16)((1u << m) - 1u), (__m512)w);
    }
}
#undef D2
#undef D2P

/* The dot path, one query row (q_i) against keys j < jend (k_j = k + j ksl): qp receives the
 * row's pairs, padded with zeros to whole vectors; s[j] = sum of the pair products, the
 * vector's lanes summed by _mm512_reduce_add_ps. Four keys at a time (independent chains). */
ATT_DOT static void dot_rows_scores(float *s, const float *q_i, const float *k, int64_t ksl,
                                    int64_t jend, int64_t D, uint32_t *qp)
{
    const int64_t nv = (D + 31) / 32; /* vectors of 16 pairs */
#define REST(d) (D - (d) > 0 ? D - (d) : 0)
    for (int64_t t = 0; t < nv; t++)
        _mm512_storeu_si512(qp + 16 * t, (__m512i)_mm512_cvtne2ps_pbh(
                                             att_load16(q_i + 32 * t + 16, REST(32 * t + 16)),
                                             att_load16(q_i + 32 * t, REST(32 * t))));
    for (int64_t j = 0; j < jend; j += 4) {
        const int nk = jend - j < 4 ? (int)(jend - j) : 4;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t t = 0; t < nv; t++) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qp + 16 * t);
            for (int u = 0; u < 4; u++)
                if (u < nk) {
                    const float *k_u = k + (j + u) * ksl + 32 * t;
                    const __m512bh kv = _mm512_cvtne2ps_pbh(att_load16(k_u + 16, REST(32 * t + 16)),
                                                            att_load16(k_u, REST(32 * t)));
                    acc[u] = _mm512_dpbf16_ps(acc[u], qv, kv);
                }
        }
        for (int u = 0; u < nk; u++) s[j + u] = _mm512_reduce_add_ps(acc[u]);
    }
#undef REST
}

/* out_i = sum_j P^_j v_j^ * inv over keys in pairs (s holds P^, rounded): v_j and v_j+1
 * rounded and interleaved into pairs, 64 features at a time. */
ATT_DOT static void dot_rows_pv(float *o_i, const float *s, const float *v, int64_t vsl,
                               int64_t jend, int64_t Dv, float inv)
{
    /* word 2u <- word u (v_j), word 2u + 1 <- word 16 + u (v_j+1) */
    static const uint16_t inter[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512(inter);
    for (int64_t e = 0; e < Dv; e += 64) {
        const int nv = Dv - e >= 64 ? 4 : (int)((Dv - e + 15) / 16);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t j = 0; j < jend; j += 2) {
            const int two = j + 1 < jend;
            uint32_t lo, hi = 0;
            memcpy(&lo, s + j, 4);
            if (two) memcpy(&hi, s + j + 1, 4);
            const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)((lo >> 16) | (hi & 0xffff0000u)));
            for (int c = 0; c < 4; c++)
                if (c < nv) {
                    const int64_t f = e + 16 * c, n = Dv - f < 16 ? Dv - f : 16;
                    const __m512 v0 = att_load16(v + j * vsl + f, n);
                    const __m512 v1 = two ? att_load16(v + (j + 1) * vsl + f, n) : _mm512_setzero_ps();
                    const __m512i vv =
                        _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
                    acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)vv, pv);
                }
        }
        for (int c = 0; c < nv; c++) {
            const int64_t f = e + 16 * c, n = Dv - f < 16 ? Dv - f : 16;
            _mm512_mask_storeu_ps(o_i + f, (__mmask16)((1u << n) - 1u),
                                  _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
        }
    }
}
#else
#define ATT_BF16_UNITS 0
#define dot_pack_q(...) ((void)0)
#define dot_pack_k(...) ((void)0)
#define dot_score_tile(...) ((void)0)
#define dot_pv_tile(...) ((void)0)
#define att_bf16_row_cvt(...) ((void)0)
#define dot_rows_scores(...) ((void)0)
#define dot_rows_pv(...) ((void)0)
#endif
