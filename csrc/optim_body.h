/* optim_body.h -- the optimiser's elementwise spans, per ISA. */

/* sqrt per lane (GCC turns the lane loop into one vsqrtps/sqrtps) */
FA_INLINE VF vsqrt(VF a)
{
    VF r;
    for (int l = 0; l < FA_VL; l++) r[l] = __builtin_sqrtf(a[l]);
    return r;
}

/* One element of the Adam update, in torch's order (torch.optim.Adam, single-tensor path;
 * its lerp takes the second form when the weight is >= 0.5):
 *   p *= decay;  g += l2 * p
 *   m = w1 < 0.5 ? m + w1 * (g - m) : g - (g - m) * (1 - w1)
 *   v = v * beta2 + w2 * g * g
 *   p = p + neg_step * (m / (sqrt(v) / bc2_sqrt + eps))
 * The vector loop below is this, FA_VL lanes at a time; the tail is this, one at a time. */
#define ADAM_ELEMENT(SPLAT, SQRT, small, p, m, v, g, k)                                      \
    do {                                                                                     \
        p = p * SPLAT((k)->decay);                                                           \
        g = g + SPLAT((k)->l2) * p;                                                          \
        m = (small) ? m + SPLAT((k)->w1) * (g - m) : g - (g - m) * SPLAT(1.0f - (k)->w1);    \
        v = v * SPLAT((k)->beta2) + SPLAT((k)->w2) * g * g;                                  \
        p = p + SPLAT((k)->neg_step) * (m / (SQRT(v) / SPLAT((k)->bc2_sqrt) + SPLAT((k)->eps))); \
    } while (0)
#define adam_ident(x) (x)

static void adam_span(float *FA_RESTRICT param, float *FA_RESTRICT exp_avg,
                      float *FA_RESTRICT exp_avg_sq, const float *FA_RESTRICT grad, int64_t i0,
                      int64_t i1, const adam_consts *k)
{
    const int small = k->w1 < 0.5f;
    int64_t i = i0;
    for (; i + FA_VL <= i1; i += FA_VL) {
        VF p = vload(param + i), m = vload(exp_avg + i), v = vload(exp_avg_sq + i);
        VF g = vload(grad + i);
        ADAM_ELEMENT(vsplat, vsqrt, small, p, m, v, g, k);
        vstore(param + i, p);
        vstore(exp_avg + i, m);
        vstore(exp_avg_sq + i, v);
    }
    for (; i < i1; i++) {
        float p = param[i], m = exp_avg[i], v = exp_avg_sq[i], g = grad[i];
        ADAM_ELEMENT(adam_ident, __builtin_sqrtf, small, p, m, v, g, k);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/* sum_i x_i^2 over one block, in double: FA_VL double lanes (two accumulators), combined in
 * lane order.  scalar math: s = 0; for i: s += (double)x_i * x_i */
#define VD vd
typedef double VD __attribute__((vector_size(FA_VL * 8)));
static double sum_squares(const float *x, int64_t n)
{
    VD a0 = (VD){0}, a1 = (VD){0};
    int64_t i = 0;
    for (; i + 2 * FA_VL <= n; i += 2 * FA_VL) {
        VD d0 = __builtin_convertvector(vload(x + i), VD);
        VD d1 = __builtin_convertvector(vload(x + i + FA_VL), VD);
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    a0 += a1;
    double s = 0.0;
    for (int l = 0; l < FA_VL; l++) s += a0[l];
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}
#undef VD

/* x *= s.  scalar math: for i: x_i = x_i * s */
static void scale_span(float *x, int64_t n, float s)
{
    int64_t i = 0;
    for (; i + FA_VL <= n; i += FA_VL) vstore(x + i, vload(x + i) * vsplat(s));
    for (; i < n; i++) x[i] *= s;
}
