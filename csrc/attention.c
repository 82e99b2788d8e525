/* attention.c -- fused, tiled attention forward (flash style: blocks of queries against blocks
 * of keys with an online softmax; the (Lq, Lk) score matrix is never stored) and its backward
 * (the probabilities recomputed block by block from the saved lse). The passes are in
 * attention_body.h, compiled for each ISA level; this file holds the entry points (a bf16
 * call's units from paths.c handed to the level's pass) and the scalar helpers every level
 * shares. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fa_paths.h"

/* ---- masks, scores and the float32 range ----------------------------------------------------
 * A key is hidden from a query by the causal rule, by a bool True (a -inf bias) in either mask,
 * or by a -inf in a float mask: its score is -inf whatever q.k is, and its k and v rows take no
 * part in that query's output or gradients (a NaN or inf in them stays out). Every other mask
 * value is added to the score, as torch does: a finite value never hides a key, however large
 * (torch.finfo(float32).min, Hugging Face's masked value, gives a key a weight of 0 next to an
 * unmasked key, and a row masked that way throughout averages its values).
 *
 * Scores run in base 2 (times log2 e), where a sum of finite values can pass the float32 range
 * (finfo.min * log2 e alone does, and so does q . k * scale alone past FLT_MAX / log2 e ~ 2.4e38,
 * reachable with a head dim of 1 or 2; q . k or q * scale * log2 e can also overflow on the way
 * to a finite score). Every stored score with |x| > ATT_WIDE, and every one whose float32
 * forming gave inf or NaN, is recomputed in double (att_score_exact from q and k, or
 * att_wide_score from a stored score and the masks) and compressed: x -> sign(x) (2^127 + (|x| - 2^127) / 8), which keeps every sum of a float32 score
 * and two float32 masks finite (|x| < 1.4e39 before, < 3.2e38 after) and in order; the
 * differences that decide a weight there are astronomically larger than exp2's range, so
 * weights keep their meaning (two such sums closer than ~8 float32 ulps may tie). att_lse undoes
 * the compression for the log-sum-exp. */

/* x (base 2, double) compressed as above and rounded to float, clamped to +-FLT_MAX (a sum past
 * ~1.4e39, from a score beyond the float32 range, keeps its sign and order up to there); inf
 * and NaN are kept. */
static float att_compress(double x)
{
    if (!isfinite(x)) return (float)x;
    const double ax = fabs(x), w = (double)ATT_WIDE;
    const double c = ax > w ? w + (ax - w) / 8.0 : ax;
    return (float)copysign(c < (double)FLT_MAX ? c : (double)FLT_MAX, x);
}

/* A stored base-2 score back to its value: the inverse of att_compress (inf and NaN kept). */
static double att_decompress(float s)
{
    const double as = fabs((double)s), w = (double)ATT_WIDE;
    return as > w ? copysign(w + (as - w) * 8.0, (double)s) : (double)s;
}

/* s (a stored base-2 score, compressed when |s| > ATT_WIDE) + (kb + mk) log2 e for a key no
 * mask hides, where the float sum went out of range (or s is wide, or NaN): the same sum in
 * double, compressed as above. inf or NaN in (NaN, +inf masks or scores) gives inf or NaN, as
 * the float sum does. */
float att_wide_score(float s, float kb, float mk)
{
    return att_compress(att_decompress(s) + ((double)kb + (double)mk) * 1.4426950408889634);
}


/* Score of query i and key j of head (b, h), base 2, with the key's biases kb and mk (natural
 * units; neither -inf) added, from q and k in double and compressed as above: for a score the
 * float32 passes could not form (|q . k scale log2 e| past ATT_WIDE, or an inf or NaN that a
 * product or sum of finite values overflowed to). q . k of finite values is exact in double
 * for D = 1 and rounded once per term otherwise; bf16: of the rounded q and k. inf or NaN in q
 * or k gives inf or NaN, as the twin's float64 scores do. */
float att_score_exact(const fa_attention_args *a, int64_t b, int64_t h, int64_t i, int64_t j,
                      float kb, float mk)
{
    const float *q_i = a->q + b * a->q_st[0] + h * a->q_st[1] + i * a->q_st[2];
    const float *k_j = a->k + b * a->k_st[0] + h * a->k_st[1] + j * a->k_st[2];
    double dot = 0.0;
    for (int64_t d = 0; d < a->D; d++)
        dot += a->bf16 ? (double)att_bf16s(q_i[d]) * (double)att_bf16s(k_j[d])
                       : (double)q_i[d] * (double)k_j[d];
    return att_compress(dot * (double)a->scale * 1.4426950408889634 +
                        ((double)kb + (double)mk) * 1.4426950408889634);
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

/* ---- entry points --------------------------------------------------------------------------- */

int fa_attention_forward(const fa_attention_args *a, int nthreads)
{
    /* a bf16 call's units (paths.c), its path settled before the threads start */
    static const fa_att_units none = {0, 0, 0, NULL};
    const fa_att_units u = a->bf16 ? fa_paths_attention_bf16() : none;
    return fa_k->attention_forward(a, &u, nthreads);
}

int fa_attention_backward(const fa_attention_grads *g, const fa_attention_args *a, int nthreads)
{
    /* a bf16 call's units: its tiles, if any, take the backward's products too */
    static const fa_att_units none = {0, 0, 0, NULL};
    const fa_att_units u = a->bf16 ? fa_paths_attention_bf16() : none;
    return fa_k->attention_backward(g, a, &u, nthreads);
}
