/* paths.c -- every code path, chosen in one place: the ISA level (the kernel table fa_k), the
 * int8 path, the bfloat16 compute path and bf16 attention's path, from the CPU (CPUID, and the
 * OS's XCR0 for the AMX tile state), Linux's grant of the tile data (arch_prctl) and what the
 * environment forces (read by the binding at import and passed to the fa_*_init functions as
 * `forced`, -1 for the default).
 *
 * One pending grant: a default path that chose the AMX tiles does not ask Linux for the tile
 * data at import (once granted, the kernel refuses any later sigaltstack too small for the
 * tile state, so a process that never uses the tiles is not changed). It is marked pending;
 * the first product or attention that asks for its path (fa_paths_*) settles every pending
 * path at once: one request, and where it is refused each of them falls back to its vector
 * path. A forced amx asks at init, and init fails with -2 if refused.
 *
 * The family files ask here for the path of each call (fa_paths_*, fa_paths.h) and hand it to
 * their kernels; no kernel reads the choice from a global. */
#define _GNU_SOURCE   /* syscall() under -std=c11 (the AMX permission request) */
#include <stdint.h>
#include <time.h>

#include "fa_gemm.h"
#include "fa_paths.h"
#include "fa_tiles.h"

/* ---- the CPU ------------------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FA_ARCH_GET_XCOMP_PERM 0x1022
#define FA_ARCH_REQ_XCOMP_PERM 0x1023
#define FA_XFEATURE_XTILEDATA 18

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Linux has granted this process the tile data (asked for only by amx_request: see the top) */
static int amx_permitted(void)
{
    uint64_t features = 0;
    return syscall(SYS_arch_prctl, FA_ARCH_GET_XCOMP_PERM, &features) == 0 &&
           ((features >> FA_XFEATURE_XTILEDATA) & 1);
}

static int amx_request(void)
{
    return syscall(SYS_arch_prctl, FA_ARCH_REQ_XCOMP_PERM, FA_XFEATURE_XTILEDATA) == 0;
}

static int amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int tile = (d >> 24) & 1, int8 = (d >> 25) & 1, bf16 = (d >> 22) & 1;
    int st = (tile && int8 ? 1 : 0) | (tile && bf16 ? 2 : 0);
    if (!st) return 0;
    unsigned a1, b1, c1, d1;
    if (__get_cpuid(1, &a1, &b1, &c1, &d1) && ((c1 >> 27) & 1)) {     /* OSXSAVE */
        if ((xgetbv0() & (3u << 17)) == (3u << 17)) st |= 4;          /* XTILECFG, XTILEDATA */
    }
    return st;
}

static int cpu_has_avx512bf16(void)
{
    unsigned a, b, c, d;
    /* CPUID leaf 7 subleaf 1, EAX bit 5 (AVX512_BF16); zmm state is checked by the level */
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
}
#else
static int amx_permitted(void) { return 0; }
static int amx_request(void) { return 0; }
static int amx_probe(void) { return 0; }
static int cpu_has_avx512bf16(void) { return 0; }
#endif

/* bits 0-2 of fa_amx_status, probed once (the *_supports functions may run before any init) */
static int amx_status(void)
{
    static int st = -1;
    if (st < 0) st = amx_probe();
    return st;
}

int fa_amx_status(void)
{
    const int st = amx_status();
    return st | ((st & 4) && amx_permitted() ? 8 : 0);
}

/* Linux grants this process the tile data (asking if need be) */
static int amx_grant(void) { return amx_permitted() || amx_request(); }

/* the bf16 tiles can run: AMX-BF16 enabled by the OS, and AVX512_BF16, whose vcvtneps2bf16
 * rounds the tiles' inputs (amx_tiles.h: amx_round_row; every AMX-BF16 CPU has it) */
static int amx_bf16_usable(void) { return (amx_status() & 6) == 6 && cpu_has_avx512bf16(); }

int fa_bfloat16_cpu_has_avx512bf16(void) { return cpu_has_avx512bf16(); }

/* ---- the choice ------------------------------------------------------------------------------
 * Written by the fa_*_init functions at import (and by settle: a refused grant's fallbacks);
 * read through fa_paths_* and the fa_*_path functions. */

/* the pending grant's bits: which default paths chose the tiles before the grant was asked */
enum { PENDING_BF16 = 1, PENDING_ATT = 2, PENDING_INT8 = 4 };

static struct {
    fa_isa_t level;
    fa_int8_path_t int8;
    int int8_forced;
    fa_bf16_path_t bf16;
    fa_bf16_path_t bf16_fallback;     /* the default's vector path (no grant; few rows) */
    int bf16_forced;
    int att;                          /* FA_ATT_BF16_* */
    int att_fallback;                 /* the default's path if the grant is refused */
    int att_dot;                      /* the level and CPU run AVX512_BF16 (FA_ATT_BF16_DOT) */
    int pending;                      /* PENDING_* bits */
} g = {FA_ISA_GENERIC, FA_INT8_GENERIC, 0, FA_BF16_FMA, FA_BF16_FMA, 0,
       FA_ATT_BF16_FMA, FA_ATT_BF16_FMA, 0, 0};

const fa_kernels *fa_k = &fa_kernels_generic;

/* Every pending path settled: one request for the tile data; refused, each falls back to its
 * vector path. Concurrent first calls may both ask; the request is idempotent. */
static void settle(void)
{
    const int pending = __atomic_load_n(&g.pending, __ATOMIC_ACQUIRE);
    if (!pending) return;
    if (!amx_grant()) {
        if (pending & PENDING_BF16) __atomic_store_n(&g.bf16, g.bf16_fallback, __ATOMIC_RELAXED);
        if (pending & PENDING_ATT) __atomic_store_n(&g.att, g.att_fallback, __ATOMIC_RELAXED);
        if (pending & PENDING_INT8)                   /* the tiles' partner: the same layout */
            __atomic_store_n(&g.int8, FA_INT8_AVX512VNNI_QUADS, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&g.pending, 0, __ATOMIC_RELEASE);
}

/* a default that chose the tiles: its grant pending (bit), the fallback set by the caller */
static void set_pending(int bit) { g.pending |= bit; }
static void clear_pending(int bit) { g.pending &= ~bit; }

/* A forced path's check, the same for every path: 0 where it can run (a path needing the
 * tiles, amx, asks for them now), -1 where supports() refuses it, -2 where Linux refuses the
 * tiles */
static int forced_ok(int forced, int (*supports)(int), int amx)
{
    if (!supports(forced)) return -1;
    if (forced == amx && !amx_grant()) return -2;
    return 0;
}

/* ---- the ISA level --------------------------------------------------------------------------- */

fa_isa_t fa_cpu_level(void) { return g.level; }

const fa_kernels *fa_kernels_of(int level)
{
    switch (level) {
    case FA_ISA_GENERIC:
        return &fa_kernels_generic;
#if defined(FA_HAVE_V3)
    case FA_ISA_AVX2:
        return &fa_kernels_avx2;
#endif
#if defined(FA_HAVE_V4)
    case FA_ISA_AVX512:
        return &fa_kernels_avx512;
#endif
    default:
        return NULL;
    }
}

int fa_cpu_supports(int level)
{
    switch (level) {
    case FA_ISA_GENERIC:
        return 1;
#if defined(FA_HAVE_V3)
    case FA_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v3") != 0;
#endif
#if defined(FA_HAVE_V4)
    case FA_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v4") != 0;
#endif
    default:
        return 0;
    }
}

int fa_cpu_init(int forced)
{
    if (forced >= 0) {
        const int ok = forced_ok(forced, fa_cpu_supports, -1);
        if (ok != 0) return ok;
        g.level = (fa_isa_t)forced;
    } else {
        g.level = fa_cpu_supports(FA_ISA_AVX512) ? FA_ISA_AVX512
                : fa_cpu_supports(FA_ISA_AVX2)   ? FA_ISA_AVX2
                                                 : FA_ISA_GENERIC;
    }
    fa_k = fa_kernels_of(g.level);
    fa_gemm_init();
    return 0;
}

/* ---- int8 ------------------------------------------------------------------------------------ */

/* The kernels of an int8 path (one this build has: fa_int8_supports checks the CPU) */
static const fa_q8_kernels *q8_of(int path)
{
    switch (path) {
#if defined(FA_HAVE_V3)
    case FA_INT8_AVX2:
        return &fa_q8_avx2;
#endif
#if defined(FA_HAVE_V4)
    case FA_INT8_AVX512BW:
        return &fa_q8_avx512bw;
    case FA_INT8_AVX512VNNI:
        return &fa_q8_avx512vnni;
    case FA_INT8_AVX512VNNI_QUADS:
        return &fa_q8_avx512vnni_quads;
    case FA_INT8_AMX_EMULATED:
        return &fa_q8_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_INT8_AMX:
        return &fa_q8_amx;
#endif
    default:
        return &fa_q8_generic;
    }
}

int fa_int8_supports(int path)
{
    switch (path) {
    case FA_INT8_GENERIC:
        return 1;
    case FA_INT8_AVX2:
        return g.level >= FA_ISA_AVX2;
    case FA_INT8_AVX512BW:
        return g.level >= FA_ISA_AVX512;           /* x86-64-v4 includes AVX-512BW */
#if defined(FA_HAVE_V4)
    case FA_INT8_AVX512VNNI:
    case FA_INT8_AVX512VNNI_QUADS:
        __builtin_cpu_init();
        return g.level >= FA_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    case FA_INT8_AMX_EMULATED:
        return g.level >= FA_ISA_AVX512;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_INT8_AMX:         /* the CPU's int8 and bf16 tiles, their state enabled by the OS */
        return g.level >= FA_ISA_AVX512 && (amx_status() & 7) == 7;
#endif
    default:
        return 0;
    }
}

/* Below this many rows a default amx hands the int8 product to its partner on the same packed
 * weight, avx512vnni-quads: a tile holds 16 rows, and with fewer the tiles multiply padding
 * (measured on a 2-core Xeon with AMX: 8 rows ran at 262 GOP/s on the tiles against 321 with
 * VNNI, 64 rows at 821 against 438). A forced amx runs every size on the tiles. */
#define Q8_AMX_MIN_ROWS AMX_MR

int fa_int8_init(int forced)
{
    clear_pending(PENDING_INT8);
    g.int8_forced = forced >= 0;
    if (forced >= 0) {
        const int ok = forced_ok(forced, fa_int8_supports, FA_INT8_AMX);
        if (ok != 0) return ok;
        g.int8 = (fa_int8_path_t)forced;
        return 0;
    }
    /* the tiles where the CPU has them (every AMX-INT8 CPU has AVX512-VNNI, the few-row
     * partner; the grant pending as for the bf16 paths: refused, the partner runs every size) */
    if (fa_int8_supports(FA_INT8_AMX) && fa_int8_supports(FA_INT8_AVX512VNNI_QUADS)) {
        g.int8 = FA_INT8_AMX;
        set_pending(PENDING_INT8);
        return 0;
    }
    g.int8 = fa_int8_supports(FA_INT8_AVX512VNNI) ? FA_INT8_AVX512VNNI
           : fa_int8_supports(FA_INT8_AVX512BW)   ? FA_INT8_AVX512BW
           : fa_int8_supports(FA_INT8_AVX2)       ? FA_INT8_AVX2
                                                  : FA_INT8_GENERIC;
    return 0;
}

int fa_int8_path(void)
{
    settle();
    return __atomic_load_n(&g.int8, __ATOMIC_RELAXED);
}

int fa_int8_path_rows(int64_t rows)
{
    const int path = fa_int8_path();
    return path == FA_INT8_AMX && !g.int8_forced && rows < Q8_AMX_MIN_ROWS
               ? FA_INT8_AVX512VNNI_QUADS
               : path;
}

/* The kernels of a product of `rows` rows (the layout, np and g, is the same for every rows) */
const fa_q8_kernels *fa_paths_int8(int64_t rows) { return q8_of(fa_int8_path_rows(rows)); }

/* The tiles of bf16 storage's many-row products: the int8 path's units, where that path is
 * amx-emulated or a forced amx. Not the default amx's: they multiply each input as three bf16
 * terms, three times the tiles' work, and at the rate the tiles were measured at before their
 * blocking was redone (9-17% of their peak) that is below the float32 engine; until they are
 * timed again, bf16 storage stays on the engine by default. */
const fa_amx_kernels *fa_paths_bf16_storage(void)
{
    const int path __attribute__((unused)) = fa_int8_path();
#if defined(FA_HAVE_V4)
    if (path == FA_INT8_AMX_EMULATED) return &fa_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    if (path == FA_INT8_AMX && g.int8_forced) return &fa_amx;
#endif
    return NULL;
}

const fa_amx_kernels *fa_paths_amx_tiles(void)
{
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    if (g.level >= FA_ISA_AVX512 && (amx_status() & 7) == 7 && amx_bf16_usable() && amx_grant())
        return &fa_amx;
#endif
    return NULL;
}

/* ---- bfloat16 compute ------------------------------------------------------------------------ */

int fa_bfloat16_supports(int path)
{
    switch (path) {
    case FA_BF16_FMA:
        return 1;
    case FA_BF16_AVX512BF16:
        return fa_k->bfc_panel_dp != NULL && cpu_has_avx512bf16();
#if defined(FA_HAVE_V4)
    case FA_BF16_AMX_EMULATED:
        return g.level >= FA_ISA_AVX512;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    case FA_BF16_AMX:
        return g.level >= FA_ISA_AVX512 && amx_bf16_usable();
#endif
    default:
        return 0;
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile float g_peak_sink;

/* Whether vdpbf16ps outruns two FMAs on this core: its throughput differs by CPU (on some it
 * is half the FMA rate per flop, on others nearly twice), and both paths give the same bits,
 * so the faster one is chosen by timing the two register-only loops, best of three (a few
 * milliseconds), once at import. */
static int dp_beats_fma(void)
{
    double dp = 1e30, fma = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = now_s();
        g_peak_sink = fa_k->bfc_dp_peak(20000);           /* 64 flops per instruction */
        t = now_s() - t;
        dp = t < dp ? t : dp;
        t = now_s();
        g_peak_sink = fa_k->gemm_fma_peak(40000);         /* 48 x 16 per step: the same flops */
        t = now_s() - t;
        fma = t < fma ? t : fma;
    }
    return dp < 0.9 * fma;
}

/* Below this many rows a default amx hands the product to the vector path (bf16_fallback):
 * one or two rows (a greedy step of one sequence) stream the weight there at about the
 * memory's speed (the fma path's few-row kernel), while from 3 rows on (a batch's or a beam's
 * decode step) the vector tiles are bound by the FMA rate, and the AMX tiles, with the
 * threads splitting the weight's panels, stream it faster. A forced amx runs every size on
 * the tiles. */
#define BFC_AMX_MIN_ROWS (BFC_FEW_ROWS + 1)

int fa_bfloat16_init(int forced)
{
    clear_pending(PENDING_BF16);
    g.bf16_forced = forced >= 0;
    if (forced >= 0) {
        const int ok = forced_ok(forced, fa_bfloat16_supports, FA_BF16_AMX);
        if (ok != 0) return ok;
        g.bf16 = (fa_bf16_path_t)forced;
        return 0;
    }
    g.bf16_fallback = fa_bfloat16_supports(FA_BF16_AVX512BF16) && dp_beats_fma()
                          ? FA_BF16_AVX512BF16
                          : FA_BF16_FMA;
    g.bf16 = g.bf16_fallback;
    /* the tiles where the CPU has them: several times either vector path on many rows (fewer
     * than BFC_AMX_MIN_ROWS rows stay on the vector path) */
    if (fa_bfloat16_supports(FA_BF16_AMX)) {
        g.bf16 = FA_BF16_AMX;
        set_pending(PENDING_BF16);
    }
    return 0;
}

int fa_bfloat16_path(void)
{
    settle();
    return __atomic_load_n(&g.bf16, __ATOMIC_RELAXED);
}

int fa_bfloat16_path_rows(int64_t N)
{
    const fa_bf16_path_t path = (fa_bf16_path_t)fa_bfloat16_path();
    return path == FA_BF16_AMX && !g.bf16_forced && N < BFC_AMX_MIN_ROWS ? g.bf16_fallback
                                                                         : path;
}

const fa_amx_kernels *fa_paths_bfloat16(int64_t rows, fa_bf16_path_t *path)
{
    *path = (fa_bf16_path_t)fa_bfloat16_path_rows(rows);
#if defined(FA_HAVE_V4)
    if (*path == FA_BF16_AMX_EMULATED) return &fa_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX)
    if (*path == FA_BF16_AMX) return &fa_amx;
#endif
    return NULL;
}

/* ---- bf16 attention -------------------------------------------------------------------------- */

int fa_attention_bf16_supports(int path)
{
    switch (path) {
    case FA_ATT_BF16_FMA:
        return 1;
    case FA_ATT_BF16_DOT:
    case FA_ATT_BF16_DOT_ROWS:
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
        __builtin_cpu_init();
        return g.level >= FA_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
#else
        return 0;
#endif
    case FA_ATT_BF16_AMX:
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX) && defined(ATT_HAVE_BF16_DOT)
        return g.level >= FA_ISA_AVX512 && amx_bf16_usable();
#else
        return 0;
#endif
    case FA_ATT_BF16_AMX_EMULATED:
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
        return g.level >= FA_ISA_AVX512;
#else
        return 0;
#endif
    default:
        return 0;
    }
}

/* Does the CPU have AMX-BF16 tiles (CPUID 7.0 EDX bit 22)? Its cores (Sapphire Rapids and
 * later) run vdpbf16ps below their float32 FMA rate in flops (profiled: the dot path's score
 * and P.V tiles took longer than the fma path's twice as many FMAs), while AMD's Zen 4 and
 * Zen 5 run it near twice the FMA rate. A decode step's one-row pass still gains from it: its
 * fma form rounds every k and v element as it reads them, the dot form converts them with
 * one instruction per 32. */
static int cpu_has_amx_bf16(void) { return (amx_status() & 2) != 0; }

/* Default: the AMX tiles where the CPU has them (the grant pending: DOT_ROWS, or FMA on a CPU
 * without AVX512_BF16, if refused), else vdpbf16ps everywhere where it outruns FMA
 * (AVX512_BF16 without AMX), FMA without AVX512_BF16. */
int fa_attention_bf16_init(int forced)
{
    clear_pending(PENDING_ATT);
    g.att_dot = fa_attention_bf16_supports(FA_ATT_BF16_DOT);
    if (forced >= 0) {
        const int ok = forced_ok(forced, fa_attention_bf16_supports, FA_ATT_BF16_AMX);
        if (ok != 0) return ok;
        g.att = forced;
        return 0;
    }
    if (fa_attention_bf16_supports(FA_ATT_BF16_AMX)) {
        g.att = FA_ATT_BF16_AMX;
        g.att_fallback = g.att_dot ? FA_ATT_BF16_DOT_ROWS : FA_ATT_BF16_FMA;
        set_pending(PENDING_ATT);
        return 0;
    }
    g.att = !g.att_dot           ? FA_ATT_BF16_FMA
          : cpu_has_amx_bf16()   ? FA_ATT_BF16_DOT_ROWS
                                 : FA_ATT_BF16_DOT;
    return 0;
}

int fa_attention_bf16_path(void)
{
    settle();
    return __atomic_load_n(&g.att, __ATOMIC_RELAXED);
}

/* The units a bf16 attention's passes run on (its path settled first) */
fa_att_units fa_paths_attention_bf16(void)
{
    const int path = fa_attention_bf16_path();
    fa_att_units u = {0, 0, 0, NULL};
    u.dot = path == FA_ATT_BF16_DOT;
    /* the one-row pass and the rounding use the AVX512_BF16 instructions wherever the CPU has
     * them (the emulated tiles' path also runs on CPUs without) */
    u.dot_rows = path == FA_ATT_BF16_DOT || path == FA_ATT_BF16_DOT_ROWS ||
                 ((path == FA_ATT_BF16_AMX || path == FA_ATT_BF16_AMX_EMULATED) &&
                  g.att_dot);
    u.cvt = u.dot_rows;
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
    if (path == FA_ATT_BF16_AMX_EMULATED) u.tiles = &fa_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX) && defined(ATT_HAVE_BF16_DOT)
    if (path == FA_ATT_BF16_AMX) u.tiles = &fa_amx;
#endif
    return u;
}
