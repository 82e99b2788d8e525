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
    vstore_tile(y, ldy, acc, nr, nv, nf);
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

/* ---- bfloat16 compute (fa_linear_bfloat16_forward) ------------------------------------------
 * scalar math (fastattn.h, the twin reference._linear_bfloat16):
 *   xb_k = bfr(x_k), wb_k = bfr(w_k)    bfr: vcvtneps2bf16's rounding (subnormal -> signed 0,
 *                                       NaN -> quiet NaN, else to nearest even)
 *   acc = 0;  for kk < Kp / 2:  acc = fl(acc + xb_{2kk+1} wb_{2kk+1});  acc = fl(acc + xb_{2kk} wb_{2kk})
 * (K padded to even with zeros). A product of two bf16 values is exact in float32, so
 * fl(acc + p) is a fused multiply-add, a multiply then an add, or one half of vdpbf16ps (which
 * adds the odd element's product first): every path below gives the same bits.
 * Weights (fa_bfloat16_pack): panels of BFC_NP features, K in pairs, one uint32 per pair:
 *   wp[p][kk][f] = bfr(w[p NP + f][2 kk]) | bfr(w[p NP + f][2 kk + 1]) << 16
 * so a vector of pairs is an odd-k weight vector once masked (& 0xffff0000) and an even-k one
 * once shifted (<< 16). Rows of x are rounded first, into bits (vdpbf16ps) or into the float32
 * values of those bits (the FMA tiles, which broadcast them). */

/* bfr on a vector of float32 bits: bf16 bits in the low half of each lane */
FA_INLINE VU bfc_round_v(VU b)
{
    const VU mag = b & 0x7fffffffu;
    const VU rne = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const VU nan = (b >> 16) | 0x40u;
    const VU zero = (b >> 16) & 0x8000u;
    const VU is_nan = (VU)(mag > 0x7f800000u), tiny = (VU)(mag < 0x00800000u);  /* all ones */
    const VU r = (nan & is_nan) | (rne & ~is_nan);
    return (zero & tiny) | (r & ~tiny);
}

/* one row of x (K) rounded: wide = 1, the float32 values of the bf16 bits (float dst[Kp]);
 * wide = 0, the bits (uint16 dst[Kp]); zero from K to Kp */
static void bfc_round_row(void *dst, const float *x, int64_t K, int64_t Kp, int wide)
{
    const int64_t Kv = K - K % FA_VL;
    float *df = dst;
    uint16_t *dh = dst;
    for (int64_t k = 0; k < Kv; k += FA_VL) {
        VU b;
        memcpy(&b, x + k, sizeof b);
        const VU r = bfc_round_v(b);
        if (wide) {
            const VU w = r << 16;
            memcpy(df + k, &w, sizeof w);
        } else {
            *(VW *)(dh + k) = __builtin_convertvector(r, VW);
        }
    }
    for (int64_t k = Kv; k < Kp; k++) {
        uint32_t b = 0;
        if (k < K) memcpy(&b, x + k, 4);
        VU v = (VU){0} + b;
        const uint32_t r = (uint32_t)bfc_round_v(v)[0];
        if (wide) {
            const uint32_t w = r << 16;
            memcpy(df + k, &w, 4);
        } else {
            dh[k] = (uint16_t)r;
        }
    }
}

/* nr rows x nv vectors of features (nf of them) over Kh pairs, the FMA way:
 *   y   (nr, ldy) out, without bias;  xw  (nr, ldx) the rows' rounded values (float32);
 *   w   the panel from feature f0: pairs w[kk BFC_NP + f] (wide = 0: widened here, in
 *       registers), or float32 values (wide = 1: bfc_widen's layout, odd k at wf[kk][0][f],
 *       even k at wf[kk][1][f]; no integer work left in the loop) */
#define BFC_NV_MAX 4
FA_INLINE void bfc_tile(float *y, int64_t ldy, const float *xw, int64_t ldx, const void *w,
                        int64_t Kh, int64_t nf, int load, const int nr, const int nv,
                        const int wide)
{
    VF acc[BFC_MR][BFC_NV_MAX];
    for (int r = 0; r < nr; r++)             /* load: the sums so far (an earlier K block) */
        for (int c = 0; c < nv; c++) {
            acc[r][c] = vsplat(0.0f);
            if (load && nf == nv * FA_VL) {
                acc[r][c] = vload(y + r * ldy + c * FA_VL);
            } else if (load) {
                for (int64_t f = c * FA_VL; f < nf && f < (c + 1) * FA_VL; f++)
                    acc[r][c][f % FA_VL] = y[r * ldy + f];
            }
        }
    for (int64_t kk = 0; kk < Kh; kk++) {
        const uint32_t *w_k = (const uint32_t *)w + kk * BFC_NP;
        const float *wf_k = (const float *)w + kk * 2 * BFC_NP;
        VF wv[BFC_NV_MAX];
        for (int c = 0; c < nv; c++) {                 /* odd k first (as vdpbf16ps) */
            if (wide) {
                wv[c] = vload(wf_k + c * FA_VL);
            } else {
                VU u;
                memcpy(&u, w_k + c * FA_VL, sizeof u);
                wv[c] = (VF)(u & 0xffff0000u);
            }
        }
        for (int r = 0; r < nr; r++) {
            const VF xv = vsplat(xw[r * ldx + 2 * kk + 1]);
            for (int c = 0; c < nv; c++) acc[r][c] += xv * wv[c];
        }
        for (int c = 0; c < nv; c++) {
            if (wide) {
                wv[c] = vload(wf_k + BFC_NP + c * FA_VL);
            } else {
                VU u;
                memcpy(&u, w_k + c * FA_VL, sizeof u);
                wv[c] = (VF)(u << 16);
            }
        }
        for (int r = 0; r < nr; r++) {
            const VF xv = vsplat(xw[r * ldx + 2 * kk]);
            for (int c = 0; c < nv; c++) acc[r][c] += xv * wv[c];
        }
    }
    vstore_tile(y, ldy, acc, nr, nv, nf);
}

#define BFC_TILE_AT(NR)                                                                        \
    static __attribute__((noinline)) void bfc_tile_##NR(float *y, int64_t ldy, const float *xw, \
                                                        int64_t ldx, const void *w, int64_t Kh, \
                                                        int64_t nf, int load)                   \
    {                                                                                          \
        bfc_tile(y, ldy, xw, ldx, w, Kh, nf, load, NR, BFC_NV, 0);                             \
    }                                                                                          \
    static __attribute__((noinline)) void bfc_wtile_##NR(float *y, int64_t ldy, const float *xw,\
                                                         int64_t ldx, const void *w,            \
                                                         int64_t Kh, int64_t nf, int load)      \
    {                                                                                          \
        bfc_tile(y, ldy, xw, ldx, w, Kh, nf, load, NR, BFC_NV, 1);                             \
    }
BFC_TILE_AT(1) BFC_TILE_AT(2) BFC_TILE_AT(3) BFC_TILE_AT(4) BFC_TILE_AT(5) BFC_TILE_AT(6)
#if BFC_MR > 6
BFC_TILE_AT(7) BFC_TILE_AT(8)
#endif
#undef BFC_TILE_AT

/* Pairs [k0, k1) of the panel widened to float32, odd k then even k per pair:
 *   wf[kk - k0][0][f] = float32(odd half of w_p[kk][f]),  wf[kk - k0][1][f] = the even half */
static void bfc_widen(float *wf, const uint32_t *w_p, int64_t k0, int64_t k1)
{
    wf -= k0 * 2 * BFC_NP;
    for (int64_t kk = k0; kk < k1; kk++)
        for (int c = 0; c < BFC_NP / FA_VL; c++) {
            VU u;
            memcpy(&u, w_p + kk * BFC_NP + c * FA_VL, sizeof u);
            const VU odd = u & 0xffff0000u, even = u << 16;
            memcpy(wf + kk * 2 * BFC_NP + c * FA_VL, &odd, sizeof odd);
            memcpy(wf + kk * 2 * BFC_NP + BFC_NP + c * FA_VL, &even, sizeof even);
        }
}

/* One panel (fa_kernels.bfc_panel): y[r][f] for r < rows, f < nf (<= BFC_NP), without bias.
 *   xr  the rows' rounded values (float32, row stride ldx);  w_p  the panel (Kh, BFC_NP);
 *   wf  scratch of 2 BFC_NP BFC_KB floats: from BFC_WIDEN_ROWS rows on, the panel is widened
 *       into it once, BFC_KB pairs at a time (a block that stays in L1 while every tile of
 *       the rows meets it; the tiles carry their sums from block to block through y, exactly);
 *       fewer rows widen in registers, streaming the pairs */
static void bfc_panel(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                      const uint32_t *w_p, int64_t Kh, int64_t nf, float *wf)
{
    typedef void (*tile_fn)(float *, int64_t, const float *, int64_t, const void *, int64_t,
                            int64_t, int);
#if BFC_MR > 6
    const tile_fn at[9] = {NULL, bfc_tile_1, bfc_tile_2, bfc_tile_3, bfc_tile_4,
                           bfc_tile_5, bfc_tile_6, bfc_tile_7, bfc_tile_8};
    const tile_fn wat[9] = {NULL, bfc_wtile_1, bfc_wtile_2, bfc_wtile_3, bfc_wtile_4,
                            bfc_wtile_5, bfc_wtile_6, bfc_wtile_7, bfc_wtile_8};
#else
    const tile_fn at[7] = {NULL, bfc_tile_1, bfc_tile_2, bfc_tile_3,
                           bfc_tile_4, bfc_tile_5, bfc_tile_6};
    const tile_fn wat[7] = {NULL, bfc_wtile_1, bfc_wtile_2, bfc_wtile_3,
                            bfc_wtile_4, bfc_wtile_5, bfc_wtile_6};
#endif
    const float *x = xr;
    const int64_t step = BFC_NV * FA_VL;
    if (rows < BFC_WIDEN_ROWS) {
        for (int64_t f0 = 0; f0 < nf; f0 += step) {
            const int64_t nt = nf - f0 < step ? nf - f0 : step;
            for (int64_t r0 = 0; r0 < rows; r0 += BFC_MR) {
                const int64_t nr = rows - r0 < BFC_MR ? rows - r0 : BFC_MR;
                at[nr](y + r0 * ldy + f0, ldy, x + r0 * ldx, ldx, w_p + f0, Kh, nt, 0);
            }
        }
        return;
    }
    for (int64_t k0 = 0; k0 < Kh; k0 += BFC_KB) {
        const int64_t k1 = Kh - k0 < BFC_KB ? Kh : k0 + BFC_KB;
        bfc_widen(wf, w_p, k0, k1);
        for (int64_t f0 = 0; f0 < nf; f0 += step) {
            const int64_t nt = nf - f0 < step ? nf - f0 : step;
            for (int64_t r0 = 0; r0 < rows; r0 += BFC_MR) {
                const int64_t nr = rows - r0 < BFC_MR ? rows - r0 : BFC_MR;
                wat[nr](y + r0 * ldy + f0, ldy, x + r0 * ldx + 2 * k0, ldx, wf + f0, k1 - k0,
                        nt, k0 > 0);
            }
        }
    }
}

/* Few rows (a decode step's, up to BFC_FEW_ROWS): one pass over BFC_FEW_NV vectors of
 * consecutive features, across panel edges (AVX-512: two panels), so that each row keeps that
 * many independent sums in flight (one per vector: the order of each sum is fixed, so more
 * chains, not split sums, hide the FMA latency); the pairs widened in registers as they
 * stream. nv vectors from feature 0 of panel w (panels Kh BFC_NP words apart), nf features. */
FA_INLINE void bfc_few(float *y, int64_t ldy, const float *xw, int64_t ldx, const uint32_t *w,
                       int64_t Kh, int64_t nf, const int nr, const int nv)
{
    VF acc[BFC_FEW_ROWS][BFC_FEW_NV];
    const uint32_t *w_c[BFC_FEW_NV];
    for (int c = 0; c < nv; c++)
        w_c[c] = w + (c * FA_VL / BFC_NP) * BFC_NP * Kh + (c * FA_VL) % BFC_NP;
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = vsplat(0.0f);
    for (int64_t kk = 0; kk < Kh; kk++) {
        VU u[BFC_FEW_NV];
        for (int c = 0; c < nv; c++) memcpy(&u[c], w_c[c] + kk * BFC_NP, sizeof u[c]);
        for (int r = 0; r < nr; r++) {
            const VF xo = vsplat(xw[r * ldx + 2 * kk + 1]), xe = vsplat(xw[r * ldx + 2 * kk]);
            for (int c = 0; c < nv; c++) {
                acc[r][c] += xo * (VF)(u[c] & 0xffff0000u);         /* odd k first */
                acc[r][c] += xe * (VF)(u[c] << 16);
            }
        }
    }
    vstore_tile(y, ldy, acc, nr, nv, nf);
}

#define BFC_FEW_AT(NR)                                                                         \
    static __attribute__((noinline)) void bfc_few_##NR(float *y, int64_t ldy, const float *xw,  \
                                                       int64_t ldx, const uint32_t *w,          \
                                                       int64_t Kh, int64_t nf)                  \
    {                                                                                          \
        bfc_few(y, ldy, xw, ldx, w, Kh, nf, NR, BFC_FEW_NV);                                   \
    }
BFC_FEW_AT(1) BFC_FEW_AT(2)
#undef BFC_FEW_AT

/* Panels [p0, p1) for rows <= BFC_FEW_ROWS (fa_kernels.bfc_panels_few), without bias:
 * BFC_FEW_NV vectors at a time while whole ones remain, the rest by bfc_panel's tiles */
static void bfc_panels_few(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                           const uint32_t *wp, int64_t p0, int64_t p1, int64_t Kh, int64_t M)
{
    const float *x = xr;
    const int64_t span = BFC_FEW_NV * FA_VL;        /* features per pass */
    int64_t m0 = p0 * BFC_NP;
    const int64_t m1 = p1 * BFC_NP < M ? p1 * BFC_NP : M;
    for (; m0 + span <= p1 * BFC_NP && m0 < m1; m0 += span) {
        const int64_t nf = m1 - m0 < span ? m1 - m0 : span;
        const uint32_t *w = wp + (m0 / BFC_NP) * BFC_NP * Kh + m0 % BFC_NP;
        (rows == 1 ? bfc_few_1 : bfc_few_2)(y + m0, ldy, x, ldx, w, Kh, nf);
    }
    for (; m0 < m1; m0 += BFC_NP) {                   /* a panel left over: whole panels */
        const int64_t nf = m1 - m0 < BFC_NP ? m1 - m0 : BFC_NP;
        bfc_panel(y + m0, ldy, xr, ldx, rows, wp + m0 * Kh, Kh, nf, NULL);
    }
}

#if FA_VL == 16 && defined(ATT_HAVE_BF16_DOT)
/* The AVX512_BF16 tiles: nr rows x nv vectors of 16 features, each step one vdpbf16ps of a
 * weight vector (16 features x a pair of k) and a row's pair broadcast. These functions alone
 * carry the avx512bf16 target (BFC_DOT): fa_bfloat16_init runs them only where the CPU has it.
 * Accumulators named (an array indexed under `if` is not kept in registers); intrinsics, not
 * asm, so that the register allocator sees the 24 sums and 4 weight vectors and keeps them
 * all in registers without moves. */
#define BFC_DOT __attribute__((target("avx512bf16")))
#define BFC_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
BFC_DOT FA_INLINE void bfc_dp_tile(float *y, int64_t ldy, const uint32_t *xb, int64_t ldx,
                                   const uint32_t *w, int64_t Kh, int64_t nf, const int nr,
                                   const int nv)
{
#define BFC_INIT(r)                                                                            \
    __m512 a##r##_0 = _mm512_setzero_ps(), a##r##_1 = _mm512_setzero_ps(),                     \
           a##r##_2 = _mm512_setzero_ps(), a##r##_3 = _mm512_setzero_ps();
    BFC_ROWS(BFC_INIT)
#undef BFC_INIT
    const __m512bh z = (__m512bh)_mm512_setzero_ps();
    for (int64_t kk = 0; kk < Kh; kk++) {
        const uint32_t *w_k = w + kk * BFC_NP;
        const __m512bh w0 = (__m512bh)_mm512_loadu_ps(w_k);
        const __m512bh w1 = nv > 1 ? (__m512bh)_mm512_loadu_ps(w_k + 16) : z;
        const __m512bh w2 = nv > 2 ? (__m512bh)_mm512_loadu_ps(w_k + 32) : z;
        const __m512bh w3 = nv > 3 ? (__m512bh)_mm512_loadu_ps(w_k + 48) : z;
#define BFC_STEP(r)                                                                            \
        if (nr > r) {                                                                          \
            const __m512bh x_r = (__m512bh)_mm512_set1_epi32((int)xb[r * ldx + kk]);           \
            a##r##_0 = _mm512_dpbf16_ps(a##r##_0, w0, x_r);                                    \
            if (nv > 1) a##r##_1 = _mm512_dpbf16_ps(a##r##_1, w1, x_r);                        \
            if (nv > 2) a##r##_2 = _mm512_dpbf16_ps(a##r##_2, w2, x_r);                        \
            if (nv > 3) a##r##_3 = _mm512_dpbf16_ps(a##r##_3, w3, x_r);                        \
        }
        BFC_ROWS(BFC_STEP)
#undef BFC_STEP
    }
    __mmask16 mk[4];
    for (int c = 0; c < 4; c++) {
        const int64_t left = nf - 16 * c;
        mk[c] = left >= 16 ? (__mmask16)0xffff
              : left <= 0  ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    }
#define BFC_OUT(r)                                                                             \
    if (nr > r) {                                                                              \
        _mm512_mask_storeu_ps(y + r * ldy, mk[0], a##r##_0);                                   \
        if (nv > 1) _mm512_mask_storeu_ps(y + r * ldy + 16, mk[1], a##r##_1);                  \
        if (nv > 2) _mm512_mask_storeu_ps(y + r * ldy + 32, mk[2], a##r##_2);                  \
        if (nv > 3) _mm512_mask_storeu_ps(y + r * ldy + 48, mk[3], a##r##_3);                  \
    }
    BFC_ROWS(BFC_OUT)
#undef BFC_OUT
}

#define BFC_DP_AT(NR)                                                                          \
    BFC_DOT static __attribute__((noinline)) void bfc_dp_tile_##NR(                           \
        float *y, int64_t ldy, const uint32_t *xb, int64_t ldx, const uint32_t *w, int64_t Kh,  \
        int64_t nf)                                                                            \
    {                                                                                          \
        bfc_dp_tile(y, ldy, xb, ldx, w, Kh, nf, NR, BFC_DP_NV);                                \
    }
BFC_DP_AT(1) BFC_DP_AT(2) BFC_DP_AT(3) BFC_DP_AT(4) BFC_DP_AT(5) BFC_DP_AT(6)
BFC_DP_AT(7) BFC_DP_AT(8) BFC_DP_AT(9) BFC_DP_AT(10) BFC_DP_AT(11) BFC_DP_AT(12)
#undef BFC_DP_AT
#undef BFC_ROWS

/* One panel on AVX512_BF16 (fa_kernels.bfc_panel_dp): as bfc_panel, xr the rows' bf16 bits
 * (row stride ldx pairs) */
static void bfc_panel_dp(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                         const uint32_t *w_p, int64_t Kh, int64_t nf, float *wf)
{
    typedef void (*tile_fn)(float *, int64_t, const uint32_t *, int64_t, const uint32_t *,
                            int64_t, int64_t);
    const tile_fn at[13] = {NULL,          bfc_dp_tile_1, bfc_dp_tile_2,  bfc_dp_tile_3,
                            bfc_dp_tile_4, bfc_dp_tile_5, bfc_dp_tile_6,  bfc_dp_tile_7,
                            bfc_dp_tile_8, bfc_dp_tile_9, bfc_dp_tile_10, bfc_dp_tile_11,
                            bfc_dp_tile_12};
    const uint32_t *x = xr;
    const int64_t step = BFC_DP_NV * 16;
    for (int64_t f0 = 0; f0 < nf; f0 += step) {
        const int64_t nt = nf - f0 < step ? nf - f0 : step;
        for (int64_t r0 = 0; r0 < rows; r0 += BFC_DP_MR) {
            const int64_t nr = rows - r0 < BFC_DP_MR ? rows - r0 : BFC_DP_MR;
            at[nr](y + r0 * ldy + f0, ldy, x + r0 * ldx, ldx, w_p + f0, Kh, nt);
        }
    }
}

/* The register-only vdpbf16ps peak: `iters` steps of 24 independent vdpbf16ps (64 flops each);
 * return the sum of the lanes so the loop is not dropped. The accumulators are named (an array
 * of them is kept in memory, one store per step). The FMA peak is gemm_body.h's. */
#define BFC_24(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) \
    X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define BFC_PEAK_FN(name, insn)                                                                \
    static float name(int64_t iters)                                                           \
    {                                                                                          \
        const __m512 w = _mm512_set1_ps(1e-3f), x = _mm512_set1_ps(1e-3f);                     \
        BFC_24(BFC_PEAK_INIT)                                                                  \
        for (int64_t it = 0; it < iters; it++) {                                               \
            BFC_24(BFC_PEAK_STEP_##insn)                                                       \
        }                                                                                      \
        __m512 s = _mm512_setzero_ps();                                                        \
        BFC_24(BFC_PEAK_SUM)                                                                   \
        return _mm512_reduce_add_ps(s);                                                        \
    }
#define BFC_PEAK_INIT(i) __m512 a##i = _mm512_setzero_ps();
#define BFC_PEAK_STEP_dp(i) __asm__("vdpbf16ps %2, %1, %0" : "+v"(a##i) : "v"(w), "v"(x));
#define BFC_PEAK_SUM(i) s = _mm512_add_ps(s, a##i);
BFC_PEAK_FN(bfc_dp_peak, dp)
#undef BFC_PEAK_FN
#undef BFC_PEAK_INIT
#undef BFC_PEAK_STEP_dp
#undef BFC_PEAK_SUM
#undef BFC_24
#define BFC_PANEL_DP bfc_panel_dp
#define BFC_DP_PEAK bfc_dp_peak
#else
#define BFC_PANEL_DP NULL
#define BFC_DP_PEAK NULL
#endif
#undef BFC_NV_MAX
