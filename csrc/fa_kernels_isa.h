/* fa_kernels_isa.h -- one ISA level's kernels and their table, the whole of kernels_generic.c,
 * kernels_avx2.c and kernels_avx512.c. Each defines first FA_ISA_LEVEL (a fa_isa_t value: it
 * picks the level's column of fa_tiles.h), FA_KERNELS (the table's name) and, but for the
 * baseline, FA_TARGET (fa_target.h). Every body below is compiled once per level, its
 * functions static: the table is the only way in. */
#if defined(FA_TARGET)
#include "fa_target.h"
#endif

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "fa_kernels.h"
#include "fa_tiles.h"
#include "fa_simd.h"
#include "fa_rng_simd.h"

#include "attention_body.h"
#include "dropout_body.h"
#include "layernorm_body.h"
#include "linear_body.h"
#include "gemm_body.h"
#include "loss_body.h"
#include "optim_body.h"
#include "quant_body.h"
#include "softmax_body.h"

const fa_kernels FA_KERNELS = {
    .attention_forward = attention_forward,
    .attention_backward = attention_backward,
    .layer_norm_rows = layer_norm_rows,
    .layer_norm_backward_rows = layer_norm_backward_rows,
    .softmax_rows = softmax_rows,
    .cross_entropy_rows = cross_entropy_rows,
    .dropout_rows = dropout_rows,
    .bias_act_rows = bias_act_rows,
    .grad_act_rows = grad_act_rows,
    .gemm_block = gemm_block,
    .gemm_fma_peak = gemm_fma_peak,
    .adam_span = adam_span,
    .sum_squares = sum_squares,
    .scale_span = scale_span,
    .q8_quant_row = q8_quant_row,
    .q8_quant_rows = q8_quant_rows,
    .bf16_packed_gemm = bf16_packed_gemm,
    .bf16_widen_t = bf16_widen_t,
    .bfc_round_row = bfc_round_row,
    .bfc_panel = bfc_panel,
    .bfc_panel_dp = BFC_PANEL_DP,
    .bfc_panels_few = bfc_panels_few,
    .bfc_dp_peak = BFC_DP_PEAK,
    .tiles = {.vector_width = FA_VL,
              .attention_block_q = ATT_NR * FA_VL,
              .packed_tile_rows = SK_RB,
              .packed_tile_features = SK_NV * FA_VL,
              .softmax_chunk = SM_CHUNK * FA_VL},
};

#if defined(FA_TARGET)
FA_TARGET_END
#endif
