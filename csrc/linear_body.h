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
