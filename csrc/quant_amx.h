/* quant_amx.h -- the int8 products on AMX tiles: the whole of quant_amx.c (the "amx" path:
 * the tile instructions) and of quant_amx_emulated.c (AMX_EMULATE, "amx-emulated": every tile
 * instruction emulated in C, amx_tiles.h). Each unit defines first FA_TARGET (an AVX-512
 * target) and AMX_KERNELS, the name of its path's table. (The bf16 family's tiles are in
 * bf16_amx.h.)
 *
 * The product's int16 activations meet the int8 weights as two 8-bit products (the tiles
 * multiply bytes): x = 256 hi + lo with hi = x >> 8 (signed byte) and lo = x & 255 (unsigned),
 *   scalar math:  acc = 256 sum_k hi_k w_k + sum_k lo_k w_k      (TDPBSSD, TDPBUSD)
 * in int32 with wrap-around, like the tiles: the true sum fits int32 (the level rule of
 * fastattn.h), so the wrapped parts add up to it exactly and every path gets the same integers.
 *
 * Layouts (Kp = K rounded up to 4, Kq = Kp / 4 quads):
 *   activations  row n (stride 2 Kp bytes): Kp hi bytes, then Kp lo bytes (Q8_FMT_HILO), rows
 *                after the last zero up to a multiple of 16 (quant.c: q8_quant)
 *   weights      fa_int8_pack with 32-feature panels, K in quads:
 *                wp[p][kq][f][j] = q[32 p + f][4 kq + j]
 * Tiles (palette 1, each 16 rows x 64 bytes):
 *   0, 1  C_hi, C_lo of features 0-15     2, 3  C_hi, C_lo of features 16-31   (16 x 16 int32)
 *   4, 5  A_hi, A_lo: 16 rows x 64 k      6     B: 16 quads (64 k) x 16 features x 4 bytes
 * K runs in blocks of 64 on the tiles; the last Kq % 16 quads, if any, are summed in C.
 */
#define Q8_AVX512 1
#include "quant_int8.h"
#include "amx_tiles.h"

/* The epilogue of one 16-row tile (mr rows) from its stored sums: 256 hi + lo (wrapping), the
 * quads after the last whole block of 64 (if any) added in scalar code, then q8_out512. */
static void q8_amx_out(float *y, int64_t ldy, const uint8_t *a_r, int64_t lda, int64_t Kp,
                       int64_t Kq, int64_t nkb, int64_t mr, const int8_t *w_p, const float *sx,
                       const __m512 *sc, const __m512 *bi, const __mmask16 *mk, int relu,
                       int32_t (*hi)[AMX_NP], int32_t (*lo)[AMX_NP])
{
    const int64_t ldb = AMX_G * AMX_NP;
    for (int64_t r = 0; r < mr; r++) {
        const uint8_t *h_r = a_r + r * lda, *l_r = h_r + Kp;
        __m512i acc[2];
        for (int c = 0; c < 2; c++)      /* 256 hi + lo, wrapping (vpslld, vpaddd) */
            acc[c] = _mm512_add_epi32(
                _mm512_slli_epi32(_mm512_load_si512((const void *)&hi[r][16 * c]), 8),
                _mm512_load_si512((const void *)&lo[r][16 * c]));
        if (nkb * 16 < Kq) {             /* the quads after the last whole block of 64 */
            uint32_t t[AMX_NP] = {0};
            for (int64_t kq = nkb * 16; kq < Kq; kq++) {
                const int8_t *w_k = w_p + kq * ldb;
                for (int j = 0; j < AMX_G; j++) {
                    const int64_t k = AMX_G * kq + j;
                    const int32_t xv = 256 * (int32_t)(int8_t)h_r[k] + (int32_t)l_r[k];
                    for (int f = 0; f < AMX_NP; f++)
                        t[f] += (uint32_t)(xv * (int32_t)w_k[AMX_G * f + j]);
                }
            }
            for (int c = 0; c < 2; c++)
                acc[c] = _mm512_add_epi32(acc[c], _mm512_loadu_si512((const void *)&t[16 * c]));
        }
        const __m512 s_r = _mm512_set1_ps(sx[r]);
        q8_out512(y + r * ldy, acc[0], s_r, sc[0], bi[0], mk[0], relu);
        q8_out512(y + r * ldy + 16, acc[1], s_r, sc[1], bi[1], mk[1], relu);
    }
}

/* One panel of 32 features for `rows` rows (fa_q8_panel_fn): y[r][f] for r < rows, f < nf, the
 * epilogue of every int8 path (q8_out512: fl(fl(fl(acc) * fl(sx * scale)) + bias), relu).
 *   x (rows rounded up to 16, 2 ldx bytes)  the Q8_FMT_HILO rows;  w_p  the panel (Kq, 32, 4)
 * The panel (Kq x 128 bytes: in L1 or L2) meets every 16-row tile of the block in turn, the
 * rows read from L2 (quant.c sizes the block for it); the next panel (the layout's panels are
 * contiguous) is prefetched during those passes; a tile's epilogue runs halfway through the
 * next tile's products (two buffers of sums), after its stores have drained. The tile
 * configuration is loaded here and released on return: this thread's tiles are the kernel's
 * only while it runs. */
static void q8_panel_amx(float *y, int64_t ldy, const int16_t *x, int64_t ldx, int64_t rows,
                         const int8_t *w_p, const float *sx, const float *scale_p,
                         const float *bias_p, int64_t Kq, int64_t nf, int relu)
{
    const uint8_t *a = (const uint8_t *)x;
    const int64_t Kp = AMX_G * Kq, lda = 2 * ldx, ldb = AMX_G * AMX_NP, nkb = Kq / 16;
    const int64_t tiles = (rows + AMX_MR - 1) / AMX_MR;
    /* the next panel's lines (2 per quad row) spread over this panel's steps; its address as
     * an integer: after the last panel there is none, and a prefetch there is harmless */
    const uintptr_t next = (uintptr_t)(w_p + Kq * ldb);
    const int64_t lines = 2 * Kq, steps = tiles * (nkb > 0 ? nkb : 1);
    const int64_t per_step = (lines + steps - 1) / steps;
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    __m512 sc[4], bi[4];
    __mmask16 mk[4];
    q8_cols512(sc, bi, mk, scale_p, bias_p, nf);        /* vectors 2, 3 unused (nf <= 32) */
    int32_t hi[2][AMX_MR][AMX_NP] __attribute__((aligned(64)));
    int32_t lo[2][AMX_MR][AMX_NP] __attribute__((aligned(64)));
    int64_t line = 0, due = -1;                         /* the tile whose epilogue is due */
#define Q8_AMX_OUT(t)                                                                          \
    q8_amx_out(y + (t) * AMX_MR * ldy, ldy, a + (t) * AMX_MR * lda, lda, Kp, Kq, nkb,          \
               rows - (t) * AMX_MR < AMX_MR ? rows - (t) * AMX_MR : AMX_MR, w_p,               \
               sx + (t) * AMX_MR, sc, bi, mk, relu, hi[(t) & 1], lo[(t) & 1])
    for (int64_t t = 0; t < tiles; t++) {
        const uint8_t *a_r = a + t * AMX_MR * lda;
        AMX_ZERO(0);
        AMX_ZERO(1);
        AMX_ZERO(2);
        AMX_ZERO(3);
        for (int64_t kb = 0; kb < nkb; kb++) {
            const int8_t *b_k = w_p + kb * 16 * ldb;
            AMX_LOAD(4, a_r + 64 * kb, lda);
            AMX_LOAD(5, a_r + Kp + 64 * kb, lda);
            AMX_LOAD(6, b_k, ldb);                       /* features 0-15 */
            AMX_DPBSSD(0, 4, 6);
            AMX_DPBUSD(1, 5, 6);
            AMX_LOAD(6, b_k + 64, ldb);                  /* features 16-31 */
            AMX_DPBSSD(2, 4, 6);
            AMX_DPBUSD(3, 5, 6);
            for (int64_t i = 0; i < per_step && line < lines; i++, line++)
                _mm_prefetch((const char *)(next + (uintptr_t)(64 * line)), _MM_HINT_T0);
            if (kb == nkb / 2 && due >= 0) {             /* the previous tile's, meanwhile */
                Q8_AMX_OUT(due);
                due = -1;
            }
        }
        if (due >= 0) {                                  /* no K loop to hide it in */
            Q8_AMX_OUT(due);
            due = -1;
        }
        AMX_STORE(0, &hi[t & 1][0][0], 4 * AMX_NP);
        AMX_STORE(1, &lo[t & 1][0][0], 4 * AMX_NP);
        AMX_STORE(2, &hi[t & 1][0][16], 4 * AMX_NP);
        AMX_STORE(3, &lo[t & 1][0][16], 4 * AMX_NP);
        due = t;
    }
    if (due >= 0) Q8_AMX_OUT(due);
#undef Q8_AMX_OUT
    AMX_RELEASE();
}

const fa_q8_kernels AMX_KERNELS = {.np = AMX_NP, .g = AMX_G, .mr = AMX_MR, .max_block = AMX_RB,
                                   .isa = &fa_kernels_avx512, .fmt = Q8_FMT_HILO,
                                   .panel = q8_panel_amx};
