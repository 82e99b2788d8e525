/* fa_rng_simd.h -- fa_rng.h's keep/drop decision for FA_VL consecutive columns at once, per ISA.
 *
 * Included after fa_simd.h by the per-ISA translation units, so the 32-bit hash runs on that
 * level's integer vectors. Bit for bit the scalar fa_rng_keep() of every lane.
 */
#ifndef FA_RNG_SIMD_H
#define FA_RNG_SIMD_H

#include "fa_rng.h"

/* Per lane: `scale` where the element (row key, column) is kept, else 0; multiplied in rather
 * than selected, so NaN stays NaN (as in the twin, which multiplies by the mask).
 *   scalar math, lane i:  keep = fmix32(row_key_i ^ (col_i * 0x9e3779b9)) >= threshold */
FA_INLINE VF vkeep(VU row_key, VU col, uint32_t threshold, float scale)
{
    VU h = row_key ^ (col * 0x9e3779b9u);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return (VF)((VI)(h >= threshold) & (VI)vsplat(scale));
}

/* vkeep of one row and the FA_VL columns from col0 */
FA_INLINE VF vdrop_factor(uint32_t row_key, uint32_t col0, uint32_t threshold, float scale)
{
    VU c;
    for (int i = 0; i < FA_VL; i++) c[i] = col0 + (uint32_t)i;   /* folded to a constant + col0 */
    return vkeep((VU){0} + row_key, c, threshold, scale);
}

#endif /* FA_RNG_SIMD_H */
