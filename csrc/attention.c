/* attention.c -- fused, tiled attention forward (flash style: blocks of queries against blocks
 * of keys with an online softmax; the (Lq, Lk) score matrix is never stored) and its backward
 * (the probabilities recomputed block by block from the saved lse). The passes are in
 * attention_body.h, compiled for each ISA level; this file holds the entry points and the
 * scalar helpers every level shares. */
#include <float.h>
#include <math.h>

#include "fa_kernels.h"

/* ---- masks, scores and the float32 range ----------------------------------------------------
 * A key is hidden from a query by the causal rule, by a bool True (a -inf bias) in either mask,
 * or by a -inf in a float mask: its score is -inf whatever q.k is, and its k and v rows take no
 * part in that query's output or gradients (a NaN or inf in them stays out). Every other mask
 * value is added to the score, as torch does: a finite value never hides a key, however large
 * (torch.finfo(float32).min, Hugging Face's masked value, gives a key a weight of 0 next to an
 * unmasked key, and a row masked that way throughout averages its values).
 *
 * Scores run in base 2 (times log2 e), where a sum of finite values can pass the float32 range
 * (finfo.min * log2 e alone does). A score with |x| > ATT_WIDE is recomputed in double and
 * compressed: x -> sign(x) (2^127 + (|x| - 2^127) / 8), which keeps every sum of a float32 score
 * and two float32 masks finite (|x| < 1.4e39 before, < 3.2e38 after) and in order; the
 * differences that decide a weight there are astronomically larger than exp2's range, so
 * weights keep their meaning (two such sums closer than ~8 float32 ulps may tie). att_lse undoes
 * the compression for the log-sum-exp. */

/* s (base 2) + (kb + mk) log2 e for a key no mask hides, |result| > ATT_WIDE or NaN (the
 * caller's float sum went out of range): the same sum in double, compressed as above. inf or
 * NaN in (NaN, +inf masks or scores) gives inf or NaN, as the float sum does. */
float att_wide_score(float s, float kb, float mk)
{
    const double x = (double)s + ((double)kb + (double)mk) * 1.4426950408889634;
    if (!isfinite(x)) return (float)x;
    const double ax = fabs(x), w = (double)ATT_WIDE;
    return (float)copysign(ax > w ? w + (ax - w) / 8.0 : ax, x);
}

/* The log-sum-exp of a row (natural units) from its running max m (base 2, compressed as
 * above) and sum l > 0: (m + log2 l) ln 2, undoing the compression; a finite result beyond the
 * float32 range is clamped to +-FLT_MAX (the row sees a key: -inf means none). */
float att_lse(float m, float l)
{
    if (fabsf(m) <= ATT_WIDE) return (m + log2f(l)) * 0.6931471805599453f;
    const double y = (double)m + log2((double)l), ay = fabs(y), w = (double)ATT_WIDE;
    const double lse = copysign(ay > w ? w + (ay - w) * 8.0 : ay, y) * 0.6931471805599453;
    if (!isfinite(lse)) return (float)lse;
    return lse > FLT_MAX ? FLT_MAX : lse < -FLT_MAX ? -FLT_MAX : (float)lse;
}

/* ---- bf16 attention's path ----------------------------------------------------------------- */

int fa_att_bf16_dot = 0, fa_att_bf16_dot_rows = 0, fa_att_bf16_cvt = 0;
const fa_q8_kernels *fa_att_tiles = NULL;
static int g_att_path = FA_ATT_BF16_FMA;
static int g_att_pending = 0;   /* 1: amx chosen by default, the tile permission not asked yet */

int fa_attention_bf16_supports(int path)
{
    switch (path) {
    case FA_ATT_BF16_FMA:
        return 1;
    case FA_ATT_BF16_DOT:
    case FA_ATT_BF16_DOT_ROWS:
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
        __builtin_cpu_init();
        return fa_cpu_level() >= FA_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
#else
        return 0;
#endif
    case FA_ATT_BF16_AMX:
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX) && defined(ATT_HAVE_BF16_DOT)
        return fa_cpu_level() >= FA_ISA_AVX512 && fa_amx_bf16_usable();
#else
        return 0;
#endif
    case FA_ATT_BF16_AMX_EMULATED:
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
        return fa_cpu_level() >= FA_ISA_AVX512;
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
static int cpu_has_amx_bf16(void) { return (fa_amx_status() & 2) != 0; }

static void att_set_path(int path)
{
    g_att_path = path;
    fa_att_bf16_dot = path == FA_ATT_BF16_DOT;
    /* the one-row pass and the rounding use the AVX512_BF16 instructions wherever the CPU has
     * them (the emulated tiles' path also runs on CPUs without) */
    fa_att_bf16_dot_rows = path == FA_ATT_BF16_DOT || path == FA_ATT_BF16_DOT_ROWS ||
                           ((path == FA_ATT_BF16_AMX || path == FA_ATT_BF16_AMX_EMULATED) &&
                            fa_attention_bf16_supports(FA_ATT_BF16_DOT));
    fa_att_bf16_cvt = fa_att_bf16_dot_rows;
    const fa_q8_kernels *tiles = NULL;
#if defined(FA_HAVE_V4) && defined(ATT_HAVE_BF16_DOT)
    if (path == FA_ATT_BF16_AMX_EMULATED) tiles = &fa_q8_amx_emulated;
#endif
#if defined(FA_HAVE_V4) && defined(FA_HAVE_AMX) && defined(ATT_HAVE_BF16_DOT)
    if (path == FA_ATT_BF16_AMX) tiles = &fa_q8_amx;
#endif
    fa_att_tiles = tiles;
}

/* Default: the AMX tiles where the CPU has them (the permission asked for at the first bf16
 * attention: fa_att_tiles_ready), else vdpbf16ps everywhere where it outruns FMA (AVX512_BF16 without
 * AMX), FMA without AVX512_BF16. */
int fa_attention_bf16_init(int forced)
{
    g_att_pending = 0;
    if (forced >= 0) {
        if (!fa_attention_bf16_supports(forced)) return -1;
        if (forced == FA_ATT_BF16_AMX && !fa_amx_grant()) return -2;
        att_set_path(forced);
        return 0;
    }
    if (fa_attention_bf16_supports(FA_ATT_BF16_AMX)) {
        att_set_path(FA_ATT_BF16_AMX);
        g_att_pending = 1;
        return 0;
    }
    att_set_path(!fa_attention_bf16_supports(FA_ATT_BF16_DOT) ? FA_ATT_BF16_FMA
                 : cpu_has_amx_bf16()                         ? FA_ATT_BF16_DOT_ROWS
                                                              : FA_ATT_BF16_DOT);
    return 0;
}

/* A default amx asks Linux for the tile data here, at the first bf16 attention (not at
 * import: a process that never uses it is not changed), and falls back to DOT_ROWS (FMA on a
 * CPU without AVX512_BF16) if refused. Concurrent first calls may both ask; the request is
 * idempotent. */
const fa_q8_kernels *fa_att_tiles_ready(void)
{
    if (__atomic_load_n(&g_att_pending, __ATOMIC_ACQUIRE)) {
        if (!fa_amx_grant())
            att_set_path(fa_attention_bf16_supports(FA_ATT_BF16_DOT) ? FA_ATT_BF16_DOT_ROWS
                                                                     : FA_ATT_BF16_FMA);
        __atomic_store_n(&g_att_pending, 0, __ATOMIC_RELEASE);
    }
    return fa_att_tiles;
}

int fa_attention_bf16_path(void)
{
    fa_att_tiles_ready();                   /* a default amx settled, as fa_bfloat16_path */
    return g_att_path;
}

int fa_attention_forward(const fa_attention_args *a, int nthreads)
{
    if (a->bf16) fa_att_tiles_ready();    /* before the threads read fa_att_tiles */
    return fa_k->attention_forward(a, nthreads);
}

int fa_attention_backward(const fa_attention_grads *g, const fa_attention_args *a, int nthreads)
{
    return fa_k->attention_backward(g, a, nthreads);
}
