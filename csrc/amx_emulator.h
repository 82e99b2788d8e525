/* amx_emulator.h -- the AMX tile instructions in C, for quant_amx_emulated.c and
 * bf16_amx_emulated.c (through amx_tiles.h): a test aid.
 *
 * It is kept in every AVX-512 build, and selectable only when forced (the amx-emulated paths
 * of FASTATTN_INT8_PATH, FASTATTN_BF16_PATH and FASTATTN_ATTENTION_BF16_PATH): the AMX paths'
 * layout and arithmetic are then checked bit for bit against the twin by the test suite on any
 * AVX-512 CPU, where the tiles themselves are missing or not granted by the OS (the CI
 * machines); it costs code size only. The AMX_* operations that quant_amx.h and bf16_amx.h are
 * written in become calls of the functions below; each unit has its own emulated tiles.
 */
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

/* The tile arithmetic below touches only the emulator's own registers, at indices bounded by
 * the checked shapes: a sanitizer build leaves it uninstrumented (it would run the emulated
 * paths' tests several times slower for nothing), while the loads and stores, which read and
 * write the kernel's memory, stay checked. */
#if defined(FA_SANITIZE_BUILD) && (defined(__GNUC__) || defined(__clang__))
#define AMX_EMU_ARITH __attribute__((no_sanitize("address", "undefined")))
#else
#define AMX_EMU_ARITH
#endif

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
AMX_EMU_ARITH static void amx_emu_dp(int c, int a, int b, int a_signed)
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


/* a float32's subnormals to (signed) zero: the tiles' DAZ on bf16 inputs, FTZ on results */
AMX_EMU_ARITH static float amx_flush(float f)
{
    const uint32_t u = amx_float_bits(f);
    return (u & 0x7f800000u) ? f : amx_bits_float(u & 0x80000000u);
}

/* TDPBF16PS, in the SDM's order: for m < rows(c) and n < colsb(c) / 4, two float32 sums
 * over k < colsb(a) / 4, one per element of the pairs (i = 0, 1),
 *   s_i = flush(s_i + flush(a[m][2k + i]) * flush(b[k][2n + i]))     (FMA, RNE; each product
 * of two bf16 values is exact in float32), then c[m][n] = flush(c[m][n] + flush(s_0 + s_1)) */
AMX_EMU_ARITH static void amx_emu_dpbf16(int c, int a, int b)
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

#define AMX_CONFIG(cfg) amx_emu_config(cfg)
#define AMX_LOAD(t, base, stride) amx_emu_load(t, base, stride)
#define AMX_STORE(t, base, stride) amx_emu_store(t, base, stride)
#define AMX_ZERO(t) amx_emu_zero(t)
#define AMX_DPBSSD(c, a, b) amx_emu_dp(c, a, b, 1)
#define AMX_DPBUSD(c, a, b) amx_emu_dp(c, a, b, 0)
#define AMX_DPBF16PS(c, a, b) amx_emu_dpbf16(c, a, b)
#define AMX_RELEASE() amx_emu_release()
