/* layernorm_body.h -- rows [r0, r1) of layer norm with fused residual add, per ISA.
 *   scalar math, per row n:  s = x + residual;  mean = sum(s)/C;  var = sum((s-mean)^2)/C;
 *                            y = (s - mean) * rstd * weight + bias,  rstd = 1/sqrt(var + eps)
 * The moments come from one pass over s with sums shifted by s[0] (exact for a constant row,
 * no cancellation for a large mean), in per-lane float partial sums combined in double. A row
 * whose float sums overflow (inf or NaN: |s| past ~1e19, or inf / NaN in s), or whose squares
 * may have sunk into denormals when eps is as tiny (below 2^-100), is redone by ln_row_wide in
 * double; every other row takes the one float pass. */
static void layer_norm_rows(float *y, float *sum_out, float *mean, float *rstd, const float *x,
                            const float *residual, const float *weight, const float *bias,
                            int64_t r0, int64_t r1, int64_t C, float eps)
{
    const int64_t Cv = C - C % FA_VL;
    const int tiny_eps = eps < 0x1p-100f;
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
        if (!(s2 < INFINITY && fabs(s1) < INFINITY) ||   /* overflow, inf or NaN */
            (tiny_eps && s2 < (double)C * 0x1p-100)) {
            ln_row_wide(y_n, mean ? mean + n : NULL, rstd ? rstd + n : NULL, s_n, weight, bias,
                        C, eps);
            continue;
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

/* Backward, rows [r0, r1): dx, and this block's parameter partials.
 *   scalar math, per row n:  s = x + residual;  xhat = (s - mean) * rstd;  g = dy * weight;
 *                            dx = rstd * (g - sum(g)/C - xhat * sum(g * xhat)/C)
 *                            dw_part += dy * xhat;  db_part += dy
 * Pass one over the row: the two row sums (per-lane float partials combined in double, as in
 * the forward) and the parameter partials; pass two, from cache: dx. A row with rstd below
 * LN_WIDE_RSTD (or NaN) goes to ln_bwd_row_wide, in double.
 *   dx       (N, C)  out, may be NULL; rows [r0, r1) written
 *   dw_part  (C)     out, NULL iff db_part is; this block's sum over its rows of dy * xhat
 *   db_part  (C)     out; this block's sum over its rows of dy
 * Inlined with constant flags (residual, weight, partials), so the vector loops carry no
 * branches. */
FA_INLINE void ln_bwd_rows(float *dx, float *dw_part, float *db_part, const float *dy,
                           const float *mean, const float *rstd, const float *x,
                           const float *residual, const float *weight, int64_t r0, int64_t r1,
                           int64_t C, const int has_res, const int has_w, const int parts)
{
    const int64_t Cv = C - C % FA_VL;
    for (int64_t n = r0; n < r1; n++) {
        const float *x_n = x + n * C, *dy_n = dy + n * C;
        const float *r_n = has_res ? residual + n * C : NULL;
        const float mu = mean[n], rs = rstd[n];
        if (!(rs >= LN_WIDE_RSTD)) {
            ln_bwd_row_wide(dx ? dx + n * C : NULL, parts ? dw_part : NULL,
                            parts ? db_part : NULL, dy_n, mu, rs, x_n, r_n,
                            has_w ? weight : NULL, C);
            continue;
        }
        VF a1 = vsplat(0.0f), a2 = vsplat(0.0f);
        int64_t c = 0;
        for (; c < Cv; c += FA_VL) {
            VF s = vload(x_n + c);
            if (has_res) s += vload(r_n + c);
            const VF xh = (s - vsplat(mu)) * vsplat(rs), d = vload(dy_n + c);
            if (parts) {
                vstore(db_part + c, vload(db_part + c) + d);
                vstore(dw_part + c, vload(dw_part + c) + d * xh);
            }
            VF g = d;
            if (has_w) g *= vload(weight + c);
            a1 += g;
            a2 += g * xh;
        }
        double s1 = hsum(a1), s2 = hsum(a2);
        for (; c < C; c++) {
            const float s = has_res ? x_n[c] + r_n[c] : x_n[c];
            const float xh = (s - mu) * rs, d = dy_n[c];
            if (parts) {
                db_part[c] += d;
                dw_part[c] += d * xh;
            }
            const float g = has_w ? d * weight[c] : d;
            s1 += (double)g;
            s2 += (double)(g * xh);
        }
        if (!dx) continue;
        const float m1 = (float)(s1 / (double)C), m2 = (float)(s2 / (double)C);
        float *dx_n = dx + n * C;
        for (c = 0; c < Cv; c += FA_VL) {
            VF s = vload(x_n + c);
            if (has_res) s += vload(r_n + c);
            const VF xh = (s - vsplat(mu)) * vsplat(rs), d = vload(dy_n + c);
            VF g = d;
            if (has_w) g *= vload(weight + c);
            vstore(dx_n + c, (g - vsplat(m1) - xh * vsplat(m2)) * vsplat(rs));
        }
        for (; c < C; c++) {
            const float s = has_res ? x_n[c] + r_n[c] : x_n[c];
            const float xh = (s - mu) * rs, d = dy_n[c];
            const float g = has_w ? d * weight[c] : d;
            dx_n[c] = (g - m1 - xh * m2) * rs;
        }
    }
}

static void layer_norm_backward_rows(float *dx, float *dw_part, float *db_part, const float *dy,
                                     const float *mean, const float *rstd, const float *x,
                                     const float *residual, const float *weight, int64_t r0,
                                     int64_t r1, int64_t C)
{
    const int parts = db_part != NULL;
    if (parts)
        for (int64_t c = 0; c < C; c++) dw_part[c] = db_part[c] = 0.0f;
    /* one instance per (residual, weight, partials) combination */
#define LN_BWD(R, W, P) ln_bwd_rows(dx, dw_part, db_part, dy, mean, rstd, x, \
                                                      residual, weight, r0, r1, C, R, W, P)
    switch ((residual != NULL) * 4 + (weight != NULL) * 2 + parts) {
    case 0: LN_BWD(0, 0, 0); break;
    case 1: LN_BWD(0, 0, 1); break;
    case 2: LN_BWD(0, 1, 0); break;
    case 3: LN_BWD(0, 1, 1); break;
    case 4: LN_BWD(1, 0, 0); break;
    case 5: LN_BWD(1, 0, 1); break;
    case 6: LN_BWD(1, 1, 0); break;
    default: LN_BWD(1, 1, 1); break;
    }
#undef LN_BWD
}
