/* linear_body.h -- the GEMM epilogues, per ISA: y = drop(act(y + bias)) on a block of rows
 * (forward) and dz = g * drop' * act'(pre) (backward); the products are the GEMM engine's
 * (gemm_body.h).
 *   scalar math:  relu(t) = max(t, 0);  gelu(t) = t * Phi(t) = t * (1 - erfc(t / sqrt 2) / 2)
 *                 relu'(t) = [t > 0];   gelu'(t) = Phi(t) + t phi(t)
 *                 phi(t) = exp(-t^2 / 2) / sqrt(2 pi)
 *                 gelu_tanh(t) = t (1 + th) / 2,  th = tanh(k0 (t + k1 t^3)),
 *                   k0 = sqrt(2 / pi), k1 = 0.044715
 *                 gelu_tanh'(t) = (1 + th) / 2 + t (1 - th^2) k0 (1 + 3 k1 t^2) / 2
 *                 silu(t) = t s,  s = sigmoid(t) = 1 / (1 + e^-t)
 *                 silu'(t) = s (1 + t (1 - s))
 * erfc uses the Chebyshev-fitted form erfc(z) = u exp(-z^2 + P(u)), u = 1 / (1 + z/2), z >= 0
 * (fractional error < 1.2e-7 for all z), so gelu is accurate in both tails without cancellation. */

/* 1 - Phi(|t|) = erfc(z) / 2, z = |t| / sqrt 2 (given) */
FA_INLINE VF vhalf_erfc(VF z)
{
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
    return vsplat(0.5f) * u * vexp(p - z * z);
}

FA_INLINE VF vgelu(VF t)
{
    const VI neg = (VI)(t < vsplat(0.0f));
    const VI abs_mask = (VI)vsplat(0.0f) | 0x7fffffff;                 /* clears the sign bit */
    const VF z = (VF)((VI)t & abs_mask) * vsplat(0.70710678118654752f); /* |t| / sqrt 2 */
    const VF half_erfc = vhalf_erfc(z);      /* = 1 - Phi(|t|) */
    const VF pos = t * (vsplat(1.0f) - half_erfc);             /* t >= 0: t Phi(t); inf -> inf */
    const VI zero = (VI)(half_erfc == vsplat(0.0f));           /* far left tail, -inf: 0 */
    const VF negv = (VF)(~zero & (VI)(t * half_erfc));         /* t < 0:  t (1 - Phi(|t|)) */
    return (VF)((neg & (VI)negv) | (~neg & (VI)pos));
}

/* 1 + tanh(u), u = k0 (t + k1 t^3), without cancellation on either side: with
 * q = 2 / (1 + e^(2|u|)) in (0, 1], 1 + tanh(u) = q for u < 0 and 2 - q for u >= 0
 * (e^(2|u|) saturates at 2^127: q ~ 1e-38 or 0, never inf / inf). NaN stays NaN. */
FA_INLINE VF vgelu_tanh_a(VF t)
{
    const VF u = vsplat(0.7978845608028654f) * t * (vsplat(1.0f) + vsplat(0.044715f) * t * t);
    const VI neg = (VI)(u < vsplat(0.0f));
    const VF au = (VF)((VI)u & ((VI)vsplat(0.0f) | 0x7fffffff));       /* |u| */
    const VF q = vsplat(2.0f) / (vsplat(1.0f) + vexp(vsplat(2.0f) * au));
    return (VF)((neg & (VI)q) | (~neg & (VI)(vsplat(2.0f) - q)));
}

/* gelu_tanh(t) = t (1 + tanh(u)) / 2; -inf gives 0 (the limit; -inf * 0 would be NaN) */
FA_INLINE VF vgelu_tanh(VF t)
{
    const VF y = vsplat(0.5f) * t * vgelu_tanh_a(t);
    return (VF)(~(VI)(t == vsplat(-INFINITY)) & (VI)y);
}

/* gelu_tanh'(t) = A / 2 + t A (2 - A) k0 (1 + 3 k1 t^2) / 2, A = 1 + tanh(u) (so
 * 1 - tanh(u)^2 = A (2 - A), accurate in both tails); |t| > 20 gives its limits 0 / 1 (no
 * inf * 0); NaN stays NaN */
FA_INLINE VF vgelu_tanh_grad(VF t)
{
    const VF A = vgelu_tanh_a(t);
    const VF d = vsplat(0.5f) * A + vsplat(0.5f) * t * A * (vsplat(2.0f) - A) *
                                        vsplat(0.7978845608028654f) *
                                        (vsplat(1.0f) + vsplat(3.0f * 0.044715f) * t * t);
    const VI big = (VI)(t > vsplat(20.0f)) | (VI)(t < vsplat(-20.0f));
    const VF lim = (VF)((VI)(t > vsplat(0.0f)) & (VI)vsplat(1.0f));
    return (VF)((big & (VI)lim) | (~big & (VI)d));
}

/* sigmoid(t) and 1 - sigmoid(t) without cancellation: with e = e^-|t| in (0, 1],
 * s = 1 / (1 + e) for t >= 0 and e / (1 + e) below; 1 - s the other one. NaN stays NaN. */
FA_INLINE void vsigmoid2(VF t, VF *s, VF *one_minus_s)
{
    const VF e = vexp(-(VF)((VI)t & ((VI)vsplat(0.0f) | 0x7fffffff)));
    const VF inv = vsplat(1.0f) / (vsplat(1.0f) + e), einv = e * inv;
    const VI neg = (VI)(t < vsplat(0.0f));
    *s = (VF)((neg & (VI)einv) | (~neg & (VI)inv));
    *one_minus_s = (VF)((neg & (VI)inv) | (~neg & (VI)einv));
}

/* silu(t) = t sigmoid(t); -inf gives 0 (the limit; -inf * 0 would be NaN) */
FA_INLINE VF vsilu(VF t)
{
    VF s, c;
    vsigmoid2(t, &s, &c);
    return (VF)(~(VI)(t == vsplat(-INFINITY)) & (VI)(t * s));
}

/* silu'(t) = s (1 + t (1 - s)); |t| > 40 gives its limits 0 / 1 (no inf * 0); NaN stays NaN */
FA_INLINE VF vsilu_grad(VF t)
{
    VF s, c;
    vsigmoid2(t, &s, &c);
    const VF d = s * (vsplat(1.0f) + t * c);
    const VI big = (VI)(t > vsplat(40.0f)) | (VI)(t < vsplat(-40.0f));
    const VF lim = (VF)((VI)(t > vsplat(0.0f)) & (VI)vsplat(1.0f));
    return (VF)((big & (VI)lim) | (~big & (VI)d));
}

FA_INLINE VF vact(VF t, int act)
{
    if (act == FA_ACT_RELU) return (VF)(~(VI)(t < vsplat(0.0f)) & (VI)t); /* NaN stays NaN */
    if (act == FA_ACT_GELU) return vgelu(t);
    if (act == FA_ACT_GELU_TANH) return vgelu_tanh(t);
    if (act == FA_ACT_SILU) return vsilu(t);
    return t;
}

/* gelu'(t) = Phi(t) + t phi(t); the t phi(t) term is 0 where exp(-t^2/2) underflows (|t| > ~13,
 * and +-inf, where it would be inf * 0). NaN stays NaN. */
FA_INLINE VF vgelu_grad(VF t)
{
    const VI neg = (VI)(t < vsplat(0.0f));
    const VI abs_mask = (VI)vsplat(0.0f) | 0x7fffffff;
    const VF z = (VF)((VI)t & abs_mask) * vsplat(0.70710678118654752f); /* |t| / sqrt 2 */
    const VF half_erfc = vhalf_erfc(z);                /* 1 - Phi(|t|) */
    const VF phi_t = (vsplat(1.0f) - half_erfc);                        /* Phi(|t|) */
    const VF cdf = (VF)((neg & (VI)half_erfc) | (~neg & (VI)phi_t));    /* Phi(t) */
    const VF e = vexp(-(z * z));                                        /* exp(-t^2 / 2) */
    const VI gone = (VI)(e == vsplat(0.0f));
    const VF tpdf = (VF)(~gone & (VI)(t * e * vsplat(0.3989422804014327f)));
    return cdf + tpdf;
}

/* Forward epilogue on a block of rows (row stride ld):
 *   pre == NULL:  y = drop(act(y + bias))                (the GEMM wrote y)
 *   pre != NULL:  pre += bias;  y = drop(act(pre))       (the GEMM wrote pre)
 * bias may be NULL; drop may be NULL (none). Rows and columns of the block are rows row0 + r
 * and columns col0 + c of the whole (N, M) activation: the dropout mask's coordinates. */
static void bias_act_rows(float *y, float *pre, const float *bias, int64_t rows, int64_t M,
                          int64_t ld, int act, int64_t row0, int64_t col0, const fa_dropout_t *drop)
{
    const int dr = drop && drop->on;
    if (!bias && act == FA_ACT_NONE && !pre && !dr) return;
    const int64_t Mv = M - M % FA_VL;
    for (int64_t r = 0; r < rows; r++) {
        float *y_r = y + r * ld, *p_r = pre ? pre + r * ld : NULL;
        const float *z_r = pre ? p_r : y_r;
        const uint32_t key = dr ? fa_rng_row_key(drop->seed, (uint64_t)(row0 + r)) : 0u;
        int64_t c = 0;
        for (; c < Mv; c += FA_VL) {
            VF t = vload(z_r + c);
            if (bias) t += vload(bias + c);
            if (p_r) vstore(p_r + c, t);
            VF a = vact(t, act);
            if (dr) a *= vdrop_factor(key, (uint32_t)(col0 + c), drop->threshold, drop->scale);
            vstore(y_r + c, a);
        }
        for (; c < M; c++) {
            const float t = z_r[c] + (bias ? bias[c] : 0.0f);
            if (p_r) p_r[c] = t;
            float a = vact(vsplat(t), act)[0];
            if (dr) a *= fa_rng_keep(key, (uint32_t)(col0 + c), drop->threshold) ? drop->scale
                                                                                 : 0.0f;
            y_r[c] = a;
        }
    }
}

/* Backward epilogue on a block of rows (row stride ld), m = drop's factor (scale or 0; 1
 * without dropout):
 *   dz = g * m * act'(pre)    (relu: a select, dz = g * m where pre > 0, else 0)
 *   h  = act(pre) * m         (if h != NULL: the forward's hidden recomputed, bit for bit)
 * dz may alias g or pre; h may alias g (each element is read before it is written). */
static void grad_act_rows(float *dz, float *h, const float *g, const float *pre,
                          int64_t rows, int64_t M, int64_t ld, int act,
                          int64_t row0, int64_t col0, const fa_dropout_t *drop)
{
    const int dr = drop && drop->on;
    const int64_t Mv = M - M % FA_VL;
    for (int64_t r = 0; r < rows; r++) {
        float *dz_r = dz + r * ld, *h_r = h ? h + r * ld : NULL;
        const float *g_r = g + r * ld, *p_r = pre + r * ld;
        const uint32_t key = dr ? fa_rng_row_key(drop->seed, (uint64_t)(row0 + r)) : 0u;
        for (int64_t c = 0; c < M; c += FA_VL) {
            /* scalar math (the tail: one lane of a vector built from single elements)
             *   d = g * m;  dz = act == relu ? (p > 0 ? d : 0) : act ? d * act'(p) : d */
            const int64_t nl = c < Mv ? FA_VL : M - c;
            VF gv, pv, mv = vsplat(1.0f);
            if (nl == FA_VL) {
                gv = vload(g_r + c);
                pv = vload(p_r + c);
            } else {
                gv = pv = vsplat(0.0f);
                for (int64_t i = 0; i < nl; i++) {
                    gv[i] = g_r[c + i];
                    pv[i] = p_r[c + i];
                }
            }
            if (dr) mv = vdrop_factor(key, (uint32_t)(col0 + c), drop->threshold, drop->scale);
            VF a = vsplat(0.0f);
            if (h_r) {
                a = vact(pv, act);
                if (dr) a *= mv;
            }
            VF d = gv;
            if (dr) d *= mv;
            if (act == FA_ACT_RELU)
                d = (VF)((VI)(pv > vsplat(0.0f)) & (VI)d);
            else if (act == FA_ACT_GELU)
                d *= vgelu_grad(pv);
            else if (act == FA_ACT_GELU_TANH)
                d *= vgelu_tanh_grad(pv);
            else if (act == FA_ACT_SILU)
                d *= vsilu_grad(pv);
            if (nl == FA_VL) {
                vstore(dz_r + c, d);
                if (h_r) vstore(h_r + c, a);
            } else {
                for (int64_t i = 0; i < nl; i++) {
                    dz_r[c + i] = d[i];
                    if (h_r) h_r[c + i] = a[i];
                }
            }
        }
    }
}

