/* layernorm_body.h -- rows [r0, r1) of layer norm with fused residual add, per ISA.
 *   scalar math, per row n:  s = x + residual;  mean = sum(s)/C;  var = sum((s-mean)^2)/C;
 *                            y = (s - mean) * rstd * weight + bias,  rstd = 1/sqrt(var + eps)
 * The moments come from one pass over s with sums shifted by s[0] (exact for a constant row,
 * no cancellation for a large mean), in per-lane float partial sums combined in double. */
static void FA_CAT(layer_norm_rows_, FA_SFX)(float *y, float *sum_out, float *mean, float *rstd,
                                             const float *x, const float *residual,
                                             const float *weight, const float *bias,
                                             int64_t r0, int64_t r1, int64_t C, float eps)
{
    const int64_t Cv = C - C % FA_VL;
    for (int64_t n = r0; n < r1; n++) {
        const float *x_n = x + n * C, *r_n = residual ? residual + n * C : NULL;
        float *s_n = sum_out ? sum_out + n * C : y + n * C; /* s lives where it is kept */
        float *y_n = y + n * C;
        const float shift = r_n ? x_n[0] + r_n[0] : x_n[0];
        VF a1 = vsplat(0.0f), a2 = vsplat(0.0f);
        int64_t c = 0;
        for (; c < Cv; c += FA_VL) {
            VF s = vload(x_n + c);
            if (r_n) s += vload(r_n + c);
            vstore(s_n + c, s);
            VF t = s - vsplat(shift);
            a1 += t;
            a2 += t * t;
        }
        double s1 = hsum(a1), s2 = hsum(a2);
        for (; c < C; c++) {
            const float s = r_n ? x_n[c] + r_n[c] : x_n[c];
            s_n[c] = s;
            s1 += (double)(s - shift);
            s2 += (double)(s - shift) * (double)(s - shift);
        }
        const double m1 = s1 / (double)C;
        double var = s2 / (double)C - m1 * m1;
        if (var < 0.0) var = 0.0;
        const float m1f = (float)m1; /* mean - shift: normalise as (s - shift) - m1, which
                                        keeps the digits a rounded float mean would lose */
        const float rs = (float)(1.0 / sqrt(var + (double)eps));
        if (mean) mean[n] = (float)((double)shift + m1);
        if (rstd) rstd[n] = rs;
        c = 0;
        for (; c < Cv; c += FA_VL) {
            VF t = (vload(s_n + c) - vsplat(shift) - vsplat(m1f)) * vsplat(rs);
            if (weight) t *= vload(weight + c);
            if (bias) t += vload(bias + c);
            vstore(y_n + c, t);
        }
        for (; c < C; c++) {
            float t = (s_n[c] - shift - m1f) * rs;
            if (weight) t *= weight[c];
            if (bias) t += bias[c];
            y_n[c] = t;
        }
    }
}
