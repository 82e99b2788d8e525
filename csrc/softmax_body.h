/* softmax_body.h -- rows [r0, r1) of softmax over the last axis, per ISA.
 *   scalar math, per row:  m = max_c x_c;  y_c = exp(x_c - m) / sum_c exp(x_c - m)
 * Read pass: a running max and a rescaled running sum per vector lane, updated once per chunk
 * of SM_CHUNK vectors (one rescale exp per chunk, one exp per element). Write pass: y. */
static void softmax_rows(float *y, const float *x, int64_t r0, int64_t r1, int64_t C)
{
    const int64_t step = SM_CHUNK * FA_VL, Cc = C - C % step;
    for (int64_t n = r0; n < r1; n++) {
        const float *x_n = x + n * C;
        float *y_n = y + n * C;
        VF m = vsplat(-INFINITY), s = vsplat(0.0f);
        for (int64_t c = 0; c < Cc; c += step) {
            VF cm = vload(x_n + c);
            for (int u = 1; u < SM_CHUNK; u++) cm = vmax(cm, vload(x_n + c + u * FA_VL));
            VF mn = vmax(m, cm);
            VF ref = (VF)(~(VI)(mn == vsplat(-INFINITY)) & (VI)mn); /* -inf lane: use 0 */
            VF acc = s * vexp(m - ref);
            for (int u = 0; u < SM_CHUNK; u++) acc += vexp(vload(x_n + c + u * FA_VL) - ref);
            s = acc;
            m = mn;
        }
        /* combine lanes, then the tail, in a fixed order */
        float mr = hmax(m);
        for (int64_t c = Cc; c < C; c++) mr = x_n[c] > mr ? x_n[c] : mr;
        const float ref = mr == -INFINITY ? 0.0f : mr;
        float sum = hsum(s * vexp(m - vsplat(ref)));
        for (int64_t c = Cc; c < C; c++) sum += vexp(vsplat(x_n[c] - ref))[0];
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        int64_t c = 0;
        for (; c + FA_VL <= C; c += FA_VL)
            vstore(y_n + c, vexp(vload(x_n + c) - vsplat(ref)) * vsplat(inv));
        for (; c < C; c++) y_n[c] = vexp(vsplat(x_n[c] - ref))[0] * inv;
    }
}
