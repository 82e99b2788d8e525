/* bf16_amx.h -- the bf16 family's products on AMX tiles (TDPBF16PS: bf16 pairs, float32
 * sums): bf16 storage's many-row products, the bfloat16 compute type's, bf16 training's and
 * bf16 attention's scores and P.V. The whole of bf16_amx.c (the tile instructions) and of
 * bf16_amx_emulated.c (AMX_EMULATE: every tile instruction emulated in C, amx_tiles.h). Each
 * unit defines first FA_TARGET (an AVX-512 target) and AMX_KERNELS, the name of its table
 * (fa_amx_kernels); paths.c says which calls run on it.
 *
 * bf16 weights, many rows: each float32 input is split into three bf16 terms that add up to it
 * exactly (the top 8 significant bits by truncation, the next 8, the last 8), so the tiles
 * multiply the input itself, not a rounding of it:
 *   scalar math:  y = sum_k (h1_k + h2_k + h3_k) w_k,  x_k = h1_k + h2_k + h3_k
 * (a non-finite input is its own first term). The tiles treat bf16 subnormals as 0 and flush
 * float32 results below 2^-126 to 0 (this path's only departure from float32 arithmetic, at
 * magnitudes no Transformer reaches); the sums' order differs from the float32 engine's, as any path's may.
 *   weights  the bf16 panels (fa_bf16_pack: [p][k][32]) repacked per call in pairs of k:
 *            wq[p][kk][f][j] = w[32 p + f][2 kk + j], K rounded up to 32 with zeros
 *   inputs   per 16-row tile, three (16, Kb) bf16 matrices (the terms), zero past K and N
 * Tiles: 0, 1  C of features 0-15, 16-31 (float32);  4, 5  A (a term's 16 x 32 k);  6, 7  B.
 */
#include "amx_tiles.h"

_Static_assert(AMX_NP == BF_PANEL, "the AMX bf16 repack reads bf16 panels of AMX_NP features");

/* One row of x (K floats) rounded to bf16 bits (bfc_round_row's rule: vcvtneps2bf16's), zero
 * from K to Kp: the tiles' A operands and attention's keys and values. The real tiles' unit
 * (AMX_ROUND_CVT: the amx path, chosen only on CPUs with AVX512_BF16 too, as every CPU with
 * AMX-BF16 has) converts 32 floats per instruction; the emulated unit, which runs on any
 * AVX-512 CPU, rounds in integer vector arithmetic: the same bits. */
static void amx_round_row(uint16_t *dst, const float *x, int64_t K, int64_t Kp)
{
#if defined(AMX_ROUND_CVT)
    int64_t k = 0;
    for (; k + 32 <= K; k += 32)
        _mm512_storeu_si512((void *)(dst + k), (__m512i)_mm512_cvtne2ps_pbh(
                                                   _mm512_loadu_ps(x + k + 16),
                                                   _mm512_loadu_ps(x + k)));
    for (; k < Kp; k += 16) {
        const int64_t n = K - k >= 16 ? 16 : K - k > 0 ? K - k : 0;
        const __m256i r = (__m256i)_mm512_cvtneps_pbh(
            _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), x + k));
        const int64_t m = Kp - k >= 16 ? 16 : Kp - k;
        _mm256_mask_storeu_epi16(dst + k, (__mmask16)((1u << m) - 1u), r);
    }
#else
    fa_kernels_avx512.bfc_round_row(dst, x, K, Kp, 0);
#endif
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
/* bf16 product rows [r0, r1) of y (row stride M; r0 a multiple of 16, r1 <= N) = x
 * float32(w)^T, without bias: the repacked weight wq (above), h scratch for one row tile's
 * three terms (3 x 16 x Kb bf16). */
static void bf16_rows_amx(float *y, const float *x, int64_t r0, int64_t r1, const uint16_t *wq,
                          uint16_t *h, int64_t K, int64_t Kb, int64_t M)
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

/* Many rows on the AMX tiles (fa_amx_kernels.bf16_forward): the weight repacked in pairs of k
 * once per call, then 16-row tiles split over the threads, each thread's rows finished by the
 * epilogue (bias, activation) like the float32 linear's. */
static int bf16_forward_amx(float *y, const float *x, const uint16_t *wp, const float *bias,
                            int64_t N, int64_t K, int64_t M, int activation, int nthreads)
{
    const int64_t P = (M + BF_PANEL - 1) / BF_PANEL, Kb = (K + 31) / 32 * 32;
    const int64_t ntile = (N + AMX_MR - 1) / AMX_MR, hsize = 3 * AMX_MR * Kb;
    const int nt = fa_team_size(nthreads < ntile ? nthreads : (int)ntile,
                                2.0 * (double)N * (double)K * (double)M, 2e5);
    uint16_t *wq = aligned_alloc(64, (size_t)((P * BF_PANEL * Kb * 2 + 63) / 64 * 64));
    uint16_t *h = aligned_alloc(64, (size_t)(hsize * 2 * nt));
    if (!wq || !h) {
        free(wq);
        free(h);
        return -1;
    }
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; p++) amx_bf16_repack(wq, wp, p, K, Kb);
        int64_t t0, t1;
        fa_split(ntile, 1, &t0, &t1);
        if (t0 < t1) {
            const int64_t r0 = t0 * AMX_MR, r1 = t1 * AMX_MR < N ? t1 * AMX_MR : N;
            bf16_rows_amx(y, x, r0, r1, wq, h + hsize * fa_thread_id(), K, Kb, M);
            fa_k->bias_act_rows(y + r0 * M, NULL, bias, r1 - r0, M, M, activation, 0, 0, NULL);
        }
    }
    free(wq);
    free(h);
    return 0;
}

/* ---- the bf16 tile GEMM: the bfloat16 compute type and bf16 training share it --------------
 * C (rows, N) = C0 + A B, A's values rounded to bf16 (or already bf16), B packed in pairs of k.
 * One bf16 term per input, one TDPBF16PS per 16 pairs of k. Its order (the SDM's, checked on
 * the instruction): for each block of 16 pairs, the even elements' products summed in one
 * float32 sum and the odd ones' in another, both from zero, then c = fl(c + fl(s_even + s_odd)):
 *   scalar math:  acc = C0;  for each block b in order:  acc = fl(acc + fl(s_even(b) + s_odd(b)))
 * with C0 = 0 for the bfloat16 compute type (reference._linear_bfloat16 with order="amx"
 * computes it so); subnormal products and sums flush to zero, as on the vdpbf16ps path. Where
 * K is cut into chunks, each chunk's sums are stored and loaded back exactly: the order above
 * holds whatever the chunking.
 *   B     panels of `pw` (32 or 64) columns: pair row kk of panel p at b + p pstride + kk ldb
 *         bytes (ldb = 4 pw), its word c holding B(2kk, pw p + c) in the low half and
 *         B(2kk + 1, pw p + c) in the high half; kh pair rows per panel, a short last block of
 *         16 read from a zero-padded copy, columns past N multiplied but not stored
 *   A     per chunk of AMX_RB rows and AMX_KB blocks of 16 pairs: the rows' bf16 pairs, zero
 *         past K and past the rows, packed once per chunk and met by every panel
 * Blocking: 2 x 2 tiles of C (32 rows x 32 columns) per pass over the K chunk: tiles 0-3 C,
 * 4, 5 A (rows 0-15, 16-31), 6, 7 B (columns 0-15, 16-31): four TDPBF16PS per four loads
 * (amx_tiles_run). Which operand stays where (the tiles' units are fed about 0.75 tile per
 * 16-cycle TDP from L2, far less from L3, and every pass needs one tile of A and one of B per
 * two TDP): a 32-column panel of B's K chunk (32 KB) stays in L1 while every 32-row group of A
 * (the chunk's rows packed once, up to AMX_RB x 1 KB: in L2) passes it, so the only operand
 * read from L2 is A, half a tile per TDP; the next panel is prefetched during those passes, so
 * that its first group does not wait on L3; the weight comes from L3 once per AMX_RB rows. A
 * 32 x 32 block's epilogue (bias, activation) runs halfway through the next block's products,
 * while the tiles work and after its stores have drained. */
/* AMX_RB (fa_tiles.h): rows per chunk of A (packed once per K chunk: 512 KB, a quarter of the
 * L2 of every AMX CPU so far) */
/* AMX_KB (fa_tiles.h): blocks of 16 pairs (32 k) per chunk of K (a 32-column panel of B:
 * 32 KB) */

typedef struct {
    const uint8_t *b;
    int64_t ldb, pstride, pw, kh;
} amx_bpanels;

/* the bfloat16 compute type's epilogue, done in the last K chunk's pass on each 32 x 32 block
 * of C while it is in L1 (during the next block's products), not in a pass over C afterwards:
 * C's columns' bias (NULL: none) and the activation, by the level's bias_act_rows */
typedef struct {
    const float *bias;
    int act;
    /* the result as bf16 bits (rows ldyb apart from row row0 of the call's C), rounded after
     * the epilogue, instead of C (only where K is one chunk: no partial sums to keep); NULL:
     * C itself */
    uint16_t *yb;
    int64_t ldyb, row0;
} amx_epilogue;

/* how A is read: rounded to bf16 (the bfloat16 compute type), or holding bf16 values already
 * (bf16 training: the top halves) by rows, or transposed (A[k lda + m]), or bf16 bits by rows
 * (uint16_t: the bfloat16 FFN's hidden) */
enum { AMX_A_ROUND, AMX_A_BF16, AMX_A_BF16_T, AMX_A_BITS };

/* 32 floats at x (k < n of them; zero past) -> 16 words of bf16 pairs (the top halves) */
static __m512i amx_pairs32(const float *x, int64_t n)
{
    const __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
    const __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1u);
    const __m512i v0 = _mm512_srli_epi32(_mm512_maskz_loadu_epi32(m0, x), 16);
    const __m512i v1 = _mm512_srli_epi32(_mm512_maskz_loadu_epi32(m1, x + 16), 16);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(v0)),
                              _mm512_cvtepi32_epi16(v1), 1);
}

/* r[i][j] = r[j][i]: a 16 x 16 transpose of 32-bit words in registers */
static void amx_transpose16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(u[i + j], u[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

/* Rows m0 .. m0 + 15 of op(A) = A^T (op(A)[m][k] = A[k lda + m]; M, K its sizes), pairs kk0 ..
 * kk0 + nkk - 1 (nkk a multiple of 16) into aq (row stride ldq words), zero past M and K. Per
 * 16 pairs: rows 2kk and 2kk + 1 of A merged into words (as bf16_pack_b_amx), then transposed. */
static void amx_pack_at(uint32_t *aq, int64_t ldq, const float *A, int64_t lda, int64_t m0,
                        int64_t M, int64_t K, int64_t kk0, int64_t nkk)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const int64_t nm = M - m0 < 16 ? (M - m0 > 0 ? M - m0 : 0) : 16;
    const __mmask16 mk = (__mmask16)((1u << nm) - 1u);
    for (int64_t j0 = 0; j0 < nkk; j0 += 16) {
        __m512i r[16];
        for (int j = 0; j < 16; j++) {
            const int64_t k = 2 * (kk0 + j0 + j);
            const __m512i v0 = k < K ? _mm512_maskz_loadu_epi32(mk, A + k * lda + m0)
                                     : _mm512_setzero_si512();
            const __m512i v1 = k + 1 < K ? _mm512_maskz_loadu_epi32(mk, A + (k + 1) * lda + m0)
                                         : _mm512_setzero_si512();
            r[j] = _mm512_or_si512(_mm512_and_si512(v1, hi), _mm512_srli_epi32(v0, 16));
        }
        amx_transpose16(r);
        for (int i = 0; i < 16; i++)
            _mm512_store_si512((void *)(aq + i * ldq + j0), r[i]);
    }
}

/* rows [m0, m0 + 32) of op(A), k from 32 kb0 for nkb blocks, into aq (row stride 16 nkb words) */
static void amx_pack_a32(uint32_t *aq, int mode, const void *Av, int64_t lda, int64_t m0,
                         int64_t M, int64_t K, int64_t kb0, int64_t nkb)
{
    const int64_t ldq = 16 * nkb, k0 = 32 * kb0;
    const float *A = Av;
    if (mode == AMX_A_BITS) {           /* the bits as they are, zero past K */
        const int64_t n = K - k0 < 2 * ldq ? K - k0 : 2 * ldq;
        for (int64_t r = 0; r < 32; r++) {
            uint16_t *a_r = (uint16_t *)(aq + r * ldq);
            if (m0 + r < M) {
                memcpy(a_r, (const uint16_t *)Av + (m0 + r) * lda + k0, (size_t)n * 2);
                memset(a_r + n, 0, (size_t)(2 * ldq - n) * 2);
            } else {
                memset(a_r, 0, (size_t)(ldq * 4));
            }
        }
        return;
    }
    if (mode == AMX_A_BF16_T) {
        amx_pack_at(aq, ldq, A, lda, m0, M, K, 16 * kb0, ldq);
        amx_pack_at(aq + 16 * ldq, ldq, A, lda, m0 + 16, M, K, 16 * kb0, ldq);
        return;
    }
    for (int64_t r = 0; r < 32; r++) {
        uint32_t *a_r = aq + r * ldq;
        const float *x = A + (m0 + r) * lda + k0;
        if (m0 + r >= M)
            memset(a_r, 0, (size_t)(ldq * 4));
        else if (mode == AMX_A_ROUND)
            amx_round_row((uint16_t *)a_r, x, K - k0 < 2 * ldq ? K - k0 : 2 * ldq, 2 * ldq);
        else
            for (int64_t j = 0; j < ldq; j += 16)
                _mm512_store_si512((void *)(a_r + j), amx_pairs32(x + 2 * j, K - k0 - 2 * j));
    }
}

/* a block held in c (32 x 32, row stride 32): its epilogue, then rounded to ep's bits */
static void amx_block_bits(const amx_epilogue *ep, float (*c)[32], int64_t m0, int64_t n0,
                           int64_t mr, int64_t nc)
{
    fa_k->bias_act_rows(&c[0][0], NULL, ep->bias ? ep->bias + n0 : NULL, mr, nc, 32, ep->act,
                        0, 0, NULL);
    for (int64_t r = 0; r < mr; r++)
        amx_round_row(ep->yb + (ep->row0 + m0 + r) * ep->ldyb + n0, c[r], nc, nc);
}

/* the epilogue of the 32 x 32 block of C at (m0, n0), mr x nc of it (nothing for nc = 0) */
static void amx_block_epilogue(float *C, int64_t ldc, int64_t m0, int64_t n0, int64_t mr,
                               int64_t nc, const amx_epilogue *ep)
{
    if (nc > 0)
        fa_k->bias_act_rows(C + m0 * ldc + n0, NULL, ep->bias ? ep->bias + n0 : NULL, mr, nc,
                            ldc, ep->act, 0, 0, NULL);
}

/* C (rows [0, M) x columns [0, N), row stride ldc) = (load_c ? C : 0) + aq (32-row groups,
 * row stride 64 nkb bytes) B (blocks kb0 .. kb0 + nkb - 1), then the epilogue ep if any: per
 * 32-column panel of B (its nkb blocks in L1), every row group in turn (the blocking above). */
static void amx_tiles_run(const uint32_t *aq, int64_t M, const amx_bpanels *bp, int64_t kb0,
                          int64_t nkb, int64_t N, float *C, int64_t ldc, int load_c,
                          const amx_epilogue *ep)
{
    const int64_t lda = 64 * nkb, groups = (M + 31) / 32;
    const int short_last = (kb0 + nkb) * 16 > bp->kh;    /* the panel's last block is short */
    const int64_t nfull = short_last ? nkb - 1 : nkb;
    /* the next panel's lines (2 per pair row: 32 columns of 4 bytes) spread over this panel's
     * steps, at least one per step */
    const int64_t lines = 32 * nfull, per_step = (32 + groups - 1) / groups;
    float c[32][32] __attribute__((aligned(64)));
    uint32_t tail[16][32] __attribute__((aligned(64)));
    int64_t ep_m0 = 0, ep_n0 = 0, ep_mr = 0, ep_nc = 0;  /* the block whose epilogue is due */
    const int bits = ep && ep->yb;      /* every block through c, C never touched */
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const int64_t nc = N - n0 < 32 ? N - n0 : 32;
        const uint8_t *b = bp->b + (n0 / bp->pw) * bp->pstride + (n0 % bp->pw) * 4 +
                           kb0 * 16 * bp->ldb;
        const uint8_t *next = n0 + 32 < N ? bp->b + ((n0 + 32) / bp->pw) * bp->pstride +
                                                ((n0 + 32) % bp->pw) * 4 + kb0 * 16 * bp->ldb
                                          : NULL;
        if (short_last) {                   /* its pair rows below kh, then zeros */
            memset(tail, 0, sizeof tail);
            for (int64_t i = 0; i < bp->kh - (kb0 + nfull) * 16; i++)
                memcpy(tail[i], b + (nfull * 16 + i) * bp->ldb, 128);
        }
        int64_t line = 0;                   /* of the next panel's, prefetched so far */
        for (int64_t m0 = 0; m0 < M; m0 += 32) {
            const int64_t mr = M - m0 < 32 ? M - m0 : 32;
            const uint8_t *a = (const uint8_t *)aq + m0 * lda;
            /* the tiles load and store C in place */
            const int full = !bits && mr == 32 && nc == 32;
            float *cb = full ? C + m0 * ldc + n0 : &c[0][0];
            const int64_t ldcb = full ? 4 * ldc : 128;
            if (load_c && !full)
                for (int64_t r = 0; r < 32; r++)
                    for (int64_t j = 0; j < 32; j++)
                        c[r][j] = r < mr && j < nc ? C[(m0 + r) * ldc + n0 + j] : 0.0f;
            if (load_c) {
                AMX_LOAD(0, cb, ldcb);
                AMX_LOAD(1, cb + 16, ldcb);
                AMX_LOAD(2, (const uint8_t *)cb + 16 * ldcb, ldcb);
                AMX_LOAD(3, (const uint8_t *)cb + 16 * ldcb + 64, ldcb);
            } else {
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
            }
            for (int64_t kb = 0; kb < nkb; kb++) {
                const uint8_t *bk = kb < nfull ? b + kb * 16 * bp->ldb : (const uint8_t *)tail;
                const int64_t ldk = kb < nfull ? bp->ldb : 128;
                AMX_LOAD(4, a + kb * 64, lda);
                AMX_LOAD(6, bk, ldk);
                AMX_DPBF16PS(0, 4, 6);
                AMX_LOAD(7, bk + 64, ldk);
                AMX_DPBF16PS(1, 4, 7);
                AMX_LOAD(5, a + 16 * lda + kb * 64, lda);
                AMX_DPBF16PS(2, 5, 6);
                AMX_DPBF16PS(3, 5, 7);
                for (int64_t i = 0; next && i < per_step && line < lines; i++, line++)
                    _mm_prefetch((const char *)next + (line / 2) * bp->ldb + (line % 2) * 64,
                                 _MM_HINT_T0);
                if (ep && !bits && kb == nkb / 2) { /* the previous block's, meanwhile */
                    amx_block_epilogue(C, ldc, ep_m0, ep_n0, ep_mr, ep_nc, ep);
                    ep_nc = 0;
                }
            }
            AMX_STORE(0, cb, ldcb);
            AMX_STORE(1, cb + 16, ldcb);
            AMX_STORE(2, (uint8_t *)cb + 16 * ldcb, ldcb);
            AMX_STORE(3, (uint8_t *)cb + 16 * ldcb + 64, ldcb);
            if (bits) {
                amx_block_bits(ep, c, m0, n0, mr, nc);
                continue;
            }
            if (!full)
                for (int64_t r = 0; r < mr; r++)
                    memcpy(C + (m0 + r) * ldc + n0, c[r], (size_t)nc * sizeof(float));
            ep_m0 = m0;
            ep_n0 = n0;
            ep_mr = mr;
            ep_nc = nc;
        }
    }
    if (ep && !bits) amx_block_epilogue(C, ldc, ep_m0, ep_n0, ep_mr, ep_nc, ep);
}

/* a caller's broken promise (not something an input can cause): stop with a message */
static void amx_fail(const char *what)
{
    fprintf(stderr, "fastattn: AMX tiles: %s\n", what);
    abort();
}

/* C (M, N) = (beta ? C : 0) + op(A) B on the tiles, one thread, then the epilogue ep if any
 * (with ep->yb: C is NULL, K at most one chunk, beta 0); op(A) (M, K): A[m lda + k], or
 * A[k lda + m] (AMX_A_BF16_T); 0, or -1: out of memory */
static int amx_bf16_gemm(int mode, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                         const amx_bpanels *bp, int beta, float *C, int64_t ldc,
                         const amx_epilogue *ep)
{
    if (M <= 0 || N <= 0) return 0;
    const int64_t nkb = (K + 31) / 32;
    if (ep && ep->yb && (nkb > AMX_KB || beta)) amx_fail("bits out of a product of K chunks");
    const int64_t rb = M < AMX_RB ? (M + 31) / 32 * 32 : AMX_RB, kb = nkb < AMX_KB ? nkb : AMX_KB;
    uint32_t *aq = aligned_alloc(64, (size_t)(rb * kb * 64));   /* a decode step's: 32 KB,
                                                                   AMX_RB rows': 512 KB */
    if (!aq) return -1;
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    for (int64_t mc = 0; mc < M; mc += AMX_RB) {
        const int64_t mr = M - mc < AMX_RB ? M - mc : AMX_RB;
        for (int64_t kc = 0; kc < nkb; kc += AMX_KB) {
            const int64_t nk = nkb - kc < AMX_KB ? nkb - kc : AMX_KB;
            for (int64_t m0 = 0; m0 < mr; m0 += 32)
                amx_pack_a32(aq + m0 * 16 * nk, mode, A, lda, mc + m0, M, K, kc, nk);
            amx_epilogue chunk;             /* ep, its bits' rows from this chunk's */
            if (ep) {
                chunk = *ep;
                chunk.row0 += mc;
            }
            amx_tiles_run(aq, mr, bp, kc, nk, N, C ? C + mc * ldc : NULL, ldc, beta || kc > 0,
                          kc + nk == nkb && ep ? &chunk : NULL);
        }
    }
    AMX_RELEASE();
    free(aq);
    return 0;
}

/* ---- the bfloat16 compute type on the tiles (fastattn.h; FASTATTN_BF16_PATH=amx) ------------
 * Any number of rows (fa_amx_kernels.bfloat16_forward): the inputs rounded as every bfloat16
 * path rounds them, fa_bfloat16_pack's panels ([p][kk][64] pairs) read in place as B; chunks
 * of rows shared out to the threads as they come free, or with fewer blocks of 32 rows than
 * threads the weight's panels split over them; the epilogue (bias, activation) done by the
 * tiles' passes (amx_epilogue). */
static int bfloat16_forward_amx(float *y, const float *x, const uint16_t *wp, const float *bias,
                                int64_t N, int64_t K, int64_t M, int activation, int nthreads,
                                const uint16_t *xb, uint16_t *yb)
{
    const int mode = xb ? AMX_A_BITS : AMX_A_ROUND;
    const int64_t Kh = (K + 1) / 2, nblk = (N + 31) / 32, P = (M + BFC_NP - 1) / BFC_NP;
    const amx_bpanels bp = {.b = (const uint8_t *)wp, .ldb = 4 * BFC_NP,
                            .pstride = 4 * BFC_NP * Kh, .pw = BFC_NP, .kh = Kh};
    /* fewer row blocks than threads (a decode step's rows): the threads split the panels */
    const int by_rows = nblk >= nthreads;
    const int64_t parts = by_rows ? nblk : P;
    const int nt = fa_team_size(nthreads < parts ? nthreads : (int)parts,
                                2.0 * (double)N * (double)K * (double)M, 2e5);
    int failed = 0;
    if (by_rows) {
        /* rows in chunks of half a thread's share (at least 64 rows, at most AMX_RB), taken in
         * turn by whichever thread is free: a core slowed by a neighbour leaves its part to
         * the other instead of holding the team at the end; each chunk streams the weight
         * from L3 once, so the chunks are as tall as that balance allows */
        const int64_t half = nblk / (2 * nt);
        const int64_t cb = half < 2 ? 2 : half > AMX_RB / 32 ? AMX_RB / 32 : half;
        const int64_t nchunks = (nblk + cb - 1) / cb;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 1) reduction(| : failed)
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t r0 = c * cb * 32, r1 = (c + 1) * cb * 32 < N ? (c + 1) * cb * 32 : N;
            const amx_epilogue ep = {.bias = bias, .act = activation, .yb = yb, .ldyb = M,
                                     .row0 = r0};
            const void *a = xb ? (const void *)(xb + r0 * K) : (const void *)(x + r0 * K);
            failed |= amx_bf16_gemm(mode, r1 - r0, M, K, a, K, &bp, 0, yb ? NULL : y + r0 * M,
                                    M, &ep) != 0;
        }
        return failed ? -1 : 0;
    }
#pragma omp parallel num_threads(nt) if (nt > 1) reduction(| : failed)
    {
        int64_t b0, b1;
        fa_split(parts, 1, &b0, &b1);
        if (b0 < b1) {
            const int64_t m0 = b0 * BFC_NP, m1 = b1 * BFC_NP < M ? b1 * BFC_NP : M;
            amx_bpanels part = bp;
            part.b += b0 * bp.pstride;
            const amx_epilogue ep = {.bias = bias ? bias + m0 : NULL, .act = activation,
                                     .yb = yb ? yb + m0 : NULL, .ldyb = M};
            failed |= amx_bf16_gemm(mode, N, m1 - m0, K, xb ? (const void *)xb : (const void *)x,
                                    K, &part, 0, yb ? NULL : y + m0, M, &ep) != 0;
        }
    }
    return failed ? -1 : 0;
}

/* ---- bf16 training's products on the tiles (fa_bf16_b_gemm, bf16_gemm.c) -------------------
 * C (M, N) = beta C + A op(B), row-major, every value of A and B a bf16 held in a float32 (the
 * rounded operands of bf16 training: the low 16 bits are zero, the bf16 is the top half): the
 * products exact, float32 sums in TDPBF16PS's order above from C0 = beta C. A (M, K) row
 * stride lda; op(B) (K, N): B[k ldb + n], or with tb B[n ldb + k], packed by bf16_pack_b_amx
 * in panels of 32 columns (Kh pair rows, K / 2 rounded up to whole blocks of 16, zero past K
 * and N), once per call or, for a weight, once per optimizer step (fa_bf16_weight_pack), and
 * shared by the threads' row blocks. */

/* op(B) (K, N) packed as above (aligned_alloc'd; NULL: out of memory) */
static uint32_t *bf16_pack_b_amx(int tb, int64_t K, int64_t N, const float *B, int64_t ldb)
{
    const int64_t Kh = (K + 31) / 32 * 16, P = (N + 31) / 32;
    uint32_t *bq = aligned_alloc(64, (size_t)(P * Kh * 32 * 4));
    if (!bq) return NULL;
    if (!tb) { /* rows 2kk and 2kk + 1 of B merged 16 columns at a time */
        memset(bq, 0, (size_t)(P * Kh * 32 * 4));
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        for (int64_t kk = 0; 2 * kk < K; kk++) {
            const float *r0 = B + 2 * kk * ldb, *r1 = 2 * kk + 1 < K ? r0 + ldb : NULL;
            for (int64_t n0 = 0; n0 < N; n0 += 16) {
                const __mmask16 m = N - n0 >= 16 ? 0xffff : (__mmask16)((1u << (N - n0)) - 1u);
                const __m512i v0 = _mm512_maskz_loadu_epi32(m, r0 + n0);
                const __m512i v1 = r1 ? _mm512_maskz_loadu_epi32(m, r1 + n0)
                                      : _mm512_setzero_si512();
                const __m512i w =
                    _mm512_or_si512(_mm512_and_si512(v1, hi), _mm512_srli_epi32(v0, 16));
                _mm512_mask_storeu_epi32(bq + ((n0 / 32) * Kh + kk) * 32 + n0 % 32, m, w);
            }
        }
    } else { /* row n of B holds column n of op(B): its pairs scattered down the panel */
        if (N % 32) memset(bq + (P - 1) * Kh * 32, 0, (size_t)(Kh * 32 * 4));
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(32));
        for (int64_t n = 0; n < N; n++) {
            uint32_t *col = bq + (n / 32) * Kh * 32 + n % 32;
            for (int64_t k0 = 0; k0 < 2 * Kh; k0 += 32)
                _mm512_i32scatter_epi32(col + (k0 / 2) * 32, idx,
                                        amx_pairs32(B + n * ldb + k0, K - k0), 4);
        }
    }
    return bq;
}

/* C (M, N) = beta C + op(A) op(B), op(B) packed by bf16_pack_b_amx, op(A) (M, K): A[m lda + k]
 * or, with ta, A[k lda + m]; 0, or -1: out of memory */
static int bf16_gemm_packed_amx(int ta, int64_t M, int64_t N, int64_t K, const float *A,
                                int64_t lda, const uint32_t *bq, float beta, float *C,
                                int64_t ldc)
{
    const int64_t Kh = (K + 31) / 32 * 16;
    const amx_bpanels bp = {.b = (const uint8_t *)bq, .ldb = 128, .pstride = 128 * Kh, .pw = 32,
                            .kh = Kh};
    return amx_bf16_gemm(ta ? AMX_A_BF16_T : AMX_A_BF16, M, N, K, A, lda, &bp, beta != 0.0f, C,
                         ldc, NULL);
}

/* ---- bf16 attention's two products on the tiles (attention_body.h: paths amx, amx-emulated) --
 * A block of bq queries (a multiple of 32: the avx512 level's block) against a block of nb keys:
 * the keys and values rounded here (the bfloat16 compute type's rule) and paired, float32 sums
 * in TDPBF16PS's order per block of 16 pairs (above). Per 32 queries and 32 keys (or
 * features): tiles 0-3 C (2 x 2 of 16 x 16), 4, 5 A, 6, 7 B (queries 0-15, 16-31).
 *   scores  st[j][i] = sum_t kp[j][t] qp[t][i] for j < nb rounded up to 16 (st's row stride bq
 *           floats): kp the keys' pairs along D (built in work: rows up to nb rounded up to 16,
 *           ldk words each, zero past D and past nb), qp the queries' pairs (nkb blocks of 16
 *           pair rows of bq words, zero past D)
 *   P.V     ot[e][i] += sum_t vt[e][t] pp[t][i] for e < Dv (ot's row stride bq floats): pp P^'s
 *           pairs of keys (ntb blocks of 16 pair rows of bq words, zero past nb), vt the values'
 *           pairs of keys transposed (built in work: the rounded rows, then 16 x 16 register
 *           transposes of the merged pairs; rows up to Dv rounded up to 16, zero past nb)
 * work: at least (nb rounded up to 16) x (D / 2 + 16) words for the scores, 2 x (Dv + 16) x
 * (ceil(nb / 2) rounded up to 16) for P.V. */

static void att_scores_amx(float *st, int64_t bq, const float *k, int64_t ksl, int64_t nb,
                           int64_t D, const uint32_t *qp, uint32_t *work)
{
    const int64_t nkb = ((D + 1) / 2 + 15) / 16, ldk = 16 * nkb, nb16 = (nb + 15) / 16 * 16;
    uint32_t *kp = work;
    for (int64_t j = 0; j < nb16; j++) {
        if (j < nb)
            amx_round_row((uint16_t *)(kp + j * ldk), k + j * ksl, D, 2 * ldk);
        else
            memset(kp + j * ldk, 0, (size_t)ldk * 4);
    }
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    for (int64_t j0 = 0; j0 < nb; j0 += 32) {
        const int two = j0 + 16 < nb;                     /* a second group of 16 keys */
        const uint32_t *k0 = kp + j0 * ldk, *k1 = k0 + 16 * ldk;
        for (int64_t i0 = 0; i0 < bq; i0 += 32) {
            float *s0 = st + j0 * bq + i0, *s1 = s0 + 16 * bq;
            AMX_ZERO(0);
            AMX_ZERO(1);
            AMX_ZERO(2);
            AMX_ZERO(3);
            for (int64_t kb = 0; kb < nkb; kb++) {
                const uint32_t *q = qp + kb * 16 * bq + i0;
                AMX_LOAD(4, k0 + kb * 16, 4 * ldk);
                AMX_LOAD(6, q, 4 * bq);
                AMX_DPBF16PS(0, 4, 6);
                AMX_LOAD(7, q + 16, 4 * bq);
                AMX_DPBF16PS(1, 4, 7);
                if (two) {
                    AMX_LOAD(5, k1 + kb * 16, 4 * ldk);
                    AMX_DPBF16PS(2, 5, 6);
                    AMX_DPBF16PS(3, 5, 7);
                }
            }
            AMX_STORE(0, s0, 4 * bq);
            AMX_STORE(1, s0 + 16, 4 * bq);
            if (two) {
                AMX_STORE(2, s1, 4 * bq);
                AMX_STORE(3, s1 + 16, 4 * bq);
            }
        }
    }
    AMX_RELEASE();
}

static void att_pv_amx(float *ot, int64_t bq, int64_t Dv, const float *v, int64_t vsl,
                       int64_t nb, const uint32_t *pp, uint32_t *work)
{
    const int64_t ntb = ((nb + 1) / 2 + 15) / 16, ldv = 16 * ntb, Dv16 = (Dv + 15) / 16 * 16;
    uint32_t *vt = work;
    uint16_t *vr = (uint16_t *)(work + Dv16 * ldv);      /* 2 ldv rows of Dv16 bf16 */
    for (int64_t j = 0; j < 2 * ldv; j++) {
        if (j < nb)
            amx_round_row(vr + j * Dv16, v + j * vsl, Dv, Dv16);
        else
            memset(vr + j * Dv16, 0, (size_t)Dv16 * 2);
    }
    for (int64_t e0 = 0; e0 < Dv16; e0 += 16)
        for (int64_t t0 = 0; t0 < ldv; t0 += 16) {
            __m512i r[16];                                /* r[tt][e]: keys 2t, 2t + 1 */
            for (int tt = 0; tt < 16; tt++) {
                const uint16_t *r0 = vr + 2 * (t0 + tt) * Dv16 + e0;
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)r0));
                const __m512i hi =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(r0 + Dv16)));
                r[tt] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
            }
            amx_transpose16(r);
            for (int ee = 0; ee < 16; ee++)
                _mm512_storeu_si512((void *)(vt + (e0 + ee) * ldv + t0), r[ee]);
        }
    float c[32][32] __attribute__((aligned(64)));       /* a block past Dv: its rows copied */
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    for (int64_t e0 = 0; e0 < Dv; e0 += 32) {
        const int64_t ne = Dv - e0 < 32 ? Dv - e0 : 32;
        const int two = ne > 16;                          /* a second group of 16 features */
        const uint32_t *v0 = vt + e0 * ldv, *v1 = v0 + 16 * ldv;
        for (int64_t i0 = 0; i0 < bq; i0 += 32) {
            float *cb = ne == 32 ? ot + e0 * bq + i0 : &c[0][0];
            const int64_t ldc = ne == 32 ? 4 * bq : 128;
            if (ne < 32) {
                memset(c, 0, sizeof c);
                for (int64_t r = 0; r < ne; r++)
                    memcpy(c[r], ot + (e0 + r) * bq + i0, sizeof c[r]);
            }
            AMX_LOAD(0, cb, ldc);
            AMX_LOAD(1, cb + 16, ldc);
            AMX_LOAD(2, (const uint8_t *)cb + 16 * ldc, ldc);
            AMX_LOAD(3, (const uint8_t *)cb + 16 * ldc + 64, ldc);
            for (int64_t tb = 0; tb < ntb; tb++) {
                const uint32_t *p = pp + tb * 16 * bq + i0;
                AMX_LOAD(4, v0 + tb * 16, 4 * ldv);
                AMX_LOAD(6, p, 4 * bq);
                AMX_DPBF16PS(0, 4, 6);
                AMX_LOAD(7, p + 16, 4 * bq);
                AMX_DPBF16PS(1, 4, 7);
                if (two) {
                    AMX_LOAD(5, v1 + tb * 16, 4 * ldv);
                    AMX_DPBF16PS(2, 5, 6);
                    AMX_DPBF16PS(3, 5, 7);
                }
            }
            AMX_STORE(0, cb, ldc);
            AMX_STORE(1, cb + 16, ldc);
            AMX_STORE(2, (uint8_t *)cb + 16 * ldc, ldc);
            AMX_STORE(3, (uint8_t *)cb + 16 * ldc + 64, ldc);
            if (ne < 32)
                for (int64_t r = 0; r < ne; r++)
                    memcpy(ot + (e0 + r) * bq + i0, c[r], sizeof c[r]);
        }
    }
    AMX_RELEASE();
}

/* ---- bf16 attention's backward products (fa_amx_kernels.pairs_gemm) -------------------------
 * C (M, N) += A B with both operands already in pairs (attention_amx_body.h packs them), in
 * 32 x 32 blocks of C: tiles 0-3 C (2 x 2 of 16 x 16), 4, 5 A (rows 0-15, 16-31), 6, 7 B
 * (columns 0-15, 16-31); a block's second row or column group only where M or N reach it. C is
 * loaded, summed into in TDPBF16PS's order (per 16 pairs: c = fl(c + fl(s_even + s_odd))) and
 * stored; a block past M or N goes through a buffer. */
static void amx_pairs_gemm(float *C, int64_t ldc, int64_t M, int64_t N, int64_t KP,
                           const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb)
{
    float c[32][32] __attribute__((aligned(64)));
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
        const int64_t mr = M - m0 < 32 ? M - m0 : 32;
        for (int64_t n0 = 0; n0 < N; n0 += 32) {
            const int64_t nc = N - n0 < 32 ? N - n0 : 32;
            const int two_m = mr > 16, two_n = nc > 16, full = mr == 32 && nc == 32;
            float *cb = full ? C + m0 * ldc + n0 : &c[0][0];
            const int64_t ldcb = full ? 4 * ldc : 128;
            if (!full)
                for (int64_t r = 0; r < 32; r++)
                    for (int64_t j = 0; j < 32; j++)
                        c[r][j] = r < mr && j < nc ? C[(m0 + r) * ldc + n0 + j] : 0.0f;
            AMX_LOAD(0, cb, ldcb);
            AMX_LOAD(1, cb + 16, ldcb);
            AMX_LOAD(2, (const uint8_t *)cb + 16 * ldcb, ldcb);
            AMX_LOAD(3, (const uint8_t *)cb + 16 * ldcb + 64, ldcb);
            for (int64_t k0 = 0; k0 < KP; k0 += 16) {
                const uint32_t *a = A + m0 * lda + k0, *b = B + k0 * ldb + n0;
                AMX_LOAD(4, a, 4 * lda);
                AMX_LOAD(6, b, 4 * ldb);
                AMX_DPBF16PS(0, 4, 6);
                if (two_n) {
                    AMX_LOAD(7, b + 16, 4 * ldb);
                    AMX_DPBF16PS(1, 4, 7);
                }
                if (two_m) {
                    AMX_LOAD(5, a + 16 * lda, 4 * lda);
                    AMX_DPBF16PS(2, 5, 6);
                    if (two_n) AMX_DPBF16PS(3, 5, 7);
                }
            }
            AMX_STORE(0, cb, ldcb);
            AMX_STORE(1, cb + 16, ldcb);
            AMX_STORE(2, (uint8_t *)cb + 16 * ldcb, ldcb);
            AMX_STORE(3, (uint8_t *)cb + 16 * ldcb + 64, ldcb);
            if (!full)
                for (int64_t r = 0; r < mr; r++)
                    memcpy(C + (m0 + r) * ldc + n0, c[r], (size_t)nc * sizeof(float));
        }
    }
    AMX_RELEASE();
}

#if !defined(AMX_EMULATE)
/* ---- the tiles' peak (fa_peak): the roofline the tile GEMMs' rows are read against ----------
 * Four C tiles (0-3) each fed by one of two A tiles (4, 5) and one of two B tiles (6, 7), all
 * 16 x 64 bytes of zeros: every step's four TDP instructions are independent of one another
 * and depend only on the previous step's, so the loop runs at the units' throughput (one TDP
 * per 16 cycles per core: 16 x 16 x 32 bf16 pairs' products = 16384 flops for TDPBF16PS,
 * 16 x 16 x 64 byte products = 32768 ops for TDPBSSD). One element of C is returned so that
 * the loop is kept. */
static float amx_tile_peak(int64_t iters, int int8)
{
    static const uint8_t zero[1024] __attribute__((aligned(64)));
    float c[16][16] __attribute__((aligned(64)));
    amx_tilecfg_t cfg;
    amx_config(&cfg);
    AMX_CONFIG(&cfg);
    AMX_LOAD(4, zero, 64);
    AMX_LOAD(5, zero, 64);
    AMX_LOAD(6, zero, 64);
    AMX_LOAD(7, zero, 64);
    AMX_ZERO(0);
    AMX_ZERO(1);
    AMX_ZERO(2);
    AMX_ZERO(3);
    if (int8) {
        for (int64_t it = 0; it < iters; it++) {
            AMX_DPBSSD(0, 4, 6);
            AMX_DPBSSD(1, 4, 7);
            AMX_DPBSSD(2, 5, 6);
            AMX_DPBSSD(3, 5, 7);
        }
    } else {
        for (int64_t it = 0; it < iters; it++) {
            AMX_DPBF16PS(0, 4, 6);
            AMX_DPBF16PS(1, 4, 7);
            AMX_DPBF16PS(2, 5, 6);
            AMX_DPBF16PS(3, 5, 7);
        }
    }
    AMX_STORE(0, &c[0][0], 64);
    AMX_RELEASE();
    return c[3][5];
}
#define AMX_TILE_PEAK amx_tile_peak
#else
#define AMX_TILE_PEAK NULL
#endif

const fa_amx_kernels AMX_KERNELS = {.bf16_forward = bf16_forward_amx,
                                    .bfloat16_forward = bfloat16_forward_amx,
                                    .bf16_pack_b = bf16_pack_b_amx,
                                    .bf16_gemm_packed = bf16_gemm_packed_amx,
                                    .att_scores = att_scores_amx, .att_pv = att_pv_amx,
                                    .pairs_gemm = amx_pairs_gemm, .tile_peak = AMX_TILE_PEAK};
#undef AMX_TILE_PEAK
