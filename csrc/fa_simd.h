/* fa_simd.h -- tiny vector helpers for the kernel bodies, included once by each per-ISA
 * translation unit (fa_kernels_isa.h), after fa_tiles.h has given FA_VL, the floats per vector
 * (4 | 8 | 16), of its level; the unit's target pragma compiles every helper here for that ISA.
 * Vectors are GCC vector extensions: one source, three instruction sets.
 */
#ifndef FA_SIMD_H
#define FA_SIMD_H

/* FA_VL lanes of float, int32 and uint32 (bit arithmetic that may wrap: no signed UB), any
 * alignment (unaligned loads allowed) */
typedef float VF __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef int32_t VI __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef uint32_t VU __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef float float4_t __attribute__((vector_size(16)));

#define vload(p) (*(const VF *)(p))
#define vstore(p, x) (*(VF *)(p) = (x))
/* A register tile's store: rows 0..nr-1 of acc (nv vectors each) to y (row stride ldy), whole
 * vectors when the tile is full (nf == nv * FA_VL), else the first nf floats of each row. */
#define vstore_tile(y, ldy, acc, nr, nv, nf)                                                   \
    do {                                                                                       \
        for (int r_ = 0; r_ < (nr); r_++) {                                                    \
            float *y_r_ = (y) + r_ * (ldy);                                                    \
            if ((nf) == (nv) * FA_VL) {                                                        \
                for (int c_ = 0; c_ < (nv); c_++) vstore(y_r_ + c_ * FA_VL, (acc)[r_][c_]);    \
            } else {                                                                           \
                for (int64_t f_ = 0; f_ < (nf); f_++)                                          \
                    y_r_[f_] = (acc)[r_][f_ / FA_VL][f_ % FA_VL];                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)
/* c + a * b rounded once (a fused multiply-add) where the level has FMA, else a multiply then
 * an add: the float32 GEMM's one summation step (gemm_body.h) */
#if FA_VL == 16
#define vfma(a, b, c) ((VF)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif FA_VL == 8
#define vfma(a, b, c) ((VF)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define vfma(a, b, c) ((c) + (a) * (b))
#endif
/* broadcast: x + (-0.0) == x exactly, so the add folds away (x + 0.0 would not, for x = -0) */
#define vsplat(s) (-(VF){0} + (float)(s))

/* a > b ? a : b lane-wise (b where either is NaN, and for +-0 against +-0): exactly what
 * maxps does with its operands in this order, so one instruction where the level has it */
#if FA_VL == 16
FA_INLINE VF vmax(VF a, VF b) { return (VF)_mm512_max_ps((__m512)a, (__m512)b); }
#elif FA_VL == 8
FA_INLINE VF vmax(VF a, VF b) { return (VF)_mm256_max_ps((__m256)a, (__m256)b); }
#elif defined(__SSE__)
FA_INLINE VF vmax(VF a, VF b) { return (VF)_mm_max_ps((__m128)a, (__m128)b); }
#else
FA_INLINE VF vmax(VF a, VF b) { return (VF)(((VI)(a > b) & (VI)a) | (~(VI)(a > b) & (VI)b)); }
#endif

/* Horizontal reductions in a fixed order (deterministic): hsum folds halves, a tree. */
FA_INLINE float hsum(VF a)
{
#if FA_VL == 4
    return (a[0] + a[2]) + (a[1] + a[3]);
#else
#if FA_VL == 16
    const __typeof__(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)) h8 =
        __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
        __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const float4_t h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) +
                        __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
#else
    const float4_t h4 = __builtin_shufflevector(a, a, 0, 1, 2, 3) +
                        __builtin_shufflevector(a, a, 4, 5, 6, 7);
#endif
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
#endif
}
FA_INLINE float hmax(VF a)
{
    float m = a[0];
    for (int i = 1; i < FA_VL; i++) m = a[i] > m ? a[i] : m;
    return m;
}

/* 2^f for |f| <= 1/2: a degree-6 polynomial (rel. err ~1e-7), shared by vexp2 and the
 * attention kernels' cheaper exponent (att_exp2) so both give the same bits. */
FA_INLINE VF vexp2_poly(VF f)
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

/* 2^x for x <= ~128: x = n + f, |f| <= 1/2, 2^f by a degree-6 polynomial (rel. err ~1e-7),
 * 2^n by exponent-field arithmetic. x < -126 gives exactly 0 (so -inf -> 0, as the masks need);
 * NaN in gives NaN out. x is clamped to [-127, 127] (NaN lanes to 0) before the conversion to
 * int, so n stays in [-127, 127] and the exponent arithmetic, done unsigned, is defined C. */
FA_INLINE VF vexp2(VF x)
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

/* e^x via 2^(x*log2 e). */
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
FA_INLINE VF vexp(VF x) { return vexp2(x * vsplat(FA_LOG2E)); }

#endif /* FA_SIMD_H */
