/* quant_avx2.c -- the int8 path "avx2" (x86-64-v3): 32-feature panels, K in pairs, 6-row tiles
 * of vpmaddwd + vpaddd (quant_int8.h), when the compiler supports the target (FA_HAVE_V3). */
#if defined(FA_HAVE_V3)
#define FA_TARGET "arch=x86-64-v3"
#include "fa_target.h"

#include "quant_int8.h"

_Static_assert(Q8_AVX2_NP == 32 && Q8_AVX2_MR == 6,
               "the AVX2 tiles are written for 32 features (two passes of 2 ymm of sums) and 6 "
               "rows (Q8_ROWS6)");

/* The AVX2 epilogue of one vector of a tile row: 8 int32 sums -> dst (sc, bi: zero past nf) */
FA_INLINE void q8_out256(float *dst, __m256i a, __m256 s_r, const float *sc, const float *bi,
                         int relu)
{
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(s_r, _mm256_loadu_ps(sc)));
    __asm__("" : "+x"(t));                                  /* fl(acc * s), then + bias */
    t = _mm256_add_ps(t, _mm256_loadu_ps(bi));
    if (relu) t = _mm256_andnot_ps(_mm256_cmp_ps(t, _mm256_setzero_ps(), _CMP_LT_OQ), t);
    _mm256_storeu_ps(dst, t);
}

/* A 32-feature panel's scales and biases, zero past nf (and without a bias): the AVX2
 * epilogues read whole vectors of them */
FA_INLINE void q8_cols256(float *sc, float *bi, const float *scale_p, const float *bias_p,
                          int64_t nf)
{
    for (int f = 0; f < 32; f++) {
        sc[f] = f < nf ? scale_p[f] : 0.0f;
        bi[f] = f < nf && bias_p ? bias_p[f] : 0.0f;
    }
}

/* AVX2: 32 features x 6 rows, as two passes of 16 features (2 ymm of int32) over kg groups
 * [kg0, kg0 + Kg); int16 activations in broadcast pairs, weights sign-extended to int16 (in
 * the loop from w_p, or already in w16[h][kg][16][2]): vpmaddwd + vpaddd, exact. Per pass 12
 * accumulators, 2 weights, a broadcast and a product: 16 ymm registers (4 rows and 8
 * accumulators are slower: each weight meets fewer rows). K comes in blocks
 * (q8_panel_avx2): the sums start at 0 (first) or at part (mr, 32) int32, and end in the
 * epilogue (last) or in part. A 3-row tile over the whole panel, with the weights as memory
 * operands (no registers for them), is slower too: the loads, not the broadcasts, bind. */
FA_INLINE void q8_tile_avx2(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                            const int8_t *w_p, const int16_t *w16, int32_t *part,
                            const float *sx, const float *scale_p, const float *bias_p,
                            int64_t Kg, int64_t nf, const int mr, int relu, int first, int last)
{
    float sc[32], bi[32];
    if (last) q8_cols256(sc, bi, scale_p, bias_p, nf);
    for (int h = 0; h < 2 && 16 * h < nf; h++) {
        const __m256i z = _mm256_setzero_si256();
#define Q8_INIT(r)                                                                             \
        __m256i a##r##_0 = z, a##r##_1 = z;                                                    \
        if (!first && mr > r) {                                                                \
            a##r##_0 = _mm256_loadu_si256((const __m256i *)(part + 32 * r + 16 * h));          \
            a##r##_1 = _mm256_loadu_si256((const __m256i *)(part + 32 * r + 16 * h + 8));      \
        }
        Q8_ROWS6(Q8_INIT)
#undef Q8_INIT
        for (int64_t kg = 0; kg < Kg; kg++) {
            __m256i wa, wb;
            if (w16) {                                      /* widened by q8_widen_avx2 */
                const int16_t *w_k = w16 + 32 * (Kg * h + kg);
                wa = _mm256_loadu_si256((const __m256i *)w_k);
                wb = _mm256_loadu_si256((const __m256i *)(w_k + 16));
            } else {
                const int8_t *w_k = w_p + 64 * kg + 32 * h;
                wa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w_k));
                wb = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w_k + 16)));
            }
#define Q8_STEP(r)                                                                             \
            if (mr > r) {                                                                      \
                const __m256i b = _mm256_set1_epi32(q8_load32(xq + r * ldx + 2 * kg));         \
                Q8_ADD256(a##r##_0, _mm256_madd_epi16(wa, b));                                 \
                Q8_ADD256(a##r##_1, _mm256_madd_epi16(wb, b));                                 \
            }
            Q8_ROWS6(Q8_STEP)
#undef Q8_STEP
        }
        if (!last) {
#define Q8_PART(r)                                                                             \
            if (mr > r) {                                                                      \
                _mm256_storeu_si256((__m256i *)(part + 32 * r + 16 * h), a##r##_0);            \
                _mm256_storeu_si256((__m256i *)(part + 32 * r + 16 * h + 8), a##r##_1);        \
            }
            Q8_ROWS6(Q8_PART)
#undef Q8_PART
            continue;
        }
        const int64_t nh = nf - 16 * h < 16 ? nf - 16 * h : 16;
#define Q8_OUT256(r)                                                                           \
        if (mr > r) {                                                                          \
            const __m256 s_r = _mm256_set1_ps(sx[r]);                                          \
            float out[16], *dst = nh == 16 ? y + r * ldy + 16 * h : out;                       \
            q8_out256(dst, a##r##_0, s_r, sc + 16 * h, bi + 16 * h, relu);                     \
            q8_out256(dst + 8, a##r##_1, s_r, sc + 16 * h + 8, bi + 16 * h + 8, relu);         \
            if (nh < 16) memcpy(y + r * ldy + 16 * h, out, (size_t)nh * sizeof(float));        \
        }
        Q8_ROWS6(Q8_OUT256)
#undef Q8_OUT256
    }
}

#define Q8_AVX2_AT(MRV)                                                                        \
    static __attribute__((noinline)) void q8_tile_avx2_##MRV(                                  \
        float *y, int64_t ldy, const int16_t *xq, int64_t ldx, const int8_t *w_p,             \
        const int16_t *w16, int32_t *part, const float *sx, const float *scale_p,             \
        const float *bias_p, int64_t Kg, int64_t nf, int relu, int first, int last)           \
    {                                                                                          \
        if (w16)                                                                               \
            q8_tile_avx2(y, ldy, xq, ldx, NULL, w16, part, sx, scale_p, bias_p, Kg, nf, MRV,   \
                         relu, first, last);                                                   \
        else                                                                                   \
            q8_tile_avx2(y, ldy, xq, ldx, w_p, NULL, part, sx, scale_p, bias_p, Kg, nf, MRV,   \
                         relu, first, last);                                                   \
    }
Q8_AVX2_AT(1)
Q8_AVX2_AT(2)
Q8_AVX2_AT(3)
Q8_AVX2_AT(4)
Q8_AVX2_AT(5)
Q8_AVX2_AT(6)
#undef Q8_AVX2_AT

/* AVX2, one or two rows (decode steps): the whole 32-feature panel per pass over all of K, so
 * each kg's 64 bytes of weights (one cache line) are read once, in order; 4 accumulators per
 * row, 4 widened weights and a broadcast: 13 of the 16 ymm registers at two rows. It
 * prefetches 8 lines ahead: the hardware prefetcher alone falls behind on this
 * one-line-per-iteration loop, and the stream is the whole cost. The same integer sums as
 * q8_tile_avx2 (exact), so a row's result does not depend on the tile that computed it. */
FA_INLINE void q8_few_avx2(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                           const int8_t *w_p, const float *sx, const float *scale_p,
                           const float *bias_p, int64_t Kg, int64_t nf, const int mr, int relu)
{
    const __m256i z = _mm256_setzero_si256();
    __m256i a0_0 = z, a0_1 = z, a0_2 = z, a0_3 = z, a1_0 = z, a1_1 = z, a1_2 = z, a1_3 = z;
    for (int64_t kg = 0; kg < Kg; kg++) {
        const int8_t *w_k = w_p + kg * 64;
        _mm_prefetch((const char *)(w_k + 512), _MM_HINT_T0);      /* 8 lines ahead */
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w_k));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w_k + 16)));
        const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w_k + 32)));
        const __m256i w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w_k + 48)));
#define Q8_STEP(r)                                                                             \
        if (mr > r) {                                                                          \
            const __m256i b = _mm256_set1_epi32(q8_load32(xq + r * ldx + 2 * kg));             \
            Q8_ADD256(a##r##_0, _mm256_madd_epi16(w0, b));                                     \
            Q8_ADD256(a##r##_1, _mm256_madd_epi16(w1, b));                                     \
            Q8_ADD256(a##r##_2, _mm256_madd_epi16(w2, b));                                     \
            Q8_ADD256(a##r##_3, _mm256_madd_epi16(w3, b));                                     \
        }
        Q8_STEP(0)
        Q8_STEP(1)
#undef Q8_STEP
    }
    float sc[32], bi[32];
    q8_cols256(sc, bi, scale_p, bias_p, nf);
#define Q8_OUT256(r)                                                                           \
    if (mr > r) {                                                                              \
        const __m256 s_r = _mm256_set1_ps(sx[r]);                                              \
        float out[32], *dst = nf == 32 ? y + r * ldy : out;                                    \
        q8_out256(dst, a##r##_0, s_r, sc, bi, relu);                                           \
        q8_out256(dst + 8, a##r##_1, s_r, sc + 8, bi + 8, relu);                               \
        q8_out256(dst + 16, a##r##_2, s_r, sc + 16, bi + 16, relu);                            \
        q8_out256(dst + 24, a##r##_3, s_r, sc + 24, bi + 24, relu);                            \
        if (nf < 32) memcpy(y + r * ldy, out, (size_t)nf * sizeof(float));                    \
    }
    Q8_OUT256(0)
    Q8_OUT256(1)
#undef Q8_OUT256
}

/* one function per row count, noinline like the panels' tiles (quant_int8.h) */
Q8_TILE_AT(q8_few_avx2, q8_few_avx2, 1)
Q8_TILE_AT(q8_few_avx2, q8_few_avx2, 2)

/* A block of kn groups of a packed 32-feature panel (w_k: [kg][32][2] int8), sign-extended to
 * int16 as two halves of 16 features, w16[h][kg][16][2]: the layout q8_tile_avx2 reads. */
FA_INLINE void q8_widen_avx2(int16_t *w16, const int8_t *w_k, int64_t kn)
{
    for (int64_t kg = 0; kg < kn; kg++)
        for (int h = 0; h < 2; h++) {
            const int8_t *src = w_k + kg * 64 + 32 * h;
            int16_t *dst = w16 + 32 * (kn * h + kg);
            _mm256_storeu_si256((__m256i *)dst,
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src)));
            _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                                           (const __m128i *)(src + 16))));
        }
}

/* AVX2 panel: chunks of up to Q8_AVX2_ROWS rows; per chunk, K in blocks of Q8_AVX2_KG pairs.
 * From Q8_AVX2_WIDEN rows on, each block is sign-extended once (q8_widen_avx2: 32 x 2
 * Q8_AVX2_KG int16 = 16 KB, in L1 while every 6-row tile of the chunk meets it), so the tiles'
 * inner loop is loads, vpmaddwd and vpaddd alone, rather than widening the same block in
 * every tile; fewer rows widen in the tile (a block met by few tiles is not worth a copy).
 * Partial sums in `part` (the chunk's rows x 32 int32, on the stack). */
static void q8_panel_avx2(float *y, int64_t ldy, const int16_t *x, int64_t ldx, int64_t rows,
                          const int8_t *w_p, const float *sx, const float *scale_p,
                          const float *bias_p, int64_t Kg, int64_t nf, int relu)
{
    void (*const at[7])(float *, int64_t, const int16_t *, int64_t, const int8_t *,
                        const int16_t *, int32_t *, const float *, const float *, const float *,
                        int64_t, int64_t, int, int, int) = {
        NULL, q8_tile_avx2_1, q8_tile_avx2_2, q8_tile_avx2_3, q8_tile_avx2_4, q8_tile_avx2_5,
        q8_tile_avx2_6};
    if (rows <= 2) {
        (rows == 1 ? q8_few_avx2_1 : q8_few_avx2_2)(y, ldy, x, ldx, w_p, sx, scale_p, bias_p, Kg,
                                                   nf, relu);
        return;
    }
    int32_t part[Q8_AVX2_ROWS * 32];
    int16_t w16[Q8_AVX2_KG * 64] __attribute__((aligned(64)));
    for (int64_t c0 = 0; c0 < rows; c0 += Q8_AVX2_ROWS) {
        const int64_t c1 = rows - c0 < Q8_AVX2_ROWS ? rows : c0 + Q8_AVX2_ROWS;
        const int widen = c1 - c0 >= Q8_AVX2_WIDEN;
        for (int64_t k0 = 0; k0 < Kg || k0 == 0; k0 += Q8_AVX2_KG) {
            const int64_t kn = Kg - k0 < Q8_AVX2_KG ? Kg - k0 : Q8_AVX2_KG;
            const int first = k0 == 0, last = k0 + kn >= Kg;
            if (widen) q8_widen_avx2(w16, w_p + 64 * k0, kn);
            for (int64_t r0 = c0; r0 < c1; r0 += Q8_AVX2_MR) {
                const int64_t mr = c1 - r0 < Q8_AVX2_MR ? c1 - r0 : Q8_AVX2_MR;
                at[mr](y + r0 * ldy, ldy, x + r0 * ldx + 2 * k0, ldx, w_p + 64 * k0,
                       widen ? w16 : NULL, part + 32 * (r0 - c0), sx + r0, scale_p, bias_p, kn,
                       nf, relu, first, last);
            }
        }
    }
}

const fa_q8_kernels fa_q8_avx2 = {.np = Q8_AVX2_NP, .g = Q8_PAIR, .mr = Q8_AVX2_MR,
                                  .isa = &fa_kernels_avx2, .fmt = Q8_FMT_I16,
                                  .panel = q8_panel_avx2};

FA_TARGET_END
#endif
