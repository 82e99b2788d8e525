/* amx_body.h -- the int8 and bf16 products on AMX tiles, included by quant.c under an AVX-512
 * target, twice: with the tile instructions (AMX_EMULATE undefined, target amx-tile, amx-int8,
 * amx-bf16: the "amx" path) and with every tile instruction emulated in C (AMX_EMULATE:
 * "amx-emulated", the same code run on CPUs without AMX, so that its layout and arithmetic are
 * tested everywhere). AMX_SFX names the instance.
 *
 * The product's int16 activations meet the int8 weights as two 8-bit products (the tiles
 * multiply bytes): x = 256 hi + lo with hi = x >> 8 (signed byte) and lo = x & 255 (unsigned),
 *   scalar math:  acc = 256 sum_k hi_k w_k + sum_k lo_k w_k      (TDPBSSD, TDPBUSD)
 * in int32 with wrap-around, like the tiles: the true sum fits int32 (the level rule of
 * fastattn.h), so the wrapped parts add up to it exactly and every path gets the same integers.
 *
 * Layouts (Kp = K rounded up to 4, Kq = Kp / 4 quads):
 *   activations  row n (stride 2 Kp bytes): Kp hi bytes, then Kp lo bytes (Q8_FMT_HILO), rows
 *                after the last zero up to a multiple of 16 (q8_quant_rows_hilo)
 *   weights      fa_int8_pack with 32-feature panels, K in quads:
 *                wp[p][kq][f][j] = q[32 p + f][4 kq + j]
 * Tiles (palette 1, each 16 rows x 64 bytes):
 *   0, 1  C_hi, C_lo of features 0-15     2, 3  C_hi, C_lo of features 16-31   (16 x 16 int32)
 *   4, 5  A_hi, A_lo: 16 rows x 64 k      6     B: 16 quads (64 k) x 16 features x 4 bytes
 * K runs in blocks of 64 on the tiles; the last Kq % 16 quads, if any, are summed in C.
 *
 * bf16 weights, many rows (TDPBF16PS: bf16 pairs, float32 sums): each float32 input is split
 * into three bf16 terms that add up to it exactly (the top 8 significant bits by truncation,
 * the next 8, the last 8), so the tiles multiply the input itself, not a rounding of it:
 *   scalar math:  y = sum_k (h1_k + h2_k + h3_k) w_k,  x_k = h1_k + h2_k + h3_k
 * (a non-finite input is its own first term). The tiles treat bf16 subnormals as 0 and flush
 * float32 results below 2^-126 to 0 (this path's only departure from float32 arithmetic, at
 * magnitudes no Transformer reaches); the sums' order differs from BLAS's, as any path's may.
 *   weights  the bf16 panels (fa_bf16_pack: [p][k][32]) repacked per call in pairs of k:
 *            wq[p][kk][f][j] = w[32 p + f][2 kk + j], K rounded up to 32 with zeros
 *   inputs   per 16-row tile, three (16, Kb) bf16 matrices (the terms), zero past K and N
 * Tiles: 0, 1  C of features 0-15, 16-31 (float32);  4, 5  A (a term's 16 x 32 k);  6, 7  B.
 */
#ifndef AMX_BODY_ONCE
#define AMX_BODY_ONCE

#define AMX_NP 32            /* features per packed panel (two B tiles side by side) */
#define AMX_G 4              /* K per group: the tiles multiply quads of bytes */
#define AMX_MR 16            /* rows per tile */

/* LDTILECFG's 64-byte operand (palette 1: 8 tiles of up to 16 rows x 64 bytes) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];      /* bytes per row of tile t */
    uint8_t rows[16];
} amx_tilecfg_t;
_Static_assert(sizeof(amx_tilecfg_t) == 64 && offsetof(amx_tilecfg_t, colsb) == 16 &&
                   offsetof(amx_tilecfg_t, rows) == 48,
               "LDTILECFG's operand: palette at 0, colsb[16] at 16, rows[16] at 48");

/* Every tile used here: 16 rows x 64 bytes. */
static void amx_config(amx_tilecfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->rows[t] = AMX_MR;
        cfg->colsb[t] = 64;
    }
}

/* ---- the emulator: what each instruction does to the tiles (Intel SDM's pseudo-code) --------
 * Per thread, like the tile registers. A use the hardware would fault on (no configuration,
 * shapes that do not fit) stops the process with a message: it is a bug in the kernel, not
 * something an input can cause. */
typedef struct {
    int configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} amx_emu_t;

static _Thread_local amx_emu_t amx_emu;

static void amx_emu_fail(const char *what)
{
    fprintf(stderr, "fastattn: AMX emulator: %s\n", what);
    abort();
}

/* LDTILECFG: set the shapes, zero every tile */
static void amx_emu_config(const amx_tilecfg_t *cfg)
{
    if (cfg->palette != 1) amx_emu_fail("palette is not 1");
    if (cfg->start_row != 0) amx_emu_fail("start_row is not 0");
    for (int i = 0; i < 14; i++)
        if (cfg->reserved[i]) amx_emu_fail("reserved configuration bytes are not 0");
    memset(&amx_emu, 0, sizeof amx_emu);
    for (int t = 0; t < 16; t++) {
        if (t >= 8 && (cfg->rows[t] || cfg->colsb[t])) amx_emu_fail("palette 1 has 8 tiles");
        if (t >= 8) continue;
        if (cfg->rows[t] > 16 || cfg->colsb[t] > 64) amx_emu_fail("tile larger than 16 x 64");
        if ((cfg->rows[t] == 0) != (cfg->colsb[t] == 0))
            amx_emu_fail("a tile with rows but no columns, or columns but no rows");
        amx_emu.rows[t] = cfg->rows[t];
        amx_emu.colsb[t] = cfg->colsb[t];
    }
    amx_emu.configured = 1;
}

static void amx_emu_check(int t)
{
    if (!amx_emu.configured) amx_emu_fail("tile used before LDTILECFG");
    if (t < 0 || t > 7 || amx_emu.rows[t] == 0) amx_emu_fail("tile not configured");
}

/* TILELOADD: rows x colsb bytes from base + r stride; the rest of the tile zeroed */
static void amx_emu_load(int t, const void *base, int64_t stride)
{
    amx_emu_check(t);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy(amx_emu.t[t][r], (const char *)base + r * stride, amx_emu.colsb[t]);
}

/* TILESTORED */
static void amx_emu_store(int t, void *base, int64_t stride)
{
    amx_emu_check(t);
    for (int r = 0; r < amx_emu.rows[t]; r++)
        memcpy((char *)base + r * stride, amx_emu.t[t][r], amx_emu.colsb[t]);
}

/* TILEZERO */
static void amx_emu_zero(int t)
{
    amx_emu_check(t);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);
}

/* The operands of a TDP* instruction c += a b: three different configured tiles of matching
 * shapes (rows(a) = rows(c), colsb(b) = colsb(c), rows(b) = colsb(a) / 4, in dwords); their
 * M = rows(c), N = colsb(c) / 4 and K = colsb(a) / 4 dwords */
static void amx_emu_operands(int c, int a, int b, int *M, int *N, int *K)
{
    amx_emu_check(c);
    amx_emu_check(a);
    amx_emu_check(b);
    if (c == a || c == b || a == b) amx_emu_fail("TDP* operands are not three different tiles");
    *M = amx_emu.rows[c];
    *N = amx_emu.colsb[c] / 4;
    *K = amx_emu.colsb[a] / 4;
    if (amx_emu.rows[a] != *M || amx_emu.colsb[b] != amx_emu.colsb[c] ||
        amx_emu.rows[b] != *K || amx_emu.colsb[a] % 4 || amx_emu.colsb[c] % 4)
        amx_emu_fail("TDP* operand shapes do not match");
}

/* TDPBSSD (a_signed) / TDPBUSD: for m < rows(c), n < colsb(c) / 4:
 *   c[m][n] += sum_{k < colsb(a) / 4} sum_{i < 4} a[m][4k + i] * b[k][4n + i]
 * a's bytes signed or unsigned, b's signed, the int32 sums wrapping (no saturation) */
static void amx_emu_dp(int c, int a, int b, int a_signed)
{
    int M, N, K;
    amx_emu_operands(c, a, b, &M, &N, &K);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc;
            memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
            uint32_t u = (uint32_t)acc;
            for (int k = 0; k < K; k++)
                for (int i = 0; i < 4; i++) {
                    const uint8_t av = amx_emu.t[a][m][4 * k + i];
                    const int32_t x = a_signed ? (int32_t)(int8_t)av : (int32_t)av;
                    u += (uint32_t)(x * (int32_t)(int8_t)amx_emu.t[b][k][4 * n + i]);
                }
            memcpy(&amx_emu.t[c][m][4 * n], &u, 4);
        }
}

static float amx_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t amx_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a float32's subnormals to (signed) zero: the tiles' DAZ on bf16 inputs, FTZ on results */
static float amx_flush(float f)
{
    const uint32_t u = amx_float_bits(f);
    return (u & 0x7f800000u) ? f : amx_bits_float(u & 0x80000000u);
}

/* TDPBF16PS, in the SDM's order: for m < rows(c) and n < colsb(c) / 4, two float32 sums
 * over k < colsb(a) / 4, one per element of the pairs (i = 0, 1),
 *   s_i = flush(s_i + flush(a[m][2k + i]) * flush(b[k][2n + i]))     (FMA, RNE; each product
 * of two bf16 values is exact in float32), then c[m][n] = flush(c[m][n] + flush(s_0 + s_1)) */
static void amx_emu_dpbf16(int c, int a, int b)
{
    int M, N, K;
    amx_emu_operands(c, a, b, &M, &N, &K);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc, sum[2] = {0.0f, 0.0f};
            for (int k = 0; k < K; k++)
                for (int i = 0; i < 2; i++) {
                    uint16_t av, bv;
                    memcpy(&av, &amx_emu.t[a][m][4 * k + 2 * i], 2);
                    memcpy(&bv, &amx_emu.t[b][k][4 * n + 2 * i], 2);
                    const float p = amx_flush(amx_bits_float((uint32_t)av << 16)) *
                                    amx_flush(amx_bits_float((uint32_t)bv << 16));
                    sum[i] = amx_flush(sum[i] + p);
                }
            memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
            acc = amx_flush(acc + amx_flush(sum[0] + sum[1]));
            memcpy(&amx_emu.t[c][m][4 * n], &acc, 4);
        }
}

/* TILERELEASE */
static void amx_emu_release(void) { memset(&amx_emu, 0, sizeof amx_emu); }

/* A product's activations for the AMX tiles: rows of x (row stride K) into Q8_FMT_HILO rows of
 * dst (row stride 2 Kp bytes, as many bytes as the int16 rows of the other paths), scales into
 * sx; the rows from `rows` up to a multiple of AMX_MR are zero (the tiles read whole 16-row
 * blocks). The values are the other paths' int16 ones (the same row rule). */
static void q8_quant_rows_hilo(int16_t *dst, float *sx, const float *x, int64_t rows,
                               int64_t K, int64_t Kp)
{
    for (int64_t r = 0; r < rows; r++)
        sx[r] = q8_quant_row_v4(dst + r * Kp, x + r * K, K, Kp, Q8_FMT_HILO);
    const int64_t padded = (rows + AMX_MR - 1) / AMX_MR * AMX_MR;
    memset(dst + rows * Kp, 0, (size_t)((padded - rows) * Kp) * 2);
}

/* x (K) -> its three bf16 terms h[0][k], h[ld + k], h[2 ld + k] (scalar math above), zero for
 * K <= k < Kb; an inf is its own first term, a NaN's first term a quiet NaN of its sign (its
 * top 16 bits alone may read as inf) */
static void amx_bf16_split(uint16_t *h, int64_t ld, const float *x, int64_t K, int64_t Kb)
{
    for (int64_t k = 0; k < K; k++) {
        const uint32_t u = amx_float_bits(x[k]);
        uint32_t t2 = 0, t3 = 0;
        if ((u & 0x7f800000u) != 0x7f800000u) {
            const float r = x[k] - amx_bits_float(u & 0xffff0000u);            /* exact */
            t2 = amx_float_bits(r) >> 16;
            t3 = amx_float_bits(r - amx_bits_float(t2 << 16)) >> 16;            /* exact */
        }
        const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;          /* 1 for a NaN */
        h[k] = (uint16_t)((u >> 16) | (nan << 6));                      /* quiet, not inf */
        h[ld + k] = (uint16_t)t2;
        h[2 * ld + k] = (uint16_t)t3;
    }
    for (int64_t k = K; k < Kb; k++) h[k] = h[ld + k] = h[2 * ld + k] = 0;
}

/* panel p of the bf16 pack (fa_bf16_pack: wp[p][k][32]) in pairs of k for the tiles:
 * wq[p][kk][f][j] = wp[p][2 kk + j][f], zero for 2 kk + j >= K (Kb: K rounded up to 32) */
static void amx_bf16_repack(uint16_t *wq, const uint16_t *wp, int64_t p, int64_t K, int64_t Kb)
{
    const uint16_t *w_p = wp + p * K * AMX_NP;
    uint16_t *q_p = wq + p * Kb * AMX_NP;
    for (int64_t kk = 0; kk < Kb / 2; kk++)
        for (int f = 0; f < AMX_NP; f++)
            for (int j = 0; j < 2; j++) {
                const int64_t k = 2 * kk + j;
                q_p[(kk * AMX_NP + f) * 2 + j] = k < K ? w_p[k * AMX_NP + f] : 0;
            }
}
#endif /* AMX_BODY_ONCE */

#ifdef AMX_EMULATE
#define AMX_CONFIG(cfg) amx_emu_config(cfg)
#define AMX_LOAD(t, base, stride) amx_emu_load(t, base, stride)
#define AMX_STORE(t, base, stride) amx_emu_store(t, base, stride)
#define AMX_ZERO(t) amx_emu_zero(t)
#define AMX_DPBSSD(c, a, b) amx_emu_dp(c, a, b, 1)
#define AMX_DPBUSD(c, a, b) amx_emu_dp(c, a, b, 0)
#define AMX_DPBF16PS(c, a, b) amx_emu_dpbf16(c, a, b)
#define AMX_RELEASE() amx_emu_release()
#else
/* LDTILECFG and TILELOADD as asm that names the memory they read: GCC 12's _tile_loadconfig
 * names only the first 8 bytes of the configuration, and its _tile_loadd no memory at all, so
 * the stores that fill either could be dropped as dead or sunk past the instruction */
#define AMX_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" : : "m"(*(const amx_tilecfg_t *)(cfg)))
#define AMX_LOAD(t, base, stride)                                                             \
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #t "|tileloadd\t%%tmm" #t ", [%0+%1*1]}"  \
                     : : "r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define AMX_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_RELEASE() _tile_release()
#endif

/* One panel of 32 features for `rows` rows (q8_panel_fn): y[r][f] for r < rows, f < nf, the
 * epilogue of every int8 path (q8_out512: fl(fl(fl(acc) * fl(sx * scale)) + bias), relu).
 *   x (rows rounded up to 16, 2 ldx bytes)  the Q8_FMT_HILO rows;  w_p  the panel (Kq, 32, 4)
 * The tile configuration is loaded here and released on return: this thread's tiles are the
 * kernel's only while it runs. */
static void FA_CAT(q8_panel_amx_, AMX_SFX)(float *y, int64_t ldy, const int16_t *x, int64_t ldx,
                                           int64_t rows, const int8_t *w_p, const float *sx,
                                           const float *scale_p, const float *bias_p, int64_t Kq,
                                           int64_t nf, int relu)
{
    const uint8_t *a = (const uint8_t *)x;
    const int64_t Kp = AMX_G * Kq, lda = 2 * ldx, ldb = AMX_G * AMX_NP, nkb = Kq / 16;
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    __m512 sc[4], bi[4];
    __mmask16 mk[4];
    q8_cols512(sc, bi, mk, scale_p, bias_p, nf);        /* vectors 2, 3 unused (nf <= 32) */
    int32_t hi[AMX_MR][AMX_NP] __attribute__((aligned(64)));
    int32_t lo[AMX_MR][AMX_NP] __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < rows; r0 += AMX_MR) {
        const uint8_t *a_r = a + r0 * lda;
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
        }
        AMX_STORE(0, &hi[0][0], 4 * AMX_NP);
        AMX_STORE(1, &lo[0][0], 4 * AMX_NP);
        AMX_STORE(2, &hi[0][16], 4 * AMX_NP);
        AMX_STORE(3, &lo[0][16], 4 * AMX_NP);
        const int64_t mr = rows - r0 < AMX_MR ? rows - r0 : AMX_MR;
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
                    acc[c] = _mm512_add_epi32(acc[c],
                                              _mm512_loadu_si512((const void *)&t[16 * c]));
            }
            const __m512 s_r = _mm512_set1_ps(sx[r0 + r]);
            q8_out512(y + (r0 + r) * ldy, acc[0], s_r, sc[0], bi[0], mk[0], relu);
            q8_out512(y + (r0 + r) * ldy + 16, acc[1], s_r, sc[1], bi[1], mk[1], relu);
        }
    }
    AMX_RELEASE();
}

/* bf16 product rows [r0, r1) of y (row stride M; r0 a multiple of 16, r1 <= N) = x
 * float32(w)^T, without bias: the repacked weight wq (above), h scratch for one row tile's
 * three terms (3 x 16 x Kb bf16). */
static void FA_CAT(bf16_rows_amx_, AMX_SFX)(float *y, const float *x, int64_t r0, int64_t r1,
                                            const uint16_t *wq, uint16_t *h, int64_t K,
                                            int64_t Kb, int64_t M)
{
    const int64_t P = (M + AMX_NP - 1) / AMX_NP, nkb = Kb / 32, ldh = AMX_MR * Kb;
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    float c[AMX_MR][AMX_NP] __attribute__((aligned(64)));
    for (int64_t t0 = r0; t0 < r1; t0 += AMX_MR) {
        const int64_t mr = r1 - t0 < AMX_MR ? r1 - t0 : AMX_MR;
        for (int64_t r = 0; r < AMX_MR; r++) {
            if (r < mr) {
                amx_bf16_split(h + r * Kb, ldh, x + (t0 + r) * K, K, Kb);
            } else {
                for (int t = 0; t < 3; t++) memset(h + t * ldh + r * Kb, 0, (size_t)Kb * 2);
            }
        }
        for (int64_t p = 0; p < P; p++) {
            const uint16_t *w_p = wq + p * Kb * AMX_NP;
            AMX_ZERO(0);
            AMX_ZERO(1);
            for (int64_t kb = 0; kb < nkb; kb++) {
                const uint16_t *b_k = w_p + kb * 16 * 2 * AMX_NP;    /* 16 pairs of k */
                const uint16_t *a_k = h + 32 * kb;
                AMX_LOAD(6, b_k, 4 * AMX_NP);                         /* features 0-15 */
                AMX_LOAD(7, b_k + 32, 4 * AMX_NP);                    /* features 16-31 */
                AMX_LOAD(4, a_k, 2 * Kb);                             /* h1 */
                AMX_DPBF16PS(0, 4, 6);
                AMX_DPBF16PS(1, 4, 7);
                AMX_LOAD(5, a_k + ldh, 2 * Kb);                       /* h2 */
                AMX_DPBF16PS(0, 5, 6);
                AMX_DPBF16PS(1, 5, 7);
                AMX_LOAD(4, a_k + 2 * ldh, 2 * Kb);                   /* h3 */
                AMX_DPBF16PS(0, 4, 6);
                AMX_DPBF16PS(1, 4, 7);
            }
            AMX_STORE(0, &c[0][0], 4 * AMX_NP);
            AMX_STORE(1, &c[0][16], 4 * AMX_NP);
            const int64_t m0 = p * AMX_NP, nf = M - m0 < AMX_NP ? M - m0 : AMX_NP;
            for (int64_t r = 0; r < mr; r++)
                memcpy(y + (t0 + r) * M + m0, c[r], (size_t)nf * sizeof(float));
        }
    }
    AMX_RELEASE();
}

#undef AMX_CONFIG
#undef AMX_LOAD
#undef AMX_STORE
#undef AMX_ZERO
#undef AMX_DPBSSD
#undef AMX_DPBUSD
#undef AMX_DPBF16PS
#undef AMX_RELEASE
