/* fa_tiles.h -- every tile size and few-row threshold of the kernels, in one table.
 *
 * Included by the kernel sources only (not by fastattn.h, so the short names stay out of the
 * binding): fa_instantiate.h takes each body's per-ISA knobs from here, the family .c files the
 * sizes shared by every ISA, and fa_build_tiles() (cpu.c) reports them all, for any level, to
 * fastattn.build_info()["tiles"], so tests aim at tile edges without copying these numbers.
 */
#ifndef FA_TILES_H
#define FA_TILES_H

/* ---- per ISA: <knob>_<suffix>, suffix = generic | v3 (AVX2 + FMA) | v4 (AVX-512) ----------
 *   FA_VL     floats per vector         ATT_NR    query vectors per attention tile (BQ = NR*VL)
 *   ATT_MR_S  keys per score tile       ATT_MR_P  value features per P.V tile
 *   SK_NV     weight vectors per packed-GEMM tile   SK_RB  rows of x per packed-GEMM tile
 * The attention tiles hold NR*MR accumulators: 12 of AVX2's 16 registers (2 of them for the
 * q or P vectors, 1 for the broadcast), 24 of AVX-512's 32; 12 independent FMA chains cover the
 * FMA latency x throughput of every AVX2 core (Haswell needs 10). */
#define FA_VL_generic 4
#define ATT_NR_generic 2
#define ATT_MR_S_generic 6
#define ATT_MR_P_generic 4
#define SK_NV_generic 2
#define SK_RB_generic 6

#define FA_VL_v3 8
#define ATT_NR_v3 2
#define ATT_MR_S_v3 6
#define ATT_MR_P_v3 6
#define SK_NV_v3 2
#define SK_RB_v3 6

#define FA_VL_v4 16
#define ATT_NR_v4 4
#define ATT_MR_S_v4 6
#define ATT_MR_P_v4 6
#define SK_NV_v4 3
#define SK_RB_v4 8

/* ---- the same for every ISA ---------------------------------------------------------------- */
#define ATT_BK 192       /* keys per attention block: a multiple of every ATT_MR_S; st (BK, BQ)
                            stays in L1 */
#define ATT_ROWS_DIV 4   /* attention runs one query row at a time when Lq <= BQ / ATT_ROWS_DIV
                            (few queries: a decode step, a handful of beams) */
#define ATT_BWD_BR 64    /* query rows per attention-backward block (its key blocks are BQ keys
                            wide, along the vector lanes): the P' and dS tiles (BR, BQ) stay in
                            L2 with the key block's packed K^T, V^T and accumulators */
#define SM_CHUNK 4       /* softmax read pass: vectors per running-max update */
#define FA_PANEL 48      /* features per packed weight panel: a multiple of every SK_NV * FA_VL */
#define PACKED_MAX_ROWS 32 /* decode steps of up to this many rows use the packed kernel (the
                              policy of fastattn.generate; the kernel itself takes any N) */
#define ROW_BLOCK 512    /* linear/ffn rows per GEMM block: large enough for BLAS's peak */
#define BLAS_ROW_ALIGN 12 /* row blocks handed to BLAS start on multiples of this: OpenBLAS's
                            Haswell sgemm rounds a row the same way only at the same place in its
                            12-row tile (its SkylakeX one anywhere), so aligned blocks
                            give every team size the same rows */
#define MIN_ROWS 128     /* below this many rows per thread, linear/ffn split the features */
#define COL_ALIGN 16     /* feature slices start on a 64-byte boundary */
#define SKINNY_ROWS 8    /* up to this many rows, our skinny kernel instead of BLAS (BLAS is weak
                            on such shapes: it packs the whole weight for a few dot products) */
#define REDUCE_ROWS 32   /* parameter gradients (dweight, dbias): rows per partial sum, summed in
                            a fixed order, so the result does not depend on the thread count */
#define REDUCE_MAX_BLOCKS 256 /* layer norm backward: at most this many partial sums (taller
                            inputs take a multiple of REDUCE_ROWS rows per partial) */

#endif /* FA_TILES_H */
