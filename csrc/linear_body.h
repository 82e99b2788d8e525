/* linear_body.h -- the GEMM epilogue, per ISA: y = act(y + bias) on a block of rows.
 *   scalar math:  relu(t) = max(t, 0);  gelu(t) = t * Phi(t) = t * (1 - erfc(t / sqrt 2) / 2)
 * erfc uses the Chebyshev-fitted form erfc(z) = u exp(-z^2 + P(u)), u = 1 / (1 + z/2), z >= 0
 * (fractional error < 1.2e-7 for all z), so gelu is accurate in both tails without cancellation. */

FA_INLINE VF FA_CAT(vgelu_, FA_SFX)(VF t)
{
    const VI neg = (VI)(t < vsplat(0.0f));
    const VI abs_mask = (VI)vsplat(0.0f) | 0x7fffffff;                 /* clears the sign bit */
    const VF z = (VF)((VI)t & abs_mask) * vsplat(0.70710678118654752f); /* |t| / sqrt 2 */
    const VF u = vsplat(1.0f) / (vsplat(1.0f) + vsplat(0.5f) * z);
    VF p = vsplat(0.17087277f);
    p = p * u + vsplat(-0.82215223f);
    p = p * u + vsplat(1.48851587f);
    p = p * u + vsplat(-1.13520398f);
    p = p * u + vsplat(0.27886807f);
    p = p * u + vsplat(-0.18628806f);
    p = p * u + vsplat(0.09678418f);
    p = p * u + vsplat(0.37409196f);
    p = p * u + vsplat(1.00002368f);
    p = p * u + vsplat(-1.26551223f);
    const VF half_erfc = vsplat(0.5f) * u * vexp(p - z * z);   /* = 1 - Phi(|t|) */
    const VF pos = t * (vsplat(1.0f) - half_erfc);             /* t >= 0: t Phi(t); inf -> inf */
    const VI zero = (VI)(half_erfc == vsplat(0.0f));           /* far left tail, -inf: 0 */
    const VF negv = (VF)(~zero & (VI)(t * half_erfc));         /* t < 0:  t (1 - Phi(|t|)) */
    return (VF)((neg & (VI)negv) | (~neg & (VI)pos));
}

FA_INLINE VF FA_CAT(vact_, FA_SFX)(VF t, int act)
{
    if (act == FA_ACT_RELU) return (VF)(~(VI)(t < vsplat(0.0f)) & (VI)t); /* NaN stays NaN */
    if (act == FA_ACT_GELU) return FA_CAT(vgelu_, FA_SFX)(t);
    return t;
}

/* y (rows, M) with row stride ldy: y = act(y + bias); bias may be NULL. */
static void FA_CAT(bias_act_rows_, FA_SFX)(float *y, const float *bias, int64_t rows, int64_t M,
                                           int64_t ldy, int act)
{
    if (!bias && act == FA_ACT_NONE) return;
    const int64_t Mv = M - M % FA_VL;
    for (int64_t r = 0; r < rows; r++) {
        float *y_r = y + r * ldy;
        int64_t c = 0;
        for (; c < Mv; c += FA_VL) {
            VF t = vload(y_r + c);
            if (bias) t += vload(bias + c);
            vstore(y_r + c, FA_CAT(vact_, FA_SFX)(t, act));
        }
        for (; c < M; c++) {
            VF t = vsplat(y_r[c] + (bias ? bias[c] : 0.0f));
            y_r[c] = FA_CAT(vact_, FA_SFX)(t, act)[0];
        }
    }
}

/* Skinny GEMM for a few rows (decode steps): y[r][m] = x_r . w_m for r < N, m < M, without
 * the bias (the epilogue adds it). Bound by reading w once, so w is streamed in tiles of 4 rows
 * and each tile meets every x row while it is in L1; vectors run along K.
 *   y   (N, ldy)   out        xp (ceil(N/4)*4, K)  in, rows past N zero (padding)
 *   w   (M, K)     in
 * Each y element is the same sum in the same order whatever N is (batch invariance). */
static void FA_CAT(skinny_gemm_, FA_SFX)(float *FA_RESTRICT y, int64_t ldy,
                                         const float *FA_RESTRICT xp, int64_t N,
                                         const float *FA_RESTRICT w, int64_t M, int64_t K)
{
    const int64_t Kv = K - K % FA_VL;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
        const float *w0 = w + m * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        for (int64_t r0 = 0; r0 < N; r0 += 4) {
            const float *x0 = xp + r0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            VF acc[4][4];
            for (int u = 0; u < 4; u++)
                for (int r = 0; r < 4; r++) acc[u][r] = vsplat(0.0f);
            for (int64_t k = 0; k < Kv; k += FA_VL) {
                const VF xv[4] = {vload(x0 + k), vload(x1 + k), vload(x2 + k), vload(x3 + k)};
                const VF wv[4] = {vload(w0 + k), vload(w1 + k), vload(w2 + k), vload(w3 + k)};
                for (int u = 0; u < 4; u++)
                    for (int r = 0; r < 4; r++) acc[u][r] += wv[u] * xv[r];
            }
            for (int r = 0; r < 4 && r0 + r < N; r++) {
                const float *x_r = xp + (r0 + r) * K;
                for (int u = 0; u < 4; u++) {
                    const float *w_u = w + (m + u) * K;
                    float t = hsum(acc[u][r]);
                    for (int64_t k = Kv; k < K; k++) t += x_r[k] * w_u[k];
                    y[(r0 + r) * ldy + m + u] = t;
                }
            }
        }
    }
    for (; m < M; m++) { /* the last M % 4 features, one at a time */
        const float *w_m = w + m * K;
        for (int64_t r = 0; r < N; r++) {
            const float *x_r = xp + r * K;
            VF acc = vsplat(0.0f);
            for (int64_t k = 0; k < Kv; k += FA_VL) acc += vload(w_m + k) * vload(x_r + k);
            float t = hsum(acc);
            for (int64_t k = Kv; k < K; k++) t += x_r[k] * w_m[k];
            y[r * ldy + m] = t;
        }
    }
}

/* Few-row GEMM on packed weights (decode steps): y[r][m] = x_r . w_m, for panels [p0, p1).
 *   y   (N, ldy)  out; columns of the panels' features (< M) only
 *   x   (N, K)    in
 *   wp  (P, K, FA_PANEL) in; panel p holds features p*FA_PANEL .. +FA_PANEL, row k contiguous
 *       (fa_pack_panels), features past M are zero
 * Vectors run along the features, so no horizontal sums: per k, SK_NV weight vectors meet a
 * broadcast of each of SK_RB rows of x. Bound by streaming wp once, which it does in order.
 * Each y element is the same sum in the same order whatever N is (batch invariance). */
static void FA_CAT(packed_gemm_, FA_SFX)(float *FA_RESTRICT y, int64_t ldy,
                                         const float *FA_RESTRICT x, int64_t N,
                                         const float *FA_RESTRICT wp, int64_t p0, int64_t p1,
                                         int64_t M, int64_t K)
{
    const int64_t step = SK_NV * FA_VL;             /* features per register tile */
    for (int64_t p = p0; p < p1; p++) {
        const float *w_p = wp + p * K * FA_PANEL;
        for (int64_t f0 = 0; f0 < FA_PANEL; f0 += step) {
            const int64_t m0 = p * FA_PANEL + f0;
            if (m0 >= M) break;
            for (int64_t r0 = 0; r0 < N; r0 += SK_RB) {
                const int64_t nr = N - r0 < SK_RB ? N - r0 : SK_RB;
                VF acc[SK_RB][SK_NV];
                for (int r = 0; r < SK_RB; r++)
                    for (int c = 0; c < SK_NV; c++) acc[r][c] = vsplat(0.0f);
                const float *w_k = w_p + f0;
                const float *x_r0 = x + r0 * K;
                for (int64_t k = 0; k < K; k++, w_k += FA_PANEL) {
                    VF wv[SK_NV];
                    for (int c = 0; c < SK_NV; c++) wv[c] = vload(w_k + c * FA_VL);
                    for (int r = 0; r < SK_RB; r++) {
                        /* rows past N read row 0 again (harmless, never stored) */
                        const VF xv = vsplat(x_r0[(r < nr ? r : 0) * K + k]);
                        for (int c = 0; c < SK_NV; c++) acc[r][c] += xv * wv[c];
                    }
                }
                const int64_t nf = M - m0 < step ? M - m0 : step;
                for (int r = 0; r < nr; r++) {
                    float *y_r = y + (r0 + r) * ldy + m0;
                    if (nf == step) {
                        for (int c = 0; c < SK_NV; c++) vstore(y_r + c * FA_VL, acc[r][c]);
                    } else {
                        for (int64_t f = 0; f < nf; f++) y_r[f] = acc[r][f / FA_VL][f % FA_VL];
                    }
                }
            }
        }
    }
}
