/* quant_body.h -- the quantised products' per-ISA pieces that follow the SIMD level: rows
 * quantised to int8 / int16 (fa_quantize_int8 and every int8 path's activations) and the bf16
 * few-row GEMM. The int8 GEMM tiles follow the int8 path instead (quant_<arch>.c). */

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
typedef int16_t VH __attribute__((vector_size(FA_VL * 2), aligned(1), may_alias));
typedef int8_t VS __attribute__((vector_size(FA_VL), aligned(1), may_alias));
typedef uint16_t VW __attribute__((vector_size(FA_VL * 2), aligned(1), may_alias));
typedef uint8_t VB __attribute__((vector_size(FA_VL), aligned(1), may_alias));

static float q8_quant_row(void *dst, const float *x, int64_t K, int64_t Kp, int fmt)
{
    const int i8 = fmt == Q8_FMT_I8, hilo = fmt == Q8_FMT_HILO;
    const int64_t Kv = K - K % FA_VL;
    int32_t amax_bits = 0;              /* a max reduction GCC vectorises (vpmaxsd), cheaper
                                         * than a vector compare and blend */
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
static void q8_quant_rows(int16_t *dst, float *sx, const float *x, int64_t rows, int64_t K,
                          int64_t Kp)
{
    for (int64_t r = 0; r < rows; r++)
        sx[r] = q8_quant_row(dst + r * Kp, x + r * K, K, Kp, Q8_FMT_I16);
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
#define BF_NV_MAX (BF_FEW ? BF_PANEL / FA_VL : BF_NV)

/* nv vectors of widened weights at w (float32(bits) = bits << 16) */
FA_INLINE void bf16_load(VF *wv, const uint16_t *w, const int nv)
{
    for (int c = 0; c < nv; c++) {
#if FA_VL == 16
        wv[c] = (VF)_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + 16 * c))), 16);
#elif FA_VL == 8
        wv[c] = (VF)_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 8 * c))), 16);
#else
        wv[c] = (VF)(__builtin_convertvector(*(const VW *)(w + c * FA_VL), VU) << 16);
#endif
    }
}

/* Packed bf16 panels (wp[p][k][f], P panels of BF_PANEL features) widened to float32 as
 * weight^T: dst[k][p BF_PANEL + f] (row stride P BF_PANEL), for k in [k0, k1) */
static void bf16_widen_t(float *dst, const uint16_t *wp, int64_t k0, int64_t k1, int64_t K,
                         int64_t P)
{
    for (int64_t k = k0; k < k1; k++)
        for (int64_t p = 0; p < P; p++) {
            VF wv[BF_PANEL / FA_VL];
            bf16_load(wv, wp + (p * K + k) * BF_PANEL, BF_PANEL / FA_VL);
            for (int c = 0; c < BF_PANEL / FA_VL; c++)
                vstore(dst + k * P * BF_PANEL + p * BF_PANEL + c * FA_VL, wv[c]);
        }
}

/* nr rows x nv vectors of features m0.. (nf of them; both constants once inlined) */
FA_INLINE void bf16_tile(float *y, int64_t ldy, const float *x, int64_t K, const uint16_t *w_k,
                         int64_t nf, const int nr, const int nv)
{
    VF acc[BF_RB][BF_NV_MAX];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = vsplat(0.0f);
    for (int64_t k = 0; k < K; k++, w_k += BF_PANEL) {
#if BF_FEW
        if (nv == BF_NV_MAX) _mm_prefetch((const char *)(w_k + 8 * BF_PANEL), _MM_HINT_T0);
#endif
        VF wv[BF_NV_MAX];
        bf16_load(wv, w_k, nv);
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
    static __attribute__((noinline)) void bf16_tile_##NR(                                     \
        float *y, int64_t ldy, const float *x, int64_t K, const uint16_t *w_k, int64_t nf)     \
    {                                                                                          \
        bf16_tile(y, ldy, x, K, w_k, nf, NR > BF_RB ? BF_RB : NR, BF_NV);                      \
    }
BF_TILE_AT(1) BF_TILE_AT(2) BF_TILE_AT(3) BF_TILE_AT(4) BF_TILE_AT(5) BF_TILE_AT(6)
BF_TILE_AT(7) BF_TILE_AT(8) BF_TILE_AT(9) BF_TILE_AT(10) BF_TILE_AT(11) BF_TILE_AT(12)
#undef BF_TILE_AT
#if BF_FEW
/* The few-row tiles (N <= BF_FEW): the whole panel per pass, each k's 64 bytes of weights (one
 * cache line) read once, in order; a pass of BF_NV vectors would read every line twice. */
#define BF_FEW_AT(NR)                                                                          \
    static __attribute__((noinline)) void bf16_few_##NR(                                      \
        float *y, int64_t ldy, const float *x, int64_t K, const uint16_t *w_k, int64_t nf)     \
    {                                                                                          \
        bf16_tile(y, ldy, x, K, w_k, nf, NR, BF_NV_MAX);                                       \
    }
BF_FEW_AT(1) BF_FEW_AT(2)
#undef BF_FEW_AT
#endif

static void bf16_packed_gemm(float *FA_RESTRICT y, int64_t ldy, const float *FA_RESTRICT x,
                             int64_t N, const uint16_t *FA_RESTRICT wp, int64_t p0, int64_t p1,
                             int64_t M, int64_t K)
{
#define BF_AT(NR) bf16_tile_##NR
    void (*const at[13])(float *, int64_t, const float *, int64_t, const uint16_t *, int64_t) =
        {NULL,    BF_AT(1), BF_AT(2),  BF_AT(3),  BF_AT(4),  BF_AT(5), BF_AT(6),
         BF_AT(7), BF_AT(8), BF_AT(9), BF_AT(10), BF_AT(11), BF_AT(12)};
#undef BF_AT
#if BF_FEW
    if (N <= BF_FEW) {
        void (*const few)(float *, int64_t, const float *, int64_t, const uint16_t *, int64_t) =
            N == 1 ? bf16_few_1 : bf16_few_2;
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
#undef BF_NV_MAX
