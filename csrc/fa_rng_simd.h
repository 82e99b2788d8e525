/* fa_rng_simd.h -- fa_rng.h's keep/drop decision for FA_VL consecutive columns at once, per ISA.
 *
 * Included by a *_body.h (after fa_simd.h, once per ISA, like the body itself), so the 32-bit
 * hash runs on that level's integer vectors. Bit for bit the scalar fa_rng_keep() of every lane.
 * fa_dropout_t (once) describes a dropout to apply in an epilogue.
 */
#include "fa_rng.h"

#ifndef FA_DROPOUT_T
#define FA_DROPOUT_T
/* on = 0: no dropout (p = 0), nothing computed. Else element (row, col) is kept, times scale,
 * iff fa_rng_keep(fa_rng_row_key(seed, row), col, threshold). */
typedef struct {
    int on;
    uint32_t threshold;  /* fa_rng_threshold(p) */
    float scale;         /* 1 / (1 - p) */
    uint64_t seed;
} fa_dropout_t;

FA_INLINE fa_dropout_t fa_dropout_make(double p, uint64_t seed)
{
    fa_dropout_t d = {p > 0.0, fa_rng_threshold(p), (float)(1.0 / (1.0 - p)), seed};
    if (!d.on) d.scale = 1.0f;
    return d;
}
#endif

/* scalar math, lane i:  keep = fmix32(row_key ^ ((col0 + i) * 0x9e3779b9)) >= threshold
 * Returns, per lane, `scale` where kept and 0 where dropped. */
FA_INLINE VF FA_CAT(vdrop_factor_, FA_SFX)(uint32_t row_key, uint32_t col0, uint32_t threshold,
                                          float scale)
{
    VU c;
    for (int i = 0; i < FA_VL; i++) c[i] = col0 + (uint32_t)i;   /* folded to a constant + col0 */
    VU h = row_key ^ (c * 0x9e3779b9u);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    const VI keep = (VI)(h >= threshold);
    return (VF)(keep & (VI)vsplat(scale));
}
#define vdrop_factor FA_CAT(vdrop_factor_, FA_SFX)
