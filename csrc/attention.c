/* attention.c -- fused, tiled attention forward (flash style: blocks of queries against blocks
 * of keys with an online softmax; the (Lq, Lk) score matrix is never stored) and its backward
 * (the probabilities recomputed block by block from the saved lse). The per-ISA bodies are in
 * attention_body.h; this file holds the argument bundles, the instantiation and the thread
 * loops. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fa_rng.h"
#include "fastattn.h"

typedef struct {
    float *out, *lse, *weights;
    const float *q, *k, *v, *mask, *key_bias;
    int64_t B, H, Lq, Lk, D, Dv;
    int64_t qs[3], ks[3], vs[3], os[3], ms[4];
    float scale;
    int causal;
    /* dropout on the weights: none when !dropout; else weight (row, j) is kept iff
     * fa_rng_keep(fa_rng_row_key(seed, row), j, drop_thr), and kept ones are scaled by
     * drop_scale = 1 / (1 - p); row = (b * H + h) * Lq + i */
    int dropout;
    uint32_t drop_thr;
    float drop_scale;
    uint64_t seed;
} fa_att_args;

/* The backward's bundle: the forward's inputs (f.out, f.lse, f.weights unused) and its own. */
typedef struct {
    fa_att_args f;
    float *dq, *dk, *dv;
    const float *dout, *out, *lse;
    float *delta;                 /* (B, H, Lq) scratch: Delta_i = dout_i . out_i */
    /* (B, H, Lq) scratch: P_ij = 2^(s_ij - pref_i) * pinv_i. pref = lse log2 e and pinv = 1 for
     * most rows; a row whose lse float32 cannot hold to the digits P needs (|lse| > ATT_LSE_MAX,
     * e.g. a row masked throughout by -3e38) has its max and sum recomputed instead. */
    float *pref, *pinv;
    int64_t dqs[3], dks[3], dvs[3], dos[3], fos[3];
} fa_att_bwd_args;

/* One thread's view of one key block in the backward (carved from its scratch buffer). */
typedef struct {
    float *kt, *vt, *kr, *dkt, *dvt, *pt, *ds, *kbias;
    int64_t jb, nb, Dp;
    int kbad; /* a key row of the block (kr) holds inf or NaN */
} fa_att_bwd_blk;

static void set_dropout(fa_att_args *a, double dropout_p, uint64_t seed)
{
    a->dropout = dropout_p > 0.0;
    a->drop_thr = a->dropout ? fa_rng_threshold(dropout_p) : 0u;
    a->drop_scale = a->dropout ? (float)(1.0 / (1.0 - dropout_p)) : 1.0f;
    a->seed = seed;
}

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
#define ATT_WIDE 0x1p127f
/* The backward forms P = 2^(s - lse log2 e) from the saved lse where |lse| <= ATT_LSE_MAX:
 * float32 holds such an lse to 64 * 2^-24 ~ 4e-6, P's relative error. Rows beyond (a bias of
 * -1e4 on every key, or -3e38) have their max and sum recomputed. */
#define ATT_LSE_MAX 64.0f

/* s (base 2) + (kb + mk) log2 e for a key no mask hides, |result| > ATT_WIDE or NaN (the
 * caller's float sum went out of range): the same sum in double, compressed as above. inf or
 * NaN in (NaN, +inf masks or scores) gives inf or NaN, as the float sum does. */
static float att_wide_score(float s, float kb, float mk)
{
    const double x = (double)s + ((double)kb + (double)mk) * 1.4426950408889634;
    if (!isfinite(x)) return (float)x;
    const double ax = fabs(x), w = (double)ATT_WIDE;
    return (float)copysign(ax > w ? w + (ax - w) / 8.0 : ax, x);
}

/* The log-sum-exp of a row (natural units) from its running max m (base 2, compressed as
 * above) and sum l > 0: (m + log2 l) ln 2, undoing the compression; a finite result beyond the
 * float32 range is clamped to +-FLT_MAX (the row sees a key: -inf means none). */
static float att_lse(float m, float l)
{
    if (fabsf(m) <= ATT_WIDE) return (m + log2f(l)) * 0.6931471805599453f;
    const double y = (double)m + log2((double)l), ay = fabs(y), w = (double)ATT_WIDE;
    const double lse = copysign(ay > w ? w + (ay - w) * 8.0 : ay, y) * 0.6931471805599453;
    if (!isfinite(lse)) return (float)lse;
    return lse > FLT_MAX ? FLT_MAX : lse < -FLT_MAX ? -FLT_MAX : (float)lse;
}

/* Is key j hidden from query i of head (b, h)? (causal, or -inf in either mask) */
static int att_hidden(const fa_att_args *a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (a->causal && j > i + (a->Lk - a->Lq)) return 1;
    if (a->key_bias && a->key_bias[b * a->Lk + j] == -INFINITY) return 1;
    return a->mask &&
           a->mask[b * a->ms[0] + h * a->ms[1] + i * a->ms[2] + j * a->ms[3]] == -INFINITY;
}

/* Are the n floats of x all finite? */
static int att_finite(const float *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t e = 0; e < n; e++) acc += x[e] * 0.0f; /* 0 unless some x is inf or NaN */
    return acc == 0.0f;
}

#define FA_BODY "attention_body.h"
#include "fa_instantiate.h"

typedef void (*att_task_fn)(const fa_att_args *, int64_t, int64_t, int64_t, float *);
typedef void (*att_row_fn)(const fa_att_args *, int64_t, int64_t, int64_t, float *);
/* Forward task t of B * H * nqb (head by head, each head's query blocks last first): one query
 * row (rows) or one block of queries. */
static void attention_forward_task(const fa_att_args *a, int rows, att_row_fn row,
                                   att_task_fn task, int64_t nqb, int64_t t, float *scratch)
{
    const int64_t qb = nqb - 1 - t % nqb, bh = t / nqb;
    (rows ? row : task)(a, bh / a->H, bh % a->H, qb, scratch);
}

typedef void (*att_bwd_keys_fn)(const fa_att_bwd_args *, int64_t, int64_t, int64_t, int64_t, int,
                                float *);
typedef void (*att_bwd_queries_fn)(const fa_att_bwd_args *, int64_t, int64_t, int64_t, float *);
typedef void (*att_bwd_delta_fn)(const fa_att_bwd_args *, int64_t, int64_t, float *);

int fa_attention_forward(float *out, float *lse, float *weights,
                          const float *q, const float *k, const float *v,
                          const float *mask, const float *key_bias,
                          int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv,
                          const int64_t *q_st, const int64_t *k_st, const int64_t *v_st,
                          const int64_t *out_st, const int64_t *mask_st,
                          float scale, int causal, double dropout_p, uint64_t seed,
                          int nthreads)
{
    fa_att_args a = {out, lse, weights, q, k, v, mask, key_bias, B, H, Lq, Lk, D, Dv,
                     {q_st[0], q_st[1], q_st[2]}, {k_st[0], k_st[1], k_st[2]},
                     {v_st[0], v_st[1], v_st[2]}, {out_st[0], out_st[1], out_st[2]},
                     {0, 0, 0, 0}, scale, causal, 0, 0u, 1.0f, 0u};
    if (mask)
        for (int i = 0; i < 4; i++) a.ms[i] = mask_st[i];
    set_dropout(&a, dropout_p, seed);
    if (B <= 0 || H <= 0 || Lq <= 0) return 0;

    const int64_t bq = FA_DISPATCH(attention_block_q_)();
    /* Few queries: one row at a time along the head dim; else query blocks along the lanes. */
    const int rows = Lq * ATT_ROWS_DIV <= bq;
    const int64_t scratch = rows ? FA_DISPATCH(attention_rows_scratch_)(Lk)
                                 : FA_DISPATCH(attention_scratch_)(D, Dv);
    const att_task_fn task = FA_DISPATCH(attention_task_);
    const att_row_fn row = FA_DISPATCH(attention_rows_);
    const int64_t nqb = rows ? Lq : (Lq + bq - 1) / bq, ntasks = B * H * nqb;
    const double flops = 4.0 * (double)(B * H) * (double)Lq * (double)Lk * (double)(D + Dv) / 2;
    const int nt = fa_team_size(nthreads < ntasks ? nthreads : (int)ntasks, flops, 2e5);

    float *buf = malloc((size_t)(scratch * nt) * sizeof(float));
    if (!buf) return -1;

    /* Causal tasks grow with the query block: hand out the heavy (late) blocks first. A team
     * of one runs them without an OpenMP region (see fa_team_size). */
    if (nt <= 1) {
        for (int64_t t = 0; t < ntasks; t++)
            attention_forward_task(&a, rows, row, task, nqb, t, buf);
    } else {
#pragma omp parallel num_threads(nt)
        {
            float *mine = buf + scratch * fa_thread_id(); /* id < team <= nt buffers */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < ntasks; t++)
                attention_forward_task(&a, rows, row, task, nqb, t, mine);
        }
    }
    free(buf);
    return 0;
}

int fa_attention_backward(float *dq, float *dk, float *dv,
                          const float *dout, const float *out, const float *lse,
                          const float *q, const float *k, const float *v,
                          const float *mask, const float *key_bias,
                          int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv,
                          const int64_t *dq_st, const int64_t *dk_st, const int64_t *dv_st,
                          const int64_t *dout_st, const int64_t *out_st,
                          const int64_t *q_st, const int64_t *k_st, const int64_t *v_st,
                          const int64_t *mask_st, float scale, int causal, double dropout_p,
                          uint64_t seed, int nthreads)
{
    fa_att_bwd_args a;
    memset(&a, 0, sizeof a);
    a.f = (fa_att_args){NULL, NULL, NULL, q, k, v, mask, key_bias, B, H, Lq, Lk, D, Dv,
                        {q_st[0], q_st[1], q_st[2]}, {k_st[0], k_st[1], k_st[2]},
                        {v_st[0], v_st[1], v_st[2]}, {0, 0, 0}, {0, 0, 0, 0}, scale, causal,
                        0, 0u, 1.0f, 0u};
    if (mask)
        for (int i = 0; i < 4; i++) a.f.ms[i] = mask_st[i];
    set_dropout(&a.f, dropout_p, seed);
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.dout = dout;
    a.out = out;
    a.lse = lse;
    for (int i = 0; i < 3; i++) {
        a.dqs[i] = dq_st[i];
        a.dks[i] = dk_st[i];
        a.dvs[i] = dv_st[i];
        a.dos[i] = dout_st[i];
        a.fos[i] = out_st[i];
    }
    if (B <= 0 || H <= 0) return 0;

    const int64_t kb = FA_DISPATCH(attention_block_q_)(), BH = B * H;
    const int64_t nkb = (Lk + kb - 1) / kb, nqb = (Lq + ATT_BWD_BR - 1) / ATT_BWD_BR;
    const int64_t scratch = FA_DISPATCH(attention_bwd_scratch_)(D, Dv);
    att_bwd_keys_fn keys = FA_DISPATCH(attention_bwd_keys_);
    att_bwd_queries_fn queries = FA_DISPATCH(attention_bwd_queries_);
    att_bwd_delta_fn delta = FA_DISPATCH(attention_bwd_delta_);
    /* five products of (rows x keys x head dim), half of them under the causal rule */
    const double flops = 5.0 * (double)BH * (double)Lq * (double)Lk * (double)(D + Dv) /
                         (causal ? 2.0 : 1.0);
    const int nt = fa_team_size(nthreads, flops, 2e5);
    /* Split when the (batch, head) tasks are too few for the team: a head per thread costs 5
     * products per head; the split, 7 (dq's pass recomputes S and dP') spread over every thread. */
    const int64_t per = (BH + nt - 1) / nt;
    const int split = nt > 1 && 5 * per * nt > 7 * BH;

    a.delta = malloc((size_t)(BH * Lq > 0 ? 3 * BH * Lq : 1) * sizeof(float));
    float *buf = malloc((size_t)(scratch * nt) * sizeof(float));
    if (!a.delta || !buf) {
        free(a.delta);
        free(buf);
        return -1;
    }
    a.pref = a.delta + BH * Lq;
    a.pinv = a.pref + BH * Lq;

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *mine = buf + scratch * fa_thread_id(); /* id < team <= nt buffers */
        int64_t lo, hi;
        fa_split(BH * Lq, 16, &lo, &hi);
        delta(&a, lo, hi, mine);
#pragma omp barrier
        if (!split) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH; t++)
                keys(&a, t / H, t % H, 0, nkb, 1, mine);
        } else {
            /* causal: early key blocks and late query blocks carry the most rows; hand them
             * out first, across every head */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH * nkb; t++) {
                const int64_t blk = t / BH, bh = t % BH;
                keys(&a, bh / H, bh % H, blk, blk + 1, 0, mine);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < BH * nqb; t++) {
                const int64_t qb = nqb - 1 - t / BH, bh = t % BH;
                queries(&a, bh / H, bh % H, qb, mine);
            }
        }
    }
    free(buf);
    free(a.delta);
    return 0;
}
