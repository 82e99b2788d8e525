/* fa_simd.h -- tiny vector helpers, included by a *_body.h under one ISA at a time.
 *
 * Before including, the instantiating .c file defines
 *   FA_SFX  name suffix (generic | v3 | v4)    FA_VL  floats per vector (4 | 8 | 16)
 * and wraps the include in `#pragma GCC target(...)`, so every helper here is compiled for that
 * ISA. Vectors are GCC vector extensions: one source, three instruction sets.
 */
#define VF FA_CAT(vf_, FA_SFX)    /* FA_VL floats, unaligned loads allowed */
#define VI FA_CAT(vi_, FA_SFX)    /* FA_VL int32 */
#define VU FA_CAT(vu_, FA_SFX)    /* FA_VL uint32: bit arithmetic that may wrap (no signed UB) */
typedef float VF __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef int32_t VI __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef uint32_t VU __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));

#define vload(p) (*(const VF *)(p))
#define vstore(p, x) (*(VF *)(p) = (x))
/* broadcast: x + (-0.0) == x exactly, so the add folds away (x + 0.0 would not, for x = -0) */
#define vsplat(s) (-(VF){0} + (float)(s))

FA_INLINE VF FA_CAT(vmax_, FA_SFX)(VF a, VF b) { return (VF)(((VI)(a > b) & (VI)a) | (~(VI)(a > b) & (VI)b)); }
#define vmax FA_CAT(vmax_, FA_SFX)

/* Horizontal reductions in a fixed order (deterministic): hsum folds halves, a tree. */
#if FA_VL == 16
#define FA_FOLD(a) (__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + \
                    __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15))
#define FA_HSUM_BODY(a) { __typeof__(FA_FOLD(a)) h8 = FA_FOLD(a); \
    float4_t h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + \
                  __builtin_shufflevector(h8, h8, 4, 5, 6, 7); \
    return (h4[0] + h4[2]) + (h4[1] + h4[3]); }
#elif FA_VL == 8
#define FA_HSUM_BODY(a) { float4_t h4 = __builtin_shufflevector(a, a, 0, 1, 2, 3) + \
                                       __builtin_shufflevector(a, a, 4, 5, 6, 7); \
    return (h4[0] + h4[2]) + (h4[1] + h4[3]); }
#else
#define FA_HSUM_BODY(a) { return (a[0] + a[2]) + (a[1] + a[3]); }
#endif
#ifndef FA_FLOAT4_T
#define FA_FLOAT4_T
typedef float float4_t __attribute__((vector_size(16)));
#endif
FA_INLINE float FA_CAT(hsum_, FA_SFX)(VF a) FA_HSUM_BODY(a)
#undef FA_HSUM_BODY
#undef FA_FOLD
#define hsum FA_CAT(hsum_, FA_SFX)
FA_INLINE float FA_CAT(hmax_, FA_SFX)(VF a)
{
    float m = a[0];
    for (int i = 1; i < FA_VL; i++) m = a[i] > m ? a[i] : m;
    return m;
}
#define hmax FA_CAT(hmax_, FA_SFX)

/* 2^f for |f| <= 1/2: a degree-6 polynomial (rel. err ~1e-7), shared by vexp2 and the
 * attention kernels' cheaper exponent (att_exp2) so both give the same bits. */
FA_INLINE VF FA_CAT(vexp2_poly_, FA_SFX)(VF f)
{
    VF p = vsplat(1.5353362e-4f);
    p = p * f + vsplat(1.3398874e-3f);
    p = p * f + vsplat(9.6181291e-3f);
    p = p * f + vsplat(5.5504109e-2f);
    p = p * f + vsplat(2.4022651e-1f);
    p = p * f + vsplat(6.9314718e-1f);
    p = p * f + vsplat(1.0f);
    return p;
}
#define vexp2_poly FA_CAT(vexp2_poly_, FA_SFX)

/* 2^x for x <= ~128: x = n + f, |f| <= 1/2, 2^f by a degree-6 polynomial (rel. err ~1e-7),
 * 2^n by exponent-field arithmetic. x < -126 gives exactly 0 (so -inf -> 0, as the masks need);
 * NaN in gives NaN out. x is clamped to [-127, 127] (NaN lanes to 0) before the conversion to
 * int, so n stays in [-127, 127] and the exponent arithmetic, done unsigned, is defined C. */
FA_INLINE VF FA_CAT(vexp2_, FA_SFX)(VF x)
{
    const VF hi = vsplat(127.0f), lo = vsplat(-127.0f);
    const VI nan = (VI)(x != x);
    VF xc = (VF)(((VI)(x > hi) & (VI)hi) | (~(VI)(x > hi) & (VI)x));    /* clamp above */
    xc = (VF)((((VI)(xc < lo) & (VI)lo) | (~(VI)(xc < lo) & (VI)xc)) & ~nan); /* below; NaN: 0 */
    VF fn = xc + vsplat(12582912.0f) - vsplat(12582912.0f);              /* round to nearest */
    VF f = xc - fn;
    const VF p = vexp2_poly(f);
    VU n = (VU)__builtin_convertvector(fn, VI);                         /* in [-127, 127] */
    VI keep = ~(VI)(x < vsplat(-126.0f));
    VI bits = (VI)((VU)p + (n << 23)) & keep;
    return (VF)((bits & ~nan) | ((VI)x & nan));
}
#define vexp2 FA_CAT(vexp2_, FA_SFX)

/* e^x via 2^(x*log2 e). */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
FA_INLINE VF FA_CAT(vexp_, FA_SFX)(VF x) { return vexp2(x * vsplat(FA_LOG2E)); }
#define vexp FA_CAT(vexp_, FA_SFX)
