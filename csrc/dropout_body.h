/* dropout_body.h -- rows [r0, r1) of dropout over the last axis, per ISA.
 *   scalar math, per element:  y[n][c] = x[n][c] * (fa_rng_keep(key_n, c, threshold) ? scale : 0)
 *                              key_n = fa_rng_row_key(seed, n)
 * A multiply, not a select: a dropped NaN or inf gives NaN, as torch's x * mask * scale does. */
static void dropout_rows(float *y, const float *x, int64_t r0, int64_t r1,
                         int64_t C, const fa_dropout_t *drop)
{
    const int64_t Cv = C - C % FA_VL;
    for (int64_t n = r0; n < r1; n++) {
        const float *x_n = x + n * C;
        float *y_n = y + n * C;
        const uint32_t key = fa_rng_row_key(drop->seed, (uint64_t)n);
        int64_t c = 0;
        for (; c < Cv; c += FA_VL)
            vstore(y_n + c, vload(x_n + c) * vdrop_factor(key, (uint32_t)c, drop->threshold,
                                                          drop->scale));
        for (; c < C; c++)
            y_n[c] = x_n[c] * (fa_rng_keep(key, (uint32_t)c, drop->threshold) ? drop->scale
                                                                               : 0.0f);
    }
}
