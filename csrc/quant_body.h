/* quant_body.h -- the int8 and bf16 weight kernels, per ISA (included by quant.c through
 * fa_instantiate.h, and once more for AVX-512 VNNI). The activations come from linear_body.h
 * (bias_act_rows_), so a quantised product applies exactly the fp32 linear's gelu.
 *
 * int8 layout (fa_int8_pack): panels of Q8_NP features, K in pairs,
 *   wp[p][kg][f][g] = q[p Q8_NP + f][2 kg + g]  (zero past M and K)
 * and the quantised activations, one int16 row of Kp = K rounded up to 2 per row of x, meet
 * it as broadcast pairs against the weights sign-extended to int16: vpmaddwd + vpaddd, or
 * VNNI's vpdpwssd. Every path sums the same integers exactly: the results do not depend on
 * the path.
 */
#ifndef Q8_VNNI_PASS
#include "linear_body.h"
#endif

#ifndef QUANT_BODY_ONCE
#define QUANT_BODY_ONCE
/* 32 bits from anywhere (memcpy: no alignment or aliasing assumption) */
FA_INLINE int32_t q8_load32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
#endif

#ifndef Q8_VNNI_PASS

/* ---- rows quantised: activations (int16, L levels) and quantize_int8's int8 rows ----------
 * scalar math (the rules in fastattn.h, as reference._quantize_rows):
 *   amax = max_k |x_k| (as bits: NaN > inf > finite);  non-finite: sx = NaN, q = 0
 *   amax < min (FA_INT8_MIN_AMAX for int8 rows, FA_INT8_ACT_MIN_AMAX for activations):
 *   sx = 0, q = 0;  else sx = amax / L, inv = L / amax, q_k = rint(clip(x_k * inv, -L, L))
 *   (x_k * inv is within L (1 + 2^-23)^2 anyway, which rounds to at most L)
 * rint: (t + 1.5 2^23) - 1.5 2^23 rounds |t| < 2^22 to the nearest integer, ties to even.
 * Output (fmt): Q8_FMT_I16 int16 rows (Kp, zero padded; L = fa_int8_act_levels(K)),
 * Q8_FMT_I8 int8 rows (quantize_int8's output; L = 127), Q8_FMT_HILO the I16 values as two
 * byte rows (fastattn.h: Kp hi bytes q >> 8, then Kp lo bytes q & 255; the AMX path's input). */
typedef int16_t FA_CAT(vh_, FA_SFX) __attribute__((vector_size(FA_VL * 2), aligned(1),
                                                     may_alias));
typedef int8_t FA_CAT(vs_, FA_SFX) __attribute__((vector_size(FA_VL), aligned(1), may_alias));
typedef uint16_t FA_CAT(vw_, FA_SFX) __attribute__((vector_size(FA_VL * 2), aligned(1),
                                                      may_alias));
typedef uint8_t FA_CAT(vb_, FA_SFX) __attribute__((vector_size(FA_VL), aligned(1), may_alias));

static float FA_CAT(q8_quant_row_, FA_SFX)(void *dst, const float *x, int64_t K, int64_t Kp,
                                           int fmt)
{
    const int i8 = fmt == Q8_FMT_I8, hilo = fmt == Q8_FMT_HILO;
    typedef FA_CAT(vh_, FA_SFX) VH;
    typedef FA_CAT(vs_, FA_SFX) VS;
    typedef FA_CAT(vb_, FA_SFX) VB;
    const int64_t Kv = K - K % FA_VL;
    int32_t amax_bits = 0;              /* a max reduction GCC vectorises (vpmaxsd), cheaper
                                         * than a loop of vector compares and blends */
    for (int64_t k = 0; k < K; k++) {
        int32_t b;
        memcpy(&b, x + k, 4);
        b &= 0x7fffffff;
        amax_bits = b > amax_bits ? b : amax_bits;
    }
    float amax;
    memcpy(&amax, &amax_bits, 4);
    int8_t *h8 = dst;
    int16_t *h16 = dst;
    if (amax_bits >= 0x7f800000 || amax < (i8 ? FA_INT8_MIN_AMAX : FA_INT8_ACT_MIN_AMAX)) {
        if (i8)                                                 /* not finite, or zero */
            memset(h8, 0, (size_t)Kp);
        else
            memset(h16, 0, (size_t)Kp * 2);
        return amax_bits >= 0x7f800000 ? NAN : 0.0f;
    }
    const float L = i8 ? 127.0f : (float)fa_int8_act_levels(K);
    const float sx = amax / L, inv = L / amax;
    /* |x_k| <= amax, so |x_k * inv| <= L (1 + 2^-23)^2, which rounds to L: the clip of the
     * rule never changes a value here (the tail's scalar clip stays as the rule's text) */
    const VF vinv = vsplat(inv);
    const VF magic = vsplat(12582912.0f);
    for (int64_t k = 0; k < Kv; k += FA_VL) {
        VF t = vload(x + k) * vinv;
        __asm__("" : "+v"(t));                      /* fl(x inv), then rint (no fma) */
        const VI q = __builtin_convertvector((t + magic) - magic, VI);
        if (i8) {
            *(VS *)(h8 + k) = __builtin_convertvector(q, VS);
        } else if (hilo) {                          /* q = 256 (q >> 8) + (q & 255) */
            *(VS *)(h8 + k) = __builtin_convertvector(q >> 8, VS);
            *(VB *)(h8 + Kp + k) = __builtin_convertvector(q & 255, VB);
        } else {
            *(VH *)(h16 + k) = __builtin_convertvector(q, VH);
        }
    }
    for (int64_t k = Kv; k < Kp; k++) {
        float t = k < K ? x[k] * inv : 0.0f;
        t = t > L ? L : t < -L ? -L : t;
        const int32_t q = (int32_t)((t + 12582912.0f) - 12582912.0f);
        if (i8) {
            h8[k] = (int8_t)q;
        } else if (hilo) {
            h8[k] = (int8_t)(q >> 8);
            ((uint8_t *)h8)[Kp + k] = (uint8_t)(q & 255);
        } else {
            h16[k] = (int16_t)q;
        }
    }
    return sx;
}

/* a product's activations: rows of x (row stride K) into int16 rows of dst (row stride Kp),
 * scales into sx */
static void FA_CAT(q8_quant_rows_, FA_SFX)(int16_t *dst, float *sx, const float *x,
                                           int64_t rows, int64_t K, int64_t Kp)
{
    for (int64_t r = 0; r < rows; r++)
        sx[r] = FA_CAT(q8_quant_row_, FA_SFX)(dst + r * Kp, x + r * K, K, Kp, Q8_FMT_I16);
}

/* ---- bf16 ------------------------------------------------------------------------------------ */

/* Few-row GEMM on packed bf16 weights: y[r][m] = x_r . float32(w_m), for panels [p0, p1).
 *   y   (N, ldy)  out; the panels' features (< M) only, without bias
 *   x   (N, K)    in
 *   wp  (P, K, BF_PANEL) in; panel p holds features p BF_PANEL .. + BF_PANEL (fa_bf16_pack)
 * Vectors along the features: per k, BF_NV widened weight vectors meet a broadcast of each of
 * up to BF_RB rows of x (a tile of exactly the rows left: one row computes one row). Streams
 * wp once per BF_RB rows, in order. Each y element is the same sum in the same order whatever
 * N is (the tile height changes which rows share a pass, not any element's sum). */
#if FA_VL == 16
#define BF_RB 12
#define BF_NV 2
#define BF_FEW 0
#elif FA_VL == 8
#define BF_RB 4
#define BF_NV 2
#define BF_FEW 2             /* up to 2 rows: the whole 32-feature panel (4 ymm) per pass */
#else
#define BF_RB 2
#define BF_NV 4
#define BF_FEW 0
#endif
#define BF_NV_MAX (BF_FEW ? BF_PANEL / FA_VL : BF_NV)

/* nv vectors of widened weights at w (float32(bits) = bits << 16) */
FA_INLINE void FA_CAT(bf16_load_, FA_SFX)(VF *wv, const uint16_t *w, const int nv)
{
    for (int c = 0; c < nv; c++) {
#if FA_VL == 16
        wv[c] = (VF)_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + 16 * c))), 16);
#elif FA_VL == 8
        wv[c] = (VF)_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 8 * c))), 16);
#else
        typedef FA_CAT(vw_, FA_SFX) VW;
        wv[c] = (VF)(__builtin_convertvector(*(const VW *)(w + c * FA_VL), VU) << 16);
#endif
    }
}

/* Packed bf16 panels (wp[p][k][f], P panels of BF_PANEL features) widened to float32 as
 * weight^T: dst[k][p BF_PANEL + f] (row stride P BF_PANEL), for k in [k0, k1) */
static void FA_CAT(bf16_widen_t_, FA_SFX)(float *dst, const uint16_t *wp, int64_t k0, int64_t k1,
                                          int64_t K, int64_t P)
{
    for (int64_t k = k0; k < k1; k++)
        for (int64_t p = 0; p < P; p++) {
            VF wv[BF_PANEL / FA_VL];
            FA_CAT(bf16_load_, FA_SFX)(wv, wp + (p * K + k) * BF_PANEL, BF_PANEL / FA_VL);
            for (int c = 0; c < BF_PANEL / FA_VL; c++)
                vstore(dst + k * P * BF_PANEL + p * BF_PANEL + c * FA_VL, wv[c]);
        }
}

/* nr rows x nv vectors of features m0.. (nf of them; both constants once inlined) */
FA_INLINE void FA_CAT(bf16_tile_, FA_SFX)(float *y, int64_t ldy, const float *x, int64_t K,
                                          const uint16_t *w_k, int64_t nf, const int nr,
                                          const int nv)
{
    VF acc[BF_RB][BF_NV_MAX];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = vsplat(0.0f);
    for (int64_t k = 0; k < K; k++, w_k += BF_PANEL) {
#if BF_FEW
        if (nv == BF_NV_MAX) _mm_prefetch((const char *)(w_k + 8 * BF_PANEL), _MM_HINT_T0);
#endif
        VF wv[BF_NV_MAX];
        FA_CAT(bf16_load_, FA_SFX)(wv, w_k, nv);
        for (int r = 0; r < nr; r++) {
            const VF xv = vsplat(x[r * K + k]);
            for (int c = 0; c < nv; c++) acc[r][c] += xv * wv[c];
        }
    }
    for (int r = 0; r < nr; r++) {
        float *y_r = y + r * ldy;
        if (nf == nv * FA_VL) {
            for (int c = 0; c < nv; c++) vstore(y_r + c * FA_VL, acc[r][c]);
        } else {
            for (int64_t f = 0; f < nf; f++) y_r[f] = acc[r][f / FA_VL][f % FA_VL];
        }
    }
}

#define BF_TILE_AT(NR)                                                                         \
    static __attribute__((noinline)) void FA_CAT(FA_CAT(bf16_tile_, FA_SFX), _##NR)(          \
        float *y, int64_t ldy, const float *x, int64_t K, const uint16_t *w_k, int64_t nf)     \
    {                                                                                          \
        FA_CAT(bf16_tile_, FA_SFX)(y, ldy, x, K, w_k, nf, NR > BF_RB ? BF_RB : NR, BF_NV);    \
    }
BF_TILE_AT(1) BF_TILE_AT(2) BF_TILE_AT(3) BF_TILE_AT(4) BF_TILE_AT(5) BF_TILE_AT(6)
BF_TILE_AT(7) BF_TILE_AT(8) BF_TILE_AT(9) BF_TILE_AT(10) BF_TILE_AT(11) BF_TILE_AT(12)
#undef BF_TILE_AT
#if BF_FEW
/* The few-row tiles (N <= BF_FEW): the whole panel per pass, each k's 64 bytes of weights (one
 * cache line) read once, in order; a pass of BF_NV vectors would read every line twice. */
#define BF_FEW_AT(NR)                                                                          \
    static __attribute__((noinline)) void FA_CAT(FA_CAT(bf16_few_, FA_SFX), _##NR)(           \
        float *y, int64_t ldy, const float *x, int64_t K, const uint16_t *w_k, int64_t nf)     \
    {                                                                                          \
        FA_CAT(bf16_tile_, FA_SFX)(y, ldy, x, K, w_k, nf, NR, BF_NV_MAX);                     \
    }
BF_FEW_AT(1) BF_FEW_AT(2)
#undef BF_FEW_AT
#endif

static void FA_CAT(bf16_packed_gemm_, FA_SFX)(float *FA_RESTRICT y, int64_t ldy,
                                              const float *FA_RESTRICT x, int64_t N,
                                              const uint16_t *FA_RESTRICT wp, int64_t p0,
                                              int64_t p1, int64_t M, int64_t K)
{
#define BF_AT(NR) FA_CAT(FA_CAT(bf16_tile_, FA_SFX), _##NR)
    void (*const at[13])(float *, int64_t, const float *, int64_t, const uint16_t *, int64_t) =
        {NULL,    BF_AT(1), BF_AT(2),  BF_AT(3),  BF_AT(4),  BF_AT(5), BF_AT(6),
         BF_AT(7), BF_AT(8), BF_AT(9), BF_AT(10), BF_AT(11), BF_AT(12)};
#undef BF_AT
#if BF_FEW
    if (N <= BF_FEW) {
        void (*const few)(float *, int64_t, const float *, int64_t, const uint16_t *, int64_t) =
            N == 1 ? FA_CAT(FA_CAT(bf16_few_, FA_SFX), _1) : FA_CAT(FA_CAT(bf16_few_, FA_SFX), _2);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t m0 = p * BF_PANEL, nf = M - m0 < BF_PANEL ? M - m0 : BF_PANEL;
            few(y + m0, ldy, x, K, wp + p * K * BF_PANEL, nf);
        }
        return;
    }
#endif
    const int64_t step = BF_NV * FA_VL;             /* features per register tile */
    for (int64_t p = p0; p < p1; p++) {
        const uint16_t *w_p = wp + p * K * BF_PANEL;
        for (int64_t f0 = 0; f0 < BF_PANEL; f0 += step) {
            const int64_t m0 = p * BF_PANEL + f0;
            if (m0 >= M) break;
            const int64_t nf = M - m0 < step ? M - m0 : step;
            for (int64_t r0 = 0; r0 < N; r0 += BF_RB) {
                const int64_t nr = N - r0 < BF_RB ? N - r0 : BF_RB;
                at[nr](y + r0 * ldy + m0, ldy, x + r0 * K, K, w_p + f0, nf);
            }
        }
    }
}
#undef BF_RB
#undef BF_NV
#undef BF_FEW
#undef BF_NV_MAX

#endif /* !Q8_VNNI_PASS */

/* ---- int8 GEMM tiles ----------------------------------------------------------------------------
 * One tile: rows r < mr of the quantised x (row stride ldx elements) against one panel, over
 * all of K, then the epilogue on the int32 sums (scalar math):
 *   y[r][f] = relu?(fl(fl(float(acc) * fl(sx[r] * scale[f])) + bias[f]))     for f < nf
 * The product is kept a float32 value (an empty asm: no fused multiply-add may absorb it).
 * Q8_TILE(level) names the tile function of a path; Q8_PANEL(level) runs a panel's tiles. */

/* Row r of a tile in registers: a<r>_0 .. a<r>_<NV-1>, named (an array of vectors indexed
 * under `if (r < mr)` is not kept in registers by GCC). Q8_ROWS(X) expands X(r) per tile row;
 * a row r >= mr is dead code once the tile is inlined with a constant mr. */
#define Q8_ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
/* acc += ...: in place, by an asm statement. Written with intrinsics (acc = f(acc, ...)), GCC
 * 12 copies the 24 accumulators between registers and stores them to the stack on every
 * iteration; with the accumulator an in-out asm operand it keeps each one in its register.
 *   Q8_ADD512 / Q8_ADD256   acc += p   (int32 lanes, wrapping: vpaddd) */
#define Q8_ADD512(acc, p) __asm__("vpaddd %1, %0, %0" : "+v"(acc) : "v"(p))
#define Q8_ADD256(acc, p) __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(p))

#if FA_VL == 16 && !defined(Q8_VNNI_PASS)
/* The AVX-512 epilogue of one vector of a tile row: 16 int32 sums -> y (mask: nf) */
FA_INLINE void q8_out512(float *y, __m512i a, __m512 s_r, __m512 sc, __m512 bi, __mmask16 mk,
                         int relu)
{
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(s_r, sc));
    __asm__("" : "+v"(t));                                  /* fl(acc * s), then + bias */
    t = _mm512_add_ps(t, bi);
    if (relu)
        t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LT_OQ),
                               _mm512_setzero_ps());
    _mm512_mask_storeu_ps(y, mk, t);
}

/* scale, bias and store masks of a 64-feature panel with nf features */
FA_INLINE void q8_cols512(__m512 *sc, __m512 *bi, __mmask16 *mk, const float *scale_p,
                          const float *bias_p, int64_t nf)
{
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const int64_t left = nf - 16 * j;
        mk[j] = left >= 16 ? (__mmask16)0xffff
              : left <= 0  ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        sc[j] = _mm512_maskz_loadu_ps(mk[j], scale_p + 16 * j);
        bi[j] = bias_p ? _mm512_maskz_loadu_ps(mk[j], bias_p + 16 * j) : _mm512_setzero_ps();
    }
}
#endif

#define Q8_OUT512(r)                                                                           \
    if (mr > r) {                                                                              \
        const __m512 s_r = _mm512_set1_ps(sx[r]);                                              \
        q8_out512(y + r * ldy, a##r##_0, s_r, sc[0], bi[0], mk[0], relu);                      \
        q8_out512(y + r * ldy + 16, a##r##_1, s_r, sc[1], bi[1], mk[1], relu);                 \
        q8_out512(y + r * ldy + 32, a##r##_2, s_r, sc[2], bi[2], mk[2], relu);                 \
        q8_out512(y + r * ldy + 48, a##r##_3, s_r, sc[3], bi[3], mk[3], relu);                 \
    }

#if FA_VL == 16
/* AVX-512: 64 features x 6 rows; int16 activations, broadcast in pairs, against the weights
 * sign-extended to int16 (vpmovsxbw); Q8_MAC512 is vpmaddwd + vpaddd (AVX-512BW) or VNNI's
 * vpdpwssd, exact either way (|pair sum| <= 2 127 32767 < 2^31, and the sums fit: see
 * fa_int8_act_levels). Compiled twice: FA_SFX v4 (AVX-512BW) and v4vnni. */
#ifdef Q8_VNNI_PASS
#define Q8_MAC512(acc, w, b) __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(b), "v"(w))
#else
#define Q8_MAC512(acc, w, b) Q8_ADD512(acc, _mm512_madd_epi16(w, b))
#endif
FA_INLINE void FA_CAT(q8_tile512_, FA_SFX)(float *y, int64_t ldy, const int16_t *xq,
                                            int64_t ldx, const int8_t *w_p, const float *sx,
                                            const float *scale_p, const float *bias_p,
                                            int64_t Kg, int64_t nf, const int mr, int relu)
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
#endif

#if FA_VL == 8
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
 * accumulators, 2 weights, a broadcast and a product: 16 ymm registers (not 4 rows and 8
 * accumulators: each weight would meet fewer rows). K comes in blocks (q8_panel_avx2): the
 * sums start at 0 (first) or at part (mr, 32) int32, and end in the epilogue (last) or in
 * part. Not a 3-row tile over the whole panel with the weights as memory operands: the loads,
 * not the broadcasts, bind, so keeping the weights in registers wins. */
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
 * row, 4 widened weights and a broadcast: 13 of the 16 ymm registers at two rows. A software
 * prefetch 8 lines ahead, because the hardware prefetcher alone falls behind on a loop that
 * takes one new line per iteration (further ahead helps no more). The same integer sums as
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

static __attribute__((noinline)) void q8_few_avx2_1(float *y, int64_t ldy, const int16_t *xq,
                                                    int64_t ldx, const int8_t *w_p,
                                                    const float *sx, const float *scale_p,
                                                    const float *bias_p, int64_t Kg,
                                                    int64_t nf, int relu)
{
    q8_few_avx2(y, ldy, xq, ldx, w_p, sx, scale_p, bias_p, Kg, nf, 1, relu);
}

static __attribute__((noinline)) void q8_few_avx2_2(float *y, int64_t ldy, const int16_t *xq,
                                                    int64_t ldx, const int8_t *w_p,
                                                    const float *sx, const float *scale_p,
                                                    const float *bias_p, int64_t Kg,
                                                    int64_t nf, int relu)
{
    q8_few_avx2(y, ldy, xq, ldx, w_p, sx, scale_p, bias_p, Kg, nf, 2, relu);
}

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
 * inner loop is loads, vpmaddwd and vpaddd alone, a little faster than widening in every tile
 * once enough rows share the widened block; fewer rows widen in the tile.
 * Partial sums in `part` (the chunk's rows x 32 int32, on the stack). */
#define Q8_AVX2_ROWS 96
#define Q8_AVX2_KG 128
#define Q8_AVX2_WIDEN 12
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
            for (int64_t r0 = c0; r0 < c1; r0 += 6) {
                const int64_t mr = c1 - r0 < 6 ? c1 - r0 : 6;
                at[mr](y + r0 * ldy, ldy, x + r0 * ldx + 2 * k0, ldx, w_p + 64 * k0,
                       widen ? w16 : NULL, part + 32 * (r0 - c0), sx + r0, scale_p, bias_p, kn,
                       nf, relu, first, last);
            }
        }
    }
}
#endif

#if FA_VL == 4
/* generic: 16 features x 4 rows, plain C on the int16 pair layout (the compiler vectorises
 * what it can with SSE2's pmaddwd). */
#define Q8_MR 4
FA_INLINE void q8_tile_generic(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                               const int8_t *w_p, const float *sx, const float *scale_p,
                               const float *bias_p, int64_t Kg, int64_t nf, const int mr,
                               int relu)
{
    int32_t acc[Q8_MR][16];
    for (int r = 0; r < Q8_MR; r++)
        for (int f = 0; f < 16; f++) acc[r][f] = 0;
    for (int64_t kg = 0; kg < Kg; kg++) {
        const int8_t *w_k = w_p + kg * 32;
        for (int r = 0; r < Q8_MR; r++) {
            if (r < mr) {
                const int32_t x0 = xq[r * ldx + 2 * kg], x1 = xq[r * ldx + 2 * kg + 1];
                for (int f = 0; f < 16; f++)
                    acc[r][f] += x0 * (int32_t)w_k[2 * f] + x1 * (int32_t)w_k[2 * f + 1];
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int64_t f = 0; f < nf; f++) {
            float t = (float)acc[r][f] * (sx[r] * scale_p[f]);
            __asm__("" : "+x"(t));
            t = t + (bias_p ? bias_p[f] : 0.0f);
            y[r * ldy + f] = relu && t < 0.0f ? 0.0f : t;
        }
}
#undef Q8_MR
#endif

/* ---- a panel: every tile of `rows` rows -----------------------------------------------------
 * One function per tile height (noinline: inlined into the panel loop, the tile's loop
 * invariants would be hoisted out of it and push the accumulators out of registers). */
#define Q8_TILE_ARGS float *y, int64_t ldy, const int16_t *xq, int64_t ldx, const int8_t *w_p,  \
                     const float *sx, const float *scale_p, const float *bias_p, int64_t Kg,    \
                     int64_t nf, int relu
#define Q8_TILE_AT(name, tile, MRV)                                                            \
    static __attribute__((noinline)) void name##_##MRV(Q8_TILE_ARGS)                            \
    {                                                                                           \
        tile(y, ldy, xq, ldx, w_p, sx, scale_p, bias_p, Kg, nf, MRV, relu);                    \
    }
#define Q8_PANEL_FN(name, tile, MR)                                                             \
    Q8_TILE_AT(name, tile, 1)                                                                   \
    Q8_TILE_AT(name, tile, 2)                                                                   \
    Q8_TILE_AT(name, tile, 3)                                                                   \
    Q8_TILE_AT(name, tile, 4)                                                                   \
    Q8_TILE_AT(name, tile, 5)                                                                   \
    Q8_TILE_AT(name, tile, 6)                                                                   \
    static void name(float *y, int64_t ldy, const int16_t *x, int64_t ldx, int64_t rows,        \
                     const int8_t *w_p, const float *sx, const float *scale_p,                  \
                     const float *bias_p, int64_t Kg, int64_t nf, int relu)                     \
    {                                                                                           \
        void (*const at[7])(Q8_TILE_ARGS) = {NULL,       name##_1, name##_2, name##_3,          \
                                             name##_4,   name##_5, name##_6};                   \
        for (int64_t r0 = 0; r0 < rows; r0 += MR) {                                             \
            const int64_t mr = rows - r0 < MR ? rows - r0 : MR;                                 \
            at[mr](y + r0 * ldy, ldy, x + r0 * ldx, ldx, w_p, sx + r0, scale_p, bias_p, Kg, nf, \
                   relu);                                                                       \
        }                                                                                       \
    }

/* the names expanded first (FA_CAT), then pasted with the tile heights */
#define Q8_PANEL_FN_OF(name, tile, MR) Q8_PANEL_FN(name, tile, MR)
#if FA_VL == 16
Q8_PANEL_FN_OF(FA_CAT(q8_panel512_, FA_SFX), FA_CAT(q8_tile512_, FA_SFX), 6)
#elif FA_VL == 4
Q8_PANEL_FN(q8_panel_generic, q8_tile_generic, 4)
#endif
