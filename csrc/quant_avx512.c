/* quant_avx512.c -- the int8 paths "avx512bw" and "avx512vnni" (x86-64-v4): 64-feature panels,
 * K in pairs, 6-row tiles (quant_int8.h), VNNI a flag of the one tile; when the compiler
 * supports the target (FA_HAVE_V4). */
#if defined(FA_HAVE_V4)
#define FA_TARGET "arch=x86-64-v4"
#include "fa_target.h"

#define Q8_AVX512 1
#include "quant_int8.h"

_Static_assert(Q8_AVX512_NP == 64 && Q8_AVX512_MR == 6,
               "the AVX-512 tile is written for 64 features (4 zmm of sums) and 6 rows");

#define Q8_OUT512(r)                                                                           \
    if (mr > r) {                                                                              \
        const __m512 s_r = _mm512_set1_ps(sx[r]);                                              \
        q8_out512(y + r * ldy, a##r##_0, s_r, sc[0], bi[0], mk[0], relu);                      \
        q8_out512(y + r * ldy + 16, a##r##_1, s_r, sc[1], bi[1], mk[1], relu);                 \
        q8_out512(y + r * ldy + 32, a##r##_2, s_r, sc[2], bi[2], mk[2], relu);                 \
        q8_out512(y + r * ldy + 48, a##r##_3, s_r, sc[3], bi[3], mk[3], relu);                 \
    }

/* 64 features x 6 rows; int16 activations, broadcast in pairs, against the weights
 * sign-extended to int16 (vpmovsxbw); Q8_MAC512 is vpmaddwd + vpaddd (AVX-512BW) or, with
 * vnni, VNNI's vpdpwssd, exact either way (|pair sum| <= 2 127 32767 < 2^31, and the sums fit:
 * see fa_int8_act_levels). vpdpwssd is written as asm, so this unit's target needs no VNNI;
 * the instance with vnni runs only where the CPU has it (fa_int8_supports). */
#define Q8_MAC512(acc, w, b)                                                                   \
    do {                                                                                       \
        if (vnni)                                                                              \
            __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(b), "v"(w));                        \
        else                                                                                   \
            Q8_ADD512(acc, _mm512_madd_epi16(w, b));                                           \
    } while (0)
FA_INLINE void q8_tile512(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                          const int8_t *w_p, const float *sx, const float *scale_p,
                          const float *bias_p, int64_t Kg, int64_t nf, const int mr, int relu,
                          const int vnni)
{
    const __m512i z = _mm512_setzero_si512();
#define Q8_INIT(r) __m512i a##r##_0 = z, a##r##_1 = z, a##r##_2 = z, a##r##_3 = z;
    Q8_ROWS6(Q8_INIT)
#undef Q8_INIT
    for (int64_t kg = 0; kg < Kg; kg++) {
        const int8_t *w_k = w_p + kg * 128;
        const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)w_k));
        const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w_k + 32)));
        const __m512i w2 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w_k + 64)));
        const __m512i w3 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w_k + 96)));
#define Q8_STEP(r)                                                                             \
        if (mr > r) {                                                                          \
            const __m512i b = _mm512_set1_epi32(q8_load32(xq + r * ldx + 2 * kg));             \
            Q8_MAC512(a##r##_0, w0, b);                                                        \
            Q8_MAC512(a##r##_1, w1, b);                                                        \
            Q8_MAC512(a##r##_2, w2, b);                                                        \
            Q8_MAC512(a##r##_3, w3, b);                                                        \
        }
        Q8_ROWS6(Q8_STEP)
#undef Q8_STEP
    }
    __m512 sc[4], bi[4];
    __mmask16 mk[4];
    q8_cols512(sc, bi, mk, scale_p, bias_p, nf);
    Q8_ROWS6(Q8_OUT512)
}
#undef Q8_MAC512
#undef Q8_OUT512

/* the two paths: one tile, the flag a constant folded away */
#define q8_tile_avx512bw(...) q8_tile512(__VA_ARGS__, 0)
#define q8_tile_avx512vnni(...) q8_tile512(__VA_ARGS__, 1)
Q8_PANEL_FN(q8_panel_avx512bw, q8_tile_avx512bw, Q8_AVX512_MR)
Q8_PANEL_FN(q8_panel_avx512vnni, q8_tile_avx512vnni, Q8_AVX512_MR)

const fa_q8_kernels fa_q8_avx512bw = {.np = Q8_AVX512_NP, .g = Q8_PAIR, .mr = Q8_AVX512_MR,
                                      .isa = &fa_kernels_avx512, .fmt = Q8_FMT_I16,
                                      .panel = q8_panel_avx512bw};
const fa_q8_kernels fa_q8_avx512vnni = {.np = Q8_AVX512_NP, .g = Q8_PAIR, .mr = Q8_AVX512_MR,
                                        .isa = &fa_kernels_avx512, .fmt = Q8_FMT_I16,
                                        .panel = q8_panel_avx512vnni};

/* ---- "avx512vnni-quads": VNNI on the AMX path's layout ---------------------------------------
 * The partner of the amx path for few rows (paths.c: below Q8_AMX_MIN_ROWS a default amx hands
 * the product here), and a path of its own wherever the CPU has AVX512-VNNI: the same packed
 * weight (32-feature panels, K in quads: wp[p][kq][f][j] = q[32 p + f][4 kq + j]) and the same
 * Q8_FMT_HILO activations (Kp hi bytes q >> 8, signed, then Kp lo bytes q & 255), so a weight
 * packed for the tiles needs no second copy. vpdpbusd multiplies unsigned bytes by signed
 * ones: the lo bytes as they are, the hi bytes with their sign bit flipped (h + 128), and the
 * 128 times the weights' sum that this adds taken away at the end (scalar math, int32 wrapping
 * as on the tiles):
 *   S_f = sum_k w_fk;  H = sum_k (h_k + 128) w_fk;  L = sum_k lo_k w_fk
 *   acc = 256 (H - 128 S_f) + L = 256 sum_k h_k w_fk + sum_k lo_k w_fk
 * Each vpdpbusd sums four products of at most 255 x 128 before its (wrapping) add: every path
 * still gets the same integers. Tile: mr <= 6 rows x 32 features, 4 zmm of sums per row and 2
 * for S (kept in the tile's loop: the weight is read once per tile either way). */
#define Q8_DPBUSD(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s))
_Static_assert(AMX_NP == 32 && AMX_G == 4, "the quads tile is written for the AMX layout");
FA_INLINE void q8_quads_tile(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                             const int8_t *w_p, const float *sx, const float *scale_p,
                             const float *bias_p, int64_t Kq, int64_t nf, const int mr, int relu)
{
    const uint8_t *a = (const uint8_t *)xq;
    const int64_t lda = 2 * ldx, Kp = AMX_G * Kq;
    const __m512i z = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    __m512i s0 = z, s1 = z;
#define Q8_INIT(r) __m512i h##r##_0 = z, h##r##_1 = z, l##r##_0 = z, l##r##_1 = z;
    Q8_ROWS6(Q8_INIT)
#undef Q8_INIT
    for (int64_t kq = 0; kq < Kq; kq++) {
        const __m512i w0 = _mm512_loadu_si512((const void *)(w_p + kq * 128));
        const __m512i w1 = _mm512_loadu_si512((const void *)(w_p + kq * 128 + 64));
        Q8_DPBUSD(s0, ones, w0);
        Q8_DPBUSD(s1, ones, w1);
#define Q8_STEP(r)                                                                             \
        if (mr > r) {                                                                          \
            const uint8_t *a_r = a + r * lda + 4 * kq;                                         \
            const __m512i bh = _mm512_xor_si512(_mm512_set1_epi32(q8_load32(a_r)), flip);      \
            const __m512i bl = _mm512_set1_epi32(q8_load32(a_r + Kp));                         \
            Q8_DPBUSD(h##r##_0, bh, w0);                                                       \
            Q8_DPBUSD(h##r##_1, bh, w1);                                                       \
            Q8_DPBUSD(l##r##_0, bl, w0);                                                       \
            Q8_DPBUSD(l##r##_1, bl, w1);                                                       \
        }
        Q8_ROWS6(Q8_STEP)
#undef Q8_STEP
    }
    __m512 sc[4], bi[4];
    __mmask16 mk[4];
    q8_cols512(sc, bi, mk, scale_p, bias_p, nf);        /* vectors 2, 3 unused (nf <= 32) */
    const __m512i c0 = _mm512_slli_epi32(s0, 7), c1 = _mm512_slli_epi32(s1, 7);
#define Q8_OUT(r)                                                                              \
    if (mr > r) {                                                                              \
        const __m512 s_r = _mm512_set1_ps(sx[r]);                                              \
        const __m512i a0 = _mm512_add_epi32(                                                   \
            _mm512_slli_epi32(_mm512_sub_epi32(h##r##_0, c0), 8), l##r##_0);                   \
        const __m512i a1 = _mm512_add_epi32(                                                   \
            _mm512_slli_epi32(_mm512_sub_epi32(h##r##_1, c1), 8), l##r##_1);                   \
        q8_out512(y + r * ldy, a0, s_r, sc[0], bi[0], mk[0], relu);                            \
        q8_out512(y + r * ldy + 16, a1, s_r, sc[1], bi[1], mk[1], relu);                       \
    }
    Q8_ROWS6(Q8_OUT)
#undef Q8_OUT
}
#undef Q8_DPBUSD
Q8_PANEL_FN(q8_panel_avx512vnni_quads, q8_quads_tile, 6)

const fa_q8_kernels fa_q8_avx512vnni_quads = {.np = AMX_NP, .g = AMX_G, .mr = 6,
                                              .isa = &fa_kernels_avx512, .fmt = Q8_FMT_HILO,
                                              .panel = q8_panel_avx512vnni_quads};

FA_TARGET_END
#endif
