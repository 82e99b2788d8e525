/* fa_rng.h -- counter-based random bits for dropout: a pure function of (seed, row, col).
 *
 * Nothing is stored between a forward and its backward: both call fa_rng_keep() with the same
 * (seed, row, col) and get the same decision. Rows are whatever the caller flattens to a row
 * (attention: ((b * H + h) * Lq + i), columns the key j; an activation (N, C): row n, column c).
 *
 *   row key   32 bits = high half of mix64(mix64(seed) + row * golden64)   (once per row)
 *   bits      fmix32(row key ^ (col * golden32))                           (per element)
 *   keep      bits >= fa_rng_threshold(p)   (drop probability p, to 2^-32)
 *
 * mix64 is SplitMix64's finaliser and fmix32 MurmurHash3's; per element only 32-bit
 * multiplies and shifts, which vectorise on every ISA level. The NumPy twin is
 * fastattn.reference.dropout_keep; the two agree bit for bit.
 */
#ifndef FA_RNG_H
#define FA_RNG_H

#include <stdint.h>

#include "fa_common.h"

FA_INLINE uint64_t fa_rng_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

FA_INLINE uint32_t fa_rng_fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

/* The key of one row: computed once per row, then combined with every column. */
FA_INLINE uint32_t fa_rng_row_key(uint64_t seed, uint64_t row)
{
    return (uint32_t)(fa_rng_mix64(fa_rng_mix64(seed) + row * 0x9e3779b97f4a7c15ULL) >> 32);
}

FA_INLINE uint32_t fa_rng_bits(uint32_t row_key, uint32_t col)
{
    return fa_rng_fmix32(row_key ^ (col * 0x9e3779b9u));
}

/* Elements with bits below the threshold are dropped: floor(p * 2^32), p in [0, 1). */
FA_INLINE uint32_t fa_rng_threshold(double p)
{
    const double t = p * 4294967296.0;
    return t <= 0.0 ? 0u : t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

FA_INLINE int fa_rng_keep(uint32_t row_key, uint32_t col, uint32_t threshold)
{
    return fa_rng_bits(row_key, col) >= threshold;
}

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

#endif /* FA_RNG_H */
