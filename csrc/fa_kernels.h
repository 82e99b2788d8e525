/* fa_kernels.h -- the kernel tables: what each ISA level, each int8 path and the AMX tiles of
 * the bf16 family compile, and the argument bundles their entries take. Internal to csrc/ (the
 * binding sees fastattn.h).
 *
 * One translation unit per level compiles every *_body.h for that level and exports its table
 * (kernels_generic.c, kernels_avx2.c, kernels_avx512.c, through fa_kernels_isa.h); fa_cpu_init
 * (paths.c) points fa_k at the level in use. The family .c files are compiled once, at the
 * baseline: they split the work over the OpenMP team and call the level's kernels through
 * fa_k. Likewise one translation unit per int8 architecture (quant_<arch>.c) exports its
 * path's table, and bf16_amx.c / bf16_amx_emulated.c the bf16 family's tiles (fa_amx_kernels).
 * Which int8 table and which tiles a call uses, paths.c says (fa_paths.h).
 */
#ifndef FA_KERNELS_H
#define FA_KERNELS_H

#include <string.h>

#include "fa_rng.h"
#include "fastattn.h"

/* ---- argument bundles ----------------------------------------------------------------------- */

struct fa_amx_kernels;

/* The backward's bundle: the call, its gradients, its dropout (decided once) and scratch. */
typedef struct {
    const fa_attention_args *f;   /* the forward's call: its out and lse are read */
    const fa_attention_grads *g;
    const struct fa_amx_kernels *tiles; /* a bf16 call's five products on these tiles, or NULL */
    fa_dropout_t drop;
    float *delta;                 /* (B, H, Lq) scratch: Delta_i = dout_i . out_i */
    /* (B, H, Lq) scratch: P_ij = 2^(s_ij - pref_i) * pinv_i. pref = lse log2 e and pinv = 1 for
     * most rows; a row whose lse float32 cannot hold to the digits P needs (|lse| > ATT_LSE_MAX,
     * e.g. a row masked throughout by -3e38) has its max and sum recomputed instead. */
    float *pref, *pinv;
} fa_att_bwd_args;

/* The constants of one Adam step (optim.c), each computed in double and rounded to float
 * once, as torch does with its Python-float hyper-parameters. */
typedef struct {
    float decay;      /* AdamW: 1 - lr * weight_decay (p *= decay first); Adam: 1 */
    float l2;         /* Adam: weight_decay (g += l2 * p); AdamW: 0 */
    float w1;         /* torch's lerp weight 1 - beta1 (m = lerp(m, g, w1)) */
    float beta2, w2;  /* v = v * beta2 + w2 * g * g, w2 = 1 - beta2 */
    float bc2_sqrt;   /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step;   /* -lr / (1 - beta1^step) */
} adam_consts;

/* ---- scalar helpers compiled once, at the baseline, so that every level gets their bits ---- */

/* attention.c: scores whose base-2 sums pass the float32 range (see there) */
#define ATT_WIDE 0x1p127f
/* The backward forms P = 2^(s - lse log2 e) from the saved lse where |lse| <= ATT_LSE_MAX:
 * float32 holds such an lse to 64 * 2^-24 ~ 4e-6, P's relative error. Rows beyond (a bias of
 * -1e4 on every key, or -3e38) have their max and sum recomputed. */
#define ATT_LSE_MAX 64.0f
float att_wide_score(float s, float kb, float mk);
float att_score_exact(const fa_attention_args *a, int64_t b, int64_t h, int64_t i, int64_t j,
                      float kb, float mk);
/* bf16 rounding of one value as vcvtneps2bf16 rounds (nearest even; a subnormal to +-0; NaN
 * kept, quiet): the scalar form of attention_bf16_body.h's att_bf16, shared with attention.c's
 * exact scores. */
static inline float att_bf16s(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    const uint32_t mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) b = (b | 0x00400000u) & 0xffff0000u;
    else if (mag < 0x00800000u) b &= 0x80000000u;
    else b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &b, 4);
    return x;
}
/* |x| <= ATT_WIDE (not inf, not NaN) for the float bits |x| as an int: bits <= ATT_WIDE_BITS */
#define ATT_WIDE_BITS 0x7f000000
/* The compiler can build vdpbf16ps code (GCC 10, clang 9 on) */
#if (defined(__x86_64__) || defined(__i386__)) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10))
#define ATT_HAVE_BF16_DOT 1
#endif
float att_lse(float m, float l);

/* layernorm.c: the rows whose float32 sums cannot hold their moments, in double. A row whose
 * rstd is below LN_WIDE_RSTD (a standard deviation past ~1e30) takes ln_bwd_row_wide. */
#define LN_WIDE_RSTD 0x1p-100f
void ln_row_wide(float *y_n, float *mean_n, float *rstd_n, const float *s_n,
                 const float *weight, const float *bias, int64_t C, float eps);
void ln_bwd_row_wide(float *dx_n, float *dw_part, float *db_part, const float *dy_n, float mean,
                     float rstd, const float *x_n, const float *r_n, const float *weight,
                     int64_t C);

/* ---- one ISA level ---------------------------------------------------------------------------
 * Each entry is documented where it is defined (the *_body.h files); rows [r0, r1) kernels
 * compute those rows only, the caller splits the rows over threads. */
typedef struct {
    int64_t vector_width, attention_block_q, packed_tile_rows, packed_tile_features,
        softmax_chunk;
} fa_isa_tiles;

/* ---- the AMX tiles of the bf16 family ---------------------------------------------------------
 * bf16 storage's and the bfloat16 compute type's many-row products, bf16 training's products
 * and bf16 attention's two products, on the tiles (bf16_amx.c: fa_amx) or on the same code with
 * every tile instruction emulated in C (bf16_amx_emulated.c: fa_amx_emulated); bf16_amx.h says
 * the layouts. fa_paths_* (paths.c) says which, if any, a call runs on. */
typedef struct fa_amx_kernels {
    /* bf16 storage, more than FA_BF16_PACKED_MAX_ROWS rows; as fa_linear_bf16_forward */
    int (*bf16_forward)(float *y, const float *x, const uint16_t *wp, const float *bias,
                        int64_t N, int64_t K, int64_t M, int activation, int nthreads);
    /* the bfloat16 compute type; as fa_linear_bfloat16_forward, on fa_bfloat16_pack's layout;
     * xb: the input as bf16 bits instead of x (rows of K); yb: the output as bf16 bits instead
     * of y (rows of M, rounded after the epilogue; only where K is one chunk, K <= 32 AMX_KB) */
    int (*bfloat16_forward)(float *y, const float *x, const uint16_t *wp, const float *bias,
                            int64_t N, int64_t K, int64_t M, int activation, int nthreads,
                            const uint16_t *xb, uint16_t *yb);
    /* bf16 training's products: op(B) packed once (aligned_alloc'd, NULL: out of memory), then
     * any number of products with it */
    uint32_t *(*bf16_pack_b)(int trans_b, int64_t K, int64_t N, const float *B, int64_t ldb);
    int (*bf16_gemm_packed)(int trans_a, int64_t M, int64_t N, int64_t K, const float *A,
                            int64_t lda, const uint32_t *bq, float beta, float *C, int64_t ldc);
    /* bf16 attention's scores and P.V of a block of 32 queries */
    void (*att_scores)(float *st, int64_t bq, const float *k, int64_t ksl, int64_t nb,
                       int64_t D, const uint32_t *qp, uint32_t *work);
    void (*att_pv)(float *ot, int64_t bq, int64_t Dv, const float *v, int64_t vsl, int64_t nb,
                   const uint32_t *pp, uint32_t *work);
    /* C (M, N) (row stride ldc floats) += A B: A (M rows of KP words, row stride lda), B (KP
     * rows of N words, row stride ldb), every word a pair of bf16 (the low half first in k),
     * KP a multiple of 16; A's rows up to M and B's columns up to N, each rounded up to 16,
     * are read (the caller zero-pads them). bf16 attention's backward products. */
    void (*pairs_gemm)(float *C, int64_t ldc, int64_t M, int64_t N, int64_t KP,
                       const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb);
    /* the register-only tile loop (fa_peak): `iters` steps of 4 independent TDPBF16PS (int8:
     * TDPBSSD) on this thread; NULL in the emulated unit (its speed means nothing) */
    float (*tile_peak)(int64_t iters, int int8);
} fa_amx_kernels;

extern const fa_amx_kernels fa_amx, fa_amx_emulated;

/* The units a bf16 attention runs on (fa_paths_attention_bf16, from its path), handed by
 * fa_attention_forward to the level's passes; all zero for a float32 attention. The dot and
 * tile fields are set only where the avx512 level can run them. */
typedef struct {
    int dot;        /* the tiled pass multiplies with vdpbf16ps (attention_bf16_body.h) */
    int dot_rows;   /* the one-row pass (decode steps) likewise */
    int cvt;        /* rounding with vcvtneps2bf16 */
    const fa_amx_kernels *tiles; /* the tiled pass's two products on these tiles, or NULL */
} fa_att_units;

/* One float32 product of the GEMM engine (gemm.c, gemm_body.h):
 *   C (M, N) = op(A) (M, K) x B (K, N) (each element one sum in k order from 0); then on each finished
 *   tile the epilogue c = drop(act(product + bias)), the product kept in pre when pre is given
 *   (bias_act_rows' two forms).
 *   a, lda, trans_a  A (M, K) row stride lda, or transposed: A^T given as (K, M), row stride lda
 *   bp               B packed (fa_gemm_pack): panels of FA_PANEL features, all of K
 *   c, ldc           C; pre (may be NULL) has the same row stride
 *   bias (N) may be NULL; act FA_ACT_*; drop may be NULL; row0, col0: the block's place in the
 *   whole activation, for the dropout mask's coordinates. */
typedef struct {
    int64_t M, N, K;
    const float *a;
    int64_t lda;
    int trans_a;
    const float *bp;
    float *c, *pre;
    int64_t ldc;
    const float *bias;
    int act;
    const fa_dropout_t *drop;
    int64_t row0, col0;
} fa_gemm_t;

typedef struct {
    /* attention: whole passes (their tiles, scratch and thread loops follow the level's BQ) */
    int (*attention_forward)(const fa_attention_args *a, const fa_att_units *u, int nthreads);
    int (*attention_backward)(const fa_attention_grads *g, const fa_attention_args *a,
                              const fa_att_units *u,
                              int nthreads);
    void (*layer_norm_rows)(float *y, float *sum_out, float *mean, float *rstd, const float *x,
                            const float *residual, const float *weight, const float *bias,
                            int64_t r0, int64_t r1, int64_t C, float eps);
    void (*layer_norm_backward_rows)(float *dx, float *dw_part, float *db_part, const float *dy,
                                     const float *mean, const float *rstd, const float *x,
                                     const float *residual, const float *weight, int64_t r0,
                                     int64_t r1, int64_t C);
    void (*softmax_rows)(float *y, const float *x, int64_t r0, int64_t r1, int64_t C);
    void (*cross_entropy_rows)(float *losses, float *dlogits, const float *logits,
                               const int64_t *targets, int64_t r0, int64_t r1, int64_t V,
                               int64_t ignore_index, float eps, float scale);
    void (*dropout_rows)(float *y, const float *x, int64_t r0, int64_t r1, int64_t C,
                         const fa_dropout_t *drop);
    /* linear: the GEMM epilogues (the GEMM engine is gemm_block below) */
    void (*bias_act_rows)(float *y, float *pre, const float *bias, int64_t rows, int64_t M,
                          int64_t ld, int act, int64_t row0, int64_t col0,
                          const fa_dropout_t *drop);
    void (*grad_act_rows)(float *dz, float *h, const float *g, const float *pre, int64_t rows,
                          int64_t M, int64_t ld, int act, int64_t row0, int64_t col0,
                          const fa_dropout_t *drop);
    /* the float32 GEMM engine's block on one thread (gemm_body.h; gemm.c drives it) */
    void (*gemm_block)(const fa_gemm_t *g, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
                       int64_t kc);
    float (*gemm_fma_peak)(int64_t iters);   /* 48 FA_VL flops an iteration */
    /* optimiser spans */
    void (*adam_span)(float *param, float *exp_avg, float *exp_avg_sq, const float *grad,
                      int64_t i0, int64_t i1, const adam_consts *k);
    double (*sum_squares)(const float *x, int64_t n);
    void (*scale_span)(float *x, int64_t n, float s);
    /* quantised weights: rows quantised (fmt: Q8_FMT_*), the bf16 few-row GEMM and widening */
    float (*q8_quant_row)(void *dst, const float *x, int64_t K, int64_t Kp, int fmt);
    void (*q8_quant_rows)(int16_t *dst, float *sx, const float *x, int64_t rows, int64_t K,
                          int64_t Kp);
    void (*bf16_packed_gemm)(float *y, int64_t ldy, const float *x, int64_t N,
                             const uint16_t *wp, int64_t p0, int64_t p1, int64_t M, int64_t K);
    void (*bf16_widen_t)(float *dst, const uint16_t *wp, int64_t k0, int64_t k1, int64_t K,
                         int64_t P);
    /* bfloat16 compute: rows rounded (wide: to float32 values, else bf16 bits), one panel on
     * the FMA tiles (rows as float32 values), on the AVX512_BF16 tiles (rows as bits; NULL
     * below AVX-512), and the register-only vdpbf16ps and FMA loops (NULL likewise) */
    void (*bfc_round_row)(void *dst, const float *x, int64_t K, int64_t Kp, int wide);
    void (*bfc_panel)(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                      const uint32_t *w_p, int64_t Kh, int64_t nf, float *wf);
    void (*bfc_panel_dp)(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                         const uint32_t *w_p, int64_t Kh, int64_t nf, float *wf);
    void (*bfc_panels_few)(float *y, int64_t ldy, const void *xr, int64_t ldx, int64_t rows,
                           const uint32_t *wp, int64_t p0, int64_t p1, int64_t Kh, int64_t M);
    float (*bfc_dp_peak)(int64_t iters);
    fa_isa_tiles tiles;
} fa_kernels;

extern const fa_kernels fa_kernels_generic, fa_kernels_avx2, fa_kernels_avx512;

/* y (N, M) = act(0 + bias): a product over K = 0 (empty sums: nothing of the weight is read),
 * for every weight type (quant.c, bf16.c); 0 + bias as the twin computes it (a -0 bias gives
 * +0), the activation by the level isa */
static inline void fa_empty_product(float *y, const float *bias, int64_t N, int64_t M,
                                    int activation, const fa_kernels *isa)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) y[n * M + m] = 0.0f + (bias ? bias[m] : 0.0f);
    isa->bias_act_rows(y, NULL, NULL, N, M, M, activation, 0, 0, NULL);
}
extern const fa_kernels *fa_k;             /* the level in use (fa_cpu_init) */
const fa_kernels *fa_kernels_of(int level); /* NULL: a level this build lacks */

/* ---- one int8 path ---------------------------------------------------------------------------
 * Its layout (np features per panel, K in groups of g: pairs for the int16 pair products,
 * quads for the AMX tiles), its tile height (mr: the quantised rows are allocated in whole
 * tiles), its activations' format and its kernels. */
typedef void (*fa_q8_panel_fn)(float *y, int64_t ldy, const int16_t *x, int64_t ldx,
                               int64_t rows, const int8_t *w_p, const float *sx,
                               const float *scale_p, const float *bias_p, int64_t Kg, int64_t nf,
                               int relu);
typedef struct {
    int64_t np, g, mr;
    const fa_kernels *isa; /* the level whose quantiser and epilogue (bias_act_rows) it uses */
    int fmt;    /* Q8_FMT_I16, or Q8_FMT_HILO (rows past the last zero up to a multiple of mr) */
    int64_t max_block;  /* many rows: at most this many per block (0: Q8_ROW_BLOCK) */
    fa_q8_panel_fn panel;  /* one panel of features for a block of rows: y = act(x w^T + b) */
} fa_q8_kernels;

extern const fa_q8_kernels fa_q8_generic, fa_q8_avx2, fa_q8_avx512bw, fa_q8_avx512vnni,
    fa_q8_avx512vnni_quads, fa_q8_amx, fa_q8_amx_emulated;

/* The products of bf16 training (bf16_gemm.c, for linear.c with its bf16 flag): every value
 * of A and B a bf16 held in a float32, so that any float32 GEMM gives exact products.
 * fa_bf16_b_make packs op(B) (K, N) once for the AMX tiles when the bfloat16 compute type's
 * path for products of `rows` rows is amx (or amx-emulated), and returns NULL otherwise (or out
 * of memory); fa_bf16_b_gemm then gives C (M, N) = beta C +
 * op(A) op(B) (op(A) (M, K), row stride lda, transposed with trans_a; beta 0 or 1), on the
 * tiles with a packed B, with NULL (out of memory) in a plain loop in the engine's order. */
fa_bf16_b *fa_bf16_b_make(int trans_b, int64_t rows, int64_t K, int64_t N, const float *B,
                          int64_t ldb);
void fa_bf16_b_gemm(const fa_bf16_b *bp, int trans_a, int trans_b, int64_t M, int64_t N,
                    int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                    float beta, float *C, int64_t ldc);
void fa_bf16_b_free(fa_bf16_b *bp);
/* B for a product of `rows` rows: `given` (fa_bf16_weight_pack's, packed once per step) where
 * the tiles take such a product, NULL where they do not; with no `given`, fa_bf16_b_make's,
 * left in *own for the caller to free */
const fa_bf16_b *fa_bf16_b_for(const fa_bf16_b *given, int trans_b, int64_t rows, int64_t K,
                               int64_t N, const float *B, int64_t ldb, fa_bf16_b **own);

#endif /* FA_KERNELS_H */
