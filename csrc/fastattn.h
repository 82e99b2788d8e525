/* fastattn.h -- THE contract: every exported kernel, with the shape and layout of each argument.
 *
 * Dimension letters (same legend as fastattn/reference.py):
 *   B batch   H heads   Lq / Lk query / key length   D head dim   Dv value dim
 *   C d_model (or any last axis)   F d_ff   K in-features   M out-features   N flattened rows
 * Data: float32; sizes, offsets and strides are int64_t and counted in elements, not bytes.
 * Argument order: outputs, saved-for-backward buffers, inputs, parameters, sizes, scalars/flags.
 * `nthreads` is resolved once in Python and passed down; kernels never read the environment.
 * It is an upper bound: work is split over the team OpenMP actually starts, which may be smaller
 * (OMP_THREAD_LIMIT, OMP_DYNAMIC), through fa_split / `omp for` (fa_common.h).
 * The C layer trusts its callers: fastattn/ops.py validates every shape before calling.
 * Any size may be 0; a pointer to an array without elements may be NULL (the binding passes
 * NULL for them) and is never read or written.
 */
#ifndef FASTATTN_H
#define FASTATTN_H

#include <stdint.h>

#include "fa_common.h"

/* ---- runtime: ISA dispatch, threads ------------------------------------------------------------ */

/* fa_cpu_init -- pick the SIMD level once (called at import).
 *   forced  -1 = best the CPU and the build support; else a fa_isa_t to force.
 *   Returns 0, or -1 if `forced` is not supported by this CPU or this build (level unchanged). */
int fa_cpu_init(int forced);
int fa_cpu_supports(int level);     /* 1 if this CPU and this build can run `level` */
int fa_openmp_enabled(void);        /* 1 if built with OpenMP */
int fa_max_threads(void);           /* omp_get_max_threads(), 1 without OpenMP */
/* 1 in a process forked after its parent (or an ancestor) started an OpenMP team: GNU libgomp
 * cannot start a team there, so every kernel runs on one thread (fa_common.h, fa_team_allowed) */
int fa_forked_after_team(void);
const char *fa_build_compiler(void); /* compiler name and version the extension was built with */
int fa_build_native(void);           /* 1 for a FASTATTN_NATIVE=1 (-march=native) build */
int fa_build_debug(void);            /* 1 for a FASTATTN_DEBUG=1 (-O0 -g) build */
int fa_build_sanitize(void);         /* 1 for a FASTATTN_SANITIZE=1 (ASan + UBSan) build */

/* fa_build_tiles -- the tile sizes and few-row thresholds (csrc/fa_tiles.h) of level `isa`.
 *   out  (FA_TILE_COUNT)  out; entry i is the size named by fa_tile_t value i
 *   Returns 0, or -1 if this build has no such level. For build_info()["tiles"]: tests read
 *   the tile edges from here instead of copying the numbers. */
typedef enum {
    FA_TILE_VECTOR_WIDTH,          /* floats per SIMD vector */
    FA_TILE_ATTENTION_BLOCK_Q,     /* queries per attention tile (BQ) */
    FA_TILE_ATTENTION_BLOCK_K,     /* keys per attention block (BK) */
    FA_TILE_ATTENTION_ROWS_MAX_Q,  /* up to this Lq, attention takes one query row at a time */
    FA_TILE_ATTENTION_BACKWARD_BLOCK_Q, /* query rows per attention-backward block (its keys
                                          come in blocks of BQ) */
    FA_TILE_SOFTMAX_CHUNK,         /* floats per softmax running-max update (vector tail below) */
    FA_TILE_PACKED_PANEL,          /* features per packed weight panel */
    FA_TILE_PACKED_TILE_ROWS,      /* rows per packed-GEMM register tile */
    FA_TILE_PACKED_TILE_FEATURES,  /* features per packed-GEMM register tile */
    FA_TILE_ROW_BLOCK,             /* bf16 training on the tiles: rows per block, at most */
    FA_TILE_FEATURE_ALIGN,         /* bias sums: feature slices start on multiples of this */
    FA_TILE_REDUCE_ROWS,           /* dweight/dbias: rows per partial sum (fixed-order total) */
    FA_TILE_COUNT
} fa_tile_t;
int fa_build_tiles(int isa, int64_t *out);
/* The float32 GEMM engine's blocking at level isa (gemm.c): out[0..3] = the L1d, L2 and L3
 * sizes it read (bytes), its K block; returns the count (4), or -1 for a level this build
 * lacks */
int fa_gemm_info(int isa, int64_t *out);

/* ---- where the backward passes go --------------------------------------------------------------
 * Each family's backward kernel sits beside its forward (DESIGN: "a backward pass sits beside
 * its forward"), in three places at once:
 *   - its prototype and shape block right after the forward's, in this header, as
 *       fa_<op>_backward(grad outputs (d<input> for every differentiable input, then d<param>),
 *                        dout, the intermediates the forward saved (lse; mean, rstd; pre),
 *                        the forward's inputs and parameters, sizes, flags, nthreads);
 *   - its entry point in the family's .c file (attention.c, layernorm.c, softmax.c, linear.c),
 *     after the forward's;
 *   - its per-ISA body in the same <family>_body.h as the forward's, so every kernels_<level>.c
 *     compiles both, and its entry in the kernel table (fa_kernels.h) beside the forward's.
 * Parameter gradients (dweight, dbias) are deterministic: per-thread partials, one slice of a
 * scratch buffer per thread, then a fixed-order sum. The buffer is sized for the requested
 * count but only the team actually started (fa_team) writes its slices: sum those, or zero
 * the rest first. No atomics.
 */

/* ---- attention -------------------------------------------------------------------------------- */

/* fa_attention_args -- one attention call: its arrays, sizes, strides and options, as given to
 * fa_attention_forward and then, unchanged, to fa_attention_backward. Strides are in elements,
 * (batch, head, row, element); the element stride of q, k, v and out is 1 (their last axis is
 * contiguous) and is not read.
 *
 *   out       (B, H, Lq, Dv)  forward: out; backward: in, the forward's output (dropout
 *                             included); strides out_st
 *   lse       (B, H, Lq)      forward: out, may be NULL; backward: in; C-contiguous;
 *                             natural-log log-sum-exp of each query row's scaled, masked
 *                             scores; -inf for a row with no key (a row that sees one: clamped
 *                             to +-FLT_MAX)
 *   weights   (B, H, Lq, Lk)  forward: out, may be NULL; backward: not read; C-contiguous; the
 *                             softmax weights (only for return_weights: this is the one case an
 *                             (Lq, Lk) matrix is stored)
 *   q         (B, H, Lq, D)   in; strides q_st
 *   k         (B, H, Lk, D)   in; strides k_st
 *   v         (B, H, Lk, Dv)  in; strides v_st
 *   mask      (B, H, Lq, Lk)  in, may be NULL; float added to the scaled scores (-inf = blocked);
 *                             strides mask_st (all four read) may be 0 to broadcast
 *   key_bias  (B, Lk)         in, may be NULL; C-contiguous; float added to every query's score
 *                             for key j (-inf = padding)
 *   scale, causal, dropout_p, seed, bf16: see fa_attention_forward
 */
typedef struct {
    float *out, *lse, *weights;
    const float *q, *k, *v, *mask, *key_bias;
    int64_t B, H, Lq, Lk, D, Dv;
    int64_t q_st[4], k_st[4], v_st[4], out_st[4], mask_st[4];
    float scale;
    int causal;
    double dropout_p;
    uint64_t seed;
    int bf16;      /* 1: bf16 compute (forward only, dropout_p = 0); 0: float32 (callers pass
                    * only these: 2 is attention_body.h's own, inside a call) */
} fa_attention_args;

/* fa_attention_forward -- out = softmax(q k^T * scale + masks) v, fused and tiled; writes a's
 * out, lse and weights (fa_attention_args).
 *
 *   Masks: a key is hidden from a query by the causal rule or a -inf in either mask; its score is
 *   then -inf whatever q.k is, and its k and v rows take no part in the query's output (inf or
 *   NaN there stays out). Every other mask value is added, finite ones of any size included: a
 *   finite value never hides a key (-3.4e38, finfo(float32).min, gives a weight of 0 next to an
 *   unmasked key; a row of such keys averages their values), as in torch. Sums beyond the
 *   float32 range of the base-2 scores are kept finite and in order (attention.c, ATT_WIDE).
 *   causal    query i sees key j iff j <= i + (Lk - Lq) (bottom-right aligned); key blocks above
 *             the diagonal are skipped.
 *   dropout_p in [0, 1): dropout on the softmax weights (torch's MultiheadAttention): weight
 *             (b, h, i, j) is kept iff fa_rng_keep(fa_rng_row_key(seed, (b*H + h)*Lq + i), j,
 *             fa_rng_threshold(dropout_p)) (fa_rng.h), kept weights scaled by 1 / (1 - p);
 *             `weights` receives the weights after dropout, `lse` stays that of the undropped
 *             scores. 0 = no dropout (the same code and speed as without it); seed is then unused.
 *   A query row with no visible key yields zeros (and lse = -inf). NaN in a visible key's
 *   row, or in q, propagates.
 *   bf16      1: bf16 compute (inference; the caller passes dropout_p = 0 and never runs the
 *             backward on it). q, k and v are rounded to bf16 as vcvtneps2bf16 does (nearest
 *             even; subnormals to +-0; NaN stays NaN; past the largest bf16, +-inf), the
 *             products of q.k are exact and summed in float32, then times scale (after the
 *             rounding, as torch scales its bf16 product): s_ij = (q^_i . k^_j) * scale. The
 *             softmax runs in float32: P_ij = exp(s_ij + masks - m_i) (m_i the running max),
 *             l_i = sum_j P_ij of the float32 P; P is then rounded to bf16 for the product with
 *             v^ (as torch's CPU flash attention): out_i = sum_j P^_ij v^_j / l_i, summed in
 *             float32. lse and weights (P / l, float32, not rounded) as without bf16. Paths:
 *             fa_attention_bf16_path (vdpbf16ps, or rounding widened to float32 and FMA: the
 *             same products; the float32 sums' order may differ between paths).
 *   Threads: (batch, head, query block) tasks, dynamically scheduled; each task is computed by
 *   one thread in a fixed order -> results independent of the thread count.
 *   Scratch: one buffer per thread, (D*BQ + BK*BQ + Dv*BQ + 2*BQ) floats, BQ/BK per ISA; bf16
 *   adds the rounded (or paired) key and value blocks and P's pairs (attention_body.h).
 *   Twin: fastattn.reference.attention / attention_forward
 */
int fa_attention_forward(const fa_attention_args *a, int nthreads); /* 0, or -1: out of memory */

/* bf16 attention's code path: FA_ATT_BF16_FMA (round, widen to float32, FMA: every level, no
 * AVX512_BF16 instruction), FA_ATT_BF16_DOT (vdpbf16ps in both passes: the avx512 level on a CPU
 * with AVX512_BF16), FA_ATT_BF16_DOT_ROWS (vdpbf16ps in the one-row pass of decode steps, the
 * tiles on the fma path with vcvtneps2bf16 rounding), FA_ATT_BF16_AMX (the many-query pass's
 * products on the AMX tiles, the one-row pass as DOT_ROWS: the avx512 level on a CPU with
 * AMX-BF16 where Linux grants the tiles) or FA_ATT_BF16_AMX_EMULATED (the same tile code with
 * the tiles emulated in C, any avx512 level: tests). Chosen by fa_attention_bf16_init
 * (forced >= 0, or -1 for the fastest: AMX on a CPU with AMX-BF16, the tile permission asked
 * for at the first bf16 attention and DOT_ROWS if refused; DOT on an
 * AVX512_BF16 CPU without AMX, where vdpbf16ps outruns FMA; FMA elsewhere; -1 returned when
 * forced is refused, -2 when a forced AMX is refused the tiles by Linux), which runs after
 * fa_cpu_init. */
enum { FA_ATT_BF16_FMA = 0, FA_ATT_BF16_DOT = 1, FA_ATT_BF16_DOT_ROWS = 2, FA_ATT_BF16_AMX = 3,
       FA_ATT_BF16_AMX_EMULATED = 4 };
int fa_attention_bf16_supports(int path);
int fa_attention_bf16_init(int forced);
int fa_attention_bf16_path(void);

/* fa_attention_backward -- dq, dk, dv of out = dropout(softmax(q k^T * scale + masks)) v,
 * flash style: the probabilities are recomputed tile by tile from the saved lse; no (Lq, Lk)
 * matrix is stored.
 *
 *   g  the gradients (fa_attention_grads), strides as in fa_attention_args, last axis
 *      contiguous:
 *        dq    (B, H, Lq, D)   out; strides dq_st
 *        dk    (B, H, Lk, D)   out; strides dk_st
 *        dv    (B, H, Lk, Dv)  out; strides dv_st
 *        dout  (B, H, Lq, Dv)  in; the gradient of out; strides dout_st
 *   a  the forward's call (fa_attention_args), its out and lse now read
 *   Math, per (query i, key j), with P_ij = exp(s_ij - lse_i), keep_ij = 0 or 1 / (1 - p) the
 *   forward's dropout (1 without), Delta_i = sum_e dout_ie out_ie:
 *     dv_j += P_ij keep_ij dout_i;   dS_ij = P_ij (keep_ij dout_i . v_j - Delta_i)
 *     dq_i += scale dS_ij k_j;       dk_j += scale dS_ij q_i
 *   A row with lse = -inf (or NaN, as in the twin) has P = 0: zero gradients, nothing added
 *   to dk, dv (a NaN Delta still makes its dS NaN). A hidden key (see the forward) has dS = 0
 *   exactly and its k row takes no part in dq. A row with |lse| > 64 (float32 holds such an lse
 *   to less than P needs, e.g. a row masked throughout by -3e38) has its max and sum recomputed
 *   from its scores first. Causal: the pairs of
 *   query and key blocks wholly above the diagonal are skipped.
 *   Blocks: keys in blocks of BQ (along the vector lanes), queries in blocks of BR rows.
 *   Threads: Delta first ((B*H*Lq) rows, split statically). Then tasks over (batch, head) that
 *   own their dk, dv rows and accumulate them over every query block, adding each block's
 *   share into dq as they go. With too few (batch, head) pairs for the team (5 ceil(BH/n) n >
 *   7 BH: a head costs 5 products, the split 7, spread evenly) the work is split instead into
 *   (batch, head, key block) tasks (dk, dv) and (batch, head, query block) tasks (dq, which
 *   recompute S and dP'). Either way every element is summed by one thread in one fixed
 *   order (dq_i over key blocks in order, dk_j and dv_j over query rows in order) with the
 *   same arithmetic -> bitwise the same results for any thread count or team actually
 *   started. No atomics.
 *   Scratch: Delta and P's reference and scale per row (3*B*H*Lq floats), and per thread
 *   (2*D + 2*Dv + Dp + 2*BR + 1) * BQ floats, Dp = D rounded up to whole vectors: K^T, V^T, K
 *   (padded rows) and the dK^T, dV^T accumulators of one key block, the P' and dS tiles of one
 *   block pair, the key bias.
 *   Twin: fastattn.reference.attention_backward
 */
typedef struct {
    float *dq, *dk, *dv;
    const float *dout;
    int64_t dq_st[4], dk_st[4], dv_st[4], dout_st[4];
} fa_attention_grads;
int fa_attention_backward(const fa_attention_grads *g, const fa_attention_args *a,
                          int nthreads); /* 0, or -1: out of memory */

/* ---- softmax ---------------------------------------------------------------------------------- */

/* fa_softmax_forward -- y = exp(x - max) / sum(exp(x - max)) over the last axis.
 *
 *   y  (N, C)  out; may alias x
 *   x  (N, C)  in
 *   One read pass (running max and rescaled sum per vector lane) and one write pass.
 *   A row of all -inf yields zeros. NaN propagates.
 *   Threads: rows split statically; no cross-thread reduction.
 *   Twin: fastattn.reference.softmax
 */
void fa_softmax_forward(float *y, const float *x, int64_t N, int64_t C, int nthreads);

/* ---- layer norm ------------------------------------------------------------------------------- */

/* fa_layer_norm_forward -- y = norm(x + residual) * weight + bias, over the last axis.
 *
 *   y         (N, C)  out; may alias x or residual
 *   sum_out   (N, C)  out, may be NULL; keeps s = x + residual (the pre-norm residual stream);
 *                     may alias x or residual (each element is read before it is written)
 *   mean      (N)     out, may be NULL
 *   rstd      (N)     out, may be NULL; 1 / sqrt(var + eps), biased (population) variance
 *   x         (N, C)  in
 *   residual  (N, C)  in, may be NULL
 *   weight    (C)     in, may be NULL (= 1)
 *   bias      (C)     in, may be NULL (= 0)
 *   Moments in one pass over s, shifted by s[0] of the row so that a large mean does not cancel.
 *   Every finite row normalises, whatever its scale (up to FLT_MAX): a row whose float32 sums
 *   overflow (|s| past ~1e19) is redone in double (so is a tiny row when eps < 2^-100). s is the
 *   float32 sum x + residual: a row where it overflows (inf) or holds NaN gives NaN.
 *   Threads: rows split statically; no cross-thread reduction.
 *   Twin: fastattn.reference.layer_norm / layer_norm_forward
 */
void fa_layer_norm_forward(float *y, float *sum_out, float *mean, float *rstd,
                           const float *x, const float *residual,
                           const float *weight, const float *bias,
                           int64_t N, int64_t C, float eps, int nthreads);

/* fa_layer_norm_backward -- gradients of y = norm(x + residual) * weight + bias.
 *
 *   dx        (N, C)  out, may be NULL (not wanted); the gradient of x and, the same array, of
 *                     residual (the residual add passes its gradient to both operands)
 *   dweight   (C)     out, may be NULL; sum over rows of dy * xhat
 *   dbias     (C)     out, may be NULL; sum over rows of dy
 *   dy        (N, C)  in; gradient of y
 *   mean      (N)     in; saved by fa_layer_norm_forward
 *   rstd      (N)     in; saved by fa_layer_norm_forward
 *   x         (N, C)  in; the forward's input
 *   residual  (N, C)  in, may be NULL; the forward's residual (s = x + residual is recomputed,
 *                     not saved)
 *   weight    (C)     in, may be NULL (= 1)
 *   accumulate  0: dweight, dbias are overwritten; 1: the new gradients are added to them
 *   scalar math, per row:  xhat = (s - mean) * rstd;  g = dy * weight;
 *                          dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
 *   A row with rstd < 2^-100 (a standard deviation past ~1e30, where s - mean may overflow
 *   float32) is computed in double. One read of dy and s per row for the row sums and the
 *   parameter partials, a second (from cache) for dx. Threads: rows in blocks of REDUCE_ROWS
 *   (a multiple of it for tall inputs, chosen from N alone); each block's dweight/dbias
 *   partial is one slice of a scratch buffer, and the partials are summed block by block, in
 *   block order, in double (threads take column slices) -> results bit-identical for every
 *   thread count.
 *   Returns 0, or -1: out of memory (the partials scratch, 2 * C floats per block).
 *   Twin: fastattn.reference.layer_norm_backward
 */
int fa_layer_norm_backward(float *dx, float *dweight, float *dbias,
                           const float *dy, const float *mean, const float *rstd,
                           const float *x, const float *residual, const float *weight,
                           int64_t N, int64_t C, int accumulate, int nthreads);

/* ---- linear and feed-forward ------------------------------------------------------------------ */

/* gelu: exact, erf form; gelu_tanh: its tanh approximation (torch's approximate="tanh");
 * silu: t sigmoid(t) (torch's SiLU, Marian's "swish") */
enum { FA_ACT_NONE = 0, FA_ACT_RELU = 1, FA_ACT_GELU = 2, FA_ACT_GELU_TANH = 3, FA_ACT_SILU = 4 };

/* fa_bf16_weight_pack -- a bf16 training weight w (M, K) (bf16 values held in float32s)
 * packed for the products that read it on the bf16 tiles, made once per optimizer step by the
 * caller (the model layer caches it by the parameter's version) and passed to the products
 * below: trans 1, op(B) = w^T (the forwards' x w^T); trans 0, op(B) = w (the input gradients'
 * dz w). NULL where the bfloat16 compute type's path for many rows is not the tiles, or out of
 * memory: the products then pack B themselves or run on the engine. The caller owns it
 * (fa_bf16_weight_free) and passes it only with the very values it was packed from. */
typedef struct fa_bf16_b fa_bf16_b;
fa_bf16_b *fa_bf16_weight_pack(const float *w, int64_t M, int64_t K, int trans);
void fa_bf16_weight_free(fa_bf16_b *packed);

/* fa_linear_forward -- y = act(x weight^T + bias).
 *
 *   y       (N, M)  out
 *   pre     (N, M)  out, may be NULL; x weight^T + bias before the activation (training keeps
 *                   it for fa_linear_backward; pointless without an activation)
 *   x       (N, K)  in
 *   weight  (M, K)  in (torch layout: out_features x in_features)
 *   bias    (M)     in, may be NULL
 *   The product on the float32 GEMM engine (fa_gemm.h): the weight packed into panels by the
 *   team, then blocks of rows x features handed to the threads as they come free, bias and
 *   activation applied to each finished tile while it is in L1. Every element is one sum in k
 *   order: bit-identical for every thread count and every row count.
 *   bf16     1: x and weight hold bf16 values (bf16 training's rounded operands): the products
 *            run on the AMX tiles where the bfloat16 compute type runs on them (exact
 *            products summed in float32), on the engine otherwise
 *   wpack    NULL, or with bf16 fa_bf16_weight_pack(weight, M, K, 1): op(B) not packed per call
 *   Twin: fastattn.reference.linear / linear_forward
 */
int fa_linear_forward(float *y, float *pre, const float *x, const float *weight,
                      const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                      int bf16, const fa_bf16_b *wpack, int nthreads); /* 0, or -1: out of memory */

/* fa_linear_forward_t -- the same with the weight given transposed: wt (K, ldt), ldt >= M
 * (columns past M unused), no pre. */
int fa_linear_forward_t(float *y, const float *x, const float *wt, int64_t ldt,
                        const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                        int nthreads);

/* fa_linear_backward -- gradients of y = act(x weight^T + bias).
 *
 *   dx       (N, K)  out, may be NULL (not wanted: a first layer); dz weight
 *   dweight  (M, K)  out, may be NULL; dz^T x
 *   dbias    (M)     out, may be NULL; column sums of dz
 *   dz       (N, M)  scratch: dy * act'(pre); may alias dy or pre (overwritten). Unused (may be
 *                    NULL) without an activation, where dz = dy
 *   dy       (N, M)  in
 *   pre      (N, M)  in; saved by fa_linear_forward (NULL without an activation)
 *   x        (N, K)  in
 *   weight   (M, K)  in
 *   accumulate  0: dweight, dbias are overwritten; 1: added to (each sum starts at the old
 *               value), as the model's layers accumulate parameter gradients across calls
 *   bf16     1: bf16 mixed-precision training: dz (required, (N, M)) = dy * act'(pre), or dy,
 *            rounded to bf16 (fa_round_bfloat16's rule) before both products and the bias
 *            sums (as torch's bf16 gradient tensors); the caller passes x and weight already
 *            rounded, so every product is of two bf16 values (exact in float32), summed in
 *            float32, on the AMX tiles where the bfloat16 compute type runs on them
 *   wpack    NULL, or with bf16 fa_bf16_weight_pack(weight, M, K, 0), for dx
 *   act'(pre): relu [pre > 0] (a select: dz = 0 where pre <= 0 or NaN); gelu Phi + pre * phi
 *   (exact), 0 * inf terms taken as 0 at +-inf.
 *   Threads: dz by row blocks, then dx and dweight each by the whole team on the engine
 *   (operands packed by the team first), dbias by slices of M. dbias sums each column in row
 *   order, REDUCE_ROWS rows per float partial, partials in double; every result is
 *   bit-identical for every thread count.
 *   Twin: fastattn.reference.linear_backward
 */
int fa_linear_backward(float *dx, float *dweight, float *dbias, float *dz,
                       const float *dy, const float *pre, const float *x, const float *weight,
                       int64_t N, int64_t K, int64_t M, int activation, int accumulate,
                       int bf16, const fa_bf16_b *wpack, int nthreads); /* 0, or -1: OOM */

/* fa_ffn_forward -- y = drop(act(x w1^T + b1)) w2^T + b2, in row blocks (torch's
 * linear2(dropout(activation(linear1(x))))).
 *
 *   y    (N, C)  out
 *   pre  (N, F)  out, may be NULL; x w1^T + b1, kept for fa_ffn_backward: training keeps the
 *                pre-activation (N * F * 4 bytes per layer, 8 MiB at N = 1024, F = 2048) and
 *                the backward recomputes the activation and the dropout mask from it
 *   x    (N, C)  in
 *   w1   (F, C)  in     b1 (F)  in, may be NULL
 *   w2   (C, F)  in     b2 (C)  in, may be NULL
 *   dropout_p  in [0, 1): hidden element (n, f) is kept iff fa_rng_keep(fa_rng_row_key(seed,
 *              n), f, fa_rng_threshold(dropout_p)) and then scaled by 1 / (1 - dropout_p);
 *              0 = no dropout (seed unused, nothing computed for it)
 *   bf16       1: the hidden drop(act(pre)) is rounded to bf16 (fa_round_bfloat16's rule)
 *              before the second product; the caller passes x, w1 and w2 already rounded (bf16
 *              training; the products as in fa_linear_backward)
 *   pack1, pack2  NULL, or with bf16 fa_bf16_weight_pack(w1, F, C, 1) and (w2, C, F, 1)
 *   wp1, wp2      NULL, or w1 and w2 packed (fa_pack_panels): no packing per call (inference)
 *   Many rows: the hidden (N, F) never exists whole; blocks of rows (the hidden block in L2)
 *   are handed to the threads as they come free, each running both products and epilogues on
 *   its block. Fewer than two blocks per thread: each product by the whole team, the (N, F)
 *   hidden between them.
 *   Twin: fastattn.reference.ffn / ffn_forward
 */
int fa_ffn_forward(float *y, float *pre, const float *x, const float *w1, const float *b1,
                   const float *w2, const float *b2, int64_t N, int64_t C, int64_t F,
                   int activation, double dropout_p, uint64_t seed, int bf16,
                   const fa_bf16_b *pack1, const fa_bf16_b *pack2, const float *wp1,
                   const float *wp2, int nthreads);  /* 0, or -1: out of memory */

/* fa_ffn_backward -- gradients of y = drop(act(x w1^T + b1)) w2^T + b2.
 *
 *   dx    (N, C)  out, may be NULL (not wanted); dpre w1
 *   dw1   (F, C)  out, may be NULL; dpre^T x          db1 (F)  out, may be NULL; sums of dpre
 *   dw2   (C, F)  out, may be NULL; dy^T h            db2 (C)  out, may be NULL; sums of dy
 *   h     (N, F)  scratch: first the hidden's gradient dh = dy w2, then, in its place, the
 *                 hidden h = drop(act(pre)) recomputed for dw2
 *   dpre  (N, F)  scratch: dh * drop' * act'(pre); may alias pre (overwritten)
 *   dy    (N, C)  in
 *   pre   (N, F)  in; saved by fa_ffn_forward
 *   x     (N, C)  in
 *   w1    (F, C)  in     w2 (C, F)  in
 *   dropout_p, seed   as in the forward: the mask is regenerated, never stored
 *   accumulate  0: dw1, db1, dw2, db2 are overwritten; 1: added to
 *   bf16  1: the recomputed h and dpre are rounded to bf16 (fa_round_bfloat16's rule) before
 *         the products and sums that read them; the caller passes dy, x, w1 and w2 already
 *         rounded
 *   pack1, pack2  NULL, or with bf16 fa_bf16_weight_pack(w1, F, C, 0) and (w2, C, F, 0)
 *   Four products (8 N C F flops), each by the whole team on the engine; h and dpre by row
 *   blocks between them; db1 and db2 by feature slices (column sums as in
 *   fa_linear_backward). Every result is bit-identical for every thread count.
 *   Twin: fastattn.reference.ffn_backward
 */
int fa_ffn_backward(float *dx, float *dw1, float *db1, float *dw2, float *db2,
                    float *h, float *dpre,
                    const float *dy, const float *pre, const float *x,
                    const float *w1, const float *w2, int64_t N, int64_t C, int64_t F,
                    int activation, double dropout_p, uint64_t seed, int accumulate,
                    int bf16, const fa_bf16_b *pack1, const fa_bf16_b *pack2,
                    int nthreads); /* 0, or -1: out of memory */

/* fa_pack_panels -- a weight laid out for the GEMM engine (fa_linear_packed_forward,
 * fa_ffn_forward's wp1 / wp2): done once per weight, when a model enters eval().
 *
 *   wp  (ceil(M/48), K, 48)  out; fa_packed_size(M, K) floats; wp[p][k][f] = w[48p + f][k],
 *                            zero for features past M
 *   w   (M, K)               in (torch layout)
 */
int64_t fa_packed_size(int64_t M, int64_t K);
void fa_pack_panels(float *wp, const float *w, int64_t M, int64_t K, int nthreads);

/* fa_linear_packed_forward -- y = act(x weight^T + bias), the weight packed (any N: the
 * engine's tasks, blocks of rows x groups of panels, handed to the threads as they come free;
 * a decode step's few rows stream each panel once). Each element is one sum in k order,
 * whatever N or the team.
 *
 *   y     (N, M)  out        x  (N, K)  in        bias (M)  in, may be NULL
 *   wp    packed weight (fa_pack_panels)
 *   Twin: fastattn.reference.linear (on the unpacked weight)
 */
void fa_linear_packed_forward(float *y, const float *x, const float *wp, const float *bias,
                              int64_t N, int64_t K, int64_t M, int activation, int nthreads);

/* ---- loss ------------------------------------------------------------------------------------- */

/* fa_cross_entropy_forward -- per-row cross-entropy of log-softmax(logits) against integer
 * targets, with label smoothing; with dlogits, the backward pass fused into the same call.
 *
 *   losses    (N)     out; loss_n = (1 - eps) * (lse_n - x_nt) + eps * (lse_n - mean_v x_nv),
 *                     lse_n = log sum_v exp(x_nv), t = targets[n], eps = label_smoothing
 *                     (the eps term only when eps > 0); 0 for an ignored row
 *   dlogits   (N, V)  out, may be NULL; may alias logits (written over them, row by row);
 *                     d loss_n / d x_nv * grad_scale
 *                     = grad_scale * (softmax(x_n)_v - eps / V - (1 - eps) * [v == t]);
 *                     zeros for an ignored row
 *   logits    (N, V)  in
 *   targets   (N)     in, int64; each in [0, V) or equal to ignore_index (the caller checks)
 *   grad_scale        1 / (rows not ignored) for a mean, 1 for a sum
 *   One read pass per row (running max, rescaled sum of exp and the sum of x - x_n0 per vector
 *   lane, as fa_softmax_forward) and, with dlogits, one write pass while the row is in cache.
 *   Each row's loss is combined in double from its float sums; reducing the losses (a mean or
 *   a sum) is left to the caller, in a fixed order.
 *   Threads: tasks of whole rows (>= 16384 logits, or one row), dynamically scheduled (a
 *   thread slowed by another process takes fewer); each row is computed by one thread in a
 *   fixed order and nothing is reduced across rows -> results independent of threads.
 *   NaN or +inf logits give NaN.
 *   Twin: fastattn.reference.cross_entropy
 */
void fa_cross_entropy_forward(float *losses, float *dlogits, const float *logits,
                              const int64_t *targets, int64_t N, int64_t V,
                              int64_t ignore_index, float label_smoothing, float grad_scale,
                              int nthreads);

/* ---- optimiser -------------------------------------------------------------------------------- */
/* These kernels take `count` tensors at once, as arrays of pointers and sizes (tensor i:
 * sizes[i] floats at xs[i]; a tensor with no elements may have a NULL pointer), so that one
 * parallel region covers a whole model's parameters. Work is cut into tasks of at most
 * FA_OPTIM_CHUNK floats, none spanning two tensors, handed out dynamically (a thread slowed
 * by another process takes fewer); every element is computed the same way whichever thread
 * takes it, so results do not depend on the thread count. */
#define FA_OPTIM_CHUNK 32768

/* fa_adam_step -- one Adam / AdamW update of `count` parameter tensors, in place, as
 * torch.optim.Adam / AdamW.
 *
 *   params[i]       (sizes[i])  in/out
 *   exp_avgs[i]     (sizes[i])  in/out; first moment m
 *   exp_avg_sqs[i]  (sizes[i])  in/out; second moment v
 *   grads[i]        (sizes[i])  in
 *   step        1-based count of updates of these tensors, this one included
 *   decoupled   1: AdamW (p *= 1 - lr * weight_decay first); 0: Adam (g += weight_decay * p)
 *   scalar math, per element, in torch's order, with float constants computed in double:
 *     m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
 *     p = p - (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 *   One pass: 4 floats read and 3 written per element.
 *   Twin: fastattn.reference.adamw_step / adam_step
 */
void fa_adam_step(float *const *params, float *const *exp_avgs, float *const *exp_avg_sqs,
                  const float *const *grads, const int64_t *sizes, int64_t count, int64_t step,
                  double lr, double beta1, double beta2, double eps, double weight_decay,
                  int decoupled, int nthreads);

/* fa_sum_squares -- sum of x^2 over `count` tensors, in double, the same bits for any thread
 * count (the square of grad_norm).
 *
 *   partials  (fa_sum_squares_blocks(sizes, count))  scratch: one double per block
 *   xs[i]     (sizes[i])  in
 *   Blocks of FA_OPTIM_CHUNK floats (a tensor's last one shorter): each block's sum of
 *   squares is accumulated in double vector lanes, combined in a fixed order, by one thread;
 *   the block sums are then added in block order (tensor by tensor).
 *   Returns the sum. Twin: fastattn.reference.grad_norm (squared)
 */
int64_t fa_sum_squares_blocks(const int64_t *sizes, int64_t count);
double fa_sum_squares(double *partials, const float *const *xs, const int64_t *sizes,
                      int64_t count, int nthreads);

/* fa_scale_inplace -- xs[i] *= s for `count` tensors (gradient clipping).
 *   xs[i]  (sizes[i])  in/out
 */
void fa_scale_inplace(float *const *xs, const int64_t *sizes, int64_t count, float s,
                      int nthreads);

/* ---- dropout ---------------------------------------------------------------------------------- */

/* fa_dropout_forward -- y = x * keep / (1 - p), rows n and columns c of an (N, C) activation.
 *
 *   y  (N, C)  out; may alias x
 *   x  (N, C)  in
 *   p  in [0, 1); keep(n, c) = fa_rng_keep(fa_rng_row_key(seed, n), c, fa_rng_threshold(p))
 *      (fa_rng.h: a pure function of seed, n, c); p = 0 copies x
 *   A dropped element is x * 0 (NaN and inf stay NaN, as in torch). The hash is 32-bit integer
 *   arithmetic per element, vectorised on every ISA level.
 *   Threads: rows split statically; no cross-thread reduction.
 *   Twin: fastattn.reference.dropout
 */
void fa_dropout_forward(float *y, const float *x, int64_t N, int64_t C, double p, uint64_t seed,
                        int nthreads);

/* fa_dropout_backward -- dx = dy * keep / (1 - p), the forward's mask regenerated from seed.
 *
 *   dx  (N, C)  out; may alias dy
 *   dy  (N, C)  in
 *   The same computation as the forward (the map is linear in its input).
 *   Twin: fastattn.reference.dropout_backward
 */
void fa_dropout_backward(float *dx, const float *dy, int64_t N, int64_t C, double p,
                         uint64_t seed, int nthreads);

/* ---- embedding -------------------------------------------------------------------------------- */

/* The forward is a gather (weight[ids]), done by NumPy in the model layer.
 *
 * fa_embedding_backward -- dweight[v] = sum of dout[i] over the positions i with ids[i] = v.
 *
 *   dweight  (V, C)  out; rows of ids that never occur are 0 (or unchanged with accumulate)
 *   dout     (N, C)  in; gradient of the gathered rows
 *   ids      (N)     in, int64, each in [0, V) (ops.py checks)
 *   accumulate  0: dweight is overwritten; 1: added to
 *   Deterministic, no atomics: a counting sort orders the positions by id (stable, so each id's
 *   positions stay in ascending order); each thread then owns a range of ids (balanced by rows
 *   summed plus rows written) and adds each id's rows in position order -> bit-identical for
 *   every thread count.
 *   Returns 0, or -1: out of memory (the sort: (V + 1 + N) int64).
 *   Twin: fastattn.reference.embedding_backward
 */
int fa_embedding_backward(float *dweight, const float *dout, const int64_t *ids, int64_t N,
                          int64_t C, int64_t V, int accumulate, int nthreads);

/* ---- quantised weights: int8 (per-row scales) and bfloat16 ------------------------------------
 * int8 weights, symmetric per row (and fa_quantize_int8's rows):
 *   amax = max_k |w[m, k]|;  scale[m] = amax / 127;  inv = 127 / amax   (float32 divisions)
 *   q[m, k] = clip(rint(w[m, k] * inv), -127, 127)   (rint: to nearest, ties to even)
 *   amax < 2^-121 (zeros, or so small that 127 / amax would overflow): scale 0 and q 0.
 * A product's activations, quantised per row on the fly by the same rule with L levels in
 * place of 127, L = fa_int8_act_levels(K): as many as the int32 sums allow (|acc| <= 127 L K
 * < 2^31), at most 32767 (int16 lanes): 32767 up to K = 516, 8256 at K = 2048, 2064 at
 * K = 8192, never below 127 (K <= FA_INT8_MAX_K). Rows with amax < 2^-110
 * (FA_INT8_ACT_MIN_AMAX) are zero; a row that is not finite gets scale NaN and q 0, so its
 * output row is NaN.
 * A product y = act(x w^T + b) with int8 weights:
 *   acc[n, m] = sum_k xq[n, k] q[m, k]     exact, in int32 (K <= FA_INT8_MAX_K)
 *   y[n, m]   = act(fl(fl(fl(acc) * fl(sx[n] * scale[m])) + b[m]))   fl: float32 rounding, no
 *              fused multiply-add, so the twin reproduces it bit for bit (gelu: to its accuracy)
 * bfloat16: bits = the float32's top 16 bits rounded to nearest even (NaN: a quiet NaN, sign
 * and top payload kept); products widen the weight to float32 and accumulate in float32.
 * The weights reach the kernels packed (fa_int8_pack / fa_bf16_pack), in a layout private to C
 * that depends on the int8 path chosen at import: packed arrays are never saved.
 */
#define FA_INT8_MAX_K 133144  /* (2^31 - 1) / (127 * 127): the int32 sums cannot overflow */
#define FA_INT8_MIN_AMAX 0x1p-121f /* rows below: zero (127 / amax is finite from here up) */
#define FA_INT8_ACT_MIN_AMAX 0x1p-110f /* activation rows below: zero (L / amax finite, and
                                        * amax / L a normal float, for every L <= 32767) */
#define FA_BF16_PACKED_MAX_ROWS 32 /* bf16: up to this many rows, the packed few-row kernel */
/* quantised rows: int16 activations, int8 values, or the int16 activations split into bytes for
 * the AMX tiles (x = 256 hi + lo: hi = x >> 8 signed, lo = x & 255 unsigned; a row of Kp values
 * is Kp hi bytes, then Kp lo bytes) */
enum { Q8_FMT_I16 = 0, Q8_FMT_I8 = 1, Q8_FMT_HILO = 2 };

/* the activation levels L of a product over K (1 <= K <= FA_INT8_MAX_K) */
static inline int32_t fa_int8_act_levels(int64_t K)
{
    const int64_t l = (int64_t)2147483647 / (127 * (K > 0 ? K : 1));
    return l > 32767 ? 32767 : (int32_t)l;
}

/* int8 code paths (user names generic / avx2 / avx512bw / avx512vnni / amx / amx-emulated /
 * avx512vnni-quads), at most the ISA level. amx: the AMX tiles, int8 and, for many rows, bf16
 * (a CPU with AMX-TILE, AMX-INT8 and AMX-BF16, its tile state enabled by the OS and granted to
 * this process); the default there, with products of fewer than 16 rows handed to
 * avx512vnni-quads (vpdpbusd on the tiles' packed layout and activations: no second copy of
 * the weight), which also runs every size where Linux refuses the tiles (paths.c);
 * amx-emulated: the same tile code with each tile instruction emulated in C (any AVX-512 CPU;
 * slow: a check of the AMX path's layout and arithmetic on CPUs without AMX). */
typedef enum {
    FA_INT8_GENERIC = 0, FA_INT8_AVX2 = 1, FA_INT8_AVX512BW = 2, FA_INT8_AVX512VNNI = 3,
    FA_INT8_AMX = 4, FA_INT8_AMX_EMULATED = 5, FA_INT8_AVX512VNNI_QUADS = 6
} fa_int8_path_t;

/* fa_int8_init -- pick the int8 path once, after fa_cpu_init (called at import).
 *   forced  -1 = the best path the SIMD level in use allows; else a fa_int8_path_t.
 *   Returns 0; -1 if `forced` is above the SIMD level in use or unsupported; -2 if it is amx and
 *   Linux refused this process the tile data (ARCH_REQ_XCOMP_PERM, asked for only then);
 *   the path is unchanged on failure. */
int fa_int8_init(int forced);
int fa_int8_supports(int path);     /* 1 if this CPU, build and SIMD level can run `path` */
int fa_int8_path(void);             /* the path in use */
int fa_int8_path_rows(int64_t rows);  /* the path a product of `rows` rows runs on */

/* fa_amx_status -- AMX facts, for build_info(): bit 0 the CPU has AMX-TILE + AMX-INT8, bit 1
 * AMX-BF16, bit 2 the OS enables tile state (XCR0 bits 17-18): the amx path needs all three;
 * bit 3 Linux has granted this process the tile data (requested only when amx is forced). */
int fa_amx_status(void);

/* fa_quantize_int8 -- the per-row rule above, on N rows of K.
 *   q      (N, K)  out, int8
 *   scale  (N)     out; NaN for a row that is not finite (its q row is 0)
 *   x      (N, K)  in
 *   Returns -1, or the first row that is not finite.
 *   Twin: fastattn.reference.quantize_int8 (which raises for such rows, as ops does) */
int64_t fa_quantize_int8(int8_t *q, float *scale, const float *x, int64_t N, int64_t K,
                         int nthreads);

/* fa_int8_pack -- an int8 weight laid out for fa_linear_int8_forward on the path in use.
 *   wp    (fa_int8_packed_size(M, K))  out, int8; feature panels, K padded with zeros
 *   q     (M, K)  in, int8 in [-127, 127]
 */
int64_t fa_int8_packed_size(int64_t M, int64_t K);
void fa_int8_pack(int8_t *wp, const int8_t *q, int64_t M, int64_t K, int nthreads);

/* fa_linear_int8_forward -- y = act(x weight^T + bias), weight int8 with per-row scales.
 *   y      (N, M)  out
 *   x      (N, K)  in; quantised per row on the fly (the rule above, L levels)
 *   wp             the packed weight (fa_int8_pack)
 *   scale  (M)     in; the weight's row scales
 *   bias   (M)     in, may be NULL
 *   K <= FA_INT8_MAX_K (ops.py checks). Many rows: blocks of rows per thread, each quantised
 *   into a packed block, then every panel; few rows (decode steps): panels split over threads.
 *   Each element is computed the same way whatever N and the thread count: bit-identical.
 *   Returns 0, or -1: out of memory.
 *   Twin: fastattn.reference.linear with a QuantizedWeight
 */
int fa_linear_int8_forward(float *y, const float *x, const int8_t *wp, const float *scale,
                           const float *bias, int64_t N, int64_t K, int64_t M, int activation,
                           int nthreads);

/* fa_to_bfloat16 -- bits[i] = bf16(x[i]) (the rounding above).   bits, x  (n) */
void fa_to_bfloat16(uint16_t *bits, const float *x, int64_t n, int nthreads);
/* fa_round_bfloat16 -- dst[i] = x[i] rounded to bf16 as vcvtneps2bf16 (nearest even; subnormals
 * to +-0; NaN stays NaN), widened back to float32; dst may be src. The bf16 training's operand
 * rounding.
 *   dst, src  (n) */
void fa_round_bfloat16(float *dst, const float *src, int64_t n, int nthreads);
/* fa_round_bfloat16_bits -- the same rounding kept as bits (bf16 training keeps the operands
 * its backward products read so, at half the memory); fa_widen_bfloat16 -- dst[i] = the float32
 * value of bits[i] (exact).   dst, src, bits  (n) */
void fa_round_bfloat16_bits(uint16_t *bits, const float *src, int64_t n, int nthreads);
void fa_widen_bfloat16(float *dst, const uint16_t *bits, int64_t n, int nthreads);

/* fa_bf16_pack -- a bf16 weight (M, K) laid out for fa_linear_bf16_forward.
 *   wp  (fa_bf16_packed_size(M, K))  out, uint16; panels of features, zero past M
 *   w   (M, K)  in, bf16 bits */
int64_t fa_bf16_packed_size(int64_t M, int64_t K);
void fa_bf16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads);

/* fa_linear_bf16_forward -- y = act(x float32(weight)^T + bias), weight bf16, fp32 sums.
 *   y (N, M) out;  x (N, K) in;  bias (M) or NULL
 *   wp  the packed weight (fa_bf16_pack): the only copy of it the kernels need
 *   Up to FA_BF16_PACKED_MAX_ROWS rows: panels split over threads, the weight streamed once and
 *   widened in registers. More: the panels widened (exact) into a float32 copy of weight^T,
 *   then fa_linear_forward_t (the float32 engine); on the amx int8 paths, the AMX tiles (bf16_amx.h).
 *   Returns 0, or -1: out of memory.
 *   Twin: fastattn.reference.linear with a QuantizedWeight */
int fa_linear_bf16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                           int64_t N, int64_t K, int64_t M, int activation, int nthreads);

/* ---- bfloat16 compute ------------------------------------------------------------------------
 * y = act(acc + bias), acc the float32 sum of products of bf16-rounded operands:
 *   bfr(v)  vcvtneps2bf16's rounding: a zero or subnormal float32 -> a zero of its sign, NaN ->
 *           a quiet NaN (sign and top payload kept), else to nearest even (may give inf)
 *   acc = 0; for kk < ceil(K / 2): acc = fl(acc + bfr(x_{2kk+1}) bfr(w_{2kk+1}));
 *                                  acc = fl(acc + bfr(x_{2kk}) bfr(w_{2kk}))
 *   (x_K = w_K = 0 for an odd K; the odd element first, as vdpbf16ps adds them). Each product
 *   is exact in float32 unless it is below 2^-126 (then the AVX512_BF16 path flushes it, and
 *   any sum below 2^-126, to zero; an FMA rounds it once with the sum: the paths may differ
 *   there by 2^-126 a step) or overflows. Paths (the same bits otherwise, for every thread
 *   count and N):
 *   fma: rows rounded to float32 values, weights widened in registers, FMA tiles (any level);
 *   avx512bf16: vdpbf16ps tiles (AVX-512 level, a CPU with AVX512_BF16); the default where
 *   vdpbf16ps outruns the FMAs (timed once at import: the same bits either way).
 *   amx: TDPBF16PS tiles, only when forced (another order: per block of 16 pairs, the even
 *   and odd products in two sums, then acc = fl(acc + fl(s_even + s_odd)); the twin's
 *   order="amx"); amx-emulated: the same tiles emulated in C (any AVX-512 CPU, for tests).
 * Twin: fastattn.reference.linear with a QuantizedWeight of dtype "bfloat16". */
typedef enum {
    FA_BF16_FMA = 0, FA_BF16_AVX512BF16 = 1, FA_BF16_AMX = 2, FA_BF16_AMX_EMULATED = 3
} fa_bf16_path_t;
/* -1: the best path (amx where the CPU has AMX-BF16, its tile permission asked for at the
 * first product, else the faster of fma / avx512bf16); returns -1 if `forced` is unsupported,
 * -2 if it is amx and Linux refused the tile data */
int fa_bfloat16_init(int forced);
int fa_bfloat16_supports(int path);
int fa_bfloat16_path(void);
/* the path a product of N rows runs on: the chosen one, but a default amx hands fewer than 16
 * rows (a decode step's) to the best vector path */
int fa_bfloat16_path_rows(int64_t N);
int fa_bfloat16_cpu_has_avx512bf16(void);   /* CPUID: the CPU has AVX512_BF16 (any level) */

/* fa_bfloat16_pack -- bf16 weight bits (M, K) laid out for fa_linear_bfloat16_forward (every
 * path: panels of 64 features, K in pairs; subnormal bits flushed as bfr does).
 *   wp  (fa_bfloat16_packed_size(M, K)) out, uint16;  w  (M, K) in */
int64_t fa_bfloat16_packed_size(int64_t M, int64_t K);
void fa_bfloat16_pack(uint16_t *wp, const uint16_t *w, int64_t M, int64_t K, int nthreads);

/* fa_linear_bfloat16_forward -- the rule above.  y (N, M) out;  x (N, K) in;  wp packed;
 * bias (M) or NULL. Many rows: blocks of rows per thread; few: panels split over threads.
 * Returns 0, or -1: out of memory. */
int fa_linear_bfloat16_forward(float *y, const float *x, const uint16_t *wp, const float *bias,
                               int64_t N, int64_t K, int64_t M, int activation, int nthreads);

/* fa_ffn_bfloat16_forward -- y (N, C) = act(x w1^T + b1) w2^T + b2 in the bfloat16 compute type:
 * the two products of fa_linear_bfloat16_forward, the same bits, with the hidden (N, F) held
 * as bf16 bits (it only feeds the second product, which rounds it so) where that pays: more
 * than a decode step's rows, and on the AMX tiles a first product of C <= 512. w1p, w2p
 * packed by fa_bfloat16_pack (F, C) and (C, F); b1 (F), b2 (C) or NULL. Returns 0, or -1: out
 * of memory. */
int fa_ffn_bfloat16_forward(float *y, const float *x, const uint16_t *w1p, const float *b1,
                            const uint16_t *w2p, const float *b2, int64_t N, int64_t C,
                            int64_t F, int activation, int nthreads);

/* fa_peak -- flops (int8: ops) of a register-only loop of `iters` steps on each of nthreads
 * threads (the caller times it), the rooflines the GEMMs are read against; kind:
 *   FA_PEAK_VDPBF16PS  24 independent vdpbf16ps a step (-1 without AVX512_BF16 at the level)
 *   FA_PEAK_FMA        the level's FMA (zmm on AVX-512, ymm on AVX2; -1 at the generic level)
 *   FA_PEAK_AMX_BF16   4 independent TDPBF16PS a step, FA_PEAK_AMX_INT8 4 TDPBSSD (-1 unless
 *                      the CPU has the tiles and Linux grants them: asked for here) */
enum { FA_PEAK_VDPBF16PS = 0, FA_PEAK_FMA = 1, FA_PEAK_AMX_BF16 = 2, FA_PEAK_AMX_INT8 = 3 };
double fa_peak(int64_t iters, int nthreads, int kind);

/* fa_quant_tiles -- the quantised kernels' sizes, for build_info()["quant_tiles"]: out[0..6] =
 * int8 features per panel, K per group, rows per tile (of the int8 path in use), int8 rows per
 * block, int8 rows per thread below which panels are split, bf16 features per panel,
 * FA_BF16_PACKED_MAX_ROWS, bfloat16 (compute) features per panel. Returns the count (8). */
int fa_quant_tiles(int64_t *out);

#endif /* FASTATTN_H */
