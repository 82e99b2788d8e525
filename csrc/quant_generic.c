/* quant_generic.c -- the int8 path "generic": Q8_GENERIC_NP features x Q8_GENERIC_MR rows per
 * tile, plain C on the int16 pair layout (quant_int8.h; the compiler vectorises what it can
 * with SSE2's pmaddwd), at the baseline. */
#include "quant_int8.h"

FA_INLINE void q8_tile_generic(float *y, int64_t ldy, const int16_t *xq, int64_t ldx,
                               const int8_t *w_p, const float *sx, const float *scale_p,
                               const float *bias_p, int64_t Kg, int64_t nf, const int mr,
                               int relu)
{
    int32_t acc[Q8_GENERIC_MR][Q8_GENERIC_NP];
    for (int r = 0; r < Q8_GENERIC_MR; r++)
        for (int f = 0; f < Q8_GENERIC_NP; f++) acc[r][f] = 0;
    for (int64_t kg = 0; kg < Kg; kg++) {
        const int8_t *w_k = w_p + kg * Q8_PAIR * Q8_GENERIC_NP;
        for (int r = 0; r < Q8_GENERIC_MR; r++) {
            if (r < mr) {
                const int32_t x0 = xq[r * ldx + 2 * kg], x1 = xq[r * ldx + 2 * kg + 1];
                for (int f = 0; f < Q8_GENERIC_NP; f++)
                    acc[r][f] += x0 * (int32_t)w_k[2 * f] + x1 * (int32_t)w_k[2 * f + 1];
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int64_t f = 0; f < nf; f++) {
            float t = (float)acc[r][f] * (sx[r] * scale_p[f]);
            __asm__("" : "+x"(t));
            t = t + (bias_p ? bias_p[f] : 0.0f);
            y[r * ldy + f] = relu && t < 0.0f ? 0.0f : t;
        }
}

Q8_PANEL_FN(q8_panel_generic, q8_tile_generic, Q8_GENERIC_MR)

const fa_q8_kernels fa_q8_generic = {.np = Q8_GENERIC_NP, .g = Q8_PAIR, .mr = Q8_GENERIC_MR,
                                     .isa = &fa_kernels_generic, .fmt = Q8_FMT_I16,
                                     .panel = q8_panel_generic};
