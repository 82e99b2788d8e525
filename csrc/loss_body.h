/* loss_body.h -- rows [r0, r1) of cross-entropy over the vocabulary, per ISA.
 *   scalar math, per row n with target t (not ignored), eps = label smoothing:
 *     m = max_v x_v;  s = sum_v exp(x_v - m);  lse = m + log(s)
 *     loss_n = (1 - eps) * (lse - x_t) + eps * (lse - mean_v x_v)     (eps term if eps > 0)
 *     d_v = scale * (exp(x_v - m) / s - eps / V - (1 - eps) * [v == t])
 *   an ignored row: loss 0, d = 0.
 * Read pass: as softmax_body.h (a running max and a rescaled running sum per vector lane,
 * updated once per chunk of SM_CHUNK vectors), plus the sum of x_v - x_0 (x_0 the row's first
 * logit, so that large logits of one sign do not cancel in float): per chunk in float lanes,
 * across chunks in double. Write pass (d != NULL): one exp per element while the row is in
 * cache; d may be the logits themselves (each element is read before it is written, x_t is
 * kept from the read pass). */
static void cross_entropy_rows(float *losses, float *dlogits, const float *logits,
                               const int64_t *targets, int64_t r0, int64_t r1, int64_t V,
                               int64_t ignore_index, float eps, float scale)
{
    const int64_t step = SM_CHUNK * FA_VL, Vc = V - V % step;
    const float off = (float)((double)eps * scale / (double)V);  /* scale * eps / V */
    const float hit = (float)((1.0 - (double)eps) * scale);       /* scale * (1 - eps) */
    for (int64_t n = r0; n < r1; n++) {
        const float *x_n = logits + n * V;
        float *d_n = dlogits ? dlogits + n * V : NULL;
        const int64_t t = targets[n];
        if (t == ignore_index) {
            losses[n] = 0.0f;
            if (d_n)
                for (int64_t v = 0; v < V; v++) d_n[v] = 0.0f;
            continue;
        }
        const float x_t = x_n[t];
        const float x0 = isfinite(x_n[0]) ? x_n[0] : 0.0f;
        VF m = vsplat(-INFINITY), s = vsplat(0.0f);
        double sx = 0.0;                                  /* sum_v (x_v - x0) */
        for (int64_t c = 0; c < Vc; c += step) {
            VF cm = vload(x_n + c), cs = vload(x_n + c) - vsplat(x0);
            for (int u = 1; u < SM_CHUNK; u++) {
                cm = vmax(cm, vload(x_n + c + u * FA_VL));
                cs += vload(x_n + c + u * FA_VL) - vsplat(x0);
            }
            VF mn = vmax(m, cm);
            VF ref = (VF)(~(VI)(mn == vsplat(-INFINITY)) & (VI)mn); /* -inf lane: use 0 */
            VF acc = s * vexp(m - ref);
            for (int u = 0; u < SM_CHUNK; u++) acc += vexp(vload(x_n + c + u * FA_VL) - ref);
            s = acc;
            m = mn;
            sx += (double)hsum(cs);
        }
        /* combine lanes, then the tail, in a fixed order */
        float mr = hmax(m);
        for (int64_t c = Vc; c < V; c++) mr = x_n[c] > mr ? x_n[c] : mr;
        const float ref = mr == -INFINITY ? 0.0f : mr;
        float sum = hsum(s * vexp(m - vsplat(ref)));
        for (int64_t c = Vc; c < V; c++) {
            sum += vexp(vsplat(x_n[c] - ref))[0];
            sx += (double)(x_n[c] - x0);
        }
        /* the loss in double: lse - x_t = (ref - x_t) + log(sum), lse - mean x likewise */
        const double lsum = log((double)sum);
        double loss = ((double)ref - (double)x_t) + lsum;
        if (eps > 0.0f) {
            const double smooth = ((double)ref - (double)x0) - sx / (double)V + lsum;
            loss = (1.0 - (double)eps) * loss + (double)eps * smooth;
        }
        losses[n] = (float)loss;
        if (!d_n) continue;
        /* scalar math: d_v = exp(x_v - ref) * (scale / sum) - off;  d_t -= hit */
        const VF inv = vsplat(scale / sum), voff = vsplat(off);
        int64_t c = 0;
        for (; c + FA_VL <= V; c += FA_VL)
            vstore(d_n + c, vexp(vload(x_n + c) - vsplat(ref)) * inv - voff);
        for (; c < V; c++) d_n[c] = vexp(vsplat(x_n[c] - ref))[0] * inv[0] - off;
        d_n[t] -= hit;
    }
}
