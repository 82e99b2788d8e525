/* quant_int8.h -- what the int8 paths (quant_generic.c, quant_avx2.c, quant_avx512.c and the
 * AMX units) share: the layout, the tile conventions and the panel loop. paths.c chooses the
 * path at import and calls its table (fa_q8_kernels); a unit of AVX-512 code defines Q8_AVX512
 * first for the AVX-512 epilogue.
 *
 * int8 layout (fa_int8_pack): panels of np features, K in pairs (the AMX path: quads),
 *   wp[p][kg][f][g] = q[p np + f][2 kg + g]  (zero past M and K)
 * and the quantised activations, one int16 row of Kp = K rounded up to 2 per row of x, meet
 * it as broadcast pairs against the weights sign-extended to int16: vpmaddwd + vpaddd, or
 * VNNI's vpdpwssd. Every path sums the same integers exactly: the results do not depend on
 * the path. The epilogue's activation comes from the ISA level's bias_act_rows (quant.c), so
 * a quantised product applies exactly the fp32 linear's gelu.
 */
#ifndef QUANT_INT8_H
#define QUANT_INT8_H

#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "fa_kernels.h"
#include "fa_tiles.h"

/* 32 bits from anywhere (memcpy: no alignment or aliasing assumption) */
FA_INLINE int32_t q8_load32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- int8 GEMM tiles ------------------------------------------------------------------------
 * One tile: rows r < mr of the quantised x (row stride ldx elements) against one panel, over
 * all of K, then the epilogue on the int32 sums (scalar math):
 *   y[r][f] = relu?(fl(fl(float(acc) * fl(sx[r] * scale[f])) + bias[f]))     for f < nf
 * The product is kept a float32 value (an empty asm: no fused multiply-add may absorb it). */

/* Row r of a tile in registers: a<r>_0 .. a<r>_<NV-1>, named (an array of vectors indexed
 * under `if (r < mr)` is not kept in registers by GCC). Q8_ROWS(X) expands X(r) per tile row;
 * a row r >= mr is dead code once the tile is inlined with a constant mr. */
#define Q8_ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
/* acc += ...: in place, by an asm statement. Written with intrinsics (acc = f(acc, ...)), GCC
 * 12 copies the 24 accumulators between registers and stores them to the stack on every
 * iteration; with the accumulator an in-out asm operand it keeps each one in its register.
 *   Q8_ADD512 / Q8_ADD256   acc += p   (int32 lanes, wrapping: vpaddd) */
#define Q8_ADD512(acc, p) __asm__("vpaddd %1, %0, %0" : "+v"(acc) : "v"(p))
#define Q8_ADD256(acc, p) __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(p))

#if defined(Q8_AVX512)
/* The AVX-512 epilogue of one vector of a tile row: 16 int32 sums -> y (mask: nf) */
FA_INLINE void q8_out512(float *y, __m512i a, __m512 s_r, __m512 sc, __m512 bi, __mmask16 mk,
                         int relu)
{
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(s_r, sc));
    __asm__("" : "+v"(t));                                  /* fl(acc * s), then + bias */
    t = _mm512_add_ps(t, bi);
    if (relu)
        t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LT_OQ),
                               _mm512_setzero_ps());
    _mm512_mask_storeu_ps(y, mk, t);
}

/* scale, bias and store masks of a 64-feature panel with nf features */
FA_INLINE void q8_cols512(__m512 *sc, __m512 *bi, __mmask16 *mk, const float *scale_p,
                          const float *bias_p, int64_t nf)
{
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const int64_t left = nf - 16 * j;
        mk[j] = left >= 16 ? (__mmask16)0xffff
              : left <= 0  ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        sc[j] = _mm512_maskz_loadu_ps(mk[j], scale_p + 16 * j);
        bi[j] = bias_p ? _mm512_maskz_loadu_ps(mk[j], bias_p + 16 * j) : _mm512_setzero_ps();
    }
}
#endif

/* ---- a panel: every tile of `rows` rows -----------------------------------------------------
 * One function per tile height (noinline: inlined into the panel loop, the tile's loop
 * invariants would be hoisted out of it and push the accumulators out of registers). */
#define Q8_TILE_ARGS float *y, int64_t ldy, const int16_t *xq, int64_t ldx, const int8_t *w_p,  \
                     const float *sx, const float *scale_p, const float *bias_p, int64_t Kg,    \
                     int64_t nf, int relu
#define Q8_TILE_AT(name, tile, MRV)                                                            \
    static __attribute__((noinline)) void name##_##MRV(Q8_TILE_ARGS)                            \
    {                                                                                           \
        tile(y, ldy, xq, ldx, w_p, sx, scale_p, bias_p, Kg, nf, MRV, relu);                    \
    }
#define Q8_PANEL_FN(name, tile, MR)                                                             \
    Q8_TILE_AT(name, tile, 1)                                                                   \
    Q8_TILE_AT(name, tile, 2)                                                                   \
    Q8_TILE_AT(name, tile, 3)                                                                   \
    Q8_TILE_AT(name, tile, 4)                                                                   \
    Q8_TILE_AT(name, tile, 5)                                                                   \
    Q8_TILE_AT(name, tile, 6)                                                                   \
    static void name(float *y, int64_t ldy, const int16_t *x, int64_t ldx, int64_t rows,        \
                     const int8_t *w_p, const float *sx, const float *scale_p,                  \
                     const float *bias_p, int64_t Kg, int64_t nf, int relu)                     \
    {                                                                                           \
        void (*const at[7])(Q8_TILE_ARGS) = {NULL,       name##_1, name##_2, name##_3,          \
                                             name##_4,   name##_5, name##_6};                   \
        for (int64_t r0 = 0; r0 < rows; r0 += MR) {                                             \
            const int64_t mr = rows - r0 < MR ? rows - r0 : MR;                                 \
            at[mr](y + r0 * ldy, ldy, x + r0 * ldx, ldx, w_p, sx + r0, scale_p, bias_p, Kg, nf, \
                   relu);                                                                       \
        }                                                                                       \
    }

#endif /* QUANT_INT8_H */
