/* attention.c -- fused, tiled attention forward (flash style: blocks of queries against blocks
 * of keys with an online softmax; the (Lq, Lk) score matrix is never stored). The per-ISA body is
 * attention_body.h; this file holds the argument bundle, the instantiation and the thread loop. */
#include <math.h>
#include <stdlib.h>

#include "fastattn.h"

typedef struct {
    float *out, *lse, *weights;
    const float *q, *k, *v, *mask, *key_bias;
    int64_t B, H, Lq, Lk, D, Dv;
    int64_t qs[3], ks[3], vs[3], os[3], ms[4];
    float scale;
    int causal;
} fa_att_args;

#define FA_BODY "attention_body.h"
#include "fa_instantiate.h"

typedef void (*att_task_fn)(const fa_att_args *, int64_t, int64_t, int64_t, float *);
typedef void (*att_row_fn)(const fa_att_args *, int64_t, int64_t, int64_t, float *);

int fa_attention_forward(float *out, float *lse, float *weights,
                          const float *q, const float *k, const float *v,
                          const float *mask, const float *key_bias,
                          int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv,
                          const int64_t *q_st, const int64_t *k_st, const int64_t *v_st,
                          const int64_t *out_st, const int64_t *mask_st,
                          float scale, int causal, int nthreads)
{
    fa_att_args a = {out, lse, weights, q, k, v, mask, key_bias, B, H, Lq, Lk, D, Dv,
                     {q_st[0], q_st[1], q_st[2]}, {k_st[0], k_st[1], k_st[2]},
                     {v_st[0], v_st[1], v_st[2]}, {out_st[0], out_st[1], out_st[2]},
                     {0, 0, 0, 0}, scale, causal};
    if (mask)
        for (int i = 0; i < 4; i++) a.ms[i] = mask_st[i];
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

#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *mine = buf + scratch * fa_thread_id(); /* id < team <= nt buffers */
        /* Causal tasks grow with the query block: hand out the heavy (late) blocks first. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntasks; t++) {
            const int64_t qb = nqb - 1 - t % nqb, bh = t / nqb;
            if (rows)
                row(&a, bh / H, bh % H, qb, mine);
            else
                task(&a, bh / H, bh % H, qb, mine);
        }
    }
    free(buf);
    return 0;
}
