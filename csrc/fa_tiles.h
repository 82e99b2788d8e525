/* fa_tiles.h -- every tile size and few-row threshold of the kernels, in one table.
 *
 * Included by the kernel sources only (not by fastattn.h, so the short names stay out of the
 * binding). A per-ISA translation unit (kernels_<level>.c, quant_<arch>.c) defines
 * FA_ISA_LEVEL (a fa_isa_t value) first and gets its level's column of the first table under
 * the short names; each level's kernel table carries its sizes (fa_kernels.tiles), and
 * fa_build_tiles() (cpu.c) reports them with the shared ones to
 * fastattn.build_info()["tiles"], so tests aim at tile edges without copying these numbers.
 */
#ifndef FA_TILES_H
#define FA_TILES_H

/* ---- per ISA level --------------------------------------------------------------------------
 * The attention tiles hold NR*MR accumulators: 12 of AVX2's 16 registers (2 of them for the
 * q or P vectors, 1 for the broadcast), 24 of AVX-512's 32; 12 independent FMA chains cover the
 * FMA latency x throughput of every AVX2 core (Haswell needs 10). */
#ifdef FA_ISA_LEVEL
#if FA_ISA_LEVEL == 2
#define FA_LEVEL_PICK(generic, avx2, avx512) avx512
#elif FA_ISA_LEVEL == 1
#define FA_LEVEL_PICK(generic, avx2, avx512) avx2
#else
#define FA_LEVEL_PICK(generic, avx2, avx512) generic
#endif
/*                                generic avx2 avx512 */
#define FA_VL          FA_LEVEL_PICK(4,    8,   16)  /* floats per vector */
#define ATT_NR         FA_LEVEL_PICK(2,    2,   4)   /* query vectors per attention tile
                                                        (BQ = NR * VL queries) */
#define ATT_MR_S       FA_LEVEL_PICK(6,    6,   6)   /* keys per score tile */
#define ATT_MR_P       FA_LEVEL_PICK(4,    6,   6)   /* value features per P.V tile */
#define SK_NV          FA_LEVEL_PICK(2,    2,   3)   /* float32 GEMM engine: vectors of features
                                                        per register tile */
#define SK_RB          FA_LEVEL_PICK(6,    6,   8)   /* ... and rows per tile (gemm_body.h) */
#define BF_RB          FA_LEVEL_PICK(2,    4,   12)  /* bf16 few-row GEMM: rows per tile */
#define BF_NV          FA_LEVEL_PICK(4,    2,   2)   /* bf16 few-row GEMM: vectors per tile */
#define BF_FEW         FA_LEVEL_PICK(0,    2,   0)   /* bf16: up to this many rows, the whole
                                                        panel per pass (0: never) */
#define BFC_NV         FA_LEVEL_PICK(4,    2,   4)   /* bfloat16 compute, FMA tiles: vectors */
#define BFC_MR         FA_LEVEL_PICK(2,    6,   6)   /* ... and rows per tile */
#define BFC_FEW_NV     FA_LEVEL_PICK(8,    8,   8)   /* bfloat16, a decode step's rows: vectors
                                                        per pass (a multiple of a panel or a
                                                        divisor of it) */
#endif

/* ---- the same for every ISA ---------------------------------------------------------------- */
#define ATT_BK 192       /* keys per attention block: a multiple of every ATT_MR_S; st (BK, BQ)
                            stays in L1 */
#define ATT_ROWS_DIV 4   /* attention runs one query row at a time when Lq <= BQ / ATT_ROWS_DIV
                            (few queries: a decode step, a handful of beams) */
#define ATT_BWD_BR 64    /* query rows per attention-backward block (its key blocks are BQ keys
                            wide, along the vector lanes): the P' and dS tiles (BR, BQ) stay in
                            L2 with the key block's packed K^T, V^T and accumulators */
#define SM_CHUNK 4       /* softmax read pass: vectors per running-max update */
#define FA_PANEL 48      /* float32 GEMM engine: features per packed panel (the weight side,
                            fa_gemm_pack_panels); a multiple of every SK_NV * FA_VL */
#define ROW_BLOCK 512    /* bf16 training's products on the AMX tiles: rows per block, at most
                            (the float32 engine's blocks: gemm.c) */
#define COL_ALIGN 16     /* feature slices start on a 64-byte boundary */
#define REDUCE_ROWS 32   /* parameter gradients (dweight, dbias): rows per partial sum, summed in
                            a fixed order, so the result does not depend on the thread count */
#define REDUCE_MAX_BLOCKS 256 /* layer norm backward: at most this many partial sums (taller
                            inputs take a multiple of REDUCE_ROWS rows per partial) */

/* ---- quantised weights (quant.c and the int8 paths, quant_<arch>.c) ------------------------ */
#define BF_PANEL 32      /* bf16 features per packed panel: wp[p][k][f] = w[32 p + f][k] */
#define Q8_ROW_BLOCK 96  /* int8, many rows: rows quantised and multiplied together (the
                            quantised block stays in L2 while every panel meets it) */
#define Q8_MIN_ROWS 48   /* int8: below this many rows per thread, threads split panels */
#define Q8_PAIR 2        /* K per group of the int16 pair products (every path but AMX) */
/* int8 paths: features per panel (NP) and rows per register tile (MR) */
#define Q8_GENERIC_NP 16
#define Q8_GENERIC_MR 4
#define Q8_AVX2_NP 32    /* two passes of 16 features, 2 ymm of int32 sums per row each */
#define Q8_AVX2_MR 6
#define Q8_AVX2_ROWS 96  /* AVX2: rows per chunk of a panel, partial sums on the stack */
#define Q8_AVX2_KG 128   /* AVX2: K pairs per block of a chunk (32 x 2 x KG int16 = 16 KB
                            widened, in L1 while every tile of the chunk meets it) */
#define Q8_AVX2_WIDEN 12 /* AVX2: from this many rows on, each block is widened once */
#define Q8_AVX512_NP 64  /* 4 zmm of int32 sums per row */
#define Q8_AVX512_MR 6
#define BFC_NP 64        /* bfloat16 compute: features per panel (wp[p][kk][f], K in pairs);
                            a multiple of every tile's width */
#define BFC_DP_NV 4      /* AVX512_BF16 tiles: zmm of 16 features per row (<= 4) */
#define BFC_DP_MR 6      /* ... and rows per tile (<= 12) */
#define BFC_FEW_ROWS 2   /* bfloat16: up to this many rows, bfc_panels_few */
#define BFC_WIDEN_ROWS 12 /* bfloat16 FMA tiles: from this many rows, each panel is widened to
                            float32 once per block (fewer rows widen in registers) */
#define BFC_KB 64        /* bfloat16 FMA tiles: K pairs per widened block (2 x 64 x 64 floats,
                            32 KB: in L1) */
#define BFC_ROW_BLOCK 96 /* bfloat16, many rows: rows rounded and multiplied together */
#define BFC_TILE_ROWS 6  /* bfloat16: row blocks start on multiples of this (every tile height) */
#define BFC_MIN_ROWS 48  /* bfloat16: below this many rows per thread, threads split panels */
#define AMX_NP 32        /* AMX: two B tiles of 16 features side by side */
#define AMX_G 4          /* AMX: K per group, the tiles multiply quads of bytes */
#define AMX_MR 16        /* AMX: rows per tile */
#define AMX_RB 512       /* AMX: rows per block at most (the block's inputs in L2, the weight
                            read from L3 once per block: bf16_amx.h, quant.c) */
#define AMX_BLOCK_BYTES (1 << 20) /* ... and at most this many bytes of them */
#define AMX_KB 16        /* AMX bf16: blocks of 16 pairs (32 k) per chunk of K (a 32-column
                            panel of B: 32 KB, bf16_amx.h) */

#endif /* FA_TILES_H */
