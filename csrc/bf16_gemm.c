/* bf16_gemm.c -- bf16 training's products on the AMX tiles (linear.c with its bf16 flag): every
 * value of both operands a bf16 held in a float32, so that any float32 GEMM gives exact
 * products. Where the bfloat16 compute type's path (paths.c) puts a product of that many rows
 * on the tiles, op(B) is packed once for them (bf16_amx.h) and the products run there; the
 * other paths' products run on the float32 engine, called by linear.c itself. Out of memory
 * for the tiles' pack, a plain loop in the engine's order. Below linear.c: it calls only the
 * tiles. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fa_paths.h"

struct fa_bf16_b {
    const fa_amx_kernels *tiles; /* the tiles it was packed for (real or emulated) */
    uint32_t *bq;
};

fa_bf16_b *fa_bf16_b_make(int trans_b, int64_t rows, int64_t K, int64_t N, const float *B,
                          int64_t ldb)
{
    if (rows <= 0 || K <= 0 || N <= 0) return NULL;
    fa_bf16_path_t path;
    const fa_amx_kernels *tiles = fa_paths_bfloat16(rows, &path);
    if (!tiles) return NULL;
    fa_bf16_b *bp = malloc(sizeof *bp);
    if (!bp) return NULL;
    bp->tiles = tiles;
    bp->bq = tiles->bf16_pack_b(trans_b, K, N, B, ldb);
    if (!bp->bq) {
        free(bp);
        return NULL;
    }
    return bp;
}

void fa_bf16_b_gemm(const fa_bf16_b *bp, int trans_a, int trans_b, int64_t M, int64_t N,
                    int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float beta, float *C, int64_t ldc)
{
    if (bp && M > 0 &&
        bp->tiles->bf16_gemm_packed(trans_a, M, N, K, A, lda, bp->bq, beta, C, ldc) == 0)
        return;
    /* no tiles (out of memory): the engine's order, unpacked and allocating nothing, one fma
     * chain per element from 0 in k order, then added to C with beta */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc = fmaf(trans_a ? A[k * lda + i] : A[i * lda + k],
                           trans_b ? B[j * ldb + k] : B[k * ldb + j], acc);
            C[i * ldc + j] = beta != 0.0f ? C[i * ldc + j] + acc : acc;
        }
}

void fa_bf16_b_free(fa_bf16_b *bp)
{
    if (!bp) return;
    free(bp->bq);
    free(bp);
}

const fa_bf16_b *fa_bf16_b_for(const fa_bf16_b *given, int trans_b, int64_t rows, int64_t K,
                               int64_t N, const float *B, int64_t ldb, fa_bf16_b **own)
{
    *own = NULL;
    if (!given) return *own = fa_bf16_b_make(trans_b, rows, K, N, B, ldb);
    fa_bf16_path_t path;
    return fa_paths_bfloat16(rows, &path) ? given : NULL;
}

fa_bf16_b *fa_bf16_weight_pack(const float *w, int64_t M, int64_t K, int trans)
{
    /* as many rows as the tiles' path ever takes */
    return trans ? fa_bf16_b_make(1, INT64_MAX, K, M, w, K)
                 : fa_bf16_b_make(0, INT64_MAX, M, K, w, K);
}

void fa_bf16_weight_free(fa_bf16_b *packed) { fa_bf16_b_free(packed); }

