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

FA_TARGET_END
#endif
